/*
 * sfa cases of spattn_bench_cpu: DeepSeek-V3.2-like sparse MLA shapes (N2 = 1, D = 512,
 * Dr = 64, shared key/value, bf16, right-down causal), indices drawn as cases/README.md says
 * (distinct allowed keys, the newest always among them, random order).  FLOPs per the spec:
 * forward 2 (D + Dr + D) pairs, backward 2 (3 (D + Dr) + 2 D) pairs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cpu.h"
#include "spattn.h"

/* Names carry the shape: S = S1 = S2, n = N1, k = K (all bf16, causal, D=512, Dr=64, N2=1). */
typedef struct sfa_case {
    const char *name;
    int64_t S1, S2, N1, K;
} sfa_case;

static const sfa_case kCases[] = {
    {"sfa_s1k_n16_k512", 1024, 1024, 16, 512},
    {"sfa_s2k_n16_k1k", 2048, 2048, 16, 1024},
    {"sfa_s1k_n32_k1k", 1024, 1024, 32, 1024},
    {"sfa_s1k_n64_k1k", 1024, 1024, 64, 1024},
    {"sfa_s1k_n128_k512", 1024, 1024, 128, 512},
    {"sfa_s1k_n8_k1k", 1024, 1024, 8, 1024}, /* below the N1 >= 16 bar: for reference */
    {"sfa_s1k_n4_k1k", 1024, 1024, 4, 1024},
};

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* bf16 of a value roughly uniform in [-1.7, 1.7] (variance ~1, as the suite's normals). */
static uint16_t rand_bf16(uint64_t *s) {
    float f = ((float)(rng_next(s) >> 40) / (float)(1 << 24) - 0.5f) * 3.4f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

typedef struct sfa_bench_ctx {
    spattn_tensor q, qr, k, kr, idx, o, lse, dout, dq, dqr, dk, dkr;
    spattn_options opt;
    int bwd;
} sfa_bench_ctx;

static void run(void *p) {
    sfa_bench_ctx *c = (sfa_bench_ctx *)p;
    spattn_status st;
    if (!c->bwd)
        st = spattn_sfa_fwd_ex(&c->q, &c->qr, &c->k, &c->kr, NULL, &c->idx, 1, 3, 0.0, &c->o,
                               &c->lse, &c->opt);
    else
        st = spattn_sfa_bwd_ex(&c->q, &c->qr, &c->k, &c->kr, NULL, &c->o, &c->dout, &c->lse,
                               &c->idx, 1, 3, 0.0, &c->dq, &c->dqr, &c->dk, &c->dkr, NULL, &c->opt);
    if (st != SPATTN_STATUS_SUCCESS) {
        fprintf(stderr, "sfa bench: %s\n", spattn_last_error());
        exit(1);
    }
}

/* A [B=1, S, N, cols] bf16 tensor viewing columns [c0, c0+n) of buffer `mem`. */
static spattn_tensor view(void *mem, int64_t S, int64_t N, int64_t cols, int64_t c0, int64_t n) {
    int64_t shape[4] = {1, S, N, n}, strides[4] = {S * N * cols, N * cols, cols, 1};
    return spattn_tensor_make((uint16_t *)mem + c0, SPATTN_DTYPE_BF16, 4, shape, strides);
}

void bench_cpu_sfa(const bench_env *env) {
    const int64_t D = 512, Dr = 64, Dq = D + Dr;
    for (size_t ci = 0; ci < sizeof(kCases) / sizeof(kCases[0]); ci++) {
        const sfa_case *cs = &kCases[ci];
        if (!bench_selected(env, cs->name)) continue;
        int64_t S1 = cs->S1, S2 = cs->S2, N1 = cs->N1, K = cs->K;
        uint64_t seed = 0x9e3779b97f4a7c15ull + ci;
        /* q and k as concatenated [.., D+Dr] buffers, viewed as nope + rope */
        size_t nq = (size_t)(S1 * N1 * Dq), nk = (size_t)(S2 * Dq), no = (size_t)(S1 * N1 * D);
        uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *o = malloc(no * 2), *g = malloc(no * 2);
        uint16_t *dq = malloc(nq * 2), *dk = malloc(nk * 2);
        float *lse = malloc((size_t)(S1 * N1) * 4);
        int32_t *idx = malloc((size_t)(S1 * K) * 4);
        int32_t *pool = malloc((size_t)S2 * 4);
        for (size_t i = 0; i < nq; i++) q[i] = rand_bf16(&seed);
        for (size_t i = 0; i < nk; i++) k[i] = rand_bf16(&seed);
        for (size_t i = 0; i < no; i++) g[i] = rand_bf16(&seed);
        double pairs = 0;
        for (int64_t i = 0; i < S1; i++) {
            int64_t lim = S2 - S1 + i, n = lim + 1 < K ? lim + 1 : K;
            int32_t *row = idx + i * K;
            for (int64_t t = 0; t < K; t++) row[t] = -1;
            if (lim < 0) continue;
            for (int64_t j = 0; j < lim; j++) pool[j] = (int32_t)j;
            row[0] = (int32_t)lim; /* the newest key is always selected */
            for (int64_t t = 1; t < n; t++) { /* partial Fisher-Yates over [0, lim) */
                int64_t r = t - 1 + (int64_t)(rng_next(&seed) % (uint64_t)(lim - (t - 1)));
                int32_t x = pool[r];
                pool[r] = pool[t - 1];
                pool[t - 1] = x;
                row[t] = x;
            }
            for (int64_t t = n - 1; t > 0; t--) { /* random order */
                int64_t r = (int64_t)(rng_next(&seed) % (uint64_t)(t + 1));
                int32_t x = row[t];
                row[t] = row[r];
                row[r] = x;
            }
            pairs += (double)n * (double)N1;
        }
        sfa_bench_ctx c;
        c.q = view(q, S1, N1, Dq, 0, D);
        c.qr = view(q, S1, N1, Dq, D, Dr);
        c.k = view(k, S2, 1, Dq, 0, D);
        c.kr = view(k, S2, 1, Dq, D, Dr);
        c.o = view(o, S1, N1, D, 0, D);
        c.dout = view(g, S1, N1, D, 0, D);
        c.dq = view(dq, S1, N1, Dq, 0, D);
        c.dqr = view(dq, S1, N1, Dq, D, Dr);
        c.dk = view(dk, S2, 1, Dq, 0, D);
        c.dkr = view(dk, S2, 1, Dq, D, Dr);
        int64_t sl[3] = {1, S1, N1}, si[4] = {1, S1, 1, K};
        c.lse = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, sl, NULL);
        c.idx = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, si, NULL);
        spattn_options_init(&c.opt);
        c.opt.backend = SPATTN_BACKEND_CPU;
        c.opt.num_threads = env->threads;
        char name[128];
        snprintf(name, sizeof name, "%s", cs->name);
        double tmin;
        c.bwd = 0;
        double t = bench_median_min(env, run, &c, &tmin);
        bench_row_min(env, name, "fwd", t, tmin, 2.0 * (double)(D + Dr + D) * pairs);
        c.bwd = 1;
        t = bench_median_min(env, run, &c, &tmin);
        bench_row_min(env, name, "bwd", t, tmin, 2.0 * (double)(3 * (D + Dr) + 2 * D) * pairs);
        free(q);
        free(k);
        free(o);
        free(g);
        free(dq);
        free(dk);
        free(lse);
        free(idx);
        free(pool);
    }
}

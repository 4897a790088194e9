/*
 * libFuzzer harness for every public entry point of libspattn: spattn_bsa_{fwd,bwd}[_ex],
 * spattn_sfa_{fwd,bwd}[_ex], spattn_{bsa,sfa}_workspace_size and the small helpers.
 *
 * The input first picks a tiny, consistent problem (shapes, dtype, layout of each tensor:
 * contiguous, transposed, padded, broadcast, reversed, interleaved), then applies up to 16
 * mutations to any descriptor field (ndim, dtype, device, shape, strides, data, NULL), to the
 * scalars (bx, by, sbs, mode, scale, backward) and to the options (backend, threads, stream,
 * workspace, deterministic, reserved), and may make tensors share one buffer (aliasing).
 * Every tensor that can be read gets a buffer of exactly its extent, so ASan flags any access
 * outside a descriptor.  Oracles beyond the sanitizers:
 *   - an error leaves every buffer unchanged ("validated before any output is written") and
 *     sets a non-empty spattn_last_error();
 *   - inputs are never written, on success either;
 *   - options with deterministic not 0/1 or a nonzero reserved field are rejected.
 * Descriptors that describe more than CAP bytes or elements (legitimate but too big for a
 * fuzzer) go to the workspace-size queries only, which read no data.
 *
 * Build: cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPATTN_FUZZ=ON -DSPATTN_CUDA=OFF
 * Run:   build-fuzz/tests/fuzz/fuzz_api -max_total_time=60 NEW_DIR tests/fuzz/corpus/api
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "spattn.h"

enum { NT = 14, NMUT = 16 };
#define CAP_BYTES (1 << 20)
#define CAP_NUMEL (1 << 16)

enum { K_FLOAT, K_MASK, K_IDX, K_LSE };

typedef struct ft {
    spattn_tensor t;
    int present;      /* 0: the argument is NULL */
    int is_output;
    int kind;         /* K_* : how its buffer is filled */
    int share;        /* -1: own buffer; else the tensor whose buffer it lives in */
    int64_t shift;    /* extra element offset inside the buffer */
    int null_data;
    int state;        /* 0 readable, 1 never valid (library must reject), 2 too big */
    int64_t lo, hi;   /* element extent */
    uint8_t *buf, *snap; /* owners only */
    size_t bytes;
} ft;

typedef struct call {
    ft ts[NT];
    int nt;
    int64_t bx, by, sbs;
    int32_t mode, backward;
    double scale;
    int use_opt, ws_mode;
    spattn_options opt;
    size_t ws_bytes;
    int64_t nblk; /* sfa: ceil(S2/sbs) of the base problem (index fill) */
} call;

static uint8_t g_dummy[64] __attribute__((aligned(16)));

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A base descriptor: shape as given, layout chosen by `lay`. */
static void make(ft *f, int kind, int32_t dtype, int ndim, const int64_t *shape, int lay,
                 int is_output) {
    memset(f, 0, sizeof *f);
    f->present = 1;
    f->kind = kind;
    f->share = -1;
    f->is_output = is_output;
    f->t.device_type = SPATTN_DEVICE_CPU;
    f->t.dtype = dtype;
    f->t.ndim = ndim;
    int64_t order[SPATTN_MAX_DIMS];
    for (int i = 0; i < ndim; i++) order[i] = i;
    if (lay % 6 == 1 && ndim >= 3) { order[1] = 2; order[2] = 1; } /* transposed view */
    int64_t s = lay % 6 == 5 ? 2 : 1;                              /* interleaved */
    for (int j = ndim - 1; j >= 0; j--) {
        int64_t d = order[j];
        f->t.shape[d] = shape[d];
        f->t.strides[d] = s;
        s *= shape[d];
        if (j == ndim - 1 && lay % 6 == 2) s += 8; /* padded rows */
    }
    if (lay % 6 == 3) f->t.strides[0] = 0;                 /* broadcast over dim 0 */
    if (lay % 6 == 4) f->t.strides[ndim - 2] *= -1;       /* reversed rows */
}

/* Extent and state of a descriptor after the mutations. */
static void classify(ft *f) {
    spattn_tensor *t = &f->t;
    f->state = 0;
    if (!f->present || f->null_data) return;
    if (t->ndim < 1 || t->ndim > SPATTN_MAX_DIMS) { f->state = 1; return; }
    __int128 lo = 0, hi = 0, numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 0) { f->state = 1; return; }
        __int128 span = (__int128)t->strides[i] * (t->shape[i] - 1);
        if (span < 0) lo += span; else hi += span;
        if (numel <= CAP_NUMEL) numel *= t->shape[i];
    }
    size_t es = spattn_dtype_size((spattn_dtype)t->dtype);
    if (!es) { f->state = 1; return; }
    __int128 bytes = (hi - lo + 1 + f->shift) * (__int128)es;
    __int128 lim = (__int128)1 << 62;
    if (lo * (__int128)es < -lim || (hi + 1) * (__int128)es > lim) { f->state = 1; return; }
    if (bytes > CAP_BYTES || numel > CAP_NUMEL) { f->state = 2; return; }
    f->lo = (int64_t)lo;
    f->hi = (int64_t)hi;
}

static void fill(ft *f, uint64_t *seed, int64_t nblk) {
    size_t es = spattn_dtype_size((spattn_dtype)f->t.dtype);
    if (!es) es = 1;
    for (size_t i = 0; i + es <= f->bytes; i += es) {
        uint32_t r = (uint32_t)rng_next(seed);
        float x = (float)((int)(r % 4001) - 2000) / 1000.0f;
        uint32_t xb;
        memcpy(&xb, &x, 4);
        if (es == 1) {
            f->buf[i] = (uint8_t)(r >> 20) & 1;
        } else if (es == 2) {
            uint16_t h = f->t.dtype == SPATTN_DTYPE_BF16 ? (uint16_t)(xb >> 16)
                                                         : (uint16_t)(0x3800 | (r & 0x83FF));
            memcpy(f->buf + i, &h, 2);
        } else if (f->kind == K_IDX) {
            int32_t v = (int32_t)((r >> 8) % (uint32_t)(nblk + 1)) - 1;
            memcpy(f->buf + i, &v, 4);
        } else {
            memcpy(f->buf + i, &xb, 4);
        }
    }
}

/* Allocates the owners' buffers (each exactly as large as its members need), points every
 * descriptor at its place, fills and snapshots.  Returns 1 when a tensor is too big. */
static int place(call *c, uint64_t seed) {
    int big = 0;
    for (int i = 0; i < c->nt; i++) classify(&c->ts[i]);
    for (int o = 0; o < c->nt; o++) {
        ft *f = &c->ts[o];
        if (f->share >= 0) continue;
        size_t need = 0;
        for (int m = 0; m < c->nt; m++) {
            ft *g = &c->ts[m];
            if ((m == o || g->share == o) && g->present && !g->null_data && g->state == 0) {
                size_t es = spattn_dtype_size((spattn_dtype)g->t.dtype);
                size_t b = (size_t)(g->shift + g->hi - g->lo + 1) * es;
                if (b > need) need = b;
            }
        }
        f->bytes = need;
        f->buf = malloc(need ? need : 1);
        f->snap = malloc(need ? need : 1);
        fill(f, &seed, c->nblk);
    }
    for (int m = 0; m < c->nt; m++) {
        ft *g = &c->ts[m];
        ft *own = g->share >= 0 ? &c->ts[g->share] : g;
        size_t es = spattn_dtype_size((spattn_dtype)g->t.dtype);
        if (g->state == 2) big = 1;
        if (g->null_data) g->t.data = NULL;
        else if (g->state != 0) g->t.data = g_dummy;
        else g->t.data = own->buf + (g->shift - g->lo) * (int64_t)es;
    }
    return big;
}

static const spattn_tensor *arg(call *c, int i) {
    return i < c->nt && c->ts[i].present ? &c->ts[i].t : NULL;
}

static void mutate(call *c, fz_in *in) {
    int nm = fz_range(in, NMUT + 1);
    for (int m = 0; m < nm && in->n; m++) {
        int what = fz_range(in, 16);
        ft *f = &c->ts[fz_range(in, c->nt)];
        int d = fz_range(in, SPATTN_MAX_DIMS);
        switch (what) {
        case 0: f->t.ndim = (int32_t)fz_i64(in); break;
        case 1: f->t.dtype = (int32_t)fz_i64(in); break;
        case 2: f->t.device_type = (int32_t)fz_i64(in); break;
        case 3: f->t.device_id = (int32_t)fz_i64(in); break;
        case 4: f->t.shape[d] = fz_i64(in); break;
        case 5: f->t.strides[d] = fz_i64(in); break;
        case 6: f->t.shape[d] += fz_range(in, 5) - 2; break;
        case 7: {
            int o = fz_range(in, c->nt);
            while (c->ts[o].share >= 0) o = c->ts[o].share;
            if (o != (int)(f - c->ts) && f->share < 0) {
                int self = (int)(f - c->ts), used = 0;
                for (int i = 0; i < c->nt; i++) used |= c->ts[i].share == self;
                if (!used) f->share = o;
            }
            break;
        }
        case 8: f->shift = fz_range(in, 64); break;
        case 9: f->null_data = 1; break;
        case 10: f->present = 0; break;
        case 11: c->bx = fz_i64(in); break;
        case 12: c->by = fz_i64(in); break;
        case 13: c->scale = fz_f64(in); break;
        case 14: c->sbs = fz_i64(in); c->mode = (int32_t)fz_i64(in); break;
        default: {
            int field = fz_range(in, 8);
            int32_t v = (int32_t)fz_i64(in);
            if (field == 0) c->opt.backend = v;
            else if (field == 1) c->opt.num_threads = v;
            else if (field == 2) c->opt.deterministic = v;
            else if (field == 3) c->opt.reserved[fz_range(in, 7)] = v;
            else if (field == 4) c->opt.cuda_stream = (void *)(uintptr_t)0x1000;
            else if (field == 5) c->ws_mode = fz_range(in, 4);
            else if (field == 6) c->backward = v;
            else c->use_opt = !c->use_opt;
        }
        }
    }
}

static int64_t small(fz_in *in, int lo, int n) { return lo + fz_range(in, n); }

static void base_bsa(call *c, fz_in *in) {
    int32_t dt = fz_range(in, 3);
    int64_t B = small(in, 1, 2), Nkv = small(in, 1, 2), N = Nkv * small(in, 1, 3);
    int64_t Sq = small(in, 1, 20), Skv = small(in, 1, 20), D = 8 * small(in, 1, 3);
    c->bx = small(in, 1, 12);
    c->by = small(in, 1, 12);
    int64_t qs[4] = {B, N, Sq, D}, ks[4] = {B, Nkv, Skv, D};
    int64_t ms[4] = {B, N, (Sq + c->bx - 1) / c->bx, (Skv + c->by - 1) / c->by}, ls[3] = {B, N, Sq};
    /* 0 q 1 k 2 v 3 mask 4 o 5 lse | bwd: 6 dout 7 dq 8 dk 9 dv (o and lse become inputs) */
    make(&c->ts[0], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[1], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[3], K_MASK, SPATTN_DTYPE_U8, 4, ms, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[5], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in) % 3, 1);
    make(&c->ts[6], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[7], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[8], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    make(&c->ts[9], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    c->nt = 10;
}

static void base_sfa(call *c, fz_in *in) {
    int32_t dt = fz_range(in, 3);
    int64_t B = small(in, 1, 2), S1 = small(in, 1, 6), S2 = small(in, 1, 24), N2 = small(in, 1, 2);
    int64_t N1 = N2 * small(in, 1, 3), D = 8 * small(in, 1, 3), Dr = 8 * fz_range(in, 2);
    int64_t K = small(in, 1, 6);
    c->sbs = (int64_t)1 << fz_range(in, 4);
    c->mode = fz_range(in, 2) ? SPATTN_SFA_MODE_CAUSAL : SPATTN_SFA_MODE_NONE;
    c->nblk = (S2 + c->sbs - 1) / c->sbs;
    int64_t qs[4] = {B, S1, N1, D}, qr[4] = {B, S1, N1, Dr}, ks[4] = {B, S2, N2, D};
    int64_t kr[4] = {B, S2, N2, Dr}, is[4] = {B, S1, N2, K}, ls[3] = {B, S1, N1};
    /* 0 q 1 q_rope 2 k 3 k_rope 4 v 5 idx 6 o 7 lse | bwd: 8 dout 9 dq 10 dq_rope 11 dk
     * 12 dk_rope 13 dv */
    make(&c->ts[0], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[1], K_FLOAT, dt, 4, qr, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[3], K_FLOAT, dt, 4, kr, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[5], K_IDX, SPATTN_DTYPE_I32, 4, is, fz_u8(in), 0);
    make(&c->ts[6], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[7], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in) % 3, 1);
    make(&c->ts[8], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[9], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[10], K_FLOAT, dt, 4, qr, fz_u8(in) % 3, 1);
    make(&c->ts[11], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    make(&c->ts[12], K_FLOAT, dt, 4, kr, fz_u8(in) % 3, 1);
    make(&c->ts[13], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    c->nt = 14;
    if (!Dr) c->ts[1].present = c->ts[3].present = c->ts[10].present = c->ts[12].present = 0;
    if (fz_range(in, 2)) c->ts[4].present = c->ts[13].present = 0; /* v shared with k */
}

static void misc(fz_in *in) {
    int64_t shape[SPATTN_MAX_DIMS], strides[SPATTN_MAX_DIMS];
    for (int i = 0; i < SPATTN_MAX_DIMS; i++) {
        shape[i] = fz_i64(in);
        strides[i] = fz_i64(in);
    }
    int32_t ndim = (int32_t)fz_i64(in);
    spattn_tensor t = spattn_tensor_make(g_dummy, (spattn_dtype)fz_i64(in), ndim, shape,
                                         fz_range(in, 2) ? strides : NULL);
    (void)t;
    int32_t v = (int32_t)fz_i64(in);
    if (!spattn_status_str((spattn_status)v) || !spattn_dtype_name((spattn_dtype)v)) abort();
    (void)spattn_dtype_size((spattn_dtype)v);
    spattn_options_init(NULL);
    if (!spattn_version(NULL, NULL, NULL) || !spattn_cpu_isa() || !spattn_last_error()) abort();
    (void)spattn_cuda_available();
}

static int opts_invalid(const call *c) {
    if (!c->use_opt) return 0;
    if (c->opt.deterministic != 0 && c->opt.deterministic != 1) return 1;
    for (int i = 0; i < 7; i++)
        if (c->opt.reserved[i]) return 1;
    return 0;
}

static void fail(const char *what, int st) {
    fprintf(stderr, "fuzz_api: %s (status %d: %s; last error: %s)\n", what, st,
            spattn_status_str((spattn_status)st), spattn_last_error());
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int entry = fz_range(&in, 11);
    if (entry == 10) {
        misc(&in);
        return 0;
    }
    static call c;
    memset(&c, 0, sizeof c);
    spattn_options_init(&c.opt);
    c.use_opt = 1;
    c.scale = 0.0;
    int is_bsa = entry < 5;
    if (is_bsa) base_bsa(&c, &in);
    else base_sfa(&c, &in);
    c.backward = (entry % 5) >= 2 && (entry % 5) <= 3;
    int is_ws = entry % 5 == 4, is_bwd = (entry % 5) >= 2 && !is_ws;
    if (!is_ws && (entry % 5) % 2 == 0) c.use_opt = 0; /* the plain form */
    if (is_bwd) { /* o and lse are inputs of the backward */
        c.ts[is_bsa ? 4 : 6].is_output = 0;
        c.ts[is_bsa ? 5 : 7].is_output = 0;
    }
    uint64_t seed = fz_bytes(&in, 4) | 1;
    mutate(&c, &in);
    int big = place(&c, seed);

    uint8_t *ws = NULL;
    size_t ws_cap = 0;
    if (c.ws_mode == 1 || c.ws_mode == 2) {
        ws_cap = (size_t)fz_range(&in, 64) << (c.ws_mode == 1 ? 4 : 12);
        ws = malloc(ws_cap ? ws_cap : 1);
        c.opt.workspace = ws;
        c.opt.workspace_size = ws_cap;
    } else if (c.ws_mode == 3) {
        c.opt.workspace = NULL;
        c.opt.workspace_size = 1 + (size_t)fz_range(&in, 255);
    }
    for (int i = 0; i < c.nt; i++)
        if (c.ts[i].buf) memcpy(c.ts[i].snap, c.ts[i].buf, c.ts[i].bytes);

    const spattn_options *opt = c.use_opt ? &c.opt : NULL;
    spattn_status st;
    size_t bytes = 0;
    int ran = 1;
    if (is_ws || big) {
        if (is_bsa)
            st = spattn_bsa_workspace_size(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx,
                                           c.by, c.backward, opt, &bytes);
        else
            st = spattn_sfa_workspace_size(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3),
                                           arg(&c, 4), arg(&c, 5), c.sbs, c.mode, c.backward, opt,
                                           &bytes);
        ran = 0;
    } else if (is_bsa && !is_bwd) {
        st = spattn_bsa_fwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx, c.by,
                               c.scale, arg(&c, 4), arg(&c, 5), opt);
    } else if (is_bsa) {
        st = spattn_bsa_bwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 4), arg(&c, 6),
                               arg(&c, 5), arg(&c, 3), c.bx, c.by, c.scale, arg(&c, 7),
                               arg(&c, 8), arg(&c, 9), opt);
    } else if (!is_bwd) {
        st = spattn_sfa_fwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4),
                               arg(&c, 5), c.sbs, c.mode, c.scale, arg(&c, 6), arg(&c, 7), opt);
    } else {
        st = spattn_sfa_bwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4),
                               arg(&c, 6), arg(&c, 8), arg(&c, 7), arg(&c, 5), c.sbs, c.mode,
                               c.scale, arg(&c, 9), arg(&c, 10), arg(&c, 11), arg(&c, 12),
                               arg(&c, 13), opt);
    }

    if (st != SPATTN_STATUS_SUCCESS && spattn_last_error()[0] == '\0') fail("error without a message", st);
    if (opts_invalid(&c) && st == SPATTN_STATUS_SUCCESS) fail("invalid options accepted", st);
    if (st == SPATTN_STATUS_SUCCESS && !ran && c.use_opt && c.opt.workspace && bytes > (size_t)1 << 40)
        fail("absurd workspace size", st);
    int runtime_err = st == SPATTN_STATUS_OUT_OF_MEMORY || st == SPATTN_STATUS_CUDA_ERROR ||
                      st == SPATTN_STATUS_INTERNAL;
    for (int o = 0; o < c.nt; o++) {
        ft *f = &c.ts[o];
        if (!f->buf || !f->bytes) continue;
        int has_out = 0;
        for (int m = 0; m < c.nt; m++)
            if ((m == o || c.ts[m].share == o) && c.ts[m].present && c.ts[m].is_output) has_out = 1;
        int may_change = ran && has_out && (st == SPATTN_STATUS_SUCCESS || runtime_err);
        if (!may_change && memcmp(f->buf, f->snap, f->bytes) != 0)
            fail(has_out ? "an output was written although the call failed" : "an input was written", st);
    }
    for (int i = 0; i < c.nt; i++) {
        free(c.ts[i].buf);
        free(c.ts[i].snap);
    }
    free(ws);
    return 0;
}

// GPU robustness of both operators' CUDA paths (issue 16, item 5), run on a machine with a GPU
// ("skipped" and exit 0 when none is visible):
//   1. out of device memory: with nearly all device memory taken, a call that must allocate
//      its workspace returns SPATTN_STATUS_OUT_OF_MEMORY (or another clean error, never a
//      crash), and once the memory is back the next call succeeds with the right bits (no
//      sticky CUDA error);
//   2. stream ordering: inputs written on a caller's non-default stream behind a slow kernel
//      are the inputs the call sees when it runs on that stream;
//   3. many host threads on one GPU (each with its own stream and outputs) give bitwise the
//      single-threaded results.
// Each check compares against a first, single-threaded run on the default stream.
// Usage: robust_cuda_check
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <thread>
#include <vector>

#include "spattn.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static int g_pass = 0, g_fail = 0;
static void check(bool ok, const char *what) {
    if (ok) g_pass++, printf("ok  %s\n", what);
    else g_fail++, printf("FAIL %s (%s)\n", what, spattn_last_error());
}

static spattn_tensor dev4(void *p, int dt, int64_t a, int64_t b, int64_t c, int64_t d, int ndim = 4) {
    const int64_t sh[4] = {a, b, c, d};
    spattn_tensor t = spattn_tensor_make(p, (spattn_dtype)dt, ndim, sh, NULL);
    t.device_type = SPATTN_DEVICE_CUDA;
    return t;
}

static void fill(void *dst, size_t n, uint64_t seed) {  // fp16 values in [-2, 2)
    std::vector<__half> h(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = __float2half((float)((seed >> 40) * 0x1.0p-24 * 4.0 - 2.0));
    }
    CK(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice));
}

// One problem of each operator with its inputs and a set of outputs per caller.
struct Bsa {
    int B = 1, N = 4, Sq = 1000, Skv = 1200, D = 128, bx = 64, by = 64, nbx, nby;
    void *q, *k, *v, *dout, *mask;
    Bsa() {
        nbx = (Sq + bx - 1) / bx;
        nby = (Skv + by - 1) / by;
        const size_t nq = (size_t)B * N * Sq * D, nk = (size_t)B * N * Skv * D;
        CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nk * 2)); CK(cudaMalloc(&v, nk * 2)); CK(cudaMalloc(&dout, nq * 2));
        fill(q, nq, 1); fill(k, nk, 2); fill(v, nk, 3); fill(dout, nq, 4);
        std::vector<uint8_t> m((size_t)B * N * nbx * nby);
        for (size_t i = 0; i < m.size(); i++) m[i] = (i * 2654435761u >> 7) % 3 != 0;
        CK(cudaMalloc(&mask, m.size()));
        CK(cudaMemcpy(mask, m.data(), m.size(), cudaMemcpyHostToDevice));
    }
    size_t nq() const { return (size_t)B * N * Sq * D; }
    size_t nk() const { return (size_t)B * N * Skv * D; }
    // forward + backward into `out` (o, lse, dq, dk, dv packed back to back); returns the status
    spattn_status run(void *out, const spattn_options *opt) const {
        char *p = static_cast<char *>(out);
        void *o = p, *lse = p + nq() * 2, *dq = p + nq() * 2 + (size_t)B * N * Sq * 4;
        void *dk = static_cast<char *>(dq) + nq() * 2, *dv = static_cast<char *>(dk) + nk() * 2;
        spattn_tensor tq = dev4(q, SPATTN_DTYPE_F16, B, N, Sq, D), tk = dev4(k, SPATTN_DTYPE_F16, B, N, Skv, D),
                      tv = dev4(v, SPATTN_DTYPE_F16, B, N, Skv, D), tdo = dev4(dout, SPATTN_DTYPE_F16, B, N, Sq, D),
                      tm = dev4(mask, SPATTN_DTYPE_U8, B, N, nbx, nby), to = dev4(o, SPATTN_DTYPE_F16, B, N, Sq, D),
                      tl = dev4(lse, SPATTN_DTYPE_F32, B, N, Sq, 1, 3), tdq = dev4(dq, SPATTN_DTYPE_F16, B, N, Sq, D),
                      tdk = dev4(dk, SPATTN_DTYPE_F16, B, N, Skv, D), tdv = dev4(dv, SPATTN_DTYPE_F16, B, N, Skv, D);
        spattn_status s = spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, bx, by, 0.0, &to, &tl, opt);
        if (s) return s;
        return spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, bx, by, 0.0, &tdq, &tdk, &tdv, opt);
    }
    size_t out_bytes() const { return 2 * nq() * 2 + (size_t)B * N * Sq * 4 + 2 * nk() * 2; }
};

struct Sfa {  // DeepSeek-V3.2 shape: D 512 + rope 64, shared k/v (MLA), causal, sbs 1
    int B = 1, S1 = 128, S2 = 512, N1 = 16, N2 = 1, D = 512, Dr = 64, K = 64;
    void *q, *qr, *k, *kr, *dout, *idx;
    Sfa() {
        CK(cudaMalloc(&q, nq() * 2)); CK(cudaMalloc(&qr, nqr() * 2)); CK(cudaMalloc(&k, nk() * 2));
        CK(cudaMalloc(&kr, nkr() * 2)); CK(cudaMalloc(&dout, nq() * 2));
        fill(q, nq(), 5); fill(qr, nqr(), 8); fill(k, nk(), 6); fill(kr, nkr(), 9); fill(dout, nq(), 7);
        std::vector<int32_t> ix((size_t)B * S1 * N2 * K);
        for (size_t i = 0; i < ix.size(); i++) ix[i] = (int32_t)((i * 40503u) % S2) - (i % 17 == 0);  // some -1
        CK(cudaMalloc(&idx, ix.size() * 4));
        CK(cudaMemcpy(idx, ix.data(), ix.size() * 4, cudaMemcpyHostToDevice));
    }
    size_t nq() const { return (size_t)B * S1 * N1 * D; }
    size_t nqr() const { return (size_t)B * S1 * N1 * Dr; }
    size_t nk() const { return (size_t)B * S2 * N2 * D; }
    size_t nkr() const { return (size_t)B * S2 * N2 * Dr; }
    // outputs back to back: o, lse, dq, dq_rope, dk, dk_rope
    spattn_status run(void *out, const spattn_options *opt) const {
        char *p = static_cast<char *>(out);
        void *o = p, *lse = p + nq() * 2, *dq = p + nq() * 2 + (size_t)B * S1 * N1 * 4;
        void *dqr = static_cast<char *>(dq) + nq() * 2, *dk = static_cast<char *>(dqr) + nqr() * 2;
        void *dkr = static_cast<char *>(dk) + nk() * 2;
        const int F = SPATTN_DTYPE_F16;
        spattn_tensor tq = dev4(q, F, B, S1, N1, D), tqr = dev4(qr, F, B, S1, N1, Dr), tk = dev4(k, F, B, S2, N2, D),
                      tkr = dev4(kr, F, B, S2, N2, Dr), tdo = dev4(dout, F, B, S1, N1, D),
                      ti = dev4(idx, SPATTN_DTYPE_I32, B, S1, N2, K), to = dev4(o, F, B, S1, N1, D),
                      tl = dev4(lse, SPATTN_DTYPE_F32, B, S1, N1, 1, 3), tdq = dev4(dq, F, B, S1, N1, D),
                      tdqr = dev4(dqr, F, B, S1, N1, Dr), tdk = dev4(dk, F, B, S2, N2, D), tdkr = dev4(dkr, F, B, S2, N2, Dr);
        spattn_status s = spattn_sfa_fwd_ex(&tq, &tqr, &tk, &tkr, NULL, &ti, 1, SPATTN_SFA_MODE_CAUSAL, 0.0, &to, &tl, opt);
        if (s) return s;
        return spattn_sfa_bwd_ex(&tq, &tqr, &tk, &tkr, NULL, &to, &tdo, &tl, &ti, 1, SPATTN_SFA_MODE_CAUSAL, 0.0, &tdq,
                                 &tdqr, &tdk, &tdkr, NULL, opt);
    }
    size_t out_bytes() const { return (2 * nq() + nqr() + nk() + nkr()) * 2 + (size_t)B * S1 * N1 * 4; }
};

static std::vector<char> host_copy(const void *d, size_t n) {
    std::vector<char> h(n);
    CK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
}

__global__ void spin_kernel(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

template <typename P> static void run_all(const P &prob, const char *name) {
    char what[160];
    const size_t ob = prob.out_bytes();
    void *ref_out;
    CK(cudaMalloc(&ref_out, ob));
    CK(cudaMemset(ref_out, 0xff, ob));
    spattn_status s = prob.run(ref_out, NULL);
    CK(cudaDeviceSynchronize());
    snprintf(what, sizeof what, "%s: reference run", name);
    check(s == SPATTN_STATUS_SUCCESS, what);
    const std::vector<char> want = host_copy(ref_out, ob);

    // 1. out of memory, then recovery.  Take nearly all free memory (pooled memory of earlier
    // calls is released first so the library's cudaMallocAsync has to find new memory).
    {
        int dev = 0;
        CK(cudaGetDevice(&dev));
        cudaMemPool_t pool;
        CK(cudaDeviceGetDefaultMemPool(&pool, dev));
        CK(cudaMemPoolTrimTo(pool, 0));
        void *out;
        CK(cudaMalloc(&out, ob));
        std::vector<void *> hog;
        size_t freeb = 0, total = 0;
        CK(cudaMemGetInfo(&freeb, &total));
        for (size_t chunk = (size_t)1 << 34; chunk >= ((size_t)1 << 20); chunk >>= 1) {
            void *p;
            while (cudaMalloc(&p, chunk) == cudaSuccess) hog.push_back(p);
            cudaGetLastError();
        }
        CK(cudaMemGetInfo(&freeb, &total));
        CK(cudaMemset(out, 0xff, ob));
        s = prob.run(out, NULL);
        cudaError_t sticky = cudaDeviceSynchronize();
        // a call that needs no new memory may succeed (then with the right bits); one that does
        // must say OUT_OF_MEMORY and leave no CUDA error behind
        snprintf(what, sizeof what, "%s: with %zu bytes free: status %d (%s), no sticky CUDA error", name, freeb, s,
                 spattn_status_str(s));
        check(sticky == cudaSuccess &&
                  (s == SPATTN_STATUS_OUT_OF_MEMORY || (s == SPATTN_STATUS_SUCCESS && host_copy(out, ob) == want)),
              what);
        for (void *p : hog) CK(cudaFree(p));
        CK(cudaMemset(out, 0xff, ob));
        s = prob.run(out, NULL);
        CK(cudaDeviceSynchronize());
        snprintf(what, sizeof what, "%s: next call after the memory is back succeeds with the same bits", name);
        check(s == SPATTN_STATUS_SUCCESS && host_copy(out, ob) == want, what);
        CK(cudaFree(out));
    }
    // 2. a caller's stream: the call must see inputs written on that stream behind a slow kernel.
    {
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        void *out;
        CK(cudaMalloc(&out, ob));
        CK(cudaMemset(out, 0xff, ob));
        const size_t qbytes = prob.nq() * 2;
        std::vector<char> qsave = host_copy(prob.q, qbytes);
        CK(cudaMemset(prob.q, 0, qbytes));  // stale input, replaced on the stream below
        CK(cudaDeviceSynchronize());
        spin_kernel<<<1, 1, 0, st>>>(200000000ll);  // ~0.1 s
        CK(cudaMemcpyAsync(prob.q, qsave.data(), qbytes, cudaMemcpyHostToDevice, st));
        spattn_options opt;
        spattn_options_init(&opt);
        opt.cuda_stream = st;
        s = prob.run(out, &opt);
        CK(cudaStreamSynchronize(st));
        snprintf(what, sizeof what, "%s: a non-default stream orders the call after the caller's work", name);
        check(s == SPATTN_STATUS_SUCCESS && host_copy(out, ob) == want, what);
        CK(cudaFree(out));
        CK(cudaStreamDestroy(st));
    }
    // 3. many host threads at once, each with its own stream and outputs.
    {
        const int T = 8;
        std::vector<void *> outs(T);
        std::vector<spattn_status> st(T, SPATTN_STATUS_SUCCESS);
        for (int t = 0; t < T; t++) {
            CK(cudaMalloc(&outs[t], ob));
            CK(cudaMemset(outs[t], 0xff, ob));
        }
        std::vector<std::thread> th;
        for (int t = 0; t < T; t++)
            th.emplace_back([&, t]() {
                cudaStream_t sm;
                if (cudaStreamCreateWithFlags(&sm, cudaStreamNonBlocking) != cudaSuccess) {
                    st[t] = SPATTN_STATUS_CUDA_ERROR;
                    return;
                }
                spattn_options opt;
                spattn_options_init(&opt);
                opt.cuda_stream = sm;
                for (int r = 0; r < 3 && st[t] == SPATTN_STATUS_SUCCESS; r++) st[t] = prob.run(outs[t], &opt);
                cudaStreamSynchronize(sm);
                cudaStreamDestroy(sm);
            });
        for (auto &x : th) x.join();
        bool ok = true;
        for (int t = 0; t < T; t++) {
            ok = ok && st[t] == SPATTN_STATUS_SUCCESS && host_copy(outs[t], ob) == want;
            CK(cudaFree(outs[t]));
        }
        snprintf(what, sizeof what, "%s: %d host threads (3 calls each) give the single-threaded bits", name, T);
        check(ok, what);
    }
    CK(cudaFree(ref_out));
}

int main() {
    if (!spattn_cuda_available()) {
        printf("robust_cuda_check: no CUDA device visible: skipped\n");
        return 0;
    }
    Bsa bsa;
    run_all(bsa, "bsa");
    Sfa sfa;
    run_all(sfa, "sfa");
    printf("robust_cuda_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

// GPU robustness of both operators' CUDA paths (issue 16, items 2, 5 and 6), run on a machine
// with a GPU ("skipped" and exit 0 when none is visible):
//   1. out of device memory: with nearly all device memory taken, a call that must allocate
//      its workspace returns SPATTN_STATUS_OUT_OF_MEMORY (or another clean error, never a
//      crash), and once the memory is back the next call succeeds with the right bits (no
//      sticky CUDA error);
//   2. stream ordering: inputs written on a caller's non-default stream behind a slow kernel
//      are the inputs the call sees when it runs on that stream;
//   3. many host threads on one GPU (each with its own stream and outputs) give bitwise the
//      single-threaded results;
//   4. absurd problems: a bsa forward, a bsa backward and an sfa backward whose workspace
//      (spattn_*_workspace_size) exceeds the device's memory while their tensors fit (quadratic
//      schedule lists; the sfa key-major visit lists over stride-0 input views) return
//      SPATTN_STATUS_OUT_OF_MEMORY, and the next normal call gives the reference bits;
//   5. NaN / Inf semantics (include/spattn.h, cases/README.md): both operators, forward and
//      backward, fp16 and bf16, deterministic 1 and 0; a NaN in one q row, in one row without
//      keys, in one k (and k_rope) key, in one v element, +inf in q and in k (a column kept
//      positive so that the planted inf gives +inf scores).  The CPU backend runs the same
//      inputs (O and LSE given to both backwards are the CPU forward's).  Per output element:
//      NaN wherever the spec says (checked on both backends), NaN on the GPU wherever the CPU
//      has NaN, elements the value does not reach equal to the NaN-free run (bitwise for the
//      deterministic bsa; else within the eco tolerance), every finite GPU value within the eco
//      criterion of the CPU's.  Extra GPU NaN (never a finite value) is allowed only where the
//      documented CUDA exception reaches: the bsa forward's v of a 128-key tile that a 128-row
//      query tile processes, the bsa backward's 64-row x 128-key tiles that hold a non-finite
//      q, k, v, dO, O or LSE.  The sfa inputs select whole aligned 64-key blocks (mode 0), so
//      no per-token sfa kernel tile holds a pair its rows do not attend: the sfa checks are
//      strict there; the grouped (union) form at 4-32 heads per key head runs 64 / H tokens over
//      the union of their blocks, and its documented reach (spattn.h) is allowed;
//   6. large sizes: a 512K-token case per operator (bsa: window of two 128-blocks plus a few
//      block rows that also attend block 0, more than 2^31 elements in q / o / dq; sfa: S1 = S2
//      = 524288, D 512 + 64, N1 16, K 64, causal, more than 2^31 elements in q / o / dq),
//      forward and backward, deterministic 1 and 0, inputs from a hash of the element index
//      (made on the device), outputs checked on sampled rows and keys against an fp64 host
//      computation of those rows only (eco criterion).
// Each of 1-3 compares against a first, single-threaded run on the default stream.
// Every check prints "name: ok" or "name: FAILED (...)"; the last line is "N passed, M failed".
// Usage: robust_cuda_check [quick]   (quick: small sizes for compute-sanitizer)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <map>
#include <math.h>
#include <string>
#include <thread>
#include <vector>

#include "check_util.h"
#include "spattn.h"


static int g_pass = 0, g_fail = 0;
static bool g_quick = false;
static bool g_selftest = false;  // "selftest": the NaN / Inf checks with the CPU backend standing in for the GPU
static void check(bool ok, const char *what) {
    if (ok) g_pass++, printf("%s: ok\n", what);
    else g_fail++, printf("%s: FAILED (%s)\n", what, spattn_last_error());
    fflush(stdout);
}
// A check with its own reason for failing.
static void report(bool ok, const char *what, const std::string &why) {
    if (ok) g_pass++, printf("%s: ok\n", what);
    else g_fail++, printf("%s: FAILED (%s)\n", what, why.c_str());
    fflush(stdout);
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

// =============================================================================================
// Shared helpers of checks 4-6.
// =============================================================================================
static float bits2f(uint16_t b, int dt) {
    if (dt == SPATTN_DTYPE_F16) {
        __half h;
        memcpy(&h, &b, 2);
        return __half2float(h);
    }
    __nv_bfloat16 h;
    memcpy(&h, &b, 2);
    return __bfloat162float(h);
}
static uint16_t f2bits(float f, int dt) {
    uint16_t b;
    if (dt == SPATTN_DTYPE_F16) {
        __half h = __float2half(f);
        memcpy(&b, &h, 2);
    } else {
        __nv_bfloat16 h = __float2bfloat16(f);
        memcpy(&b, &h, 2);
    }
    return b;
}

// A tensor descriptor with explicit strides (NULL: contiguous) on the CPU or the GPU.
static spattn_tensor mk(void *p, int dt, int ndim, const int64_t *shape, bool gpu, const int64_t *strides = NULL) {
    spattn_tensor t = spattn_tensor_make(p, (spattn_dtype)dt, ndim, shape, strides);
    if (gpu) t.device_type = SPATTN_DEVICE_CUDA;
    return t;
}

// Device buffer owned for one scope.
struct DBuf {
    void *p = nullptr;
    size_t n = 0;
    DBuf() {}
    explicit DBuf(size_t bytes) : n(bytes) { CK(cudaMalloc(&p, bytes ? bytes : 1)); }
    DBuf(const void *h, size_t bytes) : n(bytes) {
        CK(cudaMalloc(&p, bytes ? bytes : 1));
        if (bytes) CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    }
    ~DBuf() {
        if (p) cudaFree(p);
    }
    DBuf(const DBuf &) = delete;
    DBuf &operator=(const DBuf &) = delete;
    void poison() { CK(cudaMemset(p, 0x7b, n)); }  // finite in every format: an unwritten element is caught
    template <typename T> std::vector<T> get() const {
        std::vector<T> h(n / sizeof(T));
        CK(cudaMemcpy(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

static std::vector<float> to_f(const std::vector<uint16_t> &b, int dt) {
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); i++) f[i] = bits2f(b[i], dt);
    return f;
}

// splitmix64 of (seed, index) -> a value of [-1, 1) with 24 significant bits (exact in fp32, so
// host and device round it to fp16 / bf16 identically).
__host__ __device__ inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
__host__ __device__ inline float hval(uint64_t seed, uint64_t i) {
    const uint64_t h = mix64(seed * 0x632be59bd9b4e019ull ^ mix64(i));
    return (float)((double)(h >> 40) * 0x1.0p-23 - 1.0);
}
static uint64_t g_hrng = 12345;
static double hrand() {  // host uniform [0, 1)
    g_hrng = mix64(g_hrng);
    return (double)(g_hrng >> 11) * 0x1.0p-53;
}

// eco tolerances (cases/README.md; check_util.h)
typedef EcoTol Tol;
static Tol tol_of(int dt) { return eco_tol(dt, false); }
static const Tol kTolLse = eco_tol(SPATTN_DTYPE_F32, true);

// =============================================================================================
// 5. NaN / Inf semantics.
// =============================================================================================
// Element classes of one output tensor under one planted value.
enum { C_NAN = 1, C_SAME = 2, C_MAY = 4 };  // must be NaN; must equal the NaN-free run; GPU may add NaN

struct OutT {  // one output tensor of one run, as floats
    std::string name;
    std::vector<float> v;
    Tol tol;
};
struct Judge {  // everything one output tensor is judged with
    const OutT *cpu, *cpu0, *gpu, *gpu0;
    const std::vector<uint8_t> *cls;
};

static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }
static bool near(double g, double w, const Tol &t) { return fabs(g - w) <= t.atol + t.rtol * fabs(w); }

// Judges the tensors of one scenario; returns "" when every rule holds, else the first problems.
static std::string judge_all(const std::vector<Judge> &js, bool bitwise) {
    std::string why;
    int shown = 0;
    auto bad = [&](const char *fmt, const std::string &name, size_t e, double a, double b) {
        if (shown++ < 4) {
            char m[256];
            snprintf(m, sizeof m, fmt, name.c_str(), e, a, b);
            why += (why.empty() ? "" : "; ") + std::string(m);
        }
    };
    for (const Judge &j : js) {
        const std::vector<float> &c = j.cpu->v, &c0 = j.cpu0->v, &g = j.gpu->v, &g0 = j.gpu0->v;
        const std::vector<uint8_t> &cls = *j.cls;
        const Tol &t = j.cpu->tol;
        const std::string &nm = j.cpu->name;
        size_t total = 0, matched = 0;
        double maxerr = 0;
        for (size_t e = 0; e < c.size(); e++) {
            const uint8_t k = cls[e];
            if ((k & C_NAN) && !isnan(c[e])) bad("%s[%zu]: the spec says NaN, the CPU gives %g (%g)", nm, e, c[e], 0);
            if ((k & C_NAN) && !isnan(g[e])) bad("%s[%zu]: the spec says NaN, the GPU gives %g (%g)", nm, e, g[e], 0);
            if (k & C_SAME) {
                const bool cok = isnan(c0[e]) ? isnan(c[e]) : isinf(c0[e]) ? c[e] == c0[e] : (isfinite(c[e]) && near(c[e], c0[e], t));
                if (!cok) bad("%s[%zu]: not reached by the planted value, CPU %g, NaN-free CPU %g", nm, e, c[e], c0[e]);
                if (!((k & C_MAY) && isnan(g[e]))) {
                    bool gok;
                    if (isnan(g0[e])) gok = isnan(g[e]);
                    else if (bitwise) gok = same_bits(g[e], g0[e]);
                    else gok = isinf(g0[e]) ? g[e] == g0[e] : (isfinite(g[e]) && near(g[e], g0[e], t));
                    if (!gok) bad("%s[%zu]: not reached by the planted value, GPU %g, NaN-free GPU %g", nm, e, g[e], g0[e]);
                }
            }
            // GPU against the CPU on the same inputs
            if (isnan(c[e])) {
                if (!isnan(g[e])) bad("%s[%zu]: CPU NaN, GPU %g (%g)", nm, e, g[e], 0);
            } else if (isinf(c[e])) {
                if (g[e] != c[e]) bad("%s[%zu]: CPU %g, GPU %g", nm, e, c[e], g[e]);
            } else if (isnan(g[e])) {
                if (!(k & C_MAY)) bad("%s[%zu]: GPU NaN where the CPU has %g and no tile exception applies (%g)", nm, e, c[e], 0);
            } else if (isinf(g[e])) {
                bad("%s[%zu]: GPU %g, CPU %g", nm, e, g[e], c[e]);
            } else {
                total++;
                const double d = fabs((double)g[e] - c[e]);
                if (near(g[e], c[e], t)) matched++;
                if (d > maxerr) maxerr = d;
            }
        }
        if (total && (matched < 0.99 * total || maxerr > t.lim)) {
            char m[256];
            snprintf(m, sizeof m, "%s: GPU vs CPU matched %zu of %zu finite elements, max abs error %g (limit %g)",
                     nm.c_str(), matched, total, maxerr, t.lim);
            if (shown++ < 4) why += (why.empty() ? "" : "; ") + std::string(m);
        }
    }
    if (shown > 4) why += "; " + std::to_string(shown - 4) + " more";
    return why;
}

// What a planted value does to the outputs, in terms of the attended pairs (rows: the query
// rows of O in memory order; keys: the key-side rows of dK in memory order).
struct Plant {
    std::vector<int64_t> nan_rows;  // rows whose forward is NaN (all of O, LSE), or whose O column vcol is NaN
    int vcol = -1;                  // v scenario: the O column that turns NaN (LSE stays finite)
};
// Classes of the forward rows (O [rows, D], LSE [rows]) and of the backward rows / keys.
static void classes(const Plant &pl, const std::vector<std::vector<int64_t>> &keys_of_row, int64_t nkeys, int D,
                    bool has_dv, std::vector<uint8_t> &co, std::vector<uint8_t> &cl, std::vector<uint8_t> &cq,
                    std::vector<uint8_t> &ck, std::vector<uint8_t> &cv, int Dq, int Dk) {
    const int64_t rows = (int64_t)keys_of_row.size();
    co.assign(rows * D, C_SAME);
    cl.assign(rows, C_SAME);
    cq.assign(rows * Dq, C_SAME);
    ck.assign(nkeys * Dk, C_SAME);
    cv.assign(has_dv ? nkeys * D : 0, C_SAME);
    std::vector<uint8_t> hit(nkeys, 0);
    for (int64_t r : pl.nan_rows) {
        for (int d = 0; d < D; d++)
            if (pl.vcol < 0 || d == pl.vcol) co[r * D + d] = C_NAN;
        if (pl.vcol < 0) cl[r] = C_NAN;
        for (int d = 0; d < Dq; d++) cq[r * Dq + d] = C_NAN;  // dQ: dS of the row is NaN
        for (int64_t j : keys_of_row[r]) hit[j] = 1;
    }
    for (int64_t j = 0; j < nkeys; j++)
        if (hit[j]) {
            for (int d = 0; d < Dk; d++) ck[j * Dk + d] = C_NAN;                      // dK = dS^T Q
            if (has_dv && pl.vcol < 0)
                for (int d = 0; d < D; d++) cv[j * D + d] = C_NAN;  // dV = P^T dO (P finite when only v is NaN)
        }
}

// ---- bsa ------------------------------------------------------------------------------------
struct BsaNf {
    int N = 2, Nkv = 1, S = 1024, D = 64, bx = 64, by = 64, nb = 16, dt = SPATTN_DTYPE_F16;
    std::vector<uint8_t> mask;  // [1, N, nb, nb]
    std::vector<std::vector<int64_t>> kor;  // keys of each row (n * S + i) as kv rows g * S + j
    int64_t nq() const { return (int64_t)N * S * D; }
    int64_t nk() const { return (int64_t)Nkv * S * D; }
    bool att(int n, int i, int j) const { return mask[((size_t)n * nb + i / bx) * nb + j / by] != 0; }
    void build() {
        nb = (S + bx - 1) / bx;
        mask.assign((size_t)N * nb * nb, 0);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < nb; i++)
                for (int j = 0; j < nb; j++)  // a local window of three blocks, a quarter of them off
                    mask[((size_t)n * nb + i) * nb + j] = j <= i && j >= i - 2 && (mix64(n * 1000 + i * 37 + j) % 4 != 0 || j == i);
        for (int j = 0; j < nb; j++) mask[(size_t)5 * nb + j] = 0;  // head 0, block row 5: rows without keys
        kor.assign((size_t)N * S, {});
        const int G = N / Nkv;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < S; i++)
                for (int j = 0; j < S; j++)
                    if (att(n, i, j)) kor[(size_t)n * S + i].push_back((int64_t)(n / G) * S + j);
    }
};
struct BsaIn {
    std::vector<uint16_t> q, k, v, dout;
};

// Forward on the CPU or the GPU: o (dtype bits), lse.
static spattn_status bsa_nf_fwd(const BsaNf &P, const BsaIn &in, bool gpu, int det, std::vector<uint16_t> &o,
                                std::vector<float> &lse) {
    const int64_t sq[4] = {1, P.N, P.S, P.D}, sk[4] = {1, P.Nkv, P.S, P.D}, sm[4] = {1, P.N, P.nb, P.nb},
                  sl[3] = {1, P.N, P.S};
    o.assign(P.nq(), 0);
    lse.assign((size_t)P.N * P.S, 0.f);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.deterministic = det;
    spattn_status s;
    if (!gpu) {
        spattn_tensor tq = mk((void *)in.q.data(), P.dt, 4, sq, false), tk = mk((void *)in.k.data(), P.dt, 4, sk, false),
                      tv = mk((void *)in.v.data(), P.dt, 4, sk, false),
                      tm = mk((void *)P.mask.data(), SPATTN_DTYPE_U8, 4, sm, false),
                      to = mk(o.data(), P.dt, 4, sq, false), tl = mk(lse.data(), SPATTN_DTYPE_F32, 3, sl, false);
        return spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, P.bx, P.by, 0.0, &to, &tl, &opt);
    }
    DBuf q(in.q.data(), in.q.size() * 2), k(in.k.data(), in.k.size() * 2), v(in.v.data(), in.v.size() * 2),
        m(P.mask.data(), P.mask.size()), od(o.size() * 2), ld(lse.size() * 4);
    od.poison();
    ld.poison();
    spattn_tensor tq = mk(q.p, P.dt, 4, sq, true), tk = mk(k.p, P.dt, 4, sk, true), tv = mk(v.p, P.dt, 4, sk, true),
                  tm = mk(m.p, SPATTN_DTYPE_U8, 4, sm, true), to = mk(od.p, P.dt, 4, sq, true),
                  tl = mk(ld.p, SPATTN_DTYPE_F32, 3, sl, true);
    s = spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, P.bx, P.by, 0.0, &to, &tl, &opt);
    CK(cudaDeviceSynchronize());
    o = od.get<uint16_t>();
    lse = ld.get<float>();
    return s;
}
static spattn_status bsa_nf_bwd(const BsaNf &P, const BsaIn &in, const std::vector<uint16_t> &o,
                                const std::vector<float> &lse, bool gpu, int det, std::vector<uint16_t> &dq,
                                std::vector<uint16_t> &dk, std::vector<uint16_t> &dv) {
    const int64_t sq[4] = {1, P.N, P.S, P.D}, sk[4] = {1, P.Nkv, P.S, P.D}, sm[4] = {1, P.N, P.nb, P.nb},
                  sl[3] = {1, P.N, P.S};
    dq.assign(P.nq(), 0);
    dk.assign(P.nk(), 0);
    dv.assign(P.nk(), 0);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.deterministic = det;
    if (!gpu) {
        spattn_tensor tq = mk((void *)in.q.data(), P.dt, 4, sq, false), tk = mk((void *)in.k.data(), P.dt, 4, sk, false),
                      tv = mk((void *)in.v.data(), P.dt, 4, sk, false), tdo = mk((void *)in.dout.data(), P.dt, 4, sq, false),
                      tm = mk((void *)P.mask.data(), SPATTN_DTYPE_U8, 4, sm, false),
                      to = mk((void *)o.data(), P.dt, 4, sq, false), tl = mk((void *)lse.data(), SPATTN_DTYPE_F32, 3, sl, false),
                      tdq = mk(dq.data(), P.dt, 4, sq, false), tdk = mk(dk.data(), P.dt, 4, sk, false),
                      tdv = mk(dv.data(), P.dt, 4, sk, false);
        return spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, P.bx, P.by, 0.0, &tdq, &tdk, &tdv, &opt);
    }
    DBuf q(in.q.data(), in.q.size() * 2), k(in.k.data(), in.k.size() * 2), v(in.v.data(), in.v.size() * 2),
        d(in.dout.data(), in.dout.size() * 2), m(P.mask.data(), P.mask.size()), od(o.data(), o.size() * 2),
        ld(lse.data(), lse.size() * 4), gq(dq.size() * 2), gk(dk.size() * 2), gv(dv.size() * 2);
    gq.poison();
    gk.poison();
    gv.poison();
    spattn_tensor tq = mk(q.p, P.dt, 4, sq, true), tk = mk(k.p, P.dt, 4, sk, true), tv = mk(v.p, P.dt, 4, sk, true),
                  tdo = mk(d.p, P.dt, 4, sq, true), tm = mk(m.p, SPATTN_DTYPE_U8, 4, sm, true),
                  to = mk(od.p, P.dt, 4, sq, true), tl = mk(ld.p, SPATTN_DTYPE_F32, 3, sl, true),
                  tdq = mk(gq.p, P.dt, 4, sq, true), tdk = mk(gk.p, P.dt, 4, sk, true), tdv = mk(gv.p, P.dt, 4, sk, true);
    spattn_status s = spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, P.bx, P.by, 0.0, &tdq, &tdk, &tdv, &opt);
    CK(cudaDeviceSynchronize());
    dq = gq.get<uint16_t>();
    dk = gk.get<uint16_t>();
    dv = gv.get<uint16_t>();
    return s;
}

// The five outputs of one backend run (forward from in; backward from in with the given O / LSE).
struct Run5 {
    OutT o, l, dq, dk, dv;
    spattn_status sf = SPATTN_STATUS_SUCCESS, sb = SPATTN_STATUS_SUCCESS;
    std::vector<uint16_t> o_bits;
    std::vector<float> lse;
};
static Run5 bsa_run5(const BsaNf &P, const BsaIn &in, bool gpu, int det, const Run5 *fwd_for_bwd) {
    Run5 r;
    const Tol t = tol_of(P.dt);
    r.sf = bsa_nf_fwd(P, in, gpu, det, r.o_bits, r.lse);
    const std::vector<uint16_t> &ob = fwd_for_bwd ? fwd_for_bwd->o_bits : r.o_bits;
    const std::vector<float> &lb = fwd_for_bwd ? fwd_for_bwd->lse : r.lse;
    std::vector<uint16_t> dq, dk, dv;
    r.sb = bsa_nf_bwd(P, in, ob, lb, gpu, det, dq, dk, dv);
    r.o = {"O", to_f(r.o_bits, P.dt), t};
    r.l = {"LSE", r.lse, kTolLse};
    r.dq = {"dQ", to_f(dq, P.dt), t};
    r.dk = {"dK", to_f(dk, P.dt), t};
    r.dv = {"dV", to_f(dv, P.dt), t};
    return r;
}

// The bsa CUDA exception (spattn.h): forward, v of a 128-key tile that a 128-row query tile
// processes reaches the tile's rows (that column); backward, a non-finite q, dO, O, LSE row or k, v
// key in a processed 64 x 128 tile reaches dQ of the tile's rows and dK, dV of its keys.
static void bsa_may(const BsaNf &P, const std::vector<int64_t> &bad_rows, const std::vector<int64_t> &bad_keys, int vkey,
                    int vcol, std::vector<uint8_t> &co, std::vector<uint8_t> &cq, std::vector<uint8_t> &ck,
                    std::vector<uint8_t> &cv) {
    const int G = P.N / P.Nkv, nqt = (P.S + 63) / 64, nkt = (P.S + 127) / 128;
    auto processed = [&](int n, int i0, int i1, int j0, int j1) {
        for (int i = i0; i < std::min(i1, P.S); i += 1)
            for (int j = j0; j < std::min(j1, P.S); j++)
                if (P.att(n, i, j)) return true;
        return false;
    };
    if (vkey >= 0) {  // forward: v of key vkey (kv row g * S + j)
        const int g = vkey / P.S, j = vkey % P.S, kt = j / 128;
        for (int n = g * G; n < (g + 1) * G; n++)
            for (int t = 0; t < (P.S + 127) / 128; t++)
                if (processed(n, t * 128, t * 128 + 128, kt * 128, kt * 128 + 128))
                    for (int i = t * 128; i < std::min(t * 128 + 128, P.S); i++) co[((int64_t)n * P.S + i) * P.D + vcol] |= C_MAY;
    }
    std::vector<uint8_t> rowbad((size_t)P.N * nqt, 0), keybad((size_t)P.Nkv * nkt, 0);
    for (int64_t r : bad_rows) rowbad[(r / P.S) * nqt + (r % P.S) / 64] = 1;
    for (int64_t k : bad_keys) keybad[(k / P.S) * nkt + (k % P.S) / 128] = 1;
    for (int n = 0; n < P.N; n++)
        for (int a = 0; a < nqt; a++)
            for (int b = 0; b < nkt; b++) {
                const int g = n / G;
                if (!rowbad[(size_t)n * nqt + a] && !keybad[(size_t)g * nkt + b]) continue;
                if (!processed(n, a * 64, a * 64 + 64, b * 128, b * 128 + 128)) continue;
                for (int i = a * 64; i < std::min(a * 64 + 64, P.S); i++)
                    for (int d = 0; d < P.D; d++) cq[((int64_t)n * P.S + i) * P.D + d] |= C_MAY;
                for (int j = b * 128; j < std::min(b * 128 + 128, P.S); j++)
                    for (int d = 0; d < P.D; d++) {
                        ck[((int64_t)g * P.S + j) * P.D + d] |= C_MAY;
                        cv[((int64_t)g * P.S + j) * P.D + d] |= C_MAY;
                    }
            }
}

enum { SC_CLEAN, SC_Q_NAN, SC_Q_NAN_EMPTY, SC_K_NAN, SC_KR_NAN, SC_V_NAN, SC_Q_INF, SC_K_INF, SC_COUNT };
static const char *const sc_name[SC_COUNT] = {"NaN-free", "NaN in q", "NaN in q of a row without keys", "NaN in k",
                                              "NaN in k_rope", "NaN in v", "+inf in q", "+inf in k"};
static const int kPosCol = 11;  // column of q and k kept positive: a planted +inf there gives +inf scores

static void check_nonfinite_bsa(int D, int dt, const std::vector<int> &dets) {
    BsaNf P;
    P.D = D;
    P.dt = dt;
    if (g_quick) P.S = 512;
    P.build();
    BsaIn base;
    base.q.resize(P.nq());
    base.dout.resize(P.nq());
    base.k.resize(P.nk());
    base.v.resize(P.nk());
    for (int64_t e = 0; e < P.nq(); e++) {
        const float x = hval(11, e);
        base.q[e] = f2bits(e % D == kPosCol ? fabsf(x) + 0.1f : x, dt);
        base.dout[e] = f2bits(hval(14, e), dt);
    }
    for (int64_t e = 0; e < P.nk(); e++) {
        const float x = hval(12, e);
        base.k[e] = f2bits(e % D == kPosCol ? fabsf(x) + 0.1f : x, dt);
        base.v[e] = f2bits(hval(13, e), dt);
    }
    // the planted places: a row of head 1 with keys; a row of head 0's empty block row 5; a key
    // some rows attend and others do not
    const int64_t r0 = (int64_t)1 * P.S + (P.S * 11) / 16 + 3, re = 5 * 64 + 7;
    int64_t k0 = -1;
    std::vector<int> cnt((size_t)P.Nkv * P.S, 0);
    for (const auto &ks : P.kor)
        for (int64_t x : ks) cnt[x]++;
    for (int64_t j = P.S / 2 - 40; j < P.S && k0 < 0; j++)
        if (cnt[j] > 0 && cnt[j] < P.N * P.S / 4) k0 = j;
    if (P.kor[r0].empty() || !P.kor[re].empty() || k0 < 0) {
        report(false, "nonfinite bsa setup", "the planted rows / key do not have the intended keys");
        return;
    }
    const Run5 cpu0 = bsa_run5(P, base, false, 1, nullptr);
    std::vector<Run5> gpu0(2);
    for (int det : dets) gpu0[det] = bsa_run5(P, base, !g_selftest, det, &cpu0);
    const uint16_t qnan = f2bits(NAN, dt), pinf = f2bits(INFINITY, dt);
    for (int sc = 0; sc < SC_COUNT; sc++) {
        if (sc == SC_KR_NAN) continue;  // no rope in bsa
        BsaIn in = base;
        Plant pl;
        std::vector<int64_t> bad_rows, bad_keys;
        int vkey = -1, vcol = -1;
        auto rows_of_key = [&](int64_t key) {
            std::vector<int64_t> rs;
            for (int64_t r = 0; r < (int64_t)P.kor.size(); r++)
                if (std::find(P.kor[r].begin(), P.kor[r].end(), key) != P.kor[r].end()) rs.push_back(r);
            return rs;
        };
        switch (sc) {
        case SC_Q_NAN: in.q[r0 * D + 9] = qnan; pl.nan_rows = {r0}; bad_rows = {r0}; break;
        case SC_Q_INF: in.q[r0 * D + kPosCol] = pinf; pl.nan_rows = {r0}; bad_rows = {r0}; break;
        case SC_Q_NAN_EMPTY: in.q[re * D + 9] = qnan; bad_rows = {re}; break;
        case SC_K_NAN: in.k[k0 * D + 3] = qnan; pl.nan_rows = rows_of_key(k0); bad_keys = {k0}; break;
        case SC_K_INF: in.k[k0 * D + kPosCol] = pinf; pl.nan_rows = rows_of_key(k0); bad_keys = {k0}; break;
        case SC_V_NAN: in.v[k0 * D + 2] = qnan; pl.nan_rows = rows_of_key(k0); pl.vcol = vcol = 2; vkey = (int)k0; bad_keys = {k0}; break;
        default: break;
        }
        for (int64_t r : pl.nan_rows) bad_rows.push_back(r);  // their O / LSE are non-finite inputs of the backward
        std::vector<uint8_t> co, cl, cq, ck, cv;
        classes(pl, P.kor, (int64_t)P.Nkv * P.S, D, true, co, cl, cq, ck, cv, D, D);
        if (sc != SC_CLEAN) bsa_may(P, bad_rows, bad_keys, vkey, vcol, co, cq, ck, cv);
        const Run5 cpu = sc == SC_CLEAN ? cpu0 : bsa_run5(P, in, false, 1, nullptr);
        for (int det : dets) {
            const Run5 gpu = sc == SC_CLEAN ? gpu0[det] : bsa_run5(P, in, !g_selftest, det, &cpu);
            std::string why;
            if (cpu.sf || cpu.sb) why = std::string("CPU status ") + spattn_status_str(cpu.sf ? cpu.sf : cpu.sb);
            else if (gpu.sf || gpu.sb) why = std::string("GPU status ") + spattn_status_str(gpu.sf ? gpu.sf : gpu.sb);
            else
                why = judge_all({{&cpu.o, &cpu0.o, &gpu.o, &gpu0[det].o, &co},
                                 {&cpu.l, &cpu0.l, &gpu.l, &gpu0[det].l, &cl},
                                 {&cpu.dq, &cpu0.dq, &gpu.dq, &gpu0[det].dq, &cq},
                                 {&cpu.dk, &cpu0.dk, &gpu.dk, &gpu0[det].dk, &ck},
                                 {&cpu.dv, &cpu0.dv, &gpu.dv, &gpu0[det].dv, &cv}},
                                det == 1);
            char name[200];
            snprintf(name, sizeof name, "nonfinite bsa D%d %s det%d: %s (fwd+bwd)", D, dt_name(dt), det, sc_name[sc]);
            report(why.empty(), name, why);
        }
    }
}

// ---- sfa ------------------------------------------------------------------------------------
struct SfaNf {
    int S1 = 64, S2 = 512, N1 = 16, N2 = 1, D = 512, Dr = 64, K = 128, dt = SPATTN_DTYPE_F16;
    bool shared = true;
    std::vector<int32_t> idx;               // [1, S1, N2, K]
    std::vector<std::vector<int64_t>> kor;  // keys of each row (s * N1 + h) as key rows j * N2 + g
    int64_t nq() const { return (int64_t)S1 * N1 * D; }
    int64_t nqr() const { return (int64_t)S1 * N1 * Dr; }
    int64_t nk() const { return (int64_t)S2 * N2 * D; }
    int64_t nkr() const { return (int64_t)S2 * N2 * Dr; }
    // Every (token, key head) selects K / 64 distinct whole aligned 64-key blocks (sbs 1, mode 0), in
    // a shuffled order; token 7 selects nothing.  So every 64-key block a kernel visits for a token
    // is attended by all its heads (no kernel tile holds a masked pair).
    void build() {
        const int nb = S2 / 64, per = K / 64;
        idx.assign((size_t)S1 * N2 * K, -1);
        for (int s = 0; s < S1; s++)
            for (int g = 0; g < N2; g++) {
                if (s == 7) continue;
                std::vector<int> blocks = {(s / 8 + g) % nb};
                while ((int)blocks.size() < per) {
                    const int b = (int)(hrand() * nb);
                    if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
                }
                int32_t *row = &idx[((size_t)s * N2 + g) * K];
                for (int t = 0; t < per * 64; t++) row[t] = blocks[t / 64] * 64 + t % 64;
                for (int t = K - 1; t > 0; t--) std::swap(row[t], row[(int)(hrand() * (t + 1))]);
            }
        kor.assign((size_t)S1 * N1, {});
        const int H = N1 / N2;
        for (int s = 0; s < S1; s++)
            for (int h = 0; h < N1; h++)
                for (int t = 0; t < K; t++) {
                    const int32_t j = idx[((size_t)s * N2 + h / H) * K + t];
                    if (j >= 0) kor[(size_t)s * N1 + h].push_back((int64_t)j * N2 + h / H);
                }
    }
};
struct SfaIn {
    std::vector<uint16_t> q, qr, k, kr, v, dout;
};
struct Run7 {
    OutT o, l, dq, dqr, dk, dkr, dv;
    spattn_status sf = SPATTN_STATUS_SUCCESS, sb = SPATTN_STATUS_SUCCESS;
    std::vector<uint16_t> o_bits;
    std::vector<float> lse;
};

static Run7 sfa_run7(const SfaNf &P, const SfaIn &in, bool gpu, int det, const Run7 *fwd_for_bwd) {
    Run7 r;
    const int dt = P.dt;
    const bool rope = P.Dr > 0;
    const int64_t sq[4] = {1, P.S1, P.N1, P.D}, sqr[4] = {1, P.S1, P.N1, P.Dr}, sk[4] = {1, P.S2, P.N2, P.D},
                  skr[4] = {1, P.S2, P.N2, P.Dr}, si[4] = {1, P.S1, P.N2, P.K}, sl[3] = {1, P.S1, P.N1};
    spattn_options opt;
    spattn_options_init(&opt);
    opt.deterministic = det;
    std::vector<uint16_t> o(P.nq()), dq(P.nq()), dqr(P.nqr()), dk(P.nk()), dkr(P.nkr()), dv(P.shared ? 0 : P.nk());
    std::vector<float> lse((size_t)P.S1 * P.N1);
    // host or device copies of every tensor
    std::vector<std::unique_ptr<DBuf>> keep;
    auto place = [&](const void *h, size_t bytes) -> void * {
        if (!gpu) return const_cast<void *>(h);
        keep.emplace_back(new DBuf(h, bytes));
        return keep.back()->p;
    };
    auto outbuf = [&](void *h, size_t bytes) -> void * {
        if (!gpu) return h;
        keep.emplace_back(new DBuf(bytes));
        keep.back()->poison();
        return keep.back()->p;
    };
    void *q = place(in.q.data(), in.q.size() * 2), *qr = rope ? place(in.qr.data(), in.qr.size() * 2) : nullptr,
         *k = place(in.k.data(), in.k.size() * 2), *kr = rope ? place(in.kr.data(), in.kr.size() * 2) : nullptr,
         *v = P.shared ? nullptr : place(in.v.data(), in.v.size() * 2), *d = place(in.dout.data(), in.dout.size() * 2),
         *ix = place(P.idx.data(), P.idx.size() * 4);
    spattn_tensor tq = mk(q, dt, 4, sq, gpu), tqr = mk(qr, dt, 4, sqr, gpu), tk = mk(k, dt, 4, sk, gpu),
                  tkr = mk(kr, dt, 4, skr, gpu), tv = mk(v, dt, 4, sk, gpu), td = mk(d, dt, 4, sq, gpu),
                  ti = mk(ix, SPATTN_DTYPE_I32, 4, si, gpu);
    void *go = outbuf(o.data(), o.size() * 2), *gl = outbuf(lse.data(), lse.size() * 4);
    spattn_tensor to = mk(go, dt, 4, sq, gpu), tl = mk(gl, SPATTN_DTYPE_F32, 3, sl, gpu);
    r.sf = spattn_sfa_fwd_ex(&tq, rope ? &tqr : NULL, &tk, rope ? &tkr : NULL, P.shared ? NULL : &tv, &ti, 1, 0, 0.0, &to,
                             &tl, &opt);
    if (gpu) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(o.data(), go, o.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse.data(), gl, lse.size() * 4, cudaMemcpyDeviceToHost));
    }
    r.o_bits = o;
    r.lse = lse;
    const std::vector<uint16_t> &ob = fwd_for_bwd ? fwd_for_bwd->o_bits : o;
    const std::vector<float> &lb = fwd_for_bwd ? fwd_for_bwd->lse : lse;
    void *bo = place(ob.data(), ob.size() * 2), *bl = place(lb.data(), lb.size() * 4);
    void *gdq = outbuf(dq.data(), dq.size() * 2), *gdqr = rope ? outbuf(dqr.data(), dqr.size() * 2) : nullptr,
         *gdk = outbuf(dk.data(), dk.size() * 2), *gdkr = rope ? outbuf(dkr.data(), dkr.size() * 2) : nullptr,
         *gdv = P.shared ? nullptr : outbuf(dv.data(), dv.size() * 2);
    spattn_tensor tbo = mk(bo, dt, 4, sq, gpu), tbl = mk(bl, SPATTN_DTYPE_F32, 3, sl, gpu), tdq = mk(gdq, dt, 4, sq, gpu),
                  tdqr = mk(gdqr, dt, 4, sqr, gpu), tdk = mk(gdk, dt, 4, sk, gpu), tdkr = mk(gdkr, dt, 4, skr, gpu),
                  tdv = mk(gdv, dt, 4, sk, gpu);
    r.sb = spattn_sfa_bwd_ex(&tq, rope ? &tqr : NULL, &tk, rope ? &tkr : NULL, P.shared ? NULL : &tv, &tbo, &td, &tbl, &ti,
                             1, 0, 0.0, &tdq, rope ? &tdqr : NULL, &tdk, rope ? &tdkr : NULL, P.shared ? NULL : &tdv, &opt);
    if (gpu) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(dq.data(), gdq, dq.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(dk.data(), gdk, dk.size() * 2, cudaMemcpyDeviceToHost));
        if (rope) CK(cudaMemcpy(dqr.data(), gdqr, dqr.size() * 2, cudaMemcpyDeviceToHost));
        if (rope) CK(cudaMemcpy(dkr.data(), gdkr, dkr.size() * 2, cudaMemcpyDeviceToHost));
        if (!P.shared) CK(cudaMemcpy(dv.data(), gdv, dv.size() * 2, cudaMemcpyDeviceToHost));
    }
    const Tol t = tol_of(dt);
    r.o = {"O", to_f(o, dt), t};
    r.l = {"LSE", lse, kTolLse};
    r.dq = {"dQ", to_f(dq, dt), t};
    r.dqr = {"dQ_rope", to_f(dqr, dt), t};
    r.dk = {"dK", to_f(dk, dt), t};
    r.dkr = {"dK_rope", to_f(dkr, dt), t};
    r.dv = {"dV", to_f(dv, dt), t};
    return r;
}

static void check_nonfinite_sfa(SfaNf P, const std::vector<int> &dets) {
    P.build();
    const int dt = P.dt, D = P.D, Dr = P.Dr;
    SfaIn base;
    auto gen = [&](std::vector<uint16_t> &x, int64_t n, int width, uint64_t seed, bool pos) {
        x.resize(n);
        for (int64_t e = 0; e < n; e++) {
            const float f = hval(seed, e);
            x[e] = f2bits(pos && e % width == kPosCol ? fabsf(f) + 0.1f : f, dt);
        }
    };
    gen(base.q, P.nq(), D, 21, true);
    gen(base.qr, P.nqr(), Dr ? Dr : 1, 22, false);
    gen(base.k, P.nk(), D, 23, true);
    gen(base.kr, P.nkr(), Dr ? Dr : 1, 24, false);
    gen(base.dout, P.nq(), D, 25, false);
    if (!P.shared) gen(base.v, P.nk(), D, 26, false);
    // planted places: token 40 head 1 (it has keys), token 7 head 0 (no keys), a key of block 2
    // (selected by some tokens, not by all) of key head 0
    const int64_t r0 = (int64_t)40 * P.N1 + 1, re = (int64_t)7 * P.N1, k0 = (int64_t)(2 * 64 + 17) * P.N2;
    std::vector<int> cnt((size_t)P.S2 * P.N2, 0);
    for (const auto &ks : P.kor)
        for (int64_t x : ks) cnt[x]++;
    char name[240];
    snprintf(name, sizeof name, "nonfinite sfa N1 %d N2 %d S2 %d D %d+%d %s %s", P.N1, P.N2, P.S2, D, Dr,
             P.shared ? "shared kv" : "separate v", dt_name(dt));
    if (P.kor[r0].empty() || !P.kor[re].empty() || cnt[k0] == 0 || cnt[k0] >= P.S1 * P.N1) {
        report(false, name, "setup: the planted rows / key do not have the intended keys");
        return;
    }
    const Run7 cpu0 = sfa_run7(P, base, false, 1, nullptr);
    std::vector<Run7> gpu0(2);
    for (int det : dets) gpu0[det] = sfa_run7(P, base, !g_selftest, det, &cpu0);
    const uint16_t qnan = f2bits(NAN, dt), pinf = f2bits(INFINITY, dt);
    for (int sc = 0; sc < SC_COUNT; sc++) {
        if ((sc == SC_KR_NAN && !Dr) || (sc == SC_V_NAN && P.shared)) continue;
        SfaIn in = base;
        Plant pl;
        auto rows_of_key = [&](int64_t key) {
            std::vector<int64_t> rs;
            for (int64_t r = 0; r < (int64_t)P.kor.size(); r++)
                if (std::find(P.kor[r].begin(), P.kor[r].end(), key) != P.kor[r].end()) rs.push_back(r);
            return rs;
        };
        switch (sc) {
        case SC_Q_NAN: in.q[r0 * D + 9] = qnan; pl.nan_rows = {r0}; break;
        case SC_Q_INF: in.q[r0 * D + kPosCol] = pinf; pl.nan_rows = {r0}; break;
        case SC_Q_NAN_EMPTY: in.q[re * D + 9] = qnan; break;
        case SC_K_NAN: in.k[k0 * D + 3] = qnan; pl.nan_rows = rows_of_key(k0); break;  // shared: v too
        case SC_KR_NAN: in.kr[k0 * Dr + 5] = qnan; pl.nan_rows = rows_of_key(k0); break;
        case SC_K_INF: in.k[k0 * D + kPosCol] = pinf; pl.nan_rows = rows_of_key(k0); break;
        case SC_V_NAN: in.v[k0 * D + 2] = qnan; pl.nan_rows = rows_of_key(k0); pl.vcol = 2; break;
        default: break;
        }
        std::vector<uint8_t> co, cl, cq, ck, cv, cqr, ckr, x1, x2, x3;
        classes(pl, P.kor, (int64_t)P.S2 * P.N2, D, !P.shared, co, cl, cq, ck, cv, D, D);
        if (Dr) classes(pl, P.kor, (int64_t)P.S2 * P.N2, D, false, x1, x2, cqr, ckr, x3, Dr, Dr);
        if (P.shared && pl.vcol < 0)  // the dV contribution goes into dK: same classes already
            ;
        // The grouped (union) form of the CUDA kernels at 4-32 heads per key head (D 512 + 64,
        // shared kv; spattn.h's tile exception): groups of 64 / H consecutive tokens run over the
        // union of their selections as one tile, so 0 * NaN reaches pairs a token does not
        // attend: a non-finite q of a token (dK = dS^T Q over the whole tile) may reach dK /
        // dK_rope of every key of its group's union; a non-finite k, k_rope or v of a key
        // (O = P V, dP = dO V^T, dQ = dS K) may reach O, dQ and dQ_rope of every row of the
        // groups whose union holds it.
        const int H = P.N1 / P.N2;
        if (!g_selftest && P.D == 512 && P.Dr == 64 && P.shared && H >= 4 && H <= 32 && !(H & (H - 1))) {
            const int ug = 64 / H;
            auto uni = [&](int grp, int g) {  // the union's key rows (j N2 + g) of group grp, key head g
                std::vector<int64_t> u;
                for (int s = grp * ug; s < std::min(P.S1, grp * ug + ug); s++)
                    for (int h = g * H; h < g * H + H; h++)
                        for (int64_t x : P.kor[(size_t)s * P.N1 + h]) u.push_back(x);
                std::sort(u.begin(), u.end());
                u.erase(std::unique(u.begin(), u.end()), u.end());
                return u;
            };
            const bool tok = sc == SC_Q_NAN || sc == SC_Q_INF || sc == SC_Q_NAN_EMPTY;
            const bool key = sc == SC_K_NAN || sc == SC_KR_NAN || sc == SC_K_INF || sc == SC_V_NAN;
            if (tok) {
                const int64_t row = sc == SC_Q_NAN_EMPTY ? re : r0;
                const int s = (int)(row / P.N1), g = (int)(row % P.N1) / H;
                for (int64_t x : uni(s / ug, g)) {
                    for (int d = 0; d < D; d++) ck[x * D + d] |= C_MAY;
                    for (int d = 0; d < Dr; d++) ckr[x * Dr + d] |= C_MAY;
                }
            }
            if (key) {
                const int g = (int)(k0 % P.N2);
                for (int grp = 0; grp * ug < P.S1; grp++) {
                    const std::vector<int64_t> u = uni(grp, g);
                    if (!std::binary_search(u.begin(), u.end(), k0)) continue;
                    for (int s = grp * ug; s < std::min(P.S1, grp * ug + ug); s++)
                        for (int h = g * H; h < g * H + H; h++) {
                            const int64_t r = (int64_t)s * P.N1 + h;
                            for (int d = 0; d < D; d++) co[r * D + d] |= C_MAY, cq[r * D + d] |= C_MAY;
                            for (int d = 0; d < Dr; d++) cqr[r * Dr + d] |= C_MAY;
                        }
                }
            }
        }
        // The forward's group form of the other shapes with D <= 128 (sfa_fwd_group.cu: dense calls,
        // 9-32 heads per key head; spattn.h's exception): groups of 8 (9-16 heads) or 4 (17-32)
        // consecutive tokens (aligned) run over the union of their selected 64-key blocks, O^T +=
        // V^T P^T over each block's 64 keys, so a non-finite v row (shared kv: k's first D columns)
        // reaches the O of the group's tokens that selected its block.  Marked for the group of
        // each such token; the backward takes the CPU forward's O.
        const bool vrow = sc == SC_V_NAN || (P.shared && (sc == SC_K_NAN || sc == SC_K_INF));
        const int gsz = H <= 16 ? 8 : 4;
        if (!g_selftest && P.D <= 128 && H >= 9 && H <= 32 && vrow) {
            const int g = (int)(k0 % P.N2);
            const int64_t blk = (k0 / P.N2) / 64;
            for (int s = 0; s < P.S1; s++) {
                bool sel = false;
                for (int h = g * H; h < g * H + H && !sel; h++)
                    for (int64_t x : P.kor[(size_t)s * P.N1 + h])
                        if (x % P.N2 == g && (x / P.N2) / 64 == blk) sel = true;
                if (!sel) continue;
                for (int s2 = s / gsz * gsz; s2 < std::min(P.S1, s / gsz * gsz + gsz); s2++)
                    for (int h = g * H; h < g * H + H; h++)
                        for (int d = 0; d < D; d++) co[((int64_t)s2 * P.N1 + h) * D + d] |= C_MAY;
            }
        }
        const Run7 cpu = sc == SC_CLEAN ? cpu0 : sfa_run7(P, in, false, 1, nullptr);
        for (int det : dets) {
            const Run7 gpu = sc == SC_CLEAN ? gpu0[det] : sfa_run7(P, in, !g_selftest, det, &cpu);
            const Run7 &g0 = gpu0[det];
            std::string why;
            if (cpu.sf || cpu.sb) why = std::string("CPU status ") + spattn_status_str(cpu.sf ? cpu.sf : cpu.sb);
            else if (gpu.sf || gpu.sb)
                why = std::string("GPU status ") + spattn_status_str(gpu.sf ? gpu.sf : gpu.sb) + ": " + spattn_last_error();
            else {
                std::vector<Judge> js = {{&cpu.o, &cpu0.o, &gpu.o, &g0.o, &co},
                                         {&cpu.l, &cpu0.l, &gpu.l, &g0.l, &cl},
                                         {&cpu.dq, &cpu0.dq, &gpu.dq, &g0.dq, &cq},
                                         {&cpu.dk, &cpu0.dk, &gpu.dk, &g0.dk, &ck}};
                if (Dr) js.push_back({&cpu.dqr, &cpu0.dqr, &gpu.dqr, &g0.dqr, &cqr});
                if (Dr) js.push_back({&cpu.dkr, &cpu0.dkr, &gpu.dkr, &g0.dkr, &ckr});
                if (!P.shared) js.push_back({&cpu.dv, &cpu0.dv, &gpu.dv, &g0.dv, &cv});
                why = judge_all(js, false);  // deterministic sfa: fixed point scaled by max|input|, not bitwise across inputs
            }
            char full[400];
            snprintf(full, sizeof full, "%s det%d: %s (fwd+bwd)", name, det, sc_name[sc]);
            report(why.empty(), full, why);
        }
    }
}

// =============================================================================================
// 4. Absurd problems: the workspace cannot be allocated, the tensors fit.
// =============================================================================================
template <typename P> static std::vector<char> reference_bits(const P &prob) {
    DBuf out(prob.out_bytes());
    out.poison();
    const spattn_status s = prob.run(out.p, NULL);
    CK(cudaDeviceSynchronize());
    if (s != SPATTN_STATUS_SUCCESS) return {};
    return out.get<char>();
}
// The call after an absurd one: the normal problem gives the reference bits.
template <typename P> static void next_call_ok(const P &prob, const std::vector<char> &want, const char *what) {
    DBuf out(prob.out_bytes());
    out.poison();
    const spattn_status s = prob.run(out.p, NULL);
    const cudaError_t e = cudaDeviceSynchronize();
    report(s == SPATTN_STATUS_SUCCESS && e == cudaSuccess && !want.empty() && out.get<char>() == want, what,
           std::string("status ") + spattn_status_str(s) + ", CUDA " + cudaGetErrorString(e) + ": " + spattn_last_error());
}
static std::string absurd_why(spattn_status s, cudaError_t sticky, size_t need, size_t total) {
    char m[400];
    snprintf(m, sizeof m, "status %d (%s), CUDA after the call: %s, workspace %zu bytes, device memory %zu bytes: %s", s,
             spattn_status_str(s), cudaGetErrorString(sticky), need, total, spattn_last_error());
    return m;
}

static void check_absurd(const Bsa &bsa, const std::vector<char> &want_bsa, const Sfa &sfa, const std::vector<char> &want_sfa) {
    size_t freeb = 0, total = 0;
    CK(cudaMemGetInfo(&freeb, &total));
    // bsa, fp16, D 8 (padded to 64 by the Hopper kernels), S = 2^25 over one head, blocks of 2^21:
    // the tensors are 512 MiB each (q, k, v, o, dout share one buffer), the schedule lists are
    // quadratic in S (forward (S/128)^2 x 8 bytes, backward (S/64)(S/128) x 4 bytes: 512 GiB).
    {
        const int64_t S = 1ll << 25, D = 8, blk = 1ll << 21, nb = S / blk;
        const size_t bytes = (size_t)S * D * 2;
        DBuf x(bytes), o(bytes), l((size_t)S * 4), m((size_t)nb * nb), dq(bytes), dk(bytes), dv(bytes);
        CK(cudaMemset(x.p, 0, bytes));
        CK(cudaMemset(l.p, 0, (size_t)S * 4));
        CK(cudaMemset(m.p, 0, (size_t)nb * nb));
        const int64_t sq[4] = {1, 1, S, D}, sm[4] = {1, 1, nb, nb}, sl[3] = {1, 1, S};
        const int F = SPATTN_DTYPE_F16;
        spattn_tensor tx = mk(x.p, F, 4, sq, true), to = mk(o.p, F, 4, sq, true), tl = mk(l.p, SPATTN_DTYPE_F32, 3, sl, true),
                      tm = mk(m.p, SPATTN_DTYPE_U8, 4, sm, true), tdq = mk(dq.p, F, 4, sq, true),
                      tdk = mk(dk.p, F, 4, sq, true), tdv = mk(dv.p, F, 4, sq, true);
        for (int bwd = 0; bwd < 2; bwd++) {
            size_t need = 0;
            spattn_status s = spattn_bsa_workspace_size(&tx, &tx, &tx, &tm, blk, blk, bwd, NULL, &need);
            const char *what = bwd ? "absurd bsa backward (S 2^25, workspace beyond device memory): OUT_OF_MEMORY, no sticky error"
                                   : "absurd bsa forward (S 2^25, workspace beyond device memory): OUT_OF_MEMORY, no sticky error";
            if (s != SPATTN_STATUS_SUCCESS || need <= total) {
                report(false, what, "precondition: the workspace query gave " + std::to_string(need) +
                                        " bytes (status " + spattn_status_str(s) + "), not more than the device's " +
                                        std::to_string(total));
                continue;
            }
            s = bwd ? spattn_bsa_bwd_ex(&tx, &tx, &tx, &tx, &tx, &tl, &tm, blk, blk, 0.0, &tdq, &tdk, &tdv, NULL)
                    : spattn_bsa_fwd_ex(&tx, &tx, &tx, &tm, blk, blk, 0.0, &to, &tl, NULL);
            const cudaError_t sticky = cudaDeviceSynchronize();
            const cudaError_t last = cudaGetLastError();
            report(s == SPATTN_STATUS_OUT_OF_MEMORY && sticky == cudaSuccess && last == cudaSuccess, what,
                   absurd_why(s, sticky, need, total));
        }
    }
    next_call_ok(bsa, want_bsa, "absurd bsa: the next normal bsa call succeeds with the reference bits");
    // sfa backward, fp16, D 512 + 64 (Hopper kernels), one query token, K = 64 of S2 = 2^25 keys
    // (a sparse selection: the token-major backward, whose int64 accumulator takes 9 bytes per
    // key and column, ~174 GB; the key-major one caps its own buffers at 4 GiB, so it cannot be
    // the absurd one); k and k_rope are stride-0 views of one row, dk / dk_rope are real (~39 GB).
    {
        const int64_t S1 = 1, S2 = 1ll << 25, K = 64, sbs = 1, D = 512, Dr = 64;
        DBuf q(D * 2), qr(Dr * 2), o(D * 2), d(D * 2), l(4), ix(K * 4), k(D * 2), kr(Dr * 2), dq(D * 2), dqr(Dr * 2),
            dk((size_t)S2 * D * 2), dkr((size_t)S2 * Dr * 2);
        void *zero[] = {q.p, qr.p, o.p, d.p, l.p, k.p, kr.p};
        size_t zn[] = {q.n, qr.n, o.n, d.n, l.n, k.n, kr.n};
        for (int i = 0; i < 7; i++) CK(cudaMemset(zero[i], 0, zn[i]));
        std::vector<int32_t> row(K);
        for (int i = 0; i < K; i++) row[i] = i * 1000;
        CK(cudaMemcpy(ix.p, row.data(), K * 4, cudaMemcpyHostToDevice));
        const int F = SPATTN_DTYPE_F16;
        const int64_t sq[4] = {1, S1, 1, D}, sqr[4] = {1, S1, 1, Dr}, sk[4] = {1, S2, 1, D}, skr[4] = {1, S2, 1, Dr},
                      si[4] = {1, S1, 1, K}, sl[3] = {1, S1, 1}, z4[4] = {0, 0, 0, 1};
        spattn_tensor tq = mk(q.p, F, 4, sq, true), tqr = mk(qr.p, F, 4, sqr, true), to = mk(o.p, F, 4, sq, true),
                      td = mk(d.p, F, 4, sq, true), tl = mk(l.p, SPATTN_DTYPE_F32, 3, sl, true),
                      ti = mk(ix.p, SPATTN_DTYPE_I32, 4, si, true), tk = mk(k.p, F, 4, sk, true, z4),
                      tkr = mk(kr.p, F, 4, skr, true, z4), tdq = mk(dq.p, F, 4, sq, true), tdqr = mk(dqr.p, F, 4, sqr, true),
                      tdk = mk(dk.p, F, 4, sk, true), tdkr = mk(dkr.p, F, 4, skr, true);
        size_t need = 0;
        spattn_status s = spattn_sfa_workspace_size(&tq, &tqr, &tk, &tkr, NULL, &ti, sbs, 0, 1, NULL, &need);
        const char *what = "absurd sfa backward (2^25 keys, token-major accumulator beyond device memory): "
                           "OUT_OF_MEMORY, no sticky error";
        if (s != SPATTN_STATUS_SUCCESS || need <= total) {
            report(false, what, "precondition: the workspace query gave " + std::to_string(need) + " bytes (status " +
                                    spattn_status_str(s) + ": " + spattn_last_error() + "), not more than the device's " +
                                    std::to_string(total));
        } else {
            s = spattn_sfa_bwd_ex(&tq, &tqr, &tk, &tkr, NULL, &to, &td, &tl, &ti, sbs, 0, 0.0, &tdq, &tdqr, &tdk, &tdkr, NULL, NULL);
            const cudaError_t sticky = cudaDeviceSynchronize();
            const cudaError_t last = cudaGetLastError();
            report(s == SPATTN_STATUS_OUT_OF_MEMORY && sticky == cudaSuccess && last == cudaSuccess, what,
                   absurd_why(s, sticky, need, total));
        }
    }
    next_call_ok(sfa, want_sfa, "absurd sfa: the next normal sfa call succeeds with the reference bits");
}

// =============================================================================================
// 6. Large sizes: 512K tokens, checked on sampled rows against fp64.
// =============================================================================================
__global__ void fill16_kernel(uint16_t *p, size_t n, uint64_t seed, int dt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float f = hval(seed, i);
        p[i] = dt == SPATTN_DTYPE_F16 ? __half_as_ushort(__float2half_rn(f)) : __bfloat16_as_ushort(__float2bfloat16_rn(f));
    }
}
static void fill16(void *p, size_t n, uint64_t seed, int dt) {
    fill16_kernel<<<4096, 256>>>(static_cast<uint16_t *>(p), n, seed, dt);
    CK(cudaGetLastError());
}
static double hin(uint64_t seed, uint64_t i, int dt) { return bits2f(f2bits(hval(seed, i), dt), dt); }

// bsa mask: block row bi attends its own block, the previous one (except where (bi + n) % 7 == 0)
// and, for bi % 512 == 3, block 0 (far keys).
__host__ __device__ inline bool lmask(int64_t n, int64_t bi, int64_t bj) {
    return bj == bi || (bj == bi - 1 && (bi + n) % 7 != 0) || (bj == 0 && bi % 512 == 3);
}
__global__ void lmask_kernel(uint8_t *m, int64_t N, int64_t nb) {
    const size_t total = (size_t)N * nb * nb;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int64_t bj = e % nb, bi = (e / nb) % nb, n = e / nb / nb;
        m[e] = lmask(n, bi, bj);
    }
}
// sfa indices (mode 3, S1 = S2 = S): the diagonal, the 7 previous keys, one key past the causal
// limit (masked), the rest uniform over [0, i] with some -1 (duplicates possible: they count).
__host__ __device__ inline int32_t sidx(int64_t i, int e, int K, int64_t S) {
    const uint64_t h = mix64((uint64_t)i * 131 + e + 0x5151);
    if (e == 0) return (int32_t)i;
    if (e < 8) return i - e >= 0 ? (int32_t)(i - e) : -1;
    if (e == K - 1) return i + 1 + (int64_t)(h % 50) < S ? (int32_t)(i + 1 + h % 50) : -1;
    if (h % 13 == 0) return -1;
    return (int32_t)((h >> 8) % (uint64_t)(i + 1));
}
__global__ void sidx_kernel(int32_t *p, int64_t S, int K) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)S * K; e += (size_t)gridDim.x * blockDim.x)
        p[e] = sidx(e / K, (int)(e % K), K, S);
}

template <typename F> static void parallel_for(int64_t n, F fn) {
    const int T = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::atomic<int64_t> next(0);
    std::vector<std::thread> th;
    for (int t = 0; t < T; t++)
        th.emplace_back([&]() {
            for (int64_t i; (i = next++) < n;) fn(i);
        });
    for (auto &x : th) x.join();
}

// Compares sampled GPU values against fp64 (eco criterion); "" when they pass.
struct Sampled {
    std::string name;
    std::vector<double> got, want;
    Tol tol;
};
static std::string eco(const std::vector<Sampled> &ts) {
    std::string why;
    for (const Sampled &t : ts) {
        size_t ok = 0, nonfinite = 0;
        double mx = 0;
        for (size_t e = 0; e < t.got.size(); e++) {
            if (!std::isfinite(t.got[e])) {
                nonfinite++;
                continue;
            }
            const double d = fabs(t.got[e] - t.want[e]);
            mx = std::max(mx, d);
            ok += d <= t.tol.atol + t.tol.rtol * fabs(t.want[e]);
        }
        if (t.got.empty() || nonfinite || ok < 0.99 * t.got.size() || mx > t.tol.lim) {
            char m[300];
            snprintf(m, sizeof m, "%s: %zu sampled, %zu non-finite, %zu matched, max abs error %g", t.name.c_str(),
                     t.got.size(), nonfinite, ok, mx);
            why += (why.empty() ? "" : "; ") + std::string(m);
        }
    }
    return why;
}
static std::vector<double> fetch16(const void *base, size_t off, size_t n, int dt) {
    std::vector<uint16_t> b(n);
    CK(cudaMemcpy(b.data(), static_cast<const uint16_t *>(base) + off, n * 2, cudaMemcpyDeviceToHost));
    std::vector<double> r(n);
    for (size_t i = 0; i < n; i++) r[i] = bits2f(b[i], dt);
    return r;
}
static std::vector<double> fetch32(const void *base, size_t off, size_t n) {
    std::vector<float> b(n);
    CK(cudaMemcpy(b.data(), static_cast<const float *>(base) + off, n * 4, cudaMemcpyDeviceToHost));
    return std::vector<double>(b.begin(), b.end());
}

static void check_large_bsa() {
    const int dt = SPATTN_DTYPE_BF16;
    const int64_t S = g_quick ? 4096 : (1ll << 19), N = g_quick ? 2 : 36, Nkv = g_quick ? 1 : 4, D = g_quick ? 64 : 128;
    const int64_t blk = 128, nb = S / blk, G = N / Nkv;
    const size_t nq = (size_t)N * S * D, nk = (size_t)Nkv * S * D;
    char name[200];
    snprintf(name, sizeof name, "large bsa S %lld N %lld Nkv %lld D %lld bf16 (%zu elements in q)", (long long)S,
             (long long)N, (long long)Nkv, (long long)D, nq);
    DBuf q(nq * 2), k(nk * 2), v(nk * 2), dout(nq * 2), o(nq * 2), l((size_t)N * S * 4), m((size_t)N * nb * nb),
        dq(nq * 2), dk(nk * 2), dv(nk * 2);
    fill16(q.p, nq, 31, dt);
    fill16(k.p, nk, 32, dt);
    fill16(v.p, nk, 33, dt);
    fill16(dout.p, nq, 34, dt);
    lmask_kernel<<<4096, 256>>>(static_cast<uint8_t *>(m.p), N, nb);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const int64_t sq[4] = {1, N, S, D}, sk[4] = {1, Nkv, S, D}, sm[4] = {1, N, nb, nb}, sl[3] = {1, N, S};
    spattn_tensor tq = mk(q.p, dt, 4, sq, true), tk = mk(k.p, dt, 4, sk, true), tv = mk(v.p, dt, 4, sk, true),
                  td = mk(dout.p, dt, 4, sq, true), to = mk(o.p, dt, 4, sq, true), tl = mk(l.p, SPATTN_DTYPE_F32, 3, sl, true),
                  tm = mk(m.p, SPATTN_DTYPE_U8, 4, sm, true), tdq = mk(dq.p, dt, 4, sq, true), tdk = mk(dk.p, dt, 4, sk, true),
                  tdv = mk(dv.p, dt, 4, sk, true);
    // samples: query rows (head, row) and keys (kv head, key)
    std::vector<std::pair<int64_t, int64_t>> rows, keys;
    for (int64_t n : {(int64_t)0, N / 2, N - 1})
        for (int64_t i : {(int64_t)0, (int64_t)1, (int64_t)127, (int64_t)128, 3 * blk + 5, 515 * blk + 100, S / 2 + 77, S - 129, S - 1})
            if (i < S) rows.push_back({n, i});
    for (int64_t g : {(int64_t)0, Nkv - 1})
        for (int64_t j : {(int64_t)0, (int64_t)5, (int64_t)127, (int64_t)128, (int64_t)200, S / 2 + 200, S - 129, S - 1})
            keys.push_back({g, j});
    // fp64 reference: every row the samples need (the sampled rows, and every row attending a sampled key)
    std::map<std::pair<int64_t, int64_t>, int64_t> need;  // (head, row) -> slot
    for (auto &r : rows) need.emplace(r, 0);
    for (auto &kj : keys) {
        const int64_t bj = kj.second / blk;
        for (int64_t n = kj.first * G; n < (kj.first + 1) * G; n++)
            for (int64_t bi = 0; bi < nb; bi++) {
                if (!(bi == bj || bi == bj + 1 || (bj == 0 && bi % 512 == 3)) || !lmask(n, bi, bj)) continue;
                for (int64_t i = bi * blk; i < std::min(S, bi * blk + blk); i++) need.emplace(std::make_pair(n, i), 0);
            }
    }
    std::vector<std::pair<int64_t, int64_t>> list;
    for (auto &e : need) {
        e.second = (int64_t)list.size();
        list.push_back(e.first);
    }
    struct RowRef {
        double lse;
        std::vector<double> o, dq, p, ds;  // p, ds per attended key (in `keys` order)
        std::vector<int64_t> kj;
    };
    std::vector<RowRef> ref(list.size());
    const double scale = 1.0 / sqrt((double)D);
    parallel_for((int64_t)list.size(), [&](int64_t t) {
        const int64_t n = list[t].first, i = list[t].second, g = n / G, bi = i / blk;
        RowRef &R = ref[t];
        std::vector<double> qv(D), dov(D);
        for (int64_t d = 0; d < D; d++) {
            qv[d] = hin(31, ((size_t)n * S + i) * D + d, dt);
            dov[d] = hin(34, ((size_t)n * S + i) * D + d, dt);
        }
        for (int64_t bj : {(int64_t)0, bi - 1, bi})
            if (bj >= 0 && lmask(n, bi, bj) && (R.kj.empty() || bj * blk > R.kj.back()))
                for (int64_t j = bj * blk; j < std::min(S, bj * blk + blk); j++) R.kj.push_back(j);
        const size_t nkj = R.kj.size();
        std::vector<double> kvv(nkj * D), vvv(nkj * D), s(nkj);
        double mx = -INFINITY;
        for (size_t a = 0; a < nkj; a++) {
            double acc = 0;
            for (int64_t d = 0; d < D; d++) {
                kvv[a * D + d] = hin(32, ((size_t)g * S + R.kj[a]) * D + d, dt);
                vvv[a * D + d] = hin(33, ((size_t)g * S + R.kj[a]) * D + d, dt);
                acc += qv[d] * kvv[a * D + d];
            }
            s[a] = acc * scale;
            mx = std::max(mx, s[a]);
        }
        double sum = 0;
        for (size_t a = 0; a < nkj; a++) sum += exp(s[a] - mx);
        R.lse = mx + log(sum);
        R.o.assign(D, 0);
        R.dq.assign(D, 0);
        R.p.resize(nkj);
        R.ds.resize(nkj);
        for (size_t a = 0; a < nkj; a++) {
            R.p[a] = exp(s[a] - R.lse);
            for (int64_t d = 0; d < D; d++) R.o[d] += R.p[a] * vvv[a * D + d];
        }
        double delta = 0;
        for (int64_t d = 0; d < D; d++) delta += dov[d] * R.o[d];
        for (size_t a = 0; a < nkj; a++) {
            double dp = 0;
            for (int64_t d = 0; d < D; d++) dp += dov[d] * vvv[a * D + d];
            R.ds[a] = R.p[a] * (dp - delta);
            for (int64_t d = 0; d < D; d++) R.dq[d] += scale * R.ds[a] * kvv[a * D + d];
        }
    });
    // dK, dV of the sampled keys
    std::vector<std::vector<double>> rdk(keys.size(), std::vector<double>(D, 0)), rdv = rdk;
    for (size_t t = 0; t < list.size(); t++) {
        const int64_t n = list[t].first, i = list[t].second, g = n / G;
        const RowRef &R = ref[t];
        for (size_t x = 0; x < keys.size(); x++) {
            if (keys[x].first != g) continue;
            const auto it = std::find(R.kj.begin(), R.kj.end(), keys[x].second);
            if (it == R.kj.end()) continue;
            const size_t a = it - R.kj.begin();
            for (int64_t d = 0; d < D; d++) {
                rdv[x][d] += R.p[a] * hin(34, ((size_t)n * S + i) * D + d, dt);
                rdk[x][d] += scale * R.ds[a] * hin(31, ((size_t)n * S + i) * D + d, dt);
            }
        }
    }
    for (int det = 1; det >= 0; det--) {
        spattn_options opt;
        spattn_options_init(&opt);
        opt.deterministic = det;
        o.poison();
        l.poison();
        dq.poison();
        dk.poison();
        dv.poison();
        spattn_status s = spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, blk, blk, 0.0, &to, &tl, &opt);
        if (s == SPATTN_STATUS_SUCCESS)
            s = spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &td, &tl, &tm, blk, blk, 0.0, &tdq, &tdk, &tdv, &opt);
        const cudaError_t e = cudaDeviceSynchronize();
        std::string why;
        if (s != SPATTN_STATUS_SUCCESS || e != cudaSuccess) {
            why = std::string("status ") + spattn_status_str(s) + ", CUDA " + cudaGetErrorString(e) + ": " + spattn_last_error();
        } else {
            Sampled so{"O", {}, {}, tol_of(dt)}, sl2{"LSE", {}, {}, kTolLse}, sdq{"dQ", {}, {}, tol_of(dt)},
                sdk{"dK", {}, {}, tol_of(dt)}, sdv{"dV", {}, {}, tol_of(dt)};
            for (auto &r : rows) {
                const RowRef &R = ref[need[r]];
                const size_t off = ((size_t)r.first * S + r.second) * D;
                auto a = fetch16(o.p, off, D, dt), b = fetch16(dq.p, off, D, dt);
                auto c = fetch32(l.p, (size_t)r.first * S + r.second, 1);
                so.got.insert(so.got.end(), a.begin(), a.end());
                so.want.insert(so.want.end(), R.o.begin(), R.o.end());
                sdq.got.insert(sdq.got.end(), b.begin(), b.end());
                sdq.want.insert(sdq.want.end(), R.dq.begin(), R.dq.end());
                sl2.got.push_back(c[0]);
                sl2.want.push_back(R.lse);
            }
            for (size_t x = 0; x < keys.size(); x++) {
                const size_t off = ((size_t)keys[x].first * S + keys[x].second) * D;
                auto a = fetch16(dk.p, off, D, dt), b = fetch16(dv.p, off, D, dt);
                sdk.got.insert(sdk.got.end(), a.begin(), a.end());
                sdk.want.insert(sdk.want.end(), rdk[x].begin(), rdk[x].end());
                sdv.got.insert(sdv.got.end(), b.begin(), b.end());
                sdv.want.insert(sdv.want.end(), rdv[x].begin(), rdv[x].end());
            }
            why = eco({so, sl2, sdq, sdk, sdv});
        }
        char full[300];
        snprintf(full, sizeof full, "%s det%d: fwd+bwd on %zu sampled rows and %zu sampled keys vs fp64", name, det,
                 rows.size(), keys.size());
        report(why.empty(), full, why);
    }
}

static void check_large_sfa() {
    const int dt = SPATTN_DTYPE_F16;
    const int64_t S = g_quick ? 4096 : (1ll << 19), N1 = 16, D = 512, Dr = 64, K = 64, DQK = D + Dr;
    const size_t nq = (size_t)S * N1 * D, nqr = (size_t)S * N1 * Dr, nk = (size_t)S * D, nkr = (size_t)S * Dr;
    char name[200];
    snprintf(name, sizeof name, "large sfa S1 = S2 = %lld N1 %lld D %lld+%lld K %lld causal fp16 (%zu elements in q)",
             (long long)S, (long long)N1, (long long)D, (long long)Dr, (long long)K, nq);
    DBuf q(nq * 2), qr(nqr * 2), k(nk * 2), kr(nkr * 2), dout(nq * 2), o(nq * 2), l((size_t)S * N1 * 4),
        ix((size_t)S * K * 4), dq(nq * 2), dqr(nqr * 2), dk(nk * 2), dkr(nkr * 2);
    fill16(q.p, nq, 41, dt);
    fill16(qr.p, nqr, 42, dt);
    fill16(k.p, nk, 43, dt);
    fill16(kr.p, nkr, 44, dt);
    fill16(dout.p, nq, 45, dt);
    sidx_kernel<<<4096, 256>>>(static_cast<int32_t *>(ix.p), S, (int)K);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const int64_t sq[4] = {1, S, N1, D}, sqr[4] = {1, S, N1, Dr}, sk[4] = {1, S, 1, D}, skr[4] = {1, S, 1, Dr},
                  si[4] = {1, S, 1, K}, sl[3] = {1, S, N1};
    spattn_tensor tq = mk(q.p, dt, 4, sq, true), tqr = mk(qr.p, dt, 4, sqr, true), tk = mk(k.p, dt, 4, sk, true),
                  tkr = mk(kr.p, dt, 4, skr, true), td = mk(dout.p, dt, 4, sq, true), to = mk(o.p, dt, 4, sq, true),
                  tl = mk(l.p, SPATTN_DTYPE_F32, 3, sl, true), ti = mk(ix.p, SPATTN_DTYPE_I32, 4, si, true),
                  tdq = mk(dq.p, dt, 4, sq, true), tdqr = mk(dqr.p, dt, 4, sqr, true), tdk = mk(dk.p, dt, 4, sk, true),
                  tdkr = mk(dkr.p, dt, 4, skr, true);
    std::vector<int64_t> toks, keys;
    for (int64_t i : {(int64_t)0, (int64_t)1, (int64_t)63, (int64_t)64, (int64_t)100000, S / 2, S - 2, S - 1})
        if (i < S) toks.push_back(i);
    for (int64_t j : {(int64_t)5, (int64_t)777, (int64_t)100001, S / 2 + 1, S - 3, S - 1})
        if (j < S) keys.push_back(j);
    // tokens the reference needs: the sampled ones and every token selecting a sampled key (within
    // its causal limit)
    std::map<int64_t, int64_t> need;
    for (int64_t i : toks) need.emplace(i, 0);
    {
        std::vector<std::vector<int64_t>> part(64);
        parallel_for(64, [&](int64_t c) {
            for (int64_t i = c * ((S + 63) / 64); i < std::min(S, (c + 1) * ((S + 63) / 64)); i++)
                for (int e = 0; e < K; e++) {
                    const int32_t j = sidx(i, e, (int)K, S);
                    if (j >= 0 && j <= i && std::find(keys.begin(), keys.end(), (int64_t)j) != keys.end()) {
                        part[c].push_back(i);
                        break;
                    }
                }
        });
        for (auto &p : part)
            for (int64_t i : p) need.emplace(i, 0);
    }
    std::vector<int64_t> list;
    for (auto &e : need) {
        e.second = (int64_t)list.size();
        list.push_back(e.first);
    }
    struct TokRef {
        std::vector<double> lse, o, dq;  // [N1], [N1 * D], [N1 * DQK]
        std::vector<int32_t> kj;         // the entries' keys (valid ones, duplicates kept)
        std::vector<double> p, ds;       // [N1 * entries]
    };
    std::vector<TokRef> ref(list.size());
    const double scale = 1.0 / sqrt((double)DQK);
    parallel_for((int64_t)list.size(), [&](int64_t t) {
        const int64_t i = list[t];
        TokRef &R = ref[t];
        for (int e = 0; e < K; e++) {
            const int32_t j = sidx(i, e, (int)K, S);
            if (j >= 0 && j <= i) R.kj.push_back(j);
        }
        const size_t ne = R.kj.size();
        std::vector<double> kv(ne * DQK);
        for (size_t a = 0; a < ne; a++)
            for (int64_t d = 0; d < DQK; d++)
                kv[a * DQK + d] = d < D ? hin(43, (size_t)R.kj[a] * D + d, dt) : hin(44, (size_t)R.kj[a] * Dr + d - D, dt);
        R.lse.assign(N1, -INFINITY);
        R.o.assign(N1 * D, 0);
        R.dq.assign(N1 * DQK, 0);
        R.p.assign(N1 * ne, 0);
        R.ds.assign(N1 * ne, 0);
        std::vector<double> qv(DQK), dov(D), s(ne);
        for (int64_t h = 0; h < N1; h++) {
            for (int64_t d = 0; d < DQK; d++)
                qv[d] = d < D ? hin(41, ((size_t)i * N1 + h) * D + d, dt) : hin(42, ((size_t)i * N1 + h) * Dr + d - D, dt);
            for (int64_t d = 0; d < D; d++) dov[d] = hin(45, ((size_t)i * N1 + h) * D + d, dt);
            if (!ne) continue;
            double mx = -INFINITY;
            for (size_t a = 0; a < ne; a++) {
                double acc = 0;
                for (int64_t d = 0; d < DQK; d++) acc += qv[d] * kv[a * DQK + d];
                s[a] = acc * scale;
                mx = std::max(mx, s[a]);
            }
            double sum = 0;
            for (size_t a = 0; a < ne; a++) sum += exp(s[a] - mx);
            const double lse = mx + log(sum);
            R.lse[h] = lse;
            double *O = &R.o[h * D];
            for (size_t a = 0; a < ne; a++) {
                const double p = exp(s[a] - lse);
                R.p[h * ne + a] = p;
                for (int64_t d = 0; d < D; d++) O[d] += p * kv[a * DQK + d];
            }
            double delta = 0;
            for (int64_t d = 0; d < D; d++) delta += dov[d] * O[d];
            for (size_t a = 0; a < ne; a++) {
                double dp = 0;
                for (int64_t d = 0; d < D; d++) dp += dov[d] * kv[a * DQK + d];
                const double ds = R.p[h * ne + a] * (dp - delta);
                R.ds[h * ne + a] = ds;
                for (int64_t d = 0; d < DQK; d++) R.dq[h * DQK + d] += scale * ds * kv[a * DQK + d];
            }
        }
    });
    std::vector<std::vector<double>> rdk(keys.size(), std::vector<double>(DQK, 0));
    for (size_t t = 0; t < list.size(); t++) {
        const int64_t i = list[t];
        const TokRef &R = ref[t];
        const size_t ne = R.kj.size();
        for (size_t x = 0; x < keys.size(); x++)
            for (size_t a = 0; a < ne; a++) {
                if (R.kj[a] != keys[x]) continue;
                for (int64_t h = 0; h < N1; h++) {
                    const double p = R.p[h * ne + a], ds = R.ds[h * ne + a];
                    for (int64_t d = 0; d < DQK; d++) {
                        const double qd = d < D ? hin(41, ((size_t)i * N1 + h) * D + d, dt) : hin(42, ((size_t)i * N1 + h) * Dr + d - D, dt);
                        rdk[x][d] += scale * ds * qd;
                        if (d < D) rdk[x][d] += p * hin(45, ((size_t)i * N1 + h) * D + d, dt);  // shared k/v: dV into dK
                    }
                }
            }
    }
    for (int det = 1; det >= 0; det--) {
        spattn_options opt;
        spattn_options_init(&opt);
        opt.deterministic = det;
        o.poison();
        l.poison();
        dq.poison();
        dqr.poison();
        dk.poison();
        dkr.poison();
        spattn_status s = spattn_sfa_fwd_ex(&tq, &tqr, &tk, &tkr, NULL, &ti, 1, SPATTN_SFA_MODE_CAUSAL, 0.0, &to, &tl, &opt);
        if (s == SPATTN_STATUS_SUCCESS)
            s = spattn_sfa_bwd_ex(&tq, &tqr, &tk, &tkr, NULL, &to, &td, &tl, &ti, 1, SPATTN_SFA_MODE_CAUSAL, 0.0, &tdq,
                                  &tdqr, &tdk, &tdkr, NULL, &opt);
        const cudaError_t e = cudaDeviceSynchronize();
        std::string why;
        if (s != SPATTN_STATUS_SUCCESS || e != cudaSuccess) {
            why = std::string("status ") + spattn_status_str(s) + ", CUDA " + cudaGetErrorString(e) + ": " + spattn_last_error();
        } else {
            Sampled so{"O", {}, {}, tol_of(dt)}, sl2{"LSE", {}, {}, kTolLse}, sdq{"dQ", {}, {}, tol_of(dt)},
                sdqr{"dQ_rope", {}, {}, tol_of(dt)}, sdk{"dK", {}, {}, tol_of(dt)}, sdkr{"dK_rope", {}, {}, tol_of(dt)};
            for (int64_t i : toks) {
                const TokRef &R = ref[need[i]];
                auto a = fetch16(o.p, (size_t)i * N1 * D, N1 * D, dt), b = fetch16(dq.p, (size_t)i * N1 * D, N1 * D, dt),
                     c = fetch16(dqr.p, (size_t)i * N1 * Dr, N1 * Dr, dt), ls = fetch32(l.p, (size_t)i * N1, N1);
                so.got.insert(so.got.end(), a.begin(), a.end());
                so.want.insert(so.want.end(), R.o.begin(), R.o.end());
                sl2.got.insert(sl2.got.end(), ls.begin(), ls.end());
                sl2.want.insert(sl2.want.end(), R.lse.begin(), R.lse.end());
                for (int64_t h = 0; h < N1; h++)
                    for (int64_t d = 0; d < DQK; d++) {
                        if (d < D) sdq.got.push_back(b[h * D + d]), sdq.want.push_back(R.dq[h * DQK + d]);
                        else sdqr.got.push_back(c[h * Dr + d - D]), sdqr.want.push_back(R.dq[h * DQK + d]);
                    }
            }
            for (size_t x = 0; x < keys.size(); x++) {
                auto a = fetch16(dk.p, (size_t)keys[x] * D, D, dt), b = fetch16(dkr.p, (size_t)keys[x] * Dr, Dr, dt);
                sdk.got.insert(sdk.got.end(), a.begin(), a.end());
                sdk.want.insert(sdk.want.end(), rdk[x].begin(), rdk[x].begin() + D);
                sdkr.got.insert(sdkr.got.end(), b.begin(), b.end());
                sdkr.want.insert(sdkr.want.end(), rdk[x].begin() + D, rdk[x].end());
            }
            why = eco({so, sl2, sdq, sdqr, sdk, sdkr});
        }
        char full[320];
        snprintf(full, sizeof full, "%s det%d: fwd+bwd on %zu sampled tokens (all heads) and %zu sampled keys vs fp64",
                 name, det, toks.size(), keys.size());
        report(why.empty(), full, why);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "selftest")) {  // the harness of check 5 on the CPU (no GPU needed)
        g_selftest = g_quick = true;
        check_nonfinite_bsa(64, SPATTN_DTYPE_F16, {1});
        check_nonfinite_bsa(128, SPATTN_DTYPE_BF16, {0});
        SfaNf a;
        check_nonfinite_sfa(a, {1});
        SfaNf b;
        b.N1 = 4, b.N2 = 2, b.S2 = 256, b.D = 64, b.Dr = 0, b.K = 64, b.shared = false, b.dt = SPATTN_DTYPE_BF16;
        check_nonfinite_sfa(b, {0});
        printf("robust_cuda_check selftest: %d passed, %d failed\n", g_pass, g_fail);
        return g_fail ? 1 : 0;
    }
    if (!spattn_cuda_available()) {
        printf("robust_cuda_check: no CUDA device visible: skipped\n");
        return 0;
    }
    g_quick = argc > 1 && !strcmp(argv[1], "quick");
    Bsa bsa;
    run_all(bsa, "bsa");
    Sfa sfa;
    run_all(sfa, "sfa");
    check_absurd(bsa, reference_bits(bsa), sfa, reference_bits(sfa));
    const int F16 = SPATTN_DTYPE_F16, BF = SPATTN_DTYPE_BF16;
    if (g_quick) {
        check_nonfinite_bsa(64, F16, {1});
        check_nonfinite_bsa(128, BF, {0});
        SfaNf a;
        a.dt = F16;
        check_nonfinite_sfa(a, {1});
        SfaNf b;
        b.N1 = 4, b.N2 = 2, b.S2 = 256, b.D = 64, b.Dr = 0, b.K = 64, b.shared = false, b.dt = BF;
        check_nonfinite_sfa(b, {0});
    } else {
        for (int D : {64, 128})
            for (int dt : {F16, BF}) check_nonfinite_bsa(D, dt, {1, 0});
        for (int dt : {F16, BF}) {
            SfaNf a;  // key-major backward (sfa_bwd_small.cu), keys-as-rows forward
            a.dt = dt;
            check_nonfinite_sfa(a, {1, 0});
            SfaNf b = a;  // sparse selections: token-major sfa_bwd90.cu at H <= 32
            b.S2 = 2048;
            check_nonfinite_sfa(b, {1, 0});
            SfaNf c = a;  // more than 32 heads per key head: sfa_fwd.cu, sfa_bwd90.cu
            c.N1 = 64;
            check_nonfinite_sfa(c, {1, 0});
            SfaNf d;  // simple kernels (separate v, D 64, no rope, GQA): fixed point with flags / fp32 atomics
            d.N1 = 4, d.N2 = 2, d.S2 = 256, d.D = 64, d.Dr = 0, d.K = 64, d.shared = false, d.dt = dt;
            check_nonfinite_sfa(d, {1, 0});
            SfaNf e = d;  // the small-head forward's Nsa shape (D 128, no rope, separate v)
            e.D = 128;
            check_nonfinite_sfa(e, {1, 0});
            SfaNf f = e;  // the same with 16 heads per key head, every group on the group form
            f.N1 = 32;
            setenv("SPATTN_SFA_GROUP", "1", 1);
            check_nonfinite_sfa(f, {1, 0});
            SfaNf g = e;  // 32 heads per key head and a shared v: groups of 4 tokens
            g.N1 = 64, g.shared = true;
            check_nonfinite_sfa(g, {1, 0});
            unsetenv("SPATTN_SFA_GROUP");
        }
    }
    check_large_bsa();
    check_large_sfa();
    printf("robust_cuda_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

// GPU correctness check of the block-sparse attention CUDA backend (run on a machine with a
// GPU; reports "skipped" and exits 0 when none is visible).  Random small shapes against an
// fp64 host reference written here from cases/README.md: odd bx/by, partial edge blocks,
// Sq != Skv, GQA, empty rows (and a fully empty mask), D 64/128 (fast) and 40/96/192 (padded or
// simple path), fp16/bf16/fp32, strided (non-contiguous) q/o views, caller workspace and
// stream, bitwise determinism of the backward (20 runs per shape).  Outputs are poisoned (NaN) before each run.
// Also checks the CUDA reference kernels (the golden of `spattn verify --backend cuda`).
// Usage: bsa_cuda_check [quick]   ("quick": a few small cases, for compute-sanitizer)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "core/internal.h"
#include "check_util.h"
#include "spattn.h"


static int g_pass = 0, g_fail = 0;
static uint64_t g_rng = 0x1234567ull;
static double urand() {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}
static double nrand() {
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}


struct Shape {
    int B, N, Nkv, Sq, Skv, D, bx, by, dt;
    double density;
    int empty_rows;  // zero some whole block rows of the mask
    int strided;     // q and o as views into wider buffers (row stride D + 8 .. or D * 2)
    int use_ws;      // pass the exact workspace
    int global;      // block column 0 attended by every row: a key tile whose list is far longer
                     // than its neighbours', split over several CTAs by the backward
};

// fp64 reference, straight from cases/README.md.
static void ref(const Shape &s, const std::vector<double> &q, const std::vector<double> &k,
                const std::vector<double> &v, const std::vector<uint8_t> &mask, const std::vector<double> &dout,
                double scale, std::vector<double> &o, std::vector<double> &lse, std::vector<double> &dq,
                std::vector<double> &dk, std::vector<double> &dv) {
    const int G = s.N / s.Nkv, nbx = (s.Sq + s.bx - 1) / s.bx, nby = (s.Skv + s.by - 1) / s.by, D = s.D;
    o.assign((size_t)s.B * s.N * s.Sq * D, 0);
    lse.assign((size_t)s.B * s.N * s.Sq, -INFINITY);
    dq.assign(o.size(), 0);
    dk.assign((size_t)s.B * s.Nkv * s.Skv * D, 0);
    dv.assign(dk.size(), 0);
    std::vector<double> p(s.Skv), dp(s.Skv);
    for (int b = 0; b < s.B; b++)
        for (int n = 0; n < s.N; n++) {
            const int hk = n / G;
            for (int i = 0; i < s.Sq; i++) {
                const double *qi = &q[(((size_t)b * s.N + n) * s.Sq + i) * D];
                const double *gi = &dout[(((size_t)b * s.N + n) * s.Sq + i) * D];
                double mx = -INFINITY;
                for (int j = 0; j < s.Skv; j++) {
                    p[j] = -INFINITY;
                    if (!mask[(((size_t)b * s.N + n) * nbx + i / s.bx) * nby + j / s.by]) continue;
                    const double *kj = &k[(((size_t)b * s.Nkv + hk) * s.Skv + j) * D];
                    double acc = 0;
                    for (int d = 0; d < D; d++) acc += qi[d] * kj[d];
                    p[j] = acc * scale;
                    if (p[j] > mx) mx = p[j];
                }
                if (mx == -INFINITY) continue;
                double l = 0;
                for (int j = 0; j < s.Skv; j++) l += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
                const double L = mx + log(l);
                lse[((size_t)b * s.N + n) * s.Sq + i] = L;
                double *oi = &o[(((size_t)b * s.N + n) * s.Sq + i) * D];
                for (int j = 0; j < s.Skv; j++) {
                    p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - L);
                    if (p[j] == 0) continue;
                    const double *vj = &v[(((size_t)b * s.Nkv + hk) * s.Skv + j) * D];
                    for (int d = 0; d < D; d++) oi[d] += p[j] * vj[d];
                }
                double delta = 0;
                for (int d = 0; d < D; d++) delta += gi[d] * oi[d];
                for (int j = 0; j < s.Skv; j++) {
                    if (p[j] == 0) continue;
                    const double *vj = &v[(((size_t)b * s.Nkv + hk) * s.Skv + j) * D];
                    const double *kj = &k[(((size_t)b * s.Nkv + hk) * s.Skv + j) * D];
                    double a = 0;
                    for (int d = 0; d < D; d++) a += gi[d] * vj[d];
                    const double ds = p[j] * (a - delta);
                    double *dqi = &dq[(((size_t)b * s.N + n) * s.Sq + i) * D];
                    double *dkj = &dk[(((size_t)b * s.Nkv + hk) * s.Skv + j) * D];
                    double *dvj = &dv[(((size_t)b * s.Nkv + hk) * s.Skv + j) * D];
                    for (int d = 0; d < D; d++) {
                        dqi[d] += scale * ds * kj[d];
                        dkj[d] += scale * ds * qi[d];
                        dvj[d] += p[j] * gi[d];
                    }
                }
            }
        }
}

// eco criterion: |a - g| <= atol + rtol |g| on >= 99%, max error within the limit, NaN/Inf rules.
static bool eco(const char *what, const std::vector<float> &a, const std::vector<double> &g, int dt, bool is_lse,
                const char *tag) {
    const EcoTol tol = eco_tol(dt, is_lse);
    const double atol = tol.atol, rtol = tol.rtol, lim = tol.lim;
    size_t ok = 0, bad_special = 0;
    double maxe = 0, num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        const double x = a[i], y = g[i];
        if (isinf(y) || isnan(y) || isinf(x) || isnan(x)) {
            if ((isinf(y) && x == y) || (isnan(y) && isnan(x))) ok++;
            else bad_special++;
            continue;
        }
        const double e = fabs(x - y);
        if (e <= atol + rtol * fabs(y)) ok++;
        if (e > maxe) maxe = e;
        num += e * e;
        den += y * y;
    }
    const double ratio = a.empty() ? 1 : (double)ok / a.size();
    const bool pass = ratio >= 0.99 && maxe <= lim && bad_special == 0;
    if (!pass)
        printf("  FAIL %s %s: matched %.5f max_abs %.3g rel_l2 %.3g special_mismatch %zu\n", tag, what, ratio, maxe,
               den > 0 ? sqrt(num / den) : 0.0, bad_special);
    pass ? g_pass++ : g_fail++;
    return pass;
}

static spattn_tensor dev_tensor(void *p, int dt, int ndim, const int64_t *shape, const int64_t *strides) {
    spattn_tensor t = spattn_tensor_make(p, (spattn_dtype)dt, ndim, shape, strides);
    t.device_type = SPATTN_DEVICE_CUDA;
    t.device_id = 0;
    return t;
}

static void run_shape(const Shape &s, bool check_ref_kernels) {
    char tag[200];
    snprintf(tag, sizeof tag, "B%d N%d Nkv%d Sq%d Skv%d D%d bx%d by%d %s dens%.2f%s%s%s%s", s.B, s.N, s.Nkv, s.Sq, s.Skv,
             s.D, s.bx, s.by, spattn_dtype_name((spattn_dtype)s.dt), s.density, s.empty_rows ? " empty-rows" : "",
             s.strided ? " strided" : "", s.use_ws ? " ws" : "", s.global ? " global-column" : "");
    const int dt = s.dt, D = s.D, nbx = (s.Sq + s.bx - 1) / s.bx, nby = (s.Skv + s.by - 1) / s.by;
    const size_t nq = (size_t)s.B * s.N * s.Sq * D, nk = (size_t)s.B * s.Nkv * s.Skv * D, nrow = (size_t)s.B * s.N * s.Sq;
    std::vector<double> q(nq), k(nk), v(nk), dout(nq);
    for (auto &x : q) x = round_dt(nrand(), dt);
    for (auto &x : k) x = round_dt(nrand(), dt);
    for (auto &x : v) x = round_dt(nrand(), dt);
    for (auto &x : dout) x = round_dt(nrand(), dt);
    std::vector<uint8_t> mask((size_t)s.B * s.N * nbx * nby);
    for (auto &m : mask) m = urand() < s.density;
    if (s.global)
        for (size_t r = 0; r < (size_t)s.B * s.N * nbx; r++) mask[r * nby] = 1;
    if (s.empty_rows)
        for (int bn = 0; bn < s.B * s.N; bn++)
            for (int r = 0; r < nbx; r += 3)
                for (int c = 0; c < nby; c++) mask[((size_t)bn * nbx + r) * nby + c] = 0;
    const double scale = 1.0 / sqrt((double)D);
    std::vector<double> ro, rl, rdq, rdk, rdv;
    ref(s, q, k, v, mask, dout, scale, ro, rl, rdq, rdk, rdv);

    // host buffers in dtype; q and o may be strided views (row stride qs2)
    const int64_t qs2 = s.strided ? D + 8 : D;
    const size_t nq_alloc = (size_t)s.B * s.N * s.Sq * qs2;
    std::vector<char> hq(nq_alloc * esz(dt), 0), hk(nk * esz(dt)), hv(nk * esz(dt)), hd(nq * esz(dt));
    for (size_t r = 0; r < nrow; r++)
        for (int d = 0; d < D; d++) store_dt(hq.data(), r * qs2 + d, (float)q[r * D + d], dt);
    for (size_t i = 0; i < nk; i++) store_dt(hk.data(), i, (float)k[i], dt), store_dt(hv.data(), i, (float)v[i], dt);
    for (size_t i = 0; i < nq; i++) store_dt(hd.data(), i, (float)dout[i], dt);

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *dq_, *dk_, *dv_, *dd_, *dm_, *o_, *l_, *gq_, *gk_, *gv_;
    CK(cudaMalloc(&dq_, hq.size()));
    CK(cudaMalloc(&dk_, hk.size()));
    CK(cudaMalloc(&dv_, hv.size()));
    CK(cudaMalloc(&dd_, hd.size()));
    CK(cudaMalloc(&dm_, mask.size()));
    CK(cudaMalloc(&o_, nq_alloc * esz(dt)));
    CK(cudaMalloc(&l_, nrow * 4));
    CK(cudaMalloc(&gq_, nq * esz(dt)));
    CK(cudaMalloc(&gk_, nk * esz(dt)));
    CK(cudaMalloc(&gv_, nk * esz(dt)));
    CK(cudaMemcpy(dq_, hq.data(), hq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk_, hk.data(), hk.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv_, hv.data(), hv.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dd_, hd.data(), hd.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dm_, mask.data(), mask.size(), cudaMemcpyHostToDevice));
    // poison outputs with NaN bytes
    CK(cudaMemset(o_, 0xff, nq_alloc * esz(dt)));
    CK(cudaMemset(l_, 0xff, nrow * 4));
    CK(cudaMemset(gq_, 0xff, nq * esz(dt)));
    CK(cudaMemset(gk_, 0xff, nk * esz(dt)));
    CK(cudaMemset(gv_, 0xff, nk * esz(dt)));

    const int64_t shq[4] = {s.B, s.N, s.Sq, D}, shk[4] = {s.B, s.Nkv, s.Skv, D}, shm[4] = {s.B, s.N, nbx, nby},
                  shl[3] = {s.B, s.N, s.Sq};
    const int64_t stq[4] = {(int64_t)s.N * s.Sq * qs2, (int64_t)s.Sq * qs2, qs2, 1};
    spattn_tensor tq = dev_tensor(dq_, dt, 4, shq, stq), tk = dev_tensor(dk_, dt, 4, shk, NULL),
                  tv = dev_tensor(dv_, dt, 4, shk, NULL), tdo = dev_tensor(dd_, dt, 4, shq, NULL),
                  tm = dev_tensor(dm_, SPATTN_DTYPE_U8, 4, shm, NULL), to = dev_tensor(o_, dt, 4, shq, stq),
                  tl = dev_tensor(l_, SPATTN_DTYPE_F32, 3, shl, NULL), tgq = dev_tensor(gq_, dt, 4, shq, NULL),
                  tgk = dev_tensor(gk_, dt, 4, shk, NULL), tgv = dev_tensor(gv_, dt, 4, shk, NULL);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.cuda_stream = st;
    void *ws = NULL;
    size_t wsz = 0;
    if (s.use_ws) {
        size_t w0 = 0, w1 = 0;
        if (spattn_bsa_workspace_size(&tq, &tk, &tv, &tm, s.bx, s.by, 0, &opt, &w0) ||
            spattn_bsa_workspace_size(&tq, &tk, &tv, &tm, s.bx, s.by, 1, &opt, &w1)) {
            printf("  FAIL %s workspace_size: %s\n", tag, spattn_last_error());
            g_fail++;
        }
        wsz = w0 > w1 ? w0 : w1;
        if (wsz) CK(cudaMalloc(&ws, wsz));
        opt.workspace = ws;
        opt.workspace_size = wsz;
    }
    spattn_status st1 = spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, s.bx, s.by, 0.0, &to, &tl, &opt);
    CK(cudaStreamSynchronize(st));
    if (st1 != SPATTN_STATUS_SUCCESS) {
        printf("  FAIL %s fwd status %d: %s\n", tag, st1, spattn_last_error());
        g_fail++;
    } else {
        std::vector<char> ho(nq_alloc * esz(dt));
        std::vector<float> hl(nrow), o32(nq), l32(nrow);
        CK(cudaMemcpy(ho.data(), o_, ho.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hl.data(), l_, nrow * 4, cudaMemcpyDeviceToHost));
        for (size_t r = 0; r < nrow; r++)
            for (int d = 0; d < D; d++) o32[r * D + d] = load_dt(ho.data(), r * qs2 + d, dt);
        bool pad_ok = true;  // bytes between strided rows must stay untouched (poison)
        if (s.strided)
            for (size_t r = 0; r < nrow && pad_ok; r++)
                for (int d = D; d < qs2; d++)
                    if (!isnan(load_dt(ho.data(), r * qs2 + d, dt))) pad_ok = false;
        if (!pad_ok) printf("  FAIL %s fwd wrote outside the o view\n", tag);
        pad_ok ? g_pass++ : g_fail++;
        eco("O", o32, ro, dt, false, tag);
        eco("LSE", hl, rl, dt, true, tag);
    }
    // backward from the reference O / LSE (as a caller passes the forward's outputs)
    {
        std::vector<char> ho(nq_alloc * esz(dt), 0);
        std::vector<float> hl(nrow);
        for (size_t r = 0; r < nrow; r++) {
            for (int d = 0; d < D; d++) store_dt(ho.data(), r * qs2 + d, (float)ro[r * D + d], dt);
            hl[r] = (float)rl[r];
        }
        CK(cudaMemcpy(o_, ho.data(), ho.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(l_, hl.data(), nrow * 4, cudaMemcpyHostToDevice));
    }
    // the gradients back to the host (raw bytes), eco of all three against the fp64 reference, and a
    // backward into outputs poisoned first
    const auto grads = [&](std::vector<char> &a, std::vector<char> &bk, std::vector<char> &bv) {
        a.resize(nq * esz(dt));
        bk.resize(nk * esz(dt));
        bv.resize(nk * esz(dt));
        CK(cudaMemcpy(a.data(), gq_, a.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(bk.data(), gk_, bk.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(bv.data(), gv_, bv.size(), cudaMemcpyDeviceToHost));
    };
    const auto eco3 = [&](const std::vector<char> &a, const std::vector<char> &bk, const std::vector<char> &bv,
                          const char *t) {
        std::vector<float> f(nq), fk(nk), fv(nk);
        for (size_t i = 0; i < nq; i++) f[i] = load_dt(a.data(), i, dt);
        for (size_t i = 0; i < nk; i++) fk[i] = load_dt(bk.data(), i, dt), fv[i] = load_dt(bv.data(), i, dt);
        eco("dQ", f, rdq, dt, false, t);
        eco("dK", fk, rdk, dt, false, t);
        eco("dV", fv, rdv, dt, false, t);
    };
    const auto poisoned_bwd = [&]() {
        CK(cudaMemset(gq_, 0xff, nq * esz(dt)));
        CK(cudaMemset(gk_, 0xff, nk * esz(dt)));
        CK(cudaMemset(gv_, 0xff, nk * esz(dt)));
        const spattn_status r =
            spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, s.bx, s.by, 0.0, &tgq, &tgk, &tgv, &opt);
        CK(cudaStreamSynchronize(st));
        return r;
    };
    spattn_status st2 = spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, s.bx, s.by, 0.0, &tgq, &tgk, &tgv, &opt);
    CK(cudaStreamSynchronize(st));
    if (st2 != SPATTN_STATUS_SUCCESS) {
        printf("  FAIL %s bwd status %d: %s\n", tag, st2, spattn_last_error());
        g_fail++;
    } else {
        std::vector<char> a, bk, bv, a2, bk2, bv2;
        grads(a, bk, bv);
        eco3(a, bk, bv, tag);
        // determinism: 19 more backwards (poisoned in between) are bitwise identical to the first
        // (the dQ adds of the Hopper backward are ordered by semaphores; a wrong order shows here)
        bool det = true;
        for (int rep = 0; rep < 19 && det; rep++) {
            poisoned_bwd();
            grads(a2, bk2, bv2);
            det = a == a2 && bk == bk2 && bv == bv2;
        }
        if (!det) printf("  FAIL %s backward not bitwise deterministic over 20 runs\n", tag);
        det ? g_pass++ : g_fail++;
        // the non-deterministic mode (any dQ order, heaviest rows launched first): eco
        const int32_t det0 = opt.deterministic;
        opt.deterministic = 0;
        {
            const spattn_status sn = poisoned_bwd();
            char tn[260];
            snprintf(tn, sizeof tn, "[non-det] %s", tag);
            if (sn != SPATTN_STATUS_SUCCESS) {
                printf("  FAIL %s bwd status %d: %s\n", tn, sn, spattn_last_error());
                g_fail++;
            } else {
                grads(a2, bk2, bv2);
                eco3(a2, bk2, bv2, tn);
            }
        }
        opt.deterministic = det0;
    }
    if (check_ref_kernels) {  // the golden of `spattn verify --backend cuda` against fp64
        spattn_bsa_problem p = {};
        p.q = &tq; p.k = &tk; p.v = &tv; p.mask = &tm; p.dout = &tdo;
        p.B = s.B; p.N = s.N; p.Nkv = s.Nkv; p.Sq = s.Sq; p.Skv = s.Skv; p.D = D;
        p.bx = s.bx; p.by = s.by; p.nbx = nbx; p.nby = nby; p.scale = (float)scale; p.dtype = dt;
        spattn_exec ex = {};
        ex.stream = st;
        float *fo, *fl, *fq, *fk, *fv;
        CK(cudaMalloc(&fo, nq * 4)); CK(cudaMalloc(&fl, nrow * 4)); CK(cudaMalloc(&fq, nq * 4));
        CK(cudaMalloc(&fk, nk * 4)); CK(cudaMalloc(&fv, nk * 4));
        if (spattn_cuda_ref_bsa_fwd(&p, &ex, fo, fl) || spattn_cuda_ref_bsa_bwd(&p, &ex, fq, fk, fv)) {
            printf("  FAIL %s ref kernels: %s\n", tag, spattn_last_error());
            g_fail++;
        } else {
            std::vector<float> a(nq), l(nrow), b1(nq), b2(nk), b3(nk);
            CK(cudaMemcpy(a.data(), fo, nq * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(l.data(), fl, nrow * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b1.data(), fq, nq * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b2.data(), fk, nk * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b3.data(), fv, nk * 4, cudaMemcpyDeviceToHost));
            char t2[240];
            snprintf(t2, sizeof t2, "[ref kernels] %s", tag);
            eco("O", a, ro, SPATTN_DTYPE_F32, false, t2);
            eco("LSE", l, rl, SPATTN_DTYPE_F32, true, t2);
            eco("dQ", b1, rdq, SPATTN_DTYPE_F32, false, t2);
            eco("dK", b2, rdk, SPATTN_DTYPE_F32, false, t2);
            eco("dV", b3, rdv, SPATTN_DTYPE_F32, false, t2);
        }
        cudaFree(fo); cudaFree(fl); cudaFree(fq); cudaFree(fk); cudaFree(fv);
    }
    cudaFree(dq_); cudaFree(dk_); cudaFree(dv_); cudaFree(dd_); cudaFree(dm_); cudaFree(o_); cudaFree(l_);
    cudaFree(gq_); cudaFree(gk_); cudaFree(gv_);
    if (ws) cudaFree(ws);
    cudaStreamDestroy(st);
    printf("%s %s\n", g_fail ? "..." : "ok ", tag);
    fflush(stdout);
}

// A plan reused by forward + backward, captured with a caller workspace into a CUDA graph and
// replayed: bitwise the results of the plain calls, on every replay (poisoned in between).
static void check_plan_graph(const Shape &s) {
    char tag[160];
    snprintf(tag, sizeof tag, "plan+graph B%d N%d Nkv%d Sq%d Skv%d D%d bx%d by%d %s", s.B, s.N, s.Nkv, s.Sq, s.Skv,
             s.D, s.bx, s.by, spattn_dtype_name((spattn_dtype)s.dt));
    const int dt = s.dt, D = s.D, nbx = (s.Sq + s.bx - 1) / s.bx, nby = (s.Skv + s.by - 1) / s.by;
    const size_t nq = (size_t)s.B * s.N * s.Sq * D, nk = (size_t)s.B * s.Nkv * s.Skv * D, nrow = (size_t)s.B * s.N * s.Sq;
    const size_t bq = nq * esz(dt), bk = nk * esz(dt);
    std::vector<char> hq(bq), hk(bk), hv(bk), hd(bq);
    for (size_t i = 0; i < nq; i++) store_dt(hq.data(), i, (float)nrand(), dt), store_dt(hd.data(), i, (float)nrand(), dt);
    for (size_t i = 0; i < nk; i++) store_dt(hk.data(), i, (float)nrand(), dt), store_dt(hv.data(), i, (float)nrand(), dt);
    std::vector<uint8_t> mask((size_t)s.B * s.N * nbx * nby);
    for (auto &m : mask) m = urand() < s.density;
    void *q, *k, *v, *d, *m, *o, *l, *gq, *gk, *gv;
    CK(cudaMalloc(&q, bq)); CK(cudaMalloc(&k, bk)); CK(cudaMalloc(&v, bk)); CK(cudaMalloc(&d, bq));
    CK(cudaMalloc(&m, mask.size())); CK(cudaMalloc(&o, bq)); CK(cudaMalloc(&l, nrow * 4));
    CK(cudaMalloc(&gq, bq)); CK(cudaMalloc(&gk, bk)); CK(cudaMalloc(&gv, bk));
    CK(cudaMemcpy(q, hq.data(), bq, cudaMemcpyHostToDevice)); CK(cudaMemcpy(k, hk.data(), bk, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), bk, cudaMemcpyHostToDevice)); CK(cudaMemcpy(d, hd.data(), bq, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(m, mask.data(), mask.size(), cudaMemcpyHostToDevice));
    const int64_t shq[4] = {s.B, s.N, s.Sq, D}, shk[4] = {s.B, s.Nkv, s.Skv, D}, shm[4] = {s.B, s.N, nbx, nby},
                  shl[3] = {s.B, s.N, s.Sq};
    spattn_tensor tq = dev_tensor(q, dt, 4, shq, NULL), tk = dev_tensor(k, dt, 4, shk, NULL),
                  tv = dev_tensor(v, dt, 4, shk, NULL), tdo = dev_tensor(d, dt, 4, shq, NULL),
                  tm = dev_tensor(m, SPATTN_DTYPE_U8, 4, shm, NULL), to = dev_tensor(o, dt, 4, shq, NULL),
                  tl = dev_tensor(l, SPATTN_DTYPE_F32, 3, shl, NULL), tgq = dev_tensor(gq, dt, 4, shq, NULL),
                  tgk = dev_tensor(gk, dt, 4, shk, NULL), tgv = dev_tensor(gv, dt, 4, shk, NULL);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    spattn_options opt;
    spattn_options_init(&opt);
    opt.cuda_stream = st;
    bool ok = true;
    auto fail = [&](const char *what) {
        printf("FAIL %s: %s %s\n", tag, what, spattn_last_error());
        ok = false;
    };
    auto grab = [&](std::vector<char> &out) {
        CK(cudaStreamSynchronize(st));
        out.resize(3 * bq + 2 * bk + nrow * 4);
        char *p = out.data();
        CK(cudaMemcpy(p, o, bq, cudaMemcpyDeviceToHost)); p += bq;
        CK(cudaMemcpy(p, l, nrow * 4, cudaMemcpyDeviceToHost)); p += nrow * 4;
        CK(cudaMemcpy(p, gq, bq, cudaMemcpyDeviceToHost)); p += bq;
        CK(cudaMemcpy(p, gk, bk, cudaMemcpyDeviceToHost)); p += bk;
        CK(cudaMemcpy(p, gv, bk, cudaMemcpyDeviceToHost));
        out.resize(out.size() - bq);
    };
    auto poison = [&]() {
        CK(cudaMemsetAsync(o, 0xff, bq, st)); CK(cudaMemsetAsync(l, 0xff, nrow * 4, st));
        CK(cudaMemsetAsync(gq, 0xff, bq, st)); CK(cudaMemsetAsync(gk, 0xff, bk, st)); CK(cudaMemsetAsync(gv, 0xff, bk, st));
    };
    std::vector<char> want, got;
    if (spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, s.bx, s.by, 0.0, &to, &tl, &opt) ||
        spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, s.bx, s.by, 0.0, &tgq, &tgk, &tgv, &opt))
        fail("plain calls");
    grab(want);
    spattn_bsa_plan *plan = NULL;
    size_t w0 = 0, w1 = 0;
    void *ws = NULL;
    if (ok && spattn_bsa_plan_create(&tm, s.bx, s.by, s.Sq, s.Skv, s.Nkv, &opt, &plan)) fail("plan_create");
    CK(cudaMemsetAsync(m, 0, mask.size(), st));  // the plan holds its own copy of the mask
    if (ok && (spattn_bsa_plan_workspace_size(plan, &tq, &tk, &tv, 0, &opt, &w0) ||
               spattn_bsa_plan_workspace_size(plan, &tq, &tk, &tv, 1, &opt, &w1)))
        fail("plan_workspace_size");
    opt.workspace_size = std::max(w0, w1);
    if (opt.workspace_size) CK(cudaMalloc(&ws, opt.workspace_size));
    opt.workspace = ws;
    if (ok) {
        poison();
        if (spattn_bsa_fwd_plan(plan, &tq, &tk, &tv, 0.0, &to, &tl, &opt) ||
            spattn_bsa_bwd_plan(plan, &tq, &tk, &tv, &to, &tdo, &tl, 0.0, &tgq, &tgk, &tgv, &opt))
            fail("plan calls");
        grab(got);
        if (ok && got != want) fail("plan outputs differ from the plain calls");
    }
    if (ok) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        spattn_status s1 = spattn_bsa_fwd_plan(plan, &tq, &tk, &tv, 0.0, &to, &tl, &opt);
        spattn_status s2 = s1 ? s1 : spattn_bsa_bwd_plan(plan, &tq, &tk, &tv, &to, &tdo, &tl, 0.0, &tgq, &tgk, &tgv, &opt);
        CK(cudaStreamEndCapture(st, &g));
        if (s1 || s2) fail("calls under graph capture");
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 0; ok && rep < 3; rep++) {
            poison();
            CK(cudaGraphLaunch(ge, st));
            grab(got);
            if (got != want) fail("graph replay differs from the plain calls");
        }
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    if (ok) {
        // one plan, forwards on two streams at once (each with its own workspace and outputs):
        // the plan's row counter may serve one stream at a time (bsa_plan.h), the other stream
        // zeroes its workspace's; both must still get the plain call's bits
        cudaStream_t st2;
        CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
        void *o2, *l2, *ws2 = NULL;
        CK(cudaMalloc(&o2, bq)); CK(cudaMalloc(&l2, nrow * 4));
        if (opt.workspace_size) CK(cudaMalloc(&ws2, opt.workspace_size));
        spattn_options opt2 = opt;
        opt2.cuda_stream = st2;
        opt2.workspace = ws2;
        spattn_tensor to2 = dev_tensor(o2, dt, 4, shq, NULL), tl2 = dev_tensor(l2, SPATTN_DTYPE_F32, 3, shl, NULL);
        for (int rep = 0; ok && rep < 3; rep++) {
            poison();
            CK(cudaMemsetAsync(o2, 0xff, bq, st2)); CK(cudaMemsetAsync(l2, 0xff, nrow * 4, st2));
            for (int i = 0; ok && i < 4; i++) {
                if (spattn_bsa_fwd_plan(plan, &tq, &tk, &tv, 0.0, &to, &tl, &opt)) fail("plan forward, stream 1");
                if (i == 2) CK(cudaStreamSynchronize(st));  // stream 2 may take the plan's counter over
                if (spattn_bsa_fwd_plan(plan, &tq, &tk, &tv, 0.0, &to2, &tl2, &opt2)) fail("plan forward, stream 2");
            }
            CK(cudaStreamSynchronize(st2));
            std::vector<char> a(bq + nrow * 4), b(bq + nrow * 4);
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(a.data(), o, bq, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(a.data() + bq, l, nrow * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), o2, bq, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data() + bq, l2, nrow * 4, cudaMemcpyDeviceToHost));
            if (ok && (memcmp(a.data(), want.data(), a.size()) || memcmp(b.data(), want.data(), b.size())))
                fail("plan forwards on two streams differ from the plain call");
        }
        cudaFree(o2); cudaFree(l2);
        if (ws2) cudaFree(ws2);
        CK(cudaStreamDestroy(st2));
    }
    spattn_bsa_plan_destroy(plan);
    if (ws) cudaFree(ws);
    void *all[] = {q, k, v, d, m, o, l, gq, gk, gv};
    for (void *p : all) cudaFree(p);
    CK(cudaStreamDestroy(st));
    if (ok) {
        g_pass++;
        printf("ok  %s\n", tag);
    } else {
        g_fail++;
    }
}

// Non-finite inputs (spattn.h): forward, fp16, S = 256, D = 64, mask blocks of 128 with block
// (1, 0) off (rows 128..255 do not attend keys 0..127).  NaN in q row 5: row 5 O and LSE NaN;
// NaN in k row 7: rows 0..127 NaN, rows 128..255 finite; then NaN in v[9][2] alone: column 2 of
// rows 0..127 NaN, LSE finite, rows 128..255 finite; huge finite scores (q, k rows 200 at 6e4)
// stay finite.  (Within one 128-row query tile a non-finite v of a key that some rows mask out
// still reaches them through 0 * NaN in the tensor-core product: see spattn.h.)
static void check_nonfinite() {
    const int S = 256, D = 64, half = 128;
    const size_t n = (size_t)S * D;
    std::vector<__half> hq(n), hk(n), hv(n);
    for (size_t i = 0; i < n; i++) {
        hq[i] = __float2half((float)nrand());
        hk[i] = __float2half((float)nrand());
        hv[i] = __float2half((float)nrand());
    }
    const __half qnan = __float2half(NAN), big = __float2half(60000.f);
    hq[5 * D + 3] = qnan;
    hk[7 * D + 0] = qnan;
    hv[9 * D + 2] = qnan;
    for (int d = 0; d < D; d++) hq[200 * D + d] = big, hk[200 * D + d] = big;
    uint8_t mask[4] = {1, 1, 0, 1};
    void *q, *k, *v, *o, *l, *m;
    CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
    CK(cudaMalloc(&l, S * 4)); CK(cudaMalloc(&m, 4));
    CK(cudaMemcpy(q, hq.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(k, hk.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(m, mask, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(o, 0x55, n * 2)); CK(cudaMemset(l, 0x55, S * 4));
    const int64_t sq[4] = {1, 1, S, D}, sm[4] = {1, 1, 2, 2}, sl[3] = {1, 1, S};
    spattn_tensor tq = dev_tensor(q, SPATTN_DTYPE_F16, 4, sq, NULL), tk = dev_tensor(k, SPATTN_DTYPE_F16, 4, sq, NULL),
                  tv = dev_tensor(v, SPATTN_DTYPE_F16, 4, sq, NULL), to = dev_tensor(o, SPATTN_DTYPE_F16, 4, sq, NULL),
                  tm = dev_tensor(m, SPATTN_DTYPE_U8, 4, sm, NULL), tl = dev_tensor(l, SPATTN_DTYPE_F32, 3, sl, NULL);
    spattn_status st = spattn_bsa_fwd(&tq, &tk, &tv, &tm, half, half, 0.0, &to, &tl);
    CK(cudaDeviceSynchronize());
    std::vector<__half> ho(n);
    std::vector<float> hl(S);
    CK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), l, S * 4, cudaMemcpyDeviceToHost));
    int bad = st != SPATTN_STATUS_SUCCESS;
    for (int i = 0; i < S && !bad; i++) {
        const bool row_nan = i == 5 || i < half;  // q NaN row, or attends the NaN key 7
        if ((bool)isnan(hl[i]) != row_nan) bad = 1, printf("  nonfinite: row %d LSE %g\n", i, hl[i]);
        for (int d = 0; d < D && !bad; d++) {
            const float x = __half2float(ho[(size_t)i * D + d]);
            const bool want_nan = row_nan;  // v[9][2] NaN only reaches rows that are NaN already
            if ((bool)isnan(x) != want_nan) bad = 1, printf("  nonfinite: O[%d][%d] = %g\n", i, d, x);
        }
    }
    // v NaN alone: rows 0..127 get NaN in column 2 only, finite LSE
    hq[5 * D + 3] = __float2half(0.f);
    hk[7 * D + 0] = __float2half(0.f);
    CK(cudaMemcpy(q, hq.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(k, hk.data(), n * 2, cudaMemcpyHostToDevice));
    st = spattn_bsa_fwd(&tq, &tk, &tv, &tm, half, half, 0.0, &to, &tl);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), l, S * 4, cudaMemcpyDeviceToHost));
    bad |= st != SPATTN_STATUS_SUCCESS;
    for (int i = 0; i < S && !bad; i++) {
        if (isnan(hl[i])) bad = 1, printf("  nonfinite (v): row %d LSE NaN\n", i);
        for (int d = 0; d < D && !bad; d++) {
            const bool want_nan = i < half && d == 2;
            if ((bool)isnan(__half2float(ho[(size_t)i * D + d])) != want_nan) bad = 1, printf("  nonfinite (v): O[%d][%d]\n", i, d);
        }
    }
    void *all[] = {q, k, v, o, l, m};
    for (void *p : all) cudaFree(p);
    if (bad) {
        g_fail++;
        printf("FAIL nonfinite inputs (forward)\n");
    } else {
        g_pass++;
        printf("ok  nonfinite inputs (forward)\n");
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--probe")) return spattn_cuda_available() ? 0 : 1;
    if (!spattn_cuda_available()) {
        printf("bsa_cuda_check: no CUDA device visible: skipped\n");
        return 0;
    }
    const bool quick = argc > 1 && !strcmp(argv[1], "quick");
    const int F16 = SPATTN_DTYPE_F16, BF = SPATTN_DTYPE_BF16, F32 = SPATTN_DTYPE_F32;
    std::vector<Shape> v;
    //            B  N Nkv  Sq  Skv   D  bx  by  dt  dens  empty strided ws
    v.push_back({1, 2, 1, 200, 136, 64, 48, 80, F16, 0.6, 1, 0, 0});
    v.push_back({1, 2, 2, 77, 100, 128, 16, 16, BF, 0.4, 0, 1, 1});
    if (!quick) {
        v.push_back({2, 4, 2, 256, 256, 128, 64, 64, F16, 0.5, 1, 0, 0});
        v.push_back({1, 4, 1, 300, 500, 128, 128, 16, F16, 0.3, 0, 0, 1});
        v.push_back({1, 2, 1, 513, 257, 64, 32, 48, BF, 0.7, 1, 1, 0});
        v.push_back({2, 3, 3, 190, 190, 128, 1000, 7, F16, 0.5, 0, 0, 0});
        v.push_back({1, 4, 2, 129, 65, 64, 5, 200, BF, 0.8, 0, 0, 0});
        v.push_back({1, 2, 1, 384, 384, 128, 128, 128, F16, 1.0, 0, 0, 0});
        v.push_back({1, 2, 1, 160, 96, 128, 80, 48, F16, 0.0, 0, 0, 1});  // empty mask
        v.push_back({1, 2, 2, 100, 120, 40, 16, 32, F16, 0.5, 1, 0, 0});   // D 40 -> padded 64
        v.push_back({1, 2, 1, 100, 120, 96, 24, 40, BF, 0.6, 0, 1, 0});    // D 96 -> padded 128
        v.push_back({1, 2, 1, 70, 90, 192, 16, 16, F16, 0.6, 1, 0, 1});    // D 192 -> simple path
        v.push_back({1, 2, 1, 70, 90, 64, 16, 32, F32, 0.6, 1, 1, 0});     // fp32 -> simple path
        // a global key column: key tile 0's list (82 entries) split over 3 CTAs, partial dK / dV
        // summed in chunk order (bsa_bwd90_splits); empty rows elsewhere
        v.push_back({1, 4, 2, 2600, 700, 128, 64, 64, F16, 0.08, 0, 0, 0, 1});
        v.push_back({2, 2, 1, 2200, 300, 64, 48, 80, BF, 0.1, 1, 0, 1, 1});
    }
    if (!quick) {  // random shapes (fast path and fallbacks), a fresh draw each run unless seeded
        const char *seed = getenv("SPATTN_TEST_SEED");
        g_rng = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + 1;
        printf("random shapes: seed %llu (SPATTN_TEST_SEED replays)\n", (unsigned long long)g_rng);
        for (int i = 0; i < 24; i++) {
            Shape r;
            r.B = 1 + (int)(urand() * 2);
            r.Nkv = 1 + (int)(urand() * 2);
            r.N = r.Nkv * (1 + (int)(urand() * 3));
            r.Sq = i == 0 ? 1 : 1 + (int)(urand() * 400);
            r.Skv = i == 1 ? 1 : 1 + (int)(urand() * 400);
            r.D = urand() < 0.5 ? 64 : 128;
            r.bx = 1 + (int)(urand() * (urand() < 0.5 ? 40 : 200));
            r.by = 1 + (int)(urand() * (urand() < 0.5 ? 40 : 200));
            r.dt = urand() < 0.5 ? F16 : BF;
            r.density = urand();
            r.empty_rows = urand() < 0.3;
            r.strided = urand() < 0.3;
            r.use_ws = urand() < 0.3;
            r.global = urand() < 0.3;  // a long list beside short ones (split only when long enough)
            v.push_back(r);
        }
    }
    for (auto &s : v) run_shape(s, true);
    check_plan_graph({2, 4, 2, 300, 260, 128, 48, 80, F16, 0.5, 0, 0, 0});
    check_nonfinite();
    if (!quick) check_plan_graph({1, 3, 1, 200, 333, 64, 16, 128, BF, 0.3, 0, 0, 0});
    printf("bsa_cuda_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

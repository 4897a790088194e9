// GPU correctness check of the sfa (top-k sparse flash attention) CUDA backend (timing: `spattn
// bench --backend cuda`, the one benchmark path).
// Runs on a machine with a GPU; prints "skipped" and exits 0 when none is visible (it is not a
// ctest test: CI has no GPU).
//
//   sfa_cuda_check            random small shapes vs an fp64 host reference written here from
//                             cases/README.md (padding anywhere, duplicates, empty rows, mode 3
//                             with S1 != S2 and S1 > S2, sbs > 1 with a partial last block,
//                             N2 = 2, odd head counts, rope split and concatenated, strided
//                             views); the CUDA reference kernels vs fp64 too (separate v, fp32,
//                             D = 64); out-of-range indices -> BAD_INDEX with the outputs left
//                             untouched; shapes without a Hopper kernel (simple kernels behind the
//                             API, both backward modes); bitwise repeatability of the deterministic
//                             backward (Hopper and simple kernels); the fp32-atomic backward within
//                             tolerance.
//   sfa_cuda_check quick      a few small cases (for compute-sanitizer)
//   sfa_cuda_check quick|all NAME   only the listed cases whose name contains NAME (a sanitizer's
//                             run of one case; the other tests skipped)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/internal.h"
#include "check_util.h"
#include "spattn.h"


static int g_pass = 0, g_fail = 0;
static void check(bool ok, const char *fmt, const char *a = "", long long v = 0) {
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        printf("FAIL: ");
        printf(fmt, a, v);
        printf("\n");
    }
}



struct Cfg {
    std::string name;
    int B, S1, S2, N1, N2, D, Dr, K, sbs, mode, dt;
    int concat = 1;      // q|q_rope and k|k_rope as views of one [.., D+Dr] buffer
    int pad_any = 0;     // padding scattered anywhere in the row
    int dups = 0;        // duplicate entries in the rows (2: in every 8th token's rows only)
    int empty = 0;       // some rows all -1
    int sep_v = 0;       // separate v tensor
    int kmaj_steps = 0;  // > 0: SPATTN_SFA_KMAJ_STEPS for the call (sfa_bwd_kmaj.cu's windows: several per list)
    int row_pad = 0;     // extra elements at the end of each row of q/k/o/dout (strided views)
    int nan_rest = 0;    // k / k_rope / v rows in no selected block of any row are NaN (never read:
                         // the key-major backward loads whole 64-key blocks and must zero them)
    int hopper = 0;      // the Hopper kernels must take the forward and the backward
                         // (SPATTN_SFA_REQUIRE_HOPPER: the simple kernels refuse the call)
};

// Index rows per cases/README.md, plus the test variations.
static std::vector<int32_t> gen_idx(const Cfg &c, Rng &r) {
    const int64_t nblk = (c.S2 + c.sbs - 1) / c.sbs;
    std::vector<int32_t> idx((size_t)c.B * c.S1 * c.N2 * c.K, -1);
    std::vector<int32_t> perm(nblk + 1);
    for (int b = 0; b < c.B; b++)
        for (int i = 0; i < c.S1; i++)
            for (int n = 0; n < c.N2; n++) {
                int32_t *row = &idx[(((size_t)b * c.S1 + i) * c.N2 + n) * c.K];
                int64_t limk = c.mode == 3 ? (int64_t)c.S2 - c.S1 + i : c.S2 - 1;
                if (limk < 0) continue;
                if (c.empty && r.below(7) == 0) continue;
                int64_t limb = limk / c.sbs;  // newest allowed block
                int64_t cnt = std::min<int64_t>(c.K, limb + 1);
                // partial Fisher-Yates over [0, limb): take cnt-1 others, then limb itself
                for (int64_t j = 0; j < limb; j++) perm[j] = (int32_t)j;
                row[0] = (int32_t)limb;
                for (int64_t j = 1; j < cnt; j++) {
                    int64_t t = j - 1 + r.below(limb - (j - 1));
                    std::swap(perm[j - 1], perm[t]);
                    row[j] = perm[j - 1];
                }
                for (int64_t j = cnt - 1; j > 0; j--) std::swap(row[j], row[r.below(j + 1)]);
                if (c.dups && (c.dups == 1 || i % 8 == 0))
                    for (int j = 0; j < c.K; j++)
                        if (r.below(5) == 0 && cnt > 0) row[j] = row[r.below(cnt)];
                if (c.pad_any)
                    for (int j = c.K - 1; j > 0; j--) std::swap(row[j], row[r.below(j + 1)]);
            }
    return idx;
}

// ---- fp64 host reference (cases/README.md) -----------------------------------------------------
struct RefOut {
    std::vector<double> o, lse, dq, dk, dv;  // dq [.., D+Dr], dk [.., D+Dr], dv [.., D] (sep v)
};
static void ref64(const Cfg &c, const std::vector<double> &q, const std::vector<double> &k,
                  const std::vector<double> &v, const std::vector<int32_t> &idx,
                  const std::vector<double> &dout, double scale, RefOut &R) {
    const int DQ = c.D + c.Dr, H = c.N1 / c.N2;
    R.o.assign((size_t)c.B * c.S1 * c.N1 * c.D, 0);
    R.lse.assign((size_t)c.B * c.S1 * c.N1, -INFINITY);
    R.dq.assign((size_t)c.B * c.S1 * c.N1 * DQ, 0);
    R.dk.assign((size_t)c.B * c.S2 * c.N2 * DQ, 0);
    R.dv.assign((size_t)c.B * c.S2 * c.N2 * c.D, 0);
    std::vector<int64_t> keys;
    std::vector<double> p, dp;
    for (int b = 0; b < c.B; b++)
        for (int i = 0; i < c.S1; i++)
            for (int h = 0; h < c.N1; h++) {
                const int n2 = h / H;
                const int32_t *row = &idx[(((size_t)b * c.S1 + i) * c.N2 + n2) * c.K];
                const int64_t lim = c.mode == 3 ? (int64_t)c.S2 - c.S1 + i : c.S2 - 1;
                keys.clear();
                for (int e = 0; e < c.K; e++) {
                    if (row[e] < 0) continue;
                    for (int o2 = 0; o2 < c.sbs; o2++) {
                        int64_t key = (int64_t)row[e] * c.sbs + o2;
                        if (key < c.S2 && key <= lim) keys.push_back(key);
                    }
                }
                if (keys.empty()) continue;
                const size_t qi = (((size_t)b * c.S1 + i) * c.N1 + h);
                auto krow = [&](int64_t key) { return &k[(((size_t)b * c.S2 + key) * c.N2 + n2) * DQ]; };
                auto vrow = [&](int64_t key) {
                    return c.sep_v ? &v[(((size_t)b * c.S2 + key) * c.N2 + n2) * c.D] : krow(key);
                };
                p.assign(keys.size(), 0);
                double mx = -INFINITY;
                for (size_t j = 0; j < keys.size(); j++) {
                    const double *kr = krow(keys[j]);
                    double a = 0;
                    for (int d = 0; d < DQ; d++) a += q[qi * DQ + d] * kr[d];
                    p[j] = a * scale;
                    mx = std::max(mx, p[j]);
                }
                double l = 0;
                for (double s : p) l += exp(s - mx);
                const double L = mx + log(l);
                R.lse[qi] = L;
                double *oi = &R.o[qi * c.D];
                for (size_t j = 0; j < keys.size(); j++) {
                    p[j] = exp(p[j] - L);
                    const double *vr = vrow(keys[j]);
                    for (int d = 0; d < c.D; d++) oi[d] += p[j] * vr[d];
                }
                if (dout.empty()) continue;
                const double *gi = &dout[qi * c.D];
                double delta = 0;
                for (int d = 0; d < c.D; d++) delta += gi[d] * oi[d];
                for (size_t j = 0; j < keys.size(); j++) {
                    const double *vr = vrow(keys[j]);
                    const double *kr = krow(keys[j]);
                    double a = 0;
                    for (int d = 0; d < c.D; d++) a += gi[d] * vr[d];
                    const double ds = p[j] * (a - delta);
                    double *dkr = &R.dk[(((size_t)b * c.S2 + keys[j]) * c.N2 + n2) * DQ];
                    double *dvr = c.sep_v ? &R.dv[(((size_t)b * c.S2 + keys[j]) * c.N2 + n2) * c.D] : dkr;
                    for (int d = 0; d < DQ; d++) {
                        R.dq[qi * DQ + d] += scale * ds * kr[d];
                        dkr[d] += scale * ds * q[qi * DQ + d];
                    }
                    for (int d = 0; d < c.D; d++) dvr[d] += p[j] * gi[d];
                }
            }
}

// ---- eco criterion -----------------------------------------------------------------------------
struct EcoRes {
    bool pass;
    double ratio, maxe, rel;
    // where it fails (diagnostics for a new kernel): the first bad flat indices and their values
    int nkept = 0;
    size_t bad_i[4];
    double bad_x[4], bad_y[4];
    std::vector<size_t> bad_all;  // every bad flat index (for the per-box / per-row summary)
};
static EcoRes eco(const std::vector<float> &a, const std::vector<double> &g, int dt, bool is_lse) {
    const EcoTol tol = eco_tol(dt, is_lse);
    const double atol = tol.atol, rtol = tol.rtol, lim = tol.lim;
    EcoRes r;
    size_t ok = 0;
    bool special_bad = false;
    double maxe = 0, num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double x = a[i], y = g[i];
        bool good;
        if (std::isnan(y) || std::isinf(y) || std::isnan(x) || std::isinf(x)) {
            good = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0));
            if (good) ok++;
            else special_bad = true;
        } else {
            good = fabs(x - y) <= atol + rtol * fabs(y);
            if (good) ok++;
        }
        if (!good) {
            if (r.nkept < 4) {
                r.bad_i[r.nkept] = i;
                r.bad_x[r.nkept] = x;
                r.bad_y[r.nkept++] = y;
            }
            r.bad_all.push_back(i);
        }
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        double e = fabs(x - y);
        maxe = std::max(maxe, e);
        num += e * e;
        den += y * y;
    }
    r.ratio = a.empty() ? 1.0 : (double)ok / a.size();
    r.maxe = maxe;
    r.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    r.pass = !special_bad && r.ratio >= 0.99 && maxe <= lim;
    return r;
}

// ---- device tensors of one problem ---------------------------------------------------------------
struct Dev {
    void *p = nullptr;
    size_t n = 0;
    void alloc(size_t bytes) {
        n = bytes;
        CK(cudaMalloc(&p, bytes ? bytes : 16));
    }
    ~Dev() {
        if (p) cudaFree(p);
    }
};
static spattn_tensor dt4(void *data, int dt, int64_t a, int64_t b, int64_t c, int64_t d,
                         int64_t rowstride) {
    spattn_tensor t;
    memset(&t, 0, sizeof(t));
    t.data = data;
    t.device_type = SPATTN_DEVICE_CUDA;
    t.dtype = dt;
    t.ndim = 4;
    t.shape[0] = a;
    t.shape[1] = b;
    t.shape[2] = c;
    t.shape[3] = d;
    t.strides[3] = 1;
    t.strides[2] = rowstride;
    t.strides[1] = rowstride * c;
    t.strides[0] = rowstride * c * b;
    return t;
}
static spattn_tensor dt3(void *data, int64_t a, int64_t b, int64_t c) {
    spattn_tensor t;
    memset(&t, 0, sizeof(t));
    t.data = data;
    t.device_type = SPATTN_DEVICE_CUDA;
    t.dtype = SPATTN_DTYPE_F32;
    t.ndim = 3;
    t.shape[0] = a;
    t.shape[1] = b;
    t.shape[2] = c;
    t.strides[2] = 1;
    t.strides[1] = c;
    t.strides[0] = b * c;
    return t;
}

struct Prob {
    Cfg c;
    int DQ;
    int64_t nq, nk;  // rows of q and k
    int64_t qrs, krs, ors;  // row strides (elements) of the q/k buffers and of o/dout/dq
    Dev q, qr, k, kr, v, idx, o, lse, dout, dq, dqr, dk, dkr, dv;
    spattn_tensor tq, tqr, tk, tkr, tv, tidx, to, tlse, tdo, tdq, tdqr, tdk, tdkr, tdv;
    std::vector<double> hq, hk, hv, hdo;  // rounded values, [.., D+Dr] concatenated
    std::vector<int32_t> hidx;
};

static void upload_rows(const std::vector<double> &src, int64_t rows, int width, int col0, int cols,
                        Dev &dst, int64_t stride, int dt) {
    std::vector<unsigned char> buf(dst.n);
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) store_dt(buf.data(), r * stride + j, (float)src[r * width + col0 + j], dt);
    CK(cudaMemcpy(dst.p, buf.data(), dst.n, cudaMemcpyHostToDevice));
}

static void setup(Prob &P, const Cfg &c, uint64_t seed) {
    P.c = c;
    Rng r(seed);
    const int DQ = c.D + c.Dr;
    P.DQ = DQ;
    P.nq = (int64_t)c.B * c.S1 * c.N1;
    P.nk = (int64_t)c.B * c.S2 * c.N2;
    const int dt = c.dt;
    P.hq.resize(P.nq * DQ);
    P.hk.resize(P.nk * DQ);
    for (auto &x : P.hq) x = round_dt(r.n(), dt);
    for (auto &x : P.hk) x = round_dt(r.n(), dt);
    if (c.sep_v) {
        P.hv.resize(P.nk * c.D);
        for (auto &x : P.hv) x = round_dt(r.n(), dt);
    }
    P.hdo.resize(P.nq * c.D);
    for (auto &x : P.hdo) x = round_dt(r.n(), dt);
    P.hidx = gen_idx(c, r);
    if (c.nan_rest) {
        std::vector<char> sel((size_t)c.B * c.S2 * c.N2, 0);
        for (int b = 0; b < c.B; b++)
            for (int i = 0; i < c.S1; i++)
                for (int n = 0; n < c.N2; n++)
                    for (int j = 0; j < c.K; j++) {
                        // keys past the token's causal limit count as not selected (the kernels
                        // mask them, so rows only such selections reach are NaN here too)
                        const int32_t e = P.hidx[(((size_t)b * c.S1 + i) * c.N2 + n) * c.K + j];
                        const int64_t lim = c.mode == 3 ? (int64_t)c.S2 - c.S1 + i : (int64_t)c.S2 - 1;
                        for (int64_t k = (int64_t)e * c.sbs; e >= 0 && k < std::min<int64_t>((int64_t)(e + 1) * c.sbs, c.S2) && k <= lim; k++)
                            sel[((size_t)b * c.S2 + k) * c.N2 + n] = 1;
                    }
        for (size_t row = 0; row < sel.size(); row++)
            if (!sel[row]) {
                for (int d = 0; d < DQ; d++) P.hk[row * DQ + d] = NAN;
                for (int d = 0; c.sep_v && d < c.D; d++) P.hv[row * c.D + d] = NAN;
            }
    }
    const size_t es = esz(dt);
    if (c.concat) {
        P.qrs = DQ + c.row_pad;
        P.krs = DQ + c.row_pad;
        P.q.alloc(P.nq * P.qrs * es);
        P.k.alloc(P.nk * P.krs * es);
        upload_rows(P.hq, P.nq, DQ, 0, DQ, P.q, P.qrs, dt);
        upload_rows(P.hk, P.nk, DQ, 0, DQ, P.k, P.krs, dt);
        P.tq = dt4(P.q.p, dt, c.B, c.S1, c.N1, c.D, P.qrs);
        P.tk = dt4(P.k.p, dt, c.B, c.S2, c.N2, c.D, P.krs);
        P.tqr = dt4((char *)P.q.p + c.D * es, dt, c.B, c.S1, c.N1, c.Dr, P.qrs);
        P.tkr = dt4((char *)P.k.p + c.D * es, dt, c.B, c.S2, c.N2, c.Dr, P.krs);
    } else {
        P.qrs = c.D + c.row_pad;
        P.krs = c.D + c.row_pad;
        P.q.alloc(P.nq * P.qrs * es);
        P.k.alloc(P.nk * P.krs * es);
        upload_rows(P.hq, P.nq, DQ, 0, c.D, P.q, P.qrs, dt);
        upload_rows(P.hk, P.nk, DQ, 0, c.D, P.k, P.krs, dt);
        P.tq = dt4(P.q.p, dt, c.B, c.S1, c.N1, c.D, P.qrs);
        P.tk = dt4(P.k.p, dt, c.B, c.S2, c.N2, c.D, P.krs);
        if (c.Dr) {
            P.qr.alloc(P.nq * c.Dr * es);
            P.kr.alloc(P.nk * c.Dr * es);
            upload_rows(P.hq, P.nq, DQ, c.D, c.Dr, P.qr, c.Dr, dt);
            upload_rows(P.hk, P.nk, DQ, c.D, c.Dr, P.kr, c.Dr, dt);
            P.tqr = dt4(P.qr.p, dt, c.B, c.S1, c.N1, c.Dr, c.Dr);
            P.tkr = dt4(P.kr.p, dt, c.B, c.S2, c.N2, c.Dr, c.Dr);
        }
    }
    if (c.sep_v) {
        P.v.alloc(P.nk * c.D * es);
        upload_rows(P.hv, P.nk, c.D, 0, c.D, P.v, c.D, dt);
        P.tv = dt4(P.v.p, dt, c.B, c.S2, c.N2, c.D, c.D);
    }
    P.idx.alloc(P.hidx.size() * 4);
    CK(cudaMemcpy(P.idx.p, P.hidx.data(), P.idx.n, cudaMemcpyHostToDevice));
    P.tidx = dt4(P.idx.p, SPATTN_DTYPE_I32, c.B, c.S1, c.N2, c.K, c.K);
    P.ors = c.D + c.row_pad;
    P.o.alloc(P.nq * P.ors * es);
    P.dout.alloc(P.nq * P.ors * es);
    upload_rows(P.hdo, P.nq, c.D, 0, c.D, P.dout, P.ors, dt);
    P.lse.alloc(P.nq * 4);
    P.dq.alloc(P.nq * P.ors * es);
    P.dk.alloc(P.nk * c.D * es);
    P.to = dt4(P.o.p, dt, c.B, c.S1, c.N1, c.D, P.ors);
    P.tdo = dt4(P.dout.p, dt, c.B, c.S1, c.N1, c.D, P.ors);
    P.tdq = dt4(P.dq.p, dt, c.B, c.S1, c.N1, c.D, P.ors);
    P.tdk = dt4(P.dk.p, dt, c.B, c.S2, c.N2, c.D, c.D);
    P.tlse = dt3(P.lse.p, c.B, c.S1, c.N1);
    if (c.Dr) {
        P.dqr.alloc(P.nq * c.Dr * es);
        P.dkr.alloc(P.nk * c.Dr * es);
        P.tdqr = dt4(P.dqr.p, dt, c.B, c.S1, c.N1, c.Dr, c.Dr);
        P.tdkr = dt4(P.dkr.p, dt, c.B, c.S2, c.N2, c.Dr, c.Dr);
    }
    if (c.sep_v) {
        P.dv.alloc(P.nk * c.D * es);
        P.tdv = dt4(P.dv.p, dt, c.B, c.S2, c.N2, c.D, c.D);
    }
}

static void poison(Dev &d) {
    if (d.p) CK(cudaMemset(d.p, 0xff, d.n));  // NaN in every float format
}
static std::vector<unsigned char> snap(const Dev &a) {
    std::vector<unsigned char> x(a.n);
    CK(cudaMemcpy(x.data(), a.p, a.n, cudaMemcpyDeviceToHost));
    return x;
}

static spattn_status run_fwd(Prob &P, int det = 1, cudaStream_t stream = nullptr, void *ws = nullptr, size_t wsz = 0) {
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    opt.deterministic = det;
    opt.cuda_stream = stream;
    opt.workspace = ws;
    opt.workspace_size = wsz;
    const Cfg &c = P.c;
    return spattn_sfa_fwd_ex(&P.tq, c.Dr ? &P.tqr : nullptr, &P.tk, c.Dr ? &P.tkr : nullptr,
                             c.sep_v ? &P.tv : nullptr, &P.tidx, c.sbs, c.mode, 0.0, &P.to, &P.tlse, &opt);
}
static spattn_status run_bwd(Prob &P, int det = 1) {
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    opt.deterministic = det;
    const Cfg &c = P.c;
    return spattn_sfa_bwd_ex(&P.tq, c.Dr ? &P.tqr : nullptr, &P.tk, c.Dr ? &P.tkr : nullptr,
                             c.sep_v ? &P.tv : nullptr, &P.to, &P.tdo, &P.tlse, &P.tidx, c.sbs, c.mode, 0.0,
                             &P.tdq, c.Dr ? &P.tdqr : nullptr, &P.tdk, c.Dr ? &P.tdkr : nullptr,
                             c.sep_v ? &P.tdv : nullptr, &opt);
}

static std::vector<float> fetch(const Dev &d, int64_t rows, int cols, int64_t stride, int dt) {
    std::vector<unsigned char> buf(d.n);
    CK(cudaMemcpy(buf.data(), d.p, d.n, cudaMemcpyDeviceToHost));
    std::vector<float> out(rows * cols);
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) out[r * cols + j] = load_dt(buf.data(), r * stride + j, dt);
    return out;
}
static std::vector<float> fetch_f32(const float *d, size_t n) {
    std::vector<float> out(n);
    CK(cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return out;
}
static std::vector<double> cols_of(const std::vector<double> &x, int64_t rows, int width, int c0, int n) {
    std::vector<double> out(rows * n);
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) out[r * n + j] = x[r * width + c0 + j];
    return out;
}

// On a failure: the first bad elements (row, column of a `width`-wide row) and how the bad ones
// spread over 64-column boxes and over row % 64 (heads, or key slots of a block): a wrong
// operand layout in a new kernel shows as a pattern there.
static bool report(const char *tag, const char *tensor, const EcoRes &e, int width = 0) {
    if (!e.pass) {
        printf("  %-34s %-8s FAIL matched %.5f max_abs %.3g rel_l2 %.3g\n", tag, tensor, e.ratio, e.maxe, e.rel);
        if (width > 0 && !e.bad_all.empty()) {
            for (int k = 0; k < e.nkept; k++)
                printf("    bad [row %zu, col %zu]: got %.6g want %.6g\n", e.bad_i[k] / width, e.bad_i[k] % width, e.bad_x[k],
                       e.bad_y[k]);
            std::vector<size_t> box((width + 63) / 64, 0), rmod(64, 0);
            for (size_t i : e.bad_all) {
                box[(i % width) / 64]++;
                rmod[(i / width) % 64]++;
            }
            printf("    bad per 64-column box:");
            for (size_t b = 0; b < box.size(); b++) printf(" %zu", box[b]);
            printf("\n    bad per row %% 64:");
            for (int b = 0; b < 64; b++) printf(" %zu", rmod[b]);
            printf("\n");
        }
    }
    check(e.pass, "%s eco", tag);
    return e.pass;
}

// Problem descriptor for the reference kernels (same fields the core validation fills).
static spattn_sfa_problem problem_of(Prob &P, int bwd) {
    const Cfg &c = P.c;
    spattn_sfa_problem p;
    memset(&p, 0, sizeof(p));
    p.q = &P.tq;
    p.q_rope = c.Dr ? &P.tqr : nullptr;
    p.k = &P.tk;
    p.k_rope = c.Dr ? &P.tkr : nullptr;
    p.v = c.sep_v ? &P.tv : nullptr;
    p.idx = &P.tidx;
    p.o = &P.to;
    p.lse = &P.tlse;
    p.dout = bwd ? &P.tdo : nullptr;
    p.B = c.B;
    p.S1 = c.S1;
    p.S2 = c.S2;
    p.N1 = c.N1;
    p.N2 = c.N2;
    p.D = c.D;
    p.Dr = c.Dr;
    p.K = c.K;
    p.sbs = c.sbs;
    p.nblk = (c.S2 + c.sbs - 1) / c.sbs;
    p.mode = c.mode;
    p.shared_kv = !c.sep_v;
    p.scale = (float)(1.0 / sqrt((double)(c.D + c.Dr)));
    p.dtype = c.dt;
    return p;
}

// Fast kernels (fwd, bwd det, bwd atomic) vs the fp64 host reference; also the CUDA reference
// kernels vs fp64.  fast = 0: only the reference kernels (shapes without a fast kernel).
// rerun: the deterministic backward also run a second time and compared bitwise (the simple
// kernels behind the API for shapes without a Hopper kernel, the sorted-rows form).
static const char *g_only = nullptr;  // run only the cases whose name contains it (argv[2])
static int g_skipped = 0;
static bool selected(const Cfg &c) { return !g_only || strstr(c.name.c_str(), g_only); }

static void test_case(const Cfg &c, uint64_t seed, bool fast = true, bool rerun = false) {
    if (!selected(c)) {
        g_skipped++;
        return;
    }
    Prob P;
    setup(P, c, seed);
    RefOut R;
    const double scale = 1.0 / sqrt((double)(c.D + c.Dr));
    ref64(c, P.hq, P.hk, P.hv, P.hidx, P.hdo, scale, R);
    const int DQ = P.DQ;
    char tag[160];
    snprintf(tag, sizeof tag, "%s", c.name.c_str());
    if (fast) {
        // the forward four ways where the union pass applies (Mla, H = 4 .. 32 a power of two,
        // sbs <= 64): every group without a repeated key on the union kernel (compacted where
        // that saves blocks; then in contiguous blocks only), none, the heuristic
        const int H = c.N1 / c.N2;
        const bool un = c.D == 512 && c.Dr == 64 && !c.sep_v && c.dt != SPATTN_DTYPE_F32 && H >= 4 && H <= 32 &&
                        !(H & (H - 1)) && c.sbs <= 64;
        const char *modes[4] = {"1", "1", "0", nullptr};
        const char *names[4] = {" [union]", " [union, blocks]", " [gather]", ""};
        spattn_status st = SPATTN_STATUS_SUCCESS;
        // one forward from poisoned outputs, checked against the fp64 reference
        auto fwd_checked = [&](const char *form, void *ws = nullptr, size_t wsz = 0) {
            char t1[200];
            snprintf(t1, sizeof t1, "%s%s", tag, form);
            poison(P.o);
            poison(P.lse);
            st = run_fwd(P, 1, nullptr, ws, wsz);
            check(st == SPATTN_STATUS_SUCCESS, "%s fwd status", t1, st);
            if (st != SPATTN_STATUS_SUCCESS) printf("  %s: %s\n", t1, spattn_last_error());
            CK(cudaDeviceSynchronize());
            report(t1, "O", eco(fetch(P.o, P.nq, c.D, P.ors, c.dt), R.o, c.dt, false), c.D);
            report(t1, "LSE", eco(fetch_f32((float *)P.lse.p, P.nq), R.lse, c.dt, true));
        };
        for (int m = un ? 0 : 3; m < 4; m++) {
            if (modes[m]) setenv("SPATTN_SFA_UNION", modes[m], 1);
            else unsetenv("SPATTN_SFA_UNION");
            if (m == 1) setenv("SPATTN_SFA_UNION_COMPACT", "0", 1);
            else unsetenv("SPATTN_SFA_UNION_COMPACT");
            fwd_checked(names[m]);
        }
        unsetenv("SPATTN_SFA_UNION");
        // the group form (sfa_fwd_group.cu, SPATTN_SFA_GROUP=1 while unrun): D <= 128, separate or
        // shared V (Dr 0 or up to 64), H <= 32, sbs <= 64; groups of 16 / 8 / 4 tokens over the
        // union's blocks, compacted where that saves blocks, and in contiguous blocks only
        const bool grp = c.D <= 128 && c.Dr <= 64 && H <= 32 && c.sbs <= 64 && c.dt != SPATTN_DTYPE_F32;
        for (int m = 0; grp && m < 2; m++) {
            setenv("SPATTN_SFA_GROUP", "1", 1);
            setenv("SPATTN_SFA_REQUIRE_HOPPER", "1", 1);  // every such shape is a Hopper one
            if (m == 1) setenv("SPATTN_SFA_UNION_COMPACT", "0", 1);
            // through a caller workspace, whose first words are the plan's group counts
            // (sfa_host.cu union_layout; -1: the group went to the per-token kernel): the group
            // kernel must have taken some group (every group in a case without repeated keys),
            // else this check would only test the per-token kernel's skip
            size_t w = 0;
            spattn_options qo;
            spattn_options_init(&qo);
            qo.backend = SPATTN_BACKEND_CUDA;
            check(spattn_sfa_workspace_size(&P.tq, c.Dr ? &P.tqr : nullptr, &P.tk, c.Dr ? &P.tkr : nullptr,
                                            c.sep_v ? &P.tv : nullptr, &P.tidx, c.sbs, c.mode, 0, &qo, &w) ==
                          SPATTN_STATUS_SUCCESS && w > 0,
                  "%s group form: a workspace for its plan", tag);
            void *ws = nullptr;
            if (w) {
                CK(cudaMalloc(&ws, w));
                CK(cudaMemset(ws, 0xff, w));
            }
            fwd_checked(m ? " [group, blocks]" : " [group]", ws, w);
            if (ws) {
                const int n = H <= 8 ? 8 : H <= 16 ? 16 : 32, ug = 2 * (64 / n);
                const int64_t ng = (int64_t)c.B * c.N2 * ((c.S1 + ug - 1) / ug);
                std::vector<int> cnt(ng);
                CK(cudaMemcpy(cnt.data(), ws, ng * sizeof(int), cudaMemcpyDeviceToHost));
                int64_t taken = 0;
                for (int x : cnt) taken += x >= 0;
                check(c.dups ? true : taken == ng, "%s group form: groups taken %lld", tag, taken);
                if (m == 0) printf("  %s: group form took %lld of %lld groups\n", tag, (long long)taken, (long long)ng);
                CK(cudaFree(ws));
            }
            unsetenv("SPATTN_SFA_GROUP");
            unsetenv("SPATTN_SFA_UNION_COMPACT");
            if (!c.hopper) unsetenv("SPATTN_SFA_REQUIRE_HOPPER");
        }
        std::vector<unsigned char> dq1, dk1;
        // nan_rest: the union backward's groups in contiguous blocks (the form that loads keys
        // no token selects; compacted groups hold only the union's keys)
        if (c.nan_rest) setenv("SPATTN_SFA_UNION_COMPACT", "0", 1);
        for (int det = 1; det >= 0; det--) {
            poison(P.dq);
            poison(P.dqr);
            poison(P.dk);
            poison(P.dkr);
            st = run_bwd(P, det);
            check(st == SPATTN_STATUS_SUCCESS, "%s bwd status", tag, st);
            if (rerun && det && st == SPATTN_STATUS_SUCCESS) {
                CK(cudaDeviceSynchronize());
                const std::vector<unsigned char> a[4] = {snap(P.dq), snap(P.dk), snap(P.dkr), snap(P.dv)};
                poison(P.dq);
                poison(P.dk);
                poison(P.dkr);
                poison(P.dv);
                check(run_bwd(P, det) == SPATTN_STATUS_SUCCESS, "%s det bwd again", tag);
                CK(cudaDeviceSynchronize());
                check(a[0] == snap(P.dq) && a[1] == snap(P.dk) && a[2] == snap(P.dkr) && a[3] == snap(P.dv),
                      "%s deterministic bwd: second run bitwise the first", tag);
            }
            if (st != SPATTN_STATUS_SUCCESS) printf("  %s: %s\n", tag, spattn_last_error());
            CK(cudaDeviceSynchronize());
            char t2[200];
            snprintf(t2, sizeof t2, "%s %s", tag, det ? "det" : "atomic");
            report(t2, "dQ", eco(fetch(P.dq, P.nq, c.D, P.ors, c.dt), cols_of(R.dq, P.nq, DQ, 0, c.D), c.dt, false), c.D);
            report(t2, "dK", eco(fetch(P.dk, P.nk, c.D, c.D, c.dt), cols_of(R.dk, P.nk, DQ, 0, c.D), c.dt, false), c.D);
            if (c.Dr) {
                report(t2, "dQ_rope", eco(fetch(P.dqr, P.nq, c.Dr, c.Dr, c.dt), cols_of(R.dq, P.nq, DQ, c.D, c.Dr), c.dt, false), c.Dr);
                report(t2, "dK_rope", eco(fetch(P.dkr, P.nk, c.Dr, c.Dr, c.dt), cols_of(R.dk, P.nk, DQ, c.D, c.Dr), c.dt, false), c.Dr);
            }
            if (c.sep_v) report(t2, "dV", eco(fetch(P.dv, P.nk, c.D, c.D, c.dt), R.dv, c.dt, false));
        }
        unsetenv("SPATTN_SFA_UNION_COMPACT");
    }
    // CUDA reference kernels vs fp64
    spattn_exec ex;
    memset(&ex, 0, sizeof ex);
    ex.deterministic = 1;
    spattn_sfa_problem p = problem_of(P, 0);
    float *go, *glse, *gdq, *gdqr = nullptr, *gdk, *gdkr = nullptr, *gdv = nullptr;
    CK(cudaMalloc(&go, P.nq * c.D * 4));
    CK(cudaMalloc(&glse, P.nq * 4));
    CK(cudaMalloc(&gdq, P.nq * c.D * 4));
    CK(cudaMalloc(&gdk, P.nk * c.D * 4));
    if (c.Dr) {
        CK(cudaMalloc(&gdqr, P.nq * c.Dr * 4));
        CK(cudaMalloc(&gdkr, P.nk * c.Dr * 4));
    }
    if (c.sep_v) CK(cudaMalloc(&gdv, P.nk * c.D * 4));
    spattn_status st = spattn_cuda_ref_sfa_fwd(&p, &ex, go, glse);
    check(st == SPATTN_STATUS_SUCCESS, "%s ref fwd status", tag, st);
    snprintf(tag, sizeof tag, "%s [cuda ref]", c.name.c_str());
    report(tag, "O", eco(fetch_f32(go, P.nq * c.D), R.o, c.dt == SPATTN_DTYPE_F32 ? SPATTN_DTYPE_F32 : c.dt, false));
    report(tag, "LSE", eco(fetch_f32(glse, P.nq), R.lse, c.dt, true));
    p = problem_of(P, 1);
    st = spattn_cuda_ref_sfa_bwd(&p, &ex, gdq, gdqr, gdk, gdkr, gdv);
    check(st == SPATTN_STATUS_SUCCESS, "%s ref bwd status", tag, st);
    report(tag, "dQ", eco(fetch_f32(gdq, P.nq * c.D), cols_of(R.dq, P.nq, DQ, 0, c.D), c.dt, false));
    report(tag, "dK", eco(fetch_f32(gdk, P.nk * c.D), cols_of(R.dk, P.nk, DQ, 0, c.D), c.dt, false));
    if (c.Dr) {
        report(tag, "dQ_rope", eco(fetch_f32(gdqr, P.nq * c.Dr), cols_of(R.dq, P.nq, DQ, c.D, c.Dr), c.dt, false));
        report(tag, "dK_rope", eco(fetch_f32(gdkr, P.nk * c.Dr), cols_of(R.dk, P.nk, DQ, c.D, c.Dr), c.dt, false));
    }
    if (c.sep_v) report(tag, "dV", eco(fetch_f32(gdv, P.nk * c.D), R.dv, c.dt, false));
    cudaFree(go);
    cudaFree(glse);
    cudaFree(gdq);
    cudaFree(gdk);
    if (gdqr) cudaFree(gdqr);
    if (gdkr) cudaFree(gdkr);
    if (gdv) cudaFree(gdv);
}

static Cfg mk(const char *name, int B, int S1, int S2, int N1, int N2, int K, int sbs, int mode, int dt) {
    Cfg c;
    c.name = name;
    c.B = B;
    c.S1 = S1;
    c.S2 = S2;
    c.N1 = N1;
    c.N2 = N2;
    c.D = 512;
    c.Dr = 64;
    c.K = K;
    c.sbs = sbs;
    c.mode = mode;
    c.dt = dt;
    return c;
}

static bool bitwise_equal(const Dev &a, const std::vector<unsigned char> &b) {
    std::vector<unsigned char> x(a.n);
    CK(cudaMemcpy(x.data(), a.p, a.n, cudaMemcpyDeviceToHost));
    return x == b;
}

static void test_bad_index() {
    Cfg c = mk("bad_index", 1, 16, 64, 16, 1, 8, 1, 3, SPATTN_DTYPE_BF16);
    Prob P;
    setup(P, c, 7);
    // variants 0-2 with the union pass's plan doing the check (N1 16: the pass applies), 3-5 without
    for (int variant = 0; variant < 6; variant++) {
        if (variant == 3) setenv("SPATTN_SFA_UNION", "0", 1);
        std::vector<int32_t> bad = P.hidx;
        const int v3 = variant % 3;
        size_t pos = v3 == 0 ? 37 : (v3 == 1 ? 100 : bad.size() - 1);
        int32_t val = v3 == 0 ? 64 : (v3 == 1 ? -2 : 1 << 30);
        bad[pos] = val;
        if (v3 == 1) bad[120] = 99;  // a later second bad value: the first must be reported
        CK(cudaMemcpy(P.idx.p, bad.data(), P.idx.n, cudaMemcpyHostToDevice));
        poison(P.o);
        poison(P.lse);
        std::vector<unsigned char> o0 = snap(P.o), lse0 = snap(P.lse);
        spattn_status st = run_fwd(P);  // the forward kernel is gated on the scan (no host sync between)
        check(st == SPATTN_STATUS_BAD_INDEX, "bad index fwd status %s%lld", "", st);
        char want[64];
        snprintf(want, sizeof want, "got %d", val);
        check(strstr(spattn_last_error(), want) != nullptr, "bad index message names the value: %s", spattn_last_error());
        check(bitwise_equal(P.o, o0) && bitwise_equal(P.lse, lse0), "bad index: o and lse untouched%s", "");
        poison(P.dq);
        poison(P.dk);
        std::vector<unsigned char> q0 = snap(P.dq), k0 = snap(P.dk);
        st = run_bwd(P);
        check(st == SPATTN_STATUS_BAD_INDEX, "bad index bwd status %s%lld", "", st);
        check(bitwise_equal(P.dq, q0) && bitwise_equal(P.dk, k0), "bad index: dq/dk untouched%s", "");
    }
    unsetenv("SPATTN_SFA_UNION");
    printf("  bad-index message: %s\n", spattn_last_error());
}

// Shapes without a Hopper kernel run on the simple kernels behind the API (every valid input
// runs on the GPU): D = 64 without rope, fp32, a separate v, an NSA-like shape (D = 128, N2 = 2,
// sbs = 64); both backward modes.
static void test_fallback() {
    Cfg a = mk("fb_d64_norope_bf16", 1, 24, 96, 8, 1, 10, 4, 3, SPATTN_DTYPE_BF16);
    a.D = 64;
    a.Dr = 0;
    test_case(a, 31, true, true);
    Cfg b = mk("fb_fp32", 1, 12, 48, 16, 1, 16, 1, 0, SPATTN_DTYPE_F32);
    test_case(b, 32, true, true);
    Cfg c = mk("fb_sep_v_fp16", 2, 10, 40, 4, 2, 12, 2, 3, SPATTN_DTYPE_F16);
    c.D = 128;
    c.sep_v = 1;
    test_case(c, 33, true, true);
    Cfg d = mk("fb_nsa_d128_n2_sbs64", 1, 16, 1024, 8, 2, 4, 64, 3, SPATTN_DTYPE_BF16);
    d.D = 128;
    test_case(d, 34, true, true);
}

static void test_determinism(int N1, int D = 512, int Dr = 64, int sep_v = 0) {
    // N1 = 64: the token-major Hopper backward; 8: the union form (groups of 8 tokens); 3: the
    // key-major one; a separate v (D 128, 256): sfa_bwd_kmaj.cu (sbs 64 blocks)
    Cfg c = mk("determinism", 1, 256, 1024, N1, 1, sep_v ? 8 : 256, sep_v ? 64 : 1, 3, SPATTN_DTYPE_BF16);
    c.D = D;
    c.Dr = Dr;
    c.sep_v = sep_v;
    Prob P;
    setup(P, c, 11);
    check(run_fwd(P) == SPATTN_STATUS_SUCCESS, "det fwd%s", "");
    std::vector<unsigned char> a[5];
    int same = 1;
    for (int rep = 0; rep < 20; rep++) {
        poison(P.dq);
        poison(P.dk);
        poison(P.dkr);
        poison(P.dqr);
        poison(P.dv);
        check(run_bwd(P, 1) == SPATTN_STATUS_SUCCESS, "det bwd%s", "");
        CK(cudaDeviceSynchronize());
        std::vector<unsigned char> x[5] = {snap(P.dq), snap(P.dqr), snap(P.dk), snap(P.dkr), snap(P.dv)};
        if (rep == 0)
            for (int i = 0; i < 5; i++) a[i] = x[i];
        else
            for (int i = 0; i < 5; i++) same &= x[i] == a[i];
    }
    check(same, "deterministic backward bitwise repeatable%s", "");
    printf("  deterministic backward (N1 = %d, D %d + %d%s): 20 runs bitwise %s\n", N1, D, Dr, sep_v ? ", separate v" : "",
           same ? "identical" : "DIFFERENT");
    // the atomic path: usually not bitwise equal, but close
    check(run_bwd(P, 0) == SPATTN_STATUS_SUCCESS, "atomic bwd%s", "");
    CK(cudaDeviceSynchronize());
    std::vector<unsigned char> k1 = snap(P.dk);
    printf("  fp32-atomic backward vs deterministic dK: %s\n", k1 == a[2] ? "bitwise equal" : "differs (expected: order-dependent rounding)");
}

// The deterministic token-major backward's retry (packed int32 fixed point, sfa_host.cu
// bwd_packed): the probe's F pushed 12 bits too fine (every row overflows int32: F lowered from
// the exact bound, the pass repeated) or 12 bits too coarse (the sums use few bits: F raised);
// both still eco-correct against the fp64 reference and bitwise repeatable.  N1 64: the
// token-major kernel; 8: the union form.
static void test_p32_retry(int N1) {
    for (const char *sh : {"12", "-12"}) {
        setenv("SPATTN_SFA_P32_SHIFT", sh, 1);
        const int before = g_fail;
        Cfg c = mk(N1 == 64 ? "p32_retry_h64" : "p32_retry_union_h8", 1, 96, 700, N1, 1, 160, 1, 3, SPATTN_DTYPE_BF16);
        test_case(c, 41, true);
        printf("  packed int32 retry (N1 = %d, probe F shifted by %s): %s\n", N1, sh, g_fail == before ? "ok" : "FAILED");
    }
    unsetenv("SPATTN_SFA_P32_SHIFT");
}

// The token-major backward on index rows sorted first (sfa_host.cu sort_idx, forced on: the
// public shapes that take it are too large here): -1 and causally masked entries move to the
// rows' ends, duplicates stay; vs fp64 in both modes, the deterministic one twice bitwise;
// K 8000: 16 keys per thread, padded.
static void test_sorted_rows() {
    setenv("SPATTN_SFA_BWD_SORT", "1", 1);
    const int before = g_fail;
    test_case(mk("sort_h64_causal", 1, 96, 700, 64, 1, 160, 1, 3, SPATTN_DTYPE_BF16), 51, true, true);
    test_case(mk("sort_h128_b2_m0", 2, 40, 900, 128, 1, 300, 1, 0, SPATTN_DTYPE_F16), 52, true, true);
    test_case(mk("sort_h64_sbs4", 1, 50, 1000, 64, 1, 100, 4, 3, SPATTN_DTYPE_BF16), 53, true, true);
    test_case(mk("sort_h64_k8000", 1, 6, 2000, 64, 1, 8000, 1, 0, SPATTN_DTYPE_BF16), 54, true, true);
    printf("  sorted index rows (token-major backward): %s\n", g_fail == before ? "ok" : "FAILED");
    unsetenv("SPATTN_SFA_BWD_SORT");
}

// The union forward's workspace from the caller (spattn_sfa_workspace_size, forward): the same
// bits as from spattn's own pool; every group on the union kernel (whole causal rows: contiguous
// blocks; or K well under S2: compacted groups).
static void test_caller_workspace(int N1, int S2, int K) {
    Cfg c = mk("caller_ws", 1, 150, S2, N1, 1, K, 1, 3, SPATTN_DTYPE_BF16);
    Prob P;
    setup(P, c, 12);
    setenv("SPATTN_SFA_UNION", "1", 1);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    size_t w = 0;
    check(spattn_sfa_workspace_size(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.tidx, c.sbs, c.mode, 0, &opt, &w) ==
              SPATTN_STATUS_SUCCESS && w > 0,
          "%s forward workspace size > 0 (union pass)", c.name.c_str());
    poison(P.o);
    check(run_fwd(P) == SPATTN_STATUS_SUCCESS, "%s fwd (pool)", c.name.c_str());
    CK(cudaDeviceSynchronize());
    const std::vector<unsigned char> o1 = snap(P.o), l1 = snap(P.lse);
    void *ws = nullptr;
    CK(cudaMalloc(&ws, w));
    CK(cudaMemset(ws, 0xff, w));
    opt.workspace = ws;
    opt.workspace_size = w;
    poison(P.o);
    poison(P.lse);
    check(spattn_sfa_fwd_ex(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.tidx, c.sbs, c.mode, 0.0, &P.to, &P.tlse, &opt) ==
              SPATTN_STATUS_SUCCESS,
          "%s fwd (caller workspace)", c.name.c_str());
    CK(cudaDeviceSynchronize());
    const bool same = snap(P.o) == o1 && snap(P.lse) == l1;
    check(same, "%s caller workspace: bitwise the pool's result", c.name.c_str());
    // the plan's group counts lead the workspace (sfa_host.cu's union_cfg): every group taken,
    // compacted (bit 30) exactly when the union leaves gaps (whole causal rows leave none)
    const int ng = (c.S1 + 64 / N1 - 1) / (64 / N1);
    std::vector<int> cnt(ng);
    CK(cudaMemcpy(cnt.data(), ws, ng * sizeof(int), cudaMemcpyDeviceToHost));
    int taken = 0, packed = 0;
    for (int x : cnt) {
        taken += x >= 0;
        packed += x >= 0 && (x & (1 << 30));
    }
    const bool whole = K >= S2;
    check(taken == ng && (whole ? packed == 0 : packed > 0), "%s union groups all taken, compacted: %lld",
          c.name.c_str(), packed);
    printf("  union groups: %d of %d taken, %d compacted\n", taken, ng, packed);
    printf("  union forward, caller workspace (N1 = %d, S2 = %d, K = %d, %zu bytes): %s\n", N1, S2, K, w,
           same ? "bitwise equal" : "DIFFERENT");
    cudaFree(ws);
    unsetenv("SPATTN_SFA_UNION");
}

// sfa_pad.cu (shared V, 256 < D <= 512, Dr <= 64: the Mla kernels on padded copies): a caller
// workspace of spattn_sfa_workspace_size bytes gives the pool's bits (forward, deterministic
// backward); under stream capture a call that copies its outputs back refuses (NOT_SUPPORTED,
// the capture stays valid), while D 512 without rope (nothing copied back) captures and replays
// bitwise.
static void test_pad_route() {
    const int before = g_fail;
    Cfg c = mk("pad_route_d384r64", 1, 40, 300, 16, 1, 16, 4, 3, SPATTN_DTYPE_BF16);
    c.D = 384;
    Prob P;
    setup(P, c, 41);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    opt.deterministic = 1;
    check(run_fwd(P) == SPATTN_STATUS_SUCCESS, "%s fwd (pool)", c.name.c_str());
    CK(cudaDeviceSynchronize());
    const std::vector<unsigned char> o1 = snap(P.o), l1 = snap(P.lse);
    check(run_bwd(P) == SPATTN_STATUS_SUCCESS, "%s bwd (pool)", c.name.c_str());
    CK(cudaDeviceSynchronize());
    const std::vector<unsigned char> g1[4] = {snap(P.dq), snap(P.dqr), snap(P.dk), snap(P.dkr)};
    for (int backward = 0; backward < 2; backward++) {
        size_t w = 0;
        check(spattn_sfa_workspace_size(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.tidx, c.sbs, c.mode, backward, &opt,
                                        &w) == SPATTN_STATUS_SUCCESS && w > 0,
              "%s workspace size (backward %lld)", c.name.c_str(), backward);
        void *ws = nullptr;
        CK(cudaMalloc(&ws, w));
        CK(cudaMemset(ws, 0xff, w));
        spattn_options o2 = opt;
        o2.workspace = ws;
        o2.workspace_size = w;
        bool same = false;
        if (!backward) {
            poison(P.o);
            poison(P.lse);
            check(spattn_sfa_fwd_ex(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.tidx, c.sbs, c.mode, 0.0, &P.to, &P.tlse,
                                    &o2) == SPATTN_STATUS_SUCCESS,
                  "%s fwd (caller workspace)", c.name.c_str());
            CK(cudaDeviceSynchronize());
            same = snap(P.o) == o1 && snap(P.lse) == l1;
        } else {
            Dev *outs[4] = {&P.dq, &P.dqr, &P.dk, &P.dkr};
            for (Dev *d : outs) poison(*d);
            check(spattn_sfa_bwd_ex(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.to, &P.tdo, &P.tlse, &P.tidx, c.sbs, c.mode,
                                    0.0, &P.tdq, &P.tdqr, &P.tdk, &P.tdkr, nullptr, &o2) == SPATTN_STATUS_SUCCESS,
                  "%s bwd (caller workspace)", c.name.c_str());
            CK(cudaDeviceSynchronize());
            same = true;
            for (int i = 0; i < 4; i++) same &= snap(*outs[i]) == g1[i];
        }
        check(same, "%s caller workspace (backward %lld): bitwise the pool's result", c.name.c_str(), backward);
        CK(cudaFree(ws));
    }
    // capture: refused before enqueuing anything when outputs are copied back
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    opt.cuda_stream = st;
    cudaGraph_t g = nullptr;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    spattn_status s = spattn_sfa_fwd_ex(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.tidx, c.sbs, c.mode, 0.0, &P.to,
                                        &P.tlse, &opt);
    cudaError_t ee = cudaStreamEndCapture(st, &g);
    check(s == SPATTN_STATUS_NOT_SUPPORTED && ee == cudaSuccess, "%s: captured fwd refused (status %lld)",
          c.name.c_str(), (long long)s);
    if (g) CK(cudaGraphDestroy(g));
    cudaGetLastError();
    // D 512, Dr 0: captured, replayed bitwise
    Cfg c5 = mk("pad_route_d512", 1, 40, 300, 16, 1, 16, 4, 3, SPATTN_DTYPE_BF16);
    c5.Dr = 0;
    Prob Q;
    setup(Q, c5, 43);
    check(run_fwd(Q) == SPATTN_STATUS_SUCCESS, "%s eager fwd", c5.name.c_str());
    CK(cudaDeviceSynchronize());
    const std::vector<unsigned char> o5 = snap(Q.o), l5 = snap(Q.lse);
    g = nullptr;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    s = spattn_sfa_fwd_ex(&Q.tq, nullptr, &Q.tk, nullptr, nullptr, &Q.tidx, c5.sbs, c5.mode, 0.0, &Q.to, &Q.tlse, &opt);
    ee = cudaStreamEndCapture(st, &g);
    check(s == SPATTN_STATUS_SUCCESS && ee == cudaSuccess, "%s: captured fwd (status %lld)", c5.name.c_str(),
          (long long)s);
    if (s == SPATTN_STATUS_SUCCESS && ee == cudaSuccess) {
        cudaGraphExec_t ge = nullptr;
        CK(cudaGraphInstantiate(&ge, g, 0));
        poison(Q.o);
        poison(Q.lse);
        CK(cudaDeviceSynchronize());
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        check(snap(Q.o) == o5 && snap(Q.lse) == l5, "%s: replay bitwise equal to the eager forward", c5.name.c_str());
        CK(cudaGraphExecDestroy(ge));
    }
    if (g) CK(cudaGraphDestroy(g));
    cudaGetLastError();
    CK(cudaStreamDestroy(st));
    printf("  padded Mla route (D 384 + 64, D 512): caller workspace, capture: %s\n", g_fail == before ? "ok" : "FAILED");
}

// CUDA graphs: the Hopper forward captured on a stream and replayed gives the eager call's bits;
// a bad index inside the graph leaves o / lse unwritten (no status can be returned there); the
// backward refuses (NOT_SUPPORTED) before enqueuing anything, so the capture stays valid.
static void test_graph_capture(int N1) {
    Cfg c = mk("graph", 1, 64, 256, N1, 1, 64, 1, 3, SPATTN_DTYPE_BF16);
    Prob P;
    setup(P, c, 17);
    check(run_fwd(P) == SPATTN_STATUS_SUCCESS, "graph: eager fwd%s", "");
    CK(cudaDeviceSynchronize());
    const std::vector<unsigned char> o0 = snap(P.o), l0 = snap(P.lse);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    opt.cuda_stream = st;
    auto fwd = [&]() {
        return spattn_sfa_fwd_ex(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.tidx, c.sbs, c.mode, 0.0, &P.to, &P.tlse,
                                 &opt);
    };
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    spattn_status s = fwd();
    CK(cudaStreamEndCapture(st, &g));
    check(s == SPATTN_STATUS_SUCCESS, "graph: captured fwd: status%s %lld", "", s);
    if (s == SPATTN_STATUS_SUCCESS) {
        CK(cudaGraphInstantiate(&ge, g, 0));
        poison(P.o);
        poison(P.lse);
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        check(snap(P.o) == o0 && snap(P.lse) == l0, "graph: replay bitwise equal to the eager forward%s", "");
        // a bad index: the replay writes nothing
        const int32_t bad = 1 << 30;
        CK(cudaMemcpy(P.idx.p, &bad, 4, cudaMemcpyHostToDevice));
        poison(P.o);
        const std::vector<unsigned char> po = snap(P.o);
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        check(snap(P.o) == po, "graph: a bad index leaves o unwritten%s", "");
        CK(cudaMemcpy(P.idx.p, P.hidx.data(), 4, cudaMemcpyHostToDevice));
        CK(cudaGraphExecDestroy(ge));
    }
    if (g) CK(cudaGraphDestroy(g));
    // the backward under capture (deterministic: bitwise the eager call's), then a bad index at
    // replay: dq / dq_rope / dk / dk_rope unwritten
    opt.deterministic = 1;
    auto bwd = [&]() {
        return spattn_sfa_bwd_ex(&P.tq, &P.tqr, &P.tk, &P.tkr, nullptr, &P.to, &P.tdo, &P.tlse, &P.tidx, c.sbs, c.mode,
                                 0.0, &P.tdq, &P.tdqr, &P.tdk, &P.tdkr, nullptr, &opt);
    };
    CK(cudaMemcpy(P.o.p, o0.data(), o0.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.lse.p, l0.data(), l0.size(), cudaMemcpyHostToDevice));
    s = bwd();
    CK(cudaStreamSynchronize(st));
    check(s == SPATTN_STATUS_SUCCESS, "graph: eager bwd%s %lld", "", s);
    const std::vector<unsigned char> g0[4] = {snap(P.dq), snap(P.dqr), snap(P.dk), snap(P.dkr)};
    g = nullptr;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    s = bwd();
    const cudaError_t ee = cudaStreamEndCapture(st, &g);
    check(s == SPATTN_STATUS_SUCCESS && ee == cudaSuccess, "graph: captured bwd: status %s%lld", spattn_last_error(), s);
    if (s == SPATTN_STATUS_SUCCESS && ee == cudaSuccess) {
        CK(cudaGraphInstantiate(&ge, g, 0));
        Dev *outs[4] = {&P.dq, &P.dqr, &P.dk, &P.dkr};
        for (Dev *d : outs) poison(*d);
        CK(cudaDeviceSynchronize());  // st does not wait for the legacy stream
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        bool same = true;
        for (int i = 0; i < 4; i++) same &= snap(*outs[i]) == g0[i];
        check(same, "graph: backward replay bitwise equal to the eager backward%s", "");
        const int32_t bad = 1 << 30;
        CK(cudaMemcpy(P.idx.p, &bad, 4, cudaMemcpyHostToDevice));
        for (Dev *d : outs) poison(*d);
        CK(cudaDeviceSynchronize());  // st does not wait for the legacy stream
        std::vector<unsigned char> pz[4];
        for (int i = 0; i < 4; i++) pz[i] = snap(*outs[i]);
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        same = true;
        for (int i = 0; i < 4; i++) same &= snap(*outs[i]) == pz[i];
        check(same, "graph: a bad index leaves dq / dq_rope / dk / dk_rope unwritten%s", "");
        CK(cudaMemcpy(P.idx.p, P.hidx.data(), 4, cudaMemcpyHostToDevice));
        CK(cudaGraphExecDestroy(ge));
    }
    if (g) CK(cudaGraphDestroy(g));
    cudaGetLastError();
    CK(cudaStreamDestroy(st));
    printf("  CUDA graph capture (N1 = %d): forward and backward replayed bitwise, bad index gated in both\n", N1);
}

// The early verdict: the forward returns once the index scan's result is back and runs on.  A bad
// call on one stream followed at once by a good one on another stream of the same thread (and the
// reverse): the bad one returns BAD_INDEX and writes nothing, the good one is right (each call has
// its own gate word: the second's scan cannot open or close the first's gate while its forward is
// still queued).
static void test_early_verdict(int N1) {
    Cfg c = mk("early", 1, 512, 2048, N1, 1, 512, 1, 3, SPATTN_DTYPE_BF16);
    Prob P[2];
    setup(P[0], c, 21);
    setup(P[1], c, 22);
    std::vector<unsigned char> ro[2], rl[2];
    for (int i = 0; i < 2; i++) {
        poison(P[i].o);
        poison(P[i].lse);
        check(run_fwd(P[i]) == SPATTN_STATUS_SUCCESS, "early: fwd%s", "");
        CK(cudaDeviceSynchronize());
        ro[i] = snap(P[i].o);
        rl[i] = snap(P[i].lse);
    }
    cudaStream_t s[2];
    CK(cudaStreamCreate(&s[0]));
    CK(cudaStreamCreate(&s[1]));
    for (int badfirst = 1; badfirst >= 0; badfirst--) {
        const int ib = badfirst ? 0 : 1, ig = 1 - ib;  // the bad problem, the good one
        std::vector<int32_t> bad = P[ib].hidx;
        bad[bad.size() / 2] = 1 << 30;
        CK(cudaMemcpy(P[ib].idx.p, bad.data(), P[ib].idx.n, cudaMemcpyHostToDevice));
        for (int i = 0; i < 2; i++) {
            poison(P[i].o);
            poison(P[i].lse);
        }
        const std::vector<unsigned char> o0 = snap(P[ib].o), l0 = snap(P[ib].lse);
        CK(cudaDeviceSynchronize());
        spattn_status st[2];
        st[0] = run_fwd(P[badfirst ? ib : ig], 1, s[0]);
        st[1] = run_fwd(P[badfirst ? ig : ib], 1, s[1]);
        const spattn_status sb = st[badfirst ? 0 : 1], sg = st[badfirst ? 1 : 0];
        CK(cudaDeviceSynchronize());
        check(sb == SPATTN_STATUS_BAD_INDEX, "early: the bad call's status %s%lld", "", sb);
        check(sg == SPATTN_STATUS_SUCCESS, "early: the good call's status %s%lld", "", sg);
        check(bitwise_equal(P[ib].o, o0) && bitwise_equal(P[ib].lse, l0), "early: the bad call wrote nothing%s", "");
        check(bitwise_equal(P[ig].o, ro[ig]) && bitwise_equal(P[ig].lse, rl[ig]), "early: the good call's outputs%s", "");
        CK(cudaMemcpy(P[ib].idx.p, P[ib].hidx.data(), P[ib].idx.n, cudaMemcpyHostToDevice));
    }
    CK(cudaStreamDestroy(s[0]));
    CK(cudaStreamDestroy(s[1]));
    printf("  early verdict (N1 = %d): bad + good calls on two streams kept apart\n", N1);
}

static int small_tests(bool quick) {
    std::vector<Cfg> cs;
    const int BF = SPATTN_DTYPE_BF16, FP = SPATTN_DTYPE_F16;
    cs.push_back(mk("h16_causal_split", 1, 64, 64, 16, 1, 32, 1, 3, BF));
    cs.back().concat = 0;
    cs.push_back(mk("h4_n2_pad_any_dups_concat", 2, 40, 100, 8, 2, 48, 1, 3, FP));
    cs.back().pad_any = 1;
    cs.back().dups = 1;
    // NaN in the key rows no entry selects (whole 64-key blocks loaded: the union forms at 16 and
    // 32 heads, the Mla key-major backward at 12)
    cs.push_back(mk("h16_quick_nan_rest", 1, 12, 330, 16, 1, 48, 1, 3, BF));
    cs.back().nan_rest = 1;
    cs.push_back(mk("h32_quick_nan_rest_union_bwd", 1, 12, 330, 32, 1, 48, 1, 3, FP));
    cs.back().nan_rest = 1;
    // H 12 (not a power of two: no union form): the Mla key-major backward's kused zero-fill
    cs.push_back(mk("h12_quick_nan_rest_kmaj", 1, 12, 330, 12, 1, 48, 1, 3, BF));
    cs.back().nan_rest = 1;
    // the 64-head kernels in the sanitizers' quick set too
    cs.push_back(mk("h64_quick_mode0", 1, 4, 300, 64, 1, 200, 1, 0, BF));
    cs.back().pad_any = 1;
    if (!quick) {
        cs.push_back(mk("h64_sbs4_partial_block", 1, 33, 70, 64, 1, 16, 4, 3, BF));
        cs.push_back(mk("h128_sbs2_mode0", 1, 50, 50, 128, 1, 40, 2, 0, FP));
        cs.push_back(mk("h16_n2_empty_rows_mode0", 1, 20, 300, 32, 2, 100, 1, 0, BF));
        cs.back().empty = 1;
        cs.back().pad_any = 1;
        cs.push_back(mk("h3_odd_heads_sbs8", 1, 24, 90, 6, 2, 5, 8, 3, FP));
        cs.back().dups = 1;
        cs.push_back(mk("s1_gt_s2_causal", 1, 80, 30, 32, 1, 16, 1, 3, BF));
        cs.push_back(mk("h8_strided_rows", 2, 50, 77, 8, 1, 64, 1, 3, BF));
        cs.back().row_pad = 8;
        cs.back().concat = 0;
        cs.push_back(mk("h48_sbs128", 1, 17, 500, 48, 1, 3, 128, 3, FP));
        cs.back().pad_any = 1;
        cs.push_back(mk("h64_k_gt_s2_dups", 1, 12, 20, 64, 1, 64, 1, 0, BF));
        cs.back().dups = 1;
        // the Hopper backward (H > 32): two 64-head groups per key head, GQA, B > 1, keys spread
        // over several 64-key blocks with -1 anywhere; 96 heads (one full group, one padded)
        cs.push_back(mk("h128_n2_b2_dups_pad", 2, 24, 300, 256, 2, 90, 1, 3, FP));
        cs.back().dups = 1;
        cs.back().pad_any = 1;
        cs.push_back(mk("h96_sbs16_mode0", 1, 20, 700, 96, 1, 20, 16, 0, BF));
        // a long list for the 64-head forward: 12 block pairs, the running max moving across them
        cs.push_back(mk("h64_long_list_mode0", 1, 6, 3000, 64, 1, 1500, 1, 0, FP));
        cs.back().pad_any = 1;
        // the key-major backward (H <= 32, rows selecting >= 1/8 of the keys they reach): lists of
        // several chunks (600 tokens, 4 per step at H = 8), index blocks spanning two key blocks
        // (sbs 128); a sparse selection at H <= 32 runs the token-major sfa_bwd90.cu (rows past H
        // zero), and so does H 17-32 below 0.4 of the reachable keys
        cs.push_back(mk("h8_s600_multichunk", 1, 600, 600, 8, 1, 200, 1, 3, BF));
        cs.back().dups = 1;
        cs.push_back(mk("h4_n2_sbs128", 2, 40, 500, 8, 2, 3, 128, 0, FP));
        cs.back().pad_any = 1;
        cs.push_back(mk("h16_sparse_k8_tokenmajor", 1, 30, 2000, 16, 1, 8, 1, 0, BF));
        cs.push_back(mk("h32_gqa_k200_tokenmajor", 1, 40, 1000, 64, 2, 200, 1, 3, BF));
        cs.back().dups = 1;
        cs.push_back(mk("h1_sparse_tokenmajor", 2, 25, 3000, 1, 1, 16, 1, 3, FP));
        cs.back().pad_any = 1;
        // the small-head kernel (H <= 32: keys as MMA rows): H 1, 24 (padded to 32), 32 with GQA,
        // an odd number of 64-key blocks, long index rows
        cs.push_back(mk("h1_mqa_k300_mode0", 1, 33, 400, 1, 1, 300, 1, 0, BF));
        cs.back().pad_any = 1;
        cs.push_back(mk("h24_n2_sbs16", 2, 20, 600, 48, 2, 20, 16, 3, FP));
        cs.push_back(mk("h32_n4_k700_dups", 1, 16, 2000, 128, 4, 700, 2, 3, BF));
        cs.back().dups = 1;
        // the union forward (sfa_union.cu): groups of 64 / H tokens over their union's 64-key
        // blocks.  Whole causal rows (K >= S2) with a partial last group, 16 tokens per group
        // (H 4) with an odd block count, GQA and B > 1 in mode 0, blocks of sbs keys, rows with
        // padding anywhere and empty rows, S1 > S2 (rows with no key), duplicates (their groups on
        // the gather kernels, the others on the union kernel in the same call)
        cs.push_back(mk("un_h16_dense_causal_partial", 1, 203, 203, 16, 1, 256, 1, 3, BF));
        cs.push_back(mk("un_h4_causal_k300", 1, 300, 420, 4, 1, 300, 1, 3, FP));
        cs.push_back(mk("un_h8_gqa_b2_mode0", 2, 37, 150, 16, 2, 120, 1, 0, BF));
        cs.back().pad_any = 1;
        cs.push_back(mk("un_h32_sbs16_empty", 1, 45, 900, 32, 1, 50, 16, 3, FP));
        cs.back().empty = 1;
        cs.push_back(mk("un_h16_sbs64_mode0", 1, 20, 700, 16, 1, 9, 64, 0, BF));
        cs.push_back(mk("un_h4_s1_gt_s2", 1, 90, 40, 4, 1, 40, 1, 3, BF));
        cs.push_back(mk("un_h16_dups_mixed", 1, 64, 200, 16, 1, 150, 1, 3, FP));
        cs.back().dups = 2;
        // compacted groups (the union's keys packed 64 to a block): a sparse union whose packed
        // blocks span many words (H 32), 16 tokens per group over all keys (mode 0), blocks of 4
        cs.push_back(mk("un_h32_compact_sparse", 1, 40, 4000, 32, 1, 40, 1, 3, BF));
        cs.push_back(mk("un_h4_compact_mode0", 1, 70, 2000, 4, 1, 64, 1, 0, FP));
        cs.push_back(mk("un_h16_compact_sbs4", 1, 50, 1500, 16, 1, 60, 4, 3, BF));
        cs.back().pad_any = 1;
    }
    uint64_t seed = 100;
    for (auto &c : cs) {
        int before = g_fail;
        test_case(c, seed++);
        if (selected(c)) printf("%-36s %s\n", c.name.c_str(), g_fail == before ? "ok" : "FAILED");
    }
    // the small-head forward's separate-V shapes (any H in chunks of 32 heads): D 128 without
    // rope (NSA-style), D 128 + Dr 64, D 64 (one d-tile: warpgroup 1 finalises none), D 256.  The
    // backward of all four runs sfa_bwd_kmaj.cu (key-major; heads in chunks of 32, rows of
    // 4 heads below 4, windows of the lists; D 256 with dK on one consumer, dV on the other), the
    // shared-V ones too (dV folded into dK).
    std::vector<Cfg> ns;
    // sep: a separate v; shv: shared V (V = k's first D columns) at D 128 / 256 with and without
    // rope
    auto add = [&](Cfg c, int D, int Dr, int sep_v) {
        c.D = D;
        c.Dr = Dr;
        c.sep_v = sep_v;
        ns.push_back(c);
    };
    auto sep = [&](Cfg c, int D, int Dr) { add(c, D, Dr, 1); };
    auto shv = [&](Cfg c, int D, int Dr) { add(c, D, Dr, 0); };
    auto pad = [&](Cfg c, int D, int Dr, int sep_v) {
        c.hopper = 1;
        add(c, D, Dr, sep_v);
    };
    sep(mk("nsa_quick_h8x2_sbs64", 1, 8, 400, 16, 2, 6, 64, 3, BF), 128, 0);
    sep(mk("sep_quick_d128r64_h16x2_sbs64", 1, 6, 500, 32, 2, 5, 64, 3, FP), 128, 64);
    // whole key blocks only (S2 % 64 == 0): the control for racecheck's reports on the cases above
    sep(mk("nsa_quick_h16_s512_whole_blocks", 1, 8, 512, 16, 1, 6, 64, 3, BF), 128, 0);
    // NaN in every key / value row no entry selects (a page slot no sequence uses, in a varlen
    // call): the key-major kernels load whole 64-key blocks and must not multiply them in
    sep(mk("nsa_quick_nan_rest_sbs4", 1, 8, 700, 16, 2, 24, 4, 3, FP), 128, 64);
    ns.back().nan_rest = 1;
    // D 192 (three value boxes: an odd count of output d-tiles; the backward SPLIT with dK and dV
    // on the two consumers)
    sep(mk("sep_quick_d192_h8x2_sbs32", 1, 8, 450, 16, 2, 8, 32, 3, BF), 192, 0);
    ns.back().hopper = 1;
    if (!quick) {
        // D 192 + Dr 64 (SPLIT with 4 dK boxes and 3 dV boxes), D 64 + Dr 64, D 192 in chunks
        sep(mk("sep_d192r64_h16_sbs64_m0", 1, 20, 700, 16, 1, 6, 64, 0, FP), 192, 64);
        ns.back().hopper = 1;
        sep(mk("sep_d64r64_h4x3_sbs8_b2", 2, 12, 300, 12, 3, 20, 8, 3, BF), 64, 64);
        ns.back().hopper = 1;
        sep(mk("sep_d192_h40_chunks_dups", 1, 10, 600, 40, 1, 12, 16, 3, BF), 192, 0);
        ns.back().hopper = 1;
        ns.back().dups = 1;
        sep(mk("nsa_h16x2_sbs64_k16", 1, 40, 1500, 32, 2, 16, 64, 3, BF), 128, 0);
        sep(mk("nsa_h1_b2_mode0_dups_pad", 2, 20, 300, 2, 2, 12, 8, 0, FP), 128, 0);
        ns.back().dups = 1;
        ns.back().pad_any = 1;
        sep(mk("nsa_h48_chunks_empty", 1, 24, 700, 96, 2, 20, 16, 3, BF), 128, 0);
        ns.back().empty = 1;
        sep(mk("nsa_h64_mqa_sbs128", 1, 10, 1000, 64, 1, 6, 128, 3, FP), 128, 0);
        sep(mk("nsa_h3_s1_gt_s2_strided", 1, 50, 30, 6, 2, 16, 1, 3, BF), 128, 0);
        ns.back().row_pad = 8;
        sep(mk("nsa_h32_long_list_mode0", 1, 6, 3000, 32, 1, 40, 32, 0, FP), 128, 0);
        sep(mk("sep_d128r64_h16x2_sbs64_split", 1, 30, 900, 32, 2, 12, 64, 3, BF), 128, 64);
        ns.back().concat = 0;
        sep(mk("sep_d64_h4_b2_mode0_dups", 2, 20, 300, 4, 1, 40, 4, 0, FP), 64, 0);
        ns.back().dups = 1;
        sep(mk("sep_d64_h33_chunks_empty", 1, 10, 200, 66, 2, 20, 2, 3, BF), 64, 0);
        ns.back().empty = 1;
        sep(mk("sep_d256_h40_chunks_pad", 1, 12, 500, 40, 1, 30, 8, 3, BF), 256, 0);
        ns.back().pad_any = 1;
        sep(mk("sep_d256_h8x2_sbs32_strided", 2, 16, 400, 16, 2, 10, 32, 0, FP), 256, 0);
        ns.back().row_pad = 8;
        // the key-major backward's long lists: ~32 steps a window, every stage reused many times
        sep(mk("nsa_h16_s300x1200_k8_many_steps", 1, 300, 1200, 16, 1, 8, 64, 3, BF), 128, 0);
        sep(mk("nsa_h16_s300x1200_k8_windows", 1, 300, 1200, 16, 1, 8, 64, 3, FP), 128, 0);
        ns.back().kmaj_steps = 6;
        sep(mk("sep_d128r64_h8x2_s256_k24_sbs16", 1, 256, 700, 16, 2, 24, 16, 3, FP), 128, 64);
        sep(mk("sep_d64_h2_b2_s200_mode0", 2, 200, 500, 4, 2, 10, 64, 0, BF), 64, 0);
        ns.back().dups = 1;
    }
    shv(mk("shv_quick_d128r64_h16_sbs16", 1, 8, 400, 16, 1, 8, 16, 3, BF), 128, 64);
    // D not a multiple of 64 (gated, fwd_shape): the shape of D rounded up, the last value box
    // zero-filled past D in K, V, Q and dO; O / dQ / dK / dV stored for columns < D only (the
    // poisoned outputs catch a column past D written into the next head's row).  D 40 < 64:
    // box 0 itself partial.
    pad(mk("pad_quick_d112_h8x2_sbs64", 1, 8, 400, 16, 2, 6, 64, 3, BF), 112, 0, 1);
    pad(mk("pad_quick_shv_d96r64_h16_sbs16", 1, 8, 400, 16, 1, 8, 16, 3, FP), 96, 64, 0);
    pad(mk("pad_quick_d40_h4_sbs4", 1, 12, 300, 4, 1, 20, 4, 3, FP), 40, 0, 1);
    // shared V with an odd count of value boxes (D 64 / 192 +- rope: the buffer's first half the
    // larger, D 64 without rope an empty second half) and D 256 + Dr 64 separate (the backward's
    // two stages, its partials' exchange from the key block on); gated in fwd_shape
    pad(mk("odd_quick_shv_d192r64_h8x2_sbs16", 1, 10, 500, 16, 2, 12, 16, 3, BF), 192, 64, 0);
    pad(mk("odd_quick_shv_d64_h4_sbs4", 1, 12, 300, 4, 1, 20, 4, 3, FP), 64, 0, 0);
    pad(mk("odd_quick_sep_d256r64_h16_sbs32", 1, 8, 400, 16, 1, 8, 32, 3, BF), 256, 64, 1);
    // a rope part narrower than 64 (the rope box partial): MiniCPM3's MLA (D 256 + Dr 32, shared
    // V), D 64 + Dr 32 separate
    pad(mk("rope_quick_shv_d256r32_h16_sbs1", 1, 8, 400, 16, 1, 64, 1, 3, BF), 256, 32, 0);
    pad(mk("rope_quick_sep_d64r32_h8x2_sbs16", 1, 10, 400, 16, 2, 10, 16, 3, FP), 64, 32, 1);
    // shared V wider than 256 (sfa_pad.cu: the Mla kernels on zero-padded copies): D 512 without
    // rope (q / k in place, the rope a zero row of stride 0), D 384 + 64 (q / k / o / dq / dk
    // copied, the rope in place), D 320 + 32 (every operand copied); 64+ heads (the per-token
    // kernels), 16 (the union forms), 12 (the small-head kernels)
    pad(mk("mlapad_quick_d512_h16_sbs16", 1, 8, 400, 16, 1, 8, 16, 3, BF), 512, 0, 0);
    pad(mk("mlapad_quick_d384r64_h64_sbs4", 1, 6, 300, 64, 1, 20, 4, 3, FP), 384, 64, 0);
    pad(mk("mlapad_quick_d320r32_h12_sbs1", 1, 8, 300, 12, 1, 64, 1, 0, BF), 320, 32, 0);
    // the packed columns (src/core/sfa_pack.h): a rope part wider than 64 (shared v, D + Dr <=
    // 576), a separate v as k' = [v | k | k_rope] (2 D + Dr <= 576)
    pad(mk("mlapad_quick_d128r128_h16_sbs16", 1, 8, 400, 16, 1, 8, 16, 3, BF), 128, 128, 0);
    pad(mk("mlapad_quick_sep_d288_h8x2_sbs4", 1, 10, 300, 16, 2, 20, 4, 3, FP), 288, 0, 1);
    if (!quick) {
        pad(mk("pad_d176r64_h16_sbs64_m0", 1, 20, 700, 16, 1, 6, 64, 0, FP), 176, 64, 1);
        pad(mk("pad_d240_h40_chunks_pad", 1, 12, 500, 40, 1, 30, 8, 3, BF), 240, 0, 1);
        ns.back().pad_any = 1;
        pad(mk("pad_d144_h8x2_dups", 1, 10, 600, 16, 2, 12, 16, 3, BF), 144, 0, 1);
        ns.back().dups = 1;
        pad(mk("pad_d120r64_h16x2_sbs32", 1, 16, 500, 32, 2, 10, 32, 3, BF), 120, 64, 1);
        pad(mk("pad_d8r64_h4_b2", 2, 12, 300, 12, 3, 20, 8, 3, FP), 8, 64, 1);
        pad(mk("pad_shv_d80_h8x2_b2_mode0_dups", 2, 20, 300, 16, 2, 24, 4, 0, FP), 80, 0, 0);
        ns.back().dups = 1;
        pad(mk("pad_shv_d208_h4_sbs1_strided", 1, 30, 600, 4, 1, 300, 1, 3, FP), 208, 0, 0);
        ns.back().row_pad = 8;
        pad(mk("pad_shv_d224r64_h8_empty", 1, 12, 500, 8, 1, 20, 8, 3, BF), 224, 64, 0);
        ns.back().empty = 1;
        pad(mk("odd_shv_d64r64_h40_chunks_dups", 1, 10, 400, 40, 1, 16, 8, 3, FP), 64, 64, 0);
        ns.back().dups = 1;
        pad(mk("odd_shv_d192_h16x2_b2_mode0", 2, 14, 350, 32, 2, 10, 16, 0, BF), 192, 0, 0);
        pad(mk("pad_shv_d40r64_h8_sbs64", 1, 12, 500, 8, 1, 5, 64, 3, BF), 40, 64, 0);
        pad(mk("pad_shv_d176_h4_pad", 1, 20, 600, 4, 1, 40, 8, 3, FP), 176, 0, 0);
        ns.back().pad_any = 1;
        pad(mk("pad_sep_d200r64_h40_chunks_empty", 1, 10, 500, 40, 1, 20, 16, 3, FP), 200, 64, 1);
        ns.back().empty = 1;
        pad(mk("odd_sep_d256r64_h8x2_s256_k24_sbs16", 1, 256, 700, 16, 2, 24, 16, 3, BF), 256, 64, 1);
        pad(mk("rope_sep_d104r8_h4_b2_dups", 2, 16, 300, 8, 2, 20, 4, 0, BF), 104, 8, 1);
        ns.back().dups = 1;
        pad(mk("rope_shv_d136r48_h40_chunks_strided", 1, 10, 500, 40, 1, 16, 8, 3, FP), 136, 48, 0);
        ns.back().row_pad = 8;
        pad(mk("rope_sep_d200r40_h16_empty_m0", 1, 20, 600, 16, 1, 8, 64, 0, BF), 200, 40, 1);
        ns.back().empty = 1;
        pad(mk("mlapad_d512_h128_b2_strided", 2, 8, 500, 128, 1, 24, 16, 3, BF), 512, 0, 0);
        ns.back().row_pad = 8;
        pad(mk("mlapad_d264_h4x2_dups_stride4", 1, 24, 400, 8, 2, 30, 4, 3, FP), 264, 0, 0);
        ns.back().dups = 1;
        ns.back().row_pad = 4;  // rows not 16-byte aligned: the copies' element-wise path
        pad(mk("mlapad_d448r64_h32_pad_any", 1, 16, 700, 32, 1, 40, 8, 0, BF), 448, 64, 0);
        ns.back().pad_any = 1;
        pad(mk("mlapad_d480r16_h8_empty_split", 1, 20, 600, 8, 1, 16, 32, 3, FP), 480, 16, 0);
        ns.back().empty = 1;
        ns.back().concat = 0;
        pad(mk("mlapad_d512r8_h80_chunks", 1, 6, 300, 80, 1, 12, 8, 3, BF), 512, 8, 0);
        pad(mk("mlapad_sep_d200r96_h4x2_dups", 2, 12, 300, 8, 2, 16, 8, 0, BF), 200, 96, 1);
        ns.back().dups = 1;
        pad(mk("mlapad_d320r256_h64_strided", 1, 6, 400, 64, 1, 24, 4, 3, FP), 320, 256, 0);
        ns.back().row_pad = 8;
        pad(mk("mlapad_sep_d264r48_h32_empty", 1, 12, 500, 32, 1, 30, 16, 3, BF), 264, 48, 1);
        ns.back().empty = 1;
    }
    if (!quick) {
        shv(mk("shv_d128_h8x2_b2_mode0_dups", 2, 20, 300, 16, 2, 24, 4, 0, FP), 128, 0);
        ns.back().dups = 1;
        shv(mk("shv_d256r64_h40_chunks_empty", 1, 12, 500, 40, 1, 20, 8, 3, BF), 256, 64);
        ns.back().empty = 1;
        shv(mk("shv_d256_h4_sbs1_strided", 1, 30, 600, 4, 1, 300, 1, 3, FP), 256, 0);
        ns.back().row_pad = 8;
        shv(mk("shv_d128r64_h32_long_pad", 1, 10, 900, 32, 1, 40, 32, 0, BF), 128, 64);
        ns.back().pad_any = 1;
    }
    for (auto &c : ns) {
        int before = g_fail;
        if (c.kmaj_steps) setenv("SPATTN_SFA_KMAJ_STEPS", std::to_string(c.kmaj_steps).c_str(), 1);
        if (c.hopper) setenv("SPATTN_SFA_REQUIRE_HOPPER", "1", 1);
        test_case(c, seed++, true, true);
        unsetenv("SPATTN_SFA_KMAJ_STEPS");
        unsetenv("SPATTN_SFA_REQUIRE_HOPPER");
        if (selected(c)) printf("%-36s %s\n", c.name.c_str(), g_fail == before ? "ok" : "FAILED");
    }
    if (quick && !g_only) {  // the simple kernels' backward (both modes) under the sanitizers too
        Cfg f = mk("fb_quick_sepv_fp32_d64_gqa", 1, 10, 40, 4, 2, 12, 2, 3, SPATTN_DTYPE_F32);
        f.D = 64;
        f.Dr = 0;
        f.sep_v = 1;
        int before = g_fail;
        test_case(f, seed++, true, true);
        printf("%-36s %s\n", f.name.c_str(), g_fail == before ? "ok" : "FAILED");
    }
    if (!quick && !g_only) {
        // reference kernels alone on shapes the fast path does not cover
        Cfg c = mk("ref_sep_v_fp32_d64", 1, 20, 40, 4, 2, 12, 2, 3, SPATTN_DTYPE_F32);
        c.D = 64;
        c.Dr = 16;
        c.sep_v = 1;
        c.pad_any = 1;
        int before = g_fail;
        test_case(c, seed++, false);
        Cfg c2 = mk("ref_fp16_d320_r72", 2, 9, 30, 3, 1, 7, 1, 0, FP);
        c2.D = 320;  // D past 256 other than Mla's, a rope past 64: no Hopper shape
        c2.Dr = 72;
        c2.dups = 1;
        test_case(c2, seed++, false);
        printf("%-36s %s\n", "reference kernels (sep v fp32 D 64, D 320 + Dr 72)", g_fail == before ? "ok" : "FAILED");
        test_bad_index();
        test_fallback();
        test_determinism(64);
        test_determinism(8);
        test_determinism(3);
        test_determinism(16, 128, 0, 1);
        test_determinism(16, 256, 0, 1);
        test_p32_retry(64);
        test_p32_retry(8);
        test_sorted_rows();
        test_graph_capture(16);
        test_graph_capture(64);
        test_early_verdict(16);
        test_early_verdict(64);
        test_caller_workspace(16, 150, 200);
        test_caller_workspace(4, 150, 200);
        test_caller_workspace(16, 1200, 100);
        test_pad_route();
    }
    if (g_only) printf("%d cases not matching \"%s\" skipped\n", g_skipped, g_only);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    if (g_only && g_pass + g_fail == 0) {  // a filter that ran nothing checked nothing
        printf("no case matches \"%s\"\n", g_only);
        return 1;
    }
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || !spattn_cuda_available()) {
        printf("sfa_cuda_check: no CUDA device, skipped\n");
        return 0;
    }
    if (argc > 2) g_only = argv[2];
    return small_tests(argc > 1 && !strcmp(argv[1], "quick"));
}

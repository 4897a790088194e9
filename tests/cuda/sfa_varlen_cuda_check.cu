// GPU check of the packed variable-length / paged sfa forward and backward (spattn_sfa_fwd_varlen /
// spattn_sfa_bwd_varlen on CUDA tensors).  Runs on a machine with a GPU; prints "skipped" and exits
// 0 when none is visible (not a ctest test: CI has no GPU).
//
//   sfa_varlen_cuda_check         random packed and paged batches (lengths 0, 1 and more on either
//                                 side, B > 1, -1 slots, duplicates, rows all -1, pages of 16 / 64
//                                 / 256 shuffled with NaN in every row no sequence uses and garbage
//                                 in unused table slots, modes 0 and 3, N1 4 / 16 / 64 / 128, GQA,
//                                 sbs 1 / 4 / 16, LSE as the transpose of an [N1, Tq] buffer, padded
//                                 O rows, fp32 and non-Hopper shapes through the simple kernels):
//                                   * against the CPU backend's varlen call on the same values in
//                                     fp32 (eco criterion of sfa_cuda_check),
//                                   * bitwise against one dense CUDA call per sequence (the same
//                                     kernel sees the same keys; at 4-32 heads per key head both
//                                     without the union form, whose groups differ),
//                                   * rows past cu_seqlens_q[B] untouched;
//                                 refused calls (bad index, index past the sequence's keys, bad
//                                 page id, page twice in a row, table capacity, non-monotone /
//                                 non-zero-start / too long / past-T prefix sums): BAD_INDEX, the
//                                 CPU backend's message, every output byte untouched; out-of-range
//                                 values where nothing is read (rows past cu_q[B], unused table
//                                 slots) accepted; caller workspace of the queried size (same bits)
//                                 and one byte less (refused).
//                                 Backward, the same batches plus H = 1 with heavy duplicates, H = 96,
//                                 one long sequence among short ones, pages shared by two sequences,
//                                 GQA 64 / 4, H = 128 sbs 16: O and LSE of the CPU forward, dO random
//                                 (rows past cu_q[B] NaN), outputs poisoned; deterministic and fast
//                                 mode vs the CPU backend in fp32 (dq, dq_rope of the tokens, dk,
//                                 dk_rope, dv of every key-side row: unused rows 0), dq rows past
//                                 cu_q[B] untouched, deterministic mode bitwise in 5 runs and with a
//                                 caller workspace, one byte short refused; shapes without a Hopper
//                                 kernel (fp32, D != 512, separate v) on the simple kernels, the same
//                                 checks (their deterministic mode: int64 fixed-point dK / dV);
//                                 the refusals above on the backward (both modes): same status and
//                                 message as the CPU, outputs untouched; four of the cases again
//                                 with sorted index rows forced and with the packed int32 retry
//                                 forced both ways and with the union form off (test hooks of
//                                 sfa_host.cu); a NaN in one sequence's q next to another
//                                 sequence in the packed tokens: the other's outputs stay finite.
//   sfa_varlen_cuda_check quick   a few small cases (for compute-sanitizer)
//   sfa_varlen_cuda_check bwd     the backward part only (all cases)
//   sfa_varlen_cuda_check selftest [quick|bwd]
//                                 the harness alone: every "cuda" buffer and call on the CPU (no GPU
//                                 needed; checks the checker: poison bookkeeping, views, layouts)
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

#include "check_util.h"
#include "spattn.h"


static int g_pass = 0, g_fail = 0;
static bool g_cpu_only = false;  // selftest: every "cuda" buffer and call on the CPU (no GPU needed)
static void dev_sync() {
    if (!g_cpu_only) CK(cudaDeviceSynchronize());
}
static void check(bool ok, const std::string &what) {
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        printf("FAIL: %s\n", what.c_str());
    }
}



// eco criterion (as sfa_cuda_check.cu), golden = the CPU backend in fp32
static bool eco(const std::vector<float> &a, const std::vector<float> &g, int dt, bool is_lse, double *maxe_out) {
    const EcoTol tol = eco_tol(dt, is_lse);
    const double atol = tol.atol, rtol = tol.rtol, lim = tol.lim;
    size_t ok = 0;
    bool special_bad = false;
    double maxe = 0;
    for (size_t i = 0; i < a.size(); i++) {
        const double x = a[i], y = g[i];
        if (std::isnan(y) || std::isinf(y) || std::isnan(x) || std::isinf(x)) {
            const bool m = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0));
            if (m) ok++;
            else special_bad = true;
            continue;
        }
        const double e = fabs(x - y);
        if (e <= atol + rtol * fabs(y)) ok++;
        maxe = std::max(maxe, e);
    }
    *maxe_out = maxe;
    return !special_bad && (a.empty() || (double)ok / a.size() >= 0.99) && maxe <= lim;
}

struct VCase {
    std::string name;
    int N1, N2, D, Dr, K, sbs, mode, dt;
    int page = 0;   // 0: packed keys; else page size
    int sep_v = 0;  // separate v (simple kernels)
    std::vector<int> lq, lk;
    int extra_q = 2, extra_kv = 3;  // rows past cu_q[B] / cu_kv[B] (packed)
    int lse_t = 0;                  // LSE as the transpose of an [N1, Tq] buffer
    int o_pad = 0;                  // extra elements per O row
    int share_page = 0;             // backward: two sequences share a page (prefix caching)
    int hopper = 0;                 // the Hopper kernels must take both passes (SPATTN_SFA_REQUIRE_HOPPER:
                                    // the simple kernels refuse the call)
};

// SPATTN_SFA_REQUIRE_HOPPER for the CUDA calls of a case that sets `hopper`
struct RequireHopper {
    explicit RequireHopper(const VCase &c) {
        if (c.hopper) setenv("SPATTN_SFA_REQUIRE_HOPPER", "1", 1);
    }
    ~RequireHopper() { unsetenv("SPATTN_SFA_REQUIRE_HOPPER"); }
};

// Host side of one batch: every tensor as the caller would lay it out.
struct Batch {
    VCase c;
    int B, Tq, Tkv, num_pages = 0, max_pages = 0, DQ;
    int64_t max_q, max_kv;
    std::vector<int32_t> cu_q, cu_kv, table, idx;
    std::vector<float> q, k, v;     // dtype-rounded values: q [Tq, N1, DQ], k [rows, N2, DQ], v [rows, N2, D]
    std::vector<float> kpk, vpk;    // the keys packed per sequence [sum lk, N2, ..] (dense comparison)
    std::vector<int> kpk0;          // first packed row of each sequence in kpk
    int krows;                      // rows of k: Tkv or num_pages * page
};

// The options of the golden side's calls: the CPU backend, defaults otherwise.
static spattn_options cpu_options() {
    spattn_options o;
    spattn_options_init(&o);
    o.backend = SPATTN_BACKEND_CPU;
    return o;
}

static Batch make_batch(const VCase &c, uint64_t seed) {
    Rng r(seed);
    Batch b;
    b.c = c;
    b.B = (int)c.lq.size();
    b.DQ = c.D + c.Dr;
    b.cu_q.assign(b.B + 1, 0);
    b.cu_kv.assign(b.B + 1, 0);
    int mq = 1, mk = 1;
    for (int i = 0; i < b.B; i++) {
        b.cu_q[i + 1] = b.cu_q[i] + c.lq[i];
        b.cu_kv[i + 1] = b.cu_kv[i] + c.lk[i];
        mq = std::max(mq, c.lq[i]);
        mk = std::max(mk, c.lk[i]);
    }
    b.max_q = mq + (int)r.below(3);  // generous max_seqlen sometimes
    b.max_kv = mk + (int)r.below(3);
    b.Tq = b.cu_q[b.B] + c.extra_q;
    if (b.Tq < 1) b.Tq = 1;
    const int used_kv = b.cu_kv[b.B];
    const int H2 = c.N2;
    auto gen = [&](std::vector<float> &x, size_t n) {
        x.resize(n);
        for (auto &e : x) e = round_dt(r.n(), c.dt);
    };
    gen(b.q, (size_t)b.Tq * c.N1 * b.DQ);
    gen(b.kpk, (size_t)std::max(used_kv, 1) * H2 * b.DQ);
    if (c.sep_v) gen(b.vpk, (size_t)std::max(used_kv, 1) * H2 * c.D);
    b.kpk0.assign(b.cu_kv.begin(), b.cu_kv.end());
    const float qnan = nanf("");
    if (!c.page) {
        b.Tkv = used_kv + c.extra_kv;
        if (b.Tkv < 1) b.Tkv = 1;
        b.krows = b.Tkv;
        b.k.assign((size_t)b.Tkv * H2 * b.DQ, qnan);  // rows past cu_kv[B]: NaN (must not be read)
        std::copy(b.kpk.begin(), b.kpk.begin() + (size_t)used_kv * H2 * b.DQ, b.k.begin());
        if (c.sep_v) {
            b.v.assign((size_t)b.Tkv * H2 * c.D, qnan);
            std::copy(b.vpk.begin(), b.vpk.begin() + (size_t)used_kv * H2 * c.D, b.v.begin());
        }
    } else {
        const int P = c.page;
        std::vector<int> np(b.B);
        int tot = 0;
        for (int i = 0; i < b.B; i++) {
            np[i] = (c.lk[i] + P - 1) / P;
            tot += np[i];
            b.max_pages = std::max(b.max_pages, np[i]);
        }
        b.max_pages = std::max(b.max_pages, 1) + (int)r.below(2);
        b.num_pages = tot + 1;  // one spare page nobody uses
        std::vector<int> ids(b.num_pages);
        for (int i = 0; i < b.num_pages; i++) ids[i] = i;
        for (int t = b.num_pages - 1; t > 0; t--) std::swap(ids[t], ids[r.below(t + 1)]);
        b.table.assign((size_t)b.B * b.max_pages, 0);
        int nx = 0;
        for (int i = 0; i < b.B; i++)
            for (int s = 0; s < b.max_pages; s++)  // unused slots: garbage the library must not read
                b.table[(size_t)i * b.max_pages + s] = s < np[i] ? ids[nx++] : (s & 1 ? -7 : b.num_pages + 11);
        b.krows = b.num_pages * P;
        b.Tkv = b.krows;
        b.k.assign((size_t)b.krows * H2 * b.DQ, qnan);
        if (c.sep_v) b.v.assign((size_t)b.krows * H2 * c.D, qnan);
        for (int i = 0; i < b.B; i++)
            for (int j = 0; j < c.lk[i]; j++) {
                const size_t row = (size_t)b.table[(size_t)i * b.max_pages + j / P] * P + j % P;
                const size_t src = (size_t)b.cu_kv[i] + j;
                std::copy(&b.kpk[src * H2 * b.DQ], &b.kpk[(src + 1) * H2 * b.DQ], &b.k[row * H2 * b.DQ]);
                if (c.sep_v) std::copy(&b.vpk[src * H2 * c.D], &b.vpk[(src + 1) * H2 * c.D], &b.v[row * H2 * c.D]);
            }
    }
    // indices per sequence: blocks of the sequence's own keys, -1 anywhere, duplicates, rows all -1;
    // rows past cu_q[B] hold values out of every range (must not be read)
    b.idx.assign((size_t)b.Tq * c.N2 * c.K, -1);
    for (int i = 0; i < b.B; i++) {
        const int nblk = (c.lk[i] + c.sbs - 1) / c.sbs;
        for (int t = b.cu_q[i]; t < b.cu_q[i + 1]; t++)
            for (int n = 0; n < c.N2; n++) {
                int32_t *row = &b.idx[((size_t)t * c.N2 + n) * c.K];
                if (nblk == 0 || r.below(8) == 0) continue;
                const int ti = t - b.cu_q[i];
                const int64_t lim = c.mode == 3 ? (int64_t)c.lk[i] - c.lq[i] + ti : c.lk[i] - 1;
                for (int j = 0; j < c.K; j++) {
                    if (r.below(7) == 0) continue;
                    row[j] = (int32_t)r.below(nblk);
                }
                if (lim >= 0) row[r.below(c.K)] = (int32_t)(lim / c.sbs);  // the newest allowed key
            }
    }
    for (int t = b.cu_q[b.B]; t < b.Tq; t++)
        for (int x = 0; x < c.N2 * c.K; x++) b.idx[(size_t)t * c.N2 * c.K + x] = (x & 1) ? 1 << 28 : -5;
    return b;
}

// ---- tensors ---------------------------------------------------------------------------------------
static spattn_tensor mk(void *data, int dt, std::vector<int64_t> shape, std::vector<int64_t> strides, bool cuda) {
    spattn_tensor t = spattn_tensor_make(data, (spattn_dtype)dt, (int32_t)shape.size(), shape.data(),
                                         strides.empty() ? nullptr : strides.data());
    if (cuda && !g_cpu_only) {
        t.device_type = SPATTN_DEVICE_CUDA;
        t.device_id = 0;
    }
    return t;
}

// A device buffer (selftest: host memory, 256-byte aligned like cudaMalloc's).
struct DBuf {
    void *p = nullptr;
    size_t n = 0;
    DBuf() = default;
    DBuf(const DBuf &) = delete;
    DBuf &operator=(const DBuf &) = delete;
    void release() {
        if (p) {
            if (g_cpu_only) free(p);
            else cudaFree(p);
        }
        p = nullptr;
    }
    void up(const void *h, size_t bytes) {
        release();
        n = bytes;
        if (g_cpu_only) {
            p = aligned_alloc(256, ((bytes ? bytes : 16) + 255) & ~(size_t)255);
            if (!p) exit(2);
            if (bytes) memcpy(p, h, bytes);
            return;
        }
        CK(cudaMalloc(&p, bytes ? bytes : 16));
        if (bytes) CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    }
    void fill(unsigned char byte) {
        if (g_cpu_only) memset(p, byte, n);
        else CK(cudaMemset(p, byte, n));
    }
    std::vector<unsigned char> get() const {
        std::vector<unsigned char> h(n);
        if (g_cpu_only) memcpy(h.data(), p, n);
        else CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
        return h;
    }
    ~DBuf() { release(); }
};

static std::vector<unsigned char> to_dt(const std::vector<float> &x, int dt) {
    std::vector<unsigned char> h(x.size() * esz(dt));
    for (size_t i = 0; i < x.size(); i++) store_dt(h.data(), i, x[i], dt);
    return h;
}

constexpr unsigned char SENT = 0x5b;  // every output byte before a call

// All tensors of one batch on one side (host fp32 for the CPU golden, or device in the case's dtype).
struct Side {
    bool cuda;
    int dt;
    std::vector<unsigned char> hq, hk, hv, ho, hl;  // host memory (CPU side)
    DBuf dq, dk, dv, didx, dcq, dckv, dtab, dO, dL;
    spattn_tensor q, qr, k, kr, v, idx, cq, ckv, tab, o, lse;
    spattn_varlen vl;
    size_t o_bytes, l_bytes;
};

static void build_side(const Batch &b, bool cuda, Side &s) {
    const VCase &c = b.c;
    s.cuda = cuda;
    s.dt = cuda ? c.dt : SPATTN_DTYPE_F32;
    const size_t es = esz(s.dt);
    const int64_t DQ = b.DQ, ON = c.D + c.o_pad;
    s.o_bytes = (size_t)b.Tq * c.N1 * ON * es;
    s.l_bytes = (size_t)b.Tq * c.N1 * 4;
    void *pq, *pk, *pv = nullptr, *pidx, *pcq, *pckv, *ptab = nullptr, *po, *pl;
    std::vector<unsigned char> bq = to_dt(b.q, s.dt), bk = to_dt(b.k, s.dt), bv = c.sep_v ? to_dt(b.v, s.dt) : std::vector<unsigned char>();
    if (cuda) {
        s.dq.up(bq.data(), bq.size());
        s.dk.up(bk.data(), bk.size());
        if (c.sep_v) s.dv.up(bv.data(), bv.size());
        s.didx.up(b.idx.data(), b.idx.size() * 4);
        s.dcq.up(b.cu_q.data(), b.cu_q.size() * 4);
        s.dckv.up(b.cu_kv.data(), b.cu_kv.size() * 4);
        if (c.page) s.dtab.up(b.table.data(), b.table.size() * 4);
        std::vector<unsigned char> so(s.o_bytes, SENT), sl(s.l_bytes, SENT);
        s.dO.up(so.data(), so.size());
        s.dL.up(sl.data(), sl.size());
        pq = s.dq.p, pk = s.dk.p, pv = s.dv.p, pidx = s.didx.p, pcq = s.dcq.p, pckv = s.dckv.p, ptab = s.dtab.p;
        po = s.dO.p, pl = s.dL.p;
    } else {
        s.hq = bq;
        s.hk = bk;
        s.hv = bv;
        s.ho.assign(s.o_bytes, SENT);
        s.hl.assign(s.l_bytes, SENT);
        pq = s.hq.data(), pk = s.hk.data(), pv = c.sep_v ? s.hv.data() : nullptr;
        pidx = (void *)b.idx.data(), pcq = (void *)b.cu_q.data(), pckv = (void *)b.cu_kv.data();
        ptab = c.page ? (void *)b.table.data() : nullptr;
        po = s.ho.data(), pl = s.hl.data();
    }
    s.q = mk(pq, s.dt, {b.Tq, c.N1, c.D}, {c.N1 * DQ, DQ, 1}, cuda);
    s.qr = mk((char *)pq + c.D * es, s.dt, {b.Tq, c.N1, c.Dr}, {c.N1 * DQ, DQ, 1}, cuda);
    if (c.page) {
        s.k = mk(pk, s.dt, {b.num_pages, c.page, c.N2, c.D}, {(int64_t)c.page * c.N2 * DQ, c.N2 * DQ, DQ, 1}, cuda);
        s.kr = mk((char *)pk + c.D * es, s.dt, {b.num_pages, c.page, c.N2, c.Dr},
                  {(int64_t)c.page * c.N2 * DQ, c.N2 * DQ, DQ, 1}, cuda);
        if (c.sep_v) s.v = mk(pv, s.dt, {b.num_pages, c.page, c.N2, c.D}, {}, cuda);
        s.tab = mk(ptab, SPATTN_DTYPE_I32, {b.B, b.max_pages}, {}, cuda);
    } else {
        s.k = mk(pk, s.dt, {b.Tkv, c.N2, c.D}, {c.N2 * DQ, DQ, 1}, cuda);
        s.kr = mk((char *)pk + c.D * es, s.dt, {b.Tkv, c.N2, c.Dr}, {c.N2 * DQ, DQ, 1}, cuda);
        if (c.sep_v) s.v = mk(pv, s.dt, {b.Tkv, c.N2, c.D}, {}, cuda);
    }
    s.idx = mk(pidx, SPATTN_DTYPE_I32, {b.Tq, c.N2, c.K}, {}, cuda);
    s.cq = mk(pcq, SPATTN_DTYPE_I32, {b.B + 1}, {}, cuda);
    s.ckv = mk(pckv, SPATTN_DTYPE_I32, {b.B + 1}, {}, cuda);
    s.o = mk(po, s.dt, {b.Tq, c.N1, c.D}, {c.N1 * ON, ON, 1}, cuda);
    s.lse = c.lse_t ? mk(pl, SPATTN_DTYPE_F32, {b.Tq, c.N1}, {1, b.Tq}, cuda) : mk(pl, SPATTN_DTYPE_F32, {b.Tq, c.N1}, {}, cuda);
    memset(&s.vl, 0, sizeof s.vl);
    s.vl.cu_seqlens_q = &s.cq;
    s.vl.cu_seqlens_kv = &s.ckv;
    s.vl.max_seqlen_q = b.max_q;
    s.vl.max_seqlen_kv = b.max_kv;
    s.vl.block_table = c.page ? &s.tab : nullptr;
}

static spattn_status call_fwd(const Batch &b, Side &s, const spattn_options *opt = nullptr) {
    const VCase &c = b.c;
    return spattn_sfa_fwd_varlen(&s.q, c.Dr ? &s.qr : nullptr, &s.k, c.Dr ? &s.kr : nullptr, c.sep_v ? &s.v : nullptr,
                                 &s.idx, c.sbs, c.mode, 0.0, &s.vl, &s.o, &s.lse, opt);
}

static std::vector<unsigned char> out_bytes(Side &s) {
    std::vector<unsigned char> x = s.cuda ? s.dO.get() : s.ho, y = s.cuda ? s.dL.get() : s.hl;
    x.insert(x.end(), y.begin(), y.end());
    return x;
}
static bool untouched(Side &s) {
    const std::vector<unsigned char> x = out_bytes(s);
    for (unsigned char ch : x)
        if (ch != SENT) return false;
    return true;
}
static void reset_out(Side &s) {
    if (s.cuda) {
        s.dO.fill(SENT);
        s.dL.fill(SENT);
    } else {
        std::fill(s.ho.begin(), s.ho.end(), SENT);
        std::fill(s.hl.begin(), s.hl.end(), SENT);
    }
}

// O / LSE of tokens [0, cu_q[B]) as floats (token-major, [t][n][d] and [t][n])
static void read_out(const Batch &b, Side &s, std::vector<float> &o, std::vector<float> &l) {
    const VCase &c = b.c;
    const int ON = c.D + c.o_pad, T = b.cu_q[b.B];
    const std::vector<unsigned char> ob = s.cuda ? s.dO.get() : s.ho, lb = s.cuda ? s.dL.get() : s.hl;
    o.resize((size_t)T * c.N1 * c.D);
    l.resize((size_t)T * c.N1);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < c.N1; n++) {
            for (int d = 0; d < c.D; d++)
                o[((size_t)t * c.N1 + n) * c.D + d] = load_dt(ob.data(), ((size_t)t * c.N1 + n) * ON + d, s.dt);
            const size_t li = c.lse_t ? (size_t)n * b.Tq + t : (size_t)t * c.N1 + n;
            memcpy(&l[(size_t)t * c.N1 + n], lb.data() + li * 4, 4);
        }
}

// The bytes of the outputs outside tokens [0, cu_q[B]) (and O row padding) must stay SENT.
static bool rest_untouched(const Batch &b, Side &s) {
    const VCase &c = b.c;
    const int ON = c.D + c.o_pad, T = b.cu_q[b.B];
    const size_t es = esz(s.dt);
    const std::vector<unsigned char> ob = s.dO.get(), lb = s.dL.get();
    for (int t = 0; t < b.Tq; t++)
        for (int n = 0; n < c.N1; n++) {
            const size_t row = ((size_t)t * c.N1 + n) * ON * es;
            const size_t d0 = t < T ? (size_t)c.D * es : 0;
            for (size_t x = d0; x < (size_t)ON * es; x++)
                if (ob[row + x] != SENT) return false;
            if (t >= T) {
                const size_t li = c.lse_t ? (size_t)n * b.Tq + t : (size_t)t * c.N1 + n;
                for (int x = 0; x < 4; x++)
                    if (lb[li * 4 + x] != SENT) return false;
            }
        }
    return true;
}

// One dense CUDA call per sequence (lq, lk >= 1) on the same values; its O / LSE bits must equal
// the varlen call's rows.  Keys packed per sequence (pages gathered on the host).
static bool dense_matches(const Batch &b, Side &g, std::string &why) {
    const VCase &c = b.c;
    const size_t es = esz(c.dt);
    const int64_t DQ = b.DQ;
    std::vector<float> og, lg;
    read_out(b, g, og, lg);
    for (int i = 0; i < b.B; i++) {
        const int lq = c.lq[i], lk = c.lk[i];
        if (lq < 1 || lk < 1) continue;
        std::vector<float> ks(b.kpk.begin() + (size_t)b.cu_kv[i] * c.N2 * DQ, b.kpk.begin() + (size_t)(b.cu_kv[i] + lk) * c.N2 * DQ);
        std::vector<unsigned char> kb = to_dt(ks, c.dt), vb;
        DBuf dk, dv, dO, dL;
        dk.up(kb.data(), kb.size());
        if (c.sep_v) {
            std::vector<float> vs(b.vpk.begin() + (size_t)b.cu_kv[i] * c.N2 * c.D, b.vpk.begin() + (size_t)(b.cu_kv[i] + lk) * c.N2 * c.D);
            vb = to_dt(vs, c.dt);
            dv.up(vb.data(), vb.size());
        }
        std::vector<unsigned char> z((size_t)lq * c.N1 * c.D * es, 0), zl((size_t)lq * c.N1 * 4, 0);
        dO.up(z.data(), z.size());
        dL.up(zl.data(), zl.size());
        char *qb = (char *)g.dq.p + (size_t)b.cu_q[i] * c.N1 * DQ * es;
        spattn_tensor q = mk(qb, c.dt, {1, lq, c.N1, c.D}, {lq * c.N1 * DQ, c.N1 * DQ, DQ, 1}, true);
        spattn_tensor qr = mk(qb + c.D * es, c.dt, {1, lq, c.N1, c.Dr}, {lq * c.N1 * DQ, c.N1 * DQ, DQ, 1}, true);
        spattn_tensor k = mk(dk.p, c.dt, {1, lk, c.N2, c.D}, {lk * c.N2 * DQ, c.N2 * DQ, DQ, 1}, true);
        spattn_tensor kr = mk((char *)dk.p + c.D * es, c.dt, {1, lk, c.N2, c.Dr}, {lk * c.N2 * DQ, c.N2 * DQ, DQ, 1}, true);
        spattn_tensor v = mk(dv.p, c.dt, {1, lk, c.N2, c.D}, {}, true);
        spattn_tensor ix = mk((int32_t *)g.didx.p + (size_t)b.cu_q[i] * c.N2 * c.K, SPATTN_DTYPE_I32, {1, lq, c.N2, c.K}, {}, true);
        spattn_tensor o = mk(dO.p, c.dt, {1, lq, c.N1, c.D}, {}, true);
        spattn_tensor l = mk(dL.p, SPATTN_DTYPE_F32, {1, lq, c.N1}, {}, true);
        const spattn_status st = spattn_sfa_fwd(&q, c.Dr ? &qr : nullptr, &k, c.Dr ? &kr : nullptr, c.sep_v ? &v : nullptr, &ix,
                                                c.sbs, c.mode, 0.0, &o, &l);
        if (st != SPATTN_STATUS_SUCCESS) {
            why = "dense call of sequence " + std::to_string(i) + ": " + spattn_last_error();
            return false;
        }
        const std::vector<unsigned char> ob = dO.get(), lb = dL.get();
        for (int t = 0; t < lq; t++)
            for (int n = 0; n < c.N1; n++) {
                const size_t vr = ((size_t)(b.cu_q[i] + t) * c.N1 + n);
                for (int d = 0; d < c.D; d++) {
                    const float x = load_dt(ob.data(), ((size_t)t * c.N1 + n) * c.D + d, c.dt), y = og[vr * c.D + d];
                    if (memcmp(&x, &y, 4) != 0) {
                        why = "sequence " + std::to_string(i) + " token " + std::to_string(t) + " head " + std::to_string(n) +
                              " O[" + std::to_string(d) + "]: dense " + std::to_string(x) + " varlen " + std::to_string(y);
                        return false;
                    }
                }
                float x;
                memcpy(&x, lb.data() + ((size_t)t * c.N1 + n) * 4, 4);
                if (memcmp(&x, &lg[vr], 4) != 0) {
                    why = "sequence " + std::to_string(i) + " LSE differs";
                    return false;
                }
            }
    }
    return true;
}

static std::string tag_of(const VCase &c) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s [B=%zu N1=%d N2=%d D=%d+%d K=%d sbs=%d mode=%d %s %s%s]", c.name.c_str(), c.lq.size(), c.N1,
             c.N2, c.D, c.Dr, c.K, c.sbs, c.mode, dt_name(c.dt), c.page ? ("page " + std::to_string(c.page)).c_str() : "packed",
             c.sep_v ? " sep-v" : "");
    return buf;
}

static void run_case(const VCase &c, uint64_t seed) {
    const RequireHopper rh(c);
    const std::string tag = tag_of(c);
    Batch b = make_batch(c, seed);
    Side h, g;
    build_side(b, false, h);
    build_side(b, true, g);
    const spattn_options cpu = cpu_options();
    spattn_status sh = call_fwd(b, h, &cpu);
    check(sh == SPATTN_STATUS_SUCCESS, tag + ": CPU golden: " + spattn_last_error());
    spattn_status sg = call_fwd(b, g);
    check(sg == SPATTN_STATUS_SUCCESS, tag + ": CUDA: " + spattn_last_error());
    dev_sync();
    if (sh != SPATTN_STATUS_SUCCESS || sg != SPATTN_STATUS_SUCCESS) return;
    std::vector<float> oh, lh, og, lg;
    read_out(b, h, oh, lh);
    read_out(b, g, og, lg);
    double e1 = 0, e2 = 0;
    const bool ok_o = eco(og, oh, c.dt, false, &e1), ok_l = eco(lg, lh, c.dt, true, &e2);
    check(ok_o, tag + ": O vs CPU (max err " + std::to_string(e1) + ")");
    check(ok_l, tag + ": LSE vs CPU (max err " + std::to_string(e2) + ")");
    check(rest_untouched(b, g), tag + ": rows past cu_seqlens_q[B] / O row padding written");
    // caller workspace of the queried size: same bits; one byte less: refused, nothing written
    size_t ws = 0;
    spattn_status sw = spattn_sfa_varlen_workspace_size(&g.q, c.Dr ? &g.qr : nullptr, &g.k, c.Dr ? &g.kr : nullptr,
                                                        c.sep_v ? &g.v : nullptr, &g.idx, c.sbs, c.mode, &g.vl, 0, nullptr, &ws);
    check(sw == SPATTN_STATUS_SUCCESS && ws > 0, tag + ": workspace query: " + spattn_last_error());
    if (sw == SPATTN_STATUS_SUCCESS && ws > 0) {
        const std::vector<unsigned char> first = out_bytes(g);
        DBuf w;
        std::vector<unsigned char> junk(ws, 0xa7);
        w.up(junk.data(), ws);
        spattn_options o;
        spattn_options_init(&o);
        o.workspace = w.p;
        o.workspace_size = ws;
        reset_out(g);
        check(call_fwd(b, g, &o) == SPATTN_STATUS_SUCCESS && out_bytes(g) == first,
              tag + ": caller workspace gives other bits: " + spattn_last_error());
        o.workspace_size = ws - 1;
        reset_out(g);
        check(call_fwd(b, g, &o) == SPATTN_STATUS_WORKSPACE_TOO_SMALL && untouched(g),
              tag + ": workspace one byte short not refused cleanly");
    }
    // bitwise one dense call per sequence, with the per-token kernels on both sides where the
    // union form could run (4-32 heads per key head, Mla shape): its groups differ between the
    // packed call (windows of packed tokens, blocks of key-side rows) and a dense call (the
    // sequence's own windows and keys), and so may the last bits; that form is checked against
    // the CPU above
    const int H = c.N1 / c.N2;
    const bool un = c.D == 512 && c.Dr == 64 && !c.sep_v && c.dt != SPATTN_DTYPE_F32 && (H == 4 || H == 8 || H == 16 || H == 32) &&
                    c.sbs <= 64;
    const char *prev = getenv("SPATTN_SFA_UNION");
    const std::string keep = prev ? prev : "";
    // (the call again: the refused call above left the outputs poisoned)
    if (un) setenv("SPATTN_SFA_UNION", "0", 1);
    reset_out(g);
    check(call_fwd(b, g) == SPATTN_STATUS_SUCCESS, tag + ": CUDA call for the dense comparison: " + spattn_last_error());
    dev_sync();
    std::string why;
    const bool same = dense_matches(b, g, why);  // before the message is built: it holds why
    check(same, tag + ": not bitwise one dense call per sequence: " + why);
    if (un) {
        if (prev) setenv("SPATTN_SFA_UNION", keep.c_str(), 1);
        else unsetenv("SPATTN_SFA_UNION");
    }
}

// A refused (or, with expect_ok, accepted) mutation of the base batch on both backends: the same
// status and message, and on refusal every output byte untouched.
static void expect_mut(const VCase &c, uint64_t seed, const char *what, bool expect_ok,
                       void (*mut)(Batch &b)) {
    Batch b = make_batch(c, seed);
    mut(b);
    Side h, g;
    build_side(b, false, h);
    build_side(b, true, g);
    const spattn_options cpu = cpu_options();
    const spattn_status sh = call_fwd(b, h, &cpu);
    const std::string mh = spattn_last_error();
    const spattn_status sg = call_fwd(b, g);
    const std::string mg = spattn_last_error();
    dev_sync();
    const std::string tag = tag_of(c) + " / " + what;
    if (expect_ok) {
        check(sh == SPATTN_STATUS_SUCCESS && sg == SPATTN_STATUS_SUCCESS, tag + ": should pass: cpu '" + mh + "' cuda '" + mg + "'");
        return;
    }
    check(sh == SPATTN_STATUS_BAD_INDEX, tag + ": CPU status " + std::to_string(sh) + " (" + mh + ")");
    check(sg == SPATTN_STATUS_BAD_INDEX, tag + ": CUDA status " + std::to_string(sg) + " (" + mg + ")");
    check(untouched(g), tag + ": CUDA wrote outputs of a refused call");
    check(mg == mh, tag + ": messages differ:\n   cpu:  " + mh + "\n   cuda: " + mg);
}

static int first_seq(const Batch &b, bool need_q, bool need_kv, int min_pages = 0) {
    for (int i = 0; i < b.B; i++)
        if ((!need_q || b.c.lq[i] > 0) && (!need_kv || b.c.lk[i] > 0) &&
            (!min_pages || (b.c.lk[i] + b.c.page - 1) / b.c.page >= min_pages))
            return i;
    return -1;
}

// The refusals, through the forward (expect_mut) or the backward (expect_mut_bwd): both run the
// same device checks of the layout and the indices.
using ExpectFn = void (*)(const VCase &, uint64_t, const char *, bool, void (*)(Batch &));
static void refusals(const VCase &c, uint64_t seed, ExpectFn expect_mut) {
    expect_mut(c, seed, "index = the sequence's block count", false, [](Batch &b) {
        const int i = first_seq(b, true, true);
        const int t = b.cu_q[i] + b.c.lq[i] - 1;
        b.idx[((size_t)t * b.c.N2 + b.c.N2 - 1) * b.c.K + b.c.K / 2] = (b.c.lk[i] + b.c.sbs - 1) / b.c.sbs;
    });
    expect_mut(c, seed, "index -2", false, [](Batch &b) {
        const int i = first_seq(b, true, false);
        b.idx[(size_t)b.cu_q[i] * b.c.N2 * b.c.K + b.c.K - 1] = -2;
    });
    expect_mut(c, seed, "index of a sequence with no keys", false, [](Batch &b) {
        for (int i = 0; i < b.B; i++)
            if (b.c.lq[i] > 0 && b.c.lk[i] == 0) {
                b.idx[(size_t)b.cu_q[i] * b.c.N2 * b.c.K] = 0;
                return;
            }
        b.idx[0] = 1 << 30;  // no such sequence: any out-of-range value
    });
    expect_mut(c, seed, "cu_seqlens_q decreasing", false, [](Batch &b) { b.cu_q[1] = b.cu_q[2] + 1; });
    expect_mut(c, seed, "cu_seqlens_q[0] != 0", false, [](Batch &b) { b.cu_q[0] = 1; });
    expect_mut(c, seed, "cu_seqlens_q[B] > Tq", false, [](Batch &b) { b.cu_q[b.B] = b.Tq + 1; b.max_q = 1 << 20; });
    expect_mut(c, seed, "length > max_seqlen_kv", false, [](Batch &b) {
        int mk = 0;
        for (int x : b.c.lk) mk = std::max(mk, x);
        b.max_kv = mk - 1;
    });
    expect_mut(c, seed, "cu_seqlens_kv decreasing", false, [](Batch &b) { b.cu_kv[b.B - 1] = b.cu_kv[b.B] + 1; });
    if (!c.page) {
        expect_mut(c, seed, "cu_seqlens_kv[B] > Tkv", false, [](Batch &b) {
            b.cu_kv[b.B] = b.Tkv + 1;
            b.max_kv = 1 << 20;
        });
    } else {
        expect_mut(c, seed, "page id = num_pages", false, [](Batch &b) {
            const int i = first_seq(b, false, true);
            b.table[(size_t)i * b.max_pages] = b.num_pages;
        });
        expect_mut(c, seed, "page id -1 in a used slot", false, [](Batch &b) {
            const int i = first_seq(b, false, true);
            const int np = (b.c.lk[i] + b.c.page - 1) / b.c.page;
            b.table[(size_t)i * b.max_pages + np - 1] = -1;
        });
        expect_mut(c, seed, "page twice in a row", false, [](Batch &b) {
            const int i = first_seq(b, false, true, 2);
            if (i < 0) {  // no sequence with 2 pages: make one reuse page 0's id of another row instead
                b.table[0] = -3;
                return;
            }
            b.table[(size_t)i * b.max_pages + 1] = b.table[(size_t)i * b.max_pages];
        });
        expect_mut(c, seed, "table capacity", false, [](Batch &b) {
            b.cu_kv[b.B] += b.max_pages * b.c.page;
            b.max_kv = 1 << 24;
        });
        expect_mut(c, seed, "garbage in unused slots (accepted)", true, [](Batch &b) {
            for (int i = 0; i < b.B; i++)
                for (int s = (b.c.lk[i] + b.c.page - 1) / b.c.page; s < b.max_pages; s++)
                    b.table[(size_t)i * b.max_pages + s] = (int32_t)0x80000000u + s;
        });
    }
    if (c.extra_q > 0)
        expect_mut(c, seed, "bad indices past cu_seqlens_q[B] (accepted)", true, [](Batch &) {});
}

// ---- backward ----------------------------------------------------------------------------------------
// The Hopper kernels' shapes (others run on the simple kernels).
static bool bwd_fast(const VCase &c) {
    return c.dt != SPATTN_DTYPE_F32 && c.D == 512 && c.Dr == 64 && !c.sep_v;
}

// The backward's tensors of one side: inputs o, dout, lse (the same values on both sides, rows
// past cu_seqlens_q[B] NaN: never read) and the outputs dq | dq_rope as views of one [Tq, N1, D+Dr]
// buffer, dk | dk_rope of one key-side buffer (packed or pages, as k), dv with separate v.
struct BOut {
    bool cuda;
    int dt;
    DBuf dO, dI, dL, dQ, dK, dV;                         // cuda side (selftest: host)
    std::vector<unsigned char> hO, hI, hL, hQ, hK, hV;   // CPU side
    spattn_tensor o, dout, lse, dq, dqr, dk, dkr, dv;
    size_t q_bytes, k_bytes, v_bytes;
};

// Backward inputs shared by both sides: O and LSE of the CPU forward (O rounded to the dtype), dO.
struct BIn {
    std::vector<float> o, dout, lse;  // [Tq, N1, D], [Tq, N1, D], [Tq, N1]
};

static BIn make_bin(const Batch &b, Side &h, uint64_t seed) {
    const VCase &c = b.c;
    BIn in;
    const int T = b.cu_q[b.B];
    std::vector<float> oh, lh;
    read_out(b, h, oh, lh);
    const float qnan = nanf("");
    in.o.assign((size_t)b.Tq * c.N1 * c.D, qnan);
    in.dout.assign((size_t)b.Tq * c.N1 * c.D, qnan);
    in.lse.assign((size_t)b.Tq * c.N1, qnan);
    Rng r(seed * 7919 + 13);
    for (size_t i = 0; i < (size_t)T * c.N1 * c.D; i++) {
        in.o[i] = round_dt(oh[i], c.dt);
        in.dout[i] = round_dt(r.n(), c.dt);
    }
    for (size_t i = 0; i < (size_t)T * c.N1; i++) in.lse[i] = lh[i];
    return in;
}

static void build_bout(const Batch &b, const BIn &in, bool cuda, BOut &o) {
    const VCase &c = b.c;
    o.cuda = cuda;
    o.dt = cuda ? c.dt : SPATTN_DTYPE_F32;
    const size_t es = esz(o.dt);
    const int64_t DQ = b.DQ;
    o.q_bytes = (size_t)b.Tq * c.N1 * DQ * es;
    o.k_bytes = (size_t)b.krows * c.N2 * DQ * es;
    o.v_bytes = c.sep_v ? (size_t)b.krows * c.N2 * c.D * es : 0;
    const std::vector<unsigned char> bo = to_dt(in.o, o.dt), bd = to_dt(in.dout, o.dt);
    std::vector<unsigned char> bl(in.lse.size() * 4);
    memcpy(bl.data(), in.lse.data(), bl.size());
    const std::vector<unsigned char> sq(o.q_bytes, SENT), sk(o.k_bytes, SENT), sv(o.v_bytes, SENT);
    void *po, *pd, *pl, *pq, *pk, *pv;
    if (cuda) {
        o.dO.up(bo.data(), bo.size());
        o.dI.up(bd.data(), bd.size());
        o.dL.up(bl.data(), bl.size());
        o.dQ.up(sq.data(), sq.size());
        o.dK.up(sk.data(), sk.size());
        o.dV.up(sv.data(), sv.size());
        po = o.dO.p, pd = o.dI.p, pl = o.dL.p, pq = o.dQ.p, pk = o.dK.p, pv = o.dV.p;
    } else {
        o.hO = bo, o.hI = bd, o.hL = bl, o.hQ = sq, o.hK = sk, o.hV = sv;
        po = o.hO.data(), pd = o.hI.data(), pl = o.hL.data(), pq = o.hQ.data(), pk = o.hK.data(), pv = o.hV.data();
    }
    o.o = mk(po, o.dt, {b.Tq, c.N1, c.D}, {}, cuda);
    o.dout = mk(pd, o.dt, {b.Tq, c.N1, c.D}, {}, cuda);
    o.lse = mk(pl, SPATTN_DTYPE_F32, {b.Tq, c.N1}, {}, cuda);
    o.dq = mk(pq, o.dt, {b.Tq, c.N1, c.D}, {c.N1 * DQ, DQ, 1}, cuda);
    o.dqr = mk((char *)pq + c.D * es, o.dt, {b.Tq, c.N1, c.Dr}, {c.N1 * DQ, DQ, 1}, cuda);
    if (c.page) {
        o.dk = mk(pk, o.dt, {b.num_pages, c.page, c.N2, c.D}, {(int64_t)c.page * c.N2 * DQ, c.N2 * DQ, DQ, 1}, cuda);
        o.dkr = mk((char *)pk + c.D * es, o.dt, {b.num_pages, c.page, c.N2, c.Dr},
                   {(int64_t)c.page * c.N2 * DQ, c.N2 * DQ, DQ, 1}, cuda);
        o.dv = mk(pv, o.dt, {b.num_pages, c.page, c.N2, c.D}, {}, cuda);
    } else {
        o.dk = mk(pk, o.dt, {b.Tkv, c.N2, c.D}, {c.N2 * DQ, DQ, 1}, cuda);
        o.dkr = mk((char *)pk + c.D * es, o.dt, {b.Tkv, c.N2, c.Dr}, {c.N2 * DQ, DQ, 1}, cuda);
        o.dv = mk(pv, o.dt, {b.Tkv, c.N2, c.D}, {}, cuda);
    }
}

static spattn_status call_bwd(const Batch &b, Side &s, BOut &o, const spattn_options *opt) {
    const VCase &c = b.c;
    return spattn_sfa_bwd_varlen(&s.q, c.Dr ? &s.qr : nullptr, &s.k, c.Dr ? &s.kr : nullptr, c.sep_v ? &s.v : nullptr, &o.o,
                                 &o.dout, &o.lse, &s.idx, c.sbs, c.mode, 0.0, &s.vl, &o.dq, c.Dr ? &o.dqr : nullptr, &o.dk,
                                 c.Dr ? &o.dkr : nullptr, c.sep_v ? &o.dv : nullptr, opt);
}

static std::vector<unsigned char> bout_bytes(const BOut &o) {
    std::vector<unsigned char> x = o.cuda ? o.dQ.get() : o.hQ, y = o.cuda ? o.dK.get() : o.hK,
                               z = o.cuda ? o.dV.get() : o.hV;
    x.insert(x.end(), y.begin(), y.end());
    x.insert(x.end(), z.begin(), z.end());
    return x;
}
static void bout_reset(BOut &o) {
    if (o.cuda) {
        o.dQ.fill(SENT);
        o.dK.fill(SENT);
        o.dV.fill(SENT);
    } else {
        std::fill(o.hQ.begin(), o.hQ.end(), SENT);
        std::fill(o.hK.begin(), o.hK.end(), SENT);
        std::fill(o.hV.begin(), o.hV.end(), SENT);
    }
}
static bool bout_untouched(const BOut &o) {
    for (unsigned char ch : bout_bytes(o))
        if (ch != SENT) return false;
    return true;
}

// The gradients as floats: dq / dq_rope of tokens [0, cu_q[B]), dk / dk_rope / dv of every
// key-side row (rows no sequence uses must be 0 on both sides).
struct BGrad {
    std::vector<float> dq, dqr, dk, dkr, dv;
};
static BGrad read_grad(const Batch &b, const BOut &o) {
    const VCase &c = b.c;
    const int T = b.cu_q[b.B], DQ = b.DQ;
    const std::vector<unsigned char> qb = o.cuda ? o.dQ.get() : o.hQ, kb = o.cuda ? o.dK.get() : o.hK,
                                     vb = o.cuda ? o.dV.get() : o.hV;
    BGrad g;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < c.N1; n++)
            for (int d = 0; d < DQ; d++) {
                const float x = load_dt(qb.data(), ((size_t)t * c.N1 + n) * DQ + d, o.dt);
                (d < c.D ? g.dq : g.dqr).push_back(x);
            }
    for (int r = 0; r < b.krows; r++)
        for (int n = 0; n < c.N2; n++) {
            for (int d = 0; d < DQ; d++) {
                const float x = load_dt(kb.data(), ((size_t)r * c.N2 + n) * DQ + d, o.dt);
                (d < c.D ? g.dk : g.dkr).push_back(x);
            }
            if (c.sep_v)
                for (int d = 0; d < c.D; d++) g.dv.push_back(load_dt(vb.data(), ((size_t)r * c.N2 + n) * c.D + d, o.dt));
        }
    return g;
}
// dq rows of tokens past cu_q[B] untouched
static bool bout_rest_untouched(const Batch &b, const BOut &o) {
    const VCase &c = b.c;
    const std::vector<unsigned char> qb = o.cuda ? o.dQ.get() : o.hQ;
    const size_t from = (size_t)b.cu_q[b.B] * c.N1 * b.DQ * esz(o.dt);
    for (size_t i = from; i < qb.size(); i++)
        if (qb[i] != SENT) return false;
    return true;
}

static void compare_grad(const std::string &tag, const VCase &c, const BGrad &g, const BGrad &h) {
    const char *names[5] = {"dq", "dq_rope", "dk", "dk_rope", "dv"};
    const std::vector<float> *gs[5] = {&g.dq, &g.dqr, &g.dk, &g.dkr, &g.dv}, *hs[5] = {&h.dq, &h.dqr, &h.dk, &h.dkr, &h.dv};
    for (int i = 0; i < 5; i++) {
        double e = 0;
        check(gs[i]->size() == hs[i]->size() && eco(*gs[i], *hs[i], c.dt, false, &e),
              tag + ": " + names[i] + " vs CPU (max err " + std::to_string(e) + ")");
    }
}

static void run_bwd_case(const VCase &c, uint64_t seed, bool repeat) {
    const RequireHopper rh(c);
    const std::string tag = tag_of(c) + " bwd";
    Batch b = make_batch(c, seed);
    if (c.share_page) {  // sequence 1's first page is sequence 0's (prefix caching); its own stays unused
        int i0 = -1, i1 = -1;
        for (int i = 0; i < b.B; i++)
            if (c.lk[i] >= c.page) {
                if (i0 < 0) i0 = i;
                else if (i1 < 0) i1 = i;
            }
        if (i1 >= 0) b.table[(size_t)i1 * b.max_pages] = b.table[(size_t)i0 * b.max_pages];
    }
    Side h, g;
    build_side(b, false, h);
    build_side(b, true, g);
    const spattn_options cpu = cpu_options();
    if (call_fwd(b, h, &cpu) != SPATTN_STATUS_SUCCESS) {
        check(false, tag + ": CPU forward: " + spattn_last_error());
        return;
    }
    const BIn in = make_bin(b, h, seed);
    BOut bh, bg;
    build_bout(b, in, false, bh);
    build_bout(b, in, true, bg);
    const spattn_status sh = call_bwd(b, h, bh, &cpu);
    check(sh == SPATTN_STATUS_SUCCESS, tag + ": CPU golden: " + spattn_last_error());
    if (sh != SPATTN_STATUS_SUCCESS) return;
    const BGrad gh = read_grad(b, bh);
    const bool fast = bwd_fast(c) || g_cpu_only;
    size_t ws = 0;
    const spattn_status sw = spattn_sfa_varlen_workspace_size(&g.q, c.Dr ? &g.qr : nullptr, &g.k, c.Dr ? &g.kr : nullptr,
                                                              c.sep_v ? &g.v : nullptr, &g.idx, c.sbs, c.mode, &g.vl, 1,
                                                              nullptr, &ws);
    check(sw == SPATTN_STATUS_SUCCESS && ws > 0, tag + ": workspace query: " + spattn_last_error());
    std::vector<unsigned char> first;
    for (int det = 1; det >= 0; det--) {
        spattn_options o;
        spattn_options_init(&o);
        o.deterministic = det;
        const std::string dtag = tag + (det ? " det" : " fast");
        bout_reset(bg);
        const spattn_status sg = call_bwd(b, g, bg, &o);
        const std::string msg = spattn_last_error();
        dev_sync();
        check(sg == SPATTN_STATUS_SUCCESS, dtag + (fast ? "" : " (simple kernels)") + ": CUDA: " + msg);
        if (sg != SPATTN_STATUS_SUCCESS) continue;
        compare_grad(dtag, c, read_grad(b, bg), gh);
        check(bout_rest_untouched(b, bg), dtag + ": dq rows past cu_seqlens_q[B] written");
        if (!det) continue;
        first = bout_bytes(bg);
        for (int rep = 1; repeat && rep < 5; rep++) {  // bitwise reproducible (5 runs)
            bout_reset(bg);
            const spattn_status s2 = call_bwd(b, g, bg, &o);
            check(s2 == SPATTN_STATUS_SUCCESS && bout_bytes(bg) == first,
                  dtag + ": run " + std::to_string(rep + 1) + " not bitwise the first: " + spattn_last_error());
        }
        // caller workspace of the queried size: the same bits; one byte less: refused, nothing written
        if (sw == SPATTN_STATUS_SUCCESS && ws > 0) {
            DBuf w;
            std::vector<unsigned char> junk(ws, 0xa7);
            w.up(junk.data(), ws);
            spattn_options ow = o;
            ow.workspace = w.p;
            ow.workspace_size = ws;
            bout_reset(bg);
            check(call_bwd(b, g, bg, &ow) == SPATTN_STATUS_SUCCESS && bout_bytes(bg) == first,
                  dtag + ": caller workspace gives other bits: " + spattn_last_error());
            ow.workspace_size = ws - 1;
            bout_reset(bg);
            check(call_bwd(b, g, bg, &ow) == SPATTN_STATUS_WORKSPACE_TOO_SMALL && bout_untouched(bg),
                  dtag + ": workspace one byte short not refused cleanly");
        }
    }
}

// A refused (or, with expect_ok, accepted) mutation for the backward, on both backends: the same
// status and message, and on refusal every output byte untouched.
static void expect_mut_bwd(const VCase &c, uint64_t seed, const char *what, bool expect_ok, void (*mut)(Batch &b)) {
    Batch b = make_batch(c, seed);
    mut(b);
    Side h, g;
    build_side(b, false, h);
    build_side(b, true, g);
    BIn in;
    in.o.assign((size_t)b.Tq * c.N1 * c.D, 0.25f);
    in.dout.assign((size_t)b.Tq * c.N1 * c.D, -0.5f);
    in.lse.assign((size_t)b.Tq * c.N1, 1.0f);
    BOut bh, bg;
    build_bout(b, in, false, bh);
    build_bout(b, in, true, bg);
    const spattn_options cpu = cpu_options();
    const spattn_status sh = call_bwd(b, h, bh, &cpu);
    const std::string mh = spattn_last_error();
    for (int det = 1; det >= 0; det--) {
        spattn_options o;
        spattn_options_init(&o);
        o.deterministic = det;
        bout_reset(bg);
        const spattn_status sg = call_bwd(b, g, bg, &o);
        const std::string mg = spattn_last_error();
        dev_sync();
        const std::string tag = tag_of(c) + " bwd" + (det ? " det" : " fast") + " / " + what;
        if (expect_ok) {
            check(sh == SPATTN_STATUS_SUCCESS && sg == SPATTN_STATUS_SUCCESS,
                  tag + ": should pass: cpu '" + mh + "' cuda '" + mg + "'");
            continue;
        }
        check(sh == SPATTN_STATUS_BAD_INDEX, tag + ": CPU status " + std::to_string(sh) + " (" + mh + ")");
        check(sg == SPATTN_STATUS_BAD_INDEX, tag + ": CUDA status " + std::to_string(sg) + " (" + mg + ")");
        check(bout_untouched(bg), tag + ": CUDA wrote outputs of a refused call");
        check(mg == mh, tag + ": messages differ:\n   cpu:  " + mh + "\n   cuda: " + mg);
    }
}

// The union form never groups two sequences' tokens (sfa_union.cu, spattn.h): a NaN in q of
// sequence 0's last token, whose window of 64 / H packed tokens also holds sequence 1's first,
// must leave every output of sequence 1 finite (through a union over both, 0 * NaN would reach
// the dK rows and O of sequence 1's keys and tokens).  Forward O / LSE and the backward in both
// modes; sequence 0's own results may be NaN.
static void nan_isolation() {
    VCase c{"nan_isolation_h16", 16, 1, 512, 64, 32, 1, 3, SPATTN_DTYPE_BF16, 0, 0, {3, 9}, {40, 60}};
    Batch b = make_batch(c, 901);
    const int tn = b.cu_q[0] + 2;  // packed token 2: window 0 is tokens 0-3 (ug 4)
    b.q[((size_t)tn * c.N1 + 5) * b.DQ + 7] = nanf("");
    Side h, g;
    build_side(b, false, h);
    build_side(b, true, g);
    const spattn_options cpu = cpu_options();
    const std::string tag = tag_of(c);
    auto finite = [](const std::vector<float> &x, size_t from, size_t to) {
        for (size_t i = from; i < to; i++)
            if (!std::isfinite(x[i])) return false;
        return true;
    };
    const size_t q1 = b.cu_q[1], q2 = b.cu_q[2], k1 = b.cu_kv[1], k2 = b.cu_kv[2];
    check(call_fwd(b, g) == SPATTN_STATUS_SUCCESS, tag + ": CUDA forward: " + spattn_last_error());
    dev_sync();
    std::vector<float> og, lg;
    read_out(b, g, og, lg);
    check(finite(og, q1 * c.N1 * c.D, q2 * c.N1 * c.D) && finite(lg, q1 * c.N1, q2 * c.N1),
          tag + ": a NaN of sequence 0 reached sequence 1's O / LSE");
    if (call_fwd(b, h, &cpu) != SPATTN_STATUS_SUCCESS) {
        check(false, tag + ": CPU forward: " + spattn_last_error());
        return;
    }
    const BIn in = make_bin(b, h, 902);
    BOut bg;
    build_bout(b, in, true, bg);
    for (int det = 1; det >= 0; det--) {
        spattn_options o;
        spattn_options_init(&o);
        o.deterministic = det;
        bout_reset(bg);
        check(call_bwd(b, g, bg, &o) == SPATTN_STATUS_SUCCESS, tag + ": CUDA backward: " + spattn_last_error());
        dev_sync();
        const BGrad gr = read_grad(b, bg);
        const std::string m = tag + (det ? " det" : " fast") + ": a NaN of sequence 0 reached sequence 1's ";
        check(finite(gr.dq, q1 * c.N1 * c.D, q2 * c.N1 * c.D) && finite(gr.dqr, q1 * c.N1 * c.Dr, q2 * c.N1 * c.Dr), m + "dq");
        check(finite(gr.dk, k1 * c.N2 * c.D, k2 * c.N2 * c.D) && finite(gr.dkr, k1 * c.N2 * c.Dr, k2 * c.N2 * c.Dr), m + "dk");
    }
}

static std::vector<int> rand_lens(Rng &r, int B, int maxlen) {
    std::vector<int> v(B);
    for (auto &x : v) {
        const int k = (int)r.below(6);
        x = k == 0 ? 0 : k == 1 ? 1 : (int)r.below(maxlen + 1);
    }
    return v;
}

int main(int argc, char **argv) {
    int a = 1;
    if (argc > a && !strcmp(argv[a], "selftest")) {
        g_cpu_only = true;
        a++;
    }
    int n = 0;
    if (!g_cpu_only && (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || !spattn_cuda_available())) {
        printf("sfa_varlen_cuda_check: no CUDA device, skipped\n");
        return 0;
    }
    const bool quick = argc > a && !strcmp(argv[a], "quick");
    const bool only_bwd = argc > a && !strcmp(argv[a], "bwd");
    std::vector<VCase> cases;
    const int BF = SPATTN_DTYPE_BF16, FP = SPATTN_DTYPE_F16, F32 = SPATTN_DTYPE_F32;
    // fixed ones: empty sides, 1-token sequences, both kernels, every page size
    cases.push_back({"empties_small", 4, 1, 512, 64, 64, 1, 3, BF, 0, 0, {0, 5, 1, 0, 9}, {7, 0, 1, 0, 40}});
    cases.push_back({"empties_64h_paged16", 64, 1, 512, 64, 96, 1, 3, FP, 16, 0, {3, 0, 1, 17}, {50, 9, 0, 33}});
    cases.push_back({"n128_paged256_m0", 128, 1, 512, 64, 128, 4, 0, BF, 256, 0, {1, 1, 4, 0, 2}, {300, 5, 260, 1, 513}});
    cases.push_back({"n16_paged64_sbs16", 16, 1, 512, 64, 32, 16, 3, BF, 64, 0, {20, 0, 33, 1}, {100, 64, 170, 0}});
    cases.push_back({"gqa_n32_2_packed", 32, 2, 512, 64, 80, 4, 3, FP, 0, 0, {9, 14, 0, 3}, {30, 14, 2, 60}});
    cases.push_back({"gqa_n128_2_paged64", 128, 2, 512, 64, 64, 1, 0, BF, 64, 0, {2, 7, 1}, {90, 64, 1}});
    cases.back().lse_t = 1;
    cases.push_back({"simple_fp32_d64", 8, 2, 64, 16, 48, 2, 3, F32, 16, 1, {5, 0, 12, 1}, {40, 3, 17, 0}});
    cases.push_back({"simple_sepv_d128", 16, 4, 128, 64, 40, 4, 3, FP, 16, 1, {6, 1, 0, 10}, {25, 100, 0, 31}});
    cases.push_back({"simple_norope_packed", 4, 1, 64, 0, 32, 1, 0, BF, 0, 0, {3, 0, 8}, {10, 4, 0}});
    cases.back().o_pad = 8;
    // the small-head forward's Nsa shape (D 128, no rope, separate v; any H in chunks of 32; the
    // backward on the simple kernels): pages of 64 with blocks of 64, and H = 48 packed
    cases.push_back({"nsa_paged64_h16x2_sbs64", 32, 2, 128, 0, 16, 64, 3, BF, 64, 1, {40, 0, 7, 25}, {900, 64, 1, 300}});
    cases.push_back({"nsa_packed_h48x2_sbs16_m0", 96, 2, 128, 0, 12, 16, 0, FP, 0, 1, {9, 0, 20}, {300, 5, 150}});
    cases.back().lse_t = 1;
    cases.push_back({"sep_d256_packed_h8", 8, 1, 256, 0, 20, 4, 3, BF, 0, 1, {5, 12, 0}, {80, 200, 3}});
    cases.push_back({"sep_d192r64_paged32_h16x2_sbs32", 32, 2, 192, 64, 10, 32, 3, FP, 32, 1, {9, 0, 30, 4}, {200, 3, 330, 0}});
    cases.back().hopper = 1;
    // shared V at other widths
    cases.push_back({"shv_d128r64_paged16_h16", 16, 1, 128, 64, 24, 8, 3, BF, 16, 0, {6, 0, 11, 2}, {70, 5, 130, 0}});
    cases.push_back({"shv_d256_packed_h40_m0", 40, 1, 256, 0, 20, 4, 0, FP, 0, 0, {5, 12, 0}, {80, 200, 3}});
    // D not a multiple of 64 (the last value box partial; gated in fwd_shape)
    cases.push_back({"pad_d112_paged64_h16x2_sbs64", 32, 2, 112, 0, 16, 64, 3, BF, 64, 1, {40, 0, 7, 25}, {900, 64, 1, 300}});
    cases.back().hopper = 1;
    cases.push_back({"pad_shv_d208r64_packed_h8", 8, 1, 208, 64, 20, 4, 3, FP, 0, 0, {5, 12, 0}, {80, 200, 3}});
    cases.back().hopper = 1;
    // shared V at D 64 (one value box), separate V at D 256 + Dr 64 (gated in fwd_shape)
    cases.push_back({"odd_shv_d64_paged16_h4", 4, 1, 64, 0, 24, 4, 3, BF, 16, 0, {6, 0, 11, 2}, {70, 5, 130, 0}});
    cases.back().hopper = 1;
    cases.push_back({"odd_sep_d256r64_packed_h16x2_m0", 32, 2, 256, 64, 12, 8, 0, FP, 0, 1, {9, 0, 20}, {300, 5, 150}});
    cases.back().hopper = 1;
    // a rope part narrower than 64 (MiniCPM3's D 256 + Dr 32, shared V), paged
    cases.push_back({"rope_shv_d256r32_paged16_h16", 16, 1, 256, 32, 24, 8, 3, BF, 16, 0, {6, 0, 11, 2}, {70, 5, 130, 0}});
    cases.back().hopper = 1;
    // the Mla kernels on packed columns (src/core/sfa_pack.h, sfa_pad.cu): D 512 without rope over
    // pages (nothing copied), D 384 + 64 packed, a separate v of D 288 over pages (the outputs'
    // buffers start as the caller's rows: rows past cu_seqlens_q stay unwritten)
    cases.push_back({"mlapad_shv_d512_paged16_h16", 16, 1, 512, 0, 24, 8, 3, BF, 16, 0, {6, 0, 11, 2}, {70, 5, 130, 0}});
    cases.back().hopper = 1;
    cases.push_back({"mlapad_shv_d384r64_packed_h64", 64, 1, 384, 64, 20, 4, 3, FP, 0, 0, {5, 12, 0}, {80, 200, 3}});
    cases.back().hopper = 1;
    cases.push_back({"mlapad_sep_d288_paged64_h8x2", 16, 2, 288, 0, 16, 16, 0, BF, 64, 1, {9, 0, 20}, {300, 5, 150}});
    cases.back().hopper = 1;
    if (!quick) {
        Rng r(2027);
        const int n1s[4] = {4, 16, 64, 128}, pages[4] = {0, 16, 64, 256};
        for (int i = 0; i < 24; i++) {
            VCase c;
            c.name = "random" + std::to_string(i);
            c.N1 = n1s[i % 4];
            c.N2 = (i % 5 == 4 && c.N1 >= 32) ? 2 : 1;
            c.D = 512;
            c.Dr = 64;
            c.sbs = (int)(1 << (2 * r.below(3)));  // 1, 4, 16
            c.K = 16 + (int)r.below(200);
            c.mode = r.below(2) ? 3 : 0;
            c.dt = r.below(2) ? BF : FP;
            c.page = pages[(i / 4) % 4];
            const int B = 2 + (int)r.below(6);
            c.lq = rand_lens(r, B, c.N1 >= 64 ? 24 : 60);
            c.lk = rand_lens(r, B, 400);
            c.extra_q = (int)r.below(3);
            c.lse_t = (int)r.below(2);
            c.o_pad = r.below(3) == 0 ? 8 : 0;
            cases.push_back(c);
        }
    }
    uint64_t seed = 1;
    if (!only_bwd) {
        for (const VCase &c : cases) run_case(c, seed++);
        // the union forward (H = 4 .. 32, sfa_host.cu): every group without a repeated key taken
        // (SPATTN_SFA_UNION=1, density ignored), and none (=0: the per-token kernel alone)
        if (!g_cpu_only) {
            for (const char *v : {"1", "0"}) {
                setenv("SPATTN_SFA_UNION", v, 1);
                const int before = g_fail;
                for (int i : {0, 3, 4}) run_case(cases[i], 800 + i);
                printf("  hook SPATTN_SFA_UNION=%s (forward): %s\n", v, g_fail == before ? "ok" : "FAILED");
            }
            unsetenv("SPATTN_SFA_UNION");
        }
        // refusals on a packed and a paged batch (both kernels)
        refusals(cases[0], 100, expect_mut);
        refusals(cases[1], 101, expect_mut);
        refusals(cases[3], 102, expect_mut);
        if (!quick) refusals(cases[6], 103, expect_mut);
    }
    // the backward: every case above (the simple kernels' shapes too),
    // plus H = 1 with heavy duplicates, H = 96 (a full and a partial 64-head group), one long
    // sequence among short ones, pages shared by two sequences, GQA with 16 heads per key head
    std::vector<VCase> bc = cases;
    bc.push_back({"bwd_h1_dups", 1, 1, 512, 64, 64, 1, 3, BF, 0, 0, {5, 0, 9, 1}, {12, 3, 20, 0}});
    bc.push_back({"bwd_h96_paged16_sbs4", 96, 1, 512, 64, 40, 4, 3, FP, 16, 0, {4, 7, 0, 2}, {70, 33, 5, 16}});
    bc.push_back({"bwd_one_long_h64", 64, 1, 512, 64, 256, 1, 3, BF, 0, 0, {150, 1, 3, 0, 7}, {600, 2, 3, 4, 50}});
    bc.push_back({"bwd_shared_pages_h32", 32, 1, 512, 64, 48, 1, 0, BF, 16, 0, {6, 9, 3}, {40, 40, 20}});
    bc.back().share_page = 1;
    bc.push_back({"bwd_gqa_h16x4_paged64_sbs8", 64, 4, 512, 64, 24, 8, 3, FP, 64, 0, {10, 0, 12}, {130, 9, 64}});
    bc.push_back({"bwd_h128_sbs16_m0", 128, 1, 512, 64, 16, 16, 0, BF, 0, 0, {3, 5, 0}, {200, 17, 30}});
    for (size_t i = 0; i < bc.size(); i++) run_bwd_case(bc[i], 500 + i, !quick || i < 4 || i >= cases.size());
    // the Hopper backward's test hooks (sfa_host.cu): index rows sorted first (forced: no case here
    // has the large accumulator that turns it on), the packed int32 retry with the probe's F 12
    // bits too fine (every row overflows: F lowered, the pass repeated) or too coarse (F raised),
    // and the union form off (H <= 32 on the per-token kernel alone); packed, paged, shared pages,
    // GQA; each against the CPU in both modes, the deterministic one bitwise repeatable
    if (!g_cpu_only) {
        const char *hooks[4][2] = {{"SPATTN_SFA_BWD_SORT", "1"},
                                   {"SPATTN_SFA_P32_SHIFT", "12"},
                                   {"SPATTN_SFA_P32_SHIFT", "-12"},
                                   {"SPATTN_SFA_BWD_UNION", "0"}};
        const size_t pick[4] = {cases.size() + 2, cases.size() + 3, 5, 4};  // one long, shared pages, GQA paged / packed
        for (int h = 0; h < 4; h++) {
            setenv(hooks[h][0], hooks[h][1], 1);
            const int before = g_fail;
            for (int i = 0; i < (quick ? 2 : 4); i++) run_bwd_case(bc[pick[i]], 700 + 10 * h + i, true);
            printf("  hook %s=%s: %s\n", hooks[h][0], hooks[h][1], g_fail == before ? "ok" : "FAILED");
            unsetenv(hooks[h][0]);
        }
    }
    nan_isolation();
    refusals(cases[0], 600, expect_mut_bwd);
    refusals(cases[1], 601, expect_mut_bwd);
    if (!quick) refusals(cases[3], 602, expect_mut_bwd);
    printf("sfa_varlen_cuda_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

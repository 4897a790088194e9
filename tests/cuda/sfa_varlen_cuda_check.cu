// GPU check of the packed variable-length / paged sfa forward (spattn_sfa_fwd_varlen on CUDA
// tensors).  Runs on a machine with a GPU; prints "skipped" and exits 0 when none is visible (not
// a ctest test: CI has no GPU).
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
//                                     kernel sees the same keys),
//                                   * rows past cu_seqlens_q[B] untouched;
//                                 refused calls (bad index, index past the sequence's keys, bad
//                                 page id, page twice in a row, table capacity, non-monotone /
//                                 non-zero-start / too long / past-T prefix sums): BAD_INDEX, the
//                                 CPU backend's message, every output byte untouched; out-of-range
//                                 values where nothing is read (rows past cu_q[B], unused table
//                                 slots) accepted; caller workspace of the queried size (same bits)
//                                 and one byte less (refused); the backward NOT_SUPPORTED.
//   sfa_varlen_cuda_check quick   a few small cases (for compute-sanitizer)
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
    if (cuda) {
        t.device_type = SPATTN_DEVICE_CUDA;
        t.device_id = 0;
    }
    return t;
}

struct DBuf {
    void *p = nullptr;
    size_t n = 0;
    void up(const void *h, size_t bytes) {
        if (p) cudaFree(p);
        n = bytes;
        CK(cudaMalloc(&p, bytes ? bytes : 16));
        if (bytes) CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    }
    void fill(unsigned char byte) { CK(cudaMemset(p, byte, n)); }
    std::vector<unsigned char> get() const {
        std::vector<unsigned char> h(n);
        CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
        return h;
    }
    ~DBuf() {
        if (p) cudaFree(p);
    }
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
    const std::string tag = tag_of(c);
    Batch b = make_batch(c, seed);
    Side h, g;
    build_side(b, false, h);
    build_side(b, true, g);
    spattn_options cpu;
    spattn_options_init(&cpu);
    cpu.backend = SPATTN_BACKEND_CPU;
    spattn_status sh = call_fwd(b, h, &cpu);
    check(sh == SPATTN_STATUS_SUCCESS, tag + ": CPU golden: " + spattn_last_error());
    spattn_status sg = call_fwd(b, g);
    check(sg == SPATTN_STATUS_SUCCESS, tag + ": CUDA: " + spattn_last_error());
    CK(cudaDeviceSynchronize());
    if (sh != SPATTN_STATUS_SUCCESS || sg != SPATTN_STATUS_SUCCESS) return;
    std::vector<float> oh, lh, og, lg;
    read_out(b, h, oh, lh);
    read_out(b, g, og, lg);
    double e1 = 0, e2 = 0;
    const bool ok_o = eco(og, oh, c.dt, false, &e1), ok_l = eco(lg, lh, c.dt, true, &e2);
    check(ok_o, tag + ": O vs CPU (max err " + std::to_string(e1) + ")");
    check(ok_l, tag + ": LSE vs CPU (max err " + std::to_string(e2) + ")");
    check(rest_untouched(b, g), tag + ": rows past cu_seqlens_q[B] / O row padding written");
    std::string why;
    check(dense_matches(b, g, why), tag + ": not bitwise one dense call per sequence: " + why);
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
    size_t wb = 0;
    check(spattn_sfa_varlen_workspace_size(&g.q, c.Dr ? &g.qr : nullptr, &g.k, c.Dr ? &g.kr : nullptr, c.sep_v ? &g.v : nullptr,
                                           &g.idx, c.sbs, c.mode, &g.vl, 1, nullptr, &wb) == SPATTN_STATUS_NOT_SUPPORTED,
          tag + ": backward workspace query on CUDA should be NOT_SUPPORTED");
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
    spattn_options cpu;
    spattn_options_init(&cpu);
    cpu.backend = SPATTN_BACKEND_CPU;
    const spattn_status sh = call_fwd(b, h, &cpu);
    const std::string mh = spattn_last_error();
    const spattn_status sg = call_fwd(b, g);
    const std::string mg = spattn_last_error();
    CK(cudaDeviceSynchronize());
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

static void refusals(const VCase &c, uint64_t seed) {
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

static std::vector<int> rand_lens(Rng &r, int B, int maxlen) {
    std::vector<int> v(B);
    for (auto &x : v) {
        const int k = (int)r.below(6);
        x = k == 0 ? 0 : k == 1 ? 1 : (int)r.below(maxlen + 1);
    }
    return v;
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || !spattn_cuda_available()) {
        printf("sfa_varlen_cuda_check: no CUDA device, skipped\n");
        return 0;
    }
    const bool quick = argc > 1 && !strcmp(argv[1], "quick");
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
    for (const VCase &c : cases) run_case(c, seed++);
    // refusals on a packed and a paged batch (both kernels)
    refusals(cases[0], 100);
    refusals(cases[1], 101);
    refusals(cases[3], 102);
    if (!quick) refusals(cases[6], 103);
    // the backward stays on the CPU: NOT_SUPPORTED once every argument is valid, nothing written
    {
        const VCase &c = cases[0];  // packed keys, shared key/value
        Batch b = make_batch(c, 7);
        Side g;
        build_side(b, true, g);
        const size_t es = esz(c.dt);
        std::vector<unsigned char> zq((size_t)b.Tq * c.N1 * c.D * es, SENT), zqr((size_t)b.Tq * c.N1 * c.Dr * es, SENT),
            zk((size_t)b.Tkv * c.N2 * c.D * es, SENT), zkr((size_t)b.Tkv * c.N2 * c.Dr * es, SENT);
        DBuf ddo, ddq, ddqr, ddk, ddkr;
        ddo.up(zq.data(), zq.size());
        ddq.up(zq.data(), zq.size());
        ddqr.up(zqr.data(), zqr.size());
        ddk.up(zk.data(), zk.size());
        ddkr.up(zkr.data(), zkr.size());
        spattn_tensor dout = mk(ddo.p, c.dt, {b.Tq, c.N1, c.D}, {}, true), dq = mk(ddq.p, c.dt, {b.Tq, c.N1, c.D}, {}, true);
        spattn_tensor dqr = mk(ddqr.p, c.dt, {b.Tq, c.N1, c.Dr}, {}, true), dk = mk(ddk.p, c.dt, {b.Tkv, c.N2, c.D}, {}, true);
        spattn_tensor dkr = mk(ddkr.p, c.dt, {b.Tkv, c.N2, c.Dr}, {}, true);
        spattn_tensor o = mk(g.dO.p, c.dt, {b.Tq, c.N1, c.D}, {(int64_t)c.N1 * (c.D + c.o_pad), c.D + c.o_pad, 1}, true);
        const spattn_status st = spattn_sfa_bwd_varlen(&g.q, &g.qr, &g.k, &g.kr, nullptr, &o, &dout, &g.lse, &g.idx, c.sbs,
                                                       c.mode, 0.0, &g.vl, &dq, &dqr, &dk, &dkr, nullptr, nullptr);
        bool clean = true;
        for (DBuf *x : {&ddq, &ddqr, &ddk, &ddkr})
            for (unsigned char ch : x->get()) clean = clean && ch == SENT;
        check(st == SPATTN_STATUS_NOT_SUPPORTED && clean,
              std::string("backward varlen on CUDA: status ") + std::to_string(st) + " (" + spattn_last_error() + ")");
    }
    printf("sfa_varlen_cuda_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

// GPU check of the packed variable-length bsa forward and backward on CUDA (spattn_bsa_fwd_varlen /
// spattn_bsa_bwd_varlen with device tensors) against the CPU path on the same inputs (run on a
// machine with a GPU; reports "skipped" and exits 0 when none is visible).
//   * random batches: B 1..17, lengths with 0, 1 and the maximum forced in, key sides longer or
//     shorter than the queries (and empty), bx / by 16 / 48 / 64 / 128 / odd (partial edge blocks,
//     every chunk width of the Hopper forward and its per-token mask path), GQA, D 64 / 128 (and
//     40 / 96 padded), fp16 / bf16; causal or random masks (entries past a sequence's own blocks
//     random too: they must not be read); padded row strides; fp32, D 192 and a row stride TMA
//     cannot read take the reference kernel;
//   * outputs poisoned (0xFF bytes: NaN) over a buffer with spare rows past cu_q[B]: every row
//     < cu_q[B] must match, every byte past it must stay poison; rows past cu_kv[B] of k / v are
//     NaN (never read);
//   * "one sequence alone": the same call with every other sequence's query side emptied
//     (q / o views moved to the sequence's first row) writes exactly the sequence's rows of a
//     poisoned buffer, bitwise those of the full call: catches writes into a neighbour's rows
//     that the full call would hide under the neighbour's own later write;
//   * NaN in one sequence's k and v: its neighbours (which a TMA box reaches) stay exact;
//   * bad prefix sums (non-monotone, a length past max_seqlen, past T, cu[0] != 0, both sides):
//     SPATTN_STATUS_BAD_INDEX with the CPU's message, o / lse untouched;
//   * caller workspace (unaligned base, exact size) on a caller stream;
//   * paged keys (case field `page`: k / v as pages [num_pages, page_size, Nkv, D] through a
//     shuffled block table with 1-3 spare pages, garbage in every unused slot, NaN in every page
//     row no sequence owns, optionally a padded page stride, sometimes a page shared by two
//     sequences): the CUDA forward against the CPU's
//     paged forward, and BITWISE against the CUDA packed forward on the same values (same kernel,
//     same tiles: rows past a sequence's end read as 0 on both); page sizes 16 / 24 / 32 / 48 /
//     64 / 80 / 128 / 256 (Hopper forward, slabs of 8..128 rows) and 5 / 12 (not multiples of 8:
//     the reference kernel), fp32 / D 192 on the reference kernel; sequence-alone calls; NaN in
//     one sequence's pages; bad tables (a page id = num_pages or -1, a page twice in a row, a row
//     too short for its sequence, and a bad prefix sum beside a bad table) give the CPU's status
//     and message with o / lse untouched;
//   * the paged backward (every paged case; dk / dv pages as k, padding poison): against the CPU's
//     paged backward (eco criterion on dq and every page row), rows no sequence uses exactly 0,
//     deterministic runs bitwise equal (20 for the first paged case, else 3), bitwise against the
//     CUDA packed backward on the same values (dq, and the rows of pages one sequence uses); cases
//     with a page shared by two sequences (the sum), GQA, page sizes 16 / 48 / 64 / 128 / 256 and
//     the random ones; page sizes 5 / 12, fp32, D 192, pad 4: NOT_SUPPORTED naming the CPU with
//     nothing written; bad tables: the CPU's status and message, dq / dk / dv untouched;
//   * backward (every case; O / LSE from the CPU forward, dO NaN on rows past cu_q[B]): dQ, dK, dV
//     against the CPU backward with the eco criterion (cases/README.md), in deterministic mode
//     (5 runs bitwise equal) and fast mode; dQ rows past cu_q[B] and padding columns poison, dK /
//     dV rows past cu_kv[B] zero (as the CPU); shapes the CUDA backward does not take (fp32, D 192,
//     a row stride TMA cannot read) and bad prefix sums: the refusal (NOT_SUPPORTED naming the CPU
//     backend; BAD_INDEX with the CPU's message) with dq / dk / dv untouched.  Cases add many short
//     sequences, one long among short ones, empty sequences, GQA, bx != by, odd blocks.
// Usage: bsa_varlen_cuda_check [quick]   (SPATTN_TEST_SEED replays the random draw)
//        bsa_varlen_cuda_check selftest [quick]: the harness alone, every "cuda" call on the CPU
//        (no GPU needed; checks the checker: poison bookkeeping, views, the sequence-alone calls)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "check_util.h"
#include "spattn.h"


static int g_pass = 0, g_fail = 0;
static bool g_cpu_only = false;  // selftest: the "cuda" calls run on the CPU (no device memory)
static uint64_t g_rng = 0x1234567ull;
static double urand() {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}
static int irand(int lo, int hi) { return lo + (int)(urand() * (hi - lo + 1)); }  // [lo, hi]
static double nrand() {
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}
static const char *dtn(int dt) { return dt == SPATTN_DTYPE_F16 ? "fp16" : dt == SPATTN_DTYPE_BF16 ? "bf16" : "fp32"; }

static void check(bool ok, const char *what, const std::string &ctx) {
    if (ok) g_pass++;
    else {
        g_fail++;
        printf("  FAIL %s  [%s]\n", what, ctx.c_str());
    }
}

struct Case {
    int B, N, Nkv, D, bx, by, dt;
    int maxq, maxkv;   // length bounds of the draw
    int kvmode;        // 0 independent lengths, 1 kv = q, 2 kv = q + ctx
    int causal;        // 1 causal (per sequence, off = Skv_b - Sq_b), 0 random
    double density;
    int pad;           // elements added to the row stride of q / k / v / o (8: TMA-able, 4: not)
    int use_ws;        // caller workspace (unaligned) + caller stream
    int longshort;     // sequence 0 has maxq queries, the others at most 40
    int page = 0;      // > 0: k / v as pages of this many rows (the packed copy is the reference)
    int share = 0;     // paged: always share a page between two sequences (else a coin decides)
    // with pad 4 (rows TMA cannot read): the device calls read unpadded copies of their inputs, so
    // the Hopper kernels run and write the padded outputs (o; dq, dk, dv) with per-element stores
    // instead of TMA stores (packed only)
    int fastin = 0;
};

// A packed batch on the host and its device copies.
struct Batch {
    Case c;
    std::vector<int32_t> cuq, cukv;
    int Tq, Tkv, Tcap;     // tokens; rows of the o buffer (spare rows past Tq... past cu_q[B])
    long long maxq, maxkv;
    int nbx, nby;
    long long rsq, rskv;   // row strides (elements) of q / o and k / v
    std::vector<uint8_t> hq, hk, hv, hmask, hdo;
    void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dm = nullptr, *dcq = nullptr, *dckv = nullptr, *ddo = nullptr;
    // paged keys (c.page > 0): pages [np, page, Nkv, D] with page stride pgs (elements), table
    // [B, maxp] (unused slots garbage), page rows no sequence owns NaN
    int np = 0, maxp = 0;
    long long pgs = 0;
    std::vector<int32_t> tab;
    int shared[2] = {-1, -1};  // the two sequences sharing their first page, if any
    std::vector<uint8_t> hkp, hvp;
    void *dkp = nullptr, *dvp = nullptr;
};

// A host copy of t with NaN in every key and value row of sequence s (packed rows hk / hv).
static Batch nan_keys(const Batch &t, int s) {
    const Case &c = t.c;
    Batch u = t;
    for (int r = t.cukv[s]; r < t.cukv[s + 1]; r++)
        for (int x = 0; x < c.Nkv * c.D; x++) {
            store_dt(u.hk.data(), (size_t)r * t.rskv + x, NAN, c.dt);
            store_dt(u.hv.data(), (size_t)r * t.rskv + x, NAN, c.dt);
        }
    return u;
}

// The pages of k / v from the packed rows hk / hv (row j of sequence b -> page tab[b][j / ps], row
// j % ps); every other page row NaN.
static void fill_pages(Batch &t, const std::vector<uint8_t> &hk, const std::vector<uint8_t> &hv) {
    const Case &c = t.c;
    const int ps = c.page, dt = c.dt;
    const size_t n = (size_t)t.np * t.pgs;
    t.hkp.assign(n * esz(dt), 0);
    t.hvp.assign(n * esz(dt), 0);
    for (size_t i = 0; i < n; i++) {
        store_dt(t.hkp.data(), i, NAN, dt);
        store_dt(t.hvp.data(), i, NAN, dt);
    }
    for (int b = 0; b < c.B; b++)
        for (int j = 0; j < t.cukv[b + 1] - t.cukv[b]; j++) {
            const size_t dst = (size_t)t.tab[(size_t)b * t.maxp + j / ps] * t.pgs + (size_t)(j % ps) * t.rskv;
            const size_t src = (size_t)(t.cukv[b] + j) * t.rskv;
            for (int x = 0; x < c.Nkv * c.D; x++) {
                store_dt(t.hkp.data(), dst + x, load_dt(hk.data(), src + x, dt), dt);
                store_dt(t.hvp.data(), dst + x, load_dt(hv.data(), src + x, dt), dt);
            }
        }
}

// A shuffled block table with 1-3 spare pages and garbage in the unused slots, and the pages.
static void make_pages(Batch &t) {
    const Case &c = t.c;
    const int ps = c.page;
    int need = 0;
    t.maxp = (int)((t.maxkv + ps - 1) / ps) + irand(0, 2);
    for (int b = 0; b < c.B; b++) need += (t.cukv[b + 1] - t.cukv[b] + ps - 1) / ps;
    t.np = need + irand(1, 3);
    std::vector<int32_t> perm(t.np);
    for (int i = 0; i < t.np; i++) perm[i] = i;
    for (int i = t.np - 1; i > 0; i--) std::swap(perm[i], perm[irand(0, i)]);
    t.tab.assign((size_t)c.B * t.maxp, 0);
    int next = 0;
    for (int b = 0; b < c.B; b++) {
        const int nb = (t.cukv[b + 1] - t.cukv[b] + ps - 1) / ps;
        for (int j = 0; j < t.maxp; j++) {
            const int g = irand(0, 4);  // unused slots: anything, never read
            t.tab[(size_t)b * t.maxp + j] = j < nb ? perm[next++]
                                            : g == 0 ? -1 : g == 1 ? t.np : g == 2 ? 0x7fffffff : g == 3 ? perm[0] : -12345;
        }
    }
    // sometimes a shared prompt: a later sequence's first page is an earlier one's (same packed rows)
    if (c.B >= 2 && (c.share || irand(0, 1))) {
        int b1 = -1, b2 = -1;
        for (int b = 0; b < c.B && b2 < 0; b++)
            if (t.cukv[b + 1] - t.cukv[b] >= ps) {
                if (b1 < 0) b1 = b;
                else b2 = b;
            }
        if (b2 >= 0) {
            const size_t rb = (size_t)t.rskv * esz(c.dt);
            memcpy(&t.hk[(size_t)t.cukv[b2] * rb], &t.hk[(size_t)t.cukv[b1] * rb], ps * rb);
            memcpy(&t.hv[(size_t)t.cukv[b2] * rb], &t.hv[(size_t)t.cukv[b1] * rb], ps * rb);
            t.tab[(size_t)b2 * t.maxp] = t.tab[(size_t)b1 * t.maxp];  // b2's own first page: unused (NaN)
            t.shared[0] = b1;
            t.shared[1] = b2;
        }
    }
    t.pgs = (long long)ps * t.rskv + (irand(0, 2) == 0 ? 64 : 0);  // sometimes a padded page stride
    fill_pages(t, t.hk, t.hv);
}

static void lengths(int B, int maxl, std::vector<int32_t> &cu, int force_max) {
    cu.assign(B + 1, 0);
    for (int b = 0; b < B; b++) {
        int L = irand(0, maxl), u = irand(0, 9);
        if (u == 0) L = 0;
        else if (u == 1) L = 1;
        else if (u == 2 || (force_max && b == B / 2)) L = maxl;
        cu[b + 1] = cu[b] + L;
    }
}

static void make_batch(const Case &c, Batch &t) {
    t.c = c;
    lengths(c.B, c.maxq, t.cuq, 1);
    if (c.longshort)
        for (int b = 0; b < c.B; b++) t.cuq[b + 1] = t.cuq[b] + (b == 0 ? c.maxq : irand(0, std::min(40, c.maxq)));
    if (c.kvmode == 0) lengths(c.B, c.maxkv, t.cukv, 0);
    else {
        t.cukv.assign(c.B + 1, 0);
        const int ctx = c.kvmode == 2 ? irand(1, 150) : 0;
        for (int b = 0; b < c.B; b++) t.cukv[b + 1] = t.cukv[b] + (t.cuq[b + 1] - t.cuq[b]) + ctx;
    }
    t.maxq = 1;
    t.maxkv = 1;
    for (int b = 0; b < c.B; b++) {
        t.maxq = std::max<long long>(t.maxq, t.cuq[b + 1] - t.cuq[b]);
        t.maxkv = std::max<long long>(t.maxkv, t.cukv[b + 1] - t.cukv[b]);
    }
    if (irand(0, 3) == 0) t.maxq += irand(1, 40);  // a generous max_seqlen: more (empty) tiles
    t.Tq = t.cuq[c.B] + irand(1, 9);              // rows past cu[B]: not read, not written
    t.Tkv = t.cukv[c.B] + irand(1, 9);
    t.Tcap = t.Tq;
    t.nbx = (int)((t.maxq + c.bx - 1) / c.bx);
    t.nby = (int)((t.maxkv + c.by - 1) / c.by);
    t.rsq = (long long)c.N * c.D + c.pad;
    t.rskv = (long long)c.Nkv * c.D + c.pad;
    const size_t es = esz(c.dt);
    t.hq.assign((size_t)t.Tq * t.rsq * es, 0);
    t.hk.assign((size_t)t.Tkv * t.rskv * es, 0);
    t.hv.assign(t.hk.size(), 0);
    for (int r = 0; r < t.Tq; r++)
        for (int x = 0; x < c.N * c.D; x++) store_dt(t.hq.data(), (size_t)r * t.rsq + x, (float)nrand(), c.dt);
    for (int r = 0; r < t.Tkv; r++)
        for (int x = 0; x < c.Nkv * c.D; x++) {
            const bool tail = r >= t.cukv[c.B];  // never read: NaN catches a reader
            store_dt(t.hk.data(), (size_t)r * t.rskv + x, tail ? NAN : (float)nrand(), c.dt);
            store_dt(t.hv.data(), (size_t)r * t.rskv + x, tail ? NAN : (float)nrand(), c.dt);
        }
    t.hdo.assign(t.hq.size(), 0);  // dO: rows past cu_q[B] NaN (never read)
    for (int r = 0; r < t.Tq; r++)
        for (int x = 0; x < c.N * c.D; x++)
            store_dt(t.hdo.data(), (size_t)r * t.rsq + x, r >= t.cuq[c.B] ? NAN : (float)nrand(), c.dt);
    if (c.page) make_pages(t);
    t.hmask.assign((size_t)c.B * c.N * t.nbx * t.nby, 0);
    for (int b = 0; b < c.B; b++) {
        const long long sq = t.cuq[b + 1] - t.cuq[b], skv = t.cukv[b + 1] - t.cukv[b], off = skv - sq;
        for (int n = 0; n < c.N; n++)
            for (int i = 0; i < t.nbx; i++)
                for (int j = 0; j < t.nby; j++) {
                    uint8_t v;
                    if (c.causal && i * (long long)c.bx < sq && j * (long long)c.by < skv)
                        v = (long long)j * c.by <= (long long)i * c.bx + c.bx - 1 + off;  // some key <= diagonal
                    else v = urand() < c.density;  // past the sequence's blocks: random, never read
                    t.hmask[(((size_t)b * c.N + n) * t.nbx + i) * t.nby + j] = v;
                }
    }
    if (g_cpu_only) return;
    CK(cudaMalloc(&t.dq, t.hq.size() + 256));
    CK(cudaMalloc(&t.dk, t.hk.size() + 256));
    CK(cudaMalloc(&t.dv, t.hv.size() + 256));
    CK(cudaMalloc(&t.dm, t.hmask.size() + 1));
    CK(cudaMalloc(&t.dcq, (c.B + 1) * 4));
    CK(cudaMalloc(&t.dckv, (c.B + 1) * 4));
    CK(cudaMemcpy(t.dq, t.hq.data(), t.hq.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&t.ddo, t.hdo.size() + 256));
    CK(cudaMemcpy(t.ddo, t.hdo.data(), t.hdo.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t.dk, t.hk.data(), t.hk.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t.dv, t.hv.data(), t.hv.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t.dm, t.hmask.data(), t.hmask.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t.dcq, t.cuq.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t.dckv, t.cukv.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
    if (c.page) {
        CK(cudaMalloc(&t.dkp, t.hkp.size() + 256));
        CK(cudaMalloc(&t.dvp, t.hvp.size() + 256));
        CK(cudaMemcpy(t.dkp, t.hkp.data(), t.hkp.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(t.dvp, t.hvp.data(), t.hvp.size(), cudaMemcpyHostToDevice));
    }
}
static void free_batch(Batch &t) {
    if (g_cpu_only) return;
    cudaFree(t.dkp);
    cudaFree(t.dvp);
    cudaFree(t.dq);
    cudaFree(t.dk);
    cudaFree(t.dv);
    cudaFree(t.dm);
    cudaFree(t.dcq);
    cudaFree(t.dckv);
    cudaFree(t.ddo);
}

static spattn_tensor mk(void *p, int dt, int nd, const int64_t *sh, const int64_t *st, bool dev) {
    spattn_tensor t = spattn_tensor_make(p, (spattn_dtype)dt, nd, sh, st);
    if (dev) {
        t.device_type = SPATTN_DEVICE_CUDA;
        t.device_id = 0;
    }
    return t;
}

// Outputs of one call: o [Tcap rows], lse [Tcap, N] (fp32), as host bytes.
struct Out {
    std::vector<uint8_t> o, lse;
    spattn_status st;
    std::string msg;
};

// A device copy, unpadded (rows of `cols` elements), of `rows` rows of row stride rs (elements) at
// src, device or host memory (Case::fastin).
static void *unpadded(const void *src, int rows, long long rs, int cols, size_t es) {
    void *d = nullptr;
    CK(cudaMalloc(&d, (size_t)std::max(rows, 1) * cols * es + 256));
    if (rows > 0)
        CK(cudaMemcpy2D(d, (size_t)cols * es, src, (size_t)rs * es, (size_t)cols * es, rows, cudaMemcpyDefault));
    return d;
}

// One spattn_bsa_fwd_varlen call.  q / o start at row `row0` of their buffers with Tq - row0 rows
// and the prefix sums cq / ckv (host vectors copied to the device for dev calls).  dev: CUDA.
// tab: paged keys (the batch's pages) through this table of `maxp` columns (row stride t.maxp).
static Out run(const Batch &t, bool dev, const std::vector<int32_t> &cq, const std::vector<int32_t> &ckv,
               long long maxq, long long maxkv, int row0 = 0, bool with_lse = true,
               const std::vector<int32_t> *tab = nullptr, int maxp = 0) {
    const Case &c = t.c;
    const size_t es = esz(c.dt);
    const int Tq = t.Tq - row0;
    if (g_cpu_only) dev = false;
    Out r;
    r.o.assign((size_t)t.Tcap * t.rsq * es, 0xFF);
    r.lse.assign((size_t)t.Tcap * c.N * 4, 0xFF);
    void *q = dev ? t.dq : (void *)t.hq.data(), *k = dev ? t.dk : (void *)t.hk.data();
    void *v = dev ? t.dv : (void *)t.hv.data(), *m = dev ? t.dm : (void *)t.hmask.data();
    void *o = r.o.data(), *l = r.lse.data(), *cuq = (void *)cq.data(), *cukv = (void *)ckv.data();
    void *dtab = tab ? (void *)tab->data() : nullptr;
    if (tab) {
        k = dev ? t.dkp : (void *)t.hkp.data();
        v = dev ? t.dvp : (void *)t.hvp.data();
    }
    if (dev) {
        if (tab) {
            CK(cudaMalloc(&dtab, tab->size() * 4));
            CK(cudaMemcpy(dtab, tab->data(), tab->size() * 4, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&o, r.o.size()));
        CK(cudaMalloc(&l, r.lse.size()));
        CK(cudaMemcpy(o, r.o.data(), r.o.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(l, r.lse.data(), r.lse.size(), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&cuq, cq.size() * 4));
        CK(cudaMalloc(&cukv, ckv.size() * 4));
        CK(cudaMemcpy(cuq, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(cukv, ckv.data(), ckv.size() * 4, cudaMemcpyHostToDevice));
    }
    const int64_t shq[3] = {Tq, c.N, c.D}, stq[3] = {t.rsq, c.D, 1};
    const int64_t shk[3] = {t.Tkv, c.Nkv, c.D};
    const int64_t shm[4] = {c.B, c.N, t.nbx, t.nby}, shl[2] = {Tq, c.N}, shc[1] = {(int64_t)cq.size()};
    // Case::fastin: the inputs as unpadded device copies (of the device buffers: a test may have
    // changed them), the output keeps the padded rows
    const bool fin = dev && c.fastin && !tab;
    const int64_t stqi[3] = {fin ? (int64_t)c.N * c.D : t.rsq, c.D, 1}, stki[3] = {fin ? (int64_t)c.Nkv * c.D : t.rskv, c.D, 1};
    if (fin) {
        q = unpadded(t.dq, t.Tq, t.rsq, c.N * c.D, es);
        k = unpadded(t.dk, t.Tkv, t.rskv, c.Nkv * c.D, es);
        v = unpadded(t.dv, t.Tkv, t.rskv, c.Nkv * c.D, es);
    }
    spattn_tensor tq = mk((char *)q + (size_t)row0 * stqi[0] * es, c.dt, 3, shq, stqi, dev);
    spattn_tensor tk = mk(k, c.dt, 3, shk, stki, dev), tv = mk(v, c.dt, 3, shk, stki, dev);
    const int64_t shp[4] = {t.np, c.page, c.Nkv, c.D}, stp[4] = {t.pgs, t.rskv, c.D, 1};
    const int64_t sht[2] = {c.B, maxp}, stt[2] = {t.maxp, 1};
    spattn_tensor tt = mk(dtab, SPATTN_DTYPE_I32, 2, sht, stt, dev);
    if (tab) {
        tk = mk(k, c.dt, 4, shp, stp, dev);
        tv = mk(v, c.dt, 4, shp, stp, dev);
    }
    spattn_tensor tm = mk(m, SPATTN_DTYPE_U8, 4, shm, NULL, dev);
    spattn_tensor to = mk((char *)o + (size_t)row0 * t.rsq * es, c.dt, 3, shq, stq, dev);
    spattn_tensor tl = mk((float *)l + (size_t)row0 * c.N, SPATTN_DTYPE_F32, 2, shl, NULL, dev);
    spattn_tensor tcq = mk(cuq, SPATTN_DTYPE_I32, 1, shc, NULL, dev), tckv = mk(cukv, SPATTN_DTYPE_I32, 1, shc, NULL, dev);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &tcq;
    vl.cu_seqlens_kv = &tckv;
    vl.max_seqlen_q = maxq;
    vl.max_seqlen_kv = maxkv;
    if (tab) vl.block_table = &tt;
    spattn_options opt;
    spattn_options_init(&opt);
    void *ws = nullptr;
    cudaStream_t stream = nullptr;
    if (dev && c.use_ws) {
        size_t bytes = 0;
        spattn_status s = spattn_bsa_varlen_workspace_size(&tq, &tk, &tv, &tm, c.bx, c.by, &vl, 0, &opt, &bytes);
        check(s == SPATTN_STATUS_SUCCESS && bytes > 0, "workspace size", spattn_last_error());
        CK(cudaMalloc(&ws, bytes + 16));
        CK(cudaMemset(ws, 0x5A, bytes + 16));  // garbage: nothing may rely on its contents
        opt.workspace = (char *)ws + 16 + 4;   // 4-byte aligned only: the library aligns what it needs
        opt.workspace_size = bytes;
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        opt.cuda_stream = stream;
    }
    r.st = spattn_bsa_fwd_varlen(&tq, &tk, &tv, &tm, c.bx, c.by, 0.0, &vl, &to, with_lse ? &tl : nullptr, &opt);
    r.msg = r.st == SPATTN_STATUS_SUCCESS ? "" : spattn_last_error();
    if (dev) {
        if (stream) CK(cudaStreamSynchronize(stream));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(r.o.data(), o, r.o.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.lse.data(), l, r.lse.size(), cudaMemcpyDeviceToHost));
        cudaFree(o);
        cudaFree(l);
        cudaFree(cuq);
        cudaFree(cukv);
        if (tab) cudaFree(dtab);
        if (ws) cudaFree(ws);
        if (stream) cudaStreamDestroy(stream);
        if (fin) {
            cudaFree(q);
            cudaFree(k);
            cudaFree(v);
        }
    }
    return r;
}

static bool poison_bytes(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xFF) return false;
    return true;
}

// GPU against CPU over rows [r0, r1) (sequence rows), the padding columns and rows [r1, Tcap)
// poison.  Returns a description of the first mismatch ("" when none).
// Rows [skip0, skip1) are neither compared nor required poison.
static std::string compare(const Batch &t, const Out &g, const Out &cpu, int r0, int r1, bool with_lse,
                           int skip0 = -1, int skip1 = -1) {
    const Case &c = t.c;
    const size_t es = esz(c.dt);
    // O: a few output ulps (P is rounded to the dtype before P V); LSE (fp32, both sides near exact):
    // tight enough that one extra or missing key (log(1 + 1/n) >= 2.5e-3 for n <= 400) fails
    const double tol = c.dt == SPATTN_DTYPE_F16 ? 5e-3 : c.dt == SPATTN_DTYPE_BF16 ? 4e-2 : 2e-4;
    char buf[256];
    for (int r = 0; r < t.Tcap; r++) {
        const uint8_t *go = &g.o[(size_t)r * t.rsq * es];
        if (r >= skip0 && r < skip1) continue;
        if (r < r0 || r >= r1) {  // not this call's rows: untouched
            if (!poison_bytes(go, (size_t)t.rsq * es)) {
                snprintf(buf, sizeof buf, "o row %d (outside [%d, %d)) written", r, r0, r1);
                return buf;
            }
            if (!poison_bytes(&g.lse[(size_t)r * c.N * 4], (size_t)c.N * 4)) {
                snprintf(buf, sizeof buf, "lse row %d (outside [%d, %d)) written", r, r0, r1);
                return buf;
            }
            continue;
        }
        if (c.pad && !poison_bytes(go + (size_t)c.N * c.D * es, (size_t)c.pad * es)) {
            snprintf(buf, sizeof buf, "o row %d: padding columns written", r);
            return buf;
        }
        for (int x = 0; x < c.N * c.D; x++) {
            const float a = load_dt(g.o.data(), (size_t)r * t.rsq + x, c.dt);
            const float b = load_dt(cpu.o.data(), (size_t)r * t.rsq + x, c.dt);
            const bool ok = (isnan(a) && isnan(b)) || fabs((double)a - b) <= tol * std::max(1.0, fabs((double)b));
            if (!ok) {
                snprintf(buf, sizeof buf, "o[%d, %d, %d] = %g, cpu %g", r, x / c.D, x % c.D, a, b);
                return buf;
            }
        }
        for (int n = 0; n < c.N && with_lse; n++) {
            const float a = ((const float *)g.lse.data())[(size_t)r * c.N + n];
            const float b = ((const float *)cpu.lse.data())[(size_t)r * c.N + n];
            const bool ok = (isnan(a) && isnan(b)) || a == b || (isfinite(b) && fabs((double)a - b) <= 1e-3 + 1e-5 * fabs((double)b));
            if (!ok) {
                snprintf(buf, sizeof buf, "lse[%d, %d] = %g, cpu %g", r, n, a, b);
                return buf;
            }
        }
    }
    return "";
}

static std::string ctx_of(const Batch &t) {
    const Case &c = t.c;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "B=%d N=%d Nkv=%d D=%d bx=%d by=%d %s %s pad=%d%s ws=%d maxq=%lld maxkv=%lld ",
                     c.B, c.N, c.Nkv, c.D, c.bx, c.by, dtn(c.dt), c.causal ? "causal" : "random", c.pad,
                     c.fastin ? " (unpadded inputs)" : "", c.use_ws, t.maxq, t.maxkv);
    if (c.page)
        n += snprintf(buf + n, sizeof buf - n, "page=%d np=%d maxp=%d pgs=%lld ", c.page, t.np, t.maxp, t.pgs);
    n += snprintf(buf + n, sizeof buf - n, "cu_q=");
    for (int b = 0; b <= c.B && n < 400; b++) n += snprintf(buf + n, sizeof buf - n, "%d%s", t.cuq[b], b < c.B ? "," : "");
    n += snprintf(buf + n, sizeof buf - n, " cu_kv=");
    for (int b = 0; b <= c.B && n < 480; b++) n += snprintf(buf + n, sizeof buf - n, "%d%s", t.cukv[b], b < c.B ? "," : "");
    return buf;
}

// ---- backward -----------------------------------------------------------------------------------
// Gradients of one call: dq [Tcap rows of rsq], dk / dv [Tkv rows of rskv], host bytes (0xFF before).
struct Grad {
    std::vector<uint8_t> dq, dk, dv;
    spattn_status st;
    std::string msg;
};

// The CUDA backward takes fp16 / bf16, D <= 128 and TMA-readable rows (pad 0 or 8).
static bool bwd_fast(const Case &c) {
    return c.dt != SPATTN_DTYPE_F32 && c.D <= 128 && (c.pad % 8 == 0 || (c.fastin && !c.page));
}


// One spattn_bsa_bwd_varlen call with o / lse of `fw` (a CPU forward of the batch), dO of the batch.
// tab: paged keys (the batch's pages, table of `maxp` columns, row stride t.maxp); dk / dv are
// then pages too ([np, page, Nkv, D], page stride pgs: t.np * t.pgs elements).
static Grad run_bwd(const Batch &t, bool dev, const std::vector<int32_t> &cq, const std::vector<int32_t> &ckv,
                    const Out &fw, int det, const std::vector<int32_t> *tab = nullptr, int maxp = 0) {
    const Case &c = t.c;
    const size_t es = esz(c.dt);
    if (g_cpu_only) dev = false;
    Grad r;
    r.dq.assign((size_t)t.Tcap * t.rsq * es, 0xFF);
    r.dk.assign((tab ? (size_t)t.np * t.pgs : (size_t)t.Tkv * t.rskv) * es, 0xFF);
    r.dv.assign(r.dk.size(), 0xFF);
    void *q = dev ? t.dq : (void *)t.hq.data(), *k = dev ? t.dk : (void *)t.hk.data();
    void *v = dev ? t.dv : (void *)t.hv.data(), *m = dev ? t.dm : (void *)t.hmask.data();
    void *dtab = tab ? (void *)tab->data() : nullptr;
    if (tab) {
        k = dev ? t.dkp : (void *)t.hkp.data();
        v = dev ? t.dvp : (void *)t.hvp.data();
    }
    void *dO = dev ? t.ddo : (void *)t.hdo.data();
    void *o = (void *)fw.o.data(), *l = (void *)fw.lse.data();
    void *gq = r.dq.data(), *gk = r.dk.data(), *gv = r.dv.data();
    void *cuq = (void *)cq.data(), *cukv = (void *)ckv.data();
    if (dev) {
        void **bufs[5] = {&o, &l, &gq, &gk, &gv};
        const void *src[5] = {fw.o.data(), fw.lse.data(), r.dq.data(), r.dk.data(), r.dv.data()};
        const size_t sz[5] = {fw.o.size(), fw.lse.size(), r.dq.size(), r.dk.size(), r.dv.size()};
        for (int i = 0; i < 5; i++) {
            CK(cudaMalloc(bufs[i], sz[i]));
            CK(cudaMemcpy(*bufs[i], src[i], sz[i], cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&cuq, cq.size() * 4));
        CK(cudaMalloc(&cukv, ckv.size() * 4));
        CK(cudaMemcpy(cuq, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(cukv, ckv.data(), ckv.size() * 4, cudaMemcpyHostToDevice));
        if (tab) {
            CK(cudaMalloc(&dtab, tab->size() * 4));
            CK(cudaMemcpy(dtab, tab->data(), tab->size() * 4, cudaMemcpyHostToDevice));
        }
    }
    const int64_t shq[3] = {t.Tq, c.N, c.D}, stq[3] = {t.rsq, c.D, 1};
    const int64_t shk[3] = {t.Tkv, c.Nkv, c.D}, stk[3] = {t.rskv, c.D, 1};
    const int64_t shm[4] = {c.B, c.N, t.nbx, t.nby}, shl[2] = {t.Tq, c.N}, shc[1] = {(int64_t)cq.size()};
    // Case::fastin: q, k, v, o, dO as unpadded device copies; dq, dk, dv keep the padded rows
    const bool fin = dev && c.fastin && !tab;
    const int64_t stqi[3] = {fin ? (int64_t)c.N * c.D : t.rsq, c.D, 1}, stki[3] = {fin ? (int64_t)c.Nkv * c.D : t.rskv, c.D, 1};
    void *o_pad = o;
    if (fin) {
        q = unpadded(t.dq, t.Tq, t.rsq, c.N * c.D, es);
        k = unpadded(t.dk, t.Tkv, t.rskv, c.Nkv * c.D, es);
        v = unpadded(t.dv, t.Tkv, t.rskv, c.Nkv * c.D, es);
        dO = unpadded(t.ddo, t.Tq, t.rsq, c.N * c.D, es);
        o = unpadded(o_pad, t.Tq, t.rsq, c.N * c.D, es);
    }
    spattn_tensor tq = mk(q, c.dt, 3, shq, stqi, dev), tdo = mk(dO, c.dt, 3, shq, stqi, dev);
    spattn_tensor tk = mk(k, c.dt, 3, shk, stki, dev), tv = mk(v, c.dt, 3, shk, stki, dev);
    spattn_tensor tm = mk(m, SPATTN_DTYPE_U8, 4, shm, NULL, dev);
    spattn_tensor to = mk(o, c.dt, 3, shq, stqi, dev), tl = mk(l, SPATTN_DTYPE_F32, 2, shl, NULL, dev);
    spattn_tensor tgq = mk(gq, c.dt, 3, shq, stq, dev), tgk = mk(gk, c.dt, 3, shk, stk, dev);
    spattn_tensor tgv = mk(gv, c.dt, 3, shk, stk, dev);
    const int64_t shp[4] = {t.np, c.page, c.Nkv, c.D}, stp[4] = {t.pgs, t.rskv, c.D, 1};
    const int64_t sht[2] = {c.B, maxp}, stt[2] = {t.maxp, 1};
    spattn_tensor tt = mk(dtab, SPATTN_DTYPE_I32, 2, sht, stt, dev);
    if (tab) {
        tk = mk(k, c.dt, 4, shp, stp, dev);
        tv = mk(v, c.dt, 4, shp, stp, dev);
        tgk = mk(gk, c.dt, 4, shp, stp, dev);
        tgv = mk(gv, c.dt, 4, shp, stp, dev);
    }
    spattn_tensor tcq = mk(cuq, SPATTN_DTYPE_I32, 1, shc, NULL, dev), tckv = mk(cukv, SPATTN_DTYPE_I32, 1, shc, NULL, dev);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &tcq;
    vl.cu_seqlens_kv = &tckv;
    vl.max_seqlen_q = t.maxq;
    vl.max_seqlen_kv = t.maxkv;
    if (tab) vl.block_table = &tt;
    spattn_options opt;
    spattn_options_init(&opt);
    opt.deterministic = det;
    void *ws = nullptr;
    cudaStream_t stream = nullptr;
    if (dev && c.use_ws && bwd_fast(c) && (!tab || c.page % 8 == 0)) {
        size_t bytes = 0;
        spattn_status s = spattn_bsa_varlen_workspace_size(&tq, &tk, &tv, &tm, c.bx, c.by, &vl, 1, &opt, &bytes);
        check(s == SPATTN_STATUS_SUCCESS && bytes > 0, "backward workspace size", spattn_last_error());
        CK(cudaMalloc(&ws, bytes + 16));
        CK(cudaMemset(ws, 0x5A, bytes + 16));
        opt.workspace = (char *)ws + 16 + 4;  // 4-byte aligned only
        opt.workspace_size = bytes;
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        opt.cuda_stream = stream;
    }
    r.st = spattn_bsa_bwd_varlen(&tq, &tk, &tv, &to, &tdo, &tl, &tm, c.bx, c.by, 0.0, &vl, &tgq, &tgk, &tgv, &opt);
    r.msg = r.st == SPATTN_STATUS_SUCCESS ? "" : spattn_last_error();
    if (dev) {
        if (stream) CK(cudaStreamSynchronize(stream));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(r.dq.data(), gq, r.dq.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.dk.data(), gk, r.dk.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.dv.data(), gv, r.dv.size(), cudaMemcpyDeviceToHost));
        void *fr[7] = {o, l, gq, gk, gv, cuq, cukv};
        for (void *x : fr) cudaFree(x);
        if (fin) {
            void *fr2[5] = {q, k, v, dO, o_pad};
            for (void *x : fr2) cudaFree(x);
        }
        if (tab) cudaFree(dtab);
        if (ws) cudaFree(ws);
        if (stream) cudaStreamDestroy(stream);
    }
    return r;
}

// Eco criterion of one gradient tensor over rows [0, rows) of `cols` values (row stride rs);
// padding columns of rows < rows and every byte of rows [rows, total_rows) must stay poison
// when `tail_poison`.  Returns "" or the first problem.
static std::string eco(const char *name, const std::vector<uint8_t> &g, const std::vector<uint8_t> &cpu, int rows,
                       int total_rows, long long rs, int cols, int dt, bool tail_poison) {
    const size_t es = esz(dt);
    const double tol = dt == SPATTN_DTYPE_F16 ? 0x1p-9 : 0x1p-6, lim = dt == SPATTN_DTYPE_F16 ? 0.1 : 1.0;
    long long n = 0, okc = 0;
    double mx = 0;
    char buf[256];
    for (int r = 0; r < total_rows; r++) {
        const uint8_t *row = &g[(size_t)r * rs * es];
        if (r >= rows) {
            if (tail_poison && !poison_bytes(row, (size_t)rs * es)) {
                snprintf(buf, sizeof buf, "%s row %d (past the sequences) written", name, r);
                return buf;
            }
            if (tail_poison) continue;
        }
        if (rs > cols && !poison_bytes(row + (size_t)cols * es, (size_t)(rs - cols) * es)) {
            snprintf(buf, sizeof buf, "%s row %d: padding columns written", name, r);
            return buf;
        }
        for (int x = 0; x < cols; x++) {
            const float a = load_dt(g.data(), (size_t)r * rs + x, dt), b = load_dt(cpu.data(), (size_t)r * rs + x, dt);
            n++;
            if (isnan(b) || isnan(a)) {
                if (isnan(a) && isnan(b)) okc++;
                else mx = INFINITY;
                continue;
            }
            const double d = fabs((double)a - b);
            mx = std::max(mx, d);
            okc += d <= tol + tol * fabs((double)b);
        }
    }
    if (n && ((double)okc / n < 0.99 || !(mx <= lim))) {
        snprintf(buf, sizeof buf, "%s: matched %.4f, max abs err %g", name, (double)okc / n, mx);
        return buf;
    }
    return "";
}

static void check_bwd(const Batch &t, const Out &fw, const std::string &ctx) {
    const Case &c = t.c;
    const int endq = t.cuq[c.B];
    Grad cpu = run_bwd(t, false, t.cuq, t.cukv, fw, 1);
    check(cpu.st == SPATTN_STATUS_SUCCESS, "cpu backward", ctx + " " + cpu.msg);
    if (cpu.st != SPATTN_STATUS_SUCCESS) return;
    if (!bwd_fast(c) && !g_cpu_only) {  // refused before anything runs, nothing written
        Grad g = run_bwd(t, true, t.cuq, t.cukv, fw, 1);
        check(g.st == SPATTN_STATUS_NOT_SUPPORTED && g.msg.find("CPU") != std::string::npos,
              "backward: NOT_SUPPORTED naming the CPU backend", ctx + " " + g.msg);
        check(poison_bytes(g.dq.data(), g.dq.size()) && poison_bytes(g.dk.data(), g.dk.size()) &&
                  poison_bytes(g.dv.data(), g.dv.size()),
              "backward refusal: dq / dk / dv untouched", ctx);
        return;
    }
    for (int det = 1; det >= 0; det--) {
        Grad g = run_bwd(t, true, t.cuq, t.cukv, fw, det);
        const char *mode = det ? " (deterministic)" : " (fast)";
        check(g.st == SPATTN_STATUS_SUCCESS, "cuda backward", ctx + mode + " " + g.msg);
        if (g.st != SPATTN_STATUS_SUCCESS) continue;
        std::string d = eco("dq", g.dq, cpu.dq, endq, t.Tcap, t.rsq, c.N * c.D, c.dt, true);
        if (d.empty()) d = eco("dk", g.dk, cpu.dk, t.Tkv, t.Tkv, t.rskv, c.Nkv * c.D, c.dt, false);
        if (d.empty()) d = eco("dv", g.dv, cpu.dv, t.Tkv, t.Tkv, t.rskv, c.Nkv * c.D, c.dt, false);
        check(d.empty(), det ? "backward vs cpu (deterministic)" : "backward vs cpu (fast)", ctx + ": " + d);
        if (det) {  // dK / dV rows past cu_kv[B] are zero (bitwise, as the CPU writes them)
            const size_t es = esz(c.dt), rb = (size_t)t.rskv * es;
            bool z = true;
            for (int r = t.cukv[c.B]; r < t.Tkv && z; r++)
                for (int x = 0; x < c.Nkv * c.D; x++)
                    z = z && load_dt(g.dk.data(), (size_t)r * t.rskv + x, c.dt) == 0.f &&
                        load_dt(g.dv.data(), (size_t)r * t.rskv + x, c.dt) == 0.f;
            (void)rb;
            check(z, "dk / dv rows past cu_kv[B] zero", ctx);
            bool same = true;
            for (int rep = 0; rep < 4 && same; rep++) {
                Grad h = run_bwd(t, true, t.cuq, t.cukv, fw, 1);
                same = h.st == SPATTN_STATUS_SUCCESS && h.dq == g.dq && h.dk == g.dk && h.dv == g.dv;
            }
            check(same, "deterministic backward: 5 runs bitwise equal", ctx);
        }
    }
}

static void run_case(const Case &c, bool quick) {
    Batch t;
    make_batch(c, t);
    const std::string ctx = ctx_of(t);
    const int end = t.cuq[c.B];
    // the whole batch, with and without lse
    Out cpu = run(t, false, t.cuq, t.cukv, t.maxq, t.maxkv);
    check(cpu.st == SPATTN_STATUS_SUCCESS, "cpu call", ctx + " " + cpu.msg);
    Out g = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv);
    check(g.st == SPATTN_STATUS_SUCCESS, "cuda call", ctx + " " + g.msg);
    if (g.st == SPATTN_STATUS_SUCCESS && cpu.st == SPATTN_STATUS_SUCCESS) {
        const std::string d = compare(t, g, cpu, 0, end, true);
        check(d.empty(), "batch vs cpu", ctx + ": " + d);
        Out g2 = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv, 0, false);
        check(g2.st == SPATTN_STATUS_SUCCESS && g2.o == g.o && poison_bytes(g2.lse.data(), g2.lse.size()),
              "no lse: same o bits, lse untouched", ctx);
    }
    if (cpu.st == SPATTN_STATUS_SUCCESS) check_bwd(t, cpu, ctx);
    // each of a few sequences alone (others' query sides emptied): exactly its rows, same bits
    for (int pick = 0; pick < (quick ? 1 : 3) && g.st == SPATTN_STATUS_SUCCESS; pick++) {
        const int s = irand(0, c.B - 1);
        const int q0 = t.cuq[s], lq = t.cuq[s + 1] - q0;
        std::vector<int32_t> cq(c.B + 1, 0);
        for (int b = 0; b < c.B; b++) cq[b + 1] = cq[b] + (b == s ? lq : 0);
        Out one = run(t, true, cq, t.cukv, t.maxq, t.maxkv, q0);
        char w[96];
        snprintf(w, sizeof w, "sequence %d alone (rows [%d, %d))", s, q0, q0 + lq);
        bool ok = one.st == SPATTN_STATUS_SUCCESS;
        std::string d = ok ? compare(t, one, g, q0, q0 + lq, true) : one.msg;
        const size_t es = esz(c.dt), ob = (size_t)t.rsq * es;
        if (ok && d.empty() && memcmp(&one.o[q0 * ob], &g.o[q0 * ob], lq * ob) != 0) d = "o rows differ in bits";
        if (ok && d.empty() && memcmp(&one.lse[(size_t)q0 * c.N * 4], &g.lse[(size_t)q0 * c.N * 4], (size_t)lq * c.N * 4))
            d = "lse rows differ in bits";
        check(ok && d.empty(), w, ctx + ": " + d);
    }
    // NaN in one sequence's keys and values: the others must not see it
    if (!quick && c.B > 1) {
        const int s = irand(0, c.B - 1);
        if (t.cukv[s + 1] > t.cukv[s]) {
            Batch u = nan_keys(t, s);  // host copies; the device buffers are shared, restored below
            if (!g_cpu_only) {
                CK(cudaMemcpy(t.dk, u.hk.data(), u.hk.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(t.dv, u.hv.data(), u.hv.size(), cudaMemcpyHostToDevice));
            }
            Out cn = run(u, false, t.cuq, t.cukv, t.maxq, t.maxkv);
            Out gn = run(u, true, t.cuq, t.cukv, t.maxq, t.maxkv);
            // sequence s's own rows may differ (a NaN value reaches its masked rows through 0 * NaN in
            // the tile product: spattn.h); every other row must be exact
            std::string d = gn.st == SPATTN_STATUS_SUCCESS
                                ? compare(t, gn, cn, 0, end, true, t.cuq[s], t.cuq[s + 1])
                                : gn.msg;
            char w[64];
            snprintf(w, sizeof w, "NaN keys/values in sequence %d only", s);
            check(gn.st == SPATTN_STATUS_SUCCESS && d.empty(), w, ctx + ": " + d);
            if (!g_cpu_only) {
                CK(cudaMemcpy(t.dk, t.hk.data(), t.hk.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(t.dv, t.hv.data(), t.hv.size(), cudaMemcpyHostToDevice));
            }
        }
    }
    printf("  %-4s %s\n", g_fail ? "..." : "ok", ctx.c_str());
    free_batch(t);
}

// The Hopper forward's shapes (fp16 / bf16, D <= 128, TMA-readable rows); paged besides: a page
// size that is a multiple of 8.  Elsewhere the reference kernel runs.
static bool hopper_shape(const Case &c) { return bwd_fast(c); }  // the backward's shapes

// The dk / dv pages as np * page rows of Nkv * D values (into rows); "" or a note when a byte
// outside them (row padding, page padding) is not poison.
static std::string page_rows(const Batch &t, const std::vector<uint8_t> &g, std::vector<uint8_t> &rows) {
    const Case &c = t.c;
    const size_t es = esz(c.dt), rb = (size_t)c.Nkv * c.D * es;
    std::vector<uint8_t> rest = g;
    rows.assign((size_t)t.np * c.page * rb, 0);
    for (int p = 0; p < t.np; p++)
        for (int r = 0; r < c.page; r++) {
            const size_t off = ((size_t)p * t.pgs + (size_t)r * t.rskv) * es;
            memcpy(&rows[((size_t)p * c.page + r) * rb], &g[off], rb);
            memset(&rest[off], 0xFF, rb);
        }
    return poison_bytes(rest.data(), rest.size()) ? "" : "padding of the dk / dv pages written";
}

// The paged backward (o / lse of the CPU's paged forward `fw`): CUDA against the CPU's paged
// backward (eco criterion on dq and on every page row of dk / dv), rows no sequence uses exactly 0,
// `reps` deterministic runs bitwise equal, and bitwise against the CUDA packed backward on the same
// values: dq, and the dk / dv rows of pages one sequence uses (same kernel, same fp32 values, one
// rounding).  Shapes the CUDA backward does not take: NOT_SUPPORTED naming the CPU, nothing written.
static void check_bwd_paged(const Batch &t, const Out &fw, const std::string &ctx, int reps) {
    const Case &c = t.c;
    const int endq = t.cuq[c.B], ps = c.page, prow = t.np * ps, cols = c.Nkv * c.D;
    Grad cpu = run_bwd(t, false, t.cuq, t.cukv, fw, 1, &t.tab, t.maxp);
    check(cpu.st == SPATTN_STATUS_SUCCESS, "cpu paged backward", ctx + " " + cpu.msg);
    if (cpu.st != SPATTN_STATUS_SUCCESS) return;
    if ((!bwd_fast(c) || ps % 8 != 0) && !g_cpu_only) {
        Grad g = run_bwd(t, true, t.cuq, t.cukv, fw, 1, &t.tab, t.maxp);
        check(g.st == SPATTN_STATUS_NOT_SUPPORTED && g.msg.find("CPU") != std::string::npos,
              "paged backward: NOT_SUPPORTED naming the CPU backend", ctx + " " + g.msg);
        check(poison_bytes(g.dq.data(), g.dq.size()) && poison_bytes(g.dk.data(), g.dk.size()) &&
                  poison_bytes(g.dv.data(), g.dv.size()),
              "paged backward refusal: dq / dk / dv untouched", ctx);
        return;
    }
    // users of each page and the page rows some sequence owns
    std::vector<int> users(t.np, 0);
    std::vector<char> owned((size_t)prow, 0);
    for (int b = 0; b < c.B; b++) {
        const int len = t.cukv[b + 1] - t.cukv[b];
        for (int j = 0; j < len; j++) {
            const int pg = t.tab[(size_t)b * t.maxp + j / ps];
            owned[(size_t)pg * ps + j % ps] = 1;
            if (j % ps == 0) users[pg]++;
        }
    }
    std::vector<uint8_t> ck, cv;
    page_rows(t, cpu.dk, ck);
    page_rows(t, cpu.dv, cv);
    const size_t es = esz(c.dt), rb = (size_t)cols * es;
    for (int det = 1; det >= 0; det--) {
        Grad g = run_bwd(t, true, t.cuq, t.cukv, fw, det, &t.tab, t.maxp);
        const char *mode = det ? " (deterministic)" : " (fast)";
        check(g.st == SPATTN_STATUS_SUCCESS, "cuda paged backward", ctx + mode + " " + g.msg);
        if (g.st != SPATTN_STATUS_SUCCESS) continue;
        std::vector<uint8_t> gk, gv;
        std::string d = eco("dq", g.dq, cpu.dq, endq, t.Tcap, t.rsq, c.N * c.D, c.dt, true);
        if (d.empty()) d = page_rows(t, g.dk, gk);
        if (d.empty()) d = page_rows(t, g.dv, gv);
        if (d.empty()) d = eco("dk pages", gk, ck, prow, prow, cols, cols, c.dt, false);
        if (d.empty()) d = eco("dv pages", gv, cv, prow, prow, cols, cols, c.dt, false);
        check(d.empty(), det ? "paged backward vs cpu (deterministic)" : "paged backward vs cpu (fast)", ctx + ": " + d);
        if (!det || !d.empty()) continue;
        bool z = true;  // rows no sequence uses: 0 (NaN in k / v there must not reach them)
        for (int r = 0; r < prow && z; r++)
            if (!owned[r])
                for (int x = 0; x < cols; x++)
                    z = z && load_dt(gk.data(), (size_t)r * cols + x, c.dt) == 0.f &&
                        load_dt(gv.data(), (size_t)r * cols + x, c.dt) == 0.f;
        check(z, "paged backward: page rows no sequence uses are 0", ctx);
        bool same = true;
        for (int rep = 1; rep < reps && same; rep++) {
            Grad h = run_bwd(t, true, t.cuq, t.cukv, fw, 1, &t.tab, t.maxp);
            same = h.st == SPATTN_STATUS_SUCCESS && h.dq == g.dq && h.dk == g.dk && h.dv == g.dv;
        }
        char w[80];
        snprintf(w, sizeof w, "paged deterministic backward: %d runs bitwise equal", reps);
        check(same, w, ctx);
        // the packed backward on the same values (needs a packed batch TMA can read: as the paged one)
        Grad gp = run_bwd(t, true, t.cuq, t.cukv, fw, 1);
        d = gp.st == SPATTN_STATUS_SUCCESS ? "" : "packed call: " + gp.msg;
        if (d.empty() && gp.dq != g.dq) d = "dq bits differ";
        for (int b = 0; b < c.B && d.empty(); b++)
            for (int j = 0; j < t.cukv[b + 1] - t.cukv[b] && d.empty(); j++) {
                const int pg = t.tab[(size_t)b * t.maxp + j / ps];
                if (users[pg] != 1) continue;
                const size_t pr = ((size_t)pg * ps + j % ps) * rb, kr = (size_t)(t.cukv[b] + j) * t.rskv * es;
                if (memcmp(&gk[pr], &gp.dk[kr], rb) || memcmp(&gv[pr], &gp.dv[kr], rb)) {
                    char m[96];
                    snprintf(m, sizeof m, "dk / dv bits differ: sequence %d key %d (page %d)", b, j, pg);
                    d = m;
                }
            }
        check(d.empty(), "paged backward = packed (cuda), bitwise: dq, rows of unshared pages", ctx + ": " + d);
    }
}

// A paged batch: CUDA against the CPU's paged forward, and against the CUDA packed forward on the
// same values (bitwise when both take the same kernel); sequence-alone calls; NaN in one
// sequence's pages; the paged backward (check_bwd_paged, `reps` deterministic runs bitwise equal).
static void run_case_paged(const Case &c, bool quick, int reps = 3) {
    Batch t;
    make_batch(c, t);
    const std::string ctx = ctx_of(t);
    const int end = t.cuq[c.B];
    Out cpu = run(t, false, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);
    check(cpu.st == SPATTN_STATUS_SUCCESS, "cpu paged call", ctx + " " + cpu.msg);
    Out g = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);
    check(g.st == SPATTN_STATUS_SUCCESS, "cuda paged call", ctx + " " + g.msg);
    if (g.st == SPATTN_STATUS_SUCCESS && cpu.st == SPATTN_STATUS_SUCCESS) {
        std::string d = compare(t, g, cpu, 0, end, true);
        check(d.empty(), "paged batch vs cpu", ctx + ": " + d);
        Out gp = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv);  // packed keys, same values
        const bool same_kernel = c.page % 8 == 0 || !hopper_shape(c);
        if (gp.st != SPATTN_STATUS_SUCCESS) d = "packed call: " + gp.msg;
        else if (same_kernel) d = gp.o == g.o && gp.lse == g.lse ? "" : "bits differ: " + compare(t, g, gp, 0, end, true);
        else d = compare(t, g, gp, 0, end, true);
        check(d.empty(), same_kernel ? "paged = packed (cuda), bitwise" : "paged (reference) vs packed (Hopper)",
              ctx + ": " + d);
        Out g2 = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv, 0, false, &t.tab, t.maxp);
        check(g2.st == SPATTN_STATUS_SUCCESS && g2.o == g.o && poison_bytes(g2.lse.data(), g2.lse.size()),
              "paged, no lse: same o bits, lse untouched", ctx);
    }
    if (cpu.st == SPATTN_STATUS_SUCCESS) check_bwd_paged(t, cpu, ctx, reps);
    for (int pick = 0; pick < (quick ? 1 : 3) && g.st == SPATTN_STATUS_SUCCESS; pick++) {
        const int s = irand(0, c.B - 1);
        const int q0 = t.cuq[s], lq = t.cuq[s + 1] - q0;
        std::vector<int32_t> cq(c.B + 1, 0);
        for (int b = 0; b < c.B; b++) cq[b + 1] = cq[b] + (b == s ? lq : 0);
        Out one = run(t, true, cq, t.cukv, t.maxq, t.maxkv, q0, true, &t.tab, t.maxp);
        char w[96];
        snprintf(w, sizeof w, "paged: sequence %d alone (rows [%d, %d))", s, q0, q0 + lq);
        bool ok = one.st == SPATTN_STATUS_SUCCESS;
        std::string d = ok ? compare(t, one, g, q0, q0 + lq, true) : one.msg;
        const size_t es = esz(c.dt), ob = (size_t)t.rsq * es;
        if (ok && d.empty() && memcmp(&one.o[q0 * ob], &g.o[q0 * ob], lq * ob) != 0) d = "o rows differ in bits";
        if (ok && d.empty() && memcmp(&one.lse[(size_t)q0 * c.N * 4], &g.lse[(size_t)q0 * c.N * 4], (size_t)lq * c.N * 4))
            d = "lse rows differ in bits";
        check(ok && d.empty(), w, ctx + ": " + d);
    }
    if (!quick && c.B > 1) {  // NaN in one sequence's pages: the others must not see it
        const int s = irand(0, c.B - 1);
        // (not a sequence whose first page another one reads: that one sees the NaN keys too, and
        // rows of its query tiles that do not attend them may get NaN through 0 * NaN, the CUDA
        // exception documented in spattn.h)
        if (t.cukv[s + 1] > t.cukv[s] && s != t.shared[0] && s != t.shared[1]) {
            Batch u = nan_keys(t, s);  // host copies; the device pages are shared, restored below
            fill_pages(u, u.hk, u.hv);
            if (!g_cpu_only) {
                CK(cudaMemcpy(t.dkp, u.hkp.data(), u.hkp.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(t.dvp, u.hvp.data(), u.hvp.size(), cudaMemcpyHostToDevice));
            }
            Out cn = run(u, false, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);
            Out gn = run(u, true, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);
            std::string d = gn.st == SPATTN_STATUS_SUCCESS
                                ? compare(t, gn, cn, 0, end, true, t.cuq[s], t.cuq[s + 1])
                                : gn.msg;
            char w[64];
            snprintf(w, sizeof w, "paged: NaN pages of sequence %d only", s);
            check(gn.st == SPATTN_STATUS_SUCCESS && d.empty(), w, ctx + ": " + d);
            if (!g_cpu_only) {
                CK(cudaMemcpy(t.dkp, t.hkp.data(), t.hkp.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(t.dvp, t.hvp.data(), t.hvp.size(), cudaMemcpyHostToDevice));
            }
        }
    }
    printf("  %-4s %s\n", g_fail ? "..." : "ok", ctx.c_str());
    free_batch(t);
}

// Bad block tables (and a bad prefix sum beside one): the CUDA paged forward answers as the CPU
// (status and message) and writes nothing; a good call afterwards passes.
static void bad_tables() {
    for (int fast = 0; fast < 2; fast++) {
        //       B  N Nkv  D  bx  by  dt                                             maxq maxkv kv causal dens pad ws ls page
        Case c = {5, 2, 1, 64, 64, 64, fast ? SPATTN_DTYPE_F16 : SPATTN_DTYPE_F32, 100, 100, 1, 0, 0.5, 0, 0, 1, 16};
        Batch t;
        make_batch(c, t);  // long-short, kv = q: sequence 0 has 100 keys (7 pages), the others <= 40
        const int B = c.B, r = 0, mp = t.maxp;
        int first = -1, last = -1;  // the first and last rows with pages
        for (int b = 0; b < B; b++)
            if (t.cukv[b + 1] > t.cukv[b]) {
                if (first < 0) first = b;
                last = b;
            }
        auto slot = [&](std::vector<int32_t> &tb, int b, int j) -> int32_t & { return tb[(size_t)b * mp + j]; };
        struct Bad {
            std::string what;
            std::vector<int32_t> tab, cq;
            int maxp;
        };
        std::vector<Bad> bads;
        auto add = [&](const std::string &w) { bads.push_back({w, t.tab, t.cuq, mp}); return &bads.back(); };
        slot(add("page id = num_pages")->tab, r, 1) = t.np;
        slot(add("page id -1")->tab, r, 0) = -1;
        {
            Bad *b = add("a page twice in a row");
            slot(b->tab, r, 3) = slot(b->tab, r, 1);
        }
        {
            Bad *b = add("a repeat at slot 2 before an id out of range at slot 4");
            slot(b->tab, r, 2) = slot(b->tab, r, 0);
            slot(b->tab, r, 4) = t.np + 7;
        }
        {
            Bad *b = add("an id out of range at slot 1 before a repeat at slot 5");
            slot(b->tab, r, 5) = slot(b->tab, r, 0);
            slot(b->tab, r, 1) = -3;
        }
        if (first >= 0 && last > first) {
            Bad *b = add("bad ids in two rows (the first row's named)");
            slot(b->tab, last, 0) = t.np;
            slot(b->tab, first, 0) = -1;
        }
        add("a row too short for its sequence (max_pages 6 < 7 pages)")->maxp = (100 + 15) / 16 - 1;
        {
            Bad *b = add("cu_seqlens_q[0] != 0 beside a bad page id (the prefix sum named)");
            slot(b->tab, r, 1) = t.np;
            b->cq[0] = 1;
        }
        const Out fw = run(t, false, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);  // good forward
        for (const Bad &b : bads) {
            Out cpu = run(t, false, b.cq, t.cukv, t.maxq, t.maxkv, 0, true, &b.tab, b.maxp);
            Out g = run(t, true, b.cq, t.cukv, t.maxq, t.maxkv, 0, true, &b.tab, b.maxp);
            const std::string ctx = b.what + (fast ? " (Hopper)" : " (reference)") + ": cpu \"" + cpu.msg +
                                    "\" cuda \"" + g.msg + "\"";
            check(cpu.st == SPATTN_STATUS_BAD_INDEX, "cpu refuses the table", ctx);
            check(g.st == cpu.st && g.msg == cpu.msg, "cuda paged: same status and message as the cpu", ctx);
            check(poison_bytes(g.o.data(), g.o.size()) && poison_bytes(g.lse.data(), g.lse.size()),
                  "cuda paged: o and lse untouched", ctx);
            if (fast) {  // the paged backward (o / lse of a good CPU forward): same refusal, nothing written
                Grad gc = run_bwd(t, false, b.cq, t.cukv, fw, 1, &b.tab, b.maxp);
                Grad gg = run_bwd(t, true, b.cq, t.cukv, fw, 1, &b.tab, b.maxp);
                const std::string bctx = b.what + " (paged backward): cpu \"" + gc.msg + "\" cuda \"" + gg.msg + "\"";
                check(gc.st == SPATTN_STATUS_BAD_INDEX, "cpu paged backward refuses the table", bctx);
                check(gg.st == gc.st && gg.msg == gc.msg, "cuda paged backward: same status and message as the cpu", bctx);
                check(poison_bytes(gg.dq.data(), gg.dq.size()) && poison_bytes(gg.dk.data(), gg.dk.size()) &&
                          poison_bytes(gg.dv.data(), gg.dv.size()),
                      "cuda paged backward: dq / dk / dv untouched", bctx);
            }
        }
        Out cpu = run(t, false, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);
        Out g = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv, 0, true, &t.tab, t.maxp);
        check(g.st == SPATTN_STATUS_SUCCESS && compare(t, g, cpu, 0, t.cuq[B], true).empty(),
              "paged: good call after bad tables", ctx_of(t) + " " + g.msg);
        free_batch(t);
    }
}

// Bad prefix sums: the CUDA call must answer as the CPU does (status and message) and write nothing.
static void bad_prefix_sums() {
    Case c = {4, 2, 1, 64, 64, 64, SPATTN_DTYPE_F16, 100, 100, 0, 0, 0.5, 0, 0, 0};
    for (int fast = 0; fast < 2; fast++) {
        c.dt = fast ? SPATTN_DTYPE_F16 : SPATTN_DTYPE_F32;  // Hopper forward and the reference path
        Batch t;
        make_batch(c, t);
        // each edit makes the CPU's value check fail (the mask keeps the case's max_seqlen shape)
        struct Bad {
            const char *what;
            int side;  // 0 q, 1 kv
            int idx, val;
            int lengthen;  // instead: sequence 1 made longer than max_seqlen (later sums shifted)
        };
        const int B = c.B;
        std::vector<Bad> bads = {
            {"q: non-monotone", 0, 2, t.cuq[1] - 1, 0},
            {"q: past T", 0, B, t.Tq + 1, 0},
            {"q: [0] != 0", 0, 0, 1, 0},
            {"q: longer than max_seqlen_q", 0, 0, 0, 1},
            {"kv: non-monotone", 1, 1, -5, 0},
            {"kv: past T", 1, B, t.Tkv + 3, 0},
            {"kv: longer than max_seqlen_kv", 1, 0, 0, 1},
        };
        for (const Bad &b : bads) {
            std::vector<int32_t> cq = t.cuq, ckv = t.cukv;
            std::vector<int32_t> &cu = b.side ? ckv : cq;
            if (b.lengthen)
                for (int x = 2; x <= B; x++) cu[x] += (int)(b.side ? t.maxkv : t.maxq) + 1;
            else cu[b.idx] = b.val;
            Out cpu = run(t, false, cq, ckv, t.maxq, t.maxkv);
            Out g = run(t, true, cq, ckv, t.maxq, t.maxkv);
            std::string ctx = std::string(b.what) + (fast ? " (Hopper)" : " (reference)") + ": cpu \"" + cpu.msg +
                              "\" cuda \"" + g.msg + "\"";
            check(cpu.st == SPATTN_STATUS_BAD_INDEX, "cpu refuses", ctx);
            check(g.st == cpu.st && g.msg == cpu.msg, "cuda: same status and message as the cpu", ctx);
            check(poison_bytes(g.o.data(), g.o.size()) && poison_bytes(g.lse.data(), g.lse.size()),
                  "cuda: o and lse untouched", ctx);
            if (fast) {  // the backward (o / lse of a good CPU forward): same refusal, nothing written
                Out fw = run(t, false, t.cuq, t.cukv, t.maxq, t.maxkv);
                Grad gc = run_bwd(t, false, cq, ckv, fw, 1), gg = run_bwd(t, true, cq, ckv, fw, 1);
                const std::string bctx = std::string(b.what) + " (backward): cpu \"" + gc.msg + "\" cuda \"" + gg.msg + "\"";
                check(gc.st == SPATTN_STATUS_BAD_INDEX, "cpu backward refuses", bctx);
                check(gg.st == gc.st && gg.msg == gc.msg, "cuda backward: same status and message as the cpu", bctx);
                check(poison_bytes(gg.dq.data(), gg.dq.size()) && poison_bytes(gg.dk.data(), gg.dk.size()) &&
                          poison_bytes(gg.dv.data(), gg.dv.size()),
                      "cuda backward: dq / dk / dv untouched", bctx);
            }
        }
        // and a good call right after (no state left behind)
        Out cpu = run(t, false, t.cuq, t.cukv, t.maxq, t.maxkv);
        Out g = run(t, true, t.cuq, t.cukv, t.maxq, t.maxkv);
        check(g.st == SPATTN_STATUS_SUCCESS && compare(t, g, cpu, 0, t.cuq[B], true).empty(),
              "good call after bad ones", ctx_of(t));
        free_batch(t);
    }
}

// The forms CUDA does not run (the paged backward with a page size that is not a multiple of 8)
// answer NOT_SUPPORTED before touching anything; the workspace query gives 0 bytes for them.
static void unsupported_forms() {
    const int B = 2, N = 2, D = 64, T = 16, PS = 12;
    void *q, *o, *cu, *tab, *m, *g[3], *kp;
    CK(cudaMalloc(&q, T * N * D * 2));
    CK(cudaMalloc(&o, T * N * D * 2));
    CK(cudaMalloc(&kp, 2 * PS * N * D * 2));
    for (int i = 0; i < 3; i++) CK(cudaMalloc(&g[i], 2 * PS * N * D * 2));
    CK(cudaMalloc(&cu, (B + 1) * 4));
    CK(cudaMalloc(&tab, B * 4));
    CK(cudaMalloc(&m, B * N));
    const int32_t hcu[3] = {0, 8, 16}, htab[2] = {0, 1};
    CK(cudaMemcpy(cu, hcu, sizeof hcu, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tab, htab, sizeof htab, cudaMemcpyHostToDevice));
    const int64_t shq[3] = {T, N, D}, shc[1] = {B + 1}, shm[4] = {B, N, 1, 1}, shl[2] = {T, N};
    const int64_t shp[4] = {2, PS, N, D}, sht[2] = {B, 1};
    spattn_tensor tq = mk(q, SPATTN_DTYPE_F16, 3, shq, NULL, true), to = mk(o, SPATTN_DTYPE_F16, 3, shq, NULL, true);
    spattn_tensor tc = mk(cu, SPATTN_DTYPE_I32, 1, shc, NULL, true), tm = mk(m, SPATTN_DTYPE_U8, 4, shm, NULL, true);
    spattn_tensor tp = mk(kp, SPATTN_DTYPE_F16, 4, shp, NULL, true), tt = mk(tab, SPATTN_DTYPE_I32, 2, sht, NULL, true);
    float *l;
    CK(cudaMalloc(&l, T * N * 4));
    spattn_tensor tl = mk(l, SPATTN_DTYPE_F32, 2, shl, NULL, true);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &tc;
    vl.cu_seqlens_kv = &tc;
    vl.max_seqlen_q = 8;
    vl.max_seqlen_kv = 8;
    spattn_tensor tg[3];  // dq, dk, dv: distinct buffers (aliasing is checked first)
    for (int i = 0; i < 3; i++) tg[i] = mk(g[i], SPATTN_DTYPE_F16, 3, shq, NULL, true);
    (void)tg;
    vl.block_table = &tt;
    spattn_tensor tgp[2];  // paged dk, dv (pages, as k)
    for (int i = 0; i < 2; i++) tgp[i] = mk(g[i + 1], SPATTN_DTYPE_F16, 4, shp, NULL, true);
    spattn_status s = spattn_bsa_bwd_varlen(&tq, &tp, &tp, &to, &tq, &tl, &tm, 64, 64, 0.0, &vl, &tg[0], &tgp[0], &tgp[1], NULL);
    check(s == SPATTN_STATUS_NOT_SUPPORTED && strstr(spattn_last_error(), "multiple of 8"),
          "cuda paged backward, page size 12: NOT_SUPPORTED", spattn_last_error());
    size_t wsb = 1;
    s = spattn_bsa_varlen_workspace_size(&tq, &tp, &tp, &tm, 64, 64, &vl, 1, NULL, &wsb);
    check(s == SPATTN_STATUS_SUCCESS && wsb == 0, "cuda paged backward workspace query, page size 12: 0 bytes",
          spattn_last_error());
    cudaFree(q);
    cudaFree(o);
    cudaFree(cu);
    cudaFree(tab);
    cudaFree(m);
    cudaFree(l);
    cudaFree(kp);
    for (int i = 0; i < 3; i++) cudaFree(g[i]);
}

// A random batch: B 1..12 sequences of up to 400 queries / keys, every block size the kernels
// treat differently, GQA, both dtypes, padded rows, caller workspace.
static Case random_case() {
    static const int blocks[] = {16, 48, 64, 128, 32, 7, 80, 200};
    Case r = {};
    r.B = irand(1, 12);
    r.Nkv = irand(1, 2);
    r.N = r.Nkv * irand(1, 3);
    r.D = urand() < 0.5 ? 64 : 128;
    r.bx = blocks[irand(0, 7)];
    r.by = blocks[irand(0, 7)];
    r.dt = urand() < 0.5 ? SPATTN_DTYPE_F16 : SPATTN_DTYPE_BF16;
    r.maxq = irand(1, 400);
    r.maxkv = irand(1, 400);
    r.kvmode = irand(0, 2);
    r.causal = irand(0, 1);
    r.density = urand();
    r.pad = urand() < 0.25 ? 8 : 0;
    r.use_ws = urand() < 0.3;
    return r;
}

int main(int argc, char **argv) {
    int a = 1;
    if (argc > a && !strcmp(argv[a], "selftest")) {
        g_cpu_only = true;
        a++;
    }
    int ndev = 0;
    if (!g_cpu_only && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)) {
        printf("bsa_varlen_cuda_check: no CUDA device visible: skipped\n");
        return 0;
    }
    const bool quick = argc > a && !strcmp(argv[a], "quick");
    const int F16 = SPATTN_DTYPE_F16, BF = SPATTN_DTYPE_BF16, F32 = SPATTN_DTYPE_F32;
    std::vector<Case> v;
    //             B  N Nkv   D   bx   by  dt   maxq maxkv kv causal dens pad ws
    v.push_back({3, 2, 1, 64, 64, 64, F16, 150, 150, 1, 1, 0.5, 0, 0, 0});
    v.push_back({5, 4, 2, 128, 48, 48, BF, 200, 260, 0, 0, 0.5, 8, 1, 0});
    // Hopper kernels reading unpadded inputs, outputs with rows TMA cannot write (pad 4):
    // per-element o / dq / dk / dv stores (the other packed calls store o, dk, dv by TMA)
    v.push_back({4, 4, 2, 128, 64, 64, BF, 200, 260, 1, 1, 0.5, 4, 0, 0, 0, 0, 1});
    // paged keys (last field: page size)
    std::vector<Case> pv;
    pv.push_back({3, 2, 1, 64, 64, 64, F16, 150, 150, 1, 1, 0.5, 0, 0, 0, 16});     // chunks 64, slabs 16
    pv.push_back({5, 4, 2, 128, 48, 48, BF, 200, 260, 0, 0, 0.5, 8, 1, 0, 48});    // chunks 128, slabs 16
    pv.push_back({3, 2, 1, 64, 16, 32, F16, 60, 70, 0, 0, 0.6, 0, 0, 0, 12});      // page 12: reference
    // the paged backward: a page shared by two sequences, GQA
    pv.push_back({4, 4, 2, 64, 64, 64, F16, 200, 200, 1, 1, 0.5, 0, 0, 0, 64, 1});
    pv.push_back({5, 6, 2, 128, 48, 48, BF, 300, 300, 0, 0, 0.5, 0, 1, 0, 128, 1});
    if (!quick) {
        pv.push_back({6, 2, 1, 64, 128, 128, BF, 260, 400, 0, 0, 0.6, 0, 1, 0, 32});  // chunks 128, slabs 32
        pv.push_back({4, 4, 4, 128, 16, 16, F16, 200, 200, 2, 1, 0.5, 8, 0, 0, 64});  // chunks 16, slabs 16
        pv.push_back({3, 2, 1, 64, 48, 48, BF, 300, 500, 0, 0, 0.5, 0, 0, 0, 128});   // chunks 128, slabs 128
        pv.push_back({4, 3, 1, 128, 64, 32, F16, 300, 700, 0, 1, 0.5, 0, 1, 0, 256}); // chunks 32, pages 256
        pv.push_back({5, 4, 2, 64, 32, 80, BF, 200, 300, 1, 1, 0.5, 0, 0, 0, 48});    // by 80, page 48
        pv.push_back({4, 2, 2, 128, 7, 48, F16, 150, 260, 0, 0, 0.4, 8, 0, 0, 80});   // per-token mask, page 80
        pv.push_back({4, 2, 1, 64, 64, 64, F16, 150, 200, 0, 1, 0.5, 0, 0, 0, 24});   // page 24: slabs of 8
        pv.push_back({3, 2, 1, 64, 16, 32, F16, 90, 90, 1, 1, 0.6, 0, 0, 0, 5});      // page 5: reference
        pv.push_back({3, 2, 1, 64, 16, 32, F32, 90, 90, 1, 1, 0.6, 0, 1, 0, 16});     // fp32: reference
        pv.push_back({3, 2, 1, 192, 16, 16, F16, 70, 90, 0, 0, 0.6, 0, 0, 0, 32});    // D 192: reference
        pv.push_back({3, 2, 1, 64, 64, 64, F16, 90, 90, 1, 1, 0.6, 4, 0, 0, 16});     // rows TMA cannot read
        pv.push_back({40, 2, 1, 64, 16, 32, F16, 30, 30, 1, 1, 0.5, 0, 0, 0, 16});    // many short sequences
        pv.push_back({2, 2, 1, 128, 128, 128, BF, 2000, 2000, 1, 1, 0.5, 0, 0, 0, 64}); // long sequences
        pv.push_back({9, 4, 2, 128, 64, 64, BF, 700, 700, 1, 1, 0.5, 0, 1, 1, 32});   // one long among short
        pv.push_back({3, 2, 1, 64, 1000, 1000, F16, 700, 700, 0, 0, 1.0, 0, 0, 0, 16}); // blocks > every sequence
        pv.push_back({3, 2, 1, 128, 64, 64, BF, 600, 600, 1, 1, 0.5, 0, 0, 0, 256, 1}); // shared 256-row page
        pv.push_back({6, 4, 1, 64, 16, 16, F16, 150, 260, 0, 0, 0.4, 8, 1, 0, 16, 1});  // shared, padded, ws
        pv.push_back({3, 2, 2, 128, 64, 64, F16, 200, 200, 1, 1, 0.5, 0, 0, 0, 48, 1});  // shared page of 48
    }
    if (!quick) {
        v.push_back({8, 4, 1, 128, 128, 128, F16, 300, 300, 2, 1, 0.5, 0, 0, 0});  // cached prefix, causal
        v.push_back({17, 2, 2, 64, 16, 16, BF, 90, 90, 0, 0, 0.3, 0, 0, 0});      // 16-key chunks
        v.push_back({6, 4, 4, 128, 64, 32, F16, 260, 400, 0, 0, 0.6, 0, 1, 0});  // 32-key chunks
        v.push_back({4, 2, 1, 64, 3, 48, F16, 200, 200, 1, 1, 0.5, 0, 0, 0});    // bx < 5: per-token mask
        v.push_back({4, 3, 1, 128, 48, 80, BF, 400, 400, 1, 1, 0.5, 8, 0, 0});   // by 80: aligned 128-key tiles
        v.push_back({2, 2, 1, 128, 1000, 1000, F16, 700, 700, 0, 0, 1.0, 0, 0, 0});  // blocks > every sequence
        v.push_back({3, 2, 2, 40, 16, 32, F16, 100, 120, 0, 0, 0.6, 0, 0, 0});    // D 40 -> padded 64
        v.push_back({3, 2, 1, 96, 24, 64, BF, 120, 140, 0, 0, 0.6, 0, 0, 0});     // D 96 -> padded 128
        v.push_back({3, 2, 1, 64, 16, 32, F32, 90, 90, 1, 1, 0.6, 0, 1, 0});      // fp32: reference kernel
        v.push_back({3, 2, 1, 192, 16, 16, F16, 70, 90, 0, 0, 0.6, 0, 0, 0});     // D 192: reference kernel
        v.push_back({3, 2, 1, 64, 64, 64, F16, 90, 90, 1, 1, 0.6, 4, 0, 0});      // row stride TMA cannot read
        v.push_back({2, 2, 1, 128, 128, 128, BF, 2000, 2000, 1, 1, 0.5, 0, 0, 0}); // long sequences
        v.push_back({40, 2, 1, 64, 16, 32, F16, 30, 30, 1, 1, 0.5, 0, 0, 0});    // many short sequences
        v.push_back({9, 4, 2, 128, 64, 64, BF, 700, 700, 1, 1, 0.5, 0, 1, 1}); // one long among short ones
        v.push_back({6, 4, 1, 64, 7, 48, F16, 150, 200, 0, 0, 0.4, 8, 0, 0});    // odd bx != by, GQA 4/1
        v.push_back({5, 2, 1, 64, 16, 32, F16, 150, 200, 0, 0, 0.5, 4, 1, 0, 0, 0, 1});  // as the quick one, ws
        const char *seed = getenv("SPATTN_TEST_SEED");
        g_rng = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + 1;
        printf("random batches: seed %llu (SPATTN_TEST_SEED replays)\n", (unsigned long long)g_rng);
        for (int i = 0; i < 20; i++) v.push_back(random_case());
        const int pages[] = {16, 24, 32, 48, 64, 80, 128, 256, 5, 12};
        for (int i = 0; i < 12; i++) {
            Case r = random_case();
            r.page = pages[irand(0, 9)];
            pv.push_back(r);
        }
    } else {
        g_rng = 0x5eed;
    }
    for (const Case &c : v) run_case(c, quick);
    for (size_t i = 0; i < pv.size(); i++) run_case_paged(pv[i], quick, i == 0 ? 20 : 3);  // one case: 20 runs
    bad_prefix_sums();
    bad_tables();
    if (!g_cpu_only) unsupported_forms();
    printf("bsa_varlen_cuda_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/*
 * Sizes and scalars at the limits (issue 16, defects 1, 2, 6, 7 and int64 offsets):
 *   - sfa with S2 > 2^31 and 2^32: key numbers stay 64-bit (an overlapping view of a sparse,
 *     reserved-but-untouched mapping makes the keys' memory distinct without 8 GB of RAM);
 *   - stride-0 (broadcast) k / v of huge logical size (Skv, S2 ~ 2^33): the forward visits
 *     only the attended keys, at offsets beyond 2^32, and counts them right (LSE);
 *   - bx, by far beyond S (2^40, 2^62, INT64_MAX): fast, no overflow, same bits as bx = S;
 *   - scales that overflow fp32 are rejected before any write;
 *   - batch strides of 2^32 elements on every tensor, forward and backward (bsa, sfa).
 * Build: part of ctest (cmake --build build && ctest --test-dir build -R test_limits).
 */
#define _DEFAULT_SOURCE /* mmap flags, alarm */
#include <float.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dtype.h"
#include "testutil.h"

/* ---- sfa beyond 2^31 keys ---------------------------------------------------------------- */
/* k [1, S2, 1, D] fp16 with strides [0, 1, 0, 1]: row j is buf[j .. j+D) (inputs may overlap),
 * so the view needs S2 + D elements; the mapping is reserved without backing and only the
 * pages near the keys we write are ever touched. */
static void sfa_big_s2(int64_t S2, int64_t sbs, int32_t index) {
    enum { D = 8 };
    size_t bytes = (size_t)(S2 + D + sbs) * 2;
    uint16_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (buf == MAP_FAILED) {
        /* the only reason to skip: the OS refuses a sparse reservation of this size */
        printf("sfa S2=%lld: cannot reserve %zu bytes of address space, skipped\n",
               (long long)S2, bytes);
        return;
    }
    tu_rng r;
    tu_seed(&r, (uint64_t)S2);
    const int64_t j0 = (int64_t)index * sbs;
    uint16_t small[D + 128];
    for (int64_t t = 0; t < sbs + D; t++) {
        small[t] = spattn_f32_to_f16((float)(tu_uniform(&r) * 2 - 1));
        buf[j0 + t] = small[t];
        /* what a key number cut to 32 bits would read instead: different values */
        buf[(j0 + t) & 0xffffffffu] = spattn_f32_to_f16((float)(tu_uniform(&r) * 4 + 3));
        buf[(uint32_t)(int32_t)(j0 + t)] = spattn_f32_to_f16(-5.0f);
    }
    /* restore the keys in case a truncated position aliased them */
    for (int64_t t = 0; t < sbs + D; t++) buf[j0 + t] = small[t];

    uint16_t q[D], o_big[D], o_small[D];
    for (int d = 0; d < D; d++) q[d] = spattn_f32_to_f16((float)(tu_uniform(&r) * 2 - 1));
    float lse_big = 0, lse_small = 0;
    int32_t idx_big[2] = {index, -1}, idx_small[2] = {0, -1};
    int64_t qs[4] = {1, 1, 1, D}, kb[4] = {1, S2, 1, D}, ks[4] = {1, sbs, 1, D}, is[4] = {1, 1, 1, 2};
    int64_t ov[4] = {0, 1, 0, 1}, ls[3] = {1, 1, 1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F16, 4, qs, NULL);
    spattn_tensor tkb = spattn_tensor_make(buf, SPATTN_DTYPE_F16, 4, kb, ov);
    spattn_tensor tks = spattn_tensor_make(small, SPATTN_DTYPE_F16, 4, ks, ov);
    spattn_tensor tib = spattn_tensor_make(idx_big, SPATTN_DTYPE_I32, 4, is, NULL);
    spattn_tensor tis = spattn_tensor_make(idx_small, SPATTN_DTYPE_I32, 4, is, NULL);
    spattn_tensor tob = spattn_tensor_make(o_big, SPATTN_DTYPE_F16, 4, qs, NULL);
    spattn_tensor tos = spattn_tensor_make(o_small, SPATTN_DTYPE_F16, 4, qs, NULL);
    spattn_tensor tlb = spattn_tensor_make(&lse_big, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_tensor tls = spattn_tensor_make(&lse_small, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_status st = spattn_sfa_fwd(&tq, NULL, &tkb, NULL, NULL, &tib, sbs, 0, 0.0, &tob, &tlb);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa S2=%lld: status %d (%s)", (long long)S2, st,
             spattn_last_error());
    st = spattn_sfa_fwd(&tq, NULL, &tks, NULL, NULL, &tis, sbs, 0, 0.0, &tos, &tls);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa small: status %d (%s)", st, spattn_last_error());
    TU_CHECK(memcmp(o_big, o_small, sizeof o_big) == 0 && lse_big == lse_small,
             "sfa S2=%lld sbs=%lld index %d: O/LSE differ from the same keys at position 0 "
             "(lse %g vs %g): key numbers cut to 32 bits?",
             (long long)S2, (long long)sbs, index, lse_big, lse_small);
    munmap(buf, bytes);
}

/* ---- stride-0 views of huge logical size ------------------------------------------------- */
/* bsa forward, k/v [1, 1, Skv, D] broadcast along S (stride 0), Skv = 2^33 + 64, by = 2^33:
 * only the partial last block (keys 2^33 .. 2^33+63) is attended.  Every key is the same row,
 * so O = v and LSE = scale q.k + log(64). */
static void bsa_broadcast_huge(void) {
    enum { SQ = 16, D = 16 };
    const int64_t Skv = ((int64_t)1 << 33) + 64, by = (int64_t)1 << 33;
    float q[SQ * D], krow[D], vrow[D], o[SQ * D], lse[SQ];
    tu_rng r;
    tu_seed(&r, 33);
    for (int i = 0; i < SQ * D; i++) q[i] = (float)(tu_uniform(&r) - 0.5);
    for (int d = 0; d < D; d++) {
        krow[d] = (float)(tu_uniform(&r) - 0.5);
        vrow[d] = (float)(tu_uniform(&r) * 2 - 1);
    }
    uint8_t mask[2] = {0, 1};
    int64_t qs[4] = {1, 1, SQ, D}, ks[4] = {1, 1, Skv, D}, b0[4] = {0, 0, 0, 1};
    int64_t ms[4] = {1, 1, 1, 2}, ls[3] = {1, 1, SQ};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tk = spattn_tensor_make(krow, SPATTN_DTYPE_F32, 4, ks, b0);
    spattn_tensor tv = spattn_tensor_make(vrow, SPATTN_DTYPE_F32, 4, ks, b0);
    spattn_tensor tm = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, ms, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_status st = spattn_bsa_fwd(&tq, &tk, &tv, &tm, SQ, by, 0.25, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa broadcast Skv=2^33+64: status %d (%s)", st,
             spattn_last_error());
    double worst = 0;
    for (int i = 0; i < SQ; i++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)q[i * D + d] * krow[d];
        double want = 0.25 * s + log(64.0);
        worst = fmax(worst, fabs(lse[i] - want));
        for (int d = 0; d < D; d++) worst = fmax(worst, fabs(o[i * D + d] - vrow[d]));
    }
    TU_CHECK(worst < 1e-5, "bsa broadcast Skv=2^33+64: max error %g (LSE must count 64 keys)", worst);
}

/* sfa forward, k [1, S2, 1, D] broadcast along S2 = 2^33, sbs = 128, causal: the last blocks
 * (keys beyond 2^33 - 256) and a padded entry; O = k[:D] (shared v), LSE = s + log(n). */
static void sfa_broadcast_huge(void) {
    enum { S1 = 4, D = 16, K = 3 };
    const int64_t S2 = (int64_t)1 << 33, sbs = 128, nblk = S2 / sbs;
    float q[S1 * D], krow[D], o[S1 * D], lse[S1];
    tu_rng r;
    tu_seed(&r, 34);
    for (int i = 0; i < S1 * D; i++) q[i] = (float)(tu_uniform(&r) - 0.5);
    for (int d = 0; d < D; d++) krow[d] = (float)(tu_uniform(&r) - 0.5);
    int32_t idx[S1 * K];
    for (int i = 0; i < S1; i++) {
        idx[i * K] = (int32_t)(nblk - 1); /* keys S2-128 .. S2-1, causal-clipped to S2-S1+i */
        idx[i * K + 1] = -1;
        idx[i * K + 2] = (int32_t)(nblk - 2); /* 128 keys, all allowed */
    }
    int64_t qs[4] = {1, S1, 1, D}, ks[4] = {1, S2, 1, D}, b0[4] = {0, 0, 0, 1};
    int64_t is[4] = {1, S1, 1, K}, ls[3] = {1, S1, 1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tk = spattn_tensor_make(krow, SPATTN_DTYPE_F32, 4, ks, b0);
    spattn_tensor ti = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, is, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_status st = spattn_sfa_fwd(&tq, NULL, &tk, NULL, NULL, &ti, sbs, 3, 0.5, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa broadcast S2=2^33: status %d (%s)", st,
             spattn_last_error());
    double worst = 0;
    for (int i = 0; i < S1; i++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)q[i * D + d] * krow[d];
        double n = 128 + (128 - (S1 - 1 - i)); /* last block clipped at S2 - S1 + i */
        worst = fmax(worst, fabs(lse[i] - (0.5 * s + log(n))));
        for (int d = 0; d < D; d++) worst = fmax(worst, fabs(o[i * D + d] - krow[d]));
    }
    TU_CHECK(worst < 1e-5, "sfa broadcast S2=2^33: max error %g (LSE counts the causal keys)", worst);
    /* an index past ceil(S2/sbs) is still rejected at this size */
    idx[0] = (int32_t)nblk;
    st = spattn_sfa_fwd(&tq, NULL, &tk, NULL, NULL, &ti, sbs, 3, 0.5, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_BAD_INDEX, "sfa broadcast: index nblk gave status %d", st);
}

/* ---- block sizes far beyond S ------------------------------------------------------------ */
/* S = 64, mask [1,1,1,1]: bx = by = 2^40, 2^62, INT64_MAX must give the bits of bx = by = 64
 * (forward and backward) quickly; before, the CPU tiling grew with bx (minutes for 2^40) and
 * ceil(S/bx) overflowed for INT64_MAX. */
static void bsa_huge_blocks(void) {
    enum { S = 64, D = 16, NT = S * D };
    static float q[NT], k[NT], v[NT], dout[NT], o[2][NT], lse[2][S], dq[2][NT], dk[2][NT], dv[2][NT];
    tu_rng r;
    tu_seed(&r, 40);
    for (int i = 0; i < NT; i++) {
        q[i] = (float)(tu_uniform(&r) - 0.5);
        k[i] = (float)(tu_uniform(&r) - 0.5);
        v[i] = (float)(tu_uniform(&r) - 0.5);
        dout[i] = (float)(tu_uniform(&r) - 0.5);
    }
    uint8_t mask = 1;
    int64_t s4[4] = {1, 1, S, D}, ms[4] = {1, 1, 1, 1}, ls[3] = {1, 1, S};
    const int64_t sizes[4] = {S, (int64_t)1 << 40, (int64_t)1 << 62, INT64_MAX};
    for (int c = 0; c < 4; c++) {
        int slot = c == 0 ? 0 : 1;
        spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tv = spattn_tensor_make(v, SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tdo = spattn_tensor_make(dout, SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tm = spattn_tensor_make(&mask, SPATTN_DTYPE_U8, 4, ms, NULL);
        spattn_tensor to = spattn_tensor_make(o[slot], SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tl = spattn_tensor_make(lse[slot], SPATTN_DTYPE_F32, 3, ls, NULL);
        spattn_tensor tdq = spattn_tensor_make(dq[slot], SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tdk = spattn_tensor_make(dk[slot], SPATTN_DTYPE_F32, 4, s4, NULL);
        spattn_tensor tdv = spattn_tensor_make(dv[slot], SPATTN_DTYPE_F32, 4, s4, NULL);
        int64_t bx = sizes[c], by = sizes[c];
        spattn_status st = spattn_bsa_fwd(&tq, &tk, &tv, &tm, bx, by, 0.0, &to, &tl);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa fwd bx=by=%lld: status %d (%s)", (long long)bx,
                 st, spattn_last_error());
        st = spattn_bsa_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &tm, bx, by, 0.0, &tdq, &tdk, &tdv);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa bwd bx=by=%lld: status %d (%s)", (long long)bx,
                 st, spattn_last_error());
        size_t wsb = 0;
        st = spattn_bsa_workspace_size(&tq, &tk, &tv, &tm, bx, by, 1, NULL, &wsb);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS && wsb < ((size_t)1 << 30),
                 "bsa workspace bx=by=%lld: status %d, %zu bytes", (long long)bx, st, wsb);
        if (slot == 1)
            TU_CHECK(!memcmp(o[0], o[1], sizeof o[0]) && !memcmp(lse[0], lse[1], sizeof lse[0]) &&
                         !memcmp(dq[0], dq[1], sizeof dq[0]) && !memcmp(dk[0], dk[1], sizeof dk[0]) &&
                         !memcmp(dv[0], dv[1], sizeof dv[0]),
                     "bsa bx=by=%lld: results differ from bx=by=S", (long long)bx);
        /* a wrong mask shape names the right expectation (ceil(S/bx) = 1), no overflow */
        int64_t bad[4] = {1, 1, 2, 1};
        spattn_tensor tbad = spattn_tensor_make(&mask, SPATTN_DTYPE_U8, 4, bad, NULL);
        st = spattn_bsa_fwd(&tq, &tk, &tv, &tbad, bx, by, 0.0, &to, &tl);
        TU_CHECK(st == SPATTN_STATUS_BAD_SHAPE && strstr(spattn_last_error(), "ceil(Sq/bx)") &&
                     strstr(spattn_last_error(), "1"),
                 "bsa bx=%lld with a [1,1,2,1] mask: status %d, \"%s\"", (long long)bx, st,
                 spattn_last_error());
    }
}

/* ---- scales beyond fp32 ------------------------------------------------------------------ */
static void scales(void) {
    enum { S = 16, D = 8 };
    float q[S * D] = {0}, o[S * D], lse[S];
    uint8_t mask = 1;
    int32_t idx[S];
    for (int i = 0; i < S; i++) idx[i] = 0;
    int64_t s4[4] = {1, 1, S, D}, ms[4] = {1, 1, 1, 1}, ls[3] = {1, 1, S};
    int64_t fs[4] = {1, S, 1, D}, is[4] = {1, S, 1, 1}, fl[3] = {1, S, 1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tm = spattn_tensor_make(&mask, SPATTN_DTYPE_U8, 4, ms, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_tensor sq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, fs, NULL);
    spattn_tensor si = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, is, NULL);
    spattn_tensor so = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, fs, NULL);
    spattn_tensor sl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, fl, NULL);
    const double bad[4] = {1e39, -1e39, (double)FLT_MAX * 1.0000001, NAN};
    for (int c = 0; c < 4; c++) {
        memset(o, 0x5A, sizeof o);
        memset(lse, 0x5A, sizeof lse);
        spattn_status st = spattn_bsa_fwd(&tq, &tq, &tq, &tm, S, S, bad[c], &to, &tl);
        TU_CHECK(st == SPATTN_STATUS_INVALID_VALUE && strstr(spattn_last_error(), "scale") &&
                     strstr(spattn_last_error(), "fp32"),
                 "bsa scale %g: status %d, \"%s\"", bad[c], st, spattn_last_error());
        st = spattn_sfa_fwd(&sq, NULL, &sq, NULL, NULL, &si, 1, 0, bad[c], &so, &sl);
        TU_CHECK(st == SPATTN_STATUS_INVALID_VALUE && strstr(spattn_last_error(), "scale") &&
                     strstr(spattn_last_error(), "fp32"),
                 "sfa scale %g: status %d, \"%s\"", bad[c], st, spattn_last_error());
        int untouched = 1;
        for (size_t b = 0; b < sizeof o; b++) untouched &= ((uint8_t *)o)[b] == 0x5A;
        for (size_t b = 0; b < sizeof lse; b++) untouched &= ((uint8_t *)lse)[b] == 0x5A;
        TU_CHECK(untouched, "scale %g: outputs were written", bad[c]);
    }
    /* the largest fp32 scale is valid */
    spattn_status st = spattn_bsa_fwd(&tq, &tq, &tq, &tm, S, S, (double)FLT_MAX, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa scale FLT_MAX: status %d (%s)", st, spattn_last_error());
}

/* ---- batch offsets beyond 2^32 elements, forward and backward ---------------------------- */
/* Every float tensor (inputs and outputs) gets batch stride 2^32 elements in its own sparse
 * mapping: batch 1 lives 16 GiB after batch 0 (a 32-bit offset would alias it onto batch 0).
 * The results must be bitwise those of contiguous copies. */
#define FAR ((int64_t)1 << 32)
typedef struct far_t {
    void *map;
    size_t bytes;
    spattn_tensor t;  /* the far view */
    float *dense;     /* contiguous copy (fp32) */
    spattn_tensor td; /* view of dense */
} far_t;

static int far_make(far_t *f, const int64_t *shape, int nd, tu_rng *r) {
    int64_t inner = 1, st[4];
    for (int d = 1; d < nd; d++) inner *= shape[d];
    st[nd - 1] = 1;
    for (int d = nd - 2; d >= 1; d--) st[d] = st[d + 1] * shape[d + 1];
    st[0] = FAR;
    f->bytes = (size_t)(FAR * (shape[0] - 1) + inner) * 4;
    f->map = mmap(NULL, f->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                  -1, 0);
    if (f->map == MAP_FAILED) return 0;
    f->t = spattn_tensor_make(f->map, SPATTN_DTYPE_F32, nd, shape, st);
    f->dense = malloc((size_t)(shape[0] * inner) * 4);
    f->td = spattn_tensor_make(f->dense, SPATTN_DTYPE_F32, nd, shape, NULL);
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t e = 0; e < inner; e++) {
            float x = r ? (float)(tu_uniform(r) - 0.5) : 0.0f;
            f->dense[b * inner + e] = x;
            ((float *)f->map)[b * FAR + e] = x;
        }
    return 1;
}
/* 1 when the far view holds bitwise the values of the dense copy */
static int far_same(const far_t *f) {
    int64_t inner = 1;
    for (int d = 1; d < f->t.ndim; d++) inner *= f->t.shape[d];
    for (int64_t b = 0; b < f->t.shape[0]; b++)
        if (memcmp((float *)f->map + b * FAR, f->dense + b * inner, (size_t)inner * 4)) return 0;
    return 1;
}
static void far_free(far_t *f) {
    munmap(f->map, f->bytes);
    free(f->dense);
}

static void bsa_far_batches(void) {
    enum { N = 2, NKV = 1, S = 40, D = 16, BX = 16, BY = 8 };
    const int64_t nbx = (S + BX - 1) / BX, nby = (S + BY - 1) / BY;
    int64_t sq[4] = {2, N, S, D}, skv[4] = {2, NKV, S, D}, sl[3] = {2, N, S}, sm[4] = {2, N, nbx, nby};
    tu_rng r;
    tu_seed(&r, 77);
    far_t q, k, v, dout, o, lse, dq, dk, dv;
    int ok = far_make(&q, sq, 4, &r) && far_make(&k, skv, 4, &r) && far_make(&v, skv, 4, &r) &&
             far_make(&dout, sq, 4, &r) && far_make(&o, sq, 4, NULL) && far_make(&lse, sl, 3, NULL) &&
             far_make(&dq, sq, 4, NULL) && far_make(&dk, skv, 4, NULL) && far_make(&dv, skv, 4, NULL);
    if (!ok) {
        printf("bsa far batches: cannot reserve the address space, skipped\n");
        return;
    }
    uint8_t mask[2 * N * 3 * 5];
    for (size_t e = 0; e < sizeof mask; e++) mask[e] = tu_uniform(&r) < 0.6;
    spattn_tensor tm = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, sm, NULL);
    for (int far = 0; far < 2; far++) {
#define T(x) (far ? &x.t : &x.td)
        spattn_status st = spattn_bsa_fwd(T(q), T(k), T(v), &tm, BX, BY, 0.0, T(o), T(lse));
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa far=%d fwd: %s", far, spattn_last_error());
        st = spattn_bsa_bwd(T(q), T(k), T(v), T(o), T(dout), T(lse), &tm, BX, BY, 0.0, T(dq), T(dk),
                            T(dv));
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa far=%d bwd: %s", far, spattn_last_error());
#undef T
    }
    TU_CHECK(far_same(&o) && far_same(&lse) && far_same(&dq) && far_same(&dk) && far_same(&dv),
             "bsa with batch stride 2^32: results differ from contiguous copies");
    far_t *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv};
    for (int i = 0; i < 9; i++) far_free(all[i]);
}

static void sfa_far_batches(void) {
    enum { S1 = 6, S2 = 24, N1 = 4, N2 = 1, D = 16, K = 5 };
    int64_t sq[4] = {2, S1, N1, D}, sk[4] = {2, S2, N2, D}, sl[3] = {2, S1, N1}, si[4] = {2, S1, N2, K};
    tu_rng r;
    tu_seed(&r, 78);
    far_t q, k, dout, o, lse, dq, dk;
    int ok = far_make(&q, sq, 4, &r) && far_make(&k, sk, 4, &r) && far_make(&dout, sq, 4, &r) &&
             far_make(&o, sq, 4, NULL) && far_make(&lse, sl, 3, NULL) && far_make(&dq, sq, 4, NULL) &&
             far_make(&dk, sk, 4, NULL);
    if (!ok) {
        printf("sfa far batches: cannot reserve the address space, skipped\n");
        return;
    }
    int32_t idx[2 * S1 * N2 * K];
    for (int e = 0; e < 2 * S1 * N2 * K; e++) idx[e] = tu_uniform(&r) < 0.2 ? -1 : (int32_t)tu_range(&r, 0, S2 - 1);
    spattn_tensor ti = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, si, NULL);
    for (int far = 0; far < 2; far++) {
#define T(x) (far ? &x.t : &x.td)
        spattn_status st = spattn_sfa_fwd(T(q), NULL, T(k), NULL, NULL, &ti, 1, 3, 0.0, T(o), T(lse));
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa far=%d fwd: %s", far, spattn_last_error());
        st = spattn_sfa_bwd(T(q), NULL, T(k), NULL, NULL, T(o), T(dout), T(lse), &ti, 1, 3, 0.0, T(dq),
                            NULL, T(dk), NULL, NULL);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa far=%d bwd: %s", far, spattn_last_error());
#undef T
    }
    TU_CHECK(far_same(&o) && far_same(&lse) && far_same(&dq) && far_same(&dk),
             "sfa with batch stride 2^32: results differ from contiguous copies");
    far_t *all[] = {&q, &k, &dout, &o, &lse, &dq, &dk};
    for (int i = 0; i < 7; i++) far_free(all[i]);
}

int main(void) {
    alarm(600); /* a regression to the old tiling would hang for minutes: fail instead */
    scales();
    bsa_huge_blocks();
    bsa_broadcast_huge();
    sfa_broadcast_huge();
    sfa_big_s2(((int64_t)1 << 31) + 4, 2, 1 << 30);  /* key 2^31: was negative (SIGSEGV) */
    sfa_big_s2(((int64_t)1 << 32) + 4, 4, 1 << 30);  /* key 2^32: was key 0 (wrong output) */
    bsa_far_batches();
    sfa_far_batches();
    return tu_summary("test_limits");
}

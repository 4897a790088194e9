/*
 * spattn_merge_attention_states on the CPU against the fp64 formula: every dtype combination of
 * o1 / o2 / o, BNSD and BSND-like strided views (a transpose), 2-D and 5-D shapes, rows empty in
 * one or both inputs (with garbage O there), NaN LSE, in-place merging into o1 and o2, lse NULL,
 * thread-count independence, and the argument checks (nothing written on error).
 */
#include "../src/core/dtype.h"
#include "testutil.h"

static const spattn_dtype kDt[] = {SPATTN_DTYPE_F32, SPATTN_DTYPE_F16, SPATTN_DTYPE_BF16};

typedef struct buf {
    void *p;
    spattn_tensor t;
} buf;

/* A tensor of `shape` stored with its last two row dims transposed in memory when `tr`
 * (ndim >= 3 for o-like, >= 2 for lse-like tensors), plus a 3-element pad before data. */
static buf make(spattn_dtype dt, int nd, const int64_t *shape, int tr) {
    buf b;
    size_t es = spattn_dtype_size(dt);
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    b.p = calloc((size_t)(n + 8), es);
    int64_t st[SPATTN_MAX_DIMS], perm[SPATTN_MAX_DIMS];
    for (int i = 0; i < nd; i++) perm[i] = i;
    int rd = nd; /* swap two leading dims when asked (a BSND <-> BNSD style view) */
    if (tr && rd >= 2) { perm[0] = 1; perm[1] = 0; }
    /* memory order: dims in perm order, row-major */
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st[perm[i]] = s;
        s *= shape[perm[i]];
    }
    b.t = spattn_tensor_make((char *)b.p + 3 * es, dt, nd, shape, st);
    return b;
}

static int64_t off(const spattn_tensor *t, int64_t lin) {
    int64_t o = 0;
    for (int i = t->ndim - 1; i >= 0; i--) {
        o += (lin % t->shape[i]) * t->strides[i];
        lin /= t->shape[i];
    }
    return o;
}

static double ld(const spattn_tensor *t, int64_t lin) { return spattn_load_f32(t->data, t->dtype, off(t, lin)); }
static void st(const spattn_tensor *t, int64_t lin, double x) { spattn_store_f32(t->data, t->dtype, off(t, lin), (float)x); }
static float tol(spattn_dtype dt) { return dt == SPATTN_DTYPE_F32 ? 2e-6f : dt == SPATTN_DTYPE_F16 ? 0x1p-10f : 0x1p-7f; }

/* One merge: random data (row kinds: both present, only 1, only 2, none; NaN when nan_row). */
static void run(int nd, const int64_t *shape, spattn_dtype d1, spattn_dtype d2, spattn_dtype d0, int tr,
                int inplace, int with_lse, tu_rng *r, int threads) {
    int64_t rows = 1, D = shape[nd - 1];
    for (int i = 0; i < nd - 1; i++) rows *= shape[i];
    buf o1 = make(d1, nd, shape, tr), o2 = make(d2, nd, shape, !tr), l1 = make(SPATTN_DTYPE_F32, nd - 1, shape, tr),
        l2 = make(SPATTN_DTYPE_F32, nd - 1, shape, 0);
    buf o = make(d0, nd, shape, tr), l = make(SPATTN_DTYPE_F32, nd - 1, shape, !tr);
    for (int64_t i = 0; i < rows * D; i++) {
        st(&o1.t, i, tu_normal(r));
        st(&o2.t, i, tu_normal(r));
    }
    int *kind = malloc(sizeof(int) * (size_t)rows);
    for (int64_t i = 0; i < rows; i++) {
        int k = (int)tu_range(r, 0, 9); /* 0..5 both, 6 only 1, 7 only 2, 8 none, 9 far apart */
        kind[i] = k;
        double a = 8 * tu_normal(r), b = 8 * tu_normal(r);
        if (k == 9) b = a + 60;
        st(&l1.t, i, (k == 7 || k == 8) ? -INFINITY : a);
        st(&l2.t, i, (k == 6 || k == 8) ? -INFINITY : b);
        if (k == 7 || k == 8) for (int64_t d = 0; d < D; d++) st(&o1.t, i * D + d, NAN); /* not read */
        if (k == 6 || k == 8) for (int64_t d = 0; d < D; d++) st(&o2.t, i * D + d, INFINITY);
    }
    /* fp64 golden from the (rounded) inputs */
    double *go = malloc(sizeof(double) * (size_t)(rows * D)), *gl = malloc(sizeof(double) * (size_t)rows);
    for (int64_t i = 0; i < rows; i++) {
        double a = ld(&l1.t, i), b = ld(&l2.t, i);
        if (a == -INFINITY && b == -INFINITY) {
            gl[i] = -INFINITY;
            for (int64_t d = 0; d < D; d++) go[i * D + d] = 0;
            continue;
        }
        double m = a > b ? a : b, w1 = a == -INFINITY ? 0 : exp(a - m), w2 = b == -INFINITY ? 0 : exp(b - m);
        gl[i] = m + log(w1 + w2);
        for (int64_t d = 0; d < D; d++)
            go[i * D + d] = (w1 ? w1 * ld(&o1.t, i * D + d) : 0) / (w1 + w2) + (w2 ? w2 * ld(&o2.t, i * D + d) : 0) / (w1 + w2);
    }
    const spattn_tensor *out = &o.t, *lout = with_lse ? &l.t : NULL;
    if (inplace == 1 && d0 == d1) { out = &o1.t; lout = with_lse ? &l1.t : NULL; }
    if (inplace == 2 && d0 == d2) { out = &o2.t; lout = with_lse ? &l2.t : NULL; }
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = threads;
    spattn_status s = spattn_merge_attention_states_ex(&o1.t, &l1.t, &o2.t, &l2.t, out, lout, &opt);
    TU_CHECK(s == SPATTN_STATUS_SUCCESS, "merge nd=%d dt %d %d %d tr=%d inplace=%d: status %d (%s)", nd, d1, d2,
             d0, tr, inplace, s, spattn_last_error());
    int bad = 0;
    double maxerr = 0;
    for (int64_t i = 0; i < rows && !bad; i++) {
        if (lout) {
            double x = ld(lout, i);
            if (gl[i] == -INFINITY) bad |= x != -INFINITY;
            else bad |= !(fabs(x - gl[i]) <= 1e-5 * (1 + fabs(gl[i])));
        }
        for (int64_t d = 0; d < D; d++) {
            double x = ld(out, i * D + d), g = go[i * D + d];
            double e = fabs(x - g);
            if (!(e <= tol(out->dtype) * (1 + fabs(g)))) bad = 1;
            if (e > maxerr) maxerr = e;
        }
        if (bad) fprintf(stderr, "row %lld kind %d: lse %g vs %g\n", (long long)i, kind[i], lout ? ld(lout, i) : 0.0, gl[i]);
    }
    TU_CHECK(!bad, "merge nd=%d dt %s %s -> %s tr=%d inplace=%d lse=%d: max err %g", nd,
             spattn_dtype_name(d1), spattn_dtype_name(d2), spattn_dtype_name(out->dtype), tr, inplace, with_lse, maxerr);
    free(kind); free(go); free(gl);
    free(o1.p); free(o2.p); free(l1.p); free(l2.p); free(o.p); free(l.p);
}

static void nan_row(void) {
    int64_t sh[2] = {2, 8};
    float o1[16], o2[16], l1[2] = {0.0f, NAN}, l2[2] = {1.0f, 0.0f}, o[16], l[2];
    for (int i = 0; i < 16; i++) o1[i] = o2[i] = 1.0f;
    spattn_tensor a = spattn_tensor_make(o1, SPATTN_DTYPE_F32, 2, sh, NULL), b = spattn_tensor_make(o2, SPATTN_DTYPE_F32, 2, sh, NULL);
    spattn_tensor la = spattn_tensor_make(l1, SPATTN_DTYPE_F32, 1, sh, NULL), lb = spattn_tensor_make(l2, SPATTN_DTYPE_F32, 1, sh, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 2, sh, NULL), tl = spattn_tensor_make(l, SPATTN_DTYPE_F32, 1, sh, NULL);
    TU_CHECK(spattn_merge_attention_states(&a, &la, &b, &lb, &to, &tl) == SPATTN_STATUS_SUCCESS, "nan row: status");
    TU_CHECK(fabsf(o[0] - 1.0f) < 1e-6f && fabsf(l[0] - (1.0f + log1pf(expf(-1.0f)))) < 1e-6f, "nan row: row 0 exact");
    TU_CHECK(isnan(o[8]) && isnan(o[15]) && isnan(l[1]), "nan row: NaN propagates");
}

static void validation(void) {
    int64_t sh[3] = {2, 3, 8}, sl[2] = {2, 3}, bad_sl[2] = {2, 4};
    float o1[48], o2[48], o[64], l1[6], l2[6], l[6];
    uint16_t h[48];
    int32_t i32[6];
    for (int i = 0; i < 64; i++) o[i] = 7.0f;
    for (int i = 0; i < 6; i++) { l[i] = 7.0f; l1[i] = 0; l2[i] = 0; }
    for (int i = 0; i < 48; i++) o1[i] = o2[i] = 1;
    spattn_tensor A = spattn_tensor_make(o1, SPATTN_DTYPE_F32, 3, sh, NULL), B = spattn_tensor_make(o2, SPATTN_DTYPE_F32, 3, sh, NULL);
    spattn_tensor LA = spattn_tensor_make(l1, SPATTN_DTYPE_F32, 2, sl, NULL), LB = spattn_tensor_make(l2, SPATTN_DTYPE_F32, 2, sl, NULL);
    spattn_tensor O = spattn_tensor_make(o, SPATTN_DTYPE_F32, 3, sh, NULL), L = spattn_tensor_make(l, SPATTN_DTYPE_F32, 2, sl, NULL);
    typedef struct vcase { const char *what; spattn_status want; spattn_tensor o1, l1, o2, l2, o, l; int null_o; } vcase;
    vcase c[16];
    int n = 0;
#define CASE(w, st_) (c[n] = (vcase){w, st_, A, LA, B, LB, O, L, 0}, &c[n++])
    CASE("o NULL", SPATTN_STATUS_NULL_POINTER)->null_o = 1;
    CASE("o1 data NULL", SPATTN_STATUS_NULL_POINTER)->o1.data = NULL;
    CASE("o2 shape", SPATTN_STATUS_BAD_SHAPE)->o2.shape[2] = 16;
    CASE("lse1 shape", SPATTN_STATUS_BAD_SHAPE)->l1 = spattn_tensor_make(l1, SPATTN_DTYPE_F32, 2, bad_sl, NULL);
    CASE("lse2 ndim", SPATTN_STATUS_BAD_NDIM)->l2.ndim = 3;
    CASE("lse dtype", SPATTN_STATUS_BAD_DTYPE)->l2 = spattn_tensor_make(i32, SPATTN_DTYPE_I32, 2, sl, NULL);
    CASE("o dtype int", SPATTN_STATUS_BAD_DTYPE)->o.dtype = SPATTN_DTYPE_I32;
    CASE("o1 1-D", SPATTN_STATUS_BAD_NDIM)->o1.ndim = 1;
    CASE("o overlaps o1 shifted", SPATTN_STATUS_ALIASING)->o.data = o1 + 1;
    CASE("o self overlap", SPATTN_STATUS_BAD_STRIDE)->o.strides[0] = 1;
    CASE("lse aliases o", SPATTN_STATUS_ALIASING)->l.data = o;
    CASE("o2 half aliasing o1 (ok as input)", SPATTN_STATUS_SUCCESS)->o2 = spattn_tensor_make(h, SPATTN_DTYPE_F16, 3, sh, NULL);
    CASE("o on cuda", SPATTN_STATUS_BAD_DEVICE)->o.device_type = SPATTN_DEVICE_CUDA;
#undef CASE
    memset(h, 0, sizeof h);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 64; j++) o[j] = 7.0f;
        for (int j = 0; j < 6; j++) l[j] = 7.0f;
        spattn_status s = spattn_merge_attention_states(&c[i].o1, &c[i].l1, &c[i].o2, &c[i].l2,
                                                        c[i].null_o ? NULL : &c[i].o, &c[i].l);
        TU_CHECK(s == c[i].want, "validation '%s': status %d, want %d (%s)", c[i].what, s, c[i].want, spattn_last_error());
        if (c[i].want != SPATTN_STATUS_SUCCESS) {
            int untouched = 1;
            for (int j = 0; j < 64; j++) untouched &= o[j] == 7.0f;
            for (int j = 0; j < 6; j++) untouched &= l[j] == 7.0f;
            TU_CHECK(untouched, "validation '%s': output written on error", c[i].what);
            TU_CHECK(strlen(spattn_last_error()) > 0, "validation '%s': no message", c[i].what);
        }
    }
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(15));
    int64_t s4[4] = {2, 3, 17, 40}, s2[2] = {33, 8}, s5[5] = {2, 2, 3, 5, 24};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++) run(4, s4, kDt[a], kDt[b], kDt[c], (a + b + c) & 1, 0, 1, &r, 0);
    for (int a = 0; a < 3; a++) {
        run(4, s4, kDt[a], kDt[(a + 1) % 3], kDt[a], 1, 1, 1, &r, 2);  /* in place into o1 */
        run(4, s4, kDt[(a + 2) % 3], kDt[a], kDt[a], 0, 2, 1, &r, 1);  /* in place into o2 */
        run(2, s2, kDt[a], kDt[a], kDt[a], 0, 0, 0, &r, 3);            /* 2-D, no lse */
        run(5, s5, kDt[a], SPATTN_DTYPE_F32, SPATTN_DTYPE_F32, 1, 0, 1, &r, 0);
    }
    int64_t big[4] = {1, 8, 512, 64}; /* above the OpenMP threshold */
    run(4, big, SPATTN_DTYPE_BF16, SPATTN_DTYPE_BF16, SPATTN_DTYPE_F32, 1, 0, 1, &r, 0);
    nan_row();
    validation();
    return tu_summary("test_merge");
}

/*
 * Every validation error of spattn_sfa_fwd / spattn_sfa_bwd: the status code, a message that
 * names the offending tensor or argument, and outputs left untouched.  Also the layouts that
 * must be accepted (concatenated dq / dq_rope views of one buffer).
 */
#include "sfa_testutil.h"

typedef struct call {
    const spattn_tensor *q, *qr, *k, *kr, *v, *idx, *o, *lse, *dout, *dq, *dqr, *dk, *dkr, *dv;
    int64_t sbs;
    int32_t mode;
    double scale;
    spattn_options opt;
} call;

static st_problem P;

static spattn_status do_fwd(const call *c) {
    return spattn_sfa_fwd_ex(c->q, c->qr, c->k, c->kr, c->v, c->idx, c->sbs, c->mode, c->scale,
                             c->o, c->lse, &c->opt);
}
static spattn_status do_bwd(const call *c) {
    return spattn_sfa_bwd_ex(c->q, c->qr, c->k, c->kr, c->v, c->o, c->dout, c->lse, c->idx,
                             c->sbs, c->mode, c->scale, c->dq, c->dqr, c->dk, c->dkr, c->dv,
                             &c->opt);
}

/* Output buffers of the problem, snapshotted around each failing call. */
static st_buf *outs_fwd[] = {&P.bo, &P.blse};
static st_buf *outs_bwd[] = {&P.bdq, &P.bdqr, &P.bdk, &P.bdkr, &P.bdv};

static void expect(const call *c, int bwd, spattn_status want, const char *name, const char *what) {
    st_buf **outs = bwd ? outs_bwd : outs_fwd;
    int nout = bwd ? 5 : 2;
    void *snap[5];
    for (int i = 0; i < nout; i++) {
        snap[i] = malloc(outs[i]->bytes);
        memcpy(snap[i], outs[i]->mem, outs[i]->bytes);
    }
    spattn_status got = bwd ? do_bwd(c) : do_fwd(c);
    const char *msg = spattn_last_error();
    TU_CHECK(got == want, "%s %s: status %d, want %d (%s)", bwd ? "bwd" : "fwd", what, got, want, msg);
    TU_CHECK(msg && strlen(msg) > 0 && strstr(msg, name), "%s %s: message \"%s\" must name %s",
             bwd ? "bwd" : "fwd", what, msg, name);
    int same = 1;
    for (int i = 0; i < nout; i++) {
        same &= memcmp(snap[i], outs[i]->mem, outs[i]->bytes) == 0;
        free(snap[i]);
    }
    TU_CHECK(same, "%s %s: outputs were written", bwd ? "bwd" : "fwd", what);
}

/* Runs `mutate` on a copy `c` of the valid call (with a spare tensor `t` to point at). */
#define CASE(base, bwd, status, name, what, mutate)                                       \
    do {                                                                                  \
        call c = (base);                                                                  \
        spattn_tensor t;                                                                  \
        (void)t;                                                                          \
        mutate;                                                                           \
        expect(&c, bwd, status, name, what);                                              \
    } while (0)

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(11));
    /* B S1 S2 N1 N2 D Dr K sbs mode shared dtype concat layout dup pad empty */
    st_shape s = {1, 8, 12, 4, 2, 16, 8, 5, 4, 3, 0, SPATTN_DTYPE_F32, 0, 0, 0.1, 0.1, 0.0};
    st_make(&P, &s, &r);
    call base;
    memset(&base, 0, sizeof base);
    base.q = &P.q;
    base.qr = &P.qr;
    base.k = &P.k;
    base.kr = &P.kr;
    base.v = &P.v;
    base.idx = &P.idx;
    base.o = &P.o;
    base.lse = &P.lse;
    base.dout = &P.dout;
    base.dq = &P.dq;
    base.dqr = &P.dqr;
    base.dk = &P.dk;
    base.dkr = &P.dkr;
    base.dv = &P.dv;
    base.sbs = s.sbs;
    base.mode = s.mode;
    spattn_options_init(&base.opt);
    TU_CHECK(do_fwd(&base) == SPATTN_STATUS_SUCCESS, "valid forward: %s", spattn_last_error());
    TU_CHECK(do_bwd(&base) == SPATTN_STATUS_SUCCESS, "valid backward: %s", spattn_last_error());
    int32_t *idx = (int32_t *)P.idx.data;

    for (int bwd = 0; bwd < 2; bwd++) {
        /* missing tensors */
        CASE(base, bwd, SPATTN_STATUS_NULL_POINTER, "q", "q NULL", c.q = NULL);
        CASE(base, bwd, SPATTN_STATUS_NULL_POINTER, "k", "k NULL", c.k = NULL);
        CASE(base, bwd, SPATTN_STATUS_NULL_POINTER, "indices", "indices NULL", c.idx = NULL);
        CASE(base, bwd, SPATTN_STATUS_NULL_POINTER, "k_rope", "q_rope without k_rope", c.kr = NULL);
        CASE(base, bwd, SPATTN_STATUS_NULL_POINTER, "q_rope", "k_rope without q_rope", c.qr = NULL);
        CASE(base, bwd, SPATTN_STATUS_NULL_POINTER, "q", "q data NULL",
             (t = P.q, t.data = NULL, c.q = &t));
        /* scalars */
        CASE(base, bwd, SPATTN_STATUS_INVALID_VALUE, "sbs", "sbs 3", c.sbs = 3);
        CASE(base, bwd, SPATTN_STATUS_INVALID_VALUE, "sbs", "sbs 0", c.sbs = 0);
        CASE(base, bwd, SPATTN_STATUS_INVALID_VALUE, "sbs", "sbs 256", c.sbs = 256);
        CASE(base, bwd, SPATTN_STATUS_INVALID_VALUE, "mode", "mode 1", c.mode = 1);
        CASE(base, bwd, SPATTN_STATUS_INVALID_VALUE, "scale", "scale NaN", c.scale = NAN);
        CASE(base, bwd, SPATTN_STATUS_INVALID_VALUE, "scale", "scale inf", c.scale = INFINITY);
        /* ndim and shapes */
        CASE(base, bwd, SPATTN_STATUS_BAD_NDIM, "q", "q 3-d", (t = P.q, t.ndim = 3, c.q = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_NDIM, "indices", "indices 3-d",
             (t = P.idx, t.ndim = 3, c.idx = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "k", "k D mismatch",
             (t = P.k, t.shape[3] = 8, c.k = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "k", "N1 % N2 != 0",
             (t = P.k, t.shape[2] = 3, c.k = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "v", "v S2 mismatch",
             (t = P.v, t.shape[1] = 11, c.v = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "q_rope", "q_rope S1 mismatch",
             (t = P.qr, t.shape[1] = 7, c.qr = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "k_rope", "k_rope Dr mismatch",
             (t = P.kr, t.shape[3] = 16, c.kr = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "indices", "indices S1 mismatch",
             (t = P.idx, t.shape[1] = 7, c.idx = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "indices", "indices N2 mismatch",
             (t = P.idx, t.shape[2] = 1, c.idx = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "o", "o D mismatch",
             (t = P.o, t.shape[3] = 8, c.o = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_SHAPE, "lse", "lse N1 mismatch",
             (t = P.lse, t.shape[2] = 2, c.lse = &t));
        {
            spattn_tensor k12 = P.k;
            k12.shape[3] = 12;
            CASE(base, bwd, SPATTN_STATUS_NOT_SUPPORTED, "q", "D not a multiple of 8",
                 (t = P.q, t.shape[3] = 12, c.q = &t, c.k = &k12));
        }
        /* dtypes */
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "q", "q int32",
             (t = P.q, t.dtype = SPATTN_DTYPE_I32, c.q = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "k", "k fp16 vs q fp32",
             (t = P.k, t.dtype = SPATTN_DTYPE_F16, c.k = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "v", "v bf16 vs q fp32",
             (t = P.v, t.dtype = SPATTN_DTYPE_BF16, c.v = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "k_rope", "k_rope fp16",
             (t = P.kr, t.dtype = SPATTN_DTYPE_F16, c.kr = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "indices", "indices fp32 (not int32)",
             (t = P.idx, t.dtype = SPATTN_DTYPE_F32, c.idx = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "o", "o fp16",
             (t = P.o, t.dtype = SPATTN_DTYPE_F16, c.o = &t));
        CASE(base, bwd, SPATTN_STATUS_BAD_DTYPE, "lse", "lse fp16",
             (t = P.lse, t.dtype = SPATTN_DTYPE_F16, c.lse = &t));
        /* index values: -2 and ceil(S2/sbs) are bad; the scan runs before any write */
        int32_t keep = idx[7];
        idx[7] = -2;
        CASE(base, bwd, SPATTN_STATUS_BAD_INDEX, "indices", "index -2", (void)0);
        idx[7] = (int32_t)((s.S2 + s.sbs - 1) / s.sbs);
        CASE(base, bwd, SPATTN_STATUS_BAD_INDEX, "indices", "index ceil(S2/sbs)", (void)0);
        idx[7] = keep;
        /* workspace */
        char small[16];
        CASE(base, bwd, SPATTN_STATUS_WORKSPACE_TOO_SMALL, "workspace", "workspace too small",
             (c.opt.workspace = small, c.opt.workspace_size = sizeof small));
    }
    /* forward only */
    CASE(base, 0, SPATTN_STATUS_NULL_POINTER, "o", "o NULL", c.o = NULL);
    CASE(base, 0, SPATTN_STATUS_ALIASING, "o", "o overlaps q", c.o = &P.q);
    CASE(base, 0, SPATTN_STATUS_ALIASING, "lse", "lse overlaps o",
         (t = P.lse, t.data = P.o.data, c.lse = &t));
    /* backward only */
    CASE(base, 1, SPATTN_STATUS_NULL_POINTER, "dq", "dq NULL", c.dq = NULL);
    CASE(base, 1, SPATTN_STATUS_NULL_POINTER, "dout", "dout NULL", c.dout = NULL);
    CASE(base, 1, SPATTN_STATUS_NULL_POINTER, "lse", "lse NULL", c.lse = NULL);
    CASE(base, 1, SPATTN_STATUS_NULL_POINTER, "dq_rope", "dq_rope NULL with rope", c.dqr = NULL);
    CASE(base, 1, SPATTN_STATUS_NULL_POINTER, "dv", "dv NULL with v", c.dv = NULL);
    CASE(base, 1, SPATTN_STATUS_INVALID_VALUE, "dv", "dv given with v NULL", c.v = NULL);
    CASE(base, 1, SPATTN_STATUS_INVALID_VALUE, "dq_rope", "dq_rope without rope",
         (c.qr = NULL, c.kr = NULL, c.dkr = NULL));
    CASE(base, 1, SPATTN_STATUS_INVALID_VALUE, "dk_rope", "dk_rope without rope",
         (c.qr = NULL, c.kr = NULL, c.dqr = NULL));
    CASE(base, 1, SPATTN_STATUS_BAD_SHAPE, "dout", "dout S1 mismatch",
         (t = P.dout, t.shape[1] = 7, c.dout = &t));
    CASE(base, 1, SPATTN_STATUS_BAD_SHAPE, "dk", "dk S2 mismatch",
         (t = P.dk, t.shape[1] = 11, c.dk = &t));
    CASE(base, 1, SPATTN_STATUS_BAD_DTYPE, "dq", "dq bf16",
         (t = P.dq, t.dtype = SPATTN_DTYPE_BF16, c.dq = &t));
    CASE(base, 1, SPATTN_STATUS_ALIASING, "dk", "dk overlaps k", c.dk = &P.k);
    CASE(base, 1, SPATTN_STATUS_ALIASING, "dq", "dq overlaps dk",
         (t = P.dk, t.shape[1] = P.dq.shape[1], t.shape[2] = P.dq.shape[2],
          t.strides[1] = P.dq.strides[1], t.strides[2] = P.dq.strides[2], c.dq = &t));
    CASE(base, 1, SPATTN_STATUS_ALIASING, "dv", "dv overlaps dout",
         (t = P.dout, t.shape[1] = P.dv.shape[1], t.shape[2] = P.dv.shape[2],
          t.strides[1] = P.dv.strides[1], t.strides[2] = P.dv.strides[2], c.dv = &t));

    /* accepted: dq / dq_rope (and dk / dk_rope) as column views of concatenated buffers */
    {
        st_shape sc = s;
        sc.concat = 1;
        st_problem Q;
        tu_rng r2;
        tu_seed(&r2, 12);
        st_make(&Q, &sc, &r2);
        TU_CHECK(st_run_fwd(&Q, 0) == SPATTN_STATUS_SUCCESS, "concat fwd: %s", spattn_last_error());
        TU_CHECK(st_run_bwd(&Q, 0) == SPATTN_STATUS_SUCCESS,
                 "concatenated dq/dq_rope and dk/dk_rope views must be accepted: %s",
                 spattn_last_error());
        st_free(&Q);
    }
    st_free(&P);
    return tu_summary("test_sfa_validation");
}

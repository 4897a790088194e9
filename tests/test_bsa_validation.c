/*
 * One test per validation error of spattn_bsa_fwd / spattn_bsa_bwd / spattn_bsa_workspace_size:
 * the right status code, a last-error message naming the argument, and outputs untouched
 * (filled with a byte pattern before the call and compared after).
 */
#include <stdint.h>

#include "bsa_testkit.h"

enum { B = 1, N = 2, NKV = 1, SQ = 20, SKV = 24, D = 16, BX = 8, BY = 7 };
#define NBX ((SQ + BX - 1) / BX)
#define NBY ((SKV + BY - 1) / BY)
#define PATTERN 0xCD

/* Every tensor of a valid call; error cases copy it and break one thing. */
typedef struct fixture {
    spattn_tensor q, k, v, m, o, lse, dout, dq, dk, dv;
    int64_t bx, by;
    double scale;
    spattn_options opt;
} fixture;

static float *g_in[5];          /* q k v dout o_in (inputs of the backward) */
static uint8_t *g_mask;
static float *g_lse_in;
static uint8_t *g_out[5];       /* o lse dq dk dv, pattern-filled */
static size_t g_out_bytes[5];

static fixture make_fixture(void) {
    fixture f;
    int64_t sq[4] = {B, N, SQ, D}, skv[4] = {B, NKV, SKV, D}, sm[4] = {B, N, NBX, NBY}, sl[3] = {B, N, SQ};
    f.q = spattn_tensor_make(g_in[0], SPATTN_DTYPE_F32, 4, sq, NULL);
    f.k = spattn_tensor_make(g_in[1], SPATTN_DTYPE_F32, 4, skv, NULL);
    f.v = spattn_tensor_make(g_in[2], SPATTN_DTYPE_F32, 4, skv, NULL);
    f.dout = spattn_tensor_make(g_in[3], SPATTN_DTYPE_F32, 4, sq, NULL);
    f.m = spattn_tensor_make(g_mask, SPATTN_DTYPE_U8, 4, sm, NULL);
    f.o = spattn_tensor_make(g_out[0], SPATTN_DTYPE_F32, 4, sq, NULL);
    f.lse = spattn_tensor_make(g_out[1], SPATTN_DTYPE_F32, 3, sl, NULL);
    f.dq = spattn_tensor_make(g_out[2], SPATTN_DTYPE_F32, 4, sq, NULL);
    f.dk = spattn_tensor_make(g_out[3], SPATTN_DTYPE_F32, 4, skv, NULL);
    f.dv = spattn_tensor_make(g_out[4], SPATTN_DTYPE_F32, 4, skv, NULL);
    f.bx = BX;
    f.by = BY;
    f.scale = 0.0;
    spattn_options_init(&f.opt);
    return f;
}

static void fill_outputs(void) {
    for (int i = 0; i < 5; i++) memset(g_out[i], PATTERN, g_out_bytes[i]);
}
static int outputs_untouched(void) {
    for (int i = 0; i < 5; i++)
        for (size_t b = 0; b < g_out_bytes[i]; b++)
            if (g_out[i][b] != PATTERN) return 0;
    return 1;
}

/* Which entry point an error case runs. */
enum { RUN_FWD = 1, RUN_BWD = 2, RUN_WS = 4 };

/* In the backward, o and lse are inputs: use copies of valid values, not the outputs. */
static spattn_status call(int which, fixture *f, const spattn_tensor *const *ptrs, size_t *ws_bytes) {
    const spattn_tensor *q = ptrs[0], *k = ptrs[1], *v = ptrs[2], *m = ptrs[3];
    if (which == RUN_FWD)
        return spattn_bsa_fwd_ex(q, k, v, m, f->bx, f->by, f->scale, ptrs[4], ptrs[5], &f->opt);
    if (which == RUN_BWD)
        return spattn_bsa_bwd_ex(q, k, v, ptrs[4], ptrs[6], ptrs[5], m, f->bx, f->by, f->scale,
                                 ptrs[7], ptrs[8], ptrs[9], &f->opt);
    return spattn_bsa_workspace_size(q, k, v, m, f->bx, f->by, 1, &f->opt, ws_bytes);
}

/* Runs every selected entry point on the broken fixture and checks the outcome. */
static void expect(const char *what, int which, fixture *f, spattn_status want, const char *name,
                   int null_slot) {
    for (int w = RUN_FWD; w <= RUN_WS; w <<= 1) {
        if (!(which & w)) continue;
        fixture g = *f;
        spattn_tensor o_in = g.o, lse_in = g.lse;
        if (w == RUN_BWD) { /* o and lse are inputs of the backward: point them at valid data */
            if (o_in.data == g_out[0]) o_in.data = g_in[4];
            if (lse_in.data == g_out[1]) lse_in.data = g_lse_in;
        }
        const spattn_tensor *ptrs[10] = {&g.q, &g.k, &g.v, &g.m, &o_in, &lse_in, &g.dout, &g.dq, &g.dk, &g.dv};
        if (w == RUN_FWD) ptrs[4] = &g.o, ptrs[5] = &g.lse;
        if (null_slot >= 0) ptrs[null_slot] = NULL;
        fill_outputs();
        size_t ws = 12345;
        spattn_status st = call(w, &g, ptrs, &ws);
        const char *err = spattn_last_error();
        const char *wn = w == RUN_FWD ? "fwd" : w == RUN_BWD ? "bwd" : "workspace_size";
        TU_CHECK(st == want, "%s [%s]: status %d (%s), want %d", what, wn, st, err, want);
        TU_CHECK(err && *err && strstr(err, name), "%s [%s]: message '%s' should name '%s'", what, wn,
                 err ? err : "(null)", name);
        TU_CHECK(outputs_untouched(), "%s [%s]: outputs were written", what, wn);
        if (w == RUN_WS) TU_CHECK(ws == 12345, "%s [workspace_size]: *bytes written on error", what);
    }
}

int main(void) {
    int64_t nq = B * N * SQ * D, nkv = B * NKV * SKV * D;
    int64_t ncount[5] = {nq, nkv, nkv, nq, nq};
    tu_rng r;
    tu_seed(&r, tu_test_seed(11));
    for (int i = 0; i < 5; i++) {
        g_in[i] = malloc(sizeof(float) * (size_t)ncount[i]);
        for (int64_t j = 0; j < ncount[i]; j++) g_in[i][j] = (float)tu_normal(&r);
    }
    g_mask = malloc(B * N * NBX * NBY);
    memset(g_mask, 1, B * N * NBX * NBY);
    g_lse_in = malloc(sizeof(float) * B * N * SQ);
    for (int i = 0; i < B * N * SQ; i++) g_lse_in[i] = 3.0f;
    size_t ob[5] = {4 * (size_t)nq, 4 * B * N * SQ, 4 * (size_t)nq, 4 * (size_t)nkv, 4 * (size_t)nkv};
    for (int i = 0; i < 5; i++) {
        g_out_bytes[i] = ob[i];
        g_out[i] = malloc(ob[i]);
    }
    const int ALL = RUN_FWD | RUN_BWD | RUN_WS, FB = RUN_FWD | RUN_BWD;
    fixture f;

    /* Sanity: the valid fixture passes everywhere. */
    f = make_fixture();
    {
        size_t ws = 0;
        TU_CHECK(spattn_bsa_workspace_size(&f.q, &f.k, &f.v, &f.m, BX, BY, 1, &f.opt, &ws) == 0 && ws > 0,
                 "valid workspace query: %s", spattn_last_error());
        TU_CHECK(spattn_bsa_fwd_ex(&f.q, &f.k, &f.v, &f.m, BX, BY, 0.0, &f.o, &f.lse, &f.opt) == 0,
                 "valid fwd: %s", spattn_last_error());
    }

    /* NULL descriptors and NULL data pointers. */
    const char *names[10] = {"q", "k", "v", "block_mask", "o", "lse", "dout", "dq", "dk", "dv"};
    for (int s = 0; s < 10; s++) {
        int which = s < 4 ? ALL : s == 4 ? FB : s == 5 ? RUN_BWD : RUN_BWD; /* lse may be NULL in fwd */
        f = make_fixture();
        char what[64];
        snprintf(what, sizeof what, "NULL %s descriptor", names[s]);
        expect(what, which, &f, SPATTN_STATUS_NULL_POINTER, names[s], s);
        f = make_fixture();
        spattn_tensor *ts[10] = {&f.q, &f.k, &f.v, &f.m, &f.o, &f.lse, &f.dout, &f.dq, &f.dk, &f.dv};
        ts[s]->data = NULL;
        snprintf(what, sizeof what, "NULL %s data", names[s]);
        /* In the fwd, lse data NULL is an error (the descriptor was given). */
        expect(what, s < 4 ? ALL : s < 6 ? FB : RUN_BWD, &f, SPATTN_STATUS_NULL_POINTER, names[s], -1);
    }
    {
        f = make_fixture();
        fill_outputs();
        spattn_status st = spattn_bsa_workspace_size(&f.q, &f.k, &f.v, &f.m, BX, BY, 0, NULL, NULL);
        TU_CHECK(st == SPATTN_STATUS_NULL_POINTER && strstr(spattn_last_error(), "bytes"),
                 "NULL bytes out-pointer: %d %s", st, spattn_last_error());
    }

    /* Wrong ndim. */
    f = make_fixture(); f.q.ndim = 3; expect("q ndim 3", ALL, &f, SPATTN_STATUS_BAD_NDIM, "q", -1);
    f = make_fixture(); f.m.ndim = 5; expect("mask ndim 5", ALL, &f, SPATTN_STATUS_BAD_NDIM, "block_mask", -1);
    f = make_fixture(); f.lse.ndim = 4; expect("lse ndim 4", FB, &f, SPATTN_STATUS_BAD_NDIM, "lse", -1);
    f = make_fixture(); f.dk.ndim = 3; expect("dk ndim 3", RUN_BWD, &f, SPATTN_STATUS_BAD_NDIM, "dk", -1);

    /* Mismatched shapes. */
    f = make_fixture(); f.k.shape[3] = 8; expect("k D mismatch", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "k", -1);
    f = make_fixture(); f.v.shape[2] = SKV - 1; expect("v Skv mismatch", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "v", -1);
    f = make_fixture(); f.k.shape[0] = 2; expect("k B mismatch", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "k", -1);
    {   /* N % Nkv != 0: three query heads over two kv heads */
        f = make_fixture();
        f.q.shape[1] = 3; f.o.shape[1] = 3; f.k.shape[1] = 2; f.v.shape[1] = 2;
        expect("N % Nkv", RUN_FWD | RUN_WS, &f, SPATTN_STATUS_BAD_SHAPE, "k", -1);
    }
    f = make_fixture(); f.o.shape[2] = SQ + 1; expect("o Sq mismatch", FB, &f, SPATTN_STATUS_BAD_SHAPE, "o", -1);
    f = make_fixture(); f.dout.shape[3] = 8; expect("dout D mismatch", RUN_BWD, &f, SPATTN_STATUS_BAD_SHAPE, "dout", -1);
    f = make_fixture(); f.lse.shape[2] = SQ - 1; expect("lse Sq mismatch", FB, &f, SPATTN_STATUS_BAD_SHAPE, "lse", -1);
    f = make_fixture(); f.dq.shape[1] = 1; expect("dq N mismatch", RUN_BWD, &f, SPATTN_STATUS_BAD_SHAPE, "dq", -1);
    f = make_fixture(); f.dv.shape[2] = 5; expect("dv Skv mismatch", RUN_BWD, &f, SPATTN_STATUS_BAD_SHAPE, "dv", -1);

    /* Mismatched or unsupported dtypes. */
    f = make_fixture(); f.k.dtype = SPATTN_DTYPE_F16; expect("k fp16 vs q fp32", ALL, &f, SPATTN_STATUS_BAD_DTYPE, "k", -1);
    f = make_fixture(); f.q.dtype = SPATTN_DTYPE_I32; expect("q int32", ALL, &f, SPATTN_STATUS_BAD_DTYPE, "q", -1);
    f = make_fixture(); f.m.dtype = SPATTN_DTYPE_F32; expect("mask fp32", ALL, &f, SPATTN_STATUS_BAD_DTYPE, "block_mask", -1);
    f = make_fixture(); f.lse.dtype = SPATTN_DTYPE_BF16; expect("lse bf16", FB, &f, SPATTN_STATUS_BAD_DTYPE, "lse", -1);
    f = make_fixture(); f.o.dtype = SPATTN_DTYPE_BF16; expect("o bf16", FB, &f, SPATTN_STATUS_BAD_DTYPE, "o", -1);
    f = make_fixture(); f.dq.dtype = SPATTN_DTYPE_F16; expect("dq fp16", RUN_BWD, &f, SPATTN_STATUS_BAD_DTYPE, "dq", -1);
    f = make_fixture(); f.q.dtype = 77; expect("q unknown dtype", ALL, &f, SPATTN_STATUS_BAD_DTYPE, "q", -1);

    /* Non-positive dimensions. */
    f = make_fixture(); f.q.shape[2] = 0; expect("q Sq = 0", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "q", -1);
    f = make_fixture(); f.k.shape[2] = -3; expect("k Skv < 0", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "k", -1);
    f = make_fixture(); f.q.shape[0] = 0; expect("q B = 0", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "q", -1);

    /* bx, by <= 0. */
    f = make_fixture(); f.bx = 0; expect("bx = 0", ALL, &f, SPATTN_STATUS_INVALID_VALUE, "bx", -1);
    f = make_fixture(); f.by = -2; expect("by < 0", ALL, &f, SPATTN_STATUS_INVALID_VALUE, "by", -1);

    /* Mask shape other than [B, N, ceil(Sq/bx), ceil(Skv/by)]. */
    f = make_fixture(); f.m.shape[2] = NBX + 1; expect("mask rows", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "block_mask", -1);
    f = make_fixture(); f.m.shape[3] = NBY - 1; expect("mask cols", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "block_mask", -1);
    f = make_fixture(); f.bx = 2 * BX; expect("bx changes nbx", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "block_mask", -1);
    f = make_fixture(); f.m.shape[1] = 1; expect("mask per kv head", ALL, &f, SPATTN_STATUS_BAD_SHAPE, "block_mask", -1);

    /* Non-finite scale (the workspace query does not take one). */
    f = make_fixture(); f.scale = NAN; expect("scale NaN", FB, &f, SPATTN_STATUS_INVALID_VALUE, "scale", -1);
    f = make_fixture(); f.scale = INFINITY; expect("scale inf", FB, &f, SPATTN_STATUS_INVALID_VALUE, "scale", -1);

    /* Head dim: multiple of 8 up to 256. */
    {
        f = make_fixture();
        f.q.shape[3] = f.k.shape[3] = f.v.shape[3] = f.o.shape[3] = f.dout.shape[3] = f.dq.shape[3] =
            f.dk.shape[3] = f.dv.shape[3] = 12;
        expect("D = 12", ALL, &f, SPATTN_STATUS_NOT_SUPPORTED, "D", -1);
        static float big[B * N * SQ * 264 + B * NKV * SKV * 264];
        f = make_fixture();
        int64_t sq[4] = {B, N, SQ, 264}, skv[4] = {B, NKV, SKV, 264};
        f.q = spattn_tensor_make(big, SPATTN_DTYPE_F32, 4, sq, NULL);
        f.k = spattn_tensor_make(big + B * N * SQ * 264, SPATTN_DTYPE_F32, 4, skv, NULL);
        f.v = f.k;
        expect("D = 264", RUN_FWD | RUN_WS, &f, SPATTN_STATUS_NOT_SUPPORTED, "D", -1);
    }

    /* An output overlapping an input. */
    f = make_fixture(); f.o.data = g_in[0]; expect("o aliases q", RUN_FWD, &f, SPATTN_STATUS_ALIASING, "o", -1);
    f = make_fixture(); f.lse.data = g_in[1] + 3; expect("lse inside k", RUN_FWD, &f, SPATTN_STATUS_ALIASING, "lse", -1);
    f = make_fixture(); f.dq.data = g_in[3]; expect("dq aliases dout", RUN_BWD, &f, SPATTN_STATUS_ALIASING, "dq", -1);
    f = make_fixture(); f.dv.data = g_in[2]; expect("dv aliases v", RUN_BWD, &f, SPATTN_STATUS_ALIASING, "dv", -1);
    f = make_fixture(); f.dk.data = g_mask; expect("dk over mask", RUN_BWD, &f, SPATTN_STATUS_ALIASING, "dk", -1);

    /* An output overlapping another output. */
    f = make_fixture(); f.lse.data = g_out[0] + 64; expect("lse inside o", RUN_FWD, &f, SPATTN_STATUS_ALIASING, "lse", -1);
    f = make_fixture(); f.dv.data = g_out[3]; expect("dv = dk", RUN_BWD, &f, SPATTN_STATUS_ALIASING, "dv", -1);
    f = make_fixture(); f.dk.data = g_out[2] + 16; expect("dk inside dq", RUN_BWD, &f, SPATTN_STATUS_ALIASING, "dk", -1);

    /* A self-overlapping output (stride 0 broadcast, or rows closer than D). */
    f = make_fixture(); f.o.strides[2] = 0; expect("o stride 0", RUN_FWD, &f, SPATTN_STATUS_BAD_STRIDE, "o", -1);
    f = make_fixture(); f.dq.strides[2] = D / 2; expect("dq rows overlap", RUN_BWD, &f, SPATTN_STATUS_BAD_STRIDE, "dq", -1);
    f = make_fixture(); f.dk.strides[3] = 0; expect("dk stride 0", RUN_BWD, &f, SPATTN_STATUS_BAD_STRIDE, "dk", -1);
    f = make_fixture(); f.lse.strides[2] = 0; expect("lse stride 0", RUN_FWD, &f, SPATTN_STATUS_BAD_STRIDE, "lse", -1);

    /* Strides whose offsets overflow 64 bits. */
    f = make_fixture(); f.q.strides[2] = INT64_MAX / 8;
    expect("q stride overflow", RUN_FWD | RUN_WS, &f, SPATTN_STATUS_BAD_STRIDE, "q", -1);
    f = make_fixture(); f.v.strides[2] = INT64_MAX / 4;
    expect("v stride overflow", ALL, &f, SPATTN_STATUS_BAD_STRIDE, "v", -1);
    f = make_fixture(); f.dv.strides[1] = -(INT64_MAX / 3); f.dv.shape[1] = 1; f.dv.strides[2] = INT64_MAX / 8;
    expect("dv stride overflow", RUN_BWD, &f, SPATTN_STATUS_BAD_STRIDE, "dv", -1);

    /* Caller workspace smaller than needed. */
    {
        size_t need = 0;
        f = make_fixture();
        spattn_bsa_workspace_size(&f.q, &f.k, &f.v, &f.m, BX, BY, 1, &f.opt, &need);
        void *small = malloc(need);
        f.opt.workspace = small;
        f.opt.workspace_size = need - 1;
        expect("workspace too small", RUN_BWD, &f, SPATTN_STATUS_WORKSPACE_TOO_SMALL, "workspace", -1);
        spattn_bsa_workspace_size(&f.q, &f.k, &f.v, &f.m, BX, BY, 0, &f.opt, &need);
        f.opt.workspace_size = need - 1;
        expect("fwd workspace too small", RUN_FWD, &f, SPATTN_STATUS_WORKSPACE_TOO_SMALL, "workspace", -1);
        free(small);
    }

    /* Bad options. */
    f = make_fixture(); f.opt.num_threads = -1; expect("num_threads < 0", ALL, &f, SPATTN_STATUS_BAD_OPTIONS, "num_threads", -1);
    f = make_fixture(); f.opt.backend = 9; expect("backend 9", ALL, &f, SPATTN_STATUS_BAD_OPTIONS, "backend", -1);
    f = make_fixture(); f.opt.workspace_size = 64; expect("workspace NULL with size", ALL, &f, SPATTN_STATUS_BAD_OPTIONS, "workspace", -1);

    /* Devices: mixed devices, and CUDA tensors on a build/machine without a CUDA device. */
    f = make_fixture(); f.k.device_type = SPATTN_DEVICE_CUDA;
    expect("k on cuda, q on cpu", ALL, &f, SPATTN_STATUS_BAD_DEVICE, "k", -1);
    f = make_fixture(); f.o.device_type = SPATTN_DEVICE_CUDA;
    expect("o on cuda, q on cpu", FB, &f, SPATTN_STATUS_BAD_DEVICE, "o", -1);
    f = make_fixture(); f.q.device_type = 7;
    expect("unknown device", ALL, &f, SPATTN_STATUS_BAD_DEVICE, "device", -1);
    if (!spattn_cuda_available()) {
        f = make_fixture();
        spattn_tensor *ts[10] = {&f.q, &f.k, &f.v, &f.m, &f.o, &f.lse, &f.dout, &f.dq, &f.dk, &f.dv};
        for (int s = 0; s < 10; s++) ts[s]->device_type = SPATTN_DEVICE_CUDA;
        expect("cuda tensors without CUDA", ALL, &f, SPATTN_STATUS_BACKEND_UNAVAILABLE, "cuda", -1);
    }
    f = make_fixture(); f.opt.backend = SPATTN_BACKEND_CUDA;
    expect("backend cuda with cpu tensors", ALL, &f, SPATTN_STATUS_BAD_DEVICE, "cuda", -1);

    for (int i = 0; i < 5; i++) {
        free(g_in[i]);
        free(g_out[i]);
    }
    free(g_mask);
    free(g_lse_in);
    return tu_summary("test_bsa_validation");
}

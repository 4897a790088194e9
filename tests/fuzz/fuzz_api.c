/*
 * libFuzzer harness for every public entry point of libspattn: spattn_bsa_{fwd,bwd}[_ex],
 * spattn_sfa_{fwd,bwd}[_ex], spattn_{bsa,sfa}_workspace_size and the small helpers.
 *
 * The input first picks a tiny, consistent problem (shapes, dtype, layout of each tensor:
 * contiguous, transposed, padded, broadcast, reversed, interleaved), then applies up to 16
 * mutations to any descriptor field (ndim, dtype, device, shape, strides, data, NULL), to the
 * scalars (bx, by, sbs, mode, scale, backward) and to the options (backend, threads, stream,
 * workspace, deterministic, reserved), and may make tensors share one buffer (aliasing).
 * Every tensor that can be read gets a buffer of exactly its extent, so ASan flags any access
 * outside a descriptor.  Oracles beyond the sanitizers:
 *   - an error leaves every buffer unchanged ("validated before any output is written") and
 *     sets a non-empty spattn_last_error();
 *   - inputs are never written, on success either;
 *   - options with deterministic not 0/1 or a nonzero reserved field are rejected.
 * Descriptors that describe more than CAP bytes or elements (legitimate but too big for a
 * fuzzer) go to the workspace-size queries only, which read no data.
 *
 * Build: cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPATTN_FUZZ=ON -DSPATTN_CUDA=OFF
 * Run:   build-fuzz/tests/fuzz/fuzz_api -max_total_time=60 NEW_DIR tests/fuzz/corpus/api
 */
#include "fuzz_desc.h"

static void base_bsa(call *c, fz_in *in) {
    int32_t dt = fz_range(in, 3);
    int64_t B = small(in, 1, 2), Nkv = small(in, 1, 2), N = Nkv * small(in, 1, 3);
    int64_t Sq = small(in, 1, 20), Skv = small(in, 1, 20), D = 8 * small(in, 1, 3);
    c->bx = small(in, 1, 12);
    c->by = small(in, 1, 12);
    int64_t qs[4] = {B, N, Sq, D}, ks[4] = {B, Nkv, Skv, D};
    int64_t ms[4] = {B, N, (Sq + c->bx - 1) / c->bx, (Skv + c->by - 1) / c->by}, ls[3] = {B, N, Sq};
    /* 0 q 1 k 2 v 3 mask 4 o 5 lse | bwd: 6 dout 7 dq 8 dk 9 dv (o and lse become inputs) */
    make(&c->ts[0], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[1], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[3], K_MASK, SPATTN_DTYPE_U8, 4, ms, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[5], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in) % 3, 1);
    make(&c->ts[6], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[7], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[8], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    make(&c->ts[9], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    c->nt = 10;
}

static void base_sfa(call *c, fz_in *in) {
    int32_t dt = fz_range(in, 3);
    int64_t B = small(in, 1, 2), S1 = small(in, 1, 6), S2 = small(in, 1, 24), N2 = small(in, 1, 2);
    int64_t N1 = N2 * small(in, 1, 3), D = 8 * small(in, 1, 3), Dr = 8 * fz_range(in, 2);
    int64_t K = small(in, 1, 6);
    c->sbs = (int64_t)1 << fz_range(in, 4);
    c->mode = fz_range(in, 2) ? SPATTN_SFA_MODE_CAUSAL : SPATTN_SFA_MODE_NONE;
    c->nblk = (S2 + c->sbs - 1) / c->sbs;
    int64_t qs[4] = {B, S1, N1, D}, qr[4] = {B, S1, N1, Dr}, ks[4] = {B, S2, N2, D};
    int64_t kr[4] = {B, S2, N2, Dr}, is[4] = {B, S1, N2, K}, ls[3] = {B, S1, N1};
    /* 0 q 1 q_rope 2 k 3 k_rope 4 v 5 idx 6 o 7 lse | bwd: 8 dout 9 dq 10 dq_rope 11 dk
     * 12 dk_rope 13 dv */
    make(&c->ts[0], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[1], K_FLOAT, dt, 4, qr, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[3], K_FLOAT, dt, 4, kr, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, dt, 4, ks, fz_u8(in), 0);
    make(&c->ts[5], K_IDX, SPATTN_DTYPE_I32, 4, is, fz_u8(in), 0);
    make(&c->ts[6], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[7], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in) % 3, 1);
    make(&c->ts[8], K_FLOAT, dt, 4, qs, fz_u8(in), 0);
    make(&c->ts[9], K_FLOAT, dt, 4, qs, fz_u8(in) % 3, 1);
    make(&c->ts[10], K_FLOAT, dt, 4, qr, fz_u8(in) % 3, 1);
    make(&c->ts[11], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    make(&c->ts[12], K_FLOAT, dt, 4, kr, fz_u8(in) % 3, 1);
    make(&c->ts[13], K_FLOAT, dt, 4, ks, fz_u8(in) % 3, 1);
    c->nt = 14;
    if (!Dr) c->ts[1].present = c->ts[3].present = c->ts[10].present = c->ts[12].present = 0;
    if (fz_range(in, 2)) c->ts[4].present = c->ts[13].present = 0; /* v shared with k */
}

static void misc(fz_in *in) {
    int64_t shape[SPATTN_MAX_DIMS], strides[SPATTN_MAX_DIMS];
    for (int i = 0; i < SPATTN_MAX_DIMS; i++) {
        shape[i] = fz_i64(in);
        strides[i] = fz_i64(in);
    }
    int32_t ndim = (int32_t)fz_i64(in);
    spattn_tensor t = spattn_tensor_make(g_dummy, (spattn_dtype)fz_i64(in), ndim, shape,
                                         fz_range(in, 2) ? strides : NULL);
    (void)t;
    int32_t v = (int32_t)fz_i64(in);
    if (!spattn_status_str((spattn_status)v) || !spattn_dtype_name((spattn_dtype)v)) abort();
    (void)spattn_dtype_size((spattn_dtype)v);
    spattn_options_init(NULL);
    if (!spattn_version(NULL, NULL, NULL) || !spattn_cpu_isa() || !spattn_last_error()) abort();
    (void)spattn_cuda_available();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int entry = fz_range(&in, 11);
    if (entry == 10) {
        misc(&in);
        return 0;
    }
    static call c;
    memset(&c, 0, sizeof c);
    spattn_options_init(&c.opt);
    c.use_opt = 1;
    c.scale = 0.0;
    int is_bsa = entry < 5;
    if (is_bsa) base_bsa(&c, &in);
    else base_sfa(&c, &in);
    c.backward = (entry % 5) >= 2 && (entry % 5) <= 3;
    int is_ws = entry % 5 == 4, is_bwd = (entry % 5) >= 2 && !is_ws;
    if (!is_ws && (entry % 5) % 2 == 0) c.use_opt = 0; /* the plain form */
    if (is_bwd) { /* o and lse are inputs of the backward */
        c.ts[is_bsa ? 4 : 6].is_output = 0;
        c.ts[is_bsa ? 5 : 7].is_output = 0;
    }
    uint64_t seed = fz_bytes(&in, 4) | 1;
    mutate(&c, &in);
    int big = place(&c, seed);

    uint8_t *ws = setup_workspace(&c, &in);

    const spattn_options *opt = c.use_opt ? &c.opt : NULL;
    spattn_status st;
    size_t bytes = 0;
    int ran = 1;
    if (is_ws || big) {
        if (is_bsa)
            st = spattn_bsa_workspace_size(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx,
                                           c.by, c.backward, opt, &bytes);
        else
            st = spattn_sfa_workspace_size(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3),
                                           arg(&c, 4), arg(&c, 5), c.sbs, c.mode, c.backward, opt,
                                           &bytes);
        ran = 0;
    } else if (is_bsa && !is_bwd) {
        st = c.use_opt ? spattn_bsa_fwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx,
                                           c.by, c.scale, arg(&c, 4), arg(&c, 5), opt)
                       : spattn_bsa_fwd(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx, c.by,
                                        c.scale, arg(&c, 4), arg(&c, 5));
    } else if (is_bsa) {
        st = c.use_opt ? spattn_bsa_bwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 4),
                                           arg(&c, 6), arg(&c, 5), arg(&c, 3), c.bx, c.by, c.scale,
                                           arg(&c, 7), arg(&c, 8), arg(&c, 9), opt)
                       : spattn_bsa_bwd(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 4), arg(&c, 6),
                                        arg(&c, 5), arg(&c, 3), c.bx, c.by, c.scale, arg(&c, 7),
                                        arg(&c, 8), arg(&c, 9));
    } else if (!is_bwd) {
        st = c.use_opt ? spattn_sfa_fwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3),
                                           arg(&c, 4), arg(&c, 5), c.sbs, c.mode, c.scale,
                                           arg(&c, 6), arg(&c, 7), opt)
                       : spattn_sfa_fwd(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4),
                                        arg(&c, 5), c.sbs, c.mode, c.scale, arg(&c, 6), arg(&c, 7));
    } else {
        st = c.use_opt ? spattn_sfa_bwd_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3),
                                           arg(&c, 4), arg(&c, 6), arg(&c, 8), arg(&c, 7),
                                           arg(&c, 5), c.sbs, c.mode, c.scale, arg(&c, 9),
                                           arg(&c, 10), arg(&c, 11), arg(&c, 12), arg(&c, 13), opt)
                       : spattn_sfa_bwd(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4),
                                        arg(&c, 6), arg(&c, 8), arg(&c, 7), arg(&c, 5), c.sbs,
                                        c.mode, c.scale, arg(&c, 9), arg(&c, 10), arg(&c, 11),
                                        arg(&c, 12), arg(&c, 13));
    }

    check_and_free(&c, st, ran, bytes, ws);
    return 0;
}

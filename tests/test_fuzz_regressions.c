/*
 * Regression tests for what the fuzzers (tests/fuzz/) found, one function per finding, each
 * named after the harness and the defect.  The inputs that triggered them are also kept in
 * the seed corpora (tests/fuzz/corpus/), which ctest replays in every build.
 */
#include "testutil.h"

/* A tiny valid bsa forward problem: q, k, v [1,1,8,8] fp32, mask [1,1,1,1], bx = by = 8. */
typedef struct tiny_bsa {
    float q[64], k[64], v[64], o[64], lse[8];
    uint8_t mask[1];
    spattn_tensor tq, tk, tv, tm, to, tl;
} tiny_bsa;

static void tiny_bsa_init(tiny_bsa *p) {
    int64_t s4[4] = {1, 1, 8, 8}, m4[4] = {1, 1, 1, 1}, l3[3] = {1, 1, 8};
    for (int i = 0; i < 64; i++) p->q[i] = p->k[i] = p->v[i] = (float)(i % 7) / 7.0f;
    for (int i = 0; i < 64; i++) p->o[i] = 42.0f;
    p->mask[0] = 1;
    p->tq = spattn_tensor_make(p->q, SPATTN_DTYPE_F32, 4, s4, NULL);
    p->tk = spattn_tensor_make(p->k, SPATTN_DTYPE_F32, 4, s4, NULL);
    p->tv = spattn_tensor_make(p->v, SPATTN_DTYPE_F32, 4, s4, NULL);
    p->tm = spattn_tensor_make(p->mask, SPATTN_DTYPE_U8, 4, m4, NULL);
    p->to = spattn_tensor_make(p->o, SPATTN_DTYPE_F32, 4, s4, NULL);
    p->tl = spattn_tensor_make(p->lse, SPATTN_DTYPE_F32, 3, l3, NULL);
}

static spattn_status tiny_bsa_run(tiny_bsa *p, const spattn_options *opt) {
    return spattn_bsa_fwd_ex(&p->tq, &p->tk, &p->tv, &p->tm, 8, 8, 0.0, &p->to, &p->tl, opt);
}

/* Two packed sequences (3 and 5 queries, 4 and 6 keys; D = 8, one head), one block each:
 * q [8, 1, 8], k, v [10, 1, 8], mask [2, 1, 1, 1], max_seqlen 5 / 6. */
enum { VQ = 8, VK = 10, VD = 8 };
typedef struct tiny_varlen {
    float q[VQ * VD], k[VK * VD], v[VK * VD];
    int32_t cuq[3], cuk[3];
    uint8_t mask[2];
    spattn_tensor tq, tk, tv, tm, tcq, tck;
    spattn_varlen vl;
} tiny_varlen;

static void tiny_varlen_init(tiny_varlen *p) {
    const int64_t qs[3] = {VQ, 1, VD}, ks[3] = {VK, 1, VD}, ms[4] = {2, 1, 1, 1}, cs[1] = {3};
    for (int i = 0; i < VQ * VD; i++) p->q[i] = (float)((i * 7) % 11) / 11.0f;
    for (int i = 0; i < VK * VD; i++) p->k[i] = (float)((i * 5) % 13) / 13.0f, p->v[i] = (float)(i % 9) / 9.0f;
    p->cuq[0] = 0, p->cuq[1] = 3, p->cuq[2] = 8;
    p->cuk[0] = 0, p->cuk[1] = 4, p->cuk[2] = 10;
    p->mask[0] = p->mask[1] = 1;
    p->tq = spattn_tensor_make(p->q, SPATTN_DTYPE_F32, 3, qs, NULL);
    p->tk = spattn_tensor_make(p->k, SPATTN_DTYPE_F32, 3, ks, NULL);
    p->tv = spattn_tensor_make(p->v, SPATTN_DTYPE_F32, 3, ks, NULL);
    p->tm = spattn_tensor_make(p->mask, SPATTN_DTYPE_U8, 4, ms, NULL);
    p->tcq = spattn_tensor_make(p->cuq, SPATTN_DTYPE_I32, 1, cs, NULL);
    p->tck = spattn_tensor_make(p->cuk, SPATTN_DTYPE_I32, 1, cs, NULL);
    memset(&p->vl, 0, sizeof p->vl);
    p->vl.cu_seqlens_q = &p->tcq;
    p->vl.cu_seqlens_kv = &p->tck;
    p->vl.max_seqlen_q = 5;
    p->vl.max_seqlen_kv = 6;
}

/* fuzz_api: options with deterministic outside {0, 1} or a nonzero reserved field were
 * accepted (the header says reserved fields are zero); now BAD_OPTIONS, nothing written. */
static void fuzz_api_options_deterministic_reserved(void) {
    tiny_bsa p;
    tiny_bsa_init(&p);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.deterministic = 2;
    spattn_status st = tiny_bsa_run(&p, &opt);
    TU_CHECK(st == SPATTN_STATUS_BAD_OPTIONS && strstr(spattn_last_error(), "deterministic"),
             "deterministic=2: status %d (%s)", st, spattn_last_error());
    TU_CHECK(p.o[0] == 42.0f, "deterministic=2: output written");
    size_t bytes = 0;
    st = spattn_bsa_workspace_size(&p.tq, &p.tk, &p.tv, &p.tm, 8, 8, 0, &opt, &bytes);
    TU_CHECK(st == SPATTN_STATUS_BAD_OPTIONS, "workspace query, deterministic=2: status %d", st);
    spattn_options_init(&opt);
    opt.reserved[6] = 1;
    st = tiny_bsa_run(&p, &opt);
    TU_CHECK(st == SPATTN_STATUS_BAD_OPTIONS && strstr(spattn_last_error(), "reserved[6]"),
             "reserved[6]=1: status %d (%s)", st, spattn_last_error());
    TU_CHECK(p.o[0] == 42.0f, "reserved: output written");
    spattn_options_init(&opt);
    opt.deterministic = 0;
    st = tiny_bsa_run(&p, &opt);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "deterministic=0 must pass: %s", spattn_last_error());
}

/* fuzz_api: spattn_tensor_make multiplied the shape into contiguous strides without an
 * overflow check (signed overflow, undefined behaviour; UBSan aborted).  Now the stride
 * saturates and the call reports BAD_STRIDE. */
static void fuzz_api_tensor_make_stride_overflow(void) {
    tiny_bsa p;
    tiny_bsa_init(&p);
    int64_t huge[4] = {1, (int64_t)1 << 40, (int64_t)1 << 40, 8};
    spattn_tensor q = spattn_tensor_make(p.q, SPATTN_DTYPE_F32, 4, huge, NULL);
    TU_CHECK(q.strides[3] == 1 && q.strides[2] == 8 && q.strides[1] == ((int64_t)1 << 43),
             "inner strides");
    TU_CHECK(q.strides[0] == INT64_MAX, "saturated stride, got %lld", (long long)q.strides[0]);
    int64_t neg[3] = {(int64_t)1 << 62, -4, 3};
    spattn_tensor t = spattn_tensor_make(p.q, SPATTN_DTYPE_F32, 3, neg, NULL);
    TU_CHECK(t.strides[2] == 1 && t.strides[1] == 3, "strides with a negative dim");
    size_t bytes = 0;
    int64_t s4[4] = {1, (int64_t)1 << 40, (int64_t)1 << 40, 8};
    int64_t m4[4] = {1, (int64_t)1 << 40, (int64_t)1 << 37, 1};
    spattn_tensor mk = spattn_tensor_make(p.mask, SPATTN_DTYPE_U8, 4, m4, NULL);
    spattn_tensor kk = spattn_tensor_make(p.k, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_status st = spattn_bsa_workspace_size(&q, &kk, &kk, &mk, 8, (int64_t)1 << 40, 0, NULL, &bytes);
    TU_CHECK(st == SPATTN_STATUS_BAD_STRIDE, "huge contiguous q: status %d (%s)", st,
             spattn_last_error());
}

/* fuzz_api: options.num_threads had no upper bound: 2^31-1 made the CPU backend size its
 * workspace for that many threads (a 141 GB malloc for a tiny problem) and start them in
 * OpenMP (an abort).  Now BAD_OPTIONS above 1024. */
static void fuzz_api_num_threads_limit(void) {
    tiny_bsa p;
    tiny_bsa_init(&p);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = INT32_MAX;
    spattn_status st = tiny_bsa_run(&p, &opt);
    TU_CHECK(st == SPATTN_STATUS_BAD_OPTIONS && strstr(spattn_last_error(), "num_threads"),
             "num_threads=INT32_MAX: status %d (%s)", st, spattn_last_error());
    size_t bytes = 0;
    opt.num_threads = 1025;
    st = spattn_bsa_workspace_size(&p.tq, &p.tk, &p.tv, &p.tm, 8, 8, 1, &opt, &bytes);
    TU_CHECK(st == SPATTN_STATUS_BAD_OPTIONS, "workspace query, 1025 threads: status %d", st);
    opt.num_threads = 3;
    st = tiny_bsa_run(&p, &opt);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "3 threads: %s", spattn_last_error());
}

/* fuzz_api_more: the varlen bsa entry points computed ceil(max_seqlen/bx) as
 * (max_seqlen + bx - 1) / bx and kept bx unclamped: bx near INT64_MAX overflowed (UBSan: signed
 * overflow in the CPU tiling).  Now a block longer than every sequence is the whole sequence,
 * as in the dense call: the result equals the call with bx = max_seqlen_q, by = max_seqlen_kv. */
static void fuzz_api_more_varlen_huge_block(void) {
    tiny_varlen p;
    tiny_varlen_init(&p);
    float o1[VQ * VD], o2[VQ * VD], l1[VQ], l2[VQ];
    const int64_t qs[3] = {VQ, 1, VD}, ls[2] = {VQ, 1};
    spattn_tensor to1 = spattn_tensor_make(o1, SPATTN_DTYPE_F32, 3, qs, NULL);
    spattn_tensor to2 = spattn_tensor_make(o2, SPATTN_DTYPE_F32, 3, qs, NULL);
    spattn_tensor tl1 = spattn_tensor_make(l1, SPATTN_DTYPE_F32, 2, ls, NULL);
    spattn_tensor tl2 = spattn_tensor_make(l2, SPATTN_DTYPE_F32, 2, ls, NULL);
    spattn_status st = spattn_bsa_fwd_varlen(&p.tq, &p.tk, &p.tv, &p.tm, 5, 6, 0.0, &p.vl, &to1, &tl1, NULL);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "varlen bx = max_seqlen: %s", spattn_last_error());
    st = spattn_bsa_fwd_varlen(&p.tq, &p.tk, &p.tv, &p.tm, INT64_MAX - 1, INT64_MAX, 0.0, &p.vl, &to2, &tl2, NULL);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "varlen bx near INT64_MAX: status %d (%s)", st,
             spattn_last_error());
    TU_CHECK(st != SPATTN_STATUS_SUCCESS || (!memcmp(o1, o2, sizeof o1) && !memcmp(l1, l2, sizeof l1)),
             "varlen: a huge block differs from a block of max_seqlen");
    size_t bytes = 0;
    st = spattn_bsa_varlen_workspace_size(&p.tq, &p.tk, &p.tv, &p.tm, INT64_MAX, INT64_MAX, &p.vl, 1, NULL, &bytes);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS && bytes < ((size_t)1 << 30),
             "varlen workspace, huge blocks: status %d, %zu bytes", st, bytes);
}

/* fuzz_api (found by the CI fuzzing stage): a view whose lowest byte offset is exactly
 * INT64_MIN (fp32, stride -2^61 on a dimension of 2) negated that offset in the
 * address-space check (undefined behaviour); now BAD_STRIDE, nothing written. */
static void fuzz_api_stride_int64_min(void) {
    tiny_bsa p;
    tiny_bsa_init(&p);
    int64_t sh[4] = {2, 1, 8, 8}, st[4] = {-((int64_t)1 << 61), 64, 8, 1};
    spattn_tensor q = spattn_tensor_make(p.q, SPATTN_DTYPE_F32, 4, sh, st);
    int64_t s2[4] = {2, 1, 8, 8}, m2[4] = {2, 1, 1, 1};
    uint8_t mask[2] = {1, 1};
    spattn_tensor m = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, m2, NULL);
    float k[128] = {0}, o[128], lse[16];
    for (int i = 0; i < 128; i++) o[i] = 42.0f;
    spattn_tensor kk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, s2, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, s2, NULL);
    int64_t l3[3] = {2, 1, 8};
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, l3, NULL);
    spattn_status s = spattn_bsa_fwd(&q, &kk, &kk, &m, 8, 8, 0.0, &to, &tl);
    TU_CHECK(s == SPATTN_STATUS_BAD_STRIDE, "stride reaching INT64_MIN bytes: status %d (%s)", s,
             spattn_last_error());
    int untouched = 1;
    for (int i = 0; i < 128; i++) untouched &= o[i] == 42.0f;
    TU_CHECK(untouched, "nothing written");
}


/* fuzz_api_more: sfa's CPU workspace layout multiplied shapes in int64 (UBSan: signed overflow
 * in sfa_tile_layout_of with ~2^59 query heads of a stride-0 q).  The sizes now saturate and a
 * query past SIZE_MAX answers OUT_OF_MEMORY with a message. */
static void fuzz_api_more_sfa_workspace_overflow(void) {
    float q[16] = {0}, k[5 * 16] = {0};
    int32_t idx[2 * 4] = {0, 1, -1, 2, 0, 1, 2, -1};
    const int64_t H = (int64_t)1 << 59;
    int64_t qs[4] = {1, 2, H, 16}, qst[4] = {0, 0, 0, 1}, ks[4] = {1, 5, 1, 16}, is[4] = {1, 2, 1, 4};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, qst);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, ks, NULL);
    spattn_tensor ti = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, is, NULL);
    for (int bwd = 0; bwd < 2; bwd++) {
        size_t bytes = 12345;
        spattn_status st = spattn_sfa_workspace_size(&tq, NULL, &tk, NULL, NULL, &ti, 2, 0, bwd, NULL, &bytes);
        TU_CHECK(st == SPATTN_STATUS_OUT_OF_MEMORY && strstr(spattn_last_error(), "SIZE_MAX"),
                 "sfa %s workspace, 2^59 heads: status %d (%s), %zu bytes", bwd ? "bwd" : "fwd", st,
                 spattn_last_error(), bytes);
    }
}

/* fuzz_api_more: the address-space check formed the view's end offset as hi + 1 with hi =
 * INT64_MAX elements (UBSan: signed overflow in spattn_check_strides); now BAD_STRIDE. */
static void fuzz_api_more_stride_extent_int64_max(void) {
    float q[16] = {0}, k[16] = {0}, o[16], lse[2];
    for (int i = 0; i < 16; i++) o[i] = 42.f;
    uint8_t mask[2] = {1, 1};
    /* q's last element: (INT64_MAX - 7) + 7 = INT64_MAX */
    int64_t s4[4] = {2, 1, 1, 8}, bad[4] = {INT64_MAX - 7, 8, 8, 1}, m4[4] = {2, 1, 1, 1}, l3[3] = {2, 1, 1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, s4, bad);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tm = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, m4, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, l3, NULL);
    spattn_status st = spattn_bsa_fwd(&tq, &tk, &tk, &tm, 1, 1, 0.0, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_BAD_STRIDE, "last element at INT64_MAX: status %d (%s)", st, spattn_last_error());
    int untouched = 1;
    for (int i = 0; i < 16; i++) untouched &= o[i] == 42.f;
    TU_CHECK(untouched, "nothing written");
}

/* fuzz_api_more: the CPU bsa workspace of a packed q of INT64_MAX - 1 rows (a stride-0 view)
 * sized Delta as N x Tq floats rounded up in int64 (UBSan: signed overflow in bsa_round_up).
 * Views that large now answer OUT_OF_MEMORY; a huge block size still answers the real need. */
static void fuzz_api_more_bsa_varlen_rows_int64(void) {
    tiny_varlen p;
    tiny_varlen_init(&p);
    const int64_t huge[3] = {INT64_MAX - 1, 1, VD}, hst[3] = {0, VD, 1};
    spattn_tensor th = spattn_tensor_make(p.q, SPATTN_DTYPE_F32, 3, huge, hst);
    for (int bwd = 0; bwd < 2; bwd++) {
        size_t bytes = 0;
        spattn_status st = spattn_bsa_varlen_workspace_size(&th, &p.tk, &p.tv, &p.tm, 5, 6, &p.vl, bwd, NULL, &bytes);
        TU_CHECK(st == SPATTN_STATUS_OUT_OF_MEMORY && strstr(spattn_last_error(), "SIZE_MAX"),
                 "bsa varlen %s workspace, Tq = INT64_MAX - 1: status %d (%s), %zu bytes", bwd ? "bwd" : "fwd", st,
                 spattn_last_error(), bytes);
        st = spattn_bsa_varlen_workspace_size(&p.tq, &p.tk, &p.tv, &p.tm, INT64_MAX, INT64_MAX, &p.vl, bwd, NULL, &bytes);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS && bytes < ((size_t)1 << 30),
                 "bsa varlen %s workspace, huge blocks: status %d (%s), %zu bytes", bwd ? "bwd" : "fwd", st,
                 spattn_last_error(), bytes);
    }
}

/* CI's fuzz_api_more timed out (20 s for one input) after the seed corpus: options.num_threads
 * up to 1024 on a tiny problem started 1024 OpenMP threads, with a barrier per tile of the sfa
 * backward (0.5-1 s per call instead of 7 ms on 2 cores, more with two fuzzers at once), and
 * sized a workspace region per thread (bsa: ~400 MB at D = 128).  Now no more threads than work
 * items: the workspace of 1024 requested threads is that of the items' count. */
static void fuzz_api_more_thread_team(void) {
    enum { S = 8, D = 128 };
    static float q[S * D], k[S * D];
    uint8_t mask[1] = {1};
    int64_t s4[4] = {1, 1, S, D}, m4[4] = {1, 1, 1, 1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tm = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, m4, NULL);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CPU;
    size_t many = 0, few = 0;
    for (int bwd = 0; bwd < 2; bwd++) {
        opt.num_threads = 1024;
        spattn_status s1 = spattn_bsa_workspace_size(&tq, &tk, &tk, &tm, S, S, bwd, &opt, &many);
        opt.num_threads = 2 * S + 1; /* >= the bound on this problem's items */
        spattn_status s2 = spattn_bsa_workspace_size(&tq, &tk, &tk, &tm, S, S, bwd, &opt, &few);
        TU_CHECK(s1 == SPATTN_STATUS_SUCCESS && s2 == SPATTN_STATUS_SUCCESS && many == few,
                 "bsa %s workspace: 1024 threads %zu bytes, %d threads %zu bytes", bwd ? "bwd" : "fwd", many,
                 2 * S + 1, few);
    }
    int32_t idx[S * 4];
    for (int i = 0; i < S * 4; i++) idx[i] = i % 4 < 2 ? i % S : -1;
    int64_t qs[4] = {1, S, 1, D}, is[4] = {1, S, 1, 4};
    spattn_tensor sq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor sk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor si = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, is, NULL);
    opt.num_threads = 1024;
    spattn_status s1 = spattn_sfa_workspace_size(&sq, NULL, &sk, NULL, NULL, &si, 1, 0, 0, &opt, &many);
    opt.num_threads = S;
    spattn_status s2 = spattn_sfa_workspace_size(&sq, NULL, &sk, NULL, NULL, &si, 1, 0, 0, &opt, &few);
    TU_CHECK(s1 == SPATTN_STATUS_SUCCESS && s2 == SPATTN_STATUS_SUCCESS && many == few,
             "sfa fwd workspace: 1024 threads %zu bytes, %d threads %zu bytes", many, S, few);
}

/* fuzz_api_more (random-seed run, fortieth session): a packed varlen call with one query token
 * (T = 1, so its token stride is not bounded by the validated extent) and an empty last
 * sequence at t0 = T: the per-sequence view offset t0 * stride * bytes overflowed int64 (UBSan,
 * spattn_packed_view4 from the bsa varlen backward).  An empty sequence's view now keeps the
 * base; the results must equal those of the same call with contiguous rows, bitwise. */
static void fuzz_api_more_empty_seq_view_offset(void) {
    float q[8], k[6 * 8], v[6 * 8], o1[8], o2[8], l1[1], l2[1], dq1[8], dq2[8];
    float dk1[6 * 8], dk2[6 * 8], dv1[6 * 8], dv2[6 * 8], dout[8];
    for (int i = 0; i < 8; i++) q[i] = (float)(i % 5) / 5.0f, dout[i] = (float)(i % 3) / 3.0f;
    for (int i = 0; i < 48; i++) k[i] = (float)((i * 5) % 13) / 13.0f, v[i] = (float)(i % 9) / 9.0f;
    int32_t cuq[3] = {0, 1, 1}, cuk[3] = {0, 4, 6};  /* sequence 1: no queries, t0 = 1 = T */
    uint8_t mask[2] = {1, 1};
    const int64_t qs[3] = {1, 1, 8}, ks[3] = {6, 1, 8}, ms[4] = {2, 1, 1, 1}, cs[1] = {3}, ls[2] = {1, 1};
    const int64_t huge = (int64_t)1 << 62;  /* x 4 bytes: past INT64_MAX */
    const int64_t qst[3] = {huge, 8, 1}, lst[2] = {huge, 1};
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 3, ks, NULL);
    spattn_tensor tv = spattn_tensor_make(v, SPATTN_DTYPE_F32, 3, ks, NULL);
    spattn_tensor tm = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, ms, NULL);
    spattn_tensor tcq = spattn_tensor_make(cuq, SPATTN_DTYPE_I32, 1, cs, NULL);
    spattn_tensor tck = spattn_tensor_make(cuk, SPATTN_DTYPE_I32, 1, cs, NULL);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &tcq;
    vl.cu_seqlens_kv = &tck;
    vl.max_seqlen_q = 1;
    vl.max_seqlen_kv = 4;
    spattn_status st[4];
    for (int r = 0; r < 2; r++) {  /* 0: contiguous rows, 1: the huge token stride */
        const int64_t *qstr = r ? qst : NULL, *lstr = r ? lst : NULL;
        float *o = r ? o2 : o1, *l = r ? l2 : l1, *dq = r ? dq2 : dq1, *dk = r ? dk2 : dk1, *dv = r ? dv2 : dv1;
        spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 3, qs, qstr);
        spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 3, qs, qstr);
        spattn_tensor tl = spattn_tensor_make(l, SPATTN_DTYPE_F32, 2, ls, lstr);
        spattn_tensor tdo = spattn_tensor_make(dout, SPATTN_DTYPE_F32, 3, qs, qstr);
        spattn_tensor tdq = spattn_tensor_make(dq, SPATTN_DTYPE_F32, 3, qs, qstr);
        spattn_tensor tdk = spattn_tensor_make(dk, SPATTN_DTYPE_F32, 3, ks, NULL);
        spattn_tensor tdv = spattn_tensor_make(dv, SPATTN_DTYPE_F32, 3, ks, NULL);
        st[2 * r] = spattn_bsa_fwd_varlen(&tq, &tk, &tv, &tm, 8, 8, 0.0, &vl, &to, &tl, NULL);
        st[2 * r + 1] = spattn_bsa_bwd_varlen(&tq, &tk, &tv, &to, &tdo, &tl, &tm, 8, 8, 0.0, &vl, &tdq, &tdk,
                                             &tdv, NULL);
    }
    TU_CHECK(st[0] == SPATTN_STATUS_SUCCESS && st[1] == SPATTN_STATUS_SUCCESS, "contiguous rows: %d %d (%s)",
             st[0], st[1], spattn_last_error());
    TU_CHECK(st[2] == SPATTN_STATUS_SUCCESS && st[3] == SPATTN_STATUS_SUCCESS, "huge token stride: %d %d (%s)",
             st[2], st[3], spattn_last_error());
    TU_CHECK(!memcmp(o1, o2, sizeof o1) && !memcmp(l1, l2, sizeof l1) && !memcmp(dq1, dq2, sizeof dq1) &&
                 !memcmp(dk1, dk2, sizeof dk1) && !memcmp(dv1, dv2, sizeof dv1),
             "huge token stride: results differ from contiguous rows");
}

int main(void) {
    fuzz_api_more_sfa_workspace_overflow();
    fuzz_api_more_empty_seq_view_offset();
    fuzz_api_more_stride_extent_int64_max();
    fuzz_api_more_bsa_varlen_rows_int64();
    fuzz_api_more_thread_team();
    fuzz_api_stride_int64_min();
    fuzz_api_more_varlen_huge_block();
    fuzz_api_num_threads_limit();
    fuzz_api_tensor_make_stride_overflow();
    fuzz_api_options_deterministic_reserved();
    return tu_summary("test_fuzz_regressions");
}

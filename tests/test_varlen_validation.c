/*
 * Validation of the packed variable-length / paged entry points: every bad prefix sum, length,
 * block table, index value, shape, dtype and device is refused with its status and a message
 * naming the argument, before any output is written (outputs are compared byte for byte with
 * their poison after each refusal).  Also: the unused parts (rows past cu[B], unused table
 * slots) are never read, and CUDA tensors are refused as SPATTN_STATUS_NOT_SUPPORTED (or
 * BACKEND_UNAVAILABLE in a build without CUDA), the paged bsa backward included (refused on a GPU
 * for these fp32 shapes; the sfa forward and the packed and paged bsa forward, which run on a GPU,
 * only where no GPU is usable).
 */
#include "varlen_testkit.h"

enum { B = 3, N = 2, D = 8, BX = 4, BY = 4, PS = 4, MAXP = 3, NP = 8, K = 2 };

typedef struct fx {
    int32_t cuq[B + 1], cuk[B + 1], tab[B * MAXP];
    int64_t Tq, Tk, mq, mk;
    vt_buf q, k, v, m, kp, vp, idx;
    vt_buf o, lse, dq, dk, dv, o_sfa, lse_sfa, dq_sfa, dk_sfa, dkp_sfa, dkp, dvp;
    spattn_tensor cq, ck, tt;
    spattn_varlen vl;
} fx;

static void fx_init(fx *f, tu_rng *r) {
    memset(f, 0, sizeof *f);
    const int32_t lq[B] = {5, 0, 7}, lk[B] = {9, 3, 0};
    f->cuq[0] = f->cuk[0] = 0;
    for (int b = 0; b < B; b++) {
        f->cuq[b + 1] = f->cuq[b] + lq[b];
        f->cuk[b + 1] = f->cuk[b] + lk[b];
    }
    f->Tq = f->cuq[B] + 2; /* padding rows */
    f->Tk = f->cuk[B] + 1;
    f->mq = 8;
    f->mk = 10;
    int64_t sq[3] = {f->Tq, N, D}, sk[3] = {f->Tk, N, D};
    int64_t sm[4] = {B, N, (f->mq + BX - 1) / BX, (f->mk + BY - 1) / BY}, sp[4] = {NP, PS, N, D};
    f->q = vt_alloc(SPATTN_DTYPE_F32, 3, sq, 0);
    f->k = vt_alloc(SPATTN_DTYPE_F32, 3, sk, 0);
    f->v = vt_alloc(SPATTN_DTYPE_F32, 3, sk, 0);
    f->kp = vt_alloc(SPATTN_DTYPE_F32, 4, sp, 0);
    f->vp = vt_alloc(SPATTN_DTYPE_F32, 4, sp, 0);
    f->m = vt_alloc(SPATTN_DTYPE_U8, 4, sm, 0);
    memset(f->m.mem, 1, (size_t)f->m.nbytes);
    vt_randn(r, &f->q, NULL);
    vt_randn(r, &f->k, NULL);
    vt_randn(r, &f->v, NULL);
    vt_randn(r, &f->kp, NULL);
    vt_randn(r, &f->vp, NULL);
    int64_t si[3] = {f->Tq, N, K};
    f->idx = vt_alloc(SPATTN_DTYPE_I32, 3, si, 0);
    int32_t *ix = (int32_t *)f->idx.mem;
    for (int64_t i = 0; i < f->Tq * N * K; i++) ix[i] = 0;
    for (int64_t i = f->cuq[B] * N * K; i < f->Tq * N * K; i++) ix[i] = 999; /* past cu[B]: not read */
    for (int64_t i = f->cuq[2] * N * K; i < f->cuq[3] * N * K; i++) ix[i] = -1; /* sequence 2: no keys */
    /* table: sequence 0 needs 3 pages, 1 needs 1, 2 none; unused slots hold garbage */
    const int32_t tab[B * MAXP] = {5, 0, 7, 3, -7, 99, 1000, -1, 42};
    memcpy(f->tab, tab, sizeof tab);
    f->cq = spattn_tensor_make(f->cuq, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    f->ck = spattn_tensor_make(f->cuk, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    f->tt = spattn_tensor_make(f->tab, SPATTN_DTYPE_I32, 2, (int64_t[]){B, MAXP}, NULL);
    f->vl.cu_seqlens_q = &f->cq;
    f->vl.cu_seqlens_kv = &f->ck;
    f->vl.max_seqlen_q = f->mq;
    f->vl.max_seqlen_kv = f->mk;
    int64_t sl[2] = {f->Tq, N};
    f->o = vt_alloc(SPATTN_DTYPE_F32, 3, sq, 0);
    f->lse = vt_alloc(SPATTN_DTYPE_F32, 2, sl, 0);
    f->dq = vt_alloc(SPATTN_DTYPE_F32, 3, sq, 0);
    f->dk = vt_alloc(SPATTN_DTYPE_F32, 3, sk, 0);
    f->dv = vt_alloc(SPATTN_DTYPE_F32, 3, sk, 0);
    f->o_sfa = vt_alloc(SPATTN_DTYPE_F32, 3, sq, 0);
    f->lse_sfa = vt_alloc(SPATTN_DTYPE_F32, 2, sl, 0);
    f->dq_sfa = vt_alloc(SPATTN_DTYPE_F32, 3, sq, 0);
    f->dk_sfa = vt_alloc(SPATTN_DTYPE_F32, 3, sk, 0);
    f->dkp_sfa = vt_alloc(SPATTN_DTYPE_F32, 4, sp, 0);
    f->dkp = vt_alloc(SPATTN_DTYPE_F32, 4, sp, 0); /* paged bsa backward */
    f->dvp = vt_alloc(SPATTN_DTYPE_F32, 4, sp, 0);
}

static void fx_free(fx *f) {
    vt_buf *all[] = {&f->q, &f->k, &f->v, &f->m, &f->kp, &f->vp, &f->idx, &f->o, &f->lse, &f->dq,
                     &f->dk, &f->dv, &f->o_sfa, &f->lse_sfa, &f->dq_sfa, &f->dk_sfa, &f->dkp_sfa,
                     &f->dkp, &f->dvp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) vt_free(all[i]);
}

/* Runs the four operators (plus the paged forms) on the fixture; returns the statuses. */
enum { OP_BSA_FWD, OP_BSA_BWD, OP_BSA_FWD_PAGED, OP_SFA_FWD, OP_SFA_BWD, OP_SFA_FWD_PAGED, OP_SFA_BWD_PAGED,
       OP_BSA_BWD_PAGED, OP_N };
static const char *const op_name[OP_N] = {"bsa_fwd", "bsa_bwd", "bsa_fwd paged", "sfa_fwd",
                                          "sfa_bwd", "sfa_fwd paged", "sfa_bwd paged",
                                          "bsa_bwd paged"};

/* The softmax scale every op is called with (0 = the default); one check sets it to a value
 * beyond fp32. */
static double g_scale = 0.0;

static spattn_status run_op(fx *f, int op, const spattn_varlen *vl) {
    spattn_varlen pv = *vl;
    if (!pv.block_table) pv.block_table = &f->tt;
    switch (op) {
    case OP_BSA_FWD:
        return spattn_bsa_fwd_varlen(&f->q.t, &f->k.t, &f->v.t, &f->m.t, BX, BY, g_scale, vl, &f->o.t, &f->lse.t, NULL);
    case OP_BSA_BWD:
        return spattn_bsa_bwd_varlen(&f->q.t, &f->k.t, &f->v.t, &f->q.t, &f->q.t, &f->lse.t, &f->m.t, BX, BY,
                                     g_scale, vl, &f->dq.t, &f->dk.t, &f->dv.t, NULL);
    case OP_BSA_FWD_PAGED:
        return spattn_bsa_fwd_varlen(&f->q.t, &f->kp.t, &f->vp.t, &f->m.t, BX, BY, g_scale, &pv, &f->o.t,
                                     &f->lse.t, NULL);
    case OP_SFA_FWD:
        return spattn_sfa_fwd_varlen(&f->q.t, NULL, &f->k.t, NULL, NULL, &f->idx.t, 1, 3, g_scale, vl,
                                     &f->o_sfa.t, &f->lse_sfa.t, NULL);
    case OP_SFA_BWD:
        return spattn_sfa_bwd_varlen(&f->q.t, NULL, &f->k.t, NULL, NULL, &f->q.t, &f->q.t, &f->lse.t,
                                     &f->idx.t, 1, 3, g_scale, vl, &f->dq_sfa.t, NULL, &f->dk_sfa.t, NULL,
                                     NULL, NULL);
    case OP_BSA_BWD_PAGED:
        return spattn_bsa_bwd_varlen(&f->q.t, &f->kp.t, &f->vp.t, &f->q.t, &f->q.t, &f->lse.t, &f->m.t, BX,
                                     BY, g_scale, &pv, &f->dq.t, &f->dkp.t, &f->dvp.t, NULL);
    case OP_SFA_FWD_PAGED:
        return spattn_sfa_fwd_varlen(&f->q.t, NULL, &f->kp.t, NULL, &f->vp.t, &f->idx.t, 1, 0, g_scale,
                                     &pv, &f->o_sfa.t, &f->lse_sfa.t, NULL);
    default:
        return spattn_sfa_bwd_varlen(&f->q.t, NULL, &f->kp.t, NULL, NULL, &f->q.t, &f->q.t,
                                     &f->lse.t, &f->idx.t, 1, 0, g_scale, &pv, &f->dq_sfa.t, NULL,
                                     &f->dkp_sfa.t, NULL, NULL, NULL);
    }
}

/* The outputs an op writes, to check they are untouched after a refusal. */
static int outputs_poisoned(fx *f, int op) {
    vt_buf *o[3] = {NULL, NULL, NULL};
    switch (op) {
    case OP_BSA_FWD: case OP_BSA_FWD_PAGED: o[0] = &f->o; o[1] = &f->lse; break;
    case OP_BSA_BWD: o[0] = &f->dq; o[1] = &f->dk; o[2] = &f->dv; break;
    case OP_BSA_BWD_PAGED: o[0] = &f->dq; o[1] = &f->dkp; o[2] = &f->dvp; break;
    case OP_SFA_FWD: case OP_SFA_FWD_PAGED: o[0] = &f->o_sfa; o[1] = &f->lse_sfa; break;
    case OP_SFA_BWD: o[0] = &f->dq_sfa; o[1] = &f->dk_sfa; break;
    default: o[0] = &f->dq_sfa; o[1] = &f->dkp_sfa; break;
    }
    for (int i = 0; i < 3; i++)
        if (o[i])
            for (int64_t j = 0; j < o[i]->nbytes; j++)
                if (((unsigned char *)o[i]->mem)[j] != 0xA5) return 0;
    return 1;
}

/* Expects `want` from op after `mutate`, a message containing `needle`, outputs untouched. */
#define EXPECT(op, want, needle, mutate)                                                       \
    do {                                                                                       \
        fx f;                                                                                  \
        fx_init(&f, &r);                                                                       \
        spattn_varlen vl = f.vl;                                                               \
        mutate;                                                                                \
        spattn_status st = run_op(&f, op, &vl);                                                \
        const char *msg = spattn_last_error();                                                 \
        TU_CHECK(st == (want) && strstr(msg, needle) != NULL && outputs_poisoned(&f, op),      \
                 "%s [%s]: status %d (want %d), message '%s' (want '%s'), outputs %s",        \
                 op_name[op], #mutate, st, want, msg, needle,                                  \
                 outputs_poisoned(&f, op) ? "untouched" : "WRITTEN");                          \
        fx_free(&f);                                                                           \
    } while (0)

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(14));
    /* the fixture itself is valid for every op (unused slots / rows hold garbage) */
    for (int op = 0; op < OP_N; op++) {
        fx f;
        fx_init(&f, &r);
        spattn_status st = run_op(&f, op, &f.vl);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS,
                 "%s: valid fixture refused: %d %s", op_name[op], st, spattn_last_error());
        fx_free(&f);
    }
    for (int op = 0; op < OP_N; op++) {
        EXPECT(op, SPATTN_STATUS_NULL_POINTER, "cu_seqlens_q", vl.cu_seqlens_q = NULL);
        EXPECT(op, SPATTN_STATUS_BAD_DTYPE, "cu_seqlens_kv", f.ck.dtype = SPATTN_DTYPE_F32);
        EXPECT(op, SPATTN_STATUS_BAD_NDIM, "cu_seqlens_q", f.cq.ndim = 2; f.cq.shape[1] = 1; f.cq.strides[1] = 1);
        EXPECT(op, SPATTN_STATUS_BAD_SHAPE, "cu_seqlens_kv", f.ck.shape[0] = B);
        EXPECT(op, SPATTN_STATUS_INVALID_VALUE, "max_seqlen_q", vl.max_seqlen_q = 0);
        EXPECT(op, SPATTN_STATUS_INVALID_VALUE, "reserved", vl.reserved[2] = 1);
        EXPECT(op, SPATTN_STATUS_INVALID_VALUE, "scale", g_scale = 1e39); /* finite, not in fp32 */
        g_scale = 0.0;
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "[0] must be 0", f.cuq[0] = 1);
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "non-decreasing", f.cuq[2] = 4);
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "max_seqlen_kv", f.cuk[1] = 11; f.cuk[2] = 14; f.cuk[3] = 14);
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "exceeds", f.cuq[2] = 11; f.cuq[3] = 19);
        EXPECT(op, SPATTN_STATUS_BAD_NDIM, "q", f.q.t.ndim = 4);
    }
    /* ops on packed k only */
    int packed[4] = {OP_BSA_FWD, OP_BSA_BWD, OP_SFA_FWD, OP_SFA_BWD};
    for (int i = 0; i < 4; i++) {
        int op = packed[i];
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "exceeds the", f.cuk[3] = (int32_t)f.Tk + 1);
        EXPECT(op, SPATTN_STATUS_BAD_NDIM, "pages", vl.block_table = &f.tt);
    }
    /* paged forms */
    int paged[4] = {OP_BSA_FWD_PAGED, OP_SFA_FWD_PAGED, OP_SFA_BWD_PAGED, OP_BSA_BWD_PAGED};
    for (int i = 0; i < 4; i++) {
        int op = paged[i];
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "page id", f.tab[1] = NP);
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "page id", f.tab[3] = -1);
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "twice", f.tab[2] = 5);
        EXPECT(op, SPATTN_STATUS_BAD_INDEX, "max_pages", f.tt.shape[1] = 2);
        EXPECT(op, SPATTN_STATUS_BAD_SHAPE, "block_table", f.tt.shape[0] = B - 1);
        EXPECT(op, SPATTN_STATUS_BAD_DTYPE, "block_table", f.tt.dtype = SPATTN_DTYPE_F32);
        EXPECT(op, SPATTN_STATUS_BAD_NDIM, "block_table", f.tt.ndim = 1);
        EXPECT(op, SPATTN_STATUS_BAD_NDIM, "k", f.kp.t.ndim = 3);
    }
    /* bsa: the mask follows max_seqlen; lse is [Tq, N] */
    EXPECT(OP_BSA_FWD, SPATTN_STATUS_BAD_SHAPE, "block_mask", vl.max_seqlen_q = 9);
    EXPECT(OP_BSA_FWD, SPATTN_STATUS_BAD_SHAPE, "lse", f.lse.t.shape[0] = f.Tq - 1);
    /* sfa: indices are positions in the sequence's own keys (sequence 1 has 3 keys) */
    /* sfa: indices are positions in the sequence's own keys: 9 is valid for max_seqlen_kv =
     * 10 but not for sequence 0 (9 keys); sequence 2 has queries but no keys */
    EXPECT(OP_SFA_FWD, SPATTN_STATUS_BAD_INDEX, "sequence 0", ((int32_t *)f.idx.mem)[3] = 9);
    EXPECT(OP_SFA_BWD, SPATTN_STATUS_BAD_INDEX, "sequence 2",
           ((int32_t *)f.idx.mem)[(f.cuq[2] + 6) * N * K + 1] = 0);
    EXPECT(OP_SFA_FWD_PAGED, SPATTN_STATUS_BAD_INDEX, "sequence 1",
           ((int32_t *)f.idx.mem)[4 * N * K] = 3; f.cuq[1] = 4);
    EXPECT(OP_SFA_BWD, SPATTN_STATUS_BAD_INDEX, "indices", ((int32_t *)f.idx.mem)[1] = -2);
    EXPECT(OP_SFA_BWD_PAGED, SPATTN_STATUS_BAD_NDIM, "dk", f.dkp_sfa.t.ndim = 3);
    /* paged bsa backward: dk / dv are pages shaped as k, and outputs */
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_BAD_NDIM, "dk", f.dkp.t.ndim = 3);
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_BAD_SHAPE, "dv: dimension 1 (page_size)", f.dvp.t.shape[1] = PS - 1);
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_BAD_SHAPE, "dk: dimension 0 (num_pages)", f.dkp.t.shape[0] = NP - 1);
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_BAD_DTYPE, "dv", f.dvp.t.dtype = SPATTN_DTYPE_F16);
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_ALIASING, "dk", f.dkp.t.data = f.kp.mem);
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_ALIASING, "dv", f.dvp.t.data = f.tab);
    EXPECT(OP_BSA_BWD_PAGED, SPATTN_STATUS_BAD_NDIM, "v", f.vp.t.ndim = 3);
    /* CUDA tensors: not supported (or no CUDA in this build) before anything is read.  The sfa
     * forward runs on the GPU (it would read these host buffers there): only without a usable
     * CUDA backend, where it must be refused as well (tests/cuda/sfa_varlen_cuda_check.cu checks
     * it on a GPU).  The sfa backward runs on the GPU for the Hopper kernels' shapes only (D 512,
     * Dr 64): with D = 8 here it is refused there too, before anything is read. */
    for (int op = 0; op < OP_N; op++) {
        /* the packed and paged bsa forward run on CUDA too (the paged one on the reference kernel
         * for these fp32 pages of 4 rows): checked on the GPU by tests/cuda/bsa_varlen_cuda_check.cu */
        if ((op == OP_SFA_FWD || op == OP_SFA_FWD_PAGED || op == OP_BSA_FWD || op == OP_BSA_FWD_PAGED) &&
            spattn_cuda_available())
            continue;
        fx f;
        fx_init(&f, &r);
        spattn_tensor *ts[] = {&f.q.t, &f.k.t, &f.v.t, &f.m.t, &f.kp.t, &f.vp.t, &f.idx.t, &f.o.t,
                               &f.lse.t, &f.dq.t, &f.dk.t, &f.dv.t, &f.o_sfa.t, &f.lse_sfa.t,
                               &f.dq_sfa.t, &f.dk_sfa.t, &f.dkp_sfa.t, &f.dkp.t, &f.dvp.t, &f.cq,
                               &f.ck, &f.tt};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) ts[i]->device_type = SPATTN_DEVICE_CUDA;
        spattn_status st = run_op(&f, op, &f.vl);
        TU_CHECK((st == SPATTN_STATUS_NOT_SUPPORTED || st == SPATTN_STATUS_BACKEND_UNAVAILABLE) &&
                     outputs_poisoned(&f, op),
                 "%s on cuda tensors: status %d (%s)", op_name[op], st, spattn_last_error());
        fx_free(&f);
    }
    /* workspace queries */
    {
        fx f;
        fx_init(&f, &r);
        size_t a = 0, b = 0;
        TU_CHECK(spattn_bsa_varlen_workspace_size(&f.q.t, &f.k.t, &f.v.t, &f.m.t, BX, BY, &f.vl, 1, NULL, &a) == 0 &&
                     spattn_sfa_varlen_workspace_size(&f.q.t, NULL, &f.k.t, NULL, NULL, &f.idx.t, 1, 3, &f.vl, 1, NULL, &b) == 0 &&
                     a > 0 && b > 0,
                 "workspace queries: %s", spattn_last_error());
        /* exact-size caller workspace is accepted, one byte less refused */
        spattn_options opt;
        spattn_options_init(&opt);
        opt.num_threads = 1;
        spattn_bsa_varlen_workspace_size(&f.q.t, &f.k.t, &f.v.t, &f.m.t, BX, BY, &f.vl, 0, &opt, &a);
        void *ws = malloc(a);
        opt.workspace = ws;
        opt.workspace_size = a - 1;
        spattn_status st = spattn_bsa_fwd_varlen(&f.q.t, &f.k.t, &f.v.t, &f.m.t, BX, BY, 0.0, &f.vl, &f.o.t, &f.lse.t, &opt);
        TU_CHECK(st == SPATTN_STATUS_WORKSPACE_TOO_SMALL, "bsa: workspace one byte short: %d", st);
        opt.workspace_size = a;
        st = spattn_bsa_fwd_varlen(&f.q.t, &f.k.t, &f.v.t, &f.m.t, BX, BY, 0.0, &f.vl, &f.o.t, &f.lse.t, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa: exact workspace: %s", spattn_last_error());
        free(ws);
        spattn_sfa_varlen_workspace_size(&f.q.t, NULL, &f.k.t, NULL, NULL, &f.idx.t, 1, 3, &f.vl, 1, &opt, &b);
        ws = malloc(b);
        opt.workspace = ws;
        opt.workspace_size = b;
        st = spattn_sfa_bwd_varlen(&f.q.t, NULL, &f.k.t, NULL, NULL, &f.q.t, &f.q.t, &f.lse.t, &f.idx.t, 1, 3,
                                   0.0, &f.vl, &f.dq_sfa.t, NULL, &f.dk_sfa.t, NULL, NULL, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa: exact workspace: %s", spattn_last_error());
        free(ws);
        fx_free(&f);
    }
    return tu_summary("test_varlen_validation");
}

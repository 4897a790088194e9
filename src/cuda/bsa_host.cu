// Host side of the block-sparse attention CUDA backend: shapes, workspace carving, launches.
// Packed variable-length calls (sections at the end): the forward (Hopper forward or the
// reference kernel) and the backward (Hopper backward only; other shapes NOT_SUPPORTED).
// The host never reads the mask or any tensor data; schedules are built on the device
// (bsa_sched.cu).  Fast path (Hopper forward bsa_fwd.cu, backward bsa_bwd.cu): fp16 / bf16
// with D <= 128 (padded to 64 or 128) and views the TMA engine can read.  Other cases (fp32
// tensors, 128 < D <= 256, other strides) run the simple reference kernels (bsa_ref.cu) into
// fp32 scratch and convert: correct, not fast.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
extern "C" {
#include "../core/seqs.h"
}
#include "bsa_launch.h"
#include "convert.cuh"
#include "scratch.h"
#include "bsa_plan.h"
#include "verdict.h"

namespace {

constexpr size_t kAlign = 256;
size_t up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
// Offsets of n consecutive pieces of sz[i] bytes, each kAlign-aligned; returns the end.
size_t place(const size_t *sz, int n, size_t *off) {
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        off[i] = o;
        o += up(sz[i]);
    }
    return o;
}

bool fast_path(const spattn_bsa_problem *p) {
    return (p->dtype == SPATTN_DTYPE_F16 || p->dtype == SPATTN_DTYPE_BF16) && bsa_dpad(p->D) != 0;
}

// The TMA copy engine reads a [B, H, S, D] view when D is contiguous, the base is 16-byte aligned
// and every other stride (of a dimension longer than 1) is a positive multiple of 16 bytes.
bool tma_view_ok(const spattn_tensor *t) {
    if ((uintptr_t)t->data % 16 != 0 || t->strides[3] != 1) return false;
    for (int i = 0; i < 3; i++)
        if (t->shape[i] > 1 && (t->strides[i] <= 0 || t->strides[i] % 8 != 0 || t->strides[i] >= (1ll << 39)))
            return false;
    return t->shape[2] <= 1 || t->strides[2] >= t->shape[3];
}
// The Hopper forward runs when the fast path applies and Q, K, V can be read by TMA; other
// layouts take the simple kernels (correct, not fast).
bool fwd_fast(const spattn_bsa_problem *p) {
    return fast_path(p) && tma_view_ok(p->q) && tma_view_ok(p->k) && tma_view_ok(p->v);
}
// The Hopper backward (bsa_bwd.cu) reads Q, dO, K, V by TMA.  Workspace queries carry no dO:
// `with_dout` = 0 asks whether it would run with a dO of TMA layout.
bool bwd90(const spattn_bsa_problem *p, bool with_dout = true) {
    return fwd_fast(p) && (with_dout ? p->dout && tma_view_ok(p->dout) : true);
}

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
encode_fn tensor_map_encoder() {
    static encode_fn fn = nullptr;
    if (!fn) {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = reinterpret_cast<encode_fn>(f);
        else
            cudaGetLastError();
    }
    return fn;
}
// 4-d map over [B, H, S, D] (innermost first: D, S, H, B) with boxes of 64 columns x `rows`
// rows and the 128-byte swizzle the wgmma descriptors expect; out-of-range elements read as 0.
// rows_dim: the map dimension (innermost first) the box's rows run along: 1 for [B, H, S, D];
// 2 for pages [num_pages, page_size, Nkv, D] (map (D, Nkv, page_size, num_pages), boxes of 64
// columns x 1 head x `rows` rows x 1 page: the same R * 128 bytes in shared memory).
bool make_tmap(CUtensorMap *m, const spattn_tensor *t, int rows, int rows_dim = 1) {
    encode_fn enc = tensor_map_encoder();
    if (!enc) return false;
    const cuuint64_t dims[4] = {(cuuint64_t)t->shape[3], (cuuint64_t)t->shape[2], (cuuint64_t)t->shape[1],
                                (cuuint64_t)t->shape[0]};
    cuuint64_t str[3];
    long long prev = t->shape[3];  // a dimension of length 1 gets any valid stride: it is never stepped
    for (int i = 0; i < 3; i++) {
        const int d = 2 - i;
        long long sv = t->shape[d] > 1 ? t->strides[d] : (prev + 7) / 8 * 8;
        str[i] = (cuuint64_t)sv * 2;
        prev = sv * t->shape[d];
    }
    cuuint32_t box[4] = {64, 1, 1, 1};
    const cuuint32_t es[4] = {1, 1, 1, 1};
    box[rows_dim] = (cuuint32_t)rows;
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, t->data, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Schedules of the call's plan (NULL when none, or when built for other tile sizes).
const bsa_plan_cuda *plan_of(const spattn_bsa_problem *p) {
    return p->plan ? static_cast<const bsa_plan_cuda *>(p->plan->cuda) : nullptr;
}
const bsa_sched *plan_fwd(const spattn_bsa_problem *p) {
    const bsa_plan_cuda *c = plan_of(p);
    const bsa_fwd90_tile t = bsa_fwd90_tile_for(bsa_dpad(p->D));
    return c && c->fwd_bm == t.bm && c->fwd_bn == bsa_fwd90_chunk(p->by) ? &c->fwd : nullptr;
}
// The Hopper backward's lists (64 x 128 tiles) from a plan, or NULL.
const bsa_sched *plan_q90(const spattn_bsa_problem *p) {
    const bsa_plan_cuda *c = plan_of(p);
    return c && c->dq_cfg == BSA_PLAN_DQ_BWD90 ? &c->dq : nullptr;
}
const bsa_sched *plan_k90(const spattn_bsa_problem *p) {
    const bsa_plan_cuda *c = plan_of(p);
    return c && c->kv_bm == 64 && c->kv_bn == 128 ? &c->kv : nullptr;
}
const int *plan_kslot(const spattn_bsa_problem *p) { return plan_k90(p) ? plan_of(p)->kv_slot : nullptr; }

// Workspace layout: offsets of each piece and the total (exact bytes).
struct Layout {
    size_t off[10];
    size_t total;
};

// kind: 0 forward, 1 Hopper backward, 2 simple backward.
Layout layout(const spattn_bsa_problem *p, int kind) {
    Layout L = {};
    const int backward = kind != 0;
    const size_t rows = (size_t)p->B * p->N * p->Sq;
    size_t sz[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (kind == 1) {  // Hopper backward: tiles of 64 query rows x 128 keys
        const int dp = bsa_dpad(p->D);
        const size_t nqt = (size_t)((p->Sq + 63) / 64), nkt = (size_t)((p->Skv + 127) / 128);
        const size_t nq = (size_t)p->B * p->N * nqt, kr = (size_t)p->B * p->Nkv * nkt;
        sz[0] = rows * 4;                              // delta
        sz[1] = rows * 4;                              // lse2
        if (!plan_q90(p)) {
            sz[2] = nq * 4;                                // q-major counts (ranks of the dQ order)
            sz[3] = nq * nkt * 4;                          // q-major lists
        }
        if (!plan_k90(p)) {
            sz[4] = kr * 4;                                // key-major counts
            sz[5] = kr * (size_t)(p->N / p->Nkv) * nqt * 4;  // key-major lists
        }
        sz[6] = nq * 64 * (size_t)dp * 4;              // dQ accumulator (fp32)
        sz[7] = (size_t)bsa_bwd90_sem_bytes((long long)nq, (long long)kr);  // semaphores, split slots, landed counts
        sz[8] = (size_t)bsa_bwd90_kvbuf_bytes(p->N / p->Nkv, (long long)nqt, (long long)kr, dp);  // split rows' dK / dV
        if (!plan_k90(p)) sz[9] = kr * 4;  // key-major launch order (non-deterministic mode)
    } else if (backward || !fwd_fast(p)) {  // the simple kernels (and a conversion)
        if (!backward) {
            sz[0] = rows * p->D * 4;  // o fp32
            sz[1] = rows * 4;         // lse fp32
        } else {
            const size_t kv = (size_t)p->B * p->Nkv * p->Skv * p->D;
            sz[0] = rows * p->D * 4;  // dq
            sz[1] = kv * 4;           // dk
            sz[2] = kv * 4;           // dv
        }
    } else {  // Hopper forward
        const bsa_fwd90_tile t = bsa_fwd90_tile_for(bsa_dpad(p->D));
        const int u = bsa_fwd90_chunk(p->by);
        const size_t nq = (size_t)p->B * p->N * ((p->Sq + t.bm - 1) / t.bm);
        const size_t nk = (size_t)((p->Skv + u - 1) / u);
        if (!plan_fwd(p)) {
            sz[0] = nq * 4;
            sz[1] = nq * nk * 8;  // int2 entries
            sz[2] = nq * 4;       // launch order
        }
        sz[3] = 8;  // the persistent CTAs' row counter (bsa_fwd.cu)
    }
    L.total = place(sz, 10, L.off);
    return L;
}

bsa_view view(const spattn_tensor *t) {
    bsa_view v;
    v.p = t->data;
    v.s0 = t->strides[0];
    v.s1 = t->strides[1];
    v.s2 = t->strides[2];
    v.s3 = t->strides[3];
    v.vec = v.s3 == 1 && v.s2 % 8 == 0 && v.s1 % 8 == 0 && v.s0 % 8 == 0 && ((uintptr_t)t->data % 16) == 0;
    return v;
}

bsa_params params(const spattn_bsa_problem *pb) {
    bsa_params p = {};
    p.q = view(pb->q);
    p.k = view(pb->k);
    p.v = view(pb->v);
    if (pb->o) p.o = view(pb->o);
    if (pb->dout) p.dout = view(pb->dout);
    if (pb->dq) p.dq = view(pb->dq);
    if (pb->dk) p.dk = view(pb->dk);
    if (pb->dv) p.dv = view(pb->dv);
    p.mask.p = static_cast<const uint8_t *>(pb->mask->data);
    p.mask.s0 = pb->mask->strides[0];
    p.mask.s1 = pb->mask->strides[1];
    p.mask.s2 = pb->mask->strides[2];
    p.mask.s3 = pb->mask->strides[3];
    if (pb->lse) {
        p.lse = static_cast<float *>(pb->lse->data);
        p.lse_s0 = pb->lse->strides[0];
        p.lse_s1 = pb->lse->strides[1];
        p.lse_s2 = pb->lse->strides[2];
    }
    p.B = (int)pb->B;
    p.N = (int)pb->N;
    p.Nkv = (int)pb->Nkv;
    p.G = (int)(pb->N / pb->Nkv);
    p.Sq = (int)pb->Sq;
    p.Skv = (int)pb->Skv;
    p.D = (int)pb->D;
    p.bx = (int)(pb->bx < pb->Sq ? pb->bx : pb->Sq);  // a block wider than S covers it all
    p.by = (int)(pb->by < pb->Skv ? pb->by : pb->Skv);
    p.nbx = (int)pb->nbx;
    p.nby = (int)pb->nby;
    p.scale = pb->scale;
    p.scale_log2 = pb->scale * 1.4426950408889634f;
    p.inv_bx = 1.0f / (float)p.bx;
    p.inv_by = 1.0f / (float)p.by;
    return p;
}

spattn_status fail(cudaError_t e, const char *what) {
    return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "bsa cuda: %s: %s", what, cudaGetErrorString(e));
}


}  // namespace

extern "C" size_t spattn_cuda_bsa_workspace(const spattn_bsa_problem *p, int backward) {
    if (!backward) return layout(p, 0).total;
    if (p->dout) return layout(p, bwd90(p) ? 1 : 2).total;
    // no dO given: enough for either backward (dO's layout decides which one runs)
    const size_t a = bwd90(p, false) ? layout(p, 1).total : 0, b = layout(p, 2).total;
    return a > b ? a : b;
}

extern "C" spattn_status spattn_cuda_bsa_fwd(const spattn_bsa_problem *pb, const spattn_exec *ex) {
    const Layout L = layout(pb, 0);
    cuda_scratch ws;
    spattn_status s = ws.get(ex, L.total, "bsa cuda");
    if (s != SPATTN_STATUS_SUCCESS) return s;
    cudaStream_t st = ws.st;
    cudaError_t e;
    if (!fwd_fast(pb)) {  // fp32, D > 128 or no TMA layout: the simple kernels, then a conversion
        float *o32 = reinterpret_cast<float *>(ws.base + L.off[0]), *l32 = reinterpret_cast<float *>(ws.base + L.off[1]);
        s = spattn_cuda_ref_bsa_fwd(pb, ex, o32, l32);
        if (s != SPATTN_STATUS_SUCCESS) return s;
        if ((e = cvt::to_tensor(o32, pb->o, st)) != cudaSuccess) return fail(e, "convert o");
        if (pb->lse && (e = cvt::to_tensor3(l32, pb->lse, st)) != cudaSuccess) return fail(e, "copy lse");
        return SPATTN_STATUS_SUCCESS;
    }
    const int dp = bsa_dpad(pb->D), bf16 = pb->dtype == SPATTN_DTYPE_BF16;
    bsa_params p = params(pb);
    const bsa_fwd90_tile t = bsa_fwd90_tile_for(dp);
    const int u = bsa_fwd90_chunk(pb->by);
    if (pb->B * pb->N * ((pb->Sq + t.bm - 1) / t.bm) > 0x7fffffffll)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cuda: B * N * ceil(Sq / %d) must be < 2^31", t.bm);
    bsa_tmaps tm;
    if (!make_tmap(&tm.q, pb->q, t.bm) || !make_tmap(&tm.k, pb->k, u) || !make_tmap(&tm.v, pb->v, u))
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "bsa cuda: cuTensorMapEncodeTiled failed for q, k or v");
    // O by TMA stores where the engine can write the view (else the kernel stores per element)
    tm.o_tma = p.o.vec && make_tmap(&tm.o, pb->o, 64);
    // the persistent CTAs' row counter, 0 at launch: the plan's own when no other stream may be
    // using it (the kernel sets it back to 0), else the workspace's, zeroed by the order kernel of
    // a plan-less call or by a memset (~1% of the suite's time when measured in place of the plan's)
    int *ctr = reinterpret_cast<int *>(ws.base + L.off[3]);
    const bsa_plan_cuda *pc = nullptr;
    if (const bsa_sched *ps = plan_fwd(pb)) {
        p.sq = *ps;
        if (int *c = bsa_plan_fwd_ctr_acquire(plan_of(pb), st)) {
            pc = plan_of(pb);
            ctr = c;
        } else if ((e = cudaMemsetAsync(ctr, 0, 2 * sizeof(int), st)) != cudaSuccess) {
            return fail(e, "row counter");
        }
    } else {
        int *cnt = reinterpret_cast<int *>(ws.base + L.off[0]), *list = reinterpret_cast<int *>(ws.base + L.off[1]);
        int *order = reinterpret_cast<int *>(ws.base + L.off[2]);
        const long long rows = (long long)p.B * p.N * ((p.Sq + t.bm - 1) / t.bm);
        if ((e = spattn_bsa_launch_sched_fwd(&p, t.bm, u, cnt, reinterpret_cast<int2 *>(list), st)) != cudaSuccess)
            return fail(e, "schedule");
        if ((e = spattn_bsa_launch_order(cnt, rows, 128 / u, order, ctr, st)) != cudaSuccess) return fail(e, "order");
        p.sq.cnt = cnt;
        p.sq.list = list;
        p.sq.stride = (p.Skv + u - 1) / u;
        p.sq.order = order;
    }
    e = spattn_bsa_launch_fwd(&p, &tm, dp, bf16, u, ctr, pc != nullptr, st);
    if (pc) bsa_plan_fwd_ctr_release(pc, st, e == cudaSuccess);
    if (e != cudaSuccess) return fail(e, "forward kernel");
    return SPATTN_STATUS_SUCCESS;
}

// Hopper backward: Delta / lse2, the two schedules at 64 x 128 tiles (from the plan when there
// is one), one kernel for dK, dV, dQ (accumulator + postprocess).
static spattn_status bwd90_run(const spattn_bsa_problem *pb, const spattn_exec *ex, const Layout &L, cuda_scratch &ws) {
    cudaStream_t st = ws.st;
    cudaError_t e;
    const int dp = bsa_dpad(pb->D), bf16 = pb->dtype == SPATTN_DTYPE_BF16;
    bsa_params p = params(pb);
    float *delta = reinterpret_cast<float *>(ws.base + L.off[0]), *lse2 = reinterpret_cast<float *>(ws.base + L.off[1]);
    int *qcnt = reinterpret_cast<int *>(ws.base + L.off[2]), *qlist = reinterpret_cast<int *>(ws.base + L.off[3]);
    int *kcnt = reinterpret_cast<int *>(ws.base + L.off[4]), *klist = reinterpret_cast<int *>(ws.base + L.off[5]);
    float *acc = reinterpret_cast<float *>(ws.base + L.off[6]);
    int *sem = reinterpret_cast<int *>(ws.base + L.off[7]);
    float *kvbuf = reinterpret_cast<float *>(ws.base + L.off[8]);  // used only when lists are split
    // zeroed by the Delta kernel: the semaphores only; the first add of each query tile is a store
    // (deterministic: rank 0; non-deterministic: the first claimant), so the dQ accumulator needs none
    void *z0 = sem;
    const size_t zn = (spattn_bsa_bwd90_sem_bytes(&p, dp) + 15) & ~(size_t)15;  // slot padding
    p.lse2 = lse2;
    p.delta = delta;
    p.nqt = (p.Sq + 63) / 64;
    // Launch order: the schedules (no plan) first, then the Delta kernel right before the backward
    // kernel, which may start before Delta ends (programmatic dependent launch): it reads the
    // lists before its griddepcontrol.wait, Delta's outputs and the zeroed memory after it.
    if (const bsa_sched *ps = plan_q90(pb)) {
        p.sq = *ps;
    } else {
        if ((e = spattn_bsa_launch_sched_q(&p, 64, 128, qcnt, qlist, st)) != cudaSuccess) return fail(e, "schedule");
        p.sq.cnt = qcnt;
        p.sq.list = qlist;
        p.sq.stride = (p.Skv + 127) / 128;
    }
    if (const bsa_sched *ps = plan_k90(pb)) {
        p.sk = *ps;
    } else {
        if ((e = spattn_bsa_launch_sched_k(&p, 64, 128, kcnt, klist, st)) != cudaSuccess) return fail(e, "schedule");
        p.sk.cnt = kcnt;
        p.sk.list = klist;
        p.sk.stride = p.G * p.nqt;
        p.sk.order = nullptr;
        // heaviest key-major rows first (the deterministic mode launches in its dQ order instead;
        // measured on the H200: non-deterministic backward 0.921x the time, causal 0.75-0.82x)
        if (!ex->deterministic) {
            int *korder = reinterpret_cast<int *>(ws.base + L.off[9]);
            const long long kr = (long long)p.B * p.Nkv * ((p.Skv + 127) / 128);
            if ((e = spattn_bsa_launch_order(kcnt, kr, 1, korder, nullptr, st)) != cudaSuccess) return fail(e, "order");
            p.sk.order = korder;
        }
    }
    bsa_bwd_tmaps tm;
    if (!make_tmap(&tm.q, pb->q, 64) || !make_tmap(&tm.dout, pb->dout, 64) || !make_tmap(&tm.k, pb->k, 128) ||
        !make_tmap(&tm.v, pb->v, 128))
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "bsa cuda: cuTensorMapEncodeTiled failed for q, dout, k or v");
    // dK / dV by TMA stores where the engine can write both views (else per-element stores)
    tm.kv_tma = view(pb->dk).vec && view(pb->dv).vec && make_tmap(&tm.dk, pb->dk, 64) && make_tmap(&tm.dv, pb->dv, 64);
    if ((e = spattn_bsa_launch_delta(&p, bf16, delta, lse2, z0, zn, st)) != cudaSuccess) return fail(e, "delta kernel");
    if ((e = spattn_bsa_launch_bwd90(&p, &tm, dp, bf16, acc, sem, plan_kslot(pb), kvbuf, ex->deterministic != 0, st)) !=
        cudaSuccess)
        return fail(e, "backward kernel");
    return SPATTN_STATUS_SUCCESS;
}

extern "C" spattn_status spattn_cuda_bsa_bwd(const spattn_bsa_problem *pb, const spattn_exec *ex) {
    const Layout L = layout(pb, bwd90(pb) ? 1 : 2);
    cuda_scratch ws;
    spattn_status s = ws.get(ex, L.total, "bsa cuda");
    if (s != SPATTN_STATUS_SUCCESS) return s;
    cudaStream_t st = ws.st;
    cudaError_t e;
    if (bwd90(pb)) return bwd90_run(pb, ex, L, ws);
    // fp32, D > 128 or no TMA layout: the simple kernels (deterministic), then a conversion
    float *dq = reinterpret_cast<float *>(ws.base + L.off[0]), *dk = reinterpret_cast<float *>(ws.base + L.off[1]),
          *dv = reinterpret_cast<float *>(ws.base + L.off[2]);
    s = spattn_cuda_ref_bsa_bwd(pb, ex, dq, dk, dv);
    if (s != SPATTN_STATUS_SUCCESS) return s;
    if ((e = cvt::to_tensor(dq, pb->dq, st)) != cudaSuccess) return fail(e, "convert dq");
    if ((e = cvt::to_tensor(dk, pb->dk, st)) != cudaSuccess) return fail(e, "convert dk");
    if ((e = cvt::to_tensor(dv, pb->dv, st)) != cudaSuccess) return fail(e, "convert dv");
    return SPATTN_STATUS_SUCCESS;
}

// ---- packed variable-length forward (spattn_bsa_fwd_varlen) -------------------------------------
// The packed tensors are viewed as one batch [1, H, T, D] (batch stride 0; LSE [1, N, T]); the
// lengths stay on the device: a prep kernel checks the prefix sums and writes a sequence table
// and per-sequence TMA maps, the schedule and the forward kernel read them (bsa_sched.cu,
// bsa_fwd.cu, VL instantiations), one synchronisation at the end reports bad prefix sums.  Shapes
// without a Hopper forward (fp32, D > 128, views TMA cannot read) run the reference kernel
// (bsa_ref.cu) per (sequence, head, row), straight into o / lse.
// Paged K / V (vl.block_table): the same kernels (PG instantiations of the Hopper forward: K / V
// per page through maps over the page pool, bsa_fwd.cu), the block table checked on the device
// into the same word (bsa_vl_table_kernel) and reported with the CPU's message; page sizes that
// are not a multiple of 8 (and fp32 / D > 128 / pages TMA cannot read) take the reference kernel,
// which reads key rows through the table.
namespace {

// [T, H, D] as [1, H, T, D] (batch stride 0).
spattn_tensor packed4(const spattn_tensor *t) {
    spattn_tensor v = *t;
    v.ndim = 4;
    v.shape[0] = 1;
    v.strides[0] = 0;
    v.shape[1] = t->shape[1];
    v.strides[1] = t->strides[1];
    v.shape[2] = t->shape[0];
    v.strides[2] = t->strides[0];
    v.shape[3] = t->shape[2];
    v.strides[3] = t->strides[2];
    return v;
}
// LSE [T, N] as [1, N, T].
spattn_tensor packed3(const spattn_tensor *t) {
    spattn_tensor v = *t;
    v.ndim = 3;
    v.shape[0] = 1;
    v.strides[0] = 0;
    v.shape[1] = t->shape[1];
    v.strides[1] = t->strides[1];
    v.shape[2] = t->shape[0];
    v.strides[2] = t->strides[0];
    return v;
}

// The varlen problem as the dense kernels see it: 4-d views, B sequences of max_seqlen rows
// (paged k / v stay the page tensors [num_pages, page_size, Nkv, D]).
struct VlViews {
    spattn_tensor q, k, v, o, lse, dout, dq, dk, dv;
    spattn_bsa_problem p;
};
void vl_views(const spattn_bsa_problem *pb, VlViews *w) {
    const bool paged = pb->seqs->table != nullptr;
    w->q = packed4(pb->q);
    w->k = paged ? *pb->k : packed4(pb->k);
    w->v = paged ? *pb->v : packed4(pb->v);
    w->p = *pb;
    w->p.q = &w->q;
    w->p.k = &w->k;
    w->p.v = &w->v;
    w->p.plan = nullptr;
    if (pb->o) {
        w->o = packed4(pb->o);
        w->p.o = &w->o;
    }
    if (pb->lse) {
        w->lse = packed3(pb->lse);
        w->p.lse = &w->lse;
    }
    const spattn_tensor *const src[4] = {pb->dout, pb->dq, pb->dk, pb->dv};
    spattn_tensor *const dst[4] = {&w->dout, &w->dq, &w->dk, &w->dv};
    const spattn_tensor **const to[4] = {&w->p.dout, &w->p.dq, &w->p.dk, &w->p.dv};
    for (int i = 0; i < 4; i++)
        if (src[i]) {
            *dst[i] = paged && i >= 2 ? *src[i] : packed4(src[i]);  // paged dk / dv: the pages
            *to[i] = dst[i];
        }
}

// The varlen forward's Hopper kernel: the dense conditions on the views; paged K / V besides need
// a page size that is a multiple of 8 (slabs of whole 8-row swizzle atoms, bsa_fwd.cu); the page
// tensors themselves must be TMA-readable (tma_view_ok on [num_pages, page_size, Nkv, D]).
bool vl_fast(const spattn_bsa_problem *vp) {
    return fwd_fast(vp) && (!vp->seqs->table || vp->seqs->page_size % 8 == 0);
}
// Paged forward: log2 of the slab rows R, the largest power of two dividing both the chunk u
// and page_size (8 <= R <= u when page_size % 8 == 0).
int vl_slab_log2(int u, long long page_size) {
    const long long low = page_size & -page_size;
    const long long r = low < u ? low : u;
    int lr = 0;
    while ((1ll << lr) < r) lr++;
    return lr;
}

// Workspace: [0] the check word, [1] the sequence table, [2] the TMA maps, [3] schedule counts,
// [4] lists, [5] launch order, [6] row counter (2-6: Hopper forward only); + 256 bytes to align
// a caller's base.
struct VlLayout {
    size_t off[7];
    size_t total;
};
// (Paged: the same; the 3 maps per sequence are q and the last-page maps of k and v.)
VlLayout vl_layout(const spattn_bsa_problem *vp, bool fast) {
    VlLayout L = {};
    size_t sz[7] = {8, (size_t)vp->B * 16, 0, 0, 0, 0, 0};
    if (fast) {
        const bsa_fwd90_tile t = bsa_fwd90_tile_for(bsa_dpad(vp->D));
        const int u = bsa_fwd90_chunk(vp->by);
        const size_t rows = (size_t)vp->B * vp->N * ((vp->Sq + t.bm - 1) / t.bm);
        sz[2] = (size_t)vp->B * 4 * sizeof(CUtensorMap);  // q, k, v and (when TMA can write it) o
        sz[3] = rows * 4;
        sz[4] = rows * (size_t)((vp->Skv + u - 1) / u) * 8;
        sz[5] = rows * 4;
        sz[6] = 8;
    }
    L.total = place(sz, 7, L.off) + kAlign;
    return L;
}

// Status of the prefix-sum check: the CPU's message for the first violation (bsa_vl_prep_kernel
// encodes it; the offending values are read back only then).
spattn_status vl_report_table(const spattn_seqs *s, unsigned long long key, cudaStream_t st);
spattn_status vl_report(const spattn_bsa_problem *pb, unsigned long long key, cudaStream_t st) {
    if (key == ~0ull) return SPATTN_STATUS_SUCCESS;
    const spattn_seqs *s = pb->seqs;
    if (key >= BSA_VL_TAB_KEY) return vl_report_table(s, key, st);
    const long long P = s->B + 2, x = (long long)(key >> 2), pos = x % P;
    const int side = (int)(x / P), kind = (int)(key & 3);
    const int32_t *cu = side ? s->cu_kv : s->cu_q;
    const long long cst = side ? s->cu_kv_st : s->cu_q_st;
    const char *name = side ? "cu_seqlens_kv" : "cu_seqlens_q";
    const long long i0 = kind == 0 ? 0 : kind == 3 ? s->B : pos - 1;
    int32_t v[2] = {0, 0};
    cudaError_t e = cudaMemcpyAsync(&v[0], cu + i0 * cst, 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess && (kind == 1 || kind == 2))
        e = cudaMemcpyAsync(&v[1], cu + (i0 + 1) * cst, 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) return fail(e, "reading back a bad prefix sum");
    switch (kind) {
    case 0:
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: [0] must be 0, got %d", name, v[0]);
    case 1:
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                "%s: prefix sums must be non-decreasing, got [%lld] = %lld > [%lld] = %lld", name,
                                i0, (long long)v[0], i0 + 1, (long long)v[1]);
    case 2:
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: sequence %lld has length %lld > %s = %lld", name, i0,
                                (long long)v[1] - v[0], side ? "max_seqlen_kv" : "max_seqlen_q",
                                (long long)(side ? s->max_kv : s->max_q));
    default:
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: [B] = %lld exceeds the %lld tokens of %s", name,
                                (long long)v[0], (long long)(side ? s->Tkv : s->Tq), side ? "k" : "q");
    }
}

// A block-table failure (bsa_vl_table_kernel's key): the CPU's message, the offending entries read back.
spattn_status vl_report_table(const spattn_seqs *s, unsigned long long key, cudaStream_t st) {
    const unsigned long long W = 2ull * (unsigned long long)s->max_pages + 3, low = key - BSA_VL_TAB_KEY;
    const long long r = (long long)(low / W), code = (long long)(low % W);
    int32_t v[2] = {0, 0};
    cudaError_t e;
    if (code == 0) {
        e = cudaMemcpyAsync(&v[0], s->cu_kv + r * s->cu_kv_st, 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(&v[1], s->cu_kv + (r + 1) * s->cu_kv_st, 4, cudaMemcpyDeviceToHost, st);
    } else {
        e = cudaMemcpyAsync(&v[0], s->table + r * s->tab_s0 + (code / 2 - 1) * s->tab_s1, 4, cudaMemcpyDeviceToHost, st);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) return fail(e, "reading back a bad block-table entry");
    if (code == 0)
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                "block_table: sequence %lld has %lld keys, more than max_pages * page_size = %lld * %lld",
                                r, (long long)v[1] - v[0], (long long)s->max_pages, (long long)s->page_size);
    if (code & 1)
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "block_table: page %d appears twice in row %lld", v[0], r);
    return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                            "block_table: [%lld, %lld] must be a page id in [0, %lld) (pages of k), got %d", r,
                            code / 2 - 1, (long long)s->num_pages, v[0]);
}

// Backward workspace: [0] the check word, [1] the sequence table, [2] 4 TMA maps per sequence
// (q, k, v, dO), [3] Delta, [4] lse2 ([N][Tq] fp32 each), [5] q-major counts, [6] lists (64 x 128
// tiles, B sequences of max_seqlen), [7] key-major counts, [8] lists, [9] the dQ accumulator and
// [10] its semaphores (N * vl_ntile tiles of 64 rows, then one per key tile, then the key
// tiles' split slots, then the tiles' landed counts: bsa_bwd90_sem_bytes), [11] the fp32 dK / dV sums of split key-major rows (at most
// bsa_bwd90_split_slots of them); paged only: [12] / [13] the fp32 dK / dV scratch [B * max_seqlen_kv][Nkv][D], [14] page user counts, [15] their offsets, [16] fill cursors
// (int, num_pages (+ 1)), [17] the (b, slot) lists [B * max_pages] int2 (bsa_pages.cu); + 256
// bytes to align a caller's base.
// The prefix-sum check word (~0: fine), the sequence table seq [B] and the per-sequence maps
// tms [B][n] of the n tensors src (q, k, v and, for the backward, dO) from their templates.
// Paged (forward): k / v keep the pool's base, their maps get the rows of the sequence's last page,
// and the block table is checked into the same word (bsa_vl_table_kernel) before anything reads it.
cudaError_t vl_prep(const spattn_seqs *sq, const spattn_tensor *const *src, const CUtensorMap *tmpl, int n, int4 *seq,
                    CUtensorMap *tms, unsigned long long *err, cudaStream_t st) {
    bsa_vl_prep_args a = {};
    a.cu_q = sq->cu_q;
    a.cu_kv = sq->cu_kv;
    a.st_q = sq->cu_q_st;
    a.st_kv = sq->cu_kv_st;
    a.B = sq->B;
    a.Tq = sq->Tq;
    a.Tkv = sq->Tkv;
    a.max_q = sq->max_q;
    a.max_kv = sq->max_kv;
    for (int i = 0; i < n; i++) {
        a.base[i] = static_cast<const char *>(src[i]->data);
        a.row_bytes[i] = src[i]->strides[0] * (long long)spattn_dtype_size((spattn_dtype)src[i]->dtype);
    }
    a.nmaps = n;
    a.seq = seq;
    a.tm = tms;
    a.err = err;
    a.page_size = sq->table ? sq->page_size : 0;
    cudaError_t e = cudaMemsetAsync(err, 0xff, 8, st);
    if (e == cudaSuccess) e = spattn_bsa_launch_vl_prep(tmpl, &a, st);
    if (e != cudaSuccess || !sq->table) return e;
    bsa_vl_table_args ta = {};
    ta.cu_kv = sq->cu_kv;
    ta.st_kv = sq->cu_kv_st;
    ta.B = sq->B;
    ta.table = sq->table;
    ta.tab_s0 = sq->tab_s0;
    ta.tab_s1 = sq->tab_s1;
    ta.max_pages = sq->max_pages;
    ta.page_size = sq->page_size;
    ta.num_pages = sq->num_pages;
    ta.err = err;
    return spattn_bsa_launch_vl_table(&ta, st);
}

// The check word's early verdict (verdict.h): copied to the thread's pinned word with an event
// right after the checks (vl_prep), so that the call waits for the checks only and its kernels
// (gated on the word) run on after it returns; without a pinned word or an event, a copy and a
// stream synchronisation after the kernels, as before.  The workspace holding the word is
// stream-ordered (spattn's kept pool, scratch.h, or the caller's).
struct VlVerdict {
    unsigned long long *h = nullptr;
    cudaEvent_t ev = nullptr;
    bool waited = false;
    // a call that fails after the copy still waits for it: a later call of this thread (on another
    // stream, say) must not see this copy land in the shared pinned word after its own
    ~VlVerdict() {
        if (ev && !waited) cudaEventSynchronize(ev);
    }
};
cudaError_t vl_verdict_copy(const unsigned long long *err, cudaStream_t st, VlVerdict *v) {
    int dev = -1;
    v->h = spattn_verdict_host_word();
    v->ev = v->h && cudaGetDevice(&dev) == cudaSuccess ? spattn_verdict_event(dev) : nullptr;
    if (!v->h || !v->ev) {
        cudaGetLastError();
        v->ev = nullptr;
        return cudaSuccess;
    }
    cudaError_t e = cudaMemcpyAsync(v->h, err, 8, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaEventRecord(v->ev, st);
    return e;
}
cudaError_t vl_verdict_wait(const unsigned long long *err, cudaStream_t st, VlVerdict &v, unsigned long long *key) {
    cudaError_t e;
    if (v.ev) {
        v.waited = true;
        if ((e = cudaEventSynchronize(v.ev)) == cudaSuccess) *key = *v.h;
        return e;
    }
    if ((e = cudaMemcpyAsync(key, err, 8, cudaMemcpyDeviceToHost, st)) == cudaSuccess) e = cudaStreamSynchronize(st);
    return e;
}

long long vl_ntile(const spattn_bsa_problem *vp) { return vp->seqs->Tq / 64 + vp->B + 1; }
struct VlBwdLayout {
    size_t off[18];
    size_t total;
};
VlBwdLayout vl_bwd_layout(const spattn_bsa_problem *vp) {
    VlBwdLayout L = {};
    const int dp = bsa_dpad(vp->D);
    const size_t nqt = (size_t)((vp->Sq + 63) / 64), nkt = (size_t)((vp->Skv + 127) / 128);
    const size_t nq = (size_t)vp->B * vp->N * nqt, kr = (size_t)vp->B * vp->Nkv * nkt;
    const size_t rows = (size_t)vp->N * vp->seqs->Tq, at = (size_t)vp->N * vl_ntile(vp);
    const spattn_seqs *sq = vp->seqs;
    const size_t kvs = sq->table ? (size_t)vp->B * vp->Skv * vp->Nkv * vp->D * 4 : 0;  // paged scratch
    const size_t np = sq->table ? (size_t)sq->num_pages : 0, nl = sq->table ? (size_t)vp->B * sq->max_pages : 0;
    const size_t sz[18] = {8,
                           (size_t)vp->B * 16,
                           (size_t)vp->B * 6 * sizeof(CUtensorMap),  // q, k, v, dO (, dk, dv)
                           rows * 4,
                           rows * 4,
                           nq * 4,
                           nq * nkt * 4,
                           kr * 4,
                           kr * (size_t)(vp->N / vp->Nkv) * nqt * 4,
                           at * 64 * (size_t)dp * 4,
                           (size_t)bsa_bwd90_sem_bytes((long long)at, (long long)kr),  // semaphores, split slots, landed counts
                           (size_t)bsa_bwd90_kvbuf_bytes(vp->N / vp->Nkv, (long long)nqt, (long long)kr, dp),
                           kvs,
                           kvs,
                           np * 4,
                           sq->table ? (np + 1) * 4 : 0,
                           np * 4,
                           nl * 8};
    L.total = place(sz, 18, L.off) + kAlign;
    return L;
}

}  // namespace

extern "C" size_t spattn_cuda_bsa_varlen_workspace(const spattn_bsa_problem *pb, int backward) {
    VlViews w;
    vl_views(pb, &w);
    // 0 for the shapes the backward refuses (NOT_SUPPORTED at the call): as spattn_cuda_bsa_bwd_varlen
    if (backward)
        return bwd90(&w.p, pb->dout != nullptr) && (!pb->seqs->table || pb->seqs->page_size % 8 == 0)
                   ? vl_bwd_layout(&w.p).total
                   : 0;
    return vl_layout(&w.p, vl_fast(&w.p)).total;
}

extern "C" spattn_status spattn_cuda_bsa_fwd_varlen(const spattn_bsa_problem *pb, const spattn_exec *ex) {
    if (stream_capturing((cudaStream_t)ex->stream)) return capture_refusal("the varlen bsa forward");
    VlViews w;
    vl_views(pb, &w);
    const spattn_bsa_problem *vp = &w.p;
    const bool fast = vl_fast(vp);
    const spattn_seqs *sq = pb->seqs;
    if (sq->table && (double)sq->B * (2.0 * (double)sq->max_pages + 3.0) >= 0x1p61)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa_fwd_varlen: B * (2 max_pages + 3) must stay below 2^61 on CUDA (the device "
                                "block-table check); use CPU tensors");
    const VlLayout L = vl_layout(vp, fast);
    cuda_scratch ws;
    spattn_status s = ws.get(ex, L.total, "bsa cuda");
    if (s != SPATTN_STATUS_SUCCESS) return s;
    cudaStream_t st = ws.st;
    char *base = ws.base + ((kAlign - (uintptr_t)ws.base % kAlign) % kAlign);
    unsigned long long *err = reinterpret_cast<unsigned long long *>(base + L.off[0]);
    int4 *seq = reinterpret_cast<int4 *>(base + L.off[1]);
    CUtensorMap *tms = fast ? reinterpret_cast<CUtensorMap *>(base + L.off[2]) : nullptr;
    const int dp = bsa_dpad(pb->D), bf16 = pb->dtype == SPATTN_DTYPE_BF16;
    const bsa_fwd90_tile t = bsa_fwd90_tile_for(dp ? dp : 128);
    const int u = bsa_fwd90_chunk(vp->by);
    if (fast && vp->B * vp->N * ((vp->Sq + t.bm - 1) / t.bm) > 0x7fffffffll)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa cuda: B * N * ceil(max_seqlen_q / %d) must be < 2^31", t.bm);
    bsa_tmaps tm;
    // the reference path passes unused maps.  O: per-sequence maps (base at the sequence's first
    // row, rows = its length, so TMA stores clip at its end) when TMA can write the view, else
    // per-element stores (o_tma 0)
    memset(&tm, 0, sizeof tm);
    // paged: k / v maps over the page pool in slabs of 2^lr rows (the per-sequence copies cut the last page)
    const int lr = sq->table ? vl_slab_log2(u, sq->page_size) : 0;
    const int kv_rows = sq->table ? 1 << lr : u, kv_dim = sq->table ? 2 : 1;
    if (fast && (!make_tmap(&tm.q, vp->q, t.bm) || !make_tmap(&tm.k, vp->k, kv_rows, kv_dim) ||
                 !make_tmap(&tm.v, vp->v, kv_rows, kv_dim)))
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "bsa cuda: cuTensorMapEncodeTiled failed for q, k or v");
    tm.o_tma = fast && view(vp->o).vec && make_tmap(&tm.o, vp->o, 64);
    const spattn_tensor *const src[4] = {pb->q, pb->k, pb->v, pb->o};
    const CUtensorMap tmpl[4] = {tm.q, tm.k, tm.v, tm.o};
    cudaError_t e = vl_prep(sq, src, tmpl, tm.o_tma ? 4 : 3, seq, tms, err, st);
    VlVerdict vv;
    if (e == cudaSuccess) e = vl_verdict_copy(err, st, &vv);
    if (e != cudaSuccess) return fail(e, "varlen prefix-sum check");
    if (!fast) {
        s = spattn_cuda_ref_bsa_fwd_varlen(vp, ex, seq, err);
    } else {
        bsa_params p = params(vp);
        p.vl.seq = seq;
        p.vl.tm = tms;
        p.vl.err = err;
        p.vl.Tq = sq->Tq;  // the grid's bound (bsa_fwd.cu's launch)
        if (sq->table) {
            p.vl.table = sq->table;
            p.vl.tab_s0 = sq->tab_s0;
            p.vl.tab_s1 = sq->tab_s1;
            p.vl.page_size = (int)sq->page_size;
            p.vl.lr = lr;
        }
        int *cnt = reinterpret_cast<int *>(base + L.off[3]), *order = reinterpret_cast<int *>(base + L.off[5]);
        int2 *list = reinterpret_cast<int2 *>(base + L.off[4]);
        const long long rows = (long long)p.B * p.N * ((p.Sq + t.bm - 1) / t.bm);
        if ((e = spattn_bsa_launch_sched_fwd(&p, t.bm, u, cnt, list, st)) != cudaSuccess) return fail(e, "schedule");
        int *ctr = reinterpret_cast<int *>(base + L.off[6]);
        if ((e = spattn_bsa_launch_order(cnt, rows, 128 / u, order, ctr, st)) != cudaSuccess) return fail(e, "order");
        p.sq.cnt = cnt;
        p.sq.list = reinterpret_cast<const int *>(list);
        p.sq.stride = (p.Skv + u - 1) / u;
        p.sq.order = order;
        if ((e = spattn_bsa_launch_fwd(&p, &tm, dp, bf16, u, ctr, 0, st)) != cudaSuccess) return fail(e, "forward kernel");
    }
    if (s != SPATTN_STATUS_SUCCESS) return s;
    // the check's verdict (the kernels above write nothing if it failed)
    unsigned long long key = 0;
    if ((e = vl_verdict_wait(err, st, vv, &key)) != cudaSuccess) return fail(e, "varlen forward");
    return vl_report(pb, key, st);
}

// ---- packed variable-length backward (spattn_bsa_bwd_varlen) ------------------------------------
// As the forward: the packed tensors as [1, H, T, D] views, the lengths stay on the device.
// bsa_vl_prep_kernel checks the prefix sums and writes the sequence table and 4 TMA maps per
// sequence (q, k, v, dO: base at the sequence's first row, rows = its length); then Delta / lse2
// by packed token, the two schedules (VL: per sequence), the Hopper backward (VL instantiation)
// and its postprocess (dQ rows, dK / dV rows past cu_kv[B] zeroed); one synchronisation at the
// end turns a bad prefix sum into the CPU's message (every kernel writes nothing then).  Shapes
// without the Hopper backward (fp32, D > 128, views TMA cannot read) are refused before anything
// runs: SPATTN_STATUS_NOT_SUPPORTED, naming the CPU backend.
extern "C" spattn_status spattn_cuda_bsa_bwd_varlen(const spattn_bsa_problem *pb, const spattn_exec *ex) {
    if (stream_capturing((cudaStream_t)ex->stream)) return capture_refusal("the varlen bsa backward");
    VlViews w;
    vl_views(pb, &w);
    const spattn_bsa_problem *vp = &w.p;
    const spattn_seqs *sq = pb->seqs;
    if (!bwd90(vp))
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa_bwd_varlen: the CUDA backend runs the %s variable-length backward for "
                                "fp16 / bf16, D <= 128 and TMA-readable views (16-byte aligned, contiguous D, row "
                                "strides multiple of 8) only; use CPU tensors (the CPU backend runs every form)",
                                sq->table ? "paged" : "packed");
    if (sq->table && sq->page_size % 8 != 0)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa_bwd_varlen: the CUDA paged backward needs a page_size that is a multiple of 8, "
                                "got %lld; use CPU tensors (the CPU backend runs every page size)",
                                (long long)sq->page_size);
    if (sq->table && ((double)sq->B * (2.0 * (double)sq->max_pages + 3.0) >= 0x1p61 ||
                      (double)sq->B * (double)sq->max_pages >= 0x1p31 || (double)sq->num_pages >= 0x1p31))
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa_bwd_varlen: B * max_pages and num_pages must stay below 2^31 on CUDA (the page "
                                "fold); use CPU tensors");
    const long long nqt = (vp->Sq + 63) / 64, nkt = (vp->Skv + 127) / 128;
    if (vp->B * vp->N * nqt > 0x7fffffffll || vp->B * vp->Nkv * nkt > 0x7fffffffll ||
        vp->N * vl_ntile(vp) > 0x7fffffffll || (vp->N / vp->Nkv) * nqt >= (1ll << 27))
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa_bwd_varlen: B * N * ceil(max_seqlen_q / 64), B * Nkv * ceil(max_seqlen_kv / "
                                "128) and N * (Tq / 64 + B + 1) must be < 2^31 on CUDA; use CPU tensors");
    const VlBwdLayout L = vl_bwd_layout(vp);
    cuda_scratch ws;
    spattn_status s = ws.get(ex, L.total, "bsa cuda");
    if (s != SPATTN_STATUS_SUCCESS) return s;
    cudaStream_t st = ws.st;
    char *base = ws.base + ((kAlign - (uintptr_t)ws.base % kAlign) % kAlign);
    unsigned long long *err = reinterpret_cast<unsigned long long *>(base + L.off[0]);
    int4 *seq = reinterpret_cast<int4 *>(base + L.off[1]);
    CUtensorMap *tms = reinterpret_cast<CUtensorMap *>(base + L.off[2]);
    float *delta = reinterpret_cast<float *>(base + L.off[3]), *lse2 = reinterpret_cast<float *>(base + L.off[4]);
    int *qcnt = reinterpret_cast<int *>(base + L.off[5]), *qlist = reinterpret_cast<int *>(base + L.off[6]);
    int *kcnt = reinterpret_cast<int *>(base + L.off[7]), *klist = reinterpret_cast<int *>(base + L.off[8]);
    float *acc = reinterpret_cast<float *>(base + L.off[9]);
    int *sem = reinterpret_cast<int *>(base + L.off[10]);
    float *kvbuf = reinterpret_cast<float *>(base + L.off[11]);
    const int dp = bsa_dpad(pb->D), bf16 = pb->dtype == SPATTN_DTYPE_BF16;
    // templates of the per-sequence maps: q / dO boxes of 64 rows, k / v of 128 (as the dense call);
    // paged: k / v maps over the page pool in slabs of 2^lr rows (the per-sequence copies cut the last page)
    const int lr = sq->table ? vl_slab_log2(128, sq->page_size) : 0;
    const int kv_rows = sq->table ? 1 << lr : 128, kv_dim = sq->table ? 2 : 1;
    bsa_bwd_tmaps tm;
    memset(&tm, 0, sizeof tm);
    if (!make_tmap(&tm.q, vp->q, 64) || !make_tmap(&tm.dout, vp->dout, 64) || !make_tmap(&tm.k, vp->k, kv_rows, kv_dim) ||
        !make_tmap(&tm.v, vp->v, kv_rows, kv_dim))
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "bsa cuda: cuTensorMapEncodeTiled failed for q, dout, k or v");
    // packed: dK / dV by TMA stores through per-sequence maps of dk / dv (rows = the sequence's
    // key count, so the stores clip at its end) when TMA can write the views; paged: fp32 scratch
    tm.kv_tma = !sq->table && view(vp->dk).vec && view(vp->dv).vec && make_tmap(&tm.dk, vp->dk, 64) &&
                make_tmap(&tm.dv, vp->dv, 64);
    const spattn_tensor *const src[6] = {pb->q, pb->k, pb->v, pb->dout, pb->dk, pb->dv};
    const CUtensorMap tmpl[6] = {tm.q, tm.k, tm.v, tm.dout, tm.dk, tm.dv};
    cudaError_t e = vl_prep(sq, src, tmpl, tm.kv_tma ? 6 : 4, seq, tms, err, st);
    VlVerdict vv;
    if (e == cudaSuccess) e = vl_verdict_copy(err, st, &vv);
    if (e != cudaSuccess) return fail(e, "varlen prefix-sum check");
    bsa_params p = params(vp);
    p.vl.seq = seq;
    p.vl.tm = tms;
    p.vl.err = err;
    p.vl.Tq = sq->Tq;
    p.vl.Tkv = sq->Tkv;
    p.vl.ntile = vl_ntile(vp);
    float *sdk = reinterpret_cast<float *>(base + L.off[12]), *sdv = reinterpret_cast<float *>(base + L.off[13]);
    if (sq->table) {
        p.vl.table = sq->table;
        p.vl.tab_s0 = sq->tab_s0;
        p.vl.tab_s1 = sq->tab_s1;
        p.vl.page_size = (int)sq->page_size;
        p.vl.lr = lr;
        // the kernel's dK / dV go to the fp32 scratch, rows b * max_seqlen_kv + key (bsa_bwd.cu, PG)
        const bsa_view sk = {sdk, 0, (long long)vp->D, (long long)vp->Nkv * vp->D, 1, true};
        p.dk = sk;
        p.dv = sk;
        p.dv.p = sdv;
    }
    // zeroed by the Delta kernel: the semaphores only; the first add of each query tile is a store
    // (deterministic: rank 0; non-deterministic: the first claimant), so the dQ accumulator needs none
    void *z0 = sem;
    const size_t zn = (spattn_bsa_bwd90_sem_bytes(&p, dp) + 15) & ~(size_t)15;  // slot padding
    p.lse2 = lse2;
    p.delta = delta;
    p.nqt = (int)nqt;
    if ((e = spattn_bsa_launch_sched_q(&p, 64, 128, qcnt, qlist, st)) != cudaSuccess) return fail(e, "schedule");
    p.sq.cnt = qcnt;
    p.sq.list = qlist;
    p.sq.stride = (int)nkt;
    if ((e = spattn_bsa_launch_sched_k(&p, 64, 128, kcnt, klist, st)) != cudaSuccess) return fail(e, "schedule");
    p.sk.cnt = kcnt;
    p.sk.list = klist;
    p.sk.stride = p.G * p.nqt;
    // Delta right before the backward kernel (the launch order of bwd90_run)
    if ((e = spattn_bsa_launch_delta(&p, bf16, delta, lse2, z0, zn, st)) != cudaSuccess) return fail(e, "delta kernel");
    if ((e = spattn_bsa_launch_bwd90(&p, &tm, dp, bf16, acc, sem, nullptr, kvbuf, ex->deterministic != 0, st)) != cudaSuccess)
        return fail(e, "backward kernel");
    if (sq->table) {  // every page row of dk / dv from the scratch (bsa_pages.cu)
        bsa_pg_fold_args f = {};
        f.seq = seq;
        f.err = err;
        f.table = sq->table;
        f.tab_s0 = sq->tab_s0;
        f.tab_s1 = sq->tab_s1;
        f.B = sq->B;
        f.max_pages = sq->max_pages;
        f.page_size = sq->page_size;
        f.num_pages = sq->num_pages;
        f.max_kv = vp->Skv;
        f.Nkv = (int)vp->Nkv;
        f.D = (int)vp->D;
        f.bf16 = bf16;
        f.sdk = sdk;
        f.sdv = sdv;
        f.cnt = reinterpret_cast<int *>(base + L.off[14]);
        f.start = reinterpret_cast<int *>(base + L.off[15]);
        f.cur = reinterpret_cast<int *>(base + L.off[16]);
        f.list = reinterpret_cast<int2 *>(base + L.off[17]);
        f.dk = pb->dk->data;
        f.dv = pb->dv->data;
        for (int i = 0; i < 4; i++) {
            f.dk_s[i] = pb->dk->strides[i];
            f.dv_s[i] = pb->dv->strides[i];
        }
        if ((e = spattn_bsa_launch_pg_fold(&f, st)) != cudaSuccess) return fail(e, "page fold");
    }
    // the check's verdict (the kernels above write nothing if it failed)
    unsigned long long key = 0;
    if ((e = vl_verdict_wait(err, st, vv, &key)) != cudaSuccess) return fail(e, "varlen backward");
    return vl_report(pb, key, st);
}

// Building and freeing the device part of a bsa plan (see bsa_plan.h and spattn.h): a
// contiguous copy of the block mask, then the forward, dQ and dK/dV schedules built from it by
// the schedule kernels (bsa_sched.cu), all in one device allocation.
#include <stdlib.h>

#include <mutex>

#include "../core/internal.h"
#include "bsa_launch.h"
#include "bsa_plan.h"
#include "scratch.h"

namespace {

__global__ void copy_mask_kernel(bsa_mask_view src, uint8_t *dst, int N, long long nbx, long long nby,
                                 long long total) {
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < total;
         x += (long long)gridDim.x * blockDim.x) {
        const long long c = x % nby, r = (x / nby) % nbx, bn = x / (nby * nbx);
        dst[x] = src.p[(bn / N) * src.s0 + (bn % N) * src.s1 + r * src.s2 + c * src.s3];
    }
}

size_t up(size_t x) { return (x + 255) / 256 * 256; }

spattn_status fail(cudaError_t e, const char *what) {
    cudaGetLastError();
    return spattn_set_error(e == cudaErrorMemoryAllocation ? SPATTN_STATUS_OUT_OF_MEMORY : SPATTN_STATUS_CUDA_ERROR,
                            "bsa plan: %s: %s", what, cudaGetErrorString(e));
}

}  // namespace

static spattn_status plan_make(spattn_bsa_plan *pl, const spattn_tensor *mask, const spattn_exec *ex);

// The plan's memory and schedules live on the mask's device: that device is made current for
// the build and the caller's current device restored afterwards.
extern "C" spattn_status spattn_cuda_bsa_plan_make(spattn_bsa_plan *pl, const spattn_tensor *mask,
                                                   const spattn_exec *ex) {
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != mask->device_id) e = cudaSetDevice(mask->device_id);
    if (e != cudaSuccess) return fail(e, "selecting the mask's device");
    const spattn_status s = plan_make(pl, mask, ex);
    if (prev != mask->device_id) cudaSetDevice(prev);
    return s;
}

static spattn_status plan_make(spattn_bsa_plan *pl, const spattn_tensor *mask, const spattn_exec *ex) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    bsa_params p = {};
    p.B = (int)pl->B;
    p.N = (int)pl->N;
    p.Nkv = (int)pl->Nkv;
    p.G = (int)(pl->N / pl->Nkv);
    p.Sq = (int)pl->Sq;
    p.Skv = (int)pl->Skv;
    p.bx = (int)(pl->bx < pl->Sq ? pl->bx : pl->Sq);  // as bsa_host.cu: a block wider than S covers it
    p.by = (int)(pl->by < pl->Skv ? pl->by : pl->Skv);
    p.nbx = (int)pl->nbx;
    p.nby = (int)pl->nby;

    bsa_plan_cuda *c = static_cast<bsa_plan_cuda *>(calloc(1, sizeof(bsa_plan_cuda)));
    if (!c) return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "bsa plan: out of host memory");
    const bsa_fwd90_tile tf = bsa_fwd90_tile_for(128);
    c->fwd_bm = tf.bm;
    c->fwd_bn = bsa_fwd90_chunk(p.by);  // key chunk width of the packed forward tiles
    // backward: the Hopper kernel's tiles (64 query rows x 128 keys) for both lists
    c->dq_cfg = BSA_PLAN_DQ_BWD90;
    const bsa_tile tq = bsa_tile{64, 128, 0, 0}, tk = bsa_tile{64, 128, 0, 0};
    c->kv_bm = tk.bm;
    c->kv_bn = tk.bn;
    const size_t BN = (size_t)p.B * p.N;
    const size_t f_rows = BN * ((p.Sq + tf.bm - 1) / tf.bm), f_w = (p.Skv + c->fwd_bn - 1) / c->fwd_bn;
    const size_t q_rows = BN * ((p.Sq + tq.bm - 1) / tq.bm), q_w = (p.Skv + tq.bn - 1) / tq.bn;
    const int kv_nqt = (p.Sq + tk.bm - 1) / tk.bm;
    const size_t k_rows = (size_t)p.B * p.Nkv * ((p.Skv + tk.bn - 1) / tk.bn), k_w = (size_t)p.G * kv_nqt;
    const size_t mask_bytes = BN * (size_t)p.nbx * p.nby;
    const int splits = bsa_bwd90_splits(p.G, kv_nqt);
    const size_t sz[11] = {mask_bytes, f_rows * 4, f_rows * f_w * 8, q_rows * 4, q_rows * q_w * 4, k_rows * 4,
                           k_rows * k_w * 4, f_rows * 4, k_rows * 4, splits > 1 ? k_rows * 4 : 0, 8};
    size_t off[11], total = 0;
    for (int i = 0; i < 11; i++) {
        off[i] = total;
        total += up(sz[i]);
    }
    cudaError_t e = cudaMalloc(&c->buf, total);
    if (e != cudaSuccess) {
        free(c);
        return fail(e, "cudaMalloc");
    }
    char *base = static_cast<char *>(c->buf);
    c->fwd_ctr = reinterpret_cast<int *>(base + off[10]);  // zeroed by the forward's order kernel below
    if ((e = cudaEventCreateWithFlags(&c->fwd_done, cudaEventDisableTiming)) != cudaSuccess) {
        cudaFree(c->buf);
        free(c);
        return fail(e, "cudaEventCreate");
    }
    c->lock = new (std::nothrow) std::mutex;
    if (!c->lock) {
        cudaEventDestroy(c->fwd_done);
        cudaFree(c->buf);
        free(c);
        return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "bsa plan: out of host memory");
    }
    uint8_t *m = reinterpret_cast<uint8_t *>(base + off[0]);
    bsa_mask_view src = {static_cast<const uint8_t *>(mask->data), mask->strides[0], mask->strides[1],
                         mask->strides[2], mask->strides[3]};
    const long long blocks = ((long long)mask_bytes + 255) / 256;
    copy_mask_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, st>>>(src, m, p.N, p.nbx, p.nby,
                                                                                 (long long)mask_bytes);
    p.mask = bsa_mask_view{m, (long long)p.N * p.nbx * p.nby, (long long)p.nbx * p.nby, p.nby, 1};
    int *order = reinterpret_cast<int *>(base + off[7]);
    c->fwd = bsa_sched{reinterpret_cast<int *>(base + off[1]), reinterpret_cast<int *>(base + off[2]), (int)f_w, order};
    c->dq = bsa_sched{reinterpret_cast<int *>(base + off[3]), reinterpret_cast<int *>(base + off[4]), (int)q_w, nullptr};
    // the key-major rows heaviest first: the launch order of the non-deterministic backward (the
    // deterministic one launches in its dQ order, key tile ascending across heads)
    int *korder = reinterpret_cast<int *>(base + off[8]);
    c->kv = bsa_sched{reinterpret_cast<int *>(base + off[5]), reinterpret_cast<int *>(base + off[6]), (int)k_w, korder};
    if ((e = cudaGetLastError()) == cudaSuccess)
        e = spattn_bsa_launch_sched_fwd(&p, tf.bm, c->fwd_bn, const_cast<int *>(c->fwd.cnt),
                                        reinterpret_cast<int2 *>(const_cast<int *>(c->fwd.list)), st);
    if (e == cudaSuccess) e = spattn_bsa_launch_order(c->fwd.cnt, (long long)f_rows, tf.bn / c->fwd_bn, order, c->fwd_ctr, st);
    if (e == cudaSuccess)
        e = spattn_bsa_launch_sched_q(&p, tq.bm, tq.bn, const_cast<int *>(c->dq.cnt), const_cast<int *>(c->dq.list), st);
    if (e == cudaSuccess)
        e = spattn_bsa_launch_sched_k(&p, tk.bm, tk.bn, const_cast<int *>(c->kv.cnt), const_cast<int *>(c->kv.list), st);
    if (e == cudaSuccess) e = spattn_bsa_launch_order(c->kv.cnt, (long long)k_rows, 1, korder, nullptr, st);
    // which long key-major lists split (a kernel per backward call before plans held it)
    if (e == cudaSuccess && splits > 1) {
        int *slot = reinterpret_cast<int *>(base + off[9]);
        const int nkt = (p.Skv + tk.bn - 1) / tk.bn;
        e = spattn_bsa_launch_split_slots(c->kv.cnt, (long long)k_rows, nkt, bsa_bwd90_chunk(p.G, kv_nqt),
                                          (int)bsa_bwd90_split_slots(p.G, kv_nqt, (long long)k_rows, 128), slot, st);
        c->kv_slot = slot;
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        delete static_cast<std::mutex *>(c->lock);
        cudaEventDestroy(c->fwd_done);
        cudaFree(c->buf);
        free(c);
        return fail(e, "building the schedules");
    }
    pl->mask = spattn_tensor{};
    pl->mask.data = m;
    pl->mask.device_type = SPATTN_DEVICE_CUDA;
    pl->mask.device_id = mask->device_id;
    pl->mask.dtype = SPATTN_DTYPE_U8;
    pl->mask.ndim = 4;
    const int64_t shp[4] = {pl->B, pl->N, pl->nbx, pl->nby};
    for (int i = 0; i < 4; i++) pl->mask.shape[i] = shp[i];
    pl->mask.strides[3] = 1;
    for (int i = 2; i >= 0; i--) pl->mask.strides[i] = pl->mask.strides[i + 1] * shp[i + 1];
    pl->cuda = c;
    return SPATTN_STATUS_SUCCESS;
}

extern "C" void spattn_cuda_bsa_plan_free(spattn_bsa_plan *pl) {
    if (!pl || !pl->cuda) return;
    bsa_plan_cuda *c = static_cast<bsa_plan_cuda *>(pl->cuda);
    delete static_cast<std::mutex *>(c->lock);
    cudaEventDestroy(c->fwd_done);
    cudaFree(c->buf);
    free(c);
    pl->cuda = nullptr;
}

int *bsa_plan_fwd_ctr_acquire(const bsa_plan_cuda *c, cudaStream_t st) {
    unsigned long long id = 0;
    // a captured call would bake the counter into a graph replayable on any stream at any time
    if (stream_capturing(st) || cudaStreamGetId(st, &id) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    std::mutex *m = static_cast<std::mutex *>(c->lock);
    m->lock();
    bool ok = !c->fwd_used || c->fwd_stream == id;
    if (!ok && c->fwd_rec) {  // another stream's use: free once the last one has finished
        const cudaError_t q = cudaEventQuery(c->fwd_done);
        ok = q == cudaSuccess;
        if (q != cudaSuccess) cudaGetLastError();  // cudaErrorNotReady (or an error: not free)
    }
    if (!ok) {
        m->unlock();
        return nullptr;
    }
    c->fwd_stream = id;
    return c->fwd_ctr;
}

void bsa_plan_fwd_ctr_release(const bsa_plan_cuda *c, cudaStream_t st, bool launched) {
    if (launched) {
        // an event recorded after each use tells a later call on another stream when the counter
        // is free.  A failed record would leave it at an earlier use, so the counter is withdrawn
        // instead: no stream has id ~0 and fwd_rec stays 0 (every call takes the workspace path)
        c->fwd_used = 1;
        c->fwd_rec = cudaEventRecord(c->fwd_done, st) == cudaSuccess;
        if (!c->fwd_rec) {
            cudaGetLastError();
            c->fwd_stream = ~0ull;
        }
    }
    static_cast<std::mutex *>(c->lock)->unlock();
}

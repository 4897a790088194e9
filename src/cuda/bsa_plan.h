// Device part of a bsa plan (spattn_bsa_plan.cuda): the schedules of the forward and of both
// backward kernels, built once from the plan's mask copy by bsa_plan.cu.  The host side
// (bsa_host.cu) uses them when their tile sizes are the ones the call's kernels run with.
#ifndef SPATTN_BSA_PLAN_H
#define SPATTN_BSA_PLAN_H

#include "bsa_common.cuh"

// dq_cfg of a plan whose query-major list is at the Hopper backward's tiles (64 x 128): the
// ranks of its deterministic dQ order.
#define BSA_PLAN_DQ_BWD90 99

struct bsa_plan_cuda {
    void *buf;            // one device allocation holding every list below
    int fwd_bm, fwd_bn;   // forward: query-major, query tiles of fwd_bm, key chunks of fwd_bn
    bsa_sched fwd;
    int dq_cfg;           // BSA_PLAN_DQ_BWD90: query-major at the backward's 64 x 128 tiles
    bsa_sched dq;
    int kv_bm, kv_bn;     // key-major list of the backward (64 x 128)
    bsa_sched kv;
    const int *kv_slot;   // split rows' kvbuf slots (spattn_bsa_launch_split_slots), NULL when no list can split
    // The forward's row counter (2 ints, zeroed at creation, set back to 0 by each forward that
    // uses it: spattn_bsa_launch_fwd with reset), so plan calls need no zeroing launch.  A call
    // may use it only when every earlier use is ordered before it: the state below (under lock)
    // is the stream of the last use and an event recorded after it.
    // (mutable: the counter's state is all a call changes in a plan it gets as const)
    int *fwd_ctr;
    void *lock;                              // std::mutex
    mutable unsigned long long fwd_stream;   // cudaStreamGetId of the last use's stream
    mutable int fwd_used;                    // any use yet
    cudaEvent_t fwd_done;                    // recorded after each use
    mutable int fwd_rec;                     // fwd_done recorded after the last use
};

// The plan's forward row counter for a call on `st`, locked, when its earlier uses are all
// ordered before this call (same stream, or finished) and `st` is not capturing; else NULL (the
// caller zeroes a counter in its workspace instead).  A non-NULL answer must be followed by
// bsa_plan_fwd_ctr_release on the same stream, after the launch (or its failure).
int *bsa_plan_fwd_ctr_acquire(const bsa_plan_cuda *c, cudaStream_t st);
void bsa_plan_fwd_ctr_release(const bsa_plan_cuda *c, cudaStream_t st, bool launched);

#endif

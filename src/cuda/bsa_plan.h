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
};

#endif

// Device part of a bsa plan (spattn_bsa_plan.cuda): the schedules of the forward and of both
// backward kernels, built once from the plan's mask copy by bsa_plan.cu.  The host side
// (bsa_host.cu) uses them when their tile sizes are the ones the call's kernels run with.
#ifndef SPATTN_BSA_PLAN_H
#define SPATTN_BSA_PLAN_H

#include "bsa_common.cuh"

struct bsa_plan_cuda {
    void *buf;            // one device allocation holding every list below
    int fwd_bm, fwd_bn;   // forward: query-major, query tiles of fwd_bm, key chunks of fwd_bn
    bsa_sched fwd;
    int dq_cfg;           // dQ: query-major at bsa_dq_tile(dq_cfg)
    bsa_sched dq;
    int kv_bm, kv_bn;     // dK/dV: key-major at bsa_dkdv_tile
    bsa_sched kv;
};

#endif

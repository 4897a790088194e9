// Launchers of the block-sparse attention CUDA kernels (bsa_sched.cu, bsa_fwd.cu, bsa_bwd_pre.cu,
// bsa_bwd.cu),
// called by the host side in bsa_host.cu.  All run on `st` and only enqueue work.
#ifndef SPATTN_BSA_LAUNCH_H
#define SPATTN_BSA_LAUNCH_H

#include <cuda.h>
#include <cuda_runtime.h>

#include "../core/internal.h"
#include "bsa_common.cuh"

extern "C" {
// Query-major schedule for row tiles of bm queries and key tiles of bn keys:
// cnt [B*N*nqt], list [B*N*nqt][nkt].  Edge key tiles (past Skv) are marked partial.
// Both backward schedules: with p->vl.seq set (varlen backward) per sequence b with its own Sq /
// Skv (block rows / columns restart at its first token), tiles past its lengths empty, every row
// empty unless *p->vl.err == ~0; B / Sq / Skv of p are the sequence count and max_seqlen.
cudaError_t spattn_bsa_launch_sched_q(const bsa_params *p, int bm, int bn, int *cnt, int *list, cudaStream_t st);
// Key-major schedule (for dK/dV): per (b, kv head, key tile of bn) the (group head, query tile
// of bm) pairs e that hit it: cnt [B*Nkv*nkt], list [B*Nkv*nkt][G*nqt] of e * 16 + code1 * 4 +
// code0, code_h classifying key half h of the tile (0 empty, 1 full, 2 partial).
cudaError_t spattn_bsa_launch_sched_k(const bsa_params *p, int bm, int bn, int *cnt, int *list, cudaStream_t st);
// Forward schedule (query tiles of bm rows, key chunks of u keys): cnt [B*N*nqt], list
// [B*N*nqt][ceil(Skv/u)] of int2 {chunk * 2 + partial, row bits} (bsa_sched.cu).
cudaError_t spattn_bsa_launch_sched_fwd(const bsa_params *p, int bm, int u, int *cnt, int2 *list, cudaStream_t st);
// Forward launch order (bsa_sched.cu): order [rows] lists the rows of a query-major schedule by
// decreasing ceil(cnt / per_tile).  rows < 2^31.
// ctr: when not NULL, ctr[0..1] set to 0 (the forward's row counter, zeroed here at no extra launch).
cudaError_t spattn_bsa_launch_order(const int *cnt, long long rows, int per_tile, int *order, int *ctr,
                                    cudaStream_t st);
// TMA descriptors of the forward's Q, K, V (4-d [B, H, S, D] maps, 64-column boxes of
// bsa_fwd90_tile_for(dp).bm rows for Q and `chunk` rows for K, V; 128-byte swizzle).
struct bsa_tmaps {
    CUtensorMap q, k, v;
    CUtensorMap o;  // forward output, boxes of 64 rows (one consumer warpgroup's), when o_tma
    int o_tma;      // O is written by TMA stores (forward, dense or varlen, when TMA can write the view)
};
// Packed variable-length forward / backward (bsa_sched.cu, bsa_vl_prep_kernel): checks the
// prefix sums into *err (~0 before: the caller memsets it; see the kernel for the key), fills
// seq [B] and the per-sequence TMA maps tm [B][nmaps] (q, k, v and, nmaps = 4, dO) from the
// call's maps tmpl[0 .. nmaps-1] (over [1, H, T, D] views of the packed tensors; base[i] /
// row_bytes[i]: data pointer and bytes between rows of q, k, v, dO; tm NULL: no maps, for the
// reference path).
struct bsa_vl_prep_args {
    const int *cu_q, *cu_kv;
    long long st_q, st_kv;          // element strides of the prefix sums
    long long B, Tq, Tkv, max_q, max_kv;
    const char *base[6];
    long long row_bytes[6];
    int nmaps;                      // forward 3 (+ o: 4), backward 4 (+ dk, dv: 6)
    int4 *seq;
    CUtensorMap *tm;
    unsigned long long *err;
    // paged forward (> 0; 0: packed): k / v maps are over the page pool (D, Nkv, page_size,
    // num_pages); their copies keep the base and get the rows of the sequence's last page as the
    // size of dimension 2 (rows past its last key zero-filled); Tkv is not a bound then
    long long page_size;
};
cudaError_t spattn_bsa_launch_vl_prep(const CUtensorMap *tmpl, const bsa_vl_prep_args *a, cudaStream_t st);
// Paged forward: the block table against the CPU's rules (spattn_seqs_check_values: per row the
// capacity, then slot by slot a page id in [0, num_pages) and no id twice in the row), one CTA
// per row, into the same check word as the prefix sums: key BSA_VL_TAB_KEY + r * (2 max_pages +
// 3) + code, code 0 capacity, 2 (j + 1) slot j out of range, 2 (j + 1) + 1 slot j repeats an
// earlier slot (the prefix-sum keys are all smaller: the CPU checks those first).  Run after
// spattn_bsa_launch_vl_prep, before any kernel that reads the table.
#define BSA_VL_TAB_KEY (1ull << 62)
struct bsa_vl_table_args {
    const int *cu_kv;
    long long st_kv, B;
    const int *table;
    long long tab_s0, tab_s1, max_pages, page_size, num_pages;
    unsigned long long *err;
};
cudaError_t spattn_bsa_launch_vl_table(const bsa_vl_table_args *a, cudaStream_t st);
// Hopper forward (bsa_fwd.cu); p->sq is the query-major schedule of query tiles of
// bsa_fwd90_tile_for(dp).bm rows and key chunks of `chunk` = bsa_fwd90_chunk(by) keys.
// With p->vl.seq set (varlen): the same kernel per (sequence, head, query tile of max_seqlen_q)
// with the sequence's lengths and TMA maps (p->vl), nothing written unless *p->vl.err == ~0.
// With p->vl.table set too (paged K / V): tm->k / tm->v are the page-pool maps (boxes of
// 2^p->vl.lr rows, 8 <= 2^lr <= chunk, 2^lr dividing page_size).
// ctr[0] (ctr[1] too when reset): the persistent CTAs' row counter, 0 at launch; with reset the
// last CTA to finish sets both back to 0, so a counter kept between calls needs no zeroing.
cudaError_t spattn_bsa_launch_fwd(const bsa_params *p, const bsa_tmaps *tm, int dp, int bf16, int chunk,
                                  int *ctr, int reset, cudaStream_t st);
// TMA descriptors of the Hopper backward: Q and dO in boxes of 64 rows, K and V of 128 rows.
struct bsa_bwd_tmaps {
    CUtensorMap q, dout, k, v;
    CUtensorMap dk, dv;  // outputs, boxes of 64 rows (one consumer warpgroup's keys), when kv_tma
    int kv_tma;          // dK / dV written by TMA stores (dense or packed varlen; else per-element stores)
};
// Hopper backward (bsa_bwd.cu): p->sk is the key-major schedule at query tiles of 64 rows and
// key tiles of 128 keys (p->nqt = ceil(Sq / 64)), p->sq the query-major one at the same tiles
// (the ranks of the deterministic dQ order); p->lse2 / p->delta from spattn_bsa_launch_delta.
// dqacc: spattn_bsa_bwd90_acc_bytes (no zeroing), sem: spattn_bsa_bwd90_sem_bytes (the semaphores,
// the split rows' slots, the landed counts: bsa_bwd90_sem_bytes), zeroed beforehand (by
// spattn_bsa_launch_delta).
size_t spattn_bsa_bwd90_acc_bytes(const bsa_params *p, int dp);
size_t spattn_bsa_bwd90_sem_bytes(const bsa_params *p, int dp);
// kvbuf: bsa_bwd90_kvbuf_bytes (bsa_tiles.h; 0 when no key tile's list can be split); the fp32
// dK / dV sums of split rows, read only after being written (no zeroing).
// Split of long key-major lists over several CTAs (bsa_tiles.h); sem: per key tile, zeroed;
// slot: per key tile, its kvbuf slot or -1 (not split), written by spattn_bsa_launch_split_slots.
struct bsa_split {
    int splits, chunk;
    float *buf;
    int *sem;
    const int *slot;
};
// Slots of the split rows: slot[r] = the number of split candidates before row r (in row order)
// if row r is one and that number is below cap, else -1.  A candidate: more than chunk entries
// and more than twice the shortest list of the key tiles within 2 of it in its (b, kv head)
// (rows of nkt key tiles).  One CTA.
cudaError_t spattn_bsa_launch_split_slots(const int *cnt, long long rows, int nkt, int chunk, int cap, int *slot,
                                          cudaStream_t st);
// With p->vl.seq set (varlen backward): CTAs (sequence b, kv head, key tile of max_seqlen_kv)
// with b's lengths and TMA maps (p->vl.tm [B][4]: q, k, v, dO), Delta / lse2 [N][Tq], the dQ
// accumulator and semaphores per head over p->vl.ntile tiles (bsa_vl_qtile); dK / dV rows
// k0 + j (j < Skv_b), dQ rows q0 + i (i < Sq_b), dK / dV rows in [cu_kv[B], Tkv) zeroed; nothing
// written unless *p->vl.err == ~0.
// slot: a plan's split slots (bsa_plan_cuda.kv_slot), or NULL: then spattn_bsa_launch_split_slots
// writes them into the semaphore region first.  Launched right after spattn_bsa_launch_delta, as
// its programmatic dependent: everything the kernel reads before
// its griddepcontrol.wait (lists, counts, order, slots of a plan, varlen tables and maps) must be
// written by kernels launched before the Delta kernel.
cudaError_t spattn_bsa_launch_bwd90(const bsa_params *p, const bsa_bwd_tmaps *tm, int dp, int bf16, float *dqacc, int *sem,
                                    const int *slot, float *kvbuf, int det, cudaStream_t st);
// Paged backward (bsa_pages.cu): dk / dv pages [num_pages, page_size, Nkv, D] (strides dk_s /
// dv_s, elements) from the fp32 scratch sdk / sdv [B * max_kv][Nkv][D] of the PG backward (dK
// already scaled): every page row = the sum over the (sequence b, key) pairs mapping to it in
// ascending b, 0 for rows nobody uses.  Workspace: cnt, cur [num_pages], start [num_pages + 1]
// (int), list [B * max_pages] (int2; B * max_pages < 2^31).  Nothing unless *err == ~0; run after
// spattn_bsa_launch_vl_table and the backward.  D % 8 == 0.
struct bsa_pg_fold_args {
    const int4 *seq;
    const unsigned long long *err;
    const int *table;
    long long tab_s0, tab_s1, B, max_pages, page_size, num_pages, max_kv;
    int Nkv, D, bf16;
    const float *sdk, *sdv;
    int *cnt, *start, *cur;
    int2 *list;
    void *dk, *dv;
    long long dk_s[4], dv_s[4];
};
cudaError_t spattn_bsa_launch_pg_fold(const bsa_pg_fold_args *a, cudaStream_t st);
// Packed variable-length forward on the reference kernel (bsa_ref.cu; fp32, D > 128, views TMA
// cannot read): p is the varlen problem over [1, H, T, D] views (lse [1, N, T]), seq / err from
// spattn_bsa_launch_vl_prep; writes o / lse directly (nothing unless *err == ~0); synchronises.
// Paged K / V (p->seqs->table): k / v are the page tensors [num_pages, page_size, Nkv, D] as
// given, key rows read through the table (every page size; the table checked before).
spattn_status spattn_cuda_ref_bsa_fwd_varlen(const spattn_bsa_problem *p, const spattn_exec *ex, const int4 *seq,
                                             const unsigned long long *err);
// Delta = rowsum(dO * O) and lse2 = lse * log2(e) (+inf on empty rows), both [B*N*Sq].
// Varlen (p->vl.seq set): both [N][Tq] by packed token; tokens past cu_q[B] are not read (nor is
// anything when *p->vl.err != ~0).
// zero / zero_bytes: memory the kernel also sets to 0 (the semaphores of spattn_bsa_launch_bwd90;
// its dQ accumulator needs no zeroing: the first add of each query tile is a store).
cudaError_t spattn_bsa_launch_delta(const bsa_params *p, int bf16, float *delta, float *lse2, void *zero, size_t zero_bytes,
                                    cudaStream_t st);
}

#endif

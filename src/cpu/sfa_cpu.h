/*
 * Shared declarations of the CPU sfa path: the resolved problem (sfa_plan), the workspace
 * layout (one formula for spattn_cpu_sfa_workspace and for carving it up), and the table of
 * ISA-specific task kernels (sfa_kernels.inc, compiled once per ISA).
 *
 * Algorithm (see docs/runbooks/sparse_flash_attention.md):
 *   forward:  one task per (b, token, kv-group); the selected keys are gathered in chunks of
 *             SFA_NC rows into a per-thread fp32 buffer and shared by the G = N1/N2 heads.
 *   backward: token tiles of T tokens; each row's index entries are taken in chunks of E
 *             entries (at most kc = E * min(sbs, S2) expanded keys; T, E from shapes only, so
 *             the tile memory is bounded independently of K * sbs).  Per (tile, chunk): a query
 *             pass (parallel over (token, group)) adds the chunk's dQ terms into an fp32
 *             accumulator of the slot and stores the chunk's dS and P per (key, head); a scatter
 *             pass (parallel over fixed column blocks of dK/dV) adds dS^T Q and P^T dO into fp32
 *             accumulators, tokens and keys in ascending order.  Every accumulator element
 *             therefore sees the same sequence of additions for any thread count.
 */
#ifndef SPATTN_SFA_CPU_H
#define SPATTN_SFA_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "../core/internal.h"

#define SFA_NC 64     /* keys per gathered chunk */
#define SFA_CW 64     /* columns per scatter unit of the backward */
#define SFA_VW 16     /* head lanes are padded to a multiple of this */
#define SFA_ALIGN 64

typedef struct sfa_plan {
    const spattn_sfa_problem *p;
    int64_t G;      /* heads per kv group */
    int64_t Gp;     /* G rounded up to SFA_VW */
    int64_t Dq;     /* D + Dr */
    int64_t Dp, Drp, Dqp; /* D, Dr rounded up to SFA_VW; Dqp = Dp + Drp: every internal fp32
                             row is laid out [nope Dp | rope Drp] with zero padding, so the
                             kernels run on whole vectors only */
    int64_t kmax;   /* most expanded keys one row can hold: K * min(sbs, S2) */
    int nt;         /* threads */
    /* backward tiling */
    int64_t T;      /* tokens per tile */
    int64_t E;      /* index entries per chunk (E >= K: one chunk, the whole row) */
    int64_t nch;    /* chunks per row: ceil(K / E) */
    int64_t kc;     /* most expanded keys of one chunk: min(E, K) * min(sbs, S2) */
    int64_t ncol;   /* scatter units per kv group */
    int64_t nmark;  /* bytes of the backward's per-thread duplicate marks, one per key position
                       of one sequence: S2, or varlen min(max_seqlen_kv, Tkv) (a sequence's keys
                       are < its length <= Tkv: packed rows, or pages it uses once each), so a
                       generous max_seqlen_kv costs no memory */
} sfa_plan;

/* Per-thread buffers (floats unless noted), offsets in bytes from the thread's base. */
typedef struct sfa_thread_layout {
    size_t qt, dot, kc, vc, st, dpt, acc, row, ml, keys, mark, total;
} sfa_thread_layout;

/* Tile buffers of the backward, per (token-in-tile, group) slot.  x, dq and ld persist over
 * the chunks of a tile; dsp, keys and meta hold the current chunk. */
typedef struct sfa_tile_layout {
    size_t x;     /* [2G][Dqp] fp32: scale*q rows then dO rows */
    size_t dq;    /* [G][Dqp] fp32: dQ accumulators (unscaled), only when nch > 1 */
    size_t ld;    /* [2Gp] fp32: lse (INFINITY where P = 0), then Delta */
    size_t dsp;   /* [kc][2G] fp32: dS then P per key of the chunk */
    size_t keys;  /* [kc] int64 */
    size_t meta;  /* int64 n (keys of the chunk), int64 has_duplicates */
    size_t total; /* bytes of one slot */
} sfa_tile_layout;

/* Budget of the backward tile in bytes (default 32 MiB; shapes-only, so the tiling never
 * depends on the thread count).  Tests lower it to force many chunks on small problems; set it
 * only while no sfa call runs. */
extern size_t sfa_tile_bytes;

void sfa_plan_init(sfa_plan *pl, const spattn_sfa_problem *p, int backward, int num_threads);
sfa_thread_layout sfa_thread_layout_of(const sfa_plan *pl, int backward);
sfa_tile_layout sfa_tile_layout_of(const sfa_plan *pl);
/* Total workspace bytes; the offsets of its three parts (thread buffers, tile, accumulators). */
size_t sfa_workspace_parts(const sfa_plan *pl, int backward, size_t *off_tile, size_t *off_acc);

/* Expands index row (b, i, n2) into key positions (int64), applying padding, the partial
 * last block and the mode-3 limit.  Returns the count (<= kmax). */
int64_t sfa_expand_row(const sfa_plan *pl, int64_t b, int64_t i, int64_t n2, int64_t *keys);
/* The same for the row's entries [e0, e1) only (count <= (e1 - e0) * min(sbs, S2)). */
int64_t sfa_expand_range(const sfa_plan *pl, int64_t b, int64_t i, int64_t n2, int64_t e0,
                         int64_t e1, int64_t *keys);

/* ISA-specific task kernels (one definition per ISA variant in sfa_kernels.inc). */
typedef struct sfa_kernels {
    /* forward of (b, i, n2): writes o and lse of the group's heads */
    void (*fwd_task)(const sfa_plan *pl, int64_t b, int64_t i, int64_t n2, char *tb);
    /* backward query pass of (b, i, n2) for chunk `ch` (entries [ch*E, (ch+1)*E)): fills tile
     * slot `ts` (chunk 0 also loads the row's q, dO, lse, Delta; the last chunk writes
     * dq/dq_rope) */
    void (*bwd_query)(const sfa_plan *pl, int64_t b, int64_t i, int64_t n2, int64_t ch, char *tb,
                      char *ts);
    /* backward scatter of column unit `unit` of group n2 for the tile's tokens 0..ntok-1
     * (slot of token u: tile + (u * N2 + n2) * slot_bytes) into the batch's accumulators
     * dkacc [S2][N2][Dqp] and dvacc [S2][N2][Dp] (NULL when shared_kv) */
    void (*bwd_scatter)(const sfa_plan *pl, int64_t n2, int64_t unit, char *tile,
                        size_t slot_bytes, int64_t ntok, float *dkacc, float *dvacc);
} sfa_kernels;

const sfa_kernels *sfa_kernels_generic(void);
const sfa_kernels *sfa_kernels_avx2(void);
const sfa_kernels *sfa_kernels_avx512(void);
/* The table for this machine (follows spattn_cpu_isa_name()). */
const sfa_kernels *sfa_kernels_select(void);

#endif

/*
 * Paged K/V in the CPU bsa backward (spattn_bsa_bwd_varlen with a block table): which page
 * rows each sequence's dK/dV work items write, and in what order.
 *
 * dk / dv are pages like k / v: key j of sequence b gets row j % page_size of page
 * table[b, j / page_size]; rows no sequence uses get 0; a page shared by several sequences
 * gets the sum of their contributions (the sfa paged backward's semantics).
 *   - A page used by one sequence (the usual case) is written directly by that sequence's
 *     work items, exactly as a packed row: same kernel, same bits, no extra pass.
 *   - Shared pages accumulate in fp32 rows of the workspace (one per key-side row, like the sfa
 *     backward), rounded into dk / dv once at the end.  Sequences run in rounds: a sequence's
 *     round is one past the last round of any earlier sequence using one of its pages, so two
 *     sequences of one round never share a page (no two threads add into one row) and every
 *     row receives its additions in increasing b: bitwise the same for any thread count.
 * All of it is a pure function of the lengths and the table (never of the thread count).
 */
#ifndef SPATTN_CPU_BSA_PAGES_H
#define SPATTN_CPU_BSA_PAGES_H

#include <stdint.h>
#include <string.h>

#include "../core/seqs.h"

typedef struct bsa_pages {
    int64_t nrounds;
    int64_t *perm;    /* [B] sequences in (round, b) order */
    int64_t *rstart;  /* [B+1] position in perm where each round starts (rstart[nrounds] = B) */
    int64_t *round;   /* [B] round of each sequence */
    int64_t *off;     /* [B+1] key-tile offsets in perm order: tiles of perm[0 .. i-1] */
    int32_t *users;   /* [num_pages] sequences using the page */
    int32_t *cover;   /* [num_pages] rows of the page some sequence uses (always a prefix) */
    int32_t *last;    /* [num_pages] 1 + round of the last sequence so far using the page */
    float *acc_dk, *acc_dv; /* [num_pages * page_size, Nkv, D] fp32; rows of shared pages only */
} bsa_pages;

static inline size_t bsa_pages_al(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Workspace bytes of the paged backward (0 without a table): shapes only (B, num_pages,
 * page_size, Nkv, D), as spattn_bsa_varlen_workspace_size promises. */
static inline size_t bsa_pages_bytes(const spattn_bsa_problem *p) {
    const spattn_seqs *s = p->seqs;
    if (!s || !s->table) return 0;
    size_t B = (size_t)s->B, np = (size_t)s->num_pages;
    size_t acc = (size_t)(np * (size_t)s->page_size) * (size_t)p->Nkv * (size_t)p->D;
    return 64 + bsa_pages_al(sizeof(int64_t) * (4 * B + 2)) + bsa_pages_al(sizeof(int32_t) * 3 * np) +
           2 * bsa_pages_al(sizeof(float) * acc);
}

/* Carves the arrays out of `mem` (bsa_pages_bytes of it) and fills the schedule; offk[b] are
 * the key-tile offsets in b order (tiles of sequence b: offk[b+1] - offk[b]). */
static inline void bsa_pages_plan(const spattn_bsa_problem *p, void *mem, const int64_t *offk,
                                  bsa_pages *pg) {
    const spattn_seqs *s = p->seqs;
    const int64_t B = s->B, np = s->num_pages, ps = s->page_size;
    char *c = (char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    pg->perm = (int64_t *)c;
    pg->rstart = pg->perm + B;
    pg->round = pg->rstart + B + 1;
    pg->off = pg->round + B;
    c += bsa_pages_al(sizeof(int64_t) * (size_t)(4 * B + 2));
    pg->users = (int32_t *)c;
    pg->cover = pg->users + np;
    pg->last = pg->cover + np;
    c += bsa_pages_al(sizeof(int32_t) * 3 * (size_t)np);
    pg->acc_dk = (float *)c;
    pg->acc_dv = pg->acc_dk + (size_t)(np * ps) * (size_t)p->Nkv * (size_t)p->D;
    memset(pg->users, 0, sizeof(int32_t) * 3 * (size_t)np);
    pg->nrounds = 1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = spattn_seq_len_kv(s, b), need = (len + ps - 1) / ps;
        int64_t r = 0;
        for (int64_t j = 0; j < need; j++) {
            int32_t id = s->table[b * s->tab_s0 + j * s->tab_s1];
            if (pg->last[id] > r) r = pg->last[id];
        }
        for (int64_t j = 0; j < need; j++) {
            int32_t id = s->table[b * s->tab_s0 + j * s->tab_s1];
            int64_t rows = len - j * ps < ps ? len - j * ps : ps;
            pg->last[id] = (int32_t)(r + 1);
            pg->users[id]++;
            if (rows > pg->cover[id]) pg->cover[id] = (int32_t)rows;
        }
        pg->round[b] = r;
        if (r + 1 > pg->nrounds) pg->nrounds = r + 1;
    }
    /* counting sort by round, stable in b */
    for (int64_t r = 0; r <= pg->nrounds; r++) pg->rstart[r] = 0;
    for (int64_t b = 0; b < B; b++) pg->rstart[pg->round[b] + 1]++;
    for (int64_t r = 0; r < pg->nrounds; r++) pg->rstart[r + 1] += pg->rstart[r];
    /* rstart[r] is the fill cursor of round r; it ends at the start of round r + 1 */
    for (int64_t b = 0; b < B; b++) {
        int64_t r = pg->round[b];
        pg->perm[pg->rstart[r]++] = b;
    }
    for (int64_t r = pg->nrounds; r > 0; r--) pg->rstart[r] = pg->rstart[r - 1];
    pg->rstart[0] = 0;
    pg->off[0] = 0;
    for (int64_t i = 0; i < B; i++) {
        int64_t b = pg->perm[i];
        pg->off[i + 1] = pg->off[i] + offk[b + 1] - offk[b];
    }
}

#endif

// Paged K / V loads shared by the Hopper forward (bsa_fwd.cu) and backward (bsa_bwd.cu): a
// chunk of U keys of one sequence read page by page in TMA slabs of 2^lr rows (see bsa_fwd.cu).
#ifndef SPATTN_BSA_PAGED_CUH
#define SPATTN_BSA_PAGED_CUH

#include "hopper/hopper.cuh"

namespace {

// The U / R slabs of the chunk at sequence-local key `key` into dst (one U-row chunk
// slot of a K or V stage: box x at dst + x * BN * 128), completing on bar.  pool: the page pool's
// map; tail: the same with the page cut to the rows of the sequence's last page; trow: the
// sequence's table row (slots < ceil(skv / ps) only are read: the table was checked, so their ids
// are in range).
template <int NBOX, int BN>
__device__ __forceinline__ void bsa_load_paged(unsigned char *dst, const CUtensorMap *pool, const CUtensorMap *tail,
                                               int key, int U, int lr, int hk, const int *trow, long long ts1, int ps,
                                               int skv, uint64_t *bar) {
    for (int sl = 0; sl < (U >> lr); sl++) {
        const int j0 = key + (sl << lr);  // no overflow: key + U <= 2^31 (key < skv, U | 2^31)
        const int slot = j0 / ps;
        int row = j0 - slot * ps, pg = 0;
        const CUtensorMap *m = pool;
        if (j0 >= skv) {
            row = ps;  // outside every page: the box is zero-filled
        } else {
            pg = trow[slot * ts1];
            if (skv - (j0 - row) <= ps) m = tail;  // the sequence's last page
        }
#pragma unroll
        for (int x = 0; x < NBOX; x++) hop::tma_load_4d(dst + x * BN * 128 + (sl << lr) * 128, m, x * 64, hk, row, pg, bar);
    }
}

}  // namespace

#endif

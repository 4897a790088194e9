/* Input generation against the token-level definitions of cases/README.md, and the work
 * count. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/dtype.h"
#include "gen.h"
#include "testutil.h"

static sp_case bsa(int64_t Sq, int64_t Skv, int64_t bx, int64_t by, int pattern) {
    sp_case c;
    memset(&c, 0, sizeof c);
    c.op = SP_OP_BSA;
    c.dtype = SPATTN_DTYPE_F16;
    c.B = 2;
    c.N = 3;
    c.Nkv = 3;
    c.D = 8;
    c.Sq = Sq;
    c.Skv = Skv;
    c.bx = bx;
    c.by = by;
    c.pattern = pattern;
    c.scaled_by = 1.0;
    return c;
}

/* Does block (i, j) hold a token pair with lo(q) <= k <= hi(q)?  Brute force over tokens. */
static int block_has(const sp_case *c, int64_t i, int64_t j, int64_t dlo, int64_t dhi) {
    for (int64_t q = i * c->bx; q < (i + 1) * c->bx && q < c->Sq; q++)
        for (int64_t k = j * c->by; k < (j + 1) * c->by && k < c->Skv; k++)
            if (k >= q + dlo && k <= q + dhi) return 1;
    return 0;
}

static void check_band(int pattern, int64_t Sq, int64_t Skv, int64_t bx, int64_t by, int64_t W) {
    sp_case c = bsa(Sq, Skv, bx, by, pattern);
    c.window = W;
    int64_t nbx = (Sq + bx - 1) / bx, nby = (Skv + by - 1) / by, off = Skv - Sq;
    uint8_t *m = malloc((size_t)(c.B * c.N * nbx * nby));
    sp_gen_mask(&c, m);
    int bad = 0;
    for (int64_t bn = 0; bn < c.B * c.N; bn++)
        for (int64_t i = 0; i < nbx; i++)
            for (int64_t j = 0; j < nby; j++) {
                int want = pattern == SP_PAT_CAUSAL ? block_has(&c, i, j, -((int64_t)1 << 40), off)
                                                    : block_has(&c, i, j, off - W, off);
                bad += m[(bn * nbx + i) * nby + j] != want;
            }
    TU_CHECK(bad == 0, "%s Sq=%lld Skv=%lld bx=%lld by=%lld W=%lld: %d wrong blocks",
             pattern == SP_PAT_CAUSAL ? "causal" : "window", (long long)Sq, (long long)Skv,
             (long long)bx, (long long)by, (long long)W, bad);
    free(m);
}

int main(void) {
    /* Causal and window against the token-level definition, incl. partial blocks and Sq != Skv. */
    check_band(SP_PAT_CAUSAL, 100, 100, 16, 24, 0);
    check_band(SP_PAT_CAUSAL, 96, 130, 48, 80, 0);
    check_band(SP_PAT_CAUSAL, 130, 70, 32, 16, 0); /* off < 0: leading rows attend nothing */
    check_band(SP_PAT_CAUSAL, 37, 37, 1, 1, 0);
    check_band(SP_PAT_WINDOW, 200, 200, 16, 32, 20);
    check_band(SP_PAT_WINDOW, 150, 210, 48, 80, 64);
    check_band(SP_PAT_WINDOW, 64, 64, 8, 8, 0);

    /* Dense is all ones. */
    {
        sp_case c = bsa(50, 70, 16, 16, SP_PAT_DENSE);
        uint8_t m[2 * 3 * 4 * 5];
        sp_gen_mask(&c, m);
        int ones = 0;
        for (int i = 0; i < 120; i++) ones += m[i];
        TU_CHECK(ones == 120, "dense mask is all ones");
    }

    /* Bigbird: global rows/columns, the window band, and at most `rand` extra blocks a row. */
    {
        sp_case c = bsa(512, 512, 32, 32, SP_PAT_BIGBIRD);
        c.glob = 1;
        c.win = 1;
        c.rnd = 3;
        int64_t nb = 16;
        uint8_t *m = malloc((size_t)(6 * nb * nb));
        sp_gen_mask(&c, m);
        int bad = 0, extra_ok = 1, some_extra = 0;
        for (int64_t bn = 0; bn < 6; bn++)
            for (int64_t i = 0; i < nb; i++) {
                int extra = 0;
                for (int64_t j = 0; j < nb; j++) {
                    int v = m[(bn * nb + i) * nb + j];
                    int base = i < 1 || j < 1 || (j >= i - 1 && j <= i + 1);
                    if (base && !v) bad++;
                    if (!base && v) extra++;
                }
                if (extra > 3) extra_ok = 0;
                some_extra += extra;
            }
        TU_CHECK(bad == 0, "bigbird global + window blocks set (%d missing)", bad);
        TU_CHECK(extra_ok && some_extra > 0, "bigbird random blocks: <= 3 extra a row, some present");
        /* Reproducible; a different seed gives a different mask. */
        uint8_t *m2 = malloc((size_t)(6 * nb * nb));
        sp_gen_mask(&c, m2);
        TU_CHECK(!memcmp(m, m2, (size_t)(6 * nb * nb)), "mask reproducible");
        c.seed = 1;
        sp_gen_mask(&c, m2);
        TU_CHECK(memcmp(m, m2, (size_t)(6 * nb * nb)) != 0, "other seed, other mask");
        free(m);
        free(m2);
    }

    /* Random: density near p. */
    {
        sp_case c = bsa(4096, 4096, 16, 16, SP_PAT_RANDOM);
        c.density = 0.3;
        int64_t n = 6 * 256 * 256;
        uint8_t *m = malloc((size_t)n);
        sp_gen_mask(&c, m);
        int64_t ones = 0;
        for (int64_t i = 0; i < n; i++) ones += m[i];
        double p = (double)ones / (double)n;
        TU_CHECK(p > 0.29 && p < 0.31, "random density %.4f near 0.3", p);
        free(m);
    }

    /* Top-k indices: distinct, allowed, newest key included, count min(K, lim+1), -1 after,
     * random order. */
    static const struct { int64_t S1, S2, K, sbs; int mode; } ic[] = {
        {40, 64, 24, 1, 3}, {64, 32, 16, 1, 3}, {24, 50, 16, 4, 0}, {33, 100, 100, 1, 3},
        {16, 16, 3, 1, 0}, {20, 70, 5, 16, 3}};
    for (size_t t = 0; t < sizeof ic / sizeof ic[0]; t++) {
        sp_case c;
        memset(&c, 0, sizeof c);
        c.op = SP_OP_SFA;
        c.B = 2;
        c.S1 = ic[t].S1;
        c.S2 = ic[t].S2;
        c.N1 = 4;
        c.N2 = 2;
        c.K = ic[t].K;
        c.sbs = ic[t].sbs;
        c.mode = ic[t].mode;
        int64_t n = c.B * c.S1 * c.N2 * c.K;
        int32_t *idx = malloc((size_t)n * sizeof *idx);
        TU_CHECK(sp_gen_indices(&c, idx) == 0, "indices generated");
        int bad = 0, unsorted = 0;
        double pairs = 0.0;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t s = 0; s < c.S1; s++)
                for (int64_t h = 0; h < c.N2; h++) {
                    const int32_t *row = idx + ((b * c.S1 + s) * c.N2 + h) * c.K;
                    int64_t lim = c.mode == 3 ? c.S2 - c.S1 + s : c.S2 - 1;
                    int64_t lb = lim < 0 ? -1 : lim / c.sbs;
                    int64_t want = lim < 0 ? 0 : (c.K < lb + 1 ? c.K : lb + 1);
                    int has_newest = want == 0;
                    for (int64_t k = 0; k < c.K; k++) {
                        if (k < want) {
                            if (row[k] < 0 || row[k] > lb) bad++;
                            if (row[k] == lb) has_newest = 1;
                            for (int64_t u = 0; u < k; u++) bad += row[u] == row[k];
                            if (k > 0 && row[k] < row[k - 1]) unsorted = 1;
                            int64_t lo = (int64_t)row[k] * c.sbs, hi = lo + c.sbs - 1;
                            if (hi > lim) hi = lim;
                            if (hi > c.S2 - 1) hi = c.S2 - 1;
                            pairs += (double)(hi - lo + 1) * (double)(c.N1 / c.N2);
                        } else if (row[k] != -1) {
                            bad++;
                        }
                    }
                    bad += !has_newest;
                }
        TU_CHECK(bad == 0, "indices case %zu: %d violations", t, bad);
        TU_CHECK(unsorted || c.K < 3, "indices case %zu in random order", t);
        sp_inputs in;
        memset(&in, 0, sizeof in);
        in.idx = idx;
        TU_CHECK(sp_pairs(&c, &in) == pairs, "sfa pairs exact (case %zu: %g vs %g)", t,
                 sp_pairs(&c, &in), pairs);
        if (c.sbs == 1)
            TU_CHECK(sp_pairs_estimate(&c) == pairs, "sfa pair estimate exact for sbs=1");
        free(idx);
    }

    /* bsa pairs and FLOPs. */
    {
        sp_case c = bsa(100, 130, 16, 24, SP_PAT_DENSE);
        sp_inputs in;
        char e[256];
        TU_CHECK(sp_inputs_make(&c, &in, e, sizeof e) == 0, "inputs");
        TU_CHECK(sp_pairs(&c, &in) == 2.0 * 3 * 100 * 130, "dense pairs");
        TU_CHECK(sp_flops(&c, 1000.0, 0) == 4.0 * 8 * 1000 && sp_flops(&c, 1000.0, 1) == 10.0 * 8 * 1000,
                 "bsa flops");
        sp_inputs_free(&in);
        c = bsa(37, 37, 5, 7, SP_PAT_CAUSAL);
        c.bx = 1;
        c.by = 1;
        TU_CHECK(sp_inputs_make(&c, &in, e, sizeof e) == 0, "inputs");
        TU_CHECK(sp_pairs(&c, &in) == 6.0 * 37 * 38 / 2, "token-causal pairs");
        sp_inputs_free(&in);
        /* the estimate counts the generated mask row by row (never held whole): the exact count,
         * bitwise, for every pattern and partial edge blocks */
        for (int pat = SP_PAT_DENSE; pat <= SP_PAT_RANDOM; pat++) {
            c = bsa(100, 77, 16, 24, pat);
            c.window = 20;
            c.glob = 1;
            c.win = 1;
            c.rnd = 2;
            c.density = 0.4;
            c.seed = 7;
            TU_CHECK(sp_inputs_make(&c, &in, e, sizeof e) == 0, "inputs");
            TU_CHECK(sp_pairs_estimate(&c) == sp_pairs(&c, &in), "bsa pair estimate exact (pattern %d: %g vs %g)",
                     pat, sp_pairs_estimate(&c), sp_pairs(&c, &in));
            sp_inputs_free(&in);
        }
        sp_case s;
        memset(&s, 0, sizeof s);
        s.op = SP_OP_SFA;
        s.D = 512;
        s.Dr = 64;
        TU_CHECK(sp_flops(&s, 10.0, 0) == 2.0 * (576 + 512) * 10 &&
                     sp_flops(&s, 10.0, 1) == 2.0 * (3 * 576 + 2 * 512) * 10, "sfa flops");
    }

    /* Normal values: rounded to the dtype, about N(0, 1), reproducible per stream. */
    {
        int64_t n = 200000;
        uint16_t *h = malloc((size_t)n * 2), *h2 = malloc((size_t)n * 2);
        sp_gen_normal(0, 1, SPATTN_DTYPE_BF16, h, n);
        sp_gen_normal(0, 1, SPATTN_DTYPE_BF16, h2, n);
        TU_CHECK(!memcmp(h, h2, (size_t)n * 2), "normal values reproducible");
        sp_gen_normal(0, 2, SPATTN_DTYPE_BF16, h2, n);
        TU_CHECK(memcmp(h, h2, (size_t)n * 2) != 0, "streams differ");
        double s1 = 0, s2 = 0;
        for (int64_t i = 0; i < n; i++) {
            double x = spattn_bf16_to_f32(h[i]);
            s1 += x;
            s2 += x * x;
        }
        TU_CHECK(s1 / n > -0.01 && s1 / n < 0.01 && s2 / n > 0.98 && s2 / n < 1.02,
                 "mean %.4f var %.4f", s1 / n, s2 / n);
        float *f = malloc((size_t)n * 4);
        sp_gen_normal(0, 1, SPATTN_DTYPE_F32, f, n);
        int same = 1;
        for (int64_t i = 0; i < n; i++) same &= spattn_f32_to_bf16(f[i]) == h[i];
        TU_CHECK(same, "bf16 values are the fp32 values rounded");
#ifdef _OPENMP
        /* Chunked generation: identical values for any thread count. */
        omp_set_num_threads(1);
        sp_gen_normal(5, 3, SPATTN_DTYPE_F16, h, n);
        omp_set_num_threads(3);
        sp_gen_normal(5, 3, SPATTN_DTYPE_F16, h2, n);
        TU_CHECK(!memcmp(h, h2, (size_t)n * 2), "normal values independent of the thread count");
#endif
        free(h);
        free(h2);
        free(f);
    }
    return tu_summary("test_cli_gen");
}

/*
 * libFuzzer harness for the .cases parser (tools/cases.c) and what the CLI does next with a
 * parsed case: scaling (sp_case_scale), the shape string, the work estimates and, for small
 * cases, the mask / index generators.  Oracles beyond ASan + UBSan: a rejected text has a
 * "file:line: " message; every accepted case has positive sizes before and after scaling;
 * generated masks are 0/1 and generated indices lie in [-1, ceil(S2/sbs)).
 *
 * Run: build-fuzz/tests/fuzz/fuzz_cases -max_total_time=60 -dict=tests/fuzz/cases.dict \
 *      NEW_DIR tests/fuzz/corpus/cases
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "gen.h"

static void check(int ok, const char *what, const sp_case *c) {
    if (ok) return;
    fprintf(stderr, "fuzz_cases: %s (case %s)\n", what, c->name);
    abort();
}

/* Loop trips of sp_pairs_estimate: mask entries (bsa) or query rows (sfa). */
static double estimate_work(const sp_case *c) {
    if (c->op == SP_OP_BSA) {
        double nbx = (double)((c->Sq + c->bx - 1) / c->bx), nby = (double)((c->Skv + c->by - 1) / c->by);
        return (double)c->B * (double)c->N * nbx * nby;
    }
    if (!c->varlen) return (double)c->S1;
    double rows = 0.0;
    for (int64_t b = 0; b < c->B; b++) rows += (double)c->lens[b];
    return rows;
}

static void check_case(const sp_case *c) {
    char shape[512];
    sp_case_shape_str(c, shape, sizeof shape);
    check(c->B >= 1 && c->D >= 1, "B or D < 1", c);
    if (c->op == SP_OP_BSA) {
        check(c->N >= 1 && c->Nkv >= 1 && c->N % c->Nkv == 0, "bad N / Nkv", c);
        check(c->Sq >= 1 && c->Skv >= 1 && c->bx >= 1 && c->by >= 1, "bsa size < 1", c);
    } else {
        check(c->S1 >= 1 && c->S2 >= 1 && c->K >= 1 && c->N1 % c->N2 == 0, "sfa size < 1", c);
        check(c->sbs >= 1 && c->sbs <= 128 && !(c->sbs & (c->sbs - 1)), "bad sbs", c);
    }
    /* The estimate walks the generated mask (bsa) or the query rows (sfa): its time grows with
     * them (up to 2^34 mask entries), which is the CLI's to pay for a case it then runs, not the
     * fuzzer's within its 20 s an input (7 scales x 8 cases) */
    double pairs = (double)c->B * 1e6;
    if (estimate_work(c) <= (1 << 20)) {
        pairs = sp_pairs_estimate(c);
        check(pairs >= 0.0, "negative pair estimate", c);
    }
    (void)sp_flops(c, pairs, 0);
    (void)sp_flops(c, pairs, 1);
}

static void generate(const sp_case *c) {
    if (c->op == SP_OP_BSA) {
        int64_t nbx = (c->Sq + c->bx - 1) / c->bx, nby = (c->Skv + c->by - 1) / c->by;
        if (c->B * c->N > 16 || nbx * nby > 1024) return;
        size_t n = (size_t)(c->B * c->N * nbx * nby);
        uint8_t *m = malloc(n);
        sp_gen_mask(c, m);
        for (size_t i = 0; i < n; i++) check(m[i] <= 1, "mask value not 0/1", c);
        free(m);
    } else {
        if (c->B * c->S1 * c->N2 > 64 || c->K > 256 || c->S2 > 1024) return;
        /* varlen: [Tq, N2, K] rows, Tq = the sum of the lengths (<= B * S1 = B * max) */
        int64_t rows = c->B * c->S1;
        if (c->varlen) {
            rows = 0;
            for (int64_t b = 0; b < c->B; b++) rows += c->lens[b];
        }
        size_t n = (size_t)(rows * c->N2 * c->K);
        int32_t *idx = malloc((n ? n : 1) * sizeof *idx);
        if (sp_gen_indices(c, idx) == 0) {
            int64_t nblk = (c->S2 + c->sbs - 1) / c->sbs;
            for (size_t i = 0; i < n; i++)
                check(idx[i] >= -1 && idx[i] < nblk, "generated index out of range", c);
        }
        free(idx);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    sp_case_list l = {0};
    char err[256];
    err[0] = '\0';
    if (sp_cases_parse_text("fuzz.cases", text, &l, err, sizeof err) != 0) {
        if (strncmp(err, "fuzz.cases:", 11) != 0) {
            fprintf(stderr, "fuzz_cases: error without file:line: '%s'\n", err);
            abort();
        }
    }
    static const double kScales[] = {1.0, 0.5, 0.25, 1.0 / 16, 1e-3, 1e-9};
    for (int i = 0; i < l.n && i < 8; i++) {
        check_case(&l.v[i]);
        for (int s = 0; s < 6; s++) {
            sp_case sc;
            sp_case_scale(&l.v[i], kScales[s], &sc);
            check_case(&sc);
            generate(&sc);
        }
    }
    sp_case_list_free(&l);
    free(text);
    return 0;
}

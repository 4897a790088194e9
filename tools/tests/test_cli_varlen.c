/* Varlen / paged cases: parsing (good lines, every bad combination names file:line), the
 * length generator, scaling, the page tables and NaN-filled unused page rows, and the public
 * suites cases/bsa_varlen.cases and cases/sfa_varlen.cases (cases/README.md, "Varlen and
 * paged cases"). */
#include <math.h>
#include <string.h>

#include "cases.h"
#include "core/dtype.h"
#include "gen.h"
#include "testutil.h"

static char err[1024];

static int parse(const char *text, sp_case_list *l) {
    memset(l, 0, sizeof *l);
    err[0] = '\0';
    return sp_cases_parse_text("t.cases", text, l, err, sizeof err);
}

static void expect_error(const char *text, const char *what) {
    sp_case_list l;
    int rc = parse(text, &l);
    TU_CHECK(rc == -1 && strncmp(err, "t.cases:1: ", 11) == 0 && strstr(err, what),
             "'%s' rejected with '%s', got '%s'", text, what, err);
    sp_case_list_free(&l);
}

static int64_t sum(const int32_t *v, int64_t n) {
    int64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

/* Table slots in use hold distinct ids of [0, num_pages) (one page spare), others -1; the
 * paged k holds the packed rows where the table says and NaN in every other row. */
static void check_pages(const sp_case *c) {
    sp_inputs in;
    char e[256];
    TU_CHECK(sp_inputs_make(c, &in, e, sizeof e) == 0, "inputs of %s: %s", c->name, e);
    int64_t used = 0, bad = 0;
    char *seen = calloc((size_t)in.num_pages, 1);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < in.max_pages; s++) {
            int32_t p = in.table[b * in.max_pages + s];
            int in_use = s < (c->kvlens[b] + c->page - 1) / c->page;
            if (!in_use) {
                bad += p != -1;
                continue;
            }
            bad += p < 0 || p >= in.num_pages || seen[p];
            if (p >= 0 && p < in.num_pages) seen[p] = 1;
            used++;
        }
    TU_CHECK(bad == 0 && used + 1 == in.num_pages, "%s: table of %lld pages, %lld used, %lld bad",
             c->name, (long long)in.num_pages, (long long)used, (long long)bad);
    const int64_t width = in.nk / in.Tkv, rows = in.num_pages * c->page;
    int64_t nan_rows = 0, wrong = 0;
    for (int64_t r = 0; r < rows; r++) nan_rows += isnan(sp_load(in.kpage, in.dtype, r * width));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->kvlens[b]; j++) {
            int64_t row = in.table[b * in.max_pages + j / c->page] * c->page + j % c->page;
            wrong += memcmp((char *)in.kpage + row * width * in.esize,
                            (char *)in.k + (in.cu_kv[b] + j) * width * in.esize,
                            (size_t)width * in.esize) != 0;
        }
    TU_CHECK(wrong == 0 && nan_rows == rows - in.Tkv, "%s: %lld rows misplaced, %lld NaN rows of %lld",
             c->name, (long long)wrong, (long long)nan_rows, (long long)(rows - in.Tkv));
    free(seen);
    sp_inputs_free(&in);
}

int main(void) {
    sp_case_list l;
    const char *good =
        "v1 lens=3,0,5*2,1 N=2 Nkv=1 D=16 bx=4 by=8 pattern=causal dtype=fp16\n"
        "v2 lens=4,9 kvlens=0,20 page=8 N=2 D=16 bx=4 by=8 pattern=dense dtype=bf16\n"
        "v3 nseq=7 total=100 lens_seed=5 ctx=3 N1=4 N2=2 D=16 Dr=8 K=6 mode=3 dtype=fp16\n"
        "v4 nseq=7 total=100 lens_seed=5 N1=4 N2=2 D=16 Dr=8 K=6 mode=3 dtype=fp16\n";
    TU_CHECK(parse(good, &l) == 0 && l.n == 4, "good varlen text parses: %s", err);
    if (l.n == 4) {
        const sp_case *a = &l.v[0], *b = &l.v[1], *c = &l.v[2], *d = &l.v[3];
        TU_CHECK(a->varlen && a->B == 5 && a->Sq == 5 && a->Skv == 5 && a->page == 0 &&
                 a->lens[2] == 5 && a->lens[3] == 5 && a->lens[1] == 0 && a->kvlens[4] == 1,
                 "v1: B, max lengths, L*n");
        TU_CHECK(b->B == 2 && b->Sq == 9 && b->Skv == 20 && b->kvlens[0] == 0 && b->page == 8,
                 "v2: kvlens and page");
        TU_CHECK(c->op == SP_OP_SFA && c->B == 7 && sum(c->lens, 7) == 100 &&
                 sum(c->kvlens, 7) == 121 && c->S2 == c->S1 + 3, "v3: generator sums, ctx");
        TU_CHECK(!memcmp(c->lens, d->lens, sizeof c->lens), "the generator is deterministic");
    }
    sp_case_list_free(&l);
    /* Zero-length sequences come out of the generator too (many sequences, few tokens). */
    TU_CHECK(parse("z nseq=64 total=40 N1=1 N2=1 D=8 Dr=0 K=2 mode=0 dtype=fp32\n", &l) == 0,
             "generator parses");
    if (l.n == 1) {
        int zeros = 0;
        for (int b = 0; b < 64; b++) zeros += l.v[0].lens[b] == 0;
        TU_CHECK(zeros > 0 && sum(l.v[0].lens, 64) == 40, "zero lengths generated (%d)", zeros);
    }
    sp_case_list_free(&l);

    const char *base = " N=1 D=16 bx=16 by=16 pattern=causal dtype=fp16";
    static const struct { const char *keys, *what; } bad[] = {
        {"lens=3,4 B=2", "'B' is derived"},
        {"lens=3,4 Sq=4", "'Sq' is derived"},
        {"lens=3,4 nseq=2 total=7", "exclude each other"},
        {"lens=3,4 kvlens=1", "kvlens= has 1 entries"},
        {"lens=3,4 kvlens=1,2 ctx=3", "ctx= and kvlens="},
        {"lens=3,4 total=7", "belong to nseq="},
        {"nseq=2 total=7 kvlens=1,2", "kvlens= needs lens="},
        {"nseq=2", "missing key 'total'"},
        {"nseq=0 total=7", "nseq=0 out of range"},
        {"lens=0,0", "must each total 1"},
        {"lens=16777216,1", "must each total 1 .. 2^24"},
        {"nseq=2 total=16777217", "total=16777217 out of range"},
        {"lens=1,,2", "bad value '1,,2' for key 'lens'"},
        {"lens=2*0", "bad value"},
        {"lens=3,4 page=0", "page=0 out of range"},
        {"B=1 Sq=4 Skv=4 page=16", "belongs to a varlen case"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "x %s%s\n", bad[i].keys, base);
        expect_error(text, bad[i].what);
    }

    /* Scaling: zeros and short sequences stay, long ones shrink (not below a block), equal
     * query / key lengths stay equal, longer keys stay longer. */
    TU_CHECK(parse("s lens=0,10,64,640,1000 kvlens=5,10,64,640,2000 N=2 D=16 bx=16 by=16 "
                   "pattern=causal dtype=fp16\n", &l) == 0, "scaling case parses");
    if (l.n == 1) {
        sp_case s;
        sp_case_scale(&l.v[0], 1.0 / 16, &s);
        TU_CHECK(s.lens[0] == 0 && s.kvlens[0] == 5 && s.lens[1] == 10 && s.lens[2] == 16 &&
                 s.kvlens[2] == 16 && s.lens[3] == 40 && s.kvlens[3] == 40 && s.lens[4] == 63 &&
                 s.kvlens[4] == 125 && s.Sq == 63 && s.Skv == 125 && s.scaled_by == 1.0 / 16,
                 "scaled lengths %d %d %d %d %d / %d", s.lens[0], s.lens[1], s.lens[2], s.lens[3],
                 s.lens[4], s.kvlens[4]);
    }
    sp_case_list_free(&l);

    /* Pages: a shuffled table and NaN in the rows no sequence uses (bsa and sfa). */
    TU_CHECK(parse("p1 lens=30,0,17,64 kvlens=33,5,0,64 page=16 N=2 Nkv=1 D=8 bx=8 by=8 "
                   "pattern=dense dtype=bf16\n"
                   "p2 nseq=9 total=300 lens_seed=2 ctx=7 page=32 N1=2 N2=1 D=16 Dr=8 K=4 mode=3 "
                   "dtype=fp16 kv=separate\n", &l) == 0 && l.n == 2, "paged cases parse: %s", err);
    for (int i = 0; i < l.n; i++) check_pages(&l.v[i]);
    sp_case_list_free(&l);

    /* One sequence: the same indices as the dense B=1 case (one generator, same order). */
    TU_CHECK(parse("d B=1 S1=40 S2=64 N1=2 N2=2 D=8 Dr=0 K=9 sbs=2 mode=3 dtype=fp16 seed=4\n"
                   "v lens=40 kvlens=64 N1=2 N2=2 D=8 Dr=0 K=9 sbs=2 mode=3 dtype=fp16 seed=4\n",
                   &l) == 0 && l.n == 2, "one-sequence pair parses");
    if (l.n == 2) {
        int32_t a[40 * 2 * 9], b[40 * 2 * 9];
        sp_gen_indices(&l.v[0], a);
        sp_gen_indices_varlen(&l.v[1], b);
        TU_CHECK(!memcmp(a, b, sizeof a), "one-sequence varlen indices equal the dense ones");
    }
    sp_case_list_free(&l);

    /* The public suites: at least 6 cases each, all varlen, covering what issue 14 asks. */
    static const char *const suites[] = {SPATTN_TEST_CASES_DIR "/bsa_varlen.cases",
                                         SPATTN_TEST_CASES_DIR "/sfa_varlen.cases"};
    for (int s = 0; s < 2; s++) {
        memset(&l, 0, sizeof l);
        TU_CHECK(sp_cases_load(suites[s], &l, err, sizeof err) == 0, "%s: %s", suites[s], err);
        int paged = 0, empty = 0, gqa = 0, fp16 = 0, bf16 = 0, many = 0, allv = 1;
        for (int i = 0; i < l.n; i++) {
            const sp_case *c = &l.v[i];
            allv &= c->varlen && c->op == s;
            paged += c->page > 0;
            gqa += s == 0 ? c->Nkv < c->N : c->N2 > 1;
            fp16 += c->dtype == SPATTN_DTYPE_F16;
            bf16 += c->dtype == SPATTN_DTYPE_BF16;
            many += c->nseq >= 32;
            for (int64_t b = 0; b < c->nseq; b++) empty += c->lens[b] == 0 || c->kvlens[b] == 0;
        }
        TU_CHECK(l.n >= 6 && allv && paged && empty && gqa && fp16 && bf16 && many,
                 "%s: %d cases (paged %d, empty seqs %d, gqa %d, fp16 %d, bf16 %d, many %d)",
                 suites[s], l.n, paged, empty, gqa, fp16, bf16, many);
        sp_case_list_free(&l);
    }
    return tu_summary("test_cli_varlen");
}

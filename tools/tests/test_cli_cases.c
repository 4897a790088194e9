/* Case-file parsing: good lines, every kind of bad line (the message names file:line), the
 * public suites, and scaling. */
#include <string.h>

#include "cases.h"
#include "testutil.h"

static char err[1024];

/* Parses `text` as file "t.cases"; returns the parser's result. */
static int parse(const char *text, sp_case_list *l) {
    memset(l, 0, sizeof *l);
    err[0] = '\0';
    return sp_cases_parse_text("t.cases", text, l, err, sizeof err);
}

/* A bad text must fail with "t.cases:LINE:" and a message containing `what`. */
static void expect_error(const char *text, int line, const char *what) {
    sp_case_list l;
    int rc = parse(text, &l);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "t.cases:%d: ", line);
    TU_CHECK(rc == -1, "rejected: %s", text);
    TU_CHECK(strncmp(err, prefix, strlen(prefix)) == 0, "message '%s' starts with '%s'", err, prefix);
    TU_CHECK(strstr(err, what) != NULL, "message '%s' mentions '%s'", err, what);
    sp_case_list_free(&l);
}

int main(void) {
    sp_case_list l;
    /* Good lines, comments, blank lines. */
    const char *good =
        "# comment line\n"
        "\n"
        "a1  B=2 N=8 Sq=1000 Skv=1024 D=128 bx=48 by=80 pattern=causal dtype=fp16  # trailing\n"
        "a2 B=1 N=4 Nkv=2 Sq=64 Skv=64 D=64 bx=16 by=16 pattern=bigbird glob=1 win=2 rand=3 dtype=bf16 seed=9\n"
        "\t a3 B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=random density=0.25 dtype=fp32\r\n"
        "s1 B=1 S1=2048 S2=4096 N1=16 N2=1 D=512 Dr=64 K=1024 sbs=1 mode=3 dtype=bf16\n"
        "s2 op=sfa B=1 S1=8 S2=8 N1=2 N2=2 D=16 Dr=0 K=4 mode=0 dtype=fp16 kv=separate\n";
    TU_CHECK(parse(good, &l) == 0, "good text parses: %s", err);
    TU_CHECK(l.n == 5, "5 cases, got %d", l.n);
    if (l.n == 5) {
        const sp_case *a = &l.v[0], *b = &l.v[1], *c = &l.v[2], *s = &l.v[3], *t = &l.v[4];
        TU_CHECK(a->op == SP_OP_BSA && a->line == 3 && a->B == 2 && a->N == 8 && a->Nkv == 8 &&
                     a->Sq == 1000 && a->Skv == 1024 && a->bx == 48 && a->by == 80 &&
                     a->pattern == SP_PAT_CAUSAL && a->dtype == SPATTN_DTYPE_F16 && a->seed == 0,
                 "a1 fields");
        TU_CHECK(!strcmp(a->file, "t.cases") && !strcmp(a->name, "a1"), "a1 name/file");
        TU_CHECK(b->Nkv == 2 && b->glob == 1 && b->win == 2 && b->rnd == 3 && b->seed == 9 &&
                     b->dtype == SPATTN_DTYPE_BF16 && b->line == 4, "a2 fields");
        TU_CHECK(c->density == 0.25 && c->dtype == SPATTN_DTYPE_F32 && c->line == 5, "a3 fields");
        TU_CHECK(s->op == SP_OP_SFA && s->S1 == 2048 && s->S2 == 4096 && s->N1 == 16 && s->N2 == 1 &&
                     s->D == 512 && s->Dr == 64 && s->K == 1024 && s->sbs == 1 && s->mode == 3 &&
                     s->shared_kv == 1, "s1 fields");
        TU_CHECK(t->op == SP_OP_SFA && t->shared_kv == 0 && t->sbs == 1 && t->Dr == 0, "s2 fields");
    }
    sp_case_list_free(&l);

    /* Bad lines: each names file:line and what is wrong. */
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16 foo=3\n", 1,
                 "unknown key 'foo'");
    expect_error("# c\nx B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp8\n", 2,
                 "bad value 'fp8' for key 'dtype'");
    expect_error("\n\nx B=two N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 3,
                 "bad value 'two' for key 'B'");
    expect_error("x B=-1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1, "key 'B'");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=0 by=1 pattern=dense dtype=fp16\n", 1, "bx=0 out of range");
    expect_error("x B=1 N=1 Sq=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1, "missing key 'Skv'");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense\n", 1, "missing key 'dtype'");
    expect_error("x B=1 N=1 B=2 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1, "given twice");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16 K=4\n", 1, "mixes");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=window dtype=fp16\n", 1, "needs key 'window'");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense window=3 dtype=fp16\n", 1,
                 "applies only to pattern=window");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=random density=1.5 dtype=fp16\n", 1,
                 "density");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=zigzag dtype=fp16\n", 1, "zigzag");
    expect_error("x B=1 N=3 Nkv=2 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1, "divide");
    expect_error("x B=1 S1=8 S2=8 N1=2 N2=1 D=16 Dr=0 K=4 mode=2 dtype=fp16\n", 1, "mode=2");
    expect_error("x B=1 S1=8 S2=8 N1=2 N2=1 D=16 Dr=0 K=4 sbs=3 mode=0 dtype=fp16\n", 1, "power of two");
    expect_error("x B=1 S1=8 S2=8 N1=2 N2=1 D=16 Dr=0 K=4 sbs=256 mode=0 dtype=fp16\n", 1, "sbs=256");
    expect_error("x B=1 S1=8 S2=8 N1=2 N2=1 D=16 Dr=0 mode=0 dtype=fp16\n", 1, "missing key 'K'");
    expect_error("x B=1 S1=8 S2=8 N1=3 N2=2 D=16 Dr=0 K=4 mode=0 dtype=fp16\n", 1, "divide");
    expect_error("x B=1 S1=8 S2=8 N1=2 N2=1 D=16 Dr=0 K=4 mode=0 dtype=fp16 kv=both\n", 1, "kv");
    expect_error("B=1 N=1\n", 1, "starts with its name");
    expect_error("x B=1 N=1 Sq 8\n", 1, "expected key=value");
    expect_error("x B=1 =3\n", 1, "expected key=value");
    expect_error("x B=1 D=8 dtype=fp16\n", 1, "cannot tell the operator");
    expect_error("x op=sfa B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1,
                 "keys of the other operator");
    expect_error("bad/name B=1\n", 1, "case name");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n"
                 "x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 2, "already used on line 1");
    expect_error("x B=1 N=1 Sq=99999999999999999999 Skv=8 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1,
                 "bad value");
    expect_error("x B=16777216 S1=16777216 S2=8 N1=16777216 N2=1 D=16 Dr=0 K=4 mode=0 dtype=fp16\n", 1,
                 "too large");
    /* each factor in range, the mask 2^48 bytes (found by fuzz_cases: the tools then tried to
     * generate it) */
    expect_error("x B=1 N=16777216 Sq=4096 Skv=4096 D=8 bx=1 by=1 pattern=dense dtype=fp16\n", 1,
                 "too large (mask of 281474976710656 bytes");
    expect_error("x B=1 N=1 Sq=8 Skv=8 D=8 bx=1 by=1 pattern=random density=nan dtype=fp16\n", 1,
                 "bad value 'nan'");

    /* Missing file: the message names it. */
    memset(&l, 0, sizeof l);
    TU_CHECK(sp_cases_load("/nonexistent/dir/x.cases", &l, err, sizeof err) == -1, "missing file fails");
    TU_CHECK(strstr(err, "/nonexistent/dir/x.cases:") == err && strstr(err, "cannot open"),
             "missing-file message: %s", err);

    /* The public suites. */
    memset(&l, 0, sizeof l);
    TU_CHECK(sp_cases_load(SPATTN_TEST_CASES_DIR "/bsa.cases", &l, err, sizeof err) == 0, "bsa.cases: %s", err);
    TU_CHECK(l.n == 17, "bsa.cases has 17 cases, got %d", l.n);
    for (int i = 0; i < l.n; i++) TU_CHECK(l.v[i].op == SP_OP_BSA, "bsa op");
    sp_case_list_free(&l);
    TU_CHECK(sp_cases_load(SPATTN_TEST_CASES_DIR "/sfa.cases", &l, err, sizeof err) == 0, "sfa.cases: %s", err);
    TU_CHECK(l.n == 18, "sfa.cases has 18 cases, got %d", l.n);
    for (int i = 0; i < l.n; i++)
        TU_CHECK(l.v[i].op == SP_OP_SFA && l.v[i].shared_kv && l.v[i].D == 512 && l.v[i].Dr == 64,
                 "sfa shape");

    /* Scaling: shapes stay valid and keep their character. */
    for (int i = 0; i < l.n; i++) {
        sp_case s;
        sp_case_scale(&l.v[i], 1.0 / 16, &s);
        int64_t nblk = (s.S2 + s.sbs - 1) / s.sbs;
        TU_CHECK(s.scaled_by == 1.0 / 16 && s.S1 >= 1 && s.S2 >= s.S1 && s.K >= 1 && s.K <= nblk,
                 "scaled sfa %s: S1=%lld S2=%lld K=%lld", s.name, (long long)s.S1,
                 (long long)s.S2, (long long)s.K);
        TU_CHECK(s.S1 == (l.v[i].S1 + 8) / 16 || s.S1 == l.v[i].S1 / 16, "S1 scaled");
    }
    sp_case_list_free(&l);
    TU_CHECK(sp_cases_load(SPATTN_TEST_CASES_DIR "/bsa.cases", &l, err, sizeof err) == 0, "bsa.cases");
    for (int i = 0; i < l.n; i++) {
        sp_case s;
        sp_case_scale(&l.v[i], 1.0 / 64, &s);
        TU_CHECK(s.Sq == s.Skv && s.Sq >= 4 * s.bx && s.Skv >= 4 * s.by, "scaled bsa %s keeps 4 blocks", s.name);
        sp_case u;
        sp_case_scale(&l.v[i], 1.0, &u);
        TU_CHECK(u.Sq == l.v[i].Sq && u.scaled_by == 1.0, "scale 1 leaves the case alone");
    }
    sp_case w;
    sp_case_scale(&l.v[2], 0.125, &w); /* bsa03 window=256 */
    TU_CHECK(w.window == 32 && w.Sq == 256, "window scales with the sequence (%lld)", (long long)w.window);
    sp_case_scale(&l.v[0], 1.0 / 16, &w); /* bsa01: 1024 / 16 = 64 < 4 blocks of 64 */
    TU_CHECK(w.Sq == 256 && w.Skv == 256, "at least four blocks (%lld)", (long long)w.Sq);
    sp_case_list_free(&l);
    return tu_summary("test_cli_cases");
}

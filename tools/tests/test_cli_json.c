/* JSON writer/reader round trip, reader errors, and (with arguments) a schema check of files
 * written by `spattn verify --json` / `spattn bench --json`:
 *   test_cli_json                      unit tests
 *   test_cli_json verify|bench FILE    parse FILE and check the documented keys */
#include <math.h>
#include <string.h>

#include "json.h"
#include "testutil.h"

static int has_type(const sp_jv *o, const char *key, int type) {
    const sp_jv *v = sp_jv_get(o, key);
    return v && v->type == type;
}

static int check_file(const char *kind, const char *path) {
    char err[512];
    sp_jv *doc = sp_json_load(path, err, sizeof err);
    TU_CHECK(doc != NULL, "%s parses: %s", path, err);
    if (!doc) return tu_summary("test_cli_json (file)");
    TU_CHECK(doc->type == SP_JOBJ, "top level is an object");
    static const char *const top[] = {"tool", "command", "version", "name", "backend", "device"};
    for (int i = 0; i < 6; i++) TU_CHECK(has_type(doc, top[i], SP_JSTR), "top-level \"%s\"", top[i]);
    TU_CHECK(has_type(doc, "scale", SP_JNUM) && has_type(doc, "scaled", SP_JBOOL), "scale, scaled");
    TU_CHECK(!strcmp(sp_jv_str(doc, "command") ? sp_jv_str(doc, "command") : "", kind), "command is %s", kind);
    const double det = sp_jv_num(doc, "deterministic", -1.0);
    TU_CHECK(has_type(doc, "deterministic", SP_JNUM) && (det == 0.0 || det == 1.0),
             "\"deterministic\": 0 or 1");
    if (!strcmp(kind, "verify")) {
        const sp_jv *cases = sp_jv_get(doc, "cases");
        TU_CHECK(cases && cases->type == SP_JARR && cases->n > 0, "cases array");
        TU_CHECK(has_type(doc, "summary", SP_JOBJ) && has_type(doc, "all_passed", SP_JBOOL), "summary");
        for (int i = 0; cases && i < cases->n; i++) {
            const sp_jv *c = &cases->items[i];
            TU_CHECK(has_type(c, "case", SP_JSTR) && has_type(c, "pass", SP_JBOOL) &&
                         has_type(c, "shape", SP_JOBJ) && has_type(c, "tensors", SP_JARR) &&
                         has_type(c, "file", SP_JSTR) && has_type(c, "line", SP_JNUM),
                     "case %d keys", i);
            const sp_jv *ts = sp_jv_get(c, "tensors");
            for (int k = 0; ts && k < ts->n; k++) {
                const sp_jv *t = &ts->items[k];
                TU_CHECK(has_type(t, "name", SP_JSTR) && has_type(t, "ok", SP_JBOOL) &&
                             has_type(t, "matched_ratio", SP_JNUM) &&
                             sp_jv_get(t, "max_abs_error") && sp_jv_get(t, "rel_l2_error"),
                         "tensor keys");
            }
        }
    } else {
        const sp_jv *res = sp_jv_get(doc, "results");
        int nbase = 0;
        TU_CHECK(res && res->type == SP_JARR && res->n > 0, "results array");
        for (int i = 0; res && i < res->n; i++) {
            const sp_jv *r = &res->items[i];
            const char *pass = sp_jv_str(r, "pass");
            TU_CHECK(has_type(r, "case", SP_JSTR) && pass &&
                         (!strcmp(pass, "fwd") || !strcmp(pass, "bwd")) &&
                         has_type(r, "median_ms", SP_JNUM) && has_type(r, "tflops", SP_JNUM) &&
                         has_type(r, "min_ms", SP_JNUM) && has_type(r, "max_ms", SP_JNUM),
                     "result %d keys", i);
            /* --varlen-baselines: the keys of docs/cli.md on every result that has them */
            if (sp_jv_get(r, "loop_median_ms")) {
                nbase++;
                TU_CHECK(sp_jv_get(r, "blockdiag_median_ms") && sp_jv_get(r, "blockdiag_flops") &&
                             sp_jv_get(r, "packed_over_blockdiag") &&
                             sp_jv_get(r, "loop_over_packed") && has_type(r, "loop_calls", SP_JNUM) &&
                             has_type(r, "blockdiag_padded", SP_JBOOL) &&
                             has_type(r, "baselines_match", SP_JBOOL) &&
                             has_type(r, "baselines_note", SP_JSTR),
                         "result %d baseline keys", i);
            }
        }
        const sp_jv *vb = sp_jv_get(doc, "varlen_baselines");
        if (vb && vb->type == SP_JBOOL && vb->num != 0.0)
            TU_CHECK(nbase > 0, "varlen_baselines: some result has the baseline keys");
    }
    sp_json_free(doc);
    return tu_summary("test_cli_json (file)");
}

int main(int argc, char **argv) {
    if (argc == 3) return check_file(argv[1], argv[2]);

    /* Round trip through a file. */
    FILE *f = tmpfile();
    TU_CHECK(f != NULL, "tmpfile");
    if (!f) return tu_summary("test_cli_json");
    sp_jw w;
    sp_jw_init(&w, f);
    sp_jw_obj(&w, NULL);
    sp_jw_str(&w, "s", "quote \" backslash \\ newline \n tab \t ctl \x01 end");
    sp_jw_num(&w, "x", 0.1);
    sp_jw_num(&w, "inf", INFINITY);
    sp_jw_num(&w, "nan", NAN);
    sp_jw_int(&w, "big", 9007199254740993LL);
    sp_jw_bool(&w, "t", 1);
    sp_jw_null(&w, "z");
    sp_jw_arr(&w, "empty");
    sp_jw_end_arr(&w);
    sp_jw_obj(&w, "emptyobj");
    sp_jw_end_obj(&w);
    sp_jw_arr(&w, "a");
    for (int i = 0; i < 3; i++) {
        sp_jw_obj(&w, NULL);
        sp_jw_int(&w, "i", i);
        sp_jw_end_obj(&w);
    }
    sp_jw_num(&w, NULL, -1.5e-300);
    sp_jw_end_arr(&w);
    sp_jw_end_obj(&w);
    long len = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)len + 1);
    TU_CHECK(fread(text, 1, (size_t)len, f) == (size_t)len, "read back");
    fclose(f);
    char err[256];
    sp_jv *doc = sp_json_parse(text, err, sizeof err);
    TU_CHECK(doc != NULL, "written JSON parses: %s\n%s", err, text);
    if (doc) {
        TU_CHECK(!strcmp(sp_jv_str(doc, "s"), "quote \" backslash \\ newline \n tab \t ctl \x01 end"),
                 "string escapes round-trip");
        TU_CHECK(sp_jv_num(doc, "x", 0) == 0.1, "0.1 round-trips exactly");
        TU_CHECK(sp_jv_get(doc, "inf")->type == SP_JNULL && sp_jv_get(doc, "nan")->type == SP_JNULL,
                 "non-finite numbers become null");
        TU_CHECK(sp_jv_get(doc, "t")->type == SP_JBOOL && sp_jv_get(doc, "t")->num == 1, "bool");
        TU_CHECK(sp_jv_get(doc, "empty")->type == SP_JARR && sp_jv_get(doc, "empty")->n == 0, "[]");
        TU_CHECK(sp_jv_get(doc, "emptyobj")->type == SP_JOBJ, "{}");
        const sp_jv *a = sp_jv_get(doc, "a");
        TU_CHECK(a && a->n == 4 && sp_jv_num(&a->items[2], "i", -1) == 2 &&
                     a->items[3].num == -1.5e-300, "array members");
        sp_json_free(doc);
    }
    free(text);

    /* Reader: escapes and rejected documents (with a position). */
    doc = sp_json_parse(" {\"k\": \"\\u00e9\\u0041\\/\", \"n\": -0.5e+2} ", err, sizeof err);
    TU_CHECK(doc && !strcmp(sp_jv_str(doc, "k"), "\xc3\xa9" "A/") && sp_jv_num(doc, "n", 0) == -50.0,
             "\\u escapes and exponents");
    sp_json_free(doc);
    static const char *const bad[] = {"{\"a\": 1,}", "[1 2]", "{\"a\" 1}", "\"open", "01", "1.",
                                      "-", "{} x", "tru", "[\"\x01\"]", "{\"a\":\"\\q\"}", "", "[1e]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        doc = sp_json_parse(bad[i], err, sizeof err);
        TU_CHECK(doc == NULL && strstr(err, "line 1, column"), "rejects '%s' (%s)", bad[i], err);
        sp_json_free(doc);
    }
    doc = sp_json_parse("{\n  \"a\": [1,\n   ]\n}", err, sizeof err);
    TU_CHECK(!doc && strstr(err, "line 3"), "error position on line 3: %s", err);
    TU_CHECK(sp_json_load("/nonexistent.json", err, sizeof err) == NULL && strstr(err, "/nonexistent.json"),
             "missing file named");
    return tu_summary("test_cli_json");
}

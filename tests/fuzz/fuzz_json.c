/*
 * libFuzzer harness for the JSON reader of the CLI (tools/json_read.c: `bench --load` and
 * `--compare` read peers' files with it).  Parses the input, walks the whole DOM with the
 * accessors the bench loader uses, writes it back with the JSON writer (tools/json_write.c)
 * and parses that again: the round trip must succeed and give the same tree (numbers equal
 * or both non-finite, which the writer turns into null).
 *
 * Run: build-fuzz/tests/fuzz/fuzz_json -max_total_time=60 -dict=tests/fuzz/json.dict \
 *      NEW_DIR tests/fuzz/corpus/json
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static void die(const char *what) {
    fprintf(stderr, "fuzz_json: %s\n", what);
    abort();
}

static void walk(const sp_jv *v, int depth) {
    if (v->type < SP_JNULL || v->type > SP_JOBJ) die("bad node type");
    if (v->type == SP_JSTR && !v->str) die("string node without text");
    if (v->type != SP_JARR && v->type != SP_JOBJ) return;
    if (v->n < 0 || (v->n > 0 && !v->items)) die("bad member count");
    for (int i = 0; i < v->n; i++) {
        if (v->type == SP_JOBJ) {
            if (!v->keys || !v->keys[i]) die("object member without a key");
            if (!sp_jv_get(v, v->keys[i])) die("sp_jv_get misses a member");
            (void)sp_jv_str(v, v->keys[i]);
            (void)sp_jv_num(v, v->keys[i], 0.0);
        }
        walk(&v->items[i], depth + 1);
    }
    (void)sp_jv_get(v, "results");
    (void)sp_jv_str(v, "name");
    (void)sp_jv_num(v, "median_ms", NAN);
}

/* Writes v through the streaming writer (its depth limit permitting). */
static int write(sp_jw *w, const char *key, const sp_jv *v, int depth) {
    if (depth >= 60) return -1;
    switch (v->type) {
    case SP_JNULL: sp_jw_null(w, key); break;
    case SP_JBOOL: sp_jw_bool(w, key, v->num != 0.0); break;
    case SP_JNUM: sp_jw_num(w, key, v->num); break;
    case SP_JSTR: sp_jw_str(w, key, v->str); break;
    default:
        if (v->type == SP_JARR) sp_jw_arr(w, key);
        else sp_jw_obj(w, key);
        for (int i = 0; i < v->n; i++)
            if (write(w, v->type == SP_JOBJ ? v->keys[i] : NULL, &v->items[i], depth + 1)) return -1;
        if (v->type == SP_JARR) sp_jw_end_arr(w);
        else sp_jw_end_obj(w);
    }
    return 0;
}

static void same(const sp_jv *a, const sp_jv *b) {
    int ta = a->type == SP_JNUM && !isfinite(a->num) ? SP_JNULL : a->type;
    if (ta != b->type) die("round trip changed a node type");
    if (ta == SP_JNUM && a->num != b->num && !(isnan(a->num) && isnan(b->num))) {
        /* %.17g round-trips doubles exactly; allow only what the writer's format loses. */
        if (fabs(a->num - b->num) > 1e-15 * fabs(a->num)) die("round trip changed a number");
    }
    if (ta == SP_JBOOL && (a->num != 0.0) != (b->num != 0.0)) die("round trip changed a bool");
    if (ta == SP_JSTR && strcmp(a->str, b->str)) die("round trip changed a string");
    if (ta == SP_JARR || ta == SP_JOBJ) {
        if (a->n != b->n) die("round trip changed a member count");
        for (int i = 0; i < a->n; i++) {
            if (ta == SP_JOBJ && strcmp(a->keys[i], b->keys[i])) die("round trip changed a key");
            same(&a->items[i], &b->items[i]);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    char err[256];
    err[0] = '\0';
    sp_jv *doc = sp_json_parse(text, err, sizeof err);
    if (!doc) {
        if (!err[0]) die("parse failed without a message");
        free(text);
        return 0;
    }
    walk(doc, 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    sp_jw w;
    sp_jw_init(&w, f);
    int ok = write(&w, NULL, doc, 0) == 0;
    fclose(f);
    if (ok) {
        sp_jv *again = sp_json_parse(buf, err, sizeof err);
        if (!again) {
            fprintf(stderr, "fuzz_json: written JSON does not parse (%s):\n%s\n", err, buf);
            abort();
        }
        same(doc, again);
        sp_json_free(again);
    }
    free(buf);
    sp_json_free(doc);
    free(text);
    return 0;
}

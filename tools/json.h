/*
 * A small JSON writer (streaming, indented) and reader (a DOM for --compare and the tests).
 * Non-finite numbers are written as null: JSON has no Inf or NaN.
 */
#ifndef SPATTN_CLI_JSON_H
#define SPATTN_CLI_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- writer ---- */
typedef struct sp_jw {
    FILE *f;
    int depth;
    int count[64]; /* values written so far at each depth (comma placement) */
} sp_jw;

void sp_jw_init(sp_jw *w, FILE *f);
/* key is NULL inside arrays and at the top level. */
void sp_jw_obj(sp_jw *w, const char *key);
void sp_jw_arr(sp_jw *w, const char *key);
void sp_jw_end_obj(sp_jw *w);
void sp_jw_end_arr(sp_jw *w);
void sp_jw_str(sp_jw *w, const char *key, const char *val);
void sp_jw_num(sp_jw *w, const char *key, double val);
void sp_jw_int(sp_jw *w, const char *key, int64_t val);
void sp_jw_bool(sp_jw *w, const char *key, int val);
void sp_jw_null(sp_jw *w, const char *key);

/* ---- reader ---- */
enum { SP_JNULL, SP_JBOOL, SP_JNUM, SP_JSTR, SP_JARR, SP_JOBJ };

typedef struct sp_jv {
    int type;
    double num;          /* SP_JNUM; SP_JBOOL: 0 or 1 */
    char *str;           /* SP_JSTR */
    int n;               /* SP_JARR / SP_JOBJ: members */
    struct sp_jv *items; /* members */
    char **keys;         /* SP_JOBJ: member names */
} sp_jv;

/* Parses a whole document; NULL with "line L, column C: message" in err on a syntax error. */
sp_jv *sp_json_parse(const char *text, char *err, size_t errlen);
/* Reads and parses a file; errors name the file. */
sp_jv *sp_json_load(const char *path, char *err, size_t errlen);
void sp_json_free(sp_jv *v);
/* Member of an object by name, or NULL. */
const sp_jv *sp_jv_get(const sp_jv *obj, const char *key);
/* String member or NULL; number member or `dflt`. */
const char *sp_jv_str(const sp_jv *obj, const char *key);
double sp_jv_num(const sp_jv *obj, const char *key, double dflt);

#endif

#include <math.h>

#include "json.h"

void sp_jw_init(sp_jw *w, FILE *f) {
    w->f = f;
    w->depth = 0;
    w->count[0] = 0;
}

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* Comma, newline, indent and key before a value. */
static void lead(sp_jw *w, const char *key) {
    if (w->count[w->depth]++ > 0) fputc(',', w->f);
    if (w->depth > 0) {
        fputc('\n', w->f);
        for (int i = 0; i < w->depth; i++) fputs("  ", w->f);
    }
    if (key) {
        put_string(w->f, key);
        fputs(": ", w->f);
    }
}

static void jw_open(sp_jw *w, const char *key, char c) {
    lead(w, key);
    fputc(c, w->f);
    if (w->depth < 63) w->depth++;
    w->count[w->depth] = 0;
}

static void jw_close(sp_jw *w, char c) {
    int had = w->count[w->depth] > 0;
    if (w->depth > 0) w->depth--;
    if (had) {
        fputc('\n', w->f);
        for (int i = 0; i < w->depth; i++) fputs("  ", w->f);
    }
    fputc(c, w->f);
    if (w->depth == 0) fputc('\n', w->f);
}

void sp_jw_obj(sp_jw *w, const char *key) { jw_open(w, key, '{'); }
void sp_jw_arr(sp_jw *w, const char *key) { jw_open(w, key, '['); }
void sp_jw_end_obj(sp_jw *w) { jw_close(w, '}'); }
void sp_jw_end_arr(sp_jw *w) { jw_close(w, ']'); }

void sp_jw_str(sp_jw *w, const char *key, const char *val) {
    lead(w, key);
    if (val) put_string(w->f, val);
    else fputs("null", w->f);
}

void sp_jw_num(sp_jw *w, const char *key, double val) {
    lead(w, key);
    if (isfinite(val)) fprintf(w->f, "%.17g", val);
    else fputs("null", w->f);
}

void sp_jw_int(sp_jw *w, const char *key, int64_t val) {
    lead(w, key);
    fprintf(w->f, "%lld", (long long)val);
}

void sp_jw_bool(sp_jw *w, const char *key, int val) {
    lead(w, key);
    fputs(val ? "true" : "false", w->f);
}

void sp_jw_null(sp_jw *w, const char *key) {
    lead(w, key);
    fputs("null", w->f);
}

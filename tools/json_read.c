/* Recursive-descent JSON reader (RFC 8259 syntax; \u escapes are decoded to UTF-8). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

typedef struct parser {
    const char *s, *p;
    char *err;
    size_t errlen;
    int failed;
    int depth;
} parser;

static void perr(parser *ps, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    int line = 1, col = 1;
    for (const char *q = ps->s; q < ps->p; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int k = snprintf(ps->err, ps->errlen, "line %d, column %d: ", line, col);
    if (k < 0 || (size_t)k >= ps->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

static void ws(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

static void free_members(sp_jv *v) {
    if (v->type == SP_JSTR) free(v->str);
    if (v->type == SP_JARR || v->type == SP_JOBJ) {
        for (int i = 0; i < v->n; i++) {
            free_members(&v->items[i]);
            if (v->keys) free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
}

void sp_json_free(sp_jv *v) {
    if (!v) return;
    free_members(v);
    free(v);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static char *parse_string(parser *ps) {
    /* ps->p is at the opening quote. */
    ps->p++;
    size_t cap = 32, len = 0;
    char *out = malloc(cap);
    if (!out) {
        perr(ps, "out of memory");
        return NULL;
    }
    for (;;) {
        unsigned char ch = (unsigned char)*ps->p;
        if (ch == '\0') {
            perr(ps, "unterminated string");
            break;
        }
        if (ch < 0x20) {
            perr(ps, "control character in string");
            break;
        }
        if (len + 8 >= cap) {
            char *t = realloc(out, cap *= 2);
            if (!t) {
                perr(ps, "out of memory");
                break;
            }
            out = t;
        }
        ps->p++;
        if (ch == '"') {
            out[len] = '\0';
            return out;
        }
        if (ch != '\\') {
            out[len++] = (char)ch;
            continue;
        }
        char e = *ps->p++;
        switch (e) {
        case '"': out[len++] = '"'; break;
        case '\\': out[len++] = '\\'; break;
        case '/': out[len++] = '/'; break;
        case 'b': out[len++] = '\b'; break;
        case 'f': out[len++] = '\f'; break;
        case 'n': out[len++] = '\n'; break;
        case 'r': out[len++] = '\r'; break;
        case 't': out[len++] = '\t'; break;
        case 'u': {
            unsigned cp = 0;
            for (int i = 0; i < 4; i++) {
                int h = hexval(ps->p[i]);
                if (h < 0) {
                    perr(ps, "bad \\u escape");
                    free(out);
                    return NULL;
                }
                cp = cp * 16 + (unsigned)h;
            }
            ps->p += 4;
            /* Surrogates are kept as-is (3-byte form): names in our files are ASCII. */
            if (cp < 0x80) {
                out[len++] = (char)cp;
            } else if (cp < 0x800) {
                out[len++] = (char)(0xc0 | (cp >> 6));
                out[len++] = (char)(0x80 | (cp & 0x3f));
            } else {
                out[len++] = (char)(0xe0 | (cp >> 12));
                out[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                out[len++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: ps->p--; perr(ps, "bad escape"); free(out); return NULL;
        }
    }
    free(out);
    return NULL;
}

static int parse_value(parser *ps, sp_jv *v);

static int push(parser *ps, sp_jv *v, int *cap, const sp_jv *item, char *key) {
    if (v->n == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        sp_jv *it = realloc(v->items, (size_t)nc * sizeof *it);
        if (!it) goto oom;
        v->items = it;
        if (v->type == SP_JOBJ) {
            char **ks = realloc(v->keys, (size_t)nc * sizeof *ks);
            if (!ks) goto oom;
            v->keys = ks;
        }
        *cap = nc;
    }
    v->items[v->n] = *item;
    if (v->type == SP_JOBJ) v->keys[v->n] = key;
    v->n++;
    return 0;
oom:
    perr(ps, "out of memory");
    return -1;
}

static int parse_container(parser *ps, sp_jv *v, char close) {
    int cap = 0;
    ps->p++;
    ws(ps);
    if (*ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        ws(ps);
        char *key = NULL;
        if (v->type == SP_JOBJ) {
            if (*ps->p != '"') {
                perr(ps, "expected a member name");
                return -1;
            }
            key = parse_string(ps);
            if (!key) return -1;
            ws(ps);
            if (*ps->p != ':') {
                free(key);
                perr(ps, "expected ':'");
                return -1;
            }
            ps->p++;
        }
        sp_jv item;
        memset(&item, 0, sizeof item);
        if (parse_value(ps, &item) || push(ps, v, &cap, &item, key)) {
            free(key);
            free_members(&item);
            return -1;
        }
        ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            return 0;
        }
        perr(ps, "expected ',' or '%c'", close);
        return -1;
    }
}

static int parse_number(parser *ps, sp_jv *v) {
    const char *q = ps->p;
    if (*q == '-') q++;
    if (*q == '0') {
        q++;
    } else if (isdigit((unsigned char)*q)) {
        while (isdigit((unsigned char)*q)) q++;
    } else {
        perr(ps, "unexpected character '%c'", *ps->p ? *ps->p : '?');
        return -1;
    }
    if (*q == '.') {
        q++;
        if (!isdigit((unsigned char)*q)) {
            perr(ps, "digit expected after '.'");
            return -1;
        }
        while (isdigit((unsigned char)*q)) q++;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!isdigit((unsigned char)*q)) {
            perr(ps, "digit expected in exponent");
            return -1;
        }
        while (isdigit((unsigned char)*q)) q++;
    }
    v->type = SP_JNUM;
    v->num = strtod(ps->p, NULL);
    ps->p = q;
    return 0;
}

static int parse_value(parser *ps, sp_jv *v) {
    ws(ps);
    if (++ps->depth > 200) {
        perr(ps, "nesting too deep");
        return -1;
    }
    int rc = 0;
    switch (*ps->p) {
    case '{': v->type = SP_JOBJ; rc = parse_container(ps, v, '}'); break;
    case '[': v->type = SP_JARR; rc = parse_container(ps, v, ']'); break;
    case '"':
        v->str = parse_string(ps);
        if (v->str) v->type = SP_JSTR;
        else rc = -1;
        break;
    case 't':
    case 'f':
    case 'n': {
        static const char *const words[] = {"true", "false", "null"};
        rc = -1;
        for (int i = 0; i < 3; i++)
            if (!strncmp(ps->p, words[i], strlen(words[i]))) {
                ps->p += strlen(words[i]);
                v->type = i == 2 ? SP_JNULL : SP_JBOOL;
                v->num = i == 0;
                rc = 0;
            }
        if (rc) perr(ps, "unexpected word");
        break;
    }
    default: rc = parse_number(ps, v); break;
    }
    ps->depth--;
    return rc;
}

sp_jv *sp_json_parse(const char *text, char *err, size_t errlen) {
    parser ps = {text, text, err, errlen, 0, 0};
    sp_jv *v = calloc(1, sizeof *v);
    if (!v) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (parse_value(&ps, v) == 0) {
        ws(&ps);
        if (*ps.p) perr(&ps, "trailing characters after the document");
    } else if (!ps.failed) {
        perr(&ps, "syntax error");
    }
    if (ps.failed) {
        sp_json_free(v);
        return NULL;
    }
    return v;
}

sp_jv *sp_json_load(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    while (text) {
        len += fread(text + len, 1, cap - len - 1, f);
        if (len < cap - 1) break;
        char *t = realloc(text, cap * 2);
        if (!t) {
            free(text);
            text = NULL;
        } else {
            text = t;
            cap *= 2;
        }
    }
    fclose(f);
    if (!text) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    text[len] = '\0';
    char msg[256];
    sp_jv *v = sp_json_parse(text, msg, sizeof msg);
    free(text);
    if (!v) snprintf(err, errlen, "%s: %s", path, msg);
    return v;
}

const sp_jv *sp_jv_get(const sp_jv *obj, const char *key) {
    if (!obj || obj->type != SP_JOBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

const char *sp_jv_str(const sp_jv *obj, const char *key) {
    const sp_jv *v = sp_jv_get(obj, key);
    return v && v->type == SP_JSTR ? v->str : NULL;
}

double sp_jv_num(const sp_jv *obj, const char *key, double dflt) {
    const sp_jv *v = sp_jv_get(obj, key);
    return v && v->type == SP_JNUM ? v->num : dflt;
}

/*
 * Case-file parser.  Strict on purpose: an unknown key, a repeated key, a value that does not
 * parse completely or a missing required key is an error with file:line, so that a typo never
 * turns into a different case.
 */
#include "cases.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "spattn.h"

/* Upper bound for any dimension: keeps every element count far inside int64. */
#define SP_DIM_MAX (1LL << 24)
#define SP_MASK_MAX (1LL << 34)

const char *sp_op_name(int op) { return op == SP_OP_BSA ? "bsa" : op == SP_OP_SFA ? "sfa" : "?"; }

static const char *const kPatterns[] = {"dense", "causal", "window", "bigbird", "random"};

const char *sp_pattern_name(int pattern) {
    return pattern >= 0 && pattern < 5 ? kPatterns[pattern] : "?";
}

static void fail(char *err, size_t errlen, const char *file, int line, const char *fmt, ...) {
    int k = snprintf(err, errlen, "%s:%d: ", file, line);
    if (k < 0 || (size_t)k >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

/* Which keys a case may carry.  `ops` is a bit set of the operators the key applies to. */
enum { K_INT, K_DTYPE, K_PATTERN, K_REAL, K_KV, K_OP, K_SEED, K_LIST };
typedef struct keydef {
    const char *name;
    int type;
    int ops; /* 1 = bsa, 2 = sfa, 3 = both */
} keydef;

static const keydef kKeys[] = {
    {"op", K_OP, 3},       {"dtype", K_DTYPE, 3}, {"seed", K_SEED, 3},      {"B", K_INT, 3},
    {"D", K_INT, 3},       {"N", K_INT, 1},       {"Nkv", K_INT, 1},        {"Sq", K_INT, 1},
    {"Skv", K_INT, 1},     {"bx", K_INT, 1},      {"by", K_INT, 1},         {"pattern", K_PATTERN, 1},
    {"window", K_INT, 1},  {"glob", K_INT, 1},    {"win", K_INT, 1},        {"rand", K_INT, 1},
    {"density", K_REAL, 1}, {"S1", K_INT, 2},     {"S2", K_INT, 2},         {"N1", K_INT, 2},
    {"N2", K_INT, 2},      {"Dr", K_INT, 2},      {"K", K_INT, 2},          {"sbs", K_INT, 2},
    {"mode", K_INT, 2},    {"kv", K_KV, 2},
    /* varlen / paged cases (cases/README.md, "Varlen and paged cases") */
    {"lens", K_LIST, 3},   {"kvlens", K_LIST, 3}, {"nseq", K_INT, 3},       {"total", K_INT, 3},
    {"lens_seed", K_SEED, 3}, {"ctx", K_INT, 3},  {"page", K_INT, 3},
};
#define NKEYS ((int)(sizeof(kKeys) / sizeof(kKeys[0])))

static int find_key(const char *name, size_t len) {
    for (int i = 0; i < NKEYS; i++)
        if (strlen(kKeys[i].name) == len && memcmp(kKeys[i].name, name, len) == 0) return i;
    return -1;
}

static int parse_int(const char *s, int64_t *out) {
    if (!isdigit((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!isdigit((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_real(const char *s, double *out) {
    if (!s[0] || isspace((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* A length list: comma-separated items, each L or L*n (n copies of L), L in [0, SP_DIM_MAX].
 * Returns the count, or -1 (bad syntax, or more than SP_MAX_SEQS entries). */
static int parse_list(const char *s, int32_t *out) {
    int n = 0;
    while (1) {
        char item[64];
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof item) return -1;
        memcpy(item, s, len);
        item[len] = '\0';
        int64_t v, rep = 1;
        char *star = strchr(item, '*');
        if (star) {
            *star = '\0';
            if (parse_int(star + 1, &rep) || rep < 1 || rep > SP_MAX_SEQS) return -1;
        }
        if (parse_int(item, &v) || v > SP_DIM_MAX) return -1;
        if (n + rep > SP_MAX_SEQS) return -1;
        for (int64_t i = 0; i < rep; i++) out[n++] = (int32_t)v;
        if (!s[len]) return n;
        s += len + 1;
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The length generator (cases/README.md): nseq - 1 cut points drawn uniformly from
 * [0, total] (sp_rng_below(total + 1) each, stream SP_STREAM_LENS of lens_seed), sorted; the
 * lengths are the gaps between 0, the cuts and total.  Zero lengths occur naturally. */
static void gen_lens(int64_t nseq, int64_t total, uint64_t seed, int32_t *lens) {
    int64_t cut[SP_MAX_SEQS];
    sp_rng r;
    sp_rng_init(&r, seed, SP_STREAM_LENS);
    for (int64_t i = 0; i + 1 < nseq; i++) cut[i] = sp_rng_below(&r, total + 1);
    qsort(cut, (size_t)(nseq - 1), sizeof cut[0], cmp_i64);
    int64_t prev = 0;
    for (int64_t i = 0; i < nseq; i++) {
        int64_t end = i + 1 < nseq ? cut[i] : total;
        lens[i] = (int32_t)(end - prev);
        prev = end;
    }
}

/* Parsed values of one line, before the per-operator checks. */
typedef struct rawcase {
    int have[NKEYS];
    int64_t ival[NKEYS];
    double rval[NKEYS];
    uint64_t seed, lens_seed;
    int nlens, nkvlens; /* entries of lens= / kvlens= (stored in the case) */
} rawcase;

static int64_t iv(const rawcase *r, const char *key) { return r->ival[find_key(key, strlen(key))]; }
static int has(const rawcase *r, const char *key) { return r->have[find_key(key, strlen(key))]; }

/* Checks key `key` is present and in [lo, hi]. */
static int need(const rawcase *r, const char *key, int64_t lo, int64_t hi, const char *file,
                int line, const char *name, char *err, size_t errlen) {
    if (!has(r, key)) {
        fail(err, errlen, file, line, "case %s: missing key '%s'", name, key);
        return -1;
    }
    int64_t v = iv(r, key);
    if (v < lo || v > hi) {
        fail(err, errlen, file, line, "case %s: %s=%lld out of range [%lld, %lld]", name, key,
             (long long)v, (long long)lo, (long long)hi);
        return -1;
    }
    return 0;
}

#define NEED(key, lo, hi)                                                            \
    do {                                                                             \
        if (need(&r, key, lo, hi, file, line, c->name, err, errlen)) return -1;      \
    } while (0)

/* The varlen keys: lens= [kvlens=] | nseq= total= [lens_seed=], optional ctx= and page=.
 * Fills c->varlen, B, the per-sequence lengths and max_seqlen (Sq/Skv or S1/S2). */
static int parse_varlen(const rawcase *r, const char *file, int line, sp_case *c, char *err,
                        size_t errlen) {
    const int have_lens = has(r, "lens"), have_gen = has(r, "nseq");
    if (!have_lens && !have_gen) {
        static const char *const only[] = {"kvlens", "total", "lens_seed", "ctx", "page"};
        for (int i = 0; i < 5; i++)
            if (has(r, only[i])) {
                fail(err, errlen, file, line, "case %s: key '%s' belongs to a varlen case "
                     "(add lens= or nseq=)", c->name, only[i]);
                return -1;
            }
        return 0;
    }
    const char *name = c->name;
    if (have_lens && have_gen) {
        fail(err, errlen, file, line, "case %s: lens= and nseq= exclude each other", name);
        return -1;
    }
    /* The batch and the maximal lengths follow from the lengths: giving them is an error. */
    static const char *const derived[] = {"B", "Sq", "Skv", "S1", "S2"};
    for (int i = 0; i < 5; i++)
        if (has(r, derived[i])) {
            fail(err, errlen, file, line, "case %s: key '%s' is derived from the lengths in a "
                 "varlen case (lens= / nseq=)", name, derived[i]);
            return -1;
        }
    c->varlen = 1;
    if (have_lens) {
        if (has(r, "total") || has(r, "lens_seed")) {
            fail(err, errlen, file, line, "case %s: total= and lens_seed= belong to nseq=", name);
            return -1;
        }
        c->lens_explicit = 1;
        c->nseq = r->nlens;
        if (has(r, "kvlens") && r->nkvlens != r->nlens) {
            fail(err, errlen, file, line, "case %s: kvlens= has %d entries, lens= %d", name,
                 r->nkvlens, r->nlens);
            return -1;
        }
    } else {
        if (has(r, "kvlens")) {
            fail(err, errlen, file, line, "case %s: kvlens= needs lens=", name);
            return -1;
        }
        if (need(r, "nseq", 1, SP_MAX_SEQS, file, line, name, err, errlen) ||
            need(r, "total", 0, SP_DIM_MAX, file, line, name, err, errlen))
            return -1;
        c->nseq = iv(r, "nseq");
        c->total = iv(r, "total");
        c->lens_seed = r->lens_seed;
        gen_lens(c->nseq, c->total, c->lens_seed, c->lens);
    }
    if (has(r, "ctx")) {
        if (has(r, "kvlens")) {
            fail(err, errlen, file, line, "case %s: ctx= and kvlens= exclude each other", name);
            return -1;
        }
        if (need(r, "ctx", 0, SP_DIM_MAX, file, line, name, err, errlen)) return -1;
        c->ctx = iv(r, "ctx");
    }
    if (!has(r, "kvlens"))
        for (int64_t b = 0; b < c->nseq; b++) c->kvlens[b] = (int32_t)(c->lens[b] + c->ctx);
    if (has(r, "page")) {
        if (need(r, "page", 1, 65536, file, line, name, err, errlen)) return -1;
        c->page = iv(r, "page");
    }
    c->B = c->nseq;
    int64_t tq = 0, tkv = 0, mq = 0, mkv = 0;
    for (int64_t b = 0; b < c->nseq; b++) {
        if (c->lens[b] > SP_DIM_MAX || c->kvlens[b] > SP_DIM_MAX) {
            fail(err, errlen, file, line, "case %s: sequence %lld longer than %lld", name,
                 (long long)b, (long long)SP_DIM_MAX);
            return -1;
        }
        tq += c->lens[b];
        tkv += c->kvlens[b];
        if (c->lens[b] > mq) mq = c->lens[b];
        if (c->kvlens[b] > mkv) mkv = c->kvlens[b];
    }
    /* An empty batch has no tensor to test; 2^24 tokens a side keeps cu_seqlens (int32) and
     * the per-token loops of the estimates small. */
    if (tq < 1 || tkv < 1 || tq > SP_DIM_MAX || tkv > SP_DIM_MAX) {
        fail(err, errlen, file, line, "case %s: the query and key tokens must each total 1 .. "
             "2^24 (got %lld and %lld)", name, (long long)tq, (long long)tkv);
        return -1;
    }
    /* max_seqlen_q/kv: at least 1 (the API's rule), also when every query side is empty. */
    if (c->op == SP_OP_BSA) {
        c->Sq = mq > 0 ? mq : 1;
        c->Skv = mkv > 0 ? mkv : 1;
    } else {
        c->S1 = mq > 0 ? mq : 1;
        c->S2 = mkv > 0 ? mkv : 1;
    }
    return 0;
}

/* Parses one non-empty, comment-stripped line into *c. */
static int parse_line(const char *file, int line, char *text, sp_case *c, char *err,
                      size_t errlen) {
    rawcase r;
    memset(&r, 0, sizeof r);
    memset(c, 0, sizeof *c);
    snprintf(c->file, sizeof c->file, "%s", file);
    c->line = line;
    int op = -1, op_from_key = 0, used_ops = 0;
    char *save = NULL;
    char *tok = strtok_r(text, " \t\r", &save);
    /* The name: letters, digits, '_', '-', '.'; never a key=value. */
    if (strchr(tok, '=')) {
        fail(err, errlen, file, line, "a case line starts with its name, got '%s'", tok);
        return -1;
    }
    if (strlen(tok) >= sizeof c->name) {
        fail(err, errlen, file, line, "case name longer than %zu characters", sizeof c->name - 1);
        return -1;
    }
    for (const char *p = tok; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.') {
            fail(err, errlen, file, line, "case name '%s': only letters, digits, '_', '-', '.'", tok);
            return -1;
        }
    snprintf(c->name, sizeof c->name, "%s", tok);
    c->dtype = -1;
    while ((tok = strtok_r(NULL, " \t\r", &save)) != NULL) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok) {
            fail(err, errlen, file, line, "case %s: expected key=value, got '%s'", c->name, tok);
            return -1;
        }
        int ki = find_key(tok, (size_t)(eq - tok));
        *eq = '\0';
        const char *val = eq + 1;
        if (ki < 0) {
            fail(err, errlen, file, line, "case %s: unknown key '%s'", c->name, tok);
            return -1;
        }
        if (r.have[ki]) {
            fail(err, errlen, file, line, "case %s: key '%s' given twice", c->name, tok);
            return -1;
        }
        r.have[ki] = 1;
        if (kKeys[ki].ops != 3) used_ops |= kKeys[ki].ops;
        int bad = 0;
        switch (kKeys[ki].type) {
        case K_INT: bad = parse_int(val, &r.ival[ki]); break;
        case K_SEED: bad = parse_u64(val, !strcmp(tok, "seed") ? &r.seed : &r.lens_seed); break;
        case K_LIST:
            if (!strcmp(tok, "lens")) bad = (r.nlens = parse_list(val, c->lens)) < 0;
            else bad = (r.nkvlens = parse_list(val, c->kvlens)) < 0;
            break;
        case K_REAL: bad = parse_real(val, &r.rval[ki]); break;
        case K_DTYPE:
            if (!strcmp(val, "fp16")) c->dtype = SPATTN_DTYPE_F16;
            else if (!strcmp(val, "bf16")) c->dtype = SPATTN_DTYPE_BF16;
            else if (!strcmp(val, "fp32")) c->dtype = SPATTN_DTYPE_F32;
            else bad = 1;
            break;
        case K_PATTERN:
            bad = 1;
            for (int p = 0; p < 5; p++)
                if (!strcmp(val, kPatterns[p])) {
                    c->pattern = p;
                    bad = 0;
                }
            break;
        case K_KV:
            if (!strcmp(val, "shared")) c->shared_kv = 1;
            else if (!strcmp(val, "separate")) c->shared_kv = 0;
            else bad = 1;
            break;
        case K_OP:
            if (!strcmp(val, "bsa")) op = SP_OP_BSA;
            else if (!strcmp(val, "sfa")) op = SP_OP_SFA;
            else bad = 1;
            op_from_key = 1;
            break;
        }
        if (bad) {
            static const char *const want[] = {"a non-negative integer", "fp16, bf16 or fp32",
                                               "dense, causal, window, bigbird or random",
                                               "a finite number", "shared or separate",
                                               "bsa or sfa", "a non-negative integer",
                                               ("comma-separated lengths L or L*n, at most "
                                                "1024 entries")};
            fail(err, errlen, file, line, "case %s: bad value '%s' for key '%s' (expected %s)",
                 c->name, val, tok, want[kKeys[ki].type]);
            return -1;
        }
    }
    /* The operator: op= when given, else from the keys used. */
    if (used_ops == 3) {
        fail(err, errlen, file, line, "case %s: mixes bsa keys (Sq, Skv, N, bx, by, pattern...) "
             "and sfa keys (S1, S2, N1, N2, K, sbs, mode...)", c->name);
        return -1;
    }
    if (!op_from_key) op = used_ops == 1 ? SP_OP_BSA : used_ops == 2 ? SP_OP_SFA : -1;
    if (op < 0) {
        fail(err, errlen, file, line, "case %s: cannot tell the operator (add op=bsa or op=sfa)",
             c->name);
        return -1;
    }
    if (used_ops && used_ops != (op == SP_OP_BSA ? 1 : 2)) {
        fail(err, errlen, file, line, "case %s: op=%s but keys of the other operator are given",
             c->name, sp_op_name(op));
        return -1;
    }
    c->op = op;
    if (c->dtype < 0) {
        fail(err, errlen, file, line, "case %s: missing key 'dtype'", c->name);
        return -1;
    }
    c->seed = r.seed;
    c->scaled_by = 1.0;
    if (parse_varlen(&r, file, line, c, err, errlen)) return -1;
    if (!c->varlen) NEED("B", 1, SP_DIM_MAX);
    NEED("D", 1, 4096);
    if (!c->varlen) c->B = iv(&r, "B");
    c->D = iv(&r, "D");
    if (op == SP_OP_BSA) {
        NEED("N", 1, SP_DIM_MAX);
        if (!c->varlen) {
            NEED("Sq", 1, SP_DIM_MAX);
            NEED("Skv", 1, SP_DIM_MAX);
            c->Sq = iv(&r, "Sq");
            c->Skv = iv(&r, "Skv");
        }
        NEED("bx", 1, SP_DIM_MAX);
        NEED("by", 1, SP_DIM_MAX);
        c->N = iv(&r, "N");
        c->bx = iv(&r, "bx");
        c->by = iv(&r, "by");
        c->Nkv = c->N;
        if (has(&r, "Nkv")) {
            NEED("Nkv", 1, c->N);
            c->Nkv = iv(&r, "Nkv");
            if (c->N % c->Nkv) {
                fail(err, errlen, file, line, "case %s: Nkv=%lld must divide N=%lld", c->name,
                     (long long)c->Nkv, (long long)c->N);
                return -1;
            }
        }
        if (!has(&r, "pattern")) {
            fail(err, errlen, file, line, "case %s: missing key 'pattern'", c->name);
            return -1;
        }
        /* Pattern parameters: required for their pattern, refused for the others. */
        static const char *const pkeys[] = {"window", "glob", "win", "rand", "density"};
        static const int powner[] = {SP_PAT_WINDOW, SP_PAT_BIGBIRD, SP_PAT_BIGBIRD,
                                     SP_PAT_BIGBIRD, SP_PAT_RANDOM};
        for (int i = 0; i < 5; i++) {
            if (powner[i] == c->pattern && !has(&r, pkeys[i])) {
                fail(err, errlen, file, line, "case %s: pattern=%s needs key '%s'", c->name,
                     kPatterns[c->pattern], pkeys[i]);
                return -1;
            }
            if (powner[i] != c->pattern && has(&r, pkeys[i])) {
                fail(err, errlen, file, line, "case %s: key '%s' applies only to pattern=%s",
                     c->name, pkeys[i], kPatterns[powner[i]]);
                return -1;
            }
        }
        if (c->pattern == SP_PAT_WINDOW) {
            NEED("window", 0, SP_DIM_MAX);
            c->window = iv(&r, "window");
        }
        if (c->pattern == SP_PAT_BIGBIRD) {
            NEED("glob", 0, SP_DIM_MAX);
            NEED("win", 0, SP_DIM_MAX);
            NEED("rand", 0, SP_DIM_MAX);
            c->glob = iv(&r, "glob");
            c->win = iv(&r, "win");
            c->rnd = iv(&r, "rand");
        }
        if (c->pattern == SP_PAT_RANDOM) {
            double p = r.rval[find_key("density", 7)];
            if (!(p >= 0.0 && p <= 1.0)) {
                fail(err, errlen, file, line, "case %s: density=%g must lie in [0, 1]", c->name, p);
                return -1;
            }
            c->density = p;
        }
        int64_t nbx = (c->Sq + c->bx - 1) / c->bx, nby = (c->Skv + c->by - 1) / c->by;
        /* each factor below 2^24, and the mask (B N nbx nby bytes) below 2^34: a case the
         * tools cannot generate is refused here, not by a failed allocation later (a fuzzed
         * 2^48-byte mask was accepted when only the factors were bounded) */
        if (c->B * c->N > SP_DIM_MAX || nbx * nby > SP_DIM_MAX || c->B * c->N * nbx * nby > SP_MASK_MAX) {
            fail(err, errlen, file, line, "case %s: too large (mask of %lld bytes; at most 2^34)", c->name,
                 (long long)(c->B * c->N * nbx * nby));
            return -1;
        }
    } else {
        if (!c->varlen) {
            NEED("S1", 1, SP_DIM_MAX);
            NEED("S2", 1, SP_DIM_MAX);
            c->S1 = iv(&r, "S1");
            c->S2 = iv(&r, "S2");
        }
        NEED("N1", 1, SP_DIM_MAX);
        NEED("N2", 1, SP_DIM_MAX);
        NEED("Dr", 0, 4096);
        NEED("K", 1, SP_DIM_MAX);
        c->N1 = iv(&r, "N1");
        c->N2 = iv(&r, "N2");
        c->Dr = iv(&r, "Dr");
        c->K = iv(&r, "K");
        c->sbs = 1;
        if (has(&r, "sbs")) {
            NEED("sbs", 1, 128);
            c->sbs = iv(&r, "sbs");
            if (c->sbs & (c->sbs - 1)) {
                fail(err, errlen, file, line, "case %s: sbs=%lld must be a power of two", c->name,
                     (long long)c->sbs);
                return -1;
            }
        }
        if (!has(&r, "mode")) {
            fail(err, errlen, file, line, "case %s: missing key 'mode'", c->name);
            return -1;
        }
        c->mode = (int32_t)iv(&r, "mode");
        if (iv(&r, "mode") != 0 && iv(&r, "mode") != 3) {
            fail(err, errlen, file, line, "case %s: mode=%lld must be 0 (none) or 3 (causal)",
                 c->name, (long long)iv(&r, "mode"));
            return -1;
        }
        if (c->N1 % c->N2) {
            fail(err, errlen, file, line, "case %s: N2=%lld must divide N1=%lld", c->name,
                 (long long)c->N2, (long long)c->N1);
            return -1;
        }
        if (!has(&r, "kv")) c->shared_kv = 1;
        /* Keeps every element count (times D + Dr <= 8192) far inside int64. */
        const int64_t big = (int64_t)1 << 40;
        if (c->B * c->S1 > big / c->N1 || c->B * c->S2 > big / c->N2 ||
            c->B * c->S1 > big / (c->N2 * c->K)) {
            fail(err, errlen, file, line, "case %s: too large", c->name);
            return -1;
        }
    }
    return 0;
}

static int list_push(sp_case_list *l, const sp_case *c) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        sp_case *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *c;
    return 0;
}

int sp_cases_parse_text(const char *file, const char *text, sp_case_list *out, char *err,
                        size_t errlen) {
    int line = 0, first = out->n;
    const char *p = text;
    char buf[4096];
    while (*p) {
        line++;
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len >= sizeof buf) {
            fail(err, errlen, file, line, "line longer than %zu characters", sizeof buf - 1);
            return -1;
        }
        memcpy(buf, p, len);
        buf[len] = '\0';
        p = nl ? nl + 1 : p + len;
        char *hash = strchr(buf, '#');
        if (hash) *hash = '\0';
        char *s = buf;
        while (*s && isspace((unsigned char)*s)) s++;
        if (!*s) continue;
        sp_case c;
        if (parse_line(file, line, s, &c, err, errlen)) return -1;
        for (int i = first; i < out->n; i++)
            if (!strcmp(out->v[i].name, c.name)) {
                fail(err, errlen, file, line, "case %s: name already used on line %d", c.name,
                     out->v[i].line);
                return -1;
            }
        if (list_push(out, &c)) {
            fail(err, errlen, file, line, "out of memory");
            return -1;
        }
    }
    return 0;
}

int sp_cases_load(const char *path, sp_case_list *out, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s:0: cannot open case file: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    while (text) {
        size_t got = fread(text + len, 1, cap - len - 1, f);
        len += got;
        if (len < cap - 1) break;
        char *t = realloc(text, cap * 2);
        if (!t) {
            free(text);
            text = NULL;
            break;
        }
        text = t;
        cap *= 2;
    }
    int rd_err = ferror(f);
    fclose(f);
    if (!text || rd_err) {
        free(text);
        snprintf(err, errlen, "%s:0: cannot read case file", path);
        return -1;
    }
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        free(text);
        snprintf(err, errlen, "%s:0: not a text file (NUL byte)", path);
        return -1;
    }
    int rc = sp_cases_parse_text(path, text, out, err, errlen);
    free(text);
    return rc;
}

void sp_case_list_free(sp_case_list *l) {
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static int64_t scale_len(int64_t s, double f) {
    int64_t r = (int64_t)llround((double)s * f);
    return r < 1 ? 1 : r;
}

/* A varlen length scaled by f: lengths up to `floor` tokens stay (short sequences are what a
 * varlen case is about), longer ones become round(L * f) but not below `floor`. */
static int32_t scale_seq(int32_t len, double f, int64_t floor) {
    if (len <= floor) return len;
    int64_t r = (int64_t)llround((double)len * f);
    return (int32_t)(r < floor ? floor : r);
}

/* Scales every sequence of a varlen case (cases/README.md, "Varlen and paged cases"). */
static void scale_varlen(const sp_case *in, double f, sp_case *out) {
    const int bsa = in->op == SP_OP_BSA;
    const int64_t fq = bsa ? in->bx : 16, fkv = bsa ? in->by : 16;
    int64_t mq = 0, mkv = 0, tkv = 0;
    for (int64_t b = 0; b < in->nseq; b++) {
        int32_t lq = in->lens[b], lk = in->kvlens[b];
        int32_t sq = scale_seq(lq, f, fq), sk = scale_seq(lk, f, fkv);
        /* Keep the relation of the two sides: equal stays equal, longer keys stay longer. */
        if (lq == lk) sq = sk = sq > sk ? sq : sk;
        else if (lk > lq && sk < sq) sk = sq;
        else if (lk < lq && sk > sq) sk = sq;
        out->lens[b] = sq;
        out->kvlens[b] = sk;
        if (sq > mq) mq = sq;
        if (sk > mkv) mkv = sk;
        tkv += sk;
    }
    if (tkv < 1) out->kvlens[0] = 1; /* cannot happen (lengths >= 1 stay >= 1); keeps T >= 1 */
    if (bsa) {
        out->Sq = mq > 0 ? mq : 1;
        out->Skv = mkv > 0 ? mkv : 1;
        if (in->pattern == SP_PAT_WINDOW) out->window = (int64_t)llround((double)in->window * f);
    } else {
        out->S1 = mq > 0 ? mq : 1;
        out->S2 = mkv > 0 ? mkv : 1;
        int64_t nblk = (out->S2 + out->sbs - 1) / out->sbs;
        out->K = scale_len(in->K, f);
        if (out->K > nblk) out->K = nblk;
    }
}

void sp_case_scale(const sp_case *in, double f, sp_case *out) {
    *out = *in;
    if (!(f > 0.0) || f >= 1.0) return;
    out->scaled_by = f;
    if (in->varlen) {
        scale_varlen(in, f, out);
        return;
    }
    if (in->op == SP_OP_BSA) {
        /* Keep at least four block rows / columns (when the case had them) so that a window
         * still differs from causal and partial blocks, diagonals and random patterns still
         * occur; keep Sq == Skv when it was. */
        int64_t minq = 4 * in->bx < in->Sq ? 4 * in->bx : in->Sq;
        int64_t mink = 4 * in->by < in->Skv ? 4 * in->by : in->Skv;
        out->Sq = scale_len(in->Sq, f);
        out->Skv = scale_len(in->Skv, f);
        if (out->Sq < minq) out->Sq = minq;
        if (out->Skv < mink) out->Skv = mink;
        if (in->Sq == in->Skv) out->Sq = out->Skv = out->Sq > out->Skv ? out->Sq : out->Skv;
        /* A window is a token count: shrink it with the sequence so the band stays a band. */
        if (in->pattern == SP_PAT_WINDOW) out->window = (int64_t)llround((double)in->window * f);
    } else {
        out->S1 = scale_len(in->S1, f);
        out->S2 = scale_len(in->S2, f);
        if (in->S2 >= in->S1 && out->S2 < out->S1) out->S2 = out->S1;
        /* K shrinks with S2 so that each query still selects the same fraction of the keys
         * (otherwise a scaled case degenerates into dense attention); capped at the blocks
         * that exist. */
        int64_t nblk = (out->S2 + out->sbs - 1) / out->sbs;
        out->K = scale_len(in->K, f);
        if (out->K > nblk) out->K = nblk;
    }
}

/* " varlen Tq=.. Tkv=.. lens=a,b,...[,+n more] page=P" of a varlen case. */
static void varlen_str(const sp_case *c, char *buf, size_t n) {
    int64_t tq = 0, tkv = 0;
    for (int64_t b = 0; b < c->nseq; b++) {
        tq += c->lens[b];
        tkv += c->kvlens[b];
    }
    int k = snprintf(buf, n, " Tq=%lld Tkv=%lld lens=", (long long)tq, (long long)tkv);
    for (int64_t b = 0; b < c->nseq && b < 6 && k > 0 && (size_t)k < n; b++)
        k += snprintf(buf + k, n - (size_t)k, "%s%d", b ? "," : "", c->lens[b]);
    if (c->nseq > 6 && k > 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, ",..(%lld seqs)", (long long)c->nseq);
    if (c->page && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " page=%lld", (long long)c->page);
}

void sp_case_shape_str(const sp_case *c, char *buf, size_t n) {
    char vl[192] = "";
    if (c->varlen) varlen_str(c, vl, sizeof vl);
    if (c->op == SP_OP_BSA) {
        int k = snprintf(buf, n, "B=%lld N=%lld", (long long)c->B, (long long)c->N);
        if (c->Nkv != c->N) k += snprintf(buf + k, n - (size_t)k, " Nkv=%lld", (long long)c->Nkv);
        k += snprintf(buf + k, n - (size_t)k, " Sq=%lld Skv=%lld D=%lld bx=%lld by=%lld %s",
                      (long long)c->Sq, (long long)c->Skv, (long long)c->D, (long long)c->bx,
                      (long long)c->by, sp_pattern_name(c->pattern));
        if (c->pattern == SP_PAT_WINDOW)
            snprintf(buf + k, n - (size_t)k, " window=%lld", (long long)c->window);
        else if (c->pattern == SP_PAT_BIGBIRD)
            snprintf(buf + k, n - (size_t)k, " glob=%lld win=%lld rand=%lld", (long long)c->glob,
                     (long long)c->win, (long long)c->rnd);
        else if (c->pattern == SP_PAT_RANDOM)
            snprintf(buf + k, n - (size_t)k, " density=%g", c->density);
    } else {
        snprintf(buf, n, "B=%lld S1=%lld S2=%lld N1=%lld N2=%lld D=%lld Dr=%lld K=%lld sbs=%lld mode=%d%s",
                 (long long)c->B, (long long)c->S1, (long long)c->S2, (long long)c->N1,
                 (long long)c->N2, (long long)c->D, (long long)c->Dr, (long long)c->K,
                 (long long)c->sbs, c->mode, c->shared_kv ? "" : " kv=separate");
    }
    /* Varlen: Sq/Skv (S1/S2) above are max_seqlen; the lengths and pages follow. */
    size_t len = strlen(buf);
    if (vl[0] && len + 1 < n) snprintf(buf + len, n - len, "%s", vl);
}

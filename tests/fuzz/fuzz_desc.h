/*
 * Descriptor machinery shared by the API harnesses (fuzz_api.c, fuzz_api_more.c): a call is a
 * set of tensors built from a tiny consistent problem, mutated field by field from the input,
 * then given buffers of exactly their extent (ASan sees any access outside a descriptor), and
 * the oracles run after the call (see fuzz_api.c).
 */
#ifndef SPATTN_FUZZ_DESC_H
#define SPATTN_FUZZ_DESC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_input.h"
#include "spattn.h"

enum { NT = 14, NMUT = 16 };
#define CAP_BYTES (1 << 20)
#define CAP_NUMEL (1 << 16)

enum { K_FLOAT, K_MASK, K_IDX, K_LSE };

typedef struct ft {
    spattn_tensor t;
    int present;      /* 0: the argument is NULL */
    int is_output;
    int kind;         /* K_* : how its buffer is filled */
    int share;        /* -1: own buffer; else the tensor whose buffer it lives in */
    int64_t shift;    /* extra element offset inside the buffer */
    int null_data;
    int state;        /* 0 readable, 1 never valid (library must reject), 2 too big */
    int64_t lo, hi;   /* element extent */
    const int32_t *vals; /* when set (int32 tensors): the values, repeated (cu_seqlens...) */
    int nvals;
    uint8_t *buf, *snap; /* owners only */
    size_t bytes;
} ft;

typedef struct call {
    ft ts[NT];
    int nt;
    int64_t bx, by, sbs;
    int32_t mode, backward;
    double scale;
    int use_opt, ws_mode;
    spattn_options opt;
    size_t ws_bytes;
    int64_t nblk; /* sfa: ceil(S2/sbs) of the base problem (index fill) */
} call;

static uint8_t g_dummy[64] __attribute__((aligned(16)));

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A base descriptor: shape as given, layout chosen by `lay`. */
static void make(ft *f, int kind, int32_t dtype, int ndim, const int64_t *shape, int lay,
                 int is_output) {
    memset(f, 0, sizeof *f);
    f->present = 1;
    f->kind = kind;
    f->share = -1;
    f->is_output = is_output;
    f->t.device_type = SPATTN_DEVICE_CPU;
    f->t.dtype = dtype;
    f->t.ndim = ndim;
    int64_t order[SPATTN_MAX_DIMS];
    for (int i = 0; i < ndim; i++) order[i] = i;
    if (lay % 6 == 1 && ndim >= 3) { order[1] = 2; order[2] = 1; } /* transposed view */
    int64_t s = lay % 6 == 5 ? 2 : 1;                              /* interleaved */
    for (int j = ndim - 1; j >= 0; j--) {
        int64_t d = order[j];
        f->t.shape[d] = shape[d];
        f->t.strides[d] = s;
        s *= shape[d];
        if (j == ndim - 1 && lay % 6 == 2) s += 8; /* padded rows */
    }
    if (lay % 6 == 3) f->t.strides[0] = 0;                 /* broadcast over dim 0 */
    if (lay % 6 == 4) f->t.strides[ndim - 2] *= -1;       /* reversed rows */
}

/* Extent and state of a descriptor after the mutations. */
static void classify(ft *f) {
    spattn_tensor *t = &f->t;
    f->state = 0;
    if (!f->present || f->null_data) return;
    if (t->ndim < 1 || t->ndim > SPATTN_MAX_DIMS) { f->state = 1; return; }
    const __int128 lim = (__int128)1 << 62;
    __int128 lo = 0, hi = 0, numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 0) { f->state = 1; return; }
        /* One span past 2^62 elements already puts lo or hi past the limit below; refusing it
         * here keeps the sums and the byte product inside __int128 (2^63 x 2^63 per dimension,
         * summed over 8, is 2^129: a fuzzed input overflowed the product). */
        __int128 span = (__int128)t->strides[i] * (t->shape[i] - 1);
        if (span > lim || span < -lim) { f->state = 1; return; }
        if (span < 0) lo += span; else hi += span;
        if (numel <= CAP_NUMEL) numel *= t->shape[i];
    }
    size_t es = spattn_dtype_size((spattn_dtype)t->dtype);
    if (!es) { f->state = 1; return; }
    __int128 bytes = (hi - lo + 1 + f->shift) * (__int128)es;
    if (lo * (__int128)es < -lim || (hi + 1) * (__int128)es > lim) { f->state = 1; return; }
    if (bytes > CAP_BYTES || numel > CAP_NUMEL) { f->state = 2; return; }
    f->lo = (int64_t)lo;
    f->hi = (int64_t)hi;
}

static void fill(ft *f, uint64_t *seed, int64_t nblk) {
    size_t es = spattn_dtype_size((spattn_dtype)f->t.dtype);
    if (!es) es = 1;
    for (size_t i = 0; i + es <= f->bytes; i += es) {
        uint32_t r = (uint32_t)rng_next(seed);
        float x = (float)((int)(r % 4001) - 2000) / 1000.0f;
        uint32_t xb;
        memcpy(&xb, &x, 4);
        if (es == 1) {
            f->buf[i] = (uint8_t)(r >> 20) & 1;
        } else if (es == 2) {
            uint16_t h = f->t.dtype == SPATTN_DTYPE_BF16 ? (uint16_t)(xb >> 16)
                                                         : (uint16_t)(0x3800 | (r & 0x83FF));
            memcpy(f->buf + i, &h, 2);
        } else if (f->vals && f->nvals > 0) {
            memcpy(f->buf + i, &f->vals[(i / 4) % (size_t)f->nvals], 4);
        } else if (f->kind == K_IDX) {
            int32_t v = (int32_t)((r >> 8) % (uint32_t)(nblk + 1)) - 1;
            memcpy(f->buf + i, &v, 4);
        } else {
            memcpy(f->buf + i, &xb, 4);
        }
    }
}

/* Allocates the owners' buffers (each exactly as large as its members need), points every
 * descriptor at its place, fills and snapshots.  Returns 1 when a tensor is too big. */
static int place(call *c, uint64_t seed) {
    int big = 0;
    for (int i = 0; i < c->nt; i++) classify(&c->ts[i]);
    for (int o = 0; o < c->nt; o++) {
        ft *f = &c->ts[o];
        if (f->share >= 0) continue;
        size_t need = 0;
        for (int m = 0; m < c->nt; m++) {
            ft *g = &c->ts[m];
            if ((m == o || g->share == o) && g->present && !g->null_data && g->state == 0) {
                size_t es = spattn_dtype_size((spattn_dtype)g->t.dtype);
                size_t b = (size_t)(g->shift + g->hi - g->lo + 1) * es;
                if (b > need) need = b;
            }
        }
        f->bytes = need;
        /* zeroed: fill() writes whole elements, so a tail shorter than one stays as allocated,
         * and the unchanged-input check compares it (uninitialised bytes made valgrind report
         * and the fuzzer's comparison hooks see heap garbage) */
        f->buf = calloc(need ? need : 1, 1);
        f->snap = malloc(need ? need : 1);
        fill(f, &seed, c->nblk);
    }
    for (int m = 0; m < c->nt; m++) {
        ft *g = &c->ts[m];
        ft *own = g->share >= 0 ? &c->ts[g->share] : g;
        size_t es = spattn_dtype_size((spattn_dtype)g->t.dtype);
        if (g->state == 2) big = 1;
        if (g->null_data) g->t.data = NULL;
        else if (g->state != 0) g->t.data = g_dummy;
        else g->t.data = own->buf + (g->shift - g->lo) * (int64_t)es;
    }
    return big;
}

static const spattn_tensor *arg(call *c, int i) {
    return i < c->nt && c->ts[i].present ? &c->ts[i].t : NULL;
}

static void mutate(call *c, fz_in *in) {
    int nm = fz_range(in, NMUT + 1);
    for (int m = 0; m < nm && in->n; m++) {
        int what = fz_range(in, 16);
        ft *f = &c->ts[fz_range(in, c->nt)];
        int d = fz_range(in, SPATTN_MAX_DIMS);
        switch (what) {
        case 0: f->t.ndim = (int32_t)fz_i64(in); break;
        case 1: f->t.dtype = (int32_t)fz_i64(in); break;
        case 2: f->t.device_type = (int32_t)fz_i64(in); break;
        case 3: f->t.device_id = (int32_t)fz_i64(in); break;
        case 4: f->t.shape[d] = fz_i64(in); break;
        case 5: f->t.strides[d] = fz_i64(in); break;
        case 6: /* +-2 with wrap-around in unsigned arithmetic (no signed overflow near INT64_MAX) */
            f->t.shape[d] = (int64_t)((uint64_t)f->t.shape[d] + (uint64_t)(int64_t)(fz_range(in, 5) - 2));
            break;
        case 7: {
            int o = fz_range(in, c->nt);
            while (c->ts[o].share >= 0) o = c->ts[o].share;
            if (o != (int)(f - c->ts) && f->share < 0) {
                int self = (int)(f - c->ts), used = 0;
                for (int i = 0; i < c->nt; i++) used |= c->ts[i].share == self;
                if (!used) f->share = o;
            }
            break;
        }
        case 8: f->shift = fz_range(in, 64); break;
        case 9: f->null_data = 1; break;
        case 10: f->present = 0; break;
        case 11: c->bx = fz_i64(in); break;
        case 12: c->by = fz_i64(in); break;
        case 13: c->scale = fz_f64(in); break;
        case 14: c->sbs = fz_i64(in); c->mode = (int32_t)fz_i64(in); break;
        default: {
            int field = fz_range(in, 8);
            int32_t v = (int32_t)fz_i64(in);
            if (field == 0) c->opt.backend = v;
            else if (field == 1) c->opt.num_threads = v;
            else if (field == 2) c->opt.deterministic = v;
            else if (field == 3) c->opt.reserved[fz_range(in, 7)] = v;
            else if (field == 4) c->opt.cuda_stream = (void *)(uintptr_t)0x1000;
            else if (field == 5) c->ws_mode = fz_range(in, 4);
            else if (field == 6) c->backward = v;
            else c->use_opt = !c->use_opt;
        }
        }
    }
}

static inline int64_t small(fz_in *in, int lo, int n) { return lo + fz_range(in, n); }

static int opts_invalid(const call *c) {
    if (!c->use_opt) return 0;
    if (c->opt.deterministic != 0 && c->opt.deterministic != 1) return 1;
    for (int i = 0; i < 7; i++)
        if (c->opt.reserved[i]) return 1;
    return 0;
}

static void fail(const char *what, int st) {
    fprintf(stderr, "fuzz_api: %s (status %d: %s; last error: %s)\n", what, st,
            spattn_status_str((spattn_status)st), spattn_last_error());
    abort();
}

/* Up to 4 values written anywhere into the buffers after the fill (cu_seqlens, block tables,
 * indices, masks out of their ranges). */
static inline void apply_pokes(call *c, fz_in *in) {
    int n = fz_range(in, 5);
    for (int p = 0; p < n; p++) {
        ft *f = &c->ts[fz_range(in, c->nt)];
        unsigned at = fz_u8(in);
        int64_t v = fz_i64(in);
        if (f->share >= 0) f = &c->ts[f->share];
        size_t es = spattn_dtype_size((spattn_dtype)f->t.dtype);
        if (!f->buf || !es || f->bytes < es) continue;
        /* a whole element inside the buffer: bytes need not be a multiple of es (members of
         * other dtypes share it) */
        size_t off = (size_t)at % (f->bytes / es) * es;
        if (es == 4) { int32_t x = (int32_t)v; memcpy(f->buf + off, &x, 4); }
        else if (es == 2) { uint16_t x = (uint16_t)v; memcpy(f->buf + off, &x, 2); }
        else f->buf[off] = (uint8_t)v;
    }
}

/* Optional caller workspace of the options (none, small, larger, NULL with a size); the
 * buffers are snapshot here, after the inputs were placed. */
static uint8_t *setup_workspace(call *c, fz_in *in) {
    uint8_t *ws = NULL;
    size_t ws_cap = 0;
    if (c->ws_mode == 1 || c->ws_mode == 2) {
        ws_cap = (size_t)fz_range(in, 64) << (c->ws_mode == 1 ? 4 : 12);
        ws = malloc(ws_cap ? ws_cap : 1);
        c->opt.workspace = ws;
        c->opt.workspace_size = ws_cap;
    } else if (c->ws_mode == 3) {
        c->opt.workspace = NULL;
        c->opt.workspace_size = 1 + (size_t)fz_range(in, 255);
    }
    for (int i = 0; i < c->nt; i++)
        if (c->ts[i].buf) memcpy(c->ts[i].snap, c->ts[i].buf, c->ts[i].bytes);
    return ws;
}

/* Logical bytes of the call's tensors (stride-0 views count every element), each row (last
 * dimension) counted as at least 256 bytes, saturating.  The floor: the CPU kernels keep per-row
 * scratch that does not shrink with the row (fp32 score tiles of 64 keys per head, rows padded to
 * 16 lanes), so with a tiny D (8) and billions of heads their buffers are ~125x the bare bytes
 * (a fuzzer find, 2026-12-03: sfa varlen backward, 4.3e9 heads of D 8). */
static __int128 logical_bytes(const call *c) {
    /* saturating at 2^80 a tensor: far past any bound it is compared with, and small enough that
     * the sum over NT tensors times 64 times an int32 thread count stays inside __int128 */
    const __int128 cap = (__int128)1 << 80;
    __int128 total = 0;
    for (int i = 0; i < c->nt; i++) {
        const spattn_tensor *t = &c->ts[i].t;
        if (!c->ts[i].present || t->ndim < 1 || t->ndim > SPATTN_MAX_DIMS) continue;
        __int128 n = (__int128)spattn_dtype_size((spattn_dtype)t->dtype) * (t->shape[t->ndim - 1] > 0 ? t->shape[t->ndim - 1] : 0);
        if (n > 0 && n < 256) n = 256;
        for (int d = 0; d < t->ndim - 1 && n > 0; d++) {
            const int64_t e = t->shape[d] > 0 ? t->shape[d] : 0;
            n = e != 0 && n > cap / e ? cap : n * e;  /* n <= cap and e < 2^63: no overflow */
        }
        total += n < cap ? n : cap;
    }
    return total;
}

/* The oracles after a call (ran = 0: a size query, which writes nothing), then frees.  A size
 * answer above 1 TiB is absurd (a wrapped or runaway computation) unless the tensors' views
 * are that large themselves (stride-0 views over billions of heads or keys): the CPU buffers
 * are at most a few dozen times the problem's own logical size (rows floored as above) per
 * thread. */
static void check_and_free(call *c, spattn_status st, int ran, size_t bytes, uint8_t *ws) {
    if (st != SPATTN_STATUS_SUCCESS && spattn_last_error()[0] == '\0') fail("error without a message", st);
    if (opts_invalid(c) && st == SPATTN_STATUS_SUCCESS) fail("invalid options accepted", st);
    /* per-thread buffers: the bound grows with the threads the call may use */
    long th = c->opt.num_threads > 0 ? (long)c->opt.num_threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (th < 1) th = 1;
    if (st == SPATTN_STATUS_SUCCESS && !ran && c->use_opt && c->opt.workspace && bytes > (size_t)1 << 40 &&
        (__int128)bytes > 64 * (__int128)th * logical_bytes(c))
        fail("absurd workspace size", st);
    int runtime_err = st == SPATTN_STATUS_OUT_OF_MEMORY || st == SPATTN_STATUS_CUDA_ERROR ||
                      st == SPATTN_STATUS_INTERNAL;
    for (int o = 0; o < c->nt; o++) {
        ft *f = &c->ts[o];
        if (!f->buf || !f->bytes) continue;
        int has_out = 0;
        for (int m = 0; m < c->nt; m++)
            if ((m == o || c->ts[m].share == o) && c->ts[m].present && c->ts[m].is_output) has_out = 1;
        int may_change = ran && has_out && (st == SPATTN_STATUS_SUCCESS || runtime_err);
        if (!may_change && memcmp(f->buf, f->snap, f->bytes) != 0)
            fail(has_out ? "an output was written although the call failed" : "an input was written", st);
    }
    for (int i = 0; i < c->nt; i++) {
        free(c->ts[i].buf);
        free(c->ts[i].snap);
    }
    free(ws);
}

#endif

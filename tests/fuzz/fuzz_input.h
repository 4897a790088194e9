/*
 * Byte reader shared by the fuzz harnesses: turns the fuzzer's input into integers, picks and
 * "interesting" values (boundaries of int32/int64, powers of two, sizes around the ones the
 * library checks).  Reading past the end yields zeros, so every input is a valid program.
 */
#ifndef SPATTN_FUZZ_INPUT_H
#define SPATTN_FUZZ_INPUT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

static inline uint64_t fz_bytes(fz_in *in, int nbytes) {
    uint64_t v = 0;
    for (int i = 0; i < nbytes; i++) {
        uint64_t b = 0;
        if (in->n) {
            b = *in->p++;
            in->n--;
        }
        v |= b << (8 * i);
    }
    return v;
}

static inline unsigned fz_u8(fz_in *in) { return (unsigned)fz_bytes(in, 1); }

/* 0 .. n-1 (n >= 1) from one byte. */
static inline int fz_range(fz_in *in, int n) { return (int)(fz_u8(in) % (unsigned)n); }

/* An int64 from a table of boundaries, a small value, or 8 raw bytes. */
static inline int64_t fz_i64(fz_in *in) {
    static const int64_t kTable[] = {
        0, 1, -1, 2, 3, 4, 7, 8, 9, 16, 24, 64, 128, 129, 256, 257, 1024, 1025, 1 << 24,
        (1LL << 24) + 1, INT32_MAX, (int64_t)INT32_MAX + 1, INT32_MIN, (1LL << 31) + 4,
        (1LL << 32), (1LL << 32) + 4, 1LL << 40, 1LL << 53, 1LL << 62, (1LL << 62) + 1,
        INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1, -2, -8, -(1LL << 32), -(1LL << 62)};
    unsigned sel = fz_u8(in);
    int nt = (int)(sizeof kTable / sizeof kTable[0]);
    if (sel < (unsigned)nt) return kTable[sel];
    if (sel < 0xF0) return (int64_t)(sel - (unsigned)nt) - 16;
    return (int64_t)fz_bytes(in, 8);
}

/* A double: specials (NaN, +-Inf, beyond fp32, subnormals), small values or raw bits. */
static inline double fz_f64(fz_in *in) {
    static const double kTable[] = {0.0, 1.0, -1.0, 0.125, 0.5, 2.0, 1e-3, 1e30, 3.4e38, 3.5e38,
                                    1e39, -1e39, 1e300, 1e-45, 1e-320, -0.0};
    unsigned sel = fz_u8(in);
    if (sel < 16) return kTable[sel];
    if (sel == 16) return NAN;
    if (sel == 17) return INFINITY;
    if (sel == 18) return -INFINITY;
    if (sel < 0xF0) return ((double)sel - 128.0) / 16.0;
    uint64_t bits = fz_bytes(in, 8);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

#endif

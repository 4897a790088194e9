/*
 * Minimal test harness shared by tests/test_*.c: a seeded RNG, pass/fail counters and a summary
 * line "N passed, N failed" (exit code 1 on any failure).  Header-only.
 */
#ifndef SPATTN_TESTUTIL_H
#define SPATTN_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spattn.h"

static int tu_passed, tu_failed;

/* Records one check; prints the failure with its location. */
#define TU_CHECK(cond, ...)                                                              \
    do {                                                                                 \
        if (cond) {                                                                      \
            tu_passed++;                                                                 \
        } else {                                                                         \
            tu_failed++;                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
        }                                                                                \
    } while (0)

static inline int tu_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}

/* xoshiro256** seeded by splitmix64: reproducible across platforms. */
typedef struct tu_rng { uint64_t s[4]; } tu_rng;

static inline uint64_t tu_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline void tu_seed(tu_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = tu_splitmix(&seed);
}
static inline uint64_t tu_next(tu_rng *r) {
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t res = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}
/* Uniform in [0, 1). */
static inline double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1.0p-53; }
/* Uniform integer in [lo, hi]. */
static inline int64_t tu_range(tu_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_next(r) % (uint64_t)(hi - lo + 1));
}
/* Standard normal (Box-Muller). */
static inline double tu_normal(tu_rng *r) {
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
/* Seed from the environment (SPATTN_TEST_SEED) or the given default; printed for replay. */
static inline uint64_t tu_test_seed(uint64_t dflt) {
    const char *e = getenv("SPATTN_TEST_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0) : dflt;
    printf("seed %llu (set SPATTN_TEST_SEED to replay)\n", (unsigned long long)s);
    return s;
}
#endif

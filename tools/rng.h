/*
 * The seeded generator behind every generated input (documented bit for bit in docs/cli.md so
 * that peer scripts can reproduce the inputs): xoshiro256** seeded through splitmix64, one
 * independent stream per tensor.
 */
#ifndef SPATTN_CLI_RNG_H
#define SPATTN_CLI_RNG_H

#include <stdint.h>

/* Stream ids: the tensor a stream feeds. */
enum { SP_STREAM_Q = 1, SP_STREAM_K = 2, SP_STREAM_V = 3, SP_STREAM_DOUT = 4,
       SP_STREAM_MASK = 5, SP_STREAM_IDX = 6,
       /* varlen cases: the length generator (seeded by lens_seed=) and the page shuffle */
       SP_STREAM_LENS = 7, SP_STREAM_PAGES = 8 };

typedef struct sp_rng {
    uint64_t s[4];
    int has_spare;
    double spare;
} sp_rng;

void sp_rng_init(sp_rng *r, uint64_t seed, uint64_t stream);
/* Generator of chunk `chunk` of a normal-valued tensor (chunk 0 equals sp_rng_init). */
void sp_rng_init_chunk(sp_rng *r, uint64_t seed, uint64_t stream, uint64_t chunk);
uint64_t sp_rng_next(sp_rng *r);
/* (x >> 11) * 2^-53: uniform in [0, 1). */
double sp_rng_uniform(sp_rng *r);
/* floor(uniform * n): uniform integer in [0, n), n >= 1. */
int64_t sp_rng_below(sp_rng *r, int64_t n);
/* Standard normal, Box-Muller; each pair of uniforms gives two values (cos, then sin). */
double sp_rng_normal(sp_rng *r);

#endif

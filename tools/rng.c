#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sp_rng_init_chunk(sp_rng *r, uint64_t seed, uint64_t stream, uint64_t chunk) {
    /* Streams and chunks differ in the splitmix start; splitmix's mixing makes them
     * independent. */
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull) ^ (chunk * 0x9e6c63d0676a9a99ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
    r->has_spare = 0;
    r->spare = 0.0;
}

void sp_rng_init(sp_rng *r, uint64_t seed, uint64_t stream) { sp_rng_init_chunk(r, seed, stream, 0); }

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sp_rng_next(sp_rng *r) {
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double sp_rng_uniform(sp_rng *r) { return (double)(sp_rng_next(r) >> 11) * 0x1.0p-53; }

int64_t sp_rng_below(sp_rng *r, int64_t n) {
    int64_t v = (int64_t)(sp_rng_uniform(r) * (double)n);
    return v < n ? v : n - 1; /* guards the (impossible in exact arithmetic) v == n */
}

double sp_rng_normal(sp_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = 1.0 - sp_rng_uniform(r); /* (0, 1]: log stays finite */
    double u2 = sp_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    double th = 6.283185307179586476925 * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}

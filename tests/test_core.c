/* Core pieces: dtype conversions (exhaustive where feasible), status strings, descriptors,
 * stride/overlap checks, options. */
#include "core/check.h"
#include "core/dtype.h"
#include "testutil.h"

/* fp32 -> fp16 by exact arithmetic on doubles (round to nearest even), independent of dtype.h. */
static uint16_t f16_by_double(float f) {
    if (isnan(f)) return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00;
    /* candidates: enumerate the two neighbours via frexp */
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    if (a == 0) return sign;
    int exp16 = e - 1 + 15;  /* biased exponent of a normal half */
    double ulp = exp16 >= 1 ? ldexp(1.0, e - 11) : ldexp(1.0, -24);
    double q = a / ulp;
    double fl = floor(q), r = q - fl;
    if (r > 0.5 || (r == 0.5 && fmod(fl, 2.0) == 1.0)) fl += 1.0;
    double v = fl * ulp;
    (void)m;
    /* encode v */
    if (v >= 65520.0) return sign | 0x7c00;
    if (v < ldexp(1.0, -14)) return sign | (uint16_t)(v / ldexp(1.0, -24));
    int ev;
    double mv = frexp(v, &ev);
    uint16_t bits = (uint16_t)(((ev - 1 + 15) << 10) | ((uint16_t)((mv * 2.0 - 1.0) * 1024.0) & 0x3ff));
    return sign | bits;
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(1));
    /* fp16 -> fp32 -> fp16 round trip for every non-NaN bit pattern. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = spattn_f16_to_f32((uint16_t)h);
        if (isnan(f)) { bad += !((h & 0x7c00) == 0x7c00 && (h & 0x3ff)); continue; }
        bad += spattn_f32_to_f16(f) != h;
    }
    TU_CHECK(bad == 0, "fp16 round trip: %d bit patterns wrong", bad);
    /* fp16 decode of known values */
    TU_CHECK(spattn_f16_to_f32(0x3c00) == 1.0f && spattn_f16_to_f32(0x0001) == ldexpf(1.0f, -24) &&
             spattn_f16_to_f32(0x7bff) == 65504.0f && isinf(spattn_f16_to_f32(0xfc00)),
             "fp16 decode of known values");
    /* fp32 -> fp16 on random floats of every magnitude, incl. ties, vs exact rounding. */
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)tu_next(&r);
        if (i % 3 == 0) u = (u & 0x8000ffffu) | ((uint32_t)tu_range(&r, 100, 145) << 23); /* half range */
        if (i % 7 == 0) u &= 0xffffe000u | 0x1000u; /* exact ties */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        bad += spattn_f32_to_f16(f) != f16_by_double(f);
    }
    TU_CHECK(bad == 0, "fp32->fp16 rounding: %d mismatches", bad);
    /* bf16: round trip and nearest-even on ties. */
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = spattn_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        bad += spattn_f32_to_bf16(f) != h;
    }
    TU_CHECK(bad == 0, "bf16 round trip: %d wrong", bad);
    TU_CHECK(spattn_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even (down)");
    TU_CHECK(spattn_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie to even (up)");
    TU_CHECK(isnan(spattn_bf16_to_f32(spattn_f32_to_bf16(NAN))), "bf16 NaN stays NaN");

    /* status strings and version */
    TU_CHECK(strstr(spattn_status_str(SPATTN_STATUS_BAD_SHAPE), "BAD_SHAPE") != NULL, "status str");
    TU_CHECK(strstr(spattn_status_str((spattn_status)12345), "UNKNOWN") != NULL, "unknown status");
    int ma = -1, mi = -1, pa = -1;
    TU_CHECK(strcmp(spattn_version(&ma, &mi, &pa), SPATTN_VERSION_STRING) == 0 &&
             ma == SPATTN_VERSION_MAJOR && mi == SPATTN_VERSION_MINOR && pa == SPATTN_VERSION_PATCH,
             "version");
    TU_CHECK(spattn_dtype_size(SPATTN_DTYPE_BF16) == 2 && spattn_dtype_size((spattn_dtype)99) == 0, "dtype size");

    /* descriptors, overlap, self overlap */
    float buf[4 * 6 * 10];
    int64_t sh[2] = {6, 10};
    spattn_tensor a = spattn_tensor_make(buf, SPATTN_DTYPE_F32, 2, sh, NULL);
    TU_CHECK(a.strides[0] == 10 && a.strides[1] == 1, "contiguous strides");
    spattn_tensor b = a;
    TU_CHECK(spattn_tensors_overlap(&a, &b), "identical views overlap");
    b.data = buf + 60;
    TU_CHECK(!spattn_tensors_overlap(&a, &b), "adjacent views do not overlap");
    b.data = buf + 59;
    TU_CHECK(spattn_tensors_overlap(&a, &b), "views sharing one element overlap");
    /* column split of a [6, 10] buffer into [6, 8] and [6, 2] */
    int64_t s8[2] = {6, 8}, s2[2] = {6, 2}, st[2] = {10, 1};
    spattn_tensor c1 = spattn_tensor_make(buf, SPATTN_DTYPE_F32, 2, s8, st);
    spattn_tensor c2 = spattn_tensor_make(buf + 8, SPATTN_DTYPE_F32, 2, s2, st);
    TU_CHECK(!spattn_tensors_overlap(&c1, &c2) && !spattn_tensors_overlap(&c2, &c1), "column split is disjoint");
    c2.data = buf + 7;
    TU_CHECK(spattn_tensors_overlap(&c1, &c2), "column split sharing a column overlaps");
    /* split along a non-innermost dimension: a transposed [10, 6] buffer viewed as [6, 10]
     * (strides {1, 6}) cut into columns [0, 8) and [8, 10) */
    int64_t tst[2] = {1, 6};
    spattn_tensor t1 = spattn_tensor_make(buf, SPATTN_DTYPE_F32, 2, s8, tst);
    spattn_tensor t2 = spattn_tensor_make(buf + 8 * 6, SPATTN_DTYPE_F32, 2, s2, tst);
    TU_CHECK(!spattn_tensors_overlap(&t1, &t2) && !spattn_tensors_overlap(&t2, &t1),
             "split along a strided dimension is disjoint");
    t2.data = buf + 7 * 6;
    TU_CHECK(spattn_tensors_overlap(&t1, &t2), "strided split sharing a column overlaps");
    /* same shapes and strides but a shift that wraps into the other dimension's range */
    int64_t w4[2] = {6, 4}, wst[2] = {5, 1};
    spattn_tensor w1 = spattn_tensor_make(buf, SPATTN_DTYPE_F32, 2, w4, wst);
    spattn_tensor w2 = spattn_tensor_make(buf + 4, SPATTN_DTYPE_F32, 2, w4, wst);
    TU_CHECK(spattn_tensors_overlap(&w1, &w2), "shift into the next row overlaps (merged view overlaps itself)");
    spattn_tensor z = a;
    z.strides[0] = 0;
    TU_CHECK(spattn_check_no_self_overlap("z", &z) == SPATTN_STATUS_BAD_STRIDE, "stride 0 output rejected");
    z.strides[0] = 5; /* rows overlap */
    TU_CHECK(spattn_check_no_self_overlap("z", &z) == SPATTN_STATUS_BAD_STRIDE, "overlapping rows rejected");
    z.strides[0] = -10; /* negative strides are fine */
    TU_CHECK(spattn_check_no_self_overlap("z", &z) == SPATTN_STATUS_SUCCESS, "negative stride accepted");
    spattn_tensor t = spattn_tensor_make(buf, SPATTN_DTYPE_F32, 2, sh, NULL);
    t.strides[0] = INT64_MAX / 2;
    TU_CHECK(spattn_check_strides("t", &t) == SPATTN_STATUS_BAD_STRIDE &&
             strstr(spattn_last_error(), "t:") != NULL, "stride overflow rejected with a message");
    /* no 64-bit overflow, but more bytes than any address space (found by fuzz_api_more: a mask
     * view [4, 2, 1, 2] with a head stride of 4.9e18 was read there) */
    const int64_t hs[4] = {4, 2, 1, 2}, hst[4] = {0, 4919355760141402112LL, 2, 1};
    spattn_tensor hv = spattn_tensor_make(buf, SPATTN_DTYPE_U8, 4, hs, hst);
    TU_CHECK(spattn_check_strides("m", &hv) == SPATTN_STATUS_BAD_STRIDE &&
             strstr(spattn_last_error(), "2^57") != NULL, "view beyond any address space rejected: %s",
             spattn_last_error());
    hv.strides[1] = (int64_t)1 << 40; /* 2^40 bytes: not refused by this check */
    TU_CHECK(spattn_check_strides("m", &hv) == SPATTN_STATUS_SUCCESS, "a 2^40-byte view passes the stride check");
    spattn_options o;
    spattn_options_init(&o);
    TU_CHECK(o.backend == SPATTN_BACKEND_AUTO && o.deterministic == 1 && o.workspace == NULL, "options defaults");
    spattn_exec ex;
    int cu;
    o.backend = 7;
    TU_CHECK(spattn_resolve_exec(&o, &a, &ex, &cu) == SPATTN_STATUS_BAD_OPTIONS, "bad backend option");
    return tu_summary("test_core");
}

/* Bit-exactness of kernels/cpu/quant.c against the reference semantics: torch's casts
 * (float8_e4m3fn: round to nearest even with subnormals, [464 exclusive, 480) rounds onto the
 * NaN code, 480 and above NaN; bf16/f16 round to nearest even) and the transformers
 * deepseek_v41 QAT quantizers (`_fake_quant_fp8_block`, `_fake_quant_fp4_block`,
 * `_e2m1_codes`, `_pow2_ceil_scale`).
 *
 * The references here are written independently of quant.c: values are rounded on their
 * grid in double precision with nearbyint (round half to even), then compared. */
#include "bt_test.h"

#include "kernels/cpu/quant.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A float spread over all exponents, or over [2^lo, 2^hi) with a random sign. */
static float rnd_float_range(int lo, int hi)
{
    float m = 1.0f + (float)(rnd() & 0x7fffff) * 0x1p-23f;
    int e = lo + (int)(rnd() % (uint64_t)(hi - lo));
    float v = ldexpf(m, e);
    return (rnd() & 1) ? -v : v;
}

/* |a| rounded onto a binary grid with `mbits` mantissa bits and minimum normal exponent
 * `emin` (subnormals below), half to even. Exact in double for every float input. */
static double grid_round(double a, int mbits, int emin)
{
    if (a == 0.0) return 0.0;
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;
    if (e < emin) e = emin;
    double step = ldexp(1.0, e - mbits);
    return nearbyint(a / step) * step;
}

static int same_bits(float a, float b)
{
    return f2u(a) == f2u(b);
}

/* ---- e4m3 ------------------------------------------------------------------------------ */

/* Reference float8_e4m3fn code of x (torch semantics). */
static uint8_t ref_e4m3(float x)
{
    uint8_t sign = (f2u(x) >> 31) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7f;
    double v = grid_round(fabs((double)x), 3, -6);
    if (v > 448.0) return sign | 0x7f; /* also inf */
    for (int c = 0; c < 0x7f; c++)
        if ((double)bt_e4m3_to_f32((uint8_t)c) == v) return sign | (uint8_t)c;
    return 0xee; /* unreachable: v lies on the grid */
}

static void test_e4m3_decode(void)
{
    BT_CHECK(bt_e4m3_to_f32(0x00) == 0.0f && !signbit(bt_e4m3_to_f32(0x00)));
    BT_CHECK(bt_e4m3_to_f32(0x80) == 0.0f && signbit(bt_e4m3_to_f32(0x80)));
    BT_CHECK(bt_e4m3_to_f32(0x01) == 0x1p-9f);   /* smallest subnormal */
    BT_CHECK(bt_e4m3_to_f32(0x07) == 7 * 0x1p-9f); /* largest subnormal */
    BT_CHECK(bt_e4m3_to_f32(0x08) == 0x1p-6f);   /* smallest normal */
    BT_CHECK(bt_e4m3_to_f32(0x38) == 1.0f);
    BT_CHECK(bt_e4m3_to_f32(0x7e) == 448.0f);
    BT_CHECK(bt_e4m3_to_f32(0xfe) == -448.0f);
    BT_CHECK(bt_e4m3_to_f32(0x78) == 256.0f); /* exponent 15 is a normal exponent in fn */
    BT_CHECK(isnan(bt_e4m3_to_f32(0x7f)) && isnan(bt_e4m3_to_f32(0xff)));
    /* strictly increasing over the positive codes */
    for (int c = 1; c < 0x7f; c++)
        BT_CHECK(bt_e4m3_to_f32((uint8_t)c) > bt_e4m3_to_f32((uint8_t)(c - 1)));
}

static void test_e4m3_round_trip_all_codes(void)
{
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float v = bt_e4m3_to_f32((uint8_t)c);
        uint8_t back = bt_f32_to_e4m3(v);
        if ((c & 0x7f) == 0x7f)
            bad += (back & 0x7f) != 0x7f; /* NaN stays NaN */
        else
            bad += back != c;
    }
    BT_CHECK_EQ_INT(bad, 0);
}

static void test_e4m3_rounding(void)
{
    /* ties in the normal range: 1 + 1/16 is halfway between 1 and 1.125 -> even (1) */
    BT_CHECK(bt_f32_to_e4m3(1.0625f) == 0x38);
    BT_CHECK(bt_f32_to_e4m3(1.1875f) == 0x3a); /* 1.125 | 1.25 -> 1.25 (even) */
    BT_CHECK(bt_f32_to_e4m3(nextafterf(1.0625f, 2.0f)) == 0x39);
    BT_CHECK(bt_f32_to_e4m3(-1.0625f) == 0xb8);
    /* a tie that carries into the next binade: 1.9375 | 2 -> 2 */
    BT_CHECK(bt_f32_to_e4m3(1.9375f) == 0x40);
    /* subnormals: steps of 2^-9, ties to even */
    BT_CHECK(bt_f32_to_e4m3(0x1p-9f) == 0x01);
    BT_CHECK(bt_f32_to_e4m3(0x1p-10f) == 0x00);          /* 0.5 step -> 0 (even) */
    BT_CHECK(bt_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)) == 0x01);
    BT_CHECK(bt_f32_to_e4m3(3 * 0x1p-10f) == 0x02);      /* 1.5 steps -> 2 */
    BT_CHECK(bt_f32_to_e4m3(5 * 0x1p-10f) == 0x02);      /* 2.5 steps -> 2 */
    BT_CHECK(bt_f32_to_e4m3(15 * 0x1p-10f) == 0x08);     /* 7.5 steps -> 8 = smallest normal */
    BT_CHECK(bt_f32_to_e4m3(nextafterf(0x1p-6f, 0.0f)) == 0x08);
    BT_CHECK(bt_f32_to_e4m3(0x1p-20f) == 0x00);
    BT_CHECK(bt_f32_to_e4m3(-0x1p-20f) == 0x80);
    BT_CHECK(bt_f32_to_e4m3(FLT_TRUE_MIN) == 0x00);
    /* zero keeps its sign */
    BT_CHECK(bt_f32_to_e4m3(0.0f) == 0x00);
    BT_CHECK(bt_f32_to_e4m3(-0.0f) == 0x80);
    /* saturation: 448 max; 464 ties down to 448; (464, 480) and up are NaN */
    BT_CHECK(bt_f32_to_e4m3(448.0f) == 0x7e);
    BT_CHECK(bt_f32_to_e4m3(460.0f) == 0x7e);
    BT_CHECK(bt_f32_to_e4m3(464.0f) == 0x7e);
    BT_CHECK(bt_f32_to_e4m3(-464.0f) == 0xfe);
    BT_CHECK(bt_f32_to_e4m3(nextafterf(464.0f, 1000.0f)) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(470.0f) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(nextafterf(480.0f, 0.0f)) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(480.0f) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(1e30f) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(-1e30f) == 0xff);
    BT_CHECK(bt_f32_to_e4m3(INFINITY) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(-INFINITY) == 0xff);
    BT_CHECK((bt_f32_to_e4m3(NAN) & 0x7f) == 0x7f);
    BT_CHECK(bt_f32_to_e4m3(u2f(0xffc00000u)) == 0xff); /* negative NaN keeps its sign */
}

/* Every float whose low 12 mantissa bits take a few telling patterns (the rounding of e4m3
 * is decided by mantissa bit 19 and the bits below), plus random floats. */
static void test_e4m3_sweep(void)
{
    static const uint32_t lows[] = {0x000, 0x001, 0x7ff, 0x800, 0x801, 0xfff};
    long bad = 0;
    for (uint32_t top = 0; top < (1u << 20); top++) {
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
            float x = u2f((top << 12) | lows[k]);
            uint8_t got = bt_f32_to_e4m3(x), want = ref_e4m3(x);
            if (isnan(x) ? (got & 0x7f) != 0x7f || (got & 0x80) != (want & 0x80) : got != want) {
                if (bad < 5)
                    fprintf(stderr, "  e4m3(%a) = 0x%02x, want 0x%02x\n", (double)x, got, want);
                bad++;
            }
        }
    }
    for (int i = 0; i < 1000000; i++) {
        float x = rnd_float_range(-14, 10);
        bad += bt_f32_to_e4m3(x) != ref_e4m3(x);
    }
    BT_CHECK_EQ_INT(bad, 0);
}

/* ---- e8m0, e2m1, pow2 ceil ---------------------------------------------------------------- */

static void test_e8m0(void)
{
    BT_CHECK(bt_e8m0_to_f32(127) == 1.0f);
    BT_CHECK(bt_e8m0_to_f32(128) == 2.0f);
    BT_CHECK(bt_e8m0_to_f32(0) == 0x1p-127f);
    BT_CHECK(bt_e8m0_to_f32(254) == 0x1p127f);
    BT_CHECK(isnan(bt_e8m0_to_f32(255)));
}

static const float e2m1_grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* Reference e2m1 code of a value in [-6, 6]: nearest grid value, a tie to the even code. */
static uint8_t ref_e2m1(float x)
{
    double a = fabs((double)x);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs(a - e2m1_grid[c]), db = fabs(a - e2m1_grid[best]);
        if (d < db || (d == db && !(c & 1))) best = c;
    }
    return (uint8_t)best | ((f2u(x) >> 31) ? 8 : 0);
}

static void test_e2m1(void)
{
    for (int c = 0; c < 16; c++) {
        float v = bt_e2m1_to_f32((uint8_t)c);
        BT_CHECK(fabsf(v) == e2m1_grid[c & 7] && (signbit(v) != 0) == ((c & 8) != 0));
        BT_CHECK(bt_f32_to_e2m1(v) == c); /* -0 (code 8) included */
    }
    /* boundaries: a tie goes to the even code — down at 0.25 1.25 2.5 5.0, up at 0.75 1.75 3.5 */
    static const struct {
        float x;
        uint8_t code;
    } ties[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
                {-0.25f, 8}, {-0.75f, 10}, {-1.25f, 10}, {-1.75f, 12}, {-2.5f, 12}, {-3.5f, 14},
                {-5.0f, 14}, {6.0f, 7}, {-6.0f, 15}, {0.0f, 0}, {-0.0f, 8}};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++)
        BT_CHECK_MSG(bt_f32_to_e2m1(ties[i].x) == ties[i].code, "%g -> %d, want %d",
                     (double)ties[i].x, bt_f32_to_e2m1(ties[i].x), ties[i].code);
    /* one ulp either side of every boundary */
    static const float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 7; i++) {
        BT_CHECK(bt_f32_to_e2m1(nextafterf(bounds[i], 0.0f)) == i);
        BT_CHECK(bt_f32_to_e2m1(nextafterf(bounds[i], 10.0f)) == i + 1);
    }
    int bad = 0;
    for (int i = 0; i < 1000000; i++) {
        float x = (float)((double)(rnd() % 12000001) / 1000000.0 - 6.0);
        bad += bt_f32_to_e2m1(x) != ref_e2m1(x);
    }
    BT_CHECK_EQ_INT(bad, 0);
}

static void test_pow2_ceil(void)
{
    /* exact powers of two stay */
    for (int k = -126; k <= 127; k++) BT_CHECK(bt_pow2_ceil(ldexpf(1.0f, k)) == ldexpf(1.0f, k));
    /* anything else rounds up */
    BT_CHECK(bt_pow2_ceil(nextafterf(1.0f, 2.0f)) == 2.0f);
    BT_CHECK(bt_pow2_ceil(nextafterf(1.0f, 0.0f)) == 1.0f);
    BT_CHECK(bt_pow2_ceil(3.0f) == 4.0f);
    BT_CHECK(bt_pow2_ceil(0.3f) == 0.5f);
    BT_CHECK(bt_pow2_ceil(100.0f / 448.0f) == 0.25f);
    int bad = 0;
    for (int i = 0; i < 1000000; i++) {
        float t = fabsf(rnd_float_range(-125, 127));
        int e;
        float m = frexpf(t, &e); /* t = m 2^e, m in [0.5, 1) */
        float want = m == 0.5f ? t : ldexpf(1.0f, e);
        bad += bt_pow2_ceil(t) != want;
    }
    BT_CHECK_EQ_INT(bad, 0);
    /* from the IEEE bits (the reference kernel's trick): subnormals give 2^-126, zero 2^-127,
     * infinity 2^128 = inf and NaN 2^129 = inf */
    BT_CHECK(bt_pow2_ceil(FLT_TRUE_MIN) == 0x1p-126f);
    BT_CHECK(bt_pow2_ceil(0x1p-127f) == 0x1p-126f);
    BT_CHECK(bt_pow2_ceil(0.0f) == 0x1p-127f);
    BT_CHECK(isinf(bt_pow2_ceil(INFINITY)) && isinf(bt_pow2_ceil(NAN)));
}

/* ---- bf16 / f16 ------------------------------------------------------------------------- */

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float v = bt_bf16_to_f32((uint16_t)h);
        BT_CHECK(f2u(v) == h << 16);
        uint16_t back = bt_f32_to_bf16(v);
        if (isnan(v))
            bad += !isnan(bt_bf16_to_f32(back)) || (back & 0x8000) != (h & 0x8000);
        else
            bad += back != h;
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK(bt_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);              /* tie -> even */
    BT_CHECK(bt_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);          /* tie -> even (up) */
    BT_CHECK(bt_f32_to_bf16(nextafterf(1.0f + 0x1p-8f, 2.0f)) == 0x3f81);
    BT_CHECK(bt_f32_to_bf16(-0.0f) == 0x8000);
    BT_CHECK(bt_f32_to_bf16(INFINITY) == 0x7f80 && bt_f32_to_bf16(-INFINITY) == 0xff80);
    BT_CHECK(bt_f32_to_bf16(FLT_MAX) == 0x7f80); /* rounds past the largest bf16 */
    BT_CHECK(isnan(bt_bf16_to_f32(bt_f32_to_bf16(NAN))));
    /* a NaN whose payload lives only in the low 16 bits must not become infinity */
    BT_CHECK(isnan(bt_bf16_to_f32(bt_f32_to_bf16(u2f(0x7f800001u)))));
    BT_CHECK(isnan(bt_bf16_to_f32(bt_f32_to_bf16(u2f(0xff800001u)))));
    for (int i = 0; i < 1000000; i++) {
        float x = u2f((uint32_t)rnd());
        if (isnan(x)) continue;
        double want = grid_round(fabs((double)x), 7, -126);
        float got = bt_bf16_to_f32(bt_f32_to_bf16(x));
        float w = want > 0x1.fep127 ? INFINITY : (float)want;
        if (isinf(x)) w = INFINITY;
        bad += fabsf(got) != w || signbit(got) != signbit(x);
    }
    BT_CHECK_EQ_INT(bad, 0);
}

static void test_f16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float v = bt_f16_to_f32((uint16_t)h);
        uint16_t back = bt_f32_to_f16(v);
        if (isnan(v))
            bad += (back & 0x7c00) != 0x7c00 || !(back & 0x3ff) || (back & 0x8000) != (h & 0x8000);
        else
            bad += back != h;
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK(bt_f16_to_f32(0x3c00) == 1.0f);
    BT_CHECK(bt_f16_to_f32(0x7bff) == 65504.0f);
    BT_CHECK(bt_f16_to_f32(0x0001) == 0x1p-24f);
    BT_CHECK(bt_f16_to_f32(0x0400) == 0x1p-14f);
    BT_CHECK(isinf(bt_f16_to_f32(0x7c00)) && isinf(bt_f16_to_f32(0xfc00)));
    BT_CHECK(isnan(bt_f16_to_f32(0x7e00)));
    BT_CHECK(bt_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);     /* tie -> even */
    BT_CHECK(bt_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie -> even (up) */
    BT_CHECK(bt_f32_to_f16(0x1p-25f) == 0x0000);           /* subnormal tie -> 0 */
    BT_CHECK(bt_f32_to_f16(3 * 0x1p-25f) == 0x0002);       /* 1.5 steps -> 2 */
    BT_CHECK(bt_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
    BT_CHECK(bt_f32_to_f16(nextafterf(0x1p-14f, 0.0f)) == 0x0400); /* rounds up to normal */
    BT_CHECK(bt_f32_to_f16(-0.0f) == 0x8000);
    BT_CHECK(bt_f32_to_f16(65504.0f) == 0x7bff);
    BT_CHECK(bt_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7bff);
    BT_CHECK(bt_f32_to_f16(65520.0f) == 0x7c00); /* halfway to 65536 -> even -> inf */
    BT_CHECK(bt_f32_to_f16(-1e10f) == 0xfc00);
    BT_CHECK(bt_f32_to_f16(INFINITY) == 0x7c00);
    BT_CHECK((bt_f32_to_f16(NAN) & 0x7e00) == 0x7e00);
    for (int i = 0; i < 1000000; i++) {
        float x = (i & 1) ? rnd_float_range(-26, 17) : u2f((uint32_t)rnd());
        if (isnan(x)) continue;
        double want = grid_round(fabs((double)x), 10, -14);
        float w = want > 65504.0 ? INFINITY : (float)want;
        float got = bt_f16_to_f32(bt_f32_to_f16(x));
        bad += fabsf(got) != w || signbit(got) != signbit(x);
    }
    BT_CHECK_EQ_INT(bad, 0);
}

/* ---- fake quantizers -------------------------------------------------------------------- */

static void fill(float *x, int n, float v)
{
    for (int i = 0; i < n; i++) x[i] = v;
}

static void test_fake_quant_fp8(void)
{
    float x[64];
    /* amax 100 -> scale pow2_ceil(100/448) = 1/4: 100 -> 400 units, a tie between 384 and
     * 416 -> 384 (even) -> 96; 0.3 -> 1.2 units -> 1.25 -> 0.3125; subnormal units */
    fill(x, 64, 0.0f);
    x[0] = 100.0f;
    x[1] = 0.3f;
    x[2] = -0.3f;
    x[3] = -0.0f;
    x[4] = 0.25f * 5 * 0x1p-10f; /* 2.5 subnormal steps -> 2 */
    x[5] = 0.25f * 3 * 0x1p-10f; /* 1.5 steps -> 2 */
    x[6] = 0.25f * 1.0625f;      /* tie -> 1.0 units */
    /* second block: amax below the 1e-4 floor -> scale 2^-22; 1e-5 -> 41.9 units -> 40 */
    x[32] = 1e-5f;
    x[33] = -1e-5f;
    bt_fake_quant_fp8_ue8m0(x, 64, 32);
    BT_CHECK(x[0] == 96.0f);
    BT_CHECK(x[1] == 0.3125f && x[2] == -0.3125f);
    BT_CHECK(x[3] == 0.0f && signbit(x[3]));
    BT_CHECK(x[4] == 0.25f * 2 * 0x1p-9f && x[5] == 0.25f * 2 * 0x1p-9f);
    BT_CHECK(x[6] == 0.25f);
    BT_CHECK(x[7] == 0.0f && !signbit(x[7]));
    BT_CHECK(x[32] == 40 * 0x1p-22f && x[33] == -40 * 0x1p-22f);

    /* amax exactly 448 * 2^k keeps scale 2^k (448 * fl(1/448) rounds to exactly 1): one
     * subnormal step of the scale survives, which a doubled scale would round to zero */
    fill(x, 32, 0.0f);
    x[0] = 448.0f * 8;
    x[1] = 8 * 0x1p-9f;
    bt_fake_quant_fp8_ue8m0(x, 32, 32);
    BT_CHECK(x[0] == 448.0f * 8 && x[1] == 8 * 0x1p-9f);
    fill(x, 32, 0.0f);
    x[0] = 448.0f;
    x[1] = 0x1p-9f;
    bt_fake_quant_fp8_ue8m0(x, 32, 32);
    BT_CHECK(x[0] == 448.0f && x[1] == 0x1p-9f);

    /* a length that is not a multiple of the block is left alone */
    float y[33], y0[33];
    for (int i = 0; i < 33; i++) y[i] = y0[i] = 0.1f * (float)i + 0.01f;
    bt_fake_quant_fp8_ue8m0(y, 33, 32);
    BT_CHECK(!memcmp(y, y0, sizeof y));

    /* matches an independent per-element reference on random blocks */
    int bad = 0;
    for (int it = 0; it < 2000; it++) {
        float v[32], r[32];
        int e = (int)(rnd() % 40) - 20;
        for (int i = 0; i < 32; i++) v[i] = rnd_float_range(e - 12, e + 1);
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        if (amax < 1e-4f) amax = 1e-4f;
        float t = amax * (1.0f / 448.0f);
        int ex;
        float m = frexpf(t, &ex);
        float scale = m == 0.5f ? t : ldexpf(1.0f, ex);
        for (int i = 0; i < 32; i++) r[i] = bt_e4m3_to_f32(ref_e4m3(v[i] / scale)) * scale;
        bt_fake_quant_fp8_ue8m0(v, 32, 32);
        for (int i = 0; i < 32; i++) bad += !same_bits(v[i], r[i]);
    }
    BT_CHECK_EQ_INT(bad, 0);
}

static void test_fake_quant_fp4_ue8m0(void)
{
    float x[64];
    /* amax 5 -> scale pow2_ceil(5/6) = 1: the values are the e2m1 grid itself */
    static const float in[] = {5.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, -0.3f, -0.0f, 0.2f, 4.9f};
    static const float out[] = {4.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, -0.5f, -0.0f, 0.0f, 4.0f};
    int n = (int)(sizeof in / sizeof in[0]);
    fill(x, 64, 0.0f);
    memcpy(x, in, sizeof in);
    /* second block: amax 24 -> scale 4; 23 -> 5.75 -> 6 -> 24; 2 -> 0.5 -> 0.5 -> 2 */
    x[32] = 23.0f;
    x[33] = 2.0f;
    x[34] = -5.0f; /* 1.25 -> 1 -> 4 */
    bt_fake_quant_fp4_ue8m0(x, 64, 32);
    for (int i = 0; i < n; i++)
        BT_CHECK_MSG(same_bits(x[i], out[i]), "%g -> %g, want %g", (double)in[i], (double)x[i],
                     (double)out[i]);
    BT_CHECK(x[32] == 24.0f && x[33] == 2.0f && x[34] == -4.0f);

    /* an all-zero block stays zero (scale floors at 2^-126), signs kept */
    fill(x, 32, 0.0f);
    x[3] = -0.0f;
    bt_fake_quant_fp4_ue8m0(x, 32, 32);
    BT_CHECK(x[0] == 0.0f && !signbit(x[0]) && signbit(x[3]));

    float y[40], y0[40];
    for (int i = 0; i < 40; i++) y[i] = y0[i] = (float)i;
    bt_fake_quant_fp4_ue8m0(y, 40, 32);
    BT_CHECK(!memcmp(y, y0, sizeof y));
}

static void test_fake_quant_fp4_e4m3(void)
{
    float x[32];
    /* amax 6 -> scale e4m3(1) = 1 */
    fill(x, 16, 0.0f);
    x[0] = 6.0f;
    x[1] = 2.5f;
    x[2] = -1.75f;
    /* amax 7 -> 7/6 = 1.1667 -> e4m3 1.125: 7 -> 6.22 -> clamp 6 -> 6.75; 1 -> 0.889 -> 1 */
    fill(x + 16, 16, 0.0f);
    x[16] = 7.0f;
    x[17] = 1.0f;
    x[18] = -0.3f; /* 0.267 -> 0.5 -> 0.5625 */
    bt_fake_quant_fp4_e4m3(x, 32, 16);
    BT_CHECK(x[0] == 6.0f && x[1] == 2.0f && x[2] == -2.0f);
    BT_CHECK(x[16] == 6.75f && x[17] == 1.125f && x[18] == -0.5625f);

    /* tiny block: the scale floors at 6 * 2^-9 / 6 = 2^-9, the smallest e4m3 subnormal */
    fill(x, 16, 0.0f);
    x[0] = 3 * 0x1p-9f; /* 3 units -> 3 */
    x[1] = 0x1p-12f;    /* 0.125 units -> 0 */
    bt_fake_quant_fp4_e4m3(x, 16, 16);
    BT_CHECK(x[0] == 3 * 0x1p-9f && x[1] == 0.0f);

    /* amax/6 past the e4m3 range: the scale is NaN, and so is the block (as in torch) */
    fill(x, 16, 1.0f);
    x[0] = 3000.0f;
    bt_fake_quant_fp4_e4m3(x, 16, 16);
    int nans = 0;
    for (int i = 0; i < 16; i++) nans += isnan(x[i]);
    BT_CHECK_EQ_INT(nans, 16);

    float y[24], y0[24];
    for (int i = 0; i < 24; i++) y[i] = y0[i] = (float)i;
    bt_fake_quant_fp4_e4m3(y, 24, 16);
    BT_CHECK(!memcmp(y, y0, sizeof y));
}

/* A NaN or infinity in a block: the reference's amax / clamp_min / clamp propagate NaN, the
 * scale becomes inf or NaN and the whole block comes out NaN. (quant.c used fmaxf / fminf,
 * which drop NaN: the block kept a finite scale and the NaN element became -max.) */
static void test_fake_quant_non_finite(void)
{
    static const float bad_values[] = {NAN, INFINITY, -INFINITY};
    for (size_t k = 0; k < 3; k++) {
        float x[64];
        for (int i = 0; i < 64; i++) x[i] = 0.01f * (float)(i + 1);
        x[5] = bad_values[k];
        bt_fake_quant_fp8_ue8m0(x, 64, 32);
        int nans = 0, finite = 0;
        for (int i = 0; i < 32; i++) nans += isnan(x[i]);
        for (int i = 32; i < 64; i++) finite += isfinite(x[i]);
        BT_CHECK_MSG(nans == 32 && finite == 32, "fp8 %g: %d NaN", (double)bad_values[k], nans);

        for (int i = 0; i < 64; i++) x[i] = 0.01f * (float)(i + 1);
        x[40] = bad_values[k];
        bt_fake_quant_fp4_ue8m0(x, 64, 32);
        nans = finite = 0;
        for (int i = 32; i < 64; i++) nans += isnan(x[i]);
        for (int i = 0; i < 32; i++) finite += isfinite(x[i]);
        BT_CHECK_MSG(nans == 32 && finite == 32, "fp4 ue8m0 %g: %d NaN", (double)bad_values[k],
                     nans);

        for (int i = 0; i < 32; i++) x[i] = 0.01f * (float)(i + 1);
        x[0] = bad_values[k];
        bt_fake_quant_fp4_e4m3(x, 32, 16);
        nans = finite = 0;
        for (int i = 0; i < 16; i++) nans += isnan(x[i]);
        for (int i = 16; i < 32; i++) finite += isfinite(x[i]);
        BT_CHECK_MSG(nans == 16 && finite == 16, "fp4 e4m3 %g: %d NaN", (double)bad_values[k],
                     nans);
    }
}

int main(void)
{
    BT_RUN(test_e4m3_decode);
    BT_RUN(test_e4m3_round_trip_all_codes);
    BT_RUN(test_e4m3_rounding);
    BT_RUN(test_e4m3_sweep);
    BT_RUN(test_e8m0);
    BT_RUN(test_e2m1);
    BT_RUN(test_pow2_ceil);
    BT_RUN(test_bf16);
    BT_RUN(test_f16);
    BT_RUN(test_fake_quant_fp8);
    BT_RUN(test_fake_quant_fp4_ue8m0);
    BT_RUN(test_fake_quant_fp4_e4m3);
    BT_RUN(test_fake_quant_non_finite);
    return bt_test_summary();
}

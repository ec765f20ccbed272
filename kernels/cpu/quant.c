#include "kernels/cpu/quant.h"

#include <math.h>
#include <string.h>

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float bt_bf16_to_f32(uint16_t h)
{
    return u2f((uint32_t)h << 16);
}

uint16_t bt_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t bt_f32_to_f16(float f)
{
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00u;
    if (a >= 65520.0f) return sign | 0x7c00u; /* rounds to infinity */
    if (a < ldexpf(1.0f, -14)) {
        /* subnormal: multiples of 2^-24, nearest even via rintf in the default mode */
        float q = rintf(a * 16777216.0f);
        return sign | (uint16_t)q;
    }
    uint32_t au = f2u(a);
    uint32_t exp = (au >> 23) - 112u;
    uint32_t man = au & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

float bt_e4m3_to_f32(uint8_t b)
{
    uint32_t exp = (b >> 3) & 0xfu, man = b & 7u;
    float v;
    if (exp == 0xf && man == 7) return (b & 0x80) ? -NAN : NAN;
    if (exp == 0)
        v = ldexpf((float)man, -9);
    else
        v = ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7);
    return (b & 0x80) ? -v : v;
}

uint8_t bt_f32_to_e4m3(float f)
{
    uint8_t sign = (f2u(f) >> 24) & 0x80u;
    if (isnan(f)) return sign | 0x7fu;
    float a = fabsf(f);
    /* 448 = 1.75 * 2^8 is the largest finite value. Like torch's cast, values from 480 up
     * are NaN outright; (464, 480) round up onto the NaN code below, 464 ties down to 448. */
    if (a >= 480.0f) return sign | 0x7fu;
    if (a < ldexpf(1.0f, -6)) {
        /* subnormals: multiples of 2^-9; rintf rounds half to even */
        float q = rintf(a * 512.0f);
        return sign | (uint8_t)q; /* q == 8 lands on the smallest normal, code 0x08 */
    }
    int e;
    frexpf(a, &e);                                  /* a = m * 2^e, m in [0.5, 1) */
    int exp = e - 1;                                /* a in [2^exp, 2^(exp+1)) */
    float q = rintf(ldexpf(a, 3 - exp));            /* 8..16 */
    if (q >= 16.0f) {
        q = 8.0f;
        exp++;
    }
    int code_exp = exp + 7;
    if (code_exp > 15 || (code_exp == 15 && q - 8.0f > 6.0f)) return sign | 0x7fu;
    return sign | (uint8_t)((code_exp << 3) | ((int)q - 8));
}

float bt_e8m0_to_f32(uint8_t b)
{
    if (b == 0xff) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

static const float e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float bt_e2m1_to_f32(uint8_t code)
{
    float v = e2m1_values[code & 7u];
    return (code & 8u) ? -v : v;
}

uint8_t bt_f32_to_e2m1(float f)
{
    /* Boundaries between neighbouring codes; a tie goes to the even code. */
    static const float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    float a = fabsf(f);
    uint8_t code = 0;
    for (int i = 0; i < 7; i++) {
        /* Upper code i+1 is odd for i even: a tie stays on the even (lower) code, so it
         * must be strictly above. For i odd the upper code is even: a tie goes up. */
        if ((i & 1) ? a >= bounds[i] : a > bounds[i]) code = (uint8_t)(i + 1);
    }
    return code | ((f2u(f) >> 28) & 8u);
}

float bt_pow2_ceil(float t)
{
    uint32_t bits = f2u(t);
    int exponent = (int)((bits >> 23) & 0xffu);
    int k = exponent - 127 + ((bits & 0x7fffffu) != 0);
    return ldexpf(1.0f, k);
}

/* The reference works on tensors, whose amax / clamp_min / clamp propagate NaN; fmaxf and
 * fminf would drop it (a NaN or inf in a block must turn the whole block NaN, as there). */
static float block_amax(const float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (isnan(a)) return a;
        if (a > amax) amax = a;
    }
    return amax;
}

static inline float floor_at(float x, float lo)
{
    return x < lo ? lo : x; /* NaN stays NaN */
}

static inline float clamp_abs(float x, float m)
{
    return x < -m ? -m : (x > m ? m : x); /* NaN stays NaN */
}

void bt_fake_quant_fp8_ue8m0(float *x, int n, int block)
{
    if (n % block) return;
    for (int b = 0; b < n; b += block) {
        float amax = floor_at(block_amax(x + b, block), 1e-4f);
        float scale = bt_pow2_ceil(amax * (1.0f / 448.0f));
        for (int i = 0; i < block; i++) {
            float q = clamp_abs(x[b + i] / scale, 448.0f);
            x[b + i] = bt_e4m3_to_f32(bt_f32_to_e4m3(q)) * scale;
        }
    }
}

static void fake_quant_fp4(float *x, int n, int block, int e4m3_scale)
{
    if (n % block) return;
    for (int b = 0; b < n; b += block) {
        float amax = block_amax(x + b, block);
        float scale;
        if (e4m3_scale)
            scale = bt_e4m3_to_f32(bt_f32_to_e4m3(floor_at(amax, 6.0f * 0x1p-9f) / 6.0f));
        else
            scale = bt_pow2_ceil(floor_at(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
        for (int i = 0; i < block; i++) {
            float q = clamp_abs(x[b + i] / scale, 6.0f);
            x[b + i] = bt_e2m1_to_f32(bt_f32_to_e2m1(q)) * scale;
        }
    }
}

void bt_fake_quant_fp4_ue8m0(float *x, int n, int block)
{
    fake_quant_fp4(x, n, block, 0);
}

void bt_fake_quant_fp4_e4m3(float *x, int n, int block)
{
    fake_quant_fp4(x, n, block, 1);
}

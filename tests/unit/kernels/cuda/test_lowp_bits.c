/* The CUDA kernels' weight conversions at the bit level (kernels/cuda/lowp_bits.h), on the host:
 * the GPU tests that check the kernels end to end need a GPU, so CI checks these steps here.
 * Values are compared with kernels/cpu/quant.c's decoders (the reference formats), in double
 * precision, where every quantity involved is exact. */
#include "bt_test.h"

#include "kernels/cpu/quant.h"
#include "kernels/cuda/lowp_bits.h"

#include <stdint.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static double bf16_value(uint32_t bits)
{
    return (double)bt_bf16_to_f32((uint16_t)bits);
}

/* x is a bf16 value exactly (normal or subnormal, or zero): the float of x (x has few bits and
 * lies in float's range in every use here) has its low 16 bits clear */
static int bf16_exact(double x)
{
    const float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (double)f == x && (u & 0xffffu) == 0;
}

/* pair j of a word holds codes j and j + 4 (nibbles 16 bits apart), each as its value times
 * 2^-126, whatever the other six codes are */
static void test_e2m1_spread(void)
{
    int bad = 0;
    for (int j = 0; j < 4; j++)
        for (int a = 0; a < 16; a++)
            for (int b = 0; b < 16; b++)
                for (int fill = 0; fill < 32; fill++) {
                    const uint32_t keep = ~(0xfu << (4 * j) | 0xfu << (4 * j + 16));
                    const uint32_t v =
                        (rnd32() & keep) | (uint32_t)a << (4 * j) | (uint32_t)b << (4 * j + 16);
                    uint32_t out[4];
                    bt_e2m1x8_to_bf16_spread(v, out);
                    const double lo = ldexp(bf16_value(out[j] & 0xffffu), 126);
                    const double hi = ldexp(bf16_value(out[j] >> 16), 126);
                    if (lo != (double)bt_e2m1_to_f32((uint8_t)a) ||
                        hi != (double)bt_e2m1_to_f32((uint8_t)b))
                        bad++;
                }
    BT_CHECK_EQ_INT(bad, 0);
}

/* every word's four pairs together: the 8 codes of a word each appear once, in its pair */
static void test_e2m1_spread_words(void)
{
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        const uint32_t v = i < 16 ? 0x11111111u * (uint32_t)i : rnd32();
        uint32_t out[4];
        bt_e2m1x8_to_bf16_spread(v, out);
        for (int j = 0; j < 4; j++) {
            const uint8_t a = (v >> (4 * j)) & 0xf, b = (v >> (4 * j + 16)) & 0xf;
            if (ldexp(bf16_value(out[j] & 0xffffu), 126) != (double)bt_e2m1_to_f32(a) ||
                ldexp(bf16_value(out[j] >> 16), 126) != (double)bt_e2m1_to_f32(b))
                bad++;
        }
    }
    BT_CHECK_EQ_INT(bad, 0);
}

/* For a fast FP4 scale byte the scale's pattern is 2^126 * 2^(sv - 127), and each code's
 * pattern times it is the dequantized weight exactly, a bf16 itself (so the kernels' bf16
 * multiply rounds nothing). The fast range is where that holds: its bounds are checked too. */
static void test_fp4_scale(void)
{
    int bad = 0, fast = 0;
    for (int sv = 0; sv < 256; sv++) {
        if (!bt_fp4_scale_fast((uint8_t)sv)) continue;
        fast++;
        const double s = bf16_value(bt_fp4_scale_bf16((uint8_t)sv));
        if (s != ldexp(1.0, 126 + sv - 127)) bad++;
        for (int code = 0; code < 16; code++) {
            uint32_t out[4];
            bt_e2m1x8_to_bf16_spread((uint32_t)code, out); /* code at nibble 0: pair 0, low */
            const double p = bf16_value(out[0] & 0xffffu) * s;
            const double want =
                (double)bt_e2m1_to_f32((uint8_t)code) * (double)bt_e8m0_to_f32((uint8_t)sv);
            if (p != want || !bf16_exact(p)) bad++;
        }
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK_EQ_INT(fast, 121); /* 8..128 */
    BT_CHECK(!bt_fp4_scale_fast(7) && bt_fp4_scale_fast(8) && bt_fp4_scale_fast(128) &&
             !bt_fp4_scale_fast(129));
}

/* e4m3 pairs: the f16 patterns of the codes' values (as the hardware converts them) moved to
 * bf16 are the values times 2^-112; times a fast scale's pattern (2^112 * 2^(sv - 127)) they
 * are the dequantized weights exactly, bf16 values themselves. NaN codes excluded (see
 * gemm_lowp.cu: they come out finite on this route, and no checkpoint has them). */
static void test_fp8_route(void)
{
    int bad = 0, fast = 0;
    for (int c0 = 0; c0 < 256; c0++) {
        if ((c0 & 0x7f) == 0x7f) continue;
        const int c1 = (c0 * 37 + 11) & 0xff; /* a partner code for the high half */
        if ((c1 & 0x7f) == 0x7f) continue;
        const double v0 = bt_e4m3_to_f32((uint8_t)c0), v1 = bt_e4m3_to_f32((uint8_t)c1);
        const uint32_t h = (uint32_t)bt_f32_to_f16((float)v0) | (uint32_t)bt_f32_to_f16((float)v1)
                                                                    << 16;
        if ((double)bt_f16_to_f32((uint16_t)h) != v0) bad++; /* (f16 holds e4m3 exactly) */
        const uint32_t b = bt_f16x2_to_bf16x2_2m112(h);
        if (ldexp(bf16_value(b & 0xffffu), 112) != v0 || ldexp(bf16_value(b >> 16), 112) != v1)
            bad++;
        for (int sv = 0; sv < 256; sv++) {
            if (!bt_fp8_scale_fast((uint8_t)sv)) continue;
            fast += c0 == 0;
            const double s = bf16_value(bt_fp8_scale_bf16((uint8_t)sv));
            const double p = bf16_value(b & 0xffffu) * s;
            if (s != ldexp(1.0, 112 + sv - 127) || p != v0 * (double)bt_e8m0_to_f32((uint8_t)sv) ||
                !bf16_exact(p))
                bad++;
        }
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK_EQ_INT(fast, 135); /* 8..142 */
    BT_CHECK(!bt_fp8_scale_fast(7) && bt_fp8_scale_fast(142) && !bt_fp8_scale_fast(143));
}

int main(void)
{
    BT_RUN(test_e2m1_spread);
    BT_RUN(test_e2m1_spread_words);
    BT_RUN(test_fp4_scale);
    BT_RUN(test_fp8_route);
    return bt_test_summary();
}

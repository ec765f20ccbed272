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

/* the word's layout: its 32 bits are the 4 pairs' 8 codes' 32 bits, each once */
static void test_fp4_word_layout(void)
{
    uint32_t seen = 0;
    int twice = 0;
    for (int o = 0; o < 4; o++)
        for (int h = 0; h < 2; h++)
            for (int b = 0; b < 4; b++) {
                const int at = bt_fp4_word_bit(o, h, b);
                twice += at < 0 || at > 31 || (seen >> at & 1u);
                seen |= 1u << (at & 31);
            }
    BT_CHECK_EQ_INT(twice, 0);
    BT_CHECK(seen == 0xffffffffu);
}

/* pair j of a word holds its two codes (low half, high half), each as its value times 2^-126,
 * whatever the other six codes are */
static void test_e2m1_spread(void)
{
    int bad = 0;
    for (int j = 0; j < 4; j++)
        for (int a = 0; a < 16; a++)
            for (int b = 0; b < 16; b++)
                for (int fill = 0; fill < 32; fill++) {
                    const uint32_t keep = ~(bt_fp4_word_put(j, 0, 0xf) | bt_fp4_word_put(j, 1, 0xf));
                    const uint32_t v = (rnd32() & keep) | bt_fp4_word_put(j, 0, (uint32_t)a) |
                                       bt_fp4_word_put(j, 1, (uint32_t)b);
                    uint32_t out[4];
                    bt_e2m1x8_to_bf16_spread(v, out);
                    const double lo = ldexp(bf16_value(out[j] & 0xffffu), 126);
                    const double hi = ldexp(bf16_value(out[j] >> 16), 126);
                    if (lo != (double)bt_e2m1_to_f32((uint8_t)a) ||
                        hi != (double)bt_e2m1_to_f32((uint8_t)b) ||
                        bt_fp4_word_code(v, j, 0) != (uint32_t)a ||
                        bt_fp4_word_code(v, j, 1) != (uint32_t)b)
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
            const uint8_t a = (uint8_t)bt_fp4_word_code(v, j, 0),
                          b = (uint8_t)bt_fp4_word_code(v, j, 1);
            if (ldexp(bf16_value(out[j] & 0xffffu), 126) != (double)bt_e2m1_to_f32(a) ||
                ldexp(bf16_value(out[j] >> 16), 126) != (double)bt_e2m1_to_f32(b))
                bad++;
        }
    }
    BT_CHECK_EQ_INT(bad, 0);
}

/* each pair alone is the same as in the four-pair conversion */
static void test_e2m1_spread_pair(void)
{
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        const uint32_t v = rnd32();
        uint32_t out[4];
        bt_e2m1x8_to_bf16_spread(v, out);
        for (int j = 0; j < 4; j++)
            bad += bt_e2m1_spread_pair(v, j) != out[j];
    }
    BT_CHECK_EQ_INT(bad, 0);
}

/* fragment order: every code of a run is where bt_fp4_frag_code looks for it, and the spread
 * pair o of word c is the codes of k 2c + 8o and 2c + 8o + 1 (low half, high half) */
static void test_fp4_frag_order(void)
{
    int bad_code = 0, bad_pair = 0;
    for (int i = 0; i < 20000; i++) {
        uint8_t run[16], frag[16];
        for (int b = 0; b < 16; b++)
            run[b] = i < 16   ? (uint8_t)(0x11 * i)
                     : i < 32 ? (uint8_t)(16 * b + (i & 15))
                              : (uint8_t)rnd32();
        bt_fp4_run_to_frag(run, frag);
        uint32_t w[4];
        for (int c = 0; c < 4; c++)
            w[c] = frag[4 * c] | (uint32_t)frag[4 * c + 1] << 8 | (uint32_t)frag[4 * c + 2] << 16 |
                   (uint32_t)frag[4 * c + 3] << 24;
        for (int k = 0; k < 32; k++) {
            const uint32_t code = (run[k / 2] >> (4 * (k & 1))) & 0xfu;
            bad_code += bt_fp4_frag_code(w, k) != code;
        }
        for (int c = 0; c < 4; c++)
            for (int o = 0; o < 4; o++) {
                const int k = 2 * c + 8 * o;
                const uint32_t p = bt_e2m1_spread_pair(w[c], o);
                const uint8_t lo = (run[k / 2]) & 0xf, hi = run[k / 2] >> 4;
                if (ldexp(bf16_value(p & 0xffffu), 126) != (double)bt_e2m1_to_f32(lo) ||
                    ldexp(bf16_value(p >> 16), 126) != (double)bt_e2m1_to_f32(hi))
                    bad_pair++;
            }
    }
    BT_CHECK_EQ_INT(bad_code, 0);
    BT_CHECK_EQ_INT(bad_pair, 0);
}

/* A scale byte's pattern is 2^126 * 2^(sv - 127), and each code's pattern times it is the
 * dequantized weight exactly, a bf16 itself (so the kernels' bf16 multiply rounds nothing) */
static int fp4_scale_exact(int sv)
{
    const double s = bf16_value(bt_fp4_scale_bf16((uint8_t)sv));
    if (s != ldexp(1.0, 126 + sv - 127)) return 0;
    for (int code = 0; code < 16; code++) {
        uint32_t out[4];
        bt_e2m1x8_to_bf16_spread(bt_fp4_word_put(0, 0, (uint32_t)code), out); /* pair 0, low */
        const double p = bf16_value(out[0] & 0xffffu) * s;
        const double want =
            (double)bt_e2m1_to_f32((uint8_t)code) * (double)bt_e8m0_to_f32((uint8_t)sv);
        if (p != want || !bf16_exact(p)) return 0;
    }
    return 1;
}

/* every fast FP4 scale byte is exact; the top bound is tight (129's pattern is no longer a
 * finite bf16), the bottom one a margin (bytes 0..7 are exact too) */
static void test_fp4_scale(void)
{
    int bad = 0, fast = 0;
    for (int sv = 0; sv < 256; sv++) {
        if (!bt_fp4_scale_fast((uint8_t)sv)) continue;
        fast++;
        bad += !fp4_scale_exact(sv);
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK_EQ_INT(fast, 121); /* 8..128 */
    BT_CHECK(bt_fp4_scale_fast(128) && !bt_fp4_scale_fast(129) && !fp4_scale_exact(129));
    for (int sv = 0; sv < 8; sv++)
        BT_CHECK_MSG(!bt_fp4_scale_fast((uint8_t)sv) && fp4_scale_exact(sv), "byte %d", sv);
}

/* e4m3 codes c0 (low half) and c1 (high half): the f16 patterns of their values (as the
 * hardware converts them) moved to bf16 are the values times 2^-112; times the scale's pattern
 * (2^112 * 2^(sv - 127)) each is the dequantized weight exactly, a bf16 value itself. NaN codes
 * are the caller's to skip (see gemm_lowp.cu: they come out finite on this route, and no
 * checkpoint has them). */
static int fp8_pair_exact(int c0, int c1, int sv)
{
    const double v0 = bt_e4m3_to_f32((uint8_t)c0), v1 = bt_e4m3_to_f32((uint8_t)c1);
    const uint32_t h = (uint32_t)bt_f32_to_f16((float)v0) | (uint32_t)bt_f32_to_f16((float)v1)
                                                                << 16;
    if ((double)bt_f16_to_f32((uint16_t)h) != v0 || (double)bt_f16_to_f32(h >> 16) != v1)
        return 0; /* (f16 holds e4m3 values exactly) */
    const uint32_t b = bt_f16x2_to_bf16x2_2m112(h);
    if (ldexp(bf16_value(b & 0xffffu), 112) != v0 || ldexp(bf16_value(b >> 16), 112) != v1)
        return 0;
    const double s = bf16_value(bt_fp8_scale_bf16((uint8_t)sv)),
                 scale = (double)bt_e8m0_to_f32((uint8_t)sv);
    const double p0 = bf16_value(b & 0xffffu) * s, p1 = bf16_value(b >> 16) * s;
    return s == ldexp(1.0, 112 + sv - 127) && p0 == v0 * scale && p1 == v1 * scale &&
           bf16_exact(p0) && bf16_exact(p1);
}

/* every non-NaN code (paired with another) at every fast FP8 scale byte is exact; the top
 * bound is tight (143's pattern is infinite), the bottom one a margin (3..7 are exact too) */
static void test_fp8_route(void)
{
    int bad = 0, fast = 0, pairs = 0;
    for (int sv = 0; sv < 256; sv++) {
        if (!bt_fp8_scale_fast((uint8_t)sv)) continue;
        fast++;
        for (int c0 = 0; c0 < 256; c0++) {
            const int c1 = (c0 * 37 + 11) & 0xff; /* a partner code for the high half */
            if ((c0 & 0x7f) == 0x7f || (c1 & 0x7f) == 0x7f) continue;
            pairs++;
            bad += !fp8_pair_exact(c0, c1, sv);
        }
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK(pairs > 0);
    BT_CHECK_EQ_INT(fast, 135); /* 8..142 */
    BT_CHECK(bt_fp8_scale_fast(142) && !bt_fp8_scale_fast(143) && !fp8_pair_exact(0x7e, 1, 143));
    for (int sv = 3; sv < 8; sv++)
        BT_CHECK_MSG(!bt_fp8_scale_fast((uint8_t)sv) && fp8_pair_exact(1, 0x81, sv), "byte %d", sv);
}

int main(void)
{
    BT_RUN(test_fp4_word_layout);
    BT_RUN(test_e2m1_spread);
    BT_RUN(test_e2m1_spread_words);
    BT_RUN(test_e2m1_spread_pair);
    BT_RUN(test_fp4_frag_order);
    BT_RUN(test_fp4_scale);
    BT_RUN(test_fp8_route);
    return bt_test_summary();
}

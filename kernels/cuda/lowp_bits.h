/* The integer steps of the CUDA kernels' FP4/FP8 weight conversions (kernels/cuda/gemm_lowp.cu),
 * in plain C so that the kernels and a host unit test (tests/unit/kernels/cuda/test_lowp_bits.c,
 * which CI runs without a GPU) compile the same code. Each step turns codes into bf16 bit
 * patterns whose values are the codes' times a fixed power of two; one bf16 multiply by a scale
 * pattern from here finishes them, exactly for the scale bytes called fast here. */
#ifndef BT_KERNELS_CUDA_LOWP_BITS_H
#define BT_KERNELS_CUDA_LOWP_BITS_H

#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#if defined(__CUDACC__)
#define BT_LOWP_FN static __host__ __device__ __forceinline__
#else
#define BT_LOWP_FN static inline
#endif

/* The CUDA backend keeps packed FP4 weights in "fragment order": each run of 32 codes (16 bytes,
 * k 32b .. 32b + 31 of a weight row; K % 32 == 0) is rearranged so that word c (bytes 4c .. 4c + 3)
 * holds the codes of k 2c + 8o and 2c + 8o + 1, o = 0..3: pair o of the word, its low and high
 * half. Those pairs are what lane c of an MMA fragment takes from a 32-k block (k 2c, 2c + 1 and
 * 2c + 8, 2c + 9 of each 16), so a lane converts its pairs straight from one word, in k order.
 * Inside the word the 32 code bits lie where bt_e2m1_spread_pair finds them in the fewest
 * operations (bt_fp4_word_bit): 8 for the word's 4 pairs, where codes kept as nibbles took 13.
 * In the checkpoint order (two codes a byte, low nibble first) code k is byte k / 2. The
 * scales are unchanged. */

/* A pair's bf16 patterns: code bits 0..2 (mantissa, exponent) on bits 6..8 of each half, so
 * the value is the code's times 2^-126 (code 1, 0.5, lands on the subnormal 2^-127), the sign
 * (bit 3) on bit 15 */
#define BT_E2M1_PAIR_MASK 0x81c081c0u

/* Where bit b (0..3) of the code in half h (0 low, 1 high) of pair o (0..3) lies in its word:
 * the inverse of bt_e2m1_spread_pair's moves. Pair 0 lies in place; pairs 1 and 2 rotated 3 bits
 * down and up (each one rotate); pair 3 in the 8 bits left over, which the word rotated as for
 * pair 1 brings, masked and multiplied by 2^2 + 2^7 + 2^12, to their places (three disjoint
 * copies, so the sum is their OR). */
BT_LOWP_FN int bt_fp4_word_bit(int o, int h, int b)
{
    const int t = 16 * h + (b == 3 ? 15 : 6 + b); /* its place in the pair's pattern */
    switch (o) {
    case 0: return t;
    case 1: return (t - 3) & 31;
    case 2: return (t + 3) & 31;
    default: return (t - 3 - (b == 0 ? 2 : b == 3 ? 12 : 7)) & 31;
    }
}

/* code (4 bits) as pair o, half h of a word (OR it in) */
BT_LOWP_FN uint32_t bt_fp4_word_put(int o, int h, uint32_t code)
{
    uint32_t w = 0;
    for (int b = 0; b < 4; b++)
        w |= (code >> b & 1u) << bt_fp4_word_bit(o, h, b);
    return w;
}

/* the code of pair o, half h of word w */
BT_LOWP_FN uint32_t bt_fp4_word_code(uint32_t w, int o, int h)
{
    uint32_t code = 0;
    for (int b = 0; b < 4; b++)
        code |= (w >> bt_fp4_word_bit(o, h, b) & 1u) << b;
    return code;
}

/* one run of 32 codes (16 bytes) from checkpoint order into fragment order */
BT_LOWP_FN void bt_fp4_run_to_frag(const uint8_t *in, uint8_t *out)
{
    for (int c = 0; c < 4; c++) {
        uint32_t w = 0;
        for (int o = 0; o < 4; o++) {
            const uint32_t b = in[c + 4 * o]; /* codes k 2c + 8o (low nibble) and + 1 */
            w |= bt_fp4_word_put(o, 0, b & 0xfu) | bt_fp4_word_put(o, 1, b >> 4);
        }
        for (int i = 0; i < 4; i++)
            out[4 * c + i] = (uint8_t)(w >> (8 * i));
    }
}

/* code k (0..31) of a run in fragment order, given its four words */
BT_LOWP_FN uint32_t bt_fp4_frag_code(const uint32_t *run, int k)
{
    return bt_fp4_word_code(run[(k & 7) >> 1], k >> 3, k & 1);
}

/* v rotated left by s (1..31): one funnel shift on the GPU */
BT_LOWP_FN uint32_t bt_rotl32(uint32_t v, int s)
{
#if defined(__CUDA_ARCH__)
    return __funnelshift_l(v, v, s);
#else
    return v << s | v >> (32 - s);
#endif
}

/* pair o (0..3) of a word as two bf16 patterns (BT_E2M1_PAIR_MASK's bits), each the code's value
 * times 2^-126: one mask for pair 0, a rotate and a mask for pairs 1 and 2, a mask, a multiply
 * and a mask for pair 3 (whose rotate is pair 1's) */
BT_LOWP_FN uint32_t bt_e2m1_spread_pair(uint32_t v, int o)
{
    switch (o) {
    case 0: return v & BT_E2M1_PAIR_MASK;
    case 1: return bt_rotl32(v, 3) & BT_E2M1_PAIR_MASK;
    case 2: return bt_rotl32(v, 29) & BT_E2M1_PAIR_MASK;
    default: return ((bt_rotl32(v, 3) & 0x001b001bu) * 0x1084u) & BT_E2M1_PAIR_MASK;
    }
}

/* a word's 4 pairs (bt_e2m1_spread_pair 0..3): 8 operations */
BT_LOWP_FN void bt_e2m1x8_to_bf16_spread(uint32_t v, uint32_t *out)
{
    const uint32_t r3 = bt_rotl32(v, 3);
    out[0] = v & BT_E2M1_PAIR_MASK;
    out[1] = r3 & BT_E2M1_PAIR_MASK;
    out[2] = bt_rotl32(v, 29) & BT_E2M1_PAIR_MASK;
    out[3] = ((r3 & 0x001b001bu) * 0x1084u) & BT_E2M1_PAIR_MASK;
}

/* FP4 scale bytes (UE8M0: 2^(sv - 127)) the kernels take the bf16 route for: the pattern below
 * times the codes above is exact. The top, 128 (scale 2), is where 2^126 * scale is still a
 * bf16; the bottom, 8, is a margin (the products are normal numbers from byte 2 on, and bf16
 * multiplies keep the subnormals below). Real checkpoints' scales (their weights are far under
 * 12 in magnitude) are all such. */
BT_LOWP_FN bool bt_fp4_scale_fast(uint8_t sv)
{
    return sv >= 8 && sv <= 128;
}

/* the bf16 pattern of 2^126 * 2^(sv - 127), for a fast FP4 scale byte */
BT_LOWP_FN uint16_t bt_fp4_scale_bf16(uint8_t sv)
{
    return (uint16_t)((sv + 126) << 7);
}

/* Two f16 patterns of e4m3 values (f16 normals, as the hardware converts e4m3 pairs) -> the
 * bf16 patterns of the same values times 2^-112: each half's exponent and mantissa moved down
 * 3 bits (f16 and bf16 differ by their exponent widths), the signs kept. */
BT_LOWP_FN uint32_t bt_f16x2_to_bf16x2_2m112(uint32_t h)
{
    return ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
}

/* FP8 scale bytes the kernels take the bf16 route for: the pattern below times those is exact
 * (every product a bf16 with its 4 significant bits). The top, 142, is where 2^112 * scale is
 * still a bf16; the bottom, 8, is a margin (the products are exact from byte 3 on). Real
 * checkpoints' are all such. */
BT_LOWP_FN bool bt_fp8_scale_fast(uint8_t sv)
{
    return sv >= 8 && sv <= 142;
}

/* the bf16 pattern of 2^112 * 2^(sv - 127), for a fast FP8 scale byte */
BT_LOWP_FN uint16_t bt_fp8_scale_bf16(uint8_t sv)
{
    return (uint16_t)((sv + 112) << 7);
}

#endif

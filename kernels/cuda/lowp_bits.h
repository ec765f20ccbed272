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
 * holds the codes of k 2c + 8o and 2c + 8o + 1, o = 0..3, as nibbles o and o + 4. Those pairs are
 * what lane c of an MMA fragment takes from a 32-k block (k 2c, 2c + 1 and 2c + 8, 2c + 9 of
 * each 16), and nibbles o and o + 4 are the pair bt_e2m1x8_to_bf16_spread converts in one
 * multiply: so a lane converts its pairs straight from one word, in k order. In the checkpoint
 * order (two codes a byte, low nibble first) code k is byte k / 2: word c of a run is its bytes
 * c, c + 4, c + 8, c + 12, their low nibbles in the word's low half and high nibbles in its high
 * half. The scales are unchanged. */

/* one run of 32 codes (16 bytes) from checkpoint order into fragment order */
BT_LOWP_FN void bt_fp4_run_to_frag(const uint8_t *in, uint8_t *out)
{
    for (int c = 0; c < 4; c++) {
        uint32_t w = 0;
        for (int o = 0; o < 4; o++) {
            const uint32_t b = in[c + 4 * o];
            w |= (b & 0xfu) << (4 * o) | (b >> 4) << (4 * o + 16);
        }
        for (int i = 0; i < 4; i++)
            out[4 * c + i] = (uint8_t)(w >> (8 * i));
    }
}

/* code k (0..31) of a run in fragment order, given its four words */
BT_LOWP_FN uint32_t bt_fp4_frag_code(const uint32_t *run, int k)
{
    return run[(k & 7) >> 1] >> (4 * ((k >> 3) + 4 * (k & 1))) & 0xfu;
}

/* pair j (0..3) of bt_e2m1x8_to_bf16_spread alone: codes j and j + 4 of v */
BT_LOWP_FN uint32_t bt_e2m1_spread_pair(uint32_t v, int j)
{
    const uint32_t u = j & 2 ? v >> 8 : v;
    return j & 1 ? ((u & 0x00f000f0u) * 0x0104u) & 0x81c081c0u
                 : ((u & 0x000f000fu) * 0x1040u) & 0x81c081c0u;
}

/* 8 e2m1 codes (a word, low nibble first) -> 4 words of bf16 pairs, pair j codes j and j + 4,
 * each value the code's times 2^-126 (code 1, 0.5, lands on the subnormal 2^-127). The two
 * nibbles of pair j lie 16 bits apart: masked alone in a word, one multiply by 2^a + 2^(a + 6)
 * puts two copies of each in disjoint bits (so the sum is their OR), shifted by a (the 3
 * magnitude bits onto the bf16's two low exponent bits and top mantissa bit) and by a + 6 (the
 * sign onto bit 15 / 31); one mask keeps those. Pairs 2 and 3 are 0 and 1 of the word shifted
 * down a byte: 13 operations (two shifts a pair took 15). */
BT_LOWP_FN void bt_e2m1x8_to_bf16_spread(uint32_t v, uint32_t *out)
{
    const uint32_t v8 = v >> 8;
    out[0] = ((v & 0x000f000fu) * 0x1040u) & 0x81c081c0u; /* << 6 and << 12 */
    out[1] = ((v & 0x00f000f0u) * 0x0104u) & 0x81c081c0u; /* << 2 and << 8 */
    out[2] = ((v8 & 0x000f000fu) * 0x1040u) & 0x81c081c0u;
    out[3] = ((v8 & 0x00f000f0u) * 0x0104u) & 0x81c081c0u;
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

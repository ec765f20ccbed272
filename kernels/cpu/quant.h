/* Number formats of DeepSeek-V4.1 and the model's QAT rounding steps, bit-exact with the
 * reference (transformers' deepseek_v41 port, which mirrors the official kernels).
 *
 *   float w = bt_e4m3_to_f32(byte) * bt_e8m0_to_f32(scale_byte);   // dequantize a weight
 *   bt_fake_quant_fp8_ue8m0(kv, head_dim, 32);                     // window-KV rounding
 *
 * The fake-quant functions round in place and, like the reference, leave vectors whose
 * length is not a multiple of the block untouched (tiny test shapes run unquantized). */
#ifndef BT_KERNELS_CPU_QUANT_H
#define BT_KERNELS_CPU_QUANT_H

#include <stdint.h>

float bt_bf16_to_f32(uint16_t h);
uint16_t bt_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float bt_f16_to_f32(uint16_t h);
uint16_t bt_f32_to_f16(float f); /* round to nearest even */

/* float8_e4m3fn: no infinities, 0x7f/0xff are NaN, max 448. */
float bt_e4m3_to_f32(uint8_t b);
/* Round to nearest even onto e4m3fn, subnormals included; |f| beyond the last rounding
 * boundary above 448 gives NaN (0x7f | sign), as torch's cast does. */
uint8_t bt_f32_to_e4m3(float f);
/* float8_e8m0fnu: 2^(b-127); 0xff is NaN. */
float bt_e8m0_to_f32(uint8_t b);
/* e2m1 code (bit 3 = sign) -> value in {0, .5, 1, 1.5, 2, 3, 4, 6} with sign. */
float bt_e2m1_to_f32(uint8_t code);
/* Round-to-nearest-even code of a value already clamped to [-6, 6]. */
uint8_t bt_f32_to_e2m1(float f);

/* 2^ceil(log2(t)) for t > 0 from the IEEE bits (exponent - 127 + (mantissa != 0)). */
float bt_pow2_ceil(float t);

/* Window KV: FP8 e4m3 with a UE8M0 scale per `block` channels (amax floored at 1e-4). */
void bt_fake_quant_fp8_ue8m0(float *x, int n, int block);
/* Indexer q/k: FP4 e2m1 with a UE8M0 scale per `block` channels. */
void bt_fake_quant_fp4_ue8m0(float *x, int n, int block);
/* Compressed KV: FP4 e2m1 with an e4m3 scale per `block` channels. */
void bt_fake_quant_fp4_e4m3(float *x, int n, int block);

#endif

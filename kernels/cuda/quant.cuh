/* Device versions of kernels/cpu/quant.c's roundings, bit-exact with it (same operations in
 * the same order; IEEE division and no fused multiply-adds in these paths). */
#ifndef BT_KERNELS_CUDA_QUANT_CUH
#define BT_KERNELS_CUDA_QUANT_CUH

#include "kernels/cuda/common.cuh"

__device__ __forceinline__ uint8_t bt_dev_f32_to_e4m3(float f)
{
    uint8_t sign = (__float_as_uint(f) >> 24) & 0x80u;
    if (isnan(f)) return sign | 0x7fu;
    float a = fabsf(f);
    if (a >= 480.0f) return sign | 0x7fu;
    if (a < 0x1p-6f) return sign | (uint8_t)rintf(__fmul_rn(a, 512.0f));
    int e;
    frexpf(a, &e);
    int exp = e - 1;
    float q = rintf(ldexpf(a, 3 - exp));
    if (q >= 16.0f) {
        q = 8.0f;
        exp++;
    }
    int code_exp = exp + 7;
    if (code_exp > 15 || (code_exp == 15 && q - 8.0f > 6.0f)) return sign | 0x7fu;
    return sign | (uint8_t)((code_exp << 3) | ((int)q - 8));
}

__device__ __forceinline__ uint8_t bt_dev_f32_to_e2m1(float f)
{
    const float b0 = 0.25f, b1 = 0.75f, b2 = 1.25f, b3 = 1.75f, b4 = 2.5f, b5 = 3.5f, b6 = 5.0f;
    float a = fabsf(f);
    uint8_t code = 0;
    if (a > b0) code = 1;
    if (a >= b1) code = 2;
    if (a > b2) code = 3;
    if (a >= b3) code = 4;
    if (a > b4) code = 5;
    if (a >= b5) code = 6;
    if (a > b6) code = 7;
    return code | ((__float_as_uint(f) >> 28) & 8u);
}

__device__ __forceinline__ float bt_dev_pow2_ceil(float t)
{
    unsigned bits = __float_as_uint(t);
    int k = (int)((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0);
    return ldexpf(1.0f, k);
}

__device__ __forceinline__ float bt_dev_floor_at(float x, float lo) { return x < lo ? lo : x; }
__device__ __forceinline__ float bt_dev_clamp_abs(float x, float m)
{
    return x < -m ? -m : (x > m ? m : x);
}

/* The scale of a block whose amax (NaN when any value is) is `amax`; kind as
 * bt_cuda_fake_quant_t. */
__device__ __forceinline__ float bt_dev_fake_quant_scale(float amax, int kind)
{
    if (kind == 0)
        return bt_dev_pow2_ceil(__fmul_rn(bt_dev_floor_at(amax, 1e-4f), 1.0f / 448.0f));
    if (kind == 2)
        return bt_e4m3(bt_dev_f32_to_e4m3(__fdiv_rn(bt_dev_floor_at(amax, 6.0f * 0x1p-9f), 6.0f)));
    return bt_dev_pow2_ceil(__fmul_rn(bt_dev_floor_at(amax, 6.0f * 0x1p-126f), 1.0f / 6.0f));
}

/* One value of a block with that scale, rounded to the grid and back */
__device__ __forceinline__ float bt_dev_fake_quant_value(float x, float scale, int kind)
{
    if (kind == 0) {
        float q = bt_dev_clamp_abs(__fdiv_rn(x, scale), 448.0f);
        return __fmul_rn(bt_e4m3(bt_dev_f32_to_e4m3(q)), scale);
    }
    float q = bt_dev_clamp_abs(__fdiv_rn(x, scale), 6.0f);
    return __fmul_rn(bt_e2m1(bt_dev_f32_to_e2m1(q)), scale);
}

/* One block of `block` values in place by a whole warp (lane: this thread's): the lanes' amax
 * meet by shuffles (NaN when any value is, as the reference's tensor max), then each lane
 * rounds its values. */
__device__ __forceinline__ void bt_dev_fake_quant_warp(float *xb, int block, int kind, int lane)
{
    float amax = 0.0f;
    bool nan = false;
    for (int i = lane; i < block; i += 32) {
        float a = fabsf(xb[i]);
        nan = nan || isnan(a);
        amax = fmaxf(amax, a);
    }
    amax = bt_warp_max(amax);
    if (__any_sync(0xffffffffu, nan)) amax = __int_as_float(0x7fc00000);
    const float scale = bt_dev_fake_quant_scale(amax, kind);
    for (int i = lane; i < block; i += 32) xb[i] = bt_dev_fake_quant_value(xb[i], scale, kind);
}

/* A block of 32 values held one a lane of a whole warp (bt_dev_fake_quant_warp's rounding):
 * this lane's rounded */
__device__ __forceinline__ float bt_dev_fake_quant_lane32(float v, int kind)
{
    const float a = fabsf(v);
    float amax = bt_warp_max(a);
    if (__any_sync(0xffffffffu, isnan(a))) amax = __int_as_float(0x7fc00000);
    return bt_dev_fake_quant_value(v, bt_dev_fake_quant_scale(amax, kind), kind);
}

/* A channel pair (e, o) rotated by the angle f: one definition for every kernel that rotates
 * the index queries, so a fused product's values are the separate launch's bits */
__device__ __forceinline__ void bt_dev_rope_pair(float &e, float &o, float f)
{
    const float c = cosf(f), s = sinf(f);
    const float e2 = e * c - o * s;
    o = e * s + o * c;
    e = e2;
}

#endif

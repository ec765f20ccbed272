/* The token sampler's arithmetic, one definition for the host's sampler
 * (services/engine/sampler.c) and the GPU's (kernels/cuda/sample.cu): the two draw the same
 * token for the same (seed, step) only while their weights, their order of the logits and
 * their uniform numbers agree bit for bit. Each multiply and add rounds on its own: on the GPU
 * through the _rn intrinsics, on the host because sampler.c is compiled with -ffp-contract=off
 * (CMakeLists.txt); no fused multiply-add either side. */
#ifndef BT_KERNELS_SAMPLING_H
#define BT_KERNELS_SAMPLING_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define BT_SMP_FN static __host__ __device__ __forceinline__
#else
#define BT_SMP_FN static inline
#endif
#if defined(__CUDA_ARCH__)
#define BT_SMP_MUL(a, b) __fmul_rn((a), (b))
#define BT_SMP_ADD(a, b) __fadd_rn((a), (b))
#define BT_SMP_SUB(a, b) __fsub_rn((a), (b))
#else
#define BT_SMP_MUL(a, b) ((a) * (b))
#define BT_SMP_ADD(a, b) ((a) + (b))
#define BT_SMP_SUB(a, b) ((a) - (b))
#endif

BT_SMP_FN uint32_t bt_smp_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

BT_SMP_FN float bt_smp_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* splitmix64's finalizer */
BT_SMP_FN uint64_t bt_smp_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The uniform number in [0, 1) of draw `step` of a request seeded `seed`: it depends on
 * nothing else, so a request samples the same whichever process draws its token. */
BT_SMP_FN double bt_smp_unit(uint64_t seed, uint64_t step)
{
    return (double)(bt_smp_mix64(seed ^ bt_smp_mix64(step + 0x51ed2701u)) >> 11) * 0x1p-53;
}

/* A logit's place in the order as an unsigned key: a larger logit, a larger key; -0 as +0
 * (they compare equal, and ties go to the lower id); NaN below everything (a NaN compares
 * false both ways, which would leave the order undefined). */
BT_SMP_FN uint32_t bt_smp_key(float l)
{
    if (l != l) return 0u;
    const uint32_t u = l == 0.0f ? 0u : bt_smp_bits(l);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* e^x for x <= 0 without a library call, so the per-id loops stay a few operations an id (a
 * 129280-id row took ~2.5 ms through expf on the host): x = (n + f) ln 2 with |f| <= 1/2, 2^f
 * by its Taylor series to the 6th power, 2^n into the exponent. Relative error under 4e-6 over
 * [-87, 0] (2.4e-7 over [-1, 0]: the rounding of x log2(e) grows with |x|). At or under -87
 * (-inf, a masked logit) the result is exactly 0. The round-to-nearest by adding and
 * subtracting 1.5 * 2^23 needs IEEE arithmetic as written (no -ffast-math). */
BT_SMP_FN float bt_smp_exp_le0(float x)
{
    uint32_t u = bt_smp_bits(x);
    /* on the bits, as integer selects the host compiler vectorizes (a float compare, which may
     * trap, stays a branch): +0 (the best id's own x - x) is -0; any other pattern with the
     * sign bit clear (a NaN a broken row may hold) is the floor; x = max(x, -87) (x <= 0: a
     * larger magnitude is a larger pattern). No NaN reaches the float-to-int conversion. */
    const uint32_t pos = ~u >> 31, nonzero = (u | (0u - u)) >> 31; /* 1 or 0 each */
    u |= (0u - (pos & ~nonzero & 1u)) & 0x80000000u;                /* +0 -> -0 */
    u = (u & (0u - (u >> 31))) | ((0u - (~u >> 31)) & 0xc2ae0000u); /* sign clear: the floor */
    u = u < 0xc2ae0000u ? u : 0xc2ae0000u;
    const uint32_t keep = 0u - (uint32_t)(u != 0xc2ae0000u); /* all ones, or 0 at the floor */
    x = bt_smp_float(u);
    const float t = BT_SMP_MUL(x, 1.44269504f);
    const float n = BT_SMP_SUB(BT_SMP_ADD(t, 12582912.0f), 12582912.0f); /* round to nearest */
    const float f = BT_SMP_MUL(BT_SMP_SUB(t, n), 0.693147181f);
    float e = BT_SMP_ADD(1.0f / 120, BT_SMP_MUL(f, 1.0f / 720));
    e = BT_SMP_ADD(1.0f / 24, BT_SMP_MUL(f, e));
    e = BT_SMP_ADD(1.0f / 6, BT_SMP_MUL(f, e));
    e = BT_SMP_ADD(0.5f, BT_SMP_MUL(f, e));
    e = BT_SMP_ADD(1.0f, BT_SMP_MUL(f, e));
    e = BT_SMP_ADD(1.0f, BT_SMP_MUL(f, e));
    const float scale = bt_smp_float((uint32_t)((int32_t)n + 127) << 23);
    return bt_smp_float(bt_smp_bits(BT_SMP_MUL(e, scale)) & keep);
}

/* a token's weight e^((l - mx) * inv_t): relative to the row's largest logit mx */
BT_SMP_FN float bt_smp_weight(float l, float mx, float inv_t)
{
    return bt_smp_exp_le0(BT_SMP_MUL(BT_SMP_SUB(l, mx), inv_t));
}

#endif

/* Products on FP8 activations, the way the reference deployment computes its FP8- and
 * FP4-weight linears (MODEL-DS41.md): each row of x quantized on the fly to e4m3 in blocks of
 * 32 along K with a UE8M0 scale, the codes multiplied on the tensor cores (m16n8k32 e4m3 MMAs),
 * each block's sum times its two scales added in fp32.
 *
 * Against gemm_lowp.cu's few-row kernel (bf16 rows, weights dequantized into bf16 fragments)
 * this does less per weight: an e2m1 code becomes an e4m3 one by moving 4 bits (7 operations
 * for 8 codes, where bf16 took 15 and a multiply), an e4m3 weight is used as it lies, and one
 * MMA takes 32 k instead of 16. The price is a multiply-add per output and block of 32 (each
 * block has its own scales) and the quantization of the rows, done once per row for every
 * product that reads it. */
#include "kernels/cuda/quant.cuh"

#include <stdlib.h>
#include <string.h>

#include <type_traits>

enum { A8_FP8 = 0, A8_FP4 = 1 };
enum { A8_WARPS = 8, A8_STEP = 4 /* blocks of 32 k a warp takes per step */, A8_MAX_ROWS = 16 };

/* ---- the quantizer ------------------------------------------------------------------------
 * A thread per 8 values, four per block of 32: their amax meets by two shuffles within the
 * quad, then each writes its codes, the even k into the block's first 16 bytes, the odd into
 * the last (see bt_cuda_quant_act_fp8). */
template <typename IT>
__global__ void quant_act_fp8_kernel(uint8_t *q, float *qs, const IT *x, int rows, int K,
                                     long long ldx)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = K / 8;
    if (t >= (long long)rows * per_row) return; /* whole quads: K / 8 is a multiple of 4 */
    const int r = (int)(t / per_row), u = (int)(t % per_row);
    const unsigned quad = 0xfu << (threadIdx.x & 28);
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = bt_ld(x, (size_t)r * ldx + 8 * u + i);
    float amax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        nan = nan || isnan(v[i]);
        amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = fmaxf(amax, __shfl_xor_sync(quad, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(quad, amax, 2));
    if (__any_sync(quad, nan)) amax = __int_as_float(0x7fc00000); /* as the reference's max */
    const float scale = bt_dev_fake_quant_scale(amax, BT_CUDA_FQ_FP8_UE8M0);
    unsigned even = 0, odd = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        even |= (unsigned)bt_dev_f32_to_e4m3(bt_dev_clamp_abs(__fdiv_rn(v[2 * i], scale), 448.0f)) << (8 * i);
        odd |= (unsigned)bt_dev_f32_to_e4m3(bt_dev_clamp_abs(__fdiv_rn(v[2 * i + 1], scale), 448.0f)) << (8 * i);
    }
    uint8_t *qb = q + (size_t)r * K + 32 * (u / 4) + 4 * (u & 3);
    *(unsigned *)qb = even;
    *(unsigned *)(qb + 16) = odd;
    if ((u & 3) == 0) qs[(size_t)r * (K / 32) + u / 4] = scale;
}

/* ---- the products -------------------------------------------------------------------------
 * Up to 16 rows against 16 x TILES weight columns a block. The weights are the MMA's A (16
 * columns as its M), the rows its B (8 as its N, a second MMA for rows 8..15): a decode batch's
 * expert share is mostly one or two rows, and 8 wasted lanes of N cost half of 16 of M.
 * Lane (g, c) holds, of a block of 32 k, word c of columns g and g + 8: the 8 codes k 8c..8c+7,
 * the even ones as the MMA's k 4c..4c+3, the odd ones as its k 16 + 4c..; the quantizer stored
 * the rows' codes even k first, so a lane's B is two 4-byte loads. (On Hopper this MMA is
 * emulated: two f16 MMAs and conversions, no faster than gemm_lowp.cu's bf16 path; there
 * gemm_a8_wg below runs instead. It is native on sm_89 and sm_12x.) Each MMA starts from zero and
 * its four outputs (columns g, g + 8 by rows 2c, 2c + 1) are added in times the column's and the
 * row's scale. A warp takes 4 blocks of K per step (a column's 64 bytes of FP4 read whole by
 * its four lanes), the 8 warps of the block every eighth step; their sums meet in shared
 * memory. */

/* e2m1 nibbles (s e e m) -> e4m3 bytes (s 0 0 e e m 0 0): the byte's value is the code's times
 * 2^-6, the subnormal code 1 (0.5) included (e4m3's subnormal step is 2^-9); the kernel's
 * output carries the 2^6. lo: the low nibble of each byte, hi: the high one. */
__device__ __forceinline__ unsigned e2m1x4_lo_to_e4m3(unsigned v)
{
    return ((v << 2) & 0x1c1c1c1cu) | ((v << 4) & 0x80808080u);
}
__device__ __forceinline__ unsigned e2m1x4_hi_to_e4m3(unsigned v)
{
    return ((v >> 2) & 0x1c1c1c1cu) | (v & 0x80808080u);
}

__device__ __forceinline__ void mma_e4m3_16832(float *d, unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

/* byte q of a word of UE8M0 scales as the float 2^(b - 127), for b in 1..254 (FAST) or any */
template <bool FAST>
__device__ __forceinline__ float a8_scale(unsigned word, int q)
{
    const unsigned b = (word >> (8 * q)) & 0xffu;
    return FAST ? __uint_as_float(b << 23) : bt_e8m0((uint8_t)b);
}

__device__ __forceinline__ bool a8_scales_fast(unsigned word)
{
    /* every byte in 1..254: none is 0, none is 0xff */
    const unsigned zero = (word - 0x01010101u) & ~word & 0x80808080u;
    const unsigned full = (~word - 0x01010101u) & word & 0x80808080u;
    return (zero | full) == 0;
}

template <int FMT, int TILES, bool TWO, typename OT>
__global__ void __launch_bounds__(A8_WARPS * 32, 2)
    gemm_a8_rows(OT *y, const uint8_t *xq, const float *xs, const int32_t *rows,
                 const int32_t *offs, const uint8_t *w, const uint8_t *ws, int M, int N, int K,
                 const int32_t *elist, long long ldy)
{
    constexpr int COLS = 16 * TILES;
    __shared__ float red[A8_WARPS][A8_MAX_ROWS][COLS + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int e = elist ? elist[blockIdx.y] : blockIdx.y;
    if (e < 0) return; /* a padded slot of the expert list (the whole block) */
    const int r0 = offs ? offs[e] : 0, mr = (offs ? offs[e + 1] : M) - r0;
    if (mr <= 0) return; /* the whole block */
    const int KB = K / 32, n0 = blockIdx.x * COLS;
    if (FMT == A8_FP4) {
        w += (size_t)e * N * (K / 2);
        ws += (size_t)e * N * KB;
    }
    if (TWO != (mr > 8)) return; /* (the launch passes both instances: TWO for rows 8..15) */
    /* rows past mr read the last real row (never stored) */
    auto src = [&](int r) { r = min(r, mr - 1); return rows ? rows[r0 + r] : r0 + r; };
    const uint8_t *qb0 = xq + (size_t)src(g) * K + 4 * c, *qb1 = xq + (size_t)src(8 + g) * K + 4 * c;
    const float *sc[2][2] = {{xs + (size_t)src(2 * c) * KB, xs + (size_t)src(2 * c + 1) * KB},
                             {xs + (size_t)src(8 + 2 * c) * KB, xs + (size_t)src(9 + 2 * c) * KB}};
    (void)qb1;

    /* this lane's columns g and g + 8 of each tile: weight and scale offsets, resolved once */
    unsigned woff[TILES][2], soff[TILES][2];
    bool ok[TILES][2];
#pragma unroll
    for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const unsigned n = (unsigned)(n0 + 16 * i + 8 * h + g);
            ok[i][h] = n < (unsigned)N;
            woff[i][h] = FMT == A8_FP4 ? n * (K / 2) + 4 * c : n * K + 8 * c;
            soff[i][h] = FMT == A8_FP4 ? n * KB : n / 32 * KB;
        }
    /* a step's weights: FP4 one word a block, FP8 two (k 8c..8c+7) and the scales' word */
    constexpr int WW = FMT == A8_FP4 ? 1 : 2;
    struct wstep {
        unsigned v[TILES][2][A8_STEP][WW];
        unsigned s[TILES][2];
    };
    auto load_w = [&](wstep &d, int b0) {
#pragma unroll
        for (int i = 0; i < TILES; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const bool on = ok[i][h] && b0 < KB;
                d.s[i][h] = on ? __ldg((const unsigned *)(ws + soff[i][h] + b0)) : 0x7f7f7f7fu;
#pragma unroll
                for (int q = 0; q < A8_STEP; q++) {
                    if (FMT == A8_FP4) {
                        d.v[i][h][q][0] = on ? __ldg((const unsigned *)(w + woff[i][h] + 16 * (b0 + q))) : 0u;
                    } else {
                        const uint2 u = on ? __ldg((const uint2 *)(w + woff[i][h] + 32 * (b0 + q))) : make_uint2(0, 0);
                        d.v[i][h][q][0] = __byte_perm(u.x, u.y, 0x6420);
                        d.v[i][h][q][1] = __byte_perm(u.x, u.y, 0x7531);
                    }
                }
            }
    };

    float acc[TILES][TWO ? 2 : 1][4];
#pragma unroll
    for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int j = 0; j < (TWO ? 2 : 1); j++)
#pragma unroll
            for (int t = 0; t < 4; t++) acc[i][j][t] = 0.0f;

    wstep cur, nxt;
    load_w(cur, warp * A8_STEP);
    for (int b0 = warp * A8_STEP; b0 < KB; b0 += A8_WARPS * A8_STEP) {
        load_w(nxt, b0 + A8_WARPS * A8_STEP);
        constexpr int RT = TWO ? 2 : 1; /* row tiles */
        uint2 xb[RT][A8_STEP];
        float4 fa[RT][2];
#pragma unroll
        for (int q = 0; q < A8_STEP; q++) { /* even k 4c.., odd k 4c.. of the block */
            xb[0][q] = make_uint2(*(const unsigned *)(qb0 + 32 * (b0 + q)),
                                  *(const unsigned *)(qb0 + 32 * (b0 + q) + 16));
            if (TWO)
                xb[RT - 1][q] = make_uint2(*(const unsigned *)(qb1 + 32 * (b0 + q)),
                                           *(const unsigned *)(qb1 + 32 * (b0 + q) + 16));
        }
#pragma unroll
        for (int j = 0; j < RT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) fa[j][h] = *(const float4 *)(sc[j][h] + b0);
        /* FAST: every weight scale of the warp's step is a normal float, checked once */
        auto step = [&](auto fast_c) {
            constexpr bool FAST = decltype(fast_c)::value;
#pragma unroll
            for (int q = 0; q < A8_STEP; q++) {
#pragma unroll
                for (int i = 0; i < TILES; i++) {
                    unsigned a[4]; /* columns g (a0, a2) and g + 8 (a1, a3) */
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (FMT == A8_FP4) {
                            a[h] = e2m1x4_lo_to_e4m3(cur.v[i][h][q][0]);
                            a[2 + h] = e2m1x4_hi_to_e4m3(cur.v[i][h][q][0]);
                        } else {
                            a[h] = cur.v[i][h][q][0];
                            a[2 + h] = cur.v[i][h][q][WW - 1];
                        }
                    }
                    const float fw0 = a8_scale<FAST>(cur.s[i][0], q);
                    const float fw1 = FMT == A8_FP4 ? a8_scale<FAST>(cur.s[i][1], q) : fw0;
#pragma unroll
                    for (int j = 0; j < RT; j++) {
                        float p[4];
                        mma_e4m3_16832(p, a[0], a[1], a[2], a[3], xb[j][q].x, xb[j][q].y);
                        const float s0 = (&fa[j][0].x)[q], s1 = (&fa[j][1].x)[q];
                        acc[i][j][0] = fmaf(p[0], fw0 * s0, acc[i][j][0]);
                        acc[i][j][1] = fmaf(p[1], fw0 * s1, acc[i][j][1]);
                        acc[i][j][2] = fmaf(p[2], fw1 * s0, acc[i][j][2]);
                        acc[i][j][3] = fmaf(p[3], fw1 * s1, acc[i][j][3]);
                    }
                }
            }
        };
        bool fast = true;
#pragma unroll
        for (int i = 0; i < TILES; i++) fast = fast && a8_scales_fast(cur.s[i][0]) && a8_scales_fast(cur.s[i][1]);
        if (__all_sync(0xffffffffu, fast))
            step(std::true_type());
        else
            step(std::false_type());
        cur = nxt;
    }
    /* C of tile i, rows 8j..: columns 16i + g (+ 8 for t >= 2), rows 8j + 2c (+ 1 for odd t) */
#pragma unroll
    for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int j = 0; j < (TWO ? 2 : 1); j++)
#pragma unroll
            for (int t = 0; t < 4; t++)
                red[warp][8 * j + 2 * c + (t & 1)][16 * i + g + 8 * (t >> 1)] = acc[i][j][t];
    __syncthreads();
    /* FP4's codes went in as their values times 2^-6 */
    const float unit = FMT == A8_FP4 ? 64.0f : 1.0f;
    for (int o = threadIdx.x; o < A8_MAX_ROWS * COLS; o += A8_WARPS * 32) {
        const int r = o / COLS, col = o % COLS;
        if (r >= mr || n0 + col >= N) continue;
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < A8_WARPS; q++) v += red[q][r][col];
        bt_st(y, (size_t)(r0 + r) * ldy + n0 + col, v * unit);
    }
}

/* ---- the products on Hopper's warpgroup MMAs (sm_90a) ---------------------------------------
 * mma.sync's e4m3 shapes are emulated on Hopper; its fp8 tensor cores take wgmma only. A block of
 * KG warpgroups takes 64 weight columns (the MMA's M: 16 a warp, A from registers, filled as
 * gemm_a8_rows fills its fragments) against the group's rows (N = 8: one MMA per 8 rows), the
 * warpgroups taking every KG-th step of 4 blocks of K. The rows' codes are staged in shared
 * memory once, whole, as the MMA's B reads them: rows 8j..8j+7 at j * 8K, block b of them at
 * 256b, its even k (bytes 0..15 of each row's block) at +0 and its odd k at +128, row r's 16
 * bytes at 16 (r % 8): two core matrices of 8 rows x 16 bytes, unswizzled. A step issues its
 * 4 MMAs (each into its own accumulators: every block has its own scales), reads the rows'
 * scales while they run, waits, and adds each block's sums in times the column's and the row's
 * scale. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BT_A8_WGMMA 1
#endif
#ifdef BT_A8_WGMMA
__device__ int a8_wg_built = 1;
#else
__device__ int a8_wg_built = 0;
#endif

enum { WG_COLS = 64, WG_MAX_SMEM = 200 * 1024 };

/* the MMA's B: 8 rows x 32 k from shared address a, laid out as above. Leading and stride byte
 * offsets both 128: with 8 rows there is no second row group, so either reading of the two
 * fields steps K right. */
__device__ __forceinline__ uint64_t a8_desc(uint32_t a)
{
    return (uint64_t)((a & 0x3ffff) >> 4) | (uint64_t)(128 >> 4) << 16 | (uint64_t)(128 >> 4) << 32;
}

/* d = A . B for a warpgroup: A 64 x 32 e4m3 from registers (this warp's 16 rows), B from
 * shared memory; d this thread's 4 of the 64 x 8 f32 (not accumulated: scale-d 0) */
__device__ __forceinline__ void wgmma_e4m3_64x8x32(float *d, const unsigned *a, uint64_t db)
{
#ifdef BT_A8_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
#endif
}

__device__ __forceinline__ void a8_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void a8_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void a8_wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* keeps the compiler from reading the accumulators before the wait (they are written
 * asynchronously) */
__device__ __forceinline__ void a8_pin(float &v) { asm volatile("" : "+f"(v)::"memory"); }
/* ... and from moving the A fragments' conversions past the fence */
__device__ __forceinline__ void a8_pin(unsigned &v) { asm volatile("" : "+r"(v)::"memory"); }

__device__ __forceinline__ void a8_cp16(void *smem, const void *gmem, bool valid)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem),
                 "r"(valid ? 16 : 0));
}

template <int FMT, int KG, bool TWO, typename OT>
__global__ void __launch_bounds__(KG * 128, 4 / KG)
    gemm_a8_wg(OT *y, const uint8_t *xq, const float *xs, const int32_t *rows,
               const int32_t *offs, const uint8_t *w, const uint8_t *ws, int M, int N, int K,
               const int32_t *elist, long long ldy)
{
#ifdef BT_A8_WGMMA
    extern __shared__ __align__(128) unsigned char a8_smem[];
    __shared__ float red[KG][A8_MAX_ROWS][WG_COLS + 1];
    constexpr int RT = TWO ? 2 : 1; /* row tiles of 8 */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, grp = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, c = lane & 3;
    const int e = elist ? elist[blockIdx.y] : blockIdx.y;
    if (e < 0) return; /* a padded slot of the expert list (the whole block) */
    const int r0 = offs ? offs[e] : 0, mr = (offs ? offs[e + 1] : M) - r0;
    if (mr <= 0 || TWO != (mr > 8)) return; /* (the other instance takes it) */
    const int KB = K / 32, n0 = blockIdx.x * WG_COLS;
    if (FMT == A8_FP4) {
        w += (size_t)e * N * (K / 2);
        ws += (size_t)e * N * KB;
    }
    auto src = [&](int r) { r = min(r, mr - 1); return rows ? rows[r0 + r] : r0 + r; };

    /* the rows' codes into shared memory; the slots of rows past mr keep whatever they hold:
     * each row is its own column of the MMAs' outputs, and those are never stored */
    for (int u = tid; u < mr * KB * 2; u += KG * 128) {
        const int h = u & 1, b = (u >> 1) % KB, r = (u >> 1) / KB;
        a8_cp16(a8_smem + (size_t)(r >> 3) * K * 8 + 256 * b + 128 * h + 16 * (r & 7),
                xq + (size_t)src(r) * K + 32 * b + 16 * h, true);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* read next by the MMAs */
    __syncthreads();

    const float *sc[2][2] = {{xs + (size_t)src(2 * c) * KB, xs + (size_t)src(2 * c + 1) * KB},
                             {xs + (size_t)src(8 + 2 * c) * KB, xs + (size_t)src(9 + 2 * c) * KB}};
    unsigned woff[2], soff[2];
    bool ok[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const unsigned n = (unsigned)(n0 + 16 * wq + 8 * h + g);
        ok[h] = n < (unsigned)N;
        woff[h] = FMT == A8_FP4 ? n * (K / 2) + 4 * c : n * K + 8 * c;
        soff[h] = FMT == A8_FP4 ? n * KB : n / 32 * KB;
    }
    constexpr int WW = FMT == A8_FP4 ? 1 : 2;
    struct wstep {
        unsigned v[2][A8_STEP][WW];
        unsigned s[2];
    };
    auto load_w = [&](wstep &d, int b0) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const bool on = ok[h] && b0 < KB;
            d.s[h] = on ? __ldg((const unsigned *)(ws + soff[h] + b0)) : 0x7f7f7f7fu;
#pragma unroll
            for (int q = 0; q < A8_STEP; q++) {
                if (FMT == A8_FP4) {
                    d.v[h][q][0] = on ? __ldg((const unsigned *)(w + woff[h] + 16 * (b0 + q))) : 0u;
                } else { /* (as stored: the even and odd k parted where they are used) */
                    const uint2 u = on ? __ldg((const uint2 *)(w + woff[h] + 32 * (b0 + q))) : make_uint2(0, 0);
                    d.v[h][q][0] = u.x;
                    d.v[h][q][1] = u.y;
                }
            }
        }
    };

    float acc[RT][4], d[RT][A8_STEP][4];
#pragma unroll
    for (int j = 0; j < RT; j++)
#pragma unroll
        for (int t = 0; t < 4; t++) {
            acc[j][t] = 0.0f;
#pragma unroll
            for (int q = 0; q < A8_STEP; q++) d[j][q][t] = 0.0f;
        }
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(a8_smem);
    /* the weights two steps ahead: a step's own work (conversions, 4 MMAs, their wait) is far
     * shorter than a load from memory */
    wstep cur, nxt, nxt2;
    load_w(cur, grp * A8_STEP);
    load_w(nxt, (grp + KG) * A8_STEP);
    for (int b0 = grp * A8_STEP; b0 < KB; b0 += KG * A8_STEP) {
        load_w(nxt2, b0 + 2 * KG * A8_STEP);
        unsigned a[A8_STEP][4]; /* columns g (a0 even k, a2 odd k) and g + 8 (a1, a3) */
#pragma unroll
        for (int q = 0; q < A8_STEP; q++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (FMT == A8_FP4) {
                    a[q][h] = e2m1x4_lo_to_e4m3(cur.v[h][q][0]);
                    a[q][2 + h] = e2m1x4_hi_to_e4m3(cur.v[h][q][0]);
                } else {
                    a[q][h] = __byte_perm(cur.v[h][q][0], cur.v[h][q][WW - 1], 0x6420);
                    a[q][2 + h] = __byte_perm(cur.v[h][q][0], cur.v[h][q][WW - 1], 0x7531);
                }
            }
#pragma unroll
        for (int q = 0; q < A8_STEP; q++)
#pragma unroll
            for (int i = 0; i < 4; i++) a8_pin(a[q][i]);
        a8_wg_fence();
#pragma unroll
        for (int q = 0; q < A8_STEP; q++)
#pragma unroll
            for (int j = 0; j < RT; j++)
                wgmma_e4m3_64x8x32(d[j][q], a[q], a8_desc(sbase + j * K * 8 + 256 * (b0 + q)));
        a8_wg_commit();
        /* the rows' scales while the MMAs run */
        float4 fa[RT][2];
#pragma unroll
        for (int j = 0; j < RT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) fa[j][h] = *(const float4 *)(sc[j][h] + b0);
        const bool fast = a8_scales_fast(cur.s[0]) && a8_scales_fast(cur.s[1]);
        a8_wg_wait0();
#pragma unroll
        for (int j = 0; j < RT; j++)
#pragma unroll
            for (int q = 0; q < A8_STEP; q++)
#pragma unroll
                for (int t = 0; t < 4; t++) a8_pin(d[j][q][t]);
        auto scale_in = [&](auto fast_c) {
            constexpr bool FAST = decltype(fast_c)::value;
#pragma unroll
            for (int q = 0; q < A8_STEP; q++) {
                const float fw0 = a8_scale<FAST>(cur.s[0], q);
                const float fw1 = FMT == A8_FP4 ? a8_scale<FAST>(cur.s[1], q) : fw0;
#pragma unroll
                for (int j = 0; j < RT; j++) {
                    const float s0 = (&fa[j][0].x)[q], s1 = (&fa[j][1].x)[q];
                    acc[j][0] = fmaf(d[j][q][0], fw0 * s0, acc[j][0]);
                    acc[j][1] = fmaf(d[j][q][1], fw0 * s1, acc[j][1]);
                    acc[j][2] = fmaf(d[j][q][2], fw1 * s0, acc[j][2]);
                    acc[j][3] = fmaf(d[j][q][3], fw1 * s1, acc[j][3]);
                }
            }
        };
        if (__all_sync(0xffffffffu, fast))
            scale_in(std::true_type());
        else
            scale_in(std::false_type());
        cur = nxt;
        nxt = nxt2;
    }
    /* accumulator of rows 8j..: column 16 wq + g (+ 8 for t >= 2), row 8j + 2c (+ 1, odd t) */
#pragma unroll
    for (int j = 0; j < RT; j++)
#pragma unroll
        for (int t = 0; t < 4; t++)
            red[grp][8 * j + 2 * c + (t & 1)][16 * wq + g + 8 * (t >> 1)] = acc[j][t];
    __syncthreads();
    const float unit = FMT == A8_FP4 ? 64.0f : 1.0f; /* FP4's codes went in times 2^-6 */
    for (int o = tid; o < 8 * RT * WG_COLS; o += KG * 128) {
        const int r = o / WG_COLS, col = o % WG_COLS;
        if (r >= mr || n0 + col >= N) continue;
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < KG; q++) v += red[q][r][col];
        bt_st(y, (size_t)(r0 + r) * ldy + n0 + col, v * unit);
    }
#else
    __trap(); /* launched only where a8_wg_ready() found the sm_90a image */
#endif
}

/* the warpgroup kernel runs here: a Hopper device and this binary's sm_90a image; its shared
 * memory (the rows' codes, 8K bytes a tile of 8 rows) within what it may ask */
template <int FMT, int KG, bool TWO, typename OT>
static bool a8_wg_ready(size_t smem)
{
    static signed char built[BT__MAX_DEVICES], allowed[BT__MAX_DEVICES];
    int dev = 0;
    if (smem > WG_MAX_SMEM || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= BT__MAX_DEVICES) {
        cudaGetLastError();
        return false;
    }
    if (!built[dev]) {
        int major = 0, flag = 0;
        bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  major == 9 && cudaMemcpyFromSymbol(&flag, a8_wg_built, sizeof flag) == cudaSuccess && flag == 1;
        if (!ok) cudaGetLastError();
        built[dev] = ok ? 1 : -1;
    }
    return built[dev] > 0 &&
           bt__smem_allowed((const void *)gemm_a8_wg<FMT, KG, TWO, OT>, WG_MAX_SMEM, allowed);
}

template <int FMT, int KG, bool TWO, typename OT>
static bool a8_wg_launch(OT *y, const uint8_t *q, const float *qs, const int32_t *rows,
                         const int32_t *offs, const int32_t *elist, int groups,
                         const uint8_t *w, const uint8_t *ws, int M, int N, int K, long long ldy,
                         cudaStream_t stream)
{
    const size_t smem = (size_t)(TWO ? 2 : 1) * K * 8;
    if (!a8_wg_ready<FMT, KG, TWO, OT>(smem)) return false;
    gemm_a8_wg<FMT, KG, TWO><<<dim3(bt__cdiv(N, WG_COLS), groups), KG * 128, smem, stream>>>(
        y, q, qs, rows, offs, w, ws, M, N, K, elist, ldy);
    return true;
}

template <int FMT>
static bt_status_t a8_launch(void *y, bt_cuda_dtype_t yd, const uint8_t *q, const float *qs,
                             const int32_t *rows, const int32_t *offs, const int32_t *elist,
                             int groups, int max_rows, const uint8_t *w, const uint8_t *ws, int M, int N, int K,
                             long long ldy, cudaStream_t stream)
{
    /* Hopper: the warpgroup kernel, 4 warpgroups splitting K where 2 would leave most SMs
     * without a block (BT_CUDA_A8_ROWS=1 in the environment: the other kernel, for tests) */
    static const bool rows_kernel = getenv("BT_CUDA_A8_ROWS") && !strcmp(getenv("BT_CUDA_A8_ROWS"), "1");
    if (!rows_kernel) {
        const bool narrow = (long long)bt__cdiv(N, WG_COLS) * groups < 132;
        bool ok = true;
#define BT__A8WG(TWO)                                                                              \
    (yd == BT_CUDA_BF16                                                                            \
         ? (narrow ? a8_wg_launch<FMT, 4, TWO>((__nv_bfloat16 *)y, q, qs, rows, offs, elist,       \
                                               groups, w, ws, M, N, K, ldy, stream)               \
                   : a8_wg_launch<FMT, 2, TWO>((__nv_bfloat16 *)y, q, qs, rows, offs, elist,       \
                                               groups, w, ws, M, N, K, ldy, stream))              \
         : (narrow ? a8_wg_launch<FMT, 4, TWO>((float *)y, q, qs, rows, offs, elist, groups, w,    \
                                               ws, M, N, K, ldy, stream)                          \
                   : a8_wg_launch<FMT, 2, TWO>((float *)y, q, qs, rows, offs, elist, groups, w,    \
                                               ws, M, N, K, ldy, stream)))
        ok = BT__A8WG(false);
        if (ok && max_rows > 8) ok = BT__A8WG(true);
#undef BT__A8WG
        if (ok) return bt__cuda_launched(FMT == A8_FP4 ? "gemm_fp4_grouped_a8" : "gemm_fp8_a8");
    }
    /* elsewhere: 32 columns a block when that leaves two blocks an SM, else 16 */
    const bool wide = (long long)bt__cdiv(N, 32) * groups >= 264;
#define BT__A8(TL, TWO)                                                                            \
    do {                                                                                           \
        dim3 grid(bt__cdiv(N, 16 * TL), groups);                                                   \
        if (yd == BT_CUDA_BF16)                                                                    \
            gemm_a8_rows<FMT, TL, TWO><<<grid, A8_WARPS * 32, 0, stream>>>(                        \
                (__nv_bfloat16 *)y, q, qs, rows, offs, w, ws, M, N, K, elist, ldy);                \
        else                                                                                       \
            gemm_a8_rows<FMT, TL, TWO><<<grid, A8_WARPS * 32, 0, stream>>>(                        \
                (float *)y, q, qs, rows, offs, w, ws, M, N, K, elist, ldy);                        \
    } while (0)
    /* groups of up to 8 rows and of 9..16 take different instances: two launches when the
     * rows allow both (a group's blocks of the other instance return at once); 9..16 rows
     * hold a tile of 16 columns a block (32 would spill) */
    if (wide)
        BT__A8(2, false);
    else
        BT__A8(1, false);
    if (max_rows > 8) BT__A8(1, true);
#undef BT__A8
    return bt__cuda_launched(FMT == A8_FP4 ? "gemm_fp4_grouped_a8" : "gemm_fp8_a8");
}

/* the quantized rows' layout asks for: K whole steps of 4 blocks (aligned scale words and
 * float4s), 8-byte aligned codes, 16-byte aligned scales */
static bool a8_inputs_ok(const uint8_t *q, const float *qs, int K)
{
    return K > 0 && K % (32 * A8_STEP) == 0 && (uintptr_t)q % 8 == 0 && (uintptr_t)qs % 16 == 0;
}

extern "C" bt_status_t bt_cuda_quant_act_fp8(uint8_t *q, float *q_scale, const void *x,
                                             bt_cuda_dtype_t x_dtype, int rows, int K, int ldx,
                                             cudaStream_t stream)
{
    BT_CUDA_REQUIRE(q && q_scale && x && bt__dtype_ok(x_dtype));
    BT_CUDA_REQUIRE(rows > 0 && K > 0 && K % 32 == 0 && ldx >= K && (uintptr_t)q % 8 == 0);
    const long long threads = (long long)rows * (K / 8);
    if (x_dtype == BT_CUDA_BF16)
        quant_act_fp8_kernel<<<bt__cdiv(threads, 256), 256, 0, stream>>>(
            q, q_scale, (const __nv_bfloat16 *)x, rows, K, ldx);
    else
        quant_act_fp8_kernel<<<bt__cdiv(threads, 256), 256, 0, stream>>>(
            q, q_scale, (const float *)x, rows, K, ldx);
    return bt__cuda_launched("quant_act_fp8");
}

extern "C" bt_status_t bt_cuda_gemm_fp4_grouped_a8(void *y, bt_cuda_dtype_t y_dtype,
                                                   const uint8_t *q, const float *q_scale,
                                                   const int32_t *rows, const int32_t *offs,
                                                   const int32_t *experts, int n_groups,
                                                   int max_rows, const uint8_t *w,
                                                   const uint8_t *w_scale, int N, int K,
                                                   cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && q && q_scale && offs && w && w_scale && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE(n_groups > 0 && n_groups <= 65535 && max_rows > 0 &&
                    max_rows <= A8_MAX_ROWS && N > 0 && a8_inputs_ok(q, q_scale, K));
    /* (the kernel's offsets in an expert's weights are 32-bit) */
    BT_CUDA_REQUIRE((long long)N * (K / 2) < (1ll << 31) && (uintptr_t)w % 4 == 0 &&
                    (uintptr_t)w_scale % 4 == 0);
    return a8_launch<A8_FP4>(y, y_dtype, q, q_scale, rows, offs, experts, n_groups, max_rows, w, w_scale,
                             0, N, K, N, stream);
}

extern "C" bt_status_t bt_cuda_gemm_fp8_a8(void *y, bt_cuda_dtype_t y_dtype, const uint8_t *q,
                                           const float *q_scale, const uint8_t *w,
                                           const uint8_t *w_scale, int M, int N, int K,
                                           cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && q && q_scale && w && w_scale && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE(M > 0 && M <= A8_MAX_ROWS && N > 0 && a8_inputs_ok(q, q_scale, K));
    BT_CUDA_REQUIRE((long long)N * K < (1ll << 31) && (uintptr_t)w % 8 == 0 &&
                    (uintptr_t)w_scale % 4 == 0);
    return a8_launch<A8_FP8>(y, y_dtype, q, q_scale, NULL, NULL, NULL, 1, M, w, w_scale, M, N, K,
                             N, stream);
}

/* GEMMs on the checkpoint's low-precision weights, consumed natively:
 *   FP8 e4m3 [N,K] with one UE8M0 scale per 32x32 block (dense layers),
 *   FP4 e2m1 [N,K/2] with one UE8M0 scale per 32 along K (routed experts, grouped over
 *   experts), the codes in fragment order (lowp_bits.h; bt_cuda_fp4_to_frag rearranges a
 *   checkpoint's two-a-byte bytes once, at load): a lane's bf16 pairs come from one word.
 * cuBLASLt's block-scaled paths do not fit: on Hopper they scale 1x128 / 128x128 blocks,
 * and the 32-element UE8M0 (MX) layouts are Blackwell-only; so these are our own kernels.
 *
 * The kernels, by rows per weight matrix (an expert's share for grouped FP4):
 *   <= 16 rows, K whole chunks (64 FP8 / 128 FP4), 16-byte rows: gemm_mma16, m16n8k16 MMAs
 *           with the weights dequantized in registers straight into B fragments (decode;
 *           also bf16 weights for gemm.cu); a bf16 product of few column tiles has K sliced over
 *           the blocks of a cluster, which add their sums through distributed shared memory;
 *           for FP4 and FP8 gemm_rows instead (where K is not sliced), the weights as A and 8
 *           rows as B, the next chunk's weights and rows loaded ahead (BT_CUDA_FP4ROWS=0,
 *           BT_CUDA_FP8ROWS=0 keep gemm_mma16);
 *   <= 16 rows otherwise: gemm_skinny, one warp per output column on the CUDA cores;
 *   more FP4 rows, K whole 128-chunks, on Hopper: gemm_fp4_wgrs, warpgroup MMAs with the
 *           weights dequantized in registers as A, an expert's rows (up to 112) as B (prefill
 *           experts; BT_CUDA_WGRS=0 turns it off);
 *   elsewhere: gemm_fp4_tiles, 64 x 128 tiles of m16n8k16 MMAs fed by a cp.async pipeline of the
 *           rows, packed weights and scales;
 *   otherwise: gemm_tile, 64x64 tiles that dequantize the weights into bf16 in shared memory
 *           (exact: e4m3/e2m1 times a power of two fits bf16) for 16x16x16 wmma MMAs.
 * (Dense FP8 products of >= 64 rows go through bt_cuda_dequant_fp8 and cuBLASLt instead.) */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/lowp_bits.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/wgmma.cuh"

#include <cooperative_groups.h>
#include <cuda_fp8.h>
#include <mma.h>

#include <type_traits>

using namespace nvcuda;
namespace cg = cooperative_groups;

enum { FMT_FP8 = 0, FMT_FP4 = 1, FMT_BF16 = 2 }; /* (bf16: the few-row kernel only) */
enum { BM = 64, BN = 64, BK = 32, LDS = BK + 8, LDC = BN + 4, TILE_THREADS = 128 };
enum { SK_WARPS = 8, SK_ROWS = 8, SKINNY_MAX_ROWS = 16 };

/* 16 e4m3 bytes (one uint4) times a scale -> 16 floats */
__device__ __forceinline__ void dequant_fp8x16(uint4 v, float s, float *out)
{
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
                (__nv_fp8x2_storage_t)((u[i] >> (16 * h)) & 0xffffu), __NV_E4M3);
            float2 f = __half22float2(*(__half2 *)&r);
            out[4 * i + 2 * h] = f.x * s;
            out[4 * i + 2 * h + 1] = f.y * s;
        }
    }
}

/* codes k0 .. k0 + n - 1 of a run of 32 in fragment order (16 bytes) -> their values times s,
 * in k order (exact: e2m1 times a power of two) */
__device__ __forceinline__ void fp4_run_values(uint4 v, int k0, int n, float s, float *out)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < n; j++)
        out[j] = bt_e2m1(bt_fp4_frag_code(u, k0 + j)) * s;
}

__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float *out)
{
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 f32x8_to_bf16(const float *f)
{
    unsigned u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        u[i] = *(unsigned *)&b;
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* One weight element, any shape (the slow path for odd sizes). */
template <int FMT>
__device__ __forceinline__ float weight_at(const uint8_t *w, const uint8_t *ws, int n, int k, int K)
{
    if (FMT == FMT_FP8) {
        int ks = (K + 31) / 32;
        return bt_e4m3(w[(size_t)n * K + k]) * bt_e8m0(ws[(size_t)(n / 32) * ks + k / 32]);
    }
    /* fragment order: code k of a run is pair k / 8 % 4, half k % 2 of word k % 8 / 2 */
    const uint32_t word =
        *(const uint32_t *)(w + (size_t)n * (K / 2) + (k & ~31) / 2 + 4 * ((k & 7) >> 1));
    return bt_e2m1(bt_fp4_word_code(word, k >> 3 & 3, k & 1)) *
           bt_e8m0(ws[(size_t)n * (K / 32) + k / 32]);
}

template <int FMT>
__device__ __forceinline__ void expert_weights(const uint8_t *&w, const uint8_t *&ws, int e, int N,
                                               int K)
{
    if (FMT == FMT_FP4) {
        w += (size_t)e * N * (K / 2);
        ws += (size_t)e * N * (K / 32);
    } else if (FMT == FMT_FP8) { /* a batch of FP8 matrices (one, e = 0, for a plain product) */
        w += (size_t)e * N * K;
        ws += (size_t)e * ((N + 31) / 32) * ((K + 31) / 32);
    } else { /* bf16, no scales */
        w += (size_t)e * N * K * 2;
    }
}

/* Where the rows lie. Grouped (offs given): row r of x (r global, or rows[r]) at x + r * ldx,
 * of y at y + r * ldy. A batch (offs NULL): group e's M rows at x + e * x_group + r * ldx and
 * y + e * y_group + r * ldy, r < M. Plain: ldx = K, ldy = N. */
struct gemm_io {
    long long ldx, x_group, ldy, y_group;
};

static inline gemm_io plain_io(int N, int K) { return gemm_io{K, 0, N, 0}; }

template <int FMT, typename OT>
__global__ void __launch_bounds__(TILE_THREADS) gemm_tile(OT *y, const __nv_bfloat16 *x,
                                                          const int32_t *rows, const int32_t *offs,
                                                          const uint8_t *w, const uint8_t *ws,
                                                          int M, int N, int K, const int32_t *elist,
                                                          gemm_io io)
{
    bt_grid_begin();
    __shared__ __align__(128) unsigned char smem[BM * LDC * 4];
    __nv_bfloat16(*sa)[LDS] = (__nv_bfloat16(*)[LDS])smem;
    __nv_bfloat16(*sb)[LDS] = (__nv_bfloat16(*)[LDS])(smem + BM * LDS * 2);
    float(*sc)[LDC] = (float(*)[LDC])smem;

    int e = elist ? elist[blockIdx.z] : blockIdx.z, tid = threadIdx.x, warp = tid >> 5;
    if (e < 0) return; /* a padded slot of the expert list */
    int r0 = offs ? offs[e] : 0, r1 = offs ? offs[e + 1] : M;
    int m0 = r0 + blockIdx.y * BM, n0 = blockIdx.x * BN;
    x += (size_t)e * io.x_group;
    y += (size_t)e * io.y_group;
    if (m0 >= r1) return;
    int mrows = min(BM, r1 - m0);
    expert_weights<FMT>(w, ws, e, N, K);

    /* the two A rows this thread loads, resolved once */
    int a_src[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = (tid + TILE_THREADS * i) >> 2;
        a_src[i] = row < mrows ? (rows ? rows[m0 + row] : m0 + row) : -1;
    }
    const bool a_vec = (K % 8) == 0;
    const bool b_vec = FMT == FMT_FP8 ? (K % 16) == 0 : true; /* FP4: K % 32 == 0 */
    const int ks8 = (K + 31) / 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    for (int k0 = 0; k0 < K; k0 += BK) {
        /* A: 64 rows x 32 bf16, 8 a thread-load */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int idx = tid + TILE_THREADS * i, row = idx >> 2, kc = (idx & 3) * 8, k = k0 + kc;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (a_src[i] >= 0) {
                const __nv_bfloat16 *src = x + (size_t)a_src[i] * io.ldx + k;
                if (a_vec && k + 8 <= K) {
                    v = *(const uint4 *)src;
                } else {
                    unsigned short t[8];
                    for (int j = 0; j < 8; j++)
                        t[j] = k + j < K ? ((const unsigned short *)src)[j] : 0;
                    v = make_uint4(t[0] | (unsigned)t[1] << 16, t[2] | (unsigned)t[3] << 16,
                                   t[4] | (unsigned)t[5] << 16, t[6] | (unsigned)t[7] << 16);
                }
            }
            *(uint4 *)&sa[row][kc] = v;
        }
        /* B: 64 weight rows x 32, 16 a thread, dequantized into bf16 */
        {
            int row = tid >> 1, kc = (tid & 1) * 16, n = n0 + row, k = k0 + kc;
            float f[16];
            if (n < N && b_vec && k + 16 <= K) {
                if (FMT == FMT_FP8) {
                    float s = bt_e8m0(ws[(size_t)(n / 32) * ks8 + k0 / 32]);
                    dequant_fp8x16(*(const uint4 *)(w + (size_t)n * K + k), s, f);
                } else {
                    float s = bt_e8m0(ws[(size_t)n * (K / 32) + k0 / 32]);
                    /* (the 16 codes of a half-run lie in all four of its words) */
                    fp4_run_values(*(const uint4 *)(w + (size_t)n * (K / 2) + k0 / 2), kc, 16, s,
                                   f);
                }
            } else {
                for (int j = 0; j < 16; j++)
                    f[j] = (n < N && k + j < K) ? weight_at<FMT>(w, ws, n, k + j, K) : 0.0f;
            }
            *(uint4 *)&sb[row][kc] = f32x8_to_bf16(f);
            *(uint4 *)&sb[row][kc + 8] = f32x8_to_bf16(f + 8);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sa[wm + 16 * i][kk], LDS);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &sb[wn + 16 * j][kk], LDS);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&sc[wm + 16 * i][wn + 16 * j], acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < BM * BN; idx += TILE_THREADS) {
        int r = idx / BN, c = idx % BN;
        if (r < mrows && n0 + c < N) bt_st(y, (size_t)(m0 + r) * io.ldy + n0 + c, sc[r][c]);
    }
}

template <int FMT, typename OT>
__global__ void __launch_bounds__(SK_WARPS * 32) gemm_skinny(OT *y, const __nv_bfloat16 *x,
                                                             const int32_t *rows,
                                                             const int32_t *offs, const uint8_t *w,
                                                             const uint8_t *ws, int M, int N, int K,
                                                             const int32_t *elist, gemm_io io)
{
    bt_grid_begin();
    int lane = threadIdx.x & 31, n = blockIdx.x * SK_WARPS + (threadIdx.x >> 5);
    int e = elist ? elist[blockIdx.y] : blockIdx.y;
    if (n >= N || e < 0) return; /* no block barriers below */
    int r0 = offs ? offs[e] : 0, r1 = offs ? offs[e + 1] : M;
    expert_weights<FMT>(w, ws, e, N, K);
    x += (size_t)e * io.x_group;
    y += (size_t)e * io.y_group;
    const int ks8 = (K + 31) / 32;
    for (int mb = r0; mb < r1; mb += SK_ROWS) {
        int mr = min(SK_ROWS, r1 - mb);
        const __nv_bfloat16 *xr[SK_ROWS];
        float acc[SK_ROWS];
#pragma unroll
        for (int m = 0; m < SK_ROWS; m++) {
            acc[m] = 0.0f;
            int src = m < mr ? (rows ? rows[mb + m] : mb + m) : 0;
            xr[m] = x + (size_t)src * io.ldx;
        }
        if (FMT == FMT_FP8 && (K % 16) == 0) {
            const uint8_t *wr = w + (size_t)n * K, *sr = ws + (size_t)(n / 32) * ks8;
            for (int k0 = lane * 16; k0 < K; k0 += 2 * 32 * 16) {
                /* both loads issued before either is used */
                uint4 wv[2];
                int kk[2] = {k0, k0 + 32 * 16};
                wv[0] = __ldg((const uint4 *)(wr + k0));
                wv[1] = make_uint4(0, 0, 0, 0);
                if (kk[1] < K) wv[1] = __ldg((const uint4 *)(wr + kk[1]));
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    int k = kk[u];
                    if (k >= K) break;
                    float f[16];
                    dequant_fp8x16(wv[u], 1.0f, f);
                    float s = bt_e8m0(sr[k / 32]);
#pragma unroll
                    for (int m = 0; m < SK_ROWS; m++) {
                        if (m >= mr) break;
                        float a[16], p = 0.0f;
                        bf16x8_to_f32(*(const uint4 *)(xr[m] + k), a);
                        bf16x8_to_f32(*(const uint4 *)(xr[m] + k + 8), a + 8);
#pragma unroll
                        for (int j = 0; j < 16; j++) p += f[j] * a[j];
                        acc[m] += p * s;
                    }
                }
            }
        } else if (FMT == FMT_FP4) {
            const uint8_t *wr = w + (size_t)n * (K / 2), *sr = ws + (size_t)n * (K / 32);
            for (int k0 = lane * 32; k0 < K; k0 += 2 * 32 * 32) {
                uint4 wv[2];
                int kk[2] = {k0, k0 + 32 * 32};
                wv[0] = __ldg((const uint4 *)(wr + k0 / 2));
                wv[1] = make_uint4(0, 0, 0, 0);
                if (kk[1] < K) wv[1] = __ldg((const uint4 *)(wr + kk[1] / 2));
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    int k = kk[u];
                    if (k >= K) break;
                    float s = bt_e8m0(sr[k / 32]), f[32];
                    fp4_run_values(wv[u], 0, 32, 1.0f, f);
#pragma unroll
                    for (int m = 0; m < SK_ROWS; m++) {
                        if (m >= mr) break;
                        float p = 0.0f;
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            float a[8];
                            bf16x8_to_f32(*(const uint4 *)(xr[m] + k + 8 * c), a);
#pragma unroll
                            for (int j = 0; j < 8; j++) p += f[8 * c + j] * a[j];
                        }
                        acc[m] += p * s;
                    }
                }
            }
        } else {
            for (int k = lane; k < K; k += 32) {
                float wv = weight_at<FMT>(w, ws, n, k, K);
#pragma unroll
                for (int m = 0; m < SK_ROWS; m++)
                    if (m < mr) acc[m] += wv * __bfloat162float(xr[m][k]);
            }
        }
#pragma unroll
        for (int m = 0; m < SK_ROWS; m++) {
            float v = bt_warp_sum(acc[m]);
            if (lane == 0 && m < mr) bt_st(y, (size_t)(mb + m) * io.ldy + n, v);
        }
    }
}

/* ---- few rows on the tensor cores ----------------------------------------------------------
 * Up to 16 rows (a decode batch, an expert's share of it) against 32 weight columns per block:
 * one m16n8k16 bf16 MMA has exactly the 16 rows as A, and 8 columns as B. The weights are read
 * once, 16 bytes a lane, dequantized into bf16 in registers (exact: e4m3/e2m1 times a power of
 * two) straight into B fragments. A dot product does not care in which order K is walked, so
 * each MMA's 16 logical k are mapped onto memory such that lane c's B (and A) elements are
 * contiguous: in a chunk of 64 (FP8; 128 for FP4) k, MMA s gives lane c (FP8, bf16) the actual
 * k chunk + W*c + 4s + {0,1,2,3} (W = 16 or 32: the lane's 16 weight bytes), logical
 * {2c, 2c+1, 2c+8, 2c+9}. FP4's fragment order puts a bf16 pair's two codes in one word, its
 * pair j (bt_e2m1x8_to_bf16_spread: no byte permutes); pair j of word q is the lane's k 2q + 8j,
 * so MMA st takes the rows' natural bf16 words q + 8h and q + 8h + 4 (q = st /
 * 2, h = st % 2). The 8 warps split K; their partial sums meet in shared memory.
 * A block takes TILES x 8 columns: 4 where that leaves enough blocks, else 1 (a [512, 5120]
 * weight in blocks of 32 columns would run on 16 SMs). Each warp loads the next chunk's
 * weights before it multiplies the current one. */
enum { MT_WARPS = 8 };

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi)
{
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&b;
}

/* 2^126 * scale, twice, for fp4x8_to_bf16_fast */
__device__ __forceinline__ __nv_bfloat162 fp4_scale2(uint8_t sv)
{
    const __nv_bfloat16 sb = __ushort_as_bfloat16(bt_fp4_scale_bf16(sv));
    return __halves2bfloat162(sb, sb);
}

/* FP8: two e4m3 codes (the low 16 bits of v) become an exact f16 pair in one conversion;
 * moving each half's exponent and mantissa down 3 bits makes it the bf16 of the same value
 * times 2^-112 (f16 and bf16 differ by their exponent widths; e4m3 values are f16 normals),
 * and one bf16 multiply by 2^112 * scale finishes it. 5 operations a pair where the f32 route
 * (two conversions to f32, two multiplies, one packing) took 6. Exact while the scale keeps
 * every product a bf16 with its 4 significant bits: scale bytes 8..142 (bt_fp8_scale_fast);
 * real checkpoints' are all such, others take the f32 route. The NaN codes (0x7f, 0xff) come
 * out finite here (the f32 route keeps them NaN): no checkpoint has them, and checking every
 * byte would cost a third of the conversion. */
__device__ __forceinline__ __nv_bfloat162 fp8_scale2(uint8_t sv)
{
    const __nv_bfloat16 sb = __ushort_as_bfloat16(bt_fp8_scale_bf16(sv));
    return __halves2bfloat162(sb, sb);
}

/* a bf16 pair times s2 */
__device__ __forceinline__ unsigned bf16x2_mul(unsigned v, __nv_bfloat162 s2)
{
    __nv_bfloat162 p = __hmul2(*(__nv_bfloat162 *)&v, s2);
    return *(unsigned *)&p;
}

__device__ __forceinline__ unsigned e4m3x2_to_bf16_scaled(unsigned v, __nv_bfloat162 s2)
{
    const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return bf16x2_mul(bt_f16x2_to_bf16x2_2m112((unsigned)h2.x | (unsigned)h2.y << 16), s2);
}

/* the same pair times any scale (s = bt_e8m0 of its byte) by way of f32, as dequant_fp8x16:
 * NaN codes stay NaN */
__device__ __forceinline__ unsigned e4m3x2_to_bf16_f32(unsigned v, float s)
{
    const __half2_raw h2 =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    const float2 f = __half22float2(*(const __half2 *)&h2);
    return pack_bf16(f.x * s, f.y * s);
}

/* 8 e2m1 codes (a word in fragment order) times their scale -> its 4 bf16 pairs
 * (bt_e2m1x8_to_bf16_spread; each a pair of consecutive k),
 * exact for a bt_fp4_scale_fast scale: the codes as bf16 times 2^-126, then times
 * s2 = fp4_scale2 (subnormal inputs are exact in bf16 multiplies). No branch: the kernels pick
 * this or fp4x8_to_bf16_scaled once per chunk, so the MMAs around it can be interleaved. */
__device__ __forceinline__ void fp4x8_to_bf16_fast(unsigned v, __nv_bfloat162 s2, unsigned *out)
{
    bt_e2m1x8_to_bf16_spread(v, out);
#pragma unroll
    for (int j = 0; j < 4; j++)
        out[j] = bf16x2_mul(out[j], s2);
}

/* A pair of those codes (bf16, times 2^-126) times any scale byte, in two multiplies: by 2^126
 * (the codes' values, exact), then by the scale as a bf16 (2^-127 a subnormal, 0xff NaN):
 * exact, products under 2^-126 included (bf16 multiplies keep subnormals, and e2m1 times a power
 * of two has at most 2 significant bits); overflow gives infinity as f32 does. Branch-free and
 * light on registers: the slow path of kernels whose fast path holds many. */
__device__ __forceinline__ unsigned fp4x2_scaled_slow(unsigned v, uint8_t sv)
{
    const unsigned short bits = sv == 0 ? 0x0040 : sv == 0xff ? 0x7fc0 : (unsigned short)(sv << 7);
    const __nv_bfloat16 sb = __ushort_as_bfloat16(bits), up = __ushort_as_bfloat16(0x7e80);
    return bf16x2_mul(bf16x2_mul(v, __halves2bfloat162(up, up)), __halves2bfloat162(sb, sb));
}

/* fp4x8_to_bf16_fast for any scale byte */
__device__ __forceinline__ void fp4x8_to_bf16_scaled(unsigned v, uint8_t sv, unsigned *out)
{
    bt_e2m1x8_to_bf16_spread(v, out);
#pragma unroll
    for (int j = 0; j < 4; j++)
        out[j] = fp4x2_scaled_slow(out[j], sv);
}

/* blocks an SM the registers must allow: 5 for the narrow FP8 and bf16 instances (at most 51
 * registers; 4 measured the same within noise: decode b1 0.328 ms for 0.325), 2 for those
 * that hold 4 tiles or FP4 pairs in registers */
#define MMA16_MIN_BLOCKS(FMT, TILES) ((FMT) != FMT_FP4 && (TILES) == 1 ? 5 : 2)

template <int FMT, int TILES, typename OT>
__global__ void __launch_bounds__(MT_WARPS * 32, MMA16_MIN_BLOCKS(FMT, TILES)) gemm_mma16(OT *y, const __nv_bfloat16 *x,
                                                            const int32_t *rows,
                                                            const int32_t *offs,
                                                            const uint8_t *w, const uint8_t *ws,
                                                            int M, int N, int K,
                                                            const int32_t *elist, gemm_io io,
                                                            int ksplit)
{
    /* k per lane per chunk: the 16 bytes a lane loads */
    constexpr int KW = FMT == FMT_FP8 ? 16 : FMT == FMT_FP4 ? 32 : 8;
    constexpr int CHUNK = 4 * KW, STEPS = KW / 4, XW = KW / 8; /* uint4 of x per row */
    constexpr int COLS = 8 * TILES;
    __shared__ float red[MT_WARPS][16][COLS + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    /* ksplit > 1: the blocks of a cluster take consecutive slices of K for the same columns
     * (never for FP4, whose instances then compile without it: it cost them 8% at b16) */
    if (FMT == FMT_FP4) ksplit = 1;
    const int split = blockIdx.x % ksplit, n0 = blockIdx.x / ksplit * COLS;
    const int kslice = (K / CHUNK + ksplit - 1) / ksplit * CHUNK;
    const int kbeg = split * kslice, kend = min(K, kbeg + kslice);
    /* A dense product's weights (no expert list, no offsets) are known before the kernel
     * before this one ends: each warp's first chunk is loaded before the wait, so it is in
     * flight while that kernel finishes. An expert list or offsets come from that kernel. */
    const bool known = !elist && !offs;
    if (!known) bt_grid_begin();
    const int e = elist ? elist[blockIdx.y] : blockIdx.y;
    if (e < 0) return; /* a padded slot of the expert list (the whole block) */
    const int r0 = offs ? offs[e] : 0, r1 = offs ? offs[e + 1] : M, mr = r1 - r0;
    if (mr <= 0) { /* the whole block: no barrier is skipped by part of it */
        if (known) bt_grid_begin();
        return;
    }
    expert_weights<FMT>(w, ws, e, N, K);
    const int ks8 = (K + 31) / 32;

    float acc[TILES][4];
#pragma unroll
    for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    /* this lane's 16 weight bytes of tile i at the chunk that starts at k0, and their scale
     * bytes (FP8: one 32x32 block for every tile; FP4: one per row); both a chunk ahead. The
     * offsets of each tile's row are resolved once (32 bits: the launcher keeps a matrix under
     * 2 GB), so a load is an add away: the 64-bit products per load and chunk cost more issue
     * slots than the loads themselves. */
    unsigned woff[TILES], soff[TILES];
    bool col_ok[TILES];
#pragma unroll
    for (int i = 0; i < TILES; i++) {
        const unsigned n = (unsigned)(n0 + 8 * i + g);
        col_ok[i] = n < (unsigned)N;
        woff[i] = FMT == FMT_FP8 ? n * K + KW * c
                  : FMT == FMT_FP4 ? n * (K / 2) + KW * c / 2
                                   : (n * K + KW * c) * 2;
        soff[i] = FMT == FMT_FP8 ? (n / 32) * ks8 + (c >> 1) : n * (K / 32) + c;
    }
    auto load_w = [&](uint4 *v, uint8_t *sb, int k0) {
#pragma unroll
        for (int i = 0; i < TILES; i++) {
            v[i] = make_uint4(0, 0, 0, 0);
            sb[i] = 127; /* neutral: a column past N (zero weights) keeps the fast path */
            if (col_ok[i] && k0 < kend) {
                v[i] = __ldg((const uint4 *)(w + woff[i] +
                                             (FMT == FMT_FP8 ? k0 : FMT == FMT_FP4 ? k0 / 2 : 2 * k0)));
                if (FMT != FMT_BF16) sb[i] = __ldg(ws + soff[i] + k0 / 32);
            }
        }
    };
    uint4 wv[TILES], wnext[TILES];
    uint8_t sv[TILES], snext[TILES];
    load_w(wv, sv, kbeg + warp * CHUNK);
    if (known) bt_grid_begin();
    x += (size_t)e * io.x_group;
    y += (size_t)e * io.y_group;
    /* rows past mr read the last real row: their products land in accumulator rows that are
     * never stored, and the loads need neither predicates nor zeroed registers each chunk */
    const int ga = min(g, mr - 1), gb = min(g + 8, mr - 1);
    const __nv_bfloat16 *xa = x + (size_t)(rows ? rows[r0 + ga] : r0 + ga) * io.ldx;
    const __nv_bfloat16 *xb = x + (size_t)(rows ? rows[r0 + gb] : r0 + gb) * io.ldx;
    for (int k0 = kbeg + warp * CHUNK; k0 < kend; k0 += MT_WARPS * CHUNK) {
        const int kl = k0 + KW * c; /* this lane's first k */
        load_w(wnext, snext, k0 + MT_WARPS * CHUNK);
        uint4 xv[2][XW];
#pragma unroll
        for (int q = 0; q < XW; q++) {
            xv[0][q] = *(const uint4 *)(xa + kl + 8 * q);
            xv[1][q] = *(const uint4 *)(xb + kl + 8 * q);
        }
        const unsigned *xw0 = (const unsigned *)xv[0], *xw1 = (const unsigned *)xv[1];
        /* FAST: every scale of the warp's chunk takes the bf16 route (bt_fp4/fp8_scale_fast),
         * checked once */
        auto tiles = [&](auto fast_c) {
            [[maybe_unused]] constexpr bool FAST = decltype(fast_c)::value; /* (bf16: none) */
#pragma unroll
            for (int i = 0; i < TILES; i++) {
                /* the lane's KW weights as bf16 pairs: in k order (FP8, bf16), pair 4q + j the
                 * lane's k 2q + 8j (FP4) */
                unsigned bw[KW / 2];
                if constexpr (FMT == FMT_BF16) { /* already bf16 pairs in k order */
                    bw[0] = wv[i].x, bw[1] = wv[i].y, bw[2] = wv[i].z, bw[3] = wv[i].w;
                } else if constexpr (FMT == FMT_FP8 && FAST) {
                    const unsigned u[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
                    const __nv_bfloat162 s2 = fp8_scale2(sv[i]);
#pragma unroll
                    for (int j = 0; j < 8; j++) bw[j] = e4m3x2_to_bf16_scaled(u[j / 2] >> (16 * (j & 1)), s2);
                } else if constexpr (FMT == FMT_FP8) {
                    float f[16];
                    dequant_fp8x16(wv[i], bt_e8m0(sv[i]), f);
#pragma unroll
                    for (int j = 0; j < 8; j++) bw[j] = pack_bf16(f[2 * j], f[2 * j + 1]);
                } else {
                    const unsigned u[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
                    const __nv_bfloat162 s2 = fp4_scale2(sv[i]);
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        if (FAST)
                            fp4x8_to_bf16_fast(u[q], s2, bw + 4 * q);
                        else
                            fp4x8_to_bf16_scaled(u[q], sv[i], bw + 4 * q);
                    }
                }
#pragma unroll
                for (int st = 0; st < STEPS; st++) {
                    /* the rows' bf16 pairs of the weights' k: FP4's bw[2st], bw[2st + 1] are
                     * (fragment order) the pairs at k 2q + 16h and + 8 of the lane's 32, q =
                     * st / 2, h = st % 2: row words q + 8h and q + 8h + 4 */
                    const int p0 = FMT == FMT_FP4 ? st / 2 + 8 * (st % 2) : 2 * st;
                    const int p1 = FMT == FMT_FP4 ? p0 + 4 : 2 * st + 1;
                    const unsigned a[4] = {xw0[p0], xw1[p0], xw0[p1], xw1[p1]};
                    mma_bf16_16816(acc[i], a, bw[2 * st], bw[2 * st + 1]);
                }
            }
        };
        bool fast = true;
#pragma unroll
        for (int i = 0; i < TILES; i++)
            fast = fast && (FMT == FMT_FP4 ? bt_fp4_scale_fast(sv[i]) : bt_fp8_scale_fast(sv[i]));
        if (FMT == FMT_BF16 || __all_sync(0xffffffffu, fast))
            tiles(std::true_type());
        else
            tiles(std::false_type());
#pragma unroll
        for (int i = 0; i < TILES; i++) wv[i] = wnext[i], sv[i] = snext[i];
    }
    /* C fragment: (g, 2c..2c+1) and (g + 8, 2c..2c+1) of each 16 x 8 tile */
#pragma unroll
    for (int i = 0; i < TILES; i++) {
        red[warp][g][8 * i + 2 * c] = acc[i][0];
        red[warp][g][8 * i + 2 * c + 1] = acc[i][1];
        red[warp][g + 8][8 * i + 2 * c] = acc[i][2];
        red[warp][g + 8][8 * i + 2 * c + 1] = acc[i][3];
    }
    __syncthreads();
    if (ksplit > 1) {
        /* the block's sum over its warps into red[0] (each element by the thread that reads
         * it), then the cluster's first block adds the blocks' sums in rank order from their
         * shared memory: deterministic, no workspace */
        for (int o = threadIdx.x; o < 16 * COLS; o += MT_WARPS * 32) {
            int r = o / COLS, col = o % COLS;
            float v = 0.0f;
#pragma unroll
            for (int q = 0; q < MT_WARPS; q++) v += red[q][r][col];
            red[0][r][col] = v;
        }
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();
        if (split == 0) {
            for (int o = threadIdx.x; o < 16 * COLS; o += MT_WARPS * 32) {
                int r = o / COLS, col = o % COLS;
                if (r >= mr || n0 + col >= N) continue;
                float v = 0.0f;
                for (int q = 0; q < ksplit; q++)
                    v += cluster.map_shared_rank(&red[0][0][0], q)[r * (COLS + 1) + col];
                bt_st(y, (size_t)(r0 + r) * io.ldy + n0 + col, v);
            }
        }
        cluster.sync(); /* (the others' shared memory stays until it is read) */
        return;
    }
    for (int o = threadIdx.x; o < 16 * COLS; o += MT_WARPS * 32) {
        int r = o / COLS, col = o % COLS;
        if (r >= mr || n0 + col >= N) continue;
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < MT_WARPS; q++) v += red[q][r][col];
        bt_st(y, (size_t)(r0 + r) * io.ldy + n0 + col, v);
    }
}

/* ---- few rows, the weights as A: gemm_rows (FP4 experts, FP8 products) -------------------
 * The decode's products: a decode batch (or an expert's share of it: one or two rows at 16)
 * against e2m1 or e4m3 weights. gemm_mma16 with the roles swapped and its bookkeeping trimmed,
 * since here converting the weights is all the work there is: the weights are the m16n8k16
 * MMA's A (16 columns: this lane's g and g + 8), 8 rows its B. A lane takes 16 weight bytes of
 * each of its 2 * MT columns a chunk: 32 FP4 codes (chunks of 128 k, one scale a column; in
 * fragment order word q holds the lane's k 2q + 8j, j = 0..3, and MMA (q, h) takes its pairs
 * j = 2h, 2h + 1 as logical k 2c, 2c + 1, 2c + 8, 2c + 9) or 16 FP8 bytes (chunks of 64 k, pairs in
 * k order, one scale for the lane: a 32-column tile is one 32x32 scale block wide). Half of
 * gemm_mma16's MMAs, and the rows' loads for 8 rows, not 16.
 * - The weights and the rows of the next chunk are loaded before this one is converted (the
 *   rows come from L2: waiting for them each chunk was the FP4 kernel's largest stall), the
 *   weights into a second register set the chunks alternate with. The rows keep one set, read
 *   out at the chunk's start before the next rows are loaded into it: two sets taken in turn
 *   (3234d58) moved the FP4 products' waits from that read to the loop's first use of the
 *   loads and gained nothing (decode b1 0.1917 -> 0.1931 ms, b16 0.8375 -> 0.8352 on an H100,
 *   bench/RESULTS.md session 35), as two had lost for FP8 in session 14.
 * - A block walks `tiles` column tiles of its matrix, the next tile's first chunk loaded during
 *   the last one of the tile before: the chain of loads that starts a block (expert list,
 *   offsets, row indices, rows: ~2 us) was an eighth of a one-tile FP4 block's time.
 * - Loads need no predicates: columns past N read column N - 1 (never stored), and the
 *   prefetch past a warp's last chunk is skipped by a uniform branch.
 * - An expert of more than 8 rows takes a second pass (weights from L2) for rows 8..15: rare
 *   in a decode batch, and a pass for 8 rows holds half the registers of one for 16. An FP8
 *   product of 9..16 rows (R16) takes them in one pass, two MMAs a step: a second pass cost
 *   the 16-row [32768, 1280] product 0.025 -> 0.033 ms.
 * Tried and measured slower: also prefetching into L2 the weights one or two chunks past those
 * loaded into registers (cp.async.bulk.prefetch): the layer's decode 25-40% slower at batch 1
 * and 16 (bench/RESULTS.md, session 20); a dense product's blocks (those of the first wave, or
 * all) asking L2 for all their weights before the grid wait, so that they arrive while the
 * kernel before runs (787516d, here and in gemm_mma16): decode b1 0.193 -> 0.211 ms, the dense
 * products alone 0.108 -> 0.125 ms (session 35, an H100); a pass's rows copied once into
 * shared memory (all of K, bank-spread) and the registers they held given to a third set of
 * weights, one or two chunks ahead (gemm_rows_xs, c5c9e11, the same bits): FP4 experts b1
 * 0.200 -> 0.204 / 0.205 ms, b16 0.836 -> 0.866 / 0.875, FP8 products of one row b1 0.202
 * (session 36, an H100: the routed products alone 0.052 -> 0.058, so the rows' L2 reads were
 * not what held them). */
template <int FMT> struct rows_fmt {
    static constexpr int CHUNK = FMT == FMT_FP4 ? 128 : 64; /* k a warp's chunk */
    static constexpr int KW = CHUNK / 4;                    /* k a lane's chunk (16 bytes) */
    static constexpr int CHUNK_BYTES = CHUNK * (FMT == FMT_FP4 ? 1 : 2) / 2; /* 64 either way */
};

/* A gemm_rows lane's 16 weight bytes, read once (rows_lh picks LH): 2 as streaming data
 * (ld.global.cs: evicted first from L1 and L2); 1 cached in L2 only (ld.global.cg); 0 a
 * read-only load through L1 (__ldg, the form before). Tried because Nsight over the decode's FP4
 * experts at 16 tokens (bench/RESULTS.md, session 34) had 36% of the warps' stall samples on the
 * first use of the rows loaded a chunk ahead and few on the weights loaded beside them, the
 * weights streaming through L1 where the rows are read again. The same profile with 1 still has
 * them (Nsight runs each kernel alone, caches flushed), so where 2 gains in the graph, which
 * keeps everything else in L2 ahead of the weights, is not settled. On an H100, four rounds
 * each (graph, two streams): decode b1 0.1969 -> 0.1915 ms with 2 (attention projections 0.0847
 * -> 0.0829, routed FP4 0.0565 -> 0.0528), b16 0.8414 -> 0.8370 (attention projections 0.0985 ->
 * 0.0906); with 1, b1 0.1972, b16 0.8327. rows_lh picks the form, FP4's by the experts listed
 * (session 35). (Inline PTX with L1::no_allocate spilled 48 bytes in the FP4 instance; these
 * built-ins spill none.) */
template <int LH> __device__ __forceinline__ uint4 rows_weight_ld(const uint8_t *p)
{
    if constexpr (LH == 1)
        return __ldcg((const uint4 *)p);
    else if constexpr (LH == 2)
        return __ldcs((const uint4 *)p);
    else
        return __ldg((const uint4 *)p);
}

/* Warps that share a tile's K in gemm_rows (the block's warps in groups of ks, each group its own
 * tiles): chunk j of a tile goes to the group's warp j % ks. The most of 8, 4, 2 that divides the
 * tile's chunks, so no warp takes more of them than another: the FP4 w2's K of 2304 is 18
 * chunks, 3 for two of 8 warps and 2 for the others, where each tile waited on the slowest
 * (FP8: K 1280 and 2304 are 20 and 36 chunks of 64). A function of the format and K alone, so
 * a row's sums keep their order in any batch. */
static int rows_ks(int fmt, int K)
{
    static int forced = -1; /* BT_CUDA_ROWS_KS (8, 4, 2) overrides (comparisons) */
    static const int ks_allowed[] = {8, 4, 2};
    if (bt__env_choice("BT_CUDA_ROWS_KS", ks_allowed, 3, 0, &forced)) return forced;
    const int nch = K / (fmt == FMT_FP4 ? 128 : 64);
    if (nch % MT_WARPS == 0) return MT_WARPS;
    for (int ks = MT_WARPS / 2; ks >= 2; ks /= 2)
        if (nch % ks == 0) return ks;
    return MT_WARPS;
}

/* registers for 2 blocks an SM (FP4, whose conversion needs them; FP8 with 32 columns a tile
 * or 16 rows) or 3 (FP8, 16 columns, 8 rows: 80 registers; at 4 blocks an SM, 64, it spilled
 * 60 bytes) */
#define ROWS_MIN_BLOCKS(FMT, MT, R16) ((FMT) == FMT_FP4 || (MT) == 2 || (R16) ? 2 : 3)

/* What gemm_rows does with its sums besides storing them (EPI):
 * - ROWS_SWIGLU: the experts' w13 with their SwiGLU (bt_cuda_gemm_fp4_swiglu_list): block b
 *   walks gate columns 32b.. as tile 0 and the up columns N/2 + 32b.. as tile 1, one warp group
 *   (ks = 8), a thread one (row, column) of each tile's sums; it keeps tile 0's and stores
 *   h (swiglu_store, epi.sw) to y [rows, N/2] with tile 1's, where the plain form
 *   stores both sums for bt_cuda_swiglu to read back.
 * - ROWS_QFINISH: the index queries' RoPE and rounding (bt_cuda_gemm_fp8_qfinish, heads of
 *   epi.dim, a multiple of 32): a warp stores a row's 32 columns of a tile, one a lane, which is
 *   one rounding block of a head and whole channel pairs; the lanes rotate their pairs by
 *   shuffles (epi.pos[row], the last 2 * epi.half channels) and round the block (epi.fq_kind)
 *   as bt_cuda_head_finish does after the plain form's store. */
enum { ROWS_PLAIN, ROWS_SWIGLU, ROWS_QFINISH };

/* The merged w13 + SwiGLU forms' store (gemm_rows' ROWS_SWIGLU, gemm_fp4_wgrs' SW), with
 * bt_cuda_swiglu's arithmetic: h [rows, I] at (row, n) = wt[row] * bt_swiglu(gate, up, limit),
 * wt NULL: 1 */
struct swiglu_epi {
    const float *wt;
    float limit;
};
template <typename OT>
__device__ __forceinline__ void swiglu_store(OT *h, const swiglu_epi &e, size_t row, int I, int n,
                                             float gate, float up)
{
    const float v = bt_swiglu(gate, up, e.limit);
    bt_st(h, row * (size_t)I + n, e.wt ? e.wt[row] * v : v);
}

struct rows_epi {
    swiglu_epi sw;      /* ROWS_SWIGLU */
    const int64_t *pos; /* ROWS_QFINISH (NULL: no RoPE) */
    const float *inv_freq;
    int dim, half, fq_kind;
};

template <int FMT, int MT, bool R16, int LH, typename OT, int EPI = ROWS_PLAIN>
__global__ void __launch_bounds__(MT_WARPS * 32, ROWS_MIN_BLOCKS(FMT, MT, R16))
    gemm_rows(OT *y, const __nv_bfloat16 *x, const int32_t *rows, const int32_t *offs,
              const uint8_t *w, const uint8_t *ws, int M, int N, int K, const int32_t *elist,
              gemm_io io, int tiles, int ks, rows_epi epi)
{
    constexpr bool SW = EPI == ROWS_SWIGLU, QF = EPI == ROWS_QFINISH;
    static_assert(!SW || (FMT == FMT_FP4 && MT == 2 && !R16), "SwiGLU: FP4, 32-column tiles");
    static_assert(!QF || (FMT == FMT_FP8 && MT == 2 && std::is_same<OT, float>::value),
                  "query finish: FP8, 32-column tiles, f32 out");
    using F = rows_fmt<FMT>;
    constexpr bool FP4 = FMT == FMT_FP4;
    constexpr int NC = 2 * MT, COLS = 16 * MT; /* a lane's columns; a tile's */
    constexpr int NS = FP4 ? NC : 1;           /* a lane's scales a chunk */
    constexpr int XQ = F::KW / 8;              /* uint4 of a row a lane's chunk */
    constexpr int RP = R16 ? 2 : 1;            /* 8-row groups a pass */
    __shared__ float red[MT_WARPS][8 * RP][COLS + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int nb = blockIdx.x * (SW ? 1 : tiles) * COLS; /* the block's first column */
    if (!SW) tiles = min(tiles, (N - nb + COLS - 1) / COLS);
    /* tile t's first column */
    auto tile_n0 = [&](int t) { return SW ? nb + t * (N / 2) : nb + t * COLS; };
    /* weights known before the wait: a plain product's (no expert list, no offsets) */
    const bool known = !elist && !offs;
    if (!known) bt_grid_begin();
    const int e = elist ? elist[blockIdx.y] : blockIdx.y;
    if (e < 0) return; /* a padded slot of the expert list (the whole block) */
    const int r0 = offs ? offs[e] : 0, r1 = offs ? offs[e + 1] : M, mr = r1 - r0;
    if (mr <= 0) {
        if (known) bt_grid_begin();
        return;
    }
    expert_weights<FMT>(w, ws, e, N, K);
    x += (size_t)e * io.x_group;
    y += (size_t)e * io.y_group;
    /* the warp's group (its tiles: grp, grp + ngr, ...) and place in it (its chunks of a tile:
     * wi, wi + ks, ...) */
    const int grp = warp / ks, wi = warp % ks, ngr = MT_WARPS / ks;
    const int step = ks * F::CHUNK, step_bytes = ks * F::CHUNK_BYTES; /* between its chunks */
    const int k_first = wi * F::CHUNK + F::KW * c;                    /* this lane's first k */
    const int nw = (K / F::CHUNK - wi + ks - 1) / ks;                 /* the warp's chunks a tile */
    const int ks32 = (K + 31) / 32;

    /* this lane's column i of tile t (nb + t * COLS + 8i + g): woff[i] + kc is the offset of
     * the 16 weight bytes of the chunk to load. FP4: that over 16 is the offset of its scale
     * (K / 2 and the lane's first k / 2 are multiples of 16): one offset a column, not two, as
     * the 4-column instances ran out of registers. FP8: soff + kc / 32 is the lane's scale. */
    unsigned woff[NC], soff = 0, kc = 0;
    auto set_tile = [&](int t) {
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const unsigned n = (unsigned)min(tile_n0(t) + 8 * i + g, N - 1);
            woff[i] = FP4 ? n * (unsigned)(K / 2) + k_first / 2 : n * (unsigned)K + k_first;
        }
        if (!FP4) soff = (unsigned)(min(tile_n0(t), N - 1) / 32 * ks32 + k_first / 32);
        kc = 0;
    };
    auto load_w = [&](uint4 *v, uint8_t *s) {
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const unsigned o = woff[i] + kc;
            v[i] = rows_weight_ld<LH>(w + o);
            if (FP4) s[i] = __ldg(ws + (o >> 4));
        }
        if (!FP4) s[0] = __ldg(ws + soff + kc / 32);
        kc += step_bytes;
    };
    /* this lane's rows (g, and g + 8 when R16): where their first k lies, where the next
     * chunk's, and that chunk's bf16 as loaded */
    const __nv_bfloat16 *xrow[RP], *xp[RP];
    uint4 xr[RP][XQ];
    auto load_x = [&]() {
#pragma unroll
        for (int r = 0; r < RP; r++) {
#pragma unroll
            for (int q = 0; q < XQ; q++)
                xr[r][q] = *(const uint4 *)(xp[r] + 8 * q);
            xp[r] += step;
        }
    };
    uint4 wa[NC], wb[NC];
    uint8_t sa[NS], sb[NS];
    float acc[RP][MT][4];
    int t = grp; /* the tile being walked */

    enum { LAST, NEXT_CHUNK, NEXT_TILE }; /* what a chunk loads for the next one */
    /* one chunk from wc/sc and xr; the next one's weights into wn/sn and its rows into xr
     * (once they are in xw here) */
    auto chunk = [&](const uint4 *wc, const uint8_t *sc, uint4 *wn, uint8_t *sn, int next) {
        if (next == NEXT_TILE) {
            set_tile(t + ngr);
#pragma unroll
            for (int r = 0; r < RP; r++)
                xp[r] = xrow[r];
        }
        if (next != LAST) load_w(wn, sn);
        /* the rows' bf16 pairs, in k order (FP4's fragment order needs no re-pairing) */
        unsigned xw[RP][4 * XQ];
#pragma unroll
        for (int r = 0; r < RP; r++) {
#pragma unroll
            for (int q = 0; q < XQ; q++) {
                const uint4 v = xr[r][q];
                xw[r][4 * q] = v.x, xw[r][4 * q + 1] = v.y;
                xw[r][4 * q + 2] = v.z, xw[r][4 * q + 3] = v.w;
            }
        }
        if (next != LAST) load_x();
        bool fast = true;
#pragma unroll
        for (int i = 0; i < NS; i++)
            fast = fast && (FP4 ? bt_fp4_scale_fast(sc[i]) : bt_fp8_scale_fast(sc[i]));
        auto mmas = [&](auto fast_c) {
            constexpr bool FAST = decltype(fast_c)::value;
#pragma unroll
            for (int tt = 0; tt < MT; tt++) {
                const uint4 va = wc[2 * tt], vb = wc[2 * tt + 1];
                const unsigned ua[4] = {va.x, va.y, va.z, va.w}, ub[4] = {vb.x, vb.y, vb.z, vb.w};
                /* word q of columns g and g + 8: FP4 pairs of the lane's k 2q + 8j, j = 0..3
                 * (MMAs 2q, 2q + 1: j = 2h, 2h + 1), FP8 pairs 2q, 2q + 1 (MMA q) */
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    unsigned ba[4], bb[4];
                    if constexpr (FP4) {
                        if (FAST) {
                            fp4x8_to_bf16_fast(ua[q], fp4_scale2(sc[2 * tt]), ba);
                            fp4x8_to_bf16_fast(ub[q], fp4_scale2(sc[2 * tt + 1]), bb);
                        } else {
                            fp4x8_to_bf16_scaled(ua[q], sc[2 * tt], ba);
                            fp4x8_to_bf16_scaled(ub[q], sc[2 * tt + 1], bb);
                        }
                    } else if (FAST) {
                        const __nv_bfloat162 s2 = fp8_scale2(sc[0]);
                        ba[0] = e4m3x2_to_bf16_scaled(ua[q], s2);
                        ba[1] = e4m3x2_to_bf16_scaled(ua[q] >> 16, s2);
                        bb[0] = e4m3x2_to_bf16_scaled(ub[q], s2);
                        bb[1] = e4m3x2_to_bf16_scaled(ub[q] >> 16, s2);
                    } else {
                        const float s = bt_e8m0(sc[0]);
                        ba[0] = e4m3x2_to_bf16_f32(ua[q], s);
                        ba[1] = e4m3x2_to_bf16_f32(ua[q] >> 16, s);
                        bb[0] = e4m3x2_to_bf16_f32(ub[q], s);
                        bb[1] = e4m3x2_to_bf16_f32(ub[q] >> 16, s);
                    }
#pragma unroll
                    for (int h = 0; h < (FP4 ? 2 : 1); h++) {
                        const unsigned a[4] = {ba[2 * h], bb[2 * h], ba[2 * h + 1], bb[2 * h + 1]};
                        /* the rows' pairs of the same k: FP4 words q + 8h and q + 8h + 4 */
                        const int p0 = FP4 ? q + 8 * h : 2 * q, p1 = FP4 ? p0 + 4 : p0 + 1;
#pragma unroll
                        for (int r = 0; r < RP; r++)
                            mma_bf16_16816(acc[r][tt], a, xw[r][p0], xw[r][p1]);
                    }
                }
            }
        };
        if (__all_sync(0xffffffffu, fast))
            mmas(std::true_type());
        else
            mmas(std::false_type());
    };
    /* tile t's sums over the group's warps, stored; the accumulators zeroed for the next one.
     * Every warp of a group comes here for each of the group's tiles a pass, the same barriers
     * (the group's own) in the same order. */
    auto group_sync = [&]() {
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + grp), "r"(ks * 32) : "memory");
    };
    float sw_gate = 0.0f; /* ROWS_SWIGLU: this thread's sum of tile 0 */
    auto flush = [&](int rb) {
#pragma unroll
        for (int r = 0; r < RP; r++) {
#pragma unroll
            for (int tt = 0; tt < MT; tt++) { /* C: column 16tt + g (+ 8), rows 2c, 2c + 1 */
                red[warp][8 * r + 2 * c][16 * tt + g] = acc[r][tt][0];
                red[warp][8 * r + 2 * c + 1][16 * tt + g] = acc[r][tt][1];
                red[warp][8 * r + 2 * c][16 * tt + g + 8] = acc[r][tt][2];
                red[warp][8 * r + 2 * c + 1][16 * tt + g + 8] = acc[r][tt][3];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[r][tt][j] = 0.0f;
            }
        }
        group_sync();
        if constexpr (SW) { /* (8 rows x 32 columns: the block's 256 threads, one each) */
            const int r = threadIdx.x / COLS, col = threadIdx.x % COLS;
            float v = 0.0f;
            for (int q = 0; q < MT_WARPS; q++)
                v += red[q][r][col];
            if (t == 0) {
                sw_gate = v;
            } else if (rb + r < mr) {
                swiglu_store(y, epi.sw, (size_t)(r0 + rb + r), N / 2, nb + col, sw_gate, v);
            }
        } else if constexpr (QF) { /* (a warp a row: col is the lane) */
            for (int o = wi * 32 + lane; o < 8 * RP * COLS; o += ks * 32) {
                const int r = o / COLS, col = o % COLS, n = tile_n0(t) + col;
                if (rb + r >= mr) continue; /* (the whole warp) */
                float v = 0.0f;
                for (int q = grp * ks; q < grp * ks + ks; q++)
                    v += red[q][r][col];
                const int row = r0 + rb + r, d = n % epi.dim, r0c = epi.dim - 2 * epi.half;
                if (epi.pos) { /* the pair (d & ~1, d | 1), both lanes alike */
                    const float other = __shfl_xor_sync(0xffffffffu, v, 1);
                    if ((d & ~1) >= r0c) {
                        float e = d & 1 ? other : v, od = d & 1 ? v : other;
                        bt_dev_rope_pair(e, od,
                                         epi.inv_freq[((d & ~1) - r0c) >> 1] * (float)epi.pos[row]);
                        v = d & 1 ? od : e;
                    }
                }
                bt_st(y, (size_t)row * io.ldy + n, bt_dev_fake_quant_lane32(v, epi.fq_kind));
            }
        } else {
            for (int o = wi * 32 + lane; o < 8 * RP * COLS; o += ks * 32) {
                const int r = o / COLS, col = o % COLS, n = tile_n0(t) + col;
                if (rb + r >= mr || n >= N) continue;
                float v = 0.0f;
                for (int q = grp * ks; q < grp * ks + ks; q++)
                    v += red[q][r][col];
                bt_st(y, (size_t)(r0 + rb + r) * io.ldy + n, v);
            }
        }
        group_sync();
        t += ngr;
    };
    /* rows rb..rb + 8 * RP - 1: the warp's chunks of all its tiles as one sequence, two a turn
     * through the two sets of weight registers */
    for (int rb = 0; rb < mr; rb += 8 * RP) {
        t = grp;
        set_tile(t);
        if (nw > 0) load_w(wa, sa);
        if (known && rb == 0) bt_grid_begin(); /* (the rows and row indices come after it) */
#pragma unroll
        for (int r = 0; r < RP; r++) { /* rows past mr read the last real row (never stored) */
            const int gr = min(rb + 8 * r + g, mr - 1);
            xp[r] = xrow[r] = x + (size_t)(rows ? rows[r0 + gr] : r0 + gr) * io.ldx + k_first;
#pragma unroll
            for (int tt = 0; tt < MT; tt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[r][tt][j] = 0.0f;
        }
        if (nw > 0) load_x();
        if (nw == 0) { /* K too short for this warp: nothing to add, barriers to keep */
            while (t < tiles)
                flush(rb);
            continue;
        }
        int tj = 0; /* the chunk's index in its tile */
        /* what the chunk loads for the next one; then the tile's end when it was its last */
        auto next = [&]() { return tj + 1 < nw ? NEXT_CHUNK : t + ngr < tiles ? NEXT_TILE : LAST; };
        auto done = [&]() {
            if (++tj == nw) {
                tj = 0;
                flush(rb);
            }
        };
        while (t < tiles) {
            chunk(wa, sa, wb, sb, next());
            done();
            if (t >= tiles) break;
            chunk(wb, sb, wa, sa, next());
            done();
        }
    }
}

/* ---- many rows of FP4 experts on the tensor cores ------------------------------------------
 * A prefill's routed experts: an expert's rows (about 64 at 4096 tokens) against its weights.
 * A block takes 64 rows x 128 columns; each of its 4 warps 64 rows x 32 columns (4 x 4
 * m16n8k16 tiles), so every B fragment a warp dequantizes serves four A tiles. K goes in
 * chunks of 128 through a 3-stage cp.async pipeline into shared memory: the rows' bf16
 * (gathered), the columns' packed e2m1 bytes and their scales, all still as stored. Each lane
 * then reads its operands with 16-byte loads in the permuted k order of gemm_mma16 (lane c:
 * 32 contiguous k, 16 weight bytes, one scale) and dequantizes B in registers: the rows' octet
 * q of the lane's 32 k meets pair q of each of its 4 weight words (fragment order). The shared rows
 * are swizzled (16-byte unit u of row r at u ^ 2 * bit3(u) ^ (r & 1)) so that a quarter warp's
 * eight loads hit all 32 banks; the weight bytes are conflict-free as they lie. */
enum { FT_ROWS = 64, FT_COLS = 128, FT_WARPS = 4, FT_CHUNK = 128, FT_UNITS = FT_CHUNK / 8,
       FT_STAGES = 3 };
enum { FT_A_UNITS = FT_ROWS * FT_UNITS, FT_B_UNITS = FT_COLS * (FT_CHUNK / 32),
       FT_STAGE_BYTES = 16 * (FT_A_UNITS + FT_B_UNITS) + 4 * FT_COLS,
       FT_SMEM = FT_STAGES * FT_STAGE_BYTES };

__device__ __forceinline__ int ft_unit(int row, int u) { return u ^ ((u >> 3 & 1) << 1) ^ (row & 1); }

/* registers for 3 blocks an SM (168): 2 blocks (193 registers, none spilled) measured 5%
 * slower on the prefill's experts */
template <typename OT>
__global__ void __launch_bounds__(FT_WARPS * 32, 3) gemm_fp4_tiles(OT *y, const __nv_bfloat16 *x,
                                                                    const int32_t *rows,
                                                                    const int32_t *offs,
                                                                    const uint8_t *w,
                                                                    const uint8_t *ws, int N,
                                                                    int K, const int32_t *elist)
{
    bt_grid_begin();
    extern __shared__ __align__(16) unsigned char ft_smem[];
    __shared__ const __nv_bfloat16 *arow[FT_ROWS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int e = elist ? elist[blockIdx.z] : blockIdx.z;
    if (e < 0) return; /* a padded slot of the expert list (the whole block) */
    const int r0 = offs[e], m0 = r0 + blockIdx.y * FT_ROWS, r1 = offs[e + 1];
    if (m0 >= r1) return; /* the whole block */
    const int mr = min(FT_ROWS, r1 - m0), n0 = blockIdx.x * FT_COLS;
    w += (size_t)e * N * (K / 2);
    ws += (size_t)e * N * (K / 32);
    /* the rows' sources, resolved once (in shared memory: registers are the scarcer) */
    if (tid < FT_ROWS)
        arow[tid] = tid < mr ? x + (size_t)(rows ? rows[m0 + tid] : m0 + tid) * K : x;
    __syncthreads();

    auto stage_a = [&](int st) { return (uint4 *)(ft_smem + st * FT_STAGE_BYTES); };
    auto stage_b = [&](int st) { return stage_a(st) + FT_A_UNITS; };
    auto stage_s = [&](int st) { return (uint32_t *)(stage_b(st) + FT_B_UNITS); };
    /* a chunk's loads: per thread 8 row units (rows tid/16 + 8j, unit tid % 16), 4 weight
     * units (columns tid/4 + 32j, unit tid % 4: four threads read a column's 64 bytes) and one
     * column's 4 scale bytes */
    auto load = [&](int ch) {
        const int st = ch % FT_STAGES, k0 = ch * FT_CHUNK;
        uint4 *sa = stage_a(st), *sb = stage_b(st);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int r = tid / FT_UNITS + 8 * j, u = tid % FT_UNITS;
            cp_async<16>(&sa[r * FT_UNITS + ft_unit(r, u)], arow[r] + k0 + 8 * u, r < mr);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int col = tid / 4 + 32 * j, n = n0 + col;
            const uint8_t *src = w + (size_t)(n < N ? n : 0) * (K / 2) + k0 / 2 + 16 * (tid % 4);
            cp_async<16>(&sb[col * 4 + tid % 4], src, n < N);
        }
        const int n = n0 + tid;
        cp_async<4>(&stage_s(st)[tid], ws + (size_t)(n < N ? n : 0) * (K / 32) + k0 / 32, n < N);
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int t = 0; t < 4; t++) acc[i][j][t] = 0.0f;

    const int chunks = K / FT_CHUNK;
#pragma unroll
    for (int ch = 0; ch < FT_STAGES - 1; ch++) {
        if (ch < chunks) load(ch);
        cp_async_commit();
    }
    for (int ch = 0; ch < chunks; ch++) {
        /* chunk ch has landed once at most the newest group is pending */
        asm volatile("cp.async.wait_group %0;\n" ::"n"(FT_STAGES - 2));
        __syncthreads(); /* ... for every thread; and the stage refilled next is read by none */
        if (ch + FT_STAGES - 1 < chunks) load(ch + FT_STAGES - 1);
        cp_async_commit(); /* (empty past the end: keeps the count) */

        const int st = ch % FT_STAGES;
        const uint4 *sa = stage_a(st), *sb = stage_b(st);
        uint4 wv[4];
        uint8_t sv[4];
        bool fast = true;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int col = 32 * warp + 8 * j + g;
            wv[j] = sb[col * 4 + c];
            sv[j] = (uint8_t)(stage_s(st)[col] >> (8 * c)); /* 0 past N: the slow path there */
            fast = fast && bt_fp4_scale_fast(sv[j]);
        }
        /* FAST: every scale of the warp's chunk converts in bf16, checked once, so the chunk is
         * one branch-free block in which the conversions and the MMAs interleave */
        auto chunk = [&](auto fast_c, auto mt_c) {
            constexpr bool FAST = decltype(fast_c)::value;
            constexpr int MT = decltype(mt_c)::value; /* row tiles holding rows */
            __nv_bfloat162 s2[4];
#pragma unroll
            for (int j = 0; j < 4; j++) s2[j] = fp4_scale2(sv[j]);
#pragma unroll
            for (int q = 0; q < 4; q++) { /* k 32c + 8q .. +8 of the lane: steps 2q, 2q+1 */
                /* the warp's four B fragments for both steps: the pairs of k 32c + 8q + 2p, p =
                 * 0..3, are (fragment order) pair q of word p */
                unsigned b[4][4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const unsigned u[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
#pragma unroll
                    for (int p = 0; p < 4; p++) {
                        const unsigned pr = bt_e2m1_spread_pair(u[p], q);
                        b[j][p] = FAST ? bf16x2_mul(pr, s2[j]) : fp4x2_scaled_slow(pr, sv[j]);
                    }
                }
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    const int r = 16 * i + g;
                    const uint4 lo = sa[r * FT_UNITS + ft_unit(r, 4 * c + q)];
                    const uint4 hi = sa[(r + 8) * FT_UNITS + ft_unit(r + 8, 4 * c + q)];
                    const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
                    const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
                    /* the four tiles' first steps, then their second: no MMA waits on the
                     * one just issued */
#pragma unroll
                    for (int j = 0; j < 4; j++) mma_bf16_16816(acc[i][j], a0, b[j][0], b[j][1]);
#pragma unroll
                    for (int j = 0; j < 4; j++) mma_bf16_16816(acc[i][j], a1, b[j][2], b[j][3]);
                }
            }
        };
        /* a tile of <= 32 rows (an expert's last, mostly) skips the MMAs of its empty half */
        using four = std::integral_constant<int, 4>;
        using two = std::integral_constant<int, 2>;
        if (__all_sync(0xffffffffu, fast)) {
            if (mr > 32)
                chunk(std::true_type(), four());
            else
                chunk(std::true_type(), two());
        } else {
            chunk(std::false_type(), four());
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    /* C fragment of tile (i, j): rows 16i + g (+8), columns 8j + 2c, +1 */
    const int nw = n0 + 32 * warp;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int t = 0; t < 4; t++) {
                int r = 16 * i + g + 8 * (t >> 1), n = nw + 8 * j + 2 * c + (t & 1);
                if (r < mr && n < N) bt_st(y, (size_t)(m0 + r) * N + n, acc[i][j][t]);
            }
}

/* gemm_fp4_tiles' shared memory is over the 48 KB default (refused: the caller takes the
 * other kernel) */
static bool ft_smem_ready(void)
{
    static signed char bf16_out[BT__MAX_DEVICES], f32_out[BT__MAX_DEVICES];
    return bt__smem_allowed((const void *)gemm_fp4_tiles<__nv_bfloat16>, FT_SMEM, bf16_out) &&
           bt__smem_allowed((const void *)gemm_fp4_tiles<float>, FT_SMEM, f32_out);
}

/* ---- many rows of FP4 experts on warpgroup MMAs, the weights in registers (Hopper) ---------
 * The prefill's routed experts again, on wgmma (sm_90a) with the weights as A, from registers:
 * a block's two warpgroups take 64 weight columns each (the output's columns), the expert's
 * rows (up to 112, the output's rows) are B in shared memory, shared by both. Each thread
 * dequantizes its own A fragments from the packed bytes straight into registers, once per block,
 * so a weight is converted once for all of an expert's rows (gemm_fp4_tiles converts it again
 * for each 64 rows, and its mma.sync products take an instruction each); nothing waits on a
 * barrier between the conversions and the products, which run asynchronously while the next
 * chunk is converted. (Session 7's gemm_fp4_wgmma put the dequantized weights in shared memory
 * as B and lost to gemm_fp4_tiles: two barriers a chunk.) The MMA's N is the tile's rows
 * rounded up to 16, picked per block, so an expert of 70 rows multiplies 80, not 112.
 * K goes in chunks of 64 through a cp.async pipeline of 5..8 stages (rs_stage), all but two
 * chunks ahead: the rows' bf16 (gathered, 128-byte swizzled), the columns' packed bytes, and
 * with every other chunk their scales of its 128 k as stored.
 * Both operands take k in natural order: a thread's A pairs of a 32-k run (k 2c + 8t, + 1) are
 * word c of the run in fragment order, converted a word's 4 pairs in 8 operations and 4
 * multiplies (the checkpoint order, where they are byte c of four words, took 6 a pair). Two blocks
 * an SM (128 registers): with one, two warps a scheduler left the conversions' latencies bare.
 * Tried and measured slower: each row one tensor-memory-accelerator copy (the 128-byte swizzle
 * applied by the copy engine, one row a thread) in place of eight cp.async a row: 0.63 -> 1.12 ms
 * for [4608, 5120] x 64 experts x 64 rows; 3 stages of 128 k (half the barriers and copy
 * bookkeeping a k): the layer's 4096-token prefill 11.04 ms against 10.98 (bench/RESULTS.md,
 * session 20); each column's weights 8 chunks ahead asked of L2 (c41b3f8): experts 5.90 ->
 * 7.38 ms; warp-specialized, a copier warpgroup feeding three through mbarriers in a 9-stage
 * ring, one block an SM (1794168): 5.90 -> 6.53 ms (session 27, an H100); blocks of 4
 * warpgroups, 256 columns and one block an SM, each chunk of an expert's rows read from L2 once
 * for twice the columns (e59165a; the profile had L2 69% busy against DRAM 51%): the prefill
 * layer's experts part 5.92 -> 6.08 ms, slower in each of five rounds (session 34, an H200). */
enum {
    RS_COLS = 128,
    RS_ROWS = 112,
    RS_CHUNK = 64,
    RS_STEPS = RS_CHUNK / 16,
    RS_THREADS = 256,
    RS_BLOCKS_PER_SM = 2,
    RS_W_BYTES = RS_COLS * RS_CHUNK / 2,
    /* two blocks' dynamic shared memory, their static 896 bytes and the 1 KB a block the
     * system keeps within an SM's 228 KB */
    RS_SMEM = 110 * 1024,
    RS_MAX_STAGES = 8
};
static_assert(RS_BLOCKS_PER_SM * (RS_SMEM + RS_ROWS * (int)sizeof(void *) + 1024) <= 228 * 1024,
              "two blocks an SM (Hopper: 228 KB of shared memory an SM, 1 KB a block reserved)");

/* A stage holds a chunk's NT rows (128 bytes of k a row, 1024-byte aligned for the swizzle),
 * the columns' packed bytes and, with every other chunk, their scales. Stages are sized by the
 * tile's rows, so a smaller tile keeps more chunks in flight in the same shared memory: the
 * Nsight samples of the 4-stage form (bench/RESULTS.md, session 33) had its warps waiting for
 * the copies (long scoreboard) or on each other at the chunk's barrier 40% of the time; with
 * as many stages as fit, the prefill layer's experts part took 5.90-5.96 ms where 4 stages
 * took 6.06-6.09 (seven rounds each, an H100). */
template <int NT> struct rs_stage {
    static constexpr int X_BYTES = NT * 128, S_OFF = X_BYTES + RS_W_BYTES;
    static constexpr int BYTES = (S_OFF + 4 * RS_COLS + 1023) / 1024 * 1024;
    static constexpr int FIT = (RS_SMEM - 1024) / BYTES; /* (1024: alignment) */
    static constexpr int DEEP = FIT < RS_MAX_STAGES ? FIT : RS_MAX_STAGES;
};

#ifdef BT_WGMMA
__device__ int wgrs_built = 1;
#else
__device__ int wgrs_built = 0;
#endif

/* whether all four scale bytes of s lie in 8..127 (bt_fp4_scale_fast, but for 128, which takes
 * the slow path): per byte, bit 7 of b + 0x78 is set from 8 on and that of b clear below 128.
 * A byte that carries into the next (b >= 0x88) fails itself, whatever the carry does. */
__device__ __forceinline__ uint32_t fp4_scales_fast4(uint32_t s)
{
    return (s + 0x78787878u) & ~s & 0x80808080u;
}

/* BT_CUDA_WGRS=0 keeps gemm_fp4_tiles (for comparisons), read once */
static bool wgrs_on(void)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_WGRS", &once);
}

template <int NT, int ST, bool SW, typename OT>
__device__ __forceinline__ void wgrs_tile(OT *y, const uint8_t *w, const uint8_t *ws, int N, int K,
                                          int m0, int mr, int n0, unsigned char *smem,
                                          const __nv_bfloat16 *const *arow, swiglu_epi epi)
{
#ifdef BT_WGMMA
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int f = 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + g; /* columns f and f + 8 */
    /* SW (w13, N = 2I, gate rows then up rows): the block's 128 weight rows in shared memory
     * are the gate rows of units n0 / 2 .. + 63, then the up rows of the same units; a thread's
     * two fragment rows (its output columns f and f + 8) take the gate and the up row of one
     * unit u, so its own sums pair up for the SwiGLU. The weights are A from registers,
     * converted by the thread itself: which rows it converts is free. (Each sum is the plain
     * form's: the same products in the same order.) */
    const int u = 32 * (tid >> 7) + 8 * ((tid >> 5) & 3) + g;
    const int fl = SW ? u : f, fh = SW ? 64 + u : f + 8; /* the shared rows of f, f + 8 */
    /* the weight row shared row i holds, and whether it is one */
    auto w_row = [&](int i) { return SW ? (i < 64 ? 0 : N / 2) + n0 / 2 + (i & 63) : n0 + i; };
    auto w_row_ok = [&](int i) { return SW ? n0 / 2 + (i & 63) < N / 2 : n0 + i < N; };
    using SG = rs_stage<NT>;
    constexpr int COLS = RS_COLS, THREADS = RS_THREADS;
    static_assert(ST >= 3 && ST <= SG::FIT, "stages: 2 chunks in flight at least, in RS_SMEM");
    auto stage = [&](int ch) { return smem + (ch % ST) * SG::BYTES; };
    /* What does not change from chunk to chunk (shared addresses, the rows', weights' and
     * scales' sources) is computed once. */
    static_assert(RS_CHUNK == 64 && COLS * 2 == THREADS,
                  "one row unit and one weight unit a thread");
    constexpr int RJ = THREADS / 8; /* rows a round of the rows' copies */
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t x_dst = wg_sw(tid >> 3, tid & 7); /* + 128 RJ j: row tid / 8 + RJ j */
    const bool wn_ok = w_row_ok(tid >> 1), sn_ok = w_row_ok(tid);
    const uint8_t *w_src = w + (size_t)(wn_ok ? w_row(tid >> 1) : 0) * (K / 2) + 16 * (tid & 1);
    const uint8_t *s_src = ws + (size_t)(sn_ok ? w_row(tid) : 0) * (K / 32);
    constexpr int XU = NT * RS_CHUNK / 8, XJ = (XU + THREADS - 1) / THREADS;
    /* the rows' sources in registers: read from shared memory at every chunk, each copy's
     * address waited on that load */
    const __nv_bfloat16 *x_src[XJ];
#pragma unroll
    for (int j = 0; j < XJ; j++) {
        const int r = (tid >> 3) + RJ * j;
        x_src[j] = arow[r < NT ? r : 0] + 8 * (tid & 7);
    }
    /* a chunk's copies: the tile's NT rows (8 units a 64-k half, 8 neighbouring threads a row's
     * 128 bytes), the columns' packed bytes (RS_CHUNK / 32 threads a column), and, with the
     * first chunk of each 128 k, each column's 4 scale bytes of those 128 k */
    auto load = [&](int ch, auto first_c) {
        const uint32_t sx = sbase + (ch % ST) * SG::BYTES;
        const int k0 = ch * RS_CHUNK;
#pragma unroll
        for (int j = 0; j < XJ; j++) {
            const int r = (tid >> 3) + RJ * j;
            if (XU % THREADS == 0 || r < NT)
                cp_async_sh<16>(sx + x_dst + 128 * RJ * j, x_src[j] + k0, r < mr);
        }
        cp_async_sh<16>(sx + SG::X_BYTES + 16 * tid, w_src + k0 / 2, wn_ok);
        if (decltype(first_c)::value && tid < COLS)
            cp_async_sh<4>(sx + SG::S_OFF + 4 * tid, s_src + k0 / 128 * 4, sn_ok);
    };
    static_assert(RS_CHUNK * 2 == 128, "two chunks a 128-k scale word, read with the first");

    float d[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; i++)
        d[i] = 0.0f;
    /* A fragments of two chunks: one converted while the other multiplies */
    unsigned a[2][RS_STEPS][4];
    const int chunks = K / RS_CHUNK;
#pragma unroll
    for (int ch = 0; ch < ST - 2; ch++) {
        if (ch < chunks) {
            if (ch % 2 == 0)
                load(ch, std::true_type());
            else
                load(ch, std::false_type());
        }
        cp_async_commit();
    }
    bool fast = false;
    /* the 128 k's scale words of columns f and f + 8 (shared rows fl, fh), read with its first
     * chunk; fast, each byte plus 126 (bt_fp4_scale_bf16's exponent, no carry between bytes
     * 8..127) */
    uint32_t s_lo = 0, s_hi = 0;
    /* chunk ch: FIRST, the first of its 128 k (ch even) */
    auto step = [&](int ch, unsigned(*A)[4], auto first_c) {
        constexpr bool FIRST = decltype(first_c)::value;
        /* chunk ch has landed (this thread's copies; the barrier: everyone's), and every
         * warpgroup's products of chunk ch - 2 are done (the last step's wgmma_wait<1>), so
         * its stage takes chunk ch + ST - 2 (chunk ch - 1's may still be read) */
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 3));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (ch + ST - 2 < chunks) { /* chunk ch + ST - 2: the first of its 128 k if even */
            if (FIRST == (ST % 2 == 0))
                load(ch + ST - 2, std::true_type());
            else
                load(ch + ST - 2, std::false_type());
        }
        cp_async_commit(); /* (empty past the end: keeps the count) */
        const unsigned char *sx = stage(ch);
        const uint4 *sw = (const uint4 *)(sx + SG::X_BYTES);
        if (FIRST) {
            s_lo = ((const uint32_t *)(sx + SG::S_OFF))[fl];
            s_hi = ((const uint32_t *)(sx + SG::S_OFF))[fh];
            fast = __all_sync(0xffffffffu,
                              (fp4_scales_fast4(s_lo) & fp4_scales_fast4(s_hi)) == 0x80808080u);
            if (fast) {
                s_lo += 0x7e7e7e7eu;
                s_hi += 0x7e7e7e7eu;
            }
        }
        constexpr int UNITS = RS_CHUNK / 32;
        constexpr int sb0 = FIRST ? 0 : UNITS; /* the chunk's first scale byte */
        auto convert = [&](auto fast_c) {
            constexpr bool FAST = decltype(fast_c)::value;
#pragma unroll
            for (int q = 0; q < UNITS; q++) { /* k 32q .. 32q + 31: steps 2q, 2q + 1 */
                /* word c of the run: (fragment order) this lane's pairs, k 2c + 8t */
                const unsigned wl = ((const uint32_t *)(sw + UNITS * fl + q))[c];
                const unsigned wh = ((const uint32_t *)(sw + UNITS * fh + q))[c];
                __nv_bfloat162 s2l, s2h;
                uint8_t sl = 0, sh = 0;
                if (FAST) { /* bt_fp4_scale_bf16 of byte sb0 + q, the 126 added above */
                    const int b = sb0 + q; /* (a constant once unrolled) */
                    const unsigned el = (b ? s_lo >> (8 * b - 7) : s_lo << 7) & 0x7f80u,
                                   eh = (b ? s_hi >> (8 * b - 7) : s_hi << 7) & 0x7f80u;
                    s2l = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)el),
                                             __ushort_as_bfloat16((unsigned short)el));
                    s2h = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)eh),
                                             __ushort_as_bfloat16((unsigned short)eh));
                } else {
                    sl = (uint8_t)(s_lo >> 8 * (sb0 + q));
                    sh = (uint8_t)(s_hi >> 8 * (sb0 + q));
                }
#pragma unroll
                for (int t = 0; t < 4; t++) { /* step 2q + (t >> 1), fragment words 0, 2 */
                    unsigned pl = bt_e2m1_spread_pair(wl, t);
                    unsigned ph = bt_e2m1_spread_pair(wh, t);
                    if (FAST) {
                        pl = bf16x2_mul(pl, s2l);
                        ph = bf16x2_mul(ph, s2h);
                    } else {
                        pl = fp4x2_scaled_slow(pl, sl);
                        ph = fp4x2_scaled_slow(ph, sh);
                    }
                    A[2 * q + (t >> 1)][2 * (t & 1)] = pl;
                    A[2 * q + (t >> 1)][2 * (t & 1) + 1] = ph;
                }
            }
        };
        if (fast) {
            convert(std::true_type());
        } else {
            /* (kept from being computed ahead of the branch, for the fast path's registers) */
            asm volatile("" : "+r"(s_lo), "+r"(s_hi));
            convert(std::false_type());
        }
        wgmma_fence();
        const uint64_t desc = wg_desc(sx); /* (a step's 32 bytes: 2 in the address field) */
#pragma unroll
        for (int s = 0; s < RS_STEPS; s++)
            wgmma_rs<NT>(d, A[s], desc + s * 2);
        wgmma_commit();
        wgmma_wait<1>(); /* chunk ch - 1's products: done */
    };
    for (int ch = 0; ch < chunks; ch += 2) {
        step(ch, a[0], std::true_type());
        if (ch + 1 < chunks) step(ch + 1, a[1], std::false_type());
    }
    wgmma_wait<0>();
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int i = 0; i < NT / 2; i++) { /* (read after the wait) */
        asm volatile("" : "+f"(d[i])::"memory");
    }
    /* d[4j + t]: column f + 8 (t >> 1), row 8j + 2c + (t & 1) */
    if constexpr (SW) { /* (bt_cuda_swiglu's arithmetic on the same sums) */
        const int n = n0 / 2 + u;
#pragma unroll
        for (int j = 0; j < NT / 8; j++)
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int r = 8 * j + 2 * c + t;
                if (r < mr && n < N / 2)
                    swiglu_store(y, epi, (size_t)(m0 + r), N / 2, n, d[4 * j + t],
                                 d[4 * j + 2 + t]);
            }
    } else {
#pragma unroll
        for (int j = 0; j < NT / 8; j++)
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int r = 8 * j + 2 * c + (t & 1), n = n0 + f + 8 * (t >> 1);
                if (r < mr && n < N) bt_st(y, (size_t)(m0 + r) * N + n, d[4 * j + t]);
            }
    }
#endif
}

template <typename OT, bool DEEP, bool SW>
__global__ void __launch_bounds__(RS_THREADS, RS_BLOCKS_PER_SM)
    gemm_fp4_wgrs(OT *y, const __nv_bfloat16 *x, const int32_t *rows, const int32_t *offs,
                  const uint8_t *w, const uint8_t *ws, int N, int K, const int32_t *elist,
                  swiglu_epi epi)
{
#ifdef BT_WGMMA
    bt_grid_begin();
    extern __shared__ __align__(128) unsigned char rs_smem[];
    __shared__ const __nv_bfloat16 *arow[RS_ROWS];
    const int tid = threadIdx.x;
    const int e = elist ? elist[blockIdx.z] : blockIdx.z;
    if (e < 0) return; /* a padded slot of the expert list (the whole block) */
    const int r0 = offs[e], m0 = r0 + blockIdx.y * RS_ROWS, r1 = offs[e + 1];
    if (m0 >= r1) return; /* the whole block */
    const int mr = min(RS_ROWS, r1 - m0), n0 = blockIdx.x * RS_COLS;
    w += (size_t)e * N * (K / 2);
    ws += (size_t)e * N * (K / 32);
    if (tid < RS_ROWS)
        arow[tid] = tid < mr ? x + (size_t)(rows ? rows[m0 + tid] : m0 + tid) * K : x;
    __syncthreads();
    /* from a 1024-byte boundary: the swizzle's */
    unsigned char *smem =
        rs_smem + ((1024 - ((uint32_t)__cvta_generic_to_shared(rs_smem) & 1023)) & 1023);
    /* N: the tile's rows rounded up to 16 */
    /* (DEEP: as many stages as fit, else 4, for comparisons; a template argument rather than a
     * runtime one: with both forms in one kernel ptxas gave it 128 registers and a spill, with
     * one 122 and none; a runtime switch cost this kernel ~6%, bench/RESULTS.md session 41) */
#define BT__WGRS_TILE(NT)                                                                          \
    wgrs_tile<NT, DEEP ? rs_stage<NT>::DEEP : 4, SW>(y, w, ws, N, K, m0, mr, n0, smem, arow, epi)
    /* clang-format off */
    switch ((mr + 15) / 16) {
    case 1: BT__WGRS_TILE(16); break;
    case 2: BT__WGRS_TILE(32); break;
    case 3: BT__WGRS_TILE(48); break;
    case 4: BT__WGRS_TILE(64); break;
    case 5: BT__WGRS_TILE(80); break;
    case 6: BT__WGRS_TILE(96); break;
    default: BT__WGRS_TILE(RS_ROWS); break;
    }
    /* clang-format on */
#undef BT__WGRS_TILE
#else
    __trap(); /* launched only where wgrs_ready() found the sm_90a image */
#endif
}

/* BT_CUDA_WGRS_SWIGLU=0 keeps bt_cuda_gemm_fp4_swiglu_fits from gemm_fp4_wgrs' SW form (the
 * prefill's w13 and SwiGLU as two launches, for comparisons), read once */
static bool wgrs_swiglu_on(void)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_WGRS_SWIGLU", &once);
}

/* BT_CUDA_WGRS_STAGES=4 keeps gemm_fp4_wgrs at 4 stages whatever its tile's rows
 * (comparisons); 0, the default, as many as fit (8 for up to 64 rows, 5 for 112) */
static bool wgrs_deep(void)
{
    static int once = -1;
    static const int allowed[] = {0, 4};
    return bt__env_choice("BT_CUDA_WGRS_STAGES", allowed, 2, 0, &once) == 0;
}

/* gemm_fp4_wgrs runs here at the stage count deep chose: a Hopper device, this binary's device
 * code built for sm_90a, and its shared memory allowed (with the SM's whole carveout asked for
 * shared memory: two blocks of RS_SMEM need it) */
static bool wgrs_ready(bool deep, bool sw)
{
    /* [sw][deep][f32] */
    static signed char built[BT__MAX_DEVICES], allowed[2][2][2][BT__MAX_DEVICES];
    signed char *bf16_state = allowed[sw][deep][0], *f32_state = allowed[sw][deep][1];
    bool ok = bt__wgmma_ready(wgrs_built, built);
    if (ok)
        bt_with_int<0, 1, 2, 3>(2 * sw + deep, [&](auto form_c) {
            constexpr bool DEEP = decltype(form_c)::value & 1, SW = decltype(form_c)::value >> 1;
            ok = bt__smem_allowed_carveout((const void *)gemm_fp4_wgrs<__nv_bfloat16, DEEP, SW>,
                                           RS_SMEM, bf16_state, true) &&
                 bt__smem_allowed_carveout((const void *)gemm_fp4_wgrs<float, DEEP, SW>, RS_SMEM,
                                           f32_state, true);
        });
    return ok;
}

static void wgrs_launch(void *y, bt_cuda_dtype_t yd, const __nv_bfloat16 *xb, const int32_t *rows,
                        const int32_t *offs, int groups, int max_rows, const uint8_t *w,
                        const uint8_t *ws, int N, int K, const int32_t *elist, bool deep,
                        const swiglu_epi *sw, cudaStream_t stream)
{
    /* (SW: N = 2I, a block's 128 columns 64 units' gate and up) */
    dim3 grid(bt__cdiv(N, RS_COLS), bt__cdiv(max_rows, RS_ROWS), groups);
    const swiglu_epi epi = sw ? *sw : swiglu_epi{};
    bt_with_int<0, 1, 2, 3>(2 * (sw != nullptr) + deep, [&](auto form_c) {
        constexpr bool DEEP = decltype(form_c)::value & 1, SW = decltype(form_c)::value >> 1;
        if (yd == BT_CUDA_BF16)
            bt__launch(gemm_fp4_wgrs<__nv_bfloat16, DEEP, SW>, grid, RS_THREADS, RS_SMEM, stream,
                       (__nv_bfloat16 *)y, xb, rows, offs, w, ws, N, K, elist, epi);
        else
            bt__launch(gemm_fp4_wgrs<float, DEEP, SW>, grid, RS_THREADS, RS_SMEM, stream,
                       (float *)y, xb, rows, offs, w, ws, N, K, elist, epi);
    });
}

/* BT_CUDA_FP4ROWS=0 / BT_CUDA_FP8ROWS=0 keep gemm_mma16 for few rows of FP4 / FP8 weights
 * (for comparisons), read once */
template <int FMT> static bool rows_on(void)
{
    static int once = -1;
    return bt__env_switch(FMT == FMT_FP4 ? "BT_CUDA_FP4ROWS" : "BT_CUDA_FP8ROWS", &once);
}

/* column tiles a gemm_rows block walks. FP4 (the routed experts): 2, which measured faster
 * (with 2 forced for every product) than the rule below at a token's 6 experts (1) and at 16
 * tokens' ~86 (8), and than 4 at both (bench/RESULTS.md, session 32). FP8: as many as keep 4
 * waves of blocks (per_sm an SM). BT_CUDA_ROWS_TILES=n overrides both; BT_CUDA_FP4_TILES=n
 * gives FP4 n, 0 the FP8 rule (comparisons; n 1, 2, 3, 4 or 8). */
static int rows_tiles(int fmt, int ntiles, int groups, int per_sm)
{
    static int forced = -1, fp4 = -1;
    static const int allowed[] = {0, 1, 2, 3, 4, 8};
    if (bt__env_choice("BT_CUDA_ROWS_TILES", allowed, 6, 0, &forced) > 0) return forced;
    if (fmt == FMT_FP4 && bt__env_choice("BT_CUDA_FP4_TILES", allowed, 6, 2, &fp4) > 0) return fp4;
    int tpb = 1;
    while (tpb < 8 && (long)bt__cdiv(ntiles, 2 * tpb) * groups >= 4L * per_sm * 132)
        tpb *= 2;
    return tpb;
}

/* gemm_rows' weight loads (rows_weight_ld). FP8 products: 2, streaming (BT_CUDA_ROWS_LH=0|1
 * for comparisons). FP4 experts: 1, cached in L2 only, for a list of 32 experts or more, else 2
 * (BT_CUDA_FP4_LH=0|1|2 forces one). At 16 tokens (86 experts) the graph's experts part, the
 * routed products beside the shared expert's on the other stream, took less time with 1: decode
 * b16 0.8352 -> 0.8258 ms (the routed products alone the same, 0.607 -> 0.606); at one token (6
 * experts) more: b1 0.1931 -> 0.1987, the routed products alone 0.054 -> 0.057 (four rounds
 * each, an H100, bench/RESULTS.md session 35; session 34's form of 1 for every product had
 * shown the same split). The bound between was not measured. */
enum { ROWS_FP4_L2_GROUPS = 32 };
static int rows_lh(int fmt, int groups)
{
    static int once = -1, fp4 = -1;
    static const int allowed[] = {0, 1, 2};
    if (fmt != FMT_FP4) return bt__env_choice("BT_CUDA_ROWS_LH", allowed, 3, 2, &once);
    const int forced = bt__env_choice("BT_CUDA_FP4_LH", allowed, 3, 3, &fp4); /* 3: unset */
    return forced < 3 ? forced : groups >= ROWS_FP4_L2_GROUPS ? 1 : 2;
}

/* K slices for a narrow bf16 product (FP8 only under BT_CUDA_FP8_KSPLIT_MAX, see below) whose
 * column tiles fill less than one wave of resident blocks (5 an SM on 132 SMs): the few blocks
 * of e.g. a [512, 5120] projection each walked all of K, one chunk a warp at a time, with most
 * SMs idle. A cluster of 2..8 blocks takes a column tile, a slice of K each (slices of whole
 * chunks, at least a chunk a warp on average; the last may be shorter). A function of the shape
 * alone, so a row sums the same in any batch. The FP8 products (wq_a, wkv) measured faster
 * unsplit in the decode's two-stream graph, where their cluster launches shared the GPU with
 * the other stream's kernels: b1 0.195 -> 0.185 ms, b16 0.834 -> 0.828 (session 37, an H100;
 * the bf16 ones, the router's and the indexer's head weights, unsplit too: b1 0.186, b16
 * 0.834). */
static int mma16_ksplit(int N, int K, int groups, int chunk, bool fp8)
{
    /* BT_CUDA_KSPLIT_MAX=1|2|4 caps the slices, BT_CUDA_FP8_KSPLIT_MAX=2|4|8 lets FP8 products
     * split (comparisons, and the tests of the split FP8 form) */
    static int cap = -1, cap8 = -1;
    static const int caps[] = {1, 2, 4, 8};
    int most = bt__env_choice("BT_CUDA_KSPLIT_MAX", caps, 4, 8, &cap);
    if (fp8) most = min(most, bt__env_choice("BT_CUDA_FP8_KSPLIT_MAX", caps, 4, 1, &cap8));
    const long tiles = (long)bt__cdiv(N, 8) * groups, wave = 132L * 5;
    int s = 1;
    while (s < most && tiles * s * 2 <= wave && K / (2 * s) >= MT_WARPS * chunk)
        s *= 2;
    return s;
}

/* 32-column tiles (gemm_rows; gemm_mma16's 4-tile blocks) from 144 of them up, 16 (8) below.
 * The bound was 264 (two blocks of one tile an SM on 132 SMs); the decode's FP8 products with
 * 144..263 (wo_a's 8 x 1024 columns, wo_b, the shared expert's w13 and w2) then ran 288..526
 * 16-column tiles, and took less time as fewer, longer blocks of 32 columns: decode b1 0.2018 ->
 * 0.1977 ms, b16 0.8442 -> 0.8381 (bench/RESULTS.md, session 33). The indexer's q product
 * (128) and the smaller ones keep their forms (bounds of 129..144 were not tried; mma16_ksplit
 * splits K only below 84). BT_CUDA_WIDE_MIN=264 restores the old bound (comparisons). */
static int wide_min_tiles(void)
{
    static int once = -1;
    static const int allowed[] = {264, 256, 240, 160, 144};
    return bt__env_choice("BT_CUDA_WIDE_MIN", allowed, 5, 144, &once);
}

/* few_rows_launch's choices, which the fused forms' fits ask too (their sums must be the plain
 * form's): 32-column tiles (wide), and the K slices of an FP8 or bf16 product over a cluster
 * (1: not sliced; FP4 and grouped products never are) */
static bool rows_wide(int N, int groups)
{
    return (long)bt__cdiv(N, 32) * groups >= wide_min_tiles();
}
static int rows_split(int fmt, int N, int K, int groups, bool grouped)
{
    return fmt != FMT_FP4 && !rows_wide(N, groups) && !grouped
               ? mma16_ksplit(N, K, groups, fmt == FMT_FP8 ? 64 : 32, fmt == FMT_FP8)
               : 1;
}

/* f(std::integral_constant<int, LH>()) for rows_lh's weight-load form lh */
template <typename F> static void with_lh(int lh, F &&f)
{
    bt_with_int<0, 1, 2>(lh, f);
}

/* The few-row kernels' launch. FP4 and FP8 weights: gemm_rows, blocks of rows_tiles() tiles of
 * 32 columns when there are at least 144 of them, else 16 (FP8 products whose column tiles
 * fill less than a wave took gemm_mma16 with K in slices over a cluster until session 37; with
 * BT_CUDA_FP8_KSPLIT_MAX they still do). bf16 weights: gemm_mma16, K sliced for such narrow
 * products (32 columns a block from the same bound, else 8). */
template <int FMT>
static bt_status_t few_rows_launch(void *y, bt_cuda_dtype_t yd, const __nv_bfloat16 *xb,
                                   const int32_t *rows, const int32_t *offs, int groups,
                                   const uint8_t *w, const uint8_t *ws, int M, int N, int K,
                                   const int32_t *elist, gemm_io io, cudaStream_t stream)
{
    const bool wide = rows_wide(N, groups);
    const int split = rows_split(FMT, N, K, groups, offs != NULL);
    if (FMT != FMT_BF16 && split == 1 && rows_on<FMT>()) {
        constexpr int F = FMT == FMT_FP4 ? FMT_FP4 : FMT_FP8; /* (no bf16 instance) */
#define BT__ROWS_LH(MT, R16, LH)                                                                   \
    do {                                                                                           \
        const int nt = bt__cdiv(N, 16 * MT), ks = rows_ks(F, K), ngr = MT_WARPS / ks;              \
        /* (tiles a block: a multiple of its warp groups) */                                       \
        const int tpb =                                                                            \
            bt__cdiv(rows_tiles(F, nt, groups, ROWS_MIN_BLOCKS(F, MT, R16)), ngr) * ngr;           \
        dim3 grid(bt__cdiv(nt, tpb), groups);                                                      \
        if (yd == BT_CUDA_BF16)                                                                    \
            bt__launch(gemm_rows<F, MT, R16, LH, __nv_bfloat16>, grid, MT_WARPS * 32, 0, stream,   \
                       (__nv_bfloat16 *)y, xb, rows, offs, w, ws, M, N, K, elist, io, tpb, ks,     \
                       rows_epi{});                                                                \
        else                                                                                       \
            bt__launch(gemm_rows<F, MT, R16, LH, float>, grid, MT_WARPS * 32, 0, stream,           \
                       (float *)y, xb, rows, offs, w, ws, M, N, K, elist, io, tpb, ks,             \
                       rows_epi{});                                                                \
    } while (0)
#define BT__ROWS(MT, R16)                                                                          \
    with_lh(rows_lh(F, groups), [&](auto lh) { BT__ROWS_LH(MT, R16, decltype(lh)::value); })
        /* FP4 experts: 8 rows a pass (more are rare); FP8 products: all their rows in one */
        if (FMT == FMT_FP8 && !offs && M > 8) {
            if (wide) /* (F == FMT_FP8: no FP4 instances of these) */
                BT__ROWS(2, F == FMT_FP8);
            else
                BT__ROWS(1, F == FMT_FP8);
        } else if (wide)
            BT__ROWS(2, false);
        else
            BT__ROWS(1, false);
#undef BT__ROWS
#undef BT__ROWS_LH
        return BT_OK;
    }
#define BT__MMA16(TL)                                                                              \
    do {                                                                                           \
        dim3 grid(bt__cdiv(N, 8 * TL), groups);                                                    \
        if (yd == BT_CUDA_BF16)                                                                    \
            bt__launch(gemm_mma16<FMT, TL, __nv_bfloat16>, grid, MT_WARPS * 32, 0, stream,         \
                       (__nv_bfloat16 *)y, xb, rows, offs, w, ws, M, N, K, elist, io, 1);          \
        else                                                                                       \
            bt__launch(gemm_mma16<FMT, TL, float>, grid, MT_WARPS * 32, 0, stream, (float *)y, xb, \
                       rows, offs, w, ws, M, N, K, elist, io, 1);                                  \
    } while (0)
    if (split > 1) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(bt__cdiv(N, 8) * split, groups);
        cfg.blockDim = dim3(MT_WARPS * 32);
        cfg.stream = stream;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = split;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1 + bt__pdl_attr(attr + 1);
        cudaError_t ce;
        if (yd == BT_CUDA_BF16)
            ce = cudaLaunchKernelEx(&cfg, gemm_mma16<FMT, 1, __nv_bfloat16>, (__nv_bfloat16 *)y,
                                    xb, rows, offs, w, ws, M, N, K, elist, io, split);
        else
            ce = cudaLaunchKernelEx(&cfg, gemm_mma16<FMT, 1, float>, (float *)y, xb, rows,
                                    offs, w, ws, M, N, K, elist, io, split);
        if (ce != cudaSuccess) {
            cudaGetLastError(); /* (not sticky) */
            fprintf(stderr, "cuda: gemm_mma16 (%d K slices a cluster): %s\n", split,
                    cudaGetErrorString(ce));
            return BT_ERR_DEVICE;
        }
    } else if (wide)
        BT__MMA16(4);
    else
        BT__MMA16(1);
#undef BT__MMA16
    return BT_OK;
}

template <int FMT>
static bt_status_t launch(void *y, bt_cuda_dtype_t yd, const uint16_t *x, const int32_t *rows,
                          const int32_t *offs, int groups, int max_rows, const uint8_t *w,
                          const uint8_t *ws, int M, int N, int K, const int32_t *elist,
                          gemm_io io, cudaStream_t stream)
{
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    /* whole chunks of K and 16-byte rows: the tensor-core kernel for few rows */
    bool mma_ok = K % (FMT == FMT_FP8 ? 64 : 128) == 0 && (uintptr_t)x % 16 == 0 &&
                  (uintptr_t)w % 16 == 0 && io.ldx % 8 == 0 && io.x_group % 8 == 0;
    /* (gemm_mma16's and gemm_rows' offsets in a matrix are 32-bit) */
    if (max_rows <= SKINNY_MAX_ROWS && mma_ok && (long long)N * K < (1ll << 31)) {
        bt_status_t st =
            few_rows_launch<FMT>(y, yd, xb, rows, offs, groups, w, ws, M, N, K, elist, io, stream);
        if (st != BT_OK) return st;
    } else if (max_rows <= SKINNY_MAX_ROWS) {
        dim3 grid(bt__cdiv(N, SK_WARPS), groups);
        if (yd == BT_CUDA_BF16)
            bt__launch(gemm_skinny<FMT, __nv_bfloat16>, grid, SK_WARPS * 32, 0, stream,
                       (__nv_bfloat16 *)y, xb, rows, offs, w, ws, M, N, K, elist, io);
        else
            bt__launch(gemm_skinny<FMT, float>, grid, SK_WARPS * 32, 0, stream, (float *)y, xb,
                       rows, offs, w, ws, M, N, K, elist, io);
    } else if (FMT == FMT_FP4 && mma_ok && (uintptr_t)ws % 4 == 0 && wgrs_on() &&
               wgrs_ready(wgrs_deep(), false)) {
        wgrs_launch(y, yd, xb, rows, offs, groups, max_rows, w, ws, N, K, elist, wgrs_deep(),
                    nullptr, stream);
    } else if (FMT == FMT_FP4 && mma_ok && (uintptr_t)ws % 4 == 0 && ft_smem_ready()) {
        /* (grouped only: rows K and N apart, as the plain layout) */
        dim3 grid(bt__cdiv(N, FT_COLS), bt__cdiv(max_rows, FT_ROWS), groups);
        if (yd == BT_CUDA_BF16)
            bt__launch(gemm_fp4_tiles<__nv_bfloat16>, grid, FT_WARPS * 32, FT_SMEM, stream,
                       (__nv_bfloat16 *)y, xb, rows, offs, w, ws, N, K, elist);
        else
            bt__launch(gemm_fp4_tiles<float>, grid, FT_WARPS * 32, FT_SMEM, stream, (float *)y, xb,
                       rows, offs, w, ws, N, K, elist);
    } else {
        dim3 grid(bt__cdiv(N, BN), bt__cdiv(max_rows, BM), groups);
        if (yd == BT_CUDA_BF16)
            bt__launch(gemm_tile<FMT, __nv_bfloat16>, grid, TILE_THREADS, 0, stream,
                       (__nv_bfloat16 *)y, xb, rows, offs, w, ws, M, N, K, elist, io);
        else
            bt__launch(gemm_tile<FMT, float>, grid, TILE_THREADS, 0, stream, (float *)y, xb, rows,
                       offs, w, ws, M, N, K, elist, io);
    }
    return bt__cuda_launched(FMT == FMT_FP8 ? "gemm_fp8" : "gemm_fp4_grouped");
}

extern "C" bt_status_t bt_cuda_gemm_fp8(void *y, bt_cuda_dtype_t y_dtype, const uint16_t *x,
                                        const uint8_t *w, const uint8_t *w_scale, int M, int N,
                                        int K, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && w && w_scale && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE(M > 0 && N > 0 && K > 0 && M <= 65535 * BM);
    return launch<FMT_FP8>(y, y_dtype, x, NULL, NULL, 1, M, w, w_scale, M, N, K, NULL,
                           plain_io(N, K), stream);
}

extern "C" bt_status_t bt_cuda_gemm_fp8_batched(void *y, bt_cuda_dtype_t y_dtype, int ldy,
                                                long long y_stride, const uint16_t *x, int ldx,
                                                long long x_stride, const uint8_t *w,
                                                const uint8_t *w_scale, int batch, int M, int N,
                                                int K, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && w && w_scale && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE(batch > 0 && batch <= 65535 && M > 0 && N > 0 && K > 0 && M <= 65535 * BM);
    BT_CUDA_REQUIRE(ldx >= K && ldx % 8 == 0 && x_stride >= 0 && x_stride % 8 == 0 &&
                    (uintptr_t)x % 16 == 0);
    BT_CUDA_REQUIRE(ldy >= N && y_stride >= 0);
    return launch<FMT_FP8>(y, y_dtype, x, NULL, NULL, batch, M, w, w_scale, M, N, K, NULL,
                           gemm_io{ldx, x_stride, ldy, y_stride}, stream);
}

/* ---- FP4 weights into fragment order ------------------------------------------------------ */

__global__ void fp4_to_frag_kernel(uint8_t *w, size_t runs)
{
    bt_grid_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= runs) return;
    uint4 v = ((const uint4 *)w)[i];
    uint8_t in[16], out[16];
    memcpy(in, &v, 16);
    bt_fp4_run_to_frag(in, out);
    memcpy(&v, out, 16);
    ((uint4 *)w)[i] = v;
}

extern "C" bt_status_t bt_cuda_fp4_to_frag(uint8_t *w, size_t bytes, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(w && bytes % 16 == 0 && (uintptr_t)w % 16 == 0);
    if (bytes == 0) return BT_OK;
    const size_t runs = bytes / 16;
    bt__launch(fp4_to_frag_kernel, bt__cdiv((long long)runs, 256), 256, 0, stream, w, runs);
    return bt__cuda_launched("fp4_to_frag");
}

extern "C" bt_status_t bt_cuda_gemm_fp4_grouped(void *y, bt_cuda_dtype_t y_dtype,
                                                const uint16_t *x, const int32_t *rows,
                                                const int32_t *offs, int n_experts, int max_rows,
                                                const uint8_t *w, const uint8_t *w_scale, int N,
                                                int K, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && offs && w && w_scale && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE((uintptr_t)w % 16 == 0); /* (runs of 32 codes are read whole) */
    BT_CUDA_REQUIRE(n_experts > 0 && n_experts <= 65535 && max_rows > 0 && N > 0);
    BT_CUDA_REQUIRE(K > 0 && K % 32 == 0 && max_rows <= 65535 * BM);
    return launch<FMT_FP4>(y, y_dtype, x, rows, offs, n_experts, max_rows, w, w_scale, 0, N, K,
                           NULL, plain_io(N, K), stream);
}

extern "C" bt_status_t bt_cuda_gemm_fp4_grouped_list(void *y, bt_cuda_dtype_t y_dtype,
                                                     const uint16_t *x, const int32_t *rows,
                                                     const int32_t *offs, const int32_t *experts,
                                                     int n_listed, int max_rows, const uint8_t *w,
                                                     const uint8_t *w_scale, int N, int K,
                                                     cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && offs && experts && w && w_scale && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE((uintptr_t)w % 16 == 0); /* (runs of 32 codes are read whole) */
    BT_CUDA_REQUIRE(n_listed > 0 && n_listed <= 65535 && max_rows > 0 && N > 0);
    BT_CUDA_REQUIRE(K > 0 && K % 32 == 0 && max_rows <= 65535 * BM);
    return launch<FMT_FP4>(y, y_dtype, x, rows, offs, n_listed, max_rows, w, w_scale, 0, N, K,
                           experts, plain_io(N, K), stream);
}

/* The routed experts' w13 and their SwiGLU in one launch: h without its gate and up sums
 * going through memory, and without the activation's own launch. Two forms, each taken where
 * the plain product would run the same kernel on the same sums, so every sum is the plain
 * form's and h is bt_cuda_swiglu's, bit for bit:
 * - a decode step's (up to 16 rows an expert): gemm_rows' SW form, where the plain form would
 *   run gemm_rows with the whole block as one warp group (ks 8: K a multiple of 1024); off the
 *   critical path between the two expert products goes the activation's launch;
 * - a prefill's (more rows, on Hopper): gemm_fp4_wgrs' SW form; the [rows, 2I] f32 sums (0.45
 *   GB at 4096 tokens) are neither written nor read back (BT_CUDA_WGRS_SWIGLU=0: apart; measured
 *   in bench/RESULTS.md, session 43).
 * BT_CUDA_SWIGLU_FUSED=0: neither (comparisons), read once. */
extern "C" int bt_cuda_gemm_fp4_swiglu_fits(int I, int K, int max_rows)
{
    static int once = -1;
    if (!bt__env_switch("BT_CUDA_SWIGLU_FUSED", &once) || I <= 0 || K <= 0 || K % 128 != 0 ||
        max_rows <= 0)
        return 0;
    if (max_rows > SKINNY_MAX_ROWS) /* (the plain product's bound, and its kernel ready too) */
        return wgrs_swiglu_on() && wgrs_on() && max_rows <= 65535 * BM &&
               wgrs_ready(wgrs_deep(), false) && wgrs_ready(wgrs_deep(), true);
    return rows_on<FMT_FP4>() && I % 32 == 0 && rows_ks(FMT_FP4, K) == MT_WARPS &&
           (long long)2 * I * K < (1ll << 31);
}

extern "C" bt_status_t
bt_cuda_gemm_fp4_swiglu_list(void *h, bt_cuda_dtype_t h_dtype, const uint16_t *x,
                             const int32_t *rows, const int32_t *offs, const int32_t *experts,
                             int n_listed, int max_rows, const uint8_t *w, const uint8_t *w_scale,
                             int I, int K, const float *wt, float limit, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(h && x && offs && experts && w && w_scale && bt__dtype_ok(h_dtype));
    BT_CUDA_REQUIRE((uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0 && K % 8 == 0);
    BT_CUDA_REQUIRE(n_listed > 0 && n_listed <= 65535);
    BT_CUDA_REQUIRE(bt_cuda_gemm_fp4_swiglu_fits(I, K, max_rows));
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    const swiglu_epi sw = {wt, limit};
    if (max_rows > SKINNY_MAX_ROWS) { /* (the plain form's gemm_fp4_wgrs conditions) */
        BT_CUDA_REQUIRE((uintptr_t)w_scale % 4 == 0);
        wgrs_launch(h, h_dtype, xb, rows, offs, n_listed, max_rows, w, w_scale, 2 * I, K, experts,
                    wgrs_deep(), &sw, stream);
        return bt__cuda_launched("gemm_fp4_swiglu");
    }
    const int N = 2 * I, groups = n_listed, lh = rows_lh(FMT_FP4, groups);
    const dim3 grid(I / 32, groups);
    const gemm_io io = plain_io(N, K);
    rows_epi epi = {};
    epi.sw = sw;
    with_lh(lh, [&](auto l) {
        constexpr int LH = decltype(l)::value;
        if (h_dtype == BT_CUDA_BF16)
            bt__launch(gemm_rows<FMT_FP4, 2, false, LH, __nv_bfloat16, ROWS_SWIGLU>, grid,
                       MT_WARPS * 32, 0, stream, (__nv_bfloat16 *)h, xb, rows, offs, w, w_scale, 0,
                       N, K, experts, io, 2, MT_WARPS, epi);
        else
            bt__launch(gemm_rows<FMT_FP4, 2, false, LH, float, ROWS_SWIGLU>, grid, MT_WARPS * 32, 0,
                       stream, (float *)h, xb, rows, offs, w, w_scale, 0, N, K, experts, io, 2,
                       MT_WARPS, epi);
    });
    return bt__cuda_launched("gemm_fp4_swiglu");
}

/* The indexer's query product at a decode step and its queries' finish (bt_cuda_head_finish
 * without the norm: RoPE, rounding in blocks of 32) in one launch (gemm_rows' ROWS_QFINISH
 * form), one launch fewer on the indexer's chain. Up to 8 rows: at 16 the 32-column form
 * (one pass of 16 rows) made the layer bench's indexer part slower, 0.0553 -> 0.0579 ms, for
 * no gain in the step (bench/RESULTS.md, session 39). Taken where the plain product runs
 * gemm_rows unsplit (its 16- or 32-column tiles give each column the same sums in the same
 * order), so the queries are the two launches' bits. BT_CUDA_QFINISH=0: never (comparisons),
 * read once. */
extern "C" int bt_cuda_gemm_fp8_qfinish_fits(int M, int N, int K, int dim)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_QFINISH", &once) && rows_on<FMT_FP8>() && M > 0 && M <= 8 &&
           dim > 0 && dim % 32 == 0 && N > 0 && N % dim == 0 && K > 0 && K % 64 == 0 &&
           (long long)N * K < (1ll << 31) && rows_split(FMT_FP8, N, K, 1, false) == 1;
}

extern "C" bt_status_t bt_cuda_gemm_fp8_qfinish(float *y, const uint16_t *x, const uint8_t *w,
                                                const uint8_t *w_scale, int M, int N, int K,
                                                int dim, const int64_t *pos, const float *inv_freq,
                                                int half, bt_cuda_fake_quant_t fq_kind,
                                                cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && w && w_scale && bt_cuda_gemm_fp8_qfinish_fits(M, N, K, dim));
    BT_CUDA_REQUIRE((uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0);
    BT_CUDA_REQUIRE(!pos || (inv_freq && half > 0 && 2 * half <= dim));
    BT_CUDA_REQUIRE(fq_kind == BT_CUDA_FQ_FP8_UE8M0 || fq_kind == BT_CUDA_FQ_FP4_UE8M0 ||
                    fq_kind == BT_CUDA_FQ_FP4_E4M3);
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    const int nt = N / 32, ks = rows_ks(FMT_FP8, K), ngr = MT_WARPS / ks;
    const int lh = rows_lh(FMT_FP8, 1);
    const gemm_io io = plain_io(N, K);
    rows_epi epi = {};
    epi.pos = pos;
    epi.inv_freq = inv_freq;
    epi.dim = dim;
    epi.half = pos ? half : 0;
    epi.fq_kind = (int)fq_kind;
    /* (8 rows at most: one 8-row pass) */
    const int tpb =
        bt__cdiv(rows_tiles(FMT_FP8, nt, 1, ROWS_MIN_BLOCKS(FMT_FP8, 2, false)), ngr) * ngr;
    with_lh(lh, [&](auto l) {
        bt__launch(gemm_rows<FMT_FP8, 2, false, decltype(l)::value, float, ROWS_QFINISH>,
                   bt__cdiv(nt, tpb), MT_WARPS * 32, 0, stream, y, xb, (const int32_t *)NULL,
                   (const int32_t *)NULL, w, w_scale, M, N, K, (const int32_t *)NULL, io, tpb, ks,
                   epi);
    });
    return bt__cuda_launched("gemm_fp8_qfinish");
}

/* ---- dequantization for the many-row path ---------------------------------------------- */

/* A thread per 16 weights of a row (K % 16 == 0: one uint4 in, two out) or per weight. */
__global__ void dequant_fp8_kernel(__nv_bfloat16 *out, const uint8_t *w, const uint8_t *ws, int N,
                                   int K, int vec)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per = vec ? 16 : 1;
    size_t e = i * per;
    if (e >= (size_t)N * K) return;
    int n = (int)(e / K), k = (int)(e % K), ks = (K + 31) / 32;
    if (!vec) {
        out[e] = __float2bfloat16_rn(weight_at<FMT_FP8>(w, ws, n, k, K));
        return;
    }
    float f[16];
    dequant_fp8x16(*(const uint4 *)(w + e), bt_e8m0(ws[(size_t)(n / 32) * ks + k / 32]), f);
    *(uint4 *)(out + e) = f32x8_to_bf16(f);
    *(uint4 *)(out + e + 8) = f32x8_to_bf16(f + 8);
}

extern "C" bt_status_t bt_cuda_dequant_fp8(uint16_t *w_bf16, const uint8_t *w,
                                           const uint8_t *w_scale, int N, int K,
                                           cudaStream_t stream)
{
    BT_CUDA_REQUIRE(w_bf16 && w && w_scale && N > 0 && K > 0);
    /* 16-byte loads and stores need aligned rows */
    int vec = K % 16 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)w_bf16 % 16 == 0;
    size_t threads = ((size_t)N * K + (vec ? 15 : 0)) / (vec ? 16 : 1);
    bt__launch(dequant_fp8_kernel, (unsigned)((threads + 255) / 256), 256, 0, stream,
               (__nv_bfloat16 *)w_bf16, w, w_scale, N, K, vec);
    return bt__cuda_launched("dequant_fp8");
}

/* y[M,N] = x[M,K] . w[N,K]^T with bf16 weights and up to 16 rows (a decode step), on the
 * few-row kernel: gemm.cu's path for such products (cuBLASLt split them over two kernels of
 * ~5 us each for the router's [384, 5120]). Each row's sums do not depend on M. */
bool bt__gemm_bf16_rows_fits(const void *x, const void *w, int M, int N, int K)
{
    return M >= 1 && M <= SKINNY_MAX_ROWS && N > 0 && K > 0 && K % 32 == 0 &&
           (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0 && 2ll * N * K < (1ll << 31);
}

bt_status_t bt__gemm_bf16_rows(void *y, bt_cuda_dtype_t yd, const uint16_t *x,
                               const uint16_t *w, int M, int N, int K, cudaStream_t stream)
{
    bt_status_t st =
        few_rows_launch<FMT_BF16>(y, yd, (const __nv_bfloat16 *)x, NULL, NULL, 1,
                                  (const uint8_t *)w, NULL, M, N, K, NULL, plain_io(N, K), stream);
    return st != BT_OK ? st : bt__cuda_launched("gemm_bf16 (rows)");
}

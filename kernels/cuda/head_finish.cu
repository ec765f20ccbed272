/* A head vector's last steps after its projection, in one launch: RMSNorm, RoPE on its last
 * 2*half channels, the QAT fake-quantizer. At decode each of these was its own 3-4 us launch
 * over a few hundred values (the latent KV row: norm, rope, FP8 rounding; the indexer's
 * queries: rope, FP4 rounding). The arithmetic is that of bt_cuda_rmsnorm, bt_cuda_rope and
 * bt_cuda_fake_quant, in their order and with their sums (the norm's partial sums are taken
 * over the thread count bt_cuda_rmsnorm uses for the length), so the result is bit for bit
 * that of the three launches. */
#include "kernels/cuda/quant.cuh"

enum { HF_MAXD = 4096 };

/* bt_cuda_rmsnorm's threads for a row of n */
static int norm_threads(int n) { return n >= 1024 ? 512 : (n >= 256 ? 256 : 64); }

__global__ void head_finish_kernel(float *x, int heads, int dim, int norm, const float *norm_w,
                                   float eps, const int64_t *pos, const float *inv_freq, int half,
                                   int fq_block, int fq_kind)
{
    bt_grid_begin();
    __shared__ float v[HF_MAXD];
    __shared__ float red[32];
    const size_t r = blockIdx.x;
    float *xr = x + r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float a = xr[i];
        v[i] = a;
        ss += a * a;
    }
    if (norm) { /* (bt_block_sum's barriers also publish v) */
        ss = bt_block_sum(ss, red);
        const float rr = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            const float a = v[i] * rr;
            v[i] = norm_w ? norm_w[i] * a : a;
        }
    }
    __syncthreads();
    if (pos) {
        const float p = (float)pos[r / heads];
        for (int j = threadIdx.x; j < half; j += blockDim.x) {
            const int at = dim - 2 * half + 2 * j;
            bt_dev_rope_pair(v[at], v[at + 1], inv_freq[j] * p);
        }
        __syncthreads();
    }
    if (fq_block) { /* a warp per block of values, as fake_quant_kernel */
        const int warps = blockDim.x >> 5;
        for (int b = threadIdx.x >> 5; b < dim / fq_block; b += warps)
            bt_dev_fake_quant_warp(v + b * fq_block, fq_block, fq_kind, threadIdx.x & 31);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = v[i];
}

/* Rows of 128 without the norm (the indexer's queries: RoPE, FP4 rounding in blocks of 32) a
 * warp each, 4 values a lane, with no shared memory or barriers: a 64-thread block a row
 * went through four barrier-separated phases (0.27 ms for a 4096-token prefill's 131072 rows
 * under Nsight Compute). The same operations on the same values, so the same bits. */
enum { HF_ROWS = 8 };

__global__ void __launch_bounds__(HF_ROWS * 32)
    head_finish128_kernel(float *x, int rows, int heads, const int64_t *pos, const float *inv_freq,
                          int half, int fq_block, int fq_kind)
{
    bt_grid_begin();
    const int lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * HF_ROWS + (threadIdx.x >> 5);
    if (r >= (size_t)rows) return; /* (a whole warp) */
    float4 *xr = (float4 *)(x + r * 128) + lane;
    const float4 a = *xr;
    float v[4] = {a.x, a.y, a.z, a.w};
    if (pos) {
        const float p = (float)pos[r / heads];
        const int r0 = 128 - 2 * half;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int at = 4 * lane + 2 * q;
            if (at < r0) continue;
            bt_dev_rope_pair(v[2 * q], v[2 * q + 1], inv_freq[(at - r0) >> 1] * p);
        }
    }
    if (fq_block) { /* blocks of 32: 8 lanes; NaN when any value is, as the reference's max */
        float amax = 0.0f;
        bool nan = false;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float m = fabsf(v[i]);
            nan = nan || isnan(m);
            amax = fmaxf(amax, m);
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            nan = nan || __shfl_xor_sync(0xffffffffu, (int)nan, o);
        }
        if (nan) amax = __int_as_float(0x7fc00000);
        const float scale = bt_dev_fake_quant_scale(amax, fq_kind);
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = bt_dev_fake_quant_value(v[i], scale, fq_kind);
    }
    *xr = make_float4(v[0], v[1], v[2], v[3]);
}

extern "C" bt_status_t bt_cuda_head_finish(float *x, int rows, int heads, int dim, int norm,
                                           const float *norm_w, float eps, const int64_t *pos,
                                           const float *inv_freq, int half, int fq_block,
                                           bt_cuda_fake_quant_t fq_kind, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && rows > 0 && heads > 0 && dim > 0 && dim <= HF_MAXD);
    BT_CUDA_REQUIRE(!pos || (inv_freq && half > 0 && 2 * half <= dim));
    BT_CUDA_REQUIRE(fq_block >= 0);
    BT_CUDA_REQUIRE(fq_kind == BT_CUDA_FQ_FP8_UE8M0 || fq_kind == BT_CUDA_FQ_FP4_UE8M0 ||
                    fq_kind == BT_CUDA_FQ_FP4_E4M3);
    if (fq_block && dim % fq_block) fq_block = 0; /* the reference leaves such vectors alone */
    /* a norm over the head, not the row: the caller's heads are 1 when it asks for one */
    BT_CUDA_REQUIRE(!norm || heads == 1);
    if (!norm && dim == 128 && (fq_block == 0 || fq_block == 32) && (uintptr_t)x % 16 == 0) {
        const long n = (long)rows * heads;
        bt__launch(head_finish128_kernel, bt__cdiv(n, HF_ROWS), HF_ROWS * 32, 0, stream, x, (int)n,
                   heads, pos, inv_freq, pos ? half : 0, fq_block, (int)fq_kind);
        return bt__cuda_launched("head_finish");
    }
    bt__launch(head_finish_kernel, (unsigned)rows * heads, norm_threads(dim), 0, stream, x, heads,
               dim, norm, norm_w, eps, pos, inv_freq, half, fq_block, (int)fq_kind);
    return bt__cuda_launched("head_finish");
}

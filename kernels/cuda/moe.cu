/* MoE routing (sqrtsoftplus scores, biased top-k selection, normalised weights) and the
 * SwiGLU activation of the experts with the model's limits. */
#include "kernels/cuda/common.cuh"

enum { RT_WARPS = 4, RT_MAXE = 1024, RT_MAXK = 16 };

/* one warp per token; scores and biased scores staged in shared memory */
__global__ void __launch_bounds__(RT_WARPS * 32) moe_route_kernel(int32_t *idx, float *wts,
                                                                  const float *logits,
                                                                  const float *bias, int T, int E,
                                                                  int K, float temp, int norm,
                                                                  float route_scale)
{
    extern __shared__ float sh[]; /* per warp: s[E], b[E] */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int t = blockIdx.x * RT_WARPS + warp;
    if (t >= T) return; /* no block barriers below */
    float *s = sh + (size_t)warp * 2 * E, *b = s + E;
    for (int e = lane; e < E; e += 32) {
        float x = logits[(size_t)t * E + e] / temp;
        float sp = x > 20.0f ? x : log1pf(expf(x));
        s[e] = sqrtf(sp);
        b[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    int sel[RT_MAXK];
    for (int i = 0; i < K; i++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            float v = b[e];
            if (!isnan(v) && (v > bv || (v == bv && e < bi))) {
                bv = v;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi == 0x7fffffff) bi = 0; /* only NaNs left: not reachable with finite logits */
        sel[i < RT_MAXK ? i : 0] = bi;
        __syncwarp();
        if (lane == 0) b[bi] = __int_as_float(0x7fc00000); /* taken */
        __syncwarp();
    }
    if (lane != 0) return;
    float sum = 0.0f, w[RT_MAXK];
    for (int i = 0; i < K; i++) {
        w[i] = s[sel[i]];
        sum += w[i];
    }
    for (int i = 0; i < K; i++) {
        float v = w[i];
        if (norm && K > 1) v = v / (sum + 1e-20f);
        idx[(size_t)t * K + i] = sel[i];
        wts[(size_t)t * K + i] = v * route_scale;
    }
}

extern "C" bt_status_t bt_cuda_moe_route(int32_t *idx, float *wts, const float *logits,
                                         const float *bias, int T, int E, int k, float temp,
                                         int normalize, float route_scale, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(idx && wts && logits && T > 0 && E > 0 && E <= RT_MAXE);
    BT_CUDA_REQUIRE(k > 0 && k <= RT_MAXK && k <= E && temp > 0.0f);
    size_t smem = (size_t)RT_WARPS * 2 * E * sizeof(float);
    moe_route_kernel<<<bt__cdiv(T, RT_WARPS), RT_WARPS * 32, smem, stream>>>(
        idx, wts, logits, bias, T, E, k, temp, normalize, route_scale);
    return bt__cuda_launched("moe_route");
}

template <typename OT>
__global__ void swiglu_kernel(OT *h, const float *gu, const float *wt, int rows, int I,
                              float limit)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * I) return;
    size_t r = i / I;
    int c = (int)(i % I);
    float g = gu[r * 2 * I + c], u = gu[r * 2 * I + I + c];
    if (limit > 0.0f) {
        u = fminf(fmaxf(u, -limit), limit);
        g = fminf(g, limit);
    }
    float y = g / (1.0f + expf(-g)) * u;
    bt_st(h, i, wt ? wt[r] * y : y);
}

extern "C" bt_status_t bt_cuda_swiglu(void *h, bt_cuda_dtype_t h_dtype, const float *gu,
                                      const float *wt, int rows, int I, float limit,
                                      cudaStream_t stream)
{
    BT_CUDA_REQUIRE(h && gu && bt__dtype_ok(h_dtype) && rows > 0 && I > 0);
    int blocks = bt__cdiv((long long)rows * I, 256);
    if (h_dtype == BT_CUDA_F32)
        swiglu_kernel<<<blocks, 256, 0, stream>>>((float *)h, gu, wt, rows, I, limit);
    else
        swiglu_kernel<<<blocks, 256, 0, stream>>>((__nv_bfloat16 *)h, gu, wt, rows, I, limit);
    return bt__cuda_launched("swiglu");
}

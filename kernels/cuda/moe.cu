/* MoE routing (sqrtsoftplus scores, biased top-k selection, normalised weights) and the
 * SwiGLU activation of the experts with the model's limits. */
#include "kernels/cuda/common.cuh"

enum { RT_WARPS = 4, RT_MAXE = 1024, RT_MAXK = 16 };

/* token t's k picks (best first) and their weights: the unbiased scores, normalized to sum 1
 * when asked, times route_scale */
__device__ void rt_store_picks(int32_t *idx, float *wts, const float *s, const int *sel, int t,
                               int K, int norm, float route_scale)
{
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

/* the better of two (biased score, expert) candidates: the larger score, then the lower
 * index; NaN (and taken) never, the index 0x7fffffff standing for none */
__device__ __forceinline__ bool rt_better(float &bv, int &bi, float ov, int oi)
{
    if (!isnan(ov) && (isnan(bv) || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
        return true;
    }
    return false;
}

__device__ __forceinline__ void rt_warp_best(float &bv, int &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        rt_better(bv, bi, ov, oi);
    }
}

/* one warp per token; scores and biased scores staged in shared memory. Each lane keeps the
 * best of its experts (e = lane mod 32); a pick is a warp argmax of those, after which only
 * the winning lane looks through its experts again (every lane rescanning all of its experts
 * for each of the k picks, behind loads one latency each, was a decode step's 14 us). */
__global__ void __launch_bounds__(RT_WARPS * 32) moe_route_kernel(int32_t *idx, float *wts,
                                                                  const float *logits,
                                                                  const float *bias, int T, int E,
                                                                  int K, float temp, int norm,
                                                                  float route_scale)
{
    bt_grid_begin();
    extern __shared__ float sh[]; /* per warp: s[E], b[E] */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int t = blockIdx.x * RT_WARPS + warp;
    if (t >= T) return; /* no block barriers below */
    float *s = sh + (size_t)warp * 2 * E, *b = s + E;
#pragma unroll 4
    for (int e = lane; e < E; e += 32) {
        float x = logits[(size_t)t * E + e] / temp;
        float sp = x > 20.0f ? x : log1pf(expf(x));
        s[e] = sqrtf(sp);
        b[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    /* the best untaken expert of this lane: largest biased score, then lowest index; NaN
     * (and taken, marked NaN) never */
    auto lane_best = [&](float &bv, int &bi) {
        bv = -INFINITY;
        bi = 0x7fffffff;
#pragma unroll 4
        for (int e = lane; e < E; e += 32) rt_better(bv, bi, b[e], e);
    };
    float mv;
    int mi;
    lane_best(mv, mi);
    int sel[RT_MAXK];
    for (int i = 0; i < K; i++) {
        float bv = mv;
        int bi = mi;
        rt_warp_best(bv, bi);
        if (bi == 0x7fffffff) bi = 0; /* only NaNs left: not reachable with finite logits */
        sel[i < RT_MAXK ? i : 0] = bi;
        if (lane == (bi & 31)) { /* the winner's lane: mark it taken, find its next best */
            b[bi] = __int_as_float(0x7fc00000);
            lane_best(mv, mi);
        }
    }
    if (lane == 0) rt_store_picks(idx, wts, s, sel, t, K, norm, route_scale);
}

/* Few tokens (decode): a block per token, a thread per expert, so the E scores are computed
 * side by side (one warp walking all 384 took ~13 us a token, warm). Each warp picks its own
 * top k by k warp argmaxes; warp 0 then picks the token's k from those candidates the same
 * way. The picks and weights are those of moe_route_kernel. */
__global__ void __launch_bounds__(RT_MAXE) moe_route_block_kernel(int32_t *idx, float *wts,
                                                                 const float *logits,
                                                                 const float *bias, int E, int K,
                                                                 float temp, int norm,
                                                                 float route_scale)
{
    bt_grid_begin();
    __shared__ float s[RT_MAXE], cand_v[RT_MAXE / 32 * RT_MAXK];
    __shared__ int cand_i[RT_MAXE / 32 * RT_MAXK];
    const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const int nw = blockDim.x >> 5;
    float v = __int_as_float(0x7fc00000);
    if (e < E) {
        float x = logits[(size_t)t * E + e] / temp;
        float sp = x > 20.0f ? x : log1pf(expf(x));
        s[e] = sqrtf(sp);
        v = s[e] + (bias ? bias[e] : 0.0f);
    }
    for (int i = 0; i < K; i++) { /* this warp's k best, best first */
        float bv = v;
        int bi = isnan(v) ? 0x7fffffff : e;
        rt_warp_best(bv, bi);
        if (lane == 0) cand_v[warp * K + i] = bv, cand_i[warp * K + i] = bi;
        if (bi == e) v = __int_as_float(0x7fc00000); /* taken */
    }
    __syncthreads();
    if (warp != 0) return; /* (no barriers below) */
    const int nc = nw * K; /* candidates; lane l holds l, l + 32, ... */
    int sel[RT_MAXK];
    for (int i = 0; i < K; i++) {
        float bv = __int_as_float(0x7fc00000);
        int bi = 0x7fffffff, at = -1;
        for (int c = lane; c < nc; c += 32)
            if (rt_better(bv, bi, cand_v[c], cand_i[c])) at = c;
        const int mine = bi;
        rt_warp_best(bv, bi);
        if (bi != 0x7fffffff && bi == mine && at >= 0) cand_v[at] = __int_as_float(0x7fc00000);
        __syncwarp();
        sel[i] = bi == 0x7fffffff ? 0 : bi; /* only NaNs left: not reachable with finite logits */
    }
    if (lane == 0) rt_store_picks(idx, wts, s, sel, t, K, norm, route_scale);
}

/* tokens up to which a block per token beats a warp per token */
enum { RT_BLOCK_TOKENS = 64 };

extern "C" bt_status_t bt_cuda_moe_route(int32_t *idx, float *wts, const float *logits,
                                         const float *bias, int T, int E, int k, float temp,
                                         int normalize, float route_scale, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(idx && wts && logits && T > 0 && E > 0 && E <= RT_MAXE);
    BT_CUDA_REQUIRE(k > 0 && k <= RT_MAXK && k <= E && temp > 0.0f);
    if (T <= RT_BLOCK_TOKENS) {
        bt__launch(moe_route_block_kernel, T, (E + 31) / 32 * 32, 0, stream, idx, wts, logits, bias,
                   E, k, temp, normalize, route_scale);
        return bt__cuda_launched("moe_route");
    }
    size_t smem = (size_t)RT_WARPS * 2 * E * sizeof(float);
    bt__launch(moe_route_kernel, bt__cdiv(T, RT_WARPS), RT_WARPS * 32, smem, stream, idx, wts,
               logits, bias, T, E, k, temp, normalize, route_scale);
    return bt__cuda_launched("moe_route");
}

template <typename OT>
__global__ void swiglu_kernel(OT *h, const float *gu, const float *wt, int rows, int I,
                              float limit)
{
    bt_grid_begin();
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

/* The same, 4 columns a thread (I % 4 == 0, gu 16-byte aligned): a row a grid row, so no
 * division per element (it was 64-bit), and 16-byte loads. The same arithmetic per element. */
template <typename OT>
__global__ void swiglu4_kernel(OT *h, const float *gu, const float *wt, int I, float limit)
{
    bt_grid_begin();
    const int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x), r = blockIdx.y;
    if (c >= I) return;
    const float4 g4 = *(const float4 *)(gu + (size_t)r * 2 * I + c);
    const float4 u4 = *(const float4 *)(gu + (size_t)r * 2 * I + I + c);
    const float g[4] = {g4.x, g4.y, g4.z, g4.w}, uu[4] = {u4.x, u4.y, u4.z, u4.w};
    const float w = wt ? wt[r] : 1.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float gj = g[j], u = uu[j];
        if (limit > 0.0f) {
            u = fminf(fmaxf(u, -limit), limit);
            gj = fminf(gj, limit);
        }
        const float y = gj / (1.0f + expf(-gj)) * u;
        bt_st(h, (size_t)r * I + c + j, wt ? w * y : y);
    }
}

extern "C" bt_status_t bt_cuda_swiglu(void *h, bt_cuda_dtype_t h_dtype, const float *gu,
                                      const float *wt, int rows, int I, float limit,
                                      cudaStream_t stream)
{
    BT_CUDA_REQUIRE(h && gu && bt__dtype_ok(h_dtype) && rows > 0 && I > 0);
    if (I % 4 == 0 && (uintptr_t)gu % 16 == 0 && rows <= 65535) {
        const dim3 grid(bt__cdiv(I / 4, 128), rows);
        if (h_dtype == BT_CUDA_F32)
            bt__launch(swiglu4_kernel<float>, grid, 128, 0, stream, (float *)h, gu, wt, I, limit);
        else
            bt__launch(swiglu4_kernel<__nv_bfloat16>, grid, 128, 0, stream, (__nv_bfloat16 *)h, gu,
                       wt, I, limit);
        return bt__cuda_launched("swiglu");
    }
    int blocks = bt__cdiv((long long)rows * I, 256);
    if (h_dtype == BT_CUDA_F32)
        bt__launch(swiglu_kernel<float>, blocks, 256, 0, stream, (float *)h, gu, wt, rows, I,
                   limit);
    else
        bt__launch(swiglu_kernel<__nv_bfloat16>, blocks, 256, 0, stream, (__nv_bfloat16 *)h, gu, wt,
                   rows, I, limit);
    return bt__cuda_launched("swiglu");
}

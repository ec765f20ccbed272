/* mHC (manifold hyper-connections): the mapping (pre, post, comb with Sinkhorn) from the
 * flattened streams, the collapse of the streams into one normalized input, and the
 * expansion of a sub-layer's output back into the streams. */
#include "kernels/cuda/common.cuh"

#include <type_traits>

enum { MIX_THREADS = 256, FOLD_WARPS = 8 };

/* f(std::integral_constant<int, H>()) for the stream count hc (1, 2 or 4, checked by the
 * callers): the kernels keep a token's streams in registers, so H is a template argument */
template <typename F> static void with_hc(int hc, F &&f)
{
    bt_with_int<1, 4, 2>(hc, f);
}

/* f(p as float * or __nv_bfloat16 *) by its dtype */
template <typename F>
static void with_dtype(void *p, bt_cuda_dtype_t dt, F &&f)
{
    if (dt == BT_CUDA_F32)
        f((float *)p);
    else
        f((__nv_bfloat16 *)p);
}

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* From the token's mixes m[(2+HC)*HC]: pre, post and comb (softmax rows, then Sinkhorn), by
 * one warp: lane j*HC+k holds comb[j][k], its row's lanes are neighbours (sums by xor < HC),
 * its column's lanes HC apart (xor HC.. HC*HC/2). Twenty dependent iterations of divides on one
 * thread were most of a decode step's mix. */
template <int HC>
__device__ void hc_mix_finish(float *pre, float *post, float *comb, const float *m,
                              const float *base, const float *scale, int t, float hc_eps,
                              int iters)
{
    int lane = threadIdx.x & 31;
    if (lane < HC) {
        pre[t * HC + lane] = sigm(m[lane] * scale[0] + base[lane]) + hc_eps;
        post[t * HC + lane] = 2.0f * sigm(m[HC + lane] * scale[1] + base[HC + lane]);
    }
    bool on = lane < HC * HC;
    float v = on ? m[2 * HC + lane] * scale[2] + base[2 * HC + lane] : 0.0f;
    auto row_sum = [](float x) {
        for (int o = 1; o < HC; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        return x;
    };
    auto col_sum = [](float x) {
        for (int o = HC; o < HC * HC; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        return x;
    };
    float mx = v;
    for (int o = 1; o < HC; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float ex = expf(v - mx);
    float c = ex / row_sum(ex) + hc_eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) c /= row_sum(c) + hc_eps;
        c /= col_sum(c) + hc_eps;
    }
    if (on) comb[(size_t)t * HC * HC + lane] = c;
}

/* TOK tokens a block (many tokens: prefill): each fn element a thread loads serves all of
 * them, so fn ((2+hc)*hc rows of hc*D floats, 2 MB at the real widths) crosses L2 once per TOK
 * tokens instead of once per token (the one-token block was bound by exactly that). A token's
 * arithmetic is the same in any TOK: the same sums in the same order. */
template <int HC, int TOK>
__global__ void __launch_bounds__(MIX_THREADS) hc_mix_kernel(float *pre, float *post, float *comb,
                                                             const float *x, const float *fn,
                                                             const float *base,
                                                             const float *scale, int T, int D,
                                                             float eps, float hc_eps, int iters)
{
    bt_grid_begin();
    constexpr int MIX = (2 + HC) * HC;
    __shared__ float red[32];
    __shared__ float part[MIX_THREADS / 32][TOK][MIX];
    __shared__ float m[TOK][MIX];
    const int t0 = blockIdx.x * TOK, n = HC * D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *xt[TOK];
    float r[TOK];
#pragma unroll
    for (int u = 0; u < TOK; u++) {
        xt[u] = x + (size_t)min(t0 + u, T - 1) * n; /* past T: a copy of the last, not stored */
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += MIX_THREADS) ss += xt[u][i] * xt[u][i];
        ss = bt_block_sum(ss, red);
        r[u] = 1.0f / sqrtf(ss / (float)n + eps);
    }
    float acc[TOK][MIX];
#pragma unroll
    for (int u = 0; u < TOK; u++)
#pragma unroll
        for (int k = 0; k < MIX; k++) acc[u][k] = 0.0f;
    for (int i = threadIdx.x; i < n; i += MIX_THREADS) {
        float v[TOK];
#pragma unroll
        for (int u = 0; u < TOK; u++) v[u] = xt[u][i] * r[u]; /* rounded per element, as the reference */
#pragma unroll
        for (int k = 0; k < MIX; k++) {
            const float f = fn[(size_t)k * n + i];
#pragma unroll
            for (int u = 0; u < TOK; u++) acc[u][k] += f * v[u];
        }
    }
#pragma unroll
    for (int u = 0; u < TOK; u++)
#pragma unroll
        for (int k = 0; k < MIX; k++) {
            float v = bt_warp_sum(acc[u][k]);
            if (lane == 0) part[warp][u][k] = v;
        }
    __syncthreads();
    for (int e = threadIdx.x; e < TOK * MIX; e += MIX_THREADS) {
        float v = 0.0f;
        for (int w = 0; w < MIX_THREADS / 32; w++) v += part[w][e / MIX][e % MIX];
        m[e / MIX][e % MIX] = v;
    }
    __syncthreads();
    if (warp < TOK && t0 + warp < T) /* a warp per token */
        hc_mix_finish<HC>(pre, post, comb, m[warp], base, scale, t0 + warp, hc_eps, iters);
}

/* Unsplit mixes (prefill, and decode without a workspace), hc * D a multiple of MT_KC: the
 * mixes as a tiled product of the rows [T, hc * D] and fn [MIX, hc * D]. A block takes MT_TOK
 * tokens (8, 16 or 32: the most that still fill the GPU); K goes through shared memory in
 * chunks of MT_KC (rows padded by 4 floats: conflict-free float4 loads) over a 3-stage cp.async
 * pipeline, each warp a slice of every chunk, each lane 4 float4 steps of MT_TOK / 8 tokens x
 * (MIX / 4) mixes. fn crosses L2 once per MT_TOK tokens; hc_mix_kernel (4 tokens a block, each
 * row read twice: its norm, then the mixes) took 0.53 ms at 4096 tokens where the rows alone
 * are 0.08 ms of bandwidth. The rows are mixed unnormalized and the sums scaled by the token's
 * 1 / rms after (as the split kernel does); every sum's order is fixed by its k, so a token's
 * mixes do not depend on T or on its place in the block. The tensor-core form (TC, below) takes
 * 5 stages: its products are cheap, and with 3 it waited on its loads (layer prefill mHC 1.30 ->
 * 1.12 ms on an H200 with 5, no gain with 3). */
enum { MT_KC = 128, MT_STRIDE = MT_KC + 4, MT_STAGES = 3, MT_TC_STAGES = 5 };

template <bool TC> __host__ __device__ constexpr int mt_stages()
{
    return TC ? MT_TC_STAGES : MT_STAGES;
}

template <int HC, int MT_TOK, bool TC> constexpr int mt_smem_bytes()
{
    return mt_stages<TC>() * (MT_TOK + (2 + HC) * HC) * MT_STRIDE * 4;
}

/* 3xTF32 on the tensor cores: a = hi + lo, hi the value rounded to tf32 (10 stored bits) and lo
 * the rest rounded again, so a b ~ lo_a hi_b + hi_a lo_b + hi_a hi_b with the products' error
 * near 2^-22 of a b: f32 accuracy at a third of the tensor cores' tf32 rate */
__device__ __forceinline__ void tf32_split(float v, uint32_t &hi, uint32_t &lo)
{
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(v));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(v - __uint_as_float(hi)));
}

__device__ __forceinline__ void mma_tf32(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* An m16n8k8 A fragment of f32 values v (rows g, g + 8, g, g + 8 of the lane's k c, c + 4)
 * split into its tf32 halves, and the values' squares added to the rows' sums ss0 (row g),
 * ss1 (row g + 8) */
__device__ __forceinline__ void tf32_split_a(const float *v, uint32_t *hi, uint32_t *lo, float &ss0,
                                             float &ss1)
{
#pragma unroll
    for (int e = 0; e < 4; e++)
        tf32_split(v[e], hi[e], lo[e]);
    ss0 = fmaf(v[2], v[2], fmaf(v[0], v[0], ss0));
    ss1 = fmaf(v[3], v[3], fmaf(v[1], v[1], ss1));
}

/* d += a b in 3xTF32 from split fragments (the small terms first) */
__device__ __forceinline__ void mma_3xtf32(float *d, const uint32_t *ah, const uint32_t *al,
                                           const uint32_t *bh, const uint32_t *bl)
{
    mma_tf32(d, al, bh[0], bh[1]);
    mma_tf32(d, ah, bl[0], bl[1]);
    mma_tf32(d, ah, bh[0], bh[1]);
}

/* a row's sum over the four lanes of its quad, (c0 + c1) + (c2 + c3) in every lane */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* TC: the products on the tensor cores (m16n8k8 tf32, 3xTF32), MT_TOK 16 or 32: a warp's
 * slice of a chunk is two k-steps of 8, its tokens 16-row tiles, the mixes 8-column tiles.
 * The kernel is then bound by its rows' bandwidth, where the f32 FMAs (!TC) were bound by the
 * shared-memory loads feeding them. Each sum's order is still fixed by its k and the token's
 * row alone, so a token's mixes keep their bits in any batch and either tile size. */
template <int HC, int MT_TOK, bool TC>
__global__ void __launch_bounds__(MIX_THREADS)
    hc_mix_tiles_kernel(float *pre, float *post, float *comb, const float *x, const float *fn,
                        const float *base, const float *scale, int T, int D, float eps,
                        float hc_eps, int iters)
{
    bt_grid_begin();
    constexpr int MIX = (2 + HC) * HC, MPL = (MIX + 3) / 4, TPL = MT_TOK / 8;
    constexpr int STAGE = (MT_TOK + MIX) * MT_STRIDE, WK = MT_KC / (MIX_THREADS / 32),
                  STAGES = mt_stages<TC>();
    extern __shared__ __align__(16) float mt_smem[];
    __shared__ float m[MT_TOK][MIX + 1];
    const int n = HC * D, t0 = blockIdx.x * MT_TOK, tid = threadIdx.x, lane = tid & 31;
    const int warp = tid >> 5, tg = lane >> 2, mg = lane & 3;
    auto load = [&](int ch) {
        float *sx = mt_smem + (ch % STAGES) * STAGE; /* the rows, then fn's */
        const int k0 = ch * MT_KC;
        for (int i = tid; i < (MT_TOK + MIX) * (MT_KC / 4); i += MIX_THREADS) {
            const int r = i / (MT_KC / 4), u = i % (MT_KC / 4);
            const float *src = r < MT_TOK ? x + (size_t)min(t0 + r, T - 1) * n /* past T: a copy */
                                          : fn + (size_t)(r - MT_TOK) * n;
            cp_async<16>(sx + r * MT_STRIDE + 4 * u, src + k0 + 4 * u, true);
        }
    };
    /* !TC: a lane's TPL tokens x MPL mixes; TC: a warp's [m tile][n tile] accumulators (token
     * g / g + 8, mixes 2c, 2c + 1 of the tile) and the sums of squares of tokens g, g + 8 */
    constexpr int MTL = TC ? MT_TOK / 16 : 1, NTL = TC ? (MIX + 7) / 8 : 1;
    static_assert(!TC || (MT_TOK % 16 == 0 && WK % 8 == 0), "16-token tiles, 8-k steps");
    float acc[TPL][MPL], ss[TPL];
    float tacc[MTL][NTL][4], tss[MTL][2];
#pragma unroll
    for (int j = 0; j < TPL; j++) {
        ss[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < MPL; i++)
            acc[j][i] = 0.0f;
    }
#pragma unroll
    for (int mt = 0; mt < MTL; mt++) {
        tss[mt][0] = tss[mt][1] = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NTL; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tacc[mt][nt][e] = 0.0f;
    }
    const int chunks = n / MT_KC;
#pragma unroll
    for (int ch = 0; ch < STAGES - 1; ch++) {
        if (ch < chunks) load(ch);
        cp_async_commit();
    }
    for (int ch = 0; ch < chunks; ch++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads(); /* chunk ch landed for all; the stage refilled next is read by none */
        if (ch + STAGES - 1 < chunks) load(ch + STAGES - 1);
        cp_async_commit();
        const float *sx = mt_smem + (ch % STAGES) * STAGE, *sf = sx + MT_TOK * MT_STRIDE;
        if constexpr (TC) {
            /* a chunk's products summed apart, then added in f32: the tensor cores' own
             * accumulation loses bits against a large running sum (10x the f32 path's error
             * when it carried the whole row) */
            float part[MTL][NTL][4];
#pragma unroll
            for (int mt = 0; mt < MTL; mt++)
#pragma unroll
                for (int nt = 0; nt < NTL; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        part[mt][nt][e] = 0.0f;
#pragma unroll
            for (int q = 0; q < WK / 8; q++) {
                const int k = warp * WK + 8 * q + mg;
                uint32_t bh[NTL][2], bl[NTL][2];
#pragma unroll
                for (int nt = 0; nt < NTL; nt++) {
                    const int mi = 8 * nt + tg;
                    tf32_split(mi < MIX ? sf[mi * MT_STRIDE + k] : 0.0f, bh[nt][0], bl[nt][0]);
                    tf32_split(mi < MIX ? sf[mi * MT_STRIDE + k + 4] : 0.0f, bh[nt][1], bl[nt][1]);
                }
#pragma unroll
                for (int mt = 0; mt < MTL; mt++) {
                    const float *r0 = sx + (16 * mt + tg) * MT_STRIDE + k, *r1 = r0 + 8 * MT_STRIDE;
                    const float v[4] = {r0[0], r1[0], r0[4], r1[4]};
                    uint32_t ah[4], al[4];
                    tf32_split_a(v, ah, al, tss[mt][0], tss[mt][1]);
#pragma unroll
                    for (int nt = 0; nt < NTL; nt++)
                        mma_3xtf32(part[mt][nt], ah, al, bh[nt], bl[nt]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MTL; mt++)
#pragma unroll
                for (int nt = 0; nt < NTL; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        tacc[mt][nt][e] += part[mt][nt][e];
        } else {
#pragma unroll
            for (int q = 0; q < WK / 4; q++) {
                const int k = warp * WK + 4 * q;
                float4 xv[TPL], fv[MPL];
#pragma unroll
                for (int j = 0; j < TPL; j++)
                    xv[j] = *(const float4 *)(sx + (TPL * tg + j) * MT_STRIDE + k);
#pragma unroll
                for (int i = 0; i < MPL; i++) {
                    const int mi = mg * MPL + i;
                    fv[i] = mi < MIX ? *(const float4 *)(sf + mi * MT_STRIDE + k)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int j = 0; j < TPL; j++) {
#pragma unroll
                    for (int i = 0; i < MPL; i++) {
                        float a = acc[j][i];
                        a = fmaf(fv[i].x, xv[j].x, a);
                        a = fmaf(fv[i].y, xv[j].y, a);
                        a = fmaf(fv[i].z, xv[j].z, a);
                        acc[j][i] = fmaf(fv[i].w, xv[j].w, a);
                    }
                    float s = ss[j];
                    s = fmaf(xv[j].x, xv[j].x, s);
                    s = fmaf(xv[j].y, xv[j].y, s);
                    s = fmaf(xv[j].z, xv[j].z, s);
                    ss[j] = fmaf(xv[j].w, xv[j].w, s);
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();      /* the pipeline's memory is the warps' partial sums now */
    float *red = mt_smem; /* [warp][token][MIX + 1] */
    if constexpr (TC) {
#pragma unroll
        for (int mt = 0; mt < MTL; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) { /* token g, then g + 8 of the tile */
                float *row = red + (warp * MT_TOK + 16 * mt + 8 * h + tg) * (MIX + 1);
#pragma unroll
                for (int nt = 0; nt < NTL; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (8 * nt + 2 * mg + e < MIX)
                            row[8 * nt + 2 * mg + e] = tacc[mt][nt][2 * h + e];
                const float v = quad_sum(tss[mt][h]); /* (the same order in every instance) */
                if (mg == 0) row[MIX] = v;
            }
    }
#pragma unroll
    for (int j = 0; j < (TC ? 0 : TPL); j++) {
        float *row = red + (warp * MT_TOK + TPL * tg + j) * (MIX + 1);
#pragma unroll
        for (int i = 0; i < MPL; i++)
            if (mg * MPL + i < MIX) row[mg * MPL + i] = acc[j][i];
        if (mg == 0) row[MIX] = ss[j];
    }
    __syncthreads();
    for (int e = tid; e < MT_TOK * (MIX + 1); e += MIX_THREADS) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < MIX_THREADS / 32; w++)
            v += red[w * MT_TOK * (MIX + 1) + e];
        m[e / (MIX + 1)][e % (MIX + 1)] = v;
    }
    __syncthreads();
    for (int u = warp; u < MT_TOK; u += MIX_THREADS / 32) {
        if (t0 + u >= T) break;
        const float r = 1.0f / sqrtf(m[u][MIX] / (float)n + eps);
        if (lane < MIX) m[u][lane] *= r;
        __syncwarp();
        hc_mix_finish<HC>(pre, post, comb, m[u], base, scale, t0 + u, hc_eps, iters);
    }
}

/* Few tokens (decode): one block per token streams all of fn ((2+hc)*hc rows of hc*D floats,
 * 2 MB at the real widths), at a block's bandwidth. Split instead: block (z, t) takes the
 * MIX_THREADS elements z*MIX_THREADS.. of the flattened streams and writes its partial
 * sum of squares and unnormalized mixes to work[(t * splits + z) * (MIX + 1)]; the finishing
 * kernel adds them up, so the mix is r * sum(fn x) where the one-block kernel sums fn (x r):
 * the same up to rounding. */
template <int HC>
__global__ void __launch_bounds__(MIX_THREADS) hc_mix_split_kernel(float *work, const float *x,
                                                                   const float *fn, int D,
                                                                   int splits)
{
    bt_grid_begin();
    constexpr int MIX = (2 + HC) * HC;
    __shared__ float part[MIX_THREADS / 32][MIX + 1];
    int z = blockIdx.x, t = blockIdx.y, n = HC * D, lane = threadIdx.x & 31,
        warp = threadIdx.x >> 5;
    int i = z * MIX_THREADS + threadIdx.x;
    float v = i < n ? x[(size_t)t * n + i] : 0.0f;
    float acc[MIX + 1];
#pragma unroll
    for (int k = 0; k < MIX; k++) acc[k] = i < n ? fn[(size_t)k * n + i] * v : 0.0f;
    acc[MIX] = v * v;
#pragma unroll
    for (int k = 0; k <= MIX; k++) {
        float a = bt_warp_sum(acc[k]);
        if (lane == 0) part[warp][k] = a;
    }
    __syncthreads();
    if (threadIdx.x <= MIX) {
        float a = 0.0f;
        for (int w = 0; w < MIX_THREADS / 32; w++) a += part[w][threadIdx.x];
        work[((size_t)t * splits + z) * (MIX + 1) + threadIdx.x] = a;
    }
}

/* hc_mix_split_kernel on the tensor cores: block (z, y) takes the same MIX_THREADS elements
 * z * MIX_THREADS.. for the 16 tokens 16y..16y + 15 at once (m16n8k8 tf32 in 3xTF32, as
 * hc_mix_tiles_kernel), each warp 32 of them in 4 k-steps, so fn's slice is read once for all
 * the tokens, not once per token (2 MB a token at the real widths), and a warp's 25 sums take
 * MMAs, not 25 five-shuffle reductions. A token's sums depend on its row and k alone: the
 * same bits in any batch. Writes the same partials as hc_mix_split_kernel. */
template <int HC>
__global__ void __launch_bounds__(MIX_THREADS)
    hc_mix_split_tc_kernel(float *work, const float *x, const float *fn, int T, int D, int splits)
{
    bt_grid_begin();
    constexpr int MIX = (2 + HC) * HC, NTL = (MIX + 7) / 8, WARPS = MIX_THREADS / 32;
    __shared__ float red[WARPS][16][MIX + 1];
    const int z = blockIdx.x, t0 = 16 * blockIdx.y, n = HC * D, lane = threadIdx.x & 31,
              warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int kw = z * MIX_THREADS + 32 * warp; /* the warp's 32 elements */
    /* every operand first (40 loads in flight), zeros past T, n and MIX */
    const float *x0 = x + (size_t)min(t0 + g, T - 1) * n,
                *x1 = x + (size_t)min(t0 + g + 8, T - 1) * n;
    const bool r0 = t0 + g < T, r1 = t0 + g + 8 < T;
    float av[4][4], bv[4][NTL][2];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int k = kw + 8 * q + c;
        const bool k0 = k < n, k4 = k + 4 < n;
        av[q][0] = r0 && k0 ? x0[k] : 0.0f;
        av[q][1] = r1 && k0 ? x1[k] : 0.0f;
        av[q][2] = r0 && k4 ? x0[k + 4] : 0.0f;
        av[q][3] = r1 && k4 ? x1[k + 4] : 0.0f;
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) {
            const int mi = 8 * nt + g;
            bv[q][nt][0] = mi < MIX && k0 ? fn[(size_t)mi * n + k] : 0.0f;
            bv[q][nt][1] = mi < MIX && k4 ? fn[(size_t)mi * n + k + 4] : 0.0f;
        }
    }
    float acc[NTL][4] = {}, ss0 = 0.0f, ss1 = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t ah[4], al[4];
        tf32_split_a(av[q], ah, al, ss0, ss1);
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) {
            uint32_t bh[2], bl[2];
            tf32_split(bv[q][nt][0], bh[0], bl[0]);
            tf32_split(bv[q][nt][1], bh[1], bl[1]);
            mma_3xtf32(acc[nt], ah, al, bh, bl);
        }
    }
    ss0 = quad_sum(ss0);
    ss1 = quad_sum(ss1);
#pragma unroll
    for (int nt = 0; nt < NTL; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int mi = 8 * nt + 2 * c + e;
            if (mi < MIX) {
                red[warp][g][mi] = acc[nt][e];
                red[warp][g + 8][mi] = acc[nt][2 + e];
            }
        }
    if (c == 0) red[warp][g][MIX] = ss0, red[warp][g + 8][MIX] = ss1;
    __syncthreads();
    for (int o = threadIdx.x; o < 16 * (MIX + 1); o += MIX_THREADS) {
        const int u = o / (MIX + 1), m = o % (MIX + 1);
        if (t0 + u >= T) continue;
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            a += red[w][u][m];
        work[((size_t)(t0 + u) * splits + z) * (MIX + 1) + m] = a;
    }
}

/* BT_CUDA_HCTC=0 keeps the mixes' products on f32 FMAs (for comparisons), read once */
static bool hc_tc_on(void)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_HCTC", &once);
}

/* the split mixes' partials: on the tensor cores (BT_CUDA_HCTC=0: a block a token) */
template <int H>
static void hc_mix_split_launch(float *work, const float *x, const float *fn, int T, int D,
                                int splits, cudaStream_t stream)
{
    if (hc_tc_on())
        bt__launch(hc_mix_split_tc_kernel<H>, dim3(splits, bt__cdiv(T, 16)), MIX_THREADS, 0, stream,
                   work, x, fn, T, D, splits);
    else
        bt__launch(hc_mix_split_kernel<H>, dim3(splits, T), MIX_THREADS, 0, stream, work, x, fn, D,
                   splits);
}

/* token t's fold, by the block's first FOLD_WARPS warps; every thread of the block calls it
 * (its barriers) */
template <int HC>
__device__ void hc_mix_fold(float *pre, float *post, float *comb, const float *work,
                            const float *base, const float *scale, int D, float eps,
                            float hc_eps, int iters, int splits, int t)
{
    constexpr int MIX = (2 + HC) * HC;
    __shared__ float part[FOLD_WARPS][MIX + 1], m[MIX + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* warp w adds splits w, w + FOLD_WARPS, ...; then the warps' sums in order (one lane
     * walking all ~80 splits was most of a decode step's fold) */
    if (warp < FOLD_WARPS && lane <= MIX) {
        float a = 0.0f;
        /* unrolled so the loads of several splits are in flight at once (the sum's order
         * is the same) */
#pragma unroll 4
        for (int z = warp; z < splits; z += FOLD_WARPS)
            a += work[((size_t)t * splits + z) * (MIX + 1) + lane];
        part[warp][lane] = a;
    }
    __syncthreads();
    if (threadIdx.x <= MIX) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < FOLD_WARPS; w++) a += part[w][threadIdx.x];
        m[threadIdx.x] = a;
    }
    __syncthreads();
    if (warp > 0) return; /* (no barriers below) */
    float r = 1.0f / sqrtf(m[MIX] / (float)(HC * D) + eps);
    if (threadIdx.x < MIX) m[threadIdx.x] *= r;
    __syncwarp();
    hc_mix_finish<HC>(pre, post, comb, m, base, scale, t, hc_eps, iters);
}

template <int HC>
__global__ void hc_mix_fold_kernel(float *pre, float *post, float *comb, const float *work,
                                   const float *base, const float *scale, int D, float eps,
                                   float hc_eps, int iters, int splits)
{
    bt_grid_begin();
    hc_mix_fold<HC>(pre, post, comb, work, base, scale, D, eps, hc_eps, iters, splits, blockIdx.x);
}

/* hc_mix_tiles_kernel's shared memory allowed, the tensor-core instances (5 stages: 148 KB at 32
 * tokens, over some GPUs' 99 KB) or the f32 ones, once a device */
template <int H, bool TC> static bool mt_allowed(void)
{
    static signed char a8[BT__MAX_DEVICES], a16[BT__MAX_DEVICES], a32[BT__MAX_DEVICES];
    if (TC) /* (both or neither: a token's bits must not depend on T) */
        return bt__smem_allowed((const void *)hc_mix_tiles_kernel<H, 16, true>,
                                mt_smem_bytes<H, 16, true>(), a16) &&
               bt__smem_allowed((const void *)hc_mix_tiles_kernel<H, 32, true>,
                                mt_smem_bytes<H, 32, true>(), a32);
    return bt__smem_allowed((const void *)hc_mix_tiles_kernel<H, 8, false>,
                            mt_smem_bytes<H, 8, false>(), a8) &&
           bt__smem_allowed((const void *)hc_mix_tiles_kernel<H, 16, false>,
                            mt_smem_bytes<H, 16, false>(), a16) &&
           bt__smem_allowed((const void *)hc_mix_tiles_kernel<H, 32, false>,
                            mt_smem_bytes<H, 32, false>(), a32);
}

/* split the mix when the tokens alone leave most of the GPU idle */
static int hc_splits(int T, int hc, int D)
{
    return T * 2 > 132 ? 1 : bt__cdiv((long long)hc * D, MIX_THREADS);
}

extern "C" size_t bt_cuda_hc_mix_ws_floats(int T, int hc, int D)
{
    int s = hc_splits(T, hc, D);
    return s > 1 ? (size_t)T * s * ((2 + hc) * hc + 1) : 0;
}

extern "C" bt_status_t bt_cuda_hc_mix_ws(float *pre, float *post, float *comb, const float *x,
                                         const float *fn, const float *base, const float *scale,
                                         int T, int hc, int D, float eps, float hc_eps, int iters,
                                         float *work, size_t work_floats, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(pre && post && comb && x && fn && base && scale);
    BT_CUDA_REQUIRE(T > 0 && D > 0 && iters >= 0);
    BT_CUDA_REQUIRE(hc == 1 || hc == 2 || hc == 4);
    int splits = hc_splits(T, hc, D);
    if (!work || work_floats < bt_cuda_hc_mix_ws_floats(T, hc, D)) splits = 1;
    with_hc(hc, [&](auto h) {
        constexpr int H = decltype(h)::value;
        if (splits > 1) {
            hc_mix_split_launch<H>(work, x, fn, T, D, splits, stream);
            bt__launch(hc_mix_fold_kernel<H>, T, FOLD_WARPS * 32, 0, stream, pre, post, comb, work,
                       base, scale, D, eps, hc_eps, iters, splits);
        } else if ((H * D) % MT_KC == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)fn % 16 == 0 &&
                   ((hc_tc_on() && mt_allowed<H, true>()) || mt_allowed<H, false>())) {
            /* (for any T: a token's mixes keep their bits in any batch) the most tokens a
             * block (32, 16, 8; on the tensor cores 32 or 16) that leave about 100 blocks or
             * more: the f32 form is bound by its shared-memory loads, which 32 tokens use best */
#define BT__MT(TOK, TC)                                                                            \
    bt__launch(hc_mix_tiles_kernel<H, TOK, TC>, bt__cdiv(T, TOK), MIX_THREADS,                     \
               mt_smem_bytes<H, TOK, TC>(), stream, pre, post, comb, x, fn, base, scale, T, D,     \
               eps, hc_eps, iters)
            const bool tc = hc_tc_on() && mt_allowed<H, true>();
            if (tc && T >= 32 * 100)
                BT__MT(32, true);
            else if (tc) /* (1024 tokens: 0.147 ms, where 32 a block took 0.197) */
                BT__MT(16, true);
            else if (T >= 32 * 100)
                BT__MT(32, false);
            else if (T >= 16 * 100)
                BT__MT(16, false);
            else
                BT__MT(8, false);
#undef BT__MT
        } else if (T >= 4 * 132) { /* four tokens a block still fill the GPU */
            bt__launch(hc_mix_kernel<H, 4>, bt__cdiv(T, 4), MIX_THREADS, 0, stream, pre, post, comb,
                       x, fn, base, scale, T, D, eps, hc_eps, iters);
        } else {
            bt__launch(hc_mix_kernel<H, 1>, T, MIX_THREADS, 0, stream, pre, post, comb, x, fn, base,
                       scale, T, D, eps, hc_eps, iters);
        }
    });
    return bt__cuda_launched("hc_mix");
}

extern "C" bt_status_t bt_cuda_hc_mix(float *pre, float *post, float *comb, const float *x,
                                      const float *fn, const float *base, const float *scale,
                                      int T, int hc, int D, float eps, float hc_eps, int iters,
                                      cudaStream_t stream)
{
    return bt_cuda_hc_mix_ws(pre, post, comb, x, fn, base, scale, T, hc, D, eps, hc_eps, iters,
                             NULL, 0, stream);
}

/* A block per token, HC_PER values a thread (up to 1024 threads), the collapsed row kept in
 * registers between the norm's sum and the store: one read of the streams (a decode step's
 * few blocks were latency-bound at 256 threads reading them twice). The stream count is a
 * template argument so a thread's HC_PER x HC loads are all issued before the first sum
 * (a loop over a runtime count left them one latency each). Past 1024 * HC_PER values the
 * rest is read again. */
enum { HC_PER = 8 };

/* The collapsed row's norm from its sum of squares over the block, and this thread's HC_PER
 * values of the row (at d = tid + i * blockDim.x, 0 past D) normed and stored; returns the
 * norm's factor */
template <typename OT>
__device__ __forceinline__ float collapse_store(OT *out, const float *v, const float *norm_w, int D,
                                                float eps, int t, float ss)
{
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
#pragma unroll
    for (int i = 0; i < HC_PER; i++) {
        const int d = threadIdx.x + i * blockDim.x;
        if (d < D) bt_st(out, (size_t)t * D + d, norm_w ? norm_w[d] * (v[i] * r) : v[i] * r);
    }
    return r;
}

template <int HC, typename OT>
__device__ void hc_collapse(OT *out, const float *x, const float *w, const float *norm_w, int D,
                            float eps, int t)
{
    __shared__ float red[32];
    const float *xt = x + (size_t)t * HC * D, *wt = w + (size_t)t * HC;
    float ws[HC], xv[HC_PER][HC], v[HC_PER], ss = 0.0f;
#pragma unroll
    for (int s = 0; s < HC; s++) ws[s] = wt[s];
#pragma unroll
    for (int i = 0; i < HC_PER; i++) {
        const int d = threadIdx.x + i * blockDim.x;
#pragma unroll
        for (int s = 0; s < HC; s++) xv[i][s] = d < D ? xt[(size_t)s * D + d] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < HC_PER; i++) {
        v[i] = 0.0f;
#pragma unroll
        for (int s = 0; s < HC; s++) v[i] += ws[s] * xv[i][s];
        ss += v[i] * v[i]; /* zero past D */
    }
    for (int d = threadIdx.x + HC_PER * blockDim.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < HC; s++) acc += ws[s] * xt[(size_t)s * D + d];
        ss += acc * acc;
    }
    const float r = collapse_store(out, v, norm_w, D, eps, t, bt_block_sum(ss, red));
    for (int d = threadIdx.x + HC_PER * blockDim.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < HC; s++) acc += ws[s] * xt[(size_t)s * D + d];
        bt_st(out, (size_t)t * D + d, norm_w ? norm_w[d] * (acc * r) : acc * r);
    }
}

template <int HC, typename OT>
__global__ void __launch_bounds__(1024) hc_collapse_kernel(OT *out, const float *x, const float *w,
                                                           const float *norm_w, int D, float eps)
{
    bt_grid_begin();
    hc_collapse<HC>(out, x, w, norm_w, D, eps, blockIdx.x);
}

/* A decode step's mix fold and the collapse beside it (which uses weights mixed earlier, not
 * these) in one launch: blocks [0, T) collapse, blocks [T, 2T) fold. */
template <int HC, typename OT>
__global__ void __launch_bounds__(1024) hc_fold_collapse_kernel(
    float *pre, float *post, float *comb, const float *work, const float *base,
    const float *scale, float mix_eps, float hc_eps, int iters, int splits, OT *out,
    const float *x, const float *w, const float *norm_w, int T, int D, float eps)
{
    bt_grid_begin();
    if (blockIdx.x < T)
        hc_collapse<HC>(out, x, w, norm_w, D, eps, blockIdx.x);
    else
        hc_mix_fold<HC>(pre, post, comb, work, base, scale, D, mix_eps, hc_eps, iters, splits,
                        blockIdx.x - T);
}

/* the collapse's threads: D / HC_PER rounded up to warps, from the fold's FOLD_WARPS warps
 * (the fused launch's fold blocks need them; the norm's sum is split the same way in either
 * launch, so both give the same bits) to 1024 */
static int collapse_threads(int D)
{
    int threads = (bt__cdiv(D, HC_PER) + 31) / 32 * 32;
    return threads > 1024 ? 1024 : threads < FOLD_WARPS * 32 ? FOLD_WARPS * 32 : threads;
}

extern "C" bt_status_t bt_cuda_hc_collapse_norm(void *out, bt_cuda_dtype_t out_dtype,
                                                const float *x, const float *w,
                                                const float *norm_w, int T, int hc, int D,
                                                float eps, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && x && w && bt__dtype_ok(out_dtype));
    BT_CUDA_REQUIRE(T > 0 && D > 0 && (hc == 1 || hc == 2 || hc == 4));
    const int threads = collapse_threads(D);
    with_hc(hc, [&](auto h) {
        with_dtype(out, out_dtype, [&](auto *o) {
            bt__launch(hc_collapse_kernel<decltype(h)::value, std::remove_pointer_t<decltype(o)>>,
                       T, threads, 0, stream, o, x, w, norm_w, D, eps);
        });
    });
    return bt__cuda_launched("hc_collapse_norm");
}

extern "C" bt_status_t bt_cuda_hc_mix_collapse_ws(
    float *pre, float *post, float *comb, const float *x, const float *fn, const float *base,
    const float *scale, int T, int hc, int D, float mix_eps, float hc_eps, int iters,
    float *work, size_t work_floats, void *out, bt_cuda_dtype_t out_dtype, const float *w,
    const float *norm_w, float eps, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(pre && post && comb && x && fn && base && scale && out && w);
    /* (the collapse's weights are earlier ones: the fold writes pre, post and comb beside it) */
    BT_CUDA_REQUIRE(w != pre && w != post && w != comb);
    BT_CUDA_REQUIRE(T > 0 && D > 0 && iters >= 0 && bt__dtype_ok(out_dtype));
    BT_CUDA_REQUIRE(hc == 1 || hc == 2 || hc == 4);
    int splits = hc_splits(T, hc, D);
    if (splits == 1 || !work || work_floats < bt_cuda_hc_mix_ws_floats(T, hc, D)) {
        /* (no split: the mix is one launch of its own) */
        bt_status_t st = bt_cuda_hc_mix_ws(pre, post, comb, x, fn, base, scale, T, hc, D,
                                           mix_eps, hc_eps, iters, work, work_floats, stream);
        if (st != BT_OK) return st;
        return bt_cuda_hc_collapse_norm(out, out_dtype, x, w, norm_w, T, hc, D, eps, stream);
    }
    const int threads = collapse_threads(D);
    with_hc(hc, [&](auto h) {
        constexpr int H = decltype(h)::value;
        hc_mix_split_launch<H>(work, x, fn, T, D, splits, stream);
        with_dtype(out, out_dtype, [&](auto *o) {
            bt__launch(hc_fold_collapse_kernel<H, std::remove_pointer_t<decltype(o)>>, 2 * T,
                       threads, 0, stream, pre, post, comb, work, base, scale, mix_eps, hc_eps,
                       iters, splits, o, x, w, norm_w, T, D, eps);
        });
    });
    return bt__cuda_launched("hc_mix_collapse");
}

/* token t's value d of the streams expanded with the sublayer's output value ov */
template <int HC>
__device__ __forceinline__ void hc_expand_at(float *x, const float *post, const float *comb,
                                             size_t t, int d, int D, float ov)
{
    float *xt = x + t * HC * D;
    const float *ct = comb + t * HC * HC, *pt = post + t * HC;
    float res[HC];
#pragma unroll
    for (int j = 0; j < HC; j++)
        res[j] = xt[(size_t)j * D + d];
#pragma unroll
    for (int k = 0; k < HC; k++) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < HC; j++) acc += ct[j * HC + k] * res[j];
        xt[(size_t)k * D + d] = pt[k] * ov + acc;
    }
}

template <int HC, typename OT>
__global__ void hc_expand_kernel(float *x, const OT *o, const float *post, const float *comb, int T,
                                 int D)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * D) return;
    hc_expand_at<HC>(x, post, comb, i / D, (int)(i % D), D, bt_ld(o, i));
}

extern "C" bt_status_t bt_cuda_hc_expand(float *x, const void *o, bt_cuda_dtype_t o_dtype,
                                         const float *post, const float *comb, int T, int hc,
                                         int D, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && o && post && comb && bt__dtype_ok(o_dtype));
    BT_CUDA_REQUIRE(T > 0 && D > 0 && (hc == 1 || hc == 2 || hc == 4));
    int blocks = bt__cdiv((long long)T * D, 256);
    with_hc(hc, [&](auto h) {
        with_dtype(const_cast<void *>(o), o_dtype,
                   [&](auto *ov) { /* (read only) */
                                   bt__launch(hc_expand_kernel<decltype(h)::value,
                                                               std::remove_pointer_t<decltype(ov)>>,
                                              blocks, 256, 0, stream, x, ov, post, comb, T, D);
                   });
    });
    return bt__cuda_launched("hc_expand");
}

/* ---- the MoE's combine in the expand (a decode step) ----------------------------------------
 * The FFN's output is the sum of a token's routed rows and the shared expert's (moe_combine);
 * here each value of it is summed where the expand reads it, so the decode's chain loses the
 * combine's launch and its round trip through memory. The sum is moe_combine's (bt_moe_sum:
 * routed rows as listed, the shared row last), and the expand hc_expand_kernel's
 * (hc_expand_at): the streams are the two launches' bits. */
template <int HC>
__global__ void hc_expand_moe_kernel(float *x, const float *y, const int32_t *rows,
                                     const int32_t *n, int stride, const float *shared,
                                     const float *post, const float *comb, int T, int D)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * D) return;
    size_t t = i / D;
    int d = (int)(i % D);
    const float ov =
        bt_moe_sum(y, rows + t * (size_t)stride, n[t], shared ? shared + t * D : NULL, D, d);
    hc_expand_at<HC>(x, post, comb, t, d, D, ov);
}

extern "C" bt_status_t bt_cuda_hc_expand_moe(float *x, const float *y, const int32_t *rows,
                                             const int32_t *n, int stride, const float *shared,
                                             const float *post, const float *comb, int T, int hc,
                                             int D, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && rows && n && post && comb && stride >= 0);
    BT_CUDA_REQUIRE(T > 0 && D > 0 && (hc == 1 || hc == 2 || hc == 4));
    int blocks = bt__cdiv((long long)T * D, 256);
    with_hc(hc, [&](auto h) {
        bt__launch(hc_expand_moe_kernel<decltype(h)::value>, blocks, 256, 0, stream, x, y, rows, n,
                   stride, shared, post, comb, T, D);
    });
    return bt__cuda_launched("hc_expand_moe");
}

/* BT_CUDA_EXPAND_MOE=0: callers combine and expand in two launches (comparisons), read once */
extern "C" int bt_cuda_hc_expand_moe_on(void)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_EXPAND_MOE", &once);
}

/* ---- a sublayer's expand and the next site's collapse, in one pass ----------------------------
 * The collapse's norm needs the whole row, so it had to be a launch after the expand's: a
 * prefill paid for a second read of the streams (hc x 4 bytes a value: 335 MB a site at 4096
 * tokens). Here a block a token expands each value and collapses it while it is in registers,
 * with hc_expand_kernel's arithmetic and hc_collapse's thread layout (its HC_PER values at d =
 * tid + i * threads, the norm's sum by bt_block_sum), so the streams and the output are bit for
 * bit those of the two launches. For any T; the callers keep the two launches for a decode
 * batch (BT_CUDA_HC_EC_MIN_TOKENS). */

/* token t's values for thread tid: the expand stored, v[i] the collapsed values (0 past D),
 * the sum of their squares returned */
template <int HC, typename IT>
__device__ __forceinline__ float ec_values(float *x, const IT *o, const float *post,
                                           const float *comb, const float *w, int D, int t,
                                           float *v)
{
    const int threads = blockDim.x;
    float *xt = x + (size_t)t * HC * D;
    const float *ct = comb + (size_t)t * HC * HC, *pt = post + (size_t)t * HC,
                *wt = w + (size_t)t * HC;
    float xv[HC_PER][HC], ov[HC_PER], ws[HC];
#pragma unroll
    for (int i = 0; i < HC_PER; i++) {
        const int d = threadIdx.x + i * threads;
#pragma unroll
        for (int s = 0; s < HC; s++)
            xv[i][s] = d < D ? xt[(size_t)s * D + d] : 0.0f;
        ov[i] = d < D ? bt_ld(o, (size_t)t * D + d) : 0.0f;
    }
#pragma unroll
    for (int s = 0; s < HC; s++)
        ws[s] = wt[s];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < HC_PER; i++) {
        const int d = threadIdx.x + i * threads;
        v[i] = 0.0f;
        if (d >= D) continue; /* (zero, as the collapse's loads past D give) */
        float xn[HC];
#pragma unroll
        for (int k = 0; k < HC; k++) { /* hc_expand_kernel */
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < HC; j++)
                acc += ct[j * HC + k] * xv[i][j];
            xn[k] = pt[k] * ov[i] + acc;
            xt[(size_t)k * D + d] = xn[k];
        }
#pragma unroll
        for (int s = 0; s < HC; s++)
            v[i] += ws[s] * xn[s]; /* hc_collapse */
        ss += v[i] * v[i];
    }
    return ss;
}

template <int HC, typename IT, typename OT>
__global__ void __launch_bounds__(1024)
    hc_expand_collapse_kernel(float *x, const IT *o, const float *post, const float *comb, OT *out,
                              const float *w, const float *norm_w, int D, float eps)
{
    bt_grid_begin();
    __shared__ float red[32];
    float v[HC_PER];
    const int t = blockIdx.x;
    const float ss = ec_values<HC>(x, o, post, comb, w, D, t, v);
    collapse_store(out, v, norm_w, D, eps, t, bt_block_sum(ss, red));
}

/* BT_CUDA_HC_EC=0: the expand and the collapse as two launches for any T (for comparisons),
 * read once */
static bool hc_ec_on(void)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_HC_EC", &once);
}

extern "C" bt_status_t bt_cuda_hc_expand_collapse(float *x, const void *o, bt_cuda_dtype_t o_dtype,
                                                  const float *post, const float *comb, void *out,
                                                  bt_cuda_dtype_t out_dtype, const float *w,
                                                  const float *norm_w, int T, int hc, int D,
                                                  float eps, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && o && post && comb && out && w && bt__dtype_ok(o_dtype) &&
                    bt__dtype_ok(out_dtype));
    BT_CUDA_REQUIRE(T > 0 && D > 0 && (hc == 1 || hc == 2 || hc == 4));
    const int threads = collapse_threads(D);
    /* (past HC_PER * 1024 values the collapse reads the rest again) */
    if (!hc_ec_on() || D > HC_PER * threads) {
        bt_status_t st = bt_cuda_hc_expand(x, o, o_dtype, post, comb, T, hc, D, stream);
        if (st != BT_OK) return st;
        return bt_cuda_hc_collapse_norm(out, out_dtype, x, w, norm_w, T, hc, D, eps, stream);
    }
    with_hc(hc, [&](auto h) {
        constexpr int H = decltype(h)::value;
        /* (o is only read) */
        with_dtype(const_cast<void *>(o), o_dtype, [&](auto *ov) {
            with_dtype(out, out_dtype, [&](auto *op) {
                using IT = std::remove_pointer_t<decltype(ov)>;
                using OT = std::remove_pointer_t<decltype(op)>;
                bt__launch(hc_expand_collapse_kernel<H, IT, OT>, T, threads, 0, stream, x,
                           (const IT *)ov, post, comb, op, w, norm_w, D, eps);
            });
        });
    });
    return bt__cuda_launched("hc_expand_collapse");
}

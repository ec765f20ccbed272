/* The sparse-attention indexer: scores of one query row per token against the index keys,
 * and the top-k of each row (radix select, then the picks written in index order). */
#include "kernels/cuda/common.cuh"

enum { IX_KEYS = 128, IX_DCHUNK = 32, IX_MAXH = 32, IX_MAXD = 128 };

/* block = (128 keys, one token); the token's queries in shared memory, the keys staged 32
 * dims at a time; a thread owns one key and accumulates every head. */
__global__ void __launch_bounds__(IX_KEYS) index_scores_kernel(float *scores, const float *q,
                                                               const float *w, const float *keys,
                                                               const int64_t *visible, int heads,
                                                               int dim, int n,
                                                               const int64_t *key_off,
                                                               const int32_t *n_keys)
{
    bt_grid_begin();
    __shared__ float sq[IX_MAXH * IX_MAXD];
    __shared__ float sk[IX_KEYS][IX_DCHUNK + 1];
    int t = blockIdx.y, j0 = blockIdx.x * IX_KEYS, j = j0 + threadIdx.x;
    int64_t vis = visible[t];
    if (key_off) { /* the token's own key set (a batch of sequences in one launch) */
        keys += key_off[t];
        if (vis > n_keys[t]) vis = n_keys[t];
    }
    if (vis > n) vis = n; /* keys are read below vis only */
    float *srow = scores + (size_t)t * n;
    if (j0 >= vis) { /* the whole tile is invisible */
        if (j < n) srow[j] = -INFINITY;
        return;
    }
    for (int i = threadIdx.x; i < heads * dim; i += IX_KEYS) sq[i] = q[(size_t)t * heads * dim + i];
    float acc[IX_MAXH];
#pragma unroll
    for (int h = 0; h < IX_MAXH; h++) acc[h] = 0.0f;
    for (int d0 = 0; d0 < dim; d0 += IX_DCHUNK) {
        int dc = min(IX_DCHUNK, dim - d0);
        __syncthreads();
        for (int e = threadIdx.x; e < IX_KEYS * IX_DCHUNK; e += IX_KEYS) {
            int r = e / IX_DCHUNK, c = e % IX_DCHUNK, jj = j0 + r;
            sk[r][c] = (jj < vis && c < dc) ? keys[(size_t)jj * dim + d0 + c] : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < dc; c++) {
            float kv = sk[threadIdx.x][c];
#pragma unroll
            for (int h = 0; h < IX_MAXH; h++)
                if (h < heads) acc[h] += sq[h * dim + d0 + c] * kv;
        }
    }
    if (j >= n) return;
    if (j >= vis) {
        srow[j] = -INFINITY;
        return;
    }
    float scale = 1.0f / sqrtf((float)dim), s = 0.0f;
    const float *wt = w + (size_t)t * heads;
#pragma unroll
    for (int h = 0; h < IX_MAXH; h++)
        if (h < heads) s += (fmaxf(acc[h], 0.0f) * scale) * wt[h];
    srow[j] = s;
}

/* Both f32 scorers: key_off / n_keys NULL (every token against the same keys) or given. */
static bt_status_t index_scores_launch(float *scores, const float *q, const float *w,
                                       const float *keys, const int64_t *key_off,
                                       const int32_t *n_keys, const int64_t *visible, int T,
                                       int heads, int dim, int n, cudaStream_t stream,
                                       const char *what)
{
    BT_CUDA_REQUIRE(scores && q && w && keys && visible);
    BT_CUDA_REQUIRE(T > 0 && n > 0 && heads > 0 && heads <= IX_MAXH && dim > 0);
    BT_CUDA_REQUIRE(heads * dim <= IX_MAXH * IX_MAXD);
    dim3 grid(bt__cdiv(n, IX_KEYS), T);
    bt__launch(index_scores_kernel, grid, IX_KEYS, 0, stream, scores, q, w, keys, visible, heads,
               dim, n, key_off, n_keys);
    return bt__cuda_launched(what);
}

extern "C" bt_status_t bt_cuda_index_scores(float *scores, const float *q, const float *w,
                                            const float *keys, const int64_t *visible, int T,
                                            int heads, int dim, int n, cudaStream_t stream)
{
    return index_scores_launch(scores, q, w, keys, NULL, NULL, visible, T, heads, dim, n, stream,
                               "index_scores");
}

extern "C" bt_status_t bt_cuda_index_scores_sets(float *scores, const float *q, const float *w,
                                                 const float *keys, const int64_t *key_off,
                                                 const int32_t *n_keys, const int64_t *visible,
                                                 int T, int heads, int dim, int n,
                                                 cudaStream_t stream)
{
    BT_CUDA_REQUIRE(key_off && n_keys);
    return index_scores_launch(scores, q, w, keys, key_off, n_keys, visible, T, heads, dim, n,
                               stream, "index_scores_sets");
}

/* ---- the same on the tensor cores ------------------------------------------------------- */

/* The keys a block's tokens t0 .. t0 + tokens - 1 see, each clipped to its key set (n_keys[t]
 * when key_off is given) and to n, into vis_s (by thread 0; read after a barrier), and their
 * most: 0 for tokens past T. (The tensor-core scorers' first step.) */
__device__ __forceinline__ int64_t ix_block_visible(int64_t *vis_s, int t0, int tokens, int T,
                                                    const int64_t *visible, const int64_t *key_off,
                                                    const int32_t *n_keys, int n)
{
    int64_t vmax = 0;
    for (int i = 0; i < tokens; i++) {
        const int t = t0 + i;
        int64_t v = 0;
        if (t < T) {
            v = visible[t];
            if (key_off && v > n_keys[t]) v = n_keys[t];
            if (v > n) v = n;
        }
        if (threadIdx.x == 0) vis_s[i] = v;
        if (v > vmax) vmax = v;
    }
    return vmax;
}

#include <mma.h>

enum { IXT_KEYS = 128, IXT_HEADS = 32, IXT_PAD = 8, IXT_WARPS = 8 };

/* block = (TOK tokens, KT tiles of 128 keys): rows r = token * 32 + head of Q [TOK*32, dim],
 * rounded to bf16 into shared memory once, then per key tile the keys [128, dim] (rounded
 * likewise); S = Q . K^T by 16x16x16 MMAs, warp w owning TOK*2 of its tiles; S (over the keys'
 * bytes; the queries' too when KT is 1) is reduced over the heads: score = sum_h w[t,h] *
 * relu(S) * dim^-0.5, in head order as the f32 kernel adds. TOK = 4 when tokens share the keys,
 * with KT = 4 when that leaves enough blocks (prefill: the queries cross L2 once per 512 keys,
 * not per 128); TOK = KT = 1 when each token has its own set (decode batch). A score is the
 * same in any instance. Rows load 4 floats at a time when dim allows. */
template <int TOK, int KT>
__global__ void __launch_bounds__(IXT_WARPS * 32) index_scores_tc_kernel(
    float *scores, const float *q, const float *w, const float *keys, const int64_t *visible,
    int T, int heads, int dim, int n, const int64_t *key_off, const int32_t *n_keys)
{
    bt_grid_begin();
    using namespace nvcuda;
    enum { ROWS = TOK * IXT_HEADS, TILES = ROWS / 16 * (IXT_KEYS / 16), PER = TILES / IXT_WARPS };
    extern __shared__ __align__(128) unsigned char smem[];
    const int dp = (dim + 15) / 16 * 16, ld = dp + IXT_PAD, lds = IXT_KEYS + 4;
    __nv_bfloat16 *sq = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sk = sq + (size_t)ROWS * ld;
    /* S after the products: over the keys (enough for it when KT > 1, see ixt_smem) */
    float *ss = KT > 1 ? (float *)sk : (float *)smem;
    __shared__ int64_t vis_s[TOK];
    __shared__ float w_s[TOK][IXT_HEADS];

    const int t0 = blockIdx.y * TOK, tid = threadIdx.x;
    const int warp = tid >> 5;
    if (key_off) keys += key_off[t0]; /* TOK == 1 */
    /* 16-byte row loads where every row is 16-byte aligned */
    const bool vec = dim % 4 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)keys % 16 == 0;
    const int64_t vmax = ix_block_visible(vis_s, t0, TOK, T, visible, key_off, n_keys, n);
    /* nr rows of a [*, dim] f32 matrix into bf16 rows of sm; zeros past `valid` rows and past
     * dim (element e's row and column advance by constant steps: a division per element by
     * the run-time row width was a large share of the kernel's instructions) */
    constexpr int NT = IXT_WARPS * 32;
    auto stage = [&](__nv_bfloat16 *sm, const float *src, int nr, int valid) {
        if (vec) {
            const int q4 = dp / 4, dr = NT / q4, dc = NT % q4;
            int r = tid / q4, c4 = tid % q4;
            for (int e = tid; e < nr * q4; e += NT) {
                const int c = c4 * 4;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (r < valid && c < dim) v = *(const float4 *)(src + (size_t)r * dim + c);
                __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
                *(uint2 *)(sm + (size_t)r * ld + c) = make_uint2(*(unsigned *)&lo, *(unsigned *)&hi);
                r += dr;
                c4 += dc;
                if (c4 >= q4) c4 -= q4, r++;
            }
        } else {
            const int dr = NT / dp, dc = NT % dp;
            int r = tid / dp, c = tid % dp;
            for (int e = tid; e < nr * dp; e += NT) {
                float v = r < valid && c < dim ? src[(size_t)r * dim + c] : 0.0f;
                sm[(size_t)r * ld + c] = __float2bfloat16_rn(v);
                r += dr;
                c += dc;
                if (c >= dp) c -= dp, r++;
            }
        }
    };
    bool q_staged = false;
    for (int kt = 0; kt < KT; kt++) {
        const int j0 = (blockIdx.x * KT + kt) * IXT_KEYS;
        if (j0 >= n) break; /* block-uniform */
        if (j0 >= vmax) { /* the whole tile is invisible to every token of the block */
            for (int e = tid; e < TOK * IXT_KEYS; e += IXT_WARPS * 32) {
                int i = e / IXT_KEYS, j = j0 + e % IXT_KEYS;
                if (t0 + i < T && j < n) scores[(size_t)(t0 + i) * n + j] = -INFINITY;
            }
            continue;
        }
        if (!q_staged) {
            /* the token rows: heads past `heads` and tokens past T are zeros */
            for (int i = 0; i < TOK; i++) {
                const int t = t0 + i;
                stage(sq + (size_t)i * IXT_HEADS * ld, q + (size_t)(t < T ? t : 0) * heads * dim,
                      IXT_HEADS, t < T ? heads : 0);
            }
            for (int e = tid; e < TOK * IXT_HEADS; e += IXT_WARPS * 32) {
                int i = e / IXT_HEADS, h = e % IXT_HEADS, t = t0 + i;
                w_s[i][h] = t < T && h < heads ? w[(size_t)t * heads + h] : 0.0f;
            }
            q_staged = true;
        }
        int kv = (int)(vmax - j0 < IXT_KEYS ? vmax - j0 : IXT_KEYS);
        stage(sk, keys + (size_t)j0 * dim, IXT_KEYS, kv);
        __syncthreads();

        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PER];
#pragma unroll
        for (int f = 0; f < PER; f++) wmma::fill_fragment(acc[f], 0.0f);
        /* the warp's tiles share one row tile: (warp * PER) / 8 */
        const int rt = warp * PER / (IXT_KEYS / 16), ct0 = warp * PER % (IXT_KEYS / 16);
        for (int k = 0; k < dp; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::load_matrix_sync(a, sq + (size_t)rt * 16 * ld + k, ld);
#pragma unroll
            for (int f = 0; f < PER; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                wmma::load_matrix_sync(b, sk + (size_t)(ct0 + f) * 16 * ld + k, ld);
                wmma::mma_sync(acc[f], a, b, acc[f]);
            }
        }
        __syncthreads(); /* the operands' bytes become S */
#pragma unroll
        for (int f = 0; f < PER; f++)
            wmma::store_matrix_sync(ss + (size_t)rt * 16 * lds + (ct0 + f) * 16, acc[f], lds,
                                    wmma::mem_row_major);
        __syncthreads();
        const float scale = 1.0f / sqrtf((float)dim);
        for (int e = tid; e < TOK * IXT_KEYS; e += IXT_WARPS * 32) {
            int i = e / IXT_KEYS, jj = e % IXT_KEYS, j = j0 + jj, t = t0 + i;
            if (t >= T || j >= n) continue;
            float s = 0.0f;
            for (int h = 0; h < heads; h++)
                s += (fmaxf(ss[(size_t)(i * IXT_HEADS + h) * lds + jj], 0.0f) * scale) * w_s[i][h];
            scores[(size_t)t * n + j] = j < vis_s[i] ? s : -INFINITY;
        }
        __syncthreads(); /* S is read before the next tile's keys land over it */
    }
}

/* Q [TOK*32] and keys [128] rows of dim (padded) bf16; S [TOK*32][132] f32 over the keys when
 * KT > 1 (the queries stay for the next tile), else over both */
template <int TOK, int KT> static size_t ixt_smem(int dim)
{
    size_t row = (size_t)((dim + 15) / 16 * 16 + IXT_PAD) * 2;
    size_t q = (size_t)TOK * IXT_HEADS * row, k = (size_t)IXT_KEYS * row;
    size_t s = (size_t)TOK * IXT_HEADS * (IXT_KEYS + 4) * 4;
    if (KT > 1) return q + (k > s ? k : s);
    return q + k > s ? q + k : s;
}

/* ---- the same on Hopper's warpgroup MMAs ------------------------------------------------ */

#include "kernels/cuda/wgmma.cuh"

/* index_scores_wg: S^T = K . Q^T on wgmma, both operands in shared memory: A = a step's 64
 * keys (the MMA's M), B = a warpgroup's TOKW tokens x 32 heads (N = 32 TOKW), K = the head dim
 * in KH halves of 64 (zeros past dim). The sum over the heads stays in registers: a thread
 * holds 8 heads of each of its tokens for two keys and adds w_h relu(S) over them; the four
 * lanes of a key row then add theirs as (c0 + c1) + (c2 + c3), in every instance, so a score
 * does not depend on the launch that computed it (batched decode against one sequence's).
 * WGS warpgroups a block share each step's keys, which all threads convert f32 -> bf16 into a
 * two-stage ring: the next step's are stored while this step's MMAs run, the one after's are
 * loaded into registers. Where index_scores_tc staged f32 keys per 128-key tile for 4 tokens
 * and summed the heads through shared memory, a block here holds 16 tokens (prefill). */
enum { IXW_KEYS = 64, IXW_HEADS = 32 };

#ifdef BT_WGMMA
__device__ int ixwg_built = 1;
#else
__device__ int ixwg_built = 0;
#endif

template <int TOKW, int WGS, int KH> struct ixw_shape {
    enum {
        THREADS = 128 * WGS,
        ROWS = IXW_HEADS * TOKW, /* a warpgroup's Q rows: the MMA's N */
        Q_HALF = ROWS * 128,     /* bytes of 64 dims of them */
        Q_BYTES = WGS * KH * Q_HALF,
        K_HALF = IXW_KEYS * 128,
        K_STAGE = KH * K_HALF,
        UNITS = IXW_KEYS * KH * 8,          /* a step's 16-byte units of keys */
        UPT = UNITS / THREADS,              /* ... a thread's */
        SMEM = Q_BYTES + 2 * K_STAGE + 1024 /* + alignment to 1024 bytes */
    };
    static_assert(UNITS % THREADS == 0, "whole units a thread");
};

struct ixw_f8 {
    float4 a, b;
};

/* floats d0..d0 + 7 of a row (zeros past dim; all zeros when !ok); vec: 16-byte loads (dim a
 * multiple of 4, rows 16-byte aligned) */
__device__ __forceinline__ ixw_f8 ixw_fetch(const float *row, int d0, int dim, bool ok, bool vec)
{
    ixw_f8 v;
    v.a = v.b = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!ok) return v;
    if (vec) {
        if (d0 < dim) v.a = *(const float4 *)(row + d0);
        if (d0 + 4 < dim) v.b = *(const float4 *)(row + d0 + 4);
    } else {
        float t[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            t[i] = d0 + i < dim ? row[d0 + i] : 0.0f;
        v.a = make_float4(t[0], t[1], t[2], t[3]);
        v.b = make_float4(t[4], t[5], t[6], t[7]);
    }
    return v;
}

__device__ __forceinline__ uint4 ixw_pack(ixw_f8 v)
{
    __nv_bfloat162 p0 = __floats2bfloat162_rn(v.a.x, v.a.y),
                   p1 = __floats2bfloat162_rn(v.a.z, v.a.w);
    __nv_bfloat162 p2 = __floats2bfloat162_rn(v.b.x, v.b.y),
                   p3 = __floats2bfloat162_rn(v.b.z, v.b.w);
    return make_uint4(*(unsigned *)&p0, *(unsigned *)&p1, *(unsigned *)&p2, *(unsigned *)&p3);
}

/* grid (key ranges of tiles_per_block steps, token groups of TOKW * WGS); key_off: TOKW * WGS
 * is 1 */
template <int TOKW, int WGS, int KH>
__global__ void __launch_bounds__(128 * WGS)
    index_scores_wg(float *scores, const float *q, const float *w, const float *keys,
                    const int64_t *visible, int T, int heads, int dim, int n,
                    const int64_t *key_off, const int32_t *n_keys, int tiles_per_block)
{
#ifdef BT_WGMMA
    using S = ixw_shape<TOKW, WGS, KH>;
    constexpr int TB = TOKW * WGS; /* a block's tokens */
    bt_grid_begin();
    extern __shared__ __align__(128) unsigned char ixw_smem[];
    __shared__ __align__(16) float w_s[TB][IXW_HEADS]; /* (read as float2) */
    __shared__ int64_t vis_s[TB];
    /* from a 1024-byte boundary: the swizzle's */
    unsigned char *smem =
        ixw_smem + ((1024 - ((uint32_t)__cvta_generic_to_shared(ixw_smem) & 1023)) & 1023);
    unsigned char *sq = smem, *sk = smem + S::Q_BYTES;
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, c = lane & 3;
    /* (the warpgroup through a shuffle: uniform to the compiler, so the MMAs' descriptors are
     * built in uniform registers, not moved there before every MMA) */
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;
    const int t0 = blockIdx.y * TB;
    if (key_off) keys += key_off[t0];
    const int64_t vmax = ix_block_visible(vis_s, t0, TB, T, visible, key_off, n_keys, n);
    /* the block's keys [js, je); steps over [js, jv), which some token sees */
    const int js = blockIdx.x * tiles_per_block * IXW_KEYS;
    const int je = min(n, js + tiles_per_block * IXW_KEYS);
    const int jv = (int)(vmax < je ? vmax : je);
    const int steps = jv > js ? (jv - js + IXW_KEYS - 1) / IXW_KEYS : 0;
    const int jc = min(je, js + steps * IXW_KEYS), nf = je - jc;
    for (int e = tid; e < TB * nf; e += S::THREADS) { /* keys past the steps: seen by none */
        const int i = e / nf, j = jc + e % nf;
        if (t0 + i < T) scores[(size_t)(t0 + i) * n + j] = -INFINITY;
    }
    if (steps == 0) return; /* (the whole block) */

    const bool vec = dim % 4 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)keys % 16 == 0;
    /* the Q rows (warpgroup, token, head): zeros for heads past `heads` and tokens past T */
    for (int e = tid; e < WGS * S::ROWS * KH * 8; e += S::THREADS) {
        const int u = e & 7, hf = (e >> 3) % KH, r = (e >> 3) / KH;
        const int wr = r / S::ROWS, rr = r % S::ROWS, h = rr % IXW_HEADS;
        const int t = t0 + wr * TOKW + rr / IXW_HEADS;
        const bool ok = t < T && h < heads;
        const float *row = q + ((size_t)(ok ? t : 0) * heads + (ok ? h : 0)) * dim;
        *(uint4 *)(sq + (wr * KH + hf) * S::Q_HALF + wg_sw(rr, u)) =
            ixw_pack(ixw_fetch(row, hf * 64 + 8 * u, dim, ok, vec));
    }
    for (int e = tid; e < TB * IXW_HEADS; e += S::THREADS) {
        const int i = e / IXW_HEADS, h = e % IXW_HEADS, t = t0 + i;
        w_s[i][h] = t < T && h < heads ? w[(size_t)t * heads + h] : 0.0f;
    }
    /* a step's keys: a thread's UPT units, rows past jv zeros */
    ixw_f8 pf[S::UPT];
    auto fetch = [&](int s) {
        const int j0 = js + s * IXW_KEYS;
#pragma unroll
        for (int k = 0; k < S::UPT; k++) {
            const int e = tid + k * S::THREADS, r = e / (8 * KH), hf = (e >> 3) % KH, u = e & 7;
            const int j = j0 + r;
            pf[k] =
                ixw_fetch(keys + (size_t)(j < jv ? j : 0) * dim, hf * 64 + 8 * u, dim, j < jv, vec);
        }
    };
    auto put = [&](int st) {
        unsigned char *dst = sk + st * S::K_STAGE;
#pragma unroll
        for (int k = 0; k < S::UPT; k++) {
            const int e = tid + k * S::THREADS, r = e / (8 * KH), hf = (e >> 3) % KH, u = e & 7;
            *(uint4 *)(dst + hf * S::K_HALF + wg_sw(r, u)) = ixw_pack(pf[k]);
        }
    };
    fetch(0);
    put(0);
    if (steps > 1) fetch(1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* for the MMAs' reads */
    __syncthreads();

    const uint64_t dq = wg_desc(sq + wg * KH * S::Q_HALF), dk = wg_desc(sk);
    const float scale = 1.0f / sqrtf((float)dim);
    float d[S::ROWS / 2]; /* d[4j + t]: key 16 wq + g + 8 (t >> 1), Q row 8j + 2c + (t & 1) */
    for (int s = 0; s < steps; s++) {
        const uint64_t dks = dk + (s & 1) * (S::K_STAGE >> 4);
        wgmma_fence();
#pragma unroll
        for (int hf = 0; hf < KH; hf++)
#pragma unroll
            for (int kk = 0; kk < 4; kk++) /* 16 dims a step: 32 bytes, 2 in the address */
                wgmma_ss<S::ROWS>(d, dks + hf * (S::K_HALF >> 4) + 2 * kk,
                                  dq + hf * (S::Q_HALF >> 4) + 2 * kk, hf | kk);
        wgmma_commit();
        if (s + 1 < steps) { /* (stage (s + 1) & 1's last readers, step s - 1, are done) */
            put((s + 1) & 1);
            if (s + 2 < steps) fetch(s + 2);
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < S::ROWS / 2; i++) /* (read after the wait) */
            asm volatile("" : "+f"(d[i])::"memory");
        /* part[2i + kr]: token i's sum over this thread's heads 8jj + 2c + b, key row kr */
        float part[2 * TOKW];
#pragma unroll
        for (int i = 0; i < TOKW; i++) {
            float2 wv[4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                wv[jj] = *(const float2 *)&w_s[wg * TOKW + i][8 * jj + 2 * c];
#pragma unroll
            for (int kr = 0; kr < 2; kr++) {
                float p = 0.0f;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    const float *dd = d + 4 * (4 * i + jj) + 2 * kr;
                    p = fmaf(wv[jj].x, fmaxf(dd[0], 0.0f), p);
                    p = fmaf(wv[jj].y, fmaxf(dd[1], 0.0f), p);
                }
                part[2 * i + kr] = p;
            }
        }
        /* the four lanes' sums, scattered: after the first exchange lane c holds p = (c & 1)
         * TOKW + q; after the second, p = (c & 1) TOKW + (c >> 1 & 1) TOKW / 2 + q */
#pragma unroll
        for (int q1 = 0; q1 < TOKW; q1++) {
            const float lo = part[q1], hi = part[q1 + TOKW];
            part[q1] = ((c & 1) ? hi : lo) + __shfl_xor_sync(0xffffffffu, (c & 1) ? lo : hi, 1);
        }
        if constexpr (TOKW >= 2) {
#pragma unroll
            for (int q2 = 0; q2 < TOKW / 2; q2++) {
                const float lo = part[q2], hi = part[q2 + TOKW / 2];
                part[q2] = ((c & 2) ? hi : lo) + __shfl_xor_sync(0xffffffffu, (c & 2) ? lo : hi, 2);
            }
        } else {
            part[0] += __shfl_xor_sync(0xffffffffu, part[0], 2);
        }
        const int jr = js + s * IXW_KEYS + 16 * wq + g;
        auto store = [&](int i, int kr, float v) {
            const int t = t0 + wg * TOKW + i, j = jr + 8 * kr;
            if (t < T && j < je)
                scores[(size_t)t * n + j] = j < vis_s[wg * TOKW + i] ? v * scale : -INFINITY;
        };
        if constexpr (TOKW >= 2) {
#pragma unroll
            for (int q2 = 0; q2 < TOKW / 2; q2++) {
                const int p = (c & 1) * TOKW + (c >> 1 & 1) * (TOKW / 2) + q2;
                store(p >> 1, p & 1, part[q2]);
            }
        } else if (!(c & 2)) {
            store(0, c & 1, part[0]);
        }
        /* every warpgroup's products of this step are done before its stage is refilled */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
    }
#else
    __trap(); /* launched only where ixwg_ready() found the sm_90a image */
#endif
}

/* index_scores_wg runs here: a Hopper device and this binary's device code built for sm_90a;
 * BT_CUDA_IXWG=0 keeps index_scores_tc (for comparisons) */
static bool ixwg_ready(void)
{
    static int once = -1;
    static signed char built[BT__MAX_DEVICES];
    return bt__env_switch("BT_CUDA_IXWG", &once) && bt__wgmma_ready(ixwg_built, built);
}

/* false where the instance's shared memory is not allowed (then index_scores_tc runs) */
template <int TOKW, int WGS, int KH>
static bool ixwg_launch(float *scores, const float *q, const float *w, const float *keys,
                        const int64_t *key_off, const int32_t *n_keys, const int64_t *visible,
                        int T, int heads, int dim, int n, cudaStream_t stream)
{
    using S = ixw_shape<TOKW, WGS, KH>;
    static signed char allowed[BT__MAX_DEVICES];
    if (!bt__smem_allowed((const void *)index_scores_wg<TOKW, WGS, KH>, S::SMEM, allowed))
        return false;
    /* key ranges that leave about two waves of blocks on 132 SMs (blocks an SM by threads and
     * shared memory) */
    const int groups = bt__cdiv(T, TOKW * WGS), tiles = bt__cdiv(n, IXW_KEYS);
    const int by_threads = 16 / WGS, by_smem = (int)(228 * 1024 / (S::SMEM + 3 * 1024));
    const long wave = 132L * (by_threads < by_smem ? by_threads : by_smem);
    int per = bt__cdiv((long long)tiles * groups, 2 * wave);
    if (per < 1) per = 1;
    dim3 grid(bt__cdiv(tiles, per), groups);
    bt__launch(index_scores_wg<TOKW, WGS, KH>, grid, S::THREADS, S::SMEM, stream, scores, q, w,
               keys, visible, T, heads, dim, n, key_off, n_keys, per);
    return true;
}

extern "C" bt_status_t bt_cuda_index_scores_tc(float *scores, const float *q, const float *w,
                                               const float *keys, const int64_t *key_off,
                                               const int32_t *n_keys, const int64_t *visible,
                                               int T, int heads, int dim, int n,
                                               cudaStream_t stream)
{
    BT_CUDA_REQUIRE(scores && q && w && keys && visible && (!key_off || n_keys));
    BT_CUDA_REQUIRE(T > 0 && n > 0 && heads > 0 && heads <= IXT_HEADS);
    BT_CUDA_REQUIRE(dim > 0 && dim <= IX_MAXD);
    if (ixwg_ready()) {
        /* Hopper: 16 tokens a block where they share the keys and fill the GPU, else one */
        bool big = !key_off && T >= 16, ok;
        if (dim <= 64)
            ok = big ? ixwg_launch<4, 4, 1>(scores, q, w, keys, key_off, n_keys, visible, T, heads,
                                            dim, n, stream)
                     : ixwg_launch<1, 1, 1>(scores, q, w, keys, key_off, n_keys, visible, T, heads,
                                            dim, n, stream);
        else
            ok = big ? ixwg_launch<4, 4, 2>(scores, q, w, keys, key_off, n_keys, visible, T, heads,
                                            dim, n, stream)
                     : ixwg_launch<1, 1, 2>(scores, q, w, keys, key_off, n_keys, visible, T, heads,
                                            dim, n, stream);
        if (ok) return bt__cuda_launched("index_scores_wg");
    }
    /* each instance is allowed its largest (dim 128) shared memory on its own: four key tiles
     * a block (100 KB) are over what some GPUs allow a block (GB10: 99 KB), and then only that
     * instance is passed over */
    static signed char allowed[3][BT__MAX_DEVICES];
    if (key_off) {
        bt__smem_allowed((const void *)index_scores_tc_kernel<1, 1>, ixt_smem<1, 1>(IX_MAXD),
                         allowed[0]);
        size_t bytes = ixt_smem<1, 1>(dim);
        dim3 grid(bt__cdiv(n, IXT_KEYS), T);
        bt__launch(index_scores_tc_kernel<1, 1>, grid, IXT_WARPS * 32, bytes, stream, scores, q, w,
                   keys, visible, T, heads, dim, n, key_off, n_keys);
    } else if ((long)bt__cdiv(n, 4 * IXT_KEYS) * bt__cdiv(T, 4) >= 264 &&
               bt__smem_allowed((const void *)index_scores_tc_kernel<4, 4>, ixt_smem<4, 4>(IX_MAXD),
                                allowed[1])) {
        /* four key tiles a block while that still leaves two blocks an SM (prefill) */
        size_t bytes = ixt_smem<4, 4>(dim);
        dim3 grid(bt__cdiv(n, 4 * IXT_KEYS), bt__cdiv(T, 4));
        bt__launch(index_scores_tc_kernel<4, 4>, grid, IXT_WARPS * 32, bytes, stream, scores, q, w,
                   keys, visible, T, heads, dim, n, NULL, NULL);
    } else { /* few tokens: a block per key tile */
        bt__smem_allowed((const void *)index_scores_tc_kernel<4, 1>, ixt_smem<4, 1>(IX_MAXD),
                         allowed[2]);
        size_t bytes = ixt_smem<4, 1>(dim);
        dim3 grid(bt__cdiv(n, IXT_KEYS), bt__cdiv(T, 4));
        bt__launch(index_scores_tc_kernel<4, 1>, grid, IXT_WARPS * 32, bytes, stream, scores, q, w,
                   keys, visible, T, heads, dim, n, NULL, NULL);
    }
    return bt__cuda_launched("index_scores_tc");
}

/* ---- top-k ------------------------------------------------------------------------------ */

enum { TK_THREADS = 1024, TK_PER = 8 };
static_assert(TK_THREADS == 32 * 32, "block_prefix scans the warps' counts a lane each");

/* order-preserving map of a float onto uint32 (larger float -> larger key) */
__device__ __forceinline__ unsigned ordered(float f)
{
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix sum of v over the block in thread order; total in *total. */
__device__ __forceinline__ int block_prefix(int v, int *warp_tot, int *total)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int incl = bt_warp_incl_sum(v);
    __syncthreads(); /* (warp_tot's last readers are done) */
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    if (warp == 0) { /* the 32 warps' sums scanned by a warp, not walked by one thread */
        const int w = warp_tot[lane], wi = bt_warp_incl_sum(w);
        warp_tot[lane] = wi - w;
        if (lane == 31) warp_tot[TK_THREADS / 32] = wi;
    }
    __syncthreads();
    *total = warp_tot[TK_THREADS / 32];
    return warp_tot[warp] + incl - v;
}

/* The k largest of each row's n scores, as indices in increasing order (-inf never taken);
 * ties at the k-th value go to the lower indices. A block a row: a radix select finds the
 * k-th largest key 8 bits at a time, then one pass writes the picks. That pass gives each
 * thread TK_PER consecutive scores, so a tile of TK_THREADS * TK_PER scores takes two block
 * scans (the equal keys' ranks, the picks' places): one score a thread took 16 scans (48
 * barriers) for 8192 scores, most of a decode step's top-k. Tried and measured slower: the
 * histogram's adds aggregated a warp at a time (__match_any_sync per bin, 1a2e793), as the first
 * pass's few bins take all 8192: the layer's indexer part 0.027 -> 0.031 ms at decode b1, the
 * layer 0.195 -> 0.199 (session 37, an H100). */
__global__ void __launch_bounds__(TK_THREADS)
    topk_kernel(int32_t *out, int32_t *out_n, int out_stride, const float *scores, int n, int k)
{
    bt_grid_begin();
    __shared__ int hist[256];
    __shared__ int warp_tot[TK_THREADS / 32 + 1];
    __shared__ unsigned s_prefix;
    __shared__ int s_need, s_whole;
    int t = blockIdx.x;
    const float *row = scores + (size_t)t * n;
    int32_t *orow = out + (size_t)t * out_stride;
    if (k > n) k = n;
    const bool vec = n % 4 == 0 && (uintptr_t)scores % 16 == 0; /* (every row 16-aligned) */
    /* a thread's TK_PER consecutive scores (the output pass's), -inf past n */
    float v[TK_PER];
    auto load_scores = [&](int jb) {
        if (vec && jb + TK_PER <= n) {
#pragma unroll
            for (int i = 0; i < TK_PER; i += 4)
                *(float4 *)&v[i] = *(const float4 *)(row + jb + i);
        } else {
#pragma unroll
            for (int i = 0; i < TK_PER; i++)
                v[i] = jb + i < n ? row[jb + i] : -INFINITY;
        }
    };
    /* a row of up to TK_THREADS * TK_PER scores (a decode's 8192) is read once, into registers:
     * every pass below read it again from L2 */
    const bool held = n <= TK_THREADS * TK_PER;
    if (held) load_scores(TK_PER * threadIdx.x);
    /* radix select: the k-th largest key, 8 bits at a time from the top */
    unsigned prefix = 0, mask = 0;
    int need = k; /* how many are still to take at or under the prefix */
    for (int shift = 24; shift >= 0 && k > 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += TK_THREADS) hist[i] = 0;
        if (threadIdx.x == 0) s_whole = 0;
        __syncthreads();
        if (held) {
#pragma unroll
            for (int i = 0; i < TK_PER; i++) {
                const unsigned key = ordered(v[i]);
                if (TK_PER * threadIdx.x + i < n && (key & mask) == prefix)
                    atomicAdd(&hist[(key >> shift) & 0xffu], 1);
            }
        } else {
            for (int j = threadIdx.x; j < n; j += TK_THREADS) {
                unsigned key = ordered(row[j]);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* the bin where the count from the top reaches `need`: lane
                                 * l holds bins 8l..8l+7, the lanes above it counted by a scan
                                 * (one thread walking 256 bins cost ~4 us a pass) */
            const int lane = threadIdx.x;
            int cnt[8], mine = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) mine += cnt[i] = hist[8 * lane + i];
            int incl = mine; /* bins of lanes >= this one */
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_down_sync(0xffffffffu, incl, o);
                if (lane + o < 32) incl += v;
            }
            int run = incl - mine;
            if (run < need && need <= incl) { /* exactly one lane: the counts reach `need` */
                int b = 8 * lane + 7;
                for (int i = 7; i > 0 && run + cnt[i] < need; i--, b--) run += cnt[i];
                s_prefix = prefix | ((unsigned)b << shift);
                s_need = need - run;
                s_whole = need - run == hist[b];
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 0xffu << shift;
        /* the bin needed whole: its smallest key is the k-th, so the bits below are moot (the
         * picks compare the resolved bits); once bins hold a key or two, a pass or two saved
         * (decode, 8192 scores: 14.6 -> 12.3 us on an H100) */
        if (s_whole) break; /* (uniform: read after the barrier) */
    }
    /* prefix is now the k-th largest key (its bits under mask): take everything above it, and
     * the first `need` equal to it in index order; drop -inf picks; write the rest in index
     * order */
    int written = 0, eq_seen = 0;
    for (int j0 = 0; j0 < n && k > 0; j0 += TK_THREADS * TK_PER) {
        const int jb = j0 + TK_PER * threadIdx.x;
        if (!held) load_scores(jb); /* (held: the one tile is in v) */
        unsigned eq = 0, gt = 0; /* bit i: score jb + i equals / is over the k-th key */
#pragma unroll
        for (int i = 0; i < TK_PER; i++) {
            const unsigned key = ordered(v[i]) & mask; /* (all bits unless stopped early) */
            if (jb + i < n && key == prefix) eq |= 1u << i;
            if (jb + i < n && v[i] > -INFINITY && key > prefix) gt |= 1u << i;
        }
        int total;
        const int eq_before = eq_seen + block_prefix(__popc(eq), warp_tot, &total);
        eq_seen += total;
        unsigned take = gt;
        int r = eq_before; /* the rank of this thread's next equal key */
#pragma unroll
        for (int i = 0; i < TK_PER; i++)
            if (eq >> i & 1u) {
                if (r < need && v[i] > -INFINITY) take |= 1u << i;
                r++;
            }
        int at = written + block_prefix(__popc(take), warp_tot, &total);
#pragma unroll
        for (int i = 0; i < TK_PER; i++)
            if (take >> i & 1u) orow[at++] = jb + i;
        written += total;
    }
    for (int i = written + threadIdx.x; i < out_stride; i += TK_THREADS) orow[i] = -1;
    if (threadIdx.x == 0) out_n[t] = written;
}

extern "C" bt_status_t bt_cuda_topk(int32_t *out, int32_t *out_n, int out_stride,
                                    const float *scores, int T, int n, int k, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && out_n && scores && T > 0 && n >= 0 && k >= 0 && k <= out_stride);
    bt__launch(topk_kernel, T, TK_THREADS, 0, stream, out, out_n, out_stride, scores, n, k);
    return bt__cuda_launched("topk");
}

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
    int64_t vmax = 0;
    for (int i = 0; i < TOK; i++) {
        int t = t0 + i;
        int64_t v = 0;
        if (t < T) {
            v = visible[t];
            if (key_off && v > n_keys[t]) v = n_keys[t];
            if (v > n) v = n;
        }
        if (tid == 0) vis_s[i] = v;
        if (v > vmax) vmax = v;
    }
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

extern "C" bt_status_t bt_cuda_index_scores_tc(float *scores, const float *q, const float *w,
                                               const float *keys, const int64_t *key_off,
                                               const int32_t *n_keys, const int64_t *visible,
                                               int T, int heads, int dim, int n,
                                               cudaStream_t stream)
{
    BT_CUDA_REQUIRE(scores && q && w && keys && visible && (!key_off || n_keys));
    BT_CUDA_REQUIRE(T > 0 && n > 0 && heads > 0 && heads <= IXT_HEADS);
    BT_CUDA_REQUIRE(dim > 0 && dim <= IX_MAXD);
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
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
    }
    __syncthreads(); /* (warp_tot's last readers are done) */
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    if (warp == 0) { /* the 32 warps' sums scanned by a warp, not walked by one thread */
        const int w = warp_tot[lane];
        int wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int u = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += u;
        }
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
 * barriers) for 8192 scores, most of a decode step's top-k. */
__global__ void __launch_bounds__(TK_THREADS) topk_kernel(int32_t *out, int32_t *out_n,
                                                          int out_stride, const float *scores,
                                                          int n, int k)
{
    bt_grid_begin();
    __shared__ int hist[256];
    __shared__ int warp_tot[TK_THREADS / 32 + 1];
    __shared__ unsigned s_prefix;
    __shared__ int s_need;
    int t = blockIdx.x;
    const float *row = scores + (size_t)t * n;
    int32_t *orow = out + (size_t)t * out_stride;
    if (k > n) k = n;
    /* radix select: the k-th largest key, 8 bits at a time from the top */
    unsigned prefix = 0, mask = 0;
    int need = k; /* how many are still to take at or under the prefix */
    for (int shift = 24; shift >= 0 && k > 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += TK_THREADS) hist[i] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += TK_THREADS) {
            unsigned key = ordered(row[j]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1);
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
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 0xffu << shift;
    }
    /* prefix is now the k-th largest key: take everything above it, and the first `need`
     * equal to it in index order; drop -inf picks; write the rest in index order */
    int written = 0, eq_seen = 0;
    const bool vec = n % 4 == 0 && (uintptr_t)scores % 16 == 0; /* (every row 16-aligned) */
    for (int j0 = 0; j0 < n && k > 0; j0 += TK_THREADS * TK_PER) {
        const int jb = j0 + TK_PER * threadIdx.x;
        float v[TK_PER];
        if (vec && jb + TK_PER <= n) {
#pragma unroll
            for (int i = 0; i < TK_PER; i += 4)
                *(float4 *)&v[i] = *(const float4 *)(row + jb + i);
        } else {
#pragma unroll
            for (int i = 0; i < TK_PER; i++)
                v[i] = jb + i < n ? row[jb + i] : -INFINITY;
        }
        unsigned eq = 0, gt = 0; /* bit i: score jb + i equals / is over the k-th key */
#pragma unroll
        for (int i = 0; i < TK_PER; i++) {
            const unsigned key = ordered(v[i]);
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

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

extern "C" bt_status_t bt_cuda_index_scores(float *scores, const float *q, const float *w,
                                            const float *keys, const int64_t *visible, int T,
                                            int heads, int dim, int n, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(scores && q && w && keys && visible);
    BT_CUDA_REQUIRE(T > 0 && n > 0 && heads > 0 && heads <= IX_MAXH && dim > 0);
    BT_CUDA_REQUIRE(heads * dim <= IX_MAXH * IX_MAXD);
    dim3 grid(bt__cdiv(n, IX_KEYS), T);
    index_scores_kernel<<<grid, IX_KEYS, 0, stream>>>(scores, q, w, keys, visible, heads, dim, n,
                                                      NULL, NULL);
    return bt__cuda_launched("index_scores");
}

extern "C" bt_status_t bt_cuda_index_scores_sets(float *scores, const float *q, const float *w,
                                                 const float *keys, const int64_t *key_off,
                                                 const int32_t *n_keys, const int64_t *visible,
                                                 int T, int heads, int dim, int n,
                                                 cudaStream_t stream)
{
    BT_CUDA_REQUIRE(scores && q && w && keys && key_off && n_keys && visible);
    BT_CUDA_REQUIRE(T > 0 && n > 0 && heads > 0 && heads <= IX_MAXH && dim > 0);
    BT_CUDA_REQUIRE(heads * dim <= IX_MAXH * IX_MAXD);
    dim3 grid(bt__cdiv(n, IX_KEYS), T);
    index_scores_kernel<<<grid, IX_KEYS, 0, stream>>>(scores, q, w, keys, visible, heads, dim, n,
                                                      key_off, n_keys);
    return bt__cuda_launched("index_scores_sets");
}

/* ---- top-k ------------------------------------------------------------------------------ */

enum { TK_THREADS = 1024 };

/* order-preserving map of a float onto uint32 (larger float -> larger key) */
__device__ __forceinline__ unsigned ordered(float f)
{
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix count of `flag` over the block in thread order; total in *total. */
__device__ __forceinline__ int block_prefix(int flag, int *warp_tot, int *total)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned ballot = __ballot_sync(0xffffffffu, flag);
    int before = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0) warp_tot[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int i = 0; i < TK_THREADS / 32; i++) {
            int v = warp_tot[i];
            warp_tot[i] = run;
            run += v;
        }
        warp_tot[TK_THREADS / 32] = run;
    }
    __syncthreads();
    *total = warp_tot[TK_THREADS / 32];
    return warp_tot[warp] + before;
}

__global__ void __launch_bounds__(TK_THREADS) topk_kernel(int32_t *out, int32_t *out_n,
                                                          int out_stride, const float *scores,
                                                          int n, int k)
{
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
        if (threadIdx.x == 0) {
            int run = 0, b = 255;
            for (; b > 0; b--) {
                if (run + hist[b] >= need) break;
                run += hist[b];
            }
            s_prefix = prefix | ((unsigned)b << shift);
            s_need = need - run;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 0xffu << shift;
    }
    /* prefix is now the k-th largest key: take everything above it, and the first `need`
     * equal to it in index order; drop -inf picks; write the rest in index order */
    int written = 0, eq_seen = 0;
    for (int j0 = 0; j0 < n && k > 0; j0 += TK_THREADS) {
        int j = j0 + threadIdx.x, total;
        float v = j < n ? row[j] : -INFINITY;
        unsigned key = ordered(v);
        int eq = j < n && key == prefix;
        int eq_rank = eq_seen + block_prefix(eq, warp_tot, &total);
        eq_seen += total;
        int take = j < n && v > -INFINITY && (key > prefix || (eq && eq_rank < need));
        int at = written + block_prefix(take, warp_tot, &total);
        if (take) orow[at] = j;
        written += total;
    }
    for (int i = written + threadIdx.x; i < out_stride; i += TK_THREADS) orow[i] = -1;
    if (threadIdx.x == 0) out_n[t] = written;
}

extern "C" bt_status_t bt_cuda_topk(int32_t *out, int32_t *out_n, int out_stride,
                                    const float *scores, int T, int n, int k, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && out_n && scores && T > 0 && n >= 0 && k >= 0 && k <= out_stride);
    topk_kernel<<<T, TK_THREADS, 0, stream>>>(out, out_n, out_stride, scores, n, k);
    return bt__cuda_launched("topk");
}

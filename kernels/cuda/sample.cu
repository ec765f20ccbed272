/* Token sampling on the GPU, one block a row: the rules of services/engine/sampler.c (greedy,
 * temperature, top_k, top_p, min_p; the chosen token's log-probability and the most likely
 * tokens with theirs), so a decode step copies a few bytes a sequence to the host instead of
 * its logits row (129280 floats at the real vocabulary).
 *
 * The CPU finds its kept sets with a heap (top_k) and a partition (top_p); here each is a
 * threshold found by radix selection over the logits' order-preserving keys, each round
 * counting (4 rounds of 8 bits, warp histograms in shared memory) or summing the weights (8
 * rounds of 4 bits, in registers) of the keys that share the bits decided so far, per value of
 * the next digit; ties on a logit are broken by id in one ordered scan. Every pass over a row
 * keeps 8 loads a thread in flight (one block reads a 129280-id row at ~13 GB/s with one). The
 * weights are sampler.c's, bit for bit (kernels/sampling.h: one e^x for both), and both draw in id
 * order over the kept set, so the same (seed, step) picks the same token unless a sum's last
 * bits put the draw on the other side of a boundary. */
#include "kernels/cuda/common.cuh"
#include "kernels/sampling.h"

enum { SR_THREADS = 1024, SR_WARPS = SR_THREADS / 32 };

typedef struct {
    uint32_t hist[SR_WARPS][256]; /* counting rounds: a histogram a warp */
    uint32_t bins[256];
    double part[SR_WARPS][16];
    double wbins[16];
    double wsum[SR_WARPS];
    int wlast[SR_WARPS], first;
    float wmax[SR_WARPS];
    int wbest[SR_WARPS];
    uint32_t prefix;
    double above, total;
    int pick, found;
    int n_list;
    int32_t list_id[BT_CUDA_SAMPLE_TOP];
} sr_shared_t;

/* (key, id) at least as likely as (K, id_k): a larger key, or the same and a lower id */
__device__ __forceinline__ bool sr_at_least(uint32_t key, int id, uint32_t K, int id_k)
{
    return key > K || (key == K && id <= id_k);
}

/* f(i, row[i]) for i = threadIdx.x, + SR_THREADS, ... < V: 8 loads in flight a thread */
template <class F>
__device__ __forceinline__ void sr_each(const float *row, int V, F f)
{
    enum { U = 8 };
    int i = threadIdx.x;
    for (; i + (U - 1) * SR_THREADS < V; i += U * SR_THREADS) {
        float l[U];
#pragma unroll
        for (int u = 0; u < U; u++) l[u] = __ldg(row + i + u * SR_THREADS);
#pragma unroll
        for (int u = 0; u < U; u++) f(i + u * SR_THREADS, l[u]);
    }
    for (; i < V; i += SR_THREADS) f(i, __ldg(row + i));
}

__device__ __forceinline__ double sr_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* the block's sum of one double a thread, in every thread */
__device__ double sr_block_sum(double v, sr_shared_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = sr_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh->wsum[warp] = v;
    __syncthreads();
    v = sr_warp_sum(lane < SR_WARPS ? sh->wsum[lane] : 0.0);
    return v;
}

/* The first id i (in id order) at which the running sum of weight(i, row[i]) passes target
 * (strict: exceeds it; else reaches it), or, when rounding leaves it uncrossed, the last id
 * with weight; -1 when no id has weight. Each thread sums a run of consecutive ids, a scan of
 * the runs finds the one that crosses, and its thread walks it. */
template <class Weight>
__device__ int sr_find(const float *row, int V, Weight weight, double target, bool strict,
                       sr_shared_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = (V + SR_THREADS - 1) / SR_THREADS;
    const int lo = min(threadIdx.x * per, V), hi = min(lo + per, V);
    double s = 0.0;
    int last = -1;
    {
        enum { U = 4 };
        int i = lo;
        for (; i + U <= hi; i += U) {
            float l[U];
#pragma unroll
            for (int u = 0; u < U; u++) l[u] = __ldg(row + i + u);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const double w = weight(i + u, l[u]);
                s += w;
                if (w > 0.0) last = i + u;
            }
        }
        for (; i < hi; i++) {
            const double w = weight(i, __ldg(row + i));
            s += w;
            if (w > 0.0) last = i;
        }
    }
    /* inclusive scan of the runs' sums: in the warp, then over the warps' totals */
    double incl = bt_warp_incl_sum(s);
    int wl = last;
    for (int o = 16; o > 0; o >>= 1) wl = max(wl, __shfl_xor_sync(0xffffffffu, wl, o));
    __syncthreads();
    if (lane == 31) sh->wsum[warp] = incl;
    if (lane == 0) sh->wlast[warp] = wl;
    if (threadIdx.x == 0) sh->first = SR_THREADS;
    __syncthreads();
    if (warp == 0) {
        const double t = bt_warp_incl_sum(sh->wsum[lane]);
        const double before = __shfl_up_sync(0xffffffffu, t, 1);
        sh->part[lane][0] = lane ? before : 0.0; /* the warps before this one */
        int any = sh->wlast[lane];
        for (int o = 16; o > 0; o >>= 1) any = max(any, __shfl_xor_sync(0xffffffffu, any, o));
        if (lane == 0) sh->wlast[0] = any;
    }
    __syncthreads();
    incl += sh->part[warp][0];
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = sh->part[warp][0];
    /* the first run whose end crosses (with weight of its own) */
    if (s > 0.0 && (strict ? incl > target : incl >= target)) atomicMin(&sh->first, (int)threadIdx.x);
    __syncthreads();
    const int who = sh->first;
    if (who == SR_THREADS) { /* rounding: nothing crossed */
        if (threadIdx.x == 0) sh->found = sh->wlast[0];
    } else if ((int)threadIdx.x == who) {
        double run = excl;
        int got = -1;
        for (int i = lo; i < hi && got < 0; i++) {
            const double w = weight(i, __ldg(row + i));
            run += w;
            if (w > 0.0 && (strict ? run > target : run >= target)) got = i;
        }
        sh->found = got >= 0 ? got : last;
    }
    __syncthreads();
    const int found = sh->found;
    __syncthreads();
    return found;
}

/* The edge (K, id_k) of the k most likely ids (k <= V): the k-th in the order (key desc, id
 * asc). Counting rounds of 8 bits: each warp's histogram in shared memory, lanes with the same
 * digit added once (__match_any_sync). */
__device__ void sr_select_count(const float *row, int V, int k, uint32_t *K, int *id_k, sr_shared_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t prefix = 0, above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        const uint32_t high = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (int j = lane; j < 256; j += 32) sh->hist[warp][j] = 0;
        __syncwarp();
        sr_each(row, V, [&](int, float l) {
            const uint32_t key = bt_smp_key(l), d = (key >> shift) & 255u;
            const bool mine = (key & high) == prefix;
            const unsigned act = __activemask(), in = __ballot_sync(act, mine);
            if (mine) {
                const unsigned peers = __match_any_sync(in, d);
                if (lane == __ffs(peers) - 1) atomicAdd(&sh->hist[warp][d], (uint32_t)__popc(peers));
            }
        });
        __syncthreads();
        if (threadIdx.x < 256) {
            uint32_t c = 0;
            for (int w = 0; w < SR_WARPS; w++) c += sh->hist[w][threadIdx.x];
            sh->bins[threadIdx.x] = c;
        }
        __syncthreads();
        if (warp == 0) { /* lane l holds digits 255 - 8l down to 248 - 8l */
            uint32_t c = 0;
            for (int j = 0; j < 8; j++) c += sh->bins[255 - 8 * lane - j];
            const uint32_t incl = bt_warp_incl_sum(c);
            const bool hit = above + incl >= (uint32_t)k;
            const unsigned b = __ballot_sync(0xffffffffu, hit);
            const int at = b ? __ffs(b) - 1 : 31; /* (always hit: the row holds k) */
            if (lane == at) {
                uint32_t acc = above + incl - c;
                int d = 248 - 8 * lane;
                for (int j = 0; j < 8; j++) {
                    const int dj = 255 - 8 * lane - j;
                    if (acc + sh->bins[dj] >= (uint32_t)k) {
                        d = dj;
                        break;
                    }
                    acc += sh->bins[dj];
                }
                sh->above = (double)acc;
                sh->prefix = prefix | ((uint32_t)d << shift);
            }
        }
        __syncthreads();
        prefix = sh->prefix;
        above = (uint32_t)sh->above;
        __syncthreads();
    }
    const uint32_t kk = prefix;
    const int id = sr_find(row, V, [&](int, float l) { return bt_smp_key(l) == kk ? 1.0 : 0.0; },
                           (double)(k - (int)above), false, sh);
    *K = kk;
    *id_k = id >= 0 ? id : V - 1;
}

/* The edge (K, id_k) of the most likely ids whose weight (top_p's probabilities) reaches
 * target: the weight of the (key, id) at least as likely as it reaches target, of those more
 * likely does not. Rounds of 4 bits, the 16 sums in registers; ids without weight skipped.
 * The caller makes sure the whole row's weight reaches target. */
template <class Weight>
__device__ void sr_select(const float *row, int V, Weight weight, double target, uint32_t *K,
                          int *id_k, sr_shared_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t prefix = 0;
    double above = 0.0;
    for (int shift = 28; shift >= 0; shift -= 4) {
        const uint32_t high = shift == 28 ? 0u : 0xffffffffu << (shift + 4);
        double s[16];
#pragma unroll
        for (int j = 0; j < 16; j++) s[j] = 0.0;
        sr_each(row, V, [&](int i, float l) {
            const uint32_t key = bt_smp_key(l);
            if ((key & high) != prefix) return;
            const double w = weight(i, l);
            if (w == 0.0) return;
            const uint32_t d = (key >> shift) & 15u;
#pragma unroll
            for (int j = 0; j < 16; j++) s[j] += d == (uint32_t)j ? w : 0.0;
        });
#pragma unroll
        for (int j = 0; j < 16; j++) {
            double v = s[j];
            v = sr_warp_sum(v);
            if (lane == 0) sh->part[warp][j] = v;
        }
        __syncthreads();
        if (threadIdx.x < 16) {
            double v = 0.0;
            for (int w = 0; w < SR_WARPS; w++) v += sh->part[w][threadIdx.x];
            sh->wbins[threadIdx.x] = v;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double acc = above;
            int d = -1;
            for (int j = 15; j >= 0; j--) {
                if (acc + sh->wbins[j] >= target) {
                    d = j;
                    break;
                }
                acc += sh->wbins[j];
            }
            if (d < 0) { /* rounding: the lowest digit keeps everything left */
                d = 0;
                acc -= sh->wbins[0];
            }
            sh->above = acc;
            sh->prefix = prefix | ((uint32_t)d << shift);
        }
        __syncthreads();
        prefix = sh->prefix;
        above = sh->above;
        __syncthreads();
    }
    const uint32_t k = prefix;
    /* among the ids of key k, in id order, the one where the weight reaches target */
    int id = sr_find(
        row, V, [&](int i, float l) { return bt_smp_key(l) == k ? (double)weight(i, l) : 0.0; },
        target - above, false, sh);
    *K = k;
    *id_k = id >= 0 ? id : V - 1;
}

__global__ void __launch_bounds__(SR_THREADS)
    sample_rows_kernel(bt_cuda_sample_result_t *out, const bt_cuda_sample_params_t *params,
                       const float *logits, int64_t ld, int V)
{
    bt_grid_begin();
    __shared__ sr_shared_t sh;
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *row = logits + (size_t)t * ld;
    const bt_cuda_sample_params_t p = params[t];

    /* the argmax, ties to the lower id */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    sr_each(row, V, [&](int j, float l) {
        if (l > bv || (l == bv && j < bi)) {
            bv = l;
            bi = j;
        }
    });
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        sh.wmax[warp] = bv;
        sh.wbest[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SR_WARPS; w++)
            if (sh.wmax[w] > sh.wmax[0] || (sh.wmax[w] == sh.wmax[0] && sh.wbest[w] < sh.wbest[0])) {
                sh.wmax[0] = sh.wmax[w];
                sh.wbest[0] = sh.wbest[w];
            }
        if (sh.wbest[0] == 0x7fffffff) { /* every logit NaN */
            sh.wbest[0] = 0;
            sh.wmax[0] = row[0];
        }
    }
    __syncthreads();
    const float mx = sh.wmax[0];
    const int best = sh.wbest[0];

    /* log-sum-exp of the row, for the log-probabilities */
    double lse = 0.0;
    const int n_top = min(min(p.n_top, BT_CUDA_SAMPLE_TOP), V);
    if (p.want_logprob || n_top > 0) {
        double s = 0.0;
        sr_each(row, V, [&](int, float l) { s += (double)bt_smp_exp_le0(__fsub_rn(l, mx)); });
        lse = log(sr_block_sum(s, &sh)) + (double)mx;
    }

    int chosen = best;
    const float inv_t = p.temperature > 0.0f ? __fdiv_rn(1.0f, p.temperature) : 0.0f;
    if (p.temperature > 0.0f && isfinite(inv_t) && isfinite(mx)) {
        const bool topk = p.top_k > 0 && p.top_k < V;
        const int n = topk ? p.top_k : V;
        uint32_t kK = 0;
        int k_id = V - 1;
        if (topk)
            sr_select_count(row, V, n, &kK, &k_id, &sh);
        auto weight = [&](int i, float l) -> float {
            if (topk && !sr_at_least(bt_smp_key(l), i, kK, k_id)) return -1.0f; /* not a candidate */
            return bt_smp_weight(l, mx, inv_t);
        };
        double s = 0.0;
        sr_each(row, V, [&](int j, float l) { s += (double)fmaxf(weight(j, l), 0.0f); });
        const double sum = sr_block_sum(s, &sh);
        const double floor_w = p.min_p > 0.0f ? (p.min_p < 1.0f ? (double)p.min_p : 1.0) : 0.0;
        const double top_p = p.top_p > 0.0f && p.top_p < 1.0f ? (double)p.top_p : 1.0;
        const double eps = top_p < 1.0 ? 0.5 * (1.0 - top_p) * sum / n : 0.0;
        const double keep_w = floor_w > eps ? floor_w : eps;
        auto kept_w = [&](int i, float l) -> double {
            const float w = weight(i, l);
            return w >= 0.0f && (double)w >= keep_w ? (double)w : 0.0;
        };
        /* top_p: the nucleus's edge, when the kept weight reaches top_p of the candidates' */
        bool cut = false;
        uint32_t eK = 0;
        int e_id = V - 1;
        if (top_p < 1.0) {
            s = 0.0;
            sr_each(row, V, [&](int j, float l) { s += kept_w(j, l); });
            if (sr_block_sum(s, &sh) >= top_p * sum) {
                sr_select(row, V, kept_w, top_p * sum, &eK, &e_id, &sh);
                cut = true;
            }
        }
        auto drawn_w = [&](int i, float l) -> double {
            const double w = kept_w(i, l);
            return w > 0.0 && (!cut || sr_at_least(bt_smp_key(l), i, eK, e_id)) ? w : 0.0;
        };
        /* (without min_p or a cut the kept set is every candidate: that sum again) */
        double total = sum;
        if (keep_w > 0.0 || cut) {
            s = 0.0;
            sr_each(row, V, [&](int j, float l) { s += drawn_w(j, l); });
            total = sr_block_sum(s, &sh);
        }
        const double u = bt_smp_unit(p.seed, p.step) * total;
        const int got = sr_find(row, V, drawn_w, u, true, &sh);
        if (got >= 0) chosen = got;
    }

    /* the n_top most likely: the edge by counts, then every id at least as likely */
    if (n_top > 0) {
        uint32_t K = 0;
        int id_k = V - 1;
        sr_select_count(row, V, n_top, &K, &id_k, &sh);
        if (threadIdx.x == 0) sh.n_list = 0;
        __syncthreads();
        sr_each(row, V, [&](int j, float l) {
            if (sr_at_least(bt_smp_key(l), j, K, id_k)) {
                const int at = atomicAdd(&sh.n_list, 1);
                if (at < BT_CUDA_SAMPLE_TOP) sh.list_id[at] = j;
            }
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            const int m = min(sh.n_list, n_top);
            for (int a = 1; a < m; a++) { /* most likely first: insertion sort of <= 20 */
                const int x = sh.list_id[a];
                const uint32_t kx = bt_smp_key(row[x]);
                int b = a - 1;
                while (b >= 0 && !sr_at_least(bt_smp_key(row[sh.list_id[b]]), sh.list_id[b], kx, x)) {
                    sh.list_id[b + 1] = sh.list_id[b];
                    b--;
                }
                sh.list_id[b + 1] = x;
            }
            for (int a = 0; a < BT_CUDA_SAMPLE_TOP; a++) {
                out[t].top_id[a] = a < m ? sh.list_id[a] : -1;
                out[t].top_logprob[a] = a < m ? (float)((double)row[sh.list_id[a]] - lse) : 0.0f;
            }
        }
    } else if (threadIdx.x < BT_CUDA_SAMPLE_TOP) {
        out[t].top_id[threadIdx.x] = -1;
        out[t].top_logprob[threadIdx.x] = 0.0f;
    }
    if (threadIdx.x == 0) {
        out[t].id = chosen;
        out[t].logprob = p.want_logprob ? (float)((double)row[chosen] - lse) : 0.0f;
    }
}

__global__ void logit_adjust_kernel(float *logits, int64_t ld, const bt_cuda_logit_adjust_t *adj, int n)
{
    bt_grid_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float *p = logits + (size_t)adj[i].row * ld + adj[i].id;
    *p = __fsub_rn(*p, adj[i].amount);
}

extern "C" bt_status_t bt_cuda_logit_adjust(float *logits, int64_t ld, const bt_cuda_logit_adjust_t *adj,
                                            int n, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(logits && adj && n > 0 && ld > 0);
    bt__launch(logit_adjust_kernel, bt__cdiv(n, 256), 256, 0, stream, logits, ld, adj, n);
    return bt__cuda_launched("logit_adjust");
}

__global__ void logit_mask_kernel(float *logits, int64_t ld, const uint32_t *mask, int words, int V)
{
    bt_grid_begin();
    const int t = blockIdx.y;
    const int id = blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= V) return;
    if (!((mask[(size_t)t * words + (id >> 5)] >> (id & 31)) & 1u))
        logits[(size_t)t * ld + id] = -INFINITY;
}

extern "C" bt_status_t bt_cuda_logit_mask(float *logits, int64_t ld, const uint32_t *mask, int words,
                                          int T, int V, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(logits && mask && T > 0 && T <= 65535 && V > 0 && ld >= V && words >= (V + 31) / 32);
    bt__launch(logit_mask_kernel, dim3(bt__cdiv(V, 256), T), 256, 0, stream, logits, ld, mask, words, V);
    return bt__cuda_launched("logit_mask");
}

extern "C" bt_status_t bt_cuda_sample_rows(bt_cuda_sample_result_t *out,
                                           const bt_cuda_sample_params_t *params,
                                           const float *logits, int64_t ld, int T, int V,
                                           cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && params && logits && T > 0 && V > 0 && ld >= V);
    bt__launch(sample_rows_kernel, T, SR_THREADS, 0, stream, out, params, logits, ld, V);
    return bt__cuda_launched("sample_rows");
}

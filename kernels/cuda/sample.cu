/* Token sampling on the GPU, one block a row: the rules of services/engine/sampler.c (greedy,
 * temperature, top_k, top_p, min_p; the chosen token's log-probability and the most likely
 * tokens with theirs), so a decode step copies a few bytes a sequence to the host instead of
 * its logits row (129280 floats at the real vocabulary).
 *
 * The CPU finds its kept sets with a heap (top_k) and a partition (top_p); here each is a
 * threshold found by radix selection: 8 rounds of 4 bits over the logits' order-preserving
 * keys, each round summing the weights (or counts) of the keys that share the bits decided so
 * far, per value of the next 4 bits; ties on a logit are broken by id in one ordered scan. The
 * weights are sampler.c's, bit for bit (its e^x, rounded the same way), and both draw in id
 * order over the kept set, so the same (seed, step) picks the same token unless a sum's last
 * bits put the draw on the other side of a boundary. */
#include "kernels/cuda/common.cuh"

enum { SR_THREADS = 1024, SR_WARPS = SR_THREADS / 32 };

typedef struct {
    double part[SR_WARPS][16];
    double bins[16];
    double wsum[SR_WARPS];
    int wlast[SR_WARPS];
    float wmax[SR_WARPS];
    int wbest[SR_WARPS];
    uint32_t prefix;
    double above, total;
    int pick, found;
    int n_list;
    int32_t list_id[BT_CUDA_SAMPLE_TOP];
} sr_shared_t;

__device__ __forceinline__ uint64_t sr_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* sampler.c's exp_le0, operation for operation and without contractions into FMAs, so each
 * weight has the CPU's bits */
__device__ __forceinline__ float sr_exp_le0(float x)
{
    uint32_t u = __float_as_uint(x);
    const uint32_t pos = ~u >> 31, nonzero = (u | (0u - u)) >> 31;
    u |= (0u - (pos & ~nonzero & 1u)) & 0x80000000u;
    u = (u & (0u - (u >> 31))) | ((0u - (~u >> 31)) & 0xc2ae0000u);
    u = u < 0xc2ae0000u ? u : 0xc2ae0000u;
    const uint32_t keep = 0u - (uint32_t)(u != 0xc2ae0000u);
    x = __uint_as_float(u);
    const float t = __fmul_rn(x, 1.44269504f);
    const float n = __fsub_rn(__fadd_rn(t, 12582912.0f), 12582912.0f);
    const float f = __fmul_rn(__fsub_rn(t, n), 0.693147181f);
    float e = __fadd_rn(1.0f / 120, __fmul_rn(f, 1.0f / 720));
    e = __fadd_rn(1.0f / 24, __fmul_rn(f, e));
    e = __fadd_rn(1.0f / 6, __fmul_rn(f, e));
    e = __fadd_rn(0.5f, __fmul_rn(f, e));
    e = __fadd_rn(1.0f, __fmul_rn(f, e));
    e = __fadd_rn(1.0f, __fmul_rn(f, e));
    const float sc = __uint_as_float((uint32_t)((int32_t)n + 127) << 23);
    return __uint_as_float(__float_as_uint(__fmul_rn(e, sc)) & keep);
}

/* a logit's place in the order as an unsigned key: larger logit, larger key; -0 as +0 (they
 * compare equal on the CPU, which then orders by id); NaN lowest */
__device__ __forceinline__ uint32_t sr_key(float l)
{
    if (l != l) return 0u;
    uint32_t u = l == 0.0f ? 0u : __float_as_uint(l);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* (key, id) at least as likely as (K, id_k): a larger key, or the same and a lower id */
__device__ __forceinline__ bool sr_at_least(uint32_t key, int id, uint32_t K, int id_k)
{
    return key > K || (key == K && id <= id_k);
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
 * with weight; -1 when no id has weight. Warps take consecutive segments; the warp whose
 * segment crosses walks it 32 ids at a time. */
template <class Weight>
__device__ int sr_find(const float *row, int V, Weight weight, double target, bool strict,
                       sr_shared_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seg = (((V + SR_WARPS - 1) / SR_WARPS) + 31) & ~31;
    const int lo = warp * seg, hi = min(lo + seg, V);
    double s = 0.0;
    int last = -1;
    for (int i = lo + lane; i < hi; i += 32) {
        const double w = weight(i, row[i]);
        s += w;
        if (w > 0.0) last = i;
    }
    s = sr_warp_sum(s);
    for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    __syncthreads();
    if (lane == 0) {
        sh->wsum[warp] = s;
        sh->wlast[warp] = last;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double run = 0.0;
        int pick = -1, any = -1;
        for (int w = 0; w < SR_WARPS; w++) {
            if (sh->wlast[w] >= 0) any = w;
            const double next = run + sh->wsum[w];
            if (pick < 0 && (strict ? next > target : next >= target)) {
                pick = w;
                sh->above = run;
            }
            if (pick < 0) run = next;
        }
        sh->pick = pick;
        sh->found = pick < 0 ? (any < 0 ? -1 : sh->wlast[any]) : -1;
    }
    __syncthreads();
    const int pick = sh->pick;
    if (warp == pick) {
        double run = sh->above;
        int got = -1;
        for (int i0 = lo; i0 < hi && got < 0; i0 += 32) {
            const int i = i0 + lane;
            const double w = i < hi ? weight(i, row[i]) : 0.0;
            double incl = w;
            for (int o = 1; o < 32; o <<= 1) {
                const double v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const bool hit = w > 0.0 && (strict ? run + incl > target : run + incl >= target);
            const unsigned b = __ballot_sync(0xffffffffu, hit);
            if (b) got = i0 + __ffs(b) - 1;
            run += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) sh->found = got >= 0 ? got : sh->wlast[pick];
    }
    __syncthreads();
    const int found = sh->found;
    __syncthreads();
    return found;
}

/* The edge (K, id_k) of the most likely ids whose weight reaches target: the weight of the
 * (key, id) at least as likely as it reaches target, of those more likely does not. Weights
 * are counts (top_k, the most likely n) or probabilities (top_p); WT the type they are summed
 * in. The caller makes sure the whole row's weight reaches target. */
template <class WT, class Weight>
__device__ void sr_select(const float *row, int V, Weight weight, double target, uint32_t *K,
                          int *id_k, sr_shared_t *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t prefix = 0;
    double above = 0.0;
    for (int shift = 28; shift >= 0; shift -= 4) {
        const uint32_t high = shift == 28 ? 0u : 0xffffffffu << (shift + 4);
        WT s[16];
#pragma unroll
        for (int j = 0; j < 16; j++) s[j] = 0;
        for (int i = threadIdx.x; i < V; i += SR_THREADS) {
            const float l = row[i];
            const uint32_t key = sr_key(l);
            if ((key & high) != prefix) continue;
            const WT w = (WT)weight(i, l);
            const uint32_t d = (key >> shift) & 15u;
#pragma unroll
            for (int j = 0; j < 16; j++) s[j] += d == (uint32_t)j ? w : (WT)0;
        }
#pragma unroll
        for (int j = 0; j < 16; j++) {
            double v = (double)s[j];
            v = sr_warp_sum(v);
            if (lane == 0) sh->part[warp][j] = v;
        }
        __syncthreads();
        if (threadIdx.x < 16) {
            double v = 0.0;
            for (int w = 0; w < SR_WARPS; w++) v += sh->part[w][threadIdx.x];
            sh->bins[threadIdx.x] = v;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double acc = above;
            int d = -1;
            for (int j = 15; j >= 0; j--) {
                if (acc + sh->bins[j] >= target) {
                    d = j;
                    break;
                }
                acc += sh->bins[j];
            }
            if (d < 0) { /* rounding: the lowest digit keeps everything left */
                d = 0;
                acc -= sh->bins[0];
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
        row, V, [&](int i, float l) { return sr_key(l) == k ? (double)weight(i, l) : 0.0; },
        target - above, false, sh);
    *K = k;
    *id_k = id >= 0 ? id : V - 1;
}

__global__ void __launch_bounds__(SR_THREADS)
    sample_rows_kernel(bt_cuda_sample_result_t *out, const bt_cuda_sample_params_t *params,
                       const float *logits, int64_t ld, int V)
{
    __shared__ sr_shared_t sh;
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *row = logits + (size_t)t * ld;
    const bt_cuda_sample_params_t p = params[t];

    /* the argmax, ties to the lower id */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += SR_THREADS) {
        const float l = row[j];
        if (l > bv || (l == bv && j < bi)) {
            bv = l;
            bi = j;
        }
    }
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
        for (int j = threadIdx.x; j < V; j += SR_THREADS) s += (double)sr_exp_le0(__fsub_rn(row[j], mx));
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
            sr_select<float>(row, V, [](int, float) { return 1.0f; }, (double)n, &kK, &k_id, &sh);
        auto weight = [&](int i, float l) -> float {
            if (topk && !sr_at_least(sr_key(l), i, kK, k_id)) return -1.0f; /* not a candidate */
            return sr_exp_le0(__fmul_rn(__fsub_rn(l, mx), inv_t));
        };
        double s = 0.0;
        for (int j = threadIdx.x; j < V; j += SR_THREADS) s += (double)fmaxf(weight(j, row[j]), 0.0f);
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
            for (int j = threadIdx.x; j < V; j += SR_THREADS) s += kept_w(j, row[j]);
            if (sr_block_sum(s, &sh) >= top_p * sum) {
                sr_select<double>(row, V, kept_w, top_p * sum, &eK, &e_id, &sh);
                cut = true;
            }
        }
        auto drawn_w = [&](int i, float l) -> double {
            const double w = kept_w(i, l);
            return w > 0.0 && (!cut || sr_at_least(sr_key(l), i, eK, e_id)) ? w : 0.0;
        };
        s = 0.0;
        for (int j = threadIdx.x; j < V; j += SR_THREADS) s += drawn_w(j, row[j]);
        const double total = sr_block_sum(s, &sh);
        const uint64_t r = sr_mix64(p.seed ^ sr_mix64(p.step + 0x51ed2701u));
        const double u = (double)(r >> 11) * 0x1p-53 * total;
        const int got = sr_find(row, V, drawn_w, u, true, &sh);
        if (got >= 0) chosen = got;
    }

    /* the n_top most likely: the edge by counts, then every id at least as likely */
    if (n_top > 0) {
        uint32_t K = 0;
        int id_k = V - 1;
        sr_select<float>(row, V, [](int, float) { return 1.0f; }, (double)n_top, &K, &id_k, &sh);
        if (threadIdx.x == 0) sh.n_list = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < V; j += SR_THREADS)
            if (sr_at_least(sr_key(row[j]), j, K, id_k)) {
                const int at = atomicAdd(&sh.n_list, 1);
                if (at < BT_CUDA_SAMPLE_TOP) sh.list_id[at] = j;
            }
        __syncthreads();
        if (threadIdx.x == 0) {
            const int m = min(sh.n_list, n_top);
            for (int a = 1; a < m; a++) { /* most likely first: insertion sort of <= 20 */
                const int x = sh.list_id[a];
                const uint32_t kx = sr_key(row[x]);
                int b = a - 1;
                while (b >= 0 && !sr_at_least(sr_key(row[sh.list_id[b]]), sh.list_id[b], kx, x)) {
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

extern "C" bt_status_t bt_cuda_sample_rows(bt_cuda_sample_result_t *out,
                                           const bt_cuda_sample_params_t *params,
                                           const float *logits, int64_t ld, int T, int V,
                                           cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && params && logits && T > 0 && V > 0 && ld >= V);
    sample_rows_kernel<<<T, SR_THREADS, 0, stream>>>(out, params, logits, ld, V);
    return bt__cuda_launched("sample_rows");
}

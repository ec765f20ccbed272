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
__global__ void __launch_bounds__(RT_MAXE)
    moe_route_block_kernel(int32_t *idx, float *wts, const float *logits, const float *bias, int E,
                           int K, float temp, int norm, float route_scale)
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

/* ---- MoE rows grouped by expert, on the device -------------------------------------------
 * One block; item j = t * K + i (token t's i-th pick), one a thread (N * K <= GROUP_THREADS),
 * expert e a thread (E <= GROUP_THREADS). An expert's rows keep token order, as the host's
 * counting sort: item j lands at off[e] + (items before j that chose e). The offsets and the
 * list of experts hit are block-wide scans of the experts' counts (the warps' totals scanned
 * by a warp); an item's rank among its expert's is counted a warp of items at a time, in order
 * (__match_any_sync within the warp, a running count per expert across warps). The form
 * before (a thread walking all earlier items, the warps' totals added one by one) took ~10 us
 * after the routing at a decode step (layer bench trace, H100, session 36). */
enum { GROUP_THREADS = BT_CUDA_MOE_GROUP_MAX };

__global__ void __launch_bounds__(GROUP_THREADS)
    moe_group_kernel(int32_t *offs, int32_t *xrow, float *wt_g, int32_t *rows, int32_t *cnt,
                     int32_t *hit, int n_hit_slots, int32_t *bad, int32_t bad_value,
                     const int32_t *idx, const float *wts, int N, int K, int E)
{
    bt_grid_begin();
    /* count: the experts' rows, then their first grouped rows; seen: rows placed so far */
    __shared__ int count[GROUP_THREADS + 1], seen[GROUP_THREADS], pos_of[GROUP_THREADS];
    __shared__ int scan[66];
    const int total = N * K, j = threadIdx.x, lane = j & 31, warp = j >> 5;
    int e = -1;
    float wv = 0.0f;
    if (j < total) e = idx[j], wv = wts[j];
    if (j <= E) count[j] = 0;
    if (j < E) seen[j] = 0;
    if (j == 0 && E == GROUP_THREADS) count[E] = 0;
    __syncthreads();
    if (j < total && (e < 0 || e >= E)) {
        atomicCAS(bad, 0, bad_value); /* the first to report; the caller fails the forward */
        e = -1;
    }
    if (e >= 0) atomicAdd(&count[e], 1);
    __syncthreads();
    /* expert j's rows and whether it is hit, scanned over the block (exclusive) */
    const int c = j < E ? count[j] : 0, h = c > 0;
    const int r_incl = bt_warp_incl_sum(c), h_incl = bt_warp_incl_sum(h);
    if (lane == 31) scan[warp] = r_incl, scan[32 + warp] = h_incl;
    __syncthreads();
    if (warp == 0) { /* the warps' totals, scanned by a warp */
        const int a = scan[lane], b = scan[32 + lane];
        const int ai = bt_warp_incl_sum(a), bi = bt_warp_incl_sum(b);
        scan[lane] = ai - a, scan[32 + lane] = bi - b;
        if (lane == 31) scan[64] = ai, scan[65] = bi;
    }
    __syncthreads();
    const int r_off = scan[warp] + r_incl - c, h_off = scan[32 + warp] + h_incl - h;
    const int n_hit = scan[65];
    if (j < E) {
        count[j] = r_off; /* now the expert's first grouped row */
        offs[j] = r_off;
        if (h && h_off < n_hit_slots) hit[h_off] = j;
    }
    if (j == 0) offs[E] = scan[64];
    for (int x = n_hit + j; x < n_hit_slots; x += GROUP_THREADS)
        hit[x] = -1;
    __syncthreads();
    /* item j's grouped row: its expert's first, the rows earlier warps placed there, and the
     * lanes before it in its warp that chose the same */
    int p = -1;
    for (int w = 0; w < (total + 31) / 32; w++) {
        if (warp == w) {
            const unsigned m = __match_any_sync(0xffffffffu, e);
            const int before = __popc(m & ((1u << lane) - 1));
            const int base = e >= 0 ? seen[e] : 0;
            __syncwarp();
            if (e >= 0) {
                p = count[e] + base + before;
                if (before == 0) seen[e] = base + __popc(m);
            }
        }
        __syncthreads();
    }
    if (p >= 0) {
        xrow[p] = j / K;
        wt_g[p] = wv;
    }
    if (j < total) pos_of[j] = p;
    __syncthreads();
    /* each token's rows in expert order (ascending grouped position) */
    if (j < total && p >= 0) {
        int t = j / K, rank = 0;
        for (int q = t * K; q < t * K + K; q++)
            rank += pos_of[q] >= 0 && pos_of[q] < p;
        rows[t * K + rank] = p;
    }
    if (j < N) {
        int cn = 0;
        for (int q = j * K; q < j * K + K; q++)
            cn += pos_of[q] >= 0;
        cnt[j] = cn;
    }
}

extern "C" bt_status_t bt_cuda_moe_group(int32_t *offs, int32_t *xrow, float *wt_g, int32_t *rows,
                                         int32_t *cnt, int32_t *hit, int n_hit_slots, int32_t *bad,
                                         int32_t bad_value, const int32_t *idx, const float *wts,
                                         int N, int K, int E, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(offs && xrow && wt_g && rows && cnt && hit && bad && idx && wts &&
                    bad_value != 0);
    BT_CUDA_REQUIRE(N > 0 && K > 0 && E > 0 && E <= GROUP_THREADS && N * K <= GROUP_THREADS);
    BT_CUDA_REQUIRE(n_hit_slots >= (E < N * K ? E : N * K));
    bt__launch(moe_group_kernel, 1, GROUP_THREADS, 0, stream, offs, xrow, wt_g, rows, cnt, hit,
               n_hit_slots, bad, bad_value, idx, wts, N, K, E);
    return bt__cuda_launched("moe_group");
}

/* ---- a decode step's router logits -----------------------------------------------------
 * logits [T, E] = x [T, D] . w [E, D]^T in f32 for a few rows. The product it replaces for
 * the engine's decode (gemm_f32_rows_kernel: a warp an expert, walking all of K one 128-byte
 * piece at a time) took ~40 us of a 384 x 5120 router. Here the product is split over blocks
 * of 64 experts x one slice of K (about a wave of them): a thread takes an expert (column) and
 * a quarter of the slice, k ascending, for every token at once (the slice of the rows staged in
 * shared memory as f32); the quarters are added in order, each slice's sums go to a workspace,
 * and the last block of a column group (a counter, reset by that block for the next launch,
 * which waits for this grid to end) adds the slices in order into the logits. Every sum's
 * order depends on E and D alone, so a token's logits are the same bits in any batch. */
enum {
    RL_THREADS = 256,
    RL_COLS = 64,
    RL_PARTS = RL_THREADS / RL_COLS,
    RL_MAX_T = BT_CUDA_ROUTER_MAX_TOKENS,
    RL_WAVE = 132,
    RL_AHEAD = 16,
    RL_MAX_SMEM = 160 * 1024 /* dynamic shared memory a launch may take */
};
static_assert(RT_MAXE / RL_COLS <= BT_CUDA_ROUTER_COUNTERS, "a counter a column group");

/* the split of the product: column groups, K slices of ks (a multiple of 4 a quarter) */
struct rl_plan {
    int groups, slices, ks;
};

static rl_plan rl_plan_of(int E, int D)
{
    rl_plan p;
    p.groups = bt__cdiv(E, RL_COLS);
    int s = RL_WAVE / p.groups;
    if (s < 1) s = 1;
    p.ks = bt__cdiv(bt__cdiv(D, s), 4 * RL_PARTS) * 4 * RL_PARTS;
    p.slices = bt__cdiv(D, p.ks);
    return p;
}

/* 4 weights (read-only path) and 4 values of a row an earlier kernel wrote (plain loads) */
__device__ __forceinline__ float4 rl_bf16x4(uint2 v)
{
    const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&v.x),
                 b = __bfloat1622float2(*(const __nv_bfloat162 *)&v.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 rl_weights4(const float *p)
{
    return __ldg((const float4 *)p);
}
__device__ __forceinline__ float4 rl_weights4(const __nv_bfloat16 *p)
{
    return rl_bf16x4(__ldg((const uint2 *)p));
}
__device__ __forceinline__ float4 rl_row4(const float *p)
{
    return *(const float4 *)p;
}
__device__ __forceinline__ float4 rl_row4(const __nv_bfloat16 *p)
{
    return rl_bf16x4(*(const uint2 *)p);
}

template <typename XT>
__global__ void __launch_bounds__(RL_THREADS)
    moe_router_logits_kernel(float *logits, const XT *x, int ldx, const XT *w, int T, int E, int D,
                             float *ws, unsigned *counters, rl_plan plan)
{
    extern __shared__ float4 rl_shared[];
    float *xs = (float *)rl_shared;        /* [T, ks]: the rows' slice */
    float *red = xs + (size_t)T * plan.ks; /* [PARTS, T, COLS] */
    __shared__ bool last;
    const int ks = plan.ks, S = plan.slices;
    const int s = blockIdx.x, g = blockIdx.y, col = threadIdx.x % RL_COLS,
              part = threadIdx.x / RL_COLS, e = g * RL_COLS + col;
    const int k0 = s * ks, k1 = min(D, k0 + ks), q = ks / RL_PARTS;
    const int pk0 = min(k1, k0 + part * q), pk1 = min(k1, pk0 + q);
    const XT *wr = w + (size_t)min(e, E - 1) * D;
    /* the first weights before the wait (they are no kernel's output) */
    float4 wv = pk0 < pk1 ? rl_weights4(wr + pk0) : make_float4(0.f, 0.f, 0.f, 0.f);
    bt_grid_begin();
    for (int t = 0; t < T; t++) /* 4 k a load (k0, ks, D and ldx multiples of 4) */
        for (int i = 4 * threadIdx.x; i < ks; i += 4 * RL_THREADS)
            *(float4 *)(xs + (size_t)t * ks + i) = k0 + i < k1
                                                       ? rl_row4(x + (size_t)t * ldx + k0 + i)
                                                       : make_float4(0.f, 0.f, 0.f, 0.f);
    __syncthreads();
    float acc[RL_MAX_T];
#pragma unroll
    for (int t = 0; t < RL_MAX_T; t++)
        acc[t] = 0.0f;
    /* RL_AHEAD loads of 4 k at a time, all in flight before their products */
    for (int kb = pk0; kb < pk1; kb += 4 * RL_AHEAD) {
        float4 wb[RL_AHEAD];
        wb[0] = wv;
#pragma unroll
        for (int j = 1; j < RL_AHEAD; j++)
            wb[j] =
                kb + 4 * j < pk1 ? rl_weights4(wr + kb + 4 * j) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (kb + 4 * RL_AHEAD < pk1) wv = rl_weights4(wr + kb + 4 * RL_AHEAD);
#pragma unroll
        for (int j = 0; j < RL_AHEAD; j++) {
            const int k = kb + 4 * j;
            if (k >= pk1) break;
#pragma unroll
            for (int t = 0; t < RL_MAX_T; t++) {
                if (t >= T) break;
                const float4 xv = *(const float4 *)(xs + (size_t)t * ks + (k - k0));
                acc[t] = fmaf(wb[j].x, xv.x, acc[t]);
                acc[t] = fmaf(wb[j].y, xv.y, acc[t]);
                acc[t] = fmaf(wb[j].z, xv.z, acc[t]);
                acc[t] = fmaf(wb[j].w, xv.w, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < RL_MAX_T; t++)
        if (t < T) red[((size_t)part * T + t) * RL_COLS + col] = acc[t];
    __syncthreads();
    /* the slice's sums: the quarters in order */
    for (int i = threadIdx.x; i < T * RL_COLS; i += RL_THREADS) {
        const int t = i / RL_COLS, c = i % RL_COLS, ec = g * RL_COLS + c;
        float v = red[(size_t)t * RL_COLS + c];
        for (int p = 1; p < RL_PARTS; p++)
            v += red[((size_t)p * T + t) * RL_COLS + c];
        if (ec < E) ws[((size_t)s * T + t) * E + ec] = v;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[g], 1u) == (unsigned)S - 1;
    __syncthreads();
    if (!last) return;
    /* the group's last slice: the slices in order into the logits */
    __threadfence();
    for (int i = threadIdx.x; i < T * RL_COLS; i += RL_THREADS) {
        const int t = i / RL_COLS, ec = g * RL_COLS + i % RL_COLS;
        if (ec >= E) continue;
        const float *p = ws + (size_t)t * E + ec;
        const size_t step = (size_t)T * E;
        float v = 0.0f;
        for (int j0 = 0; j0 < S; j0 += RL_AHEAD) { /* the loads in flight together */
            float b[RL_AHEAD];
#pragma unroll
            for (int j = 0; j < RL_AHEAD; j++)
                b[j] = j0 + j < S ? __ldcg(p + (j0 + j) * step) : 0.0f;
#pragma unroll
            for (int j = 0; j < RL_AHEAD; j++)
                if (j0 + j < S) v = j0 + j == 0 ? b[j] : v + b[j];
        }
        logits[(size_t)t * E + ec] = v;
    }
    if (threadIdx.x == 0) counters[g] = 0; /* for the next launch */
}

/* the dynamic shared memory of a launch: the rows' slice and the quarters' sums */
static size_t rl_smem(int T, const rl_plan &p)
{
    return ((size_t)T * p.ks + (size_t)RL_PARTS * T * RL_COLS) * sizeof(float);
}

extern "C" size_t bt_cuda_moe_router_ws_floats(int T, int E, int D)
{
    if (T <= 0 || E <= 0 || D <= 0) return 0;
    return (size_t)rl_plan_of(E, D).slices * T * E;
}

extern "C" int bt_cuda_moe_router_fits(int T, int E, int D)
{
    return T > 0 && T <= RL_MAX_T && E > 0 && E <= RT_MAXE && D > 0 && D % 4 == 0 &&
           rl_smem(T, rl_plan_of(E, D)) <= RL_MAX_SMEM;
}

extern "C" bt_status_t bt_cuda_moe_router_logits(float *logits, bt_cuda_dtype_t x_dtype,
                                                 const void *x, int ldx, const void *w, int T,
                                                 int E, int D, float *ws, size_t ws_floats,
                                                 unsigned *counters, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(logits && x && w && ws && counters && bt__dtype_ok(x_dtype));
    BT_CUDA_REQUIRE(bt_cuda_moe_router_fits(T, E, D) && ldx >= D && ldx % 4 == 0 &&
                    ws_floats >= bt_cuda_moe_router_ws_floats(T, E, D));
    const size_t align = x_dtype == BT_CUDA_BF16 ? 8 : 16; /* 4 values a load */
    BT_CUDA_REQUIRE((uintptr_t)w % align == 0 && (uintptr_t)x % align == 0);
    const rl_plan plan = rl_plan_of(E, D);
    const size_t smem = rl_smem(T, plan);
    const bool bf16 = x_dtype == BT_CUDA_BF16;
    const void *fn = bf16 ? (const void *)moe_router_logits_kernel<__nv_bfloat16>
                          : (const void *)moe_router_logits_kernel<float>;
    static signed char allowed[2][BT__MAX_DEVICES]; /* (past the default 48 KB, per instance) */
    if (smem > 48 * 1024 && !bt__smem_allowed(fn, RL_MAX_SMEM, allowed[bf16])) {
        fprintf(stderr,
                "cuda: moe_router_logits: %d bytes of shared memory refused on this device\n",
                (int)RL_MAX_SMEM);
        return BT_ERR_DEVICE;
    }
    const dim3 grid(plan.slices, plan.groups);
    if (bf16)
        bt__launch(moe_router_logits_kernel<__nv_bfloat16>, grid, RL_THREADS, smem, stream, logits,
                   (const __nv_bfloat16 *)x, ldx, (const __nv_bfloat16 *)w, T, E, D, ws, counters,
                   plan);
    else
        bt__launch(moe_router_logits_kernel<float>, grid, RL_THREADS, smem, stream, logits,
                   (const float *)x, ldx, (const float *)w, T, E, D, ws, counters, plan);
    return bt__cuda_launched("moe_router_logits");
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
    const float y = bt_swiglu(gu[r * 2 * I + c], gu[r * 2 * I + I + c], limit);
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
        const float y = bt_swiglu(g[j], uu[j], limit);
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

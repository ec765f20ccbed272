/* Window + sparse attention for one query row per token, K = V, with attention sinks.
 * One block = one token and 8 heads (a warp each). Keys (window rows, then the selected
 * compressed rows) are staged 16 at a time in shared memory as f32 and shared by the 8 heads;
 * each warp keeps its query and output in registers (dims lane, lane+32, ...) and runs an
 * online softmax that starts from the sink (m = sink, l = 1). The inverse RoPE of the output's
 * last 2*half channels is fused at the end (pair partners sit in neighbouring lanes). */
#include "kernels/cuda/common.cuh"

enum { ATT_WARPS = 8, ATT_KEYS = 16, ATT_MAXD = 512, ATT_PER_LANE = ATT_MAXD / 32 };

/* Key splits (flash-decoding) when (tokens x head groups) leave the GPU idle: enough blocks
 * for about two waves on 132 SMs, at least 64 keys per split, at most 32 splits. */
static int att_splits(int T, int H, int max_keys)
{
    long blocks = (long)T * bt__cdiv(H, ATT_WARPS);
    int s = (int)((264 + blocks - 1) / blocks);
    int by_keys = max_keys / 64;
    if (s > by_keys) s = by_keys;
    if (s > 32) s = 32;
    return s < 1 ? 1 : s;
}

/* splits == 1: the whole softmax, normalized and rotated, into out. splits > 1: block z takes
 * keys [z * chunk, z * chunk + chunk) and writes its unnormalized partial (max, sum, o[dim])
 * to work[((t * H + h) * splits + z) * (dim + 2)], for attention_combine_kernel. */
template <typename T, bool SPLIT>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(
    T *out, const T *q, const T *win_kv, const int64_t *win_off, const int32_t *win_idx,
    const int32_t *win_n, int win_stride, const T *comp_kv, const int64_t *comp_off,
    const int32_t *sel, const int32_t *sel_n, int sel_stride, const float *sink,
    const int64_t *pos, const float *inv_freq, int half, int H, int dim, int splits, int chunk,
    float *work)
{
    bt_grid_begin();
    __shared__ float keys[ATT_KEYS][ATT_MAXD];
    int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int h = blockIdx.x * ATT_WARPS + warp;
    bool active = h < H;
    int nd = (dim + 31) / 32, dimr = nd * 32; /* lanes past dim hold zeros */
    /* this token's caches (apart per sequence in a batch) */
    const int64_t coff = comp_off ? comp_off[t] : 0;
    const bool has_sel = sel_n && coff >= 0;
    const T *wkv = win_kv + (win_off ? win_off[t] : 0), *ckv = has_sel ? comp_kv + coff : comp_kv;
    int nw = win_n[t], ns = has_sel ? sel_n[t] : 0, nk = nw + ns;
    int k_lo = 0;
    if (SPLIT) {
        k_lo = blockIdx.z * chunk;
        nk = min(nk, k_lo + chunk);
    }
    float scale = 1.0f / sqrtf((float)dim);

    float qv[ATT_PER_LANE], o[ATT_PER_LANE];
    const T *qh = q + ((size_t)t * H + (active ? h : 0)) * dim;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        qv[i] = lane + 32 * i < dim ? bt_ld(qh, lane + 32 * i) : 0.0f;
        o[i] = 0.0f;
    }
    /* the whole softmax starts from the sink (m = sink, l = 1); a partial from nothing */
    float m = SPLIT ? -INFINITY : (active ? sink[h] : 0.0f), l = SPLIT ? 0.0f : 1.0f;

    for (int c0 = k_lo; c0 < nk; c0 += ATT_KEYS) {
        int kc = min(ATT_KEYS, nk - c0);
        __syncthreads();
        for (int e = threadIdx.x; e < kc * dimr; e += ATT_WARPS * 32) {
            int c = e / dimr, d = e % dimr, j = c0 + c;
            const T *row = j < nw ? wkv + (size_t)win_idx[(size_t)t * win_stride + j] * dim
                                  : ckv + (size_t)sel[(size_t)t * sel_stride + (j - nw)] * dim;
            keys[c][d] = d < dim ? bt_ld(row, d) : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        float s[ATT_KEYS];
        float mc = -INFINITY;
#pragma unroll
        for (int c = 0; c < ATT_KEYS; c++) {
            float p = 0.0f;
            if (c < kc) {
#pragma unroll
                for (int i = 0; i < ATT_PER_LANE; i++)
                    if (i < nd) p += qv[i] * keys[c][lane + 32 * i];
                p = bt_warp_sum(p) * scale;
                mc = fmaxf(mc, p);
            }
            s[c] = p;
        }
        float mn = fmaxf(m, mc), alpha = SPLIT && m == -INFINITY ? 0.0f : expf(m - mn);
        l *= alpha;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) o[i] *= alpha;
#pragma unroll
        for (int c = 0; c < ATT_KEYS; c++) {
            if (c < kc) {
                float p = expf(s[c] - mn);
                l += p;
#pragma unroll
                for (int i = 0; i < ATT_PER_LANE; i++)
                    if (i < nd) o[i] += p * keys[c][lane + 32 * i];
            }
        }
        m = mn;
    }
    if (!active) return;
    if (SPLIT) {
        float *w = work + (((size_t)t * H + h) * splits + blockIdx.z) * (dim + 2);
        if (lane == 0) w[0] = m, w[1] = l;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++)
            if (i < nd && lane + 32 * i < dim) w[2 + lane + 32 * i] = o[i];
        return;
    }
    float inv = 1.0f / l;
    int r0 = dim - 2 * half;
    float p64 = (float)pos[t];
    T *oh = out + ((size_t)t * H + h) * dim;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        if (i >= nd) break;
        int d = lane + 32 * i;
        float v = o[i] * inv;
        float partner = __shfl_xor_sync(0xffffffffu, v, 1);
        if (d >= dim) continue; /* after the shuffle: every lane takes part in it */
        if (d >= r0) {
            float f = inv_freq[(d - r0) >> 1] * p64;
            float cs = cosf(f), sn = -sinf(f);
            v = (d & 1) ? partner * sn + v * cs : v * cs - partner * sn;
        }
        bt_st(oh, d, v);
    }
}

/* Folds the partials of every split (at most 32) with the sink: M = max(sink, m_z),
 * L = e^(sink - M) + sum l_z e^(m_z - M), out = sum o_z e^(m_z - M) / L, then the inverse
 * RoPE; splits with l_z = 0 (no keys) left out. One block per (head, token), a thread per pair
 * of channels; the first warp folds the (m, l) pairs a lane each (one thread walking them
 * twice, dependent loads, was most of a decode step's combine). */
template <typename T>
__global__ void attention_combine_kernel(T *out, const float *work, const float *sink,
                                         const int64_t *pos, const float *inv_freq, int half, int H,
                                         int dim, int splits)
{
    bt_grid_begin();
    __shared__ float ez_s[32], inv_s;
    __shared__ unsigned used_s;
    int h = blockIdx.x, t = blockIdx.y;
    const float *w = work + ((size_t)t * H + h) * splits * (dim + 2);
    if (threadIdx.x < 32) {
        const int z = threadIdx.x;
        const float mz = z < splits ? w[z * (dim + 2)] : 0.0f;
        const float lz = z < splits ? w[z * (dim + 2) + 1] : 0.0f;
        const bool has = z < splits && lz > 0.0f;
        const float M = fmaxf(sink[h], bt_warp_max(has ? mz : -INFINITY));
        const float ez = has ? expf(mz - M) : 0.0f;
        const float L = expf(sink[h] - M) + bt_warp_sum(has ? lz * ez : 0.0f);
        ez_s[z] = ez;
        const unsigned used = __ballot_sync(0xffffffffu, has);
        if (z == 0) {
            used_s = used;
            inv_s = 1.0f / L;
        }
    }
    __syncthreads();
    const unsigned used = used_s;
    const float inv = inv_s, p64 = (float)pos[t];
    int r0 = dim - 2 * half;
    T *oh = out + ((size_t)t * H + h) * dim;
    for (int d = 2 * threadIdx.x; d < dim; d += 2 * blockDim.x) {
        float v[2];
        for (int e = 0; e < 2; e++) {
            float acc = 0.0f;
            for (int z = 0; z < splits; z++)
                if (used >> z & 1) acc += w[(size_t)z * (dim + 2) + 2 + d + e] * ez_s[z];
            v[e] = acc * inv;
        }
        if (d >= r0) {
            float f = inv_freq[(d - r0) >> 1] * p64;
            float cs = cosf(f), sn = -sinf(f);
            float a = v[0], b = v[1];
            v[0] = a * cs - b * sn;
            v[1] = b * cs + a * sn;
        }
        bt_st(oh, d, v[0]);
        bt_st(oh, d + 1, v[1]);
    }
}

extern "C" bt_status_t bt_cuda_attention(void *out, const void *q, const void *win_kv,
                                         const int32_t *win_idx, const int32_t *win_n,
                                         int win_stride, const void *comp_kv, const int32_t *sel,
                                         const int32_t *sel_n, int sel_stride, const float *sink,
                                         const int64_t *pos, const float *inv_freq, int half,
                                         bt_cuda_dtype_t dtype, int T, int H, int dim,
                                         cudaStream_t stream)
{
    return bt_cuda_attention_ws(out, q, win_kv, win_idx, win_n, win_stride, comp_kv, sel, sel_n,
                                sel_stride, sink, pos, inv_freq, half, dtype, T, H, dim, NULL, 0,
                                NULL, stream);
}

extern "C" size_t bt_cuda_attention_ws_floats(int T, int H, int dim, int max_keys)
{
    return (size_t)T * H * (size_t)att_splits(T, H, max_keys) * (size_t)(dim + 2);
}

extern "C" bt_status_t bt_cuda_attention_ws(void *out, const void *q, const void *win_kv,
                                         const int32_t *win_idx, const int32_t *win_n,
                                         int win_stride, const void *comp_kv, const int32_t *sel,
                                         const int32_t *sel_n, int sel_stride, const float *sink,
                                         const int64_t *pos, const float *inv_freq, int half,
                                         bt_cuda_dtype_t dtype, int T, int H, int dim,
                                         float *work, size_t work_floats,
                                         const bt_cuda_attention_batch_t *batch,
                                         cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && q && win_kv && win_idx && win_n && sink && pos && bt__dtype_ok(dtype));
    BT_CUDA_REQUIRE(!sel_n || (sel && comp_kv));
    BT_CUDA_REQUIRE(T > 0 && H > 0 && dim > 0 && dim % 2 == 0 && dim <= ATT_MAXD);
    BT_CUDA_REQUIRE(half >= 0 && 2 * half <= dim && (half == 0 || inv_freq));
    int max_keys = win_stride + (sel_n ? sel_stride : 0);
    bool per_token = batch && batch->split_per_token;
    int chunk;
    int splits = bt__attention_fit_splits(work ? att_splits(per_token ? 1 : T, H, max_keys) : 1, T,
                                          H, dim, max_keys, ATT_KEYS, work_floats, per_token,
                                          &chunk);
    BT_CUDA_REQUIRE(splits >= 1); /* per token: the workspace holds every token's splits */
    dim3 grid(bt__cdiv(H, ATT_WARPS), T, splits);
    const int64_t *win_off = batch ? batch->win_off : NULL, *comp_off = batch ? batch->comp_off : NULL;
    typedef __nv_bfloat16 bf;
    /* the split and the whole kernel are separate instances: the whole one (prefill) keeps the
     * registers and code it had before splits existed */
#define ATT_LAUNCH(TY, SP)                                                                         \
    bt__launch(attention_kernel<TY, SP>, grid, ATT_WARPS * 32, 0, stream, (TY *)out,               \
               (const TY *)q, (const TY *)win_kv, win_off, win_idx, win_n, win_stride,             \
               (const TY *)comp_kv, comp_off, sel, sel_n, sel_stride, sink, pos, inv_freq, half,   \
               H, dim, splits, chunk, work)
    if (dtype == BT_CUDA_F32) {
        if (splits > 1) ATT_LAUNCH(float, true);
        else ATT_LAUNCH(float, false);
    } else {
        if (splits > 1) ATT_LAUNCH(bf, true);
        else ATT_LAUNCH(bf, false);
    }
#undef ATT_LAUNCH
    bt_status_t st = bt__cuda_launched("attention");
    if (st != BT_OK || splits == 1) return st;
    return bt__attention_combine(out, dtype, work, sink, pos, inv_freq, half, T, H, dim, splits,
                                 stream);
}

int bt__attention_fit_splits(int splits, int T, int H, int dim, int max_keys, int unit,
                             size_t work_floats, bool fixed, int *chunk)
{
    if (fixed && splits > 1 && (size_t)T * H * splits * (dim + 2) > work_floats) return -1;
    while (splits > 1 && (size_t)T * H * splits * (dim + 2) > work_floats) splits--;
    /* whole staging rounds per split; the splits that are left hold keys */
    *chunk = bt__cdiv(bt__cdiv(max_keys > 0 ? max_keys : 1, splits), unit) * unit;
    return splits > 1 ? bt__cdiv(max_keys, *chunk) : 1;
}

bt_status_t bt__attention_combine(void *out, bt_cuda_dtype_t dtype, const float *work,
                                  const float *sink, const int64_t *pos, const float *inv_freq,
                                  int half, int T, int H, int dim, int splits, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(splits >= 1 && splits <= 32);
    dim3 cgrid(H, T);
    int threads = min(256, (dim / 2 + 31) / 32 * 32); /* a warp at least */
    if (dtype == BT_CUDA_F32)
        bt__launch(attention_combine_kernel<float>, cgrid, threads, 0, stream, (float *)out, work,
                   sink, pos, inv_freq, half, H, dim, splits);
    else
        bt__launch(attention_combine_kernel<__nv_bfloat16>, cgrid, threads, 0, stream,
                   (__nv_bfloat16 *)out, work, sink, pos, inv_freq, half, H, dim, splits);
    return bt__cuda_launched("attention_combine");
}

/* Window + sparse attention for one query row per token, K = V, with attention sinks.
 * One block = one token and 8 heads (a warp each). Keys (window rows, then the selected
 * compressed rows) are staged 16 at a time in shared memory as f32 and shared by the 8 heads;
 * each warp keeps its query and output in registers (dims lane, lane+32, ...) and runs an
 * online softmax that starts from the sink (m = sink, l = 1). The inverse RoPE of the output's
 * last 2*half channels is fused at the end (pair partners sit in neighbouring lanes). */
#include "kernels/cuda/common.cuh"

enum { ATT_WARPS = 8, ATT_KEYS = 16, ATT_MAXD = 512, ATT_PER_LANE = ATT_MAXD / 32 };

template <typename T>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(
    T *out, const T *q, const T *win_kv, const int32_t *win_idx, const int32_t *win_n,
    int win_stride, const T *comp_kv, const int32_t *sel, const int32_t *sel_n, int sel_stride,
    const float *sink, const int64_t *pos, const float *inv_freq, int half, int H, int dim)
{
    __shared__ float keys[ATT_KEYS][ATT_MAXD];
    int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int h = blockIdx.x * ATT_WARPS + warp;
    bool active = h < H;
    int nd = (dim + 31) / 32, dimr = nd * 32; /* lanes past dim hold zeros */
    int nw = win_n[t], ns = sel_n ? sel_n[t] : 0, nk = nw + ns;
    float scale = 1.0f / sqrtf((float)dim);

    float qv[ATT_PER_LANE], o[ATT_PER_LANE];
    const T *qh = q + ((size_t)t * H + (active ? h : 0)) * dim;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        qv[i] = lane + 32 * i < dim ? bt_ld(qh, lane + 32 * i) : 0.0f;
        o[i] = 0.0f;
    }
    float m = active ? sink[h] : 0.0f, l = 1.0f;

    for (int c0 = 0; c0 < nk; c0 += ATT_KEYS) {
        int kc = min(ATT_KEYS, nk - c0);
        __syncthreads();
        for (int e = threadIdx.x; e < kc * dimr; e += ATT_WARPS * 32) {
            int c = e / dimr, d = e % dimr, j = c0 + c;
            const T *row = j < nw ? win_kv + (size_t)win_idx[(size_t)t * win_stride + j] * dim
                                  : comp_kv + (size_t)sel[(size_t)t * sel_stride + (j - nw)] * dim;
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
        float mn = fmaxf(m, mc), alpha = expf(m - mn);
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

extern "C" bt_status_t bt_cuda_attention(void *out, const void *q, const void *win_kv,
                                         const int32_t *win_idx, const int32_t *win_n,
                                         int win_stride, const void *comp_kv, const int32_t *sel,
                                         const int32_t *sel_n, int sel_stride, const float *sink,
                                         const int64_t *pos, const float *inv_freq, int half,
                                         bt_cuda_dtype_t dtype, int T, int H, int dim,
                                         cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && q && win_kv && win_idx && win_n && sink && pos && bt__dtype_ok(dtype));
    BT_CUDA_REQUIRE(!sel_n || (sel && comp_kv));
    BT_CUDA_REQUIRE(T > 0 && H > 0 && dim > 0 && dim % 2 == 0 && dim <= ATT_MAXD);
    BT_CUDA_REQUIRE(half >= 0 && 2 * half <= dim && (half == 0 || inv_freq));
    dim3 grid(bt__cdiv(H, ATT_WARPS), T);
    typedef __nv_bfloat16 bf;
    if (dtype == BT_CUDA_F32)
        attention_kernel<<<grid, ATT_WARPS * 32, 0, stream>>>(
            (float *)out, (const float *)q, (const float *)win_kv, win_idx, win_n, win_stride,
            (const float *)comp_kv, sel, sel_n, sel_stride, sink, pos, inv_freq, half, H, dim);
    else
        attention_kernel<<<grid, ATT_WARPS * 32, 0, stream>>>(
            (bf *)out, (const bf *)q, (const bf *)win_kv, win_idx, win_n, win_stride,
            (const bf *)comp_kv, sel, sel_n, sel_stride, sink, pos, inv_freq, half, H, dim);
    return bt__cuda_launched("attention");
}

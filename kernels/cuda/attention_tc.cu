/* Window + sparse attention on the tensor cores: the operation of attention.cu for a whole
 * token at a time, as two small GEMMs per (token, 32 heads) with an exact softmax between them.
 *
 *   scores S[32 heads, nk] = Q[32, dim] . K[nk, dim]^T   (keys gathered 64 at a time)
 *   P = softmax(S * dim^-0.5) with the sink in the denominator, kept in shared memory
 *   O[32, dim] = P[32, nk] . V[nk, dim]                 (V = K, gathered again)
 *
 * One block of 8 warps per (token, group of 32 heads); bf16 16x16x16 MMAs (wmma) with fp32
 * accumulators. The scores of every key stay in shared memory, so the softmax is computed once
 * and exactly (no running rescale of the output), and P is written over them as bf16. K = V
 * means every key row is gathered twice (once per GEMM); the rows are L2-resident in practice
 * (a sequence's window and compressed cache are a few MB).
 *
 * Decode (a token or a few: too few blocks for the GPU) splits a token's keys over blocks
 * (flash-decoding): block z takes keys [z * chunk, z * chunk + chunk), keeps its own exact
 * softmax over them without the sink, and leaves (max, sum, unnormalized output) in a
 * workspace for attention.cu's combine kernel, which folds the splits and the sink.
 *
 * Prefill-sized launches of bf16 rows (no splits) take attention_flash_kernel below instead:
 * every key gathered once for 64 heads, the softmax online. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

#include <mma.h>
#include <type_traits>

using namespace nvcuda;

enum { TC_WARPS = 8, TC_HEADS = 32, TC_KEYS = 64, TC_PAD = 8, TC_MAXD = 512 };

/* dim is padded with zeros to dp, a multiple of 16; shared memory: Q [32][dp+8] bf16 | S [32][ldS] f32 (P over it as bf16) | K [64][dim+8] bf16
 * (the output [32][dim+8] f32 is staged over K at the end: the same bytes) */
static size_t tc_smem(int dim, int max_keys, int *ld_s)
{
    dim = (dim + 15) / 16 * 16;
    int kp = bt__cdiv(max_keys > 0 ? max_keys : 1, TC_KEYS) * TC_KEYS;
    *ld_s = kp + TC_PAD;
    return (size_t)TC_HEADS * (dim + TC_PAD) * 2 + (size_t)TC_HEADS * *ld_s * 4 +
           (size_t)TC_KEYS * (dim + TC_PAD) * 2;
}

/* 8 consecutive elements of a row as bf16, 16 bytes */
__device__ __forceinline__ uint4 load8_bf16(const float *p)
{
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    __nv_bfloat162 r[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                           __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    return *(uint4 *)r;
}
__device__ __forceinline__ uint4 load8_bf16(const __nv_bfloat16 *p) { return *(const uint4 *)p; }

template <typename T, bool SPLIT>
__global__ void __launch_bounds__(TC_WARPS * 32) attention_tc_kernel(
    T *out, const T *q, const T *win_kv, const int64_t *win_off, const int32_t *win_idx,
    const int32_t *win_n, int win_stride, const T *comp_kv, const int64_t *comp_off,
    const int32_t *sel, const int32_t *sel_n, int sel_stride, const float *sink,
    const int64_t *pos, const float *inv_freq, int half, int H, int dim, int ld_s, int splits,
    int chunk, float *work)
{
    bt_grid_begin();
    extern __shared__ __align__(128) unsigned char smem[];
    const int dp = (dim + 15) / 16 * 16, ldq = dp + TC_PAD;
    __nv_bfloat16 *sq = (__nv_bfloat16 *)smem;
    float *ss = (float *)(smem + (size_t)TC_HEADS * ldq * 2);
    __nv_bfloat16 *sk = (__nv_bfloat16 *)((unsigned char *)ss + (size_t)TC_HEADS * ld_s * 4);
    float *so = (float *)sk; /* output staging, after the last product */
    __shared__ float inv_l[TC_HEADS], row_m[TC_HEADS];

    const int t = blockIdx.y, h0 = blockIdx.x * TC_HEADS, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, vec = dp / 8;
    /* this token's caches (apart per sequence in a batch); counts past their lists' strides
     * would write scores past ld_s: clamped */
    const int64_t coff = comp_off ? comp_off[t] : 0;
    const bool has_sel = sel_n && coff >= 0;
    const T *wkv = win_kv + (win_off ? win_off[t] : 0), *ckv = has_sel ? comp_kv + coff : comp_kv;
    const int nw = min(win_n[t], win_stride), nk = nw + (has_sel ? min(sel_n[t], sel_stride) : 0);
    /* this block's keys [kb, ke) of the token's nk (all of them unless SPLIT) */
    const int kb = SPLIT ? blockIdx.z * chunk : 0, ke = SPLIT ? min(nk, kb + chunk) : nk;
    if (SPLIT && ke <= kb) { /* no keys here: an empty partial, skipped by the combine */
        float *w = work + (((size_t)t * H + h0) * splits + blockIdx.z) * (dim + 2);
        for (int r = tid; r < TC_HEADS && h0 + r < H; r += TC_WARPS * 32)
            w[(size_t)r * splits * (dim + 2) + 1] = 0.0f;
        return; /* the whole block */
    }
    const int nl = ke - kb, nchunks = (nl + TC_KEYS - 1) / TC_KEYS;

    /* Q rows of this block's heads (zeros past H): 8 loads a thread in flight before their
     * stores (a load then a store at a time was ~8 latencies of a decode block's ~14) */
    for (int base = 0; base < TC_HEADS * vec; base += 8 * TC_WARPS * 32) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int e = base + i * TC_WARPS * 32 + tid, r = e / vec, c = (e % vec) * 8;
            v[i] = make_uint4(0, 0, 0, 0);
            if (e < TC_HEADS * vec && h0 + r < H && c < dim)
                v[i] = load8_bf16(q + ((size_t)t * H + h0 + r) * dim + c);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int e = base + i * TC_WARPS * 32 + tid, r = e / vec, c = (e % vec) * 8;
            if (e < TC_HEADS * vec) *(uint4 *)(sq + (size_t)r * ldq + c) = v[i];
        }
    }

    /* gathers key rows [c0, c0 + 64) of the token into sk (zeros past nk): the rows' addresses
     * first, then 8 independent 16-byte loads per thread in flight before their stores (the
     * gather is latency-bound: one at a time, the block waited on L2 for most of its time).
     * Called between barriers; has one of its own. */
    __shared__ int rowi[TC_KEYS]; /* 2 * window row, 2 * compressed row + 1, or -1 */
    auto load_keys = [&](int c0) {
        if (tid < TC_KEYS) {
            int j = kb + c0 + tid;
            rowi[tid] = j >= ke ? -1
                        : j < nw ? 2 * win_idx[(size_t)t * win_stride + j]
                                 : 2 * sel[(size_t)t * sel_stride + (j - nw)] + 1;
        }
        __syncthreads();
        const int total = TC_KEYS * vec;
        for (int base = 0; base < total; base += 8 * TC_WARPS * 32) {
            uint4 v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int e = base + i * TC_WARPS * 32 + tid, r = e / vec, c = (e % vec) * 8;
                v[i] = make_uint4(0, 0, 0, 0);
                int ri = e < total ? rowi[r] : -1;
                if (ri >= 0 && c < dim)
                    v[i] = load8_bf16((ri & 1 ? ckv : wkv) + (size_t)(ri >> 1) * dim + c);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int e = base + i * TC_WARPS * 32 + tid, r = e / vec, c = (e % vec) * 8;
                if (e < total) *(uint4 *)(sk + (size_t)r * ldq + c) = v[i];
            }
        }
    };

    /* pass 1: S[:, chunk] = Q . K_chunk^T; warp w owns the 16x16 tile (w / 4, w % 4) */
    const int rw = warp >> 2, cw = warp & 3;
    for (int ch = 0; ch < nchunks; ch++) {
        __syncthreads();
        load_keys(ch * TC_KEYS);
        __syncthreads();
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < dp; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
            wmma::load_matrix_sync(a, sq + (size_t)rw * 16 * ldq + k, ldq);
            wmma::load_matrix_sync(b, sk + (size_t)cw * 16 * ldq + k, ldq);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(ss + (size_t)rw * 16 * ld_s + ch * TC_KEYS + cw * 16, acc, ld_s,
                                wmma::mem_row_major);
    }
    __syncthreads();

    /* softmax per row (a warp per 4 rows), exact: m over the sink (not in a split) and every
     * score, then p = e^(s - m) written as bf16 over the row's own scores (P[j] takes the bytes
     * of S[j/2], which this warp has read already: the __syncwarp orders the first 32) */
    const float scale = rsqrtf((float)dim);
    const int kpad = nchunks * TC_KEYS;
    for (int r = warp * (TC_HEADS / TC_WARPS); r < (warp + 1) * (TC_HEADS / TC_WARPS); r++) {
        float *srow = ss + (size_t)r * ld_s;
        __nv_bfloat16 *prow = (__nv_bfloat16 *)srow;
        float sk_h = h0 + r < H ? sink[h0 + r] : 0.0f;
        float m = SPLIT ? -INFINITY : sk_h;
        for (int j = lane; j < nl; j += 32) m = fmaxf(m, srow[j] * scale);
        m = bt_warp_max(m);
        float l = 0.0f;
        for (int j0 = 0; j0 < kpad; j0 += 32) {
            int j = j0 + lane;
            float p = j < nl ? __expf(srow[j] * scale - m) : 0.0f;
            __syncwarp();
            prow[j] = __float2bfloat16_rn(p);
            l += p;
        }
        l = bt_warp_sum(l) + (SPLIT ? 0.0f : __expf(sk_h - m));
        if (lane == 0) {
            inv_l[r] = SPLIT ? l : 1.0f / l; /* a split keeps its sum for the combine */
            row_m[r] = m;
        }
    }

    /* pass 2: O = P . V; warp w owns column tiles w, w + 8, ... of both row tiles */
    const int nct = dp / 16;
    const int ldp = 2 * ld_s;
    const __nv_bfloat16 *sp = (const __nv_bfloat16 *)ss;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[2][TC_MAXD / 16 / TC_WARPS];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int c = 0; c < TC_MAXD / 16 / TC_WARPS; c++) wmma::fill_fragment(o[i][c], 0.0f);
    for (int ch = 0; ch < nchunks; ch++) {
        __syncthreads();
        if (nchunks > 1) { /* (one chunk: pass 1 left its keys in sk) */
            load_keys(ch * TC_KEYS);
            __syncthreads();
        }
#pragma unroll
        for (int k = 0; k < TC_KEYS; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a0, a1;
            wmma::load_matrix_sync(a0, sp + ch * TC_KEYS + k, ldp);
            wmma::load_matrix_sync(a1, sp + (size_t)16 * ldp + ch * TC_KEYS + k, ldp);
#pragma unroll
            for (int c = 0; c < TC_MAXD / 16 / TC_WARPS; c++) {
                int ct = warp + c * TC_WARPS;
                if (ct >= nct) break;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
                wmma::load_matrix_sync(b, sk + (size_t)k * ldq + ct * 16, ldq);
                wmma::mma_sync(o[0][c], a0, b, o[0][c]);
                wmma::mma_sync(o[1][c], a1, b, o[1][c]);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < TC_MAXD / 16 / TC_WARPS; c++) {
        int ct = warp + c * TC_WARPS;
        if (ct >= nct) break;
        wmma::store_matrix_sync(so + ct * 16, o[0][c], ldq, wmma::mem_row_major);
        wmma::store_matrix_sync(so + (size_t)16 * ldq + ct * 16, o[1][c], ldq, wmma::mem_row_major);
    }
    __syncthreads();

    if (SPLIT) { /* the partial: max, sum, unnormalized output */
        for (int r = warp; r < TC_HEADS; r += TC_WARPS) {
            if (h0 + r >= H) break;
            float *w = work + (((size_t)t * H + h0 + r) * splits + blockIdx.z) * (dim + 2);
            if (lane == 0) w[0] = row_m[r], w[1] = inv_l[r];
            for (int d = lane; d < dim; d += 32) w[2 + d] = so[(size_t)r * ldq + d];
        }
        return;
    }

    /* normalize, inverse RoPE of the last 2*half channels, store; a thread per channel pair */
    const int r0 = dim - 2 * half, pairs = dim / 2;
    const float p64 = (float)pos[t];
    for (int e = tid; e < TC_HEADS * pairs; e += TC_WARPS * 32) {
        int r = e / pairs, d = (e % pairs) * 2;
        if (h0 + r >= H) continue;
        float a = so[(size_t)r * ldq + d] * inv_l[r], b = so[(size_t)r * ldq + d + 1] * inv_l[r];
        if (d >= r0) {
            float f = inv_freq[(d - r0) >> 1] * p64;
            float cs = cosf(f), sn = -sinf(f);
            float a2 = a * cs - b * sn;
            b = b * cs + a * sn;
            a = a2;
        }
        T *oh = out + ((size_t)t * H + h0 + r) * dim;
        bt_st(oh, d, a);
        bt_st(oh, d + 1, b);
    }
}

/* ---- prefill: every key gathered once for 64 heads, softmax online -------------------------
 * attention_tc_kernel keeps a token's scores whole for an exact softmax, so it gathers every key
 * twice (scores, then values) for each group of 32 heads, between barriers: at a 4096-token
 * prefill it waited on those gathers most of the time. Here a block takes a token's 64 heads and
 * streams its keys in chunks of 32 through a 3-slot cp.async ring, each key gathered
 * once; the softmax is online (a running max and sum per head, the output rescaled when the max
 * grows, as flash attention does), with the sink as the running max's start and a 1 in the sum.
 * 16 warps: warp (hg, dq) takes heads 16 hg.. and output dims dq * dp / 4..; the scores of its
 * heads are summed from the four warps' partial products over their dims (shared memory, in
 * the same order in all four, so their softmaxes agree bit for bit), and the probabilities go
 * from the score fragments straight into the A fragments of P . V (no trip through memory).
 * bf16 rows only (cp.async copies bytes); f32 rows take attention_tc_kernel. */
enum {
    FL_WARPS = 16,
    FL_HEADS = 64,
    FL_KEYS = 32,
    FL_STAGES = 3,
    FL_PAD = 8,
    FL_MAXNT = TC_MAXD / 32
};

/* dims padded with zeros to a multiple of 64 (four warps' quarters of whole k16 steps) */
__host__ __device__ static inline int fl_dp(int dim)
{
    return (dim + 63) / 64 * 64;
}

/* Q [64][dp+8] | K ring [3][32][dp+8] (bf16) | partial scores [16 warps][4][32 lanes] float4 */
static size_t fl_smem(int dim)
{
    size_t ld = (size_t)fl_dp(dim) + FL_PAD;
    return FL_HEADS * ld * 2 + FL_STAGES * FL_KEYS * ld * 2 + (size_t)FL_WARPS * 4 * 32 * 16;
}

/* four 8x8 bf16 matrices from shared memory (byte address a) into MMA fragments */
__device__ __forceinline__ void ldsm_x4(unsigned *r, unsigned a, bool trans)
{
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory"); /* (kept between the barriers that publish the rows) */
}

__device__ __forceinline__ float fl_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned fl_pack(float lo, float hi)
{
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&b;
}

/* 1 / the softmax denominators of a lane's two head rows: the four lanes' shares summed */
__device__ __forceinline__ void fl_row_inv(const float *lrun, float *inv)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrun[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = 1.0f / l;
    }
}

/* A lane's channels d, d + 1 of its two head rows, v = (row 0: d, d + 1, row 1: d, d + 1),
 * normalized by inv, rotated back (inverse RoPE) where d >= r0 at position p, stored at
 * out_row[r] + d; a NULL row is not stored. (Both flash kernels' last step.) */
template <typename QT>
__device__ __forceinline__ void fl_finish_pair(QT *const *out_row, int d, const float *v,
                                               const float *inv, int r0, const float *inv_freq,
                                               float p)
{
    float cs = 1.0f, sn = 0.0f;
    if (d >= r0) {
        const float f = inv_freq[(d - r0) >> 1] * p;
        cs = cosf(f), sn = -sinf(f);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!out_row[r]) continue;
        float a = v[2 * r] * inv[r], b = v[2 * r + 1] * inv[r];
        const float a2 = a * cs - b * sn;
        b = b * cs + a * sn;
        if constexpr (std::is_same<QT, float>::value)
            *(float2 *)(out_row[r] + d) = make_float2(a2, b);
        else
            *(__nv_bfloat162 *)(out_row[r] + d) = __floats2bfloat162_rn(a2, b);
    }
}

template <typename QT> /* the queries' and output's type; the keys are bf16 */
__global__ void __launch_bounds__(FL_WARPS * 32, 1)
    attention_flash_kernel(QT *out, const QT *q, const __nv_bfloat16 *win_kv,
                           const int64_t *win_off, const int32_t *win_idx, const int32_t *win_n,
                           int win_stride, const __nv_bfloat16 *comp_kv, const int64_t *comp_off,
                           const int32_t *sel, const int32_t *sel_n, int sel_stride,
                           const float *sink, const int64_t *pos, const float *inv_freq, int half,
                           int H, int dim)
{
    typedef __nv_bfloat16 bf;
    bt_grid_begin();
    extern __shared__ __align__(128) unsigned char smem[];
    /* the ring slots' key rows: 2 * window row, 2 * compressed row + 1; < 0: zeros */
    __shared__ int rowi[FL_STAGES][FL_KEYS];
    const int dp = fl_dp(dim), ld = dp + FL_PAD, units = dp / 8, dw = dp / 4, ntw = dw / 8;
    bf *sq = (bf *)smem, *sk = sq + (size_t)FL_HEADS * ld;
    float4 *sx = (float4 *)(sk + FL_STAGES * (size_t)FL_KEYS * ld);

    const int t = blockIdx.y, h0 = blockIdx.x * FL_HEADS, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int hg = warp >> 2, dq = warp & 3, d0 = dq * dw;
    const int64_t coff = comp_off ? comp_off[t] : 0;
    const bool has_sel = sel_n && coff >= 0;
    const bf *wkv = win_kv + (win_off ? win_off[t] : 0), *ckv = has_sel ? comp_kv + coff : comp_kv;
    const int nw = min(win_n[t], win_stride), nk = nw + (has_sel ? min(sel_n[t], sel_stride) : 0);
    const int nchunks = (nk + FL_KEYS - 1) / FL_KEYS;
    auto key_row = [&](int j) {
        return j >= nk  ? -1
               : j < nw ? 2 * win_idx[(size_t)t * win_stride + j]
                        : 2 * sel[(size_t)t * sel_stride + (j - nw)] + 1;
    };
    /* chunk ch's keys into ring slot ch % FL_STAGES, zeros past dim and for missing rows; one
     * group (empty past the last chunk, so the groups in flight keep their count). A thread
     * copies one 16-byte unit gu of rows gr, gr + gstep, ... (no division per copy). */
    const int gstep = FL_WARPS * 32 / units, gu = tid % units, gr = tid / units;
    const bool gcol = 8 * gu < dim;
    auto gather = [&](int ch) {
        bf *dst = sk + (size_t)(ch % FL_STAGES) * FL_KEYS * ld + 8 * gu;
        const int *ri_of = rowi[ch % FL_STAGES];
        for (int r = gr; r < FL_KEYS && gr < gstep && ch < nchunks; r += gstep) {
            const int ri = ri_of[r];
            const bool ok = ri >= 0 && gcol;
            cp_async<16>(dst + (size_t)r * ld,
                         ok ? (ri & 1 ? ckv : wkv) + (size_t)(ri >> 1) * dim + 8 * gu : wkv, ok);
        }
        cp_async_commit();
    };

    if (tid < FL_KEYS)
#pragma unroll
        for (int i = 0; i < FL_STAGES; i++)
            rowi[i][tid] = key_row(i * FL_KEYS + tid);
    for (int e = tid; e < FL_HEADS * units; e += FL_WARPS * 32) { /* Q, zeros past H and dim */
        const int r = e / units, u = e % units;
        const bool ok = h0 + r < H && 8 * u < dim;
        const QT *src = ok ? q + ((size_t)t * H + h0 + r) * dim + 8 * u : q;
        if constexpr (std::is_same<QT, float>::value) /* rounded to bf16 on the way */
            *(uint4 *)(sq + (size_t)r * ld + 8 * u) = ok ? load8_bf16(src) : make_uint4(0, 0, 0, 0);
        else
            cp_async<16>(sq + (size_t)r * ld + 8 * u, src, ok);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < FL_STAGES - 1; i++)
        gather(i); /* (the first group with Q) */

    /* per head row (g and g + 8 of the warp's 16): running max (log2 units) and this lane's
     * share of the running sum; the sink starts both */
    const float LOG2E = 1.4426950408889634f, sc = rsqrtf((float)dim) * LOG2E;
    const int hr0 = h0 + 16 * hg + g, hr1 = hr0 + 8;
    float mrun[2] = {(hr0 < H ? sink[hr0] : 0.0f) * LOG2E, (hr1 < H ? sink[hr1] : 0.0f) * LOG2E};
    float lrun[2] = {c == 0 ? 1.0f : 0.0f, c == 0 ? 1.0f : 0.0f};
    float o[FL_MAXNT][4];
#pragma unroll
    for (int n = 0; n < FL_MAXNT; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    /* this lane's ldmatrix row addresses (bytes): Q (A of S), K (B of S), K as V (B of P . V,
     * transposed), the last two from a ring slot's start */
    const unsigned sq_a =
        (unsigned)__cvta_generic_to_shared(sq) +
        2u * ((16 * hg + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + d0 + 8 * (lane >> 4));
    const unsigned sk_a = (unsigned)__cvta_generic_to_shared(sk);
    const unsigned kb_off = 2u * (((lane & 7) + 8 * (lane >> 4)) * ld + d0 + 8 * ((lane >> 3) & 1));
    const unsigned vb_off = 2u * (((lane & 7) + 8 * ((lane >> 3) & 1)) * ld + d0 + 8 * (lane >> 4));
    const unsigned slot_bytes = 2u * FL_KEYS * ld, rows16 = 2u * 16 * ld;
    float4 *mine = sx + (size_t)warp * 4 * 32 + lane;
    const float4 *group = sx + (size_t)4 * hg * 4 * 32 + lane;

    for (int ch = 0; ch < nchunks; ch++) {
        /* chunk ch + FL_STAGES's rows, in flight until the end of this one */
        const int nidx = tid < FL_KEYS ? key_row((ch + FL_STAGES) * FL_KEYS + tid) : -1;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(FL_STAGES - 2) : "memory");
        __syncthreads(); /* chunk ch landed for all; everyone is done with chunk ch - 1's slot */
        gather(ch + FL_STAGES - 1);
        const unsigned kc = sk_a + (unsigned)(ch % FL_STAGES) * slot_bytes;
        /* heads past H (a TP rank's 16 or 32): copies only (never warp 0, which keeps rowi) */
        if (h0 + 16 * hg >= H) continue;

        /* this warp's part of S[16 heads, 32 keys] over its dims */
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        /* step it: k16 step it / 2, key tiles 2 (it % 2).. of 4; each step's fragments loaded
         * while the one before multiplies (shared-memory latency was the largest stall) */
        const int qk_steps = 2 * (dw / 16);
        unsigned aq[2][4], bq[2][4];
        ldsm_x4(aq[0], sq_a, false);
        ldsm_x4(bq[0], kc + kb_off, false);
#pragma unroll
        for (int it = 0; it < 2 * (TC_MAXD / 4 / 16); it++) {
            if (it >= qk_steps) break;
            if (it + 1 < qk_steps) {
                const unsigned k1 = 32u * ((it + 1) >> 1);
                if (((it + 1) & 1) == 0) ldsm_x4(aq[((it + 1) >> 1) & 1], sq_a + k1, false);
                ldsm_x4(bq[(it + 1) & 1], kc + kb_off + ((it + 1) & 1) * rows16 + k1, false);
            }
            const unsigned *af = aq[(it >> 1) & 1], *bf = bq[it & 1];
            mma_bf16_16816(s[2 * (it & 1)], af, bf[0], bf[1]);
            mma_bf16_16816(s[2 * (it & 1) + 1], af, bf[2], bf[3]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            mine[i * 32] = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
        asm volatile("bar.sync %0, 128;" ::"r"(1 + hg) : "memory"); /* the head group's 4 warps */
#pragma unroll
        for (int i = 0; i < 4; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 v = group[(w * 4 + i) * 32];
                s[i][0] += v.x, s[i][1] += v.y, s[i][2] += v.z, s[i][3] += v.w;
            }
        }

        /* online softmax: lane holds keys 8i + 2c, +1 of rows g (s[i][0..1]) and g + 8 ([2..3]) */
        float mx[2] = {mrun[0], mrun[1]};
        const int past =
            nk - ch * FL_KEYS - 2 * c; /* keys 8i + (e & 1) of this lane from here on: none */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[i][e] = 8 * i + (e & 1) < past ? s[i][e] * sc : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[i][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        const float corr[2] = {fl_exp2(mrun[0] - mx[0]), fl_exp2(mrun[1] - mx[1])};
        mrun[0] = mx[0], mrun[1] = mx[1];
        lrun[0] *= corr[0], lrun[1] *= corr[1];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[i][e] = fl_exp2(s[i][e] - mx[e >> 1]);
                lrun[e >> 1] += s[i][e];
            }
        unsigned pa[2][4]; /* P as the A fragments of keys 16j.. */
#pragma unroll
        for (int j = 0; j < 2; j++) {
            pa[j][0] = fl_pack(s[2 * j][0], s[2 * j][1]);
            pa[j][1] = fl_pack(s[2 * j][2], s[2 * j][3]);
            pa[j][2] = fl_pack(s[2 * j + 1][0], s[2 * j + 1][1]);
            pa[j][3] = fl_pack(s[2 * j + 1][2], s[2 * j + 1][3]);
        }
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) { /* (a max grew) */
#pragma unroll
            for (int n = 0; n < FL_MAXNT; n++) {
                if (n >= ntw) break;
                o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];
            }
        }
        /* O += P . V over the warp's dims (V = the same keys, transposed by ldmatrix), the
         * fragments loaded a step ahead as above; each output adds keys 0..15, then 16..31.
         * At the model's dims (512) keys 0..15 go to every dim tile first, so an output's two
         * products lie 8 steps apart; smaller dims take them back to back (one loop for both
         * orders needs a run-time ring parity, which spilled: 16 bytes, measured on ptxas) */
        unsigned bv[2][4];
        ldsm_x4(bv[0], kc + vb_off, true);
        if (ntw == FL_MAXNT) {
#pragma unroll
            for (int it = 0; it < FL_MAXNT; it++) {
                constexpr int H2 = FL_MAXNT / 2;
                if (it + 1 < FL_MAXNT)
                    ldsm_x4(bv[(it + 1) & 1],
                            kc + vb_off + ((it + 1) / H2) * rows16 + 32u * ((it + 1) % H2), true);
                const int np = it % H2;
                mma_bf16_16816(o[2 * np], pa[it / H2], bv[it & 1][0], bv[it & 1][1]);
                mma_bf16_16816(o[2 * np + 1], pa[it / H2], bv[it & 1][2], bv[it & 1][3]);
            }
        } else {
#pragma unroll
            for (int it = 0; it < FL_MAXNT; it++) { /* dim tiles 2 (it / 2).., keys 16 (it % 2).. */
                if (it >= ntw) break;
                if (it + 1 < ntw)
                    ldsm_x4(bv[(it + 1) & 1],
                            kc + vb_off + ((it + 1) & 1) * rows16 + 32u * ((it + 1) >> 1), true);
                const int np = it >> 1;
                mma_bf16_16816(o[2 * np], pa[it & 1], bv[it & 1][0], bv[it & 1][1]);
                mma_bf16_16816(o[2 * np + 1], pa[it & 1], bv[it & 1][2], bv[it & 1][3]);
            }
        }
        if (tid < FL_KEYS) rowi[ch % FL_STAGES][tid] = nidx; /* for chunk ch + FL_STAGES's gather */
    }
    cp_async_wait_all();

    /* normalize, inverse RoPE of the last 2*half channels, store (a lane holds channel pairs) */
    float inv[2];
    fl_row_inv(lrun, inv);
    QT *const rows[2] = {hr0 < H ? out + ((size_t)t * H + hr0) * dim : NULL,
                         hr1 < H ? out + ((size_t)t * H + hr1) * dim : NULL};
    const float p = (float)pos[t]; /* (read once: the stores might alias it) */
#pragma unroll
    for (int n = 0; n < FL_MAXNT; n++) {
        if (n >= ntw) break;
        const int d = d0 + 8 * n + 2 * c;
        if (d < dim) fl_finish_pair(rows, d, o[n], inv, dim - 2 * half, inv_freq, p);
    }
}

/* ---- prefill on Hopper's warpgroup MMAs ---------------------------------------------------
 * attention_flash_wg: attention_flash_kernel's work (a token's 64 heads a block, its keys
 * streamed once with an online softmax, the sink as the running max's start and a 1 in the
 * sum) on wgmma, for the model's dim 512. The heads are the MMAs' M (64). Two warpgroups split
 * the dims: each multiplies its 256 dims of Q and of a chunk of 32 keys (both in shared memory)
 * into a partial S, the two partials are added through shared memory (both warpgroups then hold
 * the same S, so their softmaxes agree bit for bit), and each accumulates O for its 256 dims:
 * P from registers (the S accumulators are P's A fragments), the same keys as V, read MN-major
 * from the same slot. A chunk's value products and the next chunk's scores are issued back to
 * back and run while nothing else waits; keys arrive through a 4-slot cp.async ring, three
 * chunks ahead. Each warpgroup copies and reads only its own half of every slot. */
enum {
    FW_HEADS = 64,
    FW_KEYS = 32,
    FW_DIM = 512,
    FW_THREADS = 256,
    FW_SLOTS = 4,
    FW_QTILE = FW_HEADS * 128, /* 64 heads x 64 dims, bf16, the 128-byte swizzle */
    FW_KTILE = FW_KEYS * 128,  /* 32 keys x 64 dims */
    FW_Q = FW_DIM / 64 * FW_QTILE,
    FW_SLOT = FW_DIM / 64 * FW_KTILE,
    FW_XS = 2 * 128 * 16 * 4,                          /* the two warpgroups' partial S */
    FW_SMEM = FW_Q + FW_SLOTS * FW_SLOT + FW_XS + 1024 /* + alignment to 1024 bytes */
};

#ifdef BT_WGMMA
__device__ int fw_built = 1;
#else
__device__ int fw_built = 0;
#endif

template <typename QT>
__global__ void __launch_bounds__(FW_THREADS, 1)
    attention_flash_wg(QT *out, const QT *q, const __nv_bfloat16 *win_kv, const int64_t *win_off,
                       const int32_t *win_idx, const int32_t *win_n, int win_stride,
                       const __nv_bfloat16 *comp_kv, const int64_t *comp_off, const int32_t *sel,
                       const int32_t *sel_n, int sel_stride, const float *sink, const int64_t *pos,
                       const float *inv_freq, int half, int H)
{
#ifdef BT_WGMMA
    typedef __nv_bfloat16 bf;
    bt_grid_begin();
    extern __shared__ __align__(128) unsigned char fw_raw[];
    unsigned char *smem =
        fw_raw + ((1024 - ((uint32_t)__cvta_generic_to_shared(fw_raw) & 1023)) & 1023);
    unsigned char *sq = smem, *sk = smem + FW_Q;
    float4 *xs = (float4 *)(sk + FW_SLOTS * FW_SLOT);
    const int t = blockIdx.y, h0 = blockIdx.x * FW_HEADS, tid = threadIdx.x;
    /* (the warpgroup through a shuffle: uniform to the compiler, so the MMAs' descriptors
     * are built in uniform registers, not moved there before every MMA) */
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wt = tid & 127, wq = wt >> 5,
              lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int64_t coff = comp_off ? comp_off[t] : 0;
    const bool has_sel = sel_n && coff >= 0;
    const bf *wkv = win_kv + (win_off ? win_off[t] : 0), *ckv = has_sel ? comp_kv + coff : comp_kv;
    const int nw = min(win_n[t], win_stride), nk = nw + (has_sel ? min(sel_n[t], sel_stride) : 0);
    const int nchunks = (nk + FW_KEYS - 1) / FW_KEYS;

    /* this warpgroup's half of chunk ch into slot ch % FW_SLOTS: key wt / 4, 16-byte units
     * (wt & 3) + 4k of the half's 32 (zeros for keys past nk); one group, empty past the end */
    const int gk = wt >> 2;
    /* the key row of this thread's copies in chunk ch: its index is loaded a chunk ahead
     * (raw_of, unconditionally: a dummy past nk), the row made of it when the copies are
     * issued (key_ri): the copies' addresses hang on it */
    auto raw_of = [&](int ch) {
        const int j = ch * FW_KEYS + gk;
        const int32_t *p = j >= nk  ? win_n + t
                           : j < nw ? win_idx + (size_t)t * win_stride + j
                                    : sel + (size_t)t * sel_stride + (j - nw);
        return *p;
    };
    auto key_ri = [&](int ch, int raw) {
        const int j = ch * FW_KEYS + gk;
        return j >= nk ? -1 : 2 * raw + (j < nw ? 0 : 1);
    };
    auto gather = [&](int ch, int ri) {
        if (ch < nchunks) {
            const bf *row = ri >= 0 ? (ri & 1 ? ckv : wkv) + (size_t)(ri >> 1) * FW_DIM : wkv;
            unsigned char *slot = sk + (ch % FW_SLOTS) * FW_SLOT;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int du = (wt & 3) + 4 * k, dt = 4 * wg + (du >> 3);
                cp_async<16>(slot + dt * FW_KTILE + wg_sw(gk, du & 7),
                             row + 8 * (dt * 8 + (du & 7)), ri >= 0);
            }
        }
        cp_async_commit();
    };
    /* this warpgroup's half of Q: 64 heads x 32 units */
    for (int e = wt; e < FW_HEADS * 32; e += 128) {
        const int r = e >> 5, du = e & 31, dt = 4 * wg + (du >> 3);
        const QT *src = q + ((size_t)t * H + h0 + r) * FW_DIM + 8 * (dt * 8 + (du & 7));
        unsigned char *dst = sq + dt * FW_QTILE + wg_sw(r, du & 7);
        if constexpr (std::is_same<QT, float>::value) /* rounded to bf16 on the way */
            *(uint4 *)dst = load8_bf16(src);
        else
            cp_async<16>(dst, src, true);
    }
#pragma unroll
    for (int i = 0; i < FW_SLOTS - 1; i++)
        gather(i, key_ri(i, raw_of(i))); /* (the first group with Q) */
    int raw_next = raw_of(FW_SLOTS - 1);

    const float LOG2E = 1.4426950408889634f, sc = rsqrtf((float)FW_DIM) * LOG2E;
    const int hr0 = h0 + 16 * wq + g, hr1 = hr0 + 8;
    float mrun[2] = {sink[hr0] * LOG2E, sink[hr1] * LOG2E};
    float lrun[2] = {c == 0 ? 1.0f : 0.0f, c == 0 ? 1.0f : 0.0f};
    float o[128]; /* o[4j + e]: head row g + 8 (e >> 1), dim 256 wg + 8j + 2c + (e & 1) */
#pragma unroll
    for (int i = 0; i < 128; i++)
        o[i] = 0.0f;
    float s[16]; /* s[4j + e]: head row g + 8 (e >> 1), key 8j + 2c + (e & 1) of the chunk */
    const uint64_t dq = wg_desc(sq + 4 * wg * FW_QTILE);
    /* S over this warpgroup's dims: 16 steps of 16 */
    auto scores = [&](int ch) {
        const uint64_t dk = wg_desc(sk + (ch % FW_SLOTS) * FW_SLOT + 4 * wg * FW_KTILE);
#pragma unroll
        for (int kt = 0; kt < 4; kt++)
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
                wgmma_ss<FW_KEYS>(s, dq + kt * (FW_QTILE >> 4) + 2 * ks,
                                  dk + kt * (FW_KTILE >> 4) + 2 * ks, kt | ks);
    };
    if (nchunks > 0) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(FW_SLOTS - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); /* Q and chunk 0 */
        wgmma_fence();
        scores(0);
        wgmma_commit();
        wgmma_wait<0>();
    }
    for (int ch = 0; ch < nchunks; ch++) {
#pragma unroll
        for (int i = 0; i < 16; i++) /* (read after the wait) */
            asm volatile("" : "+f"(s[i])::"memory");
            /* S = this warpgroup's partial + the other's (the same sum in both) */
#pragma unroll
        for (int k = 0; k < 4; k++)
            xs[(wg * 4 + k) * 128 + wt] =
                make_float4(s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]);
        __syncthreads(); /* the partials; also: every product of chunk ch - 1 is done */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 v = xs[((wg ^ 1) * 4 + k) * 128 + wt];
            s[4 * k] += v.x, s[4 * k + 1] += v.y, s[4 * k + 2] += v.z, s[4 * k + 3] += v.w;
        }
        gather(ch + FW_SLOTS - 1, key_ri(ch + FW_SLOTS - 1, raw_next)); /* chunk ch - 1's slot */
        raw_next = raw_of(ch + FW_SLOTS);

        /* online softmax; keys past nk (the last chunk) masked */
        float mx[2] = {mrun[0], mrun[1]};
        const int past = nk - ch * FW_KEYS - 2 * c;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[4 * j + e] = 8 * j + (e & 1) < past ? s[4 * j + e] * sc : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        /* the running max moves only when a score passes it by more than 2^8 (probabilities
         * up to 256, fine in bf16 and f32): O is rescaled at few chunks, not at most */
#pragma unroll
        for (int r = 0; r < 2; r++)
            mx[r] = mx[r] > mrun[r] + 8.0f ? mx[r] : mrun[r];
        const float corr[2] = {fl_exp2(mrun[0] - mx[0]), fl_exp2(mrun[1] - mx[1])};
        mrun[0] = mx[0], mrun[1] = mx[1];
        lrun[0] *= corr[0], lrun[1] *= corr[1];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            s[i] = fl_exp2(s[i] - mx[(i >> 1) & 1]);
            lrun[(i >> 1) & 1] += s[i];
        }
        unsigned pa[2][4]; /* P as the A fragments of keys 16 ks.. */
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            pa[ks][0] = fl_pack(s[8 * ks], s[8 * ks + 1]);
            pa[ks][1] = fl_pack(s[8 * ks + 2], s[8 * ks + 3]);
            pa[ks][2] = fl_pack(s[8 * ks + 4], s[8 * ks + 5]);
            pa[ks][3] = fl_pack(s[8 * ks + 6], s[8 * ks + 7]);
        }
        if (ch > 0 && /* (O is zero before) */
            __any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int i = 0; i < 128; i++)
                o[i] *= corr[(i >> 1) & 1];
        }
        /* O += P . V over this warpgroup's dims, then the next chunk's scores */
        const uint64_t dv =
            wg_desc_mn(sk + (ch % FW_SLOTS) * FW_SLOT + 4 * wg * FW_KTILE, FW_KTILE);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
            wgmma_rs_mn256(o, pa[ks], dv + ks * ((16 * 128) >> 4));
        wgmma_commit();
        if (ch + 1 < nchunks) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(FW_SLOTS - 2) : "memory");
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads(); /* chunk ch + 1 landed; the partials of chunk ch are read */
            wgmma_fence();
            scores(ch + 1);
            wgmma_commit();
        }
        wgmma_wait<0>();
        /* the products' registers: O and S are read, and P's may be reused, only from here
         * (the compiler sees them written or read when the MMAs are issued) */
#pragma unroll
        for (int i = 0; i < 128; i++)
            asm volatile("" : "+f"(o[i])::"memory");
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
            asm volatile("" ::"r"(pa[ks][0]), "r"(pa[ks][1]), "r"(pa[ks][2]), "r"(pa[ks][3])
                         : "memory");
    }
    cp_async_wait_all();
#pragma unroll
    for (int i = 0; i < 128; i++) /* (read after the wait) */
        asm volatile("" : "+f"(o[i])::"memory");

    /* normalize, inverse RoPE of the last 2*half channels, store */
    float inv[2];
    fl_row_inv(lrun, inv);
    QT *const rows[2] = {out + ((size_t)t * H + hr0) * FW_DIM,
                         out + ((size_t)t * H + hr1) * FW_DIM};
    const float p = (float)pos[t]; /* (read once: the stores might alias it) */
#pragma unroll
    for (int j = 0; j < 32; j++)
        fl_finish_pair(rows, 256 * wg + 8 * j + 2 * c, o + 4 * j, inv, FW_DIM - 2 * half, inv_freq,
                       p);
#else
    __trap(); /* launched only where fw_ready() found the sm_90a image */
#endif
}

/* attention_flash_wg runs here: a Hopper device, this binary's code for sm_90a, the shared
 * memory allowed; BT_CUDA_FLASHWG=0 keeps attention_flash_kernel (for comparisons) */
template <typename QT> static bool fw_ready(void)
{
    static int once = -1;
    static signed char built[BT__MAX_DEVICES], allowed[BT__MAX_DEVICES];
    return bt__env_switch("BT_CUDA_FLASHWG", &once) && bt__wgmma_ready(fw_built, built) &&
           bt__smem_allowed((const void *)attention_flash_wg<QT>, FW_SMEM, allowed);
}

/* the flash kernel's shared memory allowed once a device and instance; BT_CUDA_FLASH=0 turns
 * the kernel off (bt_cuda_attention_tc then keeps attention_tc_kernel: for comparisons), read
 * once */
template <typename QT> static bool fl_allowed(void)
{
    static int once = -1;
    static signed char allowed[BT__MAX_DEVICES];
    return bt__env_switch("BT_CUDA_FLASH", &once) &&
           bt__smem_allowed((const void *)attention_flash_kernel<QT>, fl_smem(TC_MAXD), allowed);
}

extern "C" int bt_cuda_attention_flash_fits(int dim)
{
    return dim > 0 && dim % 8 == 0 && dim <= TC_MAXD && fl_allowed<float>() &&
           fl_allowed<__nv_bfloat16>();
}

extern "C" bt_status_t
bt_cuda_attention_flash(void *out, const void *q, bt_cuda_dtype_t q_dtype, const uint16_t *win_kv,
                        const int32_t *win_idx, const int32_t *win_n, int win_stride,
                        const uint16_t *comp_kv, const int32_t *sel, const int32_t *sel_n,
                        int sel_stride, const float *sink, const int64_t *pos,
                        const float *inv_freq, int half, int T, int H, int dim,
                        const bt_cuda_attention_batch_t *batch, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && q && win_kv && win_idx && win_n && sink && pos && bt__dtype_ok(q_dtype));
    BT_CUDA_REQUIRE(!sel_n || (sel && comp_kv));
    BT_CUDA_REQUIRE(T > 0 && H > 0 && win_stride >= 0 && sel_stride >= 0);
    BT_CUDA_REQUIRE(half >= 0 && 2 * half <= dim && (half == 0 || inv_freq));
    BT_CUDA_REQUIRE(bt_cuda_attention_flash_fits(dim));
    /* rows are read 16 bytes at a time (a batch's offsets are the caller's to keep so) */
    BT_CUDA_REQUIRE((uintptr_t)q % 16 == 0 && (uintptr_t)win_kv % 16 == 0 &&
                    (uintptr_t)comp_kv % 16 == 0);
    const int64_t *win_off = batch ? batch->win_off : NULL,
                  *comp_off = batch ? batch->comp_off : NULL;
    typedef __nv_bfloat16 bf;
    const dim3 grid(bt__cdiv(H, FL_HEADS), T);
    static_assert((int)FW_HEADS == (int)FL_HEADS, "one grid for both flash kernels");
    if (dim == FW_DIM && H % FW_HEADS == 0 &&
        (q_dtype == BT_CUDA_F32 ? fw_ready<float>() : fw_ready<bf>())) {
        if (q_dtype == BT_CUDA_F32)
            bt__launch(attention_flash_wg<float>, grid, FW_THREADS, FW_SMEM, stream, (float *)out,
                       (const float *)q, (const bf *)win_kv, win_off, win_idx, win_n, win_stride,
                       (const bf *)comp_kv, comp_off, sel, sel_n, sel_stride, sink, pos, inv_freq,
                       half, H);
        else
            bt__launch(attention_flash_wg<bf>, grid, FW_THREADS, FW_SMEM, stream, (bf *)out,
                       (const bf *)q, (const bf *)win_kv, win_off, win_idx, win_n, win_stride,
                       (const bf *)comp_kv, comp_off, sel, sel_n, sel_stride, sink, pos, inv_freq,
                       half, H);
        return bt__cuda_launched("attention_flash_wg");
    }
    if (q_dtype == BT_CUDA_F32)
        bt__launch(attention_flash_kernel<float>, grid, FL_WARPS * 32, fl_smem(dim), stream,
                   (float *)out, (const float *)q, (const bf *)win_kv, win_off, win_idx, win_n,
                   win_stride, (const bf *)comp_kv, comp_off, sel, sel_n, sel_stride, sink, pos,
                   inv_freq, half, H, dim);
    else
        bt__launch(attention_flash_kernel<bf>, grid, FL_WARPS * 32, fl_smem(dim), stream, (bf *)out,
                   (const bf *)q, (const bf *)win_kv, win_off, win_idx, win_n, win_stride,
                   (const bf *)comp_kv, comp_off, sel, sel_n, sel_stride, sink, pos, inv_freq, half,
                   H, dim);
    return bt__cuda_launched("attention_flash");
}

/* The dynamic shared memory a block may take on this device (the opt-in limit less the
 * kernel's static part); both kernels are allowed it once per device, so a launch needs no
 * attribute call (one per launch raced between models of one process and cost every step). */
static size_t tc_dynamic_limit(void)
{
    enum { MAX_DEVICES = 64 };
    static size_t limit[MAX_DEVICES]; /* 0: not asked yet */
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) return 0;
    if (limit[dev]) return limit[dev];
    cudaFuncAttributes fa; /* the kernel's static shared memory comes on top */
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&fa, attention_tc_kernel<float, true>) != cudaSuccess ||
        (size_t)optin <= fa.sharedSizeBytes) {
        cudaGetLastError();
        return 0;
    }
    size_t l = (size_t)optin - fa.sharedSizeBytes;
    if (cudaFuncSetAttribute(attention_tc_kernel<float, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)l) != cudaSuccess ||
        cudaFuncSetAttribute(attention_tc_kernel<__nv_bfloat16, false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)l) != cudaSuccess ||
        cudaFuncSetAttribute(attention_tc_kernel<float, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)l) != cudaSuccess ||
        cudaFuncSetAttribute(attention_tc_kernel<__nv_bfloat16, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)l) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    limit[dev] = l; /* the same value from any thread: a benign race */
    return l;
}

extern "C" int bt_cuda_attention_tc_fits(int dim, int max_keys)
{
    if (dim <= 0 || dim % 8 || dim > TC_MAXD || max_keys < 0 ||
        max_keys > BT_CUDA_ATTENTION_TC_MAX_KEYS)
        return 0;
    int ld_s;
    return tc_smem(dim, max_keys, &ld_s) <= tc_dynamic_limit();
}

/* Key splits when (tokens x head groups) fill less than a wave of 132 SMs: as many as keep
 * the blocks within one wave (a decode block's ~116 KB of shared memory leaves one an SM:
 * rounding up, 16 tokens' 160 blocks ran as two waves of one), at least one 64-key staging
 * round a split, at most 16 splits. A function of T, H and the key lists' length only, so a
 * token decodes the same in any batch launched per sequence, or launched whole with the
 * splits of T = 1 (bt_cuda_attention_batch_t.split_per_token). */
static int tc_splits(int T, int H, int max_keys)
{
    long blocks = (long)T * bt__cdiv(H, TC_HEADS);
    int s = (int)(132 / blocks);
    int by_keys = bt__cdiv(max_keys > 0 ? max_keys : 1, TC_KEYS);
    if (s > by_keys) s = by_keys;
    if (s > 16) s = 16;
    return s < 1 ? 1 : s;
}

extern "C" size_t bt_cuda_attention_tc_ws_floats(int T, int H, int dim, int max_keys)
{
    int s = tc_splits(T, H, max_keys);
    return s > 1 ? (size_t)T * H * (size_t)s * (size_t)(dim + 2) : 0;
}

extern "C" bt_status_t bt_cuda_attention_tc_ws(void *out, const void *q, const void *win_kv,
                                               const int32_t *win_idx, const int32_t *win_n,
                                               int win_stride, const void *comp_kv,
                                               const int32_t *sel, const int32_t *sel_n,
                                               int sel_stride, const float *sink,
                                               const int64_t *pos, const float *inv_freq, int half,
                                               bt_cuda_dtype_t dtype, int T, int H, int dim,
                                               float *work, size_t work_floats,
                                               const bt_cuda_attention_batch_t *batch,
                                               cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && q && win_kv && win_idx && win_n && sink && pos && bt__dtype_ok(dtype));
    BT_CUDA_REQUIRE(!sel_n || (sel && comp_kv));
    BT_CUDA_REQUIRE(T > 0 && H > 0 && win_stride >= 0 && sel_stride >= 0);
    BT_CUDA_REQUIRE(half >= 0 && 2 * half <= dim && (half == 0 || inv_freq));
    int max_keys = win_stride + (sel_n ? sel_stride : 0);
    BT_CUDA_REQUIRE(bt_cuda_attention_tc_fits(dim, max_keys));
    /* rows are read 16 bytes at a time (a batch's offsets are the caller's to keep so) */
    BT_CUDA_REQUIRE((uintptr_t)q % 16 == 0 && (uintptr_t)win_kv % 16 == 0 &&
                    (uintptr_t)comp_kv % 16 == 0);
    bool per_token = batch && batch->split_per_token;
    int chunk;
    int splits = bt__attention_fit_splits(work ? tc_splits(per_token ? 1 : T, H, max_keys) : 1, T,
                                          H, dim, max_keys, TC_KEYS, work_floats, per_token,
                                          &chunk);
    BT_CUDA_REQUIRE(splits >= 1); /* per token: the workspace holds every token's splits */
    int ld_s;
    size_t bytes = tc_smem(dim, splits > 1 ? chunk : max_keys, &ld_s);
    dim3 grid(bt__cdiv(H, TC_HEADS), T, splits);
    const int64_t *win_off = batch ? batch->win_off : NULL, *comp_off = batch ? batch->comp_off : NULL;
    typedef __nv_bfloat16 bf;
#define TC_LAUNCH(TY, SP)                                                                          \
    bt__launch(attention_tc_kernel<TY, SP>, grid, TC_WARPS * 32, bytes, stream, (TY *)out,         \
               (const TY *)q, (const TY *)win_kv, win_off, win_idx, win_n, win_stride,             \
               (const TY *)comp_kv, comp_off, sel, sel_n, sel_stride, sink, pos, inv_freq, half,   \
               H, dim, ld_s, splits, chunk, work)
    if (dtype == BT_CUDA_BF16 && splits == 1 && bt_cuda_attention_flash_fits(dim))
        return bt_cuda_attention_flash(out, q, dtype, (const uint16_t *)win_kv, win_idx, win_n,
                                       win_stride, (const uint16_t *)comp_kv, sel, sel_n,
                                       sel_stride, sink, pos, inv_freq, half, T, H, dim, batch,
                                       stream);
    if (dtype == BT_CUDA_F32) {
        if (splits > 1) TC_LAUNCH(float, true);
        else TC_LAUNCH(float, false);
    } else {
        if (splits > 1) TC_LAUNCH(bf, true);
        else TC_LAUNCH(bf, false);
    }
#undef TC_LAUNCH
    bt_status_t st = bt__cuda_launched("attention_tc");
    if (st != BT_OK || splits == 1) return st;
    return bt__attention_combine(out, dtype, work, sink, pos, inv_freq, half, T, H, dim, splits,
                                 stream);
}

extern "C" bt_status_t bt_cuda_attention_tc(void *out, const void *q, const void *win_kv,
                                            const int32_t *win_idx, const int32_t *win_n,
                                            int win_stride, const void *comp_kv, const int32_t *sel,
                                            const int32_t *sel_n, int sel_stride, const float *sink,
                                            const int64_t *pos, const float *inv_freq, int half,
                                            bt_cuda_dtype_t dtype, int T, int H, int dim,
                                            cudaStream_t stream)
{
    return bt_cuda_attention_tc_ws(out, q, win_kv, win_idx, win_n, win_stride, comp_kv, sel,
                                   sel_n, sel_stride, sink, pos, inv_freq, half, dtype, T, H, dim,
                                   NULL, 0, NULL, stream);
}

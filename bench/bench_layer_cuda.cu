/* bench_layer_cuda: one DeepSeek-V4.1-Flash-shaped layer, random weights, run with the CUDA
 * operators of kernels/cuda on one GPU, timed per case against a floor measured on the same
 * GPU in the same run. bench/layer_torch.py is the same layer in PyTorch; bench/run_layer_bench.sh
 * builds this file, runs both and merges their JSON lines into one table.
 *
 *   bench_layer_cuda [--cases decode_b1,decode_b16,prefill] [--reps 30] [--warmup 5]
 *                    [--seed 1] [--entries 8192] [--prefill 4096] [--dump DIR] [--no-graph]
 *                    [--trace DIR]
 *
 * --trace DIR: each graph's kernels as they ran in it (CUPTI), DIR/trace-CASE.md
 * (kernel_trace.cuh).
 *
 * stdout: one JSON line for the device (measured copy bandwidth and tensor-core rates), then
 * one per case; stderr: the same in words.
 *
 * The layer is a ratio-1 re-index layer (MODEL-DS41.md: 24/28/32/36): window attention over
 * 128 tokens plus the 512 compressed entries that the layer's own indexer selects from the
 * kv source's cache. The compressor (the kv source's job) and the candidate-block mask are not
 * part of it. Per token, in the order of services/engine/model.c:
 *   mHC   mix (attention site), collapse + attn_norm           hc_mix_collapse (decode, two
 *                                                              streams: hc_collapse_norm, the
 *                                                              mix beside it: hc_mix)
 *   proj  qr = q_norm(wq_a x); q = rope(wq_b qr);              gemm_fp8, rmsnorm, rope
 *         kv = fq8(rope(kv_norm(wkv x))) into the window ring  gemm_fp8, head_finish,
 *                                                              kv_store (here)
 *   index qI = fq4(rope(i_wq_b qr)); w = weights_proj x;       gemm_fp8, head_finish,
 *         scores over the cached index keys, top 512           gemm_bf16, index_scores, topk
 *   core  attention over window + selected, sink, inverse rope attention
 *   proj  wo_a per group (8 x 1024), wo_b                      gemm_fp8_batched (decode) or
 *                                                               swap12 (here) + gemm_fp8 x8,
 *                                                               gemm_fp8
 *   mHC   expand; mix (FFN site), collapse + ffn_norm           hc_expand, hc_mix_collapse
 *   route router logits (bf16 weights, fp32 out), top-6        gemm_bf16, moe_route,
 *         rows grouped by expert                                moe_dispatch (here)
 *   exp   384 routed FP4 experts (grouped), 1 FP8 shared       gemm_fp4_grouped, swiglu,
 *                                                              gemm_fp8, moe_combine
 *   mHC   expand                                                hc_expand
 * "(here)": small glue kernels of this file; the rest are bt_cuda_* launchers.
 *
 * Inputs come from a counter-based generator that bench/layer_torch.py reproduces bit for bit,
 * so both sides compute the same layer on the same numbers (--dump writes a few output rows
 * for layer_torch.py --compare):
 *   mix32(x)      = lowbias32: x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; x ^= x>>16
 *   key(seed,tag) = mix32(seed * 0x9e3779b9 + tag * 0x85ebca6b)          (all mod 2^32)
 *   r(i)          = mix32(mix32(i) ^ key), i the element's row-major index in its tensor
 *   uniform u     = (r >> 8) * 2^-23 - 1, in [-1, 1); a f32 tensor is add + u * 2^-m
 *   FP8 weight    = byte (r>>24 & 0x80) | (4 + (r>>8 & 3)) << 3 | (r & 7), |w| in [1/8, 15/8]
 *   FP4 weight    = byte r & 0xff (two e2m1 codes); every UE8M0 scale = 127 - shift (a constant
 *                   per tensor, so that y = W x keeps x's magnitude)
 * The tags, shifts and offsets: weights_make and case_make below, Weights and Case in
 * layer_torch.py. */
/* common/status.h has no C++ guard of its own: bt_status_str is a C symbol */
extern "C" {
#include "common/status.h"
}
#include "kernels/cuda/common.cuh" /* bt__launch: the step's own kernels launch as the operators do */
#include "kernels/cuda/cuda_ops.h"
#include "bench/kernel_trace.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- shapes (MODEL-DS41.md) ------------------------------------------------------------ */

enum {
    HID = 5120,       /* hidden */
    HC = 4,           /* mHC streams */
    MIXN = (2 + HC) * HC,
    NH = 64,          /* attention heads */
    HD = 512,         /* head_dim (one latent is K and V) */
    ROPE_HALF = 32,   /* RoPE on the last 64 channels, interleaved pairs */
    QL = 1280,        /* q_lora_rank */
    OG = 8,           /* o_groups */
    OL = 1024,        /* o_lora_rank */
    OGIN = NH * HD / OG, /* 4096 inputs per wo_a group */
    WIN = 128,        /* sliding window */
    IH = 32,          /* indexer heads (MODEL-DS41.md: 32 x 128) */
    ID = 128,         /* indexer head dim */
    ITOPK = 512,      /* index_topk */
    NE = 384,         /* routed experts */
    TOPK = 6,
    MI = 2304,        /* expert width */
    N_PARTS = 6,
    N_SEGS = 9,       /* timed segments of one layer (parts recur) */
    FP8_WIDE_ROWS = 64, /* rows from which an FP8 product dequantizes its weight once and
                           runs cuBLASLt bf16 (as the engine's mm does) */
};

static const float RMS_EPS = 1e-20f, HC_EPS = 1e-6f, ROUTE_SCALE = 1.5f, SWIGLU_LIMIT = 10.0f;
static const int HC_ITERS = 20;

typedef enum { P_MHC, P_APROJ, P_CORE, P_INDEX, P_ROUTE, P_EXPERTS } part_t;
static const char *part_names[N_PARTS] = {"mhc", "attn_proj", "attn_core", "indexer",
                                          "moe_route", "experts"};
/* the part of each timed segment, in layer order */
static const part_t seg_part[N_SEGS] = {P_MHC, P_APROJ, P_INDEX, P_CORE, P_APROJ,
                                        P_MHC, P_ROUTE, P_EXPERTS, P_MHC};

/* ---- checks ----------------------------------------------------------------------------- */

/* Every bt_cuda_* call and CUDA runtime call goes through one of these: the failing call is
 * named with its line, and the status goes up to main (which frees and exits non-zero). */
#define BT_TRY(call)                                                                               \
    do {                                                                                           \
        bt_status_t st_ = (call);                                                                  \
        if (st_ != BT_OK) {                                                                        \
            fprintf(stderr, "bench_layer_cuda.cu:%d: %s failed: %s\n", __LINE__, #call,            \
                    bt_status_str(st_));                                                           \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

#define CU_TRY(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_layer_cuda.cu:%d: %s: %s\n", __LINE__, #call,                   \
                    cudaGetErrorString(e_));                                                       \
            cudaGetLastError();                                                                    \
            return BT_ERR_DEVICE;                                                                  \
        }                                                                                          \
    } while (0)

/* after a launch of this file's own kernels */
#define LAUNCHED(what) CU_TRY(cudaGetLastError())

/* Device allocations are recorded so that one call frees them all, whichever step failed. */
enum { MAX_ALLOCS = 256 };
typedef struct {
    void *p[MAX_ALLOCS];
    size_t bytes[MAX_ALLOCS];
    int n;
    size_t total;
} arena_t;

static bt_status_t dalloc(arena_t *a, void **p_out, size_t bytes, const char *what)
{
    void *p = NULL;
    if (a->n == MAX_ALLOCS) {
        fprintf(stderr, "arena full at %s\n", what);
        return BT_ERR_NO_MEMORY;
    }
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "cudaMalloc %s (%.1f MiB, %.2f GiB held): %s\n", what,
                bytes / 1048576.0, a->total / 1073741824.0, cudaGetErrorString(e));
        return BT_ERR_NO_MEMORY;
    }
    a->p[a->n] = p;
    a->bytes[a->n++] = bytes;
    a->total += bytes;
    *p_out = p;
    return BT_OK;
}

static void arena_free(arena_t *a)
{
    for (int i = 0; i < a->n; i++) cudaFree(a->p[i]);
    a->n = 0;
    a->total = 0;
}

#define DALLOC(a, ptr, bytes) BT_TRY(dalloc((a), (void **)&(ptr), (bytes), #ptr))

/* ---- the shared generator --------------------------------------------------------------- */

__host__ __device__ static inline uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

__host__ __device__ static inline uint32_t tensor_key(uint32_t seed, uint32_t tag)
{
    return mix32(seed * 0x9e3779b9u + tag * 0x85ebca6bu);
}

__device__ static inline uint32_t rnd(uint32_t key, size_t i)
{
    return mix32(mix32((uint32_t)i) ^ key);
}

/* exact in f32: a 24-bit integer times a power of two, minus one */
__device__ static inline float unif(uint32_t r) { return (float)(r >> 8) * 0x1p-23f - 1.0f; }

typedef enum { G_F32, G_BF16, G_FP8, G_FP4 } gen_kind_t;

/* `groups` tensors of n elements each, tags tag0, tag0+1, ... (the experts); mul is a power of
 * two, so add + u * mul is rounded once whether or not it is contracted into an FMA. */
__global__ void gen_kernel(void *p, size_t n, int groups, uint32_t seed, uint32_t tag0, int kind,
                           float mul, float add)
{
    size_t total = n * (size_t)groups;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < total;
         j += (size_t)gridDim.x * blockDim.x) {
        size_t g = j / n, i = j % n;
        uint32_t r = rnd(tensor_key(seed, tag0 + (uint32_t)g), i);
        switch (kind) {
        case G_F32: ((float *)p)[j] = add + unif(r) * mul; break;
        case G_BF16: ((__nv_bfloat16 *)p)[j] = __float2bfloat16_rn(add + unif(r) * mul); break;
        case G_FP8:
            ((uint8_t *)p)[j] = (uint8_t)(((r >> 24) & 0x80u) | ((4u + ((r >> 8) & 3u)) << 3) |
                                          (r & 7u));
            break;
        default: ((uint8_t *)p)[j] = (uint8_t)(r & 0xffu); break;
        }
    }
}

static bt_status_t gen(void *p, size_t n, int groups, uint32_t seed, uint32_t tag, gen_kind_t kind,
                       int shift, float add, cudaStream_t st)
{
    gen_kernel<<<4096, 256, 0, st>>>(p, n, groups, seed, tag, (int)kind, ldexpf(1.0f, -shift),
                                     add);
    LAUNCHED("gen");
    return BT_OK;
}

/* ---- glue kernels ----------------------------------------------------------------------- */

/* the new tokens' window KV (f32, already rounded to FP8 values) into their ring rows (bf16,
 * exact: an e4m3 value times a power of two) */
__global__ void kv_store_kernel(__nv_bfloat16 *win, const int32_t *kv_row, const float *kv, int T)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * HD) return;
    size_t t = i / HD, d = i % HD;
    win[(size_t)kv_row[t] * HD + d] = __float2bfloat16_rn(kv[i]);
}

/* out[B, A, C] = in[A, B, C] for bf16 rows, C a multiple of 8 (16-byte moves). Many rows run
 * wo_a per group through cuBLASLt over contiguous rows, so the heads of group g of every token
 * are gathered first, and the groups' outputs are put back token-major for wo_b. */
__global__ void swap12_kernel(uint4 *out, const uint4 *in, int A, int B, int C8)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)A * B * C8) return;
    size_t c = i % C8, ab = i / C8, b = ab % B, a = ab / B;
    out[(b * A + a) * C8 + c] = in[i];
}

/* exclusive prefix sum over the block (1024 threads) */
__device__ static int block_excl_scan(int v, int *warp_tot)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int incl = bt_warp_incl_sum(v);
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int w = warp_tot[lane], wi = bt_warp_incl_sum(w);
        warp_tot[32 + lane] = wi - w;
    }
    __syncthreads();
    return warp_tot[32 + warp] + incl - v;
}

/* Rows grouped by expert past BT_CUDA_MOE_GROUP_MAX routed rows (a prefill; a decode batch's
 * grouping is the engine's, bt_cuda_moe_group), for bt_cuda_gemm_fp4_grouped: one
 * block counts the (token, slot) pairs per expert, scans the counts into offs, and places every
 * pair: rows[p] = its token, row_w[p] = its routing weight, row_of[pair] = p (for the combine).
 * Order within an expert follows the atomics; each row is computed on its own, so the result does
 * not depend on it. */
__global__ void __launch_bounds__(1024) moe_dispatch_kernel(int32_t *offs, int32_t *rows,
                                                            float *row_w, int32_t *row_of,
                                                            const int32_t *idx, const float *wts,
                                                            int pairs, int k, int E)
{
    bt_grid_begin();
    __shared__ int cnt[1024], cur[1024], warp_tot[64];
    for (int e = threadIdx.x; e < 1024; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) atomicAdd(&cnt[idx[i]], 1);
    __syncthreads();
    int v = (int)threadIdx.x < E ? cnt[threadIdx.x] : 0;
    int ex = block_excl_scan(v, warp_tot);
    if ((int)threadIdx.x < E) {
        offs[threadIdx.x] = ex;
        cur[threadIdx.x] = ex;
    }
    if ((int)threadIdx.x == E - 1) offs[E] = ex + v;
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int p = atomicAdd(&cur[idx[i]], 1);
        rows[p] = i / k;
        row_w[p] = wts[i];
        row_of[i] = p;
    }
}

static int cdiv(size_t a, size_t b) { return (int)((a + b - 1) / b); }

/* ---- weights ---------------------------------------------------------------------------- */

typedef struct {
    uint8_t *w, *s; /* FP8 e4m3 [N,K] + UE8M0 [N/32, K/32] */
    int N, K;
} fp8w_t;

typedef struct {
    fp8w_t wq_a, wq_b, wkv, wo_a, wo_b, iwq_b, sw13, sw2;
    uint16_t *wproj, *gate_w; /* bf16 [32,5120], [384,5120] */
    uint8_t *w13, *w13_s, *w2, *w2_s; /* FP4 experts: [384][4608][2560] + [384][4608][160],
                                        [384][5120][1152] + [384][5120][72] */
    float *gate_bias, *sink, *attn_norm, *ffn_norm, *q_norm, *kv_norm;
    float *hc_fn[2], *hc_base[2], *hc_scale[2]; /* [0] attention site, [1] FFN site */
    float *inv_freq;                            /* [32] */
} weights_t;

/* Tags: keep in step with the TAG_ constants of layer_torch.py. */
enum {
    TAG_X = 1, TAG_HC_FN_A, TAG_HC_BASE_A, TAG_HC_SCALE_A, TAG_HC_FN_F, TAG_HC_BASE_F,
    TAG_HC_SCALE_F, TAG_ATTN_NORM, TAG_FFN_NORM, TAG_Q_NORM, TAG_KV_NORM, TAG_WQ_A, TAG_WQ_B,
    TAG_WKV, TAG_WO_A, TAG_WO_B, TAG_IWQ_B, TAG_WPROJ, TAG_GATE_W, TAG_GATE_BIAS, TAG_SINK,
    TAG_SW13, TAG_SW2, TAG_COMP, TAG_WIN, TAG_IKEY, TAG_PRE_IN,
    TAG_W13 = 1000, /* + expert */
    TAG_W2 = 2000,
};

/* FP8 weights: tag, N, K, scale shift (about log2 sqrt K) */
static bt_status_t make_fp8(arena_t *a, fp8w_t *w, uint32_t seed, uint32_t tag, int N, int K,
                            int shift, cudaStream_t st)
{
    size_t ns = (size_t)cdiv(N, 32) * cdiv(K, 32);
    w->N = N;
    w->K = K;
    DALLOC(a, w->w, (size_t)N * K);
    DALLOC(a, w->s, ns);
    BT_TRY(gen(w->w, (size_t)N * K, 1, seed, tag, G_FP8, 0, 0.0f, st));
    CU_TRY(cudaMemsetAsync(w->s, 127 - shift, ns, st));
    return BT_OK;
}

static bt_status_t make_f32(arena_t *a, float **p, size_t n, uint32_t seed, uint32_t tag,
                            int shift, float add, cudaStream_t st)
{
    BT_TRY(dalloc(a, (void **)p, n * sizeof(float), "f32 tensor"));
    return gen(*p, n, 1, seed, tag, G_F32, shift, add, st);
}

/* ratio > 0 layers: compress_rope_theta 160000 with YaRN (factor 16, original 65536,
 * beta_fast 32, beta_slow 1), as services/engine/config.c computes it */
static void yarn_inv_freq(float *f)
{
    const double theta = 160000.0, factor = 16.0, orig = 65536.0;
    const int dim = 2 * ROPE_HALF;
    double lo = floor(dim * log(orig / (32.0 * 2.0 * 3.14159265358979323846)) / (2.0 * log(theta)));
    double hi = ceil(dim * log(orig / (1.0 * 2.0 * 3.14159265358979323846)) / (2.0 * log(theta)));
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    for (int i = 0; i < ROPE_HALF; i++) {
        float pf = powf((float)theta, (float)(2 * i) / (float)dim);
        float extrap = 1.0f / pf, interp = 1.0f / ((float)factor * pf);
        float ramp = ((float)i - (float)lo) / ((float)hi - (float)lo);
        ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
        f[i] = interp * ramp + extrap * (1.0f - ramp);
    }
}

static bt_status_t weights_make(arena_t *a, weights_t *W, uint32_t seed, cudaStream_t st)
{
    BT_TRY(make_fp8(a, &W->wq_a, seed, TAG_WQ_A, QL, HID, 6, st));
    BT_TRY(make_fp8(a, &W->wq_b, seed, TAG_WQ_B, NH * HD, QL, 5, st));
    BT_TRY(make_fp8(a, &W->wkv, seed, TAG_WKV, HD, HID, 6, st));
    BT_TRY(make_fp8(a, &W->wo_a, seed, TAG_WO_A, OG * OL, OGIN, 6, st));
    BT_TRY(make_fp8(a, &W->wo_b, seed, TAG_WO_B, HID, OG * OL, 7, st));
    BT_TRY(make_fp8(a, &W->iwq_b, seed, TAG_IWQ_B, IH * ID, QL, 5, st));
    BT_TRY(make_fp8(a, &W->sw13, seed, TAG_SW13, 2 * MI, HID, 6, st));
    BT_TRY(make_fp8(a, &W->sw2, seed, TAG_SW2, HID, MI, 6, st));
    /* weights_proj carries the reference's 32^-0.5 itself (random weights: nothing is lost),
     * so neither side scales w */
    DALLOC(a, W->wproj, (size_t)IH * HID * 2);
    BT_TRY(gen(W->wproj, (size_t)IH * HID, 1, seed, TAG_WPROJ, G_BF16, 6, 0.0f, st));
    DALLOC(a, W->gate_w, (size_t)NE * HID * 2);
    BT_TRY(gen(W->gate_w, (size_t)NE * HID, 1, seed, TAG_GATE_W, G_BF16, 6, 0.0f, st));
    size_t n13 = (size_t)2 * MI * HID / 2, n2 = (size_t)HID * MI / 2;
    DALLOC(a, W->w13, n13 * NE);
    DALLOC(a, W->w13_s, (size_t)2 * MI * (HID / 32) * NE);
    DALLOC(a, W->w2, n2 * NE);
    DALLOC(a, W->w2_s, (size_t)HID * (MI / 32) * NE);
    BT_TRY(gen(W->w13, n13, NE, seed, TAG_W13, G_FP4, 0, 0.0f, st));
    BT_TRY(gen(W->w2, n2, NE, seed, TAG_W2, G_FP4, 0, 0.0f, st));
    /* into the FP4 kernels' fragment order (the formula gives the checkpoint's order, as
     * layer_torch.py reads it) */
    BT_TRY(bt_cuda_fp4_to_frag(W->w13, n13 * NE, st));
    BT_TRY(bt_cuda_fp4_to_frag(W->w2, n2 * NE, st));
    /* e2m1 codes have an rms of ~2.9: two more halvings than the FP8 tensors */
    CU_TRY(cudaMemsetAsync(W->w13_s, 127 - 8, (size_t)2 * MI * (HID / 32) * NE, st));
    CU_TRY(cudaMemsetAsync(W->w2_s, 127 - 8, (size_t)HID * (MI / 32) * NE, st));
    BT_TRY(make_f32(a, &W->gate_bias, NE, seed, TAG_GATE_BIAS, 4, 0.0f, st));
    BT_TRY(make_f32(a, &W->sink, NH, seed, TAG_SINK, 0, 0.0f, st));
    BT_TRY(make_f32(a, &W->attn_norm, HID, seed, TAG_ATTN_NORM, 2, 1.0f, st));
    BT_TRY(make_f32(a, &W->ffn_norm, HID, seed, TAG_FFN_NORM, 2, 1.0f, st));
    BT_TRY(make_f32(a, &W->q_norm, QL, seed, TAG_Q_NORM, 2, 1.0f, st));
    BT_TRY(make_f32(a, &W->kv_norm, HD, seed, TAG_KV_NORM, 2, 1.0f, st));
    for (int s = 0; s < 2; s++) {
        uint32_t t0 = s ? TAG_HC_FN_F : TAG_HC_FN_A;
        BT_TRY(make_f32(a, &W->hc_fn[s], (size_t)MIXN * HC * HID, seed, t0, 8, 0.0f, st));
        BT_TRY(make_f32(a, &W->hc_base[s], MIXN, seed, t0 + 1, 1, 0.0f, st));
        BT_TRY(make_f32(a, &W->hc_scale[s], 3, seed, t0 + 2, 2, 0.5f, st));
    }
    float f[ROPE_HALF];
    yarn_inv_freq(f);
    DALLOC(a, W->inv_freq, sizeof f);
    CU_TRY(cudaMemcpyAsync(W->inv_freq, f, sizeof f, cudaMemcpyHostToDevice, st));
    return BT_OK;
}

/* ---- one case's state ------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int T, seqs, tps, n, max_rows, hit;
    size_t win_rows;
    float *x, *x0, *pre_in, *pre_a, *pre_f, *post, *comb;
    uint16_t *xin, *qr, *q, *win, *comp, *attn, *attn_g, *oa_g, *oa, *o_attn, *h, *sh;
    float *att_ws; /* attention's split-key partials (decode) */
    size_t att_ws_n;
    int32_t *elist; /* the experts the routing hit (read back at warm-up), for the FP4 GEMMs */
    int64_t *key_off; /* each token's index-key set (floats into ikeys): one scoring launch */
    int64_t *comp_off; /* each token's compressed cache (elements into comp): one attention launch */
    int32_t *n_keys;
    int n_elist;
    float *kv, *ikeys, *qi, *iw, *scores, *logits, *rw, *row_w, *gu, *y2, *sgu, *sy, *moe;
    int32_t *sel, *sel_n, *win_idx, *win_n, *kv_row, *ridx, *offs, *rows, *row_of;
    int32_t *topk_n; /* TOPK for every token: bt_cuda_moe_combine's row counts */
    /* a decode batch's grouping (bt_cuda_moe_group): its expert list, and its flag for an
     * expert id out of range (whose dropped row case_measure's row count reports) */
    int32_t *g_hit, *group_bad;
    int keep_moe;     /* the fused expand: still store the MoE's output (for --dump) */
    int64_t *pos, *visible;
    int32_t *offs_zero; /* diagnostics: every expert empty */
    uint16_t *wdq; /* a dequantized FP8 weight (bf16), for products of many rows */
    float *hc_ws;  /* mHC mixes split over blocks (decode) */
    size_t hc_ws_n;
} case_t;

static bt_status_t case_make(arena_t *a, case_t *c, uint32_t seed, cudaStream_t st)
{
    int T = c->T;
    size_t R = (size_t)T * TOPK, N = (size_t)c->seqs * c->n;
    DALLOC(a, c->x, (size_t)T * HC * HID * 4);
    DALLOC(a, c->x0, (size_t)T * HC * HID * 4);
    DALLOC(a, c->pre_in, (size_t)T * HC * 4);
    DALLOC(a, c->pre_a, (size_t)T * HC * 4);
    DALLOC(a, c->pre_f, (size_t)T * HC * 4);
    DALLOC(a, c->post, (size_t)T * HC * 4);
    DALLOC(a, c->comb, (size_t)T * HC * HC * 4);
    DALLOC(a, c->xin, (size_t)T * HID * 2);
    DALLOC(a, c->qr, (size_t)T * QL * 2);
    DALLOC(a, c->q, (size_t)T * NH * HD * 2);
    DALLOC(a, c->kv, (size_t)T * HD * 4);
    DALLOC(a, c->win, c->win_rows * HD * 2);
    DALLOC(a, c->comp, N * HD * 2);
    DALLOC(a, c->ikeys, N * ID * 4);
    DALLOC(a, c->qi, (size_t)T * IH * ID * 4);
    DALLOC(a, c->iw, (size_t)T * IH * 4);
    DALLOC(a, c->scores, (size_t)T * c->n * 4);
    DALLOC(a, c->sel, (size_t)T * ITOPK * 4);
    DALLOC(a, c->sel_n, (size_t)T * 4);
    DALLOC(a, c->win_idx, (size_t)T * WIN * 4);
    DALLOC(a, c->win_n, (size_t)T * 4);
    DALLOC(a, c->kv_row, (size_t)T * 4);
    DALLOC(a, c->pos, (size_t)T * 8);
    DALLOC(a, c->visible, (size_t)T * 8);
    DALLOC(a, c->key_off, (size_t)T * 8);
    DALLOC(a, c->comp_off, (size_t)T * 8);
    DALLOC(a, c->n_keys, (size_t)T * 4);
    DALLOC(a, c->attn, (size_t)T * NH * HD * 2);
    /* a decode batch splits each token's keys as the model does: as the token's alone */
    int ws_t = c->tps == 1 ? 1 : T;
    c->att_ws_n = bt_cuda_attention_ws_floats(ws_t, NH, HD, WIN + ITOPK);
    if (bt_cuda_attention_tc_ws_floats(ws_t, NH, HD, WIN + ITOPK) > c->att_ws_n)
        c->att_ws_n = bt_cuda_attention_tc_ws_floats(ws_t, NH, HD, WIN + ITOPK);
    c->att_ws_n *= (size_t)(T / ws_t);
    c->hc_ws_n = bt_cuda_hc_mix_ws_floats(T, HC, HID);
    if (c->hc_ws_n) DALLOC(a, c->hc_ws, c->hc_ws_n * 4);
    DALLOC(a, c->att_ws, c->att_ws_n * 4);
    DALLOC(a, c->attn_g, (size_t)T * NH * HD * 2);
    DALLOC(a, c->oa_g, (size_t)T * OG * OL * 2);
    DALLOC(a, c->oa, (size_t)T * OG * OL * 2);
    DALLOC(a, c->o_attn, (size_t)T * HID * 2);
    DALLOC(a, c->logits, (size_t)T * NE * 4);
    DALLOC(a, c->ridx, R * 4);
    DALLOC(a, c->rw, R * 4);
    DALLOC(a, c->offs, (NE + 1) * 4);
    DALLOC(a, c->offs_zero, (NE + 1) * 4);
    DALLOC(a, c->rows, R * 4);
    DALLOC(a, c->row_w, R * 4);
    DALLOC(a, c->row_of, R * 4);
    DALLOC(a, c->topk_n, (size_t)T * 4);
    DALLOC(a, c->g_hit, R * 4);
    DALLOC(a, c->group_bad, 4);
    CU_TRY(cudaMemsetAsync(c->group_bad, 0, 4, st));
    DALLOC(a, c->gu, R * 2 * MI * 4);
    DALLOC(a, c->h, R * MI * 2);
    DALLOC(a, c->y2, R * HID * 4);
    DALLOC(a, c->sgu, (size_t)T * 2 * MI * 4);
    DALLOC(a, c->sh, (size_t)T * MI * 2);
    if (T >= FP8_WIDE_ROWS) { /* the largest FP8 weight of the layer */
        size_t big = 0, nk[] = {(size_t)QL * HID, (size_t)NH * HD * QL, (size_t)HD * HID,
                                (size_t)IH * ID * QL, (size_t)OL * OGIN, (size_t)HID * OG * OL,
                                (size_t)2 * MI * HID, (size_t)HID * MI};
        for (size_t i = 0; i < sizeof nk / sizeof nk[0]; i++) big = nk[i] > big ? nk[i] : big;
        DALLOC(a, c->wdq, big * 2);
    }
    DALLOC(a, c->sy, (size_t)T * HID * 4);
    DALLOC(a, c->moe, (size_t)T * HID * 4);
    CU_TRY(cudaMemsetAsync(c->offs_zero, 0, (NE + 1) * 4, st));

    BT_TRY(gen(c->x0, (size_t)T * HC * HID, 1, seed, TAG_X, G_F32, 0, 0.0f, st));
    BT_TRY(gen(c->pre_in, (size_t)T * HC, 1, seed, TAG_PRE_IN, G_F32, 2, 0.5f, st));
    BT_TRY(gen(c->comp, N * HD, 1, seed, TAG_COMP, G_BF16, 0, 0.0f, st));
    BT_TRY(gen(c->win, c->win_rows * HD, 1, seed, TAG_WIN, G_BF16, 0, 0.0f, st));
    BT_TRY(gen(c->ikeys, N * ID, 1, seed, TAG_IKEY, G_F32, 0, 0.0f, st));
    /* the model's index keys carry the compressor's FP4 rounding, as its queries do */
    BT_TRY(bt_cuda_fake_quant(c->ikeys, (int)N, ID, 32, BT_CUDA_FQ_FP4_UE8M0, st));

    /* positions and the window's rows. Decode: every sequence at position n-1 (it sees all n
     * entries), its window in its own 128-row ring. Prefill: one sequence, the chunk at
     * positions n-T .. n-1 (the kv source has published the chunk's entries earlier in the
     * forward; entry j is visible to position p when j <= p); the window buffer holds the
     * previous chunk's ring (rows p % 128) and then the chunk's own rows (128 + t). */
    int32_t *win_idx = (int32_t *)malloc((size_t)T * WIN * 4);
    int32_t *win_n = (int32_t *)malloc((size_t)T * 4), *kv_row = (int32_t *)malloc((size_t)T * 4);
    int64_t *pos = (int64_t *)malloc((size_t)T * 8), *vis = (int64_t *)malloc((size_t)T * 8);
    if (!win_idx || !win_n || !kv_row || !pos || !vis) {
        free(win_idx);
        free(win_n);
        free(kv_row);
        free(pos);
        free(vis);
        return BT_ERR_NO_MEMORY;
    }
    int64_t p0 = c->n - c->tps;
    for (int t = 0; t < T; t++) {
        int s = t / c->tps;
        int64_t p = p0 + t % c->tps;
        pos[t] = p;
        vis[t] = p + 1;
        win_n[t] = WIN;
        for (int j = 0; j < WIN; j++) {
            int64_t q = p - (WIN - 1) + j;
            int32_t row;
            if (c->tps == 1)
                row = (int32_t)(s * WIN + q % WIN);
            else
                row = (int32_t)(q >= p0 ? WIN + (q - p0) : q % WIN);
            win_idx[(size_t)t * WIN + j] = row;
        }
        kv_row[t] = c->tps == 1 ? (int32_t)(s * WIN + p % WIN) : (int32_t)(WIN + t);
    }
    cudaError_t e = cudaMemcpy(c->win_idx, win_idx, (size_t)T * WIN * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(c->win_n, win_n, (size_t)T * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(c->kv_row, kv_row, (size_t)T * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(c->pos, pos, (size_t)T * 8, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(c->visible, vis, (size_t)T * 8, cudaMemcpyHostToDevice);
    {
        int64_t *ko = (int64_t *)malloc((size_t)T * 8);
        int32_t *nk = (int32_t *)malloc((size_t)T * 4);
        for (int t = 0; t < T; t++) {
            ko[t] = (int64_t)(t / c->tps) * c->n * HD;
            nk[t] = c->n;
        }
        if (e == cudaSuccess) e = cudaMemcpy(c->comp_off, ko, (size_t)T * 8, cudaMemcpyHostToDevice);
        for (int t = 0; t < T; t++) ko[t] = (int64_t)(t / c->tps) * c->n * ID;
        if (e == cudaSuccess) e = cudaMemcpy(c->key_off, ko, (size_t)T * 8, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(c->n_keys, nk, (size_t)T * 4, cudaMemcpyHostToDevice);
        for (int t = 0; t < T; t++)
            nk[t] = TOPK;
        if (e == cudaSuccess) e = cudaMemcpy(c->topk_n, nk, (size_t)T * 4, cudaMemcpyHostToDevice);
        free(ko);
        free(nk);
    }
    free(win_idx);
    free(win_n);
    free(kv_row);
    free(pos);
    free(vis);
    CU_TRY(e);
    /* a pageable cudaMemcpy may return before its DMA lands, and `st` does not wait for the
     * legacy stream: settle everything before the first layer reads these */
    CU_TRY(cudaDeviceSynchronize());
    return BT_OK;
}

/* ---- the layer -------------------------------------------------------------------------- */

#define F32 BT_CUDA_F32
#define BF16 BT_CUDA_BF16

/* --cuda-cores: the attention core, the indexer scores and the FP8 products of many rows on
 * the kernels that preceded the tensor-core paths (for before/after in one run) */
static int g_tensor_cores = 1;

/* The layer's independent chains side by side (layer_run with g_side set): a second stream
 * forked by event and joined back, as a graph's branches. Only where no product borrows the
 * shared dequantization scratch (few rows). g_fork/g_join: one pair a fork; g_edge: the early
 * fork's edges between the branches (wproj done, the q_lora rows done). */
static cudaStream_t g_side, g_side_stream; /* g_side: set while the two-stream graph is captured */
static cudaEvent_t g_fork[2], g_join[2], g_edge[2];
/* The attention's two-stream fork comes right after the mHC collapse, as in the engine
 * (model_cuda.c's queries_and_kv): the side stream takes the indexer's head weights (wproj)
 * and the latent KV row, then the queries (wq_b) once the q_lora product and its norm are done
 * on the main stream, which goes on with the indexer, its scores waiting for wproj.
 * BT_BENCH_EARLY_FORK=0: the fork after the norm (the engine before session 25); =1: only the
 * KV row before it (comparisons). */
static int g_early = 2;
/* With two streams, a third takes the mHC mixes (the split sums and their fold: the next
 * expand's post and comb, the next collapse's pre) beside the collapse and the sublayer on the
 * main stream, joined before the expand, as model_cuda.c's site() and expand() do: the
 * collapse reads the earlier site's pre, so it need not wait for this site's mix.
 * BT_BENCH_MIX_STREAM=0: the mix's fold and the collapse in one launch on the main stream
 * (the engine before session 28). */
static cudaStream_t g_mix_stream;
static cudaEvent_t g_mix_fork[2], g_mix_join[2];
static int g_mix = 1;
/* With two streams, where the shared expert forks from the routing: 0 before the gate's product
 * (the engine before session 30), 1 after it (the engine's: beside the shared expert's products
 * the gate's ran slower), 2 after the dispatch (BT_BENCH_SHARED_AT, for comparisons).
 * (Tried and slower: a fourth stream asking L2 for wq_b's weights from the layer's start and
 * for wo_a's once wq_b was done, while the chain before each reads little; ba5af38: decode b1
 * 0.195 -> 0.195..0.202 ms, b16 0.834 -> 0.839..0.841, session 37, an H100.) */
static int g_shared_at = 1;
/* Stream priorities in the two-stream graph: 1, the engine's (model_cuda.c), the main and mix
 * streams high, the side stream low (decode b1 -4%, session 38). BT_BENCH_PRIO (comparisons):
 * 0 none; 2 the side stream high; 3 the mix stream high; 4 as 1, but the shared expert's fork
 * on a high side stream (g_side_hi); 5 as 1, but the attention's fork on it. Captured kernel
 * nodes take their stream's priority; the graphs are instantiated to use them. */
static int g_prio = 1;
/* The latent KV row (wkv, its norm/RoPE/FP8, the ring store) on the mix stream once the
 * collapse is done, joined before the attention core, as model_cuda.c's queries_and_kv has it:
 * on the side stream it held up wq_b (the trace: wq_b launched ~8 us after the q_lora norm,
 * behind the KV row's three kernels); decode b16 -1.5%, b1 the same (session 38).
 * BT_BENCH_KV_MIX=0: on the side stream (comparisons). Two streams with the mix stream and the
 * early fork only. */
static int g_kv_mix = 1;
/* BT_BENCH_QB_AFTER=1 (comparisons): the side stream's wq_b waits for the indexer's query
 * product (iwq_b) on the main stream, not just for the q_lora norm, so the indexer's product
 * has the memory to itself and wq_b streams beside its latency-bound kernels (head finish,
 * scores, top-k); 2: for the head finish after it too. Early fork only. */
static int g_qb_after = 0;
/* The indexer's head weights scaled by 1/sqrt(heads) as the engine scales them: on the side
 * stream right after their product (the engine since session 38), or with
 * BT_BENCH_IW_SCALE_MAIN=1 on the main stream before the scores (the engine before). */
static int g_iw_scale_main = 0;
/* BT_BENCH_FUSE: the decode's launches merged as the engine merges them (session 39), 1
 * (default) all three: w13 with the SwiGLU (bt_cuda_gemm_fp4_swiglu_list; the prefill's too
 * on Hopper since session 43, BT_CUDA_WGRS_SWIGLU=0 apart), the combine in the
 * expand (bt_cuda_hc_expand_moe), the index queries' product with their finish
 * (bt_cuda_gemm_fp8_qfinish, for up to 8 tokens); 0 none; 2, 3, 4 only the first, second,
 * third (comparisons). (Routing with its grouping in one launch and the attention's splits
 * folded in clusters were measured slower and taken out: bench/RESULTS.md, session 39.) */
static int g_fuse = 1;
static bool fused(int which)
{
    return g_fuse == 1 || g_fuse == which + 2;
}
static cudaEvent_t g_kv_ev[2];
static cudaStream_t g_side_hi;

/* stream `waiter` goes on only past what `from` has queued so far (ev recorded on from) */
static bt_status_t stream_after(cudaStream_t waiter, cudaStream_t from, cudaEvent_t ev)
{
    CU_TRY(cudaEventRecord(ev, from));
    CU_TRY(cudaStreamWaitEvent(waiter, ev, 0));
    return BT_OK;
}

static bt_status_t fork_side(cudaStream_t st, int i)
{
    return stream_after(g_side, st, g_fork[i]);
}

static bt_status_t join_side(cudaStream_t st, int i)
{
    return stream_after(st, g_side, g_join[i]);
}

/* whether an FP8 product of M rows dequantizes its weight for cuBLASLt */
static int fp8_via_cublas(const case_t *c, int M)
{
    return g_tensor_cores && M >= FP8_WIDE_ROWS && c->wdq;
}

static bt_status_t fp8_mm(bt_cuda_blas_t *blas, case_t *c, void *y, bt_cuda_dtype_t yt,
                          const uint16_t *x, const uint8_t *w, const uint8_t *s, int M, int N,
                          int K, cudaStream_t st)
{
    if (!fp8_via_cublas(c, M)) return bt_cuda_gemm_fp8(y, yt, x, w, s, M, N, K, st);
    BT_TRY(bt_cuda_dequant_fp8(c->wdq, w, s, N, K, st));
    return bt_cuda_gemm_bf16(blas, y, yt, x, c->wdq, M, N, K, st);
}

/* In a stream capture a plain cudaEventRecord only joins streams; an external record becomes
 * an event-record node of the graph, which is what timing inside a replay needs. */
static bt_status_t mark(cudaEvent_t *ev, int i, cudaStream_t st, int capture)
{
    if (ev)
        CU_TRY(cudaEventRecordWithFlags(ev[i], st,
                                        capture ? cudaEventRecordExternal : cudaEventRecordDefault));
    return BT_OK;
}

/* The routed experts' products as the layer runs them: w13 (with its SwiGLU in one launch
 * where bt_cuda_gemm_fp4_swiglu_fits takes it, else bt_cuda_swiglu after it, which `swiglu`
 * false leaves out: the GEMMs alone), then w2 on the swiglu's rows h; over the experts hit
 * (c->elist) once the warm-up has read them back, else over every expert. */
static bt_status_t routed_experts(const weights_t *W, case_t *c, cudaStream_t st, bool swiglu)
{
    const int R = c->T * TOPK;
    if (c->elist && fused(0) && bt_cuda_gemm_fp4_swiglu_fits(MI, HID, c->max_rows)) {
        BT_TRY(bt_cuda_gemm_fp4_swiglu_list(c->h, BF16, c->xin, c->rows, c->offs, c->elist,
                                            c->n_elist, c->max_rows, W->w13, W->w13_s, MI, HID,
                                            c->row_w, SWIGLU_LIMIT, st));
        return bt_cuda_gemm_fp4_grouped_list(c->y2, F32, c->h, NULL, c->offs, c->elist, c->n_elist,
                                             c->max_rows, W->w2, W->w2_s, HID, MI, st);
    }
    if (c->elist) {
        BT_TRY(bt_cuda_gemm_fp4_grouped_list(c->gu, F32, c->xin, c->rows, c->offs, c->elist,
                                             c->n_elist, c->max_rows, W->w13, W->w13_s, 2 * MI, HID,
                                             st));
        if (swiglu) BT_TRY(bt_cuda_swiglu(c->h, BF16, c->gu, c->row_w, R, MI, SWIGLU_LIMIT, st));
        return bt_cuda_gemm_fp4_grouped_list(c->y2, F32, c->h, NULL, c->offs, c->elist, c->n_elist,
                                             c->max_rows, W->w2, W->w2_s, HID, MI, st);
    }
    BT_TRY(bt_cuda_gemm_fp4_grouped(c->gu, F32, c->xin, c->rows, c->offs, NE, c->max_rows, W->w13,
                                    W->w13_s, 2 * MI, HID, st));
    if (swiglu) BT_TRY(bt_cuda_swiglu(c->h, BF16, c->gu, c->row_w, R, MI, SWIGLU_LIMIT, st));
    return bt_cuda_gemm_fp4_grouped(c->y2, F32, c->h, NULL, c->offs, NE, c->max_rows, W->w2,
                                    W->w2_s, HID, MI, st);
}

/* One layer on c->x in place. ev: N_SEGS + 1 events recorded at the segment boundaries
 * (NULL: none); capture: the stream is being captured into a graph. The expert GEMMs get
 * c->max_rows as their host-side bound. */
static bt_status_t layer_run(const weights_t *W, bt_cuda_blas_t *blas, case_t *c, cudaStream_t st,
                             cudaEvent_t *ev, int capture)
{
    int T = c->T, R = T * TOPK;
    const int thr = 256;

    BT_TRY(mark(ev, 0, st, capture));
    /* Two streams (g_side set): the queries and the KV row (s2) beside the indexer (st),
     * joined before the attention core; the part events are then not recorded (ev NULL); s2
     * forked from the mHC collapse on unless g_early is 0. The mixes on a third when g_mix. */
    const int two = g_side && !fp8_via_cublas(c, T), early = two && g_early, mixs = two && g_mix;
    cudaStream_t side_low = g_side; /* (BT_BENCH_PRIO 4, 5: one fork on g_side_hi) */
    if (two && g_prio == 5) g_side = g_side_hi;
    /* mHC site i: its mix (into pre_out, post, comb), the collapse with pre_w and the norm */
    auto site = [&](int i, float *pre_out, const float *pre_w, const float *norm) -> bt_status_t {
        float *ws = g_tensor_cores ? c->hc_ws : NULL;
        if (!mixs)
            return bt_cuda_hc_mix_collapse_ws(pre_out, c->post, c->comb, c->x, W->hc_fn[i],
                                              W->hc_base[i], W->hc_scale[i], T, HC, HID, RMS_EPS,
                                              HC_EPS, HC_ITERS, ws, c->hc_ws_n, c->xin, BF16, pre_w,
                                              norm, RMS_EPS, st);
        BT_TRY(stream_after(g_mix_stream, st, g_mix_fork[i]));
        BT_TRY(bt_cuda_hc_mix_ws(pre_out, c->post, c->comb, c->x, W->hc_fn[i], W->hc_base[i],
                                 W->hc_scale[i], T, HC, HID, RMS_EPS, HC_EPS, HC_ITERS, ws,
                                 c->hc_ws_n, g_mix_stream));
        return bt_cuda_hc_collapse_norm(c->xin, BF16, c->x, pre_w, norm, T, HC, HID, RMS_EPS, st);
    };
    /* a sublayer's output o into the streams, site i's mix joined */
    auto expand = [&](int i, const void *o, bt_cuda_dtype_t ot) -> bt_status_t {
        if (mixs) BT_TRY(stream_after(st, g_mix_stream, g_mix_join[i]));
        return bt_cuda_hc_expand(c->x, o, ot, c->post, c->comb, T, HC, HID, st);
    };
    /* the same into site i, as the model does for many tokens where a site follows: the
     * collapse of the new streams in the expand's pass (BT_CUDA_HC_EC=0: two launches), then
     * the site's mix */
    auto expand_site = [&](int i, const void *o, bt_cuda_dtype_t ot, float *pre_out,
                           const float *pre_w, const float *norm) -> bt_status_t {
        float *ws = g_tensor_cores ? c->hc_ws : NULL;
        if (mixs) BT_TRY(stream_after(st, g_mix_stream, g_mix_join[i - 1]));
        BT_TRY(bt_cuda_hc_expand_collapse(c->x, o, ot, c->post, c->comb, c->xin, BF16, pre_w, norm,
                                          T, HC, HID, RMS_EPS, st));
        cudaStream_t ms = st;
        if (mixs) {
            BT_TRY(stream_after(g_mix_stream, st, g_mix_fork[i]));
            ms = g_mix_stream;
        }
        return bt_cuda_hc_mix_ws(pre_out, c->post, c->comb, c->x, W->hc_fn[i], W->hc_base[i],
                                 W->hc_scale[i], T, HC, HID, RMS_EPS, HC_EPS, HC_ITERS, ws,
                                 c->hc_ws_n, ms);
    };
    /* mHC, attention site: the attention collapses with the previous layer's FFN pre */
    BT_TRY(site(0, c->pre_a, c->pre_in, W->attn_norm));
    BT_TRY(mark(ev, 1, st, capture));

    /* attention projections (in) */
    cudaStream_t s2 = two ? g_side : st;
    auto kv_row = [&](cudaStream_t s) -> bt_status_t {
        BT_TRY(fp8_mm(blas, c, c->kv, F32, c->xin, W->wkv.w, W->wkv.s, T, HD, HID, s));
        BT_TRY(bt_cuda_head_finish(c->kv, T, 1, HD, 1, W->kv_norm, RMS_EPS, c->pos, W->inv_freq,
                                   ROPE_HALF, 32, BT_CUDA_FQ_FP8_UE8M0, s)); /* norm, rope, FP8 */
        bt__launch(kv_store_kernel, cdiv((size_t)T * HD, thr), thr, 0, s, (__nv_bfloat16 *)c->win,
                   c->kv_row, c->kv, T);
        LAUNCHED("kv_store");
        return BT_OK;
    };
    const int kv_mix = early && mixs && g_kv_mix;
    /* the indexer's head weights scaled by 1/sqrt(heads), as the engine does */
    auto iw_scale = [&](cudaStream_t s) {
        return bt_cuda_scale(c->iw, (size_t)T * IH, 1.0f / sqrtf((float)IH), s);
    };
    if (early) {
        BT_TRY(fork_side(st, 0));
        if (g_early == 2) {
            BT_TRY(bt_cuda_gemm_bf16(blas, c->iw, F32, c->xin, W->wproj, T, IH, HID, s2));
            if (!g_iw_scale_main) BT_TRY(iw_scale(s2));
            CU_TRY(cudaEventRecord(g_edge[0], s2)); /* the indexer's head weights are ready */
        }
        if (kv_mix) {
            BT_TRY(stream_after(g_mix_stream, st, g_kv_ev[0]));
            BT_TRY(kv_row(g_mix_stream));
        } else {
            BT_TRY(kv_row(s2));
        }
    }
    BT_TRY(fp8_mm(blas, c, c->qr, BF16, c->xin, W->wq_a.w, W->wq_a.s, T, QL, HID, st));
    BT_TRY(bt_cuda_rmsnorm(c->qr, BF16, c->qr, BF16, W->q_norm, T, QL, RMS_EPS, st));
    if (early) { /* the q_lora rows are ready (with g_qb_after, the edge comes later) */
        if (!g_qb_after) BT_TRY(stream_after(s2, st, g_edge[1]));
    } else if (two) {
        BT_TRY(fork_side(st, 0));
    }
    auto queries = [&]() -> bt_status_t {
        BT_TRY(fp8_mm(blas, c, c->q, BF16, c->qr, W->wq_b.w, W->wq_b.s, T, NH * HD, QL, s2));
        return bt_cuda_rope(c->q, BF16, T, NH, HD, c->pos, W->inv_freq, ROPE_HALF, 0, s2);
    };
    const int qb_after = early ? g_qb_after : 0;
    if (!qb_after) BT_TRY(queries());
    if (!early) BT_TRY(kv_row(s2));
    BT_TRY(mark(ev, 2, st, capture));

    /* indexer: the queries' product, then their RoPE and FP4 rounding (one launch where the
     * engine makes it one) */
    const bool qfinish =
        fused(2) && !fp8_via_cublas(c, T) && bt_cuda_gemm_fp8_qfinish_fits(T, IH * ID, QL, ID);
    if (qfinish)
        BT_TRY(bt_cuda_gemm_fp8_qfinish(c->qi, c->qr, W->iwq_b.w, W->iwq_b.s, T, IH * ID, QL, ID,
                                        c->pos, W->inv_freq, ROPE_HALF, BT_CUDA_FQ_FP4_UE8M0, st));
    else
        BT_TRY(fp8_mm(blas, c, c->qi, F32, c->qr, W->iwq_b.w, W->iwq_b.s, T, IH * ID, QL, st));
    auto queries_after = [&](int at) -> bt_status_t {
        if (qb_after != at) return BT_OK;
        BT_TRY(stream_after(s2, st, g_edge[1])); /* the q_lora rows and the indexer's product */
        return queries();
    };
    BT_TRY(queries_after(1));
    if (!qfinish)
        BT_TRY(bt_cuda_head_finish(c->qi, T, IH, ID, 0, NULL, 0.0f, c->pos, W->inv_freq, ROPE_HALF,
                                   32, BT_CUDA_FQ_FP4_UE8M0, st)); /* rope, FP4 */
    BT_TRY(queries_after(2));
    if (early && g_early == 2) {
        CU_TRY(cudaStreamWaitEvent(st, g_edge[0], 0));
        if (g_iw_scale_main) BT_TRY(iw_scale(st));
    } else {
        BT_TRY(bt_cuda_gemm_bf16(blas, c->iw, F32, c->xin, W->wproj, T, IH, HID, st));
        BT_TRY(iw_scale(st));
    }
    /* every token against its own sequence's keys, in one launch */
    if (!g_tensor_cores)
        BT_TRY(bt_cuda_index_scores_sets(c->scores, c->qi, c->iw, c->ikeys, c->key_off, c->n_keys,
                                         c->visible, T, IH, ID, c->n, st));
    else if (c->seqs == 1) /* one sequence: every token against the same keys */
        BT_TRY(bt_cuda_index_scores_tc(c->scores, c->qi, c->iw, c->ikeys, NULL, NULL, c->visible,
                                       T, IH, ID, c->n, st));
    else
        BT_TRY(bt_cuda_index_scores_tc(c->scores, c->qi, c->iw, c->ikeys, c->key_off, c->n_keys,
                                       c->visible, T, IH, ID, c->n, st));
    BT_TRY(bt_cuda_topk(c->sel, c->sel_n, ITOPK, c->scores, T, c->n, ITOPK, st));
    if (two) BT_TRY(join_side(st, 0));
    if (kv_mix) BT_TRY(stream_after(st, g_mix_stream, g_kv_ev[1]));
    BT_TRY(mark(ev, 3, st, capture));

    /* attention core: a decode batch as the model's (each sequence's compressed cache where it
     * lies, each token's keys split as they would be alone) */
    const bt_cuda_attention_batch_t batch = {NULL, c->comp_off, c->tps == 1};
    const bt_cuda_attention_batch_t *bp = c->seqs > 1 ? &batch : NULL;
    if (g_tensor_cores)
        BT_TRY(bt_cuda_attention_tc_ws(c->attn, c->q, c->win, c->win_idx, c->win_n, WIN, c->comp,
                                       c->sel, c->sel_n, ITOPK, W->sink, c->pos, W->inv_freq,
                                       ROPE_HALF, BF16, T, NH, HD, c->att_ws, c->att_ws_n, bp, st));
    else
        BT_TRY(bt_cuda_attention_ws(c->attn, c->q, c->win, c->win_idx, c->win_n, WIN, c->comp,
                                    c->sel, c->sel_n, ITOPK, W->sink, c->pos, W->inv_freq,
                                    ROPE_HALF, BF16, T, NH, HD, c->att_ws, c->att_ws_n, bp, st));
    BT_TRY(mark(ev, 4, st, capture));

    /* attention projections (out): wo_a per group of 8 heads, then wo_b */
    if (!fp8_via_cublas(c, T)) {
        /* the groups in one launch, each reading its heads and writing its columns in place */
        BT_TRY(bt_cuda_gemm_fp8_batched(c->oa, BF16, OG * OL, OL, c->attn, OG * OGIN, OGIN,
                                        W->wo_a.w, W->wo_a.s, OG, T, OL, OGIN, st));
    } else { /* many rows: each group's rows gathered for cuBLASLt, its output scattered back */
        bt__launch(swap12_kernel, cdiv((size_t)T * NH * HD / 8, thr), thr, 0, st,
                   (uint4 *)c->attn_g, (const uint4 *)c->attn, T, OG, OGIN / 8);
        LAUNCHED("swap12 heads");
        for (int g = 0; g < OG; g++) {
            const uint8_t *w = W->wo_a.w + (size_t)g * OL * OGIN;
            const uint8_t *s = W->wo_a.s + (size_t)g * (OL / 32) * (OGIN / 32);
            BT_TRY(fp8_mm(blas, c, c->oa_g + (size_t)g * T * OL, BF16,
                          c->attn_g + (size_t)g * T * OGIN, w, s, T, OL, OGIN, st));
        }
        bt__launch(swap12_kernel, cdiv((size_t)T * OG * OL / 8, thr), thr, 0, st, (uint4 *)c->oa,
                   (const uint4 *)c->oa_g, OG, T, OL / 8);
        LAUNCHED("swap12 groups");
    }
    BT_TRY(fp8_mm(blas, c, c->o_attn, BF16, c->oa, W->wo_b.w, W->wo_b.s, T, HID, OG * OL, st));
    BT_TRY(mark(ev, 5, st, capture));

    /* mHC: attention output into the streams; FFN site mix and collapse */
    if (T >= BT_CUDA_HC_EC_MIN_TOKENS) {
        BT_TRY(expand_site(1, c->o_attn, BF16, c->pre_f, c->pre_a, W->ffn_norm));
    } else { /* (a decode batch: the model's launches are these) */
        BT_TRY(expand(0, c->o_attn, BF16));
        BT_TRY(site(1, c->pre_f, c->pre_a, W->ffn_norm));
    }
    BT_TRY(mark(ev, 6, st, capture));

    /* the shared expert (FP8), on s2 beside the routing and the routed experts when two */
    auto shared_expert = [&](cudaStream_t s) -> bt_status_t {
        BT_TRY(fp8_mm(blas, c, c->sgu, F32, c->xin, W->sw13.w, W->sw13.s, T, 2 * MI, HID, s));
        BT_TRY(bt_cuda_swiglu(c->sh, BF16, c->sgu, NULL, T, MI, SWIGLU_LIMIT, s));
        return fp8_mm(blas, c, c->sy, F32, c->sh, W->sw2.w, W->sw2.s, T, HID, MI, s);
    };
    auto fork_shared = [&](int at) -> bt_status_t {
        if (!two || at != g_shared_at) return BT_OK;
        g_side = g_prio == 4 ? g_side_hi : side_low;
        BT_TRY(fork_side(st, 1));
        return shared_expert(g_side);
    };
    BT_TRY(fork_shared(0));

    /* MoE routing */
    BT_TRY(bt_cuda_gemm_bf16(blas, c->logits, F32, c->xin, W->gate_w, T, NE, HID, st));
    BT_TRY(fork_shared(1));
    BT_TRY(bt_cuda_moe_route(c->ridx, c->rw, c->logits, W->gate_bias, T, NE, TOPK, 1.0f, 1,
                             ROUTE_SCALE, st));
    if (R <= BT_CUDA_MOE_GROUP_MAX) { /* the engine's grouping: a token's rows in expert order */
        BT_TRY(bt_cuda_moe_group(c->offs, c->rows, c->row_w, c->row_of, c->topk_n, c->g_hit,
                                 NE < R ? NE : R, c->group_bad, 1, c->ridx, c->rw, T, TOPK, NE,
                                 st));
    } else {
        bt__launch(moe_dispatch_kernel, 1, 1024, 0, st, c->offs, c->rows, c->row_w, c->row_of,
                   c->ridx, c->rw, R, TOPK, NE);
        LAUNCHED("moe_dispatch");
    }
    BT_TRY(fork_shared(2));
    BT_TRY(mark(ev, 7, st, capture));

    /* experts: routed (FP4, grouped over the experts hit once the warm-up read them back;
     * the routing weight before w2), shared (FP8) after them on one stream */
    BT_TRY(routed_experts(W, c, st, true));
    if (two) {
        BT_TRY(join_side(st, 1));
        g_side = side_low;
    } else {
        BT_TRY(shared_expert(st));
    }
    /* the token's routed rows in slot order, then the shared expert (the engine's combine);
     * a decode batch's summed in the expand's pass as the engine does (the dumps' run stores
     * it too) */
    const bool expand_moe = fused(1) && T < BT_CUDA_HC_EC_MIN_TOKENS;
    if (!expand_moe || c->keep_moe)
        BT_TRY(bt_cuda_moe_combine(c->moe, c->y2, c->row_of, c->topk_n, TOPK, c->sy, T, HID, st));
    BT_TRY(mark(ev, 8, st, capture));

    if (expand_moe) {
        if (mixs) BT_TRY(stream_after(st, g_mix_stream, g_mix_join[1]));
        BT_TRY(bt_cuda_hc_expand_moe(c->x, c->y2, c->row_of, c->topk_n, TOPK, c->sy, c->post,
                                     c->comb, T, HC, HID, st));
    } else {
        BT_TRY(expand(1, c->moe, F32));
    }
    BT_TRY(mark(ev, 9, st, capture));
    return BT_OK;
}

/* ---- timing ----------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    double total_ms, part_ms[N_PARTS];
    int parts_ok;
} timing_t;

/* Times the layer `reps` times after `warmup` runs, X restored before each run (outside the
 * timed span), so every run routes and selects the same way. graph: replay that instead of
 * launching; its part events are record nodes inside it. */
static bt_status_t time_layer(const weights_t *W, bt_cuda_blas_t *blas, case_t *c, cudaStream_t st,
                              cudaEvent_t *ev, cudaGraphExec_t graph, int warmup, int reps,
                              timing_t *out)
{
    float *tot = (float *)calloc((size_t)reps, sizeof(float));
    float *part = (float *)calloc((size_t)reps * N_PARTS, sizeof(float));
    if (!tot || !part) {
        free(tot);
        free(part);
        return BT_ERR_NO_MEMORY;
    }
    bt_status_t rc = BT_OK;
    int parts_ok = 1;
    size_t xbytes = (size_t)c->T * HC * HID * 4;
    for (int it = 0; it < warmup + reps && rc == BT_OK; it++) {
        cudaError_t e = cudaMemcpyAsync(c->x, c->x0, xbytes, cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) {
            fprintf(stderr, "restore x: %s\n", cudaGetErrorString(e));
            rc = BT_ERR_DEVICE;
            break;
        }
        if (graph) {
            e = cudaEventRecord(ev[0], st);
            if (e == cudaSuccess) e = cudaGraphLaunch(graph, st);
            if (e == cudaSuccess) e = cudaEventRecord(ev[N_SEGS], st);
            if (e != cudaSuccess) {
                fprintf(stderr, "graph replay: %s\n", cudaGetErrorString(e));
                rc = BT_ERR_DEVICE;
                break;
            }
        } else {
            rc = layer_run(W, blas, c, st, ev, 0);
            if (rc != BT_OK) break;
        }
        e = cudaEventSynchronize(ev[N_SEGS]);
        if (e != cudaSuccess) {
            fprintf(stderr, "layer run: %s\n", cudaGetErrorString(e));
            rc = BT_ERR_DEVICE;
            break;
        }
        if (it < warmup) continue;
        int r = it - warmup;
        if (cudaEventElapsedTime(&tot[r], ev[0], ev[N_SEGS]) != cudaSuccess) {
            rc = BT_ERR_DEVICE;
            break;
        }
        for (int s = 0; s < N_SEGS && parts_ok; s++) {
            float ms;
            if (cudaEventElapsedTime(&ms, ev[s], ev[s + 1]) != cudaSuccess) {
                cudaGetLastError();
                parts_ok = 0; /* the graph's inner events could not be read: total only */
                break;
            }
            part[(size_t)seg_part[s] * reps + r] += ms;
        }
    }
    if (rc == BT_OK) {
        out->total_ms = median(tot, reps);
        out->parts_ok = parts_ok;
        for (int p = 0; p < N_PARTS; p++)
            out->part_ms[p] = parts_ok ? median(part + (size_t)p * reps, reps) : -1.0;
    }
    free(tot);
    free(part);
    return rc;
}

/* ---- the yardsticks: copy bandwidth, bf16 and FP8 tensor-core rates ---------------------- */

typedef struct {
    double bw;        /* bytes/s, a D2D copy counted as read + write */
    double bf16_rate; /* FLOP/s, cuBLASLt bf16 4096^3 */
    double fp8_rate;  /* FLOP/s, cuBLASLt e4m3 4096^3, 0 when not measured */
} device_rates_t;

static bt_status_t measure_copy(arena_t *a, cudaStream_t st, cudaEvent_t *ev, double *bw_p)
{
    size_t bytes = (size_t)1 << 31;
    void *src, *dst;
    DALLOC(a, src, bytes);
    DALLOC(a, dst, bytes);
    CU_TRY(cudaMemsetAsync(src, 1, bytes, st));
    float ms[10];
    for (int i = 0; i < 13; i++) {
        CU_TRY(cudaEventRecord(ev[0], st));
        CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
        CU_TRY(cudaEventRecord(ev[1], st));
        CU_TRY(cudaEventSynchronize(ev[1]));
        if (i >= 3) CU_TRY(cudaEventElapsedTime(&ms[i - 3], ev[0], ev[1]));
    }
    *bw_p = 2.0 * (double)bytes / (median(ms, 10) * 1e-3);
    return BT_OK;
}

static bt_status_t measure_bf16(arena_t *a, bt_cuda_blas_t *blas, cudaStream_t st, cudaEvent_t *ev,
                                double *rate_p)
{
    const int n = 4096;
    uint16_t *x, *w, *y;
    DALLOC(a, x, (size_t)n * n * 2);
    DALLOC(a, w, (size_t)n * n * 2);
    DALLOC(a, y, (size_t)n * n * 2);
    BT_TRY(gen(x, (size_t)n * n, 1, 7, 7, G_BF16, 0, 0.0f, st));
    BT_TRY(gen(w, (size_t)n * n, 1, 7, 8, G_BF16, 6, 0.0f, st));
    float ms[20];
    for (int i = 0; i < 23; i++) {
        CU_TRY(cudaEventRecord(ev[0], st));
        BT_TRY(bt_cuda_gemm_bf16(blas, y, BF16, x, w, n, n, n, st));
        CU_TRY(cudaEventRecord(ev[1], st));
        CU_TRY(cudaEventSynchronize(ev[1]));
        if (i >= 3) CU_TRY(cudaEventElapsedTime(&ms[i - 3], ev[0], ev[1]));
    }
    *rate_p = 2.0 * n * (double)n * n / (median(ms, 20) * 1e-3);
    return BT_OK;
}

#define LT_TRY(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "bench_layer_cuda.cu:%d: %s: cuBLAS status %d\n", __LINE__, #call,    \
                    (int)s_);                                                                      \
            rc = BT_ERR_UNSUPPORTED;                                                               \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* FP8 rate: cuBLASLt e4m3 x e4m3 -> bf16, 4096^3, per-tensor scales of 1, the TN layout Hopper
 * needs (same row-major trick as kernels/cuda/gemm.cu: y^T = w . x^T). The nearest thing on
 * this GPU to what a block-scaled FP8 GEMM could reach; not fatal when it is unavailable. */
static bt_status_t measure_fp8(arena_t *a, cudaStream_t st, cudaEvent_t *ev, double *rate_p)
{
    const int n = 4096;
    const size_t ws_bytes = 32u << 20;
    uint8_t *x, *w;
    uint16_t *y;
    void *ws;
    DALLOC(a, x, (size_t)n * n);
    DALLOC(a, w, (size_t)n * n);
    DALLOC(a, y, (size_t)n * n * 2);
    DALLOC(a, ws, ws_bytes);
    BT_TRY(gen(x, (size_t)n * n, 1, 7, 9, G_FP8, 0, 0.0f, st));
    BT_TRY(gen(w, (size_t)n * n, 1, 7, 10, G_FP8, 0, 0.0f, st));

    bt_status_t rc = BT_OK;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    float alpha = 1.0f, beta = 0.0f, ms[20];
    size_t wsz = ws_bytes;
    LT_TRY(cublasLtCreate(&lt));
    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n));
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &wsz, sizeof wsz));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found));
    if (!found) {
        fprintf(stderr, "fp8 rate: no cuBLASLt algorithm\n");
        rc = BT_ERR_UNSUPPORTED;
        goto out;
    }
    for (int i = 0; i < 23; i++) {
        if (cudaEventRecord(ev[0], st) != cudaSuccess) {
            rc = BT_ERR_DEVICE;
            goto out;
        }
        LT_TRY(cublasLtMatmul(lt, op, &alpha, w, la, x, lb, &beta, y, lc, y, lc, &res.algo, ws,
                              ws_bytes, st));
        if (cudaEventRecord(ev[1], st) != cudaSuccess || cudaEventSynchronize(ev[1]) != cudaSuccess ||
            (i >= 3 && cudaEventElapsedTime(&ms[i - 3], ev[0], ev[1]) != cudaSuccess)) {
            rc = BT_ERR_DEVICE;
            goto out;
        }
    }
    *rate_p = 2.0 * n * (double)n * n / (median(ms, 20) * 1e-3);
out:
    cudaGetLastError();
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    return rc;
}

/* ---- what must move and what must be computed ------------------------------------------- */

/* Per part: bytes (weights in their checkpoint formats with scales, each once; the caches in
 * the formats this layer keeps them: bf16 latents, f32 index keys; the streams X read and
 * written once; intermediates not counted, a fused implementation keeps them on chip) and
 * FLOPs, split into GEMMs on FP8/FP4 weights (which the FP8 tensor-core rate bounds: the
 * reference quantizes their activations to FP8) and the rest (bf16 rate). */
typedef struct {
    double bytes[N_PARTS], flops_lp[N_PARTS], flops_hp[N_PARTS];
} cost_t;

static double fp8_bytes(int N, int K) { return (double)N * K + (double)cdiv(N, 32) * cdiv(K, 32); }

static void case_cost(const case_t *c, cost_t *k)
{
    double T = c->T;
    memset(k, 0, sizeof *k);
    /* mHC: X in and out, two sites' fn/base/scale, the norm weights, pre in */
    k->bytes[P_MHC] = 2.0 * T * HC * HID * 4 + 2.0 * (MIXN * HC * HID + MIXN + 3) * 4 +
                      2.0 * HID * 4 + T * HC * 4;
    k->flops_hp[P_MHC] = 2 * (2.0 * T * MIXN * HC * HID + 3.0 * T * HC * HID) +
                         2.0 * T * HC * HID * (2.0 * HC + 2.0);
    /* projections: wq_a, wq_b, wkv, wo_a, wo_b; the new window rows written */
    double p = fp8_bytes(QL, HID) + fp8_bytes(NH * HD, QL) + fp8_bytes(HD, HID) +
               fp8_bytes(OG * OL, OGIN) + fp8_bytes(HID, OG * OL);
    k->bytes[P_APROJ] = p + (QL + HD) * 4.0 + T * HD * 2;
    k->flops_lp[P_APROJ] = 2.0 * T *
                           ((double)QL * HID + (double)NH * HD * QL + (double)HD * HID +
                            (double)OG * OL * OGIN + (double)HID * OG * OL);
    /* indexer: i_wq_b, weights_proj, every sequence's index keys; scores over visible keys */
    double vis = 0;
    for (int t = 0; t < c->T; t++) vis += (double)(c->n - c->tps + t % c->tps + 1);
    k->bytes[P_INDEX] = fp8_bytes(IH * ID, QL) + (double)IH * HID * 2 +
                        (double)c->seqs * c->n * ID * 4;
    k->flops_lp[P_INDEX] = 2.0 * T * IH * ID * QL;
    k->flops_hp[P_INDEX] = 2.0 * T * IH * HID + 2.0 * IH * ID * vis;
    /* core: the window rows and the selected entries (each distinct one once) */
    double sel_rows = (double)c->seqs * fmin((double)c->n, (double)c->tps * ITOPK);
    double win_rows = c->tps == 1 ? (double)c->seqs * WIN : (double)(WIN - 1 + c->T);
    k->bytes[P_CORE] = (win_rows + sel_rows) * HD * 2 + NH * 4.0;
    k->flops_hp[P_CORE] = 4.0 * T * NH * (WIN + ITOPK) * HD;
    /* routing: the bf16 router */
    k->bytes[P_ROUTE] = (double)NE * HID * 2 + NE * 4.0;
    k->flops_hp[P_ROUTE] = 2.0 * T * NE * HID;
    /* experts: the routed experts hit, FP4 + scales; the shared expert, FP8 */
    double per_exp = (double)2 * MI * HID / 2 + (double)2 * MI * (HID / 32) +
                     (double)HID * MI / 2 + (double)HID * (MI / 32);
    k->bytes[P_EXPERTS] = c->hit * per_exp + fp8_bytes(2 * MI, HID) + fp8_bytes(HID, MI);
    k->flops_lp[P_EXPERTS] = 2.0 * T * (TOPK + 1) * (2.0 * MI * HID + (double)HID * MI);
}

typedef struct {
    double ms, bf16_ms; /* the floor, and the floor if all FLOPs ran at the bf16 rate */
    const char *what;   /* "bandwidth" or "tensor cores" */
} floor_t;

static floor_t floor_of(double bytes, double flp, double fhp, const device_rates_t *r)
{
    floor_t f;
    double lp_rate = r->fp8_rate > 0 ? r->fp8_rate : r->bf16_rate;
    double tb = bytes / r->bw * 1e3, tc = (flp / lp_rate + fhp / r->bf16_rate) * 1e3;
    double tc16 = (flp + fhp) / r->bf16_rate * 1e3;
    f.ms = fmax(tb, tc);
    f.bf16_ms = fmax(tb, tc16);
    f.what = tb >= tc ? "bandwidth" : (r->fp8_rate > 0 ? "tensor cores fp8+bf16" : "tensor cores bf16");
    return f;
}

/* ---- one case --------------------------------------------------------------------------- */

typedef struct {
    int reps, warmup, graph;
    uint32_t seed;
    const char *dump, *trace;
} opts_t;

/* --trace DIR: the kernels of 7 replays of graph ge recorded by CUPTI, the median replay's
 * timeline appended to DIR/trace-CASE.md */
static void trace_graph(case_t *c, cudaStream_t st, cudaGraphExec_t ge, const opts_t *o,
                        const char *what)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace-%s.md", o->trace, c->name);
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "trace: %s: %s\n", path, strerror(errno));
        return;
    }
    const size_t xbytes = (size_t)c->T * HC * HID * 4;
    if (trace_begin()) {
        for (int i = 0; i < 7; i++) {
            if (cudaMemcpyAsync(c->x, c->x0, xbytes, cudaMemcpyDeviceToDevice, st) != cudaSuccess ||
                cudaGraphLaunch(ge, st) != cudaSuccess ||
                cudaStreamSynchronize(st) != cudaSuccess) {
                fprintf(stderr, "trace: replay: %s\n", cudaGetErrorString(cudaGetLastError()));
                break;
            }
        }
        char title[160];
        snprintf(title, sizeof title, "%s, %s", c->name, what);
        const double us = trace_end(f, title);
        if (us > 0)
            fprintf(stderr, "%s: traced %s (%.1f us a replay) into %s\n", c->name, what, us, path);
    }
    fclose(f);
}

static bt_status_t write_rows(const char *dir, const char *cname, const char *what,
                              const void *dev, size_t row_bytes, const int *rows, int nrows)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s_%s.bin", dir, cname, what);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return BT_ERR_IO;
    }
    void *buf = malloc(row_bytes);
    bt_status_t rc = buf ? BT_OK : BT_ERR_NO_MEMORY;
    for (int i = 0; i < nrows && rc == BT_OK; i++) {
        cudaError_t e = cudaMemcpy(buf, (const char *)dev + (size_t)rows[i] * row_bytes,
                                   row_bytes, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            fprintf(stderr, "dump %s: %s\n", what, cudaGetErrorString(e));
            rc = BT_ERR_DEVICE;
        } else if (fwrite(buf, 1, row_bytes, f) != row_bytes) {
            rc = BT_ERR_IO;
        }
    }
    free(buf);
    if (fclose(f) != 0 && rc == BT_OK) rc = BT_ERR_IO;
    return rc;
}

/* Rows of the outputs for layer_torch.py --compare: f32 (o_attn widened from bf16), routed
 * experts and selected entries int32 (sel indexes the concatenated caches). */
static bt_status_t dump_case(const case_t *c, const char *dir, const int *rows, int nrows)
{
    /* o_attn is bf16: widen into a scratch f32 copy through the host */
    size_t n = (size_t)nrows * HID;
    uint16_t *hb = (uint16_t *)malloc(n * 2);
    float *hf = (float *)malloc(n * 4);
    bt_status_t rc = hb && hf ? BT_OK : BT_ERR_NO_MEMORY;
    for (int i = 0; i < nrows && rc == BT_OK; i++)
        if (cudaMemcpy(hb + (size_t)i * HID, c->o_attn + (size_t)rows[i] * HID, HID * 2,
                       cudaMemcpyDeviceToHost) != cudaSuccess)
            rc = BT_ERR_DEVICE;
    if (rc == BT_OK) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)hb[i] << 16;
            memcpy(&hf[i], &u, 4);
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s_attn.bin", dir, c->name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(hf, 4, n, f) != n) rc = BT_ERR_IO;
        if (f && fclose(f) != 0) rc = BT_ERR_IO;
    }
    free(hb);
    free(hf);
    if (rc != BT_OK) {
        fprintf(stderr, "dump %s attn: %s\n", c->name, bt_status_str(rc));
        return rc;
    }
    BT_TRY(write_rows(dir, c->name, "moe", c->moe, HID * 4, rows, nrows));
    BT_TRY(write_rows(dir, c->name, "x", c->x, (size_t)HC * HID * 4, rows, nrows));
    BT_TRY(write_rows(dir, c->name, "idx", c->ridx, TOPK * 4, rows, nrows));
    BT_TRY(write_rows(dir, c->name, "sel", c->sel, ITOPK * 4, rows, nrows));
    BT_TRY(write_rows(dir, c->name, "pre_attn", c->pre_a, HC * 4, rows, nrows));
    BT_TRY(write_rows(dir, c->name, "post_ffn", c->post, HC * 4, rows, nrows));
    BT_TRY(write_rows(dir, c->name, "comb_ffn", c->comb, HC * HC * 4, rows, nrows));
    return BT_OK;
}

/* The median over reps (after 3 warm-ups) of launch(), timed by events on st; what names it
 * in an error */
template <typename F>
static bt_status_t time_launches(cudaStream_t st, cudaEvent_t *ev, int reps, const char *what,
                                 F launch, double *ms_p)
{
    float *v = (float *)calloc((size_t)reps, sizeof(float));
    if (!v) return BT_ERR_NO_MEMORY;
    bt_status_t rc = BT_OK;
    for (int i = 0; i < reps + 3 && rc == BT_OK; i++) {
        if (cudaEventRecord(ev[0], st) != cudaSuccess) rc = BT_ERR_DEVICE;
        if (rc == BT_OK) rc = launch();
        if (rc == BT_OK && (cudaEventRecord(ev[1], st) != cudaSuccess ||
                            cudaEventSynchronize(ev[1]) != cudaSuccess))
            rc = BT_ERR_DEVICE;
        if (rc == BT_OK && i >= 3 && cudaEventElapsedTime(&v[i - 3], ev[0], ev[1]) != cudaSuccess)
            rc = BT_ERR_DEVICE;
    }
    if (rc == BT_OK) *ms_p = median(v, reps);
    else
        fprintf(stderr, "%s timing failed: %s\n", what, bt_status_str(rc));
    free(v);
    return rc;
}

/* Empty-grid cost of the grouped GEMMs: the same launch with every expert empty. It tells how
 * much of the experts' time goes to blocks of experts no token picked. */
static bt_status_t time_empty_experts(const weights_t *W, case_t *c, cudaStream_t st,
                                      cudaEvent_t *ev, int reps, double *ms_p)
{
    return time_launches(
        st, ev, reps, "empty-grid",
        [&]() {
            BT_TRY(bt_cuda_gemm_fp4_grouped(c->gu, F32, c->xin, c->rows, c->offs_zero, NE,
                                            c->max_rows, W->w13, W->w13_s, 2 * MI, HID, st));
            return bt_cuda_gemm_fp4_grouped(c->y2, F32, c->h, NULL, c->offs_zero, NE, c->max_rows,
                                            W->w2, W->w2_s, HID, MI, st);
        },
        ms_p);
}

/* The routed experts' two FP4 GEMMs alone (w13, then w2 on the swiglu's rows as the layer
 * left them), as layer_run launches them: the figure the tensor-core rate target is read
 * against (the experts part also holds the swiglu, the shared expert and the combine; where
 * the layer takes w13 with its SwiGLU in one launch, that launch, the SwiGLU counted in). */
static bt_status_t time_routed_gemms(const weights_t *W, case_t *c, cudaStream_t st,
                                     cudaEvent_t *ev, int reps, double *ms_p)
{
    return time_launches(
        st, ev, reps, "routed-GEMM", [&]() { return routed_experts(W, c, st, false); }, ms_p);
}

/* The layer's dense products alone, as layer_run launches them (each FP8 one of many rows
 * with its dequantization, as it runs): the attention projections, the indexer's, the shared
 * expert and the router, on the buffers the layer left. *flops_p: their FLOPs. */
static bt_status_t time_dense_gemms(const weights_t *W, bt_cuda_blas_t *blas, case_t *c,
                                    cudaStream_t st, cudaEvent_t *ev, int reps, double *ms_p,
                                    double *flops_p)
{
    const int T = c->T;
    *flops_p = 2.0 * T *
               ((double)QL * HID + (double)NH * HD * QL + (double)HD * HID + (double)IH * ID * QL +
                (double)IH * HID + (double)OG * OL * OGIN + (double)HID * OG * OL + 2.0 * MI * HID +
                (double)HID * MI + (double)NE * HID);
    return time_launches(
        st, ev, reps, "dense-GEMM",
        [&]() {
            BT_TRY(fp8_mm(blas, c, c->qr, BF16, c->xin, W->wq_a.w, W->wq_a.s, T, QL, HID, st));
            BT_TRY(fp8_mm(blas, c, c->q, BF16, c->qr, W->wq_b.w, W->wq_b.s, T, NH * HD, QL, st));
            BT_TRY(fp8_mm(blas, c, c->kv, F32, c->xin, W->wkv.w, W->wkv.s, T, HD, HID, st));
            BT_TRY(fp8_mm(blas, c, c->qi, F32, c->qr, W->iwq_b.w, W->iwq_b.s, T, IH * ID, QL, st));
            BT_TRY(bt_cuda_gemm_bf16(blas, c->iw, F32, c->xin, W->wproj, T, IH, HID, st));
            if (!fp8_via_cublas(c, T)) {
                BT_TRY(bt_cuda_gemm_fp8_batched(c->oa, BF16, OG * OL, OL, c->attn, OG * OGIN, OGIN,
                                                W->wo_a.w, W->wo_a.s, OG, T, OL, OGIN, st));
            } else {
                for (int g = 0; g < OG; g++)
                    BT_TRY(
                        fp8_mm(blas, c, c->oa_g + (size_t)g * T * OL, BF16,
                               c->attn_g + (size_t)g * T * OGIN, W->wo_a.w + (size_t)g * OL * OGIN,
                               W->wo_a.s + (size_t)g * (OL / 32) * (OGIN / 32), T, OL, OGIN, st));
            }
            BT_TRY(
                fp8_mm(blas, c, c->o_attn, BF16, c->oa, W->wo_b.w, W->wo_b.s, T, HID, OG * OL, st));
            BT_TRY(fp8_mm(blas, c, c->sgu, F32, c->xin, W->sw13.w, W->sw13.s, T, 2 * MI, HID, st));
            BT_TRY(fp8_mm(blas, c, c->sy, F32, c->sh, W->sw2.w, W->sw2.s, T, HID, MI, st));
            return bt_cuda_gemm_bf16(blas, c->logits, F32, c->xin, W->gate_w, T, NE, HID, st);
        },
        ms_p);
}

/* The measurements of one case whose buffers exist: routing bound, output check and dump,
 * eager and graph timings, the empty-grid diagnostic, and the JSON line. */
/* One layer captured from st into *g and instantiated into *ge (each left for the caller to
 * destroy, NULL where not made); ev: the part events as record nodes, or NULL. */
static bt_status_t capture_layer(const weights_t *W, bt_cuda_blas_t *blas, case_t *c,
                                 cudaStream_t st, cudaEvent_t *ev, cudaGraph_t *g,
                                 cudaGraphExec_t *ge)
{
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        fprintf(stderr, "begin capture: %s\n", cudaGetErrorString(e));
        return BT_ERR_DEVICE;
    }
    bt_status_t lrc = layer_run(W, blas, c, st, ev, 1);
    e = cudaStreamEndCapture(st, g);
    if (e != cudaSuccess) fprintf(stderr, "end capture: %s\n", cudaGetErrorString(e));
    if (lrc != BT_OK) return lrc;
    if (e != cudaSuccess) return BT_ERR_DEVICE;
    if ((e = cudaGraphInstantiateWithFlags(
             ge, *g, g_prio ? cudaGraphInstantiateFlagUseNodePriority : 0)) != cudaSuccess) {
        fprintf(stderr, "graph instantiate: %s\n", cudaGetErrorString(e));
        return BT_ERR_DEVICE;
    }
    return BT_OK;
}

static bt_status_t case_measure(const weights_t *W, bt_cuda_blas_t *blas, case_t *c,
                                const device_rates_t *r, const opts_t *o, cudaStream_t st,
                                cudaEvent_t *ev)
{
    size_t xbytes = (size_t)c->T * HC * HID * 4;
    /* a first run with the safe bound (every token's rows could land on one expert), then the
     * routing's real largest group: routing is the same in every timed run (X is restored),
     * and a serving engine would read these 385 counts back before launching the experts */
    c->max_rows = c->T;
    CU_TRY(cudaMemcpyAsync(c->x, c->x0, xbytes, cudaMemcpyDeviceToDevice, st));
    BT_TRY(layer_run(W, blas, c, st, NULL, 0));
    CU_TRY(cudaStreamSynchronize(st));
    int32_t offs[NE + 1];
    CU_TRY(cudaMemcpy(offs, c->offs, sizeof offs, cudaMemcpyDeviceToHost));
    int mx = 0, hit = 0;
    for (int e = 0; e < NE; e++) {
        int n = offs[e + 1] - offs[e];
        if (n > mx) mx = n;
        hit += n > 0;
    }
    if (offs[NE] != c->T * TOPK || mx > c->T) {
        fprintf(stderr, "%s: the grouping placed %d rows (largest group %d), expected %d\n",
                c->name, offs[NE], mx, c->T * TOPK);
        return BT_ERR_INTERNAL;
    }
    c->max_rows = mx;
    c->hit = hit;
    {
        int32_t list[NE];
        int k = 0;
        for (int e = 0; e < NE; e++)
            if (offs[e + 1] > offs[e]) list[k++] = e;
        if (!c->elist) CU_TRY(cudaMalloc((void **)&c->elist, sizeof list));
        CU_TRY(cudaMemcpy(c->elist, list, (size_t)k * sizeof(int32_t), cudaMemcpyHostToDevice));
        c->n_elist = k;
    }

    /* the output of one run from the restored X with that bound: finite, dumped on request */
    CU_TRY(cudaMemcpyAsync(c->x, c->x0, xbytes, cudaMemcpyDeviceToDevice, st));
    c->keep_moe = 1;
    bt_status_t out_rc = layer_run(W, blas, c, st, NULL, 0);
    c->keep_moe = 0;
    BT_TRY(out_rc);
    CU_TRY(cudaStreamSynchronize(st));
    int rows[16], nrows = 0;
    if (c->T <= 16) {
        for (int t = 0; t < c->T; t++) rows[nrows++] = t;
    } else {
        for (int t = 0; t < 4; t++) rows[nrows++] = t;
        rows[nrows++] = c->T / 2;
        for (int t = c->T - 3; t < c->T; t++) rows[nrows++] = t;
    }
    int finite = 1;
    float *hx = (float *)malloc((size_t)HC * HID * 4);
    if (!hx) return BT_ERR_NO_MEMORY;
    for (int i = 0; i < nrows; i++) {
        cudaError_t e = cudaMemcpy(hx, c->x + (size_t)rows[i] * HC * HID, (size_t)HC * HID * 4,
                                   cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            free(hx);
            CU_TRY(e);
        }
        for (int j = 0; j < HC * HID; j++) finite &= isfinite(hx[j]) ? 1 : 0;
    }
    free(hx);
    if (o->dump) BT_TRY(dump_case(c, o->dump, rows, nrows));

    timing_t eager, graphed;
    memset(&graphed, 0, sizeof graphed);
    graphed.total_ms = -1;
    BT_TRY(time_layer(W, blas, c, st, ev, NULL, o->warmup, o->reps, &eager));

    if (o->graph) {
        /* the same launches captured once: the GPU time without the host's launch gaps; the
         * part events become event-record nodes of the graph */
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        bt_status_t crc = capture_layer(W, blas, c, st, ev, &g, &ge);
        if (crc == BT_OK) crc = time_layer(W, blas, c, st, ev, ge, o->warmup, o->reps, &graphed);
        if (crc == BT_OK && o->trace) trace_graph(c, st, ge, o, "graph, one stream");
        if (crc != BT_OK) {
            fprintf(stderr, "%s: CUDA graph capture/replay failed (%s); eager times only\n",
                    c->name, bt_status_str(crc));
            cudaGetLastError();
            graphed.total_ms = -1;
            graphed.parts_ok = 0;
        }
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        CU_TRY(cudaStreamSynchronize(st));
    }
    /* the same layer with its independent chains on two streams (decode: few rows), captured
     * as a graph of branches; its output compared bit for bit with the one-stream run's */
    double streams_ms = -1;
    int streams_same = -1;
    if (o->graph && g_side_stream && !fp8_via_cublas(c, c->T)) {
        const size_t n = (size_t)c->T * HC * HID;
        float *one = (float *)malloc(n * 4), *two = (float *)malloc(n * 4);
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        bt_status_t crc = one && two ? BT_OK : BT_ERR_NO_MEMORY;
        if (crc == BT_OK) {
            cudaMemcpyAsync(c->x, c->x0, xbytes, cudaMemcpyDeviceToDevice, st);
            crc = layer_run(W, blas, c, st, NULL, 0);
            if (crc == BT_OK &&
                (cudaStreamSynchronize(st) != cudaSuccess ||
                 cudaMemcpy(one, c->x, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess))
                crc = BT_ERR_DEVICE;
        }
        if (crc == BT_OK) {
            /* (timed from an event recorded before the launch; from an event-record node at the
             * graph's start, as the one-stream graph is, it measured the same: decode b1 0.1845
             * against 0.1835 ms, b16 0.8093 against 0.8058, session 37, an H100) */
            g_side = g_side_stream;
            crc = capture_layer(W, blas, c, st, NULL, &g, &ge);
            g_side = NULL;
        }
        if (crc == BT_OK) {
            cudaMemcpyAsync(c->x, c->x0, xbytes, cudaMemcpyDeviceToDevice, st);
            if (cudaGraphLaunch(ge, st) != cudaSuccess ||
                cudaStreamSynchronize(st) != cudaSuccess ||
                cudaMemcpy(two, c->x, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
                crc = BT_ERR_DEVICE;
            else
                streams_same = memcmp(one, two, n * 4) == 0;
        }
        timing_t t2;
        if (crc == BT_OK) crc = time_layer(W, blas, c, st, ev, ge, o->warmup, o->reps, &t2);
        if (crc == BT_OK && o->trace) trace_graph(c, st, ge, o, "graph, two streams");
        if (crc == BT_OK)
            streams_ms = t2.total_ms;
        else {
            fprintf(stderr, "%s: the two-stream graph failed (%s)\n", c->name, bt_status_str(crc));
            cudaGetLastError();
        }
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        free(one);
        free(two);
        CU_TRY(cudaStreamSynchronize(st));
    }
    double empty_ms = -1, routed_ms = -1, dense_ms = -1, dense_flops = 0;
    time_empty_experts(W, c, st, ev, o->reps, &empty_ms);
    time_routed_gemms(W, c, st, ev, o->reps, &routed_ms);
    time_dense_gemms(W, blas, c, st, ev, o->reps, &dense_ms, &dense_flops);
    const double dense_of_bf16 = dense_ms > 0 ? dense_flops / (dense_ms * 1e-3) / r->bf16_rate : -1;
    /* their FLOPs: every routed row through w13 ([2 MI, HID]) and w2 ([HID, MI]) */
    const double routed_flops = 2.0 * c->T * TOPK * (2.0 * MI * HID + (double)HID * MI);
    const double routed_of_bf16 =
        routed_ms > 0 ? routed_flops / (routed_ms * 1e-3) / r->bf16_rate : -1;

    cost_t k;
    case_cost(c, &k);
    double tb = 0, tlp = 0, thp = 0;
    for (int p = 0; p < N_PARTS; p++) {
        tb += k.bytes[p];
        tlp += k.flops_lp[p];
        thp += k.flops_hp[p];
    }
    floor_t fl = floor_of(tb, tlp, thp, r);

    printf("{\"case\":\"%s\",\"side\":\"ours\",\"T\":%d,\"seqs\":%d,\"entries\":%d,"
           "\"experts_hit\":%d,\"max_rows\":%d,\"finite\":%s,\"ms\":%.4f,\"graph_ms\":%.4f,"
           "\"floor_ms\":%.6f,\"floor_what\":\"%s\",\"floor_bf16_ms\":%.6f,\"bytes\":%.0f,"
           "\"flops\":%.0f,\"flops_lowp\":%.0f,\"empty_expert_grid_ms\":%.4f,"
           "\"graph_streams_ms\":%.4f,\"streams_same\":%s,\"routed_gemms_ms\":%.4f,"
           "\"routed_gemms_flops\":%.0f,\"routed_gemms_of_bf16_rate\":%.4f,"
           "\"dense_gemms_ms\":%.4f,\"dense_gemms_flops\":%.0f,"
           "\"dense_gemms_of_bf16_rate\":%.4f,\"parts\":{",
           c->name, c->T, c->seqs, c->n, c->hit, c->max_rows, finite ? "true" : "false",
           eager.total_ms, graphed.total_ms, fl.ms, fl.what, fl.bf16_ms, tb, tlp + thp, tlp,
           empty_ms, streams_ms,
           streams_same < 0 ? "null"
           : streams_same   ? "true"
                            : "false",
           routed_ms, routed_flops, routed_of_bf16, dense_ms, dense_flops, dense_of_bf16);
    for (int p = 0; p < N_PARTS; p++) {
        floor_t pf = floor_of(k.bytes[p], k.flops_lp[p], k.flops_hp[p], r);
        printf("%s\"%s\":{\"ms\":%.4f,\"graph_ms\":%.4f,\"floor_ms\":%.6f,"
               "\"floor_what\":\"%s\",\"bytes\":%.0f,\"flops\":%.0f}",
               p ? "," : "", part_names[p], eager.part_ms[p],
               graphed.parts_ok ? graphed.part_ms[p] : -1.0, pf.ms, pf.what, k.bytes[p],
               k.flops_lp[p] + k.flops_hp[p]);
    }
    printf("}}\n");
    fflush(stdout);
    double best = graphed.total_ms > 0 ? graphed.total_ms : eager.total_ms;
    if (streams_ms > 0 && streams_ms < best) best = streams_ms;
    fprintf(stderr,
            "%-10s T=%-5d ours %.3f ms (graph %.3f, two streams %.3f%s), floor %.3f ms (%s; "
            "bf16-only %.3f), %.2fx floor; %d experts hit, largest group %d; output %s\n",
            c->name, c->T, eager.total_ms, graphed.total_ms, streams_ms,
            streams_same == 0 ? " OTHER OUTPUT" : "", fl.ms, fl.what, fl.bf16_ms, best / fl.ms,
            c->hit, c->max_rows, finite ? "finite" : "NOT FINITE");
    if (routed_ms > 0 && dense_ms > 0)
        fprintf(stderr,
                "%-10s GEMMs alone: routed experts (FP4) %.3f ms, %.0f TFLOP/s, %.0f%% of the bf16 "
                "rate; dense (FP8, bf16) %.3f ms, %.0f TFLOP/s, %.0f%%\n",
                c->name, routed_ms, routed_flops / (routed_ms * 1e9), 100.0 * routed_of_bf16,
                dense_ms, dense_flops / (dense_ms * 1e9), 100.0 * dense_of_bf16);
    return finite && streams_same != 0 ? BT_OK : BT_ERR_INTERNAL;
}

static bt_status_t run_case(const weights_t *W, bt_cuda_blas_t *blas, case_t *c,
                            const device_rates_t *r, const opts_t *o, cudaStream_t st,
                            cudaEvent_t *ev)
{
    arena_t a = {};
    bt_status_t rc = case_make(&a, c, o->seed, st);
    if (rc == BT_OK) rc = case_measure(W, blas, c, r, o, st, ev);
    cudaStreamSynchronize(st);
    cudaGetLastError();
    arena_free(&a);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------- */

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--cases decode_b1,decode_b16,prefill] [--reps N>=20] [--warmup N]\n"
            "          [--seed N] [--entries N] [--prefill T] [--dump DIR] [--no-graph]\n"
            "          [--cuda-cores] [--trace DIR]\n"
            "environment: BT_BENCH_EARLY_FORK=0|1|2, BT_BENCH_MIX_STREAM=0|1, "
            "BT_BENCH_SHARED_AT=0|1|2, BT_BENCH_PRIO=0..5, BT_BENCH_KV_MIX=0|1, "
            "BT_BENCH_QB_AFTER=0|1|2, "
            "BT_BENCH_IW_SCALE_MAIN=0|1, BT_BENCH_FUSE=0..4\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {30, 5, 1, 1, NULL, NULL};
    const char *cases = "decode_b1,decode_b16,prefill";
    int entries = 8192, prefill = 4096;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-graph")) {
            o.graph = 0;
            continue;
        }
        if (!strcmp(a, "--cuda-cores")) {
            g_tensor_cores = 0;
            continue;
        }
        if (!v) return usage(argv[0]);
        if (!strcmp(a, "--cases")) cases = v;
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
        else if (!strcmp(a, "--seed")) o.seed = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--entries")) entries = atoi(v);
        else if (!strcmp(a, "--prefill")) prefill = atoi(v);
        else if (!strcmp(a, "--dump")) o.dump = v;
        else if (!strcmp(a, "--trace"))
            o.trace = v;
        else return usage(argv[0]);
        i++;
    }
    if (getenv("BT_BENCH_EARLY_FORK")) g_early = atoi(getenv("BT_BENCH_EARLY_FORK"));
    if (getenv("BT_BENCH_MIX_STREAM")) g_mix = atoi(getenv("BT_BENCH_MIX_STREAM"));
    if (getenv("BT_BENCH_SHARED_AT")) g_shared_at = atoi(getenv("BT_BENCH_SHARED_AT"));
    if (getenv("BT_BENCH_PRIO")) g_prio = atoi(getenv("BT_BENCH_PRIO"));
    if (getenv("BT_BENCH_KV_MIX")) g_kv_mix = atoi(getenv("BT_BENCH_KV_MIX"));
    if (getenv("BT_BENCH_QB_AFTER")) g_qb_after = atoi(getenv("BT_BENCH_QB_AFTER"));
    if (getenv("BT_BENCH_IW_SCALE_MAIN")) g_iw_scale_main = atoi(getenv("BT_BENCH_IW_SCALE_MAIN"));
    if (getenv("BT_BENCH_FUSE")) g_fuse = atoi(getenv("BT_BENCH_FUSE"));
    /* a prefill chunk sits at the end of the cached entries, and the top-k must be full */
    if (o.reps < 20 || o.warmup < 1 || entries < ITOPK || prefill < 1 || prefill > entries ||
        prefill + WIN > (1 << 30)) {
        fprintf(stderr, "need --reps >= 20, --warmup >= 1, --entries >= %d, "
                        "1 <= --prefill <= --entries\n", ITOPK);
        return 2;
    }
    if (g_prio < 0 || g_prio > 5 || g_kv_mix < 0 || g_kv_mix > 1 || g_qb_after < 0 ||
        g_qb_after > 2 || g_iw_scale_main < 0 || g_iw_scale_main > 1 || g_fuse < 0 || g_fuse > 4) {
        fprintf(stderr, "need BT_BENCH_PRIO 0..5, BT_BENCH_KV_MIX 0|1, BT_BENCH_QB_AFTER 0..2, "
                        "BT_BENCH_IW_SCALE_MAIN 0|1, BT_BENCH_FUSE 0..4\n");
        return 2;
    }
    for (const char *d : {o.dump, o.trace})
        if (d && mkdir(d, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "%s: %s\n", d, strerror(errno));
            return 2;
        }

    int rc = 1;
    arena_t a = {};
    bt_cuda_blas_t *blas = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t ev[N_SEGS + 1];
    int nev = 0;
    weights_t W;
    device_rates_t rates = {0, 0, 0};
    cudaDeviceProp prop;
    char *list = NULL;

    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    {
        /* (greatest: the numerically lowest; least, 0, the default) */
        int least = 0, greatest = 0;
        if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) goto out;
        const int hi_main = g_prio == 1 || g_prio >= 4, hi_side = g_prio == 2;
        const int hi_mix = hi_main || g_prio == 3;
        if (cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, hi_main ? greatest : least) !=
                cudaSuccess ||
            cudaStreamCreateWithPriority(&g_side_stream, cudaStreamNonBlocking,
                                         hi_side ? greatest : least) != cudaSuccess ||
            cudaStreamCreateWithPriority(&g_mix_stream, cudaStreamNonBlocking,
                                         hi_mix ? greatest : least) != cudaSuccess ||
            cudaStreamCreateWithPriority(&g_side_hi, cudaStreamNonBlocking, greatest) !=
                cudaSuccess)
            goto out;
    }
    for (int i = 0; i < 2; i++)
        if (cudaEventCreateWithFlags(&g_fork[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_mix_fork[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_mix_join[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_join[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_edge[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_kv_ev[i], cudaEventDisableTiming) != cudaSuccess)
            goto out;
    for (; nev < N_SEGS + 1; nev++)
        if (cudaEventCreate(&ev[nev]) != cudaSuccess) goto out;
    if (bt_cuda_blas_create(&blas) != BT_OK) goto out;

    {
        /* the yardsticks, each in its own arena so their buffers are gone before the layer */
        arena_t m = {};
        bt_status_t s = measure_copy(&m, st, ev, &rates.bw);
        if (s == BT_OK) s = measure_bf16(&m, blas, st, ev, &rates.bf16_rate);
        if (s == BT_OK && measure_fp8(&m, st, ev, &rates.fp8_rate) != BT_OK) rates.fp8_rate = 0;
        cudaStreamSynchronize(st);
        arena_free(&m);
        if (s != BT_OK) {
            fprintf(stderr, "measuring the device's rates failed\n");
            goto out;
        }
    }
    printf("{\"device\":\"%s\",\"sms\":%d,\"copy_GBps\":%.1f,\"bf16_TFLOPs\":%.1f,"
           "\"fp8_TFLOPs\":%.1f,\"seed\":%u,\"reps\":%d,\"warmup\":%d}\n",
           prop.name, prop.multiProcessorCount, rates.bw / 1e9, rates.bf16_rate / 1e12,
           rates.fp8_rate / 1e12, o.seed, o.reps, o.warmup);
    fflush(stdout);
    fprintf(stderr,
            "%s, %d SMs: D2D copy %.0f GB/s (read + write), cuBLASLt bf16 4096^3 %.0f TFLOP/s, "
            "fp8 e4m3 4096^3 %.0f TFLOP/s\n",
            prop.name, prop.multiProcessorCount, rates.bw / 1e9, rates.bf16_rate / 1e12,
            rates.fp8_rate / 1e12);

    if (weights_make(&a, &W, o.seed, st) != BT_OK) goto out;
    if (cudaStreamSynchronize(st) != cudaSuccess) {
        fprintf(stderr, "weights: %s\n", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
    fprintf(stderr, "weights: %.2f GiB on the device\n", a.total / 1073741824.0);

    list = strdup(cases);
    if (!list) goto out;
    rc = 0;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        case_t c;
        memset(&c, 0, sizeof c);
        c.n = entries;
        if (!strcmp(name, "decode_b1") || !strcmp(name, "decode_b16")) {
            c.seqs = c.T = name[8] == '1' && name[9] == '6' ? 16 : 1;
            c.tps = 1;
            c.win_rows = (size_t)c.seqs * WIN;
        } else if (!strcmp(name, "prefill")) {
            c.seqs = 1;
            c.T = c.tps = prefill;
            c.win_rows = (size_t)WIN + prefill;
        } else {
            fprintf(stderr, "unknown case %s (decode_b1, decode_b16, prefill)\n", name);
            rc = 2;
            break;
        }
        c.name = name;
        if (run_case(&W, blas, &c, &rates, &o, st, ev) != BT_OK) {
            fprintf(stderr, "case %s failed\n", name);
            rc = 1;
        }
    }
out:
    if (rc == 1 && !list) fprintf(stderr, "setup failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    free(list);
    arena_free(&a);
    bt_cuda_blas_destroy(blas);
    for (int i = 0; i < nev; i++) cudaEventDestroy(ev[i]);
    for (int i = 0; i < 2; i++) {
        if (g_fork[i]) cudaEventDestroy(g_fork[i]);
        if (g_join[i]) cudaEventDestroy(g_join[i]);
        if (g_edge[i]) cudaEventDestroy(g_edge[i]);
        if (g_kv_ev[i]) cudaEventDestroy(g_kv_ev[i]);
        if (g_mix_fork[i]) cudaEventDestroy(g_mix_fork[i]);
        if (g_mix_join[i]) cudaEventDestroy(g_mix_join[i]);
    }
    if (g_side_stream) cudaStreamDestroy(g_side_stream);
    if (g_mix_stream) cudaStreamDestroy(g_mix_stream);
    if (g_side_hi) cudaStreamDestroy(g_side_hi);
    if (st) cudaStreamDestroy(st);
    return rc;
}

/* CUDA operators of DeepSeek-V4.1-Flash: the per-token steps of services/engine/model.c on
 * the GPU. C-callable; every pointer is device memory unless a comment says otherwise, every
 * launcher is asynchronous on `stream`, checks shapes and dtypes (BT_ERR_INVALID_ARG, nothing
 * launched) and reports a launch failure as BT_ERR_DEVICE (the sticky error cleared).
 *
 *   bt_cuda_blas_t *blas;
 *   bt_cuda_blas_create(&blas);
 *   bt_cuda_gemm_bf16(blas, y, BT_CUDA_F32, x, w, M, N, K, stream);  // y = x . w^T
 *   bt_cuda_gemm_fp8(y, BT_CUDA_BF16, x, w8, w8_scale, M, N, K, stream);
 *   bt_cuda_blas_destroy(blas);
 *
 * Matrices are row-major. bf16 is passed as its raw 16 bits (uint16_t). Weights keep the
 * checkpoint's formats: FP8 e4m3 with one UE8M0 scale per 32x32 block, FP4 e2m1 packed two a
 * byte with one UE8M0 scale per 32 along K, its bytes in the fragment order
 * bt_cuda_fp4_to_frag makes of a checkpoint's (kernels/cuda/lowp_bits.h).
 *
 * Kernels are launched to start before the kernel ahead of them on the stream ends
 * (kernels/cuda/common.cuh): each waits for it before reading activations, but the few-row
 * products (bt_cuda_gemm_fp8, _fp8_batched, and bt_cuda_gemm_bf16 for up to 16 rows) load
 * their first weights before that wait. A weight must therefore not be written by a kernel
 * still ahead on the stream (e.g. bt_cuda_dequant_fp8's output multiplied by few rows right
 * after); an upload, or any wait for the stream in between, will do. */
#ifndef BT_KERNELS_CUDA_CUDA_OPS_H
#define BT_KERNELS_CUDA_CUDA_OPS_H

#include "common/status.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { BT_CUDA_F32 = 0, BT_CUDA_BF16 = 1 } bt_cuda_dtype_t;

/* ---- GEMM ------------------------------------------------------------------------------- */

/* cuBLASLt handle plus its workspace; owned by the caller. destroy(NULL) is a no-op. */
typedef struct bt_cuda_blas bt_cuda_blas_t;
bt_status_t bt_cuda_blas_create(bt_cuda_blas_t **blas_p);
void bt_cuda_blas_destroy(bt_cuda_blas_t *blas);

/* y[M,N] (f32 or bf16) = x[M,K] bf16 . w[N,K]^T bf16, fp32 accumulation (cuBLASLt). */
bt_status_t bt_cuda_gemm_bf16(bt_cuda_blas_t *blas, void *y, bt_cuda_dtype_t y_dtype,
                              const uint16_t *x, const uint16_t *w, int M, int N, int K,
                              cudaStream_t stream);

/* y[M,N] = x[M,K] . w[N,K]^T in f32 (fp32 FMAs, no TF32), rows of x and y ldx / ldy apart
 * (a column slice of a wider matrix). */
bt_status_t bt_cuda_gemm_f32(bt_cuda_blas_t *blas, float *y, int ldy, const float *x, int ldx,
                             const float *w, int M, int N, int K, cudaStream_t stream);

/* y[M,N] = x[M,K] bf16 . dequant(w)^T, w FP8 e4m3 [N,K] with UE8M0 scales
 * [ceil(N/32), ceil(K/32)]; the tiles are dequantized in shared memory (exactly, into bf16)
 * and multiplied on the tensor cores, fp32 accumulation. */
bt_status_t bt_cuda_gemm_fp8(void *y, bt_cuda_dtype_t y_dtype, const uint16_t *x,
                             const uint8_t *w, const uint8_t *w_scale, int M, int N, int K,
                             cudaStream_t stream);

/* A batch of such products in one launch (strided, as cuBLAS's strided batched GEMMs):
 * y_b = x_b . dequant(w_b)^T for b < batch, row m of x_b at x + b * x_stride + m * ldx, of y_b
 * at y + b * y_stride + m * ldy (elements); w [batch][N][K], scales
 * [batch][ceil(N/32)][ceil(K/32)]. x 16-byte aligned, ldx and x_stride multiples of 8. For
 * the grouped low-rank output projection: one launch for its groups, reading the heads where
 * they lie and writing each group's columns in place. */
bt_status_t bt_cuda_gemm_fp8_batched(void *y, bt_cuda_dtype_t y_dtype, int ldy,
                                     long long y_stride, const uint16_t *x, int ldx,
                                     long long x_stride, const uint8_t *w, const uint8_t *w_scale,
                                     int batch, int M, int N, int K, cudaStream_t stream);

/* w_bf16[N,K] = dequant(w) (FP8 e4m3 [N,K], UE8M0 scales [ceil(N/32), ceil(K/32)]), exact.
 * For many rows (prefill), dequantizing a weight once and running cuBLASLt's bf16 GEMM beats
 * bt_cuda_gemm_fp8's tiles: the weight is read three more times, the rows thousands. */
bt_status_t bt_cuda_dequant_fp8(uint16_t *w_bf16, const uint8_t *w, const uint8_t *w_scale, int N,
                                int K, cudaStream_t stream);

/* Packed FP4 weights (e2m1, two a byte, low nibble first: a checkpoint's order) into the
 * fragment order the FP4 GEMMs read (kernels/cuda/lowp_bits.h: each run of 32 codes, 16 bytes,
 * rearranged so that a lane's bf16 pairs come from one word), in place. bytes: a multiple of
 * 16, every weight row's K a multiple of 32 (then no run crosses a row); w 16-byte aligned.
 * Once per tensor, after it is on the device. */
bt_status_t bt_cuda_fp4_to_frag(uint8_t *w, size_t bytes, cudaStream_t stream);

/* Grouped FP4 GEMM over experts. Rows are grouped by expert: expert e owns rows
 * offs[e] .. offs[e+1]-1 (offs: n_experts+1 int32, device). Row r reads input row
 * rows ? rows[r] : r of x[*,K] (bf16) and writes y[r, 0..N). Expert weights w[e] are
 * [N, K/2] bytes of e2m1 codes in fragment order (bt_cuda_fp4_to_frag; w 16-byte aligned: its
 * runs are read whole) with UE8M0 scales [N, K/32]. max_rows bounds any expert's row count
 * (host side; the total row count will do). K must be a multiple of 32. */
bt_status_t bt_cuda_gemm_fp4_grouped(void *y, bt_cuda_dtype_t y_dtype, const uint16_t *x,
                                     const int32_t *rows, const int32_t *offs, int n_experts,
                                     int max_rows, const uint8_t *w, const uint8_t *w_scale,
                                     int N, int K, cudaStream_t stream);

/* The same over the listed experts only (experts: n_listed ids, device; an id < 0 is skipped,
 * so a list padded by bt_cuda_moe_group works with n_listed its slot count): blocks for
 * experts without rows cost about as much as a decode step's real work (384 experts, 6 hit).
 * Rows of unlisted experts are left unwritten. */
bt_status_t bt_cuda_gemm_fp4_grouped_list(void *y, bt_cuda_dtype_t y_dtype, const uint16_t *x,
                                          const int32_t *rows, const int32_t *offs,
                                          const int32_t *experts, int n_listed, int max_rows,
                                          const uint8_t *w, const uint8_t *w_scale, int N, int K,
                                          cudaStream_t stream);

/* The listed experts' w13 product and their SwiGLU in one launch: h [rows, I] = what
 * bt_cuda_gemm_fp4_grouped_list (N = 2I, gate columns then up) and then bt_cuda_swiglu (wt,
 * limit) give, bit for bit, without the [rows, 2I] sums. For the shapes
 * bt_cuda_gemm_fp4_swiglu_fits takes: a decode step's (max_rows <= 16, I a multiple of 32, K of
 * 128 with the few-row kernel's whole block on each column tile) and, unless
 * BT_CUDA_WGRS_SWIGLU=0, a prefill's on Hopper (more rows, K a multiple of 128; w_scale 4-byte
 * aligned); BT_CUDA_SWIGLU_FUSED=0: none. x and w 16-byte aligned. */
int bt_cuda_gemm_fp4_swiglu_fits(int I, int K, int max_rows);
bt_status_t bt_cuda_gemm_fp4_swiglu_list(void *h, bt_cuda_dtype_t h_dtype, const uint16_t *x,
                                         const int32_t *rows, const int32_t *offs,
                                         const int32_t *experts, int n_listed, int max_rows,
                                         const uint8_t *w, const uint8_t *w_scale, int I, int K,
                                         const float *wt, float limit, cudaStream_t stream);

/* ---- elementwise and per-row ------------------------------------------------------------ */

/* y[rows,n] = w * (x * rsqrt(mean(x^2) + eps)); w (f32 [n]) may be NULL; y may alias x. */
bt_status_t bt_cuda_rmsnorm(void *y, bt_cuda_dtype_t y_dtype, const void *x,
                            bt_cuda_dtype_t x_dtype, const float *w, int rows, int n, float eps,
                            cudaStream_t stream);

/* In place on x[rows, heads, dim]: interleaved-pair rotation of the last 2*half channels of
 * each head by pos[row] * inv_freq[i] (inv_freq: f32 [half]); inverse rotates back. */
bt_status_t bt_cuda_rope(void *x, bt_cuda_dtype_t dtype, int rows, int heads, int dim,
                         const int64_t *pos, const float *inv_freq, int half, int inverse,
                         cudaStream_t stream);

/* The QAT roundings of kernels/cpu/quant.h, in place on f32 x[rows, n], bit-exact with the
 * CPU (n not a multiple of block: left untouched, as there). */
typedef enum {
    BT_CUDA_FQ_FP8_UE8M0 = 0, /* window KV */
    BT_CUDA_FQ_FP4_UE8M0 = 1, /* indexer q/k */
    BT_CUDA_FQ_FP4_E4M3 = 2,  /* compressed KV */
} bt_cuda_fake_quant_t;
bt_status_t bt_cuda_fake_quant(float *x, int rows, int n, int block, bt_cuda_fake_quant_t kind,
                               cudaStream_t stream);

/* The reference deployment's activation quantization (MODEL-DS41.md): y[rows, K] (dense) = the
 * rows of x (ldx apart) with each 32 values rounded to FP8 e4m3 on a UE8M0 scale and back, as
 * bt_fake_quant_fp8_ue8m0 (bit-exact with it on the values as read; in bf16 the results are
 * exact). K % 32 == 0. y may be x (same dtype, ldx == K). */
bt_status_t bt_cuda_act_quant(void *y, bt_cuda_dtype_t y_dtype, const void *x,
                              bt_cuda_dtype_t x_dtype, int rows, int K, int ldx,
                              cudaStream_t stream);

/* In place on f32 x[rows, heads, dim], per head vector, each step optional: RMSNorm with
 * weight norm_w when norm != 0 (norm_w may be NULL; a norm needs heads == 1), RoPE as bt_cuda_rope
 * (pos NULL: none), the fake-quantizer as bt_cuda_fake_quant in blocks of fq_block (0: none).
 * Bit for bit the same as those launches in that order; one launch. dim <= 4096. */
bt_status_t bt_cuda_head_finish(float *x, int rows, int heads, int dim, int norm,
                                const float *norm_w, float eps, const int64_t *pos,
                                const float *inv_freq, int half, int fq_block,
                                bt_cuda_fake_quant_t fq_kind, cudaStream_t stream);

/* bt_cuda_gemm_fp8 (y f32 [M, N], unstrided) and then bt_cuda_head_finish(y, M, N / dim, dim,
 * no norm, pos, inv_freq, half, rounding blocks of 32 of fq_kind) in one launch, bit for bit
 * the two launches' values: the indexer's queries at a decode step. For the shapes
 * bt_cuda_gemm_fp8_qfinish_fits takes (M <= 8, dim a multiple of 32 dividing N, K a multiple
 * of 64, the few-row kernel unsplit; BT_CUDA_QFINISH=0: none); x and w 16-byte aligned; pos
 * NULL: no RoPE. */
int bt_cuda_gemm_fp8_qfinish_fits(int M, int N, int K, int dim);
bt_status_t bt_cuda_gemm_fp8_qfinish(float *y, const uint16_t *x, const uint8_t *w,
                                     const uint8_t *w_scale, int M, int N, int K, int dim,
                                     const int64_t *pos, const float *inv_freq, int half,
                                     bt_cuda_fake_quant_t fq_kind, cudaStream_t stream);

/* ---- mHC -------------------------------------------------------------------------------- */

/* One mHC mapping per token from the streams x[T, hc*D] (f32): fn [(2+hc)*hc, hc*D],
 * base [(2+hc)*hc], scale [3] -> pre [T,hc], post [T,hc], comb [T,hc,hc] (Sinkhorn with
 * `iters` iterations). hc in {1, 2, 4}. */
bt_status_t bt_cuda_hc_mix(float *pre, float *post, float *comb, const float *x, const float *fn,
                           const float *base, const float *scale, int T, int hc, int D,
                           float eps, float hc_eps, int iters, cudaStream_t stream);

/* The same with a workspace: for few tokens (decode) the streams are split over blocks and
 * the partial sums folded in a second kernel (one block per token reads the whole fn, 2 MB at
 * the real widths, at one SM's bandwidth). work: bt_cuda_hc_mix_ws_floats(T, hc, D) floats
 * (0 when T needs no split; NULL or too few: no split). */
size_t bt_cuda_hc_mix_ws_floats(int T, int hc, int D);
bt_status_t bt_cuda_hc_mix_ws(float *pre, float *post, float *comb, const float *x,
                              const float *fn, const float *base, const float *scale, int T,
                              int hc, int D, float eps, float hc_eps, int iters, float *work,
                              size_t work_floats, cudaStream_t stream);

/* out[T,D] = RMSNorm(sum_s w[t,s] x[t,s,:]) with weight norm_w (may be NULL); hc 1, 2 or 4. */
bt_status_t bt_cuda_hc_collapse_norm(void *out, bt_cuda_dtype_t out_dtype, const float *x,
                                     const float *w, const float *norm_w, int T, int hc, int D,
                                     float eps, cudaStream_t stream);

/* bt_cuda_hc_mix_ws and then bt_cuda_hc_collapse_norm of the same streams with weights w mixed
 * earlier (not this mix's pre), the same results; for few tokens the mix's fold and the
 * collapse share one launch (2 launches where there were 3). */
bt_status_t bt_cuda_hc_mix_collapse_ws(float *pre, float *post, float *comb, const float *x,
                                       const float *fn, const float *base, const float *scale,
                                       int T, int hc, int D, float mix_eps, float hc_eps,
                                       int iters, float *work, size_t work_floats, void *out,
                                       bt_cuda_dtype_t out_dtype, const float *w,
                                       const float *norm_w, float eps, cudaStream_t stream);

/* In place on x[T, hc, D]: x_k <- post_k * o + sum_j comb[j][k] x_j; o [T,D] f32 or bf16. */
bt_status_t bt_cuda_hc_expand(float *x, const void *o, bt_cuda_dtype_t o_dtype,
                              const float *post, const float *comb, int T, int hc, int D,
                              cudaStream_t stream);

/* bt_cuda_moe_combine's sum (y, rows, n, stride, shared as there) expanded into the streams as
 * bt_cuda_hc_expand does with its o, in one launch and bit for bit the two launches' streams
 * (the sum itself is not stored). bt_cuda_hc_expand_moe_on: whether callers take it
 * (BT_CUDA_EXPAND_MOE=0: no, for comparisons). */
bt_status_t bt_cuda_hc_expand_moe(float *x, const float *y, const int32_t *rows, const int32_t *n,
                                  int stride, const float *shared, const float *post,
                                  const float *comb, int T, int hc, int D, cudaStream_t stream);
int bt_cuda_hc_expand_moe_on(void);

/* bt_cuda_hc_expand and then bt_cuda_hc_collapse_norm of the new streams (weights w, which are
 * not this expand's post or comb; out does not overlap x or o), bit for bit the same, in one
 * pass over the streams: a block a token. Worth it from BT_CUDA_HC_EC_MIN_TOKENS tokens; a
 * decode batch's two launches measured faster (there the collapse's single blocks start under
 * the expand by programmatic launch; bench/RESULTS.md, session 31). */
enum { BT_CUDA_HC_EC_MIN_TOKENS = 65 };
bt_status_t bt_cuda_hc_expand_collapse(float *x, const void *o, bt_cuda_dtype_t o_dtype,
                                       const float *post, const float *comb, void *out,
                                       bt_cuda_dtype_t out_dtype, const float *w,
                                       const float *norm_w, int T, int hc, int D, float eps,
                                       cudaStream_t stream);

/* ---- attention -------------------------------------------------------------------------- */

/* One query row per token, K = V: token t attends win_n[t] rows win_idx[t, 0..) of win_kv
 * and sel_n[t] rows sel[t, 0..) of comp_kv (either list may be empty; comp_kv may be NULL
 * when every sel_n is 0), softmax with the sink sink[h] in the denominator, scale
 * dim^-0.5; then the inverse rotation of the last 2*half channels at pos[t].
 * q, out [T, H, dim]; win_kv, comp_kv [*, dim]; all of `dtype`. dim even and <= 512; win_stride / sel_stride are the row lengths of win_idx / sel. */
bt_status_t bt_cuda_attention(void *out, const void *q, const void *win_kv, const int32_t *win_idx,
                              const int32_t *win_n, int win_stride, const void *comp_kv,
                              const int32_t *sel, const int32_t *sel_n, int sel_stride,
                              const float *sink, const int64_t *pos, const float *inv_freq,
                              int half, bt_cuda_dtype_t dtype, int T, int H, int dim,
                              cudaStream_t stream);

/* A batch of sequences in one launch (a decode step): each token's caches where they lie.
 * Token t's window rows are win_kv + win_off[t] + row * dim and its compressed rows comp_kv +
 * comp_off[t] + row * dim (elements; comp_off[t] < 0: the token has no compressed keys,
 * whatever sel_n[t] says; an offset array NULL: 0 for every token). The offsets keep rows 16-byte
 * aligned (the tensor-core kernel reads them 16 bytes at a time). split_per_token: every token's
 * keys split as they would for T = 1, so a token's result does not depend on its batch; the
 * workspace must then hold T times the floats of T = 1 (refused otherwise: fewer splits would
 * change the result). */
typedef struct {
    const int64_t *win_off, *comp_off;
    bool split_per_token;
} bt_cuda_attention_batch_t;

/* The same with a workspace: when tokens x head groups leave the GPU idle (decode), the keys
 * are split over blocks (flash-decoding) and the partials folded with the sink in a second
 * kernel. work: f32 device memory of bt_cuda_attention_ws_floats(T, H, dim, win_stride +
 * sel_stride) floats (fewer: fewer splits; NULL or 0: none). batch: NULL, or as above. */
size_t bt_cuda_attention_ws_floats(int T, int H, int dim, int max_keys);
bt_status_t bt_cuda_attention_ws(void *out, const void *q, const void *win_kv,
                                 const int32_t *win_idx, const int32_t *win_n, int win_stride,
                                 const void *comp_kv, const int32_t *sel, const int32_t *sel_n,
                                 int sel_stride, const float *sink, const int64_t *pos,
                                 const float *inv_freq, int half, bt_cuda_dtype_t dtype, int T,
                                 int H, int dim, float *work, size_t work_floats,
                                 const bt_cuda_attention_batch_t *batch, cudaStream_t stream);

/* The same on the tensor cores (bf16 MMAs, fp32 accumulation and softmax) for the whole
 * attention of a token at once: one block per (token, 32 heads) computes the scores against
 * every key of the token, the exact softmax with the sink, then the value product. q, keys and
 * the probabilities are rounded to bf16 on the way in (exact for keys that the model's FP8/FP4
 * roundings left on a bf16 grid; q and the probabilities are bf16-level: use bt_cuda_attention
 * for float32 accuracy). dim a multiple of 8 and <= 512, win_stride + sel_stride <=
 * BT_CUDA_ATTENTION_TC_MAX_KEYS; anything else is refused (use bt_cuda_attention). */
enum { BT_CUDA_ATTENTION_TC_MAX_KEYS = 1024 };
int bt_cuda_attention_tc_fits(int dim, int max_keys);
bt_status_t bt_cuda_attention_tc(void *out, const void *q, const void *win_kv,
                                 const int32_t *win_idx, const int32_t *win_n, int win_stride,
                                 const void *comp_kv, const int32_t *sel, const int32_t *sel_n,
                                 int sel_stride, const float *sink, const int64_t *pos,
                                 const float *inv_freq, int half, bt_cuda_dtype_t dtype, int T,
                                 int H, int dim, cudaStream_t stream);

/* The same with a workspace: when tokens x head groups leave the GPU idle (decode), a token's
 * keys are split over blocks and the partials folded with the sink by a second kernel (the
 * probabilities then round to bf16 against their split's maximum, not the token's). work: f32
 * device memory of bt_cuda_attention_tc_ws_floats(T, H, dim, win_stride + sel_stride)
 * floats (0: no split; fewer: fewer splits; NULL: none). batch: NULL, or as for
 * bt_cuda_attention_ws. */
size_t bt_cuda_attention_tc_ws_floats(int T, int H, int dim, int max_keys);
bt_status_t bt_cuda_attention_tc_ws(void *out, const void *q, const void *win_kv,
                                    const int32_t *win_idx, const int32_t *win_n, int win_stride,
                                    const void *comp_kv, const int32_t *sel, const int32_t *sel_n,
                                    int sel_stride, const float *sink, const int64_t *pos,
                                    const float *inv_freq, int half, bt_cuda_dtype_t dtype, int T,
                                    int H, int dim, float *work, size_t work_floats,
                                    const bt_cuda_attention_batch_t *batch, cudaStream_t stream);

/* bt_cuda_attention_tc for a prefill (no key splits), with the keys already bf16 (the
 * window's and the compressed cache's rows, win_kv and comp_kv) and q and out in q_dtype:
 * one block per (token, 64 heads) streams the token's keys once with an online softmax
 * (bf16 launches of bt_cuda_attention_tc without splits take it too). The probabilities round
 * to bf16 against the running maximum. dim a multiple of 8 and <= 512, any number of keys;
 * bt_cuda_attention_flash_fits(dim) says whether this device runs it (shared memory; 0 also
 * with BT_CUDA_FLASH=0). batch: NULL, or its offsets as for bt_cuda_attention_ws. */
int bt_cuda_attention_flash_fits(int dim);
bt_status_t bt_cuda_attention_flash(void *out, const void *q, bt_cuda_dtype_t q_dtype,
                                    const uint16_t *win_kv, const int32_t *win_idx,
                                    const int32_t *win_n, int win_stride, const uint16_t *comp_kv,
                                    const int32_t *sel, const int32_t *sel_n, int sel_stride,
                                    const float *sink, const int64_t *pos, const float *inv_freq,
                                    int half, int T, int H, int dim,
                                    const bt_cuda_attention_batch_t *batch, cudaStream_t stream);

/* ---- indexer ---------------------------------------------------------------------------- */

/* scores[t, j] = sum_h w[t,h] * ReLU(q[t,h,:] . keys[j,:]) * dim^-0.5 for j < visible[t],
 * -inf for visible[t] <= j < n (all f32). */
bt_status_t bt_cuda_index_scores(float *scores, const float *q, const float *w, const float *keys,
                                 const int64_t *visible, int T, int heads, int dim, int n,
                                 cudaStream_t stream);

/* The same for a batch of sequences in one launch: token t scores its own key set, keys +
 * key_off[t] (in floats) of n_keys[t] rows; scores[t, j] = -inf for j >= min(visible[t],
 * n_keys[t]), rows n apart (n >= every n_keys). */
bt_status_t bt_cuda_index_scores_sets(float *scores, const float *q, const float *w,
                                      const float *keys, const int64_t *key_off,
                                      const int32_t *n_keys, const int64_t *visible, int T,
                                      int heads, int dim, int n, cudaStream_t stream);

/* bt_cuda_index_scores (key_off == NULL: every token against the same keys) or
 * bt_cuda_index_scores_sets (key_off, n_keys: each token its own set) on the tensor cores:
 * q and keys are rounded to bf16 as they are loaded and multiplied with fp32 accumulation.
 * The indexer's queries and keys carry the model's FP4 rounding (e2m1 times a power of two),
 * which bf16 holds exactly: the products are then exact and only the summation order differs
 * from the f32 kernel. dim <= 128 (padded with zeros to a multiple of 16), heads <= 32. */
bt_status_t bt_cuda_index_scores_tc(float *scores, const float *q, const float *w,
                                    const float *keys, const int64_t *key_off,
                                    const int32_t *n_keys, const int64_t *visible, int T,
                                    int heads, int dim, int n, cudaStream_t stream);

/* Top min(k, n) of each row of scores[T, n] (ties: the lower index), as the engine's
 * indexer keeps them: the finite picks' indices ascending in out[t, 0..count), count in
 * out_n[t], the rest of the row -1. k <= n_stride (out's row length). */
bt_status_t bt_cuda_topk(int32_t *out, int32_t *out_n, int out_stride, const float *scores, int T,
                         int n, int k, cudaStream_t stream);

/* ---- MoE -------------------------------------------------------------------------------- */

/* s = sqrt(softplus(logits / temp)); top-k of s + bias (bias steers selection only, ties:
 * the lower expert); weights s / (sum s + 1e-20) (when normalize and k > 1) times
 * route_scale. idx, wts [T, k] in descending biased order. k <= 16, E <= 1024. */
bt_status_t bt_cuda_moe_route(int32_t *idx, float *wts, const float *logits, const float *bias,
                              int T, int E, int k, float temp, int normalize, float route_scale,
                              cudaStream_t stream);

/* h[r,i] = wt[r] * (silu(min(g, limit)) * clamp(u, -limit, limit)) with g = gu[r, i],
 * u = gu[r, I + i] (gate and up side by side, f32 [rows, 2I]); wt may be NULL (weight 1);
 * limit <= 0: no clamping. h [rows, I] f32 or bf16. */
bt_status_t bt_cuda_swiglu(void *h, bt_cuda_dtype_t h_dtype, const float *gu, const float *wt,
                           int rows, int I, float limit, cudaStream_t stream);

/* ---- engram ----------------------------------------------------------------------------- */

/* e[t, c*dim ..] = dequant(table[ids[t,c]]) for c < cols: table FP8 e4m3 [rows, dim] with
 * UE8M0 scales [rows, dim/32]; e [T, cols*dim] f32 or bf16. dim a multiple of 32. */
bt_status_t bt_cuda_engram_gather(void *e, bt_cuda_dtype_t e_dtype, const int64_t *ids, int T,
                                  int cols, const uint8_t *table, const uint8_t *table_scale,
                                  int64_t table_rows, int dim, cudaStream_t stream);

/* Gated injection into x[T, hc, D] from kv[T, (hc+1)*D] (hc keys, then the value) with
 * qk [hc, D] (q_weight * k_weight): d = sum(x_s qk_s key_s) rsqrt(mean x_s^2 + eps)
 * rsqrt(mean key_s^2 + eps) / sqrt(D); x_s += sigmoid(sign(d) sqrt(max(|d|, 1e-6))) value. */
bt_status_t bt_cuda_engram_inject(float *x, const float *kv, const float *qk, int T, int hc, int D,
                                  float eps, cudaStream_t stream);

/* ---- sampling --------------------------------------------------------------------------- */

enum { BT_CUDA_SAMPLE_TOP = 20 };

/* How one row is sampled: services/engine/sampler.h's settings, the draw's (seed, step), and
 * what is reported besides the token. */
typedef struct {
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed, step;
    int32_t want_logprob; /* the chosen token's log-probability */
    int32_t n_top;        /* the most likely tokens with theirs, 0..BT_CUDA_SAMPLE_TOP */
} bt_cuda_sample_params_t;

typedef struct {
    int32_t id;
    float logprob;
    int32_t top_id[BT_CUDA_SAMPLE_TOP]; /* most likely first, the lower id on ties */
    float top_logprob[BT_CUDA_SAMPLE_TOP];
} bt_cuda_sample_result_t;

/* One token for each row t < T of logits (f32, row t at logits + t * ld; its first V ids), by
 * params[t], into out[t]: the rules of services/engine/sampler.c, whose tokens it draws for
 * the same (seed, step) unless a sum's last bits decide (the same weights, bit for bit; the
 * kept sets found by radix selection where the CPU partitions; the draw in id order on both).
 * Log-probabilities are under softmax(logits) over the V ids. One block a row. */
bt_status_t bt_cuda_sample_rows(bt_cuda_sample_result_t *out, const bt_cuda_sample_params_t *params,
                                const float *logits, int64_t ld, int T, int V, cudaStream_t stream);

/* logits[row * ld + id] -= amount for each of adj[0 .. n) (the (row, id) pairs distinct): the
 * penalties of generated tokens, rounded as the host's float subtraction */
typedef struct {
    int32_t row, id;
    float amount;
} bt_cuda_logit_adjust_t;
bt_status_t bt_cuda_logit_adjust(float *logits, int64_t ld, const bt_cuda_logit_adjust_t *adj, int n,
                                 cudaStream_t stream);

/* Constrained decoding: logits[t * ld + id] = -inf for each id < V whose bit in row t's mask
 * (mask + t * words; bit id % 32 of word id / 32) is 0, for rows t < T; the rest untouched. */
bt_status_t bt_cuda_logit_mask(float *logits, int64_t ld, const uint32_t *mask, int words, int T,
                               int V, cudaStream_t stream);

/* ---- engine glue (kernels/cuda/engine_ops.cu) ---------------------------------------------
 * Small steps of the device-resident model (services/engine/model_cuda.c): all f32. */

/* x[t, s, :] = table[ids[t]] for every stream s < hc (zeros where ids[t] < 0: a row another
 * TP rank owns), pre[t, s] = (s == 0); table [*, D]. */
bt_status_t bt_cuda_embed_streams(float *x, float *pre, const float *table, const int32_t *ids,
                                  int T, int hc, int D, cudaStream_t stream);

/* dst[r, :] = src[idx[r], :] for r < n; rows of `width` floats. */
bt_status_t bt_cuda_gather_rows(float *dst, const float *src, const int64_t *idx, int n, int width,
                                cudaStream_t stream);

/* dst[off[r] .. off[r] + width) = src[r, :] for r < n (off in elements: rows into caches that
 * lie apart, e.g. each sequence's window ring). */
bt_status_t bt_cuda_scatter_rows(float *dst, const int64_t *off, const float *src, int n,
                                 int width, cudaStream_t stream);

/* out[t * ldo + :D] = sum_s w[t, s] x[t, s, :] (w [T, hc]), or the mean over the hc streams
 * where w is NULL (DSpark's capture of a target layer's input); no norm. */
bt_status_t bt_cuda_hc_collapse(float *out, int64_t ldo, const float *x, const float *w, int T,
                                int hc, int D, cudaStream_t stream);

/* y[r * ldy + j] += x[r * ldx + j] for r < rows, j < width (the DSpark draft's Markov bias
 * added to its rows on the device, so one row a sequence comes home, not two) */
bt_status_t bt_cuda_add_rows(float *y, int64_t ldy, const float *x, int64_t ldx, int rows,
                             int width, cudaStream_t stream);

/* Many small copies in one launch: copy i's len bytes from src to dst, both device memory
 * (copies[] too); no destination may overlap another copy's source or destination. For a step's scattered KV writes
 * packed to go home in one transfer, and the compressor's staging of each sequence's open
 * group: a cudaMemcpyAsync each cost a graph node or a host call apiece. */
typedef struct {
    const void *src;
    void *dst;
    unsigned long long len;
} bt_cuda_copy_t;
bt_status_t bt_cuda_copy_ranges(const bt_cuda_copy_t *copies, int n, cudaStream_t stream);

/* dst[r, c] = bf16(src[r * ld + c]) (round to nearest even), dst contiguous [rows, cols]. */
bt_status_t bt_cuda_to_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld,
                            cudaStream_t stream);

/* x[i] *= s for i < n. */
bt_status_t bt_cuda_scale(float *x, size_t n, float s, cudaStream_t stream);

/* The routed experts' outputs summed per token in the order listed, plus shared (may be NULL):
 * out[t, :] = (sum_{j < n[t]} y[rows[t * stride + j], :]) + shared[t, :]. */
bt_status_t bt_cuda_moe_combine(float *out, const float *y, const int32_t *rows,
                                const int32_t *n, int stride, const float *shared, int T, int D,
                                cudaStream_t stream);

/* The routing's rows grouped by expert without the host (a decode step captured in a graph
 * cannot wait for the host): idx, wts [N, K] (moe_route's) -> offs [E+1] (expert e owns
 * grouped rows offs[e] ..), xrow [N*K] (the token of each grouped row, tokens ascending within
 * an expert), wt_g [N*K] (its weight), rows [N, K] (each token's grouped rows in expert order,
 * for moe_combine), cnt [N], hit [n_hit_slots] (the experts with rows, ascending, then -1: the
 * expert list of bt_cuda_gemm_fp4_grouped_list). An expert id out of range drops its item and
 * sets *bad to bad_value (nonzero: the caller's tag, e.g. the layer) unless *bad is set already.
 * N * K <= BT_CUDA_MOE_GROUP_MAX, E <= BT_CUDA_MOE_GROUP_MAX, n_hit_slots >= min(E, N * K). */
enum { BT_CUDA_MOE_GROUP_MAX = 1024 }; /* one block: an item a thread, an expert a thread */
bt_status_t bt_cuda_moe_group(int32_t *offs, int32_t *xrow, float *wt_g, int32_t *rows,
                              int32_t *cnt, int32_t *hit, int n_hit_slots, int32_t *bad,
                              int32_t bad_value, const int32_t *idx, const float *wts, int N, int K,
                              int E, cudaStream_t stream);

enum { BT_CUDA_ROUTER_MAX_TOKENS = 16, BT_CUDA_ROUTER_COUNTERS = 16 };

/* A decode step's router logits: logits [T, E] = x [T, D] (ldx) . w [E, D]^T, f32 sums of f32
 * or bf16 operands (both of one dtype), in an order set by E and D alone (a token's logits do
 * not depend on the batch). ws: bt_cuda_moe_router_ws_floats(T, E, D) floats of partial sums;
 * counters: BT_CUDA_ROUTER_COUNTERS device words, zero before the first launch and left zero
 * by each (one set per stream that launches this at a time). The shape must fit
 * (bt_cuda_moe_router_fits: T <= BT_CUDA_ROUTER_MAX_TOKENS, E <= 1024, D a multiple of 4, the
 * rows' slice within the shared memory); ldx a multiple of 4, x and w aligned to 4 values. */
bt_status_t bt_cuda_moe_router_logits(float *logits, bt_cuda_dtype_t x_dtype, const void *x,
                                      int ldx, const void *w, int T, int E, int D, float *ws,
                                      size_t ws_floats, unsigned *counters, cudaStream_t stream);
size_t bt_cuda_moe_router_ws_floats(int T, int E, int D);
int bt_cuda_moe_router_fits(int T, int E, int D);

/* Compressor pooling: group g of r consecutive rows of kv / gate [g * r .. g * r + r) becomes
 * latent[g, d] = sum_j kv[j, d] * softmax_j(gate[j, d]) (r == 1 or gate NULL: the row). */
bt_status_t bt_cuda_compress_pool(float *latent, const float *kv, const float *gate, int groups,
                                  int r, int dim, cudaStream_t stream);

/* Candidate blocks, level one: bmax[t, b] = max of scores[t, b*bs .. b*bs+bs) within n, and
 * +inf for the block of the newest visible entry ((visible[t] - 1) / bs when visible > 0). */
bt_status_t bt_cuda_block_max(float *bmax, const float *scores, const int64_t *visible, int T,
                              int n, int bs, int nblocks, cudaStream_t stream);

/* Level two: scores[t, j] = -inf unless block j / bs is among cand[t, 0 .. cand_n[t]). */
bt_status_t bt_cuda_mask_blocks(float *scores, const int32_t *cand, const int32_t *cand_n,
                                int cand_stride, int T, int n, int bs, cudaStream_t stream);

/* n_out[t] = how many of the ascending sel[t, 0 .. n_in[t]) are below limit. */
bt_status_t bt_cuda_trim_sel(int32_t *n_out, const int32_t *sel, const int32_t *n_in, int stride,
                             int T, int64_t limit, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

/* DeepSeek-V4.1 forward on one CUDA GPU: the same graph as the CPU backend (model.c), step for
 * step, with the weights resident on the device in f32 and the operators of kernels/cuda.
 *
 * KV state. A slot in host memory stays the authoritative copy, so transfers, pools and the
 * services see no difference between backends. The GPU keeps a cached copy of each slot it
 * works on ("mirror"); the host header's device_tag says whether the cache is current: after
 * every forward the bytes the forward wrote are copied back into the host slot and the header
 * gets a fresh tag, which the mirror remembers. A slot reset, or filled by another group,
 * carries another tag and is uploaded afresh. All counters (positions, compressed entries,
 * open groups) are read and advanced on the host, which plans every launch.
 *
 * Weights. Projections stored as FP8 e4m3 with 32x32 UE8M0 blocks stay FP8 on the GPU and
 * routed experts stored as packed FP4 stay FP4, rearranged at load into the FP4 kernels'
 * fragment order (bt_cuda_gemm_fp8 / bt_cuda_gemm_fp4_grouped,
 * activations rounded to bf16 on the way in, fp32 accumulation and output); BF16 projections
 * stay BF16 (cuBLASLt). Everything else is dequantized to f32 at load and multiplied in fp32
 * (cuBLASLt, no TF32). opt.cuda_weights picks other modes: BT_WEIGHTS_F32, every weight f32,
 * tracks the CPU engine to float32 rounding; BT_WEIGHTS_BF16, every projection and expert
 * bf16 (FP8 and FP4 values are exact in bf16, so it computes what the native formats do,
 * through cuBLASLt: the yardstick for the FP8/FP4 kernels). Norms, the mHC streams, attention, the
 * router and the indexer run in f32 either way, in model.c's order of operations (routed experts
 * summed per token in expert order, then the shared expert).
 *
 * Tensor parallelism: the CPU loader cuts this rank's shard (heads, output groups, expert
 * widths, vocabulary rows; model.c) and the forward makes the CPU engine's collectives on
 * device buffers: in place with a comm whose buffers live on the GPU (NCCL), else staged
 * through pinned host memory (threads and socket comms). Sharded projections go to the GPU
 * dequantized (f32, or bf16 with --dtype bfloat16); whole ones keep their formats.
 *
 * Decode steps (TP 1, up to GRAPH_MAX_SEQS sequences of one token) run as CUDA graphs, captured
 * in pieces that start on the GPU while the rest is captured (graph_run); the MoE rows are
 * grouped on the device there, where other forwards group them on the host. Tokens can be
 * drawn with the forward (bt_model_forward_sample: logit adjustments, then bt_cuda_sample_rows
 * on the rows in dlogits), so no logits row need reach the host.
 *
 * DSpark: every forward averages the streams entering the target layers and writes the
 * draft stages' ring entries into the slots (draft_rings); the draft runs its stages on the
 * device and brings a row a sequence home per Markov round, where the proposal is picked
 * (bt_model_cuda_draft). A verification forward keeps its compressor rows for the undo
 * records and attends each row as a decode step would; a rollback (model.c) restores the host
 * slot and writes the same bytes into the mirror (bt_model_cuda_restored), which stays current.
 *
 * Not yet: graphs for TP steps (the collectives wait on the host) and for prefill chunks; debug
 * taps. */
#include "common/alloc.h"
#include "common/comm/comm.h"
#include "common/log.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_ops.h"
#include "services/engine/model_impl.h"
#include "services/engine/safetensors.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A weight matrix [N, K] on the device in the format it is multiplied in. */
typedef enum { MAT_NONE = 0, MAT_F32, MAT_BF16, MAT_FP8 } mat_kind_t;

/* rows from which an FP8 product dequantizes its weight and runs cuBLASLt (mm) */
enum { FP8_WIDE_ROWS = 64 };
/* decode steps of up to GRAPH_MAX_SEQS sequences run as CUDA graphs, GRAPH_SLOTS kept per size
 * and piece: a step is captured as graphs of 1, 2, 4, 8, ... consecutive layers (at most
 * GRAPH_PIECES), each launched as soon as it is captured, so the GPU runs one piece while the
 * host captures the next, twice as long (a step captured whole waited for all of its capture
 * and update: ~25% of a real-model step; pieces of equal size would leave the first's) */
enum { GRAPH_MAX_SEQS = 16, GRAPH_SLOTS = 4, GRAPH_PIECES = 8 };
typedef struct {
    mat_kind_t kind;
    int N, K;
    void *w;        /* f32, bf16 or e4m3 bytes */
    uint8_t *scale; /* FP8: UE8M0 [ceil(N/32), ceil(K/32)] */
    bool aq;        /* its input rounds as the activation quantization rounds (stored FP8/FP4) */
} dev_mat_t;

typedef struct {
    float *attn_norm, *ffn_norm;
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    float *q_norm, *kv_norm, *attn_sink, *c_norm, *i_k_norm;
    float *gate_w, *gate_bias;
    float *e_qk;
    /* the routed experts: f32 [E][2I][D] (w1 rows then w3 rows, one GEMM gives gate and up)
     * and [E][D][I]; or packed FP4 the same way with per-32 scales */
    float *w13, *w2;
    uint8_t *w13_q, *w13_s, *w2_q, *w2_s;
    uint16_t *w13_bf, *w2_bf;    /* --dtype bfloat16 */
    float *e_embed;              /* f32 engram table, or: */
    uint8_t *e_embed_q, *e_embed_s; /* FP8 rows with per-row-block scales [rows, ehd/32] */
    dev_mat_t wq_a, wq_b, wkv, wo_a, wo_b, c_wkv, c_wgate, i_wq_b, i_weights_proj, i_wk;
    dev_mat_t sw1, sw2, sw3, e_wkv;
    bool w13_aq, w2_aq;      /* the routed experts' inputs round (activation quantization) */
    int n_experts, n_active; /* the draft stages route over their own experts */
} dev_layer_t;

typedef struct {
    const uint8_t *host; /* the host slot this mirror caches; NULL = free */
    uint64_t tag;        /* the device_tag the host header had when the cache was current */
    uint64_t used;       /* forward counter, for eviction */
} mirror_t;

enum { FWD_OTHER = 0, FWD_DECODE = 1, FWD_GRAPH = 2 }; /* kinds of forward, for the host times */

struct bt_model_cuda {
    int gpu;
    cudaStream_t stream;
    bt_cuda_blas_t *blas;
    size_t weight_bytes, scratch_bytes;
    int weights;             /* BT_WEIGHTS_*: the formats weights are kept in */
    bool bf16_experts;       /* while loading a layer: its experts go to the GPU in bf16 */
    int n_fp8, n_bf16, n_fp4_layers;
    const bt_safetensors_t *st; /* the checkpoint, while loading */
    float *embed, *head, *norm, *inv_main, *inv_comp;
    dev_layer_t layer[BT_MAX_LAYERS];
    int rmax;  /* the largest compress ratio */
    /* tensor parallelism (tp 1: none) */
    bt_comm_t *comm;
    int tp;
    bool comm_on_device;     /* the comm takes device buffers (NCCL) */
    float *tp_host;          /* pinned staging for host comms */
    float *tp_recv;          /* device receive buffer of all-gathers */
    size_t tp_cap;           /* floats in each */
    float *attn_all;         /* [N][H * hd]: every rank's heads when the groups do not split */
    /* device scratch, sized for opt.max_batch_tokens tokens (N) and opt.max_batch_seqs (S) */
    float *x, *pre_mix, *attn_pre, *post, *comb, *xin, *out, *q_res, *q, *kv, *ckv, *cgate;
    float *attn, *oa, *qi, *iw, *win_stage, *cstage_kv, *cstage_gate, *latent, *ikey;
    float *scores, *bmax, *gate_logits, *moe_wts, *xg, *gu, *hbuf, *yg, *sh_gu, *sh_h, *sh;
    float *e_cat, *e_kv, *hidden, *hsel, *dlogits, *ytmp;
    uint16_t *xb, *hb;       /* bf16 activations on their way into FP8/FP4/BF16 GEMMs */
    size_t xb_cap, ytmp_cap; /* elements */
    /* the activation quantization where a product whose input rounds is f32 (--dtype float32,
     * and TP shards of any dtype): its rounded input; aq_f32 says one is */
    float *aqf;
    bool aq_f32;
    /* a second stream for a decode step's independent chains (the KV row and the indexer's
     * head weights beside the q_lora product, the queries beside the compressor and the
     * indexer: queries_and_kv; the shared expert beside routing and the routed
     * experts), forked and joined by events, as a graph's branches; its products' own scratch.
     * NULL with BT_CUDA_SIDE=0. */
    cudaStream_t side;
    cudaEvent_t side_fork, side_join, side_mark; /* side_mark: a value the side stream made */
    uint16_t *xb_side;
    float *ytmp_side;
    size_t xb_side_cap, ytmp_side_cap;
    size_t side_min_bytes; /* the least weight bytes a forked chain's products move */
    uint64_t side_forks;
    /* a third stream for a decode step's mHC mixes (the split sums and their fold, which only
     * the next expand and the next site's collapse read) beside the collapse and the sublayer
     * on the main stream, joined before the expand: the collapse takes the earlier site's
     * weights, so the mix was never on the sublayer's path. Made with side; NULL with
     * cuda_mix_on_main or BT_CUDA_MIX_STREAM=0. */
    cudaStream_t mix;
    cudaEvent_t mix_fork, mix_join;
    /* with mix and side: a decode layer's latent KV row (wkv, its norm/RoPE/FP8) on the mix
     * stream once the collapse is done, joined before the attention, with its own product
     * scratch, so the side stream's wq_b does not queue behind it: decode b16 -1.5% in the
     * layer bench (bench/RESULTS.md session 38). BT_CUDA_KV_MIX=0: on the side stream. */
    cudaEvent_t kv_fork, kv_join;
    uint16_t *xb_mix;
    size_t xb_mix_cap;
    /* with side: the main and mix streams at the device's highest priority, side at the
     * default, and the decode graphs run by their nodes' priorities (their streams'), so the
     * chain of short kernels on the main stream gets SMs ahead of the side's products: decode
     * b1 -4% in the layer bench (bench/RESULTS.md session 38). BT_CUDA_STREAM_PRIO=0: none. */
    bool prio;
    /* a dequantized FP8 weight (bf16) for products of at least FP8_WIDE_ROWS rows; fp8_max:
     * the largest FP8 weight's elements, counted while loading */
    uint16_t *wdq;
    size_t fp8_max;
    /* attention on the tensor cores (bf16 scores and probabilities): in every mode but
     * --dtype float32, where the f32 kernel keeps float32 accuracy */
    bool att_tc;
    /* the prefill's attention as bt_cuda_attention_flash (where att_tc and the device runs
     * it), over bf16 copies of the staged window rows and of the compressed cache, rounded
     * once a layer (the keys the tensor-core kernels round on the way in anyway) */
    bool att_flash;
    uint16_t *kv16, *comp16;
    int32_t *topk, *topk_n, *cand, *cand_n, *sel_n, *moe_idx;
    size_t score_cap;  /* floats in scores */
    float *att_ws;     /* attention's split-key partials (decode) */
    float *hc_ws;      /* mHC mixes split over blocks (few tokens) */
    size_t hc_ws_cap;
    /* MoE rows grouped on the device (bt_cuda_moe_group) for up to group_cap routed rows */
    int32_t *g_offs, *g_xrow, *g_rows, *g_cnt, *g_hit, *group_bad, *group_bad_h;
    /* a decode-sized batch's router logits (bt_cuda_moe_router_logits): the product's partial
     * sums and its counters (zero between launches); split_router off (BT_CUDA_SPLIT_ROUTER=0):
     * bt_cuda_gemm_f32's few-row product instead, for comparisons */
    float *router_ws;
    size_t router_ws_n;
    unsigned *router_ctr;
    bool split_router;
    float *g_wt;
    int group_cap;
    /* decode steps as CUDA graphs: per batch size 1..GRAPH_MAX_SEQS, a few executable graphs
     * (the launches of a step change with the compressors' and indexer's progress; a step
     * whose topology one of them has takes it by cudaGraphExecUpdate) */
    bool graphs;
    cudaGraphExec_t graph_exec[GRAPH_PIECES][GRAPH_MAX_SEQS + 1][GRAPH_SLOTS];
    uint64_t graph_used[GRAPH_PIECES][GRAPH_MAX_SEQS + 1][GRAPH_SLOTS], graph_clock;
    uint64_t graph_steps, graph_updates, graph_instances;
    uint64_t draws; /* tokens drawn on the GPU */
    /* host seconds of the forwards (logged at the end), by kind (FWD_*) and phase: plans and
     * launches (or their capture, every piece but the last updated and launched as it ends),
     * the last piece's update and launch, waiting for the GPU and the KV copied home */
    double t_host[3][3];
    uint64_t n_fwd[3];
    size_t att_ws_cap;
    int nblk_cap;      /* candidate blocks a row of bmax holds */
    int logit_rows;    /* rows of dlogits */
    /* tokens drawn on the GPU (bt_model_forward_sample): a row's settings and result, pinned
     * and on the device, for logit_rows rows */
    bt_cuda_sample_params_t *draw_p_h, *draw_p_d;
    bt_cuda_sample_result_t *draw_r_h, *draw_r_d;
    bt_cuda_logit_adjust_t *adj_h, *adj_d; /* the draws' logit adjustments, grown as needed */
    size_t adj_cap;
    uint32_t *mask_h, *mask_d; /* the draws' constrained-decoding masks, a row each */
    size_t mask_cap;           /* words */
    /* per-forward plans: bump-allocated in pinned host memory, copied to the same offset of
     * a device arena; never rewritten within a forward, so copies stay asynchronous */
    uint8_t *meta_h, *meta_d;
    size_t meta_cap, meta_used;
    int32_t *moe_idx_h;
    float *moe_wts_h;
    bt_kv_header_t *before; /* [max_batch_seqs] headers at the start of a forward */
    /* a forward's writes to the mirrors, brought home in one copy (copy_home): the ranges
     * (pinned, and their device copy), where each goes on the host, the packed bytes */
    bt_cuda_copy_t *home_rg_h, *home_rg_d;
    uint8_t **home_dst;
    size_t home_rg_cap;
    uint8_t *home_h, *home_d;
    size_t home_cap;
    bt_kv_range_t *home_ranges; /* the ranges of up to home_seqs sequences, then their counts */
    int home_seqs;
    int64_t *cid_h, *hash_h;
    /* slot mirrors, allocated at the first forward (the layout comes with it) */
    uint8_t *mirror_mem;
    size_t slot_bytes;
    int n_mirrors;
    mirror_t *mirror;
    uint64_t clock, tag_base, tags;
    /* DSpark (cfg n_draft > 0): the draft's context projection and head, the target layers'
     * captured streams [N][targets][D], the context rows, the draft's collapsed streams
     * before their norm, a Markov round's embedding rows and biases [S][R], [S][V] */
    dev_mat_t main_proj, markov_head;
    float *main_norm, *draft_norm, *markov_embed;
    float *main_hidden, *main_x, *draft_pre, *markov_e, *markov_bias;
    /* pinned: a round's logits rows, their Markov bias added [S][V], the collapsed streams
     * [N][D], the embedding rows [S][R] */
    float *draft_rows_h, *draft_pre_h, *markov_e_h;
    int32_t *draft_ids; /* [S][block] the blocks' ids */
    /* a verification's compressor rows for the undo records: [n_layers][undo_rows][hd], kv
     * and gate, on the device and pinned */
    float *undo_kv, *undo_gate, *undo_h;
    int undo_rows;
};

#define CK_CUDA(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(err, errlen, "cuda: %s: %s", #call, cudaGetErrorString(e_));                 \
            cudaGetLastError();                                                                    \
            return BT_ERR_DEVICE;                                                                  \
        }                                                                                          \
    } while (0)

#define CK(call)                                                                                   \
    do {                                                                                           \
        bt_status_t s_ = (call);                                                                   \
        if (s_ != BT_OK) {                                                                         \
            snprintf(err, errlen, "cuda forward: %s failed (%s)", #call, bt_status_str(s_));     \
            return s_;                                                                             \
        }                                                                                          \
    } while (0)

/* ---- loading ------------------------------------------------------------------------ */

typedef struct {
    struct bt_model_cuda *c;
    bt_model_t *m;
    char *err;
    size_t errlen;
    bt_status_t rc;
} up_t;

static void *dev_alloc(up_t *u, size_t bytes, size_t *counter)
{
    if (u->rc != BT_OK) return NULL;
    void *p = NULL;
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(u->err, u->errlen, "GPU %d: cannot allocate %.1f MiB (%s)", u->c->gpu,
                 (double)bytes / (1 << 20), cudaGetErrorString(e));
        u->rc = BT_ERR_NO_MEMORY;
        return NULL;
    }
    *counter += bytes;
    return p;
}

/* Copies n floats of a host weight to the GPU and frees the host copy. */
static float *upload(up_t *u, float *host, size_t n)
{
    if (!host || u->rc != BT_OK) return NULL;
    float *d = dev_alloc(u, n * sizeof(float), &u->c->weight_bytes);
    if (d && cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        snprintf(u->err, u->errlen, "GPU %d: weight upload failed", u->c->gpu);
        u->rc = BT_ERR_DEVICE;
    }
    bt_model__free_tracked(u->m, host);
    return d;
}

static float *scratch(up_t *u, size_t n)
{
    return dev_alloc(u, n * sizeof(float), &u->c->scratch_bytes);
}

/* Copies bytes to a new device buffer (the weight counter). */
static void *upload_bytes(up_t *u, const void *host, size_t bytes)
{
    void *d = dev_alloc(u, bytes, &u->c->weight_bytes);
    if (d && cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        snprintf(u->err, u->errlen, "GPU %d: weight upload failed", u->c->gpu);
        u->rc = BT_ERR_DEVICE;
    }
    return d;
}

/* Rounds n floats to bf16 on the way to the GPU; frees the tracked host copy. */
static uint16_t *upload_as_bf16(up_t *u, float *host, size_t n)
{
    uint16_t *b = bt_malloc_or_die(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) b[i] = bt_f32_to_bf16(host[i]);
    uint16_t *d = upload_bytes(u, b, n * sizeof(uint16_t));
    free(b);
    bt_model__free_tracked(u->m, host);
    return d;
}

static const bt_tensor_view_t *scale_of(up_t *u, const char *name)
{
    char sname[300];
    size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") || n + 1 > sizeof sname) return NULL;
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(n - 7), name);
    const bt_tensor_view_t *s = bt_safetensors_find(u->c->st, sname);
    return s && s->dtype == BT_DTYPE_F8_E8M0 && s->ndim == 2 ? s : NULL;
}

/* whether product w rounds its input in f32 (mm_on): then the rounded rows need their scratch */
static void note_aq_f32(struct bt_model_cuda *cu, const dev_mat_t *w)
{
    if (w->aq && w->kind == MAT_F32 && w->K % 32 == 0) cu->aq_f32 = true;
}

/* A projection [N, K]: FP8 with 32x32 blocks or BF16 as stored (unless every weight goes to
 * f32), else the f32 copy the CPU loader made. The host copy is freed either way. */
static void load_mat(up_t *u, dev_mat_t *d, float *host, int64_t N, int64_t K, const char *prefix,
                     const char *suffix)
{
    if (!host || u->rc != BT_OK) return;
    char name[256];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const bt_tensor_view_t *t = u->c->weights != BT_WEIGHTS_AUTO ? NULL : bt_safetensors_find(u->c->st, name);
    d->N = (int)N;
    d->K = (int)K;
    if (t && t->dtype == BT_DTYPE_F8_E4M3 && t->ndim == 2 && t->shape[0] == N && t->shape[1] == K) {
        const bt_tensor_view_t *s = scale_of(u, name);
        if (s && u->m->opt.cuda_reference_gemms) {
            d->kind = MAT_BF16; /* e4m3 x UE8M0 is exact in bf16 */
            d->w = upload_as_bf16(u, host, (size_t)N * (size_t)K);
            u->c->n_bf16++;
            return;
        }
        if (s && s->shape[0] == (N + 31) / 32 && s->shape[1] == (K + 31) / 32) {
            d->kind = MAT_FP8;
            if ((size_t)N * (size_t)K > u->c->fp8_max) u->c->fp8_max = (size_t)N * (size_t)K;
            d->w = upload_bytes(u, t->data, t->nbytes);
            d->scale = upload_bytes(u, s->data, s->nbytes);
            u->c->n_fp8++;
            bt_model__free_tracked(u->m, host);
            return;
        }
    }
    if (t && t->dtype == BT_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == N && t->shape[1] == K) {
        d->kind = MAT_BF16;
        d->w = upload_bytes(u, t->data, t->nbytes);
        u->c->n_bf16++;
        bt_model__free_tracked(u->m, host);
        return;
    }
    if (u->c->weights == BT_WEIGHTS_BF16) {
        d->kind = MAT_BF16;
        d->w = upload_as_bf16(u, host, (size_t)N * (size_t)K);
        u->c->n_bf16++;
        return;
    }
    d->kind = MAT_F32;
    d->w = upload(u, host, (size_t)N * (size_t)K);
}

/* Every routed expert of layer l (named P.ffn.experts...) packed FP4 (w1, w3 [I, D/2], w2
 * [D, I/2] with per-32 scales) in the checkpoint: uploads them as [E][2I][D/2] and [E][D][I/2]. */
static bool load_fp4_experts(up_t *u, int l, const char *P)
{
    const bt_model_config_t *c = &u->m->cfg;
    dev_layer_t *d = &u->c->layer[l];
    int E = d->n_experts, I = c->moe_inter, D = c->hidden;
    if (u->c->weights != BT_WEIGHTS_AUTO || D % 32 || I % 32 || u->m->tp_size > 1) return false;
    const char *part[3] = {"w1", "w3", "w2"};
    const bt_tensor_view_t *t[3], *sc[3];
    size_t row13 = (size_t)D / 2, s13 = (size_t)D / 32, row2 = (size_t)I / 2, s2 = (size_t)I / 32;
    uint8_t *q13 = NULL, *sc13 = NULL, *q2 = NULL, *sc2 = NULL;
    bool ok = true;
    for (int e = 0; e < E && ok; e++) {
        for (int k = 0; k < 3 && ok; k++) {
            char name[256];
            snprintf(name, sizeof name, "%s.ffn.experts.%d.%s.weight", P, e, part[k]);
            t[k] = bt_safetensors_find(u->c->st, name);
            sc[k] = t[k] ? scale_of(u, name) : NULL;
            int64_t rows = k < 2 ? I : D, half = (k < 2 ? D : I) / 2, blocks = (k < 2 ? D : I) / 32;
            ok = t[k] && sc[k] && t[k]->dtype == BT_DTYPE_I8 && t[k]->ndim == 2 && t[k]->shape[0] == rows &&
                 t[k]->shape[1] == half && sc[k]->shape[0] == rows && sc[k]->shape[1] == blocks;
        }
        if (!ok) break;
        if (!q13) {
            q13 = bt_malloc_or_die((size_t)E * 2 * I * row13);
            sc13 = bt_malloc_or_die((size_t)E * 2 * I * s13);
            q2 = bt_malloc_or_die((size_t)E * D * row2);
            sc2 = bt_malloc_or_die((size_t)E * D * s2);
        }
        size_t at = (size_t)e * 2 * I;
        memcpy(q13 + at * row13, t[0]->data, (size_t)I * row13);
        memcpy(q13 + (at + I) * row13, t[1]->data, (size_t)I * row13);
        memcpy(sc13 + at * s13, sc[0]->data, (size_t)I * s13);
        memcpy(sc13 + (at + I) * s13, sc[1]->data, (size_t)I * s13);
        memcpy(q2 + (size_t)e * D * row2, t[2]->data, (size_t)D * row2);
        memcpy(sc2 + (size_t)e * D * s2, sc[2]->data, (size_t)D * s2);
    }
    if (ok && u->m->opt.cuda_reference_gemms) {
        ok = false; /* the caller uploads bf16 experts (e2m1 x UE8M0 is exact in bf16) */
        u->c->bf16_experts = true;
    }
    if (ok) {
        const size_t b13 = (size_t)E * 2 * I * row13, b2 = (size_t)E * D * row2;
        d->w13_q = upload_bytes(u, q13, b13);
        d->w13_s = upload_bytes(u, sc13, (size_t)E * 2 * I * s13);
        d->w2_q = upload_bytes(u, q2, b2);
        d->w2_s = upload_bytes(u, sc2, (size_t)E * D * s2);
        /* the codes into the FP4 kernels' fragment order, there (the rows' K: D and I, % 32) */
        if (u->rc == BT_OK) {
            bt_status_t st = bt_cuda_fp4_to_frag(d->w13_q, b13, 0);
            if (st == BT_OK) st = bt_cuda_fp4_to_frag(d->w2_q, b2, 0);
            const cudaError_t ce = st == BT_OK ? cudaStreamSynchronize(0) : cudaGetLastError();
            if (st != BT_OK || ce != cudaSuccess) {
                snprintf(u->err, u->errlen,
                         "GPU %d: FP4 experts of layer %d not rearranged into fragment order (%s)",
                         u->c->gpu, l,
                         ce != cudaSuccess ? cudaGetErrorString(ce) : bt_status_str(st));
                u->rc = BT_ERR_DEVICE;
            }
        }
        u->c->n_fp4_layers++;
    }
    free(q13), free(sc13), free(q2), free(sc2);
    return ok;
}

static void upload_layer(up_t *u, int l)
{
    bt_model_t *m = u->m;
    const bt_model_config_t *c = &m->cfg;
    layer_weights_t *w = &m->layer[l];
    dev_layer_t *d = &u->c->layer[l];
    size_t D = (size_t)c->hidden, hd = (size_t)c->head_dim, H = (size_t)c->n_heads;
    size_t hc = (size_t)c->hc_mult, mix = (2 + hc) * hc, qlr = (size_t)c->q_lora_rank;
    size_t R = (size_t)c->o_lora_rank, G = (size_t)c->o_groups;
    size_t ih = (size_t)c->index_heads, ihd = (size_t)c->index_head_dim;
    size_t E = (size_t)w->n_experts, I = (size_t)m->il; /* this rank's expert width */
    size_t Hl = (size_t)m->hl, Gl = (size_t)m->gl;     /* its heads and output groups */
    /* the draft stages are stored as mtp.0, mtp.1, ... after the backbone's layers.N */
    char P[32];
    snprintf(P, sizeof P, l >= c->n_layers ? "mtp.%d" : "layers.%d",
             l >= c->n_layers ? l - c->n_layers : l);
    d->n_experts = w->n_experts;
    d->n_active = w->n_active;
    d->attn_norm = upload(u, w->attn_norm, D);
    d->ffn_norm = upload(u, w->ffn_norm, D);
    d->hc_attn_fn = upload(u, w->hc_attn_fn, mix * hc * D);
    d->hc_attn_base = upload(u, w->hc_attn_base, mix);
    d->hc_attn_scale = upload(u, w->hc_attn_scale, 3);
    d->hc_ffn_fn = upload(u, w->hc_ffn_fn, mix * hc * D);
    d->hc_ffn_base = upload(u, w->hc_ffn_base, mix);
    d->hc_ffn_scale = upload(u, w->hc_ffn_scale, 3);
    d->q_norm = upload(u, w->q_norm, qlr);
    d->kv_norm = upload(u, w->kv_norm, hd);
    d->attn_sink = upload(u, w->attn_sink, Hl);
    d->c_norm = upload(u, w->c_norm, hd);
    d->i_k_norm = upload(u, w->i_k_norm, ihd);
    d->gate_w = upload(u, w->gate_w, E * D);
    d->gate_bias = upload(u, w->gate_bias, E);
    load_mat(u, &d->wq_a, w->wq_a, (int64_t)qlr, (int64_t)D, P, "attn.wq_a.weight");
    load_mat(u, &d->wq_b, w->wq_b, (int64_t)(Hl * hd), (int64_t)qlr, P, "attn.wq_b.weight");
    load_mat(u, &d->wkv, w->wkv, (int64_t)hd, (int64_t)D, P, "attn.wkv.weight");
    load_mat(u, &d->wo_a, w->wo_a, (int64_t)(Gl * R), (int64_t)(H * hd / G), P, "attn.wo_a.weight");
    load_mat(u, &d->wo_b, w->wo_b, (int64_t)D, (int64_t)(Gl * R), P, "attn.wo_b.weight");
    load_mat(u, &d->c_wkv, w->c_wkv, (int64_t)hd, (int64_t)D, P, "attn.compressor.wkv.weight");
    load_mat(u, &d->c_wgate, w->c_wgate, (int64_t)hd, (int64_t)D, P,
             "attn.compressor.wgate.weight");
    load_mat(u, &d->i_wq_b, w->i_wq_b, (int64_t)(ih * ihd), (int64_t)qlr, P,
             "attn.indexer.wq_b.weight");
    load_mat(u, &d->i_weights_proj, w->i_weights_proj, (int64_t)ih, (int64_t)D, P,
             "attn.indexer.weights_proj.weight");
    load_mat(u, &d->i_wk, w->i_wk, (int64_t)ihd, (int64_t)hd, P, "attn.indexer.wk.weight");
    load_mat(u, &d->sw1, w->sw1, (int64_t)I, (int64_t)D, P, "ffn.shared_experts.w1.weight");
    load_mat(u, &d->sw2, w->sw2, (int64_t)D, (int64_t)I, P, "ffn.shared_experts.w2.weight");
    load_mat(u, &d->sw3, w->sw3, (int64_t)I, (int64_t)D, P, "ffn.shared_experts.w3.weight");
    if (u->rc != BT_OK) return;
    /* the inputs the activation quantization rounds (model.c's rule: stored FP8/FP4) */
    const unsigned aq = m->opt.activation_quant ? w->lowp : 0u;
    d->wq_a.aq = aq & AQ_WQ_A, d->wq_b.aq = aq & AQ_WQ_B, d->wkv.aq = aq & AQ_WKV;
    d->wo_b.aq = aq & AQ_WO_B, d->c_wkv.aq = aq & AQ_C_WKV, d->c_wgate.aq = aq & AQ_C_WGATE;
    d->i_wq_b.aq = aq & AQ_I_WQ_B, d->i_weights_proj.aq = aq & AQ_I_WPROJ;
    d->i_wk.aq = aq & AQ_I_WK, d->sw1.aq = d->sw3.aq = aq & AQ_SHARED13;
    d->sw2.aq = aq & AQ_SHARED2, d->w13_aq = aq & AQ_W13, d->w2_aq = aq & AQ_W2;
    const dev_mat_t *rounded[] = {&d->wq_a,  &d->wq_b,    &d->wkv,    &d->wo_b,
                                  &d->c_wkv, &d->c_wgate, &d->i_wq_b, &d->i_weights_proj,
                                  &d->i_wk,  &d->sw1,     &d->sw2,    &d->sw3};
    for (size_t i = 0; i < sizeof rounded / sizeof rounded[0]; i++)
        note_aq_f32(u->c, rounded[i]);
    u->c->bf16_experts = u->c->weights == BT_WEIGHTS_BF16;
    if (!load_fp4_experts(u, l, P)) {
        /* gate and up side by side per expert: [E][2I][D] */
        float *cat = bt_malloc_or_die(E * 2 * I * D * sizeof(float));
        for (size_t e = 0; e < E; e++) {
            memcpy(cat + e * 2 * I * D, w->w1 + e * I * D, I * D * sizeof(float));
            memcpy(cat + e * 2 * I * D + I * D, w->w3 + e * I * D, I * D * sizeof(float));
        }
        if (u->c->bf16_experts) {
            d->w13_bf = upload_as_bf16(u, cat, E * 2 * I * D); /* cat is not tracked: not freed there */
            d->w2_bf = upload_as_bf16(u, w->w2, E * D * I);
        } else {
            d->w13 = upload_bytes(u, cat, E * 2 * I * D * sizeof(float));
            d->w2 = upload(u, w->w2, E * D * I);
        }
        free(cat);
    } else {
        bt_model__free_tracked(m, w->w2);
    }
    bt_model__free_tracked(m, w->w1);
    bt_model__free_tracked(m, w->w3);
    int ei = c->layer[l].engram_index;
    if (ei >= 0) {
        size_t cols = (size_t)m->engram_cols, ehd = (size_t)c->engram_head_dim, rows = (size_t)c->engram_rows[ei];
        char name[256];
        snprintf(name, sizeof name, "%s.engram.embed.weight", P);
        const bt_tensor_view_t *t = u->c->weights != BT_WEIGHTS_AUTO ? NULL : bt_safetensors_find(u->c->st, name);
        const bt_tensor_view_t *sc = t ? scale_of(u, name) : NULL;
        if (t && sc && t->dtype == BT_DTYPE_F8_E4M3 && ehd % 32 == 0 && t->nbytes == rows * ehd &&
            sc->shape[0] == (int64_t)rows && sc->shape[1] == (int64_t)(ehd / 32)) {
            d->e_embed_q = upload_bytes(u, t->data, t->nbytes);
            d->e_embed_s = upload_bytes(u, sc->data, sc->nbytes);
            bt_model__free_tracked(m, w->e_embed);
        } else {
            d->e_embed = upload(u, w->e_embed, rows * ehd);
        }
        load_mat(u, &d->e_wkv, w->e_wkv, (int64_t)((hc + 1) * D), (int64_t)(cols * ehd), P,
                 "engram.wkv.weight");
        d->e_wkv.aq = aq & AQ_E_WKV;
        note_aq_f32(u->c, &d->e_wkv);
        d->e_qk = upload(u, w->e_qk, hc * D);
    }
    memset(w, 0, sizeof *w); /* the host copies are gone */
}

/* whether the environment turns a default off: NAME=0 */
static bool env_off(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

/* The DSpark draft's context projection, norms and Markov head; the confidence head's weights
 * stay on the host, where proposals are picked. */
static void upload_draft_head(up_t *u)
{
    struct bt_model_cuda *cu = u->c;
    bt_model_t *m = u->m;
    const bt_model_config_t *c = &m->cfg;
    int64_t D = c->hidden, T = c->n_draft_targets, V = c->vocab, R = c->draft_markov_rank;
    char last[32];
    snprintf(last, sizeof last, "mtp.%d", c->n_draft - 1);
    load_mat(u, &cu->main_proj, m->main_proj, D, T * D, "mtp.0", "main_proj.weight");
    cu->main_proj.aq = m->opt.activation_quant && m->main_proj_lowp;
    note_aq_f32(cu, &cu->main_proj);
    load_mat(u, &cu->markov_head, m->markov_head, V, R, last, "markov_head.head.weight");
    cu->main_norm = upload(u, m->main_norm, (size_t)D);
    cu->draft_norm = upload(u, m->draft_norm, (size_t)D);
    cu->markov_embed = upload(u, m->markov_embed, (size_t)(V * R));
    m->main_proj = m->markov_head = m->main_norm = m->draft_norm = m->markov_embed = NULL;
}

static void alloc_scratch(up_t *u)
{
    struct bt_model_cuda *cu = u->c;
    bt_model_t *m = u->m;
    const bt_model_config_t *c = &m->cfg;
    size_t N = (size_t)m->opt.max_batch_tokens, S = (size_t)m->opt.max_batch_seqs;
    size_t C = (size_t)m->opt.max_ctx, W = (size_t)c->window;
    size_t D = (size_t)c->hidden, hd = (size_t)c->head_dim, H = (size_t)c->n_heads;
    size_t hc = (size_t)c->hc_mult, qlr = (size_t)c->q_lora_rank;
    size_t R = (size_t)c->o_lora_rank, G = (size_t)c->o_groups;
    size_t ih = (size_t)c->index_heads, ihd = (size_t)c->index_head_dim;
    size_t E = (size_t)c->n_experts, I = (size_t)c->moe_inter, K = (size_t)c->n_active;
    if (c->n_draft && (size_t)c->draft_experts > E) E = (size_t)c->draft_experts;
    if (c->n_draft && (size_t)c->draft_active > K) K = (size_t)c->draft_active;
    size_t rmax = (size_t)cu->rmax, lat = S * rmax + N;
    cu->x = scratch(u, N * hc * D);
    cu->pre_mix = scratch(u, N * hc);
    cu->attn_pre = scratch(u, N * hc);
    cu->post = scratch(u, N * hc);
    cu->comb = scratch(u, N * hc * hc);
    cu->xin = scratch(u, N * D);
    cu->out = scratch(u, N * D);
    cu->q_res = scratch(u, N * qlr);
    cu->q = scratch(u, N * H * hd);
    cu->kv = scratch(u, N * hd);
    cu->ckv = scratch(u, N * hd);
    cu->cgate = scratch(u, N * hd);
    cu->attn = scratch(u, N * H * hd);
    cu->oa = scratch(u, N * G * R);
    cu->qi = scratch(u, N * ih * ihd);
    cu->iw = scratch(u, N * ih);
    cu->win_stage = scratch(u, (S * W + N) * hd);
    /* attention's split-key partials for a decode step's tokens (one a sequence, each split as
     * it would be alone), for whichever of the two kernels runs */
    int att_keys = (int)W + (c->index_topk > 0 ? c->index_topk : 1);
    cu->att_ws_cap = bt_cuda_attention_ws_floats(1, m->hl, (int)hd, att_keys);
    if (bt_cuda_attention_tc_ws_floats(1, m->hl, (int)hd, att_keys) > cu->att_ws_cap)
        cu->att_ws_cap = bt_cuda_attention_tc_ws_floats(1, m->hl, (int)hd, att_keys);
    /* a verification's rows each split as a decode step's token would be: a sequence's block
     * in one launch */
    size_t alone = S < N ? S : N, verify = c->n_draft ? (size_t)c->draft_block + 1 : 0;
    cu->att_ws_cap *= (verify < N ? verify : N) > alone ? (verify < N ? verify : N) : alone;
    cu->att_ws = scratch(u, cu->att_ws_cap);
    /* the split mix's partials grow with the tokens until the tokens fill the GPU alone */
    for (size_t t = 1; t <= N; t++) {
        size_t need = bt_cuda_hc_mix_ws_floats((int)t, (int)hc, (int)D);
        if (need == 0) break;
        cu->hc_ws_cap = need;
    }
    if (cu->hc_ws_cap) cu->hc_ws = scratch(u, cu->hc_ws_cap);
    cu->att_tc = cu->weights != BT_WEIGHTS_F32 &&
                 bt_cuda_attention_tc_fits((int)hd, (int)W + (c->index_topk > 0 ? c->index_topk : 0));
    cu->att_flash = cu->att_tc && bt_cuda_attention_flash_fits((int)hd);
    if (cu->att_flash) {
        size_t comp_rows = 0; /* the largest compressed cache */
        for (int l = 0; l < c->n_layers; l++) {
            const bt_layer_config_t *L = &c->layer[l];
            if (L->is_kv_source && L->compress_ratio > 0 &&
                C / (size_t)L->compress_ratio > comp_rows)
                comp_rows = C / (size_t)L->compress_ratio;
        }
        cu->kv16 = (uint16_t *)scratch(u, ((S * W + N) * hd + 1) / 2);
        cu->comp16 = comp_rows ? (uint16_t *)scratch(u, (comp_rows * hd + 1) / 2) : NULL;
    }
    cu->cstage_kv = scratch(u, lat * hd);
    cu->cstage_gate = scratch(u, lat * hd);
    cu->latent = scratch(u, lat * hd);
    cu->ikey = scratch(u, lat * (ihd ? ihd : 1));
    /* indexer scores: a chunk of one sequence's rows against all its entries */
    cu->score_cap = N * C < ((size_t)64 << 20) ? N * C : ((size_t)64 << 20);
    if (cu->score_cap < C) cu->score_cap = C;
    cu->scores = scratch(u, cu->score_cap);
    int bs = c->candidate_block_size > 0 ? c->candidate_block_size : 1;
    cu->nblk_cap = (int)(C / (size_t)bs + 1);
    cu->bmax = scratch(u, N * (size_t)cu->nblk_cap);
    size_t itopk = (size_t)(c->index_topk > 0 ? c->index_topk : 1);
    size_t cb = (size_t)(c->candidate_topk_blocks > 0 ? c->candidate_topk_blocks : 1);
    cu->topk = (int32_t *)scratch(u, N * itopk);
    cu->topk_n = (int32_t *)scratch(u, N);
    cu->sel_n = (int32_t *)scratch(u, N);
    cu->cand = (int32_t *)scratch(u, N * cb);
    cu->cand_n = (int32_t *)scratch(u, N);
    cu->gate_logits = scratch(u, N * E);
    cu->group_cap = (int)(N * K < BT_CUDA_MOE_GROUP_MAX ? N * K : BT_CUDA_MOE_GROUP_MAX);
    if (E <= BT_CUDA_MOE_GROUP_MAX && cu->group_cap > 0) {
        size_t gc = (size_t)cu->group_cap;
        cu->g_offs = (int32_t *)scratch(u, E + 1);
        cu->g_xrow = (int32_t *)scratch(u, gc);
        cu->g_rows = (int32_t *)scratch(u, gc);
        cu->g_hit = (int32_t *)scratch(u, gc);
        cu->g_cnt = (int32_t *)scratch(u, N);
        cu->g_wt = scratch(u, gc);
        cu->group_bad = (int32_t *)scratch(u, 1);
        int rn = (int)(N < BT_CUDA_ROUTER_MAX_TOKENS ? N : BT_CUDA_ROUTER_MAX_TOKENS);
        /* (the backbone's experts and the draft's, whose split differs) */
        cu->router_ws_n = bt_cuda_moe_router_ws_floats(rn, c->n_experts, (int)D);
        if (c->n_draft) {
            size_t dn = bt_cuda_moe_router_ws_floats(rn, c->draft_experts, (int)D);
            if (dn > cu->router_ws_n) cu->router_ws_n = dn;
        }
        cu->router_ws = scratch(u, cu->router_ws_n);
        cu->router_ctr = (unsigned *)scratch(u, BT_CUDA_ROUTER_COUNTERS);
        if (cu->router_ctr &&
            cudaMemset(cu->router_ctr, 0, BT_CUDA_ROUTER_COUNTERS * sizeof(unsigned)) !=
                cudaSuccess) {
            cudaGetLastError();
            snprintf(u->err, u->errlen, "GPU %d: clearing the router's counters failed", u->c->gpu);
            u->rc = BT_ERR_DEVICE;
        }
        if (u->rc == BT_OK && cudaMallocHost((void **)&cu->group_bad_h, sizeof(int32_t)) != cudaSuccess) {
            cudaGetLastError();
            snprintf(u->err, u->errlen, "cannot allocate pinned host memory for the MoE grouping's flag");
            u->rc = BT_ERR_NO_MEMORY;
        }
    } else {
        cu->group_cap = 0;
    }
    cu->moe_idx = (int32_t *)scratch(u, N * K);
    cu->moe_wts = scratch(u, N * K);
    cu->xg = scratch(u, N * K * D);
    cu->gu = scratch(u, N * K * 2 * I);
    cu->hbuf = scratch(u, N * K * I);
    cu->yg = scratch(u, N * K * D);
    if (c->n_shared) {
        cu->sh_gu = scratch(u, N * 2 * I);
        cu->sh_h = scratch(u, N * I);
        cu->sh = scratch(u, N * D);
    }
    if (c->n_engram) {
        cu->e_cat = scratch(u, N * (size_t)m->engram_cols * (size_t)c->engram_head_dim);
        cu->e_kv = scratch(u, N * (hc + 1) * D);
    }
    cu->hidden = scratch(u, N * D);
    if (c->n_draft) {
        size_t T = (size_t)c->n_draft_targets, V = (size_t)c->vocab,
               Rm = (size_t)c->draft_markov_rank;
        cu->main_hidden = scratch(u, N * T * D);
        cu->main_x = scratch(u, N * D);
        cu->draft_pre = scratch(u, N * D);
        cu->markov_e = scratch(u, S * Rm);
        cu->markov_bias = scratch(u, S * V);
        cu->draft_ids = bt_malloc_or_die(S * (size_t)c->draft_block * sizeof(int32_t));
        /* a verification's rows: every sequence's last token and its proposals */
        cu->undo_rows = (int)(S * verify < N ? S * verify : N);
        size_t ub = (size_t)c->n_layers * (size_t)cu->undo_rows * hd;
        cu->undo_kv = scratch(u, ub);
        cu->undo_gate = scratch(u, ub);
        if (u->rc == BT_OK &&
            (cudaMallocHost((void **)&cu->draft_rows_h, S * V * sizeof(float)) != cudaSuccess ||
             cudaMallocHost((void **)&cu->draft_pre_h, N * D * sizeof(float)) != cudaSuccess ||
             cudaMallocHost((void **)&cu->markov_e_h, S * Rm * sizeof(float)) != cudaSuccess ||
             cudaMallocHost((void **)&cu->undo_h, 2 * ub * sizeof(float)) != cudaSuccess)) {
            cudaGetLastError();
            snprintf(u->err, u->errlen, "cannot allocate pinned host memory for DSpark");
            u->rc = BT_ERR_NO_MEMORY;
        }
    }
    {
        size_t kmax = D, e_in = (size_t)(m->engram_cols ? m->engram_cols : 1) * c->engram_head_dim;
        size_t ks[] = {qlr, H * hd, H * hd / G, G * R, I, hd, e_in, (size_t)c->n_draft_targets * D};
        for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) kmax = ks[i] > kmax ? ks[i] : kmax;
        cu->xb_cap = N * (kmax > K * D ? kmax : K * D); /* bf16 experts convert every routed row */
        cu->xb = (uint16_t *)dev_alloc(u, cu->xb_cap * 2, &cu->scratch_bytes);
        if (cu->aq_f32) cu->aqf = scratch(u, cu->xb_cap);
        cu->hb = (uint16_t *)dev_alloc(u, N * K * I * 2, &cu->scratch_bytes);
        cu->ytmp_cap = N * (R > I ? R : I);
        cu->ytmp = scratch(u, cu->ytmp_cap);
        if (cu->side) { /* (side_ok: decode-sized batches only) */
            size_t rows = N < GRAPH_MAX_SEQS ? N : GRAPH_MAX_SEQS, k = D > qlr ? D : qlr;
            cu->xb_side_cap = rows * (k > I ? k : I);
            cu->xb_side = (uint16_t *)dev_alloc(u, cu->xb_side_cap * 2, &cu->scratch_bytes);
            cu->ytmp_side_cap = rows * I;
            cu->ytmp_side = scratch(u, cu->ytmp_side_cap);
            if (cu->mix && !env_off("BT_CUDA_KV_MIX")) { /* (the KV row's input: D wide) */
                cu->xb_mix_cap = rows * D;
                cu->xb_mix = (uint16_t *)dev_alloc(u, cu->xb_mix_cap * 2, &cu->scratch_bytes);
            }
        }
        if (N >= FP8_WIDE_ROWS && cu->fp8_max)
            cu->wdq = (uint16_t *)dev_alloc(u, cu->fp8_max * 2, &cu->scratch_bytes);
    }
    cu->logit_rows = N < 256 ? (int)N : 256;
    cu->hsel = scratch(u, (size_t)cu->logit_rows * D);
    cu->dlogits = scratch(u, (size_t)cu->logit_rows * (size_t)c->vocab);
    if (m->tp_size > 1) {
        size_t T = (size_t)m->tp_size, cap = N * hc * D;
        size_t need[] = {N * H * hd, T * (size_t)cu->logit_rows * (size_t)m->vpad};
        for (size_t i = 0; i < 2; i++) cap = need[i] > cap ? need[i] : cap;
        cu->tp_cap = cap;
        cu->tp_recv = scratch(u, cap);
        if (!m->group_split) cu->attn_all = scratch(u, N * H * hd);
        if (u->rc == BT_OK && cudaMallocHost((void **)&cu->tp_host, cap * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            snprintf(u->err, u->errlen, "cannot allocate pinned host memory for the TP collectives");
            u->rc = BT_ERR_NO_MEMORY;
        }
    }
    if (u->rc != BT_OK) return;

    /* plans: ids, positions, window rows, engram ids and logit rows once; per layer the
     * visibility, entry positions, the compressor's copies and the expert grouping; 16-byte
     * alignment per push */
    size_t L = (size_t)(c->n_layers + c->n_draft),
           cols = (size_t)(m->engram_cols ? m->engram_cols : 1);
    size_t fixed = N * (4 + 8 + W * 4 + 4 + 8 + 8 + 8) + (size_t)c->n_engram * N * cols * 8;
    if (c->n_draft) /* a draft's key lists (window + block) and its Markov rounds' rows */
        fixed += N * (size_t)c->draft_block * 4 + (size_t)c->draft_block * (S * 8 + 16);
    size_t per_layer = N * 8 + lat * 8 + N * K * (8 + 4 + 4) + N * 4 + (S + 8) * 3 * 32 +
                       8 * S * sizeof(bt_cuda_copy_t) + 16 + N * (3 * 8 + 4) +
                       16 +                          /* batched indexer */
                       N * K * 8 + (E + 1) * 8 + 64; /* host MoE grouping */
    cu->meta_cap = fixed + L * per_layer + ((size_t)1 << 20);
    if (cudaMallocHost((void **)&cu->meta_h, cu->meta_cap) != cudaSuccess ||
        cudaMalloc((void **)&cu->meta_d, cu->meta_cap) != cudaSuccess) {
        cudaGetLastError();
        snprintf(u->err, u->errlen, "GPU %d: cannot allocate %.1f MiB of launch plans", cu->gpu,
                 (double)cu->meta_cap / (1 << 20));
        u->rc = BT_ERR_NO_MEMORY;
        return;
    }
    cu->scratch_bytes += cu->meta_cap;
    if (cudaMallocHost((void **)&cu->moe_idx_h, N * K * sizeof(int32_t)) != cudaSuccess ||
        cudaMallocHost((void **)&cu->moe_wts_h, N * K * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(u->err, u->errlen, "cannot allocate pinned host memory");
        u->rc = BT_ERR_NO_MEMORY;
        return;
    }
    const size_t rows = (size_t)cu->logit_rows;
    if (cudaMallocHost((void **)&cu->draw_p_h, rows * sizeof *cu->draw_p_h) != cudaSuccess ||
        cudaMallocHost((void **)&cu->draw_r_h, rows * sizeof *cu->draw_r_h) != cudaSuccess ||
        cudaMalloc((void **)&cu->draw_p_d, rows * sizeof *cu->draw_p_d) != cudaSuccess ||
        cudaMalloc((void **)&cu->draw_r_d, rows * sizeof *cu->draw_r_d) != cudaSuccess) {
        cudaGetLastError();
        snprintf(u->err, u->errlen, "cannot allocate the sampler's buffers");
        u->rc = BT_ERR_NO_MEMORY;
        return;
    }
    cu->before = bt_malloc_or_die(S * sizeof(bt_kv_header_t));
    cu->cid_h = bt_malloc_or_die(N * sizeof(int64_t));
    cu->hash_h = bt_malloc_or_die(N * (size_t)(c->n_engram ? c->n_engram : 1) * cols * sizeof(int64_t));
}

static uint64_t random_tag(void)
{
    uint64_t t = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&t, sizeof t, 1, f) != 1) t = 0;
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32;
    return t & ~(uint64_t)0xffffffffull; /* the low half counts forwards */
}

bt_status_t bt_model_cuda_attach(bt_model_t *m, const char *dir, char *err, size_t errlen)
{
    const bt_model_config_t *c = &m->cfg;
    if (c->hc_mult != 1 && c->hc_mult != 2 && c->hc_mult != 4) {
        snprintf(err, errlen, "the CUDA backend supports hc_mult 1, 2 or 4 (config has %d)", c->hc_mult);
        return BT_ERR_UNSUPPORTED;
    }
    if (c->head_dim > 512 || c->head_dim % 2 || c->index_heads > 32 || c->index_head_dim > 128 ||
        c->n_active > 16 || c->n_experts > 1024) {
        snprintf(err, errlen, "the CUDA backend supports head_dim <= 512, index heads <= 32 x 128, "
                 "<= 16 of <= 1024 experts per token (config: %d, %d x %d, %d of %d)", c->head_dim,
                 c->index_heads, c->index_head_dim, c->n_active, c->n_experts);
        return BT_ERR_UNSUPPORTED;
    }
    int n_gpu = 0;
    if (cudaGetDeviceCount(&n_gpu) != cudaSuccess || n_gpu == 0) {
        cudaGetLastError();
        snprintf(err, errlen, "--device cuda: no CUDA GPU is visible to this process");
        return BT_ERR_UNSUPPORTED;
    }
    if (m->opt.gpu < 0 || m->opt.gpu >= n_gpu) {
        snprintf(err, errlen, "--gpu %d: this machine has GPUs 0..%d", m->opt.gpu, n_gpu - 1);
        return BT_ERR_INVALID_ARG;
    }
    if (c->n_draft && (c->draft_active > 16 || c->draft_experts > 1024)) {
        snprintf(err, errlen,
                 "the CUDA backend supports <= 16 of <= 1024 experts per token (the "
                 "DSpark stages: %d of %d)",
                 c->draft_active, c->draft_experts);
        return BT_ERR_UNSUPPORTED;
    }
    struct bt_model_cuda *cu = bt_calloc_or_die(1, sizeof *cu);
    m->cuda = cu;
    cu->gpu = m->opt.gpu;
    CK_CUDA(cudaSetDevice(cu->gpu));
    const bool side = m->opt.cuda_streams != 1 && !env_off("BT_CUDA_SIDE");
    int prio_low = 0, prio_high = 0; /* (high: the numerically lowest) */
    cu->prio = side && !env_off("BT_CUDA_STREAM_PRIO");
    if (cu->prio) CK_CUDA(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
    CK_CUDA(cudaStreamCreateWithPriority(&cu->stream, cudaStreamNonBlocking, prio_high));
    cu->side_min_bytes = m->opt.cuda_streams == 2 ? 0 : (size_t)1 << 20;
    if (side) {
        CK_CUDA(cudaStreamCreateWithPriority(&cu->side, cudaStreamNonBlocking, prio_low));
        CK_CUDA(cudaEventCreateWithFlags(&cu->side_fork, cudaEventDisableTiming));
        CK_CUDA(cudaEventCreateWithFlags(&cu->side_join, cudaEventDisableTiming));
        CK_CUDA(cudaEventCreateWithFlags(&cu->side_mark, cudaEventDisableTiming));
        if (!m->opt.cuda_mix_on_main && !env_off("BT_CUDA_MIX_STREAM")) {
            CK_CUDA(cudaStreamCreateWithPriority(&cu->mix, cudaStreamNonBlocking, prio_high));
            CK_CUDA(cudaEventCreateWithFlags(&cu->mix_fork, cudaEventDisableTiming));
            CK_CUDA(cudaEventCreateWithFlags(&cu->mix_join, cudaEventDisableTiming));
            CK_CUDA(cudaEventCreateWithFlags(&cu->kv_fork, cudaEventDisableTiming));
            CK_CUDA(cudaEventCreateWithFlags(&cu->kv_join, cudaEventDisableTiming));
        }
    }
    bt_status_t rc = bt_cuda_blas_create(&cu->blas);
    if (rc != BT_OK) {
        snprintf(err, errlen, "GPU %d: cuBLASLt did not start", cu->gpu);
        return rc;
    }
    cu->comm = m->comm;
    cu->tp = m->tp_size;
    cu->comm_on_device = m->comm && bt_comm_device_buffers(m->comm);
    cu->rmax = 1;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer[l].compress_ratio > cu->rmax) cu->rmax = c->layer[l].compress_ratio;
    cu->tag_base = random_tag();
    cu->weights = m->opt.cuda_weights;
    cu->graphs = !m->opt.cuda_graphs_off && !env_off("BT_CUDA_GRAPHS");
    cu->split_router = !env_off("BT_CUDA_SPLIT_ROUTER");
    bt_safetensors_t *st = NULL;
    rc = bt_safetensors_open_dir(dir, &st, err, errlen);
    if (rc != BT_OK) return rc;
    cu->st = st;

    up_t u = {cu, m, err, errlen, BT_OK};
    size_t D = (size_t)c->hidden;
    int show = isatty(STDERR_FILENO);
    cu->embed = upload(&u, m->embed, (size_t)m->vl * D); /* this rank's vocabulary rows */
    cu->head = upload(&u, m->head, (size_t)m->vl * D);
    cu->norm = upload(&u, m->norm, D);
    m->embed = m->head = m->norm = NULL;
    for (int l = 0; l < c->n_layers && u.rc == BT_OK; l++) {
        upload_layer(&u, l);
        if (show) fprintf(stderr, "\rweights to GPU %d: layer %d/%d", cu->gpu, l + 1, c->n_layers);
    }
    if (show) fprintf(stderr, "\n");
    for (int j = 0; j < c->n_draft && u.rc == BT_OK; j++)
        upload_layer(&u, c->n_layers + j);
    if (c->n_draft) upload_draft_head(&u);
    bt_safetensors_close(st);
    cu->st = NULL;
    if (m->half_main) cu->inv_main = upload(&u, m->inv_freq_main, (size_t)m->half_main);
    if (m->half_comp) cu->inv_comp = upload(&u, m->inv_freq_comp, (size_t)m->half_comp);
    m->inv_freq_main = m->inv_freq_comp = NULL;
    alloc_scratch(&u);
    if (u.rc != BT_OK) return u.rc;
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, cu->gpu);
    BT_LOG_INFO("model on GPU %d (%s): weights %.1f MiB (%d FP8 and %d BF16 projections, FP4 experts in %d "
                "layers, the rest f32), scratch %.1f MiB for %d tokens "
                "in <= %d sequences of <= %lld positions",
                cu->gpu, prop.name, (double)cu->weight_bytes / (1 << 20), cu->n_fp8, cu->n_bf16, cu->n_fp4_layers,
                (double)cu->scratch_bytes / (1 << 20), m->opt.max_batch_tokens,
                m->opt.max_batch_seqs, (long long)m->opt.max_ctx);
    return BT_OK;
}

static void dev_free_layer(dev_layer_t *d)
{
    void *p[] = {d->attn_norm, d->ffn_norm, d->hc_attn_fn, d->hc_attn_base, d->hc_attn_scale, d->hc_ffn_fn,
                 d->hc_ffn_base, d->hc_ffn_scale, d->q_norm, d->kv_norm, d->attn_sink, d->c_norm, d->i_k_norm,
                 d->gate_w, d->gate_bias, d->e_qk, d->w13, d->w2, d->w13_q, d->w13_s, d->w2_q, d->w2_s,
                 d->w13_bf, d->w2_bf,
                 d->e_embed, d->e_embed_q, d->e_embed_s};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
    dev_mat_t *m[] = {&d->wq_a, &d->wq_b, &d->wkv, &d->wo_a, &d->wo_b, &d->c_wkv, &d->c_wgate, &d->i_wq_b,
                      &d->i_weights_proj, &d->i_wk, &d->sw1, &d->sw2, &d->sw3, &d->e_wkv};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        cudaFree(m[i]->w);
        cudaFree(m[i]->scale);
    }
}

uint64_t bt_model_cuda_device_draws(const struct bt_model_cuda *cu)
{
    return cu->draws;
}

uint64_t bt_model_cuda_side_forks(const struct bt_model_cuda *cu)
{
    return cu->side_forks;
}

bool bt_model_cuda_draws(const bt_model_t *m, int n_seqs)
{
    const struct bt_model_cuda *cu = m->cuda;
    return cu && n_seqs <= cu->logit_rows && cu->draw_r_d;
}

void bt_model_cuda_graph_stats(const struct bt_model_cuda *cu, uint64_t *steps, uint64_t *instances)
{
    *steps = cu->graph_steps;
    *instances = cu->graph_instances;
}

void bt_model_cuda_destroy(struct bt_model_cuda *cu)
{
    if (!cu) return;
    cudaSetDevice(cu->gpu);
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    if (cu->side) cudaStreamSynchronize(cu->side);
    if (cu->mix) cudaStreamSynchronize(cu->mix);
    for (int l = 0; l < BT_MAX_LAYERS; l++) dev_free_layer(&cu->layer[l]);
    /* clang-format off */
    float *bufs[] = {cu->embed, cu->head, cu->norm, cu->inv_main, cu->inv_comp, cu->x,
                     cu->pre_mix, cu->attn_pre, cu->post, cu->comb, cu->xin, cu->out, cu->q_res,
                     cu->q, cu->kv, cu->ckv, cu->cgate, cu->attn, cu->oa, cu->qi, cu->iw,
                     cu->win_stage, cu->cstage_kv, cu->cstage_gate, cu->latent, cu->ikey,
                     cu->scores, cu->bmax, cu->gate_logits, cu->moe_wts, cu->xg, cu->gu, cu->hbuf,
                     cu->yg, cu->sh_gu, cu->sh_h, cu->sh, cu->e_cat, cu->e_kv, cu->hidden,
                     cu->hsel, cu->dlogits, cu->ytmp, cu->att_ws, (float *)cu->xb, (float *)cu->hb,
                     (float *)cu->topk, (float *)cu->topk_n,
                     (float *)cu->cand, (float *)cu->cand_n, (float *)cu->sel_n,
                     (float *)cu->moe_idx, (float *)cu->meta_d, (float *)cu->mirror_mem, cu->hc_ws,
                     (float *)cu->wdq, (float *)cu->g_offs, (float *)cu->g_xrow, (float *)cu->g_rows,
                     (float *)cu->g_hit, (float *)cu->g_cnt, cu->g_wt, (float *)cu->group_bad,
                     cu->router_ws, (float *)cu->router_ctr, (float *)cu->xb_side, cu->ytmp_side,
                     (float *)cu->xb_mix};
    /* clang-format on */
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    float *draft_bufs[] = {cu->main_norm,     cu->draft_norm,
                           cu->markov_embed,  cu->main_hidden,
                           cu->main_x,        cu->draft_pre,
                           cu->markov_e,      cu->markov_bias,
                           cu->undo_kv,       cu->undo_gate,
                           cu->main_proj.w,   (float *)cu->main_proj.scale,
                           cu->markov_head.w, (float *)cu->markov_head.scale};
    for (size_t i = 0; i < sizeof draft_bufs / sizeof draft_bufs[0]; i++)
        cudaFree(draft_bufs[i]);
    float *draft_pinned[] = {cu->draft_rows_h, cu->draft_pre_h, cu->markov_e_h, cu->undo_h};
    for (size_t i = 0; i < sizeof draft_pinned / sizeof draft_pinned[0]; i++)
        cudaFreeHost(draft_pinned[i]);
    cudaFree(cu->tp_recv);
    cudaFree(cu->attn_all);
    cudaFreeHost(cu->tp_host);
    cudaFreeHost(cu->meta_h);
    cudaFreeHost(cu->moe_idx_h);
    cudaFreeHost(cu->moe_wts_h);
    cudaFreeHost(cu->group_bad_h);
    cudaFreeHost(cu->adj_h);
    cudaFree(cu->adj_d);
    cudaFreeHost(cu->mask_h);
    cudaFree(cu->mask_d);
    cudaFreeHost(cu->draw_p_h);
    cudaFreeHost(cu->draw_r_h);
    cudaFree(cu->draw_p_d);
    cudaFree(cu->draw_r_d);
    cudaFreeHost(cu->home_rg_h);
    cudaFreeHost(cu->home_h);
    cudaFree(cu->home_rg_d);
    cudaFree(cu->home_d);
    free(cu->home_dst);
    free(cu->home_ranges);
    if (cu->graph_steps)
        BT_LOG_INFO("GPU %d: %llu decode steps ran as CUDA graphs (%llu pieces updated an executable graph, %llu instantiated one)",
                    cu->gpu, (unsigned long long)cu->graph_steps, (unsigned long long)cu->graph_updates,
                    (unsigned long long)cu->graph_instances);
    static const char *kinds[3] = {"other forwards", "decode steps, eager", "decode steps as graphs"};
    for (int k = 0; k < 3; k++)
        if (cu->n_fwd[k])
            BT_LOG_INFO("GPU %d: %llu %s, host time each: %.0f us %s, %.0f us updating and launching "
                        "the graph, %.0f us waiting and copying KV home",
                        cu->gpu, (unsigned long long)cu->n_fwd[k], kinds[k],
                        1e6 * cu->t_host[k][0] / (double)cu->n_fwd[k],
                        k == FWD_GRAPH ? "capturing (and launching the pieces before the last)" : "launching",
                        1e6 * cu->t_host[k][1] / (double)cu->n_fwd[k],
                        1e6 * cu->t_host[k][2] / (double)cu->n_fwd[k]);
    for (int p = 0; p < GRAPH_PIECES; p++)
        for (int n = 0; n <= GRAPH_MAX_SEQS; n++)
            for (int i = 0; i < GRAPH_SLOTS; i++)
                if (cu->graph_exec[p][n][i]) cudaGraphExecDestroy(cu->graph_exec[p][n][i]);
    free(cu->before);
    free(cu->draft_ids);
    free(cu->cid_h);
    free(cu->hash_h);
    free(cu->mirror);
    bt_cuda_blas_destroy(cu->blas);
    if (cu->stream) cudaStreamDestroy(cu->stream);
    if (cu->side) {
        cudaStreamDestroy(cu->side);
        cudaEventDestroy(cu->side_fork);
        cudaEventDestroy(cu->side_join);
        cudaEventDestroy(cu->side_mark);
    }
    if (cu->mix) {
        cudaStreamDestroy(cu->mix);
        cudaEventDestroy(cu->mix_fork);
        cudaEventDestroy(cu->mix_join);
        cudaEventDestroy(cu->kv_fork);
        cudaEventDestroy(cu->kv_join);
    }
    free(cu);
}

/* ---- the forward -------------------------------------------------------------------- */

typedef struct {
    bt_model_t *m;
    struct bt_model_cuda *cu;
    const bt_kv_layout_t *lay;
    const bt_forward_seq_t *seqs;
    int n_seqs, N;
    const int *first;
    uint8_t *dslot[BT_MODEL_MAX_SEQS]; /* each sequence's mirror */
    bool graph;                  /* this forward's launches are captured into CUDA graphs */
    bool capturing;              /* the stream is capturing (a piece begun, not yet run) */
    int piece;                   /* the piece being captured */
    const bt_model_draw_t *draw; /* tokens drawn on the GPU from the logits (then no logits out) */
    int logit_rows;              /* rows of logits the forward produced */
    bool topk_set[BT_MODEL_MAX_SEQS], cand_set[BT_MODEL_MAX_SEQS];
    int64_t topk_bound[BT_MODEL_MAX_SEQS]; /* the published picks are below this (their owner's
                                              entries) */
    int64_t *pos_d;              /* [N] positions, device */
    int32_t *win_idx_d, *win_n_d;
    /* a decode step (one token a sequence): attention reads every sequence's caches where they
     * lie, in one launch; slot_off_d [N]: the token's mirror slot from cu->mirror_mem, ring_at_d
     * [N]: its own row's place in the window ring (both in floats, within any layer's ring) */
    bool decode_rows;
    int64_t *slot_off_d, *ring_at_d;
    int64_t *eng_ids_d;          /* [n_engram][N][cols] */
    bool undo;                   /* a verification: sequences with undo records (DSpark) */
    bool mix_forked;             /* a site's mix runs on cu->mix, not yet joined */
    bool expand_pending;         /* cu->out waits to be expanded into the streams (expand) */
    /* a decode step's MoE output not yet summed into cu->out: the expand sums it as it reads
     * it (bt_cuda_hc_expand_moe), else moe_out sums it first; the combine's operands */
    bool moe_pending;
    const int32_t *moe_rows, *moe_cnt;
    int moe_stride;
    const float *moe_shared;
    char *err;
    size_t errlen;
} fwd_t;

/* Room for n bytes of plan in pinned memory; its device twin comes back in *dev. */
static void *plan_alloc(struct bt_model_cuda *cu, size_t n, void **dev)
{
    size_t at = (cu->meta_used + 15) & ~(size_t)15;
    if (at + n > cu->meta_cap) return NULL;
    cu->meta_used = at + n;
    *dev = cu->meta_d + at;
    return cu->meta_h + at;
}

static bt_status_t plan_send(struct bt_model_cuda *cu, const void *host, void *dev, size_t n,
                             char *err, size_t errlen)
{
    CK_CUDA(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, cu->stream));
    return BT_OK;
}

#define PLAN(f, type, count, host_p, dev_p)                                                       \
    do {                                                                                          \
        void *d_;                                                                                 \
        host_p = (type *)plan_alloc((f)->cu, (size_t)(count) * sizeof(type), &d_);                \
        if (!host_p) {                                                                            \
            snprintf(err, errlen, "cuda forward: launch plans overflow their arena");             \
            return BT_ERR_INTERNAL;                                                               \
        }                                                                                         \
        dev_p = (type *)d_;                                                                       \
    } while (0)

static inline float *region(uint8_t *dslot, size_t off)
{
    return (float *)(dslot + off);
}

static bt_status_t d2d(fwd_t *f, void *dst, const void *src, size_t bytes)
{
    char *err = f->err;
    size_t errlen = f->errlen;
    if (bytes == 0) return BT_OK;
    CK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, f->cu->stream));
    return BT_OK;
}

/* ---- tensor-parallel collectives on device buffers ---- */

static bt_status_t tp_failed(fwd_t *f, bt_status_t st)
{
    snprintf(f->err, f->errlen, "tensor-parallel group failed (%s): a rank died or stalled", bt_status_str(st));
    return st;
}

/* Sums n floats of dbuf over the ranks, in place. */
static bt_status_t tp_all_reduce(fwd_t *f, float *dbuf, size_t n)
{
    struct bt_model_cuda *cu = f->cu;
    char *err = f->err;
    size_t errlen = f->errlen;
    CK_CUDA(cudaStreamSynchronize(cu->stream));
    bt_status_t st;
    if (cu->comm_on_device) {
        st = bt_comm_all_reduce_f32(cu->comm, dbuf, n);
    } else {
        if (n > cu->tp_cap) return BT_ERR_INTERNAL;
        CK_CUDA(cudaMemcpy(cu->tp_host, dbuf, n * sizeof(float), cudaMemcpyDeviceToHost));
        st = bt_comm_all_reduce_f32(cu->comm, cu->tp_host, n);
        if (st == BT_OK)
            CK_CUDA(cudaMemcpyAsync(dbuf, cu->tp_host, n * sizeof(float), cudaMemcpyHostToDevice, cu->stream));
    }
    return st == BT_OK ? BT_OK : tp_failed(f, st);
}

/* Every rank's `bytes` of dsend, in rank order, into cu->tp_recv (device) or, with host,
 * into cu->tp_host (for a caller that wants them on the host). */
static bt_status_t tp_all_gather(fwd_t *f, const void *dsend, size_t bytes, bool host)
{
    struct bt_model_cuda *cu = f->cu;
    char *err = f->err;
    size_t errlen = f->errlen;
    if (bytes * (size_t)cu->tp > cu->tp_cap * sizeof(float)) return BT_ERR_INTERNAL;
    CK_CUDA(cudaStreamSynchronize(cu->stream));
    bt_status_t st;
    if (cu->comm_on_device) {
        st = bt_comm_all_gather(cu->comm, dsend, bytes, cu->tp_recv);
        if (st == BT_OK && host)
            CK_CUDA(cudaMemcpy(cu->tp_host, cu->tp_recv, bytes * (size_t)cu->tp, cudaMemcpyDeviceToHost));
    } else {
        uint8_t *mine = (uint8_t *)cu->tp_host + bytes * (size_t)bt_comm_rank(cu->comm);
        CK_CUDA(cudaMemcpy(mine, dsend, bytes, cudaMemcpyDeviceToHost));
        st = bt_comm_all_gather(cu->comm, mine, bytes, cu->tp_host);
        if (st == BT_OK && !host)
            CK_CUDA(cudaMemcpyAsync(cu->tp_recv, cu->tp_host, bytes * (size_t)cu->tp, cudaMemcpyHostToDevice,
                                    cu->stream));
    }
    return st == BT_OK ? BT_OK : tp_failed(f, st);
}

/* y[M, N] (rows ldy apart) = x[M, K] (rows ldx apart, f32) . w^T in w's format: f32 on the
 * CUDA cores' FMAs; FP8 and BF16 with x rounded to bf16, fp32 accumulation. An FP8 weight
 * against FP8_WIDE_ROWS rows or more (prefill) is dequantized once (exactly, into bf16) and
 * multiplied by cuBLASLt: the same products, at the tensor cores' bf16 rate. */
static bool fp8_via_cublas(const struct bt_model_cuda *cu, int M)
{
    return M >= FP8_WIDE_ROWS && cu->wdq;
}

/* x's rows as a product's bf16 input: where the activation quantization applies (aq, K in whole
 * blocks of 32) rounded as model.c's aq_input rounds (the rounded values are bf16s: exact),
 * else rounded to bf16 */
static bt_status_t product_rows(uint16_t *xb, const float *x, int rows, int K, int ldx, bool aq,
                                cudaStream_t st)
{
    return aq && K % 32 == 0 ? bt_cuda_act_quant(xb, BT_CUDA_BF16, x, BT_CUDA_F32, rows, K, ldx, st)
                             : bt_cuda_to_bf16(xb, x, rows, K, ldx, st);
}

/* dense rows x[rows, K] of dtype dt rounded in place where the activation quantization applies */
static bt_status_t round_rows(void *x, bt_cuda_dtype_t dt, int rows, int K, bool aq,
                              cudaStream_t st)
{
    return aq && K % 32 == 0 ? bt_cuda_act_quant(x, dt, x, dt, rows, K, K, st) : BT_OK;
}

/* where mm_on runs a product: the main stream, the side stream or the mix stream, each with its
 * own scratch (off the main stream: side_ok's products only) */
enum { ON_MAIN, ON_SIDE, ON_MIX };

static bt_status_t mm_on(fwd_t *f, int on, float *y, int ldy, const float *x, int ldx,
                         const dev_mat_t *w, int M)
{
    struct bt_model_cuda *cu = f->cu;
    char *err = f->err;
    size_t errlen = f->errlen;
    const bool side = on != ON_MAIN;
    cudaStream_t st = on == ON_MIX ? cu->mix : side ? cu->side : cu->stream;
    uint16_t *xb = on == ON_MIX ? cu->xb_mix : side ? cu->xb_side : cu->xb;
    float *ytmp = on == ON_MIX ? NULL : side ? cu->ytmp_side : cu->ytmp;
    size_t xb_cap = on == ON_MIX ? cu->xb_mix_cap : side ? cu->xb_side_cap : cu->xb_cap;
    size_t ytmp_cap = on == ON_MIX ? 0 : side ? cu->ytmp_side_cap : cu->ytmp_cap;
    int N = w->N, K = w->K;
    /* the activation quantization's rounding, as model.c's aq_input (K in whole blocks) */
    const bool aq = w->aq && K % 32 == 0;
    if (w->kind == MAT_F32 && aq) {
        if (side || !cu->aqf || (size_t)M * K > cu->xb_cap) { /* (side_ok: FP8 products only) */
            snprintf(err, errlen,
                     "cuda forward: no scratch for the rounded input of an f32 %dx%dx%d product%s",
                     M, N, K, side ? " off the main stream" : "");
            return BT_ERR_INTERNAL;
        }
        CK(bt_cuda_act_quant(cu->aqf, BT_CUDA_F32, x, BT_CUDA_F32, M, K, ldx, st));
        x = cu->aqf, ldx = K;
    }
    if (w->kind == MAT_F32) return bt_cuda_gemm_f32(cu->blas, y, ldy, x, ldx, (const float *)w->w, M, N, K, st);
    if ((size_t)M * K > xb_cap || (ldy != N && (size_t)M * N > ytmp_cap)) {
        snprintf(err, errlen, "cuda forward: a %dx%dx%d product exceeds the scratch", M, N, K);
        return BT_ERR_INTERNAL;
    }
    CK(product_rows(xb, x, M, K, ldx, aq, st));
    float *out = ldy == N ? y : ytmp;
    if (w->kind == MAT_FP8 && fp8_via_cublas(cu, M)) {
        CK(bt_cuda_dequant_fp8(cu->wdq, (const uint8_t *)w->w, w->scale, N, K, st));
        CK(bt_cuda_gemm_bf16(cu->blas, out, BT_CUDA_F32, xb, cu->wdq, M, N, K, st));
    } else if (w->kind == MAT_FP8)
        CK(bt_cuda_gemm_fp8(out, BT_CUDA_F32, xb, (const uint8_t *)w->w, w->scale, M, N, K, st));
    else
        CK(bt_cuda_gemm_bf16(cu->blas, out, BT_CUDA_F32, xb, (const uint16_t *)w->w, M, N, K, st));
    if (out != y)
        CK_CUDA(cudaMemcpy2DAsync(y, (size_t)ldy * sizeof(float), out, (size_t)N * sizeof(float),
                                  (size_t)N * sizeof(float), (size_t)M, cudaMemcpyDeviceToDevice, st));
    return BT_OK;
}

static bt_status_t mm(fwd_t *f, float *y, int ldy, const float *x, int ldx, const dev_mat_t *w, int M)
{
    return mm_on(f, ON_MAIN, y, ldy, x, ldx, w, M);
}

/* Whether products by a, b, c (NULL: none) may run on the side stream: a decode-sized batch
 * and FP8 weights through the few-row kernel, which share no scratch or workspace with the
 * main stream's work (cuBLASLt's and the dequantized weight are shared). */
static bool side_ok(const fwd_t *f, const dev_mat_t *a, const dev_mat_t *b, const dev_mat_t *c)
{
    const struct bt_model_cuda *cu = f->cu;
    if (!cu->side || !cu->xb_side || f->N > GRAPH_MAX_SEQS || fp8_via_cublas(cu, f->N)) return false;
    const dev_mat_t *mats[] = {a, b, c};
    size_t bytes = 0;
    for (int i = 0; i < 3; i++) {
        if (mats[i] && mats[i]->kind != MAT_FP8) return false;
        if (mats[i]) bytes += (size_t)mats[i]->N * (size_t)mats[i]->K;
    }
    return bytes >= cu->side_min_bytes;
}

/* Whether a bf16 product of a decode-sized batch may run on the side stream: only where
 * bt_cuda_gemm_bf16 takes its few-row kernel (cuBLASLt's workspace is shared); the
 * conditions of bt__gemm_bf16_rows_fits (the scratch rows are aligned). */
static bool side_ok_bf16(const fwd_t *f, const dev_mat_t *w)
{
    const struct bt_model_cuda *cu = f->cu;
    return cu->side && cu->xb_side && f->N <= GRAPH_MAX_SEQS && !fp8_via_cublas(cu, f->N) &&
           w->kind == MAT_BF16 && w->K % 32 == 0 && 2ll * w->N * w->K < (1ll << 31);
}

/* Stream `waiter` goes on only past what stream `from` has queued so far (event ev recorded on
 * from): a graph's edge between its branches. */
static bt_status_t stream_after(fwd_t *f, cudaStream_t waiter, cudaStream_t from, cudaEvent_t ev)
{
    char *err = f->err;
    size_t errlen = f->errlen;
    CK_CUDA(cudaEventRecord(ev, from));
    CK_CUDA(cudaStreamWaitEvent(waiter, ev, 0));
    return BT_OK;
}

/* The side stream starts after what the main stream has queued; the main stream goes on past
 * side_join only once the side stream's work is done. */
static bt_status_t side_fork(fwd_t *f)
{
    const bt_status_t st = stream_after(f, f->cu->side, f->cu->stream, f->cu->side_fork);
    if (st == BT_OK) f->cu->side_forks++;
    return st;
}

/* The side stream, already forked, waits here for what the main stream has queued so far
 * (a value its next steps read); the main stream goes on. */
static bt_status_t side_wait_main(fwd_t *f)
{
    return stream_after(f, f->cu->side, f->cu->stream, f->cu->side_fork);
}

static bt_status_t side_join(fwd_t *f)
{
    return stream_after(f, f->cu->stream, f->cu->side, f->cu->side_join);
}

/* The compressor of a kv-source layer: each sequence's open group and new rows staged
 * contiguously, complete groups pooled into latents, the rest kept open in the slot. The
 * copies of all sequences go in three launches (staging, what stays open, the new entries
 * into the slots), not six or so cudaMemcpyAsync a sequence: in a decode batch's graph those
 * were most of its nodes. */
static bt_status_t compress(fwd_t *f, int l)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int r = c->layer[l].compress_ratio, hd = c->head_dim, ihd = c->index_head_dim;
    size_t row = (size_t)hd * sizeof(float);
    int n_lat = 0, cb = 0, S = f->n_seqs;
    int ng_q[BT_MODEL_MAX_SEQS], cb_q[BT_MODEL_MAX_SEQS];
    int64_t e0s[BT_MODEL_MAX_SEQS];
    int64_t *epos, *epos_d;
    PLAN(f, int64_t, cu->rmax * S + f->N, epos, epos_d);
    /* the copies: staging at [0, 4S), what stays open at [4S, 6S), new entries at [6S, 8S) */
    bt_cuda_copy_t *cp, *cp_d;
    PLAN(f, bt_cuda_copy_t, 8 * S, cp, cp_d);
    int n_in = 0, n_back = 0, n_out = 0;
#define BT__COPY(seg, k, d, s_, bytes)                                                             \
    do {                                                                                           \
        if ((bytes) > 0) cp[(seg) * S + (k)++] = (bt_cuda_copy_t){(s_), (d), (bytes)};             \
    } while (0)
    bool keys = c->layer[l].is_index_source;
    for (int q = 0; q < S; q++) {
        bt_kv_header_t *h = bt_kv_header(f->seqs[q].state);
        int n = f->seqs[q].n, first = f->first[q];
        int p0 = (int)h->pending[l], total = p0 + n, ng = total / r, tail = total - ng * r;
        float *pkv = region(f->dslot[q], f->lay->pend_kv_off[l]);
        float *pgate = region(f->dslot[q], f->lay->pend_gate_off[l]);
        BT__COPY(0, n_in, cu->cstage_kv + (size_t)cb * hd, pkv, (size_t)p0 * row);
        BT__COPY(0, n_in, cu->cstage_kv + (size_t)(cb + p0) * hd, cu->ckv + (size_t)first * hd, (size_t)n * row);
        if (r > 1) {
            BT__COPY(0, n_in, cu->cstage_gate + (size_t)cb * hd, pgate, (size_t)p0 * row);
            BT__COPY(0, n_in, cu->cstage_gate + (size_t)(cb + p0) * hd, cu->cgate + (size_t)first * hd, (size_t)n * row);
        }
        BT__COPY(4, n_back, pkv, cu->cstage_kv + (size_t)(cb + ng * r) * hd, (size_t)tail * row);
        if (r > 1) BT__COPY(4, n_back, pgate, cu->cstage_gate + (size_t)(cb + ng * r) * hd, (size_t)tail * row);
        ng_q[q] = ng;
        cb_q[q] = cb;
        e0s[q] = h->entries[l];
        BT__COPY(6, n_out, region(f->dslot[q], f->lay->comp_off[l]) + (size_t)e0s[q] * hd,
                 cu->latent + (size_t)n_lat * hd, (size_t)ng * row);
        if (keys)
            BT__COPY(6, n_out, region(f->dslot[q], f->lay->ikey_off[l]) + (size_t)e0s[q] * ihd,
                     cu->ikey + (size_t)n_lat * ihd, (size_t)ng * ihd * sizeof(float));
        for (int g = 0; g < ng; g++) epos[n_lat + g] = (h->entries[l] + g) * r;
        h->pending[l] = tail;
        h->entries[l] += ng;
        n_lat += ng;
        cb += total;
    }
#undef BT__COPY
    CK(plan_send(cu, cp, cp_d, (size_t)8 * S * sizeof(bt_cuda_copy_t), err, errlen));
    if (n_in) CK(bt_cuda_copy_ranges(cp_d, n_in, st));
    for (int q = 0, at = 0; q < S; q++) {
        if (ng_q[q] > 0)
            CK(bt_cuda_compress_pool(cu->latent + (size_t)at * hd, cu->cstage_kv + (size_t)cb_q[q] * hd,
                                     r > 1 ? cu->cstage_gate + (size_t)cb_q[q] * hd : NULL, ng_q[q], r, hd, st));
        at += ng_q[q];
    }
    if (n_back) CK(bt_cuda_copy_ranges(cp_d + 4 * S, n_back, st));
    if (n_lat == 0) return BT_OK;
    CK(plan_send(cu, epos, epos_d, (size_t)n_lat * sizeof(int64_t), err, errlen));
    float eps = (float)c->rms_eps;
    CK(bt_cuda_rmsnorm(cu->latent, BT_CUDA_F32, cu->latent, BT_CUDA_F32, w->c_norm, n_lat, hd, eps, st));
    if (keys) {
        CK(mm(f, cu->ikey, ihd, cu->latent, hd, &w->i_wk, n_lat));
        /* norm, rope, FP4 rounding: one launch */
        CK(bt_cuda_head_finish(cu->ikey, n_lat, 1, ihd, 1, w->i_k_norm, eps, m->half_comp ? epos_d : NULL,
                               cu->inv_comp, m->half_comp, 32, BT_CUDA_FQ_FP4_UE8M0, st));
    }
    CK(bt_cuda_head_finish(cu->latent, n_lat, 1, hd, 0, NULL, eps, m->half_comp ? epos_d : NULL, cu->inv_comp,
                           m->half_comp, 16, BT_CUDA_FQ_FP4_E4M3, st));
    if (n_out) CK(bt_cuda_copy_ranges(cp_d + 6 * S, n_out, st));
    return BT_OK;
}

/* The indexer: each sequence's queries against its key owner's entries; candidate blocks on
 * the candidate source, their mask on later index layers, then the published top-k. */
static bt_status_t indexer(fwd_t *f, int l)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const bt_layer_config_t *L = &c->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int ih = c->index_heads, ihd = c->index_head_dim, owner = L->index_key_owner;
    int bs = c->candidate_block_size > 0 ? c->candidate_block_size : 1, cbk = c->candidate_topk_blocks > 0 ? c->candidate_topk_blocks : 1;
    int itopk = c->index_topk;
    /* the tensor-core scorer where queries and keys carry the FP4 rounding (it rounds per 32
     * channels, so only when the head dim is whole blocks): bf16 holds them exactly and the
     * products match the f32 kernel's */
    bool ix_tc = ihd % 32 == 0 && ihd <= 128 && ih <= 32;
    /* a batch of sequences that all have entries (decode): every token against its own
     * sequence's keys in one launch, rows padded to the longest with -inf, which no top-k
     * keeps; the candidate pin is left out where the CPU leaves it out (newest visible block
     * past the sequence's entries) */
    const int N = f->N;
    bool batched = f->n_seqs > 1;
    int64_t nmax = 0;
    for (int q = 0; q < f->n_seqs && batched; q++) {
        int64_t ne = bt_kv_header(f->seqs[q].state)->entries[owner];
        if (ne == 0) batched = false;
        if (ne > nmax) nmax = ne;
    }
    batched = batched && (size_t)N * (size_t)nmax <= cu->score_cap && nmax / bs + 1 <= cu->nblk_cap;
    /* the plans of this layer in one block, sent in one copy: each token's visible entries,
     * and for the batched launch its key offset, its pinned block and its key count */
    int64_t *vis, *vis_d;
    PLAN(f, int64_t, batched ? (size_t)3 * N + (N + 1) / 2 : (size_t)N, vis, vis_d);
    for (int t = 0, q = 0; q < f->n_seqs; q++) {
        int64_t start = bt_kv_header(f->seqs[q].state)->n_tokens;
        for (int i = 0; i < f->seqs[q].n; i++, t++) vis[t] = (start + i + 1) / L->compress_ratio;
    }
    if (batched) {
        int64_t *koff = vis + N, *koff_d = vis_d + N, *vpin = vis + 2 * N, *vpin_d = vis_d + 2 * N;
        int32_t *nk = (int32_t *)(vis + 3 * N), *nk_d = (int32_t *)(vis_d + 3 * N);
        for (int q = 0; q < f->n_seqs; q++) {
            int64_t ne = bt_kv_header(f->seqs[q].state)->entries[owner];
            int64_t at = (int64_t)(f->dslot[q] + f->lay->ikey_off[owner] - cu->mirror_mem) / (int64_t)sizeof(float);
            for (int i = 0; i < f->seqs[q].n; i++) {
                int t = f->first[q] + i;
                koff[t] = at;
                nk[t] = (int32_t)ne;
                vpin[t] = vis[t] > 0 && (vis[t] - 1) / bs < (ne + bs - 1) / bs ? vis[t] : 0;
            }
        }
        CK(plan_send(cu, vis, vis_d, (size_t)N * (3 * sizeof(int64_t) + sizeof(int32_t)), err, errlen));
        int n = (int)nmax;
        if (ix_tc)
            CK(bt_cuda_index_scores_tc(cu->scores, cu->qi, cu->iw, (const float *)cu->mirror_mem, koff_d, nk_d,
                                       vis_d, f->N, ih, ihd, n, st));
        else
            CK(bt_cuda_index_scores_sets(cu->scores, cu->qi, cu->iw, (const float *)cu->mirror_mem, koff_d, nk_d,
                                         vis_d, f->N, ih, ihd, n, st));
        bool all_cand = true;
        for (int q = 0; q < f->n_seqs; q++) all_cand = all_cand && f->cand_set[q];
        if (c->candidate_source >= 0 && c->candidate_source < l && all_cand) {
            /* every sequence has its candidates (a decode step past the candidate source): the
             * mask is per row, so one launch over all rows does what one a sequence did */
            CK(bt_cuda_mask_blocks(cu->scores, cu->cand, cu->cand_n, cbk, N, n, bs, st));
        } else {
            for (int q = 0; q < f->n_seqs; q++)
                if (c->candidate_source >= 0 && c->candidate_source < l && f->cand_set[q]) {
                    int t0 = f->first[q];
                    CK(bt_cuda_mask_blocks(cu->scores + (size_t)t0 * n, cu->cand + (size_t)t0 * cbk, cu->cand_n + t0,
                                           cbk, f->seqs[q].n, n, bs, st));
                }
        }
        if (l == c->candidate_source) {
            int nblocks = (n + bs - 1) / bs;
            CK(bt_cuda_block_max(cu->bmax, cu->scores, vpin_d, f->N, n, bs, nblocks, st));
            CK(bt_cuda_topk(cu->cand, cu->cand_n, cbk, cu->bmax, f->N, nblocks, cbk < nblocks ? cbk : nblocks, st));
        }
        CK(bt_cuda_topk(cu->topk, cu->topk_n, itopk, cu->scores, f->N, n, itopk < n ? itopk : n, st));
        for (int q = 0; q < f->n_seqs; q++) {
            if (l == c->candidate_source) f->cand_set[q] = true;
            f->topk_set[q] = true;
            f->topk_bound[q] = bt_kv_header(f->seqs[q].state)->entries[owner];
        }
        return BT_OK;
    }

    CK(plan_send(cu, vis, vis_d, (size_t)N * sizeof(int64_t), err, errlen));
    for (int q = 0; q < f->n_seqs; q++) {
        int64_t n_entries = bt_kv_header(f->seqs[q].state)->entries[owner];
        if (n_entries == 0) continue; /* the reference publishes nothing: earlier picks stay */
        if (n_entries > (int64_t)cu->score_cap || n_entries / bs + 1 > cu->nblk_cap) {
            snprintf(err, errlen, "cuda forward: %lld index entries exceed the scratch", (long long)n_entries);
            return BT_ERR_TOO_LONG;
        }
        int ne = (int)n_entries;
        const float *keys = region(f->dslot[q], f->lay->ikey_off[owner]);
        bool use_cand = c->candidate_source >= 0 && c->candidate_source < l && f->cand_set[q];
        bool level_one = l == c->candidate_source;
        int per = (int)(cu->score_cap / (size_t)ne);
        if (per < 1) per = 1;
        for (int i0 = 0; i0 < f->seqs[q].n; i0 += per) {
            int tn = f->seqs[q].n - i0 < per ? f->seqs[q].n - i0 : per, t0 = f->first[q] + i0;
            if (ix_tc)
                CK(bt_cuda_index_scores_tc(cu->scores, cu->qi + (size_t)t0 * ih * ihd, cu->iw + (size_t)t0 * ih,
                                           keys, NULL, NULL, vis_d + t0, tn, ih, ihd, ne, st));
            else
                CK(bt_cuda_index_scores(cu->scores, cu->qi + (size_t)t0 * ih * ihd, cu->iw + (size_t)t0 * ih,
                                        keys, vis_d + t0, tn, ih, ihd, ne, st));
            if (use_cand)
                CK(bt_cuda_mask_blocks(cu->scores, cu->cand + (size_t)t0 * cbk, cu->cand_n + t0, cbk, tn,
                                       ne, bs, st));
            if (level_one) {
                int nblocks = (ne + bs - 1) / bs;
                CK(bt_cuda_block_max(cu->bmax, cu->scores, vis_d + t0, tn, ne, bs, nblocks, st));
                CK(bt_cuda_topk(cu->cand + (size_t)t0 * cbk, cu->cand_n + t0, cbk, cu->bmax, tn, nblocks,
                                cbk < nblocks ? cbk : nblocks, st));
            }
            CK(bt_cuda_topk(cu->topk + (size_t)t0 * itopk, cu->topk_n + t0, itopk, cu->scores, tn, ne,
                            itopk < ne ? itopk : ne, st));
        }
        if (level_one) f->cand_set[q] = true;
        f->topk_set[q] = true;
        f->topk_bound[q] = n_entries;
    }
    return BT_OK;
}

/* The two attention kernels take the same arguments: the tensor-core one where it fits
 * (cu->att_tc), else the f32 one. */
typedef bt_status_t attention_fn(void *out, const void *q, const void *win_kv, const int32_t *win_idx,
                                 const int32_t *win_n, int win_stride, const void *comp_kv,
                                 const int32_t *sel, const int32_t *sel_n, int sel_stride,
                                 const float *sink, const int64_t *pos, const float *inv_freq, int half,
                                 bt_cuda_dtype_t dtype, int T, int H, int dim, float *work,
                                 size_t work_floats, const bt_cuda_attention_batch_t *batch,
                                 cudaStream_t stream);

static bt_status_t attention_out(fwd_t *f, int l);
static bt_status_t ring_rows(fwd_t *f, int l);

/* the indexer's head weights (cu->iw, N rows) scaled by 1/sqrt(heads), on stream st */
static bt_status_t index_weights_scale(fwd_t *f, cudaStream_t st)
{
    const int ih = f->m->cfg.index_heads;
    return bt_cuda_scale(f->cu->iw, (size_t)f->N * ih, 1.0f / sqrtf((float)ih), st);
}

/* Layer l's queries (q_res normed, then cu->q rotated) and its latent KV row (cu->kv: norm,
 * rope, FP8 rounding in one launch). two NULL: all on the main stream; else *two says whether
 * the queries' wq_b and the KV row went off the main stream (when they may: wq_b to the side
 * stream, the KV row to the mix stream where there is one, else the side), which the caller
 * then joins before the attention reads them (*kv_mix_out: the KV row went to the mix stream,
 * done at kv_join), and *iw_side whether an indexing layer's head weights (cu->iw, and their
 * scaling by 1/sqrt(heads)) went to the side stream too, done at side_mark: the main stream's
 * chain of short kernels (the index queries' product, their RoPE/FP4, the scores) then has
 * neither the scaling nor a wait before the head finish on it.
 * The side stream starts at the mHC collapse: the head weights beside the q_lora product and
 * its norm, then wq_b beside the compressor and the indexer. (Forked after the norm, the head
 * weights waited on the main stream: the layer's decode step at batch 1 3% slower in
 * bench_layer_cuda, bench/RESULTS.md session 25.) */
static bt_status_t queries_and_kv(fwd_t *f, int l, bool *two, bool *iw_side, bool *kv_mix_out)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    int N = f->N, D = c->hidden, hd = c->head_dim, H = m->hl, qlr = c->q_lora_rank;
    float eps = (float)c->rms_eps;
    bool comp = c->layer[l].compress_ratio > 0;
    const float *inv = comp ? cu->inv_comp : cu->inv_main;
    int half = comp ? m->half_comp : m->half_main;
    const bool side = two && side_ok(f, &w->wq_b, &w->wkv, NULL);
    if (two) *two = side;
    cudaStream_t s2 = side ? cu->side : cu->stream;
    const bt_layer_config_t *L = &c->layer[l];
    const bool iw = side && comp && L->is_index_source && L->index_key_owner >= 0 &&
                    side_ok_bf16(f, &w->i_weights_proj);
    if (iw_side) *iw_side = iw;
    if (side) CK(side_fork(f));
    if (iw) { /* the indexer's head weights first, scaled: the scores wait for them */
        CK(mm_on(f, ON_SIDE, cu->iw, c->index_heads, cu->xin, D, &w->i_weights_proj, N));
        CK(index_weights_scale(f, cu->side));
        CK_CUDA(cudaEventRecord(cu->side_mark, cu->side));
    }
    /* the KV row: on the mix stream once the collapse (queued on the main stream) is done,
     * joined where the side stream is (kv_mix) */
    const bool kv_mix = side && cu->xb_mix;
    if (kv_mix_out) *kv_mix_out = kv_mix;
    if (kv_mix) CK(stream_after(f, cu->mix, cu->stream, cu->kv_fork));
    CK(mm_on(f, kv_mix ? ON_MIX : side ? ON_SIDE : ON_MAIN, cu->kv, hd, cu->xin, D, &w->wkv, N));
    CK(bt_cuda_head_finish(cu->kv, N, 1, hd, 1, w->kv_norm, eps, half ? f->pos_d : NULL, inv, half,
                           32, BT_CUDA_FQ_FP8_UE8M0, kv_mix ? cu->mix : s2));
    if (kv_mix) CK_CUDA(cudaEventRecord(cu->kv_join, cu->mix));
    CK(mm(f, cu->q_res, qlr, cu->xin, D, &w->wq_a, N));
    CK(bt_cuda_rmsnorm(cu->q_res, BT_CUDA_F32, cu->q_res, BT_CUDA_F32, w->q_norm, N, qlr, eps,
                       cu->stream));
    if (side) CK(side_wait_main(f)); /* wq_b reads the normed q_res */
    CK(mm_on(f, side ? ON_SIDE : ON_MAIN, cu->q, H * hd, cu->q_res, qlr, &w->wq_b, N));
    if (half) CK(bt_cuda_rope(cu->q, BT_CUDA_F32, N, H, hd, f->pos_d, inv, half, 0, s2));
    return BT_OK;
}

static bt_status_t attention(fwd_t *f, int l)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const bt_layer_config_t *L = &c->layer[l];
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, D = c->hidden, hd = c->head_dim, H = m->hl /* this rank's heads */, qlr = c->q_lora_rank;
    int W = c->window;
    float eps = (float)c->rms_eps;
    bool comp = L->compress_ratio > 0;
    const float *inv = comp ? cu->inv_comp : cu->inv_main;
    int half = comp ? m->half_comp : m->half_main;
    attention_fn *attend = cu->att_tc ? bt_cuda_attention_tc_ws : bt_cuda_attention_ws;
    size_t row = (size_t)hd * sizeof(float);
    bool two, iw_side, kv_mix;
    CK(queries_and_kv(f, l, &two, &iw_side, &kv_mix));

    if (comp) {
        if (L->is_kv_source) {
            CK(mm(f, cu->ckv, hd, cu->xin, D, &w->c_wkv, N));
            if (w->c_wgate.kind) CK(mm(f, cu->cgate, hd, cu->xin, D, &w->c_wgate, N));
            if (f->undo) { /* the rows a rollback rebuilds an open group from (undo_collect) */
                size_t at = (size_t)l * cu->undo_rows * hd;
                CK(d2d(f, cu->undo_kv + at, cu->ckv, (size_t)N * row));
                if (w->c_wgate.kind) CK(d2d(f, cu->undo_gate + at, cu->cgate, (size_t)N * row));
            }
            CK(compress(f, l));
        }
        if (L->is_index_source && L->index_key_owner >= 0) {
            int ih = c->index_heads, ihd = c->index_head_dim;
            const int64_t *qpos = m->half_comp ? f->pos_d : NULL;
            /* a decode step's product and the queries' RoPE and FP4 rounding in one launch (the
             * same values) where the shape allows */
            const dev_mat_t *wq = &w->i_wq_b;
            const bool qfinish = wq->kind == MAT_FP8 && !fp8_via_cublas(cu, N) &&
                                 (size_t)N * qlr <= cu->xb_cap &&
                                 bt_cuda_gemm_fp8_qfinish_fits(N, ih * ihd, qlr, ihd);
            if (qfinish) {
                CK(product_rows(cu->xb, cu->q_res, N, qlr, qlr, wq->aq && qlr % 32 == 0, st));
                CK(bt_cuda_gemm_fp8_qfinish(cu->qi, cu->xb, (const uint8_t *)wq->w, wq->scale, N,
                                            ih * ihd, qlr, ihd, qpos, cu->inv_comp, m->half_comp,
                                            BT_CUDA_FQ_FP4_UE8M0, st));
            } else {
                CK(mm(f, cu->qi, ih * ihd, cu->q_res, qlr, wq, N));
            }
            if (!iw_side) CK(mm(f, cu->iw, ih, cu->xin, D, &w->i_weights_proj, N));
            if (!qfinish)
                CK(bt_cuda_head_finish(cu->qi, N, ih, ihd, 0, NULL, eps, qpos, cu->inv_comp,
                                       m->half_comp, 32, BT_CUDA_FQ_FP4_UE8M0, st));
            if (iw_side) /* made and scaled on the side stream (queries_and_kv) */
                CK_CUDA(cudaStreamWaitEvent(st, cu->side_mark, 0));
            else
                CK(index_weights_scale(f, st));
            CK(indexer(f, l));
        }
    }
    if (two) CK(side_join(f));
    if (two && kv_mix) CK_CUDA(cudaStreamWaitEvent(st, cu->kv_join, 0)); /* the KV row */

    /* a decode step: the new rows into their rings, then every token over its own sequence's
     * ring and compressed cache in one launch (offsets per token; each token's keys split as it
     * would be alone, so its result does not depend on the batch) */
    const float *rings = region(cu->mirror_mem, f->lay->window_off[l]);
    const float *comps = comp && L->kv_source >= 0 ? region(cu->mirror_mem, f->lay->comp_off[L->kv_source]) : NULL;
    bool in_place = f->decode_rows;
    if (in_place) {
        CK(bt_cuda_scatter_rows((float *)rings, f->ring_at_d, cu->kv, N, hd, st));
        const int32_t *sel_n = comps ? cu->topk_n : NULL;
        bool trimmed = false;
        for (int q = 0; q < f->n_seqs && comps; q++) {
            /* picks past the kv source's entries (a key owner ahead of it) are dropped */
            int64_t have = bt_kv_header(f->seqs[q].state)->entries[L->kv_source];
            if (!f->topk_set[q] || f->topk_bound[q] <= have) continue;
            if (!trimmed) CK(d2d(f, cu->sel_n, cu->topk_n, (size_t)N * sizeof(int32_t)));
            trimmed = true;
            int t = f->first[q];
            CK(bt_cuda_trim_sel(cu->sel_n + t, cu->topk + (size_t)t * c->index_topk, cu->topk_n + t,
                                c->index_topk, 1, have, st));
        }
        if (trimmed) sel_n = cu->sel_n;
        const bt_cuda_attention_batch_t batch = {f->slot_off_d, f->slot_off_d, true};
        CK(attend(cu->attn, cu->q, rings, f->win_idx_d, f->win_n_d, W, comps, comps ? cu->topk : NULL, sel_n,
                  c->index_topk, w->attn_sink, f->pos_d, inv, half, BT_CUDA_F32, N, H, hd, cu->att_ws,
                  cu->att_ws_cap, &batch, st));
    }

    /* else per sequence: its ring and its new rows staged side by side (rows [0, W) and
     * [W, W+n)), the window rows planned on the host once per forward index into that */
    for (int q = 0; q < f->n_seqs && !in_place; q++) {
        int n = f->seqs[q].n, first = f->first[q];
        bt_kv_header_t *h = bt_kv_header(f->seqs[q].state);
        float *stage = cu->win_stage + ((size_t)q * W + first) * hd;
        if (h->n_tokens > 0) CK(d2d(f, stage, region(f->dslot[q], f->lay->window_off[l]), (size_t)W * row));
        CK(d2d(f, stage + (size_t)W * hd, cu->kv + (size_t)first * hd, (size_t)n * row));
        const float *comp_kv = NULL;
        const int32_t *sel = NULL, *sel_n = NULL;
        if (comp && L->kv_source >= 0) { /* (no picks yet: topk_n 0) */
            comp_kv = region(f->dslot[q], f->lay->comp_off[L->kv_source]);
            sel = cu->topk + (size_t)first * c->index_topk;
            sel_n = cu->topk_n + first;
            int64_t have = h->entries[L->kv_source];
            /* picks past the kv source's entries (a key owner ahead of it) are dropped; a launch
             * only when some pick can be past them */
            if (f->topk_set[q] && f->topk_bound[q] > have) {
                CK(bt_cuda_trim_sel(cu->sel_n + first, sel, sel_n, c->index_topk, n, have, st));
                sel_n = cu->sel_n + first;
            }
        }
        if (cu->att_flash &&
            !f->undo) { /* the keys rounded to bf16 once, then every key read once a token */
            uint16_t *kv16 = cu->kv16 + ((size_t)q * W + first) * hd, *comp16 = NULL;
            CK(bt_cuda_to_bf16(kv16, stage, W + n, hd, hd, st)); /* (rows no index names: unread) */
            if (comp_kv) {
                /* every entry so far, each chunk of a long prompt again: ~6 bytes an entry
                 * and dim of traffic, against the attention's ~2.6 ms for 4096 tokens x 64
                 * heads; a bf16 mirror of the cache kept as entries are written would save it */
                int64_t have = h->entries[L->kv_source];
                if (have > 0) CK(bt_cuda_to_bf16(cu->comp16, comp_kv, (int)have, hd, hd, st));
                comp16 = cu->comp16;
            }
            CK(bt_cuda_attention_flash(
                cu->attn + (size_t)first * H * hd, cu->q + (size_t)first * H * hd, BT_CUDA_F32,
                kv16, f->win_idx_d + (size_t)first * W, f->win_n_d + first, W, comp16, sel, sel_n,
                c->index_topk, w->attn_sink, f->pos_d + first, inv, half, n, H, hd, NULL, st));
            continue;
        }
        /* a verification's rows attend as a decode step's tokens would, each alone */
        const bt_cuda_attention_batch_t alone = {NULL, NULL, true};
        CK(attend(cu->attn + (size_t)first * H * hd, cu->q + (size_t)first * H * hd, stage,
                  f->win_idx_d + (size_t)first * W, f->win_n_d + first, W, comp_kv, sel, sel_n,
                  c->index_topk, w->attn_sink, f->pos_d + first, inv, half, BT_CUDA_F32, n, H, hd,
                  cu->att_ws, cu->att_ws_cap, f->undo ? &alone : NULL, st));
    }
    CK(attention_out(f, l));
    /* the rings take the chunk's KV only now: earlier queries read older slots */
    return in_place ? BT_OK : ring_rows(f, l);
}

/* The rows of cu->kv into ring l of each sequence's slot at their positions (of a chunk, the
 * last window's). */
static bt_status_t ring_rows(fwd_t *f, int l)
{
    const bt_model_config_t *c = &f->m->cfg;
    int W = c->window, hd = c->head_dim;
    size_t row = (size_t)hd * sizeof(float);
    for (int q = 0; q < f->n_seqs; q++) {
        int n = f->seqs[q].n, first = f->first[q];
        int64_t start = bt_kv_header(f->seqs[q].state)->n_tokens;
        float *ring = region(f->dslot[q], f->lay->window_off[l]);
        for (int i = n > W ? n - W : 0; i < n;) {
            int at = (int)((start + i) % W), run = W - at < n - i ? W - at : n - i;
            bt_status_t rc = d2d(f, ring + (size_t)at * hd, f->cu->kv + (size_t)(first + i) * hd,
                                 (size_t)run * row);
            if (rc != BT_OK) return rc;
            i += run;
        }
    }
    return BT_OK;
}

/* Layer l's output projection of cu->attn into cu->out: the output groups, this rank's over its
 * own heads; or, when the groups do not split over the ranks, all of them over every rank's
 * heads ([rank][token][heads] gathered). */
static bt_status_t attention_out(fwd_t *f, int l)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, D = c->hidden, hd = c->head_dim, H = m->hl;
    int R = c->o_lora_rank, gin = c->n_heads * hd / c->o_groups;
    const float *a_src = cu->attn;
    int a_ld = H * hd, G = m->gl;
    if (cu->tp > 1 && !m->group_split) {
        size_t per = (size_t)H * hd;
        CK(tp_all_gather(f, cu->attn, (size_t)N * per * sizeof(float), false));
        for (int r = 0; r < cu->tp; r++)
            CK_CUDA(cudaMemcpy2DAsync(cu->attn_all + (size_t)r * per, (size_t)cu->tp * per * sizeof(float),
                                      cu->tp_recv + (size_t)r * N * per, per * sizeof(float), per * sizeof(float),
                                      (size_t)N, cudaMemcpyDeviceToDevice, st));
        a_src = cu->attn_all;
        a_ld = cu->tp * H * hd;
    }
    bool one_launch = w->wo_a.kind == MAT_FP8 && R % 32 == 0 && gin % 8 == 0 &&
                      !fp8_via_cublas(cu, N) && (size_t)N * G * gin <= cu->xb_cap;
    if (one_launch) {
        /* every group in one launch (a decode step): the heads converted once and read where
         * they lie, each group's R columns written in place; the per-group path takes
         * three launches a group (convert, multiply, copy into place) */
        CK(bt_cuda_to_bf16(cu->xb, a_src, N, G * gin, a_ld, st));
        CK(bt_cuda_gemm_fp8_batched(cu->oa, BT_CUDA_F32, G * R, R, cu->xb, G * gin, gin,
                                    (const uint8_t *)w->wo_a.w, w->wo_a.scale, G, N, R, gin, st));
    } else for (int g = 0; g < G; g++) {
        /* group g's rows of wo_a: a [R, gin] matrix of its own (FP8 blocks stay whole when R
         * is a multiple of 32) */
        dev_mat_t wg = w->wo_a;
        wg.N = R;
        if (wg.kind == MAT_FP8) {
            if (R % 32) {
                snprintf(err, errlen, "cuda forward: FP8 wo_a needs o_lora_rank a multiple of 32 (%d)", R);
                return BT_ERR_UNSUPPORTED;
            }
            wg.w = (uint8_t *)w->wo_a.w + (size_t)g * R * gin;
            wg.scale = w->wo_a.scale + (size_t)g * (R / 32) * ((gin + 31) / 32);
        } else {
            wg.w = (uint8_t *)w->wo_a.w + (size_t)g * R * gin * (wg.kind == MAT_F32 ? 4 : 2);
        }
        CK(mm(f, cu->oa + (size_t)g * R, G * R, a_src + (size_t)g * gin, a_ld, &wg, N));
    }
    CK(mm(f, cu->out, D, cu->oa, G * R, &w->wo_b, N));
    if (cu->tp > 1 && m->group_split) CK(tp_all_reduce(f, cu->out, (size_t)N * D));
    return BT_OK;
}

/* Whether layer l's routed rows are grouped on the device: packed FP4 experts and a decode-sized
 * batch (up to GRAPH_MAX_SEQS tokens: the few-row MMA kernel then takes every expert, as it does
 * on the host path, whose bound is the real largest group rather than N). */
static bool moe_on_device(const fwd_t *f, int l)
{
    const dev_layer_t *w = &f->cu->layer[l];
    return w->w13_q && f->cu->group_cap > 0 && f->N <= GRAPH_MAX_SEQS &&
           f->N * w->n_active <= f->cu->group_cap && w->n_experts <= BT_CUDA_MOE_GROUP_MAX;
}

/* The shared expert of layer l into cu->sh, on the side stream when side. */
static bt_status_t shared_expert(fwd_t *f, int l, bool side)
{
    struct bt_model_cuda *cu = f->cu;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    int N = f->N, D = f->m->cfg.hidden, I = f->m->il;
    const int on = side ? ON_SIDE : ON_MAIN;
    CK(mm_on(f, on, cu->sh_gu, 2 * I, cu->xin, D, &w->sw1, N));
    CK(mm_on(f, on, cu->sh_gu + I, 2 * I, cu->xin, D, &w->sw3, N));
    CK(bt_cuda_swiglu(cu->sh_h, BT_CUDA_F32, cu->sh_gu, NULL, N, I, (float)f->m->cfg.swiglu_limit,
                      side ? cu->side : cu->stream));
    return mm_on(f, on, cu->sh, D, cu->sh_h, I, &w->sw2, N);
}

/* The shared expert (or, side_started: its side stream joined), the routed outputs summed
 * per token (rows: each token's grouped rows in expert order, cnt: how many), and the TP
 * reduction. */
static bt_status_t moe_finish(fwd_t *f, int l, const int32_t *rows_d, const int32_t *cnt_d,
                              bool side_started)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, D = c->hidden, K = w->n_active;
    bool shared = w->sw1.kind != MAT_NONE;
    if (side_started)
        CK(side_join(f));
    else if (shared)
        CK(shared_expert(f, l, false));
    /* on one GPU, for fewer tokens than the one-pass expand takes (a decode step, a short
     * chunk): summed by the expand that follows (flush_expand), one launch fewer on the chain */
    if (cu->tp == 1 && N < BT_CUDA_HC_EC_MIN_TOKENS && bt_cuda_hc_expand_moe_on()) {
        f->moe_pending = true;
        f->moe_rows = rows_d;
        f->moe_cnt = cnt_d;
        f->moe_stride = K;
        f->moe_shared = shared ? cu->sh : NULL;
        return BT_OK;
    }
    CK(bt_cuda_moe_combine(cu->out, cu->yg, rows_d, cnt_d, K, shared ? cu->sh : NULL, N, D, st));
    /* each rank summed its slice of every expert's width */
    if (cu->tp > 1) CK(tp_all_reduce(f, cu->out, (size_t)N * D));
    return BT_OK;
}

/* The routed FP4 experts over grouped rows: expert e owns rows offs[e] .. of gu/yg, row r
 * reads token xrow[r]'s input; experts: the n_listed experts with rows (ids < 0 skipped),
 * max_rows: a bound on any expert's rows; wt: each row's routing weight (before w2). */
static bt_status_t fp4_experts(fwd_t *f, int l, const int32_t *xrow_d, const int32_t *offs_d,
                               const int32_t *experts_d, int n_listed, int max_rows, const float *wt_d)
{
    const bt_model_config_t *c = &f->m->cfg;
    struct bt_model_cuda *cu = f->cu;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, D = c->hidden, I = f->m->il, total = N * w->n_active;
    CK(product_rows(cu->xb, cu->xin, N, D, D, w->w13_aq, st));
    if (bt_cuda_gemm_fp4_swiglu_fits(I, D, max_rows)) { /* (one launch: see its header) */
        CK(bt_cuda_gemm_fp4_swiglu_list(cu->hb, BT_CUDA_BF16, cu->xb, xrow_d, offs_d, experts_d,
                                        n_listed, max_rows, w->w13_q, w->w13_s, I, D, wt_d,
                                        (float)c->swiglu_limit, st));
    } else {
        CK(bt_cuda_gemm_fp4_grouped_list(cu->gu, BT_CUDA_F32, cu->xb, xrow_d, offs_d, experts_d,
                                         n_listed, max_rows, w->w13_q, w->w13_s, 2 * I, D, st));
        CK(bt_cuda_swiglu(cu->hb, BT_CUDA_BF16, cu->gu, wt_d, total, I, (float)c->swiglu_limit,
                          st));
    }
    CK(round_rows(cu->hb, BT_CUDA_BF16, total, I, w->w2_aq, st));
    CK(bt_cuda_gemm_fp4_grouped_list(cu->yg, BT_CUDA_F32, cu->hb, NULL, offs_d, experts_d, n_listed, max_rows,
                                     w->w2_q, w->w2_s, D, I, st));
    return BT_OK;
}

static bt_status_t moe(fwd_t *f, int l)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    bt_cuda_blas_t *b = cu->blas;
    int N = f->N, D = c->hidden, E = w->n_experts, K = w->n_active,
        I = m->il; /* this rank's width */
    float limit = (float)c->swiglu_limit;

    /* the shared expert on the side stream beside routing and the routed experts when it may
     * (joined in moe_finish), forked once the router's product is done: beside that product it
     * slowed it (layer bench, H100: decode b1 0.2034 -> 0.2008 ms, b16 0.873 -> 0.855 forked
     * after it) */
    const bool two = w->sw1.kind != MAT_NONE && side_ok(f, &w->sw1, &w->sw3, &w->sw2);
    /* the router's logits: for a decode step's rows, a product split over the GPU (the same
     * bits in any batch); bt_cuda_gemm_f32 otherwise */
    if (cu->split_router && cu->router_ws && bt_cuda_moe_router_fits(N, E, D))
        CK(bt_cuda_moe_router_logits(cu->gate_logits, BT_CUDA_F32, cu->xin, D, w->gate_w, N, E, D,
                                     cu->router_ws, cu->router_ws_n, cu->router_ctr, st));
    else
        CK(bt_cuda_gemm_f32(b, cu->gate_logits, E, cu->xin, D, w->gate_w, N, E, D, st));
    if (two) {
        CK(side_fork(f));
        CK(shared_expert(f, l, true));
    }
    CK(bt_cuda_moe_route(cu->moe_idx, cu->moe_wts, cu->gate_logits, w->gate_bias, N, E, K,
                         (float)c->gate_temp, c->norm_topk_prob, (float)c->route_scale, st));
    if (moe_on_device(f, l)) {
        /* grouped on the device: no wait for the host, so a decode step can be one graph. The
         * expert list has a slot per routed row at most (padding skipped by the GEMMs), and an
         * expert holds each token once: N bounds its rows */
        int total = N * K, slots = E < total ? E : total;
        CK(bt_cuda_moe_group(cu->g_offs, cu->g_xrow, cu->g_wt, cu->g_rows, cu->g_cnt, cu->g_hit,
                             slots, cu->group_bad, l + 1, cu->moe_idx, cu->moe_wts, N, K, E, st));
        CK(fp4_experts(f, l, cu->g_xrow, cu->g_offs, cu->g_hit, slots, N, cu->g_wt));
        return moe_finish(f, l, cu->g_rows, cu->g_cnt, two);
    }
    /* the grouping by expert is planned on the host */
    CK_CUDA(cudaMemcpyAsync(cu->moe_idx_h, cu->moe_idx, (size_t)N * K * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    CK_CUDA(cudaMemcpyAsync(cu->moe_wts_h, cu->moe_wts, (size_t)N * K * sizeof(float), cudaMemcpyDeviceToHost, st));
    CK_CUDA(cudaStreamSynchronize(st));
    int64_t *xrow, *xrow_d;
    float *wt, *wt_d;
    int32_t *rows, *rows_d, *cnt, *cnt_d;
    PLAN(f, int64_t, N * K, xrow, xrow_d);
    PLAN(f, float, N * K, wt, wt_d);
    PLAN(f, int32_t, N * K, rows, rows_d);
    PLAN(f, int32_t, N, cnt, cnt_d);
    int off[1025];
    memset(off, 0, sizeof(int) * (size_t)(E + 1));
    for (int i = 0; i < N * K; i++) {
        int e = cu->moe_idx_h[i];
        if (e < 0 || e >= E) {
            snprintf(err, errlen, "cuda forward: layer %d routed a token to expert %d of %d", l, e, E);
            return BT_ERR_INTERNAL;
        }
        off[e + 1]++;
    }
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    memset(cnt, 0, (size_t)N * sizeof(int32_t));
    int fill[1024];
    memcpy(fill, off, sizeof(int) * (size_t)E);
    /* a counting sort: rows grouped by expert, tokens ascending within one; then each token's
     * list in expert order, the order the CPU sums them (linear in tokens, once per layer) */
    for (int t = 0; t < N; t++)
        for (int i = 0; i < K; i++) {
            int r = fill[cu->moe_idx_h[t * K + i]]++;
            xrow[r] = t;
            wt[r] = cu->moe_wts_h[t * K + i];
        }
    for (int r = 0; r < N * K; r++) rows[xrow[r] * K + cnt[xrow[r]]++] = r;
    int total = N * K;
    CK(plan_send(cu, wt, wt_d, (size_t)total * sizeof(float), err, errlen));
    CK(plan_send(cu, rows, rows_d, (size_t)total * sizeof(int32_t), err, errlen));
    CK(plan_send(cu, cnt, cnt_d, (size_t)N * sizeof(int32_t), err, errlen));
    if (w->w13_q) {
        /* packed FP4 experts, grouped: each expert's rows read their token's bf16 input */
        int32_t *row32, *row32_d, *offs, *offs_d, *hit, *hit_d;
        PLAN(f, int32_t, total, row32, row32_d);
        PLAN(f, int32_t, E + 1, offs, offs_d);
        PLAN(f, int32_t, E, hit, hit_d);
        for (int r = 0; r < total; r++) row32[r] = (int32_t)xrow[r];
        int max_rows = 0, n_hit = 0;
        for (int e = 0; e <= E; e++) {
            offs[e] = off[e];
            if (e < E && off[e + 1] > off[e]) hit[n_hit++] = e; /* blocks only for experts with rows */
            if (e < E && off[e + 1] - off[e] > max_rows) max_rows = off[e + 1] - off[e];
        }
        CK(plan_send(cu, row32, row32_d, (size_t)total * sizeof(int32_t), err, errlen));
        CK(plan_send(cu, offs, offs_d, (size_t)(E + 1) * sizeof(int32_t), err, errlen));
        CK(plan_send(cu, hit, hit_d, (size_t)n_hit * sizeof(int32_t), err, errlen));
        CK(fp4_experts(f, l, row32_d, offs_d, hit_d, n_hit, max_rows, wt_d));
    } else if (w->w13_bf) {
        /* bf16 experts, one cuBLASLt product per expert hit */
        CK(plan_send(cu, xrow, xrow_d, (size_t)total * sizeof(int64_t), err, errlen));
        CK(bt_cuda_gather_rows(cu->xg, cu->xin, xrow_d, total, D, st));
        if ((size_t)total * D > cu->xb_cap) {
            snprintf(err, errlen, "cuda forward: %d expert rows exceed the scratch", total);
            return BT_ERR_INTERNAL;
        }
        CK(product_rows(cu->xb, cu->xg, total, D, D, w->w13_aq, st));
        for (int e = 0; e < E; e++) {
            int rc = off[e + 1] - off[e];
            if (!rc) continue;
            CK(bt_cuda_gemm_bf16(b, cu->gu + (size_t)off[e] * 2 * I, BT_CUDA_F32, cu->xb + (size_t)off[e] * D,
                                 w->w13_bf + (size_t)e * 2 * I * D, rc, 2 * I, D, st));
        }
        CK(bt_cuda_swiglu(cu->hb, BT_CUDA_BF16, cu->gu, wt_d, total, I, limit, st));
        CK(round_rows(cu->hb, BT_CUDA_BF16, total, I, w->w2_aq, st));
        for (int e = 0; e < E; e++) {
            int rc = off[e + 1] - off[e];
            if (!rc) continue;
            CK(bt_cuda_gemm_bf16(b, cu->yg + (size_t)off[e] * D, BT_CUDA_F32, cu->hb + (size_t)off[e] * I,
                                 w->w2_bf + (size_t)e * D * I, rc, D, I, st));
        }
    } else {
        CK(plan_send(cu, xrow, xrow_d, (size_t)total * sizeof(int64_t), err, errlen));
        CK(bt_cuda_gather_rows(cu->xg, cu->xin, xrow_d, total, D, st));
        CK(round_rows(cu->xg, BT_CUDA_F32, total, D, w->w13_aq, st));
        for (int e = 0; e < E; e++) {
            int rc = off[e + 1] - off[e];
            if (!rc) continue;
            CK(bt_cuda_gemm_f32(b, cu->gu + (size_t)off[e] * 2 * I, 2 * I, cu->xg + (size_t)off[e] * D, D,
                                w->w13 + (size_t)e * 2 * I * D, rc, 2 * I, D, st));
        }
        CK(bt_cuda_swiglu(cu->hbuf, BT_CUDA_F32, cu->gu, wt_d, total, I, limit, st));
        CK(round_rows(cu->hbuf, BT_CUDA_F32, total, I, w->w2_aq, st));
        for (int e = 0; e < E; e++) {
            int rc = off[e + 1] - off[e];
            if (!rc) continue;
            CK(bt_cuda_gemm_f32(b, cu->yg + (size_t)off[e] * D, D, cu->hbuf + (size_t)off[e] * I, I,
                                w->w2 + (size_t)e * D * I, rc, D, I, st));
        }
    }
    return moe_finish(f, l, rows_d, cnt_d, two);
}

/* the main stream after the site's mix, when it went to the mix stream */
static bt_status_t join_mix(fwd_t *f)
{
    if (!f->mix_forked) return BT_OK;
    f->mix_forked = false;
    return stream_after(f, f->cu->stream, f->cu->mix, f->cu->mix_join);
}

/* The sublayer's output (cu->out) into the streams with the site's post and comb (its mix
 * joined): left pending for the collapse after it, which for many tokens does both in one pass
 * (one_pass); flush_expand does it alone, before anything else reads or writes the streams. */
static bt_status_t expand(fwd_t *f)
{
    f->expand_pending = true;
    return BT_OK;
}

static bt_status_t flush_expand(fwd_t *f)
{
    const bt_model_config_t *c = &f->m->cfg;
    struct bt_model_cuda *cu = f->cu;
    if (!f->expand_pending) return BT_OK;
    f->expand_pending = false;
    bt_status_t st = join_mix(f);
    if (st != BT_OK) return st;
    if (f->moe_pending) {
        f->moe_pending = false;
        return bt_cuda_hc_expand_moe(cu->x, cu->yg, f->moe_rows, f->moe_cnt, f->moe_stride,
                                     f->moe_shared, cu->post, cu->comb, f->N, c->hc_mult, c->hidden,
                                     cu->stream);
    }
    return bt_cuda_hc_expand(cu->x, cu->out, BT_CUDA_F32, cu->post, cu->comb, f->N, c->hc_mult,
                             c->hidden, cu->stream);
}

/* the MoE's output summed into cu->out where moe_finish left it to the expand */
static bt_status_t moe_out(fwd_t *f)
{
    struct bt_model_cuda *cu = f->cu;
    if (!f->moe_pending) return BT_OK;
    f->moe_pending = false;
    return bt_cuda_moe_combine(cu->out, cu->yg, f->moe_rows, f->moe_cnt, f->moe_stride,
                               f->moe_shared, f->N, f->m->cfg.hidden, cu->stream);
}

/* the pending expand and the next collapse in one pass: many tokens (a decode batch's two
 * launches measured faster) */
static bool one_pass(const fwd_t *f)
{
    return f->expand_pending && f->N >= BT_CUDA_HC_EC_MIN_TOKENS;
}

/* out = the streams, the pending expand first, collapsed by w and normed by norm_w */
static bt_status_t collapse_norm(fwd_t *f, float *out, const float *w, const float *norm_w)
{
    const bt_model_config_t *c = &f->m->cfg;
    struct bt_model_cuda *cu = f->cu;
    const int N = f->N, hc = c->hc_mult, D = c->hidden;
    bt_status_t st;
    if (!one_pass(f)) {
        if ((st = flush_expand(f)) != BT_OK) return st;
        return bt_cuda_hc_collapse_norm(out, BT_CUDA_F32, cu->x, w, norm_w, N, hc, D,
                                        (float)c->rms_eps, cu->stream);
    }
    f->expand_pending = false;
    if ((st = join_mix(f)) != BT_OK) return st;
    if ((st = moe_out(f)) != BT_OK) return st; /* (not left for many tokens; kept safe) */
    return bt_cuda_hc_expand_collapse(cu->x, cu->out, BT_CUDA_F32, cu->post, cu->comb, out,
                                      BT_CUDA_F32, w, norm_w, N, hc, D, (float)c->rms_eps,
                                      cu->stream);
}

/* One mHC site: the mapping from the streams (the pending expand first), then the sublayer
 * input collapsed with the previous site's pre. A decode-sized batch's mapping goes to the mix
 * stream (joined by the next expand): the collapse reads the earlier site's pre, so it need
 * not wait for this one. */
static bt_status_t site(fwd_t *f, const float *fn, const float *base, const float *scale,
                        float *pre_out, const float *collapse_w, const float *norm_w)
{
    const bt_model_config_t *c = &f->m->cfg;
    struct bt_model_cuda *cu = f->cu;
    char *err = f->err;
    size_t errlen = f->errlen;
    const int N = f->N, hc = c->hc_mult, D = c->hidden;
    if (one_pass(f)) { /* (the expand reads post and comb before this site's mix writes them) */
        CK(collapse_norm(f, cu->xin, collapse_w, norm_w));
        return bt_cuda_hc_mix_ws(pre_out, cu->post, cu->comb, cu->x, fn, base, scale, N, hc, D,
                                 (float)c->rms_eps, (float)c->hc_eps, c->sinkhorn_iters, cu->hc_ws,
                                 cu->hc_ws_cap, cu->stream);
    }
    CK(flush_expand(f));
    if (cu->mix && N <= GRAPH_MAX_SEQS) {
        CK(stream_after(f, cu->mix, cu->stream, cu->mix_fork));
        f->mix_forked = true;
        CK(bt_cuda_hc_mix_ws(pre_out, cu->post, cu->comb, cu->x, fn, base, scale, N, hc, D,
                             (float)c->rms_eps, (float)c->hc_eps, c->sinkhorn_iters, cu->hc_ws,
                             cu->hc_ws_cap, cu->mix));
        return bt_cuda_hc_collapse_norm(cu->xin, BT_CUDA_F32, cu->x, collapse_w, norm_w, N, hc, D,
                                        (float)c->rms_eps, cu->stream);
    }
    /* (a decode step's fold of the mix and the collapse share a launch) */
    CK(bt_cuda_hc_mix_collapse_ws(pre_out, cu->post, cu->comb, cu->x, fn, base, scale, N, hc, D,
                                  (float)c->rms_eps, (float)c->hc_eps, c->sinkhorn_iters, cu->hc_ws,
                                  cu->hc_ws_cap, cu->xin, BT_CUDA_F32, collapse_w, norm_w,
                                  (float)c->rms_eps, cu->stream));
    return BT_OK;
}

/* Finds (or makes) the mirror of each sequence's slot, uploading slots the GPU does not hold. */
static bt_status_t bind_mirrors(fwd_t *f)
{
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &f->m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    if (!cu->mirror_mem) {
        cu->slot_bytes = f->lay->slot_bytes;
        cu->n_mirrors = 2 * f->m->opt.max_batch_seqs;
        size_t bytes = cu->slot_bytes * (size_t)cu->n_mirrors;
        if (cudaMalloc((void **)&cu->mirror_mem, bytes) != cudaSuccess) {
            cudaGetLastError();
            snprintf(err, errlen, "GPU %d: cannot hold %d KV slots of %.1f MiB", cu->gpu, cu->n_mirrors,
                     (double)cu->slot_bytes / (1 << 20));
            return BT_ERR_NO_MEMORY;
        }
        cu->mirror = bt_calloc_or_die((size_t)cu->n_mirrors, sizeof(mirror_t));
        BT_LOG_INFO("GPU %d: KV cache for %d slots of %.1f MiB (%.1f MiB)", cu->gpu, cu->n_mirrors,
                    (double)cu->slot_bytes / (1 << 20), (double)bytes / (1 << 20));
    }
    if (f->lay->slot_bytes != cu->slot_bytes) {
        snprintf(err, errlen, "cuda forward: the KV layout changed (%zu-byte slots, %zu before)",
                 f->lay->slot_bytes, cu->slot_bytes);
        return BT_ERR_INVALID_ARG;
    }
    cu->clock++;
    for (int q = 0; q < f->n_seqs; q++) {
        uint8_t *state = f->seqs[q].state;
        uint64_t tag = bt_kv_header(state)->device_tag;
        int hit = -1;
        for (int i = 0; i < cu->n_mirrors && hit < 0; i++)
            if (cu->mirror[i].host == state) hit = i;
        if (hit >= 0 && (tag == 0 || cu->mirror[hit].tag != tag)) cu->mirror[hit].host = NULL, hit = -1;
        if (hit < 0) {
            /* the least recently used mirror not in this batch */
            for (int i = 0; i < cu->n_mirrors; i++) {
                if (cu->mirror[i].used == cu->clock) continue;
                if (hit < 0 || !cu->mirror[i].host || (cu->mirror[hit].host && cu->mirror[i].used < cu->mirror[hit].used))
                    hit = i;
            }
            uint8_t *dslot = cu->mirror_mem + (size_t)hit * cu->slot_bytes;
            bt_kv_header_t zero;
            memset(&zero, 0, sizeof zero);
            bt_kv_range_t rg[8 * BT_MAX_LAYERS + 8];
            int nr = bt_kv_changed_ranges(c, f->lay, &zero, state, rg, (int)(sizeof rg / sizeof rg[0]));
            for (int i = 0; i < nr; i++)
                if (rg[i].off != 0 && rg[i].len)
                    CK_CUDA(cudaMemcpyAsync(dslot + rg[i].off, state + rg[i].off, rg[i].len,
                                            cudaMemcpyHostToDevice, cu->stream));
            cu->mirror[hit].host = state;
            cu->mirror[hit].tag = 0;
        }
        cu->mirror[hit].used = cu->clock;
        f->dslot[q] = cu->mirror_mem + (size_t)hit * cu->slot_bytes;
    }
    return BT_OK;
}

/* A decode step that can run as one CUDA graph: one token per sequence, at most
 * GRAPH_MAX_SEQS of them, TP 1 (the TP collectives wait on the host), every layer's routed rows
 * grouped on the device, the logits in one chunk. */
static bool graph_step(const fwd_t *f)
{
    struct bt_model_cuda *cu = f->cu;
    if (!cu->graphs || cu->tp != 1 || f->N > GRAPH_MAX_SEQS || f->N > cu->logit_rows) return false;
    for (int q = 0; q < f->n_seqs; q++)
        if (f->seqs[q].n != 1) return false;
    for (int l = 0; l < f->m->cfg.n_layers; l++)
        if (!moe_on_device(f, l)) return false;
    return true;
}

/* Ends the capture of the current piece and launches it: into the most recently used
 * executable graph of this piece and batch size that takes it by cudaGraphExecUpdate (same
 * launches, other arguments), else into a newly instantiated one in place of the least recently
 * used. rc: the capture's own outcome. */
static bt_status_t graph_run(fwd_t *f, bt_status_t rc)
{
    struct bt_model_cuda *cu = f->cu;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaGraph_t g = NULL;
    if (!f->capturing) return rc != BT_OK ? rc : BT_ERR_INTERNAL;
    f->capturing = false;
    cudaError_t e = cudaStreamEndCapture(cu->stream, &g);
    if (rc != BT_OK || e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        if (rc == BT_OK) snprintf(err, errlen, "cuda forward: capturing the decode step: %s", cudaGetErrorString(e));
        return rc != BT_OK ? rc : BT_ERR_DEVICE;
    }
    cudaGraphExec_t *ex = cu->graph_exec[f->piece][f->N];
    uint64_t *used = cu->graph_used[f->piece][f->N];
    int pick = -1;
    bool tried[GRAPH_SLOTS] = {false};
    for (int round = 0; round < GRAPH_SLOTS && pick < 0; round++) {
        int best = -1; /* the most recent slot not tried yet */
        for (int i = 0; i < GRAPH_SLOTS; i++)
            if (ex[i] && !tried[i] && (best < 0 || used[i] > used[best])) best = i;
        if (best < 0) break;
        tried[best] = true;
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(ex[best], g, &info) == cudaSuccess) {
            pick = best;
            cu->graph_updates++;
        } else {
            cudaGetLastError(); /* a failed update leaves that graph as it was */
        }
    }
    if (pick < 0) {
        pick = 0;
        for (int i = 1; i < GRAPH_SLOTS; i++)
            if (!ex[i] || (ex[pick] && used[i] < used[pick])) pick = i;
        if (ex[pick]) cudaGraphExecDestroy(ex[pick]);
        ex[pick] = NULL;
        e = cudaGraphInstantiateWithFlags(&ex[pick], g,
                                          cu->prio ? cudaGraphInstantiateFlagUseNodePriority : 0);
        if (e != cudaSuccess) {
            ex[pick] = NULL;
            cudaGraphDestroy(g);
            cudaGetLastError();
            snprintf(err, errlen, "cuda forward: instantiating the decode step's graph: %s", cudaGetErrorString(e));
            return BT_ERR_DEVICE;
        }
        cu->graph_instances++;
    }
    used[pick] = ++cu->graph_clock;
    cudaGraphDestroy(g);
    CK_CUDA(cudaGraphLaunch(ex[pick], cu->stream));
    return BT_OK;
}

/* Between pieces: the captured layers run while the next piece is captured. */
static bt_status_t graph_cut(fwd_t *f)
{
    char *err = f->err;
    size_t errlen = f->errlen;
    CK(graph_run(f, BT_OK));
    f->piece++;
    CK_CUDA(cudaStreamBeginCapture(f->cu->stream, cudaStreamCaptureModeThreadLocal));
    f->capturing = true;
    return BT_OK;
}

/* DSpark's context rows main_x = main_norm(main_proj(captured streams)), every token's, and from
 * them each draft stage's window-ring entry as the stage's own KV row would be (kv_norm, RoPE
 * at the position, FP8 rounding; model.c draft_rings): a decode step's rows where they lie,
 * else each sequence's last window of rows. */
static bt_status_t draft_rings(fwd_t *f)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, D = c->hidden, hd = c->head_dim;
    float eps = (float)c->rms_eps;
    CK(mm(f, cu->main_x, D, cu->main_hidden, c->n_draft_targets * D, &cu->main_proj, N));
    CK(bt_cuda_rmsnorm(cu->main_x, BT_CUDA_F32, cu->main_x, BT_CUDA_F32, cu->main_norm, N, D, eps,
                       st));
    for (int j = 0; j < c->n_draft; j++) {
        int l = c->n_layers + j;
        const dev_layer_t *w = &cu->layer[l];
        CK(mm(f, cu->kv, hd, cu->main_x, D, &w->wkv, N));
        CK(bt_cuda_head_finish(cu->kv, N, 1, hd, 1, w->kv_norm, eps, m->half_main ? f->pos_d : NULL,
                               cu->inv_main, m->half_main, 32, BT_CUDA_FQ_FP8_UE8M0, st));
        if (f->decode_rows)
            CK(bt_cuda_scatter_rows(region(cu->mirror_mem, f->lay->window_off[l]), f->ring_at_d,
                                    cu->kv, N, hd, st));
        else
            CK(ring_rows(f, l));
    }
    return BT_OK;
}

/* Logits of `rows` hidden rows x under TP: each rank scores its vocabulary rows, the slices
 * gathered [rank][row][vpad]; whole: laid out again as whole rows in dlogits, else left in
 * tp_host for the host to lay out. */
static bt_status_t tp_logits(fwd_t *f, const float *x, int rows, bool whole)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    size_t V = (size_t)m->cfg.vocab, vpad = (size_t)m->vpad;
    CK_CUDA(cudaMemsetAsync(cu->dlogits, 0, (size_t)rows * vpad * sizeof(float), st));
    if (m->vl > 0)
        CK(bt_cuda_gemm_f32(cu->blas, cu->dlogits, (int)vpad, x, m->cfg.hidden, cu->head, rows,
                            m->vl, m->cfg.hidden, st));
    CK(tp_all_gather(f, cu->dlogits, (size_t)rows * vpad * sizeof(float), !whole));
    for (int r = 0; r < cu->tp && whole; r++) {
        size_t v0 = (size_t)r * vpad;
        if (v0 >= V) continue;
        size_t vl = V - v0 < vpad ? V - v0 : vpad;
        CK_CUDA(cudaMemcpy2DAsync(cu->dlogits + v0, V * sizeof(float),
                                  cu->tp_recv + (size_t)r * rows * vpad, vpad * sizeof(float),
                                  vl * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice, st));
    }
    return BT_OK;
}

/* The forward's launches, from the plans to the logits: eager, or captured into a graph
 * (f->graph; then the logits stay in cu->dlogits). */
static bt_status_t forward_body(fwd_t *f, float *logits, bt_kv_header_t *before)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, W = c->window, hc = c->hc_mult, D = c->hidden;

    if (cu->group_cap > 0) CK_CUDA(cudaMemsetAsync(cu->group_bad, 0, sizeof(int32_t), st));
    int32_t *ids, *ids_d, *win_n;
    int64_t *pos;
    int32_t *win_idx;
    PLAN(f, int32_t, N, ids, ids_d);
    PLAN(f, int64_t, N, pos, f->pos_d);
    PLAN(f, int32_t, (size_t)N * W, win_idx, f->win_idx_d);
    PLAN(f, int32_t, N, win_n, f->win_n_d);
    /* a decode step reads the rings in place: slots and every layer's caches keep whole rows
     * 16-byte aligned (the tensor-core kernel's loads; the layout aligns them wider) */
    f->decode_rows = W > 0 && cu->slot_bytes % 16 == 0;
    for (int l = 0; l < c->n_layers && f->decode_rows; l++)
        if (f->lay->window_off[l] % 16 || f->lay->comp_off[l] % 16) f->decode_rows = false;
    for (int q = 0; q < f->n_seqs; q++)
        if (f->seqs[q].n != 1) f->decode_rows = false;
    int64_t *slot_off = NULL, *ring_at = NULL;
    if (f->decode_rows) {
        PLAN(f, int64_t, N, slot_off, f->slot_off_d);
        PLAN(f, int64_t, N, ring_at, f->ring_at_d);
    }
    for (int q = 0; q < f->n_seqs; q++) {
        const bt_forward_seq_t *seq = &f->seqs[q];
        int64_t start = bt_kv_header(seq->state)->n_tokens;
        before[q] = *bt_kv_header(seq->state);
        for (int i = 0; i < seq->n; i++) {
            int t = f->first[q] + i;
            int64_t p = start + i, lo = p - W + 1 > 0 ? p - W + 1 : 0;
            /* under TP the owner of the row embeds it, the others zeros (-1), then a sum */
            int id = seq->ids[i] - m->v0;
            ids[t] = id >= 0 && id < m->vl ? id : -1;
            pos[t] = p;
            win_n[t] = (int32_t)(p - lo + 1);
            /* a decode step: the ring's slots, the token's own row written into its slot first
             * (that slot's old row has just left the window); else staged rows: the ring at
             * [0, W), the chunk's own rows from W */
            for (int j = 0; j < win_n[t]; j++) {
                int64_t kp = lo + j;
                win_idx[(size_t)t * W + j] =
                    (int32_t)(f->decode_rows || kp < start ? kp % W : W + (kp - start));
            }
            if (f->decode_rows) {
                slot_off[t] = (int64_t)((f->dslot[q] - cu->mirror_mem) / sizeof(float));
                ring_at[t] = slot_off[t] + (int64_t)(p % W) * c->head_dim;
            }
        }
    }
    if (f->decode_rows) {
        CK(plan_send(cu, slot_off, f->slot_off_d, (size_t)N * sizeof(int64_t), err, errlen));
        CK(plan_send(cu, ring_at, f->ring_at_d, (size_t)N * sizeof(int64_t), err, errlen));
    }
    /* no published picks yet reads as none, in either attention path: a compressed layer's
     * launch then has the same key lists, hence the same splits, for a token with or without
     * picks, in a decode batch or beside a prefill chunk */
    CK_CUDA(cudaMemsetAsync(cu->topk_n, 0, (size_t)N * sizeof(int32_t), st));
    CK(plan_send(cu, ids, ids_d, (size_t)N * sizeof(int32_t), err, errlen));
    CK(plan_send(cu, pos, f->pos_d, (size_t)N * sizeof(int64_t), err, errlen));
    CK(plan_send(cu, win_idx, f->win_idx_d, (size_t)N * W * sizeof(int32_t), err, errlen));
    CK(plan_send(cu, win_n, f->win_n_d, (size_t)N * sizeof(int32_t), err, errlen));
    if (c->n_engram > 0) {
        int cols = m->engram_cols, ne = c->n_engram;
        bt_model__engram_hashes(m, f->seqs, f->n_seqs, f->first, cu->cid_h, cu->hash_h);
        int64_t *eng;
        PLAN(f, int64_t, (size_t)ne * N * cols, eng, f->eng_ids_d);
        for (int e = 0; e < ne; e++)
            for (int t = 0; t < N; t++)
                memcpy(eng + ((size_t)e * N + t) * cols, cu->hash_h + ((size_t)t * ne + e) * cols,
                       (size_t)cols * sizeof(int64_t));
        CK(plan_send(cu, eng, f->eng_ids_d, (size_t)ne * N * cols * sizeof(int64_t), err, errlen));
    }

    CK(bt_cuda_embed_streams(cu->x, cu->pre_mix, cu->embed, ids_d, N, hc, D, st));
    if (cu->tp > 1) CK(tp_all_reduce(f, cu->x, (size_t)N * hc * D));
    for (int l = 0; l < c->n_layers; l++) {
        const dev_layer_t *w = &cu->layer[l];
        int ei = c->layer[l].engram_index;
        /* (the last layer's expand waits for this one's collapse unless these come first) */
        if (ei >= 0 || m->target_slot[l] >= 0) CK(flush_expand(f));
        if (ei >= 0) {
            int cols = m->engram_cols, ehd = c->engram_head_dim;
            const int64_t *ids_e = f->eng_ids_d + (size_t)ei * N * cols;
            if (w->e_embed_q)
                CK(bt_cuda_engram_gather(cu->e_cat, BT_CUDA_F32, ids_e, N, cols, w->e_embed_q, w->e_embed_s,
                                         c->engram_rows[ei], ehd, st));
            else
                CK(bt_cuda_gather_rows(cu->e_cat, w->e_embed, ids_e, N * cols, ehd, st));
            CK(mm(f, cu->e_kv, (hc + 1) * D, cu->e_cat, cols * ehd, &w->e_wkv, N));
            CK(bt_cuda_engram_inject(cu->x, cu->e_kv, w->e_qk, N, hc, D, (float)c->rms_eps, st));
        }
        if (m->target_slot[l] >= 0) /* DSpark's context: the streams entering the layer, averaged */
            CK(bt_cuda_hc_collapse(cu->main_hidden + (size_t)m->target_slot[l] * D,
                                   (int64_t)c->n_draft_targets * D, cu->x, NULL, N, hc, D, st));
        CK(site(f, w->hc_attn_fn, w->hc_attn_base, w->hc_attn_scale, cu->attn_pre, cu->pre_mix, w->attn_norm));
        CK(attention(f, l));
        CK(expand(f));
        /* the FFN collapses with the attention site's pre; its own pre goes to the next layer */
        CK(site(f, w->hc_ffn_fn, w->hc_ffn_base, w->hc_ffn_scale, cu->pre_mix, cu->attn_pre, w->ffn_norm));
        CK(moe(f, l));
        CK(expand(f));
        /* pieces end after layers 0, 2, 6, 14, ...: l + 2 a power of two */
        if (f->graph && ((l + 2) & (l + 1)) == 0 && l + 1 < c->n_layers &&
            f->piece + 1 < GRAPH_PIECES) {
            CK(flush_expand(f));
            CK(graph_cut(f));
        }
    }
    CK(collapse_norm(f, cu->hidden, cu->pre_mix, cu->norm));
    if (c->n_draft) CK(draft_rings(f));

    if (logits || f->draw) {
        int64_t *hrow, *hrow_d;
        PLAN(f, int64_t, N, hrow, hrow_d);
        int rows = 0;
        for (int q = 0; q < f->n_seqs; q++)
            for (int i = f->seqs[q].all_logits ? 0 : f->seqs[q].n - 1; i < f->seqs[q].n; i++)
                hrow[rows++] = f->first[q] + i;
        CK(plan_send(cu, hrow, hrow_d, (size_t)rows * sizeof(int64_t), err, errlen));
        f->logit_rows = rows;
        size_t V = (size_t)c->vocab, vpad = (size_t)m->vpad;
        for (int r0 = 0; r0 < rows; r0 += cu->logit_rows) {
            int rc = rows - r0 < cu->logit_rows ? rows - r0 : cu->logit_rows;
            CK(bt_cuda_gather_rows(cu->hsel, cu->hidden, hrow_d + r0, rc, D, st));
            if (cu->tp == 1) {
                CK(bt_cuda_gemm_f32(cu->blas, cu->dlogits, (int)V, cu->hsel, D, cu->head, rc, (int)V, D, st));
                /* a graph's rows (one chunk) are copied out after it ran: host memory the caller
                 * passes is not a graph's to write */
                if (!f->graph && logits)
                    CK_CUDA(cudaMemcpyAsync(logits + (size_t)r0 * V, cu->dlogits, (size_t)rc * V * sizeof(float),
                                            cudaMemcpyDeviceToHost, st));
                continue;
            }
            /* rows whole again in dlogits for the draws (one chunk), else laid out on the host */
            CK(tp_logits(f, cu->hsel, rc, f->draw != NULL));
            if (f->draw) continue;
            for (int i = 0; i < rc; i++)
                for (int r = 0; r < cu->tp; r++) {
                    size_t v0 = (size_t)r * vpad;
                    if (v0 >= V) continue;
                    size_t vl = V - v0 < vpad ? V - v0 : vpad;
                    memcpy(logits + (size_t)(r0 + i) * V + v0, cu->tp_host + ((size_t)r * rc + i) * vpad,
                           vl * sizeof(float));
                }
        }
    }

    return BT_OK;
}

/* A pinned host buffer and its device twin with room for `need` elements of `elem` bytes: if
 * they have fewer (*cap), both are freed and made anew for `grow` (>= need); false when the
 * memory is not there (then both NULL, *cap 0). The old ones must no longer be read. */
static bool pinned_pair_reserve(void **h, void **d, size_t *cap, size_t need, size_t grow,
                                size_t elem)
{
    if (need <= *cap) return true;
    cudaFreeHost(*h);
    cudaFree(*d);
    *h = *d = NULL;
    *cap = 0;
    if (cudaMallocHost(h, grow * elem) != cudaSuccess ||
        cudaMalloc(d, grow * elem) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    *cap = grow;
    return true;
}

/* Room for n ranges and `bytes` packed bytes in copy_home's buffers (grown by half again
 * over the need, so a growing batch does not reallocate every step); false when the memory is
 * not there. */
static bool home_reserve(struct bt_model_cuda *cu, int n, size_t bytes)
{
    if ((size_t)n > cu->home_rg_cap) {
        free(cu->home_dst);
        cu->home_dst = NULL;
        const size_t cap = (size_t)n + (size_t)n / 2;
        if (!pinned_pair_reserve((void **)&cu->home_rg_h, (void **)&cu->home_rg_d, &cu->home_rg_cap,
                                 (size_t)n, cap, sizeof(bt_cuda_copy_t)) ||
            !(cu->home_dst = malloc(cap * sizeof *cu->home_dst))) {
            cu->home_rg_cap = 0;
            return false;
        }
    }
    return pinned_pair_reserve((void **)&cu->home_h, (void **)&cu->home_d, &cu->home_cap, bytes,
                               bytes + bytes / 2, 1);
}

/* What the forward wrote in each sequence's mirror (bt_kv_changed_ranges from `before`, the
 * headers already advanced), copied into its host slot: packed on the GPU by one kernel,
 * brought over in one copy into pinned memory, spread on the host. A copy per range into the
 * (pageable) slots costs microseconds each, and a decode step has hundreds: a window row per
 * layer and sequence, the open compressor groups, new compressed entries. Without room for
 * the staging buffers, those copies. Leaves the stream synchronized. */
static bt_status_t copy_home(fwd_t *f, bt_kv_header_t *before)
{
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &f->m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    enum { PER_SEQ = 8 * BT_MAX_LAYERS + 8 };
    if (f->n_seqs > cu->home_seqs) { /* (kept: ~16 KB a sequence, every forward) */
        free(cu->home_ranges);
        cu->home_ranges = malloc((size_t)f->n_seqs * (PER_SEQ * sizeof(bt_kv_range_t) + sizeof(int)));
        cu->home_seqs = cu->home_ranges ? f->n_seqs : 0;
        if (!cu->home_ranges) {
            snprintf(err, errlen, "cuda forward: out of host memory for the KV ranges");
            return BT_ERR_NO_MEMORY;
        }
    }
    bt_kv_range_t *rg = cu->home_ranges;
    int *nr = (int *)(rg + (size_t)f->n_seqs * PER_SEQ);
    int n = 0;
    size_t bytes = 0;
    for (int q = 0; q < f->n_seqs; q++) {
        bt_kv_range_t *r = rg + (size_t)q * PER_SEQ;
        nr[q] = bt_kv_changed_ranges(c, f->lay, &before[q], f->seqs[q].state, r, PER_SEQ);
        for (int i = 0; i < nr[q]; i++)
            if (r[i].off != 0 && r[i].len) { /* (the header is the host's own) */
                n++;
                bytes += (r[i].len + 15) / 16 * 16;
            }
    }
    bt_status_t rc = BT_OK;
    if (n > 0 && home_reserve(cu, n, bytes)) {
        int k = 0;
        size_t at = 0;
        for (int q = 0; q < f->n_seqs; q++) {
            const bt_kv_range_t *r = rg + (size_t)q * PER_SEQ;
            for (int i = 0; i < nr[q]; i++) {
                if (r[i].off == 0 || !r[i].len) continue;
                cu->home_rg_h[k] = (bt_cuda_copy_t){f->dslot[q] + r[i].off, cu->home_d + at, r[i].len};
                cu->home_dst[k++] = f->seqs[q].state + r[i].off;
                at += (r[i].len + 15) / 16 * 16; /* (16-byte units where the rows allow) */
            }
        }
        cudaError_t e = cudaMemcpyAsync(cu->home_rg_d, cu->home_rg_h, (size_t)n * sizeof(bt_cuda_copy_t),
                                        cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess && (rc = bt_cuda_copy_ranges(cu->home_rg_d, n, st)) == BT_OK)
            e = cudaMemcpyAsync(cu->home_h, cu->home_d, at, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess && rc == BT_OK) e = cudaStreamSynchronize(st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "cuda forward: bringing the KV writes home: %s", cudaGetErrorString(e));
            cudaGetLastError();
            rc = BT_ERR_DEVICE;
        } else if (rc != BT_OK) {
            snprintf(err, errlen, "cuda forward: bt_cuda_copy_ranges failed (%s)", bt_status_str(rc));
        } else {
            for (int i = 0; i < n; i++)
                memcpy(cu->home_dst[i], cu->home_h + ((uint8_t *)cu->home_rg_h[i].dst - cu->home_d), cu->home_rg_h[i].len);
        }
    } else {
        for (int q = 0; q < f->n_seqs && rc == BT_OK; q++) {
            const bt_kv_range_t *r = rg + (size_t)q * PER_SEQ;
            for (int i = 0; i < nr[q]; i++) {
                if (r[i].off == 0 || !r[i].len) continue;
                cudaError_t e = cudaMemcpyAsync(f->seqs[q].state + r[i].off, f->dslot[q] + r[i].off, r[i].len,
                                                cudaMemcpyDeviceToHost, st);
                if (e != cudaSuccess) {
                    snprintf(err, errlen, "cuda forward: copying a KV range home: %s", cudaGetErrorString(e));
                    cudaGetLastError();
                    rc = BT_ERR_DEVICE;
                    break;
                }
            }
        }
        if (rc == BT_OK && cudaStreamSynchronize(st) != cudaSuccess) {
            snprintf(err, errlen, "cuda forward: %s", cudaGetErrorString(cudaGetLastError()));
            rc = BT_ERR_DEVICE;
        }
    }
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The draws of a forward (f->draw), a row a sequence (bt_model_cuda_draws: one chunk of
 * dlogits, whole rows): the settings up, the rows' adjustments (penalties, logit_bias), the
 * sampler, the results down; read by draws_collect once the stream is done. */
static bt_status_t draws_launch(fwd_t *f)
{
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &f->m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int n_adj = 0;
    for (int q = 0; q < f->n_seqs; q++) {
        const bt_sample_req_t *r = &f->draw->req[q];
        cu->draw_p_h[q] = (bt_cuda_sample_params_t){
            .temperature = r->sampling.temperature, .top_p = r->sampling.top_p,
            .min_p = r->sampling.min_p, .top_k = r->sampling.top_k, .seed = r->sampling.seed,
            .step = r->step, .want_logprob = r->want_logprob, .n_top = r->n_top};
        n_adj += r->n_adj;
    }
    CK_CUDA(cudaMemcpyAsync(cu->draw_p_d, cu->draw_p_h, (size_t)f->n_seqs * sizeof *cu->draw_p_h,
                            cudaMemcpyHostToDevice, st));
    if (n_adj > 0) {
        if ((size_t)n_adj > cu->adj_cap) {
            CK_CUDA(cudaStreamSynchronize(st)); /* (the old buffers may still be read) */
            if (!pinned_pair_reserve((void **)&cu->adj_h, (void **)&cu->adj_d, &cu->adj_cap,
                                     (size_t)n_adj, (size_t)n_adj + n_adj / 2 + 256,
                                     sizeof *cu->adj_h)) {
                snprintf(err, errlen, "cuda: no memory for %d logit adjustments", n_adj);
                return BT_ERR_DEVICE;
            }
        }
        for (int q = 0, k = 0; q < f->n_seqs; q++) {
            const bt_sample_req_t *r = &f->draw->req[q];
            for (int i = 0; i < r->n_adj; i++) cu->adj_h[k++] = (bt_cuda_logit_adjust_t){q, r->adj_ids[i], r->adj[i]};
        }
        CK_CUDA(cudaMemcpyAsync(cu->adj_d, cu->adj_h, (size_t)n_adj * sizeof *cu->adj_h, cudaMemcpyHostToDevice, st));
        CK(bt_cuda_logit_adjust(cu->dlogits, c->vocab, cu->adj_d, n_adj, st));
    }
    bool masked = false;
    for (int q = 0; q < f->n_seqs; q++)
        masked |= f->draw->req[q].allow != NULL;
    if (masked) { /* a row each (all ones for rows without one), after the adjustments */
        const int words = (f->draw->vocab + 31) / 32;
        const size_t need = (size_t)f->n_seqs * (size_t)words;
        if (need > cu->mask_cap) {
            CK_CUDA(cudaStreamSynchronize(st)); /* (the old buffers may still be read) */
            if (!pinned_pair_reserve((void **)&cu->mask_h, (void **)&cu->mask_d, &cu->mask_cap,
                                     need, (size_t)f->m->opt.max_batch_seqs * (size_t)words,
                                     sizeof *cu->mask_h)) {
                snprintf(err, errlen, "cuda: no memory for %d masks of %d words", f->n_seqs, words);
                return BT_ERR_DEVICE;
            }
        }
        for (int q = 0; q < f->n_seqs; q++) {
            uint32_t *row = cu->mask_h + (size_t)q * words;
            if (f->draw->req[q].allow)
                memcpy(row, f->draw->req[q].allow, (size_t)words * sizeof *row);
            else
                memset(row, 0xff, (size_t)words * sizeof *row);
        }
        CK_CUDA(cudaMemcpyAsync(cu->mask_d, cu->mask_h, need * sizeof *cu->mask_h,
                                cudaMemcpyHostToDevice, st));
        CK(bt_cuda_logit_mask(cu->dlogits, c->vocab, cu->mask_d, words, f->n_seqs, f->draw->vocab,
                              st));
    }
    CK(bt_cuda_sample_rows(cu->draw_r_d, cu->draw_p_d, cu->dlogits, c->vocab, f->n_seqs, f->draw->vocab, st));
    CK_CUDA(cudaMemcpyAsync(cu->draw_r_h, cu->draw_r_d, (size_t)f->n_seqs * sizeof *cu->draw_r_h,
                            cudaMemcpyDeviceToHost, st));
    return BT_OK;
}

/* The draws' results into the caller's (after the stream is done: copy_home waits for it). */
static void draws_collect(fwd_t *f)
{
    struct bt_model_cuda *cu = f->cu;
    cu->draws += (uint64_t)f->n_seqs;
    for (int q = 0; q < f->n_seqs; q++) {
        const bt_cuda_sample_result_t *r = &cu->draw_r_h[q];
        bt_sample_out_t *o = &f->draw->out[q];
        o->id = r->id;
        o->logprob = r->logprob;
        for (int k = 0; k < BT_SAMPLE_TOP_MAX; k++)
            o->top[k] = k < BT_CUDA_SAMPLE_TOP ? (bt_top_logprob_t){r->top_id[k], r->top_logprob[k]}
                                                : (bt_top_logprob_t){-1, 0.0f};
    }
}

/* A verification's compressor rows into its sequences' undo records (the stream is done). */
static void undo_collect(fwd_t *f)
{
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &f->m->cfg;
    size_t hd = (size_t)c->head_dim, half = (size_t)c->n_layers * cu->undo_rows * hd;
    for (int q = 0; q < f->n_seqs; q++) {
        bt_kv_undo_t *u = f->seqs[q].undo;
        if (!u) continue;
        for (int l = 0; l < c->n_layers; l++) {
            const float *kv = cu->undo_h + ((size_t)l * cu->undo_rows + f->first[q]) * hd;
            size_t bytes = (size_t)f->seqs[q].n * hd * sizeof(float);
            if (u->row_kv[l]) memcpy(u->row_kv[l], kv, bytes);
            if (u->row_gate[l]) memcpy(u->row_gate[l], kv + half, bytes);
        }
    }
}

static bt_status_t forward(fwd_t *f, float *logits, bt_kv_header_t *before)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;

    const double t0 = now_s();
    CK(bind_mirrors(f));
    f->graph = graph_step(f);
    if (f->graph) {
        CK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        f->capturing = true;
    }
    bt_status_t rc = forward_body(f, logits, before);
    const double t1 = now_s();
    if (f->graph) {
        rc = graph_run(f, rc);
        if (rc == BT_OK) cu->graph_steps++;
    }
    if (rc != BT_OK) return rc;
    const double t2 = now_s();
    if (f->graph && logits && f->logit_rows > 0)
        CK_CUDA(cudaMemcpyAsync(logits, cu->dlogits, (size_t)f->logit_rows * c->vocab * sizeof(float),
                                cudaMemcpyDeviceToHost, st));
    if (f->draw) CK(draws_launch(f));
    if (f->undo) { /* every layer's first N compressor rows, home with the KV (undo_collect) */
        size_t hd = (size_t)c->head_dim, pitch = (size_t)cu->undo_rows * hd * sizeof(float);
        size_t half = (size_t)c->n_layers * cu->undo_rows * hd;
        CK_CUDA(cudaMemcpy2DAsync(cu->undo_h, pitch, cu->undo_kv, pitch,
                                  (size_t)f->N * hd * sizeof(float), (size_t)c->n_layers,
                                  cudaMemcpyDeviceToHost, st));
        CK_CUDA(cudaMemcpy2DAsync(cu->undo_h + half, pitch, cu->undo_gate, pitch,
                                  (size_t)f->N * hd * sizeof(float), (size_t)c->n_layers,
                                  cudaMemcpyDeviceToHost, st));
    }
    if (cu->group_cap > 0)
        CK_CUDA(cudaMemcpyAsync(cu->group_bad_h, cu->group_bad, sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    /* advance the sequences (engram history, positions), copy what the forward wrote back into
     * the host slots, and tag both copies */
    for (int q = 0; q < f->n_seqs; q++) {
        const bt_forward_seq_t *seq = &f->seqs[q];
        bt_kv_header_t *h = bt_kv_header(seq->state);
        if (c->n_engram > 0)
            for (int i = 0; i < seq->n; i++)
                h->engram_hist[(h->n_tokens + i) % BT_KV_ENGRAM_HISTORY] = cu->cid_h[f->first[q] + i];
        h->n_tokens += seq->n;
    }
    bt_status_t hrc = copy_home(f, before);
    if (hrc != BT_OK) return hrc;
    bool decode = true;
    for (int q = 0; q < f->n_seqs; q++) decode = decode && f->seqs[q].n == 1;
    const int kind = f->graph ? FWD_GRAPH : decode ? FWD_DECODE : FWD_OTHER;
    cu->t_host[kind][0] += t1 - t0;
    cu->t_host[kind][1] += t2 - t1;
    cu->t_host[kind][2] += now_s() - t2;
    cu->n_fwd[kind]++;
    if (cu->group_cap > 0 && *cu->group_bad_h) {
        snprintf(err, errlen, "cuda forward: layer %d routed a token to an expert outside 0..%d",
                 *cu->group_bad_h - 1, cu->layer[*cu->group_bad_h - 1].n_experts - 1);
        return BT_ERR_INTERNAL;
    }
    if (f->draw) draws_collect(f);
    if (f->undo) undo_collect(f);
    for (int q = 0; q < f->n_seqs; q++) {
        uint64_t tag = cu->tag_base | (++cu->tags & 0xffffffffull);
        if (tag == 0) tag = cu->tag_base | (++cu->tags & 0xffffffffull);
        bt_kv_header(f->seqs[q].state)->device_tag = tag;
        for (int i = 0; i < cu->n_mirrors; i++)
            if (cu->mirror[i].host == f->seqs[q].state) cu->mirror[i].tag = tag;
    }
    return BT_OK;
}

bt_status_t bt_model_cuda_forward(bt_model_t *m, const bt_kv_layout_t *lay,
                                  const bt_forward_seq_t *seqs, int n_seqs, const int *seq_first,
                                  int n_tokens, float *logits, const bt_model_draw_t *draw,
                                  char *err, size_t errlen)
{
    struct bt_model_cuda *cu = m->cuda;
    fwd_t f;
    memset(&f, 0, sizeof f);
    f.m = m;
    f.cu = cu;
    f.lay = lay;
    f.seqs = seqs;
    f.n_seqs = n_seqs;
    f.N = n_tokens;
    f.first = seq_first;
    f.draw = draw;
    f.err = err;
    f.errlen = errlen;
    for (int q = 0; q < n_seqs; q++)
        f.undo |= seqs[q].undo != NULL;
    if (f.undo && n_tokens > cu->undo_rows) {
        snprintf(err, errlen,
                 "cuda forward: a verification of %d rows (this model verifies at most %d)",
                 n_tokens, cu->undo_rows);
        return BT_ERR_INVALID_ARG;
    }
    cu->meta_used = 0;
    CK_CUDA(cudaSetDevice(cu->gpu));
    bt_status_t rc = forward(&f, logits, cu->before);
    if (rc != BT_OK) {
        /* the sequences' state is torn: forget their mirrors; the caller drops them */
        cudaStreamSynchronize(cu->stream);
        cudaGetLastError();
        for (int q = 0; q < n_seqs; q++)
            for (int i = 0; i < cu->n_mirrors; i++)
                if (cu->mirror[i].host == seqs[q].state) cu->mirror[i].host = NULL;
    }
    return rc;
}

/* ---- DSpark ------------------------------------------------------------------------ */

int bt_model_cuda_invariant_rows(const struct bt_model_cuda *cu)
{
    (void)cu;
    return GRAPH_MAX_SEQS; /* the few-row products (decode batches) and the grouped MoE */
}

uint64_t bt_model_cuda_restored(struct bt_model_cuda *cu, const uint8_t *state, uint64_t tag,
                                const bt_kv_range_t *rg, int n)
{
    int hit = -1;
    for (int i = 0; i < cu->n_mirrors && hit < 0 && tag; i++)
        if (cu->mirror[i].host == state && cu->mirror[i].tag == tag) hit = i;
    if (hit < 0) return 0;
    if (n == 0) return tag;
    /* packed into pinned memory, one copy over, spread by one kernel: copy_home backwards */
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += (rg[i].len + 15) / 16 * 16;
    uint8_t *dslot = cu->mirror_mem + (size_t)hit * cu->slot_bytes;
    bool ok = cudaSetDevice(cu->gpu) == cudaSuccess && home_reserve(cu, n, bytes);
    if (ok) {
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            memcpy(cu->home_h + at, state + rg[i].off, rg[i].len);
            cu->home_rg_h[i] = (bt_cuda_copy_t){cu->home_d + at, dslot + rg[i].off, rg[i].len};
            at += (rg[i].len + 15) / 16 * 16;
        }
        ok = cudaMemcpyAsync(cu->home_d, cu->home_h, at, cudaMemcpyHostToDevice, cu->stream) ==
                 cudaSuccess &&
             cudaMemcpyAsync(cu->home_rg_d, cu->home_rg_h, (size_t)n * sizeof(bt_cuda_copy_t),
                             cudaMemcpyHostToDevice, cu->stream) == cudaSuccess &&
             bt_cuda_copy_ranges(cu->home_rg_d, n, cu->stream) == BT_OK &&
             cudaStreamSynchronize(cu->stream) == cudaSuccess;
    }
    if (!ok) { /* the mirror is forgotten; the next forward uploads the slot */
        cudaGetLastError();
        cu->mirror[hit].host = NULL;
        return 0;
    }
    return tag;
}

/* A draft stage's attention (model.c draft_attend_token): each block row over its stage's
 * ring, every filled slot, and all its block's rows, both ways, with the sink; staged per
 * sequence as [ring W rows][block rows], key lists idx_d of `stride` (planned by the caller). */
static bt_status_t draft_attention(fwd_t *f, int l, const int32_t *idx_d, const int32_t *idx_n_d,
                                   int stride, int B)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    const dev_layer_t *w = &cu->layer[l];
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int hd = c->head_dim, H = m->hl, W = c->window;
    size_t row = (size_t)hd * sizeof(float);
    attention_fn *attend = cu->att_tc ? bt_cuda_attention_tc_ws : bt_cuda_attention_ws;
    CK(queries_and_kv(f, l, NULL, NULL, NULL)); /* (no compressor or indexer to run beside) */
    for (int q = 0; q < f->n_seqs; q++) {
        int first = f->first[q];
        float *stage = cu->win_stage + ((size_t)q * W + first) * hd;
        CK(d2d(f, stage, region(f->dslot[q], f->lay->window_off[l]), (size_t)W * row));
        CK(d2d(f, stage + (size_t)W * hd, cu->kv + (size_t)first * hd, (size_t)B * row));
        CK(attend(cu->attn + (size_t)first * H * hd, cu->q + (size_t)first * H * hd, stage,
                  idx_d + (size_t)first * stride, idx_n_d + first, stride, NULL, NULL, NULL, 0,
                  w->attn_sink, f->pos_d + first, cu->inv_main, m->half_main, BT_CUDA_F32, B, H, hd,
                  cu->att_ws, cu->att_ws_cap, NULL, st));
    }
    return attention_out(f, l);
}

/* The draft's forward over the blocks (model.c bt_model_draft): the rows' logits in dlogits,
 * their collapsed streams before the norm in cu->draft_pre. */
static bt_status_t draft_forward(fwd_t *f, const int32_t *ids)
{
    bt_model_t *m = f->m;
    struct bt_model_cuda *cu = f->cu;
    const bt_model_config_t *c = &m->cfg;
    char *err = f->err;
    size_t errlen = f->errlen;
    cudaStream_t st = cu->stream;
    int N = f->N, B = c->draft_block, W = c->window, hc = c->hc_mult, D = c->hidden, V = c->vocab;
    int stride = W + B;
    int32_t *ids_h, *ids_d, *idx, *idx_d, *idx_n, *idx_n_d;
    int64_t *pos;
    PLAN(f, int32_t, N, ids_h, ids_d);
    PLAN(f, int64_t, N, pos, f->pos_d);
    PLAN(f, int32_t, (size_t)N * stride, idx, idx_d);
    PLAN(f, int32_t, N, idx_n, idx_n_d);
    for (int q = 0; q < f->n_seqs; q++) {
        int64_t start = bt_kv_header(f->seqs[q].state)->n_tokens;
        int n_ring = start < W ? (int)start : W;
        for (int i = 0; i < B; i++) {
            int t = f->first[q] + i;
            /* under TP the owner of the row embeds it, the others zeros (-1), then a sum */
            int id = ids[t] - m->v0;
            ids_h[t] = id >= 0 && id < m->vl ? id : -1;
            pos[t] = start + i;
            idx_n[t] = n_ring + B;
            for (int j = 0; j < n_ring; j++)
                idx[(size_t)t * stride + j] = j;
            for (int j = 0; j < B; j++)
                idx[(size_t)t * stride + n_ring + j] = W + j;
        }
    }
    CK(plan_send(cu, ids_h, ids_d, (size_t)N * sizeof(int32_t), err, errlen));
    CK(plan_send(cu, pos, f->pos_d, (size_t)N * sizeof(int64_t), err, errlen));
    CK(plan_send(cu, idx, idx_d, (size_t)N * stride * sizeof(int32_t), err, errlen));
    CK(plan_send(cu, idx_n, idx_n_d, (size_t)N * sizeof(int32_t), err, errlen));
    CK(bt_cuda_embed_streams(cu->x, cu->pre_mix, cu->embed, ids_d, N, hc, D, st));
    if (cu->tp > 1) CK(tp_all_reduce(f, cu->x, (size_t)N * hc * D));
    for (int j = 0; j < c->n_draft; j++) {
        int l = c->n_layers + j;
        const dev_layer_t *w = &cu->layer[l];
        CK(site(f, w->hc_attn_fn, w->hc_attn_base, w->hc_attn_scale, cu->attn_pre, cu->pre_mix,
                w->attn_norm));
        CK(draft_attention(f, l, idx_d, idx_n_d, stride, B));
        CK(expand(f));
        CK(site(f, w->hc_ffn_fn, w->hc_ffn_base, w->hc_ffn_scale, cu->pre_mix, cu->attn_pre,
                w->ffn_norm));
        CK(moe(f, l));
        CK(expand(f));
    }
    CK(flush_expand(f));
    CK(bt_cuda_hc_collapse(cu->draft_pre, D, cu->x, cu->pre_mix, N, hc, D, st));
    CK(bt_cuda_rmsnorm(cu->hidden, BT_CUDA_F32, cu->draft_pre, BT_CUDA_F32, cu->draft_norm, N, D,
                       (float)c->rms_eps, st));
    if (cu->tp == 1)
        return bt_cuda_gemm_f32(cu->blas, cu->dlogits, V, cu->hidden, D, cu->head, N, V, D, st);
    return tp_logits(f, cu->hidden, N, true);
}

bt_status_t bt_model_cuda_draft(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *const *states,
                                const int32_t *last, int n_seqs, bt_draft_choose_fn choose,
                                void *ctx, int32_t *drafts, float *conf, char *err, size_t errlen)
{
    struct bt_model_cuda *cu = m->cuda;
    const bt_model_config_t *c = &m->cfg;
    cudaStream_t st = cu->stream;
    int B = c->draft_block, D = c->hidden, V = c->vocab, R = c->draft_markov_rank;
    bt_forward_seq_t seqs[BT_MODEL_MAX_SEQS];
    int first[BT_MODEL_MAX_SEQS];
    int32_t *ids = cu->draft_ids;
    if (n_seqs * B > cu->logit_rows) {
        snprintf(err, errlen, "draft of %d rows: the GPU's logits hold %d", n_seqs * B,
                 cu->logit_rows);
        return BT_ERR_INVALID_ARG;
    }
    for (int q = 0; q < n_seqs; q++) {
        ids[q * B] = last[q];
        for (int i = 1; i < B; i++)
            ids[q * B + i] = c->draft_noise_id;
        seqs[q] = (bt_forward_seq_t){.state = states[q], .ids = ids + q * B, .n = B};
        first[q] = q * B;
    }
    fwd_t f;
    memset(&f, 0, sizeof f);
    f.m = m;
    f.cu = cu;
    f.lay = lay;
    f.seqs = seqs;
    f.n_seqs = n_seqs;
    f.N = n_seqs * B;
    f.first = first;
    f.err = err;
    f.errlen = errlen;
    cu->meta_used = 0;
    CK_CUDA(cudaSetDevice(cu->gpu));
    bt_status_t rc = bind_mirrors(&f);
    if (rc == BT_OK) rc = draft_forward(&f, ids);
    if (rc != BT_OK) {
        cudaStreamSynchronize(st);
        cudaGetLastError();
        return rc;
    }
    if (!drafts) return cudaStreamSynchronize(st) == cudaSuccess ? BT_OK : BT_ERR_DEVICE;
    if (conf)
        CK_CUDA(cudaMemcpyAsync(cu->draft_pre_h, cu->draft_pre, (size_t)f.N * D * sizeof(float),
                                cudaMemcpyDeviceToHost, st));
    /* row by row: the Markov bias of the token before (from the pick just made), then the
     * pick on the host */
    int32_t prev[BT_MODEL_MAX_SEQS];
    memcpy(prev, last, (size_t)n_seqs * sizeof(int32_t));
    for (int i = 0; i < B; i++) {
        int64_t *eid, *eid_d;
        PLAN(&f, int64_t, n_seqs, eid, eid_d);
        for (int q = 0; q < n_seqs; q++)
            eid[q] = prev[q];
        CK(plan_send(cu, eid, eid_d, (size_t)n_seqs * sizeof(int64_t), err, errlen));
        CK(bt_cuda_gather_rows(cu->markov_e, cu->markov_embed, eid_d, n_seqs, R, st));
        CK(mm(&f, cu->markov_bias, V, cu->markov_e, R, &cu->markov_head, n_seqs));
        /* the bias added where the rows are (the same float sums as model.c's on the host) */
        CK(bt_cuda_add_rows(cu->dlogits + (size_t)i * V, (int64_t)B * V, cu->markov_bias, V, n_seqs,
                            V, st));
        CK_CUDA(cudaMemcpy2DAsync(cu->draft_rows_h, (size_t)V * sizeof(float),
                                  cu->dlogits + (size_t)i * V, (size_t)B * V * sizeof(float),
                                  (size_t)V * sizeof(float), (size_t)n_seqs, cudaMemcpyDeviceToHost,
                                  st));
        if (conf)
            CK_CUDA(cudaMemcpyAsync(cu->markov_e_h, cu->markov_e,
                                    (size_t)n_seqs * R * sizeof(float), cudaMemcpyDeviceToHost,
                                    st));
        CK_CUDA(cudaStreamSynchronize(st));
        for (int q = 0; q < n_seqs; q++) {
            int t = q * B + i;
            float *row = cu->draft_rows_h + (size_t)q * V;
            if (conf) {
                const float *pre = cu->draft_pre_h + (size_t)t * D,
                            *e = cu->markov_e_h + (size_t)q * R;
                conf[t] = bt_cpu_dot(m->conf_proj, pre, D) + bt_cpu_dot(m->conf_proj + D, e, R);
            }
            int32_t tok = choose ? choose(ctx, q, i, row, V) : bt_model__argmax(row, V);
            if (tok < 0 || tok >= V) {
                snprintf(err, errlen, "sequence %d: draft token %d outside the vocabulary", q, tok);
                return BT_ERR_INVALID_ARG;
            }
            drafts[t] = tok;
            prev[q] = tok;
        }
    }
    return BT_OK;
}

/* Internals of the engine's model shared by its backends: the CPU forward (model.c) and the
 * device-resident one (model_cuda.c), which loads through the CPU loader and takes the
 * weights over. Not for use outside services/engine. */
#ifndef BT_ENGINE_MODEL_IMPL_H
#define BT_ENGINE_MODEL_IMPL_H

#include "common/comm/comm.h"
#include "common/threads.h"
#include "services/engine/model.h"

#define MAX_HC 16
#define MAX_MIX ((2 + MAX_HC) * MAX_HC)
#define BT_MAX_HIDDEN 8192 /* stack rows of the MoE; the released model has 5120 */
#define MAX_ACTIVE 64
#define MAX_HEAD_DIM 4096

typedef struct {
    float *attn_norm, *ffn_norm;
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    /* attention */
    float *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *wo_a, *wo_b, *attn_sink;
    /* compressor (kv sources) */
    float *c_wkv, *c_wgate, *c_norm;
    /* indexer (index sources; wk/k_norm only on key owners) */
    float *i_wq_b, *i_weights_proj, *i_wk, *i_k_norm;
    /* MoE */
    float *gate_w, *gate_bias;
    float *w1, *w2, *w3; /* [E][inter][hidden], [E][hidden][inter], [E][inter][hidden] */
    float *sw1, *sw2, *sw3;
    /* engram */
    float *e_embed, *e_wkv, *e_qk;
    int n_experts, n_active; /* the draft stages route over their own experts */
    unsigned lowp;           /* AQ_* bits: the linears whose weights were stored FP8/FP4 */
} layer_weights_t;

/* A layer's linears whose inputs the activation quantization may round (layer_weights_t.lowp,
 * set from the stored dtypes; wo_a is never among them) */
enum {
    AQ_WQ_A = 1u << 0,
    AQ_WQ_B = 1u << 1,
    AQ_WKV = 1u << 2,
    AQ_WO_B = 1u << 3,
    AQ_C_WKV = 1u << 4,
    AQ_C_WGATE = 1u << 5,
    AQ_I_WQ_B = 1u << 6,
    AQ_I_WPROJ = 1u << 7,
    AQ_I_WK = 1u << 8,
    AQ_W13 = 1u << 9, /* routed experts' w1 and w3 (any expert's) */
    AQ_W2 = 1u << 10, /* routed experts' w2 */
    AQ_SHARED13 = 1u << 11,
    AQ_SHARED2 = 1u << 12,
    AQ_E_WKV = 1u << 13,
};

typedef struct {
    /* per token */
    int *tok_seq;
    int64_t *tok_pos;
    float *x;          /* [N][hc][D] streams */
    float *pre_mix;    /* [N][hc] the collapse weights carried to the next site */
    float *attn_pre;   /* [N][hc] */
    float *post;       /* [N][hc] */
    float *comb;       /* [N][hc][hc] */
    float *xin;        /* [N][D] sublayer input */
    float *out;        /* [N][D] sublayer output */
    float *q_res;      /* [N][q_lora] */
    float *q;          /* [N][H*hd] */
    float *kv;         /* [N][hd] */
    float *ckv, *cgate;/* [N][hd] compressor projections */
    float *attn;       /* [N][H*hd] */
    float *oa;         /* [N][G*R] */
    float *qi;         /* [N][IH*ihd] */
    float *iw;         /* [N][IH] */
    float *cos_main, *sin_main, *cos_comp, *sin_comp; /* [N][half] */
    int32_t *topk;     /* [N][index_topk] selected entries, ascending */
    int *topk_n;
    unsigned char *topk_set;
    int32_t *cand;     /* [N][candidate_topk_blocks] kept blocks, ascending */
    int *cand_n;
    unsigned char *cand_set;
    int64_t *hash;     /* [N][n_engram][cols] */
    int64_t *cid;      /* [N] compressed engram ids */
    float *probs;      /* [N][probs_stride] attention weights */
    float *hidden;     /* [N][D] final hidden */
    size_t probs_stride; /* floats of probs a token: window + max(index_topk, draft block) */
    /* DSpark (cfg n_draft > 0) */
    float *main_hidden; /* [N][targets * D] streams entering the target layers, averaged */
    float *main_x;      /* [N][D] the draft's context input */
    float *draft_pre;   /* [N][D] the last stage's collapsed streams, before its norm */
    /* per task (strided over tokens) */
    int n_tasks;
    float *task_scores;  /* [tasks][max(comp_cap, blocks)] */
    float *task_moe;     /* [tasks][2*inter + E + 2*hidden] */
    float *aq_rows;      /* [N][aq_cols] a linear's input rows, quantized (activation_quant) */
    size_t aq_cols;
    const float **task_keys; /* [tasks][probs_stride] the keys a query attends */
    float *task_engram;  /* [tasks][cols*ehd + (hc+1)*D] */
    int32_t *task_idx;   /* [tasks][max(topk, blocks)] heap */
    float *task_bscore;  /* [tasks][max(topk, blocks)] heap scores */
} scratch_t;

struct bt_model {
    bt_model_config_t cfg;
    bt_model_options_t opt;
    bt_threads_t *pool;
    float *embed, *head, *norm;
    layer_weights_t layer[BT_MAX_LAYERS];
    float *inv_freq_main, *inv_freq_comp;
    int half_main, half_comp;
    /* engram hashing */
    int32_t *token_map;
    int64_t pad_cid;
    int64_t *primes, *offsets, *multipliers;
    int engram_cols;
    /* bookkeeping */
    void **allocs;
    int n_allocs, cap_allocs;
    scratch_t s;
    bt_tap_fn tap;
    void *tap_ctx;
    /* tensor parallelism (tp_size 1: everything local) */
    bt_comm_t *comm;
    int tp_rank, tp_size;
    int h0, hl;           /* this rank's attention heads [h0, h0 + hl) */
    bool group_split;     /* wo_a groups and wo_b columns sharded (else gathered heads) */
    int g0, gl;           /* this rank's output groups when group_split */
    int i0, il;           /* this rank's slice of every expert's (and the shared) width */
    int v0, vl, vpad;     /* this rank's vocabulary rows [v0, v0 + vl), padded to vpad */
    float *gather;        /* TP scratch: all-gather receive buffer */
    float *tp_logits;     /* TP scratch: this rank's vocabulary slice of the logits */
    /* DSpark draft (cfg n_draft > 0): its context input, head and scratch */
    float *main_proj, *main_norm, *draft_norm, *markov_embed, *markov_head, *conf_proj;
    bool main_proj_lowp; /* main_proj stored FP8/FP4 (its input quantized like a layer's) */
    float *draft_logits; /* [max_batch_seqs * block + 1][vocab] */
    int32_t *draft_ids;  /* [max_batch_seqs * block] */
    int target_slot[BT_MAX_LAYERS];   /* index among the draft's target layers, -1 */
    size_t moe_task_floats, heap_len; /* per-task MoE scratch and top-k heap, all layers' most */
    struct bt_model_cuda *cuda; /* the device backend's state; NULL on the CPU */
    size_t host_bytes;          /* float arrays allocated (weights, then scratch) */
    /* bt_model_forward_sample on the host: logits rows of a batch and a sampler, made at the
     * first such forward */
    float *draw_logits;
    bt_sampler_t *draw_sampler;
    int draw_vocab;
};

/* Compressed ids cid [N] and engram hash ids hash [N][n_engram][cols] of a batch's tokens
 * (sequence q's tokens start at seq_first[q]); reads the slots' engram history. */
void bt_model__engram_hashes(const bt_model_t *m, const bt_forward_seq_t *seqs, int n_seqs,
                             const int *seq_first, int64_t *cid, int64_t *hash);

/* What a verification forward overwrites in a slot that its rejected tokens must give back:
 * the header, the ring slots of its positions (every window ring, the draft's included) and
 * the open compressor groups; and the compressor rows it computed, from which the group open
 * after the kept tokens is rebuilt. Compressed entries past the restored counters are never
 * read, so they need nothing. */
struct bt_kv_undo {
    int max_rows, n; /* n: the rows of the recorded forward, 0 when none */
    int n_rings, hd;
    bt_kv_header_t before;
    float *ring; /* [n_rings][max_rows][hd] the slots' previous contents */
    float *pend_kv[BT_MAX_LAYERS], *pend_gate[BT_MAX_LAYERS]; /* [ratio][hd] previous groups */
    float *row_kv[BT_MAX_LAYERS], *row_gate[BT_MAX_LAYERS];   /* [max_rows][hd] new rows */
};

/* Records into seq->undo what a verification forward of seq is about to overwrite (the
 * compressor rows are recorded by the forward itself). */
void bt_model__undo_record(const bt_model_t *m, const bt_kv_layout_t *lay,
                           const bt_forward_seq_t *seq);

/* The first index of the largest of n values (a greedy draft's pick). */
int32_t bt_model__argmax(const float *row, int n);

/* Frees a pointer the model tracks (a weight the device backend has taken over). */
void bt_model__free_tracked(bt_model_t *m, void *p);

/* draws on the device (bt_model_forward_sample): each sequence's request and result */
typedef struct {
    const bt_sample_req_t *req;
    bt_sample_out_t *out;
    int vocab;
} bt_model_draw_t;

#ifdef BT_HAVE_CUDA_MODEL
/* services/engine/model_cuda.c: takes over a CPU-loaded model (weights to the GPU, host
 * copies freed), runs its forwards, releases its state. */
bt_status_t bt_model_cuda_attach(bt_model_t *m, const char *dir, char *err, size_t errlen);
/* logits and draw: either, both or neither (draw only when bt_model_cuda_draws says so) */
bt_status_t bt_model_cuda_forward(bt_model_t *m, const bt_kv_layout_t *lay,
                                  const bt_forward_seq_t *seqs, int n_seqs, const int *seq_first,
                                  int n_tokens, float *logits, const bt_model_draw_t *draw,
                                  char *err, size_t errlen);
/* whether a forward of n_seqs sequences (a row each) can draw its tokens on the GPU (their
 * rows fit one chunk of the device's logits) */
bool bt_model_cuda_draws(const bt_model_t *m, int n_seqs);
/* bt_model_batch_invariant_rows on the GPU */
int bt_model_cuda_invariant_rows(const struct bt_model_cuda *cuda);
/* bt_model_draft on the GPU (after its checks) */
bt_status_t bt_model_cuda_draft(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *const *states,
                                const int32_t *last, int n_seqs, bt_draft_choose_fn choose,
                                void *ctx, int32_t *drafts, float *conf, char *err, size_t errlen);
/* A rollback restored the n ranges rg of the host slot `state`, whose header had tag `tag`:
 * the same bytes into the slot's mirror. Returns the tag the header keeps (0 when no mirror
 * was current: the next forward uploads the slot). */
uint64_t bt_model_cuda_restored(struct bt_model_cuda *cuda, const uint8_t *state, uint64_t tag,
                                const bt_kv_range_t *rg, int n);
void bt_model_cuda_destroy(struct bt_model_cuda *cuda);
void bt_model_cuda_graph_stats(const struct bt_model_cuda *cuda, uint64_t *steps, uint64_t *instances);
uint64_t bt_model_cuda_device_draws(const struct bt_model_cuda *cuda);
uint64_t bt_model_cuda_side_forks(const struct bt_model_cuda *cuda);
#endif

#endif



/* The DeepSeek-V4.1 text model on the CPU backend: weights (dequantized to float32 at load)
 * and the forward pass over a batch of sequences, each advancing by a chunk of tokens
 * against its own KV state (services/engine/kv_state.h).
 *
 *   bt_model_options_t opt = bt_model_options_default();
 *   opt.engram_token_map = map; opt.engram_classes = n;   // when the model has engram layers
 *   bt_model_t *m;
 *   if (bt_model_load(dir, &opt, &m, err, sizeof err) != BT_OK) ...
 *   bt_kv_layout_t lay; bt_kv_layout_init(&lay, bt_model_config(m), max_ctx);
 *   bt_forward_seq_t seq = {.state = slot_mem, .ids = ids, .n = n, .all_logits = true};
 *   bt_model_forward(m, &lay, &seq, 1, logits, err, sizeof err);   // logits [n, vocab]
 *   bt_model_destroy(m);
 *
 * A forward never allocates: scratch is sized at load for opt.max_batch_tokens tokens and
 * opt.max_ctx positions per sequence. Results are bit-identical whatever the chunking, the
 * thread count or the other sequences in the batch. */
#ifndef BT_ENGINE_MODEL_H
#define BT_ENGINE_MODEL_H

#include "common/status.h"
#include "services/engine/config.h"
#include "services/engine/kv_state.h"
#include "services/engine/sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bt_model bt_model_t;

/* Sequences in one forward, at most (per-sequence bookkeeping is sized for it). */
#define BT_MODEL_MAX_SEQS 64

typedef struct {
    const int32_t *engram_token_map; /* [vocab] token -> class; copied at load */
    int engram_classes;
    int n_threads;                   /* 0 = one per core */
    int max_batch_tokens;            /* most tokens in one forward, all sequences together */
    int64_t max_ctx;                 /* most positions per sequence */
    int max_batch_seqs;              /* at most BT_MODEL_MAX_SEQS */
    /* Tensor parallelism: this process (or thread) is one rank of comm's group and keeps only
     * its shard: attention heads (with their wq_b rows, sinks and, when the output groups
     * divide evenly, their wo_a groups and wo_b columns), expert and shared-expert widths, and
     * vocabulary slices of the embedding and the head. The KV latent, mHC, norms, router,
     * indexer and engram are replicated, so every rank holds the whole KV state. NULL = TP 1. */
    struct bt_comm *comm;
    /* Where the forward runs: BT_DEVICE_CPU, or BT_DEVICE_CUDA (GPU `gpu`; builds with the CUDA
     * backend only). On CUDA the weights live on the GPU and each slot's KV state is cached
     * there; the slot in host memory stays the authoritative copy (updated after every
     * forward), so transfers and services work on it unchanged. TP 1 only for now. */
    int device;
    int gpu;
    /* CUDA: the format weights are multiplied in (--dtype): BT_WEIGHTS_AUTO keeps FP8/FP4/BF16
     * as stored (the fast, small default), BT_WEIGHTS_F32 dequantizes every weight to f32 (the
     * exact mode, which tracks the CPU engine), BT_WEIGHTS_BF16 stores every projection and
     * expert in bf16. */
    int cuda_weights;
    /* CUDA, tests: multiply the weights stored FP8/FP4 through cuBLASLt in bf16 (exactly
     * dequantized) instead of Baton's FP8/FP4 kernels: the yardstick for those kernels. */
    bool cuda_reference_gemms;
    /* CUDA: run decode steps (1..16 sequences of one token, TP 1, FP4 experts) eagerly instead
     * of as CUDA graphs; for comparisons (the environment's BT_CUDA_GRAPHS=0 does the same). */
    bool cuda_graphs_off;
    /* CUDA, decode-sized batches: the chains of a layer that do not depend on each other on
     * two streams. 0: where the second stream's products move at least 1 MiB of weights (under
     * that the fork costs the host more than it saves), 1: one stream, 2: two wherever they may
     * (tests). The environment's BT_CUDA_SIDE=0 makes it 1. */
    int cuda_streams;
    /* CUDA, decode-sized batches with two streams: each mHC mix beside its collapse on the main
     * stream instead of on a stream of its own; for comparisons (the environment's
     * BT_CUDA_MIX_STREAM=0 does the same). */
    bool cuda_mix_on_main;
    /* Load and run the checkpoint's DSpark draft stages (speculative decoding): every forward
     * then also keeps their window rings in the KV slots, which the layout holds only for such
     * a model (groups with and without them refuse each other's slots). */
    bool draft;
    /* The reference deployment's activation quantization (MODEL-DS41.md): the input rows of
     * every linear whose weights are stored FP8 or FP4 (wo_a excepted) rounded to FP8 e4m3 with
     * a UE8M0 scale per 32 values of K before the product, as its kernels do on the fly. Off,
     * the inputs stay as computed, as in the transformers port and the golden fixtures. */
    bool activation_quant;
} bt_model_options_t;

enum { BT_DEVICE_CPU = 0, BT_DEVICE_CUDA = 1 };
enum { BT_WEIGHTS_AUTO = 0, BT_WEIGHTS_F32 = 1, BT_WEIGHTS_BF16 = 2 };
/* "auto" / "float32" / "bfloat16" -> BT_WEIGHTS_*; -1 for anything else. */
int bt_weights_parse(const char *name);

/* "none" -> 0, "fp8" -> 1 (bt_model_options_t.activation_quant); -1 for anything else. */
int bt_act_quant_parse(const char *name);

/* "cpu" / "cuda" -> BT_DEVICE_*; -1 for anything else. */
int bt_device_parse(const char *name);
/* Whether this build has the CUDA backend. */
bool bt_device_cuda_built(void);

bt_model_options_t bt_model_options_default(void);

bt_status_t bt_model_load(const char *dir, const bt_model_options_t *opt, bt_model_t **model_p,
                          char *err, size_t errlen);
void bt_model_destroy(bt_model_t *model);
const bt_model_config_t *bt_model_config(const bt_model_t *model);
/* CUDA: the forwards that ran as CUDA graphs and the executable graphs instantiated for them
 * (pieces of steps; both 0 on the CPU). */
void bt_model_graph_stats(const bt_model_t *model, uint64_t *steps, uint64_t *instances);
/* CUDA: the tokens bt_model_forward_sample drew on the GPU (0 on the CPU). */
uint64_t bt_model_device_draws(const bt_model_t *model);
/* CUDA: the times a forward forked work to its second stream (0 on the CPU). */
uint64_t bt_model_side_forks(const bt_model_t *model);
/* TP rank and size (0 and 1 without a comm). */
int bt_model_tp_rank(const bt_model_t *model);
int bt_model_tp_size(const bt_model_t *model);

typedef struct bt_kv_undo bt_kv_undo_t;

typedef struct {
    uint8_t *state;      /* the sequence's KV slot */
    const int32_t *ids;  /* new tokens */
    int n;
    bool all_logits;     /* a logits row per new token, else only for the last */
    /* speculative verification: the forward records here what it overwrites, so that
     * bt_model_rollback can keep only the tokens accepted; NULL otherwise */
    bt_kv_undo_t *undo;
} bt_forward_seq_t;

/* Advances every sequence by its tokens. logits receives, sequence after sequence, n rows
 * (all_logits) or one row of vocab floats; may be NULL when no logits are wanted. */
bt_status_t bt_model_forward(bt_model_t *model, const bt_kv_layout_t *layout,
                             const bt_forward_seq_t *seqs, int n_seqs, float *logits, char *err,
                             size_t errlen);

enum { BT_SAMPLE_TOP_MAX = 20 }; /* the most likely tokens a draw reports at most */

/* A token to draw for a sequence from its last row of logits (sampler.h's rules). */
typedef struct {
    bt_sampling_t sampling;
    uint64_t step;     /* the draw's index: the tokens the request generated before */
    bool want_logprob; /* the chosen token's log-probability */
    int n_top;         /* and the n_top most likely tokens with theirs, 0..BT_SAMPLE_TOP_MAX */
    /* subtracted from the logits of ids adj_ids[0 .. n_adj) (distinct, < vocab) before the draw:
     * the request's logit_bias and the presence and frequency penalties of the tokens generated
     * so far (bt_penalties_t). The draw and the log-probabilities are those of the adjusted
     * row. */
    const int32_t *adj_ids;
    const float *adj;
    int n_adj;
    /* constrained decoding (common/text/grammar.h): only ids whose bit is set may be drawn (bit
     * id % 32 of word id / 32, over the draw's vocab); applied after the adjustments, so the
     * log-probabilities are those of the allowed ids. NULL: every id. */
    const uint32_t *allow;
} bt_sample_req_t;

typedef struct {
    int32_t id;
    float logprob;
    bt_top_logprob_t top[BT_SAMPLE_TOP_MAX];
} bt_sample_out_t;

/* bt_model_forward, then a token drawn for each sequence q from its last row of logits over
 * ids 0..vocab-1 (the ids the caller's tokenizer has: at most the model's vocabulary) by req[q],
 * into out[q]. With --device cuda the draws run on the GPU (under TP on the rank that asks,
 * after the vocabulary slices are gathered), so only the tokens and the log-probabilities asked
 * for reach the host, not a row of logits a sequence; on the CPU the rows go through the host
 * sampler. No sequence may ask for all_logits. */
bt_status_t bt_model_forward_sample(bt_model_t *model, const bt_kv_layout_t *layout,
                                    const bt_forward_seq_t *seqs, int n_seqs, int vocab,
                                    const bt_sample_req_t *req, bt_sample_out_t *out, char *err,
                                    size_t errlen);

/* ---- speculative decoding (DSpark, MODEL-DS41.md) -------------------------------------
 *
 * A step: the draft proposes `block` tokens after the token last drawn (bt_model_draft); the
 * target runs that token and the proposals in one forward with all_logits and an undo record;
 * the caller accepts a prefix (row i's logits judge proposal i + 1) and bt_model_rollback
 * drops the rest from the slot, which is then exactly as if only the kept tokens had run. */

/* Rows a forward may carry with each row's result independent of the rest of the batch (0:
 * any number): the GPU's products switch kernels past 16 rows. A speculative step keeps its
 * verification within it, so that greedy requests get plain decoding's tokens however many
 * sequences the step holds. */
int bt_model_batch_invariant_rows(const bt_model_t *model);

/* Draft tokens a step (0 when the model runs without draft stages). */
int bt_model_draft_block(const bt_model_t *model);
/* The most rows one verification may run (the token drawn plus proposals): bounded by the
 * window ring and the engram history, which a rollback restores from its record. */
int bt_model_verify_rows(const bt_model_t *model);

/* Picks proposal `row` of sequence `seq` from the draft's logits of that row (vocab floats, the
 * Markov bias added; may be modified). NULL = greedy (lowest id on ties). */
typedef int32_t (*bt_draft_choose_fn)(void *ctx, int seq, int row, float *logits, int vocab);

/* For each sequence q: its slot states[q] (n_tokens >= 1 positions run) and last[q], the token
 * drawn after them (not yet in the slot). Writes drafts[q * block + i] and conf[q * block + i]
 * (confidence logits: sigmoid is the draft's estimate that proposal i is accepted given the
 * ones before it; conf may be NULL). Reads the slots only. drafts NULL: the block's forward
 * alone, picking nothing (a TP group's other ranks, whose collectives pair with the lead's). */
bt_status_t bt_model_draft(bt_model_t *model, const bt_kv_layout_t *layout, uint8_t *const *states,
                           const int32_t *last, int n_seqs, bt_draft_choose_fn choose, void *ctx,
                           int32_t *drafts, float *conf, char *err, size_t errlen);

/* An undo record for verifications of up to max_rows tokens (bt_model_verify_rows at most). */
bt_status_t bt_kv_undo_create(const bt_model_t *model, int max_rows, bt_kv_undo_t **undo_p);
void bt_kv_undo_destroy(bt_kv_undo_t *undo);
/* Keeps the first `keep` (1..n) of the n tokens the recorded forward ran on `state`. */
bt_status_t bt_model_rollback(bt_model_t *model, const bt_kv_layout_t *layout, uint8_t *state,
                              bt_kv_undo_t *undo, int keep, char *err, size_t errlen);

/* Debug taps for tests against the reference's intermediate tensors. */
typedef enum {
    BT_TAP_ATTN_OUT,     /* [n, hidden] attention output after wo_b */
    BT_TAP_FFN_OUT,      /* [n, hidden] MoE output */
    BT_TAP_LAYER_OUT,    /* [n, hc, hidden] streams leaving the layer */
    BT_TAP_FINAL_HIDDEN, /* [n, hidden] after the final collapse and norm (layer = -1) */
    BT_TAP_ENGRAM_HASH,  /* int64 [n, n_engram, cols] hash ids (layer = -1) */
} bt_tap_t;
typedef void (*bt_tap_fn)(void *ctx, bt_tap_t tap, int layer, const void *data, int n_tokens);
void bt_model_set_tap(bt_model_t *model, bt_tap_fn fn, void *ctx);

#endif

/* The DeepSeek-V4.1 text configuration, read from a checkpoint's config.json (the composite
 * form with `text_config`, or a flat text config), with the derived per-layer roles.
 *
 *   bt_model_config_t cfg;
 *   if (bt_model_config_load(dir, &cfg, err, sizeof err) != BT_OK) ...
 *   ... cfg.layer[l].compress_ratio, cfg.layer[l].kv_source ...
 *   bt_model_config_free(&cfg);
 */
#ifndef BT_ENGINE_CONFIG_H
#define BT_ENGINE_CONFIG_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BT_MAX_LAYERS 128
#define BT_MAX_ENGRAM_LAYERS 8
#define BT_MAX_DRAFT_TARGETS 8
#define BT_MAX_DRAFT_BLOCK 16

typedef struct {
    int compress_ratio;  /* 0 = window only, 1 or 2 */
    bool is_kv_source;   /* owns a compressor (and, if an index source, the index keys) */
    bool is_index_source;
    int kv_source;       /* the kv-source layer whose compressed cache this layer reads; -1 */
    int index_key_owner; /* the kv-source layer whose index keys this layer's indexer scores */
    int engram_index;    /* index into the engram tables, -1 when the layer has none */
} bt_layer_config_t;

typedef struct {
    double theta;
    int rope_dim;        /* rotated channels at the end of each head (interleaved pairs) */
    bool yarn;
    double factor, beta_fast, beta_slow, original_max_pos, attention_factor;
    bool truncate;
} bt_rope_config_t;

typedef struct {
    int vocab, hidden, n_layers;
    int n_heads, head_dim, q_lora_rank, o_groups, o_lora_rank;
    int window;
    int index_heads, index_head_dim, index_topk;
    int candidate_source, candidate_topk_blocks, candidate_block_size;
    int n_experts, n_active, moe_inter, n_shared;
    double route_scale, swiglu_limit, gate_temp;
    bool norm_topk_prob;
    int hc_mult, sinkhorn_iters;
    double hc_eps, rms_eps;
    bt_rope_config_t rope_main, rope_compress;
    /* engram */
    int n_engram;
    int engram_layers[BT_MAX_ENGRAM_LAYERS];
    int64_t engram_rows[BT_MAX_ENGRAM_LAYERS];
    int engram_max_ngram, engram_heads, engram_head_dim;
    int64_t engram_vocab, engram_compressed_vocab;
    int engram_pad_id;
    int bos_id, eos_id;
    int64_t max_position;
    /* DSpark draft stages (`mtp.*`, MODEL-DS41.md): layer[n_layers + j] for j < n_draft, window
     * only. n_draft is 0 when the config declares none (num_nextn_predict_layers or
     * dspark_block_size 0) and in the configuration of a model loaded without them
     * (bt_model_options_t.draft), so a KV layout has their rings only where they are kept. */
    int n_draft;
    int draft_block;    /* tokens drafted a step (dspark_block_size) */
    int draft_noise_id; /* fills the block after its first token */
    int draft_markov_rank;
    int draft_experts, draft_active;
    int n_draft_targets; /* target layers whose entering streams (mean over hc) feed the draft */
    int draft_targets[BT_MAX_DRAFT_TARGETS];
    bt_layer_config_t layer[BT_MAX_LAYERS];
} bt_model_config_t;

/* Reads DIR/config.json. Errors name the field. */
bt_status_t bt_model_config_load(const char *dir, bt_model_config_t *cfg, char *err, size_t errlen);
/* Parses an already-read JSON text (for tests and fuzzing). */
bt_status_t bt_model_config_parse(const char *json, size_t len, bt_model_config_t *cfg, char *err,
                                  size_t errlen);

/* The rope inverse frequencies (rope_dim/2 values) exactly as the reference computes them in
 * float32 (plain, or YaRN-blended). */
void bt_rope_inv_freq(const bt_rope_config_t *rope, float *inv_freq);

#endif

#include "services/engine/config.h"

#include "common/alloc.h"
#include "common/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const cJSON *obj;
    char *err;
    size_t errlen;
    bt_status_t st;
} reader_t;

static int64_t get_int(reader_t *r, const char *key, int64_t def, bool required)
{
    if (r->st != BT_OK) return def;
    int64_t v;
    char e[200];
    bt_status_t st = bt_json_get_int(r->obj, key, &v, e, sizeof e);
    if (st == BT_OK) return v;
    if (st == BT_ERR_NOT_FOUND && !required) return def;
    snprintf(r->err, r->errlen, "config.json: %s", e);
    r->st = BT_ERR_BAD_CONFIG;
    return def;
}

/* An integer that must lie in [lo, hi]; checked before narrowing to int. */
static int get_int_in(reader_t *r, const char *key, int64_t def, bool required, int64_t lo, int64_t hi)
{
    int64_t v = get_int(r, key, def, required);
    if (r->st != BT_OK) return (int)def;
    if (v < lo || v > hi) {
        snprintf(r->err, r->errlen, "config.json: field '%s' = %lld is out of range [%lld, %lld]", key,
                 (long long)v, (long long)lo, (long long)hi);
        r->st = BT_ERR_BAD_CONFIG;
        return (int)def;
    }
    return (int)v;
}

static double get_double(reader_t *r, const char *key, double def, bool required)
{
    if (r->st != BT_OK) return def;
    double v;
    char e[200];
    bt_status_t st = bt_json_get_double(r->obj, key, &v, e, sizeof e);
    if (st == BT_OK) return v;
    if (st == BT_ERR_NOT_FOUND && !required) return def;
    snprintf(r->err, r->errlen, "config.json: %s", e);
    r->st = BT_ERR_BAD_CONFIG;
    return def;
}

static bool get_bool(reader_t *r, const char *key, bool def)
{
    if (r->st != BT_OK) return def;
    bool v;
    char e[200];
    bt_status_t st = bt_json_get_bool(r->obj, key, &v, e, sizeof e);
    if (st == BT_OK) return v;
    if (st == BT_ERR_NOT_FOUND) return def;
    snprintf(r->err, r->errlen, "config.json: %s", e);
    r->st = BT_ERR_BAD_CONFIG;
    return def;
}

/* Reads an int array into out (max n), returns the count; -1 and an error when malformed. */
static int get_int_list(reader_t *r, const char *key, int64_t *out, int max, bool required)
{
    if (r->st != BT_OK) return 0;
    int64_t *v = NULL;
    int n = 0;
    char e[200];
    bt_status_t st = bt_json_get_int_array(r->obj, key, &v, &n, e, sizeof e);
    if (st == BT_ERR_NOT_FOUND && !required) return 0;
    if (st != BT_OK) {
        snprintf(r->err, r->errlen, "config.json: %s", e);
        r->st = BT_ERR_BAD_CONFIG;
        return 0;
    }
    if (n > max) {
        snprintf(r->err, r->errlen, "config.json: field '%s' has %d entries, at most %d supported",
                 key, n, max);
        r->st = BT_ERR_BAD_CONFIG;
        free(v);
        return 0;
    }
    memcpy(out, v, (size_t)n * sizeof *out);
    free(v);
    return n;
}

static void fail(reader_t *r, const char *fmt, const char *what, long long value)
{
    if (r->st != BT_OK) return;
    char msg[160];
    snprintf(msg, sizeof msg, fmt, what, value);
    snprintf(r->err, r->errlen, "config.json: %s", msg);
    r->st = BT_ERR_BAD_CONFIG;
}

static void check_range(reader_t *r, const char *what, long long v, long long lo, long long hi)
{
    if (v < lo || v > hi) fail(r, "field '%s' = %lld is out of range", what, v);
}

/* Rope settings of one layer type: `rope_parameters.<type>` when present (transformers'
 * folded form), else the checkpoint's flat fields. */
static void read_rope(reader_t *r, const cJSON *text, const char *type, bt_rope_config_t *rope,
                      int head_dim, bool compress)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(text, "rope_parameters");
    const cJSON *sub = params ? cJSON_GetObjectItemCaseSensitive(params, type) : NULL;
    reader_t top = *r;
    top.obj = text;
    int64_t rope_dim = get_int(&top, "qk_rope_head_dim", 0, false);
    memset(rope, 0, sizeof *rope);
    rope->truncate = true;
    rope->attention_factor = 1.0;
    if (cJSON_IsObject(sub)) {
        reader_t s = *r;
        s.obj = sub;
        rope->theta = get_double(&s, "rope_theta", 10000.0, true);
        double partial = get_double(&s, "partial_rotary_factor", 1.0, false);
        if (rope_dim == 0) rope_dim = (int64_t)(head_dim * partial);
        const cJSON *type_item = cJSON_GetObjectItemCaseSensitive(sub, "rope_type");
        rope->yarn = cJSON_IsString(type_item) && !strcmp(type_item->valuestring, "yarn");
        if (rope->yarn) {
            rope->factor = get_double(&s, "factor", 1.0, true);
            rope->beta_fast = get_double(&s, "beta_fast", 32.0, false);
            rope->beta_slow = get_double(&s, "beta_slow", 1.0, false);
            rope->original_max_pos = get_double(&s, "original_max_position_embeddings", 0, true);
            rope->attention_factor = get_double(&s, "attention_factor", 1.0, false);
            rope->truncate = get_bool(&s, "truncate", true);
        }
        r->st = s.st;
    } else {
        /* Flat form of the released config: rope_theta, compress_rope_theta, rope_scaling. */
        rope->theta = compress ? get_double(&top, "compress_rope_theta", 160000.0, false)
                               : get_double(&top, "rope_theta", 10000.0, false);
        const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(text, "rope_scaling");
        if (compress && cJSON_IsObject(scaling)) {
            reader_t s = top;
            s.obj = scaling;
            rope->yarn = true;
            rope->factor = get_double(&s, "factor", 1.0, true);
            rope->beta_fast = get_double(&s, "beta_fast", 32.0, false);
            rope->beta_slow = get_double(&s, "beta_slow", 1.0, false);
            rope->original_max_pos = get_double(&s, "original_max_position_embeddings", 0, true);
            /* MODEL-DS41.md: no mscale on the compressed layers */
            rope->attention_factor = get_double(&s, "attention_factor", 1.0, false);
            r->st = s.st;
        }
        if (top.st != BT_OK) r->st = top.st;
    }
    if (r->st == BT_OK && top.st != BT_OK) r->st = top.st;
    rope->rope_dim = (int)rope_dim;
    if (r->st == BT_OK && (rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2))
        fail(r, "field '%s' = %lld must be even and at most head_dim", "qk_rope_head_dim",
             (long long)rope_dim);
}

static bool has_key(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key) != NULL;
}

static bool in_list(const int64_t *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

bt_status_t bt_model_config_parse(const char *json, size_t len, bt_model_config_t *cfg, char *err,
                                  size_t errlen)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        snprintf(err, errlen, "config.json: invalid JSON");
        return BT_ERR_BAD_CONFIG;
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(text)) text = root;

    bt_model_config_t c;
    memset(&c, 0, sizeof c);
    reader_t r = {text, err, errlen, BT_OK};
    c.vocab = get_int_in(&r, "vocab_size", 0, true, 2, 1 << 24);
    c.hidden = get_int_in(&r, "hidden_size", 0, true, 1, 1 << 16);
    c.n_layers = get_int_in(&r, "num_hidden_layers", 0, true, 1, BT_MAX_LAYERS);
    c.n_heads = get_int_in(&r, "num_attention_heads", 0, true, 1, 4096);
    c.head_dim = get_int_in(&r, "head_dim", 0, true, 2, 1 << 14);
    c.q_lora_rank = get_int_in(&r, "q_lora_rank", 0, true, 1, 1 << 16);
    c.o_groups = get_int_in(&r, "o_groups", 1, true, 1, 4096);
    c.o_lora_rank = get_int_in(&r, "o_lora_rank", 0, true, 1, 1 << 16);
    c.window = get_int_in(&r, "sliding_window", 128, false, 1, 1 << 20);
    c.index_heads = get_int_in(&r, "index_n_heads", 0, true, 1, 4096);
    c.index_head_dim = get_int_in(&r, "index_head_dim", 0, true, 2, 1 << 14);
    c.index_topk = get_int_in(&r, "index_topk", 0, true, 1, 1 << 20);
    c.candidate_source = get_int_in(&r, "candidate_source_layer_id", -1, false, -1, 1 << 20);
    c.candidate_topk_blocks = get_int_in(&r, "candidate_topk_blocks", 0, false, 0, 1 << 20);
    c.candidate_block_size = get_int_in(&r, "candidate_block_size", 1, false, 1, 1 << 20);
    c.n_experts = get_int_in(&r, "n_routed_experts", 0, true, 1, 1 << 16);
    c.n_active = get_int_in(&r, "num_experts_per_tok", 0, true, 1, 1 << 16);
    c.moe_inter = get_int_in(&r, "moe_intermediate_size", 0, true, 1, 1 << 20);
    c.n_shared = get_int_in(&r, "n_shared_experts", 1, false, 0, 1);
    c.route_scale = get_double(&r, "routed_scaling_factor", 1.0, false);
    c.swiglu_limit = get_double(&r, "swiglu_limit", 0.0, false);
    c.gate_temp = get_double(&r, "gate_temp", 1.0, false);
    c.norm_topk_prob = get_bool(&r, "norm_topk_prob", true);
    c.hc_mult = get_int_in(&r, "hc_mult", 4, false, 1, 16);
    c.sinkhorn_iters = get_int_in(&r, "hc_sinkhorn_iters", 20, false, 1, 1000);
    c.hc_eps = get_double(&r, "hc_eps", 1e-6, false);
    c.rms_eps = get_double(&r, "rms_norm_eps", 1e-6, false);
    c.bos_id = get_int_in(&r, "bos_token_id", 0, false, 0, 1 << 24);
    c.eos_id = get_int_in(&r, "eos_token_id", 1, false, 0, 1 << 24);
    c.max_position = get_int(&r, "max_position_embeddings", 1 << 20, false);
    if (r.st != BT_OK) goto out;
    if (c.n_active > c.n_experts)
        fail(&r, "field '%s' = %lld exceeds n_routed_experts", "num_experts_per_tok", c.n_active);
    if (c.n_heads % c.o_groups)
        fail(&r, "field '%s' = %lld must divide the head count", "o_groups", c.o_groups);
    if (!(c.gate_temp > 0) || !(c.rms_eps >= 0) || !(c.hc_eps >= 0) || !isfinite(c.route_scale) ||
        !isfinite(c.swiglu_limit))
        fail(&r, "%s%lld: gate_temp must be positive, eps values and scales finite", "", 0);
    if (r.st != BT_OK) goto out;

    /* layer roles */
    int64_t ratios[BT_MAX_LAYERS], kv_src[BT_MAX_LAYERS], idx_src[BT_MAX_LAYERS];
    int n_ratios = get_int_list(&r, "compress_ratios", ratios, BT_MAX_LAYERS, true);
    int n_kv = get_int_list(&r, "kv_source_layer_ids", kv_src, BT_MAX_LAYERS, false);
    int n_idx = get_int_list(&r, "index_source_layer_ids", idx_src, BT_MAX_LAYERS, false);
    if (r.st != BT_OK) goto out;
    if (n_ratios < c.n_layers) {
        fail(&r, "field '%s' has fewer entries than layers (%lld)", "compress_ratios", c.n_layers);
        goto out;
    }
    int latest_kv = -1, latest_owner = -1;
    for (int l = 0; l < c.n_layers; l++) {
        bt_layer_config_t *L = &c.layer[l];
        L->compress_ratio = (int)ratios[l];
        if (L->compress_ratio < 0 || L->compress_ratio > 16)
            fail(&r, "field '%s' has an unsupported ratio %lld", "compress_ratios", ratios[l]);
        L->is_kv_source = in_list(kv_src, n_kv, l);
        L->is_index_source = in_list(idx_src, n_idx, l);
        L->engram_index = -1;
        if (L->is_kv_source && L->compress_ratio == 0)
            fail(&r, "kv source layer %s%lld has compress ratio 0", "", l);
        if (L->is_kv_source) latest_kv = l;
        if (L->is_kv_source && L->is_index_source) latest_owner = l;
        L->kv_source = L->compress_ratio ? latest_kv : -1;
        L->index_key_owner = L->is_index_source ? latest_owner : -1;
        if (L->compress_ratio && L->kv_source >= 0 &&
            c.layer[L->kv_source].compress_ratio != L->compress_ratio)
            fail(&r, "layer %s%lld reads a kv source with another compress ratio", "", l);
    }
    if (c.candidate_source >= c.n_layers) c.candidate_source = -1;
    if (r.st != BT_OK) goto out;

    /* DSpark draft stages: window-only layers after the backbone (the released config's names,
     * or the reference code's) */
    const char *stages_key =
        has_key(text, "num_nextn_predict_layers") || !has_key(text, "n_mtp_layers")
            ? "num_nextn_predict_layers"
            : "n_mtp_layers";
    const char *active_key =
        has_key(text, "dspark_num_experts_per_tok") || !has_key(text, "dspark_n_activated_experts")
            ? "dspark_num_experts_per_tok"
            : "dspark_n_activated_experts";
    int n_draft = get_int_in(&r, stages_key, 0, false, 0, 16);
    c.draft_block = get_int_in(&r, "dspark_block_size", 0, false, 0, BT_MAX_DRAFT_BLOCK);
    if (r.st != BT_OK) goto out;
    if (n_draft > 0 && c.draft_block > 0) {
        int64_t targets[BT_MAX_DRAFT_TARGETS];
        c.n_draft_targets =
            get_int_list(&r, "dspark_target_layer_ids", targets, BT_MAX_DRAFT_TARGETS, true);
        c.draft_noise_id = get_int_in(&r, "dspark_noise_token_id", 0, true, 0, c.vocab - 1);
        c.draft_markov_rank = get_int_in(&r, "dspark_markov_rank", 256, false, 1, 1 << 16);
        c.draft_experts = get_int_in(&r, "dspark_n_routed_experts", 0, false, 0, 1 << 16);
        c.draft_active = get_int_in(&r, active_key, 0, false, 0, 1 << 16);
        if (r.st != BT_OK) goto out;
        if (!c.draft_experts) c.draft_experts = c.n_experts;
        if (!c.draft_active) c.draft_active = c.n_active;
        if (c.n_layers + n_draft > BT_MAX_LAYERS)
            fail(&r, "field '%s' = %lld: too many layers with the backbone's", stages_key, n_draft);
        if (c.n_draft_targets < 1)
            fail(&r, "field '%s' must name at least one layer (has %lld)",
                 "dspark_target_layer_ids", c.n_draft_targets);
        if (c.draft_active > c.draft_experts)
            fail(&r, "field '%s' = %lld exceeds dspark_n_routed_experts", active_key,
                 c.draft_active);
        /* the captured streams are concatenated in layer order, each layer once, as the
         * reference's forward appends them */
        int n_targets = 0;
        for (int i = 0; i < c.n_draft_targets && r.st == BT_OK; i++) {
            check_range(&r, "dspark_target_layer_ids", targets[i], 0, c.n_layers - 1);
            int at = 0, t = (int)targets[i];
            while (at < n_targets && c.draft_targets[at] < t)
                at++;
            if (at < n_targets && c.draft_targets[at] == t) continue;
            memmove(c.draft_targets + at + 1, c.draft_targets + at,
                    (size_t)(n_targets - at) * sizeof(int));
            c.draft_targets[at] = t;
            n_targets++;
        }
        c.n_draft_targets = n_targets;
        for (int j = 0; j < n_draft && r.st == BT_OK; j++) {
            int l = c.n_layers + j;
            if (n_ratios > l && ratios[l] != 0)
                fail(&r, "field '%s': draft stage %lld must be window-only (ratio 0)",
                     "compress_ratios", j);
            c.layer[l] =
                (bt_layer_config_t){.kv_source = -1, .index_key_owner = -1, .engram_index = -1};
        }
        if (r.st != BT_OK) goto out;
        c.n_draft = n_draft;
    } else {
        c.draft_block = 0;
    }

    read_rope(&r, text, "main", &c.rope_main, c.head_dim, false);
    read_rope(&r, text, "compress", &c.rope_compress, c.head_dim, true);
    if (r.st != BT_OK) goto out;

    /* engram */
    int64_t eng[BT_MAX_ENGRAM_LAYERS];
    c.n_engram = get_int_list(&r, "engram_layer_ids", eng, BT_MAX_ENGRAM_LAYERS, false);
    if (c.n_engram > 0) {
        int64_t rows[BT_MAX_ENGRAM_LAYERS];
        int n_rows = get_int_list(&r, "engram_num_embeddings", rows, BT_MAX_ENGRAM_LAYERS, true);
        c.engram_max_ngram = get_int_in(&r, "engram_max_ngram_size", 4, false, 2, 8);
        c.engram_heads = get_int_in(&r, "engram_n_heads", 0, true, 1, 64);
        c.engram_head_dim = get_int_in(&r, "engram_head_dim", 0, true, 1, 1 << 14);
        c.engram_vocab = get_int(&r, "engram_vocab_size", 0, true);
        c.engram_compressed_vocab = get_int(&r, "engram_compressed_vocab_size", 0, true);
        /* the released config says engram_pad_token_id, the code engram_pad_id */
        c.engram_pad_id = get_int_in(&r, "engram_pad_id", -1, false, -1, 1 << 24);
        if (c.engram_pad_id < 0) c.engram_pad_id = get_int_in(&r, "engram_pad_token_id", 2, false, 0, 1 << 24);
        if (r.st != BT_OK) goto out;
        if (n_rows != c.n_engram)
            fail(&r, "field '%s' must have one entry per engram layer (%lld)", "engram_num_embeddings", c.n_engram);
        check_range(&r, "engram_compressed_vocab_size", c.engram_compressed_vocab, 1, 1LL << 40);
        check_range(&r, "engram_vocab_size", c.engram_vocab, 1, 1LL << 40);
        for (int i = 0; i < n_rows; i++) check_range(&r, "engram_num_embeddings", rows[i], 1, 1LL << 40);
        for (int i = 0; i < c.n_engram && r.st == BT_OK; i++) {
            check_range(&r, "engram_layer_ids", eng[i], 0, c.n_layers - 1);
            if (r.st != BT_OK) break;
            c.engram_layers[i] = (int)eng[i];
            c.engram_rows[i] = rows[i];
            c.layer[eng[i]].engram_index = i;
        }
    }
out:
    cJSON_Delete(root);
    if (r.st == BT_OK) *cfg = c;
    return r.st;
}

bt_status_t bt_model_config_load(const char *dir, bt_model_config_t *cfg, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *data;
    size_t len;
    char e[512];
    bt_status_t st = bt_read_file(path, 16u << 20, &data, &len, e, sizeof e);
    if (st != BT_OK) {
        snprintf(err, errlen, "%s", e);
        return BT_ERR_BAD_CONFIG;
    }
    st = bt_model_config_parse(data, len, cfg, err, errlen);
    free(data);
    return st;
}

/* YaRN's correction dimension: the rotary index whose wavelength makes `rotations` turns
 * over the original context. */
static double yarn_correction_dim(double rotations, int dim, double base, double max_pos)
{
    return (dim * log(max_pos / (rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

void bt_rope_inv_freq(const bt_rope_config_t *rope, float *inv_freq)
{
    int dim = rope->rope_dim, half = dim / 2;
    for (int i = 0; i < half; i++) {
        /* float32 like the reference: base ** (arange(0, dim, 2).float() / dim) */
        float expo = (float)(2 * i) / (float)dim;
        float pos_freq = powf((float)rope->theta, expo);
        float extrap = 1.0f / pos_freq;
        if (!rope->yarn) {
            inv_freq[i] = extrap;
            continue;
        }
        float interp = 1.0f / ((float)rope->factor * pos_freq);
        double low = yarn_correction_dim(rope->beta_fast, dim, rope->theta, rope->original_max_pos);
        double high = yarn_correction_dim(rope->beta_slow, dim, rope->theta, rope->original_max_pos);
        if (rope->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        float ramp = ((float)i - (float)low) / ((float)high - (float)low);
        ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
        float extrap_factor = 1.0f - ramp;
        inv_freq[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
}

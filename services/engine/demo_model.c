#include "services/engine/demo_model.h"

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "common/text/tokenizer.h"
#include "kernels/cpu/quant.h"
#include "services/engine/engram_hash.h"
#include "services/engine/safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bumped whenever the generator's output changes, so a stale cached demo is rebuilt. */
#define DEMO_VERSION 2

typedef struct {
    const char *name;
    bool quantized;
    int hidden, layers, heads, head_dim, rope_dim, q_lora, o_groups, o_lora, window;
    int index_heads, index_head_dim, index_topk;
    int candidate_source, candidate_blocks, candidate_block_size;
    int experts, active, inter;
    int ratios[16];
    int kv_sources[8], n_kv;
    int index_sources[8], n_index;
    int engram_layers[4], n_engram;
    int engram_heads, engram_head_dim;
    double swiglu_limit;
    /* DSpark draft */
    int draft_stages, draft_block, draft_experts, draft_active, markov_rank;
    int draft_targets[4], draft_targets_n;
} demo_spec_t;

static const demo_spec_t specs[] = {
    {
        .name = "demo",
        .quantized = true,
        .hidden = 128,
        .layers = 8,
        .heads = 4,
        .head_dim = 64,
        .rope_dim = 16,
        .q_lora = 64,
        .o_groups = 2,
        .o_lora = 32,
        .window = 16,
        .index_heads = 4,
        .index_head_dim = 32,
        .index_topk = 8,
        .candidate_source = 5,
        .candidate_blocks = 3,
        .candidate_block_size = 4,
        .experts = 8,
        .active = 2,
        .inter = 64,
        .ratios = {0, 0, 2, 2, 2, 1, 1, 1},
        .kv_sources = {2, 5},
        .n_kv = 2,
        .index_sources = {2, 5, 7},
        .n_index = 3,
        .engram_layers = {1, 3},
        .n_engram = 2,
        .engram_heads = 2,
        .engram_head_dim = 32,
        .swiglu_limit = 10.0,
        .draft_stages = 3,
        .draft_block = 5,
        .draft_experts = 6,
        .draft_active = 2,
        .markov_rank = 16,
        .draft_targets = {5, 6, 7},
        .draft_targets_n = 3,
    },
    {
        .name = "demo2",
        .quantized = false,
        .hidden = 96,
        .layers = 6,
        .heads = 6,
        .head_dim = 48,
        .rope_dim = 16,
        .q_lora = 40,
        .o_groups = 3,
        .o_lora = 24,
        .window = 6,
        .index_heads = 3,
        .index_head_dim = 24,
        .index_topk = 5,
        .candidate_source = 3,
        .candidate_blocks = 2,
        .candidate_block_size = 3,
        .experts = 6,
        .active = 3,
        .inter = 40,
        .ratios = {0, 2, 2, 1, 1, 1},
        .kv_sources = {1, 3},
        .n_kv = 2,
        .index_sources = {1, 3, 5},
        .n_index = 3,
        .engram_layers = {2},
        .n_engram = 1,
        .engram_heads = 3,
        .engram_head_dim = 16,
        .swiglu_limit = 2.0,
        .draft_stages = 2,
        .draft_block = 5,
        .draft_experts = 4,
        .draft_active = 3,
        .markov_rank = 8,
        .draft_targets = {2, 5},
        .draft_targets_n = 2,
    },
};

#define ENGRAM_MAX_NGRAM 4
#define ENGRAM_VOCAB 300

/* ---- deterministic random numbers (splitmix64 + Box-Muller) ------------------------------ */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(rng_t *r)
{
    return ((double)(rng_next(r) >> 11) + 0.5) * 0x1p-53;
}

static float rng_normal(rng_t *r)
{
    double u = rng_uniform(r), v = rng_uniform(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

/* ---- tensors to write ------------------------------------------------------------------ */

typedef struct {
    bt_tensor_write_t *t;
    void **bufs;
    size_t n, cap;
    rng_t rng;
    bool quantized;
} writer_t;

static void add_raw(writer_t *w, const char *name, bt_dtype_t dt, int ndim, int64_t d0, int64_t d1,
                    void *data)
{
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 256;
        w->t = bt_realloc_or_die(w->t, w->cap * sizeof *w->t);
        w->bufs = bt_realloc_or_die(w->bufs, 2 * w->cap * sizeof *w->bufs);
    }
    bt_tensor_write_t *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = bt_strdup_or_die(name);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
    w->bufs[2 * w->n] = (void *)t->name;
    w->bufs[2 * w->n + 1] = data;
    w->n++;
}

static float *random_floats(writer_t *w, size_t n, float mean, float std)
{
    float *v = bt_malloc_or_die(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = mean + std * rng_normal(&w->rng);
    return v;
}

static void add_f32(writer_t *w, const char *name, int ndim, int64_t d0, int64_t d1, float *v)
{
    add_raw(w, name, BT_DTYPE_F32, ndim, d0, d1, v);
}

/* BF16 in the quantized variant (as the released checkpoint stores norms, embeddings,
 * compressor and indexer weights), float32 otherwise. */
static void add_bf16(writer_t *w, const char *name, int ndim, int64_t d0, int64_t d1, float *v)
{
    if (!w->quantized) {
        add_f32(w, name, ndim, d0, d1, v);
        return;
    }
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    uint16_t *h = bt_malloc_or_die(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = bt_f32_to_bf16(v[i]);
    free(v);
    add_raw(w, name, BT_DTYPE_BF16, ndim, d0, d1, h);
}

static uint8_t e8m0_of(float scale)
{
    int e;
    frexpf(scale, &e); /* scale = 0.5 * 2^e exactly */
    return (uint8_t)(e - 1 + 127);
}

/* FP8 e4m3 with UE8M0 scales over 32x32 tiles (rows_per_scale = 32) or per row and 32
 * columns (rows_per_scale = 1, the engram tables). */
static void add_fp8(writer_t *w, const char *prefix, int64_t rows, int64_t cols, float *v,
                    int rows_per_scale)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (!w->quantized) {
        add_f32(w, name, 2, rows, cols, v);
        return;
    }
    int64_t sr = (rows + rows_per_scale - 1) / rows_per_scale, sc = (cols + 31) / 32;
    uint8_t *q = bt_malloc_or_die((size_t)(rows * cols));
    uint8_t *s = bt_malloc_or_die((size_t)(sr * sc));
    for (int64_t br = 0; br < sr; br++)
        for (int64_t bc = 0; bc < sc; bc++) {
            float amax = 0.0f;
            for (int64_t r = br * rows_per_scale; r < (br + 1) * rows_per_scale && r < rows; r++)
                for (int64_t c = bc * 32; c < (bc + 1) * 32 && c < cols; c++)
                    amax = fmaxf(amax, fabsf(v[r * cols + c]));
            float scale = bt_pow2_ceil(fmaxf(amax, 1e-30f) / 448.0f);
            s[br * sc + bc] = e8m0_of(scale);
            for (int64_t r = br * rows_per_scale; r < (br + 1) * rows_per_scale && r < rows; r++)
                for (int64_t c = bc * 32; c < (bc + 1) * 32 && c < cols; c++)
                    q[r * cols + c] = bt_f32_to_e4m3(v[r * cols + c] / scale);
        }
    free(v);
    add_raw(w, name, BT_DTYPE_F8_E4M3, 2, rows, cols, q);
    snprintf(name, sizeof name, "%s.scale", prefix);
    add_raw(w, name, BT_DTYPE_F8_E8M0, 2, sr, sc, s);
}

/* Packed FP4 e2m1 (low nibble = even column) with a UE8M0 scale per row and 32 columns. */
static void add_fp4(writer_t *w, const char *prefix, int64_t rows, int64_t cols, float *v)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (!w->quantized) {
        add_f32(w, name, 2, rows, cols, v);
        return;
    }
    int64_t sc = cols / 32;
    uint8_t *q = bt_calloc_or_die((size_t)(rows * cols / 2), 1);
    uint8_t *s = bt_malloc_or_die((size_t)(rows * sc));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < sc; b++) {
            float amax = 0.0f;
            for (int64_t c = b * 32; c < b * 32 + 32; c++) amax = fmaxf(amax, fabsf(v[r * cols + c]));
            float scale = bt_pow2_ceil(fmaxf(amax, 1e-30f) / 6.0f);
            s[r * sc + b] = e8m0_of(scale);
            for (int64_t c = b * 32; c < b * 32 + 32; c++) {
                float x = fminf(fmaxf(v[r * cols + c] / scale, -6.0f), 6.0f);
                uint8_t code = bt_f32_to_e2m1(x);
                q[(r * cols + c) / 2] |= (uint8_t)((c & 1) ? code << 4 : code);
            }
        }
    free(v);
    add_raw(w, name, BT_DTYPE_I8, 2, rows, cols / 2, q);
    snprintf(name, sizeof name, "%s.scale", prefix);
    add_raw(w, name, BT_DTYPE_F8_E8M0, 2, rows, sc, s);
}

static void writer_free(writer_t *w)
{
    for (size_t i = 0; i < 2 * w->n; i++) free(w->bufs[i]);
    free(w->bufs);
    free(w->t);
}

/* ---- tokenizer -------------------------------------------------------------------------- */

static const char *const special_tokens[] = {
    "<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<｜latest_reminder｜>", "<｜deepseek_image｜>",
    "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>",
};
static const char *const plain_added[] = {"<think>", "</think>", "｜DSML｜"};
#define N_BASE 3
#define N_BYTES 256
#define N_SPECIAL (sizeof special_tokens / sizeof special_tokens[0])
#define N_PLAIN (sizeof plain_added / sizeof plain_added[0])
#define DEMO_VOCAB (N_BASE + N_BYTES + (int)N_SPECIAL + (int)N_PLAIN)

/* GPT-2's printable stand-in for a byte, as UTF-8. */
static void byte_char(int b, char out[5])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

static cJSON *added_token(int id, const char *content, bool special)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", false);
    cJSON_AddBoolToObject(t, "lstrip", false);
    cJSON_AddBoolToObject(t, "rstrip", false);
    cJSON_AddBoolToObject(t, "normalized", false);
    cJSON_AddBoolToObject(t, "special", special);
    return t;
}

static char *tokenizer_json(void)
{
    static const char *const base[N_BASE] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                             "<｜▁pad▁｜>"};
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < N_BASE; i++) cJSON_AddItemToArray(added, added_token(i, base[i], true));
    for (int i = 0; i < (int)N_SPECIAL; i++)
        cJSON_AddItemToArray(added, added_token(N_BASE + N_BYTES + i, special_tokens[i], true));
    for (int i = 0; i < (int)N_PLAIN; i++)
        cJSON_AddItemToArray(added, added_token(N_BASE + N_BYTES + (int)N_SPECIAL + i, plain_added[i], false));
    cJSON *norm = cJSON_AddObjectToObject(root, "normalizer");
    cJSON_AddStringToObject(norm, "type", "Sequence");
    cJSON_AddArrayToObject(norm, "normalizers");
    /* the DeepSeek pre-tokenizer: digits, CJK runs, the word/punctuation regex, ByteLevel */
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *seq = cJSON_AddArrayToObject(pre, "pretokenizers");
    static const char *const regexes[] = {
        "\\p{N}{1,3}",
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
        /* one pattern split over two lines (parenthesised: clang warns on implicit joins) */
        ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
         "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    };
    for (int i = 0; i < 3; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "type", "Split");
        cJSON *pat = cJSON_AddObjectToObject(s, "pattern");
        cJSON_AddStringToObject(pat, "Regex", regexes[i]);
        cJSON_AddStringToObject(s, "behavior", "Isolated");
        cJSON_AddBoolToObject(s, "invert", false);
        cJSON_AddItemToArray(seq, s);
    }
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", false);
    cJSON_AddBoolToObject(bl, "trim_offsets", true);
    cJSON_AddBoolToObject(bl, "use_regex", false);
    cJSON_AddItemToArray(seq, bl);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddBoolToObject(dec, "add_prefix_space", true);
    cJSON_AddBoolToObject(dec, "trim_offsets", true);
    cJSON_AddBoolToObject(dec, "use_regex", true);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", false);
    cJSON_AddBoolToObject(model, "byte_fallback", false);
    cJSON_AddBoolToObject(model, "ignore_merges", false);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; i < N_BASE; i++) cJSON_AddNumberToObject(vocab, base[i], i);
    for (int b = 0; b < N_BYTES; b++) {
        char ch[5];
        byte_char(b, ch);
        cJSON_AddNumberToObject(vocab, ch, N_BASE + b);
    }
    cJSON_AddArrayToObject(model, "merges");
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static const char tokenizer_config[] =
    "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n"
    "  \"bos_token\": \"<｜begin▁of▁sentence｜>\",\n"
    "  \"eos_token\": \"<｜end▁of▁sentence｜>\",\n"
    "  \"pad_token\": \"<｜▁pad▁｜>\",\n  \"unk_token\": null,\n"
    "  \"add_bos_token\": false,\n  \"add_eos_token\": false,\n"
    "  \"clean_up_tokenization_spaces\": false,\n  \"model_max_length\": 1048576\n}\n";

/* ---- config ------------------------------------------------------------------------------ */

static cJSON *int_array(const int *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static char *config_json(const demo_spec_t *d, int classes, const int64_t *rows)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV41ForCausalLM"));
    cJSON_AddStringToObject(root, "model_type", "deepseek_v41");
    cJSON_AddStringToObject(root, "baton_note",
                            "Baton demo model: tiny, UNTRAINED (deterministic random weights)");
    cJSON *t = cJSON_AddObjectToObject(root, "text_config");
    cJSON_AddStringToObject(t, "model_type", "deepseek_v41_text");
    cJSON_AddNumberToObject(t, "vocab_size", DEMO_VOCAB);
    cJSON_AddNumberToObject(t, "hidden_size", d->hidden);
    cJSON_AddNumberToObject(t, "num_hidden_layers", d->layers);
    cJSON_AddNumberToObject(t, "num_attention_heads", d->heads);
    cJSON_AddNumberToObject(t, "num_key_value_heads", 1);
    cJSON_AddNumberToObject(t, "head_dim", d->head_dim);
    cJSON_AddNumberToObject(t, "qk_rope_head_dim", d->rope_dim);
    cJSON_AddNumberToObject(t, "q_lora_rank", d->q_lora);
    cJSON_AddNumberToObject(t, "o_groups", d->o_groups);
    cJSON_AddNumberToObject(t, "o_lora_rank", d->o_lora);
    cJSON_AddNumberToObject(t, "sliding_window", d->window);
    cJSON_AddNumberToObject(t, "index_n_heads", d->index_heads);
    cJSON_AddNumberToObject(t, "index_head_dim", d->index_head_dim);
    cJSON_AddNumberToObject(t, "index_topk", d->index_topk);
    cJSON_AddNumberToObject(t, "candidate_source_layer_id", d->candidate_source);
    cJSON_AddNumberToObject(t, "candidate_topk_blocks", d->candidate_blocks);
    cJSON_AddNumberToObject(t, "candidate_block_size", d->candidate_block_size);
    cJSON_AddItemToObject(t, "compress_ratios", int_array(d->ratios, d->layers));
    cJSON_AddItemToObject(t, "kv_source_layer_ids", int_array(d->kv_sources, d->n_kv));
    cJSON_AddItemToObject(t, "index_source_layer_ids", int_array(d->index_sources, d->n_index));
    cJSON_AddNumberToObject(t, "n_routed_experts", d->experts);
    cJSON_AddNumberToObject(t, "num_experts_per_tok", d->active);
    cJSON_AddNumberToObject(t, "moe_intermediate_size", d->inter);
    cJSON_AddNumberToObject(t, "n_shared_experts", 1);
    cJSON_AddNumberToObject(t, "routed_scaling_factor", 1.5);
    cJSON_AddNumberToObject(t, "swiglu_limit", d->swiglu_limit);
    cJSON_AddStringToObject(t, "scoring_func", "sqrtsoftplus");
    cJSON_AddStringToObject(t, "topk_method", "noaux_tc");
    cJSON_AddBoolToObject(t, "norm_topk_prob", true);
    cJSON_AddNumberToObject(t, "hc_mult", 4);
    cJSON_AddNumberToObject(t, "hc_sinkhorn_iters", 20);
    cJSON_AddNumberToObject(t, "hc_eps", 1e-6);
    cJSON_AddNumberToObject(t, "rms_norm_eps", 1e-20);
    cJSON_AddNumberToObject(t, "rope_theta", 10000.0);
    cJSON_AddNumberToObject(t, "compress_rope_theta", 160000.0);
    cJSON *scaling = cJSON_AddObjectToObject(t, "rope_scaling");
    cJSON_AddStringToObject(scaling, "rope_type", "yarn");
    cJSON_AddNumberToObject(scaling, "factor", 16);
    cJSON_AddNumberToObject(scaling, "beta_fast", 32);
    cJSON_AddNumberToObject(scaling, "beta_slow", 1);
    cJSON_AddNumberToObject(scaling, "original_max_position_embeddings", 65536);
    cJSON_AddNumberToObject(t, "max_position_embeddings", 1048576);
    cJSON_AddItemToObject(t, "engram_layer_ids", int_array(d->engram_layers, d->n_engram));
    cJSON *er = cJSON_AddArrayToObject(t, "engram_num_embeddings");
    for (int i = 0; i < d->n_engram; i++) cJSON_AddItemToArray(er, cJSON_CreateNumber((double)rows[i]));
    cJSON_AddNumberToObject(t, "engram_max_ngram_size", ENGRAM_MAX_NGRAM);
    cJSON_AddNumberToObject(t, "engram_n_heads", d->engram_heads);
    cJSON_AddNumberToObject(t, "engram_head_dim", d->engram_head_dim);
    cJSON_AddNumberToObject(t, "engram_vocab_size", ENGRAM_VOCAB);
    cJSON_AddNumberToObject(t, "engram_compressed_vocab_size", classes);
    cJSON_AddNumberToObject(t, "engram_pad_id", 2);
    cJSON_AddNumberToObject(t, "bos_token_id", 0);
    cJSON_AddNumberToObject(t, "eos_token_id", 1);
    cJSON_AddNumberToObject(t, "pad_token_id", 2);
    cJSON_AddNumberToObject(t, "num_nextn_predict_layers", d->draft_stages);
    if (d->draft_stages) {
        cJSON_AddNumberToObject(t, "dspark_block_size", d->draft_block);
        cJSON_AddNumberToObject(t, "dspark_noise_token_id", DEMO_VOCAB - 1);
        cJSON_AddItemToObject(t, "dspark_target_layer_ids",
                              int_array(d->draft_targets, d->draft_targets_n));
        cJSON_AddNumberToObject(t, "dspark_markov_rank", d->markov_rank);
        cJSON_AddNumberToObject(t, "dspark_n_routed_experts", d->draft_experts);
        cJSON_AddNumberToObject(t, "dspark_num_experts_per_tok", d->draft_active);
    }
    cJSON_AddNumberToObject(t, "baton_demo_version", DEMO_VERSION);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static bt_status_t write_text(const char *dir, const char *name, const char *text, char *err,
                              size_t errlen)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    return BT_OK;
}

/* One layer's tensors: the backbone's layers.N, or draft stage N (mtp.N: window only, its own
 * expert count). */
static void add_layer(writer_t *w, const demo_spec_t *d, int l, bool draft, const int64_t *rows,
                      int cols)
{
    int D = d->hidden, hd = d->head_dim, H = d->heads, hc = 4, mix = (2 + hc) * hc;
    char name[256], P[32];
    snprintf(P, sizeof P, draft ? "mtp.%d" : "layers.%d", l);
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
    bool kv_src = false, idx_src = false;
    for (int i = 0; i < d->n_kv && !draft; i++)
        kv_src |= d->kv_sources[i] == l;
    for (int i = 0; i < d->n_index && !draft; i++)
        idx_src |= d->index_sources[i] == l;
    int ratio = draft ? 0 : d->ratios[l];
    add_bf16(w, NAME("%s.attn_norm.weight", P), 1, D, 0, random_floats(w, D, 1, 0.1f));
    add_bf16(w, NAME("%s.ffn_norm.weight", P), 1, D, 0, random_floats(w, D, 1, 0.1f));
    const char *sites[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; s++) {
        add_f32(w, NAME("%s.hc_%s_fn", P, sites[s]), 2, mix, (int64_t)hc * D,
                random_floats(w, (size_t)mix * hc * D, 0, 1.0f / sqrtf((float)(hc * D))));
        add_f32(w, NAME("%s.hc_%s_base", P, sites[s]), 1, mix, 0, random_floats(w, mix, 0, 0.3f));
        float *scale = bt_malloc_or_die(3 * sizeof(float));
        for (int i = 0; i < 3; i++)
            scale[i] = 0.5f + (float)rng_uniform(&w->rng);
        add_f32(w, NAME("%s.hc_%s_scale", P, sites[s]), 1, 3, 0, scale);
    }
    char pre[128];
    snprintf(pre, sizeof pre, "%s.attn", P);
    add_fp8(w, NAME("%s.wq_a", pre), d->q_lora, D,
            random_floats(w, (size_t)d->q_lora * D, 0, 1.0f / sqrtf((float)D)), 32);
    add_bf16(w, NAME("%s.q_norm.weight", pre), 1, d->q_lora, 0,
             random_floats(w, d->q_lora, 1, 0.1f));
    add_fp8(w, NAME("%s.wq_b", pre), (int64_t)H * hd, d->q_lora,
            random_floats(w, (size_t)H * hd * d->q_lora, 0, 1.0f / sqrtf((float)d->q_lora)), 32);
    add_fp8(w, NAME("%s.wkv", pre), hd, D,
            random_floats(w, (size_t)hd * D, 0, 1.0f / sqrtf((float)D)), 32);
    add_bf16(w, NAME("%s.kv_norm.weight", pre), 1, hd, 0, random_floats(w, hd, 1, 0.1f));
    int gin = H * hd / d->o_groups;
    add_fp8(w, NAME("%s.wo_a", pre), (int64_t)d->o_groups * d->o_lora, gin,
            random_floats(w, (size_t)d->o_groups * d->o_lora * gin, 0, 1.0f / sqrtf((float)gin)),
            32);
    add_fp8(w, NAME("%s.wo_b", pre), D, (int64_t)d->o_groups * d->o_lora,
            random_floats(w, (size_t)D * d->o_groups * d->o_lora, 0,
                          1.0f / sqrtf((float)(d->o_groups * d->o_lora))),
            32);
    add_f32(w, NAME("%s.attn_sink", pre), 1, H, 0, random_floats(w, H, 0, 1));
    if (kv_src) {
        add_f32(w, NAME("%s.compressor.wkv.weight", pre), 2, hd, D,
                random_floats(w, (size_t)hd * D, 0, 1.0f / sqrtf((float)D)));
        if (ratio > 1)
            add_bf16(w, NAME("%s.compressor.wgate.weight", pre), 2, hd, D,
                     random_floats(w, (size_t)hd * D, 0, 1.0f / sqrtf((float)D)));
        add_bf16(w, NAME("%s.compressor.norm.weight", pre), 1, hd, 0,
                 random_floats(w, hd, 1, 0.1f));
    }
    if (idx_src) {
        int ih = d->index_heads, ihd = d->index_head_dim;
        add_fp8(w, NAME("%s.indexer.wq_b", pre), (int64_t)ih * ihd, d->q_lora,
                random_floats(w, (size_t)ih * ihd * d->q_lora, 0, 1.0f / sqrtf((float)d->q_lora)),
                32);
        add_bf16(w, NAME("%s.indexer.weights_proj.weight", pre), 2, ih, D,
                 random_floats(w, (size_t)ih * D, 0, 1.0f / sqrtf((float)D)));
        if (kv_src) {
            add_bf16(w, NAME("%s.indexer.wk.weight", pre), 2, ihd, hd,
                     random_floats(w, (size_t)ihd * hd, 0, 1.0f / sqrtf((float)hd)));
            add_bf16(w, NAME("%s.indexer.k_norm.weight", pre), 1, ihd, 0,
                     random_floats(w, ihd, 1, 0.1f));
        }
    }
    int E = draft ? d->draft_experts : d->experts, I = d->inter;
    add_bf16(w, NAME("%s.ffn.gate.weight", P), 2, E, D,
             random_floats(w, (size_t)E * D, 0, 1.0f / sqrtf((float)D)));
    add_f32(w, NAME("%s.ffn.gate.bias", P), 1, E, 0, random_floats(w, E, 0, 0.15f));
    for (int e = 0; e < E; e++) {
        add_fp4(w, NAME("%s.ffn.experts.%d.w1", P, e), I, D,
                random_floats(w, (size_t)I * D, 0, 1.0f / sqrtf((float)D)));
        add_fp4(w, NAME("%s.ffn.experts.%d.w2", P, e), D, I,
                random_floats(w, (size_t)I * D, 0, 1.0f / sqrtf((float)I)));
        add_fp4(w, NAME("%s.ffn.experts.%d.w3", P, e), I, D,
                random_floats(w, (size_t)I * D, 0, 1.0f / sqrtf((float)D)));
    }
    add_fp8(w, NAME("%s.ffn.shared_experts.w1", P), I, D,
            random_floats(w, (size_t)I * D, 0, 1.0f / sqrtf((float)D)), 32);
    add_fp8(w, NAME("%s.ffn.shared_experts.w2", P), D, I,
            random_floats(w, (size_t)I * D, 0, 1.0f / sqrtf((float)I)), 32);
    add_fp8(w, NAME("%s.ffn.shared_experts.w3", P), I, D,
            random_floats(w, (size_t)I * D, 0, 1.0f / sqrtf((float)D)), 32);
    for (int ei = 0; ei < d->n_engram && !draft; ei++) {
        if (d->engram_layers[ei] != l) continue;
        int ehd = d->engram_head_dim;
        add_fp8(w, NAME("%s.engram.embed", P), rows[ei], ehd,
                random_floats(w, (size_t)rows[ei] * ehd, 0, 1), 1);
        add_fp8(w, NAME("%s.engram.wkv", P), (int64_t)(hc + 1) * D, (int64_t)cols * ehd,
                random_floats(w, (size_t)(hc + 1) * D * cols * ehd, 0,
                              1.0f / sqrtf((float)(cols * ehd))),
                32);
        add_f32(w, NAME("%s.engram.q_weight", P), 2, hc, D,
                random_floats(w, (size_t)hc * D, 1, 0.25f));
        add_f32(w, NAME("%s.engram.k_weight", P), 2, hc, D,
                random_floats(w, (size_t)hc * D, 1, 0.25f));
    }
#undef NAME
}

bt_status_t bt_demo_model_write(const char *dir, const char *variant, char *err, size_t errlen)
{
    const demo_spec_t *d = NULL;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (!strcmp(specs[i].name, variant)) d = &specs[i];
    if (!d) {
        snprintf(err, errlen, "unknown demo model variant '%s' (demo, demo2)", variant);
        return BT_ERR_INVALID_ARG;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return BT_ERR_IO;
    }
    bt_status_t st;
    char *tok_text = tokenizer_json();
    st = write_text(dir, "tokenizer.json", tok_text, err, errlen);
    free(tok_text);
    if (st == BT_OK) st = write_text(dir, "tokenizer_config.json", tokenizer_config, err, errlen);
    if (st != BT_OK) return st;

    /* the engram class count comes from the tokenizer, as the reference derives it */
    bt_tokenizer_t *tok = NULL;
    int32_t *map = NULL;
    int classes = 0;
    st = bt_tokenizer_load(dir, &tok, err, errlen);
    if (st == BT_OK) st = bt_tokenizer_engram_token_map(tok, &map, &classes);
    bt_tokenizer_destroy(tok);
    free(map);
    if (st != BT_OK) return st;

    int layer_ids[4];
    int64_t primes[4 * 64], offsets[4 * 64], mult[4 * 8], rows[4];
    for (int i = 0; i < d->n_engram; i++) layer_ids[i] = d->engram_layers[i];
    st = bt_engram_constants(layer_ids, d->n_engram, ENGRAM_MAX_NGRAM, d->engram_heads, ENGRAM_VOCAB,
                             classes, primes, offsets, mult);
    if (st != BT_OK) {
        snprintf(err, errlen, "engram constants failed");
        return st;
    }
    int cols = (ENGRAM_MAX_NGRAM - 1) * d->engram_heads;
    for (int i = 0; i < d->n_engram; i++) rows[i] = offsets[i * cols + cols - 1] + primes[i * cols + cols - 1];
    char *cfg_text = config_json(d, classes, rows);
    st = write_text(dir, "config.json", cfg_text, err, errlen);
    free(cfg_text);
    if (st != BT_OK) return st;

    writer_t w = {0};
    w.rng.s = 20261202u + (uint64_t)(d->hidden * 131 + d->layers);
    w.quantized = d->quantized;
    int D = d->hidden;
    add_bf16(&w, "embed.weight", 2, DEMO_VOCAB, D, random_floats(&w, (size_t)DEMO_VOCAB * D, 0, 1));
    add_bf16(&w, "head.weight", 2, DEMO_VOCAB, D,
             random_floats(&w, (size_t)DEMO_VOCAB * D, 0, 2.5f / sqrtf((float)D)));
    add_bf16(&w, "norm.weight", 1, D, 0, random_floats(&w, (size_t)D, 1, 0.1f));
    for (int l = 0; l < d->layers; l++)
        add_layer(&w, d, l, false, rows, cols);
    /* the DSpark draft, after every backbone tensor (which it leaves as they were) */
    for (int j = 0; j < d->draft_stages; j++)
        add_layer(&w, d, j, true, rows, cols);
    if (d->draft_stages) {
        int T = d->draft_targets_n, R = d->markov_rank;
        add_fp8(&w, "mtp.0.main_proj", D, (int64_t)T * D,
                random_floats(&w, (size_t)D * T * D, 0, 1.0f / sqrtf((float)(T * D))), 32);
        add_bf16(&w, "mtp.0.main_norm.weight", 1, D, 0, random_floats(&w, D, 1, 0.1f));
        char name[256];
        snprintf(name, sizeof name, "mtp.%d.norm.weight", d->draft_stages - 1);
        add_bf16(&w, name, 1, D, 0, random_floats(&w, D, 1, 0.1f));
        snprintf(name, sizeof name, "mtp.%d.markov_head.embed.weight", d->draft_stages - 1);
        add_bf16(&w, name, 2, DEMO_VOCAB, R, random_floats(&w, (size_t)DEMO_VOCAB * R, 0, 1));
        snprintf(name, sizeof name, "mtp.%d.markov_head.head.weight", d->draft_stages - 1);
        add_bf16(&w, name, 2, DEMO_VOCAB, R,
                 random_floats(&w, (size_t)DEMO_VOCAB * R, 0, 1.0f / sqrtf((float)R)));
        snprintf(name, sizeof name, "mtp.%d.confidence_head.proj.weight", d->draft_stages - 1);
        add_bf16(&w, name, 2, 1, D + R,
                 random_floats(&w, (size_t)(D + R), 0, 1.0f / sqrtf((float)(D + R))));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st = bt_safetensors_write(path, w.t, w.n, err, errlen);
    writer_free(&w);
    return st;
}

void bt_demo_model_default_dir(char *buf, size_t len)
{
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (cache && *cache)
        snprintf(buf, len, "%s/baton/demo-v%d", cache, DEMO_VERSION);
    else
        snprintf(buf, len, "%s/.cache/baton/demo-v%d", home && *home ? home : "/tmp", DEMO_VERSION);
}

static bt_status_t mkdir_p(const char *dir)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return BT_ERR_IO;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return BT_ERR_IO;
    return BT_OK;
}

bt_status_t bt_demo_model_ensure(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, R_OK) == 0) return BT_OK;
    if (mkdir_p(dir) != BT_OK) {
        snprintf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
        return BT_ERR_IO;
    }
    BT_LOG_INFO("writing the demo model (tiny, untrained) to %s", dir);
    return bt_demo_model_write(dir, "demo", err, errlen);
}

bt_status_t bt_demo_model_default(char *buf, size_t len, char *err, size_t errlen)
{
    bt_demo_model_default_dir(buf, len);
    return bt_demo_model_ensure(buf, err, errlen);
}

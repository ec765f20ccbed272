/* baton generate / logits / make-demo-model: the engine in one process, no services. */
#include "services/cli/cli.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/model.h"
#include "services/engine/sampler.h"
#include "services/engine/spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *model_path;
    const char *input_ids;
    int64_t chunk;
    int64_t threads;
    int64_t context;
    const char *device;
    int64_t gpu;
    const char *dtype;
    bool draft; /* load the DSpark draft stages */
    const char *act_quant;
} common_args_t;

/* Loads the model of args (the demo model when none is given) with the tokenizer's engram
 * token map; *emit_vocab (emit_vocab may be NULL): the ids a sampler may pick (the services'
 * rule). Prints why on failure. */
static bt_model_t *open_model(const common_args_t *a, int64_t max_ctx, int max_batch,
                              const char *cmd, int *emit_vocab)
{
    char err[1024], demo[4096];
    const char *dir = a->model_path;
    if (!dir) {
        if (bt_demo_model_default(demo, sizeof demo, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton %s: demo model: %s\n", cmd, err);
            return NULL;
        }
        dir = demo;
        fprintf(stderr, "baton %s: using the built-in demo model (tiny, untrained) in %s\n", cmd, dir);
    }
    bt_model_config_t cfg;
    if (bt_model_config_load(dir, &cfg, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton %s: %s\n", cmd, err);
        return NULL;
    }
    int32_t *map = NULL;
    int classes = 0;
    if (bt_tokenizer_for_model(dir, cfg.vocab, cfg.n_engram > 0, &map, &classes, emit_vocab, err,
                               sizeof err) != BT_OK) {
        fprintf(stderr, "baton %s: %s\n", cmd, err);
        return NULL;
    }
    bt_model_options_t opt = bt_model_options_default();
    opt.device = bt_device_parse(a->device ? a->device : "cpu");
    if (opt.device < 0) {
        fprintf(stderr, "baton %s: --device must be cpu or cuda\n", cmd);
        free(map);
        return NULL;
    }
    opt.gpu = (int)a->gpu;
    opt.cuda_weights = bt_weights_parse(a->dtype ? a->dtype : "auto");
    if (opt.cuda_weights < 0) {
        fprintf(stderr, "baton %s: --dtype must be auto (weights as stored), float32 or bfloat16\n", cmd);
        free(map);
        return NULL;
    }
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = (int)a->threads;
    opt.max_ctx = max_ctx;
    opt.max_batch_tokens = max_batch;
    opt.max_batch_seqs = 1;
    opt.draft = a->draft;
    int aq = bt_act_quant_parse(a->act_quant ? a->act_quant : "none");
    if (aq < 0) {
        fprintf(stderr, "baton %s: --activation-quant must be none or fp8\n", cmd);
        free(map);
        return NULL;
    }
    opt.activation_quant = aq == 1;
    bt_model_t *m = NULL;
    if (bt_model_load(dir, &opt, &m, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton %s: %s\n", cmd, err);
        m = NULL;
    }
    free(map);
    return m;
}

static int parse_ids(const char *s, int32_t **ids_p, int *n_p, const char *cmd)
{
    char err[256];
    if (!s) {
        fprintf(stderr, "baton %s: --input-ids is required (comma-separated token ids)\n", cmd);
        return 2;
    }
    if (bt_flags_parse_int_list(s, ids_p, n_p, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton %s: --input-ids: %s\n", cmd, err);
        return 2;
    }
    if (*n_p == 0) {
        fprintf(stderr, "baton %s: --input-ids is empty\n", cmd);
        free(*ids_p);
        return 2;
    }
    return 0;
}

/* Prefills ids into state chunk by chunk; logits (when not NULL) receives all rows. */
static int prefill(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *state, const int32_t *ids,
                   int n, int chunk, bool all_logits, float *logits, const char *cmd)
{
    char err[512];
    int V = bt_model_config(m)->vocab;
    for (int i = 0; i < n; i += chunk) {
        int len = n - i < chunk ? n - i : chunk;
        bool last = i + len == n;
        bt_forward_seq_t seq = {state, ids + i, len, all_logits, NULL};
        float *out = NULL;
        if (all_logits)
            out = logits + (size_t)i * V;
        else if (last)
            out = logits;
        if (bt_model_forward(m, lay, &seq, 1, out, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton %s: %s\n", cmd, err);
            return 1;
        }
    }
    return 0;
}

int bt_cli_logits(int argc, char **argv)
{
    common_args_t a = {NULL, NULL, 4096, 0, 0, "cpu", 0, "auto", false, "none"};
    const char *output = NULL;
    bt_flag_t spec[] = {
        BT_FLAG_STR("model-path", &a.model_path, "checkpoint directory (default: the demo model)"),
        BT_FLAG_STR("input-ids", &a.input_ids, "comma-separated prompt token ids"),
        BT_FLAG_INT("chunked-prefill-size", &a.chunk, "tokens per prefill chunk (default 4096)"),
        BT_FLAG_INT("threads", &a.threads, "CPU threads (default: one per core)"),
        BT_FLAG_STR("device", &a.device, "cpu (default) or cuda"),
        BT_FLAG_INT("base-gpu-id", &a.gpu, "the GPU of --device cuda (default 0)"),
        BT_FLAG_STR("dtype", &a.dtype, "cuda weights: auto (as stored), float32, bfloat16"),
        BT_FLAG_STR("activation-quant", &a.act_quant,
                    "none (default) or fp8: round the inputs of FP8/FP4 linears as the reference "
                    "deployment does"),
        BT_FLAG_STR("output", &output, "file for float32 little-endian logits [T, vocab]"),
    };
    char err[256];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton logits: %s\n", err);
        return 2;
    }
    if (!output) {
        fprintf(stderr, "baton logits: --output FILE is required\n");
        return 2;
    }
    if (a.chunk < 1) {
        fprintf(stderr, "baton logits: --chunked-prefill-size must be at least 1\n");
        return 2;
    }
    int32_t *ids;
    int n;
    int rc = parse_ids(a.input_ids, &ids, &n, "logits");
    if (rc) return rc;
    int chunk = a.chunk < n ? (int)a.chunk : n;
    bt_model_t *m = open_model(&a, n, chunk, "logits", NULL);
    if (!m) {
        free(ids);
        return 1;
    }
    const bt_model_config_t *c = bt_model_config(m);
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, c, n);
    uint8_t *state = bt_aligned_alloc(64, lay.slot_bytes);
    float *logits = bt_aligned_alloc(64, (size_t)n * c->vocab * sizeof(float));
    if (!state || !logits) {
        fprintf(stderr, "baton logits: out of memory\n");
        rc = 1;
        goto out;
    }
    bt_kv_state_reset(state);
    rc = prefill(m, &lay, state, ids, n, chunk, true, logits, "logits");
    if (rc == 0) {
        FILE *f = fopen(output, "wb");
        size_t want = (size_t)n * c->vocab;
        if (!f || fwrite(logits, sizeof(float), want, f) != want || fclose(f) != 0) {
            fprintf(stderr, "baton logits: %s: %s\n", output, strerror(errno));
            rc = 1;
        } else {
            fprintf(stderr, "baton logits: wrote [%d, %d] float32 to %s\n", n, c->vocab, output);
        }
    }
out:
    bt_aligned_free(state);
    bt_aligned_free(logits);
    bt_model_destroy(m);
    free(ids);
    return rc;
}

int bt_cli_generate(int argc, char **argv)
{
    common_args_t a = {NULL, NULL, 4096, 0, 0, "cpu", 0, "auto", false, "none"};
    int64_t max_new = 16, seed = 0;
    const char *spec_algo = NULL;
    double spec_conf = 0.0;
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, presence = 0.0, frequency = 0.0;
    int64_t top_k = -1;
    bool ignore_eos = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("model-path", &a.model_path, "checkpoint directory (default: the demo model)"),
        BT_FLAG_STR("input-ids", &a.input_ids, "comma-separated prompt token ids"),
        BT_FLAG_INT("chunked-prefill-size", &a.chunk, "tokens per prefill chunk (default 4096)"),
        BT_FLAG_INT("threads", &a.threads, "CPU threads (default: one per core)"),
        BT_FLAG_STR("device", &a.device, "cpu (default) or cuda"),
        BT_FLAG_INT("base-gpu-id", &a.gpu, "the GPU of --device cuda (default 0)"),
        BT_FLAG_STR("dtype", &a.dtype, "cuda weights: auto (as stored), float32, bfloat16"),
        BT_FLAG_STR("activation-quant", &a.act_quant,
                    "none (default) or fp8: round the inputs of FP8/FP4 linears as the reference "
                    "deployment does"),
        BT_FLAG_INT("max-new-tokens", &max_new, "tokens to generate (default 16)"),
        BT_FLAG_FLOAT("temperature", &temperature, "0 = greedy (default 1.0)"),
        BT_FLAG_FLOAT("top-p", &top_p, "nucleus mass (default 1.0)"),
        BT_FLAG_INT("top-k", &top_k, "keep the k most likely (default: all)"),
        BT_FLAG_FLOAT("min-p", &min_p, "drop tokens below min-p x the top probability"),
        BT_FLAG_INT("seed", &seed, "sampling seed (default 0)"),
        BT_FLAG_FLOAT("presence-penalty", &presence,
                      "subtracted from a generated token's logit (-2..2, default 0)"),
        BT_FLAG_FLOAT("frequency-penalty", &frequency,
                      "subtracted per occurrence of a generated token (-2..2, default 0)"),
        BT_FLAG_BOOL("ignore-eos", &ignore_eos, "keep generating past the end-of-sequence token"),
        BT_FLAG_STR("speculative-algorithm", &spec_algo,
                    "DSPARK: the checkpoint's draft stages propose, the model verifies"),
        BT_FLAG_FLOAT("speculative-dspark-confidence", &spec_conf,
                      "verify proposals up to the first the draft trusts less (0..1, default 0)"),
    };
    char err[256];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton generate: %s\n", err);
        return 2;
    }
    if (max_new < 0 || max_new > (1 << 24) || a.chunk < 1 || temperature < 0 || top_p <= 0 ||
        top_p > 1 || min_p < 0 || min_p > 1 || !(presence >= -2 && presence <= 2) ||
        !(frequency >= -2 && frequency <= 2)) {
        fprintf(stderr, "baton generate: a flag is out of range (--max-new-tokens >= 0, "
                        "--chunked-prefill-size >= 1, --temperature >= 0, 0 < --top-p <= 1, "
                        "0 <= --min-p <= 1, -2 <= --presence-penalty, --frequency-penalty <= 2)\n");
        return 2;
    }
    if (spec_algo && strcmp(spec_algo, "DSPARK") != 0) {
        fprintf(stderr,
                "baton generate: --speculative-algorithm: '%s' is not one Baton has (DSPARK)\n",
                spec_algo);
        return 2;
    }
    if (!(spec_conf >= 0 && spec_conf <= 1)) {
        fprintf(stderr, "baton generate: --speculative-dspark-confidence must be 0..1\n");
        return 2;
    }
    a.draft = spec_algo != NULL;
    int32_t *ids;
    int n;
    int rc = parse_ids(a.input_ids, &ids, &n, "generate");
    if (rc) return rc;
    int chunk = a.chunk < n ? (int)a.chunk : n;
    int64_t ctx = n + max_new;
    int emit_vocab;
    /* a speculative step runs a block of draft rows, then the block's verification */
    bt_model_t *m = open_model(
        &a, ctx, a.draft && chunk < BT_MAX_DRAFT_BLOCK + 1 ? BT_MAX_DRAFT_BLOCK + 1 : chunk,
        "generate", &emit_vocab);
    if (!m) {
        free(ids);
        return 1;
    }
    const bt_model_config_t *c = bt_model_config(m);
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, c, ctx);
    uint8_t *state = bt_aligned_alloc(64, lay.slot_bytes);
    int32_t *out = bt_malloc_or_die((size_t)(max_new ? max_new : 1) * sizeof(int32_t));
    /* drawn as the services draw (bt_model_forward_sample: the same sampler over the same ids,
     * on the GPU with --device cuda), so the same seed gives the same tokens here and in a
     * cluster */
    bt_sample_req_t req = {.sampling = {(float)temperature, (float)top_p, (float)min_p, top_k > 0 ? (int)top_k : 0,
                                        (uint64_t)seed}};
    bt_penalties_t pen; /* as the decode group counts them */
    bt_penalties_init(&pen, (float)presence, (float)frequency);
    bt_sample_out_t drawn;
    bt_kv_state_reset(state);
    int produced = 0;
    /* every chunk but the last without logits; the last draws the first token */
    const int head = (n - 1) / chunk * chunk;
    rc = max_new > 0 && head > 0 ? prefill(m, &lay, state, ids, head, chunk, false, NULL, "generate") : 0;
    bt_forward_seq_t seq = {state, ids + head, n - head, false, NULL};
    int32_t tok;
    bt_spec_t *sp = NULL;
    if (a.draft && bt_spec_create(m, 1, emit_vocab, 0, &sp) != BT_OK) {
        fprintf(stderr, "baton generate: cannot set up speculative decoding for this model\n");
        rc = 1;
    }
    if (sp) bt_spec_set_confidence(sp, (float)spec_conf);
    while (rc == 0 && produced < max_new) {
        if (sp && produced > 0) {
            /* a speculative step after the first token: the draft needs the positions before */
            bt_spec_seq_t q = {.state = state,
                               .last = tok,
                               .sampling = req.sampling,
                               .pen = &pen,
                               .step = (uint64_t)produced,
                               .max_emit = (int)(max_new - produced)};
            if (bt_spec_step(sp, &lay, &q, 1, err, sizeof err) != BT_OK) {
                fprintf(stderr, "baton generate: %s\n", err);
                rc = 1;
                break;
            }
            bool stop = false;
            for (int i = 0; i < q.n_emit && !stop; i++) {
                tok = q.emit[i];
                out[produced++] = tok;
                bt_penalties_add(&pen, tok);
                stop = tok == c->eos_id && !ignore_eos;
            }
            if (stop) break;
            continue;
        }
        req.step = (uint64_t)produced;
        req.adj_ids = pen.ids;
        req.adj = pen.amount;
        req.n_adj = pen.n;
        if (bt_model_forward_sample(m, &lay, &seq, 1, emit_vocab, &req, &drawn, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton generate: %s\n", err);
            rc = 1;
            break;
        }
        tok = drawn.id;
        out[produced++] = tok;
        bt_penalties_add(&pen, tok);
        if (tok == c->eos_id && !ignore_eos) break;
        seq = (bt_forward_seq_t){state, &tok, 1, false, NULL};
    }
    if (rc == 0) {
        if (sp) {
            uint64_t steps, proposed, accepted;
            bt_spec_stats(sp, &steps, &proposed, &accepted);
            fprintf(stderr,
                    "baton generate: DSpark: %llu steps, %llu of %llu proposals accepted (%.2f "
                    "tokens a step)\n",
                    (unsigned long long)steps, (unsigned long long)accepted,
                    (unsigned long long)proposed,
                    steps ? (double)(accepted + steps) / (double)steps : 0.0);
        }
        for (int i = 0; i < produced; i++) printf(i ? ",%d" : "%d", out[i]);
        printf("\n");
    }
    bt_spec_destroy(sp);
    free(out);
    bt_penalties_free(&pen);
    bt_aligned_free(state);
    bt_model_destroy(m);
    free(ids);
    return rc;
}

int bt_cli_make_demo_model(int argc, char **argv)
{
    const char *output = NULL, *variant = "demo";
    bt_flag_t spec[] = {
        BT_FLAG_STR("output", &output, "directory to write the checkpoint into"),
        BT_FLAG_STR("variant", &variant, "demo (quantized storage) or demo2 (float32, odd shapes)"),
    };
    char err[512];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK || !output) {
        fprintf(stderr, "baton make-demo-model: %s\n", st != BT_OK ? err : "--output DIR is required");
        return 2;
    }
    if (bt_demo_model_write(output, variant, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton make-demo-model: %s\n", err);
        return 1;
    }
    fprintf(stderr, "baton make-demo-model: wrote the %s model (tiny, untrained) to %s\n", variant, output);
    return 0;
}

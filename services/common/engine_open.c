/* Opening a worker's engine (services/common/service.h): the model, its KV layout and the
 * compatibility hash. A file of its own so that processes which never run the model (router,
 * gateway) do not link the engine's backends and the GPU libraries behind them. */
#include "services/common/service.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/text/grammar.h"
#include "common/text/tokenizer.h"
#include "services/common/sim.h"
#include "services/engine/demo_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bt_status_t bt_service_engine_open(const char *model_path, const char *served_name,
                                   int64_t context_length, int max_batch_seqs,
                                   int max_batch_tokens, int threads, bt_service_engine_t *eng,
                                   char *err, size_t errlen)
{
    return bt_service_engine_open_tp(model_path, served_name, context_length, max_batch_seqs,
                                     max_batch_tokens, threads, NULL, NULL, eng, err, errlen);
}

/* The model's directory (the built-in demo model when model_path is NULL, written on first use)
 * and the name it is served under; both openers start here. */
static bt_status_t locate_model(const char *model_path, const char *served_name, bool announce,
                                bt_service_engine_t *eng, char *err, size_t errlen)
{
    memset(eng, 0, sizeof *eng);
    if (!model_path) {
        bt_status_t st = bt_demo_model_default(eng->model_dir, sizeof eng->model_dir, err, errlen);
        if (st != BT_OK) return st;
        if (announce) BT_LOG_INFO("serving the built-in demo model (tiny, untrained) from %s", eng->model_dir);
    } else {
        snprintf(eng->model_dir, sizeof eng->model_dir, "%s", model_path);
    }
    snprintf(eng->served_name, sizeof eng->served_name, "%s",
             served_name ? served_name : (model_path ? model_path : "baton-demo"));
    return BT_OK;
}

/* The context a worker serves when none is asked for: the model's, at most 8192. */
static int64_t default_context(const bt_model_config_t *cfg, int64_t context_length)
{
    if (context_length > 0) return context_length;
    return cfg->max_position < 8192 ? cfg->max_position : 8192;
}

bt_status_t bt_service_engine_open_tp(const char *model_path, const char *served_name,
                                      int64_t context_length, int max_batch_seqs,
                                      int max_batch_tokens, int threads, struct bt_comm *comm,
                                      const bt_service_device_t *dev, bt_service_engine_t *eng, char *err, size_t errlen)
{
    bt_status_t st = locate_model(model_path, served_name, true, eng, err, errlen);
    if (st != BT_OK) return st;
    bt_model_config_t cfg;
    st = bt_model_config_load(eng->model_dir, &cfg, err, errlen);
    if (st != BT_OK) return st;
    context_length = default_context(&cfg, context_length);
    int32_t *map = NULL;
    int classes = 0;
    st = bt_tokenizer_for_model(eng->model_dir, cfg.vocab, cfg.n_engram > 0, &map, &classes,
                                &eng->emit_vocab, err, errlen);
    if (st != BT_OK) return st;
    bt_model_options_t opt = bt_model_options_default();
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = threads;
    opt.max_ctx = context_length;
    opt.max_batch_seqs = max_batch_seqs;
    opt.max_batch_tokens = max_batch_tokens;
    opt.comm = comm;
    if (dev) {
        opt.device = dev->device;
        opt.gpu = dev->gpu;
        opt.cuda_weights = dev->weights;
        opt.draft = dev->draft;
        opt.activation_quant = dev->activation_quant;
        if (dev->draft && cfg.n_draft && dev->draft_block > cfg.draft_block) {
            snprintf(err, errlen,
                     "--speculative-dspark-block-size %d: the checkpoint drafts %d tokens a step",
                     dev->draft_block, cfg.draft_block);
            free(map);
            return BT_ERR_INVALID_ARG;
        }
    }
    st = bt_model_load(eng->model_dir, &opt, &eng->model, err, errlen);
    free(map);
    if (st != BT_OK) return st;
    eng->cfg = bt_model_config(eng->model);
    st = bt_kv_layout_init(&eng->layout, eng->cfg, context_length);
    if (st != BT_OK) {
        snprintf(err, errlen, "no KV layout for a %lld-token context", (long long)context_length);
        bt_service_engine_close(eng);
        return st;
    }
    eng->compat_hash = bt_kv_compat_hash(eng->cfg, &eng->layout, bt_model_tp_size(eng->model));
    if (dev && dev->activation_quant) eng->compat_hash ^= BT_AQ_COMPAT_MARKER;
    BT_LOG_INFO("model %s: %d layers, hidden %d, vocab %d; context %lld, KV slot %.1f KiB",
                eng->model_dir, eng->cfg->n_layers, eng->cfg->hidden, eng->cfg->vocab,
                (long long)context_length, (double)eng->layout.slot_bytes / 1024.0);
    return BT_OK;
}

bt_status_t bt_service_engine_open_sim(const char *model_path, const char *served_name,
                                       int64_t context_length, bt_service_engine_t *eng,
                                       char *err, size_t errlen)
{
    bt_status_t st = locate_model(model_path, served_name, false, eng, err, errlen);
    if (st != BT_OK) return st;
    st = bt_model_config_load(eng->model_dir, &eng->sim_cfg, err, errlen);
    if (st != BT_OK) return st;
    /* simulated tokens keep to the ids text carries too (a config-only directory: all) */
    st = bt_tokenizer_for_model(eng->model_dir, eng->sim_cfg.vocab, false, NULL, NULL, &eng->emit_vocab,
                                err, errlen);
    if (st != BT_OK) return st;
    context_length = default_context(&eng->sim_cfg, context_length);
    eng->sim_cfg.n_draft = 0; /* simulated groups do not draft */
    eng->sim_cfg.draft_block = 0;
    eng->cfg = &eng->sim_cfg;
    st = bt_kv_layout_init(&eng->layout, eng->cfg, context_length);
    if (st != BT_OK) {
        snprintf(err, errlen, "no KV layout for a %lld-token context", (long long)context_length);
        return st;
    }
    eng->compat_hash = bt_kv_compat_hash(eng->cfg, &eng->layout, 1) ^ BT_SIM_COMPAT_MARKER;
    BT_LOG_INFO("simulating model %s (config only, no weights): context %lld, KV slot %.1f KiB",
                eng->model_dir, (long long)context_length, (double)eng->layout.slot_bytes / 1024.0);
    return BT_OK;
}

void bt_service_engine_close(bt_service_engine_t *eng)
{
    bt_model_destroy(eng->model);
    eng->model = NULL;
    bt_grammar_vocab_destroy(eng->grammar_vocab);
    eng->grammar_vocab = NULL;
}

bt_status_t bt_service_grammar(bt_service_engine_t *eng, const Baton__V1__SamplingParams *sp,
                               bt_grammar_t **g_p, char *err, size_t errlen)
{
    *g_p = NULL;
    const char *rf = sp && sp->response_format ? sp->response_format : "";
    if (!*rf) return BT_OK;
    const int vocab = bt_service_emit_vocab(eng);
    if (sp->has_constrain_after &&
        (sp->constrain_after_token < 0 || sp->constrain_after_token >= vocab)) {
        snprintf(err, errlen, "constrain_after_token %d outside the vocabulary (0..%d)",
                 sp->constrain_after_token, vocab - 1);
        return BT_ERR_INVALID_ARG;
    }
    if (!eng->grammar_vocab) {
        bt_tokenizer_t *tok;
        if (bt_tokenizer_load(eng->model_dir, &tok, err, errlen) != BT_OK)
            return BT_ERR_INVALID_ARG;
        const double t0 = (double)bt_now_ms();
        const bt_status_t st =
            bt_grammar_vocab_create(tok, vocab, eng->cfg->eos_id, &eng->grammar_vocab);
        bt_tokenizer_destroy(tok);
        if (st != BT_OK) {
            snprintf(err, errlen, "cannot index the vocabulary for constrained decoding");
            return BT_ERR_INVALID_ARG;
        }
        BT_LOG_INFO("constrained decoding: %d token ids indexed in %.0f ms", vocab,
                    (double)bt_now_ms() - t0);
    }
    return bt_grammar_request(eng->grammar_vocab, rf, sp->json_schema,
                              sp->has_constrain_after ? sp->constrain_after_token : -1, g_p, err,
                              errlen);
}

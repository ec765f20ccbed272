/* The engine tests' way to a model on Baton's own demo checkpoints: written to a directory,
 * loaded with the engram token map of its tokenizer. */
#ifndef BT_TEST_DEMO_UTIL_H
#define BT_TEST_DEMO_UTIL_H

#include "common/text/tokenizer.h"
#include "services/engine/model.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* The model in dir (a demo checkpoint) on the CPU: threads, positions a sequence may reach,
 * tokens and sequences a forward may take, with or without its DSpark draft stages. NULL,
 * having said why on stderr, when it fails. */
static inline bt_model_t *demo_model_load_tp(const char *dir, int threads, int max_ctx,
                                             int max_batch_tokens, int max_seqs, bool draft,
                                             struct bt_comm *comm)
{
    char err[512];
    bt_model_config_t cfg;
    int32_t *map = NULL;
    int classes = 0;
    if (bt_model_config_load(dir, &cfg, err, sizeof err) != BT_OK ||
        bt_tokenizer_for_model(dir, cfg.vocab, true, &map, &classes, NULL, err, sizeof err) !=
            BT_OK) {
        fprintf(stderr, "%s: %s\n", dir, err);
        return NULL;
    }
    bt_model_options_t opt = bt_model_options_default();
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = threads;
    opt.max_ctx = max_ctx;
    opt.max_batch_tokens = max_batch_tokens;
    if (max_seqs > 0) opt.max_batch_seqs = max_seqs;
    opt.draft = draft;
    opt.comm = comm;
    bt_model_t *m = NULL;
    if (bt_model_load(dir, &opt, &m, err, sizeof err) != BT_OK) fprintf(stderr, "load: %s\n", err);
    free(map);
    return m;
}

static inline bt_model_t *demo_model_load_draft(const char *dir, int threads, int max_ctx,
                                                int max_batch_tokens, int max_seqs, bool draft)
{
    return demo_model_load_tp(dir, threads, max_ctx, max_batch_tokens, max_seqs, draft, NULL);
}

static inline bt_model_t *demo_model_load(const char *dir, int threads, int max_ctx,
                                          int max_batch_tokens, int max_seqs)
{
    return demo_model_load_draft(dir, threads, max_ctx, max_batch_tokens, max_seqs, false);
}

#endif

/* DSpark speculative decoding steps (MODEL-DS41.md): the draft proposes a block of tokens
 * after each sequence's last drawn token, the target runs that token and the proposals in
 * one forward, and each sequence keeps the longest prefix its rules accept plus one token of
 * the target's own. Greedy sequences get exactly the tokens plain decoding gives; sampled
 * ones get tokens distributed exactly as plain sampling's (chain rejection sampling against
 * the draft's distribution under the same sampling rules), from their own random stream.
 *
 *   bt_spec_t *sp;  bt_spec_create(model, max_seqs, &sp);
 *   bt_spec_seq_t q = {.state = slot, .last = tok, .sampling = rules, .step = drawn_before,
 *                      .max_emit = left};
 *   bt_spec_step(sp, &layout, &q, 1, err, sizeof err);   // q.emit[0 .. q.n_emit)
 *
 * After a step the slot holds `last` and the accepted proposals; emit holds the accepted
 * proposals and then the target's token, the next step's `last`. Logit adjustments (penalties,
 * logit_bias), constraints and log-probabilities are not applied here: the caller decodes such
 * sequences one token at a time. */
#ifndef BT_ENGINE_SPEC_H
#define BT_ENGINE_SPEC_H

#include "services/engine/model.h"

typedef struct {
    uint8_t *state;
    int32_t last; /* drawn, not yet in the slot */
    bt_sampling_t sampling;
    uint64_t step; /* tokens the sequence drew before `last` + 1: its random stream */
    int max_emit;  /* at most this many tokens (>= 1) */
    /* out */
    int32_t emit[BT_MAX_DRAFT_BLOCK + 1];
    int n_emit;
    int n_proposed, n_accepted;
} bt_spec_seq_t;

typedef struct bt_spec bt_spec_t;

bt_status_t bt_spec_create(bt_model_t *model, int max_seqs, int vocab, bt_spec_t **spec_p);
void bt_spec_destroy(bt_spec_t *spec);

bt_status_t bt_spec_step(bt_spec_t *spec, const bt_kv_layout_t *layout, bt_spec_seq_t *seqs,
                         int n_seqs, char *err, size_t errlen);

/* Proposals verified and accepted over the steps so far. */
void bt_spec_stats(const bt_spec_t *spec, uint64_t *steps, uint64_t *proposed, uint64_t *accepted);

#endif

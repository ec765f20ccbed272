/* DSpark speculative decoding steps (MODEL-DS41.md): the draft proposes a block of tokens
 * after each sequence's last drawn token, the target runs that token and the proposals in
 * one forward, and each sequence keeps the longest prefix its rules accept plus one token of
 * the target's own. Greedy sequences get exactly the tokens plain decoding gives; sampled
 * ones get tokens distributed exactly as plain sampling's (chain rejection sampling against
 * the draft's distribution under the same sampling rules), from their own random stream.
 *
 *   bt_spec_t *sp;  bt_spec_create(model, max_seqs, vocab, 0, &sp);
 *   bt_spec_seq_t q = {.state = slot, .last = tok, .sampling = rules, .step = drawn_before,
 *                      .max_emit = left};
 *   bt_spec_step(sp, &layout, &q, 1, err, sizeof err);   // q.emit[0 .. q.n_emit)
 *
 * After a step the slot holds `last` and the accepted proposals; emit holds the accepted
 * proposals and then the target's token, the next step's `last`, and with want_logprob their
 * log-probabilities under the target's rows (as a plain step reports a drawn token's). A
 * sequence's logit adjustments (penalties, logit_bias) and constraint apply to every row as the
 * proposals before it advance them (on copies: the caller advances its own as it takes the
 * tokens), to the draft's rows as to the target's. */
#ifndef BT_ENGINE_SPEC_H
#define BT_ENGINE_SPEC_H

#include "services/engine/model.h"

typedef struct {
    uint8_t *state;
    int slot;     /* the caller's index of the slot (a TP group's plans name it) */
    int32_t last; /* drawn, not yet in the slot */
    bt_sampling_t sampling;
    uint64_t step; /* tokens the sequence drew before `last` + 1: its random stream */
    int max_emit;  /* at most this many tokens (>= 1) */
    const bt_penalties_t *pen;        /* its logit adjustments, NULL: none */
    const struct bt_grammar *grammar; /* its constraint (over ids 0..vocab-1), NULL: none */
    bool want_logprob;
    int n_top; /* and the n_top most likely tokens' (0..BT_SAMPLE_TOP_MAX) */
    /* out */
    int32_t emit[BT_MAX_DRAFT_BLOCK + 1];
    float logprob[BT_MAX_DRAFT_BLOCK + 1];
    bt_top_logprob_t top[BT_MAX_DRAFT_BLOCK + 1][BT_SAMPLE_TOP_MAX];
    int n_emit;
    int n_proposed, n_accepted;
} bt_spec_seq_t;

typedef struct bt_spec bt_spec_t;

/* Steps of up to max_seqs sequences sampling over ids 0..vocab-1, verifying up to
 * max_proposals proposals a step (0: the draft's block). */
bt_status_t bt_spec_create(bt_model_t *model, int max_seqs, int vocab, int max_proposals,
                           bt_spec_t **spec_p);
void bt_spec_destroy(bt_spec_t *spec);

bt_status_t bt_spec_step(bt_spec_t *spec, const bt_kv_layout_t *layout, bt_spec_seq_t *seqs,
                         int n_seqs, char *err, size_t errlen);

/* The most proposals a sequence verifies in a step of n_seqs sequences: the block, fewer where
 * the model's batch-invariant rows (bt_model_batch_invariant_rows) would not hold them all. 0:
 * a plain step does as much (the services take theirs then). */
int bt_spec_proposals(const bt_spec_t *spec, int n_seqs);
/* Verifies only the proposals before the first whose confidence (the draft's own estimate that
 * it is accepted, given the ones before) is under tau, 0..1: less verification work where the
 * draft expects to be wrong. 0 (the default) verifies the whole block. The proposals a step
 * verifies depend on the draft alone, so the output's distribution does not change. */
void bt_spec_set_confidence(bt_spec_t *spec, float tau);

/* A tensor-parallel group's lead tells the other ranks before each engine call of a step, so
 * that they run it too (services/common/tp_group.h): the draft, the verification forward (its
 * sequences carry undo records) and the rollback to n_accepted + 1 tokens of each sequence. */
typedef struct {
    void *ctx;
    bt_status_t (*draft)(void *ctx, const bt_spec_seq_t *seqs, int n);
    bt_status_t (*verify)(void *ctx, const bt_spec_seq_t *seqs, const bt_forward_seq_t *fwd, int n);
    bt_status_t (*rollback)(void *ctx, const bt_spec_seq_t *seqs, int n);
} bt_spec_group_t;
void bt_spec_set_group(bt_spec_t *spec, const bt_spec_group_t *group);

/* Proposals verified and accepted over the steps so far. */
void bt_spec_stats(const bt_spec_t *spec, uint64_t *steps, uint64_t *proposed, uint64_t *accepted);

#endif

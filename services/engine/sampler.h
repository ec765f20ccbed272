/* Token sampling shared by prefill (the first token) and decode (the rest): greedy at
 * temperature 0 (lowest id on ties), else temperature, top-k, top-p and min-p. The random
 * draw of step k depends only on (seed, k), so a request samples the same whichever process
 * draws its token.
 *
 *   bt_sampler_t *s = bt_sampler_create(vocab);          // scratch for one thread
 *   int tok = bt_sampler_sample(s, &params, logits, step, &logprob, top, n_top);
 *   bt_sampler_destroy(s);
 */
#ifndef BT_SERVICES_SAMPLER_H
#define BT_SERVICES_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
} bt_sampling_t;

typedef struct bt_sampler bt_sampler_t;

bt_sampler_t *bt_sampler_create(int vocab);
void bt_sampler_destroy(bt_sampler_t *s);

typedef struct {
    int32_t id;
    float logprob;
} bt_top_logprob_t;

/* Samples from logits[0 .. vocab) (not modified; the workers' vocab is the ids their tokenizer
 * has, which a model's padded embedding may exceed). logprob_p (may be NULL) gets the chosen
 * token's log-probability under the unmodified distribution over those ids; top (may be NULL)
 * the n_top most likely tokens and theirs. */
int32_t bt_sampler_sample(bt_sampler_t *s, const bt_sampling_t *p, const float *logits,
                          uint64_t step, float *logprob_p, bt_top_logprob_t *top, int n_top);

/* The distribution bt_sampler_sample draws from under p (the kept tokens' probabilities, 0
 * elsewhere; at temperature 0 all on the argmax) into probs[0 .. vocab); returns the argmax. */
int32_t bt_sampler_probs(bt_sampler_t *s, const bt_sampling_t *p, const float *logits,
                         float *probs);

/* Token id's log-probability under logits (as bt_sampler_sample reports a drawn token's), and
 * the n_top most likely tokens with theirs into top (may be NULL). */
float bt_sampler_logprob(bt_sampler_t *s, const float *logits, int32_t id, bt_top_logprob_t *top,
                         int n_top);

/* A request's logit adjustments (bt_sample_req_t's adj_ids / adj / n_adj): presence and
 * frequency penalties (OpenAI's presence_penalty / frequency_penalty) and its logit_bias. Each
 * distinct token with an amount to subtract from its logit at the next draw: -bias, plus, once
 * generated, presence + frequency * count. Generated tokens are counted only when a penalty is
 * not 0. */
typedef struct {
    float presence, frequency;
    int32_t *ids, *count;
    float *base, *amount;
    int n, cap;
} bt_penalties_t;

void bt_penalties_init(bt_penalties_t *p, float presence, float frequency);
/* logit_bias: bias added to the token's logits (before any token is counted; ids distinct) */
void bt_penalties_bias(bt_penalties_t *p, int32_t token, float bias);
void bt_penalties_add(bt_penalties_t *p, int32_t token);
/* dst (initialized, or a copy before) becomes a copy of src. */
void bt_penalties_copy(bt_penalties_t *dst, const bt_penalties_t *src);
void bt_penalties_free(bt_penalties_t *p);

#endif

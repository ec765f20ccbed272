#include "services/engine/spec.h"

#include "common/alloc.h"
#include "common/text/grammar.h"
#include "kernels/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* independent random streams of a request's seed: the draft's picks, the acceptance tests and
 * the draws from a rejected row's residual (the target's own draws use the seed itself) */
#define SALT_DRAFT 0x6a09e667f3bcc908ull
#define SALT_ACCEPT 0xbb67ae8584caa73bull
#define SALT_RESIDUAL 0x3c6ef372fe94f82bull

struct bt_spec {
    bt_model_t *m;
    int max_seqs, vocab, block, rows, V; /* V: the model's vocabulary (a logits row) */
    bt_sampler_t *sampler;
    bt_kv_undo_t *undo[BT_MODEL_MAX_SEQS];
    int32_t *drafts; /* [max_seqs][block] */
    float *conf;     /* [max_seqs][block] confidence logits */
    float tau;
    float *q;        /* [max_seqs][block][vocab] the draft's distributions (sampled rows) */
    float *p;        /* [vocab] a target row's */
    float *logits;   /* [max_seqs][rows][V] */
    int32_t *ids;    /* [max_seqs][rows] */
    const bt_spec_seq_t *cur; /* the step's sequences, for the draft's picks */
    /* a sequence's adjustments and constraint as its proposals advance them: copies for the
     * draft's picks, then for the verification */
    bt_penalties_t pen[BT_MODEL_MAX_SEQS];
    bt_grammar_t *grammar[BT_MODEL_MAX_SEQS];
    uint32_t *mask; /* [(vocab + 31) / 32] */
    float *row;     /* [V] a target row, adjusted */
    bt_spec_group_t group; /* a TP group's hooks (none: all NULL) */
    uint64_t steps, proposed, accepted;
};

bt_status_t bt_spec_create(bt_model_t *m, int max_seqs, int vocab, int max_proposals,
                           bt_spec_t **spec_p)
{
    int block = bt_model_draft_block(m), rows = bt_model_verify_rows(m);
    const bt_model_config_t *c = bt_model_config(m);
    if (block < 1 || rows < 2 || max_seqs < 1 || max_seqs > BT_MODEL_MAX_SEQS || vocab < 1 ||
        vocab > c->vocab || max_proposals < 0)
        return BT_ERR_INVALID_ARG;
    if (max_proposals > 0 && max_proposals + 1 < rows) rows = max_proposals + 1;
    bt_spec_t *sp = bt_calloc_or_die(1, sizeof *sp);
    sp->m = m;
    sp->max_seqs = max_seqs;
    sp->vocab = vocab;
    sp->block = block;
    sp->rows = rows;
    sp->V = c->vocab;
    sp->sampler = bt_sampler_create(vocab);
    for (int q = 0; q < max_seqs; q++) {
        bt_status_t st = bt_kv_undo_create(m, rows, &sp->undo[q]);
        if (st != BT_OK) {
            bt_spec_destroy(sp);
            return st;
        }
    }
    sp->drafts = bt_malloc_or_die((size_t)max_seqs * block * sizeof(int32_t));
    sp->conf = bt_malloc_or_die((size_t)max_seqs * block * sizeof(float));
    sp->q = bt_malloc_or_die((size_t)max_seqs * block * vocab * sizeof(float));
    sp->p = bt_malloc_or_die((size_t)vocab * sizeof(float));
    sp->logits = bt_malloc_or_die((size_t)max_seqs * rows * sp->V * sizeof(float));
    sp->ids = bt_malloc_or_die((size_t)max_seqs * rows * sizeof(int32_t));
    sp->mask = bt_malloc_or_die((size_t)(vocab + 31) / 32 * sizeof(uint32_t));
    sp->row = bt_malloc_or_die((size_t)sp->V * sizeof(float));
    *spec_p = sp;
    return BT_OK;
}

void bt_spec_destroy(bt_spec_t *sp)
{
    if (!sp) return;
    bt_sampler_destroy(sp->sampler);
    for (int q = 0; q < sp->max_seqs; q++)
        bt_kv_undo_destroy(sp->undo[q]);
    free(sp->drafts);
    free(sp->conf);
    free(sp->q);
    free(sp->p);
    free(sp->logits);
    free(sp->ids);
    free(sp->mask);
    free(sp->row);
    for (int q = 0; q < BT_MODEL_MAX_SEQS; q++) {
        bt_penalties_free(&sp->pen[q]);
        bt_grammar_destroy(sp->grammar[q]);
    }
    free(sp);
}

void bt_spec_set_group(bt_spec_t *sp, const bt_spec_group_t *group)
{
    sp->group = group ? *group : (bt_spec_group_t){0};
}

void bt_spec_set_confidence(bt_spec_t *sp, float tau)
{
    sp->tau = tau > 0.0f ? (tau < 1.0f ? tau : 1.0f) : 0.0f;
}

void bt_spec_stats(const bt_spec_t *sp, uint64_t *steps, uint64_t *proposed, uint64_t *accepted)
{
    *steps = sp->steps;
    *proposed = sp->proposed;
    *accepted = sp->accepted;
}

/* Greedy at temperature 0, else a draw from the row's distribution under the sequence's
 * rules, which the verification needs (q). */
static int32_t draft_draw(bt_spec_t *sp, const bt_spec_seq_t *q, int seq, int row,
                          const float *logits)
{
    /* (greedy: the argmax, as a plain step's draw; no distribution to keep) */
    if (!(q->sampling.temperature > 0.0f))
        return bt_sampler_sample(sp->sampler, &q->sampling, logits, 0, NULL, NULL, 0);
    bt_sampler_probs(sp->sampler, &q->sampling, logits,
                     sp->q + ((size_t)seq * sp->block + row) * sp->vocab);
    bt_sampling_t s = q->sampling;
    s.seed ^= SALT_DRAFT;
    return bt_sampler_sample(sp->sampler, &s, logits, q->step + (uint64_t)row, NULL, NULL, 0);
}

/* Sequence q's copies of its adjustments and constraint, in their state before the step. */
static void copies_reset(bt_spec_t *sp, int q)
{
    const bt_spec_seq_t *s = &sp->cur[q];
    if (s->pen) bt_penalties_copy(&sp->pen[q], s->pen);
    bt_grammar_destroy(sp->grammar[q]);
    sp->grammar[q] = s->grammar ? bt_grammar_clone(s->grammar) : NULL;
}

/* A row as a plain step draws from it: the adjustments subtracted, then the ids the constraint
 * forbids (while it is active) at -inf. */
static void adjust(bt_spec_t *sp, int q, float *row)
{
    const bt_penalties_t *pen = &sp->pen[q];
    if (sp->cur[q].pen)
        for (int i = 0; i < pen->n; i++)
            row[pen->ids[i]] -= pen->amount[i];
    if (sp->grammar[q] && bt_grammar_active(sp->grammar[q])) {
        bt_grammar_mask(sp->grammar[q], sp->mask);
        for (int i = 0; i < sp->vocab; i++)
            if (!((sp->mask[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
    }
}

/* The copies after token t, as the sequence would be once it emitted t. */
static void advance(bt_spec_t *sp, int q, int32_t t)
{
    if (sp->cur[q].pen) bt_penalties_add(&sp->pen[q], t);
    if (sp->grammar[q]) bt_grammar_accept(sp->grammar[q], t);
}

/* The draft's pick: greedy at temperature 0, else a draw from its distribution under the
 * sequence's rules (kept for the verification), from its row adjusted as the target's are. */
static int32_t draft_pick(void *ctx, int seq, int row, float *logits, int V)
{
    bt_spec_t *sp = ctx;
    const bt_spec_seq_t *q = &sp->cur[seq];
    if (row == 0) copies_reset(sp, seq);
    adjust(sp, seq, logits);
    int32_t t = draft_draw(sp, q, seq, row, logits);
    advance(sp, seq, t);
    return t;
}

/* A draw from norm(max(p - q, 0)), walking the ids in order; p where that is empty. */
static int32_t residual_draw(const float *p, const float *q, int V, double unit)
{
    double total = 0.0;
    for (int i = 0; i < V; i++)
        total += p[i] > q[i] ? (double)p[i] - (double)q[i] : 0.0;
    bool from_p = !(total > 0.0);
    if (from_p) {
        total = 0.0;
        for (int i = 0; i < V; i++)
            total += p[i];
    }
    double u = unit * total;
    int32_t last = -1;
    for (int i = 0; i < V; i++) {
        double w = from_p ? (double)p[i] : (p[i] > q[i] ? (double)p[i] - (double)q[i] : 0.0);
        if (w <= 0.0) continue;
        last = i;
        u -= w;
        if (u < 0) return i;
    }
    return last >= 0 ? last : 0;
}

static bt_status_t group_failed(bt_status_t st, char *err, size_t errlen)
{
    snprintf(err, errlen, "tensor-parallel group failed (%s): a rank died or stalled",
             bt_status_str(st));
    return st;
}

int bt_spec_proposals(const bt_spec_t *sp, int n_seqs)
{
    /* the verification within the rows whose results do not depend on the batch: a step of
     * many sequences verifies fewer proposals each, or none */
    int inv = bt_model_batch_invariant_rows(sp->m), k = sp->rows - 1;
    if (k > sp->block) k = sp->block;
    if (inv > 0 && n_seqs > 0) {
        const int fit = inv / n_seqs - 1; /* (a row each for the sequences' own tokens) */
        if (fit < k) k = fit > 0 ? fit : 0;
    }
    return k;
}

bt_status_t bt_spec_step(bt_spec_t *sp, const bt_kv_layout_t *lay, bt_spec_seq_t *seqs, int n,
                         char *err, size_t errlen)
{
    bt_status_t st0;
    if (n < 1 || n > sp->max_seqs) {
        snprintf(err, errlen, "speculative step of %d sequences outside 1..%d", n, sp->max_seqs);
        return BT_ERR_INVALID_ARG;
    }
    uint8_t *states[BT_MODEL_MAX_SEQS];
    int32_t last[BT_MODEL_MAX_SEQS];
    for (int q = 0; q < n; q++) {
        if (seqs[q].max_emit < 1) {
            snprintf(err, errlen, "sequence %d: a step must be allowed at least one token", q);
            return BT_ERR_INVALID_ARG;
        }
        states[q] = seqs[q].state;
        last[q] = seqs[q].last;
    }
    sp->cur = seqs;
    const int k_max = bt_spec_proposals(sp, n); /* 0: no draft runs */
    const bt_spec_group_t *grp = &sp->group;
    bt_status_t st;
    if (k_max > 0) {
        if (grp->draft && (st0 = grp->draft(grp->ctx, seqs, n)) != BT_OK)
            return group_failed(st0, err, errlen);
        st = bt_model_draft(sp->m, lay, states, last, n, draft_pick, sp, sp->drafts, sp->conf, err,
                            errlen);
        if (st != BT_OK) return st;
    }

    /* the target over [last, proposals...] */
    bt_forward_seq_t fs[BT_MODEL_MAX_SEQS];
    for (int q = 0; q < n; q++) {
        int k = k_max;
        if (k > sp->block) k = sp->block;
        if (k > seqs[q].max_emit - 1) k = seqs[q].max_emit - 1;
        if (sp->tau > 0.0f) /* up to the first the draft doubts (sigmoid(conf) < tau) */
            for (int i = 0; i < k; i++)
                if (1.0f / (1.0f + expf(-sp->conf[(size_t)q * sp->block + i])) < sp->tau) k = i;
        int32_t *ids = sp->ids + (size_t)q * sp->rows;
        ids[0] = seqs[q].last;
        memcpy(ids + 1, sp->drafts + (size_t)q * sp->block, (size_t)k * sizeof(int32_t));
        seqs[q].n_proposed = k;
        fs[q] = (bt_forward_seq_t){.state = seqs[q].state,
                                   .ids = ids,
                                   .n = k + 1,
                                   .all_logits = true,
                                   .undo = sp->undo[q]};
    }
    if (grp->verify && (st0 = grp->verify(grp->ctx, seqs, fs, n)) != BT_OK)
        return group_failed(st0, err, errlen);
    st = bt_model_forward(sp->m, lay, fs, n, sp->logits, err, errlen);
    if (st != BT_OK) return st;

    /* each row judged as a plain step would draw from it: the adjustments and the constraint
     * advanced by the proposals before it */
    const float *rows = sp->logits;
    for (int q = 0; q < n; q++) {
        bt_spec_seq_t *s = &seqs[q];
        const int32_t *d = sp->ids + (size_t)q * sp->rows + 1;
        const bool greedy = !(s->sampling.temperature > 0.0f);
        const int n_top = s->n_top < BT_SAMPLE_TOP_MAX ? s->n_top : BT_SAMPLE_TOP_MAX;
        copies_reset(sp, q);
        int a = 0;
        for (;; a++) {
            float *row = sp->row;
            memcpy(row, rows + (size_t)a * sp->V, (size_t)sp->V * sizeof(float));
            adjust(sp, q, row);
            int32_t t;
            bool stop = true;
            if (a == s->n_proposed) { /* every proposal accepted: the row's own draw */
                t = bt_sampler_sample(sp->sampler, &s->sampling, row, s->step + (uint64_t)a, NULL,
                                      NULL, 0);
            } else if (greedy) {
                t = bt_sampler_sample(sp->sampler, &s->sampling, row, 0, NULL, NULL, 0);
                stop = t != d[a];
            } else {
                const float *qd = sp->q + ((size_t)q * sp->block + a) * sp->vocab;
                bt_sampler_probs(sp->sampler, &s->sampling, row, sp->p);
                double ratio = (double)sp->p[d[a]] / (double)qd[d[a]];
                stop =
                    !(bt_smp_unit(s->sampling.seed ^ SALT_ACCEPT, s->step + (uint64_t)a) < ratio);
                t = stop ? residual_draw(
                               sp->p, qd, sp->vocab,
                               bt_smp_unit(s->sampling.seed ^ SALT_RESIDUAL, s->step + (uint64_t)a))
                         : d[a];
            }
            s->emit[a] = t;
            if (s->want_logprob)
                s->logprob[a] = bt_sampler_logprob(sp->sampler, row, t, s->top[a], n_top);
            if (stop) break;
            advance(sp, q, t);
        }
        s->n_emit = a + 1;
        s->n_accepted = a;
        sp->proposed += (uint64_t)s->n_proposed;
        sp->accepted += (uint64_t)a;
        rows += (size_t)fs[q].n * sp->V;
    }
    if (grp->rollback && (st0 = grp->rollback(grp->ctx, seqs, n)) != BT_OK)
        return group_failed(st0, err, errlen);
    for (int q = 0; q < n; q++) {
        st = bt_model_rollback(sp->m, lay, seqs[q].state, sp->undo[q], seqs[q].n_accepted + 1, err,
                               errlen);
        if (st != BT_OK) return st;
    }
    sp->steps++;
    return BT_OK;
}

/* DSpark speculative decoding on the demo checkpoints (random draft weights, so the tests
 * force proposals where they need accepted ones):
 *   - a verification forward of proposals with a wrong one at every place, rolled back to
 *     the accepted prefix, leaves the slot byte for byte as plain one-token decoding does, and
 *     its rows up to the first wrong proposal are the plain steps' logits, bit for bit;
 *   - greedy speculative steps (bt_spec_step) give plain greedy decoding's tokens, sequences
 *     batched and budgets cut short;
 *   - sampled steps draw their first token from the target's distribution, not the draft's
 *     (a chi-square test that would fail by a wide margin if the draft's were taken);
 *   - the draft only reads the slot, a rollback refuses a record that is not the slot's, and a
 *     model loaded without its draft stages keeps the layout without their rings. */
#include "bt_test.h"
#include "common/alloc.h"
#include "common/text/grammar.h"
#include "common/text/tokenizer.h"
#include "common/comm/comm.h"
#include "kernels/sampling.h"
#include "services/engine/demo_model.h"
#include "services/engine/sampler.h"
#include "services/engine/spec.h"
#include "unit/services/engine/demo_util.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define CTX 192
#define PROMPT 23
#define GEN 72

typedef struct {
    char dir[256];
    bt_model_t *m;
    const bt_model_config_t *c;
    bt_kv_layout_t lay;
} fixture_t;

static bool fixture_open(fixture_t *f, const char *variant)
{
    char err[512];
    snprintf(f->dir, sizeof f->dir, "/tmp/bt-spec-%s-%d", variant, (int)getpid());
    if (bt_demo_model_write(f->dir, variant, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return false;
    }
    f->m = demo_model_load_draft(f->dir, 2, CTX, 64, 4, true);
    if (!f->m) return false;
    f->c = bt_model_config(f->m);
    bt_kv_layout_init(&f->lay, f->c, CTX);
    return true;
}

static void fixture_close(fixture_t *f)
{
    bt_model_destroy(f->m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", f->dir);
}

static int32_t argmax(const float *row, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

static void prompt_ids(int32_t *ids, int n, int vocab, int salt)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 37 + salt * 11 + 5) % (vocab - 20)) + 3;
}

/* Prefills the prompt into a fresh slot; logits (may be NULL) gets the last row. */
static void prefill(fixture_t *f, uint8_t *slot, const int32_t *ids, int n, float *logits)
{
    char err[512];
    bt_kv_state_reset(slot);
    bt_forward_seq_t seq = {slot, ids, n, false, NULL};
    BT_CHECK(bt_model_forward(f->m, &f->lay, &seq, 1, logits, err, sizeof err) == BT_OK);
}

/* The live bytes of a slot (every range written since it was empty) compared. */
static bool same_live_state(fixture_t *f, const uint8_t *a, const uint8_t *b)
{
    bt_kv_header_t zero;
    memset(&zero, 0, sizeof zero);
    bt_kv_range_t rg[4 * BT_MAX_LAYERS + 1];
    int nr = bt_kv_changed_ranges(f->c, &f->lay, &zero, a, rg, (int)(sizeof rg / sizeof rg[0]));
    for (int r = 0; r < nr; r++)
        if (memcmp(a + rg[r].off, b + rg[r].off, rg[r].len) != 0) return false;
    return true;
}

static void rollback_exact(const char *variant)
{
    fixture_t f;
    BT_CHECK(fixture_open(&f, variant));
    if (!f.m) return;
    char err[512];
    int V = f.c->vocab, rows = bt_model_verify_rows(f.m);
    BT_CHECK(rows >= 2);
    uint8_t *ref = bt_aligned_alloc(64, f.lay.slot_bytes),
            *spec = bt_aligned_alloc(64, f.lay.slot_bytes);
    float *ref_logits = bt_malloc_or_die((size_t)GEN * V * sizeof(float));
    float *rows_logits = bt_malloc_or_die((size_t)rows * V * sizeof(float));
    int32_t ids[PROMPT], tok[GEN];
    prompt_ids(ids, PROMPT, V, 1);

    /* plain greedy: tok[g] from ref_logits[g] */
    prefill(&f, ref, ids, PROMPT, ref_logits);
    tok[0] = argmax(ref_logits, V);
    for (int g = 1; g < GEN; g++) {
        bt_forward_seq_t seq = {ref, &tok[g - 1], 1, false, NULL};
        BT_CHECK(bt_model_forward(f.m, &f.lay, &seq, 1, ref_logits + (size_t)g * V, err,
                                  sizeof err) == BT_OK);
        tok[g] = argmax(ref_logits + (size_t)g * V, V);
    }

    /* verifications with the first wrong proposal at every place (or none), rolled back */
    bt_kv_undo_t *undo;
    BT_CHECK(bt_kv_undo_create(f.m, rows, &undo) == BT_OK);
    prefill(&f, spec, ids, PROMPT, NULL);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int g = 1, steps = 0, placed[8] = {0};
    while (g < GEN) {
        int k = rows - 1 < GEN - 1 - g ? rows - 1 : GEN - 1 - g;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int wrong = (int)((x >> 33) % (uint64_t)(k + 1)); /* k: every proposal right */
        int32_t in[8];
        in[0] = tok[g - 1];
        for (int i = 0; i < k; i++)
            in[1 + i] = i == wrong ? (tok[g + i] + 1) % V : tok[g + i];
        bt_forward_seq_t seq = {spec, in, k + 1, true, undo};
        BT_CHECK(bt_model_forward(f.m, &f.lay, &seq, 1, rows_logits, err, sizeof err) == BT_OK);
        int accepted = 0;
        while (accepted < k && argmax(rows_logits + (size_t)accepted * V, V) == in[1 + accepted])
            accepted++;
        BT_CHECK_MSG(accepted == wrong, "%s at %d: %d accepted, the first wrong is %d", variant, g,
                     accepted, wrong);
        for (int r = 0; r <= accepted; r++)
            BT_CHECK_MSG(memcmp(rows_logits + (size_t)r * V, ref_logits + (size_t)(g + r) * V,
                                (size_t)V * sizeof(float)) == 0,
                         "%s at %d: row %d differs from the plain step", variant, g, r);
        BT_CHECK(bt_model_rollback(f.m, &f.lay, spec, undo, accepted + 1, err, sizeof err) ==
                 BT_OK);
        placed[wrong < 8 ? wrong : 7]++;
        g += accepted + 1;
        steps++;
    }
    BT_CHECK_EQ_INT(g, GEN);
    BT_CHECK_MSG(same_live_state(&f, ref, spec),
                 "%s: the slot after %d verifications differs from plain decoding", variant, steps);
    /* every place of the first wrong proposal came up */
    for (int i = 0; i < rows - 1; i++)
        BT_CHECK_MSG(placed[i] > 0, "%s: no step rejected at %d", variant, i);
    /* a record is for the slot that ran it, once */
    BT_CHECK(bt_model_rollback(f.m, &f.lay, spec, undo, 1, err, sizeof err) != BT_OK);
    bt_kv_undo_destroy(undo);
    free(ref_logits);
    free(rows_logits);
    bt_aligned_free(ref);
    bt_aligned_free(spec);
    fixture_close(&f);
}

static void test_rollback_demo(void)
{
    rollback_exact("demo");
}

static void test_rollback_demo2(void)
{
    rollback_exact("demo2");
}

/* What a sequence's draws obey besides greedy: nothing, logit adjustments, or a constraint. */
typedef enum { RULES_NONE, RULES_PENALTIES, RULES_JSON } rules_t;

typedef struct {
    bt_penalties_t pen;
    bt_grammar_t *g;
    uint32_t *allow;
} rules_state_t;

static void rules_init(rules_state_t *r, rules_t rules, bt_grammar_vocab_t *gv, int V)
{
    memset(r, 0, sizeof *r);
    /* negative penalties favour tokens already drawn, which this model's greedy runs repeat */
    bt_penalties_init(&r->pen, rules == RULES_PENALTIES ? -1.5f : 0.0f,
                      rules == RULES_PENALTIES ? -0.5f : 0.0f);
    if (rules == RULES_PENALTIES) bt_penalties_bias(&r->pen, 42, 2.5f);
    if (rules == RULES_JSON) r->g = bt_grammar_json_object(gv, -1);
    r->allow = bt_malloc_or_die((size_t)(V + 31) / 32 * sizeof(uint32_t));
}

static void rules_free(rules_state_t *r)
{
    bt_penalties_free(&r->pen);
    bt_grammar_destroy(r->g);
    free(r->allow);
}

static void rules_advance(rules_state_t *r, int32_t t)
{
    bt_penalties_add(&r->pen, t);
    if (r->g) BT_CHECK(bt_grammar_accept(r->g, t));
}

/* A plain step's draw, as the services make it: the adjusted and masked row, greedy. */
static int32_t plain_draw(fixture_t *f, uint8_t *slot, int32_t in, rules_state_t *r, uint64_t step,
                          float *lp, bt_top_logprob_t *top)
{
    char err[512];
    bt_forward_seq_t seq = {slot, &in, 1, false, NULL};
    if (r->g && bt_grammar_active(r->g)) bt_grammar_mask(r->g, r->allow);
    bt_sample_req_t req = {.step = step,
                           .want_logprob = true,
                           .n_top = 3,
                           .adj_ids = r->pen.ids,
                           .adj = r->pen.amount,
                           .n_adj = r->pen.n,
                           .allow = r->g && bt_grammar_active(r->g) ? r->allow : NULL};
    bt_sample_out_t out;
    BT_CHECK(bt_model_forward_sample(f->m, &f->lay, &seq, 1, f->c->vocab, &req, &out, err,
                                     sizeof err) == BT_OK);
    *lp = out.logprob;
    memcpy(top, out.top, 3 * sizeof *top);
    return out.id;
}

/* Greedy speculative steps against plain greedy decoding, two sequences at once, with their
 * log-probabilities (and the 3 likeliest tokens') as a plain step reports them; tau: the
 * confidence under which proposals go unverified (1: none is); rules: what the draws obey;
 * most: the proposals a step may verify (0: the draft's block). */
static void greedy_equal(const char *variant, float tau, rules_t rules, int most)
{
    fixture_t f;
    BT_CHECK(fixture_open(&f, variant));
    if (!f.m) return;
    char err[512];
    int V = f.c->vocab;
    enum { SEQS = 2 };
    uint8_t *slot[SEQS], *ref = bt_aligned_alloc(64, f.lay.slot_bytes);
    int32_t want[SEQS][GEN], got[SEQS][GEN], last[SEQS];
    float want_lp[SEQS][GEN], got_lp[SEQS][GEN];
    bt_top_logprob_t want_top[SEQS][GEN][3], got_top[SEQS][GEN][3];
    int n_got[SEQS] = {0}, budget[SEQS] = {GEN, GEN - 9};
    bt_tokenizer_t *tok = NULL;
    bt_grammar_vocab_t *gv = NULL;
    BT_CHECK(bt_tokenizer_load(f.dir, &tok, err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_vocab_create(tok, V, f.c->eos_id, &gv) == BT_OK);
    rules_state_t mine[SEQS];
    for (int q = 0; q < SEQS; q++) {
        int32_t ids[PROMPT];
        const int n = PROMPT - 4 * q;
        prompt_ids(ids, n, V, 3 + q);
        rules_state_t r;
        rules_init(&r, rules, gv, V);
        bt_kv_state_reset(ref);
        bt_forward_seq_t head = {ref, ids, n - 1, false, NULL};
        BT_CHECK(bt_model_forward(f.m, &f.lay, &head, 1, NULL, err, sizeof err) == BT_OK);
        for (int g = 0; g < budget[q]; g++) {
            want[q][g] = plain_draw(&f, ref, g ? want[q][g - 1] : ids[n - 1], &r, (uint64_t)g,
                                    &want_lp[q][g], want_top[q][g]);
            rules_advance(&r, want[q][g]);
        }
        rules_free(&r);
        /* the speculative run: the same first token, then steps */
        slot[q] = bt_aligned_alloc(64, f.lay.slot_bytes);
        rules_init(&mine[q], rules, gv, V);
        bt_kv_state_reset(slot[q]);
        head.state = slot[q];
        BT_CHECK(bt_model_forward(f.m, &f.lay, &head, 1, NULL, err, sizeof err) == BT_OK);
        last[q] = plain_draw(&f, slot[q], ids[n - 1], &mine[q], 0, &got_lp[q][0], got_top[q][0]);
        got[q][n_got[q]++] = last[q];
        rules_advance(&mine[q], last[q]);
    }
    bt_spec_t *sp;
    BT_CHECK(bt_spec_create(f.m, SEQS, V, most, &sp) == BT_OK);
    bt_spec_set_confidence(sp, tau);
    for (int round = 0; round < 2 * GEN; round++) {
        bt_spec_seq_t s[SEQS];
        int map[SEQS], n = 0;
        for (int q = 0; q < SEQS; q++) {
            if (n_got[q] >= budget[q]) continue;
            s[n] = (bt_spec_seq_t){.state = slot[q],
                                   .last = last[q],
                                   .step = (uint64_t)n_got[q],
                                   .max_emit = budget[q] - n_got[q],
                                   .pen = &mine[q].pen,
                                   .grammar = mine[q].g,
                                   .want_logprob = true,
                                   .n_top = 3};
            map[n++] = q;
        }
        if (!n) break;
        BT_CHECK(bt_spec_step(sp, &f.lay, s, n, err, sizeof err) == BT_OK);
        for (int i = 0; i < n; i++) {
            int q = map[i];
            BT_CHECK(s[i].n_emit >= 1 && s[i].n_emit <= budget[q] - n_got[q]);
            BT_CHECK(s[i].n_proposed <= (most ? most : bt_model_draft_block(f.m)));
            for (int j = 0; j < s[i].n_emit && n_got[q] < GEN; j++) {
                got_lp[q][n_got[q]] = s[i].logprob[j];
                memcpy(got_top[q][n_got[q]], s[i].top[j], sizeof got_top[q][0]);
                got[q][n_got[q]++] = s[i].emit[j];
                rules_advance(&mine[q], s[i].emit[j]);
            }
            last[q] = s[i].emit[s[i].n_emit - 1];
        }
    }
    const char *what[] = {"no rules", "penalties and logit_bias", "a JSON object"};
    for (int q = 0; q < SEQS; q++) {
        BT_CHECK_EQ_INT(n_got[q], budget[q]);
        BT_CHECK_MSG(memcmp(got[q], want[q], (size_t)budget[q] * sizeof(int32_t)) == 0,
                     "%s, %s: sequence %d's greedy tokens differ from plain decoding", variant,
                     what[rules], q);
        BT_CHECK_MSG(
            memcmp(got_lp[q], want_lp[q], (size_t)budget[q] * sizeof(float)) == 0 &&
                memcmp(got_top[q], want_top[q], (size_t)budget[q] * sizeof want_top[q][0]) == 0,
            "%s, %s: sequence %d's log-probabilities differ from plain decoding's", variant,
            what[rules], q);
        rules_free(&mine[q]);
    }
    uint64_t steps, proposed, accepted;
    bt_spec_stats(sp, &steps, &proposed, &accepted);
    BT_CHECK(steps > 0 && accepted <= proposed);
    if (tau >= 1.0f)
        BT_CHECK_MSG(proposed == 0, "%s: %llu proposals verified at confidence 1", variant,
                     (unsigned long long)proposed);
    else
        BT_CHECK(proposed > 0);
    fprintf(stderr, "%s, %s, confidence %.2f: %llu steps, %llu of %llu proposals accepted\n",
            variant, what[rules], tau, (unsigned long long)steps, (unsigned long long)accepted,
            (unsigned long long)proposed);
    bt_spec_destroy(sp);
    bt_grammar_vocab_destroy(gv);
    bt_tokenizer_destroy(tok);
    for (int q = 0; q < SEQS; q++)
        bt_aligned_free(slot[q]);
    bt_aligned_free(ref);
    fixture_close(&f);
}

static void test_greedy_demo(void)
{
    greedy_equal("demo", 0.0f, RULES_NONE, 0);
    greedy_equal("demo", 1.0f, RULES_NONE, 0);
    greedy_equal("demo", 0.0f, RULES_PENALTIES, 0);
    greedy_equal("demo", 0.0f, RULES_JSON, 0);
    greedy_equal("demo", 0.0f, RULES_PENALTIES, 2); /* --speculative-dspark-block-size 2 */
}

static void test_greedy_demo2(void)
{
    greedy_equal("demo2", 0.0f, RULES_NONE, 0);
    greedy_equal("demo2", 0.5f, RULES_PENALTIES, 0);
}

/* the draft's first-row distribution under the sampling rules */
typedef struct {
    bt_sampler_t *sampler;
    bt_sampling_t sampling;
    float *q0;
} capture_t;

static int32_t capture_first(void *ctx, int seq, int row, float *logits, int vocab)
{
    capture_t *cap = ctx;
    (void)seq;
    return row == 0 ? bt_sampler_probs(cap->sampler, &cap->sampling, logits, cap->q0)
                    : argmax(logits, vocab);
}

static void test_sampled_first_token(void)
{
    fixture_t f;
    BT_CHECK(fixture_open(&f, "demo"));
    if (!f.m) return;
    char err[512];
    int V = f.c->vocab;
    bt_sampling_t rules = {
        .temperature = 1.5f, .top_p = 1.0f, .min_p = 0.0f, .top_k = 0, .seed = 0};
    uint8_t *base = bt_aligned_alloc(64, f.lay.slot_bytes),
            *work = bt_aligned_alloc(64, f.lay.slot_bytes);
    float *logits = bt_malloc_or_die((size_t)V * sizeof(float));
    float *p0 = bt_malloc_or_die((size_t)V * sizeof(float)),
          *q0 = bt_malloc_or_die((size_t)V * sizeof(float));
    int32_t ids[PROMPT];
    prompt_ids(ids, PROMPT, V, 7);
    prefill(&f, base, ids, PROMPT, logits);
    bt_sampler_t *sampler = bt_sampler_create(V);
    int32_t last = argmax(logits, V);
    /* the target's distribution of the token after `last` */
    memcpy(work, base, f.lay.slot_bytes);
    bt_forward_seq_t seq = {work, &last, 1, false, NULL};
    BT_CHECK(bt_model_forward(f.m, &f.lay, &seq, 1, logits, err, sizeof err) == BT_OK);
    bt_sampler_probs(sampler, &rules, logits, p0);
    /* and the draft's (it reads the slot only) */
    memcpy(work, base, f.lay.slot_bytes);
    capture_t cap = {sampler, rules, q0};
    int32_t drafts[BT_MAX_DRAFT_BLOCK];
    uint8_t *states[1] = {work};
    BT_CHECK(bt_model_draft(f.m, &f.lay, states, &last, 1, capture_first, &cap, drafts, NULL, err,
                            sizeof err) == BT_OK);
    BT_CHECK(memcmp(work, base, f.lay.slot_bytes) == 0);

    /* bins: the target's 8 likeliest tokens, then the rest */
    enum { BINS = 9, TRIALS = 600 };
    int32_t top[BINS - 1];
    for (int b = 0; b < BINS - 1; b++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            bool taken = false;
            for (int j = 0; j < b; j++)
                taken |= top[j] == i;
            if (!taken && (best < 0 || p0[i] > p0[best])) best = i;
        }
        top[b] = best;
    }
    double pb[BINS] = {0}, qb[BINS] = {0};
    for (int i = 0; i < V; i++) {
        int b = BINS - 1;
        for (int j = 0; j < BINS - 1; j++)
            if (top[j] == i) b = j;
        pb[b] += p0[i];
        qb[b] += q0[i];
    }
    bt_spec_t *sp;
    BT_CHECK(bt_spec_create(f.m, 1, V, 0, &sp) == BT_OK);
    int count[BINS] = {0};
    for (int t = 0; t < TRIALS; t++) {
        memcpy(work, base, f.lay.slot_bytes);
        bt_spec_seq_t s = {
            .state = work, .last = last, .sampling = rules, .step = 1, .max_emit = 3};
        s.sampling.seed = 1000 + (uint64_t)t;
        BT_CHECK(bt_spec_step(sp, &f.lay, &s, 1, err, sizeof err) == BT_OK);
        int b = BINS - 1;
        for (int j = 0; j < BINS - 1; j++)
            if (top[j] == s.emit[0]) b = j;
        count[b]++;
    }
    double chi = 0.0, chi_draft = 0.0;
    for (int b = 0; b < BINS; b++) {
        double e = pb[b] * TRIALS;
        chi += (count[b] - e) * (count[b] - e) / e;
        chi_draft += (qb[b] - pb[b]) * (qb[b] - pb[b]) * TRIALS / pb[b];
    }
    uint64_t steps, proposed, accepted;
    bt_spec_stats(sp, &steps, &proposed, &accepted);
    fprintf(stderr,
            "sampled first tokens: chi-square %.1f (8 degrees; 1e-5 level 37.3); the draft's "
            "distribution "
            "would give about %.0f; %llu of %llu proposals accepted\n",
            chi, chi_draft, (unsigned long long)accepted, (unsigned long long)proposed);
    BT_CHECK_MSG(chi < 37.3,
                 "the first tokens do not follow the target's distribution (chi-square %.1f)", chi);
    /* the test tells the two apart: taking the draft's tokens would fail it by far */
    BT_CHECK_MSG(chi_draft > 4 * 37.3,
                 "the draft's and the target's distributions are too close to test (%.1f)",
                 chi_draft);
    BT_CHECK(accepted > 0);
    bt_spec_destroy(sp);
    bt_sampler_destroy(sampler);
    free(logits);
    free(p0);
    free(q0);
    bt_aligned_free(base);
    bt_aligned_free(work);
    fixture_close(&f);
}

/* DSpark under tensor parallelism, ranks as threads: every rank runs the same steps (the
 * draft's collectives pair up, its logits are gathered, so every rank picks alike) and the
 * greedy tokens are those of plain greedy decoding in the same group. */
typedef struct {
    const char *dir;
    bt_comm_t *comm;
    int32_t plain[GEN], spec[GEN];
    uint64_t proposed;
    bool ok;
} tp_run_t;

static void *tp_rank(void *arg)
{
    tp_run_t *r = arg;
    char err[512];
    bt_model_t *m = demo_model_load_tp(r->dir, 1, CTX, 64, 2, true, r->comm);
    if (!m) return NULL;
    const bt_model_config_t *c = bt_model_config(m);
    int V = c->vocab;
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, c, CTX);
    uint8_t *a = bt_aligned_alloc(64, lay.slot_bytes), *b = bt_aligned_alloc(64, lay.slot_bytes);
    float *logits = bt_malloc_or_die((size_t)V * sizeof(float));
    int32_t ids[PROMPT];
    prompt_ids(ids, PROMPT, V, 9);
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        uint8_t *slot = k ? b : a;
        bt_kv_state_reset(slot);
        bt_forward_seq_t seq = {slot, ids, PROMPT, false, NULL};
        ok &= bt_model_forward(m, &lay, &seq, 1, logits, err, sizeof err) == BT_OK;
        (k ? r->spec : r->plain)[0] = argmax(logits, V);
    }
    for (int g = 1; g < GEN && ok; g++) {
        bt_forward_seq_t seq = {a, &r->plain[g - 1], 1, false, NULL};
        ok &= bt_model_forward(m, &lay, &seq, 1, logits, err, sizeof err) == BT_OK;
        r->plain[g] = argmax(logits, V);
    }
    bt_spec_t *sp = NULL;
    ok &= bt_spec_create(m, 1, V, 0, &sp) == BT_OK;
    for (int g = 1; g < GEN && ok;) {
        bt_spec_seq_t q = {
            .state = b, .last = r->spec[g - 1], .step = (uint64_t)g, .max_emit = GEN - g};
        ok &= bt_spec_step(sp, &lay, &q, 1, err, sizeof err) == BT_OK;
        for (int j = 0; j < q.n_emit && ok; j++)
            r->spec[g++] = q.emit[j];
    }
    if (!ok) fprintf(stderr, "TP rank: %s\n", err);
    uint64_t steps = 0, accepted = 0;
    if (sp) bt_spec_stats(sp, &steps, &r->proposed, &accepted);
    r->ok = ok;
    bt_spec_destroy(sp);
    free(logits);
    bt_aligned_free(a);
    bt_aligned_free(b);
    bt_model_destroy(m);
    return NULL;
}

static void test_tp_threads(void)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-spec-tp-%d", (int)getpid());
    BT_CHECK(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK);
    for (int T = 2; T <= 4; T += 2) {
        bt_comm_t *comms[4];
        BT_CHECK(bt_comm_threads_create(T, comms) == BT_OK);
        tp_run_t runs[4];
        pthread_t th[4];
        for (int r = 0; r < T; r++) {
            runs[r] = (tp_run_t){.dir = dir, .comm = comms[r]};
            pthread_create(&th[r], NULL, tp_rank, &runs[r]);
        }
        for (int r = 0; r < T; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < T; r++) {
            BT_CHECK_MSG(runs[r].ok, "TP%d rank %d did not run", T, r);
            BT_CHECK_MSG(!memcmp(runs[r].spec, runs[r].plain, sizeof runs[r].plain),
                         "TP%d rank %d: speculative greedy tokens differ from plain", T, r);
            BT_CHECK_MSG(!memcmp(runs[r].spec, runs[0].spec, sizeof runs[r].spec),
                         "TP%d: ranks %d and 0 differ", T, r);
            BT_CHECK(runs[r].proposed > 0);
        }
        fprintf(stderr,
                "  TP%d: %llu proposals verified on each rank, tokens as plain decoding's\n", T,
                (unsigned long long)runs[0].proposed);
        for (int r = 0; r < T; r++)
            bt_comm_destroy(comms[r]);
    }
    snprintf(err, sizeof err, "rm -rf %s", dir);
    BT_CHECK(system(err) == 0);
}

static void test_layout_without_draft(void)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-spec-nodraft-%d", (int)getpid());
    BT_CHECK(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK);
    bt_model_t *plain = demo_model_load(dir, 1, CTX, 16, 1),
               *draft = demo_model_load_draft(dir, 1, CTX, 16, 1, true);
    BT_CHECK(plain && draft);
    if (plain && draft) {
        bt_kv_layout_t a, b;
        bt_kv_layout_init(&a, bt_model_config(plain), CTX);
        bt_kv_layout_init(&b, bt_model_config(draft), CTX);
        BT_CHECK_EQ_INT(a.n_rings, bt_model_config(plain)->n_layers);
        BT_CHECK_EQ_INT(b.n_rings, a.n_rings + 3);
        BT_CHECK(b.slot_bytes > a.slot_bytes);
        BT_CHECK(bt_kv_compat_hash(bt_model_config(plain), &a, 1) !=
                 bt_kv_compat_hash(bt_model_config(draft), &b, 1));
        BT_CHECK_EQ_INT(bt_model_draft_block(plain), 0);
        BT_CHECK_EQ_INT(bt_model_draft_block(draft), 5);
        /* a model without the stages refuses to draft */
        uint8_t *slot = bt_aligned_alloc(64, a.slot_bytes);
        bt_kv_state_reset(slot);
        int32_t t = 5, d[8];
        bt_forward_seq_t seq = {slot, &t, 1, false, NULL};
        BT_CHECK(bt_model_forward(plain, &a, &seq, 1, NULL, err, sizeof err) == BT_OK);
        BT_CHECK(bt_model_draft(plain, &a, &slot, &t, 1, NULL, NULL, d, NULL, err, sizeof err) !=
                 BT_OK);
        bt_aligned_free(slot);
    }
    bt_model_destroy(plain);
    bt_model_destroy(draft);
    /* a checkpoint without draft stages cannot load with them */
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "sed -i 's/\"num_nextn_predict_layers\":[[:space:]]*3/\"num_nextn_predict_layers\": "
             "0/' %s/config.json",
             dir);
    BT_CHECK(system(cmd) == 0);
    bt_model_t *none = demo_model_load_draft(dir, 1, CTX, 16, 1, true);
    BT_CHECK(none == NULL);
    bt_model_destroy(none);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    BT_CHECK(system(cmd) == 0);
}

int main(void)
{
    BT_RUN(test_rollback_demo);
    BT_RUN(test_rollback_demo2);
    BT_RUN(test_greedy_demo);
    BT_RUN(test_greedy_demo2);
    BT_RUN(test_sampled_first_token);
    BT_RUN(test_layout_without_draft);
    BT_RUN(test_tp_threads);
    return bt_test_summary();
}

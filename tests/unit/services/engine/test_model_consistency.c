/* The engine on Baton's own tiny configs (demo: QAT shapes and quantized storage; demo2: odd
 * shapes, float32), which the golden fixtures do not cover: whole-prompt, chunked and
 * token-by-token runs are bit-identical; the same across runs, thread counts and batch
 * mates; no NaN; and a decode step allocates nothing. */
#include "bt_test.h"
#include "common/alloc.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/model.h"
#include "unit/services/engine/demo_util.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* Allocation counter: the test links with -Wl,--wrap=malloc,... (tests/CMakeLists.txt). */
static atomic_long n_allocs;
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n)
{
    atomic_fetch_add(&n_allocs, 1);
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t s)
{
    atomic_fetch_add(&n_allocs, 1);
    return __real_calloc(n, s);
}
void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add(&n_allocs, 1);
    return __real_realloc(p, n);
}

#define CTX 160
#define PROMPT 150

static bt_model_t *load(const char *dir, int threads, int max_seqs)
{
    return demo_model_load(dir, threads, CTX, 2 * CTX, max_seqs);
}

static void make_prompt(int32_t *ids, int n, int vocab, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
    }
    ids[0] = 0;
}

/* All-position logits of ids, fed in chunks of `chunk`. */
static int run(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *state, const int32_t *ids, int n,
               int chunk, float *logits)
{
    char err[256];
    int V = bt_model_config(m)->vocab;
    bt_kv_state_reset(state);
    for (int i = 0; i < n; i += chunk) {
        int len = n - i < chunk ? n - i : chunk;
        bt_forward_seq_t seq = {state, ids + i, len, true, NULL};
        if (bt_model_forward(m, lay, &seq, 1, logits + (size_t)i * V, err, sizeof err) != BT_OK) {
            fprintf(stderr, "forward: %s\n", err);
            return -1;
        }
    }
    return 0;
}

static int all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

static void check_variant(const char *variant)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-test-%s-%d", variant, (int)getpid());
    BT_CHECK_MSG(bt_demo_model_write(dir, variant, err, sizeof err) == BT_OK, "%s", err);
    bt_model_t *m1 = load(dir, 1, 4), *m3 = load(dir, 3, 4);
    BT_CHECK(m1 && m3);
    if (!m1 || !m3) goto out;
    const bt_model_config_t *c = bt_model_config(m1);
    int V = c->vocab;
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, c, CTX);
    uint8_t *state = bt_aligned_alloc(64, lay.slot_bytes), *state2 = bt_aligned_alloc(64, lay.slot_bytes);
    int32_t a[PROMPT], b[PROMPT];
    make_prompt(a, PROMPT, V, 7);
    make_prompt(b, PROMPT, V, 99);
    size_t sz = (size_t)PROMPT * V * sizeof(float);
    float *whole = malloc(sz), *other = malloc(sz), *other2 = malloc(sz);

    BT_CHECK(run(m1, &lay, state, a, PROMPT, PROMPT, whole) == 0);
    BT_CHECK_MSG(all_finite(whole, (size_t)PROMPT * V), "%s: non-finite logits", variant);
    /* chunk sizes, incremental decoding */
    int chunks[] = {1, 2, 3, 7, 32, 64, 149};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        BT_CHECK(run(m1, &lay, state, a, PROMPT, chunks[k], other) == 0);
        BT_CHECK_MSG(memcmp(whole, other, sz) == 0, "%s: chunk %d differs", variant, chunks[k]);
    }
    /* thread count, repeated runs */
    BT_CHECK(run(m3, &lay, state, a, PROMPT, 13, other) == 0);
    BT_CHECK_MSG(memcmp(whole, other, sz) == 0, "%s: 3 threads differ from 1", variant);
    BT_CHECK(run(m3, &lay, state, a, PROMPT, 13, other) == 0);
    BT_CHECK_MSG(memcmp(whole, other, sz) == 0, "%s: second run differs", variant);

    /* batch mates: a and b advanced together, in uneven chunks, give their solo logits */
    float *solo_b = malloc(sz);
    BT_CHECK(run(m1, &lay, state2, b, PROMPT, PROMPT, solo_b) == 0);
    bt_kv_state_reset(state);
    bt_kv_state_reset(state2);
    int ia = 0, ib = 0, step = 0;
    while (ia < PROMPT || ib < PROMPT) {
        int na = PROMPT - ia < 11 ? PROMPT - ia : 11, nb = PROMPT - ib < 5 + step % 3 ? PROMPT - ib : 5 + step % 3;
        bt_forward_seq_t seqs[2];
        int ns = 0;
        float *rows = malloc((size_t)(na + nb) * V * sizeof(float));
        if (na > 0) seqs[ns++] = (bt_forward_seq_t){state, a + ia, na, true, NULL};
        if (nb > 0) seqs[ns++] = (bt_forward_seq_t){state2, b + ib, nb, true, NULL};
        BT_CHECK(bt_model_forward(m3, &lay, seqs, ns, rows, err, sizeof err) == BT_OK);
        if (na > 0) memcpy(other + (size_t)ia * V, rows, (size_t)na * V * sizeof(float));
        if (nb > 0) memcpy(other2 + (size_t)ib * V, rows + (size_t)(na > 0 ? na : 0) * V, (size_t)nb * V * sizeof(float));
        free(rows);
        ia += na > 0 ? na : 0;
        ib += nb > 0 ? nb : 0;
        step++;
    }
    BT_CHECK_MSG(memcmp(whole, other, sz) == 0, "%s: batched a differs from solo", variant);
    BT_CHECK_MSG(memcmp(solo_b, other2, sz) == 0, "%s: batched b differs from solo", variant);
    free(solo_b);

    /* a decode step allocates nothing */
    {
        float *row = malloc((size_t)V * sizeof(float));
        bt_kv_state_reset(state);
        bt_forward_seq_t seq = {state, a, 20, false, NULL};
        BT_CHECK(bt_model_forward(m3, &lay, &seq, 1, row, err, sizeof err) == BT_OK);
        long before = atomic_load(&n_allocs);
        for (int i = 20; i < 40; i++) {
            bt_forward_seq_t one = {state, a + i, 1, false, NULL};
            BT_CHECK(bt_model_forward(m3, &lay, &one, 1, row, err, sizeof err) == BT_OK);
        }
        BT_CHECK_MSG(atomic_load(&n_allocs) == before, "%s: %ld allocations in 20 decode steps", variant,
                     atomic_load(&n_allocs) - before);
        free(row);
    }

    /* tokens drawn with the forward (bt_model_forward_sample): what the host sampler draws
     * from the same logits, for two sequences at once and settings of every kind; a step
     * allocates nothing once the first has made its buffers; bad requests refused */
    {
        static const bt_sampling_t settings[] = {
            {0.0f, 1.0f, 0.0f, 0, 0}, {1.0f, 1.0f, 0.0f, 0, 7}, {0.7f, 0.9f, 0.0f, 0, 8},
            {0.8f, 0.95f, 0.05f, 20, 9}, {1.0f, 1.0f, 0.0f, 3, 10},
        };
        const int vocab = V - 1; /* (the services' ids may stop short of the model's rows) */
        uint8_t *st[2] = {state, state2}, *ref = bt_aligned_alloc(64, lay.slot_bytes);
        float *row = malloc((size_t)V * sizeof(float));
        bt_sampler_t *smp = bt_sampler_create(vocab);
        bt_forward_seq_t seqs[2];
        bt_sample_req_t req[2];
        bt_sample_out_t got[2];
        for (int q = 0; q < 2; q++) {
            bt_kv_state_reset(st[q]);
            seqs[q] = (bt_forward_seq_t){st[q], a + 10 * q, 10, false, NULL};
        }
        long before = 0;
        int differ = 0;
        /* penalties on sequence 0 at odd steps: its top ids pushed down (the draw must move) */
        const int32_t adj_ids[3] = {0, 1, 2};
        const float adj[3] = {1.5f, 40.0f, -0.25f};
        for (int i = 0; i < 12; i++) {
            for (int q = 0; q < 2; q++)
                req[q] = (bt_sample_req_t){.sampling = settings[(i + q) % 5], .step = (uint64_t)i, .want_logprob = q == 1,
                                           .n_top = q == 1 ? 5 : 0};
            if (i % 2) {
                req[0].adj_ids = adj_ids;
                req[0].adj = adj;
                req[0].n_adj = 3;
            }
            /* the reference: sequence 0's state replayed through bt_model_forward */
            memcpy(ref, st[0], lay.slot_bytes);
            bt_forward_seq_t one = {ref, seqs[0].ids, seqs[0].n, false, NULL};
            BT_CHECK(bt_model_forward(m3, &lay, &one, 1, row, err, sizeof err) == BT_OK);
            if (i == 1) before = atomic_load(&n_allocs);
            BT_CHECK_MSG(bt_model_forward_sample(m3, &lay, seqs, 2, vocab, req, got, err, sizeof err) == BT_OK, "%s", err);
            float lp;
            bt_top_logprob_t top[5];
            for (int k = 0; k < req[0].n_adj; k++) row[req[0].adj_ids[k]] -= req[0].adj[k];
            int32_t want = bt_sampler_sample(smp, &req[0].sampling, row, req[0].step, &lp, top, 5);
            if (i % 2) BT_CHECK(got[0].id != 1); /* 40 down: never drawn */
            differ += got[0].id != want;
            BT_CHECK(got[1].id >= 0 && got[1].id < vocab && got[1].top[0].id >= 0 && got[1].top[4].id >= 0);
            BT_CHECK(got[1].logprob <= got[1].top[0].logprob && got[1].top[0].logprob <= 0.0f);
            for (int q = 0; q < 2; q++)
                seqs[q] = (bt_forward_seq_t){st[q], &got[q].id, 1, false, NULL};
        }
        BT_CHECK_MSG(differ == 0, "%s: %d of 12 draws differ from the host sampler's", variant, differ);
        BT_CHECK_MSG(atomic_load(&n_allocs) == before, "%s: %ld allocations in 10 steps with draws", variant,
                     atomic_load(&n_allocs) - before);
        seqs[0].all_logits = true;
        BT_CHECK(bt_model_forward_sample(m3, &lay, seqs, 1, vocab, req, got, err, sizeof err) == BT_ERR_INVALID_ARG);
        BT_CHECK(strstr(err, "all_logits") != NULL);
        seqs[0].all_logits = false;
        req[0].n_top = 21;
        BT_CHECK(bt_model_forward_sample(m3, &lay, seqs, 1, vocab, req, got, err, sizeof err) == BT_ERR_INVALID_ARG);
        req[0].n_top = 0;
        BT_CHECK(bt_model_forward_sample(m3, &lay, seqs, 1, V + 1, req, got, err, sizeof err) == BT_ERR_INVALID_ARG);
        BT_CHECK(strstr(err, "vocabulary") != NULL);
        const int32_t out_of_range = vocab;
        req[0].adj_ids = &out_of_range;
        req[0].adj = adj;
        req[0].n_adj = 1;
        BT_CHECK(bt_model_forward_sample(m3, &lay, seqs, 1, vocab, req, got, err, sizeof err) == BT_ERR_INVALID_ARG);
        BT_CHECK(strstr(err, "adjustment") != NULL);
        bt_sampler_destroy(smp);
        bt_aligned_free(ref);
        free(row);
    }

    /* errors: a token outside the vocabulary, a context overflow */
    {
        int32_t bad = V;
        bt_kv_state_reset(state);
        bt_forward_seq_t seq = {state, &bad, 1, false, NULL};
        BT_CHECK(bt_model_forward(m1, &lay, &seq, 1, NULL, err, sizeof err) == BT_ERR_BAD_REQUEST);
        BT_CHECK(strstr(err, "vocabulary") != NULL);
        bt_kv_header(state)->n_tokens = CTX;
        seq.ids = a;
        BT_CHECK(bt_model_forward(m1, &lay, &seq, 1, NULL, err, sizeof err) == BT_ERR_TOO_LONG);
    }
    free(whole);
    free(other);
    free(other2);
    bt_aligned_free(state);
    bt_aligned_free(state2);
out:
    bt_model_destroy(m1);
    bt_model_destroy(m3);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    BT_CHECK(system(cmd) == 0);
}

static void test_demo(void)
{
    check_variant("demo");
}

static void test_demo2(void)
{
    check_variant("demo2");
}

int main(void)
{
    BT_RUN(test_demo);
    BT_RUN(test_demo2);
    return bt_test_summary();
}

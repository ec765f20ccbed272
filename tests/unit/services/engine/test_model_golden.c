/* The CPU engine against the reference's golden fixtures (../shared/golden):
 *  - golden-a-exact: every position, whole prompt / chunked (7, 32) / token by token,
 *    max|d| / max|golden| <= 1e-4, and the greedy continuations identical;
 *  - golden-a, golden-a-quant (QAT rounding on): positions marked robust within 2e-2, greedy
 *    ids up to gen_robust_len; the rest reported, not asserted (MODEL-DS41.md says why).
 * Chunked and incremental runs must also be bit-identical to the whole-prompt forward. */
#include "bt_test.h"
#include "common/alloc.h"
#include "unit/services/engine/golden_util.h"

#include <math.h>
#include <string.h>

#define MAX_CTX 256

typedef struct {
    int n_layers, hc, hidden, S;
    float *layer_out; /* [L][S][hc][D] */
    float *final_hidden;
    int64_t *hash;
    int hash_cols;
} taps_t;

static void record_tap(void *ctx, bt_tap_t tap, int layer, const void *data, int n)
{
    taps_t *t = ctx;
    if (n != t->S) return;
    size_t row = (size_t)t->hc * t->hidden;
    if (tap == BT_TAP_LAYER_OUT && t->layer_out)
        memcpy(t->layer_out + (size_t)layer * t->S * row, data, (size_t)n * row * sizeof(float));
    if (tap == BT_TAP_FINAL_HIDDEN && t->final_hidden)
        memcpy(t->final_hidden, data, (size_t)n * t->hidden * sizeof(float));
    if (tap == BT_TAP_ENGRAM_HASH && t->hash)
        memcpy(t->hash, data, (size_t)n * t->hash_cols * sizeof(int64_t));
}

/* Runs ids through a fresh slot in chunks of `chunk` (0 = whole), all logits. */
static int run_chunked(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *state, const int32_t *ids,
                       int S, int chunk, float *logits)
{
    char err[256];
    bt_kv_state_reset(state);
    int V = bt_model_config(m)->vocab;
    if (chunk <= 0) chunk = S;
    for (int i = 0; i < S; i += chunk) {
        int n = S - i < chunk ? S - i : chunk;
        bt_forward_seq_t seq = {state, ids + i, n, true, NULL};
        if (bt_model_forward(m, lay, &seq, 1, logits + (size_t)i * V, err, sizeof err) != BT_OK) {
            fprintf(stderr, "forward: %s\n", err);
            return -1;
        }
    }
    return 0;
}

static void check_fixture(const char *name, bool exact)
{
    char err[512];
    bt_safetensors_t *gold = golden_open(name);
    if (!gold) {
        BT_CHECK_MSG(0, "%s: no golden.safetensors", name);
        return;
    }
    bt_model_t *m = golden_model(name, gold, 2, MAX_CTX);
    BT_CHECK_MSG(m != NULL, "%s did not load", name);
    if (!m) {
        bt_safetensors_close(gold);
        return;
    }
    const bt_model_config_t *c = bt_model_config(m);
    int V = c->vocab;
    bt_kv_layout_t lay;
    BT_CHECK(bt_kv_layout_init(&lay, c, MAX_CTX) == BT_OK);
    uint8_t *state = bt_aligned_alloc(64, lay.slot_bytes);

    /* rope tables */
    {
        float inv[512];
        size_t n;
        float *g = golden_f32(gold, "rope.main_inv_freq", &n);
        bt_rope_inv_freq(&c->rope_main, inv);
        BT_CHECK_MSG(g && golden_max_diff(inv, g, n) <= 1e-7f * golden_max_abs(g, n), "%s main rope", name);
        free(g);
        g = golden_f32(gold, "rope.compress_inv_freq", &n);
        bt_rope_inv_freq(&c->rope_compress, inv);
        BT_CHECK_MSG(g && golden_max_diff(inv, g, n) <= 1e-6f * golden_max_abs(g, n), "%s compress rope %g", name,
                     g ? (double)golden_max_diff(inv, g, n) : -1.0);
        free(g);
    }

    int robust_total = 0, robust_ok = 0, nonrobust_total = 0, nonrobust_close = 0;
    for (int p = 0; p < 16; p++) {
        char key[128];
        size_t S = 0;
        snprintf(key, sizeof key, "prompt%d.input_ids", p);
        int64_t *ids64 = golden_i64(gold, key, &S);
        if (!ids64) break;
        int32_t *ids = malloc(S * sizeof *ids);
        for (size_t i = 0; i < S; i++) ids[i] = (int32_t)ids64[i];
        snprintf(key, sizeof key, "prompt%d.logits", p);
        float *glog = golden_f32(gold, key, NULL);
        snprintf(key, sizeof key, "prompt%d.robust", p);
        uint8_t *robust = golden_u8(gold, key, NULL);

        taps_t taps = {c->n_layers, c->hc_mult, c->hidden, (int)S, NULL, NULL, NULL, 0};
        size_t nlo = 0;
        snprintf(key, sizeof key, "prompt%d.layer_out", p);
        float *glo = golden_f32(gold, key, &nlo);
        if (glo) taps.layer_out = calloc(nlo, sizeof(float));
        snprintf(key, sizeof key, "prompt%d.engram_hash_ids", p);
        size_t nh = 0;
        int64_t *ghash = golden_i64(gold, key, &nh);
        if (ghash) {
            taps.hash = calloc(nh, sizeof(int64_t));
            taps.hash_cols = (int)(nh / S);
        }
        bt_model_set_tap(m, record_tap, &taps);

        float *whole = malloc(S * V * sizeof(float));
        float *other = malloc(S * V * sizeof(float));
        BT_CHECK(run_chunked(m, &lay, state, ids, (int)S, 0, whole) == 0);
        bt_model_set_tap(m, NULL, NULL);

        if (ghash) {
            BT_CHECK_MSG(memcmp(ghash, taps.hash, nh * sizeof(int64_t)) == 0,
                         "%s prompt%d engram hash ids differ", name, p);
        }
        if (glo) {
            for (int l = 0; l < c->n_layers; l++) {
                size_t per = S * (size_t)c->hc_mult * c->hidden;
                float d = golden_max_diff(taps.layer_out + l * per, glo + l * per, per);
                float ref = golden_max_abs(glo + l * per, per);
                if (exact) BT_CHECK_MSG(d <= 1e-4f * ref, "%s prompt%d layer %d out: max|d| %g (ref %g)", name, p, l, (double)d, (double)ref);
                else if (d > 1e-2f) fprintf(stderr, "  %s prompt%d layer %d out: max|d| %g (not asserted)\n", name, p, l, (double)d);
            }
        }

        /* against the golden logits */
        if (exact) {
            float d = golden_max_diff(whole, glog, S * V), ref = golden_max_abs(glog, S * V);
            BT_CHECK_MSG(d <= 1e-4f * ref, "%s prompt%d whole: max|d|/max|g| = %g", name, p, (double)(d / ref));
            fprintf(stderr, "  %s prompt%d (%zu tokens): max|d|/max|g| = %.3g\n", name, p, S, (double)(d / ref));
        } else {
            for (size_t i = 0; i < S; i++) {
                float d = golden_max_diff(whole + i * V, glog + i * V, V);
                if (robust[i]) {
                    robust_total++;
                    if (d <= 2e-2f) robust_ok++;
                    BT_CHECK_MSG(d <= 2e-2f, "%s prompt%d pos %zu (robust): max|d| %g", name, p, i, (double)d);
                } else {
                    nonrobust_total++;
                    if (d <= 2e-2f) nonrobust_close++;
                }
            }
        }

        /* chunked and token-by-token must equal the whole forward bit for bit */
        int chunks[] = {7, 32, 1};
        for (int k = 0; k < 3; k++) {
            BT_CHECK(run_chunked(m, &lay, state, ids, (int)S, chunks[k], other) == 0);
            BT_CHECK_MSG(memcmp(whole, other, S * V * sizeof(float)) == 0,
                         "%s prompt%d chunk %d differs from whole (max|d| %g)", name, p, chunks[k],
                         (double)golden_max_diff(whole, other, S * V));
        }

        /* greedy continuation from the prefilled state */
        size_t G = 0;
        snprintf(key, sizeof key, "prompt%d.gen_ids", p);
        int64_t *gids = golden_i64(gold, key, &G);
        snprintf(key, sizeof key, "prompt%d.gen_logits", p);
        float *glogits = golden_f32(gold, key, NULL);
        snprintf(key, sizeof key, "prompt%d.gen_robust_len", p);
        int64_t *grl = golden_i64(gold, key, NULL);
        size_t must = exact ? G : (size_t)grl[0];
        bool all_robust = true;
        for (size_t i = 0; i < S; i++) all_robust = all_robust && robust[i];
        BT_CHECK(run_chunked(m, &lay, state, ids, (int)S, 0, other) == 0);
        float *step = malloc(V * sizeof(float));
        memcpy(step, other + (S - 1) * V, V * sizeof(float));
        int matched = 0;
        for (size_t g = 0; g < G && S + g < MAX_CTX; g++) {
            int tok = golden_argmax(step, V);
            float d = golden_max_diff(step, glogits + g * V, V);
            if (g < must) {
                BT_CHECK_MSG(tok == gids[g], "%s prompt%d gen %zu: %d != golden %lld", name, p, g, tok, (long long)gids[g]);
                /* the QAT fixtures mark robust logits per prompt position only; a greedy
                 * step's logits are compared where every prompt position is robust */
                if (exact || all_robust)
                    BT_CHECK_MSG(d <= (exact ? 1e-4f * golden_max_abs(glogits + g * V, V) : 2e-2f),
                                 "%s prompt%d gen %zu logits max|d| %g", name, p, g, (double)d);
            }
            if (tok != gids[g]) break;
            matched++;
            int32_t t32 = tok;
            bt_forward_seq_t seq = {state, &t32, 1, true, NULL};
            BT_CHECK(bt_model_forward(m, &lay, &seq, 1, step, err, sizeof err) == BT_OK);
        }
        fprintf(stderr, "  %s prompt%d greedy: %d/%zu ids match (robust prefix %zu)\n", name, p, matched, G, must);

        free(step);
        free(gids);
        free(glogits);
        free(grl);
        free(whole);
        free(other);
        free(glo);
        free(taps.layer_out);
        free(ghash);
        free(taps.hash);
        free(robust);
        free(glog);
        free(ids);
        free(ids64);
    }
    if (!exact)
        fprintf(stderr, "  %s: robust positions within 2e-2: %d/%d; non-robust positions within 2e-2: %d/%d\n",
                name, robust_ok, robust_total, nonrobust_close, nonrobust_total);
    bt_aligned_free(state);
    bt_model_destroy(m);
    bt_safetensors_close(gold);
}

static void test_golden_a_exact(void)
{
    check_fixture("golden-a-exact", true);
}

static void test_golden_a(void)
{
    check_fixture("golden-a", false);
}

static void test_golden_a_quant(void)
{
    check_fixture("golden-a-quant", false);
}

int main(void)
{
    BT_RUN(test_golden_a_exact);
    BT_RUN(test_golden_a);
    BT_RUN(test_golden_a_quant);
    return bt_test_summary();
}

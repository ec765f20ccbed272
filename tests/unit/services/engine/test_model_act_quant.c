/* The reference deployment's activation quantization on the CPU (bt_model_options_t
 * .activation_quant, `--activation-quant fp8`):
 *  - a checkpoint stored in float32 (golden-a) has no FP8/FP4 linear, so the logits are
 *    bit-identical with and without it;
 *  - on golden-a-quant (FP8 projections and shared expert, FP4 routed experts) it changes
 *    every prompt's logits. (Not compared with the reference's, which were computed without
 *    it: this tiny random model amplifies any rounding of those inputs, bf16's as well, by
 *    its top-k selections and QAT steps: a fixture-wide bound would mean nothing.)
 *  - TP 2 on the demo model (whose ranks' slices hold whole blocks of 32) gives TP 1's logits
 *    and greedy ids with it on; TP 2 on golden-a-quant, whose expert width splits into halves
 *    of 16, is refused with a message naming the width.
 * Each run: a prompt prefilled whole (every position's logits), then GEN greedy steps. */
#include "bt_test.h"
#include "common/alloc.h"
#include "common/comm/comm.h"
#include "services/engine/demo_model.h"
#include "unit/services/engine/demo_util.h"
#include "unit/services/engine/golden_util.h"

#include <unistd.h>

#include <math.h>
#include <pthread.h>
#include <string.h>

#define CTX 160
#define GEN 8

typedef struct {
    const char *fixture; /* a golden fixture's name, or a demo checkpoint's directory (demo) */
    bool demo;
    bool quant;
    bt_comm_t *comm;
    int prompt;
    float *logits; /* [S + GEN][V] */
    int32_t gen[GEN];
    int S, V;
    bool ok;
} run_t;

static void *run_model(void *arg)
{
    run_t *r = arg;
    char err[512] = "no such prompt";
    bt_safetensors_t *gold = NULL;
    bt_model_t *m = NULL;
    bt_model_options_t opt = bt_model_options_default();
    opt.n_threads = 1;
    opt.max_ctx = CTX;
    opt.max_batch_tokens = CTX;
    opt.comm = r->comm;
    opt.activation_quant = r->quant;
    int32_t ids[CTX];
    size_t S = 0;
    if (r->demo) {
        bt_model_config_t cfg;
        int32_t *map = NULL;
        if (bt_model_config_load(r->fixture, &cfg, err, sizeof err) != BT_OK ||
            bt_tokenizer_for_model(r->fixture, cfg.vocab, true, &map, &opt.engram_classes, NULL,
                                   err, sizeof err) != BT_OK) {
            fprintf(stderr, "%s: %s\n", r->fixture, err);
            return NULL;
        }
        opt.engram_token_map = map;
        if (bt_model_load(r->fixture, &opt, &m, err, sizeof err) != BT_OK) {
            fprintf(stderr, "load: %s\n", err);
            m = NULL;
        }
        free(map);
        S = 40; /* ids spread over the vocabulary, one prompt a seed */
        for (size_t i = 0; i < S; i++)
            ids[i] =
                (int32_t)((i * 7919u + (unsigned)r->prompt * 104729u + 13u) % (unsigned)cfg.vocab);
    } else {
        gold = golden_open(r->fixture);
        if (!gold) return NULL;
        m = golden_model_with(r->fixture, gold, &opt);
        char key[64];
        snprintf(key, sizeof key, "prompt%d.input_ids", r->prompt);
        int64_t *ids64 = golden_i64(gold, key, &S);
        for (size_t i = 0; i < S && i < CTX; i++)
            ids[i] = (int32_t)ids64[i];
        free(ids64);
    }
    if (!m) {
        if (gold) bt_safetensors_close(gold);
        return NULL;
    }
    r->S = (int)S;
    r->V = bt_model_config(m)->vocab;
    r->logits = malloc((S + GEN) * (size_t)r->V * sizeof(float));
    r->ok = S > 0 && S + GEN <= CTX &&
            golden_prompt_then_greedy(m, CTX, ids, (int)S, GEN, r->logits, r->gen, err, sizeof err);
    if (!r->ok && S > 0) fprintf(stderr, "%s prompt%d: forward: %s\n", r->fixture, r->prompt, err);
    bt_model_destroy(m);
    if (gold) bt_safetensors_close(gold);
    return NULL;
}

static size_t n_logits(const run_t *r)
{
    return (size_t)(r->S + GEN) * (size_t)r->V;
}

static void test_noop_without_lowp_weights(void)
{
    for (int p = 1; p <= 5; p += 2) {
        run_t off = {"golden-a", false, false, NULL, p, NULL, {0}, 0, 0, false};
        run_t on = {"golden-a", false, true, NULL, p, NULL, {0}, 0, 0, false};
        run_model(&off);
        run_model(&on);
        BT_CHECK_MSG(off.ok && on.ok, "golden-a prompt%d did not run", p);
        if (off.ok && on.ok)
            BT_CHECK_MSG(!memcmp(off.logits, on.logits, n_logits(&off) * sizeof(float)),
                         "golden-a prompt%d: logits changed, but no weight is stored FP8/FP4", p);
        free(off.logits);
        free(on.logits);
    }
}

static void test_quant_fixture(void)
{
    int changed = 0, prompts = 0;
    for (int p = 0; p < 16; p++) {
        run_t off = {"golden-a-quant", false, false, NULL, p, NULL, {0}, 0, 0, false};
        run_t on = {"golden-a-quant", false, true, NULL, p, NULL, {0}, 0, 0, false};
        run_model(&off);
        if (!off.ok && p > 0) { /* past the fixture's last prompt */
            free(off.logits);
            break;
        }
        run_model(&on);
        BT_CHECK_MSG(off.ok && on.ok, "golden-a-quant prompt%d did not run", p);
        if (off.ok && on.ok) {
            prompts++;
            float d = golden_max_diff(off.logits, on.logits, n_logits(&on));
            if (d > 1e-3f) changed++;
            /* a first position's logits and ids come out finite either way */
            BT_CHECK_MSG(d == d, "golden-a-quant prompt%d: a NaN", p);
        }
        free(off.logits);
        free(on.logits);
    }
    fprintf(stderr, "  golden-a-quant: %d of %d prompts changed by the quantization\n", changed,
            prompts);
    /* every prompt passes FP8/FP4 linears, whose inputs now round */
    BT_CHECK(prompts >= 4);
    BT_CHECK_MSG(changed == prompts, "the quantization left %d of %d prompts unchanged",
                 prompts - changed, prompts);
}

/* TP 1 and TP 2 (ranks as threads) on checkpoint `fixture` (demo: a directory), quantizing;
 * rank 0's run of TP 2 in *tp (ok false when it did not load) */
static void run_tp2(const char *fixture, bool demo, int prompt, run_t *ref, run_t *tp)
{
    *ref = (run_t){fixture, demo, true, NULL, prompt, NULL, {0}, 0, 0, false};
    run_model(ref);
    bt_comm_t *comms[2];
    BT_CHECK(bt_comm_threads_create(2, comms) == BT_OK);
    run_t runs[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        runs[r] = (run_t){fixture, demo, true, comms[r], prompt, NULL, {0}, 0, 0, false};
        pthread_create(&th[r], NULL, run_model, &runs[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    *tp = runs[0];
    free(runs[1].logits);
    for (int r = 0; r < 2; r++)
        bt_comm_destroy(comms[r]);
}

static void test_tp2(void)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-test-aq-%d", (int)getpid());
    BT_CHECK_MSG(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK, "%s", err);
    for (int p = 0; p < 3; p++) {
        run_t ref, tp;
        run_tp2(dir, true, p, &ref, &tp);
        BT_CHECK_MSG(ref.ok && tp.ok, "demo prompt%d did not run", p);
        if (ref.ok && tp.ok) {
            size_t n = n_logits(&ref);
            float d = golden_max_diff(tp.logits, ref.logits, n), mx = golden_max_abs(ref.logits, n);
            fprintf(stderr, "  demo TP2 prompt%d: max|d|/max = %.2g, greedy %s\n", p,
                    (double)(d / mx),
                    memcmp(tp.gen, ref.gen, sizeof ref.gen) ? "DIFFERS" : "identical");
            BT_CHECK_MSG(d <= 1e-4f * mx, "TP2 prompt%d: max|d|/max = %g", p, (double)(d / mx));
            BT_CHECK_MSG(!memcmp(tp.gen, ref.gen, sizeof ref.gen),
                         "TP2 prompt%d: greedy ids differ", p);
        }
        /* and the quantization did something here: TP 1 without it differs */
        run_t plain = {dir, true, false, NULL, p, NULL, {0}, 0, 0, false};
        run_model(&plain);
        BT_CHECK(plain.ok);
        if (plain.ok && ref.ok) {
            float d = golden_max_diff(plain.logits, ref.logits, n_logits(&ref));
            BT_CHECK_MSG(d > 1e-3f, "demo prompt%d: the quantization changed the logits by %g only",
                         p, (double)d);
        }
        free(plain.logits);
        free(ref.logits);
        free(tp.logits);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    BT_CHECK(system(cmd) == 0);
}

/* golden-a-quant's expert width, 32, splits into halves of 16 at TP 2: refused, by name */
static void test_tp2_refused(void)
{
    bt_safetensors_t *gold = golden_open("golden-a-quant");
    BT_CHECK(gold != NULL);
    if (!gold) return;
    bt_comm_t *comms[2];
    BT_CHECK(bt_comm_threads_create(2, comms) == BT_OK);
    char dir[1024], err[512] = "";
    snprintf(dir, sizeof dir, "%s/golden-a-quant", golden_dir());
    int32_t map[1014] = {0};
    bt_model_options_t opt = bt_model_options_default();
    opt.engram_token_map = map;
    opt.engram_classes = 753;
    opt.comm = comms[0];
    opt.activation_quant = true;
    bt_model_t *m = NULL;
    BT_CHECK(bt_model_load(dir, &opt, &m, err, sizeof err) == BT_ERR_UNSUPPORTED);
    BT_CHECK_MSG(strstr(err, "--activation-quant fp8 with TP 2") && strstr(err, "(16)"), "%s", err);
    opt.activation_quant = false; /* the same without it loads */
    BT_CHECK(bt_model_load(dir, &opt, &m, err, sizeof err) == BT_OK);
    bt_model_destroy(m);
    for (int r = 0; r < 2; r++)
        bt_comm_destroy(comms[r]);
    bt_safetensors_close(gold);
}

int main(void)
{
    BT_RUN(test_noop_without_lowp_weights);
    BT_RUN(test_quant_fixture);
    BT_RUN(test_tp2);
    BT_RUN(test_tp2_refused);
    return bt_test_summary();
}

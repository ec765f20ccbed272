/* bt_service_engine_open, as the prefill and decode workers open their model, on a model whose
 * embedding has more rows than its tokenizer has ids (DeepSeek's 129280 rows for ~128.8k ids):
 * the engram layers' token map must cover every row. The workers built it from the tokenizer
 * alone and the model copied [vocab] entries from it, a read past its end (the sanitizers'
 * run of this test reports it). The built-in demo model, its tokenizer one id short. */
#include "bt_test.h"
#include "common/json.h"
#include "common/log.h"
#include "common/text/tokenizer.h"
#include "services/common/service.h"
#include "services/engine/model.h"
#include "services/engine/demo_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64] = "/tmp/bt_test_engine_open_XXXXXX";

/* dir/tokenizer.json one id shorter with the same engram classes (their count is in the
 * config): the byte token "A" (whose class "a" keeps) removed and the highest id, an added
 * token, moved into its place */
static bool cut_last_id(void)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cJSON *root = NULL;
    if (bt_json_read_file(path, 64 << 20, &root, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return false;
    }
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab");
    cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    cJSON *upper_a = vocab ? cJSON_GetObjectItemCaseSensitive(vocab, "A") : NULL, *last = NULL;
    for (cJSON *e = added ? added->child : NULL; e; e = e->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *top = last ? cJSON_GetObjectItemCaseSensitive(last, "id") : NULL;
        if (cJSON_IsNumber(id) && (!top || id->valuedouble > top->valuedouble)) last = e;
    }
    bool ok = cJSON_IsNumber(upper_a) && last;
    if (ok) {
        cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(last, "id"), upper_a->valuedouble);
        cJSON_Delete(cJSON_DetachItemViaPointer(vocab, upper_a));
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = fopen(path, "w");
    ok = ok && f && fputs(text, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    free(text);
    return ok;
}

static void test_more_rows_than_tokenizer_ids(void)
{
    char err[512];
    BT_ASSERT(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK);
    BT_ASSERT(cut_last_id());
    bt_tokenizer_t *tok = NULL;
    BT_ASSERT(bt_tokenizer_load(dir, &tok, err, sizeof err) == BT_OK);
    int n_ids = bt_tokenizer_vocab_size(tok);
    bt_tokenizer_destroy(tok);

    bt_service_engine_t eng;
    memset(&eng, 0, sizeof eng);
    bt_status_t st = bt_service_engine_open(dir, "demo", 64, 2, 64, 1, &eng, err, sizeof err);
    BT_CHECK_MSG(st == BT_OK, "engine open: %s", err);
    if (st != BT_OK) return;
    BT_CHECK(eng.cfg->n_engram > 0);         /* the map is in use */
    BT_CHECK(eng.cfg->vocab == n_ids + 1);   /* one row past the tokenizer's ids */
    /* the workers' sampler leaves that row out (text could not carry it): greedy over logits
     * whose largest is the padding row picks the next largest */
    BT_CHECK_EQ_INT(bt_service_emit_vocab(&eng), n_ids);
    float *logits = calloc((size_t)eng.cfg->vocab, sizeof *logits);
    logits[n_ids] = 10.0f;
    logits[3] = 5.0f;
    bt_sampler_t *sampler = bt_sampler_create(bt_service_emit_vocab(&eng));
    const bt_sampling_t greedy = {0};
    BT_CHECK_EQ_INT(bt_sampler_sample(sampler, &greedy, logits, 0, NULL, NULL, 0), 3);
    bt_sampler_destroy(sampler);
    free(logits);
    bt_service_engine_close(&eng);

    /* simulated workers draw from the same ids */
    memset(&eng, 0, sizeof eng);
    st = bt_service_engine_open_sim(dir, "demo", 64, &eng, err, sizeof err);
    BT_CHECK_MSG(st == BT_OK, "simulated engine open: %s", err);
    if (st == BT_OK) BT_CHECK_EQ_INT(bt_service_emit_vocab(&eng), n_ids);
    bt_service_engine_close(&eng);
}

/* A group that quantizes activations (--activation-quant fp8) computes another forward: its KV
 * compatibility hash differs from the same model's without, so prefill and decode groups that
 * differ refuse each other's KV states instead of mixing the two */
static void test_activation_quant_hash(void)
{
    char err[512];
    BT_ASSERT(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK);
    uint64_t hash[2] = {0, 0};
    for (int q = 0; q < 2; q++) {
        bt_service_device_t dev = {BT_DEVICE_CPU, 0, BT_WEIGHTS_AUTO, false, 0, 0.0f, q == 1};
        bt_service_engine_t eng;
        memset(&eng, 0, sizeof eng);
        bt_status_t st =
            bt_service_engine_open_tp(dir, "demo", 64, 2, 64, 1, NULL, &dev, &eng, err, sizeof err);
        BT_CHECK_MSG(st == BT_OK, "engine open: %s", err);
        if (st != BT_OK) return;
        hash[q] = eng.compat_hash;
        bt_service_engine_close(&eng);
    }
    BT_CHECK(hash[0] != hash[1]);
    BT_CHECK(hash[1] == (hash[0] ^ BT_AQ_COMPAT_MARKER));
}

int main(void)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    BT_RUN(test_more_rows_than_tokenizer_ids);
    BT_RUN(test_activation_quant_hash);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return bt_test_summary();
}

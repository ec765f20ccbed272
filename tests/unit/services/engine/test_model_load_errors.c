/* A bad checkpoint fails at load with a message naming the file and the tensor (or the
 * config field), never a crash: a missing tensor, a shape that disagrees with the config,
 * an unknown dtype, a truncated file, a config with a missing or mistyped field. */
#include "bt_test.h"
#include "common/json.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/model.h"
#include "services/engine/safetensors.h"

#include <string.h>
#include <unistd.h>

static char dir[256];

static bt_status_t try_load(char *err, size_t errlen)
{
    bt_tokenizer_t *tok = NULL;
    int32_t *map = NULL;
    int classes = 0;
    if (bt_tokenizer_load(dir, &tok, err, errlen) != BT_OK) return BT_ERR_BAD_TOKENIZER;
    bt_tokenizer_engram_token_map(tok, &map, &classes);
    bt_tokenizer_destroy(tok);
    bt_model_options_t opt = bt_model_options_default();
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = 1;
    opt.max_ctx = 16;
    opt.max_batch_tokens = 16;
    bt_model_t *m = NULL;
    bt_status_t st = bt_model_load(dir, &opt, &m, err, errlen);
    bt_model_destroy(m);
    free(map);
    return st;
}

/* Rewrites model.safetensors from the pristine copy, dropping `drop` and giving `reshape`
 * a wrong first dimension. */
static void rewrite(const char *pristine, const char *drop, const char *reshape)
{
    bt_safetensors_t *st;
    char err[256], path[512];
    BT_CHECK(bt_safetensors_open(pristine, &st, err, sizeof err) == BT_OK);
    size_t n = bt_safetensors_count(st);
    bt_tensor_write_t *w = calloc(n, sizeof *w);
    size_t k = 0;
    void *bigger = NULL;
    for (size_t i = 0; i < n; i++) {
        const bt_tensor_view_t *v = bt_safetensors_at(st, i);
        if (drop && !strcmp(v->name, drop)) continue;
        w[k].name = v->name;
        w[k].dtype = v->dtype;
        w[k].ndim = v->ndim;
        memcpy(w[k].shape, v->shape, sizeof v->shape);
        w[k].data = v->data;
        if (reshape && !strcmp(v->name, reshape)) {
            /* one more row of zeros */
            size_t row = v->nbytes / (size_t)v->shape[0];
            bigger = calloc(1, v->nbytes + row);
            memcpy(bigger, v->data, v->nbytes);
            w[k].shape[0] += 1;
            w[k].data = bigger;
        }
        k++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    BT_CHECK(bt_safetensors_write(path, w, k, err, sizeof err) == BT_OK);
    free(bigger);
    free(w);
    bt_safetensors_close(st);
}

static void test_bad_checkpoints(void)
{
    char err[1024], pristine[512], cmd[1200];
    snprintf(dir, sizeof dir, "/tmp/bt-badckpt-%d", (int)getpid());
    BT_CHECK(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK);
    snprintf(pristine, sizeof pristine, "%s.pristine.safetensors", dir);
    snprintf(cmd, sizeof cmd, "cp %s/model.safetensors %s", dir, pristine);
    BT_CHECK(system(cmd) == 0);
    BT_CHECK_MSG(try_load(err, sizeof err) == BT_OK, "pristine: %s", err);

    rewrite(pristine, "layers.3.attn.wq_b.weight", NULL);
    BT_CHECK(try_load(err, sizeof err) == BT_ERR_BAD_CHECKPOINT);
    BT_CHECK_MSG(strstr(err, "layers.3.attn.wq_b.weight") != NULL, "missing tensor: %s", err);

    rewrite(pristine, "layers.2.attn.wq_b.scale", NULL);
    BT_CHECK(try_load(err, sizeof err) == BT_ERR_BAD_CHECKPOINT);
    BT_CHECK_MSG(strstr(err, "layers.2.attn.wq_b") != NULL, "missing scale: %s", err);

    rewrite(pristine, NULL, "layers.1.ffn.gate.weight");
    BT_CHECK(try_load(err, sizeof err) == BT_ERR_BAD_CHECKPOINT);
    BT_CHECK_MSG(strstr(err, "layers.1.ffn.gate.weight") && strstr(err, "model.safetensors"),
                 "wrong shape: %s", err);

    /* truncated file */
    snprintf(cmd, sizeof cmd, "head -c 100000 %s > %s/model.safetensors", pristine, dir);
    BT_CHECK(system(cmd) == 0);
    BT_CHECK(try_load(err, sizeof err) == BT_ERR_BAD_CHECKPOINT);
    BT_CHECK_MSG(strstr(err, "model.safetensors") != NULL, "truncated: %s", err);

    /* config: a missing field, a mistyped field */
    snprintf(cmd, sizeof cmd, "cp %s %s/model.safetensors && sed -i 's/\"hidden_size\"/\"hidden_sizes\"/' %s/config.json", pristine, dir, dir);
    BT_CHECK(system(cmd) == 0);
    BT_CHECK(try_load(err, sizeof err) == BT_ERR_BAD_CONFIG);
    BT_CHECK_MSG(strstr(err, "hidden_size") != NULL, "config: %s", err);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"hidden_sizes\": 128/\"hidden_size\": \"128\"/' %s/config.json", dir);
    BT_CHECK(system(cmd) == 0);
    BT_CHECK(try_load(err, sizeof err) == BT_ERR_BAD_CONFIG);
    BT_CHECK_MSG(strstr(err, "hidden_size") != NULL, "config type: %s", err);

    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, pristine);
    BT_CHECK(system(cmd) == 0);
}

int main(void)
{
    BT_RUN(test_bad_checkpoints);
    return bt_test_summary();
}

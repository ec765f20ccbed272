/* The KV handoff in memory: a "prefill" slot advances chunk by chunk and after each chunk
 * only bt_kv_changed_ranges() are copied into a "decode" slot that starts as garbage;
 * decoding then continues on the copy and must give bit-identical logits to decoding on
 * the original. Also: the compat hash changes with the context length and the TP size. */
#include "bt_test.h"
#include "common/alloc.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/model.h"
#include "unit/services/engine/demo_util.h"

#include <string.h>
#include <unistd.h>

#define CTX 96

static void check(const char *variant, int chunk)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-handoff-%s-%d", variant, (int)getpid());
    BT_CHECK(bt_demo_model_write(dir, variant, err, sizeof err) == BT_OK);
    bt_model_t *m = demo_model_load(dir, 2, CTX, CTX, 0);
    BT_CHECK(m != NULL);
    if (!m) return;
    const bt_model_config_t *c = bt_model_config(m);
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, c, CTX);
    uint8_t *pre = bt_aligned_alloc(64, lay.slot_bytes), *dec = bt_aligned_alloc(64, lay.slot_bytes);
    memset(dec, 0xA5, lay.slot_bytes); /* garbage: only the ranges may make it right */
    bt_kv_state_reset(pre);
    int32_t ids[70];
    for (int i = 0; i < 70; i++) ids[i] = (i * 31 + 7) % c->vocab;
    bt_kv_range_t ranges[4 * BT_MAX_LAYERS + 1];
    for (int i = 0; i < 50; i += chunk) {
        int n = 50 - i < chunk ? 50 - i : chunk;
        bt_kv_header_t before = *bt_kv_header(pre);
        bt_forward_seq_t seq = {pre, ids + i, n, false, NULL};
        BT_CHECK(bt_model_forward(m, &lay, &seq, 1, NULL, err, sizeof err) == BT_OK);
        int nr = bt_kv_changed_ranges(c, &lay, &before, pre, ranges, (int)(sizeof ranges / sizeof ranges[0]));
        for (int r = 0; r < nr; r++) memcpy(dec + ranges[r].off, pre + ranges[r].off, ranges[r].len);
    }
    float *la = malloc((size_t)c->vocab * sizeof(float)), *lb = malloc((size_t)c->vocab * sizeof(float));
    for (int i = 50; i < 70; i++) {
        bt_forward_seq_t a = {pre, ids + i, 1, false, NULL}, b = {dec, ids + i, 1, false, NULL};
        BT_CHECK(bt_model_forward(m, &lay, &a, 1, la, err, sizeof err) == BT_OK);
        BT_CHECK(bt_model_forward(m, &lay, &b, 1, lb, err, sizeof err) == BT_OK);
        BT_CHECK_MSG(memcmp(la, lb, (size_t)c->vocab * sizeof(float)) == 0, "%s chunk %d: step %d differs", variant, chunk, i);
    }
    bt_kv_layout_t lay2;
    bt_kv_layout_init(&lay2, c, CTX * 2);
    BT_CHECK(bt_kv_compat_hash(c, &lay, 1) != bt_kv_compat_hash(c, &lay2, 1));
    BT_CHECK(bt_kv_compat_hash(c, &lay, 1) != bt_kv_compat_hash(c, &lay, 4));
    BT_CHECK(bt_kv_compat_hash(c, &lay, 1) == bt_kv_compat_hash(c, &lay, 1));
    free(la);
    free(lb);
    bt_aligned_free(pre);
    bt_aligned_free(dec);
    bt_model_destroy(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    BT_CHECK(system(cmd) == 0);
}

static void test_handoff(void)
{
    int chunks[] = {1, 3, 7, 16, 50};
    for (int i = 0; i < 5; i++) {
        check("demo", chunks[i]);
        check("demo2", chunks[i]);
    }
}

int main(void)
{
    BT_RUN(test_handoff);
    return bt_test_summary();
}

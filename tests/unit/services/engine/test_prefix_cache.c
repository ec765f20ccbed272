/* The prefix cache on the demo models: a prompt prefilled from a cached prefix (its state
 * restored into a slot holding another sequence's bytes, the rest computed in chunks) gives
 * the logits of a cold prefill bit for bit, and leaves the slot with the same bytes; matches
 * find the deepest chain that fits; the budget evicts unpinned leaves, least recently used
 * first, and never a node someone holds or its chain. */
#include "bt_test.h"
#include "common/alloc.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/model.h"
#include "services/engine/prefix_cache.h"
#include "unit/services/engine/demo_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX 200
#define N_PROMPTS 24

static uint32_t rng = 12345;
static int irand(int n)
{
    rng = rng * 1664525u + 1013904223u;
    return (int)((rng >> 8) % (uint32_t)n);
}

/* Advances the slot by ids[from .. to) in one forward; all-position logits into rows (may be
 * NULL). */
static bool forward(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *slot, const int32_t *ids,
                    int from, int to, float *rows)
{
    char err[256];
    bt_forward_seq_t seq = {slot, ids + from, to - from, true, NULL};
    if (bt_model_forward(m, lay, &seq, 1, rows, err, sizeof err) == BT_OK) return true;
    fprintf(stderr, "forward: %s\n", err);
    return false;
}

/* Whether two slots hold the same state: their headers and every byte the state means (the
 * window rows of the positions so far, the compressed entries and index keys, the open groups'
 * buffered tokens; the rest of a slot is stale bytes nothing reads). */
static bool same_state(const bt_model_config_t *c, const bt_kv_layout_t *lay, const uint8_t *a,
                       const uint8_t *b)
{
    bt_kv_header_t ha = *(const bt_kv_header_t *)a, hb = *(const bt_kv_header_t *)b;
    ha.device_tag = hb.device_tag = 0;
    if (memcmp(&ha, &hb, sizeof ha)) return false;
    const size_t hd = (size_t)lay->head_dim * sizeof(float);
    const size_t ihd = (size_t)lay->index_head_dim * sizeof(float);
    const int64_t rows = ha.n_tokens < lay->window ? ha.n_tokens : lay->window;
    for (int l = 0; l < lay->n_rings; l++) /* the draft stages' rings too, where kept */
        if (memcmp(a + lay->window_off[l], b + lay->window_off[l], (size_t)rows * hd)) return false;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer[l].is_kv_source) continue;
        const size_t e = (size_t)ha.entries[l], p = (size_t)ha.pending[l];
        if (memcmp(a + lay->comp_off[l], b + lay->comp_off[l], e * hd) ||
            (lay->ikey_off[l] && memcmp(a + lay->ikey_off[l], b + lay->ikey_off[l], e * ihd)) ||
            memcmp(a + lay->pend_kv_off[l], b + lay->pend_kv_off[l], p * hd) ||
            memcmp(a + lay->pend_gate_off[l], b + lay->pend_gate_off[l], p * hd))
            return false;
    }
    return true;
}

/* Prompts that share prefixes of every length: each copies a random earlier prompt's first
 * tokens (or none) and goes on with its own; each prefilled in random chunks from what the
 * cache holds, inserting every chunk; logits and state compared with a cold run. draft: the
 * model runs its DSpark stages, whose rings the cached states must carry. */
static void check_prompts(const char *variant, size_t budget, int *hits_out, bool draft)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-prefix-%s-%d", variant, (int)getpid());
    BT_CHECK_MSG(bt_demo_model_write(dir, variant, err, sizeof err) == BT_OK, "%s", err);
    bt_model_t *m = demo_model_load_draft(dir, 2, CTX, CTX, 0, draft);
    BT_CHECK(m != NULL);
    if (!m) return;
    const bt_model_config_t *c = bt_model_config(m);
    const int V = c->vocab;
    BT_CHECK(c->n_draft == (draft ? 3 : 0));
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, c, CTX);
    bt_prefix_cache_t *cache;
    BT_CHECK(bt_prefix_cache_create(c, &lay, budget, &cache) == BT_OK);
    uint8_t *cold = bt_aligned_alloc(64, lay.slot_bytes),
            *warm = bt_aligned_alloc(64, lay.slot_bytes);
    static int32_t prompts[N_PROMPTS][CTX];
    int len[N_PROMPTS];
    float *want = malloc((size_t)CTX * V * sizeof(float)),
          *got = malloc((size_t)CTX * V * sizeof(float));
    int hits = 0, rows_checked = 0, bad_rows = 0, bad_states = 0, deepest_bad = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        len[p] = 20 + irand(CTX - 20);
        int shared = 0;
        if (p > 0 && irand(4) != 0) {
            const int q = irand(p);
            shared = irand(len[q] + 1);
            if (shared > len[p]) shared = len[p];
            memcpy(prompts[p], prompts[q], (size_t)shared * sizeof(int32_t));
        }
        for (int i = shared; i < len[p]; i++)
            prompts[p][i] = irand(V);
        const int32_t *ids = prompts[p];
        const int n = len[p];
        bt_kv_state_reset(cold);
        BT_CHECK(forward(m, &lay, cold, ids, 0, n, want));

        /* the deepest prefix any earlier prompt's chunks make, for the match to equal */
        int end = 0;
        bt_prefix_node_t *at = bt_prefix_cache_match(cache, ids, n, n - 1, &end);
        BT_CHECK(end <= n - 1 && (end == 0) == (at == NULL));
        memset(warm, 0xff, lay.slot_bytes); /* another sequence's bytes, or NaNs */
        if (at) {
            bt_prefix_cache_restore(cache, at, warm);
            hits++;
        } else {
            bt_kv_state_reset(warm);
        }
        BT_CHECK(bt_kv_header(warm)->n_tokens == end && bt_kv_header(warm)->device_tag == 0);
        for (int s = end; s < n;) {
            const int e = s + 1 + irand(n - s);
            bt_kv_header_t before = *bt_kv_header(warm);
            BT_CHECK(forward(m, &lay, warm, ids, s, e, got + (size_t)s * V));
            bt_prefix_node_t *next = bt_prefix_cache_insert(cache, at, ids, s, e, &before, warm);
            if (!next) { /* over the budget: the chain stops here, as a prefill's would */
                bt_prefix_cache_unpin(cache, at);
                at = NULL;
                if (e < n) BT_CHECK(forward(m, &lay, warm, ids, e, n, got + (size_t)e * V));
                break;
            }
            at = next;
            s = e;
        }
        bt_prefix_cache_unpin(cache, at);
        for (int i = end; i < n; i++, rows_checked++)
            if (memcmp(got + (size_t)i * V, want + (size_t)i * V, (size_t)V * sizeof(float)))
                bad_rows++;
        if (!same_state(c, &lay, cold, warm)) bad_states++;
        /* the match is the deepest: no longer cached prefix of this prompt's fits */
        int end2 = 0;
        bt_prefix_node_t *again = bt_prefix_cache_match(cache, ids, n, n, &end2);
        if (again && budget == SIZE_MAX && end2 != n) deepest_bad++;
        bt_prefix_cache_unpin(cache, again);
    }
    bt_prefix_cache_stats_t st;
    bt_prefix_cache_stats(cache, &st);
    fprintf(stderr,
            "  %s%s, budget %s: %d prompts, %d restored from the cache, %d rows compared; "
            "%lld nodes (%lld bytes), %lld evicted\n",
            variant, draft ? " with draft stages" : "", budget == SIZE_MAX ? "none" : "small",
            N_PROMPTS, hits, rows_checked, (long long)st.nodes, (long long)st.bytes,
            (long long)st.evicted);
    BT_CHECK_MSG(bad_rows == 0, "%d of %d rows differ from a cold prefill", bad_rows, rows_checked);
    BT_CHECK_MSG(bad_states == 0, "%d slots differ from a cold prefill's", bad_states);
    BT_CHECK_MSG(deepest_bad == 0, "%d prompts did not match their own whole chain", deepest_bad);
    BT_CHECK(st.bytes <= st.max_bytes);
    if (budget != SIZE_MAX) BT_CHECK_MSG(st.evicted > 0, "the small budget evicted nothing");
    *hits_out = hits;
    free(want), free(got);
    bt_aligned_free(cold), bt_aligned_free(warm);
    bt_prefix_cache_destroy(cache);
    bt_model_destroy(m);
    snprintf(err, sizeof err, "rm -rf %s", dir);
    BT_CHECK(system(err) == 0);
}

static void test_demo(void)
{
    int hits;
    check_prompts("demo", SIZE_MAX, &hits, false);
    BT_CHECK_MSG(hits >= N_PROMPTS / 2, "only %d prompts found a cached prefix", hits);
}

/* test_demo's prompts on the model running its draft stages */
static void test_demo_draft(void)
{
    int hits;
    rng = 12345;
    check_prompts("demo", SIZE_MAX, &hits, true);
    BT_CHECK_MSG(hits >= N_PROMPTS / 2, "only %d prompts found a cached prefix", hits);
}

static void test_demo2(void)
{
    int hits;
    check_prompts("demo2", SIZE_MAX, &hits, false);
    BT_CHECK_MSG(hits >= N_PROMPTS / 2, "only %d prompts found a cached prefix", hits);
}

static void test_small_budget(void)
{
    int hits;
    check_prompts("demo", 400000, &hits, false);
}

/* Matching, pins and eviction on made-up states (the demo model's layout, counters advanced
 * without a forward): a node's chain is never evicted while it is held; the least recently
 * used leaf goes first; an insert that cannot fit says so and keeps the parent pinned. */
static void test_pins_and_order(void)
{
    char dir[256], err[512];
    snprintf(dir, sizeof dir, "/tmp/bt-prefix-pins-%d", (int)getpid());
    BT_CHECK(bt_demo_model_write(dir, "demo", err, sizeof err) == BT_OK);
    bt_model_config_t cfg;
    BT_CHECK(bt_model_config_load(dir, &cfg, err, sizeof err) == BT_OK);
    bt_kv_layout_t lay;
    bt_kv_layout_init(&lay, &cfg, CTX);
    uint8_t *slot = bt_aligned_alloc(64, lay.slot_bytes);
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++)
        a[i] = i, b[i] = i < 32 ? i : 1000 + i;
    /* a node's size for a 16-token chunk at the start: what one step of the budget holds */
    bt_prefix_cache_t *probe;
    BT_CHECK(bt_prefix_cache_create(&cfg, &lay, SIZE_MAX, &probe) == BT_OK);
    bt_kv_state_reset(slot);
    bt_kv_header_t h0 = *bt_kv_header(slot);
    bt_kv_state_advance_counters(&cfg, slot, 16);
    bt_prefix_cache_unpin(probe, bt_prefix_cache_insert(probe, NULL, a, 0, 16, &h0, slot));
    bt_prefix_cache_stats_t st;
    bt_prefix_cache_stats(probe, &st);
    const size_t one = (size_t)st.bytes;
    bt_prefix_cache_destroy(probe);

    /* room for about 3.5 such nodes */
    bt_prefix_cache_t *c;
    BT_CHECK(bt_prefix_cache_create(&cfg, &lay, one * 7 / 2, &c) == BT_OK);
    /* chain a: [0,16) [16,32) [32,48), held at its end */
    bt_prefix_node_t *at = NULL;
    bt_kv_state_reset(slot);
    for (int s = 0; s < 48; s += 16) {
        bt_kv_header_t before = *bt_kv_header(slot);
        bt_kv_state_advance_counters(&cfg, slot, 16);
        at = bt_prefix_cache_insert(c, at, a, s, s + 16, &before, slot);
        BT_CHECK(at != NULL);
    }
    /* b shares a's first 32 tokens: its node [32,48) does not fit without evicting a held
     * chain; refused, and its parent (a's [16,32), matched) stays held */
    int end = 0;
    bt_prefix_node_t *bm = bt_prefix_cache_match(c, b, 64, 63, &end);
    BT_CHECK_EQ_INT(end, 32);
    bt_prefix_cache_restore(c, bm, slot);
    BT_CHECK(bt_kv_header(slot)->n_tokens == 32);
    bt_kv_header_t before = *bt_kv_header(slot);
    bt_kv_state_advance_counters(&cfg, slot, 16);
    /* (a node of 16 tokens at 32 is no bigger than the first: 3 held + 1 > 3.5) */
    bt_prefix_node_t *bn = bt_prefix_cache_insert(c, bm, b, 32, 48, &before, slot);
    bt_prefix_cache_stats(c, &st);
    BT_CHECK_MSG(bn == NULL && st.evicted == 0 && st.nodes == 3,
                 "an insert evicted a held chain (nodes %lld, evicted %lld)", (long long)st.nodes,
                 (long long)st.evicted);
    /* let a's end go: now b's node fits by evicting it (the least recently used leaf) */
    bt_prefix_cache_unpin(c, at);
    bn = bt_prefix_cache_insert(c, bm, b, 32, 48, &before, slot);
    bt_prefix_cache_stats(c, &st);
    BT_CHECK(bn != NULL && st.evicted == 1 && st.nodes == 3);
    bt_prefix_node_t *a32 = bt_prefix_cache_match(c, a, 64, 63, &end);
    BT_CHECK(a32 != NULL && end == 32); /* a's end is gone */
    bt_prefix_cache_unpin(c, a32);
    /* the same span again is the same node, no new bytes */
    bt_prefix_cache_unpin(c, bn);
    const int64_t nodes = st.nodes;
    bt_prefix_node_t *mid = bt_prefix_cache_match(c, b, 64, 48, &end);
    BT_CHECK(end == 48 && mid == bn);
    bt_prefix_cache_unpin(c, mid);
    bt_prefix_node_t *m32 = bt_prefix_cache_match(c, a, 64, 40, &end);
    BT_CHECK_EQ_INT(end, 32);
    bt_kv_state_reset(slot);
    bt_kv_state_advance_counters(&cfg, slot, 32);
    before = *bt_kv_header(slot);
    bt_kv_state_advance_counters(&cfg, slot, 16);
    BT_CHECK(bt_prefix_cache_insert(c, m32, b, 32, 48, &before, slot) == bn);
    bt_prefix_cache_stats(c, &st);
    BT_CHECK(st.nodes == nodes);
    bt_prefix_cache_unpin(c, bn);
    /* everything let go: a node bigger than the whole budget is refused outright */
    bt_prefix_cache_t *tiny;
    BT_CHECK(bt_prefix_cache_create(&cfg, &lay, one / 2, &tiny) == BT_OK);
    bt_kv_state_reset(slot);
    h0 = *bt_kv_header(slot);
    bt_kv_state_advance_counters(&cfg, slot, 16);
    BT_CHECK(bt_prefix_cache_insert(tiny, NULL, a, 0, 16, &h0, slot) == NULL);
    /* ... where a counters-only one (simulated workers) keeps the header alone, and restores
     * the counters */
    bt_prefix_cache_counters_only(tiny);
    bt_prefix_node_t *hn = bt_prefix_cache_insert(tiny, NULL, a, 0, 16, &h0, slot);
    bt_prefix_cache_stats(tiny, &st);
    BT_CHECK_MSG(hn && (size_t)st.bytes < one / 2, "a counters-only node of %lld bytes",
                 (long long)st.bytes);
    bt_kv_header_t want = *bt_kv_header(slot);
    want.device_tag = 0;
    memset(slot, 0x5a, lay.slot_bytes);
    BT_CHECK(bt_prefix_cache_restore(tiny, hn, slot) == sizeof(bt_kv_header_t));
    BT_CHECK(!memcmp(bt_kv_header(slot), &want, sizeof want));
    bt_prefix_cache_unpin(tiny, hn);
    bt_prefix_cache_destroy(tiny);
    bt_prefix_cache_destroy(c);
    bt_aligned_free(slot);
    snprintf(err, sizeof err, "rm -rf %s", dir);
    BT_CHECK(system(err) == 0);
}

int main(void)
{
    BT_RUN(test_demo);
    BT_RUN(test_demo2);
    BT_RUN(test_small_budget);
    BT_RUN(test_pins_and_order);
    BT_RUN(test_demo_draft);
    return bt_test_summary();
}

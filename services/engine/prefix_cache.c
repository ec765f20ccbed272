/* The prefix cache (prefix_cache.h): a tree of chunk deltas, evicted leaf first. */
#include "services/engine/prefix_cache.h"

#include "common/alloc.h"
#include "common/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct bt_prefix_node {
    bt_prefix_node_t *parent, *child, *sibling; /* children: a list, newest first */
    bt_prefix_node_t *prev, *next;              /* every node but the root, for eviction */
    int start, end;
    int32_t *ids; /* the span's tokens, end - start */
    int n_ranges;
    bt_kv_range_t *ranges; /* where the delta's bytes go in a slot, in order */
    uint8_t *bytes;
    size_t size; /* what it counts against the budget */
    int pins;
    uint64_t used; /* the clock when a match or insert last went through it */
};

struct bt_prefix_cache {
    pthread_mutex_t lock; /* the tree, the list, the counts; not a held chain's bytes */
    const bt_model_config_t *cfg;
    bt_kv_layout_t lay;
    size_t max_bytes, bytes;
    bool counters_only;    /* nodes keep the header alone (bt_prefix_cache_counters_only) */
    bt_prefix_node_t root; /* [0, 0): no bytes, never evicted */
    bt_prefix_node_t *all; /* every other node */
    int64_t nodes;
    uint64_t clock;
    bt_prefix_cache_stats_t st;
};

bt_status_t bt_prefix_cache_create(const bt_model_config_t *cfg, const bt_kv_layout_t *lay,
                                   size_t max_bytes, bt_prefix_cache_t **out)
{
    bt_prefix_cache_t *c = calloc(1, sizeof *c);
    if (!c) return BT_ERR_NO_MEMORY;
    pthread_mutex_init(&c->lock, NULL);
    c->cfg = cfg;
    c->lay = *lay;
    c->max_bytes = max_bytes;
    *out = c;
    return BT_OK;
}

static void node_free(bt_prefix_node_t *n)
{
    free(n->ids);
    free(n->ranges);
    free(n->bytes);
    free(n);
}

void bt_prefix_cache_counters_only(bt_prefix_cache_t *c)
{
    pthread_mutex_lock(&c->lock);
    c->counters_only = true;
    pthread_mutex_unlock(&c->lock);
}

void bt_prefix_cache_destroy(bt_prefix_cache_t *c)
{
    if (!c) return;
    for (bt_prefix_node_t *n = c->all; n;) {
        bt_prefix_node_t *next = n->next;
        node_free(n);
        n = next;
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* a node and its ancestors were used now */
static void touch(bt_prefix_cache_t *c, bt_prefix_node_t *n)
{
    c->clock++;
    for (; n; n = n->parent)
        n->used = c->clock;
}

/* the deepest node under `at` (which covers ids[0 .. at->end)) whose chain still matches */
static bt_prefix_node_t *deepest(bt_prefix_node_t *at, const int32_t *ids, int n, int max_end)
{
    bt_prefix_node_t *best = at;
    for (bt_prefix_node_t *ch = at->child; ch; ch = ch->sibling) {
        if (ch->end > max_end || ch->end > n ||
            memcmp(ch->ids, ids + ch->start, (size_t)(ch->end - ch->start) * sizeof *ids) != 0)
            continue;
        bt_prefix_node_t *d = deepest(ch, ids, n, max_end);
        if (d->end > best->end) best = d;
    }
    return best;
}

bt_prefix_node_t *bt_prefix_cache_match(bt_prefix_cache_t *c, const int32_t *ids, int n,
                                        int max_end, int *end_p)
{
    pthread_mutex_lock(&c->lock);
    c->st.lookups++;
    bt_prefix_node_t *d = deepest(&c->root, ids, n, max_end);
    if (d == &c->root) {
        pthread_mutex_unlock(&c->lock);
        *end_p = 0;
        return NULL;
    }
    d->pins++;
    touch(c, d);
    c->st.hits++;
    c->st.hit_tokens += d->end;
    *end_p = d->end;
    pthread_mutex_unlock(&c->lock);
    return d;
}

size_t bt_prefix_cache_restore(bt_prefix_cache_t *c, const bt_prefix_node_t *node, uint8_t *state)
{
    size_t bytes = 0;
    bt_kv_state_reset(state);
    int depth = 0;
    for (const bt_prefix_node_t *n = node; n && n != &c->root; n = n->parent)
        depth++;
    const bt_prefix_node_t **chain = bt_malloc_or_die((size_t)(depth ? depth : 1) * sizeof *chain);
    int i = depth;
    for (const bt_prefix_node_t *n = node; n && n != &c->root; n = n->parent)
        chain[--i] = n;
    for (i = 0; i < depth; i++) {
        const uint8_t *src = chain[i]->bytes;
        for (int r = 0; r < chain[i]->n_ranges; r++) {
            memcpy(state + chain[i]->ranges[r].off, src, chain[i]->ranges[r].len);
            src += chain[i]->ranges[r].len;
            bytes += chain[i]->ranges[r].len;
        }
    }
    free(chain);
    bt_kv_header(state)->device_tag = 0;
    return bytes;
}

static void unpin_locked(bt_prefix_node_t *node)
{
    if (!node) return;
    BT_ASSERT(node->pins > 0);
    node->pins--;
}

void bt_prefix_cache_unpin(bt_prefix_cache_t *c, bt_prefix_node_t *node)
{
    if (!node) return;
    pthread_mutex_lock(&c->lock);
    unpin_locked(node);
    pthread_mutex_unlock(&c->lock);
}

/* Drops the least recently used leaf no one holds; false when there is none. */
static bool evict_one(bt_prefix_cache_t *c)
{
    bt_prefix_node_t *victim = NULL;
    for (bt_prefix_node_t *n = c->all; n; n = n->next)
        if (!n->child && !n->pins && (!victim || n->used < victim->used)) victim = n;
    if (!victim) return false;
    bt_prefix_node_t **link = &victim->parent->child;
    while (*link != victim)
        link = &(*link)->sibling;
    *link = victim->sibling;
    if (victim->prev)
        victim->prev->next = victim->next;
    else
        c->all = victim->next;
    if (victim->next) victim->next->prev = victim->prev;
    c->bytes -= victim->size;
    c->nodes--;
    c->st.evicted++;
    node_free(victim);
    return true;
}

static bt_prefix_node_t *insert_locked(bt_prefix_cache_t *c, bt_prefix_node_t *parent,
                                       const int32_t *ids, int start, int end,
                                       const bt_kv_header_t *before, const uint8_t *state)
{
    bt_prefix_node_t *at = parent ? parent : &c->root;
    BT_ASSERT(at->end == start && end > start);
    const size_t span = (size_t)(end - start) * sizeof *ids;
    for (bt_prefix_node_t *ch = at->child; ch; ch = ch->sibling)
        if (ch->end == end && !memcmp(ch->ids, ids + start, span)) {
            ch->pins++;
            touch(c, ch);
            unpin_locked(parent);
            return ch;
        }
    bt_kv_range_t rg[4 * BT_MAX_LAYERS + 1] = {{0, sizeof(bt_kv_header_t)}};
    const int nr = c->counters_only ? 1
                                    : bt_kv_changed_ranges(c->cfg, &c->lay, before, state, rg,
                                                           (int)(sizeof rg / sizeof rg[0]));
    size_t data = 0;
    for (int r = 0; r < nr; r++)
        data += rg[r].len;
    const size_t size = sizeof(bt_prefix_node_t) + span + (size_t)nr * sizeof *rg + data;
    if (size > c->max_bytes) return NULL;
    while (c->bytes + size > c->max_bytes)
        if (!evict_one(c)) return NULL; /* (at and its chain are pinned: never evicted) */
    bt_prefix_node_t *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->ids = malloc(span);
    n->ranges = malloc((size_t)nr * sizeof *rg);
    n->bytes = malloc(data ? data : 1);
    if (!n->ids || !n->ranges || !n->bytes) {
        node_free(n);
        return NULL;
    }
    memcpy(n->ids, ids + start, span);
    memcpy(n->ranges, rg, (size_t)nr * sizeof *rg);
    n->n_ranges = nr;
    uint8_t *dst = n->bytes;
    for (int r = 0; r < nr; r++) {
        memcpy(dst, state + rg[r].off, rg[r].len);
        dst += rg[r].len;
    }
    n->start = start;
    n->end = end;
    n->size = size;
    n->parent = at;
    n->sibling = at->child;
    at->child = n;
    n->next = c->all;
    if (c->all) c->all->prev = n;
    c->all = n;
    n->pins = 1;
    touch(c, n);
    c->bytes += size;
    c->nodes++;
    c->st.inserted++;
    unpin_locked(parent);
    return n;
}

bt_prefix_node_t *bt_prefix_cache_insert(bt_prefix_cache_t *c, bt_prefix_node_t *parent,
                                         const int32_t *ids, int start, int end,
                                         const bt_kv_header_t *before, const uint8_t *state)
{
    pthread_mutex_lock(&c->lock);
    bt_prefix_node_t *n = insert_locked(c, parent, ids, start, end, before, state);
    pthread_mutex_unlock(&c->lock);
    return n;
}

void bt_prefix_cache_stats(bt_prefix_cache_t *c, bt_prefix_cache_stats_t *s)
{
    pthread_mutex_lock(&c->lock);
    *s = c->st;
    s->nodes = c->nodes;
    s->bytes = (int64_t)c->bytes;
    s->max_bytes = c->max_bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)c->max_bytes;
    pthread_mutex_unlock(&c->lock);
}

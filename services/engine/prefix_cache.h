/* The prefix cache: KV states of prompt prefixes a prefill group has computed, so that a
 * prompt that starts with one is prefilled from there (SGLang's radix cache, for this model).
 *
 * The state of DeepSeek-V4.1 after n tokens cannot be cut out of a later one: the window
 * ring has moved on and the compressor's open group has closed. So the cache keeps states at
 * the boundaries where a prefill stopped, as deltas. A node holds a span of tokens [start,
 * end) and the bytes that chunk changed in the slot (bt_kv_changed_ranges from the state at
 * start); the state at a node's end is the deltas of its chain, root first, written in order
 * into a reset slot (what a decode group receives from a prefill, chunk by chunk). Nodes that
 * start where another ends are its children, sharing its chain, so prompts that share a
 * prefix share its bytes.
 *
 *   bt_prefix_cache_t *c;  bt_prefix_cache_create(cfg, &lay, 1 << 30, &c);
 *   int end;  bt_prefix_node_t *at = bt_prefix_cache_match(c, ids, n, n - 1, &end);
 *   if (at) bt_prefix_cache_restore(c, at, slot);   // else a reset slot, end 0
 *   ... forward ids[end .. e) ...
 *   at = bt_prefix_cache_insert(c, at, ids, end, e, &header_before, slot);
 *   ...
 *   bt_prefix_cache_unpin(c, at);
 *
 * A node a caller holds (match and insert return them pinned) stays, with its chain; the
 * least recently used unpinned leaves go when the cache would pass its byte budget. Calls may
 * come from several threads (a prefill group matches on its loop and restores and inserts in
 * its worker thread): each takes the cache's lock, but a restore, which only reads the held
 * chain, none. */
#ifndef BT_ENGINE_PREFIX_CACHE_H
#define BT_ENGINE_PREFIX_CACHE_H

#include "common/status.h"
#include "services/engine/kv_state.h"

#include <stddef.h>
#include <stdint.h>

typedef struct bt_prefix_cache bt_prefix_cache_t;
typedef struct bt_prefix_node bt_prefix_node_t;

/* A prefill group keeps the state at a prompt's last multiple of this many tokens (and at the
 * chat turns the router marks, this far in at least); the router's prefix affinity keys the
 * same multiples. */
#define BT_PREFIX_CACHE_BLOCK 64

/* max_bytes: the budget for the nodes' bytes, token ids and bookkeeping */
bt_status_t bt_prefix_cache_create(const bt_model_config_t *cfg, const bt_kv_layout_t *lay,
                                   size_t max_bytes, bt_prefix_cache_t **out);
void bt_prefix_cache_destroy(bt_prefix_cache_t *c);

/* From now on, chunks keep the slot's header alone: for simulated workers, whose slots hold
 * no data but counters (their chunks' bytes would be copies of zeros, megabytes each). */
void bt_prefix_cache_counters_only(bt_prefix_cache_t *c);

/* The node whose chain covers the longest prefix ids[0 .. end) with end <= max_end, pinned
 * (*end_p = end); NULL when no node fits (*end_p = 0). */
bt_prefix_node_t *bt_prefix_cache_match(bt_prefix_cache_t *c, const int32_t *ids, int n,
                                        int max_end, int *end_p);

/* The state at the end of node's chain, written into a slot (reset first; its device_tag 0,
 * so a device backend uploads it afresh). Returns the bytes written. */
size_t bt_prefix_cache_restore(bt_prefix_cache_t *c, const bt_prefix_node_t *node, uint8_t *state);

/* Records that the chunk ids[start .. end) took the slot from the header `before` (the state
 * at `parent`'s end: start == that end, or start 0 with parent NULL) to `state`. Returns the
 * node for ids[0 .. end), pinned (an existing one when that span is cached already), and
 * unpins parent; NULL when the chunk's bytes do not fit the budget even with every unpinned
 * leaf gone (parent stays pinned then). */
bt_prefix_node_t *bt_prefix_cache_insert(bt_prefix_cache_t *c, bt_prefix_node_t *parent,
                                         const int32_t *ids, int start, int end,
                                         const bt_kv_header_t *before, const uint8_t *state);

/* Lets go of a node match or insert returned (NULL: nothing). */
void bt_prefix_cache_unpin(bt_prefix_cache_t *c, bt_prefix_node_t *node);

typedef struct {
    int64_t nodes, bytes, max_bytes;
    int64_t lookups, hits, hit_tokens; /* match calls, those that found a node, its tokens */
    int64_t inserted, evicted;         /* nodes */
} bt_prefix_cache_stats_t;

void bt_prefix_cache_stats(bt_prefix_cache_t *c, bt_prefix_cache_stats_t *s);

#endif

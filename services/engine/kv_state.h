/* Per-sequence KV state of DeepSeek-V4.1 in one flat, describable layout, and a pool of
 * fixed-capacity slots holding it.
 *
 * A slot is one contiguous block of `slot_bytes`: a header (positions and counters), then per
 * layer its sliding-window ring, then per kv-source layer its compressed latents, index keys
 * and the pending (not yet complete) compressor group. No pointers inside, so a slot can be
 * copied or written remotely (prefill -> decode) as plain bytes at known offsets.
 *
 *   bt_kv_layout_t lay;  bt_kv_layout_init(&lay, &cfg, max_ctx);
 *   bt_kv_pool_t *pool;  bt_kv_pool_create(&lay, 16, &pool);
 *   int slot;            bt_kv_pool_alloc(pool, &slot);    // header reset, ready to prefill
 *   uint8_t *state = bt_kv_pool_slot(pool, slot);
 *   ...
 *   bt_kv_pool_free(pool, slot);
 */
#ifndef BT_ENGINE_KV_STATE_H
#define BT_ENGINE_KV_STATE_H

#include "common/status.h"
#include "services/engine/config.h"

#include <stddef.h>
#include <stdint.h>

#define BT_KV_ENGRAM_HISTORY 8

/* Slot header. Counters are int64 so the layout is the same on every host. */
typedef struct {
    int64_t n_tokens;                       /* positions processed so far */
    int64_t entries[BT_MAX_LAYERS];         /* compressed entries per kv-source layer */
    int64_t pending[BT_MAX_LAYERS];         /* tokens waiting in the open compressor group */
    int64_t engram_hist[BT_KV_ENGRAM_HISTORY]; /* compressed ids by position % history */
    /* Written by a device backend after each forward: its copy of the slot is current while
     * the tag is unchanged (services/engine/model_cuda.c). 0 after a reset; a slot that
     * arrives from another group carries that group's tag, so it is uploaded afresh. */
    uint64_t device_tag;
} bt_kv_header_t;

typedef struct {
    int64_t max_ctx;     /* tokens a slot can hold */
    int window, head_dim, index_head_dim, n_layers;
    int n_rings; /* window rings: the backbone's layers, then the draft stages' (cfg n_draft) */
    size_t slot_bytes;
    /* byte offsets inside a slot; 0 where a layer has no such region */
    size_t window_off[BT_MAX_LAYERS];  /* float [window][head_dim] ring by position % window */
    size_t comp_off[BT_MAX_LAYERS];    /* float [comp_cap][head_dim], rotated latents */
    size_t ikey_off[BT_MAX_LAYERS];    /* float [comp_cap][index_head_dim], index keys */
    size_t pend_kv_off[BT_MAX_LAYERS]; /* float [ratio][head_dim] */
    size_t pend_gate_off[BT_MAX_LAYERS];
    int64_t comp_cap[BT_MAX_LAYERS];
} bt_kv_layout_t;

bt_status_t bt_kv_layout_init(bt_kv_layout_t *lay, const bt_model_config_t *cfg, int64_t max_ctx);

/* Clears a slot's header (the rest is overwritten before it is read). */
void bt_kv_state_reset(uint8_t *state);

/* Advances only a slot's counters as n more tokens would (positions, compressed entries,
 * open groups), writing no data: what a simulated worker does, so that the ranges it moves
 * (bt_kv_changed_ranges) have the real sizes. */
void bt_kv_state_advance_counters(const bt_model_config_t *cfg, uint8_t *state, int n);

static inline bt_kv_header_t *bt_kv_header(uint8_t *state)
{
    return (bt_kv_header_t *)state;
}

static inline float *bt_kv_region(uint8_t *state, size_t off)
{
    return (float *)(state + off);
}

typedef struct bt_kv_pool bt_kv_pool_t;

bt_status_t bt_kv_pool_create(const bt_kv_layout_t *lay, int n_slots, bt_kv_pool_t **pool_p);
void bt_kv_pool_destroy(bt_kv_pool_t *pool);
/* BT_ERR_EXHAUSTED when every slot is taken. */
bt_status_t bt_kv_pool_alloc(bt_kv_pool_t *pool, int *slot_p);
void bt_kv_pool_free(bt_kv_pool_t *pool, int slot);
uint8_t *bt_kv_pool_slot(bt_kv_pool_t *pool, int slot);
int bt_kv_pool_used(const bt_kv_pool_t *pool);
int bt_kv_pool_capacity(const bt_kv_pool_t *pool);
const bt_kv_layout_t *bt_kv_pool_layout(const bt_kv_pool_t *pool);



/* A hash of everything two groups must agree on to exchange KV slots: the model's shapes,
 * the slot layout (offsets depend on the context length), the dtype and the TP size.
 * Prefill and decode compare it when they first meet and refuse a mismatch. */
uint64_t bt_kv_compat_hash(const bt_model_config_t *cfg, const bt_kv_layout_t *lay, int tp);

/* A byte range of a slot. */
typedef struct {
    size_t off, len;
} bt_kv_range_t;

/* The ranges of a slot that advancing it from `before` (a copy of its header taken before)
 * to its current state wrote: window-ring entries of the new positions, new compressed
 * entries and index keys, the open compressor groups, and the header last. What a prefill
 * group sends after each chunk. Returns the count (at most max; 4 * layers + 1 suffice). */
int bt_kv_changed_ranges(const bt_model_config_t *cfg, const bt_kv_layout_t *lay,
                         const bt_kv_header_t *before, const uint8_t *state, bt_kv_range_t *out,
                         int max);

#endif

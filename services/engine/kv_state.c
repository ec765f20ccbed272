#include "services/engine/kv_state.h"

#include "common/alloc.h"
#include "common/log.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static size_t align64(size_t x)
{
    return (x + 63) & ~(size_t)63;
}

bt_status_t bt_kv_layout_init(bt_kv_layout_t *lay, const bt_model_config_t *cfg, int64_t max_ctx)
{
    if (max_ctx < 1) return BT_ERR_INVALID_ARG;
    memset(lay, 0, sizeof *lay);
    lay->max_ctx = max_ctx;
    lay->window = cfg->window;
    lay->head_dim = cfg->head_dim;
    lay->index_head_dim = cfg->index_head_dim;
    lay->n_layers = cfg->n_layers;
    lay->n_rings = cfg->n_layers + cfg->n_draft;
    size_t off = align64(sizeof(bt_kv_header_t));
    size_t hd = (size_t)cfg->head_dim * sizeof(float);
    for (int l = 0; l < lay->n_rings; l++) {
        lay->window_off[l] = off;
        off = align64(off + (size_t)cfg->window * hd);
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        const bt_layer_config_t *L = &cfg->layer[l];
        if (!L->is_kv_source) continue;
        int64_t cap = max_ctx / L->compress_ratio;
        lay->comp_cap[l] = cap;
        lay->comp_off[l] = off;
        off = align64(off + (size_t)cap * hd);
        if (L->is_index_source) {
            lay->ikey_off[l] = off;
            off = align64(off + (size_t)cap * (size_t)cfg->index_head_dim * sizeof(float));
        }
        lay->pend_kv_off[l] = off;
        off = align64(off + (size_t)L->compress_ratio * hd);
        lay->pend_gate_off[l] = off;
        off = align64(off + (size_t)L->compress_ratio * hd);
    }
    lay->slot_bytes = off;
    return BT_OK;
}

void bt_kv_state_reset(uint8_t *state)
{
    memset(state, 0, sizeof(bt_kv_header_t));
}

void bt_kv_state_advance_counters(const bt_model_config_t *cfg, uint8_t *state, int n)
{
    bt_kv_header_t *h = bt_kv_header(state);
    h->n_tokens += n;
    for (int l = 0; l < cfg->n_layers && l < BT_MAX_LAYERS; l++) {
        int r = cfg->layer[l].compress_ratio;
        if (!cfg->layer[l].is_kv_source || r < 1) continue;
        h->entries[l] = h->n_tokens / r;
        h->pending[l] = h->n_tokens % r;
    }
}

struct bt_kv_pool {
    bt_kv_layout_t layout;
    int n_slots, used;
    uint8_t *mem;
    bool *taken;
};

bt_status_t bt_kv_pool_create(const bt_kv_layout_t *lay, int n_slots, bt_kv_pool_t **pool_p)
{
    size_t bytes;
    if (n_slots < 1 || bt_mul_overflows(lay->slot_bytes, (size_t)n_slots, &bytes))
        return BT_ERR_INVALID_ARG;
    bt_kv_pool_t *p = bt_calloc_or_die(1, sizeof *p);
    p->layout = *lay;
    p->n_slots = n_slots;
    p->mem = bt_aligned_alloc(64, bytes);
    if (!p->mem) {
        BT_LOG_ERROR("kv pool: cannot allocate %zu bytes for %d slots", bytes, n_slots);
        free(p);
        return BT_ERR_NO_MEMORY;
    }
    p->taken = bt_calloc_or_die((size_t)n_slots, sizeof(bool));
    *pool_p = p;
    return BT_OK;
}

void bt_kv_pool_destroy(bt_kv_pool_t *p)
{
    if (!p) return;
    bt_aligned_free(p->mem);
    free(p->taken);
    free(p);
}

bt_status_t bt_kv_pool_alloc(bt_kv_pool_t *p, int *slot_p)
{
    for (int i = 0; i < p->n_slots; i++) {
        if (p->taken[i]) continue;
        p->taken[i] = true;
        p->used++;
        bt_kv_state_reset(bt_kv_pool_slot(p, i));
        *slot_p = i;
        return BT_OK;
    }
    return BT_ERR_EXHAUSTED;
}

void bt_kv_pool_free(bt_kv_pool_t *p, int slot)
{
    BT_ASSERT(slot >= 0 && slot < p->n_slots && p->taken[slot]);
    p->taken[slot] = false;
    p->used--;
}

uint8_t *bt_kv_pool_slot(bt_kv_pool_t *p, int slot)
{
    BT_ASSERT(slot >= 0 && slot < p->n_slots);
    return p->mem + (size_t)slot * p->layout.slot_bytes;
}

int bt_kv_pool_used(const bt_kv_pool_t *p)
{
    return p->used;
}

int bt_kv_pool_capacity(const bt_kv_pool_t *p)
{
    return p->n_slots;
}

const bt_kv_layout_t *bt_kv_pool_layout(const bt_kv_pool_t *p)
{
    return &p->layout;
}

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define HASH_FIELD(h, x) ((h) = fnv((h), &(x), sizeof(x)))

uint64_t bt_kv_compat_hash(const bt_model_config_t *c, const bt_kv_layout_t *lay, int tp)
{
    uint64_t h = 0xcbf29ce484222325ull;
    static const char tag[] = "baton-kv-v1/f32"; /* layout version and storage dtype */
    h = fnv(h, tag, sizeof tag);
    HASH_FIELD(h, tp);
    int fields[] = {c->vocab, c->hidden, c->n_layers, c->n_heads, c->head_dim, c->q_lora_rank,
                    c->o_groups, c->o_lora_rank, c->window, c->index_heads, c->index_head_dim,
                    c->index_topk, c->n_experts, c->n_active, c->moe_inter, c->hc_mult,
                    c->n_engram, c->engram_max_ngram, c->engram_heads, c->engram_head_dim};
    h = fnv(h, fields, sizeof fields);
    for (int l = 0; l < c->n_layers; l++) {
        int role[4] = {c->layer[l].compress_ratio, c->layer[l].is_kv_source,
                       c->layer[l].is_index_source, c->layer[l].kv_source};
        h = fnv(h, role, sizeof role);
    }
    HASH_FIELD(h, lay->max_ctx);
    uint64_t slot = lay->slot_bytes;
    HASH_FIELD(h, slot);
    HASH_FIELD(h, c->n_draft);
    for (int l = 0; l < lay->n_rings; l++) {
        uint64_t offs[6] = {lay->window_off[l], lay->comp_off[l], lay->ikey_off[l],
                            lay->pend_kv_off[l], lay->pend_gate_off[l], (uint64_t)lay->comp_cap[l]};
        h = fnv(h, offs, sizeof offs);
    }
    return h;
}

static int add_range(bt_kv_range_t *out, int n, int max, size_t off, size_t len)
{
    if (len == 0) return n;
    BT_ASSERT(n < max);
    out[n].off = off;
    out[n].len = len;
    return n + 1;
}

int bt_kv_changed_ranges(const bt_model_config_t *cfg, const bt_kv_layout_t *lay,
                         const bt_kv_header_t *before, const uint8_t *state, bt_kv_range_t *out,
                         int max)
{
    const bt_kv_header_t *now = (const bt_kv_header_t *)state;
    size_t hd = (size_t)lay->head_dim * sizeof(float);
    size_t ihd = (size_t)lay->index_head_dim * sizeof(float);
    int64_t b = before->n_tokens, e = now->n_tokens, W = lay->window;
    int n = 0;
    for (int l = 0; l < lay->n_rings; l++) {
        if (e - b >= W) {
            n = add_range(out, n, max, lay->window_off[l], (size_t)W * hd);
        } else if (e > b) {
            int64_t s = b % W, t = e % W;
            if (s < t) {
                n = add_range(out, n, max, lay->window_off[l] + (size_t)s * hd, (size_t)(t - s) * hd);
            } else {
                n = add_range(out, n, max, lay->window_off[l] + (size_t)s * hd, (size_t)(W - s) * hd);
                n = add_range(out, n, max, lay->window_off[l], (size_t)t * hd);
            }
        }
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!cfg->layer[l].is_kv_source) continue;
        int64_t e0 = before->entries[l], e1 = now->entries[l];
        n = add_range(out, n, max, lay->comp_off[l] + (size_t)e0 * hd, (size_t)(e1 - e0) * hd);
        if (lay->ikey_off[l])
            n = add_range(out, n, max, lay->ikey_off[l] + (size_t)e0 * ihd, (size_t)(e1 - e0) * ihd);
        /* the open group: its buffered tokens (rewritten whole, it is small) */
        size_t r = (size_t)cfg->layer[l].compress_ratio;
        n = add_range(out, n, max, lay->pend_kv_off[l], r * hd);
        n = add_range(out, n, max, lay->pend_gate_off[l], r * hd);
    }
    return add_range(out, n, max, 0, sizeof(bt_kv_header_t));
}

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
    size_t off = align64(sizeof(bt_kv_header_t));
    size_t hd = (size_t)cfg->head_dim * sizeof(float);
    for (int l = 0; l < cfg->n_layers; l++) {
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

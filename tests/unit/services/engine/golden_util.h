/* Helpers shared by the engine's golden tests: read fixture tensors from golden.safetensors
 * and load a fixture model with the reference's engram token map. */
#ifndef BT_TEST_GOLDEN_UTIL_H
#define BT_TEST_GOLDEN_UTIL_H

#include "common/alloc.h"
#include "services/engine/kv_state.h"
#include "services/engine/model.h"
#include "services/engine/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fixtures' directory: $BT_GOLDEN_DIR when set (a GPU machine that has them elsewhere),
 * else the one beside the checkout (compiled in). */
static inline const char *golden_dir(void)
{
    const char *e = getenv("BT_GOLDEN_DIR");
    return e && *e ? e : BT_GOLDEN_DIR;
}

/* The fixture's golden.safetensors (the reference's logits, prompts, engram map), or NULL with
 * the reason on stderr. */
static inline bt_safetensors_t *golden_open(const char *name)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s/golden.safetensors", golden_dir(), name);
    bt_safetensors_t *gold = NULL;
    if (bt_safetensors_open(path, &gold, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s: %s\n", path, err);
        return NULL;
    }
    return gold;
}

static inline float golden_max_abs(const float *a, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
    return m;
}

/* max |a - b|; a NaN anywhere comes back as NaN, which fails every bound */
static inline float golden_max_diff(const float *a, const float *b, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* the index of the largest value (the lower index on ties) */
static inline int golden_argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Copies a tensor out as float32/int64 (malloc'd), with its element count; NULL if absent. */
static inline float *golden_f32(const bt_safetensors_t *st, const char *name, size_t *n_p)
{
    const bt_tensor_view_t *t = bt_safetensors_find(st, name);
    if (!t || t->dtype != BT_DTYPE_F32) return NULL;
    float *v = malloc(t->nbytes ? t->nbytes : 4);
    memcpy(v, t->data, t->nbytes);
    if (n_p) *n_p = t->nbytes / 4;
    return v;
}

static inline int64_t *golden_i64(const bt_safetensors_t *st, const char *name, size_t *n_p)
{
    const bt_tensor_view_t *t = bt_safetensors_find(st, name);
    if (!t || t->dtype != BT_DTYPE_I64) return NULL;
    int64_t *v = malloc(t->nbytes ? t->nbytes : 8);
    memcpy(v, t->data, t->nbytes);
    if (n_p) *n_p = t->nbytes / 8;
    return v;
}

static inline uint8_t *golden_u8(const bt_safetensors_t *st, const char *name, size_t *n_p)
{
    const bt_tensor_view_t *t = bt_safetensors_find(st, name);
    if (!t) return NULL;
    uint8_t *v = malloc(t->nbytes ? t->nbytes : 1);
    memcpy(v, t->data, t->nbytes);
    if (n_p) *n_p = t->nbytes;
    return v;
}

/* Loads fixture `name` (a directory under golden_dir()) with `base`'s options and the token
 * map the reference stored in golden.safetensors. */
static inline bt_model_t *golden_model_with(const char *name, const bt_safetensors_t *gold,
                                            const bt_model_options_t *base)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/%s", golden_dir(), name);
    size_t n = 0;
    int64_t *map64 = golden_i64(gold, "engram.token_map", &n);
    int32_t *map = calloc(n ? n : 1, sizeof *map);
    int classes = 0;
    for (size_t i = 0; i < n; i++) {
        map[i] = (int32_t)map64[i];
        if (map[i] + 1 > classes) classes = map[i] + 1;
    }
    bt_model_options_t opt = *base;
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    bt_model_t *m = NULL;
    if (bt_model_load(dir, &opt, &m, err, sizeof err) != BT_OK) {
        fprintf(stderr, "load %s (%s): %s\n", name, opt.device == BT_DEVICE_CUDA ? "cuda" : "cpu", err);
        m = NULL;
    }
    free(map64);
    free(map);
    return m;
}

/* The same on the CPU with n_threads threads and max_ctx positions (and batch tokens). */
static inline bt_model_t *golden_model(const char *name, const bt_safetensors_t *gold,
                                       int n_threads, int64_t max_ctx)
{
    bt_model_options_t opt = bt_model_options_default();
    opt.n_threads = n_threads;
    opt.max_ctx = max_ctx;
    opt.max_batch_tokens = (int)max_ctx;
    return golden_model_with(name, gold, &opt);
}

/* A prompt ids[0..S) prefilled whole into a fresh KV slot (the logits of every position into
 * logits[0..S)), then gen greedy steps (each step's logits into logits[S + g], its pick into
 * picks[g]); false, with the reason in err, when a forward fails */
static inline bool golden_prompt_then_greedy(bt_model_t *m, int64_t max_ctx, const int32_t *ids,
                                             int S, int gen, float *logits, int32_t *picks,
                                             char *err, size_t errlen)
{
    const bt_model_config_t *c = bt_model_config(m);
    bt_kv_layout_t lay;
    if (bt_kv_layout_init(&lay, c, max_ctx) != BT_OK) {
        snprintf(err, errlen, "no KV layout for %lld positions", (long long)max_ctx);
        return false;
    }
    uint8_t *state = bt_aligned_alloc(64, lay.slot_bytes);
    bt_kv_state_reset(state);
    bt_forward_seq_t seq = {state, ids, S, true, NULL};
    bool ok = bt_model_forward(m, &lay, &seq, 1, logits, err, errlen) == BT_OK;
    const float *row = logits + (size_t)(S - 1) * c->vocab;
    for (int g = 0; g < gen && ok; g++) {
        int32_t t = golden_argmax(row, c->vocab);
        picks[g] = t;
        bt_forward_seq_t one = {state, &t, 1, false, NULL};
        float *next = logits + (size_t)(S + g) * c->vocab;
        ok = bt_model_forward(m, &lay, &one, 1, next, err, errlen) == BT_OK;
        row = next;
    }
    bt_aligned_free(state);
    return ok;
}

#endif

/* The prefix cache (services/engine/prefix_cache.h) as a prefill group uses it: a prompt of
 * P + T tokens whose first P are cached, against the same prompt prefilled cold (the peer,
 * same run). Per P: the cold prefill; the warm one, split into the restore (the chain's deltas
 * written into a slot) and the T-token tail's forward; the restore against its floor, its
 * bytes over the memcpy bandwidth measured in the same run; and what keeping the chunks cost
 * the prefill that made them (its chunks' deltas copied into the cache). Medians of --reps.
 *
 *   build/bin/bench_prefix_cache [--model DIR] [--device cpu|cuda] [--dtype auto|float32|bfloat16]
 *                                [--prompts 512,2048,8192] [--tail 16] [--chunk 4096]
 *                                [--reps 5] [--threads N]
 *
 * Without --model: the built-in demo model. A table on stdout, one JSON line per P on stderr. */
#include "common/alloc.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/kv_state.h"
#include "services/engine/model.h"
#include "services/engine/prefix_cache.h"

#include "bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PROMPTS = 8, MAX_REPS = 64 };

static void usage(void)
{
    fprintf(stderr, "usage: bench_prefix_cache [--model DIR] [--device cpu|cuda] [--dtype "
                    "auto|float32|bfloat16]\n"
                    "                          [--prompts 512,2048,8192] [--tail N] [--chunk N] "
                    "[--reps N] [--threads N]\n");
    exit(2);
}

static int positive(const char *flag, const char *v)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 1 || x > 1 << 22) {
        fprintf(stderr, "bench_prefix_cache: %s wants a positive integer, not '%s'\n", flag, v);
        exit(2);
    }
    return (int)x;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ids[from .. to) into the slot in chunks of `chunk`; with a cache, each chunk kept (the
 * chain's end held in *at). Seconds spent keeping them into *keep_s. */
static void prefill(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *slot, const int32_t *ids,
                    int from, int to, int chunk, bt_prefix_cache_t *cache, bt_prefix_node_t **at,
                    double *keep_s)
{
    char err[512];
    for (int s = from; s < to;) {
        const int e = to - s < chunk ? to : s + chunk;
        bt_kv_header_t before = *bt_kv_header(slot);
        bt_forward_seq_t seq = {slot, ids + s, e - s, false, NULL};
        if (bt_model_forward(m, lay, &seq, 1, NULL, err, sizeof err) != BT_OK) {
            fprintf(stderr, "bench_prefix_cache: forward: %s\n", err);
            exit(1);
        }
        if (cache) {
            const double t = now();
            bt_prefix_node_t *next = bt_prefix_cache_insert(cache, *at, ids, s, e, &before, slot);
            *keep_s += now() - t;
            if (!next) {
                fprintf(stderr, "bench_prefix_cache: the cache refused a chunk\n");
                exit(1);
            }
            *at = next;
        }
        s = e;
    }
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *device = "cpu", *dtype = "auto";
    int prompts[MAX_PROMPTS] = {512, 2048, 8192}, n_prompts = 3;
    int tail = 16, chunk = 4096, reps = 5, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        i++;
        if (!strcmp(a, "--model"))
            dir = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--dtype"))
            dtype = v;
        else if (!strcmp(a, "--tail"))
            tail = positive(a, v);
        else if (!strcmp(a, "--chunk"))
            chunk = positive(a, v);
        else if (!strcmp(a, "--reps"))
            reps = positive(a, v);
        else if (!strcmp(a, "--threads"))
            threads = positive(a, v);
        else if (!strcmp(a, "--prompts")) {
            n_prompts = 0;
            char *copy = bt_strdup_or_die(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (n_prompts == MAX_PROMPTS) usage();
                prompts[n_prompts++] = positive(a, t);
            }
            free(copy);
            if (!n_prompts) usage();
        } else
            usage();
    }
    if (reps > MAX_REPS) reps = MAX_REPS;
    int pmax = 0;
    for (int i = 0; i < n_prompts; i++)
        pmax = prompts[i] > pmax ? prompts[i] : pmax;

    char err[1024], demo[4096];
    if (!dir) {
        if (bt_demo_model_default(demo, sizeof demo, err, sizeof err) != BT_OK) {
            fprintf(stderr, "bench_prefix_cache: demo model: %s\n", err);
            return 1;
        }
        dir = demo;
    }
    bt_model_config_t cfg;
    if (bt_model_config_load(dir, &cfg, err, sizeof err) != BT_OK) {
        fprintf(stderr, "bench_prefix_cache: %s\n", err);
        return 1;
    }
    int32_t *map = NULL;
    int classes = 0, emit = cfg.vocab;
    if (bt_tokenizer_for_model(dir, cfg.vocab, cfg.n_engram > 0, &map, &classes, &emit, err,
                               sizeof err) != BT_OK) {
        fprintf(stderr, "bench_prefix_cache: %s\n", err);
        return 1;
    }
    bt_model_options_t opt = bt_model_options_default();
    opt.device = bt_device_parse(device);
    opt.cuda_weights = bt_weights_parse(dtype);
    if (opt.device < 0 || opt.cuda_weights < 0) {
        fprintf(stderr, "bench_prefix_cache: unknown --device '%s' or --dtype '%s'\n", device,
                dtype);
        return 2;
    }
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = threads;
    opt.max_ctx = pmax + tail;
    opt.max_batch_tokens = chunk;
    opt.max_batch_seqs = 1;
    bt_model_t *m = NULL;
    if (bt_model_load(dir, &opt, &m, err, sizeof err) != BT_OK) {
        fprintf(stderr, "bench_prefix_cache: %s\n", err);
        return 1;
    }
    free(map);
    bt_kv_layout_t lay;
    if (bt_kv_layout_init(&lay, bt_model_config(m), opt.max_ctx) != BT_OK) {
        fprintf(stderr, "bench_prefix_cache: no KV layout for %lld positions\n",
                (long long)opt.max_ctx);
        return 1;
    }
    uint8_t *slot = bt_aligned_alloc(64, lay.slot_bytes);
    int32_t *ids = bt_malloc_or_die((size_t)(pmax + tail) * sizeof *ids);
    for (int i = 0; i < pmax + tail; i++)
        ids[i] = (int32_t)((7 + 17LL * i + (long long)i * i) % emit);

    printf("%s on %s, chunks of %d, tail %d, median of %d\n\n", dir, device, chunk, tail, reps);
    printf(
        "| cached P | cold P+T ms | warm ms | = restore ms | + tail ms | cold/warm | restored MB "
        "| restore floor ms | GB/s (memcpy GB/s) | keeping P's chunks ms |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int pi = 0; pi < n_prompts; pi++) {
        const int P = prompts[pi];
        double cold[MAX_REPS], restore[MAX_REPS], tail_s[MAX_REPS], keep[MAX_REPS], copy[MAX_REPS];
        size_t bytes = 0;
        for (int r = 0; r < reps; r++) { /* the peer: no cache */
            bt_kv_state_reset(slot);
            const double t = now();
            prefill(m, &lay, slot, ids, 0, P + tail, chunk, NULL, NULL, NULL);
            cold[r] = now() - t;
        }
        for (int r = 0; r < reps; r++) {
            /* a fresh cache takes the prefix, as the first prompt's prefill keeps it */
            bt_prefix_cache_t *cache;
            if (bt_prefix_cache_create(bt_model_config(m), &lay, SIZE_MAX, &cache) != BT_OK)
                return 1;
            bt_prefix_node_t *at = NULL;
            keep[r] = 0;
            bt_kv_state_reset(slot);
            prefill(m, &lay, slot, ids, 0, P, chunk, cache, &at, &keep[r]);
            bt_prefix_cache_unpin(cache, at);
            /* the prompt again: its first P restored, the tail computed */
            int end = 0;
            memset(slot, 0, lay.slot_bytes); /* (another sequence's bytes) */
            double t = now();
            at = bt_prefix_cache_match(cache, ids, P + tail, P + tail - 1, &end);
            if (!at || end != P) {
                fprintf(stderr, "bench_prefix_cache: matched %d of %d tokens\n", end, P);
                return 1;
            }
            bytes = bt_prefix_cache_restore(cache, at, slot);
            restore[r] = now() - t;
            t = now();
            prefill(m, &lay, slot, ids, P, P + tail, chunk, NULL, NULL, NULL);
            tail_s[r] = now() - t;
            bt_prefix_cache_unpin(cache, at);
            bt_prefix_cache_destroy(cache);
        }
        /* the floor's bandwidth: one memcpy of as many bytes, between buffers as large as a
         * slot (the restore's destination) */
        uint8_t *src = bt_malloc_or_die(bytes), *dst = bt_malloc_or_die(bytes);
        memset(src, 1, bytes);
        memset(dst, 2, bytes);
        for (int r = 0; r < reps; r++) {
            const double t = now();
            memcpy(dst, src, bytes);
            copy[r] = now() - t;
        }
        volatile uint8_t sink = dst[bytes - 1]; /* (the copies are used) */
        (void)sink;
        const double cold_ms = 1e3 * median(cold, reps), restore_ms = 1e3 * median(restore, reps),
                     tail_ms = 1e3 * median(tail_s, reps), keep_ms = 1e3 * median(keep, reps),
                     copy_ms = 1e3 * median(copy, reps);
        const double warm_ms = restore_ms + tail_ms, mb = (double)bytes / 1e6;
        printf("| %d | %.2f | %.2f | %.3f | %.2f | %.1fx | %.2f | %.3f | %.1f (%.1f) | %.3f |\n", P,
               cold_ms, warm_ms, restore_ms, tail_ms, cold_ms / warm_ms, mb, copy_ms,
               mb / restore_ms, mb / copy_ms, keep_ms);
        fprintf(stderr,
                "{\"cached\":%d,\"tail\":%d,\"chunk\":%d,\"cold_ms\":%.3f,\"restore_ms\":%.4f,"
                "\"tail_ms\":%.3f,\"restored_bytes\":%zu,\"memcpy_ms\":%.4f,\"keep_ms\":%.4f}\n",
                P, tail, chunk, cold_ms, restore_ms, tail_ms, bytes, copy_ms, keep_ms);
        free(src);
        free(dst);
    }
    bt_aligned_free(slot);
    free(ids);
    bt_model_destroy(m);
    return 0;
}

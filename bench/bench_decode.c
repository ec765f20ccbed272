/* The model's decode step end to end, as a decode worker runs it: bt_model_forward_sample over
 * a batch of B sequences of one token each, each sequence first prefilled with a P-token
 * prompt. Every step is timed on the host (the plans, the launches or the CUDA graph's replay,
 * the draws, the slots' KV copied home), W warm-up steps first (graphs instantiate there), then
 * S timed ones: median and 90th percentile a step, tokens a second. Where the layer bench
 * (bench_layer_cuda) times one layer's kernels, this times what the engine adds around them;
 * on the tiny built-in model a step is nearly all of that. --draw logits is the way the
 * workers drew before: every row of logits to the host, then the host sampler.
 *
 *   build/bin/bench_decode [--model DIR] [--device cuda|cpu] [--dtype auto|float32|bfloat16]
 *                          [--batches 1,2,4,8,16] [--prompt 64] [--steps 64] [--warmup 8]
 *                          [--graphs-off] [--threads N] [--draw forward|logits]
 *                          [--temperature T] [--top-p P] [--top-logprobs N]
 *
 * Without --model: the built-in demo model. Prints a table on stdout and one JSON line per
 * batch size on stderr (for bench/results). */
#include "common/alloc.h"
#include "common/text/tokenizer.h"
#include "services/engine/demo_model.h"
#include "services/engine/kv_state.h"
#include "services/engine/model.h"
#include "services/engine/sampler.h"

#include "bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_BATCHES = 16, MAX_BATCH = 64 };

static void usage(void)
{
    fprintf(stderr, "usage: bench_decode [--model DIR] [--device cuda|cpu] [--dtype auto|float32|bfloat16]\n"
                    "                    [--batches 1,2,4,8,16] [--prompt N] [--steps N] [--warmup N]\n"
                    "                    [--graphs-off] [--threads N] [--draw forward|logits]\n"
                    "                    [--temperature T] [--top-p P] [--top-logprobs N]\n");
    exit(2);
}

/* a positive integer flag value, or the usage */
static int positive(const char *flag, const char *v)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 1 || x > 1 << 20) {
        fprintf(stderr, "bench_decode: %s wants a positive integer, not '%s'\n", flag, v);
        exit(2);
    }
    return (int)x;
}

/* a number flag value, or the usage (atof took "x" for 0) */
static double number(const char *flag, const char *v)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) {
        fprintf(stderr, "bench_decode: %s wants a number, not '%s'\n", flag, v);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *device = "cuda", *dtype = "auto";
    int batches[MAX_BATCHES] = {1, 2, 4, 8, 16}, n_batches = 5;
    int prompt = 64, steps = 64, warmup = 8, threads = 0;
    bool graphs_off = false, draw_logits = false;
    double temperature = 0.0, top_p = 1.0;
    int top_logprobs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--graphs-off")) {
            graphs_off = true;
            continue;
        }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--prompt")) prompt = positive(a, v);
        else if (!strcmp(a, "--steps")) steps = positive(a, v);
        else if (!strcmp(a, "--warmup")) warmup = positive(a, v);
        else if (!strcmp(a, "--threads")) threads = positive(a, v);
        else if (!strcmp(a, "--draw") && (!strcmp(v, "forward") || !strcmp(v, "logits"))) draw_logits = !strcmp(v, "logits");
        else if (!strcmp(a, "--temperature")) temperature = number(a, v);
        else if (!strcmp(a, "--top-p")) top_p = number(a, v);
        else if (!strcmp(a, "--top-logprobs")) {
            const double x = number(a, v);
            if (!(x >= 0 && x <= BT_SAMPLE_TOP_MAX) || x != (double)(int)x) usage();
            top_logprobs = (int)x;
        }
        else if (!strcmp(a, "--batches")) {
            n_batches = 0;
            char *copy = bt_strdup_or_die(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (n_batches == MAX_BATCHES) {
                    fprintf(stderr, "bench_decode: at most %d batch sizes\n", MAX_BATCHES);
                    return 2;
                }
                batches[n_batches] = positive(a, t);
                if (batches[n_batches] > MAX_BATCH) {
                    fprintf(stderr, "bench_decode: a batch of at most %d sequences\n", MAX_BATCH);
                    return 2;
                }
                n_batches++;
            }
            free(copy);
            if (n_batches == 0) usage();
        } else
            usage();
    }

    char err[1024], demo[4096];
    if (!dir) {
        if (bt_demo_model_default(demo, sizeof demo, err, sizeof err) != BT_OK) {
            fprintf(stderr, "bench_decode: demo model: %s\n", err);
            return 1;
        }
        dir = demo;
    }
    bt_model_config_t cfg;
    if (bt_model_config_load(dir, &cfg, err, sizeof err) != BT_OK) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    int32_t *map = NULL;
    int classes = 0, emit = cfg.vocab;
    if (bt_tokenizer_for_model(dir, cfg.vocab, cfg.n_engram > 0, &map, &classes, &emit, err,
                               sizeof err) != BT_OK) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    int bmax = 1;
    for (int i = 0; i < n_batches; i++) bmax = batches[i] > bmax ? batches[i] : bmax;

    bt_model_options_t opt = bt_model_options_default();
    opt.device = bt_device_parse(device);
    opt.cuda_weights = bt_weights_parse(dtype);
    if (opt.device < 0 || opt.cuda_weights < 0) {
        fprintf(stderr, "bench_decode: unknown --device '%s' or --dtype '%s'\n", device, dtype);
        return 2;
    }
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = threads;
    opt.max_ctx = prompt + warmup + steps + 1;
    opt.max_batch_tokens = prompt > bmax ? prompt : bmax;
    opt.max_batch_seqs = bmax;
    opt.cuda_graphs_off = graphs_off;
    bt_model_t *m = NULL;
    double t0 = now();
    if (bt_model_load(dir, &opt, &m, err, sizeof err) != BT_OK) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    free(map);
    fprintf(stderr, "bench_decode: %s on %s (%s weights), loaded in %.1f s\n", dir, device, dtype,
            now() - t0);
    const bt_model_config_t *c = bt_model_config(m);
    int V = c->vocab;
    bt_kv_layout_t lay;
    if (bt_kv_layout_init(&lay, c, opt.max_ctx) != BT_OK) {
        fprintf(stderr, "bench_decode: no KV layout for %lld positions\n", (long long)opt.max_ctx);
        return 1;
    }
    if (temperature < 0 || !(top_p > 0 && top_p <= 1) || top_logprobs < 0 || top_logprobs > BT_SAMPLE_TOP_MAX) {
        fprintf(stderr, "bench_decode: --temperature >= 0, 0 < --top-p <= 1, 0 <= --top-logprobs <= %d\n",
                BT_SAMPLE_TOP_MAX);
        return 2;
    }
    bt_sample_req_t req[MAX_BATCH];
    bt_sample_out_t drawn[MAX_BATCH];
    bt_sampler_t *sampler = bt_sampler_create(emit);
    uint8_t *slot[MAX_BATCH];
    for (int b = 0; b < bmax; b++) slot[b] = bt_aligned_alloc(64, lay.slot_bytes);
    float *logits = bt_malloc_or_die((size_t)bmax * V * sizeof(float));
    int32_t *ids = bt_malloc_or_die((size_t)prompt * sizeof(int32_t)), tok[MAX_BATCH];
    double *ms = bt_malloc_or_die((size_t)steps * sizeof(double));

    printf("| batch | prompt | steps | median ms a step | p90 ms | tokens/s | ms a step a layer |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        /* prompts: different ids per sequence (the routing and the indexer's picks differ) */
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < prompt; i++)
                ids[i] = (int32_t)((7 + 131LL * b + 17LL * i + (long long)i * i) % emit);
            bt_kv_state_reset(slot[b]);
            bt_forward_seq_t seq = {slot[b], ids, prompt, false, NULL};
            req[b] = (bt_sample_req_t){.sampling = {(float)temperature, (float)top_p, 0.0f, 0, (uint64_t)b},
                                       .want_logprob = top_logprobs > 0, .n_top = top_logprobs};
            if (bt_model_forward_sample(m, &lay, &seq, 1, emit, &req[b], &drawn[b], err, sizeof err) != BT_OK) {
                fprintf(stderr, "bench_decode: prefill: %s\n", err);
                return 1;
            }
            tok[b] = drawn[b].id;
        }
        for (int s = 0; s < warmup + steps; s++) {
            bt_forward_seq_t seq[MAX_BATCH];
            for (int b = 0; b < B; b++) {
                seq[b] = (bt_forward_seq_t){slot[b], &tok[b], 1, false, NULL};
                req[b].step = (uint64_t)s + 1;
            }
            double a = now();
            bt_status_t st;
            if (draw_logits) {
                st = bt_model_forward(m, &lay, seq, B, logits, err, sizeof err);
                for (int b = 0; b < B && st == BT_OK; b++)
                    drawn[b].id = bt_sampler_sample(sampler, &req[b].sampling, logits + (size_t)b * V, req[b].step,
                                                    &drawn[b].logprob, drawn[b].top, top_logprobs);
            } else {
                st = bt_model_forward_sample(m, &lay, seq, B, emit, req, drawn, err, sizeof err);
            }
            if (st != BT_OK) {
                fprintf(stderr, "bench_decode: decode step: %s\n", err);
                return 1;
            }
            double e = now() - a;
            if (s >= warmup) ms[s - warmup] = 1e3 * e;
            for (int b = 0; b < B; b++) tok[b] = drawn[b].id;
        }
        qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
        double med = ms[steps / 2], p90 = ms[(9 * steps + 9) / 10 - 1]; /* (nearest rank) */
        printf("| %d | %d | %d | %.3f | %.3f | %.0f | %.4f |\n", B, prompt, steps, med, p90, 1e3 * B / med,
               med / c->n_layers);
        fprintf(stderr, "{\"bench\":\"decode\",\"device\":\"%s\",\"dtype\":\"%s\",\"graphs\":%s,\"layers\":%d,"
                        "\"draw\":\"%s\",\"temperature\":%g,\"top_p\":%g,\"top_logprobs\":%d,\"batch\":%d,\"prompt\":%d,\"steps\":%d,\"median_ms\":%.4f,\"p90_ms\":%.4f,"
                        "\"tokens_per_s\":%.1f}\n",
                device, dtype, graphs_off || opt.device != BT_DEVICE_CUDA ? "false" : "true", c->n_layers,
                draw_logits ? "logits" : "forward", temperature, top_p, top_logprobs, B,
                prompt, steps, med, p90, 1e3 * B / med);
    }
    for (int b = 0; b < bmax; b++) bt_aligned_free(slot[b]);
    free(logits);
    bt_sampler_destroy(sampler);
    free(ids);
    free(ms);
    bt_model_destroy(m);
    return 0;
}

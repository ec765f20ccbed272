/* baton bench internals: what one run (one concurrency level, one input length) measured,
 * and the report side (statistics, JSON, gnuplot). cmd_bench.c drives the requests;
 * bench_report.c turns the samples into figures.
 *
 *   bench_run_t run = {...};             // filled by the driver, one per level
 *   bench_run_add_itl(&run, ms);         // one sample per token after the first
 *   cJSON *j = bench_run_json(&run, &model);
 *   bench_plot(stem, runs, n_runs, msg, sizeof msg);   // PNGs through gnuplot
 */
#ifndef BT_CLI_BENCH_H
#define BT_CLI_BENCH_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One request's outcome. Latencies in milliseconds. */
typedef struct {
    bool ok;
    char error[48];        /* kind when !ok: refused, timeout, http_503, grpc_UNAVAILABLE, ... */
    int input_tokens;      /* sent, or as the server counted them (usage) */
    int output_tokens;     /* from token ids */
    int cached_tokens;     /* of the prompt, found in a prefix cache (usage; 0 when not said) */
    double ttft, e2e, tpot; /* tpot < 0 when fewer than 2 tokens */
    double t_send;          /* ms after the run started */
} bench_result_t;

/* The simulated workers' timing model (services/common/sim.h), for the overhead figures. */
typedef struct {
    bool on;
    double prefill_tokens_per_s, step_ms_base, step_ms_per_seq, step_ms_per_kctx;
    int prefill_groups, decode_groups, max_running;
} bench_model_t;

typedef struct {
    /* what was asked */
    int concurrency;       /* 0 = unlimited */
    double request_rate;   /* <= 0 = all at once (as fast as concurrency allows) */
    int input_len, output_len;
    int num_prompts;
    /* what happened */
    double duration_s;
    bench_result_t *results;
    int n_results;
    double *itl;           /* per-token inter-token latencies (ms) */
    size_t n_itl, cap_itl;
    double slo_ttft_ms, slo_tpot_ms; /* <= 0: not set */
} bench_run_t;

void bench_run_add_itl(bench_run_t *run, double ms);
void bench_run_free(bench_run_t *run);

/* Percentiles and mean of a sample (sorted in place). */
typedef struct {
    int n;
    double mean, p50, p90, p99, min, max;
} bench_stats_t;
bench_stats_t bench_stats(double *v, size_t n);

/* The run's figures as JSON (caller owns); also fills a one-line summary into line. */
cJSON *bench_run_json(bench_run_t *run, const bench_model_t *model);
/* A human-readable block for stdout. */
void bench_run_print(bench_run_t *run, const bench_model_t *model);

/* Writes stem-latency-cdf.png (TTFT, ITL, E2E CDFs per run) and, with several runs,
 * stem-sweep.png (throughput and latency across the sweep), through gnuplot. false with
 * a message when gnuplot is missing or fails. */
bool bench_plot(const char *stem, bench_run_t *runs, int n_runs, const char *sweep_key, char *msg,
                size_t msglen);

#endif

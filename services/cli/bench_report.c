/* baton bench: statistics, JSON and gnuplot plots of the runs (bench.h). */
#include "services/cli/bench.h"

#include "common/alloc.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void bench_run_add_itl(bench_run_t *run, double ms)
{
    if (run->n_itl == run->cap_itl) {
        run->cap_itl = run->cap_itl ? 2 * run->cap_itl : 1024;
        run->itl = bt_realloc_or_die(run->itl, run->cap_itl * sizeof *run->itl);
    }
    run->itl[run->n_itl++] = ms;
}

void bench_run_free(bench_run_t *run)
{
    free(run->results);
    free(run->itl);
    run->results = NULL;
    run->itl = NULL;
    run->n_results = 0;
    run->n_itl = run->cap_itl = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Linear interpolation between closest ranks (numpy's default), on a sorted sample. */
static double quantile(const double *v, size_t n, double q)
{
    if (n == 0) return 0.0;
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

bench_stats_t bench_stats(double *v, size_t n)
{
    bench_stats_t s = {0};
    s.n = (int)n;
    if (n == 0) return s;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s.mean = sum / (double)n;
    s.p50 = quantile(v, n, 0.50);
    s.p90 = quantile(v, n, 0.90);
    s.p99 = quantile(v, n, 0.99);
    s.min = v[0];
    s.max = v[n - 1];
    return s;
}

static cJSON *stats_json(bench_stats_t s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", s.n);
    cJSON_AddNumberToObject(o, "mean", s.mean);
    cJSON_AddNumberToObject(o, "p50", s.p50);
    cJSON_AddNumberToObject(o, "p90", s.p90);
    cJSON_AddNumberToObject(o, "p99", s.p99);
    cJSON_AddNumberToObject(o, "min", s.min);
    cJSON_AddNumberToObject(o, "max", s.max);
    return o;
}

/* The sample of one field over the successful requests (malloc'd). */
static double *field(const bench_run_t *run, int which, size_t *n_p)
{
    double *v = bt_malloc_or_die(((size_t)run->n_results + 1) * sizeof *v);
    size_t n = 0;
    for (int i = 0; i < run->n_results; i++) {
        const bench_result_t *r = &run->results[i];
        if (!r->ok) continue;
        double x = which == 0 ? r->ttft : which == 1 ? r->tpot : r->e2e;
        if (which == 1 && x < 0) continue;
        v[n++] = x;
    }
    *n_p = n;
    return v;
}

/* The modelled decode step at this run's load. The batch is the mean number of sequences a
 * decode group held (Little's law over the client's own decode phases: the sum of every
 * request's time from first to last token over the run's time and the groups), each
 * sequence half way through its output. */
static double modelled_step_ms(const bench_run_t *run, const bench_model_t *m, double *batch_p)
{
    int groups = m->decode_groups > 0 ? m->decode_groups : 1;
    double busy = 0;
    for (int i = 0; i < run->n_results; i++)
        if (run->results[i].ok) busy += run->results[i].e2e - run->results[i].ttft;
    double batch = run->duration_s > 0 ? busy / (run->duration_s * 1000.0) / groups : 1.0;
    if (m->max_running > 0 && batch > m->max_running) batch = m->max_running;
    if (batch < 1) batch = 1;
    *batch_p = batch;
    double ctx = batch * ((double)run->input_len + (double)run->output_len / 2.0);
    return m->step_ms_base + batch * m->step_ms_per_seq + ctx / 1000.0 * m->step_ms_per_kctx;
}

static int cmp_send(const void *a, const void *b)
{
    double x = (*(bench_result_t *const *)a)->t_send, y = (*(bench_result_t *const *)b)->t_send;
    return x < y ? -1 : x > y;
}

/* The TTFT beyond the model, per successful request: the measured TTFT less the modelled
 * prefill, queueing included: the prefill groups as FIFO servers taking the requests in
 * the order they were sent (the router gives a job to the group with the least queued
 * prefill), each job input/tokens_per_s long. Waiting for a decode slot in the router's
 * admission queue is not modelled (runs with more requests than slots say so). */
static size_t ttft_overhead(const bench_run_t *run, const bench_model_t *m, double *out)
{
    bench_result_t **order = bt_malloc_or_die(((size_t)run->n_results + 1) * sizeof *order);
    size_t n = 0;
    for (int i = 0; i < run->n_results; i++)
        if (run->results[i].ok) order[n++] = &run->results[i];
    qsort(order, n, sizeof *order, cmp_send);
    int groups = m->prefill_groups > 0 ? m->prefill_groups : 1;
    double free_at[64] = {0};
    if (groups > 64) groups = 64;
    for (size_t i = 0; i < n; i++) {
        int g = 0;
        for (int k = 1; k < groups; k++)
            if (free_at[k] < free_at[g]) g = k;
        double start = free_at[g] > order[i]->t_send ? free_at[g] : order[i]->t_send;
        free_at[g] = start + 1000.0 * order[i]->input_tokens / m->prefill_tokens_per_s;
        out[i] = order[i]->ttft - (free_at[g] - order[i]->t_send);
    }
    free(order);
    return n;
}

cJSON *bench_run_json(bench_run_t *run, const bench_model_t *model)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "concurrency", run->concurrency);
    if (run->request_rate > 0)
        cJSON_AddNumberToObject(o, "request_rate", run->request_rate);
    else
        cJSON_AddStringToObject(o, "request_rate", "inf");
    cJSON_AddNumberToObject(o, "random_input_len", run->input_len);
    cJSON_AddNumberToObject(o, "random_output_len", run->output_len);
    cJSON_AddNumberToObject(o, "num_prompts", run->num_prompts);
    int completed = 0;
    int64_t in_tok = 0, out_tok = 0, cached_tok = 0;
    cJSON *errors = cJSON_CreateObject();
    for (int i = 0; i < run->n_results; i++) {
        bench_result_t *r = &run->results[i];
        if (r->ok) {
            completed++;
            in_tok += r->input_tokens;
            out_tok += r->output_tokens;
            cached_tok += r->cached_tokens;
            continue;
        }
        cJSON *e = cJSON_GetObjectItemCaseSensitive(errors, r->error);
        if (e)
            cJSON_SetNumberValue(e, e->valuedouble + 1);
        else
            cJSON_AddNumberToObject(errors, r->error, 1);
    }
    double d = run->duration_s > 0 ? run->duration_s : 1e-9;
    cJSON_AddNumberToObject(o, "issued", run->n_results);
    cJSON_AddNumberToObject(o, "completed", completed);
    cJSON_AddNumberToObject(o, "failed", run->n_results - completed);
    cJSON_AddItemToObject(o, "errors", errors);
    cJSON_AddNumberToObject(o, "duration_s", run->duration_s);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)in_tok);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)out_tok);
    cJSON_AddNumberToObject(o, "total_cached_tokens", (double)cached_tok);
    cJSON_AddNumberToObject(o, "request_throughput", completed / d);
    cJSON_AddNumberToObject(o, "input_throughput", (double)in_tok / d);
    cJSON_AddNumberToObject(o, "output_throughput", (double)out_tok / d);
    size_t n;
    double *v = field(run, 0, &n);
    bench_stats_t ttft = bench_stats(v, n);
    cJSON_AddItemToObject(o, "ttft_ms", stats_json(ttft));
    double *ov = bt_malloc_or_die((n + 1) * sizeof *ov);
    size_t n_ov = model->on ? ttft_overhead(run, model, ov) : 0;
    free(v);
    cJSON_AddItemToObject(o, "itl_ms", stats_json(bench_stats(run->itl, run->n_itl)));
    bench_stats_t itl = bench_stats(run->itl, run->n_itl);
    v = field(run, 1, &n);
    cJSON_AddItemToObject(o, "tpot_ms", stats_json(bench_stats(v, n)));
    free(v);
    v = field(run, 2, &n);
    cJSON_AddItemToObject(o, "e2e_ms", stats_json(bench_stats(v, n)));
    free(v);
    int good = 0;
    for (int i = 0; i < run->n_results; i++) {
        bench_result_t *r = &run->results[i];
        if (!r->ok) continue;
        if (run->slo_ttft_ms > 0 && r->ttft > run->slo_ttft_ms) continue;
        if (run->slo_tpot_ms > 0 && r->tpot >= 0 && r->tpot > run->slo_tpot_ms) continue;
        good++;
    }
    cJSON *g = cJSON_AddObjectToObject(o, "goodput");
    if (run->slo_ttft_ms > 0) cJSON_AddNumberToObject(g, "slo_ttft_ms", run->slo_ttft_ms);
    if (run->slo_tpot_ms > 0) cJSON_AddNumberToObject(g, "slo_tpot_ms", run->slo_tpot_ms);
    cJSON_AddNumberToObject(g, "requests", good);
    cJSON_AddNumberToObject(g, "request_rate", good / d);
    if (model->on) {
        double batch;
        double step = modelled_step_ms(run, model, &batch);
        cJSON *m = cJSON_AddObjectToObject(o, "overhead");
        cJSON_AddNumberToObject(m, "modelled_prefill_ms", 1000.0 * run->input_len / model->prefill_tokens_per_s);
        cJSON_AddNumberToObject(m, "modelled_step_ms", step);
        cJSON_AddNumberToObject(m, "modelled_batch", batch);
        int slots = (model->decode_groups > 0 ? model->decode_groups : 1) * (model->max_running > 0 ? model->max_running : 16);
        int c = run->concurrency > 0 ? run->concurrency : run->num_prompts;
        cJSON_AddBoolToObject(m, "admission_queued", c > slots); /* TTFT then holds waits for a decode slot */
        bench_stats_t os = bench_stats(ov, n_ov);
        cJSON *t = cJSON_AddObjectToObject(m, "ttft_ms");
        cJSON_AddNumberToObject(t, "p50", os.p50);
        cJSON_AddNumberToObject(t, "p99", os.p99);
        cJSON *i = cJSON_AddObjectToObject(m, "itl_ms");
        cJSON_AddNumberToObject(i, "p50", itl.p50 - step);
        cJSON_AddNumberToObject(i, "p99", itl.p99 - step);
    }
    free(ov);
    (void)ttft;
    return o;
}

static double num(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

void bench_run_print(bench_run_t *run, const bench_model_t *model)
{
    cJSON *o = bench_run_json(run, model);
    printf("============ baton bench: concurrency %d, rate %s, input %d, output %d ============\n",
           run->concurrency, run->request_rate > 0 ? "poisson" : "inf", run->input_len, run->output_len);
    if (run->request_rate > 0) printf("%-34s %10.2f\n", "Request rate (req/s):", run->request_rate);
    printf("%-34s %10.0f\n", "Successful requests:", num(o, "completed", NULL));
    printf("%-34s %10.0f\n", "Failed requests:", num(o, "failed", NULL));
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "errors")) printf("  %-32s %10.0f\n", e->string, e->valuedouble);
    printf("%-34s %10.2f\n", "Benchmark duration (s):", num(o, "duration_s", NULL));
    printf("%-34s %10.0f\n", "Total input tokens:", num(o, "total_input_tokens", NULL));
    printf("%-34s %10.0f\n", "Total output tokens:", num(o, "total_output_tokens", NULL));
    if (num(o, "total_cached_tokens", NULL) > 0) /* (the server said so: a prefix cache) */
        printf("%-34s %10.0f (%.1f%%)\n",
               "Cached input tokens:", num(o, "total_cached_tokens", NULL),
               100.0 * num(o, "total_cached_tokens", NULL) /
                   fmax(num(o, "total_input_tokens", NULL), 1));
    printf("%-34s %10.2f\n", "Request throughput (req/s):", num(o, "request_throughput", NULL));
    printf("%-34s %10.2f\n", "Input token throughput (tok/s):", num(o, "input_throughput", NULL));
    printf("%-34s %10.2f\n", "Output token throughput (tok/s):", num(o, "output_throughput", NULL));
    if (run->slo_ttft_ms > 0 || run->slo_tpot_ms > 0)
        printf("%-34s %10.2f\n", "Goodput (req/s):", num(o, "goodput", "request_rate"));
    static const char *names[][2] = {{"ttft_ms", "TTFT"}, {"itl_ms", "ITL"}, {"tpot_ms", "TPOT"}, {"e2e_ms", "E2E latency"}};
    printf("%-20s %9s %9s %9s %9s\n", "(ms)", "mean", "p50", "p90", "p99");
    for (int i = 0; i < 4; i++)
        printf("%-20s %9.2f %9.2f %9.2f %9.2f\n", names[i][1], num(o, names[i][0], "mean"), num(o, names[i][0], "p50"),
               num(o, names[i][0], "p90"), num(o, names[i][0], "p99"));
    if (model->on) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "overhead");
        printf("overhead beyond the simulated model (ms): TTFT p50 %.2f p99 %.2f; ITL p50 %.2f p99 %.2f "
               "(modelled prefill %.2f, step %.2f at batch %.1f)\n",
               num(m, "ttft_ms", "p50"), num(m, "ttft_ms", "p99"), num(m, "itl_ms", "p50"), num(m, "itl_ms", "p99"),
               num(m, "modelled_prefill_ms", NULL), num(m, "modelled_step_ms", NULL), num(m, "modelled_batch", NULL));
    }
    fflush(stdout);
    cJSON_Delete(o);
}

/* ---- gnuplot ------------------------------------------------------------------------------ */

static bool have_gnuplot(void)
{
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char p[4200];
        snprintf(p, sizeof p, "%s/gnuplot", d);
        if (access(p, X_OK) == 0) return true;
    }
    return false;
}

/* One CDF block per run: "value cdf" lines, blocks separated by two blank lines. */
static void write_cdf(FILE *f, double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t step = n > 2000 ? n / 2000 : 1; /* at most ~2000 points a curve */
    for (size_t i = 0; i < n; i += step) fprintf(f, "%.4f %.5f\n", v[i] > 0.001 ? v[i] : 0.001, (double)(i + 1) / (double)n);
    if (n) fprintf(f, "%.4f 1\n", v[n - 1] > 0.001 ? v[n - 1] : 0.001);
    fprintf(f, "\n\n");
}

bool bench_plot(const char *stem, bench_run_t *runs, int n_runs, const char *sweep_key, char *msg, size_t msglen)
{
    if (!have_gnuplot()) {
        snprintf(msg, msglen, "gnuplot not found: no plots (apt-get install gnuplot-nox); the JSON is written");
        return false;
    }
    char path[4200], gp[4200];
    const char *metric[3] = {"ttft", "itl", "e2e"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s-%s.dat", stem, metric[k]);
        FILE *f = fopen(path, "w");
        if (!f) {
            snprintf(msg, msglen, "cannot write %s: %s", path, strerror(errno));
            return false;
        }
        for (int r = 0; r < n_runs; r++) {
            size_t n;
            double *v = k == 1 ? NULL : field(&runs[r], k == 0 ? 0 : 2, &n);
            if (k == 1) {
                v = bt_malloc_or_die((runs[r].n_itl + 1) * sizeof *v);
                memcpy(v, runs[r].itl, runs[r].n_itl * sizeof *v);
                n = runs[r].n_itl;
            }
            write_cdf(f, v, n);
            free(v);
        }
        fclose(f);
    }
    snprintf(gp, sizeof gp, "%s.gp", stem);
    FILE *f = fopen(gp, "w");
    if (!f) {
        snprintf(msg, msglen, "cannot write %s: %s", gp, strerror(errno));
        return false;
    }
    fprintf(f, "set terminal pngcairo size 1500,480 font ',10'\nset output '%s-latency-cdf.png'\n", stem);
    fprintf(f, "set multiplot layout 1,3 title 'baton bench: latency CDFs'\nset grid\nset logscale x\n"
               "set ylabel 'fraction of samples'\nset yrange [0:1]\nset key bottom right\n");
    const char *title[3] = {"time to first token", "inter-token latency", "end-to-end latency"};
    for (int k = 0; k < 3; k++) {
        fprintf(f, "set title '%s'\nset xlabel 'ms'\nplot ", title[k]);
        for (int r = 0; r < n_runs; r++) {
            char label[64];
            if (!strcmp(sweep_key, "input_len"))
                snprintf(label, sizeof label, "in=%d", runs[r].input_len);
            else
                snprintf(label, sizeof label, "c=%d", runs[r].concurrency);
            fprintf(f, "%s'%s-%s.dat' index %d using 1:2 with lines lw 2 title '%s'", r ? ", " : "", stem, metric[k], r, label);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    if (n_runs > 1) {
        snprintf(path, sizeof path, "%s-sweep.dat", stem);
        FILE *d = fopen(path, "w");
        if (!d) {
            fclose(f);
            snprintf(msg, msglen, "cannot write %s: %s", path, strerror(errno));
            return false;
        }
        bench_model_t none = {0};
        fprintf(d, "# x output_tok_s request_s ttft_p50 ttft_p99 itl_p50 itl_p99 e2e_p50 e2e_p99 input_tok_s\n");
        for (int r = 0; r < n_runs; r++) {
            cJSON *o = bench_run_json(&runs[r], &none);
            fprintf(d, "%d %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.3f\n",
                    !strcmp(sweep_key, "input_len") ? runs[r].input_len : runs[r].concurrency,
                    num(o, "output_throughput", NULL), num(o, "request_throughput", NULL), num(o, "ttft_ms", "p50"),
                    num(o, "ttft_ms", "p99"), num(o, "itl_ms", "p50"), num(o, "itl_ms", "p99"), num(o, "e2e_ms", "p50"),
                    num(o, "e2e_ms", "p99"), num(o, "input_throughput", NULL));
            cJSON_Delete(o);
        }
        fclose(d);
        const char *xl = !strcmp(sweep_key, "input_len") ? "prompt tokens" : "concurrency";
        fprintf(f, "set terminal pngcairo size 1500,480 font ',10'\nset output '%s-sweep.png'\n", stem);
        fprintf(f, "set multiplot layout 1,3 title 'baton bench: sweep over %s'\nset grid\nset logscale x 2\n"
                   "unset logscale y\nset autoscale\nset key top left\nset xlabel '%s'\n", xl, xl);
        fprintf(f, "set title 'throughput'\nset ylabel 'tokens/s'\nplot '%s' using 1:2 with linespoints lw 2 title 'output tok/s', "
                   "'%s' using 1:10 with linespoints lw 2 title 'input tok/s'\n", path, path);
        fprintf(f, "set title 'time to first token'\nset ylabel 'ms'\nset logscale y\nplot '%s' using 1:4 with linespoints lw 2 "
                   "title 'p50', '%s' using 1:5 with linespoints lw 2 title 'p99'\n", path, path);
        fprintf(f, "set title 'inter-token latency'\nset ylabel 'ms'\nplot '%s' using 1:6 with linespoints lw 2 title 'p50', "
                   "'%s' using 1:7 with linespoints lw 2 title 'p99'\n", path, path);
        fprintf(f, "unset multiplot\n");
    }
    fclose(f);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(msg, msglen, "cannot run gnuplot: %s", strerror(errno));
        return false;
    }
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", gp, (char *)NULL);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(msg, msglen, "gnuplot failed on %s", gp);
        return false;
    }
    snprintf(msg, msglen, "plots: %s-latency-cdf.png%s%s%s", stem, n_runs > 1 ? ", " : "", n_runs > 1 ? stem : "",
             n_runs > 1 ? "-sweep.png" : "");
    return true;
}

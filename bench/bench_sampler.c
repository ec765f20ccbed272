/* The token sampler on one CPU thread, a row of logits at a real vocabulary's size: what a
 * worker spends a token a sequence after the logits come back.
 *
 *   build/bin/bench_sampler [--vocab 129280] [--rows 50]
 *
 * Logits: a peaked random row (a few ids near the top, most far under, some masked), the
 * same for every row. Each sampling setting is timed as the median over rows (each row its own
 * step, so its own draw), next to two yardsticks measured in the same run:
 *   floor: one pass over the row (the argmax every setting starts with);
 *   sort:  the textbook sampler (every id ordered by logit, softmax, the filters walked in
 *          that order), what bt_sampler did until it avoided the order where no filter
 *          needs one.
 * Prints a table, then a JSON line a setting. */
#include "services/engine/sampler.h"

#include "bench/bench_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const float *g_l; /* what by_logit sorts by */
static int by_logit(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_l[x] != g_l[y]) return g_l[x] > g_l[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* the textbook sampler: every id in order of logit, then softmax and the filters in that order */
static int32_t sort_sample(const float *l, int V, const bt_sampling_t *p, int32_t *ord, double *w,
                           double u01)
{
    for (int i = 0; i < V; i++) ord[i] = i;
    g_l = l;
    qsort(ord, (size_t)V, sizeof *ord, by_logit);
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double sum = 0.0, mx = l[ord[0]];
    for (int i = 0; i < k; i++) sum += w[i] = exp(((double)l[ord[i]] - mx) / p->temperature);
    int keep = k;
    double cum = 0.0;
    for (int i = 0; i < k; i++) {
        if (p->min_p > 0.0f && w[i] < p->min_p * w[0]) {
            keep = i;
            break;
        }
        cum += w[i] / sum;
        if (p->top_p < 1.0f && cum >= p->top_p) {
            keep = i + 1;
            break;
        }
    }
    double total = 0.0;
    for (int i = 0; i < keep; i++) total += w[i];
    double u = u01 * total;
    for (int i = 0; i < keep; i++)
        if ((u -= w[i]) < 0) return ord[i];
    return ord[keep - 1];
}

int main(int argc, char **argv)
{
    int V = 129280, rows = 50;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab")) V = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--vocab N] [--rows N]\n", argv[0]);
            return 2;
        }
    }
    if (V < 1000 || rows < 5) {
        fprintf(stderr, "need --vocab >= 1000 and --rows >= 5\n");
        return 2;
    }
    float *l = malloc((size_t)V * sizeof *l);
    int32_t *ord = malloc((size_t)V * sizeof *ord);
    double *w = malloc((size_t)V * sizeof *w), *t = malloc((size_t)rows * sizeof *t);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u = (double)(x >> 11) * 0x1p-53;
        l[i] = (float)(-12.0 * u * u);
        if (i % 97 == 5) l[i] = -INFINITY;
    }
    l[777] = 4.0f, l[1234] = 3.5f, l[99999] = 3.5f;

    /* floor: one pass over the row */
    volatile int32_t sink = 0;
    for (int r = 0; r < rows; r++) {
        double t0 = now();
        float mx = l[0];
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > mx) mx = l[i], best = i;
        sink += best;
        t[r] = now() - t0;
    }
    qsort(t, (size_t)rows, sizeof *t, cmp_double);
    const double floor_ms = 1e3 * t[rows / 2];

    const struct {
        const char *name;
        bt_sampling_t p;
        int logprobs;
    } cases[] = {
        {"greedy", {0.0f, 1.0f, 0.0f, 0, 1}, 0},
        {"greedy, logprobs + top 5", {0.0f, 1.0f, 0.0f, 0, 1}, 1},
        {"temperature 1", {1.0f, 1.0f, 0.0f, 0, 1}, 0},
        {"temperature 0.7, top_p 0.9", {0.7f, 0.9f, 0.0f, 0, 1}, 0},
        {"temperature 0.7, top_k 50", {0.7f, 1.0f, 0.0f, 50, 1}, 0},
        {"temperature 1, min_p 0.05", {1.0f, 1.0f, 0.05f, 0, 1}, 0},
    };
    bt_sampler_t *s = bt_sampler_create(V);
    printf("vocab %d, %d rows; floor (one pass over the row) %.3f ms\n\n", V, rows, floor_ms);
    printf("| setting | ours ms | sorting every id ms | ours / floor |\n|---|---:|---:|---:|\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float lp;
        bt_top_logprob_t top[5];
        for (int r = 0; r < rows; r++) {
            double t0 = now();
            sink += bt_sampler_sample(s, &cases[c].p, l, (uint64_t)r, cases[c].logprobs ? &lp : NULL,
                                      cases[c].logprobs ? top : NULL, cases[c].logprobs ? 5 : 0);
            t[r] = now() - t0;
        }
        qsort(t, (size_t)rows, sizeof *t, cmp_double);
        double ours = 1e3 * t[rows / 2], sorted = NAN;
        if (cases[c].p.temperature > 0.0f) {
            int n = rows < 9 ? rows : 9; /* (slow: fewer rows) */
            for (int r = 0; r < n; r++) {
                double t0 = now();
                sink += sort_sample(l, V, &cases[c].p, ord, w, (double)(r + 1) / (n + 1));
                t[r] = now() - t0;
            }
            qsort(t, (size_t)n, sizeof *t, cmp_double);
            sorted = 1e3 * t[n / 2];
        }
        char cell[32] = "-";
        if (!isnan(sorted)) snprintf(cell, sizeof cell, "%.3f", sorted);
        printf("| %s | %.3f | %s | %.1fx |\n", cases[c].name, ours, cell, ours / floor_ms);
        fprintf(stderr,
                "{\"bench\":\"sampler\",\"vocab\":%d,\"setting\":\"%s\",\"ms\":%.4f,\"sort_ms\":%.4f,"
                "\"floor_ms\":%.4f}\n",
                V, cases[c].name, ours, isnan(sorted) ? -1.0 : sorted, floor_ms);
    }
    bt_sampler_destroy(s);
    free(l), free(ord), free(w), free(t);
    return sink == 12345 ? 1 : 0;
}

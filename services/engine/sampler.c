#include "services/engine/sampler.h"

#include "common/alloc.h"

#include <math.h>
#include <stdlib.h>

struct bt_sampler {
    int vocab;
    int32_t *order;
    double *prob;
};

bt_sampler_t *bt_sampler_create(int vocab)
{
    bt_sampler_t *s = bt_calloc_or_die(1, sizeof *s);
    s->vocab = vocab;
    s->order = bt_malloc_or_die((size_t)vocab * sizeof *s->order);
    s->prob = bt_malloc_or_die((size_t)vocab * sizeof *s->prob);
    return s;
}

void bt_sampler_destroy(bt_sampler_t *s)
{
    if (!s) return;
    free(s->order);
    free(s->prob);
    free(s);
}

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* descending by logit, ascending id on ties (heap of the first k, then sorted) */
static int better(const float *l, int32_t a, int32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

static void sift(const float *l, int32_t *h, int n, int i)
{
    for (;;) {
        int c = 2 * i + 1, w = i;
        if (c < n && better(l, h[w], h[c])) w = c; /* min-heap by "better": root is worst */
        if (c + 1 < n && better(l, h[w], h[c + 1])) w = c + 1;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best ids of logits into order[0..k), best first. */
static void top_ids(const float *l, int vocab, int k, int32_t *order)
{
    int n = 0;
    for (int32_t id = 0; id < vocab; id++) {
        if (n < k) {
            order[n++] = id;
            if (n == k)
                for (int i = k / 2 - 1; i >= 0; i--) sift(l, order, n, i);
        } else if (better(l, id, order[0])) {
            order[0] = id;
            sift(l, order, n, 0);
        }
    }
    if (n < k)
        for (int i = n / 2 - 1; i >= 0; i--) sift(l, order, n, i);
    /* heap -> sorted best first */
    for (int end = n - 1; end > 0; end--) {
        int32_t t = order[0];
        order[0] = order[end];
        order[end] = t;
        sift(l, order, end, 0);
    }
}

int32_t bt_sampler_sample(bt_sampler_t *s, const bt_sampling_t *p, const float *logits,
                          uint64_t step, float *logprob_p, bt_top_logprob_t *top, int n_top)
{
    int V = s->vocab;
    float mx = logits[0];
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) {
            mx = logits[i];
            best = i;
        }
    double lse = 0.0;
    if (logprob_p || (top && n_top > 0)) {
        for (int i = 0; i < V; i++) lse += exp((double)logits[i] - mx);
        lse = log(lse) + mx;
    }
    int32_t chosen = best;
    if (p->temperature > 0.0f) {
        int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
        top_ids(logits, V, k, s->order);
        double t = p->temperature, sum = 0.0;
        for (int i = 0; i < k; i++) {
            s->prob[i] = exp(((double)logits[s->order[i]] - mx) / t);
            sum += s->prob[i];
        }
        int keep = k;
        double cum = 0.0, top_p = p->top_p > 0.0f && p->top_p < 1.0f ? p->top_p : 1.0;
        for (int i = 0; i < k; i++) {
            double pi = s->prob[i] / sum;
            if (p->min_p > 0.0f && pi < p->min_p * (s->prob[0] / sum)) {
                keep = i;
                break;
            }
            cum += pi;
            if (cum >= top_p) {
                keep = i + 1;
                break;
            }
        }
        if (keep < 1) keep = 1;
        double total = 0.0;
        for (int i = 0; i < keep; i++) total += s->prob[i];
        uint64_t r = mix64(p->seed ^ mix64(step + 0x51ed2701u));
        double u = (double)(r >> 11) * 0x1p-53 * total;
        chosen = s->order[keep - 1];
        for (int i = 0; i < keep; i++) {
            u -= s->prob[i];
            if (u < 0) {
                chosen = s->order[i];
                break;
            }
        }
    }
    if (logprob_p) *logprob_p = (float)((double)logits[chosen] - lse);
    if (top && n_top > 0) {
        int k = n_top < V ? n_top : V;
        top_ids(logits, V, k, s->order);
        for (int i = 0; i < k; i++) {
            top[i].id = s->order[i];
            top[i].logprob = (float)((double)logits[s->order[i]] - lse);
        }
    }
    return chosen;
}

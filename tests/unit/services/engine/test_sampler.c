/* The token sampler: greedy, the distribution it draws from at a temperature, what top-k, top-p
 * and min-p leave drawable (against a brute-force reference, also at a real vocabulary's size),
 * the draw's dependence on (seed, step) only, and the log-probabilities it reports. */
#include "bt_test.h"

#include "services/engine/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DRAWS = 40000 };

static bt_sampling_t params(float temperature, int top_k, float top_p, float min_p, uint64_t seed)
{
    bt_sampling_t p = {temperature, top_p, min_p, top_k, seed};
    return p;
}

/* softmax(l / t) over v ids into p */
static void softmax(const float *l, int v, float t, double *p)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < v; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < v; i++) sum += p[i] = exp(((double)l[i] - mx) / t);
    for (int i = 0; i < v; i++) p[i] /= sum;
}

/* Draws DRAWS tokens at steps 0.. and checks each id's share against want[] (0: never drawn)
 * within 5 standard deviations. */
static void check_shares(bt_sampler_t *s, const bt_sampling_t *p, const float *l, int v,
                         const double *want, const char *what)
{
    int *count = calloc((size_t)v, sizeof *count);
    for (int k = 0; k < DRAWS; k++) {
        int32_t t = bt_sampler_sample(s, p, l, (uint64_t)k, NULL, NULL, 0);
        BT_CHECK_MSG(t >= 0 && t < v, "%s: id %d", what, t);
        if (t >= 0 && t < v) count[t]++;
    }
    for (int i = 0; i < v; i++) {
        double got = (double)count[i] / DRAWS, sd = sqrt(want[i] * (1.0 - want[i]) / DRAWS);
        if (want[i] == 0.0)
            BT_CHECK_MSG(count[i] == 0, "%s: id %d drawn %d times, never allowed", what, i, count[i]);
        else
            BT_CHECK_MSG(fabs(got - want[i]) <= 5.0 * sd + 1e-9, "%s: id %d share %.4f, want %.4f",
                         what, i, got, want[i]);
    }
    free(count);
}

static const float L6[6] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -INFINITY}; /* id 5 masked */

static void test_greedy(void)
{
    bt_sampler_t *s = bt_sampler_create(6);
    bt_sampling_t g = params(0.0f, 2, 0.5f, 0.1f, 7); /* the filters do not apply at 0 */
    BT_CHECK_EQ_INT(bt_sampler_sample(s, &g, L6, 0, NULL, NULL, 0), 0);
    const float tie[6] = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f, 3.0f};
    BT_CHECK_EQ_INT(bt_sampler_sample(s, &g, tie, 5, NULL, NULL, 0), 1); /* lowest id on ties */
    bt_sampler_destroy(s);
}

static void test_temperature(void)
{
    bt_sampler_t *s = bt_sampler_create(6);
    double want[6];
    for (int t = 0; t < 2; t++) {
        const float temp = t ? 0.5f : 1.0f;
        bt_sampling_t p = params(temp, 0, 1.0f, 0.0f, 1234 + (uint64_t)t);
        softmax(L6, 6, temp, want);
        check_shares(s, &p, L6, 6, want, t ? "temperature 0.5" : "temperature 1");
    }
    bt_sampler_destroy(s);
}

static void test_filters(void)
{
    bt_sampler_t *s = bt_sampler_create(6);
    double p6[6], want[6];
    softmax(L6, 6, 1.0f, p6);
    /* top_k 2: ids 0 and 1, renormalized */
    memset(want, 0, sizeof want);
    want[0] = p6[0] / (p6[0] + p6[1]);
    want[1] = p6[1] / (p6[0] + p6[1]);
    bt_sampling_t k2 = params(1.0f, 2, 1.0f, 0.0f, 99);
    check_shares(s, &k2, L6, 6, want, "top_k 2");
    /* top_p 0.8: the most likely until their share reaches it (p6 = .56 .21 .13 .08 .03) */
    double cum = 0.0, kept = 0.0;
    int n = 0;
    while (cum < 0.8) cum += p6[n++];
    BT_CHECK_EQ_INT(n, 3);
    memset(want, 0, sizeof want);
    for (int i = 0; i < n; i++) kept += p6[i];
    for (int i = 0; i < n; i++) want[i] = p6[i] / kept;
    bt_sampling_t tp = params(1.0f, 0, 0.8f, 0.0f, 5);
    check_shares(s, &tp, L6, 6, want, "top_p 0.8");
    /* min_p 0.2: those with at least a fifth of the best's probability (ids 0, 1, 2) */
    memset(want, 0, sizeof want);
    kept = 0.0;
    for (int i = 0; i < 6; i++)
        if (p6[i] >= 0.2 * p6[0]) kept += p6[i];
    for (int i = 0; i < 6; i++)
        if (p6[i] >= 0.2 * p6[0]) want[i] = p6[i] / kept;
    BT_CHECK(want[2] > 0.0 && want[3] == 0.0);
    bt_sampling_t mp = params(1.0f, 0, 1.0f, 0.2f, 11);
    check_shares(s, &mp, L6, 6, want, "min_p 0.2");
    bt_sampler_destroy(s);
}

static const float *g_order_logits; /* what by_logit_desc sorts by */

static int by_logit_desc(const void *a, const void *b)
{
    const float *l = g_order_logits;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (l[x] != l[y]) return l[x] > l[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* The brute-force reference of what may be drawn and how likely: every id ordered, softmax at
 * the temperature over the top_k, then in that order stop at the first under min_p times the
 * best or once the share reaches top_p; the rest renormalized. Returns the last kept id. */
static int32_t reference(const float *l, int v, const bt_sampling_t *p, double *want)
{
    int32_t *ord = malloc((size_t)v * sizeof *ord);
    double *w = malloc((size_t)v * sizeof *w), sum = 0.0, kept_w = 0.0, cum = 0.0;
    for (int i = 0; i < v; i++) ord[i] = i;
    g_order_logits = l;
    qsort(ord, (size_t)v, sizeof *ord, by_logit_desc);
    int k = p->top_k > 0 && p->top_k < v ? p->top_k : v, keep = k;
    for (int i = 0; i < k; i++) sum += w[i] = exp(((double)l[ord[i]] - l[ord[0]]) / p->temperature);
    for (int i = 0; i < k; i++) {
        if (p->min_p > 0.0f && w[i] < p->min_p * w[0]) {
            keep = i;
            break;
        }
        cum += w[i] / sum;
        if (p->top_p > 0.0f && p->top_p < 1.0f && cum >= p->top_p) {
            keep = i + 1;
            break;
        }
    }
    memset(want, 0, (size_t)v * sizeof *want);
    for (int i = 0; i < keep; i++) kept_w += w[i];
    for (int i = 0; i < keep; i++) want[ord[i]] = w[i] / kept_w;
    int32_t last = ord[keep - 1];
    free(ord), free(w);
    return last;
}

/* The filters, alone and together, on rows long enough for the nucleus' partitions (more than
 * 16 candidates), logits falling smoothly with the id and a bump over the ids (orders that
 * defeat a median-of-three pivot): each id's share against the reference, the last kept id
 * drawn. */
static void test_filters_many(void)
{
    enum { V = 400 };
    float l[V], bump[V];
    for (int i = 0; i < V; i++) {
        l[i] = -0.02f * (float)i + 0.001f * (float)((i * 7919) % 13);
        bump[i] = -(float)((i - 200) * (i - 200)) / 3600.0f;
    }
    const struct {
        const float *l;
        bt_sampling_t p;
        const char *name;
    } cs[] = {
        {l, {1.0f, 0.6f, 0.0f, 0, 21}, "top_p 0.6"},
        {l, {1.0f, 0.6f, 0.5f, 0, 22}, "top_p 0.6, min_p 0.5"},
        {l, {0.8f, 0.7f, 0.0f, 30, 23}, "top_k 30, top_p 0.7"},
        {l, {1.0f, 1.0f, 0.2f, 100, 24}, "top_k 100, min_p 0.2"},
        {bump, {1.0f, 0.9f, 0.0f, 0, 25}, "bump, top_p 0.9"},
    };
    bt_sampler_t *s = bt_sampler_create(V);
    double want[V];
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int32_t last = reference(cs[c].l, V, &cs[c].p, want);
        check_shares(s, &cs[c].p, cs[c].l, V, want, cs[c].name);
        int drawn = 0;
        for (int k = 0; k < DRAWS && !drawn; k++)
            drawn = bt_sampler_sample(s, &cs[c].p, cs[c].l, (uint64_t)k, NULL, NULL, 0) == last;
        BT_CHECK_MSG(drawn, "%s: the last kept id %d never drawn (share %.4f)", cs[c].name, last, want[last]);
    }
    bt_sampler_destroy(s);
}

/* rows and settings outside the usual: the argmax wherever no distribution is defined */
static void test_edges(void)
{
    bt_sampler_t *s = bt_sampler_create(6);
    bt_sampling_t tiny = params(1e-39f, 0, 1.0f, 0.0f, 1), over = params(1.0f, 0, 1.0f, 2.0f, 1);
    for (int k = 0; k < 50; k++) {
        BT_CHECK_EQ_INT(bt_sampler_sample(s, &tiny, L6, (uint64_t)k, NULL, NULL, 0), 0);
        BT_CHECK_EQ_INT(bt_sampler_sample(s, &over, L6, (uint64_t)k, NULL, NULL, 0), 0);
    }
    const float inf_row[6] = {0.0f, 1.0f, INFINITY, 2.0f, -INFINITY, 0.5f};
    const float masked[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    bt_sampling_t t1 = params(1.0f, 0, 1.0f, 0.0f, 9);
    BT_CHECK_EQ_INT(bt_sampler_sample(s, &t1, inf_row, 3, NULL, NULL, 0), 2);
    int32_t m = bt_sampler_sample(s, &t1, masked, 3, NULL, NULL, 0);
    BT_CHECK(m >= 0 && m < 6);
    /* a masked id (weight 0) is never drawn, whatever the draw, even first in the row */
    const float first_masked[6] = {-INFINITY, 0.0f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int k = 0; k < 200; k++) BT_CHECK_EQ_INT(bt_sampler_sample(s, &t1, first_masked, (uint64_t)k, NULL, NULL, 0), 1);
    /* NaN (a broken row) ranks below every logit and is never drawn, first in the row too (a
     * NaN maximum made every draw id 0); a row of NaN only gives id 0. As the GPU's sampler. */
    const float nan_row[6] = {NAN, 1.0f, NAN, 3.0f, 2.0f, -INFINITY}, all_nan[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    bt_sampling_t greedy = params(0.0f, 0, 1.0f, 0.0f, 1), k2 = params(1.0f, 2, 1.0f, 0.0f, 5),
                  nucleus = params(1.0f, 0, 0.99f, 0.0f, 6);
    BT_CHECK_EQ_INT(bt_sampler_sample(s, &greedy, nan_row, 0, NULL, NULL, 0), 3);
    BT_CHECK_EQ_INT(bt_sampler_sample(s, &greedy, all_nan, 0, NULL, NULL, 0), 0);
    int drawn[6] = {0};
    for (int k = 0; k < 300; k++) {
        drawn[bt_sampler_sample(s, &t1, nan_row, (uint64_t)k, NULL, NULL, 0)]++;
        int32_t a = bt_sampler_sample(s, &k2, nan_row, (uint64_t)k, NULL, NULL, 0);
        int32_t b = bt_sampler_sample(s, &nucleus, nan_row, (uint64_t)k, NULL, NULL, 0);
        BT_CHECK(a == 3 || a == 4);
        BT_CHECK(b == 1 || b == 3 || b == 4);
    }
    BT_CHECK(drawn[0] == 0 && drawn[2] == 0 && drawn[5] == 0 && drawn[1] > 0 && drawn[3] > drawn[4]);
    bt_top_logprob_t top[6];
    float lp;
    bt_sampler_sample(s, &greedy, nan_row, 0, &lp, top, 6);
    BT_CHECK(top[0].id == 3 && top[1].id == 4 && top[2].id == 1 && top[3].id == 5 && top[4].id == 0 && top[5].id == 2);
    BT_CHECK(fabsf(lp - top[0].logprob) == 0.0f && isfinite(lp));
    bt_sampler_destroy(s);
}

/* penalties: each distinct generated token once, presence + frequency x its count; nothing
 * counted when both are 0 */
static void test_penalties(void)
{
    bt_penalties_t p;
    bt_penalties_init(&p, 0.5f, 0.25f);
    const int32_t toks[] = {7, 3, 7, 7, 9, 3};
    for (int i = 0; i < 6; i++) bt_penalties_add(&p, toks[i]);
    BT_CHECK_EQ_INT(p.n, 3);
    const int32_t want_id[3] = {7, 3, 9}, want_n[3] = {3, 2, 1};
    for (int i = 0; i < 3 && i < p.n; i++) {
        BT_CHECK_EQ_INT(p.ids[i], want_id[i]);
        BT_CHECK_EQ_INT(p.count[i], want_n[i]);
        BT_CHECK(p.amount[i] == 0.5f + 0.25f * (float)want_n[i]);
    }
    for (int i = 0; i < 200; i++) bt_penalties_add(&p, 1000 + i); /* past the first capacity */
    BT_CHECK_EQ_INT(p.n, 203);
    BT_CHECK(p.ids[202] == 1199 && p.amount[202] == 0.75f);
    bt_penalties_free(&p);
    BT_CHECK(p.n == 0 && !p.ids);
    bt_penalties_init(&p, 0.0f, 0.0f);
    bt_penalties_add(&p, 5);
    BT_CHECK_EQ_INT(p.n, 0);
    /* logit_bias: -bias, with or without penalties, before and after the token is generated */
    bt_penalties_bias(&p, 5, 3.0f);
    bt_penalties_add(&p, 5);
    BT_CHECK(p.n == 1 && p.amount[0] == -3.0f);
    bt_penalties_free(&p);
    bt_penalties_init(&p, 1.0f, 0.5f);
    bt_penalties_bias(&p, 5, -2.0f);
    bt_penalties_bias(&p, 6, 100.0f);
    bt_penalties_add(&p, 5);
    bt_penalties_add(&p, 5);
    bt_penalties_add(&p, 8);
    BT_CHECK_EQ_INT(p.n, 3);
    BT_CHECK(p.ids[0] == 5 && p.amount[0] == 2.0f + (1.0f + 0.5f * 2.0f));
    BT_CHECK(p.ids[1] == 6 && p.amount[1] == -100.0f);
    BT_CHECK(p.ids[2] == 8 && p.amount[2] == 1.5f);
    bt_penalties_free(&p);
}

/* the same (seed, step) draws the same id, whatever came before; other seeds differ */
static void test_determinism(void)
{
    bt_sampler_t *a = bt_sampler_create(6), *b = bt_sampler_create(6);
    bt_sampling_t p = params(1.0f, 0, 1.0f, 0.0f, 42), q = params(1.0f, 0, 1.0f, 0.0f, 43);
    int same = 0, differ = 0;
    for (int k = 0; k < 200; k++) {
        int32_t x = bt_sampler_sample(a, &p, L6, (uint64_t)k, NULL, NULL, 0);
        int32_t y = bt_sampler_sample(b, &p, L6, (uint64_t)k, NULL, NULL, 0);
        same += x == y;
        differ += x != bt_sampler_sample(b, &q, L6, (uint64_t)k, NULL, NULL, 0);
    }
    BT_CHECK_EQ_INT(same, 200);
    BT_CHECK(differ > 20);
    /* out of order: step 17 alone draws what it drew in sequence */
    int32_t seq17 = -1;
    for (int k = 0; k <= 17; k++) seq17 = bt_sampler_sample(a, &p, L6, (uint64_t)k, NULL, NULL, 0);
    BT_CHECK_EQ_INT(bt_sampler_sample(b, &p, L6, 17, NULL, NULL, 0), seq17);
    bt_sampler_destroy(a);
    bt_sampler_destroy(b);
}

static void test_logprobs(void)
{
    bt_sampler_t *s = bt_sampler_create(6);
    double p6[6];
    softmax(L6, 6, 1.0f, p6);
    bt_sampling_t p = params(1.0f, 0, 1.0f, 0.0f, 3);
    for (int k = 0; k < 50; k++) {
        float lp = 0.0f;
        bt_top_logprob_t top[4];
        int32_t t = bt_sampler_sample(s, &p, L6, (uint64_t)k, &lp, top, 4);
        BT_CHECK_MSG(fabs(lp - log(p6[t])) < 1e-5, "logprob %f of id %d, want %f", lp, t, log(p6[t]));
        for (int i = 0; i < 4; i++) {
            BT_CHECK_EQ_INT(top[i].id, i); /* L6 is in descending order */
            BT_CHECK(fabs(top[i].logprob - log(p6[i])) < 1e-5);
        }
    }
    bt_sampler_destroy(s);
}

/* A real vocabulary's size with a peaked distribution and masked ids: every draw under top_p,
 * top_k and min_p lies in the set a brute-force sort allows, and every id drawn is allowed. */
static void test_large_vocab(void)
{
    enum { V = 129280 };
    float *l = malloc(V * sizeof *l);
    int32_t *ord = malloc(V * sizeof *ord);
    double *pr = malloc(V * sizeof *pr);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u = (double)(x >> 11) * 0x1p-53;
        l[i] = (float)(-12.0 * u * u); /* many near the top, most far under */
        if (i % 97 == 5) l[i] = -INFINITY;
    }
    l[777] = 4.0f, l[1234] = 3.5f, l[99999] = 3.5f;
    softmax(l, V, 0.8f, pr);
    for (int i = 0; i < V; i++) ord[i] = i;
    g_order_logits = l;
    qsort(ord, V, sizeof *ord, by_logit_desc);
    /* the nucleus of 0.9 at temperature 0.8, the top 50, and min_p 0.005 */
    char *in_p = calloc(V, 1), *in_k = calloc(V, 1), *in_m = calloc(V, 1);
    double cum = 0.0;
    for (int i = 0; i < V && cum < 0.9; i++) cum += pr[ord[i]], in_p[ord[i]] = 1;
    for (int i = 0; i < 50; i++) in_k[ord[i]] = 1;
    for (int i = 0; i < V; i++) in_m[i] = pr[i] >= 0.005 * pr[777];
    bt_sampler_t *s = bt_sampler_create(V);
    const bt_sampling_t ps[4] = {params(0.8f, 0, 0.9f, 0.0f, 1), params(0.8f, 50, 1.0f, 0.0f, 2),
                                 params(0.8f, 0, 1.0f, 0.005f, 3), params(0.8f, 0, 1.0f, 0.0f, 4)};
    const char *names[4] = {"top_p 0.9", "top_k 50", "min_p 0.005", "temperature 0.8"};
    for (int c = 0; c < 4; c++) {
        int bad = 0, distinct = 0;
        char *seen = calloc(V, 1);
        for (int k = 0; k < 300; k++) {
            int32_t t = bt_sampler_sample(s, &ps[c], l, (uint64_t)k, NULL, NULL, 0);
            if (t < 0 || t >= V) {
                bad++;
                continue;
            }
            const char *allowed = c == 0 ? in_p : c == 1 ? in_k : c == 2 ? in_m : NULL;
            if ((allowed && !allowed[t]) || l[t] == -INFINITY) bad++;
            distinct += !seen[t];
            seen[t] = 1;
        }
        BT_CHECK_MSG(bad == 0, "%s: %d draws outside the allowed set", names[c], bad);
        BT_CHECK_MSG(distinct > 20, "%s: only %d distinct ids in 300 draws", names[c], distinct);
        free(seen);
    }
    /* greedy with log-probabilities: the best id and its log-softmax */
    float lp = 0.0f;
    bt_sampling_t g = params(0.0f, 0, 1.0f, 0.0f, 0);
    softmax(l, V, 1.0f, pr);
    BT_CHECK_EQ_INT(bt_sampler_sample(s, &g, l, 0, &lp, NULL, 0), 777);
    BT_CHECK_MSG(fabs(lp - log(pr[777])) < 1e-5, "logprob %f, want %f", lp, log(pr[777]));
    bt_sampler_destroy(s);
    free(l), free(ord), free(pr), free(in_p), free(in_k), free(in_m);
}

int main(void)
{
    BT_RUN(test_greedy);
    BT_RUN(test_temperature);
    BT_RUN(test_filters);
    BT_RUN(test_filters_many);
    BT_RUN(test_edges);
    BT_RUN(test_determinism);
    BT_RUN(test_penalties);
    BT_RUN(test_logprobs);
    BT_RUN(test_large_vocab);
    return bt_test_summary();
}

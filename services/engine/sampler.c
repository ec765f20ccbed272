#include "services/engine/sampler.h"

#include "common/alloc.h"
#include "kernels/sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* a token that may be drawn: its logit (for the order), id and weight exp((l - max) / T) */
typedef struct {
    float logit;
    int32_t id;
    double w;
} cand_t;

struct bt_sampler {
    int vocab;
    int32_t *order;
    cand_t *cand, *nuc; /* the kept tokens in id order; a copy the nucleus selection reorders */
    float *w; /* the weights of every id, or of the top_k */
};

bt_sampler_t *bt_sampler_create(int vocab)
{
    bt_sampler_t *s = bt_calloc_or_die(1, sizeof *s);
    s->vocab = vocab;
    s->order = bt_malloc_or_die((size_t)vocab * sizeof *s->order);
    s->cand = bt_malloc_or_die((size_t)vocab * sizeof *s->cand);
    s->nuc = bt_malloc_or_die((size_t)vocab * sizeof *s->nuc);
    s->w = bt_malloc_or_die((size_t)vocab * sizeof *s->w);
    return s;
}

void bt_sampler_destroy(bt_sampler_t *s)
{
    if (!s) return;
    free(s->order);
    free(s->cand);
    free(s->nuc);
    free(s->w);
    free(s);
}

/* descending by logit, ascending id on ties (heap of the first k, then sorted) */
static int better(const float *l, int32_t a, int32_t b)
{
    const uint32_t ka = bt_smp_key(l[a]), kb = bt_smp_key(l[b]);
    return ka > kb || (ka == kb && a < b);
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

/* w[i] = e^((l[i] - mx) * k) for i < n, eight at a time in a loop of fixed count (which the
 * compiler turns into vector instructions at -O2, where a loop of unknown count stays scalar) */
static void weights(float *restrict w, const float *restrict l, int n, float mx, float k)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) w[i + j] = bt_smp_weight(l[i + j], mx, k);
    for (; i < n; i++) w[i] = bt_smp_weight(l[i], mx, k);
}

/* most likely first, the lower id on ties (the order of top_ids) */
static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    const uint32_t kx = bt_smp_key(x->logit), ky = bt_smp_key(y->logit);
    if (kx != ky) return kx > ky ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void cand_swap(cand_t *c, int i, int j)
{
    cand_t t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* The nucleus: reorders c[0..n) so that its first m entries are the m most likely (by
 * cand_cmp) with the smallest m whose weight reaches `mass`, and returns m (n if none does).
 * A selection, not a sort: partitions around a median of three and keeps only the side where
 * the running weight crosses `mass`, expected time linear in n (a sort of a flat row's ~100k
 * survivors took ~20 ms). The order within the nucleus is left as the partitions leave it. */
static int nucleus(cand_t *c, int n, double mass)
{
    int lo = 0, hi = n, rounds = 8;
    for (int m = n; m > 1; m >>= 1) rounds += 2;
    double acc = 0.0; /* the weight of c[0..lo), all more likely than c[lo..hi) */
    /* (rows whose logits vary smoothly with the id defeat the median of three: after 2 log2 n
     * rounds the rest is sorted, which bounds the time by a sort's) */
    while (hi - lo > 16 && rounds-- > 0) {
        const int mid = lo + (hi - lo) / 2;
        if (cand_cmp(&c[mid], &c[lo]) < 0) cand_swap(c, mid, lo);
        if (cand_cmp(&c[hi - 1], &c[lo]) < 0) cand_swap(c, hi - 1, lo);
        if (cand_cmp(&c[hi - 1], &c[mid]) < 0) cand_swap(c, hi - 1, mid);
        cand_swap(c, mid, hi - 1); /* the median as the pivot, at the end */
        int at = lo;
        double above = 0.0;
        for (int i = lo; i < hi - 1; i++)
            if (cand_cmp(&c[i], &c[hi - 1]) < 0) {
                above += c[i].w;
                cand_swap(c, i, at++);
            }
        cand_swap(c, at, hi - 1); /* c[lo..at) more likely than c[at], the rest less */
        if (acc + above >= mass) {
            hi = at;
        } else if (acc + above + c[at].w >= mass) {
            return at + 1;
        } else {
            acc += above + c[at].w;
            lo = at + 1;
        }
    }
    qsort(c + lo, (size_t)(hi - lo), sizeof *c, cand_cmp);
    for (int i = lo; i < hi; i++) {
        acc += c[i].w;
        if (acc >= mass) return i + 1;
    }
    return hi;
}

static int id_cmp(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Temperature sampling in time linear in the vocabulary. The candidates are every id, or the
 * top_k best (a heap of k); min_p drops those under min_p times the best's probability; top_p
 * keeps the most likely of the rest until their weight reaches top_p of the candidates'. The
 * draw walks the tokens kept in id order, so it is defined by the set alone, and the GPU's
 * sampler (kernels/cuda/sample.cu), which finds the same sets by other means, draws the same
 * token from the same (seed, step) unless a sum's last bits decide. Only top_p needs an order,
 * and only of the tokens that can be in its nucleus: the ones at least eps = (1 - top_p) / 2n
 * of the total, since those under it hold less than (1 - top_p) / 2 of the mass together, so
 * the most likely first reach top_p before any of them. (Sorting all of a 129280-id vocabulary
 * took ~45 ms a token; the nucleus is found by selection, not sorted.) With probs (vocab
 * floats) set, nothing is drawn: probs gets the distribution a draw would follow (the kept
 * tokens' weights over their total, 0 elsewhere; speculative verification compares two of
 * them), and the argmax is returned. */
static int32_t sample_temperature(bt_sampler_t *s, const bt_sampling_t *p, const float *logits,
                                  float mx, int32_t best, uint64_t step, float *probs)
{
    const int V = s->vocab;
    const float inv_t = 1.0f / p->temperature;
    if (probs) memset(probs, 0, (size_t)V * sizeof *probs);
    /* a temperature too small for its inverse, or a row without a finite maximum (+inf, all
     * -inf, NaN): the argmax, as at temperature 0 */
    if (!isfinite(inv_t) || !isfinite(mx)) {
        if (probs) probs[best] = 1.0f;
        return best;
    }
    const bool topk = p->top_k > 0 && p->top_k < V;
    const int n = topk ? p->top_k : V;
    /* candidate i is id i, or order[i] under top_k (the k best, put in id order) */
    int32_t *order = s->order;
    float *w = s->w;
    if (topk) {
        top_ids(logits, V, n, order);
        qsort(order, (size_t)n, sizeof *order, id_cmp);
        for (int i = 0; i < n; i++) w[i] = bt_smp_weight(logits[order[i]], mx, inv_t);
    } else {
        weights(w, logits, n, mx, inv_t);
    }
#define CAND_ID(i) (topk ? order[i] : (int32_t)(i))
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += w[i];
    /* min_p against the best's weight, which is exp(0) = 1 (1 or over: the best, and any other
     * whose weight rounds to 1) */
    const double floor_w = p->min_p > 0.0f ? (p->min_p < 1.0f ? (double)p->min_p : 1.0) : 0.0;
    const double top_p = p->top_p > 0.0f && p->top_p < 1.0f ? (double)p->top_p : 1.0;
    const double eps = top_p < 1.0 ? 0.5 * (1.0 - top_p) * sum / n : 0.0;
    const double keep_w = floor_w > eps ? floor_w : eps;
    const double unit = bt_smp_unit(p->seed, step);
    int last = -1; /* the last kept with weight (rounding may leave u >= 0 at the end) */
    if (top_p < 1.0) {
        /* the kept tokens in id order; the nucleus: those at least as likely as its least
         * likely member, the edge (a higher logit, or the same and a lower id) */
        cand_t *c = s->cand;
        int kept = 0;
        for (int i = 0; i < n; i++)
            if (w[i] >= keep_w) c[kept++] = (cand_t){logits[CAND_ID(i)], CAND_ID(i), (double)w[i]};
        if (kept == 0) return best; /* (never: the best's weight is 1) */
        memcpy(s->nuc, c, (size_t)kept * sizeof *c);
        const int m = nucleus(s->nuc, kept, top_p * sum);
        cand_t edge = s->nuc[0];
        double total = 0.0;
        for (int i = 0; i < m; i++) {
            total += s->nuc[i].w;
            if (cand_cmp(&s->nuc[i], &edge) > 0) edge = s->nuc[i];
        }
        if (probs) {
            for (int i = 0; i < kept; i++)
                if (cand_cmp(&c[i], &edge) <= 0) probs[c[i].id] = (float)(c[i].w / total);
            return best;
        }
        double u = unit * total;
        for (int i = 0; i < kept; i++) {
            if (cand_cmp(&c[i], &edge) > 0) continue;
            if (c[i].w > 0.0) last = i;
            u -= c[i].w;
            if (u < 0) return c[i].id;
        }
        return last >= 0 ? c[last].id : best;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++)
        if (w[i] >= keep_w) total += w[i];
    if (probs) {
        for (int i = 0; i < n; i++)
            if (w[i] >= keep_w) probs[CAND_ID(i)] = (float)(w[i] / total);
        return best;
    }
    double u = unit * total;
    for (int i = 0; i < n; i++) {
        if (!(w[i] >= keep_w)) continue;
        if (w[i] > 0.0f) last = i;
        u -= w[i];
        if (u < 0) return CAND_ID(i);
    }
    return last >= 0 ? CAND_ID(last) : best;
#undef CAND_ID
}

void bt_penalties_init(bt_penalties_t *p, float presence, float frequency)
{
    *p = (bt_penalties_t){.presence = presence, .frequency = frequency};
}

/* the entry of token (a request's distinct tokens: a linear scan), made when missing */
static int penalty_entry(bt_penalties_t *p, int32_t token)
{
    int i = 0;
    while (i < p->n && p->ids[i] != token) i++;
    if (i < p->n) return i;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->ids = bt_realloc_or_die(p->ids, (size_t)p->cap * sizeof *p->ids);
        p->count = bt_realloc_or_die(p->count, (size_t)p->cap * sizeof *p->count);
        p->base = bt_realloc_or_die(p->base, (size_t)p->cap * sizeof *p->base);
        p->amount = bt_realloc_or_die(p->amount, (size_t)p->cap * sizeof *p->amount);
    }
    p->ids[i] = token;
    p->count[i] = 0;
    p->base[i] = 0.0f;
    p->amount[i] = 0.0f;
    p->n++;
    return i;
}

void bt_penalties_bias(bt_penalties_t *p, int32_t token, float bias)
{
    const int i = penalty_entry(p, token);
    p->base[i] = -bias;
    p->amount[i] = p->base[i];
}

void bt_penalties_add(bt_penalties_t *p, int32_t token)
{
    if (p->presence == 0.0f && p->frequency == 0.0f) return;
    const int i = penalty_entry(p, token);
    p->count[i]++;
    p->amount[i] = p->base[i] + (p->presence + p->frequency * (float)p->count[i]);
}

void bt_penalties_copy(bt_penalties_t *dst, const bt_penalties_t *src)
{
    if (dst->cap < src->n) {
        dst->cap = src->n;
        dst->ids = bt_realloc_or_die(dst->ids, (size_t)dst->cap * sizeof *dst->ids);
        dst->count = bt_realloc_or_die(dst->count, (size_t)dst->cap * sizeof *dst->count);
        dst->base = bt_realloc_or_die(dst->base, (size_t)dst->cap * sizeof *dst->base);
        dst->amount = bt_realloc_or_die(dst->amount, (size_t)dst->cap * sizeof *dst->amount);
    }
    dst->presence = src->presence;
    dst->frequency = src->frequency;
    dst->n = src->n;
    if (src->n) {
        memcpy(dst->ids, src->ids, (size_t)src->n * sizeof *dst->ids);
        memcpy(dst->count, src->count, (size_t)src->n * sizeof *dst->count);
        memcpy(dst->base, src->base, (size_t)src->n * sizeof *dst->base);
        memcpy(dst->amount, src->amount, (size_t)src->n * sizeof *dst->amount);
    }
}

void bt_penalties_free(bt_penalties_t *p)
{
    free(p->ids);
    free(p->count);
    free(p->base);
    free(p->amount);
    *p = (bt_penalties_t){0};
}

/* the argmax, the lower id on ties, NaN skipped (a row of NaN only: id 0), and its logit */
static int32_t argmax(const float *logits, int V, float *mx_p)
{
    float mx = -INFINITY;
    int32_t best = -1;
    for (int i = 0; i < V; i++)
        if (logits[i] > mx || (logits[i] == mx && best < 0)) {
            mx = logits[i];
            best = i;
        }
    if (best < 0) {
        best = 0;
        mx = logits[0];
    }
    *mx_p = mx;
    return best;
}

/* log sum exp of the row, whose maximum is mx */
static double row_lse(bt_sampler_t *s, const float *logits, float mx)
{
    double lse = 0.0;
    weights(s->w, logits, s->vocab, mx, 1.0f);
    for (int i = 0; i < s->vocab; i++)
        lse += s->w[i];
    return log(lse) + mx;
}

/* the n_top most likely tokens and their log-probabilities */
static void fill_top(bt_sampler_t *s, const float *logits, double lse, bt_top_logprob_t *top,
                     int n_top)
{
    if (!top || n_top <= 0) return;
    int k = n_top < s->vocab ? n_top : s->vocab;
    top_ids(logits, s->vocab, k, s->order);
    for (int i = 0; i < k; i++) {
        top[i].id = s->order[i];
        top[i].logprob = (float)((double)logits[s->order[i]] - lse);
    }
}

int32_t bt_sampler_probs(bt_sampler_t *s, const bt_sampling_t *p, const float *logits, float *probs)
{
    float mx;
    const int32_t best = argmax(logits, s->vocab, &mx);
    if (p->temperature > 0.0f) return sample_temperature(s, p, logits, mx, best, 0, probs);
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    probs[best] = 1.0f;
    return best;
}

int32_t bt_sampler_sample(bt_sampler_t *s, const bt_sampling_t *p, const float *logits,
                          uint64_t step, float *logprob_p, bt_top_logprob_t *top, int n_top)
{
    int V = s->vocab;
    float mx;
    const int32_t best = argmax(logits, V, &mx);
    const double lse = logprob_p || (top && n_top > 0) ? row_lse(s, logits, mx) : 0.0;
    int32_t chosen =
        p->temperature > 0.0f ? sample_temperature(s, p, logits, mx, best, step, NULL) : best;
    if (logprob_p) *logprob_p = (float)((double)logits[chosen] - lse);
    fill_top(s, logits, lse, top, n_top);
    return chosen;
}

float bt_sampler_logprob(bt_sampler_t *s, const float *logits, int32_t id, bt_top_logprob_t *top,
                         int n_top)
{
    float mx;
    argmax(logits, s->vocab, &mx);
    const double lse = row_lse(s, logits, mx);
    fill_top(s, logits, lse, top, n_top);
    return (float)((double)logits[id] - lse);
}

#include "common/metrics.h"

#include "common/alloc.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double bt_metrics_latency_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0, -1.0};

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind_t;

struct bt_metric {
    struct bt_metric *next;
    kind_t kind;
    char *name, *help, *label, *value;
    double v;               /* counter / gauge */
    double *bounds;         /* histogram */
    unsigned long long *counts;
    int n_bounds;
    double sum;
    unsigned long long count;
};

struct bt_metrics {
    char *prefix;
    struct bt_metric *head, *tail;
};

bt_metrics_t *bt_metrics_create(const char *prefix)
{
    bt_metrics_t *m = bt_calloc_or_die(1, sizeof *m);
    m->prefix = bt_strdup_or_die(prefix);
    return m;
}

void bt_metrics_destroy(bt_metrics_t *m)
{
    if (!m) return;
    for (struct bt_metric *x = m->head; x;) {
        struct bt_metric *next = x->next;
        free(x->name);
        free(x->help);
        free(x->label);
        free(x->value);
        free(x->bounds);
        free(x->counts);
        free(x);
        x = next;
    }
    free(m->prefix);
    free(m);
}

static int same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static struct bt_metric *get(bt_metrics_t *m, kind_t kind, const char *name, const char *help,
                             const char *label, const char *value)
{
    struct bt_metric *last_of_name = NULL;
    for (struct bt_metric *x = m->head; x; x = x->next) {
        if (strcmp(x->name, name)) continue;
        last_of_name = x;
        if (same(x->label, label) && same(x->value, value)) return x;
    }
    struct bt_metric *x = bt_calloc_or_die(1, sizeof *x);
    x->kind = kind;
    x->name = bt_strdup_or_die(name);
    x->help = bt_strdup_or_die(help ? help : name);
    x->label = label ? bt_strdup_or_die(label) : NULL;
    x->value = value ? bt_strdup_or_die(value) : NULL;
    /* series of one name stay together so HELP/TYPE print once */
    if (last_of_name) {
        x->next = last_of_name->next;
        last_of_name->next = x;
        if (m->tail == last_of_name) m->tail = x;
    } else {
        if (m->tail)
            m->tail->next = x;
        else
            m->head = x;
        m->tail = x;
    }
    return x;
}

bt_counter_t *bt_metrics_counter(bt_metrics_t *m, const char *name, const char *help,
                                 const char *label, const char *value)
{
    return get(m, KIND_COUNTER, name, help, label, value);
}

bt_gauge_t *bt_metrics_gauge(bt_metrics_t *m, const char *name, const char *help,
                             const char *label, const char *value)
{
    return get(m, KIND_GAUGE, name, help, label, value);
}

bt_histogram_t *bt_metrics_histogram(bt_metrics_t *m, const char *name, const char *help,
                                     const double *buckets, const char *label, const char *value)
{
    struct bt_metric *x = get(m, KIND_HISTOGRAM, name, help, label, value);
    if (!x->bounds) {
        int n = 0;
        while (buckets[n] >= 0) n++;
        x->n_bounds = n;
        x->bounds = bt_malloc_or_die((size_t)(n ? n : 1) * sizeof(double));
        memcpy(x->bounds, buckets, (size_t)n * sizeof(double));
        x->counts = bt_calloc_or_die((size_t)n + 1, sizeof(unsigned long long));
    }
    return x;
}

void bt_counter_add(bt_counter_t *c, double v)
{
    if (v > 0) c->v += v;
}

void bt_gauge_set(bt_gauge_t *g, double v)
{
    g->v = v;
}

void bt_histogram_observe(bt_histogram_t *h, double v)
{
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

typedef struct {
    char *buf;
    size_t len, cap;
} sb_t;

static void sb_printf(sb_t *s, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < s->cap - s->len) {
            s->len += (size_t)n;
            return;
        }
        s->cap = s->cap * 2 + (size_t)(n > 0 ? n : 256);
        s->buf = bt_realloc_or_die(s->buf, s->cap);
    }
}

static void fmt_num(char *out, size_t n, double v)
{
    if (isinf(v))
        snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        snprintf(out, n, "%.0f", v);
    else
        snprintf(out, n, "%.9g", v);
}

/* label value escaping: backslash, double quote, newline */
static void labels(sb_t *s, const struct bt_metric *x, const char *extra_name, const char *extra)
{
    if (!x->label && !extra_name) return;
    sb_printf(s, "{");
    if (x->label) {
        sb_printf(s, "%s=\"", x->label);
        for (const char *p = x->value; *p; p++) {
            if (*p == '\\' || *p == '"')
                sb_printf(s, "\\%c", *p);
            else if (*p == '\n')
                sb_printf(s, "\\n");
            else
                sb_printf(s, "%c", *p);
        }
        sb_printf(s, "\"");
    }
    if (extra_name) sb_printf(s, "%s%s=\"%s\"", x->label ? "," : "", extra_name, extra);
    sb_printf(s, "}");
}

char *bt_metrics_render(const bt_metrics_t *m)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    sb_t s = {bt_malloc_or_die(4096), 0, 4096};
    s.buf[0] = 0;
    const char *prev = NULL;
    for (const struct bt_metric *x = m->head; x; x = x->next) {
        if (!prev || strcmp(prev, x->name)) {
            sb_printf(&s, "# HELP %s_%s %s\n# TYPE %s_%s %s\n", m->prefix, x->name, x->help, m->prefix,
                      x->name, types[x->kind]);
            prev = x->name;
        }
        char num[64];
        if (x->kind != KIND_HISTOGRAM) {
            fmt_num(num, sizeof num, x->v);
            sb_printf(&s, "%s_%s", m->prefix, x->name);
            labels(&s, x, NULL, NULL);
            sb_printf(&s, " %s\n", num);
            continue;
        }
        unsigned long long cum = 0;
        for (int i = 0; i <= x->n_bounds; i++) {
            cum += x->counts[i];
            char le[64];
            if (i < x->n_bounds)
                fmt_num(le, sizeof le, x->bounds[i]);
            else
                snprintf(le, sizeof le, "+Inf");
            sb_printf(&s, "%s_%s_bucket", m->prefix, x->name);
            labels(&s, x, "le", le);
            sb_printf(&s, " %llu\n", cum);
        }
        fmt_num(num, sizeof num, x->sum);
        sb_printf(&s, "%s_%s_sum", m->prefix, x->name);
        labels(&s, x, NULL, NULL);
        sb_printf(&s, " %s\n%s_%s_count", num, m->prefix, x->name);
        labels(&s, x, NULL, NULL);
        sb_printf(&s, " %llu\n", x->count);
    }
    return s.buf;
}

/* Prometheus metrics: counters, gauges and histograms with fixed label sets, rendered in the
 * text exposition format (version 0.0.4). One registry per service object; single-threaded
 * (the service's loop thread updates and renders).
 *
 *   bt_metrics_t *m = bt_metrics_create("baton_decode");
 *   bt_counter_t *done = bt_metrics_counter(m, "requests_total", "Requests finished", "reason", "stop");
 *   bt_histogram_t *ttft = bt_metrics_histogram(m, "ttft_seconds", "Time to first token",
 *                                               bt_metrics_latency_buckets, NULL, NULL);
 *   bt_counter_add(done, 1);  bt_histogram_observe(ttft, 0.031);
 *   char *text = bt_metrics_render(m);   // malloc'd
 *   bt_metrics_destroy(m);
 *
 * Metrics of one name share help and type; each (name, label value) pair is one series. */
#ifndef BT_METRICS_H
#define BT_METRICS_H

#include <stddef.h>

typedef struct bt_metrics bt_metrics_t;
typedef struct bt_metric bt_counter_t;
typedef struct bt_metric bt_gauge_t;
typedef struct bt_metric bt_histogram_t;

/* Latency buckets in seconds, 1 ms .. 60 s, terminated by a negative value. */
extern const double bt_metrics_latency_buckets[];

bt_metrics_t *bt_metrics_create(const char *prefix);
void bt_metrics_destroy(bt_metrics_t *m);

/* label may be NULL (no label). The same (name, label, value) returns the same series. */
bt_counter_t *bt_metrics_counter(bt_metrics_t *m, const char *name, const char *help,
                                 const char *label, const char *value);
bt_gauge_t *bt_metrics_gauge(bt_metrics_t *m, const char *name, const char *help,
                             const char *label, const char *value);
bt_histogram_t *bt_metrics_histogram(bt_metrics_t *m, const char *name, const char *help,
                                     const double *buckets, const char *label, const char *value);

void bt_counter_add(bt_counter_t *c, double v);
void bt_gauge_set(bt_gauge_t *g, double v);
void bt_histogram_observe(bt_histogram_t *h, double v);

/* The whole registry in Prometheus text format; caller frees. */
char *bt_metrics_render(const bt_metrics_t *m);

#endif

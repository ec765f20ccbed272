#include "bt_test.h"

#include "common/metrics.h"

#include <string.h>

static void test_render(void)
{
    bt_metrics_t *m = bt_metrics_create("baton_test");
    bt_counter_t *a = bt_metrics_counter(m, "requests_total", "Requests", "reason", "stop");
    bt_gauge_t *g = bt_metrics_gauge(m, "running", "Running requests", NULL, NULL);
    bt_counter_t *b = bt_metrics_counter(m, "requests_total", "Requests", "reason", "len\"gth");
    bt_histogram_t *h = bt_metrics_histogram(m, "ttft_seconds", "TTFT", bt_metrics_latency_buckets, NULL, NULL);
    BT_CHECK(bt_metrics_counter(m, "requests_total", "Requests", "reason", "stop") == a);
    bt_counter_add(a, 2);
    bt_counter_add(b, 1);
    bt_counter_add(a, -5); /* counters never go down */
    bt_gauge_set(g, 3);
    bt_histogram_observe(h, 0.002);
    bt_histogram_observe(h, 100.0);
    char *t = bt_metrics_render(m);
    BT_CHECK(strstr(t, "# TYPE baton_test_requests_total counter\n") != NULL);
    BT_CHECK(strstr(t, "baton_test_requests_total{reason=\"stop\"} 2\n") != NULL);
    BT_CHECK(strstr(t, "baton_test_requests_total{reason=\"len\\\"gth\"} 1\n") != NULL);
    /* HELP/TYPE once per name even with series added later */
    BT_CHECK(strstr(strstr(t, "# HELP baton_test_requests_total") + 1, "# HELP baton_test_requests_total") == NULL);
    BT_CHECK(strstr(t, "baton_test_running 3\n") != NULL);
    BT_CHECK(strstr(t, "baton_test_ttft_seconds_bucket{le=\"0.001\"} 0\n") != NULL);
    BT_CHECK(strstr(t, "baton_test_ttft_seconds_bucket{le=\"0.0025\"} 1\n") != NULL);
    BT_CHECK(strstr(t, "baton_test_ttft_seconds_bucket{le=\"+Inf\"} 2\n") != NULL);
    BT_CHECK(strstr(t, "baton_test_ttft_seconds_count 2\n") != NULL);
    free(t);
    bt_metrics_destroy(m);
}

int main(void)
{
    BT_RUN(test_render);
    return bt_test_summary();
}

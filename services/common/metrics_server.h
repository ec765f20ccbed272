/* /metrics (Prometheus text) over HTTP for a service: a small bt_http server beside its gRPC
 * port. `refresh` runs before each render so gauges show the current state.
 *
 *   bt_metrics_server_t *ms;
 *   bt_metrics_server_start(loop, "127.0.0.1", 0, metrics, refresh_fn, ctx, &ms);
 *   printf("metrics on %s:%d\n", host, bt_metrics_server_port(ms));
 */
#ifndef BT_SERVICES_METRICS_SERVER_H
#define BT_SERVICES_METRICS_SERVER_H

#include "common/metrics.h"
#include "common/status.h"

#include <uv.h>

typedef struct bt_metrics_server bt_metrics_server_t;

bt_status_t bt_metrics_server_start(uv_loop_t *loop, const char *host, int port, bt_metrics_t *metrics,
                                    void (*refresh)(void *ctx), void *ctx, bt_metrics_server_t **ms_p);
int bt_metrics_server_port(const bt_metrics_server_t *ms);
void bt_metrics_server_stop(bt_metrics_server_t *ms);

#endif

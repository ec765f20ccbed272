#include "services/common/metrics_server.h"

#include "common/alloc.h"
#include "common/http/http.h"

#include <stdlib.h>
#include <string.h>

struct bt_metrics_server {
    bt_http_server_t *http;
    bt_metrics_t *metrics;
    void (*refresh)(void *ctx);
    void *ctx;
};

static void on_request(void *ctx, bt_http_request_t *req)
{
    bt_metrics_server_t *ms = ctx;
    if (strcmp(bt_http_path(req), "/metrics") != 0) {
        static const char body[] = "{\"error\":{\"message\":\"only /metrics here\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":404}}";
        bt_http_respond(req, 404, "application/json", body, sizeof body - 1);
        return;
    }
    if (ms->refresh) ms->refresh(ms->ctx);
    char *text = bt_metrics_render(ms->metrics);
    bt_http_respond(req, 200, "text/plain; version=0.0.4", text, strlen(text));
    free(text);
}

bt_status_t bt_metrics_server_start(uv_loop_t *loop, const char *host, int port, bt_metrics_t *metrics,
                                    void (*refresh)(void *ctx), void *ctx, bt_metrics_server_t **ms_p)
{
    bt_metrics_server_t *ms = bt_calloc_or_die(1, sizeof *ms);
    ms->metrics = metrics;
    ms->refresh = refresh;
    ms->ctx = ctx;
    bt_http_limits_t lim = bt_http_limits_default();
    lim.max_body_bytes = 4096;
    lim.max_connections = 64;
    bt_status_t st = bt_http_server_create(loop, host, port, &lim, on_request, ms, &ms->http);
    if (st != BT_OK) {
        free(ms);
        return st;
    }
    *ms_p = ms;
    return BT_OK;
}

int bt_metrics_server_port(const bt_metrics_server_t *ms)
{
    return bt_http_server_port(ms->http);
}

static void on_closed(void *ctx)
{
    free(ctx);
}

void bt_metrics_server_stop(bt_metrics_server_t *ms)
{
    if (!ms) return;
    bt_http_server_close(ms->http, on_closed, ms);
}

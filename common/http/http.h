/* An HTTP/1.1 server on libuv with llhttp (Debian's node-llhttp ships the generated C), for
 * the OpenAI-compatible gateway. Keep-alive, chunked responses (SSE), limits and timeouts.
 *
 *   bt_http_server_t *srv;
 *   bt_http_limits_t lim = bt_http_limits_default();
 *   bt_http_server_create(loop, "127.0.0.1", 8888, &lim, on_request, ctx, &srv);
 *   on_request(ctx, req):  method, path, headers, body are complete here;
 *       bt_http_respond(req, 200, "application/json", body, len);           // one shot
 *     or
 *       bt_http_stream_begin(req, 200, "text/event-stream");                // chunked
 *       bt_http_stream_write(req, "data: {...}\n\n", n);  ...
 *       bt_http_stream_end(req);
 *       bt_http_on_close(req, on_gone, ctx);   // the client went away mid-stream
 *   bt_http_server_close(srv, on_closed, ctx);
 *
 * Malformed requests are answered by the server itself (400, 405 only by the handler, 413
 * body too large, 431 headers too large or too many, 408 on the read timeouts) with a
 * small JSON body from bt_http_limits_t.error_body, or a default. */
#ifndef BT_HTTP_H
#define BT_HTTP_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct {
    size_t max_header_bytes;   /* request line + headers; default 16 KiB -> 431 */
    int max_headers;           /* default 100 -> 431 */
    size_t max_body_bytes;     /* default 8 MiB -> 413 */
    int header_timeout_ms;     /* whole head must arrive within; default 10000 -> 408 */
    int body_timeout_ms;       /* body must arrive within; default 30000 -> 408 */
    int idle_timeout_ms;       /* keep-alive idle; default 60000 (close quietly) */
    int send_timeout_ms;       /* output pending and none of it taken by the client for this
                                  long: closed (on_close); default 60000 */
    int max_connections;       /* default 4096; beyond it new sockets are closed at once */
    /* The client's end of input while its request is being answered means it is gone (the
     * answer is dropped and on_close fires), as most HTTP servers take it; false (default):
     * a half-closed client still gets its answer. */
    bool eof_cancels;
    /* Builds the JSON body of an error the server answers on its own (status, message);
     * NULL uses {"error": {"message": ..., "type": ..., "code": status}}. Returns malloc'd. */
    char *(*error_body)(int status, const char *message);
} bt_http_limits_t; /* fields left 0 (or NULL limits) take the defaults */

bt_http_limits_t bt_http_limits_default(void);

typedef struct bt_http_server bt_http_server_t;
typedef struct bt_http_request bt_http_request_t;

typedef struct {
    const char *name, *value; /* NUL-terminated, as received (name case kept) */
} bt_http_header_t;

/* A complete request. The handler must answer it exactly once (respond or stream_begin ...
 * stream_end; after a stream_begin, stream_end closes it even when it returned
 * BT_ERR_CANCELLED); req stays valid until then, or until on_close fires. All calls on the
 * loop's thread. */
typedef void (*bt_http_handler_fn)(void *ctx, bt_http_request_t *req);

bt_status_t bt_http_server_create(uv_loop_t *loop, const char *host, int port,
                                  const bt_http_limits_t *limits, bt_http_handler_fn fn,
                                  void *ctx, bt_http_server_t **srv_p);
int bt_http_server_port(const bt_http_server_t *srv); /* the bound port (port 0 picks one) */
/* Stops accepting, closes idle connections, lets answered ones finish (their queued output
 * sent, within send_timeout_ms of no progress), then on_closed. */
void bt_http_server_close(bt_http_server_t *srv, void (*on_closed)(void *ctx), void *ctx);

const char *bt_http_method(const bt_http_request_t *req);  /* "GET", "POST", ... */
const char *bt_http_path(const bt_http_request_t *req);    /* "/v1/models" (query stripped) */
const char *bt_http_query(const bt_http_request_t *req);   /* after '?', "" when none */
/* Case-insensitive lookup; NULL when absent. */
const char *bt_http_header(const bt_http_request_t *req, const char *name);
size_t bt_http_header_count(const bt_http_request_t *req);
const bt_http_header_t *bt_http_header_at(const bt_http_request_t *req, size_t i);
const uint8_t *bt_http_body(const bt_http_request_t *req, size_t *len_p);
const char *bt_http_peer(const bt_http_request_t *req);

/* Extra response headers for the next respond/stream_begin (e.g. "WWW-Authenticate"); copied.
 * Content-Length, Transfer-Encoding, Connection and values with CR/LF are refused (logged). */
void bt_http_add_header(bt_http_request_t *req, const char *name, const char *value);
bt_status_t bt_http_respond(bt_http_request_t *req, int status, const char *content_type,
                            const void *body, size_t len);
bt_status_t bt_http_stream_begin(bt_http_request_t *req, int status, const char *content_type);
/* BT_ERR_CANCELLED once the client is gone. Bytes are copied. */
bt_status_t bt_http_stream_write(bt_http_request_t *req, const void *data, size_t len);
bt_status_t bt_http_stream_end(bt_http_request_t *req);
/* Called once when the connection closes before the answer is complete (never after the
 * handler's final respond/stream_end, even one that returned BT_ERR_CANCELLED); after it req
 * is gone and must not be used. It fires from a libuv callback, never from inside a bt_http_*
 * call. Register it from the handler, before it returns. (Registered on a request whose
 * connection is already gone, fn runs at once and req is freed.) Without it, a request whose
 * connection went away stays allocated until the handler's bt_http_respond/stream_end, which
 * then return BT_ERR_CANCELLED and free it.
 * A client that half-closes (shutdown of its write side after a complete request) still gets
 * its answer; a client that closed both sides is noticed at the next write. */
void bt_http_on_close(bt_http_request_t *req, void (*fn)(void *ctx), void *ctx);

/* Parser entry point for fuzzing: feeds bytes through the request parser with the limits,
 * returns the status the server would answer with (200 when a complete valid request was
 * parsed, 0 when it needs more bytes). */
int bt_http_parse_probe(const uint8_t *data, size_t len, const bt_http_limits_t *limits);

#endif

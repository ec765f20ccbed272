/* HTTP/1.1 server on libuv + llhttp. See http.h for the interface.
 *
 * One connection parses one request at a time: when llhttp completes a message, the parser is
 * paused and the request handed to the handler; bytes that arrive meanwhile (pipelined
 * requests) wait in the connection's input buffer, and reading stops when that buffer is full.
 * Reading otherwise goes on while a request is answered, so that a reset is noticed at once.
 *
 * A read of EOF while an answer is in progress is a half-close: the answer still goes out
 * (and any pipelined requests already received are answered too). A client that closed both
 * sides is noticed by the next write failing; a reset (ECONNRESET) is noticed by the read.
 * Either way the request's on_close fires once, from a libuv callback, never from inside a
 * bt_http_* call the handler made.
 *
 * One timer per connection serves, by turns: the head deadline (from the first byte of a
 * request, or from accept), the body deadline, the keep-alive idle time, a zero-delay kick
 * (next pipelined request, deferred abort) and the linger after a graceful close. */
#include "common/http/http.h"

#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <llhttp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define READ_BUF_SIZE (64 * 1024)
#define IN_BUF_MAX (256 * 1024)            /* buffered unparsed input before reading stops */
#define PIPELINE_WATERMARK (64 * 1024)     /* unsent output before pipelined parsing waits */
#define MAX_QUEUED_BYTES (4 * 1024 * 1024) /* unsent stream output before the client is cut */
#define LINGER_MS 2000                     /* discard input this long after a graceful close */

/* ---- small growable buffer ---------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static bool buf_reserve(buf_t *b, size_t extra)
{
    if (extra <= b->cap - b->len) return true;
    if (extra > SIZE_MAX / 2 - b->len) return false;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool buf_append(buf_t *b, const void *data, size_t len)
{
    if (!buf_reserve(b, len + 1)) return false;
    if (len) memcpy(b->p + b->len, data, len);
    b->len += len;
    b->p[b->len] = '\0';
    return true;
}

static bool buf_str(buf_t *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

static bool buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool buf_printf(buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !buf_reserve(b, (size_t)n + 1)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

static void buf_free(buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- types -------------------------------------------------------------------------------- */

typedef enum { T_NONE, T_HEAD, T_BODY, T_IDLE, T_KICK, T_LINGER } timer_kind_t;

typedef struct conn conn_t;

typedef struct {
    uint32_t name_off, value_off;
} hdr_off_t;

typedef struct extra_hdr {
    struct extra_hdr *next;
    char *name, *value;
} extra_hdr_t;

struct bt_http_request {
    conn_t *conn; /* NULL once the connection is gone (a zombie awaiting its answer call) */
    char method[24];
    char peer[64];
    buf_t url;
    char *path, *query; /* malloc'd at headers_complete */
    buf_t hbuf;         /* "name\0value\0..." */
    hdr_off_t *hoffs;
    size_t nhdr, hoffs_cap;
    bt_http_header_t *headers;
    bool last_was_value;
    bool head_done, complete, dispatched, streaming, chunked_out, head_method;
    bool keep_alive, http10;
    size_t head_bytes; /* request line + header bytes counted through the callbacks */
    buf_t body;
    extra_hdr_t *extra;
    void (*on_close)(void *ctx);
    void *on_close_ctx;
};

struct conn {
    uv_tcp_t tcp; /* first: the handle's data points back here anyway */
    uv_timer_t timer;
    /* while output is pending: fires every send_timeout_ms, and closes the connection when
     * the client took none of it since the last time (a reader that stopped reading) */
    uv_timer_t send_timer;
    uint64_t bytes_queued; /* ever, by conn_writev */
    uint64_t sent_at_check;
    uv_shutdown_t shutdown_req;
    bt_http_server_t *srv;
    conn_t *prev, *next;
    llhttp_t parser;
    char peer[64];
    buf_t in;
    size_t in_off;
    bt_http_request_t *req;
    timer_kind_t timer_kind;
    size_t raw_head; /* bytes fed while the head was incomplete */
    int pending_writes;
    int handles_open;
    int err_status; /* set by a parser callback that refuses the request */
    const char *err_msg;
    uint64_t served;
    bool probe;       /* bt_http_parse_probe: no socket, no timers */
    int probe_status; /* first answer the probe would give */
    bool reading, peer_eof, in_process, force_close;
    bool dead;    /* answers return BT_ERR_CANCELLED; the close is pending */
    bool ending;  /* graceful close: flush, shutdown, linger */
    bool closing; /* uv_close issued */
};

struct bt_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    bt_http_limits_t lim;
    llhttp_settings_t settings;
    bt_http_handler_fn fn;
    void *ctx;
    conn_t *conns;
    int nconns;
    int port;
    bool listening, closing, listener_closed;
    void (*on_closed)(void *ctx);
    void *on_closed_ctx;
    char read_buf[READ_BUF_SIZE];
};

typedef struct {
    uv_write_t w;
    conn_t *c;
    size_t len;
    char data[];
} wreq_t;

/* ---- limits and error bodies -------------------------------------------------------------- */

bt_http_limits_t bt_http_limits_default(void)
{
    bt_http_limits_t l = {
        .max_header_bytes = 16 * 1024,
        .max_headers = 100,
        .max_body_bytes = 8 * 1024 * 1024,
        .header_timeout_ms = 10000,
        .body_timeout_ms = 30000,
        .idle_timeout_ms = 60000,
        .send_timeout_ms = 60000,
        .max_connections = 4096,
        .error_body = NULL,
    };
    return l;
}

static bt_http_limits_t limits_resolve(const bt_http_limits_t *in)
{
    bt_http_limits_t d = bt_http_limits_default();
    if (!in) return d;
    bt_http_limits_t l = *in;
    if (l.max_header_bytes == 0) l.max_header_bytes = d.max_header_bytes;
    if (l.max_headers <= 0) l.max_headers = d.max_headers;
    if (l.max_body_bytes == 0) l.max_body_bytes = d.max_body_bytes;
    if (l.header_timeout_ms <= 0) l.header_timeout_ms = d.header_timeout_ms;
    if (l.body_timeout_ms <= 0) l.body_timeout_ms = d.body_timeout_ms;
    if (l.idle_timeout_ms <= 0) l.idle_timeout_ms = d.idle_timeout_ms;
    if (l.send_timeout_ms <= 0) l.send_timeout_ms = d.send_timeout_ms;
    if (l.max_connections <= 0) l.max_connections = d.max_connections;
    return l;
}

static const struct {
    int status;
    const char *reason;
} reasons[] = {
    {100, "Continue"},
    {200, "OK"},
    {201, "Created"},
    {202, "Accepted"},
    {204, "No Content"},
    {301, "Moved Permanently"},
    {302, "Found"},
    {304, "Not Modified"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {408, "Request Timeout"},
    {409, "Conflict"},
    {413, "Payload Too Large"},
    {415, "Unsupported Media Type"},
    {417, "Expectation Failed"},
    {422, "Unprocessable Entity"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {499, "Client Closed Request"},
    {500, "Internal Server Error"},
    {501, "Not Implemented"},
    {502, "Bad Gateway"},
    {503, "Service Unavailable"},
    {504, "Gateway Timeout"},
};

static const char *reason_phrase(int status)
{
    for (size_t i = 0; i < sizeof reasons / sizeof *reasons; i++)
        if (reasons[i].status == status) return reasons[i].reason;
    return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
}

static char *default_error_body(int status, const char *message)
{
    buf_t b = {0};
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    bool ok = buf_str(&b, "{\"error\":{\"message\":\"");
    for (const unsigned char *s = (const unsigned char *)message; ok && *s; s++) {
        if (*s == '"' || *s == '\\')
            ok = buf_printf(&b, "\\%c", *s);
        else if (*s < 0x20)
            ok = buf_printf(&b, "\\u%04x", *s);
        else
            ok = buf_append(&b, s, 1);
    }
    ok = ok && buf_printf(&b, "\",\"type\":\"%s\",\"code\":%d}}", type, status);
    if (!ok) {
        buf_free(&b);
        return NULL;
    }
    return b.p;
}

/* ---- requests ----------------------------------------------------------------------------- */

static void req_free(bt_http_request_t *req)
{
    if (!req) return;
    buf_free(&req->url);
    buf_free(&req->hbuf);
    buf_free(&req->body);
    free(req->path);
    free(req->query);
    free(req->hoffs);
    free(req->headers);
    for (extra_hdr_t *e = req->extra, *n; e; e = n) {
        n = e->next;
        free(e->name);
        free(e->value);
        free(e);
    }
    free(req);
}

static void extra_clear(bt_http_request_t *req)
{
    for (extra_hdr_t *e = req->extra, *n; e; e = n) {
        n = e->next;
        free(e->name);
        free(e->value);
        free(e);
    }
    req->extra = NULL;
}

/* ---- connection plumbing ------------------------------------------------------------------ */

static void conn_close(conn_t *c);
static void conn_end(conn_t *c);
static void conn_process(conn_t *c);
static void conn_read_start(conn_t *c);
static void on_timer(uv_timer_t *t);
static void on_send_timer(uv_timer_t *t);

static void timer_set(conn_t *c, timer_kind_t kind, int ms)
{
    if (c->probe || c->closing) return;
    c->timer_kind = kind;
    if (kind == T_NONE) {
        uv_timer_stop(&c->timer);
        return;
    }
    uv_timer_start(&c->timer, on_timer, (uint64_t)(ms < 0 ? 0 : ms), 0);
}

static size_t queued_bytes(const conn_t *c)
{
    if (c->probe) return 0;
    return uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
}

static void maybe_finish_server(bt_http_server_t *srv)
{
    if (srv->closing && srv->listener_closed && srv->nconns == 0) {
        void (*fn)(void *) = srv->on_closed;
        void *ctx = srv->on_closed_ctx;
        free(srv);
        if (fn) fn(ctx);
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->handles_open > 0) return;
    bt_http_server_t *srv = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    srv->nconns--;
    buf_free(&c->in);
    free(c);
    maybe_finish_server(srv);
}

static void on_write(uv_write_t *w, int status)
{
    wreq_t *wr = (wreq_t *)w;
    conn_t *c = wr->c;
    free(wr);
    c->pending_writes--;
    if (c->closing) return;
    if (status < 0) {
        BT_LOG_DEBUG("http %s: write failed: %s", c->peer, uv_strerror(status));
        conn_close(c);
        return;
    }
    if (c->ending && c->pending_writes == 0) {
        conn_end(c);
        return;
    }
    /* pipelined input waits for the output to drain below the watermark */
    if (!c->dead && !c->ending && !c->req && c->in.len > c->in_off &&
        queued_bytes(c) <= PIPELINE_WATERMARK)
        timer_set(c, T_KICK, 0);
}

/* Queues the concatenation of n parts (copied, one uv_write). Probes drop them. */
static bool conn_writev(conn_t *c, const uv_buf_t *parts, int n)
{
    if (c->probe) return true;
    if (c->closing || c->dead) return false;
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += parts[i].len;
    if (len > UINT_MAX) return false;
    wreq_t *wr = malloc(sizeof *wr + len);
    if (!wr) return false;
    wr->c = c;
    wr->len = len;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (parts[i].len) memcpy(wr->data + off, parts[i].base, parts[i].len);
        off += parts[i].len;
    }
    uv_buf_t ub = uv_buf_init(wr->data, (unsigned)len);
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &ub, 1, on_write);
    if (rc < 0) {
        free(wr);
        BT_LOG_DEBUG("http %s: uv_write: %s", c->peer, uv_strerror(rc));
        return false;
    }
    c->pending_writes++;
    c->bytes_queued += len;
    if (!uv_is_active((uv_handle_t *)&c->send_timer)) {
        c->sent_at_check = c->bytes_queued - queued_bytes(c);
        uv_timer_start(&c->send_timer, on_send_timer, (uint64_t)c->srv->lim.send_timeout_ms,
                       (uint64_t)c->srv->lim.send_timeout_ms);
    }
    return true;
}

static void on_send_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (c->closing) return;
    if (c->pending_writes == 0) {
        uv_timer_stop(t);
        return;
    }
    /* bytes the kernel took: what was queued less what libuv still holds */
    const uint64_t sent = c->bytes_queued - queued_bytes(c);
    if (sent > c->sent_at_check) {
        c->sent_at_check = sent;
        return;
    }
    BT_LOG_DEBUG("http %s: the client took no output for %d ms; closing", c->peer,
                 c->srv->lim.send_timeout_ms);
    conn_close(c);
}

static bool conn_write(conn_t *c, const void *a, size_t alen, const void *b, size_t blen)
{
    uv_buf_t parts[2] = {uv_buf_init((char *)a, (unsigned)alen),
                         uv_buf_init((char *)b, (unsigned)blen)};
    parts[0].len = alen; /* uv_buf_init takes unsigned; keep full size_t lengths */
    parts[1].len = blen;
    return conn_writev(c, parts, 2);
}

/* Closes the socket now. A request still being answered fires its on_close, then is freed;
 * one without on_close stays as a zombie until the handler answers it. */
static void conn_close(conn_t *c)
{
    if (c->closing) return;
    c->closing = true;
    c->dead = true;
    bt_http_request_t *req = c->req;
    c->req = NULL;
    if (req) {
        req->conn = NULL;
        if (!req->dispatched) {
            req_free(req);
        } else if (req->on_close) {
            void (*fn)(void *) = req->on_close;
            req->on_close = NULL;
            fn(req->on_close_ctx);
            req_free(req);
        }
        /* else: zombie, freed by bt_http_respond / bt_http_stream_end */
    }
    if (c->probe) return;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_timer_stop(&c->send_timer);
    uv_close((uv_handle_t *)&c->send_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

/* Marks the connection dead now and closes it from the next loop turn (used from inside
 * calls the handler makes, where on_close must not run). */
static void conn_abort_deferred(conn_t *c)
{
    if (c->dead) return;
    c->dead = true;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
    c->timer_kind = T_KICK;
    uv_timer_start(&c->timer, on_timer, 0, 0);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    conn_t *c = sr->data;
    if (c->closing) return;
    if (status < 0 || c->peer_eof) {
        conn_close(c);
        return;
    }
    /* linger: read and discard what the client still sends, so that closing with unread
     * input does not turn into a reset that destroys the answer in flight */
    conn_read_start(c);
    timer_set(c, T_LINGER, LINGER_MS);
}

/* Graceful close: after the queued output is written, shut down our side, linger, close. */
static void conn_end(conn_t *c)
{
    if (c->closing) return;
    if (c->probe) {
        c->ending = true;
        return;
    }
    if (c->ending && c->timer_kind == T_LINGER) return;
    c->ending = true;
    timer_set(c, T_NONE, 0);
    if (c->pending_writes > 0) return; /* on_write comes back here */
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_close(c);
        return;
    }
    c->timer_kind = T_LINGER; /* shutdown in flight; on_shutdown arms the timer */
}

/* An error the server answers on its own, then closes (gracefully). */
static void send_error(conn_t *c, int status, const char *message)
{
    if (c->probe) {
        if (!c->probe_status) c->probe_status = status;
        c->ending = true;
        return;
    }
    if (c->closing || c->dead || c->ending) return;
    char *body = c->srv->lim.error_body ? c->srv->lim.error_body(status, message) : NULL;
    if (!body) body = default_error_body(status, message);
    size_t blen = body ? strlen(body) : 0;
    buf_t h = {0};
    bool ok = buf_printf(&h,
                         "HTTP/1.1 %d %s\r\nServer: baton\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         status, reason_phrase(status), blen);
    if (ok) conn_write(c, h.p, h.len, body, blen);
    buf_free(&h);
    free(body);
    BT_LOG_DEBUG("http %s: %d %s", c->peer, status, message);
    /* a request being parsed is dropped; one being answered cannot get here */
    if (c->req && !c->req->dispatched) {
        req_free(c->req);
        c->req = NULL;
    }
    conn_end(c);
}

/* ---- parser callbacks --------------------------------------------------------------------- */

static int refuse(conn_t *c, int status, const char *msg)
{
    c->err_status = status;
    c->err_msg = msg;
    return -1;
}

static bool head_grow(conn_t *c, size_t n)
{
    bt_http_request_t *req = c->req;
    req->head_bytes += n;
    return req->head_bytes <= c->srv->lim.max_header_bytes;
}

static int cb_message_begin(llhttp_t *p)
{
    conn_t *c = p->data;
    if (c->req) return refuse(c, 400, "unexpected request"); /* cannot happen: paused */
    bt_http_request_t *req = calloc(1, sizeof *req);
    if (!req) return refuse(c, 503, "out of memory");
    req->conn = c;
    memcpy(req->peer, c->peer, sizeof req->peer);
    c->req = req;
    c->raw_head = 0;
    timer_set(c, T_HEAD, c->srv->lim.header_timeout_ms);
    return 0;
}

static int cb_url(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (!head_grow(c, len)) return refuse(c, 431, "request line and headers too large");
    if (!buf_append(&c->req->url, at, len)) return refuse(c, 503, "out of memory");
    return 0;
}

static int cb_header_field(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    bt_http_request_t *req = c->req;
    if (!head_grow(c, len)) return refuse(c, 431, "request headers too large");
    if (req->head_done) return 0; /* chunked trailers: counted, not kept */
    if (req->nhdr == 0 || req->last_was_value) {
        if (req->nhdr >= (size_t)c->srv->lim.max_headers)
            return refuse(c, 431, "too many request headers");
        if (req->nhdr == req->hoffs_cap) {
            size_t cap = req->hoffs_cap ? req->hoffs_cap * 2 : 16;
            hdr_off_t *o = realloc(req->hoffs, cap * sizeof *o);
            if (!o) return refuse(c, 503, "out of memory");
            req->hoffs = o;
            req->hoffs_cap = cap;
        }
        if (req->nhdr > 0 && !buf_append(&req->hbuf, "", 1)) /* ends the previous value */
            return refuse(c, 503, "out of memory");
        req->hoffs[req->nhdr].name_off = (uint32_t)req->hbuf.len;
        req->hoffs[req->nhdr].value_off = UINT32_MAX;
        req->nhdr++;
        req->last_was_value = false;
        if (!head_grow(c, 4)) return refuse(c, 431, "request headers too large"); /* ": " CRLF */
    }
    if (!buf_append(&req->hbuf, at, len)) return refuse(c, 503, "out of memory");
    return 0;
}

static int cb_header_value(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    bt_http_request_t *req = c->req;
    if (!head_grow(c, len)) return refuse(c, 431, "request headers too large");
    if (req->head_done) return 0;
    if (req->nhdr == 0) return refuse(c, 400, "header value without a name");
    if (!req->last_was_value) {
        if (!buf_append(&req->hbuf, "", 1)) return refuse(c, 503, "out of memory");
        req->hoffs[req->nhdr - 1].value_off = (uint32_t)req->hbuf.len;
        req->last_was_value = true;
    }
    if (!buf_append(&req->hbuf, at, len)) return refuse(c, 503, "out of memory");
    return 0;
}

static const char *req_header(const bt_http_request_t *req, const char *name)
{
    for (size_t i = 0; i < req->nhdr; i++)
        if (strcasecmp(req->headers[i].name, name) == 0) return req->headers[i].value;
    return NULL;
}

static bool split_url(bt_http_request_t *req)
{
    const char *u = req->url.p ? req->url.p : "";
    /* absolute-form (proxies): drop scheme and authority */
    if (strncasecmp(u, "http://", 7) == 0 || strncasecmp(u, "https://", 8) == 0) {
        const char *s = strstr(u, "//") + 2;
        const char *slash = strpbrk(s, "/?");
        u = slash ? slash : "";
    }
    const char *q = strchr(u, '?');
    size_t plen = q ? (size_t)(q - u) : strlen(u);
    const char *h = memchr(u, '#', plen);
    if (h) plen = (size_t)(h - u);
    if (plen == 0) {
        req->path = strdup("/");
    } else {
        req->path = malloc(plen + 1);
        if (req->path) {
            memcpy(req->path, u, plen);
            req->path[plen] = '\0';
        }
    }
    if (q) {
        const char *qe = strchr(q + 1, '#');
        size_t qlen = qe ? (size_t)(qe - q - 1) : strlen(q + 1);
        req->query = malloc(qlen + 1);
        if (req->query) {
            memcpy(req->query, q + 1, qlen);
            req->query[qlen] = '\0';
        }
    } else {
        req->query = strdup("");
    }
    return req->path && req->query;
}

static int cb_headers_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    bt_http_request_t *req = c->req;
    const bt_http_limits_t *lim = &c->srv->lim;
    req->head_done = true;
    if (req->nhdr > 0 && req->hoffs[req->nhdr - 1].value_off == UINT32_MAX) {
        if (!buf_append(&req->hbuf, "", 1)) return refuse(c, 503, "out of memory");
        req->hoffs[req->nhdr - 1].value_off = (uint32_t)req->hbuf.len;
    }
    if (!buf_append(&req->hbuf, "", 0)) return refuse(c, 503, "out of memory"); /* NUL */
    if (req->nhdr) {
        req->headers = malloc(req->nhdr * sizeof *req->headers);
        if (!req->headers) return refuse(c, 503, "out of memory");
        for (size_t i = 0; i < req->nhdr; i++) {
            req->headers[i].name = req->hbuf.p + req->hoffs[i].name_off;
            req->headers[i].value = req->hbuf.p + req->hoffs[i].value_off;
        }
    }
    const char *m = llhttp_method_name((llhttp_method_t)llhttp_get_method(p));
    snprintf(req->method, sizeof req->method, "%s", m ? m : "UNKNOWN");
    req->head_method = strcmp(req->method, "HEAD") == 0;
    req->http10 = llhttp_get_http_major(p) == 1 && llhttp_get_http_minor(p) == 0;
    if (llhttp_get_http_major(p) != 1) return refuse(c, 400, "unsupported HTTP version");
    if (!head_grow(c, strlen(req->method) + 12)) /* " ", " HTTP/1.1", CRLF, CRLF */
        return refuse(c, 431, "request line and headers too large");
    if (!split_url(req)) return refuse(c, 503, "out of memory");
    if (!req->url.len) return refuse(c, 400, "empty request target");

    bool chunked = (p->flags & F_CHUNKED) != 0;
    bool has_len = (p->flags & F_CONTENT_LENGTH) != 0;
    if (has_len && p->content_length > (uint64_t)lim->max_body_bytes)
        return refuse(c, 413, "request body too large");
    const char *expect = req_header(req, "Expect");
    if (expect && !req->http10) {
        if (strcasecmp(expect, "100-continue") != 0)
            return refuse(c, 417, "unsupported Expect header");
        if (chunked || (has_len && p->content_length > 0)) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            conn_write(c, cont, sizeof cont - 1, NULL, 0);
        }
    }
    if (has_len && p->content_length > 0) {
        if (!buf_reserve(&req->body, (size_t)p->content_length + 1))
            return refuse(c, 503, "out of memory");
    }
    if (chunked || (has_len && p->content_length > 0))
        timer_set(c, T_BODY, lim->body_timeout_ms);
    else
        timer_set(c, T_NONE, 0);
    return 0;
}

static int cb_body(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    bt_http_request_t *req = c->req;
    if (len > c->srv->lim.max_body_bytes - req->body.len)
        return refuse(c, 413, "request body too large");
    if (!buf_append(&req->body, at, len)) return refuse(c, 503, "out of memory");
    return 0;
}

static int cb_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    bt_http_request_t *req = c->req;
    req->complete = true;
    req->keep_alive = llhttp_should_keep_alive(p) != 0;
    if (llhttp_get_upgrade(p)) c->force_close = true;
    if (!req->body.p && !buf_append(&req->body, "", 0)) return refuse(c, 503, "out of memory");
    return HPE_PAUSED;
}

static void settings_init(llhttp_settings_t *s)
{
    llhttp_settings_init(s);
    s->on_message_begin = cb_message_begin;
    s->on_url = cb_url;
    s->on_header_field = cb_header_field;
    s->on_header_value = cb_header_value;
    s->on_headers_complete = cb_headers_complete;
    s->on_body = cb_body;
    s->on_message_complete = cb_message_complete;
}

/* ---- input processing --------------------------------------------------------------------- */

static void dispatch(conn_t *c)
{
    bt_http_request_t *req = c->req;
    req->dispatched = true;
    c->served++;
    if (c->probe) {
        if (!c->probe_status) c->probe_status = 200;
        c->req = NULL;
        req_free(req);
        return;
    }
    timer_set(c, T_NONE, 0);
    c->srv->fn(c->srv->ctx, req);
}

static void conn_process(conn_t *c)
{
    if (c->in_process) return;
    c->in_process = true;
    const bt_http_limits_t *lim = &c->srv->lim;
    while (!c->closing && !c->dead && !c->ending) {
        if (c->req && c->req->dispatched) break;
        /* no new request while the answers before it sit unsent */
        if (!c->req && queued_bytes(c) > PIPELINE_WATERMARK) break;
        size_t avail = c->in.len - c->in_off;
        if (avail == 0) break;
        const char *data = c->in.p + c->in_off;
        c->err_status = 0;
        llhttp_errno_t e = llhttp_execute(&c->parser, data, avail);
        size_t used = avail;
        if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
            used = (size_t)(llhttp_get_error_pos(&c->parser) - data);
        } else if (e != HPE_OK) {
            int status = c->err_status ? c->err_status : 400;
            const char *msg = c->err_status ? c->err_msg : llhttp_errno_name(e);
            char m[160];
            if (!c->err_status) {
                const char *why = llhttp_get_error_reason(&c->parser);
                snprintf(m, sizeof m, "malformed request: %s", why ? why : msg);
                msg = m;
            }
            send_error(c, status, msg);
            break;
        }
        if (c->req && !c->req->head_done) {
            c->raw_head += used;
            if (c->raw_head > lim->max_header_bytes) {
                send_error(c, 431, "request line and headers too large");
                break;
            }
        }
        c->in_off += used;
        if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
            if (e == HPE_PAUSED)
                llhttp_resume(&c->parser);
            else
                llhttp_resume_after_upgrade(&c->parser);
            if (c->req && c->req->complete) dispatch(c);
        }
    }
    if (c->in_off == c->in.len) {
        c->in.len = 0;
        c->in_off = 0;
    } else if (c->in_off > 0 && c->in_off >= c->in.len / 2) {
        memmove(c->in.p, c->in.p + c->in_off, c->in.len - c->in_off);
        c->in.len -= c->in_off;
        c->in_off = 0;
    }
    c->in_process = false;
    if (c->probe || c->closing || c->dead || c->ending) return;
    bool busy = c->req && c->req->dispatched;
    if (c->peer_eof && !busy && c->in.len == c->in_off) {
        /* half-closed client, everything received is answered */
        if (c->req)
            conn_close(c); /* a request cut short */
        else
            conn_end(c);
        return;
    }
    if (!c->req && c->served > 0 && c->timer_kind != T_IDLE && c->in.len == c->in_off)
        timer_set(c, T_IDLE, lim->idle_timeout_ms);
    /* unparsed input is bounded: reading waits while IN_BUF_MAX bytes are buffered */
    if (c->reading && c->in.len - c->in_off >= IN_BUF_MAX) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    } else if (!c->reading && !c->peer_eof && c->in.len - c->in_off < IN_BUF_MAX) {
        conn_read_start(c);
    }
}

static void on_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    timer_kind_t kind = c->timer_kind;
    c->timer_kind = T_NONE;
    switch (kind) {
    case T_HEAD:
        if (c->req || c->in.len > c->in_off)
            send_error(c, 408, "request headers timed out");
        else
            conn_close(c); /* connected, sent nothing */
        break;
    case T_BODY:
        send_error(c, 408, "request body timed out");
        break;
    case T_IDLE:
        if (c->pending_writes > 0) /* not idle: its answer is still going out (send_timer) */
            timer_set(c, T_IDLE, c->srv->lim.idle_timeout_ms);
        else
            conn_close(c);
        break;
    case T_LINGER:
        conn_close(c);
        break;
    case T_KICK:
        if (c->dead)
            conn_close(c);
        else
            conn_process(c);
        break;
    case T_NONE:
        break;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    conn_t *c = h->data;
    b->base = c->srv->read_buf;
    b->len = sizeof c->srv->read_buf;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    conn_t *c = s->data;
    if (n == 0 || c->closing) return;
    bool busy = c->req && c->req->dispatched;
    if (n < 0) {
        c->reading = false;
        if (n != UV_EOF || c->ending || c->dead || (busy && c->srv->lim.eof_cancels)) {
            if (n != UV_EOF) BT_LOG_DEBUG("http %s: read: %s", c->peer, uv_strerror((int)n));
            conn_close(c);
            return;
        }
        uv_read_stop(s);
        c->peer_eof = true;
        if (!busy) conn_process(c); /* answers what is buffered, then ends */
        return;
    }
    if (c->ending || c->dead) return; /* lingering: discard */
    if (!buf_append(&c->in, b->base, (size_t)n)) {
        conn_close(c);
        return;
    }
    if (busy) {
        if (c->in.len - c->in_off >= IN_BUF_MAX) {
            uv_read_stop(s);
            c->reading = false;
        }
        return;
    }
    conn_process(c);
}

static void conn_read_start(conn_t *c)
{
    if (c->reading || c->closing || c->probe) return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = true;
}

/* ---- server ------------------------------------------------------------------------------- */

static void on_reject_closed(uv_handle_t *h)
{
    free(h);
}

static void on_connection(uv_stream_t *ls, int status)
{
    bt_http_server_t *srv = ls->data;
    if (status < 0) {
        BT_LOG_WARN("http: accept: %s", uv_strerror(status));
        return;
    }
    if (srv->closing) return;
    if (srv->nconns >= srv->lim.max_connections) {
        uv_tcp_t *t = malloc(sizeof *t);
        if (!t) return;
        uv_tcp_init(srv->loop, t);
        if (uv_accept(ls, (uv_stream_t *)t) == 0) BT_LOG_DEBUG("http: connection limit reached");
        uv_close((uv_handle_t *)t, on_reject_closed);
        return;
    }
    conn_t *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->timer);
    uv_timer_init(srv->loop, &c->send_timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->send_timer.data = c;
    c->handles_open = 3;
    c->next = srv->conns;
    if (srv->conns) srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    snprintf(c->peer, sizeof c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        char ip[48] = "";
        int port = 0;
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            uv_ip4_name(a, ip, sizeof ip);
            port = ntohs(a->sin_port);
            snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, ip, sizeof ip);
            port = ntohs(a->sin6_port);
            snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, port);
        }
    }
    llhttp_init(&c->parser, HTTP_REQUEST, &srv->settings);
    c->parser.data = c;
    timer_set(c, T_HEAD, srv->lim.header_timeout_ms);
    conn_read_start(c);
    if (!c->reading) conn_close(c);
}

static void on_listener_closed(uv_handle_t *h)
{
    bt_http_server_t *srv = h->data;
    srv->listener_closed = true;
    if (srv->closing)
        maybe_finish_server(srv);
    else
        free(srv); /* create failed */
}

bt_status_t bt_http_server_create(uv_loop_t *loop, const char *host, int port,
                                  const bt_http_limits_t *limits, bt_http_handler_fn fn, void *ctx,
                                  bt_http_server_t **srv_p)
{
    if (!loop || !fn || !srv_p || port < 0 || port > 65535) return BT_ERR_INVALID_ARG;
    if (!host || !*host || strcmp(host, "localhost") == 0) host = "127.0.0.1";
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
        BT_LOG_ERROR("http: bad listen address '%s'", host);
        return BT_ERR_INVALID_ARG;
    }
    bt_http_server_t *srv = calloc(1, sizeof *srv);
    if (!srv) return BT_ERR_NO_MEMORY;
    srv->loop = loop;
    srv->lim = limits_resolve(limits);
    srv->fn = fn;
    srv->ctx = ctx;
    settings_init(&srv->settings);
    int rc = uv_tcp_init(loop, &srv->listener);
    if (rc < 0) {
        free(srv);
        return BT_ERR_IO;
    }
    srv->listener.data = srv;
    rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
    if (rc < 0) {
        BT_LOG_ERROR("http: listen on %s:%d: %s", host, port, uv_strerror(rc));
        uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
        return rc == UV_EADDRINUSE ? BT_ERR_UNAVAILABLE : BT_ERR_IO;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    if (uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &bl) == 0) {
        if (bound.ss_family == AF_INET)
            srv->port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
        else
            srv->port = ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
    }
    srv->listening = true;
    *srv_p = srv;
    return BT_OK;
}

int bt_http_server_port(const bt_http_server_t *srv)
{
    return srv ? srv->port : -1;
}

void bt_http_server_close(bt_http_server_t *srv, void (*on_closed)(void *ctx), void *ctx)
{
    if (!srv || srv->closing) return;
    srv->closing = true;
    srv->on_closed = on_closed;
    srv->on_closed_ctx = ctx;
    for (conn_t *c = srv->conns, *n; c; c = n) {
        n = c->next;
        if (c->req && c->req->dispatched) continue; /* finishes, then closes */
        if (c->ending) continue;                    /* flushing an answer already */
        if (c->pending_writes > 0) {                /* an answer still going out */
            conn_end(c);
            continue;
        }
        conn_close(c);
    }
    uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
}

/* ---- request accessors -------------------------------------------------------------------- */

const char *bt_http_method(const bt_http_request_t *req)
{
    return req->method;
}

const char *bt_http_path(const bt_http_request_t *req)
{
    return req->path;
}

const char *bt_http_query(const bt_http_request_t *req)
{
    return req->query;
}

const char *bt_http_header(const bt_http_request_t *req, const char *name)
{
    return req_header(req, name);
}

size_t bt_http_header_count(const bt_http_request_t *req)
{
    return req->nhdr;
}

const bt_http_header_t *bt_http_header_at(const bt_http_request_t *req, size_t i)
{
    return i < req->nhdr ? &req->headers[i] : NULL;
}

const uint8_t *bt_http_body(const bt_http_request_t *req, size_t *len_p)
{
    if (len_p) *len_p = req->body.len;
    return (const uint8_t *)(req->body.p ? req->body.p : "");
}

const char *bt_http_peer(const bt_http_request_t *req)
{
    return req->peer;
}

/* ---- answers ------------------------------------------------------------------------------ */

static bool token_ok(const char *s, bool value)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '\r' || ch == '\n' || ch == 0x7f) return false;
        if (!value && (ch <= ' ' || ch == ':')) return false;
    }
    return true;
}

void bt_http_add_header(bt_http_request_t *req, const char *name, const char *value)
{
    if (!req || !name || !value || !*name) return;
    if (strcasecmp(name, "Content-Length") == 0 || strcasecmp(name, "Transfer-Encoding") == 0 ||
        strcasecmp(name, "Connection") == 0) {
        BT_LOG_WARN("http: refused response header '%s' (framing is the server's)", name);
        return;
    }
    if (!token_ok(name, false) || !token_ok(value, true)) {
        BT_LOG_WARN("http: refused response header '%s' (bad characters)", name);
        return;
    }
    extra_hdr_t *e = calloc(1, sizeof *e);
    if (!e) return;
    e->name = strdup(name);
    e->value = strdup(value);
    if (!e->name || !e->value) {
        free(e->name);
        free(e->value);
        free(e);
        return;
    }
    extra_hdr_t **tail = &req->extra;
    while (*tail)
        tail = &(*tail)->next;
    *tail = e;
}

/* The connection is gone or going. The handler's final call (respond, stream_end) frees the
 * request here, and its on_close is dropped: the handler's context goes with its answer, so a
 * close that comes later (a deferred abort's, on the next loop turn) must not call into it. */
static bt_status_t answer_cancelled(bt_http_request_t *req, bool final)
{
    if (!final) return BT_ERR_CANCELLED;
    conn_t *c = req->conn;
    if (c && c->req == req) c->req = NULL;
    req->on_close = NULL;
    req_free(req);
    return BT_ERR_CANCELLED;
}

static bool answer_must_close(const bt_http_request_t *req)
{
    const conn_t *c = req->conn;
    return !req->keep_alive || c->force_close || c->srv->closing ||
           (c->peer_eof && c->in.len == c->in_off);
}

static bool build_head(bt_http_request_t *req, buf_t *h, int status, const char *ctype,
                       const size_t *content_length, bool chunked, bool close)
{
    bool ok = buf_printf(h, "HTTP/1.1 %d %s\r\nServer: baton\r\n", status, reason_phrase(status));
    if (ctype && *ctype) ok = ok && buf_printf(h, "Content-Type: %s\r\n", ctype);
    if (content_length) ok = ok && buf_printf(h, "Content-Length: %zu\r\n", *content_length);
    if (chunked) ok = ok && buf_str(h, "Transfer-Encoding: chunked\r\n");
    for (extra_hdr_t *e = req->extra; ok && e; e = e->next)
        ok = buf_printf(h, "%s: %s\r\n", e->name, e->value);
    if (close)
        ok = ok && buf_str(h, "Connection: close\r\n");
    else if (req->http10)
        ok = ok && buf_str(h, "Connection: keep-alive\r\n");
    ok = ok && buf_str(h, "\r\n");
    extra_clear(req);
    return ok;
}

/* The answer is queued: free the request and go on with the connection. */
static void answer_done(bt_http_request_t *req, bool close)
{
    conn_t *c = req->conn;
    c->req = NULL;
    req_free(req);
    if (close) {
        conn_end(c);
        return;
    }
    /* next pipelined request, or the idle timer, from the loop rather than from inside
     * the handler's call */
    timer_set(c, T_KICK, 0);
}

static bool status_has_body(int status)
{
    return !(status < 200 || status == 204 || status == 304);
}

bt_status_t bt_http_respond(bt_http_request_t *req, int status, const char *content_type,
                            const void *body, size_t len)
{
    if (!req || !req->dispatched || req->streaming) return BT_ERR_INVALID_ARG;
    if (status < 100 || status > 999) return BT_ERR_INVALID_ARG;
    conn_t *c = req->conn;
    if (!c || c->dead) return answer_cancelled(req, true);
    bool close = answer_must_close(req);
    bool with_body = status_has_body(status);
    size_t clen = with_body ? len : 0;
    buf_t h = {0};
    if (!build_head(req, &h, status, with_body ? content_type : NULL, with_body ? &clen : NULL,
                    false, close)) {
        buf_free(&h);
        conn_abort_deferred(c);
        return answer_cancelled(req, true);
    }
    bool send_body = with_body && !req->head_method && len > 0;
    bool ok = conn_write(c, h.p, h.len, send_body ? body : NULL, send_body ? len : 0);
    buf_free(&h);
    if (!ok) {
        conn_abort_deferred(c);
        return answer_cancelled(req, true);
    }
    answer_done(req, close);
    return BT_OK;
}

bt_status_t bt_http_stream_begin(bt_http_request_t *req, int status, const char *content_type)
{
    if (!req || !req->dispatched || req->streaming) return BT_ERR_INVALID_ARG;
    if (status < 200 || status > 999 || !status_has_body(status)) return BT_ERR_INVALID_ARG;
    conn_t *c = req->conn;
    req->streaming = true; /* from here on the answer ends with stream_end, even cancelled */
    if (!c || c->dead) return BT_ERR_CANCELLED;
    /* HTTP/1.0 has no chunked coding: the body runs to the close */
    req->chunked_out = !req->http10;
    bool close = req->http10 || answer_must_close(req);
    if (close) req->keep_alive = false;
    buf_t h = {0};
    bool ok = build_head(req, &h, status, content_type, NULL, req->chunked_out, close);
    ok = ok && conn_write(c, h.p, h.len, NULL, 0);
    buf_free(&h);
    if (!ok) {
        conn_abort_deferred(c);
        return BT_ERR_CANCELLED;
    }
    return BT_OK;
}

bt_status_t bt_http_stream_write(bt_http_request_t *req, const void *data, size_t len)
{
    if (!req || !req->streaming) return BT_ERR_INVALID_ARG;
    conn_t *c = req->conn;
    if (!c || c->dead) return BT_ERR_CANCELLED;
    if (len == 0 || req->head_method) return BT_OK;
    if (queued_bytes(c) > MAX_QUEUED_BYTES) {
        BT_LOG_WARN("http %s: client reads too slowly (%zu bytes queued), closing", c->peer,
                    queued_bytes(c));
        conn_abort_deferred(c);
        return BT_ERR_CANCELLED;
    }
    bool ok;
    if (req->chunked_out) {
        /* one write per chunk: size line, data, CRLF */
        char head[24];
        int hn = snprintf(head, sizeof head, "%zx\r\n", len);
        uv_buf_t parts[3] = {uv_buf_init(head, (unsigned)hn), uv_buf_init((char *)data, 0),
                             uv_buf_init((char *)"\r\n", 2)};
        parts[1].len = len;
        ok = conn_writev(c, parts, 3);
    } else {
        ok = conn_write(c, data, len, NULL, 0);
    }
    if (!ok) {
        conn_abort_deferred(c);
        return BT_ERR_CANCELLED;
    }
    return BT_OK;
}

bt_status_t bt_http_stream_end(bt_http_request_t *req)
{
    if (!req || !req->streaming) return BT_ERR_INVALID_ARG;
    conn_t *c = req->conn;
    if (!c || c->dead) return answer_cancelled(req, true);
    if (req->chunked_out && !req->head_method) {
        static const char last[] = "0\r\n\r\n";
        if (!conn_write(c, last, sizeof last - 1, NULL, 0)) {
            conn_abort_deferred(c);
            return answer_cancelled(req, true);
        }
    }
    bool close = !req->keep_alive || answer_must_close(req);
    answer_done(req, close);
    return BT_OK;
}

void bt_http_on_close(bt_http_request_t *req, void (*fn)(void *ctx), void *ctx)
{
    if (!req) return;
    if (!req->conn) {
        /* the connection is already gone: tell at once, and the request goes with it */
        if (fn) fn(ctx);
        req_free(req);
        return;
    }
    req->on_close = fn;
    req->on_close_ctx = ctx;
}

/* ---- fuzzing entry ------------------------------------------------------------------------ */

int bt_http_parse_probe(const uint8_t *data, size_t len, const bt_http_limits_t *limits)
{
    bt_http_server_t *srv = calloc(1, sizeof *srv);
    conn_t *c = calloc(1, sizeof *c);
    int status = 503;
    if (!srv || !c) goto out;
    srv->lim = limits_resolve(limits);
    settings_init(&srv->settings);
    c->srv = srv;
    c->probe = true;
    snprintf(c->peer, sizeof c->peer, "probe");
    llhttp_init(&c->parser, HTTP_REQUEST, &srv->settings);
    c->parser.data = c;
    if (len && !buf_append(&c->in, data, len)) goto out;
    conn_process(c);
    if (!c->probe_status && !c->ending && c->req && !c->req->head_done &&
        c->raw_head > srv->lim.max_header_bytes)
        c->probe_status = 431;
    status = c->probe_status;
out:
    if (c) {
        req_free(c->req);
        buf_free(&c->in);
    }
    free(c);
    free(srv);
    return status;
}

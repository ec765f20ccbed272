/* common/http: a real server on 127.0.0.1 (libuv loop in the main thread) driven by raw
 * blocking sockets from a client thread, and by curl. Every test runs under a watchdog. */
#include "bt_test.h"
#include "common/http/http.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- fixture: server + loop in this thread, client function in another ------------------- */

typedef struct fx fx_t;

/* /big's answer: more than the kernel's socket buffers take (their autotuning stops at 4 MiB) */
enum { BIG_BYTES = 8 << 20 };
typedef void (*client_fn)(fx_t *);

struct fx {
    uv_loop_t loop;
    bt_http_server_t *srv;
    uv_async_t done;
    pthread_t th;
    client_fn client;
    int port;
    atomic_int n_requests;
    atomic_int n_closed;     /* on_close callbacks */
    atomic_int n_cancelled;  /* stream_write answered BT_ERR_CANCELLED */
    atomic_long flood_bytes; /* bytes accepted by stream_write on /flood */
    atomic_int server_closed;
    atomic_int n_late_cancelled; /* /slow answered after its client reset */
    atomic_int n_closed_after_end; /* on_close fired after the handler's final stream_end */
    int leftover_fd;             /* a connection the client leaves open for server_close */
};

typedef struct {
    fx_t *fx;
    bt_http_request_t *req;
    uv_timer_t timer;
    int i;
    char kind;
} job_t;

static void job_free(uv_handle_t *h)
{
    free(h->data);
}

static void job_on_close(void *ctx)
{
    job_t *j = ctx;
    atomic_fetch_add(&j->fx->n_closed, 1);
    j->req = NULL;
    uv_timer_stop(&j->timer);
    uv_close((uv_handle_t *)&j->timer, job_free);
}

static void job_tick(uv_timer_t *t)
{
    job_t *j = t->data;
    if (j->kind == 'w') { /* /slow: answer late */
        /* no on_close registered: a request whose client left stays until this call */
        if (bt_http_respond(j->req, 200, "text/plain", "slow", 4) == BT_ERR_CANCELLED)
            atomic_fetch_add(&j->fx->n_late_cancelled, 1);
        uv_close((uv_handle_t *)&j->timer, job_free);
        return;
    }
    if (j->kind == 's') { /* /sse: three events, then [DONE] */
        char ev[32];
        int n = j->i < 3 ? snprintf(ev, sizeof ev, "data: %d\n\n", j->i)
                         : snprintf(ev, sizeof ev, "data: [DONE]\n\n");
        BT_CHECK(bt_http_stream_write(j->req, ev, (size_t)n) == BT_OK);
        if (++j->i == 4) {
            BT_CHECK(bt_http_stream_end(j->req) == BT_OK);
            uv_timer_stop(&j->timer);
            uv_close((uv_handle_t *)&j->timer, job_free);
        }
        return;
    }
    if (j->kind == 'f') { /* /forever: until the client goes away */
        bt_status_t st = bt_http_stream_write(j->req, "data: tick\n\n", 12);
        if (st == BT_ERR_CANCELLED) {
            atomic_fetch_add(&j->fx->n_cancelled, 1);
            uv_timer_stop(&j->timer); /* on_close follows */
        }
        return;
    }
    if (j->kind == 'E') { /* /flood-end: as /flood, and the answer ends where a write fails */
        static char chunk[64 * 1024];
        memset(chunk, 'x', sizeof chunk);
        for (int k = 0; k < 16; k++) {
            if (bt_http_stream_write(j->req, chunk, sizeof chunk) == BT_OK) continue;
            /* the handler's final call, the connection dead but not yet closed (as a gateway
             * whose upstream ended in the same turn): its context goes with the answer */
            BT_CHECK_EQ_INT(bt_http_stream_end(j->req), BT_ERR_CANCELLED);
            atomic_fetch_add(&j->fx->n_cancelled, 1);
            uv_timer_stop(&j->timer);
            uv_close((uv_handle_t *)&j->timer, job_free);
            return;
        }
        return;
    }
    if (j->kind == 'F') { /* /flood: 1 MiB a tick to a client that never reads */
        static char chunk[64 * 1024];
        memset(chunk, 'x', sizeof chunk);
        for (int k = 0; k < 16; k++) {
            bt_status_t st = bt_http_stream_write(j->req, chunk, sizeof chunk);
            if (st != BT_OK) {
                BT_CHECK_EQ_INT(st, BT_ERR_CANCELLED);
                atomic_fetch_add(&j->fx->n_cancelled, 1);
                uv_timer_stop(&j->timer);
                return;
            }
            atomic_fetch_add(&j->fx->flood_bytes, (long)sizeof chunk);
        }
    }
}

/* /flood-end's on_close: the answer was final, so this must never run */
static void on_close_after_end(void *ctx)
{
    fx_t *fx = ctx;
    atomic_fetch_add(&fx->n_closed_after_end, 1);
}

static void start_job(fx_t *fx, bt_http_request_t *req, char kind, int every_ms)
{
    job_t *j = calloc(1, sizeof *j);
    j->fx = fx;
    j->req = req;
    j->kind = kind;
    uv_timer_init(&fx->loop, &j->timer);
    j->timer.data = j;
    if (kind != 'w') {
        BT_CHECK(bt_http_stream_begin(req, 200, "text/event-stream") == BT_OK);
        if (kind == 'E') /* (not the job: it is freed with the final answer) */
            bt_http_on_close(req, on_close_after_end, fx);
        else
            bt_http_on_close(req, job_on_close, j);
    }
    uv_timer_start(&j->timer, job_tick, (uint64_t)every_ms, kind == 'w' ? 0 : (uint64_t)every_ms);
}

static void on_server_closed(void *ctx)
{
    fx_t *fx = ctx;
    fx->srv = NULL;
    atomic_store(&fx->server_closed, 1);
}

static void handler(void *ctx, bt_http_request_t *req)
{
    fx_t *fx = ctx;
    atomic_fetch_add(&fx->n_requests, 1);
    const char *path = bt_http_path(req);
    if (strcmp(path, "/hello") == 0) {
        bt_http_respond(req, 200, "text/plain", "hello", 5);
    } else if (strcmp(path, "/echo") == 0) {
        size_t n;
        const uint8_t *body = bt_http_body(req, &n);
        const char *t = bt_http_header(req, "x-test");
        bt_http_add_header(req, "X-Method", bt_http_method(req));
        bt_http_add_header(req, "X-Query", bt_http_query(req));
        bt_http_add_header(req, "X-Test-Seen", t ? t : "(none)");
        bt_http_add_header(req, "X-Peer", bt_http_peer(req));
        bt_http_add_header(req, "X-Bad", "a\r\nInjected: 1"); /* refused */
        bt_http_respond(req, 200, "application/octet-stream", body, n);
    } else if (strcmp(path, "/slow") == 0) {
        start_job(fx, req, 'w', 50);
    } else if (strcmp(path, "/sse") == 0) {
        start_job(fx, req, 's', 5);
    } else if (strcmp(path, "/sse-then-close") == 0) {
        /* the server closes while this stream is in flight: the stream must finish */
        start_job(fx, req, 's', 5);
        bt_http_server_close(fx->srv, on_server_closed, fx);
    } else if (strcmp(path, "/big") == 0 || strcmp(path, "/big-then-close") == 0) {
        /* an answer larger than the socket buffers: it goes out as the client reads */
        static char big[BIG_BYTES];
        memset(big, 'b', sizeof big);
        const bool then_close =
            strcmp(path, "/big-then-close") == 0; /* (req goes with the answer) */
        bt_http_respond(req, 200, "application/octet-stream", big, sizeof big);
        if (then_close) bt_http_server_close(fx->srv, on_server_closed, fx);
    } else if (strcmp(path, "/forever") == 0) {
        start_job(fx, req, 'f', 10);
    } else if (strcmp(path, "/flood") == 0) {
        start_job(fx, req, 'F', 1);
    } else if (strcmp(path, "/flood-end") == 0) {
        start_job(fx, req, 'E', 1);
    } else {
        static const char nf[] = "{\"error\":\"not found\"}";
        bt_http_respond(req, 404, "application/json", nf, sizeof nf - 1);
    }
}

static void on_done(uv_async_t *a)
{
    fx_t *fx = a->data;
    if (fx->srv && !atomic_load(&fx->server_closed))
        bt_http_server_close(fx->srv, on_server_closed, fx);
    uv_close((uv_handle_t *)&fx->done, NULL);
}

static void *client_main(void *arg)
{
    fx_t *fx = arg;
    fx->client(fx);
    uv_async_send(&fx->done);
    return NULL;
}

static void watchdog(int sig)
{
    static const char msg[] = "test_http: watchdog fired (test hung)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(3);
}

static void run_fixture(const bt_http_limits_t *lim, client_fn client, fx_t *fx)
{
    memset(fx, 0, sizeof *fx);
    fx->leftover_fd = -1;
    fx->client = client;
    alarm(30);
    BT_CHECK(uv_loop_init(&fx->loop) == 0);
    bt_status_t st = bt_http_server_create(&fx->loop, "127.0.0.1", 0, lim, handler, fx, &fx->srv);
    BT_CHECK_EQ_INT(st, BT_OK);
    if (st != BT_OK) return;
    fx->port = bt_http_server_port(fx->srv);
    BT_CHECK(fx->port > 0);
    uv_async_init(&fx->loop, &fx->done, on_done);
    fx->done.data = fx;
    pthread_create(&fx->th, NULL, client_main, fx);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    pthread_join(fx->th, NULL);
    BT_CHECK(atomic_load(&fx->server_closed) == 1);
    BT_CHECK_EQ_INT(uv_loop_close(&fx->loop), 0); /* every handle closed */
    if (fx->leftover_fd >= 0) close(fx->leftover_fd);
    alarm(0);
}

/* ---- blocking client helpers -------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int cl_connect_rcvbuf(int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int cl_connect(int port)
{
    return cl_connect_rcvbuf(port, 0);
}

static bool cl_sendn(int fd, const void *p, size_t n)
{
    const char *s = p;
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        s += k;
        n -= (size_t)k;
    }
    return true;
}

static bool cl_send(int fd, const char *s)
{
    return cl_sendn(fd, s, strlen(s));
}

typedef struct {
    int fd;
    char *buf;
    size_t len, cap;
    bool eof;
} cl_t;

typedef struct {
    int status;
    char head[8192];
    char *body; /* decoded, NUL-terminated */
    size_t body_len;
    char *raw; /* as on the wire */
    size_t raw_len;
} resp_t;

static void cl_init(cl_t *c, int fd)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->cap = 1 << 16;
    c->buf = malloc(c->cap);
}

static void cl_free(cl_t *c)
{
    free(c->buf);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static void resp_free(resp_t *r)
{
    free(r->body);
    free(r->raw);
    r->body = r->raw = NULL;
}

/* One more read into the buffer; false at EOF, error or timeout. */
static bool cl_fill(cl_t *c)
{
    if (c->eof) return false;
    if (c->cap - c->len < 4096) {
        c->cap *= 2;
        c->buf = realloc(c->buf, c->cap);
    }
    ssize_t k = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
    if (k <= 0) {
        c->eof = true;
        return false;
    }
    c->len += (size_t)k;
    c->buf[c->len] = '\0';
    return true;
}

static void cl_take(cl_t *c, size_t n, char **dst, size_t *dlen)
{
    *dst = realloc(*dst, *dlen + n + 1);
    memcpy(*dst + *dlen, c->buf, n);
    *dlen += n;
    (*dst)[*dlen] = '\0';
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

static char *find_crlf(cl_t *c, const char *what)
{
    size_t wl = strlen(what);
    for (size_t i = 0; i + wl <= c->len; i++)
        if (memcmp(c->buf + i, what, wl) == 0) return c->buf + i;
    return NULL;
}

static const char *head_get(const char *head, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);
    for (const char *l = strstr(head, "\r\n"); l; l = strstr(l, "\r\n")) {
        l += 2;
        if (strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            size_t n = strcspn(v, "\r");
            if (n >= outlen) n = outlen - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return out;
        }
    }
    return NULL;
}

/* Reads one response (a 1xx too); 0 when complete, -1 otherwise. */
static int cl_response(cl_t *c, resp_t *r)
{
    memset(r, 0, sizeof *r);
    r->body = calloc(1, 1);
    r->raw = calloc(1, 1);
    char *e;
    while (!(e = find_crlf(c, "\r\n\r\n")))
        if (!cl_fill(c)) return -1;
    size_t hl = (size_t)(e - c->buf) + 4;
    if (hl >= sizeof r->head) return -1;
    memcpy(r->head, c->buf, hl);
    r->head[hl] = '\0';
    memmove(c->buf, c->buf + hl, c->len - hl);
    c->len -= hl;
    if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    if (r->status < 200 || r->status == 204 || r->status == 304) return 0;
    char v[64];
    if (head_get(r->head, "Content-Length", v, sizeof v)) {
        size_t n = strtoul(v, NULL, 10);
        while (c->len < n)
            if (!cl_fill(c)) return -1;
        char *raw_dummy = NULL;
        size_t rl = 0;
        cl_take(c, n, &r->body, &r->body_len);
        (void)raw_dummy;
        (void)rl;
        return 0;
    }
    if (head_get(r->head, "Transfer-Encoding", v, sizeof v)) {
        for (;;) {
            while (!(e = find_crlf(c, "\r\n")))
                if (!cl_fill(c)) return -1;
            size_t ll = (size_t)(e - c->buf) + 2;
            size_t n = strtoul(c->buf, NULL, 16);
            cl_take(c, ll, &r->raw, &r->raw_len);
            while (c->len < n + 2)
                if (!cl_fill(c)) return -1;
            if (memcmp(c->buf + n, "\r\n", 2) != 0) return -1;
            char *chunk = NULL;
            size_t cn = 0;
            cl_take(c, n + 2, &chunk, &cn);
            r->raw = realloc(r->raw, r->raw_len + cn + 1);
            memcpy(r->raw + r->raw_len, chunk, cn);
            r->raw_len += cn;
            r->raw[r->raw_len] = '\0';
            r->body = realloc(r->body, r->body_len + n + 1);
            memcpy(r->body + r->body_len, chunk, n);
            r->body_len += n;
            r->body[r->body_len] = '\0';
            free(chunk);
            if (n == 0) return 0;
        }
    }
    /* delimited by the close */
    while (cl_fill(c)) {
    }
    cl_take(c, c->len, &r->body, &r->body_len);
    return 0;
}

/* True when the server closes the connection (EOF or reset) within 3 s with no more data. */
static bool cl_wait_closed(cl_t *c)
{
    double t0 = now_s();
    while (now_s() - t0 < 3.0) {
        if (c->len > 0) return false;
        char b[256];
        ssize_t k = recv(c->fd, b, sizeof b, 0);
        if (k == 0) return true;
        if (k < 0) return errno == ECONNRESET;
        return false;
    }
    return false;
}

static bool wait_for(atomic_int *v, int want, double secs)
{
    double t0 = now_s();
    while (now_s() - t0 < secs) {
        if (atomic_load(v) >= want) return true;
        sleep_ms(5);
    }
    return atomic_load(v) >= want;
}

/* One request on a fresh connection; the response into r (caller frees). */
static int roundtrip(int port, const char *request, resp_t *r)
{
    cl_t c;
    cl_init(&c, cl_connect(port));
    if (c.fd < 0) {
        cl_free(&c);
        memset(r, 0, sizeof *r);
        return -1;
    }
    cl_send(c.fd, request);
    int rc = cl_response(&c, r);
    cl_free(&c);
    return rc;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void client_keepalive(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    resp_t r;
    for (int k = 0; k < 2; k++) {
        BT_CHECK(cl_send(c.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
        BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
        BT_CHECK_EQ_INT(r.status, 200);
        BT_CHECK(strcmp(r.body, "hello") == 0);
        BT_CHECK(strstr(r.head, "Content-Length: 5\r\n") != NULL);
        BT_CHECK(strstr(r.head, "Connection: close") == NULL);
        resp_free(&r);
    }
    BT_CHECK(cl_send(c.fd, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"));
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 404);
    resp_free(&r);
    /* left open: bt_http_server_close must close the idle connection */
    fx->leftover_fd = c.fd;
    c.fd = -1;
    cl_free(&c);
}

static void test_keepalive_get(void)
{
    fx_t fx;
    run_fixture(NULL, client_keepalive, &fx);
    BT_CHECK_EQ_INT(atomic_load(&fx.n_requests), 3);
}

static void client_post(fx_t *fx)
{
    resp_t r;
    BT_CHECK_EQ_INT(roundtrip(fx->port,
                              "POST /v1/echo/../echo?a=b&c=d HTTP/1.1\r\nHost: x\r\n"
                              "x-TEST: yes\r\nContent-Length: 11\r\n\r\nhello world",
                              &r),
                    0);
    resp_free(&r); /* path not normalised: 404 expected, just must not crash */
    BT_CHECK_EQ_INT(roundtrip(fx->port,
                              "POST /echo?a=b&c=d HTTP/1.1\r\nHost: x\r\n"
                              "x-TEST: yes\r\nContent-Length: 11\r\n\r\nhello world",
                              &r),
                    0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(strcmp(r.body, "hello world") == 0);
    char v[128];
    BT_CHECK(head_get(r.head, "X-Method", v, sizeof v) && strcmp(v, "POST") == 0);
    BT_CHECK(head_get(r.head, "X-Query", v, sizeof v) && strcmp(v, "a=b&c=d") == 0);
    BT_CHECK(head_get(r.head, "X-Test-Seen", v, sizeof v) && strcmp(v, "yes") == 0);
    BT_CHECK(head_get(r.head, "X-Peer", v, sizeof v) && strncmp(v, "127.0.0.1:", 10) == 0);
    BT_CHECK(strstr(r.head, "Injected") == NULL);
    resp_free(&r);
}

static void test_post_content_length(void)
{
    fx_t fx;
    run_fixture(NULL, client_post, &fx);
}

static void client_chunked(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    /* chunk boundaries split across sends, with an extension and a trailer */
    const char *parts[] = {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5",
                           "\r\nhel", "lo\r\n6;ext=1\r\n world\r\n", "0\r\nX-Trailer: t\r\n\r\n"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        BT_CHECK(cl_send(c.fd, parts[i]));
        sleep_ms(10);
    }
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(strcmp(r.body, "hello world") == 0);
    resp_free(&r);
    /* and the connection goes on */
    BT_CHECK(cl_send(c.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK(strcmp(r.body, "hello") == 0);
    resp_free(&r);
    cl_free(&c);
}

static void test_chunked_request(void)
{
    fx_t fx;
    run_fixture(NULL, client_chunked, &fx);
}

static void client_pipelined(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
                           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                           "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                           "GET /sse HTTP/1.1\r\nHost: x\r\n\r\n"
                           "GET /hello?last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const char *want[] = {"hello", "abc", "slow",
                          "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n", "hello"};
    for (int k = 0; k < 5; k++) {
        resp_t r;
        BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
        BT_CHECK_EQ_INT(r.status, 200);
        BT_CHECK_MSG(r.body && strcmp(r.body, want[k]) == 0, "response %d: '%s'", k,
                     r.body ? r.body : "(null)");
        if (k == 4) BT_CHECK(strstr(r.head, "Connection: close\r\n") != NULL);
        resp_free(&r);
    }
    BT_CHECK(cl_wait_closed(&c));
    cl_free(&c);
}

static void test_pipelined(void)
{
    fx_t fx;
    run_fixture(NULL, client_pipelined, &fx);
    BT_CHECK_EQ_INT(atomic_load(&fx.n_requests), 5);
}

static void client_sse(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /sse HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"));
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(strstr(r.head, "Transfer-Encoding: chunked\r\n") != NULL);
    BT_CHECK(strstr(r.head, "Content-Type: text/event-stream\r\n") != NULL);
    BT_CHECK(strstr(r.head, "Content-Length") == NULL);
    static const char framing[] = "9\r\ndata: 0\n\n\r\n"
                                  "9\r\ndata: 1\n\n\r\n"
                                  "9\r\ndata: 2\n\n\r\n"
                                  "e\r\ndata: [DONE]\n\n\r\n"
                                  "0\r\n\r\n";
    BT_CHECK_MSG(r.raw_len == sizeof framing - 1 && memcmp(r.raw, framing, r.raw_len) == 0,
                 "framing: '%s'", r.raw);
    resp_free(&r);
    BT_CHECK(cl_send(c.fd, "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    /* HEAD: Content-Length of the GET, no body: the next response must follow directly */
    BT_CHECK(cl_send(c.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    char *e;
    while (!(e = find_crlf(&c, "\r\n\r\n")))
        if (!cl_fill(&c)) break;
    BT_CHECK(e && strncmp(c.buf, "HTTP/1.1 200", 12) == 0);
    if (e) memmove(c.buf, e + 4, c.len - (size_t)(e + 4 - c.buf)), c.len -= (size_t)(e + 4 - c.buf);
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK(r.body && strcmp(r.body, "hello") == 0);
    resp_free(&r);
    cl_free(&c);
}

static void test_sse_stream(void)
{
    fx_t fx;
    run_fixture(NULL, client_sse, &fx);
}

static bt_http_limits_t small_limits(void)
{
    bt_http_limits_t l = bt_http_limits_default();
    l.max_body_bytes = 1024;
    return l;
}

static void client_413(fx_t *fx)
{
    /* by Content-Length, body sent anyway: the answer must survive the unread bytes */
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    char big[5000];
    memset(big, 'a', sizeof big);
    BT_CHECK(cl_send(c.fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"));
    cl_sendn(c.fd, big, sizeof big);
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 413);
    BT_CHECK(strstr(r.head, "Connection: close") != NULL);
    BT_CHECK(strstr(r.body, "\"code\":413") != NULL);
    BT_CHECK(strstr(r.body, "\"error\"") != NULL);
    resp_free(&r);
    BT_CHECK(cl_wait_closed(&c));
    cl_free(&c);

    /* chunked, growing past the limit */
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
    char chunk[600];
    memset(chunk, 'b', sizeof chunk);
    for (int k = 0; k < 2; k++) {
        cl_send(c.fd, "258\r\n");
        cl_sendn(c.fd, chunk, sizeof chunk);
        cl_send(c.fd, "\r\n");
    }
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 413);
    resp_free(&r);
    cl_free(&c);

    /* exactly at the limit passes */
    cl_init(&c, cl_connect(fx->port));
    char exact[1024];
    memset(exact, 'c', sizeof exact);
    BT_CHECK(cl_send(c.fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n"));
    cl_sendn(c.fd, exact, sizeof exact);
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK_EQ_INT(r.body_len, 1024);
    resp_free(&r);
    cl_free(&c);
}

static void test_413_body_limit(void)
{
    bt_http_limits_t l = small_limits();
    fx_t fx;
    run_fixture(&l, client_413, &fx);
    BT_CHECK_EQ_INT(atomic_load(&fx.n_requests), 1);
}

static void client_431(fx_t *fx)
{
    size_t n = 20000;
    char *req = malloc(n + 200);
    int off = sprintf(req, "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + off, 'a', n);
    strcpy(req + off + n, "\r\n\r\n");
    resp_t r;
    BT_CHECK_EQ_INT(roundtrip(fx->port, req, &r), 0);
    BT_CHECK_EQ_INT(r.status, 431);
    BT_CHECK(strstr(r.body, "\"code\":431") != NULL);
    resp_free(&r);

    /* many small headers */
    off = sprintf(req, "GET /hello HTTP/1.1\r\nHost: x\r\n");
    for (int k = 0; k < 150; k++)
        off += sprintf(req + off, "X-%d: v\r\n", k);
    strcpy(req + off, "\r\n");
    BT_CHECK_EQ_INT(roundtrip(fx->port, req, &r), 0);
    BT_CHECK_EQ_INT(r.status, 431);
    resp_free(&r);

    /* a long URL, sent in pieces */
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    cl_send(c.fd, "GET /");
    char piece[4096];
    memset(piece, 'u', sizeof piece);
    for (int k = 0; k < 6; k++)
        cl_sendn(c.fd, piece, sizeof piece);
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 431);
    resp_free(&r);
    cl_free(&c);
    free(req);
}

static void test_431_headers(void)
{
    fx_t fx;
    run_fixture(NULL, client_431, &fx);
    BT_CHECK_EQ_INT(atomic_load(&fx.n_requests), 0);
}

static char *custom_error(int status, const char *message)
{
    char *s = malloc(64);
    snprintf(s, 64, "{\"custom\":%d}", status);
    return s;
}

static void client_400(fx_t *fx)
{
    resp_t r;
    BT_CHECK_EQ_INT(roundtrip(fx->port, "\x01\x02 garbage here\r\n\r\n", &r), 0);
    BT_CHECK_EQ_INT(r.status, 400);
    BT_CHECK(strcmp(r.body, "{\"custom\":400}") == 0);
    resp_free(&r);
    BT_CHECK_EQ_INT(roundtrip(fx->port, "GET /hello HTTP/1.1\r\nBad Header\r\n\r\n", &r), 0);
    BT_CHECK_EQ_INT(r.status, 400);
    resp_free(&r);
    BT_CHECK_EQ_INT(roundtrip(fx->port,
                              "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                              &r),
                    0);
    BT_CHECK_EQ_INT(r.status, 400);
    resp_free(&r);
    BT_CHECK_EQ_INT(roundtrip(fx->port, "GET /hello HTTP/1.1\r\nContent-Length: abc\r\n\r\n", &r),
                    0);
    BT_CHECK_EQ_INT(r.status, 400);
    resp_free(&r);
    /* HTTP/1.0: answered, then closed */
    BT_CHECK_EQ_INT(roundtrip(fx->port, "GET /hello HTTP/1.0\r\n\r\n", &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(strstr(r.head, "Connection: close") != NULL);
    resp_free(&r);
}

static void test_400_garbage(void)
{
    bt_http_limits_t l = bt_http_limits_default();
    l.error_body = custom_error;
    fx_t fx;
    run_fixture(&l, client_400, &fx);
    BT_CHECK_EQ_INT(atomic_load(&fx.n_requests), 1);
}

static void client_slowloris(fx_t *fx)
{
    cl_t a;
    cl_init(&a, cl_connect(fx->port));
    double t0 = now_s();
    BT_CHECK(cl_send(a.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n"));
    /* meanwhile another client is served */
    for (int k = 0; k < 3; k++) {
        cl_send(a.fd, "X-Drip: 1\r\n");
        resp_t r;
        BT_CHECK_EQ_INT(roundtrip(fx->port, "GET /hello HTTP/1.1\r\nHost: y\r\n\r\n", &r), 0);
        BT_CHECK_EQ_INT(r.status, 200);
        resp_free(&r);
        sleep_ms(50);
    }
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&a, &r), 0);
    BT_CHECK_EQ_INT(r.status, 408);
    double dt = now_s() - t0;
    BT_CHECK_MSG(dt >= 0.25 && dt < 2.0, "408 after %.3f s", dt);
    resp_free(&r);
    BT_CHECK(cl_wait_closed(&a));
    cl_free(&a);

    /* body timeout */
    cl_init(&a, cl_connect(fx->port));
    BT_CHECK(cl_send(a.fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"));
    BT_CHECK_EQ_INT(cl_response(&a, &r), 0);
    BT_CHECK_EQ_INT(r.status, 408);
    resp_free(&r);
    cl_free(&a);

    /* connected and silent: closed without an answer */
    cl_init(&a, cl_connect(fx->port));
    BT_CHECK(cl_wait_closed(&a));
    cl_free(&a);

    /* idle keep-alive: closed quietly after the answer */
    cl_init(&a, cl_connect(fx->port));
    BT_CHECK(cl_send(a.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    BT_CHECK_EQ_INT(cl_response(&a, &r), 0);
    resp_free(&r);
    t0 = now_s();
    BT_CHECK(cl_wait_closed(&a));
    BT_CHECK(now_s() - t0 >= 0.1);
    cl_free(&a);
}

static void test_408_slowloris(void)
{
    bt_http_limits_t l = bt_http_limits_default();
    l.header_timeout_ms = 300;
    l.body_timeout_ms = 200;
    l.idle_timeout_ms = 200;
    fx_t fx;
    run_fixture(&l, client_slowloris, &fx);
}

static void client_disconnect(fx_t *fx)
{
    /* orderly close (FIN) mid-stream: noticed at the next writes */
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    while (!find_crlf(&c, "data: tick"))
        if (!cl_fill(&c)) break;
    cl_free(&c);
    BT_CHECK(wait_for(&fx->n_closed, 1, 3.0));

    /* reset (SO_LINGER 0): noticed by the read */
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    while (!find_crlf(&c, "data: tick"))
        if (!cl_fill(&c)) break;
    struct linger lg = {1, 0};
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    cl_free(&c);
    BT_CHECK(wait_for(&fx->n_closed, 2, 3.0));
    sleep_ms(100);
    BT_CHECK_EQ_INT(atomic_load(&fx->n_closed), 2); /* once each */

    /* reset before a late one-shot answer without on_close: respond says cancelled */
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    sleep_ms(10);
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    cl_free(&c);
    BT_CHECK(wait_for(&fx->n_late_cancelled, 1, 3.0));
}

static void test_client_disconnect_stream(void)
{
    fx_t fx;
    run_fixture(NULL, client_disconnect, &fx);
}

static void client_half_close(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    shutdown(c.fd, SHUT_WR);
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(strcmp(r.body, "slow") == 0);
    BT_CHECK(strstr(r.head, "Connection: close") != NULL);
    resp_free(&r);
    BT_CHECK(cl_wait_closed(&c));
    cl_free(&c);

    /* pipelined, then half-closed: every request is answered */
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                           "GET /sse HTTP/1.1\r\nHost: x\r\n\r\n"
                           "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    shutdown(c.fd, SHUT_WR);
    for (int k = 0; k < 3; k++) {
        BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
        BT_CHECK_EQ_INT(r.status, 200);
        resp_free(&r);
    }
    BT_CHECK(cl_wait_closed(&c));
    cl_free(&c);
}

static void test_half_close(void)
{
    fx_t fx;
    run_fixture(NULL, client_half_close, &fx);
    BT_CHECK_EQ_INT(atomic_load(&fx.n_closed), 0);
}

static void client_expect(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                           "Expect: 100-continue\r\n\r\n"));
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 100);
    BT_CHECK(strcmp(r.head, "HTTP/1.1 100 Continue\r\n\r\n") == 0);
    resp_free(&r);
    BT_CHECK(cl_send(c.fd, "hello"));
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(strcmp(r.body, "hello") == 0);
    resp_free(&r);
    cl_free(&c);

    /* over the limit: 413 without waiting for the body */
    BT_CHECK_EQ_INT(roundtrip(fx->port,
                              "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                              "Expect: 100-continue\r\n\r\n",
                              &r),
                    0);
    BT_CHECK_EQ_INT(r.status, 413);
    resp_free(&r);
    BT_CHECK_EQ_INT(roundtrip(fx->port,
                              "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                              "Expect: teapot\r\n\r\n",
                              &r),
                    0);
    BT_CHECK_EQ_INT(r.status, 417);
    resp_free(&r);
}

static void test_expect_continue(void)
{
    bt_http_limits_t l = small_limits();
    fx_t fx;
    run_fixture(&l, client_expect, &fx);
}

static void client_maxconn(fx_t *fx)
{
    cl_t a, b, d;
    resp_t r;
    cl_init(&a, cl_connect(fx->port));
    cl_init(&b, cl_connect(fx->port));
    cl_t *ab[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        BT_CHECK(cl_send(ab[k]->fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
        BT_CHECK_EQ_INT(cl_response(ab[k], &r), 0);
        BT_CHECK_EQ_INT(r.status, 200);
        resp_free(&r);
    }
    /* the third is closed at once */
    cl_init(&d, cl_connect(fx->port));
    BT_CHECK(cl_wait_closed(&d));
    cl_free(&d);
    /* after one goes, a new one is served */
    cl_free(&a);
    bool served = false;
    double t0 = now_s();
    while (!served && now_s() - t0 < 3.0) {
        cl_init(&d, cl_connect(fx->port));
        if (cl_send(d.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n") && cl_response(&d, &r) == 0 &&
            r.status == 200)
            served = true;
        resp_free(&r);
        cl_free(&d);
        if (!served) sleep_ms(20);
    }
    BT_CHECK(served);
    cl_free(&b);
}

static void test_max_connections(void)
{
    bt_http_limits_t l = bt_http_limits_default();
    l.max_connections = 2;
    fx_t fx;
    run_fixture(&l, client_maxconn, &fx);
}

static void client_flood(fx_t *fx)
{
    int fd = cl_connect_rcvbuf(fx->port, 4096);
    BT_CHECK(cl_send(fd, "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n"));
    /* never read: the server must cut this client off, not buffer without bound */
    BT_CHECK(wait_for(&fx->n_cancelled, 1, 10.0));
    BT_CHECK(wait_for(&fx->n_closed, 1, 3.0));
    close(fd);
}

static void test_write_backpressure(void)
{
    fx_t fx;
    run_fixture(NULL, client_flood, &fx);
    long b = atomic_load(&fx.flood_bytes);
    BT_CHECK_MSG(b > 0 && b < 64L * 1024 * 1024, "flooded %ld bytes", b);
}

/* reads and drops what arrives until the server closes (EOF or reset), bounded in time */
static bool cl_drain_closed(int fd, double secs)
{
    static char b[1 << 16];
    double t0 = now_s();
    while (now_s() - t0 < secs) {
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k == 0) return true;
        if (k < 0) return errno == ECONNRESET;
    }
    return false;
}

static void client_flood_end(fx_t *fx)
{
    int fd = cl_connect_rcvbuf(fx->port, 4096);
    BT_CHECK(cl_send(fd, "GET /flood-end HTTP/1.1\r\nHost: x\r\n\r\n"));
    BT_CHECK(wait_for(&fx->n_cancelled, 1, 10.0));
    /* the server closes the connection after the answer ended: by the time the client sees
     * the close, an on_close still armed would have fired (on freed state, in a gateway) */
    BT_CHECK(cl_drain_closed(fd, 10.0));
    BT_CHECK_EQ_INT(atomic_load(&fx->n_closed_after_end), 0);
    close(fd);
}

/* A stream cut off for reading too slowly, then ended by its handler in the same turn: the
 * final answer frees the request, and on_close never fires after it (a use after free and a
 * double free in the gateway before). */
static void test_stream_end_after_cutoff(void)
{
    fx_t fx;
    run_fixture(NULL, client_flood_end, &fx);
}

static void client_close_midstream(fx_t *fx)
{
    cl_t c, d;
    cl_init(&d, cl_connect(fx->port)); /* idle: closed by bt_http_server_close */
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(d.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&d, &r), 0);
    resp_free(&r);
    BT_CHECK(cl_send(c.fd, "GET /sse-then-close HTTP/1.1\r\nHost: x\r\n\r\n"));
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    BT_CHECK(r.body && strcmp(r.body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n") == 0);
    resp_free(&r);
    BT_CHECK(cl_wait_closed(&c));
    BT_CHECK(cl_wait_closed(&d));
    BT_CHECK(wait_for(&fx->server_closed, 1, 3.0));
    BT_CHECK(cl_connect(fx->port) < 0); /* no longer listening */
    cl_free(&c);
    cl_free(&d);
}

static void test_server_close_midstream(void)
{
    fx_t fx;
    run_fixture(NULL, client_close_midstream, &fx);
}

/* Reads one response with a pause between reads of at most 64 KiB (a slow reader); returns
 * the body bytes received after the head, or -1 when the head never came. */
static long cl_slow_body(int fd, int pause_ms)
{
    static char b[1 << 16];
    long body = -1;
    char head[4096];
    size_t hl = 0;
    double t0 = now_s();
    while (now_s() - t0 < 10.0) {
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k <= 0) break;
        size_t off = 0;
        if (body < 0) { /* still in the head */
            size_t take = (size_t)k < sizeof head - 1 - hl ? (size_t)k : sizeof head - 1 - hl;
            memcpy(head + hl, b, take);
            hl += take;
            head[hl] = 0;
            const char *e = strstr(head, "\r\n\r\n");
            if (!e) continue;
            off = (size_t)(e + 4 - head) - (hl - take);
            body = 0;
        }
        body += k - (long)off;
        if (body >= BIG_BYTES) break;
        if (pause_ms) sleep_ms(pause_ms);
    }
    return body;
}

/* A client that stops reading an answer (here one that asked for Connection: close) is cut
 * off once none of the output pending for it went out for send_timeout_ms: before, the
 * connection waited for it forever, and the server's close with it. */
static void client_send_stall(fx_t *fx)
{
    int fd = cl_connect_rcvbuf(fx->port, 4096);
    BT_CHECK(cl_send(fd, "GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    sleep_ms(1500); /* several send timeouts (300 ms) without reading */
    const long got = cl_slow_body(fd, 0);
    BT_CHECK_MSG(got < BIG_BYTES, "the stalled client still got all %ld bytes", got);
    close(fd);
}

static void test_send_timeout(void)
{
    fx_t fx;
    bt_http_limits_t lim = bt_http_limits_default();
    lim.send_timeout_ms = 300;
    run_fixture(&lim, client_send_stall, &fx);
}

/* A slow reader keeps its answer: the keep-alive idle timer (300 ms here) does not cut a
 * connection whose answer is still going out, nor does the server's close; each took it
 * for an idle one and closed it mid-body. */
static void client_slow_reader(fx_t *fx)
{
    int fd = cl_connect_rcvbuf(fx->port, 1 << 16);
    BT_CHECK(cl_send(fd, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"));
    long got = cl_slow_body(fd, 20); /* 64 KiB every 20 ms: about 3 s */
    BT_CHECK_MSG(got == BIG_BYTES, "idle timer: the slow reader got %ld of %d bytes", got,
                 (int)BIG_BYTES);
    close(fd);
    fd = cl_connect_rcvbuf(fx->port, 1 << 16);
    BT_CHECK(cl_send(fd, "GET /big-then-close HTTP/1.1\r\nHost: x\r\n\r\n"));
    got = cl_slow_body(fd, 20);
    BT_CHECK_MSG(got == BIG_BYTES, "server close: the slow reader got %ld of %d bytes", got,
                 (int)BIG_BYTES);
    close(fd);
}

static void test_slow_reader_keeps_answer(void)
{
    fx_t fx;
    bt_http_limits_t lim = bt_http_limits_default();
    lim.idle_timeout_ms = 300;
    run_fixture(&lim, client_slow_reader, &fx);
}

/* With eof_cancels, a client that closes its end while its request is being answered is
 * gone: the request's on_close fires (or its late answer is refused), nothing is sent. */
static void client_eof_cancels(fx_t *fx)
{
    cl_t c;
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n"));
    BT_CHECK(wait_for(&fx->n_requests, 1, 3.0));
    shutdown(c.fd, SHUT_WR);
    BT_CHECK(wait_for(&fx->n_closed, 1, 3.0));
    cl_free(&c);
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    shutdown(c.fd, SHUT_WR);
    BT_CHECK(wait_for(&fx->n_late_cancelled, 1, 3.0));
    char b[64];
    BT_CHECK_MSG(recv(c.fd, b, sizeof b, 0) <= 0, "an answer came to a client that left");
    cl_free(&c);
    /* a request answered at once still goes out (nothing left to cancel) */
    cl_init(&c, cl_connect(fx->port));
    BT_CHECK(cl_send(c.fd, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
    shutdown(c.fd, SHUT_WR);
    resp_t r;
    BT_CHECK_EQ_INT(cl_response(&c, &r), 0);
    BT_CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    cl_free(&c);
}

static void test_eof_cancels(void)
{
    fx_t fx;
    bt_http_limits_t lim = bt_http_limits_default();
    lim.eof_cancels = true;
    run_fixture(&lim, client_eof_cancels, &fx);
}

static void client_curl(fx_t *fx)
{
    if (system("command -v curl >/dev/null 2>&1") != 0) {
        fprintf(stderr, "curl not installed: test_curl skipped\n");
        return;
    }
    struct {
        const char *args, *want;
    } cases[] = {
        {"-N http://127.0.0.1:%d/sse", "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"},
        {"-X POST --data-binary abc http://127.0.0.1:%d/echo", "abc"},
        {"-H 'Expect: 100-continue' --data-binary hello http://127.0.0.1:%d/echo", "hello"},
        {"-H 'Transfer-Encoding: chunked' --data-binary chunky http://127.0.0.1:%d/echo", "chunky"},
        {"http://127.0.0.1:%d/hello http://127.0.0.1:%d/hello", "hellohello"}, /* reuse */
        {"-w '%%{http_code}' -o /dev/null --data-binary @- http://127.0.0.1:%d/echo", "413"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512], cmd[700];
        snprintf(args, sizeof args, cases[i].args, fx->port, fx->port);
        /* stdin: a body over the 1 KiB limit for the @- case */
        snprintf(cmd, sizeof cmd,
                 "head -c 100000 /dev/zero 2>/dev/null | curl -sS --max-time 10 %s 2>&1", args);
        FILE *p = popen(cmd, "r");
        BT_CHECK(p != NULL);
        if (!p) continue;
        char out[4096];
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        pclose(p);
        BT_CHECK_MSG(strcmp(out, cases[i].want) == 0, "curl %s: got '%s'", args, out);
    }
}

static void test_curl(void)
{
    bt_http_limits_t l = small_limits();
    fx_t fx;
    run_fixture(&l, client_curl, &fx);
}

static void test_parse_probe(void)
{
    bt_http_limits_t l = small_limits();
    struct {
        const char *in;
        int want;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200},
        {"GET / HTTP/1.1\r\nHost: x\r\n", 0},
        {"", 0},
        {"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nab", 0},
        {"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 200},
        {"POST /a HTTP/1.1\r\nContent-Length: 3000\r\n\r\n", 413},
        {"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200},
        {"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n", 0},
        {"POST /a HTTP/1.1\r\nExpect: nope\r\nContent-Length: 1\r\n\r\n", 417},
        {"BLAH\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n", 200},
        {"GET / HTTP/1.1\r\n\r\n\x01\x02", 200},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = bt_http_parse_probe((const uint8_t *)cases[i].in, strlen(cases[i].in), &l);
        BT_CHECK_MSG(got == cases[i].want, "case %zu: %d, want %d", i, got, cases[i].want);
    }
    /* over the chunked limit */
    char big[4000];
    int n = snprintf(big, sizeof big, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int k = 0; k < 3; k++) {
        n += snprintf(big + n, sizeof big - (size_t)n, "200\r\n");
        memset(big + n, 'z', 512);
        n += 512;
        n += snprintf(big + n, sizeof big - (size_t)n, "\r\n");
    }
    BT_CHECK_EQ_INT(bt_http_parse_probe((const uint8_t *)big, (size_t)n, &l), 413);
    /* an unfinished head over the limit */
    char *head = malloc(40000);
    n = sprintf(head, "GET / HTTP/1.1\r\nX: ");
    memset(head + n, 'h', 30000);
    BT_CHECK_EQ_INT(bt_http_parse_probe((const uint8_t *)head, (size_t)n + 30000, NULL), 431);
    free(head);
}

int main(void)
{
    signal(SIGALRM, watchdog);
    signal(SIGPIPE, SIG_IGN);
    bt_log_set_level(BT_LOG_ERROR);
    BT_RUN(test_parse_probe);
    BT_RUN(test_keepalive_get);
    BT_RUN(test_post_content_length);
    BT_RUN(test_chunked_request);
    BT_RUN(test_pipelined);
    BT_RUN(test_sse_stream);
    BT_RUN(test_413_body_limit);
    BT_RUN(test_431_headers);
    BT_RUN(test_400_garbage);
    BT_RUN(test_408_slowloris);
    BT_RUN(test_client_disconnect_stream);
    BT_RUN(test_half_close);
    BT_RUN(test_expect_continue);
    BT_RUN(test_max_connections);
    BT_RUN(test_write_backpressure);
    BT_RUN(test_stream_end_after_cutoff);
    BT_RUN(test_server_close_midstream);
    BT_RUN(test_send_timeout);
    BT_RUN(test_slow_reader_keeps_answer);
    BT_RUN(test_eof_cancels);
    BT_RUN(test_curl);
    return bt_test_summary();
}

/* gRPC C core on a libuv loop (see rpc.h and PLUMBING.md).
 *
 * Threading: one thread per bt_rpc_t blocks in grpc_completion_queue_next and appends
 * (tag, ok) to a mutex-protected vector, then uv_async_send()s. Everything else — starting
 * batches, state machines, user callbacks — runs on the loop thread.
 *
 * Every completion-queue tag is a pointer to an rpc_tag_t embedded in the object that owns
 * the batch; dispatch calls tag->fn(tag, ok). Objects count the batches they have started
 * (`outstanding`) and are freed only when that count is zero and they are logically done. */
#include "common/rpc/rpc.h"

#include "common/alloc.h"
#include "common/log.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/string_util.h>
#include <grpc/support/time.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

#define DEFAULT_MAX_MESSAGE_BYTES ((size_t)64 << 20)
#define REQUEST_SLOTS 4          /* server_request_call kept outstanding per server */
#define DESTROY_DRAIN_MS 10000   /* bt_rpc_destroy waits at most this for cancelled calls */

typedef struct rpc_tag rpc_tag_t;
struct rpc_tag {
    void (*fn)(rpc_tag_t *tag, int ok);
};

typedef struct {
    rpc_tag_t *tag;
    int ok;
} rpc_event_t;

struct bt_rpc {
    uv_loop_t *loop;
    grpc_completion_queue *cq;
    uv_thread_t thread;
    uv_async_t *async; /* separately allocated: freed by its close callback */

    uv_mutex_t mu; /* guards events/nevents/cap */
    uv_cond_t cond;
    rpc_event_t *events;
    size_t nevents, cap;
    rpc_event_t *batch; /* loop thread only: the events being dispatched */
    size_t batch_cap;
    int dispatching; /* inside rpc_dispatch_once (bt_rpc_destroy is refused there) */

    bt_rpc_server_t *servers; /* live servers (not yet released) */
    bt_rpc_channel_t *channels;
};

/* ---- event queue ------------------------------------------------------------------------ */

static void rpc_push(bt_rpc_t *rpc, rpc_tag_t *tag, int ok)
{
    uv_mutex_lock(&rpc->mu);
    if (rpc->nevents == rpc->cap) {
        rpc->cap = rpc->cap ? rpc->cap * 2 : 64;
        rpc->events = bt_realloc_or_die(rpc->events, rpc->cap * sizeof *rpc->events);
    }
    rpc->events[rpc->nevents++] = (rpc_event_t){tag, ok};
    uv_cond_signal(&rpc->cond);
    uv_mutex_unlock(&rpc->mu);
    uv_async_send(rpc->async);
}

/* Takes what is queued now and dispatches it; returns how many events ran. Events queued
 * while dispatching wait for the next round (the async fires again), so a busy queue cannot
 * starve the loop. */
static size_t rpc_dispatch_once(bt_rpc_t *rpc)
{
    uv_mutex_lock(&rpc->mu);
    rpc_event_t *ev = rpc->events;
    size_t cap = rpc->cap, n = rpc->nevents;
    rpc->events = rpc->batch;
    rpc->cap = rpc->batch_cap;
    rpc->nevents = 0;
    uv_mutex_unlock(&rpc->mu);
    rpc->batch = ev;
    rpc->batch_cap = cap;
    rpc->dispatching++;
    for (size_t i = 0; i < n; i++) ev[i].tag->fn(ev[i].tag, ev[i].ok);
    rpc->dispatching--;
    return n;
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void on_async(uv_async_t *h)
{
    rpc_dispatch_once((bt_rpc_t *)h->data);
}

static void cq_thread_main(void *arg)
{
    bt_rpc_t *rpc = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(rpc->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type == GRPC_OP_COMPLETE) rpc_push(rpc, ev.tag, ev.success);
    }
}

/* Starts a batch; a refused batch completes (ok = 0) through the queue like any other, so
 * callers have one path. The caller has already counted it as outstanding. */
static void start_batch(bt_rpc_t *rpc, grpc_call *call, const grpc_op *ops, size_t n,
                        rpc_tag_t *tag)
{
    grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        BT_LOG_ERROR("rpc: grpc_call_start_batch refused a batch of %zu ops (error %d)", n, (int)e);
        rpc_push(rpc, tag, 0);
    }
}

/* ---- helpers ---------------------------------------------------------------------------- */

const char *bt_rpc_code_name(bt_rpc_code_t code)
{
    static const char *const names[] = {
        "OK",          "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS",    "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL",        "UNAVAILABLE",       "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN_CODE";
}

static grpc_byte_buffer *bytes_to_buffer(const uint8_t *msg, size_t len)
{
    grpc_slice s = len ? grpc_slice_from_copied_buffer((const char *)msg, len) : grpc_empty_slice();
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Reads a (possibly multi-slice) buffer into one slice; the caller unrefs it. */
static grpc_slice buffer_to_slice(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return s;
}

static grpc_arg int_arg(const char *key, int value)
{
    grpc_arg a;
    memset(&a, 0, sizeof a);
    a.type = GRPC_ARG_INTEGER;
    a.key = (char *)key;
    a.value.integer = value;
    return a;
}

static int message_limit(const bt_rpc_options_t *opts)
{
    size_t n = opts && opts->max_message_bytes ? opts->max_message_bytes : DEFAULT_MAX_MESSAGE_BYTES;
    return n > INT_MAX ? INT_MAX : (int)n;
}

static gpr_timespec deadline_after(int64_t ms)
{
    if (ms <= 0) return gpr_inf_future(GPR_CLOCK_REALTIME);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* ---- lifecycle -------------------------------------------------------------------------- */

bt_status_t bt_rpc_create(uv_loop_t *loop, bt_rpc_t **rpc_p)
{
    if (!loop || !rpc_p) return BT_ERR_INVALID_ARG;
    bt_rpc_t *rpc = calloc(1, sizeof *rpc);
    if (!rpc) return BT_ERR_NO_MEMORY;
    rpc->loop = loop;
    rpc->async = calloc(1, sizeof *rpc->async);
    if (!rpc->async) goto err_free;
    if (uv_mutex_init(&rpc->mu) != 0) goto err_free;
    if (uv_cond_init(&rpc->cond) != 0) goto err_mutex;
    if (uv_async_init(loop, rpc->async, on_async) != 0) goto err_cond;
    rpc->async->data = rpc;
    grpc_init();
    rpc->cq = grpc_completion_queue_create_for_next(NULL);
    if (uv_thread_create(&rpc->thread, cq_thread_main, rpc) != 0) goto err_grpc;
    *rpc_p = rpc;
    return BT_OK;

err_grpc:
    grpc_completion_queue_shutdown(rpc->cq);
    grpc_completion_queue_destroy(rpc->cq);
    grpc_shutdown();
    uv_close((uv_handle_t *)rpc->async, free_handle);
    rpc->async = NULL;
err_cond:
    uv_cond_destroy(&rpc->cond);
err_mutex:
    uv_mutex_destroy(&rpc->mu);
err_free:
    free(rpc->async);
    free(rpc);
    return BT_ERR_INTERNAL;
}

uv_loop_t *bt_rpc_loop(const bt_rpc_t *rpc)
{
    return rpc ? rpc->loop : NULL;
}

/* ---- server ----------------------------------------------------------------------------- */

typedef struct {
    char *name;
    bt_rpc_kind_t kind;
    bt_rpc_handler_fn fn;
    void *ctx;
} method_t;

typedef struct {
    rpc_tag_t tag;
    bt_rpc_server_t *srv;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    int pending;
} request_slot_t;

struct bt_rpc_server {
    bt_rpc_t *rpc;
    bt_rpc_server_t *prev, *next; /* rpc->servers */
    grpc_server *server;
    int port;
    method_t *methods;
    size_t nmethods;
    request_slot_t slots[REQUEST_SLOTS];
    int npending; /* request slots outstanding */
    rpc_tag_t shutdown_tag;
    uv_timer_t grace_timer;
    int started, shutting_down, shutdown_notified, released;
    bt_rpc_call_t *calls;
    size_t ncalls;
    void (*on_down)(void *ctx);
    void *down_ctx;
};

typedef struct send_item {
    struct send_item *next;
    grpc_byte_buffer *bb; /* NULL: status only */
    void (*on_sent)(void *ctx, bt_status_t st);
    void *ctx;
    int has_status;
    grpc_status_code code;
    char *details; /* NULL: none */
} send_item_t;

struct bt_rpc_call {
    bt_rpc_server_t *srv;
    bt_rpc_call_t *prev, *next; /* srv->calls */
    grpc_call *call;
    const method_t *method; /* NULL: unknown method */
    gpr_timespec deadline;
    char *peer; /* gpr_malloc'd, fetched on first use */

    rpc_tag_t start_tag, close_tag, send_tag, note_tag;
    grpc_byte_buffer *recv_bb;
    int cancelled; /* RECV_CLOSE_ON_SERVER output */
    int outstanding;
    int initial_md_sent;
    int peer_cancelled; /* the close batch said cancelled */
    int user_owned;     /* handler called, finish not yet */
    int finished;       /* status queued (by the user or internally) */
    int cancel_noted;   /* on_cancel delivered or posted */

    send_item_t *sq_head, *sq_tail, *inflight;
    grpc_slice status_slice;
    void (*on_cancel)(void *ctx);
    void *cancel_ctx;
};

static void server_request(request_slot_t *slot);
static void server_maybe_release(bt_rpc_server_t *srv);

static void call_maybe_free(bt_rpc_call_t *c)
{
    if (c->outstanding > 0 || !c->finished || c->inflight || c->sq_head) return;
    bt_rpc_server_t *srv = c->srv;
    if (c->prev) c->prev->next = c->next;
    else srv->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    srv->ncalls--;
    grpc_call_unref(c->call);
    if (c->peer) gpr_free(c->peer);
    free(c);
    server_maybe_release(srv);
}

static void call_pump(bt_rpc_call_t *c)
{
    if (c->inflight || !c->sq_head) return;
    send_item_t *it = c->sq_head;
    c->sq_head = it->next;
    if (!c->sq_head) c->sq_tail = NULL;
    c->inflight = it;

    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->initial_md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
        c->initial_md_sent = 1;
    }
    if (it->bb) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = it->bb;
        n++;
    }
    if (it->has_status) {
        c->status_slice = grpc_slice_from_copied_string(it->details ? it->details : "");
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.trailing_metadata_count = 0;
        ops[n].data.send_status_from_server.status = it->code;
        ops[n].data.send_status_from_server.status_details = it->details ? &c->status_slice : NULL;
        n++;
    }
    c->outstanding++;
    start_batch(c->srv->rpc, c->call, ops, n, &c->send_tag);
}

static void call_enqueue(bt_rpc_call_t *c, send_item_t *it)
{
    if (c->sq_tail) c->sq_tail->next = it;
    else c->sq_head = it;
    c->sq_tail = it;
    call_pump(c);
}

/* Queues the final status (after queued messages); the call is ours from here on. */
static void call_end(bt_rpc_call_t *c, grpc_byte_buffer *bb, grpc_status_code code,
                     const char *details)
{
    send_item_t *it = bt_calloc_or_die(1, sizeof *it);
    it->bb = bb;
    it->has_status = 1;
    it->code = code;
    it->details = details ? bt_strdup_or_die(details) : NULL;
    c->finished = 1;
    c->user_owned = 0;
    call_enqueue(c, it);
}

static void on_call_send(rpc_tag_t *t, int ok)
{
    bt_rpc_call_t *c = container_of(t, bt_rpc_call_t, send_tag);
    send_item_t *it = c->inflight;
    c->outstanding--;
    c->inflight = NULL;
    if (it->has_status) grpc_slice_unref(c->status_slice);
    if (it->bb) grpc_byte_buffer_destroy(it->bb);
    if (it->on_sent) it->on_sent(it->ctx, ok ? BT_OK : BT_ERR_CANCELLED);
    free(it->details);
    free(it);
    call_pump(c);
    call_maybe_free(c);
}

static void call_notify_cancel(bt_rpc_call_t *c)
{
    if (c->cancel_noted || !c->user_owned || !c->on_cancel) return;
    c->cancel_noted = 1;
    c->on_cancel(c->cancel_ctx);
}

static void on_call_close(rpc_tag_t *t, int ok)
{
    bt_rpc_call_t *c = container_of(t, bt_rpc_call_t, close_tag);
    c->outstanding--;
    if (!ok || c->cancelled) {
        c->peer_cancelled = 1;
        call_notify_cancel(c);
    }
    call_maybe_free(c);
}

static void on_call_note(rpc_tag_t *t, int ok)
{
    bt_rpc_call_t *c = container_of(t, bt_rpc_call_t, note_tag);
    c->outstanding--;
    if (c->user_owned && c->on_cancel) c->on_cancel(c->cancel_ctx);
    call_maybe_free(c);
}

static void on_call_start(rpc_tag_t *t, int ok)
{
    bt_rpc_call_t *c = container_of(t, bt_rpc_call_t, start_tag);
    c->outstanding--;
    if (!ok || !c->recv_bb || c->peer_cancelled) {
        if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
        c->recv_bb = NULL;
        call_end(c, NULL, ok && !c->peer_cancelled ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_CANCELLED,
                 ok && !c->peer_cancelled ? "no request message" : NULL);
        call_maybe_free(c);
        return;
    }
    grpc_slice req = buffer_to_slice(c->recv_bb);
    grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    c->user_owned = 1;
    c->method->fn(c->method->ctx, c, GRPC_SLICE_START_PTR(req), GRPC_SLICE_LENGTH(req));
    grpc_slice_unref(req);
    call_maybe_free(c);
}

static void call_begin(bt_rpc_call_t *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    c->outstanding++;
    start_batch(c->srv->rpc, c->call, &op, 1, &c->close_tag);

    if (!c->method) {
        call_end(c, NULL, GRPC_STATUS_UNIMPLEMENTED, "unknown method");
        return;
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 0;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &c->recv_bb;
    c->initial_md_sent = 1;
    c->outstanding++;
    start_batch(c->srv->rpc, c->call, ops, 2, &c->start_tag);
}

static const method_t *server_find_method(const bt_rpc_server_t *srv, grpc_slice name)
{
    for (size_t i = 0; i < srv->nmethods; i++)
        if (grpc_slice_str_cmp(name, srv->methods[i].name) == 0) return &srv->methods[i];
    return NULL;
}

static void on_request(rpc_tag_t *t, int ok)
{
    request_slot_t *slot = container_of(t, request_slot_t, tag);
    bt_rpc_server_t *srv = slot->srv;
    slot->pending = 0;
    srv->npending--;
    grpc_call *gc = slot->call;
    slot->call = NULL;
    bt_rpc_call_t *c = NULL;
    if (ok && gc) {
        c = bt_calloc_or_die(1, sizeof *c);
        c->srv = srv;
        c->call = gc;
        c->method = server_find_method(srv, slot->details.method);
        c->deadline = slot->details.deadline;
        c->start_tag.fn = on_call_start;
        c->close_tag.fn = on_call_close;
        c->send_tag.fn = on_call_send;
        c->note_tag.fn = on_call_note;
        c->next = srv->calls;
        if (srv->calls) srv->calls->prev = c;
        srv->calls = c;
        srv->ncalls++;
    } else if (gc) {
        grpc_call_unref(gc);
    }
    grpc_call_details_destroy(&slot->details);
    grpc_metadata_array_destroy(&slot->md);
    if (!ok && !srv->shutting_down) BT_LOG_ERROR("rpc: server request slot failed; one fewer");
    /* request the next call first */
    if (ok && !srv->shutting_down) server_request(slot);
    if (c) call_begin(c);
    server_maybe_release(srv);
}

static void server_request(request_slot_t *slot)
{
    bt_rpc_server_t *srv = slot->srv;
    grpc_call_details_init(&slot->details);
    grpc_metadata_array_init(&slot->md);
    slot->call = NULL;
    grpc_call_error e = grpc_server_request_call(srv->server, &slot->call, &slot->details,
                                                 &slot->md, srv->rpc->cq, srv->rpc->cq, &slot->tag);
    if (e != GRPC_CALL_OK) {
        BT_LOG_ERROR("rpc: grpc_server_request_call failed (error %d)", (int)e);
        grpc_call_details_destroy(&slot->details);
        grpc_metadata_array_destroy(&slot->md);
        return;
    }
    slot->pending = 1;
    srv->npending++;
}

static void on_server_closed(uv_handle_t *h)
{
    bt_rpc_server_t *srv = h->data;
    void (*on_down)(void *) = srv->on_down;
    void *ctx = srv->down_ctx;
    for (size_t i = 0; i < srv->nmethods; i++) free(srv->methods[i].name);
    free(srv->methods);
    free(srv);
    if (on_down) on_down(ctx);
}

static void server_maybe_release(bt_rpc_server_t *srv)
{
    if (srv->released || !srv->shutdown_notified || srv->ncalls || srv->npending) return;
    srv->released = 1;
    grpc_server_destroy(srv->server);
    srv->server = NULL;
    bt_rpc_t *rpc = srv->rpc;
    if (srv->prev) srv->prev->next = srv->next;
    else rpc->servers = srv->next;
    if (srv->next) srv->next->prev = srv->prev;
    uv_timer_stop(&srv->grace_timer);
    uv_close((uv_handle_t *)&srv->grace_timer, on_server_closed);
}

static void on_server_shutdown(rpc_tag_t *t, int ok)
{
    bt_rpc_server_t *srv = container_of(t, bt_rpc_server_t, shutdown_tag);
    srv->shutdown_notified = 1;
    server_maybe_release(srv);
}

static void on_grace(uv_timer_t *h)
{
    bt_rpc_server_t *srv = h->data;
    if (srv->server) grpc_server_cancel_all_calls(srv->server);
}

bt_status_t bt_rpc_server_create(bt_rpc_t *rpc, const char *addr, const bt_rpc_options_t *opts,
                                 bt_rpc_server_t **srv_p)
{
    if (!rpc || !addr || !srv_p) return BT_ERR_INVALID_ARG;
    grpc_arg args[5];
    size_t n = 0;
    int limit = message_limit(opts);
    args[n++] = int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, limit);
    args[n++] = int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, limit);
    /* a second server on the same port must fail, not share it */
    args[n++] = int_arg(GRPC_ARG_ALLOW_REUSEPORT, 0);
    /* accept client keepalive pings down to one a second */
    args[n++] = int_arg(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    if (opts && opts->keepalive_ms > 0) args[n++] = int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, opts->keepalive_ms);
    grpc_channel_args ca = {n, args};

    grpc_server *gs = grpc_server_create(&ca, NULL);
    if (!gs) return BT_ERR_INTERNAL;
    grpc_server_register_completion_queue(gs, rpc->cq, NULL);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(gs, addr, creds);
    grpc_server_credentials_release(creds);
    if (port == 0) {
        BT_LOG_ERROR("rpc: cannot listen on %s", addr);
        grpc_server_destroy(gs);
        return BT_ERR_IO;
    }
    bt_rpc_server_t *srv = bt_calloc_or_die(1, sizeof *srv);
    srv->rpc = rpc;
    srv->server = gs;
    srv->port = port;
    srv->shutdown_tag.fn = on_server_shutdown;
    for (int i = 0; i < REQUEST_SLOTS; i++) {
        srv->slots[i].tag.fn = on_request;
        srv->slots[i].srv = srv;
    }
    uv_timer_init(rpc->loop, &srv->grace_timer);
    srv->grace_timer.data = srv;
    srv->next = rpc->servers;
    if (rpc->servers) rpc->servers->prev = srv;
    rpc->servers = srv;
    *srv_p = srv;
    return BT_OK;
}

bt_status_t bt_rpc_server_method(bt_rpc_server_t *srv, const char *method, bt_rpc_kind_t kind,
                                 bt_rpc_handler_fn fn, void *ctx)
{
    if (!srv || !method || !fn || srv->started || srv->shutting_down) return BT_ERR_INVALID_ARG;
    if (kind != BT_RPC_UNARY && kind != BT_RPC_SERVER_STREAM) return BT_ERR_INVALID_ARG;
    for (size_t i = 0; i < srv->nmethods; i++)
        if (strcmp(srv->methods[i].name, method) == 0) return BT_ERR_INVALID_ARG;
    srv->methods = bt_realloc_or_die(srv->methods, (srv->nmethods + 1) * sizeof *srv->methods);
    srv->methods[srv->nmethods++] = (method_t){bt_strdup_or_die(method), kind, fn, ctx};
    return BT_OK;
}

bt_status_t bt_rpc_server_start(bt_rpc_server_t *srv)
{
    if (!srv || srv->started || srv->shutting_down) return BT_ERR_INVALID_ARG;
    grpc_server_start(srv->server);
    srv->started = 1;
    for (int i = 0; i < REQUEST_SLOTS; i++) server_request(&srv->slots[i]);
    if (srv->npending == 0) return BT_ERR_INTERNAL;
    return BT_OK;
}

int bt_rpc_server_port(const bt_rpc_server_t *srv)
{
    return srv ? srv->port : 0;
}

void bt_rpc_server_shutdown(bt_rpc_server_t *srv, int grace_ms, void (*on_down)(void *ctx),
                            void *ctx)
{
    if (!srv || srv->shutting_down) return;
    srv->shutting_down = 1;
    srv->on_down = on_down;
    srv->down_ctx = ctx;
    grpc_server_shutdown_and_notify(srv->server, srv->rpc->cq, &srv->shutdown_tag);
    if (grace_ms <= 0) grpc_server_cancel_all_calls(srv->server);
    else uv_timer_start(&srv->grace_timer, on_grace, (uint64_t)grace_ms, 0);
}

bt_status_t bt_rpc_call_send(bt_rpc_call_t *call, const uint8_t *msg, size_t len,
                             void (*on_sent)(void *ctx, bt_status_t st), void *ctx)
{
    if (!call || (!msg && len) || call->finished) return BT_ERR_INVALID_ARG;
    if (call->method->kind != BT_RPC_SERVER_STREAM) return BT_ERR_INVALID_ARG;
    send_item_t *it = bt_calloc_or_die(1, sizeof *it);
    it->bb = bytes_to_buffer(msg, len);
    it->on_sent = on_sent;
    it->ctx = ctx;
    call_enqueue(call, it);
    return BT_OK;
}

bt_status_t bt_rpc_call_reply(bt_rpc_call_t *call, const uint8_t *msg, size_t len)
{
    if (!call || (!msg && len) || call->finished) return BT_ERR_INVALID_ARG;
    call_end(call, bytes_to_buffer(msg, len), GRPC_STATUS_OK, NULL);
    return BT_OK;
}

void bt_rpc_call_finish(bt_rpc_call_t *call, bt_rpc_code_t code, const char *message)
{
    if (!call) return;
    if (call->finished) { /* e.g. finish after reply: the call is still alive until the loop runs */
        BT_LOG_ERROR("rpc: call finished twice (%s); ignored", bt_rpc_code_name(code));
        return;
    }
    call_end(call, NULL, (grpc_status_code)code, message);
}

void bt_rpc_call_on_cancel(bt_rpc_call_t *call, void (*fn)(void *ctx), void *ctx)
{
    if (!call || call->finished) return;
    call->on_cancel = fn;
    call->cancel_ctx = ctx;
    if (fn && call->peer_cancelled && !call->cancel_noted) {
        /* already cancelled: tell the handler from the loop, not from inside this call */
        call->cancel_noted = 1;
        call->outstanding++;
        rpc_push(call->srv->rpc, &call->note_tag, 1);
    }
}

int64_t bt_rpc_call_deadline_left_ms(const bt_rpc_call_t *call)
{
    if (!call) return 0;
    gpr_timespec d = call->deadline;
    if (d.tv_sec == INT64_MAX || gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0) return INT64_MAX;
    d = gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t ms = left.tv_sec * 1000 + left.tv_nsec / 1000000;
    return ms > 0 ? ms : 0;
}

const char *bt_rpc_call_peer(const bt_rpc_call_t *call)
{
    if (!call) return "";
    bt_rpc_call_t *c = (bt_rpc_call_t *)call; /* lazily filled cache */
    if (!c->peer) c->peer = grpc_call_get_peer(c->call);
    return c->peer ? c->peer : "";
}

/* ---- client ----------------------------------------------------------------------------- */

struct bt_rpc_channel {
    bt_rpc_t *rpc;
    bt_rpc_channel_t *prev, *next; /* rpc->channels */
    grpc_channel *channel;
    bt_rpc_client_call_t *calls;
    size_t ncalls;
    int destroying;
};

struct bt_rpc_client_call {
    bt_rpc_channel_t *ch;
    bt_rpc_client_call_t *prev, *next; /* ch->calls */
    grpc_call *call;
    int streaming;
    bt_rpc_reply_fn on_reply;
    bt_rpc_message_fn on_message;
    bt_rpc_done_fn on_done;
    void *ctx;

    rpc_tag_t main_tag, status_tag, msg_tag;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
    int outstanding;
    int status_done, stream_ended, done, cancelled;
};

static void channel_maybe_release(bt_rpc_channel_t *ch)
{
    if (!ch->destroying || ch->ncalls) return;
    bt_rpc_t *rpc = ch->rpc;
    if (ch->prev) ch->prev->next = ch->next;
    else rpc->channels = ch->next;
    if (ch->next) ch->next->prev = ch->prev;
    grpc_channel_destroy(ch->channel);
    free(ch);
}

static void client_call_maybe_free(bt_rpc_client_call_t *cc)
{
    if (cc->outstanding > 0 || !cc->done) return;
    bt_rpc_channel_t *ch = cc->ch;
    if (cc->prev) cc->prev->next = cc->next;
    else ch->calls = cc->next;
    if (cc->next) cc->next->prev = cc->prev;
    ch->ncalls--;
    if (cc->send_bb) grpc_byte_buffer_destroy(cc->send_bb);
    if (cc->recv_bb) grpc_byte_buffer_destroy(cc->recv_bb);
    grpc_metadata_array_destroy(&cc->initial_md);
    grpc_metadata_array_destroy(&cc->trailing_md);
    grpc_slice_unref(cc->details);
    grpc_call_unref(cc->call);
    free(cc);
    channel_maybe_release(ch);
}

/* Final code and message (gpr_malloc'd or NULL) of a call whose status batch completed. */
static bt_rpc_code_t client_call_status(bt_rpc_client_call_t *cc, int ok, char **msg_p)
{
    bt_rpc_code_t code = ok ? (bt_rpc_code_t)cc->status : BT_RPC_INTERNAL;
    *msg_p = NULL;
    if (ok && GRPC_SLICE_LENGTH(cc->details) > 0) *msg_p = grpc_slice_to_c_string(cc->details);
    if (cc->cancelled && code != BT_RPC_CANCELLED) {
        code = BT_RPC_CANCELLED;
        if (*msg_p) gpr_free(*msg_p);
        *msg_p = NULL;
    }
    if ((unsigned)code > BT_RPC_UNAUTHENTICATED) code = BT_RPC_UNKNOWN;
    return code;
}

static void on_unary_done(rpc_tag_t *t, int ok)
{
    bt_rpc_client_call_t *cc = container_of(t, bt_rpc_client_call_t, main_tag);
    cc->outstanding--;
    char *msg;
    bt_rpc_code_t code = client_call_status(cc, ok, &msg);
    grpc_slice resp = grpc_empty_slice();
    if (code == BT_RPC_OK && cc->recv_bb) resp = buffer_to_slice(cc->recv_bb);
    else if (code == BT_RPC_OK) {
        code = BT_RPC_INTERNAL; /* OK without a message breaks the unary contract */
        if (!msg) msg = gpr_strdup("no response message");
    }
    cc->done = 1;
    cc->on_reply(cc->ctx, code, msg, code == BT_RPC_OK ? GRPC_SLICE_START_PTR(resp) : NULL,
                 code == BT_RPC_OK ? GRPC_SLICE_LENGTH(resp) : 0);
    grpc_slice_unref(resp);
    if (msg) gpr_free(msg);
    client_call_maybe_free(cc);
}

static void stream_maybe_done(bt_rpc_client_call_t *cc)
{
    if (cc->done || !cc->status_done || !cc->stream_ended) return;
    char *msg;
    bt_rpc_code_t code = client_call_status(cc, 1, &msg);
    cc->done = 1;
    cc->on_done(cc->ctx, code, msg);
    if (msg) gpr_free(msg);
}

static void stream_recv_next(bt_rpc_client_call_t *cc)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &cc->recv_bb;
    cc->recv_bb = NULL;
    cc->outstanding++;
    start_batch(cc->ch->rpc, cc->call, &op, 1, &cc->msg_tag);
}

static void on_stream_start(rpc_tag_t *t, int ok)
{
    bt_rpc_client_call_t *cc = container_of(t, bt_rpc_client_call_t, main_tag);
    cc->outstanding--;
    client_call_maybe_free(cc);
}

static void on_stream_status(rpc_tag_t *t, int ok)
{
    bt_rpc_client_call_t *cc = container_of(t, bt_rpc_client_call_t, status_tag);
    cc->outstanding--;
    cc->status_done = 1;
    if (!ok) cc->status = GRPC_STATUS_INTERNAL;
    stream_maybe_done(cc);
    client_call_maybe_free(cc);
}

static void on_stream_message(rpc_tag_t *t, int ok)
{
    bt_rpc_client_call_t *cc = container_of(t, bt_rpc_client_call_t, msg_tag);
    cc->outstanding--;
    if (ok && cc->recv_bb) {
        grpc_slice s = buffer_to_slice(cc->recv_bb);
        grpc_byte_buffer_destroy(cc->recv_bb);
        cc->recv_bb = NULL;
        if (!cc->cancelled && !cc->done && cc->on_message)
            cc->on_message(cc->ctx, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
        grpc_slice_unref(s);
        stream_recv_next(cc);
    } else {
        cc->stream_ended = 1;
        stream_maybe_done(cc);
    }
    client_call_maybe_free(cc);
}

bt_status_t bt_rpc_channel_create(bt_rpc_t *rpc, const char *target, const bt_rpc_options_t *opts,
                                  bt_rpc_channel_t **ch_p)
{
    if (!rpc || !target || !ch_p) return BT_ERR_INVALID_ARG;
    grpc_arg args[6];
    size_t n = 0;
    int limit = message_limit(opts);
    args[n++] = int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, limit);
    args[n++] = int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, limit);
    /* a restarted peer is found again within seconds, not gRPC's default two minutes */
    args[n++] = int_arg(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
    args[n++] = int_arg(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
    args[n++] = int_arg(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    if (opts && opts->keepalive_ms > 0) args[n++] = int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, opts->keepalive_ms);
    grpc_channel_args ca = {n, args};

    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *gc = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    if (!gc) return BT_ERR_INTERNAL;
    bt_rpc_channel_t *ch = bt_calloc_or_die(1, sizeof *ch);
    ch->rpc = rpc;
    ch->channel = gc;
    ch->next = rpc->channels;
    if (rpc->channels) rpc->channels->prev = ch;
    rpc->channels = ch;
    *ch_p = ch;
    return BT_OK;
}

void bt_rpc_channel_destroy(bt_rpc_channel_t *ch)
{
    if (!ch || ch->destroying) return;
    ch->destroying = 1;
    for (bt_rpc_client_call_t *cc = ch->calls; cc; cc = cc->next) bt_rpc_client_cancel(cc);
    channel_maybe_release(ch);
}

static bt_rpc_client_call_t *client_call_new(bt_rpc_channel_t *ch, const char *method,
                                             int64_t deadline_ms)
{
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *gc = grpc_channel_create_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, ch->rpc->cq,
                                             m, NULL, deadline_after(deadline_ms), NULL);
    grpc_slice_unref(m);
    if (!gc) return NULL;
    bt_rpc_client_call_t *cc = bt_calloc_or_die(1, sizeof *cc);
    cc->ch = ch;
    cc->call = gc;
    cc->details = grpc_empty_slice();
    grpc_metadata_array_init(&cc->initial_md);
    grpc_metadata_array_init(&cc->trailing_md);
    cc->next = ch->calls;
    if (ch->calls) ch->calls->prev = cc;
    ch->calls = cc;
    ch->ncalls++;
    return cc;
}

/* The ops every call starts with: send the request and half-close, read initial metadata. */
static size_t client_call_send_ops(bt_rpc_client_call_t *cc, grpc_op *ops)
{
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 0;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = cc->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &cc->initial_md;
    return 4;
}

static void client_call_status_op(bt_rpc_client_call_t *cc, grpc_op *op)
{
    op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op->data.recv_status_on_client.trailing_metadata = &cc->trailing_md;
    op->data.recv_status_on_client.status = &cc->status;
    op->data.recv_status_on_client.status_details = &cc->details;
}

bt_status_t bt_rpc_unary(bt_rpc_channel_t *ch, const char *method, const uint8_t *req, size_t len,
                         int64_t deadline_ms, bt_rpc_reply_fn on_reply, void *ctx,
                         bt_rpc_client_call_t **call_p)
{
    if (!ch || ch->destroying || !method || (!req && len) || !on_reply) return BT_ERR_INVALID_ARG;
    bt_rpc_client_call_t *cc = client_call_new(ch, method, deadline_ms);
    if (!cc) return BT_ERR_INTERNAL;
    cc->on_reply = on_reply;
    cc->ctx = ctx;
    cc->main_tag.fn = on_unary_done;
    cc->send_bb = bytes_to_buffer(req, len);

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    size_t n = client_call_send_ops(cc, ops);
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &cc->recv_bb;
    n++;
    client_call_status_op(cc, &ops[n++]);
    cc->outstanding++;
    start_batch(ch->rpc, cc->call, ops, n, &cc->main_tag);
    if (call_p) *call_p = cc;
    return BT_OK;
}

bt_status_t bt_rpc_stream(bt_rpc_channel_t *ch, const char *method, const uint8_t *req,
                          size_t len, int64_t deadline_ms, bt_rpc_message_fn on_message,
                          bt_rpc_done_fn on_done, void *ctx, bt_rpc_client_call_t **call_p)
{
    if (!ch || ch->destroying || !method || (!req && len) || !on_done) return BT_ERR_INVALID_ARG;
    bt_rpc_client_call_t *cc = client_call_new(ch, method, deadline_ms);
    if (!cc) return BT_ERR_INTERNAL;
    cc->streaming = 1;
    cc->on_message = on_message;
    cc->on_done = on_done;
    cc->ctx = ctx;
    cc->main_tag.fn = on_stream_start;
    cc->status_tag.fn = on_stream_status;
    cc->msg_tag.fn = on_stream_message;
    cc->send_bb = bytes_to_buffer(req, len);

    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = client_call_send_ops(cc, ops);
    cc->outstanding++;
    start_batch(ch->rpc, cc->call, ops, n, &cc->main_tag);

    grpc_op st;
    memset(&st, 0, sizeof st);
    client_call_status_op(cc, &st);
    cc->outstanding++;
    start_batch(ch->rpc, cc->call, &st, 1, &cc->status_tag);

    stream_recv_next(cc);
    if (call_p) *call_p = cc;
    return BT_OK;
}

void bt_rpc_client_cancel(bt_rpc_client_call_t *call)
{
    if (!call || call->done || call->cancelled) return;
    call->cancelled = 1;
    grpc_call_cancel(call->call, NULL);
}

/* ---- destroy ---------------------------------------------------------------------------- */

void bt_rpc_destroy(bt_rpc_t *rpc)
{
    if (!rpc) return;
    BT_ASSERT(!rpc->dispatching && "bt_rpc_destroy from inside an rpc callback");
    /* What is left is a caller bug, but never a hang: servers are cut off, channels cancelled,
     * and the loop thread dispatches here until everything has drained. */
    for (bt_rpc_server_t *srv = rpc->servers; srv; srv = srv->next) {
        if (!srv->shutting_down) {
            BT_LOG_WARN("rpc: destroy with a server still up (port %d); shutting it down", srv->port);
            bt_rpc_server_shutdown(srv, 0, NULL, NULL);
        } else {
            grpc_server_cancel_all_calls(srv->server);
        }
    }
    for (bt_rpc_channel_t *ch = rpc->channels, *next; ch; ch = next) {
        next = ch->next;
        bt_rpc_channel_destroy(ch);
    }
    uint64_t t0 = uv_hrtime();
    while (rpc->servers || rpc->channels) {
        uv_mutex_lock(&rpc->mu);
        if (rpc->nevents == 0) uv_cond_timedwait(&rpc->cond, &rpc->mu, 100 * 1000000ull);
        uv_mutex_unlock(&rpc->mu);
        rpc_dispatch_once(rpc);
        if (uv_hrtime() - t0 > DESTROY_DRAIN_MS * 1000000ull) {
            BT_LOG_ERROR("rpc: calls still running %d ms after destroy (a handler that never "
                         "finishes?)", DESTROY_DRAIN_MS);
            BT_ASSERT(!"bt_rpc_destroy: calls did not drain");
        }
    }
    grpc_completion_queue_shutdown(rpc->cq);
    uv_thread_join(&rpc->thread);
    rpc_dispatch_once(rpc); /* nothing can be left, but never drop a tag silently */
    grpc_completion_queue_destroy(rpc->cq);
    grpc_shutdown();
    uv_close((uv_handle_t *)rpc->async, free_handle);
    uv_cond_destroy(&rpc->cond);
    uv_mutex_destroy(&rpc->mu);
    free(rpc->events);
    free(rpc->batch);
    free(rpc);
}

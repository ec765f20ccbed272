#include "services/common/service.h"

#include "common/alloc.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t bt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- registration ------------------------------------------------------------------------ */

struct bt_registration {
    bt_rpc_t *rpc;
    bt_rpc_channel_t *ch;
    uv_timer_t timer;
    Baton__V1__WorkerInfo info;
    char *address, *model;
    char worker_id[128];
    int heartbeat_ms;
    bool registered, in_flight, stopping, timer_closed;
    bool leaving; /* every heartbeat says so; never registers again */
    bt_load_fn load;
    void *ctx;
    /* bt_registration_leave: called once the router has the leaving heartbeat (or could not
     * be told) */
    void (*on_left)(void *ctx);
    void *left_ctx;
    bool leave_in_flight;
};

static void schedule(bt_registration_t *r, int ms);
static void send_leave(bt_registration_t *r);

/* Calls (once) what bt_registration_leave was given. */
static void left(bt_registration_t *r)
{
    void (*fn)(void *) = r->on_left;
    void *fn_ctx = r->left_ctx;
    r->on_left = NULL;
    if (fn) fn(fn_ctx);
}

/* How long a leaving worker waits for the router to note it (it then stops anyway). */
#define LEAVE_DEADLINE_MS 1000

/* Stopped: freed once its timer is closed and no call of it is in flight (the channel's
 * destroy cancels that call, whose callback still comes, later, from the loop). */
static void maybe_free(bt_registration_t *r)
{
    if (!r->stopping || !r->timer_closed || r->in_flight || r->leave_in_flight) return;
    free(r->address);
    free(r->model);
    free(r);
}

static void on_registered(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp,
                          size_t len)
{
    bt_registration_t *r = ctx;
    r->in_flight = false;
    if (r->stopping) {
        maybe_free(r);
        return;
    }
    Baton__V1__RegisterResponse *rr = NULL;
    if (code == BT_RPC_OK) rr = BT_PROTO_UNPACK(baton__v1__register_response, resp, len);
    if (!rr) {
        BT_LOG_WARN("registration with the router failed: %s %s%s", bt_rpc_code_name(code),
                    msg ? msg : "", r->leaving ? "" : " (retrying)");
        if (r->leaving)
            left(r); /* (the router knows nothing of us) */
        else
            schedule(r, 500);
        return;
    }
    snprintf(r->worker_id, sizeof r->worker_id, "%s", rr->worker_id);
    r->heartbeat_ms = rr->heartbeat_ms > 0 ? rr->heartbeat_ms : 1000;
    r->registered = true;
    BT_LOG_INFO("registered with the router as %s", r->worker_id);
    BT_PROTO_FREE(baton__v1__register_response, rr);
    if (r->leaving) /* it left while registering: the router hears so before it sends work */
        send_leave(r);
    else
        schedule(r, r->heartbeat_ms);
}

static void on_heartbeat(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp,
                         size_t len)
{
    bt_registration_t *r = ctx;
    r->in_flight = false;
    if (r->stopping) {
        maybe_free(r);
        return;
    }
    Baton__V1__HeartbeatResponse *hr = NULL;
    if (code == BT_RPC_OK) hr = BT_PROTO_UNPACK(baton__v1__heartbeat_response, resp, len);
    if (hr && !hr->known) {
        BT_LOG_WARN("router forgot this worker; registering again");
        r->registered = false;
    } else if (!hr) {
        /* no answer (the router busy or briefly unreachable): the same id again soon. A new
         * registration from this address would read as a restart, and the router would fail
         * every request it has here; a router that did restart answers "unknown" */
        BT_LOG_WARN("router did not answer a heartbeat (%s); trying again", bt_rpc_code_name(code));
    }
    if (hr) BT_PROTO_FREE(baton__v1__heartbeat_response, hr);
    schedule(r, r->registered && hr ? r->heartbeat_ms : 200);
}

/* A heartbeat with this worker's load, marked leaving when it is; done gets its answer (or
 * UNAVAILABLE when the call cannot start). */
static void send_heartbeat(bt_registration_t *r, int deadline_ms, bt_rpc_reply_fn done)
{
    Baton__V1__HeartbeatRequest hb = BATON__V1__HEARTBEAT_REQUEST__INIT;
    hb.worker_id = r->worker_id;
    if (r->load) r->load(r->ctx, &hb);
    hb.leaving = r->leaving;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&hb.base, &buf, &len);
    if (bt_rpc_unary(r->ch, "/baton.v1.Registry/Heartbeat", buf, len, deadline_ms, done, r, NULL) !=
        BT_OK)
        done(r, BT_RPC_UNAVAILABLE, "cannot start the call", NULL, 0);
    free(buf);
}

static void tick(uv_timer_t *t)
{
    bt_registration_t *r = t->data;
    if (r->in_flight || r->stopping || r->leave_in_flight) return;
    if (r->leaving && !r->registered) return; /* (a router that forgot us sends nothing here) */
    r->in_flight = true;
    if (r->registered) {
        send_heartbeat(r, 2000, on_heartbeat);
        return;
    }
    Baton__V1__RegisterRequest req = BATON__V1__REGISTER_REQUEST__INIT;
    req.info = &r->info;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&req.base, &buf, &len);
    if (bt_rpc_unary(r->ch, "/baton.v1.Registry/RegisterWorker", buf, len, 2000, on_registered, r,
                     NULL) != BT_OK)
        on_registered(r, BT_RPC_UNAVAILABLE, "cannot start the call", NULL, 0);
    free(buf);
}

static void schedule(bt_registration_t *r, int ms)
{
    uv_timer_start(&r->timer, tick, (uint64_t)ms, 0);
}

bt_status_t bt_registration_start(bt_rpc_t *rpc, const char *router_addr,
                                  const Baton__V1__WorkerInfo *info, bt_load_fn load, void *ctx,
                                  bt_registration_t **reg_p)
{
    bt_registration_t *r = bt_calloc_or_die(1, sizeof *r);
    r->rpc = rpc;
    r->info = *info;
    r->address = bt_strdup_or_die(info->address);
    r->model = bt_strdup_or_die(info->model);
    r->info.address = r->address;
    r->info.model = r->model;
    r->load = load;
    r->ctx = ctx;
    r->heartbeat_ms = 1000;
    bt_status_t st = bt_rpc_channel_create(rpc, router_addr, NULL, &r->ch);
    if (st != BT_OK) {
        free(r->address);
        free(r->model);
        free(r);
        return st;
    }
    uv_timer_init(bt_rpc_loop(rpc), &r->timer);
    r->timer.data = r;
    schedule(r, 0);
    *reg_p = r;
    return BT_OK;
}

static void on_timer_closed(uv_handle_t *h)
{
    bt_registration_t *r = h->data;
    r->timer_closed = true;
    maybe_free(r);
}

void bt_registration_stop(bt_registration_t *r)
{
    if (!r) return;
    r->stopping = true;
    uv_timer_stop(&r->timer);
    bt_rpc_channel_destroy(r->ch);
    uv_close((uv_handle_t *)&r->timer, on_timer_closed);
}

static void on_leave_reply(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp,
                           size_t len)
{
    bt_registration_t *r = ctx;
    r->leave_in_flight = false;
    Baton__V1__HeartbeatResponse *hr = NULL;
    if (code == BT_RPC_OK) hr = BT_PROTO_UNPACK(baton__v1__heartbeat_response, resp, len);
    if (!hr)
        /* (info: when the whole cluster stops, the router is often gone first) */
        BT_LOG_INFO("could not tell the router this worker is leaving (%s %s): it may send work "
                    "here until it hears so",
                    bt_rpc_code_name(code), msg ? msg : "");
    else if (!hr->known)
        r->registered = false; /* (and stays so: a router that forgot us sends nothing here) */
    if (hr) BT_PROTO_FREE(baton__v1__heartbeat_response, hr);
    if (r->stopping) {
        r->on_left = NULL; /* (stopped meanwhile: its owner moved on) */
        maybe_free(r);
        return;
    }
    if (!r->in_flight) schedule(r, r->heartbeat_ms); /* the heartbeats go on, marked leaving */
    left(r);
}

void bt_registration_leave(bt_registration_t *r, void (*on_left)(void *ctx), void *ctx)
{
    if (!r || r->stopping || r->leaving) {
        if (r) r->leaving = true;
        if (on_left) on_left(ctx);
        return;
    }
    r->leaving = true;
    r->on_left = on_left;
    r->left_ctx = ctx;
    if (r->registered)
        send_leave(r);
    else if (!r->in_flight) /* not registered, nor registering: the router knows nothing of us */
        left(r);
    /* (else a registration is under way: on_registered tells the router, or gives up) */
}

/* The heartbeat that says the worker leaves, sent at once. */
static void send_leave(bt_registration_t *r)
{
    uv_timer_stop(&r->timer);
    r->leave_in_flight = true;
    send_heartbeat(r, LEAVE_DEADLINE_MS, on_leave_reply); /* (r->leaving is set) */
}

/* ---- signals ------------------------------------------------------------------------------ */

typedef struct {
    uv_signal_t sigint, sigterm;
    void (*fn)(void *);
    void *ctx;
    bool fired;
} signals_t;

static void on_signal(uv_signal_t *h, int signum)
{
    signals_t *s = h->data;
    if (s->fired) {
        BT_LOG_WARN("second signal %d: exiting now", signum);
        exit(1);
    }
    s->fired = true;
    BT_LOG_INFO("signal %d: shutting down", signum);
    s->fn(s->ctx);
}

void bt_service_on_signal(uv_loop_t *loop, void (*on_stop)(void *ctx), void *ctx)
{
    signals_t *s = bt_calloc_or_die(1, sizeof *s); /* lives as long as the process */
    s->fn = on_stop;
    s->ctx = ctx;
    uv_signal_init(loop, &s->sigint);
    uv_signal_init(loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_unref((uv_handle_t *)&s->sigint);
    uv_unref((uv_handle_t *)&s->sigterm);
}

/* A worker's registration with the router (services/common/service.c) over the real gRPC stack
 * on loopback, against a stand-in router whose RegisterWorker never answers: stopping the
 * registration with its call in flight must not leave the call's callback to run on freed
 * state (the channel's destroy cancels the call, and its callback comes later from the loop;
 * the registration was freed before it). The sanitizer build (CI) reports the use after free. */
#include "bt_test.h"
#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"
#include "services/common/service.h"

#include <string.h>

#include <uv.h>

typedef struct {
    bt_rpc_call_t *held; /* the RegisterWorker call, never answered until it is cancelled */
    int calls, cancels;
} router_t;

static void on_held_cancel(void *ctx)
{
    router_t *r = ctx;
    r->cancels++;
    bt_rpc_call_finish(r->held, BT_RPC_CANCELLED, NULL); /* (only releases it) */
    r->held = NULL;
}

static void on_register(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    router_t *r = ctx;
    r->calls++;
    r->held = call;
    bt_rpc_call_on_cancel(call, on_held_cancel, r);
}

/* stops the registration from the loop's check phase, so that the closing phase of the same
 * turn comes before any completion the cancel brings (as when a service stops from a callback) */
typedef struct {
    uv_check_t check;
    bt_registration_t *reg;
    const int *calls;
    bool stopped;
} stopper_t;

static void on_check(uv_check_t *h)
{
    stopper_t *s = h->data;
    if (s->stopped || *s->calls < 1) return;
    s->stopped = true;
    bt_registration_stop(s->reg);
    uv_check_stop(h);
}

static void on_down(void *ctx)
{
    *(bool *)ctx = true;
}

/* runs the loop until *flag or ms pass */
static bool run_until(uv_loop_t *loop, const bool *flag, const int *count, int want, int ms)
{
    for (int i = 0; i < ms; i++) {
        if ((flag && *flag) || (count && *count >= want)) return true;
        uv_run(loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    return (flag && *flag) || (count && *count >= want);
}

/* A stand-in router's server on loopback (the caller adds its methods) and the rpc both ends
 * use. */
static bt_rpc_server_t *stand_in(uv_loop_t *loop, bt_rpc_t **rpc_p)
{
    uv_loop_init(loop);
    BT_CHECK(bt_rpc_create(loop, rpc_p) == BT_OK);
    bt_rpc_server_t *srv = NULL;
    BT_CHECK(bt_rpc_server_create(*rpc_p, "127.0.0.1:0", NULL, &srv) == BT_OK);
    return srv;
}

/* Shuts the stand-in down and checks that everything on the loop closed. */
static void stand_in_close(uv_loop_t *loop, bt_rpc_t *rpc, bt_rpc_server_t *srv)
{
    bool down = false;
    bt_rpc_server_shutdown(srv, 0, on_down, &down);
    BT_CHECK(run_until(loop, &down, NULL, 0, 5000));
    bt_rpc_destroy(rpc);
    uv_run(loop, UV_RUN_DEFAULT);
    BT_CHECK(uv_loop_close(loop) == 0);
}

/* Starts the stand-in and a decode worker's registration with it. */
static bt_registration_t *worker_registers(bt_rpc_t *rpc, bt_rpc_server_t *srv)
{
    BT_CHECK(bt_rpc_server_start(srv) == BT_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", bt_rpc_server_port(srv));
    Baton__V1__WorkerInfo info = BATON__V1__WORKER_INFO__INIT;
    info.role = BATON__V1__WORKER_ROLE__ROLE_DECODE;
    info.address = "127.0.0.1:1";
    info.model = "m";
    bt_registration_t *reg = NULL;
    BT_CHECK(bt_registration_start(rpc, addr, &info, NULL, NULL, &reg) == BT_OK);
    return reg;
}

static void test_stop_with_call_in_flight(void)
{
    uv_loop_t loop;
    bt_rpc_t *rpc;
    bt_rpc_server_t *srv = stand_in(&loop, &rpc);
    router_t router = {0};
    BT_CHECK(bt_rpc_server_method(srv, "/baton.v1.Registry/RegisterWorker", BT_RPC_UNARY,
                                  on_register, &router) == BT_OK);
    bt_registration_t *reg = worker_registers(rpc, srv);
    stopper_t stopper = {.reg = reg, .calls = &router.calls};
    uv_check_init(&loop, &stopper.check);
    stopper.check.data = &stopper;
    uv_check_start(&stopper.check, on_check);
    /* its call reaches the stand-in router, which holds it: stopped with the call in flight */
    BT_CHECK(run_until(&loop, &stopper.stopped, NULL, 0, 5000));
    uv_close((uv_handle_t *)&stopper.check, NULL);
    /* the cancel reaches the stand-in router, and the client's callback runs in these turns */
    BT_CHECK(run_until(&loop, NULL, &router.cancels, 1, 5000));
    for (int i = 0; i < 200; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    BT_CHECK_EQ_INT(router.calls, 1);
    stand_in_close(&loop, rpc, srv);
}

/* A stand-in router that registers the worker as "w1" and fails its first heartbeat. */
typedef struct {
    int registers, heartbeats, wrong_ids;
    bool answer_first;   /* the first heartbeat is answered too */
    bool forget_leaving; /* answers a leaving worker "unknown", as a restarted router */
    int leaving, plain_after_leaving; /* heartbeats marked leaving; unmarked ones after */
    bool hold_register;               /* RegisterWorker answered only by answer_register */
    bt_rpc_call_t *held;
} hb_router_t;

static void reply_msg(bt_rpc_call_t *call, const ProtobufCMessage *m)
{
    uint8_t *buf;
    size_t n;
    bt_proto_pack(m, &buf, &n);
    bt_rpc_call_reply(call, buf, n);
    free(buf);
}

static void hb_on_register(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    hb_router_t *r = ctx;
    r->registers++;
    if (r->hold_register) {
        r->held = call;
        return;
    }
    Baton__V1__RegisterResponse resp = BATON__V1__REGISTER_RESPONSE__INIT;
    resp.worker_id = "w1";
    resp.heartbeat_ms = 50;
    reply_msg(call, &resp.base);
}

static void hb_on_heartbeat(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len);

/* The stand-in's two Registry methods, answered by r. */
static void hb_serve(bt_rpc_server_t *srv, hb_router_t *r)
{
    BT_CHECK(bt_rpc_server_method(srv, "/baton.v1.Registry/RegisterWorker", BT_RPC_UNARY,
                                  hb_on_register, r) == BT_OK);
    BT_CHECK(bt_rpc_server_method(srv, "/baton.v1.Registry/Heartbeat", BT_RPC_UNARY,
                                  hb_on_heartbeat, r) == BT_OK);
}

static void answer_register(hb_router_t *r)
{
    Baton__V1__RegisterResponse resp = BATON__V1__REGISTER_RESPONSE__INIT;
    resp.worker_id = "w1";
    resp.heartbeat_ms = 50;
    reply_msg(r->held, &resp.base);
    r->held = NULL;
}

static void hb_on_heartbeat(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len)
{
    hb_router_t *r = ctx;
    Baton__V1__HeartbeatRequest *hb = BT_PROTO_UNPACK(baton__v1__heartbeat_request, req, len);
    r->wrong_ids += !hb || !hb->worker_id || strcmp(hb->worker_id, "w1") != 0;
    const bool leaving = hb && hb->leaving;
    r->plain_after_leaving += r->leaving > 0 && !leaving;
    r->leaving += leaving;
    if (hb) BT_PROTO_FREE(baton__v1__heartbeat_request, hb);
    if (r->heartbeats++ == 0 && !r->answer_first) { /* as a router whose loop was busy */
        bt_rpc_call_finish(call, BT_RPC_UNAVAILABLE, "busy");
        return;
    }
    Baton__V1__HeartbeatResponse resp = BATON__V1__HEARTBEAT_RESPONSE__INIT;
    resp.known = !(leaving && r->forget_leaving);
    reply_msg(call, &resp.base);
}

/* A heartbeat the router does not answer is tried again with the same id: the worker
 * registered again instead, and the router, seeing its address register anew, took it for a
 * restart and failed every request it had there. */
static void test_missed_heartbeat_keeps_registration(void)
{
    uv_loop_t loop;
    bt_rpc_t *rpc;
    bt_rpc_server_t *srv = stand_in(&loop, &rpc);
    hb_router_t router = {0};
    hb_serve(srv, &router);
    bt_registration_t *reg = worker_registers(rpc, srv);
    BT_CHECK(run_until(&loop, NULL, &router.heartbeats, 4, 5000));
    BT_CHECK_MSG(router.registers == 1, "registered %d times", router.registers);
    BT_CHECK_EQ_INT(router.wrong_ids, 0);
    bt_registration_stop(reg);
    stand_in_close(&loop, rpc, srv);
}

static void on_left(void *ctx)
{
    (*(int *)ctx)++;
}

/* A leaving worker (SIGTERM: it finishes what it runs) tells the router at once, and its
 * heartbeats go on, every one marked leaving: before, it stopped heartbeating, and the router
 * failed the requests it was finishing as on a dead worker. A router that no longer knows it
 * does not make it register again. */
static void test_leave_keeps_heartbeating(void)
{
    for (int forget = 0; forget < 2; forget++) {
        uv_loop_t loop;
        bt_rpc_t *rpc;
        bt_rpc_server_t *srv = stand_in(&loop, &rpc);
        hb_router_t router = {.answer_first = true, .forget_leaving = forget};
        hb_serve(srv, &router);
        bt_registration_t *reg = worker_registers(rpc, srv);
        BT_CHECK(run_until(&loop, NULL, &router.heartbeats, 2, 5000));
        int left = 0;
        const int before = router.heartbeats;
        bt_registration_leave(reg, on_left, &left);
        BT_CHECK(run_until(&loop, NULL, &left, 1, 2000));
        BT_CHECK_MSG(router.heartbeats == before + 1 && router.leaving == 1,
                     "told with one heartbeat (%d, %d marked)", router.heartbeats - before,
                     router.leaving);
        run_until(&loop, NULL, &router.heartbeats, before + 6, 600); /* 50 ms heartbeats */
        if (!forget)
            BT_CHECK_MSG(router.leaving >= 4, "%d heartbeats after leaving", router.leaving);
        else
            BT_CHECK_MSG(router.leaving == 1, "%d heartbeats after an unknown", router.leaving);
        BT_CHECK_EQ_INT(router.plain_after_leaving, 0);
        BT_CHECK_MSG(router.registers == 1, "registered %d times", router.registers);
        BT_CHECK_EQ_INT(left, 1);
        bt_registration_stop(reg);
        stand_in_close(&loop, rpc, srv);
    }
}

/* Stopped while its registration is under way: the router, which registers it a moment
 * later, hears it is leaving before anything else. Before, the worker counted itself gone at
 * once, and the router took it for a working one until it missed three heartbeats. */
static void test_leave_while_registering(void)
{
    uv_loop_t loop;
    bt_rpc_t *rpc;
    bt_rpc_server_t *srv = stand_in(&loop, &rpc);
    hb_router_t router = {.answer_first = true, .hold_register = true};
    hb_serve(srv, &router);
    bt_registration_t *reg = worker_registers(rpc, srv);
    BT_CHECK(run_until(&loop, NULL, &router.registers, 1, 5000));
    int left = 0;
    bt_registration_leave(reg, on_left, &left);
    run_until(&loop, NULL, &left, 1, 200);
    BT_CHECK_MSG(left == 0, "left before the router heard of it");
    answer_register(&router);
    BT_CHECK(run_until(&loop, NULL, &left, 1, 2000));
    BT_CHECK_MSG(router.heartbeats >= 1 && router.leaving == router.heartbeats,
                 "%d heartbeats, %d marked leaving", router.heartbeats, router.leaving);
    bt_registration_stop(reg);
    stand_in_close(&loop, rpc, srv);
}

int main(void)
{
    BT_RUN(test_stop_with_call_in_flight);
    BT_RUN(test_missed_heartbeat_keeps_registration);
    BT_RUN(test_leave_keeps_heartbeating);
    BT_RUN(test_leave_while_registering);
    return bt_test_summary();
}

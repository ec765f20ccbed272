/* common/rpc across processes: a forked child serves a stream and is killed with SIGKILL in
 * the middle of it; the client must see UNAVAILABLE within a bounded time, not hang.
 * The child is forked before this process touches gRPC (gRPC and fork do not mix). */
#include "common/rpc/rpc.h"

#include "bt_test.h"

#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

/* ---- child: a server streaming one index every 5 ms until killed ------------------------- */

typedef struct {
    uv_timer_t timer;
    bt_rpc_call_t *call;
    uint32_t i;
} ticker_t;

static void ticker_closed(uv_handle_t *h) { free(h->data); }

static void ticker_cancelled(void *ctx)
{
    ticker_t *t = ctx;
    uv_timer_stop(&t->timer);
    bt_rpc_call_finish(t->call, BT_RPC_CANCELLED, NULL);
    uv_close((uv_handle_t *)&t->timer, ticker_closed);
}

static void ticker_fire(uv_timer_t *h)
{
    ticker_t *t = h->data;
    bt_rpc_call_send(t->call, (const uint8_t *)&t->i, 4, NULL, NULL);
    t->i++;
}

static void h_tick(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len)
{
    ticker_t *t = calloc(1, sizeof *t);
    t->call = call;
    uv_timer_init(ctx, &t->timer);
    t->timer.data = t;
    uv_timer_start(&t->timer, ticker_fire, 5, 5);
    bt_rpc_call_on_cancel(call, ticker_cancelled, t);
}

static void h_hang(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len) {}

static void child_main(int fd)
{
    alarm(60); /* never outlive a broken parent */
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_rpc_t *rpc;
    bt_rpc_server_t *srv;
    if (bt_rpc_create(&loop, &rpc) != BT_OK) _exit(2);
    if (bt_rpc_server_create(rpc, "127.0.0.1:0", NULL, &srv) != BT_OK) _exit(3);
    bt_rpc_server_method(srv, "/t.T/Tick", BT_RPC_SERVER_STREAM, h_tick, &loop);
    bt_rpc_server_method(srv, "/t.T/Hang", BT_RPC_UNARY, h_hang, &loop);
    if (bt_rpc_server_start(srv) != BT_OK) _exit(4);
    int port = bt_rpc_server_port(srv);
    if (write(fd, &port, sizeof port) != (ssize_t)sizeof port) _exit(5);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(6);
}

/* ---- parent ------------------------------------------------------------------------------ */

typedef struct {
    int done, nmsgs;
    bt_rpc_code_t code;
    double t_done;
} cres_t;

static double now_ms(void) { return (double)uv_hrtime() / 1e6; }

static void on_message(void *ctx, const uint8_t *msg, size_t len) { ((cres_t *)ctx)->nmsgs++; }

static void on_done(void *ctx, bt_rpc_code_t code, const char *message)
{
    cres_t *r = ctx;
    r->done++;
    r->code = code;
    r->t_done = now_ms();
}

static void on_reply(void *ctx, bt_rpc_code_t code, const char *message, const uint8_t *resp,
                     size_t len)
{
    on_done(ctx, code, message);
}

static void on_tick_noop(uv_timer_t *t) {}

static int run_until(uv_loop_t *loop, const int *a, const int *b, int want, uint64_t ms)
{
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + ms;
    while (!(*a >= want && *b >= want) && uv_now(loop) < end) uv_run(loop, UV_RUN_ONCE);
    return *a >= want && *b >= want;
}

static void test_server_killed_mid_stream(void)
{
    int fds[2];
    BT_CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    BT_CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        close(fds[0]);
        child_main(fds[1]);
    }
    close(fds[1]);
    int port = 0;
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (poll(&p, 1, 20000) == 1 && read(fds[0], &port, sizeof port) != (ssize_t)sizeof port) port = 0;
    close(fds[0]);
    BT_CHECK(port > 0);
    if (port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return;
    }

    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_timer_t tick;
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick_noop, 5, 5);
    bt_rpc_t *rpc;
    bt_rpc_channel_t *ch;
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    BT_CHECK(bt_rpc_create(&loop, &rpc) == BT_OK);
    BT_CHECK(bt_rpc_channel_create(rpc, target, NULL, &ch) == BT_OK);

    cres_t s = {0}, u = {0};
    uint32_t zero = 0;
    BT_CHECK(bt_rpc_stream(ch, "/t.T/Tick", (const uint8_t *)&zero, 4, 60000, on_message, on_done,
                           &s, NULL) == BT_OK);
    BT_CHECK(bt_rpc_unary(ch, "/t.T/Hang", (const uint8_t *)"x", 1, 60000, on_reply, &u, NULL) == BT_OK);
    int five = 5;
    BT_CHECK(run_until(&loop, &s.nmsgs, &five, 5, 10000));

    double t0 = now_ms();
    BT_CHECK(kill(pid, SIGKILL) == 0);
    BT_CHECK(run_until(&loop, &s.done, &u.done, 1, 10000));
    double ds = s.t_done - t0, du = u.t_done - t0;
    BT_CHECK_MSG(s.code == BT_RPC_UNAVAILABLE, "stream got %s", bt_rpc_code_name(s.code));
    BT_CHECK_MSG(u.code == BT_RPC_UNAVAILABLE, "unary got %s", bt_rpc_code_name(u.code));
    BT_CHECK_MSG(ds < 5000 && du < 5000, "%.1f ms / %.1f ms", ds, du);
    fprintf(stderr, "  killed server: stream UNAVAILABLE after %.1f ms (%d messages), unary after %.1f ms\n",
            ds, s.nmsgs, du);

    int status = 0;
    BT_CHECK(waitpid(pid, &status, 0) == pid);
    BT_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* a fresh call to the dead address fails too, within its deadline */
    cres_t again = {0};
    t0 = now_ms();
    BT_CHECK(bt_rpc_unary(ch, "/t.T/Hang", (const uint8_t *)"x", 1, 3000, on_reply, &again, NULL) == BT_OK);
    BT_CHECK(run_until(&loop, &again.done, &again.done, 1, 5000));
    BT_CHECK_MSG(again.code == BT_RPC_UNAVAILABLE, "%s", bt_rpc_code_name(again.code));
    BT_CHECK(now_ms() - t0 < 3500);

    bt_rpc_channel_destroy(ch);
    bt_rpc_destroy(rpc);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    BT_CHECK(uv_loop_close(&loop) == 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    BT_RUN(test_server_killed_mid_stream);
    return bt_test_summary();
}

/* Helpers for integration tests: start real Baton service processes on loopback, call them
 * with the real gRPC client (common/rpc), stop or kill them. Every wait is bounded. */
#ifndef BT_TEST_CLUSTER_UTIL_H
#define BT_TEST_CLUSTER_UTIL_H

#include "common/alloc.h"
#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    char addr[128];
    char metrics[128]; /* host:port of /metrics when the service printed one */
} proc_t;

static inline int64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts BT_BIN_DIR/<bin> with argv (NULL-terminated, argv[0] ignored); when `wait`, waits up
 * to 60 s for its "listening on ADDR" line. Its stderr goes to a log file under /tmp. */
static inline int proc_startv(proc_t *p, const char *bin, char **args, bool wait)
{
    char *argv[64];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", BT_BIN_DIR, bin);
    argv[0] = path;
    int n = 1;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char log[256];
        snprintf(log, sizeof log, "/tmp/bt-it-%s-%d.log", bin, (int)getpid());
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(path, argv);
        _exit(127);
    }
    close(fds[1]);
    p->pid = pid;
    p->addr[0] = 0;
    p->metrics[0] = 0;
    if (!wait) {
        close(fds[0]);
        return 0;
    }
    char buf[512];
    size_t used = 0;
    int64_t deadline = ms_now() + 60000;
    while (!p->addr[0] && ms_now() < deadline) {
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0) continue;
        ssize_t r = read(fds[0], buf + used, sizeof buf - 1 - used);
        if (r <= 0) break;
        used += (size_t)r;
        buf[used] = 0;
        const char *at = strstr(buf, "listening on ");
        const char *nl = at ? strchr(at, '\n') : NULL;
        if (at && nl) snprintf(p->addr, sizeof p->addr, "%.*s", (int)(nl - at - 13), at + 13);
        const char *mt = strstr(buf, "metrics on ");
        const char *mnl = mt ? strchr(mt, '\n') : NULL;
        if (mt && mnl) snprintf(p->metrics, sizeof p->metrics, "%.*s", (int)(mnl - mt - 11), mt + 11);
    }
    close(fds[0]);
    if (!p->addr[0]) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        p->pid = 0;
        fprintf(stderr, "%s did not start\n", bin);
        return -1;
    }
    return 0;
}

/* proc_startv with the args as a NULL-terminated list */
static inline int proc_start(proc_t *p, const char *bin, ...)
{
    char *args[64];
    int n = 0;
    va_list ap;
    va_start(ap, bin);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 63) args[n++] = (char *)a;
    va_end(ap);
    args[n] = NULL;
    return proc_startv(p, bin, args, true);
}

/* A free TCP port on 127.0.0.1 (bound, read, released). */
static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Waits up to timeout_ms for p to exit by itself: true when it did (p->pid is then 0). */
static inline bool proc_exited(proc_t *p, int64_t timeout_ms)
{
    for (int64_t deadline = ms_now() + timeout_ms; p->pid > 0; usleep(10000)) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            break;
        }
        if (ms_now() > deadline) return false;
    }
    return true;
}

static inline void proc_stop(proc_t *p, int sig)
{
    if (p->pid <= 0) return;
    kill(p->pid, sig);
    int64_t deadline = ms_now() + 10000;
    while (ms_now() < deadline) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            return;
        }
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

/* The value of the unlabelled metric `name` at a service's /metrics (host:port), read with
 * curl; -1 when it cannot be read. */
static inline double metric_value(const char *addr, const char *name)
{
    char cmd[256], line[512];
    snprintf(cmd, sizeof cmd, "curl -sf --noproxy '*' --max-time 5 http://%s/metrics", addr);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    double v = -1;
    const size_t n = strlen(name);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ' ') v = strtod(line + n + 1, NULL);
    pclose(f);
    return v;
}

/* Polls metric_value until it equals want or ms pass; returns the last value read. */
static inline double wait_metric(const char *addr, const char *name, double want, int ms)
{
    double v = -1;
    for (int64_t until = ms_now() + ms; ms_now() < until; usleep(100000))
        if ((v = metric_value(addr, name)) == want) break;
    return v;
}

/* ---- a gRPC client driving many calls on one loop ---------------------------------------- */

typedef struct {
    int32_t ids[4096];
    int n;
    bool done;
    bt_rpc_code_t code;
    char message[512];
    int64_t t_done;
    int finish;
    int cached; /* usage.cached_tokens of the last message */
    bt_rpc_client_call_t *call;
} gen_t;

typedef struct {
    uv_loop_t loop;
    bt_rpc_t *rpc;
    bt_rpc_channel_t *ch;
    int outstanding;
} client_t;

static inline void client_open(client_t *c, const char *addr)
{
    uv_loop_init(&c->loop);
    bt_rpc_create(&c->loop, &c->rpc);
    bt_rpc_channel_create(c->rpc, addr, NULL, &c->ch);
    c->outstanding = 0;
}

static inline void client_close(client_t *c)
{
    bt_rpc_channel_destroy(c->ch);
    for (int i = 0; i < 20; i++) uv_run(&c->loop, UV_RUN_NOWAIT);
    bt_rpc_destroy(c->rpc);
    uv_run(&c->loop, UV_RUN_NOWAIT);
    uv_loop_close(&c->loop);
}

typedef struct {
    client_t *c;
    gen_t *g;
} gen_ctx_t;

static inline void gen_on_msg(void *ctx, const uint8_t *data, size_t len)
{
    gen_ctx_t *x = ctx;
    Baton__V1__GenerateResponse *r = BT_PROTO_UNPACK(baton__v1__generate_response, data, len);
    if (!r) return;
    for (size_t i = 0; i < r->n_token_ids && x->g->n < 4096; i++) x->g->ids[x->g->n++] = r->token_ids[i];
    if (r->finish_reason) x->g->finish = r->finish_reason;
    if (r->usage) x->g->cached = r->usage->cached_tokens;
    BT_PROTO_FREE(baton__v1__generate_response, r);
}

static inline void gen_on_done(void *ctx, bt_rpc_code_t code, const char *msg)
{
    gen_ctx_t *x = ctx;
    x->g->done = true;
    x->g->code = code;
    x->g->t_done = ms_now();
    x->g->call = NULL;
    snprintf(x->g->message, sizeof x->g->message, "%s", msg ? msg : "");
    x->c->outstanding--;
    free(x);
}

/* Starts a Generate over token ids with the given sampling (max_tokens, ignore_eos set here). */
static inline void gen_start_sampling(client_t *c, gen_t *g, const int32_t *ids, int n, int max_tokens,
                                      bool ignore_eos, int64_t deadline_ms, Baton__V1__SamplingParams sp)
{
    memset(g, 0, sizeof *g);
    Baton__V1__GenerateRequest req = BATON__V1__GENERATE_REQUEST__INIT;
    Baton__V1__TokenIds t = BATON__V1__TOKEN_IDS__INIT;
    t.n_ids = (size_t)n;
    t.ids = (int32_t *)ids;
    req.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    req.token_ids = &t;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = ignore_eos;
    req.sampling = &sp;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&req.base, &buf, &len);
    gen_ctx_t *x = bt_calloc_or_die(1, sizeof *x);
    x->c = c;
    x->g = g;
    c->outstanding++;
    if (bt_rpc_stream(c->ch, "/baton.v1.Baton/Generate", buf, len, deadline_ms, gen_on_msg, gen_on_done,
                      x, &g->call) != BT_OK)
        gen_on_done(x, BT_RPC_UNAVAILABLE, "cannot start");
    free(buf);
}

/* Starts a greedy Generate over token ids. */
static inline void gen_start(client_t *c, gen_t *g, const int32_t *ids, int n, int max_tokens,
                             bool ignore_eos, int64_t deadline_ms)
{
    Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
    gen_start_sampling(c, g, ids, n, max_tokens, ignore_eos, deadline_ms, sp);
}

/* Runs the loop until cond(ctx) or timeout; returns whether cond held. */
static inline bool run_until(client_t *c, bool (*cond)(void *), void *ctx, int timeout_ms)
{
    int64_t deadline = ms_now() + timeout_ms;
    while (!cond(ctx)) {
        if (ms_now() > deadline) return false;
        uv_run(&c->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    return true;
}

static inline bool all_done(void *ctx)
{
    return ((client_t *)ctx)->outstanding == 0;
}

/* One unary call on a fresh channel (Stats, Health). resp (malloc'd) must be freed. */
typedef struct {
    bool done;
    bt_rpc_code_t code;
    uint8_t *resp;
    size_t len;
} unary_t;

static inline void unary_cb(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp, size_t len)
{
    unary_t *u = ctx;
    u->done = true;
    u->code = code;
    if (resp && len) {
        u->resp = malloc(len);
        memcpy(u->resp, resp, len);
        u->len = len;
    }
}

static inline bool unary_done(void *ctx)
{
    return ((unary_t *)ctx)->done;
}

/* One unary call of `method` on ch with req, its deadline ms, pumping c's loop until it
 * ends; u gets the status and the answer's bytes (u->resp malloc'd: the caller frees). */
static inline void call_unary(client_t *c, bt_rpc_channel_t *ch, const char *method,
                              const ProtobufCMessage *req, int ms, unary_t *u)
{
    uint8_t *buf;
    size_t len;
    bt_proto_pack(req, &buf, &len);
    memset(u, 0, sizeof *u);
    bt_rpc_unary(ch, method, buf, len, ms, unary_cb, u, NULL);
    free(buf);
    run_until(c, unary_done, u, ms + 1000);
}

static inline bool decode_stats(client_t *c, const char *addr, Baton__V1__StatsResponse **out)
{
    bt_rpc_channel_t *ch;
    bt_rpc_channel_create(c->rpc, addr, NULL, &ch);
    Baton__V1__StatsRequest rq = BATON__V1__STATS_REQUEST__INIT;
    unary_t u;
    call_unary(c, ch, "/baton.v1.Decode/Stats", &rq.base, 5000, &u);
    bt_rpc_channel_destroy(ch);
    *out = u.code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__stats_response, u.resp, u.len) : NULL;
    free(u.resp);
    return *out != NULL;
}

#endif

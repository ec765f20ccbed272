/* The cluster as real processes on loopback, CPU backend, driven with the real gRPC client:
 *  - greedy output through router -> decode -> prefill equals `baton generate` and the golden
 *    continuations (golden-a-exact; golden-a where robust), with UCX over TCP and over
 *    shared memory, with prefill chunks of 7 and 4096;
 *  - 40 concurrent requests: never more than 16 running on the decode group (its own stats),
 *    all finish with the right output; with a queue of 8 the excess is refused at once;
 *  - kill -9 of decode mid-stream: UNAVAILABLE within the watchdog; restarted, it serves;
 *  - kill -9 of prefill mid-transfer: decode frees the slot; nothing hangs;
 *  - a client cancel returns the KV pool to its baseline;
 *  - mismatched groups (another context length) are refused with a clear error. */
#include "bt_test.h"
#include "integration/cluster_util.h"
#include "services/engine/safetensors.h"

#include <stdatomic.h>

static char golden_exact[512], golden_a[512];

/* Worker groups of CLUSTER_TP processes each (test_cluster_tp.c builds this file with 4). */
#ifndef CLUSTER_TP
#define CLUSTER_TP 1
#endif

typedef struct {
    proc_t router, prefill, decode;
    proc_t prefill_ranks[CLUSTER_TP], decode_ranks[CLUSTER_TP]; /* ranks 1.. (followers) */
    char router_addr[128];
    const char *model, *tls, *chunk, *watchdog;
} cluster_t;

static const char *context = "512";
static const char *decode_max_total = NULL; /* --max-total-tokens of decode groups (NULL: none) */
/* more flags for the groups group_start starts and for the router (NULL-terminated; NULL:
 * none) */
static const char *const *prefill_extra, *const *decode_extra, *const *router_extra;

/* Starts a prefill (decode = false) or decode group: the following ranks first (they wait
 * for rank 0), then rank 0, which registers with the router. */
static int group_start(cluster_t *c, bool decode, const char *ctx, const char *chunk)
{
    char dist[64], tp[8];
    snprintf(dist, sizeof dist, "127.0.0.1:%d", free_port());
    snprintf(tp, sizeof tp, "%d", CLUSTER_TP);
    char rank_s[CLUSTER_TP][8];
    for (int r = CLUSTER_TP - 1; r >= 0; r--) {
        snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
        char *args[40] = {"--port", "0", "--model-path", (char *)c->model, "--served-model-name", "m",
                          "--router", c->router_addr, "--context-length", (char *)ctx, "--ucx-tls",
                          (char *)c->tls, "--threads", "1", "--watchdog-timeout", (char *)c->watchdog, NULL};
        int n = 16;
        if (!decode) {
            args[n++] = "--chunked-prefill-size";
            args[n++] = (char *)chunk;
        } else if (decode_max_total) {
            args[n++] = "--max-total-tokens";
            args[n++] = (char *)decode_max_total;
        }
        for (const char *const *e = decode ? decode_extra : prefill_extra; e && *e && n < 30; e++)
            args[n++] = (char *)*e;
        if (CLUSTER_TP > 1) {
            args[n++] = "--tp";
            args[n++] = tp;
            args[n++] = "--node-rank";
            args[n++] = rank_s[r];
            args[n++] = "--dist-init-addr";
            args[n++] = dist;
        }
        args[n] = NULL;
        proc_t *p = r == 0 ? (decode ? &c->decode : &c->prefill) : (decode ? &c->decode_ranks[r] : &c->prefill_ranks[r]);
        if (proc_startv(p, decode ? "baton-decode" : "baton-prefill", args, r == 0)) return -1;
    }
    return 0;
}

static void group_stop(cluster_t *c, bool decode, int sig)
{
    proc_stop(decode ? &c->decode : &c->prefill, sig);
    for (int r = 1; r < CLUSTER_TP; r++) proc_stop(decode ? &c->decode_ranks[r] : &c->prefill_ranks[r], SIGTERM);
}

/* One more group of one rank (bin: baton-prefill or baton-decode) on c's exact model and
 * router, with the watchdog `watchdog` and `more` flags (NULL-terminated; NULL: none). */
static int another_group(proc_t *p, const cluster_t *c, const char *bin, const char *watchdog,
                         const char *const *more)
{
    const char *args[32] = {"--port",
                            "0",
                            "--model-path",
                            golden_exact,
                            "--served-model-name",
                            "m",
                            "--router",
                            c->router_addr,
                            "--context-length",
                            context,
                            "--threads",
                            "1",
                            "--watchdog-timeout",
                            watchdog};
    int n = 14;
    for (; more && *more && n < 31; more++)
        args[n++] = *more;
    args[n] = NULL;
    return proc_startv(p, bin, (char **)args, true);
}

static int cluster_start(cluster_t *c, const char *model, const char *tls, const char *chunk,
                         const char *max_queued, const char *watchdog)
{
    memset(c, 0, sizeof *c);
    c->model = model;
    c->tls = tls;
    c->chunk = chunk;
    c->watchdog = watchdog;
    char *args[24] = {"--port",
                      "0",
                      "--model-path",
                      (char *)model,
                      "--served-model-name",
                      "m",
                      "--max-queued-requests",
                      (char *)max_queued,
                      "--heartbeat-ms",
                      "200",
                      "--watchdog-timeout",
                      (char *)watchdog,
                      NULL};
    int n = 12;
    for (const char *const *e = router_extra; e && *e && n < 22; e++)
        args[n++] = (char *)*e;
    args[n] = NULL;
    if (proc_startv(&c->router, "baton-router", args, true)) return -1;
    snprintf(c->router_addr, sizeof c->router_addr, "%s", c->router.addr);
    if (group_start(c, false, context, chunk) || group_start(c, true, context, chunk)) return -1;
    usleep(300000); /* registration */
    return 0;
}

static void cluster_stop(cluster_t *c)
{
    group_stop(c, true, SIGTERM);
    group_stop(c, false, SIGTERM);
    proc_stop(&c->router, SIGTERM);
}

static bool serving(client_t *cl);

/* A cluster on the exact golden model over UCX tcp, and a client of its router (opened even
 * when the start fails, for client_close): true once the router serves. */
static bool cluster_up(cluster_t *c, client_t *cl, const char *chunk, const char *max_queued,
                       const char *watchdog)
{
    const bool started = cluster_start(c, golden_exact, "tcp", chunk, max_queued, watchdog) == 0;
    client_open(cl, c->router_addr);
    return started && serving(cl);
}

/* cluster_up with these flags for the router (NULL-terminated) as well. */
static bool cluster_up_routing(cluster_t *c, client_t *cl, const char *const *router_flags)
{
    router_extra = router_flags;
    const bool up = cluster_up(c, cl, "4096", "256", "30");
    router_extra = NULL;
    return up;
}

/* Polls the router's Health (up to ~10 s) until it shows `decode` decode and `prefill`
 * prefill groups, or, with negative counts, until it serves at all. */
static bool wait_health(client_t *cl, int decode, int prefill, int leaving)
{
    for (int i = 0; i < 100; i++) {
        Baton__V1__HealthRequest rq = BATON__V1__HEALTH_REQUEST__INIT;
        unary_t u;
        call_unary(cl, cl->ch, "/baton.v1.Baton/Health", &rq.base, 2000, &u);
        Baton__V1__HealthResponse *h = u.code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__health_response, u.resp, u.len) : NULL;
        free(u.resp);
        bool ok = h && (leaving >= 0 ? h->leaving_groups == leaving
                        : decode < 0 ? h->serving
                                     : h->decode_groups == decode && h->prefill_groups == prefill);
        if (h) BT_PROTO_FREE(baton__v1__health_response, h);
        if (ok) return true;
        usleep(100000);
    }
    return false;
}

/* Waits until the router sees both kinds of group (Health.serving). */
static bool serving(client_t *cl)
{
    return wait_health(cl, -1, -1, -1);
}

/* Waits until the router lists exactly `decode` decode and `prefill` prefill groups. */
static bool groups(client_t *cl, int decode, int prefill)
{
    return wait_health(cl, decode, prefill, -1);
}

/* Waits until the router counts `n` groups leaving (stopping, sent nothing new). */
static bool leaving(client_t *cl, int n)
{
    return wait_health(cl, -1, -1, n);
}

static int64_t *tensor_i64(const bt_safetensors_t *st, const char *name, size_t *n)
{
    const bt_tensor_view_t *t = bt_safetensors_find(st, name);
    if (!t) return NULL;
    int64_t *v = malloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    *n = t->nbytes / 8;
    return v;
}

/* greedy ids of `baton generate` for the same prompt (extra: more flags, or "") */
static int one_process_with(const char *model, const int32_t *ids, int n, int max_new, const char *extra, int32_t *out)
{
    char cmd[8192];
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "%s/baton generate --model-path %s --max-new-tokens %d "
                                "--temperature 0 --ignore-eos --threads 1 %s --input-ids ", BT_BIN_DIR, model, max_new,
                                extra);
    for (int i = 0; i < n; i++) o += (size_t)snprintf(cmd + o, sizeof cmd - o, i ? ",%d" : "%d", ids[i]);
    snprintf(cmd + o, sizeof cmd - o, " 2>/dev/null");
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[16384] = "", last[16384] = "";
    while (fgets(line, sizeof line, f)) snprintf(last, sizeof last, "%s", line);
    pclose(f);
    int k = 0;
    for (char *p = last; *p && k < max_new;) {
        out[k++] = (int32_t)strtol(p, &p, 10);
        if (*p == ',') p++;
        else break;
    }
    return k;
}

static int one_process(const char *model, const int32_t *ids, int n, int max_new, int32_t *out)
{
    return one_process_with(model, ids, n, max_new, "", out);
}

static void check_golden(const char *model, const char *fixture_dir, bool exact, const char *tls,
                         const char *chunk)
{
    cluster_t c;
    BT_CHECK_MSG(cluster_start(&c, model, tls, chunk, "256", "30") == 0, "cluster (%s, %s)", tls, chunk);
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    char path[700];
    snprintf(path, sizeof path, "%s/golden.safetensors", fixture_dir);
    bt_safetensors_t *gold;
    char err[256];
    BT_CHECK(bt_safetensors_open(path, &gold, err, sizeof err) == BT_OK);
    int checked = 0;
    for (int p = 0; p < 6; p++) {
        char key[64];
        size_t S = 0, G = 0, one = 0;
        snprintf(key, sizeof key, "prompt%d.input_ids", p);
        int64_t *in = tensor_i64(gold, key, &S);
        snprintf(key, sizeof key, "prompt%d.gen_ids", p);
        int64_t *gen = tensor_i64(gold, key, &G);
        snprintf(key, sizeof key, "prompt%d.gen_robust_len", p);
        int64_t *rl = tensor_i64(gold, key, &one);
        int32_t ids[256];
        for (size_t i = 0; i < S; i++) ids[i] = (int32_t)in[i];
        gen_t g;
        gen_start(&cl, &g, ids, (int)S, (int)G, true, 60000);
        BT_CHECK(run_until(&cl, all_done, &cl, 70000));
        BT_CHECK_MSG(g.code == BT_RPC_OK, "prompt%d: %s %s", p, bt_rpc_code_name(g.code), g.message);
        BT_CHECK_EQ_INT(g.n, (long long)G);
        size_t must = exact ? G : (size_t)rl[0];
        for (size_t i = 0; i < must && i < (size_t)g.n; i++)
            BT_CHECK_MSG(g.ids[i] == gen[i], "%s prompt%d token %zu: %d vs golden %lld (%s, chunk %s)", fixture_dir, p,
                         i, g.ids[i], (long long)gen[i], tls, chunk);
        int32_t ref[64];
        int k = one_process(model, ids, (int)S, (int)G, ref);
        BT_CHECK_EQ_INT(k, (long long)G);
        BT_CHECK_MSG(k == g.n && !memcmp(ref, g.ids, (size_t)k * sizeof(int32_t)),
                     "%s prompt%d: cluster differs from baton generate (%s, chunk %s)", fixture_dir, p, tls, chunk);
        checked++;
        free(in);
        free(gen);
        free(rl);
    }
    fprintf(stderr, "  %s: %d prompts through the cluster (ucx %s, chunk %s)\n", fixture_dir, checked, tls, chunk);
    bt_safetensors_close(gold);
    client_close(&cl);
    cluster_stop(&c);
}

static void test_greedy_matches_golden(void)
{
    check_golden(golden_exact, golden_exact, true, "tcp", "7");
    check_golden(golden_exact, golden_exact, true, "sm", "4096");
    check_golden(golden_exact, golden_exact, true, "sm", "7");
    check_golden(golden_a, golden_a, false, "tcp", "4096");
    check_golden(golden_a, golden_a, false, "sm", "7");
}

static bool stats_ok(client_t *cl, const char *addr, int *running, int *max_seen, int64_t *used)
{
    Baton__V1__StatsResponse *s;
    if (!decode_stats(cl, addr, &s)) return false;
    *running = s->running;
    *max_seen = s->max_running_seen;
    *used = s->kv_slots_used;
    BT_PROTO_FREE(baton__v1__stats_response, s);
    return true;
}

/* Polls the decode group at addr (pumping the client's loop) until it holds `want` KV slots,
 * up to ms, or until g (when given) is done; returns the count it last reported (-1: none) and
 * its running requests in *running. */
static int64_t wait_slots_used(client_t *cl, const char *addr, int64_t want, const gen_t *g, int ms,
                               int *running)
{
    int r = 0, seen = 0;
    int64_t used = -1, until = ms_now() + ms;
    while (ms_now() < until && !(g && g->done)) {
        if (stats_ok(cl, addr, &r, &seen, &used) && used == want) break;
        uv_run(&cl->loop, UV_RUN_NOWAIT);
        usleep(10000);
    }
    if (running) *running = r;
    return used;
}

/* A 4000-token prompt (in chunks of one token, a long prefill) started on c: checks that its
 * decode slot is taken while it is still in prefill, then lets some chunks go by. */
static void start_long_prefill(client_t *cl, const cluster_t *c, gen_t *g, int32_t *prompt)
{
    for (int i = 0; i < 4000; i++)
        prompt[i] = (i * 13 + 5) % 1000;
    gen_start(cl, g, prompt, 4000, 8, true, 60000);
    const int64_t used = wait_slots_used(cl, c->decode.addr, 1, g, 10000, NULL);
    BT_CHECK_MSG(used == 1 && !g->done, "a slot is taken during prefill (%lld)", (long long)used);
    usleep(200000);
}

/* start_long_prefill, then two short requests queued behind it at the one prefill group:
 * checks that the decode group holds all three slots. */
static void start_active_and_two_queued(client_t *cl, const cluster_t *c, gen_t *a, gen_t *b,
                                        gen_t *d, int32_t *prompt)
{
    start_long_prefill(cl, c, a, prompt);
    gen_start(cl, b, prompt, 5, 4, true, 60000);
    gen_start(cl, d, prompt + 5, 5, 4, true, 60000);
    const int64_t used = wait_slots_used(cl, c->decode.addr, 3, NULL, 5000, NULL);
    BT_CHECK_MSG(used == 3, "three slots taken (%lld)", (long long)used);
}

/* Requests the router has put back in its queue so far (requests_requeued_total). */
static double requeued_so_far(const cluster_t *c)
{
    return metric_value(c->router.metrics, "baton_router_requests_requeued_total");
}

static void test_admission(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "60"));
    int32_t prompt[5] = {0, 1000, 42, 71, 78};
    int32_t ref[64];
    int k = one_process(golden_exact, prompt, 5, 48, ref);
    static gen_t g[40];
    for (int i = 0; i < 40; i++) gen_start(&cl, &g[i], prompt, 5, 48, true, 120000);
    int max_running = 0, running, seen;
    int64_t used;
    int64_t deadline = ms_now() + 120000;
    while (cl.outstanding > 0 && ms_now() < deadline) {
        if (stats_ok(&cl, c.decode.addr, &running, &seen, &used) && running > max_running) max_running = running;
        uv_run(&cl.loop, UV_RUN_NOWAIT);
    }
    BT_CHECK(cl.outstanding == 0);
    BT_CHECK(stats_ok(&cl, c.decode.addr, &running, &seen, &used));
    fprintf(stderr, "  40 concurrent: decode saw at most %d running (polled %d), now %lld slots used\n", seen,
            max_running, (long long)used);
    BT_CHECK_MSG(seen <= 16 && max_running <= 16, "decode ran %d at once", seen);
    BT_CHECK_MSG(seen == 16, "the decode group should have filled its 16 places (saw %d)", seen);
    BT_CHECK_EQ_INT(used, 0);
    for (int i = 0; i < 40; i++) {
        BT_CHECK_MSG(g[i].code == BT_RPC_OK, "request %d: %s %s", i, bt_rpc_code_name(g[i].code), g[i].message);
        BT_CHECK_MSG(g[i].n == k && !memcmp(g[i].ids, ref, (size_t)k * sizeof(int32_t)), "request %d output differs", i);
    }
    client_close(&cl);
    cluster_stop(&c);

    /* with a queue of 8: 16 run, 8 wait, 16 are refused at once */
    BT_CHECK(cluster_start(&c, golden_exact, "tcp", "4096", "8", "60") == 0);
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    int64_t t0 = ms_now();
    for (int i = 0; i < 40; i++) gen_start(&cl, &g[i], prompt, 5, 200, true, 120000);
    BT_CHECK(run_until(&cl, all_done, &cl, 120000));
    int ok = 0, refused = 0, refused_fast = 0;
    for (int i = 0; i < 40; i++) {
        if (g[i].code == BT_RPC_OK) ok++;
        if (g[i].code == BT_RPC_RESOURCE_EXHAUSTED) {
            refused++;
            if (g[i].t_done - t0 < 1000) refused_fast++;
        }
    }
    fprintf(stderr, "  queue of 8: %d finished, %d refused (%d within 1 s)\n", ok, refused, refused_fast);
    BT_CHECK_EQ_INT(ok, 24);
    BT_CHECK_EQ_INT(refused, 16);
    BT_CHECK_EQ_INT(refused_fast, 16);
    client_close(&cl);
    cluster_stop(&c);
}

static bool got_tokens(void *ctx)
{
    gen_t *g = ctx;
    return g->n >= 5 || g->done;
}

static bool gen_done(void *ctx)
{
    return ((gen_t *)ctx)->done;
}

static void test_kill_decode(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "5"));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    gen_start(&cl, &g, prompt, 3, 400, true, 60000);
    BT_CHECK(run_until(&cl, got_tokens, &g, 20000));
    int64_t t_kill = ms_now();
    proc_stop(&c.decode, SIGKILL);
    BT_CHECK(run_until(&cl, gen_done, &g, 10000));
    fprintf(stderr, "  decode killed: request ended %s after %lld ms (%s)\n", bt_rpc_code_name(g.code),
            (long long)(g.t_done - t_kill), g.message);
    BT_CHECK_MSG(g.code == BT_RPC_UNAVAILABLE, "got %s", bt_rpc_code_name(g.code));
    BT_CHECK(g.t_done - t_kill < 5000);
    /* the router stops sending to it: it drops out of the registry */
    BT_CHECK(groups(&cl, 0, 1));
    /* and the prefill group lets go of its KV pool once the transport finds it gone (it kept
     * one endpoint for every decode group that ever went away) */
    BT_CHECK_MSG(c.prefill.metrics[0], "the prefill group printed no metrics address");
    double peers = wait_metric(c.prefill.metrics, "baton_prefill_kv_peers", 0, 10000);
    BT_CHECK_MSG(peers == 0, "the prefill group holds %g decode peers, the dead group's", peers);
    /* restarted, it registers again and serves */
    group_stop(&c, true, SIGKILL); /* the rest of the group left with its leader */
    BT_CHECK(group_start(&c, true, context, c.chunk) == 0);
    BT_CHECK(groups(&cl, 1, 1));
    gen_start(&cl, &g, prompt, 3, 8, true, 30000);
    BT_CHECK(run_until(&cl, gen_done, &g, 30000));
    BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 8, "after restart: %s %s", bt_rpc_code_name(g.code), g.message);
    peers = metric_value(c.prefill.metrics, "baton_prefill_kv_peers");
    BT_CHECK_MSG(peers == 1, "the prefill group holds %g decode peers, not the one live", peers);
    client_close(&cl);
    cluster_stop(&c);
}

static void test_kill_prefill_and_cancel(void)
{
    cluster_t c;
    /* a long prompt in chunks of one token: the transfer is long enough to kill mid-way */
    context = "4096";
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "5"));
    static int32_t prompt[4000];
    gen_t g;
    start_long_prefill(&cl, &c, &g, prompt);
    int64_t t_kill = ms_now();
    proc_stop(&c.prefill, SIGKILL);
    BT_CHECK(run_until(&cl, gen_done, &g, 10000));
    fprintf(stderr, "  prefill killed: request ended %s after %lld ms (%s)\n", bt_rpc_code_name(g.code),
            (long long)(g.t_done - t_kill), g.message);
    BT_CHECK(g.code == BT_RPC_UNAVAILABLE);
    int64_t used = wait_slots_used(&cl, c.decode.addr, 0, NULL, 10000, NULL);
    BT_CHECK_MSG(used == 0, "decode still holds %lld slots", (long long)used);
    BT_CHECK(groups(&cl, 1, 0));

    /* a client cancel mid-stream returns the pool to its baseline */
    group_stop(&c, false, SIGKILL);
    BT_CHECK(group_start(&c, false, context, "64") == 0);
    BT_CHECK(groups(&cl, 1, 1));
    gen_start(&cl, &g, prompt, 3, 400, true, 60000);
    BT_CHECK(run_until(&cl, got_tokens, &g, 20000));
    int running = 0, seen = 0;
    BT_CHECK(stats_ok(&cl, c.decode.addr, &running, &seen, &used) && used == 1);
    bt_rpc_client_cancel(g.call);
    BT_CHECK(run_until(&cl, gen_done, &g, 5000));
    BT_CHECK(g.code == BT_RPC_CANCELLED);
    used = wait_slots_used(&cl, c.decode.addr, 0, NULL, 5000, &running);
    BT_CHECK_MSG(used == 0 && running == 0, "after cancel: %lld slots, %d running", (long long)used, running);
    client_close(&cl);
    cluster_stop(&c);
    context = "512";
}

/* A decode group whose KV pool holds fewer requests than --max-running-requests (here 2
 * slots of 512 tokens, from --max-total-tokens 1024) runs at most that many and says so when it
 * registers: the router queues the rest. It registered 16, so the router sent 4 at once and
 * two came back RESOURCE_EXHAUSTED (429 at the gateway) with its queue empty. */
static void test_pool_smaller_than_batch(void)
{
    cluster_t c;
    decode_max_total = "1024";
    BT_CHECK(cluster_start(&c, golden_exact, "tcp", "4096", "256", "30") == 0);
    decode_max_total = NULL;
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g[4];
    for (int i = 0; i < 4; i++)
        gen_start(&cl, &g[i], prompt, 3, 40, true, 60000);
    BT_CHECK(run_until(&cl, all_done, &cl, 60000));
    for (int i = 0; i < 4; i++)
        BT_CHECK_MSG(g[i].code == BT_RPC_OK && g[i].n == 40, "request %d: %s %s, %d tokens", i,
                     bt_rpc_code_name(g[i].code), g[i].message, g[i].n);
    int running = 0, seen = 0;
    int64_t used = -1;
    BT_CHECK(stats_ok(&cl, c.decode.addr, &running, &seen, &used));
    BT_CHECK_MSG(seen <= 2, "the decode group ran %d at once", seen);
    client_close(&cl);
    cluster_stop(&c);
}

/* A client cancel during prefill: the decode group cancels its Prefill call, and the prefill
 * group, once its last write is flushed, says so (a STOPPED notice), so the slot is free again
 * at once. Before, nothing told the decode group when the writes had stopped, and the slot
 * waited out the watchdog (300 s by default: 16 such cancels filled the pool). */
static void test_cancel_during_prefill(void)
{
    cluster_t c;
    context = "4096";
    /* chunks of one token: the prefill is long enough to cancel mid-way; a 30 s watchdog */
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "30"));
    static int32_t prompt[4000];
    gen_t g;
    start_long_prefill(&cl, &c, &g, prompt);
    bt_rpc_client_cancel(g.call);
    BT_CHECK(run_until(&cl, gen_done, &g, 5000));
    BT_CHECK_MSG(g.code == BT_RPC_CANCELLED, "%s", bt_rpc_code_name(g.code));
    int64_t t_cancel = ms_now();
    const int64_t used = wait_slots_used(&cl, c.decode.addr, 0, NULL, 5000, NULL);
    fprintf(stderr, "  cancelled during prefill: the slot was free again after %lld ms\n",
            (long long)(ms_now() - t_cancel));
    BT_CHECK_MSG(used == 0, "the decode group still holds %lld slots (waiting out its watchdog?)",
                 (long long)used);
    /* and the groups serve the next request */
    gen_start(&cl, &g, prompt, 3, 4, true, 30000);
    BT_CHECK(run_until(&cl, gen_done, &g, 30000));
    BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 4, "after: %s %s", bt_rpc_code_name(g.code),
                 g.message);
    client_close(&cl);
    cluster_stop(&c);
    context = "512";
}

/* Requests cancelled at every moment of a short prefill and handoff: no slot stays held. A
 * cancel that came after the LAST notice (every write in place) but before the prefill's
 * reply quarantined a complete slot for the watchdog (60 s here, 300 s by default), and the
 * STOPPED notice that frees quarantines early never came (the job was not stopped: it was
 * done). */
static __attribute__((unused)) void test_cancel_storm(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "60"));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    gen_start(&cl, &g, prompt, 3, 2, true, 30000); /* the groups have met (Hello) */
    BT_CHECK(run_until(&cl, gen_done, &g, 30000) && g.code == BT_RPC_OK);
    /* one request, start to end: the fastest of five (one slow sample spread the cancels past
     * most requests' ends, and too few landed to show anything) */
    int64_t full_us = INT64_MAX;
    for (int i = 0; i < 5; i++) {
        const int64_t t0 = ms_now();
        gen_start(&cl, &g, prompt, 3, 2, true, 30000);
        BT_CHECK(run_until(&cl, gen_done, &g, 30000) && g.code == BT_RPC_OK);
        const int64_t us = (ms_now() - t0 + 1) * 1000;
        if (us < full_us) full_us = us;
    }
    int cancelled = 0;
    for (int i = 0; i < 80; i++) {
        prompt[1] = 40 + i;
        gen_start(&cl, &g, prompt, 3, 2, true, 30000);
        const int64_t until = ms_now() * 1000 + full_us * i / 80; /* spread over the request */
        while (ms_now() * 1000 < until && !g.done) {
            uv_run(&cl.loop, UV_RUN_NOWAIT);
            usleep(50);
        }
        if (!g.done) bt_rpc_client_cancel(g.call);
        BT_CHECK(run_until(&cl, gen_done, &g, 10000));
        cancelled += g.code == BT_RPC_CANCELLED;
    }
    const int64_t used = wait_slots_used(&cl, c.decode.addr, 0, NULL, 3000, NULL);
    fprintf(stderr,
            "  80 requests cancelled through a %lld us request (%d before their end): %lld slots "
            "held after\n",
            (long long)full_us, cancelled, (long long)used);
    BT_CHECK_MSG(cancelled >= 20, "only %d cancels landed: the test shows nothing", cancelled);
    BT_CHECK_MSG(used == 0, "the decode group holds %lld slots (quarantined?)", (long long)used);
    client_close(&cl);
    cluster_stop(&c);
}

/* Forget of a job the prefill group never saw answers done, and the job's Prefill call, should
 * it come later, is refused (ABORTED: nothing written), so the decode group may reuse its slot
 * at once; the same request under another epoch is not refused for it. */
static void test_forget_refuses_late_call(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    bt_rpc_channel_t *ch;
    BT_CHECK(bt_rpc_channel_create(cl.rpc, c.prefill.addr, NULL, &ch) == BT_OK);
    for (int round = 0; round < 2; round++) { /* (again: still done) */
        Baton__V1__ForgetRequest fr = BATON__V1__FORGET_REQUEST__INIT;
        fr.request_id = "ghost";
        fr.epoch = 7;
        fr.hold_ms = 30000;
        unary_t u;
        call_unary(&cl, ch, "/baton.v1.Prefill/Forget", &fr.base, 5000, &u);
        Baton__V1__ForgetResponse *r =
            u.code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__forget_response, u.resp, u.len) : NULL;
        BT_CHECK_MSG(r && r->done, "Forget of a job never seen: %s, done %d",
                     bt_rpc_code_name(u.code), r ? r->done : -1);
        if (r) BT_PROTO_FREE(baton__v1__forget_response, r);
        free(u.resp);
    }
    for (int epoch = 7; epoch <= 8; epoch++) {
        Baton__V1__PrefillRequest pr = BATON__V1__PREFILL_REQUEST__INIT;
        pr.request_id = "ghost";
        pr.epoch = (uint64_t)epoch;
        unary_t u;
        call_unary(&cl, ch, "/baton.v1.Prefill/Prefill", &pr.base, 5000, &u);
        free(u.resp);
        if (epoch == 7)
            BT_CHECK_MSG(u.code == BT_RPC_ABORTED, "the forgotten job's call: %s",
                         bt_rpc_code_name(u.code));
        else /* (refused too, for its missing compat hash and target: not as forgotten) */
            BT_CHECK_MSG(u.code != BT_RPC_ABORTED, "another epoch's call: %s",
                         bt_rpc_code_name(u.code));
    }
    bt_rpc_channel_destroy(ch);
    client_close(&cl);
    cluster_stop(&c);
}

/* A prefill group that goes away after a request's handoff (its first token) must not end
 * that request: decoding needs only the decode group. The router failed every request it had
 * ever sent to the group, so a prefill restart cut off streams that were decoding. */
static __attribute__((unused)) void test_prefill_gone_while_decoding(void)
{
    cluster_t c;
    context = "4096";
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    const int want = 4000; /* long enough to outlast the router's three missed heartbeats */
    gen_start(&cl, &g, prompt, 3, want, true, 120000);
    BT_CHECK(run_until(&cl, got_tokens, &g, 20000));
    proc_stop(&c.prefill, SIGKILL);
    BT_CHECK(groups(&cl, 1, 0)); /* (pumps the stream while it waits) */
    const bool removed_while_decoding = !g.done;
    BT_CHECK(run_until(&cl, gen_done, &g, 90000));
    fprintf(stderr, "  prefill gone at token ~%s: request ended %s with %d tokens (%s)\n",
            removed_while_decoding ? "mid-stream" : "after the end", bt_rpc_code_name(g.code), g.n,
            g.message);
    BT_CHECK_MSG(removed_while_decoding, "the request ended before the router removed the group");
    BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == want, "%s %s, %d tokens", bt_rpc_code_name(g.code),
                 g.message, g.n);
    client_close(&cl);
    group_stop(&c, false, SIGKILL); /* the rest of the prefill group left with its leader */
    cluster_stop(&c);
    context = "512";
}

static __attribute__((unused)) bool two_tokens(void *ctx)
{
    gen_t *g = ctx;
    return g->n >= 2 || g->done;
}

/* Simulated groups (their steps and prefills as long as a test needs) whose decode group
 * has one place. */
static __attribute__((unused)) int start_one_place(cluster_t *c, const char *step_ms,
                                                   const char *prefill_tps, const char *watchdog)
{
    const char *const dec[] = {
        "--simulate", "--max-running-requests", "1", "--sim-decode-step-ms-base", step_ms, NULL};
    const char *const pre[] = {"--simulate", "--sim-prefill-tokens-per-s", prefill_tps, NULL};
    decode_extra = dec;
    prefill_extra = pre;
    const int rc = cluster_start(c, golden_exact, "tcp", "4096", "256", watchdog);
    decode_extra = prefill_extra = NULL;
    return rc;
}

/* A request the router saw end (a client cancel; a stop string the router matched) is still
 * in the decode group's step in flight, so its place there is not free yet when the router
 * sends the next request into it. The decode group refused that one (a 429 at the gateway)
 * with the router's queue empty; now it waits for the step's end. One place, 400 ms steps. */
static __attribute__((unused)) void test_place_freed_mid_step(void)
{
    cluster_t c;
    BT_CHECK(start_one_place(&c, "400", "5000", "30") == 0);
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    int32_t prompt[3] = {0, 42, 71};
    gen_t a, b;
    gen_start(&cl, &a, prompt, 3, 100, true, 60000);
    BT_CHECK(run_until(&cl, two_tokens, &a, 20000)); /* its next step has just begun */
    bt_rpc_client_cancel(a.call);
    BT_CHECK(run_until(&cl, gen_done, &a, 5000));
    const int64_t t0 = ms_now();
    gen_start(&cl, &b, prompt, 3, 3, true, 60000);
    BT_CHECK(run_until(&cl, gen_done, &b, 30000));
    fprintf(stderr,
            "  the next request, sent into a place freed mid-step: %s, %d tokens after %lld ms\n",
            bt_rpc_code_name(b.code), b.n, (long long)(b.t_done - t0));
    BT_CHECK_MSG(b.code == BT_RPC_OK && b.n == 3, "%s %s, %d tokens", bt_rpc_code_name(b.code),
                 b.message, b.n);
    int running = 0, seen = 0;
    int64_t used = -1;
    BT_CHECK(stats_ok(&cl, c.decode.addr, &running, &seen, &used));
    BT_CHECK_MSG(seen == 1, "the decode group ran %d at once", seen);
    /* the decode group held it for the step's end: the router had nothing to send again */
    const double requeued = requeued_so_far(&c);
    BT_CHECK_MSG(requeued == 0, "the router queued %g requests again", requeued);
    client_close(&cl);
    cluster_stop(&c);
}

/* On c (one place, prefills at 50 tokens a second): a 300-token prompt whose prefill group
 * is killed mid-prefill, so that its decode slot waits out late writes; then a simulated
 * prefill group in its place. Returns when the request failed (ms_now()). */
static __attribute__((unused)) int64_t hold_slot_for_dead_prefill(cluster_t *c, client_t *cl,
                                                                  int32_t *prompt)
{
    for (int i = 0; i < 300; i++)
        prompt[i] = (i * 13 + 5) % 1000;
    gen_t a;
    gen_start(cl, &a, prompt, 300, 4, true, 60000); /* 6 s of prefill to kill it in */
    const int64_t used = wait_slots_used(cl, c->decode.addr, 1, &a, 10000, NULL);
    BT_CHECK_MSG(used == 1 && !a.done, "a slot is taken during prefill (%lld)", (long long)used);
    usleep(300000);
    proc_stop(&c->prefill, SIGKILL);
    BT_CHECK(run_until(cl, gen_done, &a, 10000));
    BT_CHECK_MSG(a.code == BT_RPC_UNAVAILABLE, "%s", bt_rpc_code_name(a.code));
    const int64_t t_fail = ms_now();
    BT_CHECK(groups(cl, 1, 0));
    group_stop(c, false, SIGKILL);
    const char *const pre[] = {"--simulate", NULL};
    prefill_extra = pre;
    BT_CHECK(group_start(c, false, context, c->chunk) == 0);
    prefill_extra = NULL;
    BT_CHECK(groups(cl, 1, 1));
    return t_fail;
}

/* A slot can stay held at the decode group with no request in it: here the slot of a request
 * whose prefill group died mid-transfer, which waits out the watchdog (6 s) for late writes.
 * The next request waits in the router's queue, which knows of the held slot from the
 * group's heartbeats, and runs once the slot is free. The router counted the place free: the
 * group refused the request (to the client, at first; then, once the router queued refusals
 * again, every 2 s until the slot was free). */
static __attribute__((unused)) void test_held_slot_waits_at_router(void)
{
    cluster_t c;
    /* a prompt of 300 tokens at 50 a second: six seconds of prefill to kill it in; the
     * router's own watchdog longer than the queue wait this test makes */
    static const char *const rex[] = {"--watchdog-timeout", "30", NULL};
    router_extra = rex;
    BT_CHECK(start_one_place(&c, "20", "50", "6") == 0);
    router_extra = NULL;
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    static int32_t prompt[300];
    const int64_t t_fail = hold_slot_for_dead_prefill(&c, &cl, prompt);
    /* (the first request went round the dead prefill group's rests before it failed) */
    const double requeued_before = requeued_so_far(&c);
    gen_t b;
    gen_start(&cl, &b, prompt, 3, 3, true, 60000);
    BT_CHECK(run_until(&cl, gen_done, &b, 30000));
    fprintf(stderr,
            "  the next request, into a slot waiting out late writes: %s, %d tokens, done "
            "%lld ms after the first one failed\n",
            bt_rpc_code_name(b.code), b.n, (long long)(b.t_done - t_fail));
    BT_CHECK_MSG(b.code == BT_RPC_OK && b.n == 3, "%s %s, %d tokens", bt_rpc_code_name(b.code),
                 b.message, b.n);
    BT_CHECK_MSG(b.t_done - t_fail >= 5000,
                 "done %lld ms after the failure: the slot was not "
                 "held (the test shows nothing)",
                 (long long)(b.t_done - t_fail));
    const double requeued = requeued_so_far(&c) - requeued_before;
    BT_CHECK_MSG(requeued == 0, "the group refused the request %g times", requeued);
    client_close(&cl);
    cluster_stop(&c);
}

/* An arrival at a decode group whose running cap binds waits for a place being freed (a
 * request ended, still in the step in flight), not for a slot waiting out late writes: that
 * slot's end frees a slot, not a running place. One place, three slots, one held for a dead
 * prefill group's late writes, one request running: a request sent straight to the group is
 * refused at once. It waited PLACE_WAIT_MS (2 s) for the held slot, then was refused. */
typedef struct {
    bool done;
    bt_rpc_code_t code;
    int64_t t_done;
} direct_t;

static void direct_msg(void *ctx, const uint8_t *data, size_t len)
{
    (void)ctx, (void)data, (void)len;
}

static void direct_done(void *ctx, bt_rpc_code_t code, const char *msg)
{
    (void)msg;
    direct_t *x = ctx;
    x->done = true;
    x->code = code;
    x->t_done = ms_now();
}

static bool direct_finished(void *ctx)
{
    return ((direct_t *)ctx)->done;
}

static __attribute__((unused)) void test_held_slot_no_running_place(void)
{
    cluster_t c;
    decode_max_total = "1536"; /* 3 slots of 512 */
    BT_CHECK(start_one_place(&c, "50", "50", "30") == 0);
    decode_max_total = NULL;
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    static int32_t prompt[300];
    hold_slot_for_dead_prefill(&c, &cl, prompt);
    gen_t b;
    gen_start(&cl, &b, prompt, 3, 200, true, 60000); /* 10 s of 50 ms steps: the place taken */
    int running = 0;
    const int64_t used = wait_slots_used(&cl, c.decode.addr, 2, &b, 10000, &running);
    BT_CHECK_MSG(used == 2 && running == 1 && !b.done,
                 "one slot held, one running (%lld slots, %d running)", (long long)used, running);
    /* straight to the decode group, as a router that counted a place free would */
    Baton__V1__DecodeRequest dr = BATON__V1__DECODE_REQUEST__INIT;
    dr.request_id = "straight-in";
    dr.epoch = 1;
    dr.n_prompt_ids = 3;
    dr.prompt_ids = prompt;
    dr.prefill_address = c.prefill.addr;
    dr.max_new_tokens = 2;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&dr.base, &buf, &len);
    bt_rpc_channel_t *ch;
    BT_CHECK(bt_rpc_channel_create(cl.rpc, c.decode.addr, NULL, &ch) == BT_OK);
    direct_t x = {0};
    const int64_t t0 = ms_now();
    BT_CHECK(bt_rpc_stream(ch, "/baton.v1.Decode/Generate", buf, len, 10000, direct_msg,
                           direct_done, &x, NULL) == BT_OK);
    free(buf);
    BT_CHECK(run_until(&cl, direct_finished, &x, 10000));
    fprintf(stderr,
            "  a request sent into a running cap that binds, a slot held for late writes: %s "
            "after %lld ms\n",
            bt_rpc_code_name(x.code), (long long)(x.t_done - t0));
    BT_CHECK(x.code == BT_RPC_RESOURCE_EXHAUSTED);
    BT_CHECK_MSG(x.t_done - t0 < 1000, "refused after %lld ms: it waited for the held slot",
                 (long long)(x.t_done - t0));
    bt_rpc_channel_destroy(ch);
    bt_rpc_client_cancel(b.call);
    BT_CHECK(run_until(&cl, gen_done, &b, 10000));
    client_close(&cl);
    cluster_stop(&c);
}

/* More running requests than one decode step takes (the engine's BT_MODEL_MAX_SEQS, 64):
 * the decode group accepted --max-running-requests up to 1024, and once a 65th request ran
 * every step failed (INTERNAL for the whole batch; under TP the group left). Now it runs at
 * most 64 and registers that, and the router queues the rest. */
static __attribute__((unused)) void test_batch_past_engine_limit(void)
{
    static const char *const rex[] = {"--max-running-requests", "80", NULL};
    static const char *const dex[] = {"--max-running-requests", "80", NULL};
    router_extra = rex;
    decode_extra = dex;
    cluster_t c;
    BT_CHECK(cluster_start(&c, golden_exact, "tcp", "4096", "256", "60") == 0);
    router_extra = decode_extra = NULL;
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    static gen_t g[70];
    static int32_t prompts[70][3];
    for (int i = 0; i < 70; i++) {
        prompts[i][0] = 0, prompts[i][1] = 40 + i, prompts[i][2] = 71;
        gen_start(&cl, &g[i], prompts[i], 3, 300, true, 120000);
    }
    BT_CHECK(run_until(&cl, all_done, &cl, 120000));
    int ok = 0;
    for (int i = 0; i < 70; i++)
        ok += g[i].code == BT_RPC_OK && g[i].n == 300;
    int running = 0, seen = 0;
    int64_t used = -1;
    BT_CHECK(stats_ok(&cl, c.decode.addr, &running, &seen, &used));
    fprintf(stderr, "  70 requests, 80 allowed: %d finished, the decode group ran at most %d\n", ok,
            seen);
    BT_CHECK_EQ_INT(ok, 70);
    BT_CHECK_MSG(seen <= 64, "the decode group ran %d at once", seen);
    client_close(&cl);
    cluster_stop(&c);
}

/* A prefill group stopped (SIGTERM) with --drain-timeout 0, one request in prefill and two
 * queued behind it: the queued ones wrote nothing and the active one stops at a chunk boundary,
 * so the decode group gets all three slots back at once. Before, the queued calls were cut by
 * the server's close and the process left before the active job's STOPPED notice: every slot
 * waited out the watchdog (30 s here, 300 s by default), and a prefill restart under load
 * filled the pools. The three requests, with no token yet, wait at the router for another
 * prefill group; none comes, and once the stopped group is gone they fail, not at their
 * watchdog. */
static __attribute__((unused)) void test_prefill_stop_frees_slots(void)
{
    cluster_t c;
    context = "4096";
    static const char *const pre[] = {"--drain-timeout", "0", NULL};
    prefill_extra = pre;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "30"));
    prefill_extra = NULL;
    static int32_t prompt[4000];
    gen_t a, b, d;
    start_active_and_two_queued(&cl, &c, &a, &b, &d, prompt);
    const int64_t t_stop = ms_now();
    group_stop(&c, false, SIGTERM);
    const int64_t used = wait_slots_used(&cl, c.decode.addr, 0, NULL, 5000, NULL);
    fprintf(stderr, "  prefill stopped with 1 active and 2 queued: %lld slots held %lld ms after\n",
            (long long)used, (long long)(ms_now() - t_stop));
    BT_CHECK_MSG(used == 0, "the decode group still holds %lld slots (waiting out its watchdog?)",
                 (long long)used);
    BT_CHECK(run_until(&cl, all_done, &cl, 10000));
    fprintf(stderr, "  with no prefill group left, %lld ms after the stop: %s %s %s (%s)\n",
            (long long)(a.t_done - t_stop), bt_rpc_code_name(a.code), bt_rpc_code_name(b.code),
            bt_rpc_code_name(d.code), a.message);
    BT_CHECK_MSG(a.code == BT_RPC_UNAVAILABLE && b.code == BT_RPC_UNAVAILABLE &&
                     d.code == BT_RPC_UNAVAILABLE && strstr(a.message, "no prefill group"),
                 "%s %s", bt_rpc_code_name(a.code), a.message);
    const double requeued = requeued_so_far(&c);
    BT_CHECK_MSG(requeued == 3, "the router queued %g requests again", requeued);
    client_close(&cl);
    cluster_stop(&c);
    context = "512";
}

/* A prefill group stopped (SIGTERM, a rolling restart) with one request in prefill and two
 * queued behind it, while another prefill group serves: the queued two go to the other group
 * at once, the active one finishes where it is (--drain-timeout), and the stopped group then
 * leaves by itself. Before, all three failed UNAVAILABLE: the queued ones ABORTED, the active
 * one cut after a second. */
static __attribute__((unused)) void test_prefill_stop_drains(void)
{
    cluster_t c;
    context = "4096";
    client_t cl;
    /* (the whole 4000-token prefill must end within the watchdog and the drain) */
    static const char *const pre[] = {"--drain-timeout", "120", NULL};
    prefill_extra = pre;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "120"));
    prefill_extra = NULL;
    static int32_t prompt[4000];
    gen_t a, b, d;
    start_active_and_two_queued(&cl, &c, &a, &b, &d, prompt);
    proc_t other;
    BT_CHECK(another_group(&other, &c, "baton-prefill", "30", NULL) == 0);
    BT_CHECK(groups(&cl, 1, 2));
    BT_CHECK_MSG(!a.done && wait_slots_used(&cl, c.decode.addr, 3, NULL, 1000, NULL) == 3,
                 "the long prefill still runs, two behind it (the test shows nothing else)");
    const int64_t t_stop = ms_now();
    kill(c.prefill.pid, SIGTERM);
    BT_CHECK(run_until(&cl, all_done, &cl, 60000));
    const bool exited = proc_exited(&c.prefill, 10000);
    fprintf(stderr,
            "  prefill stopped with 1 active and 2 queued, another serving: queued %s %s after "
            "%lld/%lld ms, active %s after %lld ms; the group %s\n",
            bt_rpc_code_name(b.code), bt_rpc_code_name(d.code), (long long)(b.t_done - t_stop),
            (long long)(d.t_done - t_stop), bt_rpc_code_name(a.code),
            (long long)(a.t_done - t_stop), exited ? "left" : "is still there");
    BT_CHECK_MSG(b.code == BT_RPC_OK && d.code == BT_RPC_OK, "%s %s / %s %s",
                 bt_rpc_code_name(b.code), b.message, bt_rpc_code_name(d.code), d.message);
    BT_CHECK_MSG(a.code == BT_RPC_OK && a.n == 8, "%s %s", bt_rpc_code_name(a.code), a.message);
    BT_CHECK_MSG(b.t_done < a.t_done && d.t_done < a.t_done,
                 "the queued ones waited for the active one (the test shows nothing)");
    BT_CHECK(exited);
    const double requeued = requeued_so_far(&c);
    BT_CHECK_MSG(requeued == 2, "the router queued %g requests again", requeued);
    client_close(&cl);
    proc_stop(&other, SIGTERM);
    cluster_stop(&c);
    context = "512";
}

/* A prefill group killed mid-job while another serves: the request, with no token out yet,
 * starts over on the other group and finishes. It failed UNAVAILABLE. */
static __attribute__((unused)) void test_prefill_killed_retried(void)
{
    cluster_t c;
    context = "4096";
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "120"));
    static int32_t prompt[4000];
    gen_t a;
    start_long_prefill(&cl, &c, &a, prompt);
    proc_t other;
    BT_CHECK(another_group(&other, &c, "baton-prefill", "30", NULL) == 0);
    BT_CHECK(groups(&cl, 1, 2));
    BT_CHECK_MSG(!a.done, "the long prefill still runs (the test shows nothing else)");
    proc_stop(&c.prefill, SIGKILL);
    BT_CHECK(run_until(&cl, gen_done, &a, 60000));
    const double requeued = requeued_so_far(&c);
    fprintf(stderr,
            "  its prefill group killed mid-job, another serving: %s, %d tokens (%g retries)\n",
            bt_rpc_code_name(a.code), a.n, requeued);
    BT_CHECK_MSG(a.code == BT_RPC_OK && a.n == 8, "%s %s", bt_rpc_code_name(a.code), a.message);
    BT_CHECK_MSG(requeued >= 1, "the router queued %g requests again", requeued);
    client_close(&cl);
    proc_stop(&other, SIGTERM);
    cluster_stop(&c);
    context = "512";
}

/* The requests the router sends to a prefill group that just died (until it misses three
 * heartbeats) each sent a decode slot's address to the dead group, and each slot then waited
 * out the watchdog for late writes: after the first failure the decode group asks the group
 * (Hello) before sending another slot there, and the dead group fails that harmlessly. */
static __attribute__((unused)) void test_dead_prefill_holds_one_slot(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    gen_start(&cl, &g, prompt, 3, 2, true, 30000); /* the groups have met (Hello) */
    BT_CHECK(run_until(&cl, gen_done, &g, 30000) && g.code == BT_RPC_OK);
    proc_stop(&c.prefill, SIGKILL);
    for (int i = 0; i < 3; i++) {
        gen_start(&cl, &g, prompt, 3, 2, true, 30000);
        BT_CHECK(run_until(&cl, gen_done, &g, 30000));
        BT_CHECK_MSG(g.code != BT_RPC_OK, "request %d: %s", i, bt_rpc_code_name(g.code));
    }
    /* each attempt that reached the dead group went back to the router's queue but the last */
    const int sent_there = (int)requeued_so_far(&c);
    const int64_t used = wait_slots_used(&cl, c.decode.addr, -1, NULL, 300, NULL);
    fprintf(stderr, "  3 requests sent to a dead prefill group (%d reached it): %lld slots held\n",
            sent_there, (long long)used);
    BT_CHECK_MSG(sent_there >= 2, "only %d requests reached the dead group: the test shows nothing",
                 sent_there);
    BT_CHECK_MSG(used <= 1, "the decode group holds %lld slots for a dead prefill group",
                 (long long)used);
    client_close(&cl);
    group_stop(&c, false, SIGKILL);
    cluster_stop(&c);
}

/* A decode group stopped (SIGTERM, as in a rolling restart) with --drain-timeout 0.1 and a
 * request still in prefill there past it: the request starts again on the other decode group
 * and finishes. It failed UNAVAILABLE, though it had produced nothing yet and another group
 * had room. */
static __attribute__((unused)) void test_decode_stop_moves_requests(void)
{
    cluster_t c;
    context = "4096";
    static const char *const dex[] = {"--drain-timeout", "0.1", NULL};
    decode_extra = dex;
    /* chunks of one token: a 3000-token prefill lasts past the stop and the drain */
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "30"));
    decode_extra = NULL;
    proc_t second;
    BT_CHECK(another_group(&second, &c, "baton-decode", "30", dex) == 0);
    BT_CHECK(groups(&cl, 2, 1));
    static int32_t prompt[3000];
    for (int i = 0; i < 3000; i++)
        prompt[i] = (i * 11 + 7) % 1000;
    gen_t g;
    gen_start(&cl, &g, prompt, 3000, 4, true, 120000);
    /* which group holds it */
    proc_t *holder = NULL, *other = NULL;
    for (int64_t until = ms_now() + 10000; !holder && ms_now() < until && !g.done; usleep(10000)) {
        int r;
        if (wait_slots_used(&cl, c.decode.addr, 1, &g, 1, &r) == 1)
            holder = &c.decode, other = &second;
        else if (wait_slots_used(&cl, second.addr, 1, &g, 1, &r) == 1)
            holder = &second, other = &c.decode;
    }
    BT_CHECK_MSG(holder && !g.done, "the request is in prefill on one of the groups");
    if (holder) {
        usleep(300000);
        proc_stop(holder, SIGTERM);
        BT_CHECK(run_until(&cl, gen_done, &g, 90000));
        fprintf(stderr,
                "  its decode group stopped mid-prefill: the request ended %s with %d tokens\n",
                bt_rpc_code_name(g.code), g.n);
        BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 4, "%s %s", bt_rpc_code_name(g.code), g.message);
        const double requeued = requeued_so_far(&c);
        BT_CHECK_MSG(requeued >= 1, "the router queued %g requests again", requeued);
        int r = 0;
        BT_CHECK(wait_slots_used(&cl, other->addr, 0, NULL, 5000, &r) == 0);
    }
    client_close(&cl);
    proc_stop(&second, SIGTERM);
    cluster_stop(&c);
    context = "512";
}

/* A decode group stopped (SIGTERM) with a request in prefill there: it tells the router it is
 * leaving, finishes the request, and exits by itself; the router sends it nothing new
 * meanwhile, though the other group is full. Before, the request was handed back to start
 * over elsewhere (or, earlier, failed), and for its last ~3 s, until it missed three
 * heartbeats, the group drew requests it could only refuse. */
static __attribute__((unused)) void test_decode_stop_drains(void)
{
    cluster_t c;
    context = "4096";
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "30"));
    static int32_t prompt[1500];
    for (int i = 0; i < 1500; i++)
        prompt[i] = (i * 11 + 7) % 1000;
    gen_t a, b, d;
    gen_start(&cl, &a, prompt, 1500, 4, true, 120000);
    BT_CHECK(wait_slots_used(&cl, c.decode.addr, 1, &a, 10000, NULL) == 1);
    /* the other group takes one request, which waits for the one prefill group behind a */
    proc_t full;
    static const char *const one_place[] = {"--max-running-requests", "1", NULL};
    BT_CHECK(another_group(&full, &c, "baton-decode", "30", one_place) == 0);
    BT_CHECK(groups(&cl, 2, 1));
    gen_start(&cl, &b, prompt + 1, 3, 4, true, 120000);
    BT_CHECK(wait_slots_used(&cl, full.addr, 1, &b, 10000, NULL) == 1);
    const int64_t t_stop = ms_now();
    kill(c.decode.pid, SIGTERM);
    BT_CHECK(leaving(&cl, 1));
    BT_CHECK(metric_value(c.router.metrics, "baton_router_workers_leaving") == 1);
    gen_start(&cl, &d, prompt + 2, 3, 4, true, 120000); /* no place but on the leaving group */
    BT_CHECK(run_until(&cl, all_done, &cl, 90000));
    const bool exited = proc_exited(&c.decode, 10000);
    const double requeued = requeued_so_far(&c);
    fprintf(stderr,
            "  decode group stopped with a request in prefill: it ended %s with %d tokens after "
            "%lld ms; the group %s; the next requests %s %s; %g queued again\n",
            bt_rpc_code_name(a.code), a.n, (long long)(a.t_done - t_stop),
            exited ? "left" : "is still there", bt_rpc_code_name(b.code), bt_rpc_code_name(d.code),
            requeued);
    BT_CHECK_MSG(a.code == BT_RPC_OK && a.n == 4, "%s %s", bt_rpc_code_name(a.code), a.message);
    BT_CHECK_MSG(b.code == BT_RPC_OK && d.code == BT_RPC_OK, "%s %s / %s %s",
                 bt_rpc_code_name(b.code), b.message, bt_rpc_code_name(d.code), d.message);
    BT_CHECK(exited);
    BT_CHECK_MSG(requeued == 0, "the router queued %g requests again", requeued);
    client_close(&cl);
    proc_stop(&full, SIGTERM);
    cluster_stop(&c);
    context = "512";
}

/* The router's Health now; false when it did not answer. */
static bool health_now(client_t *cl, Baton__V1__HealthResponse *out)
{
    Baton__V1__HealthRequest rq = BATON__V1__HEALTH_REQUEST__INIT;
    unary_t u;
    call_unary(cl, cl->ch, "/baton.v1.Baton/Health", &rq.base, 2000, &u);
    Baton__V1__HealthResponse *h =
        u.code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__health_response, u.resp, u.len) : NULL;
    free(u.resp);
    if (!h) return false;
    *out = *h;
    out->base.descriptor = NULL; /* a copy of the scalars only */
    BT_PROTO_FREE(baton__v1__health_response, h);
    return true;
}

/* A stopped router finishes what it runs and what is queued, refuses what comes meanwhile
 * (Health no longer serving), then exits by itself. It failed every request at once
 * ("router shutting down"): a rolling restart of the router failed every stream. */
static __attribute__((unused)) void test_router_stop_drains(void)
{
    /* (heartbeats 2 s apart: the decode group, held still below, is not removed meanwhile) */
    static const char *const one[] = {"--max-running-requests", "1", "--heartbeat-ms", "2000",
                                      NULL};
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up_routing(&c, &cl, one));
    static const int32_t prompt[] = {5, 17, 93, 4, 250, 61, 8, 12};
    gen_t a, b, d;
    gen_start(&cl, &a, prompt, 8, 400, true, 120000);
    gen_start(&cl, &b, prompt + 1, 7, 20, true, 120000); /* queued behind a */
    BT_CHECK(run_until(&cl, got_tokens, &a, 30000));
    /* the decode group held still while the router is asked, so that its requests are surely
     * still running (it decodes 400 tokens in well under a second) */
    kill(c.decode.pid, SIGSTOP);
    const int64_t t_stop = ms_now();
    kill(c.router.pid, SIGTERM);
    usleep(100000);
    Baton__V1__HealthResponse h;
    const bool answered = health_now(&cl, &h);
    gen_start(&cl, &d, prompt + 2, 6, 4, true, 10000); /* after the stop: refused */
    BT_CHECK(run_until(&cl, gen_done, &d, 10000));
    kill(c.decode.pid, SIGCONT);
    BT_CHECK(run_until(&cl, all_done, &cl, 90000));
    const bool exited = proc_exited(&c.router, 10000);
    fprintf(stderr,
            "  router stopped with a request decoding and one queued: they ended %s (%d tokens, "
            "%lld ms after the stop) and %s (%d tokens); one sent after: %s (%s); Health %s "
            "serving=%d stopping=%d; the router %s\n",
            bt_rpc_code_name(a.code), a.n, (long long)(a.t_done - t_stop), bt_rpc_code_name(b.code),
            b.n, bt_rpc_code_name(d.code), d.message, answered ? "answered" : "did not answer",
            answered && h.serving, answered && h.stopping, exited ? "exited" : "is still there");
    BT_CHECK_MSG(a.code == BT_RPC_OK && a.n == 400, "%s %s", bt_rpc_code_name(a.code), a.message);
    BT_CHECK_MSG(b.code == BT_RPC_OK && b.n == 20, "%s %s", bt_rpc_code_name(b.code), b.message);
    BT_CHECK(d.code == BT_RPC_UNAVAILABLE && strstr(d.message, "stopping"));
    BT_CHECK(answered && h.stopping && !h.serving);
    BT_CHECK(exited);
    client_close(&cl);
    cluster_stop(&c);
}

/* A stopped router whose requests do not end within --drain-timeout fails them and exits. */
static __attribute__((unused)) void test_router_drain_timeout(void)
{
    /* (heartbeats 2 s apart: the stalled group is not removed, failing the request, first) */
    static const char *const short_drain[] = {"--drain-timeout", "0.5", "--heartbeat-ms", "2000",
                                              NULL};
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up_routing(&c, &cl, short_drain));
    static const int32_t prompt[] = {5, 17, 93, 4, 250, 61, 8, 12};
    gen_t a;
    gen_start(&cl, &a, prompt, 8, 400, true, 60000);
    BT_CHECK(run_until(&cl, got_tokens, &a, 30000));
    kill(c.decode.pid, SIGSTOP); /* the request makes no more progress */
    const int64_t t_stop = ms_now();
    kill(c.router.pid, SIGTERM);
    BT_CHECK(run_until(&cl, all_done, &cl, 20000));
    const bool exited = proc_exited(&c.router, 10000);
    const int64_t t_exit = ms_now();
    kill(c.decode.pid, SIGCONT);
    fprintf(stderr,
            "  router stopped with a request whose decode group stalled: it ended %s after %lld ms "
            "(%s); the router exited %lld ms after the stop\n",
            bt_rpc_code_name(a.code), (long long)(a.t_done - t_stop), a.message,
            (long long)(t_exit - t_stop));
    BT_CHECK_MSG(a.code == BT_RPC_UNAVAILABLE && strstr(a.message, "drain-timeout"), "%s %s",
                 bt_rpc_code_name(a.code), a.message);
    BT_CHECK(a.t_done - t_stop >= 400 && a.t_done - t_stop < 5000);
    BT_CHECK(exited);
    client_close(&cl);
    cluster_stop(&c);
}

/* Registers a stand-in decode worker at `address` with the router cl talks to; its id. */
static bool register_stand_in(client_t *cl, const char *address, char *id, size_t idlen)
{
    Baton__V1__WorkerInfo info = BATON__V1__WORKER_INFO__INIT;
    info.role = BATON__V1__WORKER_ROLE__ROLE_DECODE;
    info.address = (char *)address;
    info.model = "m";
    Baton__V1__RegisterRequest rq = BATON__V1__REGISTER_REQUEST__INIT;
    rq.info = &info;
    unary_t u;
    call_unary(cl, cl->ch, "/baton.v1.Registry/RegisterWorker", &rq.base, 5000, &u);
    Baton__V1__RegisterResponse *r =
        u.code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__register_response, u.resp, u.len) : NULL;
    free(u.resp);
    if (r) snprintf(id, idlen, "%s", r->worker_id);
    if (r) BT_PROTO_FREE(baton__v1__register_response, r);
    return r != NULL;
}

/* A router alone on model (watchdog 30 s, UCX tcp): the test starts the groups it wants. */
static bool router_start(cluster_t *c, const char *model)
{
    memset(c, 0, sizeof *c);
    c->model = model;
    c->tls = "tcp";
    c->watchdog = "30";
    if (proc_start(&c->router, "baton-router", "--port", "0", "--model-path", model,
                   "--served-model-name", "m", "--heartbeat-ms", "200", NULL) != 0)
        return false;
    snprintf(c->router_addr, sizeof c->router_addr, "%s", c->router.addr);
    return true;
}

/* A worker keeps its id through heartbeats the router does not answer (8a74fb9), so a router
 * that restarts must not give that id to another worker: its ids ran from 1 again, and the
 * first worker to register after the restart took an id another one was still sending, whose
 * heartbeats then kept that entry alive (a dead group never removed) while it was never
 * registered again itself. */
static __attribute__((unused)) void test_router_restart_ids(void)
{
    char port[16], addr[64];
    snprintf(port, sizeof port, "%d", free_port());
    snprintf(addr, sizeof addr, "127.0.0.1:%s", port);
    proc_t router;
    char id_a[64] = "", id_b[64] = "";
    BT_CHECK(proc_start(&router, "baton-router", "--port", port, "--model-path", golden_exact,
                        "--served-model-name", "m", NULL) == 0);
    client_t cl;
    client_open(&cl, addr);
    BT_CHECK(register_stand_in(&cl, "127.0.0.1:1", id_a, sizeof id_a));
    client_close(&cl);
    proc_stop(&router, SIGKILL);
    BT_CHECK(proc_start(&router, "baton-router", "--port", port, "--model-path", golden_exact,
                        "--served-model-name", "m", NULL) == 0);
    client_open(&cl, addr);
    BT_CHECK(register_stand_in(&cl, "127.0.0.1:2", id_b, sizeof id_b));
    /* the first worker's heartbeat, with the id the first router gave it */
    Baton__V1__HeartbeatRequest hb = BATON__V1__HEARTBEAT_REQUEST__INIT;
    hb.worker_id = id_a;
    unary_t u;
    call_unary(&cl, cl.ch, "/baton.v1.Registry/Heartbeat", &hb.base, 5000, &u);
    Baton__V1__HeartbeatResponse *r =
        u.code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__heartbeat_response, u.resp, u.len) : NULL;
    free(u.resp);
    fprintf(stderr, "  ids across a router restart: %s, then %s\n", id_a, id_b);
    BT_CHECK_MSG(id_a[0] && id_b[0] && strcmp(id_a, id_b) != 0,
                 "the restarted router gave out %s again", id_b);
    BT_CHECK_MSG(r && !r->known, "the restarted router took %s for a worker it knows", id_a);
    if (r) BT_PROTO_FREE(baton__v1__heartbeat_response, r);
    client_close(&cl);
    proc_stop(&router, SIGTERM);
}

static void test_incompatible_groups(void)
{
    cluster_t c;
    BT_CHECK(router_start(&c, golden_exact));
    /* another context length means another KV layout */
    BT_CHECK(group_start(&c, false, "256", "4096") == 0);
    BT_CHECK(group_start(&c, true, "512", "4096") == 0);
    client_t cl;
    client_open(&cl, c.router.addr);
    BT_CHECK(serving(&cl));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    gen_start(&cl, &g, prompt, 3, 4, true, 20000);
    BT_CHECK(run_until(&cl, gen_done, &g, 20000));
    BT_CHECK_MSG(g.code == BT_RPC_FAILED_PRECONDITION && strstr(g.message, "incompatible"), "%s: %s",
                 bt_rpc_code_name(g.code), g.message);
    /* the refused request's slot is free again at once: no Prefill call took its address (it
     * was held for the watchdog, 30 s here, so refusals filled the pool) */
    const int64_t used = wait_slots_used(&cl, c.decode.addr, 0, NULL, 3000, NULL);
    BT_CHECK_MSG(used == 0, "the decode group still holds %lld slots", (long long)used);
    client_close(&cl);
    cluster_stop(&c);
}

/* A request for one token finishes with the prefill's first token, inside the decode's
 * handoff callback; the decode group must not touch the finished sequence afterwards (it did:
 * a use after free that crashed decode on the next request). Eight one-token requests one at
 * a time and eight at once, then a longer one on the same group. */
/* logit_bias and the presence and frequency penalties through router -> decode (the decode group counts the
 * generated tokens, the first from prefill included): the same ids as `baton generate` with
 * the same penalties, and other ids than without them. Negative ones, which favour tokens
 * already generated: this model's greedy continuations repeat none, so positive ones would
 * change nothing here. */
static void test_penalties(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    int changed = 0;
    for (int p = 0; p < 3; p++) {
        int32_t prompt[6] = {5 + 7 * p, 17, 99 + p, 3, 42, 8};
        enum { G = 24 };
        Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
        sp.presence_penalty = -2.0f;
        sp.frequency_penalty = -1.0f;
        gen_t g;
        gen_start_sampling(&cl, &g, prompt, 6, G, true, 30000, sp);
        BT_CHECK(run_until(&cl, gen_done, &g, 30000));
        BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == G, "penalized prompt %d: %s %s, %d tokens", p,
                     bt_rpc_code_name(g.code), g.message, g.n);
        int32_t ref[G], plain[G];
        BT_CHECK_EQ_INT(one_process_with(golden_exact, prompt, 6, G, "--presence-penalty -2 --frequency-penalty -1", ref),
                        G);
        BT_CHECK_EQ_INT(one_process(golden_exact, prompt, 6, G, plain), G);
        BT_CHECK_MSG(g.n == G && !memcmp(ref, g.ids, sizeof ref), "penalized prompt %d: cluster differs from baton generate", p);
        changed += memcmp(plain, ref, sizeof ref) != 0;
    }
    BT_CHECK_MSG(changed > 0, "the penalties changed none of 3 greedy continuations");
    /* logit_bias, through the prefill group's first draw and the decode group's: +100 on a
     * token makes greedy pick it every time; -100 on the unbiased first token moves it */
    {
        int32_t prompt[6] = {5, 17, 99, 3, 42, 8};
        int32_t plain[8];
        BT_CHECK_EQ_INT(one_process(golden_exact, prompt, 6, 8, plain), 8);
        int32_t up_id = 321, down_id = plain[0];
        float up = 100.0f, down = -100.0f;
        Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
        sp.n_logit_bias_ids = sp.n_logit_bias = 1;
        sp.logit_bias_ids = &up_id;
        sp.logit_bias = &up;
        gen_t g;
        gen_start_sampling(&cl, &g, prompt, 6, 8, true, 30000, sp);
        BT_CHECK(run_until(&cl, gen_done, &g, 30000));
        BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 8, "logit_bias +100: %s %s", bt_rpc_code_name(g.code), g.message);
        for (int i = 0; i < g.n; i++) BT_CHECK_MSG(g.ids[i] == up_id, "logit_bias +100: token %d is %d", i, g.ids[i]);
        sp.logit_bias_ids = &down_id;
        sp.logit_bias = &down;
        gen_start_sampling(&cl, &g, prompt, 6, 8, true, 30000, sp);
        BT_CHECK(run_until(&cl, gen_done, &g, 30000));
        BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 8, "logit_bias -100: %s %s", bt_rpc_code_name(g.code), g.message);
        for (int i = 0; i < g.n; i++) BT_CHECK_MSG(g.ids[i] != down_id, "logit_bias -100: token %d is %d", i, g.ids[i]);
        /* a token outside the vocabulary: refused by the decode group */
        int32_t far = 1 << 20;
        sp.logit_bias_ids = &far;
        gen_start_sampling(&cl, &g, prompt, 6, 8, true, 30000, sp);
        BT_CHECK(run_until(&cl, gen_done, &g, 30000));
        BT_CHECK_MSG(g.code == BT_RPC_INVALID_ARGUMENT && strstr(g.message, "logit_bias"), "%s %s",
                     bt_rpc_code_name(g.code), g.message);
    }
    /* out of range: refused by the router, naming the field */
    int32_t prompt[2] = {5, 6};
    Baton__V1__SamplingParams bad = BATON__V1__SAMPLING_PARAMS__INIT;
    bad.frequency_penalty = 3.0f;
    gen_t g;
    gen_start_sampling(&cl, &g, prompt, 2, 4, true, 10000, bad);
    BT_CHECK(run_until(&cl, gen_done, &g, 10000));
    BT_CHECK_MSG(g.code == BT_RPC_INVALID_ARGUMENT && strstr(g.message, "frequency_penalty"), "%s %s",
                 bt_rpc_code_name(g.code), g.message);
    client_close(&cl);
    cluster_stop(&c);
}

static void test_one_token_requests(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    int32_t prompt[4] = {5, 17, 99, 3};
    static gen_t g[8];
    for (int i = 0; i < 8; i++) {
        prompt[0] = 5 + i;
        gen_start(&cl, &g[i], prompt, 4, 1, true, 20000);
        BT_CHECK(run_until(&cl, gen_done, &g[i], 20000));
        BT_CHECK_MSG(g[i].code == BT_RPC_OK && g[i].n == 1, "one-token request %d: %s %s, %d tokens", i,
                     bt_rpc_code_name(g[i].code), g[i].message, g[i].n);
    }
    for (int i = 0; i < 8; i++) gen_start(&cl, &g[i], prompt, 4, 1, true, 20000);
    BT_CHECK(run_until(&cl, all_done, &cl, 20000));
    for (int i = 0; i < 8; i++)
        BT_CHECK_MSG(g[i].code == BT_RPC_OK && g[i].n == 1, "concurrent one-token request %d: %s %s", i,
                     bt_rpc_code_name(g[i].code), g[i].message);
    gen_start(&cl, &g[0], prompt, 4, 6, true, 20000);
    BT_CHECK(run_until(&cl, gen_done, &g[0], 20000));
    BT_CHECK_MSG(g[0].code == BT_RPC_OK && g[0].n == 6, "after one-token requests: %s %s, %d tokens",
                 bt_rpc_code_name(g[0].code), g[0].message, g[0].n);
    client_close(&cl);
    cluster_stop(&c);
}

/* The prefill group's prefix cache: a prompt sent again starts from its last multiple of 64
 * tokens; one that shares a prefix with an earlier prompt (a longer one: the next turn of a
 * conversation; one that branches off) from the deepest cached chunk it shares; the output is
 * always `baton generate`'s, and usage reports the tokens found. With --disable-radix-cache
 * nothing is found. Chunks of 48 (cut at 128 for the 150-token prompt: the last is no one's
 * prefix and not kept) so that a branch can find a chunk boundary short of the last. */
static void check_prefix_cache(bool on)
{
    static const char *const off[] = {"--disable-radix-cache", NULL};
    prefill_extra = on ? NULL : off;
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "48", "256", "30"));
    prefill_extra = NULL;
    int32_t a[150], longer[210], branch[180];
    for (int i = 0; i < 150; i++)
        a[i] = (int32_t)(3 + (i * 37 + i / 7) % 1000);
    memcpy(longer, a, sizeof a);
    for (int i = 150; i < 210; i++)
        longer[i] = (int32_t)(5 + i * 11 % 997);
    memcpy(branch, a, 100 * sizeof *a); /* a's first 100: chunks [0,48) [48,96) are shared */
    for (int i = 100; i < 180; i++)
        branch[i] = (int32_t)(7 + i * 13 % 991);
    static const struct {
        const char *what;
        int which, n, want_cached;
    } steps[] = {
        {"a, first", 0, 150, 0},        {"a again", 0, 150, 128},
        {"a and 60 more", 1, 210, 128}, {"a's first 100, then others", 2, 180, 96},
        {"that again", 2, 180, 176},
    };
    const int32_t *prompts[3] = {a, longer, branch};
    int found = 0;
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        const int32_t *ids = prompts[steps[k].which];
        const int n = steps[k].n;
        gen_t g;
        gen_start(&cl, &g, ids, n, 6, true, 60000);
        BT_CHECK(run_until(&cl, gen_done, &g, 70000));
        BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 6, "%s: %s %s, %d tokens", steps[k].what,
                     bt_rpc_code_name(g.code), g.message, g.n);
        const int want = on ? steps[k].want_cached : 0;
        BT_CHECK_MSG(g.cached == want, "%s: %d cached tokens, want %d (cache %s)", steps[k].what,
                     g.cached, want, on ? "on" : "off");
        found += g.cached;
        int32_t ref[8];
        const int r = one_process(golden_exact, ids, n, 6, ref);
        BT_CHECK_MSG(r == 6 && !memcmp(ref, g.ids, sizeof ref[0] * 6),
                     "%s: the cluster's tokens differ from baton generate's (cache %s)",
                     steps[k].what, on ? "on" : "off");
    }
    if (on) {
        const double m = wait_metric(c.prefill.metrics,
                                     "baton_prefill_prefix_cache_hit_tokens_total", found, 3000);
        BT_CHECK_MSG(m == found, "prefill's prefix_cache_hit_tokens_total %.0f, want %d", m, found);
    }
    fprintf(
        stderr,
        "  prefix cache %s: %d prompt tokens found in 5 requests, outputs as baton generate's\n",
        on ? "on" : "off", found);
    client_close(&cl);
    cluster_stop(&c);
}

static void test_prefix_cache(void)
{
    check_prefix_cache(true);
    check_prefix_cache(false);
}

/* DSpark speculative decoding through the cluster (groups of CLUSTER_TP ranks): prefill and
 * decode groups started with
 * --speculative-algorithm DSPARK on the demo checkpoint (it has draft stages) give `baton
 * generate`'s greedy tokens, with and without --speculative-algorithm, for four requests at
 * once of different lengths, and the decode group's steps verified proposals
 * (spec_proposed_total); a request with penalties gets `baton generate`'s tokens with the
 * same penalties; a sampled request and one asking for log-probabilities finish with their
 * lengths; a drafting decode group refuses a prefill group without the stages, naming DSpark. */
static void test_dspark(void)
{
    char dir[256], cmd[600];
    snprintf(dir, sizeof dir, "/tmp/bt-dspark-cluster-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s/baton make-demo-model --output %s 2>/dev/null", BT_BIN_DIR, dir);
    BT_CHECK(system(cmd) == 0);
    static const char *const spec[] = {"--speculative-algorithm", "DSPARK", NULL};
    prefill_extra = decode_extra = spec;
    cluster_t c;
    BT_CHECK(cluster_start(&c, dir, "tcp", "16", "256", "30") == 0);
    prefill_extra = decode_extra = NULL;
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    enum { N = 4, G = 40 };
    int32_t prompts[N][24];
    gen_t g[N];
    for (int q = 0; q < N; q++) {
        for (int i = 0; i < 24; i++)
            prompts[q][i] = (int32_t)(3 + (i * 29 + q * 53) % 250);
        gen_start(&cl, &g[q], prompts[q], 24 - 4 * q, G - 6 * q, true, 60000);
    }
    BT_CHECK(run_until(&cl, all_done, &cl, 70000));
    for (int q = 0; q < N; q++) {
        BT_CHECK_MSG(g[q].code == BT_RPC_OK && g[q].n == G - 6 * q,
                     "DSpark request %d: %s %s, %d tokens", q, bt_rpc_code_name(g[q].code),
                     g[q].message, g[q].n);
        int32_t plain[G], drafted[G];
        BT_CHECK_EQ_INT(one_process(dir, prompts[q], 24 - 4 * q, G - 6 * q, plain), G - 6 * q);
        BT_CHECK_EQ_INT(one_process_with(dir, prompts[q], 24 - 4 * q, G - 6 * q,
                                         "--speculative-algorithm DSPARK", drafted),
                        G - 6 * q);
        BT_CHECK_MSG(!memcmp(plain, g[q].ids, (size_t)(G - 6 * q) * sizeof(int32_t)),
                     "DSpark request %d: the cluster's greedy tokens differ from baton generate's",
                     q);
        BT_CHECK_MSG(
            !memcmp(plain, drafted, (size_t)(G - 6 * q) * sizeof(int32_t)),
            "DSpark request %d: baton generate's greedy tokens differ with --speculative-algorithm",
            q);
    }
    /* penalties apply to every verified row as plain decoding applies them */
    {
        Baton__V1__SamplingParams pen = BATON__V1__SAMPLING_PARAMS__INIT;
        pen.presence_penalty = -2.0f;
        pen.frequency_penalty = -1.0f;
        gen_start_sampling(&cl, &g[0], prompts[2], 16, 30, true, 30000, pen);
        BT_CHECK(run_until(&cl, all_done, &cl, 40000));
        int32_t plain[30];
        BT_CHECK_EQ_INT(one_process_with(dir, prompts[2], 16, 30,
                                         "--presence-penalty -2 --frequency-penalty -1", plain),
                        30);
        BT_CHECK_MSG(g[0].code == BT_RPC_OK && g[0].n == 30 &&
                         !memcmp(plain, g[0].ids, sizeof plain),
                     "DSpark request with penalties: %s %s, %d tokens, or other tokens than baton "
                     "generate's",
                     bt_rpc_code_name(g[0].code), g[0].message, g[0].n);
    }
    double proposed = metric_value(c.decode.metrics, "baton_decode_spec_proposed_total");
    BT_CHECK_MSG(proposed > 0, "the decode group verified no proposals (spec_proposed_total %.0f)",
                 proposed);
    Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
    sp.temperature = 0.8f;
    sp.has_seed = true;
    sp.seed = 7;
    gen_start_sampling(&cl, &g[0], prompts[0], 24, 16, true, 30000, sp);
    Baton__V1__SamplingParams lp = BATON__V1__SAMPLING_PARAMS__INIT;
    lp.logprobs = true;
    gen_start_sampling(&cl, &g[1], prompts[1], 20, 12, true, 30000, lp);
    BT_CHECK(run_until(&cl, all_done, &cl, 40000));
    BT_CHECK_MSG(g[0].code == BT_RPC_OK && g[0].n == 16, "sampled DSpark request: %s %s, %d tokens",
                 bt_rpc_code_name(g[0].code), g[0].message, g[0].n);
    BT_CHECK_MSG(g[1].code == BT_RPC_OK && g[1].n == 12,
                 "DSpark request with logprobs: %s %s, %d tokens", bt_rpc_code_name(g[1].code),
                 g[1].message, g[1].n);
    fprintf(stderr, "  DSpark: %d greedy requests as baton generate's, %.0f proposals verified\n",
            N, proposed);
    client_close(&cl);
    cluster_stop(&c);

    /* a decode group drafting and a prefill group without the stages refuse each other's
     * slots, saying why */
    BT_CHECK(router_start(&c, dir));
    decode_extra = spec;
    BT_CHECK(group_start(&c, false, context, "16") == 0);
    BT_CHECK(group_start(&c, true, context, "16") == 0);
    decode_extra = NULL;
    client_open(&cl, c.router.addr);
    BT_CHECK(serving(&cl));
    gen_start(&cl, &g[0], prompts[0], 8, 4, true, 20000);
    BT_CHECK(run_until(&cl, gen_done, &g[0], 20000));
    BT_CHECK_MSG(g[0].code == BT_RPC_FAILED_PRECONDITION && strstr(g[0].message, "DSpark"),
                 "%s: %s", bt_rpc_code_name(g[0].code), g[0].message);
    client_close(&cl);
    cluster_stop(&c);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    BT_CHECK(system(cmd) == 0);
}

#if CLUSTER_TP == 1
/* Two prefill groups: after a 401-token prompt, four sent at once that start with its first 400
 * go to the group that prefilled it (each finds its first 384 tokens cached there), where the
 * least busy group (fewest requests in prefill) would have split them; the router counts them
 * in prefix_routed_total. A prompt of its own goes to the least busy group as before. */
static void test_prefix_routing(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    proc_t other;
    BT_CHECK(another_group(&other, &c, "baton-prefill", "30", NULL) == 0);
    BT_CHECK(groups(&cl, 1, 2));
    static int32_t a[401], b[4][410];
    for (int i = 0; i < 401; i++)
        a[i] = (int32_t)(3 + (i * 53 + i / 5) % 1000);
    gen_t g[4];
    gen_start(&cl, &g[0], a, 401, 4, true, 60000);
    BT_CHECK(run_until(&cl, gen_done, &g[0], 60000) && g[0].code == BT_RPC_OK && g[0].cached == 0);
    for (int k = 0; k < 4; k++) {
        memcpy(b[k], a, 400 * sizeof *a);
        for (int i = 400; i < 410; i++)
            b[k][i] = (int32_t)(11 + 97 * k + i);
        gen_start(&cl, &g[k], b[k], 410, 4, true, 60000);
    }
    BT_CHECK(run_until(&cl, all_done, &cl, 90000));
    int hits = 0;
    for (int k = 0; k < 4; k++) {
        BT_CHECK_MSG(g[k].code == BT_RPC_OK, "prompt %d: %s %s", k, bt_rpc_code_name(g[k].code),
                     g[k].message);
        hits += g[k].cached == 384;
        int32_t ref[4];
        BT_CHECK(one_process(golden_exact, b[k], 410, 4, ref) == 4 &&
                 !memcmp(ref, g[k].ids, sizeof ref));
    }
    const double routed = metric_value(c.router.metrics, "baton_router_prefix_routed_total");
    fprintf(stderr,
            "  two prefill groups: 4 prompts sharing a 400-token prefix sent at once: %d found "
            "384 tokens cached; %.0f sent for their prefix\n",
            hits, routed);
    BT_CHECK_EQ_INT(hits, 4);
    BT_CHECK_MSG(routed >= 1, "prefix_routed_total %.0f: the least busy group took them anyway",
                 routed);
    proc_stop(&other, SIGTERM);
    client_close(&cl);
    cluster_stop(&c);
}
#endif

#if CLUSTER_TP == 1
/* A decode group that stalls (SIGSTOP) mid-transfer must not wedge the prefill group: its
 * commit watchdog drops the stalled peer, and the next request, sent to another decode group,
 * is served while the first is still stopped. */
static void test_stalled_decode(void)
{
    context = "4096";
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "3"));
    static int32_t prompt[4000];
    for (int i = 0; i < 4000; i++) prompt[i] = (i * 7 + 3) % 1000;
    gen_t g;
    gen_start(&cl, &g, prompt, 4000, 8, true, 60000);
    wait_slots_used(&cl, c.decode.addr, 1, &g, 10000, NULL);
    usleep(200000);
    kill(c.decode.pid, SIGSTOP);
    /* the router drops the silent group; a second decode group arrives */
    BT_CHECK(run_until(&cl, gen_done, &g, 10000));
    proc_t second;
    BT_CHECK(another_group(&second, &c, "baton-decode", "3", NULL) == 0);
    BT_CHECK(groups(&cl, 1, 1));
    int64_t t0 = ms_now();
    int32_t small[3] = {0, 42, 71};
    gen_start(&cl, &g, small, 3, 4, true, 30000);
    BT_CHECK(run_until(&cl, gen_done, &g, 30000));
    fprintf(stderr, "  with a decode group stopped mid-transfer, the next request took %lld ms (%s)\n",
            (long long)(g.t_done - t0), bt_rpc_code_name(g.code));
    BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 4, "%s %s", bt_rpc_code_name(g.code), g.message);
    BT_CHECK(g.t_done - t0 < 10000);
    kill(c.decode.pid, SIGCONT);
    proc_stop(&second, SIGTERM);
    client_close(&cl);
    cluster_stop(&c);
    context = "512";
}
#endif

#if CLUSTER_TP > 1
/* kill -9 of a non-leader rank mid-request: the group's requests fail within the watchdog,
 * nothing hangs, and the router stops sending to that group */
static void test_kill_follower_rank(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "5"));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    gen_start(&cl, &g, prompt, 3, 400, true, 60000);
    BT_CHECK(run_until(&cl, got_tokens, &g, 20000));
    int64_t t_kill = ms_now();
    proc_stop(&c.decode_ranks[CLUSTER_TP - 1], SIGKILL);
    BT_CHECK(run_until(&cl, gen_done, &g, 10000));
    fprintf(stderr, "  decode rank %d killed: request ended %s after %lld ms (%s)\n", CLUSTER_TP - 1,
            bt_rpc_code_name(g.code), (long long)(g.t_done - t_kill), g.message);
    BT_CHECK_MSG(g.code == BT_RPC_UNAVAILABLE, "got %s", bt_rpc_code_name(g.code));
    BT_CHECK(g.t_done - t_kill < 5000);
    BT_CHECK(groups(&cl, 0, 1));
    /* the same with a prefill follower, idle: the group notices through its heartbeat plan */
    proc_stop(&c.prefill_ranks[1], SIGKILL);
    BT_CHECK(groups(&cl, 0, 0));
    client_close(&cl);
    cluster_stop(&c);
}
#endif

#if CLUSTER_TP > 1
/* Every rank of a decode group stopped at once (SIGTERM, as `baton up`, systemd or Kubernetes
 * stop them) with a request decoding: the group drains, the request finishes, and every rank
 * exits by itself. The following ranks died at the signal, and the lead, its next collective
 * failed, failed the request. */
static void test_tp_group_drains(void)
{
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "4096", "256", "30"));
    int32_t prompt[3] = {0, 42, 71};
    gen_t g;
    gen_start(&cl, &g, prompt, 3, 200, true, 60000);
    BT_CHECK(run_until(&cl, got_tokens, &g, 20000));
    const int64_t t_stop = ms_now();
    kill(c.decode.pid, SIGTERM);
    for (int r = 1; r < CLUSTER_TP; r++)
        kill(c.decode_ranks[r].pid, SIGTERM);
    BT_CHECK(run_until(&cl, gen_done, &g, 60000));
    bool exited = proc_exited(&c.decode, 10000);
    for (int r = 1; r < CLUSTER_TP; r++)
        exited &= proc_exited(&c.decode_ranks[r], 10000);
    fprintf(stderr,
            "  every decode rank stopped at once mid-request: %s, %d tokens, %lld ms after; the "
            "ranks %s\n",
            bt_rpc_code_name(g.code), g.n, (long long)(g.t_done - t_stop),
            exited ? "left" : "are still there");
    BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 200, "%s %s, %d tokens", bt_rpc_code_name(g.code),
                 g.message, g.n);
    BT_CHECK(exited);
    client_close(&cl);
    cluster_stop(&c);
}

/* A decode group that stops answering (SIGSTOP of its lead) mid-transfer: the prefill group
 * gives up on it after its watchdog and goes on serving. Its other ranks waited for the next
 * plan only as long as that watchdog, gave up first, and took the whole prefill group down. */
static void test_stalled_decode_tp(void)
{
    context = "4096";
    cluster_t c;
    client_t cl;
    BT_CHECK(cluster_up(&c, &cl, "1", "256", "3"));
    static int32_t prompt[4000];
    for (int i = 0; i < 4000; i++)
        prompt[i] = (i * 7 + 3) % 1000;
    gen_t g;
    gen_start(&cl, &g, prompt, 4000, 8, true, 60000);
    wait_slots_used(&cl, c.decode.addr, 1, &g, 10000, NULL);
    usleep(200000);
    kill(c.decode.pid, SIGSTOP);
    BT_CHECK(run_until(&cl, gen_done, &g, 15000));
    BT_CHECK_MSG(g.code != BT_RPC_OK, "the request finished on a stopped group");
    /* well past the prefill group's watchdog (3 s) from its last plan */
    for (int64_t until = ms_now() + 6000; ms_now() < until;) {
        uv_run(&cl.loop, UV_RUN_NOWAIT);
        usleep(50000);
    }
    BT_CHECK_MSG(groups(&cl, 0, 1), "the prefill group left with the stalled decode group");
    kill(c.decode.pid, SIGCONT);
    client_close(&cl);
    cluster_stop(&c);
    context = "512";
}

/* A request that reaches an idle TP prefill leader while it is inside its heartbeat (the
 * NOOP plan it sends its other ranks once a second) must start when the heartbeat ends. It
 * did not: the heartbeat's completion never looked at the queue, so the request waited for
 * the next request to arrive (a prefill stalled until the client's deadline, seen on a GPU
 * machine). The window is microseconds wide; an LD_PRELOAD shim (slow_heartbeat.c) makes
 * the prefill group's heartbeats take 2 s and says when one starts. */
static void test_request_during_heartbeat(void)
{
    char mark[128];
    snprintf(mark, sizeof mark, "/tmp/bt-it-heartbeat-%d", (int)getpid());
    cluster_t c;
    memset(&c, 0, sizeof c);
    c.model = golden_exact;
    c.tls = "tcp";
    c.chunk = "4096";
    c.watchdog = "30";
    BT_CHECK(proc_start(&c.router, "baton-router", "--port", "0", "--model-path", golden_exact, "--served-model-name",
                        "m", "--heartbeat-ms", "200", "--watchdog-timeout", c.watchdog, NULL) == 0);
    snprintf(c.router_addr, sizeof c.router_addr, "%s", c.router.addr);
    setenv("LD_PRELOAD", BT_SLOW_HEARTBEAT_LIB, 1);
    setenv("BT_TEST_HEARTBEAT_DELAY_MS", "2000", 1);
    setenv("BT_TEST_HEARTBEAT_MARK", mark, 1);
    BT_CHECK(group_start(&c, false, context, c.chunk) == 0);
    unsetenv("LD_PRELOAD");
    unsetenv("BT_TEST_HEARTBEAT_DELAY_MS");
    unsetenv("BT_TEST_HEARTBEAT_MARK");
    BT_CHECK(group_start(&c, true, context, c.chunk) == 0);
    client_t cl;
    client_open(&cl, c.router_addr);
    BT_CHECK(serving(&cl));
    int32_t prompt[4] = {3, 1, 4, 1};
    for (int round = 0; round < 2; round++) {
        unlink(mark);
        int64_t until = ms_now() + 10000;
        while (access(mark, F_OK) != 0 && ms_now() < until) usleep(1000);
        BT_CHECK_MSG(access(mark, F_OK) == 0, "no heartbeat of the prefill leader in 10 s");
        /* the leader is now inside a 2 s heartbeat */
        gen_t g;
        int64_t t0 = ms_now();
        prompt[3] = 1 + round;
        gen_start(&cl, &g, prompt, 4, 4, true, 10000);
        BT_CHECK(run_until(&cl, gen_done, &g, 15000));
        fprintf(stderr, "  request sent during a prefill heartbeat: %s after %lld ms\n", bt_rpc_code_name(g.code),
                (long long)(g.t_done - t0));
        BT_CHECK_MSG(g.code == BT_RPC_OK && g.n == 4, "round %d: %s %s, %d tokens", round, bt_rpc_code_name(g.code),
                     g.message, g.n);
        BT_CHECK_MSG(g.t_done - t0 < 6000, "round %d took %lld ms", round, (long long)(g.t_done - t0));
    }
    unlink(mark);
    client_close(&cl);
    cluster_stop(&c);
}
#endif

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(golden_exact, sizeof golden_exact, "%s/golden-a-exact", BT_GOLDEN_DIR);
    snprintf(golden_a, sizeof golden_a, "%s/golden-a", BT_GOLDEN_DIR);
    BT_RUN(test_greedy_matches_golden);
    BT_RUN(test_one_token_requests);
    BT_RUN(test_prefix_cache);
    BT_RUN(test_dspark);
#if CLUSTER_TP == 1
    BT_RUN(test_prefix_routing);
#endif
    BT_RUN(test_penalties);
    BT_RUN(test_admission);
    BT_RUN(test_kill_decode);
    BT_RUN(test_kill_prefill_and_cancel);
    BT_RUN(test_cancel_during_prefill);
    BT_RUN(test_cancel_storm);
    BT_RUN(test_forget_refuses_late_call);
    BT_RUN(test_pool_smaller_than_batch);
#if CLUSTER_TP == 1 /* (router logic: once is enough, and TP4 groups decode 4000 tokens slowly) */
    BT_RUN(test_prefill_gone_while_decoding);
    BT_RUN(test_place_freed_mid_step);
    BT_RUN(test_held_slot_waits_at_router);
    BT_RUN(test_held_slot_no_running_place);
    BT_RUN(test_batch_past_engine_limit);
    BT_RUN(test_prefill_stop_frees_slots);
    BT_RUN(test_prefill_stop_drains);
    BT_RUN(test_prefill_killed_retried);
    BT_RUN(test_dead_prefill_holds_one_slot);
    BT_RUN(test_decode_stop_moves_requests);
    BT_RUN(test_decode_stop_drains);
    BT_RUN(test_router_stop_drains);
    BT_RUN(test_router_drain_timeout);
    BT_RUN(test_router_restart_ids);
#endif
    BT_RUN(test_incompatible_groups);
#if CLUSTER_TP > 1
    BT_RUN(test_kill_follower_rank);
    BT_RUN(test_tp_group_drains);
    BT_RUN(test_stalled_decode_tp);
    BT_RUN(test_request_during_heartbeat);
#else
    BT_RUN(test_stalled_decode);
#endif
    return bt_test_summary();
}

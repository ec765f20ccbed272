/* baton up: a whole local cluster in one command. Starts the router, the prefill and decode
 * groups (and the gateway when it is built) as separate processes on loopback, prints where
 * each listens, and stops them all on Ctrl-C, SIGTERM, SIGHUP or SIGQUIT (and they stop
 * themselves if it dies outright). A service that dies takes the cluster down with a message
 * saying which.
 *
 * `--config FILE` (deploy/README.md) supplies defaults that command-line flags override. What
 * this host cannot honour is reported: nnodes > 1 (then tp runs as 1 here; tp > 1 on one node
 * runs each group as tp local processes), speculative decoding, CUDA graphs and
 * cache reports warn and the cluster runs without them; node-rank > 0 refuses (baton up starts
 * whole clusters, rank 0 only). */
#include "services/cli/cli.h"

#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "services/cli/config.h"
#include "services/engine/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHILDREN 64

typedef struct {
    pid_t pid;
    char name[64];
    char listen[256];
} child_t;

static child_t children[MAX_CHILDREN];
static int n_children;
static volatile sig_atomic_t stop_requested; /* signals received */

static void on_signal(int sig)
{
    (void)sig;
    stop_requested++;
}

static void bin_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0) {
        snprintf(buf, len, ".");
        return;
    }
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts argv, waits (up to timeout_ms) for its "listening on ADDR" line on stdout; the
 * rest of its output is passed through. Returns the child index or -1. timeout_ms 0: no
 * wait (a following TP rank, which prints no address). */
static int spawn(const char *name, char **argv, int timeout_ms)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        setpgid(0, 0); /* Ctrl-C reaches only `baton up`, which stops the children in order */
        /* and if `baton up` dies without stopping them (SIGKILL, a crash), they stop too:
         * else they kept the cluster's ports, and the next `baton up` could not start */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1); /* (it died before the prctl) */
        execv(argv[0], argv);
        fprintf(stderr, "baton up: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    child_t *c = &children[n_children];
    memset(c, 0, sizeof *c);
    c->pid = pid;
    snprintf(c->name, sizeof c->name, "%s", name);
    if (timeout_ms == 0) {
        close(fds[0]);
        snprintf(c->listen, sizeof c->listen, "(tensor-parallel rank)");
        return n_children++;
    }
    char line[512];
    size_t used = 0;
    int64_t deadline = now_ms() + timeout_ms;
    bool eof = false;
    while (!c->listen[0]) {
        int left = (int)(deadline - now_ms());
        if (left <= 0 || stop_requested) break;
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int pr = poll(&pfd, 1, left < 200 ? left : 200);
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) continue;
        ssize_t n = read(fds[0], line + used, sizeof line - 1 - used);
        if (n <= 0) {
            eof = true;
            break;
        }
        used += (size_t)n;
        line[used] = 0;
        char *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = 0;
            const char *at = strstr(line, "listening on ");
            if (at) snprintf(c->listen, sizeof c->listen, "%s", at + strlen("listening on "));
            size_t rest = used - (size_t)(nl + 1 - line);
            memmove(line, nl + 1, rest);
            used = rest;
            line[used] = 0;
        }
        if (used == sizeof line - 1) used = 0;
    }
    close(fds[0]); /* later stdout lines go nowhere; services log to stderr */
    if (!c->listen[0]) {
        /* its stdout closed: it is exiting (a bad flag, a port taken, a model it cannot load);
         * say so, not that it was slow (it was told as a start timeout) */
        int status = 0;
        pid_t r = 0;
        for (int i = 0; eof && i < 100 && (r = waitpid(pid, &status, WNOHANG)) == 0; i++)
            usleep(10000);
        if (r == pid && WIFEXITED(status))
            fprintf(
                stderr,
                "baton up: %s exited with status %d before it listened (its messages are above)\n",
                name, WEXITSTATUS(status));
        else if (r == pid && WIFSIGNALED(status))
            fprintf(stderr, "baton up: %s died of signal %d before it listened\n", name,
                    WTERMSIG(status));
        else
            fprintf(stderr, "baton up: %s did not start within %d s\n", name, timeout_ms / 1000);
        if (r != pid) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        return -1;
    }
    return n_children++;
}

/* SIGTERM to every service: each finishes what it runs within its drain (drain_s), then exits;
 * SIGKILL for what is left 5 s past it, or at once on a signal more than `signals`. */
static void stop_all(double drain_s, int signals)
{
    int alive = 0;
    for (int i = n_children - 1; i >= 0; i--)
        if (children[i].pid > 0) {
            kill(children[i].pid, SIGTERM);
            alive++;
        }
    if (alive && drain_s > 0) {
        printf("baton up: stopping; what runs finishes within %g s (Ctrl-C again stops at once)\n",
               drain_s);
        fflush(stdout);
    }
    int64_t deadline = now_ms() + (int64_t)(drain_s * 1000.0) + 5000;
    for (int i = 0; i < n_children; i++) {
        while (children[i].pid > 0) {
            int status;
            pid_t r = waitpid(children[i].pid, &status, WNOHANG);
            if (r == children[i].pid || r < 0) {
                children[i].pid = 0;
                break;
            }
            if (now_ms() > deadline || stop_requested > signals) {
                kill(children[i].pid, SIGKILL);
                waitpid(children[i].pid, NULL, 0);
                children[i].pid = 0;
                break;
            }
            usleep(20000);
        }
    }
}

typedef struct {
    char *v[160];
    int n;
} args_t;

static void add(args_t *a, const char *s)
{
    BT_ASSERT(a->n < 159);
    a->v[a->n++] = bt_strdup_or_die(s);
    a->v[a->n] = NULL;
}

static void add_opt(args_t *a, const char *flag, const char *value)
{
    if (!value) return;
    add(a, flag);
    add(a, value);
}

static void add_int(args_t *a, const char *flag, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    add_opt(a, flag, buf);
}

static void free_args(args_t *a)
{
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    a->n = 0;
}

/* Extra `--key=value` flags a config section gives one service. */
static void add_section(args_t *a, const bt_conf_t *conf, const char *section)
{
    for (size_t i = 0; i < bt_conf_count(conf); i++) {
        const char *sec, *key, *value;
        bt_conf_at(conf, i, &sec, &key, &value, NULL);
        if (strcmp(sec, section)) continue;
        char buf[4300];
        snprintf(buf, sizeof buf, "--%s=%s", key, value);
        add(a, buf);
    }
}

static bool net_device_present(const char *dev)
{
    char name[256], p[300];
    snprintf(name, sizeof name, "%s", dev);
    char *colon = strchr(name, ':');
    if (colon) *colon = 0;
    snprintf(p, sizeof p, "/sys/class/infiniband/%s", name);
    if (access(p, F_OK) == 0) return true;
    snprintf(p, sizeof p, "/sys/class/net/%s", name);
    return access(p, F_OK) == 0;
}

static int up(int argc, char **argv, const bt_conf_t *conf);

/* Polls the router's Health until both kinds of group are registered (or the deadline): the
 * "cluster running" line then means requests are served, not only that processes started. */
typedef struct {
    bool done, serving;
} health_t;

static void on_health(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp, size_t len)
{
    health_t *h = ctx;
    Baton__V1__HealthResponse *r = code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__health_response, resp, len) : NULL;
    h->serving = r && r->serving;
    if (r) BT_PROTO_FREE(baton__v1__health_response, r);
    h->done = true;
}

static bool wait_serving(const char *router, int timeout_ms)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_rpc_t *rpc = NULL;
    bt_rpc_channel_t *ch = NULL;
    bool ok = false;
    if (bt_rpc_create(&loop, &rpc) != BT_OK || bt_rpc_channel_create(rpc, router, NULL, &ch) != BT_OK) goto out;
    int64_t deadline = now_ms() + timeout_ms;
    while (!ok && !stop_requested && now_ms() < deadline) {
        Baton__V1__HealthRequest rq = BATON__V1__HEALTH_REQUEST__INIT;
        uint8_t *buf;
        size_t len;
        bt_proto_pack(&rq.base, &buf, &len);
        health_t h = {false, false};
        if (bt_rpc_unary(ch, "/baton.v1.Baton/Health", buf, len, 2000, on_health, &h, NULL) == BT_OK)
            while (!h.done) uv_run(&loop, UV_RUN_ONCE);
        free(buf);
        ok = h.serving;
        if (!ok) usleep(100000);
    }
out:
    if (ch) bt_rpc_channel_destroy(ch);
    for (int i = 0; i < 10; i++) uv_run(&loop, UV_RUN_NOWAIT);
    if (rpc) bt_rpc_destroy(rpc);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
    return ok;
}

/* A free TCP port on host (bound, read, released): where a TP group's ranks meet. */
static int free_port(const char *host)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 29500;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

int bt_cli_up(int argc, char **argv)
{
    /* --config FILE: its [cluster] values go first, so command-line flags override them */
    const char *config = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) config = argv[i] + 9;
    }
    if (!config) return up(argc, argv, NULL);
    bt_conf_t *conf;
    char err[1024];
    if (bt_conf_load(config, &conf, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton up: %s\n", err);
        return 2;
    }
    size_t n = bt_conf_count(conf), m = 0;
    char **merged = bt_calloc_or_die(n + (size_t)argc + 1, sizeof *merged);
    for (size_t i = 0; i < n; i++) {
        const char *sec, *key, *value;
        bt_conf_at(conf, i, &sec, &key, &value, NULL);
        if (strcmp(sec, "cluster")) continue;
        size_t len = strlen(key) + strlen(value) + 4;
        merged[m] = bt_malloc_or_die(len);
        snprintf(merged[m++], len, "--%s=%s", key, value);
    }
    size_t from_conf = m;
    for (int i = 0; i < argc; i++) merged[m++] = argv[i];
    int rc = up((int)m, merged, conf);
    for (size_t i = 0; i < from_conf; i++) free(merged[i]);
    free(merged);
    bt_conf_destroy(conf);
    return rc;
}

static int up(int argc, char **argv, const bt_conf_t *conf)
{
    const char *model_path = NULL, *served = NULL, *host = "127.0.0.1", *log_level = "info";
    const char *ucx_tls = "tcp", *reasoning = NULL, *tool = NULL, *api_key = NULL;
    int64_t port = 8888, router_port = 50051, n_prefill = 1, n_decode = 1, chunk = 4096;
    int64_t max_running = 16, max_queued = 256, context = 0, threads = 0, start_timeout = 120;
    double watchdog = 300.0, drain = 30.0, mem_fraction = 0.0;
    const char *config = NULL, *tokenizer = NULL, *quant = NULL, *dist_init = NULL, *spec_algo = NULL;
    const char *net_devices = NULL, *device = NULL, *dtype = NULL, *spec_conf = NULL;
    const char *act_quant = NULL;
    int64_t gpu = -1;
    int64_t tp = 1, nnodes = 1, node_rank = 0, max_new = 0, max_total = 0, graph_bs = 0, spec_block = 0;
    int64_t seed = -1;
    bool cache_report = false, demo = false, simulate = false, no_prefix_cache = false;
    int64_t prefix_cache_mb = -1;
    /* --simulate: workers with a timing model instead of the model (services/common/sim.h);
     * the sim values go through only when given, the workers hold the defaults */
    double sim_prefill_tps = -1, sim_step_base = -1, sim_step_per_seq = -1, sim_step_per_kctx = -1;
    int64_t max_connections = 0;
    bt_flag_t spec[] = {
        BT_FLAG_STR("config", &config, "cluster config file (deploy/README.md); flags override it"),
        BT_FLAG_BOOL("demo-model", &demo, "serve the built-in demo model whatever model-path says"),
        BT_FLAG_STR("model-path", &model_path, "checkpoint directory (default: the demo model)"),
        BT_FLAG_STR("served-model-name", &served, "the model name clients use"),
        BT_FLAG_STR("host", &host, "address every service listens on (default 127.0.0.1)"),
        BT_FLAG_INT("port", &port, "gateway HTTP port (default 8888)"),
        BT_FLAG_INT("router-port", &router_port, "router gRPC port (default 50051)"),
        BT_FLAG_INT("prefill", &n_prefill, "prefill groups (default 1)"),
        BT_FLAG_INT("decode", &n_decode, "decode groups (default 1)"),
        BT_FLAG_INT("chunked-prefill-size", &chunk, "tokens per prefill chunk (default 4096)"),
        BT_FLAG_INT("max-running-requests", &max_running, "per decode group (default 16)"),
        BT_FLAG_INT("max-queued-requests", &max_queued, "router queue (default 256)"),
        BT_FLAG_INT("context-length", &context, "tokens per sequence"),
        BT_FLAG_FLOAT("watchdog-timeout", &watchdog, "seconds any wait may take (default 300)"),
        BT_FLAG_FLOAT("drain-timeout", &drain,
                      "seconds stopping services finish their requests in (default 30)"),
        BT_FLAG_INT("threads", &threads, "CPU threads per worker (default: one per core)"),
        BT_FLAG_STR("device", &device, "where the workers run the model: cpu (default) or cuda"),
        BT_FLAG_INT("base-gpu-id", &gpu,
                    "the GPU every worker uses with --device cuda (default 0)"),
        BT_FLAG_STR("dtype", &dtype, "cuda weights: auto (as stored), float32, bfloat16"),
        BT_FLAG_STR("activation-quant", &act_quant,
                    "none (default) or fp8: round the inputs of FP8/FP4 linears as the reference "
                    "deployment does"),
        BT_FLAG_STR("ucx-tls", &ucx_tls, "UCX transports for the KV handoff: tcp (default), sm"),
        BT_FLAG_STR("reasoning-parser", &reasoning, "deepseek-v41"),
        BT_FLAG_STR("tool-call-parser", &tool, "deepseekv41"),
        BT_FLAG_STR("api-key", &api_key, "bearer token the gateway requires"),
        BT_FLAG_INT("start-timeout", &start_timeout,
                    "seconds a service may take to start (default 120)"),
        BT_FLAG_STR("log-level", &log_level, "debug, info, warn, error"),
        BT_FLAG_STR("tokenizer-path", &tokenizer, "tokenizer directory (default: model path)"),
        BT_FLAG_STR("quantization", &quant, "accepted; Baton follows the checkpoint's formats"),
        BT_FLAG_INT("tp", &tp,
                    "tensor-parallel size: processes per prefill and decode group (default 1)"),
        BT_FLAG_INT("nnodes", &nnodes, "hosts per group (baton up runs one)"),
        BT_FLAG_INT("node-rank", &node_rank, "must be 0 for baton up"),
        BT_FLAG_STR("dist-init-addr", &dist_init, "group rendezvous (unused on one host)"),
        BT_FLAG_INT("max-new-tokens", &max_new, "router cap and default for max_tokens"),
        BT_FLAG_FLOAT("mem-fraction-static", &mem_fraction,
                      "decode: fraction of memory for the KV pool"),
        BT_FLAG_INT("max-total-tokens", &max_total, "decode: KV pool size in tokens"),
        BT_FLAG_INT("cuda-graph-max-bs", &graph_bs,
                    "accepted; --device cuda graphs decode batches of 1..16"),
        BT_FLAG_STR("speculative-algorithm", &spec_algo,
                    "DSPARK: the checkpoint's draft stages (CPU engine for now)"),
        BT_FLAG_INT("speculative-dspark-block-size", &spec_block, "DSpark block size"),
        BT_FLAG_STR(
            "speculative-dspark-confidence", &spec_conf,
            "verify DSpark proposals up to the first the draft trusts less (0..1, default 0)"),
        BT_FLAG_INT("random-seed", &seed, "sampling seed for the workers"),
        BT_FLAG_BOOL("enable-cache-report", &cache_report,
                     "usage.prompt_tokens_details.cached_tokens (gateway)"),
        BT_FLAG_BOOL("disable-radix-cache", &no_prefix_cache, "prefill: keep no prompt prefixes"),
        BT_FLAG_INT("prefix-cache-mb", &prefix_cache_mb,
                    "prefill: host memory for cached prompt prefixes (default 4096)"),
        BT_FLAG_STR("ucx-net-devices", &net_devices,
                    "UCX devices for the KV handoff (dev:port,...)"),
        BT_FLAG_BOOL("simulate", &simulate,
                     "simulated workers: timing model, no weights (load tests)"),
        BT_FLAG_FLOAT("sim-prefill-tokens-per-s", &sim_prefill_tps,
                      "simulated prefill speed (default 5000)"),
        BT_FLAG_FLOAT("sim-decode-step-ms-base", &sim_step_base,
                      "simulated decode step, fixed ms (default 10)"),
        BT_FLAG_FLOAT("sim-decode-step-ms-per-seq", &sim_step_per_seq,
                      "simulated decode step, ms per sequence (default 2.2)"),
        BT_FLAG_FLOAT("sim-decode-step-ms-per-kctx", &sim_step_per_kctx,
                      "simulated decode step, ms per 1000 context tokens (default 0.02)"),
        BT_FLAG_INT("max-connections", &max_connections,
                    "gateway: open connections (default 4096)"),
    };
    char err[512];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton up: %s\n", err);
        return 2;
    }
    if (n_prefill < 1 || n_decode < 1 || n_prefill + n_decode + 2 > MAX_CHILDREN) {
        fprintf(stderr, "baton up: --prefill and --decode must be at least 1 (at most %d services)\n",
                MAX_CHILDREN);
        return 2;
    }
    /* what one host on the CPU backend cannot honour: say so, run what can run */
    if (node_rank != 0) {
        fprintf(stderr, "baton up: node-rank = %lld: baton up starts a whole cluster from rank 0; start the "
                        "other ranks' services with deploy/systemd or deploy/k8s\n", (long long)node_rank);
        return 2;
    }
    if (tp < 1 || tp > 16 || (n_prefill + n_decode) * tp + 2 > MAX_CHILDREN) {
        fprintf(stderr, "baton up: --tp must be 1..16 (and every group's ranks fit in %d processes)\n", MAX_CHILDREN);
        return 2;
    }
    if (nnodes > 1) {
        /* the group spans hosts (one GPU each, as in the reference deployment): this one-host
         * tool runs one rank per group here; the other hosts' ranks start from deploy/ */
        fprintf(stderr, "baton up: warning: tp = %lld over nnodes = %lld%s%s: baton up runs each group as one "
                        "process on this host (tp 1); start multi-host groups with deploy/systemd or deploy/k8s\n",
                (long long)tp, (long long)nnodes, dist_init ? ", dist-init-addr = " : "", dist_init ? dist_init : "");
        tp = 1;
    }
    if (spec_algo && !strcmp(spec_algo, "none")) spec_algo = "NONE";
    if (spec_algo && strcmp(spec_algo, "NONE") && strcmp(spec_algo, "DSPARK")) {
        fprintf(stderr, "baton up: --speculative-algorithm must be DSPARK or NONE\n");
        return 2;
    }
    if (spec_algo && !strcmp(spec_algo, "DSPARK") && simulate) {
        /* simulated workers have no draft stages */
        fprintf(stderr, "baton up: warning: speculative-algorithm = DSPARK with --simulate: "
                        "decoding runs one token a step\n");
        spec_algo = NULL;
    }
    if (spec_algo && !strcmp(spec_algo, "NONE")) spec_algo = NULL;
    if (graph_bs > 0 && graph_bs != 16)
        fprintf(stderr, "baton up: warning: cuda-graph-max-bs = %lld: with --device cuda, decode batches of "
                        "1..16 run as CUDA graphs, larger ones eagerly; not a setting, ignored\n", (long long)graph_bs);
    if (quant)
        fprintf(stderr, "baton up: warning: quantization = %s: Baton follows the checkpoint's formats\n", quant);
    if (demo) {
        model_path = NULL;
        tokenizer = NULL;
    }
    if (spec_algo) {
        /* the groups would refuse to start on a checkpoint without draft stages (the demo
         * model has them) */
        char err[1024];
        bt_model_config_t cfg;
        if (model_path && bt_model_config_load(model_path, &cfg, err, sizeof err) == BT_OK && !cfg.n_draft) {
            fprintf(stderr, "baton up: warning: speculative-algorithm = DSPARK: %s has no DSpark draft stages; "
                            "decoding runs one token a step\n", model_path);
            spec_algo = NULL;
        } else {
            fprintf(stderr, "baton up: speculative-algorithm = DSPARK: decode groups draft with the checkpoint's "
                            "DSpark stages%s\n", spec_block ? "" : " (its block size)");
        }
    }
    if (net_devices) {
        char list[1024];
        snprintf(list, sizeof list, "%s", net_devices);
        for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (strcmp(tok, "all") && !net_device_present(tok)) {
                fprintf(stderr, "baton up: warning: ucx-net-devices = %s: %s is not on this host; letting UCX "
                                "choose\n", net_devices, tok);
                net_devices = NULL;
                break;
            }
    }
    for (size_t i = 0; i < bt_conf_count(conf); i++) { /* [env]: names checked by the parser */
        const char *sec, *key, *value;
        bt_conf_at(conf, i, &sec, &key, &value, NULL);
        if (!strcmp(sec, "env")) setenv(key, value, 1);
    }
    char seed_buf[32], frac_buf[32];
    snprintf(seed_buf, sizeof seed_buf, "%lld", (long long)seed);
    snprintf(frac_buf, sizeof frac_buf, "%g", mem_fraction);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* the terminal or ssh session closed */
    sigaction(SIGQUIT, &sa, NULL);

    char dir[PATH_MAX], exe[PATH_MAX + 32];
    bin_dir(dir, sizeof dir);
    int timeout_ms = (int)(start_timeout * 1000);
    args_t a = {0};
    char wd[32], dr[32];
    snprintf(wd, sizeof wd, "%g", watchdog);
    snprintf(dr, sizeof dr, "%g", drain);

    snprintf(exe, sizeof exe, "%s/baton-router", dir);
    add(&a, exe);
    add_opt(&a, "--model-path", model_path);
    add_opt(&a, "--served-model-name", served);
    add_opt(&a, "--host", host);
    add_int(&a, "--port", router_port);
    add_int(&a, "--max-running-requests", max_running);
    add_int(&a, "--max-queued-requests", max_queued);
    if (context) add_int(&a, "--context-length", context);
    add_opt(&a, "--watchdog-timeout", wd);
    add_opt(&a, "--drain-timeout", dr);
    add_opt(&a, "--reasoning-parser", reasoning);
    add_opt(&a, "--tool-call-parser", tool);
    add_opt(&a, "--log-level", log_level);
    add_opt(&a, "--tokenizer-path", tokenizer);
    if (max_new > 0) add_int(&a, "--max-new-tokens", max_new);
    add_section(&a, conf, "router");
    int ri = spawn("router", a.v, timeout_ms);
    free_args(&a);
    int rc = 0;
    if (ri < 0) {
        rc = 1;
        goto out;
    }
    char router_addr[256];
    snprintf(router_addr, sizeof router_addr, "%s", children[ri].listen);

    for (int kind = 0; kind < 2; kind++) {
        int64_t count = kind == 0 ? n_prefill : n_decode;
        for (int64_t i = 0; i < count; i++) {
          /* a group of tp processes: the following ranks first (they wait for rank 0), then
           * rank 0, which registers with the router */
          char dist[64] = "";
          if (tp > 1) snprintf(dist, sizeof dist, "%s:%d", host, free_port(host));
          for (int64_t rank = tp - 1; rank >= 0; rank--) {
            char name[64];
            if (tp > 1)
                snprintf(name, sizeof name, "%s-%lld.%lld", kind == 0 ? "prefill" : "decode", (long long)i, (long long)rank);
            else
                snprintf(name, sizeof name, "%s-%lld", kind == 0 ? "prefill" : "decode", (long long)i);
            snprintf(exe, sizeof exe, "%s/baton-%s", dir, kind == 0 ? "prefill" : "decode");
            add(&a, exe);
            add_opt(&a, "--model-path", model_path);
            add_opt(&a, "--served-model-name", served);
            add_opt(&a, "--host", host);
            add_int(&a, "--port", 0);
            add_opt(&a, "--router", router_addr);
            if (context) add_int(&a, "--context-length", context);
            if (kind == 0) add_int(&a, "--chunked-prefill-size", chunk);
            if (kind == 0 && no_prefix_cache) add(&a, "--disable-radix-cache");
            if (kind == 0 && prefix_cache_mb >= 0) add_int(&a, "--prefix-cache-mb", prefix_cache_mb);
            if (kind == 1) add_int(&a, "--max-running-requests", max_running);
            if (threads) add_int(&a, "--threads", threads);
            add_opt(&a, "--device", device);
            add_opt(&a, "--dtype", dtype);
            add_opt(&a, "--activation-quant", act_quant);
            if (gpu >= 0) add_int(&a, "--base-gpu-id", gpu);
            add_opt(&a, "--speculative-algorithm", spec_algo);
            if (spec_algo && spec_block > 0) add_int(&a, "--speculative-dspark-block-size", spec_block);
            if (spec_algo && kind == 1) add_opt(&a, "--speculative-dspark-confidence", spec_conf);
            add_opt(&a, "--watchdog-timeout", wd);
            add_opt(&a, "--drain-timeout", dr);
            add_opt(&a, "--ucx-tls", ucx_tls);
            add_opt(&a, "--ucx-net-devices", net_devices);
            add_opt(&a, "--log-level", log_level);
            if (seed >= 0) add_opt(&a, "--random-seed", seed_buf);
            if (kind == 1 && max_total > 0) add_int(&a, "--max-total-tokens", max_total);
            if (kind == 1 && mem_fraction > 0) add_opt(&a, "--mem-fraction-static", frac_buf);
            if (simulate) {
                add(&a, "--simulate");
                const char *sim_flag[4] = {"--sim-prefill-tokens-per-s", "--sim-decode-step-ms-base",
                                           "--sim-decode-step-ms-per-seq", "--sim-decode-step-ms-per-kctx"};
                double sim_value[4] = {sim_prefill_tps, sim_step_base, sim_step_per_seq, sim_step_per_kctx};
                for (int k = 0; k < 4; k++)
                    if (sim_value[k] >= 0) {
                        char v[32];
                        snprintf(v, sizeof v, "%g", sim_value[k]);
                        add_opt(&a, sim_flag[k], v);
                    }
            }
            add_section(&a, conf, kind == 0 ? "prefill" : "decode");
            if (tp > 1) {
                add_int(&a, "--tp", tp);
                add_int(&a, "--node-rank", rank);
                add_opt(&a, "--dist-init-addr", dist);
            }
            int ci = spawn(name, a.v, rank == 0 ? timeout_ms : 0);
            free_args(&a);
            if (ci < 0) {
                rc = 1;
                goto out;
            }
          }
        }
    }
    snprintf(exe, sizeof exe, "%s/baton-gateway", dir);
    if (access(exe, X_OK) == 0) {
        add(&a, exe);
        add_opt(&a, "--router", router_addr);
        add_opt(&a, "--host", host);
        add_int(&a, "--port", port);
        add_opt(&a, "--api-key", api_key);
        add_opt(&a, "--served-model-name", served);
        if (cache_report) add(&a, "--enable-cache-report");
        add_opt(&a, "--log-level", log_level);
        add_opt(&a, "--drain-timeout", dr);
        if (max_connections > 0) add_int(&a, "--max-connections", max_connections);
        add_section(&a, conf, "gateway");
        int gi = spawn("gateway", a.v, timeout_ms);
        free_args(&a);
        if (gi < 0) {
            rc = 1;
            goto out;
        }
    }
    if (!wait_serving(router_addr, timeout_ms)) {
        fprintf(stderr, "baton up: the router at %s does not see a prefill and a decode group after %d s\n",
                router_addr, timeout_ms / 1000);
        rc = 1;
        goto out;
    }
    printf("baton up: cluster running%s%s%s%s\n", simulate ? " (simulated workers)" : "",
           model_path || simulate ? "" : " (demo model: tiny, untrained)",
           config ? " from " : "", config ? config : "");
    for (int i = 0; i < n_children; i++) printf("  %-12s %s (pid %d)\n", children[i].name, children[i].listen, (int)children[i].pid);
    printf("Ctrl-C stops it.\n");
    fflush(stdout);
    while (!stop_requested) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int i = 0; i < n_children; i++)
                if (children[i].pid == pid) {
                    children[i].pid = 0;
                    fprintf(stderr, "baton up: %s exited (%s %d); stopping the cluster\n", children[i].name,
                            WIFEXITED(status) ? "status" : "signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                    rc = 1;
                }
            if (rc) break;
        }
        usleep(100000);
    }
out:
    /* a service that died, or one that did not start: the others have nothing to finish */
    stop_all(rc || !stop_requested ? 0 : drain, stop_requested);
    return rc;
}

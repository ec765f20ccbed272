/* baton bench against `baton up --simulate --prefill 2 --decode 2` on free ports:
 *  - over HTTP (the gateway, OpenAI streaming with return_token_ids): counts match the
 *    request (tokens from ids: prompts x output length), percentiles ordered, PNGs written
 *    when gnuplot is there;
 *  - over gRPC (the router directly), a two-level concurrency sweep;
 *  - with a tiny admission queue, the excess is counted as the error kind "refused" over
 *    both, and refused requests stay out of the latency figures.
 * No timing assertions. */
#include "bt_test.h"
#include "integration/cluster_util.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>

typedef struct {
    pid_t pid;
    char router[128], gateway[128];
    pid_t children[16]; /* as its table of services printed them */
    int n_children;
} up_t;

/* Starts baton up with the extra args; waits for its table of services. */
static bool up_start(up_t *u, const char *const *extra)
{
    memset(u, 0, sizeof *u);
    char path[512];
    snprintf(path, sizeof path, "%s/baton", BT_BIN_DIR);
    char *argv[64] = {path, "up", "--simulate", "--prefill", "2", "--decode", "2", "--port", "0", "--router-port", "0",
                      "--sim-decode-step-ms-base", "2", "--sim-decode-step-ms-per-seq", "0.5",
                      "--sim-prefill-tokens-per-s", "50000", "--log-level", "warn"};
    int n = 19;
    for (int i = 0; extra[i] && n < 62; i++) argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0) return false;
    pid_t pid = fork();
    if (pid == 0) {
        char log[256];
        snprintf(log, sizeof log, "/tmp/bt-it-bench-up-%d.log", (int)getpid());
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(path, argv);
        _exit(127);
    }
    close(fds[1]);
    u->pid = pid;
    char buf[4096];
    buf[0] = 0;
    size_t used = 0;
    int64_t deadline = ms_now() + 90000;
    while (ms_now() < deadline && !strstr(buf, "Ctrl-C stops it.")) {
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0) continue;
        ssize_t r = read(fds[0], buf + used, sizeof buf - 1 - used);
        if (r <= 0) break;
        used += (size_t)r;
        buf[used] = 0;
    }
    close(fds[0]);
    const char *r = strstr(buf, "  router "), *g = strstr(buf, "  gateway ");
    if (r) sscanf(r, " router %127s", u->router);
    if (g) sscanf(g, " gateway %127s", u->gateway);
    for (const char *p = buf; (p = strstr(p, "(pid ")) && u->n_children < 16; p++)
        u->children[u->n_children++] = (pid_t)atoi(p + 5);
    if (!u->router[0] || !u->gateway[0]) {
        fprintf(stderr, "baton up did not start:\n%s\n", buf);
        return false;
    }
    return true;
}

static void up_stop(up_t *u)
{
    if (u->pid <= 0) return;
    kill(u->pid, SIGTERM);
    int64_t deadline = ms_now() + 15000;
    while (ms_now() < deadline)
        if (waitpid(u->pid, NULL, WNOHANG) == u->pid) {
            u->pid = 0;
            return;
        }
        else
            usleep(20000);
    kill(u->pid, SIGKILL);
    waitpid(u->pid, NULL, 0);
    u->pid = 0;
}

/* Runs baton bench with args (NULL-terminated); returns its exit status (-1 on timeout). */
static int bench(const char *const *args)
{
    char path[512];
    snprintf(path, sizeof path, "%s/baton", BT_BIN_DIR);
    char *argv[64] = {path, "bench", "--disable-progress"};
    int n = 3;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen("/dev/null", "w", stdout);
        (void)f;
        execv(path, argv);
        _exit(127);
    }
    int64_t deadline = ms_now() + 60000;
    int status;
    while (ms_now() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static cJSON *load(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

static double num(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : -1e300;
}

/* The figures of one run are sane: counts add up, percentiles ordered. */
static void check_run(const cJSON *run, int issued, int completed, int out_len, int in_len)
{
    BT_CHECK_EQ_INT(num(run, "issued", NULL), issued);
    if (completed >= 0) BT_CHECK_EQ_INT(num(run, "completed", NULL), completed);
    int done = (int)num(run, "completed", NULL);
    BT_CHECK_EQ_INT(num(run, "completed", NULL) + num(run, "failed", NULL), issued);
    BT_CHECK_EQ_INT(num(run, "total_output_tokens", NULL), (double)done * out_len);
    if (in_len > 0) BT_CHECK_EQ_INT(num(run, "total_input_tokens", NULL), (double)done * in_len);
    BT_CHECK(num(run, "duration_s", NULL) > 0);
    BT_CHECK(num(run, "output_throughput", NULL) >= 0);
    static const char *metrics[] = {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"};
    for (int i = 0; i < 4; i++) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(run, metrics[i]);
        BT_CHECK_MSG(m != NULL, "%s missing", metrics[i]);
        if (!m || done == 0) continue;
        BT_CHECK_MSG(num(m, "min", NULL) <= num(m, "p50", NULL) && num(m, "p50", NULL) <= num(m, "p90", NULL) &&
                         num(m, "p90", NULL) <= num(m, "p99", NULL) && num(m, "p99", NULL) <= num(m, "max", NULL),
                     "%s percentiles out of order", metrics[i]);
        BT_CHECK_MSG(num(m, "min", NULL) >= 0, "%s negative", metrics[i]);
    }
    /* one ITL sample per token after each request's first */
    BT_CHECK_EQ_INT(num(run, "itl_ms", "n"), (double)done * (out_len - 1));
    BT_CHECK_EQ_INT(num(run, "ttft_ms", "n"), done);
    BT_CHECK(num(run, "e2e_ms", "p50") >= num(run, "ttft_ms", "p50"));
}

static char dir[256];
static up_t cluster;
static bool cluster_ok;

static void test_http(void)
{
    char out[300];
    snprintf(out, sizeof out, "%s/http.json", dir);
    char url[200];
    snprintf(url, sizeof url, "http://%s", cluster.gateway);
    const char *args[] = {"--base-url", url, "--num-prompts", "8", "--max-concurrency", "4", "--random-input-len", "32",
                          "--random-output-len", "8", "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--simulated",
                          "--sim-prefill-groups", "2", "--sim-decode-groups", "2", "--output", out, NULL};
    BT_CHECK_EQ_INT(bench(args), 0);
    cJSON *o = load(out);
    BT_CHECK(o != NULL);
    if (!o) return;
    BT_CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(o, "backend")->valuestring, "http"));
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(o, "runs");
    BT_CHECK_EQ_INT(cJSON_GetArraySize(runs), 1);
    const cJSON *run = cJSON_GetArrayItem(runs, 0);
    check_run(run, 8, 8, 8, 32);
    BT_CHECK_EQ_INT(num(run, "goodput", "requests"), 8);
    BT_CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "overhead"), "ttft_ms") != NULL);
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        char png[320];
        snprintf(png, sizeof png, "%s/http-latency-cdf.png", dir);
        struct stat st;
        BT_CHECK_MSG(stat(png, &st) == 0 && st.st_size > 1000, "%s not written", png);
    }
    cJSON_Delete(o);
}

static void test_grpc_sweep(void)
{
    char out[300];
    snprintf(out, sizeof out, "%s/grpc.json", dir);
    const char *args[] = {"--router", cluster.router, "--num-prompts", "4", "--sweep-concurrency", "1,4",
                          "--random-input-len", "16", "--random-output-len", "6", "--output", out, "--no-plot", NULL};
    BT_CHECK_EQ_INT(bench(args), 0);
    cJSON *o = load(out);
    BT_CHECK(o != NULL);
    if (!o) return;
    BT_CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(o, "backend")->valuestring, "grpc"));
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(o, "runs");
    BT_CHECK_EQ_INT(cJSON_GetArraySize(runs), 2);
    for (int i = 0; i < cJSON_GetArraySize(runs); i++) check_run(cJSON_GetArrayItem(runs, i), 4, 4, 6, 16);
    BT_CHECK_EQ_INT(num(cJSON_GetArrayItem(runs, 1), "concurrency", NULL), 4);
    cJSON_Delete(o);
}

/* --shared-prefix-len: every prompt starts with the same 128 ids, so each (after the warm-up
 * request that sent it first) finds them in a prefill group's prefix cache, and the report
 * counts the cached tokens the server gave in usage. */
static void test_shared_prefix(void)
{
    char out[300];
    snprintf(out, sizeof out, "%s/prefix.json", dir);
    const char *args[] = {"--router",
                          cluster.router,
                          "--num-prompts",
                          "4",
                          "--max-concurrency",
                          "1",
                          "--shared-prefix-len",
                          "128",
                          "--random-input-len",
                          "16",
                          "--random-output-len",
                          "4",
                          "--output",
                          out,
                          "--no-plot",
                          NULL};
    BT_CHECK_EQ_INT(bench(args), 0);
    cJSON *o = load(out);
    BT_CHECK(o != NULL);
    if (!o) return;
    const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "runs"), 0);
    check_run(run, 4, 4, 4, 144);
    /* (the prefill keeps the state at a prompt's last multiple of 64 tokens: 128 of 144) */
    BT_CHECK_MSG(num(run, "total_cached_tokens", NULL) == 4 * 128, "%.0f cached tokens",
                 num(run, "total_cached_tokens", NULL));
    cJSON_Delete(o);
}

/* 2 decode groups x 2 running + 2 queued: a burst of 16 overflows admission. */
static void test_refused(void)
{
    for (int grpc = 0; grpc < 2; grpc++) {
        char out[300], url[200];
        snprintf(out, sizeof out, "%s/refused-%d.json", dir, grpc);
        snprintf(url, sizeof url, "http://%s", cluster.gateway);
        const char *args[] = {grpc ? "--router" : "--base-url", grpc ? cluster.router : url, "--num-prompts", "16",
                              "--max-concurrency", "16", "--random-input-len", "16", "--random-output-len", "40",
                              "--warmup-requests", "0", "--output", out, "--no-plot", NULL};
        BT_CHECK_EQ_INT(bench(args), 0);
        cJSON *o = load(out);
        BT_CHECK(o != NULL);
        if (!o) continue;
        const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "runs"), 0);
        check_run(run, 16, -1, 40, 16);
        double refused = num(run, "errors", "refused");
        BT_CHECK_MSG(refused > 0, "%s: no refused requests", grpc ? "grpc" : "http");
        BT_CHECK_MSG(num(run, "completed", NULL) >= 1, "%s: nothing completed", grpc ? "grpc" : "http");
        BT_CHECK_EQ_INT(refused, num(run, "failed", NULL)); /* refusals are the only errors */
        cJSON_Delete(o);
    }
}

/* A process that has exited (gone, or a zombie no one reaped yet). */
static bool exited(pid_t pid)
{
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    const bool got = fgets(stat, sizeof stat, f) != NULL;
    fclose(f);
    const char *e = got ? strrchr(stat, ')') : NULL;
    return !e || e[2] == 'Z' || e[2] == 'X';
}

static bool all_exited(const up_t *u, int ms)
{
    for (int64_t until = ms_now() + ms; ms_now() < until; usleep(50000)) {
        bool all = true;
        for (int i = 0; i < u->n_children; i++)
            all &= exited(u->children[i]);
        if (all) return true;
    }
    return false;
}

/* `baton up`'s services stop with it however it goes: on SIGHUP (a closed terminal or ssh
 * session: it was not handled, so `baton up` died and left them running, holding the
 * cluster's ports), and when it is killed outright (they follow their parent's death). */
static void test_services_follow_up(void)
{
    static const int sigs[2] = {SIGHUP, SIGKILL};
    for (int k = 0; k < 2; k++) {
        up_t u;
        const char *none[] = {NULL};
        BT_CHECK(up_start(&u, none));
        BT_CHECK_MSG(u.n_children >= 6, "%d services listed", u.n_children);
        kill(u.pid, sigs[k]);
        waitpid(u.pid, NULL, 0);
        u.pid = 0;
        const bool gone = all_exited(&u, 10000);
        BT_CHECK_MSG(gone, "after %s of baton up, its services still run", strsignal(sigs[k]));
        if (!gone)
            for (int i = 0; i < u.n_children; i++)
                kill(u.children[i], SIGKILL);
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof dir, "/tmp/bt-it-bench-%d", (int)getpid());
    mkdir(dir, 0755);
    const char *tiny[] = {"--max-running-requests", "2", "--max-queued-requests", "2", NULL};
    cluster_ok = up_start(&cluster, tiny);
    BT_CHECK(cluster_ok);
    if (cluster_ok) {
        BT_RUN(test_http);
        BT_RUN(test_grpc_sweep);
        BT_RUN(test_shared_prefix);
        BT_RUN(test_refused);
    }
    up_stop(&cluster);
    BT_RUN(test_services_follow_up);
    return bt_test_summary();
}

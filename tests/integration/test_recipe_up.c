/* Integration test (real processes): kept out of the ASan unit suite, where a 1M-token KV pool
 * and four service start-ups exceed its time and memory. */
/* From a published recipe to a running cluster: `baton recipe apply` on the example recipe,
 * then `baton up --config` on the result with the demo model substituted, on loopback; the
 * router answers `baton complete` (and the gateway /health, when it is built). Also: what one
 * host cannot honour warns, node-rank > 0 refuses. Memory: the recipe's KV pool (1M-token
 * slots, max-total-tokens 8M) is ~4 GiB with the demo model. */
#include "bt_test.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RECIPE_FILE BT_TEST_DATA_DIR "/recipes/deepseek-v4-1-flash-on-4x-dgx-spark-tuned-tp4-sglang-dspark.json"

static char tmpdir[64], baton[512];

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static pid_t spawn(char *const argv[], const char *out, const char *err)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "r", stdin) || !freopen(out, "w", stdout) || !freopen(err, "w", stderr))
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int wait_rc(pid_t pid)
{
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd);
    return ntohs(sa.sin_port);
}

static void test_recipe_to_cluster(void)
{
    char conf[128], out[128], err[128];
    snprintf(conf, sizeof conf, "%s/baton.conf", tmpdir);
    snprintf(out, sizeof out, "%s/up.out", tmpdir);
    snprintf(err, sizeof err, "%s/up.err", tmpdir);
    char *apply[] = {baton, "recipe", "apply", RECIPE_FILE, "--config", conf, NULL};
    BT_CHECK_EQ_INT(wait_rc(spawn(apply, out, err)), 0);

    /* node-rank > 0 is refused before anything starts */
    char *rank[] = {baton, "up", "--config", conf, "--node-rank", "1", NULL};
    BT_CHECK_EQ_INT(wait_rc(spawn(rank, out, err)), 2);
    char *e = slurp(err);
    BT_CHECK(e && strstr(e, "node-rank = 1"));
    free(e);

    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    char *up[] = {baton, "up", "--config", conf, "--demo-model", "--host", "127.0.0.1", "--router-port", "0",
                  "--port", port, "--start-timeout", "240", NULL};
    pid_t pid = spawn(up, out, err);
    char router[128] = "";
    time_t deadline = time(NULL) + 600;
    while (time(NULL) < deadline) {
        char *o = slurp(out);
        const char *at = o ? strstr(o, "\n  router ") : NULL;
        if (o && strstr(o, "cluster running") && at) {
            sscanf(at, "\n  router %127s", router);
            free(o);
            break;
        }
        free(o);
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            pid = 0;
            break;
        }
        usleep(200000);
    }
    BT_CHECK_MSG(router[0] != 0, "baton up did not start; its stderr:\n%s", (e = slurp(err)) ? e : "");
    if (!router[0]) free(e);
    e = slurp(err);
    BT_CHECK(e && strstr(e, "tp = 4") && strstr(e, "speculative-algorithm = DSPARK"));
    free(e);
    if (router[0]) {
        char cout[128], cerr[128];
        snprintf(cout, sizeof cout, "%s/complete.out", tmpdir);
        snprintf(cerr, sizeof cerr, "%s/complete.err", tmpdir);
        char *complete[] = {baton, "complete", "--router", router, "--input-ids", "0,1,2", "--max-new-tokens", "4",
                            "--temperature", "0", NULL};
        BT_CHECK_EQ_INT(wait_rc(spawn(complete, cout, cerr)), 0);
        char *o = slurp(cout);
        /* the ids are on the last line that is only digits and commas */
        int lines_with_ids = 0;
        for (char *line = o ? strtok(o, "\n") : NULL; line; line = strtok(NULL, "\n")) {
            int ids = 0, ok = 1;
            for (char *p = line; *p; p++) ok &= (*p >= '0' && *p <= '9') || *p == ',';
            for (char *p = line; ok && *p; p++) ids += *p == ',';
            if (ok && *line && ids == 3) lines_with_ids++;
        }
        BT_CHECK_MSG(lines_with_ids >= 1, "no line of 4 ids from baton complete");
        free(o);
        /* constrained from the command line: the whole answer matches --regex, and a pattern
         * the router cannot hold the answer to is refused naming the problem */
        char *constrained[] = {
            baton,     "complete",           "--router", router,          "--prompt",
            "Well",    "--max-new-tokens",   "24",       "--temperature", "0",
            "--regex", "(yes|no|maybe)[.!]", NULL};
        BT_CHECK_EQ_INT(wait_rc(spawn(constrained, cout, cerr)), 0);
        char *text = slurp(cerr);
        const char *answers[] = {"yes.", "no.", "maybe.", "yes!", "no!", "maybe!"};
        bool matched = false;
        for (int i = 0; i < 6 && text; i++) {
            const size_t n = strlen(answers[i]);
            matched |= !strncmp(text, answers[i], n) && text[n] == '\n';
        }
        BT_CHECK_MSG(matched, "baton complete --regex answered '%.200s'", text ? text : "");
        free(text);
        char *refused[] = {baton,  "complete", "--router", router, "--prompt",
                           "Well", "--regex",  "(?=a)",    NULL};
        BT_CHECK(wait_rc(spawn(refused, cout, cerr)) != 0);
        text = slurp(cerr);
        BT_CHECK_MSG(text && strstr(text, "regex: lookaround"), "%.300s", text ? text : "");
        free(text);
        char gw[600];
        snprintf(gw, sizeof gw, "%s/baton-gateway", BT_BIN_DIR);
        if (access(gw, X_OK) == 0) {
            char url[64];
            snprintf(url, sizeof url, "http://127.0.0.1:%s/health", port);
            char *curl[] = {"/usr/bin/curl", "-sf", "--noproxy", "*", "-m", "10", url, NULL};
            BT_CHECK_EQ_INT(wait_rc(spawn(curl, cout, cerr)), 0);
        }
    }
    if (pid > 0) {
        kill(pid, SIGTERM);
        time_t stop = time(NULL) + 20;
        while (time(NULL) < stop && waitpid(pid, NULL, WNOHANG) != pid) usleep(100000);
        if (time(NULL) >= stop) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/bt-recipe-up-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    snprintf(baton, sizeof baton, "%s/baton", BT_BIN_DIR);
    char router[600];
    snprintf(router, sizeof router, "%s/baton-router", BT_BIN_DIR);
    if (access(router, X_OK) != 0) {
        fprintf(stderr, "skipped: %s is not built\n", router);
        return 0;
    }
    setenv("XDG_CACHE_HOME", tmpdir, 1); /* the demo model is written under the test's directory */
    BT_RUN(test_recipe_to_cluster);
    if (!bt_test_failures) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return bt_test_summary();
}

/* baton recipe apply: the example recipe served over HTTP on loopback (a tiny server thread in
 * this test) and applied; the config holds the mapped values. Replacing an existing config:
 * refused without a terminal, n/y on a pty, --yes, --dry-run, the .bak. Malformed JSON, wrong
 * types, a body over the cap, 404, a redirect loop and a timeout each fail clearly and write
 * nothing. Plus the word splitter and the config parser directly. */
#include "bt_test.h"

#include "services/cli/config.c"
#include "services/cli/recipe.c"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RECIPE_FILE BT_TEST_DATA_DIR "/recipes/deepseek-v4-1-flash-on-4x-dgx-spark-tuned-tp4-sglang-dspark.json"

static char tmpdir[64];
static char baton[512];

static char *slurp(const char *path, size_t *len_p)
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
    if (len_p) *len_p = got;
    return b;
}

static void spit(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    BT_CHECK(f != NULL);
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

/* ---- a tiny HTTP server on 127.0.0.1 ------------------------------------------------------ */

static int srv_fd = -1, srv_port;
static volatile int srv_stop;
static char *recipe_body;
static size_t recipe_len;

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int code, const char *extra, const char *body, size_t len, bool with_length)
{
    char head[512];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d X\r\n%sConnection: close\r\n", code, extra);
    if (with_length) n += snprintf(head + n, sizeof head - (size_t)n, "Content-Length: %zu\r\n", len);
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    send_all(fd, head, (size_t)n);
    send_all(fd, body, len);
}

static void serve(int fd)
{
    char req[4096];
    size_t used = 0;
    while (used < sizeof req - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 2000) <= 0) return;
        ssize_t r = recv(fd, req + used, sizeof req - 1 - used, 0);
        if (r <= 0) return;
        used += (size_t)r;
        req[used] = 0;
        if (strstr(req, "\r\n\r\n")) break;
    }
    char path[256] = "";
    if (sscanf(req, "GET %255s", path) != 1) return;
    if (!strcmp(path, "/recipe.json")) {
        respond(fd, 200, "Content-Type: application/json\r\n", recipe_body, recipe_len, true);
    } else if (!strcmp(path, "/moved")) {
        respond(fd, 301, "Location: /recipe.json\r\n", "", 0, true);
    } else if (!strcmp(path, "/loop")) {
        respond(fd, 302, "Location: /loop\r\n", "", 0, true);
    } else if (!strcmp(path, "/malformed.json")) {
        const char *b = "{\"command\": \"x --tp 4\", ";
        respond(fd, 200, "", b, strlen(b), true);
    } else if (!strcmp(path, "/wrongtype.json")) {
        const char *b = "{\"command\": 42, \"env\": \"\"}";
        respond(fd, 200, "", b, strlen(b), true);
    } else if (!strcmp(path, "/badvalue.json")) {
        const char *b = "{\"command\": \"x --tp four\"}";
        respond(fd, 200, "", b, strlen(b), true);
    } else if (!strcmp(path, "/big.json") || !strcmp(path, "/big-nolength.json")) {
        size_t n = 2u << 20; /* twice the cap */
        char *b = malloc(n);
        memset(b, ' ', n);
        b[0] = '{';
        b[n - 1] = '}';
        respond(fd, 200, "", b, n, !strcmp(path, "/big.json"));
        free(b);
    } else if (!strcmp(path, "/slow.json")) {
        const char *h = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{";
        send_all(fd, h, strlen(h));
        for (int i = 0; i < 40 && !srv_stop; i++) usleep(50000); /* 2 s, then give up */
    } else {
        respond(fd, 404, "", "not found\n", 10, true);
    }
}

static void *server_main(void *arg)
{
    (void)arg;
    while (!srv_stop) {
        struct pollfd p = {srv_fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        int c = accept(srv_fd, NULL, NULL);
        if (c < 0) continue;
        serve(c);
        shutdown(c, SHUT_RDWR);
        close(c);
    }
    return NULL;
}

static pthread_t server_start(void)
{
    recipe_body = slurp(RECIPE_FILE, &recipe_len);
    BT_ASSERT(recipe_body != NULL);
    srv_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BT_ASSERT(bind(srv_fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    socklen_t sl = sizeof sa;
    getsockname(srv_fd, (struct sockaddr *)&sa, &sl);
    srv_port = ntohs(sa.sin_port);
    BT_ASSERT(listen(srv_fd, 16) == 0);
    pthread_t t;
    pthread_create(&t, NULL, server_main, NULL);
    return t;
}

/* ---- running baton ------------------------------------------------------------------------ */

/* Runs baton with args (NULL-terminated), stdin from /dev/null; stdout/stderr captured. */
static int run(const char *const *args, char **out_p, char **err_p)
{
    char out[128], errf[128];
    snprintf(out, sizeof out, "%s/.out", tmpdir);
    snprintf(errf, sizeof errf, "%s/.err", tmpdir);
    const char *argv[32] = {baton};
    int n = 1;
    while (args[n - 1] && n < 31) argv[n] = args[n - 1], n++;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "r", stdin) || !freopen(out, "w", stdout) || !freopen(errf, "w", stderr))
            _exit(127);
        execv(baton, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char *o = slurp(out, NULL), *e = slurp(errf, NULL);
    unlink(out);
    unlink(errf);
    if (out_p) *out_p = o;
    else free(o);
    if (err_p) *err_p = e;
    else free(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static char url_buf[8][256];
static const char *url(int i, const char *path)
{
    snprintf(url_buf[i], sizeof url_buf[i], "http://127.0.0.1:%d%s", srv_port, path);
    return url_buf[i];
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void check_conf(const char *path)
{
    bt_conf_t *c = NULL;
    char err[512];
    BT_CHECK(bt_conf_load(path, &c, err, sizeof err) == BT_OK);
    if (!c) return;
    static const char *want[][2] = {
        {"model-path", "/models/DeepSeek-V4.1-Flash"},
        {"served-model-name", "deepseek-v4.1-flash"},
        {"tp", "4"},
        {"nnodes", "4"},
        {"node-rank", "0"},
        {"dist-init-addr", "10.0.0.1:20000"},
        {"max-running-requests", "16"},
        {"chunked-prefill-size", "4096"},
        {"context-length", "1048576"},
        {"mem-fraction-static", "0.80"},
        {"max-total-tokens", "8000000"},
        {"cuda-graph-max-bs", "16"},
        {"speculative-algorithm", "DSPARK"},
        {"speculative-dspark-block-size", "5"},
        {"tool-call-parser", "deepseekv41"},
        {"reasoning-parser", "deepseek-v41"},
        {"host", "0.0.0.0"},
        {"port", "8888"},
        {"random-seed", "0"},
        {"watchdog-timeout", "1800"},
        {"enable-cache-report", "true"},
        {"max-new-tokens", "32768"},
        {"ucx-net-devices", "rocep1s0f0:1,roceP2p1s0f0:1"},
        {"activation-quant", "fp8"}, /* from --fp8-gemm-backend: SGLang's FP8 GEMMs quantize */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *v = bt_conf_get(c, "cluster", want[i][0]);
        BT_CHECK_MSG(v && !strcmp(v, want[i][1]), "%s = %s, want %s", want[i][0], v ? v : "(absent)", want[i][1]);
    }
    const char *nccl = bt_conf_get(c, "env", "NCCL_BUFFSIZE");
    BT_CHECK(nccl && !strcmp(nccl, "1048576"));
    BT_CHECK(bt_conf_get(c, "env", "DSV41_FAST_LOAD") == NULL);
    BT_CHECK(bt_conf_get(c, "cluster", "api-key") == NULL);
    bt_conf_destroy(c);
}

static void test_apply_over_http(void)
{
    char conf[128];
    snprintf(conf, sizeof conf, "%s/http/baton.conf", tmpdir);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/http", tmpdir);
    mkdir(dir, 0755);
    char *out = NULL, *err = NULL;
    const char *a[] = {"recipe", "apply", url(0, "/recipe.json"), "--config", conf, NULL};
    BT_CHECK_EQ_INT(run(a, &out, &err), 0);
    BT_CHECK(out && strstr(out, "applied") && strstr(out, "ignored") && strstr(out, "--trust-remote-code"));
    check_conf(conf);
    BT_CHECK_EQ_INT(count_files(dir), 1); /* no temporary left behind, no .bak for a new file */
    free(out);
    free(err);

    /* a redirect within the limit is followed */
    const char *b[] = {"recipe", "apply", url(1, "/moved"), "--config", conf, "--dry-run", NULL};
    BT_CHECK_EQ_INT(run(b, &out, &err), 0);
    BT_CHECK(out && strstr(out, "+# source: http") && strstr(out, "/moved") && strstr(out, "dry run"));
    BT_CHECK(out && !strstr(out, "\n+tp = ") && !strstr(out, "\n-tp = "));
    free(out);
    free(err);

    /* --json: one object, flag names without dashes */
    const char *c[] = {"recipe", "apply", url(2, "/recipe.json"), "--config", conf, "--json", NULL};
    BT_CHECK_EQ_INT(run(c, &out, &err), 0);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    BT_CHECK(j != NULL);
    if (j) {
        cJSON *ap = cJSON_GetObjectItem(j, "applied"), *ig = cJSON_GetObjectItem(j, "ignored");
        BT_CHECK(cJSON_IsObject(ap) && cJSON_IsArray(ig) && cJSON_IsArray(cJSON_GetObjectItem(j, "unknown")));
        BT_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(ap, "tp")) == 4);
        BT_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(ap, "max-running-requests")) == 16);
        BT_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(ap, "port")) == 8888);
        BT_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(ap, "enable-cache-report")));
        const char *parser = cJSON_GetStringValue(cJSON_GetObjectItem(ap, "tool-call-parser"));
        BT_CHECK(parser && !strcmp(parser, "deepseekv41"));
        bool trc = false, env = false;
        cJSON *it;
        cJSON_ArrayForEach(it, ig) {
            const char *n = cJSON_GetStringValue(cJSON_GetObjectItem(it, "name"));
            const char *why = cJSON_GetStringValue(cJSON_GetObjectItem(it, "reason"));
            BT_CHECK(n && why && *why);
            if (n && !strcmp(n, "--trust-remote-code")) trc = true;
            if (n && !strcmp(n, "env PYTORCH_CUDA_ALLOC_CONF")) env = true;
        }
        BT_CHECK(trc && env);
        cJSON_Delete(j);
    }
    free(out);
    free(err);
}

static void test_apply_errors(void)
{
    static const struct {
        const char *path, *expect;
        const char *extra;
    } cases[] = {
        {"/malformed.json", "malformed JSON", NULL},
        {"/wrongtype.json", "field 'command' must be a string", NULL},
        {"/badvalue.json", "tp: expected a non-negative integer", NULL},
        {"/big.json", "cap", NULL},
        {"/big-nolength.json", "cap", NULL},
        {"/missing.json", "HTTP 404", NULL},
        {"/loop", "redirects", NULL},
        {"/slow.json", "timed out", "1"},
    };
    char dir[128], conf[160];
    snprintf(dir, sizeof dir, "%s/errors", tmpdir);
    mkdir(dir, 0755);
    snprintf(conf, sizeof conf, "%s/baton.conf", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL, *err = NULL;
        const char *a[] = {"recipe", "apply", url(3, cases[i].path), "--config", conf,
                           cases[i].extra ? "--timeout" : NULL, cases[i].extra, NULL};
        int64_t t0 = (int64_t)time(NULL);
        int rc = run(a, &out, &err);
        BT_CHECK_MSG(rc == 1, "%s: exit %d", cases[i].path, rc);
        BT_CHECK_MSG(err && strstr(err, cases[i].expect), "%s: stderr '%s' lacks '%s'", cases[i].path,
                     err ? err : "", cases[i].expect);
        BT_CHECK_MSG(count_files(dir) == 0, "%s left a file", cases[i].path);
        if (cases[i].extra) BT_CHECK((int64_t)time(NULL) - t0 < 10);
        free(out);
        free(err);
    }
    /* the same checks on files, and a scheme that is not http(s) */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.json", tmpdir);
    spit(bad, "[1, 2]");
    char *err = NULL;
    const char *a[] = {"recipe", "apply", bad, "--config", conf, NULL};
    BT_CHECK_EQ_INT(run(a, NULL, &err), 1);
    BT_CHECK(err && strstr(err, "expected a JSON object"));
    free(err);
    const char *b[] = {"recipe", "apply", "file:///etc/passwd", "--config", conf, NULL};
    BT_CHECK_EQ_INT(run(b, NULL, &err), 1);
    BT_CHECK(err && strstr(err, "only files and http(s) URLs"));
    free(err);
    BT_CHECK_EQ_INT(count_files(dir), 0);
    unlink(bad);
}

static const char *old_conf = "# hand-written\n[cluster]\ntp = 1\nport = 9999\n";

static void test_existing_config(void)
{
    char dir[128], conf[160], bak[170];
    snprintf(dir, sizeof dir, "%s/existing", tmpdir);
    mkdir(dir, 0755);
    snprintf(conf, sizeof conf, "%s/baton.conf", dir);
    snprintf(bak, sizeof bak, "%s.bak", conf);
    spit(conf, old_conf);
    char *out = NULL, *err = NULL;
    /* no terminal, no --yes: refused, untouched */
    const char *a[] = {"recipe", "apply", RECIPE_FILE, "--config", conf, NULL};
    BT_CHECK_EQ_INT(run(a, &out, &err), 1);
    BT_CHECK(err && strstr(err, "--yes"));
    BT_CHECK(out && strstr(out, "-port = 9999") && strstr(out, "+port = 8888")); /* the difference */
    char *now = slurp(conf, NULL);
    BT_CHECK(now && !strcmp(now, old_conf));
    free(now);
    BT_CHECK(access(bak, F_OK) != 0);
    BT_CHECK_EQ_INT(count_files(dir), 1);
    free(out);
    free(err);
    /* --dry-run: prints, writes nothing */
    const char *b[] = {"recipe", "apply", RECIPE_FILE, "--config", conf, "--dry-run", NULL};
    BT_CHECK_EQ_INT(run(b, &out, &err), 0);
    now = slurp(conf, NULL);
    BT_CHECK(now && !strcmp(now, old_conf));
    free(now);
    BT_CHECK_EQ_INT(count_files(dir), 1);
    free(out);
    free(err);
    /* --yes: replaced, old one in .bak */
    const char *c[] = {"recipe", "apply", RECIPE_FILE, "--config", conf, "--yes", NULL};
    BT_CHECK_EQ_INT(run(c, &out, &err), 0);
    check_conf(conf);
    now = slurp(bak, NULL);
    BT_CHECK(now && !strcmp(now, old_conf));
    free(now);
    BT_CHECK_EQ_INT(count_files(dir), 2);
    free(out);
    free(err);
}

/* Runs apply on a pty, answers `answer` to the question; returns the exit code. */
static int apply_on_pty(const char *conf, const char *answer, char *transcript, size_t len)
{
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    if (pid < 0) return -1;
    if (pid == 0) {
        execl(baton, baton, "recipe", "apply", RECIPE_FILE, "--config", conf, (char *)NULL);
        _exit(127);
    }
    size_t used = 0;
    bool answered = false;
    time_t deadline = time(NULL) + 30;
    transcript[0] = 0;
    while (time(NULL) < deadline) {
        struct pollfd p = {master, POLLIN, 0};
        int pr = poll(&p, 1, 200);
        if (pr > 0) {
            ssize_t n = read(master, transcript + used, len - 1 - used);
            if (n <= 0) break; /* EIO once the child closed the pty */
            used += (size_t)n;
            transcript[used] = 0;
            if (used == len - 1) used = len / 2; /* keep reading, overwrite the tail */
        }
        if (!answered && strstr(transcript, "[y/N]")) {
            if (write(master, answer, strlen(answer)) < 0) break;
            answered = true;
        }
    }
    if (time(NULL) >= deadline) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    close(master);
    if (!answered) return -3;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_existing_config_on_a_terminal(void)
{
    char dir[128], conf[160], bak[170];
    snprintf(dir, sizeof dir, "%s/pty", tmpdir);
    mkdir(dir, 0755);
    snprintf(conf, sizeof conf, "%s/baton.conf", dir);
    snprintf(bak, sizeof bak, "%s.bak", conf);
    spit(conf, old_conf);
    static char transcript[1 << 16];
    int rc = apply_on_pty(conf, "n\n", transcript, sizeof transcript);
    BT_CHECK_MSG(rc == 1, "answer n: exit %d; transcript:\n%s", rc, transcript);
    char *now = slurp(conf, NULL);
    BT_CHECK(now && !strcmp(now, old_conf));
    free(now);
    BT_CHECK(access(bak, F_OK) != 0);
    rc = apply_on_pty(conf, "y\n", transcript, sizeof transcript);
    BT_CHECK_MSG(rc == 0, "answer y: exit %d; transcript:\n%s", rc, transcript);
    check_conf(conf);
    now = slurp(bak, NULL);
    BT_CHECK(now && !strcmp(now, old_conf));
    free(now);
    BT_CHECK_EQ_INT(count_files(dir), 2);
}

static void test_split_words(void)
{
    char **w;
    size_t n;
    char err[256];
    BT_CHECK(bt_recipe_split_words("a  'b c' \"d \\\"e\\\"\" f\\ g '{\"num_threads\":1}' '' x\"y\"z", 64, &w, &n,
                                   err, sizeof err) == BT_OK);
    const char *want[] = {"a", "b c", "d \"e\"", "f g", "{\"num_threads\":1}", "", "xyz"};
    BT_CHECK_EQ_INT(n, 7);
    for (size_t i = 0; i < n && i < 7; i++) BT_CHECK_MSG(!strcmp(w[i], want[i]), "word %zu = '%s'", i, w[i]);
    bt_recipe_free_words(w, n);
    BT_CHECK(bt_recipe_split_words("$(rm -rf /) `x` ; | &&", 64, &w, &n, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(n, 7); /* no expansion, no operators: just words */
    BT_CHECK(n > 0 && !strcmp(w[0], "$(rm"));
    bt_recipe_free_words(w, n);
    BT_CHECK(bt_recipe_split_words("a 'b", 64, &w, &n, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(err, "single quote") != NULL);
    BT_CHECK(bt_recipe_split_words("a \"b", 64, &w, &n, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(bt_recipe_split_words("a b c", 2, &w, &n, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(bt_recipe_split_words("", 2, &w, &n, err, sizeof err) == BT_OK && n == 0);
    bt_recipe_free_words(w, n);
}

static void test_mapping(void)
{
    const char *doc = "{\"command\": \"serve --tp=2 --foo bar --trust-remote-code stray --enable-cache-report "
                      "--port 80 --tp 8 --bare\", \"env\": \"Note: NCCL_DEBUG=INFO, UCX_TLS=rc,sm "
                      "LD_PRELOAD=/x.so DSV41_MAX_NEW_TOKENS=100\", \"extra\": 1}";
    bt_recipe_t *r = NULL;
    char err[512];
    BT_CHECK(bt_recipe_parse(doc, strlen(doc), &r, err, sizeof err) == BT_OK);
    if (!r) return;
    BT_CHECK(!strcmp(bt_recipe_get(r, "tp"), "8")); /* last one wins */
    BT_CHECK(!strcmp(bt_recipe_get(r, "port"), "80"));
    BT_CHECK(!strcmp(bt_recipe_get(r, "enable-cache-report"), "true"));
    BT_CHECK(!strcmp(bt_recipe_get(r, "env.NCCL_DEBUG"), "INFO"));
    BT_CHECK(!strcmp(bt_recipe_get(r, "ucx-tls"), "rc,sm"));
    BT_CHECK(!strcmp(bt_recipe_get(r, "max-new-tokens"), "100"));
    BT_CHECK(bt_recipe_get(r, "env.LD_PRELOAD") == NULL); /* never passed through */
    BT_CHECK_EQ_INT(r->n_unknown, 4);
    if (r->n_unknown == 4) {
        BT_CHECK(!strcmp(r->unknown[0], "--foo bar"));
        BT_CHECK(!strcmp(r->unknown[1], "stray"));
        BT_CHECK(!strcmp(r->unknown[2], "--bare"));
        BT_CHECK(!strcmp(r->unknown[3], "field 'extra'"));
    }
    bool ld = false;
    for (size_t i = 0; i < r->n_ignored; i++) ld |= !strcmp(r->ignored[i].name, "env LD_PRELOAD");
    BT_CHECK(ld);
    char *text = bt_recipe_render_config(r, "test\nsource");
    bt_conf_t *c = NULL;
    BT_CHECK(bt_conf_parse(text, strlen(text), "rendered", &c, err, sizeof err) == BT_OK);
    BT_CHECK(c && !strcmp(bt_conf_get(c, "env", "NCCL_DEBUG"), "INFO"));
    bt_conf_destroy(c);
    free(text);
    bt_recipe_destroy(r);

    static const char *bad[][2] = {
        {"{\"command\": \"x --tp\"}", "--tp needs a value"},
        {"{\"command\": \"x --port 70000\"}", "not a TCP port"},
        {"{\"command\": \"x --host 'a\\nb'\"}", "control character"},
        {"{\"command\": \"x --enable-cache-report=maybe\"}", "takes no value"},
        {"{\"title\": \"no command\"}", "'command' is missing"},
        {"{\"command\": \"x\", \"env\": [1]}", "'env' must be a string"},
        {"{\"command\": \"x\"} trailing", "trailing bytes"},
        {"{\"command\": \"x '\"}", "unterminated single quote"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        r = NULL;
        BT_CHECK_MSG(bt_recipe_parse(bad[i][0], strlen(bad[i][0]), &r, err, sizeof err) != BT_OK, "%s", bad[i][0]);
        BT_CHECK_MSG(strstr(err, bad[i][1]) != NULL, "%s: '%s' lacks '%s'", bad[i][0], err, bad[i][1]);
        bt_recipe_destroy(r);
    }
}

static void test_config_parser(void)
{
    bt_conf_t *c = NULL;
    char err[512];
    const char *good = "# c\ntp = 2\n\n[decode]\nthreads = 3\n[env]\nNCCL_DEBUG = WARN\n[cluster]\n  host =  10.0.0.1  \r\n";
    BT_CHECK(bt_conf_parse(good, strlen(good), "g", &c, err, sizeof err) == BT_OK);
    BT_CHECK(c && !strcmp(bt_conf_get(c, "cluster", "tp"), "2"));
    BT_CHECK(c && !strcmp(bt_conf_get(c, "decode", "threads"), "3"));
    BT_CHECK(c && !strcmp(bt_conf_get(c, "cluster", "host"), "10.0.0.1"));
    BT_CHECK(c && bt_conf_get(c, "cluster", "threads") == NULL);
    bt_conf_destroy(c);
    static const char *bad[][2] = {
        {"tpp = 2\n", "g:1: unknown key 'tpp'"},
        {"\ntp = two\n", "g:2: tp: expected a non-negative integer"},
        {"tp = 1\ntp = 2\n", "set twice (first on line 1)"},
        {"[worker]\n", "unknown section [worker]"},
        {"[env]\nLD_PRELOAD = /x.so\n", "only NCCL_*, UCX_*"},
        {"just words\n", "expected 'key = value'"},
        {"mem-fraction-static = 1.5\n", "must be in (0, 1]"},
        {"[decode]\nBad Key = 1\n", "is not a flag name"},
    };
    /* the documented example reads back */
    c = NULL;
    BT_CHECK_MSG(bt_conf_load(BT_TEST_DATA_DIR "/../../deploy/baton.conf.example", &c, err, sizeof err) == BT_OK, "%s",
                 err);
    BT_CHECK(c && !strcmp(bt_conf_get(c, "cluster", "speculative-dspark-block-size"), "5"));
    bt_conf_destroy(c);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = NULL;
        err[0] = 0;
        BT_CHECK(bt_conf_parse(bad[i][0], strlen(bad[i][0]), "g", &c, err, sizeof err) != BT_OK);
        BT_CHECK_MSG(strstr(err, bad[i][1]) != NULL, "'%s' lacks '%s'", err, bad[i][1]);
        BT_CHECK(c == NULL);
    }
}

int main(void)
{
    /* talk to 127.0.0.1 directly, whatever the environment says about proxies */
    unsetenv("http_proxy");
    unsetenv("HTTP_PROXY");
    unsetenv("https_proxy");
    unsetenv("HTTPS_PROXY");
    unsetenv("all_proxy");
    unsetenv("ALL_PROXY");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/bt-recipe-XXXXXX");
    BT_ASSERT(mkdtemp(tmpdir) != NULL);
    snprintf(baton, sizeof baton, "%s/baton", BT_BIN_DIR);
    pthread_t t = server_start();
    BT_RUN(test_split_words);
    BT_RUN(test_mapping);
    BT_RUN(test_config_parser);
    BT_RUN(test_apply_over_http);
    BT_RUN(test_apply_errors);
    BT_RUN(test_existing_config);
    BT_RUN(test_existing_config_on_a_terminal);
    srv_stop = 1;
    pthread_join(t, NULL);
    close(srv_fd);
    free(recipe_body);
    if (!bt_test_failures) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return bt_test_summary();
}

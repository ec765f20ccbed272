/* baton doctor on this host (no GPU needed): a config it can serve passes with warnings only;
 * a missing model, a port in use and an absent RoCE device are each MISSING with a fix and
 * a non-zero exit. */
#include "bt_test.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

static int run(char *const argv[], char **out_p)
{
    char out[128];
    snprintf(out, sizeof out, "%s/.out", tmpdir);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out, "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    *out_p = slurp(out);
    unlink(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A listening socket on 127.0.0.1 (the caller closes it); its port through port_p. */
static int listen_any(int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0) return -1;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *port_p = ntohs(sa.sin_port);
    return fd;
}

static int free_port(void)
{
    int port = 0, fd = listen_any(&port);
    close(fd);
    return port;
}

static char *doctor(const char *conf_text, int *rc_p)
{
    char conf[128];
    snprintf(conf, sizeof conf, "%s/baton.conf", tmpdir);
    FILE *f = fopen(conf, "w");
    fputs(conf_text, f);
    fclose(f);
    char *argv[] = {baton, "doctor", "--config", conf, NULL};
    char *out = NULL;
    *rc_p = run(argv, &out);
    return out ? out : strdup("");
}

static void test_doctor(void)
{
    char model[128], cmd[1024];
    snprintf(model, sizeof model, "%s/model", tmpdir);
    char *mk[] = {baton, "make-demo-model", "--output", model, NULL};
    char *out = NULL;
    BT_CHECK_EQ_INT(run(mk, &out), 0);
    free(out);

    int rc;
    snprintf(cmd, sizeof cmd, "model-path = %s\nhost = 127.0.0.1\nport = %d\nrouter-port = %d\n", model, free_port(),
             free_port());
    out = doctor(cmd, &rc);
    BT_CHECK_MSG(rc == 0, "a servable config: exit %d\n%s", rc, out);
    BT_CHECK(strstr(out, "NVIDIA driver") && strstr(out, "UCX transports") && strstr(out, "KV pool") &&
             strstr(out, "memory") && strstr(out, "0 missing"));
    if (access("/proc/driver/nvidia/version", F_OK) != 0 && system("command -v nvidia-smi >/dev/null 2>&1") != 0)
        BT_CHECK(strstr(out, "WARN     NVIDIA driver      no NVIDIA driver: the CPU backend runs, CUDA does not"));
    free(out);

    out = doctor("model-path = /nonexistent/DeepSeek-V4.1-Flash\nport = 0\nrouter-port = 0\n", &rc);
    BT_CHECK_EQ_INT(rc, 1);
    BT_CHECK(strstr(out, "MISSING  model") && strstr(out, "fix: download the checkpoint"));
    free(out);

    int busy = 0, fd = listen_any(&busy);
    snprintf(cmd, sizeof cmd, "model-path = %s\nhost = 127.0.0.1\nport = %d\nrouter-port = 0\n", model, busy);
    out = doctor(cmd, &rc);
    BT_CHECK_EQ_INT(rc, 1);
    BT_CHECK_MSG(strstr(out, "MISSING  port") && strstr(out, "set port to a free port"), "%s", out);
    free(out);
    close(fd);

    snprintf(cmd, sizeof cmd, "model-path = %s\nport = 0\nrouter-port = 0\nucx-net-devices = nosuchhca0:1\n", model);
    out = doctor(cmd, &rc);
    BT_CHECK_EQ_INT(rc, 1);
    BT_CHECK(strstr(out, "MISSING  RoCE devices") && strstr(out, "nosuchhca0"));
    free(out);

    out = doctor("tp = two\n", &rc);
    BT_CHECK_EQ_INT(rc, 1);
    BT_CHECK(strstr(out, "MISSING  config") && strstr(out, "tp: expected"));
    free(out);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/bt-doctor-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    snprintf(baton, sizeof baton, "%s/baton", BT_BIN_DIR);
    BT_RUN(test_doctor);
    if (!bt_test_failures) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return bt_test_summary();
}

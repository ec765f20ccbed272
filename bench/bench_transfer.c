/* Push bandwidth of common/transfer between two processes on this machine, next to what
 * ucx_perftest (package ucx-utils) gets from the same UCX transports.
 *
 *   bench_transfer [--tls tcp|sm|...] [--mib-per-size 256] [--no-perftest]
 *
 * For each message size (64 KiB .. 64 MiB) the sender (this process) writes into a 64 MiB
 * region of a receiver (this binary re-executed with --receiver) in two patterns:
 *   stream: back-to-back puts of the size, one commit at the end (what ucp_put_bw measures)
 *   commit: put + commit per message, each commit waited for (the KV handoff pattern:
 *           flush to remote completion, then the notice)
 * Time runs from the first put to the last commit's on_done. ucx_perftest -t ucp_put_bw
 * runs with the same UCX_TLS / UCX_NET_DEVICES=lo and the same bytes per size.
 * Needs bt_transfer linked into the benchmarks (bench/CMakeLists.txt). */
#include "common/transfer/transfer.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#define MIB (1024u * 1024u)
#define REGION (64 * MIB)

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 20000) <= 0)
            return -1;
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static bt_xfer_options_t opts_for(const char *tls)
{
    bt_xfer_options_t o = {.kind = BT_XFER_UCX, .ucx_tls = tls, .net_devices = "lo",
                           .keepalive_ms = 1000};
    return o;
}

/* ---- receiver ------------------------------------------------------------------------------ */

static void on_stdin_eof(uv_poll_t *h, int status, int events)
{
    uv_stop(h->loop);
}

static int receiver_main(const char *tls)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = opts_for(tls);
    bt_xfer_t *x;
    if (bt_xfer_create(&loop, &o, &x) != BT_OK)
        return 2;
    uint8_t *region = calloc(1, REGION);
    bt_xfer_region_t *r;
    if (!region || bt_xfer_register(x, region, REGION, &r) != BT_OK)
        return 2;
    const uint8_t *desc;
    size_t len;
    bt_xfer_region_desc(r, &desc, &len);
    uint32_t n = (uint32_t)len;
    if (write_all(1, &n, 4) || write_all(1, desc, len))
        return 2;
    uv_poll_t in; /* the sender closes our stdin when done */
    uv_poll_init(&loop, &in, 0);
    uv_poll_start(&in, UV_READABLE | UV_DISCONNECT, on_stdin_eof);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&in, NULL);
    bt_xfer_deregister(r);
    bt_xfer_destroy(x);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(region);
    return 0;
}

/* ---- sender -------------------------------------------------------------------------------- */

typedef struct {
    int done;
    bt_status_t st;
} wait_t;

static void on_done(void *ctx, bt_status_t st)
{
    wait_t *w = ctx;
    w->done++;
    if (st != BT_OK)
        w->st = st;
}

static void on_error(void *ctx, bt_status_t st)
{
    fprintf(stderr, "bench_transfer: peer failed: %s\n", bt_status_str(st));
    exit(1);
}

static void wait_done(uv_loop_t *loop, wait_t *w, int target)
{
    while (w->done < target)
        uv_run(loop, UV_RUN_ONCE);
    if (w->st != BT_OK) {
        fprintf(stderr, "bench_transfer: commit failed: %s\n", bt_status_str(w->st));
        exit(1);
    }
}

/* GB/s (1e9 bytes/s) for iters messages of size, in one of the two patterns. */
static double run_pattern(uv_loop_t *loop, bt_xfer_peer_t *p, const uint8_t *src, size_t size,
                          int iters, bool commit_each)
{
    wait_t w = {0, BT_OK};
    uint8_t notice[16] = {0};
    uint64_t t0 = uv_hrtime();
    size_t off = 0;
    for (int i = 0; i < iters; i++) {
        if (bt_xfer_put(p, off, src + off, size) != BT_OK) {
            fprintf(stderr, "bench_transfer: put failed\n");
            exit(1);
        }
        off = (off + size) % REGION;
        if (commit_each) {
            bt_xfer_commit(p, notice, sizeof(notice), on_done, &w);
            wait_done(loop, &w, i + 1);
        } else if (i % 16 == 15) {
            uv_run(loop, UV_RUN_NOWAIT); /* let the receiver side of the loop breathe */
        }
    }
    if (!commit_each) {
        bt_xfer_commit(p, notice, sizeof(notice), on_done, &w);
        wait_done(loop, &w, 1);
    }
    double s = (double)(uv_hrtime() - t0) / 1e9;
    return (double)size * iters / s / 1e9;
}

/* ucx_perftest -t ucp_put_bw, server + client on loopback; GB/s or -1. */
static double perftest(const char *tls, size_t size, int iters)
{
    char s_size[32], s_iters[32], env_tls[64];
    snprintf(s_size, sizeof(s_size), "%zu", size);
    snprintf(s_iters, sizeof(s_iters), "%d", iters);
    snprintf(env_tls, sizeof(env_tls), "UCX_TLS=%s", tls);
    setenv("UCX_TLS", tls, 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    char *srv_argv[] = {"ucx_perftest", "-t", "ucp_put_bw", "-s", s_size, "-n", s_iters,
                        "-p", "13377", NULL};
    pid_t srv;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 1, 0);
    int rc = posix_spawnp(&srv, "ucx_perftest", &fa, NULL, srv_argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    usleep(500000);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "ucx_perftest 127.0.0.1 -t ucp_put_bw -s %zu -n %d -p 13377 2>&1",
             size, iters);
    FILE *f = popen(cmd, "r");
    double mbs = -1;
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        /* Final: iterations  latency(typ avg overall)  bandwidth(avg overall)  msgrate ... */
        if (strncmp(line, "Final:", 6) == 0) {
            double v[8];
            if (sscanf(line + 6, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6], &v[7]) == 8)
                mbs = v[4]; /* average bandwidth, MB/s (2^20 bytes) */
        }
    }
    if (f)
        pclose(f);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
    return mbs < 0 ? -1 : mbs * MIB / 1e9;
}

int main(int argc, char **argv)
{
    const char *tls = "tcp";
    size_t mib_per_size = 256;
    bool with_perftest = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--receiver") && i + 1 < argc)
            return receiver_main(argv[i + 1]);
        else if (!strcmp(argv[i], "--tls") && i + 1 < argc)
            tls = argv[++i];
        else if (!strcmp(argv[i], "--mib-per-size") && i + 1 < argc)
            mib_per_size = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--no-perftest"))
            with_perftest = false;
        else {
            fprintf(stderr, "usage: %s [--tls tcp|sm] [--mib-per-size N] [--no-perftest]\n",
                    argv[0]);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);

    int out[2], in[2];
    if (pipe(out) || pipe(in))
        return 1;
    pid_t child = fork();
    if (child == 0) {
        dup2(out[1], 1);
        dup2(in[0], 0);
        close(out[0]);
        close(in[1]);
        execl("/proc/self/exe", argv[0], "--receiver", tls, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(in[0]);
    uint32_t dlen;
    uint8_t desc[65536];
    if (read_all(out[0], &dlen, 4) || dlen > sizeof(desc) || read_all(out[0], desc, dlen)) {
        fprintf(stderr, "bench_transfer: no descriptor from the receiver\n");
        return 1;
    }

    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = opts_for(tls);
    bt_xfer_t *x;
    bt_xfer_peer_t *p;
    if (bt_xfer_create(&loop, &o, &x) != BT_OK ||
        bt_xfer_connect(x, desc, dlen, on_error, NULL, &p) != BT_OK)
        return 1;
    uint8_t *src = malloc(REGION);
    for (size_t i = 0; i < REGION; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    /* warm up: the connection, the registration cache */
    run_pattern(&loop, p, src, 1 * MIB, 64, false);

    printf("UCX_TLS=%s, two processes, %zu MiB per size; GB/s = 1e9 bytes/s\n", tls, mib_per_size);
    printf("| size | bt_xfer stream | bt_xfer put+commit each | ucx_perftest ucp_put_bw |\n");
    printf("|---:|---:|---:|---:|\n");
    fflush(stdout);
    for (size_t size = 64 * 1024; size <= 64 * MIB; size *= 4) {
        int iters = (int)(mib_per_size * MIB / size);
        if (iters < 4)
            iters = 4;
        double stream = run_pattern(&loop, p, src, size, iters, false);
        double each = run_pattern(&loop, p, src, size, iters, true);
        double ref = with_perftest ? perftest(tls, size, iters) : -1;
        char refs[32] = "n/a";
        if (ref > 0)
            snprintf(refs, sizeof(refs), "%.2f", ref);
        char label[16];
        if (size >= MIB)
            snprintf(label, sizeof(label), "%zu MiB", size / MIB);
        else
            snprintf(label, sizeof(label), "%zu KiB", size / 1024);
        printf("| %s | %.2f | %.2f | %s |\n", label, stream, each, refs);
        fflush(stdout);
    }
    bt_xfer_disconnect(p);
    bt_xfer_destroy(x);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    close(in[1]); /* the receiver exits */
    waitpid(child, NULL, 0);
    free(src);
    return 0;
}

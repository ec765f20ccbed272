/* An LD_PRELOAD shim for the cluster tests: it makes a TP group leader's idle heartbeat (the
 * NOOP plan it broadcasts to its other ranks, services/common/tp_group.c) take
 * BT_TEST_HEARTBEAT_DELAY_MS milliseconds, and touches the file BT_TEST_HEARTBEAT_MARK when
 * one starts, so that a test can send a request while the leader is inside a heartbeat
 * (a race that is otherwise a few microseconds wide). Every other sendmsg passes through.
 *
 * It knows the socket comm's wire format (common/comm/socket.c: a 24-byte header of magic
 * "BTCM", op | root << 8, sequence, payload length; then the payload) and the plan header
 * (op first; NOOP = 0; 32 bytes). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int is_noop_plan(const struct msghdr *m)
{
    if (m->msg_iovlen != 2 || m->msg_iov[0].iov_len != 24 || m->msg_iov[1].iov_len != 32) return 0;
    const unsigned char *h = m->msg_iov[0].iov_base, *plan = m->msg_iov[1].iov_base;
    return get_le(h, 4) == 0x4d435442u && get_le(h + 4, 4) == 3 /* broadcast from rank 0 */ &&
           get_le(h + 16, 8) == 32 && get_le(plan, 4) == 0 /* NOOP */;
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    static ssize_t (*real)(int, const struct msghdr *, int);
    static int64_t last_end = -1000000;
    if (!real) real = (ssize_t (*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    const char *delay = getenv("BT_TEST_HEARTBEAT_DELAY_MS");
    /* one delay per heartbeat: its sends to the other ranks follow at once */
    if (delay && msg && is_noop_plan(msg) && now_ms() - last_end > 100) {
        const char *mark = getenv("BT_TEST_HEARTBEAT_MARK");
        if (mark) {
            int m = open(mark, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (m >= 0) close(m);
        }
        long ms = atol(delay);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
        last_end = now_ms();
    }
    return real(fd, msg, flags);
}

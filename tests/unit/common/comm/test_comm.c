/* Collectives: the threads backend (1-4 ranks as threads) and the socket backend (2 and 4
 * ranks as forked processes on 127.0.0.1) run the same checks: all-reduce equal bit for bit to
 * a rank-ordered reference on every rank, all-gather (also in place), broadcast from every
 * root, barriers, sizes 0 / 1 / odd / several MB. Then failures: a rank that never arrives, a
 * rank killed with SIGKILL in the middle of collectives (a non-root one, then rank 0): the
 * others fail with BT_ERR_PEER within the timeout and nothing hangs. */
#include "bt_test.h"

#include "common/comm/comm.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's i-th input: finite, random sign, magnitudes from 2^-12 to 2^12, so that the order
 * of the additions shows in the low bits. */
static float gen_f32(uint64_t seed, int rank, size_t i)
{
    uint64_t h = mix(seed * 1000003u + (uint64_t)rank * 0x100000001b3ull + i);
    float m = 1.0f + (float)(h & 0xffffff) / (float)0x1000000;
    int e = (int)((h >> 24) % 25) - 12;
    float v = ldexpf(m, e);
    return (h >> 63) ? -v : v;
}

static unsigned char gen_u8(uint64_t seed, int rank, size_t i)
{
    return (unsigned char)mix(seed ^ ((uint64_t)rank << 48) ^ i);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "rank %d: ", rank);                                                        \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        fails++;                                                                                   \
    } while (0)

/* Everything a healthy group must do; returns the number of failed checks on this rank. */
static int run_checks(bt_comm_t *c)
{
    int rank = bt_comm_rank(c), n = bt_comm_size(c), fails = 0;
    static const size_t f32_sizes[] = {0, 1, 7, 4097, (3u << 20) / 4 + 3}; /* last: ~3 MB */
    for (size_t k = 0; k < sizeof f32_sizes / sizeof f32_sizes[0]; k++) {
        size_t m = f32_sizes[k];
        uint64_t seed = 100 + k;
        float *buf = malloc(m * sizeof *buf + 1), *ref = malloc(m * sizeof *ref + 1);
        for (size_t i = 0; i < m; i++) {
            buf[i] = gen_f32(seed, rank, i);
            float s = gen_f32(seed, 0, i); /* rank 0's + rank 1's + ... in rank order */
            for (int r = 1; r < n; r++) s += gen_f32(seed, r, i);
            ref[i] = s;
        }
        bt_status_t st = bt_comm_all_reduce_f32(c, m ? buf : NULL, m);
        if (st != BT_OK) FAIL("all_reduce(%zu): %s", m, bt_status_str(st));
        else if (m && memcmp(buf, ref, m * sizeof *buf) != 0)
            FAIL("all_reduce(%zu) differs from the rank-ordered reference", m);
        free(buf);
        free(ref);
    }

    static const size_t byte_sizes[] = {0, 1, 13, 3u << 20};
    for (size_t k = 0; k < sizeof byte_sizes / sizeof byte_sizes[0]; k++) {
        size_t m = byte_sizes[k];
        uint64_t seed = 200 + k;
        unsigned char *send = malloc(m + 1), *recv = malloc(m * (size_t)n + 1);
        for (size_t i = 0; i < m; i++) send[i] = gen_u8(seed, rank, i);
        memset(recv, 0xee, m * (size_t)n);
        for (int in_place = 0; in_place < 2; in_place++) {
            const unsigned char *src = send;
            if (in_place) {
                memset(recv, 0xee, m * (size_t)n);
                memcpy(recv + (size_t)rank * m, send, m);
                src = recv + (size_t)rank * m;
            }
            bt_status_t st = bt_comm_all_gather(c, m ? src : NULL, m, m ? recv : NULL);
            if (st != BT_OK) {
                FAIL("all_gather(%zu%s): %s", m, in_place ? ", in place" : "", bt_status_str(st));
                continue;
            }
            size_t bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < m; i++) bad += recv[(size_t)r * m + i] != gen_u8(seed, r, i);
            if (bad) FAIL("all_gather(%zu%s): %zu wrong bytes", m, in_place ? ", in place" : "", bad);
        }
        free(send);
        free(recv);
    }

    static const size_t bcast_sizes[] = {0, 5, 2u << 20};
    for (size_t k = 0; k < sizeof bcast_sizes / sizeof bcast_sizes[0]; k++) {
        size_t m = bcast_sizes[k];
        unsigned char *buf = malloc(m + 1);
        for (int root = 0; root < n; root++) {
            uint64_t seed = 300 + k * 16 + (uint64_t)root;
            for (size_t i = 0; i < m; i++) buf[i] = rank == root ? gen_u8(seed, root, i) : 0x5a;
            bt_status_t st = bt_comm_broadcast(c, m ? buf : NULL, m, root);
            if (st != BT_OK) {
                FAIL("broadcast(%zu, root %d): %s", m, root, bt_status_str(st));
                continue;
            }
            size_t bad = 0;
            for (size_t i = 0; i < m; i++) bad += buf[i] != gen_u8(seed, root, i);
            if (bad) FAIL("broadcast(%zu, root %d): %zu wrong bytes", m, root, bad);
        }
        free(buf);
    }

    for (int i = 0; i < 5; i++) {
        bt_status_t st = bt_comm_barrier(c);
        if (st != BT_OK) FAIL("barrier %d: %s", i, bt_status_str(st));
    }
    /* many small all-reduces in a row: decode-shaped traffic, order kept */
    for (int it = 0; it < 200; it++) {
        float v[3] = {(float)rank, 1.0f, (float)it};
        bt_status_t st = bt_comm_all_reduce_f32(c, v, 3);
        if (st != BT_OK || v[0] != (float)(n * (n - 1) / 2) || v[1] != (float)n ||
            v[2] != (float)(it * n)) {
            FAIL("small all_reduce %d: %s", it, bt_status_str(st));
            break;
        }
    }
    return fails;
}

/* Bad arguments are refused locally, before any communication; the group goes on. */
static void check_bad_args(bt_comm_t *c)
{
    unsigned char one = 1;
    float f = 1;
    int n = bt_comm_size(c);
    bt_log_level_t level = bt_log_get_level();
    bt_log_set_level(BT_LOG_OFF);
    BT_CHECK_EQ_INT(bt_comm_broadcast(c, &one, 1, n), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_broadcast(c, &one, 1, -1), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_broadcast(c, NULL, 1, 0), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_all_reduce_f32(c, NULL, 1), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_all_reduce_f32(c, &f, SIZE_MAX / 2), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_all_gather(c, &one, 1, NULL), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_set_timeout_ms(c, 0), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_set_timeout_ms(NULL, 1), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_threads_create(0, NULL), BT_ERR_INVALID_ARG);
    bt_log_set_level(level);
    BT_CHECK_EQ_INT(bt_comm_all_reduce_f32(c, &f, 1), BT_OK);
    BT_CHECK(f == 1.0f);
    BT_CHECK_EQ_INT(bt_comm_barrier(c), BT_OK);
}

static void test_bad_args(void)
{
    bt_comm_t *c = NULL;
    BT_CHECK_EQ_INT(bt_comm_threads_create(1, &c), BT_OK);
    check_bad_args(c);
    bt_comm_destroy(c);
    c = NULL;
    BT_CHECK_EQ_INT(bt_comm_socket_create(0, 1, "127.0.0.1:1", 1000, &c), BT_OK);
    if (c) check_bad_args(c);
    bt_comm_destroy(c);
    unsigned char id[BT_COMM_NCCL_ID_BYTES];
    if (bt_comm_nccl_unique_id(id) == BT_ERR_UNSUPPORTED) { /* CPU build */
        bt_log_level_t level = bt_log_get_level();
        bt_log_set_level(BT_LOG_OFF);
        BT_CHECK_EQ_INT(bt_comm_nccl_create(0, 1, id, NULL, &c), BT_ERR_UNSUPPORTED);
        bt_log_set_level(level);
    }
}

/* ---- threads ------------------------------------------------------------------------------- */

typedef struct {
    bt_comm_t *comm;
    int fails;
    int skip;            /* this rank never calls (failure test) */
    bt_status_t st;      /* failure test: what the collective returned */
    int64_t elapsed_ms;
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    a->fails = run_checks(a->comm);
    return NULL;
}

static void run_threads(int n)
{
    bt_comm_t *comms[4];
    BT_CHECK_EQ_INT(bt_comm_threads_create(n, comms), BT_OK);
    pthread_t th[4];
    rank_arg_t args[4];
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg_t){.comm = comms[r]};
        BT_CHECK_EQ_INT(bt_comm_rank(comms[r]), r);
        BT_CHECK_EQ_INT(bt_comm_size(comms[r]), n);
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        BT_CHECK_MSG(args[r].fails == 0, "%d ranks: rank %d had %d failures", n, r, args[r].fails);
        bt_comm_destroy(comms[r]);
    }
}

static void test_threads_1(void) { run_threads(1); }
static void test_threads_2(void) { run_threads(2); }
static void test_threads_3(void) { run_threads(3); }
static void test_threads_4(void) { run_threads(4); }

static void *late_rank_main(void *p)
{
    rank_arg_t *a = p;
    if (a->skip) return NULL; /* never arrives */
    float v[4] = {1, 2, 3, 4};
    int64_t t0 = now_ms();
    a->st = bt_comm_all_reduce_f32(a->comm, v, 4);
    a->elapsed_ms = now_ms() - t0;
    return NULL;
}

/* Rank 2 of 3 never calls: the others get BT_ERR_PEER after their timeout, not a hang; the
 * group stays broken afterwards, for the late rank too. */
static void test_threads_rank_never_arrives(void)
{
    enum { N = 3, TIMEOUT_MS = 300 };
    bt_comm_t *comms[N];
    BT_CHECK_EQ_INT(bt_comm_threads_create(N, comms), BT_OK);
    pthread_t th[N];
    rank_arg_t args[N];
    bt_log_level_t level = bt_log_get_level();
    bt_log_set_level(BT_LOG_OFF);
    for (int r = 0; r < N; r++) {
        BT_CHECK_EQ_INT(bt_comm_set_timeout_ms(comms[r], TIMEOUT_MS), BT_OK);
        args[r] = (rank_arg_t){.comm = comms[r], .skip = r == 2};
        pthread_create(&th[r], NULL, late_rank_main, &args[r]);
    }
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        BT_CHECK_EQ_INT(args[r].st, BT_ERR_PEER);
        BT_CHECK_MSG(args[r].elapsed_ms >= TIMEOUT_MS - 20 && args[r].elapsed_ms < 5 * TIMEOUT_MS,
                     "rank %d failed after %lld ms", r, (long long)args[r].elapsed_ms);
    }
    float v = 1;
    BT_CHECK_EQ_INT(bt_comm_all_reduce_f32(comms[2], &v, 1), BT_ERR_PEER);
    BT_CHECK_EQ_INT(bt_comm_barrier(comms[0]), BT_ERR_PEER);
    bt_log_set_level(level);
    for (int r = 0; r < N; r++) bt_comm_destroy(comms[r]);
    BT_CHECK_EQ_INT(bt_comm_set_timeout_ms(NULL, 1), BT_ERR_INVALID_ARG);
    bt_comm_destroy(NULL);
}

/* A rank that leaves (destroys its handle) while the others wait fails them at once. */
static void *leaver_main(void *p)
{
    rank_arg_t *a = p;
    if (a->skip) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        bt_comm_destroy(a->comm);
        return NULL;
    }
    int64_t t0 = now_ms();
    a->st = bt_comm_barrier(a->comm);
    a->elapsed_ms = now_ms() - t0;
    return NULL;
}

static void test_threads_rank_leaves(void)
{
    enum { N = 2 };
    bt_comm_t *comms[N];
    BT_CHECK_EQ_INT(bt_comm_threads_create(N, comms), BT_OK);
    bt_log_level_t level = bt_log_get_level();
    bt_log_set_level(BT_LOG_OFF);
    pthread_t th[N];
    rank_arg_t args[N];
    for (int r = 0; r < N; r++) {
        args[r] = (rank_arg_t){.comm = comms[r], .skip = r == 1};
        pthread_create(&th[r], NULL, leaver_main, &args[r]);
    }
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
    bt_log_set_level(level);
    BT_CHECK_EQ_INT(args[0].st, BT_ERR_PEER);
    BT_CHECK_MSG(args[0].elapsed_ms < 10000, "failed after %lld ms", (long long)args[0].elapsed_ms);
    bt_comm_destroy(comms[0]);
}

/* ---- sockets ------------------------------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

typedef int (*child_fn)(bt_comm_t *c, void *ctx);

/* Exit codes of a socket-test child. */
enum { CHILD_OK = 0, CHILD_FAILED = 1, CHILD_CREATE = 2, CHILD_NOT_PEER = 3, CHILD_TOO_SLOW = 4 };

/* Forks n ranks running fn after the rendezvous; each exits with fn's code. */
static void fork_ranks(int n, int timeout_ms, child_fn fn, void *ctx, pid_t *pids)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            bt_comm_t *c = NULL;
            bt_status_t st = bt_comm_socket_create(r, n, addr, timeout_ms, &c);
            if (st != BT_OK) {
                fprintf(stderr, "rank %d: socket_create: %s\n", r, bt_status_str(st));
                _exit(CHILD_CREATE);
            }
            int code = fn(c, ctx);
            bt_comm_destroy(c);
            _exit(code);
        }
        pids[r] = pid;
    }
}

/* Waits for every child, at most limit_ms in all (then SIGKILLs what is left: a hang is a
 * failure, never a stuck test). Codes: exit status, or 128 + signal. */
static void wait_ranks(int n, pid_t *pids, int *codes, int limit_ms)
{
    int64_t end = now_ms() + limit_ms;
    int left = n;
    for (int r = 0; r < n; r++) codes[r] = -1;
    while (left > 0) {
        for (int r = 0; r < n; r++) {
            if (codes[r] != -1) continue;
            int ws;
            pid_t p = waitpid(pids[r], &ws, WNOHANG);
            if (p == pids[r]) {
                codes[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
                left--;
            }
        }
        if (left == 0) break;
        if (now_ms() > end) {
            for (int r = 0; r < n; r++)
                if (codes[r] == -1) {
                    fprintf(stderr, "rank %d hung: killing it\n", r);
                    kill(pids[r], SIGKILL);
                }
            end = INT64_MAX;
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int child_checks(bt_comm_t *c, void *ctx)
{
    (void)ctx;
    return run_checks(c) ? CHILD_FAILED : CHILD_OK;
}

static void run_sockets(int n)
{
    pid_t pids[4];
    int codes[4];
    fork_ranks(n, 20000, child_checks, NULL, pids);
    wait_ranks(n, pids, codes, 120000);
    for (int r = 0; r < n; r++) BT_CHECK_MSG(codes[r] == CHILD_OK, "rank %d exit %d", r, codes[r]);
}

static void test_sockets_1(void)
{
    bt_comm_t *c = NULL;
    BT_CHECK_EQ_INT(bt_comm_socket_create(0, 1, "127.0.0.1:1", 1000, &c), BT_OK);
    if (c) BT_CHECK_EQ_INT(run_checks(c), 0);
    bt_comm_destroy(c);
}

static void test_sockets_2(void) { run_sockets(2); }
static void test_sockets_4(void) { run_sockets(4); }

static void test_sockets_bad_args(void)
{
    bt_comm_t *c = NULL;
    bt_log_level_t level = bt_log_get_level();
    bt_log_set_level(BT_LOG_OFF);
    BT_CHECK_EQ_INT(bt_comm_socket_create(0, 2, "127.0.0.1", 1000, &c), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_socket_create(0, 2, "127.0.0.1:70000", 1000, &c), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_socket_create(2, 2, "127.0.0.1:5000", 1000, &c), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_comm_socket_create(0, 2, NULL, 1000, &c), BT_ERR_INVALID_ARG);
    BT_CHECK(c == NULL);
    /* nobody listening: a non-root rank gives up after its timeout */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    int64_t t0 = now_ms();
    BT_CHECK_EQ_INT(bt_comm_socket_create(1, 2, addr, 300, &c), BT_ERR_PEER);
    int64_t dt = now_ms() - t0;
    BT_CHECK_MSG(dt >= 280 && dt < 3000, "gave up after %lld ms", (long long)dt);
    /* nobody joining: rank 0 gives up after its timeout */
    t0 = now_ms();
    BT_CHECK_EQ_INT(bt_comm_socket_create(0, 3, addr, 300, &c), BT_ERR_PEER);
    dt = now_ms() - t0;
    BT_CHECK_MSG(dt >= 280 && dt < 3000, "gave up after %lld ms", (long long)dt);
    bt_log_set_level(level);
}

/* Children that loop over collectives until one fails; they report whether it failed with
 * BT_ERR_PEER, and how fast after the group broke. */
typedef struct {
    int victim;    /* rank that stalls (pause) instead of calling, for the stall test; -1 */
    int bound_ms;  /* the failure must come within this after the last success */
    volatile int *iters; /* shared with the parent: collectives done, by rank */
} loop_ctx_t;

static int child_loop(bt_comm_t *c, void *p)
{
    const loop_ctx_t *ctx = p;
    bt_log_set_level(BT_LOG_ERROR);
    int rank = bt_comm_rank(c);
    size_t m = 1u << 18; /* 1 MB of floats: the kill lands mid-transfer often */
    float *buf = malloc(m * sizeof *buf);
    bt_status_t st = BT_OK;
    int64_t last_ok = now_ms();
    for (int it = 0; it < 1000000; it++) {
        if (rank == ctx->victim && it == 20) pause(); /* stalls until killed */
        for (size_t i = 0; i < m; i++) buf[i] = (float)(i % 7);
        st = (it % 3 == 2) ? bt_comm_barrier(c) : bt_comm_all_reduce_f32(c, buf, m);
        if (st != BT_OK) break;
        last_ok = now_ms();
        ctx->iters[rank] = it + 1;
    }
    int64_t dt = now_ms() - last_ok;
    free(buf);
    if (st != BT_ERR_PEER) {
        fprintf(stderr, "rank %d: loop ended with %s\n", rank, bt_status_str(st));
        return CHILD_NOT_PEER;
    }
    /* and it stays broken */
    if (bt_comm_barrier(c) != BT_ERR_PEER) return CHILD_NOT_PEER;
    if (dt > ctx->bound_ms) {
        fprintf(stderr, "rank %d: failure took %lld ms\n", rank, (long long)dt);
        return CHILD_TOO_SLOW;
    }
    return CHILD_OK;
}

/* n ranks loop; after 300 ms `victim` gets SIGKILL; the others must end with BT_ERR_PEER. */
static void kill_one(int n, int victim)
{
    enum { TIMEOUT_MS = 2000 };
    volatile int *iters = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    BT_CHECK(iters != MAP_FAILED);
    if (iters == MAP_FAILED) return;
    loop_ctx_t ctx = {.victim = -1, .bound_ms = TIMEOUT_MS + 1000, .iters = iters};
    pid_t pids[4];
    int codes[4];
    fork_ranks(n, TIMEOUT_MS, child_loop, &ctx, pids);
    /* kill it once the group is well into its loop (or after 20 s, whatever happened) */
    for (int64_t end = now_ms() + 20000; iters[victim] < 10 && now_ms() < end;) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pids[victim], SIGKILL);
    wait_ranks(n, pids, codes, 30000);
    for (int r = 0; r < n; r++) {
        if (r == victim) BT_CHECK_MSG(codes[r] == 128 + SIGKILL, "victim exit %d", codes[r]);
        else BT_CHECK_MSG(codes[r] == CHILD_OK, "rank %d exit %d", r, codes[r]);
    }
    munmap((void *)iters, 4096);
}

static void test_sockets_kill_nonroot(void)
{
    kill_one(4, 2);
    kill_one(2, 1);
}

static void test_sockets_kill_root(void)
{
    kill_one(4, 0);
}

/* Rank 1 of 3 stops calling (alive, connection open): the others time out with BT_ERR_PEER. */
static void test_sockets_rank_stalls(void)
{
    enum { N = 3, TIMEOUT_MS = 500 };
    static int iters[N];
    loop_ctx_t ctx = {.victim = 1, .bound_ms = TIMEOUT_MS + 1500, .iters = iters};
    pid_t pids[N];
    int codes[N];
    fork_ranks(N, TIMEOUT_MS, child_loop, &ctx, pids);
    /* the survivors finish on their own; then the stalled rank is ended */
    int64_t end = now_ms() + 30000;
    int done = 0;
    for (int r = 0; r < N; r++) codes[r] = -1;
    while (done < N - 1 && now_ms() < end) {
        for (int r = 0; r < N; r++) {
            int ws;
            if (r == 1 || codes[r] != -1 || waitpid(pids[r], &ws, WNOHANG) != pids[r]) continue;
            codes[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
            done++;
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < N; r++)
        if (codes[r] == -1) kill(pids[r], SIGKILL);
    for (int r = 0; r < N; r++)
        if (codes[r] == -1) waitpid(pids[r], NULL, 0);
    BT_CHECK_MSG(codes[0] == CHILD_OK, "rank 0 exit %d", codes[0]);
    BT_CHECK_MSG(codes[2] == CHILD_OK, "rank 2 exit %d", codes[2]);
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL); /* the backend must not need SIGPIPE ignored */
    BT_RUN(test_bad_args);
    BT_RUN(test_threads_1);
    BT_RUN(test_threads_2);
    BT_RUN(test_threads_3);
    BT_RUN(test_threads_4);
    BT_RUN(test_threads_rank_never_arrives);
    BT_RUN(test_threads_rank_leaves);
    BT_RUN(test_sockets_1);
    BT_RUN(test_sockets_bad_args);
    BT_RUN(test_sockets_2);
    BT_RUN(test_sockets_4);
    BT_RUN(test_sockets_kill_nonroot);
    BT_RUN(test_sockets_kill_root);
    BT_RUN(test_sockets_rank_stalls);
    return bt_test_summary();
}

/* common/transfer: the in-process transport, UCX over tcp and shared memory in one process,
 * and a real second process that is killed mid-transfer. Every wait is bounded by a uv
 * timer watchdog.
 *
 * The test binary re-executes itself as the receiver of the two-process cases:
 *   test_transfer --child <ucx_tls>   prints its region descriptor to stdout, answers each
 *                                     notice with one byte ('Y': bytes match the notice's
 *                                     hash, 'N': they do not) and runs until killed. */
#include "bt_test.h"
#include "common/transfer/transfer.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#define MIB (1024u * 1024u)

/* ---- helpers ----------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_random(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng();
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)rng();
}

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static bool g_timed_out;

static void on_watchdog(uv_timer_t *t)
{
    g_timed_out = true;
}

/* Runs the loop until *counter >= target or timeout_ms passes; true when reached. */
static bool run_until(uv_loop_t *loop, const int *counter, int target, int timeout_ms)
{
    uv_timer_t t;
    uv_timer_init(loop, &t);
    g_timed_out = false;
    uv_timer_start(&t, on_watchdog, (uint64_t)timeout_ms, 0);
    while (*counter < target && !g_timed_out)
        uv_run(loop, UV_RUN_ONCE);
    uv_timer_stop(&t);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return *counter >= target;
}

/* After every xfer is destroyed: the handles close and the loop ends empty. */
static void finish_loop(uv_loop_t *loop)
{
    uv_run(loop, UV_RUN_DEFAULT);
    BT_CHECK_EQ_INT(uv_loop_close(loop), 0);
}

typedef struct {
    int notices;
    uint8_t last[BT_XFER_NOTICE_MAX];
    size_t last_len;
    const uint8_t *region;   /* checked when a notice arrives */
    const uint8_t *expect;
    size_t expect_len;
    int mismatches;
} receiver_t;

static void on_notice(void *ctx, const uint8_t *notice, size_t len)
{
    receiver_t *r = ctx;
    r->notices++;
    if (len <= sizeof(r->last)) {
        memcpy(r->last, notice, len);
        r->last_len = len;
    }
    if (r->region && r->expect && memcmp(r->region, r->expect, r->expect_len) != 0)
        r->mismatches++;
}

typedef struct {
    int done, errors;
    bt_status_t last;
} sender_t;

static void on_done(void *ctx, bt_status_t st)
{
    sender_t *s = ctx;
    s->done++;
    s->last = st;
}

static void on_peer_error(void *ctx, bt_status_t st)
{
    sender_t *s = ctx;
    s->errors++;
    s->last = st;
}

/* ---- in-process transport ------------------------------------------------------------------ */

static void test_inproc_put_commit(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = {.kind = BT_XFER_INPROC};
    bt_xfer_t *rx = NULL, *tx = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &rx), BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &tx), BT_OK);

    size_t len = 1 * MIB;
    uint8_t *region = calloc(1, len), *src = malloc(len), *expect = calloc(1, len);
    fill_random(src, len);
    bt_xfer_region_t *r = NULL;
    BT_CHECK_EQ_INT(bt_xfer_register(rx, region, len, &r), BT_OK);
    receiver_t rcv = {0};
    bt_xfer_on_notice(rx, on_notice, &rcv);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);

    sender_t snd = {0};
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(tx, desc, desc_len, on_peer_error, &snd, &p), BT_OK);
    const struct { size_t off, n; } ranges[] = {{0, 100}, {4096, 65536}, {len - 7, 7}, {200000, 1}};
    for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
        BT_CHECK_EQ_INT(bt_xfer_put(p, ranges[i].off, src + ranges[i].off, ranges[i].n), BT_OK);
        memcpy(expect + ranges[i].off, src + ranges[i].off, ranges[i].n);
    }
    rcv.region = region;
    rcv.expect = expect;
    rcv.expect_len = len;
    BT_CHECK_EQ_INT(bt_xfer_commit(p, (const uint8_t *)"chunk 1", 7, on_done, &snd), BT_OK);
    BT_CHECK_EQ_INT(rcv.notices, 0); /* never delivered inside commit */
    BT_CHECK_EQ_INT(snd.done, 0);
    BT_CHECK(run_until(&loop, &rcv.notices, 1, 5000));
    BT_CHECK(run_until(&loop, &snd.done, 1, 5000));
    BT_CHECK_EQ_INT(snd.last, BT_OK);
    BT_CHECK_EQ_INT(rcv.mismatches, 0);
    BT_CHECK(rcv.last_len == 7 && memcmp(rcv.last, "chunk 1", 7) == 0);
    BT_CHECK_EQ_INT(snd.errors, 0);

    /* an empty notice and a NULL on_done are fine */
    BT_CHECK_EQ_INT(bt_xfer_commit(p, NULL, 0, NULL, NULL), BT_OK);
    BT_CHECK(run_until(&loop, &rcv.notices, 2, 5000));
    BT_CHECK_EQ_INT(rcv.last_len, 0);

    bt_xfer_stats_t ts, rs;
    bt_xfer_stats(tx, &ts);
    bt_xfer_stats(rx, &rs);
    BT_CHECK_EQ_INT(ts.puts, 4);
    BT_CHECK_EQ_INT(ts.bytes_put, 100 + 65536 + 7 + 1);
    BT_CHECK_EQ_INT(ts.commits, 2);
    BT_CHECK_EQ_INT(ts.commit_failures, 0);
    BT_CHECK_EQ_INT(rs.notices_received, 2);

    bt_xfer_disconnect(p);
    bt_xfer_deregister(r);
    bt_xfer_destroy(tx);
    bt_xfer_destroy(rx);
    finish_loop(&loop);
    free(region);
    free(src);
    free(expect);
}

static void test_inproc_bounds(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = {.kind = BT_XFER_INPROC};
    bt_xfer_t *x = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &x), BT_OK);
    uint8_t buf[64 + 32];
    memset(buf, 0xAA, sizeof(buf));
    bt_xfer_region_t *r = NULL;
    BT_CHECK_EQ_INT(bt_xfer_register(x, buf + 16, 64, &r), BT_OK);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(x, desc, desc_len, NULL, NULL, &p), BT_OK);
    uint8_t src[128];
    memset(src, 0x55, sizeof(src));
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, src, 65), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 60, src, 5), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 65, src, 0), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(p, UINT64_MAX, src, 1), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 1, src, SIZE_MAX), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, NULL, 1), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(NULL, 0, src, 1), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 64, src, 0), BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, src, 64), BT_OK);
    for (int i = 0; i < 16; i++)
        BT_CHECK(buf[i] == 0xAA && buf[16 + 64 + i] == 0xAA);
    BT_CHECK(buf[16] == 0x55 && buf[16 + 63] == 0x55);
    BT_CHECK_EQ_INT(bt_xfer_commit(p, NULL, 1, NULL, NULL), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_commit(p, src, BT_XFER_NOTICE_MAX + 1, NULL, NULL),
                    BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_register(x, NULL, 64, &(bt_xfer_region_t *){NULL}),
                    BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(bt_xfer_register(x, buf, 0, &(bt_xfer_region_t *){NULL}), BT_ERR_INVALID_ARG);
    bt_xfer_disconnect(p);
    bt_xfer_deregister(r);
    bt_xfer_destroy(x);
    finish_loop(&loop);
}

/* Every truncation, every single-bit flip, random bytes and a foreign kind are refused. */
static void check_bad_descs(bt_xfer_t *x, const uint8_t *desc, size_t desc_len)
{
    bt_xfer_peer_t *p = NULL;
    int accepted = 0;
    for (size_t n = 0; n < desc_len; n++) {
        if (bt_xfer_connect(x, desc, n, NULL, NULL, &p) != BT_ERR_INVALID_ARG)
            accepted++;
    }
    uint8_t *copy = malloc(desc_len + 16);
    for (size_t i = 0; i < desc_len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(copy, desc, desc_len);
            copy[i] ^= (uint8_t)(1u << bit);
            if (bt_xfer_connect(x, copy, desc_len, NULL, NULL, &p) != BT_ERR_INVALID_ARG)
                accepted++;
        }
    }
    memcpy(copy, desc, desc_len);
    memset(copy + desc_len, 0, 16);
    if (bt_xfer_connect(x, copy, desc_len + 16, NULL, NULL, &p) != BT_ERR_INVALID_ARG)
        accepted++;
    for (int k = 0; k < 200; k++) {
        size_t n = (size_t)(rng() % (desc_len + 16));
        fill_random(copy, n);
        if (k % 2) /* keep a valid-looking head so the deeper checks run */
            memcpy(copy, desc, n < 8 ? n : 8);
        if (bt_xfer_connect(x, copy, n, NULL, NULL, &p) != BT_ERR_INVALID_ARG)
            accepted++;
    }
    BT_CHECK_EQ_INT(bt_xfer_connect(x, NULL, 10, NULL, NULL, &p), BT_ERR_INVALID_ARG);
    BT_CHECK_EQ_INT(accepted, 0);
    free(copy);
}

static void test_inproc_bad_descriptor(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = {.kind = BT_XFER_INPROC};
    bt_xfer_t *x = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &x), BT_OK);
    uint8_t buf[256];
    bt_xfer_region_t *r = NULL;
    BT_CHECK_EQ_INT(bt_xfer_register(x, buf, sizeof(buf), &r), BT_OK);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);
    check_bad_descs(x, desc, desc_len);

    /* well-formed, but the region is gone */
    uint8_t *copy = malloc(desc_len);
    memcpy(copy, desc, desc_len);
    bt_xfer_deregister(r);
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(x, copy, desc_len, NULL, NULL, &p), BT_ERR_UNAVAILABLE);
    free(copy);
    bt_xfer_destroy(x);
    finish_loop(&loop);
}

/* The receiver deregisters: the sender's next put fails, on_error runs once, commits fail. */
static void test_inproc_region_gone(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = {.kind = BT_XFER_INPROC};
    bt_xfer_t *x = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &x), BT_OK);
    uint8_t buf[256], src[16] = {0};
    bt_xfer_region_t *r = NULL;
    BT_CHECK_EQ_INT(bt_xfer_register(x, buf, sizeof(buf), &r), BT_OK);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);
    sender_t snd = {0};
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(x, desc, desc_len, on_peer_error, &snd, &p), BT_OK);
    bt_xfer_deregister(r);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, src, sizeof(src)), BT_ERR_PEER);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, src, sizeof(src)), BT_ERR_PEER);
    BT_CHECK_EQ_INT(bt_xfer_commit(p, src, 4, on_done, &snd), BT_OK);
    BT_CHECK(run_until(&loop, &snd.done, 1, 5000));
    BT_CHECK(run_until(&loop, &snd.errors, 1, 1000));
    BT_CHECK_EQ_INT(snd.errors, 1);
    BT_CHECK_EQ_INT(snd.last, BT_ERR_PEER);
    bt_xfer_stats_t st;
    bt_xfer_stats(x, &st);
    BT_CHECK_EQ_INT(st.commit_failures, 1);
    bt_xfer_disconnect(p);
    bt_xfer_destroy(x);
    finish_loop(&loop);
}


/* ---- UCX in one process ------------------------------------------------------------------ */

static bt_xfer_options_t ucx_opts(const char *tls)
{
    bt_xfer_options_t o = {.kind = BT_XFER_UCX, .ucx_tls = tls, .net_devices = "lo",
                           .keepalive_ms = 1000};
    return o;
}

/* 64 MiB region, random data put in many chunks of uneven size, two commits, a notice of
 * the largest size (rendezvous-sized on tcp). */
static void ucx_big_transfer(const char *tls)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = ucx_opts(tls);
    bt_xfer_t *rx = NULL, *tx = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &rx), BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &tx), BT_OK);
    if (!rx || !tx)
        return;
    size_t len = 64 * MIB;
    uint8_t *region = calloc(1, len), *src = malloc(len);
    fill_random(src, len);
    bt_xfer_region_t *r = NULL;
    BT_CHECK_EQ_INT(bt_xfer_register(rx, region, len, &r), BT_OK);
    receiver_t *rcv = calloc(1, sizeof(*rcv));
    bt_xfer_on_notice(rx, on_notice, rcv);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);

    sender_t snd = {0};
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(tx, desc, desc_len, on_peer_error, &snd, &p), BT_OK);
    check_bad_descs(tx, desc, desc_len);
    BT_CHECK_EQ_INT(bt_xfer_put(p, len - 1, src, 2), BT_ERR_INVALID_ARG);

    /* first half in ~300 KiB pieces, then commit; the rest, then commit again */
    size_t off = 0, half = len / 2;
    int puts = 0;
    while (off < half) {
        size_t n = 300 * 1024 + (size_t)(rng() % 4096);
        if (n > half - off)
            n = half - off;
        BT_CHECK_EQ_INT(bt_xfer_put(p, off, src + off, n), BT_OK);
        off += n;
        puts++;
    }
    uint8_t notice1[32];
    snprintf((char *)notice1, sizeof(notice1), "half %zu", half);
    BT_CHECK_EQ_INT(bt_xfer_commit(p, notice1, sizeof(notice1), on_done, &snd), BT_OK);
    rcv->region = region;
    rcv->expect = src;
    rcv->expect_len = half;
    BT_CHECK(run_until(&loop, &rcv->notices, 1, 20000));
    BT_CHECK(run_until(&loop, &snd.done, 1, 20000));
    BT_CHECK_EQ_INT(snd.last, BT_OK);
    BT_CHECK_EQ_INT(rcv->mismatches, 0);
    BT_CHECK(rcv->last_len == sizeof(notice1) && memcmp(rcv->last, notice1, sizeof(notice1)) == 0);

    while (off < len) {
        size_t n = 1 * MIB + (size_t)(rng() % 65536);
        if (n > len - off)
            n = len - off;
        BT_CHECK_EQ_INT(bt_xfer_put(p, off, src + off, n), BT_OK);
        off += n;
        puts++;
    }
    uint8_t *notice2 = malloc(BT_XFER_NOTICE_MAX);
    fill_random(notice2, BT_XFER_NOTICE_MAX);
    rcv->expect_len = len;
    BT_CHECK_EQ_INT(bt_xfer_commit(p, notice2, BT_XFER_NOTICE_MAX, on_done, &snd), BT_OK);
    BT_CHECK(run_until(&loop, &rcv->notices, 2, 30000));
    BT_CHECK(run_until(&loop, &snd.done, 2, 30000));
    BT_CHECK_EQ_INT(snd.last, BT_OK);
    BT_CHECK_EQ_INT(rcv->mismatches, 0);
    BT_CHECK(memcmp(region, src, len) == 0);
    BT_CHECK(rcv->last_len == BT_XFER_NOTICE_MAX &&
             memcmp(rcv->last, notice2, BT_XFER_NOTICE_MAX) == 0);
    BT_CHECK_EQ_INT(snd.errors, 0);
    bt_xfer_stats_t ts;
    bt_xfer_stats(tx, &ts);
    BT_CHECK_EQ_INT(ts.bytes_put, len);
    BT_CHECK_EQ_INT(ts.puts, puts);
    BT_CHECK_EQ_INT(ts.commit_failures, 0);

    bt_xfer_disconnect(p);
    bt_xfer_deregister(r);
    bt_xfer_destroy(tx);
    bt_xfer_destroy(rx);
    finish_loop(&loop);
    free(region);
    free(src);
    free(notice2);
    free(rcv);
}

static void test_ucx_tcp_64mib(void)
{
    ucx_big_transfer("tcp");
}

static void test_ucx_sm_64mib(void)
{
    ucx_big_transfer("sm");
}

/* Two receivers, two senders: tx0 writes to both regions, tx1 to the first one. */
static void ucx_multi_peer(const char *tls)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = ucx_opts(tls);
    bt_xfer_t *rx[2] = {0}, *tx[2] = {0};
    for (int i = 0; i < 2; i++) {
        BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &rx[i]), BT_OK);
        BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &tx[i]), BT_OK);
    }
    size_t len = 4 * MIB;
    uint8_t *region[2], *src = malloc(len);
    fill_random(src, len);
    bt_xfer_region_t *r[2];
    receiver_t *rcv = calloc(2, sizeof(*rcv));
    const uint8_t *desc[2];
    size_t desc_len[2];
    for (int i = 0; i < 2; i++) {
        region[i] = calloc(1, len);
        BT_CHECK_EQ_INT(bt_xfer_register(rx[i], region[i], len, &r[i]), BT_OK);
        bt_xfer_on_notice(rx[i], on_notice, &rcv[i]);
        bt_xfer_region_desc(r[i], &desc[i], &desc_len[i]);
    }
    sender_t snd[3] = {{0}};
    bt_xfer_peer_t *p[3];
    BT_CHECK_EQ_INT(bt_xfer_connect(tx[0], desc[0], desc_len[0], on_peer_error, &snd[0], &p[0]),
                    BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_connect(tx[0], desc[1], desc_len[1], on_peer_error, &snd[1], &p[1]),
                    BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_connect(tx[1], desc[0], desc_len[0], on_peer_error, &snd[2], &p[2]),
                    BT_OK);
    /* p0: first half of region 0; p2: second half of region 0; p1: all of region 1 */
    for (size_t off = 0; off < len / 2; off += 64 * 1024) {
        BT_CHECK_EQ_INT(bt_xfer_put(p[0], off, src + off, 64 * 1024), BT_OK);
        BT_CHECK_EQ_INT(bt_xfer_put(p[2], len / 2 + off, src + len / 2 + off, 64 * 1024), BT_OK);
    }
    for (size_t off = 0; off < len; off += 512 * 1024)
        BT_CHECK_EQ_INT(bt_xfer_put(p[1], off, src + off, 512 * 1024), BT_OK);
    for (int i = 0; i < 3; i++) {
        uint8_t n = (uint8_t)('A' + i);
        BT_CHECK_EQ_INT(bt_xfer_commit(p[i], &n, 1, on_done, &snd[i]), BT_OK);
    }
    BT_CHECK(run_until(&loop, &rcv[0].notices, 2, 20000));
    BT_CHECK(run_until(&loop, &rcv[1].notices, 1, 20000));
    for (int i = 0; i < 3; i++) {
        BT_CHECK(run_until(&loop, &snd[i].done, 1, 20000));
        BT_CHECK_EQ_INT(snd[i].last, BT_OK);
    }
    BT_CHECK(rcv[1].last_len == 1 && rcv[1].last[0] == 'B');
    BT_CHECK(memcmp(region[0], src, len) == 0);
    BT_CHECK(memcmp(region[1], src, len) == 0);

    /* disconnecting one peer leaves the others working */
    bt_xfer_disconnect(p[0]);
    memset(src, 0x5A, 4096);
    BT_CHECK_EQ_INT(bt_xfer_put(p[2], 0, src, 4096), BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_commit(p[2], (const uint8_t *)"Z", 1, on_done, &snd[2]), BT_OK);
    BT_CHECK(run_until(&loop, &rcv[0].notices, 3, 20000));
    BT_CHECK(run_until(&loop, &snd[2].done, 2, 20000));
    BT_CHECK(rcv[0].last_len == 1 && rcv[0].last[0] == 'Z');
    BT_CHECK(memcmp(region[0], src, 4096) == 0);
    for (int i = 0; i < 3; i++)
        BT_CHECK_EQ_INT(snd[i].errors, 0);

    bt_xfer_disconnect(p[1]);
    bt_xfer_disconnect(p[2]);
    for (int i = 0; i < 2; i++) {
        bt_xfer_deregister(r[i]);
        bt_xfer_destroy(rx[i]);
        bt_xfer_destroy(tx[i]);
        free(region[i]);
    }
    finish_loop(&loop);
    free(src);
    free(rcv);
}

static void test_ucx_tcp_multi_peer(void)
{
    ucx_multi_peer("tcp");
}

static void test_ucx_sm_multi_peer(void)
{
    ucx_multi_peer("sm");
}

/* A commit left outstanding at disconnect still reports once; on_done may destroy things. */
typedef struct {
    int done;
    bt_status_t st;
} once_t;

static void on_done_once(void *ctx, bt_status_t st)
{
    once_t *o = ctx;
    o->done++;
    o->st = st;
}

static void test_ucx_disconnect_outstanding(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = ucx_opts("tcp");
    bt_xfer_t *rx = NULL, *tx = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &rx), BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &tx), BT_OK);
    size_t len = 8 * MIB;
    uint8_t *region = calloc(1, len), *src = calloc(1, len);
    bt_xfer_region_t *r = NULL;
    BT_CHECK_EQ_INT(bt_xfer_register(rx, region, len, &r), BT_OK);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(tx, desc, desc_len, NULL, NULL, &p), BT_OK);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, src, len), BT_OK);
    once_t once = {0};
    BT_CHECK_EQ_INT(bt_xfer_commit(p, (const uint8_t *)"x", 1, on_done_once, &once), BT_OK);
    bt_xfer_disconnect(p);
    BT_CHECK(run_until(&loop, &once.done, 1, 5000));
    int never = 0;
    run_until(&loop, &never, 1, 100);
    BT_CHECK_EQ_INT(once.done, 1);
    BT_CHECK(once.st == BT_OK || once.st == BT_ERR_CANCELLED);
    bt_xfer_deregister(r);
    bt_xfer_destroy(tx);
    bt_xfer_destroy(rx);
    finish_loop(&loop);
    free(region);
    free(src);
}

/* ---- two processes ------------------------------------------------------------------------- */

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

/* Reads exactly n bytes within timeout_ms; 0 on success. */
static int read_all(int fd, void *p, size_t n, int timeout_ms)
{
    uint8_t *b = p;
    uint64_t deadline = uv_hrtime() + (uint64_t)timeout_ms * 1000000u;
    while (n) {
        int64_t left = (int64_t)(deadline - uv_hrtime()) / 1000000;
        if (uv_hrtime() >= deadline)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int k = poll(&pf, 1, (int)(left > 0 ? left : 1));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            continue;
        ssize_t m = read(fd, b, n);
        if (m < 0 && errno == EINTR)
            continue;
        if (m <= 0)
            return -1;
        b += m;
        n -= (size_t)m;
    }
    return 0;
}

#define CHILD_REGION (64 * MIB)

typedef struct {
    uint8_t *region;
} child_t;

static void child_on_notice(void *ctx, const uint8_t *notice, size_t len)
{
    child_t *c = ctx;
    char answer = 'N';
    if (len == 16) {
        uint64_t n, h;
        memcpy(&n, notice, 8);
        memcpy(&h, notice + 8, 8);
        if (n <= CHILD_REGION && hash_bytes(c->region, n) == h)
            answer = 'Y';
    }
    if (write_all(1, &answer, 1) != 0)
        exit(3);
}

static int child_main(const char *tls)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = ucx_opts(tls);
    bt_xfer_t *x = NULL;
    if (bt_xfer_create(&loop, &o, &x) != BT_OK)
        return 2;
    child_t c = {.region = calloc(1, CHILD_REGION)};
    bt_xfer_region_t *r = NULL;
    if (!c.region || bt_xfer_register(x, c.region, CHILD_REGION, &r) != BT_OK)
        return 2;
    bt_xfer_on_notice(x, child_on_notice, &c);
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(r, &desc, &desc_len);
    uint32_t n = (uint32_t)desc_len;
    if (write_all(1, &n, 4) != 0 || write_all(1, desc, desc_len) != 0)
        return 2;
    /* runs until killed, or until the parent closes our stdin */
    uv_run(&loop, UV_RUN_DEFAULT);
    return 0;
}

static const char *g_self;

typedef struct {
    pid_t pid;
    int out_fd; /* child's stdout */
    int in_fd;  /* child's stdin */
} child_proc_t;

static bool spawn_child(const char *tls, child_proc_t *cp)
{
    int out[2], in[2];
    if (pipe(out) != 0 || pipe(in) != 0)
        return false;
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(in[0], 0);
        close(out[0]);
        close(out[1]);
        close(in[0]);
        close(in[1]);
        execl(g_self, g_self, "--child", tls, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(in[0]);
    cp->pid = pid;
    cp->out_fd = out[0];
    cp->in_fd = in[1];
    return true;
}

/* The peer must really be gone: over shared memory UCX checks that the peer process still
 * exists, and an unreaped child (a zombie) still does. */
static uint64_t kill_and_reap(pid_t pid, int *wst)
{
    kill(pid, SIGKILL);
    uint64_t t = uv_hrtime();
    waitpid(pid, wst, 0);
    return t;
}

static void ucx_two_process_kill(const char *tls, bool idle, int detect_bound_ms)
{
    child_proc_t cp = {0};
    bool spawned = spawn_child(tls, &cp);
    BT_CHECK(spawned);
    if (!spawned)
        return;
    uint32_t dlen = 0;
    uint8_t *desc = NULL;
    if (read_all(cp.out_fd, &dlen, 4, 10000) == 0 && dlen > 0 && dlen < 65536) {
        desc = malloc(dlen);
        if (read_all(cp.out_fd, desc, dlen, 5000) != 0) {
            free(desc);
            desc = NULL;
        }
    }
    BT_CHECK_MSG(desc != NULL, "no descriptor from the child");
    if (!desc) {
        kill(cp.pid, SIGKILL);
        waitpid(cp.pid, NULL, 0);
        return;
    }

    uv_loop_t loop;
    uv_loop_init(&loop);
    bt_xfer_options_t o = ucx_opts(tls);
    bt_xfer_t *tx = NULL;
    BT_CHECK_EQ_INT(bt_xfer_create(&loop, &o, &tx), BT_OK);
    sender_t snd = {0};
    bt_xfer_peer_t *p = NULL;
    BT_CHECK_EQ_INT(bt_xfer_connect(tx, desc, dlen, on_peer_error, &snd, &p), BT_OK);
    size_t len = CHILD_REGION;
    uint8_t *src = malloc(len);
    fill_random(src, len);

    /* a good round first: 16 MiB, the child checks the hash named in the notice */
    size_t n1 = 16 * MIB;
    for (size_t off = 0; off < n1; off += 256 * 1024)
        BT_CHECK_EQ_INT(bt_xfer_put(p, off, src + off, 256 * 1024), BT_OK);
    uint8_t notice[16];
    uint64_t v = n1, h = hash_bytes(src, n1);
    memcpy(notice, &v, 8);
    memcpy(notice + 8, &h, 8);
    BT_CHECK_EQ_INT(bt_xfer_commit(p, notice, sizeof(notice), on_done, &snd), BT_OK);
    BT_CHECK(run_until(&loop, &snd.done, 1, 20000));
    BT_CHECK_EQ_INT(snd.last, BT_OK);
    char answer = 0;
    BT_CHECK_EQ_INT(read_all(cp.out_fd, &answer, 1, 10000), 0);
    BT_CHECK_EQ_INT(answer, 'Y');

    /* now keep writing and kill the child mid-transfer (idle: kill it with nothing in
     * flight and let the keepalive find out) */
    int commits_before = snd.done;
    size_t off = 0;
    uint64_t t_kill = 0;
    int failed_done = 0;
    uint64_t t_start = uv_hrtime();
    int wst = 0;
    if (idle) {
        t_kill = kill_and_reap(cp.pid, &wst);
        run_until(&loop, &snd.errors, 1, 20000);
        bt_xfer_commit(p, notice, sizeof(notice), on_done, &snd); /* fails: peer gone */
    }
    while (snd.errors == 0 && uv_hrtime() - t_start < 20000000000ull) {
        for (int i = 0; i < 16; i++) {
            bt_status_t st = bt_xfer_put(p, off, src + off, 256 * 1024);
            if (st != BT_OK) {
                BT_CHECK(st == BT_ERR_PEER || st == BT_ERR_UNAVAILABLE);
                break;
            }
            off = (off + 256 * 1024) % len;
        }
        bt_xfer_commit(p, notice, sizeof(notice), on_done, &snd);
        if (!t_kill && snd.done > commits_before + 2) {
            t_kill = kill_and_reap(cp.pid, &wst);
        }
        int target = snd.errors + 1;
        run_until(&loop, &snd.errors, target, 20); /* one short turn of the loop */
        (void)failed_done;
    }
    uint64_t t_err = uv_hrtime();
    BT_CHECK_MSG(t_kill != 0, "the child was never killed");
    if (!t_kill)
        kill_and_reap(cp.pid, &wst);
    BT_CHECK_EQ_INT(snd.errors, 1);
    BT_CHECK(snd.last == BT_ERR_PEER || snd.last == BT_ERR_UNAVAILABLE);
    double ms = t_kill ? (double)(t_err - t_kill) / 1e6 : -1;
    fprintf(stderr, "  %s%s: killed peer reported after %.1f ms\n", tls, idle ? " (idle)" : "", ms);
    BT_CHECK_MSG(ms >= 0 && ms < detect_bound_ms, "%.1f ms", ms);
    /* every commit still reports once, with a failure after the kill */
    int issued = (int)(snd.done); /* counts so far */
    (void)issued;
    bt_xfer_stats_t st;
    bt_xfer_stats(tx, &st);
    int all = (int)st.commits;
    int never = 0;
    run_until(&loop, &never, 1, 300);
    BT_CHECK(run_until(&loop, &snd.done, all, 5000));
    BT_CHECK_EQ_INT(snd.done, all);
    bt_xfer_stats(tx, &st);
    BT_CHECK(st.commit_failures >= 1);
    BT_CHECK_EQ_INT(bt_xfer_put(p, 0, src, 16), snd.last);

    uint64_t t0 = uv_hrtime();
    bt_xfer_disconnect(p);
    bt_xfer_destroy(tx);
    finish_loop(&loop);
    BT_CHECK_MSG(uv_hrtime() - t0 < 3000000000ull, "teardown took %.0f ms",
                 (double)(uv_hrtime() - t0) / 1e6);
    BT_CHECK(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
    close(cp.out_fd);
    close(cp.in_fd);
    free(src);
    free(desc);
}

static void test_ucx_tcp_two_process_kill(void)
{
    ucx_two_process_kill("tcp", false, 3000);
}

static void test_ucx_tcp_two_process_kill_idle(void)
{
    ucx_two_process_kill("tcp", true, 5000);
}

static void test_ucx_sm_two_process_kill_idle(void)
{
    ucx_two_process_kill("sm", true, 5000);
}

static void test_ucx_sm_two_process_kill(void)
{
    ucx_two_process_kill("sm", false, 5000);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2]);
    if (argc == 2) { /* run one test by name */
        static const struct { const char *name; void (*fn)(void); } tests[] = {
            {"sm_kill", test_ucx_sm_two_process_kill},
            {"sm_kill_idle", test_ucx_sm_two_process_kill_idle},
            {"tcp_kill", test_ucx_tcp_two_process_kill},
            {"tcp_kill_idle", test_ucx_tcp_two_process_kill_idle},
        };
        g_self = "/proc/self/exe";
        for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
            if (strcmp(argv[1], tests[i].name) == 0)
                BT_RUN(tests[i].fn);
        return bt_test_summary();
    }
    signal(SIGPIPE, SIG_IGN);
    g_self = "/proc/self/exe";
    BT_RUN(test_inproc_put_commit);
    BT_RUN(test_inproc_bounds);
    BT_RUN(test_inproc_bad_descriptor);
    BT_RUN(test_inproc_region_gone);
    BT_RUN(test_ucx_tcp_64mib);
    BT_RUN(test_ucx_tcp_multi_peer);
    BT_RUN(test_ucx_disconnect_outstanding);
    BT_RUN(test_ucx_tcp_two_process_kill);
    BT_RUN(test_ucx_tcp_two_process_kill_idle);
    BT_RUN(test_ucx_sm_64mib);
    BT_RUN(test_ucx_sm_multi_peer);
    BT_RUN(test_ucx_sm_two_process_kill_idle);
    BT_RUN(test_ucx_sm_two_process_kill);
    return bt_test_summary();
}

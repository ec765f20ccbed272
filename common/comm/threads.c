/* Threads backend: n handles share one group. Every collective is
 *
 *   publish (op, size, buffer) -> barrier -> work on the published buffers -> barrier
 *
 * Between the two barriers rank r owns slice r of the work: for an all-reduce it sums slice r
 * of every rank's buffer in rank order and writes the sum into slice r of every buffer, so each
 * element is added in one fixed order by one thread and every rank ends with the same bits.
 * After the second barrier no rank touches another's buffers.
 *
 * A barrier waits at most the handle's timeout; a rank that times out breaks the group (every
 * waiting and later call fails with BT_ERR_PEER), as does a handle destroyed while others wait.
 * The one case this cannot cover is a rank stalled for longer than the timeout *between* the
 * two barriers, i.e. in the middle of plain memory copies. */
#include "common/comm/comm_internal.h"

#include "common/alloc.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_ALL_REDUCE_F32 = 1, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER };

static const char *op_name(int op)
{
    switch (op) {
    case OP_ALL_REDUCE_F32: return "all_reduce_f32";
    case OP_ALL_GATHER: return "all_gather";
    case OP_BROADCAST: return "broadcast";
    default: return "barrier";
    }
}

typedef struct {
    int op, root;
    size_t size;
    void *buf; /* all-reduce / broadcast buffer, all-gather send */
} slot_t;

typedef struct group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    int refs;  /* live handles */
    int count; /* ranks waiting in the current barrier */
    uint64_t gen;
    bool broken;
    slot_t *slots;      /* published by each rank before the first barrier */
    uint64_t *entered;  /* per rank: barriers entered so far */
} group_t;

typedef struct {
    bt_comm_t base;
    group_t *g;
    uint64_t entered;
} tcomm_t;

static bt_status_t barrier_wait(tcomm_t *t, int op)
{
    group_t *g = t->g;
    bt_status_t st = BT_OK;
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        pthread_mutex_unlock(&g->mu);
        return BT_ERR_PEER;
    }
    uint64_t gen = g->gen;
    g->entered[t->base.rank] = ++t->entered;
    if (++g->count == g->n) {
        g->count = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return BT_OK;
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += t->base.timeout_ms / 1000;
    dl.tv_nsec += (long)(t->base.timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    while (g->gen == gen && !g->broken)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) break;
    if (g->gen == gen) {
        if (!g->broken) {
            char missing[256] = "";
            size_t len = 0;
            for (int r = 0; r < g->n && len < sizeof missing - 12; r++)
                if (g->entered[r] < t->entered)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", r);
            BT_LOG_ERROR("comm(threads): rank %d timed out after %d ms in %s waiting for rank(s)%s",
                         t->base.rank, t->base.timeout_ms, op_name(op), missing);
            g->broken = true;
            pthread_cond_broadcast(&g->cv);
        }
        st = BT_ERR_PEER;
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* publish -> barrier -> check that all ranks called the same thing. Returns BT_OK when the
 * work may start; on BT_ERR_INVALID_ARG the caller must still pass the second barrier. */
static bt_status_t enter(tcomm_t *t, int op, size_t size, int root, void *buf)
{
    group_t *g = t->g;
    g->slots[t->base.rank] = (slot_t){.op = op, .root = root, .size = size, .buf = buf};
    bt_status_t st = barrier_wait(t, op);
    if (st != BT_OK) return st;
    const slot_t *s0 = &g->slots[0];
    for (int r = 1; r < g->n; r++) {
        const slot_t *s = &g->slots[r];
        if (s->op != s0->op || s->size != s0->size || s->root != s0->root) {
            if (t->base.rank == 0)
                BT_LOG_ERROR("comm(threads): ranks disagree: rank 0 called %s(%zu, root %d), "
                             "rank %d called %s(%zu, root %d)",
                             op_name(s0->op), s0->size, s0->root, r, op_name(s->op), s->size,
                             s->root);
            return BT_ERR_INVALID_ARG;
        }
    }
    return BT_OK;
}

static bt_status_t leave(tcomm_t *t, int op, bt_status_t st)
{
    bt_status_t st2 = barrier_wait(t, op);
    return st2 != BT_OK ? st2 : st;
}

static bt_status_t t_all_reduce_f32(bt_comm_t *c, float *buf, size_t n)
{
    tcomm_t *t = (tcomm_t *)c;
    bt_status_t st = enter(t, OP_ALL_REDUCE_F32, n, 0, buf);
    if (st == BT_ERR_PEER) return st;
    if (st == BT_OK) {
        group_t *g = t->g;
        int nr = g->n, r = c->rank;
        /* slice r: n / nr elements, one more for the first n % nr ranks */
        size_t base = n / (size_t)nr, rem = n % (size_t)nr;
        size_t lo = base * (size_t)r + ((size_t)r < rem ? (size_t)r : rem);
        size_t hi = lo + base + ((size_t)r < rem ? 1 : 0);
        enum { BLOCK = 1024 };
        float acc[BLOCK];
        for (size_t i = lo; i < hi; i += BLOCK) {
            size_t m = hi - i < BLOCK ? hi - i : BLOCK;
            memcpy(acc, (const float *)g->slots[0].buf + i, m * sizeof(float));
            for (int q = 1; q < nr; q++) {
                const float *b = (const float *)g->slots[q].buf + i;
                for (size_t j = 0; j < m; j++) acc[j] += b[j];
            }
            for (int q = 0; q < nr; q++) memcpy((float *)g->slots[q].buf + i, acc, m * sizeof(float));
        }
    }
    return leave(t, OP_ALL_REDUCE_F32, st);
}

static bt_status_t t_all_gather(bt_comm_t *c, const void *send, size_t bytes, void *recv)
{
    tcomm_t *t = (tcomm_t *)c;
    bt_status_t st = enter(t, OP_ALL_GATHER, bytes, 0, (void *)send);
    if (st == BT_ERR_PEER) return st;
    if (st == BT_OK && bytes) {
        for (int q = 0; q < t->g->n; q++) {
            unsigned char *dst = (unsigned char *)recv + (size_t)q * bytes;
            const void *src = t->g->slots[q].buf;
            if (dst != src) memcpy(dst, src, bytes); /* in place: own slot already there */
        }
    }
    return leave(t, OP_ALL_GATHER, st);
}

static bt_status_t t_broadcast(bt_comm_t *c, void *buf, size_t bytes, int root)
{
    tcomm_t *t = (tcomm_t *)c;
    bt_status_t st = enter(t, OP_BROADCAST, bytes, root, buf);
    if (st == BT_ERR_PEER) return st;
    if (st == BT_OK && c->rank != root && bytes) {
        const void *src = t->g->slots[root].buf;
        if (src != buf) memcpy(buf, src, bytes);
    }
    return leave(t, OP_BROADCAST, st);
}

static bt_status_t t_barrier(bt_comm_t *c)
{
    tcomm_t *t = (tcomm_t *)c;
    bt_status_t st = enter(t, OP_BARRIER, 0, 0, NULL);
    if (st == BT_ERR_PEER) return st;
    return leave(t, OP_BARRIER, st);
}

static void group_free(group_t *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
    free(g->entered);
    free(g);
}

static void t_destroy(bt_comm_t *c)
{
    tcomm_t *t = (tcomm_t *)c;
    group_t *g = t->g;
    pthread_mutex_lock(&g->mu);
    if (g->count > 0 && !g->broken)
        BT_LOG_ERROR("comm(threads): rank %d left while %d rank(s) wait in a collective", c->rank,
                     g->count);
    /* whoever comes later can only be waiting for this rank: fail them now */
    g->broken = true;
    pthread_cond_broadcast(&g->cv);
    int refs = --g->refs;
    pthread_mutex_unlock(&g->mu);
    free(t);
    if (refs == 0) group_free(g);
}

static const bt__comm_ops_t threads_ops = {
    .name = "threads",
    .all_reduce_f32 = t_all_reduce_f32,
    .all_gather = t_all_gather,
    .broadcast = t_broadcast,
    .barrier = t_barrier,
    .destroy = t_destroy,
};

bt_status_t bt_comm_threads_create(int n_ranks, bt_comm_t **comms)
{
    if (n_ranks <= 0 || !comms) return BT_ERR_INVALID_ARG;
    group_t *g = calloc(1, sizeof *g);
    if (!g) return BT_ERR_NO_MEMORY;
    g->slots = calloc((size_t)n_ranks, sizeof *g->slots);
    g->entered = calloc((size_t)n_ranks, sizeof *g->entered);
    if (!g->slots || !g->entered) goto fail_group;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&g->mu, NULL);
    g->n = n_ranks;

    tcomm_t **ts = calloc((size_t)n_ranks, sizeof *ts);
    if (!ts) goto fail_sync;
    for (int r = 0; r < n_ranks; r++) {
        ts[r] = calloc(1, sizeof *ts[r]);
        if (!ts[r]) goto fail_handles;
        ts[r]->base = (bt_comm_t){.ops = &threads_ops, .rank = r, .n_ranks = n_ranks,
                                  .timeout_ms = BT__COMM_DEFAULT_TIMEOUT_MS};
        ts[r]->g = g;
    }
    g->refs = n_ranks;
    for (int r = 0; r < n_ranks; r++) comms[r] = &ts[r]->base;
    free(ts);
    return BT_OK;

fail_handles:
    for (int r = 0; r < n_ranks; r++) free(ts[r]);
    free(ts);
fail_sync:
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
fail_group:
    free(g->slots);
    free(g->entered);
    free(g);
    return BT_ERR_NO_MEMORY;
}

#include "services/common/tp_group.h"

#include "common/alloc.h"
#include "common/log.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    PLAN_NOOP = 0,
    PLAN_FORWARD = 1,
    PLAN_SYNC = 2,
    PLAN_SHUTDOWN = 3,
    PLAN_DRAFT = 4,
    PLAN_ROLLBACK = 5
};

/* header, then a payload of `bytes` */
typedef struct {
    uint32_t op, n_seqs, n_tokens, n_ranges;
    int32_t slot;
    uint32_t pad;
    uint64_t bytes;
} plan_t;

bt_status_t bt_tp_join(const char *service, int rank, int size, const char *addr, int timeout_ms,
                       bt_comm_t **comm_p)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s.%d", service, rank);
    bt_log_set_tag(tag);
    /* a following rank waits for plans longer than the lead's own watchdog: while the lead
     * waits (up to that watchdog) on a stalled peer, it sends none, and followers that gave
     * up first took the whole group down with the stalled peer */
    int64_t wait_ms = rank > 0 ? 2 * (int64_t)timeout_ms + 1000 : timeout_ms;
    if (wait_ms > INT32_MAX) wait_ms = INT32_MAX;
    bt_status_t st = bt_comm_socket_create(rank, size, addr, (int)wait_ms, comm_p);
    if (st != BT_OK)
        fprintf(stderr, "baton-%s: rank %d of %d cannot join the group at %s: %s\n", service, rank, size, addr,
                bt_status_str(st));
    return st;
}

static bt_status_t send_plan(bt_comm_t *comm, plan_t *p, void *payload)
{
    bt_status_t st = bt_comm_broadcast(comm, p, sizeof *p, 0);
    if (st == BT_OK && p->bytes) st = bt_comm_broadcast(comm, payload, (size_t)p->bytes, 0);
    return st;
}

bt_status_t bt_tp_lead_forward(bt_comm_t *comm, const int *slots, const bt_forward_seq_t *seqs, int n,
                               const bool *reset)
{
    plan_t p = {PLAN_FORWARD, (uint32_t)n, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; i++) p.n_tokens += (uint32_t)seqs[i].n;
    /* payload: per seq {slot, n, all_logits, reset, undo}, then the tokens */
    size_t bytes = (size_t)n * 5 * sizeof(int32_t) + (size_t)p.n_tokens * sizeof(int32_t);
    int32_t *buf = bt_malloc_or_die(bytes);
    int32_t *tok = buf + 5 * n;
    for (int i = 0; i < n; i++) {
        buf[5 * i] = slots[i];
        buf[5 * i + 1] = seqs[i].n;
        buf[5 * i + 2] = seqs[i].all_logits;
        buf[5 * i + 3] = reset && reset[i];
        buf[5 * i + 4] = seqs[i].undo != NULL;
        memcpy(tok, seqs[i].ids, (size_t)seqs[i].n * sizeof(int32_t));
        tok += seqs[i].n;
    }
    p.bytes = bytes;
    bt_status_t st = send_plan(comm, &p, buf);
    free(buf);
    return st;
}

/* a plan of n pairs {slot, value} */
static bt_status_t lead_pairs(bt_comm_t *comm, uint32_t op, const int *slots, const int32_t *values,
                              int n)
{
    plan_t p = {op, (uint32_t)n, 0, 0, 0, 0, (uint64_t)n * 2 * sizeof(int32_t)};
    int32_t *buf = bt_malloc_or_die((size_t)p.bytes ? (size_t)p.bytes : 1);
    for (int i = 0; i < n; i++) {
        buf[2 * i] = slots[i];
        buf[2 * i + 1] = values[i];
    }
    bt_status_t st = send_plan(comm, &p, buf);
    free(buf);
    return st;
}

bt_status_t bt_tp_lead_draft(bt_comm_t *comm, const int *slots, const int32_t *last, int n)
{
    return lead_pairs(comm, PLAN_DRAFT, slots, last, n);
}

bt_status_t bt_tp_lead_rollback(bt_comm_t *comm, const int *slots, const int *keep, int n)
{
    return lead_pairs(comm, PLAN_ROLLBACK, slots, keep, n);
}

bt_status_t bt_tp_lead_sync(bt_comm_t *comm, int slot, const uint8_t *state, const bt_kv_range_t *ranges,
                            int n_ranges)
{
    size_t data = 0;
    for (int i = 0; i < n_ranges; i++) data += ranges[i].len;
    size_t bytes = (size_t)n_ranges * 2 * sizeof(uint64_t) + data;
    uint8_t *buf = bt_malloc_or_die(bytes ? bytes : 1);
    uint64_t *r = (uint64_t *)buf;
    uint8_t *o = buf + (size_t)n_ranges * 2 * sizeof(uint64_t);
    for (int i = 0; i < n_ranges; i++) {
        r[2 * i] = ranges[i].off;
        r[2 * i + 1] = ranges[i].len;
        memcpy(o, state + ranges[i].off, ranges[i].len);
        o += ranges[i].len;
    }
    plan_t p = {PLAN_SYNC, 0, 0, (uint32_t)n_ranges, slot, 0, bytes};
    bt_status_t st = send_plan(comm, &p, buf);
    free(buf);
    return st;
}

bt_status_t bt_tp_lead_noop(bt_comm_t *comm)
{
    plan_t p = {PLAN_NOOP, 0, 0, 0, 0, 0, 0};
    return send_plan(comm, &p, NULL);
}

bt_status_t bt_tp_lead_shutdown(bt_comm_t *comm)
{
    plan_t p = {PLAN_SHUTDOWN, 0, 0, 0, 0, 0, 0};
    return send_plan(comm, &p, NULL);
}

/* A following rank stops with its group: a service manager that stops every rank at once
 * (systemd, Kubernetes, `baton up`) would otherwise kill the followers first, and the lead,
 * its next collective failed, would fail every request it was draining. The lead's shutdown
 * plan ends a follower; a second signal ends it at once. */
static volatile sig_atomic_t follower_signals;

static void on_follower_signal(int sig)
{
    (void)sig;
    if (follower_signals++) _exit(1);
    static const char note[] = "following rank: it stops when rank 0 does (a second signal "
                               "stops it now)\n";
    ssize_t w = write(STDERR_FILENO, note, sizeof note - 1);
    (void)w;
}

bt_status_t bt_tp_follow(bt_comm_t *comm, bt_model_t *model, const bt_kv_layout_t *layout,
                         bt_tp_slot_fn slot_fn, void *ctx, int n_slots)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_follower_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    const bt_model_config_t *c = bt_model_config(model);
    size_t cap = 1 << 16;
    uint8_t *payload = bt_malloc_or_die(cap);
    float *logits = NULL;
    size_t logits_cap = 0;
    bt_forward_seq_t *seqs = NULL;
    int seqs_cap = 0;
    /* DSpark: each slot's undo record (made at its first verification), the draft's scratch */
    bt_kv_undo_t **undo = bt_calloc_or_die((size_t)n_slots, sizeof *undo);
    uint8_t **states = NULL;
    bt_status_t st;
    char err[256];
    for (;;) {
        plan_t p;
        if ((st = bt_comm_broadcast(comm, &p, sizeof p, 0)) != BT_OK) break;
        if (p.bytes > cap) {
            cap = (size_t)p.bytes;
            payload = bt_realloc_or_die(payload, cap);
        }
        if (p.bytes && (st = bt_comm_broadcast(comm, payload, (size_t)p.bytes, 0)) != BT_OK) break;
        if (p.op == PLAN_SHUTDOWN) {
            st = BT_OK;
            break;
        }
        if (p.op == PLAN_SYNC) {
            if (p.slot < 0 || p.slot >= n_slots) {
                st = BT_ERR_INTERNAL;
                break;
            }
            uint8_t *state = slot_fn(ctx, p.slot);
            const uint64_t *r = (const uint64_t *)payload;
            const uint8_t *data = payload + (size_t)p.n_ranges * 2 * sizeof(uint64_t);
            for (uint32_t i = 0; i < p.n_ranges; i++) {
                BT_ASSERT(r[2 * i] + r[2 * i + 1] <= layout->slot_bytes);
                memcpy(state + r[2 * i], data, (size_t)r[2 * i + 1]);
                data += r[2 * i + 1];
            }
            continue;
        }
        if (p.op == PLAN_DRAFT || p.op == PLAN_ROLLBACK) {
            int n = (int)p.n_seqs;
            const int32_t *pair = (const int32_t *)payload;
            if (p.bytes < (uint64_t)n * 2 * sizeof(int32_t) || n > BT_MODEL_MAX_SEQS) {
                st = BT_ERR_INTERNAL;
                break;
            }
            for (int i = 0; i < n; i++)
                if (pair[2 * i] < 0 || pair[2 * i] >= n_slots) st = BT_ERR_INTERNAL;
            if (st != BT_OK) break;
            if (p.op == PLAN_ROLLBACK) {
                for (int i = 0; i < n && st == BT_OK; i++) {
                    bt_kv_undo_t *u = undo[pair[2 * i]];
                    if (!u)
                        snprintf(err, sizeof err, "slot %d has no verification to roll back",
                                 pair[2 * i]);
                    st = u ? bt_model_rollback(model, layout, slot_fn(ctx, pair[2 * i]), u,
                                               pair[2 * i + 1], err, sizeof err)
                           : BT_ERR_INTERNAL;
                }
                if (st != BT_OK) {
                    BT_LOG_ERROR("rollback: %s", err);
                    break;
                }
                continue;
            }
            if (!states) states = bt_malloc_or_die(BT_MODEL_MAX_SEQS * sizeof *states);
            int32_t last[BT_MODEL_MAX_SEQS];
            for (int i = 0; i < n; i++) {
                states[i] = slot_fn(ctx, pair[2 * i]);
                last[i] = pair[2 * i + 1];
            }
            /* the lead's draft: its collectives pair with this one's (the lead picks) */
            st = bt_model_draft(model, layout, states, last, n, NULL, NULL, NULL, NULL, err,
                                sizeof err);
            if (st != BT_OK) {
                BT_LOG_ERROR("draft: %s", err);
                break;
            }
            continue;
        }
        if (p.op != PLAN_FORWARD) continue;
        int n = (int)p.n_seqs;
        if (n > seqs_cap) {
            seqs_cap = n;
            seqs = bt_realloc_or_die(seqs, (size_t)n * sizeof *seqs);
        }
        const int32_t *hdr = (const int32_t *)payload, *tok = hdr + 5 * n;
        size_t rows = 0;
        for (int i = 0; i < n; i++) {
            const int slot = hdr[5 * i];
            if (slot < 0 || slot >= n_slots) {
                st = BT_ERR_INTERNAL;
                goto out;
            }
            uint8_t *state = slot_fn(ctx, slot);
            if (hdr[5 * i + 3]) bt_kv_state_reset(state);
            if (hdr[5 * i + 4] && !undo[slot] &&
                (st = bt_kv_undo_create(model, bt_model_verify_rows(model), &undo[slot])) != BT_OK)
                goto out;
            seqs[i] = (bt_forward_seq_t){state, tok, hdr[5 * i + 1], hdr[5 * i + 2] != 0,
                                         hdr[5 * i + 4] ? undo[slot] : NULL};
            rows += seqs[i].all_logits ? (size_t)seqs[i].n : 1;
            tok += seqs[i].n;
        }
        if (rows * (size_t)c->vocab > logits_cap) {
            logits_cap = rows * (size_t)c->vocab;
            logits = bt_realloc_or_die(logits, logits_cap * sizeof(float));
        }
        /* the same forward as the leader's: its collectives pair with the leader's */
        st = bt_model_forward(model, layout, seqs, n, logits, err, sizeof err);
        if (st != BT_OK) {
            BT_LOG_ERROR("forward: %s", err);
            break;
        }
    }
out:
    free(payload);
    free(logits);
    free(seqs);
    for (int i = 0; i < n_slots; i++)
        bt_kv_undo_destroy(undo[i]);
    free(undo);
    free(states);
    return st;
}

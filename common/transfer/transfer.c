/* Transfer front end: argument checks, bounds, stats, the event queue and the handle
 * lifecycle; the transports (ucx.c, inproc.c) sit behind bt__xfer_ops_t. */
#include "common/transfer/transfer_internal.h"

#include "common/log.h"

#include <stdlib.h>
#include <string.h>

/* ---- descriptor framing ------------------------------------------------------------------ */

void bt__xfer_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void bt__xfer_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t bt__xfer_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t bt__xfer_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void bt__xfer_desc_seal(uint8_t *desc, size_t len, bt_xfer_kind_t kind, uint64_t region_len)
{
    BT_ASSERT(len >= BT__XFER_DESC_HEAD);
    memcpy(desc, BT__XFER_DESC_MAGIC, 4);
    desc[4] = BT__XFER_DESC_VERSION;
    desc[5] = (uint8_t)kind;
    desc[6] = desc[7] = 0;
    bt__xfer_put_u64(desc + 16, region_len);
    bt__xfer_put_u64(desc + 8, fnv1a64(desc + 16, len - 16));
}

bt_status_t bt__xfer_desc_open(const uint8_t *desc, size_t len, bt_xfer_kind_t kind,
                               const uint8_t **body_p, size_t *body_len_p,
                               uint64_t *region_len_p)
{
    if (!desc || len < BT__XFER_DESC_HEAD || len > BT__XFER_DESC_MAX)
        return BT_ERR_INVALID_ARG;
    if (memcmp(desc, BT__XFER_DESC_MAGIC, 4) != 0 || desc[4] != BT__XFER_DESC_VERSION ||
        desc[5] != (uint8_t)kind || desc[6] != 0 || desc[7] != 0)
        return BT_ERR_INVALID_ARG;
    if (bt__xfer_get_u64(desc + 8) != fnv1a64(desc + 16, len - 16))
        return BT_ERR_INVALID_ARG;
    *region_len_p = bt__xfer_get_u64(desc + 16);
    *body_p = desc + BT__XFER_DESC_HEAD;
    *body_len_p = len - BT__XFER_DESC_HEAD;
    return BT_OK;
}

/* ---- event queue ------------------------------------------------------------------------- */

typedef enum { EV_NOTICE, EV_DONE, EV_PEER_ERROR, EV_CALL } ev_type_t;

struct bt__xfer_event {
    bt__xfer_event_t *next;
    ev_type_t type;
    bt_status_t st;
    bt_xfer_peer_t *peer;                        /* EV_PEER_ERROR */
    void (*done)(void *ctx, bt_status_t st);     /* EV_DONE */
    void *ctx;
    void (*call)(bt_xfer_t *x, void *arg, bt_status_t st); /* EV_CALL */
    void *arg;
    size_t len;                                  /* EV_NOTICE */
    uint8_t data[];
};

static void queue_push(bt_xfer_t *x, bt__xfer_event_t *ev)
{
    ev->next = NULL;
    pthread_mutex_lock(&x->mu);
    if (x->q_tail)
        x->q_tail->next = ev;
    else
        x->q_head = ev;
    x->q_tail = ev;
    pthread_mutex_unlock(&x->mu);
    bt__xfer_kick(x);
}

static bt__xfer_event_t *queue_pop(bt_xfer_t *x)
{
    pthread_mutex_lock(&x->mu);
    bt__xfer_event_t *ev = x->q_head;
    if (ev) {
        x->q_head = ev->next;
        if (!x->q_head)
            x->q_tail = NULL;
    }
    pthread_mutex_unlock(&x->mu);
    return ev;
}

void bt__xfer_kick(bt_xfer_t *x)
{
    if (!x->destroyed)
        uv_async_send(&x->async);
}

bt_status_t bt__xfer_post_notice(bt_xfer_t *x, const uint8_t *notice, size_t len)
{
    bt__xfer_event_t *ev = calloc(1, sizeof(*ev) + len);
    if (!ev)
        return BT_ERR_NO_MEMORY;
    ev->type = EV_NOTICE;
    ev->len = len;
    if (len)
        memcpy(ev->data, notice, len);
    queue_push(x, ev);
    return BT_OK;
}

static void post_done(bt_xfer_t *x, void (*done)(void *, bt_status_t), void *ctx, bt_status_t st)
{
    bt__xfer_event_t *ev = calloc(1, sizeof(*ev));
    BT_ASSERT(ev); /* a lost completion would hang the caller: treat as fatal */
    ev->type = EV_DONE;
    ev->done = done;
    ev->ctx = ctx;
    ev->st = st;
    queue_push(x, ev);
}

void bt__xfer_post_call(bt_xfer_t *x, void (*fn)(bt_xfer_t *, void *, bt_status_t), void *arg,
                        bt_status_t st)
{
    bt__xfer_event_t *ev = calloc(1, sizeof(*ev));
    BT_ASSERT(ev);
    ev->type = EV_CALL;
    ev->call = fn;
    ev->arg = arg;
    ev->st = st;
    queue_push(x, ev);
}

void bt__xfer_peer_fail(bt_xfer_peer_t *p, bt_status_t st)
{
    if (p->closing)
        return;
    if (p->failed == BT_OK)
        p->failed = st;
    /* Outstanding commits fail now: a transport may never complete a request on a failed
     * endpoint (UCX 1.13 over shared memory keeps one now and then). */
    while (p->commits)
        bt__xfer_commit_finish(p->commits, p->failed);
    if (p->error_queued)
        return;
    p->error_queued = true;
    bt__xfer_event_t *ev = calloc(1, sizeof(*ev));
    BT_ASSERT(ev);
    ev->type = EV_PEER_ERROR;
    ev->peer = p;
    ev->st = p->failed;
    queue_push(p->x, ev);
}

void bt__xfer_commit_finish(bt__xfer_commit_t *c, bt_status_t st)
{
    BT_ASSERT(!c->finished);
    c->finished = true;
    bt_xfer_peer_t *p = c->peer;
    BT_ASSERT(p);
    bt_xfer_t *x = p->x;
    for (bt__xfer_commit_t **pp = &p->commits; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    c->peer = NULL;
    if (st != BT_OK)
        x->stats.commit_failures++;
    if (c->on_done)
        post_done(x, c->on_done, c->ctx, st);
    if (!c->req_pending)
        free(c);
}

void bt__xfer_commit_release(bt__xfer_commit_t *c)
{
    c->req_pending = false;
    if (c->finished)
        free(c);
}

static void run_event(bt_xfer_t *x, bt__xfer_event_t *ev)
{
    switch (ev->type) {
    case EV_NOTICE:
        x->stats.notices_received++;
        if (x->notice_fn)
            x->notice_fn(x->notice_ctx, ev->data, ev->len);
        break;
    case EV_DONE:
        ev->done(ev->ctx, ev->st);
        break;
    case EV_PEER_ERROR:
        if (ev->peer->on_error)
            ev->peer->on_error(ev->peer->ctx, ev->st);
        break;
    case EV_CALL:
        ev->call(x, ev->arg, ev->st);
        break;
    }
}

void bt__xfer_drain(bt_xfer_t *x)
{
    if (x->draining || x->destroyed)
        return;
    x->draining = true;
    bt__xfer_event_t *ev;
    while ((ev = queue_pop(x))) {
        run_event(x, ev);
        free(ev);
        if (x->destroyed)
            return; /* x stays allocated until its handles close */
    }
    x->draining = false;
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static const bt__xfer_ops_t *ops_for(bt_xfer_kind_t kind)
{
    switch (kind) {
    case BT_XFER_UCX:
        return &bt__xfer_ucx_ops;
    case BT_XFER_INPROC:
        return &bt__xfer_inproc_ops;
    }
    return NULL;
}

static void on_async(uv_async_t *h)
{
    bt_xfer_t *x = h->data;
    if (!x->destroyed)
        x->ops->wake(x);
}

static void on_handle_closed(uv_handle_t *h)
{
    bt_xfer_t *x = h->data;
    if (--x->open_handles == 0) {
        pthread_mutex_destroy(&x->mu);
        free(x);
    }
}

bt_status_t bt_xfer_create(uv_loop_t *loop, const bt_xfer_options_t *opts, bt_xfer_t **x_p)
{
    if (!loop || !opts || !x_p)
        return BT_ERR_INVALID_ARG;
    const bt__xfer_ops_t *ops = ops_for(opts->kind);
    if (!ops)
        return BT_ERR_INVALID_ARG;
    bt_xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        return BT_ERR_NO_MEMORY;
    x->loop = loop;
    x->kind = opts->kind;
    x->ops = ops;
    x->efd = -1;
    pthread_mutex_init(&x->mu, NULL);
    if (uv_async_init(loop, &x->async, on_async) != 0) {
        pthread_mutex_destroy(&x->mu);
        free(x);
        return BT_ERR_INTERNAL;
    }
    x->async.data = x;
    x->open_handles = 1;
    bt_status_t st = ops->init(x, opts);
    if (st != BT_OK) {
        x->destroyed = true;
        if (x->poll_started)
            uv_close((uv_handle_t *)&x->poll, on_handle_closed);
        ops->fini(x);
        uv_close((uv_handle_t *)&x->async, on_handle_closed);
        return st;
    }
    *x_p = x;
    return BT_OK;
}

void bt_xfer_destroy(bt_xfer_t *x)
{
    if (!x)
        return;
    BT_ASSERT(!x->destroyed);
    if (x->npeers || x->nregions)
        BT_LOG_WARN("transfer: destroyed with %d peer(s) and %d region(s) still open", x->npeers,
                    x->nregions);
    BT_ASSERT(x->npeers == 0 && x->nregions == 0);
    x->destroyed = true;
    if (x->poll_started)
        uv_close((uv_handle_t *)&x->poll, on_handle_closed); /* before the fd goes away */
    x->ops->fini(x);
    /* Completions still queued keep their promise to run once; notices are dropped. */
    bt__xfer_event_t *ev;
    while ((ev = queue_pop(x))) {
        if (ev->type == EV_DONE || ev->type == EV_CALL)
            run_event(x, ev);
        free(ev);
    }
    uv_close((uv_handle_t *)&x->async, on_handle_closed);
}

/* ---- regions ----------------------------------------------------------------------------- */

bt_status_t bt_xfer_register(bt_xfer_t *x, void *base, size_t len, bt_xfer_region_t **r_p)
{
    if (!x || !base || len == 0 || !r_p || x->destroyed)
        return BT_ERR_INVALID_ARG;
    bt_xfer_region_t *r = calloc(1, sizeof(*r));
    if (!r)
        return BT_ERR_NO_MEMORY;
    r->x = x;
    r->base = base;
    r->len = len;
    bt_status_t st = x->ops->reg(r);
    if (st != BT_OK) {
        free(r->desc);
        free(r);
        return st;
    }
    x->nregions++;
    *r_p = r;
    return BT_OK;
}

void bt_xfer_deregister(bt_xfer_region_t *r)
{
    if (!r)
        return;
    r->x->ops->dereg(r);
    r->x->nregions--;
    free(r->desc);
    free(r);
}

void bt_xfer_region_desc(const bt_xfer_region_t *r, const uint8_t **desc_p, size_t *len_p)
{
    *desc_p = r->desc;
    *len_p = r->desc_len;
}

void bt_xfer_on_notice(bt_xfer_t *x, bt_xfer_notice_fn fn, void *ctx)
{
    x->notice_fn = fn;
    x->notice_ctx = ctx;
}

/* ---- peers ------------------------------------------------------------------------------- */

bt_status_t bt_xfer_connect(bt_xfer_t *x, const uint8_t *desc, size_t desc_len,
                            void (*on_error)(void *ctx, bt_status_t st), void *ctx,
                            bt_xfer_peer_t **p_p)
{
    if (!x || !desc || !p_p || x->destroyed)
        return BT_ERR_INVALID_ARG;
    bt_xfer_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return BT_ERR_NO_MEMORY;
    p->x = x;
    p->on_error = on_error;
    p->ctx = ctx;
    bt_status_t st = x->ops->connect(p, desc, desc_len);
    if (st != BT_OK) {
        free(p);
        return st;
    }
    x->npeers++;
    *p_p = p;
    return BT_OK;
}

static bool drop_peer_event(bt__xfer_event_t *ev, const bt_xfer_peer_t *p)
{
    return ev->type == EV_PEER_ERROR && ev->peer == p;
}

void bt_xfer_disconnect(bt_xfer_peer_t *p)
{
    if (!p)
        return;
    bt_xfer_t *x = p->x;
    p->closing = true;
    x->ops->disconnect(p); /* may finish commits; keeps p as a zombie if the close hangs */
    /* Commits the transport did not finish are cancelled; their on_done still runs once. */
    while (p->commits) {
        bt__xfer_commit_t *c = p->commits;
        bt__xfer_commit_finish(c, BT_ERR_CANCELLED);
    }
    /* A queued on_error for p must not run after p is gone. */
    pthread_mutex_lock(&x->mu);
    bt__xfer_event_t **pp = &x->q_head, *last = NULL;
    while (*pp) {
        bt__xfer_event_t *ev = *pp;
        if (drop_peer_event(ev, p)) {
            *pp = ev->next;
            free(ev);
        } else {
            last = ev;
            pp = &ev->next;
        }
    }
    x->q_tail = last;
    pthread_mutex_unlock(&x->mu);
    x->npeers--;
    if (!p->zombie)
        free(p);
}

bt_status_t bt_xfer_put(bt_xfer_peer_t *p, uint64_t remote_offset, const void *local, size_t len)
{
    if (!p || (!local && len) || p->closing)
        return BT_ERR_INVALID_ARG;
    if (remote_offset > p->remote_len || len > p->remote_len - remote_offset)
        return BT_ERR_INVALID_ARG;
    if (p->failed != BT_OK)
        return p->failed;
    if (len == 0)
        return BT_OK;
    bt_status_t st = p->x->ops->put(p, remote_offset, local, len);
    if (st == BT_OK) {
        p->x->stats.puts++;
        p->x->stats.bytes_put += len;
    }
    return st;
}

bt_status_t bt_xfer_commit(bt_xfer_peer_t *p, const uint8_t *notice, size_t len,
                           void (*on_done)(void *ctx, bt_status_t st), void *ctx)
{
    if (!p || (!notice && len) || len > BT_XFER_NOTICE_MAX || p->closing)
        return BT_ERR_INVALID_ARG;
    bt__xfer_commit_t *c = calloc(1, sizeof(*c) + len);
    if (!c)
        return BT_ERR_NO_MEMORY;
    c->x = p->x;
    c->peer = p;
    c->on_done = on_done;
    c->ctx = ctx;
    c->len = len;
    if (len)
        memcpy(c->notice, notice, len);
    c->next = p->commits;
    p->commits = c;
    p->x->stats.commits++;
    if (p->failed != BT_OK) {
        bt__xfer_commit_finish(c, p->failed);
        return BT_OK;
    }
    p->x->ops->commit(p, c);
    return BT_OK;
}

void bt_xfer_stats(const bt_xfer_t *x, bt_xfer_stats_t *out)
{
    *out = x->stats;
}

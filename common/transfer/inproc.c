/* In-process transport for unit tests: a region is found through a process-wide registry
 * (id + owner), put is a memcpy, commit queues the notice on the receiver's loop.
 *
 * Descriptor body: u64 pid, u64 region id, u64 base address. The registry is the one
 * mutable global of this module: it is what "in-process" means. Puts copy under the
 * registry lock, so a region cannot be deregistered in the middle of a copy. */
#include "common/transfer/transfer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BODY_LEN 24

typedef struct entry {
    struct entry *next;
    uint64_t id;
    bt_xfer_region_t *r;
} entry_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static entry_t *g_regions;
static uint64_t g_next_id = 1;

/* Caller holds g_mu. */
static bt_xfer_region_t *lookup(uint64_t id)
{
    for (entry_t *e = g_regions; e; e = e->next)
        if (e->id == id)
            return e->r;
    return NULL;
}

static bt_status_t ip_init(bt_xfer_t *x, const bt_xfer_options_t *opts)
{
    return BT_OK;
}

static void ip_fini(bt_xfer_t *x)
{
}

static bt_status_t ip_reg(bt_xfer_region_t *r)
{
    entry_t *e = calloc(1, sizeof(*e));
    r->desc = calloc(1, BT__XFER_DESC_HEAD + BODY_LEN);
    if (!e || !r->desc) {
        free(e);
        return BT_ERR_NO_MEMORY;
    }
    e->r = r;
    pthread_mutex_lock(&g_mu);
    e->id = g_next_id++;
    e->next = g_regions;
    g_regions = e;
    pthread_mutex_unlock(&g_mu);
    r->inproc_id = e->id;
    r->desc_len = BT__XFER_DESC_HEAD + BODY_LEN;
    uint8_t *b = r->desc + BT__XFER_DESC_HEAD;
    bt__xfer_put_u64(b, (uint64_t)getpid());
    bt__xfer_put_u64(b + 8, e->id);
    bt__xfer_put_u64(b + 16, (uint64_t)(uintptr_t)r->base);
    bt__xfer_desc_seal(r->desc, r->desc_len, BT_XFER_INPROC, r->len);
    return BT_OK;
}

static void ip_dereg(bt_xfer_region_t *r)
{
    pthread_mutex_lock(&g_mu);
    for (entry_t **pp = &g_regions; *pp; pp = &(*pp)->next) {
        if ((*pp)->r == r) {
            entry_t *e = *pp;
            *pp = e->next;
            free(e);
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
}

static bt_status_t ip_connect(bt_xfer_peer_t *p, const uint8_t *desc, size_t desc_len)
{
    const uint8_t *b;
    size_t blen;
    uint64_t rlen;
    bt_status_t st = bt__xfer_desc_open(desc, desc_len, BT_XFER_INPROC, &b, &blen, &rlen);
    if (st != BT_OK)
        return st;
    if (blen != BODY_LEN || bt__xfer_get_u64(b) != (uint64_t)getpid())
        return BT_ERR_INVALID_ARG;
    uint64_t id = bt__xfer_get_u64(b + 8), base = bt__xfer_get_u64(b + 16);
    pthread_mutex_lock(&g_mu);
    bt_xfer_region_t *r = lookup(id);
    bool ok = r && (uint64_t)(uintptr_t)r->base == base && r->len == rlen;
    pthread_mutex_unlock(&g_mu);
    if (!r)
        return BT_ERR_UNAVAILABLE; /* well-formed, but the region is gone */
    if (!ok)
        return BT_ERR_INVALID_ARG;
    p->inproc_id = id;
    p->remote_base = base;
    p->remote_len = rlen;
    return BT_OK;
}

static void ip_disconnect(bt_xfer_peer_t *p)
{
}

static bt_status_t ip_put(bt_xfer_peer_t *p, uint64_t off, const void *local, size_t len)
{
    pthread_mutex_lock(&g_mu);
    bt_xfer_region_t *r = lookup(p->inproc_id);
    if (r)
        memmove((uint8_t *)r->base + off, local, len);
    pthread_mutex_unlock(&g_mu);
    if (!r) {
        bt__xfer_peer_fail(p, BT_ERR_PEER);
        return BT_ERR_PEER;
    }
    return BT_OK;
}

static void ip_commit(bt_xfer_peer_t *p, bt__xfer_commit_t *c)
{
    bt_status_t st = BT_ERR_PEER;
    pthread_mutex_lock(&g_mu);
    bt_xfer_region_t *r = lookup(p->inproc_id);
    if (r) /* the owner lives while its region is registered */
        st = bt__xfer_post_notice(r->x, c->notice, c->len);
    pthread_mutex_unlock(&g_mu);
    bt__xfer_commit_finish(c, st);
    if (!r)
        bt__xfer_peer_fail(p, BT_ERR_PEER);
}

static void ip_wake(bt_xfer_t *x)
{
    bt__xfer_drain(x);
}

const bt__xfer_ops_t bt__xfer_inproc_ops = {
    .init = ip_init,
    .fini = ip_fini,
    .reg = ip_reg,
    .dereg = ip_dereg,
    .connect = ip_connect,
    .disconnect = ip_disconnect,
    .put = ip_put,
    .commit = ip_commit,
    .wake = ip_wake,
};

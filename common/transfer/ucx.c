/* UCX (ucp) transport: one context and one worker per bt_xfer_t (UCS_THREAD_MODE_SINGLE),
 * progressed from the uv loop through the worker's event fd (ucp_worker_get_efd +
 * ucp_worker_arm + uv_poll_t) and after every post.
 *
 * Descriptor body (little-endian): u64 remote base, u32 worker address length, u32 packed
 * rkey length, worker address bytes, packed rkey bytes. The whole descriptor is framed and
 * checksummed by transfer.c, so corrupted bytes never reach ucp_ep_create.
 *
 * A commit is a flush of the endpoint (remote completion of every put so far) followed by
 * an active message carrying the notice; RMA and AM may use different lanes, so the flush
 * must complete first. UCX callbacks only free their request and queue an event: the next
 * step runs from the drain, outside ucp_worker_progress. */
#include "common/transfer/transfer_internal.h"

#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AM_NOTICE_ID 0x4254u            /* "BT" */
static const uint8_t am_header[4] = {'B', 'T', 'N', '1'};

#define BODY_FIXED 16
#define ADDR_MAX 8192u
#define RKEY_MAX 8192u

static bt_status_t map_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return BT_OK;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NO_DEVICE:
        return BT_ERR_UNAVAILABLE;
    case UCS_ERR_CANCELED:
        return BT_ERR_CANCELLED;
    case UCS_ERR_NO_MEMORY:
        return BT_ERR_NO_MEMORY;
    default:
        return BT_ERR_PEER;
    }
}

/* ---- progress ---------------------------------------------------------------------------- */

static void ucx_wake(bt_xfer_t *x)
{
    for (int round = 0; round < 64; round++) {
        for (int spins = 0; spins < 4096 && ucp_worker_progress(x->worker); spins++) {
        }
        bt__xfer_drain(x);
        if (x->destroyed)
            return;
        ucs_status_t s = ucp_worker_arm(x->worker);
        if (s == UCS_OK)
            return; /* the event fd wakes us */
        if (s != UCS_ERR_BUSY) {
            BT_LOG_ERROR("transfer: ucp_worker_arm: %s", ucs_status_string(s));
            break;
        }
    }
    bt__xfer_kick(x); /* still busy: let the loop run other handles, come back soon */
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    bt_xfer_t *x = h->data;
    if (!x->destroyed)
        ucx_wake(x);
}

static void after_post(bt_xfer_t *x)
{
    ucp_worker_progress(x->worker);
    bt__xfer_kick(x);
}

/* ---- receiving notices ------------------------------------------------------------------- */

typedef struct {
    bt_xfer_t *x;
    void *desc;
    size_t len;
    uint8_t buf[];
} rndv_t;

static void rndv_done(void *req, ucs_status_t status, size_t length, void *user_data)
{
    rndv_t *rv = user_data;
    ucp_request_free(req);
    if (status == UCS_OK && !rv->x->destroyed)
        bt__xfer_post_notice(rv->x, rv->buf, length);
    else if (status != UCS_OK)
        BT_LOG_WARN("transfer: notice lost: %s", ucs_status_string(status));
    free(rv);
}

static void rndv_start(bt_xfer_t *x, void *arg, bt_status_t st)
{
    rndv_t *rv = arg;
    if (x->destroyed) { /* worker gone with its descriptors */
        free(rv);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = rndv_done,
        .user_data = rv,
    };
    ucs_status_ptr_t s = ucp_am_recv_data_nbx(x->worker, rv->desc, rv->buf, rv->len, &prm);
    if (s == NULL) {
        bt__xfer_post_notice(x, rv->buf, rv->len);
        free(rv);
    } else if (UCS_PTR_IS_ERR(s)) {
        BT_LOG_WARN("transfer: notice lost: %s", ucs_status_string(UCS_PTR_STATUS(s)));
        free(rv);
    } else {
        after_post(x);
    }
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_len, void *data,
                          size_t len, const ucp_am_recv_param_t *param)
{
    bt_xfer_t *x = arg;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (header_len != sizeof(am_header) || memcmp(header, am_header, sizeof(am_header)) != 0 ||
        len > BT_XFER_NOTICE_MAX) {
        BT_LOG_WARN("transfer: dropped a malformed notice (%zu header bytes, %zu bytes)",
                    header_len, len);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (!rndv) {
        /* eager: data is valid only during this callback; the queue copies it */
        if (bt__xfer_post_notice(x, data, len) != BT_OK)
            BT_LOG_WARN("transfer: notice lost: out of memory");
        return UCS_OK;
    }
    rndv_t *rv = malloc(sizeof(*rv) + len);
    if (!rv)
        return UCS_ERR_NO_MEMORY;
    rv->x = x;
    rv->desc = data;
    rv->len = len;
    bt__xfer_post_call(x, rndv_start, rv, BT_OK);
    return UCS_INPROGRESS;
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static bt_status_t cfg_set(ucp_config_t *cfg, const char *name, const char *value)
{
    ucs_status_t s = ucp_config_modify(cfg, name, value);
    if (s != UCS_OK) {
        BT_LOG_ERROR("transfer: UCX_%s=%s: %s", name, value, ucs_status_string(s));
        return BT_ERR_INVALID_ARG;
    }
    return BT_OK;
}

/* Without these, PEER error handling silently drops the shared memory transports. UCX
 * 1.13 reads them from the shared memory components' own config, which ucp_config_modify
 * does not reach ("invalid configurations"), so they go into the environment, once, without
 * overriding a value the operator set. */
static void set_shm_env(void)
{
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
}

static bt_status_t ucx_init(bt_xfer_t *x, const bt_xfer_options_t *opts)
{
    static pthread_once_t env_once = PTHREAD_ONCE_INIT;
    pthread_once(&env_once, set_shm_env);
    ucp_config_t *cfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        BT_LOG_ERROR("transfer: ucp_config_read: %s", ucs_status_string(s));
        return BT_ERR_INTERNAL;
    }
    char keepalive[32];
    snprintf(keepalive, sizeof(keepalive), "%dms", opts->keepalive_ms > 0 ? opts->keepalive_ms : 1000);
    const char *tls = opts->ucx_tls ? opts->ucx_tls : (getenv("UCX_TLS") ? NULL : "tcp,sm");
    bt_status_t st = BT_OK;
    if (tls)
        st = cfg_set(cfg, "TLS", tls);
    if (st == BT_OK && opts->net_devices)
        st = cfg_set(cfg, "NET_DEVICES", opts->net_devices);
    if (st == BT_OK)
        st = cfg_set(cfg, "KEEPALIVE_INTERVAL", keepalive);
    if (st != BT_OK) {
        ucp_config_release(cfg);
        return st;
    }

    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = "baton",
    };
    s = ucp_init(&params, cfg, &x->ucp_ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        BT_LOG_ERROR("transfer: ucp_init (UCX_TLS=%s): %s", tls ? tls : "(env)",
                     ucs_status_string(s));
        x->ucp_ctx = NULL;
        return BT_ERR_UNAVAILABLE;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    s = ucp_worker_create(x->ucp_ctx, &wp, &x->worker);
    if (s != UCS_OK) {
        BT_LOG_ERROR("transfer: ucp_worker_create: %s", ucs_status_string(s));
        x->worker = NULL;
        return BT_ERR_UNAVAILABLE;
    }
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = AM_NOTICE_ID,
        .cb = on_am,
        .arg = x,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
    };
    s = ucp_worker_set_am_recv_handler(x->worker, &ap);
    if (s == UCS_OK)
        s = ucp_worker_get_efd(x->worker, &x->efd);
    if (s != UCS_OK) {
        BT_LOG_ERROR("transfer: worker setup: %s", ucs_status_string(s));
        return BT_ERR_INTERNAL;
    }
    if (uv_poll_init(x->loop, &x->poll, x->efd) != 0)
        return BT_ERR_INTERNAL;
    x->poll.data = x;
    x->poll_started = true;
    x->open_handles++;
    if (uv_poll_start(&x->poll, UV_READABLE, on_poll) != 0)
        return BT_ERR_INTERNAL;
    bt__xfer_kick(x); /* first progress + arm */
    return BT_OK;
}

static void ucx_fini(bt_xfer_t *x)
{
    if (x->worker)
        ucp_worker_destroy(x->worker);
    x->worker = NULL;
    while (x->zombies) {
        bt_xfer_peer_t *p = x->zombies;
        x->zombies = p->next_zombie;
        free(p);
    }
    if (x->ucp_ctx)
        ucp_cleanup(x->ucp_ctx);
    x->ucp_ctx = NULL;
}

/* ---- regions ----------------------------------------------------------------------------- */

static bt_status_t ucx_reg(bt_xfer_region_t *r)
{
    bt_xfer_t *x = r->x;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = r->base,
        .length = r->len,
    };
    ucs_status_t s = ucp_mem_map(x->ucp_ctx, &mp, &r->memh);
    if (s != UCS_OK) {
        BT_LOG_ERROR("transfer: ucp_mem_map %zu bytes: %s", r->len, ucs_status_string(s));
        return s == UCS_ERR_NO_MEMORY ? BT_ERR_NO_MEMORY : BT_ERR_INTERNAL;
    }
    bt_status_t st = BT_ERR_INTERNAL;
    void *rkey = NULL;
    size_t rkey_len = 0;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    s = ucp_rkey_pack(x->ucp_ctx, r->memh, &rkey, &rkey_len);
    if (s != UCS_OK)
        goto unmap;
    s = ucp_worker_get_address(x->worker, &addr, &addr_len);
    if (s != UCS_OK)
        goto release_rkey;
    if (addr_len > ADDR_MAX || rkey_len > RKEY_MAX)
        goto release_addr;
    r->desc_len = BT__XFER_DESC_HEAD + BODY_FIXED + addr_len + rkey_len;
    r->desc = malloc(r->desc_len);
    if (!r->desc) {
        st = BT_ERR_NO_MEMORY;
        goto release_addr;
    }
    uint8_t *b = r->desc + BT__XFER_DESC_HEAD;
    bt__xfer_put_u64(b, (uint64_t)(uintptr_t)r->base);
    bt__xfer_put_u32(b + 8, (uint32_t)addr_len);
    bt__xfer_put_u32(b + 12, (uint32_t)rkey_len);
    memcpy(b + BODY_FIXED, addr, addr_len);
    memcpy(b + BODY_FIXED + addr_len, rkey, rkey_len);
    bt__xfer_desc_seal(r->desc, r->desc_len, BT_XFER_UCX, r->len);
    ucp_worker_release_address(x->worker, addr);
    ucp_rkey_buffer_release(rkey);
    return BT_OK;

release_addr:
    ucp_worker_release_address(x->worker, addr);
release_rkey:
    ucp_rkey_buffer_release(rkey);
unmap:
    if (s != UCS_OK)
        BT_LOG_ERROR("transfer: region descriptor: %s", ucs_status_string(s));
    ucp_mem_unmap(x->ucp_ctx, r->memh);
    return st;
}

static void ucx_dereg(bt_xfer_region_t *r)
{
    ucs_status_t s = ucp_mem_unmap(r->x->ucp_ctx, r->memh);
    if (s != UCS_OK)
        BT_LOG_WARN("transfer: ucp_mem_unmap: %s", ucs_status_string(s));
}

/* ---- peers ------------------------------------------------------------------------------- */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    bt_xfer_peer_t *p = arg;
    if (p->closing)
        return;
    BT_LOG_WARN("transfer: peer failed: %s", ucs_status_string(status));
    bt__xfer_peer_fail(p, map_status(status) == BT_ERR_UNAVAILABLE ? BT_ERR_UNAVAILABLE
                                                                    : BT_ERR_PEER);
}

static bt_status_t ucx_connect(bt_xfer_peer_t *p, const uint8_t *desc, size_t desc_len)
{
    bt_xfer_t *x = p->x;
    const uint8_t *b;
    size_t blen;
    uint64_t rlen;
    bt_status_t st = bt__xfer_desc_open(desc, desc_len, BT_XFER_UCX, &b, &blen, &rlen);
    if (st != BT_OK)
        return st;
    if (blen < BODY_FIXED)
        return BT_ERR_INVALID_ARG;
    uint64_t base = bt__xfer_get_u64(b);
    uint32_t addr_len = bt__xfer_get_u32(b + 8), rkey_len = bt__xfer_get_u32(b + 12);
    if (addr_len == 0 || rkey_len == 0 || addr_len > ADDR_MAX || rkey_len > RKEY_MAX ||
        (uint64_t)BODY_FIXED + addr_len + rkey_len != blen || rlen == 0 ||
        base + rlen < base)
        return BT_ERR_INVALID_ARG;
    /* UCX reads the address and rkey in place; give them aligned private copies */
    uint8_t *addr = malloc(addr_len), *rkey = malloc(rkey_len);
    if (!addr || !rkey) {
        free(addr);
        free(rkey);
        return BT_ERR_NO_MEMORY;
    }
    memcpy(addr, b + BODY_FIXED, addr_len);
    memcpy(rkey, b + BODY_FIXED + addr_len, rkey_len);

    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = p},
    };
    ucs_status_t s = ucp_ep_create(x->worker, &ep, &p->ep);
    if (s != UCS_OK) {
        BT_LOG_WARN("transfer: ucp_ep_create: %s", ucs_status_string(s));
        st = BT_ERR_UNAVAILABLE;
        p->ep = NULL;
        goto out;
    }
    s = ucp_ep_rkey_unpack(p->ep, rkey, &p->rkey);
    if (s != UCS_OK) {
        BT_LOG_WARN("transfer: ucp_ep_rkey_unpack: %s", ucs_status_string(s));
        st = BT_ERR_INVALID_ARG;
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &prm);
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS)
                ucp_worker_progress(x->worker);
            ucp_request_free(req);
        }
        p->ep = NULL;
        goto out;
    }
    p->remote_base = base;
    p->remote_len = rlen;
    after_post(x); /* start the wireup */
    st = BT_OK;
out:
    free(addr);
    free(rkey);
    return st;
}

static int64_t now_ns(void)
{
    return (int64_t)uv_hrtime();
}

/* Progresses until req completes or the deadline passes; true when complete. */
static bool wait_req(bt_xfer_t *x, void *req, int64_t timeout_ns)
{
    int64_t deadline = now_ns() + timeout_ns;
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        if (now_ns() > deadline)
            return false;
        if (!ucp_worker_progress(x->worker)) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    return true;
}

static void ucx_disconnect(bt_xfer_peer_t *p)
{
    bt_xfer_t *x = p->x;
    bool healthy = p->failed == BT_OK;
    if (healthy) { /* puts land before the rkey goes */
        ucp_request_param_t prm = {.op_attr_mask = 0};
        ucs_status_ptr_t req = ucp_ep_flush_nbx(p->ep, &prm);
        if (UCS_PTR_IS_PTR(req)) {
            healthy = wait_req(x, req, 2000000000ll) &&
                      ucp_request_check_status(req) == UCS_OK;
            ucp_request_free(req);
        } else if (UCS_PTR_IS_ERR(req)) {
            healthy = false;
        }
    }
    ucp_rkey_destroy(p->rkey);
    p->rkey = NULL;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = healthy ? 0 : UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &prm);
    p->ep = NULL;
    if (UCS_PTR_IS_PTR(req)) {
        bool done = wait_req(x, req, healthy ? 2000000000ll : 1000000000ll);
        ucp_request_free(req); /* an unfinished request is released when it completes */
        if (!done) {
            /* the endpoint's error handler may still name p: keep it until the worker goes */
            BT_LOG_WARN("transfer: endpoint close did not finish in time");
            p->zombie = true;
            p->next_zombie = x->zombies;
            x->zombies = p;
        }
    }
    /* whatever the close completed was queued; let the loop deliver it */
    bt__xfer_kick(x);
}

static void put_done(void *req, ucs_status_t status, void *user_data)
{
    bt_xfer_peer_t *p = user_data;
    ucp_request_free(req);
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        bt__xfer_peer_fail(p, map_status(status));
}

static bt_status_t ucx_put(bt_xfer_peer_t *p, uint64_t off, const void *local, size_t len)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = put_done,
        .user_data = p,
    };
    ucs_status_ptr_t s = ucp_put_nbx(p->ep, local, len, p->remote_base + off, p->rkey, &prm);
    if (UCS_PTR_IS_ERR(s)) {
        bt_status_t st = map_status(UCS_PTR_STATUS(s));
        bt__xfer_peer_fail(p, st);
        return st;
    }
    after_post(p->x);
    return BT_OK;
}

static void notice_sent(bt_xfer_t *x, void *arg, bt_status_t st)
{
    bt__xfer_commit_t *c = arg;
    if (c->finished) {
        bt__xfer_commit_release(c);
        return;
    }
    c->req_pending = false;
    bt_xfer_peer_t *p = c->peer;
    bt__xfer_commit_finish(c, st == BT_OK ? BT_OK : p->failed ? p->failed : st);
    if (st != BT_OK)
        bt__xfer_peer_fail(p, st);
}

static void notice_send_cb(void *req, ucs_status_t status, void *user_data)
{
    bt__xfer_commit_t *c = user_data;
    ucp_request_free(req);
    bt__xfer_post_call(c->x, notice_sent, c, map_status(status));
}

static void send_notice(bt__xfer_commit_t *c)
{
    bt_xfer_peer_t *p = c->peer;
    if (p->failed != BT_OK) {
        bt__xfer_commit_finish(c, p->failed);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = notice_send_cb,
        .user_data = c,
    };
    ucs_status_ptr_t s =
        ucp_am_send_nbx(p->ep, AM_NOTICE_ID, am_header, sizeof(am_header), c->notice, c->len, &prm);
    if (s == NULL) {
        bt__xfer_commit_finish(c, BT_OK);
    } else if (UCS_PTR_IS_ERR(s)) {
        bt_status_t st = map_status(UCS_PTR_STATUS(s));
        bt__xfer_commit_finish(c, p->failed ? p->failed : st);
        bt__xfer_peer_fail(p, st);
    } else {
        c->req_pending = true;
        after_post(c->x);
    }
}

static void flushed(bt_xfer_t *x, void *arg, bt_status_t st)
{
    bt__xfer_commit_t *c = arg;
    if (c->finished) {
        bt__xfer_commit_release(c);
        return;
    }
    c->req_pending = false;
    if (st != BT_OK) {
        bt_xfer_peer_t *p = c->peer;
        bt__xfer_commit_finish(c, p->failed ? p->failed : st);
        bt__xfer_peer_fail(p, st);
        return;
    }
    send_notice(c);
}

static void flush_cb(void *req, ucs_status_t status, void *user_data)
{
    bt__xfer_commit_t *c = user_data;
    ucp_request_free(req);
    bt__xfer_post_call(c->x, flushed, c, map_status(status));
}

static void ucx_commit(bt_xfer_peer_t *p, bt__xfer_commit_t *c)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_cb,
        .user_data = c,
    };
    ucs_status_ptr_t s = ucp_ep_flush_nbx(p->ep, &prm);
    if (s == NULL) {
        send_notice(c);
    } else if (UCS_PTR_IS_ERR(s)) {
        bt_status_t st = map_status(UCS_PTR_STATUS(s));
        bt__xfer_commit_finish(c, p->failed ? p->failed : st);
        bt__xfer_peer_fail(p, st);
    } else {
        c->req_pending = true;
        after_post(p->x);
    }
}

const bt__xfer_ops_t bt__xfer_ucx_ops = {
    .init = ucx_init,
    .fini = ucx_fini,
    .reg = ucx_reg,
    .dereg = ucx_dereg,
    .connect = ucx_connect,
    .disconnect = ucx_disconnect,
    .put = ucx_put,
    .commit = ucx_commit,
    .wake = ucx_wake,
};

/* Internals shared by the transfer front end (transfer.c) and its transports (ucx.c,
 * inproc.c). Not a public header.
 *
 * Every callback a user sees runs from the owner's event queue, drained on the loop thread
 * outside any UCX progress call: transports only queue events (bt__xfer_post_*), the queue
 * is drained from the uv_async handle (and by UCX after progress). This keeps user code
 * free to call any bt_xfer_* function, including disconnect and destroy, from a callback. */
#ifndef BT_TRANSFER_INTERNAL_H
#define BT_TRANSFER_INTERNAL_H

#include "common/transfer/transfer.h"

#include <pthread.h>
#include <stdbool.h>
#include <ucp/api/ucp.h>

/* ---- descriptor framing (all integers little-endian) -----------------------------------
 *   0  u8[4] magic "BTXD"
 *   4  u8    version (1)
 *   5  u8    kind (bt_xfer_kind_t)
 *   6  u16   reserved, 0
 *   8  u64   checksum (FNV-1a 64 of bytes [16, end))
 *  16  u64   region length
 *  24  ...   transport part */
#define BT__XFER_DESC_MAGIC "BTXD"
#define BT__XFER_DESC_VERSION 1
#define BT__XFER_DESC_HEAD 24
#define BT__XFER_DESC_MAX (64u * 1024u)

void bt__xfer_put_u32(uint8_t *p, uint32_t v);
void bt__xfer_put_u64(uint8_t *p, uint64_t v);
uint32_t bt__xfer_get_u32(const uint8_t *p);
uint64_t bt__xfer_get_u64(const uint8_t *p);
/* Fills the head of a descriptor of total size len (>= BT__XFER_DESC_HEAD) whose transport
 * part is already written. */
void bt__xfer_desc_seal(uint8_t *desc, size_t len, bt_xfer_kind_t kind, uint64_t region_len);
/* Checks the head; on success returns the transport part and the region length. */
bt_status_t bt__xfer_desc_open(const uint8_t *desc, size_t len, bt_xfer_kind_t kind,
                               const uint8_t **body_p, size_t *body_len_p,
                               uint64_t *region_len_p);

/* ---- objects --------------------------------------------------------------------------- */
typedef struct bt__xfer_event bt__xfer_event_t;
typedef struct bt__xfer_commit bt__xfer_commit_t;

typedef struct {
    bt_status_t (*init)(bt_xfer_t *x, const bt_xfer_options_t *opts);
    /* Releases the transport; the uv handles are closed by the front end afterwards. */
    void (*fini)(bt_xfer_t *x);
    /* Fills r->desc / r->desc_len (malloc'd, freed by the front end). */
    bt_status_t (*reg)(bt_xfer_region_t *r);
    void (*dereg)(bt_xfer_region_t *r);
    /* Parses desc, fills p->remote_len and the transport fields. */
    bt_status_t (*connect)(bt_xfer_peer_t *p, const uint8_t *desc, size_t desc_len);
    void (*disconnect)(bt_xfer_peer_t *p);
    bt_status_t (*put)(bt_xfer_peer_t *p, uint64_t off, const void *local, size_t len);
    /* Takes c (its notice already copied); ends, now or later, in bt__xfer_commit_finish
     * exactly once (never calling on_done itself: finish queues it). */
    void (*commit)(bt_xfer_peer_t *p, bt__xfer_commit_t *c);
    /* Runs from the async handle: progress, then drain. */
    void (*wake)(bt_xfer_t *x);
} bt__xfer_ops_t;

extern const bt__xfer_ops_t bt__xfer_ucx_ops;
extern const bt__xfer_ops_t bt__xfer_inproc_ops;

struct bt_xfer {
    uv_loop_t *loop;
    bt_xfer_kind_t kind;
    const bt__xfer_ops_t *ops;
    uv_async_t async;
    uv_poll_t poll;        /* UCX: the worker's event fd */
    bool poll_started;
    bool destroyed;        /* destroy was called; memory lives until the handles closed */
    int open_handles;

    pthread_mutex_t mu;    /* guards the queue; inproc senders push from any thread */
    bt__xfer_event_t *q_head, *q_tail;
    bool draining;

    bt_xfer_notice_fn notice_fn;
    void *notice_ctx;
    bt_xfer_stats_t stats;
    int nregions, npeers;

    /* UCX */
    ucp_context_h ucp_ctx;
    ucp_worker_h worker;
    int efd;
    bt_xfer_peer_t *zombies; /* peers whose close did not finish in time; freed at destroy */
};

struct bt_xfer_region {
    bt_xfer_t *x;
    void *base;
    size_t len;
    uint8_t *desc;
    size_t desc_len;
    ucp_mem_h memh;       /* UCX */
    uint64_t inproc_id;   /* inproc */
};

struct bt_xfer_peer {
    bt_xfer_t *x;
    void (*on_error)(void *ctx, bt_status_t st);
    void *ctx;
    bt_status_t failed;     /* BT_OK while usable */
    bool error_queued;
    bool closing;
    bool zombie;            /* owned by x->zombies now */
    uint64_t remote_base, remote_len;
    bt__xfer_commit_t *commits; /* outstanding, linked by next */
    bt_xfer_peer_t *next_zombie;
    /* UCX */
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    /* inproc */
    uint64_t inproc_id;
};

struct bt__xfer_commit {
    bt__xfer_commit_t *next;
    bt_xfer_t *x;
    bt_xfer_peer_t *peer;    /* NULL once finished */
    void (*on_done)(void *ctx, bt_status_t st);
    void *ctx;
    bool finished;           /* on_done queued */
    bool req_pending;        /* a UCX request still refers to this commit */
    size_t len;
    uint8_t notice[];
};

/* ---- event queue ----------------------------------------------------------------------- */
/* Queues a notice (copied) for x's on_notice; thread-safe; wakes x's loop. */
bt_status_t bt__xfer_post_notice(bt_xfer_t *x, const uint8_t *notice, size_t len);
/* Marks p failed with st, finishes its outstanding commits with it and queues its on_error
 * once. Loop thread only. A transport finishing a commit because of the failure calls
 * bt__xfer_commit_finish first, then this. */
void bt__xfer_peer_fail(bt_xfer_peer_t *p, bt_status_t st);
/* Queues fn(x, arg, st) to run from the drain. Loop thread only. */
void bt__xfer_post_call(bt_xfer_t *x, void (*fn)(bt_xfer_t *x, void *arg, bt_status_t st),
                        void *arg, bt_status_t st);
/* Queues c's on_done(st), unlinks it from its peer and frees it unless a request still
 * refers to it (then the transport frees it with bt__xfer_commit_release). */
void bt__xfer_commit_finish(bt__xfer_commit_t *c, bt_status_t st);
/* The transport's last reference to c went away. */
void bt__xfer_commit_release(bt__xfer_commit_t *c);
/* Runs the queued events. Loop thread only. */
void bt__xfer_drain(bt_xfer_t *x);
/* Makes the loop run ops->wake soon. Thread-safe. */
void bt__xfer_kick(bt_xfer_t *x);

#endif

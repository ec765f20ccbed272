/* Bulk KV bytes between processes: one-sided puts into a peer's registered memory, then a
 * small notice that arrives only after the puts are remotely complete.
 *
 * Two transports behind one interface: UCX (ucp: RMA + active messages; tcp and shared
 * memory on a laptop, RoCE in production) and an in-process one for unit tests.
 *
 *   bt_xfer_t *x;  bt_xfer_create(loop, &opts, &x);        // opts.kind = BT_XFER_UCX
 *   // receiver (decode): register the KV pool once, publish its descriptor out of band
 *   bt_xfer_region_t *r; bt_xfer_register(x, pool_base, pool_bytes, &r);
 *   bt_xfer_region_desc(r, &desc, &desc_len);              // bytes for gRPC
 *   bt_xfer_on_notice(x, on_notice, ctx);                  // notices from any peer
 *   // sender (prefill)
 *   bt_xfer_peer_t *p; bt_xfer_connect(x, desc, desc_len, on_peer_error, ctx, &p);
 *   bt_xfer_put(p, remote_offset, local_ptr, len);         // as many as needed
 *   bt_xfer_commit(p, notice, notice_len, on_committed, ctx);  // flush, then the notice
 *   ...
 *   bt_xfer_disconnect(p);  bt_xfer_deregister(r);  bt_xfer_destroy(x);
 *
 * All callbacks run on the loop thread. A peer that dies is reported (on_peer_error for the
 * sender, on_notice is simply never called for the receiver: it relies on its deadlines). */
#ifndef BT_TRANSFER_H
#define BT_TRANSFER_H

#include "common/status.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef enum {
    BT_XFER_UCX,     /* UCX, transports from opts.ucx_tls (UCX_TLS syntax: "tcp", "sm", "tcp,sm") */
    BT_XFER_INPROC,  /* same process, memcpy; for unit tests */
} bt_xfer_kind_t;

typedef struct {
    bt_xfer_kind_t kind;
    const char *ucx_tls;      /* NULL = "tcp,sm" ... (tests pick one) */
    const char *net_devices;  /* UCX_NET_DEVICES, NULL = all ("lo" in tests) */
    int keepalive_ms;         /* peer keepalive; default 1000 */
} bt_xfer_options_t;

typedef struct bt_xfer bt_xfer_t;
typedef struct bt_xfer_region bt_xfer_region_t;
typedef struct bt_xfer_peer bt_xfer_peer_t;

bt_status_t bt_xfer_create(uv_loop_t *loop, const bt_xfer_options_t *opts, bt_xfer_t **x_p);
/* Peers and regions must be released first. */
void bt_xfer_destroy(bt_xfer_t *x);

/* Registers [base, base+len) for remote writes. */
bt_status_t bt_xfer_register(bt_xfer_t *x, void *base, size_t len, bt_xfer_region_t **r_p);
void bt_xfer_deregister(bt_xfer_region_t *r);
/* Self-contained descriptor of the region (transport address, remote key, base, length):
 * what a sender needs to connect and write. Owned by the region. */
void bt_xfer_region_desc(const bt_xfer_region_t *r, const uint8_t **desc_p, size_t *len_p);

/* Receiver side: a notice from a sender, delivered after the puts committed before it
 * are visible in the region. The bytes are valid during the callback. */
typedef void (*bt_xfer_notice_fn)(void *ctx, const uint8_t *notice, size_t len);
void bt_xfer_on_notice(bt_xfer_t *x, bt_xfer_notice_fn fn, void *ctx);

/* Sender side. on_error (may be NULL) reports a failed peer once (BT_ERR_PEER /
 * BT_ERR_UNAVAILABLE); after it every operation on the peer fails. */
bt_status_t bt_xfer_connect(bt_xfer_t *x, const uint8_t *desc, size_t desc_len,
                            void (*on_error)(void *ctx, bt_status_t st), void *ctx,
                            bt_xfer_peer_t **p_p);
void bt_xfer_disconnect(bt_xfer_peer_t *p);
/* Writes len bytes from local (which must stay valid until the next commit completes) to
 * offset of the remote region. BT_ERR_INVALID_ARG when out of the region's bounds. */
bt_status_t bt_xfer_put(bt_xfer_peer_t *p, uint64_t remote_offset, const void *local, size_t len);
/* Flushes every put so far to remote completion, then sends the notice (copied, at most
 * BT_XFER_NOTICE_MAX bytes). on_done (may be NULL) reports BT_OK or the failure (a failed
 * peer: BT_ERR_PEER / BT_ERR_UNAVAILABLE; disconnected first: BT_ERR_CANCELLED); it always
 * runs once, later on the loop, never inside commit. commit itself returns an error only for
 * bad arguments (p NULL, notice NULL with len > 0, len too large), and then on_done is not
 * called. */
#define BT_XFER_NOTICE_MAX 65536
bt_status_t bt_xfer_commit(bt_xfer_peer_t *p, const uint8_t *notice, size_t len,
                           void (*on_done)(void *ctx, bt_status_t st), void *ctx);

/* Counters for metrics. */
typedef struct {
    uint64_t bytes_put, puts, commits, commit_failures, notices_received;
} bt_xfer_stats_t;
void bt_xfer_stats(const bt_xfer_t *x, bt_xfer_stats_t *out);

#endif

/* gRPC (C core) servers and clients on a libuv loop. Messages are opaque bytes (the caller
 * packs and unpacks protobuf-c); every callback runs on the loop thread.
 *
 * One thread per process blocks in grpc_completion_queue_next and hands (tag, ok) to the loop
 * through uv_async (PLUMBING.md: polling from a timer costs ~1 ms per call).
 *
 *   bt_rpc_t *rpc;        bt_rpc_create(loop, &rpc);                 // one per loop
 *   bt_rpc_server_t *srv; bt_rpc_server_create(rpc, "127.0.0.1:0", &opts, &srv);
 *   bt_rpc_server_method(srv, "/baton.v1.Baton/Generate", BT_RPC_SERVER_STREAM, on_generate, ctx);
 *   bt_rpc_server_start(srv);  bt_rpc_server_port(srv);
 *     on_generate(ctx, call, req, len): bt_rpc_call_send(call, bytes, n, on_sent, ctx) ...
 *                                       bt_rpc_call_finish(call, BT_RPC_OK, NULL);
 *   bt_rpc_channel_t *ch; bt_rpc_channel_create(rpc, "127.0.0.1:7001", &opts, &ch);
 *   bt_rpc_client_call_t *c;
 *   bt_rpc_stream(ch, "/baton.v1.Baton/Generate", req, n, deadline_ms, on_msg, on_done, ctx, &c);
 *   bt_rpc_client_cancel(c);           // on_done still comes, with BT_RPC_CANCELLED
 *   ...
 *   bt_rpc_server_shutdown(srv, grace_ms, on_down, ctx);  bt_rpc_channel_destroy(ch);
 *   bt_rpc_destroy(rpc);               // after servers and channels are gone
 */
#ifndef BT_RPC_H
#define BT_RPC_H

#include "common/status.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* gRPC status codes (the numbers are gRPC's). */
typedef enum {
    BT_RPC_OK = 0,
    BT_RPC_CANCELLED = 1,
    BT_RPC_UNKNOWN = 2,
    BT_RPC_INVALID_ARGUMENT = 3,
    BT_RPC_DEADLINE_EXCEEDED = 4,
    BT_RPC_NOT_FOUND = 5,
    BT_RPC_ALREADY_EXISTS = 6,
    BT_RPC_PERMISSION_DENIED = 7,
    BT_RPC_RESOURCE_EXHAUSTED = 8,
    BT_RPC_FAILED_PRECONDITION = 9,
    BT_RPC_ABORTED = 10,
    BT_RPC_OUT_OF_RANGE = 11,
    BT_RPC_UNIMPLEMENTED = 12,
    BT_RPC_INTERNAL = 13,
    BT_RPC_UNAVAILABLE = 14,
    BT_RPC_DATA_LOSS = 15,
    BT_RPC_UNAUTHENTICATED = 16,
} bt_rpc_code_t;

const char *bt_rpc_code_name(bt_rpc_code_t code); /* "UNAVAILABLE" ... */

typedef struct bt_rpc bt_rpc_t;
typedef struct bt_rpc_server bt_rpc_server_t;
typedef struct bt_rpc_call bt_rpc_call_t;          /* a server-side call */
typedef struct bt_rpc_channel bt_rpc_channel_t;
typedef struct bt_rpc_client_call bt_rpc_client_call_t;

typedef struct {
    size_t max_message_bytes; /* both directions; default 64 MiB */
    int keepalive_ms;         /* HTTP/2 keepalive ping interval; 0 = gRPC default */
} bt_rpc_options_t;

bt_status_t bt_rpc_create(uv_loop_t *loop, bt_rpc_t **rpc_p);
/* All servers and channels must be destroyed first (servers: on_down has run). Leftovers are
 * a caller bug but never a hang: servers are cut off and channel calls cancelled (their final
 * callbacks run inside this call). Not from inside an rpc callback (defer it, e.g. with a
 * uv timer). Run the loop once more afterwards to close its handle. */
void bt_rpc_destroy(bt_rpc_t *rpc);
/* The loop the rpc instance runs its callbacks on. */
uv_loop_t *bt_rpc_loop(const bt_rpc_t *rpc);

/* ---- server ------------------------------------------------------------------------ */

typedef enum { BT_RPC_UNARY, BT_RPC_SERVER_STREAM } bt_rpc_kind_t;

/* A new call with its one request message. The handler owns `call` until it finishes it;
 * req is valid only during the callback. */
typedef void (*bt_rpc_handler_fn)(void *ctx, bt_rpc_call_t *call, const uint8_t *req, size_t len);

/* addr "host:port" (port 0 picks one). */
bt_status_t bt_rpc_server_create(bt_rpc_t *rpc, const char *addr, const bt_rpc_options_t *opts,
                                 bt_rpc_server_t **srv_p);
/* Before start. Unknown methods get UNIMPLEMENTED. */
bt_status_t bt_rpc_server_method(bt_rpc_server_t *srv, const char *method, bt_rpc_kind_t kind,
                                 bt_rpc_handler_fn fn, void *ctx);
bt_status_t bt_rpc_server_start(bt_rpc_server_t *srv);
int bt_rpc_server_port(const bt_rpc_server_t *srv);
/* Graceful: refuse new calls, let running ones finish for up to grace_ms, then cancel them;
 * on_down runs once everything is released (then the server is freed). */
void bt_rpc_server_shutdown(bt_rpc_server_t *srv, int grace_ms, void (*on_down)(void *ctx),
                            void *ctx);

/* Streams one message (server-streaming calls only: BT_ERR_INVALID_ARG on a unary call or
 * after finish). Messages are sent in order; on_sent (may be NULL) reports BT_OK or
 * BT_ERR_CANCELLED when the client is gone, always later from the loop (also for messages
 * queued before a finish). The bytes are copied. */
bt_status_t bt_rpc_call_send(bt_rpc_call_t *call, const uint8_t *msg, size_t len,
                             void (*on_sent)(void *ctx, bt_status_t st), void *ctx);
/* Unary reply: message then OK status. Ends the call like bt_rpc_call_finish (do not finish
 * it again). */
bt_status_t bt_rpc_call_reply(bt_rpc_call_t *call, const uint8_t *msg, size_t len);
/* Ends the call with a status (after queued messages); the call is released afterwards and
 * must not be used again. message may be NULL. */
void bt_rpc_call_finish(bt_rpc_call_t *call, bt_rpc_code_t code, const char *message);
/* Called once if the client cancels, disconnects or its deadline passes before finish. The
 * handler must still call bt_rpc_call_finish (which then only releases). */
void bt_rpc_call_on_cancel(bt_rpc_call_t *call, void (*fn)(void *ctx), void *ctx);
/* Milliseconds left until the client's deadline; INT64_MAX when none. */
int64_t bt_rpc_call_deadline_left_ms(const bt_rpc_call_t *call);
/* The peer address ("ipv4:127.0.0.1:5555"), owned by the call. */
const char *bt_rpc_call_peer(const bt_rpc_call_t *call);

/* ---- client ------------------------------------------------------------------------ */

bt_status_t bt_rpc_channel_create(bt_rpc_t *rpc, const char *target, const bt_rpc_options_t *opts,
                                  bt_rpc_channel_t **ch_p);
/* Cancels the channel's calls (their on_done still run) and frees it once they are done. */
void bt_rpc_channel_destroy(bt_rpc_channel_t *ch);

/* Final status of a client call; message may be NULL. The call is released after it. */
typedef void (*bt_rpc_done_fn)(void *ctx, bt_rpc_code_t code, const char *message);
/* One response message of a streaming call (bytes valid during the callback). */
typedef void (*bt_rpc_message_fn)(void *ctx, const uint8_t *msg, size_t len);
/* Unary: on_reply gets the response (NULL, 0 on failure) together with the status. */
typedef void (*bt_rpc_reply_fn)(void *ctx, bt_rpc_code_t code, const char *message,
                                const uint8_t *resp, size_t len);

/* deadline_ms <= 0 means none. call_p (may be NULL) receives a handle for cancel, valid
 * until the final callback. */
bt_status_t bt_rpc_unary(bt_rpc_channel_t *ch, const char *method, const uint8_t *req, size_t len,
                         int64_t deadline_ms, bt_rpc_reply_fn on_reply, void *ctx,
                         bt_rpc_client_call_t **call_p);
bt_status_t bt_rpc_stream(bt_rpc_channel_t *ch, const char *method, const uint8_t *req,
                          size_t len, int64_t deadline_ms, bt_rpc_message_fn on_message,
                          bt_rpc_done_fn on_done, void *ctx, bt_rpc_client_call_t **call_p);
/* Cancels; the final callback still runs once, with BT_RPC_CANCELLED. */
void bt_rpc_client_cancel(bt_rpc_client_call_t *call);

#endif

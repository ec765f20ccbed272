/* One status type for the whole tree.
 *
 *   bt_status_t st = bt_something(...);
 *   if (st != BT_OK) { BT_LOG_ERROR("load failed: %s", bt_status_str(st)); ... }
 *
 * Errors are negative and grouped by what they affect; the enum and the strings come from
 * the one X-macro below, so they cannot drift apart. */
#ifndef BT_STATUS_H
#define BT_STATUS_H

#define BT_STATUS_LIST(X)                                                                          \
    X(BT_OK, 0, "ok")                                                                              \
    /* generic / caller */                                                                         \
    X(BT_ERR_INVALID_ARG, -1, "invalid argument")                                                  \
    X(BT_ERR_NO_MEMORY, -2, "out of memory")                                                       \
    X(BT_ERR_IO, -3, "i/o error")                                                                  \
    X(BT_ERR_NOT_FOUND, -4, "not found")                                                           \
    X(BT_ERR_UNSUPPORTED, -5, "unsupported")                                                       \
    X(BT_ERR_INTERNAL, -6, "internal error")                                                       \
    /* model and checkpoint */                                                                     \
    X(BT_ERR_BAD_CONFIG, -20, "bad model config")                                                  \
    X(BT_ERR_BAD_CHECKPOINT, -21, "bad checkpoint")                                                \
    X(BT_ERR_BAD_TOKENIZER, -22, "bad tokenizer")                                                  \
    /* request */                                                                                  \
    X(BT_ERR_BAD_REQUEST, -40, "bad request")                                                      \
    X(BT_ERR_TOO_LONG, -41, "input too long")                                                      \
    X(BT_ERR_CANCELLED, -42, "cancelled")                                                          \
    X(BT_ERR_DEADLINE, -43, "deadline exceeded")                                                   \
    X(BT_ERR_EXHAUSTED, -44, "resource exhausted")                                                 \
    /* connection / peer */                                                                        \
    X(BT_ERR_UNAVAILABLE, -60, "unavailable")                                                      \
    X(BT_ERR_PEER, -61, "peer error")                                                              \
    X(BT_ERR_INCOMPATIBLE, -62, "incompatible peer")                                               \
    /* worker / device */                                                                          \
    X(BT_ERR_WORKER, -80, "worker failure")                                                        \
    X(BT_ERR_DEVICE, -81, "device error")

typedef enum {
#define BT__STATUS_ENUM(name, value, str) name = value,
    BT_STATUS_LIST(BT__STATUS_ENUM)
#undef BT__STATUS_ENUM
} bt_status_t;

/* Static string for a status; never NULL ("unknown status" for values outside the list). */
const char *bt_status_str(bt_status_t st);

/* The enum name ("BT_ERR_IO"), for logs and metrics labels. */
const char *bt_status_name(bt_status_t st);

#endif

/* What the comm backends share: the handle every backend embeds first, and its small vtable.
 * comm.c checks arguments, then dispatches; backends may assume valid arguments. */
#ifndef BT_COMM_INTERNAL_H
#define BT_COMM_INTERNAL_H

#include "common/comm/comm.h"

#include <stdint.h>

typedef struct bt__comm_ops {
    const char *name;
    bt_status_t (*all_reduce_f32)(bt_comm_t *comm, float *buf, size_t n);
    bt_status_t (*all_gather)(bt_comm_t *comm, const void *send, size_t bytes, void *recv);
    bt_status_t (*broadcast)(bt_comm_t *comm, void *buf, size_t bytes, int root);
    bt_status_t (*barrier)(bt_comm_t *comm);
    void (*destroy)(bt_comm_t *comm);
} bt__comm_ops_t;

struct bt_comm {
    const bt__comm_ops_t *ops;
    int rank;
    int n_ranks;
    int timeout_ms;
    bool device_buffers; /* NCCL: buffers are device pointers */
};

#define BT__COMM_DEFAULT_TIMEOUT_MS 60000

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t bt__comm_now_ms(void);

#endif

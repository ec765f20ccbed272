/* Argument checks and dispatch to the backend (threads.c, socket.c, nccl.c). */
#include "common/comm/comm_internal.h"

#include "common/alloc.h"
#include "common/log.h"

#include <time.h>

int64_t bt__comm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void bt_comm_destroy(bt_comm_t *comm)
{
    if (!comm) return;
    comm->ops->destroy(comm);
}

bool bt_comm_device_buffers(const bt_comm_t *comm)
{
    return comm->device_buffers;
}

int bt_comm_rank(const bt_comm_t *comm)
{
    return comm->rank;
}

int bt_comm_size(const bt_comm_t *comm)
{
    return comm->n_ranks;
}

bt_status_t bt_comm_set_timeout_ms(bt_comm_t *comm, int timeout_ms)
{
    if (!comm || timeout_ms <= 0) return BT_ERR_INVALID_ARG;
    comm->timeout_ms = timeout_ms;
    return BT_OK;
}

bt_status_t bt_comm_all_reduce_f32(bt_comm_t *comm, float *buf, size_t n)
{
    size_t bytes;
    if (!comm || (n && !buf) || bt_mul_overflows(n, sizeof(float), &bytes))
        return BT_ERR_INVALID_ARG;
    return comm->ops->all_reduce_f32(comm, buf, n);
}

bt_status_t bt_comm_all_gather(bt_comm_t *comm, const void *send, size_t bytes, void *recv)
{
    size_t total;
    if (!comm || (bytes && (!send || !recv)) ||
        bt_mul_overflows(bytes, (size_t)comm->n_ranks, &total))
        return BT_ERR_INVALID_ARG;
    return comm->ops->all_gather(comm, send, bytes, recv);
}

bt_status_t bt_comm_broadcast(bt_comm_t *comm, void *buf, size_t bytes, int root)
{
    if (!comm || (bytes && !buf) || root < 0 || root >= comm->n_ranks) {
        BT_LOG_ERROR("comm: broadcast with bad arguments (root %d)", root);
        return BT_ERR_INVALID_ARG;
    }
    return comm->ops->broadcast(comm, buf, bytes, root);
}

bt_status_t bt_comm_barrier(bt_comm_t *comm)
{
    if (!comm) return BT_ERR_INVALID_ARG;
    return comm->ops->barrier(comm);
}

#ifndef BT_HAVE_NCCL
bt_status_t bt_comm_nccl_unique_id(unsigned char id_p[BT_COMM_NCCL_ID_BYTES])
{
    (void)id_p;
    return BT_ERR_UNSUPPORTED;
}

bt_status_t bt_comm_nccl_create(int rank, int n_ranks,
                                const unsigned char unique_id[BT_COMM_NCCL_ID_BYTES], void *stream,
                                bt_comm_t **comm_p)
{
    (void)rank, (void)n_ranks, (void)unique_id, (void)stream, (void)comm_p;
    BT_LOG_ERROR("comm: built without NCCL (CUDA off)");
    return BT_ERR_UNSUPPORTED;
}
#endif

/* NCCL backend: one process (or thread) per GPU, buffers in device memory.
 *
 * The communicator is created non-blocking (ncclConfig_t.blocking = 0) so that no NCCL call
 * can hang: each call is enqueued on the handle's stream, then this file polls
 * ncclCommGetAsyncError and cudaStreamQuery until the work is done, an error shows, or the
 * handle's timeout passes; then the communicator is aborted and the call fails with
 * BT_ERR_PEER (a peer failed or never came) or BT_ERR_DEVICE (a local CUDA/NCCL error).
 *
 * The sum is NCCL's (ring / tree order, chosen by NCCL): identical on every rank for one NCCL
 * version and topology, but not the host backends' rank-ordered sum, so the last bits can
 * differ from a run on the threads or socket backend. */
#include "common/comm/comm_internal.h"

#include "common/log.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(BT_COMM_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");

typedef struct {
    bt_comm_t base;
    ncclComm_t nc;
    cudaStream_t stream;
    float *scratch; /* one device float for barriers */
    bool broken;
} ncomm_t;

static bt_status_t fail(ncomm_t *s, const char *op, ncclResult_t r)
{
    const char *last = s->nc ? ncclGetLastError(s->nc) : NULL;
    BT_LOG_ERROR("comm(nccl): rank %d: %s failed: %s%s%s", s->base.rank, op, ncclGetErrorString(r),
                 last && *last ? ": " : "", last ? last : "");
    if (s->nc) ncclCommAbort(s->nc);
    s->nc = NULL;
    s->broken = true;
    return r == ncclRemoteError || r == ncclSystemError ? BT_ERR_PEER : BT_ERR_DEVICE;
}

/* Waits until the communicator has no call in progress and (with stream) the stream is idle. */
static bt_status_t wait_done(ncomm_t *s, const char *op, bool stream)
{
    int64_t end = bt__comm_now_ms() + s->base.timeout_ms;
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(s->nc, &async);
        if (r != ncclSuccess) async = r;
        if (async != ncclSuccess && async != ncclInProgress) return fail(s, op, async);
        if (async == ncclSuccess) {
            if (!stream) return BT_OK;
            cudaError_t ce = cudaStreamQuery(s->stream);
            if (ce == cudaSuccess) return BT_OK;
            if (ce != cudaErrorNotReady) {
                (void)cudaGetLastError(); /* clear the error that is not sticky */
                BT_LOG_ERROR("comm(nccl): rank %d: %s: %s", s->base.rank, op,
                             cudaGetErrorString(ce));
                ncclCommAbort(s->nc);
                s->nc = NULL;
                s->broken = true;
                return BT_ERR_DEVICE;
            }
        }
        if (bt__comm_now_ms() > end) {
            BT_LOG_ERROR("comm(nccl): rank %d: %s not done after %d ms (a peer failed or never "
                         "came); aborting the communicator",
                         s->base.rank, op, s->base.timeout_ms);
            ncclCommAbort(s->nc);
            s->nc = NULL;
            s->broken = true;
            return BT_ERR_PEER;
        }
        sched_yield();
    }
}

/* Checks what an enqueueing call returned, then waits for it. */
static bt_status_t finish(ncomm_t *s, const char *op, ncclResult_t r)
{
    if (r != ncclSuccess && r != ncclInProgress) return fail(s, op, r);
    return wait_done(s, op, true);
}

static bt_status_t n_all_reduce_f32(bt_comm_t *c, float *buf, size_t n)
{
    ncomm_t *s = (ncomm_t *)c;
    if (s->broken) return BT_ERR_PEER;
    return finish(s, "all_reduce_f32",
                  ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, s->nc, s->stream));
}

static bt_status_t n_all_gather(bt_comm_t *c, const void *send, size_t bytes, void *recv)
{
    ncomm_t *s = (ncomm_t *)c;
    if (s->broken) return BT_ERR_PEER;
    /* NCCL's in-place form is ours too: send == recv + rank * bytes */
    return finish(s, "all_gather", ncclAllGather(send, recv, bytes, ncclUint8, s->nc, s->stream));
}

static bt_status_t n_broadcast(bt_comm_t *c, void *buf, size_t bytes, int root)
{
    ncomm_t *s = (ncomm_t *)c;
    if (s->broken) return BT_ERR_PEER;
    return finish(s, "broadcast",
                  ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->nc, s->stream));
}

static bt_status_t n_barrier(bt_comm_t *c)
{
    ncomm_t *s = (ncomm_t *)c;
    if (s->broken) return BT_ERR_PEER;
    return finish(s, "barrier",
                  ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->nc, s->stream));
}

static void n_destroy(bt_comm_t *c)
{
    ncomm_t *s = (ncomm_t *)c;
    if (s->nc) {
        /* finalize flushes outstanding work; bounded like every other wait */
        ncclResult_t r = ncclCommFinalize(s->nc);
        if ((r == ncclSuccess || r == ncclInProgress) && wait_done(s, "finalize", false) == BT_OK)
            ncclCommDestroy(s->nc);
        else if (s->nc)
            ncclCommAbort(s->nc);
    }
    if (s->scratch) cudaFree(s->scratch);
    free(s);
}

static const bt__comm_ops_t nccl_ops = {
    .name = "nccl",
    .all_reduce_f32 = n_all_reduce_f32,
    .all_gather = n_all_gather,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .destroy = n_destroy,
};

bt_status_t bt_comm_nccl_unique_id(unsigned char id_p[BT_COMM_NCCL_ID_BYTES])
{
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        BT_LOG_ERROR("comm(nccl): ncclGetUniqueId: %s", ncclGetErrorString(r));
        return BT_ERR_DEVICE;
    }
    memcpy(id_p, id.internal, BT_COMM_NCCL_ID_BYTES);
    return BT_OK;
}

/* Call with this rank's GPU current (cudaSetDevice). */
bt_status_t bt_comm_nccl_create(int rank, int n_ranks,
                                const unsigned char unique_id[BT_COMM_NCCL_ID_BYTES], void *stream,
                                bt_comm_t **comm_p)
{
    if (n_ranks <= 0 || rank < 0 || rank >= n_ranks || !unique_id || !comm_p)
        return BT_ERR_INVALID_ARG;
    ncomm_t *s = calloc(1, sizeof *s);
    if (!s) return BT_ERR_NO_MEMORY;
    s->base = (bt_comm_t){.ops = &nccl_ops, .rank = rank, .n_ranks = n_ranks,
                          .timeout_ms = BT__COMM_DEFAULT_TIMEOUT_MS, .device_buffers = true};
    s->stream = (cudaStream_t)stream;
    cudaError_t ce = cudaMalloc((void **)&s->scratch, sizeof(float));
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        BT_LOG_ERROR("comm(nccl): rank %d: cudaMalloc: %s", rank, cudaGetErrorString(ce));
        free(s);
        return BT_ERR_DEVICE;
    }
    ncclUniqueId id;
    memcpy(id.internal, unique_id, BT_COMM_NCCL_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&s->nc, n_ranks, id, rank, &cfg);
    bt_status_t st;
    if (r != ncclSuccess && r != ncclInProgress) {
        st = fail(s, "init", r);
    } else {
        st = wait_done(s, "init", false);
    }
    if (st != BT_OK) {
        n_destroy(&s->base);
        return st;
    }
    *comm_p = &s->base;
    return BT_OK;
}

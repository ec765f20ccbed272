/* Collectives for tensor parallelism behind one interface: all-reduce (sum), all-gather,
 * broadcast, barrier. Backends: ranks as threads of one process, ranks as processes over
 * loopback/TCP sockets (both run on a CPU machine, so TP is tested in CI), and NCCL for GPUs
 * (built when CUDA is).
 *
 *   bt_comm_t *ranks[4];
 *   bt_comm_threads_create(4, ranks);            // one handle per rank thread
 *   // in rank r's thread:
 *   bt_comm_all_reduce_f32(ranks[r], buf, n);     // in place; identical bits on every rank
 *   bt_comm_all_gather(ranks[r], mine, bytes, all);  // all = rank 0's bytes, rank 1's, ...
 *   bt_comm_destroy(ranks[r]);
 *
 *   // ranks as processes: rank 0 listens on addr, the others connect
 *   bt_comm_socket_create(rank, 4, "127.0.0.1:29500", 30000, &c);
 *
 * Every call is collective (all ranks call it, in the same order) and blocking. The sum is
 * deterministic: rank 0's values + rank 1's + ... in rank order, the same result on every
 * rank, whatever the timing. A rank that dies or stalls makes the others' calls fail with
 * BT_ERR_PEER within the backend's timeout: nothing hangs. */
#ifndef BT_COMM_H
#define BT_COMM_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct bt_comm bt_comm_t;

/* n handles, one per rank, for n threads of this process. */
bt_status_t bt_comm_threads_create(int n_ranks, bt_comm_t **comms);
/* Rank `rank` of n_ranks processes; rank 0 listens on addr ("host:port"). timeout_ms bounds
 * the rendezvous and every later collective. */
bt_status_t bt_comm_socket_create(int rank, int n_ranks, const char *addr, int timeout_ms,
                                  bt_comm_t **comm_p);
/* NCCL (built with CUDA): one process per GPU. unique_id comes from bt_comm_nccl_unique_id() on
 * one rank and reaches the others out of band (e.g. over the socket backend's broadcast).
 * stream is a cudaStream_t; buffers passed to this handle's calls are DEVICE pointers. Calls are
 * enqueued on that stream and then waited for (bounded by the timeout), so they block like the
 * other backends. NCCL's sum is NOT rank-ordered: the result is identical on every rank for one
 * NCCL version and topology, but may differ in the last bits from the host backends' sum.
 * Without CUDA both return BT_ERR_UNSUPPORTED. */
#define BT_COMM_NCCL_ID_BYTES 128
bt_status_t bt_comm_nccl_unique_id(unsigned char id_p[BT_COMM_NCCL_ID_BYTES]);
bt_status_t bt_comm_nccl_create(int rank, int n_ranks,
                                const unsigned char unique_id[BT_COMM_NCCL_ID_BYTES], void *stream,
                                bt_comm_t **comm_p);
/* Releases this rank's handle. Not collective; a rank that leaves while others still wait
 * makes their calls fail (threads: at once; sockets: when its connection closes). */
void bt_comm_destroy(bt_comm_t *comm);

/* Bounds every later wait of this handle: a peer that makes no progress for timeout_ms fails
 * the call with BT_ERR_PEER, and the group is then broken (every later call fails too: destroy
 * and recreate it). Default: 60000 ms (threads, NCCL), create's timeout_ms (sockets). */
bt_status_t bt_comm_set_timeout_ms(bt_comm_t *comm, int timeout_ms);

/* Whether this handle's calls take device buffers (NCCL) rather than host memory. */
bool bt_comm_device_buffers(const bt_comm_t *comm);

int bt_comm_rank(const bt_comm_t *comm);
int bt_comm_size(const bt_comm_t *comm);

/* On error the contents of the output buffers are unspecified. */
bt_status_t bt_comm_all_reduce_f32(bt_comm_t *comm, float *buf, size_t n);
/* recv holds size * bytes: every rank's `send` in rank order. send may be recv + rank * bytes
 * (in place). */
bt_status_t bt_comm_all_gather(bt_comm_t *comm, const void *send, size_t bytes, void *recv);
bt_status_t bt_comm_broadcast(bt_comm_t *comm, void *buf, size_t bytes, int root);
bt_status_t bt_comm_barrier(bt_comm_t *comm);

#endif

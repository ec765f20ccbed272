/* A tensor-parallel worker group: one process per rank. Rank 0 leads: it alone speaks gRPC
 * and moves KV; before every collective step it broadcasts a plan (which slots, which tokens)
 * and the other ranks run the same forward on their shards. Every rank holds the whole KV
 * state (the latent is replicated), so a request's KV that arrives at rank 0 is copied to
 * the others with a SLOT_SYNC plan before it joins a batch.
 *
 *   leader (inside its one compute thread, never concurrently):
 *     bt_tp_lead_forward(comm, slots, seqs, n, reset);  then bt_model_forward(...)
 *     bt_tp_lead_draft(comm, slots, last, n);           then bt_model_draft(...)
 *     bt_tp_lead_rollback(comm, slots, keep, n);        then bt_model_rollback(...) each
 *     bt_tp_lead_sync(comm, slot, state, ranges, n);
 *     bt_tp_lead_noop(comm);                       // idle heartbeat: finds dead ranks
 *   follower main:
 *     bt_tp_follow(comm, model, layout, slot_fn, ctx);   // returns on SHUTDOWN or failure
 *
 * A rank that dies makes the next collective fail on every other rank (BT_ERR_PEER): the
 * leader then fails its requests and exits, so the router sees the group gone. */
#ifndef BT_SERVICES_TP_GROUP_H
#define BT_SERVICES_TP_GROUP_H

#include "common/comm/comm.h"
#include "services/engine/model.h"

#include <stdbool.h>
#include <stdint.h>

/* Joins the group as rank `rank` of `size` (rank 0 listens on addr) and tags this process's
 * log lines "<service>.<rank>". Says why on stderr when it cannot. timeout_ms: the service's
 * watchdog, how long the lead waits on the group; the other ranks wait 2 x + 1 s (the lead may
 * itself wait a watchdog on a stalled peer between two plans). */
bt_status_t bt_tp_join(const char *service, int rank, int size, const char *addr, int timeout_ms,
                       bt_comm_t **comm_p);

/* The KV slot of index i on this rank. */
typedef uint8_t *(*bt_tp_slot_fn)(void *ctx, int i);

bt_status_t bt_tp_lead_forward(bt_comm_t *comm, const int *slots, const bt_forward_seq_t *seqs, int n,
                               const bool *reset);
/* DSpark (services/engine/spec.h): the other ranks run the same draft (its collectives pair
 * up; they pick nothing), and a forward whose sequences carry undo records records on every
 * rank, so that the rollback that keeps the accepted tokens runs on every rank too. */
bt_status_t bt_tp_lead_draft(bt_comm_t *comm, const int *slots, const int32_t *last, int n);
bt_status_t bt_tp_lead_rollback(bt_comm_t *comm, const int *slots, const int *keep, int n);
bt_status_t bt_tp_lead_sync(bt_comm_t *comm, int slot, const uint8_t *state, const bt_kv_range_t *ranges,
                            int n_ranges);
bt_status_t bt_tp_lead_noop(bt_comm_t *comm);
bt_status_t bt_tp_lead_shutdown(bt_comm_t *comm);

/* Runs plans until SHUTDOWN (BT_OK) or a failed collective (its status). */
bt_status_t bt_tp_follow(bt_comm_t *comm, bt_model_t *model, const bt_kv_layout_t *layout,
                         bt_tp_slot_fn slot, void *ctx, int n_slots);

#endif

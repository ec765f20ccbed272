/* baton-prefill: a prefill group. Runs a prompt chunk by chunk (--chunked-prefill-size) in
 * a local KV slot and, after every chunk, puts the bytes that chunk changed straight into
 * the decode group's slot, flushes, and sends a notice; the last notice carries the first
 * sampled token. Jobs run one at a time, first come first served.
 *
 * The prefix cache (services/engine/prefix_cache.h) keeps the state at the end of every
 * chunk but a prompt's last; a prompt that starts with a cached prefix starts from it. The
 * last chunk is cut at the prompt's last multiple of BT_PREFIX_CACHE_BLOCK tokens (one more
 * forward a prompt), so that the state
 * there is kept too: a later turn of the same conversation, or the same prompt sent again,
 * finds all but the prompt's last few tokens. */
#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "common/text/grammar.h"
#include "common/transfer/transfer.h"
#include "common/metrics.h"
#include "services/common/metrics_server.h"
#include "services/common/proto_util.h"
#include "services/engine/prefix_cache.h"
#include "services/engine/sampler.h"
#include "services/common/service.h"
#include "services/common/tp_group.h"
#include "services/common/worker_flags.h"
#include "services/common/sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct prefill prefill_t;

typedef struct peer {
    struct peer *next;
    uint8_t *desc;
    size_t desc_len;
    bt_xfer_peer_t *xp;
    bool failed;
    int jobs; /* jobs that hold it (an orphaned one until its commit returns) */
    prefill_t *p;
} peer_t;

typedef struct job {
    struct job *next;
    prefill_t *p;
    bt_rpc_call_t *call;
    Baton__V1__PrefillRequest *req;
    peer_t *peer;
    int done;          /* prompt tokens prefilled */
    int chunk_index;
    bool cancelled;
    bool stop_sent; /* its STOPPED notice is being committed (cancelled jobs) */
    int64_t bytes;
    int64_t t_start;
    bool orphaned; /* given up on by the watchdog; freed when its commit finally returns */
    struct mark *unsettled; /* (orphaned: its mark, held until the commit returns) */
    bool stop_flushed;      /* its STOPPED notice is in place: no write follows */
    int32_t first_token;
    float first_logprob;
    bt_top_logprob_t top[20];
    int n_top;
    bt_kv_header_t before;       /* the slot's header the decode group has (zero at first) */
    bt_prefix_node_t *node;      /* the cached chain that ends where the slot is, held */
    bool caching;                /* its chunks go into the cache */
    int cached;                  /* prompt tokens restored from the cache */
    bt_grammar_t *grammar; /* the first token's constraint (response_format), NULL: none */
} job_t;

static void job_unpin(job_t *j);

static void job_free(job_t *j)
{
    job_unpin(j);
    bt_grammar_destroy(j->grammar);
    BT_PROTO_FREE(baton__v1__prefill_request, j->req);
    free(j);
}

struct prefill {
    uv_loop_t *loop;
    bt_rpc_t *rpc;
    bt_rpc_server_t *server;
    bt_xfer_t *xfer;
    bt_service_engine_t eng;
    bt_registration_t *reg;
    uint8_t *slot;     /* the local KV slot of the running job */
    float *logits;     /* a chunk's last row, which nothing reads: for the group's collectives */
    bool draw;         /* this chunk ends the prompt: the first token is drawn with its forward */
    bt_sample_req_t draw_req;
    bt_sample_out_t draw_out;
    bt_penalties_t draw_bias; /* the request's logit_bias, as the decode group keeps it */
    uint32_t *draw_allow;     /* the first token's constraint, as a mask (grammar.h) */
    int chunk_size;
    job_t *queue, *queue_tail, *active;
    peer_t *peers;
    bool busy, stopping;
    uv_work_t work;
    bt_forward_seq_t fwd;
    bt_status_t step_status;
    char step_err[256];
    char address[256];
    int64_t queued_tokens;
    bt_metrics_t *metrics;
    bt_metrics_server_t *metrics_server;
    bt_histogram_t *chunk_time, *commit_time, *job_time;
    int64_t commit_start_ms;
    bt_sim_t sim; /* --simulate: a timing model instead of the model */
    bt_prefix_cache_t *cache;           /* NULL: --disable-radix-cache, a following rank */
    bt_prefix_cache_stats_t cache_seen; /* its counts at the last /metrics refresh */
    /* tensor parallelism: this process leads the group (rank 0) when comm is set */
    bt_comm_t *comm;
    bool tp_noop, chunk_reset, group_failed;
    bool chunk_sync; /* the slot was restored from the cache: the other ranks get it first */
    /* the prefix cache's part of a chunk, done with its forward in the worker thread (a
     * restore or a kept chunk copies megabytes: not on the loop). restore: the chain to write
     * into the slot first; keep: the chunk to keep after the forward, as a child of
     * keep_parent, the node for it (or NULL: not kept) in kept */
    bt_prefix_node_t *restore, *keep_parent, *kept;
    bool keep;
    uv_timer_t tp_timer;
    /* a commit to a decode group that stops answering (alive but stalled) ends within this */
    int64_t watchdog_ms;
    int64_t drain_ms; /* stopping: what the active job gets to finish in */
    struct mark *tombstones, *unsettled; /* for Forget (see mark_t) */
    bool committing;
    uv_timer_t watchdog;
    /* stopping: the server is down; the loop stops once the active job has ended (its last
     * writes flushed, its decode group told), or EXIT_GRACE_MS after */
    bool server_down;
    int64_t server_down_ms;
};

#define EXIT_GRACE_MS 5000

/* lets go of the job's cached chain */
static void job_unpin(job_t *j)
{
    if (j->node) bt_prefix_cache_unpin(j->p->cache, j->node);
    j->node = NULL;
}

/* Jobs known by (request_id, epoch) for a while, for Forget (lists in prefill_t):
 *   tombstones: a job the decode group gave up on before it reached us; its Prefill call,
 *     should it still come (until its deadline), is refused, so its slot, freed at the decode
 *     group, is never written;
 *   unsettled: a job that ended, or was given up on, with writes perhaps still landing (a
 *     failed transfer, a stalled peer); a Forget of it must not answer done. */
typedef struct mark {
    struct mark *next;
    char *request_id;
    uint64_t epoch;
    int64_t until_ms;
} mark_t;

/* How long an unsettled job is remembered once its writes stopped: the decode group asks at
 * once (its Forget follows the end of the Prefill call), within its call's 5 s deadline. */
#define UNSETTLED_HOLD_MS 60000

/* Whether (request_id, epoch) is on the list (NULL: nothing is); drops the marks past their
 * time. */
static bool mark_find(mark_t **list, const char *request_id, uint64_t epoch)
{
    const int64_t now = bt_now_ms();
    bool found = false;
    for (mark_t **m = list; *m;) {
        if ((*m)->until_ms <= now) {
            mark_t *dead = *m;
            *m = dead->next;
            free(dead->request_id);
            free(dead);
            continue;
        }
        found |= request_id && (*m)->epoch == epoch && !strcmp((*m)->request_id, request_id);
        m = &(*m)->next;
    }
    return found;
}

static mark_t *mark_add(mark_t **list, const char *request_id, uint64_t epoch, int64_t until_ms)
{
    mark_find(list, NULL, 0); /* (a list only Forget reads is pruned as it grows, too) */
    mark_t *m = bt_calloc_or_die(1, sizeof *m);
    m->request_id = bt_strdup_or_die(request_id);
    m->epoch = epoch;
    m->until_ms = until_ms;
    m->next = *list;
    *list = m;
    return m;
}

static void run_next(prefill_t *p);
static void maybe_exit(prefill_t *p);

/* A failed peer is let go once no job holds it: before, every decode group that went away
 * (a restart, a kill) left its endpoint and rkey here for the life of the process. */
static void peer_reap(peer_t *pe)
{
    if (!pe->failed || pe->jobs > 0) return;
    prefill_t *p = pe->p;
    for (peer_t **pp = &p->peers; *pp; pp = &(*pp)->next)
        if (*pp == pe) {
            *pp = pe->next;
            break;
        }
    if (pe->xp) bt_xfer_disconnect(pe->xp); /* (failed: a forced close) */
    free(pe->desc);
    free(pe);
}

/* The job lets go of its peer (if it had one). */
static void job_drop_peer(job_t *j)
{
    peer_t *pe = j->peer;
    if (!pe) return;
    j->peer = NULL;
    pe->jobs--;
    peer_reap(pe);
}

static void job_end(job_t *j, bt_rpc_code_t code, const char *msg)
{
    prefill_t *p = j->p;
    bt_counter_add(bt_metrics_counter(p->metrics, "prefills_total", "Prefill jobs ended, by status", "status",
                                      bt_rpc_code_name(code)), 1);
    if (code == BT_RPC_OK) bt_histogram_observe(p->job_time, (double)(bt_now_ms() - j->t_start) / 1000.0);
    if (j->call) {
        if (code == BT_RPC_OK) {
            Baton__V1__PrefillResponse resp = BATON__V1__PREFILL_RESPONSE__INIT;
            Baton__V1__TokenLogprob lp = BATON__V1__TOKEN_LOGPROB__INIT;
            resp.first_token = j->first_token;
            lp.token_id = j->first_token;
            lp.logprob = j->first_logprob;
            Baton__V1__TopLogprob tops[20], *ptrs[20];
            for (int i = 0; i < j->n_top; i++) {
                baton__v1__top_logprob__init(&tops[i]);
                tops[i].token_id = j->top[i].id;
                tops[i].logprob = j->top[i].logprob;
                ptrs[i] = &tops[i];
            }
            lp.n_top = (size_t)j->n_top;
            lp.top = ptrs;
            resp.first_logprob = &lp;
            resp.chunks = j->chunk_index;
            resp.bytes = j->bytes;
            resp.cached_tokens = j->cached;
            uint8_t *buf;
            size_t len;
            bt_proto_pack(&resp.base, &buf, &len);
            bt_rpc_call_reply(j->call, buf, len);
            free(buf);
        } else {
            BT_LOG_WARN("prefill %s: %s: %s", j->req->request_id, bt_rpc_code_name(code), msg);
            bt_rpc_call_finish(j->call, code, msg);
        }
        j->call = NULL;
    }
    if (p->active == j) p->active = NULL;
    /* ended short of its LAST or STOPPED notice, with a peer it may have written to */
    if (code != BT_RPC_OK && j->peer && !j->stop_flushed)
        mark_add(&p->unsettled, j->req->request_id, j->req->epoch, bt_now_ms() + UNSETTLED_HOLD_MS);
    job_drop_peer(j);
    job_free(j);
    run_next(p);
    maybe_exit(p);
}

static void on_peer_error(void *ctx, bt_status_t st)
{
    peer_t *pe = ctx;
    BT_LOG_WARN("decode peer failed: %s", bt_status_str(st));
    pe->failed = true;
    peer_reap(pe); /* (safe here: the transfer layer is done with the event) */
}

static peer_t *peer_get(prefill_t *p, const uint8_t *desc, size_t len, char *err, size_t errlen)
{
    for (peer_t *pe = p->peers; pe; pe = pe->next)
        if (!pe->failed && pe->desc_len == len && !memcmp(pe->desc, desc, len)) {
            pe->jobs++;
            return pe;
        }
    peer_t *pe = bt_calloc_or_die(1, sizeof *pe);
    pe->jobs = 1;
    pe->p = p;
    bt_status_t st = bt_xfer_connect(p->xfer, desc, len, on_peer_error, pe, &pe->xp);
    if (st != BT_OK) {
        snprintf(err, errlen, "cannot connect to the decode group's KV pool: %s", bt_status_str(st));
        free(pe);
        return NULL;
    }
    pe->desc = bt_malloc_or_die(len);
    memcpy(pe->desc, desc, len);
    pe->desc_len = len;
    pe->next = p->peers;
    p->peers = pe;
    return pe;
}

static void chunk_compute(prefill_t *p)
{
    if (p->comm) {
        /* the plan first, then the same forward on every rank (its collectives pair up) */
        static const int slot0 = 0;
        bool reset = p->chunk_reset;
        p->step_status = BT_OK;
        if (!p->tp_noop && p->chunk_sync) { /* (every rank holds the whole state) */
            bt_kv_header_t zero;
            memset(&zero, 0, sizeof zero);
            bt_kv_range_t rg[4 * BT_MAX_LAYERS + 1];
            const int nr = bt_kv_changed_ranges(p->eng.cfg, &p->eng.layout, &zero, p->slot, rg,
                                                (int)(sizeof rg / sizeof rg[0]));
            p->step_status = bt_tp_lead_sync(p->comm, 0, p->slot, rg, nr);
            p->chunk_sync = false;
        }
        if (p->step_status == BT_OK)
            p->step_status = p->tp_noop ? bt_tp_lead_noop(p->comm)
                                        : bt_tp_lead_forward(p->comm, &slot0, &p->fwd, 1, &reset);
        if (p->step_status != BT_OK) {
            snprintf(p->step_err, sizeof p->step_err, "tensor-parallel group failed: a rank died or stalled");
            return;
        }
        if (p->tp_noop) return;
    }
    if (p->sim.on) { /* the modelled time; the counters a forward would advance, no data */
        bt_sim_sleep_ms(bt_sim_prefill_ms(&p->sim, p->fwd.n));
        bt_kv_state_advance_counters(p->eng.cfg, p->fwd.state, p->fwd.n);
        p->step_status = BT_OK;
        return;
    }
    if (p->draw)
        p->step_status = bt_model_forward_sample(p->eng.model, &p->eng.layout, &p->fwd, 1,
                                                 bt_service_emit_vocab(&p->eng), &p->draw_req,
                                                 &p->draw_out, p->step_err, sizeof p->step_err);
    else /* (under TP every rank computes the logits: the lead too, so the collectives pair) */
        p->step_status = bt_model_forward(p->eng.model, &p->eng.layout, &p->fwd, 1,
                                          p->comm ? p->logits : NULL, p->step_err, sizeof p->step_err);
}

static void chunk_work(uv_work_t *w)
{
    prefill_t *p = w->data;
    if (p->restore) {
        bt_prefix_cache_restore(p->cache, p->restore, p->slot);
        p->restore = NULL;
    }
    const bt_kv_header_t before = *bt_kv_header(p->slot);
    chunk_compute(p);
    if (p->keep)
        p->kept = p->step_status == BT_OK
                      ? bt_prefix_cache_insert(p->cache, p->keep_parent,
                                               p->fwd.ids - before.n_tokens, (int)before.n_tokens,
                                               (int)before.n_tokens + p->fwd.n, &before, p->slot)
                      : NULL;
}

static void start_chunk(prefill_t *p, job_t *j);
static void on_committed(void *ctx, bt_status_t st);

/* A cancelled job's last word to its decode group, committed after its puts are flushed: no
 * more writes for this request, so the decode group may reuse the slot at once (without it the
 * slot waits out the decode group's watchdog, 300 s by default, in case a write is late). The
 * job ends when the commit returns (on_committed); false when there is no peer to tell. */
static bool send_stopped(prefill_t *p, job_t *j)
{
    if (!j->peer || j->peer->failed || !j->peer->xp || j->stop_sent) return false;
    Baton__V1__KvNotice n = BATON__V1__KV_NOTICE__INIT;
    n.request_id = j->req->request_id;
    n.epoch = j->req->epoch;
    n.kind = BATON__V1__KV_NOTICE__KIND__STOPPED;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&n.base, &buf, &len);
    j->stop_sent = true;
    p->committing = true; /* (the watchdog covers it like a chunk's) */
    p->commit_start_ms = bt_now_ms();
    bt_status_t st = bt_xfer_commit(j->peer->xp, buf, len, on_committed, j);
    free(buf);
    if (st != BT_OK) {
        p->committing = false;
        return false;
    }
    return true;
}

static void on_committed(void *ctx, bt_status_t st)
{
    job_t *j = ctx;
    prefill_t *p = j->p;
    if (j->orphaned) {
        /* the stalled peer answered at last (or failed): now it can be let go */
        j->unsettled->until_ms = bt_now_ms() + UNSETTLED_HOLD_MS;
        job_drop_peer(j);
        job_free(j);
        return;
    }
    p->committing = false;
    if (!j->stop_sent)
        bt_histogram_observe(p->commit_time, (double)(bt_now_ms() - p->commit_start_ms) / 1000.0);
    if (st != BT_OK) {
        bt_counter_add(bt_metrics_counter(p->metrics, "transfer_failures_total", "KV transfers that failed, by cause",
                                          "cause", "commit"), 1);
        job_end(j, BT_RPC_DATA_LOSS, "KV transfer to the decode group failed");
        return;
    }
    if (j->stop_sent) j->stop_flushed = true;
    if (j->cancelled) {
        if (!j->stop_sent && send_stopped(p, j)) return;
        job_end(j, BT_RPC_CANCELLED, "cancelled by the decode group");
        return;
    }
    if (j->done == (int)j->req->n_prompt_ids) {
        job_end(j, BT_RPC_OK, NULL);
        return;
    }
    start_chunk(p, j);
}

static void exit_now(uv_timer_t *t)
{
    exit(1);
}

/* Ends every queued job (none has a peer or has written anything yet) with code and msg. */
static void end_queued(prefill_t *p, bt_rpc_code_t code, const char *msg)
{
    while (p->queue) {
        job_t *j = p->queue;
        p->queue = j->next;
        p->queued_tokens -= (int64_t)j->req->n_prompt_ids;
        if (j->call) bt_rpc_call_finish(j->call, code, msg);
        j->call = NULL;
        job_free(j);
    }
    p->queue_tail = NULL;
}

/* A rank of the group is gone: fail what is queued and leave, so the router drops us. */
static void group_failed(prefill_t *p)
{
    if (p->group_failed) return;
    p->group_failed = true;
    p->stopping = true;
    BT_LOG_ERROR("%s; failing every request and leaving", p->step_err);
    end_queued(p, BT_RPC_UNAVAILABLE, p->step_err);
    bt_registration_stop(p->reg);
    p->reg = NULL;
    uv_timer_stop(&p->tp_timer);
    uv_timer_start(&p->tp_timer, exit_now, 300, 0);
}

static void chunk_done(uv_work_t *w, int status)
{
    prefill_t *p = w->data;
    job_t *j = p->active;
    p->busy = false;
    if (p->keep) { /* (first: whatever else this chunk meets, the pins stay right) */
        p->keep = false;
        /* (a job ends only between its chunks: the active one still holds the parent) */
        BT_ASSERT(j && j->node == p->keep_parent);
        if (p->kept) {
            j->node = p->kept; /* (the insert let go of the parent) */
        } else {               /* not kept: over the budget, or the forward failed */
            job_unpin(j);
            j->caching = false;
        }
        p->kept = NULL;
    }
    if (p->tp_noop) {
        p->tp_noop = false;
        if (p->step_status != BT_OK)
            group_failed(p);
        else
            run_next(p); /* a job that arrived during the heartbeat found us busy: start it now */
        return;
    }
    if (p->comm && p->step_status != BT_OK) {
        job_end(j, BT_RPC_UNAVAILABLE, p->step_err);
        group_failed(p);
        return;
    }
    bt_histogram_observe(p->chunk_time, (double)(bt_now_ms() - p->commit_start_ms) / 1000.0);
    if (p->step_status != BT_OK) {
        job_end(j, BT_RPC_INTERNAL, p->step_err);
        return;
    }
    if (j->cancelled) { /* (this chunk's KV not put; the ones before are flushed) */
        if (send_stopped(p, j)) return;
        job_end(j, BT_RPC_CANCELLED, "cancelled by the decode group");
        return;
    }
    if (j->peer->failed) {
        job_end(j, BT_RPC_DATA_LOSS, "the decode group's KV pool is unreachable");
        return;
    }
    j->done += p->fwd.n;
    bool last = j->done == (int)j->req->n_prompt_ids;
    /* the bytes this chunk changed go straight into decode's slot */
    bt_kv_range_t ranges[4 * BT_MAX_LAYERS + 1];
    int nr = bt_kv_changed_ranges(p->eng.cfg, &p->eng.layout, &j->before, p->slot, ranges,
                                  (int)(sizeof ranges / sizeof ranges[0]));
    uint64_t base = j->req->target->slot_offset;
    for (int i = 0; i < nr; i++) {
        bt_status_t st = bt_xfer_put(j->peer->xp, base + ranges[i].off, p->slot + ranges[i].off,
                                     ranges[i].len);
        if (st != BT_OK) {
            job_end(j, BT_RPC_DATA_LOSS, "KV put refused (target outside the decode pool?)");
            return;
        }
        j->bytes += (int64_t)ranges[i].len;
        bt_counter_add(bt_metrics_counter(p->metrics, "transfer_bytes_total", "KV bytes put into decode groups", NULL, NULL),
                       (double)ranges[i].len);
    }
    bt_counter_add(bt_metrics_counter(p->metrics, "chunks_total", "Prefill chunks transferred", NULL, NULL), 1);
    p->commit_start_ms = bt_now_ms();
    Baton__V1__KvNotice n = BATON__V1__KV_NOTICE__INIT;
    n.request_id = j->req->request_id;
    n.epoch = j->req->epoch;
    n.chunk_index = j->chunk_index++;
    n.tokens_done = j->done;
    if (last) {
        if (p->sim.on) {
            j->n_top = 0;
            j->first_token = bt_sim_token(bt_sim_key(j->req->prompt_ids, j->req->n_prompt_ids, p->draw_req.sampling.seed),
                                          0, bt_service_emit_vocab(&p->eng), p->eng.cfg->eos_id);
        } else {
            j->n_top = p->draw_req.n_top;
            j->first_token = p->draw_out.id;
            j->first_logprob = p->draw_out.logprob;
            memcpy(j->top, p->draw_out.top, sizeof j->top);
        }
        n.kind = BATON__V1__KV_NOTICE__KIND__LAST;
        n.first_token = j->first_token;
        n.first_logprob = j->first_logprob;
    } else {
        n.kind = BATON__V1__KV_NOTICE__KIND__CHUNK;
    }
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&n.base, &buf, &len);
    p->committing = true;
    bt_status_t st = bt_xfer_commit(j->peer->xp, buf, len, on_committed, j);
    if (st != BT_OK) p->committing = false;
    free(buf);
    if (st != BT_OK) job_end(j, BT_RPC_DATA_LOSS, "cannot commit the KV transfer");
}

static void start_chunk(prefill_t *p, job_t *j)
{
    int total = (int)j->req->n_prompt_ids;
    int n = total - j->done < p->chunk_size ? total - j->done : p->chunk_size;
    const int keep =
        (total - 1) / BT_PREFIX_CACHE_BLOCK * BT_PREFIX_CACHE_BLOCK; /* (see the top) */
    if (j->caching && keep > j->done && keep < j->done + n) n = keep - j->done;
    /* the router's points (where a chat's turns start): another conversation with the same
     * system prompt, or this one's next turn, starts the same up to there */
    for (size_t i = 0; j->caching && i < j->req->n_cache_points; i++) {
        const int at = j->req->cache_points[i];
        if (at > j->done && at < j->done + n) n = at - j->done;
    }
    /* the decode group's slot has nothing yet: the first chunk sends what came from the
     * cache too */
    if (j->chunk_index == 0)
        memset(&j->before, 0, sizeof j->before);
    else
        j->before = *bt_kv_header(p->slot);
    /* (a prompt's last chunk is no one's prefix: not kept) */
    p->keep = j->caching && j->done + n < total;
    p->keep_parent = j->node;
    p->chunk_reset = j->done == 0; /* the other ranks start this request from an empty slot */
    p->fwd = (bt_forward_seq_t){p->slot, j->req->prompt_ids + j->done, n, false, NULL};
    p->draw = j->done + n == total;
    if (p->draw) {
        Baton__V1__SamplingParams *sp = j->req->sampling;
        const bt_sampling_t s = {sp ? sp->temperature : 0.0f, sp && sp->top_p > 0 ? sp->top_p : 1.0f,
                                 sp ? sp->min_p : 0.0f, sp ? sp->top_k : 0, sp && sp->has_seed ? sp->seed : 0};
        const bool logprobs = sp && sp->logprobs;
        p->draw_req = (bt_sample_req_t){
            .sampling = s, .want_logprob = logprobs,
            .n_top = logprobs && sp->top_logprobs > 0 ? (sp->top_logprobs < 20 ? sp->top_logprobs : 20) : 0};
        /* logit_bias applies to the first draw too (the decode group checked the ids) */
        const int nb = sp ? (int)(sp->n_logit_bias < sp->n_logit_bias_ids ? sp->n_logit_bias : sp->n_logit_bias_ids) : 0;
        bt_penalties_free(&p->draw_bias);
        bt_penalties_init(&p->draw_bias, 0.0f, 0.0f);
        for (int i = 0; i < nb; i++) bt_penalties_bias(&p->draw_bias, sp->logit_bias_ids[i], sp->logit_bias[i]);
        p->draw_req.adj_ids = p->draw_bias.ids;
        p->draw_req.adj = p->draw_bias.amount;
        p->draw_req.n_adj = p->draw_bias.n;
        if (j->grammar && bt_grammar_active(j->grammar)) { /* (its state is the same each time) */
            if (!p->draw_allow)
                p->draw_allow = bt_malloc_or_die(
                    (size_t)bt_grammar_mask_words(p->eng.grammar_vocab) * sizeof *p->draw_allow);
            bt_grammar_mask(j->grammar, p->draw_allow);
            p->draw_req.allow = p->draw_allow;
        }
    }
    p->busy = true;
    p->commit_start_ms = bt_now_ms(); /* reused as the chunk's start */
    p->work.data = p;
    uv_queue_work(p->loop, &p->work, chunk_work, chunk_done);
}

static void run_next(prefill_t *p)
{
    if (p->active || p->busy || p->stopping) return;
    while (p->queue) {
        job_t *j = p->queue;
        p->queue = j->next;
        if (!p->queue) p->queue_tail = NULL;
        p->queued_tokens -= (int64_t)j->req->n_prompt_ids;
        char err[256];
        if (j->cancelled) { /* nothing written; still, the decode group hears it at once */
            j->peer = peer_get(p, j->req->target->region.data, j->req->target->region.len, err,
                               sizeof err);
            p->active = j;
            if (send_stopped(p, j)) return; /* (on_committed ends it) */
            job_end(j, BT_RPC_CANCELLED, "cancelled before it started");
            return; /* job_end calls run_next */
        }
        j->peer = peer_get(p, j->req->target->region.data, j->req->target->region.len, err, sizeof err);
        j->t_start = bt_now_ms();
        if (!j->peer) {
            bt_counter_add(bt_metrics_counter(p->metrics, "transfer_failures_total", "KV transfers that failed, by cause",
                                              "cause", "connect"), 1);
            job_end(j, BT_RPC_DATA_LOSS, err);
            return;
        }
        p->active = j;
        bt_kv_state_reset(p->slot);
        if (p->cache) {
            const int total = (int)j->req->n_prompt_ids;
            int end = 0; /* (one token at least is computed: its logits draw the first token) */
            j->node = bt_prefix_cache_match(p->cache, j->req->prompt_ids, total, total - 1, &end);
            if (j->node) { /* (restored by the chunk's work) */
                p->restore = j->node;
                p->chunk_sync = p->comm != NULL;
            }
            j->done = j->cached = end;
            j->caching = true;
            if (end)
                bt_counter_add(bt_metrics_counter(p->metrics, "prefix_cache_hit_tokens_total",
                                                  "Prompt tokens restored from the prefix cache",
                                                  NULL, NULL),
                               end);
        }
        start_chunk(p, j);
        return;
    }
}

/* A commit that has not completed within the watchdog: the decode group is stalled (a dead
 * one is reported by the transfer layer at once). The job is given up on without waiting for
 * the stalled peer (closing its endpoint could block the loop for seconds): its request
 * ends UNAVAILABLE, the peer is never used again, and the queue moves on. The job's memory
 * stays until its commit returns. */
static void on_watchdog(uv_timer_t *t)
{
    prefill_t *p = t->data;
    maybe_exit(p);
    job_t *j = p->active;
    if (!j || !p->committing || !j->peer || j->peer->failed) return;
    if (bt_now_ms() - p->commit_start_ms < p->watchdog_ms) return;
    BT_LOG_WARN("prefill %s: the decode group has not taken chunk %d for %lld ms; giving up on it",
                j->req->request_id, j->chunk_index - 1, (long long)(bt_now_ms() - p->commit_start_ms));
    bt_counter_add(bt_metrics_counter(p->metrics, "transfer_failures_total", "KV transfers that failed, by cause",
                                      "cause", "watchdog"), 1);
    bt_counter_add(bt_metrics_counter(p->metrics, "prefills_total", "Prefill jobs ended, by status",
                                      "status", "DATA_LOSS"),
                   1);
    if (j->call) {
        bt_rpc_call_finish(j->call, BT_RPC_DATA_LOSS,
                           "the decode group stalled: KV transfer timed out");
        j->call = NULL;
    }
    j->orphaned = true;
    j->unsettled = mark_add(&p->unsettled, j->req->request_id, j->req->epoch, INT64_MAX);
    j->peer->failed = true;
    p->committing = false;
    p->active = NULL;
    run_next(p);
}

/* TP: while idle, a heartbeat through the group finds a dead rank before a request does */
static void on_tp_timer(uv_timer_t *t)
{
    prefill_t *p = t->data;
    if (p->busy || p->active || p->stopping) return;
    p->tp_noop = true;
    p->busy = true;
    p->work.data = p;
    uv_queue_work(p->loop, &p->work, chunk_work, chunk_done);
}

static uint8_t *follower_slot(void *ctx, int i)
{
    return ctx;
}

static void on_job_cancel(void *ctx)
{
    job_t *j = ctx;
    j->cancelled = true;
    BT_LOG_INFO("prefill %s cancelled", j->req->request_id);
    if (j->call) {
        bt_rpc_call_finish(j->call, BT_RPC_CANCELLED, "cancelled");
        j->call = NULL;
    }
    /* an active job stops at its chunk boundary; a queued one when dequeued */
}

static void on_prefill(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    prefill_t *p = ctx;
    Baton__V1__PrefillRequest *r = BT_PROTO_UNPACK(baton__v1__prefill_request, data, len);
    char msg[300];
    if (!r) {
        bt_rpc_call_finish(call, BT_RPC_INVALID_ARGUMENT, "unreadable PrefillRequest");
        return;
    }
    bt_rpc_code_t code = BT_RPC_OK;
    if (p->stopping) {
        code = BT_RPC_ABORTED; /* (nothing written: the decode group frees the slot at once) */
        snprintf(msg, sizeof msg, "prefill group shutting down");
    } else if (r->request_id && mark_find(&p->tombstones, r->request_id, r->epoch)) {
        code = BT_RPC_ABORTED; /* (its slot is free at the decode group: never written) */
        snprintf(msg, sizeof msg, "the decode group gave up on this job before it arrived");
    } else if (r->compat_hash != p->eng.compat_hash) {
        code = BT_RPC_FAILED_PRECONDITION;
        snprintf(msg, sizeof msg,
                 "incompatible groups: decode compat hash %016" PRIx64 ", prefill %016" PRIx64
                 " (model, dtype, KV layout, TP size or DSpark draft stages differ)",
                 r->compat_hash, p->eng.compat_hash);
    } else if (!r->target || r->target->slot_bytes != p->eng.layout.slot_bytes) {
        code = BT_RPC_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "KV target missing or of another slot size");
    } else if (r->n_prompt_ids == 0 || (int64_t)r->n_prompt_ids > p->eng.layout.max_ctx) {
        code = BT_RPC_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "prompt of %zu tokens outside 1..%lld", r->n_prompt_ids,
                 (long long)p->eng.layout.max_ctx);
    }
    for (size_t i = 0; code == BT_RPC_OK && i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= p->eng.cfg->vocab) {
            code = BT_RPC_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "prompt token %d at %zu outside the vocabulary", r->prompt_ids[i], i);
        }
    bt_grammar_t *grammar = NULL;
    if (code == BT_RPC_OK &&
        bt_service_grammar(&p->eng, r->sampling, &grammar, msg, sizeof msg) != BT_OK)
        code = BT_RPC_INVALID_ARGUMENT;
    if (code != BT_RPC_OK) {
        BT_PROTO_FREE(baton__v1__prefill_request, r);
        bt_rpc_call_finish(call, code, msg);
        return;
    }
    job_t *j = bt_calloc_or_die(1, sizeof *j);
    j->p = p;
    j->call = call;
    j->req = r;
    j->grammar = grammar;
    bt_rpc_call_on_cancel(call, on_job_cancel, j);
    if (p->queue_tail)
        p->queue_tail->next = j;
    else
        p->queue = j;
    p->queue_tail = j;
    p->queued_tokens += (int64_t)r->n_prompt_ids;
    run_next(p);
}

static void on_forget(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    prefill_t *p = ctx;
    Baton__V1__ForgetRequest *r = BT_PROTO_UNPACK(baton__v1__forget_request, data, len);
    if (!r || !r->request_id) {
        if (r) BT_PROTO_FREE(baton__v1__forget_request, r);
        bt_rpc_call_finish(call, BT_RPC_INVALID_ARGUMENT, "unreadable ForgetRequest");
        return;
    }
    job_t *j = NULL;
    if (p->active && p->active->req->epoch == r->epoch &&
        !strcmp(p->active->req->request_id, r->request_id))
        j = p->active;
    for (job_t *q = p->queue; q && !j; q = q->next)
        if (q->req->epoch == r->epoch && !strcmp(q->req->request_id, r->request_id)) j = q;
    Baton__V1__ForgetResponse resp = BATON__V1__FORGET_RESPONSE__INIT;
    if (j) {
        j->cancelled = true; /* (its STOPPED notice follows its last write) */
    } else if (!mark_find(&p->unsettled, r->request_id, r->epoch)) {
        /* never seen, or ended with every write in place (its LAST or STOPPED notice sent) */
        if (!mark_find(&p->tombstones, r->request_id, r->epoch)) {
            const int64_t hold = r->hold_ms > p->watchdog_ms ? r->hold_ms : p->watchdog_ms;
            mark_add(&p->tombstones, r->request_id, r->epoch, bt_now_ms() + hold);
        }
        resp.done = 1;
    }
    BT_PROTO_FREE(baton__v1__forget_request, r);
    bt_proto_reply(call, &resp.base);
}

static void on_hello(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    prefill_t *p = ctx;
    Baton__V1__HelloResponse hr = BATON__V1__HELLO_RESPONSE__INIT;
    hr.compat_hash = p->eng.compat_hash;
    hr.model = p->eng.served_name;
    hr.tp = p->comm ? bt_comm_size(p->comm) : 1;
    bt_proto_reply(call, &hr.base);
}

static void refresh_metrics(void *ctx)
{
    prefill_t *p = ctx;
    int queued = 0;
    for (job_t *j = p->queue; j; j = j->next) queued++;
    bt_gauge_set(bt_metrics_gauge(p->metrics, "queued_requests", "Prefill jobs waiting", NULL, NULL), queued);
    bt_gauge_set(bt_metrics_gauge(p->metrics, "running_requests", "Prefill jobs running", NULL, NULL), p->active ? 1 : 0);
    bt_gauge_set(bt_metrics_gauge(p->metrics, "queued_prompt_tokens", "Prompt tokens waiting", NULL, NULL), (double)p->queued_tokens);
    int peers = 0;
    for (const peer_t *pe = p->peers; pe; pe = pe->next)
        peers++;
    bt_gauge_set(bt_metrics_gauge(p->metrics, "kv_peers", "Decode groups' KV pools connected to",
                                  NULL, NULL),
                 peers);
    if (p->cache) {
        bt_prefix_cache_stats_t cs;
        bt_prefix_cache_stats(p->cache, &cs);
        bt_gauge_set(bt_metrics_gauge(p->metrics, "prefix_cache_bytes",
                                      "Bytes the prefix cache holds", NULL, NULL),
                     (double)cs.bytes);
        bt_gauge_set(bt_metrics_gauge(p->metrics, "prefix_cache_nodes",
                                      "Cached prompt chunks (states at their ends)", NULL, NULL),
                     (double)cs.nodes);
        /* (counters: what happened since the last refresh) */
        bt_counter_add(bt_metrics_counter(p->metrics, "prefix_cache_lookups_total",
                                          "Prompts looked up in the prefix cache", NULL, NULL),
                       (double)(cs.lookups - p->cache_seen.lookups));
        bt_counter_add(bt_metrics_counter(p->metrics, "prefix_cache_hits_total",
                                          "Prompts that started from a cached prefix", NULL, NULL),
                       (double)(cs.hits - p->cache_seen.hits));
        bt_counter_add(bt_metrics_counter(p->metrics, "prefix_cache_evicted_total",
                                          "Cached chunks let go for room", NULL, NULL),
                       (double)(cs.evicted - p->cache_seen.evicted));
        p->cache_seen = cs;
    }
}

static void load_fn(void *ctx, Baton__V1__HeartbeatRequest *hb)
{
    prefill_t *p = ctx;
    hb->running = p->active ? 1 : 0;
    hb->queued_prefill_tokens = p->queued_tokens;
}

static void maybe_exit(prefill_t *p)
{
    if (!p->server_down) return;
    if ((!p->active && !p->busy) || bt_now_ms() - p->server_down_ms >= EXIT_GRACE_MS) {
        bt_registration_stop(p->reg); /* (its heartbeats, marked leaving, kept the job's
                                         request from being failed as on a dead group) */
        p->reg = NULL;
        uv_stop(p->loop);
    }
}

static void on_server_down(void *ctx)
{
    prefill_t *p = ctx;
    p->server_down = true;
    p->server_down_ms = bt_now_ms();
    maybe_exit(p); /* (else when the active job ends: its call was cancelled, so at its next
                      chunk boundary, after a STOPPED notice) */
}

/* The router knows we are leaving (or could not be told within a second). Jobs still
 * queued end at once, ABORTED: a status the prefill group gives only for a job that wrote
 * nothing, so the decode group frees its slot without waiting out late writes (it quarantined
 * them all for its watchdog, 300 s by default: a prefill restart under load filled the decode
 * pools), and the router starts the request on another prefill group. The active job gets
 * --drain-timeout to finish; past it the server's close cancels its call, and it stops at its
 * next chunk boundary and tells its decode group so (STOPPED). */
static void on_left(void *ctx)
{
    prefill_t *p = ctx;
    end_queued(p, BT_RPC_ABORTED,
               "prefill group shutting down before this request's turn (nothing written)");
    bt_rpc_server_shutdown(p->server, (int)p->drain_ms, on_server_down, p);
}

/* SIGTERM: the router is told first, so that it sends nothing new here and the jobs handed
 * back find another group. */
static void on_stop(void *ctx)
{
    prefill_t *p = ctx;
    if (p->stopping) return;
    p->stopping = true;
    bt_registration_leave(p->reg, on_left, p);
}

int main(int argc, char **argv)
{
    bt_log_set_tag("prefill");
    signal(SIGPIPE, SIG_IGN); /* a peer that vanished must not kill the process */
    bt_worker_flags_t w = bt_worker_flags_default();
    int64_t chunk = 4096, cache_mb = 4096;
    bool no_cache = false;
    bt_sim_t sim = bt_sim_default();
    bt_flag_t spec[] = {
        BT_WORKER_FLAGS(&w),
        BT_FLAG_INT("chunked-prefill-size", &chunk, "tokens per prefill chunk (default 4096)"),
        BT_FLAG_BOOL("disable-radix-cache", &no_cache,
                     "keep no prompt prefixes (the prefix cache)"),
        BT_FLAG_INT("prefix-cache-mb", &cache_mb,
                    "host memory for cached prompt prefixes (default 4096)"),
        BT_SIM_FLAGS(&sim),
    };
    char err[1024];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc - 1, argv + 1, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton-prefill: %s\n", err);
        return 2;
    }
    if (!bt_worker_flags_check(&w, sim.on, err, sizeof err) || chunk < 1 || chunk > (1 << 20)) {
        fprintf(stderr, "baton-prefill: %s\n", chunk < 1 || chunk > (1 << 20) ? "--chunked-prefill-size must be 1..1048576" : err);
        return 2;
    }
    if (cache_mb < 0 || cache_mb > (1 << 24)) {
        fprintf(stderr, "baton-prefill: --prefix-cache-mb must be 0..16777216\n");
        return 2;
    }
    if (!bt_sim_valid(&sim, err, sizeof err)) {
        fprintf(stderr, "baton-prefill: %s\n", err);
        return 2;
    }
    bt_log_set_level((bt_log_level_t)bt_log_level_parse(w.log_level));
    static prefill_t pp;
    prefill_t *p = &pp;
    p->loop = uv_default_loop();
    p->chunk_size = (int)chunk;
    p->watchdog_ms = (int64_t)(w.watchdog_s * 1000.0);
    p->drain_ms = (int64_t)(w.drain_s * 1000.0);
    p->sim = sim;
    if (w.tp > 1 && bt_tp_join("prefill", (int)w.node_rank, (int)w.tp, w.dist_addr, (int)(w.watchdog_s * 1000.0), &p->comm) != BT_OK) return 1;
    bt_service_device_t dev = bt_worker_flags_device(&w, sim.on);
    if (sim.on)
        st = bt_service_engine_open_sim(w.model_path, w.served, w.context, &p->eng, err, sizeof err);
    else
        st = bt_service_engine_open_tp(w.model_path, w.served, w.context, 1, (int)chunk, (int)w.threads, p->comm,
                                       &dev, &p->eng, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "baton-prefill: %s\n", err);
        return 1;
    }
    p->slot = bt_aligned_alloc(64, p->eng.layout.slot_bytes);
    p->logits = bt_malloc_or_die((size_t)p->eng.cfg->vocab * sizeof(float));
    if (!p->slot) {
        fprintf(stderr, "baton-prefill: cannot allocate the KV slot\n");
        return 1;
    }
    if (sim.on) memset(p->slot, 0, p->eng.layout.slot_bytes); /* the dummy bytes it moves */
    if (!no_cache && cache_mb > 0 && !(p->comm && w.node_rank > 0) &&
        bt_prefix_cache_create(p->eng.cfg, &p->eng.layout, (size_t)cache_mb << 20, &p->cache) !=
            BT_OK) {
        fprintf(stderr, "baton-prefill: cannot create the prefix cache\n");
        return 1;
    }
    if (p->cache && sim.on) bt_prefix_cache_counters_only(p->cache);
    if (p->comm && w.node_rank > 0) {
        /* a following rank: no gRPC, no transfers; it runs what rank 0 plans */
        BT_LOG_INFO("rank %lld of %lld following rank 0 at %s", (long long)w.node_rank, (long long)w.tp, w.dist_addr);
        st = bt_tp_follow(p->comm, p->eng.model, &p->eng.layout, follower_slot, p->slot, 1);
        if (st != BT_OK) BT_LOG_ERROR("the group failed (%s): leaving", bt_status_str(st));
        bt_comm_destroy(p->comm);
        return st == BT_OK ? 0 : 1;
    }
    bt_xfer_options_t xo = {BT_XFER_UCX, w.ucx_tls, w.net_devices, 1000};
    if ((st = bt_xfer_create(p->loop, &xo, &p->xfer)) != BT_OK) {
        fprintf(stderr, "baton-prefill: transfer layer: %s\n", bt_status_str(st));
        return 1;
    }
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%lld", w.host, (long long)w.port);
    if ((st = bt_rpc_create(p->loop, &p->rpc)) != BT_OK ||
        (st = bt_rpc_server_create(p->rpc, addr, NULL, &p->server)) != BT_OK ||
        (st = bt_rpc_server_method(p->server, "/baton.v1.Prefill/Prefill", BT_RPC_UNARY, on_prefill,
                                   p)) != BT_OK ||
        (st = bt_rpc_server_method(p->server, "/baton.v1.Prefill/Hello", BT_RPC_UNARY, on_hello,
                                   p)) != BT_OK ||
        (st = bt_rpc_server_method(p->server, "/baton.v1.Prefill/Forget", BT_RPC_UNARY, on_forget,
                                   p)) != BT_OK ||
        (st = bt_rpc_server_start(p->server)) != BT_OK) {
        fprintf(stderr, "baton-prefill: cannot serve gRPC on %s: %s\n", addr, bt_status_str(st));
        return 1;
    }
    snprintf(p->address, sizeof p->address, "%s:%d", w.host, bt_rpc_server_port(p->server));
    p->metrics = bt_metrics_create("baton_prefill");
    p->chunk_time = bt_metrics_histogram(p->metrics, "chunk_seconds", "One prefill chunk's forward", bt_metrics_latency_buckets, NULL, NULL);
    p->commit_time = bt_metrics_histogram(p->metrics, "transfer_seconds", "Put + flush + notice of one chunk",
                                          bt_metrics_latency_buckets, NULL, NULL);
    p->job_time = bt_metrics_histogram(p->metrics, "request_seconds", "Whole prefill of a request", bt_metrics_latency_buckets, NULL, NULL);
    refresh_metrics(p);
    if (bt_metrics_server_start(p->loop, w.host, (int)w.metrics_port, p->metrics, refresh_metrics, p, &p->metrics_server) != BT_OK) {
        fprintf(stderr, "baton-prefill: cannot serve /metrics on %s:%lld\n", w.host, (long long)w.metrics_port);
        return 1;
    }
    printf("baton-prefill metrics on %s:%d\n", w.host, bt_metrics_server_port(p->metrics_server));
    printf("baton-prefill listening on %s\n", p->address);
    fflush(stdout);
    BT_LOG_INFO("listening on %s (chunks of %d tokens; prefix cache %s)", p->address, p->chunk_size,
                p->cache ? "on" : "off");
    if (w.router) {
        Baton__V1__WorkerInfo info = BATON__V1__WORKER_INFO__INIT;
        info.role = BATON__V1__WORKER_ROLE__ROLE_PREFILL;
        info.address = p->address;
        info.model = p->eng.served_name;
        info.compat_hash = p->eng.compat_hash;
        info.tp = (int32_t)w.tp;
        info.context_length = p->eng.layout.max_ctx;
        info.vocab_size = p->eng.cfg->vocab;
        bt_registration_start(p->rpc, w.router, &info, load_fn, p, &p->reg);
    }
    bt_service_on_signal(p->loop, on_stop, p);
    uv_timer_init(p->loop, &p->tp_timer);
    p->tp_timer.data = p;
    uv_timer_init(p->loop, &p->watchdog);
    p->watchdog.data = p;
    uv_timer_start(&p->watchdog, on_watchdog, 500, 500);
    if (p->comm) uv_timer_start(&p->tp_timer, on_tp_timer, 1000, 1000);
    uv_run(p->loop, UV_RUN_DEFAULT);
    if (p->comm && !p->group_failed && !p->busy) bt_tp_lead_shutdown(p->comm);
    BT_LOG_INFO("stopped");
    return 0;
}

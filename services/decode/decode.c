/* baton-decode: a decode group. Owns a request once admitted: allocates its KV slot, asks a
 * prefill group to fill it (the KV bytes arrive over the transfer layer straight into the
 * slot), then runs it in the continuous batch and streams tokens to the router.
 *
 * Threads: the uv loop runs gRPC, transfer notices and bookkeeping; each batch step runs on
 * libuv's work pool (one step at a time), so the loop stays responsive during a step. */
#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "common/text/grammar.h"
#include "common/transfer/transfer.h"
#include "common/metrics.h"
#include "services/common/metrics_server.h"
#include "services/common/proto_util.h"
#include "services/engine/sampler.h"
#include "services/engine/spec.h"
#include "services/common/service.h"
#include "services/common/tp_group.h"
#include "services/common/worker_flags.h"
#include "services/common/sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct decode decode_t;

/* SEQ_WAITING: arrived while the group was full but a place was being freed (a request whose
 * stream ended, still in the step in flight or its prefill call being cancelled; a quarantined
 * slot); admitted when that place is free, or refused once PLACE_WAIT_MS pass. */
typedef enum { SEQ_WAITING, SEQ_PREFILLING, SEQ_RUNNING, SEQ_DONE } seq_state_t;

/* How long an arrival waits for a place being freed. A step is well under this; a slot whose
 * prefill group went away waits out the watchdog, and the router finds another place. */
#define PLACE_WAIT_MS 2000

typedef struct prefill_peer prefill_peer_t;

typedef struct seq {
    decode_t *d;
    struct seq *next;           /* in d->seqs */
    struct seq *wait_next;      /* in a peer's hello wait list */
    bt_rpc_call_t *call;        /* the router's stream; NULL once finished */
    char request_id[96];
    uint64_t epoch;
    int slot;
    int32_t *prompt;
    int n_prompt;
    int32_t cache_points[2]; /* passed on to the prefill group */
    int n_cache_points;
    bt_sampling_t sampling;
    bt_penalties_t pen; /* logit_bias, and the penalties of the tokens generated so far */
    int32_t *bias_ids;  /* the request's logit_bias, for the prefill group's first draw */
    float *bias;
    int n_bias;
    int max_new;
    bool ignore_eos, logprobs;
    int top_logprobs;
    int32_t *stop_ids;
    int n_stop_ids;
    bt_grammar_t *grammar;    /* response_format's constraint, NULL: none */
    uint32_t *allow;          /* its mask for the step (filled in the step's work) */
    char response_format[16]; /* and what makes it, for the prefill group's first draw */
    char *json_schema;
    bool has_constrain_after;
    int32_t constrain_after_token;
    seq_state_t state;
    prefill_peer_t *peer;
    bt_rpc_client_call_t *prefill_call;
    bool prefill_pending, last_notice, prefill_ok, in_step, cancelled;
    bool target_sent;           /* a Prefill call carried the slot's address out */
    bool prefill_stopped;       /* no more writes come: its prefill group said so (STOPPED), or
                                   answered as it does only for a job that wrote nothing */
    bool needs_sync;            /* TP: copy its KV to the other ranks before its first step */
    bool waiting;               /* not admitted yet: no slot, not in n_admitted (SEQ_WAITING) */
    uint64_t arrival;           /* waiting ones are admitted in this order */
    int32_t first_token;
    float first_logprob;
    int cached_tokens; /* of its prompt, restored from the prefill group's prefix cache */
    bt_top_logprob_t first_top[20];
    int n_first_top;
    int32_t next_token;         /* fed at the next step */
    int generated;
    int64_t t_admit, t_last;
    int shared;                 /* tokens of the step's share emitted so far (seq_emit_share) */
    uint64_t sim_key;           /* --simulate: the key of its pseudo-random tokens */
} seq_t;

struct prefill_peer {
    prefill_peer_t *next;
    char address[256];
    bt_rpc_channel_t *ch;
    enum { HELLO_NONE, HELLO_PENDING, HELLO_OK, HELLO_BAD } hello;
    char hello_err[1024];
    seq_t *waiting;
};

struct decode {
    uv_loop_t *loop;
    bt_rpc_t *rpc;
    bt_rpc_server_t *server;
    bt_xfer_t *xfer;
    bt_xfer_region_t *region;
    bt_service_engine_t eng;
    bt_kv_pool_t *pool;
    bt_registration_t *reg;
    seq_t *seqs;
    prefill_peer_t *peers;
    int max_running, n_admitted, max_seen;
    int n_waiting; /* requests in SEQ_WAITING */
    uint64_t arrivals;
    bool admitting; /* admit_waiting is on the stack */
    int64_t watchdog_ms;
    int64_t requests_done;
    /* leaving (SIGTERM): the router was told (or could not be) once `left`; the group takes
     * nothing new, finishes what it runs within drain_ms, then stops */
    bool draining, left;
    int64_t drain_ms;
    uv_timer_t drain_timer;
    /* the step in flight */
    bool stepping, stopping;
    uv_work_t work;
    seq_t **batch;
    bt_forward_seq_t *fwd;
    int n_batch;
    /* each batch sequence's draw, made where the forward runs (on the GPU with --device cuda) */
    bt_sample_req_t *draw_req;
    bt_sample_out_t *draw_out;
    /* --speculative-algorithm DSPARK: every step is speculative (bt_spec_step) */
    bt_spec_t *spec;
    bt_spec_seq_t *spec_seqs;
    bool spec_step;
    bt_status_t step_status;
    char step_err[256];
    char address[256];
    bt_metrics_t *metrics;
    bt_metrics_server_t *metrics_server;
    bt_histogram_t *ttft, *itl, *step_time, *handoff;
    int64_t step_start_ms;
    bt_sim_t sim;       /* --simulate: a timing model instead of the model */
    /* tensor parallelism: this process leads the group (rank 0) when comm is set */
    struct quarantine *quarantine; /* slots waiting out late writes */
    uv_timer_t housekeeping_timer;
    bt_comm_t *comm;
    bool tp_noop;       /* the work in flight is an idle heartbeat to the other ranks */
    bool group_failed;
    uv_timer_t tp_timer;
    double sim_step_ms; /* the modelled time of the step in flight */
};

static void count(decode_t *d, const char *name, const char *help, const char *label, const char *value)
{
    bt_counter_add(bt_metrics_counter(d->metrics, name, help, label, value), 1);
}

static void maybe_step(decode_t *d);
static void admit_waiting(decode_t *d);
static void maybe_drained(decode_t *d);
struct quarantine;

/* ---- sequence lifetime --------------------------------------------------------------------- */

static void seq_unlink(decode_t *d, seq_t *s)
{
    for (seq_t **p = &d->seqs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            return;
        }
}

/* Frees the sequence once nothing refers to it any more. */
/* A slot whose prefill did not end cleanly may still receive late puts from a prefill group
 * that gave up on us (or that we gave up on): it waits out one watchdog before reuse. Only
 * one whose address went out in a Prefill call: a request that failed before (its prefill
 * group unreachable, incompatible, or the call not made) frees its slot at once; before, those
 * too held their slots for the watchdog, and a few refusals filled the pool. */
typedef struct quarantine {
    struct quarantine *next;
    int slot;
    int64_t until_ms;
    uint64_t epoch; /* the request it held: its prefill group's STOPPED notice frees it early */
    char *request_id;
} quarantine_t;

/* Ends the quarantine at *qp (unlinked): its slot back in the pool. */
static void quarantine_end(decode_t *d, quarantine_t **qp)
{
    quarantine_t *q = *qp;
    *qp = q->next;
    bt_kv_pool_free(d->pool, q->slot);
    free(q->request_id);
    free(q);
}

/* Ends the quarantine of (request_id, epoch), if it still runs: its prefill group wrote its
 * last (a STOPPED or LAST notice, a Forget answered done). */
static bool quarantine_end_of(decode_t *d, const char *request_id, uint64_t epoch)
{
    for (quarantine_t **q = &d->quarantine; *q; q = &(*q)->next)
        if ((*q)->epoch == epoch && !strcmp((*q)->request_id, request_id)) {
            quarantine_end(d, q);
            count(d, "kv_slots_released_early_total",
                  "Quarantined slots freed once their prefill group said it wrote its last", NULL,
                  NULL);
            return true;
        }
    return false;
}

typedef struct {
    decode_t *d;
    char *request_id;
    uint64_t epoch;
} forget_t;

static void on_forget_reply(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp,
                            size_t len)
{
    forget_t *f = ctx;
    Baton__V1__ForgetResponse *r =
        code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__forget_response, resp, len) : NULL;
    if (r && r->done && quarantine_end_of(f->d, f->request_id, f->epoch)) admit_waiting(f->d);
    if (!r) /* (an older prefill group answers UNIMPLEMENTED) */
        BT_LOG_INFO("request %s: its prefill group did not answer Forget (%s %s): its slot waits "
                    "out the watchdog",
                    f->request_id, bt_rpc_code_name(code), msg ? msg : "");
    if (r) BT_PROTO_FREE(baton__v1__forget_response, r);
    free(f->request_id);
    free(f);
}

/* A quarantined slot's prefill group may never have seen the job (the cancel overtook the
 * Prefill call): then no STOPPED notice comes, and the slot waited out the watchdog. It is
 * asked: a job it never saw it refuses from now on, and answers done. */
static void quarantine_forget(decode_t *d, prefill_peer_t *peer, const quarantine_t *q)
{
    if (!peer || peer->hello != HELLO_OK) return; /* (gone or unknown: the watchdog it is) */
    Baton__V1__ForgetRequest fr = BATON__V1__FORGET_REQUEST__INIT;
    fr.request_id = q->request_id;
    fr.epoch = q->epoch;
    fr.hold_ms = d->watchdog_ms;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&fr.base, &buf, &len);
    forget_t *f = bt_calloc_or_die(1, sizeof *f);
    f->d = d;
    f->request_id = bt_strdup_or_die(q->request_id);
    f->epoch = q->epoch;
    if (bt_rpc_unary(peer->ch, "/baton.v1.Prefill/Forget", buf, len, 5000, on_forget_reply, f,
                     NULL) != BT_OK) {
        free(f->request_id);
        free(f);
    }
    free(buf);
}

static void seq_release(seq_t *s)
{
    decode_t *d = s->d;
    if (s->call || s->prefill_pending || s->in_step) return;
    /* (after the LAST notice every write is in place and none follows: a cancel that came
     * before the prefill's reply leaves a complete slot, free at once) */
    if (s->slot >= 0 && s->target_sent && !s->prefill_ok && !s->prefill_stopped &&
        !s->last_notice) {
        quarantine_t *q = bt_calloc_or_die(1, sizeof *q);
        q->slot = s->slot;
        q->until_ms = bt_now_ms() + d->watchdog_ms;
        q->epoch = s->epoch;
        q->request_id = bt_strdup_or_die(s->request_id);
        q->next = d->quarantine;
        d->quarantine = q;
        s->slot = -1;
        quarantine_forget(d, s->peer, q);
    }
    if (s->slot >= 0) {
        bt_kv_pool_free(d->pool, s->slot);
        s->slot = -1;
    }
    seq_unlink(d, s);
    const bool was_waiting = s->waiting;
    if (was_waiting)
        d->n_waiting--;
    else
        d->n_admitted--;
    free(s->prompt);
    free(s->stop_ids);
    bt_grammar_destroy(s->grammar);
    free(s->allow);
    free(s->json_schema);
    bt_penalties_free(&s->pen);
    free(s->bias_ids);
    free(s->bias);
    free(s);
    if (!was_waiting) admit_waiting(d);
    maybe_drained(d);
}

/* Ends the router's stream with a status (once). */
static void seq_fail(seq_t *s, bt_rpc_code_t code, const char *msg)
{
    if (s->call) count(s->d, "requests_failed_total", "Requests ended with an error, by status", "status",
                       bt_rpc_code_name(code));
    if (s->call) {
        BT_LOG_WARN("request %s: %s: %s", s->request_id, bt_rpc_code_name(code), msg);
        bt_rpc_call_finish(s->call, code, msg);
        s->call = NULL;
    }
    s->state = SEQ_DONE;
    if (s->prefill_call && s->prefill_pending) bt_rpc_client_cancel(s->prefill_call);
    seq_release(s);
}

static void send_event(seq_t *s, const int32_t *ids, int n, const float *logprob,
                       const bt_top_logprob_t *top, int n_top, Baton__V1__FinishReason finish)
{
    if (!s->call) return;
    Baton__V1__DecodeEvent ev = BATON__V1__DECODE_EVENT__INIT;
    ev.n_token_ids = (size_t)n;
    ev.token_ids = (int32_t *)ids;
    Baton__V1__TokenLogprob lp = BATON__V1__TOKEN_LOGPROB__INIT, *lps[1] = {&lp};
    Baton__V1__TopLogprob tops[20], *top_ptrs[20];
    if (logprob && s->logprobs && n == 1) {
        lp.token_id = ids[0];
        lp.logprob = *logprob;
        for (int i = 0; i < n_top && i < 20; i++) {
            baton__v1__top_logprob__init(&tops[i]);
            tops[i].token_id = top[i].id;
            tops[i].logprob = top[i].logprob;
            top_ptrs[i] = &tops[i];
        }
        lp.n_top = (size_t)(n_top < 20 ? n_top : 20);
        lp.top = top_ptrs;
        ev.n_logprobs = 1;
        ev.logprobs = lps;
    }
    ev.finish_reason = finish;
    ev.cached_tokens = s->cached_tokens;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&ev.base, &buf, &len);
    bt_rpc_call_send(s->call, buf, len, NULL, NULL);
    free(buf);
}

/* Finishes normally after the last token went out. */
static void seq_finish(seq_t *s)
{
    decode_t *d = s->d;
    if (s->call) {
        bt_rpc_call_finish(s->call, BT_RPC_OK, NULL);
        s->call = NULL;
    }
    s->state = SEQ_DONE;
    d->requests_done++;
    count(d, "requests_finished_total", "Requests finished normally", NULL, NULL);
    seq_release(s);
}

/* Is token t the end of the sequence? */
static Baton__V1__FinishReason finish_reason(const seq_t *s, int32_t t)
{
    const bt_model_config_t *c = s->d->eng.cfg;
    if (!s->ignore_eos && t == c->eos_id) return BATON__V1__FINISH_REASON__FINISH_STOP;
    /* (a closed JSON object allows nothing but eos: it ends the output even under ignore_eos) */
    if (t == c->eos_id && s->grammar && bt_grammar_done(s->grammar))
        return BATON__V1__FINISH_REASON__FINISH_STOP;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == t) return BATON__V1__FINISH_REASON__FINISH_STOP;
    if (s->generated >= s->max_new) return BATON__V1__FINISH_REASON__FINISH_LENGTH;
    if (s->n_prompt + s->generated >= s->d->eng.layout.max_ctx)
        return BATON__V1__FINISH_REASON__FINISH_LENGTH;
    return BATON__V1__FINISH_REASON__FINISH_NONE;
}

/* Emits token t (the first from prefill, or a step's) and decides whether to go on: false
 * when the sequence finished (s may be gone). A speculative step's k tokens (share = k) each
 * count 1/k of the time since the sequence's last step as their inter-token latency. */
static bool seq_emit_share(seq_t *s, int32_t t, float logprob, const bt_top_logprob_t *top,
                           int n_top, int share)
{
    int64_t now = bt_now_ms();
    if (s->generated == 0) {
        bt_histogram_observe(s->d->ttft, (double)(now - s->t_admit) / 1000.0);
        s->t_last = now;
    } else {
        bt_histogram_observe(s->d->itl, (double)(now - s->t_last) / 1000.0 / (double)share);
        if (share == 1 || ++s->shared == share) {
            s->t_last = now;
            s->shared = 0;
        }
    }
    s->generated++;
    bt_penalties_add(&s->pen, t);
    if (s->grammar && !bt_grammar_accept(s->grammar, t) && !s->d->sim.on)
        BT_LOG_WARN("request %s: token %d outside its response_format", s->request_id, t);
    Baton__V1__FinishReason fr = finish_reason(s, t);
    send_event(s, &t, 1, &logprob, top, n_top, fr);
    if (fr != BATON__V1__FINISH_REASON__FINISH_NONE) {
        seq_finish(s);
        return false;
    }
    s->next_token = t;
    return true;
}

static bool seq_emit(seq_t *s, int32_t t, float logprob, const bt_top_logprob_t *top, int n_top)
{
    return seq_emit_share(s, t, logprob, top, n_top, 1);
}

/* Both the LAST notice (bytes visible) and the prefill reply (status) are in. */
static void seq_maybe_ready(seq_t *s)
{
    if (s->state != SEQ_PREFILLING || !s->last_notice || !s->prefill_ok) return;
    s->state = SEQ_RUNNING;
    s->needs_sync = s->d->comm != NULL;
    bt_histogram_observe(s->d->handoff, (double)(bt_now_ms() - s->t_admit) / 1000.0);
    BT_LOG_DEBUG("request %s: prefilled, first token %d", s->request_id, s->first_token);
    decode_t *d = s->d; /* a one-token request finishes (and frees s) in seq_emit */
    seq_emit(s, s->first_token, s->first_logprob, s->first_top, s->n_first_top);
    maybe_step(d);
}

/* ---- prefill ------------------------------------------------------------------------------ */

/* A prefill group's answer when it dropped a job rather than failed it: it was stopping
 * (ABORTED), or it went away (the call cut, the process unreachable). */
static bool prefill_dropped(bt_rpc_code_t code)
{
    return code == BT_RPC_ABORTED || code == BT_RPC_UNAVAILABLE || code == BT_RPC_CANCELLED;
}

static void on_prefill_reply(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp,
                             size_t len)
{
    seq_t *s = ctx;
    s->prefill_pending = false;
    s->prefill_call = NULL;
    /* answers a prefill group gives only for a job that wrote nothing (statuses the gRPC
     * library never makes itself): no late writes can come, so the slot needs no quarantine */
    if (code == BT_RPC_ABORTED || code == BT_RPC_INVALID_ARGUMENT ||
        code == BT_RPC_FAILED_PRECONDITION)
        s->prefill_stopped = true;
    if (s->state == SEQ_DONE) {
        seq_release(s);
        return;
    }
    Baton__V1__PrefillResponse *pr = NULL;
    if (code == BT_RPC_OK) pr = BT_PROTO_UNPACK(baton__v1__prefill_response, resp, len);
    if (!pr) {
        char m[512];
        count(s->d, "handoff_failures_total", "KV handoffs that failed, by cause", "cause", bt_rpc_code_name(code));
        /* the group may be gone: the next request asks it (Hello) before sending a slot's
         * address there, which a dead group never answers. Else every request the router
         * sent there until it noticed (three heartbeats) sent its slot out, and each slot
         * waited out the watchdog for writes that could never come. */
        if ((code == BT_RPC_UNAVAILABLE || code == BT_RPC_DEADLINE_EXCEEDED) &&
            s->peer->hello == HELLO_OK)
            s->peer->hello = HELLO_NONE;
        snprintf(m, sizeof m, "prefill at %s failed: %s%s%s", s->peer->address,
                 bt_rpc_code_name(code), msg ? ": " : "", msg ? msg : "");
        /* the prefill process stopped writing: the call ended (or its process is gone). One
         * that dropped the job (stopping, or gone) leaves the request as it came, no token
         * out: ABORTED, and the router tries another prefill group */
        seq_fail(s,
                 prefill_dropped(code)                ? BT_RPC_ABORTED
                 : code == BT_RPC_DEADLINE_EXCEEDED   ? BT_RPC_DEADLINE_EXCEEDED
                 : code == BT_RPC_FAILED_PRECONDITION ? BT_RPC_FAILED_PRECONDITION
                                                      : BT_RPC_UNAVAILABLE,
                 m);
        return;
    }
    s->prefill_ok = true;
    s->first_token = pr->first_token;
    s->cached_tokens = pr->cached_tokens;
    if (pr->first_logprob) {
        s->first_logprob = pr->first_logprob->logprob;
        for (size_t i = 0; i < pr->first_logprob->n_top && i < 20; i++) {
            s->first_top[i].id = pr->first_logprob->top[i]->token_id;
            s->first_top[i].logprob = pr->first_logprob->top[i]->logprob;
            s->n_first_top = (int)i + 1;
        }
    }
    BT_PROTO_FREE(baton__v1__prefill_response, pr);
    seq_maybe_ready(s);
}

static void start_prefill(seq_t *s)
{
    decode_t *d = s->d;
    Baton__V1__PrefillRequest req = BATON__V1__PREFILL_REQUEST__INIT;
    req.request_id = s->request_id;
    req.epoch = s->epoch;
    req.n_prompt_ids = (size_t)s->n_prompt;
    req.prompt_ids = s->prompt;
    req.n_cache_points = (size_t)s->n_cache_points;
    req.cache_points = s->cache_points;
    Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
    sp.temperature = s->sampling.temperature;
    sp.top_p = s->sampling.top_p;
    sp.top_k = s->sampling.top_k;
    sp.min_p = s->sampling.min_p;
    sp.has_seed = 1;
    sp.seed = s->sampling.seed;
    sp.logprobs = s->logprobs;
    sp.top_logprobs = s->top_logprobs;
    sp.n_logit_bias_ids = sp.n_logit_bias = (size_t)s->n_bias;
    sp.logit_bias_ids = s->bias_ids;
    sp.logit_bias = s->bias;
    sp.response_format = s->response_format;
    sp.json_schema = s->json_schema;
    sp.has_constrain_after = s->has_constrain_after;
    sp.constrain_after_token = s->constrain_after_token;
    req.sampling = &sp;
    Baton__V1__KvTarget target = BATON__V1__KV_TARGET__INIT;
    const uint8_t *desc;
    size_t desc_len;
    bt_xfer_region_desc(d->region, &desc, &desc_len);
    target.region.data = (uint8_t *)desc;
    target.region.len = desc_len;
    target.slot_offset = (uint64_t)(bt_kv_pool_slot(d->pool, s->slot) - bt_kv_pool_slot(d->pool, 0));
    target.slot_bytes = d->eng.layout.slot_bytes;
    req.target = &target;
    req.compat_hash = d->eng.compat_hash;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&req.base, &buf, &len);
    s->prefill_pending = true;
    bt_status_t st = bt_rpc_unary(s->peer->ch, "/baton.v1.Prefill/Prefill", buf, len,
                                  d->watchdog_ms, on_prefill_reply, s, &s->prefill_call);
    free(buf);
    s->target_sent = st == BT_OK;
    if (st != BT_OK) {
        s->prefill_pending = false;
        seq_fail(s, BT_RPC_UNAVAILABLE, "cannot call the prefill group");
    }
}

static void on_hello(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp,
                     size_t len)
{
    prefill_peer_t *p = ctx;
    decode_t *d = NULL;
    Baton__V1__HelloResponse *hr = NULL;
    if (code == BT_RPC_OK) hr = BT_PROTO_UNPACK(baton__v1__hello_response, resp, len);
    seq_t *w = p->waiting;
    p->waiting = NULL;
    if (w) d = w->d;
    if (!hr) {
        p->hello = HELLO_NONE; /* try again with the next request */
        snprintf(p->hello_err, sizeof p->hello_err, "prefill at %s unreachable: %s %s", p->address,
                 bt_rpc_code_name(code), msg ? msg : "");
    } else if (d && hr->compat_hash != d->eng.compat_hash) {
        p->hello = HELLO_BAD;
        snprintf(
            p->hello_err, sizeof p->hello_err,
            "prefill at %s is incompatible: compat hash %016" PRIx64 " (model %s, tp %d) vs "
            "decode %016" PRIx64 " (model %s, tp %d%s): model, dtype, KV layout (context length), "
            "TP size or DSpark draft stages (--speculative-algorithm) differ",
            p->address, hr->compat_hash, hr->model, hr->tp, d->eng.compat_hash, d->eng.served_name,
            d->eng.model ? bt_model_tp_size(d->eng.model) : 1, d->spec ? ", DSpark" : "");
        BT_LOG_ERROR("%s", p->hello_err);
    } else {
        p->hello = HELLO_OK;
    }
    if (hr) BT_PROTO_FREE(baton__v1__hello_response, hr);
    while (w) {
        seq_t *next = w->wait_next;
        w->wait_next = NULL;
        w->prefill_pending = false; /* no longer held by the wait list */
        if (w->state == SEQ_DONE)
            seq_release(w);
        else if (p->hello == HELLO_OK)
            start_prefill(w);
        else /* unreachable: dropped, as far as the request goes */
            seq_fail(w, p->hello == HELLO_BAD ? BT_RPC_FAILED_PRECONDITION : BT_RPC_ABORTED,
                     p->hello_err);
        w = next;
    }
}

static prefill_peer_t *peer_get(decode_t *d, const char *address)
{
    for (prefill_peer_t *p = d->peers; p; p = p->next)
        if (!strcmp(p->address, address)) return p;
    prefill_peer_t *p = bt_calloc_or_die(1, sizeof *p);
    snprintf(p->address, sizeof p->address, "%s", address);
    if (bt_rpc_channel_create(d->rpc, address, NULL, &p->ch) != BT_OK) {
        free(p);
        return NULL;
    }
    p->next = d->peers;
    d->peers = p;
    return p;
}

static void seq_begin_prefill(seq_t *s)
{
    prefill_peer_t *p = s->peer;
    if (p->hello == HELLO_OK) {
        start_prefill(s);
        return;
    }
    if (p->hello == HELLO_BAD) {
        seq_fail(s, BT_RPC_FAILED_PRECONDITION, p->hello_err);
        return;
    }
    s->wait_next = p->waiting;
    p->waiting = s;
    s->prefill_pending = true; /* held by the wait list */
    if (p->hello == HELLO_PENDING) return;
    p->hello = HELLO_PENDING;
    Baton__V1__HelloRequest hq = BATON__V1__HELLO_REQUEST__INIT;
    hq.compat_hash = s->d->eng.compat_hash;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&hq.base, &buf, &len);
    if (bt_rpc_unary(p->ch, "/baton.v1.Prefill/Hello", buf, len, 5000, on_hello, p, NULL) != BT_OK)
        on_hello(p, BT_RPC_UNAVAILABLE, "cannot start the call", NULL, 0);
    free(buf);
}

/* ---- requests waiting for a place ---------------------------------------------------------- */

/* Places being freed: admitted requests whose stream has ended (released when the step in
 * flight, or their cancelled prefill call, ends), and, where the pool binds rather than the
 * running cap, quarantined slots (their end frees a slot, not a running place). */
static int places_leaving(const decode_t *d)
{
    int n = 0;
    for (const seq_t *s = d->seqs; s; s = s->next)
        n += !s->waiting && !s->call;
    if (d->n_admitted < d->max_running)
        for (const quarantine_t *q = d->quarantine; q; q = q->next)
            n++;
    return n;
}

/* Admits waiting requests, oldest first, while there are places (after a release). */
static void admit_waiting(decode_t *d)
{
    if (d->admitting || d->stopping || d->draining) return;
    d->admitting = true; /* a failure inside seq_begin_prefill releases, and comes back here */
    while (d->n_waiting > 0 && d->n_admitted < d->max_running) {
        seq_t *w = NULL;
        for (seq_t *s = d->seqs; s; s = s->next)
            if (s->waiting && (!w || s->arrival < w->arrival)) w = s;
        int slot;
        if (!w || bt_kv_pool_alloc(d->pool, &slot) != BT_OK) break;
        w->waiting = false;
        d->n_waiting--;
        w->slot = slot;
        w->state = SEQ_PREFILLING;
        d->n_admitted++;
        if (d->n_admitted > d->max_seen) d->max_seen = d->n_admitted;
        BT_LOG_DEBUG("request %s admitted after %lld ms waiting", w->request_id,
                     (long long)(bt_now_ms() - w->t_admit));
        seq_begin_prefill(w);
    }
    d->admitting = false;
}

/* Refuses the requests that waited PLACE_WAIT_MS (the router then finds them another place). */
static void expire_waiting(decode_t *d, int64_t now)
{
    for (seq_t *s = d->seqs; s;) {
        seq_t *next = s->next; /* failing a waiting request frees it alone */
        if (s->waiting && s->call && now - s->t_admit >= PLACE_WAIT_MS) {
            char m[96];
            snprintf(m, sizeof m, "decode group full: no place was freed within %d ms",
                     PLACE_WAIT_MS);
            seq_fail(s, BT_RPC_RESOURCE_EXHAUSTED, m);
        }
        s = next;
    }
}

/* ---- KV notices from prefill groups -------------------------------------------------------- */

static seq_t *find_seq(decode_t *d, const char *id, uint64_t epoch)
{
    for (seq_t *s = d->seqs; s; s = s->next)
        if (s->epoch == epoch && !strcmp(s->request_id, id)) return s;
    return NULL;
}

static void on_notice(void *ctx, const uint8_t *data, size_t len)
{
    decode_t *d = ctx;
    Baton__V1__KvNotice *n = BT_PROTO_UNPACK(baton__v1__kv_notice, data, len);
    if (!n) {
        BT_LOG_WARN("dropping an unreadable KV notice (%zu bytes)", len);
        return;
    }
    seq_t *s = find_seq(d, n->request_id, n->epoch);
    const bool ended = s && s->state != SEQ_PREFILLING; /* (cancelled or failed meanwhile) */
    if (n->kind == BATON__V1__KV_NOTICE__KIND__STOPPED ||
        (n->kind == BATON__V1__KV_NOTICE__KIND__LAST && (!s || ended))) {
        /* the request's prefill group has flushed its last write (it stopped the cancelled
         * job; or the job was done, its LAST notice overtaken by the cancel): its slot (held
         * still, or already waiting out the watchdog) needs no quarantine */
        if (s) s->prefill_stopped = true;
        if (quarantine_end_of(d, n->request_id, n->epoch)) admit_waiting(d);
    } else if (!s || s->state != SEQ_PREFILLING) {
        /* a late notice of a finished or unknown request (its epoch tells them apart) */
        BT_LOG_DEBUG("dropping a late KV notice for %s epoch %" PRIu64, n->request_id, n->epoch);
        count(d, "kv_notices_dropped_total", "Late or unknown KV notices dropped", NULL, NULL);
    } else if (n->kind == BATON__V1__KV_NOTICE__KIND__CHUNK) {
        count(d, "kv_chunks_received_total", "KV chunk notices received", NULL, NULL);
    } else if (n->kind == BATON__V1__KV_NOTICE__KIND__LAST) {
        count(d, "kv_chunks_received_total", "KV chunk notices received", NULL, NULL);
        s->last_notice = true;
        seq_maybe_ready(s);
    } else if (n->kind == BATON__V1__KV_NOTICE__KIND__FAILED) {
        seq_fail(s, BT_RPC_UNAVAILABLE, "the prefill group reported a failed transfer");
    }
    BT_PROTO_FREE(baton__v1__kv_notice, n);
}

/* ---- the continuous batch ------------------------------------------------------------------ */

/* TP: every collective runs here, on the one compute thread, in plan order */
static bt_status_t tp_lead(decode_t *d)
{
    if (d->tp_noop) return bt_tp_lead_noop(d->comm);
    bt_kv_header_t zero;
    memset(&zero, 0, sizeof zero);
    bt_kv_range_t ranges[4 * BT_MAX_LAYERS + 1];
    int slots[1024];
    for (int i = 0; i < d->n_batch; i++) {
        seq_t *s = d->batch[i];
        slots[i] = s->slot;
        if (!s->needs_sync) continue;
        /* everything the prefill wrote into the slot: from an empty header to now */
        int nr = bt_kv_changed_ranges(d->eng.cfg, &d->eng.layout, &zero, d->fwd[i].state, ranges,
                                      (int)(sizeof ranges / sizeof ranges[0]));
        bt_status_t st = bt_tp_lead_sync(d->comm, s->slot, d->fwd[i].state, ranges, nr);
        if (st != BT_OK) return st;
        s->needs_sync = false;
    }
    /* a speculative step tells the ranks each of its engine calls (spec_tp_*) */
    return d->spec_step ? BT_OK : bt_tp_lead_forward(d->comm, slots, d->fwd, d->n_batch, NULL);
}

/* DSpark in a TP group: the other ranks draft, verify and roll back with the lead */
static bt_status_t spec_tp_draft(void *ctx, const bt_spec_seq_t *q, int n)
{
    decode_t *d = ctx;
    int slots[BT_MODEL_MAX_SEQS];
    int32_t last[BT_MODEL_MAX_SEQS];
    for (int i = 0; i < n; i++) {
        slots[i] = q[i].slot;
        last[i] = q[i].last;
    }
    return bt_tp_lead_draft(d->comm, slots, last, n);
}

static bt_status_t spec_tp_verify(void *ctx, const bt_spec_seq_t *q, const bt_forward_seq_t *fwd,
                                  int n)
{
    decode_t *d = ctx;
    int slots[BT_MODEL_MAX_SEQS];
    for (int i = 0; i < n; i++)
        slots[i] = q[i].slot;
    return bt_tp_lead_forward(d->comm, slots, fwd, n, NULL);
}

static bt_status_t spec_tp_rollback(void *ctx, const bt_spec_seq_t *q, int n)
{
    decode_t *d = ctx;
    int slots[BT_MODEL_MAX_SEQS], keep[BT_MODEL_MAX_SEQS];
    for (int i = 0; i < n; i++) {
        slots[i] = q[i].slot;
        keep[i] = q[i].n_accepted + 1;
    }
    return bt_tp_lead_rollback(d->comm, slots, keep, n);
}

static void step_work(uv_work_t *w)
{
    decode_t *d = w->data;
    if (d->comm) {
        d->step_status = tp_lead(d);
        if (d->step_status != BT_OK) {
            snprintf(d->step_err, sizeof d->step_err, "tensor-parallel group failed: a rank died or stalled");
            return;
        }
        if (d->tp_noop) return;
    }
    if (d->sim.on) { /* the modelled time; the counters a forward would advance, no data */
        bt_sim_sleep_ms(d->sim_step_ms);
        for (int i = 0; i < d->n_batch; i++) bt_kv_state_advance_counters(d->eng.cfg, d->fwd[i].state, 1);
        d->step_status = BT_OK;
        return;
    }
    if (d->spec_step) {
        d->step_status = bt_spec_step(d->spec, &d->eng.layout, d->spec_seqs, d->n_batch,
                                      d->step_err, sizeof d->step_err);
        return;
    }
    /* response_format masks: here, off the loop (a state not in the cache walks the vocabulary) */
    for (int i = 0; i < d->n_batch; i++)
        if (d->draw_req[i].allow) bt_grammar_mask(d->batch[i]->grammar, d->batch[i]->allow);
    d->step_status = bt_model_forward_sample(d->eng.model, &d->eng.layout, d->fwd, d->n_batch,
                                             bt_service_emit_vocab(&d->eng), d->draw_req, d->draw_out,
                                             d->step_err, sizeof d->step_err);
}

static void exit_now(uv_timer_t *t)
{
    exit(1);
}

/* A rank of the group is gone: every request fails, and the process leaves so the router
 * stops sending to the group (it misses our heartbeats). */
static void group_failed(decode_t *d)
{
    if (d->group_failed) return;
    d->group_failed = true;
    d->stopping = true;
    BT_LOG_ERROR("%s; failing every request and leaving", d->step_err);
    for (seq_t *s = d->seqs; s;) {
        seq_t *next = s->next;
        if (s->call) seq_fail(s, BT_RPC_UNAVAILABLE, d->step_err);
        s = next;
    }
    bt_registration_stop(d->reg);
    d->reg = NULL;
    uv_timer_stop(&d->tp_timer);
    uv_timer_start(&d->tp_timer, exit_now, 300, 0);
}

static void step_done(uv_work_t *w, int status)
{
    decode_t *d = w->data;
    d->stepping = false;
    if (d->comm && d->step_status != BT_OK && !d->group_failed) {
        for (int i = 0; i < d->n_batch; i++) d->batch[i]->in_step = false;
        d->n_batch = 0;
        d->tp_noop = false;
        group_failed(d);
        return;
    }
    if (d->tp_noop) {
        d->tp_noop = false;
        maybe_step(d);
        return;
    }
    bt_histogram_observe(d->step_time, (double)(bt_now_ms() - d->step_start_ms) / 1000.0);
    bt_counter_add(bt_metrics_counter(d->metrics, "decode_steps_total", "Batch steps run", NULL, NULL), 1);
    int64_t made = d->n_batch;
    if (d->spec_step && d->step_status == BT_OK) {
        int64_t proposed = 0, accepted = 0;
        made = 0;
        for (int i = 0; i < d->n_batch; i++) {
            made += d->spec_seqs[i].n_emit;
            proposed += d->spec_seqs[i].n_proposed;
            accepted += d->spec_seqs[i].n_accepted;
        }
        bt_counter_add(bt_metrics_counter(d->metrics, "spec_proposed_total",
                                          "DSpark proposals verified", NULL, NULL),
                       proposed);
        bt_counter_add(bt_metrics_counter(d->metrics, "spec_accepted_total",
                                          "DSpark proposals accepted", NULL, NULL),
                       accepted);
    }
    bt_counter_add(bt_metrics_counter(d->metrics, "tokens_generated_total",
                                      "Tokens sampled in steps", NULL, NULL),
                   made);
    for (int i = 0; i < d->n_batch; i++) {
        seq_t *s = d->batch[i];
        s->in_step = false;
        if (d->step_status != BT_OK) {
            seq_fail(s, BT_RPC_INTERNAL, d->step_err);
            continue;
        }
        if (s->state != SEQ_RUNNING || !s->call) {
            seq_release(s);
            continue;
        }
        if (d->spec_step) { /* its accepted proposals, then the target's token */
            const bt_spec_seq_t *q = &d->spec_seqs[i];
            for (int j = 0; j < q->n_emit; j++)
                if (!seq_emit_share(s, q->emit[j], q->logprob[j], q->top[j], q->n_top, q->n_emit))
                    break;
            continue;
        }
        float lp = 0.0f;
        const bt_top_logprob_t *top = NULL;
        int n_top = s->logprobs ? s->top_logprobs : 0;
        int32_t t;
        if (d->sim.on) {
            n_top = 0;
            const int E = bt_service_emit_vocab(&d->eng); /* (the ids text carries, as sampled) */
            t = bt_sim_token(s->sim_key, s->generated, E, d->eng.cfg->eos_id);
            for (int k = 0; k < s->n_stop_ids; k++) /* never a stop token: lengths stay as asked */
                if (t == s->stop_ids[k]) {
                    t = (t + 1) % E;
                    k = -1;
                }
        } else {
            t = d->draw_out[i].id;
            lp = d->draw_out[i].logprob;
            top = d->draw_out[i].top;
        }
        seq_emit(s, t, lp, top, n_top);
    }
    d->n_batch = 0;
    if (d->stopping) return;
    maybe_step(d);
}

static void maybe_step(decode_t *d)
{
    if (d->stepping || d->stopping) return;
    int n = 0;
    int64_t ctx_tokens = 0;
    for (seq_t *s = d->seqs; s && n < d->max_running; s = s->next) {
        if (s->state != SEQ_RUNNING || !s->call) continue;
        ctx_tokens += s->n_prompt + s->generated;
        d->batch[n] = s;
        d->fwd[n] =
            (bt_forward_seq_t){bt_kv_pool_slot(d->pool, s->slot), &s->next_token, 1, false, NULL};
        d->draw_req[n] = (bt_sample_req_t){
            .sampling = s->sampling,
            .step = (uint64_t)s->generated,
            .want_logprob = s->logprobs,
            .n_top = s->logprobs ? s->top_logprobs : 0,
            .adj_ids = s->pen.ids,
            .adj = s->pen.amount,
            .n_adj = s->pen.n,
            .allow = s->grammar && bt_grammar_active(s->grammar) ? s->allow : NULL};
        s->in_step = true;
        n++;
    }
    if (n == 0) return;
    d->n_batch = n;
    /* (a step of more sequences than speculation has rows for is a plain one) */
    d->spec_step = d->spec != NULL && bt_spec_proposals(d->spec, n) > 0;
    for (int i = 0; i < n && d->spec_step; i++) {
        seq_t *s = d->batch[i];
        uint8_t *slot = d->fwd[i].state;
        /* positions the slot has left, and tokens the request may still take */
        int64_t room = d->eng.layout.max_ctx - bt_kv_header(slot)->n_tokens,
                left = s->max_new - s->generated;
        d->spec_seqs[i] = (bt_spec_seq_t){.state = slot,
                                          .slot = s->slot,
                                          .last = s->next_token,
                                          .sampling = s->sampling,
                                          .step = (uint64_t)s->generated,
                                          .max_emit = (int)(room < left ? room : left),
                                          .pen = &s->pen,
                                          .grammar = s->grammar,
                                          .want_logprob = s->logprobs,
                                          .n_top = s->logprobs ? s->top_logprobs : 0};
        if (d->spec_seqs[i].max_emit < 1) d->spec_step = false;
    }
    d->sim_step_ms = bt_sim_step_ms(&d->sim, n, ctx_tokens);
    d->stepping = true;
    d->step_start_ms = bt_now_ms();
    d->work.data = d;
    uv_queue_work(d->loop, &d->work, step_work, step_done);
}

static void on_housekeeping_timer(uv_timer_t *t)
{
    decode_t *d = t->data;
    int64_t now = bt_now_ms();
    for (quarantine_t **q = &d->quarantine; *q;) {
        if ((*q)->until_ms > now) {
            q = &(*q)->next;
            continue;
        }
        quarantine_end(d, q);
    }
    admit_waiting(d);
    expire_waiting(d, now);
}

/* TP: while idle, a heartbeat through the group finds a dead rank before a request does */
static void on_tp_timer(uv_timer_t *t)
{
    decode_t *d = t->data;
    if (d->stepping || d->stopping) return;
    d->tp_noop = true;
    d->n_batch = 0;
    d->stepping = true;
    d->step_start_ms = bt_now_ms();
    d->work.data = d;
    uv_queue_work(d->loop, &d->work, step_work, step_done);
}

/* ---- the Decode service --------------------------------------------------------------------- */

static void on_cancel(void *ctx)
{
    seq_t *s = ctx;
    BT_LOG_INFO("request %s cancelled by the router", s->request_id);
    s->cancelled = true;
    if (s->call) {
        bt_rpc_call_finish(s->call, BT_RPC_CANCELLED, "cancelled");
        s->call = NULL;
    }
    s->state = SEQ_DONE;
    if (s->prefill_call && s->prefill_pending) bt_rpc_client_cancel(s->prefill_call);
    seq_release(s);
}

static void on_generate(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    decode_t *d = ctx;
    Baton__V1__DecodeRequest *r = BT_PROTO_UNPACK(baton__v1__decode_request, data, len);
    if (!r) {
        bt_rpc_call_finish(call, BT_RPC_INVALID_ARGUMENT, "unreadable DecodeRequest");
        return;
    }
    char msg[256];
    bt_rpc_code_t code = BT_RPC_OK;
    if (d->stopping || d->draining) { /* (the router finds it another place: see on_stop) */
        code = BT_RPC_RESOURCE_EXHAUSTED;
        snprintf(msg, sizeof msg, "decode group is leaving");
    } else if (r->n_prompt_ids == 0) {
        code = BT_RPC_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "empty prompt");
    } else if ((int64_t)r->n_prompt_ids >= d->eng.layout.max_ctx) {
        code = BT_RPC_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "prompt of %zu tokens leaves no room in the %lld-token context",
                 r->n_prompt_ids, (long long)d->eng.layout.max_ctx);
    } else if (!r->prefill_address || !*r->prefill_address) {
        code = BT_RPC_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "no prefill_address");
    }
    for (size_t i = 0; code == BT_RPC_OK && i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= d->eng.cfg->vocab) {
            code = BT_RPC_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "prompt token %d at %zu outside the vocabulary", r->prompt_ids[i], i);
        }
    const Baton__V1__SamplingParams *rsp = r->sampling;
    const size_t n_bias = rsp ? rsp->n_logit_bias : 0;
    if (code == BT_RPC_OK && rsp && rsp->n_logit_bias_ids != rsp->n_logit_bias) {
        code = BT_RPC_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "logit_bias: %zu ids for %zu biases", rsp->n_logit_bias_ids, rsp->n_logit_bias);
    }
    for (size_t i = 0; code == BT_RPC_OK && i < n_bias; i++)
        if (rsp->logit_bias_ids[i] < 0 || rsp->logit_bias_ids[i] >= bt_service_emit_vocab(&d->eng)) {
            code = BT_RPC_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "logit_bias token %d outside the vocabulary (0..%d)", rsp->logit_bias_ids[i],
                     bt_service_emit_vocab(&d->eng) - 1);
        }
    bt_grammar_t *grammar = NULL;
    if (code == BT_RPC_OK && bt_service_grammar(&d->eng, rsp, &grammar, msg, sizeof msg) != BT_OK)
        code = BT_RPC_INVALID_ARGUMENT;
    /* a place now, or one being freed (the router counted it free already: a stream it ended
     * whose request is still in the step in flight), or none */
    int slot = -1;
    bool wait = false;
    if (code == BT_RPC_OK && !(d->n_waiting == 0 && d->n_admitted < d->max_running &&
                               bt_kv_pool_alloc(d->pool, &slot) == BT_OK)) {
        wait = d->n_waiting < places_leaving(d);
        if (!wait) {
            code = BT_RPC_RESOURCE_EXHAUSTED;
            snprintf(msg, sizeof msg, "decode group full: %d running, KV slots %d/%d",
                     d->n_admitted, bt_kv_pool_used(d->pool), bt_kv_pool_capacity(d->pool));
        }
    }
    if (code != BT_RPC_OK) {
        bt_grammar_destroy(grammar);
        bt_rpc_call_finish(call, code, msg);
        BT_PROTO_FREE(baton__v1__decode_request, r);
        return;
    }
    seq_t *s = bt_calloc_or_die(1, sizeof *s);
    s->d = d;
    s->call = call;
    s->slot = slot;
    s->grammar = grammar;
    if (grammar) {
        snprintf(s->response_format, sizeof s->response_format, "%s", rsp->response_format);
        if (rsp->json_schema && *rsp->json_schema)
            s->json_schema = bt_strdup_or_die(rsp->json_schema);
        s->has_constrain_after = rsp->has_constrain_after;
        s->constrain_after_token = rsp->constrain_after_token;
        s->allow = bt_malloc_or_die((size_t)bt_grammar_mask_words(d->eng.grammar_vocab) *
                                    sizeof *s->allow);
    }
    s->arrival = ++d->arrivals;
    snprintf(s->request_id, sizeof s->request_id, "%s", r->request_id);
    s->epoch = r->epoch;
    s->n_prompt = (int)r->n_prompt_ids;
    s->prompt = bt_malloc_or_die((size_t)s->n_prompt * sizeof(int32_t));
    memcpy(s->prompt, r->prompt_ids, (size_t)s->n_prompt * sizeof(int32_t));
    for (size_t i = 0; i < r->n_cache_points && s->n_cache_points < 2; i++)
        s->cache_points[s->n_cache_points++] = r->cache_points[i];
    Baton__V1__SamplingParams *sp = r->sampling;
    s->sampling.temperature = sp ? sp->temperature : 0.0f;
    s->sampling.top_p = sp && sp->top_p > 0 ? sp->top_p : 1.0f;
    s->sampling.top_k = sp ? sp->top_k : 0;
    s->sampling.min_p = sp ? sp->min_p : 0.0f;
    s->sampling.seed = sp && sp->has_seed ? sp->seed : 0;
    bt_penalties_init(&s->pen, sp ? sp->presence_penalty : 0.0f, sp ? sp->frequency_penalty : 0.0f);
    if (n_bias) { /* kept for the prefill group's first draw too */
        s->n_bias = (int)n_bias;
        s->bias_ids = bt_malloc_or_die(n_bias * sizeof *s->bias_ids);
        s->bias = bt_malloc_or_die(n_bias * sizeof *s->bias);
        memcpy(s->bias_ids, sp->logit_bias_ids, n_bias * sizeof *s->bias_ids);
        memcpy(s->bias, sp->logit_bias, n_bias * sizeof *s->bias);
        for (size_t i = 0; i < n_bias; i++) bt_penalties_bias(&s->pen, sp->logit_bias_ids[i], sp->logit_bias[i]);
    }
    s->ignore_eos = sp ? sp->ignore_eos : false;
    s->logprobs = sp ? sp->logprobs : false;
    s->top_logprobs = sp && sp->top_logprobs > 0 ? (sp->top_logprobs < 20 ? sp->top_logprobs : 20) : 0;
    s->max_new = r->max_new_tokens > 0 ? r->max_new_tokens : 16;
    if (sp && sp->n_stop_token_ids) {
        s->n_stop_ids = (int)sp->n_stop_token_ids;
        s->stop_ids = bt_malloc_or_die(sp->n_stop_token_ids * sizeof(int32_t));
        memcpy(s->stop_ids, sp->stop_token_ids, sp->n_stop_token_ids * sizeof(int32_t));
    }
    if (d->sim.on) s->sim_key = bt_sim_key(s->prompt, (size_t)s->n_prompt, s->sampling.seed);
    s->t_admit = bt_now_ms();
    s->next = d->seqs;
    d->seqs = s;
    if (wait) {
        s->state = SEQ_WAITING;
        s->waiting = true;
        d->n_waiting++;
        BT_LOG_DEBUG("request %s waits for a place being freed", s->request_id);
    } else {
        s->state = SEQ_PREFILLING;
        d->n_admitted++;
        if (d->n_admitted > d->max_seen) d->max_seen = d->n_admitted;
    }
    bt_rpc_call_on_cancel(call, on_cancel, s);
    s->peer = peer_get(d, r->prefill_address);
    BT_PROTO_FREE(baton__v1__decode_request, r);
    if (!s->peer) {
        seq_fail(s, BT_RPC_UNAVAILABLE, "bad prefill address");
        return;
    }
    if (!wait) seq_begin_prefill(s);
}

static void fill_stats(decode_t *d, Baton__V1__StatsResponse *st)
{
    st->running = d->n_admitted;
    st->max_running_seen = d->max_seen;
    st->kv_slots_used = bt_kv_pool_used(d->pool);
    st->kv_slots_total = bt_kv_pool_capacity(d->pool);
    st->requests_done = d->requests_done;
}

static void on_stats(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    decode_t *d = ctx;
    Baton__V1__StatsResponse st = BATON__V1__STATS_RESPONSE__INIT;
    fill_stats(d, &st);
    bt_proto_reply(call, &st.base);
}

static void refresh_metrics(void *ctx)
{
    decode_t *d = ctx;
    int running = 0, prefilling = 0, waiting = 0;
    for (seq_t *s = d->seqs; s; s = s->next) {
        running += s->state == SEQ_RUNNING;
        prefilling += s->state == SEQ_PREFILLING;
        waiting += s->state == SEQ_WAITING;
    }
    bt_gauge_set(bt_metrics_gauge(d->metrics, "running_requests", "Admitted requests", "phase", "decoding"), running);
    bt_gauge_set(bt_metrics_gauge(d->metrics, "running_requests", "Admitted requests", "phase", "prefilling"), prefilling);
    bt_gauge_set(bt_metrics_gauge(d->metrics, "waiting_requests",
                                  "Requests waiting for a place being freed", NULL, NULL),
                 waiting);
    bt_gauge_set(bt_metrics_gauge(d->metrics, "max_running_seen", "Most admitted at once", NULL, NULL), d->max_seen);
    bt_gauge_set(bt_metrics_gauge(d->metrics, "kv_slots_used", "KV pool slots in use", NULL, NULL), bt_kv_pool_used(d->pool));
    bt_gauge_set(bt_metrics_gauge(d->metrics, "kv_slots_capacity", "KV pool slots", NULL, NULL), bt_kv_pool_capacity(d->pool));
    bt_xfer_stats_t xs;
    bt_xfer_stats(d->xfer, &xs);
    bt_gauge_set(bt_metrics_gauge(d->metrics, "kv_notices_received", "Transfer notices received (counter of the transfer layer)", NULL, NULL),
                 (double)xs.notices_received);
}

static void load_fn(void *ctx, Baton__V1__HeartbeatRequest *hb)
{
    decode_t *d = ctx;
    hb->running = d->n_admitted;
    hb->kv_slots_used = bt_kv_pool_used(d->pool);
    hb->kv_slots_total = bt_kv_pool_capacity(d->pool);
}

/* ---- startup and shutdown ------------------------------------------------------------------ */

static uint8_t *follower_slot(void *ctx, int i)
{
    return bt_kv_pool_slot(ctx, i);
}

static void on_server_down(void *ctx)
{
    decode_t *d = ctx;
    d->server = NULL;
    uv_stop(d->loop);
}

/* The drain ends: what still runs is handed back (no token out yet: the router starts it
 * elsewhere) or fails, and the server stops. */
static void stop_now(decode_t *d, const char *why)
{
    if (d->stopping) return;
    d->stopping = true;
    uv_timer_stop(&d->drain_timer);
    bt_registration_stop(d->reg);
    d->reg = NULL;
    for (seq_t *s = d->seqs; s;) {
        seq_t *next = s->next;
        if (s->call)
            seq_fail(s, s->generated == 0 ? BT_RPC_RESOURCE_EXHAUSTED : BT_RPC_UNAVAILABLE, why);
        s = next;
    }
    bt_rpc_server_shutdown(d->server, 1000, on_server_down, d);
}

/* Leaving, with no request streaming any more: stop. */
static void maybe_drained(decode_t *d)
{
    if (!d->left || d->stopping) return;
    for (const seq_t *s = d->seqs; s; s = s->next)
        if (s->call) return;
    BT_LOG_INFO("drained: every request finished");
    stop_now(d, "decode group stopped");
}

static void on_drain_timeout(uv_timer_t *t)
{
    stop_now(t->data,
             "decode group stopped: its --drain-timeout passed before this request finished");
}

/* The router knows we are leaving (or could not be told within a second): the requests still
 * waiting for a place here go back to it, and what runs gets --drain-timeout to finish. */
static void on_left(void *ctx)
{
    decode_t *d = ctx;
    for (seq_t *s = d->seqs; s;) {
        seq_t *next = s->next; /* failing a waiting request frees it alone */
        if (s->waiting && s->call)
            seq_fail(s, BT_RPC_RESOURCE_EXHAUSTED, "decode group is leaving");
        s = next;
    }
    d->left = true;
    if (d->stopping) return;
    int running = 0;
    for (const seq_t *s = d->seqs; s; s = s->next)
        running += s->call != NULL;
    BT_LOG_INFO("leaving: %d requests get up to %.1f s (--drain-timeout) to finish", running,
                (double)d->drain_ms / 1000.0);
    uv_timer_start(&d->drain_timer, on_drain_timeout, (uint64_t)d->drain_ms, 0);
    maybe_drained(d);
}

/* SIGTERM (a rolling restart, a scale-down): the router sends nothing new here once told, and
 * the requests running here finish. Before, every request failed at once (then: those with no
 * token yet were handed back), and one the router sent in the group's last seconds, before it
 * missed three heartbeats, was refused or failed too. */
static void on_stop(void *ctx)
{
    decode_t *d = ctx;
    if (d->draining || d->stopping) return;
    d->draining = true;
    bt_registration_leave(d->reg, on_left, d);
}

int main(int argc, char **argv)
{
    bt_log_set_tag("decode");
    signal(SIGPIPE, SIG_IGN); /* a peer that vanished must not kill the process */
    bt_worker_flags_t w = bt_worker_flags_default();
    int64_t max_running = 16, max_total = 0;
    double mem_fraction = 0.0;
    bt_sim_t sim = bt_sim_default();
    bt_flag_t spec[] = {
        BT_WORKER_FLAGS(&w),
        BT_FLAG_INT("max-running-requests", &max_running,
                    "requests in the batch (default 16; at most the KV pool's slots)"),
        BT_FLAG_INT("max-total-tokens", &max_total,
                    "KV pool size in tokens (default: running x context)"),
        BT_FLAG_FLOAT("mem-fraction-static", &mem_fraction,
                      "fraction of memory for weights and KV (caps the pool)"),
        BT_SIM_FLAGS(&sim),
    };
    char err[1024];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc - 1, argv + 1, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton-decode: %s\n", err);
        return 2;
    }
    if (!bt_worker_flags_check(&w, sim.on, err, sizeof err) || max_running < 1 || max_running > 1024) {
        fprintf(stderr, "baton-decode: %s\n", max_running < 1 || max_running > 1024 ? "--max-running-requests must be 1..1024" : err);
        return 2;
    }
    if (!bt_sim_valid(&sim, err, sizeof err)) {
        fprintf(stderr, "baton-decode: %s\n", err);
        return 2;
    }
    bt_log_set_level((bt_log_level_t)bt_log_level_parse(w.log_level));

    if (max_running > BT_MODEL_MAX_SEQS) {
        /* a step runs every running request in one forward, which takes at most this many
         * (above it every step failed); the group registers the cap, so the router queues */
        BT_LOG_WARN("a decode step runs at most %d sequences: running at most that many, not %lld",
                    BT_MODEL_MAX_SEQS, (long long)max_running);
        max_running = BT_MODEL_MAX_SEQS;
    }
    static decode_t dd;
    decode_t *d = &dd;
    d->loop = uv_default_loop();
    d->max_running = (int)max_running;
    d->watchdog_ms = (int64_t)(w.watchdog_s * 1000.0);
    d->drain_ms = (int64_t)(w.drain_s * 1000.0);
    d->sim = sim;
    if (w.tp > 1 && bt_tp_join("decode", (int)w.node_rank, (int)w.tp, w.dist_addr, (int)d->watchdog_ms, &d->comm) != BT_OK) return 1;
    bt_service_device_t dev = bt_worker_flags_device(&w, sim.on);
    /* a speculative step's forwards run a block of rows a sequence */
    int rows_per_seq = dev.draft ? BT_MAX_DRAFT_BLOCK + 1 : 1;
    if (sim.on)
        st = bt_service_engine_open_sim(w.model_path, w.served, w.context, &d->eng, err, sizeof err);
    else
        st = bt_service_engine_open_tp(w.model_path, w.served, w.context, (int)max_running,
                                       (int)max_running * rows_per_seq, (int)w.threads, d->comm,
                                       &dev, &d->eng, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "baton-decode: %s\n", err);
        return 1;
    }
    int64_t ctx_len = d->eng.layout.max_ctx;
    int64_t slots = max_total > 0 ? max_total / ctx_len : max_running;
    if (slots < 1) slots = 1;
    if (mem_fraction > 0.0 && mem_fraction <= 1.0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        double budget = mem_fraction * (double)pages * (double)page;
        int64_t fit = (int64_t)(budget / (double)d->eng.layout.slot_bytes);
        if (fit < slots) slots = fit > 0 ? fit : 1;
    }
    st = bt_kv_pool_create(&d->eng.layout, (int)slots, &d->pool);
    if (st != BT_OK) {
        fprintf(stderr, "baton-decode: cannot allocate the KV pool (%lld slots)\n", (long long)slots);
        return 1;
    }
    if (d->comm && w.node_rank > 0) {
        /* a following rank: no gRPC, no transfers; it runs what rank 0 plans */
        BT_LOG_INFO("rank %lld of %lld following rank 0 at %s", (long long)w.node_rank, (long long)w.tp, w.dist_addr);
        st = bt_tp_follow(d->comm, d->eng.model, &d->eng.layout, follower_slot, d->pool, (int)slots);
        if (st != BT_OK) BT_LOG_ERROR("the group failed (%s): leaving", bt_status_str(st));
        bt_comm_destroy(d->comm);
        return st == BT_OK ? 0 : 1;
    }
    BT_LOG_INFO("KV pool: %lld slots x %lld tokens = %.1f MiB", (long long)slots, (long long)ctx_len,
                (double)slots * (double)d->eng.layout.slot_bytes / 1048576.0);
    if (slots < d->max_running) {
        /* a request runs in a slot: fewer slots than --max-running-requests (from
         * --max-total-tokens or --mem-fraction-static) cap the group, as it registers with
         * the router (which else sent more and got them refused: 429s with its queue empty) */
        BT_LOG_WARN("the KV pool holds %lld requests: running at most that many, not %d",
                    (long long)slots, d->max_running);
        d->max_running = (int)slots;
    }
    d->batch = bt_calloc_or_die((size_t)max_running, sizeof *d->batch);
    d->fwd = bt_calloc_or_die((size_t)max_running, sizeof *d->fwd);
    d->draw_req = bt_calloc_or_die((size_t)max_running, sizeof *d->draw_req);
    if (dev.draft) {
        d->spec_seqs = bt_calloc_or_die((size_t)max_running, sizeof *d->spec_seqs);
        st = bt_spec_create(d->eng.model, (int)max_running, bt_service_emit_vocab(&d->eng),
                            dev.draft_block, &d->spec);
        if (st != BT_OK) {
            fprintf(stderr, "baton-decode: cannot set up DSpark for %lld running requests: %s\n",
                    (long long)max_running, bt_status_str(st));
            return 1;
        }
        bt_spec_set_confidence(d->spec, dev.draft_confidence);
        if (d->comm) {
            const bt_spec_group_t group = {d, spec_tp_draft, spec_tp_verify, spec_tp_rollback};
            bt_spec_set_group(d->spec, &group);
        }
        BT_LOG_INFO("DSpark speculative decoding: %d proposals a step",
                    dev.draft_block ? dev.draft_block : bt_model_draft_block(d->eng.model));
    }
    d->draw_out = bt_calloc_or_die((size_t)max_running, sizeof *d->draw_out);

    bt_xfer_options_t xo = {BT_XFER_UCX, w.ucx_tls, w.net_devices, 1000};
    if ((st = bt_xfer_create(d->loop, &xo, &d->xfer)) != BT_OK ||
        (st = bt_xfer_register(d->xfer, bt_kv_pool_slot(d->pool, 0),
                               (size_t)slots * d->eng.layout.slot_bytes, &d->region)) != BT_OK) {
        fprintf(stderr, "baton-decode: transfer layer: %s\n", bt_status_str(st));
        return 1;
    }
    bt_xfer_on_notice(d->xfer, on_notice, d);

    char addr[300];
    snprintf(addr, sizeof addr, "%s:%lld", w.host, (long long)w.port);
    if ((st = bt_rpc_create(d->loop, &d->rpc)) != BT_OK ||
        (st = bt_rpc_server_create(d->rpc, addr, NULL, &d->server)) != BT_OK ||
        (st = bt_rpc_server_method(d->server, "/baton.v1.Decode/Generate", BT_RPC_SERVER_STREAM,
                                   on_generate, d)) != BT_OK ||
        (st = bt_rpc_server_method(d->server, "/baton.v1.Decode/Stats", BT_RPC_UNARY, on_stats, d)) != BT_OK ||
        (st = bt_rpc_server_start(d->server)) != BT_OK) {
        fprintf(stderr, "baton-decode: cannot serve gRPC on %s: %s\n", addr, bt_status_str(st));
        return 1;
    }
    snprintf(d->address, sizeof d->address, "%s:%d", w.host, bt_rpc_server_port(d->server));
    d->metrics = bt_metrics_create("baton_decode");
    d->ttft = bt_metrics_histogram(d->metrics, "time_to_first_token_seconds", "Admission to first token",
                                   bt_metrics_latency_buckets, NULL, NULL);
    d->itl = bt_metrics_histogram(d->metrics, "inter_token_latency_seconds", "Time between tokens",
                                  bt_metrics_latency_buckets, NULL, NULL);
    d->step_time = bt_metrics_histogram(d->metrics, "step_seconds", "One batch step", bt_metrics_latency_buckets, NULL, NULL);
    d->handoff = bt_metrics_histogram(d->metrics, "kv_handoff_seconds", "Admission to KV in place (prefill + transfer)",
                                      bt_metrics_latency_buckets, NULL, NULL);
    refresh_metrics(d);
    if (bt_metrics_server_start(d->loop, w.host, (int)w.metrics_port, d->metrics, refresh_metrics, d, &d->metrics_server) != BT_OK) {
        fprintf(stderr, "baton-decode: cannot serve /metrics on %s:%lld\n", w.host, (long long)w.metrics_port);
        return 1;
    }
    printf("baton-decode metrics on %s:%d\n", w.host, bt_metrics_server_port(d->metrics_server));
    printf("baton-decode listening on %s\n", d->address);
    fflush(stdout);
    BT_LOG_INFO("listening on %s (max %d running; /metrics on %s:%d)", d->address, d->max_running,
                w.host, bt_metrics_server_port(d->metrics_server));
    if (w.router) {
        Baton__V1__WorkerInfo info = BATON__V1__WORKER_INFO__INIT;
        info.role = BATON__V1__WORKER_ROLE__ROLE_DECODE;
        info.address = d->address;
        info.model = d->eng.served_name;
        info.compat_hash = d->eng.compat_hash;
        info.tp = (int32_t)w.tp;
        info.max_running = d->max_running;
        info.context_length = ctx_len;
        info.vocab_size = d->eng.cfg->vocab;
        bt_registration_start(d->rpc, w.router, &info, load_fn, d, &d->reg);
    }
    bt_service_on_signal(d->loop, on_stop, d);
    uv_timer_init(d->loop, &d->tp_timer);
    d->tp_timer.data = d;
    uv_timer_init(d->loop, &d->drain_timer);
    d->drain_timer.data = d;
    uv_timer_init(d->loop, &d->housekeeping_timer);
    d->housekeeping_timer.data = d;
    uv_timer_start(&d->housekeeping_timer, on_housekeeping_timer, 250, 250);
    if (d->comm) uv_timer_start(&d->tp_timer, on_tp_timer, 1000, 1000);
    uv_run(d->loop, UV_RUN_DEFAULT);
    if (d->comm && !d->group_failed && !d->stepping) bt_tp_lead_shutdown(d->comm);
    BT_LOG_INFO("stopped");
    return 0;
}

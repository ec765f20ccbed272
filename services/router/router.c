/* baton-router: the model front end and traffic control. Serves the public Baton API over
 * gRPC; tokenizes and chat-encodes; admits at most --max-running-requests per decode group
 * with a bounded FIFO queue behind (RESOURCE_EXHAUSTED past it); picks the (prefill, decode)
 * pair; turns decode's token ids back into text, reasoning and tool calls; keeps the worker
 * registry (workers that miss heartbeats are removed and their requests end UNAVAILABLE). */
#include "common/alloc.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "common/text/chat.h"
#include "common/text/grammar.h"
#include "common/text/parsers.h"
#include "common/text/tokenizer.h"
#include "common/metrics.h"
#include "services/common/metrics_server.h"
#include "services/common/output.h"
#include "services/common/proto_util.h"
#include "services/common/service.h"
#include "services/engine/demo_model.h"
#include "services/engine/prefix_cache.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A request goes to another prefill group at most this many times after one dropped it. */
#define MAX_PREFILL_RETRIES 3

typedef struct router router_t;

typedef struct worker {
    struct worker *next;
    router_t *r;
    char id[64];
    Baton__V1__WorkerRole role;
    char address[256];
    char model[256];
    bt_rpc_channel_t *ch;
    int64_t last_seen_ms;
    int running;            /* requests the router has on it */
    int max_running;
    int64_t context_length;
    int64_t queued_prefill_tokens;
    int64_t prefill_tokens; /* prefill: what its requests from here still compute (estimated) */
    uint64_t serial;        /* this router's number for it, never reused */
    uint64_t compat_hash;
    /* decode: slots that hold no request (waiting out late writes), from its last heartbeat */
    int64_t slots_total, slots_held;
    /* not picked until then: a decode group that refused a request the router counted a
     * place for, a prefill group that failed one before its first token */
    int64_t refused_until_ms;
    int refusals; /* in a row: the rest doubles */
    bool leaving; /* stopping (its heartbeat said so): finishes what it has, gets nothing new */
} worker_t;

typedef enum { REQ_QUEUED, REQ_RUNNING, REQ_DONE } req_state_t;

typedef struct req {
    struct req *next;        /* all requests */
    struct req *qnext;       /* queue */
    router_t *r;
    bt_rpc_call_t *call;     /* the client's; NULL once finished */
    char id[96];
    uint64_t epoch;
    req_state_t state;
    int32_t *prompt;
    int n_prompt;
    int cached_tokens; /* of the prompt, found in the prefill group's prefix cache */
    /* chat: where its first and last user turns start, for the prefill group's cache */
    int32_t cache_points[2];
    int n_cache_points;
    Baton__V1__SamplingParams sampling; /* flat copy (stop strings, ids and biases kept apart) */
    int32_t *stop_ids;
    int n_stop_ids;
    int32_t *bias_ids;
    float *bias;
    int n_bias;
    int max_new;
    char response_format[16]; /* sampling.response_format, "" for none */
    char *json_schema;        /* and its schema (json_schema), NULL for none */
    int prefill_retries; /* attempts that failed on the prefill side before any token */
    worker_t *decode, *prefill;
    bt_rpc_client_call_t *dcall;
    bool dcall_live;
    bool in_prefill;         /* counted on q->prefill's running until the first token */
    int prefill_cost;        /* its tokens counted on q->prefill's prefill_tokens meanwhile */
    /* output */
    bt_output_t *out;
    int completion_tokens;
    Baton__V1__FinishReason finish;
    int64_t last_event_ms;
    int64_t t_start, t_first;
} req_t;

struct router {
    uv_loop_t *loop;
    bt_rpc_t *rpc;
    bt_rpc_server_t *server;
    bt_tokenizer_t *tok;
    char served[256];
    worker_t *workers;
    req_t *reqs;
    req_t *queue, *queue_tail;
    int n_queued;
    int max_running, max_queued, max_new_default;
    int64_t context_length;  /* router's own cap (0: from the workers) */
    int64_t watchdog_ms;
    int heartbeat_ms;
    bool reasoning_parser, tool_parser, stopping;
    /* signalled: takes no new request, finishes those it has within drain_ms, then stops */
    bool draining;
    int64_t drain_ms;
    uv_timer_t drain_timer;
    uint64_t next_worker, next_request, epoch_base;
    /* in every worker id: a worker that kept the id an earlier router gave it (its heartbeats
     * retried through the restart) is unknown here, and never mistaken for the worker this
     * router gave the same number */
    uint32_t lifetime;
    uv_timer_t sweep;
    uv_timer_t retry; /* dispatches again when a refusing decode group's rest ends */
    bt_metrics_t *metrics;
    bt_metrics_server_t *metrics_server;
    bt_histogram_t *ttft, *itl, *e2e;
    bt_counter_t *requeued;
    /* which prefill group was last sent each prompt prefix (see pick_prefill) */
    int32_t user_token; /* BT_CHAT_USER_TOKEN's id (-1: none): where a chat's turns start */
    struct prefix_seen {
        uint64_t key, worker, used;
    } * prefixes;
    uint64_t prefix_clock;
};

static void count_outcome(router_t *r, const char *outcome)
{
    bt_counter_add(bt_metrics_counter(r->metrics, "requests_total", "Requests ended, by outcome", "outcome", outcome), 1);
}

static void dispatch_queued(router_t *r);
static void stop_now(router_t *r, const char *why);

/* ---- request lifetime ----------------------------------------------------------------------- */

static void req_release(req_t *q)
{
    if (q->call || q->dcall_live) return;
    router_t *r = q->r;
    for (req_t **p = &r->reqs; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    bt_output_destroy(q->out);
    free(q->stop_ids);
    free(q->bias_ids);
    free(q->bias);
    free(q->prompt);
    free(q->json_schema);
    free(q);
}

/* Puts q in the queue: at its tail, or at its head (a request that was already its turn). */
static void queue_put(router_t *r, req_t *q, bool at_head)
{
    q->state = REQ_QUEUED;
    q->qnext = NULL;
    if (!r->queue) {
        r->queue = r->queue_tail = q;
    } else if (at_head) {
        q->qnext = r->queue;
        r->queue = q;
    } else {
        r->queue_tail->qnext = q;
        r->queue_tail = q;
    }
    r->n_queued++;
}

static void queue_remove(router_t *r, req_t *q)
{
    req_t *prev = NULL;
    for (req_t *x = r->queue; x; prev = x, x = x->qnext)
        if (x == q) {
            if (prev)
                prev->qnext = x->qnext;
            else
                r->queue = x->qnext;
            if (r->queue_tail == x) r->queue_tail = prev;
            r->n_queued--;
            return;
        }
}

static void leave_prefill(req_t *q)
{
    if (q->in_prefill && q->prefill) {
        q->prefill->running--;
        q->prefill->prefill_tokens -= q->prefill_cost;
    }
    q->in_prefill = false;
}

/* The request stops counting against its decode group. */
static void req_leave_decode(req_t *q)
{
    leave_prefill(q);
    if (q->state == REQ_RUNNING && q->decode) {
        q->decode->running--;
        q->decode = NULL;
    }
    if (q->state == REQ_QUEUED) queue_remove(q->r, q);
    q->state = REQ_DONE;
}

static void req_fail(req_t *q, bt_rpc_code_t code, const char *msg)
{
    router_t *r = q->r;
    req_leave_decode(q);
    if (q->call) {
        BT_LOG_WARN("request %s: %s: %s", q->id, bt_rpc_code_name(code), msg);
        count_outcome(r, bt_rpc_code_name(code));
        bt_rpc_call_finish(q->call, code, msg);
        q->call = NULL;
    }
    if (q->dcall_live) bt_rpc_client_cancel(q->dcall);
    req_release(q);
    dispatch_queued(r);
}

/* ---- output: the text pipeline lives in services/common/output.c ---------------------------- */

/* Sends one GenerateResponse with these token ids and the text they released; on `final`
 * (or when a stop string matched) with the finish reason and usage, then ends the call. */
static void send_response(req_t *q, const int32_t *ids, size_t n_ids,
                          Baton__V1__TokenLogprob **lps, size_t n_lps, bool final)
{
    if (!q->call) return;
    bt_output_delta_t d;
    bt_output_push(q->out, ids, n_ids, final, &d);
    bool stopped = d.stopped;
    if (stopped) final = true;
    Baton__V1__GenerateResponse resp = BATON__V1__GENERATE_RESPONSE__INIT;
    resp.n_token_ids = n_ids;
    resp.token_ids = (int32_t *)ids;
    resp.n_logprobs = n_lps;
    resp.logprobs = lps;
    resp.text = (char *)d.content;
    resp.reasoning_text = (char *)d.reasoning;
    /* every call this push released (a flush behind a long stop string can release many) */
    const int nc = d.n_calls;
    Baton__V1__ToolCall *calls = nc ? bt_calloc_or_die((size_t)nc, sizeof *calls) : NULL;
    Baton__V1__ToolCall **call_ptrs = nc ? bt_calloc_or_die((size_t)nc, sizeof *call_ptrs) : NULL;
    for (int i = 0; i < nc; i++) {
        baton__v1__tool_call__init(&calls[i]);
        calls[i].index = d.calls[i].index;
        calls[i].id = (char *)d.calls[i].id;
        calls[i].name = (char *)d.calls[i].name;
        calls[i].arguments = (char *)d.calls[i].arguments;
        call_ptrs[i] = &calls[i];
    }
    resp.n_tool_calls = (size_t)nc;
    resp.tool_calls = call_ptrs;
    Baton__V1__Usage usage = BATON__V1__USAGE__INIT;
    if (final) {
        Baton__V1__FinishReason fr = stopped ? BATON__V1__FINISH_REASON__FINISH_STOP : q->finish;
        if (fr == BATON__V1__FINISH_REASON__FINISH_NONE) fr = BATON__V1__FINISH_REASON__FINISH_STOP;
        if (fr == BATON__V1__FINISH_REASON__FINISH_STOP && d.total_tool_calls > 0)
            fr = BATON__V1__FINISH_REASON__FINISH_TOOL_CALLS;
        resp.finish_reason = fr;
        usage.prompt_tokens = q->n_prompt;
        usage.completion_tokens = q->completion_tokens;
        usage.cached_tokens = q->cached_tokens;
        resp.usage = &usage;
        resp.matched_stop = (char *)d.matched_stop;
    }
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&resp.base, &buf, &len);
    bt_rpc_call_send(q->call, buf, len, NULL, NULL);
    free(buf);
    free(calls);
    free(call_ptrs);
    if (final) {
        bt_rpc_call_finish(q->call, BT_RPC_OK, NULL);
        q->call = NULL;
        router_t *r = q->r;
        count_outcome(r, resp.finish_reason == BATON__V1__FINISH_REASON__FINISH_LENGTH ? "length"
                         : resp.finish_reason == BATON__V1__FINISH_REASON__FINISH_TOOL_CALLS ? "tool_calls" : "stop");
        bt_histogram_observe(r->e2e, (double)(bt_now_ms() - q->t_start) / 1000.0);
        req_leave_decode(q);
        if (q->dcall_live) bt_rpc_client_cancel(q->dcall); /* a stop string ended it early */
        req_release(q);
        dispatch_queued(r);
    }
}

/* ---- the decode stream ------------------------------------------------------------------ */

static void on_decode_event(void *ctx, const uint8_t *data, size_t len)
{
    req_t *q = ctx;
    int64_t now = bt_now_ms();
    if (!q->t_first) { /* both groups did their part */
        if (q->decode) q->decode->refusals = 0;
        if (q->in_prefill && q->prefill) q->prefill->refusals = 0;
    }
    if (q->call && !q->t_first) {
        q->t_first = now;
        bt_histogram_observe(q->r->ttft, (double)(now - q->t_start) / 1000.0);
    } else if (q->call) {
        bt_histogram_observe(q->r->itl, (double)(now - q->last_event_ms) / 1000.0);
    }
    q->last_event_ms = now;
    leave_prefill(q); /* the first token means prefill is over */
    if (!q->call) return;
    Baton__V1__DecodeEvent *ev = BT_PROTO_UNPACK(baton__v1__decode_event, data, len);
    if (!ev) {
        req_fail(q, BT_RPC_INTERNAL, "unreadable event from the decode group");
        return;
    }
    q->completion_tokens += (int)ev->n_token_ids;
    q->cached_tokens = ev->cached_tokens;
    bool final = ev->finish_reason != BATON__V1__FINISH_REASON__FINISH_NONE;
    if (final) q->finish = ev->finish_reason;
    /* logprob entries carry the token's text for OpenAI clients */
    for (size_t i = 0; i < ev->n_logprobs; i++) {
        Baton__V1__TokenLogprob *lp = ev->logprobs[i];
        const char *t = bt_tokenizer_id_to_token(q->r->tok, lp->token_id);
        char *txt = NULL;
        size_t tl;
        if (t && bt_tokenizer_decode(q->r->tok, &lp->token_id, 1, false, &txt, &tl) == BT_OK) {
            if (lp->text != protobuf_c_empty_string) free(lp->text);
            lp->text = txt;
        }
        for (size_t k = 0; k < lp->n_top; k++) {
            if (bt_tokenizer_decode(q->r->tok, &lp->top[k]->token_id, 1, false, &txt, &tl) == BT_OK) {
                if (lp->top[k]->text != protobuf_c_empty_string) free(lp->top[k]->text);
                lp->top[k]->text = txt;
            }
        }
    }
    send_response(q, ev->token_ids, ev->n_token_ids, ev->logprobs, ev->n_logprobs, final);
    BT_PROTO_FREE(baton__v1__decode_event, ev);
}

/* An attempt that ended before any token, in a way another attempt may not (the groups
 * chosen, not the request, were the trouble), goes back to the head of the queue with a new
 * epoch. `rested`, when set, is the group to blame: it is not picked for a rest of 10 ms,
 * doubling to 640 ms while it keeps failing so; --watchdog-timeout bounds the waiting.
 *   - a decode group that refused a request the router had counted a place for: the place is
 *     still held there (a request the router saw end is still in the group's step in flight
 *     past the group's own wait, or a slot waits out late KV writes). Before, the client got
 *     the refusal (a 429 at the gateway) with the router's queue empty.
 *   - a prefill group that dropped the job (stopping, or gone mid-job): at most
 *     MAX_PREFILL_RETRIES times, as a request that breaks prefill groups must not go round.
 *   - a leaving decode group that failed a request it took as it left (no rest: it is not
 *     picked anyway). */
static void requeue(req_t *q, worker_t *rested, const char *what, const char *msg)
{
    router_t *r = q->r;
    if (bt_now_ms() - q->t_start > r->watchdog_ms) { /* (the sweep may only see it running) */
        char m[512];
        snprintf(m, sizeof m,
                 "no place for it within --watchdog-timeout; the last attempt, on decode group "
                 "%s: %s: %s",
                 q->decode->address, what, msg ? msg : "refused");
        req_fail(q, BT_RPC_RESOURCE_EXHAUSTED, m);
        return;
    }
    int64_t rest_ms = 0;
    if (rested) {
        rest_ms = (int64_t)10 << (rested->refusals < 6 ? rested->refusals : 6);
        rested->refusals++;
        rested->refused_until_ms = bt_now_ms() + rest_ms;
    }
    if (rested)
        BT_LOG_INFO("request %s: %s (%s); queued again, %s rests %lld ms", q->id, what,
                    msg ? msg : "refused", rested->address, (long long)rest_ms);
    else
        BT_LOG_INFO("request %s: %s (%s); queued again", q->id, what, msg ? msg : "refused");
    bt_counter_add(r->requeued, 1);
    leave_prefill(q);
    q->decode->running--;
    q->decode = NULL;
    q->prefill = NULL;
    /* a new epoch: should the failed attempt have got further than its status said (one the
     * transport made), notices about it never reach the next one */
    q->epoch = r->epoch_base + ++r->next_request;
    queue_put(r, q, true);
    dispatch_queued(r);
}

/* Whether an attempt that ended with code and no token yet goes back to the queue, and whom
 * it rests (*rested, may be NULL); counts the retries a prefill group's drop costs. */
static bool requeue_after(req_t *q, bt_rpc_code_t code, worker_t **rested, const char **what)
{
    if (!q->call || q->state != REQ_RUNNING || !q->decode || q->t_first || q->r->stopping)
        return false;
    *rested = NULL;
    if (code == BT_RPC_RESOURCE_EXHAUSTED) {
        *rested = q->decode->leaving ? NULL : q->decode;
        *what = "its decode group refused it";
        return true;
    }
    if (code == BT_RPC_ABORTED && q->prefill_retries < MAX_PREFILL_RETRIES) {
        *rested = q->in_prefill ? q->prefill : NULL;
        *what = "its prefill group dropped it";
        /* (a leaving group handing its queued jobs back is no failure: it is not picked
         * again, so this stays bounded) */
        if (!(*rested && (*rested)->leaving)) q->prefill_retries++;
        return true;
    }
    if (code == BT_RPC_UNAVAILABLE && q->decode->leaving) {
        *what = "its decode group left";
        return true;
    }
    return false;
}

static void on_decode_done(void *ctx, bt_rpc_code_t code, const char *msg)
{
    req_t *q = ctx;
    q->dcall_live = false;
    q->dcall = NULL;
    worker_t *rested;
    const char *what;
    if (requeue_after(q, code, &rested, &what)) {
        requeue(q, rested, what, msg);
        return;
    }
    if (q->call) {
        char m[512];
        if (code == BT_RPC_OK) {
            /* the stream ended without a final event: treat as done */
            send_response(q, NULL, 0, NULL, 0, true);
            return;
        }
        snprintf(m, sizeof m, "decode group %s: %s", q->decode ? q->decode->address : "?",
                 msg ? msg : bt_rpc_code_name(code));
        /* (ABORTED: its prefill groups dropped it, MAX_PREFILL_RETRIES times) */
        req_fail(q, code == BT_RPC_CANCELLED || code == BT_RPC_ABORTED ? BT_RPC_UNAVAILABLE : code,
                 m);
        return;
    }
    req_release(q);
}

/* The requests the router runs at once on decode group w: the least of its own cap, the
 * group's (its KV pool may hold fewer), and the slots its last heartbeat left free of
 * quarantines (a slot whose prefill group went away waits out the watchdog: counted as a
 * place, it drew requests the group could only refuse, every 2 s until the watchdog). */
static int places(const router_t *r, const worker_t *w)
{
    int64_t n =
        w->max_running > 0 && w->max_running < r->max_running ? w->max_running : r->max_running;
    if (w->slots_total > 0 && w->slots_total - w->slots_held < n)
        n = w->slots_total - w->slots_held;
    return n > 0 ? (int)n : 0;
}

static worker_t *pick(router_t *r, Baton__V1__WorkerRole role, bool need_room)
{
    worker_t *best = NULL;
    const int64_t now = bt_now_ms();
    for (worker_t *w = r->workers; w; w = w->next) {
        if (w->role != role || w->leaving || w->refused_until_ms > now) continue;
        if (need_room) {
            if (w->running >= places(r, w)) continue;
            if (!best || w->running < best->running) best = w;
        } else if (!best || w->running < best->running ||
                   (w->running == best->running && w->queued_prefill_tokens < best->queued_prefill_tokens)) {
            /* prefill: fewest requests this router has in prefill on it (live), then the
             * queued tokens it last reported (up to a heartbeat old) */
            best = w;
        }
    }
    return best;
}

/* The message for a request that cannot start for want of a group, or NULL when a decode
 * and a prefill group are registered (leaving ones count: a replacement may come meanwhile). */
/* The registered groups, counted (leaving ones among them), and what decode groups run. */
typedef struct {
    int decode, prefill, leaving, running;
} census_t;

static census_t census(const router_t *r)
{
    census_t n = {0, 0, 0, 0};
    for (const worker_t *w = r->workers; w; w = w->next) {
        if (w->role == BATON__V1__WORKER_ROLE__ROLE_DECODE) {
            n.decode++;
            n.running += w->running;
        } else {
            n.prefill++;
        }
        n.leaving += w->leaving;
    }
    return n;
}

static const char *missing_group(const router_t *r)
{
    const census_t n = census(r);
    return !n.decode    ? "no decode group is registered"
           : !n.prefill ? "no prefill group is registered"
                        : NULL;
}

/* Prefix affinity. A prefill group keeps the states of the prompts it prefilled at multiples
 * of PREFIX_BLOCK tokens and at its cache points (services/prefill/prefill.c), so a prompt that
 * shares a beginning with an earlier one prefills less where that one went. The router remembers,
 * for each prefix of a multiple of PREFIX_BLOCK tokens (or ending at a cache point) it sent, the
 * group it went to, in a table of PREFIX_SLOTS keyed by a hash of the prefix (the oldest of
 * PREFIX_PROBE neighbours gives way). It sends a prompt to the group that got its longest
 * remembered prefix unless that group's work ahead plus what the prompt would still compute there
 * exceeds the least busy group's work ahead plus the whole prompt. What a group's cache really
 * holds may differ (evicted, restarted): the cost is only a less useful choice. */
enum { PREFIX_BLOCK = BT_PREFIX_CACHE_BLOCK, PREFIX_SLOTS = 1 << 16, PREFIX_PROBE = 8 };

/* the key of ids[0 .. n) given h, the running hash of those ids (never 0: 0 is empty) */
static uint64_t prefix_key(uint64_t h, int n)
{
    h ^= (uint64_t)n * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h | 1;
}

static uint64_t prefix_hash_step(uint64_t h, int32_t id)
{
    return (h ^ (uint32_t)id) * 0x100000001b3ull;
}

static struct prefix_seen *prefix_find(router_t *r, uint64_t key)
{
    for (int i = 0; i < PREFIX_PROBE; i++) {
        struct prefix_seen *e = &r->prefixes[(key + (uint64_t)i) & (PREFIX_SLOTS - 1)];
        if (e->key == key) return e;
    }
    return NULL;
}

static void prefix_put(router_t *r, uint64_t key, uint64_t worker)
{
    struct prefix_seen *e = prefix_find(r, key);
    for (int i = 0; !e && i < PREFIX_PROBE; i++) { /* an empty slot, else the oldest */
        struct prefix_seen *x = &r->prefixes[(key + (uint64_t)i) & (PREFIX_SLOTS - 1)];
        if (!e || !x->key || (e->key && x->used < e->used)) e = x;
    }
    e->key = key;
    e->worker = worker;
    e->used = ++r->prefix_clock;
}

/* Whether the prefill group may keep the state after q's first len tokens: at multiples of
 * PREFIX_BLOCK and at q's cache points. */
static bool prefix_boundary(const req_t *q, int len)
{
    if (len % PREFIX_BLOCK == 0) return true;
    for (int i = 0; i < q->n_cache_points; i++)
        if (q->cache_points[i] == len) return true;
    return false;
}

/* The prefill group for q (NULL: none can take it), and q->prefill_cost: the prompt's tokens
 * it is expected to compute there. */
static worker_t *pick_prefill(router_t *r, req_t *q)
{
    worker_t *base = pick(r, BATON__V1__WORKER_ROLE__ROLE_PREFILL, false);
    if (!base) return NULL;
    const int n = q->n_prompt, last = n - 1; /* (a prompt's last token is always computed) */
    /* the keys of the prompt's prefixes that end at a boundary, hashed once */
    uint64_t *keys = bt_malloc_or_die(((size_t)last / PREFIX_BLOCK + 3) * sizeof *keys);
    int *lens = bt_malloc_or_die(((size_t)last / PREFIX_BLOCK + 3) * sizeof *lens);
    int n_keys = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < last; i++) {
        h = prefix_hash_step(h, q->prompt[i]);
        if (prefix_boundary(q, i + 1)) {
            keys[n_keys] = prefix_key(h, i + 1);
            lens[n_keys++] = i + 1;
        }
    }
    /* the longest remembered prefix whose group can take it now */
    worker_t *held = NULL;
    int held_len = 0;
    const int64_t now = bt_now_ms();
    for (int k = 0; k < n_keys; k++) {
        const struct prefix_seen *e = prefix_find(r, keys[k]);
        if (!e) continue;
        for (worker_t *w = r->workers; w; w = w->next)
            if (w->serial == e->worker && w->role == BATON__V1__WORKER_ROLE__ROLE_PREFILL &&
                !w->leaving && w->refused_until_ms <= now) {
                held = w;
                held_len = lens[k];
            }
    }
    worker_t *p = base;
    q->prefill_cost = n;
    if (held == base) {
        q->prefill_cost = n - held_len;
    } else if (held && held->prefill_tokens + (n - held_len) <= base->prefill_tokens + n) {
        p = held;
        q->prefill_cost = n - held_len;
        bt_counter_add(bt_metrics_counter(r->metrics, "prefix_routed_total",
                                          "Requests sent to the prefill group that got their "
                                          "longest prefix, not the least busy one",
                                          NULL, NULL),
                       1);
    }
    /* remember where this prompt's prefixes go */
    for (int k = 0; k < n_keys; k++)
        prefix_put(r, keys[k], p->serial);
    free(keys);
    free(lens);
    return p;
}

static bool start_request(req_t *q)
{
    router_t *r = q->r;
    worker_t *d = pick(r, BATON__V1__WORKER_ROLE__ROLE_DECODE, true);
    worker_t *p = d ? pick_prefill(r, q) : NULL;
    if (!d || !p) return false;
    q->decode = d;
    q->prefill = p;
    d->running++;
    p->running++; /* counts toward the prefill choice until the first token arrives */
    p->prefill_tokens += q->prefill_cost;
    q->in_prefill = true;
    q->state = REQ_RUNNING;
    Baton__V1__DecodeRequest dr = BATON__V1__DECODE_REQUEST__INIT;
    dr.request_id = q->id;
    dr.epoch = q->epoch;
    dr.n_prompt_ids = (size_t)q->n_prompt;
    dr.prompt_ids = q->prompt;
    Baton__V1__SamplingParams sp = q->sampling;
    sp.n_stop = 0;
    sp.stop = NULL;
    sp.n_stop_token_ids = (size_t)q->n_stop_ids;
    sp.stop_token_ids = q->stop_ids;
    sp.n_logit_bias_ids = sp.n_logit_bias = (size_t)q->n_bias;
    sp.logit_bias_ids = q->bias_ids;
    sp.logit_bias = q->bias;
    sp.response_format = q->response_format;
    sp.json_schema = q->json_schema;
    dr.sampling = &sp;
    dr.prefill_address = p->address;
    dr.n_cache_points = (size_t)q->n_cache_points;
    dr.cache_points = q->cache_points;
    dr.max_new_tokens = q->max_new;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&dr.base, &buf, &len);
    q->last_event_ms = bt_now_ms();
    bt_status_t st = bt_rpc_stream(d->ch, "/baton.v1.Decode/Generate", buf, len, 0, on_decode_event,
                                   on_decode_done, q, &q->dcall);
    free(buf);
    if (st != BT_OK) {
        req_fail(q, BT_RPC_UNAVAILABLE, "cannot call the decode group");
        return true;
    }
    q->dcall_live = true;
    return true;
}

static void on_retry(uv_timer_t *t)
{
    dispatch_queued(t->data);
}

/* No decode group with room, or no prefill group, can be picked: when one is resting after
 * a refusal or a failure, come back as its rest ends. */
static void retry_after_rest(router_t *r)
{
    if (r->stopping) return;
    const int64_t now = bt_now_ms();
    int64_t due = -1;
    for (worker_t *w = r->workers; w; w = w->next) {
        if (w->leaving || w->refused_until_ms <= now) continue;
        if (w->role == BATON__V1__WORKER_ROLE__ROLE_DECODE && w->running >= places(r, w)) continue;
        if (due < 0 || w->refused_until_ms < due) due = w->refused_until_ms;
    }
    if (due >= 0) uv_timer_start(&r->retry, on_retry, (uint64_t)(due - now) + 1, 0);
}

/* The requests whose clients still wait for an answer. */
static int in_flight(const router_t *r)
{
    int n = 0;
    for (const req_t *q = r->reqs; q; q = q->next)
        n += q->call != NULL;
    return n;
}

static void dispatch_queued(router_t *r)
{
    if (r->stopping) return; /* (stop_now fails what is queued) */
    if (r->draining && !in_flight(r)) {
        stop_now(r, NULL);
        return;
    }
    while (r->queue) {
        req_t *q = r->queue;
        if (!pick(r, BATON__V1__WORKER_ROLE__ROLE_DECODE, true)) {
            retry_after_rest(r);
            return;
        }
        if (!pick(r, BATON__V1__WORKER_ROLE__ROLE_PREFILL, false)) {
            retry_after_rest(r);
            return;
        }
        queue_remove(r, q);
        q->state = REQ_RUNNING;
        start_request(q);
    }
}

/* ---- the public API ------------------------------------------------------------------------ */

static void on_client_cancel(void *ctx)
{
    req_t *q = ctx;
    BT_LOG_INFO("request %s: client went away", q->id);
    router_t *r = q->r;
    if (q->call) {
        bt_rpc_call_finish(q->call, BT_RPC_CANCELLED, "cancelled");
        q->call = NULL;
    }
    req_leave_decode(q);
    if (q->dcall_live) bt_rpc_client_cancel(q->dcall);
    req_release(q);
    dispatch_queued(r);
}

static int64_t context_limit(router_t *r)
{
    int64_t lim = r->context_length;
    for (worker_t *w = r->workers; w; w = w->next)
        if (w->context_length > 0 && (lim == 0 || w->context_length < lim)) lim = w->context_length;
    return lim;
}

/* The tool-call grammar's spec (common/text/grammar.h) for tool_choice "required" (any of the
 * tools, one call or more) or {"type": "function", "function": {"name": N}} (N, once) into
 * *spec_p (malloc'd); NULL for "auto", "none" or no tool_choice. */
static bt_status_t tool_spec_for(const cJSON *req, const cJSON *tc, char **spec_p, char *msg,
                                 size_t msglen)
{
    *spec_p = NULL;
    const char *named = NULL;
    if (cJSON_IsObject(tc)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name)) {
            snprintf(msg, msglen,
                     "tool_choice: an object must name a function ({\"type\": "
                     "\"function\", \"function\": {\"name\": ...}})");
            return BT_ERR_INVALID_ARG;
        }
        named = name->valuestring;
    } else if (!cJSON_IsString(tc) || strcmp(tc->valuestring, "required") != 0) {
        return BT_OK;
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools"), *t;
    cJSON *spec = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(spec, "tools");
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name) || (named && strcmp(name->valuestring, named) != 0)) continue;
        cJSON *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "name", name->valuestring);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (ps) cJSON_AddItemToObject(one, "parameters", cJSON_Duplicate(ps, true));
        cJSON_AddItemToArray(list, one);
    }
    if (named) cJSON_AddTrueToObject(spec, "one");
    bt_status_t st = BT_OK;
    if (cJSON_GetArraySize(list) == 0) {
        if (named)
            snprintf(msg, msglen, "tool_choice: '%.64s' is not among the tools", named);
        else
            snprintf(msg, msglen, "tool_choice: \"required\" needs tools");
        st = BT_ERR_INVALID_ARG;
    } else {
        *spec_p = cJSON_PrintUnformatted(spec);
        char err[300];
        if (bt_grammar_tool_calls_check(*spec_p, strlen(*spec_p), err, sizeof err) != BT_OK) {
            snprintf(msg, msglen, "tool_choice: %s", err);
            free(*spec_p);
            *spec_p = NULL;
            st = BT_ERR_INVALID_ARG;
        }
    }
    cJSON_Delete(spec);
    return st;
}

/* Validates and encodes the prompt; returns a gRPC code and fills msg on error. */
static bt_rpc_code_t prepare(router_t *r, req_t *q, const Baton__V1__GenerateRequest *g, char *msg,
                             size_t msglen)
{
    bt_status_t st;
    bool chat = false, thinking = false, tools = false;
    size_t n = 0;
    switch (g->prompt_case) {
    case BATON__V1__GENERATE_REQUEST__PROMPT_TEXT:
        st = bt_tokenizer_encode(r->tok, g->text, strlen(g->text), 0, &q->prompt, &n);
        if (st != BT_OK) {
            snprintf(msg, msglen, "prompt: cannot tokenize");
            return BT_RPC_INVALID_ARGUMENT;
        }
        break;
    case BATON__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS:
        n = g->token_ids ? g->token_ids->n_ids : 0;
        q->prompt = bt_malloc_or_die((n ? n : 1) * sizeof(int32_t));
        for (size_t i = 0; i < n; i++) {
            int32_t id = g->token_ids->ids[i];
            if (id < 0 || id >= bt_tokenizer_vocab_size(r->tok)) {
                snprintf(msg, msglen, "prompt.token_ids[%zu] = %d is outside the vocabulary (0..%d)", i,
                         id, bt_tokenizer_vocab_size(r->tok) - 1);
                return BT_RPC_INVALID_ARGUMENT;
            }
            q->prompt[i] = id;
        }
        break;
    case BATON__V1__GENERATE_REQUEST__PROMPT_CHAT_JSON: {
        cJSON *req = bt_chat_parse_request(g->chat_json, strlen(g->chat_json));
        if (!req) {
            snprintf(msg, msglen, "chat_json: invalid JSON");
            return BT_RPC_INVALID_ARGUMENT;
        }
        /* tool_choice "none": the tools leave the prompt, as SGLang serves it (the reasoning
         * parser stays; turning every parser off let </think> and DSML out as content) */
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none"))
            cJSON_DeleteItemFromObjectCaseSensitive(req, "tools");
        /* tool_choice "required" or a named function: decoded under the tool-call grammar */
        if (tool_spec_for(req, tc, &q->json_schema, msg, msglen) != BT_OK) {
            cJSON_Delete(req);
            return BT_RPC_INVALID_ARGUMENT;
        }
        char err[256];
        st = bt_chat_encode(r->tok, req, &q->prompt, &n, err, sizeof err);
        if (st != BT_OK) {
            snprintf(msg, msglen, "%s", err);
            cJSON_Delete(req);
            return BT_RPC_INVALID_ARGUMENT;
        }
        chat = true;
        /* what precedes the first user turn (the system prompt, the tools) and the last one
         * (the conversation so far) is what other requests share */
        /* (a point costs the prefill one more forward: worth it a block in at least) */
        int first = -1, last = -1;
        for (size_t i = 1; r->user_token >= 0 && i + 1 < n; i++)
            if (q->prompt[i] == r->user_token) {
                if (first < 0) first = (int)i;
                last = (int)i;
            }
        if (first >= BT_PREFIX_CACHE_BLOCK) q->cache_points[q->n_cache_points++] = first;
        if (last > first && last >= BT_PREFIX_CACHE_BLOCK)
            q->cache_points[q->n_cache_points++] = last;
        /* the encoder's own rule: the reasoning parser expects </think> exactly when the
         * prompt ends in <think> (the router's copy of the rule read other fields) */
        bt_chat_thinking(req, &thinking, NULL, 0);
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(req, "tools");
        tools = cJSON_IsArray(tl) && cJSON_GetArraySize(tl) > 0;
        cJSON_Delete(req);
        break;
    }
    default:
        snprintf(msg, msglen, "prompt: one of text, token_ids or chat_json is required");
        return BT_RPC_INVALID_ARGUMENT;
    }
    q->n_prompt = (int)n;
    if (n == 0) {
        snprintf(msg, msglen, "prompt: empty");
        return BT_RPC_INVALID_ARGUMENT;
    }
    int64_t ctx = context_limit(r);
    if (ctx > 0 && (int64_t)n >= ctx) {
        snprintf(msg, msglen, "prompt: %zu tokens leave no room in the %lld-token context", n, (long long)ctx);
        return BT_RPC_INVALID_ARGUMENT;
    }
    /* sampling */
    Baton__V1__SamplingParams def = BATON__V1__SAMPLING_PARAMS__INIT;
    const Baton__V1__SamplingParams *sp = g->sampling ? g->sampling : &def;
    if (!(sp->temperature >= 0.0f && sp->temperature <= 100.0f)) {
        snprintf(msg, msglen, "sampling.temperature must be in [0, 100]");
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (!(sp->top_p >= 0.0f && sp->top_p <= 1.0f)) {
        snprintf(msg, msglen, "sampling.top_p must be in (0, 1]");
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (!(sp->min_p >= 0.0f && sp->min_p <= 1.0f)) {
        snprintf(msg, msglen, "sampling.min_p must be in [0, 1]");
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (sp->max_tokens < 0) {
        snprintf(msg, msglen, "sampling.max_tokens must not be negative");
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (sp->top_logprobs < 0 || sp->top_logprobs > 20) {
        snprintf(msg, msglen, "sampling.top_logprobs must be in [0, 20]");
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (!(sp->presence_penalty >= -2.0f && sp->presence_penalty <= 2.0f) ||
        !(sp->frequency_penalty >= -2.0f && sp->frequency_penalty <= 2.0f)) {
        snprintf(msg, msglen, "sampling.presence_penalty and frequency_penalty must be in [-2, 2]");
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (sp->n_logit_bias_ids != sp->n_logit_bias || sp->n_logit_bias > 1024) {
        snprintf(msg, msglen, "sampling.logit_bias: %zu ids for %zu biases (at most 1024 of each)",
                 sp->n_logit_bias_ids, sp->n_logit_bias);
        return BT_RPC_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < sp->n_logit_bias; i++) {
        if (sp->logit_bias_ids[i] < 0 || !(sp->logit_bias[i] >= -100.0f && sp->logit_bias[i] <= 100.0f)) {
            snprintf(msg, msglen, "sampling.logit_bias: token %d with bias %g (ids >= 0, biases in [-100, 100])",
                     sp->logit_bias_ids[i], (double)sp->logit_bias[i]);
            return BT_RPC_INVALID_ARGUMENT;
        }
        for (size_t j = 0; j < i; j++)
            if (sp->logit_bias_ids[j] == sp->logit_bias_ids[i]) {
                snprintf(msg, msglen, "sampling.logit_bias: token %d given twice", sp->logit_bias_ids[i]);
                return BT_RPC_INVALID_ARGUMENT;
            }
    }
    const char *rf = sp->response_format ? sp->response_format : "";
    const char *js = sp->json_schema ? sp->json_schema : "";
    if (q->json_schema && *rf) { /* (tool_choice made one) */
        snprintf(msg, msglen,
                 "tool_choice \"required\" or a named function and a response_format (or "
                 "regex) cannot be asked together");
        return BT_RPC_INVALID_ARGUMENT;
    }
    char err[300];
    if (bt_grammar_request_check(rf, js, err, sizeof err) != BT_OK) {
        if (!strcmp(rf, "regex")) /* (its messages say "regex: ...") */
            snprintf(msg, msglen, "%s", err);
        else
            snprintf(msg, msglen, "response_format: %s", err);
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (*js) q->json_schema = bt_strdup_or_die(js);
    if (q->json_schema && !*rf) rf = "tool_calls";
    q->sampling = *sp;
    snprintf(q->response_format, sizeof q->response_format, "%s", rf);
    q->sampling.response_format = NULL; /* (the request is freed: start_request sets the copies) */
    q->sampling.json_schema = NULL;
    if (sp->has_constrain_after && (sp->constrain_after_token < 0 ||
                                    sp->constrain_after_token >= bt_tokenizer_vocab_size(r->tok))) {
        snprintf(msg, msglen, "sampling.constrain_after_token %d is outside the vocabulary (0..%d)",
                 sp->constrain_after_token, bt_tokenizer_vocab_size(r->tok) - 1);
        return BT_RPC_INVALID_ARGUMENT;
    }
    if (*rf && thinking && !sp->has_constrain_after) {
        /* the reasoning comes first, free; the object after </think> */
        const int32_t think_end = bt_tokenizer_token_to_id(r->tok, "</think>");
        q->sampling.has_constrain_after = think_end >= 0;
        q->sampling.constrain_after_token = think_end >= 0 ? think_end : 0;
    }
    if (!q->sampling.has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        q->sampling.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ q->epoch;
        q->sampling.has_seed = 1;
    }
    for (size_t i = 0; i < sp->n_stop; i++) {
        if (!sp->stop[i][0]) {
            snprintf(msg, msglen, "sampling.stop[%zu] is empty", i);
            return BT_RPC_INVALID_ARGUMENT;
        }
    }
    q->n_stop_ids = (int)sp->n_stop_token_ids;
    q->stop_ids = bt_malloc_or_die((sp->n_stop_token_ids ? sp->n_stop_token_ids : 1) * sizeof(int32_t));
    /* (an empty repeated field unpacks as NULL: memcpy's source may not be, even for 0 bytes) */
    if (sp->n_stop_token_ids)
        memcpy(q->stop_ids, sp->stop_token_ids, sp->n_stop_token_ids * sizeof(int32_t));
    q->n_bias = (int)sp->n_logit_bias;
    q->bias_ids = bt_malloc_or_die((sp->n_logit_bias ? sp->n_logit_bias : 1) * sizeof(int32_t));
    q->bias = bt_malloc_or_die((sp->n_logit_bias ? sp->n_logit_bias : 1) * sizeof(float));
    if (sp->n_logit_bias) {
        memcpy(q->bias_ids, sp->logit_bias_ids, sp->n_logit_bias * sizeof(int32_t));
        memcpy(q->bias, sp->logit_bias, sp->n_logit_bias * sizeof(float));
    }
    /* max_tokens: missing or too large is clamped to --max-new-tokens and the context */
    int64_t room = ctx > 0 ? ctx - (int64_t)n : r->max_new_default;
    int64_t want = sp->max_tokens > 0 ? sp->max_tokens : r->max_new_default;
    if (want > r->max_new_default) want = r->max_new_default;
    if (want > room) want = room;
    q->max_new = (int)want;
    bt_output_options_t oo = {(const char *const *)sp->stop, (int)sp->n_stop, chat || g->skip_special_tokens,
                              chat && !g->no_output_parsers && r->reasoning_parser,
                              chat && !g->no_output_parsers && r->tool_parser && tools, thinking, q->epoch};
    q->out = bt_output_create(r->tok, &oo);
    return BT_RPC_OK;
}

static void on_generate(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    router_t *r = ctx;
    if (r->draining || r->stopping) {
        count_outcome(r, bt_rpc_code_name(BT_RPC_UNAVAILABLE));
        bt_rpc_call_finish(call, BT_RPC_UNAVAILABLE,
                           "the router is stopping: it takes no new requests");
        return;
    }
    Baton__V1__GenerateRequest *g = BT_PROTO_UNPACK(baton__v1__generate_request, data, len);
    if (!g) {
        bt_rpc_call_finish(call, BT_RPC_INVALID_ARGUMENT, "unreadable GenerateRequest");
        return;
    }
    req_t *q = bt_calloc_or_die(1, sizeof *q);
    q->r = r;
    q->call = call;
    q->epoch = r->epoch_base + ++r->next_request;
    if (g->request_id && *g->request_id)
        snprintf(q->id, sizeof q->id, "%s", g->request_id);
    else
        snprintf(q->id, sizeof q->id, "req-%" PRIu64, r->next_request);
    q->t_start = bt_now_ms();
    q->next = r->reqs;
    r->reqs = q;
    char msg[512];
    bt_rpc_code_t code = BT_RPC_OK;
    if (g->model && *g->model && strcmp(g->model, r->served) != 0) {
        code = BT_RPC_NOT_FOUND;
        snprintf(msg, sizeof msg, "model '%s' is not served here (serving '%s')", g->model, r->served);
    }
    if (code == BT_RPC_OK) code = prepare(r, q, g, msg, sizeof msg);
    BT_PROTO_FREE(baton__v1__generate_request, g);
    if (code != BT_RPC_OK) {
        q->state = REQ_DONE;
        count_outcome(r, bt_rpc_code_name(code));
        bt_rpc_call_finish(call, code, msg);
        q->call = NULL;
        req_release(q);
        return;
    }
    bt_rpc_call_on_cancel(call, on_client_cancel, q);
    const char *missing = missing_group(r);
    if (missing) {
        req_fail(q, BT_RPC_UNAVAILABLE, missing);
        return;
    }
    if (!r->queue && start_request(q)) return;
    if (r->n_queued >= r->max_queued) {
        snprintf(msg, sizeof msg, "all decode groups are full and %d requests are queued "
                 "(--max-queued-requests)", r->n_queued);
        q->state = REQ_DONE;
        count_outcome(r, "RESOURCE_EXHAUSTED");
        bt_rpc_call_finish(call, BT_RPC_RESOURCE_EXHAUSTED, msg);
        q->call = NULL;
        req_release(q);
        return;
    }
    queue_put(r, q, false);
    retry_after_rest(r); /* the only room may be on a group resting after a refusal */
}

static void on_health(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    router_t *r = ctx;
    Baton__V1__HealthResponse h = BATON__V1__HEALTH_RESPONSE__INIT;
    const census_t n = census(r);
    h.decode_groups = n.decode;
    h.prefill_groups = n.prefill;
    h.leaving_groups = n.leaving;
    h.running = n.running;
    h.queued = r->n_queued;
    h.stopping = r->draining || r->stopping;
    h.serving = h.decode_groups > 0 && h.prefill_groups > 0 && !h.stopping;
    bt_proto_reply(call, &h.base);
}

static void on_list_models(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    router_t *r = ctx;
    Baton__V1__ListModelsResponse resp = BATON__V1__LIST_MODELS_RESPONSE__INIT;
    Baton__V1__Model m = BATON__V1__MODEL__INIT, *ms[1] = {&m};
    m.id = r->served;
    m.context_length = context_limit(r);
    m.owned_by = "baton";
    resp.n_models = 1;
    resp.models = ms;
    bt_proto_reply(call, &resp.base);
}

/* ---- the registry ------------------------------------------------------------------------- */

/* Removes w, failing what needs it. `replaced`: a new registration from its address takes
 * its place at once (so the queue keeps waiting). */
static void worker_remove(router_t *r, worker_t *w, const char *why, bool replaced)
{
    BT_LOG_WARN("removing %s worker %s at %s: %s",
                w->role == BATON__V1__WORKER_ROLE__ROLE_DECODE ? "decode" : "prefill", w->id,
                w->address, why);
    for (worker_t **p = &r->workers; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    char msg[512];
    snprintf(msg, sizeof msg, "%s group %s at %s is gone (%s)",
             w->role == BATON__V1__WORKER_ROLE__ROLE_DECODE ? "decode" : "prefill", w->id, w->address, why);
    /* a running request needs its decode group to the end, its prefill group only until its
     * first token (the handoff): one past that keeps decoding */
    for (req_t *q = r->reqs; q;) {
        req_t *next = q->next;
        if (q->call && q->state == REQ_RUNNING &&
            (q->decode == w || (q->prefill == w && q->in_prefill)))
            req_fail(q, BT_RPC_UNAVAILABLE, msg);
        else if (q->prefill == w) {
            q->in_prefill = false;
            q->prefill = NULL;
        }
        q = next;
    }
    bt_rpc_channel_destroy(w->ch);
    free(w);
    /* the last group of its kind gone: what waits in the queue (a request handed back by a
     * group that left, one that came while the last was leaving) fails now, as a request
     * arriving now would, not at its watchdog */
    const char *missing = replaced ? NULL : missing_group(r);
    while (missing && r->queue) {
        req_t *q = r->queue;
        queue_remove(r, q);
        q->state = REQ_DONE;
        char m[160];
        snprintf(m, sizeof m, "%s (the last one left while this request waited)", missing);
        req_fail(q, BT_RPC_UNAVAILABLE, m);
    }
}

static worker_t *find_worker(router_t *r, const char *id)
{
    for (worker_t *w = r->workers; w; w = w->next)
        if (!strcmp(w->id, id)) return w;
    return NULL;
}

static void on_register(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    router_t *r = ctx;
    Baton__V1__RegisterRequest *rq = BT_PROTO_UNPACK(baton__v1__register_request, data, len);
    if (!rq || !rq->info || !rq->info->address || !*rq->info->address ||
        (rq->info->role != BATON__V1__WORKER_ROLE__ROLE_DECODE &&
         rq->info->role != BATON__V1__WORKER_ROLE__ROLE_PREFILL)) {
        if (rq) BT_PROTO_FREE(baton__v1__register_request, rq);
        bt_rpc_call_finish(call, BT_RPC_INVALID_ARGUMENT, "RegisterRequest needs a role and an address");
        return;
    }
    Baton__V1__WorkerInfo *in = rq->info;
    if (strcmp(in->model, r->served) != 0) {
        char m[600];
        snprintf(m, sizeof m, "worker serves model '%s', the router serves '%s'", in->model, r->served);
        BT_LOG_WARN("refusing worker at %s: %s", in->address, m);
        BT_PROTO_FREE(baton__v1__register_request, rq);
        bt_rpc_call_finish(call, BT_RPC_FAILED_PRECONDITION, m);
        return;
    }
    /* a worker restarting on the same address replaces its old entry */
    for (worker_t *w = r->workers; w; w = w->next)
        if (!strcmp(w->address, in->address) && w->role == in->role) {
            worker_remove(r, w, "registered again", true);
            break;
        }
    worker_t *w = bt_calloc_or_die(1, sizeof *w);
    w->r = r;
    w->role = in->role;
    snprintf(w->id, sizeof w->id, "%s-%08" PRIx32 "-%" PRIu64,
             in->role == BATON__V1__WORKER_ROLE__ROLE_DECODE ? "decode" : "prefill", r->lifetime,
             ++r->next_worker);
    w->serial = r->next_worker;
    snprintf(w->address, sizeof w->address, "%s", in->address);
    snprintf(w->model, sizeof w->model, "%s", in->model);
    w->max_running = in->max_running;
    w->context_length = in->context_length;
    w->compat_hash = in->compat_hash;
    w->last_seen_ms = bt_now_ms();
    if (w->role == BATON__V1__WORKER_ROLE__ROLE_DECODE &&
        bt_rpc_channel_create(r->rpc, w->address, NULL, &w->ch) != BT_OK) {
        free(w);
        BT_PROTO_FREE(baton__v1__register_request, rq);
        bt_rpc_call_finish(call, BT_RPC_INVALID_ARGUMENT, "bad worker address");
        return;
    }
    w->next = r->workers;
    r->workers = w;
    BT_LOG_INFO("registered %s at %s", w->id, w->address);
    BT_PROTO_FREE(baton__v1__register_request, rq);
    Baton__V1__RegisterResponse resp = BATON__V1__REGISTER_RESPONSE__INIT;
    resp.worker_id = w->id;
    resp.heartbeat_ms = r->heartbeat_ms;
    bt_proto_reply(call, &resp.base);
    dispatch_queued(r);
}

static void on_heartbeat(void *ctx, bt_rpc_call_t *call, const uint8_t *data, size_t len)
{
    router_t *r = ctx;
    Baton__V1__HeartbeatRequest *hb = BT_PROTO_UNPACK(baton__v1__heartbeat_request, data, len);
    Baton__V1__HeartbeatResponse resp = BATON__V1__HEARTBEAT_RESPONSE__INIT;
    worker_t *w = hb ? find_worker(r, hb->worker_id) : NULL;
    bool more_room = false;
    if (w) {
        w->last_seen_ms = bt_now_ms();
        w->queued_prefill_tokens = hb->queued_prefill_tokens;
        if (hb->leaving && !w->leaving)
            BT_LOG_INFO("%s at %s is leaving: nothing new goes there", w->id, w->address);
        w->leaving |= hb->leaving; /* (a regular heartbeat may still land after it) */
        if (w->role == BATON__V1__WORKER_ROLE__ROLE_DECODE) {
            const int before = places(r, w);
            /* each running request holds one slot: the rest are held by quarantines */
            const int64_t held = hb->kv_slots_used - hb->running;
            w->slots_total = hb->kv_slots_total;
            w->slots_held = held > 0 ? held : 0;
            more_room = places(r, w) > before;
        }
        resp.known = 1;
    }
    if (hb) BT_PROTO_FREE(baton__v1__heartbeat_request, hb);
    bt_proto_reply(call, &resp.base);
    if (more_room) dispatch_queued(r); /* a quarantine ended */
}

static void on_sweep(uv_timer_t *t)
{
    router_t *r = t->data;
    int64_t now = bt_now_ms();
    for (worker_t *w = r->workers; w;) {
        worker_t *next = w->next;
        if (now - w->last_seen_ms > 3 * (int64_t)r->heartbeat_ms)
            worker_remove(r, w, "missed 3 heartbeats", false);
        w = next;
    }
    /* a stalled decode stream ends within the watchdog */
    for (req_t *q = r->reqs; q;) {
        req_t *next = q->next;
        if (q->call && q->state == REQ_RUNNING && now - q->last_event_ms > r->watchdog_ms)
            req_fail(q, BT_RPC_DEADLINE_EXCEEDED, "no progress from the decode group within --watchdog-timeout");
        else if (q->call && q->state == REQ_QUEUED && now - q->t_start > r->watchdog_ms)
            req_fail(q, BT_RPC_DEADLINE_EXCEEDED, "queued longer than --watchdog-timeout");
        q = next;
    }
}

/* ---- startup ---------------------------------------------------------------------------- */

static void refresh_metrics(void *ctx)
{
    router_t *r = ctx;
    const census_t n = census(r);
    bt_gauge_set(
        bt_metrics_gauge(r->metrics, "running_requests", "Requests on decode groups", NULL, NULL),
        n.running);
    bt_gauge_set(bt_metrics_gauge(r->metrics, "queued_requests", "Requests waiting for a decode place", NULL, NULL), r->n_queued);
    bt_gauge_set(
        bt_metrics_gauge(r->metrics, "workers", "Registered worker groups", "role", "decode"),
        n.decode);
    bt_gauge_set(
        bt_metrics_gauge(r->metrics, "workers", "Registered worker groups", "role", "prefill"),
        n.prefill);
    bt_gauge_set(bt_metrics_gauge(r->metrics, "workers_leaving",
                                  "Registered worker groups that are stopping (sent nothing new)",
                                  NULL, NULL),
                 n.leaving);
}

static void on_server_down(void *ctx)
{
    router_t *r = ctx;
    uv_stop(r->loop);
}

/* Fails what is left (why: the message; NULL when nothing is) and stops serving. */
static void stop_now(router_t *r, const char *why)
{
    if (r->stopping) return;
    r->stopping = true;
    uv_timer_stop(&r->sweep);
    uv_timer_stop(&r->retry);
    uv_timer_stop(&r->drain_timer);
    for (req_t *q = r->reqs; q;) {
        req_t *next = q->next;
        if (q->call) req_fail(q, BT_RPC_UNAVAILABLE, why ? why : "the router stopped");
        q = next;
    }
    BT_LOG_INFO("stopping");
    bt_rpc_server_shutdown(r->server, 1000, on_server_down, r);
}

static void on_drain_timeout(uv_timer_t *t)
{
    router_t *r = t->data;
    BT_LOG_WARN("%d requests still running after --drain-timeout: failing them", in_flight(r));
    stop_now(r, "the router stopped (its --drain-timeout ran out)");
}

/* SIGTERM: new requests are refused (Health no longer serving, so a balancer moves on);
 * those running and queued go on, with the registry and heartbeats, until they end or
 * --drain-timeout runs out. */
static void on_stop(void *ctx)
{
    router_t *r = ctx;
    const int n = in_flight(r);
    if (!n || r->drain_ms <= 0) {
        stop_now(r, "the router stopped");
        return;
    }
    r->draining = true;
    BT_LOG_INFO("stopping: takes no new requests; %d running or queued finish within %.3g s", n,
                (double)r->drain_ms / 1000.0);
    uv_timer_start(&r->drain_timer, on_drain_timeout, (uint64_t)r->drain_ms, 0);
}

int main(int argc, char **argv)
{
    bt_log_set_tag("router");
    signal(SIGPIPE, SIG_IGN); /* a peer that vanished must not kill the process */
    const char *model_path = NULL, *tokenizer_path = NULL, *served = NULL, *host = "127.0.0.1";
    const char *reasoning = NULL, *tool = NULL, *log_level = "info";
    int64_t port = 50051, max_running = 16, max_queued = 256, max_new = 32768, context = 0;
    int64_t heartbeat_ms = 1000, metrics_port = 0;
    double watchdog_s = 300.0, drain_s = 30.0;
    bt_flag_t spec[] = {
        BT_FLAG_STR("model-path", &model_path, "checkpoint directory, for its tokenizer (default: the demo model)"),
        BT_FLAG_STR("tokenizer-path", &tokenizer_path, "tokenizer directory (default: --model-path)"),
        BT_FLAG_STR("served-model-name", &served, "the model name clients use"),
        BT_FLAG_STR("host", &host, "address to listen on (default 127.0.0.1)"),
        BT_FLAG_INT("port", &port, "gRPC port (default 50051; 0 picks one)"),
        BT_FLAG_INT("max-running-requests", &max_running, "running requests per decode group (default 16)"),
        BT_FLAG_INT("max-queued-requests", &max_queued, "FIFO queue behind them (default 256)"),
        BT_FLAG_INT("max-new-tokens", &max_new, "cap and default for max_tokens (default 32768)"),
        BT_FLAG_INT("context-length", &context, "cap on prompt + output (default: the workers')"),
        BT_FLAG_FLOAT("watchdog-timeout", &watchdog_s, "seconds without progress before a request fails"),
        BT_FLAG_INT("heartbeat-ms", &heartbeat_ms, "worker heartbeat interval (3 misses remove it)"),
        BT_FLAG_FLOAT("drain-timeout", &drain_s, "seconds a stopping router finishes its requests in (default 30; 0: fails them)"),
        BT_FLAG_STR("reasoning-parser", &reasoning, "deepseek-v41"),
        BT_FLAG_STR("tool-call-parser", &tool, "deepseekv41"),
        BT_FLAG_INT("metrics-port", &metrics_port, "HTTP port of /metrics (0 picks one)"),
        BT_FLAG_STR("log-level", &log_level, "debug, info, warn, error"),
    };
    char err[1024];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc - 1, argv + 1, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton-router: %s\n", err);
        return 2;
    }
    if (bt_log_level_parse(log_level) < 0 || max_running < 1 || max_queued < 0 || max_new < 1 ||
        watchdog_s <= 0 || heartbeat_ms < 50 || drain_s < 0 ||
        (reasoning && strcmp(reasoning, "deepseek-v41") && strcmp(reasoning, "deepseek-v4")) ||
        (tool && strcmp(tool, "deepseekv41") && strcmp(tool, "deepseekv4"))) {
        fprintf(stderr,
                "baton-router: bad flag value (--max-running-requests >= 1, "
                "--max-queued-requests >= 0, --max-new-tokens >= 1, --watchdog-timeout > 0, "
                "--heartbeat-ms >= 50, --drain-timeout >= 0, --reasoning-parser deepseek-v41, "
                "--tool-call-parser deepseekv41)\n");
        return 2;
    }
    bt_log_set_level((bt_log_level_t)bt_log_level_parse(log_level));
    static router_t rr;
    router_t *r = &rr;
    r->loop = uv_default_loop();
    r->max_running = (int)max_running;
    r->max_queued = (int)max_queued;
    r->max_new_default = (int)max_new;
    r->context_length = context;
    r->watchdog_ms = (int64_t)(watchdog_s * 1000.0);
    r->drain_ms = (int64_t)(drain_s * 1000.0);
    r->heartbeat_ms = (int)heartbeat_ms;
    r->prefixes = bt_calloc_or_die(PREFIX_SLOTS, sizeof *r->prefixes);
    r->reasoning_parser = reasoning != NULL;
    r->tool_parser = tool != NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->epoch_base = ((uint64_t)ts.tv_sec & 0xffffffffu) << 24; /* ids of this router's lifetime */
    r->lifetime = (uint32_t)(((uint64_t)ts.tv_sec * 1000000007u + (uint64_t)ts.tv_nsec) ^
                             ((uint64_t)getpid() << 16));
    char demo[4096];
    const char *tdir = tokenizer_path ? tokenizer_path : model_path;
    if (!tdir) {
        if (bt_demo_model_default(demo, sizeof demo, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton-router: demo model: %s\n", err);
            return 1;
        }
        tdir = demo;
    }
    snprintf(r->served, sizeof r->served, "%s", served ? served : (model_path ? model_path : "baton-demo"));
    if (bt_tokenizer_load(tdir, &r->tok, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton-router: tokenizer: %s\n", err);
        return 1;
    }
    r->user_token = bt_tokenizer_token_to_id(r->tok, BT_CHAT_USER_TOKEN);
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%lld", host, (long long)port);
    if ((st = bt_rpc_create(r->loop, &r->rpc)) != BT_OK ||
        (st = bt_rpc_server_create(r->rpc, addr, NULL, &r->server)) != BT_OK ||
        (st = bt_rpc_server_method(r->server, "/baton.v1.Baton/Generate", BT_RPC_SERVER_STREAM, on_generate, r)) != BT_OK ||
        (st = bt_rpc_server_method(r->server, "/baton.v1.Baton/Health", BT_RPC_UNARY, on_health, r)) != BT_OK ||
        (st = bt_rpc_server_method(r->server, "/baton.v1.Baton/ListModels", BT_RPC_UNARY, on_list_models, r)) != BT_OK ||
        (st = bt_rpc_server_method(r->server, "/baton.v1.Registry/RegisterWorker", BT_RPC_UNARY, on_register, r)) != BT_OK ||
        (st = bt_rpc_server_method(r->server, "/baton.v1.Registry/Heartbeat", BT_RPC_UNARY, on_heartbeat, r)) != BT_OK ||
        (st = bt_rpc_server_start(r->server)) != BT_OK) {
        fprintf(stderr, "baton-router: cannot serve gRPC on %s: %s\n", addr, bt_status_str(st));
        return 1;
    }
    r->metrics = bt_metrics_create("baton_router");
    r->requeued = bt_metrics_counter(r->metrics, "requests_requeued_total",
                                     "Requests a decode group refused, queued again", NULL, NULL);
    r->ttft = bt_metrics_histogram(r->metrics, "time_to_first_token_seconds", "Time to first token",
                                   bt_metrics_latency_buckets, NULL, NULL);
    r->itl = bt_metrics_histogram(r->metrics, "inter_token_latency_seconds", "Time between decode events",
                                  bt_metrics_latency_buckets, NULL, NULL);
    r->e2e = bt_metrics_histogram(r->metrics, "request_latency_seconds", "Whole request latency",
                                  bt_metrics_latency_buckets, NULL, NULL);
    refresh_metrics(r);
    if (bt_metrics_server_start(r->loop, host, (int)metrics_port, r->metrics, refresh_metrics, r,
                                &r->metrics_server) != BT_OK) {
        fprintf(stderr, "baton-router: cannot serve /metrics on %s:%lld\n", host, (long long)metrics_port);
        return 1;
    }
    printf("baton-router metrics on %s:%d\n", host, bt_metrics_server_port(r->metrics_server));
    printf("baton-router listening on %s:%d\n", host, bt_rpc_server_port(r->server));
    fflush(stdout);
    BT_LOG_INFO("serving '%s' on %s:%d (max %d running per decode group, queue %d)", r->served, host,
                bt_rpc_server_port(r->server), r->max_running, r->max_queued);
    uv_timer_init(r->loop, &r->sweep);
    r->sweep.data = r;
    uv_timer_init(r->loop, &r->retry);
    r->retry.data = r;
    uv_timer_init(r->loop, &r->drain_timer);
    r->drain_timer.data = r;
    uv_timer_start(&r->sweep, on_sweep, (uint64_t)heartbeat_ms / 2, (uint64_t)heartbeat_ms / 2);
    bt_service_on_signal(r->loop, on_stop, r);
    uv_run(r->loop, UV_RUN_DEFAULT);
    BT_LOG_INFO("stopped");
    return 0;
}

/* baton-gateway: the OpenAI-compatible HTTP API in front of the router. Stateless: any
 * number can run. HTTP/1.1 on libuv (common/http), the router over gRPC (common/rpc).
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (streaming as SSE, or one JSON),
 * GET /v1/models, GET /health, GET /metrics. A client that goes away cancels its request
 * end to end (the gRPC call is cancelled, the router cancels decode, decode aborts prefill). */
#include "common/alloc.h"
#include "common/flags.h"
#include "common/http/http.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"
#include "services/common/service.h"
#include "services/gateway/openai.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct gateway gateway_t;

typedef struct gen gen_t;

/* One choice of a request (`n` of them): a Generate call of its own to the router. */
typedef struct {
    gen_t *x;
    int index;
    bt_rpc_client_call_t *rc;
    bool rc_live, done;
    int64_t t_last;
    /* non-streaming accumulation */
    char *content, *reasoning;
    size_t content_len, content_cap, reasoning_len, reasoning_cap;
    cJSON *tool_calls;   /* array */
    cJSON *logprobs;     /* chat: content array; completions: object of arrays */
    const char *finish;
    char *matched_stop; /* the stop string that ended it (SGLang's matched_stop); NULL: none */
    int prompt_tokens, completion_tokens, cached_tokens;
    size_t text_offset; /* completions logprobs: characters so far */
} choice_t;

struct gen {
    gateway_t *g;
    bt_http_request_t *req;
    bool http_gone, answered, began;
    bt_openai_request_t r;
    char id[64];
    const char *route; /* metrics label */
    int64_t created;
    int64_t t_start, t_first;
    char model[256];
    choice_t *choices; /* n_choices: r.n for each of r.n_prompts, prompt-major */
    int n_choices, n_live, n_done;
};

struct gateway {
    uv_loop_t *loop;
    bt_rpc_t *rpc;
    bt_rpc_channel_t *router;
    bt_http_server_t *http;
    char *api_key;
    size_t api_key_len;
    int64_t request_timeout_ms;
    bool cache_report;
    uint64_t next_id;
    char served[256];
    bt_metrics_t *metrics;
    bt_gauge_t *in_flight;
    int n_in_flight;
    bt_histogram_t *ttft, *itl, *e2e;
    /* signalled: takes no new connection, answers those it has within drain_ms; then cancels
     * them (cut_off) and, a moment later, exits whatever is left unsent */
    int64_t drain_ms;
    uv_timer_t drain_timer;
    bool cut_off;
};

static const char *http_route(const char *path)
{
    if (!strcmp(path, "/v1/chat/completions")) return "chat";
    if (!strcmp(path, "/v1/completions")) return "completions";
    if (!strcmp(path, "/v1/models")) return "models";
    if (!strcmp(path, "/health")) return "health";
    if (!strcmp(path, "/metrics")) return "metrics";
    return "other";
}

static void count(gateway_t *g, const char *route, int status)
{
    /* one series per (route, status) */
    char label[64];
    snprintf(label, sizeof label, "%.40s_%d", route, status);
    bt_counter_add(bt_metrics_counter(g->metrics, "http_requests_total",
                                      "HTTP requests answered, by route and status", "route_status", label),
                   1);
}

static void send_json(gateway_t *g, bt_http_request_t *req, const char *route, int status, const char *json)
{
    count(g, route, status);
    bt_http_respond(req, status, "application/json", json, strlen(json));
}

static void send_error(gateway_t *g, bt_http_request_t *req, const char *route, int status,
                       const char *msg, const char *param)
{
    char *body = bt_openai_error_json(status, msg, param);
    send_json(g, req, route, status, body);
    free(body);
}

static int http_status(bt_rpc_code_t c)
{
    switch (c) {
    case BT_RPC_OK: return 200;
    case BT_RPC_INVALID_ARGUMENT:
    case BT_RPC_OUT_OF_RANGE:
    case BT_RPC_FAILED_PRECONDITION: return 400;
    case BT_RPC_NOT_FOUND: return 404;
    case BT_RPC_RESOURCE_EXHAUSTED: return 429;
    case BT_RPC_UNAUTHENTICATED: return 401;
    case BT_RPC_PERMISSION_DENIED: return 403;
    case BT_RPC_UNAVAILABLE: return 503;
    case BT_RPC_DEADLINE_EXCEEDED: return 504;
    case BT_RPC_CANCELLED: return 499;
    default: return 500;
    }
}

/* the request's "param" when the router's message names one ("sampling.top_p must ..") */
static void param_of(const char *msg, char *out, size_t n)
{
    out[0] = 0;
    if (!msg) return;
    size_t i = 0;
    while (msg[i] && (msg[i] == '_' || msg[i] == '.' || (msg[i] >= 'a' && msg[i] <= 'z') || msg[i] == '[' ||
                      msg[i] == ']' || (msg[i] >= '0' && msg[i] <= '9')))
        i++;
    if (i > 0 && i < n && msg[i] == ':') snprintf(out, n, "%.*s", (int)i, msg);
    else if (i > 0 && i < n && msg[i] == ' ' && !strncmp(msg, "sampling.", 9)) snprintf(out, n, "%.*s", (int)i, msg + 9);
}

/* ---- generation ------------------------------------------------------------------------ */

static const char *finish_name(Baton__V1__FinishReason f)
{
    switch (f) {
    case BATON__V1__FINISH_REASON__FINISH_LENGTH: return "length";
    case BATON__V1__FINISH_REASON__FINISH_TOOL_CALLS: return "tool_calls";
    default: return "stop";
    }
}

static void gen_free(gen_t *x)
{
    gateway_t *g = x->g;
    g->n_in_flight--;
    bt_gauge_set(g->in_flight, g->n_in_flight);
    for (int i = 0; x->choices && i < x->n_choices; i++) {
        choice_t *c = &x->choices[i];
        cJSON_Delete(c->tool_calls);
        cJSON_Delete(c->logprobs);
        free(c->content);
        free(c->reasoning);
        free(c->matched_stop);
    }
    free(x->choices);
    bt_openai_request_free(&x->r);
    free(x);
}

/* A final choice's matched_stop: the stop string, or null (as SGLang answers) */
static void add_matched_stop(cJSON *choice, const choice_t *c)
{
    if (c->matched_stop)
        cJSON_AddStringToObject(choice, "matched_stop", c->matched_stop);
    else
        cJSON_AddNullToObject(choice, "matched_stop");
}

static void maybe_free(gen_t *x)
{
    if (x->n_live == 0 && (x->answered || x->http_gone)) gen_free(x);
}

/* Ends the calls of the choices still running (one failed, or the client left); their
 * callbacks still come. */
static void cancel_choices(gen_t *x)
{
    for (int i = 0; i < x->n_choices; i++)
        if (x->choices[i].rc_live) bt_rpc_client_cancel(x->choices[i].rc);
}

static void append(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t n = strlen(s);
    if (!n) return;
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = bt_realloc_or_die(*buf, *cap);
    }
    memcpy(*buf + *len, s, n + 1);
    *len += n;
}

static cJSON *token_bytes(const char *s)
{
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Logprob entries of one response message, OpenAI chat form. */
static void chat_logprobs(cJSON *content, Baton__V1__GenerateResponse *m)
{
    for (size_t i = 0; i < m->n_logprobs; i++) {
        Baton__V1__TokenLogprob *lp = m->logprobs[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "token", lp->text ? lp->text : "");
        cJSON_AddNumberToObject(e, "logprob", lp->logprob);
        cJSON_AddItemToObject(e, "bytes", token_bytes(lp->text ? lp->text : ""));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (size_t k = 0; k < lp->n_top; k++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "token", lp->top[k]->text ? lp->top[k]->text : "");
            cJSON_AddNumberToObject(t, "logprob", lp->top[k]->logprob);
            cJSON_AddItemToObject(t, "bytes", token_bytes(lp->top[k]->text ? lp->top[k]->text : ""));
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToArray(content, e);
    }
}

/* Completions form: {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []} */
static void completion_logprobs(cJSON *obj, Baton__V1__GenerateResponse *m, size_t *offset)
{
    cJSON *tokens = cJSON_GetObjectItem(obj, "tokens"), *lps = cJSON_GetObjectItem(obj, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(obj, "top_logprobs"), *offs = cJSON_GetObjectItem(obj, "text_offset");
    for (size_t i = 0; i < m->n_logprobs; i++) {
        Baton__V1__TokenLogprob *lp = m->logprobs[i];
        const char *t = lp->text ? lp->text : "";
        cJSON_AddItemToArray(tokens, cJSON_CreateString(t));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp->logprob));
        cJSON *top = cJSON_CreateObject();
        for (size_t k = 0; k < lp->n_top; k++)
            cJSON_AddNumberToObject(top, lp->top[k]->text ? lp->top[k]->text : "", lp->top[k]->logprob);
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        for (const unsigned char *c = (const unsigned char *)t; *c; c++) /* characters, as OpenAI */
            *offset += (*c & 0xC0) != 0x80;
    }
}

static cJSON *new_completion_logprobs(void)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

/* Each prompt once (its n choices have the same), the completions of all choices. */
static cJSON *usage_json(gen_t *x)
{
    int prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < x->n_choices; i++) {
        completion += x->choices[i].completion_tokens;
        if (i % x->r.n == 0) {
            prompt += x->choices[i].prompt_tokens;
            cached += x->choices[i].cached_tokens;
        }
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    if (x->g->cache_report) {
        cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
        cJSON_AddNumberToObject(d, "cached_tokens", cached);
    }
    return u;
}

static cJSON *envelope(gen_t *x, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", x->id);
    cJSON_AddStringToObject(o, "object", x->r.kind == BT_OPENAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                                     : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)x->created);
    cJSON_AddStringToObject(o, "model", x->model);
    return o;
}

/* One SSE event: "data: " json "\n\n", whatever its length. */
static void sse_text(gen_t *x, const char *json)
{
    size_t n = strlen(json);
    char *frame = bt_malloc_or_die(n + 9);
    memcpy(frame, "data: ", 6);
    memcpy(frame + 6, json, n);
    memcpy(frame + 6 + n, "\n\n", 3);
    bt_http_stream_write(x->req, frame, n + 8);
    free(frame);
}

static void sse(gen_t *x, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    sse_text(x, s);
    free(s);
}

static void begin_stream(gen_t *x)
{
    if (x->began) return;
    x->began = true;
    bt_http_add_header(x->req, "Cache-Control", "no-cache");
    bt_http_stream_begin(x->req, 200, "text/event-stream");
    /* the first chunk of each choice announces the role, as OpenAI does */
    for (int i = 0; x->r.kind == BT_OPENAI_CHAT && i < x->n_choices; i++) {
        cJSON *o = envelope(x, true);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(choices, c);
        sse(x, o);
        cJSON_Delete(o);
    }
}

static cJSON *tool_call_json(Baton__V1__ToolCall *t)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", t->index);
    cJSON_AddStringToObject(c, "id", t->id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", t->name);
    cJSON_AddStringToObject(f, "arguments", t->arguments);
    return c;
}

static void on_gen_message(void *ctx, const uint8_t *data, size_t len)
{
    choice_t *ch = ctx;
    gen_t *x = ch->x;
    gateway_t *g = x->g;
    if (x->http_gone || x->answered) return;
    Baton__V1__GenerateResponse *m = BT_PROTO_UNPACK(baton__v1__generate_response, data, len);
    if (!m) return;
    int64_t now = bt_now_ms();
    if (m->n_token_ids > 0) {
        if (!x->t_first) {
            x->t_first = now;
            bt_histogram_observe(g->ttft, (double)(now - x->t_start) / 1000.0);
        } else if (ch->t_last) {
            bt_histogram_observe(g->itl,
                                 (double)(now - ch->t_last) / 1000.0 / (double)m->n_token_ids);
        }
        ch->t_last = now;
    }
    bool final = m->finish_reason != BATON__V1__FINISH_REASON__FINISH_NONE;
    if (final) {
        ch->finish = finish_name(m->finish_reason);
        if (m->matched_stop && *m->matched_stop && !ch->matched_stop)
            ch->matched_stop = bt_strdup_or_die(m->matched_stop);
        if (m->usage) {
            ch->prompt_tokens = m->usage->prompt_tokens;
            ch->completion_tokens = m->usage->completion_tokens;
            ch->cached_tokens = m->usage->cached_tokens;
        }
    }
    if (!x->r.stream) {
        append(&ch->content, &ch->content_len, &ch->content_cap, m->text ? m->text : "");
        append(&ch->reasoning, &ch->reasoning_len, &ch->reasoning_cap,
               m->reasoning_text ? m->reasoning_text : "");
        for (size_t i = 0; i < m->n_tool_calls; i++)
            cJSON_AddItemToArray(ch->tool_calls, tool_call_json(m->tool_calls[i]));
        if (x->r.logprobs) {
            if (x->r.kind == BT_OPENAI_CHAT)
                chat_logprobs(ch->logprobs, m);
            else
                completion_logprobs(ch->logprobs, m, &ch->text_offset);
        }
        BT_PROTO_FREE(baton__v1__generate_response, m);
        return;
    }
    begin_stream(x);
    bool has_text = (m->text && *m->text) || (m->reasoning_text && *m->reasoning_text) || m->n_tool_calls;
    bool has_ids = x->r.return_token_ids && m->n_token_ids; /* a chunk per token step, text or not */
    if (has_text || final || m->n_logprobs || has_ids) {
        cJSON *o = envelope(x, true);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", ch->index);
        if (x->r.kind == BT_OPENAI_CHAT) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (m->reasoning_text && *m->reasoning_text) cJSON_AddStringToObject(d, "reasoning_content", m->reasoning_text);
            if (m->text && *m->text) cJSON_AddStringToObject(d, "content", m->text);
            if (m->n_tool_calls) {
                cJSON *tc = cJSON_AddArrayToObject(d, "tool_calls");
                for (size_t i = 0; i < m->n_tool_calls; i++) cJSON_AddItemToArray(tc, tool_call_json(m->tool_calls[i]));
            }
            if (x->r.logprobs && m->n_logprobs) {
                cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
                chat_logprobs(cJSON_AddArrayToObject(lp, "content"), m);
            } else {
                cJSON_AddNullToObject(c, "logprobs");
            }
        } else {
            cJSON_AddStringToObject(c, "text", m->text ? m->text : "");
            if (x->r.logprobs && m->n_logprobs) {
                cJSON *lp = new_completion_logprobs();
                completion_logprobs(lp, m, &ch->text_offset);
                cJSON_AddItemToObject(c, "logprobs", lp);
            } else {
                cJSON_AddNullToObject(c, "logprobs");
            }
        }
        if (x->r.return_token_ids) {
            cJSON *ids = cJSON_AddArrayToObject(c, "token_ids");
            for (size_t i = 0; i < m->n_token_ids; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(m->token_ids[i]));
        }
        if (final) {
            cJSON_AddStringToObject(c, "finish_reason", ch->finish);
            add_matched_stop(c, ch);
        } else {
            cJSON_AddNullToObject(c, "finish_reason");
        }
        cJSON_AddItemToArray(choices, c);
        if (final && x->r.include_usage) cJSON_AddNullToObject(o, "usage");
        sse(x, o);
        cJSON_Delete(o);
    }
    BT_PROTO_FREE(baton__v1__generate_response, m);
}

/* The whole answer once every choice is done: the stream's usage chunk (when asked) and its
 * end, or one JSON with every choice. */
static void answer(gen_t *x)
{
    gateway_t *g = x->g;
    bt_histogram_observe(g->e2e, (double)(bt_now_ms() - x->t_start) / 1000.0);
    if (x->r.stream) {
        begin_stream(x);
        if (x->r.include_usage) {
            cJSON *o = envelope(x, true);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(x));
            sse(x, o);
            cJSON_Delete(o);
        }
        bt_http_stream_write(x->req, "data: [DONE]\n\n", 14);
        bt_http_stream_end(x->req);
        count(g, x->route, 200);
        return;
    }
    cJSON *o = envelope(x, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < x->n_choices; i++) {
        choice_t *ch = &x->choices[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        if (x->r.kind == BT_OPENAI_CHAT) {
            cJSON *msgj = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(msgj, "role", "assistant");
            if (cJSON_GetArraySize(ch->tool_calls) > 0 && !ch->content_len)
                cJSON_AddNullToObject(msgj, "content");
            else
                cJSON_AddStringToObject(msgj, "content", ch->content ? ch->content : "");
            if (ch->reasoning_len)
                cJSON_AddStringToObject(msgj, "reasoning_content", ch->reasoning);
            if (cJSON_GetArraySize(ch->tool_calls) > 0) {
                cJSON_AddItemToObject(msgj, "tool_calls", ch->tool_calls);
                ch->tool_calls = NULL;
            }
            if (x->r.logprobs) {
                cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
                cJSON_AddItemToObject(lp, "content", ch->logprobs);
                ch->logprobs = NULL;
            } else {
                cJSON_AddNullToObject(c, "logprobs");
            }
        } else {
            cJSON_AddStringToObject(c, "text", ch->content ? ch->content : "");
            if (x->r.logprobs) {
                cJSON_AddItemToObject(c, "logprobs", ch->logprobs);
                ch->logprobs = NULL;
            } else {
                cJSON_AddNullToObject(c, "logprobs");
            }
        }
        cJSON_AddStringToObject(c, "finish_reason", ch->finish ? ch->finish : "stop");
        add_matched_stop(c, ch);
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(x));
    char *s = cJSON_PrintUnformatted(o);
    send_json(g, x->req, x->route, 200, s);
    free(s);
    cJSON_Delete(o);
}

static void on_gen_done(void *ctx, bt_rpc_code_t code, const char *msg)
{
    choice_t *ch = ctx;
    gen_t *x = ch->x;
    gateway_t *g = x->g;
    ch->rc_live = false;
    ch->rc = NULL;
    x->n_live--;
    if (x->http_gone || x->answered) {
        maybe_free(x);
        return;
    }
    if (code != BT_RPC_OK) {
        /* one choice failed: the request did (the others are cancelled) */
        bt_histogram_observe(g->e2e, (double)(bt_now_ms() - x->t_start) / 1000.0);
        if (code == BT_RPC_CANCELLED && g->cut_off) {
            code = BT_RPC_UNAVAILABLE;
            msg = "the gateway stopped (its --drain-timeout ran out)";
        }
        cancel_choices(x);
        int status = http_status(code);
        if (status == 499) status = 503;
        if (!x->began) {
            char param[64];
            param_of(msg, param, sizeof param);
            send_error(g, x->req, x->route, status, msg ? msg : bt_rpc_code_name(code), param);
        } else {
            /* mid-stream: an error event, then the end of the stream */
            char *body = bt_openai_error_json(status, msg ? msg : bt_rpc_code_name(code), NULL);
            sse_text(x, body); /* (a fixed frame cut long messages and their "\n\n") */
            free(body);
            bt_http_stream_write(x->req, "data: [DONE]\n\n", 14);
            bt_http_stream_end(x->req);
            count(g, x->route, status);
        }
        x->answered = true;
        maybe_free(x);
        return;
    }
    ch->done = true;
    if (++x->n_done < x->n_choices) return;
    answer(x);
    x->answered = true;
    maybe_free(x);
}

static void on_http_gone(void *ctx)
{
    gen_t *x = ctx;
    x->http_gone = true;
    if (x->n_live > 0) {
        BT_LOG_INFO("%s: client went away; cancelling", x->id);
        cancel_choices(x);
    }
    maybe_free(x);
}

static void start_generation(gateway_t *g, bt_http_request_t *req, bt_openai_kind_t kind, const char *route)
{
    size_t len;
    const uint8_t *body = bt_http_body(req, &len);
    gen_t *x = bt_calloc_or_die(1, sizeof *x);
    x->g = g;
    x->req = req;
    x->route = route;
    x->created = (int64_t)time(NULL);
    x->t_start = bt_now_ms();
    snprintf(x->id, sizeof x->id, "%s-%016" PRIx64 "%04" PRIx64, kind == BT_OPENAI_CHAT ? "chatcmpl" : "cmpl",
             (uint64_t)x->created * 1000003u + (uint64_t)getpid(), ++g->next_id & 0xffff);
    bt_openai_error_t e;
    g->n_in_flight++;
    bt_gauge_set(g->in_flight, g->n_in_flight);
    if (bt_openai_parse(kind, (const char *)body, len, x->id, &x->r, &e) != BT_OK) {
        send_error(g, req, route, 400, e.message, e.param);
        x->answered = true;
        gen_free(x);
        return;
    }
    snprintf(x->model, sizeof x->model, "%s", x->r.model[0] ? x->r.model : g->served);
    x->n_choices = x->r.n * x->r.n_prompts;
    x->choices = bt_calloc_or_die((size_t)x->n_choices, sizeof *x->choices);
    for (int i = 0; i < x->n_choices; i++) {
        choice_t *ch = &x->choices[i];
        ch->x = x;
        ch->index = i;
        ch->tool_calls = cJSON_CreateArray();
        ch->logprobs = kind == BT_OPENAI_CHAT ? cJSON_CreateArray() : new_completion_logprobs();
    }
    x->n_live = 1; /* (a guard: nothing frees x while its calls start) */
    bt_http_on_close(req, on_http_gone, x);
    /* every choice a generation of its own (choice i > 0 with seed + i, when one was given) */
    for (int i = 0; i < x->n_choices && !x->answered && !x->http_gone; i++) {
        choice_t *ch = &x->choices[i];
        uint8_t *buf = x->r.gens[0];
        size_t len = x->r.gen_lens[0];
        char rid[80];
        snprintf(rid, sizeof rid, "%s-%d", x->id, i);
        bt_status_t cs;
        if (i > 0 && (cs = bt_openai_choice_request(&x->r, i, rid, &buf, &len)) != BT_OK) {
            cancel_choices(x);
            char m[128];
            snprintf(m, sizeof m, "cannot build the request of choice %d: %s", i,
                     bt_status_str(cs));
            send_error(g, req, route, 500, m, NULL);
            x->answered = true;
            break;
        }
        if (bt_rpc_stream(g->router, "/baton.v1.Baton/Generate", buf, len, g->request_timeout_ms,
                          on_gen_message, on_gen_done, ch, &ch->rc) == BT_OK) {
            ch->rc_live = true;
            x->n_live++;
        } else {
            cancel_choices(x);
            send_error(g, req, route, 503, "the router is unreachable", NULL);
            x->answered = true;
        }
        if (buf != x->r.gens[0]) free(buf);
    }
    x->n_live--;
    maybe_free(x);
}

/* ---- other routes ----------------------------------------------------------------------- */

typedef struct {
    gateway_t *g;
    bt_http_request_t *req;
    bool gone;
    int kind; /* 0 health, 1 models */
} unary_ctx_t;

static void on_unary_gone(void *ctx)
{
    ((unary_ctx_t *)ctx)->gone = true;
}

static void on_unary(void *ctx, bt_rpc_code_t code, const char *msg, const uint8_t *resp, size_t len)
{
    unary_ctx_t *u = ctx;
    gateway_t *g = u->g;
    if (u->gone) {
        free(u);
        return;
    }
    if (u->kind == 0) {
        Baton__V1__HealthResponse *h = code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__health_response, resp, len) : NULL;
        bool ok = h && h->serving;
        char body[256];
        snprintf(body, sizeof body, "{\"status\":\"%s\",\"prefill_groups\":%d,\"decode_groups\":%d,\"running\":%d,\"queued\":%d}",
                 ok ? "ok" : "unavailable", h ? h->prefill_groups : 0, h ? h->decode_groups : 0, h ? h->running : 0,
                 h ? h->queued : 0);
        if (h) BT_PROTO_FREE(baton__v1__health_response, h);
        send_json(g, u->req, "health", ok ? 200 : 503, body);
    } else {
        Baton__V1__ListModelsResponse *lm = code == BT_RPC_OK ? BT_PROTO_UNPACK(baton__v1__list_models_response, resp, len) : NULL;
        if (!lm) {
            send_error(g, u->req, "models", http_status(code == BT_RPC_OK ? BT_RPC_INTERNAL : code),
                       msg ? msg : "the router is unreachable", NULL);
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "object", "list");
            cJSON *data = cJSON_AddArrayToObject(o, "data");
            for (size_t i = 0; i < lm->n_models; i++) {
                cJSON *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "id", lm->models[i]->id);
                cJSON_AddStringToObject(m, "object", "model");
                cJSON_AddNumberToObject(m, "created", (double)time(NULL));
                cJSON_AddStringToObject(m, "owned_by", lm->models[i]->owned_by);
                cJSON_AddNumberToObject(m, "max_model_len", (double)lm->models[i]->context_length);
                cJSON_AddItemToArray(data, m);
                snprintf(g->served, sizeof g->served, "%s", lm->models[i]->id);
            }
            char *s = cJSON_PrintUnformatted(o);
            send_json(g, u->req, "models", 200, s);
            free(s);
            cJSON_Delete(o);
            BT_PROTO_FREE(baton__v1__list_models_response, lm);
        }
    }
    free(u);
}

static void call_unary(gateway_t *g, bt_http_request_t *req, int kind)
{
    unary_ctx_t *u = bt_calloc_or_die(1, sizeof *u);
    u->g = g;
    u->req = req;
    u->kind = kind;
    bt_http_on_close(req, on_unary_gone, u);
    uint8_t *buf;
    size_t len;
    if (kind == 0) {
        Baton__V1__HealthRequest rq = BATON__V1__HEALTH_REQUEST__INIT;
        bt_proto_pack(&rq.base, &buf, &len);
    } else {
        Baton__V1__ListModelsRequest rq = BATON__V1__LIST_MODELS_REQUEST__INIT;
        bt_proto_pack(&rq.base, &buf, &len);
    }
    if (bt_rpc_unary(g->router, kind == 0 ? "/baton.v1.Baton/Health" : "/baton.v1.Baton/ListModels", buf, len, 5000,
                     on_unary, u, NULL) != BT_OK)
        on_unary(u, BT_RPC_UNAVAILABLE, "the router is unreachable", NULL, 0);
    free(buf);
}

/* constant time in the length of the expected key */
static bool key_ok(const gateway_t *g, const char *auth)
{
    static const char prefix[] = "Bearer ";
    if (!auth || strncmp(auth, prefix, sizeof prefix - 1) != 0) return false;
    const char *given = auth + sizeof prefix - 1;
    size_t glen = strlen(given);
    unsigned char diff = (unsigned char)(glen != g->api_key_len);
    for (size_t i = 0; i < g->api_key_len; i++) diff |= (unsigned char)(g->api_key[i] ^ (i < glen ? given[i] : 0));
    return diff == 0;
}

static void on_request(void *ctx, bt_http_request_t *req)
{
    gateway_t *g = ctx;
    const char *path = bt_http_path(req), *method = bt_http_method(req);
    const char *route = http_route(path);
    bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!strcmp(route, "other")) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %s %.200s", method, path);
        send_error(g, req, route, 404, msg, NULL);
        return;
    }
    bool wants_post = !strcmp(route, "chat") || !strcmp(route, "completions");
    if ((wants_post && !post) || (!wants_post && !get)) {
        bt_http_add_header(req, "Allow", wants_post ? "POST" : "GET");
        char msg[300];
        snprintf(msg, sizeof msg, "%s is not allowed on %s", method, path);
        send_error(g, req, route, 405, msg, NULL);
        return;
    }
    if (!strcmp(route, "metrics")) {
        char *text = bt_metrics_render(g->metrics);
        count(g, route, 200);
        bt_http_respond(req, 200, "text/plain; version=0.0.4", text, strlen(text));
        free(text);
        return;
    }
    if (!strcmp(route, "health")) {
        call_unary(g, req, 0);
        return;
    }
    if (g->api_key && !key_ok(g, bt_http_header(req, "Authorization"))) {
        bt_http_add_header(req, "WWW-Authenticate", "Bearer");
        send_error(g, req, route, 401, "missing or wrong API key (Authorization: Bearer ...)", NULL);
        return;
    }
    if (!strcmp(route, "models")) {
        call_unary(g, req, 1);
        return;
    }
    /* any Content-Type is read as JSON (curl -d sends form-urlencoded), as SGLang does */
    start_generation(g, req, !strcmp(route, "chat") ? BT_OPENAI_CHAT : BT_OPENAI_COMPLETION, route);
}

static char *error_body(int status, const char *message)
{
    return bt_openai_error_json(status, message, NULL);
}

static void on_http_closed(void *ctx)
{
    gateway_t *g = ctx;
    uv_stop(g->loop);
}

static void on_unsent(uv_timer_t *t)
{
    gateway_t *g = t->data;
    BT_LOG_WARN("answers still unsent 2 s after the drain: exiting");
    uv_stop(g->loop);
}

static void on_drain_timeout(uv_timer_t *t)
{
    gateway_t *g = t->data;
    BT_LOG_WARN("%d requests still running after --drain-timeout: ending them", g->n_in_flight);
    g->cut_off = true;
    bt_rpc_channel_destroy(g->router); /* their on_done answer the clients (503) */
    g->router = NULL;
    uv_timer_start(&g->drain_timer, on_unsent, 2000, 0);
}

/* SIGTERM: stops listening (idle connections close); what is being answered goes on, within
 * --drain-timeout, then the server's close ends the process. */
static void on_stop(void *ctx)
{
    gateway_t *g = ctx;
    if (g->n_in_flight > 0) {
        BT_LOG_INFO("stopping: %d requests being answered finish within %.3g s", g->n_in_flight,
                    (double)g->drain_ms / 1000.0);
        uv_timer_start(&g->drain_timer, on_drain_timeout, (uint64_t)g->drain_ms, 0);
    }
    bt_http_server_close(g->http, on_http_closed, g);
}

int main(int argc, char **argv)
{
    bt_log_set_tag("gateway");
    signal(SIGPIPE, SIG_IGN); /* a client that vanished must not kill the process */
    const char *router = "127.0.0.1:50051", *host = "127.0.0.1", *api_key = NULL, *log_level = "info";
    const char *served = "baton-demo";
    int64_t port = 8888, max_request = 8 << 20, header_timeout = 10000, body_timeout = 30000;
    int64_t max_connections = 4096;
    double request_timeout = 600.0, drain_s = 30.0;
    bool cache_report = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("router", &router, "router gRPC address (default 127.0.0.1:50051)"),
        BT_FLAG_STR("host", &host, "address to listen on (default 127.0.0.1)"),
        BT_FLAG_INT("port", &port, "HTTP port (default 8888; 0 picks one)"),
        BT_FLAG_STR("api-key", &api_key, "require Authorization: Bearer KEY on /v1/*"),
        BT_FLAG_STR("served-model-name", &served, "model name used until the router answers /v1/models"),
        BT_FLAG_INT("max-request-bytes", &max_request, "largest request body (default 8 MiB) -> 413"),
        BT_FLAG_FLOAT("request-timeout", &request_timeout, "seconds a generation may take (default 600) -> 504"),
        BT_FLAG_INT("header-timeout-ms", &header_timeout, "request head deadline (default 10000) -> 408"),
        BT_FLAG_INT("body-timeout-ms", &body_timeout, "request body deadline (default 30000) -> 408"),
        BT_FLAG_INT("max-connections", &max_connections, "open connections (default 4096)"),
        BT_FLAG_FLOAT("drain-timeout", &drain_s, "seconds a stopping gateway finishes its answers in (default 30)"),
        BT_FLAG_BOOL("enable-cache-report", &cache_report, "usage.prompt_tokens_details.cached_tokens"),
        BT_FLAG_STR("log-level", &log_level, "debug, info, warn, error"),
    };
    char err[512];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc - 1, argv + 1, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton-gateway: %s\n", err);
        return 2;
    }
    /* (a --request-timeout under a millisecond would round to 0 ms: no deadline at all) */
    if (bt_log_level_parse(log_level) < 0 || max_request < 1 || request_timeout < 0.001 ||
        header_timeout < 1 || body_timeout < 1 || max_connections < 1 || port < 0 || port > 65535 ||
        drain_s < 0) {
        fprintf(stderr, "baton-gateway: bad flag value (--log-level, --max-request-bytes >= 1, "
                        "--request-timeout >= 0.001, timeouts >= 1, --port 0..65535, "
                        "--drain-timeout >= 0)\n");
        return 2;
    }
    bt_log_set_level((bt_log_level_t)bt_log_level_parse(log_level));
    static gateway_t gg;
    gateway_t *g = &gg;
    g->loop = uv_default_loop();
    g->request_timeout_ms = (int64_t)(request_timeout * 1000.0);
    g->cache_report = cache_report;
    g->drain_ms = (int64_t)(drain_s * 1000.0);
    uv_timer_init(g->loop, &g->drain_timer);
    g->drain_timer.data = g;
    snprintf(g->served, sizeof g->served, "%s", served);
    if (api_key && *api_key) {
        g->api_key = bt_strdup_or_die(api_key);
        g->api_key_len = strlen(api_key);
    }
    g->metrics = bt_metrics_create("baton_gateway");
    g->in_flight = bt_metrics_gauge(g->metrics, "requests_in_flight", "Generations being answered", NULL, NULL);
    g->ttft = bt_metrics_histogram(g->metrics, "time_to_first_token_seconds", "Time to first token",
                                   bt_metrics_latency_buckets, NULL, NULL);
    g->itl = bt_metrics_histogram(g->metrics, "inter_token_latency_seconds", "Time between tokens",
                                  bt_metrics_latency_buckets, NULL, NULL);
    g->e2e = bt_metrics_histogram(g->metrics, "request_latency_seconds", "Whole request latency",
                                  bt_metrics_latency_buckets, NULL, NULL);
    if ((st = bt_rpc_create(g->loop, &g->rpc)) != BT_OK || (st = bt_rpc_channel_create(g->rpc, router, NULL, &g->router)) != BT_OK) {
        fprintf(stderr, "baton-gateway: cannot reach the router at %s: %s\n", router, bt_status_str(st));
        return 1;
    }
    bt_http_limits_t lim = bt_http_limits_default();
    lim.max_body_bytes = (size_t)max_request;
    lim.header_timeout_ms = (int)header_timeout;
    lim.body_timeout_ms = (int)body_timeout;
    lim.max_connections = (int)max_connections;
    lim.error_body = error_body;
    /* a client that closes its end is gone (an SDK's timeout, Ctrl-C): its generation stops
     * rather than holding a decode place to the end, unread, while the SDK retries */
    lim.eof_cancels = true;
    if ((st = bt_http_server_create(g->loop, host, (int)port, &lim, on_request, g, &g->http)) != BT_OK) {
        fprintf(stderr, "baton-gateway: cannot listen on %s:%lld: %s\n", host, (long long)port, bt_status_str(st));
        return 1;
    }
    printf("baton-gateway listening on %s:%d\n", host, bt_http_server_port(g->http));
    fflush(stdout);
    BT_LOG_INFO("OpenAI API on http://%s:%d (router %s)%s", host, bt_http_server_port(g->http), router,
                g->api_key ? ", API key required" : "");
    bt_service_on_signal(g->loop, on_stop, g);
    uv_run(g->loop, UV_RUN_DEFAULT);
    BT_LOG_INFO("stopped");
    return 0;
}

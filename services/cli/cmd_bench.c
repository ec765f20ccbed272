/* baton bench: a load generator for the gateway (HTTP, OpenAI streaming) or the router
 * (gRPC, baton.v1.Baton/Generate). Flags follow sglang.bench_serving where the concept is
 * the same. Tokens are counted from token ids (the gateway's "return_token_ids" extension;
 * the router's GenerateResponse.token_ids), never from SSE chunks.
 *
 * One libuv loop drives every request. A run issues --num-prompts requests (or runs for
 * --duration seconds) with at most --max-concurrency in flight, arriving all at once or as
 * a Poisson process of --request-rate; --sweep-concurrency / --sweep-input-len repeat the
 * run per level. Requests refused by admission (HTTP 429, RESOURCE_EXHAUSTED) are counted
 * as the error kind "refused" and stay out of the latency figures. */
#include "services/cli/bench.h"
#include "services/cli/cli.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"

#include <cjson/cJSON.h>
#include <llhttp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define MAX_LEVELS 32

typedef struct bench bench_t;

typedef struct {
    bench_t *b;
    int index;                /* into run->results */
    bench_result_t *res;
    double t_start, t_last;   /* ms, uv_hrtime */
    bool got_first, finished, closed, done;
    /* HTTP */
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t write;
    uv_timer_t timer;
    int handles_open;
    llhttp_t parser;
    char *body;               /* the request body */
    char *head;               /* request line + headers */
    char *sse;                /* unparsed SSE bytes */
    size_t sse_len, sse_cap;
    int status;
    bool saw_ids;
    /* gRPC */
    bt_rpc_client_call_t *call;
} req_t;

struct bench {
    uv_loop_t *loop;
    /* target */
    bool grpc;
    char host[320];
    int port;
    char path_prefix[320];
    bt_rpc_t *rpc;
    bt_rpc_channel_t *ch;
    const char *model, *api_key, *dataset;
    bool chat;
    /* workload */
    int vocab;
    /* --shared-prefix-len: prompt i starts with shared prefix i % prefix_groups (token ids, or
     * the text of a system message), then its own random part */
    int prefix_len, prefix_groups;
    int32_t **prefix_ids;
    char **prefix_text;
    double range_ratio, temperature, chars_per_token;
    bool ignore_eos;
    uint64_t rng;
    double timeout_ms;
    /* the run in flight */
    bench_run_t *run;
    int target;               /* requests to issue */
    int issued, finished, in_flight;
    double t_run_start, next_arrival, duration_ms, deadline_ms;
    bool warmup, stop_issuing;
    uv_timer_t tick;
    bool progress;
    const char *label;
    llhttp_settings_t settings;
};

static double now_ms(void)
{
    return (double)uv_hrtime() / 1e6;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* A length in [len * ratio, len] (sglang's --random-range-ratio). */
static int draw_len(bench_t *b, int len)
{
    int lo = (int)ceil(len * b->range_ratio);
    if (lo < 1) lo = 1;
    if (lo >= len) return len;
    return lo + (int)(rng_next(&b->rng) % (uint64_t)(len - lo + 1));
}

/* ---- workloads ------------------------------------------------------------------------- */

static const char *prose_words[] = {"the", "river", "carried", "light", "across", "a", "quiet", "valley", "where",
                                    "farmers", "had", "planted", "barley", "since", "their", "grandparents", "first",
                                    "measured", "rain", "and", "wrote", "it", "down", "in", "ledgers", "of", "old",
                                    "winters", "evening", "market", "bells"};
static const char *code_lines[] = {"for (int i = 0; i < n; i++) {\n", "    sum += values[i] * weights[i];\n", "}\n",
                                   "static int parse_header(const char *p, size_t len)\n", "    if (!p) return -1;\n",
                                   "def merge(a, b):\n", "    return sorted(a + b, key=lambda x: x.rank)\n",
                                   "    while queue:\n", "        node = queue.pop()\n", "#include <stdio.h>\n"};
static const char *fields[] = {"id", "name", "status", "created_at", "owner", "priority", "tags", "region", "size", "score"};

/* Builds the prompt text of a text workload, about n tokens long. Caller frees. */
static char *make_text(bench_t *b, int n)
{
    size_t target = (size_t)(n * b->chars_per_token) + 1, len = 0, cap = target + 256;
    char *s = bt_malloc_or_die(cap);
    s[0] = 0;
    int k = 0;
    if (!strcmp(b->dataset, "structured")) len += (size_t)snprintf(s, cap, "Fill in the table.\n| key | value |\n|---|---|\n");
    if (!strcmp(b->dataset, "json")) len += (size_t)snprintf(s, cap, "Complete this JSON array: [");
    while (len < target) {
        char piece[160];
        uint64_t r = rng_next(&b->rng);
        if (!strcmp(b->dataset, "code"))
            snprintf(piece, sizeof piece, "%s", code_lines[r % BT_COUNTOF(code_lines)]);
        else if (!strcmp(b->dataset, "structured"))
            snprintf(piece, sizeof piece, "| %s | %llu |\n", fields[r % BT_COUNTOF(fields)], (unsigned long long)(r >> 40));
        else if (!strcmp(b->dataset, "json"))
            snprintf(piece, sizeof piece, "{\"%s\": %llu, \"%s\": \"%s\"}, ", fields[r % BT_COUNTOF(fields)],
                     (unsigned long long)(r >> 44), fields[(r >> 8) % BT_COUNTOF(fields)],
                     prose_words[(r >> 16) % BT_COUNTOF(prose_words)]);
        else
            snprintf(piece, sizeof piece, "%s%s", prose_words[r % BT_COUNTOF(prose_words)], ++k % 12 ? " " : ". ");
        size_t pl = strlen(piece);
        if (len + pl + 1 > cap) break;
        memcpy(s + len, piece, pl + 1);
        len += pl;
    }
    return s;
}

/* ---- results --------------------------------------------------------------------------- */

static void maybe_issue(bench_t *b);

static void on_tokens(req_t *q, int n, double t)
{
    if (n <= 0) return;
    if (!q->got_first) {
        q->got_first = true;
        q->res->ttft = t - q->t_start;
    } else if (!q->b->warmup) {
        double gap = (t - q->t_last) / n; /* a chunk may carry several tokens (speculative) */
        for (int i = 0; i < n; i++) bench_run_add_itl(q->b->run, gap);
    }
    q->t_last = t;
    q->res->output_tokens += n;
}

/* The request is over (ok, or with the error kind). */
static void req_end(req_t *q, const char *error)
{
    if (q->done) return;
    q->done = true;
    bench_t *b = q->b;
    bench_result_t *r = q->res;
    double t = now_ms();
    if (!error && !q->finished) error = "incomplete";
    if (!error && !q->got_first) error = "no_tokens";
    if (error) {
        r->ok = false;
        snprintf(r->error, sizeof r->error, "%s", error);
    } else {
        r->ok = true;
        r->e2e = t - q->t_start;
        r->tpot = r->output_tokens > 1 ? (t - q->t_start - r->ttft) / (r->output_tokens - 1) : -1;
    }
    b->in_flight--;
    b->finished++;
}

static void req_free_http(uv_handle_t *h)
{
    req_t *q = h->data;
    if (--q->handles_open > 0) return;
    free(q->body);
    free(q->head);
    free(q->sse);
    bench_t *b = q->b;
    free(q);
    maybe_issue(b);
}

static void http_close(req_t *q)
{
    if (q->closed) return;
    q->closed = true;
    uv_timer_stop(&q->timer);
    uv_close((uv_handle_t *)&q->timer, req_free_http);
    uv_close((uv_handle_t *)&q->tcp, req_free_http);
}

static void http_fail(req_t *q, const char *kind)
{
    req_end(q, kind);
    http_close(q);
}

/* One SSE event's data. */
static void sse_event(req_t *q, const char *data, double t)
{
    if (!strcmp(data, "[DONE]")) {
        q->finished = true;
        return;
    }
    cJSON *o = cJSON_Parse(data);
    if (!o) return;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err) {
        if (!q->done) req_end(q, "stream_error");
        cJSON_Delete(o);
        return;
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    if (ch) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ch, "token_ids");
        if (cJSON_IsArray(ids)) {
            q->saw_ids = true;
            on_tokens(q, cJSON_GetArraySize(ids), t);
        } else if (!q->saw_ids) { /* a server without token ids: one token per text chunk */
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
            const cJSON *text = d ? cJSON_GetObjectItemCaseSensitive(d, "content") : cJSON_GetObjectItemCaseSensitive(ch, "text");
            if (cJSON_IsString(text) && *text->valuestring) on_tokens(q, 1, t);
        }
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    const cJSON *pt = usage ? cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens") : NULL;
    if (cJSON_IsNumber(pt)) q->res->input_tokens = pt->valueint;
    const cJSON *details = usage ? cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details") : NULL;
    const cJSON *ct = details ? cJSON_GetObjectItemCaseSensitive(details, "cached_tokens") : NULL;
    if (cJSON_IsNumber(ct)) q->res->cached_tokens = ct->valueint;
    cJSON_Delete(o);
}

static int on_headers_complete(llhttp_t *p)
{
    req_t *q = p->data;
    q->status = p->status_code;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    req_t *q = p->data;
    if (q->sse_len + len + 1 > q->sse_cap) {
        q->sse_cap = (q->sse_len + len + 1) * 2;
        q->sse = bt_realloc_or_die(q->sse, q->sse_cap);
    }
    memcpy(q->sse + q->sse_len, at, len);
    q->sse_len += len;
    q->sse[q->sse_len] = 0;
    if (q->status != 200) return 0; /* an error body: read whole */
    double t = now_ms();
    char *start = q->sse, *end;
    while ((end = strstr(start, "\n\n"))) {
        *end = 0;
        for (char *line = start; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = 0;
            if (!strncmp(line, "data: ", 6)) sse_event(q, line + 6, t);
            line = nl ? nl + 1 : NULL;
        }
        start = end + 2;
    }
    size_t rest = q->sse_len - (size_t)(start - q->sse);
    memmove(q->sse, start, rest);
    q->sse_len = rest;
    q->sse[rest] = 0;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    req_t *q = p->data;
    if (q->status == 429)
        req_end(q, "refused");
    else if (q->status != 200) {
        char kind[32];
        snprintf(kind, sizeof kind, "http_%d", q->status);
        req_end(q, kind);
    } else {
        req_end(q, NULL);
    }
    http_close(q);
    return HPE_PAUSED;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    buf->base = bt_malloc_or_die(suggested);
    buf->len = suggested;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    req_t *q = s->data;
    if (n > 0 && !q->closed) {
        llhttp_errno_t e = llhttp_execute(&q->parser, buf->base, (size_t)n);
        if (e != HPE_OK && e != HPE_PAUSED && !q->closed) http_fail(q, "bad_response");
    } else if (n < 0 && !q->closed) {
        if (n == UV_EOF) llhttp_finish(&q->parser);
        if (!q->closed) http_fail(q, q->status ? "connection_closed" : "connection_reset");
    }
    free(buf->base);
}

static void on_written(uv_write_t *w, int status)
{
    req_t *q = w->data;
    if (status < 0 && !q->closed) http_fail(q, "connection_reset");
}

static void on_connected(uv_connect_t *c, int status)
{
    req_t *q = c->data;
    if (q->closed) return;
    if (status < 0) {
        http_fail(q, "connect");
        return;
    }
    q->t_start = now_ms(); /* latency counts from the request on the wire */
    q->res->t_send = q->t_start - q->b->t_run_start;
    uv_buf_t bufs[2] = {uv_buf_init(q->head, (unsigned)strlen(q->head)), uv_buf_init(q->body, (unsigned)strlen(q->body))};
    q->write.data = q;
    uv_write(&q->write, (uv_stream_t *)&q->tcp, bufs, 2, on_written);
    uv_read_start((uv_stream_t *)&q->tcp, on_alloc, on_read);
}

static void on_req_timeout(uv_timer_t *t)
{
    req_t *q = t->data;
    if (q->b->grpc) {
        if (q->call) bt_rpc_client_cancel(q->call);
        return;
    }
    http_fail(q, "timeout");
}

/* A random prompt id. */
static int32_t random_id(bench_t *b)
{
    return (int32_t)(16 + rng_next(&b->rng) % (uint64_t)(b->vocab - 16));
}

/* Chat messages of request `index`: its shared prefix as a system message (if any), then a
 * user message of about in_len tokens. */
static cJSON *chat_messages(bench_t *b, int index, int in_len)
{
    cJSON *msgs = cJSON_CreateArray();
    if (b->prefix_len) {
        cJSON *sys = cJSON_CreateObject();
        cJSON_AddStringToObject(sys, "role", "system");
        cJSON_AddStringToObject(sys, "content", b->prefix_text[index % b->prefix_groups]);
        cJSON_AddItemToArray(msgs, sys);
    }
    char *text = make_text(b, in_len);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", text);
    cJSON_AddItemToArray(msgs, m);
    free(text);
    return msgs;
}

/* The token ids of request `index` (its shared prefix, if any, then in_len random ids);
 * *n_p: how many. Caller frees. */
static int32_t *prompt_ids(bench_t *b, int index, int in_len, int *n_p)
{
    const int n = b->prefix_len + in_len;
    int32_t *ids = bt_malloc_or_die((size_t)n * sizeof *ids);
    if (b->prefix_len)
        memcpy(ids, b->prefix_ids[index % b->prefix_groups], (size_t)b->prefix_len * sizeof *ids);
    for (int i = b->prefix_len; i < n; i++)
        ids[i] = random_id(b);
    *n_p = n;
    return ids;
}

/* The JSON body of one request. */
static char *http_body(bench_t *b, int index, int in_len, int out_len)
{
    cJSON *o = cJSON_CreateObject();
    if (b->model) cJSON_AddStringToObject(o, "model", b->model);
    if (b->chat) {
        cJSON_AddItemToObject(o, "messages", chat_messages(b, index, in_len));
    } else {
        int n;
        int32_t *ids = prompt_ids(b, index, in_len, &n);
        cJSON *p = cJSON_AddArrayToObject(o, "prompt");
        for (int i = 0; i < n; i++)
            cJSON_AddItemToArray(p, cJSON_CreateNumber((double)ids[i]));
        free(ids);
    }
    cJSON_AddNumberToObject(o, "max_tokens", out_len);
    cJSON_AddNumberToObject(o, "temperature", b->temperature);
    cJSON_AddBoolToObject(o, "ignore_eos", b->ignore_eos);
    cJSON_AddBoolToObject(o, "stream", true);
    cJSON_AddBoolToObject(o, "return_token_ids", true);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(o, "stream_options"), "include_usage", true);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void start_http(bench_t *b, req_t *q, int in_len, int out_len)
{
    q->body = http_body(b, q->index, in_len, out_len);
    size_t hl = 1024 + (b->api_key ? strlen(b->api_key) : 0);
    q->head = bt_malloc_or_die(hl);
    snprintf(q->head, hl,
             "POST %s/v1/%s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
             "Connection: close\r\nContent-Length: %zu\r\n%s%s%s\r\n",
             b->path_prefix, b->chat ? "chat/completions" : "completions", b->host, b->port, strlen(q->body),
             b->api_key ? "Authorization: Bearer " : "", b->api_key ? b->api_key : "", b->api_key ? "\r\n" : "");
    llhttp_init(&q->parser, HTTP_RESPONSE, &b->settings);
    q->parser.data = q;
    uv_tcp_init(b->loop, &q->tcp);
    uv_timer_init(b->loop, &q->timer);
    q->handles_open = 2;
    q->tcp.data = q->timer.data = q->connect.data = q;
    uv_timer_start(&q->timer, on_req_timeout, (uint64_t)b->timeout_ms, 0);
    struct sockaddr_in addr;
    int rc = uv_ip4_addr(b->host, b->port, &addr);
    if (rc == 0) rc = uv_tcp_connect(&q->connect, &q->tcp, (const struct sockaddr *)&addr, on_connected);
    if (rc != 0) http_fail(q, "connect");
}

/* ---- gRPC ------------------------------------------------------------------------------ */

static void grpc_free(uv_handle_t *h)
{
    req_t *q = h->data;
    bench_t *b = q->b;
    free(q);
    maybe_issue(b);
}

static void on_grpc_message(void *ctx, const uint8_t *msg, size_t len)
{
    req_t *q = ctx;
    Baton__V1__GenerateResponse *r = BT_PROTO_UNPACK(baton__v1__generate_response, msg, len);
    if (!r) return;
    on_tokens(q, (int)r->n_token_ids, now_ms());
    if (r->finish_reason != BATON__V1__FINISH_REASON__FINISH_NONE) q->finished = true;
    if (r->usage && r->usage->prompt_tokens > 0) q->res->input_tokens = r->usage->prompt_tokens;
    if (r->usage) q->res->cached_tokens = r->usage->cached_tokens;
    BT_PROTO_FREE(baton__v1__generate_response, r);
}

static void on_grpc_done(void *ctx, bt_rpc_code_t code, const char *message)
{
    req_t *q = ctx;
    q->call = NULL;
    char kind[48];
    if (code == BT_RPC_OK)
        req_end(q, NULL);
    else if (code == BT_RPC_RESOURCE_EXHAUSTED)
        req_end(q, "refused");
    else if (code == BT_RPC_DEADLINE_EXCEEDED || (code == BT_RPC_CANCELLED && now_ms() - q->t_start >= q->b->timeout_ms))
        req_end(q, "timeout");
    else {
        snprintf(kind, sizeof kind, "grpc_%s", bt_rpc_code_name(code));
        req_end(q, kind);
    }
    uv_timer_stop(&q->timer);
    uv_close((uv_handle_t *)&q->timer, grpc_free);
}

static void start_grpc(bench_t *b, req_t *q, int in_len, int out_len)
{
    Baton__V1__GenerateRequest g = BATON__V1__GENERATE_REQUEST__INIT;
    Baton__V1__TokenIds tids = BATON__V1__TOKEN_IDS__INIT;
    Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
    int32_t *ids = NULL;
    char *chat = NULL;
    if (b->chat) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "messages", chat_messages(b, q->index, in_len));
        chat = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        g.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_CHAT_JSON;
        g.chat_json = chat;
    } else {
        int n;
        ids = prompt_ids(b, q->index, in_len, &n);
        tids.n_ids = (size_t)n;
        tids.ids = ids;
        g.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
        g.token_ids = &tids;
    }
    if (b->model) g.model = (char *)b->model;
    sp.temperature = (float)b->temperature;
    sp.top_p = 1.0f;
    sp.max_tokens = out_len;
    sp.ignore_eos = b->ignore_eos;
    g.sampling = &sp;
    g.skip_special_tokens = 1;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&g.base, &buf, &len);
    free(ids);
    free(chat);
    uv_timer_init(b->loop, &q->timer);
    q->timer.data = q;
    q->t_start = now_ms();
    q->res->t_send = q->t_start - b->t_run_start;
    if (bt_rpc_stream(b->ch, "/baton.v1.Baton/Generate", buf, len, (int64_t)b->timeout_ms, on_grpc_message,
                      on_grpc_done, q, &q->call) != BT_OK)
        on_grpc_done(q, BT_RPC_UNAVAILABLE, "cannot start the call");
    free(buf);
}

/* ---- scheduling ------------------------------------------------------------------------ */

static void issue_one(bench_t *b)
{
    bench_run_t *run = b->run;
    req_t *q = bt_calloc_or_die(1, sizeof *q);
    q->b = b;
    q->index = b->issued++;
    q->res = &run->results[q->index];
    int in_len = draw_len(b, run->input_len), out_len = draw_len(b, run->output_len);
    q->res->input_tokens = in_len + b->prefix_len;
    b->in_flight++;
    q->t_start = now_ms();
    if (b->grpc)
        start_grpc(b, q, in_len, out_len);
    else
        start_http(b, q, in_len, out_len);
}

/* Issues what the concurrency limit and the arrival process allow now. */
static void maybe_issue(bench_t *b)
{
    bench_run_t *run = b->run;
    double t = now_ms();
    if (b->duration_ms > 0 && t - b->t_run_start >= b->duration_ms) b->stop_issuing = true;
    if (t >= b->deadline_ms) b->stop_issuing = true;
    while (!b->stop_issuing && b->issued < b->target && (run->concurrency <= 0 || b->in_flight < run->concurrency)) {
        if (run->request_rate > 0 && !b->warmup) {
            if (t < b->next_arrival) break;
            /* exponential gaps: a Poisson process of request_rate per second */
            b->next_arrival += -log(1.0 - rng_uniform(&b->rng)) * 1000.0 / run->request_rate;
        }
        issue_one(b);
    }
}

static void draw_progress(bench_t *b, bool last)
{
    if (!b->progress) return;
    int width = 30, done = b->target ? (int)((double)b->finished / b->target * width) : 0;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '-';
    bar[width] = 0;
    int errors = 0;
    for (int i = 0; i < b->issued; i++)
        if (b->run->results[i].error[0]) errors++;
    fprintf(stderr, "\r%-18s [%s] %d/%d done, %d in flight, %d errors, %.1f s ", b->label, bar, b->finished, b->target,
            b->in_flight, errors, (now_ms() - b->t_run_start) / 1000.0);
    if (last) fprintf(stderr, "\n");
    fflush(stderr);
}

static void on_tick(uv_timer_t *t)
{
    bench_t *b = t->data;
    maybe_issue(b);
    draw_progress(b, false);
    if (now_ms() >= b->deadline_ms) b->stop_issuing = true;
    if (b->in_flight == 0 && (b->stop_issuing || b->issued >= b->target)) uv_stop(b->loop);
}

/* Runs b->run to its end: every issued request finished. Bounded by max_time_ms. */
static void drive(bench_t *b, double max_time_ms)
{
    bench_run_t *run = b->run;
    b->issued = b->finished = b->in_flight = 0;
    b->stop_issuing = false;
    b->t_run_start = now_ms();
    b->next_arrival = b->t_run_start;
    b->deadline_ms = b->t_run_start + max_time_ms;
    uv_timer_start(&b->tick, on_tick, 5, 5);
    maybe_issue(b);
    while (b->in_flight > 0 || (!b->stop_issuing && b->issued < b->target)) {
        uv_run(b->loop, UV_RUN_DEFAULT);
        if (now_ms() > b->deadline_ms + b->timeout_ms + 5000) break; /* a request outlived its own timeout */
    }
    uv_timer_stop(&b->tick);
    run->duration_s = (now_ms() - b->t_run_start) / 1000.0;
    run->n_results = b->issued;
    draw_progress(b, true);
}

static int parse_list(const char *s, int *out, int max, const char *flag)
{
    int32_t *v;
    int n;
    char err[128];
    if (bt_flags_parse_int_list(s, &v, &n, err, sizeof err) != BT_OK || n < 1 || n > max) {
        fprintf(stderr, "baton bench: --%s: a comma-separated list of 1..%d positive integers\n", flag, max);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (v[i] < 1) {
            free(v);
            fprintf(stderr, "baton bench: --%s: values must be positive\n", flag);
            return -1;
        }
        out[i] = v[i];
    }
    free(v);
    return n;
}

static bool parse_base_url(bench_t *b, const char *url)
{
    const char *p = url;
    if (!strncmp(p, "http://", 7)) p += 7;
    else if (strstr(p, "://")) return false;
    const char *slash = strchr(p, '/');
    size_t hp = slash ? (size_t)(slash - p) : strlen(p);
    char hostport[300];
    if (strlen(p) >= 300) return false;
    if (hp >= sizeof hostport) return false;
    memcpy(hostport, p, hp);
    hostport[hp] = 0;
    char *colon = strrchr(hostport, ':');
    b->port = 80;
    if (colon) {
        *colon = 0;
        b->port = atoi(colon + 1);
    }
    snprintf(b->host, sizeof b->host, "%s", !strcmp(hostport, "localhost") ? "127.0.0.1" : hostport);
    snprintf(b->path_prefix, sizeof b->path_prefix, "%s", slash ? slash : "");
    size_t pl = strlen(b->path_prefix);
    if (pl >= 3 && !strcmp(b->path_prefix + pl - 3, "/v1")) b->path_prefix[pl - 3] = 0;
    pl = strlen(b->path_prefix);
    if (pl && b->path_prefix[pl - 1] == '/') b->path_prefix[pl - 1] = 0;
    struct sockaddr_in a;
    return b->port > 0 && b->port < 65536 && uv_ip4_addr(b->host, b->port, &a) == 0;
}

int bt_cli_bench(int argc, char **argv)
{
    const char *base_url = NULL, *router = NULL, *backend = NULL, *output = NULL, *dataset = "random";
    const char *model = NULL, *api_key = NULL, *sweep_c = NULL, *sweep_in = NULL, *endpoint = NULL;
    int64_t num_prompts = 100, max_concurrency = 0, input_len = 1024, output_len = 128, seed = 1, warmup = 1;
    int64_t vocab = 256, per_level = 0, sim_groups = 1, sim_max_running = 16, sim_prefill_groups = 1;
    int64_t prefix_len = 0, prefix_groups = 1;
    double rate = 0, range_ratio = 1.0, duration = 0, timeout = 600, slo_ttft = 0, slo_tpot = 0, temperature = 0;
    double max_time = 3600, chars_per_token = 4.0;
    double sim_tps = 0, sim_base = 0, sim_per_seq = 0, sim_per_kctx = 0;
    bool no_plot = false, disable_progress = false, disable_ignore_eos = false, simulated = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("base-url", &base_url, "gateway URL, e.g. http://127.0.0.1:8888 (HTTP, OpenAI streaming)"),
        BT_FLAG_STR("router", &router, "router host:port: drive baton.v1.Baton/Generate over gRPC instead"),
        BT_FLAG_STR("backend", &backend, "http or grpc (default: from --base-url / --router)"),
        BT_FLAG_STR("endpoint", &endpoint, "HTTP: completions (token-id prompts) or chat (default: chat for text datasets)"),
        BT_FLAG_STR("dataset-name", &dataset, "random (token ids), prose, code, structured, json (text prompts)"),
        BT_FLAG_STR("model", &model, "model name to ask for (default: the served one)"),
        BT_FLAG_STR("api-key", &api_key, "bearer token for the gateway"),
        BT_FLAG_INT("num-prompts", &num_prompts, "requests per run (default 100)"),
        BT_FLAG_FLOAT("duration", &duration, "seconds to keep issuing (0 = until --num-prompts are issued)"),
        BT_FLAG_INT("max-concurrency", &max_concurrency, "most requests in flight (0 = unlimited)"),
        BT_FLAG_FLOAT("request-rate", &rate, "Poisson arrivals per second (0 or inf = all at once)"),
        BT_FLAG_INT("random-input-len", &input_len, "prompt tokens (default 1024)"),
        BT_FLAG_INT("random-output-len", &output_len, "new tokens (default 128)"),
        BT_FLAG_FLOAT("random-range-ratio", &range_ratio, "lengths uniform in [len*ratio, len] (default 1: fixed)"),
        BT_FLAG_INT("shared-prefix-len", &prefix_len, "prompts start with a shared prefix of this many tokens (a system message in chat)"),
        BT_FLAG_INT("shared-prefix-groups", &prefix_groups, "distinct shared prefixes, taken in turn (default 1)"),
        BT_FLAG_INT("seed", &seed, "seed of prompts, lengths and arrivals (default 1)"),
        BT_FLAG_INT("warmup-requests", &warmup, "requests before the measured runs, not counted (default 1)"),
        BT_FLAG_FLOAT("temperature", &temperature, "sampling temperature (default 0)"),
        BT_FLAG_BOOL("disable-ignore-eos", &disable_ignore_eos, "let requests stop at the end-of-sequence token"),
        BT_FLAG_INT("vocab-size", &vocab, "random prompts draw ids from [16, vocab-size) (default 256)"),
        BT_FLAG_FLOAT("chars-per-token", &chars_per_token, "text datasets: prompt characters per asked token (default 4)"),
        BT_FLAG_FLOAT("timeout", &timeout, "seconds one request may take (default 600)"),
        BT_FLAG_FLOAT("max-time", &max_time, "seconds a run may issue requests for (default 3600)"),
        BT_FLAG_FLOAT("slo-ttft-ms", &slo_ttft, "goodput: TTFT bound in ms"),
        BT_FLAG_FLOAT("slo-tpot-ms", &slo_tpot, "goodput: TPOT bound in ms"),
        BT_FLAG_STR("sweep-concurrency", &sweep_c, "runs, one per max concurrency: 1,2,4,...,256"),
        BT_FLAG_STR("sweep-input-len", &sweep_in, "runs, one per prompt length: 4096,8192,... (prefill sweep)"),
        BT_FLAG_INT("num-prompts-per-concurrency", &per_level, "sweep: a level issues max(num-prompts, this x concurrency)"),
        BT_FLAG_STR("output", &output, "write the figures as JSON to FILE.json (plots beside it)"),
        BT_FLAG_BOOL("no-plot", &no_plot, "skip the gnuplot PNGs"),
        BT_FLAG_BOOL("disable-progress", &disable_progress, "no progress bar"),
        BT_FLAG_BOOL("simulated", &simulated, "the target runs simulated workers: report overhead beyond the timing model"),
        BT_FLAG_FLOAT("sim-prefill-tokens-per-s", &sim_tps, "timing model as given to the workers (default 5000)"),
        BT_FLAG_FLOAT("sim-decode-step-ms-base", &sim_base, "timing model (default 10)"),
        BT_FLAG_FLOAT("sim-decode-step-ms-per-seq", &sim_per_seq, "timing model (default 2.2)"),
        BT_FLAG_FLOAT("sim-decode-step-ms-per-kctx", &sim_per_kctx, "timing model (default 0.02)"),
        BT_FLAG_INT("sim-prefill-groups", &sim_prefill_groups, "prefill groups of the target (default 1)"),
        BT_FLAG_INT("sim-decode-groups", &sim_groups, "decode groups of the target (default 1)"),
        BT_FLAG_INT("sim-max-running-requests", &sim_max_running, "batch limit of a decode group (default 16)"),
    };
    char err[512];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton bench: %s\n", err);
        return 2;
    }
    static bench_t bb;
    bench_t *b = &bb;
    memset(b, 0, sizeof *b);
    if (backend && strcmp(backend, "http") && strcmp(backend, "grpc")) {
        fprintf(stderr, "baton bench: --backend must be http or grpc\n");
        return 2;
    }
    b->grpc = backend ? !strcmp(backend, "grpc") : (router && !base_url);
    if (b->grpc && !router) router = "127.0.0.1:50051";
    if (!b->grpc && !parse_base_url(b, base_url ? base_url : "http://127.0.0.1:8888")) {
        fprintf(stderr, "baton bench: --base-url must be http://IPV4-OR-localhost:PORT[/prefix]\n");
        return 2;
    }
    if (strcmp(dataset, "random") && strcmp(dataset, "prose") && strcmp(dataset, "code") &&
        strcmp(dataset, "structured") && strcmp(dataset, "json")) {
        fprintf(stderr, "baton bench: --dataset-name: random, prose, code, structured or json\n");
        return 2;
    }
    if (num_prompts < 1 || num_prompts > 10000000 || input_len < 1 || input_len > (1 << 22) || output_len < 1 ||
        output_len > (1 << 22) || max_concurrency < 0 || rate < 0 || range_ratio < 0 || range_ratio > 1 ||
        vocab < 17 || timeout <= 0 || max_time <= 0 || warmup < 0 || chars_per_token <= 0 || per_level < 0 ||
        prefix_len < 0 || prefix_len > (1 << 22) || prefix_groups < 1 || prefix_groups > 4096) {
        fprintf(stderr, "baton bench: bad flag value (--num-prompts >= 1, lengths >= 1, --random-range-ratio in "
                        "[0,1], --vocab-size > 16, --timeout and --max-time > 0, --shared-prefix-len >= 0, "
                        "--shared-prefix-groups 1..4096)\n");
        return 2;
    }
    if (sweep_c && sweep_in) {
        fprintf(stderr, "baton bench: one of --sweep-concurrency and --sweep-input-len at a time\n");
        return 2;
    }
    if (endpoint && strcmp(endpoint, "completions") && strcmp(endpoint, "chat")) {
        fprintf(stderr, "baton bench: --endpoint must be completions or chat\n");
        return 2;
    }
    b->dataset = dataset;
    b->chat = strcmp(dataset, "random") != 0;
    if (endpoint) b->chat = !strcmp(endpoint, "chat");
    if (b->chat && !strcmp(dataset, "random")) b->dataset = "prose";
    b->model = model;
    b->api_key = api_key;
    b->vocab = (int)vocab;
    b->range_ratio = range_ratio;
    b->temperature = temperature;
    b->chars_per_token = chars_per_token;
    b->ignore_eos = !disable_ignore_eos;
    b->rng = (uint64_t)seed * 0x2545f4914f6cdd1dull + 1;
    b->prefix_len = (int)prefix_len;
    b->prefix_groups = (int)prefix_groups;
    if (prefix_len) {
        b->prefix_ids = bt_calloc_or_die((size_t)prefix_groups, sizeof *b->prefix_ids);
        b->prefix_text = bt_calloc_or_die((size_t)prefix_groups, sizeof *b->prefix_text);
        for (int g = 0; g < (int)prefix_groups; g++) {
            b->prefix_ids[g] = bt_malloc_or_die((size_t)prefix_len * sizeof(int32_t));
            for (int i = 0; i < (int)prefix_len; i++)
                b->prefix_ids[g][i] = random_id(b);
            b->prefix_text[g] = make_text(b, (int)prefix_len);
        }
    }
    b->timeout_ms = timeout * 1000.0;
    b->duration_ms = duration * 1000.0;
    b->progress = !disable_progress && isatty(STDERR_FILENO);
    llhttp_settings_init(&b->settings);
    b->settings.on_headers_complete = on_headers_complete;
    b->settings.on_body = on_body;
    b->settings.on_message_complete = on_message_complete;
    bench_model_t sim = {simulated || sim_tps > 0, sim_tps > 0 ? sim_tps : 5000, sim_base > 0 ? sim_base : 10,
                         sim_per_seq > 0 ? sim_per_seq : 2.2, sim_per_kctx > 0 ? sim_per_kctx : 0.02, (int)sim_prefill_groups,
                         (int)sim_groups, (int)sim_max_running};

    int levels[MAX_LEVELS], n_levels = 1;
    levels[0] = (int)(sweep_in ? input_len : max_concurrency);
    if (sweep_c && (n_levels = parse_list(sweep_c, levels, MAX_LEVELS, "sweep-concurrency")) < 0) return 2;
    if (sweep_in && (n_levels = parse_list(sweep_in, levels, MAX_LEVELS, "sweep-input-len")) < 0) return 2;

    b->loop = uv_default_loop();
    uv_timer_init(b->loop, &b->tick);
    b->tick.data = b;
    if (b->grpc && (bt_rpc_create(b->loop, &b->rpc) != BT_OK || bt_rpc_channel_create(b->rpc, router, NULL, &b->ch) != BT_OK)) {
        fprintf(stderr, "baton bench: cannot open a channel to %s\n", router);
        return 1;
    }
    char target[1200];
    if (b->grpc)
        snprintf(target, sizeof target, "%s", router);
    else
        snprintf(target, sizeof target, "http://%s:%d%s", b->host, b->port, b->path_prefix);
    fprintf(stderr, "baton bench: %s %s, dataset %s%s, %d run%s\n", b->grpc ? "gRPC router" : "HTTP gateway", target,
            b->dataset, b->chat ? " (chat)" : " (token ids)", n_levels, n_levels > 1 ? "s" : "");

    int rc = 0;
    if (warmup > 0) { /* not counted: connections, first-use paths */
        bench_run_t w = {0};
        w.concurrency = (int)(max_concurrency > 0 && max_concurrency < warmup ? max_concurrency : warmup);
        w.input_len = (int)(sweep_in ? levels[0] : input_len);
        if (w.input_len > 1024) w.input_len = 1024;
        w.output_len = output_len < 16 ? (int)output_len : 16;
        w.num_prompts = (int)warmup;
        w.results = bt_calloc_or_die((size_t)warmup, sizeof *w.results);
        b->run = &w;
        b->target = (int)warmup;
        b->warmup = true;
        b->label = "warm-up";
        drive(b, max_time * 1000.0);
        int ok = 0;
        for (int i = 0; i < w.n_results; i++) ok += w.results[i].ok;
        if (ok == 0)
            fprintf(stderr, "baton bench: warning: no warm-up request succeeded (%s)\n",
                    w.n_results ? w.results[0].error : "none issued");
        bench_run_free(&w);
        b->warmup = false;
    }

    bench_run_t *runs = bt_calloc_or_die((size_t)n_levels, sizeof *runs);
    for (int l = 0; l < n_levels; l++) {
        bench_run_t *run = &runs[l];
        run->concurrency = (int)(sweep_c ? levels[l] : max_concurrency);
        run->input_len = (int)(sweep_in ? levels[l] : input_len);
        run->output_len = (int)output_len;
        run->request_rate = isinf(rate) ? 0 : rate;
        int n = (int)num_prompts;
        if (sweep_c && per_level > 0 && per_level * run->concurrency > n) n = (int)(per_level * run->concurrency);
        if (duration > 0 && !per_level && num_prompts == 100) n = 200000; /* --duration bounds it */
        run->num_prompts = n;
        run->slo_ttft_ms = slo_ttft;
        run->slo_tpot_ms = slo_tpot;
        run->results = bt_calloc_or_die((size_t)n, sizeof *run->results);
        b->run = run;
        b->target = n;
        char label[64];
        if (sweep_in)
            snprintf(label, sizeof label, "input %d", run->input_len);
        else
            snprintf(label, sizeof label, "concurrency %d", run->concurrency);
        b->label = label;
        drive(b, max_time * 1000.0);
        bench_run_print(run, &sim);
    }

    if (output) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "tool", "baton bench");
        cJSON_AddStringToObject(o, "backend", b->grpc ? "grpc" : "http");
        cJSON_AddStringToObject(o, "target", target);
        cJSON_AddStringToObject(o, "dataset_name", b->dataset);
        cJSON_AddStringToObject(o, "endpoint", b->grpc ? "baton.v1.Baton/Generate" : b->chat ? "/v1/chat/completions" : "/v1/completions");
        cJSON_AddStringToObject(o, "token_counting", "token_ids");
        cJSON_AddNumberToObject(o, "seed", (double)seed);
        cJSON_AddNumberToObject(o, "temperature", temperature);
        cJSON_AddBoolToObject(o, "ignore_eos", b->ignore_eos);
        cJSON_AddNumberToObject(o, "warmup_requests", (double)warmup);
        cJSON_AddStringToObject(o, "sweep", sweep_c ? "concurrency" : sweep_in ? "input_len" : "none");
        if (sim.on) {
            cJSON *m = cJSON_AddObjectToObject(o, "sim_model");
            cJSON_AddNumberToObject(m, "prefill_tokens_per_s", sim.prefill_tokens_per_s);
            cJSON_AddNumberToObject(m, "decode_step_ms_base", sim.step_ms_base);
            cJSON_AddNumberToObject(m, "decode_step_ms_per_seq", sim.step_ms_per_seq);
            cJSON_AddNumberToObject(m, "decode_step_ms_per_kctx", sim.step_ms_per_kctx);
            cJSON_AddNumberToObject(m, "prefill_groups", sim.prefill_groups);
            cJSON_AddNumberToObject(m, "decode_groups", sim.decode_groups);
            cJSON_AddNumberToObject(m, "max_running_requests", sim.max_running);
        }
        cJSON *arr = cJSON_AddArrayToObject(o, "runs");
        for (int l = 0; l < n_levels; l++) cJSON_AddItemToArray(arr, bench_run_json(&runs[l], &sim));
        char *s = cJSON_Print(o);
        cJSON_Delete(o);
        FILE *f = fopen(output, "w");
        if (!f || fputs(s, f) < 0 || fputc('\n', f) < 0) {
            fprintf(stderr, "baton bench: cannot write %s\n", output);
            rc = 1;
        }
        if (f) fclose(f);
        free(s);
        if (!rc) fprintf(stderr, "baton bench: wrote %s\n", output);
        if (!rc && !no_plot) {
            char stem[4096], msg[4400];
            snprintf(stem, sizeof stem, "%s", output);
            size_t sl = strlen(stem);
            if (sl > 5 && !strcmp(stem + sl - 5, ".json")) stem[sl - 5] = 0;
            bench_plot(stem, runs, n_levels, sweep_in ? "input_len" : "concurrency", msg, sizeof msg);
            fprintf(stderr, "baton bench: %s\n", msg);
        }
    }
    for (int l = 0; l < n_levels; l++) bench_run_free(&runs[l]);
    free(runs);
    if (b->grpc) {
        bt_rpc_channel_destroy(b->ch);
        for (int i = 0; i < 20; i++) uv_run(b->loop, UV_RUN_NOWAIT);
        bt_rpc_destroy(b->rpc);
    }
    uv_close((uv_handle_t *)&b->tick, NULL);
    uv_run(b->loop, UV_RUN_NOWAIT);
    for (int g = 0; b->prefix_len && g < b->prefix_groups; g++) {
        free(b->prefix_ids[g]);
        free(b->prefix_text[g]);
    }
    free(b->prefix_ids);
    free(b->prefix_text);
    return rc;
}

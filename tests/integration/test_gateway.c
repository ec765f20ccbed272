/* baton-gateway against hostile and malformed requests, over raw sockets: a table of more
 * than 30 (bad JSON, wrong types, negative or huge max_tokens, unknown roles, empty messages,
 * invalid UTF-8, oversize bodies, endless headers, a slow-loris client, a half-closed
 * socket, ...) each gets its documented status, while a streaming generation on another
 * connection keeps going. Then every service's /metrics passes `promtool check metrics`,
 * and a client that disconnects mid-stream cancels its request end to end. */
#include "bt_test.h"
#include "integration/cluster_util.h"

#include "common/text/tokenizer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static proc_t router, prefill, decode, gateway;
static int gw_port;

/* a connection to the gateway whose reads give up after `wait_s` */
static int connect_gw_wait(int wait_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)gw_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {wait_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int connect_gw(void)
{
    return connect_gw_wait(15);
}

static void send_all(int fd, const char *data, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        data += w;
        n -= (size_t)w;
    }
}

/* Reads until the peer closes (or 15 s); returns the status code of the first response
 * (after any 100 Continue) and leaves the text in out. */
static int read_status(int fd, char *out, size_t cap)
{
    size_t used = 0;
    for (;;) {
        ssize_t r = recv(fd, out + used, cap - 1 - used, 0);
        if (r <= 0) break;
        used += (size_t)r;
        if (used >= cap - 1) break;
    }
    out[used] = 0;
    const char *p = out;
    while (!strncmp(p, "HTTP/1.1 100", 12)) {
        const char *e = strstr(p, "\r\n\r\n");
        if (!e) break;
        p = e + 4;
    }
    int status = 0;
    if (sscanf(p, "HTTP/1.1 %d", &status) != 1) status = -1;
    return status;
}

static char *request(const char *method, const char *path, const char *body, const char *extra)
{
    size_t n = strlen(body) + 1024 + (extra ? strlen(extra) : 0);
    char *r = malloc(n);
    snprintf(r, n, "%s %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n%s",
             method, path, extra ? extra : "", strlen(body), body);
    return r;
}

typedef struct {
    const char *name;
    const char *method, *path, *body;
    int status;
    const char *needle; /* in the response, when set */
} case_t;

#define CHAT "/v1/chat/completions"
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const case_t cases[] = {
    {"bad JSON", "POST", CHAT, "{\"messages\": [", 400, "not valid JSON"},
    {"body not an object", "POST", CHAT, "[1,2,3]", 400, "JSON object"},
    {"no messages", "POST", CHAT, "{\"model\":\"m\"}", 400, "\"param\":\"messages\""},
    {"empty messages", "POST", CHAT, "{\"messages\":[]}", 400, "must not be empty"},
    {"messages not an array", "POST", CHAT, "{\"messages\":\"hi\"}", 400, "must be an array"},
    {"message not an object", "POST", CHAT, "{\"messages\":[42]}", 400, "messages[0]"},
    {"unknown role", "POST", CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
     "messages[0].role"},
    {"role not a string", "POST", CHAT, "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", 400,
     "messages[0].role"},
    {"content a number", "POST", CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
     "messages[0].content"},
    {"user without content", "POST", CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400,
     "messages[0].content"},
    {"temperature a string", "POST", CHAT, "{" MSGS ",\"temperature\":\"hot\"}", 400,
     "\"param\":\"temperature\""},
    {"temperature too high", "POST", CHAT, "{" MSGS ",\"temperature\":5}", 400, "temperature"},
    {"top_p zero", "POST", CHAT, "{" MSGS ",\"top_p\":0}", 400, "top_p"},
    {"negative max_tokens", "POST", CHAT, "{" MSGS ",\"max_tokens\":-1}", 400, "max_tokens"},
    {"zero max_tokens", "POST", CHAT, "{" MSGS ",\"max_tokens\":0}", 400, "max_tokens"},
    {"max_tokens past int64", "POST", CHAT, "{" MSGS ",\"max_tokens\":1e30}", 400, "max_tokens"},
    {"max_tokens fractional", "POST", CHAT, "{" MSGS ",\"max_tokens\":2.5}", 400, "max_tokens"},
    {"huge max_tokens is clamped", "POST", CHAT,
     "{" MSGS ",\"max_tokens\":1000000000000,\"temperature\":0}", 200, "chat.completion"},
    {"n of zero", "POST", CHAT, "{" MSGS ",\"n\":0}", 400, "\"param\":\"n\""},
    {"n past the limit", "POST", CHAT, "{" MSGS ",\"n\":65}", 400, "\"param\":\"n\""},
    {"n of two", "POST", CHAT, "{" MSGS ",\"n\":2,\"max_tokens\":2}", 200, "\"index\":1"},
    {"penalties", "POST", CHAT,
     "{" MSGS ",\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"max_tokens\":2}", 200,
     "chat.completion"},
    {"presence_penalty too high", "POST", CHAT, "{" MSGS ",\"presence_penalty\":2.5}", 400,
     "\"param\":\"presence_penalty\""},
    {"frequency_penalty a string", "POST", CHAT, "{" MSGS ",\"frequency_penalty\":\"x\"}", 400,
     "\"param\":\"frequency_penalty\""},
    {"logit_bias", "POST", CHAT,
     "{" MSGS ",\"logit_bias\":{\"5\":100,\"7\":-3.5},\"max_tokens\":2}", 200, "chat.completion"},
    {"logit_bias not an object", "POST", CHAT, "{" MSGS ",\"logit_bias\":[1]}", 400,
     "\"param\":\"logit_bias\""},
    {"logit_bias key not an id", "POST", CHAT, "{" MSGS ",\"logit_bias\":{\"x\":1}}", 400,
     "\"param\":\"logit_bias\""},
    {"logit_bias too large", "POST", CHAT, "{" MSGS ",\"logit_bias\":{\"5\":101}}", 400,
     "\"param\":\"logit_bias\""},
    {"logit_bias id twice", "POST", CHAT, "{" MSGS ",\"logit_bias\":{\"5\":1,\"05\":2}}", 400,
     "twice"},
    {"penalties of 0 and an empty logit_bias", "POST", CHAT,
     "{" MSGS ",\"presence_penalty\":0,\"frequency_penalty\":0,\"logit_bias\":{},\"max_tokens\":2,"
     "\"temperature\":0}",
     200, "chat.completion"},
    {"stop of numbers", "POST", CHAT, "{" MSGS ",\"stop\":[1,2]}", 400, "\"param\":\"stop\""},
    {"stream not a bool", "POST", CHAT, "{" MSGS ",\"stream\":\"yes\"}", 400, "stream"},
    {"stream_options not an object", "POST", CHAT,
     "{" MSGS ",\"stream\":true,\"stream_options\":3}", 400, "stream_options"},
    {"stream_options without stream", "POST", CHAT,
     "{" MSGS ",\"stream_options\":{\"include_usage\":true}}", 400,
     "only allowed when 'stream' is true"},
    {"top_logprobs without logprobs", "POST", CHAT, "{" MSGS ",\"top_logprobs\":2}", 400,
     "top_logprobs"},
    {"response_format json_schema", "POST", CHAT,
     "{" MSGS ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}",
     400, "\"param\":\"response_format\""},
    {"response_format of another type", "POST", "/v1/completions",
     "{\"prompt\":\"a\",\"response_format\":{\"type\":\"yaml\"}}", 400,
     "\"param\":\"response_format\""},
    {"response_format not an object", "POST", CHAT, "{" MSGS ",\"response_format\":\"json\"}", 400,
     "\"param\":\"response_format\""},
    {"regex not a string", "POST", CHAT, "{" MSGS ",\"regex\":3}", 400, "\"param\":\"regex\""},
    {"regex empty", "POST", CHAT, "{" MSGS ",\"guided_regex\":\"\"}", 400,
     "\"param\":\"guided_regex\""},
    {"regex and response_format", "POST", CHAT,
     "{" MSGS ",\"response_format\":{\"type\":\"json_object\"},\"regex\":\"a+\"}", 400,
     "cannot be asked with a JSON 'response_format'"},
    {"regex twice", "POST", CHAT, "{" MSGS ",\"regex\":\"a\",\"guided_regex\":\"b\"}", 400,
     "cannot be asked with 'regex'"},
    {"regex the router refuses", "POST", "/v1/completions",
     "{\"prompt\":\"a\",\"regex\":\"(a\\\\1)\"}", 400, "regex: backreferences"},
    {"response_format text", "POST", CHAT,
     "{" MSGS ",\"response_format\":{\"type\":\"text\"},\"max_tokens\":2}", 200, "chat.completion"},
    {"bad tool_choice", "POST", CHAT, "{" MSGS ",\"tool_choice\":\"sometimes\"}", 400,
     "tool_choice"},
    {"tools not an array", "POST", CHAT, "{" MSGS ",\"tools\":{}}", 400, "tools"},
    {"unknown model", "POST", CHAT, "{\"model\":\"gpt-nope\"," MSGS "}", 404, "not served"},
    {"bad reasoning effort", "POST", CHAT,
     "{" MSGS ",\"chat_template_kwargs\":{\"thinking\":true},\"reasoning_effort\":\"extreme\"}",
     400, "reasoning_effort"},
    {"completions without prompt", "POST", "/v1/completions", "{\"max_tokens\":3}", 400, "prompt"},
    {"completions batch of two", "POST", "/v1/completions",
     "{\"prompt\":[\"a\",\"b\"],\"max_tokens\":2}", 200, "\"index\":1"},
    {"completions batch past the limit", "POST", "/v1/completions",
     "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":22}", 400, "at most 64 choices"},
    {"completions batch with an empty prompt", "POST", "/v1/completions",
     "{\"prompt\":[\"a\",\"\"]}", 400, "prompt[1]"},
    {"completions token id out of vocabulary", "POST", "/v1/completions",
     "{\"prompt\":[0,99999999]}", 400, "vocabulary"},
    {"completions echo", "POST", "/v1/completions", "{\"prompt\":\"a\",\"echo\":true}", 400,
     "echo"},
    /* the OpenAI form of completions logprobs: a count of alternatives (it was refused as "not a
       bool") */
    {"completions logprobs count", "POST", "/v1/completions",
     "{\"prompt\":\"a\",\"max_tokens\":2,\"logprobs\":2}", 200, "\"top_logprobs\":[{\""},
    {"completions logprobs past 20", "POST", "/v1/completions",
     "{\"prompt\":\"a\",\"logprobs\":21}", 400, "logprobs"},
    {"unknown route", "GET", "/v2/everything", "", 404, "no route"},
    {"GET on chat", "GET", CHAT, "", 405, "not allowed"},
    {"DELETE on models", "DELETE", "/v1/models", "", 405, "not allowed"},
    {"valid chat", "POST", CHAT, "{" MSGS ",\"max_tokens\":3,\"temperature\":0}", 200,
     "\"finish_reason\""},
};

static void run_case(const case_t *c)
{
    int fd = connect_gw();
    BT_CHECK(fd >= 0);
    if (fd < 0) return;
    char *r = request(c->method, c->path, c->body, NULL);
    send_all(fd, r, strlen(r));
    free(r);
    static char out[1 << 16];
    int st = read_status(fd, out, sizeof out);
    close(fd);
    BT_CHECK_MSG(st == c->status, "%s: status %d, want %d: %.300s", c->name, st, c->status, out);
    if (c->needle) BT_CHECK_MSG(strstr(out, c->needle) != NULL, "%s: response lacks '%s': %.300s", c->name, c->needle, out);
    if (st >= 400 && st != 405)
        BT_CHECK_MSG(strstr(out, "{\"error\":{\"message\":") != NULL, "%s: not the OpenAI error shape: %.200s", c->name, out);
}

/* raw byte-level cases: invalid UTF-8, oversize, endless headers, slow clients, half-close */
static int raw_wait(const char *data, size_t n, bool half_close, int pause_ms, char *out,
                    size_t cap, int wait_s)
{
    int fd = connect_gw_wait(wait_s);
    if (fd < 0) return -1;
    send_all(fd, data, n);
    if (pause_ms) usleep((useconds_t)pause_ms * 1000);
    if (half_close) shutdown(fd, SHUT_WR);
    int st = read_status(fd, out, cap);
    close(fd);
    return st;
}

static int raw(const char *data, size_t n, bool half_close, int pause_ms, char *out, size_t cap)
{
    return raw_wait(data, n, half_close, pause_ms, out, cap, 15);
}

static void test_raw_cases(void)
{
    static char out[1 << 16];
    /* invalid UTF-8 inside a JSON string */
    const char bad_utf8[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\xff\"}]}";
    char *r = request("POST", CHAT, bad_utf8, NULL);
    BT_CHECK_EQ_INT(raw(r, strlen(r), false, 0, out, sizeof out), 400);
    BT_CHECK(strstr(out, "UTF-8") != NULL);
    free(r);
    /* a body over --max-request-bytes (64 KiB here), by Content-Length */
    char head[256];
    snprintf(head, sizeof head, "POST " CHAT " HTTP/1.1\r\nHost: gw\r\nContent-Length: 200000\r\n\r\n");
    BT_CHECK_EQ_INT(raw(head, strlen(head), false, 0, out, sizeof out), 413);
    /* ... and by chunked growth */
    {
        size_t n = 100000;
        char *big = malloc(n + 512);
        int o = snprintf(big, 512, "POST " CHAT " HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n", n - 512);
        memset(big + o, 'a', n - 512);
        memcpy(big + o + n - 512, "\r\n0\r\n\r\n", 7);
        BT_CHECK_EQ_INT(raw(big, (size_t)o + n - 512 + 7, false, 0, out, sizeof out), 413);
        free(big);
    }
    /* endless headers: one huge header, then very many */
    {
        size_t n = 40000;
        char *h = malloc(n + 256);
        int o = snprintf(h, 256, "GET /health HTTP/1.1\r\nHost: gw\r\nX-Long: ");
        memset(h + o, 'x', n);
        memcpy(h + o + n, "\r\n\r\n", 4);
        BT_CHECK_EQ_INT(raw(h, (size_t)o + n + 4, false, 0, out, sizeof out), 431);
        o = snprintf(h, 256, "GET /health HTTP/1.1\r\nHost: gw\r\n");
        for (int i = 0; i < 300; i++) o += snprintf(h + o, n + 256 - (size_t)o, "X-H%d: v\r\n", i);
        o += snprintf(h + o, n + 256 - (size_t)o, "\r\n");
        BT_CHECK_EQ_INT(raw(h, (size_t)o, false, 0, out, sizeof out), 431);
        free(h);
    }
    /* garbage instead of HTTP */
    BT_CHECK_EQ_INT(raw("HELLO THERE\r\n\r\n", 15, false, 0, out, sizeof out), 400);
    /* slow-loris: half a head, then nothing (header timeout 1 s here) */
    int64_t t0 = ms_now();
    const char slow[] = "POST " CHAT " HTTP/1.1\r\nHost: gw\r\n";
    BT_CHECK_EQ_INT(raw(slow, sizeof slow - 1, false, 0, out, sizeof out), 408);
    BT_CHECK(ms_now() - t0 < 5000);
    /* a body that stops arriving (body timeout 1 s) */
    const char partial[] = "POST " CHAT " HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{\"messages\"";
    BT_CHECK_EQ_INT(raw(partial, sizeof partial - 1, false, 0, out, sizeof out), 408);
    /* a client that closes its end while its generation runs is gone: no answer (the
     * generation is cancelled: test_nonstream_disconnect_cancels); one answered at once
     * (a refusal) still gets its answer */
    r = request("POST", CHAT, "{" MSGS ",\"max_tokens\":2,\"temperature\":0}", NULL);
    BT_CHECK_EQ_INT(raw(r, strlen(r), true, 0, out, sizeof out), -1);
    free(r);
    r = request("POST", CHAT, "{\"messages\":", NULL); /* (refused before any call) */
    BT_CHECK_EQ_INT(raw(r, strlen(r), true, 0, out, sizeof out), 400);
    free(r);
    /* Expect: 100-continue */
    r = request("POST", CHAT, "{" MSGS ",\"max_tokens\":2,\"temperature\":0}", "Expect: 100-continue\r\n");
    BT_CHECK_EQ_INT(raw(r, strlen(r), false, 0, out, sizeof out), 200);
    free(r);
}

/* a streaming generation on its own connection while the hostile table runs */
typedef struct {
    bool done_marker;
    int status;
} stream_result_t;

static void *streamer(void *arg)
{
    stream_result_t *res = arg;
    char *r = request("POST", CHAT, "{" MSGS ",\"max_tokens\":300,\"temperature\":0,\"stream\":true,\"ignore_eos\":true}", NULL);
    int fd = connect_gw();
    send_all(fd, r, strlen(r));
    free(r);
    static char out[1 << 20];
    res->status = read_status(fd, out, sizeof out);
    res->done_marker = strstr(out, "data: [DONE]") != NULL;
    close(fd);
    return NULL;
}

static void test_hostile_table(void)
{
    pthread_t th;
    stream_result_t res = {0};
    pthread_create(&th, NULL, streamer, &res);
    usleep(100000);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    test_raw_cases();
    pthread_join(th, NULL);
    fprintf(stderr, "  %zu table cases + 11 raw cases; the concurrent stream ended %d with [DONE]: %d\n",
            sizeof cases / sizeof cases[0], res.status, res.done_marker);
    BT_CHECK(res.status == 200 && res.done_marker);
}

static void test_disconnect_cancels(void)
{
    /* a long stream, dropped after the first bytes: decode's KV pool returns to empty */
    char *r = request("POST", CHAT, "{" MSGS ",\"max_tokens\":400,\"temperature\":0,\"stream\":true,\"ignore_eos\":true}", NULL);
    int fd = connect_gw();
    send_all(fd, r, strlen(r));
    free(r);
    char buf[4096];
    ssize_t got = recv(fd, buf, sizeof buf, 0);
    BT_CHECK(got > 0);
    close(fd);
    client_t cl;
    client_open(&cl, router.addr);
    int64_t deadline = ms_now() + 5000;
    int64_t used = -1;
    while (ms_now() < deadline) {
        Baton__V1__StatsResponse *s;
        if (decode_stats(&cl, decode.addr, &s)) {
            used = s->kv_slots_used;
            BT_PROTO_FREE(baton__v1__stats_response, s);
            if (used == 0) break;
        }
        usleep(20000);
    }
    client_close(&cl);
    BT_CHECK_MSG(used == 0, "decode still holds %lld slots after the client left", (long long)used);
}

/* A client that gives up on a non-streaming request (an SDK's timeout, Ctrl-C: it closes its
 * socket) cancels the generation: it was taken for a half-close, and ran to its end unread
 * while the SDK sent it again. The decode group's normal finishes do not move. */
static void test_nonstream_disconnect_cancels(void)
{
    const double finished0 = metric_value(decode.metrics, "baton_decode_requests_finished_total");
    char *r = request("POST", CHAT,
                      "{" MSGS ",\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true}", NULL);
    int fd = connect_gw();
    send_all(fd, r, strlen(r));
    free(r);
    client_t cl;
    client_open(&cl, router.addr);
    int64_t used = -1;
    for (int64_t deadline = ms_now() + 5000; ms_now() < deadline && used != 1; usleep(2000)) {
        Baton__V1__StatsResponse *s;
        if (decode_stats(&cl, decode.addr, &s)) {
            used = s->kv_slots_used;
            BT_PROTO_FREE(baton__v1__stats_response, s);
        }
    }
    BT_CHECK_MSG(used == 1, "the generation never took a slot (%lld)", (long long)used);
    close(fd);
    for (int64_t deadline = ms_now() + 5000; ms_now() < deadline && used != 0; usleep(20000)) {
        Baton__V1__StatsResponse *s;
        if (decode_stats(&cl, decode.addr, &s)) {
            used = s->kv_slots_used;
            BT_PROTO_FREE(baton__v1__stats_response, s);
        }
    }
    client_close(&cl);
    BT_CHECK_MSG(used == 0, "decode still holds %lld slots after the client left", (long long)used);
    const double finished = metric_value(decode.metrics, "baton_decode_requests_finished_total");
    BT_CHECK_MSG(decode.metrics[0] && finished == finished0,
                 "the generation ran to its end (finished %g -> %g)", finished0, finished);
}

static void test_promtool(void)
{
    char gw_metrics[64];
    snprintf(gw_metrics, sizeof gw_metrics, "127.0.0.1:%d", gw_port);
    const char *addrs[] = {gw_metrics, router.metrics, prefill.metrics, decode.metrics};
    const char *names[] = {"gateway", "router", "prefill", "decode"};
    for (int i = 0; i < 4; i++) {
        BT_CHECK_MSG(addrs[i][0], "%s printed no metrics address", names[i]);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "curl -sf http://%s/metrics > /tmp/bt-metrics-%d.txt && promtool check metrics < /tmp/bt-metrics-%d.txt",
                 addrs[i], (int)getpid(), (int)getpid());
        int rc = system(cmd);
        BT_CHECK_MSG(rc == 0, "promtool check metrics failed for %s (%s)", names[i], addrs[i]);
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/bt-metrics-%d.txt", (int)getpid());
    unlink(path);
}

/* "return_token_ids": true (SGLang's extension) puts the ids into every streamed choice, one
 * chunk per token step even when the text is held back; without it there are none. */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        n += (*c & 0xC0) != 0x80;
    return n;
}

/* Completions logprobs' text_offset counts characters, as OpenAI's (a Python string's); it
 * counted bytes, so every offset after a token outside ASCII was too large. The logit_bias
 * makes the answer the BOS token, whose text "<｜begin▁of▁sentence｜>" is 21 characters and 29
 * bytes. */
static void test_completion_text_offset(void)
{
    static char out[1 << 16];
    const char *body =
        "{\"prompt\":\"a\",\"max_tokens\":3,\"logprobs\":0,\"ignore_eos\":true,"
        "\"skip_special_tokens\":false,\"temperature\":0,\"logit_bias\":{\"0\":100}}";
    char *r = request("POST", "/v1/completions", body, NULL);
    BT_CHECK_EQ_INT(raw(r, strlen(r), false, 0, out, sizeof out), 200);
    free(r);
    const char *json = strstr(out, "\r\n\r\n");
    cJSON *root = json ? cJSON_Parse(json + 4) : NULL;
    const cJSON *lp = cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs");
    const cJSON *tokens = cJSON_GetObjectItem(lp, "tokens"),
                *offs = cJSON_GetObjectItem(lp, "text_offset");
    BT_CHECK_MSG(cJSON_GetArraySize(tokens) == 3 && cJSON_GetArraySize(offs) == 3, "logprobs: %s",
                 json ? json + 4 : out);
    bool wide = false;
    for (int i = 0; i + 1 < cJSON_GetArraySize(tokens); i++) {
        const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(tokens, i));
        const double step = cJSON_GetNumberValue(cJSON_GetArrayItem(offs, i + 1)) -
                            cJSON_GetNumberValue(cJSON_GetArrayItem(offs, i));
        BT_CHECK_MSG(t && step == (double)utf8_chars(t), "token %d '%s': offset step %g", i,
                     t ? t : "?", step);
        wide |= t && utf8_chars(t) != strlen(t);
    }
    BT_CHECK_MSG(wide, "no token outside ASCII: the test shows nothing");
    cJSON_Delete(root);
}

static void test_return_token_ids(void)
{
    static char out[1 << 16];
    for (int with = 0; with < 2; with++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":[5,6,7],\"max_tokens\":6,\"ignore_eos\":true,\"stream\":true,"
                                    "\"stream_options\":{\"include_usage\":true}%s}", with ? ",\"return_token_ids\":true" : "");
        char *r = request("POST", "/v1/completions", body, NULL);
        BT_CHECK_EQ_INT(raw(r, strlen(r), false, 0, out, sizeof out), 200);
        free(r);
        int ids = 0, arrays = 0;
        for (const char *p = out; (p = strstr(p, "\"token_ids\":[")); arrays++) {
            p += strlen("\"token_ids\":[");
            if (*p != ']') ids++;
            for (; *p && *p != ']'; p++) ids += *p == ',';
        }
        BT_CHECK_MSG(strstr(out, "\"completion_tokens\":6") != NULL, "usage: %.400s", out);
        BT_CHECK_MSG(strstr(out, "data: [DONE]") != NULL, "no [DONE]");
        if (with) {
            BT_CHECK_EQ_INT(ids, 6);
            BT_CHECK_EQ_INT(arrays, 6); /* one token per step without speculative decoding */
        } else {
            BT_CHECK_EQ_INT(arrays, 0);
        }
    }
    char *r = request("POST", "/v1/completions", "{\"prompt\":[5],\"return_token_ids\":1}", NULL);
    BT_CHECK_EQ_INT(raw(r, strlen(r), false, 0, out, sizeof out), 400);
    free(r);
}

/* POSTs body to path; the parsed JSON answer (NULL when not 200 or not JSON). A whole
 * answer of n choices comes at once: 8 x 200 unconstrained tokens took 13 s under ASan here,
 * so it gets 90 s rather than the 15 s of a first byte. */
static cJSON *post_json(const char *path, const char *body)
{
    static char out[1 << 18];
    char *r = request("POST", path, body, NULL);
    const int st = raw_wait(r, strlen(r), false, 0, out, sizeof out, 90);
    free(r);
    const char *json = strstr(out, "\r\n\r\n");
    BT_CHECK_MSG(st == 200 && json, "status %d: %.300s", st, out);
    return st == 200 && json ? cJSON_Parse(json + 4) : NULL;
}

static const char *choice_content(const cJSON *root, int i)
{
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), i);
    return cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content"));
}

static int usage_of(const cJSON *root, const char *k)
{
    return (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), k));
}

/* `n` choices (it was refused): as many generations, choice i with seed + i, so each equals
 * the one-choice request with that seed; the usage counts the prompt once and every choice's
 * tokens; a stream carries each choice's chunks under its index, with one usage chunk at the
 * end. */
static void test_n_choices(void)
{
#define N_BODY(n, seed, extra)                                                                     \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"count\"}],\"n\":" n ",\"seed\":" seed         \
    ",\"temperature\":1.0,\"max_tokens\":6,\"ignore_eos\":true" extra "}"
    cJSON *many = post_json(CHAT, N_BODY("3", "7", ""));
    const cJSON *choices = cJSON_GetObjectItem(many, "choices");
    BT_CHECK_EQ_INT(cJSON_GetArraySize(choices), 3);
    const char *seeds[3] = {"7", "8", "9"};
    int prompt_tokens = 0;
    bool differ = false;
    for (int i = 0; i < 3 && cJSON_GetArraySize(choices) == 3; i++) {
        const cJSON *c = cJSON_GetArrayItem(choices, i);
        BT_CHECK_EQ_INT((int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "index")), i);
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"count\"}],\"seed\":%s,"
                 "\"temperature\":1.0,\"max_tokens\":6,\"ignore_eos\":true}",
                 seeds[i]);
        cJSON *one = post_json(CHAT, body);
        const char *a = choice_content(many, i), *b = choice_content(one, 0);
        BT_CHECK_MSG(a && b && !strcmp(a, b), "choice %d '%s', alone with seed %s '%s'", i,
                     a ? a : "?", seeds[i], b ? b : "?");
        prompt_tokens = usage_of(one, "prompt_tokens");
        differ |= i > 0 && a && choice_content(many, 0) && strcmp(a, choice_content(many, 0));
        cJSON_Delete(one);
    }
    BT_CHECK_MSG(differ, "the three choices are the same text: the test shows nothing");
    BT_CHECK_EQ_INT(usage_of(many, "completion_tokens"), 18);
    BT_CHECK_MSG(prompt_tokens > 0 && usage_of(many, "prompt_tokens") == prompt_tokens,
                 "prompt tokens %d, alone %d", usage_of(many, "prompt_tokens"), prompt_tokens);

    /* the same two choices streamed */
    static char out[1 << 18];
    char *r = request(
        "POST", CHAT,
        N_BODY("2", "7", ",\"stream\":true,\"stream_options\":{\"include_usage\":true}"), NULL);
    BT_CHECK_EQ_INT(raw(r, strlen(r), false, 0, out, sizeof out), 200);
    free(r);
    char text[2][512] = {"", ""};
    int roles[2] = {0, 0}, finishes[2] = {0, 0}, usages = 0, after_done = 0;
    bool done = false;
    for (const char *p = strstr(out, "data: "); p; p = strstr(p + 1, "data: ")) {
        if (!strncmp(p, "data: [DONE]", 12)) {
            done = true;
            continue;
        }
        after_done += done;
        const char *end = strstr(p, "\n\n");
        char *ev = end ? strndup(p + 6, (size_t)(end - p - 6)) : NULL;
        cJSON *o = ev ? cJSON_Parse(ev) : NULL;
        free(ev);
        const cJSON *u = cJSON_GetObjectItem(o, "usage");
        if (cJSON_IsObject(u)) {
            usages++;
            BT_CHECK_EQ_INT((int)cJSON_GetNumberValue(cJSON_GetObjectItem(u, "completion_tokens")),
                            12);
        }
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const int idx = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "index"));
        if (c && idx >= 0 && idx < 2) {
            const cJSON *d = cJSON_GetObjectItem(c, "delta");
            roles[idx] += cJSON_GetObjectItem(d, "role") != NULL;
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
            if (t) strncat(text[idx], t, sizeof text[idx] - strlen(text[idx]) - 1);
            finishes[idx] += cJSON_IsString(cJSON_GetObjectItem(c, "finish_reason"));
        }
        cJSON_Delete(o);
    }
    BT_CHECK_MSG(done && after_done == 0, "[DONE] last (%d events after it)", after_done);
    BT_CHECK_EQ_INT(usages, 1);
    for (int i = 0; i < 2; i++) {
        BT_CHECK_MSG(roles[i] == 1 && finishes[i] == 1, "choice %d: %d role chunks, %d finishes", i,
                     roles[i], finishes[i]);
        const char *want = choice_content(many, i);
        BT_CHECK_MSG(want && !strcmp(text[i], want), "streamed choice %d '%s', not '%s'", i,
                     text[i], want ? want : "?");
    }
    cJSON_Delete(many);
#undef N_BODY
}

static const char *choice_text(const cJSON *root, int i)
{
    return cJSON_GetStringValue(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), i), "text"));
}

/* A batch of prompts (it was refused): n choices for each, prompt-major, each the one-prompt
 * request's with seed + its index among its prompt's; the usage counts every prompt once. */
static void test_batch_prompts(void)
{
#define BATCH_REST ",\"n\":2,\"seed\":5,\"temperature\":1.0,\"max_tokens\":4,\"ignore_eos\":true}"
    cJSON *all = post_json("/v1/completions", "{\"prompt\":[\"one two\",[5,6,7,8]]" BATCH_REST);
    BT_CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(all, "choices")), 4);
    const char *prompts[2] = {"\"one two\"", "[5,6,7,8]"};
    int prompt_tokens = 0;
    for (int p = 0; p < 2; p++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":%s" BATCH_REST, prompts[p]);
        cJSON *one = post_json("/v1/completions", body);
        prompt_tokens += usage_of(one, "prompt_tokens");
        for (int j = 0; j < 2; j++) {
            const char *a = choice_text(all, 2 * p + j), *b = choice_text(one, j);
            BT_CHECK_MSG(a && b && !strcmp(a, b),
                         "prompt %d choice %d: '%s' in the batch, '%s' alone", p, j, a ? a : "?",
                         b ? b : "?");
            const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(all, "choices"), 2 * p + j);
            BT_CHECK_EQ_INT((int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "index")), 2 * p + j);
        }
        cJSON_Delete(one);
    }
    BT_CHECK_MSG(choice_text(all, 0) && choice_text(all, 2) &&
                     strcmp(choice_text(all, 0), choice_text(all, 2)),
                 "the two prompts gave the same text: the test shows nothing");
    BT_CHECK_MSG(prompt_tokens > 0 && usage_of(all, "prompt_tokens") == prompt_tokens,
                 "prompt tokens %d, alone %d", usage_of(all, "prompt_tokens"), prompt_tokens);
    BT_CHECK_EQ_INT(usage_of(all, "completion_tokens"), 16);
    cJSON_Delete(all);
#undef BATCH_REST
}

/* response_format json_object: every choice that stops is a JSON object (cJSON parses it);
 * the same request without it gives no object at all (the tiny model's text is not JSON, so
 * the test shows the constraint at work). */
static int json_objects(const cJSON *root, bool chat, bool constrained, int *stopped, int *total)
{
    int objects = 0;
    *stopped = *total = 0;
    const cJSON *ch;
    cJSON_ArrayForEach(ch, cJSON_GetObjectItem(root, "choices"))
    {
        const cJSON *msg = chat ? cJSON_GetObjectItem(ch, "message") : ch;
        const char *text =
            cJSON_GetStringValue(cJSON_GetObjectItem(msg, chat ? "content" : "text"));
        const char *finish = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
        (*total)++;
        const bool stop = finish && !strcmp(finish, "stop");
        *stopped += stop;
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        const bool object = j && cJSON_IsObject(j);
        objects += object;
        BT_CHECK_MSG(!constrained || !stop || object, "a choice stopped on '%s', not a JSON object",
                     text ? text : "?");
        cJSON_Delete(j);
    }
    return objects;
}

static void test_json_object(void)
{
    /* the tiny model's strings run long: a bias toward '"' and '}' (where the grammar allows
     * them) makes most choices close their object within max_tokens; without the grammar the
     * same bias gives quotes and braces anywhere */
    char dir[600], err[256], bias[128];
    snprintf(dir, sizeof dir, "%s/golden-a-exact", BT_GOLDEN_DIR);
    bt_tokenizer_t *tok;
    BT_CHECK(bt_tokenizer_load(dir, &tok, err, sizeof err) == BT_OK);
    const int32_t quote = bt_tokenizer_token_to_id(tok, "\""),
                  brace = bt_tokenizer_token_to_id(tok, "}");
    bt_tokenizer_destroy(tok);
    BT_CHECK(quote >= 0 && brace >= 0);
    snprintf(bias, sizeof bias, "\"logit_bias\":{\"%d\":8,\"%d\":8}", quote, brace);
    static const char *const bodies[][2] = {
        {"/v1/completions",
         "{\"prompt\":\"Answer in JSON:\",\"max_tokens\":200,\"n\":8,\"seed\":3,%s%s}"},
        {CHAT, "{" MSGS ",\"max_tokens\":200,\"n\":8,\"seed\":5,"
               "\"chat_template_kwargs\":{\"thinking\":false},%s%s}"},
    };
    for (int k = 0; k < 2; k++) {
        char body[768];
        snprintf(body, sizeof body, bodies[k][1], bias,
                 ",\"response_format\":{\"type\":\"json_object\"}");
        cJSON *on = post_json(bodies[k][0], body);
        snprintf(body, sizeof body, bodies[k][1], bias, "");
        cJSON *off = post_json(bodies[k][0], body);
        BT_CHECK(on && off);
        if (!on || !off) {
            cJSON_Delete(on);
            cJSON_Delete(off);
            continue;
        }
        int stopped, total, stopped_off, total_off;
        const int objects = json_objects(on, k == 1, true, &stopped, &total);
        const int objects_off = json_objects(off, k == 1, false, &stopped_off, &total_off);
        fprintf(stderr,
                "  %s, json_object: %d of %d choices stopped, %d JSON objects; without it: "
                "%d objects\n",
                bodies[k][0], stopped, total, objects, objects_off);
        BT_CHECK_EQ_INT(total, 8);
        BT_CHECK(stopped >= 4 && objects == stopped);
        BT_CHECK_EQ_INT(objects_off, 0);
        cJSON_Delete(on);
        cJSON_Delete(off);
    }
}

/* response_format json_schema: every choice that stops is an instance of the schema (checked
 * here field by field), and a schema with a keyword the grammar cannot hold the output to is a
 * 400 naming it. */
static void test_json_schema(void)
{
    char dir[600], err[256], bias[128];
    snprintf(dir, sizeof dir, "%s/golden-a-exact", BT_GOLDEN_DIR);
    bt_tokenizer_t *tok;
    BT_CHECK(bt_tokenizer_load(dir, &tok, err, sizeof err) == BT_OK);
    snprintf(bias, sizeof bias, "\"logit_bias\":{\"%d\":8,\"%d\":8}",
             bt_tokenizer_token_to_id(tok, "\""), bt_tokenizer_token_to_id(tok, "}"));
    bt_tokenizer_destroy(tok);
#define SCHEMA                                                                                     \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"       \
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},"   \
    "\"kind\":{\"enum\":[\"cat\",\"dog\"]}},\"required\":[\"name\",\"age\",\"kind\"]}"
    char body[1024];
    snprintf(body, sizeof body,
             "{" MSGS ",\"max_tokens\":300,\"n\":8,\"seed\":9,%s,\"response_format\":{\"type\":"
             "\"json_schema\",\"json_schema\":{\"name\":\"pet\",\"strict\":true,\"schema\":" SCHEMA
             "}}}",
             bias);
    cJSON *all = post_json(CHAT, body);
    BT_CHECK(all != NULL);
    int stopped = 0, instances = 0;
    const cJSON *ch;
    cJSON_ArrayForEach(ch, cJSON_GetObjectItem(all, "choices"))
    {
        const char *text = cJSON_GetStringValue(
            cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content"));
        const char *finish = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
        if (!finish || strcmp(finish, "stop")) continue;
        stopped++;
        cJSON *x = text ? cJSON_Parse(text) : NULL;
        const cJSON *name = cJSON_GetObjectItem(x, "name"), *age = cJSON_GetObjectItem(x, "age");
        const cJSON *tags = cJSON_GetObjectItem(x, "tags"), *kind = cJSON_GetObjectItem(x, "kind"),
                    *t;
        bool ok = cJSON_IsObject(x) && cJSON_IsString(name) && cJSON_IsNumber(age) &&
                  age->valuedouble == (double)(long long)age->valuedouble && cJSON_IsString(kind) &&
                  (!strcmp(kind->valuestring, "cat") || !strcmp(kind->valuestring, "dog")) &&
                  cJSON_GetArraySize(x) == 3 + (tags != NULL);
        if (tags) {
            ok = ok && cJSON_IsArray(tags) && cJSON_GetArraySize(tags) <= 3;
            cJSON_ArrayForEach(t, tags) ok = ok && cJSON_IsString(t);
        }
        instances += ok;
        BT_CHECK_MSG(ok, "a choice stopped on '%s', not an instance of the schema",
                     text ? text : "?");
        cJSON_Delete(x);
    }
    fprintf(stderr,
            "  json_schema (string, integer, array of at most 3, enum; 3 required): %d of 8 "
            "choices stopped, %d instances\n",
            stopped, instances);
    BT_CHECK(stopped >= 4);
    cJSON_Delete(all);
#undef SCHEMA
    const char *unsupported =
        "{" MSGS ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":"
        "{\"type\":\"string\",\"pattern\":\"(?=a)b\"}}}}}}";
    char *r = request("POST", CHAT, unsupported, NULL);
    char out[4096];
    const int st = raw(r, strlen(r), false, 0, out, sizeof out);
    free(r);
    BT_CHECK_MSG(st == 400 && strstr(out, "pattern: lookaround") &&
                     strstr(out, "\"param\":\"response_format\""),
                 "%d %.300s", st, out);
}

/* regex (SGLang's; guided_regex, vLLM's): every choice that stops is a whole match (PCRE2
 * judges), and they are not all the same answer. */
static void test_regex(void)
{
    const char *pattern = "(yes|no|maybe)(, [a-z]{2,6}){0,3}[.]"; /* (JSON as it is) */
    char body[512];
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body,
                 "{\"prompt\":\"Well\",\"max_tokens\":60,\"n\":8,\"seed\":3,\"%s\":\"%s\"}",
                 i ? "guided_regex" : "regex", pattern);
        cJSON *all = post_json("/v1/completions", body);
        BT_CHECK(all != NULL);
        int ec, stopped = 0, matches = 0;
        PCRE2_SIZE eo;
        pcre2_code *code =
            pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ec, &eo, NULL);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        const cJSON *ch;
        char first[64] = "";
        bool differ = false;
        cJSON_ArrayForEach(ch, cJSON_GetObjectItem(all, "choices"))
        {
            const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text"));
            const char *finish = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
            if (!text || !finish || strcmp(finish, "stop")) continue;
            stopped++;
            const bool ok = pcre2_match(code, (PCRE2_SPTR)text, strlen(text), 0, 0, md, NULL) >= 0;
            matches += ok;
            BT_CHECK_MSG(ok, "a choice stopped on '%s', not a match", text);
            if (!first[0]) snprintf(first, sizeof first, "%s", text);
            differ |= strcmp(first, text) != 0;
        }
        fprintf(stderr, "  %s: %d of 8 choices stopped, %d whole matches\n",
                i ? "guided_regex" : "regex", stopped, matches);
        BT_CHECK(stopped >= 6 && differ);
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        cJSON_Delete(all);
    }
}

static int connect_port(int port)
{
    const int saved = gw_port;
    gw_port = port;
    const int fd = connect_gw();
    gw_port = saved;
    return fd;
}

/* Streams a chat request of n choices of max_tokens from a gateway of its own (started with
 * `drain`), SIGTERMs that gateway once the first bytes arrived, and reads the rest of the stream
 * into out. Returns whether the gateway then exited by itself; refused: whether a new connection
 * was refused meanwhile. */
static bool stream_across_stop(const char *drain, int max_tokens, int n, char *out, size_t cap,
                               bool *refused, int64_t *ms_after_stop)
{
    proc_t gw;
    if (proc_start(&gw, "baton-gateway", "--port", "0", "--router", router.addr, "--drain-timeout",
                   drain, NULL)) {
        BT_CHECK_MSG(0, "the second gateway did not start");
        return false;
    }
    const int port = atoi(strrchr(gw.addr, ':') + 1);
    char body[256];
    snprintf(body, sizeof body,
             "{" MSGS ",\"max_tokens\":%d,\"n\":%d,\"stream\":true,\"ignore_eos\":true}",
             max_tokens, n);
    char *r = request("POST", CHAT, body, NULL);
    int fd = connect_port(port);
    send_all(fd, r, strlen(r));
    free(r);
    size_t used = 0;
    ssize_t got = recv(fd, out, cap - 1, 0);
    if (got > 0) used = (size_t)got;
    const int64_t t_stop = ms_now();
    kill(gw.pid, SIGTERM);
    usleep(50000);
    const int fd2 = connect_port(port);
    *refused = fd2 < 0;
    if (fd2 >= 0) close(fd2);
    for (ssize_t n; used < cap - 1 && (n = recv(fd, out + used, cap - 1 - used, 0)) > 0;)
        used += (size_t)n;
    out[used] = 0;
    *ms_after_stop = ms_now() - t_stop;
    close(fd);
    const bool exited = proc_exited(&gw, 10000);
    proc_stop(&gw, SIGKILL);
    return exited;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* A stopped gateway answers what it has (streams run to their end), takes no new
 * connection, then exits. */
static void test_stop_drains(void)
{
    static char out[1 << 20];
    bool refused;
    int64_t ms;
    const bool exited = stream_across_stop("30", 300, 1, out, sizeof out, &refused, &ms);
    const int chunks = count_of(out, "\"content\":\"");
    fprintf(stderr,
            "  a stream across the gateway's stop: %d content chunks, [DONE] %d, error %d, ended "
            "%lld ms after the stop; a new connection %s; the gateway %s\n",
            chunks, strstr(out, "data: [DONE]") != NULL, strstr(out, "data: {\"error\"") != NULL,
            (long long)ms, refused ? "refused" : "accepted", exited ? "exited" : "stayed");
    BT_CHECK(!strncmp(out, "HTTP/1.1 200", 12));
    BT_CHECK(strstr(out, "\"finish_reason\":\"length\"") && strstr(out, "data: [DONE]"));
    BT_CHECK(!strstr(out, "data: {\"error\""));
    BT_CHECK(refused);
    BT_CHECK(exited);
}

/* A stopped gateway whose answers run past --drain-timeout ends them with an error that says
 * so (their generations cancelled end to end), and exits. */
static void test_drain_timeout(void)
{
    static char out[1 << 20];
    bool refused;
    int64_t ms;
    const bool exited = stream_across_stop("0.1", 450, 8, out, sizeof out, &refused, &ms);
    const char *err = strstr(out, "data: {\"error\"");
    fprintf(stderr,
            "  8 streamed choices of 450 tokens, their gateway stopped with a 0.1 s drain: ended "
            "%lld ms "
            "after the stop, with %s; the gateway %s\n",
            (long long)ms, err ? "an error" : "no error", exited ? "exited" : "stayed");
    BT_CHECK_MSG(err && strstr(err, "drain-timeout") && strstr(err, "data: [DONE]"), "%.300s",
                 err ? err : out + (strlen(out) > 300 ? strlen(out) - 300 : 0));
    BT_CHECK(!strstr(out, "\"finish_reason\":\"length\""));
    BT_CHECK(ms < 5000);
    BT_CHECK(exited);
    /* the generation was cancelled: the decode group's KV pool returns to empty */
    client_t cl;
    client_open(&cl, router.addr);
    int64_t used = -1;
    for (int64_t deadline = ms_now() + 5000; ms_now() < deadline; usleep(20000)) {
        Baton__V1__StatsResponse *st;
        if (decode_stats(&cl, decode.addr, &st)) {
            used = st->kv_slots_used;
            BT_PROTO_FREE(baton__v1__stats_response, st);
            if (used == 0) break;
        }
    }
    client_close(&cl);
    BT_CHECK_MSG(used == 0, "decode still holds %lld slots", (long long)used);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    char model[512];
    snprintf(model, sizeof model, "%s/golden-a-exact", BT_GOLDEN_DIR);
    if (proc_start(&router, "baton-router", "--port", "0", "--model-path", model, "--served-model-name", "m",
                   "--heartbeat-ms", "200", NULL) ||
        proc_start(&prefill, "baton-prefill", "--port", "0", "--model-path", model, "--served-model-name", "m",
                   "--router", router.addr, "--context-length", "512", "--threads", "1", NULL) ||
        proc_start(&decode, "baton-decode", "--port", "0", "--model-path", model, "--served-model-name", "m",
                   "--router", router.addr, "--context-length", "512", "--threads", "1", NULL) ||
        proc_start(&gateway, "baton-gateway", "--port", "0", "--router", router.addr, "--max-request-bytes", "65536",
                   "--header-timeout-ms", "1000", "--body-timeout-ms", "1000", NULL)) {
        BT_CHECK_MSG(0, "the cluster did not start");
        return bt_test_summary();
    }
    const char *colon = strrchr(gateway.addr, ':');
    gw_port = colon ? atoi(colon + 1) : 0;
    usleep(500000);
    BT_RUN(test_hostile_table);
    BT_RUN(test_disconnect_cancels);
    BT_RUN(test_nonstream_disconnect_cancels);
    BT_RUN(test_promtool);
    BT_RUN(test_return_token_ids);
    BT_RUN(test_completion_text_offset);
    BT_RUN(test_n_choices);
    BT_RUN(test_batch_prompts);
    BT_RUN(test_json_object);
    BT_RUN(test_json_schema);
    BT_RUN(test_regex);
    BT_RUN(test_stop_drains);
    BT_RUN(test_drain_timeout);
    proc_stop(&gateway, SIGTERM);
    proc_stop(&decode, SIGTERM);
    proc_stop(&prefill, SIGTERM);
    proc_stop(&router, SIGTERM);
    return bt_test_summary();
}

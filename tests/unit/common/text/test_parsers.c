/* Reasoning (deepseek-v41) and tool-call (deepseekv41) parsers over a table of model
 * outputs, fed whole, in every split into two chunks, and one byte at a time. */
#include "bt_test.h"

#include "common/log.h"
#include "common/text/chat.h"
#include "common/text/parsers.h"
#include "common/text/text_internal.h"

#include <string.h>
#include <time.h>

#define D "｜DSML｜"
#define CALL_W                                                                                      \
    "<" D " invoke name=\"get_weather\">\n<" D " parameter name=\"city\" string=\"true\">Paris</" D \
    " parameter>\n<" D " parameter name=\"days\" string=\"false\">3</" D " parameter>\n</" D       \
    " invoke>"
#define ARGS_W "{\"city\": \"Paris\", \"days\": 3}"
#define CALL_S                                                                                      \
    "<" D " invoke name=\"search\">\n<" D " parameter name=\"q\" string=\"true\">naïve \"x\"\n"    \
    "a<b & 日本</" D " parameter>\n<" D " parameter name=\"opts\" string=\"false\">{\"k\": [1, 2.5]}</" D \
    " parameter>\n</" D " invoke>"
#define ARGS_S "{\"q\": \"naïve \\\"x\\\"\\na<b & 日本\", \"opts\": {\"k\": [1, 2.5]}}"
#define CALL_EMPTY "<" D " invoke name=\"now\">\n</" D " invoke>"

typedef struct {
    const char *name;
    bool thinking;
    const char *input;
    const char *reasoning;
    const char *content;
    const char *calls[4][2]; /* name, arguments */
    int n_calls;
    bool warns;
} case_t;

static const case_t cases[] = {
    {"thinking_answer",
     true,
     "Let me think.\nOK.</think>The answer is 4.",
     "Let me think.\nOK.",
     "The answer is 4.",
     {{0}},
     0,
     false},
    {"thinking_explicit_start",
     true,
     "<think>r1 r2</think>\n\nDone",
     "r1 r2",
     "\n\nDone",
     {{0}},
     0,
     false},
    {"chat_plain",
     false,
     "Just content, with <b>tags</b> and </thin k>.",
     "",
     "Just content, with <b>tags</b> and </thin k>.",
     {{0}},
     0,
     false},
    {"chat_model_thinks_anyway", false, "<think>hmm</think>ok", "hmm", "ok", {{0}}, 0, false},
    {"chat_think_not_at_start",
     false,
     "a <think>b</think>",
     "",
     "a <think>b</think>",
     {{0}},
     0,
     false},
    {"truncated_reasoning",
     true,
     "still thinking about </thi",
     "still thinking about </thi",
     "",
     {{0}},
     0,
     false},
    {"empty_reasoning", true, "</think>", "", "", {{0}}, 0, false},
    {"unicode_reasoning", true, "日本語😀</think>é😀", "日本語😀", "é😀", {{0}}, 0, false},
    {"one_call_thinking",
     true,
     "need weather</think>\n\n<" D " calls>\n" CALL_W "\n</" D " calls>",
     "need weather",
     "",
     {{"get_weather", ARGS_W}},
     1,
     false},
    {"content_then_two_calls",
     false,
     "Checking both.\n\n<" D " calls>\n" CALL_W "\n" CALL_S "\n</" D " calls>",
     "",
     "Checking both.",
     {{"get_weather", ARGS_W}, {"search", ARGS_S}},
     2,
     false},
    {"call_without_params",
     false,
     "\n\n<" D " calls>\n" CALL_EMPTY "\n</" D " calls>",
     "",
     "",
     {{"now", "{}"}},
     1,
     false},
    {"content_after_calls",
     false,
     "x\n\n<" D " calls>\n" CALL_EMPTY "\n</" D " calls>\ntrailing",
     "",
     "x\ntrailing",
     {{"now", "{}"}},
     1,
     false},
    {"dsml_mentioned_in_text",
     false,
     "the token " D " alone, and <" D " call not a block",
     "",
     "the token " D " alone, and <" D " call not a block",
     {{0}},
     0,
     false},
    {"malformed_no_name",
     false,
     "a\n\n<" D " calls>\n<" D " invoke>\n</" D " invoke>\n</" D " calls>",
     "",
     "a\n\n<" D " calls>\n<" D " invoke>\n</" D " invoke>\n</" D " calls>",
     {{0}},
     0,
     true},
    {"malformed_bad_string_flag",
     false,
     "\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D
     " parameter name=\"a\" string=\"maybe\">1</" D " parameter>\n</" D " invoke>\n</" D " calls>",
     "",
     "\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D
     " parameter name=\"a\" string=\"maybe\">1</" D " parameter>\n</" D " invoke>\n</" D " calls>",
     {{0}},
     0,
     true},
    {"duplicate_param",
     false,
     "<" D " calls>\n<" D " invoke name=\"f\">\n<" D " parameter name=\"a\" string=\"true\">1</" D
     " parameter>\n<" D " parameter name=\"a\" string=\"true\">2</" D " parameter>\n</" D
     " invoke>\n</" D " calls>",
     "",
     "<" D " calls>\n<" D " invoke name=\"f\">\n<" D " parameter name=\"a\" string=\"true\">1</" D
     " parameter>\n<" D " parameter name=\"a\" string=\"true\">2</" D " parameter>\n</" D
     " invoke>\n</" D " calls>",
     {{0}},
     0,
     true},
    {"truncated_in_parameter",
     true,
     "r</think>ok\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D
     " parameter name=\"a\" string=\"true\">hal",
     "r",
     "ok\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D
     " parameter name=\"a\" string=\"true\">hal",
     {{0}},
     0,
     true},
    {"second_call_truncated",
     false,
     "\n\n<" D " calls>\n" CALL_EMPTY "\n<" D " invoke name=\"g",
     "",
     ">\n<" D " invoke name=\"g",
     {{"now", "{}"}},
     1,
     true},
    {"garbage_after_marker",
     false,
     "<" D " callsXYZ then text",
     "",
     "<" D " callsXYZ then text",
     {{0}},
     0,
     true},
    {"newlines_only", false, "\n\n\n", "", "\n\n\n", {{0}}, 0, false},
    /* a call without arguments as the encoder writes it (">\n", no parameters, "\n" before
     * the invoke end): it was refused as malformed and went out as content */
    {"call_without_params_encoder_form",
     false,
     "\n\n<" D " calls>\n<" D " invoke name=\"now\">\n\n</" D " invoke>\n</" D " calls>",
     "",
     "",
     {{"now", "{}"}},
     1,
     false},
    /* string="false" text that is no JSON value went into arguments as written: {"path": /tmp/x} */
    {"non_json_value_quoted",
     false,
     "<" D " calls>\n<" D " invoke name=\"open\">\n<" D
     " parameter name=\"path\" string=\"false\">/tmp/x</" D " parameter>\n<" D
     " parameter name=\"mode\" string=\"false\"></" D " parameter>\n</" D " invoke>\n</" D
     " calls>",
     "",
     "",
     {{"open", "{\"path\": \"/tmp/x\", \"mode\": \"\"}"}},
     1,
     false},
};

typedef struct {
    bt__buf_t reasoning, content, calls;
    int n_calls, warnings;
} result_t;

static void run(const case_t *c, const size_t *cuts, size_t n_cuts, result_t *r)
{
    memset(r, 0, sizeof *r);
    bt_reasoning_parser_t *rp = bt_reasoning_parser_create(c->thinking);
    bt_tool_parser_t *tp = bt_tool_parser_create(42);
    size_t len = strlen(c->input), pos = 0;
    bt_reasoning_delta_t rd;
    bt_tool_delta_t td;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        bool last = i == n_cuts;
        bt_reasoning_parser_push(rp, c->input + pos, end - pos, &rd);
        pos = end;
        for (int pass = 0; pass < (last ? 2 : 1); pass++) {
            if (pass == 1) bt_reasoning_parser_finish(rp, &rd);
            bt__buf_append(&r->reasoning, rd.reasoning, rd.reasoning_len);
            bt_tool_parser_push(tp, rd.content, rd.content_len, &td);
            bt__buf_append(&r->content, td.content, td.content_len);
            for (int k = 0; k < td.n_calls; k++) {
                bt__buf_printf(&r->calls, "%d|%s|%s|%s\n", td.calls[k].index, td.calls[k].id,
                               td.calls[k].name, td.calls[k].arguments);
                r->n_calls++;
            }
        }
    }
    bt_tool_parser_finish(tp, &td);
    bt__buf_append(&r->content, td.content, td.content_len);
    for (int k = 0; k < td.n_calls; k++) {
        bt__buf_printf(&r->calls, "%d|%s|%s|%s\n", td.calls[k].index, td.calls[k].id,
                       td.calls[k].name, td.calls[k].arguments);
        r->n_calls++;
    }
    r->warnings = td.warnings;
    bt__buf_reserve(&r->reasoning, 0);
    bt__buf_reserve(&r->content, 0);
    bt__buf_reserve(&r->calls, 0);
    bt_reasoning_parser_destroy(rp);
    bt_tool_parser_destroy(tp);
}

static void result_free(result_t *r)
{
    bt__buf_free(&r->reasoning);
    bt__buf_free(&r->content);
    bt__buf_free(&r->calls);
}

static bool same(const result_t *a, const result_t *b)
{
    return !strcmp(a->reasoning.data, b->reasoning.data) && !strcmp(a->content.data, b->content.data) &&
           !strcmp(a->calls.data, b->calls.data) && a->warnings == b->warnings;
}

static void test_table(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const case_t *c = &cases[i];
        bt_test_current = c->name;
        result_t one;
        run(c, NULL, 0, &one);
        BT_CHECK_MSG(!strcmp(one.reasoning.data, c->reasoning), "reasoning [%s]", one.reasoning.data);
        BT_CHECK_MSG(!strcmp(one.content.data, c->content), "content [%s]", one.content.data);
        BT_CHECK_EQ_INT(one.n_calls, c->n_calls);
        BT_CHECK_MSG((one.warnings > 0) == c->warns, "warnings %d", one.warnings);
        /* the calls: index, id shape, name, arguments */
        const char *line = one.calls.data;
        for (int k = 0; k < c->n_calls && line && *line; k++) {
            char want[1024];
            const char *id = strchr(line, '|') + 1;
            BT_CHECK(!strncmp(id, "call_", 5) && strchr(id, '|') - id == 29);
            snprintf(want, sizeof want, "%s|%s\n", c->calls[k][0], c->calls[k][1]);
            const char *rest = strchr(id, '|') + 1;
            BT_CHECK_MSG(!strncmp(rest, want, strlen(want)), "call %d: %.200s", k, rest);
            /* whatever the model wrote, a client gets arguments it can parse */
            const char *args = strchr(rest, '|') + 1, *end = strchr(args, '\n');
            cJSON *j = end ? cJSON_ParseWithLength(args, (size_t)(end - args)) : NULL;
            BT_CHECK_MSG(cJSON_IsObject(j), "call %d: arguments not a JSON object: %.200s", k,
                         args);
            cJSON_Delete(j);
            BT_CHECK_EQ_INT(atoi(line), k);
            line = strchr(rest, '\n');
            if (line) line++;
        }
        /* every split into two chunks */
        size_t len = strlen(c->input);
        for (size_t cut = 0; cut <= len; cut++) {
            result_t two;
            run(c, &cut, 1, &two);
            BT_CHECK_MSG(same(&one, &two), "split at %zu: reasoning [%s] content [%s] calls [%s]", cut,
                         two.reasoning.data, two.content.data, two.calls.data);
            result_free(&two);
        }
        /* one byte at a time */
        size_t *cuts = malloc((len + 1) * sizeof *cuts);
        for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
        result_t bytes;
        run(c, cuts, len ? len - 1 : 0, &bytes);
        BT_CHECK_MSG(same(&one, &bytes), "byte chunks: content [%s]", bytes.content.data);
        result_free(&bytes);
        free(cuts);
        result_free(&one);
    }
    bt_test_current = "test_table";
}

static void test_ids_unique(void)
{
    bt_tool_parser_t *tp = bt_tool_parser_create(0);
    const char *text = "<" D " calls>\n" CALL_EMPTY "\n" CALL_EMPTY "\n</" D " calls>";
    bt_tool_delta_t td;
    bt_tool_parser_push(tp, text, strlen(text), &td);
    BT_CHECK_EQ_INT(td.n_calls, 2);
    if (td.n_calls == 2) {
        BT_CHECK(strcmp(td.calls[0].id, td.calls[1].id) != 0);
        BT_CHECK(td.calls[0].index == 0 && td.calls[1].index == 1);
    }
    bt_tool_parser_finish(tp, &td);
    BT_CHECK_EQ_INT(td.n_calls, 0);
    bt_tool_parser_destroy(tp);
}

/* The encoder's DSML for an assistant turn's tool calls (bt_chat_render), fed back through the
 * tool parser, gives the same calls: what the model is taught to write is what is read back. */
static void test_encoder_round_trip(void)
{
    const char *req_json =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":"
        "\"\","
        "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}"
        "\"}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"}}]}]}";
    cJSON *req = bt_chat_parse_request(req_json, strlen(req_json));
    char *prompt = NULL, err[256] = "";
    size_t len = 0;
    BT_CHECK_MSG(req && bt_chat_render(req, &prompt, &len, err, sizeof err) == BT_OK, "render: %s",
                 err);
    const char *from = prompt ? strstr(prompt, "\n\n<" D " calls>") : NULL;
    const char *to = from ? strstr(from, "</" D " calls>") : NULL;
    BT_CHECK_MSG(from && to, "no DSML block in %s", prompt ? prompt : "(none)");
    if (from && to) {
        to += strlen("</" D " calls>");
        bt_tool_parser_t *tp = bt_tool_parser_create(1);
        bt_tool_delta_t td;
        bt_tool_parser_push(tp, from, (size_t)(to - from), &td);
        BT_CHECK_EQ_INT(td.n_calls, 2);
        BT_CHECK_EQ_INT(td.warnings, 0);
        if (td.n_calls == 2) {
            BT_CHECK(!strcmp(td.calls[0].name, "now") && !strcmp(td.calls[0].arguments, "{}"));
            BT_CHECK_MSG(!strcmp(td.calls[1].name, "get_weather") &&
                             !strcmp(td.calls[1].arguments, "{\"city\": \"Paris\", \"days\": 3}"),
                         "%s %s", td.calls[1].name, td.calls[1].arguments);
        }
        bt_tool_parser_finish(tp, &td);
        bt_tool_parser_destroy(tp);
    }
    free(prompt);
    cJSON_Delete(req);
}

/* A long parameter value (a file to write) streamed a few bytes a push: the parser parsed the
 * whole block again at every push, quadratic in the value's length (a 512 KiB value in 4-byte
 * pushes took tens of seconds of the router's loop). Not a performance claim: the bound is
 * orders of magnitude above the linear cost and below the quadratic one. */
static void test_long_value_linear(void)
{
    const size_t vlen = 512 * 1024;
    const char *head = "<" D " calls>\n<" D " invoke name=\"write\">\n<" D
                       " parameter name=\"content\" string=\"true\">";
    const char *tail = "</" D " parameter>\n</" D " invoke>\n</" D " calls>";
    const size_t hl = strlen(head), tl = strlen(tail), n = hl + vlen + tl;
    char *text = malloc(n);
    memcpy(text, head, hl);
    for (size_t i = 0; i < vlen; i++)
        text[hl + i] = "<p>x"[i % 4]; /* markup, as files have */
    memcpy(text + hl + vlen, tail, tl);
    bt_tool_parser_t *tp = bt_tool_parser_create(1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int calls = 0;
    size_t args_len = 0, content = 0;
    for (size_t at = 0; at < n; at += 4) {
        bt_tool_delta_t td;
        bt_tool_parser_push(tp, text + at, n - at < 4 ? n - at : 4, &td);
        calls += td.n_calls;
        if (td.n_calls) args_len = strlen(td.calls[0].arguments);
        content += td.content_len;
    }
    bt_tool_delta_t td;
    bt_tool_parser_finish(tp, &td);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    fprintf(stderr, "  a %zu-byte value in 4-byte pushes: %.3f s\n", vlen, s);
    BT_CHECK_EQ_INT(calls, 1);
    BT_CHECK_EQ_INT(content, 0);
    BT_CHECK_EQ_INT(args_len, vlen + strlen("{\"content\": \"\"}")); /* (no escapes in "<p>x") */
    BT_CHECK_MSG(s < 2.0, "%.1f s: the parse is not linear in the value's length", s);
    bt_tool_parser_destroy(tp);
    free(text);
}

int main(void)
{
    bt_log_set_level(BT_LOG_ERROR); /* the malformed cases warn by design */
    BT_RUN(test_table);
    BT_RUN(test_ids_unique);
    BT_RUN(test_encoder_round_trip);
    BT_RUN(test_long_value_linear);
    return bt_test_summary();
}

/* The router's output path (services/common/output.c) fed with recorded model text: the
 * demo model is untrained and never emits thinking or tool-call markup, so the markup the
 * real model writes is tokenized with the golden tokenizer and the ids go through the same
 * path the router runs (incremental detokenization, stop strings, reasoning and tool-call
 * parsers), one id at a time and in bigger steps. */
#include "bt_test.h"
#include "services/common/output.h"

#include <stdlib.h>
#include <string.h>

#define D "｜DSML｜"

static bt_tokenizer_t *tok;

typedef struct {
    char content[4096], reasoning[4096];
    char calls[4][2][256];
    int n_calls;
    bool stopped;
    char matched[64];
} result_t;

static void run(const char *text, const bt_output_options_t *o, size_t step, result_t *res)
{
    memset(res, 0, sizeof *res);
    int32_t *ids;
    size_t n;
    BT_CHECK(bt_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n) == BT_OK);
    bt_output_t *out = bt_output_create(tok, o);
    for (size_t i = 0; i <= n; i += step) {
        size_t k = n - i < step ? n - i : step;
        bool final = i + k >= n;
        bt_output_delta_t d;
        bt_output_push(out, ids + i, k, final, &d);
        strncat(res->content, d.content, d.content_len);
        strncat(res->reasoning, d.reasoning, d.reasoning_len);
        for (int c = 0; c < d.n_calls && res->n_calls < 4; c++, res->n_calls++) {
            snprintf(res->calls[res->n_calls][0], 256, "%s", d.calls[c].name);
            snprintf(res->calls[res->n_calls][1], 256, "%s", d.calls[c].arguments);
        }
        res->stopped = d.stopped;
        snprintf(res->matched, sizeof res->matched, "%s", d.matched_stop);
        if (final || d.stopped) break;
    }
    bt_output_destroy(out);
    free(ids);
}

static void test_reasoning_and_tools(void)
{
    const char *text =
        "The user wants the weather; call the tool.</think>Let me check.\n\n<" D " calls>\n<" D
        " invoke name=\"get_weather\">\n<" D " parameter name=\"city\" string=\"true\">Paris</" D
        " parameter>\n<" D " parameter name=\"days\" string=\"false\">3</" D " parameter>\n</" D
        " invoke>\n</" D " calls>";
    bt_output_options_t o = {NULL, 0, true, true, true, true, 42};
    size_t steps[] = {1, 2, 3, 7, 1000};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        result_t r;
        run(text, &o, steps[s], &r);
        BT_CHECK_MSG(!strcmp(r.reasoning, "The user wants the weather; call the tool."), "step %zu reasoning '%s'", steps[s], r.reasoning);
        BT_CHECK_MSG(!strcmp(r.content, "Let me check."), "step %zu content '%s'", steps[s], r.content);
        BT_CHECK_EQ_INT(r.n_calls, 1);
        BT_CHECK(!strcmp(r.calls[0][0], "get_weather"));
        BT_CHECK_MSG(!strcmp(r.calls[0][1], "{\"city\": \"Paris\", \"days\": 3}"), "args %s", r.calls[0][1]);
    }
    /* the same text with the parsers off (tool_choice none, or no parser flags) is raw content */
    bt_output_options_t raw = {NULL, 0, true, false, false, false, 0};
    result_t r;
    run(text, &raw, 1, &r);
    BT_CHECK(strstr(r.content, "</think>") && strstr(r.content, "invoke name=\"get_weather\""));
    BT_CHECK_EQ_INT(r.n_calls, 0);
}

static void test_stop_strings(void)
{
    const char *stops[] = {"STOP", "Ω end"};
    bt_output_options_t o = {stops, 2, true, false, false, false, 0};
    result_t r;
    for (size_t step = 1; step <= 5; step++) {
        run("Hello there, world. STOP and more text", &o, step, &r);
        BT_CHECK_MSG(!strcmp(r.content, "Hello there, world. "), "step %zu: '%s'", step, r.content);
        BT_CHECK(r.stopped && !strcmp(r.matched, "STOP"));
        run("naïve Ω then Ω end!", &o, step, &r);
        BT_CHECK_MSG(!strcmp(r.content, "naïve Ω then "), "step %zu: '%s'", step, r.content);
        BT_CHECK(r.stopped && !strcmp(r.matched, "Ω end"));
        /* a partial stop string at the very end is released when the stream ends */
        run("ends with STO", &o, step, &r);
        BT_CHECK(!strcmp(r.content, "ends with STO") && !r.stopped);
    }
    /* stop strings inside the reasoning stop it too (they apply to the raw text) */
    bt_output_options_t o2 = {stops, 2, true, true, false, true, 0};
    run("thinking STOP</think>answer", &o2, 1, &r);
    BT_CHECK(!strcmp(r.reasoning, "thinking ") && !strcmp(r.content, "") && r.stopped);
}

static void test_special_tokens_and_utf8(void)
{
    /* skip_special drops the EOS text; multi-byte characters never split across deltas */
    bt_output_options_t o = {NULL, 0, true, false, false, false, 0};
    result_t r;
    run("日本語 😀 done<｜end▁of▁sentence｜>", &o, 1, &r);
    BT_CHECK_MSG(!strcmp(r.content, "日本語 😀 done"), "'%s'", r.content);
    bt_output_options_t keep = {NULL, 0, false, false, false, false, 0};
    run("done<｜end▁of▁sentence｜>", &keep, 1, &r);
    BT_CHECK(strstr(r.content, "end▁of▁sentence") != NULL);
}

/* A NUL the model writes (the byte-level token for 0x00) comes out as U+FFFD: the text is a C
 * string to the client, and the NUL cut it (a stop string after it never matched). */
static void test_nul_byte(void)
{
    int32_t *x, *y, nul;
    size_t nx, ny;
    BT_CHECK(bt_tokenizer_encode(tok, "x", 1, 0, &x, &nx) == BT_OK && nx == 1);
    BT_CHECK(bt_tokenizer_encode(tok, "y", 1, 0, &y, &ny) == BT_OK && ny == 1);
    nul = bt_tokenizer_token_to_id(tok, "\xC4\x80"); /* "Ā": the byte-level symbol of 0x00 */
    size_t nb = 0;
    const char *bytes = nul >= 0 ? bt_tokenizer_id_bytes(tok, nul, &nb) : NULL;
    BT_CHECK_MSG(bytes && nb == 1 && bytes[0] == 0, "id %d is not the byte 0", nul);
    const char *stops[] = {"y"};
    bt_output_options_t o = {stops, 1, true, false, false, false, 0};
    bt_output_t *out = bt_output_create(tok, &o);
    char content[256] = "";
    bool stopped = false;
    const int32_t seq[3] = {x[0], nul, y[0]};
    const size_t m = 3;
    for (size_t i = 0; i < m && !stopped && nul >= 0; i++) {
        bt_output_delta_t d;
        bt_output_push(out, &seq[i], 1, i + 1 == m, &d);
        strncat(content, d.content, d.content_len);
        stopped = d.stopped;
    }
    BT_CHECK_MSG(nul >= 0, "no single id for byte 0");
    BT_CHECK_MSG(stopped, "the stop string after the NUL never matched");
    BT_CHECK_MSG(!strcmp(content, "x\xEF\xBF\xBD"), "content '%s'", content);
    bt_output_destroy(out);
    free(x);
    free(y);
}

int main(void)
{
    char err[256], dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizer", BT_GOLDEN_DIR);
    if (bt_tokenizer_load(dir, &tok, err, sizeof err) != BT_OK) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return 1;
    }
    BT_RUN(test_reasoning_and_tools);
    BT_RUN(test_stop_strings);
    BT_RUN(test_special_tokens_and_utf8);
    BT_RUN(test_nul_byte);
    bt_tokenizer_destroy(tok);
    return bt_test_summary();
}

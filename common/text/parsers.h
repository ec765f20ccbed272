/* Streaming output parsers for DeepSeek-V4.1 (the router runs them on the detokenized text,
 * decoded with skip_special_tokens so EOS is already gone):
 *
 *   reasoning (--reasoning-parser deepseek-v41): text up to "</think>" is reasoning_content,
 *     the rest content. In thinking mode the prompt already opened <think>, so the output
 *     starts inside the reasoning; a leading "<think>" is accepted and dropped either way.
 *   tool calls (--tool-call-parser deepseekv41): the content's DSML block
 *       \n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="NAME">\n
 *       <｜DSML｜ parameter name="K" string="true|false">V</｜DSML｜ parameter>\n ...
 *       </｜DSML｜ invoke>\n</｜DSML｜ calls>
 *     becomes OpenAI tool calls {id, name, arguments as a JSON string}; string="true" values
 *     are JSON-quoted, others inserted as written (as the reference decoder does).
 *
 * Both accept text in chunks of any size (a chunk may even end inside a tag or a UTF-8
 * character) and produce the same result however the text is cut. Malformed or truncated
 * markup never fails: it is passed on as plain content and counted in `warnings` (and
 * logged once per parser).
 *
 *   bt_reasoning_parser_t *rp = bt_reasoning_parser_create(thinking);
 *   bt_tool_parser_t *tp = bt_tool_parser_create(seed);
 *   for each chunk:
 *       bt_reasoning_delta_t r; bt_reasoning_parser_push(rp, s, n, &r);
 *       bt_tool_delta_t t; bt_tool_parser_push(tp, r.content, r.content_len, &t);
 *       send r.reasoning, t.content, t.calls[0..n_calls)
 *   at the end: bt_reasoning_parser_finish(rp, &r); push r.content; bt_tool_parser_finish(tp, &t)
 *   bt_reasoning_parser_destroy(rp); bt_tool_parser_destroy(tp);
 *
 * Delta pointers stay valid until the next call on the same parser. */
#ifndef BT_TEXT_PARSERS_H
#define BT_TEXT_PARSERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- reasoning --------------------------------------------------------------------------- */

typedef struct bt_reasoning_parser bt_reasoning_parser_t;

typedef struct {
    const char *reasoning; /* new reasoning_content text */
    size_t reasoning_len;
    const char *content; /* new content text */
    size_t content_len;
} bt_reasoning_delta_t;

/* thinking: the prompt ended with <think> (chat_template_kwargs.thinking). */
bt_reasoning_parser_t *bt_reasoning_parser_create(bool thinking);
void bt_reasoning_parser_destroy(bt_reasoning_parser_t *p);
void bt_reasoning_parser_push(bt_reasoning_parser_t *p, const char *text, size_t len,
                              bt_reasoning_delta_t *out);
/* Flushes held-back text; an unclosed reasoning span stays reasoning. */
void bt_reasoning_parser_finish(bt_reasoning_parser_t *p, bt_reasoning_delta_t *out);

/* ---- tool calls -------------------------------------------------------------------------- */

typedef struct bt_tool_parser bt_tool_parser_t;

typedef struct {
    int index;             /* 0, 1, ... within the response */
    const char *id;        /* "call_" + 24 hex digits */
    const char *name;
    const char *arguments; /* JSON object text */
} bt_tool_call_t;

typedef struct {
    const char *content; /* new plain content */
    size_t content_len;
    const bt_tool_call_t *calls; /* calls completed by this chunk */
    int n_calls;
    int warnings; /* malformed blocks passed on as content so far */
} bt_tool_delta_t;

/* seed makes the call ids reproducible (0 = from the clock and address). */
bt_tool_parser_t *bt_tool_parser_create(uint64_t seed);
void bt_tool_parser_destroy(bt_tool_parser_t *p);
void bt_tool_parser_push(bt_tool_parser_t *p, const char *text, size_t len, bt_tool_delta_t *out);
/* Ends the stream: an unfinished DSML block is passed on as content (with a warning). */
void bt_tool_parser_finish(bt_tool_parser_t *p, bt_tool_delta_t *out);

#endif

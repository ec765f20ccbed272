/* The router's output path for one request: generated token ids in, user-visible deltas out.
 * Incremental detokenization (whole UTF-8 characters only), stop strings (held back until
 * they can no longer match), then the reasoning parser (the thinking span becomes reasoning
 * text) and the tool-call parser (DSML markup becomes tool calls).
 *
 *   bt_output_options_t o = {.stop = stops, .n_stop = 1, .skip_special = true,
 *                            .reasoning = true, .tools = true, .thinking = true, .seed = 7};
 *   bt_output_t *out = bt_output_create(tok, &o);
 *   bt_output_delta_t d;
 *   bt_output_push(out, ids, n, false, &d);   // d.content, d.reasoning, d.calls[...]
 *   bt_output_push(out, NULL, 0, true, &d);   // flush at the end; d.stopped when a stop matched
 *   bt_output_destroy(out);
 *
 * Delta pointers stay valid until the next push. */
#ifndef BT_SERVICES_OUTPUT_H
#define BT_SERVICES_OUTPUT_H

#include "common/text/parsers.h"
#include "common/text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *const *stop; /* stop strings (copied) */
    int n_stop;
    bool skip_special;       /* decode without special tokens */
    bool reasoning;          /* run the reasoning parser (deepseek-v41) */
    bool tools;              /* run the tool-call parser (deepseekv41) */
    bool thinking;           /* the prompt opened <think> */
    uint64_t seed;           /* makes tool-call ids reproducible */
} bt_output_options_t;

typedef struct {
    const char *content, *reasoning;
    size_t content_len, reasoning_len;
    const bt_tool_call_t *calls; /* calls completed by this push */
    int n_calls;
    bool stopped;                /* a stop string matched: nothing more comes */
    const char *matched_stop;    /* which one ("" when none) */
    int total_tool_calls;        /* over the whole response */
} bt_output_delta_t;

typedef struct bt_output bt_output_t;

bt_output_t *bt_output_create(const bt_tokenizer_t *tok, const bt_output_options_t *opts);
void bt_output_destroy(bt_output_t *o);
/* Feeds token ids (an id outside the vocabulary is skipped); `final` flushes everything held
 * back. After `stopped`, further pushes return empty deltas. */
void bt_output_push(bt_output_t *o, const int32_t *ids, size_t n, bool final, bt_output_delta_t *d);

#endif

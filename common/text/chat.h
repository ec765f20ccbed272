/* DeepSeek-V4.1 chat encoding: an OpenAI chat request (messages, tools,
 * chat_template_kwargs.thinking / enable_thinking, reasoning_effort) rendered to the prompt
 * string the model was trained on, following the encoder shipped with the model
 * (encoding/encoding.py of DeepSeek-V4.1-Flash): BOS, <｜System｜> with the reasoning-effort
 * line in thinking mode, tool schemas in the first system message, tool results merged into
 * user turns as <tool_result> blocks (sorted by call order), DSML tool calls in assistant
 * turns, earlier reasoning dropped before the last user turn unless tools are defined, and
 * the <｜Assistant｜><think> / </think> generation header.
 *
 *   cJSON *req = bt_chat_parse_request(body, body_len);    // keeps number spellings
 *   char err[256];
 *   int32_t *ids; size_t n;
 *   if (bt_chat_encode(tok, req, &ids, &n, err, sizeof err) != BT_OK) -> 400 with err
 *   cJSON_Delete(req); free(ids);
 *
 * Request mapping (as SGLang serves this encoder): `tools` go on the first message, which
 * becomes an empty system message when the conversation does not start with one;
 * thinking is off unless chat_template_kwargs.thinking (or its alias enable_thinking, or a
 * top-level enable_thinking) is true; reasoning_effort is "low" (50), "high" (75, the default),
 * "max" (100) or an integer 1..100 and is rendered only in thinking mode. */
#ifndef BT_TEXT_CHAT_H
#define BT_TEXT_CHAT_H

#include "common/status.h"
#include "common/text/tokenizer.h"

/* The special token that starts each user turn of the encoding. */
#define BT_CHAT_USER_TOKEN "<｜User｜>"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses request JSON keeping each number's spelling, so tool schemas re-serialise exactly
 * as Python's json.dumps would ("1.0" stays "1.0"). NULL on malformed JSON. A tree from a
 * plain cJSON_Parse also works; its integral numbers print as integers. */
cJSON *bt_chat_parse_request(const char *json, size_t len);

/* Renders the prompt text (malloc'd, NUL-terminated; caller frees). BT_ERR_BAD_REQUEST with
 * a message naming the field for a request the reference encoder would reject. */
bt_status_t bt_chat_render(const cJSON *request, char **prompt_p, size_t *len_p, char *err,
                           size_t errlen);

/* Whether the request renders in thinking mode (the prompt ends in <think>): the one rule the
 * encoder and the reasoning parser's user share. BT_ERR_BAD_REQUEST as bt_chat_render. */
bt_status_t bt_chat_thinking(const cJSON *request, bool *thinking_p, char *err, size_t errlen);

/* Renders and tokenizes (special-token text in the prompt becomes special ids). *ids_p is
 * malloc'd (caller frees). */
bt_status_t bt_chat_encode(const bt_tokenizer_t *tok, const cJSON *request, int32_t **ids_p,
                           size_t *n_p, char *err, size_t errlen);

#endif

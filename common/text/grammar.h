/* Constrained decoding: which token ids may come next so that the output stays a JSON object,
 * any (OpenAI's response_format {"type": "json_object"}) or one a JSON schema describes
 * ({"type": "json_schema"}). A pushdown automaton over the output's bytes (RFC 8259, strict
 * UTF-8 and paired surrogates inside strings) whose stack frames name schema nodes; the tokens
 * it allows are found by walking a trie of the vocabulary's byte strings from the automaton's
 * state, and the masks are cached by state, so a long string or a repeated structure costs a
 * lookup per token.
 *
 *   bt_grammar_vocab_t *v;                       // once per worker
 *   bt_grammar_vocab_create(tok, vocab, eos_id, &v);
 *   bt_grammar_t *g;                             // one per request
 *   bt_grammar_json_schema(v, schema, len, after_token, &g, err, errlen);   // schema NULL: any
 * object if (bt_grammar_active(g)) bt_grammar_mask(g, mask);          // vocab bits: 1 = allowed
 *   ... draw t under the mask ...
 *   bt_grammar_accept(g, t);                     // false: t was not allowed (state unchanged)
 *   bt_grammar_done(g)                           // the object is closed: only eos may follow
 *
 * Schemas: type (one or a list), properties (generated in their order; required ones always,
 * others may be left out; no properties beyond them), required, additionalProperties (true or
 * false: nothing beyond the properties is generated either way), items, minItems, maxItems,
 * enum, const, anyOf / oneOf (branches that start with different characters), $ref into $defs
 * or definitions (recursion included), minimum / maximum / exclusive* / multipleOf on integers
 * and numbers (a bounded number without an exponent, up to 18 decimals), minLength / maxLength
 * and pattern (common/text/regex.h) or format (date, time, date-time, email, hostname, ipv4,
 * uuid) on strings, and annotations (title, description, default, ...).
 * Keywords that would constrain what is not checked (other formats, allOf, not, ...)
 * are refused with an error naming them, not ignored; the root must be an object.
 *
 * Special tokens are never allowed, eos only once the object is closed. Whitespace runs are
 * capped (BT_GRAMMAR_MAX_WS bytes) and so are numbers (BT_GRAMMAR_MAX_NUMBER), so a model
 * cannot loop on them forever; nesting deeper than BT_GRAMMAR_MAX_DEPTH is not opened. */
#ifndef BT_TEXT_GRAMMAR_H
#define BT_TEXT_GRAMMAR_H

#include "common/status.h"
#include "common/text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    BT_GRAMMAR_MAX_DEPTH = 32,
    BT_GRAMMAR_MAX_WS = 64,
    BT_GRAMMAR_MAX_NUMBER = 64,
    BT_GRAMMAR_MAX_PROPERTIES = 64, /* of one object */
};

typedef struct bt_grammar_vocab bt_grammar_vocab_t;
typedef struct bt_grammar bt_grammar_t;

/* The vocabulary ids 0 .. vocab-1 of tok as byte strings (ids the tokenizer lacks, special
 * tokens and empty ones are never allowed). Thread-safe once made. */
bt_status_t bt_grammar_vocab_create(const bt_tokenizer_t *tok, int vocab, int32_t eos_id,
                                    bt_grammar_vocab_t **v_p);
/* The same from byte strings (bytes[i] of lens[i]; NULL: never allowed), for tests. */
bt_status_t bt_grammar_vocab_create_bytes(const char *const *bytes, const size_t *lens, int vocab,
                                          int32_t eos_id, bt_grammar_vocab_t **v_p);
void bt_grammar_vocab_destroy(bt_grammar_vocab_t *v);
int bt_grammar_vocab_size(const bt_grammar_vocab_t *v);
/* Words of a mask: (vocab + 31) / 32. */
int bt_grammar_mask_words(const bt_grammar_vocab_t *v);
/* Masks computed (cache misses) and looked up, since creation, over every schema. */
void bt_grammar_vocab_stats(bt_grammar_vocab_t *v, uint64_t *computed, uint64_t *cached);

/* Checks that schema (JSON text of len bytes) is one this module takes; err names what is not. */
bt_status_t bt_grammar_schema_check(const char *schema, size_t len, char *err, size_t errlen);

/* A request's constraint: the object schema describes (schema NULL: any JSON object). The
 * compiled schema is shared by the requests that send the same text (and so are its masks).
 * after_token >= 0: free output until that token was generated (the end of a reasoning block),
 * the object after it; < 0: the object from the first token. */
bt_status_t bt_grammar_json_schema(bt_grammar_vocab_t *v, const char *schema, size_t len,
                                   int32_t after_token, bt_grammar_t **g_p, char *err,
                                   size_t errlen);
/* Tool calls instead of a JSON object: a block of DeepSeek's DSML tool calls (chat.c renders
 * the format), each naming one of spec's tools with parameters its schema describes (string ones
 * written raw, held to their pattern or format if any but not to lengths; the rest as JSON; the
 * schema's root an object that lists its properties). spec:
 * {"tools": [{"name": ..., "parameters": {...}}, ...], "one": true|false}; one: exactly one call
 * (a named tool_choice), else one or more (tool_choice "required"). */
bt_status_t bt_grammar_tool_calls(bt_grammar_vocab_t *v, const char *spec, size_t len,
                                  int32_t after_token, bt_grammar_t **g_p, char *err,
                                  size_t errlen);
bt_status_t bt_grammar_tool_calls_check(const char *spec, size_t len, char *err, size_t errlen);
/* A regex constraint (SGLang's and vLLM's regex): the whole output, as UTF-8, matches pattern
 * (common/text/regex.h's subset of ECMA-262); eos is allowed wherever the output may end. */
bt_status_t bt_grammar_regex(bt_grammar_vocab_t *v, const char *pattern, size_t len,
                             int32_t after_token, bt_grammar_t **g_p, char *err, size_t errlen);
bt_status_t bt_grammar_regex_check(const char *pattern, size_t len, char *err, size_t errlen);
/* A request's constraint by name, as SamplingParams carry it: kind "json_object" (spec empty),
 * "json_schema" (spec: the schema), "tool_calls" (spec: the tool spec) or "regex" (spec: the
 * pattern); kind NULL or "": none.
 * _check: BT_OK when it compiles, else err names what is wrong (the router's check); the other
 * makes it into *g_p (NULL for none), as the workers do. */
bt_status_t bt_grammar_request_check(const char *kind, const char *spec, char *err, size_t errlen);
/* Checks made, and those answered from the verdicts kept on recent specs (the last 64). */
void bt_grammar_check_stats(uint64_t *checked, uint64_t *cached);
bt_status_t bt_grammar_request(bt_grammar_vocab_t *v, const char *kind, const char *spec,
                               int32_t after_token, bt_grammar_t **g_p, char *err, size_t errlen);
/* Any JSON object (bt_grammar_json_schema with no schema). */
bt_grammar_t *bt_grammar_json_object(bt_grammar_vocab_t *v, int32_t after_token);
void bt_grammar_destroy(bt_grammar_t *g);
/* A copy of g in its state (tests and benchmarks try tokens on copies). */
bt_grammar_t *bt_grammar_clone(const bt_grammar_t *g);

/* Whether the next token is constrained (false while waiting for after_token). */
bool bt_grammar_active(const bt_grammar_t *g);
/* The ids allowed next, as bits (bit i % 32 of word i / 32), into mask[bt_grammar_mask_words]. */
void bt_grammar_mask(bt_grammar_t *g, uint32_t *mask);
/* Advances by token t; false when t is not allowed (the state is then unchanged). */
bool bt_grammar_accept(bt_grammar_t *g, int32_t t);
/* Advances by raw bytes (tests); false on the first byte not allowed (state unchanged). */
bool bt_grammar_accept_bytes(bt_grammar_t *g, const char *bytes, size_t len);
/* The object is complete (a regex's output: its eos accepted): nothing but eos is allowed. */
bool bt_grammar_done(const bt_grammar_t *g);

#endif

/* Constrained decoding: which token ids may come next so that the output stays a valid JSON
 * object (OpenAI's response_format {"type": "json_object"}). A pushdown automaton over the
 * output's bytes (RFC 8259, strict UTF-8 inside strings); the tokens it allows are found by
 * walking a trie of the vocabulary's byte strings from the automaton's state, and the masks are
 * cached by state, so a long string or a repeated structure costs a lookup per token.
 *
 *   bt_grammar_vocab_t *v;                       // once per worker
 *   bt_grammar_vocab_create(tok, vocab, eos_id, &v);
 *   bt_grammar_t *g = bt_grammar_json_object(v, after_token);   // one per request
 *   if (bt_grammar_active(g)) bt_grammar_mask(g, mask);          // vocab bits: 1 = allowed
 *   ... draw t under the mask ...
 *   bt_grammar_accept(g, t);                     // false: t was not allowed (state unchanged)
 *   bt_grammar_done(g)                           // the object is closed: only eos may follow
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
    BT_GRAMMAR_MAX_DEPTH = 64,
    BT_GRAMMAR_MAX_WS = 64,
    BT_GRAMMAR_MAX_NUMBER = 64,
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
/* Masks computed (cache misses) and looked up, since creation: for tests and metrics. */
void bt_grammar_vocab_stats(bt_grammar_vocab_t *v, uint64_t *computed, uint64_t *cached);

/* A JSON object constraint. after_token >= 0: free output until that token was generated (the
 * end of a reasoning block), the object after it; < 0: the object from the first token. */
bt_grammar_t *bt_grammar_json_object(bt_grammar_vocab_t *v, int32_t after_token);
void bt_grammar_destroy(bt_grammar_t *g);

/* Whether the next token is constrained (false while waiting for after_token). */
bool bt_grammar_active(const bt_grammar_t *g);
/* The ids allowed next, as bits (bit i % 32 of word i / 32), into mask[bt_grammar_mask_words]. */
void bt_grammar_mask(bt_grammar_t *g, uint32_t *mask);
/* Advances by token t; false when t is not allowed (the state is then unchanged). */
bool bt_grammar_accept(bt_grammar_t *g, int32_t t);
/* Advances by raw bytes (tests); false on the first byte not allowed (state unchanged). */
bool bt_grammar_accept_bytes(bt_grammar_t *g, const char *bytes, size_t len);
/* The object is complete: nothing but eos is allowed. */
bool bt_grammar_done(const bt_grammar_t *g);

#endif

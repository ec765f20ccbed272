/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (as DeepSeek ships it):
 * added/special tokens matched first, then the pre-tokenizer sequence (Split regexes through
 * PCRE2 with JIT, ByteLevel), then ranked BPE merges. Decoding is the ByteLevel decoder with
 * Rust/Python-style lossy UTF-8. A loaded tokenizer is immutable: any number of threads may
 * encode and decode with it at once.
 *
 *   bt_tokenizer_t *tok;
 *   char err[256];
 *   if (bt_tokenizer_load("/models/ds", &tok, err, sizeof err) != BT_OK) { ... }
 *   int32_t *ids; size_t n;
 *   bt_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n);      // caller frees ids
 *   char *back; size_t len;
 *   bt_tokenizer_decode(tok, ids, n, false, &back, &len);            // caller frees back
 *
 *   bt_detok_t *d;                                                    // streaming decode
 *   bt_detok_create(tok, true, &d);
 *   for each new id: bt_detok_push(d, &id, 1, &chunk, &chunk_len);    // whole characters only
 *   bt_detok_finish(d, &chunk, &chunk_len);
 *   bt_detok_destroy(d);
 *   bt_tokenizer_destroy(tok);
 *
 * Text given to encode may hold any bytes: ill-formed UTF-8 is first replaced by U+FFFD the
 * way Python's decode("utf-8", "replace") does, so the ids are those of that string. */
#ifndef BT_TEXT_TOKENIZER_H
#define BT_TEXT_TOKENIZER_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bt_tokenizer bt_tokenizer_t;

/* Loads dir/tokenizer.json and, when present, dir/tokenizer_config.json (bos/eos/pad,
 * add_bos_token). On error writes a message into err and returns BT_ERR_NOT_FOUND,
 * BT_ERR_BAD_TOKENIZER or BT_ERR_UNSUPPORTED (a component this loader does not implement). */
bt_status_t bt_tokenizer_load(const char *dir, bt_tokenizer_t **tok_p, char *err, size_t errlen);
/* Same from the JSON texts themselves; config_json may be NULL. */
bt_status_t bt_tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                                   size_t config_len, bt_tokenizer_t **tok_p, char *err,
                                   size_t errlen);
void bt_tokenizer_destroy(bt_tokenizer_t *tok);

/* Number of ids: one past the largest id of the vocabulary and added tokens. */
int bt_tokenizer_vocab_size(const bt_tokenizer_t *tok);

/* Ids from tokenizer_config.json (or the tokenizer's own tokens); -1 when undefined. */
int32_t bt_tokenizer_bos_id(const bt_tokenizer_t *tok);
int32_t bt_tokenizer_eos_id(const bt_tokenizer_t *tok);
int32_t bt_tokenizer_pad_id(const bt_tokenizer_t *tok);
/* tokenizer_config.json add_bos_token (false when absent). */
bool bt_tokenizer_add_bos(const bt_tokenizer_t *tok);

/* The id of a vocabulary or added token given as its vocabulary string, -1 when unknown. */
int32_t bt_tokenizer_token_to_id(const bt_tokenizer_t *tok, const char *token);
/* The vocabulary string of id (ByteLevel alphabet for BPE tokens), NULL when out of range.
 * The string belongs to the tokenizer. */
const char *bt_tokenizer_id_to_token(const bt_tokenizer_t *tok, int32_t id);
/* true for added tokens marked special (skipped by skip_special decoding). */
bool bt_tokenizer_is_special(const bt_tokenizer_t *tok, int32_t id);
/* The raw bytes one id decodes to (before UTF-8 repair); NULL when out of range. */
const char *bt_tokenizer_id_bytes(const bt_tokenizer_t *tok, int32_t id, size_t *len_p);

enum {
    BT_TOKENIZER_ADD_BOS = 1 << 0,       /* prepend the BOS id */
    BT_TOKENIZER_NO_ADDED_TOKENS = 1 << 1, /* treat added-token text literally */
};

/* Encodes text[0..len) (any bytes; see above) into *ids_p (malloc'd, caller frees; non-NULL
 * even when *n_p is 0). */
bt_status_t bt_tokenizer_encode(const bt_tokenizer_t *tok, const char *text, size_t len,
                                unsigned flags, int32_t **ids_p, size_t *n_p);

/* Decodes ids into *text_p (malloc'd, NUL-terminated, valid UTF-8; caller frees).
 * BT_ERR_INVALID_ARG when an id is out of range. */
bt_status_t bt_tokenizer_decode(const bt_tokenizer_t *tok, const int32_t *ids, size_t n,
                                bool skip_special, char **text_p, size_t *len_p);

/* The engram token map: token ids merged into classes by NFKC, NFD, strip accents,
 * lowercase and whitespace folding of each token's decoded text (tokens whose decode holds
 * U+FFFD are keyed by their vocabulary string); classes numbered in order of first
 * appearance. *map_p is malloc'd [vocab_size] (caller frees). */
bt_status_t bt_tokenizer_engram_token_map(const bt_tokenizer_t *tok, int32_t **map_p,
                                          int *n_classes_p);

/* The same map for a model of `vocab` token ids, whose embedding may have more rows than the
 * tokenizer has ids (DeepSeek's 129280 rows for ~128.8k ids): *map_p is malloc'd [vocab], the
 * ids the tokenizer lacks in the last class (they are never tokenized; a sampled one still
 * hashes as something); a tokenizer with more ids than the model keeps the first vocab. */
bt_status_t bt_tokenizer_engram_token_map_for(const bt_tokenizer_t *tok, int vocab,
                                              int32_t **map_p, int *n_classes_p);

/* What the tokenizer in a model directory tells a model of `vocab` ids, as the engine's
 * callers (workers, CLI, benches) need it: *emit_vocab_p, the ids a sampler may pick (the
 * tokenizer's, which text can carry: a larger embedding's padding rows are left out; vocab when
 * the directory has no tokenizer.json; emit_vocab_p may be NULL), and with want_map the engram
 * token map of bt_tokenizer_engram_token_map_for (then a tokenizer is required: its error
 * otherwise). */
bt_status_t bt_tokenizer_for_model(const char *dir, int vocab, bool want_map, int32_t **map_p,
                                   int *n_classes_p, int *emit_vocab_p, char *err, size_t errlen);

/* ---- streaming detokenizer ------------------------------------------------------------- */

/* Turns ids arriving one or a few at a time into text chunks that hold whole UTF-8
 * characters only; the concatenation of every chunk (finish included) equals
 * bt_tokenizer_decode of all the ids. One per request; keeps a pointer to tok. */
typedef struct bt_detok bt_detok_t;

bt_status_t bt_detok_create(const bt_tokenizer_t *tok, bool skip_special, bt_detok_t **d_p);
void bt_detok_destroy(bt_detok_t *d);
/* Feeds ids; out_p and out_len_p receive the newly completed text (may be empty), valid until
 * the next call on d. BT_ERR_INVALID_ARG for an out-of-range id (nothing consumed). */
bt_status_t bt_detok_push(bt_detok_t *d, const int32_t *ids, size_t n, const char **out_p,
                          size_t *out_len_p);
/* Flushes what is held back (an unfinished character becomes U+FFFD, as a one-shot decode
 * would write it). The detokenizer may be reused afterwards for a new stream. */
bt_status_t bt_detok_finish(bt_detok_t *d, const char **out_p, size_t *out_len_p);

#endif

/* Internal helpers shared by the common/text modules: a growable byte buffer, UTF-8
 * utilities (lossy decoding with the Unicode "maximal subpart" rule, validation) and a
 * JSON writer that prints values the way Python's json.dumps(ensure_ascii=False) does.
 * Not a public interface: symbols are bt__ prefixed and may change. */
#ifndef BT_TEXT_INTERNAL_H
#define BT_TEXT_INTERNAL_H

#include "common/status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable buffer --------------------------------------------------------------------- */

typedef struct {
    char *data; /* always NUL-terminated when non-NULL */
    size_t len;
    size_t cap;
} bt__buf_t;

void bt__buf_reserve(bt__buf_t *b, size_t extra);
void bt__buf_append(bt__buf_t *b, const void *p, size_t n);
void bt__buf_puts(bt__buf_t *b, const char *s);
void bt__buf_putc(bt__buf_t *b, char c);
void bt__buf_printf(bt__buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes to the caller (never NULL; "" when empty) and resets the buffer. */
char *bt__buf_take(bt__buf_t *b, size_t *len_p);
void bt__buf_free(bt__buf_t *b);

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), 0 when s does not start with one.
 * *cp_p receives the code point when valid. */
int bt__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp_p);
/* Appends the UTF-8 form of cp (cp < 0x110000, not a surrogate). */
void bt__utf8_put(bt__buf_t *b, uint32_t cp);
/* 1 when s[0..n) is entirely valid UTF-8. */
bool bt__utf8_valid(const char *s, size_t n);

/* Appends s[0..n) to out, replacing every ill-formed subsequence with U+FFFD exactly as
 * Rust's String::from_utf8_lossy and Python's decode("utf-8", "replace") do (one U+FFFD per
 * maximal subpart). When `final` is false and the input ends in an incomplete but so far
 * valid sequence, those trailing bytes are not consumed. Returns the bytes consumed. */
size_t bt__utf8_lossy(bt__buf_t *out, const uint8_t *s, size_t n, bool final);

/* ---- JSON output like Python's json.dumps(value, ensure_ascii=False) --------------------- */

/* Parses JSON with cJSON and keeps each number's source lexeme (in the number item's unused
 * valuestring, which cJSON_Delete frees), so that integers and floats print back as Python
 * prints them after json.loads. NULL on malformed JSON. */
cJSON *bt__json_parse(const char *text, size_t len);

/* Writes item like json.dumps(item, ensure_ascii=False): ", " and ": " separators, non-ASCII
 * kept, numbers from their lexeme when known. */
void bt__json_dump(bt__buf_t *b, const cJSON *item);
/* A string as a JSON string literal (Python escaping). */
void bt__json_dump_string(bt__buf_t *b, const char *s);
/* A double as Python's repr(float) writes it ("1.0", "1e-05", "1e+16", "0.1"). */
void bt__json_dump_float(bt__buf_t *b, double v);

#endif

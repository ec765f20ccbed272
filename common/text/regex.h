/* JSON Schema's `pattern` (ECMA-262 regular expressions, on code points) compiled into a DFA over
 * UTF-8 bytes, for constrained decoding: a string is accepted when it contains a match, as the
 * keyword means (an alternative anchored with ^ or $ holds at that end), so the DFA takes the
 * whole string. States that can no longer reach acceptance through the bytes any text can
 * hold (anything but the control characters other than tab, newline and carriage return) are
 * cut: a transition to 0 means "not here", and every live state can still finish.
 *
 *   bt_regex_t *re;
 *   if (bt_regex_compile("^[A-Z]{3}-\\d{4}$", len, BT_REGEX_SEARCH, &re, err, sizeof err)) ...
 *   (BT_REGEX_WHOLE: the whole string must match, as a regex constraint on a whole output is
 *   read; anchors at the ends are then allowed and change nothing)
 *   uint16_t s = re->start;
 *   for (each byte c) if (!(s = re->next[s * 256 + c])) ... c cannot come
 *   re->accept[s]: the string may end here
 *
 * Supported: literals, ., escapes (\d \D \w \W \s \S \t \n \r \f \v \0 \xHH \uHHHH \u{H..}
 * and escaped punctuation), classes [...] / [^...] with ranges, groups ( ) (?: ) (?<name> ),
 * alternation, the quantifiers * + ? {n} {n,} {n,m} (lazy forms: the same language), and ^ / $
 * at the ends of the pattern or of a top-level alternative. Lookaround, backreferences, word
 * boundaries and anchors elsewhere are refused with an error naming them. */
#ifndef BT_TEXT_REGEX_H
#define BT_TEXT_REGEX_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { BT_REGEX_MAX_STATES = 4096 };
typedef enum { BT_REGEX_SEARCH, BT_REGEX_WHOLE } bt_regex_mode_t;

typedef struct {
    int n_states;    /* state 0: dead */
    uint16_t start;  /* live: some string is accepted */
    uint16_t *next;  /* [n_states][256]: the state after a byte; 0: the byte cannot come */
    uint8_t *accept; /* [n_states] */
} bt_regex_t;

bt_status_t bt_regex_compile(const char *pattern, size_t len, bt_regex_mode_t mode,
                             bt_regex_t **re_p, char *err, size_t errlen);
/* Narrows re to strings of lo..hi characters (code points; hi < 0: no upper bound), as JSON
 * Schema's minLength / maxLength beside a pattern: the DFA becomes its product with a count of
 * the characters so far (up to hi, or saturating at lo), cut again to the states that can
 * still finish. Fails, re unchanged, with more than max_states states or no string left. */
bt_status_t bt_regex_limit_length(bt_regex_t *re, long lo, long hi, int max_states, char *err,
                                  size_t errlen);
void bt_regex_free(bt_regex_t *re);
/* Whether the whole of s (UTF-8) is accepted: s contains a match of the pattern. */
bool bt_regex_accepts(const bt_regex_t *re, const char *s, size_t len);

#endif

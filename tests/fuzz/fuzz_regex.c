/* libFuzzer: JSON Schema patterns (common/text/regex.h). The input up to its first NUL is the
 * pattern, the rest a string; both modes (a match anywhere, the whole). Compiling must fail with a
 * message that says "pattern: ", or give a DFA within its bounds whose every state can still reach
 * acceptance through the bytes a text holds; the string's verdict must not depend on how it is
 * fed. */
#include "common/text/regex.h"

#include <stdlib.h>
#include <string.h>

static bool text_byte(int b)
{
    return b >= 0x20 || b == '\t' || b == '\n' || b == '\r';
}

static void check(const char *pattern, size_t plen, bt_regex_mode_t mode, const char *str,
                  size_t slen)
{
    char err[256] = "";
    bt_regex_t *re = NULL;
    if (bt_regex_compile(pattern, plen, mode, &re, err, sizeof err) != BT_OK) {
        if (re || strncmp(err, "pattern: ", 9) != 0 || !err[9]) abort();
        return;
    }
    const int n = re->n_states;
    if (n < 2 || n > BT_REGEX_MAX_STATES || re->start < 1 || re->start >= n) abort();
    /* every state finishes: acceptance reached backwards through JSON string bytes */
    char *reach = calloc((size_t)n, 1);
    for (int s = 1; s < n; s++)
        reach[s] = (char)re->accept[s];
    for (bool grew = true; grew;) {
        grew = false;
        for (int s = 1; s < n; s++)
            for (int b = 0; b < 256 && !reach[s]; b++)
                if (text_byte(b) && reach[re->next[s * 256 + b]]) reach[s] = grew = true;
    }
    for (int s = 1; s < n; s++)
        if (!reach[s]) abort();
    for (int b = 0; b < 256; b++)
        if (re->next[b] != 0) abort(); /* the dead state stays dead */
    free(reach);
    /* the string whole, and byte by byte */
    uint16_t st = re->start;
    for (size_t i = 0; i < slen && st; i++)
        st = re->next[(size_t)st * 256 + (uint8_t)str[i]];
    if (bt_regex_accepts(re, str, slen) != (st && re->accept[st])) abort();
    bt_regex_free(re);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t plen = nul ? (size_t)(nul - data) : size;
    const char *str = nul ? (const char *)nul + 1 : "";
    const size_t slen = nul ? size - plen - 1 : 0;
    check((const char *)data, plen, BT_REGEX_SEARCH, str, slen);
    check((const char *)data, plen, BT_REGEX_WHOLE, str, slen);
    return 0;
}

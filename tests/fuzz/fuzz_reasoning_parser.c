/* libFuzzer: reasoning parser. Byte 0 picks the mode and a chunk size; the rest is model
 * output. Chunked and one-shot parsing must give the same reasoning and content, and
 * together they must hold every input byte except the <think> / </think> tags. */
#include "common/text/parsers.h"
#include "common/text/text_internal.h"

#include <stdlib.h>
#include <string.h>

static void run(const char *s, size_t n, bool thinking, size_t step, bt__buf_t *r, bt__buf_t *c)
{
    bt_reasoning_parser_t *p = bt_reasoning_parser_create(thinking);
    bt_reasoning_delta_t d;
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        bt_reasoning_parser_push(p, s + i, k, &d);
        bt__buf_append(r, d.reasoning, d.reasoning_len);
        bt__buf_append(c, d.content, d.content_len);
    }
    bt_reasoning_parser_finish(p, &d);
    bt__buf_append(r, d.reasoning, d.reasoning_len);
    bt__buf_append(c, d.content, d.content_len);
    bt__buf_reserve(r, 0);
    bt__buf_reserve(c, 0);
    bt_reasoning_parser_destroy(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool thinking = data[0] & 1;
    size_t step = 1 + (data[0] >> 1) % 9;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    bt__buf_t r1 = {0}, c1 = {0}, r2 = {0}, c2 = {0};
    run(s, n, thinking, n ? n : 1, &r1, &c1);
    run(s, n, thinking, step, &r2, &c2);
    if (r1.len != r2.len || memcmp(r1.data, r2.data, r1.len)) abort();
    if (c1.len != c2.len || memcmp(c1.data, c2.data, c1.len)) abort();
    if (r1.len + c1.len > n) abort();
    bt__buf_free(&r1);
    bt__buf_free(&c1);
    bt__buf_free(&r2);
    bt__buf_free(&c2);
    return 0;
}

/* libFuzzer: DSML tool-call parser. Byte 0 picks a chunk size; the rest is model content.
 * Chunked and one-shot parsing must agree on content, calls and warnings; every call's
 * arguments must be NUL-free text starting with '{'. */
#include "common/log.h"
#include "common/text/parsers.h"
#include "common/text/text_internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    bt_log_set_level(BT_LOG_ERROR);
    return 0;
}

static void collect(const bt_tool_delta_t *d, bt__buf_t *c, bt__buf_t *calls)
{
    bt__buf_append(c, d->content, d->content_len);
    for (int k = 0; k < d->n_calls; k++) {
        if (d->calls[k].arguments[0] != '{') abort();
        bt__buf_printf(calls, "%d|%s|%s|%s\n", d->calls[k].index, d->calls[k].id, d->calls[k].name,
                       d->calls[k].arguments);
    }
}

static int run(const char *s, size_t n, size_t step, bt__buf_t *c, bt__buf_t *calls)
{
    bt_tool_parser_t *p = bt_tool_parser_create(7);
    bt_tool_delta_t d;
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        bt_tool_parser_push(p, s + i, k, &d);
        collect(&d, c, calls);
    }
    bt_tool_parser_finish(p, &d);
    collect(&d, c, calls);
    bt__buf_reserve(c, 0);
    bt__buf_reserve(calls, 0);
    int w = d.warnings;
    bt_tool_parser_destroy(p);
    return w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t step = 1 + data[0] % 17;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    bt__buf_t c1 = {0}, k1 = {0}, c2 = {0}, k2 = {0};
    int w1 = run(s, n, n ? n : 1, &c1, &k1);
    int w2 = run(s, n, step, &c2, &k2);
    if (w1 != w2) abort();
    if (c1.len != c2.len || memcmp(c1.data, c2.data, c1.len)) abort();
    if (k1.len != k2.len || memcmp(k1.data, k2.data, k1.len)) abort();
    bt__buf_free(&c1);
    bt__buf_free(&k1);
    bt__buf_free(&c2);
    bt__buf_free(&k2);
    return 0;
}

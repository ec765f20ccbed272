/* libFuzzer: tokenizer input. Arbitrary bytes are encoded with the golden tokenizer; valid
 * UTF-8 must round-trip exactly, anything else must decode to its U+FFFD repair; the same
 * bytes read as ids go through one-shot and streaming decode, which must agree. */
#include "common/text/text_internal.h"
#include "common/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bt_tokenizer_t *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[256];
    if (bt_tokenizer_load(BT_GOLDEN_DIR "/tokenizer", &tok, err, sizeof err) != BT_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids;
    size_t n;
    unsigned flags = size && (data[0] & 1) ? BT_TOKENIZER_NO_ADDED_TOKENS : 0;
    if (bt_tokenizer_encode(tok, (const char *)data, size, flags, &ids, &n) != BT_OK) abort();
    char *text;
    size_t len;
    if (bt_tokenizer_decode(tok, ids, n, false, &text, &len) != BT_OK) abort();
    bt__buf_t want = {0};
    bt__utf8_lossy(&want, data, size, true);
    if (len != want.len || (len && memcmp(text, want.data, len))) abort();
    bt__buf_free(&want);
    free(text);
    free(ids);

    /* the input as a stream of ids */
    size_t m = size / 2;
    int32_t *sid = malloc((m + 1) * sizeof *sid);
    int V = bt_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < m; i++) sid[i] = (int32_t)((data[2 * i] | data[2 * i + 1] << 8) % V);
    bool skip = size && (data[size - 1] & 1);
    if (bt_tokenizer_decode(tok, sid, m, skip, &text, &len) != BT_OK) abort();
    bt_detok_t *d;
    bt_detok_create(tok, skip, &d);
    bt__buf_t got = {0};
    size_t step = size ? 1 + data[0] % 5 : 1;
    for (size_t i = 0; i < m; i += step) {
        const char *out;
        size_t ol;
        size_t k = m - i < step ? m - i : step;
        if (bt_detok_push(d, sid + i, k, &out, &ol) != BT_OK) abort();
        if (!bt__utf8_valid(out, ol)) abort();
        bt__buf_append(&got, out, ol);
    }
    const char *out;
    size_t ol;
    bt_detok_finish(d, &out, &ol);
    bt__buf_append(&got, out, ol);
    if (got.len != len || (len && memcmp(got.data, text, len))) abort();
    bt__buf_free(&got);
    bt_detok_destroy(d);
    free(text);
    free(sid);
    return 0;
}

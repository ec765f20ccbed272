/* libFuzzer: the constrained-decoding automaton (common/text/grammar.h). Byte 0 picks the
 * constraint (0: any JSON object; 1: a JSON schema; 2: a tool-call spec); for 1 and 2 the spec's
 * text runs up to the first NUL. The rest is fed byte by byte (the vocabulary: the 256 bytes, a
 * few JSON and DSML pieces, eos last) until a byte is refused. At every step the mask must agree
 * with trying each single byte on a copy; a complete answer's mask is eos alone; no mask is
 * empty. Compiling any spec must fail cleanly, with a message, or succeed. */
#include "common/log.h"
#include "common/text/grammar.h"

#include <stdlib.h>
#include <string.h>

static const char *const pieces[] = {"{\"",
                                     "\":",
                                     "\",",
                                     "true",
                                     "null",
                                     "12",
                                     "\\u00e9",
                                     "\xef\xbd\x9c"
                                     "DSML"
                                     "\xef\xbd\x9c ",
                                     "</",
                                     "parameter>",
                                     " string=\"true\">",
                                     "invoke name=\""};
enum { N_PIECES = sizeof pieces / sizeof *pieces, VOCAB = 256 + N_PIECES + 1 };
static bt_grammar_vocab_t *vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bt_log_set_level(BT_LOG_ERROR);
    static char bytes[256];
    const char *b[VOCAB];
    size_t len[VOCAB];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        b[i] = &bytes[i];
        len[i] = 1;
    }
    for (int i = 0; i < N_PIECES; i++) {
        b[256 + i] = pieces[i];
        len[256 + i] = strlen(pieces[i]);
    }
    b[VOCAB - 1] = NULL;
    len[VOCAB - 1] = 0;
    if (bt_grammar_vocab_create_bytes(b, len, VOCAB, VOCAB - 1, &vocab) != BT_OK) abort();
    return 0;
}

static bool bit(const uint32_t *m, int t)
{
    return (m[t >> 5] >> (t & 31)) & 1u;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int kind = data[0] % 3;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    const char *spec = NULL;
    size_t spec_len = 0;
    if (kind > 0) {
        const char *nul = memchr(rest, 0, n);
        if (!nul) return 0;
        spec = rest;
        spec_len = (size_t)(nul - rest);
        n -= spec_len + 1;
        rest = nul + 1;
    }
    char err[256] = "";
    bt_grammar_t *g = NULL;
    bt_status_t st = kind == 0 ? (g = bt_grammar_json_object(vocab, -1)) ? BT_OK : BT_ERR_INTERNAL
                     : kind == 1
                         ? bt_grammar_json_schema(vocab, spec, spec_len, -1, &g, err, sizeof err)
                         : bt_grammar_tool_calls(vocab, spec, spec_len, -1, &g, err, sizeof err);
    if (st != BT_OK) {
        if (!err[0] || g) abort(); /* a refusal says why, and gives nothing */
        return 0;
    }
    uint32_t mask[(VOCAB + 31) / 32];
    for (size_t i = 0; i <= n && i < 512; i++) {
        bt_grammar_mask(g, mask);
        bool any = false;
        for (int t = 0; t < VOCAB; t++)
            any |= bit(mask, t);
        if (!any) abort();
        if (bt_grammar_done(g)) {
            for (int t = 0; t < VOCAB - 1; t++)
                if (bit(mask, t)) abort();
            if (!bit(mask, VOCAB - 1) || !bt_grammar_accept(g, VOCAB - 1)) abort();
        }
        for (int t = 0; t < 256; t++) { /* the single bytes: the mask as tried alone */
            bt_grammar_t *c = bt_grammar_clone(g);
            const bool ok = bt_grammar_accept(c, t);
            bt_grammar_destroy(c);
            if (ok != bit(mask, t)) abort();
        }
        if (i == n || !bt_grammar_accept_bytes(g, rest + i, 1)) break;
    }
    bt_grammar_destroy(g);
    return 0;
}

/* Tokenizer against the golden encodings (tokenizers 0.23.2 output), the engram token map
 * against golden-a / golden-a-exact, edge cases, and the streaming detokenizer. */
#include "bt_test.h"

#include "common/alloc.h"
#include "common/json.h"
#include "common/text/text_internal.h"
#include "common/text/tokenizer.h"

#include <stdint.h>
#include <string.h>

static bt_tokenizer_t *tok;

static bt_tokenizer_t *load_golden(void)
{
    char err[256] = "";
    bt_tokenizer_t *t = NULL;
    bt_status_t st = bt_tokenizer_load(BT_GOLDEN_DIR "/tokenizer", &t, err, sizeof err);
    if (st != BT_OK) fprintf(stderr, "load: %s\n", err);
    return t;
}

static char *hex_decode(const char *hex, size_t *len_p)
{
    size_t n = strlen(hex) / 2;
    char *out = bt_malloc_or_die(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[n] = 0;
    *len_p = n;
    return out;
}

static bool ids_equal(const int32_t *a, size_t na, const cJSON *arr)
{
    if ((int)na != cJSON_GetArraySize(arr)) return false;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) if (a[i++] != (int32_t)it->valuedouble) return false;
    return true;
}

static void test_golden_encodings(void)
{
    cJSON *root = NULL;
    char err[256];
    BT_CHECK(bt_json_read_file(BT_GOLDEN_DIR "/tokenizer/encodings_public.json", 1 << 24, &root,
                               err, sizeof err) == BT_OK);
    if (!root || !tok) return;
    int count = 0;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, root)
    {
        size_t len;
        char *text = hex_decode(cJSON_GetObjectItem(rec, "utf8_hex")->valuestring, &len);
        const cJSON *ids = cJSON_GetObjectItem(rec, "ids");
        int32_t *got;
        size_t n;
        BT_CHECK(bt_tokenizer_encode(tok, text, len, 0, &got, &n) == BT_OK);
        BT_CHECK_MSG(ids_equal(got, n, ids), "ids differ for %s", text);
        /* decode the golden ids */
        int32_t *gids = bt_malloc_or_die(sizeof(int32_t) * (size_t)(cJSON_GetArraySize(ids) + 1));
        size_t ng = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, ids) gids[ng++] = (int32_t)it->valuedouble;
        char *dec;
        size_t dl;
        BT_CHECK(bt_tokenizer_decode(tok, gids, ng, false, &dec, &dl) == BT_OK);
        BT_CHECK_MSG(!strcmp(dec, cJSON_GetObjectItem(rec, "decoded")->valuestring), "decode of %s",
                     text);
        free(dec);
        BT_CHECK(bt_tokenizer_decode(tok, gids, ng, true, &dec, &dl) == BT_OK);
        BT_CHECK_MSG(!strcmp(dec, cJSON_GetObjectItem(rec, "decoded_skip_special_tokens")->valuestring),
                     "skip-special decode of %s", text);
        free(dec);
        free(gids);
        free(got);
        free(text);
        count++;
    }
    BT_CHECK(count >= 20);
    cJSON_Delete(root);
}

/* golden-a prompts: ids = ([BOS] + encode(text))[:n_tokens] */
static void test_golden_prompts(void)
{
    cJSON *root = NULL;
    char err[256];
    BT_CHECK(bt_json_read_file(BT_GOLDEN_DIR "/golden-a/prompts.json", 1 << 24, &root, err,
                               sizeof err) == BT_OK);
    if (!root || !tok) return;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, root)
    {
        const char *text = cJSON_GetObjectItem(rec, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(rec, "input_ids");
        int32_t *got;
        size_t n;
        BT_CHECK(bt_tokenizer_encode(tok, text, strlen(text), BT_TOKENIZER_ADD_BOS, &got, &n) == BT_OK);
        int nw = cJSON_GetArraySize(want);
        BT_CHECK((int)n >= nw);
        if ((int)n > nw) n = (size_t)nw;
        BT_CHECK_MSG(ids_equal(got, n, want), "prompt %s", text);
        free(got);
    }
    cJSON_Delete(root);
}

/* tiny safetensors reader: 8-byte LE header length, JSON header, data */
static int64_t *read_i64_tensor(const char *path, const char *name, int *n_p)
{
    char *data;
    size_t len;
    char err[256];
    if (bt_read_file(path, 1u << 30, &data, &len, err, sizeof err) != BT_OK) return NULL;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)(uint8_t)data[i] << (8 * i);
    int64_t *out = NULL;
    cJSON *h = cJSON_ParseWithLength(data + 8, hl);
    const cJSON *e = cJSON_GetObjectItem(h, name);
    const cJSON *offs = cJSON_GetObjectItem(e, "data_offsets");
    if (e && !strcmp(cJSON_GetObjectItem(e, "dtype")->valuestring, "I64") && offs) {
        size_t b = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
        size_t en = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        int n = (int)((en - b) / 8);
        out = bt_malloc_or_die((size_t)n * 8);
        memcpy(out, data + 8 + hl + b, (size_t)n * 8);
        *n_p = n;
    }
    cJSON_Delete(h);
    free(data);
    return out;
}

static void check_token_map(const char *model)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/golden.safetensors", BT_GOLDEN_DIR, model);
    int n = 0;
    int64_t *want = read_i64_tensor(path, "engram.token_map", &n);
    BT_CHECK_MSG(want != NULL, "%s: no engram.token_map", path);
    if (!want) return;
    /* the model's own tokenizer */
    snprintf(path, sizeof path, "%s/%s", BT_GOLDEN_DIR, model);
    char err[256];
    bt_tokenizer_t *t = NULL;
    BT_CHECK(bt_tokenizer_load(path, &t, err, sizeof err) == BT_OK);
    if (!t) {
        free(want);
        return;
    }
    int32_t *map;
    int nc;
    BT_CHECK(bt_tokenizer_engram_token_map(t, &map, &nc) == BT_OK);
    BT_CHECK_EQ_INT(n, bt_tokenizer_vocab_size(t));
    int bad = 0, maxc = -1;
    for (int i = 0; i < n && i < bt_tokenizer_vocab_size(t); i++) {
        if (map[i] != want[i]) {
            if (bad < 5)
                fprintf(stderr, "token_map[%d] = %d, want %lld (token %s)\n", i, map[i],
                        (long long)want[i], bt_tokenizer_id_to_token(t, i));
            bad++;
        }
        if (want[i] > maxc) maxc = (int)want[i];
    }
    BT_CHECK_EQ_INT(bad, 0);
    BT_CHECK_EQ_INT(nc, maxc + 1);
    /* for a model with more embedding rows than tokenizer ids (DeepSeek's 129280 for ~128.8k):
     * a map for every row (the services copied [vocab] entries from the tokenizer's shorter
     * map: a read past its end), the extra rows in the last class; and for fewer rows */
    int n_ids = bt_tokenizer_vocab_size(t), nc2 = 0;
    int32_t *padded = NULL;
    BT_CHECK(bt_tokenizer_engram_token_map_for(t, n_ids + 7, &padded, &nc2) == BT_OK);
    BT_CHECK_EQ_INT(nc2, nc);
    if (padded) {
        BT_CHECK(memcmp(padded, map, (size_t)n_ids * sizeof *map) == 0);
        for (int i = n_ids; i < n_ids + 7; i++) BT_CHECK_EQ_INT(padded[i], nc - 1);
    }
    free(padded);
    padded = NULL;
    BT_CHECK(bt_tokenizer_engram_token_map_for(t, n_ids - 2, &padded, &nc2) == BT_OK);
    if (padded) BT_CHECK(memcmp(padded, map, (size_t)(n_ids - 2) * sizeof *map) == 0);
    free(padded);
    BT_CHECK(bt_tokenizer_engram_token_map_for(t, 0, &padded, &nc2) == BT_ERR_INVALID_ARG);
    /* a model directory's view: ids to sample (the tokenizer's), the padded map */
    int emit = 0;
    BT_CHECK(bt_tokenizer_for_model(path, n_ids + 9, true, &padded, &nc2, &emit, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(emit, n_ids);
    BT_CHECK_EQ_INT(nc2, nc);
    free(padded);
    BT_CHECK(bt_tokenizer_for_model(path, n_ids - 1, false, NULL, NULL, &emit, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(emit, n_ids - 1);
    BT_CHECK(bt_tokenizer_for_model("/nonexistent-baton-dir", 50, false, NULL, NULL, &emit, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(emit, 50); /* no tokenizer: every id */
    padded = NULL;
    BT_CHECK(bt_tokenizer_for_model("/nonexistent-baton-dir", 50, true, &padded, &nc2, &emit, err, sizeof err) != BT_OK);
    BT_CHECK(strstr(err, "engram") != NULL);
    free(map);
    free(want);
    bt_tokenizer_destroy(t);
}

static void test_token_map(void)
{
    check_token_map("golden-a");
    check_token_map("golden-a-exact");
}

static void roundtrip(const char *text, size_t len)
{
    int32_t *ids;
    size_t n;
    BT_CHECK(bt_tokenizer_encode(tok, text, len, 0, &ids, &n) == BT_OK);
    char *back;
    size_t bl;
    BT_CHECK(bt_tokenizer_decode(tok, ids, n, false, &back, &bl) == BT_OK);
    BT_CHECK_MSG(bl == len && !memcmp(back, text, len), "roundtrip of %zu bytes", len);
    free(back);
    free(ids);
}

static void test_edges(void)
{
    if (!tok) return;
    int32_t *ids;
    size_t n;
    /* empty */
    BT_CHECK(bt_tokenizer_encode(tok, "", 0, 0, &ids, &n) == BT_OK);
    BT_CHECK_EQ_INT(n, 0);
    free(ids);
    BT_CHECK(bt_tokenizer_encode(tok, NULL, 0, BT_TOKENIZER_ADD_BOS, &ids, &n) == BT_OK);
    BT_CHECK(n == 1 && ids[0] == 0);
    free(ids);
    char *s;
    size_t sl;
    BT_CHECK(bt_tokenizer_decode(tok, NULL, 0, false, &s, &sl) == BT_OK);
    BT_CHECK(sl == 0 && s[0] == 0);
    free(s);

    /* invalid UTF-8: encodes as the U+FFFD-repaired string */
    const char bad[] = "ab\xff\xc3(\xe6\x97 z\xf0\x9f\x98";
    const char fixed[] = "ab\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD z\xEF\xBF\xBD";
    int32_t *ids2;
    size_t n2;
    BT_CHECK(bt_tokenizer_encode(tok, bad, sizeof bad - 1, 0, &ids, &n) == BT_OK);
    BT_CHECK(bt_tokenizer_encode(tok, fixed, sizeof fixed - 1, 0, &ids2, &n2) == BT_OK);
    BT_CHECK(n == n2 && !memcmp(ids, ids2, n * sizeof *ids));
    BT_CHECK(bt_tokenizer_decode(tok, ids, n, false, &s, &sl) == BT_OK);
    BT_CHECK(!strcmp(s, fixed));
    free(s);
    free(ids);
    free(ids2);

    /* decode of a lone continuation byte token gives U+FFFD; out-of-range id is an error */
    int32_t lone = bt_tokenizer_token_to_id(tok, "\xC2\x80"); /* ByteLevel char for 0x80? */
    (void)lone;
    int32_t oob = 5000;
    BT_CHECK(bt_tokenizer_decode(tok, &oob, 1, false, &s, &sl) == BT_ERR_INVALID_ARG);

    /* long whitespace runs, mixed */
    bt__buf_t b = {0};
    for (int i = 0; i < 5000; i++) bt__buf_putc(&b, ' ');
    bt__buf_puts(&b, "x");
    for (int i = 0; i < 3000; i++) bt__buf_puts(&b, i % 7 ? " " : "\t");
    bt__buf_puts(&b, "\n\n\n   \r\n  y  ");
    for (int i = 0; i < 2000; i++) bt__buf_puts(&b, "\n");
    roundtrip(b.data, b.len);
    /* a space run before a word: the last space goes with the word (" x"), as the regex says */
    BT_CHECK(bt_tokenizer_encode(tok, b.data, 5001, 0, &ids, &n) == BT_OK);
    BT_CHECK(n >= 2);
    if (n >= 2) {
        size_t bl;
        const char *lastb = bt_tokenizer_id_bytes(tok, ids[n - 1], &bl);
        BT_CHECK(lastb && bl >= 2 && lastb[bl - 1] == 'x' && lastb[bl - 2] == ' ');
    }
    free(ids);
    bt__buf_free(&b);

    /* 1 MB of mixed text */
    const char *parts[] = {"The quick brown fox jumps over the lazy dog. ", "数字 12345 ",
                           "Ünïcödé naïve café — “quotes” ", "\tdef f(x):\n    return x**2\n",
                           "<｜User｜>hi<｜Assistant｜></think>", "😀🎉 ", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa "};
    for (int i = 0; b.len < (1u << 20); i++) bt__buf_puts(&b, parts[i % 7]);
    roundtrip(b.data, b.len);
    bt__buf_free(&b);
    /* one 1 MB word (exercises the heap BPE) */
    for (int i = 0; i < (1 << 20); i++) bt__buf_putc(&b, "ab"[i % 3 == 0]);
    roundtrip(b.data, b.len);
    bt__buf_free(&b);

    /* special tokens inline, adjacent and split */
    const char *t1 = "x<｜User｜><｜User｜>y</think><think>z｜DSML｜<｜end▁of▁sentence｜>";
    BT_CHECK(bt_tokenizer_encode(tok, t1, strlen(t1), 0, &ids, &n) == BT_OK);
    int32_t want[] = {bt_tokenizer_token_to_id(tok, "x"), 1000, 1000,
                      bt_tokenizer_token_to_id(tok, "y"), 1012, 1011,
                      bt_tokenizer_token_to_id(tok, "z"), 1013, 1};
    BT_CHECK(n == 9 && !memcmp(ids, want, sizeof want));
    free(ids);
    /* literal mode: no added-token matching */
    BT_CHECK(bt_tokenizer_encode(tok, t1, strlen(t1), BT_TOKENIZER_NO_ADDED_TOKENS, &ids, &n) == BT_OK);
    for (size_t i = 0; i < n; i++) BT_CHECK(ids[i] < 1000 && ids[i] > 2);
    free(ids);
    /* a prefix of a special token is plain text */
    roundtrip("<｜Use <｜User <｜User｜", strlen("<｜Use <｜User <｜User｜"));
    BT_CHECK_EQ_INT(bt_tokenizer_bos_id(tok), 0);
    BT_CHECK_EQ_INT(bt_tokenizer_eos_id(tok), 1);
    BT_CHECK_EQ_INT(bt_tokenizer_pad_id(tok), 2);
    BT_CHECK(bt_tokenizer_is_special(tok, 1000));
    BT_CHECK(!bt_tokenizer_is_special(tok, 1011));
    BT_CHECK_EQ_INT(bt_tokenizer_vocab_size(tok), 1014);
}

/* streams ids through the detokenizer in chunks of `step` and checks the invariants */
static void check_stream(const int32_t *ids, size_t n, size_t step, bool skip)
{
    bt_detok_t *d;
    BT_CHECK(bt_detok_create(tok, skip, &d) == BT_OK);
    bt__buf_t all = {0};
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        const char *out;
        size_t ol;
        BT_CHECK(bt_detok_push(d, ids + i, k, &out, &ol) == BT_OK);
        BT_CHECK(bt__utf8_valid(out, ol));
        bt__buf_append(&all, out, ol);
    }
    const char *out;
    size_t ol;
    BT_CHECK(bt_detok_finish(d, &out, &ol) == BT_OK);
    BT_CHECK(bt__utf8_valid(out, ol));
    bt__buf_append(&all, out, ol);
    char *one;
    size_t l1;
    BT_CHECK(bt_tokenizer_decode(tok, ids, n, skip, &one, &l1) == BT_OK);
    bt__buf_reserve(&all, 0);
    BT_CHECK_MSG(l1 == all.len && !memcmp(one, all.data, l1), "stream step %zu", step);
    free(one);
    bt__buf_free(&all);
    bt_detok_destroy(d);
}

static void test_stream(void)
{
    if (!tok) return;
    const char *texts[] = {"日本語のテキスト、カタカナとひらがな。", "Astral: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈 😀🎉",
                           "<｜User｜>Café<｜Assistant｜><think>é</think>ok"};
    for (size_t t = 0; t < 3; t++) {
        int32_t *ids;
        size_t n;
        BT_CHECK(bt_tokenizer_encode(tok, texts[t], strlen(texts[t]), 0, &ids, &n) == BT_OK);
        for (size_t step = 1; step <= 4; step++) {
            check_stream(ids, n, step, false);
            check_stream(ids, n, step, true);
        }
        free(ids);
    }
    /* random ids, including ones that decode to stray continuation / lead bytes */
    uint32_t seed = 12345;
    for (int trial = 0; trial < 200; trial++) {
        int32_t ids[40];
        size_t n = 1 + trial % 40;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            ids[i] = (int32_t)((seed >> 8) % 1014);
        }
        check_stream(ids, n, 1, trial & 1);
        check_stream(ids, n, 3, trial & 1);
    }
    /* byte tokens forming one 4-byte character arrive one by one: nothing until complete */
    const char *emoji = "😀";
    int32_t *ids;
    size_t n;
    BT_CHECK(bt_tokenizer_encode(tok, emoji, strlen(emoji), 0, &ids, &n) == BT_OK);
    bt_detok_t *d;
    bt_detok_create(tok, false, &d);
    for (size_t i = 0; i < n; i++) {
        const char *out;
        size_t ol;
        bt_detok_push(d, &ids[i], 1, &out, &ol);
        BT_CHECK(i + 1 == n ? ol == 4 : ol == 0);
    }
    /* a truncated character is flushed as U+FFFD by finish */
    const char *out;
    size_t ol;
    bt_detok_push(d, ids, n - 1, &out, &ol);
    BT_CHECK_EQ_INT(ol, 0);
    bt_detok_finish(d, &out, &ol);
    BT_CHECK(ol == 3 && !memcmp(out, "\xEF\xBF\xBD", 3));
    int32_t oob = -1;
    BT_CHECK(bt_detok_push(d, &oob, 1, &out, &ol) == BT_ERR_INVALID_ARG);
    bt_detok_destroy(d);
    free(ids);
}

static void test_load_errors(void)
{
    char err[256];
    bt_tokenizer_t *t = NULL;
    BT_CHECK(bt_tokenizer_load("/nonexistent-dir", &t, err, sizeof err) == BT_ERR_NOT_FOUND);
    const char *bad[] = {
        "{",
        "{\"model\": {\"type\": \"Unigram\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": \"Split\", "
        "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bt_status_t st = bt_tokenizer_load_json(bad[i], strlen(bad[i]), NULL, 0, &t, err, sizeof err);
        BT_CHECK_MSG(st != BT_OK, "case %zu", i);
    }
}

int main(void)
{
    tok = load_golden();
    BT_CHECK(tok != NULL);
    BT_RUN(test_golden_encodings);
    BT_RUN(test_golden_prompts);
    BT_RUN(test_token_map);
    BT_RUN(test_edges);
    BT_RUN(test_stream);
    BT_RUN(test_load_errors);
    bt_tokenizer_destroy(tok);
    return bt_test_summary();
}

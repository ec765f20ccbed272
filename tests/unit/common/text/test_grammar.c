/* The JSON object constraint (common/text/grammar.h): the automaton against a table of valid
 * and invalid texts and against cJSON on random documents; the trie's masks against trying
 * every token alone; random walks under the masks end in objects cJSON parses; the golden
 * tokenizer's vocabulary. */
#include "bt_test.h"

#include "common/text/grammar.h"
#include "common/text/parsers.h"
#include "common/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* A vocabulary of every byte, then n_multi random pieces of JSON-ish text; eos last. */
typedef struct {
    char **bytes;
    size_t *lens;
    int vocab, eos;
    bt_grammar_vocab_t *v;
} synth_t;

static const char *const pieces[] = {"{",        "}",        "[",        "]",        ":",
                                     ",",        "\"",       "\\",       " ",        "\n",
                                     "  ",       "\t",       "true",     "false",    "null",
                                     "tr",       "ue",       "fa",       "lse",      "nu",
                                     "ll",       "0",        "1",        "9",        "-",
                                     ".",        "e",        "E",        "+",        "12",
                                     "3.5",      "-0",       "e+",       "\\u",      "00",
                                     "4f",       "ab",       "key",      "name",     "\\n",
                                     "\\\"",     "é",        "\xc3",     "\xa9",     "日",
                                     "\xe6",     "\x97\xa5", "\xf0\x9f", "\x98\x80", "\xed\xa0\x80",
                                     "\xc0\xaf", "\x01",     "{\"",      "\":",      "\",",
                                     "\"}",      "},",       "}}",       "]]",       "[{",
                                     "\": \"",   "\", \"",   "\"]",      "[1,",      "1]",
                                     ", ",       ": ",       "x",        "\\ud83d",  "\\ude00",
                                     "d8",       "dc",       "3d"};

static void synth_make(synth_t *s, int n_multi)
{
    s->vocab = 256 + n_multi + 1;
    s->eos = s->vocab - 1;
    s->bytes = calloc((size_t)s->vocab, sizeof *s->bytes);
    s->lens = calloc((size_t)s->vocab, sizeof *s->lens);
    for (int i = 0; i < 256; i++) {
        s->bytes[i] = malloc(1);
        s->bytes[i][0] = (char)i;
        s->lens[i] = 1;
    }
    const int np = (int)(sizeof pieces / sizeof pieces[0]);
    for (int i = 0; i < n_multi; i++) {
        char buf[64];
        size_t len = 0;
        const int parts = 1 + (int)(rnd() % 3);
        for (int k = 0; k < parts; k++) {
            const char *p = pieces[rnd() % (uint32_t)np];
            const size_t pl = strlen(p);
            if (len + pl >= sizeof buf) break;
            memcpy(buf + len, p, pl);
            len += pl;
        }
        s->bytes[256 + i] = malloc(len);
        memcpy(s->bytes[256 + i], buf, len);
        s->lens[256 + i] = len;
    }
    BT_CHECK(bt_grammar_vocab_create_bytes((const char *const *)s->bytes, s->lens, s->vocab, s->eos,
                                           &s->v) == BT_OK);
}

static void synth_free(synth_t *s)
{
    bt_grammar_vocab_destroy(s->v);
    for (int i = 0; i < s->vocab; i++)
        free(s->bytes[i]);
    free(s->bytes);
    free(s->lens);
}

/* 1: a complete object; 0: a valid prefix; -1: refused at some byte (under schema; NULL: any
 * object) */
static int judge_schema(bt_grammar_vocab_t *v, const char *schema, const char *text, size_t len)
{
    bt_grammar_t *g;
    char err[256];
    if (bt_grammar_json_schema(v, schema, schema ? strlen(schema) : 0, -1, &g, err, sizeof err) !=
        BT_OK) {
        BT_CHECK_MSG(0, "schema refused: %s", err);
        return -2;
    }
    int verdict = -1;
    bool ok = true;
    for (size_t i = 0; i < len && ok; i++)
        ok = bt_grammar_accept_bytes(g, text + i, 1);
    if (ok) verdict = bt_grammar_done(g) ? 1 : 0;
    bt_grammar_destroy(g);
    return verdict;
}

static int judge(bt_grammar_vocab_t *v, const char *text, size_t len)
{
    return judge_schema(v, NULL, text, len);
}

/* a text and its verdict under a schema (judge_schema's: 1 ends, 0 a valid prefix, -1 refused) */
typedef struct {
    const char *text;
    int want;
} judged_t;

/* each case judged under schema (NULL: any JSON object) */
static void judge_each(bt_grammar_vocab_t *v, const char *schema, const judged_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const int got = judge_schema(v, schema, cases[i].text, strlen(cases[i].text));
        BT_CHECK_MSG(got == cases[i].want, "'%s': %d, want %d", cases[i].text, got, cases[i].want);
    }
}

static void test_table(void)
{
    synth_t s;
    synth_make(&s, 0);
    static const judged_t cases[] = {
        {"{}", 1},
        {" \n{ }", 1},
        {"{\"a\":1}", 1},
        {"{\"a\": [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, \"x\", {}, []]}", 1},
        {"{\"k\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}", 1},
        {"{\"é日😀\": \"ok\"}", 1},
        {"{\"a\":{\"b\":{\"c\":[[[]]]}}}", 1},
        {"{\"s\": \"\\ud83d\\ude00 \\uD7FF \\uE000\"}", 1}, /* a surrogate pair; around them */
        {"{\"s\": \"\\ud83d\"}", -1},                       /* a high surrogate alone */
        {"{\"s\": \"\\ud83dx\"}", -1},
        {"{\"s\": \"\\ud83d\\n\"}", -1},
        {"{\"s\": \"\\ud83d\\u0041\"}", -1},
        {"{\"s\": \"\\ude00\"}", -1}, /* a low surrogate alone */
        {"{\"a\"", 0},
        {"{\"a\": 12", 0},
        {"{\"a\": tr", 0},
        {"{\"a\": \"\xe6\x97", 0},
        {"[1]", -1}, /* the top level is an object */
        {"\"x\"", -1},
        {"{a:1}", -1}, /* keys are strings */
        {"{\"a\" 1}", -1},
        {"{\"a\":01}", -1}, /* no leading zeros */
        {"{\"a\":1.}", -1},
        {"{\"a\":.5}", -1},
        {"{\"a\":+1}", -1},
        {"{\"a\":1e}", -1},
        {"{\"a\":[1,]}", -1}, /* no trailing commas */
        {"{\"a\":1,}", -1},
        {"{\"a\":tru}", -1},
        {"{\"a\":\"\x01\"}", -1}, /* raw control characters */
        {"{\"a\":\"\\x\"}", -1},
        {"{\"a\":\"\\u12g4\"}", -1},
        {"{\"a\":\"\xc0\xaf\"}", -1},         /* overlong */
        {"{\"a\":\"\xed\xa0\x80\"}", -1},     /* a surrogate */
        {"{\"a\":\"\xf4\x90\x80\x80\"}", -1}, /* past U+10FFFF */
        {"{\"a\":\"\xe6\x97\"}", -1},         /* a character cut short */
        {"{}}", -1},
        {"{} ", -1}, /* nothing after the object */
        {"{\"a\":[}", -1},
        {"{\"a\":{]}", -1},
    };
    judge_each(s.v, NULL, cases, sizeof cases / sizeof cases[0]);
    /* caps: nesting, whitespace, numbers */
    char deep[2 * BT_GRAMMAR_MAX_DEPTH + 16];
    size_t n = 0;
    deep[n++] = '{';
    deep[n++] = '"';
    deep[n++] = '"';
    deep[n++] = ':';
    for (int i = 1; i < BT_GRAMMAR_MAX_DEPTH; i++)
        deep[n++] = '[';
    BT_CHECK_EQ_INT(judge(s.v, deep, n), 0);
    deep[n++] = '[';
    BT_CHECK_EQ_INT(judge(s.v, deep, n), -1);
    char ws[BT_GRAMMAR_MAX_WS + 3];
    memset(ws, ' ', sizeof ws);
    ws[0] = '{';
    BT_CHECK_EQ_INT(judge(s.v, ws, BT_GRAMMAR_MAX_WS + 1), 0);
    BT_CHECK_EQ_INT(judge(s.v, ws, BT_GRAMMAR_MAX_WS + 2), -1);
    char num[BT_GRAMMAR_MAX_NUMBER + 8] = "{\"a\":";
    memset(num + 5, '7', BT_GRAMMAR_MAX_NUMBER + 1);
    BT_CHECK_EQ_INT(judge(s.v, num, 5 + BT_GRAMMAR_MAX_NUMBER), 0);
    BT_CHECK_EQ_INT(judge(s.v, num, 6 + BT_GRAMMAR_MAX_NUMBER), -1);
    synth_free(&s);
}

/* A random JSON value into buf (depth-limited), printed compactly or with spaces. */
static void gen_value(char *buf, size_t *n, size_t cap, int depth, bool object_only);

static void put(char *buf, size_t *n, size_t cap, const char *s)
{
    const size_t l = strlen(s);
    if (*n + l < cap) {
        memcpy(buf + *n, s, l);
        *n += l;
    }
}

static void gen_string(char *buf, size_t *n, size_t cap)
{
    static const char *const parts[] = {"a", "key",  " ", "\\n",  "\\\"", "\\u00e9",
                                        "é", "日本", "😀", "\\\\", "/",    "\\ud83d\\ude00"};
    put(buf, n, cap, "\"");
    for (int k = (int)(rnd() % 4); k > 0; k--)
        put(buf, n, cap, parts[rnd() % 12]);
    put(buf, n, cap, "\"");
}

static void gen_value(char *buf, size_t *n, size_t cap, int depth, bool object_only)
{
    static const char *const scalars[] = {"0",        "-1",   "12.5",  "1e9",
                                          "-0.25E-3", "true", "false", "null"};
    const char *sp = rnd() % 2 ? " " : "";
    const uint32_t kind = object_only ? 0 : depth > 3 ? 2 + rnd() % 2 : rnd() % 4;
    if (kind == 0) {
        put(buf, n, cap, "{");
        for (int k = (int)(rnd() % 4), first = 1; k > 0; k--, first = 0) {
            if (!first) put(buf, n, cap, ",");
            put(buf, n, cap, sp);
            gen_string(buf, n, cap);
            put(buf, n, cap, ":");
            put(buf, n, cap, sp);
            gen_value(buf, n, cap, depth + 1, false);
        }
        put(buf, n, cap, sp);
        put(buf, n, cap, "}");
    } else if (kind == 1) {
        put(buf, n, cap, "[");
        for (int k = (int)(rnd() % 4), first = 1; k > 0; k--, first = 0) {
            if (!first) put(buf, n, cap, ",");
            put(buf, n, cap, sp);
            gen_value(buf, n, cap, depth + 1, false);
        }
        put(buf, n, cap, "]");
    } else if (kind == 2) {
        gen_string(buf, n, cap);
    } else {
        put(buf, n, cap, scalars[rnd() % 8]);
    }
}

/* Random objects: accepted whole and complete, every proper prefix incomplete; cJSON parses
 * them. A byte flipped: wherever the automaton still calls it a complete object, so does cJSON. */
static void test_random_documents(void)
{
    synth_t s;
    synth_make(&s, 0);
    int flips_checked = 0;
    for (int it = 0; it < 300; it++) {
        char doc[4096];
        size_t n = 0;
        gen_value(doc, &n, sizeof doc - 1, 0, true);
        doc[n] = 0;
        BT_CHECK_MSG(judge(s.v, doc, n) == 1, "'%s' not taken as a complete object", doc);
        BT_CHECK(judge(s.v, doc, n / 2) == 0);
        cJSON *j = cJSON_Parse(doc);
        BT_CHECK_MSG(j && cJSON_IsObject(j), "cJSON does not parse '%s'", doc);
        cJSON_Delete(j);
        char bad[4096];
        memcpy(bad, doc, n + 1);
        bad[rnd() % n] = "{}[]:,\"\\ 1ae-"[rnd() % 14];
        if (judge(s.v, bad, n) == 1) {
            j = cJSON_Parse(bad);
            BT_CHECK_MSG(j && cJSON_IsObject(j), "'%s' taken, cJSON refuses it", bad);
            cJSON_Delete(j);
            flips_checked++;
        }
    }
    fprintf(stderr, "  300 random objects; %d with a flipped byte still objects, all parsed\n",
            flips_checked);
    synth_free(&s);
}

/* The trie's mask equals trying every token alone, in states reached by prefixes of random
 * documents; a second lookup of a state comes from the cache and is the same. */
static void test_masks_match_brute_force(void)
{
    synth_t s;
    synth_make(&s, 1500);
    const int W = bt_grammar_mask_words(s.v);
    uint32_t *mask = calloc((size_t)W, 4), *again = calloc((size_t)W, 4);
    int states = 0, allowed_total = 0;
    for (int it = 0; it < 40; it++) {
        char doc[2048];
        size_t n = 0;
        gen_value(doc, &n, sizeof doc - 1, 0, true);
        const size_t cut = rnd() % (n + 1);
        bt_grammar_t *g = bt_grammar_json_object(s.v, -1);
        BT_CHECK(bt_grammar_accept_bytes(g, doc, cut));
        bt_grammar_mask(g, mask);
        int diff = 0;
        for (int t = 0; t < s.vocab; t++) {
            bt_grammar_t *h = bt_grammar_json_object(s.v, -1);
            bt_grammar_accept_bytes(h, doc, cut);
            const bool want = bt_grammar_accept(h, t);
            const bool got = (mask[t >> 5] >> (t & 31)) & 1u;
            if (want != got && diff++ < 3)
                BT_CHECK_MSG(0, "after '%.*s': token %d ('%.*s') allowed %d, alone %d", (int)cut,
                             doc, t, (int)s.lens[t], s.bytes[t], got, want);
            allowed_total += got;
            bt_grammar_destroy(h);
        }
        bt_grammar_mask(g, again);
        BT_CHECK(!memcmp(mask, again, (size_t)W * 4));
        bt_grammar_destroy(g);
        states++;
    }
    uint64_t computed, cached;
    bt_grammar_vocab_stats(s.v, &computed, &cached);
    fprintf(stderr,
            "  %d states x %d tokens: masks as tried alone (%d allowed in all); %llu "
            "computed, %llu from the cache\n",
            states, s.vocab, allowed_total, (unsigned long long)computed,
            (unsigned long long)cached);
    BT_CHECK(cached >= (uint64_t)states);
    free(mask);
    free(again);
    synth_free(&s);
}

/* A random walk: uniform among the allowed ids; from step close_after on, '}', ']' and '"' half
 * the time (most walks then end); ids in [tags_from, eos) a third of the time when one is allowed;
 * on_step (may be NULL) sees each state's mask first. */
typedef struct {
    const char *const *bytes;
    const size_t *lens;
    int vocab, eos, close_after, tags_from;
    void (*on_step)(void *ctx, int step, const char *out, size_t n, const uint32_t *mask);
    void *ctx;
} walker_t;

/* Walks g for up to max_tokens into out (NUL-terminated, *n_p bytes): true when it ended with
 * eos. Every mask must allow something, and every id it allows must be accepted. */
static bool walk_once(const walker_t *wk, bt_grammar_t *g, int max_tokens, char *out, size_t cap,
                      size_t *n_p)
{
    const int W = (wk->vocab + 31) / 32;
    uint32_t *mask = calloc((size_t)W, 4);
    int32_t *ids = malloc((size_t)wk->vocab * sizeof *ids);
    size_t n = 0;
    bool done = false;
    for (int k = 0; k < max_tokens && !done; k++) {
        bt_grammar_mask(g, mask);
        if (wk->on_step) wk->on_step(wk->ctx, k, out, n, mask);
        int na = 0, nt = 0;
        for (int t = 0; t < wk->vocab; t++)
            if ((mask[t >> 5] >> (t & 31)) & 1u) {
                ids[na++] = t;
                nt += t >= wk->tags_from && t < wk->eos;
            }
        BT_CHECK_MSG(na > 0, "nothing allowed after '%.*s'", (int)n, out);
        if (!na) break;
        int32_t t = ids[rnd() % (uint32_t)na];
        if (nt && rnd() % 3 == 0) /* a tag, when one fits */
            for (int i = 0, pick = (int)(rnd() % (uint32_t)nt); i < na; i++)
                if (ids[i] >= wk->tags_from && ids[i] < wk->eos && pick-- == 0) t = ids[i];
        if (k >= wk->close_after)
            for (int i = 0; i < na; i++)
                if (wk->lens[ids[i]] == 1 && strchr("}]\"", wk->bytes[ids[i]][0]) && rnd() % 2)
                    t = ids[i];
        if (t == wk->eos) {
            done = bt_grammar_accept(g, t);
            BT_CHECK(done);
            break;
        }
        const bool ok = bt_grammar_accept(g, t);
        BT_CHECK_MSG(ok, "token %d allowed by the mask, refused after '%.*s'", t, (int)n, out);
        if (!ok) break;
        if (n + wk->lens[t] < cap - 1) {
            memcpy(out + n, wk->bytes[t], wk->lens[t]);
            n += wk->lens[t];
        }
    }
    out[n] = 0;
    *n_p = n;
    free(mask);
    free(ids);
    return done;
}

/* Draws uniformly among the allowed tokens until eos: the bytes are an object cJSON parses,
 * and no mask is ever empty. Returns the walks that ended. */
static int random_walks(bt_grammar_vocab_t *v, const char *const *bytes, const size_t *lens,
                        int eos, int walks, int max_tokens)
{
    const walker_t wk = {bytes, lens, bt_grammar_vocab_size(v), eos, max_tokens / 2, eos,
                         NULL,  NULL};
    int ended = 0;
    for (int w = 0; w < walks; w++) {
        bt_grammar_t *g = bt_grammar_json_object(v, -1);
        char out[1 << 14];
        size_t n;
        if (walk_once(&wk, g, max_tokens, out, sizeof out, &n)) {
            ended++;
            cJSON *j = cJSON_ParseWithLength(out, n);
            BT_CHECK_MSG(j && cJSON_IsObject(j), "walk %d ended in '%s', not an object", w, out);
            cJSON_Delete(j);
        }
        bt_grammar_destroy(g);
    }
    return ended;
}

static void test_random_walks(void)
{
    synth_t s;
    synth_make(&s, 800);
    const int ended = random_walks(s.v, (const char *const *)s.bytes, s.lens, s.eos, 200, 400);
    fprintf(stderr,
            "  200 random walks over a 1057-token vocabulary: %d ended, every one an object\n",
            ended);
    BT_CHECK(ended > 100);
    synth_free(&s);
}

/* The golden tokenizer (byte-level BPE with special tokens): special tokens never allowed, eos
 * only at the end; walks end in objects. */
static void test_golden_tokenizer(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/golden-a-exact", BT_GOLDEN_DIR);
    bt_tokenizer_t *tok;
    char err[256];
    BT_CHECK(bt_tokenizer_load(dir, &tok, err, sizeof err) == BT_OK);
    const int vocab = bt_tokenizer_vocab_size(tok);
    const int32_t eos = bt_tokenizer_eos_id(tok);
    bt_grammar_vocab_t *v;
    BT_CHECK(bt_grammar_vocab_create(tok, vocab, eos, &v) == BT_OK);
    const char **bytes = calloc((size_t)vocab, sizeof *bytes);
    size_t *lens = calloc((size_t)vocab, sizeof *lens);
    for (int i = 0; i < vocab; i++)
        bytes[i] = bt_tokenizer_id_bytes(tok, i, &lens[i]);
    const int W = bt_grammar_mask_words(v);
    uint32_t *mask = calloc((size_t)W, 4);
    bt_grammar_t *g = bt_grammar_json_object(v, -1);
    bt_grammar_accept_bytes(g, "{\"a\": \"", 7); /* in a string: the most tokens allowed */
    bt_grammar_mask(g, mask);
    int allowed = 0, special_allowed = 0;
    for (int t = 0; t < vocab; t++) {
        const bool on = (mask[t >> 5] >> (t & 31)) & 1u;
        allowed += on;
        special_allowed += on && bt_tokenizer_is_special(tok, t);
    }
    BT_CHECK(!((mask[eos >> 5] >> (eos & 31)) & 1u));
    BT_CHECK_EQ_INT(special_allowed, 0);
    BT_CHECK(allowed > vocab / 2);
    bt_grammar_destroy(g);
    const int ended = random_walks(v, bytes, lens, eos, 100, 400);
    fprintf(stderr,
            "  golden tokenizer (%d ids): %d allowed inside a string; %d of 100 walks ended, "
            "every one an object\n",
            vocab, allowed, ended);
    BT_CHECK(ended > 50);
    /* after_token: free until that token, then the object */
    const int32_t think_end = bt_tokenizer_token_to_id(tok, "</think>");
    BT_CHECK(think_end >= 0);
    g = bt_grammar_json_object(v, think_end);
    BT_CHECK(!bt_grammar_active(g));
    BT_CHECK(bt_grammar_accept(g, 5) && bt_grammar_accept(g, eos) && !bt_grammar_active(g));
    BT_CHECK(bt_grammar_accept(g, think_end) && bt_grammar_active(g));
    BT_CHECK(!bt_grammar_accept(g, eos)); /* now an object must come first */
    bt_grammar_destroy(g);
    free(mask);
    free(bytes);
    free(lens);
    bt_grammar_vocab_destroy(v);
    bt_tokenizer_destroy(tok);
}

/* ---- schemas ---- */

#define PERSON                                                                                     \
    "{\"type\":\"object\",\"title\":\"Person\",\"properties\":{"                                   \
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"                             \
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150,\"description\":\"years\"},"      \
    "\"email\":{\"type\":[\"string\",\"null\"],\"maxLength\":300},"                                \
    "\"role\":{\"enum\":[\"admin\",\"user\",7,null]},"                                             \
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":2}," \
    "\"score\":{\"type\":\"number\"},"                                                             \
    "\"ok\":{\"type\":\"boolean\"},"                                                               \
    "\"pet\":{\"$ref\":\"#/$defs/Pet\"},"                                                          \
    "\"home\":{\"anyOf\":[{\"$ref\":\"#/$defs/Flat\"},{\"$ref\":\"#/$defs/House\"},"               \
    "{\"type\":\"null\"}]},"                                                                       \
    "\"scores\":{\"type\":\"object\",\"maxProperties\":3,\"additionalProperties\":{\"type\":"      \
    "\"integer\",\"minimum\":0,\"maximum\":9}}},"                                                  \
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false,"                     \
    "\"$defs\":{\"Pet\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"        \
    "\"friend\":{\"anyOf\":[{\"$ref\":\"#/$defs/Pet\"},{\"type\":\"null\"}]}},"                    \
    "\"required\":[\"kind\"]},"                                                                    \
    "\"Flat\":{\"type\":\"object\",\"properties\":{\"floor\":{\"type\":\"integer\"},"              \
    "\"unit\":{\"type\":\"string\"}},\"required\":[\"floor\"]},"                                   \
    "\"House\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"             \
    "\"garden\":{\"type\":\"boolean\"}}}}}"

/* A discriminated union (Pydantic's Field(discriminator=...)): two branches start with "kind",
 * told apart by its value; a third starts otherwise and requires nothing */
#define PETS                                                                                       \
    "{\"type\":\"object\",\"properties\":{\"pet\":{\"anyOf\":[{\"type\":\"object\","               \
    "\"properties\":"                                                                              \
    "{\"kind\":{\"const\":\"cat\"},\"lives\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}}," \
    "\"required\":[\"kind\",\"lives\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":"  \
    "[\"dog\",\"puppy\"]},\"breed\":{\"type\":\"string\",\"maxLength\":8}},\"required\":["         \
    "\"kind\"]},"                                                                                  \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5}}}]}},"    \
    "\"required\":[\"pet\"]}"

/* A union told apart after properties its branches share (a Pydantic model whose
 * discriminator follows common fields): each branch starts with id, name, a tag object and a
 * date, written out in each (not one $ref), then pet_type tells cat from dog; a third branch
 * goes on with wings, which it may leave out */
#define PETS_LATE_COMMON                                                                           \
    "\"id\":{\"type\":\"integer\",\"minimum\":0},\"name\":{\"type\":\"string\",\"maxLength\":6},"  \
    "\"tag\":{\"type\":\"object\",\"properties\":{\"x\":{\"enum\":[1,2]}},\"required\":[\"x\"]},"  \
    "\"born\":{\"type\":\"string\",\"format\":\"date\"},"
#define PETS_LATE                                                                                  \
    "{\"type\":\"object\",\"properties\":{\"pet\":{\"anyOf\":[{\"type\":\"object\","               \
    "\"properties\":{" PETS_LATE_COMMON "\"pet_type\":{\"const\":\"cat\"},"                        \
    "\"lives\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},"                               \
    "\"required\":[\"id\",\"name\",\"tag\",\"born\",\"pet_type\",\"lives\"]},"                     \
    "{\"type\":\"object\",\"properties\":{" PETS_LATE_COMMON "\"pet_type\":{\"const\":\"dog\"},"   \
    "\"breed\":{\"type\":\"string\",\"maxLength\":8}},\"required\":[\"id\",\"name\",\"tag\","      \
    "\"born\",\"pet_type\"]},"                                                                     \
    "{\"type\":\"object\",\"properties\":{" PETS_LATE_COMMON "\"wings\":{\"type\":\"integer\"}},"  \
    "\"required\":[\"id\",\"name\",\"tag\",\"born\"]}]}},\"required\":[\"pet\"]}"

/* A union told apart by the type of a key its branches share: after id (alike in each),
 * "value" is a string, a number, an object or a boolean, and its first byte says which
 * branch goes on (with unit, scale or note); the boolean branch may leave it out */
#define TYPED                                                                                      \
    "{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":["                                      \
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"value\":{\"type\":"      \
    "\"string\",\"maxLength\":3},\"unit\":{\"enum\":[\"m\",\"s\"]}},\"required\":[\"id\","         \
    "\"value\",\"unit\"]},"                                                                        \
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"value\":{\"type\":"      \
    "\"number\"},\"scale\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},\"required\":"      \
    "[\"id\",\"value\"]},"                                                                         \
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"value\":{\"type\":"      \
    "\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]},\"note\":"     \
    "{\"type\":\"string\",\"maxLength\":4}},\"required\":[\"id\",\"value\"]},"                     \
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"value\":{\"type\":"      \
    "\"boolean\"}},\"required\":[\"id\"]}]}},\"required\":[\"v\"]}"

/* Listed properties whose count bounds bind: 2..3 of a, b, c (required), d */
#define COUNTED                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"           \
    "\"string\",\"maxLength\":3},\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":\"null\"}},"         \
    "\"required\":[\"c\"],\"minProperties\":2,\"maxProperties\":3}"

/* Strings held to patterns and formats: note, a pattern whose strings need escapes ("ab",
 * "q" in quotes and backslashes, nothing else); memo, one anchored at neither end (a digit
 * somewhere). */
#define SHAPED                                                                                     \
    "{\"type\":\"object\",\"properties\":{"                                                        \
    "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-\\\\d{4}$\"},"                          \
    "\"day\":{\"type\":\"string\",\"format\":\"date\"},"                                           \
    "\"host\":{\"type\":[\"string\",\"null\"],\"format\":\"ipv4\"},"                               \
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"                                            \
    "\"note\":{\"type\":\"string\",\"pattern\":\"^(ab|\\\"q\\\"|\\\\\\\\)+$\"},"                   \
    "\"memo\":{\"type\":\"string\",\"pattern\":\"\\\\d\"},"                                        \
    "\"word\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":5},"     \
    "\"pin\":{\"type\":\"string\",\"pattern\":\"\\\\d\",\"minLength\":3},"                         \
    "\"mail\":{\"type\":\"string\",\"format\":\"email\",\"maxLength\":12},"                        \
    "\"v6\":{\"type\":\"string\",\"format\":\"ipv6\"},\"link\":{\"type\":\"string\",\"format\":"   \
    "\"uri\"},\"ref\":{\"type\":\"string\",\"format\":\"uri-reference\"},"                         \
    "\"span\":{\"type\":\"string\",\"format\":\"duration\"},"                                      \
    "\"ratio\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1.5},"                      \
    "\"cents\":{\"type\":\"number\",\"multipleOf\":0.05,\"minimum\":-2},"                          \
    "\"step\":{\"type\":\"integer\",\"multipleOf\":3},"                                            \
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":"                     \
    "\"^[a-z]+(-[a-z]+)*$\"},\"maxItems\":3}},\"required\":[\"code\",\"day\",\"note\"]}"

/* An RFC 3339 duration (appendix A), by hand: P, then weeks alone, or the date units Y M D
 * (each a run of digits and its letter) in order without a gap between two given, then
 * optionally T and H M S the same way; at least one unit after P and after T. */
static bool duration_ok(const char *v)
{
    if (*v++ != 'P') return false;
    const char *units[2] = {"YMD", "HMS"};
    bool any = false;
    for (int part = 0; part < 2; part++) {
        if (part == 1) {
            if (!*v) break;
            if (*v++ != 'T') return false;
        }
        int next = 0, got = 0;
        while (*v && *v != 'T') {
            const char *d = v;
            while (isdigit((unsigned char)*v))
                v++;
            if (v == d || !*v) return false;
            if (part == 0 && *v == 'W') { /* weeks: alone */
                if (any || v[1]) return false;
                return true;
            }
            const char *u = strchr(units[part], *v);
            if (!u || *v == 0) return false;
            const int at = (int)(u - units[part]);
            /* (the month M is the first M in part 0, the minute M the second in part 1) */
            if (at < next || (got && at != next)) return false;
            next = at + 1, got++, any = true, v++;
        }
        if (part == 1 && !got) return false; /* a T with nothing after it */
    }
    return any && !*v;
}

/* A URI reference: a URI (below), or RFC 3986's characters with no ':' before the first '/',
 * '?' or '#' */
static bool uri_chars_ok(const char *v, bool colon_first)
{
    bool first = true;
    for (size_t i = 0; v[i]; i++) {
        if (strchr("/?#", v[i])) first = false;
        if (v[i] == '%') {
            if (!isxdigit((unsigned char)v[i + 1]) || !isxdigit((unsigned char)v[i + 2]))
                return false;
            i += 2;
        } else if (v[i] == ':' && first && !colon_first) {
            return false;
        } else if (!isalnum((unsigned char)v[i]) && !strchr("-._~!$&'()*+,;=:@/?#[]", v[i])) {
            return false;
        }
    }
    return true;
}

static void test_schema_table(void)
{
    synth_t s;
    synth_make(&s, 0);
    static const judged_t cases[] = {
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"]}", 1},
        {"{ \"name\" : \"a\" , \"age\" : 30 , \"email\" : null , \"role\" : \"user\" , "
         "\"tags\" : [ \"x\" , \"y\" ] , \"score\" : 1.5e3 , \"ok\" : true , "
         "\"pet\" : {\"kind\":\"cat\",\"friend\":{\"kind\":\"cat\",\"friend\":null}} }",
         1},
        {"{\"name\":\"a\",\"age\":3,\"email\":\"e@x\",\"role\":7,\"tags\":[\"x\"]}", 1},
        {"{\"name\":\"a\",\"age\":3,\"role\":null,\"tags\":[\"x\"]}", 1},
        {"{\"name\":\"a\",\"age\":3", 0},
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"],\"pet\":{\"kind\":\"c", 0},
        {"{\"age\":3,\"name\":\"a\",\"tags\":[\"x\"]}", -1},   /* out of order */
        {"{\"name\":\"a\",\"tags\":[\"x\"]}", -1},             /* age missing */
        {"{\"name\":\"a\",\"age\":3}", -1},                    /* tags missing: no '}' */
        {"{\"name\":\"a\",\"age\":3.5,\"tags\":[\"x\"]}", -1}, /* an integer */
        {"{\"name\":\"a\",\"age\":3e2,\"tags\":[\"x\"]}", -1},
        {"{\"name\":\"a\",\"age\":150,\"tags\":[\"x\"]}", 1}, /* age in 0..150 */
        {"{\"name\":\"a\",\"age\":-0,\"tags\":[\"x\"]}", 1},
        {"{\"name\":\"a\",\"age\":0,\"tags\":[\"x\"]}", 1},
        {"{\"name\":\"a\",\"age\":151,\"tags\":[\"x\"]}", -1},
        {"{\"name\":\"a\",\"age\":1500,\"tags\":[\"x\"]}", -1},
        {"{\"name\":\"a\",\"age\":-1,\"tags\":[\"x\"]}", -1},
        {"{\"name\":\"a\",\"age\":16", 0},
        {"{\"name\":\"\"", -1}, /* name: 1..12 characters */
        {"{\"name\":\"abcdefghijkl\",\"age\":1,\"tags\":[\"x\"]}", 1},
        {"{\"name\":\"abcdefghijklm", -1},
        {"{\"name\":\"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\","
         "\"age\":1,\"tags\":[\"x\"]}",
         1}, /* (12 characters of 2 bytes) */
        {"{\"name\":\"\\u00e9\\n\\ud83d\\ude00\",\"age\":1,\"tags\":[\"x\"]}", 1},
        {"{\"name\":1,\"age\":3,\"tags\":[\"x\"]}", -1},                 /* a string */
        {"{\"name\":\"a\",\"age\":3,\"tags\":[]}", -1},                  /* minItems */
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"x\",\"y\",\"z\"]}", -1}, /* maxItems */
        {"{\"name\":\"a\",\"age\":3,\"tags\":[1]}", -1},
        {"{\"name\":\"a\",\"age\":3,\"role\":\"root\",\"tags\":[\"x\"]}", -1}, /* enum */
        {"{\"name\":\"a\",\"age\":3,\"role\":72,\"tags\":[\"x\"]}", -1},
        {"{\"name\":\"a\",\"age\":3,\"email\":5,\"tags\":[\"x\"]}", -1},
        {"{\"name\":\"a\",\"nick\":\"b\",\"age\":3,\"tags\":[\"x\"]}", -1}, /* not a property */
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"],\"ok\":1}", -1},
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"],\"pet\":{\"kind\":\"dog\"}}", -1},
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"],\"pet\":{\"friend\":null}}", -1},
        {"{\"name\":\"a\",\"name\":\"b\",\"age\":3,\"tags\":[\"x\"]}", -1}, /* twice */
    /* anyOf of objects (Pydantic's unions): the first key says which */
#define PERSON_AT "{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"],\"home\":"
        {PERSON_AT "{\"floor\":3,\"unit\":\"b\"}}", 1},
        {PERSON_AT "{\"street\":\"x\",\"garden\":true}}", 1},
        {PERSON_AT "{\"garden\":false}}", 1}, /* (street is optional) */
        {PERSON_AT "{}}", 1},                 /* (House requires nothing) */
        {PERSON_AT "null}", 1},
        {PERSON_AT "{\"flo", 0},
        {PERSON_AT "{\"unit\"", -1},               /* Flat's floor comes first */
        {PERSON_AT "{\"floor\":3,\"street\"", -1}, /* a Flat now */
        {PERSON_AT "{\"street\":\"x\",\"floor\"", -1},
        {PERSON_AT "{\"floor\":\"3\"", -1},
        {PERSON_AT "[", -1},
#undef PERSON_AT
    /* a map (additionalProperties as a schema): any keys, each value of its schema */
#define PERSON_AT "{\"name\":\"a\",\"age\":3,\"tags\":[\"x\"],\"scores\":"
        {PERSON_AT "{\"a\":1,\"b c\":9}}", 1},
        {PERSON_AT "{}}", 1},
        {PERSON_AT "{\"a\":10", -1},
        {PERSON_AT "{\"a\":-1", -1},
        {PERSON_AT "{\"a\":\"1\"", -1},
        {PERSON_AT "{\"a\":1,\"b\":null", -1},
        {PERSON_AT "{\"a\":1,\"b\":2,\"c\":3}}", 1},
        {PERSON_AT "{\"a\":1,\"b\":2,\"c\":3,", -1}, /* maxProperties */
#undef PERSON_AT
    };
    judge_each(s.v, PERSON, cases, sizeof cases / sizeof cases[0]);
    /* a discriminated union: a first key two branches share, told apart by its value */
    {
        static const judged_t pets[] = {
            {"{\"pet\":{\"kind\":\"cat\",\"lives\":3}}", 1},
            {"{\"pet\":{\"kind\":\"dog\"}}", 1},
            {"{\"pet\":{\"kind\":\"puppy\",\"breed\":\"lab\"}}", 1},
            {"{\"pet\":{\"name\":\"x\"}}", 1},
            {"{\"pet\":{}}", 1},
            {"{\"pet\":{\"kind\":\"cat\"}}", -1}, /* a cat's lives are required */
            {"{\"pet\":{\"kind\":\"cat\",\"breed\"", -1},
            {"{\"pet\":{\"kind\":\"dog\",\"lives\"", -1},
            {"{\"pet\":{\"kind\":\"cow\"", -1},
            {"{\"pet\":{\"kind\":\"pup", 0},
            {"{\"pet\":{\"kind\":3", -1},
        };
        judge_each(s.v, PETS, pets, sizeof pets / sizeof pets[0]);
    }
    /* a union told apart after the properties its branches share */
    {
#define AT "{\"pet\":{\"id\":1,\"name\":\"a\",\"tag\":{\"x\":2},\"born\":\"2020-02-29\""
        static const judged_t late[] = {
            {AT ",\"pet_type\":\"cat\",\"lives\":3}}", 1},
            {AT ",\"pet_type\":\"dog\"}}", 1},
            {AT ",\"pet_type\":\"dog\",\"breed\":\"lab\"}}", 1},
            {AT ",\"wings\":2}}", 1},
            {AT "}}", 1},                               /* the third branch, without wings */
            {AT ",\"pet_type\":\"cat\"}", -1},          /* a cat's lives are required */
            {AT ",\"pet_type\":\"cat\",\"breed\"", -1}, /* a dog's */
            {AT ",\"pet_type\":\"cow\"", -1},
            {AT ",\"lives\"", -1}, /* not before pet_type */
            {AT ",\"pet_type\":\"ca", 0},
            {"{\"pet\":{\"id\":1,\"tag\"", -1}, /* name first, in every branch */
            {"{\"pet\":{\"id\":1,\"name\":\"abcdefg\"", -1},
            {"{\"pet\":{\"id\":1,\"name\":\"a\",\"tag\":{\"x\":3", -1},
            {"{\"pet\":{\"id\":1}", -1},
            {"{\"pet\":{}", -1},
            {"{\"pet\":{\"id\":1,\"name\":\"a\",\"tag\":{\"x\":2},\"born\":\"2020-13", -1},
        };
#undef AT
        judge_each(s.v, PETS_LATE, late, sizeof late / sizeof late[0]);
        /* two branches alike to the end: one object (a ',' after its keys would lead nowhere) */
        static const char same[] =
            "{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
            "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"type\":"
            "\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}]}},"
            "\"required\":[\"u\"]}";
        static const judged_t alike[] = {{"{\"u\":{\"a\":1}}", 1}, {"{\"u\":{\"a\":1,", -1}, {"{\"u\":{}", -1}};
        judge_each(s.v, same, alike, sizeof alike / sizeof alike[0]);
    }
    /* a union told apart by the type of its shared key's value */
    {
#define AT "{\"v\":{\"id\":1,\"value\":"
        static const judged_t typed[] = {
            {AT "\"ab\",\"unit\":\"m\"}}", 1},
            {AT "2.5}}", 1},
            {AT "-3,\"scale\":2}}", 1},
            {AT "{\"x\":1},\"note\":\"ab\"}}", 1},
            {AT "{\"x\":1}}}", 1},
            {AT "true}}", 1},
            {"{\"v\":{\"id\":1}}", 1}, /* (the boolean branch leaves value out) */
            {AT "tr", 0},
            {AT "\"ab\"}}", -1},         /* a string's unit is required */
            {AT "\"ab\",\"scale\"", -1}, /* a number's */
            {AT "2,\"unit\"", -1},       /* a string's */
            {AT "2,\"scale\":10", -1},
            {AT "{\"x\":1},\"note\":\"abcde", -1},
            {AT "{}", -1},
            {AT "true,", -1},
            {AT "null", -1},
            {AT "[", -1},
            {AT "\"abcd", -1},
            {"{\"v\":{\"value\"", -1}, /* id first, in every branch */
        };
#undef AT
        judge_each(s.v, TYPED, typed, sizeof typed / sizeof typed[0]);
    }
    /* minProperties / maxProperties: counted on objects without listed properties, accepted
     * beside listed ones where they always hold */
    {
        const char *counted = "{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\","
                              "\"minProperties\":2,\"maxProperties\":2}},\"required\":[\"o\"]}";
        const char *two = "{\"o\":{\"a\":1,\"b\":[]}}", *none = "{\"o\":{}",
                   *one = "{\"o\":{\"a\":1}", *three = "{\"o\":{\"a\":1,\"b\":2,";
        BT_CHECK_EQ_INT(judge_schema(s.v, counted, two, strlen(two)), 1);
        BT_CHECK_EQ_INT(judge_schema(s.v, counted, none, strlen(none)), -1);
        BT_CHECK_EQ_INT(judge_schema(s.v, counted, one, strlen(one)), -1);
        BT_CHECK_EQ_INT(judge_schema(s.v, counted, three, strlen(three)), -1);
        const char *holds = "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"required\":"
                            "[\"a\"],\"minProperties\":1,\"maxProperties\":2}";
        BT_CHECK_EQ_INT(judge_schema(s.v, holds, "{\"a\":1}", 7), 1);
        /* beside listed properties where the bounds bind: counted, and a key is let in only
         * while the count can still end within them (properties come in their order) */
        static const judged_t binds[] = {
            {"{}", -1},           /* min 2 */
            {"{\"c\":true}", -1}, /* 1 */
            {"{\"a\":1,\"c\":true}", 1},
            {"{\"b\":\"x\",\"c\":true,\"d\":null}", 1},
            {"{\"a\":1,\"b\":\"x\",\"c\":true}", 1},
            {"{\"a\":1,\"b\":\"x\",\"c\":true,", -1}, /* max 3: no fourth */
            {"{\"a\":1,\"b\":\"x\",\"d\"", -1},       /* c, required, would make 4 */
            {"{\"d\"", -1},                           /* c is required before d */
            {"{\"c\":true,\"d\":null}", 1},
            {"{\"c\":true,", 1 - 1}, /* d can still make 2 */
        };
        judge_each(s.v, COUNTED, binds, sizeof binds / sizeof binds[0]);
        /* the count saturates: 256 keys still have at least one */
        const char *least = "{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\","
                            "\"minProperties\":1}},\"required\":[\"o\"]}";
        static char many[8192];
        size_t n = (size_t)snprintf(many, sizeof many, "{\"o\":{");
        for (int i = 0; i < 256; i++)
            n += (size_t)snprintf(many + n, sizeof many - n, "%s\"k%d\":0", i ? "," : "", i);
        n += (size_t)snprintf(many + n, sizeof many - n, "}}");
        BT_CHECK_EQ_INT(judge_schema(s.v, least, many, n), 1);
    }
    /* enums of numbers that extend each other, as the last property */
    const char *nums =
        "{\"type\":\"object\",\"properties\":{\"n\":{\"enum\":[1,12,123]}},\"required\":[\"n\"]}";
    BT_CHECK_EQ_INT(judge_schema(s.v, nums, "{\"n\":12}", 8), 1);
    BT_CHECK_EQ_INT(judge_schema(s.v, nums, "{\"n\":1 }", 8), 1);
    BT_CHECK_EQ_INT(judge_schema(s.v, nums, "{\"n\":13}", 8), -1);
    BT_CHECK_EQ_INT(judge_schema(s.v, nums, "{\"n\":1234}", 10), -1);
    /* integer bounds: exclusive ones, negative, and a range a prefix must grow into */
    static const struct {
        const char *schema, *text;
        int want;
    } ranged[] = {
#define T_RANGE                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"integer\","                            \
    "\"exclusiveMinimum\":-40,\"exclusiveMaximum\":-3}},\"required\":[\"t\"]}"
#define N_RANGE                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":[\"integer\",\"null\"],"                 \
    "\"minimum\":10,\"maximum\":12.5}},\"required\":[\"n\"]}"
        {T_RANGE, "{\"t\":-39}", 1},
        {T_RANGE, "{\"t\":-4}", 1},
        {T_RANGE, "{\"t\":-10}", 1},
        {T_RANGE, "{\"t\":-40}", -1},
        {T_RANGE, "{\"t\":-3}", -1},
        {T_RANGE, "{\"t\":0}", -1},
        {T_RANGE, "{\"t\":5}", -1},
        {T_RANGE, "{\"t\":-400}", -1},
        {T_RANGE, "{\"t\":-", 0},
        {T_RANGE, "{\"t\":-0", -1}, /* (0 is out, and -0 takes no more digits) */
        {N_RANGE, "{\"n\":10}", 1},
        {N_RANGE, "{\"n\":12}", 1},
        {N_RANGE, "{\"n\":null}", 1},
        {N_RANGE, "{\"n\":1", 0},
        {N_RANGE, "{\"n\":1}", -1},
        {N_RANGE, "{\"n\":13}", -1},
        {N_RANGE, "{\"n\":2", -1},
        {N_RANGE, "{\"n\":-", -1},
        {N_RANGE, "{\"n\":100}", -1},
#define P_RANGE                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"minimum\":0,"               \
    "\"maximum\":1}},\"required\":[\"p\"]}"
#define X_RANGE                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"exclusiveMinimum\":-0.5,"   \
    "\"exclusiveMaximum\":0.25}},\"required\":[\"x\"]}"
#define D_RANGE                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":[\"number\",\"null\"],\"minimum\":-1e3," \
    "\"maximum\":0.1}},\"required\":[\"d\"]}"
        {P_RANGE, "{\"p\":0}", 1},
        {P_RANGE, "{\"p\":1}", 1},
        {P_RANGE, "{\"p\":0.5}", 1},
        {P_RANGE, "{\"p\":1.000}", 1},
        {P_RANGE, "{\"p\":-0}", 1},
        {P_RANGE, "{\"p\":0.999999999999999999}", 1},
        {P_RANGE, "{\"p\":-", 0},
        {P_RANGE, "{\"p\":-0.", 0},
        {P_RANGE, "{\"p\":-0.1", -1},
        {P_RANGE, "{\"p\":1.01", -1},
        {P_RANGE, "{\"p\":1.000000000000000001", -1},
        {P_RANGE, "{\"p\":10", -1},
        {P_RANGE, "{\"p\":2", -1},
        {P_RANGE, "{\"p\":1e0}", -1},                  /* no exponent */
        {P_RANGE, "{\"p\":0.1234567890123456789", -1}, /* 19 decimals */
        {X_RANGE, "{\"x\":-0.49}", 1},
        {X_RANGE, "{\"x\":0.2499}", 1},
        {X_RANGE, "{\"x\":0}", 1},
        {X_RANGE, "{\"x\":-0.5", -1},
        {X_RANGE, "{\"x\":0.25}", -1},
        {X_RANGE, "{\"x\":0.250", -1},
        {X_RANGE, "{\"x\":-0.4999}", 1},
        {X_RANGE, "{\"x\":-1", -1},
        {D_RANGE, "{\"d\":0.1}", 1},
        {D_RANGE, "{\"d\":0.10000000000000001", -1},
        {D_RANGE, "{\"d\":-1000}", 1},
        {D_RANGE, "{\"d\":-1000.0}", 1},
        {D_RANGE, "{\"d\":-1000.01", -1},
        {D_RANGE, "{\"d\":-999.9}", 1},
        {D_RANGE, "{\"d\":null}", 1},
        {D_RANGE, "{\"d\":-10000", -1},
        {D_RANGE, "{\"d\":-1001", -1},
        {D_RANGE, "{\"d\":0.09}", 1},
#define M_INT                                                                                      \
    "{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"integer\",\"multipleOf\":5,"           \
    "\"minimum\":-10,\"maximum\":100}},\"required\":[\"m\"]}"
#define M_CENTS                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"number\",\"multipleOf\":0.01}},"       \
    "\"required\":[\"c\"]}"
#define M_QUARTER                                                                                  \
    "{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"number\",\"multipleOf\":0.25,"         \
    "\"maximum\":1}},\"required\":[\"q\"]}"
        {M_INT, "{\"m\":0}", 1},
        {M_INT, "{\"m\":5}", 1},
        {M_INT, "{\"m\":100}", 1},
        {M_INT, "{\"m\":-10}", 1},
        {M_INT, "{\"m\":7", 0},
        {M_INT, "{\"m\":7}", -1},
        {M_INT, "{\"m\":105", -1},
        {M_INT, "{\"m\":-15", -1},
        {M_INT, "{\"m\":-3", -1}, /* (-30 and below are out) */
        {M_CENTS, "{\"c\":1.25}", 1},
        {M_CENTS, "{\"c\":1.255", -1},
        {M_CENTS, "{\"c\":-3}", 1},
        {M_CENTS, "{\"c\":0.1}", 1},
        {M_CENTS, "{\"c\":12345.60}", 1},
        {M_CENTS, "{\"c\":1e2", -1},
        {M_QUARTER, "{\"q\":0.75}", 1},
        {M_QUARTER, "{\"q\":0.7", 0},
        {M_QUARTER, "{\"q\":0.7}", -1},
        {M_QUARTER, "{\"q\":1.25", -1},
        {M_QUARTER, "{\"q\":-0.25}", 1},
        {M_QUARTER, "{\"q\":0.2", 0},
        {M_QUARTER, "{\"q\":0.3", -1},
#undef M_INT
#undef M_CENTS
#undef M_QUARTER
#undef T_RANGE
#undef N_RANGE
#undef P_RANGE
#undef X_RANGE
#undef D_RANGE
    };
    for (size_t i = 0; i < sizeof ranged / sizeof ranged[0]; i++) {
        const int got = judge_schema(s.v, ranged[i].schema, ranged[i].text, strlen(ranged[i].text));
        BT_CHECK_MSG(got == ranged[i].want, "'%s': %d, want %d", ranged[i].text, got,
                     ranged[i].want);
    }
    /* patterns and formats */
    static const judged_t shaped[] = {
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"ab\"}", 1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"host\":\"10.0.0.255\","
         "\"id\":\"123e4567-e89b-12d3-A456-426614174000\",\"note\":\"\\\\ab\","
         "\"tags\":[\"a-b\",\"c\"]}",
         1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-02-31\",\"host\":null,\"note\":\"\\\"q\\\"\"}", 1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"ab\",\"memo\":\"x9y\"}", 1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"ab\",\"memo\":\"xy\"", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"abx", -1},
        {"{\"code\":\"ABC-12", 0},
        {"{\"code\":\"AB-", -1},
        {"{\"code\":\"ABC-12345", -1},
        {"{\"code\":\"ABC-123\"", -1}, /* the pattern not yet matched: no closing quote */
        {"{\"code\":\"abc", -1},
        {"{\"code\":\"\\u0041", -1}, /* (no \u escapes under a pattern) */
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-13", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"host\":\"25", 0},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"host\":\"256", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"host\":\"1.2.3.4.", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"id\":\"ABCDEF12-", 0},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"id\":\"ABCDEFG", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"a\"", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"\\\\", 0},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"\\n", -1},
        {"{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"ab\",\"tags\":[\"a-\"", -1},
    /* a pattern with minLength / maxLength: both hold, and nothing is let in that cannot
     * finish within them */
#define SHAPED_AT "{\"code\":\"ABC-1234\",\"day\":\"2026-12-05\",\"note\":\"ab\","
        {SHAPED_AT "\"word\":\"ab\"}", 1},
        {SHAPED_AT "\"word\":\"abcde\"}", 1},
        {SHAPED_AT "\"word\":\"a\"", -1},    /* too short */
        {SHAPED_AT "\"word\":\"abcdef", -1}, /* too long */
        {SHAPED_AT "\"word\":\"aB", -1},     /* the pattern */
        {SHAPED_AT "\"pin\":\"x9y\"}", 1},
        {SHAPED_AT "\"pin\":\"xyzw12\"}", 1}, /* no upper bound */
        {SHAPED_AT "\"pin\":\"9\"", -1},      /* a digit, but 1 character */
        {SHAPED_AT "\"pin\":\"xyz\"", -1},    /* 3 characters, no digit */
        {SHAPED_AT "\"pin\":\"\xc3\xa9\xc3\xa9"
                   "7\"}",
         1}, /* characters, not bytes: */
        {SHAPED_AT "\"pin\":\"\xc3\xa9"
                   "7\"",
         -1}, /* 2 of them in 3 bytes */
        {SHAPED_AT "\"mail\":\"a@b.co\"}", 1},
        {SHAPED_AT "\"mail\":\"abcdefg@b.co\"}", 1}, /* 12 */
        {SHAPED_AT "\"mail\":\"abcdefgh@b.co", -1},  /* 13 */
        {SHAPED_AT "\"mail\":\"abcdefghi@", -1},     /* the shortest domain, b.c, would make 13 */
        {SHAPED_AT "\"mail\":\"abcdefgh@", 0},
#undef SHAPED_AT
    };
    judge_each(s.v, SHAPED, shaped, sizeof shaped / sizeof shaped[0]);
    /* each format's pattern takes what it should */
    static const struct {
        const char *format, *value;
        int want;
    } formatted[] = {
        {"time", "23:59:60.123+05:30", 1},
        {"time", "24:00:00Z", -1},
        {"time", "12:00:00", -1},
        {"date-time", "2026-12-05T09:30:00Z", 1},
        {"date-time", "2026-12-05 09:30:00Z", -1},
        {"email", "a.b+c@mail.example.org", 1},
        {"email", "a..b@example.org", -1},
        {"email", "a@localhost", -1},
        {"hostname", "a-1.example", 1},
        {"hostname", "-a.example", -1},
        {"uuid", "123e4567-e89b-12d3-a456-42661417400", -1},
        {"ipv6", "::ffff:192.0.2.1", 1},
        {"ipv6", "2001:db8::8a2e:370:7334", 1},
        {"ipv6", "::", 1},
        {"ipv6", "1:2:3:4:5:6:7:8:9", -1},
        {"ipv6", "1:::2", -1},
        {"ipv6", "fe80::1%eth0", -1}, /* (no zone) */
        {"ipv6", "::01.2.3.4", -1},
        {"uri", "https://example.org/a/b?c=d&e=%20f#g", 1},
        {"uri", "urn:isbn:0451450523", 1},
        {"uri", "//example.org/no-scheme", -1},
        {"uri", "http://example.org/a b", -1},
        {"uri", "http://example.org/%zz", -1},
        {"uri", "1http://example.org", -1},
        {"uri-reference", "../a/b?c#d", 1},
        {"uri-reference", "", 1},
        {"uri-reference", "//example.org/x", 1},
        {"uri-reference", "mailto:a@b.org", 1},
        {"uri-reference", "a/b:c", 1}, /* ':' after the first '/' */
        {"uri-reference", "1a:b", -1}, /* no scheme, so no ':' in the first segment */
        {"uri-reference", "a b", -1},
        {"duration", "P4DT12H30M5S", 1},
        {"duration", "P1Y2M", 1},
        {"duration", "PT36H", 1},
        {"duration", "P2W", 1},
        {"duration", "P", -1},
        {"duration", "PT", -1},
        {"duration", "P1YT", -1},
        {"duration", "PT1D", -1},
        {"duration", "P1D2H", -1}, /* (no T) */
        {"duration", "P2D1Y", -1}, /* out of order */
        {"duration", "P1Y1D", -1}, /* RFC 3339's grammar: a month between */
        {"duration", "P2W1D", -1}, /* weeks alone */
        {"duration", "p1d", -1},
    };
    for (size_t i = 0; i < sizeof formatted / sizeof formatted[0]; i++) {
        char schema[256], text[128];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\","
                 "\"format\":\"%s\"}},\"required\":[\"v\"]}",
                 formatted[i].format);
        snprintf(text, sizeof text, "{\"v\":\"%s\"}", formatted[i].value);
        const int got = judge_schema(s.v, schema, text, strlen(text));
        BT_CHECK_MSG((got == 1) == (formatted[i].want == 1), "%s '%s': %d, want %d",
                     formatted[i].format, formatted[i].value, got, formatted[i].want);
    }
    /* additionalProperties as a schema beside properties: the listed ones only, as with true
     * (an instance without additional properties always holds to it) */
    {
        const char *beside = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                             "\"additionalProperties\":{\"type\":\"string\"},\"required\":[\"a\"]}";
        static const judged_t extra[] = {{"{\"a\":1}", 1}, {"{\"a\":1,\"b\":\"x\"}", -1}, {"{\"b\":\"x\"}", -1}};
        judge_each(s.v, beside, extra, sizeof extra / sizeof extra[0]);
    }
    /* ipv6 against glibc's inet_pton on random strings of hex digits, colons and dots (each
     * verdict both ways; about one in sixty is an address) */
    {
        const char *v6 = "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\","
                         "\"format\":\"ipv6\"}},\"required\":[\"v\"]}";
        static const char al[] = "0123456789abcdefABCDEF:.:::";
        int valid = 0, agree = 0;
        const int N = 20000;
        for (int t = 0; t < N; t++) {
            char v[48], text[64];
            const int n = 2 + (int)(rnd() % 30);
            for (int i = 0; i < n; i++)
                v[i] = al[rnd() % (sizeof al - 1)];
            v[n] = 0;
            unsigned char a[16];
            const bool want = inet_pton(AF_INET6, v, a) == 1;
            snprintf(text, sizeof text, "{\"v\":\"%s\"}", v);
            const bool got = judge_schema(s.v, v6, text, strlen(text)) == 1;
            valid += want;
            agree += want == got;
            BT_CHECK_MSG(want == got, "ipv6 '%s': inet_pton %d, the format %d", v, want, got);
        }
        fprintf(stderr, "  ipv6: %d random strings, %d addresses by inet_pton, %d verdicts alike\n",
                N, valid, agree);
        BT_CHECK(valid > 100);
    }
    /* duration against the hand parser below on random strings of its letters and digits */
    {
        const char *dur = "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\","
                          "\"format\":\"duration\"}},\"required\":[\"v\"]}";
        static const char al[] = "PPPTTYMDHMSW0123456789";
        int valid = 0, agree = 0;
        const int N = 20000;
        for (int t = 0; t < N; t++) {
            char v[24], text[48];
            const int n = 1 + (int)(rnd() % 12);
            v[0] = 'P';
            for (int i = 1; i < n; i++)
                v[i] = al[rnd() % (sizeof al - 1)];
            v[n] = 0;
            const bool want = duration_ok(v);
            snprintf(text, sizeof text, "{\"v\":\"%s\"}", v);
            const bool got = judge_schema(s.v, dur, text, strlen(text)) == 1;
            valid += want;
            agree += want == got;
            BT_CHECK_MSG(want == got, "duration '%s': by hand %d, the format %d", v, want, got);
        }
        fprintf(stderr, "  duration: %d random strings, %d durations by hand, %d verdicts alike\n",
                N, valid, agree);
        BT_CHECK(valid > 100);
    }
    /* refused, each with a message naming the problem */
    static const struct {
        const char *schema, *needle;
    } bad[] = {
        {"{\"type\":\"string\"}", "root must be an object"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"idn-email\"}"
         "}"
         "}",
         "format 'idn-email' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}}}",
         "pattern: lookaround"},
        /* a fraction was cut to 1, letting one item pass where the schema needs two */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"minItems\":1.5}}}",
         "minItems and maxItems must be whole numbers 0..255"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"maxItems\":256}}}",
         "minItems and maxItems must be whole numbers 0..255"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^ab$\","
         "\"minLength\":3}}}",
         "pattern '^ab$' matches no string of 3 characters or more"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\","
         "\"maxLength\":9}}}",
         "format 'date' matches no string of 0..9 characters"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"[a-z]\","
         "\"maxLength\":100000}}}",
         "with its length bounds needs more than"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"pattern\":\"^a+$\"}}}",
         "'pattern' is supported on type string only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^a\","
         "\"format\":\"date\"}}}",
         "together"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":5}}}",
         "pattern must be a string"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"a.{40}\"}}"
         "}",
         "automaton states"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minimum\":0}}}",
         "'minimum' is supported on type integer or number only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"maximum\":3}}}", "integer or number only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0.5,"
         "\"exclusiveMaximum\":0.5}}}",
         "no number"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"maximum\":1e19}}}",
         "within +-9e18"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":0}}}",
         "multipleOf must be a number above 0"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":2.5}}}",
         "a whole one"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":1e-20}}}",
         "at most 18 decimals"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":7,"
         "\"minimum\":1,\"maximum\":6}}}",
         "no multiple"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"multipleOf\":2}}}",
         "'multipleOf' is supported on type integer or number only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"maxLength\":3}}}", "type string only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":4,"
         "\"maxLength\":3}}}",
         "min <= max"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":-1}}}",
         "whole numbers"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"enum\":[1],"
         "\"minimum\":0}}}",
         "integer or number only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\","
         "\"exclusiveMinimum\":true}}}",
         "exclusiveMinimum must be a number"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":5,"
         "\"exclusiveMaximum\":5}}}",
         "no integer"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"allOf\":[{}]}}}", "'allOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'b'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":"
         "\"number\"}]}}}",
         "start alike"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":"
         "{\"x\":{},\"y\":{}}},{\"type\":\"object\",\"properties\":{\"y\":{}},\"required\":[\"y\"]}"
         "]}}}",
         "can start with the same property (\"y\")"},
        /* a shared first key tells branches apart by its string values, each in one branch,
         * or by values that start apart (1 and 2 would) */
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":"
         "{\"k\":{\"const\":10}}},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1}}}]}}}",
         "only where its values are strings"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":"
         "{\"k\":{\"enum\":[\"a\",\"b\"]}}},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":"
         "\"b\"}}}]}}}",
         "has the value \"b\" in two of them"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":"
         "{\"k\":{\"const\":\"a\"},\"m\":{\"const\":\"x\"}}},{\"type\":\"object\",\"properties\":{"
         "\"k\":{\"const\":\"b\"},\"m\":{\"const\":\"y\"}}}]}}}",
         "share two first properties"}, /* (k optional: m starts both too) */
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":"
         "{\"k\":{\"const\":\"a\"},\"m\":{}}},{\"type\":\"object\",\"properties\":{\"k\":{"
         "\"const\":"
         "\"b\"},\"m\":{}}}]}}}",
         "share two first properties"}, /* (k and m, both optional) */
        /* after a property both require alike, the next is shared too, its values not apart */
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":{\"k\":{\"type\":\"integer\"},\"m\":{\"type\":\"string\"}},\"required\":"
         "[\"k\",\"m\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"},\"m\":"
         "{\"enum\":[\"x\"]}},\"required\":[\"k\"]}]}}}",
         "can start with the same property (\"m\") is supported only where each gives it as const"},
        /* a shared first key whose schemas differ is no shared prefix */
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":{\"k\":{\"type\":\"integer\"},\"m\":{\"const\":\"a\"}},\"required\":"
         "[\"k\",\"m\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\","
         "\"minimum\":0},\"m\":{\"const\":\"b\"}},\"required\":[\"k\",\"m\"]}]}}}",
         "can start with the same property (\"k\")"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":"
         "\"object\",\"properties\":{\"y\":{}}}]}}}",
         "start alike"}, /* (an object of any keys beside a described one) */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/Nope\"}}}", "Nope"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":{\"type\":"
         "\"strung\"}}",
         "strung"}, /* (beside properties too, the schema is compiled) */
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":{\"type\":"
         "\"string\"},\"required\":[\"b\"]}",
         "not among the properties"}, /* (b would have to be generated) */
        {"{\"type\":\"object\",\"additionalProperties\":7}", "true, false or a schema"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"minProperties\":2}",
         "minProperties 2, but the object lists 1 properties"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"a\",\"b\"],"
         "\"maxProperties\":1}",
         "maxProperties 1, but the object requires 2"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":"
         "{\"x\":{},\"z\":{}},\"minProperties\":2},{\"type\":\"object\",\"properties\":{\"y\":{}}}]"
         "}}}",
         "where one bounds its property count"},
        {"{\"type\":\"object\",\"maxProperties\":1.5}", "whole numbers 0..255"},
        {"{\"type\":\"objekt\"}", "objekt"},
        {"{\"type\":\"object\",", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        const bt_status_t st =
            bt_grammar_schema_check(bad[i].schema, strlen(bad[i].schema), err, sizeof err);
        BT_CHECK_MSG(st == BT_ERR_INVALID_ARG && strstr(err, bad[i].needle), "%s: '%s'",
                     bad[i].schema, err);
    }
    char err[256];
    BT_CHECK(bt_grammar_schema_check(PERSON, strlen(PERSON), err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_schema_check(SHAPED, strlen(SHAPED), err, sizeof err) == BT_OK);
    /* a request's kind and spec, as the router checks them */
    BT_CHECK(bt_grammar_request_check("", NULL, err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_request_check("json_object", "", err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_request_check("json_schema", PERSON, err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_request_check("yaml", NULL, err, sizeof err) == BT_ERR_INVALID_ARG &&
             strstr(err, "'yaml'"));
    BT_CHECK(bt_grammar_request_check("json_schema", "", err, sizeof err) == BT_ERR_INVALID_ARG &&
             strstr(err, "needs its spec"));
    BT_CHECK(bt_grammar_request_check("json_object", PERSON, err, sizeof err) ==
                 BT_ERR_INVALID_ARG &&
             strstr(err, "takes no spec"));
    /* a spec checked again: the verdict kept (the router checks every request) */
    uint64_t checked0, cached0, checked1, cached1;
    bt_grammar_check_stats(&checked0, &cached0);
    const char *bad_rx = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                         "\"pattern\":\"(?=x)\"}}}";
    char first[256], again[256];
    BT_CHECK(bt_grammar_request_check("json_schema", bad_rx, first, sizeof first) ==
             BT_ERR_INVALID_ARG);
    BT_CHECK(bt_grammar_request_check("json_schema", bad_rx, again, sizeof again) ==
             BT_ERR_INVALID_ARG);
    BT_CHECK(!strcmp(first, again) && strstr(first, "lookaround"));
    BT_CHECK(bt_grammar_request_check("json_schema", PERSON, err, sizeof err) == BT_OK);
    const char *both = "{\"type\":\"object\",\"description\":\"a(b\"}"; /* (a schema, no regex) */
    BT_CHECK(bt_grammar_request_check("json_schema", both, err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_request_check("regex", both, err, sizeof err) == BT_ERR_INVALID_ARG &&
             strstr(err, "not closed"));
    bt_grammar_check_stats(&checked1, &cached1);
    BT_CHECK_EQ_INT(checked1 - checked0, 5);
    BT_CHECK_EQ_INT(cached1 - cached0, 2); /* bad_rx again, PERSON (checked above) */
    synth_free(&s);
}

/* A pattern by PCRE2 (the patterns this file walks read alike in ECMA-262 and PCRE2); the
 * formats this file walks by hand. */
static bool shape_conforms(const char *v, const cJSON *s)
{
    const cJSON *pat = cJSON_GetObjectItem(s, "pattern"), *fmt = cJSON_GetObjectItem(s, "format");
    const size_t n = strlen(v);
    if (pat) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)pat->valuestring, PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!code) return false;
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        const int rc = pcre2_match(code, (PCRE2_SPTR)v, n, 0, 0, md, NULL);
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        return rc >= 0;
    }
    if (!fmt) return true;
    if (!strcmp(fmt->valuestring, "date")) {
        int y, m, d;
        for (size_t i = 0; i < n; i++)
            if (i == 4 || i == 7 ? v[i] != '-' : !isdigit((unsigned char)v[i])) return false;
        return n == 10 && sscanf(v, "%4d-%2d-%2d", &y, &m, &d) == 3 && m >= 1 && m <= 12 &&
               d >= 1 && d <= 31;
    }
    if (!strcmp(fmt->valuestring, "ipv4")) {
        unsigned char a[4];
        return inet_pton(AF_INET, v, a) == 1;
    }
    if (!strcmp(fmt->valuestring, "ipv6")) {
        unsigned char a[16];
        return inet_pton(AF_INET6, v, a) == 1;
    }
    if (!strcmp(fmt->valuestring, "duration")) return duration_ok(v);
    if (!strcmp(fmt->valuestring, "uri-reference")) {
        size_t i = 0;
        while (v[i] && (isalnum((unsigned char)v[i]) || strchr("+.-", v[i])))
            i++;
        if (isalpha((unsigned char)v[0]) && v[i] == ':') return uri_chars_ok(v + i + 1, true);
        return uri_chars_ok(v, false);
    }
    if (!strcmp(fmt->valuestring, "uri")) { /* scheme ':' then RFC 3986's characters or %HH */
        size_t i = 0;
        if (!isalpha((unsigned char)v[0])) return false;
        while (v[i] && (isalnum((unsigned char)v[i]) || strchr("+.-", v[i])))
            i++;
        if (v[i++] != ':') return false;
        for (; v[i]; i++) {
            if (v[i] == '%') {
                if (!isxdigit((unsigned char)v[i + 1]) || !isxdigit((unsigned char)v[i + 2]))
                    return false;
                i += 2;
            } else if (!isalnum((unsigned char)v[i]) && !strchr("-._~!$&'()*+,;=:@/?#[]", v[i])) {
                return false;
            }
        }
        return true;
    }
    if (!strcmp(fmt->valuestring, "uuid")) {
        for (size_t i = 0; i < n; i++)
            if (i == 8 || i == 13 || i == 18 || i == 23 ? v[i] != '-'
                                                        : !isxdigit((unsigned char)v[i]))
                return false;
        return n == 36;
    }
    if (!strcmp(fmt->valuestring, "email")) { /* dot-atom@label(.label)+, as RFC 5321 */
        const char *at = strchr(v, '@');
        if (!at || at == v || strchr(at + 1, '@')) return false;
        for (const char *c = v; c < at; c++) /* atoms of allowed characters, single dots */
            if (*c == '.' ? c == v || c + 1 == at || c[1] == '.'
                          : !isalnum((unsigned char)*c) && !strchr("!#$%&'*+/=?^_`{|}~-", *c))
                return false;
        int labels = 0;
        for (const char *l = at + 1; *l;) {
            size_t len = strcspn(l, ".");
            if (len == 0 || len > 63 || l[0] == '-' || l[len - 1] == '-') return false;
            for (size_t i = 0; i < len; i++)
                if (!isalnum((unsigned char)l[i]) && l[i] != '-') return false;
            labels++;
            l += len;
            if (*l == '.' && !*++l) return false; /* (a trailing dot) */
        }
        return labels >= 2;
    }
    return false;
}

/* An independent check of an instance against the schemas this file uses, stricter than JSON
 * Schema where the generator is: no properties beyond the described ones, in their order. */
static bool conforms(const cJSON *x, const cJSON *s, const cJSON *root)
{
    if (cJSON_IsTrue(s) || !s->child) return true;
    const cJSON *ref = cJSON_GetObjectItem(s, "$ref");
    if (ref) {
        const cJSON *defs = cJSON_GetObjectItem(root, "$defs");
        return conforms(x, cJSON_GetObjectItem(defs, strrchr(ref->valuestring, '/') + 1), root);
    }
    const cJSON *en = cJSON_GetObjectItem(s, "enum"), *cn = cJSON_GetObjectItem(s, "const");
    if (cn) return cJSON_Compare(x, cn, true);
    if (en) {
        const cJSON *v;
        cJSON_ArrayForEach(v, en) if (cJSON_Compare(x, v, true)) return true;
        return false;
    }
    const cJSON *any = cJSON_GetObjectItem(s, "anyOf");
    if (any) {
        const cJSON *b;
        cJSON_ArrayForEach(b, any) if (conforms(x, b, root)) return true;
        return false;
    }
    const cJSON *type = cJSON_GetObjectItem(s, "type");
    bool typed = false;
    for (const cJSON *t = cJSON_IsArray(type) ? type->child : type; t;
         t = cJSON_IsArray(type) ? t->next : NULL) {
        const char *n = t->valuestring;
        typed |= (!strcmp(n, "object") && cJSON_IsObject(x)) ||
                 (!strcmp(n, "array") && cJSON_IsArray(x)) ||
                 (!strcmp(n, "string") && cJSON_IsString(x)) ||
                 (!strcmp(n, "number") && cJSON_IsNumber(x)) ||
                 (!strcmp(n, "integer") && cJSON_IsNumber(x) &&
                  x->valuedouble == (double)(long long)x->valuedouble) ||
                 (!strcmp(n, "boolean") && cJSON_IsBool(x)) ||
                 (!strcmp(n, "null") && cJSON_IsNull(x));
    }
    if (type && !typed) return false;
    if (cJSON_IsString(x) && !shape_conforms(x->valuestring, s)) return false;
    if (cJSON_IsString(x)) { /* lengths in code points */
        long n = 0;
        for (const unsigned char *c = (const unsigned char *)x->valuestring; *c; c++)
            n += (*c & 0xc0) != 0x80;
        const cJSON *b;
        if ((b = cJSON_GetObjectItem(s, "minLength")) && n < b->valueint) return false;
        if ((b = cJSON_GetObjectItem(s, "maxLength")) && n > b->valueint) return false;
    }
    if (cJSON_IsNumber(x)) { /* bounds (as minimum <= x, x < exclusiveMaximum, ...) */
        const cJSON *b;
        if ((b = cJSON_GetObjectItem(s, "minimum")) && x->valuedouble < b->valuedouble)
            return false;
        if ((b = cJSON_GetObjectItem(s, "maximum")) && x->valuedouble > b->valuedouble)
            return false;
        if ((b = cJSON_GetObjectItem(s, "exclusiveMinimum")) && x->valuedouble <= b->valuedouble)
            return false;
        if ((b = cJSON_GetObjectItem(s, "exclusiveMaximum")) && x->valuedouble >= b->valuedouble)
            return false;
        if ((b = cJSON_GetObjectItem(s, "multipleOf"))) {
            const double q = x->valuedouble / b->valuedouble;
            if (fabs(q - round(q)) > 1e-9 * fmax(1.0, fabs(q))) return false;
        }
    }
    if (cJSON_IsObject(x)) {
        const cJSON *props = cJSON_GetObjectItem(s, "properties"),
                    *req = cJSON_GetObjectItem(s, "required");
        const cJSON *p = props ? props->child : NULL, *k;
        const cJSON *extra = cJSON_GetObjectItem(s, "additionalProperties");
        const cJSON *mnp = cJSON_GetObjectItem(s, "minProperties"),
                    *mxp = cJSON_GetObjectItem(s, "maxProperties");
        const int nk = cJSON_GetArraySize(x);
        if ((mnp && nk < mnp->valueint) || (mxp && nk > mxp->valueint)) return false;
        if (!props && cJSON_IsObject(extra)) { /* a map: any keys, values of its schema */
            cJSON_ArrayForEach(k, x) if (!conforms(k, extra, root)) return false;
            return true;
        }
        if (!props && !cJSON_IsFalse(extra)) return true; /* (any keys, any values) */
        cJSON_ArrayForEach(k, x)
        {
            while (p && strcmp(p->string, k->string))
                p = p->next; /* in order, once each */
            if (!p || !conforms(k, p, root)) return false;
            p = p->next;
        }
        cJSON_ArrayForEach(k, req) if (!cJSON_GetObjectItem(x, k->valuestring)) return false;
    }
    if (cJSON_IsArray(x)) {
        const cJSON *items = cJSON_GetObjectItem(s, "items"),
                    *mn = cJSON_GetObjectItem(s, "minItems"),
                    *mx = cJSON_GetObjectItem(s, "maxItems"), *e;
        const int n = cJSON_GetArraySize(x);
        if ((mn && n < mn->valueint) || (mx && n > mx->valueint)) return false;
        cJSON_ArrayForEach(e, x) if (items && !conforms(e, items, root)) return false;
    }
    return true;
}

/* The first 30 walks: every 37th state's mask against trying every token alone. */
typedef struct {
    bt_grammar_vocab_t *v;
    const char *schema; /* or the pattern of a regex constraint */
    bool regex;
    int vocab, walk, checked;
    int every; /* steps between two checks (37; short instances take fewer) */
} brute_t;

static void brute_step(void *ctx, int step, const char *out, size_t n, const uint32_t *mask)
{
    brute_t *bc = ctx;
    if (bc->walk >= 30 || step % bc->every != 5 % bc->every) return;
    int diff = 0;
    for (int t = 0; t < bc->vocab; t++) {
        bt_grammar_t *h;
        char err[256];
        (bc->regex ? bt_grammar_regex : bt_grammar_json_schema)(
            bc->v, bc->schema, strlen(bc->schema), -1, &h, err, sizeof err);
        const bool want = bt_grammar_accept_bytes(h, out, n) && bt_grammar_accept(h, t);
        diff += want != (bool)((mask[t >> 5] >> (t & 31)) & 1u);
        bt_grammar_destroy(h);
    }
    BT_CHECK_MSG(diff == 0, "after '%.*s': %d tokens where the mask and trying alone differ",
                 (int)n, out, diff);
    bc->checked++;
}

/* Random walks under a schema (the synthetic vocabulary, plus the property names as tokens):
 * every one that ends is an instance the independent check takes; every `every` steps of the
 * first 30 walks, the mask is checked against trying each token alone. */
static void schema_walks_every(const char *text, const char *what, int every)
{
    synth_t s;
    synth_make(&s, 800);
    cJSON *schema = cJSON_Parse(text);
    brute_t bc = {s.v, text, false, s.vocab, 0, 0, every};
    const walker_t wk = {
        (const char *const *)s.bytes, s.lens, s.vocab, s.eos, 100, s.eos, brute_step, &bc};
    int ended = 0, conforming = 0;
    for (int w = 0; w < 200; w++) {
        bt_grammar_t *g;
        char err[256];
        BT_CHECK(bt_grammar_json_schema(s.v, text, strlen(text), -1, &g, err, sizeof err) == BT_OK);
        char out[1 << 14];
        size_t n;
        bc.walk = w;
        const bool done = walk_once(&wk, g, 600, out, sizeof out, &n);
        bt_grammar_destroy(g);
        if (!done) continue;
        ended++;
        cJSON *x = cJSON_ParseWithLength(out, n);
        const bool ok = x && conforms(x, schema, schema);
        conforming += ok;
        BT_CHECK_MSG(ok, "walk %d ended in '%s', not an instance", w, out);
        cJSON_Delete(x);
    }
    uint64_t computed, cached;
    bt_grammar_vocab_stats(s.v, &computed, &cached);
    fprintf(stderr,
            "  200 walks under a schema (%s): %d ended, %d instances; masks %llu computed, %llu "
            "from the cache; %d masks as tried alone\n",
            what, ended, conforming, (unsigned long long)computed, (unsigned long long)cached,
            bc.checked);
    BT_CHECK(ended > 100 && bc.checked > 50);
    cJSON_Delete(schema);
    synth_free(&s);
}

static void schema_walks(const char *text, const char *what)
{
    schema_walks_every(text, what, 37);
}

static void test_schema_walks(void)
{
    schema_walks(PERSON, "nested, optional, enum, $ref, anyOf, bounds, lengths");
    schema_walks(SHAPED, "patterns, formats");
    schema_walks_every(COUNTED, "listed properties, 2..3 of them", 7);
    schema_walks_every(PETS, "a discriminated union", 7);
    schema_walks_every(PETS_LATE, "a union told apart after shared properties", 7);
    schema_walks_every(TYPED, "a union told apart by its shared key's value types", 7);
}

/* A format or pattern used by many fields is compiled once: 40 date-time fields (more than
 * the 32 patterns a schema may hold, and they had been 40 DFAs), each still held to its format;
 * 33 different patterns are still refused by name. */
static void test_pattern_reuse(void)
{
    synth_t s;
    synth_make(&s, 0);
    char schema[8192], err[256];
    for (int kind = 0; kind < 2; kind++) {
        int len = snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{");
        const int n = kind ? 33 : 40;
        for (int i = 0; i < n; i++) {
            if (kind)
                len += snprintf(schema + len, sizeof schema - len,
                                "%s\"f%d\":{\"type\":\"string\",\"pattern\":\"^a{%d}$\"}",
                                i ? "," : "", i, i + 1);
            else
                len += snprintf(schema + len, sizeof schema - len,
                                "%s\"f%d\":{\"type\":\"string\",\"format\":\"date-time\"}",
                                i ? "," : "", i);
        }
        len += snprintf(schema + len, sizeof schema - len, "},\"required\":[\"f0\"]}");
        BT_CHECK(len < (int)sizeof schema);
        bt_grammar_t *g = NULL;
        const bt_status_t st =
            bt_grammar_json_schema(s.v, schema, strlen(schema), -1, &g, err, sizeof err);
        if (kind == 0) {
            BT_CHECK_MSG(st == BT_OK, "40 date-time fields refused: %s", err);
            bt_grammar_destroy(g);
            static const char *const texts[] = {"{\"f0\":\"2024-01-02T03:04:05Z\",\"f39\":\"2024",
                                                "{\"f0\":\"2024-01-02T03:04:05Z\",\"f39\":\"x"};
            BT_CHECK(judge_schema(s.v, schema, texts[0], strlen(texts[0])) == 0);
            BT_CHECK(judge_schema(s.v, schema, texts[1], strlen(texts[1])) == -1);
        } else {
            BT_CHECK(st != BT_OK && strstr(err, "more than 32 different patterns"));
        }
    }
    synth_free(&s);
}

/* A schema whose properties and union branches pass 65535 list entries is refused by name:
 * 50 objects of M objects of 4 properties, each an anyOf of 6 branches (the branches $refs,
 * so the nodes stay few): M 50 is ~70600 entries, where a node's 16-bit start in the list had
 * wrapped, reading other nodes' entries; M 40 (~56500) compiles. */
static void test_schema_too_large(void)
{
    synth_t s;
    synth_make(&s, 0);
    static const char head[] =
        "{\"$defs\":{\"S\":{\"type\":\"string\"},\"I\":{\"type\":\"integer\"},\"B\":{"
        "\"type\":\"boolean\"},\"N\":{\"type\":\"null\"},\"A\":{\"type\":\"array\"},\"O\":{"
        "\"type\":\"object\"}},\"type\":\"object\",\"properties\":{";
    static const char leaf[] =
        "{\"anyOf\":[{\"$ref\":\"#/$defs/S\"},{\"$ref\":\"#/$defs/I\"},{\"$ref\":\"#/$defs/B\"},"
        "{\"$ref\":\"#/$defs/N\"},{\"$ref\":\"#/$defs/A\"},{\"$ref\":\"#/$defs/O\"}]}";
    for (int big = 0; big < 2; big++) {
        const int m = big ? 50 : 40;
        const size_t cap = sizeof head + (size_t)50 * m * (4 * (sizeof leaf + 8) + 64) + 4096;
        char *schema = malloc(cap);
        BT_CHECK(schema != NULL);
        if (!schema) break;
        size_t len = (size_t)snprintf(schema, cap, "%s", head);
        for (int i = 0; i < 50; i++) {
            len += (size_t)snprintf(schema + len, cap - len,
                                    "%s\"a%d\":{\"type\":\"object\",\"properties\":{", i ? "," : "",
                                    i);
            for (int j = 0; j < m; j++) {
                len += (size_t)snprintf(schema + len, cap - len,
                                        "%s\"b%d\":{\"type\":\"object\",\"properties\":{",
                                        j ? "," : "", j);
                for (int k = 0; k < 4; k++)
                    len += (size_t)snprintf(schema + len, cap - len, "%s\"c%d\":%s", k ? "," : "",
                                            k, leaf);
                len += (size_t)snprintf(schema + len, cap - len, "}}");
            }
            len += (size_t)snprintf(schema + len, cap - len, "}}");
        }
        len += (size_t)snprintf(schema + len, cap - len, "}}");
        bt_grammar_t *g = NULL;
        char err[256] = "";
        const bt_status_t st = bt_grammar_json_schema(s.v, schema, len, -1, &g, err, sizeof err);
        if (big)
            BT_CHECK_MSG(st == BT_ERR_INVALID_ARG && strstr(err, "more than 65535 properties"),
                         "50 x %d x 4 properties of 6 branches: %d '%s'", m, (int)st, err);
        else
            BT_CHECK_MSG(st == BT_OK, "50 x %d x 4 properties of 6 branches refused: %s", m, err);
        if (st == BT_OK) bt_grammar_destroy(g);
        free(schema);
    }
    synth_free(&s);
}

/* ---- regex constraints ---- */

/* 1: the output may end (eos taken); 0: a valid prefix; -1: refused at some byte */
static int judge_regex(bt_grammar_vocab_t *v, const char *pattern, const char *text, int eos)
{
    bt_grammar_t *g;
    char err[256];
    if (bt_grammar_regex(v, pattern, strlen(pattern), -1, &g, err, sizeof err) != BT_OK) {
        BT_CHECK_MSG(0, "pattern refused: %s", err);
        return -2;
    }
    int verdict = -1;
    if (bt_grammar_accept_bytes(g, text, strlen(text))) {
        bt_grammar_t *c = bt_grammar_clone(g);
        verdict = bt_grammar_accept(c, eos) ? 1 : 0;
        BT_CHECK(verdict == 0 || bt_grammar_done(c)); /* eos taken: it ended */
        bt_grammar_destroy(c);
    }
    bt_grammar_destroy(g);
    return verdict;
}

static const char *const regex_patterns[] = {
    "(yes|no|maybe)",
    "^\\d{3}-\\d{4}( ext\\. \\d{1,4})?$",
    "[A-Z][a-z]+( [a-z]+)*[.!?]",
    "((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)",
    "\\{\"n\": [0-9]+\\}\n?",
    "[\u00e9\u65e5a-c]{2,5}",
};

static void test_regex_table(void)
{
    synth_t s;
    synth_make(&s, 0);
    static const struct {
        int pattern;
        const char *text;
        int want;
    } cases[] = {
        {0, "yes", 1},
        {0, "ma", 0},
        {0, "no ", -1},
        {0, "", 0},
        {0, "yess", -1},
        {1, "555-1234", 1},
        {1, "555-1234 ext", 0},
        {1, "555-1234 ext. 9", 1},
        {1, "555-12345", -1},
        {1, "55-", -1},
        {2, "Hello there.", 1},
        {2, "Hello there", 0},
        {2, "hello", -1},
        {2, "Hi.", 1},
        {2, "Hi. ", -1},
        {3, "10.0.0.1", 1},
        {3, "10.0.0.", 0},
        {3, "256", -1},
        {4, "{\"n\": 42}", 1},
        {4, "{\"n\": 42}\n", 1},
        {4, "{\"n\": }", -1},
        {5, "\u00e9\u65e5", 1},
        {5, "a", 0},
        {5, "abcabc", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = judge_regex(s.v, regex_patterns[cases[i].pattern], cases[i].text, s.eos);
        BT_CHECK_MSG(got == cases[i].want, "/%s/ '%s': %d, want %d",
                     regex_patterns[cases[i].pattern], cases[i].text, got, cases[i].want);
    }
    /* in a request, and refused with a reason */
    char err[256];
    BT_CHECK(bt_grammar_request_check("regex", "(yes|no)", err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_request_check("regex", "", err, sizeof err) == BT_ERR_INVALID_ARG &&
             strstr(err, "needs its spec"));
    BT_CHECK(bt_grammar_request_check("regex", "(?=a)", err, sizeof err) == BT_ERR_INVALID_ARG &&
             !strncmp(err, "regex: lookaround", 17));
    BT_CHECK(bt_grammar_request_check("regex", "a(", err, sizeof err) == BT_ERR_INVALID_ARG &&
             strstr(err, "not closed"));
    /* a pattern and a schema of the same text are different constraints */
    bt_grammar_t *a, *b;
    const char *text = "{\"type\":\"object\"}";
    BT_CHECK(bt_grammar_regex(s.v, text, strlen(text), -1, &a, err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_json_schema(s.v, text, strlen(text), -1, &b, err, sizeof err) == BT_OK);
    BT_CHECK(bt_grammar_accept_bytes(b, "{}", 2) && !bt_grammar_accept_bytes(a, "{}", 2));
    bt_grammar_destroy(a);
    bt_grammar_destroy(b);
    synth_free(&s);
}

/* Random walks under regex constraints: every one that ends is a whole match for PCRE2, and
 * masks agree with trying each token alone. */
static void test_regex_walks(void)
{
    synth_t s;
    synth_make(&s, 800);
    int ended = 0, matching = 0, walks = 0, checked = 0;
    for (size_t pi = 0; pi < sizeof regex_patterns / sizeof regex_patterns[0]; pi++) {
        const char *pattern = regex_patterns[pi];
        brute_t bc = {s.v, pattern, true, s.vocab, 0, 0, 37};
        const walker_t wk = {
            (const char *const *)s.bytes, s.lens, s.vocab, s.eos, 1 << 30, s.eos, brute_step, &bc};
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED |
                                             PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX,
                                         &ec, &eo, NULL);
        BT_CHECK_MSG(code != NULL, "PCRE2 cannot compile %s", pattern);
        if (!code) continue;
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        for (int w = 0; w < 60; w++) {
            bt_grammar_t *g;
            char err[256];
            BT_CHECK(bt_grammar_regex(s.v, pattern, strlen(pattern), -1, &g, err, sizeof err) ==
                     BT_OK);
            char out[1 << 14];
            size_t n;
            bc.walk = w;
            walks++;
            const bool done = walk_once(&wk, g, 400, out, sizeof out, &n);
            bt_grammar_destroy(g);
            if (!done) continue;
            ended++;
            const bool ok = pcre2_match(code, (PCRE2_SPTR)out, n, 0, 0, md, NULL) >= 0;
            matching += ok;
            BT_CHECK_MSG(ok, "/%s/: walk %d ended in '%s', not a match", pattern, w, out);
        }
        checked += bc.checked;
        pcre2_match_data_free(md);
        pcre2_code_free(code);
    }
    fprintf(stderr,
            "  %d walks under %zu regex constraints: %d ended, %d whole matches; %d masks as "
            "tried alone\n",
            walks, sizeof regex_patterns / sizeof regex_patterns[0], ended, matching, checked);
    BT_CHECK(ended > walks / 2 && checked > 50);
    synth_free(&s);
}

/* ---- tool calls ---- */

#define D "｜DSML｜ "
#define TOOLS                                                                                      \
    "{\"tools\":[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"   \
    "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"unit\":{\"enum\":[\"C\","    \
    "\"F\"]},\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}(<[0-9])?$\"}},"                 \
    "\"required\":[\"city\"],\"maxProperties\":2}},{\"name\":\"search\",\"parameters\":{\"type\":" \
    "\"object\","                                                                                  \
    "\"properties\":{\"q\":{\"type\":\"string\"},\"opts\":{\"type\":\"object\",\"properties\":{"   \
    "\"k\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3}}},"                \
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"note\":{\"type\":"            \
    "\"string\",\"minLength\":2,\"maxLength\":6}},\"required\":[\"q\"]}},{\"name\":\"log\","       \
    "\"parameters\":{\"type\":\"object\"}}]%s}"

static int judge_tools(bt_grammar_vocab_t *v, const char *spec, const char *text)
{
    bt_grammar_t *g;
    char err[256];
    if (bt_grammar_tool_calls(v, spec, strlen(spec), -1, &g, err, sizeof err) != BT_OK) {
        BT_CHECK_MSG(0, "spec refused: %s", err);
        return -2;
    }
    const bool ok = bt_grammar_accept_bytes(g, text, strlen(text));
    const int verdict = !ok ? -1 : bt_grammar_done(g) ? 1 : 0;
    bt_grammar_destroy(g);
    return verdict;
}

/* texts under a spec, each with its verdict (judge_tools) */
typedef struct {
    const char *text;
    int want;
} tools_case_t;

static void judge_tools_cases(bt_grammar_vocab_t *v, const char *spec, const tools_case_t *cases,
                              size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        const int got = judge_tools(v, spec, cases[i].text);
        BT_CHECK_MSG(got == cases[i].want, "%s case %zu: %d, want %d", what, i, got, cases[i].want);
    }
}

/* a string parameter's end tag, then the invoke's and the block's */
#define RAW_END "</" D "parameter>\n</" D "invoke>\n</" D "calls>"

static void test_tool_call_table(void)
{
    synth_t s;
    synth_make(&s, 0);
    char any[2048], one[2048];
    snprintf(any, sizeof any, TOOLS, "");
    snprintf(one, sizeof one, TOOLS, ",\"one\":true");
#define W_CALL                                                                                     \
    "<" D "invoke name=\"get_weather\">\n<" D "parameter name=\"city\" string=\"true\">Paris </" D \
    "x</" D "parameter>\n<" D "parameter name=\"days\" string=\"false\">3</" D "parameter>\n</" D  \
    "invoke>"
#define S_CALL                                                                                     \
    "<" D "invoke name=\"search\">\n<" D "parameter name=\"q\" string=\"true\">a \"b\"</" D        \
    "parameter>\n<" D "parameter name=\"opts\" string=\"false\">{\"k\": [1, 2]}</" D               \
    "parameter>\n</" D "invoke>"
    static const struct {
        const char *text;
        int want_any, want_one;
    } cases[] = {
        {"\n\n<" D "calls>\n" W_CALL "\n</" D "calls>", 1, 1},
        {"<" D "calls>\n" W_CALL "\n" S_CALL "\n</" D "calls>", 1, -1}, /* two calls */
        {"<" D "calls>\n" S_CALL "\n</" D "calls>", 1, 1},
        {"<" D "calls>\n" W_CALL, 0, 0},
        {"Sure: <" D "calls>", -1, -1}, /* nothing before the block */
        {"<" D "calls>\n<" D "invoke name=\"delete_all\">", -1, -1},
        {"<" D "calls>\n<" D "invoke name=\"get_weather\">\n</" D "invoke>", -1, -1}, /* city */
        {"<" D "calls>\n<" D "invoke name=\"get_weather\">\n<" D "parameter name=\"days\"", -1, -1},
        {"<" D "calls>\n<" D "invoke name=\"get_weather\">\n<" D
         "parameter name=\"city\" string=\"false\">",
         -1, -1},
        {"<" D "calls>\n<" D "invoke name=\"search\">\n<" D
         "parameter name=\"q\" string=\"true\">x</" D "parameter>\n<" D
         "parameter name=\"opts\" string=\"false\">{\"k\": [1.5]}",
         -1, -1},
        {"<" D "calls>\n<" D "invoke name=\"get_weather\">\n<" D
         "parameter name=\"city\" string=\"true\">x</" D "parameter>\n<" D
         "parameter name=\"unit\" string=\"false\">\"K\"",
         -1, -1},
        /* maxProperties 2: a third parameter of get_weather is not let in */
        {"<" D "calls>\n<" D "invoke name=\"get_weather\">\n<" D
         "parameter name=\"city\" string=\"true\">x</" D "parameter>\n<" D
         "parameter name=\"days\" string=\"false\">3</" D "parameter>\n<" D "parameter",
         -1, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int a = judge_tools(s.v, any, cases[i].text),
                  o = judge_tools(s.v, one, cases[i].text);
        BT_CHECK_MSG(a == cases[i].want_any && o == cases[i].want_one,
                     "case %zu: %d %d, want %d %d", i, a, o, cases[i].want_any, cases[i].want_one);
    }
    char err[256] = "";
    /* a tool whose parameters list no properties takes any, each named as an identifier, in
     * either form */
    const char *generic =
        "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}},"
        "{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}]}";
#define F_CALL "<" D "calls>\n<" D "invoke name=\"f\">\n"
#define F_END "</" D "invoke>\n</" D "calls>"
    static const tools_case_t free_form[] = {
        {F_CALL F_END, 1},
        {F_CALL "<" D "parameter name=\"a_b-1.x\" string=\"true\">any <text>\n</" D
                "parameter>\n" F_END,
         1},
        {F_CALL "<" D "parameter name=\"n\" string=\"false\">{\"k\": [1, \"x\"]}</" D
                "parameter>\n<" D "parameter name=\"m\" string=\"true\">t</" D "parameter>\n" F_END,
         1},
        {F_CALL "<" D "parameter name=\"a\" string=\"", 0},
        {F_CALL "<" D "parameter name=\"a b", -1}, /* not an identifier */
        {F_CALL "<" D "parameter name=\"\"", -1},  /* empty */
        {F_CALL "<" D "parameter name=\"a\" string=\"m", -1},
        {F_CALL "<" D "parameter name=\"a\" string=\"false\">{x", -1},
        {"<" D "calls>\n<" D "invoke name=\"g\">\n<" D "parameter", -1}, /* lists none: none */
        /* no name twice in a call (the parser refuses the block), a prefix of one is another */
        {F_CALL "<" D "parameter name=\"ab\" string=\"false\">1</" D "parameter>\n<" D
                "parameter name=\"ab\"",
         -1},
        {F_CALL "<" D "parameter name=\"ab\" string=\"false\">1</" D "parameter>\n<" D
                "parameter name=\"a\" string=\"true\">x</" D "parameter>\n" F_END,
         1},
        {F_CALL "<" D "parameter name=\"ab\" string=\"false\">1</" D "parameter>\n" F_END "\n<" D
                "invoke name=\"f\">\n<" D "parameter name=\"ab\"",
         -1}, /* (the block ended) */
    };
    judge_tools_cases(s.v, generic, free_form, sizeof free_form / sizeof free_form[0], "free-form");
    /* additionalProperties as a schema: each parameter's value of it, in its form */
    const char *maps =
        "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"additionalProperties\":{\"type\":\"integer\",\"maximum\":50}}},"
        "{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"additionalProperties\":"
        "{\"type\":\"string\",\"maxLength\":2}}}]}";
#define G_CALL "<" D "calls>\n<" D "invoke name=\"g\">\n"
    static const tools_case_t mapped[] = {
        {F_CALL "<" D "parameter name=\"n\" string=\"false\">42</" D "parameter>\n" F_END, 1},
        {F_CALL "<" D "parameter name=\"n\" string=\"false\">51", -1},
        {F_CALL "<" D "parameter name=\"n\" string=\"t", -1},
        {G_CALL "<" D "parameter name=\"s\" string=\"true\">ab</" D "parameter>\n</" D
                "invoke>\n</" D "calls>",
         1},
        {G_CALL "<" D "parameter name=\"s\" string=\"true\">abc", -1},
        {G_CALL "<" D "parameter name=\"s\" string=\"f", -1},
    };
    judge_tools_cases(s.v, maps, mapped, sizeof mapped / sizeof mapped[0], "maps");
    const char *bounded = "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                          "\"minProperties\":1,\"maxProperties\":1}}]}";
    static const tools_case_t one_param[] = {
        {F_CALL F_END, -1}, /* minProperties */
        {F_CALL "<" D "parameter name=\"a\" string=\"false\">1</" D "parameter>\n" F_END, 1},
        {F_CALL "<" D "parameter name=\"a\" string=\"false\">1</" D "parameter>\n<" D "param", -1},
    };
    judge_tools_cases(s.v, bounded, one_param, sizeof one_param / sizeof one_param[0], "bounded");
#undef G_CALL
    /* up to 16 parameters a call; the names of one call do not carry into the next */
    {
        char text[4096];
        size_t n = (size_t)snprintf(text, sizeof text, "<" D "calls>\n");
        for (int call = 0; call < 2; call++) {
            n += (size_t)snprintf(text + n, sizeof text - n, "<" D "invoke name=\"f\">\n");
            for (int i = 0; i < 16; i++)
                n += (size_t)snprintf(
                    text + n, sizeof text - n,
                    "<" D "parameter name=\"p%d\" string=\"false\">%d</" D "parameter>\n", i, i);
            char more[4200];
            snprintf(more, sizeof more, "%s<" D "parameter", text);
            BT_CHECK_EQ_INT(judge_tools(s.v, generic, more), -1);
            n += (size_t)snprintf(text + n, sizeof text - n, "</" D "invoke>%s",
                                  call ? "\n</" D "calls>" : "\n");
        }
        BT_CHECK_EQ_INT(judge_tools(s.v, generic, text), 1);
    }
#undef F_CALL
#undef F_END
    const char *not_object = "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"string\"}}]}";
    BT_CHECK(bt_grammar_tool_calls_check(not_object, strlen(not_object), err, sizeof err) ==
                 BT_ERR_INVALID_ARG &&
             strstr(err, "must be an object"));
    /* a JSON value's strings cannot hold what ends a parameter for the parser (its bars may be
     * escaped) */
#define T_CALL                                                                                     \
    "<" D "calls>\n<" D "invoke name=\"search\">\n<" D                                             \
    "parameter name=\"q\" string=\"true\">x</" D "parameter>\n<" D                                 \
    "parameter name=\"tags\" string=\"false\">[\"a"
    BT_CHECK_EQ_INT(judge_tools(s.v, any, T_CALL "/" D "parameter"), -1);
    BT_CHECK_EQ_INT(judge_tools(s.v, any, T_CALL "\\/" D "parameter"), -1); /* (the '/' is there) */
    BT_CHECK_EQ_INT(judge_tools(s.v, any, T_CALL "/\\uff5cDSML\\uff5c parameter"), 0);
    BT_CHECK_EQ_INT(judge_tools(s.v, any, T_CALL "</" D "paramete"), 0);
#undef T_CALL
    BT_CHECK(bt_grammar_tool_calls_check("{\"tools\":[]}", 12, err, sizeof err) ==
             BT_ERR_INVALID_ARG);
    /* a raw string parameter held to a length, in characters: 2..4 ('<' and the bar are text
     * wherever no end tag may begin or one breaks off) */
    const char *lengths = "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                          "\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":2,"
                          "\"maxLength\":4}}}}]}";
#define L_CALL "<" D "calls>\n<" D "invoke name=\"f\">\n<" D "parameter name=\"s\" string=\"true\">"
    static const tools_case_t counted[] = {
        {L_CALL "ab" RAW_END, 1},
        {L_CALL "abcd" RAW_END, 1},
        {L_CALL "a" RAW_END, -1},   /* too short: "</..." is text, then too long */
        {L_CALL "a</" D "pa", -1},  /* (that text passes 4 characters) */
        {L_CALL "a<b" RAW_END, 1},  /* '<' as text */
        {L_CALL "abcde", -1},       /* too long */
        {L_CALL "ab<x" RAW_END, 1}, /* a tag that broke off: "ab<x", 4 characters */
        {L_CALL "ab</x", -1},       /* 5 */
        {L_CALL "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9" RAW_END, 1}, /* 4 characters of 2 bytes */
        {L_CALL "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", -1},
        {L_CALL "ab</\xef\xbd\x9cx", -1}, /* the bar is one character: "ab</｜x" is 6 */
        {L_CALL "a</\xef\xbd\x9c", 0},    /* "a</｜": text from 'a' (too short for a tag) */
        {L_CALL "a</\xef\xbd\x9cx", -1},
    };
    judge_tools_cases(s.v, lengths, counted, sizeof counted / sizeof counted[0], "counted");
#undef L_CALL
    BT_CHECK(bt_grammar_tool_calls_check("{\"tools\":[{\"name\":\"f\"}]}", 24, err, sizeof err) ==
             BT_OK);
    /* a raw string parameter held to a pattern (one with '<' in it: text, or its end tag), a
     * format, and a pattern with lengths (its characters counted as the pattern reads them) */
    const char *shaped = "{\"tools\":[{\"name\":\"book\",\"parameters\":{\"type\":\"object\","
                         "\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":"
                         "\"^[A-Z]{2}(<[0-9])?$\"},\"day\":{\"type\":\"string\",\"format\":"
                         "\"date\"},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9<]+$\","
                         "\"minLength\":2,\"maxLength\":4}},\"required\":[\"code\"]}}]}";
#define Z_CALL B_CALL "AB</" D "parameter>\n<" D "parameter name=\"zip\" string=\"true\">"
#define B_CALL                                                                                     \
    "<" D "calls>\n<" D "invoke name=\"book\">\n<" D "parameter name=\"code\" string=\"true\">"
    static const tools_case_t raw[] = {
        {B_CALL "AB" RAW_END, 1},
        {B_CALL "AB<7" RAW_END, 1},
        {B_CALL "AB<", 0},
        {B_CALL "AB</" D "param", 0},
        {B_CALL "AB</x", -1}, /* the tag broke off: "</x" is no text the pattern takes */
        {B_CALL "AB<<", -1},
        {B_CALL "A</", -1}, /* "A" cannot end, and "A<" cannot go on */
        {B_CALL "ab", -1},
        {B_CALL "AB<7<", 0}, /* (the tag may begin) */
        {B_CALL "AB<7<x", -1},
        {B_CALL "AB</" D "parameter>\n<" D
                "parameter name=\"day\" string=\"true\">2026-12-05" RAW_END,
         1},
        {B_CALL "AB</" D "parameter>\n<" D "parameter name=\"day\" string=\"true\">2026-13", -1},
        {Z_CALL "12" RAW_END, 1},
        {Z_CALL "1<<4" RAW_END, 1},
        {Z_CALL "1" RAW_END, -1}, /* 1 character: "1<" is text, '/' is not */
        {Z_CALL "12345", -1},
        {Z_CALL "1<<4<", 0},   /* (the tag may begin) */
        {Z_CALL "1<<4<5", -1}, /* 6 characters as text */
    };
    judge_tools_cases(s.v, shaped, raw, sizeof raw / sizeof raw[0], "raw");
#undef Z_CALL
#undef B_CALL
    synth_free(&s);
#undef W_CALL
#undef S_CALL
}

/* Random walks under the tool spec (the DSML tags among the tokens, taken often once the walk
 * is long): the tool parser (parsers.c, independent of the grammar) reads every block that ends
 * without a warning, into calls of the spec's tools whose arguments fit their schemas. */
static void test_tool_call_walks(void)
{
    static const char *const tags[] = {"<" D "calls>\n<" D "invoke name=\"",
                                       "</" D "parameter>\n",
                                       "</" D "parameter>",
                                       "</" D "invoke>",
                                       "\n</" D "calls>",
                                       "<" D "parameter name=",
                                       "\n<" D "invoke name=\"",
                                       " string=\"true\">",
                                       " string=\"false\">",
                                       "get_weather\">\n",
                                       "search\">\n",
                                       "\"tags\"",
                                       "\"city\"",
                                       "\"days\"",
                                       "\"unit\"",
                                       "\"code\"",
                                       "\"q\"",
                                       "\"opts\"",
                                       "{\"k\": [",
                                       "]}"};
    const int n_tags = (int)(sizeof tags / sizeof *tags);
    synth_t s;
    synth_make(&s, 600);
    /* the tags replace the last multi-byte tokens */
    for (int i = 0; i < n_tags; i++) {
        const int id = s.vocab - 2 - i;
        free(s.bytes[id]);
        s.lens[id] = strlen(tags[i]);
        s.bytes[id] = malloc(s.lens[id]);
        memcpy(s.bytes[id], tags[i], s.lens[id]);
    }
    bt_grammar_vocab_destroy(s.v);
    BT_CHECK(bt_grammar_vocab_create_bytes((const char *const *)s.bytes, s.lens, s.vocab, s.eos,
                                           &s.v) == BT_OK);
    char spec[2048];
    snprintf(spec, sizeof spec, TOOLS, "");
    cJSON *specj = cJSON_Parse(spec);
    const walker_t wk = {(const char *const *)s.bytes, s.lens, s.vocab, s.eos, 200,
                         s.vocab - 1 - n_tags,         NULL,   NULL};
    int ended = 0, calls_total = 0, free_args = 0; /* arguments of the free-form tool, log */
    for (int w = 0; w < 150; w++) {
        bt_grammar_t *g;
        char err[256];
        BT_CHECK(bt_grammar_tool_calls(s.v, spec, strlen(spec), -1, &g, err, sizeof err) == BT_OK);
        static char out[1 << 15];
        size_t n;
        const bool done = walk_once(&wk, g, 3000, out, sizeof out, &n);
        bt_grammar_destroy(g);
        if (!done) continue;
        ended++;
        bt_tool_parser_t *tp = bt_tool_parser_create(1);
        bt_tool_delta_t d1, d2;
        bt_tool_parser_push(tp, out, n, &d1);
        int calls = d1.n_calls;
        bool fit = true;
        for (int pass = 0; pass < 2; pass++) {
            const bt_tool_delta_t *d = pass ? &d2 : &d1;
            if (pass) {
                bt_tool_parser_finish(tp, &d2);
                calls += d2.n_calls;
            }
            for (int c = 0; c < d->n_calls; c++) {
                const cJSON *tool = NULL, *x;
                cJSON_ArrayForEach(
                    x, cJSON_GetObjectItem(
                           specj, "tools")) if (!strcmp(cJSON_GetObjectItem(x, "name")->valuestring,
                                                        d->calls[c].name)) tool = x;
                cJSON *args = cJSON_Parse(d->calls[c].arguments);
                const cJSON *ps = tool ? cJSON_GetObjectItem(tool, "parameters") : NULL;
                const bool ok = ps && args && conforms(args, ps, ps);
                BT_CHECK_MSG(ok, "walk %d: call %s(%s) does not fit its tool", w, d->calls[c].name,
                             d->calls[c].arguments);
                fit = fit && ok;
                if (!strcmp(d->calls[c].name, "log")) free_args += cJSON_GetArraySize(args);
                cJSON_Delete(args);
            }
        }
        BT_CHECK_MSG(d2.warnings == 0 && calls >= 1, "walk %d: %d calls, %d warnings from '%s'", w,
                     calls, d2.warnings, out);
        calls_total += calls;
        bt_tool_parser_destroy(tp);
    }
    fprintf(stderr,
            "  150 walks under a spec of 3 tools: %d ended, %d calls parsed, each fitting its "
            "tool's schema; %d arguments of the free-form tool\n",
            ended, calls_total, free_args);
    BT_CHECK(ended > 75 && free_args > 0);
    cJSON_Delete(specj);
    synth_free(&s);
}
#undef RAW_END
#undef D

int main(void)
{
    BT_RUN(test_table);
    BT_RUN(test_random_documents);
    BT_RUN(test_masks_match_brute_force);
    BT_RUN(test_random_walks);
    BT_RUN(test_golden_tokenizer);
    BT_RUN(test_schema_table);
    BT_RUN(test_schema_walks);
    BT_RUN(test_pattern_reuse);
    BT_RUN(test_schema_too_large);
    BT_RUN(test_regex_table);
    BT_RUN(test_regex_walks);
    BT_RUN(test_tool_call_table);
    BT_RUN(test_tool_call_walks);
    return bt_test_summary();
}

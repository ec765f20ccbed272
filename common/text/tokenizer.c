/* Byte-level BPE tokenizer (Hugging Face tokenizer.json), engram token map and streaming
 * detokenizer. See tokenizer.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/text/tokenizer.h"

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "common/text/text_internal.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_TOKENIZER_JSON (512u << 20)
#define MAX_CONFIG_JSON (16u << 20)
#define MAX_SPLITS 8
#define SHORT_WORD 64 /* pieces up to this many bytes use the array BPE */

/* ---- string -> int map (open addressing) ------------------------------------------------- */

typedef struct {
    const char *key; /* not owned */
    uint32_t len;
    int32_t val;
} smap_slot_t;

typedef struct {
    smap_slot_t *slots;
    size_t cap, count; /* cap is a power of two */
} smap_t;

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void smap_init(smap_t *m, size_t expect)
{
    size_t cap = 16;
    while (cap < expect * 2 + 2) cap *= 2;
    m->slots = bt_calloc_or_die(cap, sizeof *m->slots);
    m->cap = cap;
    m->count = 0;
}

static void smap_free(smap_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->count = 0;
}

static smap_slot_t *smap_find(const smap_t *m, const char *key, size_t len)
{
    size_t mask = m->cap - 1, i = hash_bytes(key, len) & mask;
    for (;;) {
        smap_slot_t *s = &m->slots[i];
        if (!s->key) return s;
        if (s->len == len && memcmp(s->key, key, len) == 0) return s;
        i = (i + 1) & mask;
    }
}

static void smap_grow(smap_t *m)
{
    smap_t n;
    smap_init(&n, m->cap);
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) *smap_find(&n, m->slots[i].key, m->slots[i].len) = m->slots[i];
    n.count = m->count;
    free(m->slots);
    *m = n;
}

/* Returns the existing value, or inserts val and returns -1 - (whether inserted) ... simpler:
 * returns the slot; caller checks slot->key. */
static smap_slot_t *smap_put(smap_t *m, const char *key, size_t len)
{
    if ((m->count + 1) * 2 > m->cap) smap_grow(m);
    smap_slot_t *s = smap_find(m, key, len);
    if (!s->key) {
        s->key = key;
        s->len = (uint32_t)len;
        s->val = -1;
        m->count++;
    }
    return s;
}

static int32_t smap_get(const smap_t *m, const char *key, size_t len)
{
    if (!m->cap) return -1;
    smap_slot_t *s = smap_find(m, key, len);
    return s->key ? s->val : -1;
}

/* ---- merge map: (left id, right id) -> (rank, result id) --------------------------------- */

typedef struct {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank;
    int32_t result;
} merge_slot_t;

static inline uint64_t merge_key(int32_t a, int32_t b)
{
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static inline size_t merge_hash(uint64_t k, size_t mask)
{
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k >> 29) & mask;
}

/* ---- the tokenizer ----------------------------------------------------------------------- */

typedef struct {
    int32_t child[256]; /* node index or -1; root only uses this table */
} trie_root_t;

typedef struct {
    int32_t first_child, next_sibling, token; /* token id or -1 */
    uint8_t byte;
} trie_node_t;

enum { SPLIT_ISOLATED, SPLIT_REMOVED };

typedef struct {
    pcre2_code *re;
    int behavior;
    bool jit;
} split_t;

enum { NORM_NONE = 0, NORM_NFC = 1, NORM_NFD = 2, NORM_NFKC = 3, NORM_NFKD = 4 };

struct bt_tokenizer {
    int n_ids;
    char **tok_str;      /* [n_ids] vocabulary strings (NULL for unused ids) */
    uint8_t **tok_bytes; /* [n_ids] decoded bytes */
    uint32_t *tok_len;   /* [n_ids] */
    uint8_t *special;    /* [n_ids] added & special */
    smap_t vocab;        /* string -> id (keys point into tok_str) */
    int32_t byte_id[256];
    merge_slot_t *merges;
    size_t merge_mask;
    /* added tokens trie */
    trie_root_t root;
    trie_node_t *nodes;
    int n_nodes;
    bool have_added;
    /* pre-tokenizer */
    split_t splits[MAX_SPLITS];
    int n_splits;
    int norm[4];
    int n_norm;
    int32_t bos, eos, pad;
    bool add_bos;
};

static const uint32_t *byte_to_cp(void)
{
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* idempotent: concurrent first calls write the same values */
        int n = 0;
        for (int b = 0; b < 256; b++) {
            bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            table[b] = direct ? (uint32_t)b : (uint32_t)(256 + n++);
        }
        ready = 1;
    }
    return table;
}

/* code point -> byte in the ByteLevel alphabet, -1 when cp is not in it */
static int cp_to_byte(uint32_t cp)
{
    static int16_t inv[324];
    static int ready;
    if (!ready) {
        const uint32_t *t = byte_to_cp();
        for (int i = 0; i < 324; i++) inv[i] = -1;
        for (int b = 0; b < 256; b++) inv[t[b]] = (int16_t)b;
        ready = 1;
    }
    return cp < 324 ? inv[cp] : -1;
}

/* The bytes a vocabulary string decodes to: its ByteLevel bytes when every character is in
 * the alphabet, else the string's own UTF-8 (as the ByteLevel decoder does). */
static void token_bytes(const char *s, uint8_t **out_p, uint32_t *len_p)
{
    size_t n = strlen(s);
    uint8_t *out = bt_malloc_or_die(n + 1);
    size_t k = 0, i = 0;
    bool all = true;
    while (i < n) {
        uint32_t cp;
        int l = bt__utf8_decode((const uint8_t *)s + i, n - i, &cp);
        int b = l ? cp_to_byte(cp) : -1;
        if (b < 0) {
            all = false;
            break;
        }
        out[k++] = (uint8_t)b;
        i += (size_t)l;
    }
    if (!all) {
        memcpy(out, s, n);
        k = n;
    }
    out[k] = 0;
    *out_p = out;
    *len_p = (uint32_t)k;
}

static int merge_lookup(const bt_tokenizer_t *t, int32_t a, int32_t b, int32_t *result_p)
{
    uint64_t k = merge_key(a, b);
    size_t i = merge_hash(k, t->merge_mask);
    for (;;) {
        const merge_slot_t *s = &t->merges[i];
        if (s->key == k) {
            *result_p = s->result;
            return s->rank;
        }
        if (!s->key) return -1;
        i = (i + 1) & t->merge_mask;
    }
}

/* ---- loading ----------------------------------------------------------------------------- */

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        st = (code);                                                                               \
        goto fail;                                                                                 \
    } while (0)

/* Rewrites an Oniguruma pattern for PCRE2: \s and \S gain U+0085 (Onig's \s includes NEL,
 * PCRE2's does not). Inside a class only \s is widened. */
static char *onig_to_pcre2(const char *pat)
{
    bt__buf_t b = {0};
    bool in_class = false;
    for (const char *p = pat; *p; p++) {
        if (*p == '\\' && p[1]) {
            if (p[1] == 's') {
                bt__buf_puts(&b, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]");
            } else if (p[1] == 'S' && !in_class) {
                bt__buf_puts(&b, "[^\\s\\x{85}]");
            } else {
                bt__buf_putc(&b, p[0]);
                bt__buf_putc(&b, p[1]);
            }
            p++;
            continue;
        }
        if (*p == '[' && !in_class) {
            in_class = true;
            bt__buf_putc(&b, *p);
            if (p[1] == '^') bt__buf_putc(&b, *++p);
            if (p[1] == ']') bt__buf_putc(&b, *++p); /* literal ] first in class */
            continue;
        }
        if (*p == ']' && in_class) in_class = false;
        bt__buf_putc(&b, *p);
    }
    return bt__buf_take(&b, NULL);
}

static bt_status_t add_split(bt_tokenizer_t *t, const char *pattern, bool literal, int behavior,
                             char *err, size_t errlen)
{
    if (t->n_splits == MAX_SPLITS) {
        snprintf(err, errlen, "tokenizer.json: more than %d Split pre-tokenizers", MAX_SPLITS);
        return BT_ERR_UNSUPPORTED;
    }
    char *pat = literal ? bt_strdup_or_die(pattern) : onig_to_pcre2(pattern);
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, errlen, "tokenizer.json: pre-tokenizer regex /%s/ at offset %zu: %s", pattern,
                 (size_t)eo, (const char *)msg);
        free(pat);
        return BT_ERR_BAD_TOKENIZER;
    }
    free(pat);
    split_t *s = &t->splits[t->n_splits++];
    s->re = re;
    s->behavior = behavior;
    s->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return BT_OK;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static bt_status_t load_pretokenizer(bt_tokenizer_t *t, const cJSON *pt, char *err, size_t errlen)
{
    if (!pt || cJSON_IsNull(pt)) return BT_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) {
        snprintf(err, errlen, "tokenizer.json: pre_tokenizer without a type");
        return BT_ERR_BAD_TOKENIZER;
    }
    const char *ty = type->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        const cJSON *it;
        cJSON_ArrayForEach(it, list)
        {
            bt_status_t st = load_pretokenizer(t, it, err, errlen);
            if (st != BT_OK) return st;
        }
        return BT_OK;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(pt, "invert");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        if (cJSON_IsTrue(inv)) {
            snprintf(err, errlen, "tokenizer.json: Split with invert=true is not supported");
            return BT_ERR_UNSUPPORTED;
        }
        int behavior;
        if (cJSON_IsString(beh) && !strcmp(beh->valuestring, "Isolated"))
            behavior = SPLIT_ISOLATED;
        else if (cJSON_IsString(beh) && !strcmp(beh->valuestring, "Removed"))
            behavior = SPLIT_REMOVED;
        else {
            snprintf(err, errlen, "tokenizer.json: Split behavior %s is not supported",
                     cJSON_IsString(beh) ? beh->valuestring : "(missing)");
            return BT_ERR_UNSUPPORTED;
        }
        if (cJSON_IsString(rx)) return add_split(t, rx->valuestring, false, behavior, err, errlen);
        if (cJSON_IsString(lit)) return add_split(t, lit->valuestring, true, behavior, err, errlen);
        snprintf(err, errlen, "tokenizer.json: Split without a Regex or String pattern");
        return BT_ERR_BAD_TOKENIZER;
    }
    if (!strcmp(ty, "ByteLevel")) {
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space");
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        if (cJSON_IsTrue(aps)) {
            snprintf(err, errlen, "tokenizer.json: ByteLevel add_prefix_space=true is not supported");
            return BT_ERR_UNSUPPORTED;
        }
        if (!ur || cJSON_IsTrue(ur)) return add_split(t, GPT2_PATTERN, false, SPLIT_ISOLATED, err, errlen);
        return BT_OK;
    }
    snprintf(err, errlen, "tokenizer.json: pre-tokenizer %s is not supported", ty);
    return BT_ERR_UNSUPPORTED;
}

static bt_status_t load_normalizer(bt_tokenizer_t *t, const cJSON *n, char *err, size_t errlen)
{
    if (!n || cJSON_IsNull(n)) return BT_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(ty, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
        {
            bt_status_t st = load_normalizer(t, it, err, errlen);
            if (st != BT_OK) return st;
        }
        return BT_OK;
    }
    int kind = !strcmp(ty, "NFC") ? NORM_NFC : !strcmp(ty, "NFD") ? NORM_NFD
             : !strcmp(ty, "NFKC") ? NORM_NFKC : !strcmp(ty, "NFKD") ? NORM_NFKD : 0;
    if (!kind || t->n_norm == 4) {
        snprintf(err, errlen, "tokenizer.json: normalizer %s is not supported", ty);
        return BT_ERR_UNSUPPORTED;
    }
    t->norm[t->n_norm++] = kind;
    return BT_OK;
}

static int32_t config_token_id(const bt_tokenizer_t *t, const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return bt_tokenizer_token_to_id(t, v->valuestring);
}

static int32_t trie_new_node(bt_tokenizer_t *t, uint8_t c)
{
    t->nodes = bt_realloc_or_die(t->nodes, (size_t)(t->n_nodes + 1) * sizeof *t->nodes);
    t->nodes[t->n_nodes] = (trie_node_t){-1, -1, -1, c};
    return t->n_nodes++;
}

static void trie_add(bt_tokenizer_t *t, const char *s, int32_t id)
{
    size_t n = strlen(s);
    if (!n) return;
    uint8_t c0 = (uint8_t)s[0];
    if (t->root.child[c0] < 0) t->root.child[c0] = trie_new_node(t, c0);
    int32_t node = t->root.child[c0];
    for (size_t i = 1; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t ch = t->nodes[node].first_child;
        while (ch >= 0 && t->nodes[ch].byte != c) ch = t->nodes[ch].next_sibling;
        if (ch < 0) {
            ch = trie_new_node(t, c);
            t->nodes[ch].next_sibling = t->nodes[node].first_child;
            t->nodes[node].first_child = ch;
        }
        node = ch;
    }
    t->nodes[node].token = id;
    t->have_added = true;
}

bt_status_t bt_tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                                   size_t config_len, bt_tokenizer_t **tok_p, char *err,
                                   size_t errlen)
{
    bt_status_t st = BT_OK;
    cJSON *root = NULL, *cfg = NULL;
    bt_tokenizer_t *t = bt_calloc_or_die(1, sizeof *t);
    for (int i = 0; i < 256; i++) t->root.child[i] = -1;
    t->bos = t->eos = t->pad = -1;

    root = cJSON_ParseWithLength(tokenizer_json, len);
    if (!root) FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: invalid JSON");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model)) FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: no model");
    if (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE")))
        FAIL(BT_ERR_UNSUPPORTED, "tokenizer.json: model type %s is not supported (BPE only)",
             cJSON_IsString(mtype) ? mtype->valuestring : "?");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        FAIL(BT_ERR_UNSUPPORTED, "tokenizer.json: BPE options byte_fallback / ignore_merges / "
                                 "subword prefix or suffix are not supported");
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(decoder, "type");
    if (!cJSON_IsString(dtype) || strcmp(dtype->valuestring, "ByteLevel"))
        FAIL(BT_ERR_UNSUPPORTED, "tokenizer.json: decoder must be ByteLevel");

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: model.vocab missing");
    int64_t max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e8)
            FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: bad id for vocab entry \"%s\"", it->string);
        if ((int64_t)it->valuedouble > max_id) max_id = (int64_t)it->valuedouble;
    }
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8 ||
            !cJSON_IsString(content))
            FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: bad added_tokens entry");
        if ((int64_t)id->valuedouble > max_id) max_id = (int64_t)id->valuedouble;
    }
    if (max_id < 0) FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: empty vocabulary");
    t->n_ids = (int)(max_id + 1);
    t->tok_str = bt_calloc_or_die((size_t)t->n_ids, sizeof *t->tok_str);
    t->tok_bytes = bt_calloc_or_die((size_t)t->n_ids, sizeof *t->tok_bytes);
    t->tok_len = bt_calloc_or_die((size_t)t->n_ids, sizeof *t->tok_len);
    t->special = bt_calloc_or_die((size_t)t->n_ids, 1);
    cJSON_ArrayForEach(it, vocab)
    {
        int id = (int)it->valuedouble;
        free(t->tok_str[id]);
        t->tok_str[id] = bt_strdup_or_die(it->string);
    }
    cJSON_ArrayForEach(it, added)
    {
        int id = (int)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        if (!t->tok_str[id] || strcmp(t->tok_str[id], content)) {
            free(t->tok_str[id]);
            t->tok_str[id] = bt_strdup_or_die(content);
        }
        t->special[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
    }
    smap_init(&t->vocab, (size_t)t->n_ids);
    for (int id = 0; id < t->n_ids; id++) {
        if (!t->tok_str[id]) continue;
        token_bytes(t->tok_str[id], &t->tok_bytes[id], &t->tok_len[id]);
        smap_slot_t *s = smap_put(&t->vocab, t->tok_str[id], strlen(t->tok_str[id]));
        s->val = id; /* a later id wins, as in the tokenizers library's added vocabulary */
    }
    cJSON_ArrayForEach(it, added) trie_add(t, cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring,
                                          (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble);

    const uint32_t *b2c = byte_to_cp();
    for (int b = 0; b < 256; b++) {
        bt__buf_t tmp = {0};
        bt__utf8_put(&tmp, b2c[b]);
        t->byte_id[b] = smap_get(&t->vocab, tmp.data, tmp.len);
        bt__buf_free(&tmp);
    }

    /* merges */
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int n_merges = cJSON_GetArraySize(merges);
    size_t mcap = 16;
    while (mcap < (size_t)n_merges * 2 + 2) mcap *= 2;
    t->merges = bt_calloc_or_die(mcap, sizeof *t->merges);
    t->merge_mask = mcap - 1;
    int rank = 0;
    bt__buf_t joined = {0};
    cJSON_ArrayForEach(it, merges)
    {
        const char *a, *b;
        size_t la, lb;
        char *sp = NULL;
        if (cJSON_IsString(it)) {
            sp = strchr(it->valuestring, ' ');
            if (!sp || sp == it->valuestring) {
                bt__buf_free(&joined);
                FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: merge %d \"%s\" is not \"a b\"", rank,
                     it->valuestring);
            }
            a = it->valuestring;
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            bt__buf_free(&joined);
            FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: merge %d malformed", rank);
        }
        int32_t ia = smap_get(&t->vocab, a, la), ib = smap_get(&t->vocab, b, lb);
        joined.len = 0;
        bt__buf_append(&joined, a, la);
        bt__buf_append(&joined, b, lb);
        int32_t ic = smap_get(&t->vocab, joined.data, joined.len);
        if (ia < 0 || ib < 0 || ic < 0) {
            bt__buf_free(&joined);
            FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer.json: merge %d refers to a token not in the vocabulary",
                 rank);
        }
        uint64_t k = merge_key(ia, ib);
        size_t i = merge_hash(k, t->merge_mask);
        while (t->merges[i].key && t->merges[i].key != k) i = (i + 1) & t->merge_mask;
        if (!t->merges[i].key) { /* the first (best) rank of a duplicate pair wins */
            t->merges[i].key = k;
            t->merges[i].rank = rank;
            t->merges[i].result = ic;
        }
        rank++;
    }
    bt__buf_free(&joined);

    st = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen);
    if (st != BT_OK) goto fail;
    st = load_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen);
    if (st != BT_OK) goto fail;

    if (config_json) {
        cfg = cJSON_ParseWithLength(config_json, config_len);
        if (!cfg) FAIL(BT_ERR_BAD_TOKENIZER, "tokenizer_config.json: invalid JSON");
        t->bos = config_token_id(t, cfg, "bos_token");
        t->eos = config_token_id(t, cfg, "eos_token");
        t->pad = config_token_id(t, cfg, "pad_token");
        t->add_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"));
    }
    if (t->bos < 0) t->bos = bt_tokenizer_token_to_id(t, "<｜begin▁of▁sentence｜>");
    if (t->eos < 0) t->eos = bt_tokenizer_token_to_id(t, "<｜end▁of▁sentence｜>");

    cJSON_Delete(root);
    cJSON_Delete(cfg);
    *tok_p = t;
    return BT_OK;
fail:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    bt_tokenizer_destroy(t);
    return st;
}

bt_status_t bt_tokenizer_load(const char *dir, bt_tokenizer_t **tok_p, char *err, size_t errlen)
{
    char path[4096];
    char *tj = NULL, *cj = NULL;
    size_t tl = 0, cl = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    bt_status_t st = bt_read_file(path, MAX_TOKENIZER_JSON, &tj, &tl, err, errlen);
    if (st != BT_OK) return st;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char cerr[256];
    if (bt_read_file(path, MAX_CONFIG_JSON, &cj, &cl, cerr, sizeof cerr) != BT_OK) cj = NULL;
    st = bt_tokenizer_load_json(tj, tl, cj, cl, tok_p, err, errlen);
    free(tj);
    free(cj);
    return st;
}

void bt_tokenizer_destroy(bt_tokenizer_t *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_ids; i++) {
        if (t->tok_str) free(t->tok_str[i]);
        if (t->tok_bytes) free(t->tok_bytes[i]);
    }
    free(t->tok_str);
    free(t->tok_bytes);
    free(t->tok_len);
    free(t->special);
    smap_free(&t->vocab);
    free(t->merges);
    free(t->nodes);
    for (int i = 0; i < t->n_splits; i++) pcre2_code_free(t->splits[i].re);
    free(t);
}

int bt_tokenizer_vocab_size(const bt_tokenizer_t *t)
{
    return t->n_ids;
}

int32_t bt_tokenizer_bos_id(const bt_tokenizer_t *t) { return t->bos; }
int32_t bt_tokenizer_eos_id(const bt_tokenizer_t *t) { return t->eos; }
int32_t bt_tokenizer_pad_id(const bt_tokenizer_t *t) { return t->pad; }
bool bt_tokenizer_add_bos(const bt_tokenizer_t *t) { return t->add_bos; }

int32_t bt_tokenizer_token_to_id(const bt_tokenizer_t *t, const char *token)
{
    return smap_get(&t->vocab, token, strlen(token));
}

const char *bt_tokenizer_id_to_token(const bt_tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->n_ids) return NULL;
    return t->tok_str[id];
}

bool bt_tokenizer_is_special(const bt_tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *bt_tokenizer_id_bytes(const bt_tokenizer_t *t, int32_t id, size_t *len_p)
{
    if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) return NULL;
    if (len_p) *len_p = t->tok_len[id];
    return (const char *)t->tok_bytes[id];
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct {
    const bt_tokenizer_t *tok;
    pcre2_match_data *md;
    int32_t *ids;
    size_t n, cap;
    /* scratch for the heap BPE */
    int32_t *sym, *prev, *next;
    struct heap_ent *heap;
    size_t scratch_cap;
} enc_t;

typedef struct heap_ent {
    int32_t rank, pos, left, right; /* left/right ids at push time */
} heap_ent_t;

static inline void push_id(enc_t *e, int32_t id)
{
    if (e->n == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 256;
        e->ids = bt_realloc_or_die(e->ids, e->cap * sizeof *e->ids);
    }
    e->ids[e->n++] = id;
}

static inline bool heap_less(const heap_ent_t *a, const heap_ent_t *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_ent_t *h, size_t *n, heap_ent_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static heap_ent_t heap_pop(heap_ent_t *h, size_t *n)
{
    heap_ent_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* BPE over one pre-token of n bytes (n > SHORT_WORD): priority queue of candidate merges
 * ordered by (rank, position), stale entries skipped, as the tokenizers library does. */
static void bpe_long(enc_t *e, const uint8_t *s, size_t n)
{
    const bt_tokenizer_t *t = e->tok;
    if (n > e->scratch_cap) {
        e->scratch_cap = n;
        e->sym = bt_realloc_or_die(e->sym, n * sizeof *e->sym);
        e->prev = bt_realloc_or_die(e->prev, n * sizeof *e->prev);
        e->next = bt_realloc_or_die(e->next, n * sizeof *e->next);
        e->heap = bt_realloc_or_die(e->heap, n * 2 * sizeof *e->heap);
    }
    int32_t *sym = e->sym, *prev = e->prev, *next = e->next;
    heap_ent_t *heap = e->heap;
    size_t m = 0, hn = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) continue; /* byte missing from the alphabet: dropped */
        sym[m] = id;
        prev[m] = (int32_t)m - 1;
        next[m] = (int32_t)m + 1;
        m++;
    }
    if (!m) return;
    next[m - 1] = -1;
    int32_t res = -1; /* set by merge_lookup; -1 quiets -O2 maybe-uninitialized */
    for (size_t i = 0; i + 1 < m; i++) {
        int r = merge_lookup(t, sym[i], sym[i + 1], &res);
        if (r >= 0) heap_push(heap, &hn, (heap_ent_t){r, (int32_t)i, sym[i], sym[i + 1]});
    }
    while (hn) {
        heap_ent_t h = heap_pop(heap, &hn);
        int32_t p = h.pos, q = next[p];
        if (sym[p] != h.left || q < 0 || sym[q] != h.right) continue; /* stale */
        merge_lookup(t, sym[p], sym[q], &res);
        sym[p] = res;
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (hn + 2 > n * 2) continue; /* cannot happen: at most one live entry per pair */
        if (prev[p] >= 0) {
            int32_t a = prev[p];
            int r = merge_lookup(t, sym[a], sym[p], &res);
            if (r >= 0) heap_push(heap, &hn, (heap_ent_t){r, a, sym[a], sym[p]});
        }
        if (next[p] >= 0) {
            int32_t b = next[p];
            int r = merge_lookup(t, sym[p], sym[b], &res);
            if (r >= 0) heap_push(heap, &hn, (heap_ent_t){r, p, sym[p], sym[b]});
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) push_id(e, sym[i]);
}

static void bpe(enc_t *e, const uint8_t *s, size_t n)
{
    const bt_tokenizer_t *t = e->tok;
    if (n > SHORT_WORD) {
        bpe_long(e, s, n);
        return;
    }
    int32_t sym[SHORT_WORD], rk[SHORT_WORD], rs[SHORT_WORD];
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) sym[m++] = id;
    }
    if (m == 0) return;
    for (size_t i = 0; i + 1 < m; i++) rk[i] = merge_lookup(t, sym[i], sym[i + 1], &rs[i]);
    while (m > 1) {
        size_t best = SIZE_MAX;
        int32_t br = INT32_MAX;
        for (size_t i = 0; i + 1 < m; i++)
            if (rk[i] >= 0 && rk[i] < br) br = rk[i], best = i;
        if (best == SIZE_MAX) break;
        sym[best] = rs[best];
        memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        memmove(rk + best, rk + best + 1, (m - best - 2) * sizeof *rk);
        memmove(rs + best, rs + best + 1, (m - best - 2) * sizeof *rs);
        m--;
        if (best > 0) rk[best - 1] = merge_lookup(t, sym[best - 1], sym[best], &rs[best - 1]);
        if (best + 1 < m) rk[best] = merge_lookup(t, sym[best], sym[best + 1], &rs[best]);
    }
    for (size_t i = 0; i < m; i++) push_id(e, sym[i]);
}

static int run_match(const split_t *sp, const uint8_t *s, size_t n, size_t off, pcre2_match_data *md)
{
    int rc;
    if (sp->jit) {
        rc = pcre2_jit_match(sp->re, s, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
    }
    return pcre2_match(sp->re, s, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
}

/* Applies pre-tokenizer split `level` to s[0..n) and passes each piece on. */
static void pretokenize(enc_t *e, int level, const uint8_t *s, size_t n)
{
    if (n == 0) return;
    if (level == e->tok->n_splits) {
        bpe(e, s, n);
        return;
    }
    const split_t *sp = &e->tok->splits[level];
    size_t pos = 0, off = 0;
    while (off <= n) {
        int rc = run_match(sp, s, n, off, e->md);
        if (rc < 0) break; /* no match (or a matcher error: the rest is one piece) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character */
            if (ms >= n) break;
            off = ms + 1;
            while (off < n && (s[off] & 0xC0) == 0x80) off++;
            continue;
        }
        pretokenize(e, level + 1, s + pos, ms - pos);
        if (sp->behavior == SPLIT_ISOLATED) pretokenize(e, level + 1, s + ms, me - ms);
        pos = off = me;
    }
    pretokenize(e, level + 1, s + pos, n - pos);
}

static void encode_segment(enc_t *e, const uint8_t *s, size_t n)
{
    const bt_tokenizer_t *t = e->tok;
    if (n == 0) return;
    if (!t->n_norm) {
        pretokenize(e, 0, s, n);
        return;
    }
    uint8_t *cur = NULL;
    const uint8_t *in = s;
    utf8proc_ssize_t len = (utf8proc_ssize_t)n;
    for (int i = 0; i < t->n_norm; i++) {
        int opt = UTF8PROC_STABLE;
        switch (t->norm[i]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *out = NULL;
        utf8proc_ssize_t r = utf8proc_map(in, len, &out, (utf8proc_option_t)opt);
        if (r < 0) break; /* cannot happen on valid UTF-8; keep what we have */
        free(cur);
        cur = out;
        in = out;
        len = r;
    }
    pretokenize(e, 0, in, (size_t)len);
    free(cur);
}

bt_status_t bt_tokenizer_encode(const bt_tokenizer_t *t, const char *text, size_t len,
                                unsigned flags, int32_t **ids_p, size_t *n_p)
{
    if (!t || (!text && len) || !ids_p || !n_p) return BT_ERR_INVALID_ARG;
    enc_t e = {.tok = t};
    bt__buf_t fixed = {0};
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    if (!bt__utf8_valid((const char *)s, len)) {
        bt__utf8_lossy(&fixed, s, len, true);
        s = (const uint8_t *)fixed.data;
        len = fixed.len;
    }
    e.md = pcre2_match_data_create(1, NULL);
    if (!e.md) {
        bt__buf_free(&fixed);
        return BT_ERR_NO_MEMORY;
    }
    e.cap = len / 3 + 16;
    e.ids = bt_malloc_or_die(e.cap * sizeof *e.ids);
    if ((flags & BT_TOKENIZER_ADD_BOS) && t->bos >= 0) push_id(&e, t->bos);

    size_t seg = 0, i = 0;
    bool added = t->have_added && !(flags & BT_TOKENIZER_NO_ADDED_TOKENS);
    while (added && i < len) {
        int32_t node = t->root.child[s[i]];
        if (node < 0) {
            i++;
            continue;
        }
        /* leftmost-longest match of an added token at i */
        int32_t best_id = -1;
        size_t best_len = 0, j = i;
        while (node >= 0) {
            if (t->nodes[node].token >= 0) best_id = t->nodes[node].token, best_len = j + 1 - i;
            if (++j >= len) break;
            int32_t c = t->nodes[node].first_child;
            while (c >= 0 && t->nodes[c].byte != s[j]) c = t->nodes[c].next_sibling;
            node = c;
        }
        if (best_id < 0) {
            i++;
            continue;
        }
        encode_segment(&e, s + seg, i - seg);
        push_id(&e, best_id);
        i += best_len;
        seg = i;
    }
    encode_segment(&e, s + seg, len - seg);

    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    bt__buf_free(&fixed);
    *ids_p = e.ids;
    *n_p = e.n;
    return BT_OK;
}

/* ---- decoding ---------------------------------------------------------------------------- */

bt_status_t bt_tokenizer_decode(const bt_tokenizer_t *t, const int32_t *ids, size_t n,
                                bool skip_special, char **text_p, size_t *len_p)
{
    if (!t || (!ids && n) || !text_p) return BT_ERR_INVALID_ARG;
    bt__buf_t raw = {0}, out = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) {
            bt__buf_free(&raw);
            return BT_ERR_INVALID_ARG;
        }
        if (skip_special && t->special[id]) continue;
        bt__buf_append(&raw, t->tok_bytes[id], t->tok_len[id]);
    }
    bt__utf8_lossy(&out, (const uint8_t *)(raw.data ? raw.data : ""), raw.len, true);
    bt__buf_free(&raw);
    *text_p = bt__buf_take(&out, len_p);
    return BT_OK;
}

/* ---- streaming detokenizer --------------------------------------------------------------- */

struct bt_detok {
    const bt_tokenizer_t *tok;
    bool skip_special;
    bt__buf_t pending; /* bytes of an unfinished character (at most 3) plus new bytes */
    bt__buf_t out;
};

bt_status_t bt_detok_create(const bt_tokenizer_t *tok, bool skip_special, bt_detok_t **d_p)
{
    if (!tok || !d_p) return BT_ERR_INVALID_ARG;
    bt_detok_t *d = bt_calloc_or_die(1, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
    *d_p = d;
    return BT_OK;
}

void bt_detok_destroy(bt_detok_t *d)
{
    if (!d) return;
    bt__buf_free(&d->pending);
    bt__buf_free(&d->out);
    free(d);
}

static void detok_drain(bt_detok_t *d, bool final, const char **out_p, size_t *out_len_p)
{
    d->out.len = 0;
    bt__buf_reserve(&d->out, 0);
    d->out.data[0] = '\0';
    size_t used = bt__utf8_lossy(&d->out, (const uint8_t *)(d->pending.data ? d->pending.data : ""),
                                 d->pending.len, final);
    memmove(d->pending.data, d->pending.data + used, d->pending.len - used);
    d->pending.len -= used;
    if (d->pending.data) d->pending.data[d->pending.len] = '\0';
    *out_p = d->out.data;
    *out_len_p = d->out.len;
}

bt_status_t bt_detok_push(bt_detok_t *d, const int32_t *ids, size_t n, const char **out_p,
                          size_t *out_len_p)
{
    if (!d || (!ids && n) || !out_p || !out_len_p) return BT_ERR_INVALID_ARG;
    const bt_tokenizer_t *t = d->tok;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->tok_bytes[ids[i]]) return BT_ERR_INVALID_ARG;
    bt__buf_reserve(&d->pending, 0);
    for (size_t i = 0; i < n; i++) {
        if (d->skip_special && t->special[ids[i]]) continue;
        bt__buf_append(&d->pending, t->tok_bytes[ids[i]], t->tok_len[ids[i]]);
    }
    detok_drain(d, false, out_p, out_len_p);
    return BT_OK;
}

bt_status_t bt_detok_finish(bt_detok_t *d, const char **out_p, size_t *out_len_p)
{
    if (!d || !out_p || !out_len_p) return BT_ERR_INVALID_ARG;
    bt__buf_reserve(&d->pending, 0);
    detok_drain(d, true, out_p, out_len_p);
    return BT_OK;
}

/* ---- engram token map -------------------------------------------------------------------- */

static bool is_white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* NFKC, NFD, strip accents (marks), lowercase, [ \t\r\n]+ -> " ", "^ $" -> U+E000, strip,
 * U+E000 -> " ": the reference's normalizer sequence. */
static void engram_normalize(const char *text, size_t len, bt__buf_t *out)
{
    utf8proc_uint8_t *a = NULL, *b = NULL;
    utf8proc_ssize_t la = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &a,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (la < 0) goto done;
    utf8proc_ssize_t lb = utf8proc_map(a, la, &b, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    if (lb < 0) goto done;
    /* strip marks + lowercase + collapse, into a code point list */
    uint32_t *cps = bt_malloc_or_die(((size_t)lb + 1) * sizeof *cps);
    size_t n = 0;
    bool in_ws = false;
    for (utf8proc_ssize_t i = 0; i < lb;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(b + i, lb - i, &cp);
        if (k <= 0) break;
        i += k;
        utf8proc_category_t cat = utf8proc_category(cp);
        if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME)
            continue;
        cp = utf8proc_tolower(cp);
        bool ws = cp == ' ' || cp == '\t' || cp == '\r' || cp == '\n';
        if (ws) {
            if (!in_ws) cps[n++] = ' ';
            in_ws = true;
            continue;
        }
        in_ws = false;
        cps[n++] = (uint32_t)cp;
    }
    if (n == 1 && cps[0] == ' ') cps[0] = 0xE000;
    size_t lo = 0, hi = n;
    while (lo < hi && is_white_space(cps[lo])) lo++;
    while (hi > lo && is_white_space(cps[hi - 1])) hi--;
    for (size_t i = lo; i < hi; i++) bt__utf8_put(out, cps[i] == 0xE000 ? ' ' : cps[i]);
    free(cps);
done:
    free(a);
    free(b);
}

bt_status_t bt_tokenizer_engram_token_map(const bt_tokenizer_t *t, int32_t **map_p,
                                          int *n_classes_p)
{
    if (!t || !map_p || !n_classes_p) return BT_ERR_INVALID_ARG;
    int32_t *map = bt_malloc_or_die((size_t)t->n_ids * sizeof *map);
    char **keys = bt_calloc_or_die((size_t)t->n_ids, sizeof *keys);
    smap_t classes;
    smap_init(&classes, (size_t)t->n_ids);
    int n_classes = 0;
    for (int id = 0; id < t->n_ids; id++) {
        bt__buf_t text = {0}, norm = {0};
        const char *key;
        size_t klen;
        if (t->tok_bytes[id])
            bt__utf8_lossy(&text, t->tok_bytes[id], t->tok_len[id], true);
        bt__buf_reserve(&text, 0);
        if (strstr(text.data, "\xEF\xBF\xBD")) {
            key = t->tok_str[id];
            klen = strlen(key);
        } else {
            engram_normalize(text.data, text.len, &norm);
            bool use_norm = norm.len > 0;
            key = use_norm ? norm.data : text.data;
            klen = use_norm ? norm.len : text.len;
        }
        char *owned = bt_malloc_or_die(klen + 1);
        memcpy(owned, key, klen);
        owned[klen] = '\0';
        keys[id] = owned;
        bt__buf_free(&text);
        bt__buf_free(&norm);
        smap_slot_t *s = smap_put(&classes, owned, klen);
        if (s->val < 0) s->val = n_classes++;
        map[id] = s->val;
    }
    smap_free(&classes);
    for (int id = 0; id < t->n_ids; id++) free(keys[id]);
    free(keys);
    *map_p = map;
    *n_classes_p = n_classes;
    return BT_OK;
}

bt_status_t bt_tokenizer_engram_token_map_for(const bt_tokenizer_t *t, int vocab, int32_t **map_p,
                                              int *n_classes_p)
{
    if (!t || vocab < 1 || !map_p || !n_classes_p) return BT_ERR_INVALID_ARG;
    int32_t *map;
    int n_classes;
    bt_status_t st = bt_tokenizer_engram_token_map(t, &map, &n_classes);
    if (st != BT_OK) return st;
    map = bt_realloc_or_die(map, (size_t)vocab * sizeof *map);
    for (int id = t->n_ids; id < vocab; id++) map[id] = n_classes - 1;
    *map_p = map;
    *n_classes_p = n_classes;
    return BT_OK;
}

bt_status_t bt_tokenizer_for_model(const char *dir, int vocab, bool want_map, int32_t **map_p,
                                   int *n_classes_p, int *emit_vocab_p, char *err, size_t errlen)
{
    if (!dir || vocab < 1 || (want_map && (!map_p || !n_classes_p))) {
        snprintf(err, errlen, "bt_tokenizer_for_model: bad arguments");
        return BT_ERR_INVALID_ARG;
    }
    if (emit_vocab_p) *emit_vocab_p = vocab;
    if (want_map) *map_p = NULL, *n_classes_p = 0;
    if (!want_map && !emit_vocab_p) return BT_OK; /* nothing asked */
    bt_tokenizer_t *t = NULL;
    char terr[512];
    bt_status_t st = bt_tokenizer_load(dir, &t, terr, sizeof terr);
    if (st != BT_OK) {
        /* no tokenizer.json (only that: a broken one is an error) */
        if (!want_map && st == BT_ERR_NOT_FOUND) return BT_OK; /* every id, nothing to map */
        snprintf(err, errlen, "%s%s", want_map ? "the engram layers need the tokenizer: " : "", terr);
        return st;
    }
    if (emit_vocab_p && t->n_ids < vocab) *emit_vocab_p = t->n_ids;
    if (want_map) st = bt_tokenizer_engram_token_map_for(t, vocab, map_p, n_classes_p);
    bt_tokenizer_destroy(t);
    if (st != BT_OK) snprintf(err, errlen, "the engram token map: %s", bt_status_str(st));
    return st;
}

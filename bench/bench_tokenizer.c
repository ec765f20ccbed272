/* Tokenizer throughput on a large DeepSeek-style vocabulary.
 *
 *   build/bin/bench_tokenizer [--mb 8] [--words 60000] [--golden DIR]
 *
 * DeepSeek's real tokenizer.json cannot be downloaded here, so this builds one: the
 * pre-tokenizer, decoder and special tokens of DeepSeek-V3/V4 (the same Split regexes as
 * ../shared/golden/tokenizer) with a synthetic byte-level BPE vocabulary of ~128k ids. The
 * merges are generated train-free from a made-up lexicon (real English words plus
 * pronounceable pseudo-words, with and without the leading-space marker and capitalised):
 * every prefix of every lexicon word becomes a token, built by one merge from the
 * previous prefix and the next character, ranked by prefix length. Then English-like
 * prose is generated (Zipf-distributed words from the lexicon and 8% out-of-lexicon
 * words, punctuation, numbers, paragraphs) and encoded on one thread. Decode and the
 * streaming detokenizer are timed too. With --golden DIR the real small golden tokenizer
 * is timed on the same text as well. */
#include "common/alloc.h"
#include "common/text/text_internal.h"
#include "common/text/tokenizer.h"

#include "bench/bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static const char *COMMON[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people",
    "about", "into", "than", "them", "some", "could", "only", "other", "new", "also", "over",
    "after", "first", "two", "like", "years", "these", "what", "may", "then", "its", "our",
    "most", "any", "state", "world", "system", "between", "under", "through", "during", "model",
    "government", "because", "number", "however", "water", "city", "without", "language",
    "history", "example", "general", "research", "important", "different", "following"};

static const char *SYL[] = {"ka", "ro", "ten", "mi", "sa", "lo", "ver", "an", "tion", "pre", "de",
                            "ing", "ble", "con", "ly", "ment", "per", "ex", "al", "or", "is", "un",
                            "ter", "ra", "po", "li", "ne", "ca", "ti", "mo", "es", "ed", "in",
                            "re", "st", "qu", "ph", "th", "ch", "sh", "ous", "ist", "ure", "age"};

static char *make_word(void)
{
    char w[64] = "";
    int ns = 1 + (int)(rnd() % 4);
    for (int i = 0; i < ns; i++) strcat(w, SYL[rnd() % (sizeof SYL / sizeof SYL[0])]);
    return bt_strdup_or_die(w);
}

/* ByteLevel form of a string (bytes -> alphabet code points) */
static void bytelevel(bt__buf_t *out, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int b = *p;
        bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        uint32_t cp;
        if (direct) {
            cp = (uint32_t)b;
        } else {
            int n = 0;
            for (int c = 0; c < b; c++) {
                bool d2 = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
                if (!d2) n++;
            }
            cp = 256 + (uint32_t)n;
        }
        bt__utf8_put(out, cp);
    }
}

typedef struct {
    char **s;
    size_t n, cap;
} strs_t;

static void strs_push(strs_t *v, char *s)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 1024;
        v->s = bt_realloc_or_die(v->s, v->cap * sizeof *v->s);
    }
    v->s[v->n++] = s;
}

/* crude string set for dedup */
typedef struct {
    char **slot;
    size_t cap;
} set_t;

static uint64_t h64(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool set_add(set_t *st, const char *s)
{
    size_t i = h64(s) & (st->cap - 1);
    while (st->slot[i]) {
        if (!strcmp(st->slot[i], s)) return false;
        i = (i + 1) & (st->cap - 1);
    }
    st->slot[i] = (char *)s;
    return true;
}

int main(int argc, char **argv)
{
    double mb = 8;
    int n_words = 60000;
    const char *golden = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--words") && i + 1 < argc) n_words = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--golden") && i + 1 < argc) golden = argv[++i];
        else {
            fprintf(stderr, "usage: bench_tokenizer [--mb N] [--words N] [--golden DIR]\n");
            return 2;
        }
    }
    /* lexicon */
    strs_t lex = {0};
    for (size_t i = 0; i < sizeof COMMON / sizeof COMMON[0]; i++) strs_push(&lex, bt_strdup_or_die(COMMON[i]));
    while (lex.n < (size_t)n_words) strs_push(&lex, make_word());

    /* tokens: the byte alphabet, then merges learned train-free: each lexicon word (forms
     * " word", "word", " Word"; common words first) is run through BPE with the merges so far
     * and, while it is not one token, a merge of its first two tokens is appended (lowest
     * priority), so every merge is one that BPE really reaches. */
    set_t seen = {bt_calloc_or_die(1 << 20, sizeof(char *)), 1 << 20};
    int32_t *seen_id = bt_calloc_or_die(1 << 20, sizeof *seen_id);
    strs_t toks = {0}, merges = {0};
    size_t pcap = 1 << 19;
    uint64_t *pkey = bt_calloc_or_die(pcap, sizeof *pkey);
    int32_t *pres = bt_calloc_or_die(pcap, sizeof *pres), *prank = bt_calloc_or_die(pcap, sizeof *prank);
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++) {
        char s1[2] = {(char)b, 0};
        bt__buf_t t = {0};
        bytelevel(&t, s1);
        char *tk = bt__buf_take(&t, NULL);
        set_add(&seen, tk);
        byte_tok[b] = (int32_t)toks.n;
        strs_push(&toks, tk);
    }
    for (size_t w = 0; w < lex.n && merges.n < 128000; w++) {
        for (int form = 0; form < 3; form++) {
            char word[80];
            snprintf(word, sizeof word, "%s%s", form == 1 ? "" : " ", lex.s[w]);
            if (form == 2 && word[1] >= 'a' && word[1] <= 'z') word[1] = (char)(word[1] - 32);
            int32_t sym[80];
            int m = 0;
            for (const char *c = word; *c; c++) sym[m++] = byte_tok[(uint8_t)*c];
            for (;;) {
                /* BPE with the current merges */
                for (;;) {
                    int best = -1;
                    int32_t br = INT32_MAX, bres = -1;
                    for (int i = 0; i + 1 < m; i++) {
                        uint64_t k = ((uint64_t)(uint32_t)sym[i] << 32 | (uint32_t)sym[i + 1]) + 1;
                        size_t h = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 40) & (pcap - 1);
                        while (pkey[h] && pkey[h] != k) h = (h + 1) & (pcap - 1);
                        if (pkey[h] && prank[h] < br) br = prank[h], best = i, bres = pres[h];
                    }
                    if (best < 0) break;
                    sym[best] = bres;
                    memmove(sym + best + 1, sym + best + 2, (size_t)(m - best - 2) * sizeof *sym);
                    m--;
                }
                if (m <= 1) break;
                /* new merge of the first two tokens */
                bt__buf_t t = {0}, mm = {0};
                bt__buf_puts(&t, toks.s[sym[0]]);
                bt__buf_puts(&t, toks.s[sym[1]]);
                char *tk = bt__buf_take(&t, NULL);
                int32_t id;
                size_t hi = h64(tk) & (seen.cap - 1);
                while (seen.slot[hi] && strcmp(seen.slot[hi], tk)) hi = (hi + 1) & (seen.cap - 1);
                if (seen.slot[hi]) {
                    free(tk);
                    id = seen_id[hi];
                    tk = toks.s[id];
                } else {
                    seen.slot[hi] = tk;
                    id = (int32_t)toks.n;
                    seen_id[hi] = id;
                    strs_push(&toks, tk);
                }
                uint64_t k = ((uint64_t)(uint32_t)sym[0] << 32 | (uint32_t)sym[1]) + 1;
                size_t h = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 40) & (pcap - 1);
                while (pkey[h] && pkey[h] != k) h = (h + 1) & (pcap - 1);
                pkey[h] = k;
                pres[h] = id;
                prank[h] = (int32_t)merges.n;
                bt__buf_puts(&mm, toks.s[sym[0]]);
                bt__buf_putc(&mm, ' ');
                bt__buf_puts(&mm, toks.s[sym[1]]);
                strs_push(&merges, bt__buf_take(&mm, NULL));
            }
        }
    }
    free(pkey);
    free(pres);
    free(prank);
    free(seen_id);
    /* tokenizer.json */
    bt__buf_t j = {0};
    bt__buf_puts(&j, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[");
    const char *specials[] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"};
    size_t base = 3, V = base + toks.n;
    for (int i = 0; i < 3; i++)
        bt__buf_printf(&j, "%s{\"id\":%d,\"content\":\"%s\",\"special\":true,\"normalized\":false}",
                       i ? "," : "", i, specials[i]);
    const char *added[] = {"<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<think>", "</think>", "｜DSML｜"};
    for (int i = 0; i < 6; i++)
        bt__buf_printf(&j, ",{\"id\":%zu,\"content\":\"%s\",\"special\":%s,\"normalized\":false}", V + (size_t)i,
                       added[i], i < 3 ? "true" : "false");
    bt__buf_puts(&j,
                 "],\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[]},\"pre_tokenizer\":{\"type\":"
                 "\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},"
                 "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                 "\"[一-龥぀-ゟ゠-ヿ]+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Split\","
                 "\"pattern\":{\"Regex\":\"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|"
                 "[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|"
                 "\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                 "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},"
                 "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
                 "\"trim_offsets\":true,\"use_regex\":true},\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                 "\"unk_token\":null,\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,"
                 "\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    for (int i = 0; i < 3; i++) bt__buf_printf(&j, "%s\"%s\":%d", i ? "," : "", specials[i], i);
    for (size_t i = 0; i < toks.n; i++) {
        bt__buf_putc(&j, ',');
        bt__json_dump_string(&j, toks.s[i]);
        bt__buf_printf(&j, ":%zu", base + i);
    }
    bt__buf_puts(&j, "},\"merges\":[");
    for (size_t i = 0; i < merges.n; i++) {
        if (i) bt__buf_putc(&j, ',');
        bt__json_dump_string(&j, merges.s[i]);
    }
    bt__buf_puts(&j, "]}}");

    char dir[] = "/tmp/bt_bench_tok_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    fwrite(j.data, 1, j.len, f);
    fclose(f);
    printf("synthetic tokenizer.json: %zu ids (%zu merges), %.1f MB\n", V + 6, merges.n, j.len / 1e6);

    char err[256];
    bt_tokenizer_t *tok;
    double t0 = now();
    if (bt_tokenizer_load(dir, &tok, err, sizeof err) != BT_OK) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    printf("load: %.2f s\n", now() - t0);
    unlink(path);
    rmdir(dir);

    /* prose */
    bt__buf_t text = {0};
    size_t target = (size_t)(mb * 1e6);
    double *cum = bt_malloc_or_die(lex.n * sizeof *cum), zs = 0;
    for (size_t i = 0; i < lex.n; i++) cum[i] = (zs += 1.0 / (double)(i + 1));
    const char *punct[] = {".", ",", ";", ":", "?", "!"};
    int sent = 0;
    while (text.len < target) {
        int words = 5 + (int)(rnd() % 20);
        for (int k = 0; k < words; k++) {
            if (k) bt__buf_putc(&text, ' ');
            if (rnd() % 100 < 8) { /* out-of-lexicon word */
                char *w = make_word();
                bt__buf_puts(&text, w);
                bt__buf_puts(&text, SYL[rnd() % 40]);
                free(w);
            } else if (rnd() % 100 < 3) {
                bt__buf_printf(&text, "%u", rnd() % 100000);
            } else {
                double u = (rnd() / 4294967296.0) * zs;
                size_t lo = 0, hi = lex.n - 1;
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (cum[mid] < u) lo = mid + 1;
                    else hi = mid;
                }
                size_t w = lo;
                char word[80];
                snprintf(word, sizeof word, "%s", lex.s[w]);
                if (k == 0 && word[0] >= 'a' && word[0] <= 'z') word[0] = (char)(word[0] - 32);
                bt__buf_puts(&text, word);
            }
            if (k + 1 < words && rnd() % 10 == 0) bt__buf_puts(&text, punct[1 + rnd() % 2]);
        }
        bt__buf_puts(&text, punct[rnd() % 5 == 0 ? 4 : 0]);
        bt__buf_puts(&text, ++sent % 6 == 0 ? "\n\n" : " ");
    }
    free(cum);
    printf("text: %.1f MB of generated English-like prose\n", text.len / 1e6);

    int32_t *ids;
    size_t n;
    bt_tokenizer_encode(tok, text.data, 1 << 16, 0, &ids, &n); /* warm-up */
    free(ids);
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        t0 = now();
        bt_tokenizer_encode(tok, text.data, text.len, 0, &ids, &n);
        double dt = now() - t0;
        if (dt < best) best = dt;
        if (rep < 2) free(ids);
    }
    printf("encode: %.2f MB/s (%.0f k tokens/s, %.2f bytes/token), one thread, best of 3\n",
           text.len / 1e6 / best, n / 1e3 / best, (double)text.len / (double)n);
    char *back;
    size_t bl;
    t0 = now();
    bt_tokenizer_decode(tok, ids, n, false, &back, &bl);
    double dt = now() - t0;
    printf("decode: %.1f MB/s (round trip %s)\n", bl / 1e6 / dt,
           bl == text.len && !memcmp(back, text.data, bl) ? "exact" : "DIFFERS");
    free(back);
    bt_detok_t *d;
    bt_detok_create(tok, true, &d);
    t0 = now();
    for (size_t i = 0; i < n; i++) {
        const char *o;
        size_t ol;
        bt_detok_push(d, &ids[i], 1, &o, &ol);
    }
    dt = now() - t0;
    printf("streaming detokenizer: %.1f M tokens/s (one id per call)\n", n / 1e6 / dt);
    bt_detok_destroy(d);
    free(ids);

    if (golden) {
        bt_tokenizer_t *g;
        if (bt_tokenizer_load(golden, &g, err, sizeof err) == BT_OK) {
            t0 = now();
            bt_tokenizer_encode(g, text.data, text.len, 0, &ids, &n);
            dt = now() - t0;
            printf("golden 1014-id tokenizer on the same text: %.2f MB/s\n", text.len / 1e6 / dt);
            free(ids);
            bt_tokenizer_destroy(g);
        }
    }
    bt_tokenizer_destroy(tok);
    bt__buf_free(&text);
    bt__buf_free(&j);
    return 0;
}

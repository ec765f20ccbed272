/* Constrained decoding's masks (common/text/grammar.h) at a real vocabulary's size: what a worker
 * spends a constrained sequence a step, before the draw.
 *
 *   build/bin/bench_grammar [--vocab 129280] [--reps 5]
 *
 * The vocabulary is synthetic but shaped like a byte-level BPE one: the 256 bytes, then words
 * with and without a leading space, numbers, punctuation runs, code and JSON fragments, CJK
 * characters and whitespace runs. For each automaton state (the start, inside a string, a value
 * to start, a number, after a member, a schema's key) it times, as medians over reps:
 *   miss:  the mask computed (a schema text not seen before, so an empty cache);
 *   hit:   the same state again (the cache);
 *   floor: a walk of the same trie that takes every byte (the traversal alone);
 *   brute: each token's bytes run through the automaton from the state, token by token (the
 *          peer: what a grammar engine without a trie does).
 * Prints a table, then a JSON line a state. */
#include "common/text/grammar.h"

#include "bench/bench_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static char **g_bytes;
static size_t *g_lens;

static void make_vocab(int vocab)
{
    g_bytes = calloc((size_t)vocab, sizeof *g_bytes);
    g_lens = calloc((size_t)vocab, sizeof *g_lens);
    static const char *const frags[] = {"{\"",    "\":",    "\",",  "},",     "\"}", "]}",   "[{",
                                        "\": \"", "\", \"", "\n  ", "\n    ", "  ",  "    ", "();",
                                        "->",     "==",     "!=",   "//",     "/*",  "*/",   "\\n",
                                        "\\\"",   "...",    "--",   "**",     "<",   ">",    "</"};
    for (int i = 0; i < vocab; i++) {
        char buf[48];
        size_t n = 0;
        if (i < 256) {
            buf[n++] = (char)i;
        } else {
            const uint32_t kind = rnd() % 100;
            if (kind < 60) { /* a word, mostly with a leading space */
                if (rnd() % 4) buf[n++] = ' ';
                const int len = 2 + (int)(rnd() % 9);
                const bool cap = rnd() % 5 == 0;
                for (int k = 0; k < len; k++)
                    buf[n++] = (char)((cap && k == 0 ? 'A' : 'a') + rnd() % 26);
            } else if (kind < 68) { /* digits */
                const int len = 1 + (int)(rnd() % 3);
                for (int k = 0; k < len; k++)
                    buf[n++] = (char)('0' + rnd() % 10);
            } else if (kind < 80) { /* code and JSON fragments */
                const char *f = frags[rnd() % (sizeof frags / sizeof *frags)];
                n = strlen(f);
                memcpy(buf, f, n);
                if (rnd() % 2) buf[n++] = (char)('a' + rnd() % 26);
            } else if (kind < 92) { /* CJK: 1 or 2 characters of 3 bytes */
                const int chars = 1 + (int)(rnd() % 2);
                for (int k = 0; k < chars; k++) {
                    const uint32_t cp = 0x4e00 + rnd() % 0x5000;
                    buf[n++] = (char)(0xe0 | (cp >> 12));
                    buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    buf[n++] = (char)(0x80 | (cp & 0x3f));
                }
            } else { /* punctuation and whitespace runs */
                const int len = 2 + (int)(rnd() % 4);
                const char *p = rnd() % 2 ? " \n\t" : ".,;:!?'\"()[]{}-_=+*&%$#@";
                const size_t pl = strlen(p);
                for (int k = 0; k < len; k++)
                    buf[n++] = p[rnd() % pl];
            }
        }
        g_bytes[i] = malloc(n);
        memcpy(g_bytes[i], buf, n);
        g_lens[i] = n;
    }
}

#define SCHEMA_FMT                                                                                 \
    "{\"title\":\"t%d\",\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"       \
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}" \
    ","                                                                                            \
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\","            \
    "\"maxLength\":300},\"city\":{\"type\":\"string\",\"maxLength\":13}}},"                        \
    "\"email\":{\"type\":\"string\",\"format\":\"email\"},"                                        \
    "\"memo\":{\"type\":\"string\",\"pattern\":\"[0-9]\"},"                                        \
    "\"ratio\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1}},"                                \
    "\"required\":[\"name\",\"age\"]}"

typedef struct {
    const char *name;
    bool schema;        /* under SCHEMA_FMT; else any object */
    const char *prefix; /* the bytes that lead to the state */
} state_t;

static const state_t states[] = {
    {"start (any object)", false, ""},
    {"in a string (any object)", false, "{\"key\": \"some text"},
    {"a value to start (any object)", false, "{\"a\": [1, {\"b\": "},
    {"in a number (any object)", false, "{\"a\": 12"},
    {"after a member (any object)", false, "{\"a\": {\"b\": true}"},
    {"a key (schema)", true, "{\"name\": \"x\", \"age\": 3, "},
    {"in a string (schema)", true, "{\"name\": \"some text"},
    {"an integer (schema)", true, "{\"name\": \"x\", \"age\": 4"},
    {"in a string, maxLength 300 (schema)", true,
     "{\"name\": \"x\", \"age\": 3, \"address\": {\"street\": \"some text"},
    {"in a string, 4 to maxLength (schema)", true,
     "{\"name\": \"x\", \"age\": 3, \"address\": {\"city\": \"some text"},
    {"in a string, format email (schema)", true,
     "{\"name\": \"x\", \"age\": 3, \"email\": \"john.sm"},
    {"in a string, pattern [0-9] (schema)", true,
     "{\"name\": \"x\", \"age\": 3, \"memo\": \"some text"},
    {"a number in 0..1 (schema)", true, "{\"name\": \"x\", \"age\": 3, \"ratio\": 0.1"},
};

static int schema_serial;

static bt_grammar_t *at_state(bt_grammar_vocab_t *v, const state_t *st, bool fresh)
{
    char schema[1024], err[256];
    if (fresh) schema_serial++;
    snprintf(schema, sizeof schema, SCHEMA_FMT, schema_serial);
    bt_grammar_t *g = NULL;
    if (st->schema) {
        if (bt_grammar_json_schema(v, schema, strlen(schema), -1, &g, err, sizeof err) != BT_OK) {
            fprintf(stderr, "bench_grammar: %s\n", err);
            exit(1);
        }
    } else { /* any object, under a text of its own (an empty cache when fresh) */
        snprintf(schema, sizeof schema, "{\"title\":\"t%d\",\"type\":\"object\"}", schema_serial);
        bt_grammar_json_schema(v, schema, strlen(schema), -1, &g, err, sizeof err);
    }
    if (!bt_grammar_accept_bytes(g, st->prefix, strlen(st->prefix))) {
        fprintf(stderr, "bench_grammar: the prefix of '%s' is refused\n", st->name);
        exit(1);
    }
    return g;
}

/* The floor: the same trie walked taking every byte (every node visited once). */
typedef struct node {
    struct node *child, *sibling;
    uint8_t byte;
    int32_t tok;
} node_t;

static node_t *g_nodes;
static size_t g_n_nodes;

static void build_trie(int vocab)
{
    size_t cap = 1 << 20;
    g_nodes = calloc(cap, sizeof *g_nodes);
    g_n_nodes = 1;
    for (int i = 0; i < vocab; i++) {
        node_t *n = &g_nodes[0];
        for (size_t k = 0; k < g_lens[i]; k++) {
            node_t *c = n->child;
            while (c && c->byte != (uint8_t)g_bytes[i][k])
                c = c->sibling;
            if (!c) {
                if (g_n_nodes == cap) {
                    fprintf(stderr, "bench_grammar: trie past %zu nodes\n", cap);
                    exit(1);
                }
                c = &g_nodes[g_n_nodes++];
                c->byte = (uint8_t)g_bytes[i][k];
                c->tok = -1;
                c->sibling = n->child;
                n->child = c;
            }
            n = c;
        }
        n->tok = i;
    }
}

static void walk_all(const node_t *n, uint32_t *mask, uint64_t *acc)
{
    for (const node_t *c = n->child; c; c = c->sibling) {
        *acc += c->byte;
        if (c->tok >= 0) mask[c->tok >> 5] |= 1u << (c->tok & 31);
        walk_all(c, mask, acc);
    }
}

int main(int argc, char **argv)
{
    int vocab = 129280, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab"))
            vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (vocab < 512 || reps < 1) {
        fprintf(stderr, "usage: bench_grammar [--vocab N>=512] [--reps N>=1]\n");
        return 2;
    }
    make_vocab(vocab);
    bt_grammar_vocab_t *v;
    double t0 = now();
    if (bt_grammar_vocab_create_bytes((const char *const *)g_bytes, g_lens, vocab, vocab - 1, &v) !=
        BT_OK)
        return 1;
    const double index_ms = (now() - t0) * 1e3;
    build_trie(vocab);
    const int W = bt_grammar_mask_words(v);
    uint32_t *mask = calloc((size_t)W, 4);
    double *t = calloc((size_t)reps, sizeof *t);
    printf("bench_grammar: %d ids, trie of %zu nodes, indexed in %.0f ms; medians of %d\n\n", vocab,
           g_n_nodes, index_ms, reps);
    printf("| state | allowed | miss ms | hit ms | floor ms | brute ms | miss / floor |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t s = 0; s < sizeof states / sizeof *states; s++) {
        const state_t *st = &states[s];
        double miss, hit, floor_ms, brute;
        for (int r = 0; r < reps; r++) { /* miss */
            bt_grammar_t *g = at_state(v, st, true);
            t0 = now();
            bt_grammar_mask(g, mask);
            t[r] = (now() - t0) * 1e3;
            bt_grammar_destroy(g);
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        miss = t[reps / 2];
        int allowed = 0;
        for (int i = 0; i < vocab; i++)
            allowed += (mask[i >> 5] >> (i & 31)) & 1u;
        bt_grammar_t *g = at_state(v, st, false);
        bt_grammar_mask(g, mask);
        for (int r = 0; r < reps; r++) { /* hit */
            t0 = now();
            bt_grammar_mask(g, mask);
            t[r] = (now() - t0) * 1e3;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        hit = t[reps / 2];
        bt_grammar_destroy(g);
        uint64_t acc = 0;
        for (int r = 0; r < reps; r++) { /* floor */
            memset(mask, 0, (size_t)W * 4);
            t0 = now();
            walk_all(&g_nodes[0], mask, &acc);
            t[r] = (now() - t0) * 1e3;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        floor_ms = t[reps / 2];
        g = at_state(v, st, false);
        for (int r = 0; r < reps; r++) { /* brute: a copy of the automaton at the state a token */
            int n = 0;
            t0 = now();
            for (int i = 0; i < vocab; i++) {
                bt_grammar_t *h = bt_grammar_clone(g);
                n += bt_grammar_accept(h, i);
                bt_grammar_destroy(h);
            }
            t[r] = (now() - t0) * 1e3;
            if (n != allowed)
                fprintf(stderr, "bench_grammar: %s: brute %d, mask %d\n", st->name, n, allowed);
        }
        bt_grammar_destroy(g);
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        brute = t[reps / 2];
        printf("| %s | %d | %.2f | %.4f | %.2f | %.1f | %.1fx |\n", st->name, allowed, miss, hit,
               floor_ms, brute, miss / floor_ms);
        fprintf(
            stderr,
            "{\"state\":\"%s\",\"allowed\":%d,\"miss_ms\":%.3f,\"hit_ms\":%.4f,\"floor_ms\":%.3f,"
            "\"brute_ms\":%.2f,\"acc\":%llu}\n",
            st->name, allowed, miss, hit, floor_ms, brute, (unsigned long long)acc);
    }
    free(t);
    free(mask);
    bt_grammar_vocab_destroy(v);
    return 0;
}

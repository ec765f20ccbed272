/* The JSON object constraint of grammar.h: a byte-level pushdown automaton, a trie of the
 * vocabulary's byte strings, and a cache of the masks by automaton state. */
#include "common/text/grammar.h"

#include "common/alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the automaton ------------------------------------------------------------------------ */

enum {
    M_TOP,       /* before the object: whitespace or '{' */
    M_VALUE,     /* a value must start (after ':' or an array's ',') */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_OBJ_KEY,   /* after an object's ',': a key */
    M_COLON,     /* after a key: ':' */
    M_OBJ_NEXT,  /* after a member: ',' or '}' */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_ARR_NEXT,  /* after an element: ',' or ']' */
    M_STR,       /* inside a string (lit LOW_NEXT: a low surrogate's escape must follow) */
    M_STR_ESC,   /* after a backslash */
    M_STR_HEX,   /* in \uXXXX: sub hex digits to go; need 1 when the first was d */
    M_STR_UTF8,  /* need more continuation bytes, the next in lo..hi */
    M_NUM,       /* in a number: sub is N_* */
    M_LIT,       /* in true, false or null: lit, sub characters matched */
    M_DONE,      /* the object is closed */
};

enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const literals[3] = {"true", "false", "null"};

/* In strings, lit says what a \u escape may be: surrogates only in pairs (\uD83D\uDE00), as
 * strict parsers take them. */
enum { SURROGATE_NONE, HIGH_READING, LOW_NEXT };

/* Every byte is meaningful (fields unused in a mode stay 0): the state is its own cache key. */
typedef struct {
    uint8_t mode, sub, lit, need, lo, hi;
    uint8_t key; /* the string being read is an object key */
    uint8_t run; /* whitespace bytes in a row; bytes of the number */
    uint16_t depth;
    uint16_t zero;
    uint8_t stack[BT_GRAMMAR_MAX_DEPTH / 8]; /* a bit per level: 1 object, 0 array */
} jstate_t;

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_hex(uint8_t c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static void set_mode(jstate_t *s, uint8_t mode)
{
    s->mode = mode;
    s->sub = s->lit = s->need = s->lo = s->hi = s->run = 0;
}

static bool push(jstate_t *s, bool object)
{
    if (s->depth >= BT_GRAMMAR_MAX_DEPTH) return false;
    if (object) s->stack[s->depth / 8] |= (uint8_t)(1u << (s->depth % 8));
    s->depth++;
    set_mode(s, object ? M_OBJ_FIRST : M_ARR_FIRST);
    return true;
}

static bool top_is_object(const jstate_t *s)
{
    const unsigned i = s->depth - 1u;
    return (s->stack[i / 8] >> (i % 8)) & 1u;
}

/* A value just ended: what its container expects next. */
static void value_end(jstate_t *s)
{
    s->key = 0;
    if (s->depth == 0)
        set_mode(s, M_DONE);
    else
        set_mode(s, top_is_object(s) ? M_OBJ_NEXT : M_ARR_NEXT);
}

static void pop(jstate_t *s)
{
    s->depth--;
    s->stack[s->depth / 8] &= (uint8_t) ~(1u << (s->depth % 8));
    value_end(s);
}

static bool step(jstate_t *s, uint8_t c);

static bool value_start(jstate_t *s, uint8_t c)
{
    switch (c) {
    case '"':
        set_mode(s, M_STR);
        return true;
    case '{':
        return push(s, true);
    case '[':
        return push(s, false);
    case '-':
        set_mode(s, M_NUM);
        s->sub = N_MINUS;
        s->run = 1;
        return true;
    case 't':
    case 'f':
    case 'n':
        set_mode(s, M_LIT);
        s->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->sub = 1;
        return true;
    default:
        if (!is_digit(c)) return false;
        set_mode(s, M_NUM);
        s->sub = c == '0' ? N_ZERO : N_INT;
        s->run = 1;
        return true;
    }
}

static bool number_step(jstate_t *s, uint8_t c)
{
    uint8_t next;
    switch (s->sub) {
    case N_MINUS:
        next = c == '0' ? N_ZERO : is_digit(c) ? N_INT : 0xff;
        break;
    case N_ZERO:
        next = c == '.' ? N_DOT : (c == 'e' || c == 'E') ? N_E : 0xfe;
        break;
    case N_INT:
        next = is_digit(c) ? N_INT : c == '.' ? N_DOT : (c == 'e' || c == 'E') ? N_E : 0xfe;
        break;
    case N_DOT:
        next = is_digit(c) ? N_FRAC : 0xff;
        break;
    case N_FRAC:
        next = is_digit(c) ? N_FRAC : (c == 'e' || c == 'E') ? N_E : 0xfe;
        break;
    case N_E:
        next = (c == '+' || c == '-') ? N_ESIGN : is_digit(c) ? N_EXP : 0xff;
        break;
    case N_ESIGN:
        next = is_digit(c) ? N_EXP : 0xff;
        break;
    default:
        next = is_digit(c) ? N_EXP : 0xfe;
        break;
    }
    if (next == 0xff) return false;
    if (next == 0xfe) { /* the number ended: c belongs to what follows it */
        value_end(s);
        return step(s, c);
    }
    if (s->run >= BT_GRAMMAR_MAX_NUMBER) return false;
    s->sub = next;
    s->run++;
    return true;
}

static bool string_step(jstate_t *s, uint8_t c)
{
    switch (s->mode) {
    case M_STR_ESC:
        if (c == 'u') {
            s->mode = M_STR_HEX;
            s->sub = 4;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0 || s->lit == LOW_NEXT) return false;
        s->mode = M_STR;
        return true;
    case M_STR_HEX: {
        if (!is_hex(c)) return false;
        const bool d = c == 'd' || c == 'D', upper8 = (c >= '8' && c <= '9') ||
                                                      (c >= 'a' && c <= 'f') ||
                                                      (c >= 'A' && c <= 'F');
        const bool low_half = (c >= 'c' && c <= 'f') || (c >= 'C' && c <= 'F'); /* DC00..DFFF */
        if (s->sub == 4) {
            if (s->lit == LOW_NEXT && !d) return false;
            s->need = d;
        } else if (s->sub == 3 && s->need) { /* D8..DF: a surrogate */
            s->need = 0;
            if (s->lit == LOW_NEXT) {
                if (!low_half) return false;
                s->lit = SURROGATE_NONE;
            } else if (upper8) {
                if (low_half) return false; /* a low surrogate alone */
                s->lit = HIGH_READING;
            }
        }
        if (--s->sub == 0) {
            s->mode = M_STR;
            s->lit = s->lit == HIGH_READING ? LOW_NEXT : SURROGATE_NONE;
        }
        return true;
    }
    case M_STR_UTF8:
        if (c < s->lo || c > s->hi) return false;
        s->lo = 0x80;
        s->hi = 0xbf;
        if (--s->need == 0) {
            s->mode = M_STR;
            s->lo = s->hi = 0;
        }
        return true;
    default:
        break;
    }
    if (s->lit == LOW_NEXT) { /* only the low surrogate's escape */
        if (c != '\\') return false;
        s->mode = M_STR_ESC;
        return true;
    }
    if (c == '"') {
        if (s->key) {
            s->key = 0;
            set_mode(s, M_COLON);
        } else {
            value_end(s);
        }
        return true;
    }
    if (c == '\\') {
        s->mode = M_STR_ESC;
        return true;
    }
    if (c < 0x20) return false;
    if (c < 0x80) return true;
    /* UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing past U+10FFFF */
    uint8_t need, lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return false;
    }
    s->mode = M_STR_UTF8;
    s->need = need;
    s->lo = lo;
    s->hi = hi;
    return true;
}

/* Advances s by byte c; false (s then undefined) when c cannot come here. */
static bool step(jstate_t *s, uint8_t c)
{
    switch (s->mode) {
    case M_STR:
    case M_STR_ESC:
    case M_STR_HEX:
    case M_STR_UTF8:
        return string_step(s, c);
    case M_NUM:
        return number_step(s, c);
    case M_LIT: {
        const char *lit = literals[s->lit];
        if (c != (uint8_t)lit[s->sub]) return false;
        if (lit[++s->sub] == 0) value_end(s);
        return true;
    }
    case M_DONE:
        return false;
    default:
        break;
    }
    if (is_ws(c)) {
        if (s->run >= BT_GRAMMAR_MAX_WS) return false;
        s->run++;
        return true;
    }
    s->run = 0;
    switch (s->mode) {
    case M_TOP:
        return c == '{' && push(s, true);
    case M_VALUE:
        return value_start(s, c);
    case M_OBJ_FIRST:
        if (c == '}') {
            pop(s);
            return true;
        }
        /* fall through */
    case M_OBJ_KEY:
        if (c != '"') return false;
        set_mode(s, M_STR);
        s->key = 1;
        return true;
    case M_COLON:
        if (c != ':') return false;
        set_mode(s, M_VALUE);
        return true;
    case M_OBJ_NEXT:
    case M_ARR_NEXT: {
        const bool object = s->mode == M_OBJ_NEXT;
        if (c == ',') {
            set_mode(s, object ? M_OBJ_KEY : M_VALUE);
            return true;
        }
        if (c != (object ? '}' : ']')) return false;
        pop(s);
        return true;
    }
    case M_ARR_FIRST:
        if (c == ']') {
            pop(s);
            return true;
        }
        return value_start(s, c);
    default:
        return false;
    }
}

/* ---- the vocabulary ------------------------------------------------------------------------- */

typedef struct {
    uint32_t child, sibling; /* 0: none (the root is nobody's child) */
    int32_t tok;             /* a token whose bytes end here, -1: none; more in tok_next */
    uint8_t byte;
} tnode_t;

enum { CACHE_SLOTS = 512, CACHE_PROBES = 8 };

typedef struct {
    bool used;
    jstate_t key;
    uint64_t last_use;
    uint32_t *mask;
} cache_entry_t;

struct bt_grammar_vocab {
    int vocab, words;
    int32_t eos;
    char **bytes; /* per id, NULL: never allowed */
    size_t *lens;
    int32_t *tok_next;
    tnode_t *nodes;
    uint32_t n_nodes, cap_nodes;
    pthread_mutex_t lock; /* the cache */
    cache_entry_t *cache;
    uint64_t clock, computed, looked_up;
};

static uint32_t new_node(bt_grammar_vocab_t *v, uint8_t byte)
{
    if (v->n_nodes == v->cap_nodes) {
        v->cap_nodes = v->cap_nodes ? v->cap_nodes * 2 : 1024;
        v->nodes = bt_realloc_or_die(v->nodes, (size_t)v->cap_nodes * sizeof *v->nodes);
    }
    v->nodes[v->n_nodes] = (tnode_t){0, 0, -1, byte};
    return v->n_nodes++;
}

static void trie_insert(bt_grammar_vocab_t *v, int32_t id, const char *b, size_t len)
{
    uint32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        const uint8_t c = (uint8_t)b[i];
        uint32_t k = v->nodes[n].child;
        while (k && v->nodes[k].byte != c)
            k = v->nodes[k].sibling;
        if (!k) {
            k = new_node(v, c);
            v->nodes[k].sibling = v->nodes[n].child;
            v->nodes[n].child = k;
        }
        n = k;
    }
    v->tok_next[id] = v->nodes[n].tok;
    v->nodes[n].tok = id;
}

bt_status_t bt_grammar_vocab_create_bytes(const char *const *bytes, const size_t *lens, int vocab,
                                          int32_t eos_id, bt_grammar_vocab_t **v_p)
{
    if (vocab < 1) return BT_ERR_INVALID_ARG;
    bt_grammar_vocab_t *v = bt_calloc_or_die(1, sizeof *v);
    v->vocab = vocab;
    v->words = (vocab + 31) / 32;
    v->eos = eos_id >= 0 && eos_id < vocab ? eos_id : -1;
    v->bytes = bt_calloc_or_die((size_t)vocab, sizeof *v->bytes);
    v->lens = bt_calloc_or_die((size_t)vocab, sizeof *v->lens);
    v->tok_next = bt_malloc_or_die((size_t)vocab * sizeof *v->tok_next);
    new_node(v, 0);
    for (int i = 0; i < vocab; i++) {
        v->tok_next[i] = -1;
        if (!bytes[i] || lens[i] == 0 || i == v->eos) continue;
        v->bytes[i] = bt_malloc_or_die(lens[i]);
        memcpy(v->bytes[i], bytes[i], lens[i]);
        v->lens[i] = lens[i];
        trie_insert(v, i, bytes[i], lens[i]);
    }
    pthread_mutex_init(&v->lock, NULL);
    v->cache = bt_calloc_or_die(CACHE_SLOTS, sizeof *v->cache);
    *v_p = v;
    return BT_OK;
}

bt_status_t bt_grammar_vocab_create(const bt_tokenizer_t *tok, int vocab, int32_t eos_id,
                                    bt_grammar_vocab_t **v_p)
{
    if (vocab < 1) return BT_ERR_INVALID_ARG;
    const char **bytes = bt_calloc_or_die((size_t)vocab, sizeof *bytes);
    size_t *lens = bt_calloc_or_die((size_t)vocab, sizeof *lens);
    for (int i = 0; i < vocab; i++)
        if (!bt_tokenizer_is_special(tok, i)) bytes[i] = bt_tokenizer_id_bytes(tok, i, &lens[i]);
    bt_status_t st = bt_grammar_vocab_create_bytes(bytes, lens, vocab, eos_id, v_p);
    free(bytes);
    free(lens);
    return st;
}

void bt_grammar_vocab_destroy(bt_grammar_vocab_t *v)
{
    if (!v) return;
    for (int i = 0; i < v->vocab; i++)
        free(v->bytes[i]);
    for (int i = 0; i < CACHE_SLOTS; i++)
        free(v->cache[i].mask);
    pthread_mutex_destroy(&v->lock);
    free(v->cache);
    free(v->bytes);
    free(v->lens);
    free(v->tok_next);
    free(v->nodes);
    free(v);
}

int bt_grammar_vocab_size(const bt_grammar_vocab_t *v)
{
    return v->vocab;
}

int bt_grammar_mask_words(const bt_grammar_vocab_t *v)
{
    return v->words;
}

void bt_grammar_vocab_stats(bt_grammar_vocab_t *v, uint64_t *computed, uint64_t *cached)
{
    pthread_mutex_lock(&v->lock);
    *computed = v->computed;
    *cached = v->looked_up - v->computed;
    pthread_mutex_unlock(&v->lock);
}

/* Every token whose bytes the automaton takes from st, below trie node n. */
static void walk(const bt_grammar_vocab_t *v, uint32_t n, const jstate_t *st, uint32_t *mask)
{
    for (uint32_t k = v->nodes[n].child; k; k = v->nodes[k].sibling) {
        jstate_t s = *st;
        if (!step(&s, v->nodes[k].byte)) continue;
        for (int32_t t = v->nodes[k].tok; t >= 0; t = v->tok_next[t])
            mask[t >> 5] |= 1u << (t & 31);
        walk(v, k, &s, mask);
    }
}

static uint64_t state_hash(const jstate_t *s)
{
    const uint8_t *b = (const uint8_t *)s;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *s; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The mask of state st into out, from the cache or computed into it. */
static void vocab_mask(bt_grammar_vocab_t *v, const jstate_t *st, uint32_t *out)
{
    const size_t bytes = (size_t)v->words * sizeof *out;
    const uint64_t h = state_hash(st);
    pthread_mutex_lock(&v->lock);
    v->looked_up++;
    v->clock++;
    cache_entry_t *victim = NULL;
    for (int p = 0; p < CACHE_PROBES; p++) {
        cache_entry_t *e = &v->cache[(h + (uint64_t)p) % CACHE_SLOTS];
        if (e->used && !memcmp(&e->key, st, sizeof *st)) {
            e->last_use = v->clock;
            memcpy(out, e->mask, bytes);
            pthread_mutex_unlock(&v->lock);
            return;
        }
        if (!victim || !e->used || (victim->used && e->last_use < victim->last_use)) victim = e;
    }
    v->computed++;
    pthread_mutex_unlock(&v->lock);
    memset(out, 0, bytes);
    walk(v, 0, st, out);
    bool any = false;
    for (int i = 0; i < v->words && !any; i++)
        any = out[i] != 0;
    /* (a vocabulary without the bytes this state needs: end rather than draw from nothing) */
    if (!any && v->eos >= 0) out[v->eos >> 5] |= 1u << (v->eos & 31);
    pthread_mutex_lock(&v->lock);
    if (!victim->mask) victim->mask = bt_malloc_or_die(bytes);
    victim->used = true;
    victim->key = *st;
    victim->last_use = v->clock;
    memcpy(victim->mask, out, bytes);
    pthread_mutex_unlock(&v->lock);
}

/* ---- a request's constraint --------------------------------------------------------------- */

struct bt_grammar {
    bt_grammar_vocab_t *v;
    int32_t after;
    bool active;
    jstate_t s;
};

bt_grammar_t *bt_grammar_json_object(bt_grammar_vocab_t *v, int32_t after_token)
{
    bt_grammar_t *g = bt_calloc_or_die(1, sizeof *g);
    g->v = v;
    g->after = after_token;
    g->active = after_token < 0;
    set_mode(&g->s, M_TOP);
    return g;
}

void bt_grammar_destroy(bt_grammar_t *g)
{
    free(g);
}

bool bt_grammar_active(const bt_grammar_t *g)
{
    return g->active;
}

bool bt_grammar_done(const bt_grammar_t *g)
{
    return g->active && g->s.mode == M_DONE;
}

void bt_grammar_mask(bt_grammar_t *g, uint32_t *mask)
{
    bt_grammar_vocab_t *v = g->v;
    if (!g->active) { /* every id */
        memset(mask, 0xff, (size_t)v->words * sizeof *mask);
        if (v->vocab % 32) mask[v->words - 1] = (1u << (v->vocab % 32)) - 1u;
        return;
    }
    if (g->s.mode == M_DONE) {
        memset(mask, 0, (size_t)v->words * sizeof *mask);
        if (v->eos >= 0) mask[v->eos >> 5] |= 1u << (v->eos & 31);
        return;
    }
    vocab_mask(v, &g->s, mask);
}

bool bt_grammar_accept_bytes(bt_grammar_t *g, const char *bytes, size_t len)
{
    jstate_t s = g->s;
    for (size_t i = 0; i < len; i++)
        if (!step(&s, (uint8_t)bytes[i])) return false;
    g->s = s;
    return true;
}

bool bt_grammar_accept(bt_grammar_t *g, int32_t t)
{
    if (!g->active) {
        if (t == g->after) g->active = true;
        return true;
    }
    const bt_grammar_vocab_t *v = g->v;
    if (t < 0 || t >= v->vocab) return false;
    if (t == v->eos) return g->s.mode == M_DONE;
    if (!v->bytes[t]) return false;
    return bt_grammar_accept_bytes(g, v->bytes[t], v->lens[t]);
}

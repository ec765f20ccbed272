/* regex.h: a pattern parsed into a tree, the tree into an NFA over UTF-8 bytes (each code point
 * range as the byte-range sequences that encode it), the NFA into a DFA by subset construction,
 * and the DFA cut to the states that can still reach acceptance. */
#include "common/text/regex.h"

#include "common/alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_REPEAT = 1000,      /* {n,m} bounds */
    MAX_NFA_STATES = 60000, /* the pattern's size, its repeats expanded */
    MAX_DEPTH = 64,         /* nested groups */
};
/* Edges and set members the subset construction may go through (about 40 ms on the dev VM; an
 * email format takes 56 thousand): a pattern that would take longer is refused, so a request
 * cannot stall the router's check. */
#define MAX_WORK 8000000LL
#define CP_MAX 0x10FFFFu
#define SURROGATE_LO 0xD800u
#define SURROGATE_HI 0xDFFFu

typedef struct {
    uint32_t lo, hi;
} cp_range_t;

enum { A_EMPTY, A_CLASS, A_CAT, A_ALT, A_REPEAT };

typedef struct {
    uint8_t op;
    int a, b;     /* CAT, ALT: the two parts; REPEAT: a; CLASS: its ranges [a, a + b) */
    int min, max; /* REPEAT; max -1: unbounded */
} anode_t;

typedef struct {
    const uint8_t *p, *end;
    anode_t *nodes;
    int n_nodes, cap_nodes;
    cp_range_t *ranges;
    int n_ranges, cap_ranges;
    char *err;
    size_t errlen;
    bool failed;
    int depth;
} parser_t;

static void pfail(parser_t *ps, const char *fmt, ...)
{
    if (ps->failed) return;
    ps->failed = true;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(ps->err, ps->errlen, "pattern: ");
    if (n >= 0 && (size_t)n < ps->errlen) vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static int new_anode(parser_t *ps, uint8_t op, int a, int b)
{
    if (ps->n_nodes == ps->cap_nodes) {
        ps->cap_nodes = ps->cap_nodes ? 2 * ps->cap_nodes : 64;
        ps->nodes = bt_realloc_or_die(ps->nodes, (size_t)ps->cap_nodes * sizeof *ps->nodes);
    }
    ps->nodes[ps->n_nodes] = (anode_t){op, a, b, 0, 0};
    return ps->n_nodes++;
}

/* ---- code point classes ------------------------------------------------------------------- */

typedef struct {
    cp_range_t *r;
    int n, cap;
} cset_t;

static void cset_add(cset_t *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->r = bt_realloc_or_die(s->r, (size_t)s->cap * sizeof *s->r);
    }
    s->r[s->n++] = (cp_range_t){lo, hi};
}

static int range_cmp(const void *a, const void *b)
{
    const cp_range_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorted, merged, surrogates taken out (they are not code points a UTF-8 string holds). */
static void cset_normalize(cset_t *s)
{
    if (s->n) qsort(s->r, (size_t)s->n, sizeof *s->r, range_cmp);
    cset_t o = {0};
    for (int i = 0; i < s->n; i++) {
        const cp_range_t x = s->r[i];
        if (o.n && x.lo <= o.r[o.n - 1].hi + 1) {
            if (x.hi > o.r[o.n - 1].hi) o.r[o.n - 1].hi = x.hi;
        } else {
            cset_add(&o, x.lo, x.hi);
        }
    }
    cset_t q = {0};
    for (int i = 0; i < o.n; i++) {
        const cp_range_t x = o.r[i];
        if (x.hi < SURROGATE_LO || x.lo > SURROGATE_HI) {
            cset_add(&q, x.lo, x.hi);
            continue;
        }
        if (x.lo < SURROGATE_LO) cset_add(&q, x.lo, SURROGATE_LO - 1);
        if (x.hi > SURROGATE_HI) cset_add(&q, SURROGATE_HI + 1, x.hi);
    }
    free(o.r);
    free(s->r);
    *s = q;
}

static void cset_negate(cset_t *s)
{
    cset_normalize(s);
    cset_t o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) cset_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX) cset_add(&o, next, CP_MAX);
    free(s->r);
    *s = o;
    cset_normalize(s);
}

/* ECMA-262's \d, \w, \s */
static void cset_add_digit(cset_t *s)
{
    cset_add(s, '0', '9');
}

static void cset_add_word(cset_t *s)
{
    cset_add(s, '0', '9');
    cset_add(s, 'A', 'Z');
    cset_add(s, 'a', 'z');
    cset_add(s, '_', '_');
}

static void cset_add_space(cset_t *s)
{
    static const cp_range_t sp[] = {
        {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
        {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        cset_add(s, sp[i].lo, sp[i].hi);
}

/* A class node from s (normalized here; s is emptied). */
static int class_node(parser_t *ps, cset_t *s)
{
    cset_normalize(s);
    const int first = ps->n_ranges;
    for (int i = 0; i < s->n; i++) {
        if (ps->n_ranges == ps->cap_ranges) {
            ps->cap_ranges = ps->cap_ranges ? 2 * ps->cap_ranges : 64;
            ps->ranges = bt_realloc_or_die(ps->ranges, (size_t)ps->cap_ranges * sizeof *ps->ranges);
        }
        ps->ranges[ps->n_ranges++] = s->r[i];
    }
    free(s->r);
    *s = (cset_t){0};
    return new_anode(ps, A_CLASS, first, ps->n_ranges - first);
}

static int single_node(parser_t *ps, uint32_t lo, uint32_t hi)
{
    cset_t s = {0};
    cset_add(&s, lo, hi);
    return class_node(ps, &s);
}

/* ---- the parser --------------------------------------------------------------------------- */

/* The next code point of the pattern (UTF-8); -1 at its end or on bytes that are not UTF-8. */
static int32_t next_cp(parser_t *ps)
{
    if (ps->p >= ps->end) return -1;
    const uint8_t c = *ps->p;
    int n;
    uint32_t cp;
    if (c < 0x80) {
        ps->p++;
        return c;
    } else if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        cp = c & 0x07;
    } else {
        pfail(ps, "not UTF-8");
        return -1;
    }
    if (ps->end - ps->p <= n) {
        pfail(ps, "not UTF-8");
        return -1;
    }
    for (int i = 1; i <= n; i++) {
        if ((ps->p[i] & 0xC0) != 0x80) {
            pfail(ps, "not UTF-8");
            return -1;
        }
        cp = cp << 6 | (ps->p[i] & 0x3F);
    }
    static const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > CP_MAX || (cp >= SURROGATE_LO && cp <= SURROGATE_HI)) {
        pfail(ps, "not UTF-8");
        return -1;
    }
    ps->p += n + 1;
    return (int32_t)cp;
}

static int hex_value(uint8_t c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* n hex digits (exactly) as a number; -1 if they are not there. */
static int32_t read_hex(parser_t *ps, int n)
{
    if (ps->end - ps->p < n) return -1;
    int32_t v = 0;
    for (int i = 0; i < n; i++) {
        const int h = hex_value(ps->p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    ps->p += n;
    return v;
}

/* After "\u": HHHH (a surrogate pair as \uHHHH\uHHHH) or {H...}; -1 on error (reported). */
static int32_t read_unicode_escape(parser_t *ps)
{
    if (ps->p < ps->end && *ps->p == '{') {
        ps->p++;
        uint32_t v = 0;
        int digits = 0;
        while (ps->p < ps->end && hex_value(*ps->p) >= 0 && v <= CP_MAX) {
            v = v * 16 + (uint32_t)hex_value(*ps->p++);
            digits++;
        }
        if (!digits || ps->p >= ps->end || *ps->p != '}' || v > CP_MAX) {
            pfail(ps, "\\u{...} must hold a code point up to 10FFFF");
            return -1;
        }
        ps->p++;
        if (v >= SURROGATE_LO && v <= SURROGATE_HI) {
            pfail(ps, "\\u{%X} is a surrogate, not a character", (unsigned)v);
            return -1;
        }
        return (int32_t)v;
    }
    const int32_t v = read_hex(ps, 4);
    if (v < 0) {
        pfail(ps, "\\u must be followed by four hex digits or {...}");
        return -1;
    }
    if (v >= (int32_t)SURROGATE_LO && v <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' &&
        ps->p[1] == 'u') {
        const uint8_t *save = ps->p;
        ps->p += 2;
        const int32_t lo = read_hex(ps, 4);
        if (lo >= 0xDC00 && lo <= (int32_t)SURROGATE_HI)
            return 0x10000 + ((v - (int32_t)SURROGATE_LO) << 10) + (lo - 0xDC00);
        ps->p = save;
    }
    if (v >= (int32_t)SURROGATE_LO && v <= (int32_t)SURROGATE_HI) {
        pfail(ps, "\\u%04X is half a surrogate pair, not a character", (unsigned)v);
        return -1;
    }
    return v;
}

/* After a backslash: a character class escape into s (returns -2), or one code point; -1 on
 * error. in_class: inside [...], where \b is a backspace and '-' may be escaped. */
static int32_t read_escape(parser_t *ps, cset_t *s, bool in_class)
{
    if (ps->p >= ps->end) {
        pfail(ps, "it ends with a lone backslash");
        return -1;
    }
    const uint8_t c = *ps->p++;
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S': {
        cset_t t = {0};
        if (c == 'd' || c == 'D') cset_add_digit(&t);
        if (c == 'w' || c == 'W') cset_add_word(&t);
        if (c == 's' || c == 'S') cset_add_space(&t);
        if (c == 'D' || c == 'W' || c == 'S') cset_negate(&t);
        for (int i = 0; i < t.n; i++)
            cset_add(s, t.r[i].lo, t.r[i].hi);
        free(t.r);
        return -2;
    }
    case 't':
        return '\t';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    case '0':
        if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
            pfail(ps, "octal escapes are not supported");
            return -1;
        }
        return 0;
    case 'x': {
        const int32_t v = read_hex(ps, 2);
        if (v < 0) pfail(ps, "\\x must be followed by two hex digits");
        return v;
    }
    case 'u':
        return read_unicode_escape(ps);
    case 'b':
        if (in_class) return '\b';
        pfail(ps, "word boundaries (\\b) are not supported");
        return -1;
    case 'B':
        pfail(ps, "word boundaries (\\B) are not supported");
        return -1;
    case 'k':
        pfail(ps, "backreferences (\\k) are not supported");
        return -1;
    case 'c':
        pfail(ps, "control escapes (\\c) are not supported");
        return -1;
    case 'p':
    case 'P':
        pfail(ps, "Unicode property escapes (\\%c) are not supported", c);
        return -1;
    default:
        break;
    }
    if (c >= '1' && c <= '9') {
        pfail(ps, "backreferences (\\%c) are not supported", c);
        return -1;
    }
    if (c < 0x80 && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && c >= 0x20) return c;
    pfail(ps, "unknown escape \\%c", c >= 0x20 && c < 0x7f ? c : '?');
    return -1;
}

/* One member of a class: a code point, or a class escape added to s (-2); -1 on error. */
static int32_t class_member(parser_t *ps, cset_t *s)
{
    if (*ps->p != '\\') return next_cp(ps);
    ps->p++;
    return read_escape(ps, s, true);
}

/* [...] after its '[' */
static int parse_class(parser_t *ps)
{
    cset_t s = {0};
    bool negate = false;
    if (ps->p < ps->end && *ps->p == '^') {
        negate = true;
        ps->p++;
    }
    for (;;) {
        if (ps->p >= ps->end) {
            pfail(ps, "a class [ is not closed");
            break;
        }
        if (*ps->p == ']') {
            ps->p++;
            break;
        }
        const int32_t lo = class_member(ps, &s);
        if (lo == -1) break;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            const int32_t hi = class_member(ps, &s);
            if (hi == -1) break;
            if (lo == -2 || hi == -2) {
                pfail(ps, "a class escape (\\d, \\w, \\s) cannot bound a range");
                break;
            }
            if (hi < lo) {
                pfail(ps, "a range in a class runs backwards");
                break;
            }
            cset_add(&s, (uint32_t)lo, (uint32_t)hi);
        } else if (lo >= 0) {
            cset_add(&s, (uint32_t)lo, (uint32_t)lo);
        }
    }
    if (ps->failed) {
        free(s.r);
        return -1;
    }
    if (negate) cset_negate(&s);
    return class_node(ps, &s);
}

static int parse_alt(parser_t *ps);

/* {n}, {n,}, {n,m} at p: true with the bounds; false (p unmoved) if that is not what is there
 * (then '{' is a literal, as ECMA-262's web grammar reads it). */
static bool parse_braces(parser_t *ps, int *min, int *max)
{
    const uint8_t *q = ps->p + 1;
    long a = 0, b;
    int digits = 0;
    while (q < ps->end && *q >= '0' && *q <= '9' && a <= 100000) {
        a = a * 10 + (*q++ - '0');
        digits++;
    }
    if (!digits) return false;
    b = a;
    if (q < ps->end && *q == ',') {
        q++;
        b = -1;
        if (q < ps->end && *q >= '0' && *q <= '9') {
            b = 0;
            while (q < ps->end && *q >= '0' && *q <= '9' && b <= 100000)
                b = b * 10 + (*q++ - '0');
        }
    }
    if (q >= ps->end || *q != '}') return false;
    ps->p = q + 1;
    if (a > MAX_REPEAT || b > MAX_REPEAT) {
        pfail(ps, "a repeat count above %d", MAX_REPEAT);
        return true;
    }
    if (b >= 0 && b < a) {
        pfail(ps, "{%ld,%ld}: the bounds run backwards", a, b);
        return true;
    }
    *min = (int)a;
    *max = (int)b;
    return true;
}

/* One atom, or -1 (then ps->failed, or nothing is there: *none). */
static int parse_atom(parser_t *ps, bool *none)
{
    *none = false;
    const uint8_t c = *ps->p;
    if (c == '(') {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?') {
            if (ps->end - ps->p >= 2 && ps->p[1] == ':') {
                ps->p += 2;
            } else if (ps->end - ps->p >= 3 && ps->p[1] == '<' && ps->p[2] != '=' &&
                       ps->p[2] != '!') {
                const uint8_t *gt = memchr(ps->p, '>', (size_t)(ps->end - ps->p));
                if (!gt) {
                    pfail(ps, "a group name (?<... is not closed");
                    return -1;
                }
                ps->p = gt + 1;
            } else {
                pfail(ps, "lookaround groups (?=, (?!, (?<=, (?<!) are not supported");
                return -1;
            }
        }
        if (++ps->depth > MAX_DEPTH) {
            pfail(ps, "groups nested more than %d deep", MAX_DEPTH);
            return -1;
        }
        const int x = parse_alt(ps);
        ps->depth--;
        if (x < 0) return -1;
        if (ps->p >= ps->end || *ps->p != ')') {
            pfail(ps, "a group ( is not closed");
            return -1;
        }
        ps->p++;
        return x;
    }
    if (c == '[') {
        ps->p++;
        return parse_class(ps);
    }
    if (c == '.') { /* anything but a line terminator */
        ps->p++;
        cset_t s = {0};
        cset_add(&s, '\n', '\n');
        cset_add(&s, '\r', '\r');
        cset_add(&s, 0x2028, 0x2029);
        cset_negate(&s);
        return class_node(ps, &s);
    }
    if (c == '\\') {
        ps->p++;
        cset_t s = {0};
        const int32_t v = read_escape(ps, &s, false);
        if (v == -1) {
            free(s.r);
            return -1;
        }
        if (v == -2) return class_node(ps, &s);
        return single_node(ps, (uint32_t)v, (uint32_t)v);
    }
    if (c == '*' || c == '+' || c == '?') {
        pfail(ps, "'%c' repeats nothing", c);
        return -1;
    }
    if (c == '{') {
        int mn, mx;
        const uint8_t *save = ps->p;
        if (parse_braces(ps, &mn, &mx)) {
            ps->p = save;
            pfail(ps, "a repeat {...} repeats nothing");
            return -1;
        }
    }
    if (c == '^') {
        pfail(ps, "'^' is supported only at the start of the pattern or of a top-level "
                  "alternative");
        return -1;
    }
    if (c == '$') {
        pfail(ps, "'$' is supported only at the end of the pattern or of a top-level "
                  "alternative");
        return -1;
    }
    if (c == ')' || c == '|') {
        *none = true;
        return -1;
    }
    if (c == ']' || c == '}') { /* literal, as the web grammar reads them */
        ps->p++;
        return single_node(ps, c, c);
    }
    const int32_t cp = next_cp(ps);
    if (cp < 0) return -1;
    return single_node(ps, (uint32_t)cp, (uint32_t)cp);
}

/* A sequence up to ')' or '|' or the end; at the top level, a trailing '$' sets *anchor_end. */
static int parse_cat(parser_t *ps, bool *anchor_end)
{
    int seq = new_anode(ps, A_EMPTY, 0, 0);
    while (ps->p < ps->end) {
        if (anchor_end && *ps->p == '$' && (ps->p + 1 == ps->end || ps->p[1] == '|')) {
            ps->p++;
            *anchor_end = true;
            break;
        }
        bool none;
        int x = parse_atom(ps, &none);
        if (none) break;
        if (x < 0) return -1;
        for (;;) { /* quantifiers */
            int mn, mx;
            if (ps->p >= ps->end) break;
            const uint8_t q = *ps->p;
            if (q == '*' || q == '+' || q == '?') {
                ps->p++;
                mn = q == '+';
                mx = q == '?' ? 1 : -1;
            } else if (q == '{' && parse_braces(ps, &mn, &mx)) {
                if (ps->failed) return -1;
            } else {
                break;
            }
            if (ps->p < ps->end && *ps->p == '?') ps->p++; /* lazy: the same strings */
            x = new_anode(ps, A_REPEAT, x, 0);
            ps->nodes[x].min = mn;
            ps->nodes[x].max = mx;
        }
        seq = new_anode(ps, A_CAT, seq, x);
    }
    return ps->failed ? -1 : seq;
}

static int parse_alt(parser_t *ps)
{
    int x = parse_cat(ps, NULL);
    while (x >= 0 && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        const int y = parse_cat(ps, NULL);
        if (y < 0) return -1;
        x = new_anode(ps, A_ALT, x, y);
    }
    return x;
}

static int any_star(parser_t *ps)
{
    const int any = single_node(ps, 0, CP_MAX);
    const int r = new_anode(ps, A_REPEAT, any, 0);
    ps->nodes[r].min = 0;
    ps->nodes[r].max = -1;
    return r;
}

/* The whole pattern with its search meaning: each top-level alternative not anchored at an
 * end gets "any string" on that side (anchored: none does, the whole string must match). */
static int parse_pattern(parser_t *ps, bool anchored)
{
    int all = -1;
    for (;;) {
        bool start = false, end = false;
        if (ps->p < ps->end && *ps->p == '^') {
            ps->p++;
            start = true;
        }
        int x = parse_cat(ps, &end);
        if (x < 0) return -1;
        if (!start && !anchored) x = new_anode(ps, A_CAT, any_star(ps), x);
        if (!end && !anchored) x = new_anode(ps, A_CAT, x, any_star(ps));
        all = all < 0 ? x : new_anode(ps, A_ALT, all, x);
        if (ps->p >= ps->end) return all;
        if (*ps->p == ')') {
            pfail(ps, "a ')' without its '('");
            return -1;
        }
        ps->p++; /* '|' */
    }
}

/* ---- NFA ---------------------------------------------------------------------------------- */

typedef struct {
    int from, to;
    uint8_t lo, hi;
    bool eps;
} edge_t;

typedef struct {
    int n_states;
    edge_t *e;
    int n_e, cap_e;
    bool too_big;
    int *first, *adj; /* CSR: the edges out of state s are adj[first[s] .. first[s+1]) */
} nfa_t;

static int nfa_state(nfa_t *a)
{
    if (a->n_states >= MAX_NFA_STATES) a->too_big = true;
    return a->too_big ? 0 : a->n_states++;
}

static void nfa_edge(nfa_t *a, int from, int to, uint8_t lo, uint8_t hi, bool eps)
{
    if (a->too_big) return;
    if (a->n_e == a->cap_e) {
        a->cap_e = a->cap_e ? 2 * a->cap_e : 256;
        a->e = bt_realloc_or_die(a->e, (size_t)a->cap_e * sizeof *a->e);
    }
    a->e[a->n_e++] = (edge_t){from, to, lo, hi, eps};
}

static int utf8_encode(uint32_t cp, uint8_t *b)
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | cp >> 18);
    b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Edges from `from` to `to` for the code points lo..hi (no surrogates among them): split until
 * each piece is a sequence of byte ranges, every byte of one range free to pair with every byte
 * of the others. */
static void nfa_cp_range(nfa_t *a, int from, int to, uint32_t lo, uint32_t hi)
{
    static const uint32_t len_max[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= len_max[i] && hi > len_max[i]) {
            nfa_cp_range(a, from, to, lo, len_max[i]);
            nfa_cp_range(a, from, to, len_max[i] + 1, hi);
            return;
        }
    uint8_t bl[4], bh[4];
    const int n = utf8_encode(lo, bl);
    utf8_encode(hi, bh);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                nfa_cp_range(a, from, to, lo, lo | m);
                nfa_cp_range(a, from, to, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                nfa_cp_range(a, from, to, lo, (hi & ~m) - 1);
                nfa_cp_range(a, from, to, hi & ~m, hi);
                return;
            }
        }
    }
    int s = from;
    for (int i = 0; i < n; i++) {
        const int t = i == n - 1 ? to : nfa_state(a);
        nfa_edge(a, s, t, bl[i], bh[i], false);
        s = t;
    }
}

/* The strings of node x, from state `from`; returns the state they end in. */
static int nfa_build(nfa_t *a, const parser_t *ps, int x, int from)
{
    if (a->too_big) return 0;
    const anode_t *n = &ps->nodes[x];
    switch (n->op) {
    case A_EMPTY:
        return from;
    case A_CLASS: {
        const int to = nfa_state(a);
        for (int i = 0; i < n->b; i++)
            nfa_cp_range(a, from, to, ps->ranges[n->a + i].lo, ps->ranges[n->a + i].hi);
        return to;
    }
    case A_CAT:
        return nfa_build(a, ps, n->b, nfa_build(a, ps, n->a, from));
    case A_ALT: {
        const int to = nfa_state(a);
        nfa_edge(a, nfa_build(a, ps, n->a, from), to, 0, 0, true);
        nfa_edge(a, nfa_build(a, ps, n->b, from), to, 0, 0, true);
        return to;
    }
    default:
        break;
    }
    /* A_REPEAT: min copies, then max - min optional ones (or a loop) */
    int cur = from;
    for (int i = 0; i < n->min && !a->too_big; i++)
        cur = nfa_build(a, ps, n->a, cur);
    if (n->max < 0) {
        const int loop = nfa_state(a);
        nfa_edge(a, cur, loop, 0, 0, true);
        nfa_edge(a, nfa_build(a, ps, n->a, loop), loop, 0, 0, true);
        return loop;
    }
    const int to = nfa_state(a);
    for (int i = n->min; i < n->max && !a->too_big; i++) {
        nfa_edge(a, cur, to, 0, 0, true);
        cur = nfa_build(a, ps, n->a, cur);
    }
    nfa_edge(a, cur, to, 0, 0, true);
    return to;
}

static void nfa_index(nfa_t *a)
{
    a->first = bt_calloc_or_die((size_t)a->n_states + 1, sizeof *a->first);
    a->adj = bt_malloc_or_die(((size_t)a->n_e + 1) * sizeof *a->adj);
    for (int i = 0; i < a->n_e; i++)
        a->first[a->e[i].from + 1]++;
    for (int s = 0; s < a->n_states; s++)
        a->first[s + 1] += a->first[s];
    int *fill = bt_malloc_or_die(((size_t)a->n_states + 1) * sizeof *fill);
    memcpy(fill, a->first, ((size_t)a->n_states + 1) * sizeof *fill);
    for (int i = 0; i < a->n_e; i++)
        a->adj[fill[a->e[i].from]++] = i;
    free(fill);
}

/* ---- DFA ---------------------------------------------------------------------------------- */

typedef struct {
    const nfa_t *a;
    int *mark; /* an NFA state's generation when last added to the set being built */
    int gen;
    int *stack;
    /* the DFA's states as sorted NFA-state sets, in one pool; a hash table over them */
    int *pool;
    size_t n_pool, cap_pool;
    size_t *set_at;
    int *set_len;
    int n_sets;
    int *table; /* 1 + set index; 0: empty */
    size_t table_size;
    long long work; /* edges looked at: the construction stops past MAX_WORK */
} subset_t;

static int int_cmp(const void *x, const void *y)
{
    const int a = *(const int *)x, b = *(const int *)y;
    return a < b ? -1 : a > b;
}

/* set (n states, marked with gen) grown by epsilon edges; returns its size */
static int closure(subset_t *ss, int *set, int n)
{
    int top = 0;
    for (int i = 0; i < n; i++)
        ss->stack[top++] = set[i];
    while (top) {
        const int s = ss->stack[--top];
        ss->work += ss->a->first[s + 1] - ss->a->first[s];
        for (int k = ss->a->first[s]; k < ss->a->first[s + 1]; k++) {
            const edge_t *e = &ss->a->e[ss->a->adj[k]];
            if (!e->eps || ss->mark[e->to] == ss->gen) continue;
            ss->mark[e->to] = ss->gen;
            set[n++] = e->to;
            ss->stack[top++] = e->to;
        }
    }
    qsort(set, (size_t)n, sizeof *set, int_cmp);
    ss->work += n; /* (the sort, the hash, the comparison) */
    return n;
}

static uint64_t set_hash(const int *set, int n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)set[i]) * 1099511628211ull;
    return h;
}

/* The DFA state of set, added if new; -1: more than the cap. */
static int set_id(subset_t *ss, const int *set, int n)
{
    const uint64_t h = set_hash(set, n);
    size_t i = h % ss->table_size;
    for (; ss->table[i]; i = (i + 1) % ss->table_size) {
        const int id = ss->table[i] - 1;
        if (ss->set_len[id] == n &&
            !memcmp(ss->pool + ss->set_at[id], set, (size_t)n * sizeof *set))
            return id;
    }
    if (ss->n_sets >= BT_REGEX_MAX_STATES) return -1;
    if (ss->n_pool + (size_t)n > ss->cap_pool) {
        while (ss->n_pool + (size_t)n > ss->cap_pool)
            ss->cap_pool = ss->cap_pool ? 2 * ss->cap_pool : 4096;
        ss->pool = bt_realloc_or_die(ss->pool, ss->cap_pool * sizeof *ss->pool);
    }
    if (n) memcpy(ss->pool + ss->n_pool, set, (size_t)n * sizeof *set); /* (dead: n 0) */
    ss->set_at[ss->n_sets] = ss->n_pool;
    ss->set_len[ss->n_sets] = n;
    ss->n_pool += (size_t)n;
    ss->table[i] = ss->n_sets + 1;
    return ss->n_sets++;
}

/* The DFA of the NFA from state start, accepting in state match (state 0: the empty set);
 * NULL if it needs more than BT_REGEX_MAX_STATES (*too_slow false) or more than MAX_WORK steps
 * (true). */
static bt_regex_t *determinize(const nfa_t *a, int start, int match, bool *too_slow)
{
    subset_t ss = {.a = a, .table_size = 2 * BT_REGEX_MAX_STATES + 1};
    ss.mark = bt_calloc_or_die((size_t)a->n_states, sizeof *ss.mark);
    ss.stack = bt_malloc_or_die((size_t)a->n_states * sizeof *ss.stack);
    ss.set_at = bt_malloc_or_die(BT_REGEX_MAX_STATES * sizeof *ss.set_at);
    ss.set_len = bt_malloc_or_die(BT_REGEX_MAX_STATES * sizeof *ss.set_len);
    ss.table = bt_calloc_or_die(ss.table_size, sizeof *ss.table);
    uint16_t *next = NULL; /* [rows][256], grown as states are found */
    int rows = 0;
    int *set = bt_malloc_or_die((size_t)a->n_states * sizeof *set);
    bool ok = true;

    set_id(&ss, set, 0); /* 0: dead */
    ss.gen++;
    set[0] = start;
    ss.mark[start] = ss.gen;
    set_id(&ss, set, closure(&ss, set, 1));
    for (int d = 1; d < ss.n_sets && ok && ss.work <= MAX_WORK; d++) { /* (n_sets grows) */
        if (d >= rows) {
            const int grow = rows ? 2 * rows : 64;
            next = bt_realloc_or_die(next, (size_t)grow * 256 * sizeof *next);
            memset(next + (size_t)rows * 256, 0, (size_t)(grow - rows) * 256 * sizeof *next);
            rows = grow;
        }
        /* the byte intervals on which no edge out of d starts or ends */
        bool cut[257] = {false};
        cut[0] = cut[256] = true;
        const int *members = ss.pool + ss.set_at[d];
        const int n_members = ss.set_len[d];
        for (int i = 0; i < n_members; i++)
            for (int k = a->first[members[i]]; k < a->first[members[i] + 1]; k++) {
                const edge_t *e = &a->e[a->adj[k]];
                if (e->eps) continue;
                cut[e->lo] = true;
                cut[e->hi + 1] = true;
            }
        for (int lo = 0; lo < 256 && ok;) {
            int hi = lo + 1;
            while (!cut[hi])
                hi++;
            ss.gen++;
            int n = 0;
            members = ss.pool + ss.set_at[d]; /* (the pool may have moved) */
            for (int i = 0; i < n_members; i++) {
                ss.work += a->first[members[i] + 1] - a->first[members[i]];
                for (int k = a->first[members[i]]; k < a->first[members[i] + 1]; k++) {
                    const edge_t *e = &a->e[a->adj[k]];
                    if (e->eps || e->lo > lo || e->hi < lo || ss.mark[e->to] == ss.gen) continue;
                    ss.mark[e->to] = ss.gen;
                    set[n++] = e->to;
                }
            }
            const int id = n ? set_id(&ss, set, closure(&ss, set, n)) : 0;
            if (id < 0) ok = false;
            for (int b = lo; b < hi && ok; b++)
                next[(size_t)d * 256 + (size_t)b] = (uint16_t)id;
            lo = hi;
        }
    }
    bt_regex_t *re = NULL;
    *too_slow = ss.work > MAX_WORK;
    if (ok && !*too_slow) {
        re = bt_calloc_or_die(1, sizeof *re);
        re->n_states = ss.n_sets;
        re->start = 1;
        if (rows < ss.n_sets) { /* (states found last have no rows yet: all dead) */
            next = bt_realloc_or_die(next, (size_t)ss.n_sets * 256 * sizeof *next);
            memset(next + (size_t)rows * 256, 0, (size_t)(ss.n_sets - rows) * 256 * sizeof *next);
        }
        re->next = bt_realloc_or_die(next, (size_t)ss.n_sets * 256 * sizeof *next);
        next = NULL;
        re->accept = bt_calloc_or_die((size_t)ss.n_sets, 1);
        for (int d = 1; d < ss.n_sets; d++) {
            const int *m = ss.pool + ss.set_at[d];
            re->accept[d] = bsearch(&match, m, (size_t)ss.set_len[d], sizeof *m, int_cmp) != NULL;
        }
    }
    free(next);
    free(set);
    free(ss.mark);
    free(ss.stack);
    free(ss.pool);
    free(ss.set_at);
    free(ss.set_len);
    free(ss.table);
    return re;
}

/* The bytes every text a pattern holds can hold: from 0x20 up, tab, newline, carriage return
 * (a JSON string also takes \b and \f as escapes, a tool's raw parameter not). */
static bool producible(int b)
{
    return b >= 0x20 || b == '\t' || b == '\n' || b == '\r';
}

/* Keeps the states from which acceptance is reachable through producible bytes, numbered
 * afresh (dead 0); false if the start is not among them. */
static bool prune(bt_regex_t *re)
{
    const int n = re->n_states;
    /* reverse edges, counted then filled */
    int *first = bt_calloc_or_die((size_t)n + 1, sizeof *first);
    for (int s = 1; s < n; s++)
        for (int b = 0; b < 256; b++)
            if (producible(b) && re->next[s * 256 + b]) first[re->next[s * 256 + b] + 1]++;
    for (int s = 0; s < n; s++)
        first[s + 1] += first[s];
    int *from = bt_malloc_or_die(((size_t)first[n] + 1) * sizeof *from);
    int *fill = bt_malloc_or_die(((size_t)n + 1) * sizeof *fill);
    memcpy(fill, first, ((size_t)n + 1) * sizeof *fill);
    for (int s = 1; s < n; s++)
        for (int b = 0; b < 256; b++)
            if (producible(b) && re->next[s * 256 + b]) from[fill[re->next[s * 256 + b]]++] = s;
    uint8_t *live = bt_calloc_or_die((size_t)n, 1);
    int *queue = bt_malloc_or_die((size_t)n * sizeof *queue);
    int qh = 0, qt = 0;
    for (int s = 1; s < n; s++)
        if (re->accept[s]) {
            live[s] = 1;
            queue[qt++] = s;
        }
    while (qh < qt) {
        const int t = queue[qh++];
        for (int k = first[t]; k < first[t + 1]; k++)
            if (!live[from[k]]) {
                live[from[k]] = 1;
                queue[qt++] = from[k];
            }
    }
    const bool ok = live[re->start];
    int *id = bt_calloc_or_die((size_t)n, sizeof *id);
    int m = 1;
    for (int s = 1; s < n; s++)
        if (live[s]) id[s] = m++;
    uint16_t *next = bt_calloc_or_die((size_t)m * 256, sizeof *next);
    uint8_t *accept = bt_calloc_or_die((size_t)m, 1);
    for (int s = 1; s < n; s++) {
        if (!live[s]) continue;
        accept[id[s]] = re->accept[s];
        for (int b = 0; b < 256; b++)
            next[(size_t)id[s] * 256 + (size_t)b] = (uint16_t)id[re->next[s * 256 + b]];
    }
    re->start = (uint16_t)id[re->start];
    free(re->next);
    free(re->accept);
    re->next = next;
    re->accept = accept;
    re->n_states = m;
    free(first);
    free(from);
    free(fill);
    free(live);
    free(queue);
    free(id);
    return ok;
}

bt_status_t bt_regex_compile(const char *pattern, size_t len, bt_regex_mode_t mode,
                             bt_regex_t **re_p, char *err, size_t errlen)
{
    *re_p = NULL;
    parser_t ps = {.p = (const uint8_t *)pattern,
                   .end = (const uint8_t *)pattern + len,
                   .err = err,
                   .errlen = errlen};
    const int root = parse_pattern(&ps, mode == BT_REGEX_WHOLE);
    if (root < 0 || ps.failed) {
        pfail(&ps, "cannot be read"); /* (kept only if nothing was said) */
        free(ps.nodes);
        free(ps.ranges);
        return BT_ERR_BAD_REQUEST;
    }
    nfa_t a = {0};
    const int start = nfa_state(&a);
    const int match = nfa_build(&a, &ps, root, start);
    free(ps.nodes);
    free(ps.ranges);
    bt_regex_t *re = NULL;
    if (a.too_big) {
        pfail(&ps, "too large (more than %d automaton states with its repeats written out)",
              MAX_NFA_STATES);
    } else {
        nfa_index(&a);
        bool too_slow;
        re = determinize(&a, start, match, &too_slow);
        if (!re && too_slow)
            pfail(&ps,
                  "too complex to compile within its budget (%lld steps; a large alternation "
                  "not anchored with ^, or a long repeat of a broad class, can be)",
                  MAX_WORK);
        else if (!re)
            pfail(&ps,
                  "needs more than %d automaton states (a long repeat of a broad class not "
                  "anchored with ^ and $, or counted repeats {m,n} of classes that overlap "
                  "what follows them, can)",
                  BT_REGEX_MAX_STATES);
        else if (!prune(re))
            pfail(&ps, "no string matches it that can be written (control characters other than "
                       "tab, newline and CR cannot be)");
    }
    free(a.e);
    free(a.first);
    free(a.adj);
    if (ps.failed) {
        bt_regex_free(re);
        return BT_ERR_BAD_REQUEST;
    }
    *re_p = re;
    return BT_OK;
}

/* The product of re with a character count: state (q, n), n the characters taken so far
 * (a character counted at its first byte: any byte but a UTF-8 continuation), capped at hi, or
 * held at lo once reached when there is no hi. Built from the start through the states the
 * bytes reach, numbered by a hash of (q, n). */
bt_status_t bt_regex_limit_length(bt_regex_t *re, long lo, long hi, int max_states, char *err,
                                  size_t errlen)
{
    if (lo < 0 || (hi >= 0 && hi < lo)) {
        snprintf(err, errlen, "length bounds %ld..%ld cannot hold", lo, hi);
        return BT_ERR_INVALID_ARG;
    }
    if (max_states < 2) max_states = 2;         /* (the dead state and the start: refused below) */
    if (max_states > 65535) max_states = 65535; /* (states are 16-bit) */
    const uint64_t span = (uint64_t)(hi >= 0 ? hi : lo) + 1;
    size_t cap = 16;
    while (cap < 2 * (size_t)max_states)
        cap *= 2;
    uint64_t *key = bt_malloc_or_die(cap * sizeof *key); /* (q * span + n) + 1; 0: empty */
    uint16_t *val = bt_malloc_or_die(cap * sizeof *val);
    memset(key, 0, cap * sizeof *key);
    int *sq = bt_malloc_or_die(((size_t)max_states + 1) * sizeof *sq);
    long *sn = bt_malloc_or_die(((size_t)max_states + 1) * sizeof *sn);
    uint16_t *next = bt_calloc_or_die(((size_t)max_states + 1) * 256, sizeof *next);
    uint8_t *accept = bt_calloc_or_die((size_t)max_states + 1, 1);
    int n_states = 1; /* state 0: dead */
    bool full = false;
#define LL_STATE(q_, n_, out_)                                                                     \
    do {                                                                                           \
        const uint64_t k_ = (uint64_t)(q_)*span + (uint64_t)(n_) + 1;                              \
        size_t h_ = (size_t)((k_ * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);                      \
        while (key[h_] && key[h_] != k_)                                                           \
            h_ = (h_ + 1) & (cap - 1);                                                             \
        if (key[h_]) {                                                                             \
            (out_) = val[h_];                                                                      \
        } else if (n_states >= max_states) {                                                       \
            full = true;                                                                           \
            (out_) = 0;                                                                            \
        } else {                                                                                   \
            key[h_] = k_;                                                                          \
            val[h_] = (uint16_t)n_states;                                                          \
            sq[n_states] = (q_);                                                                   \
            sn[n_states] = (n_);                                                                   \
            (out_) = n_states++;                                                                   \
        }                                                                                          \
    } while (0)
    int first;
    LL_STATE(re->start, 0L, first);
    for (int s = first; s < n_states && !full; s++) { /* (the states in the order found) */
        const int q = sq[s];
        const long n = sn[s];
        accept[s] = re->accept[q] && n >= lo;
        for (int b = 0; b < 256 && !full; b++) {
            const int q2 = re->next[(size_t)q * 256 + (size_t)b];
            if (!q2) continue;
            long n2 = n + ((b & 0xc0) != 0x80);
            if (hi >= 0 && n2 > hi) continue;
            if (hi < 0 && n2 > lo) n2 = lo;
            int t;
            LL_STATE(q2, n2, t);
            next[(size_t)s * 256 + (size_t)b] = (uint16_t)t;
        }
    }
#undef LL_STATE
    free(key);
    free(val);
    free(sq);
    free(sn);
    if (full) {
        free(next);
        free(accept);
        snprintf(err, errlen,
                 "with its length bounds needs more than %d automaton states (a smaller "
                 "maxLength, or the length in the pattern: {min,max})",
                 max_states);
        return BT_ERR_INVALID_ARG;
    }
    bt_regex_t product = {
        .n_states = n_states, .start = (uint16_t)first, .next = next, .accept = accept};
    if (!prune(&product)) {
        free(product.next);
        free(product.accept);
        if (hi >= 0)
            snprintf(err, errlen, "matches no string of %ld..%ld characters", lo, hi);
        else
            snprintf(err, errlen, "matches no string of %ld characters or more", lo);
        return BT_ERR_INVALID_ARG;
    }
    free(re->next);
    free(re->accept);
    *re = product;
    return BT_OK;
}

void bt_regex_free(bt_regex_t *re)
{
    if (!re) return;
    free(re->next);
    free(re->accept);
    free(re);
}

bool bt_regex_accepts(const bt_regex_t *re, const char *s, size_t len)
{
    uint16_t st = re->start;
    for (size_t i = 0; i < len && st; i++)
        st = re->next[(size_t)st * 256 + (uint8_t)s[i]];
    return st && re->accept[st];
}

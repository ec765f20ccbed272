/* The JSON constraint of grammar.h: schemas compiled into nodes, a byte-level pushdown automaton
 * whose frames name them, a trie of the vocabulary's byte strings, and a cache of the masks by
 * automaton state for each compiled schema. */
#include "common/text/grammar.h"

#include "common/alloc.h"
#include "common/text/regex.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek's tool-call block, as common/text/chat.c renders it and parsers.c reads it ("D" is
 * the fullwidth-barred DSML word, followed by a space):
 *   <D calls>\n<D invoke name="NAME">\n
 *   <D parameter name="P" string="true">raw text</D parameter>\n
 *   <D parameter name="Q" string="false">JSON</D parameter>\n
 *   </D invoke>\n<D invoke name=...>...</D invoke>\n</D calls> */
#define DSML                                                                                       \
    "\xef\xbd\x9c"                                                                                 \
    "DSML"                                                                                         \
    "\xef\xbd\x9c "
enum { D_OPEN, D_NAME_END, D_STR_TRUE, D_STR_FALSE, D_PARAM_CLOSE, D_NEWLINE, D_STR_ANY };
static const char *const dsml_lit[] = {"<" DSML "calls>\n<" DSML "invoke name=\"",
                                       ">\n",
                                       " string=\"true\">",
                                       " string=\"false\">",
                                       "</" DSML "parameter>\n",
                                       "\n",
                                       " string=\""}; /* (D_STR_ANY: then true or false) */
static const char raw_end[] = "</" DSML "parameter>"; /* ('<' only at its start) */
/* What ends a parameter's value for the parser (parsers.c), wherever it stands: a JSON value's
 * strings may not hold it (its bars can be written \uff5c). */
static const char param_end[] = "/" DSML "parameter";
static const char *const choice_text[2][2] = {{"<" DSML "parameter name=", "</" DSML "invoke>"},
                                              {"\n<" DSML "invoke name=\"", "\n</" DSML "calls>"}};

/* ---- compiled schemas --------------------------------------------------------------------- */

enum {
    K_ANY,
    K_OBJECT,
    K_ARRAY,
    K_STRING,
    K_NUMBER,
    K_INTEGER,
    K_BOOLEAN,
    K_NULL,
    K_ENUM,
    K_UNION,
    K_OBJUNION, /* anyOf of described objects: told apart by their first key, or by the
                 * value of a first key they share (a discriminator: string values, or values
                 * that start apart); first keys counted after the properties all of them
                 * start with alike (prefix) */
    K_KEYTYPE   /* an object union's shared first key whose values start apart (a string, a
                 * number, an object...): n values (refs_list from first), then each one's
                 * term, 64 * branch + key; read as the branch its value's first byte says */
};
enum { NODE_ANY = 0, NODE_ANY_OBJECT = 1, NODE_ANY_ARRAY = 2 }; /* in every schema */
enum { FREE_PARAMS = 16 }; /* parameters a call of a tool that lists none may have */

/* A bounded number's value in units of 10^-NUM_FRAC (it has at most that many fraction digits
 * and an integer part within int64): exact, so a bound sits where the schema's text puts it. */
typedef __int128 wide_t;
enum { NUM_FRAC = 18 };

typedef struct {
    uint8_t kind;
    bool generic;   /* object: any keys, any values (no "properties") */
    uint8_t n;      /* object: properties; union: branches */
    uint16_t first; /* object: its first property in props[]; union: first branch */
    uint16_t lit;   /* object: the keys' literal trie; enum: the values' (root nodes); object
                     * union: the keys its branches may start with, term 64 * branch + key */
    uint16_t items; /* array: the items' node; object without properties: its values'; object
                     * union: its discriminator's values (an enum, term 64 * branch + key, or a
                     * K_KEYTYPE), 0 */
    int16_t min_items, max_items; /* array; object: its key count's (minProperties ..); max -1:
                                   * none. A described object counts its keys (frame_t.n) only
                                   * where they may bind. */
    bool bounded;    /* integer: its value in lo..hi; number: in nlo..nhi; string: its length */
    bool empty_ok;   /* object union: some branch may end after the prefix (be {} without) */
    uint8_t prefix;  /* object union: the properties every branch starts with alike (required,
                      * the same key and schema), read as its first branch's */
    uint8_t rx;      /* string: 1 + its pattern's index in rx[]; 0: none */
    int64_t lo, hi;  /* (a string's in characters, hi -1: none) */
    wide_t nlo, nhi; /* a number's, in units of 10^-NUM_FRAC */
    wide_t mult;     /* integer or number: its value a multiple of this (a number's in units);
                      * 0: any */
    uint64_t required;            /* object: bit j = property j is required */
    uint32_t starts[8];           /* the bytes a value of this node may start with */
} snode_t;

/* A literal trie: object keys as JSON strings (quotes included), enum values as compact JSON. */
typedef struct {
    uint16_t child, sibling; /* 0: none (the root of a trie is nobody's child) */
    uint8_t byte;
    int16_t term;   /* the key's property index, or the enum value's; -1: none */
    uint64_t below; /* keys: the properties whose keys pass through here */
} lnode_t;

typedef struct cache_entry cache_entry_t;

typedef struct bt_grammar_rules {
    struct bt_grammar_rules *next; /* in the vocabulary's list */
    char *text;                    /* the schema as sent; NULL: any object */
    size_t text_len;
    int refs;
    uint64_t last_use;
    snode_t *nodes;
    int n_nodes, cap_nodes;
    uint16_t *refs_list; /* props (object properties' nodes) and union branches */
    int n_list, cap_list;
    lnode_t *lit;
    int n_lit, cap_lit;
    uint16_t root;
    /* tool calls (DeepSeek's DSML block) instead of a JSON object */
    bool tools, one;                    /* one: exactly one call (a named tool_choice) */
    bool regex;                         /* a regex constraint: rx[0] is the output's DFA */
    uint16_t names, choice_a, choice_b; /* literal tries: the tools' names, the two choices */
    uint16_t tools_first;               /* the tools' parameter objects, in refs_list */
    bt_regex_t **rx;                    /* the strings' patterns (and formats as patterns) */
    int n_rx, rx_states;
    cache_entry_t *cache;
} rules_t;

/* A pattern or format compiled for a string node: its text (the schema's, or the formats
 * table's, alive through the compile) and the node's length bounds the DFA took in */
typedef struct {
    const char *text;
    bool bounded;
    int64_t lo, hi;
    uint8_t rx; /* 1 + its index in rx[] */
} rx_memo_t;

typedef struct {
    const cJSON *root;
    const cJSON **memo_at; /* $ref targets compiled, and their nodes */
    uint16_t *memo_node;
    int n_memo, cap_memo;
    rx_memo_t *rx_memo; /* the patterns this compile added to rx[] */
    int n_rx_memo;
    char *err;
    size_t errlen;
    bool failed;
    bool tools; /* a tool-call spec: string parameters are written raw */
} compile_t;

static void cfail(compile_t *cc, const char *fmt, ...)
{
    if (cc->failed) return;
    cc->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cc->err, cc->errlen, fmt, ap);
    va_end(ap);
}

static int new_snode(rules_t *r, compile_t *cc, uint8_t kind)
{
    if (r->n_nodes >= 65535) {
        cfail(cc, "json_schema: too large (more than 65535 nodes)");
        return -1;
    }
    if (r->n_nodes == r->cap_nodes) {
        r->cap_nodes = r->cap_nodes ? r->cap_nodes * 2 : 16;
        r->nodes = bt_realloc_or_die(r->nodes, (size_t)r->cap_nodes * sizeof *r->nodes);
    }
    r->nodes[r->n_nodes] = (snode_t){.kind = kind, .max_items = -1};
    return r->n_nodes++;
}

static int new_lnode(rules_t *r, compile_t *cc, uint8_t byte)
{
    if (r->n_lit >= 65535) {
        cfail(cc, "json_schema: too large (its keys and enums pass 65535 bytes)");
        return 0;
    }
    if (r->n_lit == r->cap_lit) {
        r->cap_lit = r->cap_lit ? r->cap_lit * 2 : 64;
        r->lit = bt_realloc_or_die(r->lit, (size_t)r->cap_lit * sizeof *r->lit);
    }
    r->lit[r->n_lit] = (lnode_t){0, 0, byte, -1, 0};
    return r->n_lit++;
}

static uint16_t lit_find(const rules_t *r, uint16_t n, uint8_t c)
{
    for (uint16_t k = r->lit[n].child; k; k = r->lit[k].sibling)
        if (r->lit[k].byte == c) return k;
    return 0;
}

/* Adds text under literal root `root` ending in term; false when it is there already. */
static bool lit_insert(rules_t *r, compile_t *cc, uint16_t root, const char *text, int16_t term,
                       uint64_t below)
{
    uint16_t n = root;
    for (const char *p = text; *p; p++) {
        uint16_t k = lit_find(r, n, (uint8_t)*p);
        if (!k) {
            k = (uint16_t)new_lnode(r, cc, (uint8_t)*p);
            if (cc->failed) return false;
            r->lit[k].sibling = r->lit[n].child;
            r->lit[n].child = k;
        }
        r->lit[k].below |= below;
        n = k;
    }
    if (r->lit[n].term >= 0) return false;
    r->lit[n].term = term;
    return true;
}

/* one entry onto the properties' and branches' list; false (compilation failed) past 65535
 * entries, where a node's first (16 bits) could no longer say where its own begin */
static bool list_push(rules_t *r, compile_t *cc, uint16_t v)
{
    if (r->n_list >= 65535) {
        cfail(cc, "json_schema: too large (more than 65535 properties and union branches)");
        return false;
    }
    if (r->n_list == r->cap_list) {
        r->cap_list = r->cap_list ? r->cap_list * 2 : 32;
        r->refs_list = bt_realloc_or_die(r->refs_list, (size_t)r->cap_list * sizeof *r->refs_list);
    }
    r->refs_list[r->n_list++] = v;
    return true;
}

static void set_bit(uint32_t *set, uint8_t c)
{
    set[c >> 5] |= 1u << (c & 31);
}

/* set into acc (start byte sets); false where they had a byte in common (a union's branches,
 * or a shared key's values, that the first byte would not tell apart) */
static bool starts_join(uint32_t *acc, const uint32_t *set)
{
    bool apart = true;
    for (int w = 0; w < 8; w++) {
        apart = apart && !(acc[w] & set[w]);
        acc[w] |= set[w];
    }
    return apart;
}

static bool has_bit(const uint32_t *set, uint8_t c)
{
    return (set[c >> 5] >> (c & 31)) & 1u;
}

static void starts_of_kind(uint8_t kind, uint32_t *set)
{
    const char *s = kind == K_OBJECT                        ? "{"
                    : kind == K_ARRAY                       ? "["
                    : kind == K_STRING                      ? "\""
                    : kind == K_NUMBER || kind == K_INTEGER ? "-0123456789"
                    : kind == K_BOOLEAN                     ? "tf"
                    : kind == K_NULL                        ? "n"
                                                            : "{[\"-0123456789tfn";
    for (; *s; s++)
        set_bit(set, (uint8_t)*s);
}

static int compile_node(rules_t *r, compile_t *cc, const cJSON *s, int depth);

static const char *const annotations[] = {"title",    "description", "$schema",   "$id",
                                          "default",  "examples",    "$comment",  "strict",
                                          "readOnly", "writeOnly",   "deprecated"};
static const char *const understood[] = {
    "type",  "properties",  "required",      "additionalProperties",
    "items", "minItems",    "maxItems",      "enum",
    "const", "anyOf",       "oneOf",         "$ref",
    "$defs", "definitions", "minProperties", "maxProperties"};
static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                     "multipleOf"};
static const char *const lengths[] = {"minLength", "maxLength"};
static const char *const shapes[] = {"pattern", "format"};

/* The formats kept to, as patterns (RFC 3339 dates and times, and its durations (appendix A:
 * P then years, months, days, a T and hours, minutes, seconds, each optional but in that order,
 * none skipped between two given, at least one after P and after T; or weeks alone), RFC 1123
 * host names, dotted IPv4, RFC 4291's IPv6 text (every :: form, an IPv4 tail; no zone), RFC
 * 4122's textual UUID, e-mail addresses as RFC 5321's dot-atom@domain, an absolute URI as RFC
 * 3986 spells its characters: a scheme, ':', then unreserved, reserved or %-escaped ones; and
 * a URI reference: such a URI, or the same characters without a scheme, where no ':' comes
 * before the first '/', '?' or '#' (RFC 3986's path-noscheme)). */
#define LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define DATE "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])"
#define TIME                                                                                       \
    "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d{1,9})?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
#define OCTET "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define ATOM "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
#define H16 "[0-9a-fA-F]{1,4}"
#define V4 OCTET "(\\." OCTET "){3}"
#define DUR_TIME "T(\\d+H(\\d+M(\\d+S)?)?|\\d+M(\\d+S)?|\\d+S)"
#define URI_CH "([A-Za-z0-9._~!$&'()*+,;=:@/?#\\[\\]-]|%[0-9A-Fa-f]{2})"
#define URI_NC "([A-Za-z0-9._~!$&'()*+,;=@\\[\\]-]|%[0-9A-Fa-f]{2})"
static const struct {
    const char *name, *pattern;
} formats[] = {
    {"date", "^" DATE "$"},
    {"time", "^" TIME "$"},
    {"date-time", "^" DATE "[Tt]" TIME "$"},
    {"email", "^" ATOM "(\\." ATOM ")*@" LABEL "(\\." LABEL ")+$"},
    {"hostname", "^" LABEL "(\\." LABEL ")*$"},
    {"ipv4", "^(" OCTET "\\.){3}" OCTET "$"},
    {"ipv6", "^((" H16 ":){7}" H16 "|(" H16 ":){1,7}:|(" H16 ":){1,6}:" H16 "|(" H16 ":){1,5}(:" H16
             "){1,2}|(" H16 ":){1,4}(:" H16 "){1,3}|(" H16 ":){1,3}(:" H16 "){1,4}|(" H16
             ":){1,2}(:" H16 "){1,5}|" H16 ":(:" H16 "){1,6}|:((:" H16 "){1,7}|:)|(" H16 ":){6}" V4
             "|::(" H16 ":){0,5}" V4 "|" H16 "::(" H16 ":){0,4}" V4 "|(" H16 ":){1}" H16 "::(" H16
             ":){0,3}" V4 "|(" H16 ":){2}" H16 "::(" H16 ":){0,2}" V4 "|(" H16 ":){3}" H16 "::(" H16
             ":)?" V4 "|(" H16 ":){4}" H16 "::" V4 ")$"},
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:" URI_CH "*$"},
    {"uri-reference", "^([A-Za-z][A-Za-z0-9+.-]*:" URI_CH "*|" URI_NC "*([/?#]" URI_CH "*)?)$"},
    {"duration",
     "^P((\\d+Y(\\d+M(\\d+D)?)?|\\d+M(\\d+D)?|\\d+D)(" DUR_TIME ")?|" DUR_TIME "|\\d+W)$"},
    {"uuid", "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"},
};
#undef LABEL
#undef DATE
#undef TIME
#undef OCTET
#undef ATOM
#undef H16
#undef V4
#undef DUR_TIME
#undef URI_CH
#undef URI_NC
enum { MAX_PATTERNS = 32, MAX_PATTERN_STATES = 16384 }; /* a schema's: 512 B a state */

/* The first of the n keywords k that s has, or NULL. */
static const char *first_of(const cJSON *s, const char *const *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, k[i])) return k[i];
    return NULL;
}

static const char *bound_in(const cJSON *s)
{
    return first_of(s, bounds, sizeof bounds / sizeof *bounds);
}

static const char *length_in(const cJSON *s)
{
    return first_of(s, lengths, sizeof lengths / sizeof *lengths);
}

static const char *shape_in(const cJSON *s)
{
    return first_of(s, shapes, sizeof shapes / sizeof *shapes);
}

/* kw (a keyword s has, or NULL) holds only for values of `type` (or type2, unless NULL): s must
 * name that type, and sit beside nothing that takes the value elsewhere ($ref, enum, const,
 * anyOf, oneOf). Fails, naming kw, where not. */
static bool only_on_type(compile_t *cc, const cJSON *s, const char *kw, const char *type,
                         const char *type2)
{
    static const char *const elsewhere[] = {"$ref", "enum", "const", "anyOf", "oneOf"};
    if (!kw) return true;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    bool named = false;
    for (const cJSON *x = cJSON_IsArray(t) ? t->child : t; x; x = cJSON_IsArray(t) ? x->next : NULL)
        named |= cJSON_IsString(x) &&
                 (!strcmp(x->valuestring, type) || (type2 && !strcmp(x->valuestring, type2)));
    if (named && !first_of(s, elsewhere, sizeof elsewhere / sizeof *elsewhere)) return true;
    cfail(cc,
          "json_schema: '%s' is supported on type %s%s%s only (beside no $ref, enum, const, "
          "anyOf or oneOf)",
          kw, type, type2 ? " or " : "", type2 ? type2 : "");
    return false;
}

static wide_t pow10_wide(int k)
{
    wide_t p = 1;
    while (k-- > 0)
        p *= 10;
    return p;
}

/* b in units of 10^-NUM_FRAC, from its shortest decimal form (what the schema's text said),
 * rounded up or down to the unit. */
static wide_t number_units(double b, bool up)
{
    char text[48];
    for (int p = 15; p <= 17; p++) { /* "-d.ddde+XX" */
        snprintf(text, sizeof text, "%.*e", p - 1, b);
        if (strtod(text, NULL) == b) break;
    }
    const bool neg = text[0] == '-';
    wide_t m = 0;
    int after = -1; /* digits after the point */
    const char *q = text + neg;
    for (; *q && *q != 'e'; q++) {
        if (*q == '.') {
            after = 0;
        } else {
            m = m * 10 + (*q - '0');
            after += after >= 0;
        }
    }
    const int shift = atoi(q + 1) - (after > 0 ? after : 0) + NUM_FRAC; /* units = m 10^shift */
    wide_t u;
    bool inexact = false;
    if (shift >= 0) {
        u = m * pow10_wide(shift);
    } else if (shift < -36) {
        u = 0;
        inexact = m != 0;
    } else {
        const wide_t d = pow10_wide(-shift);
        u = m / d;
        inexact = m % d != 0;
    }
    if (inexact && up != neg) u += 1; /* (the magnitude rounds up: ceil of +, floor of -) */
    return neg ? -u : u;
}

/* Bound i (of bounds[]) of s into *v: 1; absent: 0; not a number within +-9e18: -1 (said). */
static int bound_at(compile_t *cc, const cJSON *s, size_t i, double *v)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, bounds[i]);
    if (!b) return 0;
    if (!cJSON_IsNumber(b) || !(b->valuedouble >= -9e18 && b->valuedouble <= 9e18)) {
        cfail(cc, "json_schema: %s must be a number within +-9e18", bounds[i]);
        return -1;
    }
    *v = b->valuedouble;
    return 1;
}

/* multipleOf of s, if any, into *mult (an integer's in ones, a number's in units): it must be
 * above 0 and, for an integer, whole; for a number, of at most NUM_FRAC decimals. */
static bool multiple_of(compile_t *cc, const cJSON *s, bool integer, wide_t *mult)
{
    *mult = 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    if (!m) return true;
    const double v = cJSON_IsNumber(m) ? m->valuedouble : -1.0;
    if (!(v > 0.0 && v <= 9e18) || (integer && v != floor(v))) {
        cfail(cc, "json_schema: multipleOf must be a number above 0%s",
              integer ? " (on an integer, a whole one)" : "");
        return false;
    }
    *mult = integer ? (wide_t)v : number_units(v, true);
    if (!integer && (*mult != number_units(v, false) || *mult == 0)) {
        cfail(cc, "json_schema: multipleOf on a number may have at most %d decimals", NUM_FRAC);
        return false;
    }
    return true;
}

/* Whether [a, b] and [lo, hi] share a value that is a multiple of mult (0: any value). */
static bool range_has(wide_t a, wide_t b, wide_t lo, wide_t hi, wide_t mult)
{
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    if (a > b) return false;
    if (mult <= 1) return true;
    wide_t q = b / mult; /* the largest multiple <= b: floor(b / mult) mult */
    if (b % mult != 0 && b < 0) q -= 1;
    return q * mult >= a;
}

/* A number node's bounds on the grid of units: inclusive, exclusive ones a unit inside; fails
 * where a bound is no number within +-9e18, or nothing is left. */
static bool number_bounds(compile_t *cc, const cJSON *s, wide_t *lo, wide_t *hi)
{
    const wide_t unit = pow10_wide(NUM_FRAC), limit = (wide_t)9000000000000000000 * unit;
    *lo = -limit;
    *hi = limit;
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++) {
        double v;
        const int has = bound_at(cc, s, i, &v);
        if (has < 0) return false;
        if (!has) continue;
        wide_t u;
        if (i == 4) continue; /* (multipleOf: multiple_of) */
        if (i == 0 && (u = number_units(v, true)) > *lo) *lo = u;
        if (i == 1 && (u = number_units(v, false)) < *hi) *hi = u;
        if (i == 2 && (u = number_units(v, false) + 1) > *lo) *lo = u;
        if (i == 3 && (u = number_units(v, true) - 1) < *hi) *hi = u;
    }
    if (*lo > *hi) {
        cfail(cc, "json_schema: no number (of up to %d decimals) is within the bounds given",
              NUM_FRAC);
        return false;
    }
    return true;
}

/* An integer node's bounds: minimum and maximum as given, exclusive ones a step inside, the
 * others +-9e18; fails where a bound is no number in that range, or no integer is left. */
static bool integer_bounds(compile_t *cc, const cJSON *s, int64_t *lo, int64_t *hi)
{
    double l = -9e18, h = 9e18;
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++) {
        double v;
        const int has = bound_at(cc, s, i, &v);
        if (has < 0) return false;
        if (!has) continue;
        if (i == 0) l = fmax(l, ceil(v));
        if (i == 1) h = fmin(h, floor(v));
        if (i == 2) l = fmax(l, floor(v) + 1);
        if (i == 3) h = fmin(h, ceil(v) - 1);
    }
    if (l > h) {
        cfail(cc, "json_schema: no integer is within the bounds given");
        return false;
    }
    *lo = (int64_t)l;
    *hi = (int64_t)h;
    return true;
}

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return true;
    return false;
}

#define BT__IN(k, list) in_list(k, list, sizeof list / sizeof *list)
static bool known_keyword(const char *k)
{
    return BT__IN(k, annotations) || BT__IN(k, understood) || BT__IN(k, bounds) ||
           BT__IN(k, lengths) || BT__IN(k, shapes);
}
#undef BT__IN

static const cJSON *ref_target(const compile_t *cc, const char *ref)
{
    if (!strcmp(ref, "#")) return cc->root;
    if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14)) {
        const bool defs = ref[2] == '$';
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(cc->root, defs ? "$defs" : "definitions");
        return cJSON_GetObjectItemCaseSensitive(d, ref + (defs ? 8 : 14));
    }
    return NULL;
}

/* The bytes a value of schema s may start with, without compiling it: for the placeholder of a
 * $ref being compiled (a union around a recursive reference asks before it is done). */
static void schema_starts(const compile_t *cc, const cJSON *s, uint32_t *set, int depth)
{
    if (depth > 16 || !cJSON_IsObject(s)) {
        starts_of_kind(K_ANY, set);
        return;
    }
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (cJSON_IsString(x)) {
        schema_starts(cc, ref_target(cc, x->valuestring), set, depth + 1);
        return;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        for (const cJSON *v = en ? en->child : cn; v; v = en ? v->next : NULL) {
            char *text = cJSON_PrintUnformatted(v);
            if (text) set_bit(set, (uint8_t)text[0]);
            free(text);
        }
        return;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any) {
        cJSON_ArrayForEach(x, any) schema_starts(cc, x, set, depth + 1);
        return;
    }
    static const char *const names[] = {"object",  "array",   "string", "number",
                                        "integer", "boolean", "null"};
    static const uint8_t kinds[] = {K_OBJECT,  K_ARRAY,   K_STRING, K_NUMBER,
                                    K_INTEGER, K_BOOLEAN, K_NULL};
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *one = cJSON_IsArray(type) ? type->child : type;
    for (; cJSON_IsString(one); one = cJSON_IsArray(type) ? one->next : NULL)
        for (int i = 0; i < 7; i++)
            if (!strcmp(one->valuestring, names[i])) starts_of_kind(kinds[i], set);
    if (!type)
        starts_of_kind(cJSON_GetObjectItemCaseSensitive(s, "properties") ? K_OBJECT : K_ANY, set);
}

/* A $ref into the schema's $defs or definitions ("#" is the root). */
static int compile_ref(rules_t *r, compile_t *cc, const char *ref, int depth)
{
    const cJSON *t = ref_target(cc, ref);
    if (!t) {
        cfail(cc, "json_schema: $ref '%.100s' does not name a schema in $defs or definitions", ref);
        return -1;
    }
    for (int i = 0; i < cc->n_memo; i++)
        if (cc->memo_at[i] == t) return cc->memo_node[i];
    /* (a placeholder first: a schema that refers to itself finds it) */
    const int idx = new_snode(r, cc, K_ANY);
    if (idx < 0) return -1;
    schema_starts(cc, t, r->nodes[idx].starts, 0);
    if (cc->n_memo == cc->cap_memo) {
        cc->cap_memo = cc->cap_memo ? cc->cap_memo * 2 : 8;
        cc->memo_at = bt_realloc_or_die(cc->memo_at, (size_t)cc->cap_memo * sizeof *cc->memo_at);
        cc->memo_node =
            bt_realloc_or_die(cc->memo_node, (size_t)cc->cap_memo * sizeof *cc->memo_node);
    }
    cc->memo_at[cc->n_memo] = t;
    cc->memo_node[cc->n_memo++] = (uint16_t)idx;
    const int got = compile_node(r, cc, t, depth + 1);
    if (got < 0) return -1;
    r->nodes[idx] = r->nodes[got]; /* (got's own slot stays, unused) */
    return idx;
}

static uint64_t keys_allowed(const snode_t *o, unsigned p);

/* An object union's key term for its discriminator: the branch is told by the key's value
 * (no union has 255 branches) */
enum { DISC_TERM = 64 * 255 + 63 };

/* the node of text in the literal trie at root, 0 if absent */
static uint16_t lit_lookup(const rules_t *r, uint16_t root, const char *text)
{
    uint16_t n = root;
    for (const char *p = text; *p && n; p++)
        n = lit_find(r, n, (uint8_t)*p);
    return n;
}

/* Each text below node k of a literal trie that ends there (its first len bytes already in
 * buf): visit(r, cc, ctx, text, term), stopping at the first false; `noun` names the texts in
 * the message for one past 1000 bytes */
typedef bool (*lit_visit_fn)(rules_t *r, compile_t *cc, void *ctx, const char *text, int16_t term);
static bool lit_walk(rules_t *r, compile_t *cc, uint16_t k, char *buf, int len, const char *noun,
                     lit_visit_fn visit, void *ctx)
{
    if (r->lit[k].term >= 0) {
        buf[len] = 0;
        if (!visit(r, cc, ctx, buf, r->lit[k].term)) return false;
    }
    for (uint16_t c = r->lit[k].child; c; c = r->lit[c].sibling) {
        if (len >= 1000) {
            cfail(cc, "json_schema: %s of more than 1000 bytes", noun);
            return false;
        }
        buf[len] = (char)r->lit[c].byte;
        if (!lit_walk(r, cc, c, buf, len + 1, noun, visit, ctx)) return false;
    }
    return true;
}

/* a discriminator's values from one branch: union u, branch i, its property j (the key) */
typedef struct {
    int u, i, j;
    const char *key, *what;
} disc_ctx_t;

/* One value of a branch's discriminator into union u's discriminator trie with term
 * 64 * i + j; false (with a message) on a value that is not a string or that another branch
 * has too */
static bool disc_value(rules_t *r, compile_t *cc, void *ctx, const char *text, int16_t term)
{
    (void)term;
    const disc_ctx_t *d = ctx;
    if (text[0] != '"') {
        cfail(cc,
              "json_schema: %s of objects that start with the same property (%.100s) "
              "is supported only where its values are strings",
              d->what, d->key);
        return false;
    }
    if (!lit_insert(r, cc, r->nodes[r->nodes[d->u].items].lit, text, (int16_t)(64 * d->i + d->j),
                    0)) {
        if (!cc->failed)
            cfail(cc,
                  "json_schema: %s of objects: the property that tells them apart (%.100s, "
                  "the first after any they share alike) has the value %.100s in two of them",
                  d->what, d->key, text);
        return false;
    }
    return true;
}

/* Branch i of union u gives its key (its property j) the values of an enum, into the union's
 * discriminator; false (with a message) where the property is not an enum */
static bool disc_values(rules_t *r, compile_t *cc, int u, int i, int j, const char *key,
                        const char *what)
{
    const uint16_t v = r->refs_list[r->nodes[u].first + i];
    const uint16_t e = r->refs_list[r->nodes[v].first + j];
    if (r->nodes[e].kind != K_ENUM) {
        cfail(cc,
              "json_schema: %s of objects that can start with the same property (%.100s) is "
              "supported only where each gives it as const or enum strings",
              what, key);
        return false;
    }
    char buf[1024];
    disc_ctx_t d = {u, i, j, key, what};
    return lit_walk(r, cc, r->nodes[e].lit, buf, 0, "an enum value", disc_value, &d);
}

/* an object union's keys from one branch: union u (key trie at root), branch i, object o,
 * whose keys count from property p0 (after the union's prefix); the branches that start with
 * a key another one starts with too (their terms, in shared[]) */
typedef struct {
    int u;
    uint16_t root;
    int i, p0;
    const snode_t *o;
    const char *what;
    uint16_t *shared;
    int *n_shared;
    char *key; /* (1024 bytes) the shared key */
} union_ctx_t;

/* Branch i of union x->u starts with key `text` (its property j), which an earlier branch
 * starts with too: both are recorded, to be told apart by the key's value (shared_key_apart);
 * a second such key is refused */
static bool shared_key(rules_t *r, compile_t *cc, const union_ctx_t *x, const char *text, int j)
{
    const uint16_t at = lit_lookup(r, x->root, text);
    const int t0 = r->lit[at].term;
    if (t0 != DISC_TERM) { /* the union's first shared key: its discriminator from now on */
        if (*x->n_shared) {
            cfail(cc,
                  "json_schema: %s of objects that share two first properties is not "
                  "supported (one may tell them apart: %.100s)",
                  x->what, text);
            return false;
        }
        x->shared[(*x->n_shared)++] = (uint16_t)t0;
        snprintf(x->key, 1024, "%s", text);
        r->lit[at].term = DISC_TERM;
    }
    x->shared[(*x->n_shared)++] = (uint16_t)(64 * x->i + j);
    return true;
}

/* the value node of the branch and property a shared key's term names, in union u */
static uint16_t shared_value(const rules_t *r, int u, int term)
{
    const uint16_t v = r->refs_list[r->nodes[u].first + term / 64];
    return r->refs_list[r->nodes[v].first + term % 64];
}

/* Union u's branches that start with its shared key (n terms): told apart by the value's first
 * byte where their values start apart (a K_KEYTYPE), else by their const or enum strings, each
 * in one branch */
static bool shared_key_apart(rules_t *r, compile_t *cc, int u, const uint16_t *terms, int n,
                             const char *key, const char *what)
{
    bool apart = true, enums = true;
    uint32_t starts[8] = {0};
    for (int a = 0; a < n; a++) {
        const snode_t *va = &r->nodes[shared_value(r, u, terms[a])];
        enums = enums && va->kind == K_ENUM;
        apart = starts_join(starts, va->starts) && apart;
    }
    if (apart) {
        const int t = new_snode(r, cc, K_KEYTYPE);
        if (t < 0) return false;
        r->nodes[t].first = (uint16_t)r->n_list;
        r->nodes[t].n = (uint8_t)n;
        memcpy(r->nodes[t].starts, starts, sizeof starts);
        for (int a = 0; a < n; a++)
            if (!list_push(r, cc, shared_value(r, u, terms[a]))) return false;
        for (int a = 0; a < n; a++)
            if (!list_push(r, cc, terms[a])) return false;
        r->nodes[u].items = (uint16_t)t;
        return !cc->failed;
    }
    if (!enums) {
        cfail(cc,
              "json_schema: %s of objects that can start with the same property (%.100s) is "
              "supported only where each gives it as const or enum strings, or where their "
              "values start apart (a string, a number, a boolean, null, an object, an array)",
              what, key);
        return false;
    }
    const int e = new_snode(r, cc, K_ENUM);
    if (e < 0) return false;
    const int root = new_lnode(r, cc, 0);
    if (cc->failed) return false;
    r->nodes[e].lit = (uint16_t)root;
    set_bit(r->nodes[e].starts, '"');
    r->nodes[u].items = (uint16_t)e;
    for (int a = 0; a < n; a++)
        if (!disc_values(r, cc, u, terms[a] / 64, terms[a] % 64, key, what)) return false;
    return true;
}

/* One key of branch i into union u's key trie with term 64 * i + its index, where the branch
 * allows it first after the prefix (a key an earlier branch has there too: the
 * discriminator) */
static bool union_key(rules_t *r, compile_t *cc, void *ctx, const char *text, int16_t term)
{
    const union_ctx_t *x = ctx;
    if (!((keys_allowed(x->o, (unsigned)x->p0) >> term) & 1)) return true;
    if (lit_insert(r, cc, x->root, text, (int16_t)(64 * x->i + term), 1)) return true;
    return !cc->failed && shared_key(r, cc, x, text, term);
}

/* Whether two literal tries hold the same texts with the same terms, built alike (the same
 * texts inserted in the same order, as one schema's text compiled twice does) */
static bool lit_same(const rules_t *r, uint16_t a, uint16_t b)
{
    if (r->lit[a].byte != r->lit[b].byte || r->lit[a].term != r->lit[b].term ||
        r->lit[a].below != r->lit[b].below)
        return false;
    uint16_t x = r->lit[a].child, y = r->lit[b].child;
    for (; x && y; x = r->lit[x].sibling, y = r->lit[y].sibling)
        if (!lit_same(r, x, y)) return false;
    return !x && !y;
}

/* Whether nodes a and b accept the same values: the same node, or built alike from equal
 * schemas (a schema repeated in two branches rather than named once in $defs). Conservative:
 * patterns compiled twice differ, and past a depth (a schema that refers to itself) it says
 * no. */
static bool same_schema(const rules_t *r, uint16_t a, uint16_t b, int depth)
{
    if (a == b) return true;
    if (depth > 16) return false;
    const snode_t *x = &r->nodes[a], *y = &r->nodes[b];
    if (x->kind != y->kind || x->generic != y->generic || x->n != y->n ||
        x->min_items != y->min_items || x->max_items != y->max_items || x->bounded != y->bounded ||
        x->empty_ok != y->empty_ok || x->prefix != y->prefix || x->rx != y->rx || x->lo != y->lo ||
        x->hi != y->hi || x->nlo != y->nlo || x->nhi != y->nhi || x->mult != y->mult ||
        x->required != y->required || memcmp(x->starts, y->starts, sizeof x->starts) != 0)
        return false;
    const bool described = x->kind == K_OBJECT && !x->generic;
    const bool listed = described || x->kind == K_UNION || x->kind == K_OBJUNION; /* refs_list */
    if ((described || x->kind == K_OBJUNION || x->kind == K_ENUM) && !lit_same(r, x->lit, y->lit))
        return false;
    /* (items 0: none for an object union, any value elsewhere; node 0 is the any node, so the
     * same comparison serves) */
    if ((x->kind == K_ARRAY || (x->kind == K_OBJECT && x->generic) || x->kind == K_OBJUNION) &&
        !same_schema(r, x->items, y->items, depth + 1))
        return false;
    if (listed || x->kind == K_KEYTYPE)
        for (int i = 0; i < x->n; i++)
            if (!same_schema(r, r->refs_list[x->first + i], r->refs_list[y->first + i], depth + 1))
                return false;
    if (x->kind == K_KEYTYPE) /* (and the branches they lead to) */
        for (int i = 0; i < x->n; i++)
            if (r->refs_list[x->first + x->n + i] != r->refs_list[y->first + y->n + i])
                return false;
    return true;
}

/* the key of property j of described object o, as a JSON string (quotes included), into buf
 * (of 1024 bytes); false if not found */
static bool key_text(const rules_t *r, uint16_t k, int j, char *buf, int len)
{
    if (r->lit[k].term == j && len > 0) {
        buf[len] = 0;
        return true;
    }
    for (uint16_t c = r->lit[k].child; c; c = r->lit[c].sibling) {
        if (len >= 1023) return false;
        buf[len] = (char)r->lit[c].byte;
        if (key_text(r, c, j, buf, len + 1)) return true;
    }
    return false;
}

/* The properties every one of n described objects starts with alike: required, under the same
 * key, of the same schema (compiled alike), in the same place. Such a union is read as its
 * first branch through them, and told apart by the keys that follow (a Pydantic model whose
 * discriminator comes after fields its variants share). */
static int shared_prefix(const rules_t *r, const int *obj, int n)
{
    const snode_t *lead = &r->nodes[obj[0]];
    int p = 0;
    char k0[1024], k1[1024];
    for (; p < lead->n && p < 63; p++) {
        if (!((lead->required >> p) & 1) || !key_text(r, lead->lit, p, k0, 0)) return p;
        const uint16_t v0 = r->refs_list[lead->first + p];
        for (int i = 1; i < n; i++) {
            const snode_t *o = &r->nodes[obj[i]];
            if (p >= o->n || !((o->required >> p) & 1) || !key_text(r, o->lit, p, k1, 0) ||
                strcmp(k0, k1) != 0 || !same_schema(r, v0, r->refs_list[o->first + p], 0))
                return p;
        }
    }
    return p;
}

/* Described objects among a union's branches, as one branch: after the properties they all
 * start with alike (shared_prefix), an object's next key says which it is (those keys must
 * differ, or be a discriminator); {} there where some branch requires nothing more. */
static int object_union(rules_t *r, compile_t *cc, const int *obj, int n, const char *what)
{
    const int u = new_snode(r, cc, K_OBJUNION);
    if (u < 0) return -1;
    const int root = new_lnode(r, cc, 0);
    if (cc->failed) return -1;
    r->nodes[u].first = (uint16_t)r->n_list;
    r->nodes[u].n = (uint8_t)n;
    r->nodes[u].lit = (uint16_t)root;
    starts_of_kind(K_OBJECT, r->nodes[u].starts);
    const int p0 = shared_prefix(r, obj, n);
    r->nodes[u].prefix = (uint8_t)p0;
    char buf[1024], key[1024] = "";
    uint16_t shared[255];
    int n_shared = 0;
    for (int i = 0; i < n; i++) {
        if (!list_push(r, cc, (uint16_t)obj[i])) return -1;
        const snode_t o = r->nodes[obj[i]]; /* (a copy: the literals may move the nodes) */
        if (o.min_items > 0 || o.max_items >= 0) {
            cfail(cc,
                  "json_schema: %s of objects where one bounds its property count "
                  "(minProperties, maxProperties) is not supported",
                  what);
            return -1;
        }
        if (!(o.required >> p0)) r->nodes[u].empty_ok = true;
        const union_ctx_t x = {u, (uint16_t)root, i, p0, &o, what, shared, &n_shared, key};
        if (!lit_walk(r, cc, o.lit, buf, 0, "a property name", union_key, (void *)&x)) return -1;
    }
    if (n_shared && !shared_key_apart(r, cc, u, shared, n_shared, key, what)) return -1;
    /* no key after the prefix in any branch: the branches are one object (a ',' after the
     * prefix would lead nowhere) */
    if (!r->lit[root].child) return obj[0];
    return u;
}

static int compile_union(rules_t *r, compile_t *cc, const int *branch, int n, const char *what)
{
    /* two or more described objects: one branch that their first keys tell apart */
    int n_obj = 0;
    for (int i = 0; i < n; i++)
        n_obj += r->nodes[branch[i]].kind == K_OBJECT && !r->nodes[branch[i]].generic;
    if (n_obj >= 2 && n <= 255) {
        int objs[255], rest[255], n_rest = 0, k = 0;
        for (int i = 0; i < n; i++) {
            if (r->nodes[branch[i]].kind == K_OBJECT && !r->nodes[branch[i]].generic)
                objs[k++] = branch[i];
            else
                rest[n_rest++] = branch[i];
        }
        const int m = object_union(r, cc, objs, n_obj, what);
        if (m < 0) return -1;
        if (n_rest == 0) return m;
        rest[n_rest++] = m;
        return compile_union(r, cc, rest, n_rest, what);
    }
    if (n > 255) {
        cfail(cc, "json_schema: %s with more than 255 branches", what);
        return -1;
    }
    const int u = new_snode(r, cc, K_UNION);
    if (u < 0) return -1;
    r->nodes[u].first = (uint16_t)r->n_list;
    r->nodes[u].n = (uint8_t)n;
    for (int i = 0; i < n; i++) {
        if (!starts_join(r->nodes[u].starts, r->nodes[branch[i]].starts)) {
            cfail(cc,
                  "json_schema: %s whose branches can start alike (two of one type) is not "
                  "supported",
                  what);
            return -1;
        }
        if (!list_push(r, cc, (uint16_t)branch[i])) return -1;
    }
    return u;
}

/* A pair of count bounds (minLength / maxLength, minProperties / maxProperties): whole numbers
 * 0..most, min <= max; *lo 0 and *hi -1 where absent. False, with a message naming them, if
 * not. */
static bool count_bounds(compile_t *cc, const cJSON *s, const char *min_kw, const char *max_kw,
                         double most, int64_t *lo, int64_t *hi)
{
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, min_kw);
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, max_kw);
    if ((mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0 || mn->valuedouble > most ||
                mn->valuedouble != floor(mn->valuedouble))) ||
        (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0 || mx->valuedouble > most ||
                mx->valuedouble != floor(mx->valuedouble))) ||
        (mn && mx && mn->valuedouble > mx->valuedouble)) {
        cfail(cc, "json_schema: %s and %s must be whole numbers 0..%.0f, min <= max", min_kw,
              max_kw, most);
        return false;
    }
    *lo = mn ? (int64_t)mn->valuedouble : 0;
    *hi = mx ? (int64_t)mx->valuedouble : -1;
    return true;
}

/* An object without listed properties: any keys, each value of node v, min..max of them */
static int generic_object(rules_t *r, compile_t *cc, int v, int16_t min_p, int16_t max_p)
{
    const int o = new_snode(r, cc, K_OBJECT);
    if (o < 0) return -1;
    r->nodes[o].generic = true;
    r->nodes[o].items = (uint16_t)v;
    r->nodes[o].min_items = min_p;
    r->nodes[o].max_items = max_p;
    starts_of_kind(K_OBJECT, r->nodes[o].starts);
    return o;
}

static int compile_object(rules_t *r, compile_t *cc, const cJSON *s, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (extra && !cJSON_IsBool(extra) && !cJSON_IsObject(extra)) {
        cfail(cc, "json_schema: additionalProperties must be true, false or a schema");
        return -1;
    }
    /* minProperties / maxProperties: counted where no properties are listed (the keys of a
     * map, a free-form tool's parameters), and beside listed ones where they bind (below) */
    int64_t lo_p, hi_p;
    if (!count_bounds(cc, s, "minProperties", "maxProperties", 255, &lo_p, &hi_p)) return -1;
    const bool counted = lo_p > 0 || hi_p >= 0;
    const int16_t min_p = (int16_t)lo_p, max_p = (int16_t)hi_p;
    /* Beside listed properties, additionalProperties as a schema is held as true is: only the
     * listed ones are generated, so no additional one is ever there to break it (the schema
     * itself is still compiled, so a bad one is refused by name) */
    if (cJSON_IsObject(extra) && props) {
        if (compile_node(r, cc, extra, depth + 1) < 0) return -1;
        extra = NULL;
    }
    if (cJSON_IsObject(extra)) { /* a map: any keys, each value of one schema */
        if (req && cJSON_GetArraySize(req) > 0) {
            cfail(cc, "json_schema: required names properties the schema does not describe");
            return -1;
        }
        const int v = compile_node(r, cc, extra, depth + 1);
        return v < 0 ? -1 : generic_object(r, cc, v, min_p, max_p);
    }
    if (props && !cJSON_IsObject(props)) {
        cfail(cc, "json_schema: properties must be an object");
        return -1;
    }
    if (req && !cJSON_IsArray(req)) {
        cfail(cc, "json_schema: required must be an array of property names");
        return -1;
    }
    if (!props && !cJSON_IsFalse(extra)) {
        if (req && cJSON_GetArraySize(req) > 0) {
            cfail(cc, "json_schema: required names properties the schema does not describe");
            return -1;
        }
        /* any keys and values, so many of them */
        return counted ? generic_object(r, cc, NODE_ANY, min_p, max_p) : NODE_ANY_OBJECT;
    }
    const int n = props ? cJSON_GetArraySize(props) : 0;
    if (n > BT_GRAMMAR_MAX_PROPERTIES) {
        cfail(cc, "json_schema: an object of %d properties (at most %d)", n,
              BT_GRAMMAR_MAX_PROPERTIES);
        return -1;
    }
    int value[BT_GRAMMAR_MAX_PROPERTIES];
    int j = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
    {
        if ((value[j++] = compile_node(r, cc, p, depth + 1)) < 0) return -1;
    }
    const int o = new_snode(r, cc, K_OBJECT);
    if (o < 0) return -1;
    const int root = new_lnode(r, cc, 0);
    if (cc->failed) return -1;
    r->nodes[o].n = (uint8_t)n;
    r->nodes[o].first = (uint16_t)r->n_list;
    r->nodes[o].lit = (uint16_t)root;
    starts_of_kind(K_OBJECT, r->nodes[o].starts);
    j = 0;
    cJSON_ArrayForEach(p, props)
    {
        cJSON *name = cJSON_CreateString(p->string);
        char *quoted = cJSON_PrintUnformatted(name);
        cJSON_Delete(name);
        const bool fresh = lit_insert(r, cc, (uint16_t)root, quoted, (int16_t)j, 1ull << j);
        free(quoted);
        if (cc->failed) return -1;
        if (!fresh) {
            cfail(cc, "json_schema: property '%.100s' given twice", p->string);
            return -1;
        }
        if (!list_push(r, cc, (uint16_t)value[j])) return -1;
        j++;
    }
    const cJSON *q;
    cJSON_ArrayForEach(q, req)
    {
        int k = 0;
        const cJSON *x = props ? props->child : NULL;
        for (; x && !(cJSON_IsString(q) && !strcmp(x->string, q->valuestring)); x = x->next)
            k++;
        if (!x) {
            cfail(cc, "json_schema: required names '%.100s', which is not among the properties",
                  cJSON_IsString(q) ? q->valuestring : "?");
            return -1;
        }
        r->nodes[o].required |= 1ull << k;
    }
    /* Beside listed properties the count binds only between the required ones and all of
     * them: past either end no instance of the listed keys has it */
    const int n_req = __builtin_popcountll(r->nodes[o].required);
    if (min_p > n) {
        cfail(cc,
              "json_schema: minProperties %d, but the object lists %d properties (no others "
              "are generated)",
              min_p, n);
        return -1;
    }
    if (max_p >= 0 && max_p < n_req) {
        cfail(cc, "json_schema: maxProperties %d, but the object requires %d properties", max_p,
              n_req);
        return -1;
    }
    if (min_p > n_req || (max_p >= 0 && max_p < n)) {
        r->nodes[o].min_items = min_p;
        r->nodes[o].max_items = max_p;
    }
    return o;
}

/* A string's pattern or format, as a DFA the string's bytes walk. */
static bool compile_shape(rules_t *r, compile_t *cc, const cJSON *s, int x)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (pat && fmt) {
        cfail(cc, "json_schema: pattern and format together are not supported (one of them)");
        return false;
    }
    const char *text = NULL;
    if (pat) {
        if (!cJSON_IsString(pat)) {
            cfail(cc, "json_schema: pattern must be a string");
            return false;
        }
        text = pat->valuestring;
    } else {
        for (size_t i = 0; cJSON_IsString(fmt) && i < sizeof formats / sizeof *formats; i++)
            if (!strcmp(fmt->valuestring, formats[i].name)) text = formats[i].pattern;
        if (!text) {
            cfail(cc,
                  "json_schema: format '%.40s' is not supported (date, time, date-time, email, "
                  "hostname, ipv4, ipv6, uuid, uri are)",
                  cJSON_IsString(fmt) ? fmt->valuestring : "(not a string)");
            return false;
        }
    }
    /* a pattern (with the same length bounds) compiled before: its DFA again, which also
     * keeps the schema's 32 patterns and its states for different ones */
    snode_t *n = &r->nodes[x];
    for (int i = 0; i < cc->n_rx_memo; i++) {
        const rx_memo_t *m = &cc->rx_memo[i];
        if (!strcmp(m->text, text) && m->bounded == n->bounded &&
            (!n->bounded || (m->lo == n->lo && m->hi == n->hi))) {
            n->bounded = false;
            n->rx = m->rx;
            return true;
        }
    }
    if (r->n_rx >= MAX_PATTERNS) {
        cfail(cc, "json_schema: more than %d different patterns and formats", MAX_PATTERNS);
        return false;
    }
    char why[200];
    bt_regex_t *re;
    if (bt_regex_compile(text, strlen(text), BT_REGEX_SEARCH, &re, why, sizeof why) != BT_OK) {
        cfail(cc, "json_schema: %s", why);
        return false;
    }
    /* minLength / maxLength beside it: the DFA counts the characters too (a count apart, the
     * two could each let a string go on where together nothing can finish), and the node's own
     * count is off */
    const rx_memo_t memo = {text, n->bounded, n->lo, n->hi, (uint8_t)(r->n_rx + 1)};
    if (n->bounded &&
        bt_regex_limit_length(re, (long)n->lo, (long)n->hi, MAX_PATTERN_STATES - r->rx_states, why,
                              sizeof why) != BT_OK) {
        bt_regex_free(re);
        cfail(cc, "json_schema: %s '%.60s' %s", shape_in(s), pat ? text : fmt->valuestring, why);
        return false;
    }
    n->bounded = false;
    if (r->rx_states + re->n_states > MAX_PATTERN_STATES) {
        bt_regex_free(re);
        cfail(cc, "json_schema: the patterns need more than %d automaton states together",
              MAX_PATTERN_STATES);
        return false;
    }
    r->rx = bt_realloc_or_die(r->rx, (size_t)(r->n_rx + 1) * sizeof *r->rx);
    cc->rx_memo = bt_realloc_or_die(cc->rx_memo, (size_t)(cc->n_rx_memo + 1) * sizeof *cc->rx_memo);
    cc->rx_memo[cc->n_rx_memo++] = memo;
    r->rx[r->n_rx++] = re;
    r->rx_states += re->n_states;
    r->nodes[x].rx = memo.rx;
    return true;
}

static int compile_typed(rules_t *r, compile_t *cc, const cJSON *s, const char *type, int depth)
{
    static const char *const names[] = {"object",  "array",   "string", "number",
                                        "integer", "boolean", "null"};
    static const uint8_t kinds[] = {K_OBJECT,  K_ARRAY,   K_STRING, K_NUMBER,
                                    K_INTEGER, K_BOOLEAN, K_NULL};
    int kind = -1;
    for (int i = 0; i < 7; i++)
        if (!strcmp(type, names[i])) kind = kinds[i];
    if (kind < 0) {
        cfail(cc, "json_schema: type '%.40s' is not a JSON Schema type", type);
        return -1;
    }
    if (kind == K_OBJECT) return compile_object(r, cc, s, depth);
    if (kind == K_ARRAY) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        /* (whole numbers: a fraction had been cut, 1.5 letting one item pass) */
        int64_t lo_i, hi_i;
        if (!count_bounds(cc, s, "minItems", "maxItems", 255, &lo_i, &hi_i)) return -1;
        const int it = items ? compile_node(r, cc, items, depth + 1) : NODE_ANY;
        if (it < 0) return -1;
        if (it == NODE_ANY && !cJSON_GetObjectItemCaseSensitive(s, "minItems") &&
            !cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            return NODE_ANY_ARRAY;
        const int a = new_snode(r, cc, K_ARRAY);
        if (a < 0) return -1;
        r->nodes[a].items = (uint16_t)it;
        r->nodes[a].min_items = (int16_t)lo_i;
        r->nodes[a].max_items = (int16_t)hi_i;
        starts_of_kind(K_ARRAY, r->nodes[a].starts);
        return a;
    }
    int64_t lo = 0, hi = 0;
    wide_t nlo = 0, nhi = 0;
    wide_t mult = 0;
    if (kind == K_INTEGER && bound_in(s) && !integer_bounds(cc, s, &lo, &hi)) return -1;
    if (kind == K_NUMBER && bound_in(s) && !number_bounds(cc, s, &nlo, &nhi)) return -1;
    if ((kind == K_INTEGER || kind == K_NUMBER) && !multiple_of(cc, s, kind == K_INTEGER, &mult))
        return -1;
    if (mult && !(kind == K_INTEGER ? range_has(lo, hi, lo, hi, mult)
                                    : range_has(nlo, nhi, nlo, nhi, mult))) {
        cfail(cc, "json_schema: no multiple of multipleOf is within the bounds given");
        return -1;
    }
    const int x = new_snode(r, cc, (uint8_t)kind);
    if (x < 0) return -1;
    starts_of_kind((uint8_t)kind, r->nodes[x].starts);
    if (kind == K_INTEGER && bound_in(s)) {
        r->nodes[x].bounded = true;
        r->nodes[x].lo = lo;
        r->nodes[x].hi = hi;
        r->nodes[x].mult = mult;
    }
    if (kind == K_NUMBER && bound_in(s)) {
        r->nodes[x].bounded = true;
        r->nodes[x].nlo = nlo;
        r->nodes[x].nhi = nhi;
        r->nodes[x].mult = mult;
    }
    if (kind == K_STRING && length_in(s)) {
        int64_t lo, hi;
        if (!count_bounds(cc, s, "minLength", "maxLength", 1e6, &lo, &hi)) return -1;
        r->nodes[x].bounded = true;
        r->nodes[x].lo = lo;
        r->nodes[x].hi = hi;
    }
    if (kind == K_STRING && shape_in(s) && !compile_shape(r, cc, s, x)) return -1;
    return x;
}

static int compile_node(rules_t *r, compile_t *cc, const cJSON *s, int depth)
{
    if (depth > 64) {
        cfail(cc, "json_schema: nested more than 64 deep");
        return -1;
    }
    if (cJSON_IsTrue(s)) return NODE_ANY;
    if (!cJSON_IsObject(s)) {
        cfail(cc, "json_schema: a schema must be an object (or true)");
        return -1;
    }
    for (const cJSON *k = s->child; k; k = k->next)
        if (!known_keyword(k->string)) {
            cfail(cc,
                  "json_schema: keyword '%.60s' is not supported (the output could not be "
                  "held to it)",
                  k->string);
            return -1;
        }
    /* lengths hold where the value is a string, bounds where it is a number: only an
     * integer's are kept to */
    if (!only_on_type(cc, s, length_in(s), "string", NULL) ||
        !only_on_type(cc, s, shape_in(s), "string", NULL) ||
        !only_on_type(cc, s, bound_in(s), "integer", "number"))
        return -1;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) {
            cfail(cc, "json_schema: $ref must be a string");
            return -1;
        }
        return compile_ref(r, cc, ref->valuestring, depth);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        if (en &&
            (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0 || cJSON_GetArraySize(en) > 256)) {
            cfail(cc, "json_schema: enum must be an array of 1..256 values");
            return -1;
        }
        const int e = new_snode(r, cc, K_ENUM);
        if (e < 0) return -1;
        const int root = new_lnode(r, cc, 0);
        if (cc->failed) return -1;
        r->nodes[e].lit = (uint16_t)root;
        int16_t i = 0;
        for (const cJSON *v = en ? en->child : cn; v; v = en ? v->next : NULL, i++) {
            char *text = cJSON_PrintUnformatted(v);
            lit_insert(r, cc, (uint16_t)root, text, i, 0); /* (a value twice: once is enough) */
            set_bit(r->nodes[e].starts, (uint8_t)text[0]);
            free(text);
            if (cc->failed) return -1;
        }
        return e;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any) {
        const int n = cJSON_GetArraySize(any);
        if (!cJSON_IsArray(any) || n == 0 || cJSON_GetObjectItemCaseSensitive(s, "type")) {
            cfail(cc,
                  "json_schema: anyOf / oneOf must be a non-empty array, without a type beside it");
            return -1;
        }
        int *b = bt_malloc_or_die((size_t)n * sizeof *b);
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, any)
        {
            if ((b[k++] = compile_node(r, cc, x, depth + 1)) < 0) break;
        }
        const int u = cc->failed ? -1 : n == 1 ? b[0] : compile_union(r, cc, b, n, any->string);
        free(b);
        return u;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) return compile_typed(r, cc, s, type->valuestring, depth);
    if (cJSON_IsArray(type)) {
        const int n = cJSON_GetArraySize(type);
        if (n == 0 || n > 7) {
            cfail(cc, "json_schema: type must name 1..7 types");
            return -1;
        }
        int b[7], k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, type)
        {
            if (!cJSON_IsString(x)) {
                cfail(cc, "json_schema: type must be a string or an array of strings");
                return -1;
            }
            if ((b[k++] = compile_typed(r, cc, s, x->valuestring, depth)) < 0) return -1;
        }
        return n == 1 ? b[0] : compile_union(r, cc, b, n, "type");
    }
    if (type) {
        cfail(cc, "json_schema: type must be a string or an array of strings");
        return -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "properties")) return compile_object(r, cc, s, depth);
    return NODE_ANY;
}

static void rules_free(rules_t *r);

/* Compiles schema (NULL: any object) into *r_p. */
/* Rules with the nodes every schema has. */
static rules_t *rules_new(compile_t *cc)
{
    rules_t *r = bt_calloc_or_die(1, sizeof *r);
    for (int k = 0; k < 3; k++) {
        const int n = new_snode(r, cc, k == 0 ? K_ANY : k == 1 ? K_OBJECT : K_ARRAY);
        starts_of_kind(r->nodes[n].kind, r->nodes[n].starts);
    }
    r->nodes[NODE_ANY_OBJECT].generic = true;
    r->nodes[NODE_ANY_ARRAY].items = NODE_ANY;
    new_lnode(r, cc, 0); /* (literal node 0: never a child, so 0 can mean none) */
    return r;
}

static bt_status_t rules_compile(const char *schema, size_t len, rules_t **r_p, char *err,
                                 size_t errlen)
{
    compile_t cc = {.err = err, .errlen = errlen};
    rules_t *r = rules_new(&cc);
    cJSON *doc = NULL;
    int root = NODE_ANY_OBJECT;
    if (schema) {
        doc = cJSON_ParseWithLength(schema, len);
        if (!doc) {
            snprintf(err, errlen, "json_schema: the schema is not valid JSON");
            rules_free(r);
            return BT_ERR_INVALID_ARG;
        }
        cc.root = doc;
        root = compile_node(r, &cc, doc, 0);
        if (root >= 0 && r->nodes[root].kind != K_OBJECT) {
            cfail(&cc, "json_schema: the schema's root must be an object (type \"object\")");
            root = -1;
        }
    }
    cJSON_Delete(doc);
    free(cc.memo_at);
    free(cc.memo_node);
    free(cc.rx_memo);
    if (root < 0) {
        rules_free(r);
        return BT_ERR_INVALID_ARG;
    }
    r->root = (uint16_t)root;
    *r_p = r;
    return BT_OK;
}

/* A regex constraint: the whole output matches the pattern, as SGLang's and vLLM's regex
 * constraints read it. */
static bt_status_t rules_compile_regex(const char *pattern, size_t len, rules_t **r_p, char *err,
                                       size_t errlen)
{
    char why[200];
    bt_regex_t *re;
    if (bt_regex_compile(pattern, len, BT_REGEX_WHOLE, &re, why, sizeof why) != BT_OK) {
        snprintf(err, errlen, "regex: %s", why + strlen("pattern: "));
        return BT_ERR_INVALID_ARG;
    }
    compile_t cc = {.err = err, .errlen = errlen};
    rules_t *r = rules_new(&cc);
    r->regex = true;
    r->rx = bt_malloc_or_die(sizeof *r->rx);
    r->rx[0] = re;
    r->n_rx = 1;
    r->rx_states = re->n_states;
    *r_p = r;
    return BT_OK;
}

/* Compiles a tool-call spec ({"tools": [{"name", "parameters"}, ...], "one": bool}). */
static bt_status_t rules_compile_tools(const char *spec, size_t len, rules_t **r_p, char *err,
                                       size_t errlen)
{
    rules_t *r;
    bt_status_t st = rules_compile(NULL, 0, &r, err, errlen); /* (the shared nodes) */
    if (st != BT_OK) return st;
    r->tools = true;
    compile_t cc = {.err = err, .errlen = errlen, .tools = true};
    cJSON *doc = cJSON_ParseWithLength(spec, len);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(doc, "tools");
    const int n = cJSON_GetArraySize(tools);
    if (!doc || !cJSON_IsArray(tools) || n < 1 || n > 255) {
        cfail(&cc, "tool calls: a spec of 1..255 tools is required");
        goto out;
    }
    r->one = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "one"));
    int *params = bt_malloc_or_die((size_t)n * sizeof *params);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(t, "parameters");
        if (!cJSON_IsString(name) || !*name->valuestring || strpbrk(name->valuestring, "\"<>\n")) {
            cfail(&cc, "tool calls: tool %d has no usable name", i);
            break;
        }
        cJSON *none = NULL;
        if (!ps) ps = none = cJSON_Parse("{\"type\":\"object\",\"properties\":{}}");
        cc.root = ps;
        cc.n_memo = 0;
        params[i] = compile_node(r, &cc, ps, 0);
        if (none) ps = NULL; /* (no properties to check) */
        cJSON_Delete(none);
        if (cc.failed) {
            char inner[256];
            snprintf(inner, sizeof inner, "%s", err);
            cc.failed = false;
            cfail(&cc, "tool '%.64s': parameters: %s", name->valuestring, inner);
            break;
        }
        if (r->nodes[params[i]].kind != K_OBJECT) { /* (one that lists none takes any) */
            cfail(&cc, "tool '%.64s': its parameters must be an object", name->valuestring);
            break;
        }
        if (r->nodes[params[i]].generic && r->nodes[params[i]].min_items > FREE_PARAMS) {
            cfail(&cc, "tool '%.64s': minProperties above %d (a call's parameters at most)",
                  name->valuestring, FREE_PARAMS);
            break;
        }
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(ps, "properties"), *p;
        cJSON_ArrayForEach(p, props) /* (written between quotes as they are: nothing to escape) */
        {
            for (const char *q = p->string; *q && !cc.failed; q++)
                if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
                    cfail(&cc, "tool '%.64s': parameter name '%.64s' cannot be written in DSML",
                          name->valuestring, p->string);
        }
        if (cc.failed) break;
        i++;
    }
    if (!cc.failed) {
        r->names = (uint16_t)new_lnode(r, &cc, 0);
        r->choice_a = (uint16_t)new_lnode(r, &cc, 0);
        r->choice_b = (uint16_t)new_lnode(r, &cc, 0);
        r->tools_first = (uint16_t)r->n_list;
        i = 0;
        cJSON_ArrayForEach(t, tools)
        {
            char quoted[300];
            snprintf(quoted, sizeof quoted, "%s\"",
                     cJSON_GetObjectItemCaseSensitive(t, "name")->valuestring);
            if (!lit_insert(r, &cc, r->names, quoted, (int16_t)i, 0) && !cc.failed)
                cfail(&cc, "tool calls: tool '%.64s' given twice", quoted);
            list_push(r, &cc, (uint16_t)params[i]); /* (cc.failed is read below) */
            i++;
        }
        for (int w = 0; w < 2; w++)
            for (int k = 0; k < 2; k++)
                lit_insert(r, &cc, w ? r->choice_b : r->choice_a, choice_text[w][k], (int16_t)k,
                           1ull << k);
    }
    free(params);
out:
    cJSON_Delete(doc);
    free(cc.memo_at);
    free(cc.memo_node);
    free(cc.rx_memo);
    if (cc.failed) {
        rules_free(r);
        return BT_ERR_INVALID_ARG;
    }
    *r_p = r;
    return BT_OK;
}

bt_status_t bt_grammar_tool_calls_check(const char *spec, size_t len, char *err, size_t errlen)
{
    rules_t *r;
    const bt_status_t st = rules_compile_tools(spec, len, &r, err, errlen);
    if (st == BT_OK) rules_free(r);
    return st;
}

bt_status_t bt_grammar_schema_check(const char *schema, size_t len, char *err, size_t errlen)
{
    rules_t *r;
    const bt_status_t st = rules_compile(schema, len, &r, err, errlen);
    if (st == BT_OK) rules_free(r);
    return st;
}

/* ---- the automaton ------------------------------------------------------------------------ */

enum {
    M_VALUE,     /* a value of node vnode must start (whitespace first may) */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_OBJ_KEY,   /* after an object's ',': a key */
    M_COLON,     /* after a key: ':' (then a value of node vnode) */
    M_OBJ_NEXT,  /* after a member: ',' or '}' */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_ARR_NEXT,  /* after an element: ',' or ']' */
    M_STR,       /* inside a string (lit LOW_NEXT: a low surrogate's escape must follow) */
    M_STR_ESC,   /* after a backslash */
    M_STR_HEX,   /* in \uXXXX: sub hex digits to go; need 1 when the first was d */
    M_STR_UTF8,  /* need more continuation bytes, the next in lo..hi */
    M_NUM,       /* in a number of node vnode: sub is N_* */
    M_LIT,       /* in true, false or null: lit, sub characters matched */
    M_KEYLIT,    /* in one of a described object's keys: at literal node tpos */
    M_ENUM,      /* in one of an enum's values: at literal node tpos */
    M_DLIT,      /* tool calls: in fixed text lit (a D_* literal), sub bytes matched */
    M_DNAME,     /* tool calls: in a tool's name, at literal node tpos */
    M_DCHOICE,   /* tool calls: in one of choice lit's texts (0: a parameter or the invoke's
                  * end; 1: another invoke or the block's end), at literal node tpos */
    M_RAW,       /* tool calls: a string parameter's raw text; sub bytes of its end tag matched */
    M_DANYNAME,  /* tool calls: a parameter's name where the tool lists none (sub 0: its opening
                  * quote to come, 1: its first character, 2: in it) */
    M_REGEX,     /* a regex constraint: the output so far took its DFA to state rx */
    M_DONE,      /* the object (or the block of tool calls) is closed; a regex's output ended */
};

enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const literals[3] = {"true", "false", "null"};

/* In strings, lit says what a \u escape may be: surrogates only in pairs (\uD83D\uDE00), as
 * strict parsers take them. */
enum { SURROGATE_NONE, HIGH_READING, LOW_NEXT };

typedef struct {
    uint16_t node;
    uint8_t p; /* object: the next property it may have; array: elements so far (to 255) */
    uint8_t dsml; /* a tool call's parameters (an object written as DSML parameters) */
    uint8_t n;    /* a described object that bounds its key count: keys so far */
    uint8_t disc; /* an object union reading its discriminator's value (also: no padding, as
                   * states are compared and hashed as bytes) */
} frame_t;

/* Every byte is meaningful (fields unused in a mode stay 0): the state is its own cache key. */
typedef struct {
    uint8_t mode, sub, lit, need, lo, hi;
    uint8_t key; /* the string being read is a key of an object without properties */
    uint8_t run; /* whitespace bytes in a row; bytes of the number */
    uint16_t depth, vnode, tpos;
    uint16_t rx; /* in a string with a pattern: its DFA's state (never 0 there) */
    int64_t num; /* a bounded integer's value so far (negative once it has a '-' and a digit);
                  * a bounded number's integer part (its sign in lit) */
    int64_t frac; /* a bounded number's fraction digits so far, as an integer (need: how many) */
    frame_t stack[BT_GRAMMAR_MAX_DEPTH];
    /* a call of a tool whose parameters list none: its parameters' names so far, hashed to 16
     * bits (as many as its frame's p), so that none comes twice (the tool parser refuses a
     * block that names one twice); 0 outside such a call */
    uint16_t names[FREE_PARAMS];
} jstate_t;

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_alnum_ascii(uint8_t c)
{
    return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

static bool is_hex(uint8_t c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static void set_mode(jstate_t *s, uint8_t mode)
{
    s->mode = mode;
    s->sub = s->lit = s->need = s->lo = s->hi = s->run = 0;
    s->num = s->frac = 0;
    s->rx = 0;
}

/* Whether a bounded integer node may still take a value that starts as num does: num itself
 * (more: false), or num followed by more digits. */
static bool integer_reaches(const snode_t *n, int64_t num, bool more)
{
    if (!more) return range_has(num, num, n->lo, n->hi, n->mult);
    const bool neg = num < 0;
    const wide_t m = neg ? -(wide_t)num : (wide_t)num;
    /* magnitudes num reaches with k more digits: [m 10^k, m 10^k + 10^k - 1] (k = 0: m) */
    const wide_t far = n->hi > -n->lo ? (wide_t)n->hi : -(wide_t)n->lo;
    for (wide_t p = 1;; p *= 10) {
        const wide_t base = m * p, top = base + (p - 1);
        if (range_has(neg ? -top : base, neg ? -base : top, n->lo, n->hi, n->mult)) return true;
        if (base > far || p > (wide_t)INT64_MAX) return false;
    }
}

/* Whether a bounded number written so far as s says (its sign in lit, integer part num,
 * fraction frac of need digits, s->sub where it is) can still be one within its node's bounds:
 * as it is (ended), or with more digits. */
static bool number_reaches(const snode_t *n, const jstate_t *s, bool ended)
{
    const wide_t unit = pow10_wide(NUM_FRAC);
    const bool neg = s->lit;
    wide_t a, b;             /* the magnitudes it reaches, in units: [a, b] */
    if (s->sub == N_MINUS) { /* any magnitude: a value <= 0 */
        return range_has(n->nlo, 0, n->nlo, n->nhi, n->mult);
    } else if (s->sub == N_DOT || s->sub == N_FRAC) {
        const wide_t step = pow10_wide(NUM_FRAC - s->need);
        a = (wide_t)s->num * unit + (wide_t)s->frac * step;
        b = ended ? a : a + step - 1;
    } else if (ended || s->sub == N_ZERO) { /* an integer part that takes no more digits */
        a = (wide_t)s->num * unit;
        b = ended ? a : a + unit - 1;
    } else { /* more integer digits may come: num 10^k and up, for each k */
        for (wide_t base = s->num, p = 1; base <= INT64_MAX; base *= 10, p *= 10) {
            const wide_t lo = base * unit, hi = (base + p) * unit - 1;
            if (range_has(neg ? -hi : lo, neg ? -lo : hi, n->nlo, n->nhi, n->mult)) return true;
        }
        return false;
    }
    return range_has(neg ? -b : a, neg ? -a : b, n->nlo, n->nhi, n->mult);
}

/* The properties a described object may take next, from p: up to the first required one. */
static uint64_t keys_allowed(const snode_t *o, unsigned p)
{
    if (p >= o->n) return 0;
    const uint64_t from_p = (o->n >= 64 ? ~0ull : (1ull << o->n) - 1) & ~((1ull << p) - 1);
    const uint64_t req = o->required & from_p;
    const uint64_t upto = req ? (req & -req) * 2 - 1 : ~0ull; /* through the first required */
    return from_p & upto;
}

/* An object without listed properties counts its keys in its frame's p only where it has
 * bounds on them (so the free objects' states, and their masks, stay one) */
static bool counts_keys(const snode_t *o)
{
    return o->generic && (o->min_items > 0 || o->max_items >= 0);
}

static bool must_go_on(const snode_t *o, unsigned p) /* a required property still missing */
{
    return p < o->n && (o->required >> p) != 0;
}

/* A described object bounds its key count where it may bind (compile_object) */
static bool bounds_keys(const snode_t *o)
{
    return !o->generic && (o->min_items > 0 || o->max_items >= 0);
}

/* The keys a described object may take next at frame f: keys_allowed, and where it bounds its
 * key count, only those after which the count can still end within the bounds (the required
 * ones after the key still fit under the max, the rest can still reach the min) */
static uint64_t keys_open(const snode_t *o, const frame_t *f)
{
    if (o->kind == K_OBJUNION) return keys_allowed(o, 0); /* (its trie: bit 0 on every key) */
    const uint64_t m = keys_allowed(o, f->p);
    if (!m || !bounds_keys(o)) return m;
    uint64_t open = 0;
    for (unsigned j = f->p; j < o->n; j++) {
        if (!((m >> j) & 1)) continue;
        const int after = f->n + 1, rest = o->n - 1 - (int)j;
        const int req_rest = j + 1 < 64 ? __builtin_popcountll(o->required >> (j + 1)) : 0;
        if ((o->max_items < 0 || after + req_rest <= o->max_items) && after + rest >= o->min_items)
            open |= 1ull << j;
    }
    return open;
}

/* A described object may end at frame f: nothing required missing, and its count reached */
static bool may_close(const snode_t *o, const frame_t *f)
{
    if (o->kind == K_OBJUNION) return o->empty_ok;
    return !must_go_on(o, f->p) && (!bounds_keys(o) || f->n >= o->min_items);
}

/* The object a frame reads keys as: an object union through its prefix reads its first
 * branch's (the same in every branch) */
static const snode_t *frame_object(const rules_t *r, const frame_t *f)
{
    const snode_t *o = &r->nodes[f->node];
    if (o->kind == K_OBJUNION && f->p < o->prefix) return &r->nodes[r->refs_list[o->first]];
    return o;
}

static bool push(const rules_t *r, jstate_t *s, uint16_t node)
{
    if (s->depth >= BT_GRAMMAR_MAX_DEPTH) return false;
    s->stack[s->depth++] = (frame_t){node, 0, 0, 0, 0};
    set_mode(s, r->nodes[node].kind == K_ARRAY ? M_ARR_FIRST : M_OBJ_FIRST);
    s->vnode = s->tpos = 0;
    return true;
}

/* A value just ended: what its container expects next. */
static void value_end(const rules_t *r, jstate_t *s)
{
    const uint16_t at = s->tpos; /* (an enum's: the value it ended on) */
    s->key = 0;
    s->vnode = s->tpos = 0;
    if (s->depth == 0) {
        set_mode(s, M_DONE);
        return;
    }
    frame_t *f = &s->stack[s->depth - 1];
    if (f->disc) {
        /* a discriminator's value: its branch, past the key (enum_at's node says which) */
        const int t = r->lit[at].term;
        f->node = r->refs_list[r->nodes[f->node].first + t / 64];
        f->p = (uint8_t)(t % 64 + 1);
        f->disc = 0;
    }
    if (f->dsml) { /* a parameter's JSON value: its end tag */
        set_mode(s, M_DLIT);
        s->lit = D_PARAM_CLOSE;
    } else if (r->nodes[f->node].kind == K_OBJECT || r->nodes[f->node].kind == K_OBJUNION) {
        set_mode(s, M_OBJ_NEXT);
    } else {
        if (f->p < 255) f->p++;
        set_mode(s, M_ARR_NEXT);
    }
}

static void pop(const rules_t *r, jstate_t *s)
{
    s->stack[--s->depth] = (frame_t){0, 0, 0, 0, 0};
    value_end(r, s);
}

static bool step(const rules_t *r, jstate_t *s, uint8_t c);

/* A literal (enum value) advanced to node k: done when it has no longer continuation. */
static void enum_at(const rules_t *r, jstate_t *s, uint16_t k)
{
    s->mode = M_ENUM;
    s->tpos = k;
    if (r->lit[k].term >= 0 && !r->lit[k].child) value_end(r, s);
}

/* Tool calls: the choice texts the state allows (bit i: choice_text[which][i]). */
static uint64_t choices_allowed(const rules_t *r, const jstate_t *s, int which)
{
    if (which == 1) return r->one ? 2u : 3u; /* another invoke, unless one call is asked */
    const frame_t *f = &s->stack[s->depth - 1];
    const snode_t *o = &r->nodes[f->node];
    if (o->generic) /* any parameters, up to 16 (and minProperties .. maxProperties) */
        return (f->p < FREE_PARAMS && (o->max_items < 0 || f->p < o->max_items) ? 1u : 0u) |
               (f->p >= o->min_items ? 2u : 0u);
    return (keys_open(o, f) ? 1u : 0u) | (may_close(o, f) ? 2u : 0u);
}

static void enter_choice(const rules_t *r, jstate_t *s, int which)
{
    set_mode(s, M_DCHOICE);
    s->lit = (uint8_t)which;
    s->tpos = which ? r->choice_b : r->choice_a;
    s->vnode = 0;
}

static bool dsml_choice_step(const rules_t *r, jstate_t *s, uint8_t c)
{
    const uint16_t k = lit_find(r, s->tpos, c);
    if (!k || !(r->lit[k].below & choices_allowed(r, s, s->lit))) return false;
    s->tpos = k;
    const int16_t t = r->lit[k].term;
    if (t < 0) return true;
    if (s->lit == 0 && t == 0) { /* a parameter: its name, as the object's keys are written */
        const frame_t *f = &s->stack[s->depth - 1];
        set_mode(s, r->nodes[f->node].generic ? M_DANYNAME : M_KEYLIT);
        s->tpos = r->nodes[f->node].generic ? 0 : r->nodes[f->node].lit;
    } else if (s->lit == 0) { /* the invoke's end */
        s->stack[--s->depth] = (frame_t){0, 0, 0, 0, 0};
        memset(s->names, 0, sizeof s->names);
        enter_choice(r, s, 1);
    } else if (t == 0) { /* another invoke */
        set_mode(s, M_DNAME);
        s->tpos = r->names;
    } else {
        set_mode(s, M_DONE);
        s->tpos = 0;
    }
    return true;
}

/* A parameter's name where the tool lists none: an identifier of letters, digits, '_', '-'
 * and '.' between quotes (what a parser and a JSON key take as they are), then a value of
 * additionalProperties' schema (NODE_ANY where there is none: either form). num: the name's FNV-1a
 * hash so far; the closing quote only where no earlier parameter of the call hashed the same (a
 * name that collides, one pair in 65536, goes on: never a dead end). */
static bool dsml_any_name_step(const rules_t *r, jstate_t *s, uint8_t c)
{
    if (s->sub == 0) {
        if (c != '"') return false;
        s->sub = 1;
        s->num = 2166136261u;
        return true;
    }
    if (c == '"' && s->sub == 2) {
        frame_t *f = &s->stack[s->depth - 1];
        const uint16_t h = (uint16_t)(s->num ^ (s->num >> 16)); /* (FNV-1a folded) */
        for (int i = 0; i < f->p; i++)
            if (s->names[i] == h) return false;
        s->names[f->p++] = h; /* (choices_allowed keeps p below FREE_PARAMS) */
        const uint16_t values = r->nodes[f->node].items; /* (additionalProperties' schema) */
        set_mode(s, M_DLIT);
        s->lit = r->nodes[values].kind == K_ANY      ? D_STR_ANY
                 : r->nodes[values].kind == K_STRING ? D_STR_TRUE
                                                     : D_STR_FALSE;
        s->vnode = values;
        return true;
    }
    if (!(is_alnum_ascii(c) || c == '_' || c == '-' || c == '.')) return false;
    s->sub = 2;
    s->num = (int64_t)(((uint32_t)s->num ^ c) * 16777619u);
    return true;
}

static bool dsml_lit_step(const rules_t *r, jstate_t *s, uint8_t c)
{
    if (s->lit == D_STR_ANY && !dsml_lit[D_STR_ANY][s->sub]) { /* true or false, by this byte */
        if (c == (uint8_t)dsml_lit[D_STR_TRUE][s->sub])
            s->lit = D_STR_TRUE;
        else if (c == (uint8_t)dsml_lit[D_STR_FALSE][s->sub])
            s->lit = D_STR_FALSE;
        else
            return false;
    }
    const char *text = dsml_lit[s->lit];
    if (s->lit == D_OPEN && s->sub == 0 && is_ws(c)) { /* (before the block) */
        if (s->run >= BT_GRAMMAR_MAX_WS) return false;
        s->run++;
        return true;
    }
    if (c != (uint8_t)text[s->sub]) return false;
    s->run = 0;
    if (text[++s->sub] || s->lit == D_STR_ANY) return true; /* (D_STR_ANY: the form next) */
    const uint16_t vnode = s->vnode;
    switch (s->lit) {
    case D_OPEN:
        set_mode(s, M_DNAME);
        s->tpos = r->names;
        return true;
    case D_NAME_END: /* the parameters, an object written as DSML */
        if (s->depth >= BT_GRAMMAR_MAX_DEPTH) return false;
        s->stack[s->depth++] = (frame_t){vnode, 0, 1, 0, 0};
        enter_choice(r, s, 0);
        return true;
    case D_STR_TRUE:
        set_mode(s, M_RAW);
        if (r->nodes[vnode].kind == K_STRING && r->nodes[vnode].rx) /* (vnode: the parameter's) */
            s->rx = r->rx[r->nodes[vnode].rx - 1]->start;
        return true;
    case D_STR_FALSE:
        set_mode(s, M_VALUE); /* (vnode: the parameter's) */
        return true;
    default: /* a parameter's end */
        enter_choice(r, s, 0);
        return true;
    }
}

static bool value_start(const rules_t *r, jstate_t *s, uint8_t c, uint16_t node)
{
    const snode_t *n = &r->nodes[node];
    if (!has_bit(n->starts, c)) return false;
    switch (n->kind) {
    case K_UNION:
        for (int i = 0; i < n->n; i++) {
            const uint16_t b = r->refs_list[n->first + i];
            if (has_bit(r->nodes[b].starts, c)) return value_start(r, s, c, b);
        }
        return false;
    case K_KEYTYPE: /* an object union's shared key: the value's first byte says the branch */
        for (int i = 0; i < n->n; i++) {
            const uint16_t v = r->refs_list[n->first + i];
            if (!has_bit(r->nodes[v].starts, c)) continue;
            const int t = r->refs_list[n->first + n->n + i];
            frame_t *f = &s->stack[s->depth - 1]; /* (the union's) */
            f->node = r->refs_list[r->nodes[f->node].first + t / 64];
            f->p = (uint8_t)(t % 64 + 1);
            f->disc = 0;
            return value_start(r, s, c, v);
        }
        return false;
    case K_OBJECT:
    case K_OBJUNION:
    case K_ARRAY:
        return push(r, s, node);
    case K_ENUM: {
        const uint16_t k = lit_find(r, n->lit, c);
        if (!k) return false;
        enum_at(r, s, k);
        return true;
    }
    default:
        break;
    }
    if (c == '{') return push(r, s, NODE_ANY_OBJECT);
    if (c == '[') return push(r, s, NODE_ANY_ARRAY);
    if (c == '"') {
        set_mode(s, M_STR);
        if (n->kind == K_STRING && n->bounded) s->vnode = node; /* (its length counted in num) */
        if (n->kind == K_STRING && n->rx) { /* (its bytes walk its pattern's DFA) */
            s->vnode = node;
            s->rx = r->rx[n->rx - 1]->start;
        }
        return true;
    }
    if (c == 't' || c == 'f' || c == 'n') {
        set_mode(s, M_LIT);
        s->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->sub = 1;
        return true;
    }
    set_mode(s, M_NUM); /* ('-' or a digit: starts says so) */
    s->vnode = node;
    s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
    s->run = 1;
    if (n->bounded && n->kind == K_NUMBER) {
        s->lit = c == '-'; /* (the sign; the digits' magnitude in num and frac) */
        s->num = c == '-' ? 0 : c - '0';
        return number_reaches(n, s, false);
    }
    if (n->bounded) { /* '-' leads to values up to -0; a digit d to d (0: nothing more) */
        if (c == '-') return n->lo <= 0;
        s->num = c - '0';
        return integer_reaches(n, s->num, c != '0');
    }
    return true;
}

/* A bounded number is written without an exponent (its digits then say its value exactly, and
 * any value within bounds of up to NUM_FRAC decimals can be). */
static bool number_step(const rules_t *r, jstate_t *s, uint8_t c)
{
    const snode_t *n = &r->nodes[s->vnode];
    const bool integer = n->kind == K_INTEGER, bounded_number = n->bounded && !integer;
    const bool dot = c == '.' && !integer;
    const bool e = (c == 'e' || c == 'E') && !integer && !bounded_number;
    uint8_t next;
    switch (s->sub) {
    case N_MINUS:
        next = c == '0' ? N_ZERO : is_digit(c) ? N_INT : 0xff;
        break;
    case N_ZERO:
        next = dot ? N_DOT : e ? N_E : 0xfe;
        break;
    case N_INT:
        next = is_digit(c) ? N_INT : dot ? N_DOT : e ? N_E : 0xfe;
        break;
    case N_DOT:
        next = is_digit(c) ? N_FRAC : 0xff;
        break;
    case N_FRAC:
        next = is_digit(c) ? N_FRAC : e ? N_E : 0xfe;
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
        if (n->bounded &&
            (integer ? !integer_reaches(n, s->num, false) : !number_reaches(n, s, true)))
            return false;
        value_end(r, s);
        return step(r, s, c);
    }
    if (s->run >= BT_GRAMMAR_MAX_NUMBER) return false;
    if (bounded_number) { /* (digits or the point come here) */
        const int d = c - '0';
        if (next == N_FRAC) {
            if (s->need >= NUM_FRAC) return false;
            s->frac = s->frac * 10 + d;
            s->need++;
        } else if (next != N_DOT) { /* an integer digit */
            if (s->num > (INT64_MAX - 9) / 10) return false;
            s->num = s->num * 10 + d;
        }
        s->sub = next;
        s->run++;
        return number_reaches(n, s, false);
    }
    if (n->bounded) { /* (only digits come here: an integer has no '.' or exponent) */
        const int d = c - '0';
        if (s->sub == N_MINUS) {
            s->num = -d; /* ("-0": 0, nothing more) */
        } else {
            const uint64_t m = s->num < 0 ? 0 - (uint64_t)s->num : (uint64_t)s->num;
            if (m > (uint64_t)(INT64_MAX - 9) / 10) return false;
            s->num = s->num < 0 ? s->num * 10 - d : s->num * 10 + d;
        }
        if (!integer_reaches(n, s->num, next == N_INT)) return false;
    }
    s->sub = next;
    s->run++;
    return true;
}

/* A string's short escapes and the bytes they stand for. */
static const char short_escapes[] = "\"\\/bfnrt";
static const char escaped_bytes[] = "\"\\/\b\f\n\r\t";

/* In a string with a pattern: its DFA's state after byte b of the text; 0: b cannot come. */
static uint16_t rx_next(const rules_t *r, const jstate_t *s, uint8_t b)
{
    const bt_regex_t *re = r->rx[r->nodes[s->vnode].rx - 1];
    return re->next[(size_t)s->rx * 256 + b];
}

/* A string with a pattern is written raw but for the short escapes (no \u: the characters
 * that need one are the control characters, which patterns hardly want), so the DFA sees each
 * byte of the text as it comes. */
static bool string_step(const rules_t *r, jstate_t *s, uint8_t c)
{
    switch (s->mode) {
    case M_STR_ESC: {
        if (c == 'u') {
            if (s->rx) return false;
            s->mode = M_STR_HEX;
            s->sub = 4;
            return true;
        }
        const char *e = c ? strchr(short_escapes, c) : NULL;
        if (!e || s->lit == LOW_NEXT) return false;
        if (s->rx && !(s->rx = rx_next(r, s, (uint8_t)escaped_bytes[e - short_escapes])))
            return false;
        s->mode = M_STR;
        return true;
    }
    case M_STR_HEX: {
        if (!is_hex(c)) return false;
        const bool d = c == 'd' || c == 'D';
        const bool upper8 =
            (c >= '8' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
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
        if (s->rx && !(s->rx = rx_next(r, s, c))) return false;
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
    if (s->lit == LOW_NEXT) { /* only the low surrogate's escape (its pair counts once) */
        if (c != '\\') return false;
        s->mode = M_STR_ESC;
        return true;
    }
    /* a string with minLength / maxLength: num counts its characters (code points), each when
     * it starts (a byte, an escape's backslash, a UTF-8 sequence's first byte) */
    const snode_t *sn = &r->nodes[s->vnode];
    const bool counted = !s->key && sn->kind == K_STRING && sn->bounded;
    if (c == '"' && counted && s->num < sn->lo) return false;
    if (c != '"' && counted) {
        if (sn->hi >= 0 && s->num >= sn->hi) return false;
        s->num++;
    }
    if (c == '"' && s->rx && !r->rx[r->nodes[s->vnode].rx - 1]->accept[s->rx]) return false;
    if (c == '"') {
        if (s->key) { /* a key of an object without properties: a value as its schema says */
            s->key = 0;
            set_mode(s, M_COLON);
            s->vnode = r->nodes[s->stack[s->depth - 1].node].items;
        } else {
            value_end(r, s);
        }
        return true;
    }
    if (c == '\\') {
        bool some = !s->rx; /* (with a pattern: if some escaped byte may come) */
        for (int i = 0; !some && escaped_bytes[i]; i++)
            some = rx_next(r, s, (uint8_t)escaped_bytes[i]) != 0;
        if (!some) return false;
        s->mode = M_STR_ESC;
        return true;
    }
    if (c < 0x20) return false;
    if (s->rx && !(s->rx = rx_next(r, s, c))) return false;
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

/* A string parameter's raw text, up to its end tag (sub: the tag's bytes matched so far). With
 * a pattern, rx is the DFA's state with every byte so far taken as text, the bytes of a tag
 * begun included, and tpos its state where that tag began: the tag may begin only where the
 * text may end, and bytes that turn out not to be the tag must have been text the pattern
 * takes. */
static bool raw_step(const rules_t *r, jstate_t *s, uint8_t c)
{
    const bt_regex_t *re = s->rx ? r->rx[r->nodes[s->vnode].rx - 1] : NULL;
    const bool patterned = re || s->tpos; /* (rx may be 0 inside a tag: the text dead) */
    if (s->sub && c == (uint8_t)raw_end[s->sub]) {
        if (raw_end[++s->sub] == 0) {
            set_mode(s, M_DLIT);
            s->lit = D_NEWLINE;
            s->tpos = 0;
            return true;
        }
        if (re) s->rx = re->next[(size_t)s->rx * 256 + c];
        return true;
    }
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') return false;
    const snode_t *sn = &r->nodes[s->vnode];
    if (!patterned && sn->kind == K_STRING && sn->bounded) {
        /* minLength / maxLength: num counts the text's characters (code points, each at its
         * first byte); the bytes of an end tag that broke off were text, and one may begin only
         * once the text is long enough */
        for (int i = 0; i < s->sub; i++)
            s->num += ((uint8_t)raw_end[i] & 0xc0) != 0x80;
        const bool tag = c == (uint8_t)raw_end[0] && s->num >= sn->lo;
        if (!tag && (c & 0xc0) != 0x80) s->num++;
        s->sub = tag;
        return sn->hi < 0 || s->num <= sn->hi;
    }
    if (!patterned) {
        s->sub = c == (uint8_t)raw_end[0];
        return true;
    }
    if (!re) return false; /* a tag broke off where its bytes cannot be text */
    const uint16_t before = s->rx, after = re->next[(size_t)before * 256 + c];
    if (c == (uint8_t)raw_end[0] && re->accept[before]) { /* the end tag may begin here */
        s->sub = 1;
        s->tpos = before;
        s->rx = after;
        return true;
    }
    s->sub = 0;
    s->tpos = 0;
    s->rx = after;
    return after != 0;
}

/* Advances s by byte c; false (s then undefined) when c cannot come here. */
static bool step(const rules_t *r, jstate_t *s, uint8_t c)
{
    switch (s->mode) {
    case M_REGEX:
        return (s->rx = r->rx[0]->next[(size_t)s->rx * 256 + c]) != 0;
    case M_STR:
    case M_STR_ESC:
    case M_STR_HEX:
    case M_STR_UTF8:
        if (s->depth && s->stack[0].dsml) { /* tpos: bytes of param_end matched */
            s->tpos = c == (uint8_t)param_end[s->tpos] ? s->tpos + 1 : c == (uint8_t)param_end[0];
            if (!param_end[s->tpos]) return false;
        }
        return string_step(r, s, c);
    case M_NUM:
        return number_step(r, s, c);
    case M_LIT: {
        const char *lit = literals[s->lit];
        if (c != (uint8_t)lit[s->sub]) return false;
        if (lit[++s->sub] == 0) value_end(r, s);
        return true;
    }
    case M_KEYLIT: {
        const frame_t *f = &s->stack[s->depth - 1];
        const snode_t *o = frame_object(r, f);
        const uint16_t k = lit_find(r, s->tpos, c);
        if (!k || !(r->lit[k].below & keys_open(o, f))) return false;
        s->tpos = k;
        int16_t j = r->lit[k].term;
        if (j == DISC_TERM && o->kind == K_OBJUNION) { /* the branch: the value's */
            set_mode(s, M_COLON);
            s->tpos = 0;
            s->vnode = o->items;
            s->stack[s->depth - 1].disc = 1;
            return true;
        }
        if (j >= 0 && o->kind == K_OBJUNION) { /* the first key after the prefix: its branch */
            const uint16_t b = r->refs_list[o->first + j / 64];
            s->stack[s->depth - 1].node = b;
            o = &r->nodes[b];
            j %= 64;
        }
        if (j >= 0) { /* the key's closing quote */
            s->stack[s->depth - 1].p = (uint8_t)(j + 1);
            if (bounds_keys(o)) s->stack[s->depth - 1].n++; /* (at most 64) */
            const bool dsml = f->dsml;
            set_mode(s, dsml ? M_DLIT : M_COLON);
            s->tpos = 0;
            s->vnode = r->refs_list[o->first + j];
            /* a string parameter is written raw; the rest as JSON */
            if (dsml) s->lit = r->nodes[s->vnode].kind == K_STRING ? D_STR_TRUE : D_STR_FALSE;
        }
        return true;
    }
    case M_DLIT:
        return dsml_lit_step(r, s, c);
    case M_DNAME: {
        const uint16_t k = lit_find(r, s->tpos, c);
        if (!k) return false;
        s->tpos = k;
        if (r->lit[k].term >= 0) { /* the name's closing quote */
            s->vnode = r->refs_list[r->tools_first + r->lit[k].term];
            set_mode(s, M_DLIT);
            s->tpos = 0;
            s->lit = D_NAME_END;
        }
        return true;
    }
    case M_DCHOICE:
        return dsml_choice_step(r, s, c);
    case M_RAW:
        return raw_step(r, s, c);
    case M_DANYNAME:
        return dsml_any_name_step(r, s, c);
    case M_ENUM: {
        const uint16_t k = lit_find(r, s->tpos, c);
        if (k) {
            enum_at(r, s, k);
            return true;
        }
        if (r->lit[s->tpos].term < 0) return false;
        value_end(r, s); /* a number that could have gone on ("1" of 1 and 12) */
        return step(r, s, c);
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
    const frame_t *f = s->depth ? &s->stack[s->depth - 1] : NULL;
    const snode_t *o = f ? frame_object(r, f) : NULL;
    switch (s->mode) {
    case M_VALUE:
        return value_start(r, s, c, s->vnode);
    case M_OBJ_FIRST:
        if (c == '}') {
            if (o->generic ? o->min_items > 0 : !may_close(o, f)) return false;
            pop(r, s);
            return true;
        }
        /* fall through */
    case M_OBJ_KEY:
        if (c != '"') return false;
        if (o->generic) {
            if (o->max_items >= 0 && f->p >= o->max_items) return false;
            if (counts_keys(o) && f->p < 255) s->stack[s->depth - 1].p++; /* (min <= 255) */
            set_mode(s, M_STR);
            s->key = 1;
            return true;
        }
        if (!keys_open(o, f)) return false;
        set_mode(s, M_KEYLIT);
        s->tpos = o->lit;
        return step(r, s, c);
    case M_COLON:
        if (c != ':') return false;
        s->mode = M_VALUE; /* (vnode: the value's node) */
        return true;
    case M_OBJ_NEXT:
        if (c == ',') {
            if (o->generic ? o->max_items >= 0 && f->p >= o->max_items : !keys_open(o, f))
                return false;
            set_mode(s, M_OBJ_KEY);
            return true;
        }
        if (c != '}' || (o->generic ? f->p < o->min_items : !may_close(o, f))) return false;
        pop(r, s);
        return true;
    case M_ARR_FIRST:
        if (c == ']') {
            if (o->min_items > 0) return false;
            pop(r, s);
            return true;
        }
        if (o->max_items == 0) return false;
        return value_start(r, s, c, o->items);
    case M_ARR_NEXT:
        if (c == ',') {
            if (o->max_items >= 0 && f->p >= o->max_items) return false;
            set_mode(s, M_VALUE);
            s->vnode = o->items;
            return true;
        }
        if (c != ']' || f->p < o->min_items) return false;
        pop(r, s);
        return true;
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

enum { CACHE_SLOTS = 256, CACHE_PROBES = 8, MAX_SCHEMAS = 16 };

struct cache_entry {
    bool used;
    jstate_t key;
    uint64_t last_use;
    uint32_t *mask;
};

struct bt_grammar_vocab {
    int vocab, words;
    int32_t eos;
    char **bytes; /* per id, NULL: never allowed */
    size_t *lens;
    size_t max_len; /* the longest id's bytes */
    int32_t *tok_next;
    tnode_t *nodes;
    uint32_t n_nodes, cap_nodes;
    pthread_mutex_t lock; /* the schemas and their caches */
    rules_t *schemas;     /* compiled, shared by the requests that send the same text */
    int n_schemas;
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
        if (lens[i] > v->max_len) v->max_len = lens[i];
        trie_insert(v, i, bytes[i], lens[i]);
    }
    pthread_mutex_init(&v->lock, NULL);
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

static void rules_free(rules_t *r)
{
    if (!r) return;
    for (int i = 0; r->cache && i < CACHE_SLOTS; i++)
        free(r->cache[i].mask);
    free(r->cache);
    free(r->text);
    free(r->nodes);
    free(r->refs_list);
    free(r->lit);
    for (int i = 0; i < r->n_rx; i++)
        bt_regex_free(r->rx[i]);
    free(r->rx);
    free(r);
}

void bt_grammar_vocab_destroy(bt_grammar_vocab_t *v)
{
    if (!v) return;
    for (int i = 0; i < v->vocab; i++)
        free(v->bytes[i]);
    for (rules_t *r = v->schemas, *next; r; r = next) {
        next = r->next;
        rules_free(r);
    }
    pthread_mutex_destroy(&v->lock);
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

/* The compiled schema of this text (NULL: any object), shared; a reference for the caller. */
/* What a constraint's text is. */
typedef enum { FORM_SCHEMA, FORM_TOOLS, FORM_REGEX } form_t;

static bt_status_t schema_get(bt_grammar_vocab_t *v, const char *text, size_t len, form_t form,
                              rules_t **r_p, char *err, size_t errlen)
{
    const bool tools = form == FORM_TOOLS, regex = form == FORM_REGEX;
    pthread_mutex_lock(&v->lock);
    v->clock++;
    for (rules_t *r = v->schemas; r; r = r->next)
        if (r->tools == tools && r->regex == regex &&
            ((!text && !r->text) ||
             (text && r->text && r->text_len == len && !memcmp(r->text, text, len)))) {
            r->refs++;
            r->last_use = v->clock;
            pthread_mutex_unlock(&v->lock);
            *r_p = r;
            return BT_OK;
        }
    pthread_mutex_unlock(&v->lock);
    rules_t *r;
    const bt_status_t st = tools   ? rules_compile_tools(text, len, &r, err, errlen)
                           : regex ? rules_compile_regex(text, len, &r, err, errlen)
                                   : rules_compile(text, len, &r, err, errlen);
    if (st != BT_OK) return st;
    if (text) {
        r->text = bt_malloc_or_die(len ? len : 1);
        memcpy(r->text, text, len);
        r->text_len = len;
    }
    r->cache = bt_calloc_or_die(CACHE_SLOTS, sizeof *r->cache);
    r->refs = 2; /* the list's and the caller's */
    pthread_mutex_lock(&v->lock);
    r->last_use = v->clock;
    r->next = v->schemas;
    v->schemas = r;
    if (++v->n_schemas > MAX_SCHEMAS) { /* the least recently used one no request holds */
        rules_t **victim = NULL;
        for (rules_t **p = &v->schemas; *p; p = &(*p)->next)
            if ((*p)->refs == 1 && (!victim || (*p)->last_use < (*victim)->last_use)) victim = p;
        if (victim) {
            rules_t *gone = *victim;
            *victim = gone->next;
            v->n_schemas--;
            rules_free(gone);
        }
    }
    pthread_mutex_unlock(&v->lock);
    *r_p = r;
    return BT_OK;
}

static void schema_release(bt_grammar_vocab_t *v, rules_t *r)
{
    pthread_mutex_lock(&v->lock);
    r->refs--;
    pthread_mutex_unlock(&v->lock);
}

/* Every token whose bytes the automaton takes from st, below trie node n. */
static void walk(const bt_grammar_vocab_t *v, const rules_t *r, uint32_t n, const jstate_t *st,
                 uint32_t *mask)
{
    /* inside a string, plain ASCII leaves the state as it is: no copy (most of a string's walk;
     * not where its length is counted) */
    const bool in_text = st->mode == M_STR && st->lit == SURROGATE_NONE && !st->rx &&
                         !(st->depth && st->stack[0].dsml) && /* (param_end's guard) */
                         !(r->nodes[st->vnode].kind == K_STRING && r->nodes[st->vnode].bounded);
    for (uint32_t k = v->nodes[n].child; k; k = v->nodes[k].sibling) {
        const uint8_t c = v->nodes[k].byte;
        const bool same = in_text && c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
        jstate_t s;
        if (!same) {
            s = *st;
            if (!step(r, &s, c)) continue;
        }
        for (int32_t t = v->nodes[k].tok; t >= 0; t = v->tok_next[t])
            mask[t >> 5] |= 1u << (t & 31);
        walk(v, r, k, same ? st : &s, mask);
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

/* The mask of state st into out, from the schema's cache or computed into it. */
static void vocab_mask(bt_grammar_vocab_t *v, rules_t *r, const jstate_t *st, uint32_t *out)
{
    const size_t bytes = (size_t)v->words * sizeof *out;
    /* a counted string's length matters to the mask only within a token's length of its
     * bounds: further from them, one count stands for all (the cache's key and the walk's
     * start), so a long string does not miss the cache at every step */
    jstate_t canon;
    const snode_t *sn = &r->nodes[st->vnode];
    if (((st->mode >= M_STR && st->mode <= M_STR_UTF8 && !st->key) ||
         (st->mode == M_RAW && st->sub == 0)) &&
        sn->kind == K_STRING && sn->bounded) {
        const int64_t L = (int64_t)v->max_len, count = st->num;
        const bool room = sn->hi < 0 || sn->hi - count >= L;
        canon = *st;
        if (count >= sn->lo && room)
            canon.num = sn->lo;
        else if (sn->lo - count >= L && room)
            canon.num = sn->lo - L;
        st = &canon;
    }
    /* a free-form parameter's name: its hash matters only once the call has names to differ
     * from */
    if (st->mode == M_DANYNAME && !st->stack[st->depth - 1].p) {
        if (st != &canon) canon = *st;
        canon.num = 0;
        st = &canon;
    }
    const uint64_t h = state_hash(st);
    pthread_mutex_lock(&v->lock);
    v->looked_up++;
    v->clock++;
    cache_entry_t *victim = NULL;
    for (int p = 0; p < CACHE_PROBES; p++) {
        cache_entry_t *e = &r->cache[(h + (uint64_t)p) % CACHE_SLOTS];
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
    walk(v, r, 0, st, out);
    if (st->mode == M_REGEX && r->rx[0]->accept[st->rx] && v->eos >= 0) /* (it may end here) */
        out[v->eos >> 5] |= 1u << (v->eos & 31);
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
    rules_t *r;
    int32_t after;
    bool active;
    jstate_t s;
};

/* A constraint under the compiled text (a schema, or with tools a tool-call spec). */
static bt_status_t grammar_new(bt_grammar_vocab_t *v, const char *text, size_t len, form_t form,
                               int32_t after_token, bt_grammar_t **g_p, char *err, size_t errlen)
{
    rules_t *r;
    const bt_status_t st = schema_get(v, text, len, form, &r, err, errlen);
    if (st != BT_OK) return st;
    bt_grammar_t *g = bt_calloc_or_die(1, sizeof *g);
    g->v = v;
    g->r = r;
    g->after = after_token;
    g->active = after_token < 0;
    if (form == FORM_TOOLS) {
        set_mode(&g->s, M_DLIT);
        g->s.lit = D_OPEN;
    } else if (form == FORM_REGEX) {
        set_mode(&g->s, M_REGEX);
        g->s.rx = r->rx[0]->start;
    } else {
        set_mode(&g->s, M_VALUE);
        g->s.vnode = r->root;
    }
    *g_p = g;
    return BT_OK;
}

bt_status_t bt_grammar_json_schema(bt_grammar_vocab_t *v, const char *schema, size_t len,
                                   int32_t after_token, bt_grammar_t **g_p, char *err,
                                   size_t errlen)
{
    return grammar_new(v, schema, len, FORM_SCHEMA, after_token, g_p, err, errlen);
}

bt_status_t bt_grammar_tool_calls(bt_grammar_vocab_t *v, const char *spec, size_t len,
                                  int32_t after_token, bt_grammar_t **g_p, char *err, size_t errlen)
{
    return grammar_new(v, spec, len, FORM_TOOLS, after_token, g_p, err, errlen);
}

bt_status_t bt_grammar_regex(bt_grammar_vocab_t *v, const char *pattern, size_t len,
                             int32_t after_token, bt_grammar_t **g_p, char *err, size_t errlen)
{
    return grammar_new(v, pattern, len, FORM_REGEX, after_token, g_p, err, errlen);
}

bt_status_t bt_grammar_regex_check(const char *pattern, size_t len, char *err, size_t errlen)
{
    rules_t *r = NULL;
    const bt_status_t st = rules_compile_regex(pattern, len, &r, err, errlen);
    rules_free(r);
    return st;
}

/* Which constraint kind names (0 object, 1 schema, 2 tool calls), -1 none, -2 unknown; err
 * says what is wrong with kind and spec together. */
static int request_kind(const char *kind, const char *spec, char *err, size_t errlen)
{
    static const char *const kinds[] = {"json_object", "json_schema", "tool_calls", "regex"};
    if (!kind || !*kind) return -1;
    int k = -2;
    for (int i = 0; i < 4; i++)
        if (!strcmp(kind, kinds[i])) k = i;
    const bool has_spec = spec && *spec;
    if (k == -2)
        snprintf(err, errlen,
                 "'%.64s' is not supported (json_object, json_schema, tool_calls, regex)", kind);
    else if (has_spec != (k > 0))
        snprintf(err, errlen, "%s %s", kind, has_spec ? "takes no spec" : "needs its spec");
    else
        return k;
    return -2;
}

/* The router checks every request's constraint by compiling it: the verdicts on the last
 * CHECKS specs (up to CHECK_TEXT bytes) are kept, so a spec sent again costs a lookup. */
enum { CHECKS = 64, CHECK_TEXT = 1 << 16 };
static struct {
    char *text; /* NULL: an empty entry */
    size_t len;
    int kind;
    bt_status_t st;
    char msg[256];
    uint64_t used;
} checks[CHECKS];
static pthread_mutex_t checks_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t checks_clock, checks_done, checks_cached;

bt_status_t bt_grammar_request_check(const char *kind, const char *spec, char *err, size_t errlen)
{
    const int k = request_kind(kind, spec, err, errlen);
    if (k == -2) return BT_ERR_INVALID_ARG;
    if (k <= 0) return BT_OK;
    static bt_status_t (*const check[])(const char *, size_t, char *, size_t) = {
        NULL, bt_grammar_schema_check, bt_grammar_tool_calls_check, bt_grammar_regex_check};
    const size_t len = strlen(spec);
    pthread_mutex_lock(&checks_lock);
    checks_done++;
    int victim = 0;
    for (int i = 0; i < CHECKS; i++) {
        if (checks[i].text && checks[i].kind == k && checks[i].len == len &&
            !memcmp(checks[i].text, spec, len)) {
            const bt_status_t st = checks[i].st;
            snprintf(err, errlen, "%s", checks[i].msg);
            checks[i].used = ++checks_clock;
            checks_cached++;
            pthread_mutex_unlock(&checks_lock);
            return st;
        }
        if (checks[i].used < checks[victim].used) victim = i;
    }
    pthread_mutex_unlock(&checks_lock);
    char msg[sizeof checks[0].msg] = "";
    const bt_status_t st = check[k](spec, len, msg, sizeof msg);
    snprintf(err, errlen, "%s", msg);
    if (len > CHECK_TEXT) return st;
    pthread_mutex_lock(&checks_lock);
    free(checks[victim].text); /* (another thread's entry, maybe: the least recent either way) */
    checks[victim].text = bt_malloc_or_die(len ? len : 1);
    memcpy(checks[victim].text, spec, len);
    checks[victim].len = len;
    checks[victim].kind = k;
    checks[victim].st = st;
    memcpy(checks[victim].msg, msg, sizeof msg);
    checks[victim].used = ++checks_clock;
    pthread_mutex_unlock(&checks_lock);
    return st;
}

void bt_grammar_check_stats(uint64_t *checked, uint64_t *cached)
{
    pthread_mutex_lock(&checks_lock);
    *checked = checks_done;
    *cached = checks_cached;
    pthread_mutex_unlock(&checks_lock);
}

bt_status_t bt_grammar_request(bt_grammar_vocab_t *v, const char *kind, const char *spec,
                               int32_t after_token, bt_grammar_t **g_p, char *err, size_t errlen)
{
    *g_p = NULL;
    const int k = request_kind(kind, spec, err, errlen);
    if (k == -2) return BT_ERR_INVALID_ARG;
    if (k == -1) return BT_OK;
    static const form_t forms[] = {FORM_SCHEMA, FORM_SCHEMA, FORM_TOOLS, FORM_REGEX};
    return grammar_new(v, k ? spec : NULL, k ? strlen(spec) : 0, forms[k], after_token, g_p, err,
                       errlen);
}

bt_grammar_t *bt_grammar_json_object(bt_grammar_vocab_t *v, int32_t after_token)
{
    bt_grammar_t *g = NULL;
    char err[8];
    bt_grammar_json_schema(v, NULL, 0, after_token, &g, err, sizeof err); /* (cannot fail) */
    return g;
}

void bt_grammar_destroy(bt_grammar_t *g)
{
    if (!g) return;
    schema_release(g->v, g->r);
    free(g);
}

bt_grammar_t *bt_grammar_clone(const bt_grammar_t *g)
{
    bt_grammar_t *c = bt_malloc_or_die(sizeof *c);
    *c = *g;
    pthread_mutex_lock(&g->v->lock);
    c->r->refs++;
    pthread_mutex_unlock(&g->v->lock);
    return c;
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
    vocab_mask(v, g->r, &g->s, mask);
}

bool bt_grammar_accept_bytes(bt_grammar_t *g, const char *bytes, size_t len)
{
    jstate_t s = g->s;
    for (size_t i = 0; i < len; i++)
        if (!step(g->r, &s, (uint8_t)bytes[i])) return false;
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
    if (t == v->eos && g->s.mode == M_REGEX && g->r->rx[0]->accept[g->s.rx])
        set_mode(&g->s, M_DONE); /* (the output ends here: nothing but eos after it) */
    if (t == v->eos) return g->s.mode == M_DONE;
    if (!v->bytes[t]) return false;
    return bt_grammar_accept_bytes(g, v->bytes[t], v->lens[t]);
}

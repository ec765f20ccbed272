/* JSON Schema patterns (common/text/regex.h) against PCRE2 as the oracle: for each pattern,
 * strings walked from the DFA (which PCRE2 must match), those strings mutated, and random
 * strings over the pattern's characters must get PCRE2's verdict (a match anywhere, as the
 * keyword means; and the whole string, as a regex constraint means); every live state can still
 * reach acceptance through the bytes a text holds (no control characters but tab, newline, CR);
 * what is not supported is refused with an error naming it. */
#include "bt_test.h"

#include "common/text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
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

/* ECMA-262 patterns (in the subset regex.h takes) and, where PCRE2 spells the same language
 * differently, PCRE2's spelling: '.' does not take \r or U+2028/9 in ECMA-262, and \s there
 * includes Unicode spaces. */
typedef struct {
    const char *ecma, *pcre;
} pattern_t;

#define DOT_PCRE "[^\\n\\r\\x{2028}\\x{2029}]"
#define SPACES_PCRE                                                                                \
    "\\t\\n\\x0b\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}"    \
    "\\x{3000}\\x{feff}"
static const pattern_t patterns[] = {
    {"^[A-Z]{3}-\\d{4}$", NULL},
    {"^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$", NULL},
    {"abc", NULL},
    {"^a|b$", NULL},
    {"^(a|b)*c$", NULL},
    {"^x(?:ab|cd){2,3}y$", NULL},
    {"^(?<word>[a-z]+)(-[a-z]+)*$", NULL},
    {"^[^0-9]+$", NULL},
    {"^[\\w.%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$", NULL},
    {"^[0-9a-f]{8}-[0-9a-f]{4}$", NULL},
    {"^\\S+ \\S+$", "^[^" SPACES_PCRE "]+ [^" SPACES_PCRE "]+$"},
    {"^\\s*$", "^[" SPACES_PCRE "]*$"},
    {"^.{2,4}$", "^" DOT_PCRE "{2,4}$"},
    {"a.c", "a" DOT_PCRE "c"},
    {"^[é日😀a-c]+$", NULL},
    {"^[^é]$", NULL},
    {"^\\u00e9\\x41\\u{1F600}$", "^\\x{e9}\\x41\\x{1F600}$"},
    {"^(ab?)+?c??$", NULL},
    {"^a{0}b{1,}c{,2}$", "^a{0}b{1,}c\\{,2\\}$"},
    {"x*", NULL},
    {"^$", NULL},
    {"^[\\]\\-\\\\a]+$", NULL},
    {"^[-a]{2}$", NULL},
    {"^(|a)b$", NULL},
    {"^\\D\\W$", NULL},
    {"^(?:0|[1-9]\\d*)(?:\\.\\d+)?$", NULL},
    {"^[\\x20-\\x7e]{1,3}$", NULL},
    {"^[\\u0100-\\uffff]{2}$", "^[\\x{100}-\\x{d7ff}\\x{e000}-\\x{ffff}]{2}$"},
};

/* code points strings are drawn from: the pattern's own, and these */
static const uint32_t extra_cps[] = {'a',  'b',    'c',     'A',  'Z',    '0',    '5',  '9',  '-',
                                     '.',  ' ',    '@',     '_',  '\n',   '\r',   '\t', 'x',  'y',
                                     0xe9, 0x65e5, 0x1F600, 0xa0, 0x3000, 0x2028, '"',  '\\', '/'};

static size_t put_cp(char *b, uint32_t cp)
{
    if (cp < 0x80) {
        b[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (char)(0xC0 | cp >> 6);
        b[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12);
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (char)(0xF0 | cp >> 18);
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The code points of a UTF-8 string (valid: the tests make them). */
static int code_points(const char *s, size_t len, uint32_t *out, int cap)
{
    int n = 0;
    for (size_t i = 0; i < len && n < cap;) {
        const uint8_t c = (uint8_t)s[i];
        const int k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
        for (int j = 1; j < k; j++)
            cp = cp << 6 | ((uint8_t)s[i + (size_t)j] & 0x3F);
        out[n++] = cp;
        i += (size_t)k;
    }
    return n;
}

/* Each state's distance (bytes) to acceptance. */
static int *distances(const bt_regex_t *re)
{
    int *d = malloc((size_t)re->n_states * sizeof *d);
    for (int s = 0; s < re->n_states; s++)
        d[s] = s && re->accept[s] ? 0 : 1 << 20;
    for (bool changed = true; changed;) {
        changed = false;
        for (int s = 1; s < re->n_states; s++)
            for (int b = 0; b < 256; b++) {
                const int t = re->next[s * 256 + b];
                if (t && d[t] + 1 < d[s]) {
                    d[s] = d[t] + 1;
                    changed = true;
                }
            }
    }
    return d;
}

/* A string the DFA accepts: random bytes among the live transitions, ending once accepting
 * (sometimes going on), then the shortest way to acceptance. */
static size_t dfa_walk(const bt_regex_t *re, const int *dist, char *out, size_t cap)
{
    uint16_t s = re->start;
    size_t n = 0;
    while (n < cap) {
        if (re->accept[s] && rnd() % 3 == 0) break;
        int options[256], k = 0;
        for (int b = 0; b < 256; b++)
            if (re->next[s * 256 + b] && (b >= 0x20 || b == '\n' || b == '\t')) options[k++] = b;
        if (!k) break;
        const int b = options[rnd() % (uint32_t)k];
        out[n++] = (char)b;
        s = re->next[s * 256 + b];
    }
    while (!re->accept[s]) {
        int b = 0;
        while (!re->next[s * 256 + b] || dist[re->next[s * 256 + b]] != dist[s] - 1)
            b++;
        out[n++] = (char)b;
        s = re->next[s * 256 + b];
    }
    return n;
}

static void test_against_pcre2(void)
{
    int compared = 0, matched = 0, matched_whole = 0;
    for (size_t pi = 0; pi < sizeof patterns / sizeof patterns[0]; pi++) {
        const pattern_t *p = &patterns[pi];
        char err[256] = "";
        bt_regex_t *re = NULL;
        const bt_status_t st =
            bt_regex_compile(p->ecma, strlen(p->ecma), BT_REGEX_SEARCH, &re, err, sizeof err);
        BT_CHECK_MSG(st == BT_OK, "%s: %s", p->ecma, err);
        if (st != BT_OK) continue;
        const char *pc = p->pcre ? p->pcre : p->ecma;
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)pc, PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        BT_CHECK_MSG(code != NULL, "pcre2 cannot compile %s (at %zu)", pc, (size_t)eo);
        if (!code) {
            bt_regex_free(re);
            continue;
        }
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        bt_regex_t *whole_re = NULL;
        BT_CHECK_MSG(bt_regex_compile(p->ecma, strlen(p->ecma), BT_REGEX_WHOLE, &whole_re, err,
                                      sizeof err) == BT_OK,
                     "%s whole: %s", p->ecma, err);
        int *dist = distances(re);
        uint32_t alphabet[128];
        int na = code_points(p->ecma, strlen(p->ecma), alphabet, 96);
        for (size_t i = 0; i < sizeof extra_cps / sizeof extra_cps[0]; i++)
            alphabet[na++] = extra_cps[i];
        for (int round = 0; round < 3000; round++) {
            char s[1024];
            size_t len = 0;
            if (round % 3 == 0) { /* accepted by the DFA */
                len = dfa_walk(re, dist, s, 160);
            } else if (round % 3 == 1) { /* one accepted, then a code point changed */
                len = dfa_walk(re, dist, s, 160);
                uint32_t cps[260];
                int n = code_points(s, len, cps, 200);
                const int at = n ? (int)(rnd() % (uint32_t)(n + 1)) : 0;
                const int op = (int)(rnd() % 3);
                if (op == 0 && at < n) { /* replace */
                    cps[at] = alphabet[rnd() % (uint32_t)na];
                } else if (op == 1) { /* insert */
                    memmove(cps + at + 1, cps + at, (size_t)(n - at) * sizeof *cps);
                    cps[at] = alphabet[rnd() % (uint32_t)na];
                    n++;
                } else if (at < n) { /* delete */
                    memmove(cps + at, cps + at + 1, (size_t)(n - at - 1) * sizeof *cps);
                    n--;
                }
                len = 0;
                for (int i = 0; i < n; i++)
                    len += put_cp(s + len, cps[i]);
            } else { /* random */
                const int n = (int)(rnd() % 9);
                for (int i = 0; i < n; i++)
                    len += put_cp(s + len, alphabet[rnd() % (uint32_t)na]);
            }
            const bool ours = bt_regex_accepts(re, s, len);
            const int rc = pcre2_match(code, (PCRE2_SPTR)s, len, 0, 0, md, NULL);
            BT_CHECK_MSG(rc >= 0 || rc == PCRE2_ERROR_NOMATCH,
                         "pcre2_match: %d on %s round %d: %.*s", rc, p->ecma, round % 3, (int)len,
                         s);
            const bool theirs = rc >= 0;
            BT_CHECK_MSG(ours == theirs, "pattern %s, string \"%.*s\": ours %d, PCRE2 %d", p->ecma,
                         (int)len, s, ours, theirs);
            /* the whole string (a regex constraint's reading) */
            const int rw = pcre2_match(code, (PCRE2_SPTR)s, len, 0,
                                       PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
            const bool whole = whole_re && bt_regex_accepts(whole_re, s, len);
            BT_CHECK_MSG(whole == (rw >= 0), "pattern %s whole, string \"%.*s\": ours %d, PCRE2 %d",
                         p->ecma, (int)len, s, whole, rw >= 0);
            compared++;
            matched += theirs;
            matched_whole += rw >= 0;
        }
        free(dist);
        bt_regex_free(whole_re);
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        bt_regex_free(re);
    }
    fprintf(stderr, "  %d strings compared with PCRE2, %d matching somewhere, %d whole\n", compared,
            matched, matched_whole);
    /* both verdicts exercised */
    BT_CHECK(matched > compared / 3 && matched < compared);
    BT_CHECK(matched_whole > compared / 5 && matched_whole < matched);
}

/* The states of re (dead 0 aside) from which no acceptance is reachable through the bytes a
 * text holds. */
static int stuck_states(const bt_regex_t *re)
{
    const int n = re->n_states;
    char *reach = calloc((size_t)n, 1);
    for (int s = 1; s < n; s++)
        reach[s] = (char)re->accept[s];
    for (bool grew = true; grew;) {
        grew = false;
        for (int s = 1; s < n; s++)
            for (int b = 0; b < 256 && !reach[s]; b++) {
                const bool text = b >= 0x20 || b == '\t' || b == '\n' || b == '\r';
                if (text && reach[re->next[s * 256 + b]]) reach[s] = grew = 1;
            }
    }
    int stuck = 0;
    for (int s = 1; s < n; s++)
        stuck += !reach[s];
    free(reach);
    return stuck;
}

/* Every state is live: acceptance is reachable from it through the bytes a text holds. */
static void test_every_state_can_finish(void)
{
    for (size_t pi = 0; pi < sizeof patterns / sizeof patterns[0]; pi++) {
        char err[256];
        bt_regex_t *re = NULL;
        if (bt_regex_compile(patterns[pi].ecma, strlen(patterns[pi].ecma), BT_REGEX_SEARCH, &re,
                             err, sizeof err) != BT_OK)
            continue;
        const int n = re->n_states;
        BT_CHECK(n >= 2 && n <= BT_REGEX_MAX_STATES && re->start >= 1 && re->start < n);
        const int stuck = stuck_states(re);
        BT_CHECK_MSG(stuck == 0, "%s: %d of %d states cannot finish", patterns[pi].ecma, stuck,
                     n - 1);
        bt_regex_free(re);
    }
}

/* bt_regex_limit_length against the pattern's own DFA and a count: every string of up to 5
 * characters over a small alphabet (one character of two bytes, one of three) is accepted by
 * the narrowed DFA exactly when the pattern's takes it and its length is within the bounds;
 * every state of the narrowed DFA can still finish; bounds that leave nothing are refused. */
static void test_limit_length(void)
{
    static const char *const alphabet[] = {"a", "b", "c", "1", "-", "\xc3\xa9", "\xe6\x97\xa5",
                                           "x"};
    enum { NA = sizeof alphabet / sizeof alphabet[0], MAXLEN = 5 };
    static const long bounds[][2] = {{0, 2}, {2, 4}, {3, -1}, {1, 1}, {5, 5}};
    int narrowed = 0, refused = 0;
    long compared = 0, taken = 0;
    for (size_t pi = 0; pi < sizeof patterns / sizeof patterns[0]; pi++) {
        for (size_t bi = 0; bi < sizeof bounds / sizeof bounds[0]; bi++) {
            const long lo = bounds[bi][0], hi = bounds[bi][1];
            char err[256] = "";
            bt_regex_t *re = NULL, *lim = NULL;
            const char *pat = patterns[pi].ecma;
            if (bt_regex_compile(pat, strlen(pat), BT_REGEX_SEARCH, &re, err, sizeof err) != BT_OK)
                continue;
            BT_CHECK(bt_regex_compile(pat, strlen(pat), BT_REGEX_SEARCH, &lim, err, sizeof err) ==
                     BT_OK);
            const bt_status_t st = bt_regex_limit_length(lim, lo, hi, 16384, err, sizeof err);
            bool any = false; /* some enumerated string within the bounds that re takes */
            /* every string of 0..MAXLEN letters, as digits in base NA */
            for (int len = 0; len <= MAXLEN; len++) {
                long total = 1;
                for (int i = 0; i < len; i++)
                    total *= NA;
                for (long code = 0; code < total; code++) {
                    char str[64];
                    size_t n = 0;
                    for (long c = code, i = 0; i < len; i++, c /= NA) {
                        const char *l = alphabet[c % NA];
                        memcpy(str + n, l, strlen(l));
                        n += strlen(l);
                    }
                    const bool want =
                        bt_regex_accepts(re, str, n) && len >= lo && (hi < 0 || len <= hi);
                    any |= want;
                    if (st == BT_OK) {
                        const bool got = bt_regex_accepts(lim, str, n);
                        BT_CHECK_MSG(got == want, "%s within %ld..%ld: '%.*s' %d, want %d", pat, lo,
                                     hi, (int)n, str, got, want);
                        compared++;
                        taken += got;
                    }
                }
            }
            if (st == BT_OK) {
                narrowed++;
                const int stuck = stuck_states(lim); /* every state can finish */
                BT_CHECK_MSG(stuck == 0, "%s within %ld..%ld: %d states cannot finish", pat, lo, hi,
                             stuck);
            } else {
                refused++;
                /* refused only where nothing fits (within the enumeration's reach: bounds up to
                 * MAXLEN) and with that said */
                BT_CHECK_MSG(!any && strstr(err, "matches no string"), "%s within %ld..%ld: %s",
                             pat, lo, hi, err);
            }
            bt_regex_free(re);
            bt_regex_free(lim);
        }
    }
    fprintf(stderr,
            "  %d pattern x bounds narrowed (%ld strings compared, %ld taken), %d refused\n",
            narrowed, compared, taken, refused);
    BT_CHECK(narrowed > 20 && taken > 1000 && refused > 3);
    /* a product past the state budget: refused, the DFA left as it was */
    char err[256];
    bt_regex_t *re;
    BT_CHECK(bt_regex_compile("[a-z]", 5, BT_REGEX_SEARCH, &re, err, sizeof err) == BT_OK);
    const int before = re->n_states;
    BT_CHECK(bt_regex_limit_length(re, 0, 100000, 16384, err, sizeof err) == BT_ERR_INVALID_ARG &&
             strstr(err, "more than 16384 automaton states"));
    BT_CHECK(re->n_states == before && bt_regex_accepts(re, "1a", 2));
    bt_regex_free(re);
}

static void test_refused_with_a_reason(void)
{
    static const struct {
        const char *pattern, *says;
    } bad[] = {
        {"(?=a)b", "lookaround"},
        {"a(?!b)", "lookaround"},
        {"\\bword", "word boundaries"},
        {"(a)\\1", "backreferences"},
        {"a^b", "'^' is supported only"},
        {"a$b", "'$' is supported only"},
        {"(^a)", "'^' is supported only"},
        {"(a", "not closed"},
        {"a)", "without its '('"},
        {"[ab", "not closed"},
        {"a{3,2}", "backwards"},
        {"[z-a]", "backwards"},
        {"*a", "repeats nothing"},
        {"a{1001}", "above 1000"},
        {"\\p{L}", "property escapes"},
        {"\\q", "unknown escape"},
        {"\\", "lone backslash"},
        {"[\\d-z]", "cannot bound a range"},
        {"\\ud800", "surrogate"},
        {"a.{40}", "automaton states"},
        {"^\\x01$", "no string matches it"},
        {"^[]$", "no string"},
        {"\xff", "not UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        bt_regex_t *re = NULL;
        const bt_status_t st = bt_regex_compile(bad[i].pattern, strlen(bad[i].pattern),
                                                BT_REGEX_SEARCH, &re, err, sizeof err);
        BT_CHECK_MSG(st == BT_ERR_BAD_REQUEST && re == NULL && strstr(err, bad[i].says) &&
                         !strncmp(err, "pattern: ", 9),
                     "%s: status %d, \"%s\" (want \"%s\")", bad[i].pattern, st, err, bad[i].says);
    }
}

/* A pattern whose construction would run long is refused within its budget, not after it:
 * a request's check at the router stays short. */
static void test_budget(void)
{
    static char big[16384];
    int o = 0;
    for (int i = 0; i < 300; i++)
        o += snprintf(big + o, sizeof big - (size_t)o, "%sword%dx%c", i ? "|" : "",
                      i * 7919 % 100000, 'a' + i % 26);
    char err[256] = "";
    bt_regex_t *re = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const bt_status_t st = bt_regex_compile(big, (size_t)o, BT_REGEX_SEARCH, &re, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ms =
        (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    fprintf(stderr, "  a 300-word alternation, unanchored: refused after %.1f ms\n", ms);
    BT_CHECK_MSG(st == BT_ERR_BAD_REQUEST && strstr(err, "budget"), "%d %s", st, err);
    bt_regex_free(re);
    /* anchored, the same words compile */
    static char anchored[16400];
    snprintf(anchored, sizeof anchored, "^(%s)$", big);
    BT_CHECK(bt_regex_compile(anchored, strlen(anchored), BT_REGEX_SEARCH, &re, err, sizeof err) ==
             BT_OK);
    BT_CHECK(re && bt_regex_accepts(re, "word7919xb", 10) && !bt_regex_accepts(re, "word7919x", 9));
    bt_regex_free(re);
}

int main(void)
{
    BT_RUN(test_against_pcre2);
    BT_RUN(test_every_state_can_finish);
    BT_RUN(test_limit_length);
    BT_RUN(test_refused_with_a_reason);
    BT_RUN(test_budget);
    return bt_test_summary();
}

/* Streaming reasoning and DSML tool-call parsers for DeepSeek-V4.1. See parsers.h. */
#include "common/text/parsers.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/text/text_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THINK_START "<think>"
#define THINK_END "</think>"
#define DSML "｜DSML｜"
#define CALLS_START "<" DSML " calls"
#define CALLS_END "</" DSML " calls>"
#define INVOKE_START "<" DSML " invoke"
#define INVOKE_END "</" DSML " invoke"
#define PARAM_START "<" DSML " parameter"
#define PARAM_END "/" DSML " parameter"
#define MAX_HEADER 4096 /* an invoke header longer than this is malformed */

/* Longest proper suffix of s[0..n) that is a prefix of lit (so lit may still complete). */
static size_t partial_suffix(const char *s, size_t n, const char *lit)
{
    size_t ll = strlen(lit);
    size_t max = n < ll - 1 ? n : ll - 1;
    for (size_t k = max; k > 0; k--)
        if (!memcmp(s + n - k, lit, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *lit)
{
    size_t ll = strlen(lit);
    if (ll > n) return NULL;
    const char *end = s + n - ll;
    for (const char *p = s; p <= end; p++) {
        p = memchr(p, lit[0], (size_t)(end - p) + 1);
        if (!p) return NULL;
        if (!memcmp(p, lit, ll)) return p;
    }
    return NULL;
}

static void consume(bt__buf_t *b, size_t n)
{
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

/* ---- reasoning --------------------------------------------------------------------------- */

enum { R_START, R_REASONING, R_CONTENT };

struct bt_reasoning_parser {
    bool thinking;
    int state;
    bt__buf_t pend, rout, cout;
};

bt_reasoning_parser_t *bt_reasoning_parser_create(bool thinking)
{
    bt_reasoning_parser_t *p = bt_calloc_or_die(1, sizeof *p);
    p->thinking = thinking;
    p->state = R_START;
    bt__buf_reserve(&p->pend, 64);
    bt__buf_reserve(&p->rout, 64);
    bt__buf_reserve(&p->cout, 64);
    return p;
}

void bt_reasoning_parser_destroy(bt_reasoning_parser_t *p)
{
    if (!p) return;
    bt__buf_free(&p->pend);
    bt__buf_free(&p->rout);
    bt__buf_free(&p->cout);
    free(p);
}

static void reasoning_run(bt_reasoning_parser_t *p, bool final, bt_reasoning_delta_t *out)
{
    p->rout.len = p->cout.len = 0;
    for (;;) {
        bt__buf_t *b = &p->pend;
        if (p->state == R_START) {
            size_t tl = strlen(THINK_START);
            size_t k = b->len < tl ? b->len : tl;
            if (!memcmp(b->data, THINK_START, k) && b->len < tl && !final) break; /* undecided */
            if (b->len >= tl && !memcmp(b->data, THINK_START, tl)) {
                consume(b, tl);
                p->state = R_REASONING;
            } else {
                p->state = p->thinking ? R_REASONING : R_CONTENT;
            }
            continue;
        }
        if (p->state == R_REASONING) {
            const char *e = find(b->data, b->len, THINK_END);
            if (e) {
                size_t at = (size_t)(e - b->data);
                bt__buf_append(&p->rout, b->data, at);
                consume(b, at + strlen(THINK_END));
                p->state = R_CONTENT;
                continue;
            }
            size_t hold = final ? 0 : partial_suffix(b->data, b->len, THINK_END);
            bt__buf_append(&p->rout, b->data, b->len - hold);
            consume(b, b->len - hold);
            break;
        }
        bt__buf_append(&p->cout, b->data, b->len);
        consume(b, b->len);
        break;
    }
    bt__buf_reserve(&p->rout, 0);
    bt__buf_reserve(&p->cout, 0);
    p->rout.data[p->rout.len] = p->cout.data[p->cout.len] = '\0';
    out->reasoning = p->rout.data;
    out->reasoning_len = p->rout.len;
    out->content = p->cout.data;
    out->content_len = p->cout.len;
}

void bt_reasoning_parser_push(bt_reasoning_parser_t *p, const char *text, size_t len,
                              bt_reasoning_delta_t *out)
{
    bt__buf_append(&p->pend, text, len);
    reasoning_run(p, false, out);
}

void bt_reasoning_parser_finish(bt_reasoning_parser_t *p, bt_reasoning_delta_t *out)
{
    reasoning_run(p, true, out);
}

/* ---- tool calls -------------------------------------------------------------------------- */

enum { T_CONTENT, T_CALLS };

typedef struct {
    char *name;
    char *args;
    size_t end; /* offset in the block just past "</｜DSML｜ invoke" */
} parsed_call_t;

struct bt_tool_parser {
    int state;
    bt__buf_t pend;  /* T_CONTENT: unscanned text; T_CALLS: the block after "<｜DSML｜ calls" */
    bt__buf_t cout;  /* content produced by this call */
    bt__buf_t lead;  /* T_CALLS: newlines stripped before the block and the marker itself */
    bool block_emitted; /* a call of this block was emitted */
    /* T_CALLS, waiting inside a parameter's value: the block was searched for the value's end
     * up to here (0: not waiting). A value may be long (a file to write): parsing the block
     * again at every push made its cost quadratic in the value's length. */
    size_t value_scan;
    uint64_t rng;
    int next_index;
    int warnings;
    bool warned;
    bt_tool_call_t *out_calls;
    char **out_strings;
    int n_out, cap_out;
};

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

bt_tool_parser_t *bt_tool_parser_create(uint64_t seed)
{
    bt_tool_parser_t *p = bt_calloc_or_die(1, sizeof *p);
    if (!seed) seed = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)p << 16) ^ (uint64_t)clock();
    p->rng = seed | 1;
    bt__buf_reserve(&p->pend, 64);
    bt__buf_reserve(&p->cout, 64);
    bt__buf_reserve(&p->lead, 64);
    return p;
}

static void clear_out(bt_tool_parser_t *p)
{
    for (int i = 0; i < p->n_out * 3; i++) free(p->out_strings[i]);
    p->n_out = 0;
}

void bt_tool_parser_destroy(bt_tool_parser_t *p)
{
    if (!p) return;
    clear_out(p);
    free(p->out_calls);
    free(p->out_strings);
    bt__buf_free(&p->pend);
    bt__buf_free(&p->cout);
    bt__buf_free(&p->lead);
    free(p);
}

static void emit_call(bt_tool_parser_t *p, char *name, char *args)
{
    if (p->n_out == p->cap_out) {
        p->cap_out = p->cap_out ? p->cap_out * 2 : 4;
        p->out_calls = bt_realloc_or_die(p->out_calls, (size_t)p->cap_out * sizeof *p->out_calls);
        p->out_strings = bt_realloc_or_die(p->out_strings, (size_t)p->cap_out * 3 * sizeof(char *));
    }
    char *id = bt_malloc_or_die(32);
    uint64_t a = next_rand(&p->rng), b = next_rand(&p->rng);
    snprintf(id, 32, "call_%016llx%08llx", (unsigned long long)a, (unsigned long long)(b >> 32));
    p->out_strings[p->n_out * 3] = id;
    p->out_strings[p->n_out * 3 + 1] = name;
    p->out_strings[p->n_out * 3 + 2] = args;
    p->out_calls[p->n_out] = (bt_tool_call_t){p->next_index++, id, name, args};
    p->n_out++;
}

typedef enum { P_NEED, P_BAD, P_CALL, P_END } pres_t;

/* s[0..n) starts where a literal must be; OK when present, NEED when s is a proper prefix. */
static pres_t expect(const char *s, size_t n, const char *lit)
{
    size_t ll = strlen(lit);
    size_t k = n < ll ? n : ll;
    if (memcmp(s, lit, k)) return P_BAD;
    return k < ll ? P_NEED : P_CALL;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Parses one step of a DSML block from offset `at`: ">\n" then an invoke (-> P_CALL with
 * *call_p and *next_p past it) or the block end (-> P_END, *next_p past it). *in_value_p:
 * P_NEED came from a parameter value whose end has not arrived (only that end can change it). */
static pres_t parse_step(const char *s, size_t n, size_t at, parsed_call_t *call_p, size_t *next_p,
                         bool *in_value_p)
{
    *in_value_p = false;
    const char *b = s + at;
    size_t m = n - at;
    pres_t r = expect(b, m, ">\n");
    if (r != P_CALL) return r;
    b += 2, m -= 2;
    pres_t ri = expect(b, m, INVOKE_START), re = expect(b, m, CALLS_END);
    if (re == P_CALL) {
        *next_p = (size_t)(b - s) + strlen(CALLS_END);
        return P_END;
    }
    if (ri == P_BAD) return re == P_NEED ? P_NEED : P_BAD;
    if (ri == P_NEED) return P_NEED;
    b += strlen(INVOKE_START), m -= strlen(INVOKE_START);

    /* header up to the first parameter or the invoke end: \s*name="NAME">\s* (the encoder
     * writes ">\n\n" before the invoke end of a call without arguments) */
    const char *ps = find(b, m, PARAM_START), *ie = find(b, m, INVOKE_END);
    const char *stop = ps && (!ie || ps < ie) ? ps : ie;
    if (!stop) return m > MAX_HEADER ? P_BAD : P_NEED;
    size_t hl = (size_t)(stop - b);
    const char *h = b;
    while (hl && is_blank(*h))
        h++, hl--;
    while (hl && is_blank(h[hl - 1]))
        hl--;
    if (hl < 8 || memcmp(h, "name=\"", 6) || memcmp(h + hl - 2, "\">", 2)) return P_BAD;
    char *name = bt_malloc_or_die(hl - 8 + 1);
    memcpy(name, h + 6, hl - 8);
    name[hl - 8] = '\0';

    bt__buf_t args = {0};
    bt__buf_putc(&args, '{');
    int n_params = 0;
    bt__buf_t seen = {0}; /* parameter names, NUL-separated */
    pres_t result = P_BAD;
    while (stop == ps) {
        b = stop + strlen(PARAM_START);
        m = n - (size_t)(b - s);
        const char *pe = find(b, m, PARAM_END);
        if (!pe) {
            result = P_NEED;
            *in_value_p = true;
            goto out;
        }
        /* ' name="K" string="true|false">V<' */
        const char *c = b;
        size_t cl = (size_t)(pe - b);
        if (cl < 8 || memcmp(c, " name=\"", 7) || c[cl - 1] != '<') goto out;
        const char *kt = find(c + 7, cl - 7, "\" string=\"true\">");
        const char *kf = find(c + 7, cl - 7, "\" string=\"false\">");
        const char *k = kt && (!kf || kt < kf) ? kt : kf;
        if (!k) goto out;
        bool is_str = k == kt;
        const char *v = k + (is_str ? 16 : 17);
        if (v > c + cl - 1) goto out;
        size_t kl = (size_t)(k - (c + 7)), vl = (size_t)(c + cl - 1 - v);
        char *key = bt_malloc_or_die(kl + 1);
        memcpy(key, c + 7, kl);
        key[kl] = '\0';
        for (size_t o = 0; o < seen.len; o += strlen(seen.data + o) + 1)
            if (!strcmp(seen.data + o, key)) {
                free(key);
                goto out; /* duplicate parameter */
            }
        bt__buf_append(&seen, key, kl + 1);
        if (n_params++) bt__buf_puts(&args, ", ");
        bt__json_dump_string(&args, key);
        bt__buf_puts(&args, ": ");
        /* string="false": a JSON value, as the model wrote it; text that is none (a bare
         * path, nothing at all) goes out as a string too, so that arguments stay valid JSON */
        cJSON *j = is_str ? NULL : bt__json_parse(v, vl);
        if (j) {
            bt__buf_append(&args, v, vl);
            cJSON_Delete(j);
        } else {
            char *val = bt_malloc_or_die(vl + 1);
            memcpy(val, v, vl);
            val[vl] = '\0';
            bt__json_dump_string(&args, val);
            free(val);
        }
        free(key);
        /* ">\n" then the next parameter or the invoke end */
        b = pe + strlen(PARAM_END);
        m = n - (size_t)(b - s);
        r = expect(b, m, ">\n");
        if (r != P_CALL) {
            result = r;
            goto out;
        }
        b += 2, m -= 2;
        pres_t rp = expect(b, m, PARAM_START), rv = expect(b, m, INVOKE_END);
        if (rp == P_CALL) {
            ps = stop = b;
        } else if (rv == P_CALL) {
            ps = NULL;
            stop = ie = b;
        } else {
            result = (rp == P_NEED || rv == P_NEED) ? P_NEED : P_BAD;
            goto out;
        }
    }
    bt__buf_putc(&args, '}');
    call_p->name = name;
    call_p->args = bt__buf_take(&args, NULL);
    call_p->end = (size_t)(stop - s) + strlen(INVOKE_END);
    *next_p = call_p->end;
    bt__buf_free(&seen);
    return P_CALL;
out:
    free(name);
    bt__buf_free(&args);
    bt__buf_free(&seen);
    return result;
}

static void warn(bt_tool_parser_t *p, const char *why)
{
    p->warnings++;
    if (!p->warned) BT_LOG_WARN("tool-call parser (deepseekv41): %s; passed on as content", why);
    p->warned = true;
}

/* Leaves T_CALLS: the marker (unless a call of the block was already emitted) becomes
 * content at once, and the unparsed rest goes back to be scanned as content. */
static void degrade(bt_tool_parser_t *p)
{
    if (!p->block_emitted) bt__buf_append(&p->cout, p->lead.data, p->lead.len);
    p->lead.len = 0;
    p->state = T_CONTENT;
}

static void tool_run(bt_tool_parser_t *p, bool final)
{
    for (;;) {
        bt__buf_t *b = &p->pend;
        if (p->state == T_CONTENT) {
            const char *mk = find(b->data, b->len, CALLS_START);
            if (mk) {
                size_t at = (size_t)(mk - b->data), nl = 0;
                while (nl < 2 && nl < at && b->data[at - nl - 1] == '\n') nl++;
                bt__buf_append(&p->cout, b->data, at - nl);
                p->lead.len = 0;
                bt__buf_append(&p->lead, b->data + at - nl, nl + strlen(CALLS_START));
                consume(b, at + strlen(CALLS_START));
                p->state = T_CALLS;
                p->block_emitted = false;
                continue;
            }
            size_t hold = 0;
            if (!final) { /* a marker may be starting, with the newlines before it */
                hold = partial_suffix(b->data, b->len, CALLS_START);
                for (int k = 0; k < 2 && hold < b->len && b->data[b->len - hold - 1] == '\n'; k++)
                    hold++;
            }
            bt__buf_append(&p->cout, b->data, b->len - hold);
            consume(b, b->len - hold);
            return;
        }
        /* T_CALLS: b holds the block text after "<｜DSML｜ calls" */
        if (p->value_scan && !final) { /* still inside a value unless its end arrived */
            const size_t ll = strlen(PARAM_END);
            const size_t from = p->value_scan >= ll ? p->value_scan - (ll - 1) : 0;
            if (!find(b->data + from, b->len - from, PARAM_END)) {
                p->value_scan = b->len;
                return;
            }
        }
        p->value_scan = 0;
        parsed_call_t call;
        size_t next = 0;
        bool in_value;
        pres_t r = parse_step(b->data, b->len, 0, &call, &next, &in_value);
        if (r == P_CALL) {
            emit_call(p, call.name, call.args);
            p->block_emitted = true;
            consume(b, next);
            continue;
        }
        if (r == P_END) {
            consume(b, next);
            p->state = T_CONTENT;
            p->lead.len = 0;
            continue;
        }
        if (r == P_NEED && !final) {
            if (in_value) p->value_scan = b->len;
            return;
        }
        warn(p, r == P_NEED ? "truncated DSML tool-call block" : "malformed DSML tool-call block");
        degrade(p);
    }
}

static void tool_out(bt_tool_parser_t *p, bt_tool_delta_t *out)
{
    bt__buf_reserve(&p->cout, 0);
    p->cout.data[p->cout.len] = '\0';
    out->content = p->cout.data;
    out->content_len = p->cout.len;
    out->calls = p->out_calls;
    out->n_calls = p->n_out;
    out->warnings = p->warnings;
}

void bt_tool_parser_push(bt_tool_parser_t *p, const char *text, size_t len, bt_tool_delta_t *out)
{
    clear_out(p);
    p->cout.len = 0;
    bt__buf_append(&p->pend, text, len);
    tool_run(p, false);
    tool_out(p, out);
}

void bt_tool_parser_finish(bt_tool_parser_t *p, bt_tool_delta_t *out)
{
    clear_out(p);
    p->cout.len = 0;
    tool_run(p, true);
    tool_out(p, out);
}

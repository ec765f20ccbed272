#include "services/common/output.h"

#include "common/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static void buf_add(buf_t *b, const char *s, size_t n)
{
    if (!n) return;
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = bt_realloc_or_die(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

/* Adds detokenized text, U+0000 as U+FFFD: the text is a C string from here to the client (stop
 * strings, the parsers, the protobuf text field), and a NUL the model wrote cut it there: a
 * stop string after it never matched, and the rest of that delta was lost. */
static void text_add(buf_t *b, const char *s, size_t n)
{
    for (const char *z; n && (z = memchr(s, 0, n));) {
        buf_add(b, s, (size_t)(z - s));
        buf_add(b, "\xEF\xBF\xBD", 3);
        n -= (size_t)(z - s) + 1;
        s = z + 1;
    }
    buf_add(b, s, n);
}

struct bt_output {
    bt_detok_t *detok;
    bt_reasoning_parser_t *rp;
    bt_tool_parser_t *tp;
    char **stop;
    int n_stop;
    size_t max_stop_len;
    buf_t text;          /* raw detokenized text so far */
    size_t emitted;      /* how much of it went through the parsers */
    bool stopped;
    char matched[256];
    int total_calls;
    /* this push's delta, owned here */
    buf_t content, reasoning;
    bt_tool_call_t *calls;
    int n_calls, cap_calls;
};

bt_output_t *bt_output_create(const bt_tokenizer_t *tok, const bt_output_options_t *opts)
{
    bt_output_t *o = bt_calloc_or_die(1, sizeof *o);
    bt_detok_create(tok, opts->skip_special, &o->detok);
    if (opts->reasoning) o->rp = bt_reasoning_parser_create(opts->thinking);
    if (opts->tools) o->tp = bt_tool_parser_create(opts->seed);
    o->n_stop = opts->n_stop;
    o->stop = bt_calloc_or_die((size_t)(opts->n_stop ? opts->n_stop : 1), sizeof(char *));
    for (int i = 0; i < opts->n_stop; i++) {
        o->stop[i] = bt_strdup_or_die(opts->stop[i]);
        size_t l = strlen(opts->stop[i]);
        if (l > o->max_stop_len) o->max_stop_len = l;
    }
    return o;
}

static void clear_calls(bt_output_t *o)
{
    for (int i = 0; i < o->n_calls; i++) {
        free((char *)o->calls[i].id);
        free((char *)o->calls[i].name);
        free((char *)o->calls[i].arguments);
    }
    o->n_calls = 0;
}

void bt_output_destroy(bt_output_t *o)
{
    if (!o) return;
    bt_detok_destroy(o->detok);
    bt_reasoning_parser_destroy(o->rp);
    bt_tool_parser_destroy(o->tp);
    for (int i = 0; i < o->n_stop; i++) free(o->stop[i]);
    free(o->stop);
    clear_calls(o);
    free(o->calls);
    free(o->text.p);
    free(o->content.p);
    free(o->reasoning.p);
    free(o);
}

/* The end of the raw text that may go out: all of it when final, else all but a possible
 * stop-string prefix, backed off to a UTF-8 boundary. Sets *stop_at on a match. */
static size_t releasable(bt_output_t *o, bool final, long *stop_at)
{
    *stop_at = -1;
    size_t from = o->emitted > o->max_stop_len ? o->emitted - o->max_stop_len : 0;
    for (int i = 0; i < o->n_stop && o->text.p; i++) {
        const char *hit = strstr(o->text.p + from, o->stop[i]);
        if (hit && (*stop_at < 0 || hit - o->text.p < *stop_at)) {
            *stop_at = hit - o->text.p;
            snprintf(o->matched, sizeof o->matched, "%s", o->stop[i]);
        }
    }
    if (*stop_at >= 0) return (size_t)*stop_at;
    if (final || o->max_stop_len == 0) return o->text.len;
    size_t end = o->text.len > o->max_stop_len - 1 ? o->text.len - (o->max_stop_len - 1) : 0;
    if (end < o->emitted) end = o->emitted;
    while (end > o->emitted && ((unsigned char)o->text.p[end] & 0xC0) == 0x80) end--;
    return end;
}

static void take_tools(bt_output_t *o, const bt_tool_delta_t *t)
{
    buf_add(&o->content, t->content, t->content_len);
    for (int i = 0; i < t->n_calls; i++) {
        if (o->n_calls == o->cap_calls) {
            o->cap_calls = o->cap_calls ? 2 * o->cap_calls : 4;
            o->calls = bt_realloc_or_die(o->calls, (size_t)o->cap_calls * sizeof *o->calls);
        }
        bt_tool_call_t *c = &o->calls[o->n_calls++];
        c->index = t->calls[i].index;
        c->id = bt_strdup_or_die(t->calls[i].id);
        c->name = bt_strdup_or_die(t->calls[i].name);
        c->arguments = bt_strdup_or_die(t->calls[i].arguments);
        o->total_calls++;
    }
}

static void parse(bt_output_t *o, const char *s, size_t n, bool final)
{
    const char *content = s;
    size_t content_len = n;
    bt_reasoning_delta_t rd = {0};
    if (o->rp) {
        bt_reasoning_parser_push(o->rp, s, n, &rd);
        buf_add(&o->reasoning, rd.reasoning, rd.reasoning_len);
        content = rd.content;
        content_len = rd.content_len;
    }
    bt_tool_delta_t td;
    if (o->tp) {
        bt_tool_parser_push(o->tp, content, content_len, &td);
        take_tools(o, &td);
    } else {
        buf_add(&o->content, content, content_len);
    }
    if (!final) return;
    if (o->rp) {
        bt_reasoning_parser_finish(o->rp, &rd);
        buf_add(&o->reasoning, rd.reasoning, rd.reasoning_len);
        if (o->tp) {
            bt_tool_parser_push(o->tp, rd.content, rd.content_len, &td);
            take_tools(o, &td);
        } else {
            buf_add(&o->content, rd.content, rd.content_len);
        }
    }
    if (o->tp) {
        bt_tool_parser_finish(o->tp, &td);
        take_tools(o, &td);
    }
}

void bt_output_push(bt_output_t *o, const int32_t *ids, size_t n, bool final, bt_output_delta_t *d)
{
    o->content.len = 0;
    o->reasoning.len = 0;
    if (o->content.p) o->content.p[0] = 0;
    if (o->reasoning.p) o->reasoning.p[0] = 0;
    clear_calls(o);
    if (!o->stopped) {
        for (size_t i = 0; i < n; i++) {
            const char *chunk;
            size_t len;
            if (bt_detok_push(o->detok, &ids[i], 1, &chunk, &len) == BT_OK)
                text_add(&o->text, chunk, len);
        }
        if (final) {
            const char *chunk;
            size_t len;
            if (bt_detok_finish(o->detok, &chunk, &len) == BT_OK) text_add(&o->text, chunk, len);
        }
        long stop_at;
        size_t end = releasable(o, final, &stop_at);
        bool last = final || stop_at >= 0;
        if (end > o->emitted || last) parse(o, o->text.p ? o->text.p + o->emitted : "", end - o->emitted, last);
        o->emitted = end;
        if (stop_at >= 0) o->stopped = true;
    }
    d->content = o->content.p ? o->content.p : "";
    d->content_len = o->content.len;
    d->reasoning = o->reasoning.p ? o->reasoning.p : "";
    d->reasoning_len = o->reasoning.len;
    d->calls = o->calls;
    d->n_calls = o->n_calls;
    d->stopped = o->stopped;
    d->matched_stop = o->matched;
    d->total_tool_calls = o->total_calls;
}

#include "services/gateway/openai.h"

#include "common/alloc.h"
#include "services/common/proto_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bt_status_t fail(bt_openai_error_t *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return BT_ERR_BAD_REQUEST;
}

/* Strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF). */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + (size_t)len > n) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += (size_t)len;
    }
    return true;
}

static const cJSON *item(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Number fields: absent -> def; wrong type or out of [lo, hi] -> error naming the field. */
static bt_status_t num(const cJSON *o, const char *k, double lo, double hi, double def, double *out,
                       bt_openai_error_t *e)
{
    const cJSON *v = item(o, k);
    if (!v) {
        *out = def;
        return BT_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fail(e, k, "'%s' must be a number", k);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return fail(e, k, "'%s' must be between %g and %g, got %g", k, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    return BT_OK;
}

static bt_status_t integer(const cJSON *o, const char *k, double lo, double hi, int64_t def,
                           int64_t *out, bt_openai_error_t *e)
{
    const cJSON *v = item(o, k);
    if (!v) {
        *out = def;
        return BT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !isfinite(v->valuedouble))
        return fail(e, k, "'%s' must be an integer", k);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return fail(e, k, "'%s' must be between %.0f and %.0f, got %.0f", k, lo, hi, v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return BT_OK;
}

/* Points g at one completions prompt p (a non-empty string, or token ids), checked; what it
 * allocates goes to *text_p or *ids_p (the caller frees them). */
static bt_status_t set_prompt(const cJSON *p, Baton__V1__GenerateRequest *g,
                              Baton__V1__TokenIds *tids, char **text_p, int32_t **ids_p,
                              bt_openai_error_t *e)
{
    if (cJSON_IsString(p)) {
        if (!*p->valuestring) return fail(e, "prompt", "'prompt' must not be empty");
        *text_p = bt_strdup_or_die(p->valuestring);
        g->prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_TEXT;
        g->text = *text_p;
        return BT_OK;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0 || !cJSON_IsNumber(p->child))
        return fail(e, "prompt",
                    "'prompt' must be a string, an array of token ids, or a batch of those");
    const int cnt = cJSON_GetArraySize(p);
    int32_t *ids = *ids_p = bt_malloc_or_die((size_t)cnt * sizeof *ids);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p)
    {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > INT32_MAX)
            return fail(e, "prompt", "'prompt' token ids must be non-negative integers");
        ids[i++] = (int32_t)t->valuedouble;
    }
    tids->n_ids = (size_t)cnt;
    tids->ids = ids;
    g->prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g->token_ids = tids;
    return BT_OK;
}

static bt_status_t boolean(const cJSON *o, const char *k, bool def, bool *out, bt_openai_error_t *e)
{
    const cJSON *v = item(o, k);
    if (!v) {
        *out = def;
        return BT_OK;
    }
    if (!cJSON_IsBool(v)) return fail(e, k, "'%s' must be true or false", k);
    *out = cJSON_IsTrue(v);
    return BT_OK;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        bt_status_t st_ = (x);                                                                     \
        if (st_ != BT_OK) goto out;                                                                \
    } while (0)

static const char *const roles[] = {"system", "user", "assistant", "tool", "developer", NULL};

static bt_status_t check_messages(const cJSON *root, bt_openai_error_t *e)
{
    const cJSON *m = item(root, "messages");
    if (!m) return fail(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(m)) return fail(e, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(m);
    if (n == 0) return fail(e, "messages", "'messages' must not be empty");
    int i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m)
    {
        char p[64];
        snprintf(p, sizeof p, "messages[%d]", i);
        if (!cJSON_IsObject(msg)) return fail(e, p, "'%s' must be an object", p);
        const cJSON *role = item(msg, "role");
        snprintf(p, sizeof p, "messages[%d].role", i);
        if (!role || !cJSON_IsString(role)) return fail(e, p, "'%s' must be a string", p);
        bool known = false;
        for (int k = 0; roles[k]; k++) known |= !strcmp(role->valuestring, roles[k]);
        if (!known)
            return fail(e, p, "'%s' is '%.40s'; expected system, user, assistant or tool", p, role->valuestring);
        const cJSON *content = item(msg, "content");
        snprintf(p, sizeof p, "messages[%d].content", i);
        if (content && !cJSON_IsString(content) && !cJSON_IsArray(content))
            return fail(e, p, "'%s' must be a string or an array of content parts", p);
        if (!content && strcmp(role->valuestring, "assistant") != 0)
            return fail(e, p, "'%s' is required for role '%s'", p, role->valuestring);
        i++;
    }
    return BT_OK;
}

bt_status_t bt_openai_parse(bt_openai_kind_t kind, const char *body, size_t len,
                            const char *request_id, bt_openai_request_t *r, bt_openai_error_t *e)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    if (!valid_utf8((const unsigned char *)body, len)) return fail(e, NULL, "the body is not valid UTF-8");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) return fail(e, NULL, "the body is not valid JSON (near byte %zu)", end ? (size_t)(end - body) : 0);
    bt_status_t st = BT_ERR_BAD_REQUEST;
    Baton__V1__GenerateRequest g = BATON__V1__GENERATE_REQUEST__INIT;
    Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
    Baton__V1__TokenIds tids = BATON__V1__TOKEN_IDS__INIT;
    char **stops = NULL;
    int n_stop = 0;
    int32_t *stop_ids = NULL, *prompt_ids = NULL, *bias_ids = NULL;
    float *bias = NULL;
    char *json_schema = NULL; /* response_format.json_schema.schema, as compact JSON */
    size_t n_bias = 0;
    char *prompt_text = NULL;
    const cJSON *batch = NULL; /* completions: several prompts */
    r->n_prompts = 1;
    if (!cJSON_IsObject(root)) {
        fail(e, NULL, "the body must be a JSON object");
        goto out;
    }
    const cJSON *model = item(root, "model");
    if (model && !cJSON_IsString(model)) {
        fail(e, "model", "'model' must be a string");
        goto out;
    }
    if (model) snprintf(r->model, sizeof r->model, "%s", model->valuestring);

    double temperature, top_p, min_p, presence, frequency;
    int64_t top_k, n, max_tokens, max_completion, seed, top_logprobs;
    TRY(num(root, "temperature", 0.0, 2.0, 1.0, &temperature, e));
    TRY(num(root, "top_p", 0.0, 1.0, 1.0, &top_p, e));
    if (item(root, "top_p") && top_p <= 0.0) {
        fail(e, "top_p", "'top_p' must be greater than 0");
        goto out;
    }
    TRY(num(root, "min_p", 0.0, 1.0, 0.0, &min_p, e));
    TRY(num(root, "presence_penalty", -2.0, 2.0, 0.0, &presence, e));
    TRY(num(root, "frequency_penalty", -2.0, 2.0, 0.0, &frequency, e));
    /* logit_bias: {"token id": bias in [-100, 100], ...}, at most 1024 */
    const cJSON *lb = item(root, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb) || cJSON_GetArraySize(lb) > 1024) {
            fail(e, "logit_bias", "'logit_bias' must be an object of up to 1024 token ids to biases");
            goto out;
        }
        const int nb = cJSON_GetArraySize(lb);
        bias_ids = bt_calloc_or_die((size_t)nb + 1, sizeof *bias_ids);
        bias = bt_calloc_or_die((size_t)nb + 1, sizeof *bias);
        const cJSON *b;
        cJSON_ArrayForEach(b, lb)
        {
            char *end = NULL;
            long id = b->string && *b->string >= '0' && *b->string <= '9' ? strtol(b->string, &end, 10) : -1;
            if (id < 0 || id > INT32_MAX || !end || *end || !cJSON_IsNumber(b) ||
                !(b->valuedouble >= -100.0 && b->valuedouble <= 100.0)) {
                fail(e, "logit_bias", "'logit_bias' maps token ids (decimal strings) to biases in [-100, 100]");
                goto out;
            }
            for (size_t i = 0; i < n_bias; i++)
                if (bias_ids[i] == (int32_t)id) {
                    fail(e, "logit_bias", "'logit_bias' names a token id twice");
                    goto out;
                }
            bias_ids[n_bias] = (int32_t)id;
            bias[n_bias++] = (float)b->valuedouble;
        }
    }
    TRY(integer(root, "top_k", -1, 1e9, -1, &top_k, e));
    TRY(integer(root, "n", 1, BT_OPENAI_MAX_N, 1, &n, e));
    r->n = (int)n;
    /* a missing or too-large max_tokens is clamped by the router (--max-new-tokens, context) */
    TRY(integer(root, "max_tokens", 1, 9.2e18, 0, &max_tokens, e));
    TRY(integer(root, "max_completion_tokens", 1, 9.2e18, 0, &max_completion, e));
    if (max_completion > 0) max_tokens = max_completion;
    if (max_tokens > INT32_MAX) max_tokens = INT32_MAX;
    TRY(integer(root, "seed", -9.2e18, 9.2e18, 0, &seed, e));
    /* structured output: decoded under a grammar (common/text/grammar.h); the router checks the
     * schema and names what it cannot hold the output to */
    bool json_object = false;
    const cJSON *rf = item(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? item(rf, "type") : NULL;
        if (!cJSON_IsString(t)) {
            fail(e, "response_format", "'response_format' must be an object with a 'type'");
            goto out;
        }
        json_object = !strcmp(t->valuestring, "json_object");
        if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *js = item(rf, "json_schema");
            const cJSON *schema = cJSON_IsObject(js) ? item(js, "schema") : NULL;
            if (!cJSON_IsObject(schema)) {
                fail(e, "response_format",
                     "'response_format' of type 'json_schema' needs 'json_schema': {'name': ..., "
                     "'schema': {...}}");
                goto out;
            }
            json_schema = cJSON_PrintUnformatted(schema);
        } else if (!json_object && strcmp(t->valuestring, "text") != 0) {
            fail(e, "response_format",
                 "'response_format' type must be text, json_object or json_schema");
            goto out;
        }
    }
    /* SGLang's regex (vLLM's guided_regex): the whole answer matches it */
    const char *regex = NULL;
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "guided_regex" : "regex";
        const cJSON *rx = item(root, name);
        if (!rx || cJSON_IsNull(rx)) continue;
        if (!cJSON_IsString(rx) || !*rx->valuestring) {
            fail(e, name, "'%s' must be a non-empty string (a regular expression)", name);
            goto out;
        }
        if (regex || json_object || json_schema) {
            fail(e, name, "'%s' cannot be asked with %s", name,
                 regex ? "'regex'" : "a JSON 'response_format'");
            goto out;
        }
        regex = rx->valuestring;
    }
    TRY(boolean(root, "stream", false, &r->stream, e));
    TRY(boolean(root, "return_token_ids", false, &r->return_token_ids, e));
    bool ignore_eos, skip_special;
    TRY(boolean(root, "ignore_eos", false, &ignore_eos, e));
    TRY(boolean(root, "skip_special_tokens", true, &skip_special, e));
    /* chat: logprobs bool + top_logprobs; completions: logprobs is an integer count (the
     * OpenAI form; true is taken too) */
    if (kind == BT_OPENAI_COMPLETION && cJSON_IsNumber(item(root, "logprobs"))) {
        int64_t k;
        TRY(integer(root, "logprobs", 0, 20, 0, &k, e));
        r->logprobs = true;
        r->top_logprobs = (int)k;
    } else {
        TRY(boolean(root, "logprobs", false, &r->logprobs, e));
    }
    TRY(integer(root, "top_logprobs", 0, 20, 0, &top_logprobs, e));
    if (kind == BT_OPENAI_CHAT) r->top_logprobs = (int)top_logprobs;
    if (top_logprobs > 0 && !r->logprobs) {
        fail(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        goto out;
    }
    const cJSON *so = item(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            fail(e, "stream_options", "'stream_options' must be an object");
            goto out;
        }
        if (!r->stream) { /* (as OpenAI and vLLM answer) */
            fail(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto out;
        }
        TRY(boolean(so, "include_usage", false, &r->include_usage, e));
    }
    const cJSON *stop = item(root, "stop");
    if (stop) {
        if (cJSON_IsString(stop)) {
            stops = bt_calloc_or_die(1, sizeof *stops);
            stops[n_stop++] = bt_strdup_or_die(stop->valuestring);
        } else if (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) <= 16) {
            stops = bt_calloc_or_die((size_t)cJSON_GetArraySize(stop) + 1, sizeof *stops);
            const cJSON *s;
            cJSON_ArrayForEach(s, stop)
            {
                if (!cJSON_IsString(s) || !*s->valuestring) {
                    fail(e, "stop", "'stop' must be a non-empty string or an array of up to 16 of them");
                    goto out;
                }
                stops[n_stop++] = bt_strdup_or_die(s->valuestring);
            }
        } else {
            fail(e, "stop", "'stop' must be a string or an array of up to 16 strings");
            goto out;
        }
        if (cJSON_IsString(stop) && !*stop->valuestring) {
            fail(e, "stop", "'stop' must not be empty");
            goto out;
        }
    }
    const cJSON *sti = item(root, "stop_token_ids");
    size_t n_stop_ids = 0;
    if (sti) {
        if (!cJSON_IsArray(sti) || cJSON_GetArraySize(sti) > 256) {
            fail(e, "stop_token_ids", "'stop_token_ids' must be an array of up to 256 integers");
            goto out;
        }
        stop_ids = bt_calloc_or_die((size_t)cJSON_GetArraySize(sti) + 1, sizeof *stop_ids);
        const cJSON *s;
        cJSON_ArrayForEach(s, sti)
        {
            if (!cJSON_IsNumber(s) || s->valuedouble != floor(s->valuedouble) || s->valuedouble < 0 ||
                s->valuedouble > INT32_MAX) {
                fail(e, "stop_token_ids", "'stop_token_ids' must hold token ids");
                goto out;
            }
            stop_ids[n_stop_ids++] = (int32_t)s->valuedouble;
        }
    }

    if (kind == BT_OPENAI_CHAT) {
        TRY(check_messages(root, e));
        const cJSON *tools = item(root, "tools");
        if (tools && !cJSON_IsArray(tools)) {
            fail(e, "tools", "'tools' must be an array");
            goto out;
        }
        const cJSON *tc = item(root, "tool_choice");
        if (tc && !cJSON_IsString(tc) && !cJSON_IsObject(tc)) {
            fail(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object");
            goto out;
        }
        if (tc && cJSON_IsString(tc) && strcmp(tc->valuestring, "none") && strcmp(tc->valuestring, "auto") &&
            strcmp(tc->valuestring, "required")) {
            fail(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object");
            goto out;
        }
        const cJSON *kw = item(root, "chat_template_kwargs");
        if (kw && !cJSON_IsObject(kw)) {
            fail(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            goto out;
        }
        const cJSON *re = item(root, "reasoning_effort");
        if (re && !cJSON_IsString(re) && !cJSON_IsNumber(re)) {
            fail(e, "reasoning_effort", "'reasoning_effort' must be low, high or max");
            goto out;
        }
        bool et;
        TRY(boolean(root, "enable_thinking", false, &et, e));
        g.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_CHAT_JSON;
        /* the router renders the whole request with the model's chat encoding */
        g.chat_json = bt_malloc_or_die(len + 1);
        memcpy(g.chat_json, body, len);
        g.chat_json[len] = 0;
    } else {
        const cJSON *p = item(root, "prompt");
        if (!p) {
            fail(e, "prompt", "'prompt' is required");
            goto out;
        }
        /* a batch: an array of strings or of token-id arrays, a choice set (n) each */
        if (cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child))) {
            batch = p;
            r->n_prompts = cJSON_GetArraySize(p);
            p = p->child;
        }
        if (set_prompt(p, &g, &tids, &prompt_text, &prompt_ids, e) != BT_OK) goto out;
        bool echo;
        TRY(boolean(root, "echo", false, &echo, e));
        if (echo) {
            fail(e, "echo", "'echo' is not supported");
            goto out;
        }
        int64_t best_of;
        TRY(integer(root, "best_of", 1, 1, 1, &best_of, e));
        const cJSON *suffix = item(root, "suffix");
        if (suffix) {
            fail(e, "suffix", "'suffix' is not supported");
            goto out;
        }
    }
    sp.temperature = (float)temperature;
    sp.presence_penalty = (float)presence;
    sp.frequency_penalty = (float)frequency;
    sp.top_p = (float)top_p;
    sp.top_k = top_k > 0 ? (int32_t)(top_k > INT32_MAX ? INT32_MAX : top_k) : 0;
    sp.min_p = (float)min_p;
    if (item(root, "seed")) {
        sp.has_seed = 1;
        sp.seed = (uint64_t)seed;
    }
    sp.max_tokens = (int32_t)max_tokens;
    sp.ignore_eos = ignore_eos;
    sp.logprobs = r->logprobs;
    sp.top_logprobs = r->top_logprobs;
    sp.n_stop = (size_t)n_stop;
    sp.stop = stops;
    sp.n_stop_token_ids = n_stop_ids;
    sp.stop_token_ids = stop_ids;
    sp.n_logit_bias_ids = sp.n_logit_bias = n_bias;
    sp.logit_bias_ids = bias_ids;
    sp.logit_bias = bias;
    if (json_object) sp.response_format = "json_object";
    if (regex) {
        sp.response_format = "regex";
        sp.json_schema = (char *)regex; /* (root outlives sp) */
    }
    if (json_schema) {
        sp.response_format = "json_schema";
        sp.json_schema = json_schema;
    }
    g.sampling = &sp;
    g.request_id = (char *)request_id;
    g.model = r->model;
    g.skip_special_tokens = skip_special;
    if ((int64_t)r->n_prompts * r->n > BT_OPENAI_MAX_N) {
        fail(e, r->n > 1 ? "n" : "prompt",
             "%d prompts of %d choices each: at most %d choices a request", r->n_prompts, r->n,
             BT_OPENAI_MAX_N);
        goto out;
    }
    r->gens = bt_calloc_or_die((size_t)r->n_prompts, sizeof *r->gens);
    r->gen_lens = bt_calloc_or_die((size_t)r->n_prompts, sizeof *r->gen_lens);
    bt_proto_pack(&g.base, &r->gens[0], &r->gen_lens[0]);
    /* the batch's other prompts: the same request around each */
    int k = 1;
    for (const cJSON *q = batch ? batch->child->next : NULL; q; q = q->next, k++) {
        Baton__V1__TokenIds more_tids = BATON__V1__TOKEN_IDS__INIT;
        char *text = NULL;
        int32_t *ids = NULL;
        const bt_status_t ps = set_prompt(q, &g, &more_tids, &text, &ids, e);
        if (ps == BT_OK) bt_proto_pack(&g.base, &r->gens[k], &r->gen_lens[k]);
        free(text);
        free(ids);
        if (ps != BT_OK) {
            char was[sizeof e->message];
            memcpy(was, e->message, sizeof was);
            snprintf(e->message, sizeof e->message, "prompt[%d]: %.400s", k, was);
            goto out;
        }
    }
    st = BT_OK;
out:
    if (st != BT_OK) bt_openai_request_free(r);
    if (g.prompt_case == BATON__V1__GENERATE_REQUEST__PROMPT_CHAT_JSON) free(g.chat_json);
    for (int i = 0; i < n_stop; i++) free(stops[i]);
    free(stops);
    free(stop_ids);
    free(bias_ids);
    free(bias);
    free(json_schema);
    free(prompt_ids);
    free(prompt_text);
    cJSON_Delete(root);
    return st;
}

bt_status_t bt_openai_choice_request(const bt_openai_request_t *r, int index,
                                     const char *request_id, uint8_t **buf, size_t *len)
{
    const int prompt = index / r->n, choice = index % r->n;
    if (index < 0 || prompt >= r->n_prompts) return BT_ERR_INVALID_ARG;
    Baton__V1__GenerateRequest *g =
        BT_PROTO_UNPACK(baton__v1__generate_request, r->gens[prompt], r->gen_lens[prompt]);
    if (!g) return BT_ERR_INTERNAL;
    char *const id_was = g->request_id;
    const uint64_t seed_was = g->sampling ? g->sampling->seed : 0;
    g->request_id = (char *)request_id;
    if (g->sampling && g->sampling->has_seed) g->sampling->seed = seed_was + (uint64_t)choice;
    bt_proto_pack(&g->base, buf, len);
    g->request_id = id_was; /* (the unpacked message frees its own) */
    BT_PROTO_FREE(baton__v1__generate_request, g);
    return BT_OK;
}

void bt_openai_request_free(bt_openai_request_t *r)
{
    for (int i = 0; r->gens && i < r->n_prompts; i++)
        free(r->gens[i]);
    free(r->gens);
    free(r->gen_lens);
    r->gens = NULL;
    r->gen_lens = NULL;
}

char *bt_openai_error_json(int status, const char *message, const char *param)
{
    const char *type = "server_error", *code = NULL;
    switch (status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; code = "invalid_api_key"; break;
    case 404: type = "invalid_request_error"; code = "not_found"; break;
    case 405: type = "invalid_request_error"; code = "method_not_allowed"; break;
    case 408: type = "invalid_request_error"; code = "request_timeout"; break;
    case 413: type = "invalid_request_error"; code = "request_too_large"; break;
    case 429: type = "rate_limit_error"; code = "rate_limit_exceeded"; break;
    case 431: type = "invalid_request_error"; code = "headers_too_large"; break;
    case 503: type = "service_unavailable"; code = "service_unavailable"; break;
    case 504: type = "timeout"; code = "timeout"; break;
    default: break;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", message ? message : "");
    cJSON_AddStringToObject(err, "type", type);
    if (param && *param)
        cJSON_AddStringToObject(err, "param", param);
    else
        cJSON_AddNullToObject(err, "param");
    if (code)
        cJSON_AddStringToObject(err, "code", code);
    else
        cJSON_AddNumberToObject(err, "code", status);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* Recipes mapped onto Baton's config: see recipe.h. */
#include "services/cli/recipe.h"

#include "common/alloc.h"
#include "services/cli/config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- shell words ------------------------------------------------------------------------ */

typedef struct {
    char *b;
    size_t n, cap;
} buf_t;

static void buf_put(buf_t *b, char c)
{
    if (b->n + 1 >= b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->b = bt_realloc_or_die(b->b, b->cap);
    }
    b->b[b->n++] = c;
    b->b[b->n] = 0;
}

void bt_recipe_free_words(char **words, size_t n)
{
    for (size_t i = 0; i < n; i++) free(words[i]);
    free(words);
}

bt_status_t bt_recipe_split_words(const char *s, size_t max_words, char ***words_p, size_t *n_p,
                                  char *err, size_t errlen)
{
    char **w = NULL;
    size_t n = 0, cap = 0;
    buf_t cur = {0};
    bool in_word = false;
    const char *p = s;
    while (*p) {
        char c = *p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p++;
            if (!in_word) continue;
        } else {
            in_word = true;
            if (c == '\'') {
                const char *q = strchr(p + 1, '\'');
                if (!q) {
                    snprintf(err, errlen, "unterminated single quote at byte %zu", (size_t)(p - s));
                    goto bad;
                }
                for (const char *r = p + 1; r < q; r++) buf_put(&cur, *r);
                if (q == p + 1) buf_put(&cur, 0), cur.n--; /* '' is an empty word */
                p = q + 1;
            } else if (c == '"') {
                const char *start = p++;
                for (;;) {
                    if (!*p) {
                        snprintf(err, errlen, "unterminated double quote at byte %zu", (size_t)(start - s));
                        goto bad;
                    }
                    if (*p == '"') break;
                    if (*p == '\\' && (p[1] == '"' || p[1] == '\\' || p[1] == '$' || p[1] == '`')) p++;
                    else if (*p == '\\' && p[1] == '\n') {
                        p += 2;
                        continue;
                    }
                    buf_put(&cur, *p++);
                }
                if (!cur.b) buf_put(&cur, 0), cur.n--;
                p++;
            } else if (c == '\\') {
                if (!p[1]) {
                    snprintf(err, errlen, "trailing backslash");
                    goto bad;
                }
                if (p[1] != '\n') buf_put(&cur, p[1]);
                p += 2;
            } else {
                buf_put(&cur, c);
                p++;
            }
            if (*p) continue;
        }
        /* end of a word */
        if (n == max_words) {
            snprintf(err, errlen, "more than %zu words", max_words);
            goto bad;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            w = bt_realloc_or_die(w, cap * sizeof *w);
        }
        w[n++] = cur.b ? cur.b : bt_strdup_or_die("");
        cur = (buf_t){0};
        in_word = false;
    }
    *words_p = w;
    *n_p = n;
    return BT_OK;
bad:
    free(cur.b);
    bt_recipe_free_words(w, n);
    return BT_ERR_INVALID_ARG;
}

/* ---- the mapping tables ----------------------------------------------------------------- */

#define KERNELS "Baton chooses its own kernels (kernels/cpu, kernels/cuda)"

/* SGLang flags. key NULL: known, ignored for `reason`. `value`: whether it takes a value. */
static const struct {
    const char *flag, *key;
    bool value;
    const char *reason;
} flag_map[] = {
    {"model-path", "model-path", true, NULL},
    {"tokenizer-path", "tokenizer-path", true, NULL},
    {"served-model-name", "served-model-name", true, NULL},
    {"quantization", "quantization", true, NULL},
    {"context-length", "context-length", true, NULL},
    {"tp", "tp", true, NULL},
    {"tp-size", "tp", true, NULL},
    {"tensor-parallel-size", "tp", true, NULL},
    {"nnodes", "nnodes", true, NULL},
    {"node-rank", "node-rank", true, NULL},
    {"dist-init-addr", "dist-init-addr", true, NULL},
    {"chunked-prefill-size", "chunked-prefill-size", true, NULL},
    {"max-running-requests", "max-running-requests", true, NULL},
    {"max-queued-requests", "max-queued-requests", true, NULL},
    {"mem-fraction-static", "mem-fraction-static", true, NULL},
    {"max-total-tokens", "max-total-tokens", true, NULL},
    {"cuda-graph-max-bs", "cuda-graph-max-bs", true, NULL},
    {"cuda-graph-max-bs-decode", "cuda-graph-max-bs", true, NULL},
    {"speculative-algorithm", "speculative-algorithm", true, NULL},
    {"speculative-dspark-block-size", "speculative-dspark-block-size", true, NULL},
    {"tool-call-parser", "tool-call-parser", true, NULL},
    {"reasoning-parser", "reasoning-parser", true, NULL},
    {"host", "host", true, NULL},
    {"port", "port", true, NULL},
    {"api-key", "api-key", true, NULL},
    {"random-seed", "random-seed", true, NULL},
    {"watchdog-timeout", "watchdog-timeout", true, NULL},
    {"enable-cache-report", "enable-cache-report", false, NULL},
    {"log-level", "log-level", true, NULL},
    {"trust-remote-code", NULL, false, "Baton's DeepSeek-V4.1 code is built in; no code is loaded from a checkpoint"},
    {"load-format", NULL, true, "Baton reads safetensors by mmap, its only format"},
    {"ep-size", NULL, true, "experts are split over the TP ranks; no separate expert parallelism"},
    {"attention-backend", NULL, true, KERNELS},
    {"moe-runner-backend", NULL, true, KERNELS},
    {"fp8-gemm-backend", NULL, true, KERNELS},
    {"sampling-backend", NULL, true, KERNELS},
    {"enable-decoder-swa-bounded-replay", NULL, false,
     "SGLang replay switch; Baton's KV slot keeps the sliding-window ring itself"},
    {"min-free-slots-delay", NULL, true, "SGLang scheduler knob; Baton admits through the router's FIFO queue"},
    {"enable-deepseek-v4-fp4-indexer", NULL, false, "the indexer runs in the checkpoint's formats; no switch"},
    {"sleep-on-idle", NULL, false, "Baton's workers sleep on their event loop when idle"},
    {"model-loader-extra-config", NULL, true, "Baton mmaps the weights; loader threads are not a setting"},
    {"dtype", NULL, true, "Baton follows the checkpoint's formats"},
    {"kv-cache-dtype", NULL, true, "the KV layout is fixed by the model (kv_state.h)"},
    {"page-size", NULL, true, "the KV pool holds one slot per sequence, not pages"},
    {"disable-radix-cache", "disable-radix-cache", false, NULL},
    {"enable-metrics", NULL, false, "every service always serves /metrics"},
    {"disable-cuda-graph", NULL, false, "use cuda-graph-max-bs = 0"},
    {"enable-torch-compile", NULL, false, "no PyTorch in Baton"},
    {"skip-server-warmup", NULL, false, "Baton does not warm up"},
    {"schedule-policy", NULL, true, "Baton admits first come, first served"},
    {"dp-size", NULL, true, "run more decode groups instead"},
    {"enable-dp-attention", NULL, false, "run more decode groups instead"},
    {"log-requests", NULL, false, "use log-level = debug"},
    {"speculative-num-steps", NULL, true, "DSpark takes speculative-dspark-block-size"},
    {"speculative-num-draft-tokens", NULL, true, "DSpark takes speculative-dspark-block-size"},
    {"speculative-eagle-topk", NULL, true, "DSpark takes speculative-dspark-block-size"},
};

/* Environment names with a Baton equivalent. */
static const struct {
    const char *name, *key;
} env_map[] = {
    {"DSV41_MAX_NEW_TOKENS", "max-new-tokens"},
    {"B12X_ROCE_HCA", "ucx-net-devices"}, /* the RoCE HCAs, as UCX devices dev:1 */
    {"UCX_TLS", "ucx-tls"},
    {"UCX_NET_DEVICES", "ucx-net-devices"},
    {"MAX_RUNNING_REQUESTS", "max-running-requests"},
    {"CHUNKED_PREFILL_SIZE", "chunked-prefill-size"},
    {"MEM_FRACTION_STATIC", "mem-fraction-static"},
    {"CONTEXT_LENGTH", "context-length"},
};

static const struct {
    const char *prefix, *reason;
} env_reasons[] = {
    {"SGLANG_DSV41_REASONING_EFFORT", "not applicable: Baton has no default reasoning effort yet; clients send reasoning_effort per request"},
    {"EP_SIZE", "not applicable: experts are split over the TP ranks"},
    {"IMAGE", "not applicable: container image of the SGLang deployment"},
    {"BUILD_DOCKERFILE", "not applicable: container image of the SGLang deployment"},
    {"DSV41_", "not applicable: switch of the SGLang DSV41 engine build"},
    {"SGLANG_", "not applicable: SGLang setting"},
    {"B12X_", "not applicable: b12x kernel library setting"},
    {"SPARK_", "not applicable: SGLang prefill split setting"},
    {"PYTORCH_", "not applicable: Baton has no PyTorch"},
    {"", "not applicable: no Baton equivalent"},
};

/* ---- building the result ---------------------------------------------------------------- */

static void add_applied(bt_recipe_t *r, const char *key, const char *value, const char *origin)
{
    for (size_t i = 0; i < r->n_applied; i++)
        if (!strcmp(r->applied[i].key, key)) { /* last one wins, as on a command line */
            free(r->applied[i].value);
            free(r->applied[i].origin);
            r->applied[i].value = bt_strdup_or_die(value);
            r->applied[i].origin = bt_strdup_or_die(origin);
            return;
        }
    r->applied = bt_realloc_or_die(r->applied, (r->n_applied + 1) * sizeof *r->applied);
    r->applied[r->n_applied++] =
        (bt_recipe_applied_t){bt_strdup_or_die(key), bt_strdup_or_die(value), bt_strdup_or_die(origin)};
}

static void add_ignored(bt_recipe_t *r, const char *name, const char *reason)
{
    for (size_t i = 0; i < r->n_ignored; i++)
        if (!strcmp(r->ignored[i].name, name)) return;
    r->ignored = bt_realloc_or_die(r->ignored, (r->n_ignored + 1) * sizeof *r->ignored);
    r->ignored[r->n_ignored++] = (bt_recipe_ignored_t){bt_strdup_or_die(name), bt_strdup_or_die(reason)};
}

static void add_unknown(bt_recipe_t *r, const char *what)
{
    r->unknown = bt_realloc_or_die(r->unknown, (r->n_unknown + 1) * sizeof *r->unknown);
    r->unknown[r->n_unknown++] = bt_strdup_or_die(what);
}

void bt_recipe_destroy(bt_recipe_t *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_applied; i++) {
        free(r->applied[i].key);
        free(r->applied[i].value);
        free(r->applied[i].origin);
    }
    for (size_t i = 0; i < r->n_ignored; i++) {
        free(r->ignored[i].name);
        free(r->ignored[i].reason);
    }
    for (size_t i = 0; i < r->n_unknown; i++) free(r->unknown[i]);
    free(r->applied);
    free(r->ignored);
    free(r->unknown);
    free(r->slug);
    free(r->title);
    free(r);
}

const char *bt_recipe_get(const bt_recipe_t *r, const char *key)
{
    for (size_t i = 0; i < r->n_applied; i++)
        if (!strcmp(r->applied[i].key, key)) return r->applied[i].value;
    return NULL;
}

static bt_status_t map_command(bt_recipe_t *r, const char *command, char *err, size_t errlen)
{
    char **w;
    size_t n;
    char msg[512];
    bt_status_t st = bt_recipe_split_words(command, 4096, &w, &n, msg, sizeof msg);
    if (st != BT_OK) {
        snprintf(err, errlen, "recipe field 'command': %s", msg);
        return st;
    }
    size_t i = 0;
    /* the launcher: everything before the first --flag */
    char launcher[256] = "";
    for (; i < n && strncmp(w[i], "--", 2) != 0; i++) {
        size_t used = strlen(launcher);
        if (used + 2 < sizeof launcher)
            snprintf(launcher + used, sizeof launcher - used, "%s%s", used ? " " : "", w[i]);
    }
    if (i > 0) {
        char name[300];
        snprintf(name, sizeof name, "launcher '%s'", launcher);
        add_ignored(r, name, "Baton starts its own binaries; nothing from a recipe is executed");
    }
    for (; i < n; i++) {
        const char *word = w[i];
        if (strncmp(word, "--", 2) != 0 || !word[2]) {
            add_unknown(r, word);
            continue;
        }
        char flag[128];
        const char *eq = strchr(word + 2, '=');
        size_t flen = eq ? (size_t)(eq - word - 2) : strlen(word + 2);
        if (flen >= sizeof flag) flen = sizeof flag - 1;
        memcpy(flag, word + 2, flen);
        flag[flen] = 0;
        const char *value = eq ? eq + 1 : NULL;
        size_t k = 0, nk = sizeof flag_map / sizeof flag_map[0];
        while (k < nk && strcmp(flag_map[k].flag, flag)) k++;
        if (k == nk) { /* unknown: a following non-flag word is taken as its value */
            char what[512];
            if (!value && i + 1 < n && strncmp(w[i + 1], "--", 2) != 0) value = w[++i];
            snprintf(what, sizeof what, "--%s%s%.256s", flag, value ? " " : "", value ? value : "");
            add_unknown(r, what);
            continue;
        }
        if (flag_map[k].value && !value) {
            if (i + 1 >= n || !strncmp(w[i + 1], "--", 2)) {
                snprintf(err, errlen, "recipe command: --%s needs a value", flag);
                st = BT_ERR_INVALID_ARG;
                goto out;
            }
            value = w[++i];
        }
        char name[160];
        snprintf(name, sizeof name, "--%s", flag);
        if (!strcmp(flag, "fp8-gemm-backend")) {
            /* whichever kernel it names, SGLang's block-FP8 GEMMs quantize their inputs to FP8
             * on the fly: the reference deployment's numerics, which Baton runs as
             * activation-quant fp8 (its own kernels stand for the backend) */
            add_applied(r, "activation-quant", "fp8", name);
            continue;
        }
        if (!flag_map[k].key) {
            add_ignored(r, name, flag_map[k].reason);
            continue;
        }
        if (!flag_map[k].value) {
            if (value && strcmp(value, "true") && strcmp(value, "false")) {
                snprintf(err, errlen, "recipe command: --%s takes no value (or true/false), got '%.64s'", flag, value);
                st = BT_ERR_INVALID_ARG;
                goto out;
            }
            if (!value) value = "true";
        }
        if ((st = bt_conf_check_value(flag_map[k].key, value, msg, sizeof msg)) != BT_OK) {
            snprintf(err, errlen, "recipe command: --%s", msg);
            goto out;
        }
        add_applied(r, flag_map[k].key, value, name);
    }
out:
    bt_recipe_free_words(w, n);
    return st;
}

static bool env_name(const char *s, size_t len)
{
    if (!len || !(isupper((unsigned char)s[0]) || s[0] == '_')) return false;
    for (size_t i = 0; i < len; i++)
        if (!(isupper((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_')) return false;
    return len < 128;
}

static void map_env(bt_recipe_t *r, const char *env)
{
    /* free text: NAME=value tokens separated by blanks; other words are prose */
    const char *p = env;
    while (*p) {
        while (*p && isspace((unsigned char)*p)) p++;
        const char *a = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        const char *b = p;
        const char *eq = memchr(a, '=', (size_t)(b - a));
        if (!eq || !env_name(a, (size_t)(eq - a))) continue;
        const char *vs = eq + 1, *ve = b;
        while (ve > vs && (ve[-1] == ',' || ve[-1] == ';' || ve[-1] == '.')) ve--; /* prose punctuation */
        char name[128], value[1024];
        snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
        snprintf(value, sizeof value, "%.*s", (int)(ve - vs), vs);
        char origin[160], msg[512];
        snprintf(origin, sizeof origin, "env %s", name);
        size_t k = 0, nk = sizeof env_map / sizeof env_map[0];
        while (k < nk && strcmp(env_map[k].name, name)) k++;
        if (k < nk) {
            char mapped[1200];
            snprintf(mapped, sizeof mapped, "%s", value);
            if (!strcmp(name, "B12X_ROCE_HCA")) { /* rocep1s0f0,roceP2p1s0f0 -> dev:1,dev:1 */
                size_t o = 0;
                mapped[0] = 0;
                for (char *tok = value, *next; tok && *tok && o + 8 < sizeof mapped; tok = next) {
                    next = strchr(tok, ',');
                    if (next) *next++ = 0;
                    if (!*tok) continue;
                    o += (size_t)snprintf(mapped + o, sizeof mapped - o, "%s%s%s", o ? "," : "", tok,
                                          strchr(tok, ':') ? "" : ":1");
                }
            }
            const char *prev = bt_recipe_get(r, env_map[k].key);
            bool from_command = false;
            for (size_t i = 0; i < r->n_applied; i++)
                if (!strcmp(r->applied[i].key, env_map[k].key) && !strncmp(r->applied[i].origin, "--", 2))
                    from_command = true;
            char reason[400];
            if (from_command) {
                snprintf(reason, sizeof reason, "the command's --%s (%.64s) takes precedence", env_map[k].key, prev);
                add_ignored(r, origin, reason);
            } else if (bt_conf_check_value(env_map[k].key, mapped, msg, sizeof msg) != BT_OK) {
                snprintf(reason, sizeof reason, "bad value for %s: %.300s", env_map[k].key, msg);
                add_ignored(r, origin, reason);
            } else {
                add_applied(r, env_map[k].key, mapped, origin);
            }
            continue;
        }
        if (bt_conf_env_name_ok(name)) {
            bool clean = true;
            for (const char *q = value; *q; q++)
                if ((unsigned char)*q < 0x20 || *q == 0x7f) clean = false;
            char key[160];
            snprintf(key, sizeof key, "env.%s", name);
            if (clean) add_applied(r, key, value, origin);
            else add_ignored(r, origin, "value contains a control character");
            continue;
        }
        size_t j = 0;
        while (strncmp(name, env_reasons[j].prefix, strlen(env_reasons[j].prefix))) j++;
        add_ignored(r, origin, env_reasons[j].reason);
    }
}

static bt_status_t get_string_field(const cJSON *root, const char *name, bool required,
                                    const char **out_p, char *err, size_t errlen)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    *out_p = NULL;
    if (!f || cJSON_IsNull(f)) {
        if (!required) return BT_OK;
        snprintf(err, errlen, "recipe: field '%s' is missing", name);
        return BT_ERR_INVALID_ARG;
    }
    if (!cJSON_IsString(f) || !f->valuestring) {
        snprintf(err, errlen, "recipe: field '%s' must be a string", name);
        return BT_ERR_INVALID_ARG;
    }
    *out_p = f->valuestring;
    return BT_OK;
}

bt_status_t bt_recipe_parse(const char *json, size_t len, bt_recipe_t **recipe_p, char *err,
                            size_t errlen)
{
    if (len > BT_RECIPE_MAX_BYTES) {
        snprintf(err, errlen, "recipe: larger than %u bytes", BT_RECIPE_MAX_BYTES);
        return BT_ERR_TOO_LONG;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        snprintf(err, errlen, "recipe: malformed JSON near byte %zu", end ? (size_t)(end - json) : (size_t)0);
        return BT_ERR_INVALID_ARG;
    }
    for (const char *q = end; q && q < json + len; q++)
        if (!isspace((unsigned char)*q)) {
            snprintf(err, errlen, "recipe: trailing bytes after the JSON object at byte %zu", (size_t)(q - json));
            cJSON_Delete(root);
            return BT_ERR_INVALID_ARG;
        }
    bt_status_t st = BT_ERR_INVALID_ARG;
    bt_recipe_t *r = NULL;
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "recipe: expected a JSON object");
        goto out;
    }
    const char *slug, *title, *command, *env, *notes;
    if ((st = get_string_field(root, "slug", false, &slug, err, errlen)) != BT_OK ||
        (st = get_string_field(root, "title", false, &title, err, errlen)) != BT_OK ||
        (st = get_string_field(root, "command", true, &command, err, errlen)) != BT_OK ||
        (st = get_string_field(root, "env", false, &env, err, errlen)) != BT_OK ||
        (st = get_string_field(root, "notes", false, &notes, err, errlen)) != BT_OK)
        goto out;
    r = bt_calloc_or_die(1, sizeof *r);
    r->slug = slug ? bt_strdup_or_die(slug) : NULL;
    r->title = title ? bt_strdup_or_die(title) : NULL;
    if ((st = map_command(r, command, err, errlen)) != BT_OK) goto out;
    if (env) map_env(r, env);
    if (notes) add_ignored(r, "notes", "free text for the operator: read it; nothing in it is applied");
    for (const cJSON *f = root->child; f; f = f->next) {
        static const char *known[] = {"slug", "title", "command", "env", "notes"};
        bool k = false;
        for (size_t i = 0; i < 5; i++) k |= f->string && !strcmp(f->string, known[i]);
        if (!k) {
            char what[200];
            snprintf(what, sizeof what, "field '%.128s'", f->string ? f->string : "");
            add_unknown(r, what);
        }
    }
    *recipe_p = r;
    r = NULL;
    st = BT_OK;
out:
    bt_recipe_destroy(r);
    cJSON_Delete(root);
    return st;
}

/* ---- output ----------------------------------------------------------------------------- */

static void cat(buf_t *b, const char *s)
{
    while (*s) buf_put(b, *s++);
}

/* A comment line: control characters become spaces. */
static void cat_comment(buf_t *b, const char *label, const char *s)
{
    cat(b, "# ");
    cat(b, label);
    for (size_t i = 0; s[i] && i < 400; i++) buf_put(b, (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? ' ' : s[i]);
    buf_put(b, '\n');
}

char *bt_recipe_render_config(const bt_recipe_t *r, const char *source)
{
    buf_t b = {0};
    cat(&b, "# Baton cluster config (format: deploy/README.md), written by `baton recipe apply`.\n");
    if (r->slug) cat_comment(&b, "recipe: ", r->slug);
    if (r->title) cat_comment(&b, "title: ", r->title);
    if (source) cat_comment(&b, "source: ", source);
    cat(&b, "\n[cluster]\n");
    size_t nk;
    const bt_conf_key_t *keys = bt_conf_keys(&nk);
    for (size_t k = 0; k < nk; k++) {
        const char *v = bt_recipe_get(r, keys[k].key);
        if (!v) continue;
        cat(&b, keys[k].key);
        cat(&b, " = ");
        cat(&b, v);
        buf_put(&b, '\n');
    }
    bool env = false;
    for (size_t i = 0; i < r->n_applied; i++) {
        if (strncmp(r->applied[i].key, "env.", 4)) continue;
        if (!env) cat(&b, "\n[env]\n");
        env = true;
        cat(&b, r->applied[i].key + 4);
        cat(&b, " = ");
        cat(&b, r->applied[i].value);
        buf_put(&b, '\n');
    }
    return b.b;
}

char *bt_recipe_report_json(const bt_recipe_t *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *applied = cJSON_AddObjectToObject(root, "applied");
    for (size_t i = 0; i < r->n_applied; i++) {
        const bt_conf_key_t *k = bt_conf_key_find(r->applied[i].key);
        const char *v = r->applied[i].value;
        if (k && (k->type == BT_CONF_INT || k->type == BT_CONF_FLOAT))
            cJSON_AddNumberToObject(applied, r->applied[i].key, strtod(v, NULL));
        else if (k && k->type == BT_CONF_BOOL)
            cJSON_AddBoolToObject(applied, r->applied[i].key, !strcmp(v, "true"));
        else
            cJSON_AddStringToObject(applied, r->applied[i].key, v);
    }
    cJSON *ignored = cJSON_AddArrayToObject(root, "ignored");
    for (size_t i = 0; i < r->n_ignored; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", r->ignored[i].name);
        cJSON_AddStringToObject(o, "reason", r->ignored[i].reason);
        cJSON_AddItemToArray(ignored, o);
    }
    cJSON *unknown = cJSON_AddArrayToObject(root, "unknown");
    for (size_t i = 0; i < r->n_unknown; i++) cJSON_AddItemToArray(unknown, cJSON_CreateString(r->unknown[i]));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    char *out = bt_strdup_or_die(s ? s : "{}");
    cJSON_free(s);
    return out;
}

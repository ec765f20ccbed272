/* Baton's cluster config file: see config.h and deploy/README.md. */
#include "services/cli/config.h"

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const bt_conf_key_t keys[] = {
    {"model-path", BT_CONF_STR, "checkpoint directory"},
    {"tokenizer-path", BT_CONF_STR, "tokenizer directory (default: model-path)"},
    {"served-model-name", BT_CONF_STR, "the model name clients use"},
    {"quantization", BT_CONF_STR, "weight format; Baton follows the checkpoint"},
    {"context-length", BT_CONF_INT, "tokens per sequence"},
    {"tp", BT_CONF_INT, "tensor-parallel ranks per worker group"},
    {"nnodes", BT_CONF_INT, "hosts a worker group spans"},
    {"node-rank", BT_CONF_INT, "this host's rank in the group"},
    {"dist-init-addr", BT_CONF_STR, "HOST:PORT of rank 0 for the group's rendezvous"},
    {"chunked-prefill-size", BT_CONF_INT, "tokens per prefill chunk"},
    {"max-running-requests", BT_CONF_INT, "running requests per decode group"},
    {"max-queued-requests", BT_CONF_INT, "router FIFO queue"},
    {"max-new-tokens", BT_CONF_INT, "cap and default for max_tokens"},
    {"mem-fraction-static", BT_CONF_FLOAT, "fraction of memory for weights and the KV pool"},
    {"max-total-tokens", BT_CONF_INT, "KV pool size in tokens"},
    {"cuda-graph-max-bs", BT_CONF_INT, "largest decode batch captured as a CUDA graph"},
    {"activation-quant", BT_CONF_STR,
     "none or fp8: round the FP8/FP4 linears' inputs as the reference deployment does"},
    {"speculative-algorithm", BT_CONF_STR, "DSPARK"},
    {"speculative-dspark-block-size", BT_CONF_INT, "draft block size"},
    {"speculative-dspark-confidence", BT_CONF_FLOAT,
     "verify DSpark proposals up to the first the draft trusts less (0..1)"},
    {"tool-call-parser", BT_CONF_STR, "deepseekv41"},
    {"reasoning-parser", BT_CONF_STR, "deepseek-v41"},
    {"host", BT_CONF_STR, "address the services listen on"},
    {"port", BT_CONF_INT, "gateway HTTP port"},
    {"router-port", BT_CONF_INT, "router gRPC port"},
    {"api-key", BT_CONF_STR, "bearer token the gateway requires"},
    {"random-seed", BT_CONF_INT, "sampling seed"},
    {"watchdog-timeout", BT_CONF_FLOAT, "seconds any wait may take"},
    {"drain-timeout", BT_CONF_FLOAT, "seconds a stopping service finishes its requests in"},
    {"enable-cache-report", BT_CONF_BOOL, "report cached prompt tokens in usage"},
    {"disable-radix-cache", BT_CONF_BOOL, "keep no prompt prefixes (prefill)"},
    {"prefix-cache-mb", BT_CONF_INT, "host memory for cached prompt prefixes (prefill)"},
    {"threads", BT_CONF_INT, "CPU threads per worker"},
    {"ucx-tls", BT_CONF_STR, "UCX transports for the KV handoff"},
    {"ucx-net-devices", BT_CONF_STR, "UCX network devices (RoCE HCAs as dev:port)"},
    {"prefill", BT_CONF_INT, "prefill groups (baton up)"},
    {"decode", BT_CONF_INT, "decode groups (baton up)"},
    {"start-timeout", BT_CONF_INT, "seconds a service may take to start (baton up)"},
    {"log-level", BT_CONF_STR, "debug, info, warn, error"},
};

const bt_conf_key_t *bt_conf_keys(size_t *n_p)
{
    *n_p = sizeof keys / sizeof keys[0];
    return keys;
}

const bt_conf_key_t *bt_conf_key_find(const char *key)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(keys[i].key, key)) return &keys[i];
    return NULL;
}

static bool parse_int(const char *s, long long *v)
{
    if (!*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    *v = strtoll(s, &end, 10);
    return errno == 0 && *end == 0;
}

bt_status_t bt_conf_check_value(const char *key, const char *value, char *err, size_t errlen)
{
    const bt_conf_key_t *k = bt_conf_key_find(key);
    if (!k) {
        snprintf(err, errlen, "unknown key '%s'", key);
        return BT_ERR_INVALID_ARG;
    }
    for (const char *p = value; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            snprintf(err, errlen, "%s: value contains a control character", key);
            return BT_ERR_INVALID_ARG;
        }
    long long iv;
    switch (k->type) {
    case BT_CONF_STR:
        if (strlen(value) > 4096) {
            snprintf(err, errlen, "%s: value longer than 4096 bytes", key);
            return BT_ERR_INVALID_ARG;
        }
        return BT_OK;
    case BT_CONF_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "false")) return BT_OK;
        snprintf(err, errlen, "%s: expected true or false, got '%.64s'", key, value);
        return BT_ERR_INVALID_ARG;
    case BT_CONF_FLOAT: {
        char *end;
        errno = 0;
        double d = strtod(value, &end);
        if (!*value || *end || errno || !isfinite(d) || d < 0) {
            snprintf(err, errlen, "%s: expected a non-negative number, got '%.64s'", key, value);
            return BT_ERR_INVALID_ARG;
        }
        if (!strcmp(key, "mem-fraction-static") && (d <= 0 || d > 1)) {
            snprintf(err, errlen, "%s: must be in (0, 1], got %.64s", key, value);
            return BT_ERR_INVALID_ARG;
        }
        return BT_OK;
    }
    case BT_CONF_INT:
        if (!parse_int(value, &iv) || iv < 0) {
            snprintf(err, errlen, "%s: expected a non-negative integer, got '%.64s'", key, value);
            return BT_ERR_INVALID_ARG;
        }
        if ((!strcmp(key, "port") || !strcmp(key, "router-port")) && iv > 65535) {
            snprintf(err, errlen, "%s: %lld is not a TCP port", key, iv);
            return BT_ERR_INVALID_ARG;
        }
        if ((!strcmp(key, "tp") || !strcmp(key, "nnodes")) && (iv < 1 || iv > 4096)) {
            snprintf(err, errlen, "%s: must be 1..4096, got %lld", key, iv);
            return BT_ERR_INVALID_ARG;
        }
        return BT_OK;
    }
    return BT_OK;
}

bool bt_conf_env_name_ok(const char *name)
{
    if (strncmp(name, "NCCL_", 5) && strncmp(name, "UCX_", 4) && strcmp(name, "CUDA_VISIBLE_DEVICES"))
        return false;
    for (const char *p = name; *p; p++)
        if (!(isupper((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '_')) return false;
    return strlen(name) < 128;
}

typedef struct {
    char *section, *key, *value;
    int line;
} entry_t;

struct bt_conf {
    entry_t *e;
    size_t n, cap;
};

void bt_conf_destroy(bt_conf_t *conf)
{
    if (!conf) return;
    for (size_t i = 0; i < conf->n; i++) {
        free(conf->e[i].section);
        free(conf->e[i].key);
        free(conf->e[i].value);
    }
    free(conf->e);
    free(conf);
}

static char *dup_range(const char *a, const char *b)
{
    char *s = bt_malloc_or_die((size_t)(b - a) + 1);
    memcpy(s, a, (size_t)(b - a));
    s[b - a] = 0;
    return s;
}

static bool is_section(const char *s)
{
    return !strcmp(s, "cluster") || !strcmp(s, "router") || !strcmp(s, "prefill") ||
           !strcmp(s, "decode") || !strcmp(s, "gateway") || !strcmp(s, "env");
}

static bool flag_name_ok(const char *s)
{
    if (!*s || !islower((unsigned char)*s)) return false;
    for (; *s; s++)
        if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '-')) return false;
    return true;
}

bt_status_t bt_conf_parse(const char *text, size_t len, const char *label, bt_conf_t **conf_p,
                          char *err, size_t errlen)
{
    if (len > BT_CONF_MAX_BYTES) {
        snprintf(err, errlen, "%s: larger than %u bytes", label, BT_CONF_MAX_BYTES);
        return BT_ERR_INVALID_ARG;
    }
    bt_conf_t *c = bt_calloc_or_die(1, sizeof *c);
    char section[32] = "cluster";
    const char *p = text, *end = text + len;
    int line = 0;
    char msg[512];
    while (p < end) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *a = p, *b = eol;
        p = eol < end ? eol + 1 : end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r')) b--;
        if (a == b || *a == '#') continue;
        if (memchr(a, 0, (size_t)(b - a))) {
            snprintf(msg, sizeof msg, "NUL byte");
            goto bad;
        }
        if (*a == '[') {
            if (b[-1] != ']' || b - a - 2 <= 0 || b - a - 2 >= (long)sizeof section) {
                snprintf(msg, sizeof msg, "bad section header");
                goto bad;
            }
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)(b - a - 2), a + 1);
            if (!is_section(name)) {
                snprintf(msg, sizeof msg, "unknown section [%s] (cluster, router, prefill, decode, gateway, env)",
                         name);
                goto bad;
            }
            snprintf(section, sizeof section, "%s", name);
            continue;
        }
        const char *eq = memchr(a, '=', (size_t)(b - a));
        if (!eq) {
            snprintf(msg, sizeof msg, "expected 'key = value'");
            goto bad;
        }
        const char *ke = eq, *vs = eq + 1;
        while (ke > a && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        while (vs < b && (*vs == ' ' || *vs == '\t')) vs++;
        char *key = dup_range(a, ke), *value = dup_range(vs, b);
        bt_status_t st = BT_OK;
        char kerr[400];
        if (!strcmp(section, "env")) {
            if (!bt_conf_env_name_ok(key)) {
                snprintf(kerr, sizeof kerr, "[env] %.64s: only NCCL_*, UCX_* and CUDA_VISIBLE_DEVICES may be set", key);
                st = BT_ERR_INVALID_ARG;
            }
        } else if (!strcmp(section, "cluster")) {
            st = bt_conf_check_value(key, value, kerr, sizeof kerr);
        } else if (!flag_name_ok(key)) {
            snprintf(kerr, sizeof kerr, "[%s] '%.64s' is not a flag name", section, key);
            st = BT_ERR_INVALID_ARG;
        }
        if (st == BT_OK && !strcmp(section, "env"))
            for (const char *q = value; *q; q++)
                if ((unsigned char)*q < 0x20) {
                    snprintf(kerr, sizeof kerr, "[env] %.64s: value contains a control character", key);
                    st = BT_ERR_INVALID_ARG;
                    break;
                }
        if (st == BT_OK)
            for (size_t i = 0; i < c->n; i++)
                if (!strcmp(c->e[i].section, section) && !strcmp(c->e[i].key, key)) {
                    snprintf(kerr, sizeof kerr, "[%s] %.64s set twice (first on line %d)", section, key,
                             c->e[i].line);
                    st = BT_ERR_INVALID_ARG;
                }
        if (st != BT_OK) {
            free(key);
            free(value);
            snprintf(msg, sizeof msg, "%s", kerr);
            goto bad;
        }
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 32;
            c->e = bt_realloc_or_die(c->e, c->cap * sizeof *c->e);
        }
        c->e[c->n++] = (entry_t){bt_strdup_or_die(section), key, value, line};
    }
    *conf_p = c;
    return BT_OK;
bad:
    snprintf(err, errlen, "%s:%d: %s", label, line, msg);
    bt_conf_destroy(c);
    return BT_ERR_INVALID_ARG;
}

bt_status_t bt_conf_load(const char *path, bt_conf_t **conf_p, char *err, size_t errlen)
{
    char *data;
    size_t len;
    bt_status_t st = bt_read_file(path, BT_CONF_MAX_BYTES, &data, &len, err, errlen);
    if (st != BT_OK) return st;
    st = bt_conf_parse(data, len, path, conf_p, err, errlen);
    free(data);
    return st;
}

const char *bt_conf_get(const bt_conf_t *conf, const char *section, const char *key)
{
    for (size_t i = 0; conf && i < conf->n; i++)
        if (!strcmp(conf->e[i].section, section) && !strcmp(conf->e[i].key, key)) return conf->e[i].value;
    return NULL;
}

size_t bt_conf_count(const bt_conf_t *conf)
{
    return conf ? conf->n : 0;
}

void bt_conf_at(const bt_conf_t *conf, size_t i, const char **section_p, const char **key_p,
                const char **value_p, int *line_p)
{
    BT_ASSERT(i < conf->n);
    if (section_p) *section_p = conf->e[i].section;
    if (key_p) *key_p = conf->e[i].key;
    if (value_p) *value_p = conf->e[i].value;
    if (line_p) *line_p = conf->e[i].line;
}

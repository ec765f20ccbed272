#include "common/flags.h"

#include "common/alloc.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bt_flag_t *find_flag(bt_flag_t *spec, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(spec[i].name) == len && strncmp(spec[i].name, name, len) == 0) return &spec[i];
    return NULL;
}

static bt_status_t set_value(bt_flag_t *f, const char *value, char *err, size_t errlen)
{
    char *end = NULL;
    switch (f->type) {
    case BT_FLAG_TYPE_STRING:
        if (f->target) *(const char **)f->target = value;
        return BT_OK;
    case BT_FLAG_TYPE_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end) {
            snprintf(err, errlen, "flag --%s expects an integer, got '%s'", f->name, value);
            return BT_ERR_INVALID_ARG;
        }
        if (f->target) *(int64_t *)f->target = (int64_t)v;
        return BT_OK;
    }
    case BT_FLAG_TYPE_FLOAT: {
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(v)) {
            snprintf(err, errlen, "flag --%s expects a number, got '%s'", f->name, value);
            return BT_ERR_INVALID_ARG;
        }
        if (f->target) *(double *)f->target = v;
        return BT_OK;
    }
    case BT_FLAG_TYPE_BOOL: {
        bool v;
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes"))
            v = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no"))
            v = false;
        else {
            snprintf(err, errlen, "flag --%s expects true or false, got '%s'", f->name, value);
            return BT_ERR_INVALID_ARG;
        }
        if (f->target) *(bool *)f->target = v;
        return BT_OK;
    }
    }
    return BT_ERR_INTERNAL;
}

bt_status_t bt_flags_parse(bt_flag_t *spec, size_t n, int argc, char **argv,
                           bt_positionals_t *positionals, char *err, size_t errlen)
{
    bool only_positionals = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_positionals && (!strcmp(arg, "--help") || !strcmp(arg, "-h"))) {
            bt_flags_usage(stdout, spec, n);
            return BT_ERR_NOT_FOUND;
        }
        if (!only_positionals && !strcmp(arg, "--")) {
            only_positionals = true;
            continue;
        }
        if (only_positionals || strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (!positionals) {
                snprintf(err, errlen, "unexpected argument '%s'", arg);
                return BT_ERR_INVALID_ARG;
            }
            if (positionals->count == positionals->capacity) {
                positionals->capacity = positionals->capacity ? positionals->capacity * 2 : 4;
                positionals->args = bt_realloc_or_die(
                    positionals->args, (size_t)positionals->capacity * sizeof(char *));
            }
            positionals->args[positionals->count++] = arg;
            continue;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        bt_flag_t *f = find_flag(spec, n, name, len);
        if (!f) {
            snprintf(err, errlen, "unknown flag --%.*s (see --help)", (int)len, name);
            return BT_ERR_INVALID_ARG;
        }
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (f->type == BT_FLAG_TYPE_BOOL) {
            value = "true";
        } else {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "flag --%s needs a value", f->name);
                return BT_ERR_INVALID_ARG;
            }
            value = argv[++i];
        }
        bt_status_t st = set_value(f, value, err, errlen);
        if (st != BT_OK) return st;
        if (f->ignored && !f->seen) BT_LOG_WARN("flag --%s is accepted but has no effect in Baton", f->name);
        f->seen = true;
    }
    return BT_OK;
}

void bt_flags_usage(FILE *out, const bt_flag_t *spec, size_t n)
{
    static const char *const type_names[] = {"STR", "INT", "NUM", ""};
    for (size_t i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s %s", spec[i].name, type_names[spec[i].type]);
        fprintf(out, "  %-34s %s%s\n", left, spec[i].help ? spec[i].help : "",
                spec[i].ignored ? " (accepted, ignored)" : "");
    }
}

bt_status_t bt_flags_parse_int_list(const char *s, int32_t **out_p, int *n_p, char *err,
                                    size_t errlen)
{
    int cap = 16, n = 0;
    int32_t *v = bt_malloc_or_die((size_t)cap * sizeof *v);
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end = NULL;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || x < INT32_MIN || x > INT32_MAX) {
            snprintf(err, errlen, "bad integer in list at '%.16s'", p);
            free(v);
            return BT_ERR_INVALID_ARG;
        }
        if (n == cap) v = bt_realloc_or_die(v, (size_t)(cap *= 2) * sizeof *v);
        v[n++] = (int32_t)x;
        p = end;
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (*p == ',') {
            p++;
        } else if (*p) {
            snprintf(err, errlen, "expected ',' in list at '%.16s'", p);
            free(v);
            return BT_ERR_INVALID_ARG;
        }
    }
    *out_p = v;
    *n_p = n;
    return BT_OK;
}

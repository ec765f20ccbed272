#include "common/json.h"

#include "common/alloc.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bt_status_t bt_read_file(const char *path, size_t max_bytes, char **data_p, size_t *len_p,
                         char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO;
    }
    size_t cap = 4096, len = 0;
    char *buf = bt_malloc_or_die(cap + 1);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = bt_realloc_or_die(buf, cap + 1);
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len > max_bytes) {
            snprintf(err, errlen, "%s: larger than the %zu-byte limit", path, max_bytes);
            fclose(f);
            free(buf);
            return BT_ERR_TOO_LONG;
        }
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "%s: read error", path);
        free(buf);
        return BT_ERR_IO;
    }
    buf[len] = '\0';
    *data_p = buf;
    if (len_p) *len_p = len;
    return BT_OK;
}

bt_status_t bt_json_read_file(const char *path, size_t max_bytes, cJSON **root_p, char *err,
                              size_t errlen)
{
    char *data;
    size_t len;
    bt_status_t st = bt_read_file(path, max_bytes, &data, &len, err, errlen);
    if (st != BT_OK) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - data) : 0;
        snprintf(err, errlen, "%s: invalid JSON near byte %zu", path, off);
        free(data);
        return BT_ERR_INVALID_ARG;
    }
    free(data);
    *root_p = root;
    return BT_OK;
}

static const cJSON *field(const cJSON *obj, const char *key, char *err, size_t errlen,
                          bt_status_t *st)
{
    const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v || cJSON_IsNull(v)) {
        snprintf(err, errlen, "missing field '%s'", key);
        *st = BT_ERR_NOT_FOUND;
        return NULL;
    }
    return v;
}

bt_status_t bt_json_get_int(const cJSON *obj, const char *key, int64_t *out_p, char *err,
                            size_t errlen)
{
    bt_status_t st;
    const cJSON *v = field(obj, key, err, errlen, &st);
    if (!v) return st;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18) {
        snprintf(err, errlen, "field '%s' must be an integer", key);
        return BT_ERR_INVALID_ARG;
    }
    *out_p = (int64_t)d;
    return BT_OK;
}

bt_status_t bt_json_get_double(const cJSON *obj, const char *key, double *out_p, char *err,
                               size_t errlen)
{
    bt_status_t st;
    const cJSON *v = field(obj, key, err, errlen, &st);
    if (!v) return st;
    if (!cJSON_IsNumber(v)) {
        snprintf(err, errlen, "field '%s' must be a number", key);
        return BT_ERR_INVALID_ARG;
    }
    *out_p = v->valuedouble;
    return BT_OK;
}

bt_status_t bt_json_get_bool(const cJSON *obj, const char *key, bool *out_p, char *err,
                             size_t errlen)
{
    bt_status_t st;
    const cJSON *v = field(obj, key, err, errlen, &st);
    if (!v) return st;
    if (!cJSON_IsBool(v)) {
        snprintf(err, errlen, "field '%s' must be true or false", key);
        return BT_ERR_INVALID_ARG;
    }
    *out_p = cJSON_IsTrue(v);
    return BT_OK;
}

bt_status_t bt_json_get_string(const cJSON *obj, const char *key, const char **out_p, char *err,
                               size_t errlen)
{
    bt_status_t st;
    const cJSON *v = field(obj, key, err, errlen, &st);
    if (!v) return st;
    if (!cJSON_IsString(v)) {
        snprintf(err, errlen, "field '%s' must be a string", key);
        return BT_ERR_INVALID_ARG;
    }
    *out_p = v->valuestring;
    return BT_OK;
}

bt_status_t bt_json_get_int_array(const cJSON *obj, const char *key, int64_t **out_p, int *n_p,
                                  char *err, size_t errlen)
{
    bt_status_t st;
    const cJSON *v = field(obj, key, err, errlen, &st);
    if (!v) return st;
    if (!cJSON_IsArray(v)) {
        snprintf(err, errlen, "field '%s' must be an array of integers", key);
        return BT_ERR_INVALID_ARG;
    }
    int n = cJSON_GetArraySize(v);
    int64_t *a = bt_malloc_or_die((size_t)(n ? n : 1) * sizeof *a);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        double d = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18) { /* (as bt_json_get_int) */
            snprintf(err, errlen, "field '%s'[%d] must be an integer", key, i);
            free(a);
            return BT_ERR_INVALID_ARG;
        }
        a[i++] = (int64_t)d;
    }
    *out_p = a;
    *n_p = n;
    return BT_OK;
}

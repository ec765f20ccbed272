/* JSON through cJSON (Debian's libcjson), with helpers that turn a missing or mistyped
 * field into an error message naming it.
 *
 *   cJSON *root;
 *   if (bt_json_read_file("config.json", 1 << 20, &root, err, sizeof err) != BT_OK) ...
 *   int64_t hidden;
 *   st = bt_json_get_int(root, "hidden_size", &hidden, err, sizeof err);
 *   cJSON_Delete(root);
 */
#ifndef BT_JSON_H
#define BT_JSON_H

#include "common/status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reads and parses a whole file of at most max_bytes. Caller owns *root_p (cJSON_Delete). */
bt_status_t bt_json_read_file(const char *path, size_t max_bytes, cJSON **root_p, char *err,
                              size_t errlen);

/* Reads a whole file into a NUL-terminated buffer (caller frees). */
bt_status_t bt_read_file(const char *path, size_t max_bytes, char **data_p, size_t *len_p,
                         char *err, size_t errlen);

/* Typed getters: BT_ERR_NOT_FOUND when absent, BT_ERR_INVALID_ARG when of the wrong type
 * (integers must be whole numbers within int64). Messages name the key. */
bt_status_t bt_json_get_int(const cJSON *obj, const char *key, int64_t *out_p, char *err,
                            size_t errlen);
bt_status_t bt_json_get_double(const cJSON *obj, const char *key, double *out_p, char *err,
                               size_t errlen);
bt_status_t bt_json_get_bool(const cJSON *obj, const char *key, bool *out_p, char *err,
                             size_t errlen);
/* Returned string belongs to obj. */
bt_status_t bt_json_get_string(const cJSON *obj, const char *key, const char **out_p, char *err,
                               size_t errlen);
/* Array of integers into a newly allocated array (caller frees). */
bt_status_t bt_json_get_int_array(const cJSON *obj, const char *key, int64_t **out_p, int *n_p,
                                  char *err, size_t errlen);

#endif

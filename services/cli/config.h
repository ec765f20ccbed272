/* Baton's cluster config file (deploy/README.md has the full description):
 *
 *   # comment
 *   [cluster]                 # optional: keys before any section are [cluster] keys
 *   model-path = /models/DeepSeek-V4.1-Flash
 *   tp = 4
 *   [decode]                  # extra flags for one service: router, prefill, decode, gateway
 *   threads = 8
 *   [env]                     # environment for every service: NCCL_*, UCX_*, CUDA_VISIBLE_DEVICES
 *   NCCL_BUFFSIZE = 1048576
 *
 * One `key = value` per line; the value is the rest of the line, trimmed (no inline comments,
 * no quoting). [cluster] keys are SGLang flag names from a fixed table and are type-checked;
 * keys of a service section are flag names passed to that service, which checks them.
 *
 *   bt_conf_t *conf;
 *   if (bt_conf_load("baton.conf", &conf, err, sizeof err) != BT_OK) ...
 *   const char *tp = bt_conf_get(conf, "cluster", "tp");    // NULL when absent
 *   bt_conf_destroy(conf);
 */
#ifndef BT_CLI_CONFIG_H
#define BT_CLI_CONFIG_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>

#define BT_CONF_MAX_BYTES (1u << 20)

typedef enum { BT_CONF_STR, BT_CONF_INT, BT_CONF_FLOAT, BT_CONF_BOOL } bt_conf_type_t;

typedef struct {
    const char *key;
    bt_conf_type_t type;
    const char *help;
} bt_conf_key_t;

/* The [cluster] keys, in the order a written config lists them. */
const bt_conf_key_t *bt_conf_keys(size_t *n_p);
/* The table entry for a [cluster] key, or NULL. */
const bt_conf_key_t *bt_conf_key_find(const char *key);

/* Checks value against the key's type and range (a [cluster] key). The message names the key. */
bt_status_t bt_conf_check_value(const char *key, const char *value, char *err, size_t errlen);

/* True for the environment names an [env] section may set (NCCL_*, UCX_*, CUDA_VISIBLE_DEVICES). */
bool bt_conf_env_name_ok(const char *name);

typedef struct bt_conf bt_conf_t;

/* Parses text (len bytes). `label` (a file name) prefixes error messages, which name the line.
 * Caller owns *conf_p. */
bt_status_t bt_conf_parse(const char *text, size_t len, const char *label, bt_conf_t **conf_p,
                          char *err, size_t errlen);
bt_status_t bt_conf_load(const char *path, bt_conf_t **conf_p, char *err, size_t errlen);
void bt_conf_destroy(bt_conf_t *conf);

/* The value for section/key (owned by conf), or NULL. */
const char *bt_conf_get(const bt_conf_t *conf, const char *section, const char *key);
size_t bt_conf_count(const bt_conf_t *conf);
/* Entry i, in file order; pointers owned by conf. */
void bt_conf_at(const bt_conf_t *conf, size_t i, const char **section_p, const char **key_p,
                const char **value_p, int *line_p);

#endif

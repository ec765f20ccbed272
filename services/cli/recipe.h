/* Recipes: a published launch description (JSON: slug, title, command, env, notes) mapped onto
 * Baton's cluster configuration. Pure data in, data out: nothing here fetches, writes files or
 * executes anything, so the whole module can be fuzzed (tests/fuzz/fuzz_recipe.c).
 *
 *   bt_recipe_t *r;
 *   if (bt_recipe_parse(body, len, &r, err, sizeof err) != BT_OK) { fprintf(stderr, "%s\n", err); ... }
 *   for (size_t i = 0; i < r->n_applied; i++) printf("%s = %s\n", r->applied[i].key, r->applied[i].value);
 *   char *conf = bt_recipe_render_config(r, "https://.../x.json");   // caller frees
 *   bt_recipe_destroy(r);
 *
 * The `command` string is split into words like a POSIX shell would split it (quotes and
 * backslashes), but never handed to one. Every word that is not part of a known flag is
 * reported: known SGLang flags Baton has no use for under `ignored` with the reason, anything
 * else under `unknown`. The `env` free text is scanned for NAME=value pairs; the ones with a
 * Baton equivalent are applied, the rest are listed as not applicable. */
#ifndef BT_CLI_RECIPE_H
#define BT_CLI_RECIPE_H

#include "common/status.h"

#include <stddef.h>

/* Largest recipe accepted, from a file or over HTTP. */
#define BT_RECIPE_MAX_BYTES (1u << 20)

typedef struct {
    char *key;    /* Baton config key: an SGLang-style flag name ("tp"), or "env.NAME" */
    char *value;  /* as text, validated for the key's type */
    char *origin; /* where it came from: "--tp", "env DSV41_MAX_NEW_TOKENS" */
} bt_recipe_applied_t;

typedef struct {
    char *name;   /* "--trust-remote-code", "env PYTORCH_CUDA_ALLOC_CONF" */
    char *reason;
} bt_recipe_ignored_t;

typedef struct {
    char *slug, *title; /* may be NULL */
    bt_recipe_applied_t *applied;
    size_t n_applied;
    bt_recipe_ignored_t *ignored;
    size_t n_ignored;
    char **unknown; /* "--some-flag", "--some-flag value", "field 'x'" */
    size_t n_unknown;
} bt_recipe_t;

/* Splits s into words with POSIX shell quoting rules ('...', "...", backslash) and no
 * expansion of any kind. Caller frees each word and the array. An unterminated quote is an
 * error. At most max_words words. */
bt_status_t bt_recipe_split_words(const char *s, size_t max_words, char ***words_p, size_t *n_p,
                                  char *err, size_t errlen);
void bt_recipe_free_words(char **words, size_t n);

/* Parses a recipe document (JSON, len bytes, need not be NUL-terminated). Malformed JSON, a
 * field of the wrong type, a missing `command`, a flag value of the wrong type or with control
 * characters are errors whose message names the field or flag. Caller owns *recipe_p. */
bt_status_t bt_recipe_parse(const char *json, size_t len, bt_recipe_t **recipe_p, char *err,
                            size_t errlen);
void bt_recipe_destroy(bt_recipe_t *recipe);

/* The value applied under key, or NULL. */
const char *bt_recipe_get(const bt_recipe_t *recipe, const char *key);

/* The config file (deploy/README.md format) for the recipe; `source` goes in a comment.
 * Caller frees. */
char *bt_recipe_render_config(const bt_recipe_t *recipe, const char *source);

/* The report as one JSON object {"applied": {key: value}, "ignored": [{"name","reason"}],
 * "unknown": [...]}; integers and numbers as JSON numbers, booleans as JSON booleans.
 * Caller frees. */
char *bt_recipe_report_json(const bt_recipe_t *recipe);

#endif

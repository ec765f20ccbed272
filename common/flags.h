/* SGLang-style command-line flags: `--name value` or `--name=value`, booleans as bare
 * `--name` (or `--name=true|false`). An unknown flag is an error that names it; a known
 * flag Baton accepts but ignores warns once.
 *
 *   char *model = NULL; int64_t port = 8888; bool verbose = false;
 *   bt_flag_t spec[] = {
 *       BT_FLAG_STR("model-path", &model, "checkpoint directory"),
 *       BT_FLAG_INT("port", &port, "listen port"),
 *       BT_FLAG_BOOL("verbose", &verbose, "log more"),
 *   };
 *   char err[256];
 *   if (bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err) != BT_OK)
 *       { fprintf(stderr, "%s\n", err); exit(2); }
 *
 * String targets receive pointers into argv (not copies). */
#ifndef BT_FLAGS_H
#define BT_FLAGS_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define BT_COUNTOF(a) (sizeof(a) / sizeof((a)[0]))

typedef enum {
    BT_FLAG_TYPE_STRING,
    BT_FLAG_TYPE_INT,
    BT_FLAG_TYPE_FLOAT,
    BT_FLAG_TYPE_BOOL,
} bt_flag_type_t;

typedef struct {
    const char *name;   /* without leading dashes */
    bt_flag_type_t type;
    void *target;       /* const char ** | int64_t * | double * | bool * */
    const char *help;
    bool ignored;       /* accepted for SGLang compatibility, has no effect */
    bool seen;          /* set by the parser */
} bt_flag_t;

#define BT_FLAG_STR(n, t, h) {(n), BT_FLAG_TYPE_STRING, (t), (h), false, false}
#define BT_FLAG_INT(n, t, h) {(n), BT_FLAG_TYPE_INT, (t), (h), false, false}
#define BT_FLAG_FLOAT(n, t, h) {(n), BT_FLAG_TYPE_FLOAT, (t), (h), false, false}
#define BT_FLAG_BOOL(n, t, h) {(n), BT_FLAG_TYPE_BOOL, (t), (h), false, false}
#define BT_FLAG_IGNORED(n, type, h) {(n), (type), NULL, (h), true, false}

/* Positional arguments, pointers into argv. */
typedef struct {
    const char **args;
    int count;
    int capacity;
} bt_positionals_t;

/* Parses argv[0..argc) (pass argc-1, argv+1 to skip the program name). `positionals`
 * may be NULL, in which case a positional argument is an error. `--` ends flags.
 * On error writes a message naming the flag into err and returns BT_ERR_INVALID_ARG.
 * `--help`/`-h` returns BT_ERR_NOT_FOUND after printing usage to stdout. */
bt_status_t bt_flags_parse(bt_flag_t *spec, size_t n, int argc, char **argv,
                           bt_positionals_t *positionals, char *err, size_t errlen);

/* Prints one line per flag: name, type and help. */
void bt_flags_usage(FILE *out, const bt_flag_t *spec, size_t n);

/* Parses "1,2,3" into a newly allocated int32 array (caller frees). */
bt_status_t bt_flags_parse_int_list(const char *s, int32_t **out_p, int *n_p, char *err,
                                    size_t errlen);

#endif

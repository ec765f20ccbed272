/* baton tokenize / detokenize / chat-encode: the text pipeline from the command line.
 *
 *   echo -n "Hello" | baton tokenize --tokenizer-path DIR          -> 9906,...
 *   echo 9906,11 | baton detokenize --tokenizer-path DIR            -> Hello,
 *   baton chat-encode --tokenizer-path DIR < request.json           -> 0,1000,...
 */
#include "services/cli/cli.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "common/text/chat.h"
#include "common/text/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STDIN (1u << 30)

static char *read_stdin(size_t *len_p)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = bt_malloc_or_die(cap + 1);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = bt_realloc_or_die(buf, cap + 1);
        }
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0 || len > MAX_STDIN) break;
    }
    buf[len] = '\0';
    *len_p = len;
    return buf;
}

static void print_ids(const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    putchar('\n');
}

/* Common flags; returns 0 to go on, else the exit code. */
static int parse(const char *cmd, bt_flag_t *spec, size_t n, int argc, char **argv,
                 const char **dir, bt_tokenizer_t **tok_p)
{
    char err[512];
    bt_status_t st = bt_flags_parse(spec, n, argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return -1; /* --help printed */
    if (st != BT_OK) {
        fprintf(stderr, "baton %s: %s\n", cmd, err);
        return 2;
    }
    if (!*dir) {
        fprintf(stderr, "baton %s: --tokenizer-path is required\n", cmd);
        return 2;
    }
    if (bt_tokenizer_load(*dir, tok_p, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton %s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

int bt_cli_tokenize(int argc, char **argv)
{
    const char *dir = NULL;
    bool add_bos = false, literal = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("tokenizer-path", &dir, "directory holding tokenizer.json"),
        BT_FLAG_BOOL("add-bos", &add_bos, "prepend the BOS id"),
        BT_FLAG_BOOL("no-special-tokens", &literal, "do not match special/added tokens in the text"),
    };
    bt_tokenizer_t *tok = NULL;
    int rc = parse("tokenize", spec, BT_COUNTOF(spec), argc, argv, &dir, &tok);
    if (rc) return rc < 0 ? 0 : rc;
    size_t len;
    char *text = read_stdin(&len);
    int32_t *ids = NULL;
    size_t n = 0;
    unsigned flags = (add_bos ? BT_TOKENIZER_ADD_BOS : 0) | (literal ? BT_TOKENIZER_NO_ADDED_TOKENS : 0);
    bt_status_t st = bt_tokenizer_encode(tok, text, len, flags, &ids, &n);
    if (st == BT_OK) print_ids(ids, n);
    else fprintf(stderr, "baton tokenize: %s\n", bt_status_str(st));
    free(ids);
    free(text);
    bt_tokenizer_destroy(tok);
    return st == BT_OK ? 0 : 1;
}

int bt_cli_detokenize(int argc, char **argv)
{
    const char *dir = NULL;
    bool skip = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("tokenizer-path", &dir, "directory holding tokenizer.json"),
        BT_FLAG_BOOL("skip-special-tokens", &skip, "leave special tokens out of the text"),
    };
    bt_tokenizer_t *tok = NULL;
    int rc = parse("detokenize", spec, BT_COUNTOF(spec), argc, argv, &dir, &tok);
    if (rc) return rc < 0 ? 0 : rc;
    size_t len;
    char *in = read_stdin(&len);
    size_t cap = 64, n = 0;
    int32_t *ids = bt_malloc_or_die(cap * sizeof *ids);
    rc = 0;
    for (char *p = in; *p;) {
        if (strchr(", \t\r\n[]", *p)) {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= bt_tokenizer_vocab_size(tok)) {
            fprintf(stderr, "baton detokenize: bad id near '%.20s' (ids are 0..%d)\n", p,
                    bt_tokenizer_vocab_size(tok) - 1);
            rc = 1;
            break;
        }
        if (n == cap) ids = bt_realloc_or_die(ids, (cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!rc) {
        char *text;
        size_t tl;
        bt_status_t st = bt_tokenizer_decode(tok, ids, n, skip, &text, &tl);
        if (st == BT_OK) {
            fwrite(text, 1, tl, stdout);
            free(text);
        } else {
            fprintf(stderr, "baton detokenize: %s\n", bt_status_str(st));
            rc = 1;
        }
    }
    free(ids);
    free(in);
    bt_tokenizer_destroy(tok);
    return rc;
}

int bt_cli_chat_encode(int argc, char **argv)
{
    const char *dir = NULL;
    bool text_only = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("tokenizer-path", &dir, "directory holding tokenizer.json"),
        BT_FLAG_BOOL("text", &text_only, "print the prompt text instead of the ids"),
    };
    bt_tokenizer_t *tok = NULL;
    int rc = parse("chat-encode", spec, BT_COUNTOF(spec), argc, argv, &dir, &tok);
    if (rc) return rc < 0 ? 0 : rc;
    size_t len;
    char *in = read_stdin(&len);
    cJSON *req = bt_chat_parse_request(in, len);
    char err[512] = "";
    rc = 1;
    if (!req) {
        fprintf(stderr, "baton chat-encode: stdin is not valid JSON\n");
        goto done;
    }
    if (text_only) {
        char *prompt;
        size_t pl;
        if (bt_chat_render(req, &prompt, &pl, err, sizeof err) == BT_OK) {
            fwrite(prompt, 1, pl, stdout);
            free(prompt);
            rc = 0;
        }
    } else {
        int32_t *ids;
        size_t n;
        if (bt_chat_encode(tok, req, &ids, &n, err, sizeof err) == BT_OK) {
            print_ids(ids, n);
            free(ids);
            rc = 0;
        }
    }
    if (rc) fprintf(stderr, "baton chat-encode: %s\n", err);
done:
    cJSON_Delete(req);
    free(in);
    bt_tokenizer_destroy(tok);
    return rc;
}

/* baton recipe apply SOURCE [--config FILE] [--yes] [--dry-run] [--json]
 *
 * Fetches a recipe (a file, or an http(s) URL through libcurl with a size cap, a timeout and a
 * bounded number of redirects), maps it onto Baton's config (recipe.c), prints what was applied,
 * ignored and not understood, and writes the config. An existing config is never replaced
 * silently: the difference is shown and a terminal is asked (y/N); without a terminal only
 * --yes replaces it. Writes go to a temporary file renamed over the target; the previous file
 * is kept as FILE.bak. Nothing from a recipe is executed. */
#include "services/cli/cli.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "common/json.h"
#include "services/cli/config.h"
#include "services/cli/recipe.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_REDIRECTS 5

/* ---- fetching --------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap, max;
    bool over;
} body_t;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ctx)
{
    body_t *b = ctx;
    size_t n = size * nmemb;
    if (b->len + n > b->max) {
        b->over = true;
        return 0; /* aborts the transfer */
    }
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        if (b->cap > b->max + 1) b->cap = b->max + 1;
        b->data = bt_realloc_or_die(b->data, b->cap);
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = 0;
    return n;
}

static bt_status_t fetch_url(const char *url, size_t max_bytes, long timeout_ms, char **data_p,
                             size_t *len_p, char *err, size_t errlen)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "cannot initialise libcurl");
        return BT_ERR_INTERNAL;
    }
    CURL *c = curl_easy_init();
    if (!c) {
        curl_global_cleanup();
        snprintf(err, errlen, "cannot initialise libcurl");
        return BT_ERR_INTERNAL;
    }
    body_t b = {NULL, 0, 0, max_bytes, false};
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max_bytes);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "baton-recipe/1");
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    bt_status_t st = BT_OK;
    if (rc == CURLE_FILESIZE_EXCEEDED || (rc == CURLE_WRITE_ERROR && b.over)) {
        snprintf(err, errlen, "%s: response larger than the %zu-byte cap", url, max_bytes);
        st = BT_ERR_TOO_LONG;
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        snprintf(err, errlen, "%s: timed out after %.1f s", url, (double)timeout_ms / 1000.0);
        st = BT_ERR_DEADLINE;
    } else if (rc == CURLE_TOO_MANY_REDIRECTS) {
        snprintf(err, errlen, "%s: more than %d redirects (a redirect loop?)", url, MAX_REDIRECTS);
        st = BT_ERR_UNAVAILABLE;
    } else if (rc != CURLE_OK) {
        snprintf(err, errlen, "%s: %s", url, cerr[0] ? cerr : curl_easy_strerror(rc));
        st = BT_ERR_UNAVAILABLE;
    } else if (code < 200 || code > 299) {
        snprintf(err, errlen, "%s: HTTP %ld%s", url, code, code == 404 ? " (not found)" : "");
        st = code == 404 ? BT_ERR_NOT_FOUND : BT_ERR_UNAVAILABLE;
    }
    curl_easy_cleanup(c);
    curl_global_cleanup();
    if (st != BT_OK) {
        free(b.data);
        return st;
    }
    *data_p = b.data ? b.data : bt_strdup_or_die("");
    *len_p = b.len;
    return BT_OK;
}

/* ---- the report ------------------------------------------------------------------------- */

static void print_table(FILE *out, const bt_recipe_t *r)
{
    if (r->title || r->slug) fprintf(out, "recipe: %s\n", r->title ? r->title : r->slug);
    fprintf(out, "%-8s  %-32s  %s\n", "", "key / name", "value / why");
    for (size_t i = 0; i < r->n_applied; i++)
        fprintf(out, "%-8s  %-32s  %s   (%s)\n", "applied", r->applied[i].key, r->applied[i].value,
                r->applied[i].origin);
    for (size_t i = 0; i < r->n_ignored; i++)
        fprintf(out, "%-8s  %-32s  %s\n", "ignored", r->ignored[i].name, r->ignored[i].reason);
    for (size_t i = 0; i < r->n_unknown; i++)
        fprintf(out, "%-8s  %-32s  %s\n", "unknown", r->unknown[i], "not an SGLang flag Baton knows: check it by hand");
    fprintf(out, "%zu applied, %zu ignored, %zu unknown\n", r->n_applied, r->n_ignored, r->n_unknown);
}

/* ---- diff (longest common subsequence of lines; configs are small) ----------------------- */

static size_t split_lines(char *s, char ***lines_p)
{
    size_t n = 0, cap = 16;
    char **l = bt_malloc_or_die(cap * sizeof *l);
    for (char *p = s; *p;) {
        if (n == cap) l = bt_realloc_or_die(l, (cap *= 2) * sizeof *l);
        l[n++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    *lines_p = l;
    return n;
}

static void print_diff(FILE *out, const char *path, const char *old_text, const char *new_text)
{
    char *a = bt_strdup_or_die(old_text), *b = bt_strdup_or_die(new_text);
    char **la, **lb;
    size_t na = split_lines(a, &la), nb = split_lines(b, &lb);
    fprintf(out, "--- %s (current)\n+++ %s (from the recipe)\n", path, path);
    if (na > 4000 || nb > 4000) {
        fprintf(out, "(files too long to compare line by line)\n");
    } else {
        size_t w = nb + 1;
        unsigned *t = bt_calloc_or_die((na + 1) * w, sizeof *t);
        for (size_t i = na; i-- > 0;)
            for (size_t j = nb; j-- > 0;)
                t[i * w + j] = !strcmp(la[i], lb[j]) ? t[(i + 1) * w + j + 1] + 1
                               : t[(i + 1) * w + j] > t[i * w + j + 1] ? t[(i + 1) * w + j]
                                                                       : t[i * w + j + 1];
        size_t i = 0, j = 0;
        while (i < na || j < nb) {
            if (i < na && j < nb && !strcmp(la[i], lb[j])) {
                i++, j++;
            } else if (j < nb && (i == na || t[i * w + j + 1] >= t[(i + 1) * w + j])) {
                fprintf(out, "+%s\n", lb[j++]);
            } else {
                fprintf(out, "-%s\n", la[i++]);
            }
        }
        free(t);
    }
    free(la);
    free(lb);
    free(a);
    free(b);
}

/* ---- writing ---------------------------------------------------------------------------- */

static bt_status_t write_all(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return BT_ERR_IO;
        data += n;
        len -= (size_t)n;
    }
    return BT_OK;
}

/* Writes data to path through a temporary file in the same directory and rename(2). */
static bt_status_t write_atomic(const char *path, const char *data, size_t len, mode_t mode, char *err,
                                size_t errlen)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp) {
        snprintf(err, errlen, "%s: path too long", path);
        return BT_ERR_INVALID_ARG;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create a file beside %s: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    bt_status_t st = write_all(fd, data, len);
    if (st == BT_OK && (fchmod(fd, mode) != 0 || fsync(fd) != 0)) st = BT_ERR_IO;
    if (close(fd) != 0) st = BT_ERR_IO;
    if (st == BT_OK && rename(tmp, path) != 0) st = BT_ERR_IO;
    if (st != BT_OK) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    /* make the rename durable */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return BT_OK;
}

static bool ask_yes(const char *question)
{
    fprintf(stderr, "%s [y/N] ", question);
    fflush(stderr);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return false;
    return line[0] == 'y' || line[0] == 'Y';
}

static int recipe_apply(int argc, char **argv)
{
    const char *config = "baton.conf";
    bool yes = false, dry = false, json = false;
    int64_t max_bytes = BT_RECIPE_MAX_BYTES, timeout_s = 30;
    bt_flag_t spec[] = {
        BT_FLAG_STR("config", &config, "config file to write (default ./baton.conf)"),
        BT_FLAG_BOOL("yes", &yes, "replace an existing config without asking (keeps FILE.bak)"),
        BT_FLAG_BOOL("dry-run", &dry, "print the mapping and the difference; write nothing"),
        BT_FLAG_BOOL("json", &json, "print the mapping as one JSON object on stdout"),
        BT_FLAG_INT("max-bytes", &max_bytes, "largest recipe accepted (default 1 MiB)"),
        BT_FLAG_INT("timeout", &timeout_s, "seconds an HTTP fetch may take (default 30)"),
    };
    bt_positionals_t pos = {NULL, 0, 0};
    char err[1024];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, &pos, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK || pos.count != 1 || max_bytes < 1 || max_bytes > BT_RECIPE_MAX_BYTES || timeout_s < 1) {
        free(pos.args);
        fprintf(stderr, "baton recipe apply: %s\nusage: baton recipe apply SOURCE [--config FILE] [--yes] "
                        "[--dry-run] [--json]   (SOURCE: a file or an http(s) URL; --max-bytes 1..%u)\n",
                st != BT_OK ? err : "expected one SOURCE", BT_RECIPE_MAX_BYTES);
        return 2;
    }
    const char *source = pos.args[0];
    free(pos.args);
    char *body = NULL;
    size_t len = 0;
    if (!strncmp(source, "http://", 7) || !strncmp(source, "https://", 8))
        st = fetch_url(source, (size_t)max_bytes, (long)timeout_s * 1000, &body, &len, err, sizeof err);
    else if (strstr(source, "://"))
        snprintf(err, sizeof err, "%s: only files and http(s) URLs are accepted", source), st = BT_ERR_INVALID_ARG;
    else
        st = bt_read_file(source, (size_t)max_bytes, &body, &len, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "baton recipe apply: %s\n", err);
        return 1;
    }
    bt_recipe_t *r = NULL;
    st = bt_recipe_parse(body, len, &r, err, sizeof err);
    free(body);
    if (st != BT_OK) {
        fprintf(stderr, "baton recipe apply: %s: %s\n", source, err);
        return 1;
    }
    char *text = bt_recipe_render_config(r, source);
    int rc = 0;
    /* the rendered config must read back: the same parser baton up uses */
    bt_conf_t *check = NULL;
    if (bt_conf_parse(text, strlen(text), "generated config", &check, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton recipe apply: internal error: %s\n", err);
        rc = 1;
        goto out;
    }
    bt_conf_destroy(check);
    if (json) {
        char *s = bt_recipe_report_json(r);
        printf("%s\n", s);
        free(s);
    } else {
        print_table(stdout, r);
    }
    fflush(stdout);
    FILE *msg = json ? stderr : stdout;

    char *old = NULL;
    size_t old_len = 0;
    st = bt_read_file(config, BT_CONF_MAX_BYTES * 4, &old, &old_len, err, sizeof err);
    if (st != BT_OK && st != BT_ERR_NOT_FOUND) {
        fprintf(stderr, "baton recipe apply: %s\n", err);
        rc = 1;
        goto out;
    }
    bool exists = st == BT_OK;
    if (exists && old_len == strlen(text) && !memcmp(old, text, old_len)) {
        fprintf(msg, "%s is already up to date\n", config);
        free(old);
        goto out;
    }
    if (exists) print_diff(msg, config, old, text);
    if (dry) {
        if (!exists) fprintf(msg, "--- would write %s:\n%s", config, text);
        fprintf(msg, "dry run: %s not written\n", config);
        free(old);
        goto out;
    }
    if (exists && !yes) {
        fflush(msg);
        if (!isatty(STDIN_FILENO)) {
            fprintf(stderr, "baton recipe apply: %s exists and differs; not replacing it without a terminal "
                            "to ask on (rerun with --yes; the old file is kept as %s.bak)\n", config, config);
            rc = 1;
            free(old);
            goto out;
        }
        char q[PATH_MAX + 64];
        snprintf(q, sizeof q, "Replace %s (the old file is kept as %s.bak)?", config, config);
        if (!ask_yes(q)) {
            fprintf(stderr, "left %s unchanged\n", config);
            rc = 1;
            free(old);
            goto out;
        }
    }
    mode_t mode = bt_recipe_get(r, "api-key") ? 0600 : 0644;
    if (exists) {
        char bak[PATH_MAX];
        snprintf(bak, sizeof bak, "%s.bak", config);
        struct stat sb;
        mode_t bmode = stat(config, &sb) == 0 ? (sb.st_mode & 0777) : 0600;
        if (write_atomic(bak, old, old_len, bmode, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton recipe apply: %s\n", err);
            rc = 1;
            free(old);
            goto out;
        }
    }
    free(old);
    if (write_atomic(config, text, strlen(text), mode, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton recipe apply: %s\n", err);
        rc = 1;
        goto out;
    }
    fprintf(msg, "wrote %s%s\n", config, exists ? " (previous version in .bak)" : "");
out:
    free(text);
    bt_recipe_destroy(r);
    return rc;
}

int bt_cli_recipe(int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "apply")) return recipe_apply(argc - 1, argv + 1);
    FILE *out = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) ? stdout : stderr;
    fprintf(out, "usage: baton recipe apply SOURCE [--config FILE] [--yes] [--dry-run] [--json]\n"
                 "  SOURCE: a recipe file or an http(s) URL (JSON: slug, title, command, env, notes)\n");
    return out == stdout ? 0 : 2;
}

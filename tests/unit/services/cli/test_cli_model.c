/* `baton logits` and `baton generate` as processes, in the exact forms later checks call
 * them, against golden-a-exact: logits file shape and values, greedy ids on the last line of
 * stdout, peak RSS under 200 MB on golden-a, and bad arguments refused with a message. */
#include "bt_test.h"
#include "services/engine/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs argv with stdout to out_path, stderr to err_path; returns the exit code, peak RSS in
 * KiB through rss_kb. */
static int run(char *const argv[], const char *out_path, const char *err_path, long *rss_kb)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) return -1;
    if (rss_kb) *rss_kb = ru.ru_maxrss;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static void ids_arg(const int64_t *ids, size_t n, char *buf, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 16 < len; i++) o += (size_t)snprintf(buf + o, len - o, i ? ",%lld" : "%lld", (long long)ids[i]);
}

static void test_golden_exact_cli(void)
{
    char gold_path[1100], model[1024], tmp[256], out[300], errf[300];
    snprintf(model, sizeof model, "%s/golden-a-exact", BT_GOLDEN_DIR);
    snprintf(gold_path, sizeof gold_path, "%s/golden.safetensors", model);
    snprintf(tmp, sizeof tmp, "/tmp/bt-cli-%d", (int)getpid());
    snprintf(out, sizeof out, "%s.out", tmp);
    snprintf(errf, sizeof errf, "%s.err", tmp);
    bt_safetensors_t *gold;
    char err[512];
    BT_CHECK(bt_safetensors_open(gold_path, &gold, err, sizeof err) == BT_OK);
    char baton[512];
    snprintf(baton, sizeof baton, "%s/baton", BT_BIN_DIR);
    for (int p = 1; p <= 5; p += 2) {
        char key[64], ids[8192], logits_path[300];
        snprintf(key, sizeof key, "prompt%d.input_ids", p);
        const bt_tensor_view_t *t = bt_safetensors_find(gold, key);
        size_t S = t->nbytes / 8;
        int64_t *in = malloc(t->nbytes);
        memcpy(in, t->data, t->nbytes);
        ids_arg(in, S, ids, sizeof ids);
        snprintf(logits_path, sizeof logits_path, "%s.logits", tmp);
        char *argv1[] = {baton, "logits", "--model-path", model, "--input-ids", ids,
                         "--chunked-prefill-size", "7", "--output", logits_path, NULL};
        BT_CHECK_EQ_INT(run(argv1, out, errf, NULL), 0);
        snprintf(key, sizeof key, "prompt%d.logits", p);
        const bt_tensor_view_t *g = bt_safetensors_find(gold, key);
        FILE *f = fopen(logits_path, "rb");
        BT_CHECK(f != NULL);
        if (f) {
            fseek(f, 0, SEEK_END);
            BT_CHECK_EQ_INT(ftell(f), (long)g->nbytes); /* [T, vocab] float32 */
            fseek(f, 0, SEEK_SET);
            float *mine = malloc(g->nbytes), *ref = malloc(g->nbytes);
            BT_CHECK(fread(mine, 1, g->nbytes, f) == g->nbytes);
            memcpy(ref, g->data, g->nbytes);
            float d = 0, mx = 0;
            for (size_t i = 0; i < g->nbytes / 4; i++) {
                d = fmaxf(d, fabsf(mine[i] - ref[i]));
                mx = fmaxf(mx, fabsf(ref[i]));
            }
            BT_CHECK_MSG(d <= 1e-4f * mx, "prompt%d: max|d|/max|g| %g", p, (double)(d / mx));
            free(mine);
            free(ref);
            fclose(f);
        }
        char *argv2[] = {baton, "generate", "--model-path", model, "--input-ids", ids,
                         "--max-new-tokens", "24", "--temperature", "0", "--ignore-eos", NULL};
        BT_CHECK_EQ_INT(run(argv2, out, errf, NULL), 0);
        snprintf(key, sizeof key, "prompt%d.gen_ids", p);
        const bt_tensor_view_t *gi = bt_safetensors_find(gold, key);
        int64_t gen[64];
        memcpy(gen, gi->data, gi->nbytes);
        char want[2048];
        ids_arg(gen, gi->nbytes / 8, want, sizeof want);
        char *text = slurp(out);
        char *last = text ? strrchr(text, '\n') : NULL;
        if (last) *last = 0;
        last = text ? strrchr(text, '\n') : NULL;
        const char *line = last ? last + 1 : text;
        BT_CHECK_MSG(text && !strcmp(line, want), "prompt%d: got '%s' want '%s'", p, line ? line : "", want);
        free(text);
        free(in);
        unlink(logits_path);
    }
    bt_safetensors_close(gold);
    unlink(out);
    unlink(errf);
}

static void test_rss_golden_a(void)
{
    char model[1024], baton[512], out[64], errf[64], lp[64];
    snprintf(model, sizeof model, "%s/golden-a", BT_GOLDEN_DIR);
    snprintf(baton, sizeof baton, "%s/baton", BT_BIN_DIR);
    snprintf(out, sizeof out, "/tmp/bt-rss-%d.out", (int)getpid());
    snprintf(errf, sizeof errf, "/tmp/bt-rss-%d.err", (int)getpid());
    snprintf(lp, sizeof lp, "/tmp/bt-rss-%d.bin", (int)getpid());
    char ids[4096];
    size_t o = 0;
    for (int i = 0; i < 120; i++) o += (size_t)snprintf(ids + o, sizeof ids - o, i ? ",%d" : "%d", (i * 37) % 1000);
    char *argv[] = {baton, "logits", "--model-path", model, "--input-ids", ids, "--output", lp, NULL};
    long rss = 0, base = 0;
    BT_CHECK_EQ_INT(run(argv, out, errf, &rss), 0);
    /* the same binary stopping at its flags: what the process costs before the engine (a
     * build with the CUDA backend maps cuBLASLt, ~200 MB resident, with or without a GPU) */
    char *bare[] = {baton, "logits", "--no-such-flag", NULL};
    run(bare, out, errf, &base);
    fprintf(stderr, "  baton logits on golden-a, 120 tokens: peak RSS %ld KiB (%ld KiB before the engine)\n", rss,
            base);
    /* sanitizer builds carry shadow memory: the bound is for the normal build */
#if !defined(__SANITIZE_ADDRESS__)
    BT_CHECK_MSG(rss - base < 200 * 1024, "peak RSS %ld KiB, %ld KiB over the bare process", rss, rss - base);
#endif
    unlink(out);
    unlink(errf);
    unlink(lp);
}

static void test_bad_arguments(void)
{
    char baton[512], out[64], errf[64];
    snprintf(baton, sizeof baton, "%s/baton", BT_BIN_DIR);
    snprintf(out, sizeof out, "/tmp/bt-bad-%d.out", (int)getpid());
    snprintf(errf, sizeof errf, "/tmp/bt-bad-%d.err", (int)getpid());
    struct {
        char *args[8];
        const char *needle;
        int code;
    } cases[] = {
        {{"generate", "--bogus", "1", NULL}, "--bogus", 2},
        {{"generate", "--input-ids", "1,x", NULL}, "input-ids", 2},
        {{"logits", "--input-ids", "1,2", NULL}, "--output", 2},
        {{"generate", "--model-path", "/nonexistent-baton-model", "--input-ids", "1", NULL}, "/nonexistent-baton-model", 1},
        {{"nonsense", NULL}, "nonsense", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[10] = {baton};
        for (int k = 0; cases[i].args[k]; k++) argv[k + 1] = cases[i].args[k];
        BT_CHECK_EQ_INT(run(argv, out, errf, NULL), cases[i].code);
        char *e = slurp(errf);
        BT_CHECK_MSG(e && strstr(e, cases[i].needle), "case %zu: stderr '%s' lacks '%s'", i, e ? e : "", cases[i].needle);
        free(e);
    }
    unlink(out);
    unlink(errf);
}

int main(void)
{
    BT_RUN(test_golden_exact_cli);
    BT_RUN(test_rss_golden_a);
    BT_RUN(test_bad_arguments);
    return bt_test_summary();
}

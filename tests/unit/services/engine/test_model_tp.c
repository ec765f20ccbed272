/* Tensor parallelism on the CPU: TP 2 and TP 4, ranks as threads of this process and as
 * separate processes over loopback sockets, against TP 1 on golden-a-exact: logits within
 * 1e-5 relative at every position (the all-reduce sums partial products in another order, so
 * bits may differ), greedy continuations identical, every rank holding the same logits; on
 * golden-a (QAT rounding on) within 2e-2 at the positions the fixture marks robust. A TP size
 * that does not divide the heads is refused with a message. */
#include "bt_test.h"
#include "common/alloc.h"
#include "common/comm/comm.h"
#include "unit/services/engine/golden_util.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#define CTX 160
#define GEN 12

typedef struct {
    const char *fixture;
    bt_comm_t *comm;
    int prompt;
    float *logits;   /* [S + GEN][V]: prompt positions, then each greedy step's row */
    int32_t gen[GEN];
    int S, V;
    bool ok;
} run_t;

/* Prefill the prompt whole (all logits), then GEN greedy steps. */
static void *run_model(void *arg)
{
    run_t *r = arg;
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s/golden.safetensors", BT_GOLDEN_DIR, r->fixture);
    bt_safetensors_t *gold = NULL;
    if (bt_safetensors_open(path, &gold, err, sizeof err) != BT_OK) return NULL;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", BT_GOLDEN_DIR, r->fixture);
    size_t n = 0;
    int64_t *map64 = golden_i64(gold, "engram.token_map", &n);
    int32_t *map = calloc(n, sizeof *map);
    int classes = 0;
    for (size_t i = 0; i < n; i++) {
        map[i] = (int32_t)map64[i];
        if (map[i] + 1 > classes) classes = map[i] + 1;
    }
    bt_model_options_t opt = bt_model_options_default();
    opt.engram_token_map = map;
    opt.engram_classes = classes;
    opt.n_threads = 1;
    opt.max_ctx = CTX;
    opt.max_batch_tokens = CTX;
    opt.comm = r->comm;
    bt_model_t *m = NULL;
    bt_status_t st = bt_model_load(dir, &opt, &m, err, sizeof err);
    free(map);
    free(map64);
    if (st != BT_OK) {
        fprintf(stderr, "load: %s\n", err);
        bt_safetensors_close(gold);
        return NULL;
    }
    char key[64];
    snprintf(key, sizeof key, "prompt%d.input_ids", r->prompt);
    size_t S = 0;
    int64_t *ids64 = golden_i64(gold, key, &S);
    int32_t ids[CTX];
    for (size_t i = 0; i < S; i++) ids[i] = (int32_t)ids64[i];
    free(ids64);
    r->S = (int)S;
    r->V = bt_model_config(m)->vocab;
    r->logits = malloc((S + GEN) * (size_t)r->V * sizeof(float));
    r->ok = golden_prompt_then_greedy(m, CTX, ids, (int)S, GEN, r->logits, r->gen, err, sizeof err);
    if (!r->ok) fprintf(stderr, "forward: %s\n", err);
    bt_model_destroy(m);
    bt_safetensors_close(gold);
    return NULL;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    float d = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        float x = fabsf(a[i] - b[i]);
        if (!(x <= d)) d = x;
        mx = fmaxf(mx, fabsf(b[i]));
    }
    return (double)d / (double)mx;
}

static void compare(const run_t *tp, const run_t *ref, const char *what, int T)
{
    BT_CHECK_MSG(tp->ok && ref->ok, "%s TP%d did not run", what, T);
    if (!tp->ok || !ref->ok) return;
    size_t n = (size_t)(ref->S + GEN) * ref->V;
    double d = rel_diff(tp->logits, ref->logits, n);
    BT_CHECK_MSG(d <= 1e-5, "%s TP%d prompt%d: max|d|/max|ref| = %g", what, T, ref->prompt, d);
    BT_CHECK_MSG(!memcmp(tp->gen, ref->gen, sizeof ref->gen), "%s TP%d prompt%d: greedy ids differ", what, T, ref->prompt);
    fprintf(stderr, "  %s TP%d prompt%d: max|d|/max = %.2g, greedy %s\n", what, T, ref->prompt, d,
            memcmp(tp->gen, ref->gen, sizeof ref->gen) ? "DIFFERS" : "identical");
}

static void test_threads(void)
{
    const int prompts[] = {1, 3, 5};
    for (size_t p = 0; p < 3; p++) {
        run_t ref = {"golden-a-exact", NULL, prompts[p], NULL, {0}, 0, 0, false};
        run_model(&ref);
        for (int T = 2; T <= 4; T += 2) {
            bt_comm_t *comms[4];
            BT_CHECK(bt_comm_threads_create(T, comms) == BT_OK);
            run_t runs[4];
            pthread_t th[4];
            for (int r = 0; r < T; r++) {
                runs[r] = (run_t){"golden-a-exact", comms[r], prompts[p], NULL, {0}, 0, 0, false};
                pthread_create(&th[r], NULL, run_model, &runs[r]);
            }
            for (int r = 0; r < T; r++) pthread_join(th[r], NULL);
            compare(&runs[0], &ref, "threads", T);
            for (int r = 1; r < T; r++) {
                BT_CHECK(runs[r].ok);
                BT_CHECK_MSG(runs[r].ok && !memcmp(runs[r].logits, runs[0].logits, (size_t)(ref.S + GEN) * ref.V * sizeof(float)),
                             "rank %d's logits differ from rank 0's", r);
            }
            for (int r = 0; r < T; r++) {
                free(runs[r].logits);
                bt_comm_destroy(comms[r]);
            }
        }
        free(ref.logits);
    }
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    int port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void test_processes(void)
{
    run_t ref = {"golden-a-exact", NULL, 4, NULL, {0}, 0, 0, false};
    run_model(&ref);
    for (int T = 2; T <= 4; T += 2) {
        char addr[64], out[128];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
        snprintf(out, sizeof out, "/tmp/bt-tp-%d-%d.bin", (int)getpid(), T);
        pid_t pids[4];
        for (int r = 0; r < T; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                bt_comm_t *c = NULL;
                if (bt_comm_socket_create(r, T, addr, 30000, &c) != BT_OK) _exit(3);
                run_t run = {"golden-a-exact", c, 4, NULL, {0}, 0, 0, false};
                run_model(&run);
                bt_comm_destroy(c);
                if (!run.ok) _exit(4);
                if (r == 0) {
                    FILE *f = fopen(out, "wb");
                    fwrite(run.gen, sizeof run.gen, 1, f);
                    fwrite(run.logits, sizeof(float), (size_t)(run.S + GEN) * run.V, f);
                    fclose(f);
                }
                _exit(0);
            }
        }
        for (int r = 0; r < T; r++) {
            int status = 0;
            waitpid(pids[r], &status, 0);
            BT_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d of TP%d exited %d", r, T, status);
        }
        run_t got = ref;
        got.logits = malloc((size_t)(ref.S + GEN) * ref.V * sizeof(float));
        FILE *f = fopen(out, "rb");
        got.ok = f && fread(got.gen, sizeof got.gen, 1, f) == 1 &&
                 fread(got.logits, sizeof(float), (size_t)(ref.S + GEN) * ref.V, f) == (size_t)(ref.S + GEN) * ref.V;
        if (f) fclose(f);
        unlink(out);
        compare(&got, &ref, "processes", T);
        free(got.logits);
    }
    free(ref.logits);
}

static void test_qat_robust(void)
{
    /* golden-a: QAT rounding on; compare with the golden logits where the fixture marks them robust */
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/golden-a/golden.safetensors", BT_GOLDEN_DIR);
    bt_safetensors_t *gold;
    BT_CHECK(bt_safetensors_open(path, &gold, err, sizeof err) == BT_OK);
    bt_comm_t *comms[4];
    BT_CHECK(bt_comm_threads_create(4, comms) == BT_OK);
    run_t runs[4];
    pthread_t th[4];
    for (int r = 0; r < 4; r++) {
        runs[r] = (run_t){"golden-a", comms[r], 5, NULL, {0}, 0, 0, false};
        pthread_create(&th[r], NULL, run_model, &runs[r]);
    }
    for (int r = 0; r < 4; r++) pthread_join(th[r], NULL);
    float *glog = golden_f32(gold, "prompt5.logits", NULL);
    uint8_t *robust = golden_u8(gold, "prompt5.robust", NULL);
    int checked = 0;
    for (int i = 0; runs[0].ok && i < runs[0].S; i++) {
        if (!robust[i]) continue;
        float d = 0;
        for (int v = 0; v < runs[0].V; v++) d = fmaxf(d, fabsf(runs[0].logits[(size_t)i * runs[0].V + v] - glog[(size_t)i * runs[0].V + v]));
        BT_CHECK_MSG(d <= 2e-2f, "golden-a TP4 pos %d: max|d| %g", i, (double)d);
        checked++;
    }
    fprintf(stderr, "  golden-a TP4 prompt5: %d robust positions within 2e-2\n", checked);
    BT_CHECK(checked > 0);
    for (int r = 0; r < 4; r++) {
        free(runs[r].logits);
        bt_comm_destroy(comms[r]);
    }
    free(glog);
    free(robust);
    bt_safetensors_close(gold);
}

static void test_bad_tp(void)
{
    /* golden-a-exact has 4 heads: TP 3 cannot divide them */
    bt_comm_t *comms[3];
    BT_CHECK(bt_comm_threads_create(3, comms) == BT_OK);
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/golden-a-exact", BT_GOLDEN_DIR);
    int32_t map[1014] = {0};
    bt_model_options_t opt = bt_model_options_default();
    opt.engram_token_map = map;
    opt.engram_classes = 753;
    opt.comm = comms[0];
    bt_model_t *m = NULL;
    BT_CHECK(bt_model_load(dir, &opt, &m, err, sizeof err) == BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(err, "TP 3") != NULL);
    for (int r = 0; r < 3; r++) bt_comm_destroy(comms[r]);
}

int main(void)
{
    BT_RUN(test_threads);
    BT_RUN(test_processes);
    BT_RUN(test_qat_robust);
    BT_RUN(test_bad_tp);
    return bt_test_summary();
}

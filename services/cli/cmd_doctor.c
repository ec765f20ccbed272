/* baton doctor [--config FILE]: checks this host against what the config needs (GPU driver,
 * CUDA and NCCL libraries, UCX transports and RoCE devices, free ports, disk and memory for the
 * weights and the KV pool) and prints each check as OK, WARN or MISSING with how to fix it.
 * Exits 1 when something required is MISSING. Reads the system only: it starts nothing but
 * `ucx_info -d` (by execvp, no shell). */
#include "services/cli/cli.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "services/cli/config.h"
#include "services/engine/config.h"
#include "services/engine/demo_model.h"
#include "services/engine/kv_state.h"
#include "services/engine/safetensors.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

typedef enum { CHECK_OK, CHECK_WARN, CHECK_MISSING } level_t;

typedef struct {
    int missing, warn;
} tally_t;

static void report(tally_t *t, level_t lv, const char *what, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void report(tally_t *t, level_t lv, const char *what, const char *fix, const char *fmt, ...)
{
    static const char *names[] = {"OK", "WARN", "MISSING"};
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("%-8s %-18s %s\n", names[lv], what, detail);
    if (lv != CHECK_OK && fix) printf("%-8s %-18s fix: %s\n", "", "", fix);
    if (lv == CHECK_MISSING) t->missing++;
    if (lv == CHECK_WARN) t->warn++;
}

static const char *cfg_str(const bt_conf_t *c, const char *key, const char *def)
{
    const char *v = bt_conf_get(c, "cluster", key);
    return v && *v ? v : def;
}

static long long cfg_int(const bt_conf_t *c, const char *key, long long def)
{
    const char *v = bt_conf_get(c, "cluster", key);
    return v && *v ? strtoll(v, NULL, 10) : def;
}

static double cfg_double(const bt_conf_t *c, const char *key, double def)
{
    const char *v = bt_conf_get(c, "cluster", key);
    return v && *v ? strtod(v, NULL) : def;
}

/* ---- GPU, CUDA, NCCL -------------------------------------------------------------------- */

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path) return false;
    char buf[PATH_MAX];
    for (const char *p = path; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
        if (n && access(buf, X_OK) == 0) return true;
        p += n + (e ? 1 : 0);
    }
    return false;
}

static bool try_dlopen(const char *const *names, const char **found_p)
{
    for (size_t i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            dlclose(h);
            *found_p = names[i];
            return true;
        }
    }
    return false;
}

static void check_gpu(tally_t *t, long long tp, long long nnodes)
{
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    char line[256] = "";
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
        line[strcspn(line, "\n")] = 0;
        report(t, CHECK_OK, "NVIDIA driver", NULL, "%.200s", line);
    } else if (in_path("nvidia-smi")) {
        report(t, CHECK_OK, "NVIDIA driver", NULL, "nvidia-smi found");
    } else {
        report(t, CHECK_WARN, "NVIDIA driver",
               "install the NVIDIA driver (Debian: nvidia-driver from non-free, or NVIDIA's cuda-drivers)",
               "no NVIDIA driver: the CPU backend runs, CUDA does not");
    }
    static const char *const cudart[] = {"libcudart.so.12", "libcudart.so.13", "libcudart.so", NULL};
    static const char *const nccl[] = {"libnccl.so.2", "libnccl.so", NULL};
    const char *found;
    if (try_dlopen(cudart, &found))
        report(t, CHECK_OK, "CUDA runtime", NULL, "%s loads", found);
    else
        report(t, CHECK_WARN, "CUDA runtime", "install the CUDA toolkit runtime (Debian: libcudart12)",
               "libcudart not found: only the CPU backend can run");
    if (try_dlopen(nccl, &found))
        report(t, CHECK_OK, "NCCL", NULL, "%s loads", found);
    else
        report(t, CHECK_WARN, "NCCL", "install NCCL (Debian: libnccl2)",
               "libnccl not found%s", tp > 1 || nnodes > 1 ? ": tp/nnodes > 1 on GPUs needs it" : "");
}

/* ---- UCX and RDMA ----------------------------------------------------------------------- */

/* Runs `ucx_info -d` and collects the transport names into names (comma-separated). */
static bool ucx_transports(char *names, size_t len)
{
    int fds[2];
    if (pipe(fds) != 0) return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) dup2(dn, STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execlp("ucx_info", "ucx_info", "-d", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 1 << 16, used = 0;
    char *out = bt_malloc_or_die(cap + 1);
    for (;;) {
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, 10000) <= 0) break;
        ssize_t n = read(fds[0], out + used, cap - used);
        if (n <= 0) break;
        used += (size_t)n;
        if (used == cap) break;
    }
    out[used] = 0;
    close(fds[0]);
    kill(pid, SIGKILL); /* a no-op when it already exited */
    int status = 0;
    waitpid(pid, &status, 0);
    names[0] = 0;
    size_t o = 0;
    for (char *p = strstr(out, "Transport:"); p; p = strstr(p + 1, "Transport:")) {
        char name[64];
        if (sscanf(p, "Transport: %63s", name) != 1) continue;
        char probe[70];
        snprintf(probe, sizeof probe, ",%s,", name);
        char have[4096];
        snprintf(have, sizeof have, ",%s,", names);
        if (strstr(have, probe)) continue;
        o += (size_t)snprintf(names + o, len > o ? len - o : 0, "%s%s", o ? "," : "", name);
        if (o >= len) break;
    }
    free(out);
    return used > 0;
}

static bool has_transport(const char *have, const char *want)
{
    static const struct {
        const char *alias, *any;
    } aliases[] = {
        {"sm", ",posix,sysv,cma,xpmem,knem,"}, {"shm", ",posix,sysv,cma,xpmem,knem,"},
        {"rc", ",rc_verbs,rc_mlx5,"},          {"ud", ",ud_verbs,ud_mlx5,"},
        {"dc", ",dc_mlx5,"},                  {"ib", ",rc_verbs,rc_mlx5,ud_verbs,ud_mlx5,dc_mlx5,"},
        {"cuda", ",cuda_copy,cuda_ipc,"},
    };
    char h[4200];
    snprintf(h, sizeof h, ",%s,", have);
    char probe[80];
    snprintf(probe, sizeof probe, ",%s,", want);
    if (strstr(h, probe)) return true;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(aliases[i].alias, want)) continue;
        for (const char *p = aliases[i].any + 1; *p;) {
            const char *e = strchr(p, ',');
            snprintf(probe, sizeof probe, ",%.*s,", (int)(e - p), p);
            if (strstr(h, probe)) return true;
            p = e + 1;
        }
    }
    return false;
}

static void check_ucx(tally_t *t, const char *tls, const char *net_devices, long long nnodes)
{
    char have[4096];
    if (!in_path("ucx_info") || !ucx_transports(have, sizeof have)) {
        report(t, CHECK_WARN, "UCX transports", "install ucx-utils (and libucx0) from Debian",
               "cannot list UCX transports (ucx_info not found or failed)");
    } else {
        char want[256], missing[256] = "";
        snprintf(want, sizeof want, "%s", tls);
        for (char *tok = strtok(want, ","); tok; tok = strtok(NULL, ","))
            if (strcmp(tok, "all") && !has_transport(have, tok))
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                         missing[0] ? "," : "", tok);
        if (missing[0])
            report(t, CHECK_MISSING, "UCX transports",
                   "RDMA transports need rdma-core and ibverbs-providers and a working HCA; "
                   "or set ucx-tls = tcp",
                   "ucx-tls = %s but UCX has no %s (it has: %.600s)", tls, missing, have);
        else
            report(t, CHECK_OK, "UCX transports", NULL, "ucx-tls = %s; available: %.600s", tls, have);
    }
    /* RDMA devices */
    char rdma[1024] = "";
    DIR *d = opendir("/sys/class/infiniband");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.')
                snprintf(rdma + strlen(rdma), sizeof rdma - strlen(rdma), "%s%s", rdma[0] ? "," : "", e->d_name);
        closedir(d);
    }
    if (net_devices && *net_devices && strcmp(net_devices, "all")) {
        char want[1024], missing[512] = "";
        snprintf(want, sizeof want, "%s", net_devices);
        for (char *tok = strtok(want, ","); tok; tok = strtok(NULL, ",")) {
            char *colon = strchr(tok, ':');
            if (colon) *colon = 0;
            char p1[PATH_MAX], p2[PATH_MAX];
            snprintf(p1, sizeof p1, "/sys/class/infiniband/%s", tok);
            snprintf(p2, sizeof p2, "/sys/class/net/%s", tok);
            if (access(p1, F_OK) != 0 && access(p2, F_OK) != 0)
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                         missing[0] ? "," : "", tok);
        }
        if (missing[0])
            report(t, CHECK_MISSING, "RoCE devices",
                   "list the HCAs with `ls /sys/class/infiniband` (rdma-core's ibv_devices), fix ucx-net-devices, "
                   "or remove it to let UCX choose",
                   "ucx-net-devices = %s but %s not present (RDMA devices here: %s)", net_devices, missing,
                   rdma[0] ? rdma : "none");
        else
            report(t, CHECK_OK, "RoCE devices", NULL, "ucx-net-devices = %s present", net_devices);
    } else if (!rdma[0]) {
        report(t, nnodes > 1 ? CHECK_WARN : CHECK_OK, "RoCE devices",
               "install the HCA driver and rdma-core; check `ls /sys/class/infiniband`",
               "no RDMA devices%s", nnodes > 1 ? ": the KV handoff between hosts falls back to TCP" : " (not needed on one host)");
    } else {
        report(t, CHECK_OK, "RoCE devices", NULL, "%s", rdma);
    }
}

/* ---- ports ------------------------------------------------------------------------------ */

static void check_port(tally_t *t, const char *what, const char *host, long long port)
{
    if (port <= 0) return;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (!strcmp(host, "0.0.0.0") || inet_pton(AF_INET, host, &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    char fix[256];
    snprintf(fix, sizeof fix, "stop what listens there (ss -ltnp 'sport = :%lld') or set %s to a free port", port,
             what);
    if (rc == 0)
        report(t, CHECK_OK, "port", NULL, "%s %lld is free", what, port);
    else if (e == EACCES)
        report(t, CHECK_MISSING, "port", "use a port above 1023 or grant CAP_NET_BIND_SERVICE",
               "%s %lld: permission denied", what, port);
    else
        report(t, CHECK_MISSING, "port", fix, "%s %lld on %s: %s", what, port, host, strerror(e));
}

/* ---- weights, disk, memory -------------------------------------------------------------- */

static long long meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static void check_model(tally_t *t, const bt_conf_t *c, const char *model_path, bool demo)
{
    char dir[PATH_MAX];
    if (demo) bt_demo_model_default_dir(dir, sizeof dir);
    else snprintf(dir, sizeof dir, "%s", model_path);
    /* disk: the filesystem holding the model (or its nearest existing parent) */
    char probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s", dir);
    struct statvfs vfs;
    while (statvfs(probe, &vfs) != 0) {
        char *slash = strrchr(probe, '/');
        if (!slash || slash == probe) {
            snprintf(probe, sizeof probe, "%s", slash ? "/" : ".");
            if (statvfs(probe, &vfs) != 0) memset(&vfs, 0, sizeof vfs);
            break;
        }
        *slash = 0;
    }
    double disk_free = (double)vfs.f_bavail * (double)vfs.f_frsize;

    /* weights on disk */
    double files = 0;
    int shards = 0;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
            char p[PATH_MAX + 256];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            struct stat sb;
            if (stat(p, &sb) == 0) files += (double)sb.st_size, shards++;
        }
        closedir(d);
    }
    if (demo && !shards) {
        report(t, CHECK_OK, "model", NULL, "the built-in demo model (written to %s on first use)", dir);
        report(t, CHECK_OK, "disk", NULL, "%.1f GiB free at %s", disk_free / GIB, probe);
        return;
    }
    if (!shards) {
        report(t, CHECK_MISSING, "model",
               "download the checkpoint there (e.g. `huggingface-cli download deepseek-ai/DeepSeek-V4.1-Flash "
               "--local-dir DIR`) or set model-path",
               "model-path = %s: %s", dir, d ? "no .safetensors files" : "no such directory");
        report(t, disk_free < 16 * GIB ? CHECK_WARN : CHECK_OK, "disk", "free space for the weights",
               "%.1f GiB free at %s: make sure the weights fit", disk_free / GIB, probe);
        return;
    }
    report(t, CHECK_OK, "model", NULL, "%s: %d safetensors file(s), %.2f GiB", dir, shards, files / GIB);
    report(t, disk_free < 1 * GIB ? CHECK_WARN : CHECK_OK, "disk", "free some space on that filesystem",
           "%.1f GiB free at %s", disk_free / GIB, probe);

    /* memory: the CPU backend keeps the weights as float32, one copy per worker process */
    char err[512];
    double weights = 0;
    bt_safetensors_t *st;
    if (bt_safetensors_open_dir(dir, &st, err, sizeof err) == BT_OK) {
        for (size_t i = 0; i < bt_safetensors_count(st); i++) {
            const bt_tensor_view_t *v = bt_safetensors_at(st, i);
            if (v->dtype == BT_DTYPE_F8_E8M0) continue; /* scales fold into the weights */
            double n = 1;
            for (int k = 0; k < v->ndim; k++) n *= (double)v->shape[k];
            weights += n * 4.0 * (v->dtype == BT_DTYPE_I8 ? 2.0 : 1.0);
        }
        bt_safetensors_close(st);
    } else {
        report(t, CHECK_MISSING, "model", "re-download the checkpoint", "%s", err);
        return;
    }
    bt_model_config_t cfg;
    double kv = 0;
    long long ctx = cfg_int(c, "context-length", 0), running = cfg_int(c, "max-running-requests", 16);
    long long max_total = cfg_int(c, "max-total-tokens", 0);
    double frac = cfg_double(c, "mem-fraction-static", 0);
    long long phys = (long long)sysconf(_SC_PHYS_PAGES) * (long long)sysconf(_SC_PAGE_SIZE);
    if (bt_model_config_load(dir, &cfg, err, sizeof err) == BT_OK) {
        if (ctx <= 0) ctx = cfg.max_position < 8192 ? cfg.max_position : 8192;
        /* the draft stages' rings are in a slot only when the groups run them */
        if (strcmp(cfg_str(c, "speculative-algorithm", "NONE"), "DSPARK")) cfg.n_draft = 0;
        bt_kv_layout_t lay;
        if (bt_kv_layout_init(&lay, &cfg, ctx) == BT_OK) {
            long long slots = max_total > 0 ? max_total / ctx : running;
            if (slots < 1) slots = 1;
            if (frac > 0) {
                long long fit = (long long)(frac * (double)phys / (double)lay.slot_bytes);
                if (fit < slots) slots = fit > 0 ? fit : 1;
            }
            kv = (double)slots * (double)lay.slot_bytes;
            report(t, CHECK_OK, "KV pool", NULL, "%lld slots x %lld tokens x %.1f KiB/slot = %.2f GiB", slots, ctx,
                   (double)lay.slot_bytes / 1024.0, kv / GIB);
        }
    } else {
        report(t, CHECK_MISSING, "model", "fix or re-download config.json", "%s", err);
        return;
    }
    long long n_prefill = cfg_int(c, "prefill", 1), n_decode = cfg_int(c, "decode", 1);
    /* each prefill group's prefix cache grows to its budget as prompts come */
    const char *no_cache = cfg_str(c, "disable-radix-cache", "false");
    const double cache =
        strcmp(no_cache, "true") ? (double)cfg_int(c, "prefix-cache-mb", 4096) * 1048576.0 : 0.0;
    double need = weights * (double)(n_prefill + n_decode) + kv + cache * (double)n_prefill;
    double avail = (double)meminfo_kb("MemAvailable") * 1024.0;
    char detail[512];
    snprintf(
        detail, sizeof detail,
        "need ~%.2f GiB (weights %.2f GiB as float32 x %lld worker processes + KV pool %.2f GiB + "
        "prefix caches up to %.2f GiB x %lld); %.1f GiB total, %.1f GiB available",
        need / GIB, weights / GIB, n_prefill + n_decode, kv / GIB, cache / GIB, n_prefill,
        (double)phys / GIB, avail / GIB);
    if (need > (double)phys)
        report(t, CHECK_MISSING, "memory",
               "lower max-total-tokens / context-length / max-running-requests / prefix-cache-mb, "
               "run fewer "
               "groups per host, or use a larger host",
               "%s", detail);
    else if (avail > 0 && need > avail)
        report(t, CHECK_WARN, "memory", "stop other memory users or lower max-total-tokens", "%s", detail);
    else
        report(t, CHECK_OK, "memory", NULL, "%s", detail);
}

int bt_cli_doctor(int argc, char **argv)
{
    const char *config = NULL;
    bt_flag_t spec[] = {
        BT_FLAG_STR("config", &config, "cluster config to check against (default ./baton.conf if present)"),
    };
    char err[1024];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton doctor: %s\n", err);
        return 2;
    }
    tally_t t = {0, 0};
    bt_conf_t *c = NULL;
    if (!config && access("baton.conf", F_OK) == 0) config = "baton.conf";
    if (config) {
        if (bt_conf_load(config, &c, err, sizeof err) != BT_OK) {
            report(&t, CHECK_MISSING, "config", "fix the file (format: deploy/README.md)", "%s", err);
            return 1;
        }
        report(&t, CHECK_OK, "config", NULL, "%s", config);
    } else {
        report(&t, CHECK_WARN, "config", "write one with `baton recipe apply SOURCE` or from deploy/baton.conf.example",
               "no config: checking the defaults (demo model, one host)");
    }
    long long tp = cfg_int(c, "tp", 1), nnodes = cfg_int(c, "nnodes", 1);
    check_gpu(&t, tp, nnodes);
    if (tp > 1 || nnodes > 1)
        report(&t, CHECK_WARN, "parallelism", "see deploy/README.md (what runs where)",
               "tp = %lld, nnodes = %lld: worker groups run TP 1 on the CPU backend today", tp, nnodes);
    check_ucx(&t, cfg_str(c, "ucx-tls", "tcp"), cfg_str(c, "ucx-net-devices", NULL), nnodes);
    const char *host = cfg_str(c, "host", "127.0.0.1");
    if (cfg_int(c, "node-rank", 0) == 0) {
        check_port(&t, "port", host, cfg_int(c, "port", 8888));
        check_port(&t, "router-port", host, cfg_int(c, "router-port", 50051));
    }
    const char *model = cfg_str(c, "model-path", NULL);
    check_model(&t, c, model, model == NULL);
    printf("%d missing, %d warning(s)\n", t.missing, t.warn);
    bt_conf_destroy(c);
    return t.missing ? 1 : 0;
}

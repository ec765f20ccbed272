/* Kernel timelines of graph replays through CUPTI's activity API, for bench_layer_cuda --trace.
 *
 * Nsight Compute times each kernel alone with cold caches; what a decode step costs is its
 * kernels as they run in the graph: launched ahead under programmatic dependent launch, on two
 * or three streams, with gaps between them. CUPTI's concurrent-kernel records give each
 * kernel's start and end on the GPU's clock without serializing the streams. CUPTI is opened
 * with dlopen (it ships with the CUDA toolkit, beside cudart), so the bench needs it only when
 * asked to trace.
 *
 *   trace_begin()           enable the records (kernels only)
 *   ... cudaGraphLaunch ... every launch's kernels share its correlation id
 *   trace_end(f, title)     flush, disable, and write the replay of median span as a table */
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t start, end;
    uint32_t stream, corr;
    int grid[3], block;
    char name[96];
} trace_kernel_t;

static struct {
    void *lib;
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                      CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    trace_kernel_t *k;
    size_t n, cap;
    int lost; /* records that did not fit (reported, never silently dropped) */
} g_trace;

enum { TRACE_BUFFER = 8 << 20, TRACE_MAX_KERNELS = 1 << 16 };

/* "void gemm_rows<0, 2, 0, __nv_bfloat16>(__nv_bfloat16*, ...)" -> "gemm_rows<0, 2, 0,
 * __nv_bfloat16>" */
static void trace_short_name(const char *mangled, char *out, size_t cap)
{
    int st = 0;
    char *d = abi::__cxa_demangle(mangled, NULL, NULL, &st);
    const char *s = st == 0 && d ? d : mangled;
    if (!strncmp(s, "void ", 5)) s += 5;
    size_t len = strlen(s);
    const char *paren = NULL;
    int depth = 0; /* the argument list: the first '(' outside template brackets */
    for (const char *p = s; *p; p++) {
        if (*p == '<')
            depth++;
        else if (*p == '>')
            depth--;
        else if (*p == '(' && depth == 0) {
            paren = p;
            break;
        }
    }
    if (paren) len = (size_t)(paren - s);
    if (len >= cap) len = cap - 1;
    memcpy(out, s, len);
    out[len] = 0;
    free(d);
}

static void CUPTIAPI trace_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = (uint8_t *)aligned_alloc(8, TRACE_BUFFER);
    *size = *buffer ? TRACE_BUFFER : 0;
    *max_records = 0;
}

static void CUPTIAPI trace_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                            size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (g_trace.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (g_trace.n == g_trace.cap) {
            size_t cap = g_trace.cap ? 2 * g_trace.cap : 4096;
            trace_kernel_t *nk = cap <= TRACE_MAX_KERNELS
                                     ? (trace_kernel_t *)realloc(g_trace.k, cap * sizeof *nk)
                                     : NULL;
            if (!nk) {
                g_trace.lost++;
                continue;
            }
            g_trace.k = nk;
            g_trace.cap = cap;
        }
        trace_kernel_t *t = &g_trace.k[g_trace.n++];
        t->start = k->start;
        t->end = k->end;
        t->stream = k->streamId;
        t->corr = k->correlationId;
        t->grid[0] = k->gridX, t->grid[1] = k->gridY, t->grid[2] = k->gridZ;
        t->block = k->blockX * k->blockY * k->blockZ;
        trace_short_name(k->name ? k->name : "?", t->name, sizeof t->name);
    }
    free(buffer);
}

/* Opens CUPTI and starts recording kernels; false (with the reason on stderr) where it cannot. */
static bool trace_begin(void)
{
    if (!g_trace.lib) {
        const char *names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
        for (int i = 0; i < 3 && !g_trace.lib; i++)
            g_trace.lib = dlopen(names[i], RTLD_NOW);
        if (!g_trace.lib) {
            fprintf(stderr,
                    "trace: CUPTI not found (%s); put the toolkit's libcupti on "
                    "LD_LIBRARY_PATH\n",
                    dlerror());
            return false;
        }
        *(void **)&g_trace.register_callbacks =
            dlsym(g_trace.lib, "cuptiActivityRegisterCallbacks");
        *(void **)&g_trace.enable = dlsym(g_trace.lib, "cuptiActivityEnable");
        *(void **)&g_trace.disable = dlsym(g_trace.lib, "cuptiActivityDisable");
        *(void **)&g_trace.flush_all = dlsym(g_trace.lib, "cuptiActivityFlushAll");
        *(void **)&g_trace.next_record = dlsym(g_trace.lib, "cuptiActivityGetNextRecord");
        if (!g_trace.register_callbacks || !g_trace.enable || !g_trace.disable ||
            !g_trace.flush_all || !g_trace.next_record) {
            fprintf(stderr, "trace: CUPTI lacks the activity API\n");
            dlclose(g_trace.lib);
            g_trace.lib = NULL;
            return false;
        }
        if (g_trace.register_callbacks(trace_buffer_requested, trace_buffer_completed) !=
            CUPTI_SUCCESS) {
            fprintf(stderr, "trace: CUPTI refused the buffer callbacks\n");
            dlclose(g_trace.lib);
            g_trace.lib = NULL;
            return false;
        }
    }
    g_trace.n = 0;
    g_trace.lost = 0;
    if (g_trace.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "trace: CUPTI refused kernel records\n");
        return false;
    }
    return true;
}

static int trace_by_start(const void *a, const void *b)
{
    const trace_kernel_t *x = (const trace_kernel_t *)a, *y = (const trace_kernel_t *)b;
    if (x->corr != y->corr) return x->corr < y->corr ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Stops recording and writes the replay (one correlation id) of median span: each kernel's start,
 * length and gap after the last kernel that ended before it on its stream, relative to the
 * replay's first start, then the sums: kernels' time, the time any kernel ran (their union), the
 * GPU idle within the span, per stream. Returns the span in us (-1: nothing recorded). */
static double trace_end(FILE *f, const char *title)
{
    if (!g_trace.lib) return -1;
    cudaDeviceSynchronize();
    g_trace.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_trace.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    g_trace.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (g_trace.lost) fprintf(stderr, "trace: %d kernel records did not fit\n", g_trace.lost);
    if (!g_trace.n) {
        fprintf(stderr, "trace: no kernels recorded\n");
        return -1;
    }
    qsort(g_trace.k, g_trace.n, sizeof *g_trace.k, trace_by_start);
    /* the replays: runs of one correlation id */
    enum { MAX_REPLAYS = 64 };
    size_t first[MAX_REPLAYS], last[MAX_REPLAYS]; /* [first, last) */
    double span[MAX_REPLAYS];
    int nr = 0;
    for (size_t i = 0; i < g_trace.n && nr < MAX_REPLAYS; nr++) {
        size_t j = i;
        uint64_t end = 0;
        while (j < g_trace.n && g_trace.k[j].corr == g_trace.k[i].corr) {
            if (g_trace.k[j].end > end) end = g_trace.k[j].end;
            j++;
        }
        first[nr] = i;
        last[nr] = j;
        span[nr] = (double)(end - g_trace.k[i].start) / 1e3;
        i = j;
    }
    int order[MAX_REPLAYS];
    for (int i = 0; i < nr; i++)
        order[i] = i;
    for (int i = 1; i < nr; i++) /* by span, for the median */
        for (int j = i; j > 0 && span[order[j]] < span[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    const int m = order[nr / 2];
    const trace_kernel_t *k = g_trace.k + first[m];
    const size_t n = last[m] - first[m];
    const uint64_t t0 = k[0].start;
    uint32_t streams[8];
    int ns = 0;
    double busy_s[8] = {0}, sum = 0, busy = 0;
    fprintf(f,
            "### %s\n\n%d replays traced, spans %.1f..%.1f us; the median one (%.1f us, %zu "
            "kernels):\n\n",
            title, nr, span[order[0]], span[order[nr - 1]], span[m], n);
    fprintf(f, "| # | start us | us | gap us | stream | grid | block | kernel |\n"
               "|---:|---:|---:|---:|---:|---|---:|---|\n");
    uint64_t union_end = t0;
    for (size_t i = 0; i < n; i++) {
        int s = 0;
        while (s < ns && streams[s] != k[i].stream)
            s++;
        if (s == ns && ns < 8) streams[ns++] = k[i].stream;
        /* the gap: from the latest end, before this start, of a kernel on its stream */
        uint64_t prev = 0;
        for (size_t j = 0; j < i; j++)
            if (k[j].stream == k[i].stream && k[j].end <= k[i].start && k[j].end > prev)
                prev = k[j].end;
        const double d = (double)(k[i].end - k[i].start) / 1e3;
        sum += d;
        if (s < 8) busy_s[s] += d;
        if (k[i].end > union_end) { /* sorted by start: the union grows by what passes its end */
            busy += (double)(k[i].end - (k[i].start > union_end ? k[i].start : union_end)) / 1e3;
            union_end = k[i].end;
        }
        char gap[24] = "-";
        if (prev) snprintf(gap, sizeof gap, "%.1f", (double)(k[i].start - prev) / 1e3);
        fprintf(f, "| %zu | %.1f | %.1f | %s | %d | %d,%d,%d | %d | `%s` |\n", i,
                (double)(k[i].start - t0) / 1e3, d, gap, s, k[i].grid[0], k[i].grid[1],
                k[i].grid[2], k[i].block, k[i].name);
    }
    fprintf(f,
            "\nspan %.1f us; kernels %.1f us summed; some kernel running %.1f us (%.0f%%), none "
            "%.1f us",
            span[m], sum, busy, 100.0 * busy / span[m], span[m] - busy);
    for (int s = 0; s < ns; s++)
        fprintf(f, "; stream %d: %.1f us", s, busy_s[s]);
    fprintf(f, "\n\n");
    return span[m];
}

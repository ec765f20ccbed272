/* bench_chain: the decode step's chain of dependent launches against one persistent kernel.
 *
 * Sessions 25-43 found decode b1 bound by its chain: ~20 dependent kernels a layer, products
 * that stream weights between latency-bound steps (norms, the indexer, the attention, routing),
 * each launch's start, ramp and tail paid in turn even under programmatic dependent launch
 * (session 29: "1.5x needs the chain's launches themselves overlapped"). Before the engine's
 * decode is rebuilt around a persistent kernel, this bench measures what that buys on the
 * layer's own steps: its ten products at their sizes in bytes (wq_a, the indexer's queries,
 * wq_b, wo_a, wo_b, the gate, the shared expert's w13 and w2, the routed w13 and w2 of six
 * experts) and its twelve latency-bound steps in their places, each modelled as one block that
 * reads the output of the step it depends on, spins for a set time and writes the next input.
 * Two forms of the same steps:
 *   kernels     one kernel a step, captured in a CUDA graph with programmatic dependent launch
 *               on two streams, as the engine runs them (wq_b and the shared expert beside the
 *               main chain): a product's blocks copy their first weight pieces into shared
 *               memory before they wait for the kernel before;
 *   persistent  one cooperative kernel whose blocks stay resident for the whole layer, the
 *               steps ordered by counters: a block done with its share of a step goes on to the
 *               next product and copies its first pieces (and the side products' blocks stream
 *               their weights) while a latency-bound step runs on one block (the main chain's
 *               on the first, which takes no share of the products; the side's on the last).
 * Products are int8 dot products (dp4a) over the layer's bytes (its FP4 and bf16 weights
 * counted as int8 weights of as many bytes), exact, and both forms' outputs are checked against
 * the host's for every step. Printed: each form's time, the floor (the products' bytes over a
 * 1 GiB device-to-device copy's bandwidth, read + write, measured in the same run) and the
 * latency-bound steps' set time on the main chain. Results: bench/RESULTS.md, session 44.
 *
 * Built alone (not by CMake; scripts/gpu-session.sh packs it):
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/bench_chain.cu \
 *        -o build-gpu-bench/bench_chain
 *   bench_chain [--reps 100] [--spin-us 1,3] [--pf-kb 0,64] [--per-sm 2]
 * (--per-sm: blocks an SM at most, for both forms: 2 is 16 warps an SM, as gemm_rows has) */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "standalone.cuh"

/* a warp reads a row in pieces of 512 bytes, 16 a lane; U pieces in flight a lane; the step
 * before's output (at most XMAX bytes) is staged in shared memory; every step's output buffer
 * holds YMAX bytes (a product's rows past its input's length read zeros that never change) */
enum { THREADS = 256, WARPS = THREADS / 32, PIECE = 512, U = 4, XMAX = 16384, YMAX = 32768 };
enum { MAX_STEPS = 24, STEP_PRODUCT = 0, STEP_LATENCY = 1 };

typedef struct {
    int kind;
    int n;           /* product: rows; latency: bytes written */
    int k;           /* product: bytes a row; latency: bytes read (k % 16 == 0, 1..XMAX) */
    int dep[2];      /* the steps waited for (-1: none); x is dep[0]'s output */
    int side;        /* on the kernels' second stream; a latency step on the persistent
                        kernel's last block (the main chain's on its first) */
    long long spin;  /* latency: clocks to spin */
    const int8_t *w; /* product: [n, k] */
    const int8_t *x; /* dep[0]'s output (the layer's input for none) */
    int8_t *y;
} step_t;

typedef struct {
    int nsteps, slots;  /* slots: prefetched pieces a warp (512 bytes each) */
    unsigned *counters; /* nsteps + 1: blocks done with step i; the last, blocks done */
    step_t s[MAX_STEPS];
} chain_t;

/* ---- device parts ----------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile(
        "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
        "l"(src)
        : "memory");
}
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
}

/* the host's twin: mix_host */
__device__ __forceinline__ int8_t mix(int acc)
{
    const unsigned u = (unsigned)acc;
    return (int8_t)(uint8_t)(u ^ u >> 7 ^ u >> 15);
}

__device__ __forceinline__ int dot16(uint4 w, uint4 x, int acc)
{
    acc = __dp4a((int)w.x, (int)x.x, acc);
    acc = __dp4a((int)w.y, (int)x.y, acc);
    acc = __dp4a((int)w.z, (int)x.z, acc);
    return __dp4a((int)w.w, (int)x.w, acc);
}

/* A product's pieces a lane reads, in order: rows gw, gw + nw, ... (gw the warp's index in the
 * grid, nw the grid's warps), of each row pieces j = 0 .. ceil(k / PIECE) - 1 at byte
 * PIECE j + 16 lane when under k. The first `slots` of them are copied into the warp's slots
 * before the step waits (each lane later reads back only its own copies: no barrier). */
__device__ void product_prefetch(const step_t &s, int gw, int nw, uint4 *slots, int nslots)
{
    const int lane = threadIdx.x & 31, np = (s.k + PIECE - 1) / PIECE;
    int q = 0;
    for (int r = gw; r < s.n && q < nslots; r += nw)
        for (int j = 0; j < np && q < nslots; j++, q++) {
            const int off = PIECE * j + 16 * lane;
            if (off < s.k) cp_async16(&slots[q * 32 + lane], s.w + (size_t)r * s.k + off);
        }
}

/* the step before's output into shared memory (read through L2: it was written during this
 * kernel, or by the kernel before, and L1 is not coherent) */
__device__ void stage_x(const step_t &s, int8_t *xs)
{
    for (int i = 16 * threadIdx.x; i < s.k; i += 16 * THREADS)
        *(uint4 *)(xs + i) = __ldcg((const uint4 *)(s.x + i));
    __syncthreads();
}

__device__ void product_run(const step_t &s, int gw, int nw, const uint4 *slots, int nslots,
                            const int8_t *xs)
{
    const int lane = threadIdx.x & 31, np = (s.k + PIECE - 1) / PIECE;
    cp_async_wait_all();
    int q = 0;
    for (int r = gw; r < s.n; r += nw) {
        const int8_t *wr = s.w + (size_t)r * s.k;
        int acc = 0;
        for (int j0 = 0; j0 < np; j0 += U) {
            uint4 wv[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = j0 + u, off = PIECE * j + 16 * lane;
                wv[u] = make_uint4(0, 0, 0, 0);
                if (j < np && off < s.k)
                    wv[u] = q + u < nslots ? slots[(q + u) * 32 + lane]
                                           : __ldcs((const uint4 *)(wr + off));
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = j0 + u, off = PIECE * j + 16 * lane;
                if (j < np && off < s.k) acc = dot16(wv[u], *(const uint4 *)(xs + off), acc);
            }
            q += min(U, np - j0);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s.y[r] = mix(acc);
    }
}

/* one block: the sum of the step before's output, a spin of s.spin clocks (the step's own
 * latency), then n bytes that depend on both */
__device__ void latency_run(const step_t &s)
{
    __shared__ int sum;
    if (threadIdx.x == 0) sum = 0;
    __syncthreads();
    int part = 0;
    for (int i = threadIdx.x; i < s.k; i += THREADS)
        part += __ldcg(s.x + i);
    atomicAdd(&sum, part);
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < s.spin) {
        }
    }
    __syncthreads();
    const int v = sum;
    for (int i = threadIdx.x; i < s.n; i += THREADS)
        s.y[i] = (int8_t)(uint8_t)((int)__ldcg(s.x + i % s.k) + v);
}

/* until counter >= target; a count still short after ~2^31 clocks (about a second) means a
 * broken chain: the kernel traps, so the run fails instead of hanging */
__device__ void wait_counter(const unsigned *counter, unsigned target)
{
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        for (;;) {
            unsigned v;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
            if (v >= target) break;
            if (clock64() - t0 > (1ll << 31)) {
                printf("bench_chain: block %d: a counter stayed at %u of %u\n", blockIdx.x, v,
                       target);
                __trap();
            }
        }
    }
    __syncthreads();
}

/* this block is done with a step: its writes before the count */
__device__ void arrive(unsigned *counter)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
    }
}

/* Shared memory of both forms: the staged input, then each warp's slots. */
__global__ void __launch_bounds__(THREADS) chain_persistent(const __grid_constant__ chain_t c)
{
    extern __shared__ uint4 smem[];
    const int warp = threadIdx.x >> 5, gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
    int8_t *xs = (int8_t *)smem;
    uint4 *slots = smem + XMAX / 16 + (size_t)warp * c.slots * 32;
    auto wait_deps = [&](const step_t &s) {
        for (int d = 0; d < 2; d++)
            if (s.dep[d] >= 0) wait_counter(&c.counters[s.dep[d]], gridDim.x);
    };
    /* the products' rows go to the blocks but the first, which runs the main chain's
     * latency-bound steps: a share of a side product would hold the next of those back, and a
     * share of the main chain's next product would start only when the step before it ends,
     * its first pieces not copied ahead */
    const int pgw = gw - WARPS, pnw = nw - WARPS;
    for (int i = 0; i < c.nsteps; i++) {
        const step_t &s = c.s[i];
        if (s.kind == STEP_PRODUCT && blockIdx.x > 0) {
            product_prefetch(s, pgw, pnw, slots, c.slots);
            wait_deps(s);
            stage_x(s, xs);
            product_run(s, pgw, pnw, slots, c.slots, xs);
        } else if (s.kind == STEP_LATENCY && blockIdx.x == (s.side ? gridDim.x - 1 : 0)) {
            wait_deps(s);
            latency_run(s);
        }
        arrive(&c.counters[i]);
    }
    /* the last block out zeroes the counters for the next launch (stream-ordered after this) */
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&c.counters[c.nsteps], 1u) == gridDim.x - 1) {
            for (int i = 0; i <= c.nsteps; i++)
                c.counters[i] = 0;
            __threadfence();
        }
    }
}

__global__ void __launch_bounds__(THREADS)
    product_kernel(const __grid_constant__ step_t s, int nslots)
{
    extern __shared__ uint4 smem[];
    const int warp = threadIdx.x >> 5, gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
    int8_t *xs = (int8_t *)smem;
    uint4 *slots = smem + XMAX / 16 + (size_t)warp * nslots * 32;
    product_prefetch(s, gw, nw, slots, nslots);
    pdl_wait();
    pdl_release();
    stage_x(s, xs);
    product_run(s, gw, nw, slots, nslots, xs);
}

__global__ void __launch_bounds__(THREADS) latency_kernel(const __grid_constant__ step_t s)
{
    pdl_wait();
    pdl_release();
    latency_run(s);
}

/* ---- host ------------------------------------------------------------------------------- */

static int8_t mix_host(int acc)
{
    const unsigned u = (unsigned)acc;
    return (int8_t)(uint8_t)(u ^ u >> 7 ^ u >> 15);
}

/* The layer at decode b1 (bench_layer_cuda's shapes; bytes of weights a row: FP8 one a weight,
 * bf16 two, FP4 half). The order is the persistent kernel's: each side step (wq_b, the shared
 * expert) placed where the main chain runs latency-bound steps, so that the blocks idle there
 * stream its weights. The kernels' streams keep their own order; deps give the edges. */
typedef struct {
    const char *name;
    int kind, n, k, dep0, dep1, side;
} shape_t;
static const shape_t layer_chain[] = {
    {"collapse", STEP_LATENCY, 5120, 1024, -1, -1, 0},      /* 0 */
    {"wq_a", STEP_PRODUCT, 1280, 5120, 0, -1, 0},           /* 1 */
    {"q norm", STEP_LATENCY, 1280, 1280, 1, -1, 0},         /* 2 */
    {"index queries", STEP_PRODUCT, 8192, 1280, 2, -1, 0},  /* 3 */
    {"scores", STEP_LATENCY, 1024, 8192, 3, -1, 0},         /* 4 */
    {"wq_b", STEP_PRODUCT, 32768, 1280, 2, -1, 1},          /* 5 */
    {"top-k", STEP_LATENCY, 512, 1024, 4, -1, 0},           /* 6 */
    {"attention", STEP_LATENCY, 4096, 512, 6, 5, 0},        /* 7 */
    {"combine", STEP_LATENCY, 4096, 4096, 7, -1, 0},        /* 8 */
    {"wo_a", STEP_PRODUCT, 8192, 4096, 8, -1, 0},           /* 9 */
    {"wo_b", STEP_PRODUCT, 5120, 8192, 9, -1, 0},           /* 10 */
    {"expand", STEP_LATENCY, 5120, 5120, 10, -1, 0},        /* 11 */
    {"collapse", STEP_LATENCY, 10240, 5120, 11, -1, 0},     /* 12 */
    {"gate", STEP_PRODUCT, 384, 10240, 12, -1, 0},          /* 13 */
    {"routing", STEP_LATENCY, 384, 384, 13, -1, 0},         /* 14 */
    {"shared w13", STEP_PRODUCT, 4608, 5120, 12, -1, 1},    /* 15 */
    {"grouping", STEP_LATENCY, 2560, 384, 14, -1, 0},       /* 16 */
    {"shared SwiGLU", STEP_LATENCY, 2304, 4608, 15, -1, 1}, /* 17 */
    {"w13", STEP_PRODUCT, 27648, 2560, 16, -1, 0},          /* 18 */
    {"shared w2", STEP_PRODUCT, 5120, 2304, 17, -1, 1},     /* 19 */
    {"w2", STEP_PRODUCT, 30720, 1152, 18, -1, 0},           /* 20 */
    {"expand+moe", STEP_LATENCY, 5120, 5120, 20, 19, 0},    /* 21 */
};
static const int n_layer_chain = sizeof layer_chain / sizeof layer_chain[0];
static_assert(sizeof layer_chain / sizeof layer_chain[0] <= MAX_STEPS, "chain_t holds MAX_STEPS");

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* a list of up to max numbers >= 0, "a,b,..."; -1 when an item is not one or there are more */
static int parse_list(const char *s, double *v, int max)
{
    int n = 0;
    for (char *end;; s = end + 1) {
        if (n == max) return -1;
        v[n] = strtod(s, &end);
        if (end == s || v[n] < 0 || (*end && *end != ',')) return -1;
        n++;
        if (!*end) return n;
    }
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int reps = 100, per_sm_max = 2;
    double spins[8] = {1, 3}, pfs[8] = {0, 64};
    int n_spin = 2, n_pf = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if ((!strcmp(argv[i], "--spin-us") || !strcmp(argv[i], "--pf-kb")) && i + 1 < argc) {
            const bool spin = !strcmp(argv[i], "--spin-us");
            int n = parse_list(argv[i + 1], spin ? spins : pfs, 8);
            if (n < 0) {
                fprintf(stderr,
                        "bench_chain: %s wants up to 8 numbers >= 0 split by commas, not '%s'\n",
                        argv[i], argv[i + 1]);
                return 2;
            }
            *(spin ? &n_spin : &n_pf) = n;
            i++;
        } else if (!strcmp(argv[i], "--per-sm") && i + 1 < argc)
            per_sm_max = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_chain [--reps N] [--spin-us A,B..] [--pf-kb A,B..] "
                            "[--per-sm N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 10000 || per_sm_max < 1) {
        fprintf(stderr, "bench_chain: --reps wants 1..10000 and --per-sm 1 on (got %d, %d)\n", reps,
                per_sm_max);
        return 2;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0, coop = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    if (!coop) {
        fprintf(stderr, "bench_chain: %s has no cooperative launch\n", prop.name);
        return 1;
    }
    printf("%s, %d SMs, %d MHz\n", prop.name, prop.multiProcessorCount, clock_khz / 1000);

    /* weights, the chain's input and every step's output buffer */
    const int ns = n_layer_chain;
    std::vector<std::vector<int8_t>> hw(ns);
    size_t wbytes = 0;
    for (int i = 0; i < ns; i++)
        if (layer_chain[i].kind == STEP_PRODUCT) {
            hw[i].resize((size_t)layer_chain[i].n * layer_chain[i].k);
            for (auto &b : hw[i])
                b = (int8_t)(rng() >> 24);
            wbytes += hw[i].size();
        }
    std::vector<int8_t> hx(YMAX, 0);
    for (int i = 0; i < 1024; i++)
        hx[i] = (int8_t)(rng() >> 24);
    int8_t *dw = NULL, *dy = NULL;
    unsigned *dcount = NULL;
    CHECK(cudaMalloc(&dw, wbytes));
    CHECK(cudaMalloc(&dy, (size_t)(ns + 1) * YMAX));
    CHECK(cudaMalloc(&dcount, (ns + 1) * sizeof(unsigned)));
    CHECK(cudaMemset(dcount, 0, (ns + 1) * sizeof(unsigned)));
    chain_t chain;
    memset(&chain, 0, sizeof chain);
    chain.nsteps = ns;
    chain.counters = dcount;
    size_t woff = 0;
    for (int i = 0; i < ns; i++) {
        step_t *s = &chain.s[i];
        const shape_t &sh = layer_chain[i];
        s->kind = sh.kind;
        s->n = sh.n;
        s->k = sh.k;
        s->dep[0] = sh.dep0;
        s->dep[1] = sh.dep1;
        s->side = sh.side;
        /* buffer 0 the input, buffer i + 1 step i's output */
        s->x = dy + (size_t)(sh.dep0 + 1) * YMAX;
        s->y = dy + (size_t)(i + 1) * YMAX;
        if (sh.dep0 >= i || sh.dep1 >= i || sh.n > YMAX || sh.k > XMAX || sh.k % 16) {
            fprintf(stderr, "bench_chain: step %d (%s) is malformed\n", i, sh.name);
            return 1;
        }
        if (s->kind == STEP_PRODUCT) {
            CHECK(cudaMemcpy(dw + woff, hw[i].data(), hw[i].size(), cudaMemcpyHostToDevice));
            s->w = dw + woff;
            woff += hw[i].size();
        }
    }

    /* the host's outputs of every step (the spin changes no value) */
    std::vector<std::vector<int8_t>> ref(ns + 1, std::vector<int8_t>(YMAX, 0));
    ref[0] = hx;
    for (int i = 0; i < ns; i++) {
        const shape_t &sh = layer_chain[i];
        const std::vector<int8_t> &x = ref[sh.dep0 + 1];
        std::vector<int8_t> &y = ref[i + 1];
        if (sh.kind == STEP_PRODUCT) {
            for (int r = 0; r < sh.n; r++) {
                const int8_t *w = hw[i].data() + (size_t)r * sh.k;
                int acc = 0;
                for (int k = 0; k < sh.k; k++)
                    acc += w[k] * x[k];
                y[r] = mix_host(acc);
            }
        } else {
            int sum = 0;
            for (int k = 0; k < sh.k; k++)
                sum += x[k];
            for (int j = 0; j < sh.n; j++)
                y[j] = (int8_t)(uint8_t)(x[j % sh.k] + sum);
        }
    }

    cudaStream_t st, st2;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
    cudaEvent_t done[MAX_STEPS];
    for (int i = 0; i < ns; i++)
        CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));

    /* the floor's bandwidth: a 1 GiB device-to-device copy, read + write */
    double bw;
    {
        const size_t bytes = (size_t)1 << 30;
        void *a, *b;
        CHECK(cudaMalloc(&a, bytes));
        CHECK(cudaMalloc(&b, bytes));
        CHECK(cudaMemsetAsync(a, 1, bytes, st));
        float ms[8];
        for (int i = 0; i < 10; i++) {
            CHECK(cudaEventRecord(e0, st));
            CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
            CHECK(cudaEventRecord(e1, st));
            CHECK(cudaEventSynchronize(e1));
            if (i >= 2) CHECK(cudaEventElapsedTime(&ms[i - 2], e0, e1));
        }
        qsort(ms, 8, sizeof ms[0], cmp_float);
        bw = 2.0 * (double)bytes / (ms[4] * 1e-3);
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
    }
    const double floor_us = (double)wbytes / bw * 1e6;
    int n_prod = 0;
    for (int i = 0; i < ns; i++)
        n_prod += layer_chain[i].kind == STEP_PRODUCT;
    printf("%d products of %.1f MB, %d latency-bound steps; copy %.0f GB/s; floor %.1f us\n",
           n_prod, wbytes / 1e6, ns - n_prod, bw / 1e9, floor_us);

    int failed = 0;
    printf("\n| spin us a step | prefetch KB a block | blocks | kernels us | persistent us | "
           "kernels / floor | persistent / floor | main chain's spins us |\n|---:|---:|---:|---:|---:|"
           "---:|---:|---:|\n");
    for (int si = 0; si < n_spin; si++)
        for (int pi = 0; pi < n_pf; pi++) {
            const long long spin = (long long)(spins[si] * clock_khz / 1000.0);
            int n_lat = 0; /* on the main chain */
            for (int i = 0; i < ns; i++)
                if (chain.s[i].kind == STEP_LATENCY)
                    chain.s[i].spin = spin, n_lat += !chain.s[i].side;
            chain.slots = (int)(pfs[pi] * 1024 / WARPS / PIECE);
            const size_t smem = XMAX + (size_t)WARPS * chain.slots * PIECE;
            CHECK(cudaFuncSetAttribute(chain_persistent,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CHECK(cudaFuncSetAttribute(product_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
            int per_sm = 0;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_persistent, THREADS,
                                                                smem));
            if (per_sm < 1) {
                fprintf(stderr, "bench_chain: %zu bytes of shared memory a block do not fit\n",
                        smem);
                return 1;
            }
            const int blocks =
                (per_sm < per_sm_max ? per_sm : per_sm_max) * prop.multiProcessorCount;

            /* the kernels' graph: every launch under programmatic dependent launch, the side
             * steps on a second stream, an edge where a step waits for the other stream's */
            cudaGraphExec_t graph;
            {
                cudaGraph_t g;
                CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                for (int i = 0; i < ns; i++) {
                    const step_t &s = chain.s[i];
                    cudaStream_t on = s.side ? st2 : st;
                    for (int d = 0; d < 2; d++)
                        if (s.dep[d] >= 0 && chain.s[s.dep[d]].side != s.side)
                            CHECK(cudaStreamWaitEvent(on, done[s.dep[d]], 0));
                    cudaLaunchConfig_t cfg = {};
                    cudaLaunchAttribute attr[1];
                    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    attr[0].val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = attr;
                    cfg.numAttrs = 1;
                    cfg.blockDim = dim3(THREADS);
                    cfg.stream = on;
                    if (s.kind == STEP_PRODUCT) {
                        cfg.gridDim = dim3(blocks);
                        cfg.dynamicSmemBytes = smem;
                        CHECK(cudaLaunchKernelEx(&cfg, product_kernel, s, chain.slots));
                    } else {
                        cfg.gridDim = dim3(1);
                        CHECK(cudaLaunchKernelEx(&cfg, latency_kernel, s));
                    }
                    CHECK(cudaEventRecord(done[i], on));
                }
                CHECK(cudaStreamEndCapture(st, &g));
                CHECK(cudaGraphInstantiate(&graph, g, 0));
                CHECK(cudaGraphDestroy(g));
            }
            auto persistent = [&]() {
                void *args[] = {&chain};
                CHECK(cudaLaunchCooperativeKernel((const void *)chain_persistent, dim3(blocks),
                                                  dim3(THREADS), args, smem, st));
            };
            auto kernels = [&]() { CHECK(cudaGraphLaunch(graph, st)); };

            /* each form once from zeroed outputs, every step's output checked */
            for (int form = 0; form < 2; form++) {
                CHECK(cudaMemsetAsync(dy, 0, (size_t)(ns + 1) * YMAX, st));
                CHECK(cudaMemcpyAsync(dy, hx.data(), YMAX, cudaMemcpyHostToDevice, st));
                form ? persistent() : kernels();
                CHECK(cudaStreamSynchronize(st));
                std::vector<int8_t> got((size_t)(ns + 1) * YMAX);
                CHECK(cudaMemcpy(got.data(), dy, got.size(), cudaMemcpyDeviceToHost));
                for (int i = 1; i <= ns; i++)
                    if (memcmp(got.data() + (size_t)i * YMAX, ref[i].data(), YMAX)) {
                        printf("MISMATCH: %s, step %d (%s)\n", form ? "persistent" : "kernels",
                               i - 1, layer_chain[i - 1].name);
                        failed = 1;
                        break;
                    }
            }

            /* timed: rounds of reps back to back, each form in turn, the median round */
            float t[2][5];
            for (int round = 0; round < 5; round++)
                for (int form = 0; form < 2; form++) {
                    for (int w = 0; w < 3; w++)
                        form ? persistent() : kernels();
                    CHECK(cudaEventRecord(e0, st));
                    for (int r = 0; r < reps; r++)
                        form ? persistent() : kernels();
                    CHECK(cudaEventRecord(e1, st));
                    CHECK(cudaEventSynchronize(e1));
                    CHECK(cudaEventElapsedTime(&t[form][round], e0, e1));
                    t[form][round] *= 1000.0f / reps;
                }
            qsort(t[0], 5, sizeof(float), cmp_float);
            qsort(t[1], 5, sizeof(float), cmp_float);
            printf("| %.1f | %.0f | %d | %.1f | %.1f | %.2fx | %.2fx | %.1f |\n", spins[si],
                   pfs[pi], blocks, t[0][2], t[1][2], t[0][2] / floor_us, t[1][2] / floor_us,
                   n_lat * spins[si]);
            fflush(stdout);
            CHECK(cudaGraphExecDestroy(graph));
        }
    printf("\n%s\n", failed ? "FAILED: an output differs from the host's"
                            : "outputs: every step's the host's, both forms");
    return failed;
}

/* How fast blocks can stream weights from DRAM through each read path, in the decode products'
 * access pattern and in plain order, alone and in a chain of launches: the question
 * gemm_rows_bulk (session 29, four forms, all slower than gemm_rows) left open.
 *
 * Each path reads [N, K] bytes (K = 8192) once a launch, each launch its own window of a 1 GiB
 * buffer (never from L2): --mib 1024 streams far past any launch's ramp; --mib 40 is one decode
 * product's size, where a launch's start and tail count.
 *   ldg        8 warps a block, 16 bytes a lane a load, DEPTH loads in flight a lane, a tile's
 *              columns in pieces of 64 bytes (gemm_rows' pattern);
 *   ring-*     8 consumer warps reading stages from shared memory, one copier warp filling them:
 *              a stage is COLS columns x PIECE bytes (the products' pattern), copied as COLS 1D
 *              bulk copies (ring-1d), one 2D tensor box (ring-2d) or 16-byte cp.async (ring-cp);
 *              ring-seq copies a stage of the same size as one contiguous piece.
 * Then chains of 8 launches, plain and with programmatic dependent launch: each kernel's first
 * loads (ldg) or stages (ring, 48 KB a block so that the next kernel's blocks fit beside) go
 * out before it waits for the kernel before it, as the engine's products do.
 * Blocks: 2 an SM, each a contiguous share. Prints GB/s and the share of a 1 GiB
 * device-to-device copy's bandwidth (read + write) measured in the same run. Results:
 * bench/RESULTS.md, session 29.
 *
 * Built alone (not by CMake):
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/bench_read_paths.cu \
 *        -o build-gpu-bench/bench_read_paths
 *   bench_read_paths [--reps 10] [--mib 1024] */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <functional>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "standalone.cuh"

enum { K = 8192, CONSUMERS = 8, THREADS = (CONSUMERS + 1) * 32, MAX_STAGES = 8 };
enum { MODE_1D, MODE_2D, MODE_CP, MODE_SEQ };

__device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp(uint64_t *b)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b))
                 : "memory");
}
/* until the phase of this parity completes; a phase still open after ~2^26 tries (seconds)
 * means a broken ring: the kernel traps, so the run fails instead of hanging */
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    unsigned done;
    for (unsigned tries = 0;; tries++) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
        if (done) return;
        if (tries == 1u << 26) {
            printf("bench_read_paths: block %d thread %d: an mbarrier phase never completed\n",
                   blockIdx.x, threadIdx.x);
            __trap();
        }
    }
}
__device__ __forceinline__ void bulk_1d(void *dst, const void *src, unsigned bytes, uint64_t *b)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(b))
        : "memory");
}
__device__ __forceinline__ void box_2d(void *dst, const CUtensorMap *m, int x, int y, uint64_t *b)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)m), "r"(x), "r"(y), "r"(smem_u32(b))
                 : "memory");
}

/* work item i of a block: tile i / (K / piece) (cols columns), k piece i % (K / piece) */
template <int MODE>
__global__ void __launch_bounds__(THREADS, 2)
    ring_kernel(const uint8_t *w, const __grid_constant__ CUtensorMap map, int row0, int cols,
                int piece, long long items, int nst, unsigned long long *sink)
{
    extern __shared__ __align__(1024) uint8_t ring[];
    __shared__ uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sb = cols * piece;
    const long long per = (items + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per;
    const long long n = per < items - i0 ? per : items - i0;
    const int kp = K / piece;
    if (threadIdx.x == 0)
        for (int s = 0; s < nst; s++) {
            mbar_init(&full[s], MODE == MODE_CP ? 32 : 1);
            mbar_init(&empty[s], CONSUMERS);
        }
    __syncthreads();
    pdl_release();
    if (n <= 0) {
        pdl_wait();
        return;
    }
    if (warp == CONSUMERS) {
        int slot = 0, ph = 0;
        for (long long i = 0; i < n; i++) {
            if (i == nst) pdl_wait(); /* (the first stages go out before it) */
            if (i >= nst) mbar_wait(&empty[slot], ph ^ 1);
            const long long it = i0 + i, tile = it / kp;
            const int k0 = (int)(it % kp) * piece;
            uint8_t *st = ring + (size_t)slot * sb;
            if (MODE == MODE_CP) {
                /* lanes take 16 bytes each, column by column */
                for (int u = lane; u < sb / 16; u += 32) {
                    const int c = u / (piece / 16), v = u % (piece / 16);
                    const uint8_t *src = w + (size_t)(tile * cols + c) * K + k0 + 16 * v;
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                                     smem_u32(st + c * piece + 16 * v)),
                                 "l"(src)
                                 : "memory");
                }
                mbar_arrive_cp(&full[slot]);
            } else {
                if (lane == 0) mbar_expect_tx(&full[slot], (unsigned)sb);
                __syncwarp();
                if (MODE == MODE_1D) {
                    for (int c = lane; c < cols; c += 32)
                        bulk_1d(st + c * piece, w + (size_t)(tile * cols + c) * K + k0, piece,
                                &full[slot]);
                } else if (MODE == MODE_SEQ) {
                    if (lane == 0) bulk_1d(st, w + (size_t)it * sb, sb, &full[slot]);
                } else if (lane == 0) {
                    box_2d(st, &map, k0, row0 + (int)(tile * cols), &full[slot]);
                }
            }
            if (++slot == nst) slot = 0, ph ^= 1;
        }
        if (n <= nst) pdl_wait();
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }
    pdl_wait(); /* the consumers stand for a product's reads of its input rows */
    unsigned long long acc = 0;
    int slot = 0, ph = 0;
    for (long long i = 0; i < n; i++) {
        mbar_wait(&full[slot], ph);
        const uint4 *st = (const uint4 *)(ring + (size_t)slot * sb);
        for (int u = warp * 32 + lane; u < sb / 16; u += CONSUMERS * 32) {
            const uint4 v = st[u];
            acc += v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        if (++slot == nst) slot = 0, ph ^= 1;
    }
    if (acc == 0x123456789ull) atomicAdd(sink, acc); /* (keeps the reads) */
}

/* gemm_rows' pattern with plain loads: a warp takes a tile's columns (cols of them), a lane 16
 * bytes of a 64-byte piece of 2 columns, DEPTH pieces ahead */
template <int DEPTH>
__global__ void __launch_bounds__(256, 2)
    ldg_kernel(const uint8_t *w, int cols, long long tiles, unsigned long long *sink)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const long long per = (tiles + gridDim.x - 1) / gridDim.x, t0 = blockIdx.x * per;
    const long long t1 = t0 + per < tiles ? t0 + per : tiles;
    unsigned long long acc = 0;
    bool waited = false;
    pdl_release();
    if (t0 >= t1) pdl_wait();
    for (long long t = t0; t < t1; t++)
        for (int cg = 0; cg < cols; cg += 16) {
            /* the warp's k chunks: warp, warp + 8, ... of 64 bytes; lane: columns g, g + 8 */
            const uint8_t *p0 = w + (size_t)(t * cols + cg + g) * K + 16 * c + 64 * warp;
            const uint8_t *p1 = p0 + (size_t)8 * K;
#pragma unroll 1
            for (int k = 0; k < K; k += 64 * 8 * DEPTH) {
                uint4 v[2 * DEPTH];
#pragma unroll
                for (int d = 0; d < DEPTH; d++) {
                    v[2 * d] = __ldg((const uint4 *)(p0 + k + 512 * d));
                    v[2 * d + 1] = __ldg((const uint4 *)(p1 + k + 512 * d));
                }
                if (!waited) pdl_wait(), waited = true; /* (after the first loads) */
#pragma unroll
                for (int d = 0; d < 2 * DEPTH; d++)
                    acc += v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
            }
        }
    if (acc == 0x123456789ull) atomicAdd(sink, acc);
}

typedef void (*ring_fn)(const uint8_t *, const CUtensorMap, int, int, int, long long, int,
                        unsigned long long *);

static ring_fn ring_of(int mode)
{
    return mode == MODE_1D   ? ring_kernel<MODE_1D>
           : mode == MODE_2D ? ring_kernel<MODE_2D>
           : mode == MODE_CP ? ring_kernel<MODE_CP>
                             : ring_kernel<MODE_SEQ>;
}

/* the [total / K, K] bytes at w as a 2D tensor map in boxes of cols rows x min(piece, 256)
 * bytes; false, saying which box and why, where the driver refuses it */
static bool tensor_map(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap *map, uint8_t *w,
                       size_t total, int cols, int piece)
{
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)(total / K)},
                     strides[1] = {(cuuint64_t)K};
    const cuuint32_t box[2] = {(cuuint32_t)std::min(piece, 256), (cuuint32_t)cols}, one[2] = {1, 1};
    const CUresult r =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, w, dims, strides, box, one,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fprintf(stderr,
                "bench_read_paths: a tensor map of %d x %u byte boxes refused (CUresult %d)\n",
                cols, (unsigned)box[0], (int)r);
    return r == CUDA_SUCCESS;
}

static float time_ms(int reps, const std::function<void()> &f);

int main(int argc, char **argv)
{
    int reps = 10, mib = 1024;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atoi(argv[++i]);
    if (reps < 1 || mib < 8 || mib > 4096 || mib % 8) {
        fprintf(stderr, "usage: bench_read_paths [--reps N] [--mib 8..4096, a multiple of 8]\n");
        return 2;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    /* each repetition reads the next window of `bytes` of a 1 GiB buffer: never from L2 */
    const size_t bytes = (size_t)mib << 20, total = std::max(bytes, (size_t)1 << 30);
    const int windows = (int)(total / bytes);
    const long long N = (long long)(bytes / K);
    uint8_t *w0, *w2;
    unsigned long long *sink;
    CHECK(cudaMalloc(&w0, total));
    CHECK(cudaMalloc(&w2, total));
    CHECK(cudaMalloc(&sink, 8));
    CHECK(cudaMemset(w0, 0x5a, total));
    int rep_i = 0;
    auto window = [&]() { return rep_i++ % windows; };
    const int blocks = 2 * prop.multiProcessorCount;
    printf("%s, %d SMs; %d MiB read once a repetition (launches back to back), median of %d\n",
           prop.name, prop.multiProcessorCount, mib, reps);
    auto gbs = [&](float ms) { return bytes / (ms * 1e-3) / 1e9; };
    const float copy_ms =
        time_ms(reps, [&] { CHECK(cudaMemcpyAsync(w2, w0, total, cudaMemcpyDeviceToDevice)); });
    const double copy_gbs = 2.0 * total / (copy_ms * 1e-3) / 1e9; /* (read + write, 1 GiB) */
    printf("%-34s %8.1f GB/s (read + write)\n", "device-to-device copy", copy_gbs);
    auto row = [&](const char *what, float ms) {
        printf("%-34s %8.1f GB/s  %5.1f%% of the copy\n", what, gbs(ms),
               100.0 * gbs(ms) / copy_gbs);
    };
    for (int cols : {16, 32}) {
        char name[64];
        snprintf(name, sizeof name, "ldg, %d columns, depth 1", cols);
        row(name, time_ms(reps, [&] {
                ldg_kernel<1><<<blocks, 256>>>(w0 + window() * bytes, cols, N / cols, sink);
            }));
        snprintf(name, sizeof name, "ldg, %d columns, depth 2", cols);
        row(name, time_ms(reps, [&] {
                ldg_kernel<2><<<blocks, 256>>>(w0 + window() * bytes, cols, N / cols, sink);
            }));
        snprintf(name, sizeof name, "ldg, %d columns, depth 4", cols);
        row(name, time_ms(reps, [&] {
                ldg_kernel<4><<<blocks, 256>>>(w0 + window() * bytes, cols, N / cols, sink);
            }));
    }
    PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                           cudaEnableDefault, &q));
    struct cfg {
        int cols, piece, nst;
    };
    for (cfg c : std::vector<cfg>{{16, 512, 4},
                                  {16, 512, 8},
                                  {32, 256, 4},
                                  {32, 256, 8},
                                  {32, 512, 4},
                                  {64, 256, 4},
                                  {64, 256, 6}}) {
        const int sb = c.cols * c.piece;
        const size_t smem = (size_t)c.nst * sb;
        const long long items = N / c.cols * (K / c.piece);
        CUtensorMap map;
        if (!tensor_map(encode, &map, w0, total, c.cols, c.piece)) return 1;
        auto launch = [&](int mode) {
            const ring_fn kernel = ring_of(mode);
            CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
            return time_ms(reps, [&] {
                const int win = window();
                kernel<<<blocks, THREADS, smem>>>(w0 + win * bytes, map, (int)(win * N), c.cols,
                                                  c.piece, items, c.nst, sink);
            });
        };
        char name[64];
        snprintf(name, sizeof name, "ring-1d %dx%d B, %d stages", c.cols, c.piece, c.nst);
        row(name, launch(MODE_1D));
        if (c.piece <= 256) {
            snprintf(name, sizeof name, "ring-2d %dx%d B, %d stages", c.cols, c.piece, c.nst);
            row(name, launch(MODE_2D));
        }
        snprintf(name, sizeof name, "ring-cp %dx%d B, %d stages", c.cols, c.piece, c.nst);
        row(name, launch(MODE_CP));
        snprintf(name, sizeof name, "ring-seq %d B, %d stages", sb, c.nst);
        row(name, launch(MODE_SEQ));
    }
    /* a chain of 8 products, each its own window, launched back to back with and without
     * programmatic dependent launch: each kernel's first stages (ring) or loads (ldg) go out
     * before it waits for the one before; smem kept to 48 KB a block so that the next kernel's
     * blocks fit beside */
    printf("chains of 8 launches, per launch:\n");
    const int chain = 8;
    for (int pdl = 0; pdl < 2; pdl++) {
        auto ex = [&](auto kernel, int threads, size_t smem, auto... args) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(threads);
            cfg.dynamicSmemBytes = smem;
            cfg.attrs = attr;
            cfg.numAttrs = pdl;
            CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
        };
        char name[80];
        snprintf(name, sizeof name, "ldg depth 2, 16 columns, %s", pdl ? "PDL" : "plain");
        row(name, time_ms(reps, [&] {
                      for (int l = 0; l < chain; l++)
                          ex(ldg_kernel<2>, 256, 0, (const uint8_t *)(w0 + window() * bytes), 16,
                             N / 16, sink);
                  }) / chain);
        struct rc {
            int mode, cols, piece, nst;
        };
        for (rc c : std::vector<rc>{
                 {MODE_2D, 32, 256, 3}, {MODE_1D, 16, 512, 3}, {MODE_SEQ, 16, 512, 3}}) {
            const int sb = c.cols * c.piece;
            const size_t smem = (size_t)c.nst * sb;
            const long long items = N / c.cols * (K / c.piece);
            CUtensorMap map;
            if (!tensor_map(encode, &map, w0, total, c.cols, c.piece)) return 1;
            const ring_fn k = ring_of(c.mode);
            CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            snprintf(name, sizeof name, "ring-%s %dx%d B, %d stages, %s",
                     c.mode == MODE_2D   ? "2d"
                     : c.mode == MODE_1D ? "1d"
                                         : "seq",
                     c.cols, c.piece, c.nst, pdl ? "PDL" : "plain");
            row(name, time_ms(reps, [&] {
                          for (int l = 0; l < chain; l++) {
                              const int win = window();
                              ex(k, THREADS, smem, (const uint8_t *)(w0 + win * bytes), map,
                                 (int)(win * N), c.cols, c.piece, items, c.nst, sink);
                          }
                      }) / chain);
        }
    }
    CHECK(cudaDeviceSynchronize());
    return 0;
}

static float time_ms(int reps, const std::function<void()> &f)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    f();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CHECK(cudaEventRecord(a));
        f();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CHECK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

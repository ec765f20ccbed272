/* Helpers shared by the CUDA operators: loads and stores of either dtype, block reductions,
 * and the launcher's checks. Internal to kernels/cuda. */
#ifndef BT_KERNELS_CUDA_COMMON_CUH
#define BT_KERNELS_CUDA_COMMON_CUH

#include "kernels/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

/* A shape or dtype the launcher refuses: nothing is launched. */
#define BT_CUDA_REQUIRE(cond)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s: bad argument: %s\n", __FILE__, __LINE__, __func__, #cond); \
            return BT_ERR_INVALID_ARG;                                                             \
        }                                                                                          \
    } while (0)

/* After a launch: a failure is logged once, the sticky error cleared, BT_ERR_DEVICE. */
static inline bt_status_t bt__cuda_launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return BT_OK;
    fprintf(stderr, "cuda: %s: %s\n", what, cudaGetErrorString(e));
    return BT_ERR_DEVICE;
}

/* gemm_lowp.cu: y[M,N] = x[M,K] . w[N,K]^T on bf16 weights by the few-row tensor-core kernel,
 * for the products bt__gemm_bf16_rows_fits accepts (gemm.cu's path for a decode step's rows) */
bool bt__gemm_bf16_rows_fits(const void *x, const void *w, int M, int N, int K);
bt_status_t bt__gemm_bf16_rows(void *y, bt_cuda_dtype_t yd, const uint16_t *x,
                               const uint16_t *w, int M, int N, int K, cudaStream_t stream);

/* attention.cu: the key splits both attention kernels launch: `splits` (their policy's count)
 * lowered until the partials fit work_floats, then *chunk = keys a split in whole staging
 * rounds of `unit`, and as many splits as hold keys. fixed: the count may not be lowered (a
 * batch's tokens split as each would alone): -1 when the partials do not fit. */
int bt__attention_fit_splits(int splits, int T, int H, int dim, int max_keys, int unit,
                             size_t work_floats, bool fixed, int *chunk);

/* attention.cu: folds the split-key partials work[((t * H + h) * splits + z) * (dim + 2)]
 * = (max, sum, unnormalized output) of both attention kernels with the sink, normalizes,
 * applies the inverse RoPE and stores out [T, H, dim]. */
bt_status_t bt__attention_combine(void *out, bt_cuda_dtype_t dtype, const float *work,
                                  const float *sink, const int64_t *pos, const float *inv_freq,
                                  int half, int T, int H, int dim, int splits, cudaStream_t stream);

enum { BT__MAX_DEVICES = 64 };

/* Lets kernel fn take `bytes` of dynamic shared memory (past the 48 KB default), asked once per
 * device and kept in state[BT__MAX_DEVICES] (one array per kernel, zeroed: 0 not asked, 1
 * allowed, -1 refused, its error cleared): no attribute call per launch, where they raced
 * between models of one process and cost every step. Any thread may write the same value: a
 * benign race. max_carveout: also prefer the SM's whole carveout as shared memory. */
static inline bool bt__smem_allowed_carveout(const void *fn, size_t bytes, signed char *state,
                                             bool max_carveout)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= BT__MAX_DEVICES) {
        cudaGetLastError();
        return false;
    }
    if (!state[dev]) {
        bool ok = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes) == cudaSuccess;
        if (!ok) cudaGetLastError(); /* not sticky */
        /* a hint (the SM's whole carveout as shared memory, for kernels that need it to keep
         * several blocks an SM): refused, the kernel still runs */
        if (ok && max_carveout &&
            cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared) != cudaSuccess)
            cudaGetLastError();
        state[dev] = ok ? 1 : -1;
    }
    return state[dev] > 0;
}

static inline bool bt__smem_allowed(const void *fn, size_t bytes, signed char *state)
{
    return bt__smem_allowed_carveout(fn, bytes, state, false);
}

static inline int bt__dtype_ok(bt_cuda_dtype_t d)
{
    return d == BT_CUDA_F32 || d == BT_CUDA_BF16;
}

__device__ __forceinline__ float bt_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float bt_ld(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void bt_st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void bt_st(__nv_bfloat16 *p, size_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

/* Runtime dtype: for kernels that take either without a template. */
__device__ __forceinline__ float bt_ld_dt(const void *p, int bf16, size_t i)
{
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
__device__ __forceinline__ void bt_st_dt(void *p, int bf16, size_t i, float v)
{
    if (bf16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* The experts' activation (bt_cuda_swiglu): silu(min(g, limit)) * clamp(u, -limit, limit),
 * no clamping for limit <= 0. One definition for every kernel that computes it, so a fused
 * product's rows are the bits of the separate launch's. */
__device__ __forceinline__ float bt_swiglu(float g, float u, float limit)
{
    if (limit > 0.0f) {
        u = fminf(fmaxf(u, -limit), limit);
        g = fminf(g, limit);
    }
    return g / (1.0f + expf(-g)) * u;
}

/* Value d of a token's MoE output (bt_cuda_moe_combine): its cnt routed rows of y (D wide,
 * listed in rl) summed in the listed order, then its shared row's value (shared_t NULL: none).
 * Four rows' loads in flight, added in order. One definition for the combine and the expand
 * that sums it (hc_expand_moe_kernel), so the two give the same bits. */
__device__ __forceinline__ float bt_moe_sum(const float *y, const int32_t *rl, int cnt,
                                            const float *shared_t, int D, int d)
{
    float acc = 0.0f;
    for (int j0 = 0; j0 < cnt; j0 += 4) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (j0 + q < cnt) v[q] = y[(size_t)rl[j0 + q] * D + d];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (j0 + q < cnt) acc += v[q];
    }
    return shared_t ? acc + shared_t[d] : acc;
}

__device__ __forceinline__ float bt_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float bt_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* v's inclusive sum over the warp's lanes up to this one (every lane of the warp calls it). The
 * same additions in the same order wherever it is called, so the same bits for floating types. */
template <typename T> __device__ __forceinline__ T bt_warp_incl_sum(T v)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * `red` is 32 floats of shared memory; the call has barriers, so every thread must make it. */
__device__ __forceinline__ float bt_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = bt_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return bt_warp_sum(v);
}

/* 2^(b - 127) built from its bits (ldexpf took ~20 instructions, once per chunk of the
 * few-row GEMMs): the exponent field is b itself; b = 0 is the subnormal 2^-127, 0xff NaN */
__device__ __forceinline__ float bt_e8m0(uint8_t b)
{
    const unsigned u = b == 0 ? 0x00400000u : b == 0xff ? 0x7fc00000u : (unsigned)b << 23;
    return __uint_as_float(u);
}

/* e4m3fn byte -> float, exact (no NaN clamp needed for weights, but kept like the CPU). */
__device__ __forceinline__ float bt_e4m3(uint8_t b)
{
    unsigned exp = (b >> 3) & 0xfu, man = b & 7u;
    float v;
    if (exp == 0xf && man == 7) return __int_as_float((b & 0x80) ? 0xffc00000 : 0x7fc00000);
    if (exp == 0)
        v = ldexpf((float)man, -9);
    else
        v = __int_as_float((int)((exp + 120u) << 23 | man << 20));
    return (b & 0x80) ? -v : v;
}

/* e2m1 code (bit 3 = sign) -> {0, .5, 1, 1.5, 2, 3, 4, 6} with sign, without a table. */
__device__ __forceinline__ float bt_e2m1(unsigned code)
{
    unsigned e = (code >> 1) & 3u, m = code & 1u;
    float a = e ? __int_as_float((int)(((e + 126u) << 23) | (m << 22))) : 0.5f * (float)m;
    return (code & 8u) ? -a : a;
}

/* ---- tensor-core and asynchronous-copy building blocks (sm_80 on) ---------------------------- */

/* d += a . b: one m16n8k16 bf16 MMA with f32 accumulators (PTX fragment layouts) */
__device__ __forceinline__ void mma_bf16_16816(float *d, const unsigned *a, unsigned b0,
                                               unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* bytes (4, 8 or 16) from global to shared memory, asynchronously; zeros where !valid; the
 * destination as an address in the shared window (s) or a pointer (smem) */
template <int BYTES>
__device__ __forceinline__ void cp_async_sh(unsigned s, const void *gmem, bool valid)
{
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                     "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem),
                     "n"(BYTES), "r"(valid ? BYTES : 0));
}
template <int BYTES>
__device__ __forceinline__ void cp_async(void *smem, const void *gmem, bool valid)
{
    cp_async_sh<BYTES>((unsigned)__cvta_generic_to_shared(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* waits for all of this thread's cp.async groups */
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

static inline int bt__cdiv(long long a, long long b) { return (int)((a + b - 1) / b); }

/* ---- programmatic dependent launch (Hopper on) ----------------------------------------------
 * A kernel launched by bt__launch may be started while the kernel before it on its stream is
 * still running, so its blocks are resident and past their prologue when that one ends (a
 * decode step is ~30 short kernels; the gaps between them and their ramps were a tenth of it).
 * The contract every kernel keeps: bt_grid_wait() before it reads what an earlier kernel wrote
 * or writes anything, on every path (an early return too: a grid that ends without waiting
 * would let the next one past its own wait before the one before it ends). Before the wait a
 * kernel may only read what no kernel writes (weights) and compute. bt_grid_wait then
 * bt_grid_release: the next kernel may be launched once each block of this one got that far.
 * Without the launch attribute both are no-ops. BT_CUDA_PDL=0 launches every kernel plainly. */
__device__ __forceinline__ void bt_grid_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void bt_grid_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* the usual first line of a kernel: nothing of its own to do before the wait. Tried and
 * measured slower: the release before the wait, so that a chain of short kernels has its blocks
 * resident ahead (decode b1 0.1827 -> 0.1950 ms, b16 0.8064 -> 0.8175, three rounds each, an
 * H100; bench/RESULTS.md session 38): blocks waiting early hold SM room the running kernels and
 * the other stream's want. */
__device__ __forceinline__ void bt_grid_begin(void)
{
    bt_grid_wait();
    bt_grid_release();
}

/* f(std::integral_constant<int, V>()) for the V of VS equal to v, else for DFLT: a value chosen
 * at run time made a template argument (kernels that keep it in registers or unroll by it) */
template <int DFLT, int... VS, typename F> static inline void bt_with_int(int v, F &&f)
{
    bool hit = false;
    ((!hit && v == VS ? (hit = true, f(std::integral_constant<int, VS>()), 0) : 0), ...);
    if (!hit) f(std::integral_constant<int, DFLT>());
}

/* An on/off switch from the environment (BT_CUDA_PDL, BT_CUDA_WGRS, ...: off for comparisons):
 * on unless the variable is "0", read once into *once (-1 until read; every thread reads the
 * same value: a benign race). */
static inline bool bt__env_switch(const char *name, int *once)
{
    if (*once < 0) {
        const char *v = getenv(name);
        *once = !(v && strcmp(v, "0") == 0);
    }
    return *once;
}

/* A choice from the environment (BT_CUDA_ROWS_KS, ...: experiments and
 * comparisons): the variable's value when it is one of the n `allowed`, else dflt, with a line
 * on stderr when it was set to something else; read once into *once (-1 until read). */
static inline int bt__env_choice(const char *name, const int *allowed, int n, int dflt, int *once)
{
    if (*once >= 0) return *once;
    const char *v = getenv(name);
    int pick = dflt;
    if (v) {
        char *end;
        const long x = strtol(v, &end, 10);
        int i = 0;
        while (i < n && (end == v || *end || allowed[i] != x))
            i++;
        if (i < n) {
            pick = allowed[i];
        } else {
            fprintf(stderr, "cuda: %s=%s ignored: one of", name, v);
            for (i = 0; i < n; i++)
                fprintf(stderr, " %d", allowed[i]);
            fprintf(stderr, "\n");
        }
    }
    *once = pick;
    return pick;
}

/* whether launches carry the attribute: BT_CUDA_PDL, read once per file */
static inline bool bt__pdl_enabled(void)
{
    static int once = -1;
    return bt__env_switch("BT_CUDA_PDL", &once);
}

/* Fills the attribute of a launch configuration for bt__launch and the launchers that build
 * their own cudaLaunchConfig_t (clusters): returns the count of attributes written (0 or 1). */
static inline unsigned bt__pdl_attr(cudaLaunchAttribute *a)
{
    if (!bt__pdl_enabled()) return 0;
    a->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a->val.programmaticStreamSerializationAllowed = 1;
    return 1;
}

/* kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch (or that
 * very launch with BT_CUDA_PDL=0); errors are left for bt__cuda_launched as <<<>>> leaves them */
template <typename... P, typename... A>
static inline void bt__launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, A... args)
{
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = {};
    cfg.attrs = attr;
    cfg.numAttrs = bt__pdl_attr(attr);
    if (!cfg.numAttrs) {
        kernel<<<grid, block, smem, stream>>>((P)args...);
        return;
    }
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    (void)cudaLaunchKernelEx(&cfg, kernel, (P)args...);
}

#endif

/* Hopper's warpgroup MMAs (wgmma, sm_90a) as the kernels use them: A, a warpgroup's 64 rows,
 * from registers (wgmma_rs) or from shared memory (wgmma_ss); B from shared memory; operands in
 * shared memory K-major in the 128-byte swizzle; f32 accumulators.
 * Each N a shape of its own (16..112: gemm_fp4_wgrs' tiles), since an instruction's operand
 * count is fixed. Only in device code built for sm_90a (BT_WGMMA); the launcher checks at run
 * time that the binary has such code (gemm_lowp.cu's wgrs_built). */
#pragma once

#include "kernels/cuda/common.cuh"

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BT_WGMMA 1
#endif

/* Whether the current device is a Hopper and the calling file's device code was built for
 * sm_90a: `built` is that file's __device__ int, 1 under BT_WGMMA, else 0 (a binary built for
 * several architectures may run an image without the warpgroup MMAs). Asked once a device;
 * state is the caller's cache of BT__MAX_DEVICES. */
template <typename S> static inline bool bt__wgmma_ready(const S &built, signed char *state)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= BT__MAX_DEVICES) {
        cudaGetLastError();
        return false;
    }
    if (!state[dev]) {
        int major = 0, flag = 0;
        bool ok =
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            major == 9 && cudaMemcpyFromSymbol(&flag, built, sizeof flag) == cudaSuccess &&
            flag == 1;
        if (!ok) cudaGetLastError();
        state[dev] = ok ? 1 : -1; /* (any thread writes the same value) */
    }
    return state[dev] > 0;
}

/* byte offset of the 16 bytes holding k 8u..8u+7 of row r in a 64-k operand tile: 128-byte
 * rows whose 16-byte units are permuted by the row's index within its 8 (the 128-byte swizzle) */
__device__ __forceinline__ int wg_sw(int r, int u)
{
    return r * 128 + ((u ^ (r & 7)) << 4);
}

/* the descriptor of an operand at smem (a 1024-byte aligned tile, plus 32 bytes a 16-k step):
 * K-major, 128-byte swizzle, 8-row groups 1024 bytes apart */
__device__ __forceinline__ uint64_t wg_desc(const void *smem)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3ffff) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

/* the descriptor of an MN-major operand at smem (the 128-byte swizzle): rows of 64 columns
 * (128 bytes) along K, 8-row groups 1024 bytes apart, the next 64 columns lbo bytes on */
__device__ __forceinline__ uint64_t wg_desc_mn(const void *smem, uint32_t lbo)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3ffff) >> 4) | (uint64_t)((lbo & 0x3ffff) >> 4) << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* waits until at most N committed groups of this warpgroup are pending */
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* d[64 x N] += A[64 x 16] . B[N x 16]^T: a, this thread's A fragment (the m16n8k16 layout of
 * its warp's 16 rows: (g, 2c..), (g + 8, 2c..), (g, 2c + 8..), (g + 8, 2c + 8..) as bf16
 * pairs); b, B's descriptor; d[4j + t] is row 16 warp + g + 8 (t >> 1), column 8j + 2c + (t & 1) */
template <int N> __device__ __forceinline__ void wgmma_rs(float *d, const unsigned *a, uint64_t b);

/* d[64 x N] (+)= A[64 x 16] . B[N x 16]^T, both from shared memory (descriptors a and b);
 * acc 0: d is overwritten, not added to. d's layout as wgmma_rs's. */
template <int N>
__device__ __forceinline__ void wgmma_ss(float *d, uint64_t a, uint64_t b, int acc);

#ifdef BT_WGMMA
/* The accumulators' operands, which every shape spells out (an instruction's operand count is
 * fixed): BT__WG_ACCn the placeholders "%0, .., %(n - 1)" of its n f32 registers, BT__WG_OUTn
 * their constraints on d[0..n - 1]; the instruction's other operands follow from %n. */
#define BT__WG_P0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define BT__WG_P1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define BT__WG_P2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define BT__WG_P3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define BT__WG_P4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define BT__WG_P5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define BT__WG_P6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define BT__WG_P7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define BT__WG_P8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define BT__WG_P9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define BT__WG_P10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define BT__WG_P11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define BT__WG_P12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define BT__WG_P13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define BT__WG_P14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define BT__WG_P15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define BT__WG_D8(i)                                                                               \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define BT__WG_ACC8 BT__WG_P0
#define BT__WG_OUT8 BT__WG_D8(0)
#define BT__WG_ACC16 BT__WG_ACC8 ", " BT__WG_P1
#define BT__WG_OUT16 BT__WG_OUT8, BT__WG_D8(8)
#define BT__WG_ACC24 BT__WG_ACC16 ", " BT__WG_P2
#define BT__WG_OUT24 BT__WG_OUT16, BT__WG_D8(16)
#define BT__WG_ACC32 BT__WG_ACC24 ", " BT__WG_P3
#define BT__WG_OUT32 BT__WG_OUT24, BT__WG_D8(24)
#define BT__WG_ACC40 BT__WG_ACC32 ", " BT__WG_P4
#define BT__WG_OUT40 BT__WG_OUT32, BT__WG_D8(32)
#define BT__WG_ACC48 BT__WG_ACC40 ", " BT__WG_P5
#define BT__WG_OUT48 BT__WG_OUT40, BT__WG_D8(40)
#define BT__WG_ACC56 BT__WG_ACC48 ", " BT__WG_P6
#define BT__WG_OUT56 BT__WG_OUT48, BT__WG_D8(48)
#define BT__WG_ACC64 BT__WG_ACC56 ", " BT__WG_P7
#define BT__WG_OUT64 BT__WG_OUT56, BT__WG_D8(56)
#define BT__WG_ACC72 BT__WG_ACC64 ", " BT__WG_P8
#define BT__WG_OUT72 BT__WG_OUT64, BT__WG_D8(64)
#define BT__WG_ACC80 BT__WG_ACC72 ", " BT__WG_P9
#define BT__WG_OUT80 BT__WG_OUT72, BT__WG_D8(72)
#define BT__WG_ACC88 BT__WG_ACC80 ", " BT__WG_P10
#define BT__WG_OUT88 BT__WG_OUT80, BT__WG_D8(80)
#define BT__WG_ACC96 BT__WG_ACC88 ", " BT__WG_P11
#define BT__WG_OUT96 BT__WG_OUT88, BT__WG_D8(88)
#define BT__WG_ACC104 BT__WG_ACC96 ", " BT__WG_P12
#define BT__WG_OUT104 BT__WG_OUT96, BT__WG_D8(96)
#define BT__WG_ACC112 BT__WG_ACC104 ", " BT__WG_P13
#define BT__WG_OUT112 BT__WG_OUT104, BT__WG_D8(104)
#define BT__WG_ACC120 BT__WG_ACC112 ", " BT__WG_P14
#define BT__WG_OUT120 BT__WG_OUT112, BT__WG_D8(112)
#define BT__WG_ACC128 BT__WG_ACC120 ", " BT__WG_P15
#define BT__WG_OUT128 BT__WG_OUT120, BT__WG_D8(120)

/* wgmma_rs<N>: acc f32 accumulators; A's 4 registers from %acc, B's descriptor and the
 * accumulate predicate's source after them (always 1: add to d); TB, B's transpose flag */
#define BT__WG_RS(N, ACC, A, DESC, PRED, TB)                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" BT__WG_ACC##ACC      \
                 "}, {" A "}, " DESC ", p, 1, 1, " TB ";\n}\n"                                     \
                 : BT__WG_OUT##ACC                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

template <> __device__ __forceinline__ void wgmma_rs<16>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(16, 8, "%8, %9, %10, %11", "%12", "%13", "0");
}

template <> __device__ __forceinline__ void wgmma_rs<32>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(32, 16, "%16, %17, %18, %19", "%20", "%21", "0");
}

template <> __device__ __forceinline__ void wgmma_rs<48>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(48, 24, "%24, %25, %26, %27", "%28", "%29", "0");
}

template <> __device__ __forceinline__ void wgmma_rs<64>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(64, 32, "%32, %33, %34, %35", "%36", "%37", "0");
}

template <> __device__ __forceinline__ void wgmma_rs<80>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(80, 40, "%40, %41, %42, %43", "%44", "%45", "0");
}

template <> __device__ __forceinline__ void wgmma_rs<96>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(96, 48, "%48, %49, %50, %51", "%52", "%53", "0");
}

template <> __device__ __forceinline__ void wgmma_rs<112>(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(112, 56, "%56, %57, %58, %59", "%60", "%61", "0");
}

/* wgmma_ss<N>: both operands' descriptors, then acc (0: overwrite d) */
#define BT__WG_SS(N, ACC, DESCS, PRED)                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" BT__WG_ACC##ACC      \
                 "}, " DESCS ", p, 1, 1, 0, 0;\n}\n"                                               \
                 : BT__WG_OUT##ACC                                                                 \
                 : "l"(a), "l"(b), "r"(acc))

template <> __device__ __forceinline__ void wgmma_ss<32>(float *d, uint64_t a, uint64_t b, int acc)
{
    BT__WG_SS(32, 16, "%16, %17", "%18");
}

template <> __device__ __forceinline__ void wgmma_ss<128>(float *d, uint64_t a, uint64_t b, int acc)
{
    BT__WG_SS(128, 64, "%64, %65", "%66");
}

/* d[64 x 256] += A[64 x 16] . B[16 x 256]: A from registers as wgmma_rs's, B MN-major (b from
 * wg_desc_mn: 16 k rows of 64-column blocks) */
__device__ __forceinline__ void wgmma_rs_mn256(float *d, const unsigned *a, uint64_t b)
{
    BT__WG_RS(256, 128, "%128, %129, %130, %131", "%132", "%133", "1");
}

#endif

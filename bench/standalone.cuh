/* What the benches built alone with nvcc (bench_read_paths.cu, bench_chain.cu) share: the
 * runtime call check and programmatic dependent launch's two instructions. */
#ifndef BT_BENCH_STANDALONE_CUH
#define BT_BENCH_STANDALONE_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* the next kernel may start once every block got here; wait for the one before (both no-ops
 * in a plain launch) */
__device__ __forceinline__ void pdl_release()
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait()
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

#endif

/* The model's QAT fake-quantizers on the GPU: a warp per block of values. */
#include "kernels/cuda/quant.cuh"

enum { FQ_WARPS = 8 }; /* warps (blocks of values) a CUDA block */

/* A warp per block of values (a decode step has a few dozen blocks: one thread each left the
 * GPU idle for ~10 us). */
__global__ void fake_quant_kernel(float *x, size_t blocks, int block, int kind)
{
    bt_grid_begin();
    const size_t b = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return; /* the whole warp */
    bt_dev_fake_quant_warp(x + b * block, block, kind, threadIdx.x & 31);
}

extern "C" bt_status_t bt_cuda_fake_quant(float *x, int rows, int n, int block,
                                          bt_cuda_fake_quant_t kind, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && rows > 0 && n > 0 && block > 0);
    BT_CUDA_REQUIRE(kind == BT_CUDA_FQ_FP8_UE8M0 || kind == BT_CUDA_FQ_FP4_UE8M0 ||
                    kind == BT_CUDA_FQ_FP4_E4M3);
    if (n % block) return BT_OK; /* the reference leaves such vectors unquantized */
    size_t blocks = (size_t)rows * (n / block);
    bt__launch(fake_quant_kernel, bt__cdiv((long long)blocks, FQ_WARPS), FQ_WARPS * 32, 0, stream,
               x, blocks, block, (int)kind);
    return bt__cuda_launched("fake_quant");
}

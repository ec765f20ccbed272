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

/* The activation quantization's rounding (bt_cuda_act_quant): a warp per block of 32 values,
 * a lane per value, as bt_dev_fake_quant_warp with its FP8 kind. Each lane reads its value
 * before the warp's amax and writes it after, so y may be x itself. */
template <typename XT, typename YT>
__global__ void act_quant_kernel(YT *y, const XT *x, size_t blocks, int kb, int ldx)
{
    bt_grid_begin();
    const size_t b = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return; /* the whole warp */
    const int lane = threadIdx.x & 31;
    const size_t row = b / (size_t)kb, col = (b % (size_t)kb) * 32 + (size_t)lane;
    const float v = bt_ld(x, row * (size_t)ldx + col);
    float amax = bt_warp_max(fabsf(v));
    if (__any_sync(0xffffffffu, isnan(v))) amax = __int_as_float(0x7fc00000);
    const float scale = bt_dev_fake_quant_scale(amax, BT_CUDA_FQ_FP8_UE8M0);
    bt_st(y, row * (size_t)kb * 32 + col, bt_dev_fake_quant_value(v, scale, BT_CUDA_FQ_FP8_UE8M0));
}

extern "C" bt_status_t bt_cuda_act_quant(void *y, bt_cuda_dtype_t y_dtype, const void *x,
                                         bt_cuda_dtype_t x_dtype, int rows, int K, int ldx,
                                         cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && rows > 0 && K > 0 && K % 32 == 0 && ldx >= K);
    BT_CUDA_REQUIRE(bt__dtype_ok(y_dtype) && bt__dtype_ok(x_dtype));
    /* in place only row for row */
    BT_CUDA_REQUIRE(y != x || (y_dtype == x_dtype && ldx == K));
    const size_t blocks = (size_t)rows * (size_t)(K / 32);
    const int grid = (int)bt__cdiv((long long)blocks, FQ_WARPS), kb = K / 32;
    typedef __nv_bfloat16 bf;
    if (x_dtype == BT_CUDA_F32 && y_dtype == BT_CUDA_F32)
        bt__launch(act_quant_kernel<float, float>, grid, FQ_WARPS * 32, 0, stream, (float *)y,
                   (const float *)x, blocks, kb, ldx);
    else if (x_dtype == BT_CUDA_F32)
        bt__launch(act_quant_kernel<float, bf>, grid, FQ_WARPS * 32, 0, stream, (bf *)y,
                   (const float *)x, blocks, kb, ldx);
    else if (y_dtype == BT_CUDA_F32)
        bt__launch(act_quant_kernel<bf, float>, grid, FQ_WARPS * 32, 0, stream, (float *)y,
                   (const bf *)x, blocks, kb, ldx);
    else
        bt__launch(act_quant_kernel<bf, bf>, grid, FQ_WARPS * 32, 0, stream, (bf *)y, (const bf *)x,
                   blocks, kb, ldx);
    return bt__cuda_launched("act_quant");
}

/* RMSNorm per row: y = w * (x * rsqrt(mean(x^2) + eps)), w optional; y may alias x. */
#include "kernels/cuda/common.cuh"

template <typename XT, typename YT>
__global__ void rmsnorm_kernel(YT *y, const XT *x, const float *w, int n, float eps)
{
    bt_grid_begin();
    __shared__ float red[32];
    size_t row = blockIdx.x, base = row * (size_t)n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = bt_ld(x, base + i);
        ss += v * v;
    }
    ss = bt_block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = bt_ld(x, base + i) * r;
        bt_st(y, base + i, w ? w[i] * v : v);
    }
}

extern "C" bt_status_t bt_cuda_rmsnorm(void *y, bt_cuda_dtype_t y_dtype, const void *x,
                                       bt_cuda_dtype_t x_dtype, const float *w, int rows, int n,
                                       float eps, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && bt__dtype_ok(y_dtype) && bt__dtype_ok(x_dtype));
    BT_CUDA_REQUIRE(rows > 0 && n > 0);
    BT_CUDA_REQUIRE(y == x ? y_dtype == x_dtype : 1);
    int threads = n >= 1024 ? 512 : (n >= 256 ? 256 : 64);
    typedef __nv_bfloat16 bf;
    if (x_dtype == BT_CUDA_F32 && y_dtype == BT_CUDA_F32)
        bt__launch(rmsnorm_kernel<float, float>, rows, threads, 0, stream, (float *)y,
                   (const float *)x, w, n, eps);
    else if (x_dtype == BT_CUDA_F32)
        bt__launch(rmsnorm_kernel<float, bf>, rows, threads, 0, stream, (bf *)y, (const float *)x,
                   w, n, eps);
    else if (y_dtype == BT_CUDA_F32)
        bt__launch(rmsnorm_kernel<bf, float>, rows, threads, 0, stream, (float *)y, (const bf *)x,
                   w, n, eps);
    else
        bt__launch(rmsnorm_kernel<bf, bf>, rows, threads, 0, stream, (bf *)y, (const bf *)x, w, n,
                   eps);
    return bt__cuda_launched("rmsnorm");
}

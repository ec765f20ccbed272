/* RoPE: interleaved pairs on the last 2*half channels of each head, angle pos * inv_freq. */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void rope_kernel(T *x, int rows, int heads, int dim, const int64_t *pos,
                            const float *inv_freq, int half, int inverse)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)rows * heads * half;
    if (i >= total) return;
    int p = (int)(i % half);
    size_t rh = i / half;
    int row = (int)(rh / heads);
    float f = inv_freq[p] * (float)pos[row];
    float c = cosf(f), s = sinf(f);
    if (inverse) s = -s;
    size_t at = rh * dim + (dim - 2 * half) + 2 * p;
    float e = bt_ld(x, at), o = bt_ld(x, at + 1);
    bt_st(x, at, e * c - o * s);
    bt_st(x, at + 1, e * s + o * c);
}

extern "C" bt_status_t bt_cuda_rope(void *x, bt_cuda_dtype_t dtype, int rows, int heads, int dim,
                                    const int64_t *pos, const float *inv_freq, int half,
                                    int inverse, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && pos && inv_freq && bt__dtype_ok(dtype));
    BT_CUDA_REQUIRE(rows > 0 && heads > 0 && half > 0 && 2 * half <= dim);
    size_t total = (size_t)rows * heads * half;
    int blocks = bt__cdiv((long long)total, 256);
    if (dtype == BT_CUDA_F32)
        bt__launch(rope_kernel<float>, blocks, 256, 0, stream, (float *)x, rows, heads, dim, pos,
                   inv_freq, half, inverse);
    else
        bt__launch(rope_kernel<__nv_bfloat16>, blocks, 256, 0, stream, (__nv_bfloat16 *)x, rows,
                   heads, dim, pos, inv_freq, half, inverse);
    return bt__cuda_launched("rope");
}

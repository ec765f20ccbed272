/* Engram: gather of the hashed n-gram embedding rows (FP8 with UE8M0 scales per 32) and the
 * gated injection of the projected key/value into the residual streams. */
#include "kernels/cuda/common.cuh"

template <typename OT>
__global__ void engram_gather_kernel(OT *e, const int64_t *ids, int T, int cols,
                                     const uint8_t *table, const uint8_t *scale,
                                     int64_t table_rows, int dim)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * cols * dim) return;
    int d = (int)(i % dim);
    size_t tc = i / dim;
    int64_t id = ids[tc];
    float v = __int_as_float(0x7fc00000); /* an id out of range shows as NaN */
    if (id >= 0 && id < table_rows)
        v = bt_e4m3(table[(size_t)id * dim + d]) * bt_e8m0(scale[(size_t)id * (dim / 32) + d / 32]);
    bt_st(e, i, v);
}

extern "C" bt_status_t bt_cuda_engram_gather(void *e, bt_cuda_dtype_t e_dtype, const int64_t *ids,
                                             int T, int cols, const uint8_t *table,
                                             const uint8_t *table_scale, int64_t table_rows,
                                             int dim, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(e && ids && table && table_scale && bt__dtype_ok(e_dtype));
    BT_CUDA_REQUIRE(T > 0 && cols > 0 && dim > 0 && dim % 32 == 0 && table_rows > 0);
    int blocks = bt__cdiv((long long)T * cols * dim, 256);
    if (e_dtype == BT_CUDA_F32)
        bt__launch(engram_gather_kernel<float>, blocks, 256, 0, stream, (float *)e, ids, T, cols,
                   table, table_scale, table_rows, dim);
    else
        bt__launch(engram_gather_kernel<__nv_bfloat16>, blocks, 256, 0, stream, (__nv_bfloat16 *)e,
                   ids, T, cols, table, table_scale, table_rows, dim);
    return bt__cuda_launched("engram_gather");
}

/* block = (stream s, token t) */
__global__ void engram_inject_kernel(float *x, const float *kv, const float *qk, int hc, int D,
                                     float eps)
{
    bt_grid_begin();
    __shared__ float red[32];
    int s = blockIdx.x, t = blockIdx.y;
    float *h = x + ((size_t)t * hc + s) * D;
    const float *key = kv + (size_t)t * (hc + 1) * D + (size_t)s * D;
    const float *val = kv + (size_t)t * (hc + 1) * D + (size_t)hc * D;
    const float *q = qk + (size_t)s * D;
    float hh = 0.0f, kk = 0.0f, dot = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        hh += h[d] * h[d];
        kk += key[d] * key[d];
        dot += (h[d] * q[d]) * key[d];
    }
    hh = bt_block_sum(hh, red);
    kk = bt_block_sum(kk, red);
    dot = bt_block_sum(dot, red);
    float rstd = (1.0f / sqrtf(hh / (float)D + eps)) * (1.0f / sqrtf(kk / (float)D + eps));
    dot = dot * rstd * (1.0f / sqrtf((float)D));
    float g = 1.0f / (1.0f + expf(-copysignf(sqrtf(fmaxf(fabsf(dot), 1e-6f)), dot)));
    for (int d = threadIdx.x; d < D; d += blockDim.x) h[d] = h[d] + g * val[d];
}

extern "C" bt_status_t bt_cuda_engram_inject(float *x, const float *kv, const float *qk, int T,
                                             int hc, int D, float eps, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && kv && qk && T > 0 && hc > 0 && D > 0 && T <= 65535);
    bt__launch(engram_inject_kernel, dim3(hc, T), 256, 0, stream, x, kv, qk, hc, D, eps);
    return bt__cuda_launched("engram_inject");
}

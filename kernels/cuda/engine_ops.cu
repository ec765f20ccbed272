/* Glue steps of the device-resident model: embedding into the mHC streams, row gathers, the
 * MoE combine, compressor pooling and the indexer's candidate blocks. All f32, in the order
 * of operations of services/engine/model.c so that results track the CPU engine. */
#include "kernels/cuda/common.cuh"

__global__ void embed_streams_kernel(float *x, float *pre, const float *table, const int32_t *ids,
                                     int hc, int D)
{
    bt_grid_begin();
    int t = blockIdx.x, id = ids[t];
    const float *row = table + (size_t)(id < 0 ? 0 : id) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = id < 0 ? 0.0f : row[d]; /* a row another rank owns (TP): zeros */
        for (int s = 0; s < hc; s++) x[((size_t)t * hc + s) * D + d] = v;
    }
    if (threadIdx.x < hc) pre[(size_t)t * hc + threadIdx.x] = threadIdx.x == 0 ? 1.0f : 0.0f;
}

extern "C" bt_status_t bt_cuda_embed_streams(float *x, float *pre, const float *table,
                                             const int32_t *ids, int T, int hc, int D,
                                             cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && pre && table && ids && T > 0 && hc > 0 && hc <= 32 && D > 0);
    bt__launch(embed_streams_kernel, T, 256, 0, stream, x, pre, table, ids, hc, D);
    return bt__cuda_launched("embed_streams");
}

__global__ void gather_rows_kernel(float *dst, const float *src, const int64_t *idx, int width)
{
    bt_grid_begin();
    int r = blockIdx.x;
    const float *s = src + (size_t)idx[r] * width;
    float *d = dst + (size_t)r * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

extern "C" bt_status_t bt_cuda_gather_rows(float *dst, const float *src, const int64_t *idx, int n,
                                           int width, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(dst && src && idx && n > 0 && width > 0);
    bt__launch(gather_rows_kernel, n, 256, 0, stream, dst, src, idx, width);
    return bt__cuda_launched("gather_rows");
}

__global__ void scatter_rows_kernel(float *dst, const int64_t *off, const float *src, int width)
{
    bt_grid_begin();
    int r = blockIdx.x;
    const float *s = src + (size_t)r * width;
    float *d = dst + off[r];
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

extern "C" bt_status_t bt_cuda_scatter_rows(float *dst, const int64_t *off, const float *src, int n,
                                            int width, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(dst && src && off && n > 0 && width > 0);
    bt__launch(scatter_rows_kernel, n, 256, 0, stream, dst, off, src, width);
    return bt__cuda_launched("scatter_rows");
}

/* out[t * ldo + d] = sum_s w[t, s] x[t, s, d], or the streams' mean where w is NULL, summed
 * in stream order as model.c's hc_collapse */
__global__ void hc_collapse_kernel(float *out, int64_t ldo, const float *x, const float *w, int hc,
                                   int D)
{
    bt_grid_begin();
    int t = blockIdx.x;
    const float *xt = x + (size_t)t * hc * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < hc; s++) acc += w ? w[(size_t)t * hc + s] * xt[(size_t)s * D + d] : xt[(size_t)s * D + d];
        out[(size_t)t * ldo + d] = w ? acc : acc / (float)hc;
    }
}

extern "C" bt_status_t bt_cuda_hc_collapse(float *out, int64_t ldo, const float *x, const float *w,
                                           int T, int hc, int D, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && x && T > 0 && hc > 0 && D > 0 && ldo >= D);
    bt__launch(hc_collapse_kernel, T, 256, 0, stream, out, ldo, x, w, hc, D);
    return bt__cuda_launched("hc_collapse");
}

__global__ void add_rows_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, int width)
{
    bt_grid_begin();
    float *yr = y + (size_t)blockIdx.y * ldy;
    const float *xr = x + (size_t)blockIdx.y * ldx;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < width; j += gridDim.x * blockDim.x)
        yr[j] += xr[j];
}

extern "C" bt_status_t bt_cuda_add_rows(float *y, int64_t ldy, const float *x, int64_t ldx,
                                        int rows, int width, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(y && x && rows > 0 && rows <= 65535 && width > 0 && ldy >= width &&
                    ldx >= width);
    const int blocks = bt__cdiv(width, 256) < 64 ? bt__cdiv(width, 256) : 64;
    bt__launch(add_rows_kernel, dim3(blocks, rows), 256, 0, stream, y, ldy, x, ldx, width);
    return bt__cuda_launched("add_rows");
}

/* a block a copy, in the widest units its alignment allows */
__global__ void copy_ranges_kernel(const bt_cuda_copy_t *copies)
{
    bt_grid_begin();
    const bt_cuda_copy_t r = copies[blockIdx.x];
    const unsigned char *s = (const unsigned char *)r.src;
    unsigned char *d = (unsigned char *)r.dst;
    const unsigned long long align = (unsigned long long)(uintptr_t)s | (uintptr_t)d | r.len;
    if (align % 16 == 0) {
        for (unsigned long long i = threadIdx.x; i < r.len / 16; i += blockDim.x)
            ((uint4 *)d)[i] = ((const uint4 *)s)[i];
    } else if (align % 4 == 0) {
        for (unsigned long long i = threadIdx.x; i < r.len / 4; i += blockDim.x)
            ((unsigned *)d)[i] = ((const unsigned *)s)[i];
    } else {
        for (unsigned long long i = threadIdx.x; i < r.len; i += blockDim.x) d[i] = s[i];
    }
}

extern "C" bt_status_t bt_cuda_copy_ranges(const bt_cuda_copy_t *copies, int n, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(copies && n > 0);
    bt__launch(copy_ranges_kernel, n, 256, 0, stream, copies);
    return bt__cuda_launched("copy_ranges");
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int rows, int cols, int ld)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    size_t r = i / cols, c = i % cols;
    dst[i] = __float2bfloat16_rn(src[r * ld + c]);
}

extern "C" bt_status_t bt_cuda_to_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld,
                                       cudaStream_t stream)
{
    BT_CUDA_REQUIRE(dst && src && rows > 0 && cols > 0 && ld >= cols);
    size_t n = (size_t)rows * cols;
    bt__launch(to_bf16_kernel, bt__cdiv((long long)n, 256), 256, 0, stream, (__nv_bfloat16 *)dst,
               src, rows, cols, ld);
    return bt__cuda_launched("to_bf16");
}

__global__ void scale_kernel(float *x, size_t n, float s)
{
    bt_grid_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" bt_status_t bt_cuda_scale(float *x, size_t n, float s, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(x && n > 0);
    bt__launch(scale_kernel, bt__cdiv((long long)n, 256), 256, 0, stream, x, n, s);
    return bt__cuda_launched("scale");
}

__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *rows,
                                   const int32_t *n, int stride, const float *shared, int D)
{
    bt_grid_begin();
    int t = blockIdx.x, cnt = n[t];
    const int32_t *rl = rows + (size_t)t * stride;
    const float *sh = shared ? shared + (size_t)t * D : NULL;
    for (int d = threadIdx.x; d < D; d += blockDim.x) /* routed experts first, as the CPU */
        out[(size_t)t * D + d] = bt_moe_sum(y, rl, cnt, sh, D, d);
}

/* The same, 4 columns a thread (D % 4 == 0, 16-byte aligned rows): a quarter of the loads,
 * four sums in flight; each sum in the same order. Grid (tokens, column blocks of 1024), so a
 * decode token spreads over blocks; a thread's rows are loaded 4 at a time before they are
 * added (a load, then its add, one row after another, waited out every load's latency: 0.27
 * ms for a 4096-token prefill's 6 rows a token under Nsight Compute) */
__global__ void moe_combine4_kernel(float *out, const float *y, const int32_t *rows,
                                    const int32_t *n, int stride, const float *shared, int D)
{
    bt_grid_begin();
    const int t = blockIdx.x, cnt = n[t], d = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
    if (d >= D) return;
    const int32_t *rl = rows + (size_t)t * stride;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j0 = 0; j0 < cnt; j0 += 4) {
        float4 v[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (j0 + i < cnt) v[i] = *(const float4 *)(y + (size_t)rl[j0 + i] * D + d);
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (j0 + i < cnt) acc.x += v[i].x, acc.y += v[i].y, acc.z += v[i].z, acc.w += v[i].w;
    }
    if (shared) {
        const float4 s = *(const float4 *)(shared + (size_t)t * D + d);
        acc.x += s.x, acc.y += s.y, acc.z += s.z, acc.w += s.w;
    }
    *(float4 *)(out + (size_t)t * D + d) = acc;
}

extern "C" bt_status_t bt_cuda_moe_combine(float *out, const float *y, const int32_t *rows,
                                           const int32_t *n, int stride, const float *shared,
                                           int T, int D, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && rows && n && T > 0 && D > 0 && stride >= 0);
    if (D % 4 == 0 && ((uintptr_t)out | (uintptr_t)y | (uintptr_t)shared) % 16 == 0)
        bt__launch(moe_combine4_kernel, dim3(T, bt__cdiv(D / 4, 256)), 256, 0, stream, out, y, rows,
                   n, stride, shared, D);
    else
        bt__launch(moe_combine_kernel, T, 256, 0, stream, out, y, rows, n, stride, shared, D);
    return bt__cuda_launched("moe_combine");
}

__global__ void compress_pool_kernel(float *latent, const float *kv, const float *gate, int r,
                                     int dim)
{
    bt_grid_begin();
    int g = blockIdx.x;
    const float *k = kv + (size_t)g * r * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        if (!gate || r == 1) {
            latent[(size_t)g * dim + d] = k[d];
            continue;
        }
        const float *gt = gate + (size_t)g * r * dim;
        float mx = -INFINITY;
        for (int j = 0; j < r; j++) mx = fmaxf(mx, gt[(size_t)j * dim + d]);
        float sum = 0.0f;
        for (int j = 0; j < r; j++) sum += expf(gt[(size_t)j * dim + d] - mx);
        float acc = 0.0f;
        for (int j = 0; j < r; j++)
            acc += k[(size_t)j * dim + d] * (expf(gt[(size_t)j * dim + d] - mx) / sum);
        latent[(size_t)g * dim + d] = acc;
    }
}

extern "C" bt_status_t bt_cuda_compress_pool(float *latent, const float *kv, const float *gate,
                                             int groups, int r, int dim, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(latent && kv && groups > 0 && r > 0 && dim > 0);
    bt__launch(compress_pool_kernel, groups, 128, 0, stream, latent, kv, gate, r, dim);
    return bt__cuda_launched("compress_pool");
}

__global__ void block_max_kernel(float *bmax, const float *scores, const int64_t *visible, int n,
                                 int bs, int nblocks)
{
    bt_grid_begin();
    int t = blockIdx.y, b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks) return;
    const float *row = scores + (size_t)t * n;
    float mx = -INFINITY;
    for (int j = b * bs; j < (b + 1) * bs && j < n; j++) mx = fmaxf(mx, row[j]);
    int64_t vis = visible[t];
    if (vis > 0 && (vis - 1) / bs == b) mx = INFINITY; /* the newest block is always kept */
    bmax[(size_t)t * nblocks + b] = mx;
}

extern "C" bt_status_t bt_cuda_block_max(float *bmax, const float *scores, const int64_t *visible,
                                         int T, int n, int bs, int nblocks, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(bmax && scores && visible && T > 0 && n > 0 && bs > 0 && nblocks > 0);
    dim3 grid(bt__cdiv(nblocks, 128), T);
    bt__launch(block_max_kernel, grid, 128, 0, stream, bmax, scores, visible, n, bs, nblocks);
    return bt__cuda_launched("block_max");
}

__global__ void mask_blocks_kernel(float *scores, const int32_t *cand, const int32_t *cand_n,
                                   int cand_stride, int n, int bs)
{
    bt_grid_begin();
    int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    int blk = j / bs, cnt = cand_n[t];
    const int32_t *c = cand + (size_t)t * cand_stride;
    int lo = 0, hi = cnt; /* the kept blocks are ascending */
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (c[mid] < blk) lo = mid + 1; else hi = mid;
    }
    if (lo >= cnt || c[lo] != blk) scores[(size_t)t * n + j] = -INFINITY;
}

extern "C" bt_status_t bt_cuda_mask_blocks(float *scores, const int32_t *cand,
                                           const int32_t *cand_n, int cand_stride, int T, int n,
                                           int bs, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(scores && cand && cand_n && T > 0 && n > 0 && bs > 0);
    dim3 grid(bt__cdiv(n, 256), T);
    bt__launch(mask_blocks_kernel, grid, 256, 0, stream, scores, cand, cand_n, cand_stride, n, bs);
    return bt__cuda_launched("mask_blocks");
}

__global__ void trim_sel_kernel(int32_t *n_out, const int32_t *sel, const int32_t *n_in,
                                int stride, int T, int64_t limit)
{
    bt_grid_begin();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    int k = n_in[t];
    while (k > 0 && sel[(size_t)t * stride + k - 1] >= limit) k--;
    n_out[t] = k;
}

extern "C" bt_status_t bt_cuda_trim_sel(int32_t *n_out, const int32_t *sel, const int32_t *n_in,
                                        int stride, int T, int64_t limit, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(n_out && sel && n_in && T > 0);
    bt__launch(trim_sel_kernel, bt__cdiv(T, 128), 128, 0, stream, n_out, sel, n_in, stride, T,
               limit);
    return bt__cuda_launched("trim_sel");
}

/* CPU reference operators (float32). Plain C, threaded through common/threads, and
 * batch-invariant: every output element is reduced in one fixed order that depends only on
 * its own row, so a row's result is bit-identical whatever the batch, the chunking or the
 * thread count.
 *
 *   bt_cpu_matmul(pool, y, x, w, n, out, in);   // y[n,out] = x[n,in] . w[out,in]^T
 */
#ifndef BT_KERNELS_CPU_OPS_H
#define BT_KERNELS_CPU_OPS_H

#include "common/threads.h"

#include <math.h>

/* Dot product with a fixed 8-lane accumulation order. */
float bt_cpu_dot(const float *a, const float *b, int n);

/* y[n,out] = x[n,in] . w[out,in]^T; parallel over (row, block of outputs). */
void bt_cpu_matmul(bt_threads_t *pool, float *y, const float *x, const float *w, int n, int out,
                   int in);

/* y = w * (x * rsqrt(mean(x^2) + eps)); w may be NULL (unweighted); y may alias x. */
void bt_cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* Interleaved-pair rotation of the last 2*half channels of x (length dim), angles given by
 * cos/sin per pair; inverse rotates back. */
void bt_cpu_rope(float *x, int dim, const float *cos_t, const float *sin_t, int half, int inverse);

/* cos/sin of pos * inv_freq[i], float32 products as the reference computes them. */
void bt_cpu_rope_angles(float *cos_t, float *sin_t, const float *inv_freq, int half, long long pos);

static inline float bt_sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float bt_siluf(float x)
{
    return x / (1.0f + expf(-x));
}

/* torch.nn.functional.softplus with beta 1, threshold 20 */
static inline float bt_softplusf(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

#endif

#include "kernels/cpu/ops.h"

#include <stddef.h>

float bt_cpu_dot(const float *a, const float *b, int n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

enum { MATMUL_COLS = 32 };

typedef struct {
    float *y;
    const float *x, *w;
    int n, out, in, col_blocks;
} matmul_ctx_t;

static void matmul_task(void *p, size_t task)
{
    const matmul_ctx_t *c = p;
    int row = (int)(task / (size_t)c->col_blocks);
    int col0 = (int)(task % (size_t)c->col_blocks) * MATMUL_COLS;
    int col1 = col0 + MATMUL_COLS < c->out ? col0 + MATMUL_COLS : c->out;
    const float *xr = c->x + (size_t)row * c->in;
    float *yr = c->y + (size_t)row * c->out;
    for (int o = col0; o < col1; o++) yr[o] = bt_cpu_dot(xr, c->w + (size_t)o * c->in, c->in);
}

void bt_cpu_matmul(bt_threads_t *pool, float *y, const float *x, const float *w, int n, int out,
                   int in)
{
    matmul_ctx_t c = {y, x, w, n, out, in, (out + MATMUL_COLS - 1) / MATMUL_COLS};
    size_t tasks = (size_t)n * (size_t)c.col_blocks;
    /* tiny problems are not worth waking the pool */
    if ((size_t)n * out * in < 32768) pool = NULL;
    bt_threads_for(pool, tasks, matmul_task, &c);
}

void bt_cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

void bt_cpu_rope(float *x, int dim, const float *cos_t, const float *sin_t, int half, int inverse)
{
    float *r = x + dim - 2 * half;
    for (int i = 0; i < half; i++) {
        float c = cos_t[i], s = inverse ? -sin_t[i] : sin_t[i];
        float e = r[2 * i], o = r[2 * i + 1];
        r[2 * i] = e * c - o * s;
        r[2 * i + 1] = e * s + o * c;
    }
}

void bt_cpu_rope_angles(float *cos_t, float *sin_t, const float *inv_freq, int half, long long pos)
{
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i] * (float)pos;
        cos_t[i] = cosf(f);
        sin_t[i] = sinf(f);
    }
}

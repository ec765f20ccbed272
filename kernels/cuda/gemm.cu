/* bf16 x bf16 GEMM through cuBLASLt: y[M,N] = x[M,K] . w[N,K]^T, fp32 accumulation.
 * Row-major y is column-major y^T = w . x^T, so cuBLASLt sees A = w (transposed), B = x. */
#include "kernels/cuda/common.cuh"

#include <cublasLt.h>
#include <stdlib.h>

enum { PLAN_CACHE = 32, WORKSPACE_BYTES = 32 << 20 };

typedef struct {
    int M, N, K, y_dtype, x_f32, ldx, ldy, used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} plan_t;

struct bt_cuda_blas {
    cublasLtHandle_t lt;
    void *workspace;
    plan_t plan[PLAN_CACHE];
    int next; /* round-robin eviction */
};

static void plan_clear(plan_t *p)
{
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->op);
    p->used = 0;
}

extern "C" bt_status_t bt_cuda_blas_create(bt_cuda_blas_t **blas_p)
{
    bt_cuda_blas_t *b = (bt_cuda_blas_t *)calloc(1, sizeof(*b));
    if (!b) return BT_ERR_NO_MEMORY;
    if (cublasLtCreate(&b->lt) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuda: cublasLtCreate failed\n");
        goto fail_free;
    }
    if (cudaMalloc(&b->workspace, WORKSPACE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "cuda: cuBLASLt workspace allocation failed\n");
        goto fail_handle;
    }
    *blas_p = b;
    return BT_OK;
fail_handle:
    cublasLtDestroy(b->lt);
fail_free:
    free(b);
    return BT_ERR_DEVICE;
}

extern "C" void bt_cuda_blas_destroy(bt_cuda_blas_t *b)
{
    if (!b) return;
    for (int i = 0; i < PLAN_CACHE; i++) plan_clear(&b->plan[i]);
    cudaFree(b->workspace);
    cublasLtDestroy(b->lt);
    free(b);
}

/* Products of up to this many rows (a decode step) are summed in an order that does not
 * depend on the row count: plan_get's algorithm choice, bt_cuda_gemm_f32's own kernel. */
enum { BATCH_INVARIANT_ROWS = 16 };

/* x_f32: x and w are f32 (exact fp32 FMAs, no TF32), else bf16. ldx / ldy: row strides. */
static plan_t *plan_get(bt_cuda_blas_t *b, int M, int N, int K, bt_cuda_dtype_t yd, int x_f32,
                        int ldx, int ldy)
{
    for (int i = 0; i < PLAN_CACHE; i++) {
        plan_t *p = &b->plan[i];
        if (p->used && p->M == M && p->N == N && p->K == K && p->y_dtype == (int)yd &&
            p->x_f32 == x_f32 && p->ldx == ldx && p->ldy == ldy)
            return p;
    }
    plan_t *p = &b->plan[b->next];
    b->next = (b->next + 1) % PLAN_CACHE;
    plan_clear(p);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ct = yd == BT_CUDA_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    size_t ws = WORKSPACE_BYTES;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        return NULL;
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cudaDataType_t it = x_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayoutCreate(&p->a, it, K, N, K);
    cublasLtMatrixLayoutCreate(&p->b, it, K, M, ldx);
    cublasLtMatrixLayoutCreate(&p->c, ct, N, M, ldy);
    p->used = 1;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    if (x_f32) {
        /* f32 callers pass row and column slices (experts' rows, output groups): promise only
         * element alignment, so the heuristic picks algorithms that take any offset */
        uint32_t align = 4;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof(align));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof(align));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof(align));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof(align));
    }
    /* Up to 16 rows (a decode step) take the algorithm chosen for 16: each output element is
     * then summed in the same order whatever the batch, so a sequence decodes bit for bit as
     * it does alone (cuBLASLt's choice for M = 1 and M = 3 differ in their reductions) */
    if (M < BATCH_INVARIANT_ROWS) {
        cublasLtMatrixLayout_t hb = NULL, hc = NULL;
        cublasLtMatrixLayoutCreate(&hb, it, K, BATCH_INVARIANT_ROWS, ldx > K ? ldx : K);
        cublasLtMatrixLayoutCreate(&hc, ct, N, BATCH_INVARIANT_ROWS, ldy > N ? ldy : N);
        cublasLtMatmulHeuristicResult_t r16;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(b->lt, p->op, p->a, hb, hc, hc, pref, 1, &r16, &found);
        if (hs == CUBLAS_STATUS_SUCCESS && found &&
            cublasLtMatmulAlgoCheck(b->lt, p->op, p->a, p->b, p->c, p->c, &r16.algo, &res) == CUBLAS_STATUS_SUCCESS &&
            res.workspaceSize <= ws)
            res.algo = r16.algo;
        else
            found = 0;
        cublasLtMatrixLayoutDestroy(hb);
        cublasLtMatrixLayoutDestroy(hc);
    }
    if (!found && (cublasLtMatmulAlgoGetHeuristic(b->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res,
                                                  &found) != CUBLAS_STATUS_SUCCESS ||
                   found == 0)) {
        cublasLtMatmulPreferenceDestroy(pref);
        plan_clear(p);
        return NULL;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    p->algo = res.algo;
    p->M = M;
    p->N = N;
    p->K = K;
    p->y_dtype = (int)yd;
    p->x_f32 = x_f32;
    p->ldx = ldx;
    p->ldy = ldy;
    return p;
}

/* Plans (or finds) the product and runs it: y = x . w^T. */
static bt_status_t matmul(bt_cuda_blas_t *blas, void *y, bt_cuda_dtype_t y_dtype, const void *x,
                          const void *w, int M, int N, int K, int x_f32, int ldx, int ldy,
                          cudaStream_t stream)
{
    const char *what = x_f32 ? "f32" : "bf16";
    plan_t *p = plan_get(blas, M, N, K, y_dtype, x_f32, ldx, ldy);
    if (!p) {
        fprintf(stderr, "cuda: no cuBLASLt %s algorithm for %dx%dx%d\n", what, M, N, K);
        return BT_ERR_DEVICE;
    }
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = cublasLtMatmul(blas->lt, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c,
                                       y, p->c, &p->algo, blas->workspace, WORKSPACE_BYTES, stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuda: cublasLtMatmul %s %dx%dx%d: status %d\n", what, M, N, K, (int)st);
        cudaGetLastError();
        return BT_ERR_DEVICE;
    }
    return BT_OK;
}

extern "C" bt_status_t bt_cuda_gemm_bf16(bt_cuda_blas_t *blas, void *y, bt_cuda_dtype_t y_dtype,
                                         const uint16_t *x, const uint16_t *w, int M, int N,
                                         int K, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(blas && y && x && w && bt__dtype_ok(y_dtype));
    BT_CUDA_REQUIRE(M > 0 && N > 0 && K > 0);
    /* a decode step's rows: one launch with K sliced over clusters where cuBLASLt took a
     * split-K kernel and a reduction; sums in an order that does not depend on M */
    if (bt__gemm_bf16_rows_fits(x, w, M, N, K))
        return bt__gemm_bf16_rows(y, y_dtype, x, w, M, N, K, stream);
    return matmul(blas, y, y_dtype, x, w, M, N, K, 0, K, N, stream);
}

/* Few rows (a decode step) in f32: a warp per output column, rows 8 at a time against the same
 * weights, each lane's k in a fixed order and a fixed reduction tree: an element's sum does not
 * depend on how many rows came with it (cuBLASLt's algorithms for 1 and 3 rows reduce
 * differently), so a sequence decodes bit for bit as it does alone. */
enum { F32S_WARPS = 8, F32S_ROWS = 8 };

__global__ void __launch_bounds__(F32S_WARPS * 32) gemm_f32_rows_kernel(float *y, int ldy,
                                                                        const float *x, int ldx,
                                                                        const float *w, int M,
                                                                        int N, int K)
{
    bt_grid_begin();
    int lane = threadIdx.x & 31, n = blockIdx.x * F32S_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *wr = w + (size_t)n * K;
    for (int m0 = 0; m0 < M; m0 += F32S_ROWS) {
        float acc[F32S_ROWS];
#pragma unroll
        for (int r = 0; r < F32S_ROWS; r++) acc[r] = 0.0f;
        for (int k = lane; k < K; k += 32) {
            float wv = __ldg(wr + k);
#pragma unroll
            for (int r = 0; r < F32S_ROWS; r++)
                if (m0 + r < M) acc[r] = fmaf(wv, x[(size_t)(m0 + r) * ldx + k], acc[r]);
        }
#pragma unroll
        for (int r = 0; r < F32S_ROWS; r++) {
            float v = bt_warp_sum(acc[r]);
            if (lane == 0 && m0 + r < M) y[(size_t)(m0 + r) * ldy + n] = v;
        }
    }
}

extern "C" bt_status_t bt_cuda_gemm_f32(bt_cuda_blas_t *blas, float *y, int ldy, const float *x,
                                        int ldx, const float *w, int M, int N, int K,
                                        cudaStream_t stream)
{
    BT_CUDA_REQUIRE(blas && y && x && w);
    BT_CUDA_REQUIRE(M > 0 && N > 0 && K > 0 && ldx >= K && ldy >= N);
    if (M <= BATCH_INVARIANT_ROWS) {
        bt__launch(gemm_f32_rows_kernel, bt__cdiv(N, F32S_WARPS), F32S_WARPS * 32, 0, stream, y,
                   ldy, x, ldx, w, M, N, K);
        return bt__cuda_launched("gemm_f32 (rows)");
    }
    return matmul(blas, y, BT_CUDA_F32, x, w, M, N, K, 1, ldx, ldy, stream);
}

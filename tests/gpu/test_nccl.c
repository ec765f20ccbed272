/* The NCCL backend of common/comm on one GPU (TP 1 through NCCL): all-reduce, all-gather,
 * broadcast and barrier on device buffers, results checked on the host; plus the time of a
 * 64 MiB all-reduce. Needs a GPU (CTest label "gpu"). */
#include "bt_test.h"
#include "common/comm/comm.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void test_tp1(void)
{
    unsigned char id[BT_COMM_NCCL_ID_BYTES];
    BT_CHECK(bt_comm_nccl_unique_id(id) == BT_OK);
    cudaStream_t stream;
    BT_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
    bt_comm_t *c = NULL;
    BT_CHECK(bt_comm_nccl_create(0, 1, id, stream, &c) == BT_OK);
    if (!c) return;
    BT_CHECK(bt_comm_rank(c) == 0 && bt_comm_size(c) == 1);
    size_t sizes[] = {1, 7, 4097, (size_t)16 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *h = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1000) * 0.25f - 7.0f;
        float *d, *g;
        BT_CHECK(cudaMalloc((void **)&d, n * sizeof(float)) == cudaSuccess);
        BT_CHECK(cudaMalloc((void **)&g, n * sizeof(float)) == cudaSuccess);
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
        BT_CHECK(bt_comm_all_reduce_f32(c, d, n) == BT_OK);
        cudaMemcpy(back, d, n * sizeof(float), cudaMemcpyDeviceToHost);
        BT_CHECK_MSG(!memcmp(back, h, n * sizeof(float)), "all-reduce of one rank changed the data (n %zu)", n);
        cudaMemset(g, 0xff, n * sizeof(float));
        BT_CHECK(bt_comm_all_gather(c, d, n * sizeof(float), g) == BT_OK);
        cudaMemcpy(back, g, n * sizeof(float), cudaMemcpyDeviceToHost);
        BT_CHECK_MSG(!memcmp(back, h, n * sizeof(float)), "all-gather (n %zu)", n);
        BT_CHECK(bt_comm_broadcast(c, d, n * sizeof(float), 0) == BT_OK);
        BT_CHECK(bt_comm_barrier(c) == BT_OK);
        if (n == ((size_t)16 << 20)) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            for (int i = 0; i < 20; i++) bt_comm_all_reduce_f32(c, d, n);
            clock_gettime(CLOCK_MONOTONIC, &b);
            double us = ((double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3) / 20.0;
            fprintf(stderr, "  NCCL all-reduce, 1 rank, 64 MiB: %.1f us per call (launch + bounded wait)\n", us);
        }
        cudaFree(d);
        cudaFree(g);
        free(h);
        free(back);
    }
    /* a bad argument is refused, not a crash */
    BT_CHECK(bt_comm_broadcast(c, NULL, 16, 3) != BT_OK);
    bt_comm_destroy(c);
    cudaStreamDestroy(stream);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "no GPU\n");
        return 1;
    }
    BT_RUN(test_tp1);
    return bt_test_summary();
}

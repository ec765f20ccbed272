/* Sampling one token per row of logits: greedy argmax, or inverse-CDF sampling of
 * softmax(logits / temperature) at a given uniform number (the caller owns the RNG). */
#include "kernels/cuda/common.cuh"

enum { SM_THREADS = 1024 };

__global__ void __launch_bounds__(SM_THREADS) sample_kernel(int32_t *out, const float *logits,
                                                            int V, float temp,
                                                            const float *uniform)
{
    __shared__ float wv[32];
    __shared__ int wi[32];
    __shared__ float red[32];
    __shared__ float wsum[33];
    __shared__ int found;
    int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *row = logits + (size_t)t * V;
    /* argmax, ties to the lower id */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += SM_THREADS)
        if (row[j] > bv || (row[j] == bv && j < bi)) {
            bv = row[j];
            bi = j;
        }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SM_THREADS / 32; w++)
            if (wv[w] > wv[0] || (wv[w] == wv[0] && wi[w] < wi[0])) {
                wv[0] = wv[w];
                wi[0] = wi[w];
            }
        found = wi[0] == 0x7fffffff ? 0 : wi[0];
    }
    __syncthreads();
    if (temp <= 0.0f) {
        if (threadIdx.x == 0) out[t] = found;
        return;
    }
    float mx = wv[0], sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += SM_THREADS) sum += expf((row[j] - mx) / temp);
    sum = bt_block_sum(sum, red);
    float target = uniform[t] * sum, run = 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) found = V - 1; /* rounding: nothing crossed the target */
    __syncthreads();
    for (int j0 = 0; j0 < V; j0 += SM_THREADS) {
        int j = j0 + threadIdx.x;
        float p = j < V ? expf((row[j] - mx) / temp) : 0.0f;
        /* inclusive scan: in the warp, then over warp totals */
        float v = p;
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += u;
        }
        if (lane == 31) wsum[warp] = v;
        __syncthreads();
        if (threadIdx.x == 0) {
            float r = 0.0f;
            for (int w = 0; w < SM_THREADS / 32; w++) {
                float x = wsum[w];
                wsum[w] = r;
                r += x;
            }
            wsum[32] = r;
        }
        __syncthreads();
        float incl = run + wsum[warp] + v;
        int hit = j < V && p > 0.0f && incl > target;
        /* the first crossing wins */
        if (__syncthreads_or(hit)) {
            if (hit) atomicMin(&found, j);
            __syncthreads();
            break;
        }
        run += wsum[32];
    }
    if (threadIdx.x == 0) out[t] = found;
}

extern "C" bt_status_t bt_cuda_sample(int32_t *out, const float *logits, int T, int V,
                                      float temperature, const float *uniform, cudaStream_t stream)
{
    BT_CUDA_REQUIRE(out && logits && T > 0 && V > 0 && (temperature <= 0.0f || uniform));
    sample_kernel<<<T, SM_THREADS, 0, stream>>>(out, logits, V, temperature, uniform);
    return bt__cuda_launched("sample");
}

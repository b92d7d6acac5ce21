// Softmax cross-entropy over the first V of Vp (padded) logits per row, one block per row.
// Max and normaliser come from one online pass (running max, rescaled sum), so forward
// reads a row once and the in-place backward reads it twice and writes it once.

// Merges running (max, sum) pairs: the sums are rescaled to the larger max.
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    s = (m == NEG_INF ? 0.0f : s * expf(m - mn)) + (m2 == NEG_INF ? 0.0f : s2 * expf(m2 - mn));
    m = mn;
}

// (max, Σ exp(x - max)) of x[0..V) over the block; every thread gets both.
__device__ void row_softmax_stats(const float* x, int V, float* scratch, float& maxval, float& sum) {
    float m = NEG_INF, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = x[i];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        float s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        online_merge(m, s, m2, s2);
    }
    // scratch: 32 maxima then 32 sums.
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = m;
        scratch[32 + warp] = s;
    }
    __syncthreads();
    m = lane < warps ? scratch[lane] : NEG_INF;
    s = lane < warps ? scratch[32 + lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        float s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        online_merge(m, s, m2, s2);
    }
    maxval = m;
    sum = s;
}

// losses[row] = logsumexp(logits[row, :V]) - logits[row, target].
extern "C" __global__ void crossentropy_forward_kernel(float* losses, const float* logits, const int* targets,
                                                       int N, int V, int Vp) {
    __shared__ float scratch[64];
    int row = blockIdx.x;
    if (row >= N) return;
    const float* x = logits + (size_t)row * Vp;
    float maxval, sum;
    row_softmax_stats(x, V, scratch, maxval, sum);
    if (threadIdx.x == 0) losses[row] = logf(sum) + maxval - x[targets[row]];
}

// dlogits[row, i] += (softmax_i - [i == target]) · dloss for i < V; the padding is untouched.
extern "C" __global__ void crossentropy_backward_kernel(float* dlogits, const float* logits, const int* targets,
                                                        float dloss, int N, int V, int Vp) {
    __shared__ float scratch[64];
    int row = blockIdx.x;
    if (row >= N) return;
    size_t off = (size_t)row * Vp;
    const float* x = logits + off;
    float* d = dlogits + off;
    float maxval, sum;
    row_softmax_stats(x, V, scratch, maxval, sum);
    float inv = 1.0f / sum;
    int target = targets[row];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(x[i] - maxval) * inv;
        d[i] += (p - (i == target ? 1.0f : 0.0f)) * dloss;
    }
}

// In place: logits[row, i] = (softmax_i - [i == target]) · dloss for i < V, 0 in the padding.
extern "C" __global__ void crossentropy_backward_in_place_kernel(float* logits, const int* targets, float dloss,
                                                                 int N, int V, int Vp) {
    __shared__ float scratch[64];
    int row = blockIdx.x;
    if (row >= N) return;
    float* x = logits + (size_t)row * Vp;
    float maxval, sum;
    row_softmax_stats(x, V, scratch, maxval, sum);
    float inv = 1.0f / sum;
    int target = targets[row];
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float p = i < V ? expf(x[i] - maxval) * inv : 0.0f;
        x[i] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
    }
}

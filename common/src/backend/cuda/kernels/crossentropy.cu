// Softmax cross-entropy over the first V of Vp (padded) logits per row, one block per row.
// Max and normaliser come from one online pass (running max, rescaled sum), so forward
// reads a row once; the in-place backward gets the normaliser from the forward's loss and
// reads and writes a row once.

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
// softmax_i = exp(x_i - lse) with lse = losses[row] + x[target] (the forward's loss is
// lse - x[target]), so the row is read once. `vec`: Vp a multiple of 4 and rows 16-byte aligned.
extern "C" __global__ void crossentropy_backward_in_place_kernel(float* logits, const float* losses,
                                                                 const int* targets, float dloss, int N, int V,
                                                                 int Vp, int vec) {
    __shared__ float lse_s;
    int row = blockIdx.x;
    if (row >= N) return;
    float* x = logits + (size_t)row * Vp;
    int target = targets[row];
    if (threadIdx.x == 0) lse_s = losses[row] + x[target];
    __syncthreads();  // x[target] is read before any thread overwrites it
    float lse = lse_s;
    if (vec) {
        float4* x4 = reinterpret_cast<float4*>(x);
        for (int j = threadIdx.x; j < Vp / 4; j += blockDim.x) {
            float4 v = x4[j];
            float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int i = 4 * j + k;
                float p = i < V ? expf(e[k] - lse) : 0.0f;
                e[k] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
            }
            x4[j] = make_float4(e[0], e[1], e[2], e[3]);
        }
    } else {
        for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
            float p = i < V ? expf(x[i] - lse) : 0.0f;
            x[i] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
        }
    }
}

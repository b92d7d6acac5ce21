// Softmax cross-entropy over the first V of Vp (padded) logits per row, one block per row.
// Max and normaliser come from one online pass (running max, rescaled sum), so forward
// reads a row once; the in-place backward gets the normaliser from the forward's loss and
// reads and writes a row once.

// online_merge and online_add (the running max and rescaled sum) are in the prelude: mlp.cu's
// loss uses them too.

// Merges every thread's running (max, sum) over the block, in a fixed order (warps by
// butterfly, then the warps' pairs); every thread gets the result. `scratch`: 64 floats of
// shared memory (32 maxima, then 32 sums).
__device__ __forceinline__ void block_online_merge(float& m, float& s, float* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        float s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        online_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    __syncthreads();  // scratch may still be read by a previous merge
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
}

// (max, Σ exp(x - max)) of x[0..V) over the block; every thread gets both. `vec`: x aligned
// to 4 elements, read 4 at a time up to the last multiple of 4, then one at a time.
__device__ void row_softmax_stats(const act_t* x, int V, float* scratch, float& maxval, float& sum, int vec = 0) {
    float m = NEG_INF, s = 0.0f;
    int head = vec ? V / 4 * 4 : 0;
    for (int j = threadIdx.x; j < head / 4; j += blockDim.x) {
        float4 v = load4(x + 4 * j);
        online_add(m, s, v.x);
        online_add(m, s, v.y);
        online_add(m, s, v.z);
        online_add(m, s, v.w);
    }
    for (int i = head + threadIdx.x; i < V; i += blockDim.x) online_add(m, s, to_f(x[i]));
    block_online_merge(m, s, scratch);
    maxval = m;
    sum = s;
}

// losses[row] = logsumexp(logits[row, :V]) - logits[row, target]. `vec`: Vp a multiple of 4 and
// rows aligned to 4 elements.
extern "C" __global__ void crossentropy_forward_kernel(float* losses, const act_t* logits, const int* targets,
                                                       int N, int V, int Vp, int vec) {
    __shared__ float scratch[64];
    int row = blockIdx.x;
    if (row >= N) return;
    const act_t* x = logits + (size_t)row * Vp;
    float maxval, sum;
    row_softmax_stats(x, V, scratch, maxval, sum, vec);
    if (threadIdx.x == 0) losses[row] = logf(sum) + maxval - to_f(x[targets[row]]);
}

// dlogits[row, i] += (softmax_i - [i == target]) · dloss for i < V; the padding is untouched.
extern "C" __global__ void crossentropy_backward_kernel(act_t* dlogits, const act_t* logits, const int* targets,
                                                        float dloss, int N, int V, int Vp) {
    __shared__ float scratch[64];
    int row = blockIdx.x;
    if (row >= N) return;
    size_t off = (size_t)row * Vp;
    const act_t* x = logits + off;
    act_t* d = dlogits + off;
    float maxval, sum;
    row_softmax_stats(x, V, scratch, maxval, sum);
    float inv = 1.0f / sum;
    int target = targets[row];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(to_f(x[i]) - maxval) * inv;
        d[i] = from_f(to_f(d[i]) + (p - (i == target ? 1.0f : 0.0f)) * dloss);
    }
}

// In place: logits[row, i] = (softmax_i - [i == target]) · dloss for i < V, 0 in the padding.
// softmax_i = exp(x_i - lse) with lse = losses[row] + x[target] (the forward's loss is
// lse - x[target]), so the row is read once. `vec`: Vp a multiple of 4 and rows aligned to 4 elements.
extern "C" __global__ void crossentropy_backward_in_place_kernel(act_t* logits, const float* losses,
                                                                 const int* targets, float dloss, int N, int V,
                                                                 int Vp, int vec) {
    __shared__ float lse_s;
    int row = blockIdx.x;
    if (row >= N) return;
    act_t* x = logits + (size_t)row * Vp;
    int target = targets[row];
    if (threadIdx.x == 0) lse_s = losses[row] + to_f(x[target]);
    __syncthreads();  // x[target] is read before any thread overwrites it
    float lse = lse_s;
    if (vec) {
        for (int j = threadIdx.x; j < Vp / 4; j += blockDim.x) {
            float4 v = load4(x + 4 * j);
            float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int i = 4 * j + k;
                float p = i < V ? expf(e[k] - lse) : 0.0f;
                e[k] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
            }
            store4(x + 4 * j, make_float4(e[0], e[1], e[2], e[3]));
        }
    } else {
        for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
            float p = i < V ? expf(to_f(x[i]) - lse) : 0.0f;
            x[i] = from_f((p - (i == target ? 1.0f : 0.0f)) * dloss);
        }
    }
}

#define LOG2E_F 1.4426950408889634f

// The forward and the in-place backward in one kernel, for a training step (the loss's
// gradient dloss known when the forward runs): losses[row] = logsumexp - x[target], then
// logits[row, i] = (softmax_i - [i == target]) · dloss for i < V, 0 in the padding. A row is
// read twice, the second time soon after the first (from L2, 100 KB a row at GPT-2's
// vocabulary), and written once: one pass over memory where the two kernels make two.
// `vec`: Vp a multiple of 8 and rows aligned to 8 elements (16-byte accesses). There, e^(x - c)
// is 2^(x·log2 e - c·log2 e): one fused multiply-add and the hardware's ex2 (relative error
// ~2^-22) instead of expf's range reduction: the kernel is bound by its instructions, not by
// memory (at GPT-2's B·T = 16K, V = 50,304 it takes as long whether its second read comes from
// memory or from shared memory).
extern "C" __global__ void crossentropy_fused_kernel(float* losses, act_t* logits, const int* targets, float dloss,
                                                     int N, int V, int Vp, int vec) {
    __shared__ float scratch[64];
    int row = blockIdx.x;
    if (row >= N) return;
    act_t* x = logits + (size_t)row * Vp;
    int target = targets[row];
    float m = NEG_INF, s = 0.0f;
    int head = vec ? V / 8 * 8 : 0;
    for (int j = threadIdx.x; j < head / 8; j += blockDim.x) {
        float v[8];
        load8(x + 8 * j, v);
        float mx = fmaxf(fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])), fmaxf(fmaxf(v[4], v[5]), fmaxf(v[6], v[7])));
        float part = 0.0f;
        float mx2 = mx * LOG2E_F;
#pragma unroll
        for (int k = 0; k < 8; k++) part += fast_exp2(fmaf(v[k], LOG2E_F, -mx2));
        online_merge(m, s, mx, part);
    }
    for (int i = head + threadIdx.x; i < V; i += blockDim.x) online_add(m, s, to_f(x[i]));
    block_online_merge(m, s, scratch);
    float lse = m + logf(s);
    float lse2 = lse * LOG2E_F;
    float x_target = to_f(x[target]);
    __syncthreads();  // every thread has read x[target] before any overwrites it
    if (threadIdx.x == 0) losses[row] = lse - x_target;
    if (vec) {
        for (int j = threadIdx.x; j < Vp / 8; j += blockDim.x) {
            float v[8];
            load8(x + 8 * j, v);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int i = 8 * j + k;
                float p = i < V ? fast_exp2(fmaf(v[k], LOG2E_F, -lse2)) : 0.0f;
                v[k] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
            }
            store8(x + 8 * j, v);
        }
    } else {
        for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
            float p = i < V ? expf(to_f(x[i]) - lse) : 0.0f;
            x[i] = from_f((p - (i == target ? 1.0f : 0.0f)) * dloss);
        }
    }
}

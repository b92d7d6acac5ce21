// Softmax cross-entropy over the first V of Vp (padded) logits per row, one block per row.
// Backward recomputes the row's max and normaliser rather than keeping probabilities.

// losses[row] = logsumexp(logits[row, :V]) - logits[row, target].
extern "C" __global__ void crossentropy_forward_kernel(float* losses, const float* logits, const int* targets,
                                                       int N, int V, int Vp) {
    __shared__ float scratch[32];
    int row = blockIdx.x;
    if (row >= N) return;
    const float* x = logits + (size_t)row * Vp;
    float maxval = NEG_INF;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, x[i]);
    maxval = block_max(maxval, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - maxval);
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) losses[row] = logf(sum) + maxval - x[targets[row]];
}

// dlogits[row, i] += (softmax_i - [i == target]) · dloss for i < V; the padding is untouched.
extern "C" __global__ void crossentropy_backward_kernel(float* dlogits, const float* logits, const int* targets,
                                                        float dloss, int N, int V, int Vp) {
    __shared__ float scratch[32];
    int row = blockIdx.x;
    if (row >= N) return;
    size_t off = (size_t)row * Vp;
    const float* x = logits + off;
    float* d = dlogits + off;
    float maxval = NEG_INF;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, x[i]);
    maxval = block_max(maxval, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - maxval);
    float inv = 1.0f / block_sum(sum, scratch);
    int target = targets[row];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(x[i] - maxval) * inv;
        d[i] += (p - (i == target ? 1.0f : 0.0f)) * dloss;
    }
}

// The MLP workload's training step whole on the device (mnist/fused.rs): the batch cut from
// the data set kept there, the loss with the step's scalars, the input gradient through the
// ReLU, and SGD fused into the weight gradient's product. A step built from these reads
// nothing back, so it is recorded once as a CUDA graph and replayed.

// ---- the batch -----------------------------------------------------------------------------
// out[r, k] = images[order[s·rows + r], k] / 255 and targets[r] its label, s the step within the
// epoch (the state's step mod steps). One thread per pixel.
extern "C" __global__ void gather_batch_kernel(act_t* out, int* targets, const unsigned char* images,
                                               const unsigned char* labels, const int* order,
                                               const StepState* s, int rows, int size, int steps) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * size) return;
    int r = i / size, k = i - r * size;
    int local = (int)(s->step % (unsigned)steps);
    int image = order[local * rows + r];
    out[i] = from_f((float)images[(size_t)image * size + k] / 255.0f);
    if (k == 0) targets[r] = labels[image];
}

// ---- the loss and the step's scalars ---------------------------------------------------------
// (max, Σ exp(x - max)) of x[0..V) over one warp, every lane gets both: crossentropy.cu's
// row_softmax_stats for V ≤ 128, bit for bit (the same elements per thread, the same merges:
// there every value lands in warp 0 and the other warps add (-inf, 0), which changes nothing).
__device__ void warp_softmax_stats(const act_t* x, int V, int vec, float& maxval, float& sum) {
    int lane = threadIdx.x % WARP_SIZE;
    float m = NEG_INF, s = 0.0f;
    int head = vec ? V / 4 * 4 : 0;
    for (int j = lane; j < head / 4; j += WARP_SIZE) {
        float4 v = load4(x + 4 * j);
        online_add(m, s, v.x);
        online_add(m, s, v.y);
        online_add(m, s, v.z);
        online_add(m, s, v.w);
    }
    for (int i = head + lane; i < V; i += WARP_SIZE) online_add(m, s, to_f(x[i]));
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        float s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        online_merge(m, s, m2, s2);
    }
    maxval = m;
    sum = s;
}

// One block of 1024 threads, one warp per row: losses[row] as crossentropy_forward_kernel, the
// row overwritten by its gradient as crossentropy_backward_in_place_kernel (vec 0 form, the same
// values), the mean loss as mean_kernel (1024 threads); then the state: loss, apply (the loss is
// finite), clip 1, no norm, lr from the epoch's schedule, (loss, 0) into the history, step + 1.
// `vec`: V a multiple of 4 and rows aligned to 4 elements (as the forward kernel's).
extern "C" __global__ void loss_step_kernel(act_t* logits, float* losses, const int* targets, StepState* s,
                                            const float* schedule, float* history, int history_len, int rows,
                                            int V, int steps, float dloss, int vec) {
    __shared__ float scratch[32];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    for (int row = warp; row < rows; row += warps) {
        act_t* x = logits + (size_t)row * V;
        float maxval, sum;
        warp_softmax_stats(x, V, vec, maxval, sum);
        int target = targets[row];
        float xt = to_f(x[target]);
        float loss = logf(sum) + maxval - xt;
        float lse = loss + xt;  // as the in-place backward gets it back from the stored loss
        if (lane == 0) losses[row] = loss;
        __syncwarp();  // every lane has read x[target] before any lane overwrites it
        for (int i = lane; i < V; i += WARP_SIZE) {
            float p = expf(to_f(x[i]) - lse);
            x[i] = from_f((p - (i == target ? 1.0f : 0.0f)) * dloss);
        }
    }
    __syncthreads();  // every row's loss is written
    float total = 0.0f;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) total += losses[i];
    total = block_sum(total, scratch);
    if (threadIdx.x == 0) {
        float loss = total / rows;
        unsigned step = s->step;
        s->sumsq = 0.0f;
        s->norm = 0.0f;
        s->clip = 1.0f;
        s->loss = loss;
        s->apply = isfinite(loss) ? 1.0f : 0.0f;
        s->lr = schedule[step % (unsigned)steps];
        float* slot = history + 2 * (step % (unsigned)history_len);
        slot[0] = loss;
        slot[1] = 0.0f;
        s->step = step + 1;
    }
}

// ---- products of small shapes, their epilogues fused --------------------------------------------
// C (M,N) = A (M,K) · B (K,N) by 32 × 32 tiles of C, one block of 16 × 16 threads each, a thread
// computing rows ty and ty + 16 and columns tx and tx + 16 of its tile; k in chunks of 32 through
// shared memory, the next chunk loaded into registers while this one is multiplied. Every output
// sums its k in order (no atomics, no split): deterministic. A(m, k) is a[m·lda + k] (A_ROWS) or
// a[k·lda + m]; B(k, n) is b[k·ldb + n] for n < nb, 1 in column `ones` (the bias's column of
// ones), 0 elsewhere. Made for the MLP at small batches, where a step is a chain of small
// launches and each saved pass over memory or launch counts; larger shapes go to cuBLAS.
#define TILE 32

template <bool A_ROWS>
__device__ __forceinline__ void load_chunk(float ra[4], float rb[4], const act_t* a, const act_t* b, int M, int K,
                                           int lda, int ldb, int nb, int ones, int m0, int n0, int k0) {
    int t = threadIdx.y * 16 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int e = t + 256 * j;
        int ka = A_ROWS ? e % TILE : e / TILE, ma = A_ROWS ? e / TILE : e % TILE;
        int m = m0 + ma, k = k0 + ka;
        ra[j] = (m < M && k < K) ? to_f(A_ROWS ? a[(size_t)m * lda + k] : a[(size_t)k * lda + m]) : 0.0f;
        int kb = k0 + e / TILE, n = n0 + e % TILE;
        rb[j] = kb >= K ? 0.0f : n < nb ? to_f(b[(size_t)kb * ldb + n]) : (n == ones ? 1.0f : 0.0f);
    }
}

template <bool A_ROWS>
__device__ __forceinline__ void store_chunk(const float ra[4], const float rb[4], float (*as)[TILE + 1],
                                            float (*bs)[TILE + 1]) {
    int t = threadIdx.y * 16 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int e = t + 256 * j;
        int ka = A_ROWS ? e % TILE : e / TILE, ma = A_ROWS ? e / TILE : e % TILE;
        as[ka][ma] = ra[j];
        bs[e / TILE][e % TILE] = rb[j];
    }
}

// acc[i][j]: C(m0 + ty + 16i, n0 + tx + 16j), with m0 = blockIdx.y · 32, n0 = blockIdx.x · 32.
template <bool A_ROWS>
__device__ __forceinline__ void tile_product(float acc[2][2], const act_t* a, const act_t* b, int M, int K, int lda,
                                             int ldb, int nb, int ones) {
    __shared__ float as[TILE][TILE + 1], bs[TILE][TILE + 1];
    int m0 = blockIdx.y * TILE, n0 = blockIdx.x * TILE, tx = threadIdx.x, ty = threadIdx.y;
    float ra[4], rb[4];
    load_chunk<A_ROWS>(ra, rb, a, b, M, K, lda, ldb, nb, ones, m0, n0, 0);
    for (int k0 = 0; k0 < K; k0 += TILE) {
        store_chunk<A_ROWS>(ra, rb, as, bs);
        __syncthreads();
        if (k0 + TILE < K) load_chunk<A_ROWS>(ra, rb, a, b, M, K, lda, ldb, nb, ones, m0, n0, k0 + TILE);
#pragma unroll 8
        for (int k = 0; k < TILE; k++) {
            float a0 = as[k][ty], a1 = as[k][ty + 16], b0 = bs[k][tx], b1 = bs[k][tx + 16];
            acc[0][0] = fmaf(a0, b0, acc[0][0]);
            acc[0][1] = fmaf(a0, b1, acc[0][1]);
            acc[1][0] = fmaf(a1, b0, acc[1][0]);
            acc[1][1] = fmaf(a1, b1, acc[1][1]);
        }
        __syncthreads();
    }
}

// dinp (rows, c) = (dout (rows, oc) · w (oc, c)) ⊙ [act > 0], overwritten. Grid (⌈c/32⌉, ⌈rows/32⌉),
// blocks of 16 × 16.
extern "C" __global__ void mlp_dinp_relu_kernel(act_t* dinp, const act_t* dout, const act_t* w, const act_t* act,
                                                int rows, int c, int oc) {
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    tile_product<true>(acc, dout, w, rows, oc, oc, c, c, -1);
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int r = blockIdx.y * TILE + threadIdx.y + 16 * i, n = blockIdx.x * TILE + threadIdx.x + 16 * j;
            if (r < rows && n < c) {
                size_t at = (size_t)r * c + n;
                dinp[at] = from_f(to_f(act[at]) > 0.0f ? acc[i][j] : 0.0f);
            }
        }
    }
}

// One parameter's SGD step with momentum, as sgd_kernel takes it (adamw.cu).
__device__ __forceinline__ void sgd_one(float* params, float* velocity, bf16_t* copy, size_t at, float grad,
                                        const StepState* s, float momentum, float weight_decay) {
    float p = params[at];
    float g = grad * s->clip + weight_decay * p;
    float v = momentum * velocity[at] + g;
    velocity[at] = v;
    p -= s->lr * v;
    params[at] = p;
    if (copy) copy[at] = to_bf16(p);
}

// SGD fused into the weight gradient's product: C = doutᵀ (oc, rows) · [inp | 1] (rows, c + 1) is
// the layer's weight gradient (columns below c) and bias gradient (column c), each applied to its
// parameter the moment it is summed, never stored. params (and velocity, copy): w (oc, c) then
// b (oc). Grid (⌈(c + 1)/32⌉, ⌈oc/32⌉), blocks of 16 × 16.
extern "C" __global__ void mlp_linear_sgd_kernel(float* params, float* velocity, bf16_t* copy, const act_t* dout,
                                                 const act_t* inp, const StepState* s, float momentum,
                                                 float weight_decay, int rows, int c, int oc) {
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    tile_product<false>(acc, dout, inp, oc, rows, oc, c, c, c);
    if (s->apply == 0.0f) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int o = blockIdx.y * TILE + threadIdx.y + 16 * i, n = blockIdx.x * TILE + threadIdx.x + 16 * j;
            if (o < oc && n <= c) {
                bool bias = n == c;
                size_t at = bias ? (size_t)oc * c + o : (size_t)o * c + n;
                sgd_one(params, velocity, copy, at, acc[i][j], s, momentum, bias ? 0.0f : weight_decay);
            }
        }
    }
}

// ---- the same for larger shapes, after cuBLAS's products -------------------------------------------
// d = [act > 0] · d, in place (after cuBLAS wrote dout · w into d).
extern "C" __global__ void mlp_relu_mask_kernel(act_t* d, const act_t* act, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !(to_f(act[i]) > 0.0f)) d[i] = from_f(0.0f);
}

// After cuBLAS wrote the weight gradient (oc·c f32) into grads: blocks below `wblocks` update the
// weights from it, one thread each; the blocks after them update the biases from the column sums
// of dout (32 columns × 8 row lanes a block, the lanes' partial sums added in order). 256 threads.
extern "C" __global__ void mlp_sgd_apply_kernel(float* params, float* velocity, const float* grads, bf16_t* copy,
                                                const act_t* dout, const StepState* s, float momentum,
                                                float weight_decay, int rows, int c, int oc, int wblocks) {
    __shared__ float part[8][TILE + 1];
    int n = oc * c;
    if ((int)blockIdx.x < wblocks) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n && s->apply != 0.0f) sgd_one(params, velocity, copy, i, grads[i], s, momentum, weight_decay);
        return;
    }
    int col = threadIdx.x % TILE, lane = threadIdx.x / TILE;
    int o = (blockIdx.x - wblocks) * TILE + col;
    float sum = 0.0f;
    if (o < oc)
        for (int r = lane; r < rows; r += 8) sum += to_f(dout[(size_t)r * oc + o]);
    part[lane][col] = sum;
    __syncthreads();
    if (lane == 0 && o < oc && s->apply != 0.0f) {
        float g = 0.0f;
        for (int l = 0; l < 8; l++) g += part[l][col];
        sgd_one(params, velocity, copy, (size_t)n + o, g, s, momentum, 0.0f);
    }
}

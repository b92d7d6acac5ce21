// Elementwise accumulation and scaling, and the scalar reductions (loss mean, squared gradient norm).
// Reductions run in a fixed order (no atomics), so they are deterministic run to run.

// dst += src.
extern "C" __global__ void accumulate_kernel(float* dst, const float* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

// dst += src over activations (a gradient reaching a value twice).
extern "C" __global__ void accumulate_act_kernel(act_t* dst, const act_t* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_f(to_f(dst[i]) + to_f(src[i]));
}

// accumulate_act_kernel and add_kernel, 4 elements per thread (n4 = n / 4 groups; n a
// multiple of 4, pointers aligned to 4 elements).
extern "C" __global__ void accumulate_act_vec4_kernel(act_t* dst, const act_t* src, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 d = load4(dst + 4 * i), s = load4(src + 4 * i);
    store4(dst + 4 * i, make_float4(d.x + s.x, d.y + s.y, d.z + s.z, d.w + s.w));
}
extern "C" __global__ void add_vec4_kernel(act_t* out, const act_t* a, const act_t* b, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 x = load4(a + 4 * i), y = load4(b + 4 * i);
    store4(out + 4 * i, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
}

// out = a + b over activations (the residual connection's forward, one pass instead of
// zero + two accumulates).
extern "C" __global__ void add_kernel(act_t* out, const act_t* a, const act_t* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f(to_f(a[i]) + to_f(b[i]));
}

// dst *= s.
extern "C" __global__ void scale_kernel(float* dst, int n, float s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] *= s;
}

// out[0] = mean(inp[0..n]); launched as one block.
extern "C" __global__ void mean_kernel(float* out, const float* inp, int n) {
    __shared__ float scratch[32];
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += inp[i];
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) out[0] = sum / n;
}

// partial[blockIdx.x] = Σ inp[i]² over this block's grid-stride share.
extern "C" __global__ void sum_squares_partial_kernel(float* partial, const float* inp, int n) {
    __shared__ float scratch[32];
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        sum += x * x;
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// out[0] += Σ partial[0..count]; launched as one block.
extern "C" __global__ void sum_squares_finish_kernel(float* out, const float* partial, int count) {
    __shared__ float scratch[32];
    float sum = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) out[0] += sum;
}

// out[c] += Σ_k partials[k, c] over `chunks` rows of partial column sums in a fixed order: the
// second pass of the bias and layernorm-parameter gradients. Block (32, 8), 32 columns a block;
// row lane j sums chunks j, j + 8, j + 16, ... in order, then lane 0 adds the eight lanes' sums in
// order (one thread a column walking every chunk in turn is latency-bound past a few dozen).
// gridDim.y = 2 or 3 finishes two or three reductions in one launch (the layernorm's dw and db,
// and the bias gradient from its dinp): blocks with blockIdx.y = j add the (j+1)-th `chunks` rows
// of partials into out2 (j = 1) or out3 (j = 2).
extern "C" __global__ void column_sums_finish_kernel(float* out, float* out2, float* out3, const float* partials,
                                                     int chunks, int C) {
    if (blockIdx.y > 0) {
        out = blockIdx.y == 1 ? out2 : out3;
        partials += (size_t)blockIdx.y * chunks * C;
    }
    __shared__ float part[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    float sum = 0.0f;
    if (c < C) {
#pragma unroll 4
        for (int k = ty; k < chunks; k += 8) sum += partials[(size_t)k * C + c];
    }
    part[ty][tx] = sum;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int j = 1; j < 8; j++) sum += part[j][tx];
        out[c] += sum;
    }
}

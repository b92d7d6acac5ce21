// What the matrix products need around cuBLAS: the bias add after the forward GEMM and
// the bias gradient (column sums of dout) in backward: each block of rows writes its partial
// sums, and column_sums_finish_kernel (reduce.cu) adds the blocks in order (no atomics).

// out (N, OC) += bias (OC), broadcast over rows.
extern "C" __global__ void add_bias_kernel(act_t* out, const act_t* bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = from_f(to_f(out[i]) + to_f(bias[i % OC]));
}

// partials[chunk, c] = Σ_rows of the chunk dout[row, c]. Block (32, 8) as in
// layernorm_backward_params_kernel; blockIdx.y is the chunk.
extern "C" __global__ void bias_backward_kernel(float* partials, const act_t* dout, int N, int OC,
                                                int rows_per_block) {
    __shared__ float part[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    float sum = 0.0f;
    if (c < OC) {
        for (int row = row_start + ty; row < row_end; row += blockDim.y) sum += to_f(dout[(size_t)row * OC + c]);
    }
    part[ty][tx] = sum;
    __syncthreads();
    if (ty == 0 && c < OC) {
        for (int k = 1; k < blockDim.y; k++) sum += part[k][tx];
        partials[(size_t)blockIdx.y * OC + c] = sum;
    }
}

// bias_backward_kernel for OC a multiple of 4 and dout aligned to 4 elements: each lane owns 4
// columns (one float4 per row, 512 bytes per warp), 8 warps take every 8th row of a chunk of
// `rows_per_block` rows, then column_sums_vec4_end (prelude) sums them into the chunk's
// partials and, with `tickets`, finishes the reduction into dbias in the same launch.
// Grid (ceil(OC/128), ceil(N/rows_per_block)), 256 threads.
extern "C" __global__ void bias_backward_vec4_kernel(float* dbias, float* partials, unsigned* tickets,
                                                     const act_t* dout, int N, int OC, int rows_per_block) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int c = (blockIdx.x * 32 + lane) * 4;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < OC) {
#pragma unroll 4
        for (int row = row_start + warp; row < row_end; row += 8) sum = add4(sum, load4(dout + (size_t)row * OC + c));
    }
    column_sums_vec4_end(sum, dbias, partials, tickets, OC, c);
}

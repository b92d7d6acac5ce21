// What the matrix products need around cuBLAS: the bias add after the forward GEMM and
// the bias gradient (column sums of dout) in backward.

// out (N, OC) += bias (OC), broadcast over rows.
extern "C" __global__ void add_bias_kernel(float* out, const float* bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] += bias[i % OC];
}

// dbias[c] += Σ_rows dout[row, c]. Block (32, 8) as in layernorm_backward_params_kernel.
extern "C" __global__ void bias_backward_kernel(float* dbias, const float* dout, int N, int OC,
                                                int rows_per_block) {
    __shared__ float part[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    float sum = 0.0f;
    if (c < OC) {
        for (int row = row_start + ty; row < row_end; row += blockDim.y) sum += dout[(size_t)row * OC + c];
    }
    part[ty][tx] = sum;
    __syncthreads();
    if (ty == 0 && c < OC) {
        for (int k = 1; k < blockDim.y; k++) sum += part[k][tx];
        atomicAdd(&dbias[c], sum);
    }
}

// Token + position embedding: out (B,T,C) = wte[tokens] + wpe[t]; backward scatters into
// both tables (atomics for wte, where one token can repeat; a loop over B for wpe).

extern "C" __global__ void encoder_forward_kernel(float* out, const int* tokens, const float* wte,
                                                  const float* wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % C);
    size_t bt = i / C;
    int t = (int)(bt % T);
    int token = tokens[bt];
    out[i] = wte[(size_t)token * C + c] + wpe[(size_t)t * C + c];
}

// dwte[tokens[b,t]] += dout[b,t]: one thread per element of dout.
extern "C" __global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* tokens,
                                                       int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % C);
    int token = tokens[i / C];
    atomicAdd(&dwte[(size_t)token * C + c], dout[i]);
}

// dwpe[t] += Σ_b dout[b,t]: one thread per (t, c), summing over B in a fixed order.
extern "C" __global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
    size_t n = (size_t)T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += dout[(size_t)b * T * C + i];
    dwpe[i] += sum;
}

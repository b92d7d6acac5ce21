// Token + position embedding: out (B,T,C) = wte[tokens] + wpe[t]; backward sums into both
// tables in a fixed order (no atomics): for wte each token's rows in the order of `order`
// (positions sorted by token), for wpe a loop over B.

extern "C" __global__ void encoder_forward_kernel(act_t* out, const int* tokens, const int* first_position,
                                                  const act_t* wte, const act_t* wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % C);
    size_t bt = i / C;
    int t = (int)(bt % T) + (first_position ? *first_position : 0);
    int token = tokens[bt];
    out[i] = from_f(to_f(wte[(size_t)token * C + c]) + to_f(wpe[(size_t)t * C + c]));
}

// dwte[token] += Σ dout[rows of that token]: thread (k, c) for the k-th position in
// `order` (positions sorted by token); the first position of each token's run sums the
// run's rows in order, the others return.
extern "C" __global__ void encoder_backward_wte_kernel(float* dwte, const act_t* dout, const int* tokens,
                                                       const int* order, int B, int T, int C) {
    size_t bt = (size_t)B * T;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= bt * C) return;
    int c = (int)(i % C);
    size_t k = i / C;
    int token = tokens[order[k]];
    if (k > 0 && tokens[order[k - 1]] == token) return;
    float sum = 0.0f;
    for (size_t j = k; j < bt && tokens[order[j]] == token; j++) sum += to_f(dout[(size_t)order[j] * C + c]);
    dwte[(size_t)token * C + c] += sum;
}

// dwpe[t] += Σ_b dout[b,t]: one thread per (t, c), summing over B in a fixed order.
extern "C" __global__ void encoder_backward_wpe_kernel(float* dwpe, const act_t* dout, int B, int T, int C) {
    size_t n = (size_t)T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += to_f(dout[(size_t)b * T * C + i]);
    dwpe[i] += sum;
}

// Causal self-attention around two batched cuBLAS GEMMs (llm.c's train_gpt2_fp32.cu):
// qkv (B,T,3,NH,HS) is permuted into q, k, v (B,NH,T,HS); att = softmax(scale·q·kᵀ) with a
// causal mask, kept as (B,NH,T,T); y = att·v is unpermuted back to (B,T,NH,HS).
// Also the flash backward's delta kernel (one small pass, shared by every head size).

// qkv (B,T,3,NH,HS) -> q, k, v (B,NH,T,HS).
extern "C" __global__ void attention_permute_kernel(float* q, float* k, float* v, const float* qkv,
                                                    int B, int T, int NH, int HS) {
    size_t n = (size_t)B * NH * T * HS;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int d = (int)(i % HS);
    int t = (int)((i / HS) % T);
    int h = (int)((i / ((size_t)HS * T)) % NH);
    int b = (int)(i / ((size_t)HS * T * NH));
    size_t C = (size_t)NH * HS;
    size_t src = ((size_t)b * T + t) * 3 * C + (size_t)h * HS + d;
    q[i] = qkv[src];
    k[i] = qkv[src + C];
    v[i] = qkv[src + 2 * C];
}

// dqkv (B,T,3,NH,HS) += dq, dk, dv (B,NH,T,HS).
extern "C" __global__ void attention_permute_backward_kernel(float* dqkv, const float* dq, const float* dk,
                                                             const float* dv, int B, int T, int NH, int HS) {
    size_t n = (size_t)B * NH * T * HS;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int d = (int)(i % HS);
    int t = (int)((i / HS) % T);
    int h = (int)((i / ((size_t)HS * T)) % NH);
    int b = (int)(i / ((size_t)HS * T * NH));
    size_t C = (size_t)NH * HS;
    size_t dst = ((size_t)b * T + t) * 3 * C + (size_t)h * HS + d;
    dqkv[dst] += dq[i];
    dqkv[dst + C] += dk[i];
    dqkv[dst + 2 * C] += dv[i];
}

// y (B,NH,T,HS) -> out (B,T,NH,HS).
extern "C" __global__ void attention_unpermute_kernel(float* out, const float* y, int B, int T, int NH, int HS) {
    size_t n = (size_t)B * NH * T * HS;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int d = (int)(i % HS);
    int t = (int)((i / HS) % T);
    int h = (int)((i / ((size_t)HS * T)) % NH);
    int b = (int)(i / ((size_t)HS * T * NH));
    out[(((size_t)b * T + t) * NH + h) * HS + d] = y[i];
}

// dout (B,T,NH,HS) -> dy (B,NH,T,HS) (overwrites dy, a scratch buffer).
extern "C" __global__ void attention_unpermute_backward_kernel(float* dy, const float* dout, int B, int T, int NH,
                                                               int HS) {
    size_t n = (size_t)B * NH * T * HS;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int d = (int)(i % HS);
    int t = (int)((i / HS) % T);
    int h = (int)((i / ((size_t)HS * T)) % NH);
    int b = (int)(i / ((size_t)HS * T * NH));
    dy[i] = dout[(((size_t)b * T + t) * NH + h) * HS + d];
}

// In place over rows of att (B·NH·T rows of T): att[i][j] = softmax_j≤i(scale · pre[i][j]),
// and 0 above the diagonal. One warp per row; each lane reads and writes only its own
// elements, so in place is safe.
extern "C" __global__ void attention_softmax_forward_kernel(float* att, int rows, int T, float scale) {
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;
    int t = row % T;  // query position: keys 0..=t are visible
    float* x = att + (size_t)row * T;
    float maxval = NEG_INF;
    for (int j = lane; j <= t; j += WARP_SIZE) maxval = fmaxf(maxval, scale * x[j]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += WARP_SIZE) sum += expf(scale * x[j] - maxval);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += WARP_SIZE) x[j] = j <= t ? expf(scale * x[j] - maxval) * inv : 0.0f;
}

// In place: datt -> dpre = scale · att ⊙ (datt - Σ_j att·datt), 0 above the diagonal.
extern "C" __global__ void attention_softmax_backward_kernel(float* datt, const float* att, int rows, int T,
                                                             float scale) {
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;
    int t = row % T;
    size_t off = (size_t)row * T;
    const float* a = att + off;
    float* g = datt + off;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += WARP_SIZE) dot += a[j] * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += WARP_SIZE) g[j] = j <= t ? scale * a[j] * (g[j] - dot) : 0.0f;
}

// delta (B·NH, T) = Σ_d dout · out per row and head (FlashAttention's D). One warp per position
// (b, t): the lanes read each head's HS values side by side (coalesced), the heads in turn.
extern "C" __global__ void flash_backward_delta_kernel(float* delta, const act_t* dout, const act_t* out, int B,
                                                       int T, int NH, int HS) {
    int lane = threadIdx.x % WARP_SIZE;
    size_t bt = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;  // b·T + t
    if (bt >= (size_t)B * T) return;
    int b = (int)(bt / T), r = (int)(bt % T);
    for (int h = 0; h < NH; h++) {
        size_t off = (bt * NH + h) * HS;
        float sum = 0.0f;
        for (int d = lane; d < HS; d += WARP_SIZE) sum += to_f(dout[off + d]) * to_f(out[off + d]);
        sum = warp_sum(sum);
        if (lane == 0) delta[((size_t)b * NH + h) * T + r] = sum;
    }
}

// flash_backward_delta_kernel with 8 values a thread, loaded as two 4-wide vectors of each input:
// the HS / 8 threads of a head's row (HS a multiple of 8, HS / 8 a power of two up to 32, rows
// aligned to 8 values) sum their values in order, then add across the row by shuffles. One
// thread a head would be a chain of dependent 2-byte loads per head, about twice the time of
// moving the bytes.
extern "C" __global__ void flash_backward_delta_vec8_kernel(float* delta, const act_t* dout, const act_t* out, int B,
                                                            int T, int NH, int HS) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // values 8i .. 8i + 7
    size_t n8 = (size_t)B * T * NH * HS / 8;
    int group = HS / 8;
    float sum = 0.0f;
    if (i < n8) {
        float4 g0 = load4(dout + 8 * i), g1 = load4(dout + 8 * i + 4);
        float4 o0 = load4(out + 8 * i), o1 = load4(out + 8 * i + 4);
        sum = g0.x * o0.x + g0.y * o0.y + g0.z * o0.z + g0.w * o0.w;
        sum += g1.x * o1.x + g1.y * o1.y + g1.z * o1.z + g1.w * o1.w;
    }
    // Every lane of the warp takes part (groups never straddle a warp: group divides 32).
    for (int s = group / 2; s > 0; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (i < n8 && i % group == 0) {
        size_t row = i / group;  // (b·T + t)·NH + h
        size_t bt = row / NH;
        int h = (int)(row % NH), b = (int)(bt / T), r = (int)(bt % T);
        delta[((size_t)b * NH + h) * T + r] = sum;
    }
}

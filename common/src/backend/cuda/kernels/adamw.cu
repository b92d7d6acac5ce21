// Gradient clipping factor and the AdamW and SGD updates, both reading their scalars from device
// memory so that a step needs no host round trip.

// out[0] = ||g|| = sqrt(sumsq[0]); out[1] = max_norm / (||g|| + 1e-6) when ||g|| > max_norm > 0,
// else 1 (PyTorch's clip_grad_norm_). One thread.
extern "C" __global__ void clip_factor_kernel(float* out, const float* sumsq, float max_norm) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float norm = sqrtf(sumsq[0]);
    out[0] = norm;
    out[1] = (max_norm > 0.0f && norm > max_norm) ? max_norm / (norm + 1e-6f) : 1.0f;
}

// g = grads · grad_scale[0]; m, v moments; decoupled weight decay (Loshchilov & Hutter).
// bias1 = 1 - beta1^t and bias2 = 1 - beta2^t come from the host.
// With `copy` (not null), the updated parameter is also written there rounded to bf16: the
// weight copy a bf16 forward pass reads, in the same pass over memory.
extern "C" __global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int n,
                                        const float* grad_scale, float lr, float beta1, float beta2,
                                        float eps, float weight_decay, float bias1, float bias2,
                                        bf16_t* copy) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grads[i] * grad_scale[0];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float m_hat = mi / bias1;
    float v_hat = vi / bias2;
    float p = params[i];
    p -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p);
    params[i] = p;
    if (copy) copy[i] = to_bf16(p);
}

// SGD with momentum (PyTorch's form, no dampening), the MLP workload's optimiser:
// g = grads · grad_scale[0] + weight_decay · p; velocity = momentum · velocity + g; p -= lr · velocity.
// With `copy` (not null), the updated parameter is also written there rounded to bf16.
extern "C" __global__ void sgd_kernel(float* params, const float* grads, float* velocity, int n,
                                      const float* grad_scale, float lr, float momentum,
                                      float weight_decay, bf16_t* copy) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p = params[i];
    float g = grads[i] * grad_scale[0] + weight_decay * p;
    float v = momentum * velocity[i] + g;
    velocity[i] = v;
    p -= lr * v;
    params[i] = p;
    if (copy) copy[i] = to_bf16(p);
}

// dst = bf16(src), rounded to nearest even.
extern "C" __global__ void round_to_bf16_kernel(bf16_t* dst, const float* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = to_bf16(src[i]);
}

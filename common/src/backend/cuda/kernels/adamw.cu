// The step's scalars and the AdamW and SGD updates, all on the device, so that a step needs no
// host round trip and can be recorded once and replayed (a CUDA graph).

// StepState (the optimiser's per-step scalars) is in the prelude: mlp.cu reads it too.

// Norm, clipping factor (max_norm / (norm + 1e-6) when norm > max_norm > 0, else 1: PyTorch's
// clip_grad_norm_), mean loss, apply; (loss, norm) into history[step mod len]. One thread.
extern "C" __global__ void step_stats_kernel(StepState* s, float* history, int history_len, float max_norm,
                                             float loss_scale) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float norm = sqrtf(s->sumsq);
    float loss = s->loss * loss_scale;
    s->norm = norm;
    s->clip = (max_norm > 0.0f && norm > max_norm) ? max_norm / (norm + 1e-6f) : 1.0f;
    s->loss = loss;
    s->apply = (isfinite(loss) && isfinite(norm)) ? 1.0f : 0.0f;
    float* slot = history + 2 * (s->step % (unsigned)history_len);
    slot[0] = loss;
    slot[1] = norm;
}

// The weight-decay segments of a parameter buffer, passed by value in the launch (ops.rs's
// decay_table): segment k covers [end[k-1], end[k]) and decays when bit k of `decay` is set.
#define DECAY_SEGMENTS 256
struct DecaySegments {
    unsigned count;
    unsigned end[DECAY_SEGMENTS];
    unsigned decay[DECAY_SEGMENTS / 32];
};

// Whether parameter i decays: the segment holding it by binary search (the table stays in the
// launch's constant bank: __grid_constant__, never copied per thread).
__device__ __forceinline__ bool decays(const DecaySegments& s, unsigned i) {
    unsigned lo = 0, hi = s.count - 1;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (s.end[mid] > i) hi = mid;
        else lo = mid + 1;
    }
    return (s.decay[lo / 32] >> (lo % 32)) & 1u;
}

// One parameter's AdamW update: g = grad · clip; m, v moments; decoupled weight decay
// (Loshchilov & Hutter) at rate `wd`, with the learning rate and bias corrections of the step's
// state.
__device__ __forceinline__ void adamw_update(float& p, float& mi, float& vi, float grad, float wd, const StepState* s,
                                             float beta1, float beta2, float eps) {
    float g = grad * s->clip;
    mi = beta1 * mi + (1.0f - beta1) * g;
    vi = beta2 * vi + (1.0f - beta2) * g * g;
    float m_hat = mi / s->bias1;
    float v_hat = vi / s->bias2;
    p -= s->lr * (m_hat / (sqrtf(v_hat) + eps) + wd * p);
}

// One pass over the whole parameter buffer, four parameters a thread (with `vec`, 16-byte loads
// and stores: the buffers aligned to 4 values; else, and for the last n mod 4, one at a time);
// nothing when the step is skipped. Weight decay where the parameter's segment decays. With
// `copy` (not null), the updated parameter is also written there rounded to bf16: the weight
// copy a bf16 forward pass reads, in the same pass over memory.
extern "C" __global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int n,
                                        const StepState* s, float beta1, float beta2, float eps,
                                        float weight_decay, bf16_t* copy, int vec,
                                        const __grid_constant__ DecaySegments segments) {
    int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n || s->apply == 0.0f) return;
    if (!vec || i + 4 > n) {
        for (int end = min(i + 4, n); i < end; i++) {
            float p = params[i], mi = m[i], vi = v[i];
            adamw_update(p, mi, vi, grads[i], decays(segments, (unsigned)i) ? weight_decay : 0.0f, s, beta1, beta2, eps);
            m[i] = mi;
            v[i] = vi;
            params[i] = p;
            if (copy) copy[i] = to_bf16(p);
        }
        return;
    }
    float4 p4 = load4(params + i), g4 = load4(grads + i), m4 = load4(m + i), v4 = load4(v + i);
    float p[4] = {p4.x, p4.y, p4.z, p4.w}, g[4] = {g4.x, g4.y, g4.z, g4.w};
    float mi[4] = {m4.x, m4.y, m4.z, m4.w}, vi[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float wd = decays(segments, (unsigned)(i + k)) ? weight_decay : 0.0f;
        adamw_update(p[k], mi[k], vi[k], g[k], wd, s, beta1, beta2, eps);
    }
    store4(m + i, make_float4(mi[0], mi[1], mi[2], mi[3]));
    store4(v + i, make_float4(vi[0], vi[1], vi[2], vi[3]));
    float4 out = make_float4(p[0], p[1], p[2], p[3]);
    store4(params + i, out);
    if (copy) store4(copy + i, out);
}

// SGD with momentum (PyTorch's form): g = grads · clip + weight_decay · p, v = momentum · v + g,
// p -= lr · v, with the step state's learning rate and clipping factor; nothing when the step
// is skipped. `copy` as in adamw_kernel.
extern "C" __global__ void sgd_kernel(float* params, const float* grads, float* velocity, int n,
                                      const StepState* s, float momentum, float weight_decay,
                                      bf16_t* copy) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || s->apply == 0.0f) return;
    float p = params[i];
    float g = grads[i] * s->clip + weight_decay * p;
    float v = momentum * velocity[i] + g;
    velocity[i] = v;
    p -= s->lr * v;
    params[i] = p;
    if (copy) copy[i] = to_bf16(p);
}

// dst = bf16(src), rounded to nearest even.
extern "C" __global__ void round_to_bf16_kernel(bf16_t* dst, const float* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = to_bf16(src[i]);
}

// dst = float(src), exact (gradients summed in bf16, back into f32).
extern "C" __global__ void widen_bf16_kernel(float* dst, const bf16_t* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = to_f(src[i]);
}

// GELU, tanh approximation (GPT-2's), elementwise; backward accumulates into dinp.

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

extern "C" __global__ void gelu_forward_kernel(act_t* out, const act_t* inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_f(inp[i]);
    float cube = 0.044715f * x * x * x;
    out[i] = from_f(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube))));
}

extern "C" __global__ void gelu_backward_kernel(act_t* dinp, const act_t* inp, const act_t* dout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_f(inp[i]);
    float cube = 0.044715f * x * x * x;
    float tanh_arg = GELU_SCALE * (x + cube);
    float tanh_out = tanhf(tanh_arg);
    float sech2 = 1.0f - tanh_out * tanh_out;
    float local_grad = 0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = from_f(to_f(dinp[i]) + local_grad * to_f(dout[i]));
}

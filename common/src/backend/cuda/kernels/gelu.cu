// The activations, elementwise: GELU, tanh approximation (GPT-2's), and ReLU (the MLP
// workload's); backward accumulates into dinp, except the in-place GELU backward.

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

__device__ __forceinline__ float gelu(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

__device__ __forceinline__ float gelu_grad(float x) {
    float cube = 0.044715f * x * x * x;
    float tanh_out = tanhf(GELU_SCALE * (x + cube));
    float sech2 = 1.0f - tanh_out * tanh_out;
    return 0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

// 4 elements per thread (n4 = n / 4 groups; n a multiple of 4, pointers aligned to 4 elements).
extern "C" __global__ void gelu_forward_vec4_kernel(act_t* out, const act_t* inp, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 x = load4(inp + 4 * i);
    store4(out + 4 * i, make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w)));
}

extern "C" __global__ void gelu_backward_vec4_kernel(act_t* dinp, const act_t* inp, const act_t* dout, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 x = load4(inp + 4 * i), g = load4(dout + 4 * i), d = load4(dinp + 4 * i);
    store4(dinp + 4 * i, make_float4(d.x + gelu_grad(x.x) * g.x, d.y + gelu_grad(x.y) * g.y,
                                     d.z + gelu_grad(x.z) * g.z, d.w + gelu_grad(x.w) * g.w));
}

// d = gelu'(inp) * d, in place (overwrites): the MLP's d(pre) from d(act) when GELU is not
// fused into the GEMM's epilogue.
extern "C" __global__ void gelu_backward_in_place_vec4_kernel(act_t* d, const act_t* inp, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 x = load4(inp + 4 * i), g = load4(d + 4 * i);
    store4(d + 4 * i, make_float4(gelu_grad(x.x) * g.x, gelu_grad(x.y) * g.y, gelu_grad(x.z) * g.z,
                                  gelu_grad(x.w) * g.w));
}

// gelu_backward_in_place then quantize_fp8 of its result, in one pass (FP8's d(pre)): d =
// gelu'(inp) * d rounded to act_t, and dst = fp8(d * scale[0]) of the rounded values, with
// amax as quantize_fp8_kernel's: the two kernels' bits. Where `act` is not null, also
// gelu_forward_kernel's act = gelu(inp) (the hidden activation, which FP8's forward keeps only
// in FP8, rebuilt for the weight gradient). Eight values a step of a grid-stride loop; n a
// multiple of 8, d, inp and act aligned to 8 elements, dst to 8 bytes.
extern "C" __global__ void gelu_backward_quantize_kernel(act_t* d, const act_t* inp, unsigned char* dst, float* amax,
                                                         const float* scale, act_t* act, int n, int e5m2) {
    __shared__ unsigned warp_top[32];
    float s = scale[0];
    unsigned top = 0;
    long long stride = 8LL * gridDim.x * blockDim.x;
    for (long long i = 8 * ((long long)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float x[8], g[8];
        load8(inp + i, x);
        load8(d + i, g);
#pragma unroll
        for (int k = 0; k < 8; k++) g[k] = to_f(from_f(gelu_grad(x[k]) * g[k]));
        store8(d + i, g);
        *reinterpret_cast<uint2*>(dst + i) = fp8x8(g, s, e5m2, top);
        if (act) {
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = gelu(x[k]);
            store8(act + i, x);
        }
    }
    amax_atomic(amax, top, warp_top);
}

// gelu_backward_quantize_kernel with the bias gradient of the product whose output gradient the
// new d is (the MLP's first): dbias (H) += its column sums over the N rows, as stored (rounded to
// act_t), summed as bias_backward_vec4_kernel sums them (the same bits as that kernel after the
// one-pass kernel). Its layout: grid (ceil(H/128), ceil(N/rows_per_block)), 256 threads, a lane's
// 4 columns, warp w on rows w, w + 8, ... of the block's chunk; H a multiple of 4, d, inp and act
// aligned to 4 elements, dst to 4 bytes; partials, tickets as there.
extern "C" __global__ void gelu_backward_quantize_sums_kernel(act_t* d, const act_t* inp, unsigned char* dst,
                                                              float* amax, const float* scale, act_t* act,
                                                              float* dbias, float* partials, unsigned* tickets,
                                                              int N, int H, int rows_per_block, int e5m2) {
    __shared__ unsigned warp_top[8];
    float s = scale[0];
    unsigned top = 0;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int c = (blockIdx.x * 32 + lane) * 4;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < H) {
#pragma unroll 2
        for (int row = row_start + warp; row < row_end; row += 8) {
            size_t i = (size_t)row * H + c;
            float4 x = load4(inp + i), g = load4(d + i);
            g = make_float4(to_f(from_f(gelu_grad(x.x) * g.x)), to_f(from_f(gelu_grad(x.y) * g.y)),
                            to_f(from_f(gelu_grad(x.z) * g.z)), to_f(from_f(gelu_grad(x.w) * g.w)));
            store4(d + i, g);
            sum = add4(sum, g);
            *reinterpret_cast<unsigned*>(dst + i) = fp8x4(g, s, e5m2, top);
            if (act) store4(act + i, make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w)));
        }
    }
    amax_atomic(amax, top, warp_top);
    column_sums_vec4_end(sum, dbias, partials, tickets, H, c);
}

extern "C" __global__ void gelu_backward_in_place_kernel(act_t* d, const act_t* inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = from_f(gelu_grad(to_f(inp[i])) * to_f(d[i]));
}

extern "C" __global__ void gelu_forward_kernel(act_t* out, const act_t* inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f(gelu(to_f(inp[i])));
}

extern "C" __global__ void gelu_backward_kernel(act_t* dinp, const act_t* inp, const act_t* dout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] = from_f(to_f(dinp[i]) + gelu_grad(to_f(inp[i])) * to_f(dout[i]));
}

extern "C" __global__ void relu_forward_kernel(act_t* out, const act_t* inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f(fmaxf(to_f(inp[i]), 0.0f));
}

// dinp += dout where x > 0 (the gradient at 0 taken as 0, as PyTorch does).
extern "C" __global__ void relu_backward_kernel(act_t* dinp, const act_t* inp, const act_t* dout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && to_f(inp[i]) > 0.0f) dinp[i] = from_f(to_f(dinp[i]) + to_f(dout[i]));
}

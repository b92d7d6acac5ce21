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

// FP8's gelu' when the MLP's weight gradients are FP8 products (Backend::gelu_backward_fp8):
// from the output gradient d(act) in `d` and pre in `inp`, both (N, H), d(pre) = gelu'(pre) *
// d(act) rounded to act_t (gelu_backward_in_place's values), written only in FP8: as stored in
// `dst` and transposed (H, N) in `dst_t`, at scale[0], its amax into amax; act = gelu(pre)
// rounded to act_t (gelu_forward's values) transposed into `act_t` at act_scale[0], its amax
// into act_amax; where dbias is not null, d(pre)'s column sums added there as
// bias_backward_vec4_kernel sums them (the same bits). The column sums' layout: grid
// (ceil(H/128), ceil(N/rows_per_block)), 256 threads, a lane's 4 columns, warp w on rows w,
// w + 8, ... of the block's chunk, taken 32 rows at a time, the next group's rows loaded while
// this one's are written: the transposed copies' bytes gather in shared memory as
// [column][row] (two buffers, so one barrier a group) and leave as 32-byte runs along the
// copies' rows. N and rows_per_block multiples of 32, H of 4; d and inp aligned to 4
// elements, dst to 4 bytes, dst_t and act_t to 16.
extern "C" __global__ void gelu_backward_fp8_kernel(const act_t* d, const act_t* inp, unsigned char* dst,
                                                    unsigned char* dst_t, float* amax, const float* scale, int e5m2,
                                                    unsigned char* act_t, float* act_amax, const float* act_scale,
                                                    int act_e5m2, float* dbias, float* partials, unsigned* tickets,
                                                    int N, int H, int rows_per_block) {
    __shared__ unsigned warp_top[2][8];
    // A 32-row group's transposed bytes: [buffer][copy][column][row], rows 36 bytes apart (the
    // 16-byte reads below stay 4-byte aligned; the byte stores meet at most four to a bank).
    __shared__ __align__(16) unsigned char tile[2][2][128][36];
    float s = scale[0], sa = act_scale[0];
    unsigned top = 0, act_top = 0;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int c = (blockIdx.x * 32 + lane) * 4, col0 = blockIdx.x * 128;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    bool mine = c < H;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    raw4_t xr[4], gr[4];
    if (mine) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            size_t i = (size_t)(row_start + warp + 8 * j) * H + c;
            xr[j] = load_raw4(inp + i);
            gr[j] = load_raw4(d + i);
        }
    }
    for (int r0 = row_start, buf = 0; r0 < row_end; r0 += 32, buf ^= 1) {
        bool more = mine && r0 + 32 < row_end;
        raw4_t xn[4], gn[4];
        if (more) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                size_t i = (size_t)(r0 + 32 + warp + 8 * j) * H + c;
                xn[j] = load_raw4(inp + i);
                gn[j] = load_raw4(d + i);
            }
        }
        if (mine) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int lr = warp + 8 * j;
                float4 x = unpack4(xr[j]), g = unpack4(gr[j]);
                g = make_float4(to_f(from_f(gelu_grad(x.x) * g.x)), to_f(from_f(gelu_grad(x.y) * g.y)),
                                to_f(from_f(gelu_grad(x.z) * g.z)), to_f(from_f(gelu_grad(x.w) * g.w)));
                sum = add4(sum, g);
                unsigned q = fp8x4(g, s, e5m2, top);
                *reinterpret_cast<unsigned*>(dst + (size_t)(r0 + lr) * H + c) = q;
                float4 a = make_float4(to_f(from_f(gelu(x.x))), to_f(from_f(gelu(x.y))), to_f(from_f(gelu(x.z))),
                                       to_f(from_f(gelu(x.w))));
                unsigned qa = fp8x4(a, sa, act_e5m2, act_top);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    tile[buf][0][4 * lane + k][lr] = (unsigned char)(q >> (8 * k));
                    tile[buf][1][4 * lane + k][lr] = (unsigned char)(qa >> (8 * k));
                }
            }
        }
        __syncthreads();  // this buffer is whole; the other was last read before this barrier
        // Two copies x 128 columns x 32 rows: 16 bytes a thread, twice.
#pragma unroll
        for (int t = threadIdx.x; t < 512; t += 256) {
            int which = t / 256, col = (t % 256) / 2, half = t % 2;
            if (col0 + col < H) {
                const unsigned* from = reinterpret_cast<const unsigned*>(&tile[buf][which][col][16 * half]);
                uint4 v = make_uint4(from[0], from[1], from[2], from[3]);
                unsigned char* to = (which ? act_t : dst_t) + (size_t)(col0 + col) * N + r0 + 16 * half;
                *reinterpret_cast<uint4*>(to) = v;
            }
        }
        if (more) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                xr[j] = xn[j];
                gr[j] = gn[j];
            }
        }
    }
    amax_atomic(amax, top, warp_top[0]);
    amax_atomic(act_amax, act_top, warp_top[1]);
    if (dbias) column_sums_vec4_end(sum, dbias, partials, tickets, H, c);
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

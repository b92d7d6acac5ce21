// FP8 quantization (E4M3, E5M2; fp8x2 and amax_atomic in the prelude): values scaled, rounded
// to nearest even and saturated to the format's largest finite value by the hardware's
// conversion (Ada and Hopper on: sm_89+), and their largest magnitude, the statistic a delayed
// scale is made from.

// dst[i] = fp8(src[i] * scale[0]); amax[0] = max(amax[0], |src[i]|), compared as bits (the
// order of non-negative floats, NaN above all), so the result does not depend on the order
// the atomics land in. Eight values a step of a grid-stride loop; `vec`: src and dst aligned to
// 16 and 8 bytes and n a multiple of 8 (one 16-byte load and one 8-byte store a step), else one
// value at a time. One atomic a block.
extern "C" __global__ void quantize_fp8_kernel(unsigned char* dst, float* amax, const act_t* src, const float* scale,
                                               int n, int e5m2, int vec) {
    __shared__ unsigned warp_top[32];
    float s = scale[0];
    unsigned top = 0;
    long long stride = 8LL * gridDim.x * blockDim.x;
    for (long long i = 8 * ((long long)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        if (vec) {
            float v[8];
            load8(src + i, v);
            *reinterpret_cast<uint2*>(dst + i) = fp8x8(v, s, e5m2, top);
        } else {
            for (long long j = i; j < i + 8 && j < n; j++) {
                float x = to_f(src[j]);
                top = max(top, __float_as_uint(fabsf(x)));
                dst[j] = (unsigned char)(fp8x2(x * s, 0.0f, e5m2) & 0xff);
            }
        }
    }
    amax_atomic(amax, top, warp_top);
}

#define FP8_T_ROWS 32

// dst (cols, rows) = fp8(src (rows, cols)^T * scale[0]); amax as quantize_fp8_kernel's. A
// block of 32 x 8 threads covers 32 columns and FP8_T_ROWS rows (one 32 x 32 tile: blocks
// enough to fill the GPU at a weight's size), 32 x 32 through shared memory at a time: loads
// along src's rows, stores along dst's.
extern "C" __global__ void quantize_fp8_transposed_kernel(unsigned char* dst, float* amax, const act_t* src,
                                                          const float* scale, int rows, int cols, int e5m2) {
    __shared__ float tile[32][33];
    __shared__ unsigned warp_top[8];
    float s = scale[0];
    unsigned top = 0;
    int c0 = blockIdx.x * 32;
    for (int r0 = blockIdx.y * FP8_T_ROWS; r0 < min(rows, (int)(blockIdx.y + 1) * FP8_T_ROWS); r0 += 32) {
        for (int i = threadIdx.y; i < 32; i += 8) {
            int r = r0 + i, c = c0 + threadIdx.x;
            float x = 0.0f;
            if (r < rows && c < cols) {
                x = to_f(src[(long long)r * cols + c]);
                top = max(top, __float_as_uint(fabsf(x)));
            }
            tile[i][threadIdx.x] = x;
        }
        __syncthreads();
        for (int i = threadIdx.y; i < 32; i += 8) {
            int c = c0 + i, r = r0 + threadIdx.x;
            if (r < rows && c < cols)
                dst[(long long)c * rows + r] = (unsigned char)(fp8x2(tile[threadIdx.x][i] * s, 0.0f, e5m2) & 0xff);
        }
        __syncthreads();
    }
    amax_atomic(amax, top, warp_top);
}

// quantize_fp8_transposed_kernel where rows and cols are multiples of 8, src is 16-byte aligned
// and dst 8-byte aligned (every weight of an FP8 model): a block of 32 x 8 threads takes a
// 64 x 64 tile, loading 8 values (16 bytes) a thread along src's rows and storing 8 bytes a
// thread along dst's rows, through a tile of FP8 bytes in shared memory (rows 68 bytes apart:
// the column reads of the stores meet at most 2 to a bank). Where `plain` is not null, the
// values also go there as stored (quantize_fp8_kernel's copy, 8-byte aligned), from the loads.
extern "C" __global__ void quantize_fp8_transposed_vec_kernel(unsigned char* dst, unsigned char* plain, float* amax,
                                                              const act_t* src, const float* scale, int rows,
                                                              int cols, int e5m2) {
    __shared__ unsigned tile[64][17];  // 64 rows of 64 FP8 values, 4 bytes of padding each
    __shared__ unsigned warp_top[8];
    unsigned char* bytes = reinterpret_cast<unsigned char*>(tile);
    float s = scale[0];
    unsigned top = 0;
    int r0 = blockIdx.y * 64, c0 = blockIdx.x * 64, t = threadIdx.y * 32 + threadIdx.x;
    for (int k = t; k < 512; k += 256) {
        int i = k / 8, j = (k % 8) * 8;  // the tile's row, its first column
        uint2 w = make_uint2(0, 0);
        if (r0 + i < rows && c0 + j < cols) {
            long long at = (long long)(r0 + i) * cols + c0 + j;
            float v[8];
            load8(src + at, v);
            w = fp8x8(v, s, e5m2, top);
            if (plain) *reinterpret_cast<uint2*>(plain + at) = w;
        }
        tile[i][j / 4] = w.x;
        tile[i][j / 4 + 1] = w.y;
    }
    __syncthreads();
    for (int k = t; k < 512; k += 256) {
        int j = k / 8, i = (k % 8) * 8;  // the tile's column (a row of dst), its first row
        if (c0 + j < cols && r0 + i < rows) {
            unsigned w[2] = {0, 0};
#pragma unroll
            for (int q = 0; q < 8; q++) w[q / 4] |= (unsigned)bytes[(i + q) * 68 + j] << (8 * (q % 4));
            *reinterpret_cast<uint2*>(dst + (long long)(c0 + j) * rows + r0 + i) = make_uint2(w[0], w[1]);
        }
    }
    amax_atomic(amax, top, warp_top);
}

// cuBLASLt's FP8 output (the MLP's first product writing gelu(pre) in E4M3) reads its scale and
// sets, rather than raises, its amax, each at a 16-byte aligned word, which a slot's scale and
// amax are not. Before the product: the slot's scale into staged[0], staged[4] cleared for the
// amax. One thread.
extern "C" __global__ void fp8_stage_scale_kernel(float* staged, const float* scale) {
    staged[0] = scale[0];
    staged[4] = 0.0f;
}

// After it: the product's amax (staged[4]) raised into the slot's, compared as bits as
// amax_atomic does. One thread.
extern "C" __global__ void fp8_fold_amax_kernel(float* amax, const float* staged) {
    unsigned* a = reinterpret_cast<unsigned*>(amax);
    *a = max(*a, __float_as_uint(staged[4]));
}

// Delayed scaling's step, one thread a slot [dequant, scale, amax, max] with its history of
// `len` amax values (newest first): fp8_rescale_slot in backend/mod.rs, bit for bit.
extern "C" __global__ void fp8_rescale_kernel(float* slots, float* history, int n, int len) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float* slot = slots + 4 * (long long)i;
    float* h = history + (long long)i * len;
    float a = slot[2];
    if (isfinite(a) && len > 0) {
        for (int k = len - 1; k > 0; k--) h[k] = h[k - 1];
        h[0] = a;
    }
    slot[2] = 0.0f;
    float top = 0.0f;
    for (int k = 0; k < len; k++) top = fmaxf(top, h[k]);
    if (top > 0.0f) {
        float ratio = slot[3] / top;
        int e = (int)((__float_as_uint(ratio) >> 23) & 0xff) - 127;
        e = max(-126, min(126, e));
        slot[1] = __uint_as_float((unsigned)(e + 127) << 23);
        slot[0] = __uint_as_float((unsigned)(127 - e) << 23);
    }
}

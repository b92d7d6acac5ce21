// FP8 quantization (E4M3, E5M2): values scaled, rounded to nearest even and saturated to the
// format's largest finite value by the hardware's conversion (Ada and Hopper on: sm_89+), and
// their largest magnitude, the statistic a delayed scale is made from.

// Two floats as two FP8 values, `lo` in the low byte (the lower address).
__device__ __forceinline__ unsigned short fp8x2(float lo, float hi, int e5m2) {
    unsigned short r = 0;
#if __CUDA_ARCH__ >= 890
    if (e5m2) {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    }
#else
    __trap();  // the Rust side runs FP8 only where the GPU has it (Backend::fp8)
#endif
    return r;
}

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
            unsigned w[2] = {0, 0};
#pragma unroll
            for (int k = 0; k < 8; k += 2) {
                top = max(top, max(__float_as_uint(fabsf(v[k])), __float_as_uint(fabsf(v[k + 1]))));
                w[k / 4] |= (unsigned)fp8x2(v[k] * s, v[k + 1] * s, e5m2) << (16 * ((k / 2) % 2));
            }
            *reinterpret_cast<uint2*>(dst + i) = make_uint2(w[0], w[1]);
        } else {
            for (long long j = i; j < i + 8 && j < n; j++) {
                float x = to_f(src[j]);
                top = max(top, __float_as_uint(fabsf(x)));
                dst[j] = (unsigned char)(fp8x2(x * s, 0.0f, e5m2) & 0xff);
            }
        }
    }
    // The block's largest, then one atomic.
    top = __reduce_max_sync(FULL_MASK, top);
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) warp_top[warp] = top;
    __syncthreads();
    if (warp == 0) {
        top = lane < (int)(blockDim.x / WARP_SIZE) ? warp_top[lane] : 0;
        top = __reduce_max_sync(FULL_MASK, top);
        if (lane == 0 && top != 0) atomicMax(reinterpret_cast<unsigned*>(amax), top);
    }
}

// The block's largest of each thread's `top`, then one atomic into amax (blockDim.x a warp).
__device__ __forceinline__ void block_amax(float* amax, unsigned top, unsigned* warp_top) {
    top = __reduce_max_sync(FULL_MASK, top);
    int lane = threadIdx.x, warp = threadIdx.y;
    if (lane == 0) warp_top[warp] = top;
    __syncthreads();
    if (warp == 0) {
        top = lane < (int)blockDim.y ? warp_top[lane] : 0;
        top = __reduce_max_sync(FULL_MASK, top);
        if (lane == 0 && top != 0) atomicMax(reinterpret_cast<unsigned*>(amax), top);
    }
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
    block_amax(amax, top, warp_top);
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

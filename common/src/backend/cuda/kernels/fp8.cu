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

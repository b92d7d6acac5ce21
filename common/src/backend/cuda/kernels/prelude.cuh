// Prepended by the Rust side to every kernel file before NVRTC compiles it (NVRTC has no
// include path, so this stands in for a shared header): warp and block reductions, element
// types, the optimiser's step state.

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // no math.h, so no INFINITY

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` holds 32 floats of shared memory.
__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int warps = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int warps = blockDim.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// ---- softmax statistics in one pass (crossentropy.cu, mlp.cu) -------------------------
// Merges running (max, sum) pairs: the sums are rescaled to the larger max.
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    s = (m == NEG_INF ? 0.0f : s * expf(m - mn)) + (m2 == NEG_INF ? 0.0f : s2 * expf(m2 - mn));
    m = mn;
}

// Adds v to a running (max, sum).
__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else {
        s += expf(v - m);
    }
}

// 2^x by the hardware's approximation (relative error ~2^-22; subnormal results flushed to 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- element types -------------------------------------------------------------------
// bf16 as its bits in a struct, so that arithmetic on it does not compile: every use goes
// through to_f / from_f (no cuda_bf16.h: NVRTC has no include path).
struct bf16_t {
    unsigned short bits;
};
__device__ __forceinline__ float to_f(bf16_t x) { return __uint_as_float(((unsigned)x.bits) << 16); }
__device__ __forceinline__ float to_f(float x) { return x; }
// Round to nearest even (the hardware conversion; NaN stays NaN).
__device__ __forceinline__ bf16_t to_bf16(float x) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

// act_t: what activations, their gradients and the forward pass's weights are stored as,
// fixed when the Rust side compiles the kernels (ACT_BF16 is defined before this prelude).
// Arithmetic is always in f32: load with to_f, store with store_act.
#if ACT_BF16
typedef bf16_t act_t;
__device__ __forceinline__ act_t from_f(float x) { return to_bf16(x); }
#else
typedef float act_t;
__device__ __forceinline__ act_t from_f(float x) { return x; }
#endif

// Four consecutive activations as loaded (bf16: 8 bytes, two registers; f32: a float4), to
// keep between a load and its use, and widened to floats by unpack4; `p` aligned to that size.
#if ACT_BF16
typedef uint2 raw4_t;
#else
typedef float4 raw4_t;
#endif
__device__ __forceinline__ raw4_t load_raw4(const act_t* p) { return *reinterpret_cast<const raw4_t*>(p); }
__device__ __forceinline__ float4 unpack4(float4 u) { return u; }
__device__ __forceinline__ float4 unpack4(uint2 u) {
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
// Four consecutive activations as floats: one 16-byte (f32) or 8-byte (bf16) load; `p` must
// be aligned to that size.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const bf16_t* p) { return unpack4(*reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
// Eight consecutive activations as floats: 16-byte loads and stores (one for bf16, two for
// f32); `p` must be aligned to 8 elements.
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
    float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16_t* p, float (&v)[8]) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(bf16_t* p, const float (&v)[8]) {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = (unsigned)to_bf16(v[2 * k]).bits | ((unsigned)to_bf16(v[2 * k + 1]).bits << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(bf16_t* p, float4 v) {
    uint2 u;
    u.x = (unsigned)to_bf16(v.x).bits | ((unsigned)to_bf16(v.y).bits << 16);
    u.y = (unsigned)to_bf16(v.z).bits | ((unsigned)to_bf16(v.w).bits << 16);
    *reinterpret_cast<uint2*>(p) = u;
}

// ---- FP8 ---------------------------------------------------------------------------------
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

// The largest of each thread's `top` (an |x|'s bits: the order of non-negative floats, NaN above
// all) over the block (of whole warps), then one atomicMax of it into amax, so that the result
// does not depend on the order the atomics land in. `warp_top`: shared, a word per warp.
__device__ __forceinline__ void amax_atomic(float* amax, unsigned top, unsigned* warp_top) {
    top = __reduce_max_sync(FULL_MASK, top);
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int lane = t % WARP_SIZE, warp = t / WARP_SIZE;
    if (lane == 0) warp_top[warp] = top;
    __syncthreads();
    if (warp == 0) {
        top = lane < (int)(blockDim.x * blockDim.y / WARP_SIZE) ? warp_top[lane] : 0;
        top = __reduce_max_sync(FULL_MASK, top);
        if (lane == 0 && top != 0) atomicMax(reinterpret_cast<unsigned*>(amax), top);
    }
}

// Eight values as eight FP8 bytes (v[0] in the lowest), each times `s`; `top` takes their
// magnitudes' largest (as amax_atomic compares them).
__device__ __forceinline__ uint2 fp8x8(const float (&v)[8], float s, int e5m2, unsigned& top) {
    unsigned w[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
        top = max(top, max(__float_as_uint(fabsf(v[k])), __float_as_uint(fabsf(v[k + 1]))));
        w[k / 4] |= (unsigned)fp8x2(v[k] * s, v[k + 1] * s, e5m2) << (16 * ((k / 2) % 2));
    }
    return make_uint2(w[0], w[1]);
}

// Four values as four FP8 bytes (v.x in the lowest), each times `s`; `top` as in fp8x8.
__device__ __forceinline__ unsigned fp8x4(float4 v, float s, int e5m2, unsigned& top) {
    top = max(top, max(max(__float_as_uint(fabsf(v.x)), __float_as_uint(fabsf(v.y))),
                       max(__float_as_uint(fabsf(v.z)), __float_as_uint(fabsf(v.w)))));
    return (unsigned)fp8x2(v.x * s, v.y * s, e5m2) | ((unsigned)fp8x2(v.z * s, v.w * s, e5m2) << 16);
}

// ---- column sums -------------------------------------------------------------------------
// The end of a float4 column reduction laid out as bias_backward_vec4_kernel's (matmul.cu):
// 256 threads, a lane's 4 columns at c, warp w summing rows w, w + 8, ... of the block's chunk
// (blockIdx.y) into `sum`. The warps' sums are added in order into the chunk's partials; with
// `tickets` (one zeroed word per column tile; null: the caller runs column_sums_finish_kernel)
// the finishing pass runs in the same launch: each block takes a ticket for its column tile
// once its partials are visible (a fence, then an integer count; no float atomics), and the
// tile's last block adds the chunks into dbias in the finishing kernel's order (row lane k:
// chunks k, k + 8, ...; then the lanes in order: the same bits), then sets the ticket back to 0
// for the next call. Every thread of the block calls it, last.
__device__ void column_sums_vec4_end(float4 sum, float* dbias, float* partials, unsigned* tickets, int OC, int c) {
    __shared__ float4 part[8][32];
    __shared__ bool last;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    part[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && c < OC) {
        for (int k = 1; k < 8; k++) sum = add4(sum, part[k][lane]);
        *reinterpret_cast<float4*>(partials + (size_t)blockIdx.y * OC + c) = sum;
    }
    if (!tickets) return;
    __threadfence();  // this block's partials reach L2 before its ticket is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&tickets[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    // The tile's last block: every chunk's partials are visible (read from L2, not L1).
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < OC) {
        for (int k = warp; k < gridDim.y; k += 8)
            total = add4(total, __ldcg(reinterpret_cast<const float4*>(partials + (size_t)k * OC + c)));
    }
    part[warp][lane] = total;
    __syncthreads();
    if (warp == 0 && c < OC) {
        for (int k = 1; k < 8; k++) total = add4(total, part[k][lane]);
        float4* d = reinterpret_cast<float4*>(dbias + c);
        *d = add4(*d, total);
    }
    if (threadIdx.x == 0) tickets[blockIdx.x] = 0;
}

// ---- the optimiser's per-step scalars ----------------------------------------------------
// The layout of `StepState` in backend/mod.rs (adamw.cu's updates and mlp.cu's step read it).
struct StepState {
    float sumsq;  // Σg²
    float norm;   // √sumsq
    float clip;   // the factor that clips the norm
    float loss;   // the micro-batches' summed loss, then their mean
    float lr;     // written by the host before the step (mlp.cu: from the epoch's schedule)
    float bias1;  // 1 - beta1^t (host, f64)
    float bias2;  // 1 - beta2^t (host, f64)
    unsigned step;  // the 0-based step (host; mlp.cu's loss_step_kernel advances it)
    float apply;  // 1: update; 0: skip (a non-finite loss or norm)
};

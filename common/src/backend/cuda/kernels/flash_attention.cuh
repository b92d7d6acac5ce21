// Flash-style causal self-attention (FlashAttention-2's schedule) on the tensor cores through
// mma.sync m16n8k8 TF32: fp32 storage, online softmax, and only the output and one log-sum-exp
// per row (B,NH,T) kept for backward, which recomputes the probabilities tile by tile.
// SPLIT 1 feeds fp32 bits to the TF32 units, which drop the low 13 mantissa bits (`tf32`);
// SPLIT 3 is the 3xTF32 split a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi, each step's products
// added to the running sums in fp32 (see `mma`): error at fp32 rounding level (`fp32`).
// D is the head size rounded up to 16/32/64/128; columns past HS are zero.
// Backward is deterministic (no atomics): one kernel per key tile for dK and dV, one per query
// tile for dQ. Log-sum-exps are kept in base 2 (scores pre-multiplied by log2(e)).
// Shared tiles are double-buffered and filled by cp.async while the previous tile is used.
// This file holds the templates; flash_d{16,32,64,128}.cu instantiate them (compiled in
// parallel, each prefixed with this file), and attention.cu has the delta kernel.

#define FLASH_THREADS 128  // four warps, 16 rows each

// Rows per shared tile for head size D: two buffers of two tiles stay under 48 KB.
template <int D>
struct Tile {
    static constexpr int ROWS = D <= 32 ? 64 : (D == 64 ? 32 : 16);
    // Leading dimensions (floats): rows read as float2 pairs along d want D + 8 (8 rows of a
    // warp hit 32 distinct banks); rows read down a column at rows 2t, 2t+1 want D + 4.
    static constexpr int LD_PAIR = D + 8;
    static constexpr int LD_COL = D + 4;
};

__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An fp32 operand fragment as TF32 high parts (and exact remainders when SPLIT is 3).
template <int N, int SPLIT>
struct Frag {
    unsigned hi[N];
    unsigned lo[N];
    __device__ __forceinline__ Frag(const float* x) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            unsigned bits = __float_as_uint(x[i]);
            if (SPLIT == 3) {
                hi[i] = bits & 0xffffe000u;  // exactly representable in TF32
                lo[i] = __float_as_uint(x[i] - __uint_as_float(hi[i]));
            } else {
                hi[i] = bits;
            }
        }
    }
};

// c (16x8) += a (16x8, row) · b (8x8, col). Under SPLIT 3 the three products (the small
// cross terms first) are summed from zero in the tensor core and added to c by an fp32 add.
// The tensor core adds its products to the accumulator it is given with the low bits cut off
// (rounded towards zero), so a running sum kept there (a row of P·V over a thousand keys: 128
// products of 8) loses a part in ~10^5 of its size, always the same way; in training that bias,
// summed over every position, moves layer 0's attention gradients by about 1% and takes the
// run away from fp32 GEMM attention's and PyTorch's (docs/gpu.md). The add rounds to nearest,
// as an fp32 GEMM's accumulation does.
template <int SPLIT>
__device__ __forceinline__ void mma(float c[4], const Frag<4, SPLIT>& a, const Frag<2, SPLIT>& b) {
    if (SPLIT == 3) {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_tf32(p, a.lo, b.hi);
        mma_tf32(p, a.hi, b.lo);
        mma_tf32(p, a.hi, b.hi);
#pragma unroll
        for (int i = 0; i < 4; i++) c[i] += p[i];
    } else {
        mma_tf32(c, a.hi, b.hi);
    }
}

// Fragment index conventions (lane = 4g + t):
// - Over the head dimension the k index of an 8-wide step is permuted: k = t is column 2t and
//   k = t + 4 is column 2t + 1, so a B fragment is one float2 (b0, b1) = row[8kk + 2t, +1] and
//   an A fragment is (x[g][2t], x[g+8][2t], x[g][2t+1], x[g+8][2t+1]). The sum is unchanged.
// - A tile held in accumulator layout (rows g, g+8; columns 2t, 2t+1) becomes an A fragment
//   with the keys (or queries) of the 8-step permuted the same way, and its B operand is read
//   down a column at rows 2t and 2t + 1.
template <int SPLIT>
__device__ __forceinline__ Frag<4, SPLIT> acc_as_a(const float c[4]) {
    float a[4] = {c[0], c[2], c[1], c[3]};
    return Frag<4, SPLIT>(a);
}

// B fragment along a row pair: (tile[row][col], tile[row][col + 1]).
template <int SPLIT>
__device__ __forceinline__ Frag<2, SPLIT> b_pair(const float* p) {
    float2 v = *reinterpret_cast<const float2*>(p);
    float b[2] = {v.x, v.y};
    return Frag<2, SPLIT>(b);
}

// B fragment down a column: (p[0], p[ld]).
template <int SPLIT>
__device__ __forceinline__ Frag<2, SPLIT> b_col(const float* p, int ld) {
    float b[2] = {p[0], p[ld]};
    return Frag<2, SPLIT>(b);
}

// The global operands are E: float, or bf16_t (act_t of a bf16 build), read into f32 (exact:
// a bf16 is a TF32 with its low mantissa bits 0) and written back rounded.
__device__ __forceinline__ void store_e(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_e(bf16_t* p, float v) { *p = to_bf16(v); }
__device__ __forceinline__ void add_e(float* p, float v) { *p += v; }
__device__ __forceinline__ void add_e(bf16_t* p, float v) { *p = to_bf16(to_f(*p) + v); }

// Rows r of a (T, stride) matrix at `base`; columns past HS and rows past T read 0.
template <typename E>
__device__ __forceinline__ float load_or_zero(const E* base, size_t stride, int r, int d, int T, int HS) {
    return (r < T && d < HS) ? to_f(base[(size_t)r * stride + d]) : 0.0f;
}

// The A fragments of rows r0 and r0 + 8 over the whole head (DT 8-wide steps), permuted as above.
template <int DT, typename E>
__device__ __forceinline__ void load_a_rows(float a[DT][4], const E* base, size_t stride, int r0, int t, int T,
                                            int HS) {
#pragma unroll
    for (int kk = 0; kk < DT; kk++) {
        int d = kk * 8 + 2 * t;
        a[kk][0] = load_or_zero(base, stride, r0, d, T, HS);
        a[kk][1] = load_or_zero(base, stride, r0 + 8, d, T, HS);
        a[kk][2] = load_or_zero(base, stride, r0, d + 1, T, HS);
        a[kk][3] = load_or_zero(base, stride, r0 + 8, d + 1, T, HS);
    }
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// Copies `bytes` (4 or 16) from global to shared asynchronously; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most one committed group (the newest) is still in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;"); }

// Starts copying rows [r0, r0 + ROWS) x [0, D) of a (T, stride) matrix into `tile` (leading
// dimension LD). `vec`: 16-byte copies (HS and the row stride multiples of 4, base aligned);
// otherwise plain loads and stores (visible after the caller's barrier).
template <int ROWS, int D, int LD>
__device__ __forceinline__ void tile_load(float* tile, const float* base, size_t stride, int r0, int T, int HS,
                                          bool vec) {
    if (vec) {
        constexpr int CHUNKS = D / 4;
        for (int i = threadIdx.x; i < ROWS * CHUNKS; i += FLASH_THREADS) {
            int r = i / CHUNKS, c = (i % CHUNKS) * 4;
            bool inside = r0 + r < T && c < HS;
            const float* src = inside ? base + (size_t)(r0 + r) * stride + c : base;
            cp_async16(tile + r * LD + c, src, inside ? 16 : 0);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * D; i += FLASH_THREADS) {
            int r = i / D, d = i % D;
            tile[r * LD + d] = load_or_zero(base, stride, r0 + r, d, T, HS);
        }
    }
}

// Starts copying `row[r0 .. r0 + n)` (0 past T) into `dst`.
__device__ __forceinline__ void vector_load(float* dst, const float* row, int r0, int n, int T) {
    for (int i = threadIdx.x; i < n; i += FLASH_THREADS) {
        bool inside = r0 + i < T;
        cp_async4(dst + i, inside ? row + r0 + i : row, inside ? 4 : 0);
    }
}

// ---- the steps both kernel families share (TF32 here, bf16 in flash_bf16.cuh) -------------
// Accumulator tiles are 16 rows (r0 = g, r1 = g + 8 of the warp's 16) by N blocks of 8 columns
// in the mma's C layout: element (n, i) is row (i < 2 ? r0 : r1), column n·8 + 2t + (i & 1).

// One key tile's step of the online softmax (FlashAttention-2) for the rows r0, r1: masks the
// raw scores s (keys from k0) causally where `mask` says the tile crosses the diagonal (a
// warp-uniform flag: tiles wholly at or before the rows skip the index arithmetic), updates the
// running maxima m (in scaled base-2 units) and sums l, turns s into exp2(s·scale_log2 - m) with
// one FFMA per score, and rescales the output accumulators o.
template <int N, int DN>
__device__ __forceinline__ void softmax_step(float (&s)[N][4], float (&o)[DN][4], float& m0, float& m1, float& l0,
                                             float& l1, int k0, int r0, int r1, int t, float scale_log2, bool mask) {
    if (mask) {
#pragma unroll
        for (int n = 0; n < N; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + n * 8 + 2 * t + (i & 1);
                if (key > (i < 2 ? r0 : r1)) s[n][i] = NEG_INF;
            }
        }
    }
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < N; n++) {
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    // The four threads of a group (lanes 4g..4g+3) share rows g and g+8.
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
    // The scale is positive, so the raw maximum scaled is the scaled maximum. Key 0 is visible
    // to every row and tile 0 comes first, so the max is finite from here on.
    float mn0 = fmaxf(m0, mx0 * scale_log2), mn1 = fmaxf(m1, mx1 * scale_log2);
    float corr0 = fast_exp2(m0 - mn0), corr1 = fast_exp2(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < N; n++) {
        s[n][0] = fast_exp2(fmaf(s[n][0], scale_log2, -m0));
        s[n][1] = fast_exp2(fmaf(s[n][1], scale_log2, -m0));
        s[n][2] = fast_exp2(fmaf(s[n][2], scale_log2, -m1));
        s[n][3] = fast_exp2(fmaf(s[n][3], scale_log2, -m1));
        sum0 += s[n][0] + s[n][1];
        sum1 += s[n][2] + s[n][3];
    }
    // Row sums stay per thread until the end (the correction factors are per row).
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int n = 0; n < DN; n++) {
        o[n][0] *= corr0;
        o[n][1] *= corr0;
        o[n][2] *= corr1;
        o[n][3] *= corr1;
    }
}

// The forward's end: rows r0, r1 of the output (o over the row sums, the sums first added
// across the four threads of a group) and their base-2 log-sum-exps.
template <int DN, typename E>
__device__ __forceinline__ void forward_epilogue(E* out_base, size_t C, float* lse_row, const float (&o)[DN][4], float m0,
                                                 float m1, float l0, float l1, int r0, int r1, int t, int T, int HS) {
    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < DN; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int d = n * 8 + 2 * t + (i & 1);
            int row = i < 2 ? r0 : r1;
            if (row < T && d < HS) store_e(out_base + (size_t)row * C + d, o[n][i] * (i < 2 ? inv0 : inv1));
        }
    }
    if (t == 0) {
        if (r0 < T) lse_row[r0] = m0 + log2f(l0);
        if (r1 < T) lse_row[r1] = m1 + log2f(l1);
    }
}

// pᵀ from sᵀ (keys kr0, kr1 by N·8 queries from q0, whose log-sum-exps are lse[0..]):
// exp2(s·scale·log2e - lse), and where `mask` (warp-uniform: the tile reaches before the last
// key or past T) 0 where the query precedes the key or is past T.
template <int N>
__device__ __forceinline__ void probs_t(float (&st)[N][4], const float* lse, int q0, int kr0, int kr1, int t, int T,
                                        float scale_log2, bool mask) {
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int qi = n * 8 + 2 * t + (i & 1);
            float p = fast_exp2(fmaf(st[n][i], scale_log2, -lse[qi]));
            if (mask) {
                int q = q0 + qi;
                p = (q >= (i < 2 ? kr0 : kr1) && q < T) ? p : 0.0f;
            }
            st[n][i] = p;
        }
    }
}

// dsᵀ/scale = pᵀ ⊙ (dpᵀ - delta), over dpᵀ in place (delta[0..] per query column); the
// caller multiplies the finished dK by the scale once (`add_rows`' `mul`).
template <int N>
__device__ __forceinline__ void ds_t(float (&dpt)[N][4], const float (&st)[N][4], const float* delta, int t) {
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) dpt[n][i] = st[n][i] * (dpt[n][i] - delta[n * 8 + 2 * t + (i & 1)]);
    }
}

// p from s (rows r0, r1 by N·8 keys from k0, the rows' log-sum-exps lse0, lse1): exp2(s·scale·
// log2e - lse), and where `mask` (warp-uniform: the tile crosses the diagonal) 0 where the key
// is after the row.
template <int N>
__device__ __forceinline__ void probs(float (&s)[N][4], int k0, int r0, int r1, int t, float lse0, float lse1,
                                      float scale_log2, bool mask) {
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float p = fast_exp2(fmaf(s[n][i], scale_log2, -(i < 2 ? lse0 : lse1)));
            if (mask) p = k0 + n * 8 + 2 * t + (i & 1) <= (i < 2 ? r0 : r1) ? p : 0.0f;
            s[n][i] = p;
        }
    }
}

// ds/scale = p ⊙ (dp - delta), over dp in place (delta0, delta1 per row); the caller scales dQ.
template <int N>
__device__ __forceinline__ void ds_rows(float (&dp)[N][4], const float (&s)[N][4], float delta0, float delta1) {
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) dp[n][i] = s[n][i] * (dp[n][i] - (i < 2 ? delta0 : delta1));
    }
}

// base[row, d] += mul·acc for the rows r0, r1 (below T) and columns d below HS: a gradient tile
// into its place in dqkv.
template <int DN, typename E>
__device__ __forceinline__ void add_rows(E* base, size_t stride, const float (&acc)[DN][4], int r0, int r1, int t,
                                         int T, int HS, float mul) {
#pragma unroll
    for (int n = 0; n < DN; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int d = n * 8 + 2 * t + (i & 1);
            int row = i < 2 ? r0 : r1;
            if (row < T && d < HS) add_e(base + (size_t)row * stride + d, mul * acc[n][i]);
        }
    }
}

// ---- forward ------------------------------------------------------------------------------

// Grid (B·NH, ceil(T/64)), 128 threads. Heavy query tiles (late rows) are scheduled first.
// out (B,T,NH·HS), lse (B·NH, T) in base 2.
template <int D, int SPLIT, typename E>
__device__ __forceinline__ void flash_forward(E* out, float* lse, const E* qkv, int T, int NH, int HS,
                                              float scale_log2, int vec) {
    constexpr int BK = Tile<D>::ROWS;  // keys per tile
    constexpr int LDK = Tile<D>::LD_PAIR, LDV = Tile<D>::LD_COL;
    constexpr int DT = D / 8;   // 8-wide steps over the head dimension
    constexpr int KT = BK / 8;  // 8-wide steps over the keys of a tile
    __shared__ __align__(16) float ks[2][BK * LDK];
    __shared__ __align__(16) float vs[2][BK * LDV];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int qt = gridDim.y - 1 - blockIdx.y;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const E* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const E* k_base = q_base + C;
    const E* v_base = q_base + 2 * C;
    int q0 = qt * 64 + warp * 16;
    int r0 = q0 + g, r1 = q0 + g + 8;

    float qa[DT][4];
    load_a_rows<DT>(qa, q_base, stride, r0, t, T, HS);
    float o[DT][4];
#pragma unroll
    for (int n = 0; n < DT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    int q_end = min(qt * 64 + 64, T);
    int n_tiles = (q_end + BK - 1) / BK;
    tile_load<BK, D, LDK>(ks[0], k_base, stride, 0, T, HS, vec);
    tile_load<BK, D, LDV>(vs[0], v_base, stride, 0, T, HS, vec);
    cp_async_commit();
    for (int kt = 0; kt < n_tiles; kt++) {
        int k0 = kt * BK, buf = kt & 1;
        if (kt + 1 < n_tiles) {
            tile_load<BK, D, LDK>(ks[buf ^ 1], k_base, stride, k0 + BK, T, HS, vec);
            tile_load<BK, D, LDV>(vs[buf ^ 1], v_base, stride, k0 + BK, T, HS, vec);
        }
        cp_async_commit();
        cp_async_wait_one();  // this tile has landed (this thread's copies)
        __syncthreads();      // ... and everyone's
        if (k0 <= q0 + 15) {  // else every key is after this warp's queries
            const float* kt_s = ks[buf];
            const float* vt_s = vs[buf];
            // s (16 x BK) = q · kᵀ
            float s[KT][4];
#pragma unroll
            for (int n = 0; n < KT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DT; kk++) {
                Frag<4, SPLIT> a(qa[kk]);
#pragma unroll
                for (int n = 0; n < KT; n++)
                    mma<SPLIT>(s[n], a, b_pair<SPLIT>(kt_s + (n * 8 + g) * LDK + kk * 8 + 2 * t));
            }
            softmax_step(s, o, m0, m1, l0, l1, k0, r0, r1, t, scale_log2, k0 + BK - 1 > q0);
            // o (16 x D) += p (16 x BK) · v (BK x D)
#pragma unroll
            for (int j = 0; j < KT; j++) {
                Frag<4, SPLIT> a = acc_as_a<SPLIT>(s[j]);
#pragma unroll
                for (int n = 0; n < DT; n++)
                    mma<SPLIT>(o[n], a, b_col<SPLIT>(vt_s + (j * 8 + 2 * t) * LDV + n * 8 + g, LDV));
            }
        }
        __syncthreads();  // everyone is done with this buffer before it is refilled
    }
    E* out_base = out + (size_t)b * T * C + (size_t)h * HS;
    forward_epilogue(out_base, C, lse + (size_t)blockIdx.x * T, o, m0, m1, l0, l1, r0, r1, t, T, HS);
}

// ---- backward -----------------------------------------------------------------------------

// dK and dV for one tile of 64 keys (16 per warp), summing over every later query in tiles.
// Grid (B·NH, ceil(T/64)); heavy (early) key tiles first. Accumulates into dqkv.
template <int D, int SPLIT, typename E>
__device__ __forceinline__ void flash_backward_dkdv(E* dqkv, const E* dout, const E* qkv,
                                                    const float* lse, const float* delta, int T, int NH, int HS,
                                                    float scale, float scale_log2, int vec) {
    constexpr int BQ = Tile<D>::ROWS;
    constexpr int LD = Tile<D>::LD_PAIR;
    constexpr int DT = D / 8;
    constexpr int QT = BQ / 8;
    __shared__ __align__(16) float qs[2][BQ * LD];
    __shared__ __align__(16) float dos[2][BQ * LD];
    __shared__ float lse_s[2][BQ];
    __shared__ float delta_s[2][BQ];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const E* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const E* k_base = q_base + C;
    const E* v_base = q_base + 2 * C;
    const E* do_base = dout + (size_t)b * T * C + (size_t)h * HS;
    const float* lse_row = lse + (size_t)blockIdx.x * T;
    const float* delta_row = delta + (size_t)blockIdx.x * T;
    int k_start = blockIdx.y * 64;
    int key0 = k_start + warp * 16;
    int kr0 = key0 + g, kr1 = key0 + g + 8;

    float ka[DT][4], va[DT][4];
    load_a_rows<DT>(ka, k_base, stride, kr0, t, T, HS);
    load_a_rows<DT>(va, v_base, stride, kr0, t, T, HS);
    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int n = 0; n < DT; n++) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }

    auto load = [&](int buf, int q_start) {
        tile_load<BQ, D, LD>(qs[buf], q_base, stride, q_start, T, HS, vec);
        tile_load<BQ, D, LD>(dos[buf], do_base, C, q_start, T, HS, vec);
        vector_load(lse_s[buf], lse_row, q_start, BQ, T);
        vector_load(delta_s[buf], delta_row, q_start, BQ, T);
    };
    int n_tiles = (T - k_start + BQ - 1) / BQ;  // k_start is a multiple of BQ
    load(0, k_start);
    cp_async_commit();
    for (int it = 0; it < n_tiles; it++) {
        int qs0 = k_start + it * BQ, buf = it & 1;
        if (it + 1 < n_tiles) load(buf ^ 1, qs0 + BQ);
        cp_async_commit();
        cp_async_wait_one();
        __syncthreads();
        if (qs0 + BQ - 1 >= key0) {  // else every query is before this warp's keys
            const float* q_s = qs[buf];
            const float* do_s = dos[buf];
            // sᵀ (16 keys x BQ queries) = k · qᵀ
            float st[QT][4];
#pragma unroll
            for (int n = 0; n < QT; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DT; kk++) {
                Frag<4, SPLIT> a(ka[kk]);
#pragma unroll
                for (int n = 0; n < QT; n++)
                    mma<SPLIT>(st[n], a, b_pair<SPLIT>(q_s + (n * 8 + g) * LD + kk * 8 + 2 * t));
            }
            probs_t(st, lse_s[buf], qs0, kr0, kr1, t, T, scale_log2, qs0 < key0 + 15 || qs0 + BQ > T);
            // dv (16 x D) += pᵀ (16 x BQ) · dout (BQ x D)
#pragma unroll
            for (int j = 0; j < QT; j++) {
                Frag<4, SPLIT> a = acc_as_a<SPLIT>(st[j]);
#pragma unroll
                for (int n = 0; n < DT; n++)
                    mma<SPLIT>(dv[n], a, b_col<SPLIT>(do_s + (j * 8 + 2 * t) * LD + n * 8 + g, LD));
            }
            // dpᵀ (16 x BQ) = v · doutᵀ
            float dpt[QT][4];
#pragma unroll
            for (int n = 0; n < QT; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DT; kk++) {
                Frag<4, SPLIT> a(va[kk]);
#pragma unroll
                for (int n = 0; n < QT; n++)
                    mma<SPLIT>(dpt[n], a, b_pair<SPLIT>(do_s + (n * 8 + g) * LD + kk * 8 + 2 * t));
            }
            ds_t(dpt, st, delta_s[buf], t);
            // dk (16 x D) += dsᵀ (16 x BQ) · q (BQ x D)
#pragma unroll
            for (int j = 0; j < QT; j++) {
                Frag<4, SPLIT> a = acc_as_a<SPLIT>(dpt[j]);
#pragma unroll
                for (int n = 0; n < DT; n++)
                    mma<SPLIT>(dk[n], a, b_col<SPLIT>(q_s + (j * 8 + 2 * t) * LD + n * 8 + g, LD));
            }
        }
        __syncthreads();
    }
    E* dk_base = dqkv + (size_t)b * T * stride + C + (size_t)h * HS;
    add_rows(dk_base, stride, dk, kr0, kr1, t, T, HS, scale);
    add_rows(dk_base + C, stride, dv, kr0, kr1, t, T, HS, 1.0f);
}

// dQ for one tile of 64 queries (16 per warp), summing over keys in tiles.
// Grid (B·NH, ceil(T/64)); heavy (late) query tiles first. Accumulates into dqkv.
template <int D, int SPLIT, typename E>
__device__ __forceinline__ void flash_backward_dq(E* dqkv, const E* dout, const E* qkv, const float* lse,
                                                  const float* delta, int T, int NH, int HS, float scale,
                                                  float scale_log2, int vec) {
    constexpr int BK = Tile<D>::ROWS;
    constexpr int LD = Tile<D>::LD_PAIR;
    constexpr int DT = D / 8;
    constexpr int KT = BK / 8;
    __shared__ __align__(16) float ks[2][BK * LD];
    __shared__ __align__(16) float vs[2][BK * LD];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int qt = gridDim.y - 1 - blockIdx.y;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const E* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const E* k_base = q_base + C;
    const E* v_base = q_base + 2 * C;
    const E* do_base = dout + (size_t)b * T * C + (size_t)h * HS;
    int q0 = qt * 64 + warp * 16;
    int r0 = q0 + g, r1 = q0 + g + 8;
    const float* lse_row = lse + (size_t)blockIdx.x * T;
    const float* delta_row = delta + (size_t)blockIdx.x * T;
    float lse0 = r0 < T ? lse_row[r0] : 0.0f, lse1 = r1 < T ? lse_row[r1] : 0.0f;
    float delta0 = r0 < T ? delta_row[r0] : 0.0f, delta1 = r1 < T ? delta_row[r1] : 0.0f;

    float qa[DT][4], doa[DT][4];
    load_a_rows<DT>(qa, q_base, stride, r0, t, T, HS);
    load_a_rows<DT>(doa, do_base, C, r0, t, T, HS);
    float dq[DT][4];
#pragma unroll
    for (int n = 0; n < DT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    int q_end = min(qt * 64 + 64, T);
    int n_tiles = (q_end + BK - 1) / BK;
    tile_load<BK, D, LD>(ks[0], k_base, stride, 0, T, HS, vec);
    tile_load<BK, D, LD>(vs[0], v_base, stride, 0, T, HS, vec);
    cp_async_commit();
    for (int kt = 0; kt < n_tiles; kt++) {
        int k0 = kt * BK, buf = kt & 1;
        if (kt + 1 < n_tiles) {
            tile_load<BK, D, LD>(ks[buf ^ 1], k_base, stride, k0 + BK, T, HS, vec);
            tile_load<BK, D, LD>(vs[buf ^ 1], v_base, stride, k0 + BK, T, HS, vec);
        }
        cp_async_commit();
        cp_async_wait_one();
        __syncthreads();
        if (k0 <= q0 + 15) {
            const float* k_s = ks[buf];
            const float* v_s = vs[buf];
            // s (16 x BK) = q · kᵀ, then p
            float s[KT][4];
#pragma unroll
            for (int n = 0; n < KT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DT; kk++) {
                Frag<4, SPLIT> a(qa[kk]);
#pragma unroll
                for (int n = 0; n < KT; n++)
                    mma<SPLIT>(s[n], a, b_pair<SPLIT>(k_s + (n * 8 + g) * LD + kk * 8 + 2 * t));
            }
            probs(s, k0, r0, r1, t, lse0, lse1, scale_log2, k0 + BK - 1 > q0);
            // dp (16 x BK) = dout · vᵀ, then ds = p ⊙ (dp - delta) · scale
            float dp[KT][4];
#pragma unroll
            for (int n = 0; n < KT; n++) dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DT; kk++) {
                Frag<4, SPLIT> a(doa[kk]);
#pragma unroll
                for (int n = 0; n < KT; n++)
                    mma<SPLIT>(dp[n], a, b_pair<SPLIT>(v_s + (n * 8 + g) * LD + kk * 8 + 2 * t));
            }
            ds_rows(dp, s, delta0, delta1);
            // dq (16 x D) += ds (16 x BK) · k (BK x D)
#pragma unroll
            for (int j = 0; j < KT; j++) {
                Frag<4, SPLIT> a = acc_as_a<SPLIT>(dp[j]);
#pragma unroll
                for (int n = 0; n < DT; n++)
                    mma<SPLIT>(dq[n], a, b_col<SPLIT>(k_s + (j * 8 + 2 * t) * LD + n * 8 + g, LD));
            }
        }
        __syncthreads();
    }
    add_rows(dqkv + (size_t)b * T * stride + (size_t)h * HS, stride, dq, r0, r1, t, T, HS, scale);
}

// ---- entry points (one file per padded head size D): parameter lists ----------------------

// The operands are act_t: f32, or bf16 in a bf16 build (ACT_BF16).
#define FWD_PARAMS act_t *out, float *lse, const act_t *qkv, int T, int NH, int HS, float scale_log2, int vec
#define FWD_ARGS out, lse, qkv, T, NH, HS, scale_log2, vec
#define BWD_PARAMS                                                                                            \
    act_t *dqkv, const act_t *dout, const act_t *qkv, const float *lse, const float *delta, int T, int NH, int HS, \
        float scale, float scale_log2, int vec
#define BWD_ARGS dqkv, dout, qkv, lse, delta, T, NH, HS, scale, scale_log2, vec

// Flash attention on bf16 operands with bf16 tensor-core products (mma.sync m16n8k16, f32
// accumulation): FlashAttention-2's schedule as in flash_attention.cuh (64 query or key rows
// per block, 16 per warp; online softmax; base-2 log-sum-exps; a deterministic backward with
// one kernel for dK/dV per key tile and one for dQ per query tile, no atomics), but the tiles
// stay bf16 in shared memory (half the bytes of the f32 tiles) and each product step covers 16
// of the reduced dimension (twice TF32's 8, at twice its rate). P and dS are rounded to bf16
// before they multiply V, dO, Q or K, as FlashAttention does; everything else is f32.
// Needs flash_attention.cuh first (FLASH_THREADS, cp.async helpers, store_e, add_e,
// and the steps both families share: softmax_step, forward_epilogue, probs_t, ds_t, probs, ds_rows,
// add_rows).
//
// Fragments of m16n8k16 (lane = 4g + t), two bf16 per register, the lower column first:
//   A (16x16, row major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8, column):     b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
//   C (16x8):             c0, c1 = C[g][2t], C[g][2t+1];  c2, c3 = C[g+8][2t], C[g+8][2t+1]
// So an accumulator tile pair (keys 16j..16j+15) is an A fragment as it stands, and the B
// fragments come from shared memory by `ldmatrix`, four 8x8 blocks (two n-blocks) at a time:
// plain for a tile whose rows are B's columns (K for Q·Kᵀ), transposed for a tile whose rows
// are B's rows (V for P·V).

// Rows per shared tile: two buffers of two bf16 tiles stay under 48 KB.
template <int D>
struct Tile16 {
    static constexpr int ROWS = D <= 64 ? 64 : 32;
    // Leading dimension in elements: rows 16 bytes apart modulo 128, so the 8 rows a warp reads
    // at once (lanes g) hit distinct banks.
    static constexpr int LD = D + 8;
};

__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats as a bf16 pair, lo in the low half, in one conversion (round to nearest even, as
// to_bf16).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// B fragments of two adjacent n-blocks (b[0]: columns n0..n0+7, b[1]: n0+8..n0+15) over the
// reduced indices k0..k0+15, from a tile whose rows are B's columns ("n-major": B = Kᵀ with K's
// rows in the tile). Lanes 0-7, 8-15, 16-23, 24-31 address the rows of the four 8x8 blocks.
// Rows are LD elements apart, 16 bytes modulo 128: the 8 rows of a block hit distinct banks.
__device__ __forceinline__ void ldsm_b_nmajor(unsigned b[2][2], const bf16_t* tile, int ld, int n0, int k0) {
    int lane = threadIdx.x & 31;
    const bf16_t* p = tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0][0]), "=r"(b[0][1]), "=r"(b[1][0]), "=r"(b[1][1])
                 : "r"(shared_address(p)));
}
// The same from a tile whose rows are B's rows ("k-major": B = V, rows the keys): transposed.
__device__ __forceinline__ void ldsm_b_kmajor(unsigned b[2][2], const bf16_t* tile, int ld, int k0, int n0) {
    int lane = threadIdx.x & 31;
    const bf16_t* p = tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + n0 + (lane >> 4) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0][0]), "=r"(b[0][1]), "=r"(b[1][0]), "=r"(b[1][1])
                 : "r"(shared_address(p)));
}

// Element (r, d) of a (T, stride) bf16 matrix as bits; 0 past T or HS.
__device__ __forceinline__ unsigned bits_or_zero(const bf16_t* base, size_t stride, int r, int d, int T, int HS) {
    return (r < T && d < HS) ? (unsigned)base[(size_t)r * stride + d].bits : 0u;
}

// The A fragments of rows r0 and r0 + 8 over the whole head (DK 16-wide steps).
template <int DK>
__device__ __forceinline__ void load_a16(unsigned a[DK][4], const bf16_t* base, size_t stride, int r0, int t, int T,
                                         int HS) {
#pragma unroll
    for (int kk = 0; kk < DK; kk++) {
        int d = kk * 16 + 2 * t;
        int r1 = r0 + 8;
        a[kk][0] = bits_or_zero(base, stride, r0, d, T, HS) | (bits_or_zero(base, stride, r0, d + 1, T, HS) << 16);
        a[kk][1] = bits_or_zero(base, stride, r1, d, T, HS) | (bits_or_zero(base, stride, r1, d + 1, T, HS) << 16);
        a[kk][2] = bits_or_zero(base, stride, r0, d + 8, T, HS) | (bits_or_zero(base, stride, r0, d + 9, T, HS) << 16);
        a[kk][3] = bits_or_zero(base, stride, r1, d + 8, T, HS) | (bits_or_zero(base, stride, r1, d + 9, T, HS) << 16);
    }
}

// An accumulator tile pair (blocks 2j and 2j + 1 of 8 columns) as an A fragment, rounded to bf16.
__device__ __forceinline__ void acc_pair_as_a(unsigned a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

// Starts copying rows [r0, r0 + ROWS) x [0, D) of a (T, stride) bf16 matrix into `tile` (leading
// dimension LD). `vec`: 16-byte copies (HS and the row stride multiples of 8, base 16-byte
// aligned); otherwise plain loads and stores (visible after the caller's barrier).
template <int ROWS, int D, int LD>
__device__ __forceinline__ void tile_load16(bf16_t* tile, const bf16_t* base, size_t stride, int r0, int T, int HS,
                                            bool vec) {
    if (vec) {
        constexpr int CHUNKS = D / 8;
        for (int i = threadIdx.x; i < ROWS * CHUNKS; i += FLASH_THREADS) {
            int r = i / CHUNKS, c = (i % CHUNKS) * 8;
            bool inside = r0 + r < T && c < HS;
            const bf16_t* src = inside ? base + (size_t)(r0 + r) * stride + c : base;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(tile + r * LD + c)),
                         "l"(src), "r"(inside ? 16 : 0));
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * D; i += FLASH_THREADS) {
            int r = i / D, d = i % D;
            tile[r * LD + d].bits = (unsigned short)bits_or_zero(base, stride, r0 + r, d, T, HS);
        }
    }
}

// ---- forward ------------------------------------------------------------------------------

// 16-row tiles of queries per warp in the forward: two for head sizes up to 64 (each B fragment
// read from shared memory feeds two products, and the block covers 128 queries per pass over
// the keys), one for 128 (two would not fit the registers).
template <int D>
struct Fwd16 {
    static constexpr int M = D <= 64 ? 2 : 1;
    static constexpr int ROWS = 64 * M;  // queries per block (flash.rs's grid agrees)
};

// Grid (B·NH, ceil(T/ROWS)), 128 threads; late (heavy) query tiles first. out (B,T,NH·HS),
// lse (B·NH, T) in base 2.
template <int D>
__device__ __forceinline__ void flash16_forward(bf16_t* out, float* lse, const bf16_t* qkv, int T, int NH, int HS,
                                                float scale_log2, int vec) {
    constexpr int BK = Tile16<D>::ROWS, LD = Tile16<D>::LD;
    constexpr int M = Fwd16<D>::M, BQ = Fwd16<D>::ROWS;
    constexpr int DK = D / 16;  // 16-wide steps over the head dimension
    constexpr int DN = D / 8;   // 8-wide blocks of output columns
    constexpr int KN = BK / 8;  // 8-key blocks of a tile
    __shared__ __align__(16) bf16_t ks[2][BK * LD];
    __shared__ __align__(16) bf16_t vs[2][BK * LD];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int qt = gridDim.y - 1 - blockIdx.y;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const bf16_t* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const bf16_t* k_base = q_base + C;
    const bf16_t* v_base = q_base + 2 * C;
    int q0 = qt * BQ + warp * 16 * M;  // the warp's rows: q0 .. q0 + 16M - 1, tile m from q0 + 16m

    unsigned qa[M][DK][4];
    float o[M][DN][4];
    float m_run[M][2], l_run[M][2];
#pragma unroll
    for (int m = 0; m < M; m++) {
        load_a16<DK>(qa[m], q_base, stride, q0 + 16 * m + g, t, T, HS);
#pragma unroll
        for (int n = 0; n < DN; n++) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
        m_run[m][0] = m_run[m][1] = NEG_INF;
        l_run[m][0] = l_run[m][1] = 0.0f;
    }

    int q_end = min(qt * BQ + BQ, T);
    int n_tiles = (q_end + BK - 1) / BK;
    tile_load16<BK, D, LD>(ks[0], k_base, stride, 0, T, HS, vec);
    tile_load16<BK, D, LD>(vs[0], v_base, stride, 0, T, HS, vec);
    cp_async_commit();
    for (int kt = 0; kt < n_tiles; kt++) {
        int k0 = kt * BK, buf = kt & 1;
        if (kt + 1 < n_tiles) {
            tile_load16<BK, D, LD>(ks[buf ^ 1], k_base, stride, k0 + BK, T, HS, vec);
            tile_load16<BK, D, LD>(vs[buf ^ 1], v_base, stride, k0 + BK, T, HS, vec);
        }
        cp_async_commit();
        cp_async_wait_one();
        __syncthreads();
        if (k0 <= q0 + 16 * M - 1) {  // else every key is after this warp's queries
            const bf16_t* k_s = ks[buf];
            const bf16_t* v_s = vs[buf];
            // s (16M x BK) = q · kᵀ: B = kᵀ, read along the rows of the key tile, each fragment
            // used by the warp's M row tiles.
            float s[M][KN][4];
#pragma unroll
            for (int m = 0; m < M; m++) {
#pragma unroll
                for (int n = 0; n < KN; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
            }
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
#pragma unroll
                for (int n = 0; n < KN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_nmajor(bb, k_s, LD, n * 8, kk * 16);
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        mma_bf16(s[m][n], qa[m][kk], bb[0]);
                        mma_bf16(s[m][n + 1], qa[m][kk], bb[1]);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < M; m++) {
                int r0 = q0 + 16 * m + g;
                softmax_step(s[m], o[m], m_run[m][0], m_run[m][1], l_run[m][0], l_run[m][1], k0, r0, r0 + 8, t,
                             scale_log2, k0 + BK - 1 > q0 + 16 * m);
            }
            // o (16M x D) += p (16M x BK) · v (BK x D): B = v, read down the columns of the tile.
#pragma unroll
            for (int j = 0; j < KN / 2; j++) {
                unsigned a[M][4];
#pragma unroll
                for (int m = 0; m < M; m++) acc_pair_as_a(a[m], s[m][2 * j], s[m][2 * j + 1]);
#pragma unroll
                for (int n = 0; n < DN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_kmajor(bb, v_s, LD, j * 16, n * 8);
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        mma_bf16(o[m][n], a[m], bb[0]);
                        mma_bf16(o[m][n + 1], a[m], bb[1]);
                    }
                }
            }
        }
        __syncthreads();  // everyone is done with this buffer before it is refilled
    }
    bf16_t* out_base = out + (size_t)b * T * C + (size_t)h * HS;
#pragma unroll
    for (int m = 0; m < M; m++) {
        int r0 = q0 + 16 * m + g;
        forward_epilogue(out_base, C, lse + (size_t)blockIdx.x * T, o[m], m_run[m][0], m_run[m][1], l_run[m][0],
                         l_run[m][1], r0, r0 + 8, t, T, HS);
    }
}

// ---- backward -----------------------------------------------------------------------------

// dK and dV for one tile of 64 keys (16 per warp), over every later query in tiles of BQ.
// Grid (B·NH, ceil(T/64)). Accumulates into dqkv.
template <int D>
__device__ __forceinline__ void flash16_backward_dkdv(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv,
                                                      const float* lse, const float* delta, int T, int NH, int HS,
                                                      float scale, float scale_log2, int vec) {
    constexpr int BQ = Tile16<D>::ROWS, LD = Tile16<D>::LD;
    constexpr int DK = D / 16, DN = D / 8, QN = BQ / 8;
    __shared__ __align__(16) bf16_t qs[2][BQ * LD];
    __shared__ __align__(16) bf16_t dos[2][BQ * LD];
    __shared__ float lse_s[2][BQ];
    __shared__ float delta_s[2][BQ];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const bf16_t* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const bf16_t* k_base = q_base + C;
    const bf16_t* v_base = q_base + 2 * C;
    const bf16_t* do_base = dout + (size_t)b * T * C + (size_t)h * HS;
    const float* lse_row = lse + (size_t)blockIdx.x * T;
    const float* delta_row = delta + (size_t)blockIdx.x * T;
    int k_start = blockIdx.y * 64;
    int key0 = k_start + warp * 16;
    int kr0 = key0 + g, kr1 = key0 + g + 8;

    unsigned ka[DK][4], va[DK][4];
    load_a16<DK>(ka, k_base, stride, kr0, t, T, HS);
    load_a16<DK>(va, v_base, stride, kr0, t, T, HS);
    float dk[DN][4], dv[DN][4];
#pragma unroll
    for (int n = 0; n < DN; n++) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }

    auto load = [&](int buf, int q_start) {
        tile_load16<BQ, D, LD>(qs[buf], q_base, stride, q_start, T, HS, vec);
        tile_load16<BQ, D, LD>(dos[buf], do_base, C, q_start, T, HS, vec);
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
            const bf16_t* q_s = qs[buf];
            const bf16_t* do_s = dos[buf];
            // sᵀ (16 keys x BQ queries) = k · qᵀ
            float st[QN][4];
#pragma unroll
            for (int n = 0; n < QN; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
#pragma unroll
                for (int n = 0; n < QN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_nmajor(bb, q_s, LD, n * 8, kk * 16);
                    mma_bf16(st[n], ka[kk], bb[0]);
                    mma_bf16(st[n + 1], ka[kk], bb[1]);
                }
            }
            probs_t(st, lse_s[buf], qs0, kr0, kr1, t, T, scale_log2, qs0 < key0 + 15 || qs0 + BQ > T);
            // dv (16 x D) += pᵀ (16 x BQ) · dout (BQ x D)
#pragma unroll
            for (int j = 0; j < QN / 2; j++) {
                unsigned a[4];
                acc_pair_as_a(a, st[2 * j], st[2 * j + 1]);
#pragma unroll
                for (int n = 0; n < DN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_kmajor(bb, do_s, LD, j * 16, n * 8);
                    mma_bf16(dv[n], a, bb[0]);
                    mma_bf16(dv[n + 1], a, bb[1]);
                }
            }
            // dpᵀ (16 x BQ) = v · doutᵀ
            float dpt[QN][4];
#pragma unroll
            for (int n = 0; n < QN; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
#pragma unroll
                for (int n = 0; n < QN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_nmajor(bb, do_s, LD, n * 8, kk * 16);
                    mma_bf16(dpt[n], va[kk], bb[0]);
                    mma_bf16(dpt[n + 1], va[kk], bb[1]);
                }
            }
            ds_t(dpt, st, delta_s[buf], t);
            // dk (16 x D) += dsᵀ (16 x BQ) · q (BQ x D)
#pragma unroll
            for (int j = 0; j < QN / 2; j++) {
                unsigned a[4];
                acc_pair_as_a(a, dpt[2 * j], dpt[2 * j + 1]);
#pragma unroll
                for (int n = 0; n < DN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_kmajor(bb, q_s, LD, j * 16, n * 8);
                    mma_bf16(dk[n], a, bb[0]);
                    mma_bf16(dk[n + 1], a, bb[1]);
                }
            }
        }
        __syncthreads();
    }
    bf16_t* dk_base = dqkv + (size_t)b * T * stride + C + (size_t)h * HS;
    add_rows(dk_base, stride, dk, kr0, kr1, t, T, HS, scale);
    add_rows(dk_base + C, stride, dv, kr0, kr1, t, T, HS, 1.0f);
}

// dQ for one tile of 64 queries (16 per warp), over keys in tiles of BK.
// Grid (B·NH, ceil(T/64)); late (heavy) query tiles first. Accumulates into dqkv.
template <int D>
__device__ __forceinline__ void flash16_backward_dq(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv,
                                                    const float* lse, const float* delta, int T, int NH, int HS,
                                                    float scale, float scale_log2, int vec) {
    constexpr int BK = Tile16<D>::ROWS, LD = Tile16<D>::LD;
    constexpr int DK = D / 16, DN = D / 8, KN = BK / 8;
    __shared__ __align__(16) bf16_t ks[2][BK * LD];
    __shared__ __align__(16) bf16_t vs[2][BK * LD];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int qt = gridDim.y - 1 - blockIdx.y;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const bf16_t* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const bf16_t* k_base = q_base + C;
    const bf16_t* v_base = q_base + 2 * C;
    const bf16_t* do_base = dout + (size_t)b * T * C + (size_t)h * HS;
    int q0 = qt * 64 + warp * 16;
    int r0 = q0 + g, r1 = q0 + g + 8;
    const float* lse_row = lse + (size_t)blockIdx.x * T;
    const float* delta_row = delta + (size_t)blockIdx.x * T;
    float lse0 = r0 < T ? lse_row[r0] : 0.0f, lse1 = r1 < T ? lse_row[r1] : 0.0f;
    float delta0 = r0 < T ? delta_row[r0] : 0.0f, delta1 = r1 < T ? delta_row[r1] : 0.0f;

    unsigned qa[DK][4], doa[DK][4];
    load_a16<DK>(qa, q_base, stride, r0, t, T, HS);
    load_a16<DK>(doa, do_base, C, r0, t, T, HS);
    float dq[DN][4];
#pragma unroll
    for (int n = 0; n < DN; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    int q_end = min(qt * 64 + 64, T);
    int n_tiles = (q_end + BK - 1) / BK;
    tile_load16<BK, D, LD>(ks[0], k_base, stride, 0, T, HS, vec);
    tile_load16<BK, D, LD>(vs[0], v_base, stride, 0, T, HS, vec);
    cp_async_commit();
    for (int kt = 0; kt < n_tiles; kt++) {
        int k0 = kt * BK, buf = kt & 1;
        if (kt + 1 < n_tiles) {
            tile_load16<BK, D, LD>(ks[buf ^ 1], k_base, stride, k0 + BK, T, HS, vec);
            tile_load16<BK, D, LD>(vs[buf ^ 1], v_base, stride, k0 + BK, T, HS, vec);
        }
        cp_async_commit();
        cp_async_wait_one();
        __syncthreads();
        if (k0 <= q0 + 15) {
            const bf16_t* k_s = ks[buf];
            const bf16_t* v_s = vs[buf];
            // s (16 x BK) = q · kᵀ, then p
            float s[KN][4];
#pragma unroll
            for (int n = 0; n < KN; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
#pragma unroll
                for (int n = 0; n < KN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_nmajor(bb, k_s, LD, n * 8, kk * 16);
                    mma_bf16(s[n], qa[kk], bb[0]);
                    mma_bf16(s[n + 1], qa[kk], bb[1]);
                }
            }
            probs(s, k0, r0, r1, t, lse0, lse1, scale_log2, k0 + BK - 1 > q0);
            // dp (16 x BK) = dout · vᵀ, then ds = p ⊙ (dp - delta) · scale
            float dp[KN][4];
#pragma unroll
            for (int n = 0; n < KN; n++) dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
#pragma unroll
                for (int n = 0; n < KN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_nmajor(bb, v_s, LD, n * 8, kk * 16);
                    mma_bf16(dp[n], doa[kk], bb[0]);
                    mma_bf16(dp[n + 1], doa[kk], bb[1]);
                }
            }
            ds_rows(dp, s, delta0, delta1);
            // dq (16 x D) += ds (16 x BK) · k (BK x D)
#pragma unroll
            for (int j = 0; j < KN / 2; j++) {
                unsigned a[4];
                acc_pair_as_a(a, dp[2 * j], dp[2 * j + 1]);
#pragma unroll
                for (int n = 0; n < DN; n += 2) {
                    unsigned bb[2][2];
                    ldsm_b_kmajor(bb, k_s, LD, j * 16, n * 8);
                    mma_bf16(dq[n], a, bb[0]);
                    mma_bf16(dq[n + 1], a, bb[1]);
                }
            }
        }
        __syncthreads();
    }
    add_rows(dqkv + (size_t)b * T * stride + (size_t)h * HS, stride, dq, r0, r1, t, T, HS, scale);
}

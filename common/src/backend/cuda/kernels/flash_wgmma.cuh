// The forward reads q from shared memory (both operands of q·kᵀ by descriptor) rather than from
// registers: ptxas of CUDA 13.0 gave the registers of a loop-invariant register operand (q's A
// fragments, read by every key tile's product) to the softmax's temporaries and p inside the
// loop, so every key tile after the first multiplied k by the previous tile's p (wrong results
// past the first query tile). ptxas 13.5 keeps them. The backward reads its
// loop-invariant operands (k, v; q, dout) from shared memory too; its per-iteration register
// operands (p, ds) are held live past their products' waits, and the per-tile test
// (`bf16_attention_errors_by_tile`) checks every tile on every device run.
// Flash attention for head size 64 on Hopper's warpgroup products (wgmma.mma_async, sm_90a):
// the schedule of flash_bf16.cuh (64 query or key rows a block, 16 a warp; online softmax in
// base 2; the deterministic two-kernel backward, no atomics) with every product issued by the
// block's four warps together as one warpgroup, m64n64k16: the left operand from registers
// (the same A fragments mma.sync takes) or from shared memory, the right one read by the tensor
// cores straight from shared memory, so no ldmatrix and no B fragments in registers, and the
// products run asynchronously to the issuing warps.
//
// Shared tiles are 64 rows of 64 bf16 (128 bytes), in the layout wgmma's 128-byte swizzle
// reads: the 16-byte chunk c of row r sits at chunk c ^ (r & 7) of that row, tiles 1024-byte
// aligned. The one stored layout serves both ways a tile is read: with the rows as the
// product's N and the 64 columns as its K ("K-major": kᵀ in q·kᵀ), or with the rows as K and
// the columns as N ("MN-major", transposed: v in p·v).
//
// Accumulators of m64n64 are, per warp, its 16 rows in eight 16x8 mma C fragments: d[n][i] is
// row g (i < 2) or g + 8, column 8n + 2t + (i & 1): the layout the shared softmax steps of
// flash_attention.cuh take. Needs flash_attention.cuh and flash_bf16.cuh first.
// Only in an sm_90a build (__CUDA_ARCH_FEAT_SM90_ALL); the launcher picks these kernels only
// there, for head size 64 with 16-byte-aligned rows.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Element offset of chunk c (8 bf16) of row r in a swizzled 64x64 tile.
__device__ __forceinline__ int swz(int r, int c) { return r * 64 + ((c ^ (r & 7)) << 3); }

// Starts copying rows [r0, r0 + 64) of a (T, stride) bf16 matrix (64 columns) into a swizzled
// tile by 16-byte cp.async; rows past T are zero-filled. Thread i copies chunk i % 8 of rows
// i / 8 + 16j (a fixed trip count, unrolled: the swizzle is the same every j).
__device__ __forceinline__ void tile_load_swz(bf16_t* tile, const bf16_t* base, size_t stride, int r0, int T) {
    static_assert(FLASH_THREADS == 128, "16 rows a pass");
    int c = threadIdx.x & 7, r = threadIdx.x >> 3;
    unsigned dst = shared_address(tile + swz(r, c));
    const bf16_t* src = base + (size_t)(r0 + r) * stride + c * 8;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        bool inside = r0 + r + 16 * j < T;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + j * 16 * 128),
                     "l"(inside ? src + (size_t)(16 * j) * stride : base), "r"(inside ? 16 : 0));
    }
}

// Waits for all but the newest cp.async group, then makes the landed tiles visible to the
// tensor cores (the async proxy) and to the whole block.
__device__ __forceinline__ void tiles_ready() {
    cp_async_wait_one();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
}

// The shared-memory matrix descriptor of a swizzled tile from `p` (start address, 16-byte
// units), 8-row groups 1024 bytes apart (the stride byte offset), 128-byte swizzle. The
// leading byte offset only matters for tiles wider than one 64-element swizzle atom, which
// these never are; 1024 too, so that either reading of the two fields finds the 8-row groups.
__device__ __forceinline__ unsigned long long wg_desc(const bf16_t* p) {
    unsigned long long a = shared_address(p);
    return ((a & 0x3FFFF) >> 4) | (64ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keeps the compiler from moving reads or writes of accumulator registers across the issue
// of an asynchronous product and the wait for it (CUTLASS's warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void wg_hold(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+f"(d[n][i])::"memory");
    }
}

// d (64x64, f32) = a (64x16, this warp's A fragment) · B (16x64 from shared memory, by
// `desc`), plus d where `acc` is not 0: TRANS 0 reads B's columns along the tile's rows
// (K-major), 1 its rows (MN-major). A product that starts an accumulator passes acc = 0 rather
// than zeroing the registers first (fewer instructions; what does corrupt results here is ptxas
// reusing a loop-invariant `a`'s registers: see the top of this file).
template <int TRANS>
__device__ __forceinline__ void wgmma64(float (&d)[8][4], const unsigned (&a)[4], unsigned long long desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TRANS), "r"(acc));
}

// d = A (64x16 from shared memory by `adesc`) · B (by `bdesc`), plus d where `acc` is not 0.
// TRANS 0 reads both K-major (each tile's rows are the product's M or N), 1 both MN-major (each
// tile's rows are the product's K).
template <int TRANS>
__device__ __forceinline__ void wgmma64_ss(float (&d)[8][4], unsigned long long adesc, unsigned long long bdesc,
                                           int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1, %35, %35;\n}"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(adesc), "l"(bdesc), "r"(acc), "n"(TRANS));
}

// d = a_tile (64x64, its rows the product's rows) · tileᵀ, both read from shared memory, waited for.
__device__ __forceinline__ void wg_product_ss_nt(float (&d)[8][4], const bf16_t* a_tile, const bf16_t* tile) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma64_ss<0>(d, wg_desc(a_tile + kk * 16), wg_desc(tile + kk * 16), kk > 0);
    wg_commit();
    wg_wait_all();
    wg_hold(d);
}

__device__ __forceinline__ void zero_acc(float (&d)[8][4]) {
#pragma unroll
    for (int n = 0; n < 8; n++) d[n][0] = d[n][1] = d[n][2] = d[n][3] = 0.0f;
}

// Issues d += a (64x64, four 16-wide A fragments along K) · tileᵀ: the tile's rows are the
// product's columns (K-major reads, advancing 16 columns = 32 bytes a step).
// `fresh`: d starts from this product (its old contents are not read).
__device__ __forceinline__ void wg_issue_nt(float (&d)[8][4], const unsigned (&a)[4][4], const bf16_t* tile,
                                            bool fresh) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma64<0>(d, a[kk], wg_desc(tile + kk * 16), kk > 0 || !fresh);
}

// Issues d += a (64x64, four A fragments along K) · tile: the tile's rows are the product's K
// (MN-major reads, advancing 16 rows = 2048 bytes a step).
__device__ __forceinline__ void wg_issue_nn(float (&d)[8][4], const unsigned (&a)[4][4], const bf16_t* tile,
                                            bool fresh) {
#pragma unroll
    for (int j = 0; j < 4; j++) wgmma64<1>(d, a[j], wg_desc(tile + j * 16 * 64), j > 0 || !fresh);
}

// The registers of A fragments read by a product in flight stay live and unmoved until here.
template <int J>
__device__ __forceinline__ void wg_keep(unsigned (&a)[J][4]) {
#pragma unroll
    for (int j = 0; j < J; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+r"(a[j][i])::"memory");
    }
}

// An accumulator tile rounded to bf16 as the A fragments of the next product.
__device__ __forceinline__ void acc_as_a16(unsigned (&a)[4][4], const float (&s)[8][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) acc_pair_as_a(a[j], s[2 * j], s[2 * j + 1]);
}

// d (+)= s (rounded to bf16) · tile, waited for; `fresh` as for wg_issue_nn.
__device__ __forceinline__ void wg_product_nn(float (&d)[8][4], const float (&s)[8][4], const bf16_t* tile,
                                              bool fresh) {
    unsigned a[4][4];
    acc_as_a16(a, s);
    wg_hold(d);
    wg_fence();
    wg_issue_nn(d, a, tile, fresh);
    wg_commit();
    wg_wait_all();
    wg_hold(d);
    wg_keep(a);
}

// ---- forward ------------------------------------------------------------------------------

// Grid (B·NH, ceil(T/64)), 128 threads; late (heavy) query tiles first. out (B,T,NH·HS), lse
// (B·NH, T) in base 2. Every key tile up to the block's last query is multiplied by all four
// warps (a warpgroup product); masking is per warp as in the mma.sync kernels. The block's
// queries stay in shared memory (q·kᵀ reads both operands there, as FlashAttention-3 does), not
// in registers across the loop: see the top of this file. p·v accumulates into o itself (o is
// rescaled by the softmax step before the product is issued, and wgmma.fence orders that write
// before the product reads o): 94 registers, so five blocks a multiprocessor. The output goes
// through shared memory and out in 16-byte stores. With q8 (`_fp8`: the attention projection's
// E4M3 input under --precision fp8), also the output as stored in E4M3 at q8_scale[0], laid out
// as out (8-byte stores) with its amax taken into amax, and transposed, (C, B·T), at q8t: column
// j's rows as 16-byte runs, a warp reading 32 neighbouring columns of a stage row; T a multiple
// of 16.
__device__ __forceinline__ void flashwg_forward(bf16_t* out, float* lse, const bf16_t* qkv, int T, int NH, int HS,
                                                float scale_log2, int /*vec: 16-byte rows, always here*/,
                                                unsigned char* q8, unsigned char* q8t, float* amax,
                                                const float* q8_scale) {
    __shared__ __align__(1024) bf16_t ks[2][64 * 64];
    __shared__ __align__(1024) bf16_t vs[2][64 * 64];
    __shared__ __align__(1024) bf16_t q_s[64 * 64];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int qt = gridDim.y - 1 - blockIdx.y;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const bf16_t* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const bf16_t* k_base = q_base + C;
    const bf16_t* v_base = q_base + 2 * C;
    int q0 = qt * 64 + warp * 16, r0 = q0 + g, r1 = r0 + 8;

    float o[8][4];
    zero_acc(o);
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    int n_tiles = qt + 1;  // key tiles 0..qt: the last holds the diagonal
    tile_load_swz(q_s, q_base, stride, qt * 64, T);  // with the first key tile's group
    tile_load_swz(ks[0], k_base, stride, 0, T);
    tile_load_swz(vs[0], v_base, stride, 0, T);
    cp_async_commit();
    for (int kt = 0; kt < n_tiles; kt++) {
        int k0 = kt * 64, buf = kt & 1;
        if (kt + 1 < n_tiles) {
            tile_load_swz(ks[buf ^ 1], k_base, stride, k0 + 64, T);
            tile_load_swz(vs[buf ^ 1], v_base, stride, k0 + 64, T);
        }
        cp_async_commit();
        tiles_ready();
        float s[8][4];
        wg_product_ss_nt(s, q_s, ks[buf]);  // s = q · kᵀ
        softmax_step(s, o, m0, m1, l0, l1, k0, r0, r1, t, scale_log2, k0 + 63 > q0);
        wg_product_nn(o, s, vs[buf], false);  // o += p · v
        __syncthreads();  // everyone is done with this buffer before it is refilled
    }
    // o over the row sums, rounded to bf16 into shared memory (the key tiles are free: the loop
    // ended on a barrier), then out in 16-byte stores, a row's 128 bytes together.
    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    unsigned* stage = (unsigned*)ks;  // 64 rows of 36 words (rows 16-byte aligned, writes free of bank conflicts)
    int lr = warp * 16 + g;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        stage[lr * 36 + n * 4 + t] = pack_bf16(o[n][0] * inv0, o[n][1] * inv0);
        stage[(lr + 8) * 36 + n * 4 + t] = pack_bf16(o[n][2] * inv1, o[n][3] * inv1);
    }
    __syncthreads();
    size_t at = (size_t)b * T * C + (size_t)h * HS;  // the head's offset in out (and in q8)
    float s8 = q8 ? q8_scale[0] : 0.0f;
    unsigned top = 0;  // the largest magnitude this thread quantized
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int r = qt * 64 + (threadIdx.x >> 3) + 16 * j, c = threadIdx.x & 7;
        if (r < T) {
            uint4 w = *(const uint4*)&stage[(r - qt * 64) * 36 + c * 4];
            *(uint4*)(out + at + (size_t)r * C + c * 8) = w;
            if (q8) {
                unsigned u[4] = {w.x, w.y, w.z, w.w};
                float v[8];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[2 * k] = __uint_as_float(u[k] << 16);
                    v[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
                }
                *reinterpret_cast<uint2*>(q8 + at + (size_t)r * C + c * 8) = fp8x8(v, s8, 0, top);
            }
        }
    }
    if (q8) {
        const bf16_t* st = (const bf16_t*)stage;  // 72 values a row
        size_t rows = (size_t)gridDim.x / NH * T;  // q8t's rows: B·T
        unsigned seen = 0;                         // the plain copy took these values' amax
#pragma unroll
        for (int i = threadIdx.x; i < 64 * 4; i += FLASH_THREADS) {
            int j = i % 64, r = 16 * (i / 64);
            if (qt * 64 + r < T) {
                unsigned w[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const bf16_t* s = &st[(r + 4 * q) * 72 + j];
                    w[q] = fp8x4(make_float4(to_f(s[0]), to_f(s[72]), to_f(s[144]), to_f(s[216])), s8, 0, seen);
                }
                *reinterpret_cast<uint4*>(q8t + ((size_t)h * HS + j) * rows + (size_t)b * T + qt * 64 + r) =
                    make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        __shared__ unsigned warp_top[FLASH_THREADS / 32];
        amax_atomic(amax, top, warp_top);
    }
    if (t == 0) {
        float* lse_row = lse + (size_t)blockIdx.x * T;
        if (r0 < T) lse_row[r0] = m0 + log2f(l0);
        if (r1 < T) lse_row[r1] = m1 + log2f(l1);
    }
}

// ---- backward -----------------------------------------------------------------------------
//
// Two kernels, no atomics: dK/dV per tile of 64 keys over the later queries, and dQ per tile of
// 64 queries over the earlier keys (which computes the scores and dP a second time). Their shape
// follows where Nsight Compute's per-instruction stall samples put the time (a read-modify-write
// of dqkv in two-byte loads is waited for load by load, as the compiler cannot prove the rows
// apart; so are two-byte loads of the k and v fragments in the prologue):
// - the model's call OVERWRITES dqkv (`ACCUMULATE` false: qkv's gradient is its first, so it is
//   neither zero-filled before nor read here); `ACCUMULATE` adds into it, for the trait's
//   accumulating call. Either way each accumulator tile goes through shared memory and out in
//   16-byte accesses, rows coalesced;
// - the block's own tiles (k and v; q and dout for dQ) come in by cp.async with the first loop
//   tile and the score products read them from shared memory (both operands by descriptor), 32
//   registers fewer than holding their fragments;
// - STAGES loop tiles in flight (a ring in dynamic shared memory, one barrier an iteration;
//   flash.rs builds 2: 3 was slower), and inside an iteration the second product of a pair runs
//   while the warps work on the first one's result (the exponentials while dpᵀ runs; dsᵀ while
//   dv += pᵀ·dout runs). The A fragments of a product in flight are kept live past its wait
//   (`wg_keep`).

template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// The first 1024-byte-aligned address of the dynamic shared memory (the swizzled tiles need it);
// the launcher asks for 1 KB more than the kernel uses.
__device__ __forceinline__ unsigned char* shared_1k() {
    extern __shared__ unsigned char dyn_smem[];
    unsigned a = shared_address(dyn_smem);
    return dyn_smem + (((a + 1023u) & ~1023u) - a);
}

// Issues d = a_tile (64x64 from shared memory, its rows the product's rows) · tileᵀ.
__device__ __forceinline__ void wg_issue_ss_nt(float (&d)[8][4], const bf16_t* a_tile, const bf16_t* tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma64_ss<0>(d, wg_desc(a_tile + kk * 16), wg_desc(tile + kk * 16), kk > 0);
}

// The FP8 copies that a backward kernel writes of the dqkv tiles it stores (`_wgmma_store_fp8`:
// the qkv product's E5M2 output gradient under --precision fp8): the copy laid out as dqkv, a
// byte a value; the transposed one, (3C, B·T), at the tile's first column and its batch's first
// row (`base_t`; rows `rows` = B·T bytes long); their scale; and the largest magnitude of the
// values stored so far by this thread (as amax_atomic takes it, which the kernel calls once at
// its end).
struct Fp8Copy {
    unsigned char* base;
    unsigned char* base_t;
    size_t rows;
    float scale;
    unsigned top;
};

// Rows [row0, row0 + 64) (those below T) x 64 columns of a (T, stride) bf16 matrix set to (or,
// with ACCUMULATE, added to) mul · acc (the block's 64x64 accumulator tile, 16 rows a warp),
// rounded once: through `stage` (64 rows of 72 floats: 8 of padding keep the float2 writes at
// two-way bank conflicts) and out in 16-byte accesses. With `part` (not with ACCUMULATE), also
// the tile's 64 column sums of the values as stored (rounded to bf16), in a fixed order, into
// part[0..64): a bias gradient's partial sums (the product whose output is qkv). Starts and ends
// with a barrier (the stage is shared memory the loop used; it is free for the next call after;
// the column sums' last step reads `col` after the closing barrier, and the next call writes it
// only past its own barriers). With fp8.base (not with ACCUMULATE), also the values as stored in
// E5M2 at fp8.base (the tile's offset from `base` in bytes as in elements), their amax taken,
// and transposed at fp8.base_t: column j's rows as 16-byte runs, a warp reading 32 neighbouring
// columns of a stage row (no bank conflicts); T a multiple of 16.
template <bool ACCUMULATE>
__device__ __forceinline__ void store_tile(bf16_t* base, size_t stride, const float (&acc)[8][4], float* stage,
                                           int row0, int T, float mul, float* part, Fp8Copy& fp8) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int lr = warp * 16 + g;
    bool with8 = !ACCUMULATE && fp8.base != nullptr;
    __syncthreads();
#pragma unroll
    for (int n = 0; n < 8; n++) {
        *(float2*)&stage[lr * 72 + n * 8 + 2 * t] = make_float2(mul * acc[n][0], mul * acc[n][1]);
        *(float2*)&stage[(lr + 8) * 72 + n * 8 + 2 * t] = make_float2(mul * acc[n][2], mul * acc[n][3]);
    }
    __syncthreads();
    // With `part`: thread x stores columns 8 (x & 7) .. + 8 of rows x / 8 + 16 j (j = 0..3) and
    // sums them as it goes; the four threads of a warp with the same columns are added by
    // shuffles, then the four warps in order through `col` (after the closing barrier).
    __shared__ float col[4][64];
    bool sums = !ACCUMULATE && part != nullptr;
    float cs[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = threadIdx.x; i < 64 * 8; i += FLASH_THREADS) {
        int r = i >> 3, c = i & 7;
        if (row0 + r < T) {
            bf16_t* p = base + (size_t)(row0 + r) * stride + c * 8;
            float v[8];
            float4 x = *(const float4*)&stage[r * 72 + c * 8], y = *(const float4*)&stage[r * 72 + c * 8 + 4];
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
            if (ACCUMULATE) {
                float old[8];
                load8(p, old);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = old[k] + v[k];
            } else if (sums || with8) {
                float stored[8];
#pragma unroll
                for (int k = 0; k < 8; k++) stored[k] = to_f(to_bf16(v[k]));
                if (sums) {
#pragma unroll
                    for (int k = 0; k < 8; k++) cs[k] += stored[k];
                }
                if (with8) {
                    size_t at = (size_t)(row0 + r) * stride + c * 8;
                    *reinterpret_cast<uint2*>(fp8.base + at) = fp8x8(stored, fp8.scale, 1, fp8.top);
                }
            }
            store8(p, v);
        }
    }
    if (with8) {
        unsigned seen = 0;  // the plain copy took these values' amax
#pragma unroll
        for (int i = threadIdx.x; i < 64 * 4; i += FLASH_THREADS) {
            int j = i % 64, r = 16 * (i / 64);
            if (row0 + r < T) {
                unsigned w[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float* s = &stage[(r + 4 * q) * 72 + j];
                    float4 v = make_float4(to_f(to_bf16(s[0])), to_f(to_bf16(s[72])), to_f(to_bf16(s[144])),
                                           to_f(to_bf16(s[216])));
                    w[q] = fp8x4(v, fp8.scale, 1, seen);
                }
                *reinterpret_cast<uint4*>(fp8.base_t + (size_t)j * fp8.rows + row0 + r) =
                    make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
    }
    if (sums) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            cs[k] += __shfl_xor_sync(0xffffffffu, cs[k], 8);
            cs[k] += __shfl_xor_sync(0xffffffffu, cs[k], 16);
        }
        if (lane < 8) {
#pragma unroll
            for (int k = 0; k < 8; k++) col[warp][lane * 8 + k] = cs[k];
        }
    }
    __syncthreads();
    if (sums && threadIdx.x < 64) part[threadIdx.x] = ((col[0][threadIdx.x] + col[1][threadIdx.x]) + col[2][threadIdx.x]) + col[3][threadIdx.x];
}

// dK and dV for one tile of 64 keys (16 per warp), over every later query in tiles of 64.
// Grid (B·NH, ceil(T/64)); dynamic shared memory: flash.rs `pipe_shared_bytes`.
// With `bias_part` (B·ceil(T/64) rows of 3C partial column sums of dqkv, a row per tile of 64
// positions), each block writes its tiles' sums there (store_tile's `part`).
template <int STAGES, bool ACCUMULATE>
__device__ __forceinline__ void flashwg_backward_dkdv(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv,
                                                           const float* lse, const float* delta, int T, int NH,
                                                           int HS, float scale, float scale_log2, int /*vec*/,
                                                           float* bias_part, unsigned char* q8, unsigned char* q8t,
                                                           float* amax, const float* q8_scale) {
    bf16_t* k_s = (bf16_t*)shared_1k();       // this block's keys, swizzled
    bf16_t* v_s = k_s + 64 * 64;              // and values
    bf16_t* qs = v_s + 64 * 64;               // [STAGES][64 * 64] query tiles, swizzled
    bf16_t* dos = qs + STAGES * 64 * 64;      // [STAGES][64 * 64] their output gradients
    float* lse_s = (float*)(dos + STAGES * 64 * 64);  // [STAGES][64]
    float* delta_s = lse_s + STAGES * 64;             // [STAGES][64]
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
    int kr0 = key0 + g, kr1 = kr0 + 8;
    float dk[8][4], dv[8][4];  // started by the first iteration's products

    int n_tiles = (T - k_start + 63) / 64;
    auto load = [&](int i) {  // query tile i of this block's loop into its slot
        if (i < n_tiles) {
            int slot = i % STAGES, q_start = k_start + i * 64;
            tile_load_swz(qs + slot * 4096, q_base, stride, q_start, T);
            tile_load_swz(dos + slot * 4096, do_base, C, q_start, T);
            vector_load(lse_s + slot * 64, lse_row, q_start, 64, T);
            vector_load(delta_s + slot * 64, delta_row, q_start, 64, T);
        }
        cp_async_commit();  // an empty group past the end keeps the count
    };
    tile_load_swz(k_s, k_base, stride, k_start, T);  // with tile 0's group
    tile_load_swz(v_s, v_base, stride, k_start, T);
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) load(i);
    for (int it = 0; it < n_tiles; it++) {
        int qs0 = k_start + it * 64, slot = it % STAGES;
        cp_async_wait<STAGES - 2>();  // tile `it` (and k, v) have landed
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();  // ...for everyone; and everyone is done with iteration it - 1's slot
        load(it + STAGES - 1);
        const bf16_t* q_t = qs + slot * 4096;
        const bf16_t* do_t = dos + slot * 4096;
        // sᵀ = k · qᵀ and dpᵀ = v · doutᵀ, two groups
        float st[8][4], dpt[8][4];
        wg_fence();
        wg_issue_ss_nt(st, k_s, q_t);
        wg_commit();
        wg_issue_ss_nt(dpt, v_s, do_t);
        wg_commit();
        wg_wait<1>();  // sᵀ is done; dpᵀ runs on
        wg_hold(st);
        probs_t(st, lse_s + slot * 64, qs0, kr0, kr1, t, T, scale_log2, qs0 < key0 + 15 || qs0 + 64 > T);
        unsigned pa[4][4];
        acc_as_a16(pa, st);
        wg_hold(dv);
        wg_fence();
        wg_issue_nn(dv, pa, do_t, it == 0);  // dv += pᵀ · dout
        wg_commit();
        wg_wait<1>();  // dpᵀ is done; dv runs on
        wg_hold(dpt);
        ds_t(dpt, st, delta_s + slot * 64, t);
        unsigned da[4][4];
        acc_as_a16(da, dpt);
        wg_hold(dk);
        wg_fence();
        wg_issue_nn(dk, da, q_t, it == 0);  // dk += dsᵀ · q
        wg_commit();
        wg_wait<0>();
        wg_hold(dv);
        wg_hold(dk);
        wg_keep(pa);
        wg_keep(da);
    }
    bf16_t* dk_base = dqkv + (size_t)b * T * stride + C + (size_t)h * HS;
    float* stage = (float*)qs;  // the ring, free now (store_tile's first barrier)
    float* part = bias_part ? bias_part + ((size_t)b * gridDim.y + blockIdx.y) * stride + C + (size_t)h * HS : nullptr;
    size_t at = (size_t)b * T * stride + C + (size_t)h * HS;  // dk's offset in dqkv (and in q8)
    size_t rows = (size_t)gridDim.x / NH * T;                 // q8t's rows: B·T
    size_t at_t = (C + (size_t)h * HS) * rows + (size_t)b * T;
    Fp8Copy copy = {q8 ? q8 + at : nullptr, q8 ? q8t + at_t : nullptr, rows, q8 ? q8_scale[0] : 0.0f, 0};
    store_tile<ACCUMULATE>(dk_base, stride, dk, stage, k_start, T, scale, part, copy);
    if (q8) {
        copy.base += C;
        copy.base_t += C * rows;
    }
    store_tile<ACCUMULATE>(dk_base + C, stride, dv, stage, k_start, T, 1.0f, part ? part + C : nullptr, copy);
    if (q8) {
        __shared__ unsigned warp_top[FLASH_THREADS / 32];
        amax_atomic(amax, copy.top, warp_top);
    }
}

// dQ for one tile of 64 queries (16 per warp), over keys in tiles of 64.
// Grid (B·NH, ceil(T/64)); late (heavy) query tiles first; dynamic shared memory: flash.rs.
// `bias_part` as in flashwg_backward_dkdv.
template <int STAGES, bool ACCUMULATE>
__device__ __forceinline__ void flashwg_backward_dq(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv,
                                                         const float* lse, const float* delta, int T, int NH, int HS,
                                                         float scale, float scale_log2, int /*vec*/, float* bias_part,
                                                         unsigned char* q8, unsigned char* q8t, float* amax,
                                                         const float* q8_scale) {
    bf16_t* q_s = (bf16_t*)shared_1k();   // this block's queries, swizzled
    bf16_t* do_s = q_s + 64 * 64;         // and their output gradients
    bf16_t* ks = do_s + 64 * 64;          // [STAGES][64 * 64] key tiles, swizzled
    bf16_t* vs = ks + STAGES * 64 * 64;   // [STAGES][64 * 64] value tiles
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    int qt = gridDim.y - 1 - blockIdx.y;
    int b = blockIdx.x / NH, h = blockIdx.x % NH;
    size_t C = (size_t)NH * HS, stride = 3 * C;
    const bf16_t* q_base = qkv + (size_t)b * T * stride + (size_t)h * HS;
    const bf16_t* k_base = q_base + C;
    const bf16_t* v_base = q_base + 2 * C;
    const bf16_t* do_base = dout + (size_t)b * T * C + (size_t)h * HS;
    int q0 = qt * 64 + warp * 16;
    int r0 = q0 + g, r1 = r0 + 8;
    const float* lse_row = lse + (size_t)blockIdx.x * T;
    const float* delta_row = delta + (size_t)blockIdx.x * T;
    float lse0 = r0 < T ? lse_row[r0] : 0.0f, lse1 = r1 < T ? lse_row[r1] : 0.0f;
    float delta0 = r0 < T ? delta_row[r0] : 0.0f, delta1 = r1 < T ? delta_row[r1] : 0.0f;
    float dq[8][4];  // started by the first iteration's product

    int n_tiles = qt + 1;
    auto load = [&](int i) {  // key tile i into its slot
        if (i < n_tiles) {
            int slot = i % STAGES;
            tile_load_swz(ks + slot * 4096, k_base, stride, i * 64, T);
            tile_load_swz(vs + slot * 4096, v_base, stride, i * 64, T);
        }
        cp_async_commit();
    };
    tile_load_swz(q_s, q_base, stride, qt * 64, T);  // with tile 0's group
    tile_load_swz(do_s, do_base, C, qt * 64, T);
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) load(i);
    for (int kt = 0; kt < n_tiles; kt++) {
        int k0 = kt * 64, slot = kt % STAGES;
        cp_async_wait<STAGES - 2>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        load(kt + STAGES - 1);
        const bf16_t* k_t = ks + slot * 4096;
        // s = q · kᵀ and dp = dout · vᵀ, two groups; p while dp runs
        float s[8][4], dp[8][4];
        wg_fence();
        wg_issue_ss_nt(s, q_s, k_t);
        wg_commit();
        wg_issue_ss_nt(dp, do_s, vs + slot * 4096);
        wg_commit();
        wg_wait<1>();
        wg_hold(s);
        probs(s, k0, r0, r1, t, lse0, lse1, scale_log2, k0 + 63 > q0);
        wg_wait<0>();
        wg_hold(dp);
        ds_rows(dp, s, delta0, delta1);
        unsigned da[4][4];
        acc_as_a16(da, dp);
        wg_hold(dq);
        wg_fence();
        wg_issue_nn(dq, da, k_t, kt == 0);  // dq += ds · k
        wg_commit();
        wg_wait<0>();
        wg_hold(dq);
        wg_keep(da);
    }
    float* part = bias_part ? bias_part + ((size_t)b * gridDim.y + qt) * stride + (size_t)h * HS : nullptr;
    size_t at = (size_t)b * T * stride + (size_t)h * HS;  // dq's offset in dqkv (and in q8)
    size_t rows = (size_t)gridDim.x / NH * T;             // q8t's rows: B·T
    size_t at_t = (size_t)h * HS * rows + (size_t)b * T;
    Fp8Copy copy = {q8 ? q8 + at : nullptr, q8 ? q8t + at_t : nullptr, rows, q8 ? q8_scale[0] : 0.0f, 0};
    store_tile<ACCUMULATE>(dqkv + at, stride, dq, (float*)ks, qt * 64, T, scale, part, copy);
    if (q8) {
        __shared__ unsigned warp_top[FLASH_THREADS / 32];
        amax_atomic(amax, copy.top, warp_top);
    }
}

#define FLASH_WGMMA_BODY(call) call
#else
// Not an sm_90a build: the kernels exist (so every build has the same names) but must not run.
#define FLASH_WGMMA_BODY(call) __trap()
#endif

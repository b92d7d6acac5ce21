// LayerNorm over the last dimension (eps 1e-5, as GPT-2). One warp per row for the row
// statistics and dinp; the weight and bias gradients reduce over rows in 32-column tiles.

#define LN_EPS 1e-5f

// out = (inp - mean) * rstd * w + b; saves mean (N) and rstd (N). Block: k warps, k rows.
extern "C" __global__ void layernorm_forward_kernel(act_t* out, float* mean, float* rstd, const act_t* inp,
                                                    const act_t* w, const act_t* b, int N, int C) {
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const act_t* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) sum += to_f(x[c]);
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float d = to_f(x[c]) - m;
        var += d * d;
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
    act_t* o = out + (size_t)row * C;
    for (int c = lane; c < C; c += WARP_SIZE) o[c] = from_f((to_f(x[c]) - m) * s * to_f(w[c]) + to_f(b[c]));
}

// dinp += (w·dout - mean(w·dout) - norm · mean(w·dout·norm)) · rstd, one warp per row. With
// `copy` (else null), the updated dinp is also written there: under a residual connection
// (add_layernorm_backward) dinp is the residual stream's gradient, and `copy` the gradient of
// the add's second input, which is the same.
extern "C" __global__ void layernorm_backward_dinp_kernel(act_t* dinp, act_t* copy, const act_t* dout,
                                                          const act_t* inp, const act_t* w, const float* mean,
                                                          const float* rstd, int N, int C) {
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const act_t* x = inp + off;
    const act_t* g = dout + off;
    float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float norm = (to_f(x[c]) - m) * s;
        float dnorm = to_f(w[c]) * to_f(g[c]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    act_t* d = dinp + off;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float norm = (to_f(x[c]) - m) * s;
        float dnorm = to_f(w[c]) * to_f(g[c]);
        act_t v = from_f(to_f(d[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
        d[c] = v;
        if (copy) copy[off + c] = v;
    }
}

// layernorm_forward_kernel and layernorm_backward_dinp_kernel for C a multiple of 4 and rows
// aligned to 4 elements: each lane reads and writes 4 consecutive values at a time (16 bytes
// in f32, 8 in bf16) instead of one, so a warp moves 512 (256) bytes per instruction.
// One row of layernorm_forward_vec4_kernel, for `lane` of the row's warp: shared with
// add_layernorm_forward_vec4_kernel, so that the fused op's statistics and output are these,
// bit for bit (`--recompute` computes its output again with layernorm_forward).
// With `q` (FP8 training), the row's output also goes there in FP8, as quantize_fp8_kernel
// writes it from the rounded output (times `qs`; `top` takes the magnitudes' largest), and with
// `q_tile` there too (a row of a block's shared-memory tile).
__device__ __forceinline__ void layernorm_row_vec4(act_t* o, float* mean, float* rstd, const act_t* x,
                                                   const act_t* w, const act_t* b, int lane, int C,
                                                   unsigned char* q = nullptr, float qs = 1.0f, int e5m2 = 0,
                                                   unsigned* top = nullptr, unsigned char* q_tile = nullptr) {
    float sum = 0.0f;
    for (int c = 4 * lane; c < C; c += 4 * WARP_SIZE) {
        float4 v = load4(x + c);
        sum += (v.x + v.y) + (v.z + v.w);
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = 4 * lane; c < C; c += 4 * WARP_SIZE) {
        float4 v = load4(x + c);
        float d0 = v.x - m, d1 = v.y - m, d2 = v.z - m, d3 = v.w - m;
        var += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
    for (int c = 4 * lane; c < C; c += 4 * WARP_SIZE) {
        float4 v = load4(x + c), wv = load4(w + c), bv = load4(b + c);
        float4 y = make_float4((v.x - m) * s * wv.x + bv.x, (v.y - m) * s * wv.y + bv.y,
                               (v.z - m) * s * wv.z + bv.z, (v.w - m) * s * wv.w + bv.w);
        store4(o + c, y);
        if (q) {
            float r[4] = {to_f(from_f(y.x)), to_f(from_f(y.y)), to_f(from_f(y.z)), to_f(from_f(y.w))};
#pragma unroll
            for (int k = 0; k < 4; k++) *top = max(*top, __float_as_uint(fabsf(r[k])));
            unsigned bytes =
                (unsigned)fp8x2(r[0] * qs, r[1] * qs, e5m2) | ((unsigned)fp8x2(r[2] * qs, r[3] * qs, e5m2) << 16);
            *reinterpret_cast<unsigned*>(q + c) = bytes;
            if (q_tile) *reinterpret_cast<unsigned*>(q_tile + c) = bytes;
        }
    }
}

extern "C" __global__ void layernorm_forward_vec4_kernel(act_t* out, float* mean, float* rstd, const act_t* inp,
                                                         const act_t* w, const act_t* b, int N, int C) {
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    layernorm_row_vec4(out + off, mean + row, rstd + row, inp + off, w, b, lane, C);
}

// The residual connection and the layernorm after it in one pass (llm.c's
// fused_residual_forward): sum = a + b, rounded to act_t as add_vec4_kernel rounds it, then
// layernorm_forward_vec4_kernel's row over the rounded sum. a and b are read once; the
// statistics and the output re-read the row of `sum` this lane has just written (its own
// writes, from L2), where `add` then `layernorm_forward` read the sum back from memory in a
// second kernel.
// C a multiple of 4, rows aligned to 4 elements; one warp per row.
// One row of it (`q` and after: layernorm_row_vec4's, `q` the row's own copy).
__device__ __forceinline__ void add_layernorm_row_vec4(act_t* sum, act_t* out, float* mean, float* rstd,
                                                       const act_t* a, const act_t* b, const act_t* w,
                                                       const act_t* bias, int row, int C,
                                                       unsigned char* q = nullptr, float qs = 1.0f, int e5m2 = 0,
                                                       unsigned* top = nullptr, unsigned char* q_tile = nullptr) {
    int lane = threadIdx.x % WARP_SIZE;
    size_t off = (size_t)row * C;
    act_t* s = sum + off;
    for (int c = 4 * lane; c < C; c += 4 * WARP_SIZE) {
        float4 x = load4(a + off + c), y = load4(b + off + c);
        store4(s + c, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
    }
    layernorm_row_vec4(out + off, mean + row, rstd + row, s, w, bias, lane, C, q, qs, e5m2, top, q_tile);
}

extern "C" __global__ void add_layernorm_forward_vec4_kernel(act_t* sum, act_t* out, float* mean, float* rstd,
                                                             const act_t* a, const act_t* b, const act_t* w,
                                                             const act_t* bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row < N) add_layernorm_row_vec4(sum, out, mean, rstd, a, b, w, bias, row, C);
}

// add_layernorm_forward_vec4_kernel, and its output's FP8 copy for the next FP8 product:
// dst = fp8(out * scale[0]) of out as rounded, amax as quantize_fp8_kernel's (one atomic a
// block). dst aligned to 4 bytes.
extern "C" __global__ void add_layernorm_forward_quantize_kernel(act_t* sum, act_t* out, float* mean, float* rstd,
                                                                 const act_t* a, const act_t* b, const act_t* w,
                                                                 const act_t* bias, unsigned char* dst, float* amax,
                                                                 const float* scale, int N, int C, int e5m2) {
    __shared__ unsigned warp_top[32];
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned top = 0;
    // Every thread reaches the block's amax below.
    if (row < N)
        add_layernorm_row_vec4(sum, out, mean, rstd, a, b, w, bias, row, C, dst + (size_t)row * C, scale[0], e5m2, &top);
    amax_atomic(amax, top, warp_top);
}

// The dynamic shared memory add_layernorm_forward_quantize_t_kernel stages its copy in.
extern __shared__ __align__(16) unsigned char ln_tile[];

// add_layernorm_forward_quantize_kernel with the FP8 copy transposed too, dst_t (C, N) at the
// same scale (the next product's weight-gradient operand). A block takes `rows` rows (16 or
// 32), warp w rows w, w + 8, ...; each row's copy goes to dst as it is made and to shared
// memory too (rows·C bytes, dynamic). Past the barrier the block stores the tile transposed, a
// column a thread, neighbouring lanes on neighbouring columns (a warp reads 32 neighbouring
// bytes of a tile row: no bank conflicts), each column's `rows` bytes in 16-byte stores along
// dst_t's row. N a multiple of `rows`, dst aligned to 4 bytes, dst_t to 16.
extern "C" __global__ void add_layernorm_forward_quantize_t_kernel(act_t* sum, act_t* out, float* mean, float* rstd,
                                                                   const act_t* a, const act_t* b, const act_t* w,
                                                                   const act_t* bias, unsigned char* dst,
                                                                   unsigned char* dst_t, float* amax,
                                                                   const float* scale, int N, int C, int e5m2,
                                                                   int rows) {
    __shared__ unsigned warp_top[32];
    int r0 = blockIdx.x * rows;
    unsigned top = 0;
    for (int i = threadIdx.x / WARP_SIZE; i < rows; i += blockDim.x / WARP_SIZE) {
        unsigned char* q = dst + (size_t)(r0 + i) * C;
        add_layernorm_row_vec4(sum, out, mean, rstd, a, b, w, bias, r0 + i, C, q, scale[0], e5m2, &top,
                               ln_tile + (size_t)i * C);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        for (int h = 0; h < rows; h += 16) {
            const unsigned char* p = ln_tile + (size_t)h * C + c;
            unsigned v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const unsigned char* q = p + (size_t)4 * k * C;
                v[k] = (unsigned)q[0] | ((unsigned)q[C] << 8) | ((unsigned)q[2 * C] << 16) | ((unsigned)q[3 * C] << 24);
            }
            *reinterpret_cast<uint4*>(dst_t + (size_t)c * N + r0 + h) = make_uint4(v[0], v[1], v[2], v[3]);
        }
    }
    amax_atomic(amax, top, warp_top);
}

extern "C" __global__ void layernorm_backward_dinp_vec4_kernel(act_t* dinp, act_t* copy, const act_t* dout,
                                                               const act_t* inp, const act_t* w, const float* mean,
                                                               const float* rstd, int N, int C) {
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const act_t* x = inp + off;
    const act_t* g = dout + off;
    float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 4 * lane; c < C; c += 4 * WARP_SIZE) {
        float4 xv = load4(x + c), gv = load4(g + c), wv = load4(w + c);
        float dn[4] = {wv.x * gv.x, wv.y * gv.y, wv.z * gv.z, wv.w * gv.w};
        float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            dnorm_mean += dn[k];
            dnorm_norm_mean += dn[k] * ((xs[k] - m) * s);
        }
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    act_t* d = dinp + off;
    for (int c = 4 * lane; c < C; c += 4 * WARP_SIZE) {
        float4 xv = load4(x + c), gv = load4(g + c), wv = load4(w + c), dv = load4(d + c);
        float dn[4] = {wv.x * gv.x, wv.y * gv.y, wv.z * gv.z, wv.w * gv.w};
        float xs[4] = {xv.x, xv.y, xv.z, xv.w};
        float ds[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int k = 0; k < 4; k++) ds[k] += (dn[k] - dnorm_mean - (xs[k] - m) * s * dnorm_norm_mean) * s;
        float4 v = make_float4(ds[0], ds[1], ds[2], ds[3]);
        store4(d + c, v);
        if (copy) store4(copy + off + c, v);  // the same rounding as d's
    }
}

// The chunk's partial sums of dw[c] = Σ_rows norm·dout and db[c] = Σ_rows dout, into
// dw_partials[chunk, c] and db_partials[chunk, c]; column_sums_finish_kernel adds the chunks in order.
// Block (32, 8): 32 columns, 8 row lanes; blockIdx.y picks a chunk of `rows_per_block` rows.
extern "C" __global__ void layernorm_backward_params_kernel(float* dw_partials, float* db_partials, const act_t* dout,
                                                            const act_t* inp, const float* mean,
                                                            const float* rstd, int N, int C,
                                                            int rows_per_block) {
    __shared__ float dw_part[8][33];
    __shared__ float db_part[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    float dw_sum = 0.0f, db_sum = 0.0f;
    if (c < C) {
        for (int row = row_start + ty; row < row_end; row += blockDim.y) {
            size_t i = (size_t)row * C + c;
            float g = to_f(dout[i]);
            dw_sum += (to_f(inp[i]) - mean[row]) * rstd[row] * g;
            db_sum += g;
        }
    }
    dw_part[ty][tx] = dw_sum;
    db_part[ty][tx] = db_sum;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 1; k < blockDim.y; k++) {
            dw_sum += dw_part[k][tx];
            db_sum += db_part[k][tx];
        }
        dw_partials[(size_t)blockIdx.y * C + c] = dw_sum;
        db_partials[(size_t)blockIdx.y * C + c] = db_sum;
    }
}

// layernorm_backward_params_kernel for C a multiple of 4 and rows aligned to 4 elements: each lane
// owns 4 columns, 8 warps take every 8th row of a chunk (as bias_backward_vec4_kernel).
// Grid (ceil(C/128), ceil(N/rows_per_block)), 256 threads.
extern "C" __global__ void layernorm_backward_params_vec4_kernel(float* dw_partials, float* db_partials, const act_t* dout,
                                                                 const act_t* inp, const float* mean,
                                                                 const float* rstd, int N, int C,
                                                                 int rows_per_block) {
    __shared__ float4 dw_part[8][32];
    __shared__ float4 db_part[8][32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int c = (blockIdx.x * 32 + lane) * 4;
    int row_start = blockIdx.y * rows_per_block;
    int row_end = min(row_start + rows_per_block, N);
    float4 dws = make_float4(0.0f, 0.0f, 0.0f, 0.0f), dbs = dws;
    if (c < C) {
#pragma unroll 2
        for (int row = row_start + warp; row < row_end; row += 8) {
            size_t i = (size_t)row * C + c;
            float4 g = load4(dout + i);
            float4 x = load4(inp + i);
            float m = mean[row], s = rstd[row];
            dws.x += (x.x - m) * s * g.x;
            dws.y += (x.y - m) * s * g.y;
            dws.z += (x.z - m) * s * g.z;
            dws.w += (x.w - m) * s * g.w;
            dbs.x += g.x;
            dbs.y += g.y;
            dbs.z += g.z;
            dbs.w += g.w;
        }
    }
    dw_part[warp][lane] = dws;
    db_part[warp][lane] = dbs;
    __syncthreads();
    if (warp == 0 && c < C) {
        for (int k = 1; k < 8; k++) {
            float4 a = dw_part[k][lane], b = db_part[k][lane];
            dws.x += a.x;
            dws.y += a.y;
            dws.z += a.z;
            dws.w += a.w;
            dbs.x += b.x;
            dbs.y += b.y;
            dbs.z += b.z;
            dbs.w += b.w;
        }
        *reinterpret_cast<float4*>(dw_partials + (size_t)blockIdx.y * C + c) = dws;
        *reinterpret_cast<float4*>(db_partials + (size_t)blockIdx.y * C + c) = dbs;
    }
}

// layernorm_backward_dinp_vec4_kernel and layernorm_backward_params_vec4_kernel in one pass over
// dout and inp: a block of 8 warps takes `rows_per_block` rows (a warp every 8th, one row at a
// time, its dinp exactly as the dinp kernel computes it, from one load of the row's input,
// output gradient and old dinp) and sums its rows' dw = norm·dout and
// db = dout per column in registers, then writes the block's partial sums (warps added in
// order) into dw_partials[blockIdx.x, c], db_partials[blockIdx.x, c]; column_sums_finish_kernel
// adds the blocks in order (no atomics). K: float4 columns a lane (C a multiple of 4, C ≤ 128 K).
// SUM_DINP (the `_sum` instances): also the column sums of the new dinp as stored (rounded to
// act_t), into dinp_partials[blockIdx.x, c]: the bias gradient of the product whose output
// gradient dinp is (Backend::add_layernorm_backward's dbias), from the registers that write it.
// Grid ceil(N / rows_per_block), 256 threads.
template <int K, bool SUM_DINP>
__device__ __forceinline__ void layernorm_backward_fused(act_t* dinp, act_t* copy, float* dw_partials,
                                                         float* db_partials, float* dinp_partials,
                                                         const act_t* dout, const act_t* inp, const act_t* w,
                                                         const float* mean, const float* rstd, int N, int C,
                                                         int rows_per_block) {
    __shared__ float4 part[8][32];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    float4 dw[K], db[K], dd[SUM_DINP ? K : 1];
#pragma unroll
    for (int k = 0; k < K; k++) dw[k] = db[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < (SUM_DINP ? K : 1); k++) dd[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int row_end = min((blockIdx.x + 1) * rows_per_block, N);
    for (int row = blockIdx.x * rows_per_block + warp; row < row_end; row += 8) {
        size_t off = (size_t)row * C;
        act_t* d = dinp + off;
        // The row's input, its output gradient and dinp's old value, all loaded at once (one
        // wait for memory a row, not two), kept as loaded until after the row's sums.
        raw4_t xr[K], gr[K], dr[K];
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = 4 * lane + 128 * k;
            if (c < C) {
                xr[k] = load_raw4(inp + off + c);
                gr[k] = load_raw4(dout + off + c);
                dr[k] = load_raw4(d + c);
            }
        }
        float m = mean[row], s = rstd[row];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = 4 * lane + 128 * k;
            if (c < C) {
                float4 xv = unpack4(xr[k]), g = unpack4(gr[k]), wv = load4(w + c);
                float4 xn = make_float4((xv.x - m) * s, (xv.y - m) * s, (xv.z - m) * s, (xv.w - m) * s);
                float dn[4] = {wv.x * g.x, wv.y * g.y, wv.z * g.z, wv.w * g.w};
                float xs[4] = {xn.x, xn.y, xn.z, xn.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    dnorm_mean += dn[j];
                    dnorm_norm_mean += dn[j] * xs[j];
                }
                dw[k].x += xn.x * g.x;
                dw[k].y += xn.y * g.y;
                dw[k].z += xn.z * g.z;
                dw[k].w += xn.w * g.w;
                db[k].x += g.x;
                db[k].y += g.y;
                db[k].z += g.z;
                db[k].w += g.w;
            }
        }
        dnorm_mean = warp_sum(dnorm_mean) / C;
        dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = 4 * lane + 128 * k;
            if (c < C) {
                float4 xv = unpack4(xr[k]), g = unpack4(gr[k]), wv = load4(w + c), dv = unpack4(dr[k]);
                float dn[4] = {wv.x * g.x, wv.y * g.y, wv.z * g.z, wv.w * g.w};
                float xs[4] = {(xv.x - m) * s, (xv.y - m) * s, (xv.z - m) * s, (xv.w - m) * s};
                float ds[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
                for (int j = 0; j < 4; j++) ds[j] += (dn[j] - dnorm_mean - xs[j] * dnorm_norm_mean) * s;
                float4 v = make_float4(ds[0], ds[1], ds[2], ds[3]);
                store4(d + c, v);
                if (copy) store4(copy + off + c, v);  // the same rounding as d's
                if (SUM_DINP) {
                    // As stored: the values a column sum over dinp would read back.
                    dd[k].x += to_f(from_f(v.x));
                    dd[k].y += to_f(from_f(v.y));
                    dd[k].z += to_f(from_f(v.z));
                    dd[k].w += to_f(from_f(v.w));
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        int c = 4 * lane + 128 * k;
#pragma unroll
        for (int which = 0; which < (SUM_DINP ? 3 : 2); which++) {
            float* out = which == 0 ? dw_partials : which == 1 ? db_partials : dinp_partials;
            part[warp][lane] = which == 0 ? dw[k] : which == 1 ? db[k] : dd[SUM_DINP ? k : 0];
            __syncthreads();
            if (warp == 0 && c < C) {
                float4 sum = part[0][lane];
                for (int j = 1; j < 8; j++) {
                    float4 v = part[j][lane];
                    sum.x += v.x;
                    sum.y += v.y;
                    sum.z += v.z;
                    sum.w += v.w;
                }
                *reinterpret_cast<float4*>(out + (size_t)blockIdx.x * C + c) = sum;
            }
            __syncthreads();
        }
    }
}

#define LN_FUSED_PARAMS                                                                                          \
    act_t *dinp, act_t *copy, float *dw_partials, float *db_partials, float *dinp_partials, const act_t *dout,     \
        const act_t *inp, const act_t *w, const float *mean, const float *rstd, int N, int C, int rows_per_block
#define LN_FUSED_ARGS dinp, copy, dw_partials, db_partials, dinp_partials, dout, inp, w, mean, rstd, N, C, rows_per_block
// In bf16 the k6 instance without dinp's sums fits two blocks a multiprocessor (122 registers);
// the sums' 24 registers more would leave one, so they are held to 128 (a few bytes spilled).
// In fp32 (float4 loads held) neither fits two.
#if ACT_BF16
#define LN_K6_SUM_BLOCKS 2
#else
#define LN_K6_SUM_BLOCKS 1
#endif
// Instances for C up to 768 (GPT-2 small), 1024 (medium), 1280 (large) and 1664 (XL's 1600), each
// without and with dinp's column sums (written out: the loader reads kernel names from the source).
extern "C" __global__ void layernorm_backward_fused_k6_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<6, false>(LN_FUSED_ARGS); }
extern "C" __global__ void layernorm_backward_fused_k8_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<8, false>(LN_FUSED_ARGS); }
extern "C" __global__ void layernorm_backward_fused_k10_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<10, false>(LN_FUSED_ARGS); }
extern "C" __global__ void layernorm_backward_fused_k13_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<13, false>(LN_FUSED_ARGS); }
extern "C" __global__ void __launch_bounds__(256, LN_K6_SUM_BLOCKS) layernorm_backward_fused_k6_sum_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<6, true>(LN_FUSED_ARGS); }
extern "C" __global__ void layernorm_backward_fused_k8_sum_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<8, true>(LN_FUSED_ARGS); }
extern "C" __global__ void layernorm_backward_fused_k10_sum_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<10, true>(LN_FUSED_ARGS); }
extern "C" __global__ void layernorm_backward_fused_k13_sum_kernel(LN_FUSED_PARAMS) { layernorm_backward_fused<13, true>(LN_FUSED_ARGS); }

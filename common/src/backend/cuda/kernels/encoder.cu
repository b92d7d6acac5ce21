// Token + position embedding: out (B,T,C) = wte[tokens] + wpe[t]; backward sums into both
// tables in a fixed order (no atomics): for wte each token's rows in the order of `order`
// (positions sorted by token; in chunks, then the chunks in order, where C allows), for wpe
// a loop over B.

extern "C" __global__ void encoder_forward_kernel(act_t* out, const int* tokens, const int* first_position,
                                                  const act_t* wte, const act_t* wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % C);
    size_t bt = i / C;
    int t = (int)(bt % T) + (first_position ? *first_position : 0);
    int token = tokens[bt];
    out[i] = from_f(to_f(wte[(size_t)token * C + c]) + to_f(wpe[(size_t)t * C + c]));
}

// dwte[token] += Σ dout[rows of that token]: thread (k, c) for the k-th position in
// `order` (positions sorted by token); the first position of each token's run sums the
// run's rows in order, the others return.
extern "C" __global__ void encoder_backward_wte_kernel(float* dwte, const act_t* dout, const int* tokens,
                                                       const int* order, int B, int T, int C) {
    size_t bt = (size_t)B * T;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= bt * C) return;
    int c = (int)(i % C);
    size_t k = i / C;
    int token = tokens[order[k]];
    if (k > 0 && tokens[order[k - 1]] == token) return;
    float sum = 0.0f;
    for (size_t j = k; j < bt && tokens[order[j]] == token; j++) sum += to_f(dout[(size_t)order[j] * C + c]);
    dwte[(size_t)token * C + c] += sum;
}

// encoder_backward_wte_kernel without its serial chain as long as a token's run (a text's
// commonest token, " " or "\n", can fill a fifth of a batch: thousands of rows added one after
// another, each waiting for the last: milliseconds), in two deterministic passes, for C a
// multiple of 8. The positions in `order` are cut into chunks of WTE_CHUNK; each chunk is
// split into pieces (its maximal runs of one token). Pass 1: a warp per chunk and 256-column
// tile sums each piece's rows in order (each lane 8 columns); a piece that is a whole run
// adds into dwte at once; a piece that goes on from the chunk before goes to the chunk's slot
// 0 of `partials`, one that goes on into the next chunk (and started in this one) to slot 1.
// Pass 2 (encoder_backward_wte_runs_kernel): the chunk where such a run starts adds its slot 1
// and the slot 0 of every chunk the run reaches, in order, into dwte. Grid
// (ceil(chunks / 8), ceil(C / 256)), 256 threads; `partials`: 2 · chunks · C floats.
#define WTE_CHUNK 32
extern "C" __global__ void encoder_backward_wte_chunks_kernel(float* __restrict__ dwte, float* __restrict__ partials,
                                                              const act_t* __restrict__ dout,
                                                              const int* __restrict__ tokens,
                                                              const int* __restrict__ order, int BT, int C) {
    const unsigned full = 0xffffffffu;
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int chunk = blockIdx.x * 8 + warp;
    int start = chunk * WTE_CHUNK;
    if (start >= BT) return;
    int n = min(WTE_CHUNK, BT - start);
    int c0 = blockIdx.y * 256 + lane * 8;
    bool mine = c0 < C;
    // Lane i holds the chunk's i-th row and its token; the neighbours' tokens tell whether
    // the first piece goes on from the chunk before and the last into the next.
    int my_row = lane < n ? order[start + lane] : 0;
    int my_tok = lane < n ? tokens[my_row] : -1;
    int before = start > 0 ? tokens[order[start - 1]] : -1;
    int after = start + n < BT ? tokens[order[start + n]] : -1;  // the next chunk's first
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    bool first_piece = true;
    for (int g = 0; g < n; g += 8) {
        // Eight rows' loads in flight, then added in order.
        float v[8][8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int row = __shfl_sync(full, my_row, (g + u) & 31);
            if (mine && g + u < n) load8(dout + (size_t)row * C + c0, v[u]);
            else {
#pragma unroll
                for (int k = 0; k < 8; k++) v[u][k] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = g + u;
            int tok = __shfl_sync(full, my_tok, i & 31);
            int next = __shfl_sync(full, my_tok, (i + 1) & 31);
            if (i >= n) break;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += v[u][k];
            if (next == tok && i + 1 < n) continue;  // the chunk's last row ends its last piece
            // The piece ends at row i: a whole run into dwte, else into its slot.
            bool from_before = first_piece && tok == before;
            bool into_next = i + 1 == n && tok == after;
            if (mine) {
                if (from_before || into_next) {
                    store8(partials + ((size_t)chunk * 2 + (from_before ? 0 : 1)) * C + c0, acc);
                } else {
                    float* d = dwte + (size_t)tok * C + c0;
                    float old[8];
                    load8(d, old);
#pragma unroll
                    for (int k = 0; k < 8; k++) old[k] += acc[k];
                    store8(d, old);
                }
            }
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] = 0.0f;
            first_piece = false;
        }
    }
}

// Pass 2 of the wte gradient (see encoder_backward_wte_chunks_kernel): block x is chunk x,
// thread y·256 + threadIdx.x column; the chunk where a run that reaches past it starts adds
// that run's pieces, its own slot 1, then slot 0 of each later chunk up to the run's end.
extern "C" __global__ void encoder_backward_wte_runs_kernel(float* dwte, const float* partials, const int* tokens,
                                                            const int* order, int BT, int C) {
    int chunk = blockIdx.x;
    int start = chunk * WTE_CHUNK, end = min(start + WTE_CHUNK, BT);
    int c = blockIdx.y * 256 + threadIdx.x;
    if (end >= BT || c >= C) return;
    int tok = tokens[order[end - 1]];
    if (tokens[order[end]] != tok) return;  // the chunk's last run ends in it
    // A chunk inside a run that started before it is not where that run is summed.
    if (start > 0 && tokens[order[start]] == tok && tokens[order[start - 1]] == tok) return;
    // The run's end: the first position after it (tokens ascend along `order`).
    int lo = end, hi = BT;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (tokens[order[mid]] <= tok) lo = mid + 1;
        else hi = mid;
    }
    int last = (lo - 1) / WTE_CHUNK;
    float sum = partials[((size_t)chunk * 2 + 1) * C + c];
#pragma unroll 8
    for (int s = chunk + 1; s <= last; s++) sum += partials[(size_t)s * 2 * C + c];
    dwte[(size_t)tok * C + c] += sum;
}

// dwpe[t] += Σ_b dout[b,t]: one thread per (t, c), summing over B in a fixed order.
extern "C" __global__ void encoder_backward_wpe_kernel(float* dwpe, const act_t* dout, int B, int T, int C) {
    size_t n = (size_t)T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += to_f(dout[(size_t)b * T * C + i]);
    dwpe[i] += sum;
}

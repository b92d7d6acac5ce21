// Attention against a key/value cache, for text generation (Backend::attention_cached_forward):
// the new positions' keys and values are written into the cache, then each new query attends
// over every cached position up to its own. Plain f32 arithmetic on act_t operands (f32 or
// bf16), no tensor cores: a decode step is one query per head, bound by reading the cache.
// The first new position `pos` is read from device memory, so one recorded decode step (a CUDA
// graph) replays at every position.

// Rows pos..pos+T of k_cache and v_cache (each (rows, C)) = the keys and values of qkv (T, 3C).
extern "C" __global__ void kv_cache_write_kernel(act_t* k_cache, act_t* v_cache, const act_t* qkv, const int* pos,
                                                 int T, int C) {
    size_t n = (size_t)T * C;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t t = i / C, d = i % C;
    size_t dst = ((size_t)*pos + t) * C + d;
    k_cache[dst] = qkv[t * 3 * C + C + d];
    v_cache[dst] = qkv[t * 3 * C + 2 * C + d];
}

// One block per (new query i, head h): out[i, h] = softmax(scale · q · Kᵀ) · V over cache rows
// 0..=pos+i. `scores` is scratch of (T, NH, rows) floats. A thread per key for the scores; for
// the weighted sum the block's threads form groups of HS (one output channel each), group g
// summing keys g, g + groups, ... and the groups' sums added in group order (fixed, no atomics).
extern "C" __global__ void attention_cached_kernel(act_t* out, float* scores, const act_t* k_cache,
                                                   const act_t* v_cache, const act_t* qkv, const int* pos_at,
                                                   int rows, int T, int C, int NH) {
    __shared__ float reduce[32];
    __shared__ float partial[1024];
    int i = blockIdx.x, h = blockIdx.y;
    int HS = C / NH, keys = *pos_at + i + 1;
    float scale = rsqrtf((float)HS);
    const act_t* q = qkv + (size_t)i * 3 * C + (size_t)h * HS;
    float* s = scores + ((size_t)i * NH + h) * rows;
    float local_max = NEG_INF;
    for (int j = threadIdx.x; j < keys; j += blockDim.x) {
        const act_t* k = k_cache + (size_t)j * C + (size_t)h * HS;
        float dot = 0.0f;
        for (int d = 0; d < HS; d++) dot += to_f(q[d]) * to_f(k[d]);
        dot *= scale;
        s[j] = dot;
        local_max = fmaxf(local_max, dot);
    }
    float maxv = block_max(local_max, reduce);
    float local_sum = 0.0f;
    for (int j = threadIdx.x; j < keys; j += blockDim.x) {
        float e = expf(s[j] - maxv);
        s[j] = e;
        local_sum += e;
    }
    float inv = 1.0f / block_sum(local_sum, reduce);
    __syncthreads();  // every exponential is in `s` before any thread reads them all
    int groups = min((int)blockDim.x / HS, 1024 / HS), g = threadIdx.x / HS, d = threadIdx.x % HS;
    if (groups < 1) groups = 1;  // HS above the block: one group, channels in turn
    if (g < groups) {
        for (int dd = d; dd < HS; dd += blockDim.x) {
            float acc = 0.0f;
            for (int j = g; j < keys; j += groups)
                acc += s[j] * to_f(v_cache[(size_t)j * C + (size_t)h * HS + dd]);
            if (groups > 1) {
                partial[g * HS + dd] = acc;
            } else {
                out[(size_t)i * C + (size_t)h * HS + dd] = from_f(acc * inv);
            }
        }
    }
    if (groups > 1) {
        __syncthreads();
        for (int dd = threadIdx.x; dd < HS; dd += blockDim.x) {
            float acc = 0.0f;
            for (int gg = 0; gg < groups; gg++) acc += partial[gg * HS + dd];
            out[(size_t)i * C + (size_t)h * HS + dd] = from_f(acc * inv);
        }
    }
}

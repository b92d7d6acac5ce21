// Probe (session 26): does NCCL 2.28's copy-engine all-gather (a communicator with
// CTAPolicy = NCCL_CTA_POLICY_ZERO, the buffer from ncclMemAlloc in a symmetric window) run
// beside tensor-core work without slowing it, where NCCL's usual all-gather (thread blocks on
// the SMs) does? What it gathers is the size of ZeRO-1's gather of GPT-2 124M's bf16 weights.
//
// Build and run on a GPU host (one process per GPU; no MPI: rank 0 writes the NCCL id to a file):
//   nvcc -O2 -arch=sm_90 -o /tmp/probe stage3_mpi_cuda/gpu/probe-ce-gather.cu -lcublas -ldl
//   for r in 0 1; do /tmp/probe $r 2 /tmp/nccl-id & done; wait
// NCCL is opened with dlopen (libnccl.so.2), so no NCCL headers are needed.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
typedef void *ncclWindow_t;
// ncclConfig_t as NCCL 2.28's nccl.h lays it out.
struct ncclConfig {
  size_t size;
  unsigned magic, version;
  int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char *netName;
  int splitShare, trafficClass;
  const char *commName;
  int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched;
};

static void *lib;
template <class F> F sym(const char *name) {
  void *f = dlsym(lib, name);
  if (!f) { fprintf(stderr, "no %s in libnccl\n", name); exit(1); }
  return (F)f;
}
#define NC(x)                                                                   \
  do {                                                                          \
    int r = (x);                                                                \
    if (r != 0) { fprintf(stderr, "%s:%d %s: nccl error %d\n", __FILE__, __LINE__, #x, r); exit(1); } \
  } while (0)

int (*getVersion)(int *);
int (*getUniqueId)(ncclUniqueId *);
int (*initRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig *);
int (*memAlloc)(void **, size_t);
int (*winRegister)(ncclComm_t, void *, size_t, ncclWindow_t *, int);
int (*allGather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);

static ncclConfig config(int policy) {
  ncclConfig c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  c.magic = 0xcafebeef;
  int v = 0;
  getVersion(&v);
  c.version = v;
  c.blocking = c.cgaClusterSize = c.minCTAs = c.maxCTAs = INT_MIN;
  c.splitShare = c.trafficClass = c.collnetEnable = c.shrinkShare = INT_MIN;
  c.nvlsCTAs = c.nChannelsPerNetPeer = c.nvlinkCentricSched = INT_MIN;
  c.CTAPolicy = policy;
  return c;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
  float ms() { float m; CK(cudaEventElapsedTime(&m, a, b)); return m; }
};

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: probe RANK WORLD IDFILE\n"); return 2; }
  int rank = atoi(argv[1]), world = atoi(argv[2]);
  std::string idfile = argv[3];
  lib = dlopen("libnccl.so.2", RTLD_NOW);
  if (!lib) { fprintf(stderr, "dlopen libnccl.so.2: %s\n", dlerror()); return 1; }
  getVersion = sym<decltype(getVersion)>("ncclGetVersion");
  getUniqueId = sym<decltype(getUniqueId)>("ncclGetUniqueId");
  initRankConfig = sym<decltype(initRankConfig)>("ncclCommInitRankConfig");
  memAlloc = sym<decltype(memAlloc)>("ncclMemAlloc");
  winRegister = sym<decltype(winRegister)>("ncclCommWindowRegister");
  allGather = sym<decltype(allGather)>("ncclAllGather");
  CK(cudaSetDevice(rank));

  // Two ids, one per communicator: the usual one and the zero-CTA one.
  ncclUniqueId ids[2];
  if (rank == 0) {
    NC(getUniqueId(&ids[0]));
    NC(getUniqueId(&ids[1]));
    std::string tmp = idfile + ".tmp";
    FILE *f = fopen(tmp.c_str(), "wb");
    fwrite(ids, sizeof ids, 1, f);
    fclose(f);
    rename(tmp.c_str(), idfile.c_str());
  } else {
    FILE *f;
    while (!(f = fopen(idfile.c_str(), "rb"))) usleep(10000);
    if (fread(ids, sizeof ids, 1, f) != 1) { fprintf(stderr, "short id file\n"); return 1; }
    fclose(f);
  }
  ncclConfig usual = config(INT_MIN), zero = config(2);
  ncclComm_t comm, ce;
  NC(initRankConfig(&comm, world, ids[0], rank, &usual));
  NC(initRankConfig(&ce, world, ids[1], rank, &zero));
  if (rank == 0) {
    int v;
    getVersion(&v);
    printf("NCCL %d, %d ranks\n", v, world);
  }

  // ZeRO-1's gather: GPT-2 124M's weights in bf16, each rank's share in place.
  const size_t total = (124475904ull * 2 + 4095) / 4096 * 4096 / world * world;
  const size_t share = total / world;
  void *plain, *sym_buf, *sym_buf2;
  CK(cudaMalloc(&plain, total));
  NC(memAlloc(&sym_buf, total));
  NC(memAlloc(&sym_buf2, total));
  ncclWindow_t win, win2;
  NC(winRegister(ce, sym_buf, total, &win, 1 /* NCCL_WIN_COLL_SYMMETRIC */));
  NC(winRegister(comm, sym_buf2, total, &win2, 1));

  // The work beside: the MLP's first matmul of a B=16, T=1024 step (16384 x 768 @ 768 x 3072), bf16.
  const int M = 16384, K = 768, N = 3072;
  __nv_bfloat16 *A, *B, *C;
  CK(cudaMalloc(&A, (size_t)M * K * 2));
  CK(cudaMalloc(&B, (size_t)K * N * 2));
  CK(cudaMalloc(&C, (size_t)M * N * 2));
  CK(cudaMemset(A, 0, (size_t)M * K * 2));
  CK(cudaMemset(B, 0, (size_t)K * N * 2));
  cublasHandle_t h;
  cublasCreate(&h);
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cublasSetStream(h, s1);
  float one = 1, nil = 0;
  const int GEMMS = 40;
  auto gemms = [&]() {
    for (int i = 0; i < GEMMS; i++)
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, N, A, CUDA_R_16BF, K,
                   &nil, C, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  struct Way { const char *name; ncclComm_t c; char *buf; };
  Way ways[3] = {{"usual comm, cudaMalloc", comm, (char *)plain},
                 {"usual comm, symmetric window", comm, (char *)sym_buf2},
                 {"zero-CTA comm, symmetric window", ce, (char *)sym_buf}};
  const int GATHERS = 10;
  auto gather = [&](Way &w, int n) {
    for (int i = 0; i < n; i++)
      NC(allGather(w.buf + rank * share, w.buf, share, 0 /* ncclInt8 */, w.c, s2));
  };
  auto settle = [&]() {  // every rank idle and together
    CK(cudaDeviceSynchronize());
    NC(allGather((char *)plain + rank * share, plain, 1, 0, comm, s2));
    CK(cudaStreamSynchronize(s2));
  };
  for (Way &w : ways) gather(w, 3);
  gemms();
  settle();
  Timer tg, tc, bg, bc;
  for (int round = 0; round < 2; round++) {
    CK(cudaEventRecord(tc.a, s1)); gemms(); CK(cudaEventRecord(tc.b, s1));
    CK(cudaStreamSynchronize(s1));
    float gemm_alone = tc.ms();
    for (Way &w : ways) {
      settle();
      CK(cudaEventRecord(tg.a, s2)); gather(w, GATHERS); CK(cudaEventRecord(tg.b, s2));
      CK(cudaStreamSynchronize(s2));
      float g_alone = tg.ms() / GATHERS;
      settle();
      CK(cudaEventRecord(bc.a, s1));
      CK(cudaStreamWaitEvent(s2, bc.a));
      CK(cudaEventRecord(bg.a, s2));
      gemms();
      gather(w, GATHERS);
      CK(cudaEventRecord(bc.b, s1));
      CK(cudaEventRecord(bg.b, s2));
      CK(cudaDeviceSynchronize());
      printf("round %d rank %d %-32s gather alone %.3f ms (%.0f GB/s in) | %d gemms alone %.2f ms, "
             "beside %d gathers %.2f ms (+%.1f%%); the gathers beside %.2f ms (%.3f each)\n",
             round, rank, w.name, g_alone, (total - share) / g_alone / 1e6, GEMMS, gemm_alone,
             GATHERS, bc.ms(), 100 * (bc.ms() / gemm_alone - 1), bg.ms(), bg.ms() / GATHERS);
      fflush(stdout);
    }
  }
  return 0;
}

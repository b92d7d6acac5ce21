# Sourced by this folder's scripts, from the project root: NVLink multicast off in NCCL, PyTorch
# and NVSHMEM (the device machines ask for it: a program using it can put a shared host's GPUs
# out of service), the bundle's runtime and the CUDA libraries (stage 2's cuda-env.sh, which
# also defines gpt2_bench, the benchmark every script times), kernels compiled by NVRTC or the
# run fails, Python's output unbuffered, $OUT made (default /tmp/out).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"

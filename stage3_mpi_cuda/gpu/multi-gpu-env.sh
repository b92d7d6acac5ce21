# Sourced by this folder's scripts, from the project root: NVLink multicast off in NCCL, PyTorch
# and NVSHMEM (the device machines ask for it: a program using it can put a shared host's GPUs
# out of service), the bundle's runtime (.gpu/env.sh), kernels compiled by NVRTC or the run
# fails, Python's output unbuffered, $OUT made (default /tmp/out), and gpt2_bench: the
# benchmark every script times, GPT-2 124M in bf16, B=16 per GPU, T=1024.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source .gpu/env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# `gpt2_bench STEPS`: the bench flags of that benchmark, STEPS timed steps after 3 warm-up steps.
gpt2_bench() { echo "bench --model gpt2 --batch 16 --seq-len 1024 --steps $1 --warmup 3 --precision bf16"; }

#!/usr/bin/env bash
# One line naming where and when a result was measured: the device, the GPU driver, CUDA, NCCL,
# MPI, PyTorch, the commit and the date (UTC). Every script that writes under results/ records it (runs: DIR/env.txt, which
# `report` shows; benches: the table's header). On a GPU host the commit comes from
# .gpu/commit, written where the bundle was built (the copy on the GPU host may carry an
# older .git, or none).
cd "$(dirname "$0")/.." || exit 1
have() { command -v "$1" >/dev/null 2>&1; }
cpu=$(sed -n 's/^model name\s*:\s*//p' /proc/cpuinfo | head -1)
# Hosts lent under one model name ("AMD EPYC") differ by generation: name it, and whether
# the CPU has AVX-512 (the gemm crate's widest kernels), on which the CPU figures depend.
family=$(sed -n 's/^cpu family\s*:\s*//p' /proc/cpuinfo | head -1)
model=$(sed -n 's/^model\s*:\s*//p' /proc/cpuinfo | head -1)
simd=$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo "no AVX-512")
device="$cpu (family $family model $model, $simd), $(nproc) cores"
if have nvidia-smi && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  device="$(echo "$gpus" | wc -l) x $(echo "$gpus" | head -1)"
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
fi
cuda=$(have nvcc && nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
torch_versions=$(have python3 && python3 -c "import torch; print(torch.__version__, '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '')" 2>/dev/null)
mpi=$(have mpirun && mpirun --version 2>&1 | sed -n 's/^ *Version: *\([0-9.]*\).*/MPICH \1/p' | head -1)
if [ -n "${driver:-}" ] && [ -f .gpu/commit ]; then
  commit=$(cat .gpu/commit)  # what the bundle was built from (`git describe --always --dirty`)
else
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  # Changed code (not results or docs) makes it another build than the commit's.
  git diff --quiet HEAD -- common stage0_serial stage1_mpi stage2_cuda stage3_mpi_cuda Cargo.toml Cargo.lock 2>/dev/null \
    || commit="$commit with uncommitted code changes"
fi
torch=${torch_versions%% *}; nccl=${torch_versions#* }
echo "device: $device; driver: ${driver:--}; CUDA: ${cuda:--}; NCCL: ${nccl:--}; MPI: ${mpi:--}; PyTorch: ${torch:--}; commit: $commit; date: $(date -u +%F)"

#!/usr/bin/env bash
# One line naming where a result was measured: the device, the GPU driver, CUDA, NCCL, MPI and
# the commit. Every script that writes under results/ records it (runs: DIR/env.txt, which
# `report` shows; benches: the table's header). On a GPU host the commit comes from
# .gpu/commit (the bundle is built from a checkout; the copy sent to the GPU has no .git).
cd "$(dirname "$0")/.." || exit 1
have() { command -v "$1" >/dev/null 2>&1; }
cpu=$(sed -n 's/^model name\s*:\s*//p' /proc/cpuinfo | head -1)
device="$cpu, $(nproc) cores"
if have nvidia-smi && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  device="$(echo "$gpus" | wc -l) x $(echo "$gpus" | head -1)"
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
fi
cuda=$(have nvcc && nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
torch_versions=$(have python3 && python3 -c "import torch; print(torch.__version__, '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '')" 2>/dev/null)
mpi=$(have mpirun && mpirun --version 2>&1 | sed -n 's/^ *Version: *\([0-9.]*\).*/MPICH \1/p' | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || cat .gpu/commit 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+changes"
torch=${torch_versions%% *}; nccl=${torch_versions#* }
echo "device: $device; driver: ${driver:--}; CUDA: ${cuda:--}; NCCL: ${nccl:--}; MPI: ${mpi:--}; PyTorch: ${torch:--}; commit: $commit"

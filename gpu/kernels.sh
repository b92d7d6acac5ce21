#!/usr/bin/env bash
# Each kernel alone against PyTorch's op, and GPT-2 124M's matrix products against the GPU's
# ceiling.
#
#   gpu/kernels.sh [--no-torch]
#
# Ours: `stage2_cuda bench --kernels` at B*T = 16384 rows: GPT-2 124M's five matrix products
# forward and backward with an 8192^3 product as their ceiling (kind "matmul"), in fp32, tf32
# and bf16; then, in bf16, attention (T = 512, 1024, 2048; head sizes 64 and 128), layernorm,
# GELU, cross-entropy (vocabularies 32768, 50304, 131072) and AdamW (124M parameters), each
# with its unfused form where one exists. Ours: the median of 5 batches of calls timed between
# synchronisations. PyTorch: gpu/py/pytorch_gpt2.py --kernels, the same shapes through
# PyTorch's ops (F.scaled_dot_product_attention, F.layer_norm, ...; median of 20 calls timed
# with CUDA events), and --ceilings: the device's copy bandwidth and 8192^3 product rates.
#
# About 2 min on an H100.
# Writes results/kernel-bench.md (machine header; the products' TFLOP/s and share of the
# ceiling per precision; a row per op: ours ms, its rate and share of the ceiling, the unfused
# ms, PyTorch's ms and ours vs PyTorch (above 1: ours faster)) and results/kernel-bench.json.
# FLOP for attention as FlashAttention counts them (the causal half; backward 2.5x forward);
# bytes are the fewest the op must move.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
torch=yes
while [ $# -gt 0 ]; do
  case $1 in
    --no-torch) torch=no ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
[ $torch = yes ] && ! gpu_has_torch && { gpu_say "PyTorch is not installed: ours only"; torch=no; }
s2=$(gpu_bin stage2_cuda)
status=0
for p in fp32 tf32; do
  gpu_run "ours-matmul-$p" 300 all_lines=1 -- "$s2" bench --kernels --matmul-only --precision "$p" || status=1
done
gpu_run ours-bf16 300 all_lines=1 -- "$s2" bench --kernels --precision bf16 || status=1
if [ $torch = yes ]; then
  gpu_run torch-ceilings 120 kind=ceilings -- python3 "$GPU_PY/pytorch_gpt2.py" --ceilings || status=1
  gpu_run torch-bf16 300 all_lines=1 -- python3 "$GPU_PY/pytorch_gpt2.py" --kernels --precision bf16 || status=1
fi
gpu_table kernel-bench
exit $status

#!/usr/bin/env bash
# The GPU check before an issue is resolved, in one device call on a host with 2 or more GPUs:
# stage 2's check.sh on GPU 0 (every one-GPU test, the determinism check, the PyTorch
# side-by-side bench) and the two-GPU NCCL tests (`nccl-*`, --include-ignored) on the last two
# GPUs, beside it where there are 3 or more GPUs, after it where there are 2.
#   stage3_mpi_cuda/gpu/check-gpus.sh        (from the project root, after ../shared/gpu/bundle.sh)
# Writes $OUT/gpus.txt, check.txt, check-logs.tgz (check.sh's logs) and nccl-tests.log; prints
# the NCCL tests' lines, then check.txt.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
n=$(nvidia-smi -L | tee "$OUT/gpus.txt" | wc -l)
[ "$n" -ge 2 ] || { echo "check-gpus.sh: needs 2 or more GPUs, nvidia-smi lists $n" >&2; exit 2; }
nccl_tests() (  # on the last two GPUs
  export CUDA_VISIBLE_DEVICES=$((n - 2)),$((n - 1))
  for t in /tmp/gpu-rt/tests/nccl-*; do echo "== $t"; timeout 300 "$t" --include-ignored --test-threads 1 2>&1; done
)
one_gpu=/tmp/check-gpus; rm -rf "$one_gpu"; mkdir -p "$one_gpu"
(export OUT=$one_gpu CUDA_VISIBLE_DEVICES=0; bash stage2_cuda/gpu/check.sh >"$one_gpu/check.out" 2>&1) &
check=$!
if [ "$n" -ge 3 ]; then
  nccl_tests >"$OUT/nccl-tests.log" 2>&1; wait $check
else
  wait $check; nccl_tests >"$OUT/nccl-tests.log" 2>&1
fi
grep -E "^test |^test result|panicked" "$OUT/nccl-tests.log"
cp "$one_gpu/check.txt" "$OUT/" && tar czf "$OUT/check-logs.tgz" -C "$one_gpu" .
cat "$OUT/check.txt"

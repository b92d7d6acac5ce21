#!/usr/bin/env bash
# One round on an attention kernel change: the bf16 attention GPU test (both flash paths against
# the CPU), `bench --kernels` attention rows for the default kernels and `flash-mma`, the GPT-2
# 124M bf16 step on both paths, and torch.compile bf16 in the same call; a table last.
# From the project root after `../shared/gpu/bundle.sh`; outputs in $OUT.
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cat .gpu/commit; nvidia-smi --query-gpu=name --format=csv,noheader | head -1
t=$(ls /tmp/gpu-rt/tests/cuda_backend-* | head -1)
timeout 300 "$t" --include-ignored --nocapture bf16_attention ${ATTN_TESTS:-} 2>&1 | tee "$OUT/attn-test.log" | grep -E "PARITY|test result|panicked|wgmma|FAILED"
for path in flash flash-mma; do
  GPT2_CUDA_ATTENTION=$path timeout 120 stage2_cuda bench --kernels --precision bf16 2>/dev/null | grep -E "attention" | sed "s/^/$path /" | tee -a "$OUT/kernels-attn.txt"
done
gpt2="bench --model gpt2 --batch 16 --seq-len 1024 --steps 10 --warmup 3 --precision bf16"
for rep in 1 2; do
  for path in flash flash-mma; do
    GPT2_CUDA_ATTENTION=$path timeout 120 stage2_cuda $gpt2 2>/dev/null | tail -1 | sed "s/^/$path-r$rep /" | tee -a "$OUT/bench.txt"
  done
  timeout 180 python3 stage2_cuda/gpu/pytorch_gpt2.py --precision bf16 --compile 2>/dev/null | tail -1 | sed "s/^/torch-compile-r$rep /" | tee -a "$OUT/bench.txt"
  [ -n "${ONE_ROUND:-}" ] && break
done

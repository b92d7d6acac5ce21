#!/usr/bin/env bash
# One round on an attention kernel change: the bf16 attention GPU test (both flash paths against
# the CPU), `bench --kernels` attention rows for the default (warpgroup) and the mma.sync kernels, the GPT-2
# 124M bf16 step on both paths, and torch.compile bf16 in the same call; a table last.
# From the project root after `../shared/gpu/bundle.sh`; outputs in $OUT.
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cat .gpu/commit; nvidia-smi --query-gpu=name --format=csv,noheader | head -1
t=$(ls /tmp/gpu-rt/tests/cuda_backend-* | head -1)
timeout 300 "$t" --include-ignored --nocapture bf16_attention ${ATTN_TESTS:-} 2>&1 | tee "$OUT/attn-test.log" | grep -E "PARITY|test result|panicked|wgmma|FAILED"
# Attention variants (VARIANTS="NAME=VALUE ..."): by default the warpgroup kernels and the
# mma.sync ones.
variants=${VARIANTS:-"GPT2_CUDA_ATTENTION=flash GPT2_CUDA_ATTENTION=flash-mma"}
for v in $variants; do
  env $v timeout 120 stage2_cuda bench --kernels --precision bf16 2>/dev/null | grep -E "attention" | sed "s/^/$v /" | tee -a "$OUT/kernels-attn.txt"
done
gpt2=$(gpt2_bench 10)
for rep in 1 2; do
  for v in $variants; do
    env $v timeout 120 stage2_cuda $gpt2 2>/dev/null | tail -1 | sed "s/^/$v-r$rep /" | tee -a "$OUT/bench.txt"
  done
  timeout 180 python3 stage2_cuda/gpu/pytorch_gpt2.py --precision bf16 --compile 2>/dev/null | tail -1 | sed "s/^/torch-compile-r$rep /" | tee -a "$OUT/bench.txt"
  [ -n "${ONE_ROUND:-}" ] && break
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print("kernel rows (ms):")
for line in open(os.path.join(out, "kernels-attn.txt")):
    tag, js = line.split(" ", 1)
    r = json.loads(js)
    print(f"  {tag:<30} {r['op']:<14} {r['shape']:<24} {r['ms']:.4f} ms {r['flop'] / r['ms'] / 1e9:.0f} TFLOP/s")
print("step:")
for line in open(os.path.join(out, "bench.txt")):
    tag, js = line.split(" ", 1)
    r = json.loads(js)
    print(f"  {tag:<34} {r['tokens_per_s']:>10.0f} tokens/s {r['ms_per_step']:.2f} ms  {r['peak_device_mb']:.0f} MiB")
PY

#!/usr/bin/env bash
# A short check of one kernel change, for a device call with little time left: the backend and
# model GPU tests, stage 2's determinism and recompute tests, one bf16 bench of ours and one of
# torch.compile in the same call, and the attention rows of `bench --kernels`.
# Run from the project root after `../shared/gpu/bundle.sh`; outputs in $OUT.
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cat .gpu/commit
for t in /tmp/gpu-rt/tests/cuda_backend-* /tmp/gpu-rt/tests/cuda_model-*; do
  timeout 300 "$t" --include-ignored --test-threads 4 2>&1 | grep -E "^test result|FAILED|panicked|attention .*bf16|bf16:|REPLAY|PARITY"
done
for t in /tmp/gpu-rt/tests/cli-*; do
  if "$t" --list 2>/dev/null | grep -q same_seed_runs_are_identical_on_the_gpu; then
    timeout 300 "$t" --include-ignored same_seed recompute 2>&1 | grep -E "^test |panicked"
  fi
done
for p in bf16 tf32; do
  stage2_cuda $(gpt2_bench 10 $p) 2>/dev/null | tail -1 | tee "$OUT/ours-$p.json"
done
# Ablations of the newest changes (QUICK_ABLATE="NAME=VALUE ..."): each env setting alone, bf16.
for a in ${QUICK_ABLATE:-}; do
  env "$a" stage2_cuda $(gpt2_bench 10) 2>/dev/null | tail -1 | tee "$OUT/ours-bf16-${a//=/-}.json"
done
timeout 60 stage2_cuda bench --kernels --precision bf16 2>/dev/null | grep -E "attention|gelu" | tee "$OUT/kernels-attn.jsonl"
timeout 120 python3 stage2_cuda/gpu/pytorch_gpt2.py --precision bf16 --compile 2>/dev/null | tail -1 | tee "$OUT/torch-compile.json"

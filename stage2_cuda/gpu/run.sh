#!/usr/bin/env bash
# Stage 2 on a GPU host, in one go: benches (ours and the PyTorch eager baseline, fp32 and
# tf32, GPT-2 124M at B=16 T=1024), the GPU tests, the per-op timing table; a short table last.
# Run from the project root after `../shared/gpu/bundle.sh -p stage2_cuda -p common --features cuda`:
#   stage2_cuda/gpu/run.sh [bench] [ablate] [tests] [timing]     (default: all four)
# Logs go to $OUT (default /tmp/out; six files). The PyTorch script is read from this folder.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${*:-bench ablate tests timing}
want() { [[ " $parts " == *" $1 "* ]]; }

source "$here/cuda-env.sh"
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
echo "gpu: $gpu"
export PYTHONUNBUFFERED=1 REQUIRE_NVRTC=1 STAGE2_CUDA_BIN=$(command -v stage2_cuda)

# One bench: label, then the command; its last stdout line (JSON) goes to $OUT/bench.jsonl.
bench() {
  local label=$1; shift
  echo "== bench $label: $*" | tee -a "$OUT/bench.log"
  if timeout 240 "$@" >/tmp/bench-run.log 2>&1; then
    tail -1 /tmp/bench-run.log | python3 -c "import json,sys; r=json.load(sys.stdin); r['label']='$label'; print(json.dumps(r))" >>"$OUT/bench.jsonl" \
      || echo "   no JSON from $label"
  else
    echo "   FAILED ($label), log tail:"; tail -5 /tmp/bench-run.log
  fi
  cat /tmp/bench-run.log >>"$OUT/bench.log"
}
gpt2=(bench --model gpt2 --batch 16 --seq-len 1024 --steps 10 --warmup 3)
rm -f "$OUT/bench.jsonl" "$OUT/bench.log"
if want bench; then
  timeout 60 python3 "$here/pytorch_gpt2.py" --ceilings >"$OUT/ceilings.json" 2>&1 || echo "ceilings failed"
  cat "$OUT/ceilings.json"
  for rep in $(seq 1 ${BENCH_REPS:-2}); do  # twice by default, alternating, to see the spread
    for p in fp32 tf32; do
      bench "ours-$p-r$rep" stage2_cuda "${gpt2[@]}" --precision $p
      bench "torch-$p-r$rep" python3 "$here/pytorch_gpt2.py" --precision $p
    done
  done
fi
if want ablate; then  # earlier versions, for NOTES.md: GEMM attention, bias as a separate pass
  bench "ours-fp32-gemm-attention" env GPT2_CUDA_ATTENTION=gemm stage2_cuda "${gpt2[@]}" --precision fp32
  bench "ours-tf32-gemm-attention" env GPT2_CUDA_ATTENTION=gemm stage2_cuda "${gpt2[@]}" --precision tf32
  bench "ours-tf32-bias-unfused" env GPT2_CUDA_BIAS_EPILOGUE=0 stage2_cuda "${gpt2[@]}" --precision tf32
fi

rc=0
if want tests; then
  for t in /tmp/gpu-rt/tests/cuda_backend-* /tmp/gpu-rt/tests/cuda_model-* /tmp/gpu-rt/tests/cuda_kernels_compile-* \
           /tmp/gpu-rt/tests/cli-*; do
    [ -x "$t" ] || continue
    case $(basename "$t") in cli-*) "$t" --list 2>/dev/null | grep -q gpu || continue ;; esac  # stage2's only
    echo "== test $(basename "$t")"
    timeout 300 "$t" --include-ignored --nocapture --test-threads 4 >>"$OUT/tests.log" 2>&1 || rc=1
  done
fi
if want timing; then
  for t in /tmp/gpu-rt/tests/cuda_timing-*; do
    echo "== timing $(basename "$t")"
    timeout 240 "$t" --include-ignored --nocapture --test-threads 1 >>"$OUT/timing.log" 2>&1 || rc=1
  done
  grep -E "^TIMING" "$OUT/timing.log"
fi

echo; echo "==== failures"; grep -hE "panicked|FAILED|^---- " "$OUT/tests.log" "$OUT/timing.log" 2>/dev/null | head -30
echo "==== parity (max|gpu-cpu|/max|cpu| unless stated)"; grep -hE "^PARITY" "$OUT/tests.log" 2>/dev/null | sed 's/^PARITY //' | sort | tail -60
echo "==== tests"; grep -hE "^test result|^test .* (FAILED|ignored)$" "$OUT/tests.log" "$OUT/timing.log" 2>/dev/null
echo "==== GPT-2 124M, B=16 T=1024, $gpu"
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    rows = []
by = {r["label"]: r for r in rows}
print(f"{'run':<28} {'tokens/s':>9} {'ms/step':>8} {'peak MiB':>9} {'mfu':>6}  vs torch (speed, memory)")
for r in rows:
    p = "tf32" if "tf32" in r["label"] else "fp32"
    rep = r["label"].rsplit("-", 1)[-1] if r["label"][-3:-1] == "-r" else "r1"
    t = by.get(f"torch-{p}-{rep}")
    ratio = ""
    if t and not r["label"].startswith("torch"):
        ratio = f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}x  {r['peak_device_mb'] / t['peak_device_mb']:.2f}x"
    mfu = f"{r['mfu']:.3f}" if r.get("mfu") is not None else "-"
    print(f"{r['label']:<28} {r['tokens_per_s']:>9.0f} {r['ms_per_step']:>8.1f} {r['peak_device_mb']:>9.0f} {mfu:>6}  {ratio}")
PY
exit $rc

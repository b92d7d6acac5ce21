#!/usr/bin/env bash
# A step's time under two settings, in alternating rounds: `stage2_cuda bench` (GPT-2 124M,
# bf16, B=16, T=1024, uniform tokens; STEPS timed steps after 3 warm-up ones), once with each
# setting per round; prints each round's milliseconds a step and the difference B - A, then
# the mean difference and how many rounds B was faster. For effects under 1% that
# ab-train.sh's run-to-run spread hides (NOTES.md 31 measured that way). The settings are
# environment assignments, e.g.
#   stage2_cuda/gpu/ab-bench.sh GPT2_CUDA_LN_BIAS=unfused GPT2_CUDA_LN_BIAS=fused
# Knobs: ROUNDS (5), STEPS (30), PRECISION (bf16).
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VAR=a VAR=b" >&2; exit 2; }
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1
ROUNDS=${ROUNDS:-5} STEPS=${STEPS:-30} PRECISION=${PRECISION:-bf16}
run() {  # setting: prints ms a step
  env "$1" stage2_cuda $(gpt2_bench "$STEPS" "$PRECISION") 2>/dev/null | tail -1 |
    python3 -c "import json, sys; print(f'{16384e3 / json.loads(sys.stdin.read())[\"tokens_per_s\"]:.3f}')" 2>/dev/null || echo nan
}
echo "ab-bench: $PRECISION, $STEPS steps, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
diffs=()
for r in $(seq "$ROUNDS"); do
  a=$(run "$1"); b=$(run "$2")
  d=$(python3 -c "print(f'{$b - $a:+.3f}')")
  diffs+=("$d")
  echo "ABBENCH round $r: $1 $a ms | $2 $b ms | B - A $d ms"
done
python3 -c "
d = [float(x) for x in '${diffs[*]}'.split()]
print(f'ABBENCH mean B - A {sum(d) / len(d):+.3f} ms over {len(d)} rounds; B faster in {sum(x < 0 for x in d)} of {len(d)}')"

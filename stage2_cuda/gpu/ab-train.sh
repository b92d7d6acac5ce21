#!/usr/bin/env bash
# Training speed on real text under two settings, in alternating rounds: `stage2_cuda train`
# (GPT-2 124M, bf16, B=16, T=1024, the GPT-2 tokenizer) for STEPS steps on DATA (default the
# bundled corpus), once with each setting per round; prints each run's training tokens/s
# (summary.json: the steps' time, evaluations and start-up left out) and the ratio B/A. The
# settings are environment assignments, e.g.
#   stage2_cuda/gpu/ab-train.sh GPT2_CUDA_WTE_BWD=unfused GPT2_CUDA_WTE_BWD=fused
# `bench` draws its tokens uniformly, which hides costs that depend on the ids (the token
# embedding's gradient sums each token's rows: real text repeats " " and "\n" thousands of
# times a batch); this measures them. Knobs: STEPS (150), ROUNDS (2), DATA, PRECISION (bf16).
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VAR=a VAR=b" >&2; exit 2; }
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1
DATA=${DATA:-data/tinyshakespeare.txt} STEPS=${STEPS:-150} ROUNDS=${ROUNDS:-2} PRECISION=${PRECISION:-bf16}
run() {  # setting, round: prints tokens/s
  local dir=/tmp/ab-train/$2-${1//[^A-Za-z0-9_]/_}
  rm -rf "$dir"; mkdir -p "$dir"
  env "$1" stage2_cuda train --data "$DATA" --tokenizer gpt2 --model gpt2 --batch 16 --seq-len 1024 \
    --steps "$STEPS" --eval-every "$STEPS" --eval-batches 1 --warmup 10 --seed 1337 --sample-len 0 \
    --precision "$PRECISION" --out "$dir" >"$dir/log.txt" 2>&1 || { echo "FAILED: $1 (see $dir/log.txt)" >&2; tail -3 "$dir/log.txt" >&2; echo 0; return; }
  python3 -c "import json; print(round(json.load(open('$dir/summary.json'))['train_tokens_per_s']))"
}
echo "ab-train: $DATA, $STEPS steps, $PRECISION, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
for r in $(seq "$ROUNDS"); do
  a=$(run "$1" "$r"); b=$(run "$2" "$r")
  python3 -c "print(f'ABTRAIN round $r: $1 {$a:,} tok/s | $2 {$b:,} tok/s | B/A {$b / max($a, 1):.3f}')"
done

#!/usr/bin/env bash
# FP8 training (`--precision fp8`) against bf16 on one GPU: speed and memory beside PyTorch, and
# what FP8 does to the loss.
#
#   gpu/fp8.sh [--speed-only | --loss-only] [--steps S] [--data DIR|FILE]
#
# Speed: `stage2_cuda bench` (random tokens; forward, backward, clipping, AdamW) in bf16 and in
# fp8, GPT-2 124M B=16 and gpt2-large B=8, T=1024, in turns with PyTorch's torch.compile bf16 and,
# where `torchao` imports, torchao's `convert_to_float8_training` on the blocks + torch.compile
# (gpu/py/pytorch_gpt2.py --fp8). Targets: fp8 over our bf16 >= 1.3x at gpt2-large, >= 1.1x at
# 124M; peak memory no higher than bf16's.
# Loss: GPT-2 124M B=16 T=1024, lr 6e-4 with a warm-up over 5% of the run, S steps (default 2000)
# on data/docs-gpt2/ (`make docs-corpus`), evaluated every S/10 steps, bf16 and fp8 from the same
# seed on the same batches. Bound: fp8's validation loss within 2% of bf16's at every evaluation
# and within 1% at the last.
#
# About 5 min (speed) and 4 min (loss) on one H200.
# Writes results/fp8.md (machine header; the speed rows with their ratios; every evaluation of
# both runs; the verdicts) and results/fp8.json; the loss runs (loss.tsv, log.txt, env.txt; no
# checkpoints) in results/runs/fp8/. Exits 1 if a run fails or a bound does not hold.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
speed=yes loss=yes steps=2000 data=data/docs-gpt2
while [ $# -gt 0 ]; do
  case $1 in
    --speed-only) loss=no ;;
    --loss-only) speed=no ;;
    --steps) steps=$2; shift ;;
    --data) data=$2; shift ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
s2=$(gpu_bin stage2_cuda)
status=0
if [ $speed = yes ]; then
  torch=no torchao=no
  gpu_has_torch && torch=yes
  [ $torch = yes ] && python3 -c 'import torchao.float8' >/dev/null 2>&1 && torchao=yes
  [ $torch = yes ] || gpu_say "PyTorch is not installed: ours only"
  [ $torch = yes ] && [ $torchao = no ] && gpu_say "torchao does not import: no PyTorch FP8 baseline"
  echo "{\"kind\": \"baselines\", \"torch\": \"$torch\", \"torchao\": \"$torchao\"}" >>"$GPU_ROWS"
  for m in "gpt2 16" "gpt2-large 8"; do
    read -r model b <<<"$m"
    shape=(--model "$model" --batch "$b" --seq-len 1024 --steps 10 --warmup 3)
    for p in bf16 fp8; do
      gpu_run "ours-$p-$model" 300 kind=speed side=ours precision=$p model="$model" batch="$b" -- \
        "$s2" bench "${shape[@]}" --precision $p || status=1
    done
    if [ $torch = yes ]; then
      gpu_run "torch-compile-bf16-$model" 400 kind=speed side=torch precision=bf16 model="$model" batch="$b" -- \
        python3 "$GPU_PY/pytorch_gpt2.py" "${shape[@]}" --precision bf16 --compile || status=1
    fi
    if [ $torchao = yes ]; then
      gpu_run "torch-compile-fp8-$model" 400 kind=speed side=torch precision=fp8 model="$model" batch="$b" -- \
        python3 "$GPU_PY/pytorch_gpt2.py" "${shape[@]}" --precision bf16 --compile --fp8 || status=1
    fi
  done
fi
train=()
if [ $loss = yes ]; then
  [ -e "$data" ] || gpu_die "$data is missing: \`make docs-corpus\` makes it"
  every=$(( steps / 10 > 0 ? steps / 10 : 1 ))
  warmup=$(( steps / 20 > 0 ? steps / 20 : 1 ))
  train=(train --data "$data" --model gpt2 --tokenizer gpt2 --seq-len 1024 --batch 16 --lr 6e-4 --seed 1337
         --steps "$steps" --eval-every "$every" --warmup "$warmup" --sample-len 0)
  runs=$RESULTS_DIR/runs/fp8
  rm -rf "$runs"; mkdir -p "$runs"
  for p in bf16 fp8; do
    out=$runs/$p
    mkdir -p "$out"; gpu_machine_line >"$out/env.txt"
    gpu_say "$p: stage2_cuda ${train[*]} --precision $p"
    timeout -k 30 1200 "$s2" "${train[@]}" --precision $p --out "$out" >>"$out/log.txt" 2>&1 ||
      { status=1; echo "   $p FAILED ($out/log.txt)" >&2; tail -5 "$out/log.txt" >&2; }
    rm -f "$out"/*.ckpt
    python3 "$GPU_PY/tables.py" lossrows "$out" >>"$GPU_ROWS" || true
  done
fi
gpu_table fp8 --train "stage2_cuda ${train[*]} --precision bf16|fp8" || status=1
grep -q FAIL "$RESULTS_DIR/fp8.md" && status=1
exit $status

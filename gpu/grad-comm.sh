#!/usr/bin/env bash
# What bf16 gradient sums do to the loss: stage 3 on N GPUs, the same run with f32 sums (the
# default) and with `--grad-comm bf16`, from the same seed on the same batches.
#
#   gpu/grad-comm.sh [N] [--steps S] [--data DIR|FILE]
#
# GPT-2 124M in bf16, B=16 a GPU (global batch 16N), T=1024, lr 6e-4 with a warm-up over 5% of
# the run, S steps (default 2000), evaluated every S/10 steps, on data/docs-gpt2/ (`make
# docs-corpus`; its *_val_* shard the validation set), or with --data another corpus. N: GPUs
# (default: every GPU nvidia-smi lists; at least 2). Pass: the last evaluation's validation loss
# with bf16 sums within 0.5% of the f32 sums'.
#
# About 4 min on 2 x H200.
# Writes results/grad-comm.md (machine header; every evaluation of both runs, the relative
# difference of their validation losses; the verdict) and results/grad-comm.json, and the runs
# (loss.tsv, log.txt, env.txt; no checkpoints) in results/runs/grad-comm/. Exits 1 if a run
# fails or the bound does not hold.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
n='' steps=2000 data=data/docs-gpt2
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift ;;
    --data) data=$2; shift ;;
    -h|--help) gpu_help; exit 0 ;;
    [0-9]*) n=$1 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
[ -e "$data" ] || gpu_die "$data is missing: \`make docs-corpus\` makes it"
found=$(gpu_count)
n=${n:-$found}
{ [ "$n" -ge 2 ] && [ "$n" -le "$found" ]; } || gpu_die "needs 2 or more GPUs (asked for $n, nvidia-smi lists $found)"
s3=$(gpu_bin stage3_mpi_cuda)
every=$(( steps / 10 > 0 ? steps / 10 : 1 ))
warmup=$(( steps / 20 > 0 ? steps / 20 : 1 ))
train=(train --data "$data" --model gpt2 --tokenizer gpt2 --seq-len 1024 --batch $((16 * n)) --lr 6e-4 --seed 1337
       --steps "$steps" --eval-every "$every" --warmup "$warmup" --sample-len 0 --precision bf16)
runs=$RESULTS_DIR/runs/grad-comm
rm -rf "$runs"; mkdir -p "$runs"
status=0
for wire in fp32 bf16; do
  out=$runs/$wire-sums
  mkdir -p "$out"; gpu_machine_line >"$out/env.txt"
  gpu_say "$wire sums: mpirun -n $n stage3_mpi_cuda ${train[*]} --grad-comm $wire"
  timeout -k 30 1800 "${GPU_MPIRUN[@]}" -n "$n" "$s3" "${train[@]}" --grad-comm "$wire" --out "$out" \
    >>"$out/log.txt" 2>&1 || { status=1; echo "   $wire sums FAILED ($out/log.txt)" >&2; tail -5 "$out/log.txt" >&2; }
  rm -f "$out"/*.ckpt
  python3 "$GPU_PY/tables.py" lossrows "$out" >>"$GPU_ROWS" || true
done
gpu_table grad-comm --train "mpirun -n $n stage3_mpi_cuda ${train[*]} --grad-comm fp32|bf16" || status=1
grep -q FAIL "$RESULTS_DIR/grad-comm.md" && status=1
exit $status

#!/usr/bin/env bash
# The GPU stages' rows of the stages' loss table (results/README.md): stage 2 and stage 3
# trained with the CPU stages' settings.
#
#   gpu/stages.sh [--precision P] [--gpt2]
#
# Runs, with the Makefile's TRAIN_FLAGS (the char model, 2 epochs) and SHORT_FLAGS (its first
# 100 steps, evaluated every 10), in precision P (default fp32, the CPU stages' arithmetic):
#   stage2_cuda train TRAIN_FLAGS              -> results/runs/stage2
#   mpirun -n G stage3_mpi_cuda train TRAIN_FLAGS -> results/runs/stage3
#   stage2_cuda train SHORT_FLAGS              -> results/runs/short-stage2
#   mpirun -n G stage3_mpi_cuda train SHORT_FLAGS -> results/runs/short-stage3
# G is 2 where the host has 2 or more GPUs, else 1. Each folder gets the run's loss.tsv and
# summary.json, and env.txt (one line naming the machine, the software and the
# commit), which `stage0_serial report` shows; checkpoints are removed. `make results` then
# puts these runs beside stage 0's and stage 1's (results/README.md, results/short/).
#
# --gpt2: also the four stages on GPT-2 124M, for their speeds side by side: 10 epochs of the
# first 20000 bytes of data/tinyshakespeare.txt (GPT-2 tokenizer, global batch 8 x 64, lr
# 6e-4, warmup 10, seed 1337; 10 steps an epoch) on stage 0 (CORES/2 threads), stage 1
# (mpirun -n 2, CORES/2 threads each), stage 2 (fp32) and stage 3 (G GPUs, fp32), into
# results/runs/gpt2-stage0 ... gpt2-stage3, and `stage0_serial report` over the four into
# results/runs/gpt2-stages/ (README.md: time per step and per epoch, loss per epoch; loss.png).
# CORES: default nproc. The CPU stages take about 1 min each on 16 cores.
#
# About 1 min on an H100 (3-4 more with --gpt2). Prints each run's last loss row. Exits 1 if
# a run fails.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
precision=fp32 gpt2=no
while [ $# -gt 0 ]; do
  case $1 in
    --precision) precision=$2; shift ;;
    --gpt2) gpt2=yes ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
s2=$(gpu_bin stage2_cuda) s3=$(gpu_bin stage3_mpi_cuda)
g=1; [ "$(gpu_count)" -ge 2 ] && g=2
status=0
# one NAME COMMAND...: a run into results/runs/NAME (replaced only when the run succeeds)
one() {
  local name=$1; shift
  local dir=$GPU_LOGS/runs/$name log=$GPU_LOGS/$name.log
  gpu_say "$name: $*"
  if timeout -k 20 600 "$@" --out "$dir" >"$log" 2>&1; then
    echo "$name: $(tail -1 "$dir/loss.tsv" | tr '\t' ' ')"
    gpu_machine_line >"$dir/env.txt"
    rm -f "$dir"/*.ckpt
    mkdir -p "$RESULTS_DIR/runs"; rm -rf "${RESULTS_DIR:?}/runs/$name"; mv "$dir" "$RESULTS_DIR/runs/$name"
  else
    status=1; echo "$name FAILED ($log; results/runs/$name left as it was):" >&2; tail -5 "$log" >&2
  fi
}
for spec in stage2:TRAIN_FLAGS stage3:TRAIN_FLAGS short-stage2:SHORT_FLAGS short-stage3:SHORT_FLAGS; do
  name=${spec%%:*} var=${spec#*:}
  read -r -a flags < <(sed -n "s/^$var := //p" Makefile)
  [ ${#flags[@]} -gt 0 ] || gpu_die "no $var in the Makefile"
  case $name in
    *stage2) cmd=("$s2") ;;
    *stage3) cmd=("${GPU_MPIRUN[@]}" -n "$g" "$s3") ;;
  esac
  one "$name" "${cmd[@]}" train "${flags[@]}" --precision "$precision"
done
if [ $gpt2 = yes ]; then
  s0=$(gpu_bin stage0_serial) s1=$(gpu_bin stage1_mpi)
  cores=${CORES:-$(nproc)}; half=$(( cores / 2 > 0 ? cores / 2 : 1 ))
  slice=$GPU_LOGS/tinyshakespeare-20000.txt
  head -c 20000 data/tinyshakespeare.txt >"$slice"
  g2=(train --data "$slice" --tokenizer gpt2 --model gpt2 --batch 8 --seq-len 64 --epochs 10 --lr 6e-4 --warmup 10
      --seed 1337 --sample-len 0)
  one gpt2-stage0 "$s0" "${g2[@]}" --threads "$half"
  one gpt2-stage1 "${GPU_MPIRUN[@]}" -n 2 "$s1" "${g2[@]}" --threads "$half"
  one gpt2-stage2 "$s2" "${g2[@]}" --precision fp32
  one gpt2-stage3 "${GPU_MPIRUN[@]}" -n "$g" "$s3" "${g2[@]}" --precision fp32
  r=$RESULTS_DIR/runs
  gpu_say "report over the four runs"
  "$s0" report --run "stage0 ($half threads)=$r/gpt2-stage0" --run "stage1 (2 ranks x $half threads)=$r/gpt2-stage1" \
    --run "stage2 (1 GPU, fp32)=$r/gpt2-stage2" --run "stage3 ($g GPUs, fp32)=$r/gpt2-stage3" --out "$r/gpt2-stages" \
    >"$GPU_LOGS/report.log" 2>&1 || { status=1; echo "report FAILED ($GPU_LOGS/report.log)" >&2; }
fi
gpu_say "wrote the runs in $RESULTS_DIR/runs; logs in $GPU_LOGS"
exit $status

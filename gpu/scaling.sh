#!/usr/bin/env bash
# Weak scaling of stage 3 on N GPUs of one host, against PyTorch DDP.
#
#   gpu/scaling.sh [N] [--socket] [--quick] [--per-gpu] [--steps S]
#
# GPT-2 124M in bf16, B=16 sequences per GPU, T=1024 (the global batch grows with N), 3
# warm-up and S (default 10) timed steps a run:
#   - stage 2 on one GPU (`stage2_cuda bench`), first and again last: the weak-scaling base
#     is the mean of the two (the drift over the call shows as their difference);
#   - stage 3 on N GPUs (`mpirun -n N stage3_mpi_cuda bench`): the default (ZeRO-1), --zero 0,
#     each also with --overlap, and --zero 0 op by op (GPT2_CUDA_GRAPH=0);
#   - PyTorch: DDP + torch.compile on N GPUs (gpu/py/pytorch_ddp.py under torchrun) and
#     torch.compile on one GPU (DDP's own weak-scaling base);
#   - NCCL's all-reduce against message size on the N GPUs (`bench --allreduce`, nccl-tests'
#     bus-bandwidth convention).
# N: GPUs (default: every GPU nvidia-smi lists; at least 2). --quick: the default stage 3
# run and DDP only (with the one-GPU runs). --socket: the stage 3 default, --zero 0, bf16 sums
# (`--grad-comm bf16`, with and without --overlap) and DDP (also with its bf16_compress_hook)
# again with NCCL on its socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
# NCCL_IB_DISABLE=1: no NVLink, no shared memory, no InfiniBand), as between hosts over
# TCP, and the all-reduce sweep over sockets. --per-gpu: each GPU's own speed first (stage 2
# alone on each GPU in turn, then on all at once, with nvidia-smi sampling SM clock, power and
# temperature every 200 ms), to tell a slow GPU from communication (a synchronous step waits
# for the slowest GPU).
# Stage 3 runs under $MPIRUN (default `mpirun`, MPICH's hydra: `mpirun -n N`).
#
# About 3 min on 2 x H200 (5 with --socket, 2 more with --per-gpu).
# Writes results/scaling.md (machine header; a row per run: tokens/s, per GPU, weak-scaling
# efficiency, vs DDP, ms/step, the gradient sums timed alone and the share of them hidden
# behind computation, peak memory per GPU; then the all-reduce sweep and, with --per-gpu,
# each GPU's speed) and results/scaling.json. Reading it: weak-scaling efficiency is
# tokens/s per GPU over the one-GPU run's (ours: stage 2's; DDP's: torch.compile's); "vs DDP"
# is ours over DDP + torch.compile's tokens/s on the same GPUs and transport.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
n='' socket=no quick=no pergpu=no steps=10
while [ $# -gt 0 ]; do
  case $1 in
    --socket) socket=yes ;;
    --quick) quick=yes ;;
    --per-gpu) pergpu=yes ;;
    --steps) steps=$2; shift ;;
    -h|--help) gpu_help; exit 0 ;;
    [0-9]*) n=$1 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
found=$(gpu_count)
n=${n:-$found}
{ [ "$n" -ge 2 ] && [ "$n" -le "$found" ]; } || gpu_die "needs 2 or more GPUs (asked for $n, nvidia-smi lists $found)"
s2=$(gpu_bin stage2_cuda) s3=$(gpu_bin stage3_mpi_cuda)
torch=yes; gpu_has_torch || { torch=no; gpu_say "PyTorch is not installed: no DDP rows"; }
gpt2=(bench --model gpt2 --batch 16 --seq-len 1024 --steps "$steps" --warmup 3 --precision bf16)
status=0
stage3() {  # label transport [flags...]
  local label=$1 tr=$2; shift 2
  gpu_run "$label" 300 gpus="$n" transport="$tr" side=ours flags="$*" -- \
    "${GPU_MPIRUN[@]}" -n "$n" "$s3" "${gpt2[@]}" "$@" || status=1
}
ddp() {  # label transport [flags...]
  [ $torch = yes ] || return 0
  local label=$1 tr=$2; shift 2
  gpu_run "$label" 400 gpus="$n" transport="$tr" side=ddp flags="$*" -- \
    "${GPU_TORCHRUN[@]}" "$n" "$GPU_PY/pytorch_ddp.py" --precision bf16 --batch 16 --seq-len 1024 --steps "$steps" --warmup 3 \
    "$@" || status=1
}
allreduce() {  # transport
  gpu_run "allreduce-$1" 180 part=allreduce transport="$1" all_lines=1 -- \
    "${GPU_MPIRUN[@]}" -n "$n" "$s3" bench --allreduce --steps 20 --warmup 5 || status=1
}

if [ $pergpu = yes ]; then
  smi_fields=index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$smi_fields --format=csv,noheader,nounits >/dev/null 2>&1 \
    || smi_fields=index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active  # older drivers
  sampler=
  sample() { nvidia-smi --query-gpu=$smi_fields --format=csv,noheader,nounits -lms 200 >"$GPU_LOGS/smi-$1.csv" 2>&1 & sampler=$!; }
  unsample() { kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
               python3 "$GPU_PY/tables.py" smi "$GPU_LOGS/smi-$1.csv" "$1" >>"$GPU_ROWS"; }
  long=(bench --model gpt2 --batch 16 --seq-len 1024 --warmup 3 --precision bf16)
  for g in $(seq 0 $((n - 1))); do
    sample "alone-$g"
    CUDA_VISIBLE_DEVICES=$g gpu_run "alone-$g" 300 part=per-gpu phase=alone gpu="$g" -- "$s2" "${long[@]}" --steps 50 || status=1
    unsample "alone-$g"
  done
  sample together
  pids=()
  for g in $(seq 0 $((n - 1))); do  # 4x the steps: the timed steps overlap though the starts differ
    CUDA_VISIBLE_DEVICES=$g gpu_run "together-$g" 400 part=per-gpu phase=together gpu="$g" -- "$s2" "${long[@]}" --steps 200 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  unsample together
fi

gpu_run ours-1gpu 300 gpus=1 transport=- side=ours-1gpu -- "$s2" "${gpt2[@]}" || status=1
stage3 ours-zero1 default
ddp ddp-compile default
if [ $quick = no ]; then
  stage3 ours-zero1-overlap default --overlap
  stage3 ours-zero0 default --zero 0
  stage3 ours-zero0-overlap default --zero 0 --overlap
  GPT2_CUDA_GRAPH=0 stage3 ours-zero0-no-graph default --zero 0
fi
if [ $socket = yes ]; then
  (
    export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
    stage3 ours-zero1-socket socket
    stage3 ours-zero0-socket socket --zero 0
    stage3 ours-zero1-socket-bf16-sums socket --grad-comm bf16
    stage3 ours-zero1-overlap-socket-bf16-sums socket --grad-comm bf16 --overlap
    ddp ddp-compile-socket socket
    ddp ddp-compile-socket-bf16-sums socket --bf16-sums
    allreduce socket
    exit $status
  ) || status=1
fi
if [ $torch = yes ]; then
  gpu_run torch-compile-1gpu 400 gpus=1 transport=- side=torch-1gpu -- \
    python3 "$GPU_PY/pytorch_gpt2.py" --precision bf16 --compile --batch 16 --seq-len 1024 --steps "$steps" --warmup 3 \
    || status=1
fi
allreduce default
gpu_run ours-1gpu-end 300 gpus=1 transport=- side=ours-1gpu -- "$s2" "${gpt2[@]}" || status=1

gpu_table scaling --gpus "$n"
exit $status

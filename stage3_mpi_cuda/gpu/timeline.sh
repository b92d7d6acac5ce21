#!/usr/bin/env bash
# Where stage 3's step time goes on N GPUs, against stage 2's on one: every kernel, copy and
# memset of GPT-2 124M bf16 B=16 T=1024 bench steps recorded by CUPTI (timeline_inject.c,
# built here with gcc against the machine's CUPTI; kernels inside the CUDA graph one by one),
# read by timeline.py: per step, time computing, time in NCCL kernels alone (communication not
# hidden) and beside other work, and idle time; each NCCL kernel of the last step.
#   [RUNS="zero0 zero1 zero1-overlap"] stage3_mpi_cuda/gpu/timeline.sh [N]
# N: GPUs for stage 3 (default: all that nvidia-smi lists; 1 runs `mpirun -n 1`, which has no
# NCCL kernels: a check of the script itself). RUNS: stage 3's settings to record, each
# `zero0` or `zero1` with optional `-overlap` or `-bucketMB` (e.g. zero1-bucket100); other
# settings (GPT2_*, NCCL_*) are taken from the environment of the call.
# Writes $OUT/timeline.jsonl (one line per recorded process) and prints the tables. From the
# project root after `../shared/gpu/bundle.sh`. About 15 s per run.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
lib=/tmp/libtimeline.so
gcc -O2 -shared -fPIC -I"$cuda/include" -I"$cuda/extras/CUPTI/include" "$here/timeline_inject.c" \
  -L"$cuda/lib64" -L"$cuda/extras/CUPTI/lib64" -lcupti -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" -o "$lib" \
  || { echo "timeline.sh: cannot build the CUPTI injection library"; exit 1; }
found=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
n=${1:-$found}
echo "commit $(cat .gpu/commit 2>/dev/null), stage 3 on $n x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpt2=$(gpt2_bench 8)
jsonl=$OUT/timeline.jsonl; : >"$jsonl"
record() {  # label, command...: the command with every process's GPU activity recorded
  local label=$1; shift
  rm -f "/tmp/tl-$label".*
  CUDA_INJECTION64_PATH=$lib TIMELINE_OUT=/tmp/tl-$label timeout 300 "$@" >"$OUT/timeline-$label.log" 2>&1 \
    || echo "$label: exit $? (see timeline-$label.log)"
  local i=0 f
  for f in $(ls "/tmp/tl-$label".* 2>/dev/null | sort -t. -k2 -n); do  # one file per process, by PID
    python3 "$here/timeline.py" "$label-p$i" "$f" >/tmp/tl.txt 2>&1
    head -n -1 /tmp/tl.txt   # the table; its last line is the JSON record
    tail -1 /tmp/tl.txt | grep '^{' >>"$jsonl"
    i=$((i + 1))
  done
}
record stage2 stage2_cuda $gpt2
for run in ${RUNS:-zero0 zero1}; do
  flags="--zero ${run:4:1}"
  case $run in
    *-overlap) flags="$flags --overlap" ;;
    *-bucket*) flags="$flags --bucket-mb ${run##*-bucket}" ;;
  esac
  record "stage3-$run" mpirun -n "$n" stage3_mpi_cuda $gpt2 $flags
done
echo; echo "timeline.jsonl:"; cat "$jsonl"

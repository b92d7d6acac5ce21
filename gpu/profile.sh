#!/usr/bin/env bash
# Where a training step's GPU time goes: kernel by kernel, against PyTorch's step, and on
# several GPUs how much of the step is communication.
#
#   gpu/profile.sh [--precision P]... [--no-ncu] [--no-torch] [--timeline N]
#
# ncu (Nsight Compute; skipped with a note where it is not installed): the one measured step of
# `stage2_cuda bench` (after two warm-up steps, so the replayed one, and no start-up work: bench
# marks it with cuProfilerStart/Stop) of GPT-2 124M, B=16, T=1024 in each precision P (default
# bf16), every kernel's duration
# (gpu__time_duration, clocks left as found). ncu serialises the kernels, so their sum has no
# launch gaps and no overlap: set it beside the bench's ms/step to see the gaps. Grouped into
# attention, matrix products, optimizer and other, as for PyTorch below.
# PyTorch (skipped without torch): gpu/py/pytorch_profile.py, the same step in torch.compile
# and in eager bf16 under torch.profiler, with the same groups.
# --timeline N: every kernel, copy and memset of a few bench steps recorded through CUPTI
# (gpu/py/timeline_inject.c, compiled here with gcc against the CUDA toolkit's CUPTI; kernels
# inside CUDA graphs one by one), for stage 2 on one GPU and stage 3 on N GPUs (ZeRO-1, the
# default, and --zero 0), read by gpu/py/timeline.py: per step the time computing, in NCCL
# kernels alone (communication not hidden) and beside other kernels, and idle (split by what
# follows each gap: a cuBLAS or NCCL kernel, or one of ours); and each NCCL kernel of the last
# step. Set beside ncu's table, it tells gaps between kernels from kernels that run longer
# inside the step than alone. Needs CUDA_HOME (default /usr/local/cuda) with extras/CUPTI.
#
# About 1 min per part on an H100.
# Writes results/runs/profile/ (replaced): README.md (machine header and every table),
# ncu-P.csv (ncu's raw rows), timeline.jsonl (one record per recorded process).
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
precisions=() ncu_on=yes torch=yes timeline=
while [ $# -gt 0 ]; do
  case $1 in
    --precision) precisions+=("$2"); shift ;;
    --no-ncu) ncu_on=no ;;
    --no-torch) torch=no ;;
    --timeline) timeline=$2; shift ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
[ ${#precisions[@]} -gt 0 ] || precisions=(bf16)
gpu_setup "${args[@]}"
s2=$(gpu_bin stage2_cuda)
out=$RESULTS_DIR/runs/profile
rm -rf "$out"; mkdir -p "$out"
md=$out/README.md
{
  echo "# Where a training step's time goes"
  echo
  echo "Written by \`$GPU_CMDLINE\`."
  echo
  python3 "$GPU_PY/machine.py" --md "$GPU_LOGS/machine.json"
  echo
} >"$md"
status=0
step=(bench --model gpt2 --batch 16 --seq-len 1024 --steps 1 --warmup 2)

if [ $ncu_on = yes ]; then
  ncu=$(command -v ncu || find /opt/nvidia/nsight-compute /usr/local/cuda/bin -maxdepth 2 -name ncu -type f 2>/dev/null | head -1 || true)
  if [ -x "${ncu:-}" ]; then
    for p in "${precisions[@]}"; do
      gpu_say "ncu: one step, $p"
      if timeout -k 20 600 "$ncu" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
          "$s2" "${step[@]}" --precision "$p" >"$out/ncu-$p.csv" 2>"$GPU_LOGS/ncu-$p.log"; then
        { echo "## Ours, $p: one step's kernels (Nsight Compute)"; echo
          python3 "$GPU_PY/tables.py" ncu "$out/ncu-$p.csv" "$p"; echo; } >>"$md"
      else
        status=1; echo "   ncu failed ($p): $GPU_LOGS/ncu-$p.log" >&2; tail -5 "$GPU_LOGS/ncu-$p.log" >&2
      fi
    done
  else
    echo "ncu (Nsight Compute) is not installed: no kernel table of ours." | tee -a "$md" >&2; echo >>"$md"
  fi
fi

if [ $torch = yes ] && gpu_has_torch; then
  for tag in compile eager; do
    how=(); [ $tag = compile ] && how=(--compile)
    gpu_say "PyTorch profile, $tag bf16"
    if timeout -k 20 400 python3 "$GPU_PY/pytorch_profile.py" --precision bf16 "${how[@]}" >"$GPU_LOGS/torch-$tag.txt" \
        2>"$GPU_LOGS/torch-$tag.log"; then
      { echo "## PyTorch $tag, bf16: one step's kernels (torch.profiler)"; echo; echo '```'
        cat "$GPU_LOGS/torch-$tag.txt"; echo '```'; echo; } >>"$md"
    else
      status=1; echo "   PyTorch profile failed ($tag): $GPU_LOGS/torch-$tag.log" >&2
    fi
  done
fi

if [ -n "$timeline" ]; then
  found=$(gpu_count)
  { [ "$timeline" -ge 1 ] && [ "$timeline" -le "$found" ]; } || gpu_die "--timeline $timeline: nvidia-smi lists $found GPUs"
  s3=$(gpu_bin stage3_mpi_cuda)
  cuda=${CUDA_HOME:-/usr/local/cuda}
  lib=$GPU_LOGS/libtimeline.so
  gcc -O2 -shared -fPIC -I"$cuda/include" -I"$cuda/extras/CUPTI/include" "$GPU_PY/timeline_inject.c" \
    -L"$cuda/lib64" -L"$cuda/extras/CUPTI/lib64" -lcupti -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" -o "$lib" \
    || gpu_die "cannot build the CUPTI recorder (gpu/py/timeline_inject.c) against $cuda"
  bench8=(bench --model gpt2 --batch 16 --seq-len 1024 --steps 8 --warmup 3 --precision bf16)
  { echo "## Timeline: stage 2 on one GPU, stage 3 on $timeline (bf16, B=16 per GPU, T=1024)"; echo
    echo "Medians of the last 5 steps, ms; one block per process (rank)."; echo; echo '```'; } >>"$md"
  record() {  # label command...
    local label=$1 i=0 f; shift
    rm -f "$GPU_LOGS/tl-$label".*
    gpu_say "timeline $label"
    CUDA_INJECTION64_PATH=$lib TIMELINE_OUT=$GPU_LOGS/tl-$label timeout -k 20 300 "$@" >"$GPU_LOGS/timeline-$label.log" 2>&1 \
      || { status=1; echo "   $label failed: $GPU_LOGS/timeline-$label.log" >&2; }
    for f in $(find "$GPU_LOGS" -maxdepth 1 -name "tl-$label.*" | sort -t. -k2 -n); do  # one file a process
      python3 "$GPU_PY/timeline.py" "$label-p$i" "$f" >"$GPU_LOGS/tl.txt" 2>&1 || status=1
      head -n -1 "$GPU_LOGS/tl.txt" >>"$md"
      tail -1 "$GPU_LOGS/tl.txt" | grep '^{' >>"$out/timeline.jsonl" || true
      i=$((i + 1))
    done
  }
  record stage2 "$s2" "${bench8[@]}"
  record stage3-zero1 "${GPU_MPIRUN[@]}" -n "$timeline" "$s3" "${bench8[@]}"
  record stage3-zero0 "${GPU_MPIRUN[@]}" -n "$timeline" "$s3" "${bench8[@]}" --zero 0
  echo '```' >>"$md"
fi
cat "$md"
gpu_say "wrote $out; logs in $GPU_LOGS"
exit $status

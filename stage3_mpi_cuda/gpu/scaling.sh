#!/usr/bin/env bash
# Weak scaling of GPT-2 124M in bf16 (B=16 per GPU, T=1024), all in one call on one host with
# 2+ GPUs: stage 2 on one GPU; stage 3 on N GPUs with --zero 0 and --zero 1, each with and
# without --overlap, and --zero 0 op by op (no CUDA graph, to time the sums); PyTorch DDP + torch.compile on N GPUs; torch.compile on one GPU. Writes
# $OUT/scaling.jsonl (one bench line per run) and $OUT/scaling.md (the table), printed last.
# From the project root, after `../shared/gpu/bundle.sh`:
#   [BUCKETS="25 100"] [CTAS="8"] [BESIDE="4"] [POLICY="1"] [TUNES="NCCL_MIN_CTAS=32"] [PIECES="4"] [QUICK=1]
#   [VARIANTS="label|VAR=value ...|flags; ..."] [STEPS=10] stage3_mpi_cuda/gpu/scaling.sh [N]
# N: GPUs (default: all that nvidia-smi lists).
# VARIANTS: further stage 3 runs, `;`-separated, each `label|settings|flags`: run as
# ours-<label>, under the space-separated VAR=value settings (`-` for none), with stage 3's
# bench flags (e.g. "zero1-ov-b4-p4|GPT2_NCCL_BESIDE_CTAS=4 GPT2_ZERO_GATHER_PIECES=4|--zero 1
# --overlap"): combinations the settings above do not cross. Stage 2 runs again at the end
# (ours-1gpu-end); the table's weak scaling is against the mean of its two runs.
# STEPS: timed steps a run (10), after 3 warm-up steps.
# TUNES: NCCL settings (VAR=value, space-separated) under each of which `--zero 1` and NCCL's
# all-reduce sweep run again, to choose stage 3's NCCL defaults on these GPUs.
# PIECES="2 4": `--zero 1` again with each shard updated and gathered in that many pieces, the
# gather of one beside the update of the next (GPT2_ZERO_GATHER_PIECES).
# QUICK=1: leaves out the runs that earlier calls found slower (op by op, --overlap).
# BESIDE="4 8": --overlap (and each bucket size) again with only the buckets summed beside
# backward held to that many thread blocks (GPT2_NCCL_BESIDE_CTAS: a second communicator), the
# sums after backward at NCCL's full width.
# POLICY="1": --overlap (and each bucket size) again under NCCL_CTA_POLICY=K (NCCL 2.27+; 1 is
# its "efficiency" policy: as few thread blocks as keep the bandwidth, for overlap).
# CTAS: --overlap (and each bucket size) again with NCCL held to that many thread blocks a
# collective (NCCL_MAX_CTAS), so that the sums take fewer multiprocessors from the backward
# kernels they run beside (they were slower overlapped than after backward: results/scaling.md).
# About 15 s a run (each compiles its kernels or graphs, then 3 warm-up + STEPS steps): session
# 14's 9 runs and the sweep took 133 s.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
here=$(cd "$(dirname "$0")" && pwd)
gpu_dir=$here/../../stage2_cuda/gpu
found=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
n=${1:-$found}
if [ "$n" -lt 2 ] || [ "$n" -gt "$found" ]; then
  echo "scaling.sh: needs 2 or more GPUs (asked for $n, nvidia-smi lists $found)" >&2
  exit 2
fi
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "commit $(cat .gpu/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null), $n x $device"

steps=${STEPS:-10}
gpt2=$(gpt2_bench "$steps")
jsonl=$OUT/scaling.jsonl log=$OUT/scaling.log
: >"$jsonl"; : >"$log"
run() {  # label, GPUs, command...: the command's last stdout line (JSON) with label and gpus added
  local label=$1 gpus=$2; shift 2
  echo "== $label: $*" | tee -a "$log"
  timeout 300 "$@" >"$OUT/$label.out" 2>>"$log"
  tail -1 "$OUT/$label.out" | python3 -c "
import json, sys
r = json.load(sys.stdin)
r.update(label='$label', gpus=$gpus)
print(json.dumps(r))" >>"$jsonl" 2>>"$log" || echo "$label FAILED (see $log)" | tee -a "$log"
}
run ours-1gpu 1 stage2_cuda $gpt2
# The step run op by op (no CUDA graph), to show what replaying it as a graph gains.
[ -z "${QUICK:-}" ] && GPT2_CUDA_GRAPH=0 run ours-zero0-eager "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero 0
for zero in 0 1; do
  run "ours-zero$zero" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero $zero
  [ -z "${QUICK:-}" ] && run "ours-zero$zero-overlap" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero $zero --overlap
done
for tune in ${TUNES:-}; do  # e.g. NCCL_MIN_CTAS=32: label ours-zero1-nccl_min_ctas-32
  tag=$(echo "${tune//=/-}" | tr 'A-Z' 'a-z')
  (export "$tune"; run "ours-zero1-$tag" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero 1)
done
for k in ${PIECES:-}; do
  (export GPT2_ZERO_GATHER_PIECES=$k; run "ours-zero1-pieces$k" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero 1)
done
for mb in ${BUCKETS:-}; do  # BUCKETS="25 100": --overlap with buckets of at least that many MiB
  run "ours-zero0-bucket$mb" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero 0 --bucket-mb "$mb"
done
overlap_variants() {  # VAR=value, tag: --overlap and each bucket size, --zero 0 and 1, under VAR=value
  local setting=$1 tag=$2 zero mb
  for zero in 0 1; do
    (export "$setting"; run "ours-zero$zero-overlap-$tag" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero $zero --overlap)
    for mb in ${BUCKETS:-}; do
      (export "$setting"; run "ours-zero$zero-bucket$mb-$tag" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero $zero --bucket-mb "$mb")
    done
  done
}
for ctas in ${CTAS:-}; do overlap_variants "NCCL_MAX_CTAS=$ctas" "ctas$ctas"; done
for k in ${BESIDE:-}; do overlap_variants "GPT2_NCCL_BESIDE_CTAS=$k" "beside$k"; done
for k in ${POLICY:-}; do overlap_variants "NCCL_CTA_POLICY=$k" "policy$k"; done
IFS=';' read -ra variants <<< "${VARIANTS:-}"
for variant in "${variants[@]}"; do
  IFS='|' read -r label settings flags <<< "$variant"
  label=$(echo $label)
  [ -n "$label" ] || continue
  (for s in $settings; do [ "$s" = - ] || export "$s"; done
   run "ours-$label" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 $flags)
done
run ddp-compile "$n" python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
  "$gpu_dir/pytorch_ddp.py" --precision bf16 --batch 16 --seq-len 1024 --steps "$steps" --warmup 3
run torch-compile-1gpu 1 python3 "$gpu_dir/pytorch_gpt2.py" --precision bf16 --compile \
  --batch 16 --seq-len 1024 --steps "$steps" --warmup 3
run ours-1gpu-end 1 stage2_cuda $gpt2  # stage 2 again: the drift over the call

# NCCL's all-reduce against message size on these GPUs (nccl-tests' bus-bandwidth convention).
timeout 120 mpirun -n "$n" stage3_mpi_cuda bench --allreduce --steps 20 --warmup 5 2>>"$log" >"$OUT/nccl-allreduce.jsonl"
for tune in ${TUNES:-}; do
  (export "$tune"; timeout 120 mpirun -n "$n" stage3_mpi_cuda bench --allreduce --steps 20 --warmup 5 2>>"$log" |
    python3 -c "
import json, sys
for l in sys.stdin:
    if l.strip():
        r = json.loads(l); r['tune'] = '$tune'; print(json.dumps(r))") >>"$OUT/nccl-allreduce.jsonl"
done
python3 "$here/scaling_table.py" "$jsonl" "$n" "$device" "$log" >"$OUT/scaling.md"
echo; cat "$OUT/scaling.md"
echo; echo "scaling.jsonl:"; cat "$jsonl"
echo; echo "nccl-allreduce.jsonl:"; cat "$OUT/nccl-allreduce.jsonl"   # the device returns few files: keep the data on stdout too

#!/usr/bin/env bash
# Weak scaling of GPT-2 124M in bf16 (B=16 per GPU, T=1024), all in one call on one host with
# 2+ GPUs: stage 2 on one GPU; stage 3 on N GPUs with --zero 0 and --zero 1, each with and
# without --overlap; PyTorch DDP + torch.compile on N GPUs; torch.compile on one GPU. Writes
# $OUT/scaling.jsonl (one bench line per run) and $OUT/scaling.md (the table), printed last.
# From the project root, after `../shared/gpu/bundle.sh`:
#   stage3_mpi_cuda/gpu/scaling.sh [N]      # N: GPUs to use (default: all that nvidia-smi lists)
# Takes about 5-8 minutes (each run compiles its kernels or graphs, then 3 warm-up + 10 steps).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
source .gpu/env.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
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

gpt2="bench --model gpt2 --batch 16 --seq-len 1024 --steps 10 --warmup 3 --precision bf16"
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
for zero in 0 1; do
  run "ours-zero$zero" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero $zero
  run "ours-zero$zero-overlap" "$n" mpirun -n "$n" stage3_mpi_cuda $gpt2 --zero $zero --overlap
done
run ddp-compile "$n" python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
  "$gpu_dir/pytorch_ddp.py" --precision bf16 --batch 16 --seq-len 1024 --steps 10 --warmup 3
run torch-compile-1gpu 1 python3 "$gpu_dir/pytorch_gpt2.py" --precision bf16 --compile \
  --batch 16 --seq-len 1024 --steps 10 --warmup 3

python3 - "$jsonl" "$n" "$device" >"$OUT/scaling.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n, device = int(sys.argv[2]), sys.argv[3]
by = {r["label"]: r for r in rows}
one, ddp = by.get("ours-1gpu"), by.get("ddp-compile")
print(f"# GPT-2 124M, bf16, B=16 per GPU, T=1024, {n} x {device}\n")
print("Weak-scaling efficiency: tokens/s per GPU over stage 2's on one GPU (this call's run).")
print("vs DDP: tokens/s over DDP + torch.compile's on the same GPUs. Comm ms/step: time in our")
print("communication calls per step (with --overlap on NCCL, only the queueing: the GPU's wait")
print("shows in the compute time). Peak: device memory per GPU.\n")
print("| run | GPUs | tokens/s | tokens/s per GPU | weak-scaling eff. | vs DDP | ms/step | comm ms/step | peak MiB per GPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    g, tps = r["gpus"], r["tokens_per_s"]
    eff = f"{tps / g / one['tokens_per_s']:.1%}" if one else ""
    vs = f"{tps / ddp['tokens_per_s']:.2f}x" if ddp and g == ddp["gpus"] and r is not ddp else ""
    comm = f"{r['comm_ms_per_step']:.1f}" if "comm_ms_per_step" in r else ""
    print(f"| {r['label']} | {g} | {tps:,.0f} | {tps / g:,.0f} | {eff} | {vs} | {r['ms_per_step']:.1f} | {comm} | {r['peak_device_mb']:,.0f} |")
missing = [l for l in ["ours-1gpu", "ours-zero0", "ours-zero0-overlap", "ours-zero1", "ours-zero1-overlap",
                       "ddp-compile", "torch-compile-1gpu"] if l not in by]
if missing:
    print(f"\nFailed or missing: {', '.join(missing)} (see scaling.log)")
PY
echo; cat "$OUT/scaling.md"

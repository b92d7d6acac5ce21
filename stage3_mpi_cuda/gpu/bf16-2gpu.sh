#!/usr/bin/env bash
# bf16 on two GPUs of one host: stage 3's GPU tests, then GPT-2 124M (B=16 per GPU, T=1024)
# in bf16 on one GPU (stage 2, its step a CUDA graph) and on two (stage 3, NCCL; with and
# without --overlap), and torch.compile bf16 on one GPU in the same call. From the project root
# after `../shared/gpu/bundle.sh`; $OUT/bench-2gpu.jsonl and a table last.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
here=$(cd "$(dirname "$0")" && pwd)
cat .gpu/commit 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader | head -2
for t in /tmp/gpu-rt/tests/*; do
  case $(basename "$t") in stage3*|nccl*|mpi_cuda*) ;; *) continue ;; esac
  timeout 300 "$t" --include-ignored --test-threads 1 2>&1 | grep -E "^test result|FAILED|panicked" | tee -a "$OUT/tests-2gpu.log"
done
gpt2=$(gpt2_bench 10)
: >"$OUT/bench-2gpu.jsonl"
run() {  # label, command...
  local label=$1; shift
  timeout 240 "$@" 2>/dev/null | tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin); r['label']='$label'; print(json.dumps(r))" >>"$OUT/bench-2gpu.jsonl" || echo "$label FAILED"
}
run ours-bf16-1gpu stage2_cuda $gpt2
run ours-bf16-2gpu mpirun -n 2 stage3_mpi_cuda $gpt2
run ours-bf16-2gpu-overlap mpirun -n 2 stage3_mpi_cuda $gpt2 --overlap
run torch-compile-bf16-1gpu python3 "$here/../../stage2_cuda/gpu/pytorch_gpt2.py" --precision bf16 --compile
python3 - "$OUT/bench-2gpu.jsonl" <<'PY'
import json, sys
rows = {r["label"]: r for r in map(json.loads, open(sys.argv[1]))}
one = rows.get("ours-bf16-1gpu")
print(f"{'run':<26} {'tokens/s':>9} {'ms/step':>8} {'comm ms':>8} {'peak MiB':>9}  scaling")
for label, r in rows.items():
    s = f"{r['tokens_per_s'] / (2 * one['tokens_per_s']):.1%} of 2x one" if one and "2gpu" in label else ""
    print(f"{label:<26} {r['tokens_per_s']:>9.0f} {r['ms_per_step']:>8.1f} {r.get('comm_ms_per_step', 0):>8.1f} {r['peak_device_mb']:>9.0f}  {s}")
PY

#!/usr/bin/env bash
# Stages 2 and 3 on a multi-GPU host, in one call: every GPU test (stage 2's and stage 3's),
# the results runs (stage 2 on one GPU, stage 3 on two, with `make results`' settings in
# fp32), and GPT-2 124M benches (ours on 1 and 2 GPUs, PyTorch eager on 1). A table last.
# From the project root, after `../shared/gpu/bundle.sh` (the whole workspace):
#   stage3_mpi_cuda/gpu/run.sh      # $OUT: results.tgz, tests.log, bench.jsonl, stage3.log
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
source stage2_cuda/gpu/cuda-env.sh
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "gpus: $gpu"
log=$OUT/stage3.log
rm -f "$log" "$OUT/tests.log" "$OUT/bench.jsonl"
rc=0

# 1. Stage 3's tests (2-GPU parity with stage 2, bench).
for t in /tmp/gpu-rt/tests/nccl-*; do
  echo "== test $(basename "$t")" | tee -a "$log"
  timeout 240 "$t" --include-ignored --nocapture --test-threads 1 >>"$OUT/tests.log" 2>&1 || { rc=1; echo "stage3 tests FAILED" | tee -a "$log"; }
done

# 2. Results runs: the settings of `make results` (see the Makefile), fp32 for comparison.
flags=$(sed -n "s/^TRAIN_FLAGS := //p" Makefile)  # the Makefile holds them once
mkdir -p /tmp/res/stage2 /tmp/res/stage3
timeout 300 stage2_cuda train $flags --precision fp32 --out /tmp/res/stage2 >>"$log" 2>&1 || { rc=1; echo "stage2 results run FAILED" | tee -a "$log"; }
timeout 300 mpirun -n 2 stage3_mpi_cuda train $flags --precision fp32 --out /tmp/res/stage3 >>"$log" 2>&1 || { rc=1; echo "stage3 results run FAILED" | tee -a "$log"; }
short=$(sed -n "s/^SHORT_FLAGS := //p" Makefile)
timeout 120 stage2_cuda train $short --precision fp32 --out /tmp/res/short-stage2 >>"$log" 2>&1 || { rc=1; echo "stage2 short run FAILED" | tee -a "$log"; }
timeout 120 mpirun -n 2 stage3_mpi_cuda train $short --precision fp32 --out /tmp/res/short-stage3 >>"$log" 2>&1 || { rc=1; echo "stage3 short run FAILED" | tee -a "$log"; }
rm -f /tmp/res/*/model.ckpt
tar -C /tmp/res -czf "$OUT/results.tgz" stage2 stage3 short-stage2 short-stage3

# 3. Stage 3 bench: GPT-2 124M, B=16 per GPU, T=1024, 2 GPUs (global batch 32), tf32.
echo "== bench stage3 2 GPUs" >>"$log"
timeout 200 mpirun -n 2 stage3_mpi_cuda bench --model gpt2 --batch 16 --seq-len 1024 --steps 10 --warmup 3 --precision tf32 >/tmp/s3b.log 2>&1
cat /tmp/s3b.log >>"$log"
tail -1 /tmp/s3b.log | python3 -c "import json,sys; r=json.load(sys.stdin); r['label']='ours-tf32-2gpu'; print(json.dumps(r))" >>"$OUT/bench.jsonl" || echo "no stage3 bench JSON"

# 4. Stage 2's tests and benches (ours and PyTorch, fp32 and tf32) through its own script, last.
if [ "${SKIP_STAGE2:-0}" != 1 ]; then
  BENCH_REPS=1 OUT=/tmp/s2 timeout 300 stage2_cuda/gpu/run.sh tests bench >>"$log" 2>&1 || rc=1
  echo "stage2 script rc=$rc" | tee -a "$log"
fi
cat /tmp/s2/tests.log >>"$OUT/tests.log" 2>/dev/null; cat /tmp/s2/bench.jsonl >>"$OUT/bench.jsonl" 2>/dev/null

echo; echo "==== failures"; grep -hE "panicked|FAILED|^---- " "$OUT/tests.log" "$log" | head -20
echo "==== tests"; grep -hE "^test result" "$OUT/tests.log"
echo "==== results runs (last rows)"; for s in stage2 stage3; do echo "$s: $(tail -1 /tmp/res/$s/loss.tsv 2>/dev/null)"; done
echo "==== GPT-2 124M, T=1024, B=16 per GPU, $gpu"
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if len(sys.argv) > 1 else []
by = {r["label"]: r for r in rows}
print(f"{'run':<22} {'tokens/s':>9} {'ms/step':>8} {'comm ms':>8} {'peak MiB':>9}  vs torch")
for r in rows:
    p = "tf32" if "tf32" in r["label"] else "fp32"
    t = by.get(f"torch-{p}-r1")
    ratio = f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}x" if t and not r["label"].startswith("torch") else ""
    print(f"{r['label']:<22} {r['tokens_per_s']:>9.0f} {r['ms_per_step']:>8.1f} {r.get('comm_ms_per_step', 0):>8.1f} {r['peak_device_mb']:>9.0f}  {ratio}")
PY
exit $rc

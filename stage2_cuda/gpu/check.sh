#!/usr/bin/env bash
# The one-GPU check before an issue is resolved, in one device call: every GPU test (each test
# executable that has ignored tests, with --include-ignored, but the two-GPU NCCL ones), the determinism check (two
# same-seed runs per precision: identical loss.tsv and final state; run.sh determinism), and
# the PyTorch side-by-side bench (GPT-2 124M B=16 T=1024: ours bf16 against torch.compile bf16,
# two alternating rounds). The GPU tests of one process take turns (common/tests/support: they
# share the device's CUDA context, and one opening a backend while another records a CUDA graph
# failed now and then: results/runs/gpu-8877c39), so --test-threads only runs CPU tests beside.
# Run from the project root after `../shared/gpu/bundle.sh`; outputs in $OUT, a table last.
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "build $(cat .gpu/commit 2>/dev/null); $(results/describe-machine.sh 2>/dev/null | head -1)" | tee "$OUT/check.txt"
for t in /tmp/gpu-rt/tests/*; do
  file=$(basename "$t"); name=${file%-*}
  case $name in nccl|stage3_mpi_cuda|mpi|stage1_mpi|comm_check) continue ;; esac  # 2 GPUs / MPI ranks
  # GPU tests are the ignored ones; an executable without any is CPU-only (make test runs it,
  # and stage 0's call the binary at the build machine's path, which is not here).
  "$t" --list --ignored 2>/dev/null | grep -q ': test$' || continue
  res=$(timeout 400 "$t" --include-ignored --test-threads 4 2>&1 | tee "$OUT/test-$file.log" | grep -E "^test result" | tail -1)
  printf 'TESTS %-18s %s\n' "$name" "${res:-NO RESULT (see test-$file.log)}" | tee -a "$OUT/check.txt"
  grep -E "^test .*FAILED|panicked" "$OUT/test-$file.log" | head -5 | tee -a "$OUT/check.txt"
done
OUT=$OUT timeout 300 bash stage2_cuda/gpu/run.sh determinism 2>&1 | grep "^DETERMINISM" | sort -u | tee -a "$OUT/check.txt"
for r in 1 2; do
  stage2_cuda $(gpt2_bench 10) 2>/dev/null | tail -1 > "$OUT/ours-bf16-$r.json"
  timeout 150 python3 stage2_cuda/gpu/pytorch_gpt2.py --precision bf16 --compile 2>/dev/null | tail -1 > "$OUT/torch-compile-$r.json"
done
python3 - "$OUT" <<'PY' | tee -a "$OUT/check.txt"
import json, sys
o = sys.argv[1]
def tps(f):
    try: return json.loads(open(f"{o}/{f}").read().strip().splitlines()[-1])["tokens_per_s"]
    except Exception: return None
for r in (1, 2):
    a, t = tps(f"ours-bf16-{r}.json"), tps(f"torch-compile-{r}.json")
    if not (a and t):
        print(f"BENCH round {r}: missing (ours {a}, torch.compile {t})")
        continue
    print(f"BENCH round {r}: ours bf16 {round(a):,} tokens/s ({16384e3 / a:.2f} ms), "
          f"torch.compile bf16 {round(t):,} ({16384e3 / t:.2f} ms): {a / t:.3f}x")
PY

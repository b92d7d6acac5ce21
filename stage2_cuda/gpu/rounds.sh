#!/usr/bin/env bash
# Ours (bf16) against torch.compile (bf16), GPT-2 124M B=16 T=1024, in N alternating rounds of one
# device call (default 4), for a ratio that the run-to-run spread of either side cannot fake:
#   stage2_cuda/gpu/rounds.sh [N]        (from the project root, after ../shared/gpu/bundle.sh)
# Prints a ROUND line per round and the median ratio last; JSON lines in $OUT/rounds.jsonl.
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
n=${1:-4}
echo "build $(cat .gpu/commit 2>/dev/null); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
for r in $(seq 1 "$n"); do
  ours=$(stage2_cuda $(gpt2_bench 20) 2>/dev/null | tail -1)
  torch=$(timeout 150 python3 stage2_cuda/gpu/pytorch_gpt2.py --precision bf16 --compile --steps 20 2>/dev/null | tail -1)
  echo "{\"round\": $r, \"ours\": $ours, \"torch_compile\": $torch}" >> "$OUT/rounds.jsonl"
done
python3 - "$OUT/rounds.jsonl" <<'PY'
import json, statistics, sys
ratios = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    a, t = r["ours"]["tokens_per_s"], r["torch_compile"]["tokens_per_s"]
    ratios.append(a / t)
    print(f"ROUND {r['round']}: ours {a:,.0f} tokens/s ({16384e3 / a:.2f} ms), torch.compile {t:,.0f} ({16384e3 / t:.2f} ms): {a / t:.3f}x")
print(f"MEDIAN {statistics.median(ratios):.3f}x over {len(ratios)} rounds (min {min(ratios):.3f}x, max {max(ratios):.3f}x)")
PY

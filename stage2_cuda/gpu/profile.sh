#!/usr/bin/env bash
# Where one training step's GPU time goes, kernel by kernel (Nsight Compute's duration
# counter, clocks left as found): one `stage2_cuda bench` step of GPT-2 124M at B=16, T=1024.
#   stage2_cuda/gpu/profile.sh [precision ...]      (default: bf16)
# Writes $OUT/profile-<precision>.csv (ncu's raw rows) and prints a table: kernel, launches,
# total ms, share of the step. ncu serialises kernels, so the total is the sum of kernel times
# (no launch gaps, no overlap): compare it with the bench's ms/step to see the gaps.
set -uo pipefail
[ -f .gpu/env.sh ] && source .gpu/env.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "ncu not found"; exit 1; }
for p in ${*:-bf16}; do
  csv="$OUT/profile-$p.csv"
  timeout 300 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    "$(command -v stage2_cuda)" bench --model gpt2 --batch 16 --seq-len 1024 --steps 1 --warmup 0 --precision "$p" \
    >"$csv" 2>"$OUT/profile-$p.log" || { echo "ncu failed ($p)"; tail -5 "$OUT/profile-$p.log"; continue; }
  python3 - "$csv" "$p" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
name_i, unit_i, value_i = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}
total = collections.defaultdict(lambda: [0, 0.0])
for r in body:
    name = r[name_i].split("(")[0].split("<")[0][:60]
    ms = float(r[value_i].replace(",", "")) * scale.get(r[unit_i], 1e-6)
    total[name][0] += 1
    total[name][1] += ms
step = sum(v[1] for v in total.values())
print(f"== {sys.argv[2]}: one step, {sum(v[0] for v in total.values())} kernels, {step:.1f} ms of kernel time")
for name, (n, ms) in sorted(total.items(), key=lambda kv: -kv[1][1]):
    print(f"PROFILE {sys.argv[2]:<5} {name:<60} {n:>5} {ms:8.2f} ms {100 * ms / step:5.1f}%")
# The same groups as pytorch_profile.py's, to set the two steps side by side.
def group(n):
    n = n.lower()
    if "flash" in n or "attention" in n: return "attention"
    if "gemm" in n or "nvjet" in n or "cutlass" in n or "sm90_xmma" in n or "cublas" in n or "splitk" in n: return "matmul"
    if "adamw" in n: return "optimizer"
    return "other"
groups = collections.defaultdict(float)
for name, (n, ms) in total.items():
    groups[group(name)] += ms
for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"PROFGROUP {sys.argv[2]:<5} {g:<40} {ms:8.2f} ms {100 * ms / step:5.1f}%")
PY
done

#!/usr/bin/env bash
# Where inside one kernel the warps wait: Nsight Compute's per-instruction stall samples (SASS)
# for the first launch matching a kernel name, in one training step of GPT-2 124M (B=16, T=1024).
#   stage2_cuda/gpu/source-stalls.sh KERNEL_REGEX [precision]    (default bf16)
# Prints the 40 instructions with the most samples (share, times executed, the two main stall
# reasons) and the opcode mix weighted by how often each instruction ran; raw CSV in $OUT.
# Extra `env` settings for the run go in $RUN_ENV (e.g. RUN_ENV="GPT2_CUDA_ATTN_FWD=n128").
set -uo pipefail
[ -f .gpu/env.sh ] && source .gpu/env.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
k=${1:?kernel name regex}; p=${2:-bf16}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "ncu not found"; exit 1; }
csv="$OUT/source-$(echo "$k" | tr -c 'A-Za-z0-9_\n' _)-$p.csv"
timeout 300 env ${RUN_ENV:-} "$ncu" --clock-control none -k "regex:$k" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
  "$(command -v stage2_cuda)" bench --model gpt2 --batch 16 --seq-len 1024 --steps 1 --warmup 0 --precision "$p" \
  >"$csv" 2>"$OUT/source-$p.log" || { echo "ncu failed ($k)"; tail -5 "$OUT/source-$p.log"; exit 1; }
python3 - "$csv" "$k" <<'PY'
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
head_i = next(i for i, r in enumerate(rows) if "Source" in r)
head, body = rows[head_i], rows[head_i + 1:]
si, src, ex = head.index("Warp Stall Sampling (All Samples)"), head.index("Source"), head.index("Instructions Executed")
stalls = [(i, c) for i, c in enumerate(head) if c.startswith("stall_")]
num = lambda x: float((x or "0").replace(",", ""))
total = sum(num(r[si]) for r in body) or 1.0
executed = sum(num(r[ex]) for r in body) or 1.0
print(f"SOURCE {sys.argv[2]}: {len(body)} instructions, {total:.0f} samples, {executed:.0f} executed (warp level)")
for n in sorted(range(len(body)), key=lambda n: -num(body[n][si]))[:40]:
    r = body[n]
    why = sorted(((num(r[i]), c[6:]) for i, c in stalls), reverse=True)[:2]
    why = " ".join(f"{c}={100 * v / max(num(r[si]), 1):.0f}%" for v, c in why if v)
    print(f"SOURCE {n:5d} {100 * num(r[si]) / total:5.1f}% x{num(r[ex]):>9.0f}  {r[src].strip()[:60]:<60} {why}")
mix = collections.Counter()
for r in body:
    op = r[src].strip().split()
    if not op: continue
    op = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
    mix[op.split(".")[0]] += num(r[ex])
print("SOURCE mix (share of executed warp instructions): " +
      ", ".join(f"{op} {100 * n / executed:.1f}%" for op, n in mix.most_common(16)))
PY

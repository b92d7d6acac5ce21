#!/usr/bin/env bash
# Short bursts against sustained load: GPT-2 124M bf16 (B=16, T=1024) for SHORT steps and for
# LONG steps, ours (`stage2_cuda bench`) and torch.compile (`pytorch_gpt2.py --compile`),
# alternating, with the GPU's SM clock, power and temperature sampled every 200 ms
# (nvidia-smi) over each run. A training run lasts minutes: if the clock falls under
# sustained load, the short benches used for the ratios overstate both sides' speed; this
# shows by how much and whether the ratio holds. Prints one line a run, then a table.
# Knobs: SHORT (10), LONG (600), PRECISION (bf16).
set -uo pipefail
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
SHORT=${SHORT:-10} LONG=${LONG:-600} PRECISION=${PRECISION:-bf16}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
rows=$OUT/sustained.jsonl; : >"$rows"
measure() {  # label, steps, command...
  local label=$1 steps=$2; shift 2
  local smi=/tmp/smi-$label.csv
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 200 >"$smi" &
  local pid=$!
  local json; json=$(timeout 400 "$@" 2>/dev/null | tail -1)
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  python3 - "$label" "$steps" "$smi" "$json" <<'PY' | tee -a "$rows"
import json, sys
label, steps, smi, line = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    r = json.loads(line)
except ValueError:
    print(json.dumps({"label": label, "steps": steps, "error": "no JSON"})); sys.exit()
busy = [tuple(float(x) for x in l.split(",")) for l in open(smi) if l.count(",") == 2]
busy = [s for s in busy if s[1] > 200] or busy  # samples under load (power above 200 W)
mean = lambda i: sum(s[i] for s in busy) / max(len(busy), 1)
print(json.dumps({"label": label, "steps": steps, "ms_per_step": r.get("ms_per_step"),
                  "tokens_per_s": r.get("tokens_per_s"), "sm_mhz": round(mean(0)),
                  "min_sm_mhz": min((s[0] for s in busy), default=0), "watts": round(mean(1)),
                  "max_temp_c": max((s[2] for s in busy), default=0)}))
PY
}
gpt2="--model gpt2 --batch 16 --seq-len 1024 --warmup 3 --precision $PRECISION"
for steps in "$SHORT" "$LONG"; do
  measure "ours-$steps" "$steps" stage2_cuda bench $gpt2 --steps "$steps"
  measure "torch-compile-$steps" "$steps" python3 stage2_cuda/gpu/pytorch_gpt2.py --compile $gpt2 --steps "$steps"
done
python3 - "$rows" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" <<'PY'
import json, sys
rows = {r["label"]: r for r in map(json.loads, open(sys.argv[1])) if "error" not in r}
print(f"\n| run ({sys.argv[2]}) | steps | ms/step | tokens/s | SM MHz (mean, min) | W | max °C |")
print("|---|---:|---:|---:|---:|---:|---:|")
for r in rows.values():
    print(f"| {r['label']} | {r['steps']} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:,.0f} | {r['sm_mhz']}, {r['min_sm_mhz']:.0f} | {r['watts']} | {r['max_temp_c']:.0f} |")
for n in sorted({r["steps"] for r in rows.values()}):
    a, b = rows.get(f"ours-{n}"), rows.get(f"torch-compile-{n}")
    if a and b:
        print(f"SUSTAINED {n} steps: ours / torch.compile = {a['tokens_per_s'] / b['tokens_per_s']:.3f}")
PY

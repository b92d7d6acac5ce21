#!/usr/bin/env bash
# Each GPU's own speed, to tell the spread of the GPUs from communication in stage 3's weak
# scaling (a synchronous step waits for the slowest GPU): stage 2's bench (GPT-2 124M bf16,
# B=16, T=1024) on every GPU one at a time (GPU 0 to N-1), then on all of them at once (one
# process each, the host as busy as under stage 3), then stage 3's default on all N. While
# each runs, nvidia-smi samples every GPU's SM clock, power, temperature and clock-event
# reasons every 200 ms. Prints a table per GPU (ms a step alone and together; median SM clock,
# power and temperature while busy; the clock-event reasons seen) and stage 3's weak scaling
# against GPU 0 alone (as scaling.sh, whose one-GPU runs take GPU 0) and against the slowest
# GPU alone. Writes $OUT/per-gpu.jsonl (the bench lines) and $OUT/smi-*.csv (the samples).
#   [STEPS=50] stage3_mpi_cuda/gpu/per-gpu.sh [N]
# N: GPUs (default: all that nvidia-smi lists). STEPS: timed steps a run alone; the runs on
# all GPUs at once take 4 x STEPS, so that their timed steps overlap although the processes
# start at slightly different times. From the project root after `../shared/gpu/bundle.sh`.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
n=${1:-$(nvidia-smi -L | wc -l)}
steps=${STEPS:-50}
echo "commit $(cat .gpu/commit 2>/dev/null), $n x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
jsonl=$OUT/per-gpu.jsonl; : >"$jsonl"
# Clock-event reasons are called throttle reasons by older drivers.
fields=index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits >/dev/null 2>&1 \
  || fields=index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active
sampler=
sample() {  # phase: sample every GPU until `unsample`
  nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -lms 200 >"$OUT/smi-$1.csv" 2>&1 &
  sampler=$!
}
unsample() { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; }
bench() {  # label, gpu (or "all" for stage 3), command...: the bench line, labelled
  local label=$1 gpu=$2; shift 2
  timeout 300 "$@" >"$OUT/$label.out" 2>&1
  tail -1 "$OUT/$label.out" | python3 -c "
import json, sys
r = json.load(sys.stdin); r.update(label='$label', gpu='$gpu'); print(json.dumps(r))" >>"$jsonl" \
    || echo "$label FAILED (see $label.out)"
}
for g in $(seq 0 $((n - 1))); do
  sample "alone-$g"
  CUDA_VISIBLE_DEVICES=$g bench "alone-$g" "$g" stage2_cuda $(gpt2_bench "$steps")
  unsample
done
sample together
pids=()
for g in $(seq 0 $((n - 1))); do
  CUDA_VISIBLE_DEVICES=$g bench "together-$g" "$g" stage2_cuda $(gpt2_bench $((4 * steps))) &
  pids+=($!)
done
wait "${pids[@]}"
unsample
sample stage3
bench stage3 all mpirun -n "$n" stage3_mpi_cuda $(gpt2_bench "$steps")
unsample
python3 - "$OUT" "$n" <<'EOF'
import csv, json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
runs = {r["label"]: r for r in map(json.loads, open(f"{out}/per-gpu.jsonl"))}
def busy(phase):
    """Per GPU: (SM MHz, W, deg C) medians over the samples with the GPU busy, reasons OR'd."""
    rows = {}
    for row in csv.reader(open(f"{out}/smi-{phase}.csv")):
        try:
            g, mhz, watts, temp, why = int(row[0]), float(row[1]), float(row[2]), float(row[3]), int(row[4], 16)
        except (ValueError, IndexError):
            continue
        if watts > 250:  # busy: an idle H100/H200 draws ~70-120 W
            rows.setdefault(g, []).append((mhz, watts, temp, why))
    return {g: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v),
                statistics.median(r[2] for r in v), " ".join(sorted({hex(r[3]) for r in v})))
            for g, v in rows.items()}
smi, smi3 = busy("together"), busy("stage3")
ms = lambda label: runs[label]["ms_per_step"] if label in runs else float("nan")
print(f"\n| GPU | stage 2 alone ms/step | stage 2 all at once ms/step | SM MHz (all at once; under stage 3) | W | deg C | clock-event reasons |")
print("|---:|---:|---:|---:|---:|---:|---|")
for g in range(n):
    c, w, t, why = smi.get(g, (float("nan"),) * 3 + ("",))
    c3 = smi3.get(g, (float("nan"),))[0]
    print(f"| {g} | {ms(f'alone-{g}'):.3f} | {ms(f'together-{g}'):.3f} | {c:.0f}; {c3:.0f} | {w:.0f} | {t:.0f} | {why} |")
alone = [runs[f"alone-{g}"]["tokens_per_s"] for g in range(n) if f"alone-{g}" in runs]
if "stage3" in runs and len(alone) == n:
    per_gpu = runs["stage3"]["tokens_per_s"] / n
    print(f"\nstage 3 default on {n}: {runs['stage3']['tokens_per_s']:,.0f} tokens/s, {runs['stage3']['ms_per_step']:.3f} ms/step; "
          f"weak scaling {100 * per_gpu / alone[0]:.1f}% against GPU 0 alone, "
          f"{100 * per_gpu / min(alone):.1f}% against the slowest GPU alone (GPU {alone.index(min(alone))}); "
          f"the GPUs alone spread {100 * (max(alone) / min(alone) - 1):.1f}% in tokens/s")
EOF

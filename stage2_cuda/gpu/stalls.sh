#!/usr/bin/env bash
# Why the flash attention kernels run where they do: Nsight Compute's issue-stall breakdown,
# occupancy and pipe utilisation for the first forward, dK/dV and dQ launches of one training
# step (GPT-2 124M, B=16, T=1024, HS=64, bf16 by default).
#   stage2_cuda/gpu/stalls.sh [precision]        (prints STALL lines; raw CSV in $OUT)
set -uo pipefail
[ -f .gpu/env.sh ] && source .gpu/env.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
p=${1:-bf16}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "ncu not found"; exit 1; }
reasons="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected lg_throttle dispatch_stall no_instruction branch_resolving imc_miss drain sleeping tex_throttle membar misc"
metrics="sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,smsp__average_warp_latency_per_inst_issued.ratio,launch__registers_per_thread,launch__occupancy_limit_registers,gpu__time_duration.sum"
for r in $reasons; do metrics="$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
csv="$OUT/stalls-$p.csv"; : >"$csv"
for k in flash_forward flash_backward_dkdv flash_backward_dq; do  # the first launch of each
  timeout 300 "$ncu" --clock-control none -k regex:$k --launch-count 1 --metrics "$metrics" --csv \
    "$(command -v stage2_cuda)" bench --model gpt2 --batch 16 --seq-len 1024 --steps 1 --warmup 0 --precision "$p" \
    >>"$csv" 2>"$OUT/stalls-$p.log" || { echo "ncu failed ($k)"; tail -5 "$OUT/stalls-$p.log"; }
done
python3 - "$csv" <<'PY'
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
head = next(csv.reader([lines[0]]))
rows = [head] + [r for r in csv.reader(lines) if r != head]
head, body = rows[0], rows[1:]
k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
by = collections.defaultdict(dict)
for r in body:
    by[r[k].split("(")[0]][r[m]] = r[v]
for kernel, ms in by.items():
    print(f"STALL {kernel}")
    stalls = {n.split("stalled_")[1].split("_per_issue")[0]: float(x.replace(",", "")) for n, x in ms.items() if "stalled_" in n}
    for n, x in ms.items():
        if "stalled_" not in n:
            print(f"STALL   {n:<75} {x}")
    for n, x in sorted(stalls.items(), key=lambda kv: -kv[1])[:8]:
        print(f"STALL   stall {n:<69} {x:.2f}")
PY

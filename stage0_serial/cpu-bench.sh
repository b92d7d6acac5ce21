#!/usr/bin/env bash
# The CPU benchmark (`make bench`): stage 0 and stage 1 on GPT-2 124M and the char model,
# each run REPS times (default 3) in turns, medians into results/cpu-bench.md with the
# machine it ran on. Needs the release binaries (`make build`).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
REPS=${REPS:-3}
NP=${NP:-2}
log=$(mktemp); trap 'rm -f "$log"' EXIT
# label | command (its last stdout line is the bench JSON)
benches=(
  "stage 0, GPT-2 124M, batch 4, seq 64, $(nproc) threads|$BIN/stage0_serial bench --model gpt2 --batch 4 --seq-len 64 --steps 5"
  "stage 0, char model, batch 16, seq 128|$BIN/stage0_serial bench --model char --vocab 256 --batch 16 --seq-len 128 --steps 20"
  "stage 1, GPT-2 124M, $NP ranks x batch 2, seq 64|mpirun -n $NP $BIN/stage1_mpi bench --model gpt2 --batch 2 --seq-len 64 --steps 3"
  "stage 1, same, --overlap|mpirun -n $NP $BIN/stage1_mpi bench --model gpt2 --batch 2 --seq-len 64 --steps 3 --overlap"
)
for rep in $(seq 1 "$REPS"); do
  for b in "${benches[@]}"; do
    label=${b%%|*}; cmd=${b#*|}
    echo "== [$rep/$REPS] $label: $cmd" >&2
    json=$($cmd 2>/dev/null | tail -1)
    echo "$label|$json" >>"$log"
  done
done
python3 - "$log" "$(results/describe-machine.sh)" "$REPS" >results/cpu-bench.md <<'PY'
import json, statistics, sys
rows, env, reps = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for line in open(rows):
    label, js = line.rstrip("\n").split("|", 1)
    runs.setdefault(label, []).append(json.loads(js))
print("# CPU benchmark: stages 0 and 1\n")
print(f"Written by `stage0_serial/cpu-bench.sh` (`make bench`). Measured on: {env}.\n")
print(f"Each line ran {reps} times, in turns with the others; the median (min–max) of its runs' figures. "
      "Training steps on random tokens (forward, backward, AdamW with clipping), after warm-up steps.\n")
print("| bench | s/step | tokens/s | GFLOP/s | peak RSS (GiB) | of a step: allreduce (s) |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for label, rs in runs.items():
    def col(key, scale=1.0):
        v = sorted(r[key] * scale for r in rs)
        return v
    s = col("ms_per_step", 1e-3)
    med = lambda v: statistics.median(v)
    comm = col("comm_ms_per_step", 1e-3)
    print(f"| {label} | {med(s):.2f} ({s[0]:.2f}–{s[-1]:.2f}) | {med(col('tokens_per_s')):.0f} | "
          f"{med(col('gflops')):.0f} | {med(col('peak_rss_mb', 1/1024)):.2f} | {med(comm):.2f} |")
PY
cat results/cpu-bench.md

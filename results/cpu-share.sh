#!/usr/bin/env bash
# What share of the machine's fp32 matrix-product rate the CPU training step reaches, on two
# cores: stage 0's char-model step (`bench --model char --vocab 256 --batch 16 --seq-len 128`)
# in GFLOP/s against numpy's 2048^3 fp32 product (its BLAS, 2 threads) and our own square
# product (`bench --kernels --matmul-only`), ROUNDS rounds (default 3) in turns, pinned with
# taskset to CPUS (default 0,1). Also times the char model's 2-epoch run
# that `make run` trains (TRAIN=0 leaves it out), with its final validation loss.
#
#   results/cpu-share.sh              # writes results/cpu-share/HOST.json, then cpu-share.md
#
# One JSON per CPU model under results/cpu-share/ (a run on another machine adds its own or
# replaces that machine's); results/cpu-share.md is the table of all of them, remade each run.
# Needs python3 with numpy, and target/release/stage0_serial (BIN to name another).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/stage0_serial}
ROUNDS=${ROUNDS:-3}
CPUS=${CPUS:-0,1}
TRAIN=${TRAIN:-1}
[ -x "$BIN" ] || cargo build --release -p stage0_serial
command -v python3 >/dev/null && python3 -c 'import numpy' 2>/dev/null || { echo "cpu-share.sh: needs python3 with numpy" >&2; exit 2; }
pin() { taskset -c "$CPUS" "$@"; }
# shellcheck source=results/cpu-name.sh
source results/cpu-name.sh
siblings=$(cat "/sys/devices/system/cpu/cpu${CPUS%%,*}/topology/thread_siblings_list" 2>/dev/null || echo "?")
blas=$(python3 -c 'import numpy; c=numpy.show_config(mode="dicts"); print(c["Build Dependencies"]["blas"]["name"])' 2>/dev/null || echo "?")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

numpy_gflops() {
  OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 pin python3 -c '
import time, numpy as np
a = np.random.rand(2048, 2048).astype(np.float32); b = np.random.rand(2048, 2048).astype(np.float32)
a @ b
n, t = 5, time.perf_counter()
for _ in range(n): a @ b
print(n * 2 * 2048**3 / (time.perf_counter() - t) / 1e9)'
}
ours_gflops() {
  pin "$BIN" bench --kernels --matmul-only --threads 2 2>/dev/null | head -1 \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["flop"] / d["ms"] / 1e6)'
}
step_gflops() {
  pin "$BIN" bench --model char --vocab 256 --batch 16 --seq-len 128 --threads 2 --steps 30 --warmup 3 2>/dev/null | tail -1 \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["gflops"], d["tokens_per_s"])'
}
# Other processes' share of the machine while this runs (near 0: nothing else ran).
busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
own() { sed 's/.*) //' /proc/$$/stat | awk '{print $12 + $13 + $14 + $15}'; }
busy0=$(busy) own0=$(own) wall0=$(date +%s%N)
: >"$work/rounds"
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  n=$(numpy_gflops); o=$(ours_gflops); sg=$(step_gflops); read -r s tps <<<"$sg"
  echo "$n $o $s $tps" >>"$work/rounds"
done
train_s=None val=None
if [ "$TRAIN" = 1 ]; then
  echo "the char model's 2 epochs (make run's job)" >&2
  t0=$(date +%s%N)
  pin "$BIN" train --data data/tinyshakespeare.txt --model char --epochs 2 --batch 16 --seq-len 128 --lr 6e-3 \
    --warmup 30 --seed 1337 --eval-every 98 --threads 2 --sample-len 0 --out "$work/run" >/dev/null 2>&1
  train_s=$(( ($(date +%s%N) - t0) / 1000000 ))e-3
  val=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["final_val_loss"])' "$work/run/summary.json")
fi
others=$(awk -v b="$(( $(busy) - busy0 ))" -v o="$(( $(own) - own0 ))" -v hz="$(getconf CLK_TCK)" \
  -v w="$(( $(date +%s%N) - wall0 ))" -v n="$(nproc)" 'BEGIN { x = (b - o) / hz / (w / 1e9 * n); printf "%.3f", x < 0 ? 0 : x }')
mkdir -p results/cpu-share
python3 - "$work/rounds" "results/cpu-share/$slug.json" <<EOF
import json, statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
med = lambda i: statistics.median(r[i] for r in rows)
json.dump({"cpu": "$cpu", "simd": "$simd", "cpus": "$CPUS", "siblings": "$siblings", "blas": "$blas",
           "machine": """$(results/describe-machine.sh | sed 's/^Measured on: //')""",
           "rounds": rows, "numpy_gflops": med(0), "ours_gflops": med(1), "step_gflops": med(2),
           "step_tokens_per_s": med(3), "share_of_numpy": med(2) / med(0), "share_of_ours": med(2) / med(1),
           "train_2_epochs_s": $train_s, "train_val_loss": $val, "others_share": $others, "cores": $(nproc)}, open(sys.argv[2], "w"), indent=1)
EOF
python3 - results/cpu-share/*.json >results/cpu-share.md <<'EOF'
import json, sys
rows = [json.load(open(p)) for p in sys.argv[1:]]
print("# The CPU step's share of the machine's matrix-product rate\n")
print("Written by `results/cpu-share.sh`, one row per machine (its JSON in `cpu-share/`). Two cores "
      "(taskset), fp32. The step: stage 0's char model, batch 16, seq 128, forward, backward and AdamW, "
      "in GFLOP/s as `bench` counts them. numpy: its 2048^3 product on 2 threads of its BLAS; ours: "
      "`bench --kernels --matmul-only`'s 2048^3 product. Medians of the rounds, run in turns. "
      "2 epochs: the char-model run of `make run` (its training alone, binary built), with its final "
      "validation loss. Load: the share of the machine's cores that other processes kept busy "
      "meanwhile. Target: the step at >= 0.4 of numpy's rate.\n")
print("| CPU (cores used; their hyperthread siblings) | numpy GEMM GFLOP/s | ours GFLOP/s | char step GFLOP/s | step / numpy | step / ours | char tokens/s | 2 epochs (s), val | load |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    run = f"{r['train_2_epochs_s']:.1f}, {r['train_val_loss']:.3f}" if r.get("train_2_epochs_s") else "-"
    print(f"| {r['cpu']}, {r['simd']} ({r['cpus']}; {r['siblings']}), numpy's BLAS {r['blas']} | {r['numpy_gflops']:.0f} | {r['ours_gflops']:.0f} "
          f"| {r['step_gflops']:.0f} | {r['share_of_numpy']:.2f} | {r['share_of_ours']:.2f} | {r['step_tokens_per_s']:,.0f} | {run} "
          f"| {100 * r['others_share']:.0f}% of {r['cores']} cores |")
print("\nMeasured on:\n")
for r in rows:
    print(f"- {r['cpu']}: {r['machine']}")
EOF
cat results/cpu-share.md

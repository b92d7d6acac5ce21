#!/usr/bin/env bash
# `make run` as a newcomer meets it: a fresh clone of this commit, an empty cargo home (so the
# crates are downloaded, which needs the network) and no build, on CPUS (default 0,1 with
# taskset). Times the whole command, and of it the training (the run's own clock, from its
# summary.json); the rest is the download, the build and the start. Target: at most 5 minutes,
# with a final validation loss at most 1.8.
#
#   results/make-run.sh         # writes results/make-run/HOST.json, then results/make-run.md
#
# One JSON per CPU model under results/make-run/ (a run on another machine adds its own or
# replaces that machine's); results/make-run.md is the table of all of them, remade each run.
set -euo pipefail
cd "$(dirname "$0")/.."
CPUS=${CPUS:-0,1}
command -v cargo >/dev/null || { echo "make-run.sh: needs the Rust toolchain (rustup)" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
git clone -q --no-hardlinks . "$work/repo"
commit=$(git -C "$work/repo" rev-parse --short HEAD)
# shellcheck source=results/cpu-name.sh
source results/cpu-name.sh
echo "make run in a fresh clone of $commit, CARGO_HOME=$work/cargo-home, cores $CPUS" >&2
t0=$(date +%s%N)
(cd "$work/repo" && CARGO_HOME=$work/cargo-home taskset -c "$CPUS" make run) >"$work/log" 2>&1 \
  || { tail -20 "$work/log" >&2; exit 1; }
total=$(( ($(date +%s%N) - t0) / 1000000 ))e-3
mkdir -p results/make-run
python3 - "$work/repo/runs/stage0/summary.json" "results/make-run/$slug.json" <<EOF
import json, sys
s = json.load(open(sys.argv[1]))
json.dump({"cpu": "$cpu", "simd": "$simd", "cpus": "$CPUS", "commit": "$commit",
           "machine": """$(cd "$work/repo" && results/describe-machine.sh | sed 's/^Measured on: //')""",
           "total_s": $total, "train_s": s["train_time_s"], "val_loss": s["final_val_loss"],
           "steps": s["steps"]}, open(sys.argv[2], "w"), indent=1)
EOF
python3 - results/make-run/*.json >results/make-run.md <<'EOF'
import json, sys
rows = [json.load(open(p)) for p in sys.argv[1:]]
print("# `make run` on a fresh machine\n")
print("Written by `results/make-run.sh`, one row per machine (its JSON in `make-run/`): a fresh clone, "
      "an empty cargo home (the crates downloaded), no build, two cores (taskset); `make run` builds "
      "stage 0 and trains the char model for 2 epochs on Tiny Shakespeare. Training: the run's own "
      "clock; the rest: download, build, start and sample. Target: at most 5 minutes, validation "
      "loss at most 1.8.\n")
print("| CPU (cores used) | commit | make run (s) | of it training (s) | the rest (s) | steps | final val loss |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print(f"| {r['cpu']}, {r['simd']} ({r['cpus']}) | {r['commit']} | {r['total_s']:.0f} | {r['train_s']:.0f} "
          f"| {r['total_s'] - r['train_s']:.0f} | {r['steps']} | {r['val_loss']:.3f} |")
print("\nMeasured on:\n")
for r in rows:
    print(f"- {r['cpu']}: {r['machine']}")
EOF
cat results/make-run.md

#!/usr/bin/env bash
# The MLP on the CPU against PyTorch eager (the CPU target: ≥ 2× PyTorch eager on the 2-core
# machine, in the same run). For each shape, ROUNDS rounds in turns (the order of the two
# swapped every round, so a drift of the machine's speed falls on both alike):
#   ours     stage0_serial mnist --bench --synthetic (made-up MNIST-shaped images, SGD momentum
#            0.9, lr 0.05 along a cosine, no weight decay, fp32) --threads THREADS
#   PyTorch  gpu/py/pytorch_mlp.py --device cpu --threads THREADS: the same model
#            (Linear + ReLU, PyTorch's initialisation), softmax cross-entropy, SGD momentum 0.9,
#            lr 0.05, fp32, eager; a made-up 60,000 × 784 float32 set in memory, each batch
#            indexed from it by a permutation, nothing read back per step
# Shapes (SHAPES, "batch:hidden" words): the default MLP 784→256→128→10 at batch 64, the GPU
# target's 784→128→128→128→10 at batch 32, and the default MLP at batch 256.
# Writes results/mlp-cpu.md (steps/s, µs/step, samples/s, ours ÷ PyTorch per round and
# their median, the machine, the load, the commands) and results/mlp-cpu.jsonl (every run).
#
# PyTorch: TORCH_PYTHON (a python that imports torch), else .venv-torch/bin/python, else the
# script makes .venv-torch (git-ignored) and pip-installs torch's CPU wheel into it (plain PyPI,
# whose Linux wheel brings CUDA's libraries, gigabytes, if PyTorch's CPU index cannot be reached). When torch cannot be installed it says so in one
# line and exits 0 (`make bench` goes on); nothing under `make test` runs this.
# Usage, from anywhere: results/mlp-cpu-bench.sh   (env, defaults: ROUNDS=3, THREADS=2, STEPS=2000,
# WARMUP=200, SHAPES, BIN: a built stage0_serial, else cargo builds it in CARGO_TARGET_DIR;
# NAME: the output files' name, mlp-cpu; OURS_COMMIT: the commit BIN was built from, when it is
# not this checkout's, named in the table)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-2000}
WARMUP=${WARMUP:-200}
SHAPES=${SHAPES:-"64:256,128 32:128,128,128 256:256,128"}
OUT=results
NAME=${NAME:-mlp-cpu}
say() { echo "== $*" >&2; }

# ---- PyTorch ------------------------------------------------------------------------------
has_torch() { [ -n "$1" ] && "$1" -c "import torch" >/dev/null 2>&1; }
py=${TORCH_PYTHON:-}
if [ -n "$py" ] && ! has_torch "$py"; then
  say "TORCH_PYTHON=$py cannot import torch: trying .venv-torch"
  py=
fi
if [ -z "$py" ]; then
  py=.venv-torch/bin/python
  if ! has_torch "$py"; then
    say "installing torch (CPU wheel) into .venv-torch"
    { [ -x "$py" ] || python3 -m venv .venv-torch; } \
      && { .venv-torch/bin/pip install -q --retries 1 --timeout 30 torch --index-url https://download.pytorch.org/whl/cpu \
           || .venv-torch/bin/pip install -q torch; } >&2 || true
    if ! has_torch "$py"; then
      echo "mlp-cpu-bench: skipped: torch could not be installed into .venv-torch (no network or no wheel for this Python); set TORCH_PYTHON to a python with torch"
      exit 0
    fi
  fi
fi
torch_version=$("$py" -c "import torch; print(torch.__version__)")

# ---- ours ---------------------------------------------------------------------------------
if [ -z "${BIN:-}" ]; then
  say "building stage0_serial (release)"
  cargo build --release -q -p stage0_serial
  BIN=${CARGO_TARGET_DIR:-target}/release/stage0_serial
fi

mkdir -p "$OUT"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
machine=$(results/describe-machine.sh)
# CPU time taken by other processes while this runs (the machine may be shared with builds).
cpu_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
own_ticks() { sed 's/.*) //' /proc/$$/stat | awk '{print $12 + $13 + $14 + $15}'; }
t0_busy=$(cpu_ticks); t0_own=$(own_ticks); t0=$(date +%s.%N)

ours_cmd() { echo "${3:-$BIN} mnist --bench --synthetic --batch $1 --hidden $2 --steps $STEPS --warmup $WARMUP --threads $THREADS"; }
torch_cmd() { echo "${3:-$py} gpu/py/pytorch_mlp.py --device cpu --threads $THREADS --batch $1 --hidden $2 --steps $STEPS --warmup $WARMUP"; }

# One run: impl, round, batch, hidden; its JSON line (tagged) onto the jsonl, a line to stderr.
run() {
  local impl=$1 round=$2 batch=$3 hidden=$4 cmd
  if [ "$impl" = ours ]; then cmd=$(ours_cmd "$batch" "$hidden"); else cmd=$(torch_cmd "$batch" "$hidden"); fi
  # shellcheck disable=SC2086 # the command's words
  $cmd 2>"$tmp/log" | grep '^{' | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
r.update(bench_impl='$impl', round=$round, shape='$batch:$hidden')
print(json.dumps(r))
print(f\"round $round  $impl  batch $batch  hidden $hidden: {r['steps_per_s']:,.0f} steps/s, {r['us_per_step']:.1f} us/step\", file=sys.stderr)" \
    >>"$OUT/$NAME.jsonl" || { say "$impl failed: $cmd"; tail -5 "$tmp/log" >&2; exit 1; }
}

: >"$OUT/$NAME.jsonl"
for round in $(seq 1 "$ROUNDS"); do
  for shape in $SHAPES; do
    batch=${shape%%:*} hidden=${shape#*:}
    if [ $((round % 2)) = 1 ]; then order="ours torch"; else order="torch ours"; fi
    for impl in $order; do run "$impl" "$round" "$batch" "$hidden"; done
  done
done

load=$(python3 -c "
busy, own, wall = $(cpu_ticks) - $t0_busy, $(own_ticks) - $t0_own, $(date +%s.%N) - $t0
print(round(100 * max(busy - own, 0) / $(getconf CLK_TCK) / (wall * $(nproc))))")

env="ROUNDS=$ROUNDS THREADS=$THREADS STEPS=$STEPS WARMUP=$WARMUP SHAPES=\"$SHAPES\""
[ "$NAME" = mlp-cpu ] || env="$env NAME=$NAME"
[ -z "${OURS_COMMIT:-}" ] || env="$env OURS_COMMIT=$OURS_COMMIT BIN=..."
python3 - "$OUT/$NAME.jsonl" "$machine" "$torch_version" "$load" "$(nproc)" "$(ours_cmd BATCH HIDDEN)" "$(torch_cmd BATCH HIDDEN python3)" \
  "$env" "${OURS_COMMIT:-}" "$NAME" >"$OUT/$NAME.md" <<'PY'
import json, statistics, sys
path, machine, torch_version, load, cores, ours_cmd, torch_cmd, env, ours_commit, name = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
shapes = list(dict.fromkeys(r["shape"] for r in rows))
ours0 = next(r for r in rows if r["bench_impl"] == "ours")
print("# The MLP on the CPU against PyTorch eager" + (f" (ours at {ours_commit})" if ours_commit else "") + "\n")
print("Written by `results/mlp-cpu-bench.sh`. Measured on: " + machine + ".\n")
line = f"Load: other processes took {load}% of the {cores} cores while this ran"
print(line + (" (this machine is shared: another build or test was running beside it and slowed these figures)."
              if int(load) >= 10 else " (quiet).") + "\n")
built = f" built from commit {ours_commit} (not this checkout's)" if ours_commit else ""
print(f"Ours: `stage0_serial mnist --bench --synthetic`{built}, {ours0['device']}, path `{ours0['path']}`. "
      f"PyTorch {torch_version}, eager, fp32, `torch.set_num_threads` as ours. Both: SGD with momentum 0.9, "
      f"lr 0.05, no weight decay, softmax cross-entropy, made-up MNIST-shaped images (60,000 × 784), "
      f"{ours0['warmup']} untimed steps then {ours0['steps']} timed ones; each round runs both "
      f"(the order swapped every round). Figures are medians over the rounds; \"ours ÷ PyTorch\" is the "
      f"steps/s ratio, per round and its median (the CPU target: ≥ 2×).\n")
print("| MLP | batch | ours steps/s | ours µs/step | PyTorch steps/s | PyTorch µs/step | ours images/s | ours ÷ PyTorch (per round) | median | ≥ 2× |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |")
for shape in shapes:
    runs = [r for r in rows if r["shape"] == shape]
    ours = {r["round"]: r for r in runs if r["bench_impl"] == "ours"}
    torch = {r["round"]: r for r in runs if r["bench_impl"] == "torch"}
    ratios = [ours[k]["steps_per_s"] / torch[k]["steps_per_s"] for k in sorted(ours) if k in torch]
    med = lambda xs, key: statistics.median(x[key] for x in xs.values())
    ratio = statistics.median(ratios)
    widths = "→".join(map(str, ours[min(ours)]["widths"]))
    print(f"| {widths} | {ours[min(ours)]['batch']} | {med(ours, 'steps_per_s'):,.0f} | {med(ours, 'us_per_step'):,.1f} "
          f"| {med(torch, 'steps_per_s'):,.0f} | {med(torch, 'us_per_step'):,.1f} | {med(ours, 'samples_per_s'):,.0f} "
          f"| {', '.join(f'{x:.2f}' for x in ratios)} | **{ratio:.2f}×** | {'met' if ratio >= 2 else 'NOT met'} |")
print(f"\nCommands (BATCH and HIDDEN per row; every run's JSON line is in `{name}.jsonl`):\n")
print("```sh")
print(f"{env} results/mlp-cpu-bench.sh")
print(ours_cmd)
print(torch_cmd + "   # python3: TORCH_PYTHON or .venv-torch/bin/python")
print("```")
PY
cat "$OUT/$NAME.md"

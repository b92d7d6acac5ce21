#!/usr/bin/env bash
# The CPU benchmark suite (`make bench`): tables and plots under results/bench/, each naming
# the machine and the commit (results/describe-machine.sh) and the load it ran under:
#   kernels    bench --kernels on stage 0: GPT-2 124M's matrix products forward and backward,
#              GFLOP/s against a square product's in the same run, then the other kernels
#              -> matmul-cpu.md
#   threads    a GPT-2 124M training step on stage 0 at 1, 2, 4, ... threads and nproc,
#              ROUNDS rounds in turns, speed-up against 1 thread -> threads-cpu.md, threads-cpu.png
#   train      end-to-end `train` tokens/s, char and GPT-2 124M, stage 0 and stage 1 (NP ranks)
#              -> train-cpu.md
#   allreduce  stage 1's MPI all-reduce against message size (NP ranks) -> allreduce-mpi.md, .png
#   zero       stage 1's step (NP ranks, 1 thread each) with --zero 0 and --zero 1, GPT-2 124M and
#              char, ROUNDS rounds in turns: why stage 1's default is --zero 0 -> zero-cpu.md
#   steps      stage0_serial/cpu-bench.sh: stages 0 and 1 on 124M and char, REPS runs
#              in turns -> results/cpu-bench.md
#   mlp        results/mlp-cpu-bench.sh: the MLP on stage 0 against PyTorch eager on the CPU,
#              alternating rounds -> results/mlp-cpu.md (skipped, saying so, where torch cannot be had)
# results/bench/README.md gathers the tables. Usage, from anywhere:
#   results/bench-suite.sh [kernels] [threads] [train] [allreduce] [zero] [steps] [mlp]   (default: all)
# Needs the release binaries (`make build`); BIN (default target/release), NP (default 2),
# ROUNDS (default 2), REPS (default 3, for steps).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
NP=${NP:-2}
ROUNDS=${ROUNDS:-2}
OUT=results/bench
parts=${*:-kernels threads train allreduce zero steps mlp}
want() { [[ " $parts " == *" $1 "* ]]; }
mkdir -p "$OUT"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

# The machine's line. This machine may be shared with other builds, which slow what runs
# beside them: `start` notes the CPU time used so far, by everything (/proc/stat) and by this
# script's own processes (its reaped children's, /proc/$$/stat); `note_load FILE` then adds
# to the table the share of the CPUs that other processes took while the part ran.
machine() { results/describe-machine.sh; }
cpu_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
own_ticks() { sed 's/.*) //' /proc/$$/stat | awk '{print $12 + $13 + $14 + $15}'; }
start() { t0_busy=$(cpu_ticks); t0_own=$(own_ticks); t0=$(date +%s.%N); }
note_load() {
  local share
  share=$(python3 -c "
busy, own, wall = $(cpu_ticks) - $t0_busy, $(own_ticks) - $t0_own, $(date +%s.%N) - $t0
hz = $(getconf CLK_TCK)
print(round(100 * max(busy - own, 0) / hz / (wall * $cores)))")
  local line="Load: other processes took ${share}% of the $cores cores while this part ran"
  if [ "$share" -ge 10 ]; then
    line="$line (this machine is shared: another build or test was running beside it and slowed these figures)."
  else
    line="$line (quiet)."
  fi
  sed -i "/Measured on: /a\\\n$line" "$1"
}
say() { echo "== $*" >&2; }

if want kernels; then
  say "kernels: stage0_serial bench --kernels (about a minute on 2 cores)"
  m=$(machine); start
  "$BIN/stage0_serial" bench --kernels >"$OUT/kernels-cpu.jsonl"
  python3 results/bench_tables.py matmul "$m" "cpu ($cores threads)=$OUT/kernels-cpu.jsonl" >"$OUT/matmul-cpu.md"
  note_load "$OUT/matmul-cpu.md"
  cat "$OUT/matmul-cpu.md"
fi

if want threads; then
  m=$(machine); start
  counts=$(python3 -c "n=$cores; print(*sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n}))")
  : >"$OUT/threads-cpu.jsonl"
  for round in $(seq 1 "$ROUNDS"); do
    for t in $counts; do
      say "threads: round $round, $t thread(s)"
      "$BIN/stage0_serial" bench --model gpt2 --batch 4 --seq-len 64 --steps 3 --warmup 1 --threads "$t" 2>/dev/null | tail -1 \
        | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(threads=$t, round=$round); print(json.dumps(d))" >>"$OUT/threads-cpu.jsonl"
    done
  done
  python3 results/bench_tables.py threads "$m" "$OUT/threads-cpu.jsonl" "$OUT/threads-cpu.tsv" >"$OUT/threads-cpu.md"
  note_load "$OUT/threads-cpu.md"
  "$BIN/stage0_serial" plot --data "$OUT/threads-cpu.tsv" --x threads --y speedup --y ideal --out "$OUT/threads-cpu.png" \
    --title "GPT-2 124M step, stage 0: speed-up against 1 thread" >/dev/null \
    && printf '\n![speed-up against threads](threads-cpu.png)\n' >>"$OUT/threads-cpu.md"
  cat "$OUT/threads-cpu.md"
fi

if want train; then
  m=$(machine); start
  : >"$OUT/train-cpu.jsonl"
  # preset | batch | seq-len | steps | extra flags
  for spec in "char|16|128|40|--model char" "gpt2|4|64|4|--model gpt2 --tokenizer gpt2"; do
    IFS='|' read -r preset batch seq steps flags <<<"$spec"
    common=(train --data data/tinyshakespeare.txt $flags --batch "$batch" --seq-len "$seq" --steps "$steps"
            --eval-every "$steps" --eval-batches 2 --sample-len 0 --seed 1337)
    for stage in 0 1; do
      dir=$tmp/train-$preset-$stage
      if [ $stage = 0 ]; then
        cmd=("$BIN/stage0_serial" "${common[@]}" --out "$dir"); th=$cores
      else
        cmd=(mpirun -n "$NP" "$BIN/stage1_mpi" "${common[@]}" --out "$dir"); th=$(( cores / NP > 0 ? cores / NP : 1 ))
      fi
      say "train: $preset, stage $stage: ${cmd[*]}"
      t_run=$(date +%s.%N)
      "${cmd[@]}" >"$tmp/train.log" 2>&1 || { tail -5 "$tmp/train.log" >&2; continue; }
      wall=$(python3 -c "import time; print(time.time() - $t_run)")
      echo "{\"preset\": \"$preset\", \"stage\": \"$stage\", \"threads\": $th, \"dir\": \"$dir\", \"wall_s\": $wall}" >>"$OUT/train-cpu.jsonl"
    done
  done
  python3 results/bench_tables.py train "$m" "$OUT/train-cpu.jsonl" >"$OUT/train-cpu.md"
  note_load "$OUT/train-cpu.md"
  # The runs are temporary: keep their figures in the JSON lines.
  python3 - "$OUT/train-cpu.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    r["summary"] = json.load(open(r.pop("dir") + "/summary.json"))
    r["summary"].pop("sample", None)
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
  cat "$OUT/train-cpu.md"
fi

if want allreduce; then
  m=$(machine); start
  say "allreduce: mpirun -n $NP stage1_mpi bench --allreduce"
  mpirun -n "$NP" "$BIN/stage1_mpi" bench --allreduce --allreduce-max-mb 512 --steps 5 --warmup 2 --threads 1 2>/dev/null \
    | grep '^{' >"$OUT/allreduce-mpi.jsonl"
  python3 results/bench_tables.py allreduce "$m" "$OUT/allreduce-mpi.jsonl" "$OUT/allreduce-mpi.tsv" >"$OUT/allreduce-mpi.md"
  note_load "$OUT/allreduce-mpi.md"
  "$BIN/stage0_serial" plot --data "$OUT/allreduce-mpi.tsv" --x bytes --y busbw_gb_s --series ranks --log-x \
    --out "$OUT/allreduce-mpi.png" --title "MPI all-reduce bus bandwidth (GB/s) against message size" >/dev/null \
    && printf '\n![busbw against message size](allreduce-mpi.png)\n' >>"$OUT/allreduce-mpi.md"
  cat "$OUT/allreduce-mpi.md"
fi

if want zero; then
  m=$(machine); start
  : >"$OUT/zero-cpu.jsonl"
  # model flags | steps | warmup
  for round in $(seq 1 "$ROUNDS"); do
    for spec in "--model gpt2 --batch 1 --seq-len 64|3|1" "--model char --batch 4 --seq-len 64|10|2"; do
      IFS='|' read -r flags steps warmup <<<"$spec"
      for z in 0 1; do
        say "zero: round $round, $flags, --zero $z"
        mpirun -n "$NP" "$BIN/stage1_mpi" bench $flags --steps "$steps" --warmup "$warmup" --threads 1 --zero "$z" 2>/dev/null \
          | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(zero=$z, round=$round); print(json.dumps(d))" \
          >>"$OUT/zero-cpu.jsonl"
      done
    done
  done
  python3 results/bench_tables.py zero "$m" "$OUT/zero-cpu.jsonl" >"$OUT/zero-cpu.md"
  note_load "$OUT/zero-cpu.md"
  cat "$OUT/zero-cpu.md"
fi

if want steps; then
  say "steps: stage0_serial/cpu-bench.sh (REPS=${REPS:-3})"
  start
  BIN=$BIN NP=$NP stage0_serial/cpu-bench.sh >/dev/null
  note_load results/cpu-bench.md
  cat results/cpu-bench.md
fi

if want mlp; then
  say "mlp: results/mlp-cpu-bench.sh (about 3 minutes; installs torch into .venv-torch on first use)"
  BIN=$BIN/stage0_serial results/mlp-cpu-bench.sh
fi

# The index: every table there is, the GPU ones that a device run brought back included.
{
  echo "# Benchmark suite"
  echo
  echo "Written by \`results/bench-suite.sh\` (\`make bench\`, this machine's CPU) and, for the GPU host's"
  echo "tables, copied from the output of \`gpu/kernels.sh\`, \`gpu/scaling.sh\` and \`gpu/stages.sh --gpt2\`. Each table names the machine, the commit"
  echo "and the load it was measured at. The stages' step times of \`stage0_serial/cpu-bench.sh\` (\`steps\`) are"
  echo "in [../cpu-bench.md](../cpu-bench.md), the MLP against PyTorch eager (\`mlp\`) in [../mlp-cpu.md](../mlp-cpu.md);"
  echo "stage 1 against its rank count in [../rank-scaling.md](../rank-scaling.md)."
  echo
  for f in "$OUT"/*.md; do
    [ "$(basename "$f")" = README.md ] && continue
    echo "- [$(sed -n 's/^## //p' "$f" | head -1)]($(basename "$f"))"
  done
} >"$OUT/README.md"
say "wrote $OUT/README.md"

#!/usr/bin/env bash
# The benchmark suite's device part, for a host with one GPU (an H100) and 16 CPU cores, in
# one call of about 7 minutes. Every table is printed to stdout at the end (and written to
# $OUT, default /tmp/out: matmul-gpu.md, threads-host.md, stages-gpt2.md, allreduce-nccl.md, threads-host.png,
# bench-suite-gpu.tgz with the raw rows and the four runs, log.txt with every command's output).
# Run from the project root, after `../shared/gpu/bundle.sh` here and `source .gpu/env.sh`
# there (which puts the four stages and mpirun on PATH):
#   results/bench-suite-gpu.sh [matmul] [threads] [stages] [nccl]   (default: all four)
#   matmul   stage2_cuda bench --kernels --matmul-only in fp32, tf32 and bf16: GPT-2 124M's
#            products at B·T = 16384, forward and backward, against an 8192^3 product's rate
#   threads  a GPT-2 124M training step on stage 0 at 1, 2, 4, 8, 16 threads (the host's
#            cores: powers of two and nproc), speed-up against 1 thread
#   stages   GPT-2 124M, 10 epochs of a slice of data/tinyshakespeare.txt (GPT-2 tokenizer,
#            global batch 8 x 64, same seed) on stage 0 (one process, CORES/2 threads), stage 1
#            (mpirun -n 2, CORES/2 threads each: MPI adds a second process of the same size),
#            stage 2 (one GPU, fp32) and stage 3 (one rank per GPU the host has, fp32); the
#            loss-per-epoch table (`report`), time per step and per epoch, and the speed-ups
#            serial -> MPI, serial -> CUDA, CUDA -> MPI+CUDA. On one GPU stage 3 runs one rank
#            (the label says so) and its gain over stage 2 is NCCL's overhead alone.
#   nccl     where the host has 2 or more GPUs (nvidia-h200-x2): stage 3's NCCL all-reduce
#            against message size, one rank per GPU (bench --allreduce, nccl-tests' busbw);
#            skipped with a note on one GPU
# Knobs (environment): EPOCHS (10), SLICE_BYTES (the slice's size, 20000: 10 steps an epoch),
# CORES (nproc), BIN (a folder holding the binaries, else PATH). Without a GPU (or without
# stage2_cuda) the GPU parts are skipped with a note, so the CPU parts can be tried anywhere:
#   BIN=target/release EPOCHS=2 SLICE_BYTES=8000 CORES=2 results/bench-suite-gpu.sh threads stages
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
EPOCHS=${EPOCHS:-10}
SLICE_BYTES=${SLICE_BYTES:-20000}
CORES=${CORES:-$(nproc)}
parts=${*:-matmul threads stages nccl}
want() { [[ " $parts " == *" $1 "* ]]; }
[ -f .gpu/env.sh ] && source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
bin() { echo "${BIN:+$BIN/}$1"; }
log=$OUT/log.txt; : >"$log"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/raw" "$work/runs"
host_cpu="$(sed -n 's/^model name\s*:\s*//p' /proc/cpuinfo | head -1), $(nproc) cores"
machine="$(results/describe-machine.sh); host CPU: $host_cpu, load average $(cut -d' ' -f1 /proc/loadavg) at the start"
gpu=no
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && command -v "$(bin stage2_cuda)" >/dev/null; then
  gpu=yes
fi
say() { echo "== $(date +%T) $*" | tee -a "$log" >&2; }
# Runs a command with a time bound, its output into the log; the status is the command's.
run() {
  local limit=$1; shift
  echo "\$ $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
}
say "machine: $machine; parts: $parts; GPU: $gpu"

if want matmul; then
  if [ $gpu = yes ]; then
    specs=()
    for p in fp32 tf32 bf16; do
      say "matmul: stage2_cuda bench --kernels --matmul-only --precision $p"
      echo "\$ stage2_cuda bench --kernels --matmul-only --precision $p" >>"$log"
      timeout 120 "$(bin stage2_cuda)" bench --kernels --matmul-only --precision $p >"$work/raw/matmul-$p.jsonl" 2>>"$log" \
        || say "matmul $p FAILED (see log.txt)"
      specs+=("$p=$work/raw/matmul-$p.jsonl")
    done
    python3 results/bench_tables.py matmul "$machine" "${specs[@]}" >"$OUT/matmul-gpu.md"
    {
      echo
      echo "Datasheet dense peaks of an H100 SXM, for scale: fp32 67, tf32 495, bf16 989 TFLOP/s (the"
      echo "ceiling column is measured, in the same process)."
    } >>"$OUT/matmul-gpu.md"
  else
    echo "## Matrix products on the GPU: not run (no GPU or no stage2_cuda here)" >"$OUT/matmul-gpu.md"
  fi
fi

if want threads; then
  counts=$(python3 -c "n=$CORES; print(*sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n}))")
  : >"$work/raw/threads.jsonl"
  for t in $counts; do
    say "threads: stage0_serial bench --model gpt2 --threads $t"
    if run 120 "$(bin stage0_serial)" bench --model gpt2 --batch 4 --seq-len 64 --steps 3 --warmup 1 --threads "$t"; then
      grep '^{' "$log" | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(threads=$t, round=1); print(json.dumps(d))" >>"$work/raw/threads.jsonl"
    else
      say "threads $t FAILED"
    fi
  done
  python3 results/bench_tables.py threads "$machine" "$work/raw/threads.jsonl" "$work/raw/threads.tsv" >"$OUT/threads-host.md"
  "$(bin stage0_serial)" plot --data "$work/raw/threads.tsv" --x threads --y speedup --y ideal --out "$OUT/threads-host.png" \
    --title "GPT-2 124M step, stage 0: speed-up against 1 thread" >>"$log" 2>&1 \
    && printf '\n![speed-up against threads](threads-host.png)\n' >>"$OUT/threads-host.md"
fi

if want stages; then
  slice=$work/tinyshakespeare-$SLICE_BYTES.txt
  head -c "$SLICE_BYTES" data/tinyshakespeare.txt >"$slice"
  flags=(train --data "$slice" --tokenizer gpt2 --model gpt2 --batch 8 --seq-len 64 --epochs "$EPOCHS"
         --lr 6e-4 --warmup 10 --seed 1337 --sample-len 0)
  half=$(( CORES / 2 > 0 ? CORES / 2 : 1 ))
  ngpu=1; [ $gpu = yes ] && ngpu=$(nvidia-smi -L | wc -l)
  labels=("stage0 (serial, $half threads)" "stage1 (MPI, 2 ranks x $half threads)" "stage2 (CUDA, 1 GPU, fp32)"
          "stage3 (MPI+CUDA, $ngpu rank$([ "$ngpu" -gt 1 ] && echo s) x 1 GPU, fp32)")
  dirs=(stage0 stage1 stage2 stage3)
  cmds=(
    "$(bin stage0_serial) ${flags[*]} --threads $half"
    "mpirun -n 2 $(bin stage1_mpi) ${flags[*]} --threads $half"
    "$(bin stage2_cuda) ${flags[*]} --precision fp32"
    "mpirun -n $ngpu $(bin stage3_mpi_cuda) ${flags[*]} --precision fp32"
  )
  specs=()
  for i in 0 1 2 3; do
    dir=$work/runs/${dirs[$i]}
    if [ $i -ge 2 ] && [ $gpu = no ]; then
      say "stages: ${labels[$i]}: skipped (no GPU)"
    else
      say "stages: ${labels[$i]}"
      # The flags hold no spaces (the slice's path is mktemp's): word splitting is safe.
      run 300 ${cmds[$i]} --out "$dir" || say "${labels[$i]} FAILED (see log.txt)"
      rm -f "$dir/model.ckpt"
      echo "$machine" >"$dir/env.txt"
    fi
    specs+=("${labels[$i]}=$dir")
  done
  found=()  # report's --run for each run that finished
  for spec in "${specs[@]}"; do
    [ -f "${spec#*=}/loss.tsv" ] && found+=(--run "$spec")
  done
  {
    python3 results/bench_tables.py stages "$machine" "${specs[@]}"
    echo
    echo "The runs: \`${flags[*]/#$slice/SLICE}\` (SLICE: the first $SLICE_BYTES bytes of data/tinyshakespeare.txt)."
    if [ ${#found[@]} -gt 0 ] && run 60 "$(bin stage0_serial)" report "${found[@]}" --out "$work/runs/report"; then
      echo
      echo "### Loss per epoch, from the \`report\` subcommand (its whole page and loss.png: runs/report/ in the .tgz)"
      echo
      # Its loss table and the agreement table, without the page's other parts.
      python3 -c "
import sys
page = open(sys.argv[1]).read()
part = page[page.index('## Table 2'):]
part = part.split('## Loss curves')[0].split('## Sample')[0]
print('\n'.join(l.replace('## ', '#### ', 1) for l in part.splitlines() if not l.startswith('The stages compute')).strip())
" "$work/runs/report/README.md"
    fi
  } >"$OUT/stages-gpt2.md"
fi

if want nccl; then
  ngpu=0; [ $gpu = yes ] && ngpu=$(nvidia-smi -L | wc -l)
  if [ "$ngpu" -ge 2 ]; then
    say "nccl: mpirun -n $ngpu stage3_mpi_cuda bench --allreduce"
    echo "\$ mpirun -n $ngpu stage3_mpi_cuda bench --allreduce --allreduce-max-mb 512 --steps 20 --warmup 5" >>"$log"
    timeout 180 mpirun -n "$ngpu" "$(bin stage3_mpi_cuda)" bench --allreduce --allreduce-max-mb 512 --steps 20 --warmup 5 \
      2>>"$log" | grep '^{' >"$work/raw/allreduce-nccl.jsonl" || say "nccl FAILED (see log.txt)"
    python3 results/bench_tables.py allreduce "$machine" "$work/raw/allreduce-nccl.jsonl" "$work/raw/allreduce-nccl.tsv" >"$OUT/allreduce-nccl.md"
  else
    echo "## NCCL all-reduce: not run ($ngpu GPU here; it needs 2 or more, e.g. nvidia-h200-x2)" >"$OUT/allreduce-nccl.md"
  fi
fi

tar -C "$work" -czf "$OUT/bench-suite-gpu.tgz" raw runs
for f in matmul-gpu threads-host stages-gpt2 allreduce-nccl; do
  [ -f "$OUT/$f.md" ] && { echo; echo "==== $f.md"; cat "$OUT/$f.md"; }
done
echo
echo "==== failures"; grep -E "FAILED|error" "$log" | head -10 || echo "(none)"
exit 0

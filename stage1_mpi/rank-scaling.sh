#!/usr/bin/env bash
# Stage 1 against the number of ranks on one machine's cores, and the MPI all-reduce's
# bandwidth against message size (part of `make bench`). Run from the project root, with
# stage1_mpi on PATH (or BIN=target/release), on a machine with CORES cores (default: all):
#   stage1_mpi/rank-scaling.sh            # writes $OUT/rank-scaling.md and .jsonl, table printed
# GPT-2 124M, global batch 16 x 64 tokens, ranks 1, 2, 4, 8 (as far as the cores go), each
# rank with CORES/ranks threads: the same work and cores, cut into more processes.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bin=${BIN:+$BIN/}stage1_mpi
cores=${CORES:-$(nproc)}
jsonl=$OUT/rank-scaling.jsonl; : >"$jsonl"
for r in 1 2 4 8; do
  [ "$r" -le "$cores" ] || continue
  th=$((cores / r))
  line=$(timeout 300 mpirun -n "$r" $bin bench --model gpt2 --batch $((16 / r)) --seq-len 64 --steps 3 --warmup 1 --threads "$th" 2>/dev/null | tail -1)
  echo "$line" | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(kind='train', threads=$th); print(json.dumps(d))" >>"$jsonl" || echo "ranks $r: failed" >&2
done
for r in 2 4 8; do
  [ "$r" -le "$cores" ] || continue
  timeout 300 mpirun -n "$r" $bin bench --allreduce --allreduce-max-mb 512 --steps 5 --warmup 2 --threads 1 2>/dev/null \
    | python3 -c "import json,sys
for l in sys.stdin:
    if l.startswith('{'): d=json.loads(l); d['kind']='allreduce'; print(json.dumps(d))" >>"$jsonl"
done
python3 - "$jsonl" "$cores" >"$OUT/rank-scaling.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cores = sys.argv[2]
train = [r for r in rows if r["kind"] == "train"]
print(f"# Stage 1 on {cores} cores: time per step against ranks, and MPI all-reduce bandwidth\n")
print("GPT-2 124M, global batch 16 x 64 tokens, AdamW with clipping, random tokens; each rank runs")
print(f"{cores}/ranks threads. Speed-up: one rank's s/step over this row's. Allreduce: the gradient sum's")
print("share of a step (the host waits for it).\n")
print("| ranks | threads per rank | s/step | speed-up | tokens/s | allreduce s/step | peak RSS per rank (GiB) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
one = next((r for r in train if r["ranks"] == 1), None)
for r in train:
    s = r["ms_per_step"] / 1e3
    up = f"{one['ms_per_step'] / r['ms_per_step']:.2f}x" if one else ""
    print(f"| {r['ranks']} | {r['threads']} | {s:.2f} | {up} | {r['tokens_per_s']:,.0f} | {r['comm_ms_per_step'] / 1e3:.2f} | {r['peak_rss_mb'] / 1024:.2f} |")
ar = [r for r in rows if r["kind"] == "allreduce"]
if ar:
    print("\nMPI all-reduce (MPICH, host memory, one machine), nccl-tests' conventions: algbw = bytes / time,")
    print("busbw = algbw x 2(n-1)/n.\n")
    print("| ranks | bytes | time (us) | algbw (GB/s) | busbw (GB/s) |")
    print("|---:|---:|---:|---:|---:|")
    for r in ar:
        print(f"| {r['ranks']} | {r['bytes']:,} | {r['time_us']:,.0f} | {r['algbw_gb_s']:.2f} | {r['busbw_gb_s']:.2f} |")
PY
cat "$OUT/rank-scaling.md"

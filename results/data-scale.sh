#!/usr/bin/env bash
# Does a run's start-up or memory grow with the corpus? Stage 0 on sharded corpora of 20M and
# 400M tokens (SIZES, in millions), the same run on each: the time to the end of a 2-step run
# and its peak resident memory, which must not grow from the smallest corpus to the largest
# (targets: under 2 s and under 100 MB more).
#
#   results/data-scale.sh            # writes results/data-scale.md and results/data-scale.json
#   SIZES="20 400 10000" WORK=/big/disk results/data-scale.sh
#
# The corpora are random GPT-2 token ids (below 50,257) in llm.c shards of 100M tokens (the
# last the rest) and one validation shard of 1M, written under WORK (default: a temporary
# directory, removed at the end) by numpy. The run: `stage0_serial train --data DIR --tokenizer
# gpt2 --model tiny --max-seq-len 1024 --batch 16 --seq-len 1024 --steps 2 --threads 2`, evaluated once on one
# batch. Its peak resident memory is /usr/bin/time's maximum RSS (Python's getrusage where
# that is missing): the shards are read with positioned reads, not mapped, so the page cache
# they pass through is not counted in it.
# Each size runs ROUNDS times (default 3) in turns with the others; the table gives medians.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/stage0_serial}
SIZES=${SIZES:-20 400}
ROUNDS=${ROUNDS:-3}
[ -x "$BIN" ] || cargo build --release -p stage0_serial
work=${WORK:-$(mktemp -d)}
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT

make_corpus() {  # DIR MILLIONS
  python3 - "$1" "$2" <<'EOF'
import os, sys
import numpy as np
out, millions = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1337)
def shard(name, n):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    with open(os.path.join(out, name), "wb") as f:
        f.write(header.tobytes())
        left = n
        while left:
            k = min(left, 10_000_000)
            f.write(rng.integers(0, 50257, size=k, dtype=np.uint16).tobytes())
            left -= k
shard("corpus_val_000000.bin", 1_000_000)
total, i = millions * 1_000_000, 1
while total > 0:
    n = min(total, 100_000_000)
    shard(f"corpus_train_{i:06d}.bin", n)
    total, i = total - n, i + 1
EOF
}

# timed FILE COMMAND...: the command's wall seconds and peak RSS (KiB) into FILE.
timed() {
  local out=$1; shift
  if [ -x /usr/bin/time ]; then /usr/bin/time -f "%e %M" -o "$out" "$@"; return; fi
  python3 - "$out" "$@" <<'PY'
import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(f"{time.perf_counter() - t:.2f} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\n")
sys.exit(rc)
PY
}

rows=()
for m in $SIZES; do
  [ -d "$work/c$m" ] || make_corpus "$work/c$m" "$m"
done
for r in $(seq "$ROUNDS"); do
  for m in $SIZES; do
    rm -rf "$work/out"
    timed "$work/time" "$BIN" train --data "$work/c$m" --tokenizer gpt2 --model tiny --max-seq-len 1024 \
      --batch 16 --seq-len 1024 --steps 2 --eval-every 2 --eval-batches 1 --sample-len 0 --threads 2 \
      --out "$work/out" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
    read -r secs kib <"$work/time"
    rows+=("$m $r $secs $kib")
    echo "== ${m}M tokens, round $r: ${secs} s, peak RSS $((kib / 1024)) MiB" >&2
  done
done

printf '%s\n' "${rows[@]}" >"$work/rows"
python3 - "$(results/describe-machine.sh)" "$ROUNDS" "$work/rows" <<'EOF'
import json, statistics, sys
machine, rounds = sys.argv[1], sys.argv[2]
runs = [line.split() for line in open(sys.argv[3]) if line.strip()]
by = {}
for m, r, s, k in runs:
    by.setdefault(int(m), []).append((float(s), int(k) / 1024))
sizes = sorted(by)
med = {m: (statistics.median(s for s, _ in v), statistics.median(k for _, k in v)) for m, v in by.items()}
lo, hi = sizes[0], sizes[-1]
dt, dm = med[hi][0] - med[lo][0], round(med[hi][1] - med[lo][1])
ok = dt < 2 and dm < 100
md = [
    "# Start-up and memory against the corpus size (sharded corpora)",
    "",
    "Written by `results/data-scale.sh`. " + machine + ".",
    "",
    "Stage 0 `train --data DIR --tokenizer gpt2 --model tiny --max-seq-len 1024 --batch 16 --seq-len 1024 --steps 2 "
    "--threads 2` (evaluated once on one batch) on random GPT-2 token ids in llm.c shards of 100M "
    f"tokens plus a 1M-token validation shard; {rounds} rounds in turns, medians. Wall time is the "
    "whole run (start-up, reading the shard headers, 2 steps, one evaluation, the checkpoint); peak "
    "RSS is the run's maximum resident set (the shards are read with positioned reads, not mapped).",
    "",
    "| corpus (tokens) | shards | wall time (s) | peak RSS (MiB) |",
    "| ---: | ---: | ---: | ---: |",
]
for m in sizes:
    md.append(f"| {m}M | {-(-m // 100) + 1} | {med[m][0]:.2f} | {med[m][1]:.0f} |")
md += [
    "",
    f"From {lo}M to {hi}M tokens: **{dt:+.2f} s** and **{dm:+d} MiB** "
    f"(targets: under 2 s and under 100 MB) — {'within' if ok else 'NOT within'} the targets.",
]
open("results/data-scale.md", "w").write("\n".join(md) + "\n")
json.dump({"machine": machine, "runs": [{"millions": int(m), "round": int(r), "seconds": float(s), "max_rss_kib": int(k)} for m, r, s, k in runs]},
          open("results/data-scale.json", "w"), indent=1)
print("\n".join(md))
EOF

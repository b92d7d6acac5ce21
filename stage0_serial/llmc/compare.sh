#!/usr/bin/env bash
# Stage 0 (CPU) against llm.c's train_gpt2.c: GPT-2 124M, batch 4, seq 64, fp32, same thread
# count, alternating A (llm.c) and B (stage 0) for ROUNDS rounds; writes results/llmc-cpu.md.
# See stage0_serial/llmc/README.md. Settings (environment):
#   ROUNDS=3          A,B pairs
#   LLMC_STEPS=6      training steps per llm.c run; the first LLMC_WARMUP are not counted
#   LLMC_WARMUP=1
#   STAGE0_STEPS=6    timed steps per stage 0 run (after STAGE0_WARMUP untimed ones)
#   STAGE0_WARMUP=1
#   THREADS=$(nproc)  OMP_NUM_THREADS for llm.c, --threads for stage 0
#   CC=gcc            compiler for llm.c
#   QUIET_WAIT=90     before each run, wait up to this many seconds for the machine to be
#                     idle (under 10% CPU busy over 3 s), then run anyway
#   WORK=<dir>        where inputs/build go (default: a fresh temp dir, removed at the end;
#                     a WORK you name is kept)
#   OUT=results/llmc-cpu.md
#   STAGE0_BIN=target/release/stage0_serial (built with cargo if missing)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENDOR="$HERE/vendor"

ROUNDS="${ROUNDS:-3}"
LLMC_STEPS="${LLMC_STEPS:-6}"
LLMC_WARMUP="${LLMC_WARMUP:-1}"
STAGE0_STEPS="${STAGE0_STEPS:-6}"
STAGE0_WARMUP="${STAGE0_WARMUP:-1}"
THREADS="${THREADS:-$(nproc)}"
CC="${CC:-gcc}"
QUIET_WAIT="${QUIET_WAIT:-90}"
OUT="${OUT:-$REPO/results/llmc-cpu.md}"
STAGE0_BIN="${STAGE0_BIN:-$REPO/target/release/stage0_serial}"
CORPUS="${CORPUS:-$REPO/data/tinyshakespeare.txt}"

if (( LLMC_STEPS <= LLMC_WARMUP )); then
    echo "compare.sh: LLMC_STEPS ($LLMC_STEPS) must exceed LLMC_WARMUP ($LLMC_WARMUP)" >&2
    exit 2
fi

if [[ -n "${WORK:-}" ]]; then
    mkdir -p "$WORK"
    WORK="$(cd "$WORK" && pwd)"
    KEEP_WORK=1
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/llmc-compare.XXXXXX")"
    KEEP_WORK=0
fi
case "$WORK/" in
    "$REPO/data/"*) echo "compare.sh: WORK must not be inside data/ ($WORK)" >&2; exit 2 ;;
esac
cleanup() { if [[ "$KEEP_WORK" == 0 ]]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT

log() { echo "== $*" >&2; }

# --- stage 0 binary ------------------------------------------------------------------------
if [[ ! -x "$STAGE0_BIN" ]]; then
    log "building stage0_serial (release)"
    (cd "$REPO" && cargo build --release -p stage0_serial)
fi

# --- llm.c build ---------------------------------------------------------------------------
# The vendored train_gpt2.c is not edited. Its main() hard-codes 41 steps (with validation
# every 10 and sampling every 20); a copy made here has that loop bound replaced by
# LLMC_STEPS, so a run is LLMC_STEPS training steps after one validation pass (step 0).
# Flags are llm.c's Makefile's (CFLAGS, -march=native, OpenMP), plus -fgnu89-inline: llmc/
# utils.h defines its helpers as plain C99 `inline`, which gcc does not emit out of line, so
# without it the link fails (undefined reference to `malloc_check`).
log "building llm.c train_gpt2 in $WORK/llmc"
mkdir -p "$WORK/llmc/src/llmc" "$WORK/llmc/dev/data/tinyshakespeare" "$WORK/logs"
cp "$VENDOR"/llmc/*.h "$WORK/llmc/src/llmc/"
LOOP_FROM='for (int step = 0; step <= 40; step++) {'
LOOP_TO='for (int step = 0; step < LLMC_STEPS; step++) {'
if [[ "$(grep -cF "$LOOP_FROM" "$VENDOR/train_gpt2.c")" != 1 ]]; then
    echo "compare.sh: the training loop line of train_gpt2.c was not found once" >&2
    exit 1
fi
sed "s/for (int step = 0; step <= 40; step++) {/$LOOP_TO/" "$VENDOR/train_gpt2.c" \
    > "$WORK/llmc/src/train_gpt2.c"
grep -qF "$LOOP_TO" "$WORK/llmc/src/train_gpt2.c"
LLMC_CFLAGS="-Ofast -Wno-unused-result -Wno-ignored-pragmas -Wno-unknown-attributes -march=native -fopenmp -DOMP -fgnu89-inline"
# shellcheck disable=SC2086
"$CC" $LLMC_CFLAGS -DLLMC_STEPS="$LLMC_STEPS" "$WORK/llmc/src/train_gpt2.c" -lm -lgomp \
    -o "$WORK/llmc/train_gpt2"

# --- inputs ----------------------------------------------------------------------------------
# Tokens: the corpus split 90/10 by characters (at the last newline before 90%), each part
# tokenized with stage 0's GPT-2 BPE into llm.c's .bin layout, at the paths train_gpt2.c opens.
log "tokenizing $CORPUS (90/10 split)"
python3 - "$CORPUS" "$WORK/train.txt" "$WORK/val.txt" <<'EOF'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
cut = text.rfind("\n", 0, int(len(text) * 0.9)) + 1
open(sys.argv[2], "w", encoding="utf-8").write(text[:cut])
open(sys.argv[3], "w", encoding="utf-8").write(text[cut:])
EOF
DATA="$WORK/llmc/dev/data/tinyshakespeare"
"$STAGE0_BIN" tokenize --input "$WORK/train.txt" --output "$DATA/tiny_shakespeare_train.bin" --tokenizer gpt2 >&2
"$STAGE0_BIN" tokenize --input "$WORK/val.txt" --output "$DATA/tiny_shakespeare_val.bin" --tokenizer gpt2 >&2
# Weights: random, in gpt2_124M.bin's layout (no tokenizer file: llm.c then skips decoding).
log "writing random GPT-2 124M weights"
python3 "$HERE/make_weights.py" "$WORK/llmc/gpt2_124M.bin" >&2

# --- rounds ----------------------------------------------------------------------------------
# Interference check: CPU time the whole machine spent busy during a run (/proc/stat), less
# the run's own user+sys time (/usr/bin/time), as a share of wall time x cores.
TIMEFMT=$'maxrss_kb %M\ncpu_s %U %S %e'
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
CLK_TCK="$(getconf CLK_TCK)"
NCPU="$(nproc)"
others_pct() {  # $1 = log with cpu_s line, $2 = busy ticks before, $3 = after
    awk -v b0="$2" -v b1="$3" -v hz="$CLK_TCK" -v n="$NCPU" '
        /^cpu_s/ { own = $2 + $3; wall = $4 }
        END { o = (b1 - b0) / hz - own; if (o < 0) o = 0; printf "%.1f", 100 * o / (wall * n) }' "$1"
}

run_llmc() {  # $1 = round; prints the per-step ms of the counted steps, space-separated
    local logf="$WORK/logs/llmc-$1.log"
    (cd "$WORK/llmc" && OMP_NUM_THREADS="$THREADS" /usr/bin/time -f "$TIMEFMT" ./train_gpt2) \
        > "$logf" 2>&1
    awk -v warm="$LLMC_WARMUP" '
        /^step [0-9]+: train loss .*\(took [0-9.]+ ms\)/ {
            n = $2; sub(":", "", n)
            t = $0; sub(/.*\(took /, "", t); sub(/ ms\).*/, "", t)
            if (n + 0 >= warm) printf "%s ", t
        }' "$logf"
}
run_stage0() {  # $1 = round; prints ms_per_step from the JSON line
    local logf="$WORK/logs/stage0-$1.log"
    /usr/bin/time -f "$TIMEFMT" "$STAGE0_BIN" bench --model gpt2 --batch 4 --seq-len 64 \
        --steps "$STAGE0_STEPS" --warmup "$STAGE0_WARMUP" --threads "$THREADS" > "$logf" 2>&1
    grep '^{' "$logf" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ms_per_step"])'
}
busy_pct_3s() {  # share of the machine's CPU busy over the next 3 s
    local b0 b1
    b0="$(busy_ticks)"; sleep 3; b1="$(busy_ticks)"
    awk -v d="$((b1 - b0))" -v hz="$CLK_TCK" -v n="$NCPU" 'BEGIN { printf "%.0f", 100 * d / (hz * 3 * n) }'
}
wait_quiet() {  # prints the seconds waited
    local waited=0 pct
    while :; do
        pct="$(busy_pct_3s)"
        waited=$((waited + 3))
        if (( pct < 10 || waited >= QUIET_WAIT )); then break; fi
        sleep 7; waited=$((waited + 7))
    done
    if (( pct >= 10 )); then log "  machine still ${pct}% busy after ${waited} s; running anyway"; fi
    echo "$waited"
}
rss_mib() { awk '/^maxrss_kb/ {printf "%.0f", $2 / 1024}' "$1"; }

RAW="$WORK/raw.tsv"
printf 'round\tsystem\tms_per_step\tsteps_ms\tpeak_rss_mib\tloadavg_before\tothers_cpu_pct\n' > "$RAW"
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
T0=$(date +%s)
for ((r = 1; r <= ROUNDS; r++)); do
    wait_quiet > /dev/null
    load="$(cut -d' ' -f1 /proc/loadavg)"
    log "round $r/$ROUNDS: A = llm.c ($LLMC_STEPS steps, first $LLMC_WARMUP not counted), load $load"
    b0="$(busy_ticks)"
    steps="$(run_llmc "$r")"
    b1="$(busy_ticks)"
    n=$(wc -w <<< "$steps")
    if (( n != LLMC_STEPS - LLMC_WARMUP )); then
        echo "compare.sh: llm.c round $r: expected $((LLMC_STEPS - LLMC_WARMUP)) step times, got $n; log:" >&2
        tail -20 "$WORK/logs/llmc-$r.log" >&2
        exit 1
    fi
    mean=$(awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s / NF}' <<< "$steps")
    printf '%d\tllmc\t%s\t%s\t%s\t%s\t%s\n' "$r" "$mean" "${steps% }" \
        "$(rss_mib "$WORK/logs/llmc-$r.log")" "$load" \
        "$(others_pct "$WORK/logs/llmc-$r.log" "$b0" "$b1")" >> "$RAW"
    log "  llm.c: $mean ms/step (steps: ${steps% })"

    wait_quiet > /dev/null
    load="$(cut -d' ' -f1 /proc/loadavg)"
    log "round $r/$ROUNDS: B = stage 0 bench ($STAGE0_STEPS steps after $STAGE0_WARMUP warm-up), load $load"
    b0="$(busy_ticks)"
    ms="$(run_stage0 "$r")"
    b1="$(busy_ticks)"
    if [[ -z "$ms" ]]; then
        echo "compare.sh: stage 0 round $r printed no ms_per_step; log:" >&2
        tail -20 "$WORK/logs/stage0-$r.log" >&2
        exit 1
    fi
    printf '%d\tstage0\t%s\t-\t%s\t%s\t%s\n' "$r" "$ms" "$(rss_mib "$WORK/logs/stage0-$r.log")" "$load" \
        "$(others_pct "$WORK/logs/stage0-$r.log" "$b0" "$b1")" >> "$RAW"
    log "  stage 0: $ms ms/step"
done
WALL=$(( $(date +%s) - T0 ))
LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- report ----------------------------------------------------------------------------------
CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
CORES="$(nproc)"
CC_VERSION="$("$CC" --version | head -1)"
RUSTC_VERSION="$(rustc --version 2>/dev/null || echo unknown)"
COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY=""
if [[ -n "$(git -C "$REPO" status --porcelain -- common stage0_serial Cargo.toml Cargo.lock .cargo 2>/dev/null)" ]]; then
    DIRTY=" (plus uncommitted changes under common/ or stage0_serial/ at run time)"
fi
# A stage 0 binary from a GPU bundle (.gpu/, built elsewhere) names its own commit.
if [[ "$STAGE0_BIN" != "$REPO/target/release/stage0_serial" && -f "$REPO/.gpu/commit" ]]; then
    COMMIT="$(cat "$REPO/.gpu/commit") (the bundle's binary)" DIRTY=""
fi
mkdir -p "$(dirname "$OUT")"
python3 - "$RAW" "$OUT" <<EOF
import statistics, sys
raw, out = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split("\t") for l in open(raw)][1:]
def per(system):
    return [float(r[2]) / 1e3 for r in rows if r[1] == system]
a, b = per("llmc"), per("stage0")
ma, mb = statistics.median(a), statistics.median(b)
steps_a = [float(x) / 1e3 for r in rows if r[1] == "llmc" for x in r[3].split()]
others = max(float(r[6]) for r in rows)
f = lambda x: f"{x:.3f}"
lines = []
w = lines.append
w("# Stage 0 vs llm.c on CPU: GPT-2 124M, batch 4, seq 64")
w("")
w("Written by \`stage0_serial/llmc/compare.sh\` (see \`stage0_serial/llmc/README.md\`). "
  "Seconds per training step (forward + backward + AdamW update), fp32, random-initialised "
  "weights; A (llm.c \`train_gpt2.c\`) and B (\`stage0_serial bench\`) alternate, $ROUNDS round(s). "
  "Per round: the mean over that run's counted steps; below, the median (min, max) over rounds.")
w("")
w("| | |")
w("| --- | --- |")
w("| device | $CPU, $CORES cores (\`nproc\`), $THREADS threads each |")
w("| llm.c build | $CC_VERSION: \`$LLMC_CFLAGS\` |")
w("| stage 0 build | $RUSTC_VERSION, \`cargo build --release\` (target-cpu x86-64-v3, from .cargo/config.toml) |")
w("| commit | $COMMIT$DIRTY |")
w("| date | $(date -u '+%Y-%m-%d %H:%M UTC') |")
w("| load average (1, 5, 15 min) | before: $LOAD_START; after: $LOAD_END |")
w(f"| other processes' CPU during runs | at most {others:.1f}% of the machine (per run below) |")
w("| steps per run | llm.c: $LLMC_STEPS, first $LLMC_WARMUP not counted; stage 0: $STAGE0_STEPS after $STAGE0_WARMUP warm-up |")
w("| wall time of the rounds (with waits for a quiet machine) | ${WALL} s |")
w("")
if others > 10:
    w(f"**Warning: other processes took up to {others:.0f}% of the machine's CPU during these runs; "
      "the times are not clean. Re-run on a quiet machine.**")
    w("")
w("| system | median s/step | min | max | peak RSS (MiB, median) |")
w("| --- | ---: | ---: | ---: | ---: |")
rss = lambda s: statistics.median(float(r[4]) for r in rows if r[1] == s)
w(f"| llm.c train_gpt2.c | {f(ma)} | {f(min(a))} | {f(max(a))} | {rss('llmc'):.0f} |")
w(f"| stage 0 | {f(mb)} | {f(min(b))} | {f(max(b))} | {rss('stage0'):.0f} |")
w("")
w(f"**Ratio llm.c / stage 0 (medians): {ma / mb:.2f}×** (above 1: stage 0 is faster). "
  f"Median of all {len(steps_a)} counted llm.c steps: {statistics.median(steps_a):.3f} s.")
w("")
w("Raw numbers per round (s/step; llm.c's counted steps listed). Load average: the 1-min value just "
  "before the run (it includes the previous run of this script). Other CPU: busy CPU time of the whole "
  "machine during the run (/proc/stat) less the run's own user+sys time, as a % of wall time x cores "
  "(near 0: nothing else ran).")
w("")
w("| round | system | s/step | llm.c steps (s) | peak RSS (MiB) | load average | other CPU % |")
w("| ---: | --- | ---: | --- | ---: | ---: | ---: |")
for r in rows:
    steps = " ".join(f(float(x) / 1e3) for x in r[3].split()) if r[3] != "-" else "-"
    name = "llm.c" if r[1] == "llmc" else "stage 0"
    w(f"| {r[0]} | {name} | {f(float(r[2]) / 1e3)} | {steps} | {r[4]} | {r[5]} | {r[6]} |")
w("")
w("Notes: llm.c reads its GPT-2 token files made from data/tinyshakespeare.txt (90/10 split, "
  "tokenized by \`stage0_serial tokenize --tokenizer gpt2\`); stage 0's bench uses random tokens "
  "(speed does not depend on them). llm.c's step 0 is dropped as warm-up (its first step "
  "allocates the gradients and AdamW state); its validation pass before step 0 is not timed. "
  "Peak RSS is the whole process (\`/usr/bin/time\`), including loading.")
open(out, "w").write("\n".join(lines) + "\n")
print(f"llm.c median {ma:.3f} s/step, stage 0 median {mb:.3f} s/step, ratio {ma / mb:.2f}")
if others > 10:
    print(f"warning: other processes took up to {others:.0f}% of the CPU during the runs", file=sys.stderr)
EOF
log "wrote $OUT"

#!/usr/bin/env bash
# Start-up of stage2_cuda with an empty kernel cache (every kernel compiled by NVRTC) and with a
# warm one (the compiled images read back from disk), for fp32 and bf16 (each compiles its own
# kernel set): `bench --generate` on GPT-2 124M, whose `startup_s` runs from before the backend is
# made until the model is ready (CUDA context, kernels, weights allocated and initialised). Each
# cold run gets a fresh empty GPT2_KERNEL_CACHE; the warm runs reuse the first cold run's. Also
# times the whole process (start to exit, a 16-token prompt and 16 new tokens included).
# Binaries from PATH (after `source .gpu/env.sh`) or target/release; writes $OUT/startup.jsonl
# and $OUT/startup.md. RUNS=3 runs of each kind by default.
set -u
[ -f .gpu/env.sh ] && source .gpu/env.sh >/dev/null 2>&1
export PATH="$PATH:target/release"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d); RUNS=${RUNS:-3}
BENCH="bench --generate --model gpt2 --seq-len 16 --new-tokens 16 --steps 1 --warmup 0"
: > "$OUT/startup.jsonl"

one() {  # one KIND PRECISION CACHE_DIR RUN
  local t0 t1 line
  t0=$EPOCHREALTIME
  line=$(GPT2_KERNEL_CACHE=$3 stage2_cuda $BENCH --precision "$2" 2>"$W/err" | tail -1)
  t1=$EPOCHREALTIME
  python3 - "$1" "$2" "$3" "$4" "$t0" "$t1" "$line" <<'EOF' | tee -a "$OUT/startup.jsonl"
import json, os, sys
kind, precision, cache, run, t0, t1, line = sys.argv[1:]
try:
    r = json.loads(line)
except ValueError:
    r = {"error": (line or open(os.path.join(os.path.dirname(cache), "err")).read()).strip()[-300:]}
files = [os.path.join(cache, f) for f in os.listdir(cache)] if os.path.isdir(cache) else []
print(json.dumps({"cache": kind, "precision": precision, "run": int(run),
                  "startup_s": r.get("startup_s"), "process_s": float(t1) - float(t0),
                  "cache_files": len(files), "cache_mb": sum(map(os.path.getsize, files)) / 2**20,
                  "device": r.get("device"), "error": r.get("error")}))
EOF
}

# One untimed run first: the driver, the binary and its libraries into memory.
GPT2_KERNEL_CACHE=off stage2_cuda $BENCH --precision fp32 >/dev/null 2>&1
for p in fp32 bf16; do
  for i in $(seq 1 "$RUNS"); do one cold $p "$W/cache-$p-$i" "$i"; done
  for i in $(seq 1 "$RUNS"); do one warm $p "$W/cache-$p-1" "$i"; done
done

python3 - "$OUT/startup.jsonl" > "$OUT/startup.md" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
dev = next((r["device"] for r in rows if r["device"]), "?")
print(f"## Start-up, kernel cache empty and warm ({dev})\n")
print("`stage2_cuda bench --generate --model gpt2 --seq-len 16 --new-tokens 16 --steps 1 --warmup 0`;"
      " start-up = backend (CUDA context, kernels) + model ready; process = start to exit."
      " Cold: a fresh empty GPT2_KERNEL_CACHE each run (NVRTC compiles every kernel); warm: the"
      " images the first cold run wrote. Median (min-max) of the runs.\n")
print("| precision | cache | runs | start-up s | process s | cache files (MB) |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for p in ("fp32", "bf16"):
    for kind in ("cold", "warm"):
        rs = [r for r in rows if r["precision"] == p and r["cache"] == kind]
        ok = [r for r in rs if r["startup_s"] is not None]
        if not ok:
            print(f"| {p} | {kind} | {len(rs)} | failed: {rs[0]['error'] if rs else 'no run'} | | |")
            continue
        fmt = lambda k: f"{statistics.median(r[k] for r in ok):.2f} ({min(r[k] for r in ok):.2f}-{max(r[k] for r in ok):.2f})"
        print(f"| {p} | {kind} | {len(ok)} | {fmt('startup_s')} | {fmt('process_s')} | "
              f"{ok[-1]['cache_files']} ({ok[-1]['cache_mb']:.1f}) |")
EOF
cat "$OUT/startup.md"

#!/usr/bin/env bash
# The run at the used-by scale (issue 14, item 3), in one device call: GPT-2 124M in bf16 on N
# GPUs (`mpirun -n N stage3_mpi_cuda`, B=16 a GPU, T=1024) for EPOCHS epochs (default 1) over
# data/docs-gpt2.bin (>= 10M GPT-2 tokens, `make docs-corpus`), evaluated ~10 times an epoch;
# then the first 200 steps of the same set-up in fp32, on N GPUs and on one GPU taking each
# global batch in N micro-batches (`stage2_cuda --grad-accum N`), compared evaluation by
# evaluation (bound 1e-3; PARITY_STEPS=0 leaves this part out). From the project root, after `bundle.sh -p stage2_cuda -p
# stage3_mpi_cuda --features ...` (carry .gpu and data/docs-gpt2.bin):
#   stage3_mpi_cuda/gpu/docs-run.sh [N]     # N: GPUs (default: all that nvidia-smi lists)
# Prints the loss-per-epoch tables and the comparison last; the runs (loss.tsv, log, env.txt;
# no checkpoints) go to $OUT/docs-run.tgz. Knobs: EPOCHS, PARITY_STEPS (200), DATA, PARITY_PART,
# STAGE3_FLAGS (more flags for both stage 3 runs, e.g. "--zero 0": ZeRO-1 is the default).
# PARITY_PART=1, then PARITY_PART=2: the one-GPU side takes N micro-batches a step (~0.4 s each
# in fp32 on an H200: ~10 minutes for 200 steps at N=8, more than one device command may run),
# so it can be cut over two calls on the same warm machine: part 1 runs everything but stops the
# one-GPU side halfway (--stop-after; its checkpoint stays in /tmp/docs-run), part 2 resumes it
# to the end (a resumed run is the same run) and compares.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
DATA=${DATA:-data/docs-gpt2.bin}
EPOCHS=${EPOCHS:-1}
PARITY_STEPS=${PARITY_STEPS:-200}
# Carried compressed (`gzip -k data/docs-gpt2.bin`: 9.8 MB, beside a full bundle's 45 MB)?
[ -f "$DATA" ] || [ ! -f "$DATA.gz" ] || gunzip -k "$DATA.gz"
[ -f "$DATA" ] || { echo "docs-run.sh: $DATA is missing: run \`make docs-corpus\` here and carry it" >&2; exit 2; }
found=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
n=${1:-$found}
if [ "$n" -lt 1 ] || [ "$n" -gt "$found" ]; then
  echo "docs-run.sh: asked for $n GPUs, nvidia-smi lists $found" >&2; exit 2
fi
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
commit=$(cat .gpu/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)
tokens=$(( ($(stat -c %s "$DATA") - 1024) / 2 ))
batch=$((16 * n))
# Steps an epoch: the training windows (90% of the tokens; the default --val-fraction) over the
# global batch; ~10 evaluations an epoch.
steps=$(( tokens * 9 / 10 / 1024 / batch ))
every=$(( steps / 10 > 0 ? steps / 10 : 1 ))
warmup=$(( steps * EPOCHS / 20 > 0 ? steps * EPOCHS / 20 : 1 ))
part=${PARITY_PART:-0}
case $part in 0|1|2) ;; *) echo "docs-run.sh: PARITY_PART must be 0, 1 or 2, not $part" >&2; exit 2 ;; esac
runs=/tmp/docs-run
stage3_flags=${STAGE3_FLAGS:-}
one_gpu="fp32-1gpu-accum$n"
if [ "$part" = 2 ]; then
  [ -f "$runs/$one_gpu/model.ckpt" ] || { echo "docs-run.sh: PARITY_PART=2 resumes part 1's $runs/$one_gpu/model.ckpt, which is not here (part 1 on this machine, still warm, with the same N?)" >&2; exit 2; }
else
  rm -rf "$runs"; mkdir -p "$runs"
fi
machine="commit $commit, $n x $device, $DATA ($tokens tokens, sha256 $(sha256sum "$DATA" | cut -c1-16))${stage3_flags:+, stage 3 with $stage3_flags}"
echo "$machine"
common="--data $DATA --model gpt2 --tokenizer gpt2 --seq-len 1024 --lr 6e-4 --seed 1337"
rc=0
train() {  # name, limit (s), command...
  local name=$1 limit=$2; shift 2
  mkdir -p "$runs/$name"; echo "$machine" >"$runs/$name/env.txt"
  echo "== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" --out "$runs/$name" >>"$runs/$name/log.txt" 2>&1 || { rc=1; echo "$name FAILED"; tail -5 "$runs/$name/log.txt"; }
  echo "   $((SECONDS - t0)) s"
}
parity_flags="--batch $batch --eval-every 20 --warmup 20 --sample-len 0 --precision fp32"
one_gpu_train=(stage2_cuda train $common $parity_flags --grad-accum "$n")  # the parity's one-GPU side
if [ "$part" != 2 ]; then
  train "bf16-${n}gpu" 540 mpirun -n "$n" stage3_mpi_cuda train $common $stage3_flags --batch $batch --epochs "$EPOCHS" \
    --eval-every $every --warmup $warmup --sample-len 64 --precision bf16
  if [ "$PARITY_STEPS" -gt 0 ]; then
    train "fp32-${n}gpu" 300 mpirun -n "$n" stage3_mpi_cuda train $common $stage3_flags $parity_flags --steps "$PARITY_STEPS"
    stop=(); [ "$part" = 1 ] && stop=(--stop-after $((PARITY_STEPS / 2)))
    train "$one_gpu" 400 "${one_gpu_train[@]}" --steps "$PARITY_STEPS" "${stop[@]}"
  fi
else
  train "$one_gpu" 540 "${one_gpu_train[@]}" --resume "$runs/$one_gpu/model.ckpt"
fi
[ "$part" = 1 ] || rm -f "$runs"/*/model.ckpt
tar -C "$runs" --exclude=model.ckpt -czf "$OUT/docs-run.tgz" .
echo
for r in "$runs"/*/; do echo "## $(basename "$r")"; cat "$r/loss.tsv" 2>/dev/null; grep -i 'tokens/s\|sample\|epoch' "$r/log.txt" | tail -3; echo; done
parity() {  # the fp32 runs' tables, evaluation by evaluation
  python3 - "$runs/fp32-${n}gpu/loss.tsv" "$runs/fp32-1gpu-accum$n/loss.tsv" "$n" <<'PY'
import sys
def rows(p):
    lines = [l.rstrip("\n").split("\t") for l in open(p)]
    return [dict(zip(lines[0], l)) for l in lines[1:]]
a, b, n = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
worst = 0.0
for x, y in zip(a, b):
    for col in ("train_loss", "val_loss"):
        worst = max(worst, abs(float(x[col]) - float(y[col])))
ok = len(a) == len(b) and len(a) > 0 and worst <= 1e-3
print(f"PARITY stage3 on {n} GPU(s) vs stage2_cuda --grad-accum {n}: {len(a)} evaluations, worst |difference| {worst:.2e} (bound 1e-3): {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
}
if [ "$part" = 1 ]; then
  echo "PARITY part 1 of 2: the one-GPU side stopped at step $((PARITY_STEPS / 2)); PARITY_PART=2 on this machine finishes it"
elif [ "$PARITY_STEPS" -gt 0 ]; then
  parity || rc=1
fi
exit $rc

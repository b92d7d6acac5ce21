#!/usr/bin/env bash
# Training at scale on the docs corpus: GPT-2 124M on N GPUs for whole epochs, and the same
# set-up's first steps on N GPUs equal to one GPU's.
#
#   gpu/corpus-run.sh [N] [--epochs E] [--parity-steps S] [--parity-part 1|2] [--data DIR|FILE]
#                     [--stage3-flags "FLAGS"]
#
# Needs data/docs-gpt2/ (`make docs-corpus`: over 10M GPT-2 tokens in llm.c shards, its
# *_val_* shard the validation set), or with --data a single .bin file (its last 10% held out;
# a FILE.gz beside it is unpacked first). N: GPUs (default: every GPU nvidia-smi lists).
# 1. bf16: `mpirun -n N stage3_mpi_cuda train`, B=16 a GPU (global batch 16N), T=1024, lr 6e-4
#    with a warm-up over 5% of the run, E epochs (default 1), evaluated about 10 times an epoch,
#    a 64-token sample at each evaluation.
# 2. Parity, fp32: the first S steps (default 200; 0 leaves this out) of the same set-up on N
#    GPUs with `--zero 0`, and on one GPU taking each global batch in N micro-batches
#    (`stage2_cuda --grad-accum N`), evaluated every 20 steps; passes when every evaluation's
#    train and validation losses agree within 1e-3. On 2 GPUs the two form the same sums, so
#    they should agree bit for bit (ZeRO-1 would sum the clipping norm per shard, in another
#    order: docs/training.md, gradient accumulation). The one-GPU side takes about 0.4 s a micro-batch on
#    an H200; where it would not fit one sitting, --parity-part 1 stops it halfway (a
#    checkpoint in the log folder, GPU_LOGS=DIR to choose it) and --parity-part 2, with the
#    same GPU_LOGS, N and corpus, resumes it to the end (a resumed run is the same run) and
#    compares.
# --stage3-flags: more flags for the epoch's stage 3 run (e.g. "--zero 0"; ZeRO-1 is the default).
#
# About 2.5 min for the epoch on 4 x H200 and 1-2 min for the parity; the one-GPU side grows
# with N (about 10 min at N=8).
# Writes results/docs-run.md (machine header, the corpus and its sha256; each run's loss per
# evaluation with tokens/s, and the share of its time spent waiting for the data loader; the
# parity's worst difference and PASS/FAIL) and results/docs-run.json, and the runs (loss.tsv, log.txt, env.txt; no checkpoints) in
# results/runs/corpus-run/. Exits 1 if a run fails or the parity does not hold.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
n='' epochs=1 parity_steps=200 part=0 data=data/docs-gpt2 stage3_flags=''
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) epochs=$2; shift ;;
    --parity-steps) parity_steps=$2; shift ;;
    --parity-part) part=$2; shift ;;
    --data) data=$2; shift ;;
    --stage3-flags) stage3_flags=$2; shift ;;
    -h|--help) gpu_help; exit 0 ;;
    [0-9]*) n=$1 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
case $part in 0|1|2) ;; *) gpu_die "--parity-part must be 1 or 2" ;; esac
[ "$part" != 0 ] && [ -z "${GPU_LOGS:-}" ] && gpu_die "--parity-part needs GPU_LOGS=DIR (the same for both parts)"
gpu_setup "${args[@]}"
[ -e "$data" ] || [ ! -f "$data.gz" ] || gunzip -k "$data.gz"
[ -e "$data" ] || gpu_die "$data is missing: \`make docs-corpus\` makes it"
found=$(gpu_count)
n=${n:-$found}
{ [ "$n" -ge 1 ] && [ "$n" -le "$found" ]; } || gpu_die "asked for $n GPUs, nvidia-smi lists $found"
s2=$(gpu_bin stage2_cuda) s3=$(gpu_bin stage3_mpi_cuda)
read -r -a s3flags <<<"$stage3_flags"
batch=$((16 * n))
if [ -d "$data" ]; then
  # Shards: the training shards' windows (none spans two shards) make an epoch.
  tokens=0 windows=0
  for f in "$data"/*.bin; do
    case $f in *_val_*) continue ;; esac
    t=$(( ($(stat -c %s "$f") - 1024) / 2 ))
    tokens=$((tokens + t)) windows=$((windows + (t - 1) / 1024))
  done
  sha=$(cat "$data"/*.bin | sha256sum | cut -c1-16)
else
  tokens=$(( ($(stat -c %s "$data") - 1024) / 2 ))
  windows=$(( tokens * 9 / 10 / 1024 ))             # 90% of the windows (the default validation split)
  sha=$(sha256sum "$data" | cut -c1-16)
fi
steps=$(( windows / batch ))                        # an epoch
every=$(( steps / 10 > 0 ? steps / 10 : 1 ))
warmup=$(( steps * epochs / 20 > 0 ? steps * epochs / 20 : 1 ))
runs=$GPU_LOGS/runs
one_gpu=fp32-1gpu-accum$n
common=(--data "$data" --model gpt2 --tokenizer gpt2 --seq-len 1024 --lr 6e-4 --seed 1337)
parity=(--batch "$batch" --eval-every 20 --warmup 20 --sample-len 0 --precision fp32)
echo "{\"kind\": \"corpus\", \"data\": \"$data\", \"tokens\": $tokens, \"sha256\": \"$sha\", \"gpus\": $n, \"epochs\": $epochs, \"stage3_flags\": \"$stage3_flags\"}" >>"$GPU_ROWS"
status=0
train() {  # name limit command...: one run into $runs/name
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  mkdir -p "$runs/$name"; gpu_machine_line >"$runs/$name/env.txt"
  gpu_say "$name: $*"
  timeout -k 30 "$limit" "$@" --out "$runs/$name" >>"$runs/$name/log.txt" 2>&1 \
    || { status=1; echo "   $name FAILED ($runs/$name/log.txt)" >&2; tail -5 "$runs/$name/log.txt" >&2; }
  gpu_say "$name: $((SECONDS - t0)) s"
}
if [ "$part" = 2 ]; then
  [ -f "$runs/$one_gpu/model.ckpt" ] || gpu_die "--parity-part 2 resumes $runs/$one_gpu/model.ckpt, which part 1 leaves: not there"
  train "$one_gpu" 3600 "$s2" train "${common[@]}" "${parity[@]}" --grad-accum "$n" --resume "$runs/$one_gpu/model.ckpt"
else
  rm -rf "$runs"; mkdir -p "$runs"
  train "bf16-${n}gpu" 3600 "${GPU_MPIRUN[@]}" -n "$n" "$s3" train "${common[@]}" "${s3flags[@]}" --batch "$batch" \
    --epochs "$epochs" --eval-every "$every" --warmup "$warmup" --sample-len 64 --precision bf16
  if [ "$parity_steps" -gt 0 ]; then
    train "fp32-${n}gpu" 1800 "${GPU_MPIRUN[@]}" -n "$n" "$s3" train "${common[@]}" "${parity[@]}" --zero 0 \
      --steps "$parity_steps"
    stop=(); [ "$part" = 1 ] && stop=(--stop-after $((parity_steps / 2)))
    train "$one_gpu" 3600 "$s2" train "${common[@]}" "${parity[@]}" --grad-accum "$n" --steps "$parity_steps" "${stop[@]}"
  fi
fi
if [ "$part" = 1 ]; then
  gpu_say "part 1 done: the one-GPU side stopped at step $((parity_steps / 2)); run --parity-part 2 with GPU_LOGS=$GPU_LOGS"
  exit $status
fi
for r in "$runs"/*/; do
  python3 "$GPU_PY/tables.py" lossrows "$r" >>"$GPU_ROWS" || true
done
if [ "$parity_steps" -gt 0 ]; then
  python3 "$GPU_PY/tables.py" parity "$runs/fp32-${n}gpu/loss.tsv" "$runs/$one_gpu/loss.tsv" "$n" >>"$GPU_ROWS" || status=1
fi
out=$RESULTS_DIR/runs/corpus-run
rm -rf "$out"; mkdir -p "$out"
for r in "$runs"/*/; do
  mkdir -p "$out/$(basename "$r")"
  find "$r" -maxdepth 1 -type f ! -name '*.ckpt' -exec cp {} "$out/$(basename "$r")/" \;
done
gpu_table docs-run
exit $status

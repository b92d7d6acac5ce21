#!/usr/bin/env bash
# Is our training PyTorch's training? The loss of every step in fp32, ours (flash attention,
# the default, and the GEMM attention path) against PyTorch's from the same weights on the
# same batches; and, with --converge, bf16 against fp32 over a longer run.
#
#   gpu/train-compare.sh [--steps N] [--lr LR] [--converge]
#
# Ours: `stage2_cuda train` GPT-2 124M in fp32 on data/tinyshakespeare.txt (GPT-2 tokenizer,
# B=8, T=1024, N steps, default 100, lr LR (default 6e-4), warmup 10, cosine to 0.1x, weight decay 0.1,
# clip 1.0, seed 1337), writing its initial weights (--save-init) and every step's batch,
# loss, learning rate and gradient norm (--dump-batches); once with GPT2_CUDA_ATTENTION=flash
# and once with =gemm (batched cuBLAS products + softmax): same seed, so the same initial
# weights and batches. PyTorch: gpu/py/pytorch_train_compare.py trains the exported initial
# weights (`export --format safetensors`) on the dumped batches, in order, with the same
# AdamW, schedule and clipping, in fp32 with TF32 off: transformers' GPT2LMHeadModel (against
# both of our runs) and the plain GPT-2 of gpu/py/pytorch_gpt2.py (against the flash run).
# Each comparison passes when every step's loss is within 1e-3 of PyTorch's.
# --converge: GPT-2 124M, B=16, T=1024, 500 steps evaluated every 50 (lr 6e-4, warmup 50,
# seed 1337) in fp32 and in bf16; bf16 passes where every evaluation's validation loss is
# within 2% of fp32's (the train column, a window's mean, is shown too: late in the run both
# memorise this 300K-token corpus and tiny train losses drift apart by more).
#
# About 4 min on an H100 (4 more with --converge).
# Writes results/train-vs-pytorch.md (machine header; a row per comparison: first and last
# loss ours / PyTorch, the largest |loss difference| and its step, gradient norms' largest
# relative difference, pass/FAIL; then every step: ours flash, ours GEMM, PyTorch) and
# results/train-vs-pytorch.json; with --converge a second section in both (every evaluation:
# train and validation loss in fp32 and bf16, their relative difference; the verdict), and the
# two runs (loss.tsv, env.txt) in results/runs/converge/. Exits 1 if a comparison fails.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
steps=100 lr=6e-4 converge=no
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift ;;
    --lr) lr=$2; shift ;;
    --converge) converge=yes ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
gpu_has_torch || gpu_die "PyTorch (with transformers and safetensors) is needed"
s2=$(gpu_bin stage2_cuda)
status=0
train=(train --data data/tinyshakespeare.txt --model gpt2 --tokenizer gpt2 --precision fp32 --batch 8 --seq-len 1024
       --steps "$steps" --lr "$lr" --warmup 10 --min-lr-frac 0.1 --weight-decay 0.1 --grad-clip 1.0 --seed 1337
       --eval-every "$steps" --eval-batches 4 --sample-len 0)
for attn in flash gemm; do
  w=$GPU_LOGS/$attn
  mkdir -p "$w"
  gpu_say "ours, fp32, GPT2_CUDA_ATTENTION=$attn: ${train[*]}"
  GPT2_CUDA_ATTENTION=$attn "$s2" "${train[@]}" --out "$w/run" --save-init --dump-batches "$w/batches.bin" \
    >"$GPU_LOGS/ours-$attn.log" 2>&1 || gpu_die "our $attn run failed ($GPU_LOGS/ours-$attn.log)"
  "$s2" export --checkpoint "$w/run/init.ckpt" --format safetensors --out "$w/hf-init" >>"$GPU_LOGS/ours-$attn.log" 2>&1 \
    || gpu_die "export failed ($GPU_LOGS/ours-$attn.log)"
  python3 "$GPU_PY/tables.py" dumprow "$w/batches.bin.json" "ours-$attn" "attention=$attn" >>"$GPU_ROWS"
done
compare() {  # attention model
  local w=$GPU_LOGS/$1
  gpu_run "torch-$2-vs-$1" 900 attention="$1" -- python3 "$GPU_PY/pytorch_train_compare.py" "$w/hf-init" \
    "$w/batches.bin" --model "$2" --device cuda --label "ours $1 attention vs PyTorch ($2)" || status=1
}
compare flash hf
compare flash plain
compare gemm hf

conv_cmd=''
if [ $converge = yes ]; then
  runs=$RESULTS_DIR/runs/converge
  rm -rf "$runs"; mkdir -p "$runs"
  conv=(train --data data/tinyshakespeare.txt --tokenizer gpt2 --model gpt2 --batch 16 --seq-len 1024 --steps 500
        --eval-every 50 --lr 6e-4 --warmup 50 --seed 1337 --sample-len 0)
  for p in fp32 bf16; do
    gpu_say "converge: ${conv[*]} --precision $p"
    mkdir -p "$runs/$p"; gpu_machine_line >"$runs/$p/env.txt"
    timeout -k 20 900 "$s2" "${conv[@]}" --precision $p --out "$runs/$p" >"$GPU_LOGS/converge-$p.log" 2>&1 \
      || { status=1; echo "   converge $p failed: $GPU_LOGS/converge-$p.log" >&2; }
    rm -f "$runs/$p/model.ckpt"
  done
  python3 "$GPU_PY/tables.py" convergerows "$runs/fp32/loss.tsv" "$runs/bf16/loss.tsv" >>"$GPU_ROWS" || status=1
  conv_cmd="stage2_cuda ${conv[*]} --precision fp32|bf16"
fi
gpu_table train-vs-pytorch --train "stage2_cuda ${train[*]} --save-init --dump-batches BATCHES" --train2 "$conv_cmd"
exit $status

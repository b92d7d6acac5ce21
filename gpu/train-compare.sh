#!/usr/bin/env bash
# Is our training PyTorch's training? The loss of every step in fp32, ours (flash attention,
# the default, and the GEMM attention path) against PyTorch's from the same weights on the
# same batches, at several learning rates; and, with --converge, bf16 against fp32 over a
# longer run.
#
#   gpu/train-compare.sh [--steps N] [--lr LR[,LR...]] [--converge]
#
# Ours: `stage2_cuda train` GPT-2 124M in fp32 on data/tinyshakespeare.txt (GPT-2 tokenizer,
# B=8, T=1024, N steps, default 100, warmup 10, cosine to 0.1x, weight decay 0.1, clip 1.0,
# seed 1337) at each learning rate LR (default 1.5e-4,3e-4,6e-4), writing its initial weights
# (--save-init) and every step's batch, loss, learning rate and gradient norm
# (--dump-batches); once with GPT2_CUDA_ATTENTION=flash and once with =gemm (batched cuBLAS
# products + softmax): same seed, so the same initial weights and batches (checked). PyTorch:
# gpu/py/pytorch_train_compare.py trains the exported initial weights (`export --format
# safetensors`) on the dumped batches, in order, with the same AdamW, schedule and clipping,
# in fp32 with TF32 off, in transformers' GPT2LMHeadModel, once per learning rate; both of our
# runs are compared with that one run. The figure: each path's largest |loss difference|
# from PyTorch over the steps. Pass: flash's at most 1.1x the GEMM path's at every learning
# rate (the GEMM path is strict fp32 cuBLAS: its distance is fp32 training's own spread).
# --converge: GPT-2 124M, B=16, T=1024, 500 steps evaluated every 50 (lr 6e-4, warmup 50,
# seed 1337) in fp32 and in bf16, on the second GPU where there is one (beside the
# comparisons); bf16 passes where every evaluation's validation loss is within 2% of fp32's
# (the train column, a window's mean, is shown too: late in the run both memorise this
# 300K-token corpus and tiny train losses drift apart by more).
#
# About 5 min on 2 x H200, --converge included (on the second GPU); 4 more for --converge on one GPU.
# Writes results/train-vs-pytorch.md (machine header; a row per learning rate: each path's
# largest |loss difference| from PyTorch and its step, their ratio, pass/FAIL; then every
# step's differences) and results/train-vs-pytorch.json; with --converge a second section in
# both (every evaluation: train and validation loss in fp32 and bf16, their relative
# difference; the verdict), and the two runs (loss.tsv, env.txt) in results/runs/converge/.
# Exits 1 if a comparison fails.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
steps=100 lrs=1.5e-4,3e-4,6e-4 converge=no
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift ;;
    --lr) lrs=$2; shift ;;
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

conv_cmd='' conv_pid=''
if [ $converge = yes ]; then
  runs=$RESULTS_DIR/runs/converge
  rm -rf "$runs"; mkdir -p "$runs"
  conv=(train --data data/tinyshakespeare.txt --tokenizer gpt2 --model gpt2 --batch 16 --seq-len 1024 --steps 500
        --eval-every 50 --lr 6e-4 --warmup 50 --seed 1337 --sample-len 0)
  conv_cmd="stage2_cuda ${conv[*]} --precision fp32|bf16"
  converge_runs() {
    local p rc=0
    for p in fp32 bf16; do
      gpu_say "converge: ${conv[*]} --precision $p"
      mkdir -p "$runs/$p"; gpu_machine_line >"$runs/$p/env.txt"
      timeout -k 20 900 "$s2" "${conv[@]}" --precision $p --out "$runs/$p" >"$GPU_LOGS/converge-$p.log" 2>&1 \
        || { rc=1; echo "   converge $p failed: $GPU_LOGS/converge-$p.log" >&2; }
      rm -f "$runs/$p/model.ckpt"
    done
    return $rc
  }
  if [ "$(gpu_count)" -ge 2 ]; then
    CUDA_VISIBLE_DEVICES=1 converge_runs & conv_pid=$!
  else
    converge_runs || status=1
  fi
fi

IFS=, read -ra lr_list <<<"$lrs"
for lr in "${lr_list[@]}"; do
  train=(train --data data/tinyshakespeare.txt --model gpt2 --tokenizer gpt2 --precision fp32 --batch 8 --seq-len 1024
         --steps "$steps" --lr "$lr" --warmup 10 --min-lr-frac 0.1 --weight-decay 0.1 --grad-clip 1.0 --seed 1337
         --eval-every "$steps" --eval-batches 4 --sample-len 0)
  for attn in flash gemm; do
    w=$GPU_LOGS/lr$lr/$attn
    mkdir -p "$w"
    gpu_say "ours, fp32, lr $lr, GPT2_CUDA_ATTENTION=$attn"
    GPT2_CUDA_ATTENTION=$attn CUDA_VISIBLE_DEVICES=0 "$s2" "${train[@]}" --out "$w/run" --save-init \
      --dump-batches "$w/batches.bin" >"$GPU_LOGS/ours-$attn-lr$lr.log" 2>&1 \
      || gpu_die "our $attn run failed ($GPU_LOGS/ours-$attn-lr$lr.log)"
    "$s2" export --checkpoint "$w/run/init.ckpt" --format safetensors --out "$w/hf-init" \
      >>"$GPU_LOGS/ours-$attn-lr$lr.log" 2>&1 || gpu_die "export failed ($GPU_LOGS/ours-$attn-lr$lr.log)"
    python3 "$GPU_PY/tables.py" dumprow "$w/batches.bin.json" "ours-$attn-lr$lr" "attention=$attn" "lr=$lr" >>"$GPU_ROWS"
  done
  w=$GPU_LOGS/lr$lr
  cmp -s "$w/flash/hf-init/model.safetensors" "$w/gemm/hf-init/model.safetensors" \
    && cmp -s "$w/flash/batches.bin" "$w/gemm/batches.bin" \
    || gpu_die "lr $lr: the flash and gemm runs started from different weights or trained on different batches"
  # One PyTorch run a learning rate, against both of ours (tables.py judges; --tol inf).
  CUDA_VISIBLE_DEVICES=0 gpu_run "torch-hf-lr$lr" 900 lr="$lr" -- python3 "$GPU_PY/pytorch_train_compare.py" \
    "$w/flash/hf-init" "$w/flash/batches.bin" --model hf --device cuda --tol inf --label "PyTorch (hf), lr $lr" \
    || status=1
done

if [ -n "$conv_pid" ]; then
  wait "$conv_pid" || status=1
fi
if [ $converge = yes ]; then
  python3 "$GPU_PY/tables.py" convergerows "$runs/fp32/loss.tsv" "$runs/bf16/loss.tsv" >>"$GPU_ROWS" || status=1
fi
shown="stage2_cuda ${train[*]} --save-init --dump-batches BATCHES"
gpu_table train-vs-pytorch --train "${shown/--lr $lr /--lr LR }" --train2 "$conv_cmd" || status=1
grep -q FAIL "$RESULTS_DIR/train-vs-pytorch.md" && status=1
exit $status

#!/usr/bin/env bash
# Generation speed against Hugging Face's `generate`, and our exported weights checked in
# transformers (logits).
#
#   gpu/generate.sh [--no-check]
#
# Speed: GPT-2 124M, greedy, a 16-token prompt, 256 new tokens, fp32 and bf16. Ours:
# `stage2_cuda bench --generate` (batch 1, random weights: decoding time does not depend on
# them; medians of 5 runs after one), with the decode steps replayed as a CUDA graph (the
# default) and op by op (GPT2_CUDA_GRAPH=0). Hugging Face: gpu/py/hf_generate.py,
# GPT2LMHeadModel.from_pretrained on our export (`export --format safetensors`) of a GPT-2
# 124M checkpoint (one training step of stage 2 on data/tinyshakespeare.txt), KV cache on,
# batch 1 and 16, timed the same way.
# Check (--no-check leaves it out): two tiny models trained by stage0_serial (byte and GPT-2
# tokenizers) and exported; gpu/py/hf_check.py loads each in transformers (no missing or
# unexpected keys, tied head, the tokenizer gives our ids) and compares its logits for a prompt
# with ours from stage0_serial (CPU) and stage2_cuda (fp32), on the CPU and on the GPU: every
# logit within 1e-4.
#
# About 2 min on an H100.
# Writes results/generate.md (machine header; decode tokens/s and ms per token, prefill ms,
# start-up (ours) or load (Hugging Face) seconds, and the speed over Hugging Face's at batch
# 1; the check's rows: largest |logit difference| and pass/FAIL) and results/generate.json.
# Hugging Face batch 16 is tokens/s per sequence (x16 for the batch). Exits 1 if a check fails.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
check=yes
while [ $# -gt 0 ]; do
  case $1 in
    --no-check) check=no ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
s2=$(gpu_bin stage2_cuda)
torch=yes; gpu_has_torch || { torch=no; gpu_say "PyTorch is not installed: ours only, no check"; check=no; }
status=0
for p in fp32 bf16; do
  for graph in 1 0; do
    GPT2_CUDA_GRAPH=$graph gpu_run "ours-$p-graph$graph" 300 impl=ours precision=$p graph=$graph batch=1 -- \
      "$s2" bench --generate --model gpt2 --seq-len 16 --new-tokens 256 --steps 5 --warmup 1 --precision $p || status=1
  done
done
if [ $torch = yes ]; then
  w=$GPU_LOGS/export
  gpu_say "a GPT-2 124M checkpoint to export"
  "$s2" train --data data/tinyshakespeare.txt --tokenizer gpt2 --model gpt2 --steps 1 --batch 1 --seq-len 64 \
    --sample-len 0 --out "$w/run" >"$GPU_LOGS/export-train.log" 2>&1 || gpu_die "train for the export failed ($GPU_LOGS/export-train.log)"
  "$s2" export --checkpoint "$w/run/model.ckpt" --format safetensors --out "$w/hf" >>"$GPU_LOGS/export-train.log" 2>&1 \
    || gpu_die "export failed ($GPU_LOGS/export-train.log)"
  for p in fp32 bf16; do
    for b in 1 16; do
      gpu_run "hf-$p-b$b" 400 -- python3 "$GPU_PY/hf_generate.py" "$w/hf" --precision $p --batch $b || status=1
    done
  done
fi
if [ $check = yes ]; then
  s0=$(gpu_bin stage0_serial)
  prompt="ROMEO: But soft, what light through yonder window breaks?"
  for tok in byte gpt2; do
    w=$GPU_LOGS/check-$tok
    "$s0" train --data data/tinyshakespeare.txt --out "$w/run" --model tiny --tokenizer $tok --batch 8 --seq-len 64 \
      --steps 30 --sample-len 0 >"$GPU_LOGS/check-$tok.log" 2>&1 || gpu_die "stage0_serial train ($tok) failed"
    "$s0" export --checkpoint "$w/run/model.ckpt" --format safetensors --out "$w/hf" >>"$GPU_LOGS/check-$tok.log" 2>&1 \
      || gpu_die "export ($tok) failed"
    for stage in stage0_serial stage2_cuda; do
      flags=(); [ $stage = stage2_cuda ] && flags=(--precision fp32)
      "$(gpu_bin $stage)" generate --checkpoint "$w/run/model.ckpt" --prompt "$prompt" "${flags[@]}" \
        --dump-logits "$w/logits-$stage.json" >>"$GPU_LOGS/check-$tok.log" 2>&1 \
        || { status=1; echo "   $stage generate --dump-logits failed ($tok)" >&2; continue; }
      for dev in cpu cuda; do
        gpu_run "check-$tok-$stage-$dev" 300 kind=check tokenizer=$tok stage=$stage -- \
          python3 "$GPU_PY/hf_check.py" "$w/hf" "$w/logits-$stage.json" --device $dev || status=1
      done
    done
  done
fi
gpu_table generate
exit $status

#!/usr/bin/env bash
# Our GPT-2 weights in Hugging Face's format, checked with transformers on the GPU machine:
# trains two tiny models on the bundled corpus with stage0_serial (byte tokenizer, and GPT-2 BPE),
# exports each, dumps our logits for a prompt from stage0_serial (CPU) and stage2_cuda (fp32), and
# runs hf_check.py on each pair (GPT2LMHeadModel.from_pretrained + AutoTokenizer, logits within
# 1e-4). Binaries from PATH (or target/release); outputs in $OUT. Exits 1 if any check fails.
set -u
export PATH="$PATH:target/release"
OUT=${OUT:-/tmp/out}; W=$(mktemp -d); mkdir -p "$OUT"
HERE=$(dirname "$0")
PROMPT="ROMEO: But soft, what light through yonder window breaks?"
status=0
for tok in byte gpt2; do
  stage0_serial train --data data/tinyshakespeare.txt --out "$W/$tok" --model tiny --tokenizer $tok \
    --batch 8 --seq-len 64 --steps 30 --sample-len 0 >/dev/null || { echo "train $tok failed"; exit 1; }
  stage0_serial export --checkpoint "$W/$tok/model.ckpt" --format safetensors --out "$W/hf-$tok" || exit 1
  for stage in stage0_serial stage2_cuda; do
    flags=""; [ $stage = stage2_cuda ] && flags="--precision fp32"
    $stage generate --checkpoint "$W/$tok/model.ckpt" --prompt "$PROMPT" $flags \
      --dump-logits "$W/logits-$tok-$stage.json" >/dev/null || { echo "$stage dump failed"; status=1; continue; }
    for dev in cpu cuda; do
      python3 "$HERE/hf_check.py" "$W/hf-$tok" "$W/logits-$tok-$stage.json" --device $dev \
        | tee -a "$OUT/hf-check.jsonl" || status=1
    done
  done
done
exit $status

#!/usr/bin/env bash
# Is our training PyTorch's training? GPT-2 124M trained 100 steps in fp32 by stage2_cuda on the
# bundled corpus (GPT-2 BPE), which writes the weights before its first step (--save-init) and
# every step's batch and loss (--dump-batches); the initial weights exported to Hugging Face's
# format; then pytorch_train_compare.py trains them in PyTorch (fp32, TF32 off) on the same
# batches in the same order with the same AdamW, schedule and clipping, twice (transformers'
# GPT2LMHeadModel, and the plain GPT-2 of pytorch_gpt2.py), and compares every step's loss:
# within 1e-3, or this exits 1. Then the start-up figures (startup.sh: kernel cache empty and
# warm). One device call, under 5 minutes on an H100; run from the project root. Binaries from
# PATH (after `source .gpu/env.sh`) or target/release. Writes $OUT/train-compare.md (summary,
# then each model's step table), train-compare.jsonl, our run's log and dump description, and
# startup.md / startup.jsonl.
set -u
[ -f .gpu/env.sh ] && source .gpu/env.sh >/dev/null 2>&1
export PATH="$PATH:target/release" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d); HERE=$(dirname "$0")
STEPS=${STEPS:-100}; BATCH=${BATCH:-8}; SEQ=${SEQ:-1024}; LR=${LR:-6e-4}
# For a dry run elsewhere: STAGE=stage0_serial MODEL=tiny DEVICE=cpu STEPS=20 BATCH=4 SEQ=64 STARTUP=0
STAGE=${STAGE:-stage2_cuda}; MODEL=${MODEL:-gpt2}; DEVICE=${DEVICE:-cuda}; STARTUP=${STARTUP:-1}
PRECISION="--precision fp32"; [ "$STAGE" = stage0_serial ] && PRECISION=""
status=0
commit=$(cat .gpu/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo "?")
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

TRAIN="train --data data/tinyshakespeare.txt --model $MODEL --tokenizer gpt2 $PRECISION \
--batch $BATCH --seq-len $SEQ --steps $STEPS --lr $LR --warmup 10 --min-lr-frac 0.1 --weight-decay 0.1 \
--grad-clip 1.0 --seed 1337 --eval-every $STEPS --eval-batches 4 --sample-len 0"
echo "$STAGE $TRAIN --save-init --dump-batches BATCHES" | tee "$OUT/train-ours.log"
t0=$EPOCHREALTIME
if ! $STAGE $TRAIN --out "$W/run" --save-init --dump-batches "$W/batches.bin" >>"$OUT/train-ours.log" 2>&1; then
  echo "our run failed:"; tail -5 "$OUT/train-ours.log"; exit 1
fi
echo "ours: $(python3 -c "print(f'{$EPOCHREALTIME - $t0:.1f}')") s" | tee -a "$OUT/train-ours.log"
cp "$W/batches.bin.json" "$OUT/batches.json"
$STAGE export --checkpoint "$W/run/init.ckpt" --format safetensors --out "$W/hf-init" || exit 1

: > "$OUT/train-compare.jsonl"
for model in hf plain; do
  python3 "$HERE/pytorch_train_compare.py" "$W/hf-init" "$W/batches.bin" --model $model --device "$DEVICE" \
    --label "$MODEL, fp32, $model" --md "$W/compare-$model.md" --jsonl "$OUT/train-compare.jsonl" \
    > "$OUT/train-compare-$model.log" 2>&1 || status=1
  tail -1 "$OUT/train-compare-$model.log"
done

python3 - "$OUT/train-compare.jsonl" "$commit" "$gpu" "$STAGE $TRAIN" "$OUT" > "$OUT/train-compare.md" <<'EOF'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
commit, gpu, train, out = sys.argv[2:6]
print(f"# Our training against PyTorch's (build {commit}, {gpu or 'no GPU'})\n")
print(f"Ours: `{' '.join(train.split())} --save-init --dump-batches BATCHES`; the weights "
      "before step 0 exported (`export --format safetensors`) and trained in PyTorch on the dumped "
      "batches, in fp32 with TF32 off (stage2_cuda/gpu/pytorch_train_compare.py).\n")
print("| PyTorch model | steps | loss step 0 (ours / PyTorch) | last loss (ours / PyTorch) | max \\|loss diff\\| | at step | grad norms (max rel diff) | PyTorch s | result |")
print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |")
for r in rows:
    a, b = r["loss_first"] or [float("nan")] * 2, r["loss_last"] or [float("nan")] * 2
    print(f"| {r['model']} ({r['torch']}) | {r['steps']} | {a[0]:.6f} / {a[1]:.6f} | "
          f"{b[0]:.6f} / {b[1]:.6f} | {r['max_abs_loss_diff']:.2e} | {r['worst_step']} | "
          f"{r['max_rel_norm_diff']:.1e} | {r['torch_s']:.0f} | {'pass' if r['ok'] else 'FAIL: ' + '; '.join(r['failures'])} |")
for model in ("hf", "plain"):
    if not any(r["model"] == model for r in rows):
        log = open(os.path.join(out, f"train-compare-{model}.log")).read().strip().splitlines()[-3:]
        print(f"| {model} | failed: {' / '.join(log)} | | | | | | | FAIL |")
print()
EOF
for model in hf plain; do [ -f "$W/compare-$model.md" ] && cat "$W/compare-$model.md" >> "$OUT/train-compare.md" && echo >> "$OUT/train-compare.md"; done
head -8 "$OUT/train-compare.md"

[ "$STARTUP" = 1 ] && { bash "$HERE/startup.sh" || status=1; }
exit $status

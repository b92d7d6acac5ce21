#!/usr/bin/env bash
# Checkpoints on one GPU, in one device call (from the project root, after ../shared/gpu/bundle.sh):
# the GPU tests of the checkpoint path (the snapshot's ordering, a checkpoint copied within the
# GPU equal to the synchronous one, stop/resume, train then generate), then GPT-2 124M in bf16
# (B=16, T=1024) saving while it trains: the stall and write lines of every save, and the run's
# training time, for the snapshot (default), the snapshot read into pageable memory
# (GPT2_CKPT_PINNED=0), the old synchronous copy (GPT2_CKPT_SNAPSHOT=0), and no save but the
# last (the baseline for the training time). 41 steps saving every 20 is the command of the
# earlier measurements (a save then also waits for the write before: 20 steps are shorter than
# a write); 121 steps saving every 60 leaves each write time to finish. Outputs in $OUT.
source stage2_cuda/gpu/cuda-env.sh >/dev/null 2>&1
export REQUIRE_NVRTC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "build $(cat .gpu/commit 2>/dev/null); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" | tee "$OUT/ckpt.txt"
tests="a_snapshot_holds_what_was_queued_before_it_and_nothing_after
a_checkpoint_copied_within_the_gpu_is_the_one_copied_while_training_waits
a_stopped_and_resumed_gpu_run_is_the_same_run
train_then_generate_on_the_gpu"
for t in /tmp/gpu-rt/tests/*; do
  listed=$("$t" --list --ignored 2>/dev/null)
  for name in $tests; do
    grep -qx "$name: test" <<< "$listed" || continue
    res=$(timeout 300 "$t" "$name" --exact --ignored --nocapture 2>&1 | tee -a "$OUT/tests.log" | grep -E "^test result" | tail -1)
    echo "TEST $name: ${res:-NO RESULT (see tests.log)}" | tee -a "$OUT/ckpt.txt"
  done
done
grep -E "^SNAPSHOT" "$OUT/tests.log" | cut -c1-300 | tee -a "$OUT/ckpt.txt"
gpt2="train --data data/tinyshakespeare.txt --tokenizer gpt2 --model gpt2 --batch 16 --seq-len 1024 --eval-every 1000 --sample-len 0 --precision bf16"
for case in "snapshot 41 20" "snapshot 121 60" "pageable 121 60 GPT2_CKPT_PINNED=0" \
            "synchronous 41 20 GPT2_CKPT_SNAPSHOT=0" "synchronous 121 60 GPT2_CKPT_SNAPSHOT=0" "last-only 121 0"; do
  set -- $case
  label="$1 steps=$2 every=$3"; log="$OUT/$1-$2-$3.log"
  rm -rf /tmp/ck
  env $4 timeout 240 stage2_cuda $gpt2 --steps "$2" --checkpoint-every "$3" --out /tmp/ck > "$log" 2>&1
  echo "== $label${4:+ ($4)}: exit $?" | tee -a "$OUT/ckpt.txt"
  grep -E "^checkpoint|^note|error" "$log" | cut -c1-300 | tee -a "$OUT/ckpt.txt"
  python3 -c "import json; s = json.load(open('/tmp/ck/summary.json')); print(f\"train_time_s {s['train_time_s']:.2f}, train tokens/s {s['train_tokens_per_s']:,.0f}\")" 2>&1 | tee -a "$OUT/ckpt.txt"
done

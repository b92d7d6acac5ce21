#!/usr/bin/env bash
# Generation speed, ours against Hugging Face `generate` in the same device call (issue 12's
# target): GPT-2 124M, greedy, a 16-token prompt, 256 new tokens, batch 1, fp32 and bf16.
# Ours: `stage2_cuda bench --generate` (random weights: decode time does not depend on them),
# with decode steps replayed as a CUDA graph (the default) and op by op (GPT2_CUDA_GRAPH=0).
# Hugging Face: hf_generate.py on our export of a GPT-2 124M checkpoint (one training step of
# stage 2 on the bundled corpus), batch 1 and 16. Run from the project root after
# `../shared/gpu/bundle.sh`; writes $OUT/generate.jsonl and $OUT/generate.md.
set -u
source .gpu/env.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; W=$(mktemp -d); mkdir -p "$OUT"
HERE=$(dirname "$0")
J="$OUT/generate.jsonl"; : > "$J"
args="bench --generate --model gpt2 --seq-len 16 --new-tokens 256 --steps 5 --warmup 1"
for p in fp32 bf16; do
  for graph in 1 0; do
    GPT2_CUDA_GRAPH=$graph stage2_cuda $args --precision $p 2>/dev/null | tail -1 \
      | python3 -c "import json,sys; r=json.load(sys.stdin); r.update(impl='ours', precision='$p', graph=$graph, batch=1); print(json.dumps(r))" >> "$J"
  done
done
stage2_cuda train --data data/tinyshakespeare.txt --tokenizer gpt2 --model gpt2 --steps 1 --batch 1 \
  --seq-len 64 --sample-len 0 --out "$W/run" >/dev/null 2>&1 || echo "train for the export failed"
stage2_cuda export --checkpoint "$W/run/model.ckpt" --format safetensors --out "$W/hf" >/dev/null || echo "export failed"
for p in fp32 bf16; do
  for b in 1 16; do
    timeout 300 python3 "$HERE/hf_generate.py" "$W/hf" --precision $p --batch $b 2>/dev/null | tail -1 >> "$J"
  done
done
python3 - "$J" > "$OUT/generate.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
def get(impl, p, **kw):
    for r in rows:
        if r.get("impl") == impl and r.get("precision") == p and all(r.get(k) == v for k, v in kw.items()):
            return r
dev = next((r["device"] for r in rows if "device" in r), "?")
print(f"# Generation: GPT-2 124M, greedy, 16-token prompt, 256 new tokens ({dev})\n")
print("| run | decode tokens/s | ms/token | prefill ms | start-up / load s | vs HF batch 1 |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for p in ("fp32", "bf16"):
    hf = get("huggingface", p, batch=1)
    for name, r in ((f"ours {p}, CUDA graph", get("ours", p, graph=1)), (f"ours {p}, op by op", get("ours", p, graph=0)),
                    (f"Hugging Face {p}, batch 1", hf), (f"Hugging Face {p}, batch 16", get("huggingface", p, batch=16))):
        if not r:
            print(f"| {name} | (missing) | | | | |"); continue
        ratio = f"{r['decode_tokens_per_s'] / hf['decode_tokens_per_s']:.2f}x" if hf else ""
        start = r.get("startup_s", r.get("load_s", 0))
        print(f"| {name} | {r['decode_tokens_per_s']:,.0f} | {r['decode_ms_per_token']:.3f} | {r['prefill_ms']:.2f} | {start:.2f} | {ratio} |")
print("\nHugging Face batch 16: tokens/s per sequence (x16 for the batch's total).")
PY
cat "$OUT/generate.md"

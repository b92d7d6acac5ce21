#!/usr/bin/env python3
"""The weak-scaling table (markdown) from scaling.sh's JSON lines: one bench line per run,
with its label and GPU count added.

    python3 stage3_mpi_cuda/gpu/scaling_table.py scaling.jsonl N "DEVICE" > scaling.md
"""
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n, device = int(sys.argv[2]), sys.argv[3]
by = {r["label"]: r for r in rows}
one, ddp = by.get("ours-1gpu"), by.get("ddp-compile")
print(f"# GPT-2 124M, bf16, B=16 per GPU, T=1024, {n} x {device}\n")
print("Weak-scaling efficiency: tokens/s per GPU over stage 2's on one GPU (this call's run).")
print("vs DDP: tokens/s over DDP + torch.compile's on the same GPUs. Sums alone: one step's")
print("gradient sums (the all-reduce; under ZeRO-1 the reduce-scatter and all-gather) timed on")
print("their own after the run. Hidden: the share of them a run does not add to the one-GPU")
print("step, 1 - (ms/step - one GPU's) / sums alone. All runs but the eager one (GPT2_CUDA_GRAPH=0,")
print("op by op) replay each step as one CUDA graph with NCCL's sums inside. Peak: device")
print("memory per GPU.\n")
print("| run | GPUs | tokens/s | tokens/s per GPU | weak-scaling eff. | vs DDP | ms/step | sums alone ms | hidden | peak MiB per GPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    g, tps = r["gpus"], r["tokens_per_s"]
    eff = f"{tps / g / one['tokens_per_s']:.1%}" if one else ""
    vs = f"{tps / ddp['tokens_per_s']:.2f}x" if ddp and g == ddp["gpus"] and r is not ddp else ""
    alone = r.get("sums_alone_ms", 0.0)
    comm = f"{alone:.2f}" if alone > 0 else ""
    hidden = f"{1 - (r['ms_per_step'] - one['ms_per_step']) / alone:.0%}" if one and alone > 0 else ""
    print(f"| {r['label']} | {g} | {tps:,.0f} | {tps / g:,.0f} | {eff} | {vs} | {r['ms_per_step']:.1f} | {comm} | {hidden} | {r['peak_device_mb']:,.0f} |")
missing = [l for l in ["ours-1gpu", "ours-zero0-eager", "ours-zero0", "ours-zero0-overlap", "ours-zero1", "ours-zero1-overlap",
                       "ddp-compile", "torch-compile-1gpu"] if l not in by]
if missing:
    print(f"\nFailed or missing: {', '.join(missing)} (see scaling.log)")

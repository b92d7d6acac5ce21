#!/usr/bin/env python3
"""The weak-scaling table (markdown) from scaling.sh's JSON lines: one bench line per run,
with its label and GPU count added.

    python3 stage3_mpi_cuda/gpu/scaling_table.py scaling.jsonl N "DEVICE" [scaling.log] > scaling.md

With scaling.log (its "== label: command" lines), the runs that were started but left no bench
line are named at the end.
"""
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n, device = int(sys.argv[2]), sys.argv[3]
by = {r["label"]: r for r in rows}
ddp = by.get("ddp-compile")
# Stage 2 on one GPU: the mean of its runs in this call (at the start, and again at the end).
stage2 = [by[l] for l in ("ours-1gpu", "ours-1gpu-end") if l in by]
one = None
if stage2:
    one = {k: sum(r[k] for r in stage2) / len(stage2) for k in ("tokens_per_s", "ms_per_step")}
print(f"# GPT-2 124M, bf16, B=16 per GPU, T=1024, {n} x {device}\n")
print(f"Weak-scaling efficiency: tokens/s per GPU over stage 2's on one GPU (the mean of this call's {len(stage2)} run(s));")
print("DDP's over torch.compile's on one GPU.")
print("vs DDP: tokens/s over DDP + torch.compile's on the same GPUs. Sums alone: one step's")
print("gradient sums (the all-reduce; under ZeRO-1 the reduce-scatter and all-gather) timed on")
print("their own after the run. Hidden: the share of them a run does not add to the one-GPU")
print("step, 1 - (ms/step - one GPU's) / sums alone. All runs but the eager one (GPT2_CUDA_GRAPH=0,")
print("op by op) replay each step as one CUDA graph with NCCL's sums inside. Peak: device")
print("memory per GPU. Gather: how ZeRO-1's all-gathers ran (bench's `gather`, from session 26;")
print("blank where the run had none or its bench did not say).\n")
print("| run | GPUs | tokens/s | tokens/s per GPU | weak-scaling eff. | vs DDP | ms/step | sums alone ms | hidden | peak MiB per GPU | gather |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    g, tps = r["gpus"], r["tokens_per_s"]
    # DDP's against torch.compile on one GPU (PyTorch's own one-GPU run), ours against stage 2.
    base = by.get("torch-compile-1gpu") if r is ddp else one
    eff = f"{tps / g / base['tokens_per_s']:.1%}" if base and r["label"] != "torch-compile-1gpu" else ""
    vs = f"{tps / ddp['tokens_per_s']:.2f}x" if ddp and g == ddp["gpus"] and r is not ddp else ""
    alone = r.get("sums_alone_ms", 0.0)
    comm = f"{alone:.2f}" if alone > 0 else ""
    hidden = f"{1 - (r['ms_per_step'] - one['ms_per_step']) / alone:.0%}" if one and alone > 0 else ""
    gather = r.get("gather") or ""
    print(f"| {r['label']} | {g} | {tps:,.0f} | {tps / g:,.0f} | {eff} | {vs} | {r['ms_per_step']:.1f} | {comm} | {hidden} | {r['peak_device_mb']:,.0f} | {gather} |")
if len(sys.argv) > 4:
    started = re.findall(r"^== ([^:]+):", open(sys.argv[4]).read(), re.M)
    failed = [l for l in started if l not in by]
    if failed:
        print(f"\nStarted but no bench line (failed): {', '.join(failed)} (see scaling.log)")

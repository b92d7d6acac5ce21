#!/usr/bin/env python3
"""Where one PyTorch training step's GPU time goes, kernel by kernel: the step of
pytorch_gpt2.py (same model, AdamW with clipping, autocast bf16), eager or `torch.compile`,
profiled with torch.profiler over `--steps` steps after warm-up. Prints one line a kernel
(grouped by name prefix: launches, ms per step, share) like profile.sh does for ours, and
groups them into attention / matmul / other so the two step profiles can be set side by side.

  python3 gpu/py/pytorch_profile.py --compile --precision bf16
"""
import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_gpt2 import MODELS, model_and_optimizer, training_step  # noqa: E402


def group(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "gemm" in n or "nvjet" in n or "cutlass" in n or "sm90_xmma" in n or "cublas" in n:
        return "matmul"
    if "adam" in n or "foreach" in n or "multi_tensor" in n:
        return "optimizer"
    if n.startswith("triton"):
        return "triton (fused elementwise/norm/loss)"
    return "other"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    dev = torch.device("cuda")
    model, opt = model_and_optimizer(args, dev)
    step = training_step(args, dev, model, opt)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    total = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.split("(")[0].split("<")[0][:70]
        total[name][0] += 1
        total[name][1] += e.device_time_total / 1e3 / args.steps  # ms per step
    step_ms = sum(v[1] for v in total.values())
    tag = "compile" if args.compile else "eager"
    print(f"== pytorch {tag} {args.precision}: {step_ms:.2f} ms of kernel time a step")
    groups = collections.defaultdict(float)
    for name, (n, ms) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        groups[group(name)] += ms
        if ms >= 0.05:
            print(f"TORCHPROF {tag:<7} {name:<70} {n // args.steps:>5} {ms:8.2f} ms {100 * ms / step_ms:5.1f}%")
    for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"TORCHGROUP {tag:<7} {g:<40} {ms:8.2f} ms {100 * ms / step_ms:5.1f}%")


if __name__ == "__main__":
    main()

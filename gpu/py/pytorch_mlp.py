"""PyTorch baseline for `stage2_cuda mnist --bench`: the same MLP (Linear layers with ReLU between,
PyTorch's default initialisation, as ours), softmax cross-entropy, SGD with momentum 0.9 (lr 0.05),
fp32 with TF32 off (ours: --precision fp32). The training set lives on the GPU (60,000 images of
784 float32 values, int64 labels, made up: the values do not change the time); each epoch is a
permutation drawn on the GPU and each step's batch is indexed out of the set on the GPU. Nothing is
read back until the end (no .item() per step).

    python3 pytorch_mlp.py [--compile] [--batch 32 --hidden 128,128,128 --steps 5000 --warmup 200]
    python3 pytorch_mlp.py --sweep [--compile] [--steps 500]     # batch 32/128/512 x width 64/256/1024
    python3 pytorch_mlp.py --trace DIR [--images FILE] --out FILE.tsv  # the loss curve, see below
    python3 pytorch_mlp.py --device cpu --threads 2 [--batch 64 --hidden 256,128]  # eager on the CPU

Each timing prints one JSON line (per shape with --sweep, as soon as it is measured).

--device cpu runs the same eager step on the CPU (the baseline of `stage0_serial mnist --bench
--synthetic`, results/mlp-cpu-bench.sh): the set in host memory, the permutation and each batch's
indexing on the CPU, torch.set_num_threads(--threads) intra-op threads (default: PyTorch's own
choice). --compile and --trace are for the GPU only.

--compile wraps the whole training step (batch indexing, forward, loss, backward, SGD step, zero
grad) in torch.compile(mode="reduce-overhead"): Inductor's kernels, each compiled region replayed as
a CUDA graph; the data set is marked as a static address so that the graphs index it in place
(if that fails, the batch is indexed outside the compiled step, said in the JSON's "gather"). The
warm-up steps include compilation and graph recording; the JSON says how many graph breaks and
cudagraph skips Dynamo and Inductor counted.

--trace DIR repeats one of our runs step for step from `mnist --trace` (DIR = OUT/trace): our
initial weights (init.f32), each step's images (order.i32) and learning rate (steps.tsv), the
settings (settings.json: widths, batch, momentum, weight decay on the weights only); the images
from DIR/train-images.idx (--synthetic runs) or --images (an idx file, gzipped or not). Eager fp32.
Writes FILE.tsv (step, lr, ours, pytorch) and prints a JSON summary of the differences.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SWEEP_BATCHES = (32, 128, 512)
SWEEP_WIDTHS = (64, 256, 1024)
IMAGES, PIXELS, CLASSES = 60_000, 784, 10


def mlp(widths, dev):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dev)


def sgd(model, lr, momentum, weight_decay=0.0):
    """SGD with momentum, weight decay on the weights only (ours: L2 on the matrices)."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    groups = [{"params": weights, "weight_decay": weight_decay}, {"params": biases, "weight_decay": 0.0}]
    return torch.optim.SGD(groups, lr=lr, momentum=momentum)


def fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def counters():
    """Graph breaks and cudagraph skips counted so far (what torch.compile could not capture)."""
    try:
        from torch._dynamo.utils import counters as c

        return {
            "graph_breaks": sum(c["graph_break"].values()),
            "cudagraph_skips": sum(v for k, v in c["inductor"].items() if "cudagraph" in k and "skip" in k),
        }
    except Exception as e:  # counters moved: say so rather than fail the timing
        return {"counters": f"unavailable: {e}"}


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def device_name(dev):
    if dev.type == "cuda":
        return torch.cuda.get_device_name()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "cpu")
    return f"{cpu} ({torch.get_num_threads()} threads)"


def time_shape(batch, hidden, steps, warmup, compile_, dev=torch.device("cuda")):
    if compile_:
        # A fresh Dynamo per shape: the step's code object is the same every time, and its cache
        # holds a few entries only (past them Dynamo runs the step eagerly).
        torch._dynamo.reset()
    torch.manual_seed(0)
    model = mlp([PIXELS, *hidden, CLASSES], dev)
    opt = sgd(model, 0.05, 0.9)
    gen = torch.Generator(device=dev).manual_seed(1)
    x_all = torch.rand(IMAGES, PIXELS, device=dev, generator=gen)
    y_all = torch.randint(0, CLASSES, (IMAGES,), device=dev, generator=gen)
    per_epoch = IMAGES // batch

    def train_step(idx):
        x, y = x_all[idx], y_all[idx]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def train_step_xy(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    gather = "inside"
    step = train_step
    if compile_:
        # The forward and the loss compiled (their backward comes with them, through
        # AOTAutograd, as CUDA graphs too); backward called and SGD stepped from Python: the
        # whole step under one torch.compile graph-breaks at backward(), and reduce-overhead's
        # graphs then overwrite the loss the backward still needs.
        gather = "outside"
        forward_loss = torch.compile(lambda x, y: F.cross_entropy(model(x), y), mode="reduce-overhead")

        def step(idx):
            loss = forward_loss(x_all[idx], y_all[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

    perm = torch.randperm(IMAGES, device=dev, generator=gen)

    def run(first, n):
        nonlocal perm
        loss = None
        for s in range(first, first + n):
            at = s % per_epoch
            if at == 0 and s > 0:
                perm = torch.randperm(IMAGES, device=dev, generator=gen)
            if compile_:
                # A new step for the CUDA graphs of reduce-overhead: the last step's outputs
                # (the loss) may be overwritten (PyTorch refuses to run the step otherwise).
                torch.compiler.cudagraph_mark_step_begin()
            loss = step(perm[at * batch : (at + 1) * batch])
        return loss

    compile_start = time.perf_counter()
    try:
        run(0, warmup)
    except Exception:
        if not compile_ or gather == "outside":
            raise
        # Indexing the static set inside the compiled step failed: index it outside instead.
        gather = "outside"
        compiled = torch.compile(train_step_xy, mode="reduce-overhead")
        step = lambda idx: compiled(x_all[idx], y_all[idx])  # noqa: E731
        run(0, warmup)
    sync(dev)
    warmup_s = time.perf_counter() - compile_start
    start = time.perf_counter()
    loss = run(warmup, steps)
    sync(dev)
    secs = time.perf_counter() - start
    row = {
        "impl": "pytorch-compile" if compile_ else "pytorch-eager",
        "torch": torch.__version__,
        "device": device_name(dev),
        "precision": "fp32",
        "widths": [PIXELS, *hidden, CLASSES],
        "params": sum(p.numel() for p in model.parameters()),
        "batch": batch,
        "warmup": warmup,
        "steps": steps,
        "seconds": secs,
        "steps_per_s": steps / secs,
        "samples_per_s": steps * batch / secs,
        "us_per_step": secs * 1e6 / steps,
        "warmup_s": warmup_s,
        "final_loss": float(loss.float().item()),
    }
    if compile_:
        row["gather"] = gather
        row.update(counters())
    print(json.dumps(row), flush=True)


# ---- the loss curve beside ours ------------------------------------------------------------


def read_idx(path):
    """An idx file (gzipped or not) as a numpy array of its dimensions (u8 data)."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SystemExit(f"{path}: not an idx file of unsigned bytes")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def trace(args):
    fp32()
    dev = torch.device("cuda")
    d = args.trace.rstrip("/")
    settings = json.load(open(f"{d}/settings.json"))
    widths, batch = settings["widths"], settings["batch"]
    images = read_idx(args.images or f"{d}/train-images.idx")
    labels = read_idx(args.labels or f"{d}/train-labels.idx")
    # Ours scales each pixel as f32 p / 255.
    x_all = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / np.float32(255.0)).to(dev)
    y_all = torch.from_numpy(labels.astype(np.int64)).to(dev)
    order = torch.from_numpy(np.fromfile(f"{d}/order.i32", dtype="<i4").astype(np.int64)).to(dev)
    rows = [line.split("\t") for line in open(f"{d}/steps.tsv").read().splitlines()[1:]]
    ours_lr = [float(r[1]) for r in rows]
    ours = [float(r[2]) for r in rows]
    init = torch.from_numpy(np.fromfile(f"{d}/init.f32", dtype="<f4"))
    model = mlp(widths, dev)
    at = 0
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                for p in (layer.weight, layer.bias):
                    p.copy_(init[at : at + p.numel()].view_as(p))
                    at += p.numel()
    assert at == init.numel(), f"init.f32 holds {init.numel()} values, the MLP {at}"
    if settings["optimizer"] != "sgd":
        raise SystemExit("--trace repeats SGD runs only")
    opt = sgd(model, ours_lr[0], settings["momentum"], settings["weight_decay"])
    losses = []
    for s, lr in enumerate(ours_lr):
        for g in opt.param_groups:
            g["lr"] = lr
        idx = order[s * batch : (s + 1) * batch]
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch_losses = torch.stack(losses).cpu().tolist()
    with open(args.out, "w") as f:
        f.write("step\tlr\tours\tpytorch\n")
        for s, (lr, a, b) in enumerate(zip(ours_lr, ours, torch_losses)):
            f.write(f"{s}\t{lr:.6e}\t{a:.6f}\t{b:.6f}\n")
    diff = [abs(a - b) for a, b in zip(ours, torch_losses)]
    print(
        json.dumps(
            {
                "kind": "curve",
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(),
                "steps": len(ours),
                "widths": widths,
                "batch": batch,
                "max_abs_diff": max(diff),
                "mean_abs_diff": sum(diff) / len(diff),
                "first_loss": [ours[0], torch_losses[0]],
                "final_loss": [ours[-1], torch_losses[-1]],
            }
        )
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", default="128,128,128")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--trace", help="a trace directory written by `mnist --trace`")
    p.add_argument("--images", help="with --trace: the training images (idx) when not in the trace")
    p.add_argument("--labels", help="with --trace: the training labels (idx) when not in the trace")
    p.add_argument("--out", default="curve.tsv", help="with --trace: the curves, side by side")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--threads", type=int, help="with --device cpu: torch.set_num_threads")
    args = p.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cpu" and (args.compile or args.trace):
        p.error("--compile and --trace are for --device cuda")
    if args.threads is not None:
        if dev.type != "cpu":
            p.error("--threads is for --device cpu")
        torch.set_num_threads(args.threads)
    if args.trace:
        return trace(args)
    fp32()
    if args.sweep:
        for b in SWEEP_BATCHES:
            for w in SWEEP_WIDTHS:
                time_shape(b, [w] * 3, args.steps or 500, args.warmup, args.compile, dev)
    else:
        hidden = [int(h) for h in args.hidden.split(",")]
        time_shape(args.batch, hidden, args.steps or 5000, args.warmup, args.compile, dev)


if __name__ == "__main__":
    main()

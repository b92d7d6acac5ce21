#!/usr/bin/env python3
"""Trains our exported initial weights in PyTorch on our batches, in our order, with our AdamW
settings, and compares the loss of every step with ours.

    pytorch_train_compare.py EXPORT_DIR BATCHES [--model hf|plain] [--device cuda|cpu]
                             [--tol 1e-3] [--md FILE] [--jsonl FILE] [--label TEXT]

EXPORT_DIR: `export --checkpoint OUT/init.ckpt --format safetensors --out DIR` of a run trained
with `train --save-init --dump-batches BATCHES` (the weights before its first step). BATCHES and
BATCHES.json: what that run trained on, step by step (little-endian int32, per step the inputs
then the targets, B x T each), with its optimiser settings and every step's loss, learning rate
and gradient norm.

PyTorch's side is what a PyTorch user would write, in fp32 with TF32 off:
- the model: transformers' GPT2LMHeadModel.from_pretrained(EXPORT_DIR) (--model hf, the
  default; dropout 0 as the export says, train mode), or the plain GPT-2 of pytorch_gpt2.py
  (--model plain) with the export's weights and the real vocabulary;
- the loss: F.cross_entropy over the real vocabulary, the mean over the batch (with
  micro-batches, each one's loss / K, summed, as ours);
- torch.optim.AdamW, betas and eps from the dump, weight decay on the matrices and embeddings
  (every parameter of 2 or more dimensions: wte (= the tied LM head), wpe, and per block
  c_attn, attn.c_proj, c_fc, mlp.c_proj weights), none on biases and layernorms: the decay
  column of our parameter table (common/src/model/params.rs);
- torch.nn.utils.clip_grad_norm_ at the dump's grad_clip (coefficient max/(norm + 1e-6), as ours;
  PyTorch clamps it at 1 and always multiplies, ours multiplies only above the ceiling: the same
  but within 1e-6 of it);
- the learning rate per step by our schedule (linear warmup from lr/warmup, then cosine to
  lr * min_lr_frac at the last step), computed here and checked against the rate we used.

The vocabulary: ours pads wte to a multiple of 128 rows (50304 for GPT-2's 50257). The padding
rows start at 0, take no part in the softmax (our loss runs over the first V columns), so their
gradient is 0 every step; AdamW then leaves them at 0 (m = v = 0, so the step is 0, and the
decay of 0 is 0), and they add nothing to the gradient norm. Training the unpadded model here is
therefore the same training, not an approximation (the Rust test
`dump_batches_writes_what_was_trained_on` checks that they are still 0 after training).

Prints a table (every step: learning rates, losses, |difference|, gradient norms), then one
JSON line; exits 1 if the largest loss difference is above --tol, or anything else fails. The
gradient norms are shown, not judged: PyTorch's clip_grad_norm_ sums squares in fp32 (on the CPU
it is off by up to about 1e-4 relative on GPT-2's vocabulary), ours in f64 on the CPU.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


def load_dump(path):
    with open(path + ".json") as f:
        meta = json.load(f)
    if meta.get("format") != "gpt2-rs batch dump 1":
        sys.exit(f"{path}.json: not a batch dump (format {meta.get('format')!r})")
    b, t, steps = meta["batch"], meta["seq_len"], meta["steps"]
    assert sys.byteorder == "little", "the dump is little-endian int32"
    with open(path, "rb") as f:
        raw = f.read()
    need = steps * 2 * b * t * 4
    if len(raw) < need:
        sys.exit(f"{path}: {len(raw)} bytes, {need} expected for {steps} steps of {b}x{t}")
    ids = torch.frombuffer(bytearray(raw[:need]), dtype=torch.int32).view(steps, 2, b, t)
    return meta, ids.long()


def lr_at(o, step):
    """Our schedule (common/src/optim.rs, OptimConfig::lr_at) for 0-based `step`."""
    lr, warmup, total = o["lr"], o["warmup_steps"], o["total_steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    min_lr = lr * o["min_lr_frac"]
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def hf_model(export_dir):
    from transformers import GPT2LMHeadModel

    try:
        model, info = GPT2LMHeadModel.from_pretrained(export_dir, output_loading_info=True, dtype=torch.float32)
    except TypeError:  # transformers 4.x: torch_dtype
        model, info = GPT2LMHeadModel.from_pretrained(export_dir, output_loading_info=True, torch_dtype=torch.float32)
    loading = {k: sorted(map(str, v)) for k, v in info.items() if v}
    if loading:
        sys.exit(f"{export_dir}: loading: {loading}")
    cfg = model.config
    for p in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if getattr(cfg, p) != 0.0:
            sys.exit(f"{export_dir}: {p} is {getattr(cfg, p)}; ours has no dropout")
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        sys.exit("lm_head is not tied to wte")

    def logits(idx):
        return model(idx, use_cache=False).logits

    return model, logits, cfg.vocab_size


def plain_model(export_dir):
    """pytorch_gpt2.py's GPT-2 with the export's weights (Conv1D weights transposed back to
    Linear's (out, in)) and an unpadded wte."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch.nn as nn
    from pytorch_gpt2 import GPT2
    from safetensors.torch import load_file

    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    v, c, layers = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"]
    model = GPT2(layers, cfg["n_head"], c, cfg["n_positions"])
    model.wte = nn.Embedding(v, c)
    hf = load_file(os.path.join(export_dir, "model.safetensors"))
    names = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight", "lnf.weight": "ln_f.weight", "lnf.bias": "ln_f.bias"}
    ours_to_hf = {"ln1": "ln_1", "ln2": "ln_2", "qkv": "attn.c_attn", "attproj": "attn.c_proj", "fc": "mlp.c_fc", "fcproj": "mlp.c_proj"}
    for i in range(layers):
        for ours, theirs in ours_to_hf.items():
            for kind in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{kind}"] = f"h.{i}.{theirs}.{kind}"
    state = {}
    for ours, theirs in names.items():
        w = hf.pop("transformer." + theirs)
        linear = ours.endswith(".weight") and ours.split(".")[-2] in ("qkv", "attproj", "fc", "fcproj")
        state[ours] = w.t().contiguous() if linear else w
    if hf:
        sys.exit(f"{export_dir}: tensors left over: {sorted(hf)[:5]}")
    model.load_state_dict(state, strict=True)  # every parameter, no other

    def logits(idx):
        t = idx.shape[1]
        x = model.wte(idx) + model.wpe(torch.arange(t, device=idx.device))
        for block in model.blocks:
            x = block(x)
        return F.linear(model.lnf(x), model.wte.weight)  # tied head, the real vocabulary

    return model, logits, v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("batches")
    ap.add_argument("--model", choices=("hf", "plain"), default="hf")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tol", type=float, default=1e-3, help="largest |loss difference| allowed")
    ap.add_argument("--md", help="write the table here as markdown")
    ap.add_argument("--jsonl", help="append the JSON line here")
    ap.add_argument("--label", default="", help="names the run in the outputs")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    meta, ids = load_dump(args.batches)
    o = meta["optimizer"]
    if meta["first_step"] != 0:
        sys.exit(f"the dump starts at step {meta['first_step']}, not 0: the export is not its initial weights")
    if any(meta["skipped"]):
        sys.exit(f"our run skipped step {meta['skipped'].index(True)} (a non-finite loss or norm): nothing to compare")
    failures = []

    model, logits_of, vocab = (hf_model if args.model == "hf" else plain_model)(args.export_dir)
    if vocab != meta["vocab_size"]:
        sys.exit(f"the export's vocabulary is {vocab}, the dump's {meta['vocab_size']}")
    dev = torch.device(args.device)
    model = model.to(dev).train()
    params = dict(model.named_parameters())  # the tied head once
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o["lr"],
        betas=(o["beta1"], o["beta2"]),
        eps=o["eps"],
        foreach=False,
    )
    k = meta["grad_accum"]
    b = meta["batch"]
    rows, started = [], time.perf_counter()
    for i in range(meta["steps"]):
        step = meta["first_step"] + i
        lr = lr_at(o, step)
        for g in opt.param_groups:
            g["lr"] = lr
        inputs, targets = ids[i, 0].to(dev), ids[i, 1].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for m in range(k):
            sl = slice(m * b // k, (m + 1) * b // k)
            logits = logits_of(inputs[sl])
            part = F.cross_entropy(logits.reshape(-1, vocab), targets[sl].reshape(-1)) / k
            part.backward()
            loss += part.item()
        if o["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"]).item()
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
        opt.step()
        ours = meta["loss"][i]
        rows.append({
            "step": step,
            "lr_ours": meta["lr"][i],
            "lr_torch": lr,
            "loss_ours": ours,
            "loss_torch": loss,
            "diff": abs(loss - ours),
            "norm_ours": meta["grad_norm"][i],
            "norm_torch": norm,
        })
        print(f"{step:5d}  lr {lr:.4e}  ours {ours:.6f}  torch {loss:.6f}  |diff| {abs(loss - ours):.2e}  "
              f"norm ours {meta['grad_norm'][i]:.4f} torch {norm:.4f}", flush=True)
    secs = time.perf_counter() - started

    max_diff = max((r["diff"] for r in rows), default=float("nan"))
    worst = max(rows, key=lambda r: r["diff"]) if rows else None
    lr_rel = max((abs(r["lr_torch"] - r["lr_ours"]) / r["lr_ours"] for r in rows), default=0.0)
    norm_rel = max((abs(r["norm_torch"] - r["norm_ours"]) / r["norm_ours"] for r in rows), default=0.0)
    if lr_rel > 1e-6:
        failures.append(f"learning rates differ by {lr_rel:.2e} (relative): the schedules disagree")
    if not max_diff <= args.tol:
        failures.append(f"max |loss difference| {max_diff:.3e} > {args.tol:g}")
    summary = {
        "label": args.label,
        "model": args.model,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "ours": meta["device"],
        "precision": f"ours {meta['precision']}, torch fp32 (TF32 off)",
        "batch": b,
        "seq_len": meta["seq_len"],
        "steps": len(rows),
        "vocab": vocab,
        "padded_vocab": meta["padded_vocab_size"],
        "optimizer": o,
        "loss_first": [rows[0]["loss_ours"], rows[0]["loss_torch"]] if rows else None,
        "loss_last": [rows[-1]["loss_ours"], rows[-1]["loss_torch"]] if rows else None,
        "max_abs_loss_diff": max_diff,
        "worst_step": worst["step"] if worst else None,
        "max_rel_norm_diff": norm_rel,
        "max_rel_lr_diff": lr_rel,
        "tol": args.tol,
        "torch_s": secs,
        "losses_ours": [r["loss_ours"] for r in rows],
        "losses_torch": [r["loss_torch"] for r in rows],
        "norms_torch": [r["norm_torch"] for r in rows],
        "ok": not failures,
        "failures": failures,
    }
    line = json.dumps(summary)
    print(line)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(line + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(summary, rows))
    sys.exit(1 if failures else 0)


def markdown(s, rows):
    out = [
        f"## {s['label'] or 'train compare'}: PyTorch ({s['model']}) against ours, {s['steps']} steps\n",
        f"Ours: {s['ours']} ({s['precision']}); PyTorch {s['torch']} on {s['device']}. "
        f"Batch {s['batch']}x{s['seq_len']}, vocabulary {s['vocab']} (ours padded to {s['padded_vocab']}). "
        f"AdamW lr {s['optimizer']['lr']:g}, warmup {s['optimizer']['warmup_steps']}, cosine to "
        f"{s['optimizer']['min_lr_frac']:g}x over {s['optimizer']['total_steps']} steps, weight decay "
        f"{s['optimizer']['weight_decay']:g}, betas ({s['optimizer']['beta1']:g}, {s['optimizer']['beta2']:g}), "
        f"eps {s['optimizer']['eps']:g}, clip {s['optimizer']['grad_clip']:g}.\n",
        f"**max |loss difference| {s['max_abs_loss_diff']:.2e}** (step {s['worst_step']}; tolerance {s['tol']:g}: "
        f"{'pass' if s['ok'] else 'FAIL ' + '; '.join(s['failures'])}); gradient norms within "
        f"{s['max_rel_norm_diff']:.2e} (relative); learning rates within {s['max_rel_lr_diff']:.1e}.\n",
        "| step | lr | loss ours | loss PyTorch | \\|diff\\| | grad norm ours | grad norm PyTorch |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(f"| {r['step']} | {r['lr_ours']:.4e} | {r['loss_ours']:.6f} | {r['loss_torch']:.6f} | "
                   f"{r['diff']:.1e} | {r['norm_ours']:.4f} | {r['norm_torch']:.4f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()

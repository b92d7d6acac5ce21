#!/usr/bin/env python3
"""Loads one of our exports with Hugging Face transformers and compares its logits with ours.

    hf_check.py EXPORT_DIR LOGITS_JSON [--tol 1e-4] [--device cpu|cuda]

EXPORT_DIR is what `stage0_serial export --checkpoint CKPT --format safetensors --out DIR`
wrote; LOGITS_JSON what `stage0_serial generate --checkpoint CKPT --prompt TEXT --dump-logits
FILE` wrote (stage2_cuda --precision fp32 too) for the same checkpoint. Checks, in fp32:

- GPT2LMHeadModel.from_pretrained(EXPORT_DIR) loads with no missing, unexpected or mismatched
  keys, and its LM head is tied to wte;
- AutoTokenizer.from_pretrained(EXPORT_DIR) encodes the prompt to our token ids;
- every logit of every prompt position is within --tol of ours (max absolute difference).

Prints one JSON line of results; exits 1 on any failure.
"""
import argparse
import json
import sys

import torch
from transformers import AutoTokenizer, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("logits_json")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda; TF32 is off either way")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    with open(args.logits_json) as f:
        dump = json.load(f)
    tokens, ours = dump["tokens"], torch.tensor(dump["logits"], dtype=torch.float64)
    failures = []

    try:
        model, info = GPT2LMHeadModel.from_pretrained(
            args.export_dir, output_loading_info=True, dtype=torch.float32
        )
    except TypeError:  # transformers 4.x: torch_dtype
        model, info = GPT2LMHeadModel.from_pretrained(
            args.export_dir, output_loading_info=True, torch_dtype=torch.float32
        )
    loading = {k: sorted(map(str, v)) for k, v in info.items() if v}
    if loading:
        failures.append(f"loading: {loading}")
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    if not (wte.data_ptr() == head.data_ptr() or torch.equal(wte, head)):
        failures.append("lm_head is not tied to wte")
    model = model.to(args.device).eval()

    tok = AutoTokenizer.from_pretrained(args.export_dir)
    theirs_ids = tok(dump["prompt"], add_special_tokens=False)["input_ids"]
    if theirs_ids != tokens:
        failures.append(f"tokenizer: {theirs_ids[:20]} != ours {tokens[:20]}")

    with torch.no_grad():
        logits = model(torch.tensor([tokens], device=args.device)).logits[0].double().cpu()
    if logits.shape != ours.shape:
        failures.append(f"logits shape {tuple(logits.shape)} != ours {tuple(ours.shape)}")
        diff = float("inf")
    else:
        diff = (logits - ours).abs().max().item()
        if not diff <= args.tol:
            failures.append(f"max |logit difference| {diff:.3e} > {args.tol:g}")
    print(json.dumps({
        "export": args.export_dir, "positions": len(tokens), "vocab": ours.shape[-1],
        "max_abs_diff": diff, "tol": args.tol, "device": args.device,
        "ok": not failures, "failures": failures,
    }))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

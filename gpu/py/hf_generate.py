#!/usr/bin/env python3
"""Hugging Face `generate` timed the way `stage2_cuda bench --generate` times ours.

    hf_generate.py EXPORT_DIR [--precision fp32|bf16] [--prompt-len 16] [--new-tokens 256]
                   [--batch 1] [--runs 5]

EXPORT_DIR is one of our exports (`export --format safetensors`), loaded with
GPT2LMHeadModel.from_pretrained on the GPU. Greedy, a random prompt of --prompt-len tokens,
exactly --new-tokens new ones (end-of-text ignored), KV cache on (Hugging Face's default).
Prints one JSON line: load time, prefill (the prompt and the first new token) and decode
tokens/s per sequence (the later tokens), medians of --runs after one warm-up.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32

    started = time.perf_counter()
    model = GPT2LMHeadModel.from_pretrained(args.export_dir, torch_dtype=dtype).cuda().eval()
    torch.cuda.synchronize()
    load_s = time.perf_counter() - started

    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len), generator=g).cuda()
    mask = torch.ones_like(prompt)

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == args.prompt_len + n, out.shape
        return time.perf_counter() - t0

    run(args.new_tokens)  # warm-up
    prefill = statistics.median(run(1) for _ in range(args.runs))
    total = statistics.median(run(args.new_tokens) for _ in range(args.runs))
    decode_s = max(total - prefill, 1e-9)
    print(json.dumps({
        "impl": "huggingface", "precision": args.precision, "batch": args.batch,
        "prompt_tokens": args.prompt_len, "new_tokens": args.new_tokens, "runs": args.runs,
        "load_s": round(load_s, 3),
        "prefill_ms": round(1e3 * prefill, 3),
        "decode_ms_per_token": round(1e3 * decode_s / (args.new_tokens - 1), 4),
        "decode_tokens_per_s": round((args.new_tokens - 1) / decode_s, 1),
        "device": torch.cuda.get_device_name(),
        "transformers_torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()

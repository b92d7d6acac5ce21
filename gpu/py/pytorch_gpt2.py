"""PyTorch baseline for `stage2_cuda bench`: GPT-2 124M (or medium, large) defined as ours is (pre-LN, GELU
tanh, tied wte, vocabulary padded to 50304, AdamW with betas (0.9, 0.95), eps 1e-8, weight decay 0.1
on matrices and embeddings, global grad-norm clip 1.0), trained on random tokens; prints one JSON line.

    python3 pytorch_gpt2.py --precision fp32|tf32|bf16 [--compile] [--fp8] [--model gpt2|gpt2-medium|gpt2-large]
                            [--batch 16 --seq-len 1024 --steps 10 --warmup 3]
    python3 pytorch_gpt2.py --ceilings      # copy bandwidth and 8192^3 matmul rates, one JSON line
    python3 pytorch_gpt2.py --kernels --precision bf16   # each op alone, one JSON line per op

bf16 is PyTorch's usual mixed precision, as nanoGPT trains: fp32 master weights, the forward and
backward under torch.autocast(bfloat16), TF32 allowed for what stays fp32, fused AdamW. --compile
wraps the model in torch.compile (default mode); the warm-up steps include its compilation.

Attention is F.scaled_dot_product_attention(is_causal=True), which in fp32 eager picks the memory-
efficient kernel; the loss runs over all 50304 padded logits (nanoGPT's way: no slicing copy, the
cheapest form for PyTorch, whereas ours excludes the padding; the compute differs by 0.1%).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, PADDED_VOCAB = 50257, 50304
# (layers, heads, width) of the presets `--model` names, as common/src/model/config.rs has them.
MODELS = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280)}


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.attproj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fcproj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attproj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers=12, heads=12, width=768, max_seq_len=1024):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, width)
        self.wpe = nn.Embedding(max_seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(width)
        # GPT-2's init, as ours: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def set_precision(precision):
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def model_and_optimizer(args, dev):
    """The benchmark's model (seed 1) on `dev` and its AdamW (decay on matrices and embeddings),
    shared with pytorch_ddp.py."""
    set_precision(args.precision)
    torch.manual_seed(1)
    layers, heads, width = MODELS[args.model]
    model = GPT2(layers, heads, width, max(1024, args.seq_len)).to(dev)
    if getattr(args, "fp8", False):
        # torchao's FP8 training: the blocks' Linear layers (ours: the same four products).
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn.startswith("blocks."))
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=args.precision == "bf16",
    )
    return model, opt


def training_step(args, dev, model, opt):
    """One benchmark step on random tokens (eager, or `torch.compile` with --compile): forward
    under autocast in bf16, backward, clipping, AdamW; returns the loss. Shared with
    pytorch_profile.py."""
    forward = torch.compile(model) if args.compile else model
    b, t = args.batch, args.seq_len
    gen = torch.Generator(device=dev).manual_seed(0)

    def step():
        data = torch.randint(0, VOCAB, (b, t + 1), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = forward(data[:, :-1], data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return step


def bench(args):
    dev = torch.device("cuda")
    model, opt = model_and_optimizer(args, dev)
    b, t = args.batch, args.seq_len
    step = training_step(args, dev, model, opt)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - start
    n = sum(p.numel() for p in model.parameters())
    layers, width = len(model.blocks), model.lnf.weight.numel()
    tokens_per_s = b * t * args.steps / secs
    flops = (6 * n + 6 * layers * width * t) * tokens_per_s  # llm.c's 6N + 6LCT per token
    peak = {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12}[args.precision]  # H100/H200 SXM dense datasheet
    name = torch.cuda.get_device_name()
    print(
        json.dumps(
            {
                "impl": ("pytorch-compile" if args.compile else "pytorch-eager") + ("-torchao-fp8" if args.fp8 else ""),
                "torchao": torchao_version() if args.fp8 else None,
                "model": args.model,
                "torch": torch.__version__,
                "device": name,
                "precision": args.precision,
                "params": n,
                "batch": b,
                "seq_len": t,
                "steps": args.steps,
                "tokens_per_s": tokens_per_s,
                "ms_per_step": secs * 1e3 / args.steps,
                "peak_device_mb": torch.cuda.max_memory_allocated() / 2**20,
                "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
                "mfu": flops / peak if ("H100" in name or "H200" in name) else None,
                "final_loss": loss.item(),
            }
        )
    )


def torchao_version():
    import torchao

    return torchao.__version__


def median_ms(f, reps, warmup):
    """Median milliseconds of `reps` calls of `f`, each timed with CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for _ in range(reps):
        ev[0].record()
        f()
        ev[1].record()
        torch.cuda.synchronize()
        times.append(ev[0].elapsed_time(ev[1]))
    return sorted(times)[reps // 2]


def kernels(args):
    """PyTorch's op for each row of `stage2_cuda bench --kernels`, same shapes, one JSON line each."""
    set_precision(args.precision)
    dev = torch.device("cuda")
    dt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}[args.precision]

    def timed(f, reps=20):
        return median_ms(f, reps, warmup=3)

    def row(op, shape, ms):
        print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": op, "shape": shape,
                          "precision": args.precision, "ms": ms}))

    rand = lambda *shape, scale=1.0: (torch.rand(*shape, device=dev) * 2 - 1).mul_(scale).to(dt)
    for t in (512, 1024, 2048):
        for hs in (64, 128):
            b, c = 16384 // t, 768
            nh = c // hs
            q, k, v = (rand(b, nh, t, hs).requires_grad_() for _ in range(3))
            shape = f"B={b} T={t} NH={nh} HS={hs}"
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            dout = rand(b, nh, t, hs)
            row("attention_fwd", shape, timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
            row("attention_bwd", shape, timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)))
            del q, k, v, out, dout
    r, c = 16384, 768
    x, w, bias = rand(r, c, scale=2.0).requires_grad_(), rand(c).requires_grad_(), rand(c).requires_grad_()
    y = F.layer_norm(x, (c,), w, bias)
    dy = rand(r, c)
    row("layernorm_fwd", f"{r}x{c}", timed(lambda: F.layer_norm(x, (c,), w, bias)))
    row("layernorm_bwd", f"{r}x{c}", timed(lambda: torch.autograd.grad(y, (x, w, bias), dy, retain_graph=True)))
    x = rand(r, 4 * c, scale=4.0).requires_grad_()
    y = F.gelu(x, approximate="tanh")
    dy = rand(r, 4 * c)
    row("gelu_fwd", f"{r}x{4 * c}", timed(lambda: F.gelu(x, approximate="tanh")))
    row("gelu_bwd", f"{r}x{4 * c}", timed(lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True)))
    del x, y, dy
    for v in (32768, 50304, 131072):
        bt = 8192
        logits = rand(bt, v, scale=4.0).requires_grad_()
        targets = torch.randint(0, v, (bt,), device=dev)

        def ce():
            loss = F.cross_entropy(logits, targets)
            torch.autograd.grad(loss, (logits,))

        row("crossentropy_fwd_bwd", f"BT={bt} V={v}", timed(ce, reps=10))
        del logits
    n = 124475904
    p = torch.nn.Parameter(torch.randn(n, device=dev) * 0.1)
    p.grad = torch.randn(n, device=dev) * 0.01
    opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    row("adamw", f"{n} params", timed(opt.step, reps=10))
    del p, opt
    if args.precision == "bf16":
        products(dev, timed)


# GPT-2 124M's products as `bench --kernels` names them: (forward, backward, C in, C out, bias).
PRODUCTS = [("qkv_fwd", "qkv_bwd", 768, 2304, True), ("attproj_fwd", "attproj_bwd", 768, 768, True),
            ("fc_fwd", "fc_bwd", 768, 3072, True), ("fcproj_fwd", "fcproj_bwd", 3072, 768, True),
            ("lm_head_fwd", "lm_head_bwd", 768, 50304, False)]


def products(dev, timed):
    """The rows of kind "matmul" beside ours: GPT-2 124M's products at 16384 rows and an 8192^3 ceiling, in bf16
    (F.linear forward; backward the input and the weight gradient) and, where torch._scaled_mm runs (compute
    capability 8.9 or newer), in FP8: E4M3 by E4M3 forward, E5M2 gradients by E4M3 backward, unit scales, bf16 out
    (the weight gradient f32, as training keeps it)."""
    def row(op, shape, precision, ms, flop):
        print(json.dumps({"kind": "matmul", "impl": "pytorch", "op": op, "shape": shape, "precision": precision,
                          "ms": ms, "flop": flop}))

    rand = lambda *shape: torch.rand(*shape, device=dev) * 2 - 1  # noqa: E731
    r, n = 16384, 8192
    a, b = rand(n, n).bfloat16(), rand(n, n).bfloat16()
    row("matmul_peak", f"{n}x{n}x{n}", "bf16", timed(lambda: a @ b), 2 * n**3)
    for fwd, bwd, c, oc, has_bias in PRODUCTS:
        x, w, dy = rand(r, c).bfloat16(), rand(oc, c).bfloat16(), rand(r, oc).bfloat16()
        bias = rand(oc).bfloat16() if has_bias else None
        shape, flop = f"{r}x{c}x{oc}", 2 * r * c * oc
        row(fwd, shape, "bf16", timed(lambda: F.linear(x, w, bias)), flop)
        row(bwd, shape, "bf16", timed(lambda: (dy @ w, dy.t() @ x)), 2 * flop)
        del x, w, dy
    if not hasattr(torch, "_scaled_mm") or torch.cuda.get_device_capability() < (8, 9):
        return
    e4, e5, one = torch.float8_e4m3fn, torch.float8_e5m2, torch.ones((), device=dev)

    def mm(x, y, bias=None, out_dtype=torch.bfloat16):  # x (R,K) · y (S,K)ᵀ: the second operand column-major
        return torch._scaled_mm(x, y.t(), scale_a=one, scale_b=one, bias=bias, out_dtype=out_dtype)

    a, b = rand(n, n).to(e4), rand(n, n).to(e4)
    row("matmul_peak", f"{n}x{n}x{n}", "fp8", timed(lambda: mm(a, b)), 2 * n**3)
    del a, b
    for fwd, bwd, c, oc, has_bias in PRODUCTS:
        x, w = rand(r, c).to(e4), rand(oc, c).to(e4)
        bias = rand(oc).bfloat16() if has_bias else None
        shape, flop = f"{r}x{c}x{oc}", 2 * r * c * oc
        row(fwd, shape, "fp8", timed(lambda: mm(x, w, bias)), flop)
        dy, wt, dy_t, x_t = rand(r, oc).to(e5), rand(c, oc).to(e4), rand(oc, r).to(e5), rand(c, r).to(e4)
        row(bwd, shape, "fp8", timed(lambda: (mm(dy, wt), mm(dy_t, x_t, out_dtype=torch.float32))), 2 * flop)
        del x, w, dy, wt, dy_t, x_t
    x, w, bias = rand(r, 768).to(e4), rand(3072, 768).to(e4), rand(3072).bfloat16()
    def fc_gelu():  # fc_gelu_fwd: pre = the product, gelu(pre) in E4M3 and its largest magnitude
        a = F.gelu(mm(x, w, bias), approximate="tanh")
        return (a * one).to(e4), a.abs().amax()

    row("fc_gelu_fwd", f"{r}x768x3072", "fp8", timed(fc_gelu), 2 * r * 768 * 3072)
    del x, w, bias
    for rows, cols in ((2304, 768), (3072, 768), (768, 3072)):  # quantize_fp8_transposed: a weight's copy
        x = (rand(rows, cols) * 0.1).bfloat16()
        ms = timed(lambda: ((x * one).to(e4).t().contiguous(), x.abs().amax()))
        print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": "quantize_fp8_transposed",
                          "shape": f"{rows}x{cols}", "precision": "bf16", "ms": ms}))
        ms = timed(lambda: (lambda q: (q, q.t().contiguous(), x.abs().amax()))((x * one).to(e4)))  # quantize_fp8_both
        print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": "quantize_fp8_both",
                          "shape": f"{rows}x{cols}", "precision": "bf16", "ms": ms}))
    x, y, w, b = rand(r, 768).bfloat16(), rand(r, 768).bfloat16(), rand(768).bfloat16(), rand(768).bfloat16()

    def add_ln_quantize():  # add_layernorm_fwd_quantize: the residual sum, its layernorm, that in E4M3 and transposed
        s = x + y
        o = F.layer_norm(s, (768,), w, b)
        q = (o * one).to(e4)
        return s, q, q.t().contiguous(), o.abs().amax()
    print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": "add_layernorm_fwd_quantize", "shape": f"{r}x768",
                      "precision": "bf16", "ms": timed(add_ln_quantize)}))
    del x, y, w, b
    b, t, nh, hs = r // 1024, 1024, 12, 64
    q, k, v = (rand(b, nh, t, hs).bfloat16() for _ in range(3))

    def attn_quantize():  # attention_fwd_quantize: the output as (B·T, C), in E4M3 and transposed, its amax
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b * t, nh * hs)
        qo = (o * one).to(e4)
        return o, qo, qo.t().contiguous(), o.abs().amax()
    print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": "attention_fwd_quantize",
                      "shape": f"B={b} T={t} NH={nh} HS={hs}", "precision": "bf16", "ms": timed(attn_quantize)}))
    del q, k, v
    # gelu_backward_fp8: d(pre) in E5M2 as stored and transposed, gelu(pre) in E4M3 transposed, their largest
    # magnitudes and the bias gradient
    g, x = rand(r, 3072).bfloat16(), (rand(r, 3072) * 2).bfloat16()

    def gelu_fp8():
        d = torch.ops.aten.gelu_backward(g, x, approximate="tanh")
        a = F.gelu(x, approximate="tanh")
        q = (d * one).to(e5)
        return (q, q.t().contiguous(), d.abs().amax(), (a * one).to(e4).t().contiguous(), a.abs().amax(),
                d.sum(0, dtype=torch.float32))
    print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": "gelu_backward_fp8", "shape": f"{r}x3072",
                      "precision": "bf16", "ms": timed(gelu_fp8)}))
    del g, x
    for c in (768, 3072):  # quantize_fp8: the scaled E4M3 copy and the largest magnitude
        x = (rand(r, c) * 4).bfloat16()
        ms = timed(lambda: ((x * one).to(e4), x.abs().amax()))
        print(json.dumps({"kind": "kernel", "impl": "pytorch", "op": "quantize_fp8", "shape": f"{r}x{c}",
                          "precision": "bf16", "ms": ms}))


def ceilings():
    """The device's two ceilings, on random data: copy bandwidth and 8192^3 matmul rates."""
    dev = torch.device("cuda")
    src = torch.randn(512 * 2**20, device=dev)  # 2 GiB
    dst = torch.empty_like(src)

    def timed(f):  # seconds
        return median_ms(f, reps=10, warmup=1) * 1e-3

    copy_s = timed(lambda: dst.copy_(src))
    out = {"device": torch.cuda.get_device_name(), "copy_gb_s": 2 * src.numel() * 4 / copy_s / 1e9}
    del src, dst
    a, b = (torch.randn(8192, 8192, device=dev) for _ in range(2))
    for precision in ("fp32", "tf32"):
        set_precision(precision)
        out[f"matmul_{precision}_tflops"] = 2 * 8192**3 / timed(lambda: a @ b) / 1e12
    a, b = a.bfloat16(), b.bfloat16()
    out["matmul_bf16_tflops"] = 2 * 8192**3 / timed(lambda: a @ b) / 1e12
    print(json.dumps(out))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="tf32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ceilings", action="store_true")
    p.add_argument("--fp8", action="store_true", help="torchao's convert_to_float8_training on the blocks (bf16 only)")
    p.add_argument("--kernels", action="store_true", help="time each op alone (as `stage2_cuda bench --kernels`)")
    a = p.parse_args()
    ceilings() if a.ceilings else kernels(a) if a.kernels else bench(a)

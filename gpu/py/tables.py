#!/usr/bin/env python3
"""Rows and tables of the GPU scripts (gpu/*.sh).

Row makers print one JSON line (the scripts append it to their rows file):

    tables.py row OUT LOG STATUS key=value...   the last JSON line of OUT (every one with
                                                all_lines=1), the fields added; a failed or
                                                silent run gives {"failed": true, "error": ...}
    tables.py testrow LOG NAME STATUS NOTE      a test executable's result line
    tables.py determinism DIR1 DIR2 STAGE PRECISION   two same-seed runs compared
    tables.py smi CSV PHASE                     nvidia-smi samples: per GPU, medians while busy
    tables.py dumprow BATCHES.json LABEL key=value...  a batch dump's losses (train --dump-batches)
    tables.py convergerows FP32.tsv BF16.tsv    bf16 against fp32, evaluation by evaluation
    tables.py lossrows RUN_DIR                  a run's loss.tsv
    tables.py parity A.tsv B.tsv N              two loss tables within 1e-3 (exit 1 if not)
    tables.py mnistrow LOSS.tsv PATH            an MLP run's last row
    tables.py ncu CSV PRECISION                 Nsight Compute's kernel durations as a table

Tables (markdown to --md, the machine and every row to --json; the header names the script,
the machine, the software, the commit and the date):

    tables.py NAME --machine M.json --rows ROWS.jsonl --cmd "gpu/x.sh ..." --md F.md --json F.json [options]

NAME: gpu-check, gpu-bench, gpu-bench-ab, scaling, kernel-bench, generate, train-vs-pytorch,
docs-run, mlp-gpu.
"""
import argparse
import collections
import csv
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine as machine_info  # noqa: E402


def value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def fields(pairs):
    out = {}
    for p in pairs:
        k, _, v = p.partition("=")
        out[k] = value(v)
    return out


def tail(path, n=3):
    try:
        return " / ".join(l.strip() for l in open(path, errors="replace").read().strip().splitlines()[-n:])
    except OSError:
        return ""


# ---- row makers ------------------------------------------------------------------------------

def cmd_row(a):
    extra = fields(a.pairs)
    every = extra.pop("all_lines", 0)
    found = []
    try:
        for line in open(a.out, errors="replace"):
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    if not every:
        found = found[-1:]
    if int(a.status) != 0:
        extra["exit"] = int(a.status)
    if not found:
        print(json.dumps({**extra, "failed": True, "error": tail(a.log)}))
        return
    for r in found:
        print(json.dumps({**r, **extra}))


def cmd_testrow(a):
    passed = failed = ignored = 0
    failures = []
    for line in open(a.log, errors="replace"):
        if line.startswith("test result:"):
            parts = line.replace(";", "").split()
            for i, w in enumerate(parts):
                if w in ("passed", "failed", "ignored") and i > 0 and parts[i - 1].isdigit():
                    n = int(parts[i - 1])
                    passed += n if w == "passed" else 0
                    failed += n if w == "failed" else 0
                    ignored += n if w == "ignored" else 0
        elif line.startswith("test ") and line.rstrip().endswith("FAILED"):
            failures.append(line.split()[1])
    print(json.dumps({"part": "tests", "exe": a.name, "passed": passed, "failed": failed, "ignored": ignored,
                      "exit": int(a.status), "failures": failures, "note": a.note,
                      "error": tail(a.log) if int(a.status) and not failures else ""}))


def checkpoint_arrays(path):
    """A checkpoint's arrays (parameters, AdamW moments): after the 24-byte header, the JSON
    metadata and the 8-byte count; before the 8-byte checksum. The metadata holds the run's
    times, so it is left out."""
    b = open(path, "rb").read()
    meta = int.from_bytes(b[16:24], "little")
    return b[24 + meta + 8:-8]


def loss_rows(path):
    lines = [l.rstrip("\n").split("\t") for l in open(path)]
    return [dict(zip(lines[0], l)) for l in lines[1:]]


def cmd_determinism(a):
    row = {"part": "determinism", "stage": a.stage, "precision": a.precision}
    try:
        t1 = [l.split("\t")[:4] for l in open(os.path.join(a.dir1, "loss.tsv"))]
        t2 = [l.split("\t")[:4] for l in open(os.path.join(a.dir2, "loss.tsv"))]
        row["loss_equal"] = t1 == t2 and len(t1) > 1
        row["last"] = [x.strip() for x in t1[-1][:3]]
        row["state_equal"] = checkpoint_arrays(os.path.join(a.dir1, "model.ckpt")) == \
            checkpoint_arrays(os.path.join(a.dir2, "model.ckpt"))
    except (OSError, IndexError) as e:
        row.update(failed=True, error=str(e))
    print(json.dumps(row))
    sys.exit(0 if row.get("loss_equal") and row.get("state_equal") else 1)


def cmd_smi(a):
    rows = collections.defaultdict(list)
    for r in csv.reader(open(a.csv, errors="replace")):
        try:
            g, mhz, watts, temp, why = int(r[0]), float(r[1]), float(r[2]), float(r[3]), int(r[4], 16)
        except (ValueError, IndexError):
            continue
        if watts > 250:  # busy: an idle H100/H200 draws about 70-120 W
            rows[g].append((mhz, watts, temp, why))
    for g, v in sorted(rows.items()):
        print(json.dumps({"part": "smi", "phase": a.phase, "gpu": g, "samples": len(v),
                          "sm_mhz": statistics.median(x[0] for x in v), "watts": statistics.median(x[1] for x in v),
                          "temp_c": statistics.median(x[2] for x in v),
                          "reasons": " ".join(sorted({hex(x[3]) for x in v}))}))


def cmd_dumprow(a):
    meta = json.load(open(a.meta))
    print(json.dumps({"kind": "ours", "label": a.label, "losses": meta["loss"], "grad_norms": meta["grad_norm"],
                      "device": meta.get("device"), "precision": meta.get("precision"), **fields(a.pairs)}))


def cmd_convergerows(a):
    x, y = loss_rows(a.fp32), loss_rows(a.bf16)
    for r32, r16 in zip(x, y):
        print(json.dumps({"kind": "eval", "epoch": float(r32["epoch"]),
                          "train_fp32": float(r32["train_loss"]), "train_bf16": float(r16["train_loss"]),
                          "val_fp32": float(r32["val_loss"]), "val_bf16": float(r16["val_loss"])}))
    if len(x) != len(y) or not x:
        print(json.dumps({"kind": "error", "error": f"{len(x)} fp32 evaluations, {len(y)} bf16"}))
        sys.exit(1)


def cmd_lossrows(a):
    name = os.path.basename(os.path.normpath(a.dir))
    try:
        rows = loss_rows(os.path.join(a.dir, "loss.tsv"))
    except OSError:
        print(json.dumps({"kind": "run", "run": name, "failed": True, "error": tail(os.path.join(a.dir, "log.txt"))}))
        return
    row = {"kind": "run", "run": name, "rows": rows}
    try:
        with open(os.path.join(a.dir, "summary.json")) as f:
            summary = json.load(f)
        row.update(train_time_s=summary["train_time_s"], loader_wait_s=summary.get("loader_wait_s"),
                   steps=summary["steps"])
    except (OSError, KeyError, ValueError):
        pass
    print(json.dumps(row))


def cmd_parity(a):
    row = {"kind": "parity", "gpus": int(a.n)}
    try:
        x, y = loss_rows(a.a), loss_rows(a.b)
        worst = max((abs(float(p[c]) - float(q[c])) for p, q in zip(x, y) for c in ("train_loss", "val_loss")),
                    default=float("nan"))
        row.update(evaluations=len(x), worst=worst, ok=len(x) == len(y) and len(x) > 0 and worst <= 1e-3)
    except (OSError, KeyError, ValueError) as e:
        row.update(ok=False, error=str(e))
    print(json.dumps(row))
    sys.exit(0 if row["ok"] else 1)


def cmd_mnistrow(a):
    rows = loss_rows(a.tsv)
    last = rows[-1]
    print(json.dumps({"part": "mnist", "label": f"mnist-{a.path}", "path": a.path, "epochs": len(rows),
                      "test_accuracy": float(last["test_accuracy"]), "elapsed_s": float(last["elapsed_s"]),
                      "samples_per_s": float(last["samples_per_s"])}))


def kernel_group(name):
    n = name.lower()
    if "flash" in n or "attention" in n:
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "splitk")):
        return "matrix products"
    if "adamw" in n:
        return "optimizer"
    return "other"


def cmd_ncu(a):
    rows = list(csv.reader(l for l in open(a.csv, errors="replace") if l.startswith('"')))
    head, body = rows[0], rows[1:]
    ni, ui, vi = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}
    total = collections.defaultdict(lambda: [0, 0.0])
    for r in body:
        name = r[ni].split("(")[0].split("<")[0][:60]
        total[name][0] += 1
        total[name][1] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1e-6)
    step = sum(v[1] for v in total.values())
    print(f"{sum(v[0] for v in total.values())} kernels, {step:.2f} ms of kernel time in the step.\n")
    print("| kernel | launches | ms | share |")
    print("| --- | ---: | ---: | ---: |")
    for name, (n, ms) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"| `{name}` | {n} | {ms:.3f} | {100 * ms / step:.1f}% |")
    groups = collections.defaultdict(float)
    for name, (_, ms) in total.items():
        groups[kernel_group(name)] += ms
    print("\n| group | ms | share |")
    print("| --- | ---: | ---: |")
    for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {g} | {ms:.2f} | {100 * ms / step:.1f}% |")


# ---- tables ----------------------------------------------------------------------------------

def fmt(x, spec=",.0f", missing="-"):
    return missing if x is None else format(x, spec)


def ratio(a, b, key="tokens_per_s"):
    if not a or not b or a.get("failed") or b.get("failed") or not b.get(key):
        return None
    return a[key] / b[key]


def rx(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}x"


def spread(xs, digits=3):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}x"
    return f"median {statistics.median(xs):.{digits}f}x ({min(xs):.{digits}f}-{max(xs):.{digits}f}x, {len(xs)} rounds)"


def failed_lines(rows):
    bad = [r for r in rows if r.get("failed") or r.get("exit")]
    if not bad:
        return []
    out = ["", "Failed runs:", ""]
    out += [f"- {r.get('label', r.get('exe', '?'))}: exit {r.get('exit', '-')}; {r.get('error', '')}" for r in bad]
    return out


def t_gpu_check(rows, a):
    out = ["## GPU tests", "",
           "Each test executable with GPU tests, run with `--include-ignored` (its CPU tests too).", "",
           "| executable | passed | failed | ignored | result |", "| --- | ---: | ---: | ---: | --- |"]
    for r in (r for r in rows if r.get("part") == "tests"):
        ok = r["exit"] == 0
        res = "pass" if ok else "FAIL: " + (", ".join(r["failures"][:8]) or r.get("error", ""))
        if r.get("note"):
            res += f" ({r['note']})"
        out.append(f"| {r['exe']} | {r['passed']} | {r['failed']} | {r['ignored']} | {res} |")
    det = [r for r in rows if r.get("part") == "determinism"]
    if det:
        out += ["", "## Determinism", "",
                "The Makefile's SHORT_FLAGS run twice with the same seed: loss.tsv (epoch, train, val, bad steps) and "
                "the final checkpoint's parameters and AdamW moments compared bit for bit.", "",
                "| stage | precision | loss.tsv | parameters and moments | last row (epoch, train, val) |",
                "| --- | --- | --- | --- | --- |"]
        for r in det:
            if r.get("failed"):
                out.append(f"| {r['stage']} | {r['precision']} | FAILED: {r.get('error', '')} | | |")
                continue
            eq = lambda b: "equal" if b else "DIFFERENT"  # noqa: E731
            out.append(f"| {r['stage']} | {r['precision']} | {eq(r['loss_equal'])} | {eq(r['state_equal'])} | "
                       f"{' '.join(r['last'])} |")
    return out


def bench_row(r, by, compile_key, eager_key):
    if r.get("failed"):
        return f"| {r['label']} | FAILED | | | | | | | |"
    eager, comp = by.get(eager_key), by.get(compile_key)
    mfu = fmt(r.get("mfu"), ".3f")
    return (f"| {r['label']} | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:.2f} | {r['peak_device_mb']:,.0f} | {mfu} | "
            f"{rx(ratio(r, eager))} | {rx(ratio(r, eager, 'peak_device_mb') if eager else None)} | "
            f"{rx(ratio(r, comp), 3)} | {rx(ratio(r, comp, 'peak_device_mb') if comp else None)} |")


def t_gpu_bench(rows, a):
    by = {r["label"]: r for r in rows}
    rounds = sorted({r["round"] for r in rows if isinstance(r.get("round"), int)})
    out = ["GPT-2 on random tokens: forward, backward, global-norm clipping and AdamW a step; ours `stage2_cuda bench`, "
           "PyTorch gpu/py/pytorch_gpt2.py (the same model, shapes and optimiser), alternating in rounds; 3 warm-up "
           "steps, then the timed ones. \"vs\" columns: ours over PyTorch's in the same round (tokens/s: above 1 ours "
           "faster; memory: below 1 ours smaller). MFU: 6N + 6LCT FLOP per token over the H100/H200 datasheet dense "
           "peak (fp32 67, tf32 495, bf16 989 TFLOP/s).", "",
           "## GPT-2 124M, B=16, T=1024", "",
           "| run | tokens/s | ms/step | peak MiB | MFU | vs eager | memory vs eager | vs torch.compile | memory vs torch.compile |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r.get("round") in rounds and r.get("label", "").endswith(f"-r{r['round']}"):
            p, k = r.get("precision"), r.get("round")
            if r.get("side") == "ours":
                out.append(bench_row(r, by, f"torch-compile-{p}-r{k}" if p == "bf16" else None, f"torch-eager-{p}-r{k}"))
            else:
                out.append(bench_row(r, by, None, None))
    summary = []
    for p in ("bf16", "tf32", "fp32"):
        e = [ratio(by.get(f"ours-{p}-r{k}"), by.get(f"torch-eager-{p}-r{k}")) for k in rounds]
        if any(x is not None for x in e):
            summary.append(f"- {p}: vs eager {spread(e)}")
    c = [ratio(by.get(f"ours-bf16-r{k}"), by.get(f"torch-compile-bf16-r{k}")) for k in rounds]
    if any(x is not None for x in c):
        summary.append(f"- bf16: vs torch.compile {spread(c)}")
    if summary:
        out += ["", "Summary over the rounds (ours over PyTorch, tokens/s):", ""] + summary
    var = [r for r in rows if r.get("side") == "ours" and r.get("round") == 1 and not r["label"].endswith("-r1")]
    if var:
        out += ["", "## Variants of ours (GPT-2 124M, B=16, T=1024; against round 1's PyTorch)", "",
                "`--recompute`: GELU and layernorm outputs computed again in backward (less memory); `no-graph`: "
                "GPT2_CUDA_GRAPH=0, the step launched op by op instead of replayed as one CUDA graph.", "",
                "| run | tokens/s | ms/step | peak MiB | MFU | vs eager | memory vs eager | vs torch.compile | memory vs torch.compile |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in var:
            p = r.get("precision")
            out.append(bench_row(r, by, f"torch-compile-{p}-r1" if p == "bf16" else None, f"torch-eager-{p}-r1"))
    shapes = [r for r in rows if r.get("round") == "shape" and r.get("side") == "ours"]
    if shapes:
        out += ["", "## Other shapes, bf16, against torch.compile", "",
                "| model | B | T | ours tokens/s | torch.compile tokens/s | speed | peak MiB ours / torch.compile | MFU ours / torch.compile |",
                "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for r in shapes:
            t = by.get(r["label"].replace("ours-", "torch-compile-", 1))
            if r.get("failed"):
                out.append(f"| {r['model']} | {r['batch']} | {r['seq_len']} | FAILED | | | | |")
                continue
            tt = "-" if not t or t.get("failed") else f"{t['tokens_per_s']:,.0f}"
            mem = f"{r['peak_device_mb']:,.0f} / " + ("-" if tt == "-" else f"{t['peak_device_mb']:,.0f}")
            mfu = fmt(r.get("mfu"), ".3f") + " / " + ("-" if tt == "-" else fmt(t.get("mfu"), ".3f"))
            out.append(f"| {r['model']} | {r['batch']} | {r['seq_len']} | {r['tokens_per_s']:,.0f} | {tt} | "
                       f"{rx(ratio(r, t))} | {mem} | {mfu} |")
    return out + failed_lines(rows)


def t_gpu_memory(rows, a):
    out = ["bf16, T=1024, one GPU: GPT-2 on random tokens, forward, backward, clipping and AdamW a step (ours "
           "`stage2_cuda bench`; PyTorch gpu/py/pytorch_gpt2.py with torch.compile and fused AdamW), the runs of a "
           "round in turns. Peak memory is each allocator's own high-water mark: ours the bytes our device "
           "allocator had handed out (pooled buffers included), PyTorch's `torch.cuda.max_memory_allocated()` "
           "(its `max_memory_reserved()` beside it). \"vs\" columns: ours over torch.compile's in the same "
           "round (tokens/s: above 1 faster; memory: below 1 smaller).", ""]
    for model in dict.fromkeys(r.get("model") for r in rows if r.get("model")):
        rs = [r for r in rows if r.get("model") == model]
        b = next((r.get("batch") for r in rs), "?")
        out += [f"## {model}, B={b}", "",
                "| run | round | tokens/s | vs torch.compile | peak MiB | memory vs torch.compile |",
                "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in rs:
            if r.get("failed"):
                out.append(f"| {r.get('variant')} | {r.get('round')} | FAILED | | | |")
                continue
            t = next((x for x in rs if x.get("side") == "torch-compile" and x.get("round") == r.get("round")
                      and not x.get("failed")), None)
            mem = f"{r['peak_device_mb']:,.0f}"
            if r.get("side") == "torch-compile" and r.get("peak_reserved_mb"):
                mem += f" (reserved {r['peak_reserved_mb']:,.0f})"
            mine = r.get("side") == "ours"
            out.append(f"| {r.get('variant')} | {r.get('round')} | {r['tokens_per_s']:,.0f} | "
                       f"{rx(ratio(r, t), 3) if mine else ''} | {mem} | "
                       f"{rx(ratio(r, t, 'peak_device_mb'), 3) if mine and t else ''} |")
        out.append("")
    return out


# The precisions in the order the tables list them.
PRECISION_ORDER = ["fp32", "tf32", "bf16", "fp8"]


def t_gpu_bench_ab(rows, a):
    precisions = sorted({r["precision"] for r in rows if "precision" in r}, key=PRECISION_ORDER.index)
    out = [f"Build A: {a.a}. Build B: {a.b}.", "",
           f"GPT-2 124M in {', '.join(precisions)}, B=16 per GPU, T=1024 (`bench`), A and B alternating (A first in "
           "odd rounds, B first in even ones). B/A: B's tokens/s over A's in the same round (above 1: B faster). Weak "
           "scaling: the N-GPU run's tokens/s over N x the same build's one-GPU tokens/s in the same round.", "",
           "| round | run | A tokens/s | B tokens/s | B/A | A weak scaling | B weak scaling |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    by = {r["label"]: r for r in rows}
    rounds = sorted({r["round"] for r in rows if "round" in r})
    kinds = sorted({r["gpus"] for r in rows if "gpus" in r})
    run_name = lambda g, p: f"{'stage 2, 1 GPU' if g == 1 else f'stage 3, {g} GPUs'}, {p}"
    ratios = collections.defaultdict(list)
    for k in rounds:
        for p in precisions:
            for g in kinds:
                ra, rb = by.get(f"A-{g}gpu-{p}-r{k}"), by.get(f"B-{g}gpu-{p}-r{k}")
                q = ratio(rb, ra)
                ratios[(g, p)].append(q)
                eff = ["", ""]
                if g > 1:
                    for i, (x, one) in enumerate(((ra, by.get(f"A-1gpu-{p}-r{k}")), (rb, by.get(f"B-1gpu-{p}-r{k}")))):
                        e = ratio(x, one)
                        if e is not None:
                            e /= g
                            ratios[("weak", p, "AB"[i])].append(e)
                            eff[i] = f"{100 * e:.1f}%"
                ta = "FAILED" if not ra or ra.get("failed") else f"{ra['tokens_per_s']:,.0f}"
                tb = "FAILED" if not rb or rb.get("failed") else f"{rb['tokens_per_s']:,.0f}"
                out.append(f"| {k} | {run_name(g, p)} | {ta} | {tb} | {rx(q, 4)} | {eff[0]} | {eff[1]} |")
    out += ["", "## Summary", ""]
    for p in precisions:
        for g in kinds:
            xs = [x for x in ratios[(g, p)] if x is not None]
            if xs:
                m = statistics.median(xs)
                out.append(f"- {run_name(g, p)}: B/A median {m:.4f}x (min {min(xs):.4f}x, max {max(xs):.4f}x, "
                           f"{len(xs)} rounds); A/B median {1 / m:.4f}x")
        wa, wb = ratios.get(("weak", p, "A"), []), ratios.get(("weak", p, "B"), [])
        if wa and wb:
            ma, mb = statistics.median(wa), statistics.median(wb)
            out.append(f"- weak scaling, {p}: A median {100 * ma:.1f}%, B median {100 * mb:.1f}%; B/A {mb / ma:.4f}x, "
                       f"A/B {ma / mb:.4f}x")
    return out + failed_lines(rows)


def t_scaling(rows, a):
    n = a.gpus
    runs = [r for r in rows if r.get("part") not in ("allreduce", "per-gpu", "smi")]
    by = {r["label"]: r for r in runs}
    ones = [by[k] for k in ("ours-1gpu", "ours-1gpu-end") if k in by and not by[k].get("failed")]
    one = {k: statistics.mean(r[k] for r in ones) for k in ("tokens_per_s", "ms_per_step")} if ones else None
    torch1 = by.get("torch-compile-1gpu")
    out = [f"GPT-2 124M, bf16, B=16 per GPU, T=1024, {n} GPUs (global batch {16 * n}); 3 warm-up steps, then the "
           "timed ones. Weak-scaling efficiency: tokens/s per GPU over one GPU's (ours: stage 2's, the mean of its "
           f"{len(ones)} run(s) in this call; DDP: torch.compile's on one GPU). vs DDP: ours over DDP + torch.compile's "
           "tokens/s on the same GPUs and transport (runs with bf16 sums, `--grad-comm bf16`, over DDP with its "
           "bf16_compress_hook). Sums alone: one step's gradient sums as the step makes them (all-reduce; under "
           "ZeRO-1 the reduce-scatter and all-gather; bucket by bucket under --overlap, in bf16 under --grad-comm "
           "bf16) timed on their own after the run; hidden: the share of them the step "
           "does not add to the one-GPU step, 1 - (ms/step - one GPU's) / sums alone. Transport `socket`: "
           "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 (NCCL over TCP sockets). Every run of ours but "
           "`no-graph` (GPT2_CUDA_GRAPH=0) replays each step as one CUDA graph with NCCL's sums inside.", "",
           "| run | GPUs | transport | tokens/s | per GPU | weak-scaling eff. | vs DDP | ms/step | sums alone ms | hidden | peak MiB per GPU |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        if r.get("failed"):
            out.append(f"| {r['label']} | {r.get('gpus', '')} | {r.get('transport', '')} | FAILED | | | | | | | |")
            continue
        g, tps = r["gpus"], r["tokens_per_s"]
        side = r.get("side")
        base = torch1 if side == "ddp" else one if side == "ours" else None
        eff = f"{100 * tps / g / base['tokens_per_s']:.1f}%" if base and not (isinstance(base, dict) and base.get("failed")) and g > 1 else ""
        # bf16 sums against DDP's bf16_compress_hook, f32 sums against plain DDP.
        ddp = by.get("ddp-compile" + ("-socket" if r.get("transport") == "socket" else "")
                     + ("-bf16-sums" if r["label"].endswith("-bf16-sums") else ""))
        vs = rx(ratio(r, ddp)) if side == "ours" and ddp else ""
        alone = r.get("sums_alone_ms") or 0.0
        hidden = f"{100 * (1 - (r['ms_per_step'] - one['ms_per_step']) / alone):.0f}%" if one and alone > 0 else ""
        out.append(f"| {r['label']} | {g} | {r.get('transport', '-')} | {tps:,.0f} | {tps / g:,.0f} | {eff} | {vs} | "
                   f"{r['ms_per_step']:.2f} | {f'{alone:.2f}' if alone else ''} | {hidden} | {r['peak_device_mb']:,.0f} |")
    if len(ones) == 2:
        d = ones[1]["tokens_per_s"] / ones[0]["tokens_per_s"] - 1
        out += ["", f"Stage 2 on one GPU moved {100 * d:+.2f}% between the call's first and last run."]
    ar = [r for r in rows if r.get("part") == "allreduce" and not r.get("failed")]
    if ar:
        out += ["", f"## NCCL all-reduce on {n} GPUs (`bench --allreduce`, nccl-tests' conventions)", "",
                "| transport | size | µs | algbw GB/s | busbw GB/s |", "| --- | ---: | ---: | ---: | ---: |"]
        for r in ar:
            size = r.get("bytes") or 0
            size_s = f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size / 2**10:g} KiB"
            out.append(f"| {r.get('transport')} | {size_s} | {fmt(r.get('time_us'), ',.1f')} | {fmt(r.get('algbw_gb_s'), '.1f')} | "
                       f"{fmt(r.get('busbw_gb_s'), '.1f')} |")
    pg = [r for r in rows if r.get("part") == "per-gpu"]
    if pg:
        smi = {(r["phase"], r["gpu"]): r for r in rows if r.get("part") == "smi"}
        alone = {r["gpu"]: r for r in pg if r["phase"] == "alone" and not r.get("failed")}
        together = {r["gpu"]: r for r in pg if r["phase"] == "together" and not r.get("failed")}
        out += ["", "## Each GPU's own speed (stage 2, bf16, B=16, T=1024)", "",
                "Alone: one GPU at a time (50 steps); all at once: every GPU its own process (200 steps). SM clock, "
                "power and temperature: medians of nvidia-smi's 200 ms samples while the GPU was busy (above 250 W).", "",
                "| GPU | alone ms/step | all at once ms/step | SM MHz (all at once) | W | deg C | clock-event reasons |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for g in sorted(set(alone) | set(together)):
            s = smi.get(("together", g), {})
            out.append(f"| {g} | {fmt(alone.get(g, {}).get('ms_per_step'), '.2f')} | "
                       f"{fmt(together.get(g, {}).get('ms_per_step'), '.2f')} | {fmt(s.get('sm_mhz'), '.0f')} | "
                       f"{fmt(s.get('watts'), '.0f')} | {fmt(s.get('temp_c'), '.0f')} | {s.get('reasons', '')} |")
        st = by.get("ours-zero1")
        if alone and st and not st.get("failed"):
            slow = min(alone.values(), key=lambda r: r["tokens_per_s"])
            out += ["", f"Stage 3's default on {n} GPUs against GPU 0 alone: "
                    f"{100 * st['tokens_per_s'] / n / alone[min(alone)]['tokens_per_s']:.1f}%; against the slowest GPU "
                    f"alone (GPU {slow['gpu']}): {100 * st['tokens_per_s'] / n / slow['tokens_per_s']:.1f}%; the GPUs "
                    f"alone spread {100 * (max(r['tokens_per_s'] for r in alone.values()) / slow['tokens_per_s'] - 1):.1f}%."]
    return out + failed_lines([r for r in rows if r.get("part") != "allreduce" or r.get("failed")])


def t_kernel_bench(rows, a):
    ceil = next((r for r in rows if r.get("kind") == "ceilings" and not r.get("failed")), None)
    mm = [r for r in rows if r.get("kind") == "matmul" and r.get("impl", "ours") == "ours"]
    theirs = {(r["op"], r["shape"], r["precision"]): r for r in rows
              if r.get("kind") == "matmul" and r.get("impl") == "pytorch" and not r.get("failed")}
    out = ["Each op alone at B*T = 16384 rows, milliseconds a call (ours: `stage2_cuda bench --kernels`, the median of "
           "5 batches of calls timed between synchronisations; PyTorch: gpu/py/pytorch_gpt2.py --kernels, the median "
           "of 20 calls timed with CUDA events)."]
    if mm:
        out += ["", "## GPT-2 124M's matrix products against the ceiling", "",
                "The ceiling: an 8192^3 product on the same backend in the same process (`matmul_peak`). fp8: "
                "`matmul_fp8` (cuBLASLt), E4M3 by E4M3 forward with the bias, and backward the input and weight "
                "gradients' products, E5M2 gradients by E4M3, operands laid out K-major, bf16 out (the weight gradient "
                "f32, written, as training's), the quantizations "
                "not counted (`quantize_fp8` below). PyTorch: F.linear and its two backward products in bf16, "
                "torch._scaled_mm in fp8, same shapes and layouts.", "",
                "| precision | product | shape | ms | TFLOP/s | of ceiling | PyTorch ms | ours vs PyTorch |",
                "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        peak = {r["precision"]: r for r in mm if r["op"] == "matmul_peak"}
        for r in mm:
            rate = r["flop"] / r["ms"] / 1e9 if r.get("flop") else None
            pk = peak.get(r["precision"])
            prate = pk["flop"] / pk["ms"] / 1e9 if pk and pk.get("flop") else None
            share = f"{100 * rate / prate:.0f}%" if rate and prate else "-"
            pt = theirs.get((r["op"], r["shape"], r["precision"]))
            out.append(f"| {r['precision']} | {r['op']} | {r['shape']} | {r['ms']:.3f} | {fmt(rate, '.0f')} | {share} | "
                       f"{fmt(pt and pt['ms'], '.3f')} | {rx(pt['ms'] / r['ms'] if pt else None)} |")
    ours = [r for r in rows if r.get("kind") == "kernel" and r.get("impl") == "ours"]
    if ours:
        key = lambda r: (r["impl"], r["op"], r["shape"], r["precision"])  # noqa: E731
        by = {key(r): r for r in rows if r.get("kind") == "kernel"}
        tf, gbs = (ceil or {}).get("matmul_bf16_tflops"), (ceil or {}).get("copy_gb_s")
        out += ["", "## Kernels, bf16, against PyTorch", ""]
        if ceil:
            out += [f"Rates against this device's ceilings measured by PyTorch in the same call: {tf:.0f} TFLOP/s "
                    f"(8192^3 bf16 product), {gbs:.0f} GB/s (device copy, read + write). FLOP for attention as "
                    "FlashAttention counts them (the causal half; backward 2.5x forward); bytes are the fewest the op "
                    "must move. Unfused: the same computation without the fusion.", ""]
        out += ["| op | shape | ours ms | ours rate | of ceiling | unfused ms | PyTorch ms | ours vs PyTorch |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in ours:
            if r.get("flop"):
                rate = r["flop"] / r["ms"] / 1e9
                text, frac = f"{rate:.0f} TFLOP/s", rate / tf if tf else None
            else:
                rate = r["bytes"] / r["ms"] / 1e6
                text, frac = f"{rate:.0f} GB/s", rate / gbs if gbs else None
            un = by.get(("ours-unfused", r["op"], r["shape"], r["precision"]))
            pt = by.get(("pytorch", r["op"], r["shape"], r["precision"]))
            out.append(f"| {r['op']} | {r['shape']} | {r['ms']:.3f} | {text} | {fmt(frac and 100 * frac, '.0f')}{'%' if frac else ''} | "
                       f"{fmt(un and un['ms'], '.3f')} | {fmt(pt and pt['ms'], '.3f')} | "
                       f"{rx(pt['ms'] / r['ms'] if pt else None)} |")
    return out + failed_lines(rows)


def t_generate(rows, a):
    def get(impl, p, **kw):
        return next((r for r in rows if r.get("impl") == impl and r.get("precision") == p and not r.get("failed")
                     and all(r.get(k) == v for k, v in kw.items())), None)
    out = ["GPT-2 124M, greedy, a 16-token prompt, 256 new tokens. Ours: `stage2_cuda bench --generate` (batch 1, "
           "random weights; medians of 5 runs after one); Hugging Face: gpu/py/hf_generate.py, GPT2LMHeadModel on our "
           "export, KV cache on. Decode: the tokens after the first; prefill: the prompt and the first new token. "
           "Hugging Face batch 16: tokens/s per sequence (x16 for the batch).", "",
           "| run | decode tokens/s | ms/token | prefill ms | start-up / load s | vs Hugging Face batch 1 |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for p in ("fp32", "bf16"):
        hf = get("huggingface", p, batch=1)
        for name, r in ((f"ours {p}, CUDA graph", get("ours", p, graph=1)), (f"ours {p}, op by op", get("ours", p, graph=0)),
                        (f"Hugging Face {p}, batch 1", hf), (f"Hugging Face {p}, batch 16", get("huggingface", p, batch=16))):
            if not r:
                out.append(f"| {name} | (missing) | | | | |")
                continue
            start = r.get("startup_s", r.get("load_s"))
            out.append(f"| {name} | {r['decode_tokens_per_s']:,.0f} | {r['decode_ms_per_token']:.3f} | {r['prefill_ms']:.2f} | "
                       f"{fmt(start, '.2f')} | {rx(ratio(r, hf, 'decode_tokens_per_s'))} |")
    checks = [r for r in rows if r.get("kind") == "check"]
    if checks:
        out += ["", "## Our exports in transformers", "",
                "Tiny models trained by stage0_serial (30 steps), exported (`export --format safetensors`) and loaded "
                "with GPT2LMHeadModel.from_pretrained and AutoTokenizer (gpu/py/hf_check.py): no missing or unexpected "
                "keys, the head tied, our token ids; every logit of the prompt within 1e-4 of ours (fp32, TF32 off).", "",
                "| tokenizer | our logits from | transformers on | positions | max \\|logit difference\\| | result |",
                "| --- | --- | --- | ---: | ---: | --- |"]
        for r in checks:
            if r.get("failed") and "max_abs_diff" not in r:
                out.append(f"| {r['tokenizer']} | {r['stage']} | | | | FAILED: {r.get('error', '')} |")
                continue
            res = "pass" if r.get("ok") else "FAIL: " + "; ".join(r.get("failures", []))
            out.append(f"| {r['tokenizer']} | {r['stage']} | {r['device']} | {r['positions']} | {r['max_abs_diff']:.2e} | {res} |")
    return out + failed_lines([r for r in rows if r.get("kind") != "check"])


def t_train_vs_pytorch(rows, a):
    ours = {(r["attention"], r["lr"]): r for r in rows if r.get("kind") == "ours"}
    torch_runs = [r for r in rows if r.get("label", "").startswith("torch-hf-")]
    out = [f"Ours: `{a.train}` at each learning rate LR, once with GPT2_CUDA_ATTENTION=flash (the default) and once "
           "with =gemm (batched cuBLAS products and a softmax kernel, strict fp32); the same seed, so the same initial "
           "weights and batches (checked). PyTorch (gpu/py/pytorch_train_compare.py): the initial weights exported and "
           "trained on the dumped batches in order, with the same AdamW, schedule and clipping, in fp32 with TF32 off, "
           "in transformers' GPT2LMHeadModel; one run a learning rate, against both of ours. Figure: the largest "
           "|loss difference| from PyTorch over the steps. Pass: flash's at most 1.1x GEMM's (whose distance is the "
           "spread of fp32 training itself), or both below 1e-5, the resolution of an f32 loss near 10.", "",
           "| lr | loss step 0 (ours / PyTorch) | flash: max \\|loss diff\\| (step) | GEMM: max \\|loss diff\\| (step) | flash / GEMM | grad norms at the worst step, flash / GEMM / PyTorch | result |",
           "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    steps = {}
    for t in torch_runs:
        lr = t.get("lr")
        if "losses_torch" not in t:
            out.append(f"| {lr} | PyTorch FAILED: {t.get('error', '')} | | | | | FAIL |")
            continue
        fl, ge = ours.get(("flash", lr)), ours.get(("gemm", lr))
        if not fl or not ge:
            out.append(f"| {lr} | our runs missing | | | | | FAIL |")
            continue
        tl = t["losses_torch"]
        worst = {}
        for name, r in (("flash", fl), ("gemm", ge)):
            d = [abs(x - y) for x, y in zip(r["losses"], tl)]
            worst[name] = (max(d), d.index(max(d)))
        ratio_ = worst["flash"][0] / worst["gemm"][0] if worst["gemm"][0] > 0 else float("inf")
        k = worst["flash"][1]
        same_len = len(fl["losses"]) == len(tl) == len(ge["losses"])
        # Below 1e-5 both sit at the resolution of an f32 loss near 10 (step 0 differs by ~1e-6).
        verdict = "pass" if same_len and ratio_ <= 1.1 else \
            "pass: both at f32 resolution" if same_len and worst["flash"][0] <= 1e-5 else "FAIL"
        norms = f"{fl['grad_norms'][k]:.3f} / {ge['grad_norms'][k]:.3f} / {t['norms_torch'][k]:.3f}" if "norms_torch" in t else \
            f"{fl['grad_norms'][k]:.3f} / {ge['grad_norms'][k]:.3f} / -"
        out.append(f"| {lr} | {fl['losses'][0]:.6f} / {tl[0]:.6f} | {worst['flash'][0]:.2e} ({worst['flash'][1]}) | "
                   f"{worst['gemm'][0]:.2e} ({worst['gemm'][1]}) | {ratio_:.2f} | {norms} | {verdict} |")
        steps[lr] = (fl["losses"], ge["losses"], tl)
    if steps:
        lrs = list(steps)
        out += ["", "## Every step: ours minus PyTorch", "",
                "| step | " + " | ".join(f"flash, lr {lr} | GEMM, lr {lr}" for lr in lrs) + " |",
                "| ---: | " + " | ".join("---: | ---:" for _ in lrs) + " |"]
        n = min(len(v[2]) for v in steps.values())
        for i in range(n):
            cells = [f"{steps[lr][0][i] - steps[lr][2][i]:+.2e} | {steps[lr][1][i] - steps[lr][2][i]:+.2e}" for lr in lrs]
            out.append(f"| {i} | " + " | ".join(cells) + " |")
    if any(r.get("kind") == "eval" for r in rows):
        a.train = a.train2
        out += ["", "## bf16 against fp32: GPT-2 124M, 500 steps", ""] + t_converge(rows, a)
    return out + failed_lines([r for r in rows if r.get("failed") and not r.get("label", "").startswith("torch-hf-")])


def t_converge(rows, a):
    ev = [r for r in rows if r.get("kind") == "eval"]
    out = [f"`{a.train}`: the same run in fp32 and in bf16 (runs/converge/fp32, runs/converge/bf16: loss.tsv, env.txt). "
           "Bound: bf16 within 2% of fp32 at every evaluation. The validation loss is the figure; the train column (the "
           "mean over the steps since the last evaluation) is shown too: late in the run both runs memorise this "
           "300K-token corpus, and at train losses near 0.1 two runs drift apart by more than 2% of so small a value.", "",
           "| epoch | train fp32 | train bf16 | diff | val fp32 | val bf16 | diff |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    worst = {"train": 0.0, "val": 0.0}
    for r in ev:
        dt = abs(r["train_bf16"] - r["train_fp32"]) / r["train_fp32"]
        dv = abs(r["val_bf16"] - r["val_fp32"]) / r["val_fp32"]
        worst["train"], worst["val"] = max(worst["train"], dt), max(worst["val"], dv)
        out.append(f"| {r['epoch']:.2f} | {r['train_fp32']:.4f} | {r['train_bf16']:.4f} | {100 * dt:.2f}% | "
                   f"{r['val_fp32']:.4f} | {r['val_bf16']:.4f} | {100 * dv:.2f}% |")
    ok = bool(ev) and not any(r.get("kind") == "error" for r in rows)
    out += ["", f"- validation: worst {100 * worst['val']:.2f}% over {len(ev)} evaluations: "
            f"{'PASS' if ok and worst['val'] <= 0.02 else 'FAIL'}",
            f"- train (window mean): worst {100 * worst['train']:.2f}%: {'within' if worst['train'] <= 0.02 else 'above'} 2%"]
    return out


def t_grad_comm(rows, a):
    runs = {r["run"]: r for r in rows if r.get("kind") == "run"}
    f, b = runs.get("fp32-sums"), runs.get("bf16-sums")
    out = [f"`{a.train}`: the same run with the gradients summed in f32 and in bf16 (rounded to bf16, summed in "
           "bf16, widened back into the f32 gradients), from the same seed on the same batches. Runs (loss.tsv, "
           "log.txt, env.txt): runs/grad-comm/. Bound: the last validation loss with bf16 sums within 0.5% of the "
           "f32 sums'.", ""]
    for name, r in (("fp32-sums", f), ("bf16-sums", b)):
        if not r or r.get("failed"):
            return out + [f"{name}: FAILED: {(r or {}).get('error', 'no run')}", "", "FAIL"]
    out += ["| epoch | train, f32 sums | train, bf16 sums | val, f32 sums | val, bf16 sums | val diff |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    last = None
    for x, y in zip(f["rows"], b["rows"]):
        vf, vb = float(x["val_loss"]), float(y["val_loss"])
        last = (vb - vf) / vf
        out.append(f"| {float(x['epoch']):.3f} | {float(x['train_loss']):.4f} | {float(y['train_loss']):.4f} | "
                   f"{vf:.4f} | {vb:.4f} | {100 * last:+.2f}% |")
    ok = last is not None and abs(last) <= 0.005 and len(f["rows"]) == len(b["rows"])
    tps = [r.get("steps", 0) / r["train_time_s"] if r.get("train_time_s") else None for r in (f, b)]
    out += ["", f"Last evaluation: bf16 sums {100 * (last or 0):+.2f}% against f32 sums: {'PASS' if ok else 'FAIL'} (bound 0.5%)."]
    if all(tps):
        out.append(f"Steps a second (NCCL's transport as the environment left it): f32 sums {tps[0]:.2f}, bf16 sums {tps[1]:.2f}.")
    return out


def t_docs_run(rows, a):
    c = next((r for r in rows if r.get("kind") == "corpus"), {})
    out = [f"Corpus: {c.get('data')} ({c.get('tokens', 0):,} GPT-2 tokens, sha256 {c.get('sha256')}); {c.get('gpus')} GPUs"
           + (f"; stage 3 with {c['stage3_flags']}" if c.get("stage3_flags") else "") + ". GPT-2 124M, T=1024, B=16 a GPU, "
           "lr 6e-4, seed 1337. Runs (loss.tsv, log.txt, env.txt): runs/corpus-run/."]
    for r in (r for r in rows if r.get("kind") == "run"):
        out += ["", f"## {r['run']}", ""]
        if r.get("failed"):
            out.append(f"FAILED: {r.get('error', '')}")
            continue
        cols = [k for k in ("epoch", "step", "train_loss", "val_loss", "tokens_per_s") if k in r["rows"][0]] if r["rows"] else []
        out += ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
        out += ["| " + " | ".join(x[k] for k in cols) + " |" for x in r["rows"]]
        if r.get("loader_wait_s") is not None:
            out += ["", f"Waiting for the data loader: {r['loader_wait_s']:.3f} s of {r['train_time_s']:.1f} s "
                    f"({100 * r['loader_wait_s'] / r['train_time_s']:.3f}% of the run's time; "
                    f"{1e3 * r['loader_wait_s'] / r['steps']:.3f} ms a step)."]
    p = next((r for r in rows if r.get("kind") == "parity"), None)
    if p:
        out += ["", f"Parity: stage 3 on {p['gpus']} GPUs against `stage2_cuda --grad-accum {p['gpus']}`, fp32: "
                + (f"{p['evaluations']} evaluations, worst |difference| {p['worst']:.2e} (bound 1e-3): "
                   f"{'PASS' if p['ok'] else 'FAIL'}" if "worst" in p else f"FAIL ({p.get('error')})")]
    return out


def t_mlp_gpu(rows, a):
    us = lambda r: r["us_per_step"]  # noqa: E731
    out = []
    bench = [r for r in rows if r.get("part") == "bench" and not r.get("failed")]
    best = min((r for r in bench if r["label"].startswith("ours-fused")), key=us, default=None)
    what = {"ours-fused": "fused step, one CUDA graph replay a step", "ours-fused-r2": "the same, again",
            "ours-no-graph": "fused ops launched each step (GPT2_CUDA_GRAPH=0)",
            "ours-generic": "generic autograd step (GPT2_MNIST_FUSED=0)",
            "torch-eager": "PyTorch eager", "torch-compile": 'torch.compile(mode="reduce-overhead")'}
    if bench:
        out += ["## 784->128->128->128->10, batch 32, fp32", "",
                "| run | what | steps | µs/step | steps/s | samples/s | final loss | ours (fused) faster by |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in bench:
            extra = ""
            if r["label"] == "torch-compile":
                extra = (f" ({r.get('graph_breaks', '?')} graph breaks, {r.get('cudagraph_skips', '?')} cudagraph skips, "
                         f"warm-up {r.get('warmup_s', 0):.0f} s)")
            out.append(f"| {r['label']} | {what.get(r['label'], '')}{extra} | {r['steps']} | {us(r):.1f} | "
                       f"{r['steps_per_s']:,.0f} | {r['samples_per_s']:,.0f} | {r['final_loss']:.4f} | "
                       f"{rx(us(r) / us(best) if best else None)} |")
    sweep = [r for r in rows if r.get("part") == "sweep" and not r.get("failed")]
    if sweep:
        def find(label, b, w):
            return next((us(r) for r in sweep if r["label"] == label and r["batch"] == b and r["widths"][1] == w), None)
        out += ["", "## Sweep: batch x three hidden layers of one width, fp32 (µs/step)", "",
                "| batch | width | ours | PyTorch eager | torch.compile | ours faster than eager by | than compile by |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for b in (32, 128, 512):
            for w in (64, 256, 1024):
                o, e, c = (find(l, b, w) for l in ("sweep-ours", "sweep-torch-eager", "sweep-torch-compile"))
                out.append(f"| {b} | {w} | {fmt(o, ',.1f')} | {fmt(e, ',.1f')} | {fmt(c, ',.1f')} | "
                           f"{rx(e / o if e and o else None)} | {rx(c / o if c and o else None)} |")
    curve = next((r for r in rows if r.get("part") == "curve" and not r.get("failed")), None)
    if curve and os.path.exists(curve.get("tsv", "")):
        lines = [l.split("\t") for l in open(curve["tsv"]).read().splitlines()[1:]]
        ours, theirs = [float(l[2]) for l in lines], [float(l[3]) for l in lines]
        settings = json.load(open(os.path.join(curve["trace"], "settings.json")))
        data = "made-up MNIST-shaped images (--synthetic)" if settings.get("synthetic") else "Fashion-MNIST"
        apart = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if abs(x - y) > 1e-4), None)
        win = 100 if len(ours) <= 1000 else 250
        out += ["", "## Loss curve beside PyTorch's, from the same initial weights", "",
                f"One epoch of {data}, {settings['widths']}, batch {settings['batch']}: ours (`mnist --trace`) and "
                "PyTorch eager fp32 (gpu/py/pytorch_mlp.py --trace) on our initial weights, our images step by step and "
                "our learning rates. Every step's losses agree within 1e-4 "
                + (f"up to step {apart}" if apart is not None else "over the whole epoch")
                + f"; the largest difference is {max(abs(x - y) for x, y in zip(ours, theirs)):.2e}. "
                f"Means over windows of {win} steps:", "",
                "| steps | ours | PyTorch | difference |", "| --- | ---: | ---: | ---: |"]
        for k in range(0, len(ours), win):
            x, y = ours[k:k + win], theirs[k:k + win]
            out.append(f"| {k}-{k + len(x) - 1} | {sum(x) / len(x):.4f} | {sum(y) / len(y):.4f} | "
                       f"{(sum(x) - sum(y)) / len(x):+.4f} |")
    mn = [r for r in rows if r.get("part") == "mnist"]
    if mn:
        out += ["", "## Fashion-MNIST, the default MLP (784->256->128->10), 20 epochs, batch 64, fp32", "",
                "| step | test accuracy | training s | samples/s (last epoch) |", "| --- | ---: | ---: | ---: |"]
        for r in mn:
            out.append(f"| {r['path']} | {100 * r['test_accuracy']:.2f}% | {r['elapsed_s']:.1f} | {r['samples_per_s']:,.0f} |")
    return out + failed_lines([r for r in rows if not r["label"].startswith("sweep-torch-compile")] if rows else [])


def t_fp8(rows, a):
    out = []
    speed = [r for r in rows if r.get("kind") == "speed"]
    base = next((r for r in rows if r.get("kind") == "baselines"), {})
    verdicts = []
    if speed:
        out += ["Speed: `stage2_cuda bench` (random tokens; forward, backward, clipping, AdamW; T=1024) in bf16 and "
                "fp8, in turns with PyTorch's torch.compile bf16" + (" and torchao's `convert_to_float8_training` on "
                "the blocks + torch.compile" if base.get("torchao") == "yes" else
                " (torchao did not import here: no PyTorch FP8 baseline ran)") + ". Peak memory: each allocator's "
                "high-water mark (ours: our device allocator's; PyTorch's `max_memory_allocated()`).", "",
                "| model, B | run | tokens/s | vs our bf16 | vs torch.compile bf16 | vs torchao fp8 | peak MiB | memory vs our bf16 |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        targets = {"gpt2": 1.1, "gpt2-large": 1.3}
        for model in dict.fromkeys(r["model"] for r in speed):
            rs = [r for r in speed if r["model"] == model]
            pick = lambda side, p: next((r for r in rs if r["side"] == side and r["precision"] == p
                                         and not r.get("failed")), None)
            ours16, tc16, ao8 = pick("ours", "bf16"), pick("torch", "bf16"), pick("torch", "fp8")
            for r in rs:
                name = {"ours": "ours", "torch": "torch.compile"}[r["side"]] + " " + r["precision"]
                if r["side"] == "torch" and r["precision"] == "fp8":
                    name = "torchao fp8 + torch.compile"
                if r.get("failed"):
                    out.append(f"| {model}, {r['batch']} | {name} | FAILED | | | | | |")
                    continue
                mine = r["side"] == "ours"
                out.append(f"| {model}, {r['batch']} | {name} | {r['tokens_per_s']:,.0f} | "
                           f"{rx(ratio(r, ours16), 3) if mine and r is not ours16 else ''} | "
                           f"{rx(ratio(r, tc16), 3) if mine else ''} | {rx(ratio(r, ao8), 3) if mine and ao8 else ''} | "
                           f"{r['peak_device_mb']:,.0f} | "
                           f"{rx(ratio(r, ours16, 'peak_device_mb'), 3) if mine and r is not ours16 else ''} |")
            ours8 = pick("ours", "fp8")
            if ours8 and ours16 and model in targets:
                x, mem = ratio(ours8, ours16), ratio(ours8, ours16, "peak_device_mb")
                verdicts.append(f"- {model}: fp8 {x:.3f}x our bf16 (target {targets[model]}x): "
                                f"{'PASS' if x >= targets[model] else 'FAIL'}; memory {mem:.3f}x bf16's: "
                                f"{'PASS' if mem <= 1.0 else 'FAIL'}")
        out += [""] + verdicts + [""]
    runs = {r["run"]: r for r in rows if r.get("kind") == "run"}
    if runs:
        f, b = runs.get("fp8"), runs.get("bf16")
        out += [f"Loss: `{a.train}`, the same run in bf16 and in fp8 from the same seed on the same batches "
                "(evaluation reads the bf16 weight copy in both). Runs (loss.tsv, log.txt, env.txt): runs/fp8/. "
                "Bounds: fp8's validation loss within 2% of bf16's at every evaluation, within 1% at the last.", ""]
        for name, r in (("bf16", b), ("fp8", f)):
            if not r or r.get("failed"):
                return out + [f"{name}: FAILED: {(r or {}).get('error', 'no run')}", "", "FAIL"]
        out += ["| epoch | train, bf16 | train, fp8 | val, bf16 | val, fp8 | val diff |",
                "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        worst, last = 0.0, None
        for x, y in zip(b["rows"], f["rows"]):
            vb, vf = float(x["val_loss"]), float(y["val_loss"])
            last = (vf - vb) / vb
            worst = max(worst, abs(last))
            out.append(f"| {float(x['epoch']):.3f} | {float(x['train_loss']):.4f} | {float(y['train_loss']):.4f} | "
                       f"{vb:.4f} | {vf:.4f} | {100 * last:+.2f}% |")
        ok = last is not None and len(b["rows"]) == len(f["rows"])
        tps = [r.get("steps", 0) / r["train_time_s"] if r.get("train_time_s") else None for r in (b, f)]
        out += ["", f"- every evaluation: worst {100 * worst:.2f}% (bound 2%): {'PASS' if ok and worst <= 0.02 else 'FAIL'}",
                f"- last evaluation: {100 * (last or 0):+.2f}% (bound 1%): {'PASS' if ok and abs(last) <= 0.01 else 'FAIL'}"]
        if all(tps):
            out.append(f"- steps a second over the whole run (evaluations included): bf16 {tps[0]:.2f}, fp8 {tps[1]:.2f}")
    return out


TABLES = {
    "gpu-check": ("GPU tests and determinism", t_gpu_check),
    "gpu-bench": ("Training speed on one GPU against PyTorch", t_gpu_bench),
    "gpu-memory": ("Peak GPU memory against torch.compile", t_gpu_memory),
    "gpu-bench-ab": ("Training speed: build B against build A, alternating", t_gpu_bench_ab),
    "scaling": ("Weak scaling on several GPUs against PyTorch DDP", t_scaling),
    "kernel-bench": ("Kernels alone against PyTorch's ops", t_kernel_bench),
    "generate": ("Generation against Hugging Face", t_generate),
    "train-vs-pytorch": ("Training loss per step against PyTorch, fp32", t_train_vs_pytorch),
    "docs-run": ("GPT-2 124M on the docs corpus", t_docs_run),
    "grad-comm": ("bf16 gradient sums against f32 sums: the loss", t_grad_comm),
    "fp8": ("FP8 training against bf16 on one GPU", t_fp8),
    "mlp-gpu": ("The MLP on one GPU against PyTorch", t_mlp_gpu),
}


def table(name, a):
    title, make = TABLES[name]
    m = json.load(open(a.machine))
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    text = [f"# {title}", "", f"Written by `{a.cmd}`.", "", machine_info.markdown(m), ""] + make(rows, a)
    with open(a.md, "w") as f:
        f.write("\n".join(text).rstrip() + "\n")
    with open(a.json, "w") as f:
        json.dump({"table": name, "command": a.cmd, "machine": m, "rows": rows}, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd_name", required=True)
    p = sub.add_parser("row"); p.add_argument("out"); p.add_argument("log"); p.add_argument("status")
    p.add_argument("pairs", nargs="*"); p.set_defaults(fn=cmd_row)
    p = sub.add_parser("testrow"); p.add_argument("log"); p.add_argument("name"); p.add_argument("status")
    p.add_argument("note", nargs="?", default=""); p.set_defaults(fn=cmd_testrow)
    p = sub.add_parser("determinism"); p.add_argument("dir1"); p.add_argument("dir2"); p.add_argument("stage")
    p.add_argument("precision"); p.set_defaults(fn=cmd_determinism)
    p = sub.add_parser("smi"); p.add_argument("csv"); p.add_argument("phase"); p.set_defaults(fn=cmd_smi)
    p = sub.add_parser("dumprow"); p.add_argument("meta"); p.add_argument("label"); p.add_argument("pairs", nargs="*")
    p.set_defaults(fn=cmd_dumprow)
    p = sub.add_parser("convergerows"); p.add_argument("fp32"); p.add_argument("bf16"); p.set_defaults(fn=cmd_convergerows)
    p = sub.add_parser("lossrows"); p.add_argument("dir"); p.set_defaults(fn=cmd_lossrows)
    p = sub.add_parser("parity"); p.add_argument("a"); p.add_argument("b"); p.add_argument("n"); p.set_defaults(fn=cmd_parity)
    p = sub.add_parser("mnistrow"); p.add_argument("tsv"); p.add_argument("path"); p.set_defaults(fn=cmd_mnistrow)
    p = sub.add_parser("ncu"); p.add_argument("csv"); p.add_argument("precision"); p.set_defaults(fn=cmd_ncu)
    for name in TABLES:
        p = sub.add_parser(name)
        for opt in ("--machine", "--rows", "--cmd", "--md", "--json"):
            p.add_argument(opt, required=True)
        p.add_argument("--gpus", type=int, default=0)
        p.add_argument("--a", default="A")
        p.add_argument("--b", default="B")
        p.add_argument("--train", default="")
        p.add_argument("--train2", default="")
        p.set_defaults(fn=lambda a, name=name: table(name, a))
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tables (markdown) and plot data (TSV) of the benchmark suite, from the JSON lines the
stage binaries print. Standard library only. Called by results/bench-suite.sh (the CPU
suite, `make bench`):

  bench_tables.py matmul MACHINE LABEL=FILE.jsonl...        bench --kernels rows
  bench_tables.py threads MACHINE FILE.jsonl OUT.tsv        bench rows with "threads", "round"
  bench_tables.py train MACHINE FILE.jsonl                  train runs: "label", "dir", "wall_s"
  bench_tables.py allreduce MACHINE FILE.jsonl OUT.tsv      bench --allreduce rows
  bench_tables.py zero MACHINE FILE.jsonl                   stage 1 bench rows with "zero", "round"
  bench_tables.py stages MACHINE LABEL=DIR...               the four stages' runs (item 4)

MACHINE is results/describe-machine.sh's line, with any note on the load after it.
"""
import json
import statistics
import sys


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def spread(values, fmt):
    """median (min–max) of several values, one value as it is."""
    v = sorted(values)
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])}–{fmt.format(v[-1])})"


PRODUCTS = [
    ("qkv", "qkv, C→3C"),
    ("attproj", "attention projection, C→C"),
    ("fc", "fc, C→4C"),
    ("fcproj", "fc projection, 4C→C"),
    ("lm_head", "LM head, C→Vp (no bias)"),
]


def matmul(machine, specs):
    runs = []
    for spec in specs:
        label, path = spec.split("=", 1)
        rows = [r for r in read_jsonl(path) if r.get("kind") == "matmul"]
        if rows:
            runs.append((label, {r["op"]: r for r in rows}))
    if not runs:
        print("(no matrix-product rows)")
        return
    print("## Matrix products: GPT-2 124M's, forward and backward\n")
    print(f"Measured on: {machine}.\n")
    any_run = runs[0][1]
    tokens = any_run["qkv_fwd"]["shape"].split("x")[0]
    print(
        f"`bench --kernels --matmul-only` ({tokens} tokens a row, B·T): each product through the Backend "
        "methods the model calls, forward `matmul_forward` with the bias (the LM head has none), backward "
        "`matmul_backward` (input, weight and bias gradients); FLOP 2·M·K·N forward, twice that backward. "
        "Milliseconds per call: the median of 5 timed batches. The ceiling is a square product "
        "(`matmul_forward`, no bias) timed first in the same process on the same backend; "
        "\"of ceiling\" is each row's rate over its rate. The last row adds a whole step's products "
        "(12 layers' four, and the LM head once) at this token count.\n"
    )
    head = "| product | M×K×N | pass |"
    rule = "| --- | --- | --- |"
    for label, _ in runs:
        head += f" {label} ms | {label} GFLOP/s | {label} of ceiling |"
        rule += " ---: | ---: | ---: |"
    print(head)
    print(rule)

    def cells(rows_of, op):
        r = rows_of.get(op)
        if r is None:
            return " – | – | – |"
        peak = rows_of["matmul_peak"]
        rate = r["flop"] / r["ms"] / 1e6
        ceiling = peak["flop"] / peak["ms"] / 1e6
        return f" {r['ms']:.3f} | {rate:,.0f} | {100 * rate / ceiling:.0f}% |"

    peak_shape = any_run["matmul_peak"]["shape"]
    line = f"| ceiling: square product | {peak_shape} | fwd |"
    for _, rows_of in runs:
        line += cells(rows_of, "matmul_peak")
    print(line)
    for key, name in PRODUCTS:
        for p in ("fwd", "bwd"):
            op = f"{key}_{p}"
            line = f"| {name} | {any_run[op]['shape']} | {p} |"
            for _, rows_of in runs:
                line += cells(rows_of, op)
            print(line)
    line = "| a step's products (12 × 4 + LM head) | | fwd + bwd |"
    for _, rows_of in runs:
        ops = [f"{k}_{p}" for k, _ in PRODUCTS for p in ("fwd", "bwd")]
        if not all(o in rows_of for o in ops):
            line += " – | – | – |"
            continue
        weight = lambda o: 1 if o.startswith("lm_head") else 12
        ms = sum(weight(o) * rows_of[o]["ms"] for o in ops)
        flop = sum(weight(o) * rows_of[o]["flop"] for o in ops)
        peak = rows_of["matmul_peak"]
        rate, ceiling = flop / ms / 1e6, peak["flop"] / peak["ms"] / 1e6
        line += f" {ms:.2f} | {rate:,.0f} | {100 * rate / ceiling:.0f}% |"
    print(line)
    # The other kernels, where the file has them (the CPU suite runs the whole bench).
    for label, _ in runs:
        path = dict(s.split("=", 1) for s in specs)[label]
        others = [r for r in read_jsonl(path) if r.get("kind") == "kernel"]
        if not others:
            continue
        print(f"\n### The other kernels ({label}), the same run\n")
        print("Attention at those of T = 512, 1024, 2048 that the row's tokens hold (B = tokens / T), "
              "cross-entropy over tokens / 2 rows; rates are FLOP/s for products, bytes/s (the fewest the "
              "op must move) for the rest. `ours-unfused`: the same computation without the fusion.\n")
        print("| impl | op | shape | ms | rate |")
        print("| --- | --- | --- | ---: | ---: |")
        for r in others:
            if r.get("flop"):
                rate = f"{r['flop'] / r['ms'] / 1e6:,.0f} GFLOP/s"
            elif r.get("bytes"):
                rate = f"{r['bytes'] / r['ms'] / 1e6:,.1f} GB/s"
            else:
                rate = "–"
            print(f"| {r['impl']} | {r['op']} | {r['shape']} | {r['ms']:.3f} | {rate} |")


def threads(machine, path, tsv):
    rows = read_jsonl(path)
    by = {}
    for r in rows:
        by.setdefault(r["threads"], []).append(r)
    if not by:
        print("(no thread-scaling rows)")
        return
    r0 = rows[0]
    rounds = max(r.get("round", 1) for r in rows)
    print("## CPU thread scaling: a GPT-2 124M training step, stage 0\n")
    print(f"Measured on: {machine}.\n")
    print(
        f"`stage0_serial bench --model gpt2 --batch {r0['batch']} --seq-len {r0['seq_len']} --steps {r0['steps']} "
        f"--threads N` (forward, backward, AdamW with clipping on random tokens, after a warm-up step); "
        f"{rounds} round(s), the thread counts in turns within each; median (min–max) over the rounds. "
        "Speed-up: the 1-thread row's median s/step over this row's; efficiency: speed-up / threads.\n"
    )
    print("| threads | s/step | tokens/s | GFLOP/s | speed-up vs 1 thread | efficiency |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    base = statistics.median(r["ms_per_step"] for r in by.get(1, by[min(by)]))
    base_threads = 1 if 1 in by else min(by)
    out = ["threads\tspeedup\tideal"]
    for t in sorted(by):
        rs = by[t]
        s = [r["ms_per_step"] / 1e3 for r in rs]
        up = base / statistics.median(r["ms_per_step"] for r in rs)
        ideal = t / base_threads
        print(
            f"| {t} | {spread(s, '{:.2f}')} | {statistics.median(r['tokens_per_s'] for r in rs):,.0f} | "
            f"{statistics.median(r['gflops'] for r in rs):,.0f} | {up:.2f}× | {100 * up / ideal:.0f}% |"
        )
        out.append(f"{t}\t{up:.4f}\t{ideal}")
    with open(tsv, "w") as f:
        f.write("\n".join(out) + "\n")


def train(machine, path):
    rows = read_jsonl(path)
    if not rows:
        print("(no training runs)")
        return
    print("## End-to-end training throughput, per preset and stage\n")
    print(f"Measured on: {machine}.\n")
    print(
        "`train` on the bundled corpus (`data/tinyshakespeare.txt`) for a fixed number of steps, evaluated "
        "once at the end, no sample. Step tokens/s: the run's own figure (`summary.json`: tokens over "
        "the time inside training steps, data loading included); wall: the whole process "
        "(start-up, tokenizer, evaluation and checkpoint included). Speed-up: stage 0's s/step of the "
        "same preset over this row's.\n"
    )
    print("| preset | stage | ranks × threads | batch × seq | steps | s/step | step tokens/s | wall (s) | wall tokens/s | speed-up vs stage 0 |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = {}
    for r in rows:
        s = json.load(open(f"{r['dir']}/summary.json"))
        tokens = s["batch"] * s["seq_len"] * s["steps"]
        step_s = s["batch"] * s["seq_len"] / s["train_tokens_per_s"]
        if r["stage"] == "0":
            base[r["preset"]] = step_s
        up = f"{base[r['preset']] / step_s:.2f}×" if r["preset"] in base else "–"
        print(
            f"| {r['preset']} | {r['stage']} | {s['ranks']} × {r['threads']} | {s['batch']} × {s['seq_len']} | "
            f"{s['steps']} | {step_s:.3f} | {s['train_tokens_per_s']:,.0f} | {r['wall_s']:.1f} | "
            f"{tokens / r['wall_s']:,.0f} | {up} |"
        )


def allreduce(machine, path, tsv):
    rows = read_jsonl(path)
    if not rows:
        print("(no all-reduce rows)")
        return
    comm = "NCCL, device memory" if "NVIDIA" in rows[0]["device"] or "H100" in rows[0]["device"] else "MPI (MPICH), host memory"
    print(f"## All-reduce bandwidth against message size: {comm}\n")
    print(f"Measured on: {machine}.\n")
    print(
        "`bench --allreduce` (the stage's own communicator): blocking sums of f32 buffers, the mean "
        "over the timed calls after warm-up ones, in nccl-tests' conventions: algbw = bytes / time, "
        "busbw = algbw × 2(n-1)/n (what each link carries in a ring of n ranks). Of peak: this row's "
        "busbw over the largest busbw of its rank count.\n"
    )
    print("| ranks | bytes | time (µs) | algbw (GB/s) | busbw (GB/s) | of peak busbw |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    peak = {}
    for r in rows:
        peak[r["ranks"]] = max(peak.get(r["ranks"], 0), r["busbw_gb_s"])
    out = ["bytes\tbusbw_gb_s\tranks"]
    for r in rows:
        print(
            f"| {r['ranks']} | {r['bytes']:,} | {r['time_us']:,.0f} | {r['algbw_gb_s']:.2f} | "
            f"{r['busbw_gb_s']:.2f} | {100 * r['busbw_gb_s'] / peak[r['ranks']]:.0f}% |"
        )
        out.append(f"{r['bytes']}\t{r['busbw_gb_s']:.4f}\t{r['ranks']} ranks")
    with open(tsv, "w") as f:
        f.write("\n".join(out) + "\n")


def stages(machine, specs):
    runs = []
    for spec in specs:
        label, d = spec.split("=", 1)
        try:
            s = json.load(open(f"{d}/summary.json"))
            lines = [l.rstrip("\n").split("\t") for l in open(f"{d}/loss.tsv")]
        except OSError:
            runs.append((label, None, None))
            continue
        rows = [dict(zip(lines[0], l)) for l in lines[1:]]
        runs.append((label, s, rows))
    print("## The four stages on GPT-2 124M: time per step and per epoch\n")
    print(f"Measured on: {machine}.\n")
    ok = [(l, s, rows) for l, s, rows in runs if s]
    if ok:
        s = ok[0][1]
        print(
            f"GPT-2 124M ({s['params']:,} parameters), global batch {s['batch']} × {s['seq_len']} tokens, "
            "same seed, data and settings for every stage, evaluated at each epoch's end. s/step: the "
            "time inside training steps, from each epoch's `loss.tsv` row (its tokens/s), the median over "
            "the epochs after the first (the first holds the warm-up: allocation, CUDA graph recording), "
            "which is also shown alone; s/epoch: s/step times the steps of an epoch; wall s/epoch: the "
            "clock between consecutive epoch-end rows (evaluation included), median; total: the run's "
            "time in steps (`summary.json`).\n"
        )
    print("| stage | device | ranks | steps/epoch | s/step | first epoch s/step | s/epoch | wall s/epoch | total s | tokens/s | final val loss |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    step_s = {}
    for label, s, rows in runs:
        if not s:
            print(f"| {label} | not run or failed | | | | | | | | | |")
            continue
        tokens = s["batch"] * s["seq_len"]
        rates = [float(r["tokens_per_s"]) for r in rows]
        per_step = tokens / statistics.median(rates[1:] or rates)
        step_s[label] = per_step
        epochs = float(rows[-1]["epoch"])
        spe = s["steps"] / epochs if epochs > 0 else float("nan")
        el = [float(r["elapsed_s"]) for r in rows]
        wall = statistics.median(b - a for a, b in zip(el, el[1:])) if len(el) > 1 else float("nan")
        print(
            f"| {label} | {s['device']} | {s['ranks']} | {spe:.0f} | {per_step:.4f} | {tokens / rates[0]:.4f} | "
            f"{per_step * spe:.3f} | {wall:.3f} | {s['train_time_s']:.1f} | {tokens / per_step:,.0f} | "
            f"{s['final_val_loss']:.4f} |"
        )
    labels = [l for l, _, _ in runs]
    if len(labels) == 4:
        print("\nPairwise speed-ups (the earlier stage's s/step over the later's):\n")
        print("| from → to | speed-up |")
        print("| --- | ---: |")
        for a, b, name in ((0, 1, "serial → MPI"), (0, 2, "serial → CUDA"), (2, 3, "CUDA → MPI+CUDA")):
            la, lb = labels[a], labels[b]
            if la in step_s and lb in step_s:
                print(f"| {name} ({la} → {lb}) | {step_s[la] / step_s[lb]:.2f}× |")
            else:
                print(f"| {name} ({la} → {lb}) | – |")


def zero(machine, path):
    rows = read_jsonl(path)
    if not rows:
        print("(no ZeRO rows)")
        return
    rounds = max(r.get("round", 1) for r in rows)
    print("## ZeRO-1 on the CPU: stage 1's step with `--zero 0` and `--zero 1`\n")
    print(f"Measured on: {machine}.\n")
    print(
        f"`mpirun -n {rows[0]['ranks']} stage1_mpi bench --threads 1 --zero Z` on random tokens (forward, backward, "
        f"the gradient sums, AdamW); {rounds} round(s), `--zero 0` and `--zero 1` in turns within each; "
        "median (min–max) over the rounds. Communication: the time inside MPI calls (waiting included). "
        "`--zero 1 / 0`: the ratio of the medians' ms/step (above 1: ZeRO-1 is slower).\n"
    )
    print("| model (batch × seq-len a rank) | `--zero` | ms/step | of which communication, ms | AdamW state a rank, MiB | `--zero 1 / 0` |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    models = []
    for r in rows:
        key = (r["model"], r["batch"], r["seq_len"])
        if key not in models:
            models.append(key)
    for key in models:
        by = {z: [r for r in rows if (r["model"], r["batch"], r["seq_len"]) == key and r["zero"] == z] for z in (0, 1)}
        med = {z: statistics.median(r["ms_per_step"] for r in rs) for z, rs in by.items() if rs}
        for z, rs in by.items():
            if not rs:
                continue
            ratio = f"{med[1] / med[0]:.2f}" if z == 1 and 0 in med else ""
            print(
                f"| {key[0]} ({key[1]} × {key[2]}) | {z} | {spread([r['ms_per_step'] for r in rs], '{:.1f}')} | "
                f"{spread([r['comm_ms_per_step'] for r in rs], '{:.1f}')} | {rs[0]['optimizer_state_mb']:.0f} | {ratio} |"
            )


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    what, machine, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if what == "matmul":
        matmul(machine, rest)
    elif what == "threads":
        threads(machine, rest[0], rest[1])
    elif what == "train":
        train(machine, rest[0])
    elif what == "allreduce":
        allreduce(machine, rest[0], rest[1])
    elif what == "zero":
        zero(machine, rest[0])
    elif what == "stages":
        stages(machine, rest)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

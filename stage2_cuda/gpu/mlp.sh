#!/usr/bin/env bash
# The MLP workload on one GPU (issue 13, item 2 and its GPU targets), in one device call:
#   tests   the fused step's GPU tests (common/tests/cuda_mlp.rs: against the generic step on the
#           GPU, against the CPU, replayed against queued bit for bit, bf16) and GPT-2's replay
#           test (the Recorder it now shares with the MLP)
#   bench   784→128→128→128→10, batch 32, 5000 steps, fp32: ours (fused, one CUDA graph replay a
#           step) against PyTorch eager and torch.compile(mode="reduce-overhead") in the same call,
#           with our ablations (ops queued without the graph, ReLU not in the epilogue, cuBLAS for
#           every product, the generic autograd step)
#   sweep   batch 32, 128, 512 × three hidden layers of 64, 256, 1024: ours, eager, compiled
#           (the compiled sweep is cut at SWEEP_COMPILE_S seconds, 150 by default: Inductor
#           compiles every shape; shapes it did not reach show as "—")
#   curve   the loss curve beside PyTorch's from our initial weights, images and learning rates,
#           one epoch at batch 32 (Fashion-MNIST when data/fashion-mnist/*.gz came with the build,
#           else made-up data, which is learnt within a hundred steps)
#   mnist   the default MLP for 20 epochs on Fashion-MNIST (when carried): test accuracy and time,
#           fused against the generic step
#   profile (not in the default set) each kernel of the fused step (Nsight Compute's duration,
#           three steps queued without the graph): where the step's time goes, launch gaps aside
# Writes $OUT/mlp.md (the tables, with ratios, the device named) and the raw JSON lines beside it.
# Run from the project root after `../shared/gpu/bundle.sh` (carry .gpu/ and data/fashion-mnist/):
#   stage2_cuda/gpu/mlp.sh [tests] [bench] [sweep] [curve] [mnist] [profile]
#   (default: tests bench sweep curve mnist, about 6 min on an H100)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${*:-tests bench sweep curve mnist}
want() { [[ " $parts " == *" $1 "* ]]; }
source "$here/cuda-env.sh" >/dev/null
export PYTHONUNBUFFERED=1 REQUIRE_NVRTC=1
machine=$(results/describe-machine.sh 2>/dev/null || nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "machine: $machine"; echo "$machine" >"$OUT/machine.txt"
torch_py="$here/pytorch_mlp.py"
fm=data/fashion-mnist
files=()
if [ -f $fm/train-images-idx3-ubyte.gz ]; then
  files=(--train-images $fm/train-images-idx3-ubyte.gz --train-labels $fm/train-labels-idx1-ubyte.gz
         --test-images $fm/t10k-images-idx3-ubyte.gz --test-labels $fm/t10k-labels-idx1-ubyte.gz)
fi
mlp=(--precision fp32 --batch 32 --hidden 128,128,128)
rc=0

# One timing: label, then the command; its JSON lines go to $OUT/mlp-bench.jsonl with the label.
run_json() {
  local label=$1 limit=$2; shift 2
  echo "== $label: $*"
  timeout "$limit" "$@" 2>"$OUT/$label.log" | python3 -c "
import json, sys
for line in sys.stdin:
    if line.startswith('{'):
        r = json.loads(line); r['label'] = '$label'; print(json.dumps(r)); sys.stdout.flush()" \
    | tee -a "$OUT/mlp-bench.jsonl"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "   $label FAILED or cut (log tail below)"; tail -3 "$OUT/$label.log"; }
}

if want tests; then
  for t in /tmp/gpu-rt/tests/cuda_mlp-*; do
    timeout 240 "$t" --include-ignored --nocapture --test-threads 1 >>"$OUT/mlp-tests.log" 2>&1 || rc=1
  done
  for t in /tmp/gpu-rt/tests/cuda_model-*; do
    timeout 120 "$t" --include-ignored --nocapture replayed_steps_equal >>"$OUT/mlp-tests.log" 2>&1 || rc=1
  done
  grep -E "^test |MLP-PARITY|REPLAY|panicked|test result" "$OUT/mlp-tests.log"
fi

if want bench; then
  steps=(--steps 5000 --warmup 200)
  run_json ours-fused 60 stage2_cuda mnist --bench "${mlp[@]}" "${steps[@]}"
  run_json torch-eager 120 python3 "$torch_py" --batch 32 --hidden 128,128,128 "${steps[@]}"
  run_json torch-compile 240 python3 "$torch_py" --compile --batch 32 --hidden 128,128,128 "${steps[@]}"
  run_json ours-fused-r2 60 stage2_cuda mnist --bench "${mlp[@]}" "${steps[@]}"
  run_json ours-no-graph 60 env GPT2_CUDA_GRAPH=0 stage2_cuda mnist --bench "${mlp[@]}" "${steps[@]}"
  run_json ours-relu-unfused 60 env GPT2_CUDA_RELU=unfused stage2_cuda mnist --bench "${mlp[@]}" "${steps[@]}"
  run_json ours-tiles-never 60 env GPT2_CUDA_MLP_TILES=never stage2_cuda mnist --bench "${mlp[@]}" "${steps[@]}"
  run_json ours-generic 120 env GPT2_MNIST_FUSED=0 stage2_cuda mnist --bench "${mlp[@]}" --steps 1000 --warmup 50
fi

if want sweep; then
  run_json sweep-ours 120 stage2_cuda mnist --bench --sweep --precision fp32 --steps 1000 --warmup 100
  run_json sweep-ours-tiles-never 120 env GPT2_CUDA_MLP_TILES=never stage2_cuda mnist --bench --sweep --precision fp32 --steps 1000 --warmup 100
  run_json sweep-torch-eager 150 python3 "$torch_py" --sweep --steps 500 --warmup 50
  run_json sweep-torch-compile "${SWEEP_COMPILE_S:-150}" python3 "$torch_py" --sweep --compile --steps 500 --warmup 50
fi

if want curve; then
  rm -rf "$OUT/curve-run"
  data=("${files[@]}"); [ ${#data[@]} = 0 ] && data=(--synthetic)
  echo "== curve: ours, one epoch, ${data[*]:0:1}"
  timeout 120 stage2_cuda mnist "${mlp[@]}" --epochs 1 --trace --out "$OUT/curve-run" "${data[@]}" >"$OUT/curve-ours.log" 2>&1 \
    || { rc=1; echo "curve (ours) FAILED"; tail -3 "$OUT/curve-ours.log"; }
  images=(); [ ${#files[@]} != 0 ] && images=(--images $fm/train-images-idx3-ubyte.gz --labels $fm/train-labels-idx1-ubyte.gz)
  timeout 120 python3 "$torch_py" --trace "$OUT/curve-run/trace" "${images[@]}" --out "$OUT/curve.tsv" >"$OUT/curve.json" 2>"$OUT/curve-torch.log" \
    || { rc=1; echo "curve (torch) FAILED"; tail -3 "$OUT/curve-torch.log"; }
  cat "$OUT/curve.json"
  rm -f "$OUT"/curve-run/trace/*.idx  # the made-up set: 47 MB, made again from its seed
fi

if want profile; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -x "$ncu" ]; then
    GPT2_CUDA_GRAPH=0 timeout 180 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
      "$(command -v stage2_cuda)" mnist --bench "${mlp[@]}" --steps 3 --warmup 0 >"$OUT/mlp-profile.csv" 2>"$OUT/mlp-profile.log" \
      || { rc=1; echo "profile FAILED"; tail -3 "$OUT/mlp-profile.log"; }
  else
    echo "profile: ncu not found"
  fi
fi

if want mnist && [ ${#files[@]} != 0 ]; then
  for path in fused generic; do
    env_=(); [ $path = generic ] && env_=(GPT2_MNIST_FUSED=0)
    echo "== mnist, 20 epochs, $path"
    timeout 150 env "${env_[@]}" stage2_cuda mnist --precision fp32 "${files[@]}" --epochs 20 --out "$OUT/mnist-$path" \
      >"$OUT/mnist-$path.log" 2>&1 || { rc=1; echo "mnist $path FAILED"; }
    tail -1 "$OUT/mnist-$path.log"
  done
fi

python3 - "$OUT" "$machine" >"$OUT/mlp.md" <<'PY'
import json, os, sys
out, machine = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{out}/mlp-bench.jsonl")] if os.path.exists(f"{out}/mlp-bench.jsonl") else []
print("# The MLP on one GPU: the fused step against PyTorch\n")
print(f"Written by `stage2_cuda/gpu/mlp.sh`. Measured on: {machine}.\n")
def us(r): return r["us_per_step"]
def fmt(x, d=1): return "—" if x is None else f"{x:,.{d}f}"
head = [r for r in rows if r["label"] in ("ours-fused", "ours-fused-r2", "ours-no-graph", "ours-relu-unfused",
                                            "ours-tiles-never", "ours-generic", "torch-eager", "torch-compile")]
if head:
    best = min((r for r in head if r["label"].startswith("ours-fused")), key=us, default=None)
    print("## 784→128→128→128→10, batch 32, fp32, steps timed after warm-up\n")
    print("| run | what | steps | µs/step | steps/s | samples/s | final loss | ours (fused) × faster |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    what = {"ours-fused": "fused step, one CUDA graph replay a step", "ours-fused-r2": "the same, again",
            "ours-no-graph": "fused ops queued each step (GPT2_CUDA_GRAPH=0)",
            "ours-relu-unfused": "ReLU in its own kernel (GPT2_CUDA_RELU=unfused)",
            "ours-tiles-never": "cuBLAS for every backward product (GPT2_CUDA_MLP_TILES=never)",
            "ours-generic": "generic autograd step (GPT2_MNIST_FUSED=0)",
            "torch-eager": "PyTorch eager", "torch-compile": 'torch.compile(mode="reduce-overhead")'}
    for r in head:
        ratio = us(r) / us(best) if best else None
        extra = f" ({r.get('graph_breaks', '?')} graph breaks, {r.get('cudagraph_skips', '?')} cudagraph skips, batch indexed {r.get('gather')}, warm-up {r.get('warmup_s', 0):.0f} s)" if r["label"] == "torch-compile" else ""
        print(f"| {r['label']} | {what[r['label']]}{extra} | {r['steps']} | {us(r):.1f} | {r['steps_per_s']:,.0f} | {r['samples_per_s']:,.0f} | {r['final_loss']:.4f} | {fmt(ratio, 2)} |")
    eager = next((r for r in head if r["label"] == "torch-eager"), None)
    comp = next((r for r in head if r["label"] == "torch-compile"), None)
    if best:
        t = []
        if eager: t.append(f"{us(eager) / us(best):.2f}× PyTorch eager (target ≥ 5×: {'met' if us(eager) / us(best) >= 5 else 'NOT met'})")
        if comp: t.append(f"{us(comp) / us(best):.2f}× torch.compile (target ≥ 1.5×: {'met' if us(comp) / us(best) >= 1.5 else 'NOT met'})")
        print(f"\nOurs (the faster of the two fused runs): {'; '.join(t)}. PyTorch {(eager or comp or {}).get('torch', '?')}.\n")
sweep = [r for r in rows if r["label"].startswith("sweep-")]
if sweep:
    print("## Sweep: batch × three hidden layers of one width, fp32 (µs/step; ours ÷ theirs as speed-ups)\n")
    print("| batch | width | ours | ours, cuBLAS only | PyTorch eager | torch.compile | × eager | × compile |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    def find(label, b, w):
        return next((us(r) for r in sweep if r["label"] == label and r["batch"] == b and r["widths"][1] == w), None)
    for b in (32, 128, 512):
        for w in (64, 256, 1024):
            o, n, e, c = (find(l, b, w) for l in ("sweep-ours", "sweep-ours-tiles-never", "sweep-torch-eager", "sweep-torch-compile"))
            print(f"| {b} | {w} | {fmt(o)} | {fmt(n)} | {fmt(e)} | {fmt(c)} | {fmt(e / o if e and o else None, 2)} | {fmt(c / o if c and o else None, 2)} |")
    print()
if os.path.exists(f"{out}/curve.tsv"):
    lines = [l.split("\t") for l in open(f"{out}/curve.tsv").read().splitlines()[1:]]
    ours = [float(l[2]) for l in lines]; torch_ = [float(l[3]) for l in lines]
    summary = json.load(open(f"{out}/curve.json")) if os.path.getsize(f"{out}/curve.json") else {}
    settings = json.load(open(f"{out}/curve-run/trace/settings.json"))
    data = "made-up MNIST-shaped images (--synthetic)" if settings.get("synthetic") else "Fashion-MNIST"
    apart = next((i for i, (a, b) in enumerate(zip(ours, torch_)) if abs(a - b) > 1e-4), None)
    win = 100 if len(ours) <= 1000 else 250
    print(f"## Loss curve beside PyTorch's, from the same initial weights\n")
    print(f"One epoch of {data}, {settings['widths']}, batch {settings['batch']}, SGD momentum {settings['momentum']:.1f}, "
          f"lr {settings['lr']:.3g} along a cosine: ours (`mnist --trace`, {settings['device']}) and PyTorch eager fp32 "
          f"(pytorch_mlp.py --trace) on our initial weights, our images step by step and our learning rates. "
          f"Every step's losses agree within 1e-4 " + (f"up to step {apart}" if apart is not None else "over the whole epoch") +
          f"; the largest difference over the epoch is {max(abs(a - b) for a, b in zip(ours, torch_)):.2e} "
          f"(rounding differences grow once training amplifies them). Means over windows of {win} steps:\n")
    print("| steps | ours | PyTorch | difference |")
    print("| --- | ---: | ---: | ---: |")
    for k in range(0, len(ours), win):
        a, b = ours[k:k + win], torch_[k:k + win]
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        print(f"| {k}–{k + len(a) - 1} | {ma:.4f} | {mb:.4f} | {ma - mb:+.4f} |")
    print()
if os.path.exists(f"{out}/mlp-profile.csv") and os.path.getsize(f"{out}/mlp-profile.csv"):
    import csv, collections
    rows_ = [r for r in csv.reader(l for l in open(f"{out}/mlp-profile.csv") if l.startswith('"'))]
    if rows_:
        head_, body = rows_[0], rows_[1:]
        ni, ui, vi = head_.index("Kernel Name"), head_.index("Metric Unit"), head_.index("Metric Value")
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
        total = collections.defaultdict(lambda: [0, 0.0])
        for r in body:
            name = r[ni].split("(")[0].split("<")[0][:70]
            total[name][0] += 1
            total[name][1] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1e-3)
        print("## Where the fused step's time goes (Nsight Compute, 3 steps queued, 784→128→128→128→10, batch 32)\n")
        print("Kernel durations only (ncu runs kernels one at a time: no launch gaps, no overlap); set them beside "
              "the bench's µs/step to see the gaps. Uploads and fills are not kernels: not counted.\n")
        print("| kernel | launches a step | µs a step |")
        print("| --- | ---: | ---: |")
        for name, (n, us_) in sorted(total.items(), key=lambda kv: -kv[1][1]):
            print(f"| `{name}` | {n / 3:.1f} | {us_ / 3:.2f} |")
        print(f"| all | {sum(v[0] for v in total.values()) / 3:.1f} | {sum(v[1] for v in total.values()) / 3:.2f} |\n")
runs = [p for p in ("fused", "generic") if os.path.exists(f"{out}/mnist-{p}/loss.tsv")]
if runs:
    print("## Fashion-MNIST, the default MLP (784→256→128→10), 20 epochs, batch 64, fp32\n")
    print("| step | test accuracy | training s (last row's elapsed_s) | samples/s (last epoch) |")
    print("| --- | ---: | ---: | ---: |")
    for p in runs:
        last = open(f"{out}/mnist-{p}/loss.tsv").read().splitlines()[-1].split("\t")
        print(f"| {p} | {100 * float(last[3]):.2f}% | {float(last[5]):.1f} | {float(last[4]):,.0f} |")
    print()
PY
cat "$OUT/mlp.md"
exit $rc

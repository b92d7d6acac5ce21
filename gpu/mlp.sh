#!/usr/bin/env bash
# The MLP workload on one GPU against PyTorch: step time, a sweep of shapes, the loss curve
# from the same weights, and Fashion-MNIST accuracy.
#
#   gpu/mlp.sh [bench] [sweep] [curve] [mnist]        (default: all four)
#
# bench  784->128->128->128->10, batch 32, fp32, 5000 steps after 200 warm-up ones:
#        `stage2_cuda mnist --bench` (the fused step, one CUDA graph replay a step; twice,
#        to see the spread), op by op (GPT2_CUDA_GRAPH=0) and through the generic autograd
#        step (GPT2_MNIST_FUSED=0, 1000 steps); PyTorch eager and
#        torch.compile(mode="reduce-overhead") (gpu/py/pytorch_mlp.py: the same model, loss,
#        SGD with momentum and a made-up set on the GPU).
# sweep  batch 32, 128, 512 x three hidden layers of 64, 256, 1024: ours, eager, compiled
#        (the compiled sweep is cut after SWEEP_COMPILE_S seconds, default 150: Inductor
#        compiles every shape; shapes it did not reach show as "-").
# curve  our loss curve beside PyTorch's from our initial weights, images and learning rates,
#        one epoch at batch 32 (Fashion-MNIST where data/fashion-mnist/*.gz is present, else
#        made-up data).
# mnist  the default MLP for 20 epochs on Fashion-MNIST (where present): test accuracy and
#        time, the fused step against the generic one.
#
# About 6 min on an H100.
# Writes results/mlp-gpu.md (machine header; µs a step, steps/s, samples/s and ours (fused)
# over each row's time: above 1 means ours is faster; the sweep's speed-ups; the curve's
# window means and largest difference; accuracy and time) and results/mlp-gpu.json.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
parts=()
for a in "$@"; do
  case $a in
    bench|sweep|curve|mnist) parts+=("$a") ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $a (see --help)" ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(bench sweep curve mnist)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
gpu_setup "${args[@]}"
s2=$(gpu_bin stage2_cuda)
torch=yes; gpu_has_torch || { torch=no; gpu_say "PyTorch is not installed: ours only"; }
py=$GPU_PY/pytorch_mlp.py
fm=data/fashion-mnist
files=()
if [ -f $fm/train-images-idx3-ubyte.gz ]; then
  files=(--train-images "$fm/train-images-idx3-ubyte.gz" --train-labels "$fm/train-labels-idx1-ubyte.gz"
         --test-images "$fm/t10k-images-idx3-ubyte.gz" --test-labels "$fm/t10k-labels-idx1-ubyte.gz")
fi
mlp=(--precision fp32 --batch 32 --hidden "128,128,128")
steps=(--steps 5000 --warmup 200)
status=0
ptorch() { [ $torch = yes ] || return 0; gpu_run "$@" || status=1; }

if want bench; then
  gpu_run ours-fused 120 part=bench all_lines=1 -- "$s2" mnist --bench "${mlp[@]}" "${steps[@]}" || status=1
  ptorch torch-eager 300 part=bench all_lines=1 -- python3 "$py" --batch 32 --hidden 128,128,128 "${steps[@]}"
  ptorch torch-compile 400 part=bench all_lines=1 -- python3 "$py" --compile --batch 32 --hidden 128,128,128 "${steps[@]}"
  gpu_run ours-fused-r2 120 part=bench all_lines=1 -- "$s2" mnist --bench "${mlp[@]}" "${steps[@]}" || status=1
  GPT2_CUDA_GRAPH=0 gpu_run ours-no-graph 120 part=bench all_lines=1 -- "$s2" mnist --bench "${mlp[@]}" "${steps[@]}" || status=1
  GPT2_MNIST_FUSED=0 gpu_run ours-generic 300 part=bench all_lines=1 -- "$s2" mnist --bench "${mlp[@]}" --steps 1000 --warmup 50 \
    || status=1
fi
if want sweep; then
  gpu_run sweep-ours 300 part=sweep all_lines=1 -- "$s2" mnist --bench --sweep --precision fp32 --steps 1000 --warmup 100 || status=1
  ptorch sweep-torch-eager 300 part=sweep all_lines=1 -- python3 "$py" --sweep --steps 500 --warmup 50
  # Cut on purpose: the rows it printed before the cut are kept.
  [ $torch = yes ] && { gpu_run sweep-torch-compile "${SWEEP_COMPILE_S:-150}" part=sweep all_lines=1 -- \
    python3 "$py" --sweep --compile --steps 500 --warmup 50 || true; }
fi
if want curve; then
  run=$GPU_LOGS/curve-run
  data=("${files[@]}"); [ ${#data[@]} = 0 ] && data=(--synthetic)
  gpu_say "curve: ours, one epoch (${data[0]})"
  if timeout -k 20 300 "$s2" mnist "${mlp[@]}" --epochs 1 --trace --out "$run" "${data[@]}" >"$GPU_LOGS/curve-ours.log" 2>&1; then
    images=(); [ ${#files[@]} != 0 ] && images=(--images "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz")
    ptorch curve 300 part=curve trace="$run/trace" tsv="$GPU_LOGS/curve.tsv" -- \
      python3 "$py" --trace "$run/trace" "${images[@]}" --out "$GPU_LOGS/curve.tsv"
  else
    status=1; echo "   curve (ours) failed: $GPU_LOGS/curve-ours.log" >&2
  fi
fi
if want mnist; then
  if [ ${#files[@]} = 0 ]; then
    gpu_say "mnist: no $fm/*.gz here: left out"
  else
    for path in fused generic; do
      fused=1; [ $path = generic ] && fused=0
      gpu_say "mnist, 20 epochs, $path"
      GPT2_MNIST_FUSED=$fused timeout -k 20 600 "$s2" mnist --precision fp32 "${files[@]}" --epochs 20 \
        --out "$GPU_LOGS/mnist-$path" >"$GPU_LOGS/mnist-$path.log" 2>&1 || { status=1; echo "   mnist $path failed" >&2; }
      python3 "$GPU_PY/tables.py" mnistrow "$GPU_LOGS/mnist-$path/loss.tsv" "$path" >>"$GPU_ROWS" || true
    done
  fi
fi
gpu_table mlp-gpu
exit $status

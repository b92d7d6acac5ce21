#!/usr/bin/env bash
# Training speed on one GPU against PyTorch, or of one build against another.
#
# Measures `stage2_cuda bench` (GPT-2 on random tokens: forward, backward, clipping, AdamW;
# 3 warm-up steps, then --steps timed ones) beside gpu/py/pytorch_gpt2.py, the same model,
# shapes and optimiser in PyTorch (eager, and torch.compile), alternating in rounds so that
# both sides see the same machine state. Peak memory: ours is the backend's allocation
# high-water mark, PyTorch's torch.cuda.max_memory_allocated().
#
#   gpu/bench.sh            every round (default 2): GPT-2 124M, B=16, T=1024 in bf16 (ours,
#                           torch.compile, eager), tf32 and fp32 (ours, eager); then once:
#                           ours bf16 and tf32 with --recompute, ours bf16 op by op
#                           (GPT2_CUDA_GRAPH=0), and bf16 against torch.compile at GPT-2 medium
#                           B=8, GPT-2 large B=8 and 124M at T=2048 B=8.  ~6 min on an H100.
#   gpu/bench.sh --quick    124M bf16, ours against torch.compile only.  ~2 min.
#   gpu/bench.sh --memory   peak memory and speed, bf16, at GPT-2 124M B=16, gpt2-medium B=8 and
#                           gpt2-large B=8 (T=1024): ours with `--recompute none` and
#                           `--recompute layernorm`, torch.compile, and with BIN_B=DIR build B's
#                           stage2_cuda as it runs by default; rounds (default 1) in turns.
#                           Writes results/gpu-memory.md.  ~5 min a round.
#   BIN_B=DIR gpu/bench.sh --ab [--gpus N] [--precision P]...
#                           build A (the binaries gpu/lib.sh finds) against build B (the
#                           binaries in DIR), 124M in each precision P (default bf16; fp32,
#                           tf32, bf16, fp8), in alternating rounds (default 5; the order flips
#                           every round): stage 2 on one GPU, and where the host has 2 or more
#                           GPUs stage 3 on N (default 2) with its weak scaling (N-GPU tokens/s
#                           over N x the same build's one-GPU tokens/s in the same round).
#                           Prints each round and the median B/A (and A/B) last.
#                           COMMIT_B names build B in the table (else DIR).  ~4 min a precision.
# Options: --rounds N, --steps N (timed steps a run; default 10, 20 with --ab), --no-torch
# (ours only; also where PyTorch is not installed), -h/--help.
#
# Writes results/gpu-bench.md (results/gpu-bench-ab.md with --ab) with the machine header,
# and the raw rows as .json beside it. Reading it: "vs eager" and "vs torch.compile" are
# ours over PyTorch's tokens/s in the same round (above 1: ours faster); "memory" ours over
# PyTorch's peak (below 1: ours smaller); MFU is llm.c's 6N + 6LCT FLOP per token over the
# H100/H200 datasheet dense peak of the precision. In the A/B table B/A above 1 means B is
# faster; rounds spread by about 0.5% on a quiet GPU, so read the median against that.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
mode=full rounds='' steps='' torch=yes ngpus=2 precisions=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) mode=quick ;;
    --ab) mode=ab ;;
    --precision) precisions+=("$2"); shift ;;
    --memory) mode=memory ;;
    --rounds) rounds=$2; shift ;;
    --steps) steps=$2; shift ;;
    --gpus) ngpus=$2; shift ;;
    --no-torch) torch=no ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
[ ${#precisions[@]} -eq 0 ] || [ "$mode" = ab ] || gpu_die "--precision is for --ab (the other modes measure their own)"
for p in "${precisions[@]}"; do
  case $p in fp32|tf32|bf16|fp8) ;; *) gpu_die "--precision $p: expected fp32, tf32, bf16 or fp8" ;; esac
done
[ ${#precisions[@]} -gt 0 ] || precisions=(bf16)
[ "$mode" = ab ] && rounds=${rounds:-5} steps=${steps:-20}
[ "$mode" = memory ] && rounds=${rounds:-1}
rounds=${rounds:-2} steps=${steps:-10}
if [ $torch = yes ] && [ "$mode" != ab ] && ! gpu_has_torch; then
  gpu_say "PyTorch is not installed: ours only"; torch=no
fi
s2=$(gpu_bin stage2_cuda)
torch_py=$GPU_PY/pytorch_gpt2.py
# bench MODEL B T PRECISION: the flags of one benchmark (ours and PyTorch's take the same).
shape() { echo "--model $1 --batch $2 --seq-len $3 --precision $4 --steps $steps --warmup 3"; }
g124=(gpt2 16 1024)
status=0
ours() {  # label round precision [model b t] [extra flags...]: one run of ours
  local label=$1 r=$2 p=$3; shift 3
  local m=("${g124[@]}"); [ $# -ge 3 ] && [[ $1 == gpt2* ]] && { m=("$1" "$2" "$3"); shift 3; }
  local extra=(); [ "${m[2]}" -gt 1024 ] && extra=(--max-seq-len "${m[2]}")
  # shellcheck disable=SC2046
  gpu_run "$label" 300 side=ours round="$r" precision="$p" model="${m[0]}" batch="${m[1]}" seq_len="${m[2]}" -- \
    "$s2" bench $(shape "${m[@]}" "$p") "${extra[@]}" "$@" || status=1
}
theirs() {  # label round precision compile|eager [model b t]
  [ $torch = yes ] || return 0
  local label=$1 r=$2 p=$3 how=$4; shift 4
  local m=("${g124[@]}"); [ $# -ge 3 ] && m=("$1" "$2" "$3")
  local c=(); [ "$how" = compile ] && c=(--compile)
  # shellcheck disable=SC2046
  gpu_run "$label" 400 side="torch-$how" round="$r" precision="$p" model="${m[0]}" batch="${m[1]}" seq_len="${m[2]}" -- \
    python3 "$torch_py" $(shape "${m[@]}" "$p") "${c[@]}" || status=1
}

if [ "$mode" = ab ]; then
  [ -n "${BIN_B:-}" ] || gpu_die "--ab needs BIN_B=DIR, the other build's binaries"
  a_dir=$GPU_BINS b_dir=$(cd "$BIN_B" && pwd)
  gpu_bin stage2_cuda "$b_dir" >/dev/null
  n=$(gpu_count); multi=no
  if [ "$n" -ge 2 ] && [ "$ngpus" -ge 2 ] && [ "$ngpus" -le "$n" ]; then
    multi=yes; gpu_bin stage3_mpi_cuda "$a_dir" >/dev/null; gpu_bin stage3_mpi_cuda "$b_dir" >/dev/null
  else
    gpu_say "stage 2 only: stage 3 on $ngpus GPUs needs that many (nvidia-smi lists $n)"
  fi
  one() {  # build round: each precision
    local dir=$a_dir p; [ "$1" = B ] && dir=$b_dir
    for p in "${precisions[@]}"; do
      # shellcheck disable=SC2046
      gpu_run "$1-1gpu-$p-r$2" 300 build="$1" round="$2" gpus=1 precision="$p" -- \
        "$dir/stage2_cuda" bench $(shape "${g124[@]}" "$p") || status=1
      if [ $multi = yes ]; then
        # shellcheck disable=SC2046
        gpu_run "$1-${ngpus}gpu-$p-r$2" 300 build="$1" round="$2" gpus="$ngpus" precision="$p" -- \
          "${GPU_MPIRUN[@]}" -n "$ngpus" "$dir/stage3_mpi_cuda" bench $(shape "${g124[@]}" "$p") || status=1
      fi
    done
  }
  for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then one A "$r"; one B "$r"; else one B "$r"; one A "$r"; fi
  done
  gpu_table gpu-bench-ab --a "$(gpu_commit) ($a_dir)" --b "${COMMIT_B:-$b_dir} ($b_dir)"
  exit $status
fi

if [ "$mode" = memory ]; then
  b_dir=''; [ -n "${BIN_B:-}" ] && b_dir=$(cd "$BIN_B" && pwd) && gpu_bin stage2_cuda "$b_dir" >/dev/null
  for r in $(seq "$rounds"); do
    for s in "gpt2 16 1024" "gpt2-medium 8 1024" "gpt2-large 8 1024"; do
      read -r m b t <<<"$s"
      for what in none layernorm; do
        # shellcheck disable=SC2046
        gpu_run "ours-$what-$m-r$r" 300 side=ours variant="--recompute $what" round="$r" model="$m" batch="$b" \
          seq_len="$t" -- "$s2" bench $(shape "$m" "$b" "$t" bf16) --recompute "$what" || status=1
      done
      if [ -n "$b_dir" ]; then
        # shellcheck disable=SC2046
        gpu_run "B-$m-r$r" 300 side=ours variant="build B (${COMMIT_B:-$b_dir})" round="$r" model="$m" batch="$b" \
          seq_len="$t" -- "$b_dir/stage2_cuda" bench $(shape "$m" "$b" "$t" bf16) || status=1
      fi
      if [ $torch = yes ]; then
        # shellcheck disable=SC2046
        gpu_run "torch-compile-$m-r$r" 400 side=torch-compile variant=torch.compile round="$r" model="$m" \
          batch="$b" seq_len="$t" -- python3 "$torch_py" $(shape "$m" "$b" "$t" bf16) --compile || status=1
      fi
    done
  done
  gpu_table gpu-memory
  exit $status
fi

for r in $(seq "$rounds"); do
  ours "ours-bf16-r$r" "$r" bf16
  theirs "torch-compile-bf16-r$r" "$r" bf16 compile
  [ $mode = quick ] && continue
  theirs "torch-eager-bf16-r$r" "$r" bf16 eager
  for p in tf32 fp32; do
    ours "ours-$p-r$r" "$r" "$p"
    theirs "torch-eager-$p-r$r" "$r" "$p" eager
  done
done
if [ $mode = full ]; then
  ours ours-bf16-recompute 1 bf16 --recompute
  ours ours-tf32-recompute 1 tf32 --recompute
  GPT2_CUDA_GRAPH=0 ours ours-bf16-no-graph 1 bf16
  for s in "gpt2-medium 8 1024" "gpt2-large 8 1024" "gpt2 8 2048"; do
    read -r m b t <<<"$s"
    tag=$m-b$b-t$t
    ours "ours-bf16-$tag" shape bf16 "$m" "$b" "$t"
    theirs "torch-compile-bf16-$tag" shape bf16 compile "$m" "$b" "$t"
  done
fi
gpu_table gpu-bench
exit $status

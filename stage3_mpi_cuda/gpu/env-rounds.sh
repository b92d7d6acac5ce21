#!/usr/bin/env bash
# One environment setting against another for stage 3's bench, in alternating rounds on the
# same GPUs (A B A B ...), so a difference of a few tenths of a millisecond a step stands
# out from the drift between runs: GPT-2 124M bf16, B=16 per GPU, T=1024, 20 timed steps.
#   [SETTINGS="-|NCCL_MIN_CTAS=32"] [ROUNDS=3] [FLAGS="--zero 1"] stage3_mpi_cuda/gpu/env-rounds.sh [N]
# SETTINGS: `|`-separated; each a space-separated list of VAR=value (`-`: none, the
# defaults). N: GPUs (default: all that nvidia-smi lists). One line per run: ms a step,
# tokens/s, the gradient sums timed alone and how ZeRO-1 gathered (bench's `gather`). From the project root after
# `../shared/gpu/bundle.sh`.
set -uo pipefail
source stage3_mpi_cuda/gpu/multi-gpu-env.sh
n=${1:-$(nvidia-smi -L | wc -l)}
IFS='|' read -ra settings <<< "${SETTINGS:--|NCCL_MIN_CTAS=32}"
gpt2="$(gpt2_bench 20) ${FLAGS:---zero 1}"
echo "commit $(cat .gpu/commit 2>/dev/null), $n x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $gpt2"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for s in "${settings[@]}"; do
    (for v in $s; do [ "$v" = - ] || export "$v"; done
     timeout 60 mpirun -n "$n" stage3_mpi_cuda $gpt2 2>/dev/null | tail -1 | python3 -c "
import json, sys
r = json.load(sys.stdin)
print(f\"round $r [$s] {r['ms_per_step']:.3f} ms {r['tokens_per_s']:,.0f} tokens/s sums_alone {r['sums_alone_ms']:.3f} ms gather {r.get('gather')}\")" \
       || echo "round $r [$s] FAILED")
  done
done

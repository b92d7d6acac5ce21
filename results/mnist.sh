#!/usr/bin/env bash
# results/mnist.md from a finished `stage0_serial mnist` run and, when given, the same
# run on stage 1 (`make mnist-results` makes both): the loss-per-epoch table, the final test
# accuracy against the target (89% on Fashion-MNIST with the default MLP in 20
# epochs), stage 1's against stage 0's, and where it was measured.
# Usage: results/mnist.sh STAGE0_RUN_DIR [STAGE1_RUN_DIR] > results/mnist.md
set -euo pipefail
run=${1:?usage: $0 STAGE0_RUN_DIR [STAGE1_RUN_DIR]}
table="$run/loss.tsv"
[ -f "$table" ] || { echo "$0: no $table: run \`make run-mnist\` first" >&2; exit 2; }
percent() { tail -1 "$1" | awk -F'\t' '{ printf "%.2f", 100 * $4 }'; }
epochs=$(tail -1 "$table" | cut -f1)
accuracy=$(percent "$table")
verdict=$(awk -v a="$accuracy" 'BEGIN { print (a >= 89 ? "meets" : "misses") }')
echo "# MLP on Fashion-MNIST, stage 0"
echo
echo "\`make mnist-results\`: \`stage0_serial mnist --epochs 20\` with the defaults (784→256→128→10, ReLU,"
echo "softmax cross-entropy, SGD with momentum 0.9, lr 0.05 on a cosine to 0, batch 64, seed 1337) on"
echo "Debian's dataset-fashion-mnist (60,000 training and 10,000 test images)."
echo
echo "**Test accuracy after $epochs epochs: $accuracy%** ($verdict the target of 89%)."
echo
echo "| epoch | train loss | test loss | test accuracy | images/s | elapsed (s) |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
tail -n +2 "$table" | awk -F'\t' '{ printf "| %s | %s | %s | %.2f%% | %s | %s |\n", $1, $2, $3, 100 * $4, $5, $6 }'
echo
echo "images/s counts training steps only (evaluation aside), on 2 cores that other work may share: not a benchmark."
if [ -n "${2:-}" ]; then
  other="$2/loss.tsv"
  [ -f "$other" ] || { echo "$0: no $other" >&2; exit 2; }
  accuracy1=$(percent "$other")
  drift=$(paste <(tail -n +2 "$table") <(tail -n +2 "$other") | awk -F'\t' '
    function abs(x) { return x < 0 ? -x : x }
    { d = abs($2 - $8); if (abs($3 - $9) > d) d = abs($3 - $9); if (d > m) m = d }
    END { printf "%.4f", m }')
  echo
  echo "## Stage 1, the same run on 2 ranks"
  echo
  echo "\`mpirun -n 2 stage1_mpi mnist --epochs 20\`: each global batch of 64 split into 32 per rank, the"
  echo "gradients summed. Test accuracy after 20 epochs: **$accuracy1%** against stage 0's $accuracy%"
  echo "($(awk -v a="$accuracy1" -v b="$accuracy" 'BEGIN { d = a - b; printf "%+.2f", d }') points; the target: 0.2 at most). The largest difference of a loss"
  echo "in the two tables is $drift: the ranks sum the same gradients in another order, and"
  echo "thousands of steps amplify that rounding. Over the first 100 steps the tables agree within 1e-4"
  echo "(\`make test\`: stage1_mpi's \`mnist_reproduces_stage0\`, on made-up data, SGD and AdamW)."
fi
echo
echo "Measured on: $("$(dirname "$0")/describe-machine.sh")"

#!/usr/bin/env bash
# results/mnist-stage0.md from a finished `stage0_serial mnist` run (`make mnist-results`
# runs it after `make run-mnist`): the loss-per-epoch table, the final test accuracy against
# the issue's target (89% on Fashion-MNIST with the default MLP in 20 epochs), and where it
# was measured. Usage: results/mnist-stage0.sh RUN_DIR > results/mnist-stage0.md
set -euo pipefail
run=${1:?usage: $0 RUN_DIR}
table="$run/loss.tsv"
[ -f "$table" ] || { echo "$0: no $table: run \`make run-mnist\` first" >&2; exit 2; }

last=$(tail -1 "$table")
epochs=$(cut -f1 <<<"$last")
accuracy=$(awk -F'\t' '{ printf "%.2f", 100 * $4 }' <<<"$last")
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
echo "Measured on: $("$(dirname "$0")/describe-machine.sh")"

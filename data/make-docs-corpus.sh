#!/usr/bin/env bash
# Makes data/docs-gpt2/: a corpus of >= 10M GPT-2 tokens in llm.c shards of 1M tokens for the
# run at the used-by scale, from documentation that Debian ships: the Linux kernel's
# reStructuredText sources (package linux-doc, /usr/share/doc/linux-doc-*/html/_sources) and
# Python's (python3-doc, /usr/share/doc/python3.*/html/_sources), both English prose with code.
# Every .txt file there is a document; `stage0_serial tokenize --output-dir` takes them in the
# sorted order of their paths, puts <|endoftext|> before each, and writes
# docs-gpt2_val_000000.bin (whole documents from the first, at least 1M tokens) and
# docs-gpt2_train_000001.bin, ... (1M tokens each, the last the rest), which `train --data
# data/docs-gpt2` reads. On Debian 12: 35.2 MB of text, about 12.0M tokens, 24 MB of shards: they
# fit beside a bundle of the GPU stages (`bundle.sh -p stage2_cuda -p stage3_mpi_cuda`) within
# the device tool's 64 MiB. Installs the two packages when they are missing (apt). Run from the
# project root (`make docs-corpus`); shards of an earlier run in OUT are replaced.
set -euo pipefail
BIN=${BIN:-target/release/stage0_serial}
OUT=${OUT:-data/docs-gpt2}
SHARD_TOKENS=${SHARD_TOKENS:-1000000}
MIN_TOKENS=${MIN_TOKENS:-10000000}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
# Each folder once (Debian links python3.11-dev's and -venv's doc folders to python3.11's).
sources() { ls -d /usr/share/doc/linux-doc-*/html/_sources /usr/share/doc/python3.*/html/_sources 2>/dev/null \
  | xargs -r realpath | LC_ALL=C sort -u; }
if [ "$(sources | wc -l)" -lt 2 ]; then
  echo "installing: linux-doc python3-doc (apt)"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends linux-doc python3-doc >/dev/null
fi
patterns=()
for dir in $(sources); do
  patterns+=("$dir/**/*.txt")
done
echo "documents: every .txt under $(sources | tr '\n' ' ')"
# `tokenize` refuses a directory that holds .bin files: the previous run's shards go first.
prefix=$(basename "$OUT")
rm -f "$OUT/${prefix}"_val_*.bin "$OUT/${prefix}"_train_*.bin
"$BIN" tokenize --input "${patterns[@]}" --output-dir "$OUT" --shard-tokens "$SHARD_TOKENS"
bytes=$(cat "$OUT"/*.bin | wc -c)
shards=$(find "$OUT" -maxdepth 1 -name '*.bin' | wc -l)
tokens=$(( (bytes - 1024 * shards) / 2 ))
if [ "$tokens" -lt "$MIN_TOKENS" ]; then
  echo "error: $OUT has $tokens tokens, fewer than $MIN_TOKENS" >&2
  exit 1
fi
echo "$OUT: $tokens tokens in $shards shards, sha256 $(cat "$OUT"/*.bin | sha256sum | cut -c1-16)"

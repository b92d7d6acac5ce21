#!/usr/bin/env bash
# Makes data/docs-gpt2.bin: a corpus of >= 10M GPT-2 tokens for the run at the used-by scale
# (gpu/corpus-run.sh), from documentation that Debian ships:
# the Linux kernel's reStructuredText sources (package linux-doc, /usr/share/doc/linux-doc-*/
# html/_sources) and Python's (python3-doc, /usr/share/doc/python3.*/html/_sources), both
# English prose with code, concatenated in byte order of their paths, then tokenized by
# `stage0_serial tokenize` (GPT-2 BPE, llm.c's uint16 .bin). On Debian 12: 35.2 MB of text,
# 12.0M tokens, a 24 MB .bin: it fits beside a bundle of the GPU stages (`bundle.sh -p
# stage2_cuda -p stage3_mpi_cuda`) within the device tool's 64 MiB. Installs the two packages
# when they are missing (apt). Run from the project root (`make docs-corpus`).
set -euo pipefail
BIN=${BIN:-target/release/stage0_serial}
OUT=${OUT:-data/docs-gpt2.bin}
MIN_TOKENS=${MIN_TOKENS:-10000000}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
# Each folder once (Debian links python3.11-dev's and -venv's doc folders to python3.11's).
sources() { ls -d /usr/share/doc/linux-doc-*/html/_sources /usr/share/doc/python3.*/html/_sources 2>/dev/null \
  | xargs -r realpath | LC_ALL=C sort -u; }
if [ "$(sources | wc -l)" -lt 2 ]; then
  echo "installing: linux-doc python3-doc (apt)"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends linux-doc python3-doc >/dev/null
fi
text=$(mktemp); trap 'rm -f "$text"' EXIT
for dir in $(sources); do
  find "$dir" -type f -name '*.txt' -print0 | LC_ALL=C sort -z | xargs -0 cat
done >"$text"
echo "text: $(sources | tr '\n' ' ')-> $(wc -c <"$text") bytes"
"$BIN" tokenize --input "$text" --output "$OUT"
tokens=$(( ($(stat -c %s "$OUT") - 1024) / 2 ))
if [ "$tokens" -lt "$MIN_TOKENS" ]; then
  echo "error: $OUT has $tokens tokens, fewer than $MIN_TOKENS" >&2
  exit 1
fi
echo "$OUT: $tokens tokens, sha256 $(sha256sum "$OUT" | cut -c1-16)"

#!/usr/bin/env bash
# Repacks .gpu/runtime.tgz without its test executables, for a device call that must also carry
# data/docs-gpt2.bin.gz (docs-run.sh): the full bundle (~46 MiB), the corpus (~9.4 MiB) and the
# tracked tree (~9 MiB) pass the device tool's 64 MiB. Run here, from the project root, after
# ../shared/gpu/bundle.sh. It keeps the full runtime in /tmp, outside the carry;
# `slim-bundle.sh --undo` puts it back.
set -euo pipefail
full=/tmp/gpt2rs-runtime-full.tgz
if [ "${1:-}" = "--undo" ]; then
  [ -f "$full" ] || { echo "slim-bundle.sh: no full runtime kept at $full" >&2; exit 2; }
  mv "$full" .gpu/runtime.tgz; echo "slim-bundle.sh: the full runtime is back"; exit 0
fi
[ -f .gpu/runtime.tgz ] || { echo "slim-bundle.sh: .gpu/runtime.tgz is missing: run ../shared/gpu/bundle.sh first" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf .gpu/runtime.tgz
if [ -z "$(ls -A "$work/tests" 2>/dev/null)" ]; then
  echo "slim-bundle.sh: the runtime holds no test executables: already slim" >&2; exit 2
fi
[ ! -e "$full" ] || { echo "slim-bundle.sh: $full is kept from an earlier slimming: --undo it, or remove it" >&2; exit 2; }
cp .gpu/runtime.tgz "$full"
rm -rf "$work/tests"; mkdir "$work/tests"
tar -C "$work" -czf .gpu/runtime.tgz bin lib tests
echo "slim-bundle.sh: .gpu is $(du -sh .gpu | cut -f1) without the test executables (the full runtime kept at $full)"

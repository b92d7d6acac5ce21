#!/usr/bin/env bash
# `tokenize` into shards against Python's tiktoken on the same documents, on the same cores.
#
#   results/tokenize-bench.sh     # writes results/tokenize-bench.md and results/tokenize-bench.json
#
# Documents: every .txt under the documentation folders `make docs-corpus` reads (Debian's
# linux-doc and python3-doc; INPUT="GLOB ..." names others), one a file. Ours: `stage0_serial
# tokenize --input GLOB... --output-dir DIR --shard-tokens 1000000 --threads THREADS` (reads,
# tokenizes in parallel, writes the shards). Python: tiktoken's GPT-2 encoding (r50k_base, its
# ranks loaded from the file tiktoken-rs ships, so no download) reads the same files in the
# same order, `encode_ordinary_batch(num_threads=THREADS)`, an end-of-text before each document,
# and writes the tokens as uint16 to one file. THREADS: `nproc` unless set. The two alternate
# for ROUNDS rounds (default 3); the table gives each side's median tokens/s, and checks that
# the token streams are equal (our shards, validation first, concatenated, against Python's).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/stage0_serial}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
[ -x "$BIN" ] || cargo build --release -p stage0_serial
python3 -c "import tiktoken" 2>/dev/null || { echo "tiktoken is not installed (pip install tiktoken)" >&2; exit 1; }
ranks=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*tiktoken-rs*' -name r50k_base.tiktoken 2>/dev/null | head -1)
[ -n "$ranks" ] || { echo "r50k_base.tiktoken not found in the cargo registry (cargo build fetches tiktoken-rs)" >&2; exit 1; }
if [ -z "${INPUT:-}" ]; then
  INPUT=$(ls -d /usr/share/doc/linux-doc-*/html/_sources /usr/share/doc/python3.*/html/_sources 2>/dev/null \
    | xargs -r realpath | LC_ALL=C sort -u | sed 's|$|/**/*.txt|' | tr '\n' ' ')
fi
[ -n "$INPUT" ] || { echo "no documents: install linux-doc and python3-doc, or set INPUT" >&2; exit 1; }
read -r -a patterns <<<"$INPUT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

ours() {
  rm -rf "$work/ours"
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" tokenize --input "${patterns[@]}" --output-dir "$work/ours" --shard-tokens 1000000 --threads "$THREADS" \
    >"$work/ours.log" 2>&1 || { cat "$work/ours.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}

python_side() {
  python3 - "$ranks" "$THREADS" "$work/python.bin" "${patterns[@]}" <<'EOF'
import glob, pathlib, sys, time
import numpy as np
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str
ranks, threads, out, patterns = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
t0 = time.perf_counter()
enc = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=load_tiktoken_bpe(ranks),
                        special_tokens={"<|endoftext|>": 50256})
paths = {p for pat in patterns for p in glob.glob(pat, recursive=True) if pathlib.Path(p).is_file()}
paths = sorted(paths, key=lambda p: pathlib.PurePosixPath(p).parts)
texts = [open(p, encoding="utf-8").read() for p in paths]
tokens = []
for doc in enc.encode_ordinary_batch(texts, num_threads=threads):
    tokens.append(50256)
    tokens.extend(doc)
np.array(tokens, dtype=np.uint16).tofile(out)
print(time.perf_counter() - t0, len(paths), len(tokens))
EOF
}

rows=()
for r in $(seq "$ROUNDS"); do
  s_ours=$(ours)
  read -r s_py docs tokens < <(python_side)
  rows+=("$r $s_ours $s_py $docs $tokens")
  echo "== round $r: ours ${s_ours} s, tiktoken ${s_py} s ($docs documents, $tokens tokens)" >&2
done
# The same tokens: our shards' payloads (validation first, then training in order) against Python's.
same=$(python3 - "$work/ours" "$work/python.bin" <<'EOF'
import glob, os, sys
import numpy as np
shards = sorted(glob.glob(os.path.join(sys.argv[1], "*_val_*.bin"))) + sorted(glob.glob(os.path.join(sys.argv[1], "*_train_*.bin")))
ours = np.concatenate([np.fromfile(f, dtype=np.uint16, offset=1024) for f in shards])
theirs = np.fromfile(sys.argv[2], dtype=np.uint16)
print("equal" if ours.shape == theirs.shape and (ours == theirs).all() else f"DIFFERENT ({ours.size} against {theirs.size} tokens)")
EOF
)
printf '%s\n' "${rows[@]}" >"$work/rows"
python3 - "$(results/describe-machine.sh)" "$THREADS" "$same" "$work/rows" "$(python3 -c 'import tiktoken; print(tiktoken.__version__)')" "${patterns[*]}" <<'EOF'
import json, statistics, sys
machine, threads, same, rows, version, patterns = sys.argv[1:7]
runs = [line.split() for line in open(rows) if line.strip()]
docs, tokens = int(runs[0][3]), int(runs[0][4])
ours = statistics.median(float(r[1]) for r in runs)
py = statistics.median(float(r[2]) for r in runs)
md = [
    "# Tokenizing a corpus: `tokenize` against tiktoken",
    "",
    "Written by `results/tokenize-bench.sh`. " + machine + ".",
    "",
    f"{docs:,} documents ({patterns}), {tokens:,} GPT-2 tokens with an end-of-text before each. "
    f"Ours: `stage0_serial tokenize --input ... --output-dir DIR --shard-tokens 1000000 --threads {threads}` "
    f"(read, tokenize, write the shards). Python: tiktoken {version}'s GPT-2 encoding, "
    f"`encode_ordinary_batch(num_threads={threads})` over the same files in the same order, the tokens "
    f"written as one uint16 file (load the ranks, read, encode, write). Whole-process wall time; "
    f"{len(runs)} rounds in turns, medians. Token streams: **{same}**.",
    "",
    "| | seconds | tokens/s |",
    "| --- | ---: | ---: |",
    f"| `stage0_serial tokenize` | {ours:.2f} | {tokens / ours:,.0f} |",
    f"| tiktoken (Python) | {py:.2f} | {tokens / py:,.0f} |",
    "",
    f"**Ours / tiktoken: {py / ours:.2f}x** (above 1: ours faster).",
]
open("results/tokenize-bench.md", "w").write("\n".join(md) + "\n")
json.dump({"machine": machine, "threads": int(threads), "documents": docs, "tokens": tokens, "same_tokens": same,
           "runs": [{"round": int(r[0]), "ours_s": float(r[1]), "tiktoken_s": float(r[2])} for r in runs]},
          open("results/tokenize-bench.json", "w"), indent=1)
print("\n".join(md))
EOF

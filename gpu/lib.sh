# shellcheck shell=bash
# Sourced by the scripts in gpu/ (not a tool of its own). It
#   - moves to the workspace root (the folder above gpu/), where every script runs;
#   - finds the binaries: $BIN if set (a folder holding stage2_cuda, stage3_mpi_cuda, ...),
#     else target/release (`cargo build --release`), else PATH (for
#     example a bundle's env.sh that put them there);
#   - finds the test executables (gpu_tests): cargo's, where cargo is installed, else the
#     folder `tests/` beside the binaries' folder (a bundle's layout), or $TESTS;
#   - puts the CUDA toolkit's libraries (cuBLAS, cuBLASLt, NVRTC) and libnccl.so on the
#     loader's path where the system's loader cache does not list them;
#   - leaves NVLink multicast off in NCCL, PyTorch and NVSHMEM unless the caller set
#     NCCL_NVLS_ENABLE (ours and PyTorch's runs then choose among the same NCCL algorithms);
#   - describes the machine (gpu_machine): GPU names and count, driver, CUDA, nvcc, NCCL, MPI,
#     PyTorch and transformers versions, CPU, commit, UTC date; the header of every table;
#   - runs one measurement and keeps its JSON line (gpu_run), and writes a table (gpu_table).
# Knobs (environment): BIN, TESTS, COMMIT (names the build when git cannot), MPIRUN (the
# launcher, default `mpirun`; e.g. MPIRUN="mpirun --allow-run-as-root" under Open MPI as
# root), RESULTS_DIR (default results/), GPU_LOGS (the folder for logs, default a new one
# under /tmp; its path is printed at the end).

GPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$GPU_ROOT" || exit 2
GPU_PY=$GPU_ROOT/gpu/py
RESULTS_DIR=${RESULTS_DIR:-$GPU_ROOT/results}
GPU_SCRIPT=gpu/$(basename "$0")
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

gpu_die() { echo "$GPU_SCRIPT: $*" >&2; exit 2; }
gpu_say() { echo "== $(date -u +%T) $*" >&2; }

# Prints the calling script's header comment (its --help).
gpu_help() { sed -n '2,/^[^#]/{/^#/{s/^# \{0,1\}//;p;};}' "$0"; }

# ---- binaries ---------------------------------------------------------------------------
# Sets GPU_BINS (a folder) and GPU_BINS_FROM (how it was found).
gpu_find_bins() {
  if [ -n "${BIN:-}" ]; then
    [ -x "$BIN/stage2_cuda" ] || gpu_die "BIN=$BIN holds no stage2_cuda"
    GPU_BINS=$(cd "$BIN" && pwd); GPU_BINS_FROM=BIN
  elif [ -x target/release/stage2_cuda ]; then
    GPU_BINS=$GPU_ROOT/target/release; GPU_BINS_FROM=target/release
  elif command -v stage2_cuda >/dev/null 2>&1; then
    GPU_BINS=$(cd "$(dirname "$(command -v stage2_cuda)")" && pwd); GPU_BINS_FROM=PATH
  else
    gpu_die "no stage2_cuda: build with \`cargo build --release\`, set BIN=DIR, or put the binaries on PATH"
  fi
}

# gpu_bin NAME [DIR]: the path of binary NAME in DIR (default: the one gpu_find_bins chose).
gpu_bin() {
  local p=${2:-$GPU_BINS}/$1
  [ -x "$p" ] || gpu_die "no $1 in ${2:-$GPU_BINS}"
  echo "$p"
}

# The commit the binaries were built from: $COMMIT if set; a bundle's .gpu/commit when the
# binaries came from PATH; else git (with "+changes" where the code differs from HEAD);
# else .gpu/commit; else "unknown".
gpu_commit() {
  local c
  if [ -n "${COMMIT:-}" ]; then
    echo "$COMMIT"
  elif [ "${GPU_BINS_FROM:-}" = PATH ] && [ -s .gpu/commit ]; then
    head -1 .gpu/commit
  elif c=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- common stage0_serial stage1_mpi stage2_cuda stage3_mpi_cuda Cargo.toml Cargo.lock 2>/dev/null \
      || c="$c+changes"
    echo "$c"
  elif [ -s .gpu/commit ]; then
    head -1 .gpu/commit
  else
    echo unknown
  fi
}

# ---- the test executables -----------------------------------------------------------------
# Prints the test executables, one a line: cargo's release build of every workspace test
# (built here if needed), or the files in $TESTS / the bundle's tests/ folder.
gpu_tests() {
  if command -v cargo >/dev/null 2>&1 && [ -f Cargo.toml ] && [ -z "${TESTS:-}" ]; then
    gpu_say "cargo test --release --workspace --no-run" >&2
    cargo test --release --workspace --no-run --message-format=json 2>"$GPU_LOGS/cargo-build.log" \
      | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | sort -u
    [ "${PIPESTATUS[0]}" = 0 ] || { tail -20 "$GPU_LOGS/cargo-build.log" >&2; gpu_die "cargo could not build the tests"; }
  else
    local dir=${TESTS:-$GPU_BINS/../tests}
    [ -d "$dir" ] || gpu_die "no test executables: no cargo here and no folder $dir (set TESTS=DIR)"
    find "$dir" -maxdepth 1 -type f -perm -u+x | sort
  fi
}

# ---- the CUDA libraries -------------------------------------------------------------------
# gpu_libdir PATTERN: the folder of the first library matching PATTERN that the loader cache
# lists, else one found in the usual CUDA places (nothing if none).
gpu_libdir() {
  local p
  p=$(ldconfig -p 2>/dev/null | awk -v pat="$1" '$1 ~ pat {print $NF; exit}')
  if [ -z "$p" ]; then
    p=$(find ${CUDA_HOME:+"$CUDA_HOME"} /usr/local/cuda /usr/local/cuda-* /usr/lib/x86_64-linux-gnu /opt/nvidia \
      -maxdepth 4 -name "$2" 2>/dev/null | head -1)
  fi
  [ -n "$p" ] && dirname "$p"
}
gpu_cuda_libs() {
  local spec d
  for spec in 'libcublas\.so\.[0-9]+$|libcublas.so.*' 'libcublasLt\.so\.[0-9]+$|libcublasLt.so.*' \
              'libnvrtc\.so\.[0-9]+$|libnvrtc.so.*'; do
    d=$(gpu_libdir "${spec%%|*}" "${spec#*|}") || true
    case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) [ -n "$d" ] && LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;; esac
  done
  # cudarc opens libnccl.so; where only libnccl.so.2 exists, a link to it in the log folder.
  if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
    local have=no
    for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do [ -e "$d/libnccl.so" ] && have=yes; done
    if [ $have = no ]; then
      d=$(gpu_libdir 'libnccl\.so\.2$' 'libnccl.so.2') || true
      if [ -n "$d" ]; then
        mkdir -p "$GPU_LOGS/lib"; ln -sf "$d/libnccl.so.2" "$GPU_LOGS/lib/libnccl.so"
        LD_LIBRARY_PATH=$GPU_LOGS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      fi
    fi
  fi
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
}

# ---- the machine --------------------------------------------------------------------------
gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; }
gpu_has_torch() { python3 -c 'import torch' >/dev/null 2>&1; }

# Describes the machine into $GPU_LOGS/machine.json and prints it (the header of the tables).
gpu_machine() {
  python3 "$GPU_PY/machine.py" --commit "$(gpu_commit)" --bins "$GPU_BINS" --bins-from "$GPU_BINS_FROM" \
    >"$GPU_LOGS/machine.json"
  python3 "$GPU_PY/machine.py" --md "$GPU_LOGS/machine.json" >&2
}
# One line for a run's env.txt.
gpu_machine_line() { python3 "$GPU_PY/machine.py" --line "$GPU_LOGS/machine.json"; }

# ---- measurements -------------------------------------------------------------------------
# gpu_run LABEL LIMIT_S [KEY=VALUE ...] -- COMMAND...: runs COMMAND (at most LIMIT_S seconds),
# its stdout to LABEL.out and stderr to LABEL.log in $GPU_LOGS; appends its last JSON line,
# with label=LABEL and the KEY=VALUE fields added, to $GPU_ROWS. A failed run leaves a row
# with "failed": true and the log's last lines. Returns the command's status.
gpu_run() {
  local label=$1 limit=$2 status=0; shift 2
  local fields=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do fields+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  gpu_say "$label: $*"
  echo "\$ $*" >"$GPU_LOGS/$label.log"
  timeout -k 20 "$limit" "$@" >"$GPU_LOGS/$label.out" 2>>"$GPU_LOGS/$label.log" || status=$?
  python3 "$GPU_PY/tables.py" row "$GPU_LOGS/$label.out" "$GPU_LOGS/$label.log" "$status" \
    "label=$label" "${fields[@]}" >>"$GPU_ROWS"
  if [ "$status" != 0 ]; then
    echo "   $label FAILED (exit $status; $GPU_LOGS/$label.log):" >&2
    tail -3 "$GPU_LOGS/$label.log" >&2
  fi
  return "$status"
}

# gpu_table NAME: writes $RESULTS_DIR/NAME.md (the header, then the table tables.py makes of
# $GPU_ROWS) and $RESULTS_DIR/NAME.json (the machine and every row), replacing both; prints the
# table.
gpu_table() {
  local name=$1; shift
  mkdir -p "$RESULTS_DIR"
  python3 "$GPU_PY/tables.py" "$name" --machine "$GPU_LOGS/machine.json" --rows "$GPU_ROWS" \
    --cmd "$GPU_CMDLINE" --md "$RESULTS_DIR/$name.md" --json "$RESULTS_DIR/$name.json" "$@"
  cat "$RESULTS_DIR/$name.md"
  echo >&2
  gpu_say "wrote $RESULTS_DIR/$name.md and $name.json; logs in $GPU_LOGS"
}

# The launcher of multi-process runs (MPICH's hydra: `mpirun -n N`).
# shellcheck disable=SC2034  # used by the scripts that source this file
read -r -a GPU_MPIRUN <<<"${MPIRUN:-mpirun}"
# PyTorch's launcher, one process per GPU: "${GPU_TORCHRUN[@]}" N script.py ...
# shellcheck disable=SC2034
GPU_TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc_per_node)

# ---- set-up every script shares -----------------------------------------------------------
# gpu_setup "$@": records the command line, makes the log folder, finds the binaries and the
# libraries, sets NCCL's multicast default and prints the machine.
gpu_setup() {
  GPU_CMDLINE="$GPU_SCRIPT${*:+ $*}"
  GPU_LOGS=${GPU_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-$(basename "$0" .sh)-XXXXXX")}
  mkdir -p "$GPU_LOGS"
  GPU_ROWS=$GPU_LOGS/rows.jsonl
  : >"$GPU_ROWS"
  gpu_find_bins
  gpu_cuda_libs
  export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
  if [ "$NCCL_NVLS_ENABLE" = 0 ]; then
    export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
    export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
  fi
  gpu_say "$GPU_CMDLINE"
  gpu_machine
}

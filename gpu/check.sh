#!/usr/bin/env bash
# Every GPU test, and that training is deterministic on the GPU.
#
#   gpu/check.sh [--no-tests] [--no-determinism] [--filter TEXT]
#
# Tests: each test executable that holds GPU tests (the ones marked ignored: "needs a CUDA
# device" / "needs 2 CUDA devices") runs with --include-ignored, its CPU tests too. With cargo
# installed they are `cargo test --release --workspace`'s executables
# (built first if needed); without, the executables in the bundle's tests/ folder (TESTS=DIR
# to name another). The GPU tests of one executable take turns on the device (they hold a lock),
# so --test-threads 4 only runs CPU tests beside them. Stage 3's executable (nccl) runs with one
# test at a time, its two-GPU tests only where the host has 2 or more GPUs (else its other tests
# run and the table says so). --filter TEXT passes TEXT to every executable (only tests whose
# names contain it).
# Determinism: the Makefile's SHORT_FLAGS run (the char model, 100 steps) twice with the same
# seed in fp32, tf32, bf16 and fp8 on stage 2, and in fp32 and bf16 on stage 3 with 2 GPUs where
# there are 2; the two loss.tsv (epoch, train loss, val loss, bad steps) and the two final
# checkpoints' arrays (parameters and AdamW moments) must be equal, bit for bit.
#
# About 5 min on an H100 (with the test executables built), 1 more with 2 GPUs.
# Writes results/gpu-check.md (machine header; a row per test executable: passed, failed,
# ignored, the failing tests named; a row per determinism pair: "equal" or "DIFFERENT", and
# the last loss row) and results/gpu-check.json. Exits 1 if a test fails or a pair differs.
set -euo pipefail
# shellcheck source=gpu/lib.sh
source "$(dirname "$0")/lib.sh"

args=("$@")
tests=yes det=yes filter=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) tests=no ;;
    --no-determinism) det=no ;;
    --filter) filter=("$2"); shift ;;
    -h|--help) gpu_help; exit 0 ;;
    *) gpu_die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
gpu_setup "${args[@]}"
export REQUIRE_NVRTC=1  # the kernel-compile test fails rather than skips without NVRTC
n=$(gpu_count)
status=0

if [ $tests = yes ]; then
  mapfile -t exes < <(gpu_tests)
  [ ${#exes[@]} -gt 0 ] || gpu_die "no test executables found"
  for t in "${exes[@]}"; do
    name=$(basename "$t"); name=${name%-*}
    # Only executables with GPU tests (ignored ones); the others are CPU-only (`make test`).
    "$t" --list --ignored 2>/dev/null | grep -q ': test$' || continue
    threads=4 run=(--include-ignored) note=
    if [ "$name" = nccl ]; then
      threads=1
      if [ "$n" -lt 2 ]; then run=(); note="GPU tests not run: they need 2 GPUs, this host has $n"; fi
    fi
    log=$GPU_LOGS/test-$name.log
    gpu_say "test $name ${run[*]} --test-threads $threads ${filter[*]}"
    rc=0
    timeout -k 20 600 "$t" "${run[@]}" --test-threads "$threads" "${filter[@]}" >"$log" 2>&1 || rc=$?
    [ $rc = 0 ] || status=1
    python3 "$GPU_PY/tables.py" testrow "$log" "$name" "$rc" "$note" >>"$GPU_ROWS"
    grep -E "^test result" "$log" | tail -1 >&2 || true
  done
fi

if [ $det = yes ]; then
  read -r -a short < <(sed -n 's/^SHORT_FLAGS := //p' Makefile)
  [ ${#short[@]} -gt 0 ] || gpu_die "no SHORT_FLAGS in the Makefile"
  s2=$(gpu_bin stage2_cuda)
  pair() {  # stage precision command...: two runs, compared
    local stage=$1 p=$2; shift 2
    local d=$GPU_LOGS/det-$stage-$p i
    for i in 1 2; do
      rm -rf "$d-$i"
      gpu_say "determinism $stage $p, run $i"
      timeout -k 20 300 "$@" train "${short[@]}" --precision "$p" --out "$d-$i" >"$d-$i.log" 2>&1 \
        || { echo "   run failed: $d-$i.log" >&2; tail -3 "$d-$i.log" >&2; }
    done
    python3 "$GPU_PY/tables.py" determinism "$d-1" "$d-2" "$stage" "$p" >>"$GPU_ROWS" || status=1
  }
  for p in fp32 tf32 bf16 fp8; do pair stage2 "$p" "$s2"; done
  if [ "$n" -ge 2 ]; then
    s3=$(gpu_bin stage3_mpi_cuda)
    for p in fp32 bf16; do pair stage3-2gpu "$p" "${GPU_MPIRUN[@]}" -n 2 "$s3"; done
  fi
fi

gpu_table gpu-check
exit $status

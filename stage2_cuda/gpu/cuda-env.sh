# Sourced by the GPU scripts, from the project root: the bundle's runtime (.gpu/env.sh),
# then the CUDA libraries (libcublas, libnvrtc live in the toolkit's folder, which the
# loader does not search by default) on LD_LIBRARY_PATH.
source .gpu/env.sh
libdir() {  # folder holding library $1: ldconfig, then the toolkit and pip wheels
  local p
  p=$(ldconfig -p | awk -v l="$1" '$1==l {print $NF; exit}')
  [ -z "$p" ] && p=$(find /usr/local/cuda*/ /usr/local/lib /usr/lib /opt -name "$1" 2>/dev/null | head -1)
  [ -n "$p" ] && dirname "$p"
}
# `gpt2_bench STEPS [PRECISION]`: the flags of the benchmark the GPU scripts time (stage 2's and
# stage 3's): GPT-2 124M, B=16 per GPU, T=1024, STEPS timed steps after 3 warm-up steps, in
# PRECISION (bf16 unless given).
gpt2_bench() { echo "bench --model gpt2 --batch 16 --seq-len 1024 --steps $1 --warmup 3 --precision ${2:-bf16}"; }
for l in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13; do
  d=$(libdir $l); echo "lib $l -> ${d:-NOT FOUND}"
  [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
done

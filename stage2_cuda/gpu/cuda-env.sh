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
for l in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13; do
  d=$(libdir $l); echo "lib $l -> ${d:-NOT FOUND}"
  [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
done

# Sourced by the per-machine CPU benchmarks (cpu-share.sh, make-run.sh): sets `cpu` (the model
# name), `simd` (whether it has AVX-512, on which the CPU figures depend) and `slug` (the name
# as a file name: each machine's row is results/<table>/<slug>.json).
cpu=$(sed -n 's/^model name\s*:\s*//p' /proc/cpuinfo | head -1)
simd=$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo "no AVX-512")
slug=$(echo "$cpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/^-//; s/-$//')

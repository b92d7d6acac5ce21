#!/usr/bin/env bash
# Session 25 call 3 (4 GPUs, the bundle of a8884a8 plus per-gpu.sh): each GPU's own speed.
# Calls 1-2's timelines put one GPU's compute 1.4 ms a step behind the others' on a host below
# 95%; per-gpu.sh times stage 2 on every GPU alone and all at once, with their clocks, power
# and clock-event reasons, then stage 3's default, and gives its weak scaling against GPU 0
# and against the slowest GPU.
R=$OUT
cat .gpu/commit
nvidia-smi -L > $R/gpus.txt; nvidia-smi topo -m >> $R/gpus.txt 2>&1
(export OUT=/tmp/pg; mkdir -p $OUT; STEPS=50 timeout 400 bash stage3_mpi_cuda/gpu/per-gpu.sh 4) > $R/per-gpu.out 2>&1
tar czf $R/per-gpu-runs.tgz -C /tmp/pg .
cat $R/per-gpu.out

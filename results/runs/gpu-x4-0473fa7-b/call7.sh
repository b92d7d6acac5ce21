#!/usr/bin/env bash
# Session 24 call 7 (4 GPUs, the bundle of 0473fa7): the quick sweep with the default beside the
# default under NCCL_MIN_CTAS=32, in the same call on the same GPUs, for the hosts where the
# default falls below 95% (results/scaling.md, session 24).
R=$OUT
cat .gpu/commit
nvidia-smi -L > $R/gpus.txt; nvidia-smi topo -m >> $R/gpus.txt 2>&1
(export OUT=/tmp/s4; mkdir -p $OUT; STEPS=20 QUICK=1 VARIANTS="default|-|; min32|NCCL_MIN_CTAS=32|" timeout 220 bash stage3_mpi_cuda/gpu/scaling.sh 4) > $R/scaling4.out 2>&1
cp /tmp/s4/scaling.md $R/scaling4.md; cp /tmp/s4/scaling.jsonl $R/scaling4.jsonl
tar czf $R/scaling4-runs.tgz -C /tmp/s4 .
cat $R/scaling4.md

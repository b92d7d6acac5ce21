#!/usr/bin/env bash
# Session 27 call 4 (4 GPUs, the bundle of ada1c45): part 2 of 2 of issue 14's docs run on 4 GPUs,
# to try on real GPUs the split that the 8-GPU run needs (PARITY_PART=1 stops the one-GPU fp32
# side halfway; PARITY_PART=2, on the same warm machine, resumes it to step 200 and compares).
# Carries .gpu and data/docs-gpt2.bin.gz.
cat .gpu/commit; nvidia-smi -L > $OUT/gpus2.txt
PARITY_PART=2 timeout 580 bash stage3_mpi_cuda/gpu/docs-run.sh 4 2>&1 | tee $OUT/docs-run2.out
mv $OUT/docs-run.tgz $OUT/docs-run2.tgz

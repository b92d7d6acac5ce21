#!/bin/bash
# H100: peaked attention test, fp32 attention paths' speed vs PyTorch eager, checkpoint stall
source .gpu/env.sh >/dev/null 2>&1; cat .gpu/commit; nvidia-smi -L
t=$(ls /tmp/gpu-rt/tests/cuda_backend-* | head -1)
timeout 200 $t --include-ignored --test-threads 1 attention 2>&1 | grep -E "PARITY|^test |test result|panicked" | cut -c1-160
g="bench --model gpt2 --batch 16 --seq-len 1024 --steps 10 --warmup 3 --precision fp32"
for r in 1 2; do
  echo "flash: $(timeout 120 stage2_cuda $g | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["ms_per_step"],1), "ms", round(r["peak_device_mb"]))')"
  echo "gemm: $(GPT2_CUDA_ATTENTION=gemm timeout 120 stage2_cuda $g | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["ms_per_step"],1), "ms", round(r["peak_device_mb"]))')"
  echo "torch eager fp32: $(timeout 150 python3 stage2_cuda/gpu/pytorch_gpt2.py --precision fp32 --batch 16 --seq-len 1024 --steps 10 --warmup 3 2>/dev/null | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["ms_per_step"],1), "ms", round(r["peak_device_mb"]))')"
done
echo "mpirun -n 1 stage3 bench: $(timeout 120 mpirun -n 1 stage3_mpi_cuda bench --model gpt2 --batch 16 --seq-len 1024 --steps 10 --warmup 3 --precision bf16 | tail -1 | cut -c1-400)"
timeout 200 stage2_cuda train --data data/tinyshakespeare.txt --tokenizer gpt2 --model gpt2 --batch 16 --seq-len 1024 --steps 41 --checkpoint-every 10 --eval-every 1000 --sample-len 0 --precision bf16 --out /tmp/ck 2>&1 | grep -E "checkpoint|error" | cut -c1-200

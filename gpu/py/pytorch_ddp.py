"""PyTorch DDP baseline for `stage3_mpi_cuda bench`: the model, optimiser and settings of
pytorch_gpt2.py (GPT-2 124M as ours, AdamW fused, global grad-norm clip 1.0, random tokens),
B sequences of T tokens per GPU, bf16 autocast and torch.compile by default, gradients summed by
DistributedDataParallel over NCCL (its 25 MiB buckets, overlapped with backward). Prints one JSON
line on rank 0, as pytorch_gpt2.py does: tokens_per_s over all GPUs, ms_per_step, peak memory per
GPU (the largest over ranks).

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node N pytorch_ddp.py \\
        [--precision bf16|tf32|fp32] [--no-compile] [--model gpt2|gpt2-medium|gpt2-large] \\
        [--batch 16 --seq-len 1024 --steps 10 --warmup 3] [--bf16-sums]

--bf16-sums: the gradients compressed to bf16 for their sums (DDP's communication hook
`bf16_compress_hook`, PyTorch's counterpart of our `--grad-comm bf16`).

NVLink multicast (NVLS) is off unless NCCL_NVLS_ENABLE is set, as gpu/lib.sh leaves it for
stage 3: both sides then choose among the same NCCL algorithms.
"""
import argparse
import json
import os
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from pytorch_gpt2 import MODELS, VOCAB, model_and_optimizer  # noqa: E402


def main(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl")
    # The same initial weights on every rank (seed 1; DDP also broadcasts rank 0's).
    model, opt = model_and_optimizer(args, dev)
    ddp = DDP(model, device_ids=[local])
    if args.bf16_sums:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)
    forward = ddp if args.no_compile else torch.compile(ddp)
    b, t = args.batch, args.seq_len
    gen = torch.Generator(device=dev).manual_seed(rank)  # each rank its own batch

    def step():
        data = torch.randint(0, VOCAB, (b, t + 1), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = forward(data[:, :-1], data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over ranks here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - start
    # The slowest rank sets the pace; the largest peak is what each GPU must hold.
    stats = torch.tensor(
        [secs, torch.cuda.max_memory_allocated() / 2**20, torch.cuda.max_memory_reserved() / 2**20], device=dev
    )
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    loss = loss.detach().clone()
    dist.all_reduce(loss)
    secs, peak_mb, reserved_mb = stats.tolist()
    if rank == 0:
        print(
            json.dumps(
                {
                    "impl": "pytorch-ddp" + ("" if args.no_compile else "-compile"),
                    "model": args.model,
                    "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(),
                    "precision": args.precision,
                    "ranks": world,
                    "params": sum(p.numel() for p in model.parameters()),
                    "batch": b,
                    "seq_len": t,
                    "steps": args.steps,
                    "tokens_per_s": world * b * t * args.steps / secs,
                    "tokens_per_s_per_gpu": b * t * args.steps / secs,
                    "ms_per_step": secs * 1e3 / args.steps,
                    "peak_device_mb": peak_mb,
                    "peak_reserved_mb": reserved_mb,
                    "final_loss": loss.item() / world,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    p.add_argument("--no-compile", action="store_true", help="eager DDP instead of torch.compile")
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--batch", type=int, default=16, help="sequences per GPU")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bf16-sums", action="store_true", help="DDP's bf16_compress_hook: gradients summed in bf16")
    main(p.parse_args())

"""Does a cuBLASLt matrix product of a new shape fail while another thread records a CUDA graph?

The first guess at the GPU tests' rare CUBLAS_STATUS_INTERNAL_ERROR when several tests ran in
one process: cuBLASLt's algorithm heuristic, queried once per new shape, failing while a stream
of the same context is being captured. It does not (results/runs/gpu-8877c39: 0 of 10 failed);
the cause was another test synchronising the context. PyTorch's
addmm with a bias vector goes through cuBLASLt's bias epilogue, as our products do.
Thread A begins a thread-local capture and waits inside it; thread B runs products of shapes it
has not used before. Prints one PROBE line: how many of B's products failed, and the errors.
"""
import threading

import torch

torch.backends.cuda.matmul.allow_tf32 = False
x = torch.randn(64, 64, device="cuda")
torch.cuda.synchronize()
stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
inside, leave = threading.Event(), threading.Event()
capture_error = []


def record():
    _ = x @ x  # this thread's cuBLAS handle, made before its capture
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            _ = x @ x
            inside.set()
            leave.wait(30)
    except Exception as e:  # noqa: BLE001
        capture_error.append(str(e).splitlines()[0][:120])
        inside.set()


def operands(tag):
    """Operands made before any capture (the RNG may not advance during one)."""
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in (40, 72, 136, 264, 520):
            n += tag
            out.append((torch.randn(n, n, device="cuda", dtype=dtype),
                        torch.randn(n, device="cuda", dtype=dtype)))
    return out


def products(ops):
    fails, errors = 0, []
    for a, b in ops:
        try:
            torch.addmm(b, a, a)
            torch.cuda.current_stream().synchronize()
        except Exception as e:  # noqa: BLE001 - the probe reports whatever failed
            fails += 1
            errors.append(str(e).splitlines()[0][:120])
    return fails, errors


first, second = operands(0), operands(1)
torch.cuda.synchronize()
base_fails, _ = products(first)  # shapes first used with no capture anywhere
t = threading.Thread(target=record)
t.start()
inside.wait(30)
seen_fails, _ = products(first)  # shapes already used, while thread A records
fails, errors = products(second)  # new shapes while thread A records
leave.set()
t.join()
print(f"PROBE lt-during-capture: new shapes, no capture: {base_fails}/10 failed; during another "
      f"thread's capture: shapes used before {seen_fails}/10 failed, new shapes {fails}/10 failed "
      f"{errors[:2]}; the capture itself: {capture_error or 'ok'}")

"""Does a cuBLASLt matrix product of a new shape fail while another thread records a CUDA graph?

The suspected cause of the GPU tests' rare CUBLAS_STATUS_INTERNAL_ERROR when several tests ran
in one process (check.sh now runs them one at a time): cuBLASLt's algorithm heuristic, queried
once per new shape, failing while a stream of the same context is being captured. PyTorch's
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


def record():
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        _ = x @ x
        inside.set()
        leave.wait(30)


def products(tag):
    fails, errors = 0, []
    for n in (40, 72, 136, 264, 520):
        n += tag
        try:
            a = torch.randn(n, n, device="cuda")
            b = torch.randn(n, device="cuda")
            torch.addmm(b, a, a)
            torch.cuda.current_stream().synchronize()
        except Exception as e:  # noqa: BLE001 - the probe reports whatever failed
            fails += 1
            errors.append(str(e).splitlines()[0][:120])
    return fails, errors


base_fails, _ = products(0)  # shapes first used with no capture anywhere
t = threading.Thread(target=record)
t.start()
inside.wait(30)
fails, errors = products(1)  # new shapes while thread A records
leave.set()
t.join()
print(f"PROBE lt-during-capture: without capture {base_fails}/5 failed; "
      f"during another thread's capture {fails}/5 failed; {errors[:2]}")

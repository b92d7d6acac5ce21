#!/usr/bin/env python3
"""The machine a GPU script measured on, as JSON (for the tables' headers) or as one line.

    machine.py [--commit C] [--bins DIR] [--bins-from WHERE]    # prints the JSON object
    machine.py --line FILE.json                                  # one line, for a run's env.txt
    machine.py --md FILE.json                                    # the header's markdown lines

Every field is looked up where it can be and left "-" where it cannot (no GPU, no torch, no
nvcc): GPU names and count, the driver and the CUDA version it supports, nvcc's version, the
NCCL library the binaries load (ncclGetVersion of libnccl.so.2) and PyTorch's, MPI, PyTorch and
transformers versions, the CPU, the commit and the UTC date. Never fails.
"""
import argparse
import ctypes
import datetime
import json
import os
import re
import subprocess


def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def nccl_version():
    for name in ("libnccl.so.2", "libnccl.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(v)) == 0:
            code = v.value  # 2.x: major*10000 + minor*100 + patch
            return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return "-"


def python_versions():
    """torch, its CUDA and NCCL, transformers: in a child process (an import can take seconds
    or fail in odd ways; neither may stop the header)."""
    code = """
import json
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda or "-"
    try:
        out["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass
except Exception:
    pass
try:
    import transformers
    out["transformers"] = transformers.__version__
except Exception:
    pass
print(json.dumps(out))
"""
    text = run("python3", "-c", code)
    try:
        return json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def collect(args):
    m = {"gpus": [], "gpu_count": 0}
    names = run("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
    if names:
        m["gpus"] = [n.strip() for n in names.splitlines() if n.strip()]
        m["gpu_count"] = len(m["gpus"])
        m["gpu_memory"] = run("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader").splitlines()[0]
        m["driver"] = run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()[0]
        cuda = re.search(r"CUDA Version:\s*([0-9.]+)", run("nvidia-smi"))
        m["cuda_driver"] = cuda.group(1) if cuda else "-"
        topo = run("nvidia-smi", "topo", "-m")
        if m["gpu_count"] > 1 and topo:
            links = set(re.findall(r"\b(NV\d+|PIX|PXB|PHB|NODE|SYS)\b", topo.split("\n", 1)[-1]))
            m["gpu_links"] = " ".join(sorted(links)) or "-"
    nvcc = re.search(r"release ([0-9.]+)", run("nvcc", "--version"))
    m["nvcc"] = nvcc.group(1) if nvcc else "-"
    m["nccl"] = nccl_version()
    mpi = run("mpirun", "--version")
    hydra = re.search(r"HYDRA build details:\s*\n\s*Version:\s*([0-9.a-z]+)", mpi)
    other = re.search(r"(Open MPI|Intel\(R\) MPI Library)[^0-9]*([0-9.]+)", mpi)
    m["mpi"] = f"MPICH {hydra.group(1)}" if hydra else f"{other.group(1)} {other.group(2)}" if other else "-"
    m.update(python_versions())
    cpu = "-"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    m["cpu"] = cpu
    m["cores"] = os.cpu_count()
    try:
        kb = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
        m["memory_gib"] = round(kb / 2**20)
    except (OSError, StopIteration, ValueError):
        pass
    m["commit"] = args.commit or "-"
    m["binaries"] = f"{args.bins or '-'} ({args.bins_from or '-'})"
    m["date_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return m


def gpus(m):
    if not m.get("gpus"):
        return "no GPU"
    kinds = sorted(set(m["gpus"]))
    return " + ".join(f"{m['gpus'].count(k)} x {k}" for k in kinds)


def line(m):
    g = gpus(m)
    links = f", links {m['gpu_links']}" if m.get("gpu_links") else ""
    return (f"{g}{links}; driver {m.get('driver', '-')} (CUDA {m.get('cuda_driver', '-')}); nvcc {m.get('nvcc', '-')}; "
            f"NCCL {m.get('nccl', '-')}; {m.get('mpi', '-')}; PyTorch {m.get('torch', '-')} (CUDA {m.get('torch_cuda', '-')}, "
            f"NCCL {m.get('torch_nccl', '-')}); transformers {m.get('transformers', '-')}; "
            f"CPU {m.get('cpu', '-')}, {m.get('cores', '-')} cores, {m.get('memory_gib', '-')} GiB; "
            f"commit {m.get('commit', '-')}; {m.get('date_utc', '-')}")


def markdown(m):
    return "\n".join([
        f"- machine: {gpus(m)}" + (f" ({m['gpu_memory']} each" + (f"; links {m['gpu_links']}" if m.get("gpu_links") else "") + ")"
                                   if m.get("gpu_memory") else ""),
        f"- software: driver {m.get('driver', '-')} (CUDA {m.get('cuda_driver', '-')}), nvcc {m.get('nvcc', '-')}, "
        f"NCCL {m.get('nccl', '-')}, {m.get('mpi', '-')}, PyTorch {m.get('torch', '-')} (CUDA {m.get('torch_cuda', '-')}, "
        f"NCCL {m.get('torch_nccl', '-')}), transformers {m.get('transformers', '-')}",
        f"- host: {m.get('cpu', '-')}, {m.get('cores', '-')} cores, {m.get('memory_gib', '-')} GiB",
        f"- build: commit {m.get('commit', '-')}; binaries {m.get('binaries', '-')}",
        f"- date: {m.get('date_utc', '-')}",
    ])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit")
    ap.add_argument("--bins")
    ap.add_argument("--bins-from")
    ap.add_argument("--line", metavar="FILE.json")
    ap.add_argument("--md", metavar="FILE.json")
    args = ap.parse_args()
    if args.line:
        print(line(json.load(open(args.line))))
    elif args.md:
        print(markdown(json.load(open(args.md))))
    else:
        print(json.dumps(collect(args)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a training step's time goes on the GPU, from one process's activity records: the
lines `start_ns end_ns stream name` (tab-separated) that timeline_inject.c writes.

    timeline.py LABEL FILE [STEPS]

A step starts at each launch of the encoder's forward kernel (the first kernel of every
training step). For the last STEPS steps (default 5), the median of:
  step          the step's length on the GPU (one encoder launch to the next)
  compute       time some kernel, copy or memset other than NCCL's runs
  nccl          time some NCCL kernel runs
  nccl alone    NCCL kernels running while no other kernel runs (communication not hidden)
  nccl beside   NCCL kernels running beside other kernels (hidden, but sharing the GPU)
  idle          no kernel at all (launch gaps, waits between streams)
  idle before library kernels / before ours
                the idle time split by what runs after the gap: a cuBLAS or NCCL kernel,
                or one of ours (the NVRTC kernels), a copy or a memset
  gaps          the number of idle gaps in the step
and each NCCL kernel of the last step: its name, where in the step it starts and how long it
runs. Prints one JSON line (for the record) after a readable table.
"""
import json
import statistics
import sys


def union(intervals):
    """Sorted, merged copy of (start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals):
    return sum(e - s for s, e in intervals)


def intersect(a, b):
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def is_nccl(name):
    """One of NCCL's kernels (C++ names, mangled)."""
    return "nccl" in name.lower()


def is_library(name):
    """A cuBLAS/cuBLASLt or NCCL kernel (launched by the library, not by our launcher)."""
    low = name.lower()
    return is_nccl(name) or any(k in low for k in ("nvjet", "xmma", "cublas", "cutlass", "gemm", "splitkreduce"))


def gaps_before(inside, lo, hi):
    """The idle gaps of a step: (length, name of what starts after it), kernels in start order."""
    out, covered = [], lo
    for s, e, _, n in sorted(inside):
        if s > covered:
            out.append((s - covered, n))
        covered = max(covered, e)
    if hi > covered:
        out.append((hi - covered, "(end of step)"))
    return out


def short(name):
    """A kernel's name without C++ mangling noise: the part from "nccl" on, 70 characters."""
    at = name.lower().find("nccl")
    return name[max(at, 0):][:70]


def main():
    label, path = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    rows = []
    for line in open(path, errors="replace"):
        start, end, stream, name = line.rstrip("\n").split("\t", 3)
        rows.append((int(start), int(end), int(stream), name))
    rows.sort()
    if not rows:
        sys.exit(f"{path}: no kernels recorded")
    starts = [r[0] for r in rows if "encoder_forward" in r[3]]
    if len(starts) < 2:
        sys.exit(f"{path}: fewer than two encoder_forward launches: no whole step to measure")
    bounds = list(zip(starts, starts[1:]))[-steps:]
    ms = lambda ns: ns / 1e6
    per_step, last = [], None
    for lo, hi in bounds:
        inside = [(max(r[0], lo), min(r[1], hi), r[2], r[3]) for r in rows if r[1] > lo and r[0] < hi]
        compute = union((s, e) for s, e, _, n in inside if not is_nccl(n))
        nccl = union((s, e) for s, e, _, n in inside if is_nccl(n))
        beside = length(intersect(compute, nccl))
        busy = length(union([tuple(x) for x in compute + nccl]))
        gaps = gaps_before(inside, lo, hi)
        per_step.append(
            dict(
                step=ms(hi - lo),
                compute=ms(length(compute)),
                nccl=ms(length(nccl)),
                nccl_alone=ms(length(nccl) - beside),
                nccl_beside=ms(beside),
                idle=ms(hi - lo - busy),
                idle_before_library=ms(sum(g for g, n in gaps if is_library(n))),
                idle_before_ours=ms(sum(g for g, n in gaps if not is_library(n))),
                gaps=len(gaps),
            )
        )
        last = [(ms(s - lo), ms(e - s), stream, n) for s, e, stream, n in inside if is_nccl(n)]
    med = {k: statistics.median(p[k] for p in per_step) for k in per_step[0]}
    print(f"{label}: median of {len(per_step)} steps (ms)")
    for k, v in med.items():
        print(f"  {k:<20} {v:8.3f}")
    if last:
        print(f"  NCCL kernels of the last step (start in the step, ms; duration, ms; stream):")
        for at, dur, stream, name in last:
            print(f"    {at:8.3f} {dur:7.3f}  s{stream}  {short(name)}")
    record = dict(label=label, steps=len(per_step), **{k: round(v, 4) for k, v in med.items()})
    record["nccl_kernels_last_step"] = [
        dict(at_ms=round(a, 4), ms=round(d, 4), stream=s, name=short(n)) for a, d, s, n in last or []
    ]
    print(json.dumps(record))


if __name__ == "__main__":
    main()

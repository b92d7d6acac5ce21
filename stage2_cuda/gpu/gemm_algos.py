#!/usr/bin/env python3
"""How far cuBLAS's own choice is from the fastest algorithm it offers, for each matrix
product of a GPT-2 124M bf16 step (B·T = 16384): the question behind autotuning the plans.

For every product as our backend calls it (layouts, transposes, epilogue, output type and
beta as in common/src/backend/cuda/lt.rs and ops.rs), asks cuBLASLt's heuristic for up to
--candidates algorithms and times each (median of 5 batches of 20 calls, CUDA events), beside
cuBLAS's cublasGemmEx default where our backend calls cuBLAS. Prints one row per product:
what we run now, the fastest candidate, its rank in the heuristic's list and configuration,
and the step's saving (calls a step x the difference).

    python3 stage2_cuda/gpu/gemm_algos.py [--candidates 32] [--bt 16384]

Needs PyTorch (for device memory and events) and libcublasLt / libcublas (ctypes).
"""
import argparse
import ctypes
import ctypes.util
import glob
import os
import statistics
import sys

import torch

# Enum values from cublasLt.h / library_types.h (CUDA 12 and 13 agree).
COMPUTE_32F = 68
R_32F, R_16BF = 0, 14
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
DESC_AUX_POINTER, DESC_AUX_LD, DESC_BIAS_DATA_TYPE = 11, 12, 26
PREF_MAX_WORKSPACE, PREF_ALIGN_A, PREF_ALIGN_B, PREF_ALIGN_C, PREF_ALIGN_D = 1, 5, 6, 7, 8
EPI = {"default": 1, "bias": 4, "gelu_aux_bias": 164, "dgelu": 192, "bgradb": 512}
CFG_ID, CFG_TILE, CFG_SPLITK, CFG_REDUCTION, CFG_SWIZZLE, CFG_STAGES, CFG_CLUSTER = 0, 1, 2, 3, 4, 6, 8
WORKSPACE = 32 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load(name):
    for cand in [f"lib{name}.so.13", f"lib{name}.so.12", f"lib{name}.so"]:
        try:
            return ctypes.CDLL(cand)
        except OSError:
            pass
    for d in [os.path.dirname(torch.__file__) + "/../nvidia/*/lib", "/usr/local/cuda*/lib64"]:
        for path in sorted(glob.glob(f"{d}/lib{name}.so*")):
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    sys.exit(f"lib{name} not found")


lt = load("cublasLt")
blas = load("cublas")
vp = ctypes.c_void_p


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cuBLAS status {status}")


def set_attr(desc, attr, value, ctype):
    v = ctype(value)
    check(lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.sizeof(v)), f"desc attr {attr}")


def layout(dtype, rows, cols, ld):
    h = vp()
    check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(h), dtype, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                        ctypes.c_int64(ld)), "layout")
    return h


def config(algo, attr):
    v, w = ctypes.c_uint32(0), ctypes.c_size_t(0)
    lt.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), 4, ctypes.byref(w))
    return v.value


def describe(algo):
    # Every configuration attribute (cublasLtMatmulAlgoConfigAttributes_t 0..9): id, tile,
    # split-K, reduction, swizzle, custom option, stages, inner shape, cluster shape, ...
    names = ["id", "tile", "splitK", "red", "swz", "custom", "stages", "inner", "cluster", "a9"]
    return " ".join(f"{n} {config(algo, i)}" for i, n in enumerate(names))


def timed(fn, reps=20, batches=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


class Product:
    """D (m,n) = epilogue(op(A) (m,k) · op(B) (k,n)) + beta·D, column-major."""

    def __init__(self, name, calls, m, n, k, ta, tb, epi="default", out_f32=False, beta=0.0, via="lt"):
        self.name, self.calls, self.m, self.n, self.k = name, calls, m, n, k
        self.ta, self.tb, self.epi, self.out_f32, self.beta, self.via = ta, tb, epi, out_f32, beta, via
        dev = "cuda"
        self.A = torch.randn((m * k,), device=dev).to(torch.bfloat16)
        self.B = torch.randn((k * n,), device=dev).to(torch.bfloat16)
        self.D = torch.zeros((m * n,), device=dev, dtype=torch.float32 if out_f32 else torch.bfloat16)
        self.bias = torch.zeros((max(m, n),), device=dev, dtype=torch.float32 if out_f32 else torch.bfloat16)
        self.aux = torch.randn((m * n,), device=dev).to(torch.bfloat16) if epi in ("gelu_aux_bias", "dgelu") else None
        self.ws = torch.empty((WORKSPACE,), device=dev, dtype=torch.uint8)
        self.stream = vp(torch.cuda.current_stream().cuda_stream)

    def lt_setup(self, handle, count):
        desc = vp()
        check(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
        set_attr(desc, DESC_TRANSA, int(self.ta), ctypes.c_int32)
        set_attr(desc, DESC_TRANSB, int(self.tb), ctypes.c_int32)
        set_attr(desc, DESC_EPILOGUE, EPI[self.epi], ctypes.c_int32)
        if self.epi in ("bias", "gelu_aux_bias", "bgradb"):
            if self.out_f32:
                set_attr(desc, DESC_BIAS_DATA_TYPE, R_32F, ctypes.c_int32)
            set_attr(desc, DESC_BIAS_POINTER, self.bias.data_ptr(), ctypes.c_void_p)
        if self.aux is not None:
            set_attr(desc, DESC_AUX_LD, self.m, ctypes.c_int64)
            set_attr(desc, DESC_AUX_POINTER, self.aux.data_ptr(), ctypes.c_void_p)
        m, n, k = self.m, self.n, self.k
        a = layout(R_16BF, k, m, k) if self.ta else layout(R_16BF, m, k, m)
        b = layout(R_16BF, n, k, n) if self.tb else layout(R_16BF, k, n, k)
        d = layout(R_32F if self.out_f32 else R_16BF, m, n, m)
        pref = vp()
        check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        ws = ctypes.c_uint64(WORKSPACE)
        check(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(ws), 8), "ws")
        for attr in (PREF_ALIGN_A, PREF_ALIGN_B, PREF_ALIGN_C, PREF_ALIGN_D):
            al = ctypes.c_uint32(256)
            check(lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(al), 4), "align")
        results = (Heuristic * count)()
        found = ctypes.c_int(0)
        check(lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, count, results, ctypes.byref(found)),
              "heuristic")
        self.desc, self.la, self.lb, self.ld = desc, a, b, d
        return [results[i] for i in range(found.value) if results[i].state == 0 and results[i].workspaceSize <= WORKSPACE]

    def lt_call(self, handle, algo):
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(self.beta)
        D = vp(self.D.data_ptr())
        check(lt.cublasLtMatmul(handle, self.desc, ctypes.byref(alpha), vp(self.A.data_ptr()), self.la,
                                vp(self.B.data_ptr()), self.lb, ctypes.byref(beta), D, self.ld, D, self.ld,
                                ctypes.byref(algo), vp(self.ws.data_ptr()), ctypes.c_size_t(WORKSPACE), self.stream),
              "matmul")

    def blas_call(self, handle):
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(self.beta)
        m, n, k = self.m, self.n, self.k
        lda = k if self.ta else m
        ldb = n if self.tb else k
        check(blas.cublasGemmEx(handle, int(self.ta), int(self.tb), m, n, k, ctypes.byref(alpha),
                                vp(self.A.data_ptr()), R_16BF, lda, vp(self.B.data_ptr()), R_16BF, ldb,
                                ctypes.byref(beta), vp(self.D.data_ptr()), R_32F if self.out_f32 else R_16BF, m,
                                COMPUTE_32F, -1), "gemmex")


def products(bt, L=12, C=768, V=50304):
    P = Product
    return [
        # forward: D (OC,BT) = wᵀ·inp (+bias) by cuBLASLt (TN)
        P("qkv fwd (bias)", L, 3 * C, bt, C, True, False, "bias"),
        P("attproj fwd (bias)", L, C, bt, C, True, False, "bias"),
        P("fc fwd (gelu aux bias)", L, 4 * C, bt, C, True, False, "gelu_aux_bias"),
        P("fcproj fwd (bias)", L, C, bt, 4 * C, True, False, "bias"),
        P("lm head fwd", 1, V, bt, C, True, False, via="blas"),
        # input gradients: dinpᵀ (C,BT) = w (C,OC) · doutᵀ (OC,BT), beta 0 (NN)
        P("qkv dX", L, C, bt, 3 * C, False, False, via="blas"),
        P("attproj dX", L, C, bt, C, False, False, via="blas"),
        P("fc dX", L, C, bt, 4 * C, False, False, via="blas"),
        P("fcproj dX (dgelu)", L, 4 * C, bt, C, False, False, "dgelu"),
        P("lm head dX", 1, C, bt, V, False, False, via="blas"),
        # weight gradients: dwᵀ (C,OC) += inp (C,BT) · dout (OC,BT)ᵀ, f32, beta 1 (NT)
        P("qkv dW", L, C, 3 * C, bt, False, True, out_f32=True, beta=1.0, via="blas"),
        P("attproj dW", L, C, C, bt, False, True, out_f32=True, beta=1.0, via="blas"),
        P("fc dW", L, C, 4 * C, bt, False, True, out_f32=True, beta=1.0, via="blas"),
        P("fcproj dW", L, 4 * C, C, bt, False, True, out_f32=True, beta=1.0, via="blas"),
        P("lm head dW", 1, C, V, bt, False, True, out_f32=True, beta=1.0, via="blas"),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=32)
    ap.add_argument("--bt", type=int, default=16384)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.cuda.init()
    lt_handle, blas_handle = vp(), vp()
    check(lt.cublasLtCreate(ctypes.byref(lt_handle)), "lt create")
    check(blas.cublasCreate_v2(ctypes.byref(blas_handle)), "blas create")
    check(blas.cublasSetStream_v2(blas_handle, vp(torch.cuda.current_stream().cuda_stream)), "stream")
    ws = torch.empty((WORKSPACE,), device="cuda", dtype=torch.uint8)
    check(blas.cublasSetWorkspace_v2(blas_handle, vp(ws.data_ptr()), ctypes.c_size_t(WORKSPACE)), "blas ws")
    print(f"device: {torch.cuda.get_device_name()}  B·T = {args.bt}  candidates asked: {args.candidates}")
    rows, save_total, now_total = [], 0.0, 0.0
    for p in products(args.bt):
        if args.only and args.only not in p.name:
            continue
        flop = 2.0 * p.m * p.n * p.k
        cands = p.lt_setup(lt_handle, args.candidates)
        times = []
        for i, h in enumerate(cands):
            try:
                times.append((timed(lambda: p.lt_call(lt_handle, h.algo)), i,
                              f"{describe(h.algo)} waves {h.wavesCount:.2f} ws {h.workspaceSize >> 10}K"))
            except RuntimeError as e:
                print(f"  {p.name}: candidate {i} failed ({e})")
        now = timed(lambda: p.blas_call(blas_handle)) if p.via == "blas" else (times[0][0] if times else float("nan"))
        best = min(times) if times else (float("nan"), -1, "-")
        for t, i, d in sorted(times)[:4]:
            print(f"  {p.name:<24} cand {i:>2} {t * 1e3:8.1f} us {flop / t / 1e9:6.0f} TFLOP/s  {d}")
        lt0 = times[0][0] if times else float("nan")
        gain = max(0.0, now - best[0]) * p.calls
        save_total += gain
        now_total += now * p.calls
        rows.append((p.name, p.calls, now, lt0, best[0], best[1], len(cands), flop / best[0] / 1e9, gain, best[2]))
    print()
    print("| product | calls | now us | Lt first us | best us | best rank | of | best TFLOP/s | step saving ms | best algorithm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2] * 1e3:.1f} | {r[3] * 1e3:.1f} | {r[4] * 1e3:.1f} | {r[5]} | {r[6]} | {r[7]:.0f} | {r[8]:.3f} | {r[9]} |")
    print(f"\nGEMM_ALGOS products now {now_total:.2f} ms a step; fastest candidates would save {save_total:.2f} ms")


if __name__ == "__main__":
    main()

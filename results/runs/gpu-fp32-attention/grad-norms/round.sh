source .gpu/env.sh >/dev/null 2>&1; cat .gpu/commit
T="train --data data/tinyshakespeare.txt --model gpt2 --tokenizer gpt2 --precision fp32 --batch 8 --seq-len 1024 --steps 100 --stop-after 40 --lr 3e-4 --warmup 10 --min-lr-frac 0.1 --weight-decay 0.1 --grad-clip 1.0 --seed 1337 --eval-every 100 --eval-batches 4 --sample-len 0"
GPT2_GRAD_NORMS=20,30,36,37,38 timeout 200 stage2_cuda $T --out /tmp/gf > $OUT/flash.txt 2>&1
GPT2_CUDA_ATTENTION=gemm GPT2_GRAD_NORMS=20,30,36,37,38 timeout 200 stage2_cuda $T --out /tmp/gg > $OUT/gemm.txt 2>&1
python3 - $OUT <<'PY'
import sys
def load(f):
    d = {}
    for l in open(f):
        if l.startswith("grad-norms step"):
            step = int(l.split()[2].rstrip(":"))
            d[step] = {k: float(v) for k, v in (x.split("=") for x in l.split(":", 1)[1].split())}
    return d
f, g = load(sys.argv[1] + "/flash.txt"), load(sys.argv[1] + "/gemm.txt")
for s in sorted(f):
    tot_f = sum(v * v for v in f[s].values()) ** 0.5; tot_g = sum(v * v for v in g[s].values()) ** 0.5
    print(f"step {s}: total flash {tot_f:.4f} gemm {tot_g:.4f}")
    rel = sorted(((abs(f[s][k] - g[s][k]) / max(g[s][k], 1e-12), k) for k in f[s]), reverse=True)[:8]
    print("   most different:", ", ".join(f"{k} {f[s][k]:.3e}/{g[s][k]:.3e}" for _, k in rel))
    big = sorted(((f[s][k], k) for k in f[s]), reverse=True)[:5]
    print("   largest (flash):", ", ".join(f"{k} {v:.3e} (gemm {g[s][k]:.3e})" for v, k in big))
PY

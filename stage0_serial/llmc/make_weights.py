#!/usr/bin/env python3
"""Write a randomly initialised GPT-2 checkpoint in llm.c's `gpt2_124M.bin` layout.

No pretrained weights are needed to time training steps (speed does not depend on the
values), so this writes the layout that llm.c's `gpt2_build_from_checkpoint` reads:

  header: 256 int32 = [20240326 (magic), 3 (version), maxT, V, L, NH, C, Vp, 0, ...]
  then float32 parameters, in this order (see fill_in_parameter_sizes in train_gpt2.c):
    wte (Vp*C), wpe (maxT*C), ln1w (L*C), ln1b (L*C), qkvw (L*3C*C), qkvb (L*3C),
    attprojw (L*C*C), attprojb (L*C), ln2w (L*C), ln2b (L*C), fcw (L*4C*C), fcb (L*4C),
    fcprojw (L*C*4C), fcprojb (L*C), lnfw (C), lnfb (C)

Values: weight matrices and embeddings N(0, 0.02) (the two residual projections scaled by
1/sqrt(2L), as GPT-2 initialises them), biases 0, layernorm gains 1, the padded vocabulary
rows of wte (V..Vp) 0, as llm.c's export writes them. No numpy: one block of normal floats
is drawn once with Python's `random` and tiled (the block length is prime, so rows of a
matrix do not repeat one another exactly). Deterministic for a given --seed.

Usage: make_weights.py OUT.bin [--seed N] [--layers 12 --heads 12 --width 768 ...]
"""
import argparse
import math
import random
import struct
import sys
from array import array

MAGIC = 20240326
VERSION = 3
BLOCK = 1_000_003  # prime number of floats in the tiled random block (~4 MB)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--padded-vocab", type=int, default=50304)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    a = p.parse_args()

    maxT, V, Vp, L, NH, C = a.max_seq_len, a.vocab, a.padded_vocab, a.layers, a.heads, a.width
    assert Vp >= V and C % NH == 0

    rng = random.Random(a.seed)
    std = 0.02
    normal = array("f", (rng.gauss(0.0, std) for _ in range(BLOCK)))
    proj_scale = 1.0 / math.sqrt(2 * L)
    normal_proj = array("f", (x * proj_scale for x in normal))

    written = 0

    def write_tiled(f, block: array, n: int, offset: int) -> None:
        # n floats from block, starting at block[offset], wrapping around
        nonlocal written
        while n > 0:
            take = min(n, len(block) - offset)
            block[offset:offset + take].tofile(f)
            n -= take
            offset = 0
            written += take

    def write_const(f, value: float, n: int) -> None:
        nonlocal written
        chunk = array("f", [value]) * min(n, 1 << 20)
        while n > 0:
            take = min(n, len(chunk))
            chunk[:take].tofile(f)
            n -= take
            written += take

    cursor = 0  # where in the block the next random tensor starts

    def write_random(f, n: int, proj: bool = False) -> None:
        nonlocal cursor
        write_tiled(f, normal_proj if proj else normal, n, cursor)
        cursor = (cursor + n) % BLOCK

    with open(a.out, "wb") as f:
        header = [0] * 256
        header[:8] = [MAGIC, VERSION, maxT, V, L, NH, C, Vp]
        f.write(struct.pack("<256i", *header))
        write_random(f, V * C)            # wte, real vocabulary rows
        write_const(f, 0.0, (Vp - V) * C)  # wte, padding rows
        write_random(f, maxT * C)         # wpe
        write_const(f, 1.0, L * C)        # ln1w
        write_const(f, 0.0, L * C)        # ln1b
        write_random(f, L * 3 * C * C)    # qkvw
        write_const(f, 0.0, L * 3 * C)    # qkvb
        write_random(f, L * C * C, proj=True)  # attprojw
        write_const(f, 0.0, L * C)        # attprojb
        write_const(f, 1.0, L * C)        # ln2w
        write_const(f, 0.0, L * C)        # ln2b
        write_random(f, L * 4 * C * C)    # fcw
        write_const(f, 0.0, L * 4 * C)    # fcb
        write_random(f, L * C * 4 * C, proj=True)  # fcprojw
        write_const(f, 0.0, L * C)        # fcprojb
        write_const(f, 1.0, C)            # lnfw
        write_const(f, 0.0, C)            # lnfb

    expected = (Vp * C + maxT * C + L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C
                                         + 4 * C * C + 4 * C + 4 * C * C + C) + C + C)
    if written != expected:
        print(f"make_weights: wrote {written} floats, expected {expected}", file=sys.stderr)
        return 1
    print(f"make_weights: {a.out}: {written} parameters "
          f"(maxT={maxT} V={V} Vp={Vp} L={L} NH={NH} C={C}), seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

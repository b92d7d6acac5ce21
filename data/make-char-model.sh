#!/usr/bin/env bash
# Makes data/shakespeare-char/, the small trained model that ships with the project (so that
# `generate` works straight after the build): the char preset (4 layers, 4 heads, width 128,
# byte tokenizer, 0.86M parameters) trained by stage 0 on the bundled corpus for 4 epochs (1960
# steps of 8 x 256 bytes: its whole context) to a validation loss of 1.66 (4.5 minutes on 2
# cores), then exported in Hugging Face's format: model.safetensors (f32, 3.4 MB), config.json
# and the byte vocabulary's tokenizer files; the AdamW moments a checkpoint carries are left
# behind (10 MB with them). `generate --checkpoint DIR` reads such a directory directly.
# Run from the project root after `cargo build --release -p stage0_serial`.
set -eu
BIN=${BIN:-target/release/stage0_serial}
RUN=${RUN:-runs/shakespeare-char}
$BIN train --data data/tinyshakespeare.txt --out "$RUN" --model char --tokenizer byte --epochs 4 \
  --batch 8 --seq-len 256 --lr 6e-3 --warmup 30 --seed 1337 --sample-len 0 --eval-every 490
$BIN export --checkpoint "$RUN/model.ckpt" --format safetensors --out data/shakespeare-char
$BIN generate --checkpoint data/shakespeare-char --prompt "ROMEO:" --max-new-tokens 200 --seed 1

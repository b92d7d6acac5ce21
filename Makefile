# GPT-2 in Rust, four stages. `make run` trains stage 0 on the bundled corpus (it needs only
# the Rust toolchain); `make test` runs every test (CI runs exactly this); `make bench`,
# `make results`. The other targets install missing system packages on first use: MPICH,
# libclang for rsmpi's bindings, hwloc's plugins as the GPU hosts' MPICH has them (for a
# stage 1 test), a font for the plots, and the NVRTC library that the tests use to compile
# the CUDA kernels without a GPU.

SHELL := /bin/bash
CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
NP ?= 2
RUN_DIR := runs
BIN := target/release

# Training settings of `make run` and `make results` (stage 0 and stage 1 share them).
TRAIN_FLAGS := --data data/tinyshakespeare.txt --model char --epochs 2 --batch 16 --seq-len 128 --lr 6e-3 --warmup 30 --seed 1337 --eval-every 98
# The first 100 steps of the same run (schedule over 100 steps), evaluated every 10: where
# the stages should still agree closely, before training amplifies rounding differences.
SHORT_FLAGS := --data data/tinyshakespeare.txt --model char --steps 100 --eval-every 10 --batch 16 --seq-len 128 --lr 6e-3 --warmup 30 --seed 1337 --sample-len 0

# libnvrtc from the PyPI wheel (no GPU needed), for the kernel-compile test.
NVRTC_LIB = $(shell python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)

.PHONY: all deps build run run-mnist mnist-results test bench mlp-cpu-bench llmc-compare char-model docs-corpus results clean

# The GPU stages' runs that gpu/stages.sh wrote into results/runs/, when present.
GPU_RUNS = $(foreach s,stage2 stage3,$(if $(wildcard results/runs/$(1)$(s)/loss.tsv),--run "$(s)=results/runs/$(1)$(s)"))

all: build

deps:
	@missing=""; \
	command -v mpicc >/dev/null || missing="$$missing mpich libmpich-dev"; \
	ldconfig -p | grep -q 'libclang[-.0-9]*\.so' || missing="$$missing libclang-dev"; \
	ls /usr/lib/*/hwloc/hwloc_opencl.so >/dev/null 2>&1 || missing="$$missing libhwloc-plugins"; \
	[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing="$$missing fonts-dejavu-core"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing (apt)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@python3 -c "import nvidia, os, sys; sys.exit(not os.path.exists(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib', 'libnvrtc.so.13')))" 2>/dev/null \
	  || python3 -m pip install -q nvidia-cuda-nvrtc

build: deps
	$(CARGO) build --release --workspace

# Only stage 0 is built here, and it needs no system package: no MPI or CUDA crates to
# compile and nothing to install, so a fresh checkout trains within minutes.
run:
	$(CARGO) build --release -p stage0_serial
	$(BIN)/stage0_serial train $(TRAIN_FLAGS) --out $(RUN_DIR)/stage0

# Fashion-MNIST: Debian's dataset-fashion-mnist (installed on first use, as `deps` installs
# its packages), then the default MLP (784→256→128→10, SGD with momentum) on stage 0 for 20
# epochs: runs/mnist/loss.tsv.
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
run-mnist:
	@[ -f $(FASHION_MNIST) ] || { echo "installing: dataset-fashion-mnist (apt)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq dataset-fashion-mnist >/dev/null; }
	$(CARGO) build --release -p stage0_serial
	$(BIN)/stage0_serial mnist --epochs 20 --out $(RUN_DIR)/mnist

# `make run-mnist`, the same run on stage 1 ($(NP) ranks, the same global batch), then the
# table, the test accuracy and stage 1's against it in results/mnist.md.
mnist-results: run-mnist deps
	$(CARGO) build --release -p stage1_mpi
	mpirun -n $(NP) $(BIN)/stage1_mpi mnist --epochs 20 --out $(RUN_DIR)/mnist-stage1
	results/mnist.sh $(RUN_DIR)/mnist $(RUN_DIR)/mnist-stage1 > results/mnist.md

test: deps
	LD_LIBRARY_PATH=$(NVRTC_LIB):$$LD_LIBRARY_PATH REQUIRE_NVRTC=1 $(CARGO) test --workspace
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --quiet

# The CPU benchmark suite (results/bench-suite.sh; about 6 minutes on 2 quiet cores, more on busy ones): tables and
# plots in results/bench/ (GPT-2 124M's matrix products against a square product's GFLOP/s,
# thread scaling, end-to-end training tokens/s per preset and stage, the MPI all-reduce
# against message size, stage 1 with and without ZeRO-1, the MLP against PyTorch eager) and results/cpu-bench.md (stages 0 and
# 1, 3 runs each in turns).
# One part alone: make bench PARTS=threads. The GPU host's parts: gpu/kernels.sh, gpu/scaling.sh,
# gpu/stages.sh --gpt2.
PARTS ?=
bench: build
	NP=$(NP) results/bench-suite.sh $(PARTS)

# The MLP on stage 0 against PyTorch eager on the CPU, in alternating rounds:
# results/mlp-cpu.md. Installs torch's CPU wheel from PyPI into
# .venv-torch on first use (TORCH_PYTHON=... names a python that has it); when it cannot, says
# so in one line and skips. `make bench` runs it as its part `mlp`; `make test` never does.
mlp-cpu-bench:
	$(CARGO) build --release -p stage0_serial
	BIN=$(BIN)/stage0_serial results/mlp-cpu-bench.sh

# Stage 0 against llm.c's train_gpt2.c on GPT-2 124M, alternating: results/llmc-cpu.md.
llmc-compare: build
	stage0_serial/llmc/compare.sh

# The small trained model that ships in data/shakespeare-char (`generate`'s default), made again.
char-model: deps
	$(CARGO) build --release -p stage0_serial
	BIN=$(BIN)/stage0_serial RUN=$(RUN_DIR)/shakespeare-char data/make-char-model.sh

# data/docs-gpt2/: >= 10M GPT-2 tokens of the documentation Debian ships (linux-doc and
# python3-doc, installed on first use) in llm.c shards of 1M tokens (`tokenize --output-dir`),
# for the run at the used-by scale. Ignored by git: 24 MB, made again by this target.
docs-corpus: deps
	$(CARGO) build --release -p stage0_serial
	BIN=$(BIN)/stage0_serial data/make-docs-corpus.sh

# Stage 0 and stage 1 (2 ranks) on the bundled corpus, same seed and global batch (with the
# GPU stages' runs that gpu/stages.sh wrote into results/runs/), then
# the side-by-side tables and plot in results/README.md. The CPU stages' run folders are made
# afresh (a run into an existing folder would keep the old one in earlier/).
results: build
	rm -rf results/runs/stage0 results/runs/stage1 results/runs/short-stage0 results/runs/short-stage1
	$(BIN)/stage0_serial train $(TRAIN_FLAGS) --out results/runs/stage0
	results/describe-machine.sh > results/runs/stage0/env.txt
	mpirun -n $(NP) $(BIN)/stage1_mpi train $(TRAIN_FLAGS) --out results/runs/stage1
	results/describe-machine.sh > results/runs/stage1/env.txt
	$(BIN)/stage0_serial report --run stage0=results/runs/stage0 --run "stage1 ($(NP) ranks)=results/runs/stage1" $(call GPU_RUNS,) --out results
	$(BIN)/stage0_serial train $(SHORT_FLAGS) --out results/runs/short-stage0
	results/describe-machine.sh > results/runs/short-stage0/env.txt
	mpirun -n $(NP) $(BIN)/stage1_mpi train $(SHORT_FLAGS) --out results/runs/short-stage1
	results/describe-machine.sh > results/runs/short-stage1/env.txt
	$(BIN)/stage0_serial report --run stage0=results/runs/short-stage0 --run "stage1 ($(NP) ranks)=results/runs/short-stage1" $(call GPU_RUNS,short-) --out results/short

clean:
	$(CARGO) clean
	rm -rf $(RUN_DIR)

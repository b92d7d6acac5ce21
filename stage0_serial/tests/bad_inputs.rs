//! Every bad input we know of, run through the stage 0 binary: each must end with one line
//! on stderr naming the problem and exit code 2 (never a panic, never a run that goes on).
//! The table below is also docs/bad-inputs.md's table: `BLESS=1 cargo test -p
//! stage0_serial --test bad_inputs` rewrites that section from what the binary printed,
//! and without BLESS the test fails when the page no longer matches.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_stage0_serial");

/// `mnist` on four idx files (training images and labels, test images and labels), with
/// further flags.
macro_rules! mnist {
    ($ti:literal, $tl:literal, $si:literal, $sl:literal $(, $extra:literal)?) => {
        concat!(
            "mnist --out o --train-images ", $ti, " --train-labels ", $tl,
            " --test-images ", $si, " --test-labels ", $sl $(, " ", $extra)?
        )
    };
}

/// (what is wrong, the command line after the binary's name, a word the message must hold).
/// Files named here are made by `fixtures` in the directory the commands run in.
const CASES: &[(&str, &str, &str)] = &[
    ("corpus missing", "train --data missing.txt --out o", "missing.txt"),
    ("corpus empty", "train --data empty.txt --out o", "empty"),
    (
        "corpus too short for one window",
        "train --data short.txt --out o",
        "short",
    ),
    (
        "corpus neither UTF-8 nor .bin",
        "train --data binary.dat --out o",
        "UTF-8",
    ),
    ("a device as the corpus", "train --data /dev/zero --out o", "device"),
    (
        ".bin with a wrong magic number",
        "train --data magic.bin --out o",
        "magic",
    ),
    (
        ".bin shorter than its header says",
        "train --data size.bin --out o",
        "bytes",
    ),
    (
        ".bin with a token outside the vocabulary",
        "train --data vocab.bin --out o",
        "300",
    ),
    (
        "a directory of shards without *_val_* shards",
        "train --data noval --out o",
        "--val-data",
    ),
    (
        "a pattern that matches no shard",
        "train --data shards/x_*.bin --val-data shards/s_val_000.bin --out o",
        "matches no file",
    ),
    (
        "a shard whose size disagrees with its header",
        "train --data badshards --out o",
        "bytes",
    ),
    (
        "a shard with a token outside the vocabulary",
        "train --data vocabshards --out o --model tiny --batch 4 --seq-len 16 --steps 2 --sample-len 0",
        "byte offset",
    ),
    (
        "a FIFO among the shards",
        "train --data shards/s_train_000.bin pipe --val-data shards/s_val_000.bin --out o",
        "FIFO",
    ),
    (
        "a FIFO as the validation set",
        "train --data corpus.txt --val-data pipe --out o",
        "FIFO",
    ),
    (
        "a held-out fraction of shards",
        "train --data shards --out o --val-fraction 0.2",
        "--val-fraction",
    ),
    (
        "a shard as the batch dump",
        "train --data shards --out o --dump-batches shards/s_train_001.bin",
        "inputs",
    ),
    (
        "resume a run that held out its tail with --val-data",
        "train --data corpus.txt --val-data corpus.txt --out o --resume good.ckpt",
        "--resume-on-new-data",
    ),
    (
        "unknown model preset",
        "train --data corpus.txt --out o --model gpt5",
        "gpt5",
    ),
    (
        "heads that do not divide the width",
        "train --data corpus.txt --out o --heads 3",
        "divide",
    ),
    (
        "a model too large to index",
        "train --data corpus.txt --out o --width 4000000000 --heads 1",
        "too large",
    ),
    (
        "sequence longer than the model's",
        "train --data corpus.txt --out o --model tiny --seq-len 65",
        "--seq-len",
    ),
    ("batch of 0", "train --data corpus.txt --out o --batch 0", "--batch"),
    (
        "negative learning rate",
        "train --data corpus.txt --out o --lr=-1",
        "--lr",
    ),
    (
        "learning rate not a number",
        "train --data corpus.txt --out o --lr nan",
        "--lr",
    ),
    (
        "negative clipping norm",
        "train --data corpus.txt --out o --grad-clip=-1",
        "--grad-clip",
    ),
    (
        "clipping norm not a number",
        "train --data corpus.txt --out o --grad-clip nan",
        "--grad-clip",
    ),
    (
        "floor of the schedule not a number",
        "train --data corpus.txt --out o --min-lr-frac nan",
        "--min-lr-frac",
    ),
    (
        "evaluation every 0 steps",
        "train --data corpus.txt --out o --eval-every 0",
        "--eval-every",
    ),
    (
        "all of the corpus held out",
        "train --data corpus.txt --out o --val-fraction 1",
        "--val-fraction",
    ),
    (
        "more threads than 4 per core",
        "train --data corpus.txt --out o --threads 100000",
        "--threads",
    ),
    (
        "both --steps and --epochs",
        "train --data corpus.txt --out o --steps 3 --epochs 1",
        "--epochs",
    ),
    (
        "a GPU flag on a CPU stage",
        "train --data corpus.txt --out o --precision fp32",
        "--precision",
    ),
    (
        "a multi-process flag in one process",
        "train --data corpus.txt --out o --overlap",
        "--overlap",
    ),
    (
        "ZeRO in one process",
        "train --data corpus.txt --out o --zero 1",
        "--zero applies to the multi-process stages",
    ),
    (
        "checkpoint missing",
        "generate --checkpoint missing.ckpt",
        "missing.ckpt",
    ),
    (
        "checkpoint truncated",
        "generate --checkpoint truncated.ckpt",
        "truncated",
    ),
    (
        "checkpoint with a flipped byte",
        "generate --checkpoint corrupt.ckpt",
        "checksum",
    ),
    ("checkpoint holding NaN", "generate --checkpoint nan.ckpt", "NaN"),
    (
        "not a checkpoint",
        "generate --checkpoint corpus.txt",
        "not a checkpoint",
    ),
    (
        "resume with another batch size",
        "train --data corpus.txt --out o --resume good.ckpt --batch 2",
        "--batch",
    ),
    (
        "an MLP checkpoint given to train",
        "train --data corpus.txt --out o --resume mlp.ckpt",
        "MLP checkpoint",
    ),
    (
        "resume with another model",
        "train --data corpus.txt --out o --resume good.ckpt --layers 3",
        "n_layer",
    ),
    (
        "resume with another seed",
        "train --data corpus.txt --out o --resume good.ckpt --seed 7",
        "--seed",
    ),
    (
        "resume with another tokenizer",
        "train --data corpus.txt --out o --resume good.ckpt --tokenizer gpt2",
        "--tokenizer",
    ),
    (
        "resume to a step already done",
        "train --data corpus.txt --out o --resume good.ckpt --steps 2",
        "--steps",
    ),
    (
        "stop before the checkpoint's step",
        "train --data corpus.txt --out o --resume good.ckpt --steps 10 --stop-after 2",
        "--stop-after",
    ),
    (
        "unbounded generation",
        "generate --checkpoint good.ckpt --max-new-tokens 18446744073709551615",
        "--max-new-tokens",
    ),
    (
        "temperature 0 without --greedy",
        "generate --checkpoint good.ckpt --temperature 0",
        "--temperature",
    ),
    (
        "--greedy with --top-k",
        "generate --checkpoint good.ckpt --greedy --top-k 5",
        "--top-k",
    ),
    ("empty prompt", "generate --checkpoint good.ckpt --prompt ''", "prompt"),
    (
        "a prompt that fills the context",
        "generate --checkpoint good.ckpt --prompt ROMEO:ROMEO:ROMEO:",
        "context",
    ),
    (
        "prompt file missing",
        "generate --checkpoint good.ckpt --prompt-file missing.txt",
        "missing.txt",
    ),
    (
        "prompt file without a prompt",
        "generate --checkpoint good.ckpt --prompt-file empty.txt",
        "no prompt",
    ),
    (
        "--prompt with --prompt-file",
        "generate --checkpoint good.ckpt --prompt a --prompt-file corpus.txt",
        "--prompt-file",
    ),
    ("top-p of 0", "generate --checkpoint good.ckpt --top-p 0", "--top-p"),
    (
        "--greedy with --top-p",
        "generate --checkpoint good.ckpt --greedy --top-p 0.9",
        "--top-p",
    ),
    (
        "empty stop string",
        "generate --checkpoint good.ckpt --stop ''",
        "--stop",
    ),
    (
        "import from a directory without config.json",
        "import --from missing --out o.ckpt",
        "config.json",
    ),
    (
        "safetensors header longer than the file",
        "import --from hf-header --out o.ckpt",
        "header claims",
    ),
    (
        "safetensors offsets outside the file",
        "import --from hf-offsets --out o.ckpt",
        "safetensors",
    ),
    (
        "safetensors without a tensor the model needs",
        "import --from hf-missing --out o.ckpt",
        "missing",
    ),
    (
        "config.json whose shapes the tensors do not have",
        "import --from hf-shape --out o.ckpt",
        "shape",
    ),
    (
        "config.json with more blocks than the file holds",
        "import --from hf-layers --out o.ckpt",
        "blocks",
    ),
    (
        "config.json of another architecture",
        "import --from hf-relu --out o.ckpt",
        "activation_function",
    ),
    (
        "generate from a directory that is not a GPT-2 model",
        "generate --checkpoint hf-relu",
        "activation_function",
    ),
    (
        "--dump-batches into a missing directory",
        "train --data corpus.txt --out o --batch 4 --dump-batches missing/b.bin",
        "missing/b.bin",
    ),
    (
        "--dump-batches naming a directory",
        "train --data corpus.txt --out o --batch 4 --dump-batches hf-relu",
        "is a directory",
    ),
    (
        "--save-init with --resume",
        "train --data corpus.txt --out o --save-init --resume good.ckpt",
        "--save-init",
    ),
    (
        "resume an imported checkpoint",
        "train --data corpus.txt --out o --resume imported.ckpt",
        "--init-from",
    ),
    (
        "--init-from with a model flag",
        "train --data corpus.txt --out o --init-from good.ckpt --layers 3",
        "--init-from",
    ),
    (
        "--init-from with --resume",
        "train --data corpus.txt --out o --init-from good.ckpt --resume good.ckpt",
        "--init-from",
    ),
    (
        "a batch no memory holds",
        "bench --model gpt2 --batch 4000000000000",
        "too large",
    ),
    (
        "a batch whose attention state would not fit a 64-bit size",
        "bench --batch 2000000000000000",
        "too large",
    ),
    ("vocabulary of 0", "bench --vocab 0", "--vocab"),
    (
        "a flag's value with a newline in it",
        "train --data corpus.txt --out o --model x\ny",
        "unknown model preset 'x\\ny'",
    ),
    (
        "tokenize a missing file",
        "tokenize --input missing.txt --output out.bin",
        "missing.txt",
    ),
    (
        "idx file with a wrong magic",
        mnist!("magic.idx", "train-labels.idx", "test-images.idx", "test-labels.idx"),
        "magic",
    ),
    (
        "idx header counts that disagree with the file's size",
        mnist!("size.idx", "train-labels.idx", "test-images.idx", "test-labels.idx"),
        "bytes follow",
    ),
    (
        "idx label outside the 10 classes",
        mnist!("train-images.idx", "label-12.idx", "test-images.idx", "test-labels.idx"),
        "label 12",
    ),
    (
        "idx images and labels of different counts",
        mnist!(
            "train-images.idx",
            "test-labels.idx",
            "test-images.idx",
            "test-labels.idx"
        ),
        "labels",
    ),
    (
        "idx test images of another size than the training images",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "small-images.idx",
            "test-labels.idx"
        ),
        "pixels",
    ),
    (
        "labels where the images belong",
        mnist!(
            "train-labels.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx"
        ),
        "labels file",
    ),
    (
        "some of the four idx files only",
        "mnist --out o --train-images train-images.idx",
        "--train-labels",
    ),
    (
        "a hidden layer of width 0",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--hidden 64,0"
        ),
        "--hidden",
    ),
    (
        "an MLP layer of 2^31 weights or more",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--hidden 5000000000,5000000000"
        ),
        "2^31",
    ),
    (
        "an MLP batch larger than the training set",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--batch 500"
        ),
        "--batch",
    ),
    (
        "an MLP run resumed with another batch size",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--epochs 2 --resume mlp.ckpt --batch 40"
        ),
        "--batch",
    ),
    (
        "an MLP run resumed on other images",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "other-images.idx",
            "other-labels.idx",
            "--epochs 2 --resume mlp.ckpt"
        ),
        "test set",
    ),
    (
        "a GPT-2 checkpoint given to mnist --resume",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--epochs 2 --resume good.ckpt"
        ),
        "GPT-2 checkpoint",
    ),
    (
        "an MLP checkpoint with a flipped byte",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--epochs 2 --resume mlp-corrupt.ckpt"
        ),
        "corrupt",
    ),
    (
        "momentum with AdamW",
        mnist!(
            "train-images.idx",
            "train-labels.idx",
            "test-images.idx",
            "test-labels.idx",
            "--optimizer adamw --momentum 0.5"
        ),
        "--momentum",
    ),
    (
        "plot: a column the table lacks",
        "plot --data table.tsv --x threads --y tokens --out p.png",
        "tokens",
    ),
    (
        "plot: a value that is not a number",
        "plot --data table.tsv --x threads --y note --out p.png",
        "not a number",
    ),
    (
        "plot: a value that is not finite",
        "plot --data infinite.tsv --x threads --y speed --out p.png",
        "not finite",
    ),
    (
        "more steps than any run (--epochs 1e300)",
        "train --data corpus.txt --out o --model tiny --batch 4 --seq-len 16 --epochs 1e300",
        "ask for fewer",
    ),
    (
        "a batch dump over the corpus",
        "train --data corpus.txt --out o --dump-batches corpus.txt",
        "inputs",
    ),
    (
        "an all-reduce message past 64 GiB",
        "bench --allreduce --allreduce-max-mb 17592186044416",
        "65536",
    ),
    (
        "a prompt and new tokens past the counters' range",
        "bench --model tiny --generate --seq-len 60 --new-tokens 18446744073709551615",
        "--new-tokens",
    ),
    (
        "--out naming a file",
        "train --data corpus.txt --out corpus.txt --model tiny --batch 4 --seq-len 16",
        "is a file",
    ),
    (
        "--init-from a directory",
        "train --data corpus.txt --out o --init-from hf-relu",
        "import",
    ),
    (
        "a checkpoint whose learning rate is negative",
        "train --data corpus.txt --out o --resume lr-negative.ckpt",
        "lr",
    ),
    (
        "a checkpoint whose learning rate is not a number",
        "train --data corpus.txt --out o --resume lr-text.ckpt",
        "not a number",
    ),
    (
        "a checkpoint whose schedule floor is above 1",
        "train --data corpus.txt --out o --resume floor.ckpt",
        "min_lr_frac",
    ),
    (
        "a checkpoint whose log counts more steps than it ran",
        "train --data corpus.txt --out o --resume window-steps.ckpt",
        "more steps",
    ),
    (
        "a checkpoint whose data cursor is past its steps",
        "train --data corpus.txt --out o --resume epoch.ckpt",
        "epoch 18446744073709551615 after 4 steps",
    ),
    (
        "report: a loss that is not a number",
        "report --run a=badloss --out o",
        "not a number",
    ),
    (
        "report: a run without a label",
        "report --run =badloss --out o",
        "LABEL=DIR",
    ),
    (
        "report: two runs of one label",
        "report --run a=run --run a=run --out o",
        "twice",
    ),
    (
        "plot: values too far apart for an axis",
        "plot --data huge.tsv --x threads --y speed --out p.png",
        "too long",
    ),
    (
        "plot: a chart that is not a PNG",
        "plot --data table.tsv --x threads --y speedup --out p.jpg2",
        "PNG",
    ),
    (
        "export: --out naming a file",
        "export --checkpoint good.ckpt --out corpus.txt",
        "is a file",
    ),
    (
        "logits written into a pipe",
        "generate --checkpoint good.ckpt --prompt ab --max-new-tokens 2 --dump-logits pipe",
        "not a regular file",
    ),
    (
        "tokens written over their own text",
        "tokenize --input corpus.txt --output ./corpus.txt",
        "--input",
    ),
    (
        "bench: more warm-up steps than 1,000,000",
        "bench --model tiny --generate --warmup 18446744073709551615",
        "--warmup",
    ),
    (
        "bench: kernel rows past 2^20",
        "bench --kernels --kernel-tokens 4611686018427387904",
        "--kernel-tokens",
    ),
    (
        "mnist: more timed steps than 1,000,000",
        "mnist --synthetic --bench --steps 10000000000",
        "--steps",
    ),
    // A FIFO where a file is needed is refused before it is opened (which would wait for a
    // writer); so is a device, which never ends.
    (
        "a FIFO as the corpus",
        "train --data pipe --out o",
        "named pipe (FIFO), not a corpus file",
    ),
    (
        "a FIFO as the checkpoint to resume",
        "train --data corpus.txt --out o --resume pipe",
        "not a checkpoint file",
    ),
    (
        "a FIFO as idx images",
        mnist!("pipe", "train-labels.idx", "test-images.idx", "test-labels.idx"),
        "not an idx file",
    ),
    (
        "a device as idx images",
        mnist!("/dev/zero", "train-labels.idx", "test-images.idx", "test-labels.idx"),
        "a device, not an idx file",
    ),
    (
        "a device as idx labels",
        mnist!("train-images.idx", "/dev/zero", "test-images.idx", "test-labels.idx"),
        "a device, not an idx file",
    ),
    (
        "a FIFO as the checkpoint to generate from",
        "generate --checkpoint pipe",
        "not a checkpoint file",
    ),
    (
        "a FIFO as the prompt file",
        "generate --checkpoint good.ckpt --prompt-file pipe",
        "not a prompt file",
    ),
    (
        "a device as the prompt file",
        "generate --checkpoint good.ckpt --prompt-file /dev/zero",
        "a device",
    ),
    (
        "a prompt file past 16 MiB",
        "generate --checkpoint good.ckpt --prompt-file big-prompt.txt",
        "16 MiB",
    ),
    (
        "tokenize a FIFO",
        "tokenize --input pipe --output out.bin",
        "not a corpus file",
    ),
    (
        "report: a loss table that is a FIFO",
        "report --run a=fifo-run --out o",
        "not a loss table",
    ),
    (
        "report: a loss table that is a device",
        "report --run a=zero-run --out o",
        "a device, not a loss table",
    ),
    (
        "report: a loss table past 256 MiB",
        "report --run a=big-run --out o",
        "256 MiB",
    ),
    (
        "plot: a FIFO as the table",
        "plot --data pipe --x threads --y speedup --out p.png",
        "not a table to plot",
    ),
    (
        "plot: a device as the table",
        "plot --data /dev/zero --x threads --y speedup --out p.png",
        "a device",
    ),
    (
        "plot: a table past 64 MiB",
        "plot --data big-table.tsv --x threads --y speedup --out p.png",
        "64 MiB",
    ),
    (
        "export: a FIFO as the checkpoint",
        "export --checkpoint pipe --out hf-out",
        "not a checkpoint file",
    ),
    (
        "import: a config.json that is a FIFO",
        "import --from hf-fifo --out o.ckpt",
        "not a config.json file",
    ),
    // An output never replaces an input: same path, symbolic or hard link.
    (
        "logits written over the checkpoint",
        "generate --checkpoint good.ckpt --prompt ab --dump-logits good.ckpt",
        "inputs",
    ),
    (
        "plot: a chart over its own table (a hard link)",
        "plot --data table.tsv --x threads --y speedup --out table-link.png",
        "inputs",
    ),
    (
        "import: the checkpoint over the weights it reads",
        "import --from hf --out hf/model.safetensors",
        "inputs",
    ),
    (
        "export: the weights over the checkpoint they come from",
        "export --checkpoint hf/model.safetensors --out hf",
        "--checkpoint",
    ),
    (
        "tokens written over a hard link of their text",
        "tokenize --input corpus.txt --output corpus-link.txt",
        "--input",
    ),
    // Documents into shards (`tokenize --output-dir`).
    (
        "tokenize: a pattern that matches no document",
        "tokenize --input docs/*.md --output-dir o",
        "matches no file",
    ),
    (
        "tokenize: a directory that holds no document",
        "tokenize --input emptydir --output-dir o",
        "no file",
    ),
    (
        "tokenize: a FIFO among the documents",
        "tokenize --input docs pipe --output-dir o",
        "FIFO",
    ),
    (
        "tokenize: a document that is not UTF-8",
        "tokenize --input docs binary.dat --output-dir o",
        "UTF-8",
    ),
    (
        "tokenize: shards into a directory that holds shards",
        "tokenize --input docs --output-dir shards",
        "already holds",
    ),
    (
        "tokenize: shards into the directory of the documents",
        "tokenize --input docs --output-dir docs",
        "holds the input",
    ),
    (
        "tokenize: shards into a file",
        "tokenize --input docs --output-dir empty.txt",
        "not a directory",
    ),
    (
        "tokenize: shards of no tokens",
        "tokenize --input docs --output-dir o --shard-tokens 0",
        "--shard-tokens",
    ),
    (
        "tokenize: shards larger than the .bin header counts",
        "tokenize --input docs --output-dir o --shard-tokens 4294967296",
        "--shard-tokens",
    ),
    (
        "tokenize: validation takes every document",
        "tokenize --input docs --output-dir o --val-tokens 1000000",
        "--val-tokens",
    ),
    (
        "tokenize: a prefix that reads as validation",
        "tokenize --input docs --output-dir o --prefix web_val_",
        "_val_",
    ),
    (
        "tokenize: shards with the byte tokenizer (no end-of-text token)",
        "tokenize --input docs --output-dir o --tokenizer byte",
        "endoftext",
    ),
    (
        "tokenize: a directory into one .bin",
        "tokenize --input docs --output out.bin",
        "--output-dir",
    ),
    (
        "tokenize: shard flags with --output",
        "tokenize --input corpus.txt --output out.bin --shard-tokens 1000",
        "--shard-tokens",
    ),
    // Flags that would change nothing, or the run's data without a word.
    (
        "a warmup longer than the run",
        "train --data corpus.txt --out o --model tiny --batch 4 --seq-len 16 --steps 4 --warmup 18446744073709551615",
        "--warmup",
    ),
    (
        "--stop-after at the run's last step",
        "train --data corpus.txt --out o --model tiny --batch 4 --seq-len 16 --steps 4 --stop-after 4",
        "--stop-after",
    ),
    (
        "resume for fewer steps than the checkpoint's warmup",
        "train --data corpus.txt --out o --resume warmup6.ckpt --steps 5",
        "--warmup",
    ),
    (
        "resume on another corpus",
        "train --data other.txt --out o --resume good.ckpt",
        "--resume-on-new-data",
    ),
    ("unknown subcommand", "fly", "fly"),
    ("unknown flag", "train --data corpus.txt --out o --lr-max 1", "--lr-max"),
];

/// Splits a command line on spaces; `''` is an empty argument.
fn words(line: &str) -> Vec<String> {
    line.split(' ')
        .map(|w| if w == "''" { String::new() } else { w.to_string() })
        .collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn bin_file(magic: i32, count: i32, tokens: &[u16]) -> Vec<u8> {
    let mut header = [0i32; 256];
    (header[0], header[1], header[2]) = (magic, 1, count);
    let mut bytes: Vec<u8> = header.iter().flat_map(|h| h.to_le_bytes()).collect();
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    bytes
}

/// The files the cases name, in a fresh directory.
fn fixtures() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stage0-bad-inputs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = "ROMEO:\nBut soft, what light through yonder window breaks?\n\n".repeat(60);
    write(&dir, "corpus.txt", text.as_bytes());
    write(&dir, "empty.txt", b"");
    write(&dir, "short.txt", b"too short");
    write(&dir, "binary.dat", &[0xff, 0xfe, 0x00, 0x80, 0x81]);
    write(
        &dir,
        "table.tsv",
        b"threads\tspeedup\tnote\n1\t1.0\tbase\n2\t1.9\tquiet\n",
    );
    write(&dir, "infinite.tsv", b"threads\tspeed\n1\tinf\n2\t3\n");
    write(&dir, "huge.tsv", b"threads\tspeed\n1\t1e308\n2\t-1e308\n");
    // Documents for `tokenize --output-dir`, and a directory without any.
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::create_dir_all(dir.join("emptydir")).unwrap();
    write(&dir.join("docs"), "a.txt", text.as_bytes());
    write(&dir.join("docs"), "b.txt", b"JULIET:\nO Romeo, Romeo!\n");
    std::fs::create_dir_all(dir.join("badloss")).unwrap();
    let losses = b"epoch\ttrain_loss\tval_loss\tbad_steps\ttokens_per_s\telapsed_s\n1.0\t2.5\tx\t0\t100\t1.0\n";
    write(&dir.join("badloss"), "loss.tsv", losses);
    let fifo = Command::new("mkfifo").arg(dir.join("pipe")).status().unwrap();
    assert!(fifo.success(), "mkfifo");
    let tokens: Vec<u16> = (0..2000).map(|i| (i % 200) as u16).collect();
    write(&dir, "magic.bin", &bin_file(12345, 2000, &tokens));
    write(&dir, "size.bin", &bin_file(20240520, 3000, &tokens));
    let mut big = tokens.clone();
    big[77] = 300;
    write(&dir, "vocab.bin", &bin_file(20240520, 2000, &big));
    // Shard directories: a good one, one without validation shards, one with a shard its
    // header disagrees with, one whose training tokens are all outside the byte vocabulary.
    let shard = bin_file(20240520, 2000, &tokens);
    for (sub, name, bytes) in [
        ("shards", "s_train_000.bin", &shard[..]),
        ("shards", "s_train_001.bin", &shard[..]),
        ("shards", "s_val_000.bin", &shard[..]),
        ("noval", "n_train_000.bin", &shard[..]),
        ("badshards", "b_train_000.bin", &shard[..]),
        ("badshards", "b_train_001.bin", &shard[..shard.len() - 2]),
        ("badshards", "b_val_000.bin", &shard[..]),
        (
            "vocabshards",
            "v_train_000.bin",
            &bin_file(20240520, 2000, &[300; 2000]),
        ),
        ("vocabshards", "v_val_000.bin", &shard[..]),
    ] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        write(&dir.join(sub), name, bytes);
    }
    // Good idx files (made-up images: 200 for training, 100 for test) and broken ones.
    let idx_pair = |set: &common::mnist::Dataset, name: &str| {
        let (images, labels) = (
            dir.join(format!("{name}-images.idx")),
            dir.join(format!("{name}-labels.idx")),
        );
        common::mnist::synthetic::write_idx(set, &images, &labels).unwrap();
    };
    let train = common::mnist::synthetic::dataset(200, 8, 1);
    idx_pair(&train, "train");
    idx_pair(&common::mnist::synthetic::dataset(100, 8, 2), "test");
    idx_pair(&common::mnist::synthetic::dataset(100, 6, 2), "small");
    idx_pair(&common::mnist::synthetic::dataset(100, 8, 3), "other");
    let images = std::fs::read(dir.join("train-images.idx")).unwrap();
    let mut magic = images.clone();
    magic[2] = 0x0d; // another type code reads as another format
    magic[0] = 0x1b;
    write(&dir, "magic.idx", &magic);
    write(&dir, "size.idx", &images[..images.len() - 10]);
    let mut labels = train.labels.clone();
    labels[17] = 12;
    write(&dir, "label-12.idx", &common::mnist::idx::encode(&[200], &labels));
    // An MLP checkpoint (3 steps an epoch, stopped after 2) and a copy with a flipped byte.
    let mlp = "mnist --out mlprun --train-images train-images.idx --train-labels train-labels.idx \
               --test-images test-images.idx --test-labels test-labels.idx --epochs 2 --stop-after 2";
    let o = Command::new(BIN).args(words(mlp)).current_dir(&dir).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mlp = std::fs::read(dir.join("mlprun/mlp.ckpt")).unwrap();
    write(&dir, "mlp.ckpt", &mlp);
    let mut flipped = mlp.clone();
    flipped[mlp.len() / 2] ^= 0x40;
    write(&dir, "mlp-corrupt.ckpt", &flipped);
    // A good checkpoint (tiny model, 4 steps) and broken copies of it.
    let train = "train --data corpus.txt --out run --model tiny --batch 4 --seq-len 16 --steps 4 --sample-len 0 --eval-batches 1";
    let o = Command::new(BIN).args(words(train)).current_dir(&dir).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let good = std::fs::read(dir.join("run/model.ckpt")).unwrap();
    write(&dir, "good.ckpt", &good);
    write(&dir, "truncated.ckpt", &good[..good.len() / 2]);
    let mut flipped = good.clone();
    let at = flipped.len() - 100;
    flipped[at] ^= 0x40;
    write(&dir, "corrupt.ckpt", &flipped);
    // NaN as the first parameter, with a checksum that matches (the format's xxHash64).
    let mut nan = good.clone();
    let meta_len = u64::from_le_bytes(nan[16..24].try_into().unwrap()) as usize;
    let params = 24 + meta_len + 8;
    nan[params..params + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let body = nan.len() - 8;
    let sum = xxhash_rust::xxh64::xxh64(&nan[..body], 0);
    nan[body..].copy_from_slice(&sum.to_le_bytes());
    write(&dir, "nan.ckpt", &nan);
    // Run settings no flag would take, in checkpoints whose checksums match.
    let settings = [
        ("lr-negative", "lr", serde_json::json!(-1.0)),
        ("lr-text", "lr", "x".into()),
        ("floor", "min_lr_frac", 7.into()),
    ];
    for (name, key, value) in settings {
        write(
            &dir,
            &format!("{name}.ckpt"),
            &with_meta(&good, &format!("/train/{key}"), value),
        );
    }
    // A run of 8 steps with a warmup of 6, to be resumed for fewer steps than its warmup.
    let long = with_meta(&good, "/train/total_steps", 8.into());
    write(&dir, "warmup6.ckpt", &with_meta(&long, "/train/warmup", 6.into()));
    // Counters no run of its 4 steps could have written (they would overflow as it goes on).
    let counters = [
        ("window-steps", "/progress/window/steps", u64::MAX),
        ("epoch", "/data_epoch", u64::MAX),
    ];
    for (name, at, value) in counters {
        write(&dir, &format!("{name}.ckpt"), &with_meta(&good, at, value.into()));
    }
    hf_fixtures(&dir);
    special_fixtures(&dir);
    dir
}

/// Files that are not what they seem: a FIFO (made above) or a device under a file's name,
/// files past a reader's limit (sparse: nothing is written), links to inputs and another
/// corpus.
fn special_fixtures(dir: &Path) {
    let fifo = |at: &Path| {
        let made = Command::new("mkfifo").arg(at).status().unwrap();
        assert!(made.success(), "mkfifo {}", at.display());
    };
    let sparse = |at: &Path, bytes: u64| std::fs::File::create(at).unwrap().set_len(bytes).unwrap();
    for run in ["fifo-run", "zero-run", "big-run"] {
        std::fs::create_dir_all(dir.join(run)).unwrap();
    }
    fifo(&dir.join("fifo-run/loss.tsv"));
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero-run/loss.tsv")).unwrap();
    sparse(&dir.join("big-run/loss.tsv"), (256 << 20) + 1);
    sparse(&dir.join("big-prompt.txt"), (16 << 20) + 1);
    sparse(&dir.join("big-table.tsv"), (64 << 20) + 1);
    std::fs::hard_link(dir.join("table.tsv"), dir.join("table-link.png")).unwrap();
    std::fs::hard_link(dir.join("corpus.txt"), dir.join("corpus-link.txt")).unwrap();
    let other = "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n\n".repeat(60);
    write(dir, "other.txt", other.as_bytes());
    // A Hugging Face directory whose config.json is a FIFO.
    std::fs::create_dir_all(dir.join("hf-fifo")).unwrap();
    std::fs::copy(dir.join("hf/model.safetensors"), dir.join("hf-fifo/model.safetensors")).unwrap();
    fifo(&dir.join("hf-fifo/config.json"));
}

/// The checkpoint `ckpt` with the metadata's value at JSON pointer `at` (e.g. "/train/lr")
/// set to `value`, its lengths and checksum made to match.
fn with_meta(ckpt: &[u8], at: &str, value: serde_json::Value) -> Vec<u8> {
    let meta_len = u64::from_le_bytes(ckpt[16..24].try_into().unwrap()) as usize;
    let mut meta: serde_json::Value = serde_json::from_slice(&ckpt[24..24 + meta_len]).unwrap();
    *meta
        .pointer_mut(at)
        .unwrap_or_else(|| panic!("no {at} in the checkpoint's metadata")) = value;
    let json = serde_json::to_vec(&meta).unwrap();
    let mut out = ckpt[..16].to_vec();
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&ckpt[24 + meta_len..ckpt.len() - 8]);
    let sum = xxhash_rust::xxh64::xxh64(&out, 0);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A good export of good.ckpt (`hf`), its import, and broken copies of the export: each
/// `hf-NAME` directory is `hf` with one file changed.
fn hf_fixtures(dir: &Path) {
    let run = |line: &str| {
        let o = Command::new(BIN).args(words(line)).current_dir(dir).output().unwrap();
        assert!(o.status.success(), "{line}: {}", String::from_utf8_lossy(&o.stderr));
    };
    run("export --checkpoint good.ckpt --out hf");
    run("import --from hf --out imported.ckpt");
    let weights = std::fs::read(dir.join("hf/model.safetensors")).unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("hf/config.json")).unwrap()).unwrap();
    let variant = |name: &str, weights: &[u8], config: &serde_json::Value| {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        write(&dir.join(name), "model.safetensors", weights);
        write(&dir.join(name), "config.json", &serde_json::to_vec(config).unwrap());
    };
    let mut lying = weights.clone();
    lying[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    variant("hf-header", &lying, &config);
    // The header's JSON edited, and the file rebuilt around it.
    let n = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&weights[8..8 + n]).unwrap();
    let rebuilt = |edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        let mut h = header.clone();
        edit(h.as_object_mut().unwrap());
        let json = serde_json::to_vec(&h).unwrap();
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&weights[8 + n..]);
        out
    };
    let offsets = rebuilt(&|h| h["transformer.wpe.weight"]["data_offsets"] = serde_json::json!([0, 1u64 << 40]));
    variant("hf-offsets", &offsets, &config);
    // A tensor under the name of a buffer import skips (the attention mask older exports carry).
    let missing = rebuilt(&|h| {
        let entry = h.remove("transformer.h.1.mlp.c_fc.bias").unwrap();
        h.insert("transformer.h.1.attn.bias".into(), entry);
    });
    variant("hf-missing", &missing, &config);
    let edited = |field: &str, value: serde_json::Value| {
        let mut c = config.clone();
        c[field] = value;
        c
    };
    variant("hf-shape", &weights, &edited("n_positions", 32.into()));
    variant("hf-layers", &weights, &edited("n_layer", 4096.into()));
    variant("hf-relu", &weights, &edited("activation_function", "relu".into()));
}

/// The message as docs/bad-inputs.md shows it: what depends on this machine (its cores) or on the
/// fixture run (the checkpoint's size, which holds the run's time) is named, not printed.
fn machine_independent(msg: &str, checkpoint_bytes: usize) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    msg.replace(
        &format!("at most {} (4 per core; this host has {cores})", 4 * cores),
        "at most 4 × cores (4 per core)",
    )
    .replace(&format!("expected {checkpoint_bytes} bytes"), "expected SIZE bytes")
    .replace(&format!("found {}", checkpoint_bytes / 2), "found SIZE/2")
}

#[test]
fn every_bad_input_is_one_line_and_exit_2() {
    let dir = fixtures();
    let checkpoint_bytes = std::fs::metadata(dir.join("good.ckpt")).unwrap().len() as usize;
    let mut table = String::from("| what is wrong | command | exit | message |\n| --- | --- | ---: | --- |\n");
    let mut failures = Vec::new();
    for &(what, line, needle) in CASES {
        let o = Command::new(BIN).args(words(line)).current_dir(&dir).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
        let code = o.status.code();
        if code != Some(2) || err.lines().count() != 1 || !err.contains(needle) || err.contains("panicked") {
            failures.push(format!("{what}: `{line}` gave {code:?}: {err}"));
        }
        if dir.join("o").exists() {
            failures.push(format!("{what}: `{line}` wrote o/ before refusing"));
        }
        let shown = machine_independent(&err, checkpoint_bytes).replace('|', "\\|");
        table.push_str(&format!(
            "| {what} | `stage0_serial {}` | {} | {shown} |\n",
            line.replace('\n', "\\n"),
            code.unwrap_or(-1)
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    check_readme(&table);
}

/// docs/bad-inputs.md's section between the markers must be `table` (BLESS=1 writes it).
fn check_readme(table: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bad-inputs.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- bad-inputs: begin -->\n", "<!-- bad-inputs: end -->");
    let (Some(a), Some(b)) = (readme.find(begin), readme.find(end)) else {
        panic!("docs/bad-inputs.md has no {begin:?} ... {end:?} section");
    };
    let current = &readme[a + begin.len()..b];
    if std::env::var_os("BLESS").is_some() {
        let updated = format!("{}{begin}{table}{}", &readme[..a], &readme[b..]);
        std::fs::write(&path, updated).unwrap();
    } else {
        assert_eq!(
            current, table,
            "docs/bad-inputs.md's table is out of date: run BLESS=1 cargo test -p stage0_serial --test bad_inputs"
        );
    }
}

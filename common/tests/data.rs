//! Tests for the tokenizers, the llm.c `.bin` format, `load_tokens`, `split`, the shuffled
//! sharded `Loader` and `eval_batches`. References: GPT-2 ids from tiktoken's r50k_base.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::data::{
    eval_batches, load_tokens, read_bin, resolve, split, write_bin, Batch, BatchSource, Batches, DataCursor, DataOrder,
    Loader, ShardLoader, ShardSet, TrainSource, ValSource, BIN_MAGIC,
};
use common::tokenizer::{Tokenizer, TokenizerKind, LONGEST_WHITESPACE_RUN};
use common::Error;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("common-data-test-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The message of an `Error::Input`; fails the test for any other outcome.
fn input_err<T: std::fmt::Debug>(r: common::Result<T>) -> String {
    match r {
        Err(Error::Input(msg)) => {
            assert!(!msg.contains('\n'), "error message must be one line: {msg}");
            msg
        }
        other => panic!("expected Error::Input, got {other:?}"),
    }
}

fn byte_tok() -> Tokenizer {
    Tokenizer::new(TokenizerKind::Byte).unwrap()
}

#[test]
fn byte_tokenizer_round_trip() {
    let tok = byte_tok();
    assert_eq!(tok.kind(), TokenizerKind::Byte);
    assert_eq!(tok.vocab_size(), 256);
    let text = "héllo, wörld ✓\n";
    let ids = tok.encode(text).unwrap();
    assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
    assert_eq!(tok.decode(&ids), text);
    // A sample cut inside 'é' (0xC3 0xA9) decodes lossily instead of failing.
    assert_eq!(tok.decode(&[b'h' as u32, 0xC3]), "h\u{FFFD}");
}

#[test]
fn unknown_tokenizer_in_a_checkpoint_is_named_on_one_line() {
    // The name comes from the checkpoint's JSON, which may hold any character.
    let msg = input_err(TokenizerKind::from_checkpoint("by\nte"));
    assert!(msg.contains("unknown tokenizer 'by\\nte'"), "{msg}");
    assert_eq!(TokenizerKind::from_checkpoint("GPT2").unwrap(), TokenizerKind::Gpt2);
}

#[test]
fn gpt2_tokenizer_known_ids() {
    let tok = Tokenizer::new(TokenizerKind::Gpt2).unwrap();
    assert_eq!(tok.vocab_size(), 50257);
    assert_eq!(tok.encode("Hello world").unwrap(), vec![15496, 995]);
    assert_eq!(tok.decode(&[15496, 995]), "Hello world");
    // The document separator is one special token, not seven ordinary pieces.
    assert_eq!(tok.encode("<|endoftext|>").unwrap(), vec![50256]);
    let text = "First Citizen:\nBefore we proceed any further, hear me speak.";
    assert_eq!(tok.decode(&tok.encode(text).unwrap()), text);
    // Ids past the vocabulary (padded logits) decode to U+FFFD, not a panic.
    assert_eq!(tok.decode(&[15496, 60000]), "Hello\u{FFFD}");
}

#[test]
fn gpt2_tokenizer_encodes_a_whitespace_run_too_long_for_its_regex() {
    // tiktoken's pre-tokenizer backtracks and fails ("Max stack size exceeded") on a run of
    // ~10^6 whitespace characters; such a run is cut into pieces of LONGEST_WHITESPACE_RUN.
    let tok = Tokenizer::new(TokenizerKind::Gpt2).unwrap();
    for ws in [" ", "\n", " \t"] {
        let text = format!("Before{}after <|endoftext|> end", ws.repeat(1_500_000));
        let ids = tok.encode(&text).unwrap();
        assert_eq!(tok.decode(&ids), text);
        assert!(ids.contains(&50256), "the special token survives the cut");
    }
    // Up to the limit a run is encoded whole: the ids tiktoken gives the text in one piece.
    let bpe = tiktoken_rs::r50k_base().unwrap();
    let n = LONGEST_WHITESPACE_RUN;
    for text in [
        format!("a{}b", " ".repeat(n)),
        format!("x\n{}\ny", "\r\n".repeat(n / 2)),
    ] {
        assert_eq!(tok.encode(&text).unwrap(), bpe.encode_with_special_tokens(&text));
    }
    let longer = format!("a{}b", " ".repeat(n + 1));
    assert_eq!(tok.decode(&tok.encode(&longer).unwrap()), longer);
}

#[test]
fn bin_round_trip_and_layout() {
    let dir = TempDir::new("roundtrip");
    let path = dir.path("tokens.bin");
    let tokens: Vec<u32> = vec![0, 1, 50256, 65535, 7];
    write_bin(&path, &tokens).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 1024 + 2 * tokens.len());
    assert_eq!(bytes[0..4], BIN_MAGIC.to_le_bytes());
    assert_eq!(bytes[4..8], 1i32.to_le_bytes());
    assert_eq!(bytes[8..12], 5i32.to_le_bytes());
    assert_eq!(bytes[1024..1026], [0, 0]);
    assert_eq!(bytes[1030..1032], [0xFF, 0xFF]);
    assert_eq!(read_bin(&path, 65536).unwrap(), tokens);
    // No temp file is left behind next to the target.
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
    // Overwriting replaces the content.
    write_bin(&path, &[3, 4]).unwrap();
    assert_eq!(read_bin(&path, 256).unwrap(), vec![3, 4]);
}

#[test]
fn write_bin_rejects_token_over_u16() {
    let dir = TempDir::new("u16");
    let path = dir.path("big.bin");
    let msg = input_err(write_bin(&path, &[1, 65536]));
    assert!(msg.contains("65536") && msg.contains("index 1"), "{msg}");
    assert!(!path.exists());
}

#[test]
fn read_bin_rejects_wrong_magic() {
    let dir = TempDir::new("magic");
    let path = dir.path("bad.bin");
    write_bin(&path, &[1, 2, 3]).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0..4].copy_from_slice(&12345i32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let msg = input_err(read_bin(&path, 256));
    assert!(
        msg.contains("magic") && msg.contains("12345") && msg.contains("20240520"),
        "{msg}"
    );
}

#[test]
fn read_bin_rejects_truncated_file() {
    let dir = TempDir::new("trunc");
    let path = dir.path("short.bin");
    write_bin(&path, &[1, 2, 3]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
    let msg = input_err(read_bin(&path, 256));
    assert!(
        msg.contains("1030") && msg.contains("1028"),
        "expected and actual sizes: {msg}"
    );
    // Shorter than the header itself.
    std::fs::write(&path, &bytes[..100]).unwrap();
    let msg = input_err(read_bin(&path, 256));
    assert!(msg.contains("header"), "{msg}");
}

#[test]
fn read_bin_rejects_token_outside_vocab() {
    let dir = TempDir::new("vocab");
    let path = dir.path("v.bin");
    write_bin(&path, &[1, 255, 256, 300]).unwrap();
    let msg = input_err(read_bin(&path, 256));
    assert!(msg.contains("index 2") && msg.contains("256"), "first bad token: {msg}");
    assert_eq!(read_bin(&path, 301).unwrap(), vec![1, 255, 256, 300]);
}

#[test]
fn load_tokens_reads_text_and_bin() {
    let dir = TempDir::new("load");
    let tok = byte_tok();
    let text = dir.path("corpus.txt");
    std::fs::write(&text, "abc").unwrap();
    assert_eq!(load_tokens(&text, &tok).unwrap(), vec![97, 98, 99]);
    // Recognised by its magic even without the .bin extension.
    let bin = dir.path("corpus.tokens");
    write_bin(&bin, &[5, 6, 7]).unwrap();
    assert_eq!(load_tokens(&bin, &tok).unwrap(), vec![5, 6, 7]);
}

#[test]
fn load_tokens_errors() {
    let dir = TempDir::new("loaderr");
    let tok = byte_tok();

    let missing = dir.path("nope.txt");
    match load_tokens(&missing, &tok) {
        Err(e @ Error::Io { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("nope.txt") && !msg.contains('\n'), "{msg}");
        }
        other => panic!("expected Error::Io, got {other:?}"),
    }

    let empty = dir.path("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    assert!(input_err(load_tokens(&empty, &tok)).contains("empty"));

    let latin1 = dir.path("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait").unwrap();
    let msg = input_err(load_tokens(&latin1, &tok));
    assert!(msg.contains("UTF-8") && msg.contains("offset 3"), "{msg}");

    // A .bin extension means the header is checked, not the text decoded.
    let fake = dir.path("fake.bin");
    std::fs::write(&fake, vec![b'x'; 2000]).unwrap();
    assert!(input_err(load_tokens(&fake, &tok)).contains("magic"));
}

#[test]
fn split_takes_tail_and_rejects_short_corpus() {
    let tokens: Vec<u32> = (0..100).collect();
    let s = split(tokens.clone(), 0.1, 8).unwrap();
    assert_eq!(s.train, (0..90).collect::<Vec<_>>());
    assert_eq!(s.val, (90..100).collect::<Vec<_>>());

    // 10 validation tokens cannot hold a window of 16 + 1.
    let msg = input_err(split(tokens.clone(), 0.1, 16));
    assert!(
        msg.contains("corpus too short") && msg.contains("100") && msg.contains("17"),
        "{msg}"
    );
    input_err(split(tokens.clone(), 0.0, 8));
    input_err(split(tokens, 1.5, 8));
}

/// Tokens whose value is their index, so window `w` of `seq_len` starts with `w * seq_len`.
fn ramp(n: usize) -> Vec<u32> {
    (0..n as u32).collect()
}

/// Window ids of each row of a batch, checking the row is that window shifted by one.
fn windows_of(b: &Batch, seq_len: usize) -> Vec<usize> {
    assert_eq!(b.inputs.len(), b.targets.len());
    b.inputs
        .chunks(seq_len)
        .zip(b.targets.chunks(seq_len))
        .map(|(inp, tgt)| {
            let start = inp[0] as usize;
            assert_eq!(start % seq_len, 0, "rows start on window boundaries");
            for t in 0..seq_len {
                assert_eq!(inp[t] as usize, start + t);
                assert_eq!(tgt[t] as usize, start + t + 1);
            }
            start / seq_len
        })
        .collect()
}

fn epoch_order(loader: &mut Loader, seq_len: usize) -> Vec<usize> {
    (0..loader.steps_per_epoch())
        .flat_map(|_| windows_of(&loader.next_batch(), seq_len))
        .collect()
}

#[test]
fn loader_visits_every_window_once_per_epoch() {
    let t = 4;
    // 12 windows need 12*4 + 1 tokens; B = 3 divides them.
    let mut loader = Loader::new(ramp(12 * t + 1), t, 3, 0, 1, 42).unwrap();
    assert_eq!(loader.steps_per_epoch(), 4);
    for epoch in 0..3 {
        assert_eq!(
            loader.cursor(),
            DataCursor {
                epoch,
                step_in_epoch: 0
            }
        );
        let mut seen = epoch_order(&mut loader, t);
        seen.sort();
        assert_eq!(seen, (0..12).collect::<Vec<_>>());
    }

    // 14 windows, B = 4: three steps per epoch, two leftover windows skipped, no repeats.
    let mut loader = Loader::new(ramp(14 * t + 3), t, 4, 0, 1, 7).unwrap();
    assert_eq!(loader.num_windows(), 14);
    assert_eq!(loader.steps_per_epoch(), 3);
    let seen = epoch_order(&mut loader, t);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 12);
    assert_eq!(
        loader.cursor(),
        DataCursor {
            epoch: 1,
            step_in_epoch: 0
        }
    );
    assert_eq!(loader.epochs_done(), 1.0);
    loader.next_batch();
    assert!((loader.epochs_done() - (1.0 + 1.0 / 3.0)).abs() < 1e-12);
}

#[test]
fn loader_order_depends_on_seed_and_epoch() {
    let t = 2;
    let tokens = ramp(64 * t + 1);
    let mut a = Loader::new(tokens.clone(), t, 8, 0, 1, 1234).unwrap();
    let mut b = Loader::new(tokens.clone(), t, 8, 0, 1, 1234).unwrap();
    let (a0, a1) = (epoch_order(&mut a, t), epoch_order(&mut a, t));
    let (b0, b1) = (epoch_order(&mut b, t), epoch_order(&mut b, t));
    assert_eq!(a0, b0, "same seed, same order");
    assert_eq!(a1, b1);
    assert_ne!(a0, a1, "each epoch reshuffles");
    assert_ne!(a0, (0..64).collect::<Vec<_>>(), "the order is shuffled");
    let mut c = Loader::new(tokens, t, 8, 0, 1, 1235).unwrap();
    assert_ne!(epoch_order(&mut c, t), a0, "another seed, another order");
}

#[test]
fn loader_shards_partition_the_global_batch() {
    let t = 3;
    let tokens: std::sync::Arc<[u32]> = ramp(40 * t + 1).into();
    let mut whole = Loader::new(tokens.clone(), t, 6, 0, 1, 99).unwrap();
    let mut r0 = Loader::new(tokens.clone(), t, 6, 0, 2, 99).unwrap();
    let mut r1 = Loader::new(tokens, t, 6, 1, 2, 99).unwrap();
    assert_eq!(r0.local_batch(), 3);
    // Past an epoch boundary (6 steps per epoch) too.
    for _ in 0..15 {
        let w = windows_of(&whole.next_batch(), t);
        let w0 = windows_of(&r0.next_batch(), t);
        let w1 = windows_of(&r1.next_batch(), t);
        assert_eq!(w0.len(), 3);
        assert!(w0.iter().all(|w| !w1.contains(w)), "shards are disjoint");
        assert_eq!([w0, w1].concat(), w, "rank order concatenates to the global batch");
    }
    assert_eq!(r0.cursor(), whole.cursor());
}

#[test]
fn loader_cursor_restores_the_stream() {
    let t = 4;
    let tokens = ramp(20 * t + 1);
    let mut first = Loader::new(tokens.clone(), t, 4, 0, 1, 5).unwrap();
    // Save in the middle of the second epoch (5 steps per epoch).
    for _ in 0..7 {
        first.next_batch();
    }
    let saved = first.cursor();
    assert_eq!(
        saved,
        DataCursor {
            epoch: 1,
            step_in_epoch: 2
        }
    );
    let json = serde_json::to_string(&saved).unwrap();
    let expected: Vec<Batch> = (0..9).map(|_| first.next_batch()).collect();

    let mut resumed = Loader::new(tokens, t, 4, 0, 1, 5).unwrap();
    resumed.set_cursor(serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(resumed.cursor(), saved);
    let got: Vec<Batch> = (0..9).map(|_| resumed.next_batch()).collect();
    assert_eq!(got, expected);

    let msg = input_err(resumed.set_cursor(DataCursor {
        epoch: 0,
        step_in_epoch: 5,
    }));
    assert!(msg.contains('5'), "{msg}");
}

#[test]
fn loader_rejects_bad_shapes() {
    let tokens = ramp(100);
    let msg = input_err(Loader::new(tokens.clone(), 4, 6, 0, 4, 0));
    assert!(
        msg.contains('6') && msg.contains('4') && msg.contains("divisible"),
        "{msg}"
    );
    input_err(Loader::new(tokens.clone(), 4, 4, 2, 2, 0));
    input_err(Loader::new(tokens.clone(), 0, 4, 0, 1, 0));
    // 100 tokens hold 24 windows of 4 + 1, fewer than a batch of 32.
    let msg = input_err(Loader::new(tokens, 4, 32, 0, 1, 0));
    assert!(msg.contains("corpus too short") && msg.contains("24"), "{msg}");
}

#[test]
fn eval_batches_are_consecutive_windows() {
    let t = 4;
    // 10 windows: batches of 4 → at most 2 full batches.
    let val = ramp(10 * t + 1);
    let batches = eval_batches(&val, t, 4, 100);
    assert_eq!(batches.len(), 2);
    assert_eq!(windows_of(&batches[0], t), vec![0, 1, 2, 3]);
    assert_eq!(windows_of(&batches[1], t), vec![4, 5, 6, 7]);
    assert_eq!(eval_batches(&val, t, 4, 1).len(), 1);
    // Fewer windows than the batch: one batch of all of them.
    let small = eval_batches(&val, t, 32, 5);
    assert_eq!(small.len(), 1);
    assert_eq!(windows_of(&small[0], t), (0..10).collect::<Vec<_>>());
    assert!(eval_batches(&val[..4], t, 4, 5).is_empty());
}

/// Writes `sizes.len()` shards named `{prefix}_{k:03}.bin` into `dir`, holding one ramp of
/// tokens across them (shard k starts where shard k-1 ended); returns their paths.
fn write_shards(dir: &TempDir, prefix: &str, sizes: &[usize]) -> Vec<PathBuf> {
    let mut next = 0u32;
    sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let path = dir.path(&format!("{prefix}_{k:03}.bin"));
            write_bin(&path, &(next..next + n as u32).collect::<Vec<_>>()).unwrap();
            next += n as u32;
            path
        })
        .collect()
}

/// The first token of each row (a window's identity in a ramp), checking the row is
/// consecutive tokens with targets one ahead.
fn rows_of(b: &Batch, seq_len: usize) -> Vec<i32> {
    b.inputs
        .chunks(seq_len)
        .zip(b.targets.chunks(seq_len))
        .map(|(inp, tgt)| {
            for t in 0..seq_len {
                assert_eq!(inp[t], inp[0] + t as i32);
                assert_eq!(tgt[t], inp[0] + t as i32 + 1);
            }
            inp[0]
        })
        .collect()
}

fn shard_set(paths: &[PathBuf]) -> ShardSet {
    ShardSet::open(paths.to_vec()).unwrap()
}

#[test]
fn shard_sets_resolve_from_directories_patterns_and_lists() {
    let dir = TempDir::new("resolve");
    let train = write_shards(&dir, "c_train", &[50, 40, 60]);
    let val = write_shards(&dir, "c_val", &[30]);
    std::fs::write(dir.path("notes.txt"), "not a shard").unwrap();
    let paths = |s: &ShardSet| s.shards.iter().map(|x| x.path.clone()).collect::<Vec<_>>();

    // A directory: its .bin files, sorted, the *_val_* ones for validation.
    let plan = resolve(std::slice::from_ref(&dir.0), None).unwrap();
    let TrainSource::Shards(t) = &plan.train else {
        panic!("{plan:?}")
    };
    assert_eq!(paths(t), train);
    assert_eq!(t.tokens(), 150);
    assert_eq!(plan.val, ValSource::Shards(shard_set(&val)));

    // A pattern and a list of paths, given in any order: sorted by name.
    let pattern = dir.path("c_train_*.bin");
    let plan = resolve(std::slice::from_ref(&pattern), Some(&val[0])).unwrap();
    assert_eq!(plan.train, TrainSource::Shards(shard_set(&train)));
    let plan = resolve(
        &[train[2].clone(), train[0].clone(), train[1].clone()],
        Some(&dir.path("c_val_*")),
    )
    .unwrap();
    assert_eq!(plan.train, TrainSource::Shards(shard_set(&train)));

    // One file: today's split without --val-data; streamed (one shard) with it.
    let plan = resolve(std::slice::from_ref(&train[0]), None).unwrap();
    assert_eq!(
        (plan.train, plan.val),
        (TrainSource::File(train[0].clone()), ValSource::Split)
    );
    let plan = resolve(std::slice::from_ref(&train[0]), Some(&val[0])).unwrap();
    assert_eq!(plan.train, TrainSource::Shards(shard_set(&train[..1])));
    let text = dir.path("notes.txt");
    let plan = resolve(std::slice::from_ref(&text), Some(&text)).unwrap();
    assert_eq!(
        (plan.train, plan.val),
        (TrainSource::File(text.clone()), ValSource::Text(text))
    );

    // Refused in one line: no validation set, no match, a shard on both sides.
    let msg = input_err(resolve(std::slice::from_ref(&pattern), None));
    assert!(msg.contains("--val-data"), "{msg}");
    let msg = input_err(resolve(&[dir.path("nothing_*.bin")], Some(&val[0])));
    assert!(
        msg.contains("matches no file") && msg.contains("nothing_*.bin"),
        "{msg}"
    );
    let msg = input_err(resolve(&[dir.path("c_*.bin")], Some(&val[0])));
    assert!(msg.contains("c_val_000.bin") && msg.contains("both"), "{msg}");
    let only_train = TempDir::new("resolve-noval");
    write_shards(&only_train, "x_train", &[20]);
    let msg = input_err(resolve(std::slice::from_ref(&only_train.0), None));
    assert!(msg.contains("*_val_*") && msg.contains("--val-data"), "{msg}");
}

#[test]
fn shard_headers_are_checked_at_start_and_tokens_when_read() {
    let dir = TempDir::new("headers");
    let good = write_shards(&dir, "g", &[40, 40]);
    // A size the header disagrees with, and a bad magic: named at start-up.
    let short = dir.path("short.bin");
    let bytes = std::fs::read(&good[0]).unwrap();
    std::fs::write(&short, &bytes[..bytes.len() - 2]).unwrap();
    let msg = input_err(ShardSet::open(vec![good[0].clone(), short.clone()]));
    assert!(
        msg.starts_with(&short.display().to_string()) && msg.contains("1102"),
        "{msg}"
    );
    let magic = dir.path("magic.bin");
    let mut bad = bytes.clone();
    bad[0] = 0;
    std::fs::write(&magic, &bad).unwrap();
    assert!(input_err(ShardSet::open(vec![magic])).contains("magic"));

    // A token outside the vocabulary: refused when its window is read, naming file and offset.
    let set = shard_set(&good);
    let mut loader = ShardLoader::new(set, 60, 4, 4, 0, 1, 3).unwrap();
    let msg = (0..20)
        .find_map(|_| BatchSource::next_batch(&mut loader).err())
        .map(|e| input_err::<()>(Err(e)))
        .expect("a window past token 60 is read");
    assert!(
        msg.contains("g_00") && msg.contains("outside the vocabulary of 60") && msg.contains("byte offset"),
        "{msg}"
    );
}

#[test]
fn shard_batches_are_the_same_for_any_number_of_ranks() {
    let dir = TempDir::new("ranks");
    // Windows of T = 4: 12, 0 (a shard shorter than a window) and 9, so 21 windows, B = 4.
    let paths = write_shards(&dir, "r", &[49, 3, 38]);
    let t = 4;
    let new = |rank, world| ShardLoader::new(shard_set(&paths), 1000, t, 4, rank, world, 11).unwrap();
    let (mut whole, mut r0, mut r1) = (new(0, 1), new(0, 2), new(1, 2));
    assert_eq!((whole.num_windows(), whole.steps_per_epoch()), (21, 5));
    // Every epoch visits 20 windows once each, none spanning two shards.
    let starts: HashSet<i32> = (0..12).map(|w| w * 4).chain((0..9).map(|w| 52 + w * 4)).collect();
    for epoch in 0..3 {
        let mut seen = HashSet::new();
        for _ in 0..5 {
            let w = rows_of(&BatchSource::next_batch(&mut whole).unwrap(), t);
            let a = rows_of(&BatchSource::next_batch(&mut r0).unwrap(), t);
            let b = rows_of(&BatchSource::next_batch(&mut r1).unwrap(), t);
            assert_eq!(
                [a, b].concat(),
                w,
                "epoch {epoch}: the ranks' rows are the global batch"
            );
            seen.extend(w);
        }
        assert_eq!(seen.len(), 20);
        assert!(seen.is_subset(&starts), "{seen:?}");
    }
}

#[test]
fn shard_batches_resume_across_a_shard_boundary_and_prefetch_alike() {
    let dir = TempDir::new("resume");
    let paths = write_shards(&dir, "s", &[33, 33, 33]);
    let t = 4; // 8 windows a shard, 24 in all: 4 steps of 6 an epoch
    let new = || ShardLoader::new(shard_set(&paths), 1000, t, 6, 0, 1, 5).unwrap();
    let mut straight = new();
    let all: Vec<Batch> = (0..14)
        .map(|_| BatchSource::next_batch(&mut straight).unwrap())
        .collect();
    let shards_of = |b: &Batch| rows_of(b, t).iter().map(|&r| r / 33).collect::<HashSet<_>>();
    assert!(all.iter().all(|b| shards_of(b).len() > 1), "each batch mixes shards");

    // Through the prefetching Batches, cut at step 6 (epoch 1, step 2), resumed by a fresh one.
    let mut first = Batches::new(Box::new(new()), DataOrder::Feistel);
    for b in &all[..6] {
        assert_eq!(&first.next_batch().unwrap(), b);
    }
    let saved = first.cursor();
    assert_eq!(
        saved,
        DataCursor {
            epoch: 1,
            step_in_epoch: 2
        }
    );
    assert!((first.epochs_done() - 1.5).abs() < 1e-12);
    drop(first);
    let mut resumed = Batches::new(Box::new(new()), DataOrder::Feistel);
    resumed.set_cursor(saved).unwrap();
    for b in &all[6..] {
        assert_eq!(&resumed.next_batch().unwrap(), b);
    }
    // Repositioned while its thread runs ahead.
    resumed
        .set_cursor(DataCursor {
            epoch: 0,
            step_in_epoch: 1,
        })
        .unwrap();
    assert_eq!(resumed.next_batch().unwrap(), all[1]);
    let msg = input_err(resumed.set_cursor(DataCursor {
        epoch: 0,
        step_in_epoch: 4,
    }));
    assert!(msg.contains("past the 4 steps"), "{msg}");
}

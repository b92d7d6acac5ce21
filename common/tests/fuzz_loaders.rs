//! Property-based fuzzing of the loaders that read files a user hands us: checkpoints
//! (`checkpoint::load`, `checkpoint::load_meta`), llm.c `.bin` token files (`data::read_bin`,
//! `data::load_tokens`), the MLP's checkpoints (`mnist::checkpoint::parse`: never a panic, one
//! line, nothing damaged accepted) and Hugging Face directories (`interop::import`: safetensors and
//! config.json, whose header fields and JSON lie in the ways listed at `HeaderEdit`). Inputs are arbitrary bytes and valid files with random mutations
//! (byte flips, truncations, insertions, removals, header fields and JSON metadata fields set
//! to extreme values, optionally with the checksum recomputed so the structural checks behind
//! it are reached). For every input:
//!
//! - nothing panics;
//! - the result is `Ok` only for a file that is valid (unmodified, or modified and resealed
//!   into another valid file, whose arrays/tokens must then be exactly the file's bytes);
//! - an error is `Error::Input` naming the path, or `Error::Io`, on one line;
//! - no single allocation is larger than the file justifies (a counting global allocator):
//!   for a file of L bytes, at most 4·L + 64 KiB, besides the checkpoint loader's one 1 MiB
//!   read buffer. What the code justifies: `.bin` files are read whole (L) and become u32
//!   tokens (2·L), text becomes one u32 a byte (4·L); a checkpoint's three arrays are checked
//!   to fill the file exactly before they are allocated (L/3 each), its metadata is at most L
//!   bytes, and what serde makes of that text is pinned separately below.
//!
//! 512 cases a property keep the file at a few seconds; `PROPTEST_CASES=30000` hunts longer.
//! Failures are not persisted (the minimal input is printed), so nothing is written into the
//! source tree.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use common::checkpoint::{self, CheckpointMeta, MAGIC};
use common::data::{self, BIN_MAGIC, BIN_VERSION};
use common::interop;
use common::model::{ConfigOverrides, ModelConfig};
use common::tokenizer::{Tokenizer, TokenizerKind};
use common::Error;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config as ProptestConfig;

// ---------------------------------------------------------------------------------------
// Counting allocator.

/// The checkpoint loader's `BufReader` buffer (checkpoint.rs `IO_BUF`): the one allocation
/// whose size does not follow the file. It is counted apart, so that the bound on everything
/// else can stay tight for small files.
const READ_BUFFER: usize = 1 << 20;
/// Room for the small fixed allocations (path copies, messages, the JSON parser's state).
const SLACK: usize = 64 << 10;

/// Wraps the system allocator; on a thread inside [`measure`], records the largest single
/// allocation (other than exactly [`READ_BUFFER`] bytes, which are counted).
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static READ_BUFFERS: AtomicUsize = AtomicUsize::new(0);
/// One measured section at a time: the test harness runs tests on parallel threads.
static MEASURING: Mutex<()> = Mutex::new(());

thread_local! {
    /// Whether this thread's allocations are being recorded (const-initialised and without
    /// a destructor, so reading it never allocates).
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

fn record(size: usize) {
    if RECORDING.try_with(Cell::get).unwrap_or(false) {
        if size == READ_BUFFER {
            READ_BUFFERS.fetch_add(1, Ordering::Relaxed);
        } else {
            LARGEST.fetch_max(size, Ordering::Relaxed);
        }
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What [`measure`] saw: the largest allocation and how many read buffers were allocated.
#[derive(Debug, Clone, Copy)]
struct Peak {
    largest: usize,
    read_buffers: usize,
}

/// Runs `f` with the counters reset and recording on for this thread.
fn measure<T>(f: impl FnOnce() -> T) -> (T, Peak) {
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    LARGEST.store(0, Ordering::Relaxed);
    READ_BUFFERS.store(0, Ordering::Relaxed);
    RECORDING.with(|r| r.set(true));
    let out = f();
    RECORDING.with(|r| r.set(false));
    let peak = Peak {
        largest: LARGEST.load(Ordering::Relaxed),
        read_buffers: READ_BUFFERS.load(Ordering::Relaxed),
    };
    (out, peak)
}

#[test]
fn allocator_records_the_largest_allocation() {
    let (v, peak) = measure(|| vec![0u8; 300_000]);
    assert_eq!(peak.largest, 300_000);
    let (_, peak) = measure(|| vec![1u8; READ_BUFFER]);
    assert_eq!((peak.largest, peak.read_buffers), (0, 1));
    drop(v);
    let (_, peak) = measure(|| 1 + 1);
    assert_eq!((peak.largest, peak.read_buffers), (0, 0));
}

// ---------------------------------------------------------------------------------------
// Shared helpers.

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpt2rs-fuzz-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks an error: `Input` naming the path, or `Io`; one line either way.
fn check_err(path: &Path, e: &Error) -> Result<(), TestCaseError> {
    let msg = e.to_string();
    prop_assert!(!msg.contains('\n'), "message is not one line: {msg:?}");
    match e {
        Error::Input(m) => prop_assert!(
            m.starts_with(&path.display().to_string()),
            "message does not name the path: {m}"
        ),
        Error::Io { .. } => {}
        other => prop_assert!(false, "expected an Input or Io error, got {other:?}"),
    }
    Ok(())
}

/// 512 cases a property, or `PROPTEST_CASES` when set.
fn config() -> ProptestConfig {
    let defaults = ProptestConfig::default();
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            defaults.cases
        } else {
            512
        },
        // A failure prints its minimal input; nothing is written into the source tree.
        failure_persistence: None,
        ..defaults
    }
}

/// Values that break naive size arithmetic, and any other.
fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 7),
        Just(1 << 63),
        Just(i64::MAX as u64),
        Just(1 << 40),
        Just(1 << 32),
        Just(u32::MAX as u64),
        Just(1 << 31),
        Just(4096),
        Just(4097),
        0..300u64,
        any::<u64>(),
    ]
}

/// A new value for a header field: an absolute one, or the old one nudged.
#[derive(Clone, Debug)]
enum NewValue {
    Abs(u64),
    Delta(i64),
}

impl NewValue {
    fn apply(&self, old: u64) -> u64 {
        match *self {
            NewValue::Abs(v) => v,
            NewValue::Delta(d) => old.wrapping_add(d as u64),
        }
    }
}

fn new_value() -> impl Strategy<Value = NewValue> {
    prop_oneof![
        extreme_u64().prop_map(NewValue::Abs),
        (-16i64..=16).prop_map(NewValue::Delta),
    ]
}

/// Where a byte-level mutation lands: anywhere, or in a region where the checks differ.
#[derive(Clone, Debug)]
enum Place {
    Anywhere(Index),
    /// Within the first N bytes (header, metadata).
    Head(Index),
    /// Within the last 16 bytes (end of the last array, the stored checksum).
    Tail(Index),
}

fn place() -> impl Strategy<Value = Place> {
    prop_oneof![
        any::<Index>().prop_map(Place::Anywhere),
        any::<Index>().prop_map(Place::Head),
        any::<Index>().prop_map(Place::Tail),
    ]
}

impl Place {
    /// A position in `0..len` (`len > 0`); `head` is the length of the header region.
    fn at(&self, len: usize, head: usize) -> usize {
        match self {
            Place::Anywhere(i) => i.index(len),
            Place::Head(i) => i.index(head.clamp(1, len)),
            Place::Tail(i) => len - 1 - i.index(16.min(len)),
        }
    }
}

/// A byte-level change to a file.
#[derive(Clone, Debug)]
enum Edit {
    Flip {
        at: Place,
        mask: u8,
    },
    Truncate {
        at: Place,
    },
    Insert {
        at: Place,
        bytes: Vec<u8>,
    },
    Remove {
        at: Place,
        len: usize,
    },
    /// Overwrite 1-16 bytes with zeros.
    Zero {
        at: Place,
        len: usize,
    },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (place(), 1..=255u8).prop_map(|(at, mask)| Edit::Flip { at, mask }),
        2 => place().prop_map(|at| Edit::Truncate { at }),
        2 => (place(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(at, bytes)| Edit::Insert { at, bytes }),
        1 => (place(), 1..64usize).prop_map(|(at, len)| Edit::Remove { at, len }),
        1 => (place(), 1..16usize).prop_map(|(at, len)| Edit::Zero { at, len }),
    ]
}

impl Edit {
    fn apply(&self, bytes: &mut Vec<u8>, head: usize) {
        let len = bytes.len();
        if len == 0 {
            if let Edit::Insert { bytes: new, .. } = self {
                bytes.extend_from_slice(new);
            }
            return;
        }
        match self {
            Edit::Flip { at, mask } => bytes[at.at(len, head)] ^= mask,
            Edit::Truncate { at } => bytes.truncate(at.at(len, head)),
            Edit::Insert { at, bytes: new } => {
                let i = at.at(len, head);
                bytes.splice(i..i, new.iter().copied());
            }
            Edit::Remove { at, len: n } => {
                let i = at.at(len, head);
                bytes.drain(i..(i + n).min(len));
            }
            Edit::Zero { at, len: n } => {
                let i = at.at(len, head);
                bytes[i..(i + n).min(len)].fill(0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Checkpoints.

/// A tiny config made smaller still (one layer, width 4, vocabulary 1 padded to 128): about
/// 800 parameters, so a 10 kB file in which the header is often hit.
fn micro() -> ModelConfig {
    micro_of_vocab(1)
}

fn micro_of_vocab(vocab: usize) -> ModelConfig {
    let overrides = ConfigOverrides {
        n_layer: Some(1),
        n_head: Some(2),
        n_embd: Some(4),
        max_seq_len: Some(4),
    };
    ModelConfig::from_preset("tiny", vocab, overrides).unwrap()
}

fn micro_meta() -> CheckpointMeta {
    CheckpointMeta {
        config: micro(),
        tokenizer: "byte".to_string(),
        step: 12,
        data_epoch: 1,
        data_step_in_epoch: 3,
        data_order: None,
        seed: 1234,
        train: serde_json::json!({"lr": 6e-4, "batch": 4, "seq_len": 4, "name": "fuzz"}),
        progress: serde_json::json!({"rows": 2}),
        data: None,
        fp8: None,
    }
}

/// A valid checkpoint's bytes (saved through the library) and its parameter count.
fn valid_checkpoint() -> &'static (Vec<u8>, usize) {
    static FILE: std::sync::OnceLock<(Vec<u8>, usize)> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = TempDir::new("valid-ckpt");
        let path = dir.file("valid.ckpt");
        let n = micro().num_params();
        // Distinct, non-zero values, so any swap or zeroing changes the bytes.
        let array = |k: usize| -> Vec<f32> { (0..n).map(|i| (k * n + i + 1) as f32 * 0.001).collect() };
        checkpoint::save(&path, &micro_meta(), &array(0), &array(1), &array(2)).unwrap();
        (std::fs::read(&path).unwrap(), n)
    })
}

const META_LEN_AT: usize = 16;

fn meta_len(file: &[u8]) -> usize {
    u64::from_le_bytes(file[META_LEN_AT..META_LEN_AT + 8].try_into().unwrap()) as usize
}

/// A binary header field of the checkpoint.
#[derive(Clone, Copy, Debug)]
enum Field {
    Version,
    Reserved,
    MetaLen,
    Count,
}

/// A change to the JSON metadata (the file is rebuilt with the new meta length).
#[derive(Clone, Debug)]
enum JsonEdit {
    /// Set `config.<name>` (or a top-level integer field) to a value.
    Set(&'static str, u64),
    /// Set field `k` (1 offset, 2 rows, 3 cols) of tensor record `i`.
    Tensor(Index, usize, u64),
    /// Drop tensor record `i`.
    DropTensor(Index),
    /// Repeat tensor record `i`.
    DupTensor(Index),
    /// Replace the tokenizer name (a newline in it must not reach a message unescaped).
    Tokenizer(String),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let names = prop::sample::select(vec![
        "vocab_size",
        "padded_vocab_size",
        "n_layer",
        "n_head",
        "n_embd",
        "max_seq_len",
        "step",
        "seed",
    ]);
    prop_oneof![
        4 => (names, extreme_u64()).prop_map(|(name, v)| JsonEdit::Set(name, v)),
        2 => (any::<Index>(), 1..4usize, extreme_u64()).prop_map(|(i, k, v)| JsonEdit::Tensor(i, k, v)),
        1 => any::<Index>().prop_map(JsonEdit::DropTensor),
        1 => any::<Index>().prop_map(JsonEdit::DupTensor),
        1 => "[a-z\n\"\\\\]{0,8}".prop_map(JsonEdit::Tokenizer),
    ]
}

impl JsonEdit {
    fn apply(&self, header: &mut serde_json::Value) {
        let tensors = header["tensors"].as_array_mut().unwrap();
        match self {
            JsonEdit::Set(name, v) => {
                let config_field = !matches!(*name, "step" | "seed");
                let target = if config_field { &mut header["config"] } else { header };
                target[*name] = (*v).into();
            }
            JsonEdit::Tensor(i, k, v) if !tensors.is_empty() => {
                let i = i.index(tensors.len());
                tensors[i][*k] = (*v).into();
            }
            JsonEdit::DropTensor(i) if !tensors.is_empty() => {
                tensors.remove(i.index(tensors.len()));
            }
            JsonEdit::DupTensor(i) if !tensors.is_empty() => {
                let i = i.index(tensors.len());
                let t = tensors[i].clone();
                tensors.insert(i, t);
            }
            JsonEdit::Tokenizer(s) => header["tokenizer"] = s.clone().into(),
            _ => {}
        }
    }
}

/// Everything done to a valid checkpoint, in this order: JSON edits (file rebuilt), header
/// field overwrites, byte edits, and optionally a recomputed checksum.
#[derive(Clone, Debug)]
struct CkptMutation {
    json: Vec<JsonEdit>,
    fields: Vec<(Field, NewValue)>,
    edits: Vec<Edit>,
    reseal: bool,
}

fn ckpt_mutation() -> impl Strategy<Value = CkptMutation> {
    let field = prop_oneof![
        Just(Field::Version),
        Just(Field::Reserved),
        Just(Field::MetaLen),
        Just(Field::Count),
    ];
    (
        prop::collection::vec(json_edit(), 0..3),
        prop::collection::vec((field, new_value()), 0..3),
        prop::collection::vec(edit(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(json, fields, edits, reseal)| CkptMutation {
            json,
            fields,
            edits,
            reseal,
        })
}

impl CkptMutation {
    fn apply(&self, original: &[u8]) -> Vec<u8> {
        let mut file = original.to_vec();
        if !self.json.is_empty() {
            let len = meta_len(&file);
            let mut header: serde_json::Value = serde_json::from_slice(&file[24..24 + len]).unwrap();
            for e in &self.json {
                e.apply(&mut header);
            }
            let json = serde_json::to_vec(&header).unwrap();
            let mut rebuilt = file[..24].to_vec();
            rebuilt[META_LEN_AT..24].copy_from_slice(&(json.len() as u64).to_le_bytes());
            rebuilt.extend_from_slice(&json);
            rebuilt.extend_from_slice(&file[24 + len..]);
            file = rebuilt;
        }
        // Where the header and metadata end in the (possibly rebuilt) file.
        let count_at = 24 + meta_len(&file);
        for (field, value) in &self.fields {
            let (at, width) = match field {
                Field::Version => (8, 4),
                Field::Reserved => (12, 4),
                Field::MetaLen => (META_LEN_AT, 8),
                Field::Count => (count_at, 8),
            };
            let old = &mut file[at..at + width];
            let mut word = [0u8; 8];
            word[..width].copy_from_slice(old);
            let new = value.apply(u64::from_le_bytes(word)).to_le_bytes();
            old.copy_from_slice(&new[..width]);
        }
        for e in &self.edits {
            e.apply(&mut file, count_at + 8);
        }
        if self.reseal && file.len() >= 8 {
            let body = file.len() - 8;
            let sum = xxhash_rust::xxh64::xxh64(&file[..body], 0);
            file[body..].copy_from_slice(&sum.to_le_bytes());
        }
        file
    }
}

/// Loads `bytes` as a checkpoint (both entry points) and checks every property.
fn check_checkpoint(path: &Path, bytes: &[u8], may_be_valid: bool) -> Result<(), TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    let file_len = bytes.len();
    let bound = 4 * file_len + SLACK;

    let (meta, peak) = measure(|| checkpoint::load_meta(path));
    prop_assert!(
        peak.largest <= bound && peak.read_buffers <= 1,
        "load_meta of a {file_len}-byte file: {peak:?} (bound {bound})"
    );
    let (full, peak) = measure(|| checkpoint::load(path));
    prop_assert!(
        peak.largest <= bound && peak.read_buffers <= 1,
        "load of a {file_len}-byte file: {peak:?} (bound {bound})"
    );

    match (&meta, &full) {
        (_, Ok(ck)) => {
            prop_assert!(may_be_valid, "a corrupted checkpoint was accepted");
            // The arrays must be exactly the file's bytes before the checksum.
            let n = ck.params.len();
            prop_assert_eq!((ck.m.len(), ck.v.len()), (n, n));
            prop_assert!(file_len >= 12 * n + 8);
            let arrays = &bytes[file_len - 8 - 12 * n..file_len - 8];
            let loaded: Vec<u8> = [&ck.params, &ck.m, &ck.v]
                .iter()
                .flat_map(|a| a.iter().flat_map(|x| x.to_le_bytes()))
                .collect();
            prop_assert!(loaded == arrays, "loaded arrays differ from the file's bytes");
            // What the run does next with the header must not fail on more than one line.
            if let Err(e) = TokenizerKind::from_checkpoint(&ck.meta.tokenizer) {
                prop_assert!(!e.to_string().contains('\n'), "message is not one line: {e}");
            }
            // load_meta reads the same header.
            match &meta {
                Ok(m) => prop_assert_eq!(m, &ck.meta),
                Err(e) => prop_assert!(false, "load accepted what load_meta refused: {e}"),
            }
        }
        (Ok(_), Err(e)) => check_err(path, e)?,
        (Err(e1), Err(e2)) => {
            check_err(path, e1)?;
            check_err(path, e2)?;
        }
    }
    Ok(())
}

#[test]
fn valid_checkpoint_loads() {
    let dir = TempDir::new("ckpt-valid");
    let (bytes, n) = valid_checkpoint();
    let path = dir.file("a.ckpt");
    check_checkpoint(&path, bytes, true).unwrap();
    assert_eq!(checkpoint::load(&path).unwrap().params.len(), *n);
    assert_eq!(checkpoint::load_meta(&path).unwrap(), micro_meta());
}

/// Regression: the metadata's `n_layer` (up to 4096 in a valid config) once made the loader
/// lay out this build's parameter table for that many layers, some 4 MB, before comparing
/// it with the 16-record list the 10 kB file holds.
#[test]
fn layers_the_file_does_not_list_cost_no_memory() {
    let dir = TempDir::new("ckpt-layers");
    let path = dir.file("l.ckpt");
    let (original, _) = valid_checkpoint();
    for reseal in [false, true] {
        let mutation = CkptMutation {
            json: vec![JsonEdit::Set("n_layer", 4096)],
            fields: vec![],
            edits: vec![],
            reseal,
        };
        let bytes = mutation.apply(original);
        std::fs::write(&path, &bytes).unwrap();
        for load_meta in [false, true] {
            let (result, peak) = measure(|| match load_meta {
                true => checkpoint::load_meta(&path).map(drop),
                false => checkpoint::load(&path).map(drop),
            });
            assert!(peak.largest <= 4 * bytes.len() + SLACK, "{peak:?}");
            let Err(Error::Input(msg)) = result else {
                panic!("4096 layers accepted: {result:?}");
            };
            assert!(msg.contains("it lists 16 tensors, this build 49156"), "{msg}");
        }
    }
}

/// The metadata is the one part read into richer structures than its bytes: serde buffers
/// the fields beside `tensors` (`#[serde(flatten)]`) and the run settings are a
/// `serde_json::Value`, 32 bytes a value, in vectors that grow by doubling. For the densest
/// text there is (`[0,0,...]`, two bytes a value) that is up to 32 times the text (21 seen
/// here); the tensor list, 48 bytes a record of at least 11, under 10 (6 seen). Linear in
/// the file, so no header field can make it huge; pinned so that it stays so.
#[test]
fn metadata_costs_memory_in_proportion_to_its_text() {
    let dir = TempDir::new("ckpt-json");
    let path = dir.file("j.ckpt");
    let (original, _) = valid_checkpoint();
    let len = meta_len(original);
    let arrays = &original[24 + len..original.len() - 8];
    let header: serde_json::Value = serde_json::from_slice(&original[24..24 + len]).unwrap();
    let k = 100_000;
    for (what, ratio) in [("train", 32), ("tensors", 10)] {
        let mut h = header.clone();
        match what {
            "train" => h["train"]["pad"] = vec![0; k].into(),
            _ => h["tensors"] = vec![serde_json::json!(["", 0, 0, 0]); k].into(),
        }
        let json = serde_json::to_vec(&h).unwrap();
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&checkpoint::FORMAT_VERSION.to_le_bytes());
        file.extend_from_slice(&0u32.to_le_bytes());
        file.extend_from_slice(&(json.len() as u64).to_le_bytes());
        file.extend_from_slice(&json);
        file.extend_from_slice(arrays);
        let sum = xxhash_rust::xxh64::xxh64(&file, 0);
        file.extend_from_slice(&sum.to_le_bytes());
        std::fs::write(&path, &file).unwrap();
        let (result, peak) = measure(|| checkpoint::load(&path));
        // Extra run settings are kept; a foreign tensor list is refused.
        assert_eq!(result.is_ok(), what == "train", "{what}: {:?}", result.err());
        assert!(
            peak.largest <= ratio * json.len() + SLACK,
            "{what}: {} bytes of JSON, largest allocation {}",
            json.len(),
            peak.largest
        );
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn checkpoint_arbitrary_bytes(
        with_magic in 0..3u8,
        tail in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        // Plain bytes; the magic; the magic, version 2 and the rest (reaches the meta length).
        let mut bytes = Vec::new();
        if with_magic > 0 {
            bytes.extend_from_slice(&MAGIC);
        }
        if with_magic > 1 {
            bytes.extend_from_slice(&checkpoint::FORMAT_VERSION.to_le_bytes());
        }
        bytes.extend_from_slice(&tail);
        let dir = TempDir::new("ckpt-arbitrary");
        let path = dir.file("a.ckpt");
        check_checkpoint(&path, &bytes, false)?;
    }

    #[test]
    fn checkpoint_mutated(mutation in ckpt_mutation()) {
        let (original, _) = valid_checkpoint();
        let bytes = mutation.apply(original);
        // Only an unchanged file, or one resealed with a recomputed checksum, may load.
        let may_be_valid = bytes == *original || mutation.reseal;
        let dir = TempDir::new("ckpt-mutated");
        let path = dir.file("m.ckpt");
        check_checkpoint(&path, &bytes, may_be_valid)?;
    }
}

// ---------------------------------------------------------------------------------------
// llm.c .bin token files.

const HEADER_BYTES: usize = 1024;

fn valid_bin(tokens: &[u32]) -> Vec<u8> {
    let dir = TempDir::new("valid-bin");
    let path = dir.file("valid.bin");
    data::write_bin(&path, tokens).unwrap();
    std::fs::read(&path).unwrap()
}

/// The tokens a valid `.bin` file holds, decoded independently of the library.
fn decode_bin(bytes: &[u8]) -> Option<Vec<u32>> {
    let word = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    if bytes.len() < HEADER_BYTES || word(0) != BIN_MAGIC || word(1) != BIN_VERSION || word(2) < 0 {
        return None;
    }
    if bytes.len() != HEADER_BYTES + 2 * word(2) as usize {
        return None;
    }
    Some(
        bytes[HEADER_BYTES..]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
            .collect(),
    )
}

/// Reads `bytes` through `read_bin` (as `x.bin`) and `load_tokens` (as `x.bin` and `x.txt`)
/// and checks every property.
fn check_bin(dir: &TempDir, bytes: &[u8], vocab: usize) -> Result<(), TestCaseError> {
    let bound = 4 * bytes.len() + SLACK;
    let expected = decode_bin(bytes);
    let in_vocab = |t: &Vec<u32>| t.iter().all(|&t| (t as usize) < vocab);

    let bin = dir.file("x.bin");
    std::fs::write(&bin, bytes).unwrap();
    let (read, peak) = measure(|| data::read_bin(&bin, vocab));
    prop_assert!(
        peak.largest <= bound && peak.read_buffers == 0,
        "read_bin of {} bytes: {peak:?}",
        bytes.len()
    );
    match &read {
        Ok(tokens) => prop_assert!(expected.as_ref().is_some_and(in_vocab) && Some(tokens) == expected.as_ref()),
        Err(e) => {
            check_err(&bin, e)?;
            prop_assert!(!expected.as_ref().is_some_and(in_vocab), "valid file refused: {e}");
        }
    }

    // load_tokens with the byte tokenizer (vocabulary 256).
    let tok = Tokenizer::new(TokenizerKind::Byte).unwrap();
    let txt = dir.file("x.txt");
    std::fs::write(&txt, bytes).unwrap();
    let has_magic = bytes.len() >= 4 && bytes[..4] == BIN_MAGIC.to_le_bytes();
    for (path, as_bin) in [(&bin, true), (&txt, has_magic)] {
        let (loaded, peak) = measure(|| data::load_tokens(path, &tok));
        prop_assert!(
            peak.largest <= bound && peak.read_buffers == 0,
            "load_tokens of {} bytes: {peak:?}",
            bytes.len()
        );
        let want = if as_bin {
            expected.clone().filter(|t| t.iter().all(|&t| t < 256))
        } else {
            std::str::from_utf8(bytes)
                .ok()
                .map(|s| s.bytes().map(u32::from).collect())
        };
        let want = want.filter(|t| !t.is_empty());
        match loaded {
            Ok(tokens) => prop_assert_eq!(Some(tokens), want),
            Err(e) => {
                check_err(path, &e)?;
                prop_assert!(want.is_none(), "valid file refused: {e}");
            }
        }
    }
    Ok(())
}

/// A change to one of the `.bin` header's i32 words (magic, version, count, or a reserved one).
fn bin_header_edit() -> impl Strategy<Value = (usize, NewValue)> {
    let word = prop_oneof![Just(0usize), Just(1), Just(2), 3..256usize];
    let value = prop_oneof![
        new_value(),
        Just(NewValue::Abs(i32::MAX as u64)),
        Just(NewValue::Abs(i32::MIN as u32 as u64)),
        Just(NewValue::Abs(u32::MAX as u64)),
    ];
    (word, value)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn bin_arbitrary_bytes(
        with_header in 0..3u8,
        tail in prop::collection::vec(any::<u8>(), 0..2048),
        vocab in prop_oneof![Just(1usize), Just(256), Just(50257), Just(65536)],
    ) {
        // Plain bytes; the magic; the magic and version (reaches the count).
        let mut bytes = Vec::new();
        if with_header > 0 {
            bytes.extend_from_slice(&BIN_MAGIC.to_le_bytes());
        }
        if with_header > 1 {
            bytes.extend_from_slice(&BIN_VERSION.to_le_bytes());
        }
        bytes.extend_from_slice(&tail);
        let dir = TempDir::new("bin-arbitrary");
        check_bin(&dir, &bytes, vocab)?;
    }

    #[test]
    fn bin_mutated(
        tokens in prop::collection::vec(prop_oneof![0..256u32, 0..=65535u32], 0..600),
        header in prop::collection::vec(bin_header_edit(), 0..3),
        edits in prop::collection::vec(edit(), 0..3),
        vocab in prop_oneof![Just(256usize), Just(50257), Just(65536)],
    ) {
        let mut bytes = valid_bin(&tokens);
        for (word, value) in &header {
            let at = 4 * word;
            let old = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as u64;
            bytes[at..at + 4].copy_from_slice(&(value.apply(old) as u32).to_le_bytes());
        }
        for e in &edits {
            e.apply(&mut bytes, HEADER_BYTES);
        }
        let dir = TempDir::new("bin-mutated");
        check_bin(&dir, &bytes, vocab)?;
    }
}

// ---------------------------------------------------------------------------------------
// Hugging Face directories (`interop::import`: config.json and model.safetensors).

/// One block of width 4 over the byte vocabulary (256 rows): a 6 kB safetensors file.
fn hf_micro() -> ModelConfig {
    micro_of_vocab(256)
}

/// A valid export's (model.safetensors, config.json) bytes and the parameters it holds.
fn valid_export() -> &'static (Vec<u8>, Vec<u8>, Vec<f32>) {
    static EXPORT: std::sync::OnceLock<(Vec<u8>, Vec<u8>, Vec<f32>)> = std::sync::OnceLock::new();
    EXPORT.get_or_init(|| {
        let cfg = hf_micro();
        let params: Vec<f32> = (0..cfg.num_params()).map(|i| (i as f32 * 0.37).sin()).collect();
        let dir = TempDir::new("hf-valid");
        interop::export(&dir.0, &cfg, TokenizerKind::Byte, &params).unwrap();
        let read = |name: &str| std::fs::read(dir.file(name)).unwrap();
        let imported = interop::import(&dir.0).unwrap();
        (read(interop::WEIGHTS), read(interop::CONFIG), imported.params)
    })
}

/// Imports `weights` and `config` from a fresh directory: `Ok` only with every value finite
/// and as many as the config's model holds (or exactly `expect`'s, when given); an error is one
/// line naming the directory; no allocation beyond what the files' size justifies.
fn check_import(weights: &[u8], config: &[u8], expect: Option<&[f32]>) -> Result<(), TestCaseError> {
    static CASE: AtomicUsize = AtomicUsize::new(0);
    let dir = TempDir::new(&format!("hf-{}", CASE.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(dir.file(interop::WEIGHTS), weights).unwrap();
    std::fs::write(dir.file(interop::CONFIG), config).unwrap();
    let (result, peak) = measure(|| interop::import(&dir.0));
    let justified = 4 * (weights.len() + config.len()) + SLACK;
    prop_assert!(
        peak.largest <= justified,
        "allocated {} bytes for files of {} + {}",
        peak.largest,
        weights.len(),
        config.len()
    );
    match result {
        Ok(model) => {
            prop_assert_eq!(model.params.len(), model.config.num_params());
            prop_assert!(model.params.iter().all(|x| x.is_finite()));
            if let Some(expect) = expect {
                prop_assert_eq!(&model.params[..], expect);
            }
        }
        Err(e) => check_err(&dir.0, &e)?,
    }
    Ok(())
}

/// The safetensors header's JSON and where the data starts.
fn st_header(file: &[u8]) -> (serde_json::Value, usize) {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&file[8..8 + n]).unwrap(), 8 + n)
}

/// A change to one tensor's entry in the safetensors header (the file is rebuilt around it).
#[derive(Clone, Debug)]
enum HeaderEdit {
    Shape(Index, Vec<u64>),
    Offsets(Index, u64, u64),
    Dtype(Index, &'static str),
    Rename(Index, &'static str),
    Remove(Index),
}

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    let dtypes = prop::sample::select(vec!["F64", "I64", "BOOL", "F16", "BF16", "U8", "XX"]);
    let names = prop::sample::select(vec![
        "transformer.h.1.attn.c_attn.weight",
        "transformer.h.0.attn.c_attn.weight",
        "h.0.ln_1.bias",
        "lm_head.weight",
        "something.else",
        "",
    ]);
    prop_oneof![
        (any::<Index>(), prop::collection::vec(extreme_u64(), 0..4)).prop_map(|(i, s)| HeaderEdit::Shape(i, s)),
        (any::<Index>(), extreme_u64(), extreme_u64()).prop_map(|(i, a, b)| HeaderEdit::Offsets(i, a, b)),
        (any::<Index>(), dtypes).prop_map(|(i, d)| HeaderEdit::Dtype(i, d)),
        (any::<Index>(), names).prop_map(|(i, n)| HeaderEdit::Rename(i, n)),
        any::<Index>().prop_map(HeaderEdit::Remove),
    ]
}

impl HeaderEdit {
    fn apply(&self, file: &[u8]) -> Vec<u8> {
        let (mut header, data_at) = st_header(file);
        let map = header.as_object_mut().unwrap();
        let names: Vec<String> = map.keys().filter(|k| *k != "__metadata__").cloned().collect();
        let pick = |i: &Index| names[i.index(names.len())].clone();
        match self {
            HeaderEdit::Shape(i, shape) => map[&pick(i)]["shape"] = serde_json::json!(shape),
            HeaderEdit::Offsets(i, a, b) => map[&pick(i)]["data_offsets"] = serde_json::json!([a, b]),
            HeaderEdit::Dtype(i, d) => map[&pick(i)]["dtype"] = serde_json::json!(d),
            HeaderEdit::Rename(i, new) => {
                let entry = map.remove(&pick(i)).unwrap();
                map.insert(new.to_string(), entry);
            }
            HeaderEdit::Remove(i) => {
                map.remove(&pick(i));
            }
        }
        let json = serde_json::to_vec(&header).unwrap();
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&file[data_at..]);
        out
    }
}

/// A `config.json` field set to another value, or removed.
fn config_edit() -> impl Strategy<Value = (&'static str, Option<u64>)> {
    let fields = prop::sample::select(vec![
        "vocab_size",
        "n_positions",
        "n_embd",
        "n_layer",
        "n_head",
        "n_inner",
    ]);
    (fields, prop::option::of(extreme_u64()))
}

#[test]
fn valid_export_imports_exactly() {
    let (weights, config, params) = valid_export();
    let cfg = hf_micro();
    let mut expect: Vec<f32> = (0..cfg.num_params()).map(|i| (i as f32 * 0.37).sin()).collect();
    // The vocabulary's padding rows are not exported: they come back 0.
    let real = cfg.vocab_size * cfg.n_embd;
    expect[real..cfg.padded_vocab_size * cfg.n_embd].fill(0.0);
    assert_eq!(params, &expect);
    check_import(weights, config, Some(params)).unwrap();
}

#[test]
fn a_header_longer_than_the_file_is_refused_before_it_is_read() {
    let (weights, config, _) = valid_export();
    let mut lying = weights.clone();
    lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let dir = TempDir::new("hf-header");
    std::fs::write(dir.file(interop::WEIGHTS), &lying).unwrap();
    std::fs::write(dir.file(interop::CONFIG), config).unwrap();
    let e = interop::import(&dir.0).err().unwrap().to_string();
    assert!(e.contains("the header claims 18446744073709551615 bytes"), "{e}");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn safetensors_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        check_import(&bytes, &valid_export().1, None)?;
    }

    #[test]
    fn safetensors_mutated(edits in prop::collection::vec(edit(), 1..4)) {
        let (weights, config, _) = valid_export();
        let mut bytes = weights.clone();
        let head = st_header(weights).1;
        for e in &edits {
            e.apply(&mut bytes, head);
        }
        check_import(&bytes, config, None)?;
    }

    #[test]
    fn safetensors_header_lies(edit in header_edit()) {
        let (weights, config, _) = valid_export();
        check_import(&edit.apply(weights), config, None)?;
    }

    #[test]
    fn config_lies((field, value) in config_edit()) {
        let (weights, config, params) = valid_export();
        let mut json: serde_json::Value = serde_json::from_slice(config).unwrap();
        let unchanged = json.get(field).and_then(|v| v.as_u64()) == value
            || (field == "n_inner" && value.is_none());
        match value {
            Some(v) => json[field] = serde_json::json!(v),
            None => {
                json.as_object_mut().unwrap().remove(field);
            }
        }
        let text = serde_json::to_vec(&json).unwrap();
        check_import(weights, &text, unchanged.then_some(&params[..]))?;
    }
}

// ---------------------------------------------------------------------------------------
// The MLP's checkpoints (`mnist::checkpoint::parse`, which `mnist --resume` reads): read whole,
// every part checked before use.

use common::mnist::checkpoint as mlp_ckpt;

/// A valid MLP checkpoint: widths 4 → 3 → 2, AdamW (two state arrays), 5 steps done.
fn valid_mlp_checkpoint() -> &'static Vec<u8> {
    static FILE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let settings = mlp_ckpt::Settings {
            widths: vec![4, 3, 2],
            optimizer: "adamw".into(),
            lr: 1e-3,
            momentum: None,
            weight_decay: 0.0,
            seed: 1,
            batch: 2,
            epochs: 3,
            train_set: "made up".into(),
            test_set: "made up".into(),
        };
        let meta = mlp_ckpt::Meta {
            settings,
            step: 5,
            log: Default::default(),
        };
        let n = 4 * 3 + 3 + 3 * 2 + 2;
        let arrays: Vec<Vec<f32>> = (0..3)
            .map(|k| (0..n).map(|i| (i + k) as f32 * 0.25).collect())
            .collect();
        let dir = TempDir::new("valid-mlp");
        let path = dir.file("mlp.ckpt");
        mlp_ckpt::save(&path, &meta, &arrays[0], &[&arrays[1], &arrays[2]]).unwrap();
        std::fs::read(&path).unwrap()
    })
}

/// The file with its metadata replaced by `json` (the length field follows) and, with
/// `reseal`, its checksum recomputed, so that the checks behind the checksum are reached.
fn with_mlp_meta(file: &[u8], json: Option<&serde_json::Value>, reseal: bool) -> Vec<u8> {
    let mut out = file.to_vec();
    if let Some(json) = json {
        let old = u64::from_le_bytes(file[16..24].try_into().unwrap()) as usize;
        let text = serde_json::to_vec(json).unwrap();
        out = [
            &file[..16],
            &(text.len() as u64).to_le_bytes(),
            &text[..],
            &file[24 + old..],
        ]
        .concat();
    }
    if reseal && out.len() >= 8 {
        let body = out.len() - 8;
        let sum = xxhash_rust::xxh64::xxh64(&out[..body], 0);
        out[body..].copy_from_slice(&sum.to_le_bytes());
    }
    out
}

/// `parse` of `bytes`: never a panic; an error is one line naming the path; `Ok` only where
/// `may_be_valid`.
fn check_mlp(bytes: &[u8], may_be_valid: bool) -> Result<(), TestCaseError> {
    let path = Path::new("m.ckpt");
    match std::panic::catch_unwind(|| mlp_ckpt::parse(bytes, path)) {
        Err(_) => prop_assert!(false, "parse panicked"),
        Ok(Ok(_)) => prop_assert!(may_be_valid, "a damaged MLP checkpoint was accepted"),
        Ok(Err(e)) => check_err(path, &e)?,
    }
    Ok(())
}

/// Settings and counters no run could have written, for the metadata.
fn mlp_meta_edit() -> impl Strategy<Value = (&'static str, serde_json::Value)> {
    use serde_json::json;
    prop_oneof![
        Just(("widths", json!([]))),
        Just(("widths", json!([4]))),
        Just(("widths", json!([4, 0, 2]))),
        Just(("widths", json!([4_000_000_000u64, 4_000_000_000u64]))),
        Just(("widths", json!([u64::MAX, 2]))),
        Just(("widths", json!([65_536, 32_768, 65_536, 32_768, 65_536]))),
        Just(("widths", json!([4, 3, 3, 2]))),
        Just(("optimizer", json!("lbfgs"))),
        Just(("batch", json!(0))),
        Just(("epochs", json!(0))),
        Just(("lr", json!("x"))),
        Just(("step", json!(-1))),
        Just((
            "log",
            json!({"rows": 1, "elapsed_s": 1.0, "window": {"loss_sum": 1.0, "steps": 99, "bad_steps": 0, "seconds": 1.0}})
        )),
        Just((
            "log",
            json!({"rows": 1, "elapsed_s": -1.0, "window": {"loss_sum": 1.0, "steps": 1, "bad_steps": 0, "seconds": 1.0}})
        )),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mlp_checkpoint_arbitrary_bytes(magic in any::<bool>(), tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = if magic { mlp_ckpt::MAGIC.to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&tail);
        check_mlp(&bytes, false)?;
    }

    #[test]
    fn mlp_checkpoint_mutated(
        at in any::<Index>(),
        byte in any::<u8>(),
        cut in any::<Index>(),
        how in 0..3u8,
        reseal in any::<bool>(),
        (key, value) in mlp_meta_edit(),
    ) {
        let original = valid_mlp_checkpoint();
        let mut bytes = original.clone();
        match how {
            0 => bytes[at.index(original.len())] = byte, // a byte set
            1 => bytes.truncate(cut.index(original.len())), // cut short
            _ => {
                // A metadata field set to a value no run writes.
                let len = u64::from_le_bytes(original[16..24].try_into().unwrap()) as usize;
                let mut meta: serde_json::Value = serde_json::from_slice(&original[24..24 + len]).unwrap();
                match key {
                    "step" | "log" => meta[key] = value, // (a step past the schedule: resume_from)
                    _ => meta["settings"][key] = value,
                }
                bytes = with_mlp_meta(original, Some(&meta), false);
            }
        }
        let bytes = with_mlp_meta(&bytes, None, reseal);
        // Only the file unchanged, or a byte of its arrays set and resealed, may read.
        check_mlp(&bytes, bytes == *original || (reseal && how == 0))?;
    }
}

#[test]
fn a_valid_mlp_checkpoint_reads_back_exactly() {
    let file = valid_mlp_checkpoint();
    let ck = mlp_ckpt::parse(file, Path::new("m.ckpt")).unwrap();
    assert_eq!((ck.meta.step, ck.params.len(), ck.state.len()), (5, 23, 2));
    assert_eq!(ck.state[1][22], 24.0 * 0.25);
}

//! Checkpoint tests: bit-exact round trip, the documented byte layout (rebuilt here with an
//! independent checksum), atomic replacement, and one test per way a file can be wrong.

use common::backend::{Snapshot, SnapshotTimes};
use common::checkpoint::{self, CheckpointMeta, HostState, SaveReport};
use common::model::{ConfigOverrides, ModelConfig, ParamLayout};
use common::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpt2rs-ckpt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tiny() -> ModelConfig {
    ModelConfig::from_preset("tiny", 256, ConfigOverrides::default()).unwrap()
}

fn meta(config: ModelConfig, step: u64) -> CheckpointMeta {
    CheckpointMeta {
        progress: serde_json::json!({"rows": 3}),
        config,
        tokenizer: "byte".to_string(),
        step,
        data_epoch: 3,
        data_step_in_epoch: 17,
        data_order: None,
        seed: 0xdead_beef_1234,
        // Floats with full 17-digit expansions: the run settings must survive exactly too.
        train: serde_json::json!({
            "lr": 6e-4, "beta2": 0.95, "weight_decay": 0.1, "odd": 0.1 + 0.2,
            "tiny": 1.234_567_890_123_456_7e-300, "batch": 4, "seq_len": 64, "name": "run-α",
        }),
        data: Some(common::data::DataIdentity {
            name: "corpus.txt".into(),
            bytes: 3 << 20,
            head_xxh64: "0x0123456789abcdef".into(),
            tail_xxh64: "0xfedcba9876543210".into(),
            shards: None,
        }),
        // FP8 scales and amax histories: f32s that JSON must carry exactly.
        fp8: Some(vec![
            1.0 / 3.0,
            f32::MIN_POSITIVE,
            448.0,
            57_344.0,
            1e-30,
            0.0,
            2.0f32.powi(-20),
            0.1,
        ]),
    }
}

/// Arbitrary finite f32 bit patterns (subnormals, huge values and -0.0 included; an
/// exponent of all ones, NaN or infinity, loses its top bit: such checkpoints are refused);
/// a different sequence for every seed (so m and v differ and a loader mixing them up fails).
fn random_bits(n: usize, seed: u64) -> Vec<f32> {
    let mut x = 2 * seed + 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bits = (x >> 32) as u32;
            let finite = if bits & 0x7f80_0000 == 0x7f80_0000 {
                bits ^ 0x4000_0000
            } else {
                bits
            };
            f32::from_bits(finite)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The format's checksum: xxHash64 (seed 0) of every byte before it.
fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(bytes, 0)
}

/// The header JSON the format documents: the metadata's fields and the tensor list.
fn header_value(meta: &CheckpointMeta) -> serde_json::Value {
    let layout = ParamLayout::new(&meta.config);
    let mut value = serde_json::to_value(meta).unwrap();
    value["tensors"] = layout
        .entries
        .iter()
        .map(|e| serde_json::json!([e.name, e.range.start, e.shape[0], e.shape[1]]))
        .collect();
    value
}

fn header_json(meta: &CheckpointMeta) -> Vec<u8> {
    serde_json::to_vec(&header_value(meta)).unwrap()
}

/// A checkpoint file built by hand from the documented layout, with a valid checksum.
fn build(version: u32, json: &[u8], n: u64, arrays: [&[f32]; 3]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GPT2RSCK");
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&(json.len() as u64).to_le_bytes());
    b.extend_from_slice(json);
    b.extend_from_slice(&n.to_le_bytes());
    for a in arrays {
        for x in a {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    let sum = checksum(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// Saves a tiny checkpoint and returns (path, meta, params, m, v).
fn saved(dir: &TempDir) -> (PathBuf, CheckpointMeta, Vec<f32>, Vec<f32>, Vec<f32>) {
    let meta = meta(tiny(), 1234);
    let n = tiny().num_params();
    let (p, m, v) = (random_bits(n, 1), random_bits(n, 2), random_bits(n, 3));
    let path = dir.file("model.ckpt");
    checkpoint::save(&path, &meta, &p, &m, &v).unwrap();
    (path, meta, p, m, v)
}

/// The Input error's message, which must start with the path it is about.
fn input_err(path: &Path, result: common::Result<impl Sized>) -> String {
    match result {
        Err(Error::Input(msg)) => {
            assert!(
                msg.starts_with(&path.display().to_string()),
                "message does not name the path: {msg}"
            );
            assert!(!msg.contains('\n'), "message is not one line: {msg}");
            msg
        }
        Err(e) => panic!("expected an Input error, got {e:?}"),
        Ok(_) => panic!("expected an error for {}", path.display()),
    }
}

#[test]
fn round_trip_is_bit_exact() {
    let dir = TempDir::new("round-trip");
    let (path, meta, p, m, v) = saved(&dir);
    let ck = checkpoint::load(&path).unwrap();
    assert_eq!(ck.meta, meta);
    assert_eq!(bits(&ck.params), bits(&p));
    assert_eq!(bits(&ck.m), bits(&m));
    assert_eq!(bits(&ck.v), bits(&v));
    assert_eq!(checkpoint::load_meta(&path).unwrap(), meta);
}

#[test]
fn file_follows_documented_layout() {
    let dir = TempDir::new("layout");
    let (path, meta, p, m, v) = saved(&dir);
    let file = std::fs::read(&path).unwrap();
    let meta_len = u64::from_le_bytes(file[16..24].try_into().unwrap()) as usize;
    let json = &file[24..24 + meta_len];
    assert_eq!(serde_json::from_slice::<CheckpointMeta>(json).unwrap(), meta);
    let expected = build(2, json, tiny().num_params() as u64, [&p, &m, &v]);
    assert_eq!(file.len(), expected.len());
    assert!(file == expected, "saved bytes differ from the documented layout");
}

#[test]
fn save_replaces_atomically_and_leaves_no_tmp() {
    let dir = TempDir::new("atomic");
    let (path, _, p, m, v) = saved(&dir);
    let newer = meta(tiny(), 5678);
    let (p2, m2, v2) = (
        random_bits(p.len(), 7),
        random_bits(m.len(), 8),
        random_bits(v.len(), 9),
    );
    checkpoint::save(&path, &newer, &p2, &m2, &v2).unwrap();
    assert_eq!(dir.names(), ["model.ckpt"]);
    let ck = checkpoint::load(&path).unwrap();
    assert_eq!(ck.meta.step, 5678);
    assert_eq!(bits(&ck.params), bits(&p2));

    // A refused save leaves the previous checkpoint as it was.
    let before = std::fs::read(&path).unwrap();
    assert!(checkpoint::save(&path, &meta(tiny(), 9), &p, &m[1..], &v).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(dir.names(), ["model.ckpt"]);
}

#[test]
fn save_rejects_wrong_lengths() {
    let dir = TempDir::new("save-lengths");
    let path = dir.file("bad.ckpt");
    let n = tiny().num_params();
    let (p, m, v) = (vec![0.0; n], vec![0.0; n - 1], vec![0.0; n + 2]);
    let msg = input_err(&path, checkpoint::save(&path, &meta(tiny(), 0), &p, &m, &v));
    assert!(msg.contains(&format!("m has {} values", n - 1)), "{msg}");
    assert!(msg.contains(&format!("v has {} values", n + 2)), "{msg}");
    assert!(msg.contains(&format!("needs {n}")), "{msg}");
    assert!(!msg.contains("params has"), "{msg}");
    assert!(dir.names().is_empty(), "a refused save wrote {:?}", dir.names());
}

#[test]
fn missing_file_is_named() {
    let dir = TempDir::new("missing");
    let path = dir.file("nope.ckpt");
    let msg = input_err(&path, checkpoint::load(&path));
    assert!(msg.contains("no such checkpoint file"), "{msg}");
    input_err(&path, checkpoint::load_meta(&path));
}

#[test]
fn wrong_magic_says_what_was_found() {
    let dir = TempDir::new("magic");
    let (path, ..) = saved(&dir);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(b"PK\x03\x04abcd");
    std::fs::write(&path, &bytes).unwrap();
    let msg = input_err(&path, checkpoint::load(&path));
    assert!(msg.contains("not a checkpoint"), "{msg}");
    assert!(msg.contains("PK\\x03\\x04abcd"), "{msg}");

    // A short text file is foreign, not a truncated checkpoint.
    std::fs::write(&path, "hi").unwrap();
    let msg = input_err(&path, checkpoint::load_meta(&path));
    assert!(
        msg.contains("not a checkpoint") && msg.contains("found \"hi\""),
        "{msg}"
    );
}

#[test]
fn other_versions_are_refused_naming_both() {
    let dir = TempDir::new("version");
    let (path, meta, p, m, v) = saved(&dir);
    let json = header_json(&meta);
    // Version 1 is the FNV-checksummed format of earlier builds; 3 a future one.
    for version in [1, 3] {
        std::fs::write(&path, build(version, &json, p.len() as u64, [&p, &m, &v])).unwrap();
        for msg in [
            input_err(&path, checkpoint::load(&path)),
            input_err(&path, checkpoint::load_meta(&path)),
        ] {
            assert!(
                msg.contains(&format!("unsupported checkpoint format version {version}")),
                "{msg}"
            );
            assert!(msg.contains("reads version 2"), "{msg}");
        }
    }
}

#[test]
fn a_tensor_table_other_than_this_builds_is_refused() {
    let dir = TempDir::new("tensors");
    let (path, meta, p, m, v) = saved(&dir);
    let mut value = header_value(&meta);
    value["tensors"][3][0] = "h0.renamed".into();
    let json = serde_json::to_vec(&value).unwrap();
    std::fs::write(&path, build(2, &json, p.len() as u64, [&p, &m, &v])).unwrap();
    let msg = input_err(&path, checkpoint::load(&path));
    assert!(
        msg.contains("differ from this build's parameter table") && msg.contains("h0.renamed"),
        "{msg}"
    );
}

#[test]
fn paired_sign_bit_flips_are_corrupt() {
    // Two sign flips 8 bytes apart cancel in a checksum that XORs aligned words into a
    // linear state (the format-1 FNV over words missed them); xxHash64 does not.
    let dir = TempDir::new("paired");
    let (path, ..) = saved(&dir);
    let full = std::fs::read(&path).unwrap();
    let n = tiny().num_params();
    let arrays_at = full.len() - 8 - 12 * n;
    for (first, gap) in [
        (arrays_at + 3, 8),
        (arrays_at + 4 * n + 7, 8),
        (arrays_at + 11, 4),
        (arrays_at + 3, 16),
    ] {
        let mut bytes = full.clone();
        bytes[first] ^= 0x80;
        bytes[first + gap] ^= 0x80;
        std::fs::write(&path, &bytes).unwrap();
        let msg = input_err(&path, checkpoint::load(&path));
        assert!(msg.contains("checksum"), "flips at {first} and +{gap}: {msg}");
    }
}

#[test]
fn truncation_is_reported_with_lengths() {
    let dir = TempDir::new("truncated");
    let (path, ..) = saved(&dir);
    let full = std::fs::read(&path).unwrap();
    let meta_len = u64::from_le_bytes(full[16..24].try_into().unwrap()) as usize;
    let arrays_at = 24 + meta_len + 8;
    let n = tiny().num_params();
    // (cut length, what the message must say was expected)
    let cases = [
        (0, "expected at least 24 bytes".to_string()),
        (5, "expected at least 24 bytes".to_string()),
        (13, "expected at least 24 bytes".to_string()),
        (24 + meta_len / 2, format!("expected at least {arrays_at} bytes")),
        (arrays_at - 3, format!("expected at least {arrays_at} bytes")),
        (arrays_at, format!("expected {} bytes", full.len())),
        (arrays_at + 4 * n + 10, format!("expected {} bytes", full.len())),
        (full.len() - 8 - 1, format!("expected {} bytes", full.len())),
        (full.len() - 3, format!("expected {} bytes", full.len())),
    ];
    for (len, expected) in cases {
        std::fs::write(&path, &full[..len]).unwrap();
        for msg in [
            input_err(&path, checkpoint::load(&path)),
            input_err(&path, checkpoint::load_meta(&path)),
        ] {
            assert!(msg.contains("truncated"), "cut at {len}: {msg}");
            assert!(
                msg.contains(&format!("({expected}, found {len})")),
                "cut at {len}: {msg}"
            );
        }
    }

    let mut longer = full.clone();
    longer.extend_from_slice(&[0; 5]);
    std::fs::write(&path, &longer).unwrap();
    let msg = input_err(&path, checkpoint::load(&path));
    assert!(msg.contains("5 trailing bytes"), "{msg}");
}

#[test]
fn flipped_byte_is_corrupt() {
    let dir = TempDir::new("flipped");
    let (path, meta, ..) = saved(&dir);
    let full = std::fs::read(&path).unwrap();
    let n = tiny().num_params();
    let arrays_at = full.len() - 8 - 12 * n;
    // One byte in each array (params, m, v) and one in the stored checksum.
    for at in [
        arrays_at + 1,
        arrays_at + 4 * n + 4 * (n / 2) + 2,
        full.len() - 8 - 1,
        full.len() - 2,
    ] {
        let mut bytes = full.clone();
        bytes[at] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let msg = input_err(&path, checkpoint::load(&path));
        assert!(
            msg.contains("corrupt") && msg.contains("checksum"),
            "flip at {at}: {msg}"
        );
        // load_meta promises to stay cheap: it does not read the arrays.
        assert_eq!(checkpoint::load_meta(&path).unwrap(), meta);
    }
}

#[test]
fn parameter_count_must_match_config() {
    let dir = TempDir::new("count");
    let path = dir.file("count.ckpt");
    let json = header_json(&meta(tiny(), 1));
    let n = tiny().num_params();
    let extra = random_bits(n + 1, 4);
    std::fs::write(&path, build(2, &json, n as u64 + 1, [&extra, &extra, &extra])).unwrap();
    for msg in [
        input_err(&path, checkpoint::load(&path)),
        input_err(&path, checkpoint::load_meta(&path)),
    ] {
        assert!(msg.contains(&format!("holds {} parameters", n + 1)), "{msg}");
        assert!(msg.contains(&format!("needs {n}")), "{msg}");
    }
}

#[test]
fn bad_meta_and_bad_config_are_named() {
    let dir = TempDir::new("meta");
    let path = dir.file("meta.ckpt");
    let n = tiny().num_params();
    let zeros = vec![0.0; n];

    std::fs::write(&path, build(2, b"{\"config\": ", n as u64, [&zeros, &zeros, &zeros])).unwrap();
    let msg = input_err(&path, checkpoint::load(&path));
    assert!(msg.contains("metadata is invalid"), "{msg}");

    // n_head = 3 does not divide n_embd = 32.
    let mut value = header_value(&meta(tiny(), 1));
    value["config"]["n_head"] = 3.into();
    let json = serde_json::to_vec(&value).unwrap();
    std::fs::write(&path, build(2, &json, n as u64, [&zeros, &zeros, &zeros])).unwrap();
    let msg = input_err(&path, checkpoint::load(&path));
    assert!(
        msg.contains("model config is invalid") && msg.contains("--heads 3"),
        "{msg}"
    );
}

#[test]
fn check_compatible_names_each_conflict() {
    let ckpt = meta(tiny(), 1);
    checkpoint::check_compatible(&ckpt, &tiny(), "byte").unwrap();

    let overrides = ConfigOverrides {
        n_layer: Some(6),
        n_embd: Some(64),
        ..Default::default()
    };
    let flags = ModelConfig::from_preset("tiny", 256, overrides).unwrap();
    let Err(Error::Input(msg)) = checkpoint::check_compatible(&ckpt, &flags, "gpt2") else {
        panic!("conflicting flags were accepted");
    };
    assert!(msg.contains("n_layer=2 but the flags ask for n_layer=6"), "{msg}");
    assert!(msg.contains("n_embd=32 but the flags ask for n_embd=64"), "{msg}");
    assert!(
        msg.contains("tokenizer=byte but the flags ask for tokenizer=gpt2"),
        "{msg}"
    );
    assert!(
        !msg.contains("n_head") && !msg.contains("vocab") && !msg.contains("max_seq_len"),
        "{msg}"
    );
}

#[test]
fn non_finite_values_are_neither_saved_nor_loaded() {
    let dir = TempDir::new("nonfinite");
    let (path, meta, p, m, v) = saved(&dir);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut v2 = v.clone();
        v2[5] = bad;
        let err = checkpoint::save(&path, &meta, &p, &m, &v2).unwrap_err().to_string();
        assert!(err.contains("v[5]") && err.contains("diverged"), "{err}");
        // The same values written by hand, with a valid checksum, are refused on loading.
        std::fs::write(&path, build(2, &header_json(&meta), p.len() as u64, [&p, &m, &v2])).unwrap();
        let msg = input_err(&path, checkpoint::load(&path));
        assert!(msg.contains("v[5]"), "{msg}");
    }
}

/// The saved tiny checkpoint's bytes, where its arrays start, and its parameter count.
fn saved_bytes(dir: &TempDir) -> (PathBuf, Vec<u8>, usize, usize) {
    let (path, ..) = saved(dir);
    let full = std::fs::read(&path).unwrap();
    let n = tiny().num_params();
    let arrays_at = full.len() - 8 - 12 * n;
    (path, full, arrays_at, n)
}

/// Writes each corrupted copy and expects a checksum refusal from `load`.
fn expect_checksum_refusal(path: &Path, cases: Vec<(String, Vec<u8>)>) {
    for (what, bytes) in cases {
        std::fs::write(path, &bytes).unwrap();
        let msg = input_err(path, checkpoint::load(path));
        assert!(msg.contains("corrupt") && msg.contains("checksum"), "{what}: {msg}");
    }
}

#[test]
fn swapped_words_are_corrupt() {
    // A checksum that sums or XORs aligned words is blind to their order.
    let dir = TempDir::new("swapped-words");
    let (path, full, arrays_at, n) = saved_bytes(&dir);
    let mut cases = Vec::new();
    for (a, b) in [
        (arrays_at, arrays_at + 8),
        (arrays_at + 64, arrays_at + 4 * n + 64),
        (arrays_at + 8 * 100, arrays_at + 8 * n + 8 * 7),
        (arrays_at + 4 * n - 8, arrays_at + 4 * n),
        (full.len() - 16, full.len() - 24),
    ] {
        let mut bytes = full.clone();
        assert_ne!(bytes[a..a + 8], bytes[b..b + 8], "words at {a} and {b} are equal");
        for i in 0..8 {
            bytes.swap(a + i, b + i);
        }
        cases.push((format!("8-byte words at {a} and {b} swapped"), bytes));
    }
    // A rotation of three words: a permutation with no fixed point.
    let mut bytes = full.clone();
    let at = arrays_at + 4 * n + 40;
    bytes[at..at + 24].rotate_left(8);
    cases.push(("three words rotated".to_string(), bytes));
    expect_checksum_refusal(&path, cases);
}

#[test]
fn zeroed_blocks_are_corrupt() {
    // A sector that reads back as zeros (a torn write, a sparse-file hole).
    let dir = TempDir::new("zeroed");
    let (path, full, arrays_at, n) = saved_bytes(&dir);
    let mut cases = Vec::new();
    for (start, len) in [
        (arrays_at, 4096),
        (arrays_at + 4 * n - 2048, 4096),
        (arrays_at + 8 * n + 512, 512),
        (full.len() - 8 - 4096, 4096),
        (full.len() - 8 - 100, 108),
    ] {
        let mut bytes = full.clone();
        bytes[start..start + len].fill(0);
        cases.push((format!("{len} zero bytes at {start}"), bytes));
    }
    expect_checksum_refusal(&path, cases);
}

#[test]
fn same_bit_flipped_twice_is_corrupt() {
    // A checksum linear over words (XOR, sums mod 2^64 for the top bit) cancels two flips of
    // one bit a whole number of words apart. Other bits and distances than the sign-bit test.
    let dir = TempDir::new("same-bit");
    let (path, full, arrays_at, n) = saved_bytes(&dir);
    let mut cases = Vec::new();
    for gap in [8, 16, 64, 4 * n, 8 * n] {
        for (first, mask) in [(arrays_at + 2, 0x01), (arrays_at + 4 * n / 3 * 2 + 5, 0x40)] {
            if first + gap >= full.len() - 8 {
                continue;
            }
            let mut bytes = full.clone();
            bytes[first] ^= mask;
            bytes[first + gap] ^= mask;
            cases.push((format!("bit {mask:#x} flipped at {first} and +{gap}"), bytes));
        }
    }
    assert!(cases.len() >= 8);
    expect_checksum_refusal(&path, cases);
}

#[test]
fn checksum_and_data_flipped_together_are_corrupt() {
    // One flip in the data and a matching-looking one in the stored checksum: they must not
    // cancel (they would for a checksum that is a plain XOR of the words).
    let dir = TempDir::new("sum-and-data");
    let (path, full, arrays_at, n) = saved_bytes(&dir);
    let sum_at = full.len() - 8;
    let mut cases = Vec::new();
    for (data_at, sum_byte, mask) in [
        (arrays_at, 0, 0x01),
        (arrays_at + 4 * n + 3, 3, 0x80),
        (arrays_at + 8 * n + 8 * 9 + 6, 6, 0x10),
        (sum_at - 1, 7, 0xff),
    ] {
        let mut bytes = full.clone();
        bytes[data_at] ^= mask;
        bytes[sum_at + sum_byte] ^= mask;
        cases.push((format!("{mask:#x} at {data_at} and in checksum byte {sum_byte}"), bytes));
    }
    expect_checksum_refusal(&path, cases);
}

#[test]
fn swapped_arrays_are_corrupt() {
    // params, m and v stored in another order: same bytes, same length, same word multiset.
    let dir = TempDir::new("swapped-arrays");
    let (path, full, arrays_at, n) = saved_bytes(&dir);
    let array = |k: usize| &full[arrays_at + 4 * n * k..arrays_at + 4 * n * (k + 1)];
    assert!(array(0) != array(1) && array(1) != array(2) && array(0) != array(2));
    let mut cases = Vec::new();
    for order in [[1, 0, 2], [0, 2, 1], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
        let mut bytes = full[..arrays_at].to_vec();
        for k in order {
            bytes.extend_from_slice(array(k));
        }
        bytes.extend_from_slice(&full[full.len() - 8..]);
        assert_eq!(bytes.len(), full.len());
        cases.push((format!("arrays in order {order:?}"), bytes));
    }
    expect_checksum_refusal(&path, cases);
}

#[test]
fn background_writes_are_the_same_file_one_at_a_time_and_finish_on_drop() {
    let dir = TempDir::new("background");
    let (path, first, params, m, v) = saved(&dir);
    let direct = std::fs::read(&path).unwrap();
    let mut writer = checkpoint::BackgroundWriter::default();
    let arrays = [params.clone(), m.clone(), v.clone()];
    writer
        .start(&path, first.clone(), arrays.into(), (Instant::now(), 0.0))
        .unwrap();
    let report = writer.wait().unwrap().expect("a write was under way");
    assert_eq!(report.step, first.step);
    assert!(report.to_string().ends_with(&path.display().to_string()), "{report}");
    assert_eq!(std::fs::read(&path).unwrap(), direct, "the same bytes as a direct save");
    assert!(writer.wait().unwrap().is_none(), "nothing left to wait for");
    // The arrays come back for the next copy; a writer dropped mid-write finishes it.
    let again = writer.take_arrays();
    assert_eq!(bits(&again[0]), bits(&params));
    let later = meta(tiny(), first.step + 1);
    writer
        .start(&path, later.clone(), again.into(), (Instant::now(), 0.0))
        .unwrap();
    drop(writer);
    assert_eq!(checkpoint::load(&path).unwrap().meta, later);
    assert_eq!(
        dir.names(),
        vec![path.file_name().unwrap().to_string_lossy().to_string()]
    );
}

#[test]
fn a_background_write_that_fails_reports_its_error() {
    let dir = TempDir::new("background-fails");
    let (path, meta, params, m, mut v) = saved(&dir);
    v[3] = f32::NAN; // a diverged model is never saved
    let mut writer = checkpoint::BackgroundWriter::default();
    writer
        .start(&path, meta, [params, m, v].into(), (Instant::now(), 0.0))
        .unwrap();
    let err = writer.wait().unwrap_err().to_string();
    assert!(err.contains("diverged"), "{err}");
}

/// A snapshot as a backend hands one over ([`common::backend::Backend::snapshot`]): its parts,
/// and the times it says its copies took; or a copy that fails.
struct FakeSnapshot {
    parts: Vec<Vec<f32>>,
    fails: bool,
}

const FAKE_TIMES: SnapshotTimes = SnapshotTimes {
    device_s: 0.0012,
    to_host_s: 0.045,
    pinned: true,
};

impl Snapshot for FakeSnapshot {
    fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| 4 * p.len() as u64).sum()
    }

    fn read(
        self: Box<Self>,
        use_parts: &mut dyn FnMut(&[&[f32]]) -> common::Result<()>,
    ) -> common::Result<SnapshotTimes> {
        if self.fails {
            return Err(Error::Device("copying the checkpoint to host memory: it broke".into()));
        }
        let parts: Vec<&[f32]> = self.parts.iter().map(|p| p.as_slice()).collect();
        use_parts(&parts)?;
        Ok(FAKE_TIMES)
    }
}

fn snapshot(parts: Vec<Vec<f32>>, fails: bool) -> HostState {
    HostState::Snapshot(Box::new(FakeSnapshot { parts, fails }))
}

#[test]
fn a_snapshot_is_written_in_the_background_as_the_same_file() {
    let dir = TempDir::new("background-snapshot");
    let (path, meta, params, m, v) = saved(&dir);
    let direct = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut writer = checkpoint::BackgroundWriter::default();
    let state = snapshot(vec![params, m, v], false);
    writer.start(&path, meta.clone(), state, (Instant::now(), 0.0)).unwrap();
    let report = writer.wait().unwrap().expect("a write was under way");
    assert_eq!(std::fs::read(&path).unwrap(), direct, "the same bytes as a direct save");
    assert_eq!(report.snapshot, Some(FAKE_TIMES));
    // The copy within the device is the steps' stall too; the copy to the host is background.
    assert_eq!(report.total_stall_s(), report.stall_s + FAKE_TIMES.device_s);
    assert!(report.write_s >= report.sync_s && report.sync_s > 0.0 && report.stall_s >= 0.0);
    let line = report.to_string();
    assert!(
        line.contains("copying on the device") && line.contains("to pinned host memory"),
        "{line}"
    );
    // No host arrays came back for the next copy (the snapshot's memory is the backend's).
    assert!(writer.take_arrays().iter().all(|a| a.is_empty()));
}

#[test]
fn a_snapshot_that_fails_or_holds_other_parts_reports_its_error() {
    let dir = TempDir::new("background-snapshot-fails");
    let (path, meta, params, m, v) = saved(&dir);
    let before = std::fs::read(&path).unwrap();
    let mut writer = checkpoint::BackgroundWriter::default();
    let later = || {
        let mut later = meta.clone();
        later.step += 1;
        later
    };
    let cases = [
        (snapshot(vec![params.clone(), m.clone(), v.clone()], true), "it broke"),
        (
            snapshot(vec![params, m], false),
            "a checkpoint snapshot of 2 arrays, expected 3",
        ),
    ];
    for (state, expected) in cases {
        writer.start(&path, later(), state, (Instant::now(), 0.0)).unwrap();
        let err = writer.wait().unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "the checkpoint before is kept");
    }
}

#[test]
fn save_reports_name_the_stall_and_the_write() {
    let report = |stall_s, waited_s, snapshot| SaveReport {
        step: 20,
        path: PathBuf::from("/tmp/ck/model.ckpt"),
        stall_s,
        waited_s,
        write_s: 1.6854,
        sync_s: 1.1204,
        snapshot,
    };
    // Copied to host memory while training waited: the line as it always read.
    assert_eq!(
        report(0.1262, 0.0, None).to_string(),
        "checkpoint: step 20 (training stalled 126 ms, written in the background in 1685 ms) saved to /tmp/ck/model.ckpt"
    );
    assert_eq!(
        report(0.1401, 0.937, None).to_string(),
        "checkpoint: step 20 (training stalled 140 ms + 937 ms waiting for the write before, written in the \
         background in 1685 ms) saved to /tmp/ck/model.ckpt"
    );
    // Through a snapshot: the stall is the host's part and the copy within the device, under
    // 10 ms with a decimal; the write names its copy to host memory and its sync to disk.
    let pageable = SnapshotTimes {
        pinned: false,
        ..FAKE_TIMES
    };
    assert_eq!(
        report(0.0003, 0.0, Some(pageable)).to_string(),
        "checkpoint: step 20 (training stalled 1.5 ms, written in the background in 1685 ms; stall: 0.3 ms on \
         the host + 1.2 ms copying on the device; write: 45 ms to host memory, 520 ms into the file, 1120 ms \
         syncing it to disk) saved to /tmp/ck/model.ckpt"
    );
}

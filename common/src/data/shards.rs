//! What `--data` and `--val-data` name, resolved into files: one file read whole (text or
//! `.bin`), or a set of llm.c `.bin` shards read window by window. Only the shards' headers and
//! sizes are read here; their tokens are read, and checked against the vocabulary, as their
//! windows are needed ([`ShardFiles::read_tokens`]).

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::bin::{self, HEADER_BYTES};
use crate::bail_input;
use crate::error::{io_err, Result};

/// One `.bin` shard: its path and how many tokens its header (and size) says it holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    pub path: PathBuf,
    pub tokens: u64,
}

impl Shard {
    /// The file's size in bytes, which its header fixes.
    pub fn bytes(&self) -> u64 {
        HEADER_BYTES as u64 + 2 * self.tokens
    }
}

/// `.bin` shards in the order they are read (sorted by name), each header checked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardSet {
    pub shards: Vec<Shard>,
}

impl ShardSet {
    /// Reads the header and size of each of `paths` (their order kept), refusing a FIFO, a
    /// device, a bad header or a size the header disagrees with in one line naming the file.
    pub fn open(paths: Vec<PathBuf>) -> Result<ShardSet> {
        let shards = paths
            .into_iter()
            .map(|path| {
                let tokens = bin::read_header(&path, "a .bin shard")?;
                Ok(Shard { path, tokens })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardSet { shards })
    }

    /// Tokens in all the shards.
    pub fn tokens(&self) -> u64 {
        self.shards.iter().map(|s| s.tokens).sum()
    }

    pub fn paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The first `need` tokens of the shards read one after another (all of them if they hold
    /// fewer), each checked against `vocab_size`.
    pub fn read_prefix(&self, need: u64, vocab_size: usize) -> Result<Vec<u32>> {
        let mut files = ShardFiles::new(self.clone(), vocab_size);
        let mut out = Vec::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let left = need - out.len() as u64;
            if left == 0 {
                break;
            }
            files.read_tokens(i, 0, left.min(shard.tokens), &mut out)?;
        }
        Ok(out)
    }
}

/// The shards' files, each opened when first read and kept open; tokens are read with
/// positioned reads, so nothing of a shard is in memory but the windows asked for.
pub struct ShardFiles {
    set: ShardSet,
    files: Vec<Option<fs::File>>,
    vocab_size: usize,
    scratch: Vec<u8>,
}

impl ShardFiles {
    pub fn new(set: ShardSet, vocab_size: usize) -> ShardFiles {
        let files = set.shards.iter().map(|_| None).collect();
        ShardFiles {
            set,
            files,
            vocab_size,
            scratch: Vec::new(),
        }
    }

    pub fn set(&self) -> &ShardSet {
        &self.set
    }

    /// Appends tokens `[start, start + count)` of shard `shard` to `out`, refusing one at or
    /// above the vocabulary in one line naming the file and its byte offset.
    pub fn read_tokens(&mut self, shard: usize, start: u64, count: u64, out: &mut Vec<u32>) -> Result<()> {
        let path = &self.set.shards[shard].path;
        let file = match &mut self.files[shard] {
            Some(f) => f,
            slot => slot.insert(fs::File::open(path).map_err(io_err(path))?),
        };
        let at = HEADER_BYTES as u64 + 2 * start;
        self.scratch.resize(2 * count as usize, 0);
        file.read_exact_at(&mut self.scratch, at).map_err(io_err(path))?;
        let first = out.len();
        out.extend(
            self.scratch
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32),
        );
        let vocab = self.vocab_size;
        if let Some(i) = out[first..].iter().position(|&t| t as usize >= vocab) {
            let gpt2_like = out[first..]
                .iter()
                .all(|&t| (t as usize) < crate::tokenizer::GPT2_VOCAB);
            let place = format!("byte offset {}", at + 2 * i as u64);
            return Err(bin::outside_vocab(path, out[first + i], &place, vocab, gpt2_like));
        }
        Ok(())
    }
}

/// Where the training windows come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrainSource {
    /// One file (text or `.bin`) that rank 0 reads whole and sends to every rank.
    File(PathBuf),
    /// `.bin` shards that every rank reads its own windows of.
    Shards(ShardSet),
}

/// Where the validation windows come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValSource {
    /// The tail of the single training file (`--val-fraction`).
    Split,
    /// A text file, read whole by rank 0.
    Text(PathBuf),
    /// `.bin` shards, of which rank 0 reads the windows it evaluates.
    Shards(ShardSet),
}

/// The training and validation data a run's flags name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPlan {
    pub train: TrainSource,
    pub val: ValSource,
}

impl DataPlan {
    /// Every file the run reads, for the guard that keeps outputs off them.
    pub fn files(&self) -> Vec<&Path> {
        let mut files = match &self.train {
            TrainSource::File(p) => vec![p.as_path()],
            TrainSource::Shards(s) => s.paths(),
        };
        match &self.val {
            ValSource::Split => {}
            ValSource::Text(p) => files.push(p),
            ValSource::Shards(s) => files.extend(s.paths()),
        }
        files
    }
}

/// Whether `arg` is a pattern (as llm.c's `-i`) rather than a path: it holds a wildcard and
/// names no existing file.
pub(crate) fn is_pattern(arg: &Path) -> bool {
    let s = arg.to_string_lossy();
    s.contains(['*', '?', '[']) && fs::symlink_metadata(arg).is_err()
}

/// The files `pattern` matches, sorted by name; none is refused.
pub(crate) fn expand(pattern: &Path, flag: &str) -> Result<Vec<PathBuf>> {
    let text = pattern.to_string_lossy();
    let matches = glob::glob(&text)
        .map_err(|e| crate::error::Error::Input(format!("{flag} {text}: not a valid pattern ({})", e.msg)))?;
    let mut files = Vec::new();
    for m in matches {
        files.push(m.map_err(|e| {
            let path = e.path().to_path_buf();
            io_err(path)(e.into())
        })?);
    }
    if files.is_empty() {
        bail_input!("{flag} {text}: the pattern matches no file");
    }
    files.sort();
    Ok(files)
}

/// A validation shard's name: llm.c's `*_val_*`.
pub(crate) fn is_val_shard(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().contains("_val_"))
}

/// The `.bin` files of directory `dir`, sorted by name: (training, validation) by `*_val_*`.
fn list_dir(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        if path.extension().is_some_and(|e| e == "bin") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files.into_iter().partition(|p| !is_val_shard(p)))
}

/// Whether the file at `path` is a `.bin` token file (its magic, or its extension), read from
/// its first bytes.
fn is_bin_file(path: &Path, what: &str) -> Result<bool> {
    crate::input::refuse_special(path, what)?;
    let file = fs::File::open(path).map_err(io_err(path))?;
    let mut head = [0u8; 4];
    let n = file.read_at(&mut head, 0).map_err(io_err(path))?;
    Ok(bin::looks_like_bin(path, &head[..n]))
}

/// `--val-data`: a file (text, or a `.bin` read window by window), a pattern of shards, or a
/// directory's `*_val_*` shards.
fn resolve_val(arg: &Path) -> Result<ValSource> {
    let files = if is_pattern(arg) {
        expand(arg, "--val-data")?
    } else if arg.is_dir() {
        let (_, val) = list_dir(arg)?;
        if val.is_empty() {
            bail_input!(
                "--val-data {}: the directory holds no *_val_* .bin shards",
                arg.display()
            );
        }
        val
    } else if is_bin_file(arg, "a validation file")? {
        vec![arg.to_path_buf()]
    } else {
        return Ok(ValSource::Text(arg.to_path_buf()));
    };
    Ok(ValSource::Shards(ShardSet::open(files)?))
}

/// What `--data` (one or more files, directories or patterns) and `--val-data` name:
///
/// - one file and no `--val-data`: that file, read whole, its tail held out (today's split);
/// - one text file and `--val-data`: that file read whole, all of it for training;
/// - otherwise `.bin` shards, sorted by name: a directory gives its `.bin` files, its `*_val_*`
///   ones for validation unless `--val-data` is given; a pattern, the files it matches.
///   Without `--val-data` or a directory's validation shards, the set is refused.
pub fn resolve(data: &[PathBuf], val_data: Option<&Path>) -> Result<DataPlan> {
    let val = val_data.map(resolve_val).transpose()?;
    if let [one] = data {
        if !is_pattern(one) && !one.is_dir() {
            return match val {
                None => Ok(DataPlan {
                    train: TrainSource::File(one.clone()),
                    val: ValSource::Split,
                }),
                Some(val) if !is_bin_file(one, "a corpus file")? => Ok(DataPlan {
                    train: TrainSource::File(one.clone()),
                    val,
                }),
                Some(val) => Ok(DataPlan {
                    train: TrainSource::Shards(ShardSet::open(vec![one.clone()])?),
                    val,
                }),
            };
        }
    }
    let (mut train, mut dir_val) = (Vec::new(), Vec::new());
    let mut no_val_from = None;
    for arg in data {
        if is_pattern(arg) {
            train.extend(expand(arg, "--data")?);
        } else if arg.is_dir() {
            let (t, v) = list_dir(arg)?;
            if t.is_empty() {
                bail_input!("--data {}: the directory holds no training .bin shards", arg.display());
            }
            if v.is_empty() {
                no_val_from.get_or_insert(arg);
            }
            train.extend(t);
            dir_val.extend(v);
        } else {
            train.push(arg.clone());
        }
    }
    train.sort();
    train.dedup();
    dir_val.sort();
    dir_val.dedup();
    let val = match val {
        Some(v) => v,
        None if no_val_from.is_some() || dir_val.is_empty() => {
            let why = match no_val_from {
                Some(dir) => format!("the directory {} holds no *_val_* shards", dir.display()),
                None => format!("{} shards name no validation set", train.len()),
            };
            bail_input!("--data: {why}: give --val-data FILE|GLOB");
        }
        None => ValSource::Shards(ShardSet::open(dir_val)?),
    };
    if let ValSource::Shards(v) = &val {
        if let Some(both) = v.shards.iter().find(|s| train.contains(&s.path)) {
            bail_input!(
                "{} is both a training shard (--data) and a validation shard: leave it out of one",
                both.path.display()
            );
        }
    }
    Ok(DataPlan {
        train: TrainSource::Shards(ShardSet::open(train)?),
        val,
    })
}

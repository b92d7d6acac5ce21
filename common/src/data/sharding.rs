//! A corpus of text documents, one a file, into llm.c `.bin` shards (`tokenize --output-dir`):
//!
//! - every document is its file's text, `<|endoftext|>` first (as in llm.c's FineWeb shards);
//! - the validation shard `PREFIX_val_000000.bin` takes whole documents, from the first, until
//!   it holds at least `val_tokens` tokens (none where `val_tokens` is 0);
//! - the training shards `PREFIX_train_000001.bin`, ... take the rest, exactly `shard_tokens`
//!   each (the last holds what is left); a document is cut where a shard ends and goes on in
//!   the next, as llm.c's `fineweb.py` cuts it.
//!
//! Documents are taken in the sorted order of their paths, read and tokenized in parallel a
//! batch of about [`BATCH_BYTES`] at a time, and appended in that order, so the shards do not
//! depend on the thread count. Where anything fails part-way, the shards already written are
//! removed: the directory never holds part of a corpus.

use std::ops::Range;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use rayon::prelude::*;

use super::bin::write_bin;
use super::shards::{expand, is_pattern, is_val_shard};
use crate::bail_input;
use crate::error::{io_err, Error, Result};
use crate::tokenizer::Tokenizer;

/// The most bytes of one document; a longer text is refused (split it into documents).
pub const MAX_DOCUMENT: u64 = 1 << 30;
/// Text read and tokenized at once (at least one document): large enough to keep every
/// thread busy, small enough that the batch's text and tokens stay a small part of memory.
pub const BATCH_BYTES: u64 = 64 << 20;
/// The most training shards: their six-digit numbers keep them sorted by name.
pub const MAX_SHARDS: u32 = 999_999;

/// One document: a text file and its size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    pub path: PathBuf,
    pub bytes: u64,
}

/// Where the shards go and how large they are.
#[derive(Clone, Debug)]
pub struct ShardSpec {
    pub dir: PathBuf,
    pub prefix: String,
    pub shard_tokens: u64,
    pub val_tokens: u64,
}

/// What [`write_shards`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub documents: usize,
    /// Tokens in all the shards (`<|endoftext|>` included).
    pub tokens: u64,
    /// Tokens in the validation shard (0: there is none).
    pub val_tokens: u64,
    /// The shards, the validation shard first.
    pub shards: Vec<PathBuf>,
}

/// A shard's file name: llm.c's `PREFIX_val_000000.bin`, `PREFIX_train_000001.bin`.
pub fn shard_name(prefix: &str, split: &str, index: u32) -> String {
    format!("{prefix}_{split}_{index:06}.bin")
}

/// The documents `inputs` name, sorted by path, each once: a file; every file under a
/// directory (symbolic links to files followed, to directories not); the files and
/// directories a pattern matches. A FIFO, a socket or a device among them, a missing path, a
/// directory or pattern with no file, or no document at all is refused in one line.
pub fn documents(inputs: &[PathBuf]) -> Result<Vec<Document>> {
    let mut paths = Vec::new();
    for input in inputs {
        let found = if is_pattern(input) {
            let mut found = Vec::new();
            for path in expand(input, "--input")? {
                add_path(&path, &mut found)?;
            }
            found
        } else {
            let mut found = Vec::new();
            add_path(input, &mut found)?;
            found
        };
        if found.is_empty() {
            bail_input!("--input {}: no file found there", input.display());
        }
        paths.extend(found);
    }
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .map(|path| {
            crate::input::refuse_special(&path, "a text document")?;
            let bytes = std::fs::metadata(&path).map_err(io_err(&path))?.len();
            Ok(Document { path, bytes })
        })
        .collect()
}

/// Adds `path` to `out`: a file itself, a directory's files (see [`documents`]).
fn add_path(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    crate::input::refuse_special(path, "a text document")?;
    let meta = std::fs::metadata(path).map_err(io_err(path))?;
    if meta.is_dir() {
        walk(path, out)
    } else {
        out.push(path.to_path_buf());
        Ok(())
    }
}

/// Every file under `dir`, into `out`; a FIFO, socket or device is refused.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err(&path))?;
        if kind.is_dir() {
            walk(&path, out)?;
        } else if kind.is_fifo() || kind.is_socket() || kind.is_block_device() || kind.is_char_device() {
            crate::input::refuse_special(&path, "a text document")?;
        } else if kind.is_symlink() {
            // A link to a directory is not followed (it could lead back up); one to a FIFO or a
            // device is refused; one to a file is a document.
            crate::input::refuse_special(&path, "a text document")?;
            if std::fs::metadata(&path).map_err(io_err(&path))?.is_file() {
                out.push(path);
            }
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Refuses a shard set that would mix with other files or replace an input: a prefix that is
/// empty, holds a `/` or reads as a validation shard (`_val_`); a `dir` that is not a
/// directory, that holds `.bin` files (`train --data DIR` would read them with the new
/// shards) or that holds one of the `documents` itself.
pub fn check_destination(spec: &ShardSpec, documents: &[Document]) -> Result<()> {
    let (dir, prefix) = (&spec.dir, &spec.prefix);
    if prefix.is_empty() || prefix.contains('/') || prefix.contains('\0') {
        bail_input!(
            "--prefix '{}': give a non-empty name without '/'",
            prefix.escape_debug()
        );
    }
    if is_val_shard(Path::new(&shard_name(prefix, "train", 1))) {
        bail_input!(
            "shard prefix '{}' holds _val_, so every shard would read as a validation shard: give another --prefix",
            prefix.escape_debug()
        );
    }
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(()); // created later: it holds nothing yet
    };
    if !meta.is_dir() {
        bail_input!("--output-dir {}: not a directory", dir.display());
    }
    let mut bins = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        if path.extension().is_some_and(|e| e == "bin") {
            bins.push(path);
        }
    }
    if let Some(first) = bins.iter().min() {
        bail_input!(
            "--output-dir {} already holds {} .bin file(s) ({} first): `train --data` would read them with the new shards; give an empty directory",
            dir.display(),
            bins.len(),
            first.display()
        );
    }
    if let Some(doc) = documents
        .iter()
        .find(|d| d.path.parent().is_some_and(|p| crate::input::same_file(p, dir)))
    {
        bail_input!(
            "--output-dir {} holds the input {}: keep the shards apart from the documents",
            dir.display(),
            doc.path.display()
        );
    }
    Ok(())
}

/// Consecutive documents cut into batches of about `max_bytes` (at least one document each).
pub fn batches(documents: &[Document], max_bytes: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, doc) in documents.iter().enumerate() {
        if i > start && bytes + doc.bytes > max_bytes {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += doc.bytes;
    }
    if start < documents.len() {
        out.push(start..documents.len());
    }
    out
}

/// A document's tokens: `end_of_text`, then its text's.
fn encode_document(doc: &Document, tok: &Tokenizer, end_of_text: u32) -> Result<Vec<u32>> {
    let text = crate::input::read_text(&doc.path, "a document", MAX_DOCUMENT, false)?;
    let mut tokens = vec![end_of_text];
    tokens.extend(
        tok.encode(&text)
            .map_err(|e| Error::Input(format!("{}: {e}", doc.path.display())))?,
    );
    Ok(tokens)
}

/// Tokenizes `documents` with `tok` on `pool` into shards as `spec` says (see the module's
/// documentation), advancing `bar` by each document's bytes. `spec` must have passed
/// [`check_destination`]; its directory is made with the first shard. On an error the shards
/// written so far are removed, and the directory where it was made for them.
pub fn write_shards(
    documents: &[Document],
    tok: &Tokenizer,
    spec: &ShardSpec,
    pool: &rayon::ThreadPool,
    bar: &ProgressBar,
) -> Result<Written> {
    let Some(end_of_text) = tok.end_of_text() else {
        bail_input!(
            "--tokenizer {} has no <|endoftext|> to put between documents: use --tokenizer gpt2",
            tok.kind().name()
        );
    };
    // A tokenizer of its own for each thread: threads sharing one contend on its regex (two
    // threads are slower than one); each builds its own copy at once.
    let per_thread = pool
        .broadcast(|_| Tokenizer::new(tok.kind()))
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let mut writer = ShardWriter::new(spec);
    let mut fill = || -> Result<()> {
        for batch in batches(documents, BATCH_BYTES) {
            let encoded: Vec<Result<Vec<u32>>> = pool.install(|| {
                documents[batch]
                    .par_iter()
                    .map(|doc| {
                        let tok = rayon::current_thread_index().map_or(tok, |i| &per_thread[i]);
                        let tokens = encode_document(doc, tok, end_of_text);
                        bar.inc(doc.bytes);
                        tokens
                    })
                    .collect()
            });
            // In path order: the first bad document is the one named, on any thread count.
            for tokens in encoded {
                writer.push(&tokens?)?;
            }
            bar.set_message(format!("{} shards", writer.written.len()));
        }
        Ok(())
    };
    match fill().and_then(|()| writer.finish()) {
        Ok(()) => Ok(Written {
            documents: documents.len(),
            tokens: writer.tokens,
            val_tokens: writer.val_written,
            shards: writer.written,
        }),
        Err(e) => {
            // Best effort: the error is the one to report.
            for path in &writer.written {
                let _ = std::fs::remove_file(path);
            }
            if writer.created_dir {
                let _ = std::fs::remove_dir(&spec.dir);
            }
            Err(e)
        }
    }
}

/// Documents' tokens in, shards out.
struct ShardWriter<'a> {
    spec: &'a ShardSpec,
    /// The validation shard's tokens while it is open.
    val: Vec<u32>,
    /// Whether the validation shard is complete (written, or none).
    val_closed: bool,
    /// Tokens in the validation shard written.
    val_written: u64,
    /// The training shard being filled.
    train: Vec<u32>,
    next_train: u32,
    tokens: u64,
    written: Vec<PathBuf>,
    /// Whether the directory was made for the shards (it is removed again on an error).
    created_dir: bool,
}

impl<'a> ShardWriter<'a> {
    fn new(spec: &'a ShardSpec) -> Self {
        ShardWriter {
            spec,
            val: Vec::new(),
            val_closed: spec.val_tokens == 0,
            val_written: 0,
            train: Vec::new(),
            next_train: 1,
            tokens: 0,
            written: Vec::new(),
            created_dir: false,
        }
    }

    /// Appends one document's tokens.
    fn push(&mut self, doc: &[u32]) -> Result<()> {
        self.tokens += doc.len() as u64;
        if !self.val_closed && (self.val.len() as u64) < self.spec.val_tokens {
            self.val.extend_from_slice(doc);
            return Ok(());
        }
        // The validation shard is written once a training document follows it, so a corpus
        // with nothing left for training writes nothing (see `finish`).
        if !self.val_closed {
            let val = std::mem::take(&mut self.val);
            self.write(&shard_name(&self.spec.prefix, "val", 0), &val)?;
            self.val_written = val.len() as u64;
            self.val_closed = true;
        }
        let mut rest = doc;
        while !rest.is_empty() {
            let room = self.spec.shard_tokens as usize - self.train.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            self.train.extend_from_slice(now);
            rest = later;
            if self.train.len() as u64 == self.spec.shard_tokens {
                self.write_train()?;
            }
        }
        Ok(())
    }

    fn write_train(&mut self) -> Result<()> {
        if self.next_train > MAX_SHARDS {
            bail_input!(
                "more than {MAX_SHARDS} training shards of {} tokens: give a larger --shard-tokens",
                self.spec.shard_tokens
            );
        }
        let train = std::mem::take(&mut self.train);
        self.write(&shard_name(&self.spec.prefix, "train", self.next_train), &train)?;
        self.next_train += 1;
        Ok(())
    }

    fn write(&mut self, name: &str, tokens: &[u32]) -> Result<()> {
        let dir = &self.spec.dir;
        if self.written.is_empty() && std::fs::symlink_metadata(dir).is_err() {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
            self.created_dir = true;
        }
        let path = dir.join(name);
        write_bin(&path, tokens)?;
        self.written.push(path);
        Ok(())
    }

    /// Writes the last training shard; refuses a corpus whose tokens all went to validation.
    fn finish(&mut self) -> Result<()> {
        if !self.train.is_empty() {
            self.write_train()?;
        }
        if self.next_train == 1 {
            bail_input!(
                "all {} tokens of the documents went to the validation shard (--val-tokens {}): none are left for training; give a smaller --val-tokens",
                self.tokens,
                self.spec.val_tokens
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpt2-sharding-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn spec(dir: &Path, shard_tokens: u64, val_tokens: u64) -> ShardSpec {
        ShardSpec {
            dir: dir.to_path_buf(),
            prefix: "t".into(),
            shard_tokens,
            val_tokens,
        }
    }

    /// Feeds documents of the given token counts (token values: the document's number).
    fn shard_sizes(docs: &[usize], shard_tokens: u64, val_tokens: u64) -> Result<Vec<(String, Vec<u32>)>> {
        let dir = tmpdir(&format!("w{shard_tokens}-{val_tokens}-{}", docs.len()));
        let spec = spec(&dir, shard_tokens, val_tokens);
        let mut w = ShardWriter::new(&spec);
        for (i, &n) in docs.iter().enumerate() {
            w.push(&vec![i as u32; n])?;
        }
        w.finish()?;
        let out = w
            .written
            .iter()
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, super::super::read_bin(p, 256).unwrap())
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        Ok(out)
    }

    #[test]
    fn whole_documents_validate_and_training_shards_are_cut_exactly() {
        let out = shard_sizes(&[3, 4, 5, 6], 4, 5).unwrap();
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "t_val_000000.bin",
                "t_train_000001.bin",
                "t_train_000002.bin",
                "t_train_000003.bin"
            ]
        );
        // Documents 0 and 1 reach the 5 validation tokens; 5 + 6 tokens cut into 4, 4, 3.
        assert_eq!(out[0].1, [0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(out[1].1, [2, 2, 2, 2]);
        assert_eq!(out[2].1, [2, 3, 3, 3]);
        assert_eq!(out[3].1, [3, 3, 3]);
        // No validation shard: training from the first document, still numbered from 1.
        let out = shard_sizes(&[2, 2], 10, 0).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0], ("t_train_000001.bin".to_string(), vec![0, 0, 1, 1]));
    }

    #[test]
    fn a_corpus_that_validation_takes_whole_is_refused_before_writing() {
        let e = shard_sizes(&[3, 4], 4, 7).unwrap_err().to_string();
        assert!(e.contains("all 7 tokens") && e.contains("--val-tokens 7"), "{e}");
    }

    #[test]
    fn batches_hold_about_the_limit_and_at_least_one_document() {
        let docs: Vec<Document> = [5u64, 5, 20, 1, 1, 1]
            .iter()
            .map(|&bytes| Document {
                path: PathBuf::new(),
                bytes,
            })
            .collect();
        assert_eq!(batches(&docs, 10), vec![0..2, 2..3, 3..6]);
        assert_eq!(batches(&docs, 1000), vec![0..6]);
        assert!(batches(&[], 10).is_empty());
    }

    #[test]
    fn directories_are_walked_in_path_order_and_special_files_refused() {
        let d = tmpdir("docs");
        std::fs::create_dir_all(d.join("b/c")).unwrap();
        for f in ["b/c/z.txt", "a.txt", "b/y.txt"] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        std::os::unix::fs::symlink(d.join("b"), d.join("b/loop")).unwrap();
        let docs = documents(&[d.clone(), d.join("a.txt")]).unwrap();
        let names: Vec<_> = docs
            .iter()
            .map(|x| x.path.strip_prefix(&d).unwrap().to_owned())
            .collect();
        let want: Vec<PathBuf> = ["a.txt", "b/c/z.txt", "b/y.txt"].iter().map(PathBuf::from).collect();
        assert_eq!(names, want);
        let pattern = d.join("b/*.txt");
        assert_eq!(documents(&[pattern]).unwrap().len(), 1);
        std::fs::create_dir_all(d.join("empty")).unwrap();
        let e = documents(&[d.join("empty")]).unwrap_err().to_string();
        assert!(e.contains("no file found"), "{e}");
        let made = std::process::Command::new("mkfifo")
            .arg(d.join("b/pipe"))
            .status()
            .unwrap();
        assert!(made.success());
        let e = documents(std::slice::from_ref(&d)).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}

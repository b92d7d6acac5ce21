//! The files a command reads, and the outputs that must not land on them.
//!
//! - Where a regular file is needed (a corpus, a checkpoint, idx files, safetensors,
//!   `config.json`, a run's `loss.tsv`), a FIFO, a socket or a device is refused from its
//!   metadata, before it is opened: opening a FIFO for reading waits for a writer that may never
//!   come, and a device such as `/dev/zero` never ends ([`refuse_special`]).
//! - Text read in one pass (`generate --prompt-file`, `plot --data`, `report`'s tables) is read
//!   no further than a stated limit ([`read_text`]). Of these, only the prompt file and the
//!   table to plot may come from a pipe, and then only as standard input (`-` or `/dev/stdin`,
//!   opened already by whoever started the command): a named FIFO is refused like any other.
//! - An output never replaces one of the command's inputs: [`same_file`] compares the resolved
//!   paths and the files' (device, inode) numbers, so another spelling, a symbolic link or a
//!   hard link of an input is caught.

use crate::error::{io_err, Error, Result};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// The most bytes of a prompt file (`generate --prompt-file`).
pub const MAX_PROMPT_FILE: u64 = 16 << 20;
/// The most bytes of a table to plot (`plot --data`).
pub const MAX_PLOT_TABLE: u64 = 64 << 20;
/// The most bytes of a run's `loss.tsv` that `report` and a resumed run read.
pub const MAX_LOSS_TABLE: u64 = 256 << 20;
/// The most bytes of a run's `summary.json` and `env.txt` that `report` reads.
pub const MAX_RUN_NOTE: u64 = 16 << 20;

/// Refuses `path` where it names (through symbolic links) a FIFO, a socket or a device, in one
/// line that says `what` was wanted ("a corpus file"). Nothing is opened. A missing path or a
/// directory passes: opening it says what is wrong, in the caller's words.
pub fn refuse_special(path: &Path, what: &str) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let t = meta.file_type();
    let kind = if t.is_fifo() {
        "a named pipe (FIFO)"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        return Ok(());
    };
    crate::bail_input!("{}: {kind}, not {what}", path.display())
}

/// Whether `path` stands for standard input: `-` or `/dev/stdin`.
pub fn is_stdin(path: &Path) -> bool {
    path == Path::new("-") || path == Path::new("/dev/stdin")
}

/// The UTF-8 text of `path`, `what` it is ("a prompt file") naming it in errors, refused past
/// `limit` bytes. A regular file's size is checked before it is read; standard input (where
/// `stdin_allowed`: see [`is_stdin`]) is read no further than one byte past the limit.
pub fn read_text(path: &Path, what: &str, limit: u64, stdin_allowed: bool) -> Result<String> {
    let shown = path.display();
    let too_long = || {
        Error::Input(format!(
            "{shown}: longer than {} MiB, the most {what} may hold",
            limit >> 20
        ))
    };
    let mut bytes = Vec::new();
    if stdin_allowed && is_stdin(path) {
        let stdin = std::io::stdin().lock();
        stdin.take(limit + 1).read_to_end(&mut bytes).map_err(io_err(path))?;
    } else {
        refuse_special(path, what)?;
        if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > limit) {
            return Err(too_long());
        }
        let file = std::fs::File::open(path).map_err(io_err(path))?;
        file.take(limit + 1).read_to_end(&mut bytes).map_err(io_err(path))?;
    }
    if bytes.len() as u64 > limit {
        return Err(too_long());
    }
    String::from_utf8(bytes).map_err(|e| {
        Error::Input(format!(
            "{shown}: not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Whether `a` and `b` are one file: the same resolved path, or, where both exist, the same
/// (device, inode) pair, which hard links share. A path that is not there yet is no existing
/// file, so it is `b`'s only where the two are spelled alike.
pub fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(x), Ok(y)) = (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        if x == y {
            return true;
        }
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// Refuses an output `out` (given as `flag`) that is one of `inputs` (see [`same_file`]): it
/// would be replaced before, or while, it is read.
pub fn refuse_overwriting<'p>(flag: &str, out: &Path, inputs: impl IntoIterator<Item = &'p Path>) -> Result<()> {
    match inputs.into_iter().find(|input| same_file(out, input)) {
        Some(input) => crate::bail_input!(
            "{flag} {} is one of the command's inputs ({}): it would be replaced; give another path",
            out.display(),
            input.display()
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gpt2-input-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn hard_links_symbolic_links_and_spellings_are_one_file() {
        let d = tmpdir("same");
        let (a, b) = (d.join("a.txt"), d.join("b.txt"));
        std::fs::write(&a, "x").unwrap();
        std::fs::write(&b, "x").unwrap();
        std::fs::hard_link(&a, d.join("hard.txt")).unwrap();
        std::os::unix::fs::symlink("a.txt", d.join("soft.txt")).unwrap();
        assert!(same_file(&a, &d.join("hard.txt")));
        assert!(same_file(&a, &d.join("soft.txt")));
        assert!(same_file(&a, &d.join(".").join("a.txt")));
        assert!(!same_file(&a, &b), "two files of the same bytes");
        assert!(!same_file(&a, &d.join("new.txt")), "a path not there yet");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn special_files_are_refused_and_text_is_read_within_its_limit() {
        let d = tmpdir("text");
        let pipe = d.join("pipe");
        assert!(std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap()
            .success());
        let refused = |p: &Path| refuse_special(p, "a file").unwrap_err().to_string();
        assert!(refused(&pipe).contains("named pipe (FIFO)"));
        assert!(refused(Path::new("/dev/zero")).contains("a device"));
        assert!(refuse_special(&d, "a file").is_ok(), "a directory: the open says why");
        assert!(refuse_special(&d.join("missing"), "a file").is_ok());
        // The FIFO is refused without being opened (which would wait for a writer).
        let e = read_text(&pipe, "a table", 1 << 20, true).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let big = d.join("big.txt");
        std::fs::File::create(&big).unwrap().set_len((1 << 20) + 1).unwrap();
        let e = read_text(&big, "a table", 1 << 20, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{}: longer than 1 MiB, the most a table may hold", big.display())
        );
        std::fs::write(&big, b"ok\n\xff").unwrap();
        let e = read_text(&big, "a table", 1 << 20, true).unwrap_err();
        assert!(
            e.to_string().ends_with("not UTF-8 text (invalid byte at offset 3)"),
            "{e}"
        );
        std::fs::write(&big, "ok\n").unwrap();
        assert_eq!(read_text(&big, "a table", 1 << 20, true).unwrap(), "ok\n");
        let _ = std::fs::remove_dir_all(&d);
    }
}

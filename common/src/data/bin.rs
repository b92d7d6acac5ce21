//! llm.c's `.bin` token files: a header of 256 little-endian i32 (`[magic, version, token
//! count, 0...]`) and then the tokens as uint16. Whole files ([`read_bin`], [`load_tokens`])
//! and the header alone ([`read_header`], for shards read window by window).

use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::bail_input;
use crate::error::{io_err, Error, Result};
use crate::tokenizer::Tokenizer;

/// llm.c's header: 256 little-endian i32 = [magic, version, token count, 0...].
pub const BIN_MAGIC: i32 = 20240520;
pub const BIN_VERSION: i32 = 1;
/// The header's length in bytes; the tokens start here.
pub const HEADER_BYTES: usize = 256 * 4;

/// Write `tokens` as uint16 after the llm.c header, atomically (see [`crate::atomic_file`]).
pub fn write_bin(path: &Path, tokens: &[u32]) -> Result<()> {
    if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, &t)| t > u16::MAX as u32) {
        bail_input!(
            "{}: token {t} at index {i} does not fit the .bin format's uint16",
            path.display()
        );
    }
    let count = i32::try_from(tokens.len()).map_err(|_| {
        Error::Input(format!(
            "{}: {} tokens exceed the .bin header's i32 count",
            path.display(),
            tokens.len()
        ))
    })?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + 2 * tokens.len());
    for v in [BIN_MAGIC, BIN_VERSION, count] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.resize(HEADER_BYTES, 0);
    for &t in tokens {
        bytes.extend_from_slice(&(t as u16).to_le_bytes());
    }

    crate::atomic_file::write(path, |file| file.write_all(&bytes))
}

/// Read an llm.c `.bin` file, checking the header, the exact size and every token id.
pub fn read_bin(path: &Path, vocab_size: usize) -> Result<Vec<u32>> {
    crate::input::refuse_special(path, "a .bin token file")?;
    let bytes = fs::read(path).map_err(io_err(path))?;
    parse_bin(path, &bytes, vocab_size)
}

/// The token count of a `.bin` file whose first bytes are `head` (at least the header's, or
/// the whole file if shorter) and whose size is `file_bytes`: the magic, the version and the
/// size the count implies are checked, each refused in one line naming `path`.
pub fn check_header(path: &Path, head: &[u8], file_bytes: u64) -> Result<u64> {
    let p = path.display();
    if head.len() < HEADER_BYTES || file_bytes < HEADER_BYTES as u64 {
        bail_input!("{p}: {file_bytes} bytes is shorter than the {HEADER_BYTES}-byte .bin header");
    }
    let header = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let (magic, version, count) = (header(0), header(1), header(2));
    if magic != BIN_MAGIC {
        bail_input!("{p}: bad .bin magic {magic} (expected {BIN_MAGIC}); not an llm.c token file");
    }
    if version != BIN_VERSION {
        bail_input!("{p}: unsupported .bin version {version} (expected {BIN_VERSION}, uint16 tokens)");
    }
    if count < 0 {
        bail_input!("{p}: negative token count {count} in the .bin header");
    }
    let count = count as u64;
    let expected = HEADER_BYTES as u64 + 2 * count;
    if file_bytes != expected {
        bail_input!(
            "{p}: header says {count} tokens, so the file should be {expected} bytes, but it is {file_bytes} bytes"
        );
    }
    Ok(count)
}

/// The token count of the `.bin` file at `path`, from its header and size alone (the tokens
/// are not read). `what` names the file's role in a refusal of a FIFO or device ("a .bin shard").
pub fn read_header(path: &Path, what: &str) -> Result<u64> {
    crate::input::refuse_special(path, what)?;
    let file = fs::File::open(path).map_err(io_err(path))?;
    let meta = file.metadata().map_err(io_err(path))?;
    if !meta.is_file() {
        bail_input!("{}: not a regular file, not {what}", path.display());
    }
    let len = meta.len();
    let mut head = vec![0u8; HEADER_BYTES.min(len as usize)];
    file.read_exact_at(&mut head, 0).map_err(io_err(path))?;
    check_header(path, &head, len)
}

/// The refusal of token `token` outside a vocabulary of `vocab_size`, found in `path` at
/// `place` ("index 77", "byte 1178"). `gpt2_like`: every token read fits GPT-2's vocabulary,
/// which hints at the flag that was left out.
pub(crate) fn outside_vocab(path: &Path, token: u32, place: &str, vocab_size: usize, gpt2_like: bool) -> Error {
    // `tokenize` writes GPT-2 tokens by default, `train` reads bytes by default.
    let hint = match gpt2_like && vocab_size < crate::tokenizer::GPT2_VOCAB {
        true => " (GPT-2 tokens? train on them with --tokenizer gpt2)",
        false => "",
    };
    Error::Input(format!(
        "{}: token {token} at {place} is outside the vocabulary of {vocab_size}{hint}",
        path.display()
    ))
}

fn parse_bin(path: &Path, bytes: &[u8], vocab_size: usize) -> Result<Vec<u32>> {
    check_header(path, bytes, bytes.len() as u64)?;
    let tokens: Vec<u32> = bytes[HEADER_BYTES..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
        .collect();
    if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, &t)| t as usize >= vocab_size) {
        let gpt2_like = tokens.iter().all(|&t| (t as usize) < crate::tokenizer::GPT2_VOCAB);
        return Err(outside_vocab(path, t, &format!("index {i}"), vocab_size, gpt2_like));
    }
    Ok(tokens)
}

/// Whether the file that starts with `head` at `path` is a `.bin` token file: its magic, or
/// a `.bin` extension (then a bad header is refused rather than read as text).
pub fn looks_like_bin(path: &Path, head: &[u8]) -> bool {
    let has_magic = head.len() >= 4 && head[..4] == BIN_MAGIC.to_le_bytes();
    has_magic || path.extension().is_some_and(|e| e == "bin")
}

/// Tokens from `path`: an llm.c `.bin` file (recognised by its magic or a `.bin` extension)
/// is read as is; anything else must be UTF-8 text and is encoded with `tok`.
pub fn load_tokens(path: &Path, tok: &Tokenizer) -> Result<Vec<u32>> {
    let p = path.display();
    // A device (/dev/zero) never ends, a FIFO may never be written: neither is opened.
    crate::input::refuse_special(path, "a corpus file")?;
    let bytes = fs::read(path).map_err(io_err(path))?;
    if bytes.is_empty() {
        bail_input!("{p}: file is empty");
    }
    let tokens = if looks_like_bin(path, &bytes) {
        parse_bin(path, &bytes, tok.vocab_size())?
    } else {
        match std::str::from_utf8(&bytes) {
            Ok(text) => tok.encode(text).map_err(|e| Error::Input(format!("{p}: {e}")))?,
            Err(e) => bail_input!(
                "{p}: neither UTF-8 text (invalid byte at offset {}) nor an llm.c .bin token file",
                e.valid_up_to()
            ),
        }
    };
    if tokens.is_empty() {
        bail_input!("{p}: contains no tokens");
    }
    Ok(tokens)
}

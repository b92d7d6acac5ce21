//! Text ↔ token ids. Two vocabularies: raw UTF-8 bytes (256 ids, nothing to download) and
//! GPT-2's 50,257-id BPE (tiktoken's `r50k_base`, whose ranks are embedded in the crate).

use std::sync::Arc;

use tiktoken_rs::CoreBPE;

use crate::error::{Error, Result};

/// Symbols of the GPT-2 tokenizer (50,000 merges, 256 bytes, `<|endoftext|>`).
pub const GPT2_VOCAB: usize = 50257;

/// Which vocabulary to use; chosen on the command line and saved in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum TokenizerKind {
    /// One token per UTF-8 byte (vocabulary 256).
    Byte,
    /// GPT-2's byte-level BPE (vocabulary 50257).
    Gpt2,
}

impl TokenizerKind {
    /// The kind a checkpoint names (see [`TokenizerKind::name`]).
    pub fn from_checkpoint(name: &str) -> Result<Self> {
        <Self as clap::ValueEnum>::from_str(name, true).map_err(|_| {
            Error::Input(format!(
                "checkpoint names an unknown tokenizer '{}'",
                name.escape_debug()
            ))
        })
    }

    /// The name used on the command line and in checkpoints.
    pub fn name(self) -> &'static str {
        match self {
            TokenizerKind::Byte => "byte",
            TokenizerKind::Gpt2 => "gpt2",
        }
    }
}

/// The longest run of whitespace characters the GPT-2 tokenizer encodes whole. Its
/// pre-tokenizer (tiktoken's regex, which backtracks) fails on a run of a few hundred thousand
/// (a stack limit: 400,000 spaces pass, 1,000,000 do not), so a longer run is cut into pieces
/// of this many characters, each encoded on its own. Only the tokens of such a run can differ
/// from a tokenizer that takes it whole; text without one is encoded exactly as before.
pub const LONGEST_WHITESPACE_RUN: usize = 1 << 16;

/// `text` cut before the (`longest` + 1)-th whitespace character of every run, and every
/// `longest` characters after: no piece holds a run of more than `longest`. One piece where
/// no run is that long.
fn cut_whitespace_runs(text: &str, longest: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut run) = (0, 0);
    for (i, c) in text.char_indices() {
        run = if c.is_whitespace() { run + 1 } else { 0 };
        if run > longest {
            pieces.push(&text[start..i]);
            (start, run) = (i, 1);
        }
    }
    pieces.push(&text[start..]);
    pieces
}

/// A ready tokenizer. Cloning is cheap: the BPE tables are shared, since building them takes
/// a noticeable fraction of a second.
#[derive(Clone)]
pub struct Tokenizer {
    kind: TokenizerKind,
    bpe: Option<Arc<CoreBPE>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("kind", &self.kind).finish()
    }
}

impl Tokenizer {
    pub fn new(kind: TokenizerKind) -> Result<Tokenizer> {
        let bpe = match kind {
            TokenizerKind::Byte => None,
            TokenizerKind::Gpt2 => {
                let bpe = tiktoken_rs::r50k_base()
                    .map_err(|e| Error::Input(format!("cannot build the GPT-2 tokenizer: {e}")))?;
                Some(Arc::new(bpe))
            }
        };
        Ok(Tokenizer { kind, bpe })
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    pub fn vocab_size(&self) -> usize {
        match self.kind {
            TokenizerKind::Byte => 256,
            TokenizerKind::Gpt2 => GPT2_VOCAB,
        }
    }

    /// The token that ends a document, where the vocabulary has one (GPT-2's
    /// `<|endoftext|>`, 50256; bytes have none).
    pub fn end_of_text(&self) -> Option<u32> {
        match self.kind {
            TokenizerKind::Byte => None,
            TokenizerKind::Gpt2 => Some(50256),
        }
    }

    /// Byte: the UTF-8 bytes. GPT-2: BPE, with `<|endoftext|>` in the text read as the special
    /// token 50256 (how GPT-2 corpora separate documents) rather than as seven ordinary pieces.
    /// A run of more than [`LONGEST_WHITESPACE_RUN`] whitespace characters is cut into pieces
    /// of that many, each encoded apart (see there); text without one is encoded whole.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let Some(bpe) = &self.bpe else {
            return Ok(text.bytes().map(u32::from).collect());
        };
        let special = bpe.special_tokens();
        let mut ids = Vec::new();
        for piece in cut_whitespace_runs(text, LONGEST_WHITESPACE_RUN) {
            let (piece_ids, _) = bpe
                .encode(piece, &special)
                .map_err(|e| Error::Input(format!("the GPT-2 tokenizer cannot encode this text: {e}")))?;
            ids.extend(piece_ids);
        }
        Ok(ids)
    }

    /// Lossy: a sample may end inside a multi-byte character, and a model may emit ids outside
    /// the vocabulary (padded logits); both become U+FFFD instead of an error. For text to
    /// print, use [`crate::text`], which escapes instead.
    pub fn decode(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&self.bytes(tokens)).into_owned()
    }

    /// The bytes `tokens` stand for, concatenated (see [`Tokenizer::token_bytes`]).
    pub fn bytes(&self, tokens: &[u32]) -> Vec<u8> {
        match &self.bpe {
            None => tokens.iter().flat_map(|&t| self.token_bytes(t)).collect(),
            Some(bpe) => match bpe.decode_bytes(tokens) {
                Ok(all) => all,
                // Rare path: token by token so only the unknown ids are replaced.
                Err(_) => tokens.iter().flat_map(|&t| self.token_bytes(t)).collect(),
            },
        }
    }

    /// The bytes of one token: byte tokenizer, the byte itself; GPT-2, its piece (which may be
    /// part of a character); `<|endoftext|>`, its 13 characters. An id outside the vocabulary
    /// (a model with padded logits) gives U+FFFD's bytes, so it stays visible in the text
    /// without being confused with a byte.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();
        let piece = match &self.bpe {
            None => u8::try_from(id).ok().map(|b| vec![b]),
            Some(bpe) => bpe.decode_bytes(&[id]).ok(),
        };
        piece.unwrap_or_else(|| REPLACEMENT.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::cut_whitespace_runs;

    #[test]
    fn whitespace_runs_are_cut_past_the_longest_and_nothing_else() {
        assert_eq!(cut_whitespace_runs("ab   cd  e", 3), vec!["ab   cd  e"]);
        assert_eq!(cut_whitespace_runs("ab    cd", 3), vec!["ab   ", " cd"]);
        assert_eq!(
            cut_whitespace_runs("a\u{3000}\n \t\n\n b", 2),
            vec!["a\u{3000}\n", " \t", "\n\n", " b"]
        );
        assert_eq!(cut_whitespace_runs("", 2), vec![""]);
        let text = format!("x{}y{}", " ".repeat(10), "\n".repeat(7));
        let pieces = cut_whitespace_runs(&text, 4);
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![5, 4, 7, 3]);
    }
}

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
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.bpe {
            None => text.bytes().map(u32::from).collect(),
            Some(bpe) => bpe.encode_with_special_tokens(text),
        }
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

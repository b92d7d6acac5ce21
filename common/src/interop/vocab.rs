//! The tokenizer files Hugging Face's `GPT2Tokenizer` reads, `vocab.json` (piece → id) and
//! `merges.txt` (the BPE merges in order), so that `AutoTokenizer` loads an export directory.
//! Pieces are bytes written as GPT-2's printable stand-ins (`bytes_to_unicode`: a space is
//! `Ġ`, a newline `Ċ`).
//!
//! - GPT-2 BPE: the 50,257 tokens of tiktoken's `r50k_base` (the same vocabulary), and the
//!   merges recovered from its ranks: token r is the merge of the two pieces that BPE with the
//!   ranks below r leaves of its bytes, which is how the ranks were made.
//! - Bytes: the 256 single-byte pieces, id = the byte, and no merges, so HF's tokenizer maps
//!   every byte of the text to its own id, exactly as ours does.

use crate::tokenizer::{Tokenizer, TokenizerKind};
use std::collections::HashMap;

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode` in OpenAI's encoder.py):
/// printable Latin-1 bytes stand for themselves, the others for U+0100 onwards in order.
pub fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut out = ['\0'; 256];
    let mut next = 256;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b)
        } else {
            next += 1;
            char::from_u32(next - 1)
        }
        .expect("below U+0200");
    }
    out
}

fn piece(bytes: &[u8], chars: &[char; 256]) -> String {
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

/// (`vocab.json`, `merges.txt`) for `tok`'s vocabulary.
pub fn files(tok: &Tokenizer) -> (serde_json::Value, String) {
    let chars = byte_chars();
    let mut merges = String::from("#version: 0.2\n");
    let mut vocab = serde_json::Map::new();
    match tok.kind() {
        TokenizerKind::Byte => {
            for b in 0..=255u8 {
                vocab.insert(piece(&[b], &chars), b.into());
            }
        }
        TokenizerKind::Gpt2 => {
            let eot = tok.end_of_text().expect("GPT-2 has <|endoftext|>");
            let tokens: Vec<Vec<u8>> = (0..eot).map(|id| tok.token_bytes(id)).collect();
            let rank: HashMap<&[u8], u32> = tokens
                .iter()
                .enumerate()
                .map(|(r, t)| (t.as_slice(), r as u32))
                .collect();
            for (r, bytes) in tokens.iter().enumerate() {
                vocab.insert(piece(bytes, &chars), r.into());
                if bytes.len() > 1 {
                    let [a, b] = merge_of(bytes, r as u32, &rank);
                    merges.push_str(&format!("{} {}\n", piece(a, &chars), piece(b, &chars)));
                }
            }
            vocab.insert("<|endoftext|>".into(), eot.into());
        }
    }
    (serde_json::Value::Object(vocab), merges)
}

/// The two pieces byte-pair merging leaves of `token` when only merges ranked below `limit`
/// (its own rank) may apply: the merge that made it.
fn merge_of<'t>(token: &'t [u8], limit: u32, rank: &HashMap<&[u8], u32>) -> [&'t [u8]; 2] {
    let mut bounds: Vec<usize> = (0..=token.len()).collect(); // piece i is bounds[i]..bounds[i + 1]
    loop {
        let best = (0..bounds.len().saturating_sub(2))
            .filter_map(|i| Some((*rank.get(&token[bounds[i]..bounds[i + 2]])?, i)))
            .filter(|&(r, _)| r < limit)
            .min();
        match best {
            Some((_, i)) => {
                bounds.remove(i + 1);
            }
            None => break,
        }
    }
    assert_eq!(
        bounds.len(),
        3,
        "token {limit} is not one merge of two lower-ranked tokens"
    );
    [&token[..bounds[1]], &token[bounds[1]..]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_gpt2s() {
        let c = byte_chars();
        assert_eq!((c[b' ' as usize], c[b'\n' as usize], c[b'A' as usize]), ('Ġ', 'Ċ', 'A'));
        let mut all = c.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn gpt2_merges_are_the_published_ones() {
        let (vocab, merges) = files(&Tokenizer::new(TokenizerKind::Gpt2).unwrap());
        let lines: Vec<&str> = merges.lines().collect();
        // GPT-2's merges.txt: a header, then 50,000 merges, the first "Ġ t", "Ġ a", "h e".
        assert_eq!(lines.len(), 50_001);
        assert_eq!(&lines[..4], ["#version: 0.2", "Ġ t", "Ġ a", "h e"]);
        assert_eq!(vocab.as_object().unwrap().len(), 50_257);
        assert_eq!(vocab["Ġthe"], 262);
        assert_eq!(vocab["<|endoftext|>"], 50256);
    }
}

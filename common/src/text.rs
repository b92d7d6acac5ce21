//! Model output made safe for a terminal. A model emits bytes, not text: a byte-level model
//! early in training emits NUL, ESC and broken UTF-8, and any model may split a character
//! across tokens. Everything `generate` and the training sample print goes through here.
//!
//! The convention, [`printable`]'s output, is valid UTF-8 with no raw control character
//! other than newline and tab:
//!
//! * valid UTF-8 is kept as it is, `'\n'` and `'\t'` included;
//! * the other C0 controls (NUL included) and DEL become `\x00`..`\x1f` and `\x7f`;
//! * C1 controls (U+0080..U+009F, valid UTF-8 but read by terminals as commands) become
//!   `\u{80}`..`\u{9f}`, so they are not mistaken for the invalid bytes below;
//! * bytes that are not valid UTF-8 become `\x80`..`\xff`, one escape per byte (an invalid
//!   byte is never ASCII, so these never clash with the C0 escapes), rather than U+FFFD:
//!   nothing is lost;
//! * a literal backslash becomes `\\`, so every escape above is unambiguous and the output
//!   can be turned back into the exact bytes.
//!
//! Hex digits are lowercase. Other Unicode (letters, emoji, U+FFFD itself) passes through.

use std::fmt::Write;

use crate::tokenizer::Tokenizer;

/// `bytes` as printable text (see the module documentation for the escapes). A character cut
/// off at the end is escaped byte by byte: use [`TextStream`] for text that arrives in pieces.
pub fn printable(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    escape_bytes(bytes, false, &mut out);
    out
}

/// Appends `s` to `out`, escaping control characters and backslashes.
fn escape_str(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            '\\' => out.push_str("\\\\"),
            '\0'..='\x1f' | '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            '\u{80}'..='\u{9f}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            _ => out.push(c),
        }
    }
}

/// Appends `bytes` to `out`, escaped. With `hold`, a sequence at the very end that could
/// still become a character (a valid prefix of one, at most 3 bytes) is not written; returns
/// its length (0 without `hold`).
fn escape_bytes(mut bytes: &[u8], hold: bool, out: &mut String) -> usize {
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                escape_str(s, out);
                return 0;
            }
            Err(e) => {
                let (valid, rest) = bytes.split_at(e.valid_up_to());
                escape_str(std::str::from_utf8(valid).expect("checked by from_utf8"), out);
                let bad = match e.error_len() {
                    Some(n) => n,
                    // Incomplete at the end: wait for more, or escape it when there is no more.
                    None if hold => return rest.len(),
                    None => rest.len(),
                };
                for b in &rest[..bad] {
                    let _ = write!(out, "\\x{b:02x}");
                }
                bytes = &rest[bad..];
            }
        }
    }
}

/// Streams tokens to printable text: each [`TextStream::push`] returns the text completed so
/// far, holding back the start of a UTF-8 character until its last byte arrives (or a byte
/// that cannot continue it, when the held bytes are written escaped). Concatenating every
/// `push` and the final [`TextStream::finish`] gives exactly [`printable`] of all the bytes.
#[derive(Debug)]
pub struct TextStream {
    tok: Tokenizer,
    /// An incomplete character: at most 3 bytes.
    held: Vec<u8>,
}

impl TextStream {
    pub fn new(tok: &Tokenizer) -> TextStream {
        TextStream {
            tok: tok.clone(),
            held: Vec::with_capacity(4),
        }
    }

    /// Adds one token (see [`Tokenizer::token_bytes`] for ids outside the vocabulary).
    pub fn push(&mut self, id: u32) -> String {
        let bytes = self.tok.token_bytes(id);
        self.push_bytes(&bytes)
    }

    /// Adds raw bytes.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        let mut out = String::with_capacity(self.held.len());
        let kept = escape_bytes(&self.held, true, &mut out);
        self.held.drain(..self.held.len() - kept);
        out
    }

    /// The end of the stream: what is still held, escaped byte by byte.
    pub fn finish(&mut self) -> String {
        let out = printable(&self.held);
        self.held.clear();
        out
    }
}

/// Printable text as it streams, watched for a stop string (`generate --stop`): each
/// [`StopText::push`] returns what can be printed, holding back an end that could be the
/// start of the stop string, and says when the string has appeared (it is not printed, nor
/// anything after it).
#[derive(Debug)]
pub struct StopText {
    stop: String,
    held: String,
}

impl StopText {
    /// `stop` must not be empty.
    pub fn new(stop: &str) -> StopText {
        assert!(!stop.is_empty(), "an empty stop string matches everywhere");
        StopText {
            stop: stop.to_string(),
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to print and whether the stop string appeared.
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self.held.find(&self.stop) {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest end of the text that begins the stop string.
        let keep = (1..self.stop.len())
            .rev()
            .filter(|&k| self.stop.is_char_boundary(k))
            .find(|&k| self.held.ends_with(&self.stop[..k]))
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// The end of the stream: whatever was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_text_holds_back_a_possible_start_and_cuts_at_the_string() {
        let mut st = StopText::new("END");
        assert_eq!(st.push("abc E"), ("abc ".to_string(), false));
        assert_eq!(st.push("N"), (String::new(), false));
        assert_eq!(st.push("x"), ("ENx".to_string(), false));
        assert_eq!(st.push("yEN"), ("y".to_string(), false));
        assert_eq!(st.push("Dzz"), (String::new(), true));
        let mut st = StopText::new("é!");
        assert_eq!(st.push("café"), ("caf".to_string(), false));
        assert_eq!(st.finish(), "é");
    }
    use crate::tokenizer::TokenizerKind;

    fn byte_stream() -> TextStream {
        TextStream::new(&Tokenizer::new(TokenizerKind::Byte).unwrap())
    }

    /// Streams `bytes` cut at `cuts` (increasing offsets); returns each piece's output.
    fn stream_pieces(bytes: &[u8], cuts: &[usize]) -> Vec<String> {
        let mut s = byte_stream();
        let mut pieces = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain([&bytes.len()]) {
            pieces.push(s.push_bytes(&bytes[at..cut]));
            at = cut;
        }
        pieces.push(s.finish());
        pieces
    }

    /// Every way to cut `bytes` into non-empty pieces (as sets of cut offsets).
    fn all_cuts(len: usize) -> Vec<Vec<usize>> {
        (0u32..1 << (len - 1))
            .map(|mask| (1..len).filter(|i| mask & (1 << (i - 1)) != 0).collect())
            .collect()
    }

    #[test]
    fn controls_are_escaped_and_newline_and_tab_kept() {
        assert_eq!(printable(b"a\0b"), "a\\x00b");
        assert_eq!(printable(b"\x1b[31mred"), "\\x1b[31mred");
        assert_eq!(printable(b"\x7f\x01\x1f\r"), "\\x7f\\x01\\x1f\\x0d");
        assert_eq!(printable(b"line\n\tindented\n"), "line\n\tindented\n");
        // C1 controls are valid UTF-8 (two bytes each) but still escaped, as characters.
        assert_eq!(printable("\u{80}x\u{9b}\u{9f}".as_bytes()), "\\u{80}x\\u{9b}\\u{9f}");
        assert_eq!(printable("\u{a0}é".as_bytes()), "\u{a0}é", "U+00A0 is not a control");
        assert_eq!(printable(br"C:\dir\x00"), r"C:\\dir\\x00", "backslashes doubled");
        for b in 0u8..=0x7f {
            let out = printable(&[b]);
            assert!(
                out.chars().all(|c| !c.is_control() || c == '\n' || c == '\t'),
                "{b:#x}: {out:?}"
            );
        }
    }

    #[test]
    fn invalid_bytes_are_escaped_not_replaced() {
        assert_eq!(printable(b"a\xffb"), "a\\xffb");
        assert_eq!(printable(b"\x80"), "\\x80", "a lone continuation byte");
        assert_eq!(printable(b"\xc3("), "\\xc3(", "a lead byte followed by ASCII");
        assert_eq!(printable(b"\xe2\x82"), "\\xe2\\x82", "cut off at the end");
        assert_eq!(printable(b"\xed\xa0\x80"), "\\xed\\xa0\\x80", "a UTF-16 surrogate");
        assert_eq!(printable(b"\xc0\xaf"), "\\xc0\\xaf", "an overlong '/'");
        assert_eq!(printable(b"\xf0\x9f\x98"), "\\xf0\\x9f\\x98");
        assert_eq!(printable(b"\xe2\x82\xac\xe2"), "€\\xe2");
    }

    #[test]
    fn characters_split_across_tokens_come_out_whole_once() {
        for text in ["é", "😀", "a😀b", "€é", "x\u{9b}y"] {
            let bytes = text.as_bytes();
            let whole = printable(bytes);
            for cuts in all_cuts(bytes.len()) {
                let pieces = stream_pieces(bytes, &cuts);
                assert_eq!(pieces.concat(), whole, "{text:?} cut at {cuts:?}: {pieces:?}");
                assert_eq!(pieces.last().unwrap(), "", "nothing left for finish");
            }
        }
        // Held back exactly until the last byte.
        let mut s = byte_stream();
        let emoji = "😀".as_bytes();
        for &b in &emoji[..3] {
            assert_eq!(s.push(b as u32), "");
        }
        assert_eq!(s.push(emoji[3] as u32), "😀");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn held_bytes_are_escaped_when_proven_invalid_or_at_the_end() {
        let mut s = byte_stream();
        assert_eq!(s.push(0xe2), "");
        assert_eq!(s.push(0x82), "");
        assert_eq!(s.push(b'A' as u32), "\\xe2\\x82A");
        assert_eq!(s.push(0xf0), "");
        assert_eq!(s.push(0xf0), "\\xf0", "a second lead byte ends the first sequence");
        assert_eq!(s.finish(), "\\xf0");
        assert_eq!(s.finish(), "");
        // Streamed output equals the one-shot conversion for arbitrary byte soup.
        let soup: Vec<u8> = (0..2000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut s = byte_stream();
        let streamed: String = soup.iter().map(|&b| s.push(b as u32)).collect::<String>() + &s.finish();
        assert_eq!(streamed, printable(&soup));
    }

    #[test]
    fn ids_outside_the_vocabulary_are_visible() {
        let mut s = byte_stream();
        assert_eq!(s.push(300), "\u{FFFD}");
        let mut g = TextStream::new(&Tokenizer::new(TokenizerKind::Gpt2).unwrap());
        assert_eq!(g.push(60_000), "\u{FFFD}");
    }

    #[test]
    fn gpt2_round_trip_of_ordinary_text_is_unchanged() {
        let tok = Tokenizer::new(TokenizerKind::Gpt2).unwrap();
        let text = "Hello world!\n\tThe café's naïve résumé costs 5 € — 😀 ok.<|endoftext|>Next";
        let ids = tok.encode(text).unwrap();
        let mut s = TextStream::new(&tok);
        let streamed: String = ids.iter().map(|&id| s.push(id)).collect::<String>() + &s.finish();
        assert_eq!(streamed, text);
        assert_eq!(printable(&tok.bytes(&ids)), text);
        assert_eq!(tok.decode(&ids), text);
        // GPT-2 splits the emoji's four bytes over several tokens.
        let emoji = tok.encode("😀").unwrap();
        assert!(emoji.len() > 1, "{emoji:?}");
        let mut s = TextStream::new(&tok);
        let pieces: Vec<String> = emoji.iter().map(|&id| s.push(id)).collect();
        assert_eq!(pieces.concat(), "😀");
        assert_eq!(pieces.iter().filter(|p| !p.is_empty()).count(), 1);
    }
}

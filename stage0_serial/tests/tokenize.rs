//! `tokenize --output-dir`: documents into llm.c shards that `train --data DIR` reads, the
//! same bytes for any thread count, `<|endoftext|>` before each document, shards of the size
//! asked for.

mod support;

use std::path::{Path, PathBuf};

use common::tokenizer::{Tokenizer, TokenizerKind};
use support::{run, run_ok, tmpdir};

const END_OF_TEXT: u32 = 50256;

/// Eight documents of different lengths in `dir/docs` (two in a subdirectory), and their
/// texts in the order `tokenize` takes them (sorted by path).
fn documents(dir: &Path) -> (PathBuf, Vec<String>) {
    let docs = dir.join("docs");
    std::fs::create_dir_all(docs.join("more")).unwrap();
    let mut made = Vec::new();
    for i in 0..8 {
        let name = match i {
            0 | 1 => format!("more/{i}.txt"),
            _ => format!("doc{i}.txt"),
        };
        let text = format!("Document {i}: to be, or not to be, that is the question.\n").repeat(5 + 7 * i);
        std::fs::write(docs.join(&name), &text).unwrap();
        made.push((name, text));
    }
    made.sort();
    (docs, made.into_iter().map(|(_, t)| t).collect())
}

/// The shards in `dir` with their tokens, in the corpus's order: the validation shard, then
/// the training shards by name.
fn shards(dir: &Path) -> Vec<(String, Vec<u32>)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_by_key(|n| (!n.contains("_val_"), n.clone()));
    names
        .into_iter()
        .map(|n| {
            let tokens = common::data::read_bin(&dir.join(&n), 50257).unwrap();
            (n, tokens)
        })
        .collect()
}

/// `tokenize --input DOCS --output-dir OUT EXTRA...`.
fn tokenize_args<'a>(docs: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let dirs = [
        "tokenize",
        "--input",
        docs.to_str().unwrap(),
        "--output-dir",
        out.to_str().unwrap(),
    ];
    [&dirs[..], extra].concat()
}

/// [`tokenize_args`] run, which must succeed; its summary line.
fn tokenize(docs: &Path, out: &Path, extra: &[&str]) -> String {
    run_ok(&tokenize_args(docs, out, extra))
}

#[test]
fn shards_hold_each_document_after_end_of_text_in_shards_of_the_size_asked() {
    let d = tmpdir("layout");
    let (docs, texts) = documents(&d);
    let out = d.join("corpus");
    let summary = tokenize(&docs, &out, &["--shard-tokens", "200", "--val-tokens", "150"]);
    let got = shards(&out);
    // The whole corpus, as the tokenizer encodes each document after <|endoftext|>.
    let tok = Tokenizer::new(TokenizerKind::Gpt2).unwrap();
    let per_doc: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| [vec![END_OF_TEXT], tok.encode(t).unwrap()].concat())
        .collect();
    let all: Vec<u32> = per_doc.concat();
    assert_eq!(got.iter().flat_map(|(_, t)| t.clone()).collect::<Vec<_>>(), all);
    assert_eq!(all.iter().filter(|&&t| t == END_OF_TEXT).count(), texts.len());
    // Validation: whole documents from the first until at least 150 tokens.
    let mut val_docs = 0;
    let mut val_len = 0;
    while val_len < 150 {
        val_len += per_doc[val_docs].len();
        val_docs += 1;
    }
    let (val_name, val) = &got[0];
    assert_eq!(val_name, "corpus_val_000000.bin");
    assert_eq!(val.len(), val_len);
    assert_eq!(val, &per_doc[..val_docs].concat());
    // Training: 200 tokens a shard, numbered from 1, the last holding the rest.
    let train_len = all.len() - val_len;
    let n_train = train_len.div_ceil(200);
    assert_eq!(got.len(), 1 + n_train);
    for (i, (name, tokens)) in got[1..].iter().enumerate() {
        assert_eq!(name, &format!("corpus_train_{:06}.bin", i + 1));
        let want = if i + 1 < n_train {
            200
        } else {
            train_len - 200 * (n_train - 1)
        };
        assert_eq!(tokens.len(), want, "{name}");
    }
    assert_eq!(got[1].1[0], END_OF_TEXT, "a training shard starts with a document");
    // The summary: documents, tokens, shards, seconds, tokens/s.
    let line = summary.trim();
    assert!(
        line.starts_with(&format!(
            "8 documents, {} tokens (gpt2; {val_len} validation), {} shards in ",
            all.len(),
            got.len()
        )),
        "{line}"
    );
    assert!(line.ends_with(" tokens/s"), "{line}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_shards_are_the_same_on_one_thread_and_two() {
    let d = tmpdir("threads");
    let (docs, _) = documents(&d);
    let flags = ["--shard-tokens", "300", "--val-tokens", "100", "--prefix", "p"];
    tokenize(&docs, &d.join("one"), &[&flags[..], &["--threads", "1"]].concat());
    tokenize(&docs, &d.join("two"), &[&flags[..], &["--threads", "2"]].concat());
    let (one, two) = (shards(&d.join("one")), shards(&d.join("two")));
    assert!(one.len() > 2);
    assert_eq!(one, two);
    // A pattern naming the same files gives the same shards.
    let pattern = format!("{}/**/*.txt", docs.display());
    let args = ["tokenize", "--input", &pattern, "--output-dir"];
    let out = d.join("glob");
    run_ok(&[&args[..], &[out.to_str().unwrap()], &flags[..]].concat());
    assert_eq!(shards(&out), one);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn train_reads_the_shards_of_a_directory() {
    let d = tmpdir("train");
    let (docs, _) = documents(&d);
    let out = d.join("corpus");
    tokenize(&docs, &out, &["--shard-tokens", "400", "--val-tokens", "120"]);
    let run_dir = d.join("run");
    let line = run_ok(&[
        "train",
        "--data",
        out.to_str().unwrap(),
        "--out",
        run_dir.to_str().unwrap(),
        "--tokenizer",
        "gpt2",
        "--model",
        "tiny",
        "--batch",
        "4",
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--eval-batches",
        "1",
        "--sample-len",
        "0",
        "--threads",
        "2",
    ]);
    assert!(!line.is_empty());
    let table = std::fs::read_to_string(run_dir.join("loss.tsv")).unwrap();
    assert!(table.lines().count() >= 2, "{table}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_bad_document_part_way_leaves_no_shard() {
    let d = tmpdir("bad");
    let (docs, _) = documents(&d);
    std::fs::write(docs.join("zz.txt"), b"fine until \xff").unwrap();
    let out = d.join("corpus");
    let o = run(&tokenize_args(
        &docs,
        &out,
        &["--shard-tokens", "100", "--val-tokens", "50"],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.trim()
            .ends_with("zz.txt: not UTF-8 text (invalid byte at offset 11)"),
        "{err}"
    );
    assert!(!out.exists(), "the shards written before the bad document are removed");
    let _ = std::fs::remove_dir_all(&d);
}

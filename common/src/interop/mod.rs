//! GPT-2 weights in Hugging Face's format, out and in. An export directory holds
//! `model.safetensors` (every tensor under `GPT2LMHeadModel`'s name, shape and layout, f32:
//! [`hf`]), `config.json` ([`config`]) and the tokenizer files (`vocab.json`, `merges.txt`,
//! `tokenizer_config.json`: [`vocab`]), so that `GPT2LMHeadModel.from_pretrained(DIR)` and
//! `AutoTokenizer.from_pretrained(DIR)` load it. [`import`] reads such a directory (ours, or
//! Hugging Face's own GPT-2 checkpoints: f32, f16 or bf16) into parameters a checkpoint holds
//! ([`import_checkpoint`]: as a checkpoint at step 0, for `--init-from` and `generate`).
//!
//! Files from outside are checked before anything is sized from them: the safetensors header
//! must fit the file and the crate checks every offset against it, each tensor's shape must be
//! the one `config.json`'s model needs (so no allocation is larger than the file justifies),
//! every tensor must be there and no other, and every value finite. Each failure is one
//! [`Error::Input`] line naming the file.

pub mod config;
pub mod hf;
pub mod vocab;

use crate::atomic_file;
use crate::checkpoint::{Checkpoint, CheckpointMeta};
use crate::error::{io_err, Error, Result};
use crate::model::{ModelConfig, ParamLayout};
use crate::tokenizer::{Tokenizer, TokenizerKind};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;

pub const WEIGHTS: &str = "model.safetensors";
pub const CONFIG: &str = "config.json";
const VOCAB: &str = "vocab.json";
const MERGES: &str = "merges.txt";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// The files [`export`] writes into its directory.
pub const EXPORTED: [&str; 5] = [WEIGHTS, VOCAB, MERGES, TOKENIZER_CONFIG, CONFIG];
/// The files [`import`] reads from its directory.
pub const IMPORTED: [&str; 2] = [CONFIG, WEIGHTS];
/// Largest `config.json` read (a real one is about 1 KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A model read from a Hugging Face directory.
pub struct Imported {
    pub config: ModelConfig,
    pub tokenizer: TokenizerKind,
    /// In our flat layout ([`ParamLayout`]); the vocabulary's padding rows are 0.
    pub params: Vec<f32>,
}

/// Writes `params` (our flat layout for `cfg`) into `dir` (created if missing) as Hugging
/// Face's GPT-2, with `tokenizer`'s files; `config.json` last (see below).
pub fn export(dir: &Path, cfg: &ModelConfig, tokenizer: TokenizerKind, params: &[f32]) -> Result<()> {
    crate::atomic_file::create_dir(dir)?;
    let layout = ParamLayout::new(cfg);
    assert_eq!(params.len(), layout.total, "export: parameters of another model");
    let tensors = hf::tensors(&layout, cfg);
    let values: Vec<Vec<f32>> = tensors.iter().map(|t| t.from_flat(params)).collect();
    let views = tensors
        .iter()
        .zip(&values)
        .map(|(t, v)| {
            let view = TensorView::new(Dtype::F32, t.shape.clone(), bytemuck::cast_slice(v))
                .map_err(|e| Error::Device(format!("{}: {e}", t.name)))?;
            Ok((t.name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    // config.json goes first and comes back last: a directory whose writing was cut short
    // (a kill, a full disk) holds no config.json, which `import` and `generate` refuse in one
    // line, rather than an earlier export's config beside this one's weights.
    atomic_file::remove_if_present(&dir.join(CONFIG))?;
    let weights = dir.join(WEIGHTS);
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    // Serialised in memory (the size of the weights once more), then written as the other
    // files are: a temporary file synced and renamed, never a torn one, none left behind by a
    // kill (the crate's own file writer does not sync and leaves its temporary file).
    let bytes = safetensors::serialize(views, Some(metadata))
        .map_err(|e| Error::Input(format!("{}: cannot write: {e}", weights.display())))?;
    write(&weights, &bytes)?;

    let pretty = |v: &serde_json::Value| serde_json::to_vec_pretty(v).expect("plain data serialises");
    let tok = Tokenizer::new(tokenizer)?;
    let (vocab, merges) = vocab::files(&tok);
    write(
        &dir.join(VOCAB),
        &serde_json::to_vec(&vocab).expect("plain data serialises"),
    )?;
    write(&dir.join(MERGES), merges.as_bytes())?;
    let eot = tok.end_of_text().map(|_| "<|endoftext|>");
    let tokenizer_config = serde_json::json!({
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": cfg.max_seq_len,
        "add_prefix_space": false,
        "bos_token": eot, "eos_token": eot, "unk_token": eot,
    });
    write(&dir.join(TOKENIZER_CONFIG), &pretty(&tokenizer_config))?;
    write(&dir.join(CONFIG), &pretty(&config::to_json(cfg, tokenizer)))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic_file::write(path, |f| f.write_all(bytes))
}

/// The key of an imported checkpoint's settings that names the directory it came from: such
/// a checkpoint is no run to `--resume`, only weights to start from (`--init-from`).
pub const IMPORTED_FROM: &str = "imported_from";

/// Whether a checkpoint was made by [`import_checkpoint`] (not by a training run).
pub fn is_imported(meta: &CheckpointMeta) -> bool {
    meta.train.get(IMPORTED_FROM).is_some()
}

/// A Hugging Face GPT-2 directory (what `export` writes) as a checkpoint at step 0, without
/// optimizer state (`m` and `v` empty).
pub fn import_checkpoint(dir: &Path) -> Result<Checkpoint> {
    let model = import(dir)?;
    let meta = CheckpointMeta {
        config: model.config,
        tokenizer: model.tokenizer.name().to_string(),
        step: 0,
        data_epoch: 0,
        data_step_in_epoch: 0,
        data_order: None,
        seed: 0,
        train: serde_json::json!({ IMPORTED_FROM: dir.display().to_string() }),
        progress: serde_json::json!({}),
        data: None,
        fp8: None,
    };
    Ok(Checkpoint {
        meta,
        params: model.params,
        m: Vec::new(),
        v: Vec::new(),
    })
}

/// Reads a Hugging Face GPT-2 directory (`config.json` and `model.safetensors`). The
/// tokenizer follows from the vocabulary: 50257 is GPT-2's BPE, 256 bytes.
pub fn import(dir: &Path) -> Result<Imported> {
    let config_path = dir.join(CONFIG);
    if dir.is_dir() && !config_path.exists() {
        crate::bail_input!(
            "{}: no {CONFIG}: not a Hugging Face model directory, or an export cut short (export it again)",
            dir.display()
        );
    }
    let json = read_at_most(&config_path, MAX_CONFIG_BYTES)?;
    let cfg = config::from_json(&json).map_err(|e| Error::Input(format!("{}: {e}", dir.display())))?;
    let tokenizer = match cfg.vocab_size {
        256 => TokenizerKind::Byte,
        crate::tokenizer::GPT2_VOCAB => TokenizerKind::Gpt2,
        v => crate::bail_input!(
            "{}: a vocabulary of {v}: this build's tokenizers have 256 (byte) or 50257 (gpt2) tokens",
            config_path.display()
        ),
    };
    let path = dir.join(WEIGHTS);
    let shown = path.display();
    let bytes = read_safetensors(&path)?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::Input(format!("{shown}: not a valid safetensors file: {e}")))?;
    // The layout's size follows config.json's n_layer: the file must list that many tensors
    // first, so that a lying config costs no more memory than the file holds.
    let needed = crate::checkpoint::tensor_count(&cfg);
    if file.len() < needed {
        crate::bail_input!(
            "{shown}: config.json's model ({} blocks) has {needed} tensors, but the file holds {}",
            cfg.n_layer,
            file.len()
        );
    }
    let layout = ParamLayout::new(&cfg);
    let tensors = hf::tensors(&layout, &cfg);
    // Every name in the file must be one of ours (with or without the prefix), or the tied
    // LM head, or one of the attention mask buffers older exports carry.
    let mut found: Vec<Option<TensorView>> = (0..tensors.len()).map(|_| None).collect();
    let by_name: HashMap<&str, usize> = tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let mut lm_head = None;
    for (name, view) in file.iter() {
        let full = match name.starts_with(hf::PREFIX) || name == hf::LM_HEAD {
            true => name.to_string(),
            false => format!("{}{name}", hf::PREFIX),
        };
        if let Some(&i) = by_name.get(full.as_str()) {
            found[i] = Some(view);
        } else if name == hf::LM_HEAD {
            lm_head = Some(view);
        } else if !(name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) {
            crate::bail_input!(
                "{shown}: unexpected tensor \"{}\": not one of GPT-2's for config.json's model ({} blocks)",
                name.escape_debug(),
                cfg.n_layer
            );
        }
    }
    let missing: Vec<&str> = (0..tensors.len())
        .filter(|&i| found[i].is_none())
        .map(|i| tensors[i].name.as_str())
        .collect();
    if let Some(first) = missing.first() {
        crate::bail_input!(
            "{shown}: {} tensor(s) that config.json's model needs are missing, the first {first}",
            missing.len()
        );
    }
    // Shapes first: then every tensor's size is justified by the file's own bytes.
    for (t, view) in tensors.iter().zip(&found) {
        check_shape(&shown, &t.name, view.as_ref().expect("checked above"), &t.shape)?;
    }
    let mut params = vec![0.0f32; layout.total];
    for (t, view) in tensors.iter().zip(found) {
        let values = to_f32(&shown, &t.name, &view.expect("checked above"))?;
        t.to_flat(&values, &mut params);
    }
    if let Some(head) = lm_head {
        let wte = &tensors[0];
        check_shape(&shown, hf::LM_HEAD, &head, &wte.shape)?;
        if to_f32(&shown, hf::LM_HEAD, &head)? != wte.from_flat(&params) {
            crate::bail_input!(
                "{shown}: {} differs from {}: GPT-2 ties its output embedding to the input one, and this build runs only that",
                hf::LM_HEAD,
                wte.name
            );
        }
    }
    Ok(Imported {
        config: cfg,
        tokenizer,
        params,
    })
}

/// The whole of `path`, refused when longer than `max` bytes.
fn read_at_most(path: &Path, max: u64) -> Result<Vec<u8>> {
    crate::input::refuse_special(path, "a config.json file")?;
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len > max {
        crate::bail_input!(
            "{}: {len} bytes, more than the {max} such a file can need",
            path.display()
        );
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max).read_to_end(&mut bytes).map_err(io_err(path))?;
    Ok(bytes)
}

/// A safetensors file, read whole once its header length is known to fit it.
fn read_safetensors(path: &Path) -> Result<Vec<u8>> {
    crate::input::refuse_special(path, "a safetensors file")?;
    let mut file = std::fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    let mut head = [0u8; 8];
    if len < 8 {
        crate::bail_input!("{}: {len} bytes: too short for a safetensors file", path.display());
    }
    file.read_exact(&mut head).map_err(io_err(path))?;
    let header = u64::from_le_bytes(head);
    if header > len - 8 {
        crate::bail_input!(
            "{}: the header claims {header} bytes but only {} follow: not a safetensors file, or a truncated one",
            path.display(),
            len - 8
        );
    }
    let mut bytes = Vec::with_capacity(len as usize);
    bytes.extend_from_slice(&head);
    file.take(len - 8).read_to_end(&mut bytes).map_err(io_err(path))?;
    Ok(bytes)
}

fn check_shape(file: &impl std::fmt::Display, name: &str, view: &TensorView, want: &[usize]) -> Result<()> {
    if view.shape() != want {
        crate::bail_input!(
            "{file}: {name} has shape {:?} but config.json's model needs {want:?}",
            view.shape()
        );
    }
    Ok(())
}

/// A tensor's values as f32 (from f32, f16 or bf16), all finite.
fn to_f32(file: &impl std::fmt::Display, name: &str, view: &TensorView) -> Result<Vec<f32>> {
    let data = view.data();
    let halves = |f: fn([u8; 2]) -> f32| data.chunks_exact(2).map(|b| f([b[0], b[1]])).collect::<Vec<f32>>();
    let values = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => halves(|b| half::f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => halves(|b| half::bf16::from_le_bytes(b).to_f32()),
        other => crate::bail_input!("{file}: {name} holds {other:?} values; this build reads F32, F16 and BF16"),
    };
    if let Some(i) = values.iter().position(|x: &f32| !x.is_finite()) {
        crate::bail_input!("{file}: {name}[{i}] = {}: refusing a diverged model", values[i]);
    }
    Ok(values)
}

//! `config.json`: Hugging Face's `GPT2Config`, written with every field that fixes how the
//! weights are read, and read back checking that a file describes a model this build runs
//! (GPT-2's architecture: tanh GELU, layernorm epsilon 1e-5, MLP of 4× the width, tied
//! embeddings).

use crate::error::{Error, Result};
use crate::model::{round_up, ModelConfig};
use crate::tokenizer::TokenizerKind;
use serde::Deserialize;
use serde_json::json;

/// Layernorm's epsilon in every backend.
const LAYER_NORM_EPS: f64 = 1e-5;
/// GPT-2's GELU (the tanh approximation), under its two HF names.
const GELU_TANH: [&str; 2] = ["gelu_new", "gelu_pytorch_tanh"];

/// `config.json` for `cfg` (vocabulary unpadded) and its tokenizer.
pub fn to_json(cfg: &ModelConfig, tokenizer: TokenizerKind) -> serde_json::Value {
    // Token ids GPT-2's `<|endoftext|>` has; a byte vocabulary has no such token.
    let eot = match tokenizer {
        TokenizerKind::Gpt2 => json!(50256),
        TokenizerKind::Byte => serde_json::Value::Null,
    };
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len,
        "n_ctx": cfg.max_seq_len,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": null,
        "activation_function": GELU_TANH[0],
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "tie_word_embeddings": true,
        "use_cache": true,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "torch_dtype": "float32",
    })
}

/// The fields read back; the others are HF's defaults or do not change the weights.
#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    n_positions: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_inner: Option<usize>,
    activation_function: Option<String>,
    layer_norm_epsilon: Option<f64>,
    tie_word_embeddings: Option<bool>,
    scale_attn_weights: Option<bool>,
    scale_attn_by_inverse_layer_idx: Option<bool>,
}

/// The model `json` (the text of `config.json`) describes, or why this build cannot run it.
pub fn from_json(json: &[u8]) -> Result<ModelConfig> {
    let hf: HfConfig =
        serde_json::from_slice(json).map_err(|e| Error::Input(format!("config.json is not a GPT-2 config: {e}")))?;
    let refuse = |what: String| {
        Err(Error::Input(format!(
            "config.json: {what}: this build runs GPT-2's architecture only"
        )))
    };
    if let Some(t) = hf.model_type.as_deref().filter(|&t| t != "gpt2") {
        return refuse(format!("model_type is \"{}\", not \"gpt2\"", t.escape_debug()));
    }
    if let Some(f) = hf.activation_function.as_deref().filter(|f| !GELU_TANH.contains(f)) {
        return refuse(format!("activation_function is \"{}\", not gelu_new", f.escape_debug()));
    }
    if let Some(eps) = hf.layer_norm_epsilon.filter(|&e| (e - LAYER_NORM_EPS).abs() > 1e-12) {
        return refuse(format!("layer_norm_epsilon is {eps}, not 1e-5"));
    }
    if let Some(inner) = hf.n_inner.filter(|&i| Some(i) != hf.n_embd.checked_mul(4)) {
        return refuse(format!("n_inner is {inner}, not 4 × n_embd"));
    }
    if hf.tie_word_embeddings == Some(false) {
        return refuse("tie_word_embeddings is false".into());
    }
    if hf.scale_attn_weights == Some(false) || hf.scale_attn_by_inverse_layer_idx == Some(true) {
        return refuse("the attention is scaled otherwise than by 1/√head size".into());
    }
    if hf.vocab_size == 0 || hf.vocab_size > 1 << 24 {
        return Err(Error::Input(format!(
            "config.json: vocab_size {} must be between 1 and 2^24",
            hf.vocab_size
        )));
    }
    let cfg = ModelConfig {
        vocab_size: hf.vocab_size,
        padded_vocab_size: round_up(hf.vocab_size, 128),
        n_layer: hf.n_layer,
        n_head: hf.n_head,
        n_embd: hf.n_embd,
        max_seq_len: hf.n_positions,
    };
    cfg.validate().map_err(|e| Error::Input(format!("config.json: {e}")))?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ConfigOverrides;

    #[test]
    fn round_trips_and_refuses_other_architectures() {
        let cfg = ModelConfig::from_preset("char", 256, ConfigOverrides::default()).unwrap();
        let json = to_json(&cfg, TokenizerKind::Byte);
        assert_eq!(from_json(json.to_string().as_bytes()).unwrap(), cfg);
        for (field, value, needle) in [
            ("activation_function", json!("relu"), "relu"),
            ("n_inner", json!(100), "n_inner"),
            ("tie_word_embeddings", json!(false), "tie_word_embeddings"),
            ("n_head", json!(3), "--heads 3"),
            ("n_layer", json!(1u64 << 40), "too large"),
            ("vocab_size", json!(0), "vocab_size"),
        ] {
            let mut bad = json.clone();
            bad[field] = value;
            let e = from_json(bad.to_string().as_bytes()).unwrap_err().to_string();
            assert!(e.contains(needle), "{field}: {e}");
        }
    }
}

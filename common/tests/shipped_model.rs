//! The trained model that ships in data/shakespeare-char (made by data/make-char-model.sh), so
//! that `generate` works straight after the build: it is small, it loads, and it has learnt the
//! corpus (its loss on the held-out end of Tiny Shakespeare is far below chance).

use common::autograd::{Graph, Pool};
use common::backend::cpu::CpuBackend;
use common::model::{ConfigOverrides, Gpt2, ModelConfig};
use common::tokenizer::TokenizerKind;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_shipped_model_is_small_and_has_learnt_shakespeare() {
    let dir = root().join(common::cli::SHIPPED_MODEL);
    let weights = std::fs::metadata(dir.join("model.safetensors")).unwrap().len();
    assert!(weights < 4 << 20, "a few MB: {weights} bytes");

    let model = common::interop::import(&dir).unwrap();
    assert_eq!(model.tokenizer, TokenizerKind::Byte);
    let char_preset = ModelConfig::from_preset("char", 256, ConfigOverrides::default()).unwrap();
    assert_eq!(model.config, char_preset);

    // The mean loss over 8 windows of the last tenth of the corpus (never trained on: train
    // holds out the last 10% for validation), against ln 256 = 5.55 for a model that knows
    // nothing; the training run ended near 1.6.
    let text = std::fs::read(root().join("data/tinyshakespeare.txt")).unwrap();
    let t = model.config.max_seq_len;
    let (b, start) = (8, text.len() - 8 * (t + 1));
    let window = |i: usize| &text[start + i * (t + 1)..][..t + 1];
    let inputs: Vec<i32> = (0..b).flat_map(|i| window(i)[..t].iter().map(|&x| x as i32)).collect();
    let targets: Vec<i32> = (0..b).flat_map(|i| window(i)[1..].iter().map(|&x| x as i32)).collect();
    let be = CpuBackend::new(2).unwrap();
    let gpt = Gpt2::new(&be, model.config).unwrap();
    gpt.set_params(&be, &model.params).unwrap();
    let mut pool = Pool::default();
    let mut g = Graph::new(&be, &mut pool, false);
    let fwd = gpt.forward(&mut g, &inputs, Some(&targets), b, t, false).unwrap();
    let mut loss = [0.0f32];
    g.read(fwd.loss.unwrap(), &mut loss).unwrap();
    assert!(loss[0] < 2.0, "held-out loss {}", loss[0]);
}

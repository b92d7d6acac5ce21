//! The GPT-2 model: configuration, the flat parameter layout, and the forward pass
//! written as a sequence of autograd ops.

mod config;
mod params;

pub use config::{round_up, ConfigOverrides, ModelConfig, PRESETS};
pub use params::{LayerParams, ParamLayout};
mod gpt2;
pub use gpt2::{Forward, Gpt2};

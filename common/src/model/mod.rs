//! The GPT-2 model: configuration, the parameter table and its flat layout, and the
//! forward pass written as a sequence of autograd ops.

mod config;
pub mod fp8;
mod gpt2;
pub mod params;

pub use config::{round_up, ConfigOverrides, ModelConfig, PRESETS};
pub use fp8::{Fp8Site, Fp8State};
/// The seeded uniform samples GPT-2's initialisation draws from (the MLP's too).
pub(crate) use gpt2::uniform;
pub use gpt2::{Forward, Gpt2};
pub use params::{Param, ParamLayout};

//! The command line shared by all four stages (clap): `train`, `generate`, `tokenize`, `bench`.

/// Arithmetic precision of the GPU backend's matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum Precision {
    /// Strict IEEE fp32 everywhere.
    Fp32,
    /// fp32 storage, TF32 tensor-core matrix products.
    Tf32,
}

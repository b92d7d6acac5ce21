//! CUDA backend: placeholder until written.

//! CPU backend: placeholder until written.

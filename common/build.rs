//! Build script: with the `mpi` feature, compiles the one-line C shim that hands Rust the
//! MPI library's `MPI_IN_PLACE` (a macro whose value differs between MPICH and Open MPI,
//! and which rsmpi does not export). Without the feature it does nothing.

fn main() {
    println!("cargo:rerun-if-changed=src/comm/mpi_shim.c");
    if std::env::var_os("CARGO_FEATURE_MPI").is_none() {
        return;
    }
    let lib = build_probe_mpi::probe()
        .unwrap_or_else(|errs| panic!("feature `mpi`: no MPI library found (install MPICH: `make deps`): {errs:?}"));
    let mut build = cc::Build::new();
    build.file("src/comm/mpi_shim.c");
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for dir in &lib.include_paths {
                build.include(dir);
            }
        }
    }
    build.compile("gpt2rs_mpi_shim");
}

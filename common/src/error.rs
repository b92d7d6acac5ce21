//! One error type for the library. Binaries map [`Error::exit_code`] to the process exit
//! status and print the error on one line: bad input exits 2, everything else 1.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Something the user gave us is wrong: a flag, a file, a checkpoint.
    #[error("{0}")]
    Input(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The hardware or a runtime library refused (no GPU, out of memory, MPI failure).
    #[error("{0}")]
    Device(String),
    /// The run was interrupted (Ctrl-C); state was saved first.
    #[error("interrupted: {0}")]
    Interrupted(String),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) | Error::Io { .. } => 2,
            Error::Device(_) => 1,
            Error::Interrupted(_) => 130,
        }
    }
}

/// `bail_input!("...")`: return an [`Error::Input`] built with `format!`.
#[macro_export]
macro_rules! bail_input {
    ($($arg:tt)*) => { return Err($crate::error::Error::Input(format!($($arg)*))) };
}

/// Attach the path to an I/O error.
pub fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}

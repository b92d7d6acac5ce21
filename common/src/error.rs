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
    /// Training could not go on (e.g. the loss stayed non-finite); the message says why
    /// and where the last good checkpoint is.
    #[error("{0}")]
    Training(String),
    /// The run was interrupted (Ctrl-C); state was saved first.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// An error every rank raised at the same point (rank 0's bad input, broadcast to all;
    /// a configuration mismatch found together): each rank can exit normally, where an
    /// error on one rank alone must abort the job so the others do not wait forever.
    #[error(transparent)]
    OnEveryRank(Box<Error>),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) | Error::Io { .. } => 2,
            Error::Device(_) | Error::Training(_) => 1,
            Error::Interrupted(_) => 130,
            Error::OnEveryRank(e) => e.exit_code(),
        }
    }

    /// Marks an error that every rank raises together (see [`Error::OnEveryRank`]).
    pub fn on_every_rank(self) -> Error {
        match self {
            Error::OnEveryRank(_) => self,
            e => Error::OnEveryRank(Box::new(e)),
        }
    }

    /// The error as a run that has started meets it: an I/O failure then (a full disk, a file
    /// system gone) is the run's failure, exit 1, not bad input (nothing the command line could
    /// have said differently). The message stays the same.
    pub fn during_run(self) -> Error {
        match self {
            Error::Io { path, source } => Error::Training(format!("{}: {source}", path.display())),
            Error::OnEveryRank(inner) => inner.during_run().on_every_rank(),
            e => e,
        }
    }

    pub fn is_on_every_rank(&self) -> bool {
        matches!(self, Error::OnEveryRank(_))
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

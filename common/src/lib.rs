//! `common`: everything the four GPT-2 training stages share. Read bottom-up:
//! `backend` (the hardware boundary), `autograd` (tensors on a tape), `model` (GPT-2),
//! then the training pieces (`tokenizer`, `data`, `optim`, `checkpoint`, `generate`),
//! `comm` (single process, MPI, NCCL) and `grad_sync` (how gradients meet across ranks),
//! `report` (loss log, progress, results tables), `text` (model output made printable), and
//! finally `train`, the one loop for all stages; `bench`, `cli` and `app` sit on top.
//! `interop` writes and reads GPT-2 weights in Hugging Face's format; `input` guards the files
//! commands read (no FIFO or device where a file is needed, text read within a limit, no
//! output over an input).
//! `mnist` is the second workload: an MLP on idx files, trained by the same pieces.

pub mod app;
pub mod atomic_file;
pub mod autograd;
pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod comm;
pub mod data;
pub mod error;
pub mod generate;
pub mod grad_sync;
pub mod input;
pub mod interop;
pub mod mnist;
pub mod model;
pub mod optim;
pub mod report;
pub mod stop;
pub mod text;
pub mod tokenizer;
pub mod train;

pub use error::{Error, Result};

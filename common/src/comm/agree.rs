//! Keeping ranks in step: every rank learns one outcome of a step that may fail on some
//! ranks only, rank 0's data reaches every rank, and every rank runs the same binary with
//! the same configuration. Each ends with the same result on every rank, so no rank is
//! left waiting in a collective for one that quit.

use super::Comm;
use crate::error::{Error, Result};
use xxhash_rust::xxh64::xxh64;

/// Broadcasts a host f32 array from rank 0 (through `broadcast_bytes`), in pieces: the
/// byte copies stay small next to a 500 MB parameter array.
pub fn broadcast_f32(comm: &dyn Comm, v: &mut Vec<f32>) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let mut len = (v.len() as u64).to_le_bytes().to_vec();
    comm.broadcast_bytes(&mut len)?;
    let len = <[u8; 8]>::try_from(len.as_slice())
        .map_err(|_| Error::Device("broadcast from rank 0: a length of unexpected size".into()))?;
    v.resize(u64::from_le_bytes(len) as usize, 0.0);
    for piece in v.chunks_mut(1 << 22) {
        let mut bytes = bytemuck::cast_slice::<f32, u8>(piece).to_vec();
        comm.broadcast_bytes(&mut bytes)?;
        if bytes.len() != piece.len() * 4 {
            return Err(Error::Device(
                "broadcast from rank 0: pieces of unexpected length".into(),
            ));
        }
        bytemuck::cast_slice_mut::<f32, u8>(piece).copy_from_slice(&bytes);
    }
    Ok(())
}

/// Settles a step that each rank ran on its own (parsing its flags, reading a file): if
/// it failed on any rank, every rank returns an error together (its own, or one naming the
/// ranks that failed), so none is left waiting in a collective for a rank that quit.
pub fn agree<T>(comm: &dyn Comm, result: Result<T>) -> Result<T> {
    if comm.size() == 1 {
        return result;
    }
    let mut failed = vec![0.0f32; comm.size()];
    failed[comm.rank()] = result.is_err() as u8 as f32;
    comm.all_reduce_sum_host(&mut failed)?;
    let ranks: Vec<String> = (0..failed.len())
        .filter(|&r| failed[r] > 0.0)
        .map(|r| r.to_string())
        .collect();
    match result {
        Err(e) => Err(e.on_every_rank()),
        Ok(_) if !ranks.is_empty() => {
            Err(Error::Input(format!("rank {} failed (its message says why)", ranks.join(", "))).on_every_rank())
        }
        ok => ok,
    }
}

/// Whether `yes` holds on every rank (a host collective every rank calls): for a choice
/// each rank can only make for itself but all must make alike.
pub fn everywhere(comm: &dyn Comm, yes: bool) -> Result<bool> {
    let mut noes = [if yes { 0.0 } else { 1.0 }];
    comm.all_reduce_sum_host(&mut noes)?;
    Ok(noes[0] == 0.0)
}

/// Rank 0 runs `f`; its result (bytes or an error message) reaches every rank, so a bad
/// input on rank 0 fails all ranks, with rank 0's message (said once: see `app::main`),
/// instead of leaving them waiting.
pub fn from_root(comm: &dyn Comm, f: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    if comm.size() == 1 {
        return f(); // the error as it is
    }
    // The last byte: 0 for bytes, else the error's exit code (bad input 2, anything else 1).
    let mut msg = if comm.is_root() {
        match f() {
            Ok(mut bytes) => {
                bytes.push(0);
                bytes
            }
            Err(e) => {
                let mut m = e.to_string().into_bytes();
                m.push(if e.exit_code() == 2 { 2 } else { 1 });
                m
            }
        }
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(&mut msg)?;
    let text = |msg: Vec<u8>| String::from_utf8_lossy(&msg).into_owned();
    match msg.pop() {
        Some(0) => Ok(msg),
        Some(2) => Err(Error::Input(text(msg)).on_every_rank()),
        _ => Err(Error::Device(text(msg)).on_every_rank()),
    }
}

/// Work rank 0 does alone (`generate`, `tokenize`, `report`, ...): its outcome reaches every
/// rank, so under mpirun a failure ends them together in rank 0's one line, not an abort.
pub fn on_root(comm: &dyn Comm, f: impl FnOnce() -> Result<()>) -> Result<()> {
    from_root(comm, || f().map(|()| Vec::new())).map(drop)
}

/// Every rank must run the same configuration and binary: compare a hash of both
/// (`fingerprint` describes the configuration). Every rank learns the outcome, so a
/// mismatch fails them all together.
pub fn check_same_everywhere(comm: &dyn Comm, fingerprint: &str) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let version = env!("CARGO_PKG_VERSION");
    let config = xxh64(format!("{version} {fingerprint}").as_bytes(), 0);
    let mine = (config ^ binary_hash()).to_le_bytes().to_vec();
    let mut root = mine.clone();
    comm.broadcast_bytes(&mut root)?;
    // Which ranks differ, known to all: the same line on every rank, said once (app::fail).
    let mut differ = vec![0.0f32; comm.size()];
    differ[comm.rank()] = (root != mine) as u8 as f32;
    comm.all_reduce_sum_host(&mut differ)?;
    let ranks: Vec<String> = (0..differ.len())
        .filter(|&r| differ[r] > 0.0)
        .map(|r| r.to_string())
        .collect();
    if ranks.is_empty() {
        return Ok(());
    }
    Err(Error::Input(format!(
        "rank(s) {} of {} run another binary or other flags than rank 0: start the same executable with the same flags on every rank",
        ranks.join(", "),
        comm.size()
    ))
    .on_every_rank())
}

/// Hash of this process's executable file (0 if it cannot be read), so ranks started from
/// different builds are caught even when their version numbers agree.
fn binary_hash() -> u64 {
    std::env::current_exe()
        .and_then(std::fs::read)
        .map_or(0, |bytes| xxh64(&bytes, 0))
}

//! `mpirun -n N comm_check`: the MPI communicator's reduce-scatter and all-gather (ZeRO-1's
//! collectives) on host memory, blocking and started-then-finished, with even, uneven and
//! empty parts, checked exactly against sums worked out here (small multiples of 1/4, which
//! f32 adds without rounding); and the all-gather of bf16 values (the weights' copy under
//! ZeRO-1 in bf16), every bit pattern kept; and the largest of 32-bit words (FP8's amax
//! agreement). Prints one line per rank; exits 1 on a mismatch.
//! Run by stage1_mpi's tests.

use common::backend::{bf16, DevPtr};
use common::comm::mpi::MpiComm;
use common::comm::{even_parts, Comm, Words};
use std::ops::Range;
use std::process::ExitCode;

/// Rank `r`'s value at `i`.
fn value(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 101) as f32 / 4.0
}

fn ptr(v: &mut [f32]) -> DevPtr {
    DevPtr::from_addr(v.as_mut_ptr() as u64)
}

/// One layout of parts: reduce-scatter (blocking or started), then all-gather; `Err` names
/// the first wrong value.
fn check(comm: &MpiComm, parts: &[Range<usize>], started: bool) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.size());
    let n = parts.last().map_or(0, |p| p.end);
    let mut buf: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
    // SAFETY: `buf` holds the n values the parts cover, untouched until the call returns.
    let summed = unsafe {
        if started {
            comm.start_reduce_scatter_sum(ptr(&mut buf), parts, None)
                .and_then(|()| comm.finish_all_reduces(None))
        } else {
            comm.reduce_scatter_sum(ptr(&mut buf), parts)
        }
    };
    summed.map_err(|e| e.to_string())?;
    for i in parts[rank].clone() {
        let want: f32 = (0..world).map(|r| value(r, i)).sum();
        if buf[i] != want {
            return Err(format!("reduce-scatter {parts:?}: [{i}] = {} not {want}", buf[i]));
        }
    }
    // Every rank's part now holds its sum; the rest is overwritten by the gather.
    for (r, part) in parts.iter().enumerate().filter(|&(r, _)| r != rank) {
        buf[part.clone()].fill(-(r as f32) - 1.0);
    }
    // SAFETY: as above.
    unsafe { comm.all_gather(Words::F32(ptr(&mut buf)), parts) }.map_err(|e| e.to_string())?;
    for (i, &got) in buf.iter().enumerate() {
        let want: f32 = (0..world).map(|r| value(r, i)).sum();
        if got != want {
            return Err(format!("all-gather {parts:?}: [{i}] = {got} not {want}"));
        }
    }
    gather_bf16(comm, parts)
}

/// Rank `r`'s bf16 bits at `i`: every 16-bit pattern turns up (NaNs and infinities too), so
/// a gather that went through floats would show.
fn bits(r: usize, i: usize) -> u16 {
    ((i * 40_503 + r * 7_919) % 65_536) as u16
}

/// The all-gather of bf16 values: each rank's part, bit for bit, everywhere.
fn gather_bf16(comm: &MpiComm, parts: &[Range<usize>]) -> Result<(), String> {
    let rank = comm.rank();
    let n = parts.last().map_or(0, |p| p.end);
    let owner = |i: usize| {
        parts
            .iter()
            .position(|p| p.contains(&i))
            .expect("parts cover the buffer")
    };
    let mut buf: Vec<bf16> = (0..n)
        .map(|i| bf16::from_bits(if owner(i) == rank { bits(rank, i) } else { 0 }))
        .collect();
    let at = Words::Bf16(DevPtr::from_addr(buf.as_mut_ptr() as u64));
    // SAFETY: `buf` holds the n values the parts cover, untouched until the call returns.
    unsafe { comm.all_gather(at, parts) }.map_err(|e| e.to_string())?;
    for (i, got) in buf.iter().enumerate() {
        let want = bits(owner(i), i);
        if got.to_bits() != want {
            return Err(format!(
                "bf16 all-gather {parts:?}: [{i}] = {:#06x} not {want:#06x}",
                got.to_bits()
            ));
        }
    }
    Ok(())
}

/// The largest of each value over the ranks, by its bits (FP8's amax agreement): rank `r`'s
/// word at `i` is `bits(r, i)` without its top bit, shifted into the high half with `r`
/// below, so that every rank holds a different word, the largest is known, and infinity's
/// and NaNs' bits are among them.
fn max_bits(comm: &MpiComm) -> Result<(), String> {
    let word = |r: usize, i: usize| (((bits(r, i) & 0x7fff) as u32) << 16) | r as u32;
    let mut buf: Vec<u32> = (0..777).map(|i| word(comm.rank(), i)).collect();
    // SAFETY: `buf` holds the 777 words, untouched until the calls return.
    unsafe {
        comm.start_all_reduce_max_bits(DevPtr::from_addr(buf.as_mut_ptr() as u64), buf.len(), None)
            .and_then(|()| comm.finish_all_reduces(None))
    }
    .map_err(|e| e.to_string())?;
    for (i, &got) in buf.iter().enumerate() {
        let want = (0..comm.size()).map(|r| word(r, i)).max().unwrap();
        if got != want {
            return Err(format!("max of words: [{i}] = {got:#010x} not {want:#010x}"));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let comm = match MpiComm::init() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("comm_check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let world = comm.size();
    let mut layouts = vec![even_parts(1000 * world, world, 1), even_parts(1001, world, 32)];
    // One rank with nothing: everything on the others.
    let mut uneven = even_parts(517, world, 1);
    if world > 1 {
        uneven[0] = 0..0;
        uneven[1].start = 0;
    }
    layouts.push(uneven);
    for parts in &layouts {
        for started in [false, true] {
            if let Err(e) = check(&comm, parts, started) {
                eprintln!("comm_check ({}): {e}", comm.describe());
                comm.abort(1);
                return ExitCode::FAILURE;
            }
        }
    }
    if let Err(e) = max_bits(&comm) {
        eprintln!("comm_check ({}): {e}", comm.describe());
        comm.abort(1);
        return ExitCode::FAILURE;
    }
    println!(
        "comm_check: rank {} of {world}: reduce-scatter, all-gather (f32, bf16) and max of words exact",
        comm.rank()
    );
    ExitCode::SUCCESS
}

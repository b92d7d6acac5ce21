//! The CUDA backend's snapshots (`Backend::snapshot`, what checkpoints copy the training state
//! through): a snapshot read on another thread holds the buffers as the work queued before it
//! left them, none of the work queued after it, bit for bit; the next one is refused until the
//! last was read (or dropped unread), then reuses the memory.
//! Needs a CUDA device: run with `--include-ignored` on a GPU machine.
#![cfg(feature = "cuda")]

mod support;

use common::backend::cuda::CudaBackend;
use common::backend::{Backend, DeviceBuffer, Precision, Snapshot, SnapshotTimes};

fn gpu() -> CudaBackend {
    CudaBackend::new(0, Precision::Fp32).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// Values of magnitude in [0.5, 1) (normal floats, which stay normal scaled a few times),
/// a different sequence per seed (xorshift).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = 2 * seed + 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mantissa = (x >> 41) as u32; // 23 bits
            let sign = ((x >> 40) as u32 & 1) << 31;
            f32::from_bits(sign | 0x3f00_0000 | mantissa)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Reads `snapshot` on a thread of its own, as the checkpoint writer does: its parts and times.
fn read_elsewhere(snapshot: Box<dyn Snapshot>) -> (Vec<Vec<f32>>, SnapshotTimes) {
    std::thread::spawn(move || {
        let mut parts = Vec::new();
        let times = snapshot
            .read(&mut |got| {
                parts = got.iter().map(|p| p.to_vec()).collect();
                Ok(())
            })
            .expect("snapshot read");
        (parts, times)
    })
    .join()
    .expect("reader thread")
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_snapshot_holds_what_was_queued_before_it_and_nothing_after() {
    let _gpu = support::one_at_a_time();
    let be = gpu();
    // Three parts of unequal lengths, the first large enough that its copies take a while.
    let lens = [3 << 22, 1000, 7];
    let mut host: Vec<Vec<f32>> = lens.iter().zip(1..).map(|(&n, seed)| values(n, seed)).collect();
    let bufs: Vec<_> = host
        .iter()
        .map(|h| {
            let b = be.alloc::<f32>(h.len()).unwrap();
            be.write(&b, 0, h).unwrap();
            b
        })
        .collect();
    let parts: Vec<&_> = bufs.iter().collect();
    // Work queued before the snapshot, which it must wait for: x *= 1.5, ten times (one
    // rounding each, the same on the host).
    let scale = |host: &mut Vec<Vec<f32>>, s: f32, times: usize| {
        for _ in 0..times {
            for (b, h) in bufs.iter().zip(host.iter_mut()) {
                be.scale(b.span(), b.len(), s);
                h.iter_mut().for_each(|x| *x *= s);
            }
        }
    };
    scale(&mut host, 1.5, 10);
    let first = be.snapshot(&parts).unwrap().expect("the GPU takes snapshots");
    assert_eq!(first.bytes(), 4 * lens.iter().sum::<usize>() as u64);
    let want = host.clone();
    // Work queued after it, which it must not see: new values, then more scaling.
    for (b, seed) in bufs.iter().zip(10..) {
        be.write(b, 0, &values(b.len(), seed)).unwrap();
    }
    host = lens.iter().zip(10..).map(|(&n, seed)| values(n, seed)).collect();
    scale(&mut host, -0.75, 10);
    // One snapshot at a time: the next is refused until this one is read.
    assert!(
        be.snapshot(&parts).is_err(),
        "a second snapshot before the first was read"
    );
    let (got, times) = read_elsewhere(first);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(bits(g) == bits(w), "part {k}: not the state queued before the snapshot");
    }
    assert!(times.device_s > 0.0 && times.to_host_s > 0.0, "{times:?}");
    println!(
        "SNAPSHOT {} MB: {:.3} ms within the device, {:.1} ms to {} host memory",
        4 * lens.iter().sum::<usize>() / 1_000_000,
        times.device_s * 1e3,
        times.to_host_s * 1e3,
        if times.pinned { "pinned" } else { "pageable" }
    );
    // The next snapshot reuses the memory and holds the state now.
    let (got, _) = read_elsewhere(be.snapshot(&parts).unwrap().expect("a second snapshot"));
    for (k, (g, w)) in got.iter().zip(&host).enumerate() {
        assert!(bits(g) == bits(w), "part {k}: the second snapshot differs");
    }
    // One dropped unread leaves the memory free for the next; after a release, the next
    // makes its memory again.
    drop(be.snapshot(&parts).unwrap());
    be.release_snapshots();
    let (got, _) = read_elsewhere(be.snapshot(&parts).unwrap().expect("a snapshot after a release"));
    assert!(bits(&got[2]) == bits(&host[2]));
}

//! Subnormal floats flushed to zero on the threads that compute.
//!
//! Values below f32's smallest normal (about 1.2e-38) turn up in training: softmax
//! probabilities of masked or far-off scores, products of small gradients, AdamW's second
//! moments of rare tokens. Many x86-64 cores (Intel's among them) handle a subnormal input or
//! result in microcode, a hundred cycles or more for one operation; AMD's cores and GPUs do
//! not. With flush-to-zero (subnormal results become 0) and denormals-are-zero (subnormal
//! inputs read as 0) every such operation runs at full speed, and the values it drops are
//! below anything a loss or an update can show. The CPU backend's worker threads set both as
//! they start ([`flush_subnormals`]). (GPUs handle subnormals at full speed; their kernels keep them.)

/// Sets flush-to-zero and denormals-are-zero for the calling thread (x86-64: MXCSR bits 15
/// and 6; aarch64: FPCR.FZ). Elsewhere nothing.
pub fn flush_subnormals() {
    #[cfg(target_arch = "x86_64")]
    {
        let csr = mxcsr() | MXCSR_FTZ | MXCSR_DAZ;
        // SAFETY: ldmxcsr loads the 32-bit value at a valid address; the bits set change only
        // how subnormal floats are treated.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly)) };
    }
    #[cfg(target_arch = "aarch64")]
    {
        let mut fpcr: u64;
        // SAFETY: reads and writes the floating-point control register; FZ (bit 24) changes
        // only how subnormal floats are treated.
        unsafe {
            std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack));
            fpcr |= 1 << 24;
            std::arch::asm!("msr fpcr, {}", in(reg) fpcr, options(nomem, nostack));
        }
    }
}

/// Whether the calling thread flushes subnormals (see [`flush_subnormals`]); `true` on targets
/// where it does nothing.
#[cfg(test)]
pub fn flushing_subnormals() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let csr = mxcsr();
        csr & (MXCSR_FTZ | MXCSR_DAZ) == MXCSR_FTZ | MXCSR_DAZ
    }
    #[cfg(target_arch = "aarch64")]
    {
        let fpcr: u64;
        // SAFETY: reads the floating-point control register.
        unsafe { std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack)) };
        fpcr & (1 << 24) != 0
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    true
}

#[cfg(target_arch = "x86_64")]
const MXCSR_FTZ: u32 = 1 << 15;
#[cfg(target_arch = "x86_64")]
const MXCSR_DAZ: u32 = 1 << 6;

#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut csr = 0u32;
    // SAFETY: stmxcsr stores 32 bits at a valid, writable address.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack)) };
    csr
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::flushing_subnormals;
    use crate::backend::cpu::CpuBackend;
    use std::hint::black_box;

    #[test]
    fn every_worker_thread_flushes_subnormals() {
        // This test's own thread keeps them until a backend is made on it (threads start with
        // their parent's setting: the test harness's), so the check below can fail.
        let product = black_box(1e-30f32) * black_box(1e-10f32);
        assert!(
            product != 0.0 && !flushing_subnormals(),
            "the test thread already flushes subnormals"
        );
        for threads in [1, 3] {
            let be = CpuBackend::new(threads).unwrap();
            assert!(
                be.flushes_subnormals(),
                "{threads} workers: a subnormal product survives"
            );
        }
        assert!(
            flushing_subnormals(),
            "the thread that made the backend keeps subnormals"
        );
    }
}

//! Compiles every CUDA kernel file with NVRTC, as the backend does at start-up. Needs no GPU,
//! only libnvrtc (CI: `pip install nvidia-cuda-nvrtc`, its lib folder on LD_LIBRARY_PATH).
//! Skips with a message when libnvrtc is missing, unless REQUIRE_NVRTC is set (CI sets it).
#![cfg(feature = "cuda")]

use common::backend::cuda::{compile, compile_cached, kernel_names, kernel_sources, nvrtc_present, nvrtc_version};
use common::backend::ActType;

/// The architecture we deploy on (Hopper: H100, H200): PTX, the plain cubin, and the sm_90a
/// cubin the backend loads on Hopper (wgmma in the head-size-64 flash kernels).
const ARCHS: [&str; 3] = ["compute_90", "sm_90", "sm_90a"];

/// False (after saying why) when NVRTC is missing and that is allowed; panics when it is
/// missing and REQUIRE_NVRTC is set.
fn nvrtc_or_skip() -> bool {
    if nvrtc_present() {
        return true;
    }
    let hint = "libnvrtc.so.13 not found on LD_LIBRARY_PATH (`pip install nvidia-cuda-nvrtc`, then add \
                its site-packages/nvidia/cu13/lib)";
    if std::env::var_os("REQUIRE_NVRTC").is_some() {
        panic!("REQUIRE_NVRTC is set but {hint}");
    }
    eprintln!("SKIPPED: {hint}; set REQUIRE_NVRTC=1 to make this a failure");
    false
}

#[test]
fn every_kernel_file_compiles_for_hopper() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = nvrtc_version().expect("nvrtc version");
    eprintln!("NVRTC {major}.{minor}");
    let mut failures = Vec::new();
    // f32 activations for both targets; bf16 for the cubin the backend loads.
    for (act, archs) in [(ActType::F32, &ARCHS[..]), (ActType::Bf16, &ARCHS[1..])] {
        for (file, src) in kernel_sources(act) {
            for &arch in archs {
                match compile(file, &src, arch) {
                    Ok(image) => assert!(!image.is_empty(), "{file} ({arch}, {act:?}): empty image"),
                    Err(e) => failures.push(format!("{file} ({arch}, {act:?}): {e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "NVRTC failures:\n{}", failures.join("\n"));
}

#[test]
fn ptx_defines_every_registered_kernel() {
    if !nvrtc_or_skip() {
        return;
    }
    for (file, src) in kernel_sources(ActType::F32) {
        let names = kernel_names(&src);
        assert!(!names.is_empty(), "{file}: no kernels found");
        let ptx = compile(file, &src, "compute_90").expect("compiles");
        let ptx = String::from_utf8_lossy(&ptx);
        for name in names {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{file}: {name} missing from the PTX (extern \"C\"?)"
            );
        }
    }
}

/// On sm_90a the bf16 flash kernels for head size 64 are Hopper's warpgroup products, with the
/// shared-memory fence the tensor cores' reads need; elsewhere their bodies only trap.
#[test]
fn hopper_flash_kernels_use_warpgroup_products() {
    if !nvrtc_or_skip() {
        return;
    }
    let (file, src) = kernel_sources(ActType::Bf16)
        .into_iter()
        .find(|(f, _)| *f == "flash_d64.cu")
        .expect("flash_d64.cu");
    let hopper = String::from_utf8_lossy(&compile(file, &src, "compute_90a").expect("compiles")).into_owned();
    let plain = String::from_utf8_lossy(&compile(file, &src, "compute_90").expect("compiles")).into_owned();
    for kernel in [
        "flash_forward_d64_wgmma",
        "flash_backward_dkdv_d64_wgmma",
        "flash_backward_dq_d64_wgmma",
    ] {
        let body = |ptx: &str| {
            let at = ptx.find(&format!(".entry {kernel}(")).expect("kernel in the PTX");
            let end = ptx[at + 1..].find(".entry ").map_or(ptx.len(), |e| at + 1 + e);
            ptx[at..end].to_string()
        };
        let (h, p) = (body(&hopper), body(&plain));
        assert!(
            h.contains("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"),
            "{kernel}: no wgmma"
        );
        assert!(h.contains("fence.proxy.async.shared::cta"), "{kernel}: no proxy fence");
        assert!(
            !p.contains("wgmma.mma_async") && p.contains("trap"),
            "{kernel}: sm_90 must only trap"
        );
    }
}

#[test]
fn a_broken_kernel_reports_nvrtc_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = compile(
        "broken.cu",
        "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        "sm_90",
    )
    .expect_err("must not compile");
    assert!(err.to_string().contains("undefined_name"), "log missing from: {err}");
}

#[test]
fn a_second_start_up_reads_the_kernel_cache() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (file, src) = kernel_sources(ActType::Bf16)
        .into_iter()
        .find(|(f, _)| *f == "gelu.cu")
        .expect("gelu.cu");
    let (first, hit) = compile_cached(&dir, file, &src, "sm_90").expect("compiles");
    assert!(!hit, "an empty cache cannot hit");
    let (again, hit) = compile_cached(&dir, file, &src, "sm_90").expect("reads back");
    assert!(hit && again == first, "the second call reads the same image back");
    // A damaged entry is compiled again and replaced, never loaded.
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "one entry so far: {entries:?}");
    let entry = &entries[0];
    let mut bytes = std::fs::read(entry).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(entry, &bytes).unwrap();
    let (repaired, hit) = compile_cached(&dir, file, &src, "sm_90").expect("compiles");
    assert!(!hit && repaired == first, "a damaged entry is not used");
    let (_, hit) = compile_cached(&dir, file, &src, "sm_90").expect("reads back");
    assert!(hit, "and it was written again");
    // Another target or another source is another entry.
    let (_, hit) = compile_cached(&dir, file, &src, "sm_80").expect("compiles");
    assert!(!hit, "sm_80 is not sm_90's image");
    let (_, hit) = compile_cached(&dir, file, &format!("{src}\n// changed"), "sm_90").expect("compiles");
    assert!(!hit, "a changed source compiles again");
    std::fs::remove_dir_all(&dir).unwrap();
}

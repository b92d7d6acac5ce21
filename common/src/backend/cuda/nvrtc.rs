//! The kernel registry: every `.cu` file under `kernels/` is embedded here, compiled once
//! by NVRTC for the device's own architecture (to a cubin, so the driver never JIT-compiles
//! PTX), loaded as a module, and its kernels looked up by name. Compiled images are kept on
//! disk (`kernel_cache_dir`), keyed by source, target and NVRTC version, so that a second
//! start-up skips NVRTC.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh64::{xxh64, Xxh64};

use cudarc::driver::{result as driver, sys as driver_sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::backend::ActType;
use crate::error::{Error, Result};

/// Shared device helpers (warp/block reductions), prepended to every kernel file.
const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// Every kernel file, by name. Each holds kernels only; its launchers live in Rust. The flash
/// attention kernels are generated per head size (`flash_source`) and compiled as files of
/// their own, so that the heavy compiles run in parallel.
const KERNEL_FILES: &[(&str, &str)] = &[
    ("encoder.cu", include_str!("kernels/encoder.cu")),
    ("matmul.cu", include_str!("kernels/matmul.cu")),
    ("layernorm.cu", include_str!("kernels/layernorm.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("gelu.cu", include_str!("kernels/gelu.cu")),
    ("crossentropy.cu", include_str!("kernels/crossentropy.cu")),
    ("reduce.cu", include_str!("kernels/reduce.cu")),
    ("adamw.cu", include_str!("kernels/adamw.cu")),
    ("kv_cache.cu", include_str!("kernels/kv_cache.cu")),
    ("mlp.cu", include_str!("kernels/mlp.cu")),
    ("fp8.cu", include_str!("kernels/fp8.cu")),
];

/// Flash attention templates (`flash_forward<D, SPLIT>` and the two backward kernels).
const FLASH_TEMPLATES: &str = include_str!("kernels/flash_attention.cuh");
/// The bf16 tensor-core flash kernels (`flash16_forward<D>` and the two backward kernels).
const FLASH_BF16_TEMPLATES: &str = include_str!("kernels/flash_bf16.cuh");
/// Hopper's warpgroup-product flash kernels for head size 64 (`flashwg_forward` and the two
/// backward kernels); their bodies exist in sm_90a builds only.
const FLASH_WGMMA: &str = include_str!("kernels/flash_wgmma.cuh");

/// Head sizes the flash kernels are built for (a head is padded up to the next one), with
/// the name each compiled file goes by.
const FLASH_FILES: [(usize, &str); 4] = [
    (16, "flash_d16.cu"),
    (32, "flash_d32.cu"),
    (64, "flash_d64.cu"),
    (128, "flash_d128.cu"),
];

/// The templates and their instances for head size `d`: for f32 operands the TF32 kernels,
/// split 1 (`tf32`) and 3 (`fp32`); for bf16 operands the bf16 kernels (which share the TF32
/// templates' helpers), and at head size 64 Hopper's.
fn flash_source(d: usize, act: ActType) -> String {
    let mut src = format!("{FLASH_TEMPLATES}\n");
    if act == ActType::Bf16 {
        src += FLASH_BF16_TEMPLATES;
        for kernel in ["flash_forward", "flash_backward_dkdv", "flash_backward_dq"] {
            let (params, args) = if kernel == "flash_forward" {
                ("FWD_PARAMS", "FWD_ARGS")
            } else {
                ("BWD_PARAMS", "BWD_ARGS")
            };
            let template = kernel.replacen("flash", "flash16", 1);
            src +=
                &format!("extern \"C\" __global__ void {kernel}_d{d}_bf16({params}) {{ {template}<{d}>({args}); }}\n");
        }
        if d == 64 {
            src += FLASH_WGMMA;
            // The forward, and with its output's E4M3 copies (`_fp8`: FP8's attention projection
            // input, as stored and transposed).
            src += "extern \"C\" __global__ void flash_forward_d64_wgmma(FWD_PARAMS) \
                    { FLASH_WGMMA_BODY(flashwg_forward(out, lse, qkv, T, NH, HS, scale_log2, vec, nullptr, nullptr, \
                    nullptr, nullptr)); }\n";
            src += "extern \"C\" __global__ void flash_forward_d64_wgmma_fp8(FWD_PARAMS, unsigned char* q8, \
                    unsigned char* q8t, float* amax, const float* q8_scale) { FLASH_WGMMA_BODY(flashwg_forward(out, \
                    lse, qkv, T, NH, HS, scale_log2, vec, q8, q8t, amax, q8_scale)); }\n";
            // The backward adding into dqkv (`_wgmma`) and overwriting it (`_wgmma_store`, the
            // model's call; `_wgmma_store_bias` also writes its tiles' column sums for the qkv
            // product's bias gradient, `_wgmma_store_fp8` those where bias_part is not null and
            // dqkv's E5M2 copy, FP8's qkv output gradient), two loop tiles in flight (flash.rs
            // `PIPE_STAGES`). dK/dV is held to 168 registers, so that three blocks (12 warps) fit
            // a multiprocessor instead of two (176 unbounded; a few bytes spill).
            let fp8_params =
                ", float* bias_part, unsigned char* q8, unsigned char* q8t, float* amax, const float* q8_scale";
            for (suffix, accumulate, param, arg) in [
                ("wgmma", true, "", "nullptr, nullptr, nullptr, nullptr, nullptr"),
                ("wgmma_store", false, "", "nullptr, nullptr, nullptr, nullptr, nullptr"),
                (
                    "wgmma_store_bias",
                    false,
                    ", float* bias_part",
                    "bias_part, nullptr, nullptr, nullptr, nullptr",
                ),
                (
                    "wgmma_store_fp8",
                    false,
                    fp8_params,
                    "bias_part, q8, q8t, amax, q8_scale",
                ),
            ] {
                for (kernel, bounds) in [("dkdv", "__launch_bounds__(128, 3) "), ("dq", "")] {
                    src += &format!(
                        "extern \"C\" {bounds}__global__ void flash_backward_{kernel}_d64_{suffix}(BWD_PARAMS{param}) \
                         {{ FLASH_WGMMA_BODY((flashwg_backward_{kernel}<2, {accumulate}>(dqkv, dout, qkv, lse, \
                         delta, T, NH, HS, scale, scale_log2, vec, {arg}))); }}\n"
                    );
                }
            }
        }
    }
    if act == ActType::F32 {
        src += &format!("// Instances for head sizes padded to {d}.\n");
        for split in [1, 3] {
            for (kernel, params, args) in [
                ("flash_forward", "FWD_PARAMS", "FWD_ARGS"),
                ("flash_backward_dkdv", "BWD_PARAMS", "BWD_ARGS"),
                ("flash_backward_dq", "BWD_PARAMS", "BWD_ARGS"),
            ] {
                src += &format!(
                    "extern \"C\" __global__ void {kernel}_d{d}_s{split}({params}) {{ {kernel}<{d}, {split}>({args}); }}\n"
                );
            }
        }
    }
    src
}

/// The sources exactly as NVRTC sees them for activations of type `act`: (file name,
/// `ACT_BF16` definition + prelude + file).
pub fn kernel_sources(act: ActType) -> Vec<(&'static str, String)> {
    let define = format!("#define ACT_BF16 {}\n", (act == ActType::Bf16) as u8);
    let files = KERNEL_FILES.iter().map(|&(name, src)| (name, src.to_string()));
    let flash = FLASH_FILES.iter().map(move |&(d, name)| (name, flash_source(d, act)));
    files
        .chain(flash)
        .map(|(name, src)| (name, format!("{define}{PRELUDE}\n{src}")))
        .collect()
}

/// Names of the `extern "C" __global__` functions defined in `src`.
pub fn kernel_names(src: &str) -> Vec<String> {
    let marker = "__global__ void ";
    src.match_indices(marker)
        .filter_map(|(at, _)| {
            let mut rest = src[at + marker.len()..].trim_start();
            if let Some(bounds) = rest.strip_prefix("__launch_bounds__") {
                rest = bounds[bounds.find(')')? + 1..].trim_start(); // `__launch_bounds__(N) name`
            }
            let end = rest.find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))?;
            (end > 0).then(|| rest[..end].to_string())
        })
        .collect()
}

/// Whether libnvrtc can be loaded (cudarc would panic at first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library's candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(missing_nvrtc());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::Device(format!("nvrtcVersion failed: {e}")))?;
    Ok((major, minor))
}

pub(super) fn missing_nvrtc() -> Error {
    Error::Device(
        "libnvrtc.so (CUDA's runtime compiler) not found: install the CUDA toolkit or \
         `pip install nvidia-cuda-nvrtc` and put its lib folder on LD_LIBRARY_PATH"
            .into(),
    )
}

/// Compiles one source with NVRTC. `arch` is `sm_XY` for a cubin (what the backend loads)
/// or `compute_XY` for PTX. Returns the image; a failed compile returns NVRTC's log.
pub fn compile(name: &str, src: &str, arch: &str) -> Result<Vec<u8>> {
    if !nvrtc_present() {
        return Err(missing_nvrtc());
    }
    let bad = |what: &str| Error::Device(format!("{name}: {what} contains a NUL byte"));
    let c_src = CString::new(src).map_err(|_| bad("source"))?;
    let c_name = CString::new(name).map_err(|_| bad("name"))?;
    let prog = nvrtc::create_program(&c_src, Some(&c_name))
        .map_err(|e| Error::Device(format!("nvrtcCreateProgram({name}): {e}")))?;
    let options = [format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    // SAFETY: `prog` is live until the destroy below; buffers are sized by NVRTC's own query.
    let image = unsafe {
        let compiled = nvrtc::compile_program(prog, &options);
        let image = match compiled {
            Err(e) => Err(Error::Device(format!(
                "NVRTC failed to compile {name} for {arch}: {e}\n{}",
                program_log(prog)
            ))),
            Ok(()) if arch.starts_with("sm_") => get_cubin(prog),
            Ok(()) => nvrtc::get_ptx(prog)
                .map(|ptx| ptx.into_iter().map(|c| c as u8).collect())
                .map_err(|e| Error::Device(format!("nvrtcGetPTX({name}): {e}"))),
        };
        let _ = nvrtc::destroy_program(prog);
        image
    };
    image
}

/// Where compiled kernel images are kept between runs: `$GPT2_KERNEL_CACHE` (`off`: nowhere),
/// else `$XDG_CACHE_HOME/gpt2-rs/kernels`, else `~/.cache/gpt2-rs/kernels`.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("GPT2_KERNEL_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .map(|dir| dir.join("gpt2-rs").join("kernels")),
    }
}

/// [`compile`] through the cache in `dir`: an image compiled before from the same source for
/// the same target by the same NVRTC is read back (checked by its xxHash64) instead. Returns
/// the image and whether it came from the cache. A cache that cannot be read or written only
/// costs a compile.
pub fn compile_cached(dir: &Path, name: &str, src: &str, arch: &str) -> Result<(Vec<u8>, bool)> {
    let (major, minor) = nvrtc_version()?;
    let mut key = Xxh64::new(0);
    for part in [
        src.as_bytes(),
        arch.as_bytes(),
        &major.to_le_bytes(),
        &minor.to_le_bytes(),
    ] {
        key.update(&(part.len() as u64).to_le_bytes());
        key.update(part);
    }
    let stem = name.trim_end_matches(".cu");
    let path = dir.join(format!("{stem}-{arch}-{:016x}.img", key.digest()));
    if let Some(image) = std::fs::read(&path)
        .ok()
        .and_then(|bytes| verified(&bytes).map(<[u8]>::to_vec))
    {
        return Ok((image, true));
    }
    let image = compile(name, src, arch)?;
    if std::fs::create_dir_all(dir).is_ok() {
        let _ = crate::atomic_file::write(&path, |f| {
            f.write_all(&image)?;
            f.write_all(&xxh64(&image, 0).to_le_bytes())
        });
    }
    Ok((image, false))
}

/// The image of a cache file (image, then its xxHash64), when the checksum holds.
fn verified(bytes: &[u8]) -> Option<&[u8]> {
    let (image, sum) = bytes.split_at(bytes.len().checked_sub(8)?);
    (!image.is_empty() && xxh64(image, 0) == u64::from_le_bytes(sum.try_into().ok()?)).then_some(image)
}

unsafe fn program_log(prog: nvrtc_sys::nvrtcProgram) -> String {
    match nvrtc::get_program_log(prog) {
        Ok(log) => {
            let bytes: Vec<u8> = log.into_iter().take_while(|&c| c != 0).map(|c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e})"),
    }
}

unsafe fn get_cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
        .result()
        .map_err(|e| Error::Device(format!("nvrtcGetCUBINSize: {e}")))?;
    let mut cubin = vec![0u8; size];
    nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char)
        .result()
        .map_err(|e| Error::Device(format!("nvrtcGetCUBIN: {e}")))?;
    Ok(cubin)
}

/// Loaded modules and their kernels by name. Later kernels (fused, bf16) only need a new
/// entry in `KERNEL_FILES`.
pub(super) struct Kernels {
    modules: Vec<driver_sys::CUmodule>,
    functions: HashMap<String, driver_sys::CUfunction>,
}

/// Compiled images of every kernel file, by architecture and activation type: compiled once
/// per process (the flash kernels take seconds), however many backends are made.
type Images = Arc<Vec<(&'static str, String, Vec<u8>)>>;
static IMAGES: Mutex<Vec<(String, ActType, Images)>> = Mutex::new(Vec::new());

/// Every kernel file compiled for `arch` and `act`, in parallel, or the images compiled before.
fn images(arch: &str, act: ActType) -> Result<Images> {
    let mut cache = IMAGES
        .lock()
        .map_err(|_| Error::Device("kernel image cache lock poisoned".into()))?;
    if let Some((_, _, images)) = cache.iter().find(|(a, t, _)| a == arch && *t == act) {
        return Ok(Arc::clone(images));
    }
    let sources = kernel_sources(act);
    let dir = kernel_cache_dir();
    let compiled: Vec<Result<Vec<u8>>> = std::thread::scope(|scope| {
        let jobs: Vec<_> = sources
            .iter()
            .map(|(file, src)| {
                let dir = dir.as_deref();
                scope.spawn(move || match dir {
                    Some(dir) => compile_cached(dir, file, src, arch).map(|(image, _)| image),
                    None => compile(file, src, arch),
                })
            })
            .collect();
        jobs.into_iter()
            .map(|job| {
                job.join()
                    .unwrap_or_else(|_| Err(Error::Device("NVRTC compile thread panicked".into())))
            })
            .collect()
    });
    let mut images = Vec::with_capacity(sources.len());
    for ((file, src), cubin) in sources.into_iter().zip(compiled) {
        images.push((file, src, cubin?));
    }
    let images = Arc::new(images);
    cache.push((arch.to_string(), act, Arc::clone(&images)));
    Ok(images)
}

impl Kernels {
    /// Loads every kernel file compiled for `arch` (e.g. "sm_90") and activations of type
    /// `act`; the context must be current on this thread.
    pub(super) fn load(arch: &str, act: ActType) -> Result<Self> {
        let mut kernels = Kernels {
            modules: Vec::new(),
            functions: HashMap::new(),
        };
        for (file, src, cubin) in images(arch, act)?.iter() {
            // SAFETY: `cubin` is a complete image from NVRTC, alive for the call.
            let module = unsafe { driver::module::load_data(cubin.as_ptr() as *const c_void) }
                .map_err(|e| Error::Device(format!("loading {file} ({arch}) into the driver: {e}")))?;
            kernels.modules.push(module);
            for name in kernel_names(src) {
                let c_name =
                    CString::new(name.as_str()).map_err(|_| Error::Device(format!("bad kernel name {name}")))?;
                // SAFETY: `module` was just loaded and is kept until drop.
                let function = unsafe { driver::module::get_function(module, c_name) }
                    .map_err(|e| Error::Device(format!("{file}: kernel {name} not in the module: {e}")))?;
                if kernels.functions.insert(name.clone(), function).is_some() {
                    return Err(Error::Device(format!("{file}: kernel {name} is defined twice")));
                }
            }
        }
        Ok(kernels)
    }

    pub(super) fn get(&self, name: &str) -> Option<driver_sys::CUfunction> {
        self.functions.get(name).copied()
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        for module in self.modules.drain(..) {
            // SAFETY: each module was loaded once and is unloaded once.
            let _ = unsafe { driver::module::unload(module) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kernel_names;

    #[test]
    fn kernel_names_read_past_launch_bounds() {
        let src = "extern \"C\" __global__ void plain_kernel(int n) {}\n\
                   extern \"C\" __global__ void __launch_bounds__(1024) bounded_kernel(float* x) {}\n\
                   __device__ void helper() {}";
        assert_eq!(kernel_names(src), ["plain_kernel", "bounded_kernel"]);
    }
}

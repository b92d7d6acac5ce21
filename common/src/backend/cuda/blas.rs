//! cuBLAS on raw device pointers, column-major as cuBLAS thinks. Precision picks the compute
//! type: `Fp32` is CUBLAS_COMPUTE_32F with the default math mode (strict IEEE fp32, no TF32);
//! `Tf32` is CUBLAS_COMPUTE_32F_FAST_TF32 on the tensor cores. (cuBLASLt's f32 path in cudarc
//! uses TF32, so it is not used here.)

use std::ffi::c_void;

use cudarc::cublas::sys::{
    self as blas_sys, cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasMath_t, cublasOperation_t,
    cudaDataType_t,
};
use cudarc::driver::sys::CUstream;

use crate::backend::Precision;
use crate::backend::{ActType, DevPtr};
use crate::error::{Error, Result};

pub(super) struct Blas {
    handle: cublasHandle_t,
    compute: cublasComputeType_t,
}

/// One column-major GEMM: C = alpha · op(A) · op(B) + beta · C, with op(A) m×k, op(B) k×n.
/// `stride_*` are element strides between the `batch` matrices (ignored when batch is 1).
pub(super) struct Gemm {
    /// Element type of A and B (bf16 operands accumulate in f32 all the same).
    pub ab: ActType,
    /// Element type of C.
    pub c_type: ActType,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: DevPtr,
    pub lda: usize,
    pub stride_a: usize,
    pub b: DevPtr,
    pub ldb: usize,
    pub stride_b: usize,
    pub beta: f32,
    pub c: DevPtr,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
}

fn int(what: &str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Device(format!("GEMM {what} = {x} does not fit cuBLAS's 32-bit int")))
}

fn op(trans: bool) -> cublasOperation_t {
    if trans {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

impl Blas {
    /// A handle bound to `stream`, using `workspace` (bytes of device memory we own).
    pub(super) fn new(
        stream: CUstream,
        precision: Precision,
        workspace: DevPtr,
        workspace_bytes: usize,
    ) -> Result<Self> {
        let err = |what: &str, e: cudarc::cublas::result::CublasError| Error::Device(format!("cuBLAS {what}: {e}"));
        let handle = cudarc::cublas::result::create_handle().map_err(|e| err("create", e))?;
        let blas = Blas {
            handle,
            compute: match precision {
                Precision::Fp32 | Precision::Bf16 => cublasComputeType_t::CUBLAS_COMPUTE_32F,
                Precision::Tf32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            },
        };
        let math = match precision {
            Precision::Fp32 | Precision::Bf16 => cublasMath_t::CUBLAS_DEFAULT_MATH,
            Precision::Tf32 => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
        };
        // SAFETY: a live handle; the stream and workspace outlive it (the backend drops it first).
        unsafe {
            blas_sys::cublasSetStream_v2(handle, stream as _)
                .result()
                .map_err(|e| err("set stream", e))?;
            blas_sys::cublasSetMathMode(handle, math)
                .result()
                .map_err(|e| err("set math mode", e))?;
            blas_sys::cublasSetWorkspace_v2(handle, workspace.addr() as *mut c_void, workspace_bytes)
                .result()
                .map_err(|e| err("set workspace", e))?;
        }
        Ok(blas)
    }

    /// Runs `g` (strided-batched when `g.batch > 1`) on the handle's stream.
    ///
    /// # Safety
    /// `g`'s pointers are device memory covering its shapes, strides and batch.
    pub(super) unsafe fn gemm(&self, g: &Gemm) -> Result<()> {
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        let (m, n, k) = (int("m", g.m)?, int("n", g.n)?, int("k", g.k)?);
        let (lda, ldb, ldc) = (int("lda", g.lda)?, int("ldb", g.ldb)?, int("ldc", g.ldc)?);
        let alpha = 1.0f32;
        let cuda_type = |t: ActType| match t {
            ActType::F32 => cudaDataType_t::CUDA_R_32F,
            ActType::Bf16 => cudaDataType_t::CUDA_R_16BF,
        };
        let (ab_t, c_t) = (cuda_type(g.ab), cuda_type(g.c_type));
        let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let (a, b, c) = (
            g.a.addr() as *const c_void,
            g.b.addr() as *const c_void,
            g.c.addr() as *mut c_void,
        );
        let alpha = &alpha as *const f32 as *const c_void;
        let beta = &g.beta as *const f32 as *const c_void;
        // SAFETY: pointers are device addresses the caller sized for these shapes.
        let status = unsafe {
            if g.batch == 1 {
                blas_sys::cublasGemmEx(
                    self.handle,
                    op(g.trans_a),
                    op(g.trans_b),
                    m,
                    n,
                    k,
                    alpha,
                    a,
                    ab_t,
                    lda,
                    b,
                    ab_t,
                    ldb,
                    beta,
                    c,
                    c_t,
                    ldc,
                    self.compute,
                    algo,
                )
            } else {
                blas_sys::cublasGemmStridedBatchedEx(
                    self.handle,
                    op(g.trans_a),
                    op(g.trans_b),
                    m,
                    n,
                    k,
                    alpha,
                    a,
                    ab_t,
                    lda,
                    g.stride_a as i64,
                    b,
                    ab_t,
                    ldb,
                    g.stride_b as i64,
                    beta,
                    c,
                    c_t,
                    ldc,
                    g.stride_c as i64,
                    int("batch", g.batch)?,
                    self.compute,
                    algo,
                )
            }
        };
        status
            .result()
            .map_err(|e| Error::Device(format!("cuBLAS GEMM {}x{}x{} failed: {e}", g.m, g.n, g.k)))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { cudarc::cublas::result::destroy_handle(self.handle) };
    }
}

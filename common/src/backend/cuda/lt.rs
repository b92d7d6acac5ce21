//! cuBLASLt for the forward matmul with the bias added in the GEMM's epilogue (one pass over
//! the output instead of the GEMM's write plus a bias kernel's read and write). A plan
//! (descriptors and the heuristic's algorithm) is made once per shape and alignment, then
//! reused. `Fp32` is CUBLAS_COMPUTE_32F (no TF32), `Tf32` CUBLAS_COMPUTE_32F_FAST_TF32.

use std::collections::hash_map::{Entry, HashMap};
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self as lt_sys, cublasComputeType_t, cublasLtEpilogue_t, cublasLtMatmulAlgo_t, cublasLtMatmulDescAttributes_t,
    cublasLtMatmulPreferenceAttributes_t, cudaDataType,
};
use cudarc::driver::sys::CUstream;

use crate::backend::Precision;
use crate::backend::{Act, ActType, DevPtr};
use crate::error::{Error, Result};

/// Shape and operand alignments: what an algorithm choice depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    align: [u32; 4], // A (weights), B (input), D (output), bias, in bytes
}

struct Plan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
    algo: cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are plain host objects, only used under the backend's plan lock.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created in `make_plan` (or still null), destroyed once.
        unsafe {
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

pub(super) struct LtMatmul {
    handle: lt_sys::cublasLtHandle_t,
    compute: cublasComputeType_t,
    /// Element type of the operands, the output and the bias.
    act: ActType,
    workspace: DevPtr,
    workspace_bytes: usize,
    /// `None`: no algorithm for that key (the caller falls back to cuBLAS + a bias kernel).
    plans: Mutex<HashMap<PlanKey, Option<Plan>>>,
}

// SAFETY: the handle is used from one stream, under the plan lock.
unsafe impl Send for LtMatmul {}
unsafe impl Sync for LtMatmul {}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> Error + '_ {
    move |e| Error::Device(format!("cuBLASLt {what}: {e}"))
}

/// Largest power of two (at most 256) dividing the address.
fn alignment<T>(p: DevPtr<T>) -> u32 {
    if p.addr() == 0 {
        256
    } else {
        (1u64 << p.addr().trailing_zeros().min(8)) as u32
    }
}

impl LtMatmul {
    /// `None` when libcublasLt cannot be loaded (the backend then uses cuBLAS alone).
    pub(super) fn new(precision: Precision, workspace: DevPtr, workspace_bytes: usize) -> Result<Option<Self>> {
        // SAFETY: only tries to dlopen the library's candidate names.
        if !unsafe { lt_sys::is_culib_present() } {
            return Ok(None);
        }
        let handle = lt::create_handle().map_err(lt_err("create"))?;
        Ok(Some(LtMatmul {
            handle,
            compute: match precision {
                Precision::Fp32 | Precision::Bf16 => cublasComputeType_t::CUBLAS_COMPUTE_32F,
                Precision::Tf32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            },
            act: precision.act(),
            workspace,
            workspace_bytes,
            plans: Mutex::new(HashMap::new()),
        }))
    }

    /// out (BT,OC) = inp (BT,C) · wᵀ + bias, row-major. Column-major for cuBLASLt:
    /// outᵀ (OC,BT) = op(w) · inpᵀ with op = transpose, the bias broadcast along columns.
    /// Returns false (having queued nothing) when no algorithm fits; the caller falls back.
    ///
    /// # Safety
    /// `out`: BT·OC, `inp`: BT·C, `w`: OC·C, `bias`: OC elements of device memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_bias(
        &self,
        stream: CUstream,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) -> Result<bool> {
        let key = PlanKey {
            m: oc,
            n: bt,
            k: c,
            align: [alignment(w), alignment(inp), alignment(out), alignment(bias)],
        };
        if key.align[3] < 16 {
            return Ok(false); // the epilogue reads the bias in 16-byte pieces
        }
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| Error::Device("cuBLASLt plan lock poisoned".into()))?;
        let plan = match plans.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.make_plan(&key)?),
        };
        let Some(plan) = plan.as_ref() else {
            return Ok(false);
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the plan's descriptors are live; pointers are device addresses sized by the
        // caller for these shapes; the workspace is ours and outlives the call.
        unsafe {
            let bias_ptr = bias.addr() as *const c_void;
            lt::set_matmul_desc_attribute(
                plan.desc,
                cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias_ptr as *const *const c_void as *const c_void,
                std::mem::size_of::<*const c_void>(),
            )
            .map_err(lt_err("set bias pointer"))?;
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w.addr() as *const c_void,
                plan.a,
                inp.addr() as *const c_void,
                plan.b,
                out.addr() as *const c_void,
                plan.d,
                out.addr() as *mut c_void,
                plan.d,
                &plan.algo,
                self.workspace.addr() as *mut c_void,
                self.workspace_bytes,
                stream as lt_sys::cudaStream_t,
            )
            .map_err(|e| Error::Device(format!("cuBLASLt matmul {oc}x{bt}x{c} failed: {e}")))?;
        }
        Ok(true)
    }

    fn make_plan(&self, key: &PlanKey) -> Result<Option<Plan>> {
        let f32_t = cudaDataType::CUDA_R_32F;
        let elem_t = match self.act {
            ActType::F32 => f32_t,
            ActType::Bf16 => cudaDataType::CUDA_R_16BF,
        };
        // Scale type f32 (alpha, beta); A, B, D and the bias in the activation type.
        let desc = lt::create_matmul_desc(self.compute, f32_t).map_err(lt_err("matmul descriptor"))?;
        let layout = |rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(elem_t, rows as u64, cols as u64, ld as i64).map_err(lt_err("layout"))
        };
        // Null layouts first, so that a failure part-way frees what was made (in Drop).
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        // A as stored: w (OC,C) row-major is column-major (C, OC), transposed by the op.
        plan.a = layout(key.k, key.m, key.k)?;
        plan.b = layout(key.k, key.n, key.k)?;
        plan.d = layout(key.m, key.n, key.m)?;
        let trans: i32 = 1; // CUBLAS_OP_T
        let epilogue = cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
        // SAFETY: live descriptors; each attribute gets a value of its documented type.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans as *const i32 as *const c_void,
                4,
            )
            .map_err(lt_err("transpose A"))?;
            lt::set_matmul_desc_attribute(
                plan.desc,
                cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &epilogue as *const cublasLtEpilogue_t as *const c_void,
                std::mem::size_of::<cublasLtEpilogue_t>(),
            )
            .map_err(lt_err("epilogue"))?;
            let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
            let ws = self.workspace_bytes as u64;
            let set = |attr, value: *const c_void, size| lt::set_matmul_pref_attribute(pref, attr, value, size);
            use cublasLtMatmulPreferenceAttributes_t as P;
            let mut ok = set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as _, 8).is_ok();
            for (attr, align) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
            ] {
                ok &= set(attr, &align as *const u32 as _, 4).is_ok();
            }
            let found = if ok {
                lt::get_matmul_algo_heuristic(self.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref).ok()
            } else {
                None
            };
            let _ = lt::destroy_matmul_pref(pref);
            Ok(found.map(|h| {
                plan.algo = h.algo;
                plan
            }))
        }
    }
}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.clear();
        }
        // SAFETY: created in `new`, destroyed once, after its plans.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

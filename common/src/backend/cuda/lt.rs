//! cuBLASLt for the matrix products that do more than multiply, in the GEMM's epilogue: the
//! forward products add their bias (one pass over the output instead of the GEMM's write plus
//! a bias kernel's read and write), and the MLP's GELU is fused into its two products:
//! forward `aux = A·B + bias, D = gelu(aux)` (GELU_AUX_BIAS: the pre-activation and the
//! activation in one pass), backward `D = gelu'(aux) ⊙ A·B` (DGELU). The MLP workload's
//! hidden layers take their ReLU in the epilogue too (RELU_BIAS). A plan (descriptors and the
//! heuristic's algorithm) is made once per epilogue, shape and alignment, then reused, so the
//! algorithm is fixed. `Fp32` is CUBLAS_COMPUTE_32F (no TF32), `Tf32`
//! CUBLAS_COMPUTE_32F_FAST_TF32. A, B, D, the bias and the auxiliary matrix have the
//! activation type (the auxiliary matrix's type is left at its default, D's), except in the
//! FP8 products (`matmul_fp8`), whose A and B are FP8 with a scale each, summed in f32 (the
//! MLP's first, through GELU, in the tensor cores' own precision: FAST_ACCUM).

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
use crate::backend::{Act, ActType, DevPtr, Fp8};
use crate::error::{Error, Result};

/// What the epilogue does with the product A·B (column-major, as cuBLASLt sees it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Epilogue {
    /// D = A·B, with A transposed (an FP8 product without a bias).
    Plain,
    /// D = A·B + bias, with A transposed (the forward products).
    Bias,
    /// D = relu(A·B + bias), with A transposed (the MLP workload's hidden layers).
    ReluBias,
    /// aux = A·B (+ bias), D = gelu(aux), with A transposed (the MLP's first product).
    GeluAux { bias: bool },
    /// D = gelu'(aux) ⊙ A·B, A as stored (the MLP's backward product into its hidden layer).
    DGelu,
}

impl Epilogue {
    fn value(self) -> cublasLtEpilogue_t {
        match self {
            Epilogue::Plain => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::ReluBias => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::GeluAux { bias: true } => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Epilogue::GeluAux { bias: false } => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX,
            Epilogue::DGelu => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DGELU,
        }
    }

    /// The forward products read the weights (OC,C) row-major as the transpose of A.
    fn trans_a(self) -> bool {
        self != Epilogue::DGelu
    }

    fn has_bias(self) -> bool {
        matches!(
            self,
            Epilogue::Bias | Epilogue::ReluBias | Epilogue::GeluAux { bias: true }
        )
    }

    fn has_aux(self) -> bool {
        matches!(self, Epilogue::GeluAux { .. } | Epilogue::DGelu)
    }

    /// Whether a fallback to the separate kernels is said on stderr (once per key): where it
    /// costs a kernel pass of its own (GELU), not the forward bias or the MLP workload's ReLU
    /// (a fallback there is seen in `plans`).
    fn says_fallback(self) -> bool {
        !matches!(self, Epilogue::Plain | Epilogue::Bias | Epilogue::ReluBias)
    }
}

/// What A and B hold: activations, or FP8 values (`Fp8`: A's format, then B's) each with a
/// scale that the product is multiplied by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Inputs {
    Act,
    Fp8([Fp8; 2]),
}

fn fp8_type(format: Fp8) -> cudaDataType {
    match format {
        Fp8::E4M3 => cudaDataType::CUDA_R_8F_E4M3,
        Fp8::E5M2 => cudaDataType::CUDA_R_8F_E5M2,
    }
}

/// D's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Output {
    /// The activation type.
    Act,
    /// f32, C being D (a weight gradient, written or added to).
    F32,
    /// FP8, scaled, its amax taken.
    Fp8(Fp8),
}

/// Epilogue, operand types, shape and operand alignments: what an algorithm choice depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    epilogue: Epilogue,
    inputs: Inputs,
    output: Output,
    m: usize,
    n: usize,
    k: usize,
    align: [u32; 5], // A, B, D, bias, aux, in bytes (256 for an operand the epilogue lacks)
}

/// One product's device operands: D (m,n) = op(A) (m,k) · B (k,n), column-major.
struct Operands {
    a: DevPtr<Act>,
    b: DevPtr<Act>,
    d: DevPtr<Act>,
    bias: Option<DevPtr<Act>>,
    /// The auxiliary matrix of a GELU epilogue, laid out as D: (m,n), leading dimension m.
    aux: Option<DevPtr<Act>>,
    /// FP8 inputs: one f32 each (16-byte aligned), what A and B are multiplied by.
    scales: Option<[DevPtr; 2]>,
    /// FP8 output: its format, then D's scale (read) and its amax (set, not raised), one f32
    /// each, 16-byte aligned.
    output: Option<(Fp8, [DevPtr; 2])>,
    /// D in f32 (`d` is an f32 pointer), and beta: 0 writes it, 1 adds to it.
    f32_out: Option<f32>,
}

struct Plan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
    /// C's layout where it differs from D's (an FP8 D: C in the activation type).
    c: lt_sys::cublasLtMatrixLayout_t,
    algo: cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are plain host objects, only used under the backend's plan lock.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created in `make_plan` (or still null), destroyed once.
        unsafe {
            for layout in [self.a, self.b, self.d, self.c] {
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

    /// out (BT,OC) = inp (BT,C) · wᵀ + bias, row-major, and with `relu` max(0, ·) of that (the
    /// MLP workload's hidden layers: RELU_BIAS). Column-major for cuBLASLt: outᵀ (OC,BT) =
    /// op(w) · inpᵀ with op = transpose, the bias broadcast along columns. Returns false
    /// (having queued nothing) when no algorithm fits; the caller falls back.
    ///
    /// # Safety
    /// `out`: BT·OC, `inp`: BT·C, `w`: OC·C, `bias`: OC elements of device memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_bias(
        &self,
        stream: CUstream,
        relu: bool,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) -> Result<bool> {
        let ops = Operands {
            a: w,
            b: inp,
            d: out,
            bias: Some(bias),
            aux: None,
            scales: None,
            output: None,
            f32_out: None,
        };
        let epilogue = if relu { Epilogue::ReluBias } else { Epilogue::Bias };
        self.run(stream, epilogue, Inputs::Act, (oc, bt, c), ops)
    }

    /// out (R,S) = (x (R,K) · yᵀ)·dequant\[0\]·dequant\[1\] (+ bias), row-major, with x and y FP8
    /// matrices of `formats` whose rows hold their K values. Column-major: outᵀ (S,R) =
    /// op(y) · xᵀ with op = transpose, both operands K-major, the one layout of the tensor
    /// cores' FP8 products; x's scale is B's, y's A's. False (having queued nothing) when no
    /// algorithm fits.
    ///
    /// # Safety
    /// `out`: R·S, `x`: R·K, `y`: S·K, `bias`: S elements of device memory, and each of
    /// `dequant` one, 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_fp8(
        &self,
        stream: CUstream,
        out: DevPtr<Act>,
        x: DevPtr<u8>,
        y: DevPtr<u8>,
        bias: Option<DevPtr<Act>>,
        [dx, dy]: [DevPtr; 2],
        [r, s, k]: [usize; 3],
        [fx, fy]: [Fp8; 2],
    ) -> Result<bool> {
        let epilogue = if bias.is_some() {
            Epilogue::Bias
        } else {
            Epilogue::Plain
        };
        let ops = fp8_operands(out, None, [x, y], bias, [dx, dy]);
        self.run(stream, epilogue, Inputs::Fp8([fy, fx]), (s, r, k), ops)
    }

    /// [`LtMatmul::matmul_fp8`] into f32: out (R,S) = x·yᵀ·dequant, written, or with
    /// `accumulate` added to out (a weight gradient: x the output gradient's transposed copy, y
    /// the input's, K the rows of a batch). False (having queued nothing) when no algorithm
    /// fits.
    ///
    /// # Safety
    /// As `matmul_fp8`, with `out` R·S f32s.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_fp8_f32(
        &self,
        stream: CUstream,
        out: DevPtr,
        accumulate: bool,
        x: DevPtr<u8>,
        y: DevPtr<u8>,
        [dx, dy]: [DevPtr; 2],
        [r, s, k]: [usize; 3],
        [fx, fy]: [Fp8; 2],
    ) -> Result<bool> {
        let mut ops = fp8_operands(out.cast(), None, [x, y], None, [dx, dy]);
        ops.f32_out = Some(if accumulate { 1.0 } else { 0.0 });
        self.run(stream, Epilogue::Plain, Inputs::Fp8([fy, fx]), (s, r, k), ops)
    }

    /// [`LtMatmul::matmul_fp8`] through GELU: pre (R,S) = x·yᵀ·dequant (+ bias), and gelu(pre)
    /// only as its FP8 copy `out` (E4M3, scaled by `out_scale[0]`, the amax of gelu(pre) set
    /// into `out_scale[1]`), in one GEMM (GELU_AUX_BIAS, or GELU_AUX without a bias), x and y
    /// E4M3. False (having queued nothing) when the epilogue cannot run here; the caller falls
    /// back.
    ///
    /// # Safety
    /// As `matmul_fp8`, with `pre` R·S elements and `out` R·S bytes; `out_scale` two f32, each
    /// 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_fp8_gelu(
        &self,
        stream: CUstream,
        pre: DevPtr<Act>,
        out: DevPtr<u8>,
        out_scale: [DevPtr; 2],
        x: DevPtr<u8>,
        y: DevPtr<u8>,
        bias: Option<DevPtr<Act>>,
        [dx, dy]: [DevPtr; 2],
        [r, s, k]: [usize; 3],
    ) -> Result<bool> {
        let mut ops = fp8_operands(out.cast(), Some(pre), [x, y], bias, [dx, dy]);
        ops.output = Some((Fp8::E4M3, out_scale));
        let epilogue = Epilogue::GeluAux { bias: bias.is_some() };
        self.run(stream, epilogue, Inputs::Fp8([Fp8::E4M3; 2]), (s, r, k), ops)
    }

    /// The MLP's first product, row-major: pre (BT,OC) = inp (BT,C) · wᵀ + bias and
    /// out = gelu(pre), in one GEMM (GELU_AUX_BIAS, or GELU_AUX without a bias). False (having
    /// queued nothing) when the epilogue cannot run here; the caller falls back.
    ///
    /// # Safety
    /// `pre`, `out`: BT·OC, `inp`: BT·C, `w`: OC·C, `bias`: OC elements of device memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_gelu(
        &self,
        stream: CUstream,
        pre: DevPtr<Act>,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: Option<DevPtr<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) -> Result<bool> {
        let epilogue = Epilogue::GeluAux { bias: bias.is_some() };
        let ops = Operands {
            a: w,
            b: inp,
            d: out,
            bias,
            aux: Some(pre),
            scales: None,
            output: None,
            f32_out: None,
        };
        self.run(stream, epilogue, Inputs::Act, (oc, bt, c), ops)
    }

    /// The MLP's backward product into its hidden layer, row-major: dpre (BT,C) =
    /// gelu'(pre) ⊙ (dout (BT,OC) · w (OC,C)), overwriting dpre (DGELU). Column-major:
    /// dpreᵀ (C,BT) = w as stored (C,OC) · doutᵀ (OC,BT), pre laid out as dpre. False (having
    /// queued nothing) when the epilogue cannot run here; the caller falls back.
    ///
    /// # Safety
    /// `dpre`, `pre`: BT·C, `dout`: BT·OC, `w`: OC·C elements of device memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_dgelu(
        &self,
        stream: CUstream,
        dpre: DevPtr<Act>,
        dout: DevPtr<Act>,
        w: DevPtr<Act>,
        pre: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) -> Result<bool> {
        let ops = Operands {
            a: w,
            b: dout,
            d: dpre,
            bias: None,
            aux: Some(pre),
            scales: None,
            output: None,
            f32_out: None,
        };
        self.run(stream, Epilogue::DGelu, Inputs::Act, (c, bt, oc), ops)
    }

    /// Every plan made so far: its epilogue and (m, n, k), and whether the heuristic found
    /// an algorithm for it.
    pub(super) fn plans(&self) -> Vec<(String, [usize; 3], bool)> {
        let plans = self.plans.lock().map(|p| {
            p.iter()
                .map(|(key, plan)| (format!("{:?}", key.epilogue), [key.m, key.n, key.k], plan.is_some()))
                .collect()
        });
        plans.unwrap_or_default()
    }

    /// Queues D = epilogue(op(A) · B) for (m, n, k), by the plan for its key (made on first
    /// use). Ok(false), with nothing queued, when the operands break the epilogue's rules or
    /// the heuristic has no algorithm for them.
    ///
    /// # Safety
    /// The operands are device memory covering their (m, n, k) extents.
    unsafe fn run(
        &self,
        stream: CUstream,
        epilogue: Epilogue,
        inputs: Inputs,
        (m, n, k): (usize, usize, usize),
        ops: Operands,
    ) -> Result<bool> {
        if epilogue.has_bias() != ops.bias.is_some()
            || epilogue.has_aux() != ops.aux.is_some()
            || matches!(inputs, Inputs::Fp8(_)) != ops.scales.is_some()
            || (ops.output.is_some() && ops.scales.is_none())
            || (ops.output.is_some() && ops.f32_out.is_some())
        {
            return Err(Error::Device(format!(
                "cuBLASLt {epilogue:?}: operands do not fit the epilogue"
            )));
        }
        let absent = DevPtr::<Act>::default(); // aligned to 256: what an absent operand reports
        let key = PlanKey {
            epilogue,
            inputs,
            output: match (ops.output, ops.f32_out) {
                (Some((format, _)), _) => Output::Fp8(format),
                (None, Some(_)) => Output::F32,
                (None, None) => Output::Act,
            },
            m,
            n,
            k,
            align: [
                alignment(ops.a),
                alignment(ops.b),
                alignment(ops.d),
                alignment(ops.bias.unwrap_or(absent)),
                alignment(ops.aux.unwrap_or(absent)),
            ],
        };
        // The epilogue reads the bias in 16-byte pieces; the auxiliary matrix's leading
        // dimension (m) must be a multiple of 8 (cuBLASLt's rule) and we ask 16-byte alignment
        // of it as of the bias.
        let fits = key.align[3] >= 16 && key.align[4] >= 16 && (!epilogue.has_aux() || m.is_multiple_of(8));
        if !fits {
            return Ok(false);
        }
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| Error::Device("cuBLASLt plan lock poisoned".into()))?;
        let plan = match plans.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.make_plan(&key, &ops)?),
        };
        let Some(plan) = plan.as_ref() else {
            return Ok(false);
        };
        let (alpha, beta) = (1.0f32, ops.f32_out.unwrap_or(0.0));
        // SAFETY: the plan's descriptors are live; pointers are device addresses sized by the
        // caller for these shapes; the workspace is ours and outlives the call.
        unsafe {
            if let Some(bias) = ops.bias {
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias)?;
            }
            if let Some(aux) = ops.aux {
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux)?;
            }
            if let Some([a, b]) = ops.scales {
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a)?;
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b)?;
            }
            if let Some((_, [scale, amax])) = ops.output {
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, scale)?;
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax)?;
            }
            // C is D, read only where an f32 D is added to (beta = 1). Beside an FP8 D it has
            // the activation type: the auxiliary matrix, of that type and D's shape, stands for
            // it.
            let (c, c_layout) = match (ops.output, ops.aux) {
                (Some(_), Some(aux)) => (aux, plan.c),
                _ => (ops.d, plan.d),
            };
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                ops.a.addr() as *const c_void,
                plan.a,
                ops.b.addr() as *const c_void,
                plan.b,
                c.addr() as *const c_void,
                c_layout,
                ops.d.addr() as *mut c_void,
                plan.d,
                &plan.algo,
                self.workspace.addr() as *mut c_void,
                self.workspace_bytes,
                stream as lt_sys::cudaStream_t,
            )
            .map_err(|e| Error::Device(format!("cuBLASLt matmul {epilogue:?} {m}x{n}x{k} failed: {e}")))?;
        }
        Ok(true)
    }

    /// Descriptors and the heuristic's first algorithm for `key`, or None when it has none.
    /// The bias and a GELU epilogue's auxiliary matrix are set before the heuristic runs:
    /// cuBLASLt reads their alignment from the pointers.
    fn make_plan(&self, key: &PlanKey, ops: &Operands) -> Result<Option<Plan>> {
        let f32_t = cudaDataType::CUDA_R_32F;
        let elem_t = match self.act {
            ActType::F32 => f32_t,
            ActType::Bf16 => cudaDataType::CUDA_R_16BF,
        };
        // Scale type f32 (alpha, beta).
        let desc = lt::create_matmul_desc(self.compute, f32_t).map_err(lt_err("matmul descriptor"))?;
        let layout = |t: cudaDataType, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(t, rows as u64, cols as u64, ld as i64).map_err(lt_err("layout"))
        };
        // Null layouts first, so that a failure part-way frees what was made (in Drop).
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let (m, n, k) = (key.m, key.n, key.k);
        let (a_t, b_t) = match key.inputs {
            Inputs::Act => (elem_t, elem_t),
            Inputs::Fp8([a, b]) => (fp8_type(a), fp8_type(b)),
        };
        // FP8 products take A transposed whatever the epilogue: both operands K-major.
        let trans_a = key.epilogue.trans_a() || matches!(key.inputs, Inputs::Fp8(_));
        plan.a = if trans_a {
            // w (OC,C) row-major is column-major (C, OC) = (k, m), transposed by the op.
            layout(a_t, k, m, k)?
        } else {
            // w (OC,C) row-major is column-major (m, k), as stored.
            layout(a_t, m, k, m)?
        };
        plan.b = layout(b_t, k, n, k)?;
        match key.output {
            Output::Fp8(format) => {
                plan.d = layout(fp8_type(format), m, n, m)?;
                plan.c = layout(elem_t, m, n, m)?;
            }
            Output::F32 => plan.d = layout(f32_t, m, n, m)?,
            Output::Act => plan.d = layout(elem_t, m, n, m)?,
        }
        let trans_a: i32 = trans_a as i32; // CUBLAS_OP_T or CUBLAS_OP_N
        let trans_b: i32 = 0; // CUBLAS_OP_N
        let epilogue = key.epilogue.value();
        let aux_ld = m as i64;
        // SAFETY: live descriptors; each attribute gets a value of its documented type.
        unsafe {
            for (attr, value, what) in [
                (Attr::CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, "transpose A"),
                (Attr::CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, "transpose B"),
            ] {
                lt::set_matmul_desc_attribute(plan.desc, attr, value as *const i32 as *const c_void, 4)
                    .map_err(lt_err(what))?;
            }
            lt::set_matmul_desc_attribute(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &epilogue as *const cublasLtEpilogue_t as *const c_void,
                std::mem::size_of::<cublasLtEpilogue_t>(),
            )
            .map_err(lt_err("epilogue"))?;
            if matches!(key.epilogue, Epilogue::GeluAux { .. }) && key.inputs == Inputs::Fp8([Fp8::E4M3; 2]) {
                // The MLP's first product in FP8 adds the tensor cores' partial sums in their
                // own precision instead of promoting them to f32 every few blocks of K (its
                // output goes through GELU into E4M3): 1.15x faster at GPT-2 124M's shape on an
                // H100, an error of 0.12% of the output's norm; the 2000-step FP8 loss stays
                // within 0.8% of bf16's. On every forward product it drifted past 1.8%, so the
                // other products keep the promotion.
                let fast: i8 = 1;
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    &fast as *const i8 as *const c_void,
                    1,
                )
                .map_err(lt_err("fast accumulation"))?;
            }
            if let Some(bias) = ops.bias {
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias)?;
            }
            if let Some(aux) = ops.aux {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                    &aux_ld as *const i64 as *const c_void,
                    8,
                )
                .map_err(lt_err("aux leading dimension"))?;
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux)?;
            }
            if let Some((_, [scale, amax])) = ops.output {
                // Beside an FP8 D, the bias and the auxiliary matrix keep the activation type.
                for (attr, what) in [
                    (Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, "bias type"),
                    (Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, "aux type"),
                ] {
                    let size = std::mem::size_of::<cudaDataType>();
                    lt::set_matmul_desc_attribute(
                        plan.desc,
                        attr,
                        &elem_t as *const cudaDataType as *const c_void,
                        size,
                    )
                    .map_err(lt_err(what))?;
                }
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, scale)?;
                set_pointer(plan.desc, Attr::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax)?;
            }
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
            let found = if !ok {
                None
            } else {
                let c = if plan.c.is_null() { plan.d } else { plan.c };
                lt::get_matmul_algo_heuristic(self.handle, plan.desc, plan.a, plan.b, c, plan.d, pref)
                    .ok()
                    .map(|h| h.algo)
            };
            let _ = lt::destroy_matmul_pref(pref);
            if found.is_none() && key.epilogue.says_fallback() {
                // Said once per key: the step then runs GELU in its own kernels, more slowly.
                eprintln!(
                    "cuBLASLt has no algorithm for the {:?} epilogue at {}x{}x{} ({:?}): GELU runs unfused there",
                    key.epilogue, m, n, k, self.act
                );
            }
            Ok(found.map(|algo| {
                plan.algo = algo;
                plan
            }))
        }
    }
}

use cublasLtMatmulDescAttributes_t as Attr;

/// Sets a pointer attribute (the bias's, the auxiliary matrix's, a scale's) of `desc` to `p`.
///
/// # Safety
/// `desc` is a live descriptor.
unsafe fn set_pointer<T>(desc: lt_sys::cublasLtMatmulDesc_t, attr: Attr, p: DevPtr<T>) -> Result<()> {
    let ptr = p.addr() as *const c_void;
    // SAFETY: a live descriptor; a pointer attribute gets a pointer-sized value.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            &ptr as *const *const c_void as *const c_void,
            std::mem::size_of::<*const c_void>(),
        )
    }
    .map_err(lt_err("set a pointer"))
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

/// An FP8 product's operands, row-major out (R,S) = x (R,K) · yᵀ as cuBLASLt's column-major
/// outᵀ = op(y) · xᵀ: y is A, x is B, and so are their scales; `aux` the GELU epilogue's
/// pre-activation.
fn fp8_operands(
    out: DevPtr<Act>,
    aux: Option<DevPtr<Act>>,
    [x, y]: [DevPtr<u8>; 2],
    bias: Option<DevPtr<Act>>,
    [dx, dy]: [DevPtr; 2],
) -> Operands {
    Operands {
        a: y.cast(),
        b: x.cast(),
        d: out,
        bias,
        aux,
        scales: Some([dy, dx]),
        output: None,
        f32_out: None,
    }
}

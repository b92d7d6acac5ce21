//! The MLP workload's step, whole on the device (`mnist/fused.rs`): the batch cut from a
//! data set kept in device memory, each hidden layer's product through ReLU, the loss and
//! the step's scalars, and SGD fused into the backward pass. Ops of their own, apart from
//! [`Backend`]'s, which GPT-2 and the MLP's other paths share; both backends implement them.

use super::{bf16, Act, Backend, SgdHyper, Span};

pub trait FusedMlp: Backend {
    /// A hidden layer's product through ReLU: `pre (BT,OC) = inp (BT,C) · wᵀ + bias` and
    /// `out = relu(pre)` (the MLP workload's). By default the two ops, both written; a backend
    /// may fuse ReLU into the product's epilogue (CUDA: cuBLASLt's RELU_BIAS) and then leave
    /// `pre` unwritten: callers read `out` only.
    /// # Operands
    /// As `matmul_forward`; `pre`, `out`: BT·OC each, distinct.
    #[allow(clippy::too_many_arguments)]
    fn matmul_relu_forward(
        &self,
        pre: Span<Act>,
        out: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bias: Option<Span<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        self.matmul_forward(pre, inp, w, bias, bt, c, oc);
        self.relu_forward(out, pre, bt * oc);
    }

    /// The step's batch, cut on the device from a data set kept there: row r of `out` (rows,
    /// size) is image `order[s·rows + r]` of `images` (`size` u8 pixels each) scaled to [0, 1]
    /// (`p / 255` in f32, as the host's gather computes it, then stored as an activation), and
    /// `targets[r]` is its label in `labels`, where s is the step within the epoch: the
    /// [`StepState`](super::StepState) step at `state` mod `steps`. Nothing is read back.
    /// # Operands
    /// `out`: rows·size activations; `targets`: rows; `order`: steps·rows; `state`:
    /// [`StepState::WORDS`](super::StepState::WORDS).
    /// # Safety
    /// Every index in `order` is an image of `images` (`size` bytes each) and of `labels`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gather_batch(
        &self,
        out: Span<Act>,
        targets: Span<i32>,
        images: Span<u8>,
        labels: Span<u8>,
        order: Span<i32>,
        state: Span,
        rows: usize,
        size: usize,
        steps: usize,
    );
    /// The classifier's loss and the step's scalars, for a step whose update runs inside its
    /// backward pass (so with no gradient norm before it): `losses (rows) =
    /// crossentropy_forward(logits (rows, V), targets)`, their `mean` into the [`StepState`](super::StepState)'s
    /// `loss`, then the logits overwritten by their gradient as `crossentropy_backward_in_place`
    /// with `dloss` writes it. In the state: `norm` and `sumsq` 0, `clip` 1, `apply` 1 when the
    /// loss is finite (else 0), `lr = schedule[s]`, (loss, 0) into `history[2·(step mod
    /// history_len)..]`, then `step` + 1; s is the step within the epoch (step mod `steps`).
    /// The same values as those ops compute, bit for bit.
    /// # Operands
    /// `logits`: rows·V activations; `losses`, `targets`: rows; `state`:
    /// [`StepState::WORDS`](super::StepState::WORDS); `schedule`: `steps`; `history`: 2·`history_len`.
    /// # Safety
    /// Every id in `targets` is below V.
    #[allow(clippy::too_many_arguments)]
    unsafe fn loss_step(
        &self,
        logits: Span<Act>,
        losses: Span,
        targets: Span<i32>,
        state: Span,
        schedule: Span,
        history: Span,
        history_len: usize,
        rows: usize,
        v: usize,
        steps: usize,
        dloss: f32,
    );
    /// A Linear layer's input gradient through the ReLU before it: `dinp (BT,C) = (dout (BT,OC)
    /// · w (OC,C)) ⊙ [act > 0]`, OVERWRITTEN, where `act` (BT,C) is the ReLU's output (> 0
    /// exactly where its input is): what `matmul_backward`'s dinp and then `relu_backward`
    /// compute into zeroed buffers.
    /// # Operands
    /// `dinp`, `act`: BT·C; `dout`: BT·OC; `w`: OC·C activations; `dinp` overlaps nothing else.
    #[allow(clippy::too_many_arguments)]
    fn matmul_backward_relu(
        &self,
        dinp: Span<Act>,
        dout: Span<Act>,
        w: Span<Act>,
        act: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// SGD fused into the backward pass: a Linear layer's gradients `dw (OC,C) = doutᵀ · inp`
    /// and `db (OC) = Σ_rows dout`, applied at once as [`Backend::sgd`] applies gradients (the
    /// [`StepState`](super::StepState)'s lr and clipping factor, nothing when its `apply` is 0), `hp.weight_decay`
    /// on the weights and none on the biases, to `params`: w (OC,C) then b (OC), the MLP's
    /// layout, with their momentum `velocity` (the same layout), and with `copy` the updated
    /// values rounded to bf16 there too. `grads` is the layer's slice of the gradient buffer
    /// (OC·C + OC f32s), which the op may use as scratch: unspecified afterwards.
    /// # Operands
    /// `params`, `velocity`, `grads`, `copy`: OC·C + OC elements; `dout`: BT·OC; `inp`: BT·C
    /// activations; `state`: [`StepState::WORDS`](super::StepState::WORDS); the parameters (and their copy) are not
    /// read by `dout` or `inp`.
    #[allow(clippy::too_many_arguments)]
    fn linear_sgd(
        &self,
        params: Span,
        velocity: Span,
        grads: Span,
        copy: Option<Span<bf16>>,
        dout: Span<Act>,
        inp: Span<Act>,
        state: Span,
        hp: SgdHyper,
        bt: usize,
        c: usize,
        oc: usize,
    );
}

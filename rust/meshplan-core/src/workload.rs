//! The training workload: batch, sequence length, precision, optimizer.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::Precision;
use crate::limits;

/// Optimizer whose state sits beside the weights (docs/costmodel.md §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// Mixed-precision Adam/AdamW: fp32 master weights, m and v (12 bytes per parameter).
    #[default]
    Adam,
    /// Mixed-precision SGD with momentum: fp32 master weights and momentum (8 bytes per parameter).
    SgdMomentum,
}

impl Optimizer {
    /// Bytes of optimizer state (including the fp32 master copy) per parameter.
    pub fn state_bytes_per_param(self) -> f64 {
        match self {
            Optimizer::Adam => 12.0,
            Optimizer::SgdMomentum => 8.0,
        }
    }
}

/// What is being trained, independent of how it is split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Sequences per optimizer step.
    pub global_batch: u32,
    /// Tokens per sequence.
    pub seq_len: u32,
    #[serde(default)]
    pub precision: Precision,
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Bytes per element of the gradient reduction and of the main-gradient buffer: 4 (fp32,
    /// Megatron's default with bf16) or 2 (`--no-grad-reduce-in-fp32`, DeepSpeed) [MEG-DISTOPT].
    #[serde(default = "default_grad_bytes")]
    pub grad_bytes: u32,
    /// LoRA fine-tuning: the base weights are frozen, so there are no weight-gradient GEMMs,
    /// no gradients or optimizer state for them and no data-parallel gradient reduction (the
    /// adapters are small enough to neglect).
    #[serde(default)]
    pub lora: bool,
    /// Fused (flash) attention: no `a·s²` score tensors are stored or moved, and the causal
    /// mask halves the work. `false` models the unfused softmax of pre-2023 Megatron
    /// (Korthikanti et al. 2022 §4.1: `5·a·s²·b` bytes stored per layer).
    #[serde(default = "yes")]
    pub flash_attention: bool,
    /// Fused cross-entropy (Megatron's vocab-parallel loss, Liger/chunked losses): the loss
    /// keeps an fp32 softmax and briefly the bf16 logits and their gradient, 8 bytes per
    /// logit. `false` models eager PyTorch `F.cross_entropy` on an fp32 upcast of the logits
    /// (torchtitan, Dec 2024): fp32 copy, log-softmax and their gradients plus the bf16
    /// gradient, 14 bytes per logit at the start of the backward (§2.4.4).
    #[serde(default = "yes")]
    pub fused_cross_entropy: bool,
    /// The fused loss computes its gradient during the forward into the 16-bit logits and
    /// keeps only them: 2 bytes per logit, nothing more at the backward (TransformerEngine's
    /// `parallel_cross_entropy`, Megatron `--cross-entropy-fusion-impl te`; TE ≤ 2.11
    /// `CrossEntropyFunction` saves the in-place gradient) (§2.4.4). Needs
    /// `fused_cross_entropy`.
    #[serde(default)]
    pub cross_entropy_in_place: bool,
    /// The training stack that runs the plan (a table of `data/stacks.toml`): how it times
    /// the plan and which plans it can run.
    #[serde(default = "default_stack_name")]
    pub stack: String,
    /// Parameters per data-parallel gradient bucket (Megatron `--ddp-bucket-size`); `None`
    /// takes the stack's default, `max(40 M, 1 M · data-parallel ranks)` for Megatron-Core
    /// (docs/costmodel.md §3.6). Fewer, larger buckets pay less latency but expose more of the
    /// last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_params: Option<u32>,
    /// Routing imbalance λ: tokens routed to the busiest expert-parallel rank over the mean
    /// (≥ 1; docs/costmodel.md §1.2). A property of the router and the recipe, not of the GPU:
    /// [`DEFAULT_MOE_IMBALANCE`] for aux-loss (or aux-loss-free) balanced dropless training,
    /// 1 for runs that force-balance routing (Megatron-Bridge's MoE benchmarks) or drop tokens
    /// at capacity factor 1. Scales the routed experts' GEMMs, activations and dispatch.
    #[serde(default = "default_moe_imbalance")]
    pub moe_imbalance: f64,
}

/// Default routing imbalance λ: the busiest EP rank gets 10 % more routed tokens than the mean
/// under aux-loss balancing (dropless) [derived: the value meshplan assumed per GPU before it
/// became a workload field; framework-behaviour assumption, docs/costmodel.md §1.2].
pub const DEFAULT_MOE_IMBALANCE: f64 = 1.1;

fn default_moe_imbalance() -> f64 {
    DEFAULT_MOE_IMBALANCE
}

fn default_stack_name() -> String {
    crate::stack::DEFAULT_STACK.to_string()
}

fn yes() -> bool {
    true
}

fn default_grad_bytes() -> u32 {
    4
}

impl Workload {
    /// A workload with default precision (bf16), optimizer (Adam) and fp32 gradients.
    pub fn new(global_batch: u32, seq_len: u32) -> Self {
        Workload {
            global_batch,
            seq_len,
            precision: Precision::Bf16,
            optimizer: Optimizer::Adam,
            grad_bytes: default_grad_bytes(),
            lora: false,
            flash_attention: true,
            fused_cross_entropy: true,
            cross_entropy_in_place: false,
            stack: default_stack_name(),
            bucket_params: None,
            moe_imbalance: DEFAULT_MOE_IMBALANCE,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        limits::check("workload.global_batch", self.global_batch)?;
        limits::check("workload.seq_len", self.seq_len)?;
        limits::check("workload.grad_bytes", self.grad_bytes)?;
        limits::check_opt("workload.bucket_params", self.bucket_params)?;
        crate::hardware::check_fraction(
            "workload.moe_imbalance",
            self.moe_imbalance,
            1.0,
            limits::MAX_MOE_IMBALANCE,
        )?;
        if self.cross_entropy_in_place && !self.fused_cross_entropy {
            return Err(Error::invalid(
                "workload.cross_entropy_in_place",
                true,
                "false unless fused_cross_entropy is true (the in-place gradient is a fused loss's)",
            ));
        }
        if self.grad_bytes != 2 && self.grad_bytes != 4 {
            return Err(Error::invalid(
                "workload.grad_bytes",
                self.grad_bytes,
                "2 or 4",
            ));
        }
        crate::stack::Stack::named(&self.stack)?;
        Ok(())
    }

    /// The workload's stack profile; the default stack when the name is unknown, which
    /// [`Workload::validate`] (run by [`crate::Problem::new`]) rules out.
    pub fn stack_profile(&self) -> &'static crate::stack::Stack {
        crate::stack::Stack::named(&self.stack)
            .unwrap_or_else(|_| crate::stack::Stack::default_stack())
    }

    /// Tokens per optimizer step.
    pub fn tokens_per_step(&self) -> f64 {
        self.global_batch as f64 * self.seq_len as f64
    }
}

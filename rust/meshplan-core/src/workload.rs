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
    /// LoRA fine-tuning (docs/costmodel.md §2.7): the base weights are frozen (no
    /// weight-gradient GEMMs, gradients or optimizer state for them; a frozen linear stores no
    /// input for the backward unless an adapter reads it), and rank-`lora_rank` adapters on the
    /// `lora_targets` linears are trained like any weight.
    #[serde(default)]
    pub lora: bool,
    /// LoRA adapter rank `r` (read only under `lora`). Default 32: Megatron-Bridge's
    /// `LoRA.dim` (src/megatron/bridge/peft/lora.py), the recipe of the LoRA runs in
    /// validation/cases.json that do not state theirs.
    #[serde(default = "default_lora_rank")]
    pub lora_rank: u32,
    /// Linears that carry an adapter (read only under `lora`). Default every linear of the
    /// layers in Megatron's fused form (`qkv, o, fc1, fc2`): Megatron-Bridge's `target_modules`
    /// `linear_qkv, linear_proj, linear_fc1, linear_fc2`; torchtune's `lora_attn_modules` and
    /// `apply_lora_to_mlp` name separate ones (`q, k, v, o, mlp`).
    #[serde(default = "default_lora_targets")]
    pub lora_targets: Vec<LoraTarget>,
    /// Storage of the frozen base weights of the layers' linears under `lora`: `bf16` (the
    /// working copy), `fp8` (Transformer Engine `fp8_model_init`: FP8-only weights) or `nf4`
    /// (QLoRA's 4-bit NormalFloat with double quantisation, 4.127 bits per parameter).
    #[serde(default)]
    pub lora_base: BaseWeights,
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
    /// The low-precision recipe (a table of `data/precision.toml`): which linear layers an
    /// FP8/FP4 run keeps in BF16 or runs in MXFP8 (docs/costmodel.md §1.4). `None`: every
    /// linear layer of the layer stack at `precision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision_recipe: Option<String>,
    /// CUDA graphs of the run (docs/costmodel.md §5.5): `none`, `partial` (per-layer scopes
    /// that leave the routed experts eager: Megatron's `attn`, `moe_router`, `moe_preprocess`)
    /// or `full` (graphs that cover the MoE block: per-layer whole-layer graphs with token drop
    /// and padding, or full-iteration graphs). Only `full` removes the host-issue floor of a
    /// dropless MoE layer.
    #[serde(default, skip_serializing_if = "CudaGraphs::is_none")]
    pub cuda_graphs: CudaGraphs,
}

/// How much of a training step runs as replayed CUDA graphs (see [`Workload::cuda_graphs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaGraphs {
    /// Every kernel launched by the host, eagerly.
    #[default]
    None,
    /// Some per-layer scopes graphed; the routed experts, dispatch and combine eager.
    Partial,
    /// The MoE block graphed too (or the whole iteration).
    Full,
}

impl CudaGraphs {
    pub fn is_none(&self) -> bool {
        *self == CudaGraphs::None
    }
}

/// A linear (or fused linear) that can carry a LoRA adapter, in the two conventions the
/// frameworks use: separate adapters on the query, key and value projections (`q`, `k`, `v`:
/// HF PEFT's `q_proj`…, torchtune's `lora_attn_modules`) or one on the fused QKV projection
/// (`qkv`: Megatron's `linear_qkv`); the output projection (`o`); separate adapters on the
/// FFN's gate, up and down (`mlp`: torchtune's `apply_lora_to_mlp`, PEFT's `gate_proj`,
/// `up_proj`, `down_proj`) or one on the fused gate/up (`fc1`: Megatron's `linear_fc1`) and one
/// on the down projection (`fc2`: `linear_fc2`). FFN targets include the routed experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoraTarget {
    Q,
    K,
    V,
    Qkv,
    O,
    Mlp,
    Fc1,
    Fc2,
}

impl LoraTarget {
    /// Every target, in order.
    pub const ALL: [LoraTarget; 8] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::Qkv,
        LoraTarget::O,
        LoraTarget::Mlp,
        LoraTarget::Fc1,
        LoraTarget::Fc2,
    ];

    /// Megatron-Bridge's default `target_modules`: `linear_qkv`, `linear_proj`, `linear_fc1`,
    /// `linear_fc2` (src/megatron/bridge/peft/lora.py `LoRA`).
    pub const MEGATRON_DEFAULT: [LoraTarget; 4] = [
        LoraTarget::Qkv,
        LoraTarget::O,
        LoraTarget::Fc1,
        LoraTarget::Fc2,
    ];

    /// The target's name (`q`, `k`, `v`, `qkv`, `o`, `mlp`, `fc1`, `fc2`).
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::Qkv => "qkv",
            LoraTarget::O => "o",
            LoraTarget::Mlp => "mlp",
            LoraTarget::Fc1 => "fc1",
            LoraTarget::Fc2 => "fc2",
        }
    }

    /// The target named `name`, or an error naming the allowed ones.
    pub fn parse(name: &str) -> Result<Self> {
        LoraTarget::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                Error::invalid(
                    "workload.lora_targets",
                    name,
                    "q, k, v, qkv, o, mlp, fc1 or fc2",
                )
            })
    }
}

/// How the frozen base weights of the layers' linears are stored under LoRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaseWeights {
    /// The 16-bit working copy.
    #[default]
    Bf16,
    /// FP8 only (Transformer Engine `fp8_model_init`, Megatron `--fp8-param-gather`): 1 byte.
    Fp8,
    /// 4-bit NormalFloat, blocks of 64 with an 8-bit absmax each and an fp32 scale per 256
    /// blocks: `4 + 8/64 + 32/(64·256) = 4.127` bits (Dettmers et al. 2023, QLoRA §3 "Double
    /// Quantization", arXiv:2305.14314; torchao `NF4Tensor` block 64, scaler block 256 in
    /// torchtune's QLoRA).
    Nf4,
}

impl BaseWeights {
    /// Stored bytes per frozen base parameter.
    pub fn bytes_per_param(self) -> f64 {
        match self {
            BaseWeights::Bf16 => 2.0,
            BaseWeights::Fp8 => 1.0,
            BaseWeights::Nf4 => (4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0)) / 8.0,
        }
    }

    /// The format's name.
    pub fn name(self) -> &'static str {
        match self {
            BaseWeights::Bf16 => "bf16",
            BaseWeights::Fp8 => "fp8",
            BaseWeights::Nf4 => "nf4",
        }
    }
}

/// Default LoRA rank (see [`Workload::lora_rank`]).
pub const DEFAULT_LORA_RANK: u32 = 32;

fn default_lora_rank() -> u32 {
    DEFAULT_LORA_RANK
}

fn default_lora_targets() -> Vec<LoraTarget> {
    LoraTarget::MEGATRON_DEFAULT.to_vec()
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
            lora_rank: DEFAULT_LORA_RANK,
            lora_targets: default_lora_targets(),
            lora_base: BaseWeights::Bf16,
            flash_attention: true,
            fused_cross_entropy: true,
            cross_entropy_in_place: false,
            stack: default_stack_name(),
            bucket_params: None,
            moe_imbalance: DEFAULT_MOE_IMBALANCE,
            precision_recipe: None,
            cuda_graphs: CudaGraphs::None,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        limits::check("workload.global_batch", self.global_batch)?;
        limits::check("workload.seq_len", self.seq_len)?;
        limits::check("workload.grad_bytes", self.grad_bytes)?;
        limits::check_opt("workload.bucket_params", self.bucket_params)?;
        limits::check("workload.lora_rank", self.lora_rank)?;
        if self.lora && self.lora_targets.is_empty() {
            return Err(Error::invalid(
                "workload.lora_targets",
                "[]",
                "one or more of q, k, v, qkv, o, mlp, fc1, fc2",
            ));
        }
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
        if let Some(name) = &self.precision_recipe {
            let recipe = crate::precision::PrecisionRecipe::named(name)?;
            if recipe.fused_expert_mlp && self.precision != Precision::Mxfp8 {
                return Err(Error::invalid(
                    "workload.precision_recipe",
                    name,
                    "a recipe without fused_expert_mlp: the fused expert MLP runs in MXFP8 only \
                     (workload.precision mxfp8)",
                ));
            }
        }
        Ok(())
    }

    /// The workload's stack profile; the default stack when the name is unknown, which
    /// [`Workload::validate`] (run by [`crate::Problem::new`]) rules out.
    pub fn stack_profile(&self) -> &'static crate::stack::Stack {
        crate::stack::Stack::named(&self.stack)
            .unwrap_or_else(|_| crate::stack::Stack::default_stack())
    }

    /// The LoRA adapters of every layer, `None` for full training.
    pub fn adapters(&self) -> Option<crate::layer::Adapters> {
        if !self.lora {
            return None;
        }
        let has = |t: LoraTarget| self.lora_targets.contains(&t);
        Some(crate::layer::Adapters {
            rank: self.lora_rank as f64,
            q: has(LoraTarget::Q),
            k: has(LoraTarget::K),
            v: has(LoraTarget::V),
            qkv: has(LoraTarget::Qkv),
            o: has(LoraTarget::O),
            mlp: has(LoraTarget::Mlp),
            fc1: has(LoraTarget::Fc1),
            fc2: has(LoraTarget::Fc2),
        })
    }

    /// Bytes per frozen base parameter of the layers' linears (2 without LoRA).
    pub fn base_weight_bytes(&self) -> f64 {
        if self.lora {
            self.lora_base.bytes_per_param()
        } else {
            2.0
        }
    }

    /// Tokens per optimizer step.
    pub fn tokens_per_step(&self) -> f64 {
        self.global_batch as f64 * self.seq_len as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nf4_stores_4_127_bits_per_weight() {
        // QLoRA §3: 4 bits + 8/64 (8-bit absmax per block of 64) + 32/(64·256) (an fp32 scale
        // per 256 blocks) = 4.127 bits.
        assert_eq!(BaseWeights::Nf4.bytes_per_param(), 4.126953125 / 8.0);
        assert_eq!(BaseWeights::Fp8.bytes_per_param(), 1.0);
        assert_eq!(BaseWeights::Bf16.bytes_per_param(), 2.0);
    }

    #[test]
    fn lora_fields_default_to_megatron_bridge_and_validate() {
        let w: Workload =
            serde_json::from_str(r#"{"global_batch": 8, "seq_len": 4096, "lora": true}"#).unwrap();
        assert_eq!(w.lora_rank, 32);
        assert_eq!(w.lora_targets, LoraTarget::MEGATRON_DEFAULT.to_vec());
        assert_eq!(w.lora_base, BaseWeights::Bf16);
        let ad = w.adapters().unwrap();
        assert!(ad.qkv && ad.o && ad.fc1 && ad.fc2 && ad.rank == 32.0);
        assert!(!ad.q && !ad.k && !ad.v && !ad.mlp);
        assert!(Workload::new(8, 4096).adapters().is_none());
        let mut bad = w.clone();
        bad.lora_rank = 0;
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("workload.lora_rank"));
        bad.lora_rank = 8;
        bad.lora_targets.clear();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("workload.lora_targets"));
        assert!(LoraTarget::parse("x")
            .unwrap_err()
            .to_string()
            .contains("qkv, o, mlp, fc1 or fc2"));
        assert_eq!(LoraTarget::parse("fc1").unwrap(), LoraTarget::Fc1);
        let q: Workload = serde_json::from_str(
            r#"{"global_batch": 8, "seq_len": 4096, "lora": true, "lora_targets": ["q", "v"], "lora_base": "nf4"}"#,
        )
        .unwrap();
        assert_eq!(q.lora_targets, vec![LoraTarget::Q, LoraTarget::V]);
        assert_eq!(q.base_weight_bytes(), BaseWeights::Nf4.bytes_per_param());
    }
}

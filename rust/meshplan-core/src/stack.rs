//! Training-stack behaviour: how a framework runs a plan, apart from the GPU it runs on (issue 16;
//! docs/costmodel.md §2.5, §3.6, §5.3). Device calibration (per GPU and precision) is in
//! [`crate::hardware::Calibration`] and [`crate::device`]; what a framework does — its DDP
//! buckets, FSDP units, kernel counts, casts, loss kernel, layer split — is a [`Stack`], read from
//! `data/stacks.toml` (each value with its source there). [`Stack::default_stack`] is
//! `megatron-core`, whose values reproduce the cost model's numbers exactly; a new stack is a new
//! table in that file.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::{check_fraction, check_positive};

/// The default stack's name.
pub const DEFAULT_STACK: &str = "megatron-core";

const STACKS_TOML: &str = include_str!("../data/stacks.toml");

/// How pipeline ranks split the layers (§2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerSplit {
    /// Megatron's `account_for_embedding/loss_in_pipeline_split`: when `L` is not a multiple
    /// of the rank count, the first and last ranks take one layer fewer
    /// ([`crate::stages::layer_counts`]).
    MegatronEmbeddingLoss,
}

/// A training stack's behaviour; the field docs say where each value enters the cost model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stack {
    pub name: String,
    /// Parameters per data-parallel gradient bucket at least, each bucket a collective of its
    /// own (§3.6); a workload's `bucket_params` overrides the bucket size.
    pub ddp_bucket_params: f64,
    /// Parameters per bucket per rank of the data-parallel group: the bucket is
    /// `max(ddp_bucket_params, this · group size)` (Megatron's default, §3.6).
    pub ddp_bucket_params_per_rank: f64,
    /// Buckets are reduced as the backward produces them (Megatron `overlap_grad_reduce`),
    /// rather than after it (§3.6).
    pub overlap_grad_reduce: bool,
    /// The ZeRO-1/2 weight all-gather runs bucket by bucket under the next step's forward
    /// (Megatron `overlap_param_gather`), rather than after the optimizer step (§3.6).
    pub overlap_param_gather: bool,
    /// FSDP units per transformer layer under ZeRO-3, each gathered and reduce-scattered as a
    /// collective of its own (§3.6).
    pub fsdp_units_per_layer: f64,
    /// Host and launch time of an MoE layer over that of a dense one (§5.3).
    pub moe_layer_kernel_factor: f64,
    /// Bytes moved per element cast from 16 bits to 8 by FP8/FP4 linears (§5.3).
    pub quantized_cast_bytes: f64,
    /// Bytes moved per element of the transposed FP8 copy of a linear's input (§5.3).
    pub quantized_transpose_bytes: f64,
    /// Bytes moved per attention-score element by unfused softmax and dropout, forward (§5.3).
    pub unfused_score_bytes: f64,
    /// Flash-attention backward over forward matmul work (§5.2).
    pub attention_backward_ratio: f64,
    /// Passes over the fp32 logits by the softmax cross-entropy, 4 bytes per logit each (§5.3).
    pub cross_entropy_passes: f64,
    /// Bytes per hidden element the embedding lookup moves per token (§5.3).
    pub embedding_bytes_per_element: f64,
    /// Element-wise bytes per token and per `h` of a layer's forward outside the tensor-parallel
    /// regions — the two norms, residual adds and dropout — which every TP rank repeats on the
    /// whole sequence unless sequence parallelism splits it (§5.3); the rest of the GPU's
    /// `elementwise_bytes_per_hidden` is split `tp` ways either way.
    pub replicated_elementwise_bytes_per_hidden: f64,
    /// Bytes per element of a routed copy's hidden vector moved by permute and unpermute (§5.3).
    pub routed_copy_bytes_per_hidden: f64,
    /// Bytes per element of a routed copy's `f_e/t` width moved by the expert activation (§5.3).
    pub expert_activation_bytes_per_width: f64,
    /// Fraction of tensor-parallel communication hidden behind GEMMs (§3.4 ω_TP); a GPU's
    /// `calibration.tp_overlap`, when set, takes precedence.
    pub tp_overlap: f64,
    /// Share of the compute a DP/ZeRO collective runs under that hides it (§3.6 ω_DP): 1 when
    /// communication and compute share the GPU without slowing each other; a GPU's
    /// `calibration.dp_overlap`, when set, takes precedence.
    pub dp_overlap: f64,
    /// How pipeline ranks split the layers (§2.5).
    pub layer_split: LayerSplit,
}

impl Stack {
    /// Checks every value is finite and positive; the error names the stack and the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("ddp_bucket_params", self.ddp_bucket_params),
            (
                "ddp_bucket_params_per_rank",
                self.ddp_bucket_params_per_rank,
            ),
            ("fsdp_units_per_layer", self.fsdp_units_per_layer),
            ("moe_layer_kernel_factor", self.moe_layer_kernel_factor),
            ("quantized_cast_bytes", self.quantized_cast_bytes),
            ("quantized_transpose_bytes", self.quantized_transpose_bytes),
            ("unfused_score_bytes", self.unfused_score_bytes),
            ("attention_backward_ratio", self.attention_backward_ratio),
            ("cross_entropy_passes", self.cross_entropy_passes),
            (
                "embedding_bytes_per_element",
                self.embedding_bytes_per_element,
            ),
            (
                "replicated_elementwise_bytes_per_hidden",
                self.replicated_elementwise_bytes_per_hidden,
            ),
            (
                "routed_copy_bytes_per_hidden",
                self.routed_copy_bytes_per_hidden,
            ),
            (
                "expert_activation_bytes_per_width",
                self.expert_activation_bytes_per_width,
            ),
        ] {
            check_positive(&format!("stack.{}.{field}", self.name), v)?;
        }
        for (field, v) in [
            ("tp_overlap", self.tp_overlap),
            ("dp_overlap", self.dp_overlap),
        ] {
            check_fraction(&format!("stack.{}.{field}", self.name), v, 0.0, 1.0)?;
        }
        Ok(())
    }

    /// Parameters per DP gradient bucket over a data-parallel group of `ranks`:
    /// `max(ddp_bucket_params, ddp_bucket_params_per_rank · ranks)` (§3.6).
    pub fn bucket_params(&self, ranks: u32) -> f64 {
        self.ddp_bucket_params
            .max(self.ddp_bucket_params_per_rank * ranks as f64)
    }

    /// The stack called `name` in `data/stacks.toml` (case-insensitive, `_` for `-`).
    pub fn named(name: &str) -> Result<&'static Stack> {
        let table = stacks().as_ref().map_err(Clone::clone)?;
        let key = name.trim().to_lowercase().replace('_', "-");
        table.get(&key).ok_or_else(|| {
            Error::invalid(
                "stack",
                name,
                format!(
                    "one of {}",
                    table.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// The default stack, `megatron-core` (its values reproduce the cost model of docs/costmodel.md).
    pub fn default_stack() -> &'static Stack {
        Stack::named(DEFAULT_STACK).expect("data/stacks.toml has a valid megatron-core table")
    }
}

type Table = std::result::Result<std::collections::BTreeMap<String, Stack>, Error>;

fn stacks() -> &'static Table {
    static STACKS: OnceLock<Table> = OnceLock::new();
    STACKS.get_or_init(|| {
        crate::presets::parse_table(STACKS_TOML, "data/stacks.toml", Stack::validate)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_core_is_the_default_and_holds_the_cost_model_values() {
        let s = Stack::default_stack();
        assert_eq!(s.name, "megatron-core");
        assert_eq!(s.ddp_bucket_params, 40e6);
        assert_eq!(s.fsdp_units_per_layer, 1.0);
        assert_eq!(s.moe_layer_kernel_factor, 2.0);
        assert_eq!(s.attention_backward_ratio, 2.5);
        assert_eq!(s.layer_split, LayerSplit::MegatronEmbeddingLoss);
        assert_eq!(s.tp_overlap, 0.7);
        assert_eq!(s.dp_overlap, 1.0);
        assert!(s.overlap_grad_reduce && s.overlap_param_gather);
        // Megatron's max(40 M, 1 M · data-parallel size).
        assert_eq!(s.bucket_params(8), 40e6);
        assert_eq!(s.bucket_params(256), 256e6);
    }

    #[test]
    fn an_overlap_outside_zero_to_one_is_rejected_with_its_field() {
        let mut s = Stack::default_stack().clone();
        s.dp_overlap = 1.5;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("dp_overlap"), "{e}");
        s.dp_overlap = f64::NAN;
        assert!(s.validate().is_err());
    }

    #[test]
    fn a_gpu_override_takes_precedence_over_the_stack() {
        let stack = Stack::default_stack();
        let mut cal = crate::presets::gpu("h100-sxm").unwrap().calibration.clone();
        assert_eq!(cal.tp_overlap, None);
        assert_eq!(cal.tp_overlap_under(stack), stack.tp_overlap);
        cal.tp_overlap = Some(0.25);
        cal.dp_overlap = Some(0.0);
        assert_eq!(cal.tp_overlap_under(stack), 0.25);
        assert_eq!(cal.dp_overlap_under(stack), 0.0);
    }

    #[test]
    fn an_unknown_stack_names_the_known_ones() {
        let e = Stack::named("deepspeed-0.1").unwrap_err().to_string();
        assert!(e.contains("megatron-core"), "{e}");
    }

    #[test]
    fn a_non_positive_value_is_rejected_with_its_field() {
        let mut s = Stack::default_stack().clone();
        s.cross_entropy_passes = 0.0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("cross_entropy_passes"), "{e}");
    }
}

//! The serving planner (docs/serving.md, issue 14): a sibling of the training planner over the
//! same shared modules. A [`ServingProblem`] (model, cluster, weight and KV-cache precision,
//! traffic, SLOs) and a [`ServingPlan`] (per-worker TP, PP, attention-DP, EP, expert-TP, the
//! batch, aggregated or disaggregated prefill/decode pools, replicas) give an evaluation
//! ([`evaluate_serving`]): memory per GPU and how many sequences fit (`memory`), TTFT, TPOT and
//! throughput from a roofline of the linear layers and attention on the [`crate::device::Device`]
//! and the collectives on the [`crate::comm::Fabric`] (`time`); [`search_serving`] enumerates
//! deployments, prunes by memory and the NVLink domain and ranks the ones meeting the SLOs,
//! with the Pareto front of tokens/s per GPU against tokens/s per user; [`explain_serving`]
//! says per axis what is sharded, which collective runs, bytes per token and which fabric.
//!
//! Layer shapes and parameter counts come from `layer` (the same [`crate::layer::layer_ops`]
//! training sums), GEMM efficiency from `gemm`, groups from `mesh`/`layout`, collective costs
//! only through [`crate::comm::CollectiveModel`]. The serving-only constants (memory policy,
//! scheduler and launch overheads, the decode bandwidth fraction) live in
//! `data/serving.toml`, each with its source.

mod evaluate;
mod explain;
mod memory;
mod plan;
mod problem;
mod queue;
mod search;
mod time;

use std::sync::OnceLock;

pub use evaluate::{evaluate_serving, evaluate_serving_with, ServingEvaluation, ServingViolation};
pub use explain::{explain_serving, ServingAxis, ServingExplanation};
pub use memory::ServingMemory;
pub use plan::{AttentionKernel, ServingPlan, SlidingKv, Worker};
pub use problem::{
    bytes_per_element, Arrival, ExpertWeights, LengthClass, LengthMix, Objective, ServingProblem,
    Slo, Traffic, WeightScaling, MAX_LENGTH_CLASSES,
};
pub use search::{search_serving, ServingSearchResult, ServingSearchStats, ServingSpace};
pub use time::{PhaseTime, ServingTime};

const SERVING_TOML: &str = include_str!("../../data/serving.toml");

/// The constants of `data/serving.toml` (each field's source is cited there).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingConstants {
    /// Share of HBM the engine may fill (weights, workspace and KV cache).
    pub gpu_memory_utilization: f64,
    /// Tokens of one forward pass (the prefill chunk).
    pub max_batched_tokens: f64,
    /// Live 16-bit activations per token of one forward, in units of `h`, beyond the FFN's.
    pub workspace_hidden_multiple: f64,
    /// NVFP4 block-scale bytes per element.
    pub nvfp4_scale_bytes_per_element: f64,
    /// MXFP8 block-scale bytes per element.
    pub mxfp8_scale_bytes_per_element: f64,
    /// MXFP4's scale bytes per element.
    pub mxfp4_scale_bytes_per_element: f64,
    /// Token rows below which a GEMM's compute term is taken at this many rows.
    pub skinny_gemm_rows: f64,
    /// Share of the HBM datasheet bandwidth decode kernels reach.
    pub decode_bandwidth_fraction: f64,
    /// Share of the HBM datasheet bandwidth at which MXFP4 routed experts stream on Hopper
    /// (OpenAI's Triton `matmul_ogs`, upcast in the kernel), in place of
    /// `decode_bandwidth_fraction` for those weights.
    pub mxfp4_upcast_moe_bandwidth_fraction: f64,
    /// Most of the 16-bit dense peak (before the shape's tile and wave utilisation) that the
    /// MXFP4 routed experts' GEMMs reach on Hopper, upcasting to BF16 in the main loop.
    pub mxfp4_upcast_moe_gemm_efficiency: f64,
    /// Fraction of the dense peak that serving engines' fused-MoE grouped GEMMs reach with
    /// FP8/FP4 weights (in place of the GPU's large-GEMM efficiency, for the routed experts).
    pub moe_gemm_quantized_efficiency: f64,
    /// Fraction of the FP8 dense peak that the engines' fused-MoE grouped GEMMs reach with
    /// block-scaled FP8 weights (DeepSeek-V3/R1's checkpoints), for the routed experts.
    pub moe_block_fp8_gemm_efficiency: f64,
    /// Fraction of the FP8 dense peak that the engines' block-scaled FP8 GEMMs (128x128 weight
    /// blocks, 1x128 activation groups) reach, in place of the GPU's large-GEMM efficiency.
    pub block_fp8_gemm_efficiency: f64,
    /// Fraction of the 16-bit dense peak that SGLang 0.4's Triton MLA backend reaches on
    /// absorbed-form prefill attention (workers with `attention_kernel = triton-mla`).
    pub triton_mla_attention_efficiency: f64,
    /// Model presets whose published FP8 checkpoint is block-scaled.
    pub block_fp8_models: Vec<String>,
    /// Host time per decode iteration, µs.
    pub decode_step_overhead_us: f64,
    /// Host time per running sequence per decode iteration, µs, overlapped with the GPU's
    /// forward (a step takes the longer of the two).
    pub decode_host_us_per_sequence: f64,
    /// Launch time per layer per decode step under CUDA graphs, µs.
    pub decode_layer_launch_us: f64,
    /// Fixed time of one dense GEMM kernel beside its bytes (ramp-up, tail and graph gap) with
    /// 16-bit weights, µs.
    pub gemm_fixed_us: f64,
    /// The same with quantized weights (FP8 per-tensor, FP4), the activation's quantization
    /// included, µs.
    pub quantized_gemm_fixed_us: f64,
    /// Share of the HBM datasheet bandwidth at which a dense GEMM kernel streams 16-bit weights.
    pub gemm_bandwidth_fraction: f64,
    /// The same with quantized weights.
    pub quantized_gemm_bandwidth_fraction: f64,
    /// Launch time per layer per prefill forward, µs.
    pub prefill_layer_launch_us: f64,
    /// An MoE layer's launches relative to a dense one's.
    pub moe_layer_launch_factor: f64,
    /// Fixed time per decode step of a layer with latent attention (MLA) and routed experts, µs
    /// (in place of the launch time above).
    pub mla_moe_layer_decode_us: f64,
    /// Fixed time of one KV transfer between pools, µs.
    pub kv_transfer_setup_us: f64,
}

/// The serving constants, parsed once.
pub fn constants() -> &'static ServingConstants {
    static CONSTANTS: OnceLock<ServingConstants> = OnceLock::new();
    CONSTANTS.get_or_init(|| {
        toml::from_str(SERVING_TOML).expect("data/serving.toml holds every serving constant")
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_constant_is_sourced() {
        for line in super::SERVING_TOML.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (_, comment) = line.split_once('#').expect("a source after #");
            assert!(comment.trim().len() > 20, "{line}");
        }
        let c = super::constants();
        assert!(c.gpu_memory_utilization > 0.5 && c.gpu_memory_utilization <= 1.0);
        assert!(c.decode_bandwidth_fraction > 0.0 && c.decode_bandwidth_fraction <= 1.0);
        for share in [
            c.gemm_bandwidth_fraction,
            c.quantized_gemm_bandwidth_fraction,
        ] {
            assert!(share > 0.0 && share <= 1.0);
        }
        assert!(c.gemm_fixed_us > 0.0 && c.quantized_gemm_fixed_us >= c.gemm_fixed_us);
        assert!(
            c.mxfp4_upcast_moe_bandwidth_fraction > 0.0
                && c.mxfp4_upcast_moe_bandwidth_fraction <= c.decode_bandwidth_fraction
        );
    }
}

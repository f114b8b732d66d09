//! Peak memory per GPU of one pipeline rank (docs/costmodel.md §2): model states by ZeRO stage (§2.2–2.3),
//! stored activations × in-flight micro-batches (§2.4–2.5), transients, fixed memory and
//! fragmentation (§2.6).
//!
//! Activations follow the Llama-style accounting of §2.4.3 (flash attention, so no `a·s²` terms;
//! 2-byte activations): per token and layer the layer keeps its norm inputs and the inputs of the
//! column-parallel linears (`8h`, replicated over TP unless sequence parallel), Q/K/V and the
//! attention output, and the FFN intermediates (`6f` SwiGLU, `4f` GeLU), split over TP. For GPT
//! shapes this is Korthikanti's `34·sbh` less the dropout masks. A layer's parameters and saved
//! bytes are the layer module's ([`crate::layer`]); a stage sums them over its layer kinds, and
//! `levels` composes a plan's peak from [`state_gib`], [`stored_bytes_per_micro_batch`],
//! [`transient_bytes`] and [`assemble`].

use crate::hardware::Precision;
use crate::layer::{
    activation_bytes_per_token, adapter_params_per_rank, core_of, params_per_rank,
    recompute_discarded_bytes_per_token, selective_op_bytes_per_token, LayerParams, Mixer, Shard,
    ACT_BYTES, FP32_BYTES, MASK_BYTES, MAX_LAYER_KINDS,
};
use crate::layout::Groups;
use crate::model::Model;
use crate::plan::{Plan, Recompute, RecomputeModule, RecomputeModules};
use crate::report::MemoryBreakdown;
use crate::stages::Stage;
use crate::Problem;

/// Bytes per GiB.
pub const GIB: f64 = (1u64 << 30) as f64;
/// Bytes per element of the working (compute-precision) weight copy.
const WEIGHT_BYTES: f64 = 2.0;

/// Bytes per element of a linear layer's saved input at `precision` (see
/// [`crate::layer::activation_bytes_per_token`]).
pub fn linear_input_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Bf16 | Precision::Fp16 => ACT_BYTES,
        Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4 => 1.0,
    }
}

/// Parameters of one pipeline rank held by one GPU, split into the part sharded over the dense
/// data-parallel group and the routed experts (sharded over the expert data-parallel group).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageParams {
    pub dense: f64,
    pub expert: f64,
    /// The largest single layer on this GPU (the ZeRO-3 gather unit).
    pub largest_layer: f64,
    /// The part of `dense` outside the layers: the embedding on the first rank, the LM head and
    /// final norm on the last (kept 16-bit under LoRA whatever the base format, §2.7).
    pub ends: f64,
    /// LoRA adapter parameters beside the dense weights and beside the routed experts
    /// ([`stage_params_of`]; 0 without LoRA or from [`stage_params`]).
    pub adapter_dense: f64,
    pub adapter_expert: f64,
}

/// A value per layer kind of the model's [`crate::layer::LayerKinds`] (unused entries 0).
pub type PerKind = [f64; MAX_LAYER_KINDS];

/// Per-GPU parameters of one layer of each kind under `plan`'s TP and EP degrees (§2.3).
pub fn kind_params(model: &Model, plan: &Plan) -> [LayerParams; MAX_LAYER_KINDS] {
    let shard = Shard::of(plan);
    let mut out = [LayerParams::default(); MAX_LAYER_KINDS];
    for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
        out[k] = params_per_rank(model, spec, &shard);
    }
    out
}

/// Per-GPU parameters of `stage` (§2.3): its layers by kind, the embedding on the first rank,
/// the LM head and final norm on the last.
pub fn stage_params(model: &Model, plan: &Plan, stage: &Stage) -> StageParams {
    let t = plan.tp as f64;
    let per_kind = kind_params(model, plan);
    let vocab_shard = model.embedding_params() as f64 / t;
    let mut dense = stage.kinds.weighted_sum(&per_kind.map(|p| p.dense));
    let mut ends = 0.0;
    if stage.first {
        dense += vocab_shard;
        ends += vocab_shard;
    }
    if stage.last {
        // LM head (a second copy of the embedding when tied and pipelined) and the final norm.
        let head = if model.tied_embeddings && !stage.first {
            vocab_shard
        } else {
            model.lm_head_params() as f64 / t
        };
        dense += head + model.hidden as f64;
        ends += head + model.hidden as f64;
        // The MTP block's weights, once (Megatron-Bridge's Nemotron 3 recipes repeat one block,
        // `mtp_use_repeated_layer`; DeepSeek-V3 has one depth), its `eh_proj` (`2h → h`, split
        // over TP) and its three norms (§1.4).
        let mtp = model.mtp_kinds();
        if !mtp.is_empty() {
            let h = model.hidden as f64;
            dense +=
                mtp.iter().map(|&k| per_kind[k].dense).sum::<f64>() + 2.0 * h * h / t + 3.0 * h;
        }
    }
    // The ZeRO-3 gather unit: a layer of the rank's last kind (MoE layers follow the dense ones
    // and hold the experts), the dense-MLP layer on a rank without layers; with a layer pattern
    // (kinds in no size order) the largest kind the rank holds.
    let largest_layer = if model.layer_pattern.is_some() {
        stage
            .kinds
            .iter()
            .filter(|&(_, n)| n > 0)
            .map(|(k, _)| per_kind[k].dense + per_kind[k].expert)
            .fold(None, |acc: Option<f64>, x| {
                Some(acc.map_or(x, |a| a.max(x)))
            })
            .unwrap_or(per_kind[0].dense + per_kind[0].expert)
    } else {
        let unit = per_kind[stage.kinds.last_present()];
        unit.dense + unit.expert
    };
    let mut expert = stage.kinds.weighted_sum(&per_kind.map(|p| p.expert));
    if stage.last {
        expert += model
            .mtp_kinds()
            .iter()
            .map(|&k| per_kind[k].expert)
            .sum::<f64>();
    }
    StageParams {
        dense,
        expert,
        largest_layer,
        ends,
        adapter_dense: 0.0,
        adapter_expert: 0.0,
    }
}

/// [`stage_params`] with the LoRA adapters of `problem`'s workload (§2.7).
pub fn stage_params_of(problem: &Problem, plan: &Plan, stage: &Stage) -> StageParams {
    let model = &problem.model;
    let mut out = stage_params(model, plan, stage);
    if let Some(ad) = problem.workload.adapters() {
        let shard = Shard::of(plan);
        let mut per_kind = [LayerParams::default(); MAX_LAYER_KINDS];
        for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
            per_kind[k] = adapter_params_per_rank(model, spec, &shard, &ad);
        }
        out.adapter_dense = stage.kinds.weighted_sum(&per_kind.map(|p| p.dense));
        out.adapter_expert = stage.kinds.weighted_sum(&per_kind.map(|p| p.expert));
    }
    out
}

/// Whether the frozen base weights are dequantised to 16 bits before each GEMM: NF4 always,
/// FP8 under 16-bit compute (FP8 GEMMs read FP8 weights directly), §2.7.
pub fn dequantises(problem: &Problem) -> bool {
    use crate::workload::BaseWeights;
    match problem.workload.lora_base {
        BaseWeights::Bf16 => false,
        BaseWeights::Nf4 => true,
        BaseWeights::Fp8 => matches!(
            problem.workload.precision,
            Precision::Bf16 | Precision::Fp16
        ),
    }
}

/// Model-state memory of one GPU, by part (bytes or GiB as the function returning it says).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelStates {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
}

impl ModelStates {
    fn new(weights: f64, gradients: f64, optimizer: f64) -> Self {
        ModelStates {
            weights,
            gradients,
            optimizer,
        }
    }

    /// Weights + gradients + optimizer.
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer
    }
}

/// Model-state bytes per GPU for `params` sharded over a group of `group` ranks at ZeRO stage
/// `zero` (§2.2). ZeRO-3 follows FSDP: the fp32 sharded parameters are the master weights, so
/// no separate working copy is resident.
pub fn state_bytes(
    params: f64,
    group: u32,
    zero: u8,
    grad_bytes: f64,
    optimizer_bytes: f64,
) -> ModelStates {
    let d = group.max(1) as f64;
    match zero {
        0 => ModelStates::new(
            WEIGHT_BYTES * params,
            grad_bytes * params,
            optimizer_bytes * params,
        ),
        1 => ModelStates::new(
            WEIGHT_BYTES * params,
            grad_bytes * params,
            optimizer_bytes * params / d,
        ),
        2 => ModelStates::new(
            WEIGHT_BYTES * params,
            grad_bytes * params / d,
            optimizer_bytes * params / d,
        ),
        _ => ModelStates::new(0.0, grad_bytes * params / d, optimizer_bytes * params / d),
    }
}

/// Model-state GiB of one GPU of a stage holding `params` at ZeRO stage `zero`, dense and
/// expert parts together (§2.2–2.3).
pub fn state_gib(
    problem: &Problem,
    zero: u8,
    groups: &Groups,
    params: &StageParams,
) -> ModelStates {
    let grad_bytes = problem.workload.grad_bytes as f64;
    let opt_bytes = problem.workload.optimizer.state_bytes_per_param();
    let (dense, expert) = if problem.workload.lora {
        // LoRA (§2.7): frozen base weights only (the layers' in the base format, the embedding
        // and LM head 16-bit; sharded under ZeRO-3), no gradients or optimizer for them; the
        // adapters carry a working copy, gradients and optimizer state like trained weights,
        // sharded over the same groups at the same ZeRO stage.
        let base = problem.workload.base_weight_bytes();
        let frozen = |layers: f64, ends: f64, group: u32| {
            let d = if zero >= 3 { group.max(1) as f64 } else { 1.0 };
            ModelStates::new((base * layers + WEIGHT_BYTES * ends) / d, 0.0, 0.0)
        };
        let with_adapters = |f: ModelStates, a: f64, group: u32| {
            let s = state_bytes(a, group, zero, grad_bytes, opt_bytes);
            ModelStates::new(f.weights + s.weights, s.gradients, s.optimizer)
        };
        (
            with_adapters(
                frozen(
                    params.dense - params.ends,
                    params.ends,
                    groups.dense_dp.size,
                ),
                params.adapter_dense,
                groups.dense_dp.size,
            ),
            with_adapters(
                frozen(params.expert, 0.0, groups.expert_dp.size),
                params.adapter_expert,
                groups.expert_dp.size,
            ),
        )
    } else {
        (
            state_bytes(
                params.dense,
                groups.dense_dp.size,
                zero,
                grad_bytes,
                opt_bytes,
            ),
            state_bytes(
                params.expert,
                groups.expert_dp.size,
                zero,
                grad_bytes,
                opt_bytes,
            ),
        )
    };
    ModelStates::new(
        (dense.weights + expert.weights) / GIB,
        (dense.gradients + expert.gradients) / GIB,
        (dense.optimizer + expert.optimizer) / GIB,
    )
}

/// Stored activation bytes per token of one layer of each kind under `plan` (no recompute;
/// depends on the degrees and sequence parallelism only).
pub fn layer_activations(problem: &Problem, plan: &Plan) -> PerKind {
    let model = &problem.model;
    let li = linear_input_bytes(problem.workload.precision);
    let imbalance = problem.workload.moe_imbalance;
    let shard = Shard::of(plan);
    let mut out = [0.0; MAX_LAYER_KINDS];
    let adapters = problem.workload.adapters();
    for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
        out[k] = activation_bytes_per_token(model, spec, &shard, imbalance, li, adapters.as_ref());
    }
    out
}

/// Per layer kind, the bytes per token `plan`'s recompute modules no longer store, and the most
/// one block rebuilds at once ([`recompute_discarded_bytes_per_token`]); zeros without modules.
pub fn module_discards(problem: &Problem, plan: &Plan) -> (PerKind, PerKind) {
    let mut discarded = [0.0; MAX_LAYER_KINDS];
    let mut rebuilt = [0.0; MAX_LAYER_KINDS];
    let Some(modules) = plan.recompute_modules else {
        return (discarded, rebuilt);
    };
    let model = &problem.model;
    let li = linear_input_bytes(problem.workload.precision);
    let shard = Shard::of(plan);
    let adapters = problem.workload.adapters();
    for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
        (discarded[k], rebuilt[k]) = recompute_discarded_bytes_per_token(
            model,
            spec,
            &shard,
            problem.workload.moe_imbalance,
            li,
            adapters.as_ref(),
            modules,
        );
    }
    (discarded, rebuilt)
}

/// Bytes one in-flight micro-batch keeps on `stage`: the layers' stored activations under
/// `plan`'s recompute plus, on the last rank, the LM-head input and fp32 softmax. `layers` is
/// [`layer_activations`] of the plan.
pub fn stored_bytes_per_micro_batch(
    problem: &Problem,
    plan: &Plan,
    stage: &Stage,
    tokens: f64,
    layers: &PerKind,
) -> f64 {
    let model = &problem.model;
    let t = plan.tp as f64;
    let sp_div = if plan.sequence_parallel { t } else { 1.0 };
    let full_layers = stage.kinds.weighted_sum(layers);
    let stored_per_mb = match plan.recompute {
        // Only each layer's input is kept (sequence-sharded with SP, §9 item 5).
        Recompute::Full => stage.layers() as f64 * ACT_BYTES * model.hidden as f64 / sp_div,
        // With flash attention, core-attention recompute stores what no-recompute stores
        // minus nothing: the a·s² tensors it would save are never materialised (§2.4.2).
        Recompute::Selective => match plan.recompute_modules {
            None => full_layers,
            // Megatron-Core's modules (§2.4.5): what they no longer store goes; without
            // core_attn the core attention keeps what no recompute keeps.
            Some(modules) => {
                let (discarded, _) = module_discards(problem, plan);
                full_layers - stage.kinds.weighted_sum(&discarded)
                    + core_attention_stored(problem, plan, stage, modules)
            }
        },
        Recompute::SelectiveOp => {
            let imbalance = problem.workload.moe_imbalance;
            let shard = Shard::of(plan);
            let mut per_kind = [0.0; MAX_LAYER_KINDS];
            for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
                per_kind[k] = selective_op_bytes_per_token(model, spec, &shard, imbalance);
            }
            stage.kinds.weighted_sum(&per_kind)
        }
        // Unfused attention also keeps the scores and the softmax output (2 + 2 bytes per
        // element) and, with dropout, its mask: 5·a·s²·b bytes per layer with dropout, split
        // over TP (KOR22 §4.1), i.e. 5·(a/t)·s per token; 4 without.
        Recompute::None if !problem.workload.flash_attention => {
            let per_score = 2.0 * ACT_BYTES + if model.dropout { MASK_BYTES } else { 0.0 };
            let scores = per_score * model.heads as f64 / t * problem.workload.seq_len as f64;
            full_layers + stage.layers() as f64 * scores
        }
        Recompute::None => {
            full_layers
                + stage
                    .kinds
                    .weighted_sum(&cp_a2a_output_bytes(problem, plan))
        }
    } * tokens
        * offload_resident_share(plan, stage);
    let vocab_local = model.vocab as f64 / t;
    // Last rank: LM-head input and the fp32 softmax kept for the cross-entropy backward.
    // An in-place fused loss keeps the 16-bit logits holding their gradient instead.
    let per_logit = if problem.workload.cross_entropy_in_place {
        ACT_BYTES
    } else {
        FP32_BYTES
    };
    let head = ACT_BYTES * model.hidden as f64 / sp_div + per_logit * vocab_local;
    let head_per_mb = if stage.last { tokens * head } else { 0.0 };
    // Each MTP depth on the last rank (§1.4): its block's layers as the rank's own under the
    // recompute (full: each layer's input), `eh_proj`'s `2h` input, and the head and loss again.
    let mtp = model.mtp_kinds();
    let mtp_per_mb = match model.mtp_layers {
        Some(depths) if stage.last && !mtp.is_empty() => {
            let h = model.hidden as f64;
            let block = if plan.recompute == Recompute::Full {
                mtp.len() as f64 * ACT_BYTES * h / sp_div
            } else if plan.recompute_modules.is_some() {
                // Megatron's MTP layers are transformer layers: the modules apply there too.
                let (discarded, _) = module_discards(problem, plan);
                mtp.iter().map(|&k| layers[k] - discarded[k]).sum::<f64>()
            } else {
                mtp.iter().map(|&k| layers[k]).sum::<f64>()
            };
            depths as f64 * tokens * (block + 2.0 * ACT_BYTES * h / sp_div + head)
        }
        _ => 0.0,
    };
    stored_per_mb + head_per_mb + mtp_per_mb
}

/// The share of `stage`'s stored layer activations that stays on the GPU at the peak when
/// `plan` offloads [`Plan::offload_layers`] layers per model chunk (§2.4.6): TransformerEngine's
/// `AsyncDoubleBufferGroupOffloadHandler` offloads a chunk's first `N` layers one group at a
/// time and frees each when its window of `⌊L/N⌋` layers ends, so at the end of the forward
/// every offloaded layer is on the host; the backward reloads group `j` when it reaches layer
/// `window[j]` and frees it at layer `j`, so the peak, at the start of the backward, holds the
/// `L − N` layers never offloaded plus the last group reloaded: `N − 1` layers per chunk leave
/// the GPU [transformer_engine/pytorch/cpu_offload.py @v2.8 `synchronize_on_group_commit_forward`,
/// `on_group_commit_backward`]. The offloaded layers are counted at the stage's mean layer size.
/// 1 without offloading.
pub fn offload_resident_share(plan: &Plan, stage: &Stage) -> f64 {
    let n = plan.offloaded_layers();
    let layers = stage.layers();
    if n <= 1 || layers == 0 {
        return 1.0;
    }
    let left = plan.vpp.max(1) as f64 * (n - 1) as f64;
    (1.0 - left / layers as f64).max(0.0)
}

/// Bytes per token `stage`'s layers store for core attention under selective recompute with
/// `modules` that leave `core_attn` out: what no recompute stores there (unfused attention's
/// score tensors, Ulysses' second attention output), nothing when `core_attn` is recomputed.
fn core_attention_stored(
    problem: &Problem,
    plan: &Plan,
    stage: &Stage,
    modules: RecomputeModules,
) -> f64 {
    if modules.contains(RecomputeModule::CoreAttn) {
        return 0.0;
    }
    let model = &problem.model;
    if !problem.workload.flash_attention {
        let per_score = 2.0 * ACT_BYTES + if model.dropout { MASK_BYTES } else { 0.0 };
        per_score * model.heads as f64 / plan.tp as f64
            * problem.workload.seq_len as f64
            * stage.layers() as f64
    } else {
        stage
            .kinds
            .weighted_sum(&cp_a2a_output_bytes(problem, plan))
    }
}

/// Bytes per token a layer of each kind stores on top of [`layer_activations`] when its
/// attention runs Ulysses all-to-alls (`cp_exchange` a2a, or a2a+p2p's inner level) and is not
/// recomputed: TransformerEngine's `AttnFuncWithCPAndQKVOA2A` saves attention's head-sharded
/// output (`out_part`) for its backward while the output projection saves the sequence-sharded
/// one the all-to-all returns, two tensors where the ring and the all-gather keep one
/// [transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py] (§3.8):
/// `a/t·d_v` values per token per attention layer.
fn cp_a2a_output_bytes(problem: &Problem, plan: &Plan) -> PerKind {
    let mut out = [0.0; MAX_LAYER_KINDS];
    if plan.cp <= 1 {
        return out;
    }
    let stack = problem.workload.stack_profile();
    if !stack.cp_exchange(plan).shards_heads() {
        return out;
    }
    let cp = Groups::of(plan, problem.cluster.nvlink_domain()).cp;
    if stack.cp_a2a_ranks(&problem.model, plan, cp) <= 1 {
        return out;
    }
    let model = &problem.model;
    for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
        if matches!(
            spec.mixer,
            Mixer::Attention { .. } | Mixer::Latent(_) | Mixer::SlidingWindow { .. }
        ) {
            let core = core_of(model, &spec.mixer, plan.tp);
            out[k] = core.heads * core.v_head_dim * ACT_BYTES;
        }
    }
    out
}

/// Short-lived bytes on `stage` (before fragmentation): logits and their gradient on the last
/// rank, one layer rebuilt under full recompute, gathered ZeRO-3 units (§2.4.4, §2.6).
pub fn transient_bytes(
    problem: &Problem,
    plan: &Plan,
    stage: &Stage,
    tokens: f64,
    params: &StageParams,
    layers: &PerKind,
) -> f64 {
    let model = &problem.model;
    let vocab_local = model.vocab as f64 / plan.tp as f64;
    let mut transient = 0.0;
    if stage.last {
        // Besides the stored fp32 softmax: the bf16 logits and their gradient during a fused
        // loss backward; an eager fp32 loss adds its fp32 input gradient and log-softmax
        // gradient to the bf16 gradient (§2.4.4, [`crate::Workload::fused_cross_entropy`]).
        let per_logit = if problem.workload.cross_entropy_in_place {
            // The stored logits are the gradient: nothing else at the loss backward.
            0.0
        } else if problem.workload.fused_cross_entropy {
            2.0 * ACT_BYTES
        } else {
            2.0 * FP32_BYTES + ACT_BYTES
        };
        transient += per_logit * tokens * vocab_local;
    }
    if plan.recompute == Recompute::Full {
        // One layer's full activations rebuilt during its backward: the largest of the rank's
        // kinds, counted from no less than the model's dense-MLP layer (kind 0).
        let rebuilt = stage
            .kinds
            .iter()
            .skip(1)
            .filter(|&(_, n)| n > 0)
            .map(|(k, _)| layers[k])
            .fold(layers[0], f64::max);
        transient += tokens * rebuilt;
    }
    if plan.recompute_modules.is_some() {
        // One block's discarded tensors rebuilt during its backward (§2.4.5): the most of the
        // rank's kinds.
        let (_, rebuilt) = module_discards(problem, plan);
        let most = stage
            .kinds
            .iter()
            .filter(|&(_, n)| n > 0)
            .map(|(k, _)| rebuilt[k])
            .fold(0.0, f64::max);
        transient += tokens * most;
    }
    if plan.zero >= 3 {
        let grad_bytes = problem.workload.grad_bytes as f64;
        if problem.workload.lora {
            // Current and prefetched gathered units in the base format; the frozen base has no
            // gradient to gather into (the adapters' are negligible beside it), §2.7.
            transient += params.largest_layer * 2.0 * problem.workload.base_weight_bytes();
        } else {
            // Current and prefetched gathered bf16 units plus one unsharded gradient (§2.6).
            transient += params.largest_layer * (2.0 * WEIGHT_BYTES + grad_bytes);
        }
    }
    if problem.workload.lora && dequantises(problem) {
        // The 16-bit copy of the widest base linear, dequantised just before its GEMM (§2.7).
        transient += WEIGHT_BYTES * crate::layer::largest_linear_params(model, &Shard::of(plan));
    }
    transient
}

/// The breakdown of a stage from its parts: model states ([`state_gib`]), `flight` in-flight
/// micro-batches of `stored_per_mb` bytes ([`stored_bytes_per_micro_batch`]) and `transient`
/// bytes ([`transient_bytes`]); fragmentation and fixed memory are added here (§2.6).
pub fn assemble(
    problem: &Problem,
    states: ModelStates,
    flight: f64,
    stored_per_mb: f64,
    transient: f64,
) -> MemoryBreakdown {
    let cal = &problem.cluster.gpu.calibration;
    let activations = flight * stored_per_mb;
    let fragmentation = cal.fragmentation * (activations + transient);
    MemoryBreakdown {
        weights: states.weights,
        gradients: states.gradients,
        optimizer: states.optimizer,
        activations: activations / GIB,
        transient: (transient + fragmentation) / GIB,
        fixed: cal.fixed_memory_gib,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Activation, Norm};

    /// A dense layer's stored bytes per token, no recompute, 16-bit linear inputs.
    fn dense_bytes(m: &Model, plan: &Plan) -> f64 {
        activation_bytes_per_token(
            m,
            &m.layer_kinds().specs()[0],
            &Shard::of(plan),
            1.0,
            2.0,
            None,
        )
    }

    /// A dense layer's stored bytes per token under op-level selective checkpointing.
    fn dense_op_bytes(m: &Model, plan: &Plan) -> f64 {
        selective_op_bytes_per_token(m, &m.layer_kinds().specs()[0], &Shard::of(plan), 1.0)
    }

    fn llama2_7b() -> Model {
        Model {
            name: "llama2-7b".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: None,
            ffn_hidden: 11008,
            vocab: 32000,
            activation: Activation::Swiglu,
            norm: Norm::Rmsnorm,
            tied_embeddings: false,
            dropout: false,
            moe: None,
            mla: None,
            layer_pattern: None,
            mamba: None,
            linear_attention: None,
            sliding_window: None,
            mtp_layers: None,
            mtp_pattern: None,
            attention_output_gate: false,
        }
    }

    /// Llama-2-7B on 8 H100s, 8 sequences of 4,096 tokens.
    fn llama2_7b_on_8_h100() -> Problem {
        crate::Problem::new(
            llama2_7b(),
            crate::presets::cluster("h100-sxm", 8),
            crate::Workload::new(8, 4096),
        )
        .unwrap()
    }

    fn plan(tp: u32, sp: bool) -> Plan {
        Plan {
            dp: 8 / tp,
            tp,
            sequence_parallel: sp,
            ..Plan::default()
        }
    }

    #[test]
    fn offloading_n_layers_takes_n_minus_one_layers_activations_off_the_gpu() {
        // Llama-2-7B, 32 layers on one rank, no recompute: offloading 16 layers keeps the 16
        // never offloaded and the last one reloaded, 17 of 32 layers' activations.
        let problem = llama2_7b_on_8_h100();
        let base = plan(1, false);
        let stage = crate::stages::stage_runs(&problem.model, 1, 4096)[0].stage;
        let layers = layer_activations(&problem, &base);
        let tokens = 4096.0;
        let stored =
            |pl: &Plan| stored_bytes_per_micro_batch(&problem, pl, &stage, tokens, &layers);
        let with = |n: Option<u32>| Plan {
            offload_layers: n,
            ..base.clone()
        };
        let layer = dense_bytes(&problem.model, &base) * tokens;
        let off = stored(&with(None));
        assert_eq!(stored(&with(Some(0))), off);
        // One layer offloaded is reloaded before the backward needs the peak: nothing saved.
        assert_eq!(stored(&with(Some(1))), off);
        let saved = off - stored(&with(Some(16)));
        assert!(
            (saved - 15.0 * layer).abs() < 1e-6 * layer,
            "{saved} vs {}",
            15.0 * layer
        );
        let saved31 = off - stored(&with(Some(31)));
        assert!((saved31 - 30.0 * layer).abs() < 1e-6 * layer);
        assert_eq!(offload_resident_share(&with(Some(16)), &stage), 17.0 / 32.0);
    }

    #[test]
    fn llama2_7b_activation_coefficient_is_32_1_sbh() {
        // §2.4.3 / §7(c): 12 + 4·g/a + 6·f/h = 32.1 (× s·b·h, 2-byte elements → ×2 bytes... the
        // coefficient already counts bytes).
        let m = llama2_7b();
        let per_token = dense_bytes(&m, &plan(1, false));
        let coeff = per_token / m.hidden as f64;
        assert!((coeff - 32.125).abs() < 1e-9, "{coeff}");
    }

    #[test]
    fn gpt3_with_dropout_keeps_korthikantis_34_sbh() {
        // KOR22 §4.1: 34·sbh per layer (flash attention: no a·s² terms), of which the two
        // residual dropouts' masks are 2·sbh; without SP at t = 8 Megatron's estimator gives
        // (10 + 24/8)·sbh, the masks among the 10 replicated.
        let mut m = crate::presets::model("gpt3-175b").unwrap();
        assert!(m.dropout);
        let coeff = |m: &Model, tp: u32| dense_bytes(m, &plan(tp, false)) / m.hidden as f64;
        assert!((coeff(&m, 1) - 34.0).abs() < 1e-9, "{}", coeff(&m, 1));
        assert!(
            (coeff(&m, 8) - (10.0 + 24.0 / 8.0)).abs() < 1e-9,
            "{}",
            coeff(&m, 8)
        );
        m.dropout = false;
        assert!((coeff(&m, 1) - 32.0).abs() < 1e-9);
    }

    #[test]
    fn tp8_with_sp_divides_activations_by_8() {
        let m = llama2_7b();
        let one = dense_bytes(&m, &plan(1, false));
        let eight = dense_bytes(&m, &plan(8, true));
        assert!((one / eight - 8.0).abs() < 1e-9);
        // Without SP, §7(c): (8 + (8 + 6·f/h)/8)·sbh = 11.0·sbh.
        let no_sp = dense_bytes(&m, &plan(8, false)) / m.hidden as f64;
        assert!(
            (no_sp - (8.0 + (8.0 + 6.0 * 11008.0 / 4096.0) / 8.0)).abs() < 1e-9,
            "{no_sp}"
        );
    }

    #[test]
    fn op_level_checkpointing_keeps_input_attention_output_and_half_the_matmul_outputs() {
        // Llama-2-7B (MHA, SwiGLU), no TP: input h + attention output h + half of the outputs
        // of Q, K, V, O (4h) and of gate, up (2f) and down (h), in 16 bits.
        let m = llama2_7b();
        let (h, f) = (4096.0, 11008.0);
        let got = dense_op_bytes(&m, &plan(1, false));
        assert_eq!(got, 2.0 * (2.0 * h + 0.5 * (4.0 * h + 2.0 * f + h)));
        // Between full recompute (the input only) and no recompute, for every TP/SP split.
        for (tp, sp) in [(1, false), (2, false), (8, true)] {
            let pl = plan(tp, sp);
            let sp_div = if sp { tp as f64 } else { 1.0 };
            let op = dense_op_bytes(&m, &pl);
            let none = dense_bytes(&m, &pl);
            assert!(
                2.0 * h / sp_div < op && op < none,
                "tp {tp}: {op} vs {none}"
            );
        }
    }

    #[test]
    fn each_mtp_depth_keeps_its_block_eh_proj_input_and_logits_on_the_last_rank() {
        let problem = |mtp: Option<u32>| {
            let mut m = crate::presets::model("nemotron-3-nano-30b-a3b").unwrap();
            m.mtp_layers = mtp;
            m.mtp_pattern = mtp.map(|_| "*E".to_string());
            crate::Problem::new(
                m,
                crate::presets::cluster("gb200-nvl72", 8),
                crate::Workload::new(64, 8192),
            )
            .unwrap()
        };
        let (p0, p2) = (problem(None), problem(Some(2)));
        let pl: Plan =
            serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1,"ep":8,"micro_batch":1}"#).unwrap();
        let stage = crate::stages::stage_runs(&p0.model, 1, 8192)[0].stage;
        // Weights: the block "*E" once (kinds 2 and 1), eh_proj 2·2688² and three norms.
        let per_kind = kind_params(&p0.model, &pl);
        let (a, b) = (
            stage_params(&p0.model, &pl, &stage),
            stage_params(&p2.model, &pl, &stage),
        );
        let h = 2688.0;
        let want = per_kind[2].dense + per_kind[1].dense + 2.0 * h * h + 3.0 * h;
        assert!(
            (b.dense - a.dense - want).abs() < 1e-6,
            "{} vs {want}",
            b.dense - a.dense
        );
        assert_eq!(b.expert - a.expert, per_kind[1].expert);
        // Stored per micro-batch of 8192 tokens, no recompute: per depth the two layers, the
        // 2h eh_proj input (2 B) and the head's input (2 B · h) and fp32 softmax (4 B · V).
        let layers = layer_activations(&p0, &pl);
        let tokens = 8192.0;
        let stored =
            |p: &crate::Problem| stored_bytes_per_micro_batch(p, &pl, &stage, tokens, &layers);
        let per_depth = layers[2] + layers[1] + 2.0 * 2.0 * h + (2.0 * h + 4.0 * 131072.0);
        let got = stored(&p2) - stored(&p0);
        assert!(
            (got / (2.0 * tokens * per_depth) - 1.0).abs() < 1e-12,
            "{got}"
        );
    }

    #[test]
    fn recompute_modules_store_less_by_their_tensors_and_rebuild_one_block() {
        // Qwen3-30B-A3B on one H100 rank of eight (EP 8), 4096 tokens, every layer on the rank.
        let problem = crate::Problem::new(
            crate::presets::model("qwen3-30b-a3b").unwrap(),
            crate::presets::cluster("h100-sxm", 8),
            crate::Workload::new(8, 4096),
        )
        .unwrap();
        let base: Plan =
            serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1,"ep":8,"recompute":"selective"}"#)
                .unwrap();
        let with = |m: &str| Plan {
            recompute_modules: Some(RecomputeModules::parse(m).unwrap()),
            ..base.clone()
        };
        let stage = crate::stages::stage_runs(&problem.model, 1, 4096)[0].stage;
        let layers = layer_activations(&problem, &base);
        let params = stage_params(&problem.model, &base, &stage);
        let tokens = 4096.0;
        let stored =
            |pl: &Plan| stored_bytes_per_micro_batch(&problem, pl, &stage, tokens, &layers);
        let transient = |pl: &Plan| transient_bytes(&problem, pl, &stage, tokens, &params, &layers);
        // Without modules and with core_attn alone: what selective has always stored.
        assert_eq!(stored(&with("core_attn")), stored(&base));
        assert_eq!(transient(&with("core_attn")), transient(&base));
        // layernorm + moe_act: per token and MoE layer 2·h + 8·2·f_e fewer bytes (the imbalance
        // of 1.1 on the routed copies), 48 layers; one layer's worth rebuilt at a time.
        let lambda = problem.workload.moe_imbalance;
        let per_layer = 2.0 * 2048.0 + 8.0 * lambda * 2.0 * 768.0;
        let saved = stored(&base) - stored(&with("layernorm+moe_act"));
        assert!(
            (saved / (48.0 * tokens * per_layer) - 1.0).abs() < 1e-12,
            "{saved}"
        );
        let rebuilt = transient(&with("layernorm+moe_act")) - transient(&base);
        assert!(
            (rebuilt / (tokens * per_layer) - 1.0).abs() < 1e-12,
            "{rebuilt}"
        );
        // The whole block stores less again.
        assert!(stored(&with("layernorm+moe")) < stored(&with("layernorm+moe_act")));
    }

    #[test]
    fn an_eager_fp32_loss_holds_14_bytes_per_logit_a_fused_one_8_in_place_2() {
        let mut problem = llama2_7b_on_8_h100();
        let pl = plan(1, false);
        let stage = crate::stages::stage_runs(&problem.model, 1, problem.workload.seq_len)[0].stage;
        let params = stage_params(&problem.model, &pl, &stage);
        let layers = layer_activations(&problem, &pl);
        let tokens = 4096.0;
        let logits = tokens * 32000.0;
        let total = |p: &Problem| {
            stored_bytes_per_micro_batch(p, &pl, &stage, tokens, &layers)
                + transient_bytes(p, &pl, &stage, tokens, &params, &layers)
        };
        let fused = total(&problem);
        // TransformerEngine's in-place loss: the 2-byte logits hold the gradient, nothing else.
        problem.workload.cross_entropy_in_place = true;
        let in_place = total(&problem);
        assert!(
            (fused - in_place - 6.0 * logits).abs() < 1.0,
            "{}",
            fused - in_place
        );
        problem.workload.cross_entropy_in_place = false;
        problem.workload.fused_cross_entropy = false;
        let eager = total(&problem);
        assert!(
            (eager - fused - 6.0 * logits).abs() < 1.0,
            "{}",
            eager - fused
        );
        // In place is a fused loss's: refused without one.
        problem.workload.cross_entropy_in_place = true;
        let e = problem.workload.validate().unwrap_err();
        assert!(
            e.to_string().contains("workload.cross_entropy_in_place"),
            "{e}"
        );
    }

    #[test]
    fn lora_states_are_the_frozen_base_in_its_format_and_the_adapters_trained_states() {
        let mut problem = llama2_7b_on_8_h100();
        problem.workload.lora = true;
        problem.workload.lora_rank = 16;
        problem.workload.lora_targets = vec![
            crate::workload::LoraTarget::Q,
            crate::workload::LoraTarget::K,
            crate::workload::LoraTarget::V,
        ];
        let mut pl = plan(1, false);
        pl.zero = 1;
        let stage = crate::stages::stage_runs(&problem.model, 1, problem.workload.seq_len)[0].stage;
        let params = stage_params_of(&problem, &pl, &stage);
        // Llama-2-7B (MHA): three rank-16 adapters of 16·(4096 + 4096) per layer, 32 layers.
        let adapters = 32.0 * 3.0 * 16.0 * 8192.0;
        assert_eq!(params.adapter_dense, adapters);
        assert_eq!(params.ends, 2.0 * 32000.0 * 4096.0 + 4096.0);
        let groups = crate::layout::Groups::of(&pl, 8);
        let gib = |p: &crate::Problem| state_gib(p, 1, &groups, &params);
        let s = gib(&problem);
        // 16-bit base and adapters; fp32 adapter gradients; Adam's 12 bytes over 8 ranks.
        let total = params.dense;
        assert!((s.weights * GIB - 2.0 * (total + adapters)).abs() < 1.0);
        assert!((s.gradients * GIB - 4.0 * adapters).abs() < 1e-3);
        assert!((s.optimizer * GIB - 12.0 * adapters / 8.0).abs() < 1e-3);
        // NF4 base: the layers' weights at 4.127 bits, the embedding and head 16-bit.
        problem.workload.lora_base = crate::workload::BaseWeights::Nf4;
        let nf4 = gib(&problem);
        let expected =
            4.126953125 / 8.0 * (total - params.ends) + 2.0 * params.ends + 2.0 * adapters;
        assert!(
            (nf4.weights * GIB - expected).abs() < 1.0,
            "{}",
            nf4.weights * GIB - expected
        );
    }

    #[test]
    fn zero_stages_never_increase_state_memory() {
        let mut prev = f64::INFINITY;
        for z in 0..=3 {
            let total = state_bytes(1e9, 8, z, 4.0, 12.0).total();
            assert!(total <= prev, "zero {z}: {total} > {prev}");
            prev = total;
        }
        // Megatron: 18 bytes/param without, 6 + 12/D with the distributed optimizer; FSDP 16/D.
        assert_eq!(state_bytes(1.0, 8, 0, 4.0, 12.0).total(), 18.0);
        assert_eq!(state_bytes(1.0, 8, 1, 4.0, 12.0).total(), 6.0 + 12.0 / 8.0);
        assert_eq!(state_bytes(1.0, 8, 3, 4.0, 12.0).total(), 16.0 / 8.0);
    }
}

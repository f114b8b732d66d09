//! Peak memory per GPU of one pipeline rank (COSTMODEL §2): model states by ZeRO stage (§2.2–2.3),
//! stored activations × in-flight micro-batches (§2.4–2.5), transients, fixed memory and
//! fragmentation (§2.6).
//!
//! Activations follow the Llama-style accounting of §2.4.3 (flash attention, so no `a·s²` terms;
//! 2-byte activations): per token and layer the layer keeps its norm inputs and the inputs of the
//! column-parallel linears (`8h`, replicated over TP unless sequence parallel), Q/K/V and the
//! attention output, and the FFN intermediates (`6f` SwiGLU, `4f` GeLU), split over TP. For GPT
//! shapes this is Korthikanti's `34·sbh` less the dropout masks.

use crate::hardware::Precision;
use crate::layout::Groups;
use crate::model::{Activation, Model};
use crate::plan::{Plan, Recompute};
use crate::report::MemoryBreakdown;
use crate::stages::{in_flight, Stage};
use crate::Problem;

/// Bytes per GiB.
pub const GIB: f64 = (1u64 << 30) as f64;
/// Bytes per element of stored activations and working weights (bf16/fp16).
const ACT_BYTES: f64 = 2.0;
/// Bytes per element of the working (compute-precision) weight copy.
const WEIGHT_BYTES: f64 = 2.0;
/// Bytes per fp32 element (router logits, softmax of the loss).
const FP32_BYTES: f64 = 4.0;

/// Bytes per element of a linear layer's saved input at `precision` (see
/// [`layer_activation_bytes_per_token`]).
pub fn linear_input_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Bf16 | Precision::Fp16 => ACT_BYTES,
        Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4 => 1.0,
    }
}

/// Parameters of one layer's attention held by one TP rank: Q and O split over `t`; K and V
/// split over `t` but replicated when `t > kv_heads` (§2.4.3 GQA note); MLA's down-projections
/// are replicated (they are not tensor-parallel in Megatron's MLA).
pub fn attention_params_per_rank(model: &Model, tp: u32) -> f64 {
    let t = tp as f64;
    let h = model.hidden as f64;
    let a = model.heads as f64;
    match &model.mla {
        Some(m) => {
            let (qk, v) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
            let (q_down, q_up) = match m.q_lora_rank {
                Some(r) => (h * r as f64, r as f64 * a * qk),
                None => (0.0, h * a * qk),
            };
            let kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) as f64;
            let kv_up = m.kv_lora_rank as f64 * a * (m.qk_nope_head_dim as f64 + v);
            q_down + kv_down + (q_up + kv_up + a * v * h) / t
        }
        None => {
            let d = model.qk_head_dim() as f64;
            let g_local = (model.kv_heads as f64 / t).max(1.0);
            2.0 * h * a * d / t + 2.0 * h * g_local * d
        }
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
}

/// Per-GPU parameters of `stage` (§2.3).
pub fn stage_params(model: &Model, plan: &Plan, stage: &Stage) -> StageParams {
    let t = plan.tp as f64;
    let attn = attention_params_per_rank(model, plan.tp) + model.norm_params() as f64 / t;
    let dense_layer = attn + model.dense_ffn_params() as f64 / t;
    let moe_dense_part = attn + model.moe_dense_part_params() as f64 / t;
    let experts_per_rank = model
        .moe
        .as_ref()
        .map_or(0.0, |m| m.num_experts as f64 / plan.ep as f64);
    let experts = experts_per_rank * model.expert_params() as f64 / t;
    let vocab_shard = model.embedding_params() as f64 / t;
    let mut dense =
        stage.dense_layers as f64 * dense_layer + stage.moe_layers as f64 * moe_dense_part;
    if stage.first {
        dense += vocab_shard;
    }
    if stage.last {
        // LM head (a second copy of the embedding when tied and pipelined) and the final norm.
        let head = if model.tied_embeddings && !stage.first {
            vocab_shard
        } else {
            model.lm_head_params() as f64 / t
        };
        dense += head + model.hidden as f64;
    }
    let largest_layer = if stage.moe_layers > 0 {
        moe_dense_part + experts
    } else {
        dense_layer
    };
    StageParams {
        dense,
        expert: stage.moe_layers as f64 * experts,
        largest_layer,
    }
}

/// Model-state bytes per GPU: (weights, gradients, optimizer) for `params` sharded over a
/// group of `group` ranks at ZeRO stage `zero` (§2.2). ZeRO-3 follows FSDP: the fp32 sharded
/// parameters are the master weights, so no separate working copy is resident.
pub fn state_bytes(
    params: f64,
    group: u32,
    zero: u8,
    grad_bytes: f64,
    optimizer_bytes: f64,
) -> (f64, f64, f64) {
    let d = group.max(1) as f64;
    match zero {
        0 => (
            WEIGHT_BYTES * params,
            grad_bytes * params,
            optimizer_bytes * params,
        ),
        1 => (
            WEIGHT_BYTES * params,
            grad_bytes * params,
            optimizer_bytes * params / d,
        ),
        2 => (
            WEIGHT_BYTES * params,
            grad_bytes * params / d,
            optimizer_bytes * params / d,
        ),
        _ => (0.0, grad_bytes * params / d, optimizer_bytes * params / d),
    }
}

/// Stored activation bytes per token of one layer with no recompute (§2.4.3), per GPU.
/// `moe`: the layer has routed experts. `linear_input_bytes`: bytes per element of the tensors
/// kept only as inputs of linear layers — 2 in 16-bit training; FP8/FP4 linears keep their
/// quantised input for the weight gradient (Transformer Engine), 1 byte.
pub fn layer_activation_bytes_per_token(
    model: &Model,
    plan: &Plan,
    moe: bool,
    imbalance: f64,
    linear_input_bytes: f64,
) -> f64 {
    let t = plan.tp as f64;
    let sp_div = if plan.sequence_parallel { t } else { 1.0 };
    let h = model.hidden as f64;
    let a_local = model.heads as f64 / t;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    let li = linear_input_bytes;
    // Two norm inputs (16-bit) and the inputs of the QKV and FFN-in projections.
    let replicated = (2.0 * ACT_BYTES + 2.0 * li) * h / sp_div;
    let attention = match &model.mla {
        Some(m) => {
            // Latents (replicated) + per-head Q, K, V (16-bit, attention inputs) and the
            // output (input of the output projection).
            let latents =
                li * (m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank + m.qk_rope_head_dim) as f64;
            latents + a_local * (ACT_BYTES * (2.0 * dqk + dv) + li * dv)
        }
        None => {
            let g_local = (model.kv_heads as f64 / t).max(1.0);
            ACT_BYTES * (a_local * dqk + 2.0 * g_local * dqk) + li * a_local * dqk
        }
    };
    // Per unit of FFN width: the gate/up (SwiGLU) or pre-activation (GeLU) outputs in 16 bits,
    // and the activation output, the down projection's input.
    let per_f = match model.activation {
        Activation::Swiglu => 2.0 * ACT_BYTES + li,
        Activation::Gelu => ACT_BYTES + li,
    };
    let ffn = match (&model.moe, moe) {
        (Some(m), true) => {
            let router = FP32_BYTES * m.num_experts as f64 / sp_div;
            // Each routed copy keeps its expert input and intermediates on the expert rank.
            let routed =
                m.top_k as f64 * imbalance * (li * h + per_f * m.expert_ffn_hidden as f64 / t);
            let shared = per_f * model.shared_ffn_hidden() as f64 / t;
            router + routed + shared
        }
        _ => per_f * model.ffn_hidden as f64 / t,
    };
    replicated + attention + ffn
}

/// Stored bytes per token of one layer under op-level selective checkpointing
/// ([`Recompute::SelectiveOp`], torchtitan's `_save_list` policy): the layer input, the
/// attention output (flash attention's saved result) and every other matmul output — half of
/// the layer's 16-bit linear outputs on average — plus the fp32 router logits of an MoE layer.
/// Column-parallel outputs are TP-sharded, row-parallel ones sequence-sharded under SP.
pub fn selective_op_bytes_per_token(model: &Model, plan: &Plan, moe: bool, imbalance: f64) -> f64 {
    let t = plan.tp as f64;
    let sp_div = if plan.sequence_parallel { t } else { 1.0 };
    let h = model.hidden as f64;
    let a_local = model.heads as f64 / t;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    let attention_out = a_local * dv;
    // Outputs of the attention projections: Q, K, V (MLA: the latents and the per-head
    // up-projections) and the output projection.
    let attention_linears = match &model.mla {
        Some(m) => {
            (m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank + m.qk_rope_head_dim) as f64
                + a_local * (2.0 * dqk + dv)
        }
        None => a_local * dqk + 2.0 * (model.kv_heads as f64 / t).max(1.0) * dqk,
    } + h / sp_div;
    // Outputs of the FFN projections per unit of width (gate and up for SwiGLU), plus the
    // down projection's output.
    let in_proj = match model.activation {
        Activation::Swiglu => 2.0,
        Activation::Gelu => 1.0,
    };
    let (ffn_linears, router) = match (&model.moe, moe) {
        (Some(m), true) => (
            m.top_k as f64 * imbalance * (in_proj * m.expert_ffn_hidden as f64 / t + h)
                + in_proj * model.shared_ffn_hidden() as f64 / t
                + h / sp_div,
            FP32_BYTES * m.num_experts as f64 / sp_div,
        ),
        _ => (in_proj * model.ffn_hidden as f64 / t + h / sp_div, 0.0),
    };
    ACT_BYTES * (h / sp_div + attention_out + 0.5 * (attention_linears + ffn_linears)) + router
}

/// Everything memory needs about one plan, computed once.
#[derive(Debug, Clone, Copy)]
pub struct MemoryContext {
    /// Tokens of one micro-batch on one GPU before TP: `b·s/c`.
    pub tokens: f64,
    pub micro_batches: u32,
}

/// Model-state GiB of one GPU of a stage holding `params` at ZeRO stage `zero`: (weights,
/// gradients, optimizer), dense and expert parts together (§2.2–2.3).
pub fn state_gib(problem: &Problem, zero: u8, groups: &Groups, params: &StageParams) -> [f64; 3] {
    let grad_bytes = problem.workload.grad_bytes as f64;
    let opt_bytes = problem.workload.optimizer.state_bytes_per_param();
    let (wd, gd, od) = state_bytes(
        params.dense,
        groups.dense_dp.size,
        zero,
        grad_bytes,
        opt_bytes,
    );
    let (we, ge, oe) = state_bytes(
        params.expert,
        groups.expert_dp.size,
        zero,
        grad_bytes,
        opt_bytes,
    );
    // LoRA: frozen 16-bit base weights only (sharded under ZeRO-3), no gradients or optimizer.
    let ((wd, gd, od), (we, ge, oe)) = if problem.workload.lora {
        let frozen = |p: f64, group: u32| {
            let d = if zero >= 3 { group.max(1) as f64 } else { 1.0 };
            (WEIGHT_BYTES * p / d, 0.0, 0.0)
        };
        (
            frozen(params.dense, groups.dense_dp.size),
            frozen(params.expert, groups.expert_dp.size),
        )
    } else {
        ((wd, gd, od), (we, ge, oe))
    };
    [(wd + we) / GIB, (gd + ge) / GIB, (od + oe) / GIB]
}

/// Stored activation bytes per token of a dense and of an MoE layer of `plan` (no recompute;
/// depends on the degrees and sequence parallelism only).
pub fn layer_activations(problem: &Problem, plan: &Plan) -> (f64, f64) {
    let model = &problem.model;
    let li = linear_input_bytes(problem.workload.precision);
    let imbalance = problem.cluster.gpu.calibration.moe_imbalance;
    (
        layer_activation_bytes_per_token(model, plan, false, 1.0, li),
        layer_activation_bytes_per_token(model, plan, true, imbalance, li),
    )
}

/// Bytes one in-flight micro-batch keeps on `stage`: the layers' stored activations under
/// `plan`'s recompute plus, on the last rank, the LM-head input and fp32 softmax. `layers` is
/// [`layer_activations`] of the plan.
pub fn stored_bytes_per_micro_batch(
    problem: &Problem,
    plan: &Plan,
    stage: &Stage,
    tokens: f64,
    (dense_layer, moe_layer): (f64, f64),
) -> f64 {
    let model = &problem.model;
    let t = plan.tp as f64;
    let sp_div = if plan.sequence_parallel { t } else { 1.0 };
    let full_layers = stage.dense_layers as f64 * dense_layer + stage.moe_layers as f64 * moe_layer;
    let stored_per_mb = match plan.recompute {
        // Only each layer's input is kept (sequence-sharded with SP, §9 item 5).
        Recompute::Full => stage.layers() as f64 * ACT_BYTES * model.hidden as f64 / sp_div,
        // With flash attention, core-attention recompute stores what no-recompute stores
        // minus nothing: the a·s² tensors it would save are never materialised (§2.4.2).
        Recompute::Selective => full_layers,
        Recompute::SelectiveOp => {
            let imbalance = problem.cluster.gpu.calibration.moe_imbalance;
            stage.dense_layers as f64 * selective_op_bytes_per_token(model, plan, false, 1.0)
                + stage.moe_layers as f64
                    * selective_op_bytes_per_token(model, plan, true, imbalance)
        }
        // Unfused attention also keeps softmax output, its dropout mask and output:
        // 5·a·s²·b bytes per layer, split over TP (KOR22 §4.1), i.e. 5·(a/t)·s per token.
        Recompute::None if !problem.workload.flash_attention => {
            let scores = 5.0 * model.heads as f64 / t * problem.workload.seq_len as f64;
            full_layers + stage.layers() as f64 * scores
        }
        Recompute::None => full_layers,
    } * tokens;
    let vocab_local = model.vocab as f64 / t;
    // Last rank: LM-head input and the fp32 softmax kept for the cross-entropy backward.
    let head_per_mb = if stage.last {
        tokens * (ACT_BYTES * model.hidden as f64 / sp_div + FP32_BYTES * vocab_local)
    } else {
        0.0
    };
    stored_per_mb + head_per_mb
}

/// Short-lived bytes on `stage` (before fragmentation): logits and their gradient on the last
/// rank, one layer rebuilt under full recompute, gathered ZeRO-3 units (§2.4.4, §2.6).
pub fn transient_bytes(
    problem: &Problem,
    plan: &Plan,
    stage: &Stage,
    tokens: f64,
    params: &StageParams,
    (dense_layer, moe_layer): (f64, f64),
) -> f64 {
    let model = &problem.model;
    let vocab_local = model.vocab as f64 / plan.tp as f64;
    let mut transient = 0.0;
    if stage.last {
        // Besides the stored fp32 softmax: the bf16 logits and their gradient during a fused
        // loss backward; an eager fp32 loss adds its fp32 input gradient and log-softmax
        // gradient to the bf16 gradient (§2.4.4, [`crate::Workload::fused_cross_entropy`]).
        let per_logit = if problem.workload.fused_cross_entropy {
            2.0 * ACT_BYTES
        } else {
            2.0 * FP32_BYTES + ACT_BYTES
        };
        transient += per_logit * tokens * vocab_local;
    }
    if plan.recompute == Recompute::Full {
        // One layer's full activations rebuilt during its backward.
        transient += tokens * dense_layer.max(if stage.moe_layers > 0 { moe_layer } else { 0.0 });
    }
    if plan.zero >= 3 {
        // Current and prefetched gathered bf16 units plus one unsharded gradient (§2.6).
        let grad_bytes = problem.workload.grad_bytes as f64;
        transient += params.largest_layer * (2.0 * WEIGHT_BYTES + grad_bytes);
    }
    transient
}

/// The breakdown of a stage from its parts: model states ([`state_gib`]), `flight` in-flight
/// micro-batches of `stored_per_mb` bytes ([`stored_bytes_per_micro_batch`]) and `transient`
/// bytes ([`transient_bytes`]); fragmentation and fixed memory are added here (§2.6).
pub fn assemble(
    problem: &Problem,
    [weights, gradients, optimizer]: [f64; 3],
    flight: f64,
    stored_per_mb: f64,
    transient: f64,
) -> MemoryBreakdown {
    let cal = &problem.cluster.gpu.calibration;
    let activations = flight * stored_per_mb;
    let fragmentation = cal.fragmentation * (activations + transient);
    MemoryBreakdown {
        weights,
        gradients,
        optimizer,
        activations: activations / GIB,
        transient: (transient + fragmentation) / GIB,
        fixed: cal.fixed_memory_gib,
    }
}

/// Peak memory of `stage`, GiB, by component.
pub fn stage_memory(
    problem: &Problem,
    plan: &Plan,
    groups: &Groups,
    stage: &Stage,
    ctx: MemoryContext,
) -> MemoryBreakdown {
    let params = stage_params(&problem.model, plan, stage);
    let states = state_gib(problem, plan.zero, groups, &params);
    let layers = layer_activations(problem, plan);
    let stored = stored_bytes_per_micro_batch(problem, plan, stage, ctx.tokens, layers);
    let transient = transient_bytes(problem, plan, stage, ctx.tokens, &params, layers);
    let flight = in_flight(plan, ctx.micro_batches, stage.index);
    assemble(problem, states, flight, stored, transient)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Norm;

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
            moe: None,
            mla: None,
        }
    }

    fn plan(tp: u32, sp: bool) -> Plan {
        Plan {
            dp: 8 / tp,
            tp,
            pp: 1,
            ep: 1,
            cp: 1,
            vpp: 1,
            micro_batch: 1,
            zero: 0,
            recompute: Recompute::None,
            sequence_parallel: sp,
            schedule: None,
            order: Default::default(),
        }
    }

    #[test]
    fn llama2_7b_activation_coefficient_is_32_1_sbh() {
        // §2.4.3 / §7(c): 12 + 4·g/a + 6·f/h = 32.1 (× s·b·h, 2-byte elements → ×2 bytes... the
        // coefficient already counts bytes).
        let m = llama2_7b();
        let per_token = layer_activation_bytes_per_token(&m, &plan(1, false), false, 1.0, 2.0);
        let coeff = per_token / m.hidden as f64;
        assert!((coeff - 32.125).abs() < 1e-9, "{coeff}");
    }

    #[test]
    fn tp8_with_sp_divides_activations_by_8() {
        let m = llama2_7b();
        let one = layer_activation_bytes_per_token(&m, &plan(1, false), false, 1.0, 2.0);
        let eight = layer_activation_bytes_per_token(&m, &plan(8, true), false, 1.0, 2.0);
        assert!((one / eight - 8.0).abs() < 1e-9);
        // Without SP, §7(c): (8 + (8 + 6·f/h)/8)·sbh = 11.0·sbh.
        let no_sp = layer_activation_bytes_per_token(&m, &plan(8, false), false, 1.0, 2.0)
            / m.hidden as f64;
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
        let got = selective_op_bytes_per_token(&m, &plan(1, false), false, 1.0);
        assert_eq!(got, 2.0 * (2.0 * h + 0.5 * (4.0 * h + 2.0 * f + h)));
        // Between full recompute (the input only) and no recompute, for every TP/SP split.
        for (tp, sp) in [(1, false), (2, false), (8, true)] {
            let pl = plan(tp, sp);
            let sp_div = if sp { tp as f64 } else { 1.0 };
            let op = selective_op_bytes_per_token(&m, &pl, false, 1.0);
            let none = layer_activation_bytes_per_token(&m, &pl, false, 1.0, 2.0);
            assert!(
                2.0 * h / sp_div < op && op < none,
                "tp {tp}: {op} vs {none}"
            );
        }
    }

    #[test]
    fn an_eager_fp32_loss_holds_14_bytes_per_logit_a_fused_one_8() {
        let mut problem = crate::Problem::new(
            llama2_7b(),
            crate::hardware::Cluster {
                gpu: crate::presets::gpu("h100-sxm").unwrap(),
                num_gpus: 8,
                gpus_per_node: None,
                nvlink_domain: None,
            },
            crate::Workload::new(8, 4096),
        )
        .unwrap();
        let pl = plan(1, false);
        let stage = crate::stages::stage_runs(&problem.model, 1)[0].stage;
        let params = stage_params(&problem.model, &pl, &stage);
        let layers = layer_activations(&problem, &pl);
        let tokens = 4096.0;
        let logits = tokens * 32000.0;
        let total = |p: &Problem| {
            stored_bytes_per_micro_batch(p, &pl, &stage, tokens, layers)
                + transient_bytes(p, &pl, &stage, tokens, &params, layers)
        };
        let fused = total(&problem);
        problem.workload.fused_cross_entropy = false;
        let eager = total(&problem);
        assert!(
            (eager - fused - 6.0 * logits).abs() < 1.0,
            "{}",
            eager - fused
        );
    }

    #[test]
    fn zero_stages_never_increase_state_memory() {
        let mut prev = f64::INFINITY;
        for z in 0..=3 {
            let (w, g, o) = state_bytes(1e9, 8, z, 4.0, 12.0);
            let total = w + g + o;
            assert!(total <= prev, "zero {z}: {total} > {prev}");
            prev = total;
        }
        // Megatron: 18 bytes/param without, 6 + 12/D with the distributed optimizer; FSDP 16/D.
        let (w, g, o) = state_bytes(1.0, 8, 0, 4.0, 12.0);
        assert_eq!(w + g + o, 18.0);
        let (w, g, o) = state_bytes(1.0, 8, 1, 4.0, 12.0);
        assert_eq!(w + g + o, 6.0 + 12.0 / 8.0);
        let (w, g, o) = state_bytes(1.0, 8, 3, 4.0, 12.0);
        assert_eq!(w + g + o, 16.0 / 8.0);
    }
}

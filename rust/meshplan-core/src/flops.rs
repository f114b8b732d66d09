//! Training FLOPs per token (docs/costmodel.md §1): `6·N_active + 6·L·a·(d_qk + d_v)·s_ctx`.
//!
//! Convention: meshplan's MFU counts model FLOPs with the causal discount of Megatron
//! (`s_ctx = s/2`, [MEG-FLOPS]), excluding recomputation and flash attention's internal
//! recompute. [`AttentionCounting::Full`] gives torchtitan/PaLM's `s_ctx = s` basis for
//! comparisons with sources that count that way.
//!
//! A hybrid model (a `layer_pattern`) sums its layers' cores ([`crate::layer::CoreAttention`]):
//! attention over `s_ctx` keys (a window `w` caps them: `w − w²/(2s)` causal, `w` full), the
//! linear-time scans of Mamba-2 and gated DeltaNet, nothing for a layer without a mixer.

use crate::layer::{adapter_active_params, core_of, layer_ops, Adapters, OpsContext, Shard};
use crate::model::Model;
use crate::plan::{Recompute, RecomputeModule, RecomputeModules};
use crate::workload::Workload;

/// How core-attention FLOPs are counted (docs/costmodel.md §9 item 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionCounting {
    /// `s_ctx = s/2`: the causal mask halves the work (Megatron).
    Causal,
    /// `s_ctx = s`: no discount (torchtitan, PaLM).
    Full,
}

/// Core-attention forward FLOPs per token per layer with `s_ctx` keys: QKᵀ and P·V.
pub fn attention_core_fwd_flops_per_token(model: &Model, s_ctx: f64) -> f64 {
    2.0 * model.heads as f64 * (model.qk_head_dim() + model.v_head_dim()) as f64 * s_ctx
}

/// `s_ctx` of a sequence of `seq` tokens under `counting`.
fn s_ctx_of(seq: f64, counting: AttentionCounting) -> f64 {
    match counting {
        AttentionCounting::Causal => seq / 2.0,
        AttentionCounting::Full => seq,
    }
}

/// Core forward FLOPs per token of all the layers for sequences of `seq` tokens: `L` times
/// [`attention_core_fwd_flops_per_token`] for a model without a layer pattern, else the sum of
/// each layer's core (module docs).
pub fn layers_core_fwd_flops_per_token(
    model: &Model,
    seq: f64,
    counting: AttentionCounting,
) -> f64 {
    let s_ctx = s_ctx_of(seq, counting);
    if model.layer_pattern.is_none() {
        return model.layers as f64 * attention_core_fwd_flops_per_token(model, s_ctx);
    }
    let kinds = model.layer_kinds();
    model
        .layer_stack()
        .iter()
        .map(|&(k, n)| {
            let core = core_of(model, &kinds.specs()[k].mixer, 1);
            let keys = match (core.window, counting) {
                (Some(w), AttentionCounting::Full) => w.min(seq),
                _ => core.keys_per_query(seq),
            };
            n as f64 * core.fwd_flops_with_keys(keys)
        })
        .sum()
}

/// Model training FLOPs (forward + backward, no recompute) per token of `workload`. Weight GEMMs
/// cost 6 FLOPs per parameter (forward, input gradient, weight gradient), 4 under LoRA where
/// the frozen weights get no weight gradient; LoRA's adapters are trained, 6 per adapter
/// parameter a token passes through (§2.7).
pub fn train_flops_per_token(
    model: &Model,
    workload: &Workload,
    counting: AttentionCounting,
) -> f64 {
    let per_param = if workload.lora { 4.0 } else { 6.0 };
    let base = per_param * model.active_matmul_params() as f64
        + 3.0 * layers_core_fwd_flops_per_token(model, workload.seq_len as f64, counting);
    match workload.adapters() {
        None => base,
        Some(ad) => base + 6.0 * adapter_active_params_per_token(model, &ad),
    }
}

/// Adapter parameters of all the layers a token passes through (top-k routed experts').
pub fn adapter_active_params_per_token(model: &Model, ad: &Adapters) -> f64 {
    let kinds = model.layer_kinds();
    model
        .layer_stack()
        .iter()
        .map(|&(k, n)| n as f64 * adapter_active_params(model, &kinds.specs()[k], ad))
        .sum()
}

/// FLOPs per token that `recompute` adds to a training step on sequences of `seq` tokens
/// counted as `counting` (what hardware FLOP counts include and model FLOP counts do not):
/// full recompute one more forward of every layer (not of the LM head), selective the core
/// attention (with `modules`, [`recompute_modules_flops_per_token`]), op-level selective every
/// other weight GEMM of the layers.
pub fn recompute_flops_per_token(
    model: &Model,
    recompute: Recompute,
    modules: Option<RecomputeModules>,
    seq: f64,
    counting: AttentionCounting,
) -> f64 {
    let layer_gemms = 2.0 * (model.active_matmul_params() - model.embedding_params()) as f64;
    let attention = layers_core_fwd_flops_per_token(model, seq, counting);
    match (recompute, modules) {
        (Recompute::Full, _) => layer_gemms + attention,
        (Recompute::Selective, Some(m)) => {
            recompute_modules_flops_per_token(model, m, seq, counting)
        }
        (Recompute::Selective, None) => attention,
        (Recompute::SelectiveOp, _) => 0.5 * layer_gemms,
        (Recompute::None, _) => 0.0,
    }
}

/// Forward FLOPs per token Megatron-Core's selective recompute of `modules` replays over the
/// layers (§5.4): each module's GEMMs (`2·m·n·k` of the linears whose role
/// [`crate::layer::GemmRole::in_module`]; per token the top-k routed experts'), and core
/// attention's for `core_attn`; element-wise work (norms, activations) counts no FLOPs.
pub fn recompute_modules_flops_per_token(
    model: &Model,
    modules: RecomputeModules,
    seq: f64,
    counting: AttentionCounting,
) -> f64 {
    let s_ctx = s_ctx_of(seq, counting);
    let kinds = model.layer_kinds();
    let ctx = OpsContext::shapes(1.0);
    let shard = Shard {
        tp: 1,
        ep: 1,
        etp: None,
        sequence_parallel: false,
    };
    model
        .layer_stack()
        .iter()
        .map(|&(k, n)| {
            let spec = &kinds.specs()[k];
            let ops = layer_ops(model, spec, &shard, &ctx);
            let gemms: f64 = ops
                .gemms()
                .iter()
                .filter(|g| modules.iter().any(|m| g.role.in_module(m)))
                .map(|g| {
                    // Nested checkpoints replay once per module they belong to.
                    let times = modules.iter().filter(|&m| g.role.in_module(m)).count();
                    times as f64 * 2.0 * g.m * g.n * g.k * g.repeat
                })
                .sum();
            let core = if modules.contains(RecomputeModule::CoreAttn) {
                let core = core_of(model, &spec.mixer, 1);
                let keys = match (core.window, counting) {
                    (Some(w), AttentionCounting::Full) => w.min(seq),
                    (None, _) if model.layer_pattern.is_none() => s_ctx,
                    _ => core.keys_per_query(seq),
                };
                core.fwd_flops_with_keys(keys)
            } else {
                0.0
            };
            n as f64 * (gemms + core)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Activation, Norm};

    #[test]
    fn recompute_adds_a_forward_the_attention_or_half_the_layer_gemms() {
        let m = crate::presets::model("llama3-8b").unwrap();
        let gemms = 2.0 * (m.active_matmul_params() - m.embedding_params()) as f64;
        let attn = m.layers as f64 * attention_core_fwd_flops_per_token(&m, 4096.0);
        let of = |r| recompute_flops_per_token(&m, r, None, 8192.0, AttentionCounting::Causal);
        assert_eq!(of(Recompute::None), 0.0);
        assert_eq!(of(Recompute::Selective), attn);
        assert_eq!(of(Recompute::Full), gemms + attn);
        assert_eq!(of(Recompute::SelectiveOp), 0.5 * gemms);
    }

    #[test]
    fn recompute_modules_add_their_forward_gemms_or_the_attention_core() {
        let of = |m: &Model, text: &str| {
            let modules = RecomputeModules::parse(text).unwrap();
            recompute_flops_per_token(
                m,
                Recompute::Selective,
                Some(modules),
                8192.0,
                AttentionCounting::Causal,
            )
        };
        // Llama-3-8B: core_attn is selective's count; mlp one more forward of the 32 SwiGLU
        // FFNs, 2·3·h·f per token each; layernorm (fused norms) nothing.
        let l = crate::presets::model("llama3-8b").unwrap();
        let selective = recompute_flops_per_token(
            &l,
            Recompute::Selective,
            None,
            8192.0,
            AttentionCounting::Causal,
        );
        assert_eq!(of(&l, "core_attn"), selective);
        assert_eq!(of(&l, "mlp"), 32.0 * 2.0 * 3.0 * 4096.0 * 14336.0);
        assert_eq!(of(&l, "layernorm+moe_act"), 0.0);
        // DeepSeek-V3: mla_up_proj replays q_up (1536 → 128·192) and kv_up (512 → 128·256) in
        // all 61 layers; mlp only the 3 dense layers' FFNs (7168 ↔ 18432).
        let d = crate::presets::model("deepseek-v3").unwrap();
        let up = 2.0 * (1536.0 * 128.0 * 192.0 + 512.0 * 128.0 * 256.0);
        assert_eq!(of(&d, "mla_up_proj"), 61.0 * up);
        assert_eq!(of(&d, "mlp"), 3.0 * 2.0 * 3.0 * 7168.0 * 18432.0);
        // moe: router, 8 routed experts and the shared one in the 58 MoE layers.
        let block = 2.0 * 7168.0 * 256.0 + 9.0 * 2.0 * 3.0 * 7168.0 * 2048.0;
        assert_eq!(of(&d, "moe"), 58.0 * block);
    }

    #[test]
    fn lora_trains_4_flops_per_frozen_and_6_per_adapter_parameter() {
        // Llama-3-8B, rank 16 on every linear, separate adapters (torchtune's q, k, v, o and
        // MLP): per layer q 16·(4096 + 4096), k and v 16·(4096 + 1024), o as q, gate/up/down
        // 16·(4096 + 14336) each; 32 layers.
        let m = crate::presets::model("llama3-8b").unwrap();
        let per_layer = 2.0 * 16.0 * 8192.0 + 2.0 * 16.0 * 5120.0 + 3.0 * 16.0 * 18432.0;
        let mut w = Workload::new(8, 4096);
        let full = train_flops_per_token(&m, &w, AttentionCounting::Causal);
        w.lora = true;
        w.lora_rank = 16;
        w.lora_targets = ["q", "k", "v", "o", "mlp"]
            .into_iter()
            .map(|t| crate::workload::LoraTarget::parse(t).unwrap())
            .collect();
        let lora = train_flops_per_token(&m, &w, AttentionCounting::Causal);
        let n = m.active_matmul_params() as f64;
        let expected = full - 2.0 * n + 6.0 * 32.0 * per_layer;
        assert!(
            (lora / expected - 1.0).abs() < 1e-12,
            "{lora} vs {expected}"
        );
    }

    #[test]
    fn gpt3_175b_matches_narayanan_closed_form() {
        // 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) per step (NAR21, s_ctx = s), per token here.
        let m = Model {
            name: "gpt3".into(),
            layers: 96,
            hidden: 12288,
            heads: 96,
            kv_heads: 96,
            head_dim: None,
            ffn_hidden: 4 * 12288,
            vocab: 51200,
            activation: Activation::Gelu,
            norm: Norm::Layernorm,
            tied_embeddings: true,
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
        };
        let (l, h, s, v) = (96.0, 12288.0, 2048.0, 51200.0);
        let expected = 72.0 * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let got = train_flops_per_token(&m, &Workload::new(1, 2048), AttentionCounting::Full);
        assert!((got / expected - 1.0).abs() < 1e-9, "{got} vs {expected}");
    }
}

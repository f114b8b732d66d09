//! Memory of one serving worker per GPU (docs/serving.md §4): weights of its pipeline stage
//! (attention and dense layers sharded over `tp`, routed experts over `ep × expert_tp`,
//! embedding and LM head vocabulary-parallel over `tp`), the KV cache of its sequences, the
//! activation workspace of one forward pass and the GPU's fixed memory; the KV budget the
//! engine leaves (`gpu_memory_utilization`) says how many sequences fit.

use serde::{Deserialize, Serialize};

use crate::layer::{params_per_rank, LayerCounts, Mixer, ACT_BYTES, FP32_BYTES};
use crate::model::Model;

use super::constants;
use super::plan::{SlidingKv, Worker};
use super::problem::{bytes_per_element, LengthMix, ServingProblem};

use crate::memory::GIB;

/// Layers per kind of each of `pp` stages: contiguous runs of the model's layer stack, the
/// remainder of `layers / pp` going one each to the first stages.
pub(crate) fn stage_counts(model: &Model, pp: u32) -> Vec<LayerCounts> {
    let pp = pp.clamp(1, model.layers.max(1));
    let base = model.layers / pp;
    let extra = model.layers % pp;
    let mut stack = model.layer_stack().into_iter();
    let mut current = stack.next();
    (0..pp)
        .map(|s| {
            let mut want = base + u32::from(s < extra);
            let mut counts = LayerCounts::default();
            while want > 0 {
                let Some((kind, left)) = current else { break };
                let take = left.min(want);
                counts.0[kind] += take;
                want -= take;
                current = if take == left {
                    stack.next()
                } else {
                    Some((kind, left - take))
                };
            }
            counts
        })
        .collect()
}

/// One kind of pipeline stage: its layers, whether it is the first (embedding) or the last
/// (LM head) stage, and how many consecutive stages look like it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StageShape {
    pub counts: LayerCounts,
    pub first: bool,
    pub last: bool,
    pub repeat: u32,
}

/// The stages of [`stage_counts`] grouped into runs of identical ones (a handful, however
/// deep the pipeline), so that memory and time evaluate each kind of stage once.
pub(crate) fn stage_shapes(model: &Model, pp: u32) -> Vec<StageShape> {
    let stages = stage_counts(model, pp);
    let last = stages.len() - 1;
    let mut out: Vec<StageShape> = Vec::new();
    for (s, counts) in stages.into_iter().enumerate() {
        let shape = StageShape {
            counts,
            first: s == 0,
            last: s == last,
            repeat: 1,
        };
        match out.last_mut() {
            Some(prev)
                if prev.counts == shape.counts
                    && (prev.first, prev.last) == (shape.first, shape.last) =>
            {
                prev.repeat += 1
            }
            _ => out.push(shape),
        }
    }
    out
}

/// KV-cache bytes one GPU holds per token per layer: GQA keeps its `max(g/tp, 1)` local K/V heads
/// (replicated when `tp` exceeds the KV heads); MLA keeps the compressed latent and the RoPE key,
/// `d_c + d_r` values, whole on every TP rank (docs/serving.md §4).
pub fn kv_bytes_per_token_per_layer(model: &Model, tp: u32, kv_element_bytes: f64) -> f64 {
    match model.mixer() {
        Mixer::Latent(m) => (m.kv_lora_rank + m.qk_rope_head_dim) as f64 * kv_element_bytes,
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            2.0 * (kv_heads as f64 / tp as f64).max(1.0)
                * model.qk_head_dim() as f64
                * kv_element_bytes
        }
        // No per-token cache (a fixed state per request); serving takes no layer pattern yet
        // (`ServingProblem::validate`), so these are never the model's mixer here.
        Mixer::Mamba(_) | Mixer::DeltaNet(_) | Mixer::None => 0.0,
    }
}

/// Layers of `counts` whose KV cache a sequence of `context` tokens fills, per token of that
/// context: every full-attention layer, and a sliding-window layer for the `window` tokens it
/// keeps (`min(context, window)/context`; vLLM's hybrid allocator and SGLang's SWA pool free
/// the rest) or, in a pool that keeps them whole (`SlidingKv::Full`), for every token.
pub(crate) fn cached_layers(
    model: &Model,
    counts: &LayerCounts,
    context: f64,
    pool: SlidingKv,
) -> f64 {
    let kinds = model.layer_kinds();
    counts
        .iter()
        .filter(|&(_, n)| n > 0)
        .map(|(kind, n)| {
            let share = match (kinds.specs()[kind].mixer, pool) {
                (Mixer::SlidingWindow { window, .. }, SlidingKv::Window) => {
                    (window as f64 / context.max(1.0)).min(1.0)
                }
                _ => 1.0,
            };
            n as f64 * share
        })
        .sum()
}

/// Per-GPU parameters of one stage (layers, plus the embedding on the first and the LM head on
/// the last stage), split as the worker splits them.
pub(crate) fn stage_params(
    model: &Model,
    w: &Worker,
    counts: &LayerCounts,
    first: bool,
    last: bool,
) -> StageParams {
    let kinds = model.layer_kinds();
    let dense_shard = w.dense_shard();
    let expert_shard = w.expert_shard();
    let mut params = StageParams::default();
    for (kind, n) in counts.iter() {
        if n == 0 {
            continue;
        }
        let spec = &kinds.specs()[kind];
        params.dense += n as f64 * params_per_rank(model, spec, &dense_shard).dense;
        params.expert += n as f64 * params_per_rank(model, spec, &expert_shard).expert;
    }
    let vocab_shard = (model.vocab as f64 * model.hidden as f64) / w.tp as f64;
    if first {
        params.dense += vocab_shard;
    }
    // A tied head shares the embedding only when both sit on the same stage.
    if last && (!model.tied_embeddings || !first) {
        params.dense += vocab_shard;
    }
    params
}

/// Parameters per GPU of one stage: the routed experts' apart, since a checkpoint may store
/// them in a format of their own (`ServingProblem::expert_weights`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StageParams {
    /// Every parameter but the routed experts' (attention, dense and shared FFNs, router,
    /// embedding and head).
    pub dense: f64,
    /// The routed experts' share on this GPU.
    pub expert: f64,
}

impl StageParams {
    /// Bytes of these parameters for `p`'s weight formats.
    pub fn bytes(&self, p: &ServingProblem) -> f64 {
        self.dense * bytes_per_element(p.weight_precision)
            + self.expert * p.expert_bytes_per_element()
    }
}

/// Memory per GPU of one worker's busiest stage, GiB (binary), and its KV capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServingMemory {
    /// Weights per GPU.
    pub weights_gib: f64,
    /// KV cache of the worker's sequences per GPU.
    pub kv_cache_gib: f64,
    /// Activations of one forward pass and the sampled logits.
    pub workspace_gib: f64,
    /// CUDA context, libraries, communication buffers (the GPU's calibration).
    pub fixed_gib: f64,
    /// Sum of the above.
    pub total_gib: f64,
    /// What the engine may fill: `gpu_memory_utilization` of the HBM.
    pub budget_gib: f64,
    /// KV-cache bytes per token of context per GPU (all layers of the stage).
    pub kv_bytes_per_token: f64,
    /// Tokens of KV cache the budget holds per GPU after weights, workspace and fixed memory.
    pub kv_capacity_tokens: f64,
    /// Sequences of the traffic's full length (prompt + output) the worker can hold.
    pub max_sequences_fit: u64,
}

/// Memory of worker `w` running `sequences` sequences (a prefill worker: its batch) with
/// forwards of at most `forward_tokens` tokens per attention-DP rank, for the traffic's lengths
/// `mix` (`ServingProblem::lengths`, built once per problem).
pub fn worker_memory(
    p: &ServingProblem,
    mix: &LengthMix,
    w: &Worker,
    sequences: f64,
    forward_tokens: f64,
) -> ServingMemory {
    let model = &p.model;
    let c = constants();
    let gpu = &p.cluster.gpu;
    let kvb = bytes_per_element(p.kv_precision);
    let stages = stage_shapes(model, w.pp);
    let kv_layer = kv_bytes_per_token_per_layer(model, w.tp, kvb);
    let budget = gpu.memory_gib * c.gpu_memory_utilization * GIB;
    let fixed = gpu.calibration.fixed_memory_gib * GIB;
    let seqs_rank = sequences / w.attention_dp as f64;
    // The shared prefix is cached once per rank; every sequence holds its own remainder.
    let prefix = mix.mean_input * p.traffic.prefix_fraction;
    let own = mix.full_context - prefix;
    let h = model.hidden as f64;
    let mut worst: Option<ServingMemory> = None;
    for stage in &stages {
        let counts = &stage.counts;
        let weights = stage_params(model, w, counts, stage.first, stage.last).bytes(p);
        let kv_per_token = kv_layer * cached_layers(model, counts, mix.full_context, w.sliding_kv);
        let kv = kv_per_token * (seqs_rank * own + prefix);
        let ffn_width = widest_ffn(model, w);
        let act = forward_tokens * ACT_BYTES * (c.workspace_hidden_multiple * h + ffn_width);
        let logits = if stage.last {
            seqs_rank.max(1.0) * model.vocab as f64 / w.tp as f64 * FP32_BYTES
        } else {
            0.0
        };
        let workspace = act + logits;
        let total = weights + kv + workspace + fixed;
        let free = (budget - weights - workspace - fixed).max(0.0);
        // The engine's own figure where the plan states it, else what the budget leaves.
        let capacity_tokens = match w.kv_tokens {
            Some(t) => t as f64,
            None => free / kv_per_token.max(1e-30),
        };
        let fit_rank = ((capacity_tokens - prefix) / own).floor().max(0.0);
        let fit = (fit_rank as u64).saturating_mul(w.attention_dp as u64);
        let m = ServingMemory {
            weights_gib: weights / GIB,
            kv_cache_gib: kv / GIB,
            workspace_gib: workspace / GIB,
            fixed_gib: fixed / GIB,
            total_gib: total / GIB,
            budget_gib: budget / GIB,
            kv_bytes_per_token: kv_per_token,
            kv_capacity_tokens: capacity_tokens,
            max_sequences_fit: fit,
        };
        worst = Some(match worst {
            Some(prev) if prev.max_sequences_fit <= m.max_sequences_fit => prev,
            _ => m,
        });
    }
    worst.expect("a worker has at least one stage")
}

/// Widest FFN intermediate one token's forward materialises per GPU: the gate/up outputs of a
/// dense layer over `tp`, or of the routed copies (top-k, imbalance) over `expert_tp`.
fn widest_ffn(model: &Model, w: &Worker) -> f64 {
    let gate_up = model.activation.ffn_matrices() as f64 - 1.0;
    let dense = gate_up * model.ffn_hidden as f64 / w.tp as f64;
    let routed = model.moe.as_ref().map_or(0.0, |m| {
        gate_up * m.top_k as f64 * m.expert_ffn_hidden as f64 / w.expert_tp as f64
            + gate_up * m.shared_ffn_hidden() as f64 / w.tp as f64
    });
    dense.max(routed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Precision;
    use crate::serving::ExpertWeights;

    fn problem(model: &str) -> ServingProblem {
        let mut p = crate::serving::problem::tests::problem(model, "h100-sxm", 8);
        p.traffic.output_len = 1024;
        p
    }

    fn worker(tp: u32, pp: u32) -> Worker {
        Worker {
            tp,
            pp,
            attention_dp: 1,
            ep: 1,
            expert_tp: tp,
            max_sequences: 1,
            max_batched_tokens: None,
            kv_tokens: None,
            output_lag_steps: None,
            attention_kernel: Default::default(),
            sliding_kv: Default::default(),
        }
    }

    #[test]
    fn a_sliding_window_layer_caches_its_window_only() {
        // gpt-oss-120b at 3072 + 1024 tokens: its 18 full layers hold the whole context, its 18
        // sliding-window layers the last 128 tokens: 18 + 18 x 128/4096 layers' worth per token,
        // 2048 bytes each at TP 1.
        let mut p = crate::serving::problem::tests::problem("gpt-oss-120b", "h100-sxm", 1);
        p.traffic.input_len = 3072;
        p.traffic.output_len = 1024;
        let m = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0);
        assert_eq!(
            m.kv_bytes_per_token,
            2048.0 * (18.0 + 18.0 * 128.0 / 4096.0)
        );
        // A context inside the window: every layer holds all of it.
        p.traffic.input_len = 64;
        p.traffic.output_len = 64;
        let short = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0);
        assert_eq!(short.kv_bytes_per_token, 2048.0 * 36.0);
        // A pool that keeps every token of the sliding-window layers (SGLang's for gpt-oss):
        // all 36 layers per token, so half the sequences of the windowed pool fit, less one at
        // most (both are floors of the same budget over 36 and over 18 + 18 x 128/4096 layers).
        // (MXFP4 experts, as published, so that the weights fit one H100.)
        p.traffic.input_len = 3072;
        p.traffic.output_len = 1024;
        p.expert_weights = Some(ExpertWeights::Mxfp4);
        let m = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0);
        let full = Worker {
            sliding_kv: SlidingKv::Full,
            ..worker(1, 1)
        };
        let whole = worker_memory(&p, &p.lengths(), &full, 1.0, 8192.0);
        assert_eq!(whole.kv_bytes_per_token, 2048.0 * 36.0);
        assert!(whole.max_sequences_fit > 10, "{}", whole.max_sequences_fit);
        let ratio = (18.0 + 18.0 * 128.0 / 4096.0) / 36.0;
        let expected = (m.max_sequences_fit as f64 * ratio).floor();
        assert!(
            (whole.max_sequences_fit as f64 - expected).abs() <= 1.0,
            "{} vs {expected}",
            whole.max_sequences_fit
        );
        assert!(whole.max_sequences_fit < m.max_sequences_fit);
    }

    #[test]
    fn gpt_oss_with_mxfp4_experts_fits_one_h100() {
        // gpt-oss-120b as published: MXFP4 routed experts (0.5 byte + one E8M0 scale per 32),
        // everything else BF16. Its 114.7 B expert parameters (36 layers x 128 experts x 3 x
        // 2880 x 2880) take 57 GiB; the rest (attention, router, embedding and head, ~2 B)
        // ~4 GiB: one 80 GB H100 holds it, where FP8 for every layer (117 GB) does not.
        let mut p = crate::serving::problem::tests::problem("gpt-oss-120b", "h100-sxm", 1);
        p.expert_weights = Some(ExpertWeights::Mxfp4);
        let stages = stage_shapes(&p.model, 1);
        let params = stage_params(&p.model, &worker(1, 1), &stages[0].counts, true, true);
        let by_hand = params.dense * 2.0 + params.expert * (0.5 + 1.0 / 32.0);
        assert_eq!(params.bytes(&p), by_hand);
        assert!(
            (114.0e9..115.5e9).contains(&params.expert),
            "{}",
            params.expert
        );
        let fits = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0);
        assert!((by_hand / GIB - fits.weights_gib).abs() < 1e-9);
        assert!(fits.max_sequences_fit > 0, "{fits:?}");
        p.expert_weights = None;
        p.weight_precision = Precision::Fp8;
        assert_eq!(
            worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0).max_sequences_fit,
            0
        );
    }

    #[test]
    fn stages_split_the_stack_in_order() {
        let ds = crate::presets::model("deepseek-v3").unwrap();
        let s = stage_counts(&ds, 4);
        assert_eq!(s.len(), 4);
        assert_eq!(
            s.iter().map(|c| c.total()).collect::<Vec<_>>(),
            [16, 15, 15, 15]
        );
        assert_eq!(s[0].0[..2], [3, 13]);
        assert_eq!(s[3].0[..2], [0, 15]);
        // First, the two middle stages as one run, last.
        let shapes = stage_shapes(&ds, 4);
        assert_eq!(
            shapes.iter().map(|s| s.repeat).collect::<Vec<_>>(),
            [1, 2, 1]
        );
        assert!(shapes[0].first && shapes[2].last && !shapes[1].first && !shapes[1].last);
        // A 64-stage pipeline of a 126-layer model: a few kinds of stage, 64 in all.
        let deep = stage_shapes(&crate::presets::model("llama3.1-405b").unwrap(), 64);
        assert!(deep.len() <= 4, "{deep:?}");
        assert_eq!(deep.iter().map(|s| s.repeat).sum::<u32>(), 64);
    }

    #[test]
    fn llama70b_weights_split_over_tp_and_kv_is_320_kib_per_token() {
        let p = problem("llama3-70b");
        // 80 layers × 2 × 8 KV heads × 128 × 2 bytes = 327,680 bytes per token.
        let kv = kv_bytes_per_token_per_layer(&p.model, 1, 2.0) * 80.0;
        assert_eq!(kv, 327_680.0);
        let m8 = worker_memory(&p, &p.lengths(), &worker(8, 1), 1.0, 8192.0);
        let m1 = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0);
        // 70.6 B parameters in bf16 = 131.5 GiB; TP8 holds an eighth.
        assert!((m1.weights_gib - 131.5).abs() < 1.0, "{}", m1.weights_gib);
        assert!((m8.weights_gib * 8.0 - m1.weights_gib).abs() < 0.01);
        assert_eq!(m1.max_sequences_fit, 0, "70B in bf16 does not fit one H100");
        assert!(m8.max_sequences_fit > 100, "{}", m8.max_sequences_fit);
        // Past 8 KV heads, TP replicates K/V: TP16's KV per GPU equals TP8's.
        assert_eq!(
            kv_bytes_per_token_per_layer(&p.model, 16, 2.0),
            kv_bytes_per_token_per_layer(&p.model, 8, 2.0)
        );
    }

    #[test]
    fn fp8_kv_doubles_the_sequences_that_fit() {
        let mut p = problem("llama3-8b");
        let bf16 = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0).max_sequences_fit;
        p.kv_precision = Precision::Fp8;
        let fp8 = worker_memory(&p, &p.lengths(), &worker(1, 1), 1.0, 8192.0).max_sequences_fit;
        assert!(fp8 >= 2 * bf16 - 1 && fp8 <= 2 * bf16 + 1, "{bf16} {fp8}");
    }

    #[test]
    fn mla_kv_is_the_latent_and_is_replicated_over_tp() {
        let p = problem("deepseek-v3");
        // (512 + 64) × 2 bytes per layer, 61 layers: 70,272 bytes per token.
        assert_eq!(
            kv_bytes_per_token_per_layer(&p.model, 8, 2.0) * 61.0,
            70_272.0
        );
        assert_eq!(
            kv_bytes_per_token_per_layer(&p.model, 1, 2.0),
            kv_bytes_per_token_per_layer(&p.model, 8, 2.0)
        );
    }
}

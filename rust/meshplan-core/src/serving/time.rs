//! Time of one serving forward pass (docs/serving.md §5): a batch of decode tokens (one per
//! running sequence, each attending to its KV cache) and prefill tokens (new prompt tokens,
//! attending causally to themselves and to their cached prefix), run by one worker.
//!
//! Per layer and GPU: every linear layer of [`layer_ops`] on a roofline of the [`Device`] — its
//! FLOPs at the shape's GEMM efficiency ([`gemm::efficiency`]) against its bytes (the weights
//! the batch touches, routed experts only when a token is routed to them, and the activations)
//! at the decode share of the HBM bandwidth; core attention the same way (FLOPs at the device's
//! attention rate against the KV-cache bytes read); element-wise work at the device's HBM rate;
//! two tensor-parallel all-reduces, and with attention-DP the expert-parallel dispatch and
//! combine, through [`CollectiveModel`]; one PP hop per stage boundary; the launch time of each
//! layer and the scheduler's time per decode step from `data/serving.toml`.

use serde::{Deserialize, Serialize};

use crate::comm::{Collective, CollectiveModel, Fabric};
use crate::device::Device;
use crate::gemm::{self, GemmDevice};
use crate::layer::{
    layer_ops, Gemm, GemmRole, LayerCounts, LayerSpec, Mixer, OpsContext, ACT_BYTES,
};
use crate::layout::{self, Group};
use crate::mesh::Mesh;
use crate::plan::{Axis, RankOrder};
use crate::stack::Stack;
use crate::traffic::WIRE_BYTES;

use super::constants;
use super::memory::{kv_bytes_per_token_per_layer, stage_shapes};
use super::plan::{AttentionKernel, Worker};
use super::problem::{bytes_per_element, ExpertWeights, LengthMix, ServingProblem};

/// Seconds of one forward (or decode step) of a worker, by part, on its busiest stage, with
/// the bytes and FLOPs behind them (per GPU).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct PhaseTime {
    /// Wall time of the forward or step (all stages, scheduler included).
    pub total_s: f64,
    /// Linear layers (GEMMs) of the busiest stage.
    pub linear_s: f64,
    /// Of `linear_s`, the routed experts' grouped GEMMs.
    #[serde(default)]
    pub routed_expert_s: f64,
    /// Core attention of the busiest stage.
    pub attention_s: f64,
    /// Element-wise kernels (norms, activation, RoPE, permutes).
    pub elementwise_s: f64,
    /// Tensor-parallel all-reduces (and the logits' all-gather).
    pub tp_comm_s: f64,
    /// Expert-parallel dispatch and combine, expert-TP all-reduces.
    pub ep_comm_s: f64,
    /// Pipeline hops.
    pub pp_comm_s: f64,
    /// Kernel launches and the scheduler's host time.
    pub overhead_s: f64,
    /// Weight bytes read per GPU by the busiest stage.
    pub weight_bytes: f64,
    /// KV-cache bytes read per GPU by the busiest stage.
    pub kv_bytes: f64,
    /// FLOPs per GPU of the busiest stage (linear layers and attention).
    pub flops: f64,
    /// FLOPs per byte of HBM traffic of the linear layers.
    pub arithmetic_intensity: f64,
    /// The linear layers are bound by HBM bandwidth rather than compute.
    pub memory_bound: bool,
}

/// The communication groups of a worker, placed on the NVLink domains by `layout`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WorkerGroups {
    pub tp: Group,
    pub ep: Group,
    pub expert_tp: Group,
    /// Neighbouring pipeline stages share a domain.
    pub pp_same_domain: bool,
}

/// The groups of `w` on domains of `domain` GPUs: TP innermost, then the attention-DP ranks,
/// then the stages (the dense mesh); the experts' mesh is `expert_tp × ep × pp` over the same
/// ranks.
pub(crate) fn worker_groups(w: &Worker, domain: u32) -> WorkerGroups {
    let dense = Mesh::new(RankOrder::DEFAULT, |a| match a {
        Axis::Tp => w.tp,
        Axis::Dp => w.attention_dp,
        Axis::Pp => w.pp,
        _ => 1,
    });
    let experts = Mesh::new(RankOrder::DEFAULT, |a| match a {
        Axis::Tp => w.expert_tp,
        Axis::Ep => w.ep,
        Axis::Pp => w.pp,
        _ => 1,
    });
    WorkerGroups {
        tp: layout::group(&dense, &[Axis::Tp], domain),
        ep: layout::group(&experts, &[Axis::Ep], domain),
        expert_tp: layout::group(&experts, &[Axis::Tp], domain),
        pp_same_domain: w.stage_gpus() * 2 <= domain as u64,
    }
}

/// One forward's tokens per attention-DP rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Batch {
    /// Sequences decoding one token each.
    pub decode_seqs: f64,
    /// Mean KV tokens each decoding sequence attends to.
    pub decode_context: f64,
    /// Sequences in prefill.
    pub prefill_seqs: f64,
    /// New tokens of each prefilling sequence.
    pub prefill_new: f64,
    /// Cached tokens (shared prefix, earlier chunks) each prefilling sequence attends to.
    pub prefill_cached: f64,
    /// The stage's tokens in units of this batch's, the busiest attention-DP rank's: the ranks
    /// that hold a wave's requests when fewer than all do (the others idle through the forward,
    /// their experts' share of tokens absent), or, under continuous arrivals, every rank's mean
    /// load over the busiest rank's; `None`: every rank holds this batch. The busiest rank sets
    /// the forward; the experts see the stage's tokens.
    pub busy_ranks: Option<f64>,
}

impl Batch {
    /// A pure decode step: `seqs` sequences each decoding one token over `context` KV tokens.
    pub(crate) fn decode(seqs: f64, context: f64) -> Self {
        Batch {
            decode_seqs: seqs,
            decode_context: context,
            prefill_seqs: 0.0,
            prefill_new: 0.0,
            prefill_cached: 0.0,
            busy_ranks: None,
        }
    }

    /// A pure prefill forward: `seqs` prompts of `new` tokens each after `cached` ones.
    pub(crate) fn prefill(seqs: f64, new: f64, cached: f64) -> Self {
        Batch {
            decode_seqs: 0.0,
            decode_context: 0.0,
            prefill_seqs: seqs,
            prefill_new: new,
            prefill_cached: cached,
            busy_ranks: None,
        }
    }

    pub(crate) fn tokens(&self) -> f64 {
        self.decode_seqs + self.prefill_seqs * self.prefill_new
    }

    /// Sequences whose last position is sampled (logits computed).
    fn sampled(&self) -> f64 {
        self.decode_seqs + self.prefill_seqs
    }
}

/// Query-key pairs of `new` prompt tokens after `cached` ones when each attends to at most
/// `window` keys (causal, in the continuous form the time model uses: `new·cached + new²/2`
/// without a window): the tokens before position `window` see all their predecessors, the
/// rest `window` each.
pub(crate) fn windowed_pairs(cached: f64, new: f64, window: f64) -> f64 {
    let open = new.min((window - cached).max(0.0));
    let capped = new - open;
    open * cached + open * open / 2.0 + if capped > 0.0 { capped * window } else { 0.0 }
}

/// Whether `problem`'s routed experts run an upcasting kernel of their own: MXFP4 experts on
/// Hopper (no FP4 tensor cores) run OpenAI's Triton `matmul_ogs`, which upcasts the weights to
/// BF16 in the kernel's main loop and, below ~32 rows, splits K into FP32 partials. Their
/// weights stream at `mxfp4_upcast_moe_bandwidth_fraction` of the HBM bandwidth and their GEMMs
/// reach at most `mxfp4_upcast_moe_gemm_efficiency` of the 16-bit peak (data/serving.toml, both
/// measured on Hopper). MXFP4 on other architectures (native on Blackwell; no published rate on
/// Ampere or AMD's dies) keeps the decode kernels' and the device's rates.
pub(crate) fn mxfp4_upcast(problem: &ServingProblem) -> bool {
    let gpu = &problem.cluster.gpu;
    problem.expert_weights == Some(ExpertWeights::Mxfp4)
        && gpu.architecture.as_deref() == Some("hopper")
        && gpu.peak_tflops.nvfp4.is_none()
}

/// The pieces the serving time model reads, built once per problem.
pub(crate) struct TimeModel<'a> {
    pub problem: &'a ServingProblem,
    /// The traffic's lengths ([`ServingProblem::lengths`]), read by every evaluation.
    pub mix: LengthMix,
    pub device: Device,
    pub fabric: Fabric,
    pub domain: u32,
    weight_bytes: f64,
    /// Bytes of one stored weight of the routed experts (`ServingProblem::expert_weights`).
    expert_weight_bytes: f64,
    kv_bytes: f64,
    /// HBM bytes/s of decode kernels.
    stream_bytes_per_s: f64,
    /// HBM bytes/s at which the routed experts' weights stream (`stream_bytes_per_s`, or the
    /// MXFP4 upcast kernel's share on Hopper).
    expert_stream_bytes_per_s: f64,
    /// The routed experts run the MXFP4 upcast kernel ([`mxfp4_upcast`]).
    expert_upcast: bool,
    /// A dense (not grouped) GEMM kernel's fixed time, s, and the HBM bytes/s at which it
    /// streams its weights: measured per weight format (data/serving.toml `gemm_fixed_us`).
    dense_gemm_fixed_s: f64,
    pub(crate) dense_gemm_bytes_per_s: f64,
    ops: OpsContext,
    /// The dense linears run block-scaled FP8 kernels (`ServingProblem::block_scaled_fp8`).
    block_scaled: bool,
}

/// Accumulated time and traffic of the linear layers.
#[derive(Default)]
struct Linear {
    seconds: f64,
    compute_s: f64,
    /// Seconds the bytes take to stream (weights at their kernels' rate, activations).
    stream_s: f64,
    /// Of `seconds`, the routed experts' grouped GEMMs.
    expert_seconds: f64,
    bytes: f64,
    weight_bytes: f64,
    flops: f64,
}

impl<'a> TimeModel<'a> {
    pub fn new(problem: &'a ServingProblem) -> Self {
        let gpu = &problem.cluster.gpu;
        let device = Device::of(gpu, problem.weight_precision);
        let upcast = mxfp4_upcast(problem);
        let hbm_bytes_per_s = gpu.memory_bandwidth_gbps * 1e9;
        let stack = Stack::default_stack();
        let ops = OpsContext {
            tokens: 1.0,
            moe_imbalance: crate::workload::DEFAULT_MOE_IMBALANCE,
            elementwise_bytes_per_hidden: gpu.calibration.elementwise_bytes_per_hidden,
            replicated_elementwise_bytes_per_hidden: stack.replicated_elementwise_bytes_per_hidden,
            routed_copy_bytes_per_hidden: stack.routed_copy_bytes_per_hidden,
            expert_activation_bytes_per_width: stack.expert_activation_bytes_per_width,
            adapters: None,
            dequant_bytes_per_param: 0.0,
        };
        let c = constants();
        let block_scaled = problem.block_scaled_fp8();
        // Block-scaled FP8 linears (DeepSeek-V3/R1) keep the decode stream rate and no fixed
        // time: their measured tables were timed without CUDA graphs (data/serving.toml).
        let (dense_gemm_fixed_us, dense_gemm_fraction) = if block_scaled {
            (0.0, c.decode_bandwidth_fraction)
        } else if device.quantized {
            (
                c.quantized_gemm_fixed_us,
                c.quantized_gemm_bandwidth_fraction,
            )
        } else {
            (c.gemm_fixed_us, c.gemm_bandwidth_fraction)
        };
        TimeModel {
            problem,
            mix: problem.lengths(),
            device,
            fabric: Fabric::of(&problem.cluster),
            domain: problem.cluster.nvlink_domain(),
            weight_bytes: bytes_per_element(problem.weight_precision),
            expert_weight_bytes: problem.expert_bytes_per_element(),
            kv_bytes: bytes_per_element(problem.kv_precision),
            stream_bytes_per_s: hbm_bytes_per_s * c.decode_bandwidth_fraction,
            expert_stream_bytes_per_s: hbm_bytes_per_s
                * if upcast {
                    c.mxfp4_upcast_moe_bandwidth_fraction
                } else {
                    c.decode_bandwidth_fraction
                },
            expert_upcast: upcast,
            dense_gemm_fixed_s: dense_gemm_fixed_us * 1e-6,
            dense_gemm_bytes_per_s: hbm_bytes_per_s * dense_gemm_fraction,
            ops,
            block_scaled,
        }
    }

    /// Adds `g` to `acc`: FLOPs at the shape's efficiency against the bytes of the weights of
    /// `touched` of its `repeat` instances and of its activations, whichever is slower. A
    /// grouped GEMM (the routed experts) runs its tokens on the `touched` experts in one launch
    /// (`gemm::grouped_efficiency`: their tiles share the waves). A dense GEMM's kernel adds
    /// `fixed_s` to its bytes' time.
    fn gemm(&self, acc: &mut Linear, g: &Gemm, touched: f64, fixed_s: f64) {
        if g.m <= 0.0 || g.n <= 0.0 || g.k <= 0.0 || touched <= 0.0 {
            return;
        }
        let dev = &self.device.gemm;
        let flops = 2.0 * g.m * g.n * g.k * g.repeat;
        // Skinny GEMMs (decode) run on kernels that pad no tile rows (data/serving.toml).
        let skinny = constants().skinny_gemm_rows;
        let efficiency = if g.grouped {
            let rows = (g.m * g.repeat / touched).max(skinny);
            // The engines' fused-MoE kernels reach a small share of the FP8/FP4 peak, a
            // smaller one with block-scaled FP8 weights (a scale per 128x128 weight block and
            // per 1x128 activation group applied in the main loop).
            let cap = if self.block_scaled {
                constants().moe_block_fp8_gemm_efficiency
            } else {
                constants().moe_gemm_quantized_efficiency
            };
            let fused = if self.device.quantized {
                GemmDevice {
                    efficiency: dev.efficiency.min(cap),
                    ..*dev
                }
            } else if self.expert_upcast {
                // MXFP4 weights upcast to BF16 in the main loop (Hopper's Triton kernel).
                GemmDevice {
                    efficiency: dev
                        .efficiency
                        .min(constants().mxfp4_upcast_moe_gemm_efficiency),
                    ..*dev
                }
            } else {
                *dev
            };
            gemm::grouped_efficiency(&fused, touched, rows, g.n, g.k)
        } else if self.block_scaled {
            // Block-scaled FP8 kernels of the engines reach a fixed share of the FP8 peak.
            let block = GemmDevice {
                efficiency: dev.efficiency.min(constants().block_fp8_gemm_efficiency),
                ..*dev
            };
            gemm::efficiency(&block, g.m.max(skinny), g.n, g.k)
        } else {
            gemm::efficiency(dev, g.m.max(skinny), g.n, g.k)
        };
        let compute = flops / (dev.peak_flops * efficiency);
        // The routed experts may be stored in a weight-only format of their own, dequantized in
        // the kernel: their bytes shrink, their GEMMs run at the device's precision. A dense
        // GEMM kernel streams its weights at its format's measured rate, beside its fixed time
        // (data/serving.toml gemm_fixed_us): what a decode GEMM's roofline misses.
        let (per_weight, weight_stream, fixed_s) = if g.grouped {
            (
                self.expert_weight_bytes,
                self.expert_stream_bytes_per_s,
                0.0,
            )
        } else {
            (self.weight_bytes, self.dense_gemm_bytes_per_s, fixed_s)
        };
        let weights = per_weight * g.n * g.k * touched;
        let activations = ACT_BYTES * (g.m * g.k + g.m * g.n) * g.repeat;
        let bytes = weights + activations;
        let stream_s = fixed_s + weights / weight_stream + activations / self.stream_bytes_per_s;
        let seconds = compute.max(stream_s);
        acc.seconds += seconds;
        if g.grouped {
            acc.expert_seconds += seconds;
        }
        acc.compute_s += compute;
        acc.stream_s += stream_s;
        acc.bytes += bytes;
        acc.weight_bytes += weights;
        acc.flops += flops;
    }

    /// One layer of `spec` on one GPU of worker `w` for `batch` (per attention-DP rank), each
    /// dense GEMM kernel taking `gemm_fixed_s` beside its bytes.
    fn layer(
        &self,
        w: &Worker,
        g: &WorkerGroups,
        spec: &LayerSpec,
        batch: &Batch,
        gemm_fixed_s: f64,
    ) -> (PhaseTime, Linear) {
        let model = &self.problem.model;
        let tok = batch.tokens();
        let shard = w.dense_shard();
        let ctx = OpsContext {
            tokens: tok,
            ..self.ops
        };
        let ops = layer_ops(model, spec, &shard, &ctx);
        let mut lin = Linear::default();
        // The routed experts run on the expert-parallel ranks, timed below.
        for gm in ops
            .gemms()
            .iter()
            .filter(|g| g.role != GemmRole::RoutedExpert)
        {
            self.gemm(&mut lin, gm, gm.repeat, gemm_fixed_s);
        }
        let mut elementwise_bytes = ops.elementwise_bytes;
        let mut ep_comm_s = 0.0;
        let h = model.hidden as f64;
        if let Some(moe) = spec.moe() {
            // Tokens of the whole stage reach the experts: every busy attention-DP rank's own.
            let ranks = batch
                .busy_ranks
                .map_or(w.attention_dp as f64, |r| r.min(w.attention_dp as f64));
            let stage_tokens = tok * ranks;
            let expert_shard = w.expert_shard();
            let per_ep_rank = OpsContext {
                tokens: stage_tokens / w.ep as f64,
                ..self.ops
            };
            let eops = layer_ops(model, spec, &expert_shard, &per_ep_rank);
            // A local expert's weights are read when at least one of the stage's tokens picks
            // it (top-k of E, uniform routing).
            let e = moe.num_experts as f64;
            let touched = 1.0 - (1.0 - moe.top_k as f64 / e).powf(stage_tokens);
            for gm in eops
                .gemms()
                .iter()
                .filter(|g| g.role == GemmRole::RoutedExpert)
            {
                self.gemm(&mut lin, gm, gm.repeat * touched, 0.0);
            }
            elementwise_bytes += eops.routed_elementwise_bytes;
            if w.attention_dp > 1 && w.ep == 1 {
                // Tensor-parallel experts behind DP attention (SGLang 0.4's
                // --enable-dp-attention without expert parallelism): every GPU gathers all
                // ranks' hidden states, runs its slice of every expert on them, sums its top-k
                // partial outputs per token in the fused-MoE kernel, and the stage all-reduces
                // one h-vector per token before each rank keeps its own rows.
                let bytes = stage_tokens * h * WIRE_BYTES;
                ep_comm_s += self
                    .fabric
                    .collective(Collective::AllGather, bytes, g.expert_tp)
                    .total_s;
                ep_comm_s += self
                    .fabric
                    .collective(Collective::AllReduce, bytes, g.expert_tp)
                    .total_s;
            } else if w.attention_dp > 1 {
                // Each GPU dispatches its share of its rank's tokens and gets them back.
                let d = self
                    .fabric
                    .dispatch(tok / w.tp as f64, h * WIRE_BYTES, moe.top_k, g.ep);
                ep_comm_s += 2.0 * d.total_s;
                let received =
                    stage_tokens * moe.top_k as f64 * self.ops.moe_imbalance / w.ep as f64;
                ep_comm_s += self
                    .fabric
                    .collective(
                        Collective::AllReduce,
                        received * h * WIRE_BYTES,
                        g.expert_tp,
                    )
                    .total_s;
            }
        }
        // After attention and after the FFN (dense, or the MoE's shared and combined output).
        let tp_comm_s = 2.0
            * self
                .fabric
                .collective(Collective::AllReduce, tok * h * WIRE_BYTES, g.tp)
                .total_s;
        let (attention_s, attention_flops, kv_read) = self.attention(w, &spec.mixer, batch);
        let t = PhaseTime {
            total_s: 0.0,
            linear_s: lin.seconds,
            routed_expert_s: lin.expert_seconds,
            attention_s,
            elementwise_s: elementwise_bytes / self.device.memory_bytes_per_s,
            tp_comm_s,
            ep_comm_s,
            pp_comm_s: 0.0,
            overhead_s: 0.0,
            weight_bytes: lin.weight_bytes,
            kv_bytes: kv_read,
            flops: lin.flops + attention_flops,
            arithmetic_intensity: lin.flops / lin.bytes.max(1.0),
            memory_bound: lin.stream_s > lin.compute_s,
        };
        (t, lin)
    }

    /// Core attention of one layer per GPU: `(seconds, FLOPs, KV bytes read)`. Decode reads
    /// each sequence's cache once (MLA in its absorbed form: scores and values over the latent);
    /// prefill is causal over the new tokens and full over the cached ones.
    fn attention(&self, w: &Worker, mixer: &Mixer, b: &Batch) -> (f64, f64, f64) {
        let model = &self.problem.model;
        let heads = model.heads as f64 / w.tp as f64;
        let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
        let decode_width = match mixer {
            Mixer::Latent(m) => 2.0 * m.kv_lora_rank as f64 + m.qk_rope_head_dim as f64,
            Mixer::Attention { .. } | Mixer::SlidingWindow { .. } => dqk + dv,
            // Not attention (serving takes no layer pattern yet, `ServingProblem::validate`).
            Mixer::Mamba(_) | Mixer::DeltaNet(_) | Mixer::None => 0.0,
        };
        // A sliding-window layer attends to the last `window` tokens only (gpt-oss's `S`
        // layers): decode reads at most that much of each cache, and a prompt's token at
        // position i attends to min(i, window) keys.
        let window = match mixer {
            Mixer::SlidingWindow { window, .. } => *window as f64,
            _ => f64::INFINITY,
        };
        let decode_context = b.decode_context.min(window);
        let decode_flops = 2.0 * heads * decode_width * b.decode_seqs * decode_context;
        let pairs = windowed_pairs(b.prefill_cached, b.prefill_new, window);
        // SGLang 0.4's Triton MLA backend prefills in the absorbed form (scores and values over
        // the latent, as decode does) whenever a batch holds a cached prefix, which the radix
        // cache gives every prompt after the first (they share the BOS token) and chunking gives
        // every continuation chunk; its kernel runs at a rate of its own.
        let (prefill_width, prefill_rate) = match (w.attention_kernel, mixer) {
            (AttentionKernel::TritonMla, Mixer::Latent(_)) => (
                decode_width,
                constants().triton_mla_attention_efficiency * self.device.gemm16.peak_flops,
            ),
            _ => (dqk + dv, self.device.attention_flops_per_s),
        };
        let prefill_flops = 2.0 * heads * prefill_width * b.prefill_seqs * pairs;
        let kv_layer = kv_bytes_per_token_per_layer(model, w.tp, self.kv_bytes);
        let kv_read = kv_layer
            * (b.decode_seqs * decode_context
                + b.prefill_seqs * (b.prefill_cached + b.prefill_new).min(window));
        let flops = decode_flops + prefill_flops;
        let seconds = (decode_flops / self.device.attention_flops_per_s
            + prefill_flops / prefill_rate)
            .max(kv_read / self.stream_bytes_per_s);
        (seconds, flops, kv_read)
    }

    /// The LM head of the last stage: `sampled` rows against the vocabulary shard, and the
    /// logits' all-gather over TP.
    fn lm_head(&self, w: &Worker, g: &WorkerGroups, sampled: f64) -> (f64, f64, f64) {
        let model = &self.problem.model;
        let mut lin = Linear::default();
        let head = Gemm {
            m: sampled.max(1.0),
            n: model.vocab as f64 / w.tp as f64,
            k: model.hidden as f64,
            repeat: 1.0,
            grouped: false,
            role: Default::default(),
        };
        self.gemm(&mut lin, &head, 1.0, self.dense_gemm_fixed_s);
        let gather = self
            .fabric
            .collective(
                Collective::AllGather,
                sampled.max(1.0) * model.vocab as f64 * ACT_BYTES,
                g.tp,
            )
            .total_s;
        (lin.seconds, gather, lin.weight_bytes)
    }

    /// One stage of `w` holding `counts` layers, on `batch`.
    fn stage(
        &self,
        w: &Worker,
        g: &WorkerGroups,
        counts: &LayerCounts,
        last: bool,
        batch: &Batch,
        decode: bool,
    ) -> PhaseTime {
        let kinds = self.problem.model.layer_kinds();
        let c = constants();
        let mut t = PhaseTime::default();
        let mut lin = Linear::default();
        for (kind, n) in counts.iter() {
            if n == 0 {
                continue;
            }
            let spec = &kinds.specs()[kind];
            // A decode step of a DeepSeek-style layer (latent attention and routed experts) has
            // a measured fixed time of its own, its GEMMs' included: its many small kernels
            // (docs/serving.md §5).
            let latent_moe = matches!(spec.mixer, Mixer::Latent(_)) && spec.moe().is_some();
            let measured_layer = decode && latent_moe;
            let gemm_fixed_s = if measured_layer {
                0.0
            } else {
                self.dense_gemm_fixed_s
            };
            let (l, layer_lin) = self.layer(w, g, spec, batch, gemm_fixed_s);
            let n = n as f64;
            lin.bytes += n * layer_lin.bytes;
            lin.flops += n * layer_lin.flops;
            lin.compute_s += n * layer_lin.compute_s;
            lin.stream_s += n * layer_lin.stream_s;
            t.linear_s += n * l.linear_s;
            t.routed_expert_s += n * l.routed_expert_s;
            t.attention_s += n * l.attention_s;
            t.elementwise_s += n * l.elementwise_s;
            t.tp_comm_s += n * l.tp_comm_s;
            t.ep_comm_s += n * l.ep_comm_s;
            t.weight_bytes += n * l.weight_bytes;
            t.kv_bytes += n * l.kv_bytes;
            t.flops += n * l.flops;
            let launch = if decode {
                c.decode_layer_launch_us
            } else {
                c.prefill_layer_launch_us
            };
            let factor = if spec.moe().is_some() {
                c.moe_layer_launch_factor
            } else {
                1.0
            };
            let layer_us = if measured_layer {
                c.mla_moe_layer_decode_us
            } else {
                launch * factor
            };
            t.overhead_s += n * layer_us * 1e-6;
        }
        if last {
            let (head_s, gather_s, head_bytes) = self.lm_head(w, g, batch.sampled());
            t.linear_s += head_s;
            t.tp_comm_s += gather_s;
            t.weight_bytes += head_bytes;
        }
        t.arithmetic_intensity = lin.flops / lin.bytes.max(1.0);
        t.memory_bound = lin.stream_s > lin.compute_s;
        t.total_s =
            t.linear_s + t.attention_s + t.elementwise_s + t.tp_comm_s + t.ep_comm_s + t.overhead_s;
        t
    }

    /// One forward of worker `w` on `batch` (per attention-DP rank, split into `w.pp`
    /// micro-batches when `pipelined`): the busiest stage's breakdown, with `total_s` the
    /// latency of the forward (every stage and hop) and the second value its period (the time
    /// between forwards in steady state).
    pub fn forward(&self, w: &Worker, batch: &Batch, decode: bool) -> (PhaseTime, f64) {
        let g = worker_groups(w, self.domain);
        let stages = stage_shapes(&self.problem.model, w.pp);
        let pp = stages.iter().map(|s| s.repeat as f64).sum::<f64>();
        // Decode runs pp micro-batches in flight (one per stage); prefill one batch.
        let mb = if decode && pp > 1.0 {
            Batch {
                decode_seqs: batch.decode_seqs / pp,
                prefill_seqs: batch.prefill_seqs / pp,
                ..*batch
            }
        } else {
            *batch
        };
        let hop = if pp > 1.0 {
            let bytes = mb.tokens() * self.problem.model.hidden as f64 * WIRE_BYTES;
            self.fabric.p2p(bytes, g.pp_same_domain).total_s
        } else {
            0.0
        };
        let mut busiest = PhaseTime::default();
        let mut sum = 0.0;
        for stage in &stages {
            let t = self.stage(w, &g, &stage.counts, stage.last, &mb, decode);
            sum += stage.repeat as f64 * t.total_s;
            if t.total_s >= busiest.total_s {
                busiest = t;
            }
        }
        busiest.pp_comm_s = hop * (pp - 1.0);
        let latency = sum + busiest.pp_comm_s;
        let step = if decode {
            constants().decode_step_overhead_us * 1e-6
        } else {
            0.0
        };
        busiest.overhead_s += step;
        let (latency, period) = if decode && pp > 1.0 {
            // Each micro-batch waits for the pp − 1 others to pass its stage.
            let cycle = (pp * busiest.total_s).max(latency) + step;
            (cycle, cycle)
        } else if pp > 1.0 {
            (latency, busiest.total_s + hop)
        } else {
            (latency + step, latency + step)
        };
        // The engine's host work on each running sequence (appending its token, stop checks,
        // the response) overlaps the next forward on the GPU: a decode step takes the longer
        // of the two, and what the host adds is overhead.
        let host = if decode {
            constants().decode_host_us_per_sequence * 1e-6 * batch.sampled()
        } else {
            0.0
        };
        let exposed = (host - period).max(0.0);
        busiest.overhead_s += exposed;
        let (latency, period) = (latency + exposed, period + exposed);
        busiest.total_s = latency;
        (busiest, period)
    }
}

/// The serving times of a deployment (docs/serving.md §2 defines each metric).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServingTime {
    /// Time to first token: arrival to the first output token, s.
    pub ttft_s: f64,
    /// Time per output token after the first (inter-token latency), s.
    pub tpot_s: f64,
    /// Arrival to the last token: `ttft + (output_len − 1)·tpot`, s.
    pub e2e_s: f64,
    /// One decode step of the (decode or aggregated) worker, with prefill piggybacked in the
    /// aggregated case.
    pub decode: PhaseTime,
    /// One prefill forward (a prefill worker's batch, or one request's prompt on an
    /// aggregated worker).
    pub prefill: PhaseTime,
    /// KV-cache hand-over per request between the pools (0 when aggregated), s.
    pub kv_transfer_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Shard;

    pub(crate) fn problem(model: &str, n: u32) -> ServingProblem {
        crate::serving::problem::tests::problem(model, "h100-sxm", n)
    }

    fn decode(seqs: f64) -> Batch {
        Batch::decode(seqs, 1024.0)
    }

    fn worker(tp: u32) -> Worker {
        Worker {
            tp,
            pp: 1,
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
    fn batch_one_decode_is_memory_bound_at_the_weight_read() {
        let p = problem("llama3-70b", 8);
        let tm = TimeModel::new(&p);
        let (t, _) = tm.forward(&worker(8), &decode(1.0), true);
        assert!(t.memory_bound);
        // An eighth of 141 GB of bf16 weights at 85 % of 3.35 TB/s, and each of the 80 layers'
        // four GEMMs (QKV, output, gate-up, down) and the LM head a fixed 4.4 µs: 7.6 ms of
        // linear layers, 1.4 ms of it fixed.
        let c = constants();
        let fixed = (80.0 * 4.0 + 1.0) * c.gemm_fixed_us * 1e-6;
        let floor = 141.1e9 / 8.0 / (3.35e12 * c.gemm_bandwidth_fraction) + fixed;
        assert!(
            (t.linear_s - floor).abs() / floor < 0.03,
            "{} vs {floor}",
            t.linear_s
        );
        // 160 all-reduces of 16 KiB on NVLink: latency-bound, milliseconds in all.
        assert!(t.tp_comm_s > 1e-3 && t.tp_comm_s < 1e-2, "{}", t.tp_comm_s);
        assert!(t.arithmetic_intensity < 2.0, "{}", t.arithmetic_intensity);
    }

    #[test]
    fn a_decode_gemm_takes_its_formats_fixed_time_beside_its_bytes() {
        // Llama 3 8B's o_proj (4096 x 4096) for 8 decoding rows on H200: NVIDIA measured 13.3 us
        // (aiconfigurator's BF16 table, TensorRT-LLM; benchmarks/serving_decode_gemm_rate.py);
        // the model takes 4.4 us plus 33.5 MB at 85 % of 4.8 TB/s.
        let c = constants();
        let p = crate::serving::problem::tests::problem("llama3-8b", "h200-sxm", 1);
        let tm = TimeModel::new(&p);
        let o = Gemm {
            m: 8.0,
            n: 4096.0,
            k: 4096.0,
            repeat: 1.0,
            grouped: false,
            role: Default::default(),
        };
        let mut lin = Linear::default();
        tm.gemm(&mut lin, &o, 1.0, tm.dense_gemm_fixed_s);
        let bytes = 2.0 * 4096.0 * 4096.0;
        let activations = ACT_BYTES * 8.0 * 2.0 * 4096.0 / tm.stream_bytes_per_s;
        let by_hand = c.gemm_fixed_us * 1e-6 + bytes / (4.8e12 * c.gemm_bandwidth_fraction);
        assert!(
            (lin.seconds - by_hand - activations).abs() < 1e-12,
            "{}",
            lin.seconds
        );
        assert!(
            (lin.seconds / 13.3e-6 - 1.0).abs() < 0.05,
            "{}",
            lin.seconds
        );
        // FP8 weights: half the bytes, the quantized kernel's fixed time and rate.
        let mut q = p.clone();
        q.weight_precision = crate::hardware::Precision::Fp8;
        let tq = TimeModel::new(&q);
        let mut lq = Linear::default();
        tq.gemm(&mut lq, &o, 1.0, tq.dense_gemm_fixed_s);
        let by_hand = c.quantized_gemm_fixed_us * 1e-6
            + bytes / 2.0 / (4.8e12 * c.quantized_gemm_bandwidth_fraction);
        assert!(
            (lq.seconds - by_hand - activations).abs() < 1e-12,
            "{}",
            lq.seconds
        );
        // A grouped GEMM (the routed experts) gets no per-kernel fixed time here.
        let mut lg = Linear::default();
        tm.gemm(&mut lg, &Gemm { grouped: true, ..o }, 1.0, 0.0);
        assert!(lg.seconds < lin.seconds - 0.5 * c.gemm_fixed_us * 1e-6);
        // A DeepSeek-style layer's decode carries its measured fixed time instead, its GEMMs'
        // included (mla_moe_layer_decode_us): none of its GEMMs adds one, while its dense
        // layers' and its prefill's do (BF16 weights: block-scaled FP8 adds none anywhere).
        let mut ds = problem("deepseek-v3", 8);
        ds.weight_precision = crate::hardware::Precision::Bf16;
        let td = TimeModel::new(&ds);
        let w = worker(8);
        let g = worker_groups(&w, td.domain);
        let counts = stage_shapes(&ds.model, 1)[0].counts;
        let kinds = ds.model.layer_kinds();
        let linear = |decode: bool| {
            let batch = if decode {
                Batch::decode(1.0, 1024.0)
            } else {
                Batch::prefill(1.0, 16.0, 0.0)
            };
            let by_layer: f64 = counts
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(kind, n)| {
                    let spec = &kinds.specs()[kind];
                    let fixed = if decode && spec.moe().is_some() {
                        0.0
                    } else {
                        td.dense_gemm_fixed_s
                    };
                    n as f64 * td.layer(&w, &g, spec, &batch, fixed).0.linear_s
                })
                .sum();
            let head = td.lm_head(&w, &g, batch.sampled()).0;
            let staged = td.stage(&w, &g, &counts, true, &batch, decode).linear_s;
            assert!(
                (staged - by_layer - head).abs() < 1e-12,
                "{staged} vs {by_layer}"
            );
        };
        linear(true);
        linear(false);
    }

    #[test]
    fn host_work_per_sequence_bounds_a_small_model_at_thousands_of_sequences() {
        // Llama 3 8B FP8 on one H200: a forward of 2048 decoding sequences takes less than the
        // engine's host work on them (34 µs each, TensorRT-LLM PR 16564), which the overlap
        // scheduler runs beside the GPU: the step is the host's 69.6 ms, the excess overhead.
        let mut p = crate::serving::problem::tests::problem("llama3-8b", "h200-sxm", 1);
        p.weight_precision = crate::hardware::Precision::Fp8;
        p.kv_precision = crate::hardware::Precision::Fp8;
        let tm = TimeModel::new(&p);
        let c = constants();
        let host = |seqs: f64| c.decode_host_us_per_sequence * 1e-6 * seqs;
        let (big, period) = tm.forward(&worker(1), &Batch::decode(2048.0, 192.0), true);
        assert!((big.total_s - host(2048.0)).abs() < 1e-12, "{big:?}");
        assert_eq!(period, big.total_s);
        assert!((big.total_s - 0.0696).abs() < 1e-4, "{}", big.total_s);
        let gpu = big.linear_s + big.attention_s + big.elementwise_s + big.tp_comm_s;
        assert!(gpu < big.total_s, "{gpu}");
        assert!(
            (big.overhead_s - (big.total_s - gpu)).abs() < 1e-9,
            "{} vs {}",
            big.overhead_s,
            big.total_s - gpu
        );
        // At 64 sequences the forward (2.2 ms of host work) hides it: the step is the GPU's.
        let (small, _) = tm.forward(&worker(1), &Batch::decode(64.0, 192.0), true);
        assert!(small.total_s > host(64.0));
        // Its overhead is the step's host time and the 32 layers' launches alone.
        let launches = 32.0 * c.decode_layer_launch_us * 1e-6;
        let fixed = c.decode_step_overhead_us * 1e-6 + launches;
        assert!(
            (small.overhead_s - fixed).abs() < 1e-12,
            "{} vs {fixed}",
            small.overhead_s
        );
        // A prefill forward has no per-sequence host work on the critical path: its overhead
        // is its launches (32 layers at prefill_layer_launch_us), not 69.6 ms.
        let prefill = Batch::prefill(2048.0, 4.0, 0.0);
        let (pf, _) = tm.forward(&worker(1), &prefill, false);
        let prefill_launches = 32.0 * c.prefill_layer_launch_us * 1e-6;
        assert!(
            (pf.overhead_s - prefill_launches).abs() < 1e-12,
            "{}",
            pf.overhead_s
        );
    }

    #[test]
    fn bigger_batches_raise_arithmetic_intensity_until_compute_bound() {
        let p = problem("llama3-8b", 1);
        let tm = TimeModel::new(&p);
        let (small, _) = tm.forward(&worker(1), &decode(1.0), true);
        let (big, _) = tm.forward(&worker(1), &decode(512.0), true);
        assert!(big.arithmetic_intensity > 100.0 * small.arithmetic_intensity);
        // The step time grows far less than the batch.
        assert!(big.total_s < 20.0 * small.total_s);
        let prefill = Batch::prefill(8.0, 1024.0, 0.0);
        let (pf, _) = tm.forward(&worker(1), &prefill, false);
        assert!(!pf.memory_bound);
    }

    #[test]
    fn routed_gemms_are_the_two_after_the_router() {
        let p = problem("deepseek-v3", 16);
        let tm = TimeModel::new(&p);
        let spec = p.model.layer_kinds().specs()[1];
        let moe = spec.moe().unwrap();
        let shard = Shard {
            tp: 2,
            ep: 8,
            etp: None,
            sequence_parallel: false,
        };
        let ops = layer_ops(
            &p.model,
            &spec,
            &shard,
            &OpsContext {
                tokens: 64.0,
                ..tm.ops
            },
        );
        let g = ops.gemms();
        let a = g.iter().position(|x| x.role == GemmRole::Router).unwrap();
        let h = p.model.hidden as f64;
        assert_eq!((g[a].n, g[a].k), (moe.num_experts as f64, h), "router");
        assert_eq!(
            (g[a + 1].role, g[a + 2].role),
            (GemmRole::RoutedExpert, GemmRole::RoutedExpert)
        );
        assert_eq!(g[a + 1].k, h);
        assert_eq!(g[a + 1].n, 2.0 * moe.expert_ffn_hidden as f64 / 2.0);
        assert_eq!(g[a + 2].n, h);
        assert_eq!(g[a + 1].repeat, moe.num_experts as f64 / 8.0);
        // A latent MoE puts its h → ℓ projection between the router and the experts: the
        // experts are still the two routed linears, at the latent width.
        let mut latent = p.model.clone();
        latent.moe.as_mut().unwrap().latent_size = Some(1024);
        let spec = latent.layer_kinds().specs()[1];
        let ops = layer_ops(
            &latent,
            &spec,
            &shard,
            &OpsContext {
                tokens: 64.0,
                ..tm.ops
            },
        );
        let routed: Vec<&Gemm> = ops
            .gemms()
            .iter()
            .filter(|x| x.role == GemmRole::RoutedExpert)
            .collect();
        assert_eq!(routed.len(), 2);
        assert_eq!((routed[0].k, routed[1].n), (1024.0, 1024.0));
    }

    #[test]
    fn the_triton_mla_backend_prefills_in_the_absorbed_form_at_its_own_rate() {
        // SGLang 0.4.3 with DP attention: one rank prefills a 3200-token prompt over all 128
        // heads. Absorbed: 2·128·(512 + 64 + 512)·3200²/2 FLOPs per layer, 61 layers, at
        // triton_mla_attention_efficiency of the 16-bit peak.
        let p = problem("deepseek-v3", 8);
        let tm = TimeModel::new(&p);
        let flash = Worker {
            tp: 1,
            attention_dp: 8,
            ep: 1,
            expert_tp: 8,
            max_sequences: 8,
            ..worker(1)
        };
        let triton = Worker {
            attention_kernel: AttentionKernel::TritonMla,
            ..flash
        };
        let prompt = Batch::prefill(1.0, 3200.0, 0.0);
        let (f, _) = tm.forward(&flash, &prompt, false);
        let (t, _) = tm.forward(&triton, &prompt, false);
        let absorbed = 61.0 * 2.0 * 128.0 * 1088.0 * 3200.0 * 3200.0 / 2.0;
        let rate = constants().triton_mla_attention_efficiency * 989.4e12;
        assert!(
            (t.attention_s / (absorbed / rate) - 1.0).abs() < 1e-9,
            "{} vs {}",
            t.attention_s,
            absorbed / rate
        );
        // The normal form: 2·128·(192 + 128) per pair at the device's attention rate.
        let normal = 61.0 * 2.0 * 128.0 * 320.0 * 3200.0 * 3200.0 / 2.0;
        assert!((f.attention_s / (normal / tm.device.attention_flops_per_s) - 1.0).abs() < 1e-9);
        assert!(t.attention_s > 10.0 * f.attention_s);
        // Everything else in the forward, and a decode step, is the same on either kernel.
        assert!((t.total_s - t.attention_s - (f.total_s - f.attention_s)).abs() < 1e-12);
        let (fd, _) = tm.forward(&flash, &decode(8.0), true);
        let (td, _) = tm.forward(&triton, &decode(8.0), true);
        assert_eq!(fd.total_s, td.total_s);
    }

    #[test]
    fn a_window_caps_the_keys_a_token_attends_to() {
        // No window: the causal form. 100 new tokens after 50 cached, window 120: the first 70
        // see every predecessor (70·50 + 70²/2), the other 30 see 120 each.
        assert_eq!(
            windowed_pairs(50.0, 100.0, f64::INFINITY),
            100.0 * 50.0 + 5000.0
        );
        assert_eq!(
            windowed_pairs(50.0, 100.0, 120.0),
            70.0 * 50.0 + 2450.0 + 30.0 * 120.0
        );
        assert_eq!(windowed_pairs(500.0, 100.0, 128.0), 100.0 * 128.0);
    }

    #[test]
    fn gpt_oss_sliding_layers_read_their_window_only() {
        // gpt-oss-120b alternates 18 sliding-window layers (128 tokens) with 18 full ones; at
        // TP 1 a token's K and V take 2 x 8 heads x 64 x 2 bytes = 2048 bytes per layer. A decode
        // step of 8 sequences at 1024 tokens of context reads 8 x (18 x 1024 + 18 x 128) x 2048.
        let p = crate::serving::problem::tests::problem("gpt-oss-120b", "h100-sxm", 1);
        let tm = TimeModel::new(&p);
        let (t, _) = tm.forward(&worker(1), &decode(8.0), true);
        let by_hand = 8.0 * (18.0 * 1024.0 + 18.0 * 128.0) * 2048.0;
        assert!(
            (t.kv_bytes / by_hand - 1.0).abs() < 1e-12,
            "{} vs {by_hand}",
            t.kv_bytes
        );
    }

    #[test]
    fn mxfp4_experts_are_read_at_their_own_width() {
        // gpt-oss-120b at batch 1: each of 36 layers reads its 4 routed experts (gate/up and
        // down, 3 x 2880 x 2880) at 0.53125 bytes a weight instead of BF16's 2, and everything
        // else as before; the experts' GEMMs keep the BF16 device (weight-only).
        let p = crate::serving::problem::tests::problem("gpt-oss-120b", "h100-sxm", 1);
        let bf16 = TimeModel::new(&p);
        let (a, _) = bf16.forward(&worker(1), &decode(1.0), true);
        let q = ServingProblem {
            expert_weights: Some(super::super::ExpertWeights::Mxfp4),
            ..p.clone()
        };
        let mxfp4 = TimeModel::new(&q);
        let (b, _) = mxfp4.forward(&worker(1), &decode(1.0), true);
        let experts = 36.0 * 4.0 * 3.0 * 2880.0 * 2880.0;
        let saved = experts * (2.0 - (0.5 + 1.0 / 32.0));
        assert!(
            ((a.weight_bytes - b.weight_bytes) / saved - 1.0).abs() < 1e-9,
            "{} vs {saved}",
            a.weight_bytes - b.weight_bytes
        );
        assert!(b.linear_s < a.linear_s && b.memory_bound);
        assert_eq!(a.flops, b.flops);
        assert_eq!(mxfp4.device.gemm.peak_flops, bf16.device.gemm.peak_flops);
    }

    #[test]
    fn mxfp4_experts_compute_at_the_upcast_kernels_rate_on_hopper_only() {
        // A prefill forward of 8192 tokens is compute-bound: on H100 the MXFP4 experts' GEMMs
        // reach mxfp4_upcast_moe_gemm_efficiency of the BF16 peak where BF16 experts reach the
        // device's calibrated efficiency, so their time grows by exactly that ratio; on B200
        // (native MXFP4) it does not change. The rest of the forward is the same.
        let c = constants();
        let prefill = Batch::prefill(8.0, 1024.0, 0.0);
        let forward = |gpu: &str, mxfp4: bool| {
            let mut p = crate::serving::problem::tests::problem("gpt-oss-120b", gpu, 1);
            if mxfp4 {
                p.expert_weights = Some(super::super::ExpertWeights::Mxfp4);
            }
            let tm = TimeModel::new(&p);
            let (t, _) = tm.forward(&worker(1), &prefill, false);
            (t, tm.device.gemm.efficiency)
        };
        let (upcast, dev) = forward("h100-sxm", true);
        let (plain, _) = forward("h100-sxm", false);
        assert!(!upcast.memory_bound && !plain.memory_bound);
        assert!(c.mxfp4_upcast_moe_gemm_efficiency < dev);
        let ratio = upcast.routed_expert_s / plain.routed_expert_s;
        let want = dev / c.mxfp4_upcast_moe_gemm_efficiency;
        assert!((ratio / want - 1.0).abs() < 1e-9, "{ratio} vs {want}");
        let rest = |t: &PhaseTime| t.linear_s - t.routed_expert_s;
        assert!((rest(&upcast) - rest(&plain)).abs() < 1e-12);
        let (native, _) = forward("b200", true);
        let (b200, _) = forward("b200", false);
        assert_eq!(native.routed_expert_s, b200.routed_expert_s);
    }

    #[test]
    fn mxfp4_experts_stream_at_the_upcast_kernels_share_on_hopper_only() {
        // On Hopper (no FP4 tensor cores) gpt-oss's MXFP4 experts run Triton's upcast kernel:
        // their weights stream at mxfp4_upcast_moe_bandwidth_fraction of the HBM bandwidth, so
        // a memory-bound step grows by exactly those bytes at the lower rate; every other byte
        // keeps decode_bandwidth_fraction. B200 runs MXFP4 natively and keeps it for all.
        let c = constants();
        // (decode step of 32 sequences, expert stream bytes/s, other stream bytes/s, HBM bytes/s)
        let step = |gpu: &str, mxfp4: bool, fraction: Option<f64>| {
            let mut p = crate::serving::problem::tests::problem("gpt-oss-120b", gpu, 1);
            if mxfp4 {
                p.expert_weights = Some(super::super::ExpertWeights::Mxfp4);
            }
            let bw = p.cluster.gpu.memory_bandwidth_gbps * 1e9;
            let mut tm = TimeModel::new(&p);
            if let Some(f) = fraction {
                tm.expert_stream_bytes_per_s = bw * f;
            }
            let (t, _) = tm.forward(&worker(1), &decode(32.0), true);
            (t, tm.expert_stream_bytes_per_s, tm.stream_bytes_per_s, bw)
        };
        let (hopper, expert_stream, _, bw) = step("h100-sxm", true, None);
        assert_eq!(expert_stream, bw * c.mxfp4_upcast_moe_bandwidth_fraction);
        let (full, ..) = step("h100-sxm", true, Some(c.decode_bandwidth_fraction));
        // 36 layers of 128 experts (gate/up and down, 3 x 2880 x 2880), of which the 32 tokens'
        // top-4 touch 1 - (1 - 4/128)^32, at 0.53125 bytes a weight.
        let touched = 1.0 - (1.0 - 4.0_f64 / 128.0).powf(32.0);
        let expert_bytes = 36.0 * 128.0 * touched * 3.0 * 2880.0 * 2880.0 * (0.5 + 1.0 / 32.0);
        let extra = expert_bytes
            * (1.0 / (bw * c.mxfp4_upcast_moe_bandwidth_fraction)
                - 1.0 / (bw * c.decode_bandwidth_fraction));
        assert!(
            ((hopper.linear_s - full.linear_s) / extra - 1.0).abs() < 1e-9,
            "{} vs {extra}",
            hopper.linear_s - full.linear_s
        );
        // BF16 experts on H100 and MXFP4 experts on B200 (native) and A100 (no published rate)
        // stream at the decode kernels' share; H200 and H20 run Hopper's kernel.
        for gpu in ["h200-sxm", "h20"] {
            let (_, expert, other, bw) = step(gpu, true, None);
            assert_eq!(expert, bw * c.mxfp4_upcast_moe_bandwidth_fraction, "{gpu}");
            assert!(expert < other, "{gpu}");
        }
        for (gpu, mxfp4) in [("h100-sxm", false), ("b200", true), ("a100-sxm-80g", true)] {
            let (_, expert, other, _) = step(gpu, mxfp4, None);
            assert_eq!(expert, other, "{gpu}");
        }
    }

    #[test]
    fn attention_dp_spreads_mla_decode_attention() {
        // MLA's latent cache is replicated over TP: TP8 reads all of it on every GPU, TP1 with
        // eight attention-DP ranks an eighth.
        let p = problem("deepseek-v3", 8);
        let tm = TimeModel::new(&p);
        let tp8 = Worker {
            ep: 8,
            expert_tp: 1,
            max_sequences: 64,
            ..worker(8)
        };
        let adp8 = Worker {
            tp: 1,
            attention_dp: 8,
            ..tp8
        };
        let (a, _) = tm.forward(&tp8, &decode(64.0), true);
        let (b, _) = tm.forward(&adp8, &decode(8.0), true);
        assert!((a.kv_bytes / b.kv_bytes - 8.0).abs() < 1e-9);
        assert!(b.ep_comm_s > 0.0 && a.ep_comm_s == 0.0);
    }

    #[test]
    fn tensor_parallel_experts_behind_dp_attention_gather_and_reduce_each_token_once() {
        // SGLang 0.4's DP attention without expert parallelism: 8 ranks of 16 decoding
        // sequences; every GPU gathers the stage's 128 tokens, and the partial outputs, summed
        // over each token's top-k in the fused-MoE kernel, are all-reduced once per token.
        let p = problem("deepseek-v3", 8);
        let tm = TimeModel::new(&p);
        let w = Worker {
            attention_dp: 8,
            expert_tp: 8,
            max_sequences: 128,
            ..worker(1)
        };
        let g = worker_groups(&w, tm.domain);
        assert_eq!(g.expert_tp.size, 8);
        let spec = p.model.layer_kinds().specs()[1];
        assert!(spec.moe().is_some());
        let (t, _) = tm.layer(&w, &g, &spec, &decode(16.0), 0.0);
        let bytes = 128.0 * p.model.hidden as f64 * WIRE_BYTES;
        let by_hand = tm
            .fabric
            .collective(Collective::AllGather, bytes, g.expert_tp)
            .total_s
            + tm.fabric
                .collective(Collective::AllReduce, bytes, g.expert_tp)
                .total_s;
        assert!(
            (t.ep_comm_s - by_hand).abs() < 1e-12,
            "{} vs {by_hand}",
            t.ep_comm_s
        );
        // Not per routed copy: doubling top-k leaves the wire bytes alone.
        let mut wide = p.clone();
        wide.model.moe.as_mut().unwrap().top_k *= 2;
        let tw = TimeModel::new(&wide);
        let (t2, _) = tw.layer(
            &w,
            &g,
            &wide.model.layer_kinds().specs()[1],
            &decode(16.0),
            0.0,
        );
        assert_eq!(t2.ep_comm_s, t.ep_comm_s);
        // With expert parallelism the tokens are dispatched and combined instead.
        let ep = Worker {
            ep: 8,
            expert_tp: 1,
            ..w
        };
        let ge = worker_groups(&ep, tm.domain);
        let (te, _) = tm.layer(&ep, &ge, &spec, &decode(16.0), 0.0);
        assert!(te.ep_comm_s > 0.0 && te.ep_comm_s != t.ep_comm_s);
    }

    #[test]
    fn block_scaled_routed_experts_run_at_the_block_fused_moe_rate() {
        // DeepSeek-V3's routed experts at TP8 (N = 512, K = 7168, 256 experts of 400 rows: a
        // 12,800-token prefill, top-8): compute-bound, so the time is the FLOPs over the FP8
        // peak at moe_block_fp8_gemm_efficiency times the shape's utilisation; per-tensor FP8
        // weights run the same shape at moe_gemm_quantized_efficiency.
        let mut p = crate::serving::problem::tests::problem("deepseek-v3", "h200-sxm", 8);
        p.weight_precision = crate::hardware::Precision::Fp8;
        let tm = TimeModel::new(&p);
        let g = Gemm {
            m: 400.0,
            n: 512.0,
            k: 7168.0,
            repeat: 256.0,
            grouped: true,
            role: GemmRole::RoutedExpert,
        };
        let mut lin = Linear::default();
        tm.gemm(&mut lin, &g, 256.0, 0.0);
        // Utilisation by hand (gemm.rs): rows 400 in 4 tiles of 128 (0.78125), N 512 in 4
        // tiles (1), 256 × 16 = 4096 tiles in 32 waves of 132 (0.96970), K 7168/7232 (0.99115).
        let util = 0.78125 * (4096.0 / (32.0 * 132.0)) * (7168.0 / 7232.0);
        let flops = 2.0 * 400.0 * 512.0 * 7168.0 * 256.0;
        let c = constants();
        let by_hand = flops / (1978.9e12 * c.moe_block_fp8_gemm_efficiency * util);
        assert!(
            (lin.compute_s - by_hand).abs() / by_hand < 1e-3,
            "{} vs {by_hand}",
            lin.compute_s
        );
        assert_eq!(lin.seconds, lin.compute_s);
        let mut per_tensor = p.clone();
        per_tensor.weight_scaling = Some(super::super::WeightScaling::Tensor);
        let tt = TimeModel::new(&per_tensor);
        let mut lt = Linear::default();
        tt.gemm(&mut lt, &g, 256.0, 0.0);
        let ratio = c.moe_gemm_quantized_efficiency / c.moe_block_fp8_gemm_efficiency;
        assert!((lin.compute_s / lt.compute_s - ratio).abs() < 1e-9 * ratio);
        // A decode step's experts stream their weights: the kernel's rate does not show.
        let d = Gemm { m: 4.0, ..g };
        let (mut a, mut b) = (Linear::default(), Linear::default());
        tm.gemm(&mut a, &d, 256.0, 0.0);
        tt.gemm(&mut b, &d, 256.0, 0.0);
        assert_eq!(a.seconds, b.seconds);
    }

    #[test]
    fn block_scaled_fp8_gemm_runs_at_the_engines_measured_rate() {
        // DeepSeek-V3's published FP8 checkpoint is block-scaled: the preset defaults to it.
        let mut p = problem("deepseek-v3", 8);
        p.weight_precision = crate::hardware::Precision::Fp8;
        assert!(p.block_scaled_fp8());
        let tm = TimeModel::new(&p);
        // vLLM PR 23280's shape (DeepSeek-V3, N=2112 K=7168) at M=4096 on H100.
        let g = Gemm {
            m: 4096.0,
            n: 2112.0,
            k: 7168.0,
            repeat: 1.0,
            grouped: false,
            role: Default::default(),
        };
        let mut lin = Linear::default();
        tm.gemm(&mut lin, &g, 1.0, 0.0);
        // By hand: 2·4096·2112·7168 = 1.2402e11 FLOPs; utilisation of the shape on 132 SMs:
        // tiles 32 × 17 (N padded to 2176: 0.97059), 544 tiles in 5 waves of 132 (0.82424),
        // K 7168/(7168+64) (0.99115), so 0.245 × 0.79291 = 0.19426 of 1978.9 TFLOP/s =
        // 384.4 TFLOP/s, 322.6 µs (the PR measured 403.0 TFLOP/s, 307.8 µs). The bytes
        // (15.1 MB of weights, 75.3 MB of 16-bit activations at 2.68 TB/s: 33.8 µs) are less.
        let by_hand = 1.2402e11 / (1978.9e12 * 0.245 * 0.97059 * 0.82424 * 0.99115);
        assert!(
            (lin.seconds - by_hand).abs() / by_hand < 1e-3,
            "{} vs {by_hand}",
            lin.seconds
        );
        assert!((lin.seconds - 322.6e-6).abs() < 0.5e-6, "{}", lin.seconds);
        let measured = 2.0 * 4096.0 * 2112.0 * 7168.0 / 403.0e12;
        assert!(
            (lin.seconds / measured - 1.0).abs() < 0.06,
            "{} vs {measured}",
            lin.seconds
        );

        // Per-tensor FP8 of the same shape keeps the GPU's calibrated FP8 efficiency, and a
        // whole prefill forward is slower block-scaled.
        let mut per_tensor = p.clone();
        per_tensor.weight_scaling = Some(super::super::WeightScaling::Tensor);
        let tt = TimeModel::new(&per_tensor);
        let mut lt = Linear::default();
        tt.gemm(&mut lt, &g, 1.0, 0.0);
        assert!(
            lt.seconds < 0.5 * lin.seconds,
            "{} vs {}",
            lt.seconds,
            lin.seconds
        );
        let prefill = Batch::prefill(4.0, 3200.0, 0.0);
        let (block, _) = tm.forward(&worker(8), &prefill, false);
        let (tensor, _) = tt.forward(&worker(8), &prefill, false);
        // The routed experts (fused-MoE, moe_gemm_quantized_efficiency) are the same in both.
        assert!(
            block.linear_s > 1.2 * tensor.linear_s,
            "{} vs {}",
            block.linear_s,
            tensor.linear_s
        );
        assert!(block.linear_s < lin.seconds / lt.seconds * tensor.linear_s);
        // Decode steps read the weights: the kernel's rate hardly matters there.
        let (bd, _) = tm.forward(&worker(8), &decode(1.0), true);
        let (td, _) = tt.forward(&worker(8), &decode(1.0), true);
        assert!(
            (bd.total_s / td.total_s - 1.0).abs() < 0.05,
            "{:?} vs {:?}",
            bd,
            td
        );
    }
}

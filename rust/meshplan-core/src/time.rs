//! Step time of a plan (COSTMODEL §3–§5): per-layer compute from GEMM shapes (§5.2), flash
//! attention and element-wise work (§5.3); exposed TP/SP collectives (§3.4), CP ring exchange
//! (§3.8) and EP all-to-all (§3.7) on the fabric each group lands on (§3.2–3.3); the pipeline
//! schedule's steady state and bubble (§4) with fill/drain p2p (§3.5); exposed DP/ZeRO
//! communication (§3.6) and the optimizer step (§3.9).

use crate::comm::{Collective, Fabric};
use crate::gemm::{linear_s, GemmDevice};
use crate::hardware::Precision;
use crate::layout::Groups;
use crate::memory::{stage_params, StageParams};
use crate::model::{Activation, Model};
use crate::plan::{Plan, Recompute, Schedule};
use crate::report::TimeBreakdown;
use crate::stages::{add_repeated, Stage, StageRun};
use crate::traffic::{self, WIRE_BYTES};
use crate::Problem;

/// Parameters per data-parallel gradient bucket: Megatron's DDP default
/// (`bucket_size = max(40_000_000, 1_000_000 · dp)`, megatron/core/distributed), the lower bound.
const DP_BUCKET_PARAMS: f64 = 40e6;
/// Bytes moved per element cast from 16 bits to 8 (read 2, write 1).
const CAST_BYTES: f64 = 3.0;
/// Bytes moved per element of a transposed FP8 copy (write 1, read 1).
const TRANSPOSE_BYTES: f64 = 2.0;
/// Bytes moved per attention-score element by unfused scale-mask-softmax and dropout in the
/// forward pass: scores written and read (2 + 2), probabilities written and read (2 + 2),
/// dropout mask (1), dropped probabilities written (2) [KOR22 §4.1 tensors].
const UNFUSED_SCORE_BYTES: f64 = 11.0;
/// Flash-attention backward does 2.5× the forward's matmul work (5 GEMMs against 2) [FA2 §3.2].
const ATTENTION_BACKWARD_RATIO: f64 = 2.5;
/// Bytes of HBM traffic per parameter of an Adam step on fp32 state: read grad, master, m, v;
/// write master, m, v and the bf16 copy (§3.9), for `grad_bytes = 4` and 12 bytes of state.
fn optimizer_bytes_per_param(grad_bytes: f64, state_bytes: f64) -> f64 {
    grad_bytes + 2.0 * state_bytes + 2.0
}

/// Seconds of one micro-batch through one layer on one GPU, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pass {
    pub compute: f64,
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
}

impl Pass {
    pub fn total(&self) -> f64 {
        self.compute + self.tp + self.cp + self.ep
    }

    fn add_scaled(&mut self, other: &Pass, k: f64) {
        self.compute += other.compute * k;
        self.tp += other.tp * k;
        self.cp += other.cp * k;
        self.ep += other.ep * k;
    }
}

/// Forward and backward (recompute included) of one layer or stage, per micro-batch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerTime {
    pub fwd: Pass,
    pub bwd: Pass,
    /// Weight-gradient GEMM part of `bwd.compute` (what zero-bubble schedules defer).
    pub wgrad: f64,
}

impl LayerTime {
    fn add_scaled(&mut self, other: &LayerTime, k: f64) {
        self.fwd.add_scaled(&other.fwd, k);
        self.bwd.add_scaled(&other.bwd, k);
        self.wgrad += other.wgrad * k;
    }

    /// Forward plus backward.
    pub fn total(&self) -> f64 {
        self.fwd.total() + self.bwd.total()
    }
}

/// A layer's time without recompute, and its core-attention forward (what selective recompute
/// repeats).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerParts {
    pub time: LayerTime,
    pub attention_fwd: f64,
}

impl LayerParts {
    /// The layer's time under `recompute`: full recompute repeats the forward in the backward,
    /// selective the core attention, op-level selective half of the rest of the forward.
    pub fn with(&self, recompute: Recompute) -> LayerTime {
        let LayerTime {
            fwd,
            mut bwd,
            wgrad,
        } = self.time;
        match recompute {
            Recompute::Full => bwd.add_scaled(&fwd, 1.0),
            Recompute::Selective => bwd.compute += self.attention_fwd,
            // Every other matmul and the element-wise work between them are rebuilt; the
            // attention output is kept (its collectives are not repeated: the saved
            // reduce-scatter outputs are on the save list).
            Recompute::SelectiveOp => bwd.compute += 0.5 * (fwd.compute - self.attention_fwd),
            Recompute::None => {}
        }
        LayerTime { fwd, bwd, wgrad }
    }
}

/// Device and fabric constants of one plan, resolved once.
pub struct TimeContext<'a> {
    problem: &'a Problem,
    plan: &'a Plan,
    groups: Groups,
    fabric: Fabric,
    gemm: GemmDevice,
    /// 16-bit GEMMs (unfused attention).
    gemm16: GemmDevice,
    /// The linear layers run in FP8/FP4 and cast their inputs.
    quantized: bool,
    attention_flops_per_s: f64,
    memory_bytes_per_s: f64,
    /// Tokens of one micro-batch on one GPU before TP sharding: `b·s/c`.
    tokens: f64,
}

impl<'a> TimeContext<'a> {
    pub fn new(problem: &'a Problem, plan: &'a Plan, groups: Groups) -> Self {
        let gpu = &problem.cluster.gpu;
        let cal = &gpu.calibration;
        let precision = problem.workload.precision;
        let memory_bytes_per_s = gpu.memory_bandwidth_gbps * 1e9 * cal.memory_efficiency;
        let low_precision = matches!(
            precision,
            Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4
        );
        // Attention runs in 16-bit even when the linear layers run in FP8/FP4 (Transformer Engine default).
        let attention_precision = if low_precision {
            Precision::Bf16
        } else {
            precision
        };
        let attention_peak = gpu
            .peak_tflops
            .get(attention_precision)
            .or(gpu.peak_tflops.get(Precision::Fp16))
            .unwrap_or(0.0)
            * 1e12;
        let gemm = GemmDevice {
            peak_flops: gpu.peak_tflops.get(precision).unwrap_or(0.0) * 1e12,
            efficiency: cal
                .gemm_efficiency
                .get(precision)
                .or(cal.gemm_efficiency.get(Precision::Bf16))
                .unwrap_or(0.5),
            sm_count: gpu.sm_count,
            memory_bytes_per_s,
            element_bytes: match precision {
                Precision::Fp8 | Precision::Mxfp8 => 1.0,
                Precision::Nvfp4 => 0.5,
                Precision::Bf16 | Precision::Fp16 => 2.0,
            },
        };
        let gemm16 = GemmDevice {
            peak_flops: attention_peak,
            efficiency: cal
                .gemm_efficiency
                .get(attention_precision)
                .or(cal.gemm_efficiency.get(Precision::Bf16))
                .unwrap_or(0.5),
            element_bytes: 2.0,
            ..gemm
        };
        TimeContext {
            problem,
            plan,
            groups,
            fabric: Fabric::of(&problem.cluster),
            gemm,
            gemm16,
            quantized: low_precision,
            attention_flops_per_s: attention_peak * cal.attention_efficiency,
            memory_bytes_per_s,
            tokens: plan.micro_batch as f64 * problem.workload.seq_len as f64 / plan.cp as f64,
        }
    }

    fn model(&self) -> &Model {
        &self.problem.model
    }

    fn sp_div(&self) -> f64 {
        if self.plan.sequence_parallel {
            self.plan.tp as f64
        } else {
            1.0
        }
    }

    /// Adds a linear layer's (fwd, dgrad, wgrad) to `acc`.
    ///
    /// FP8/FP4 linears first cast their 16-bit inputs (read 2 B, write 1 B per element of the
    /// activation in forward, of the output gradient in backward) and keep a transposed copy of
    /// the input for the weight-gradient GEMM (write and read 1 B) [derived: Transformer
    /// Engine's cast/transpose kernels; memory-bound, §5.3].
    fn linear(&self, acc: &mut (f64, f64, f64), m: f64, n: f64, k: f64, repeat: f64) {
        let (mut f, mut d, w) = linear_s(&self.gemm, m, n, k);
        if self.quantized {
            f += CAST_BYTES * m * k / self.memory_bytes_per_s;
            d += (CAST_BYTES * m * n + TRANSPOSE_BYTES * m * k) / self.memory_bytes_per_s;
        }
        acc.0 += f * repeat;
        acc.1 += d * repeat;
        acc.2 += w * repeat;
    }

    /// One tensor-parallel "all-reduce point" on `bytes`: an all-reduce, or with sequence
    /// parallelism the reduce-scatter + all-gather pair that replaces it (§3.4).
    fn tp_point(&self, bytes: f64) -> f64 {
        let g = self.groups.tp;
        if self.plan.sequence_parallel {
            self.fabric.collective_s(Collective::AllGather, bytes, g)
                + self
                    .fabric
                    .collective_s(Collective::ReduceScatter, bytes, g)
        } else {
            self.fabric.collective_s(Collective::AllReduce, bytes, g)
        }
    }

    /// Seconds of one layer (dense or MoE) for one micro-batch.
    pub fn layer(&self, moe: bool) -> LayerTime {
        self.layer_parts(moe).with(self.plan.recompute)
    }

    /// [`Self::layer`] before recompute, which only adds to the backward pass: the same for
    /// every recompute mode of the plan.
    pub fn layer_parts(&self, moe: bool) -> LayerParts {
        let model = self.model();
        let plan = self.plan;
        let cal = &self.problem.cluster.gpu.calibration;
        let t = plan.tp as f64;
        let tok = self.tokens;
        let h = model.hidden as f64;
        let a_local = model.heads as f64 / t;
        let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
        let mut g = (0.0, 0.0, 0.0);

        // Attention projections (§5.2 table).
        match &model.mla {
            Some(m) => {
                match m.q_lora_rank {
                    Some(r) => {
                        self.linear(&mut g, tok, r as f64, h, 1.0);
                        self.linear(&mut g, tok, a_local * dqk, r as f64, 1.0);
                    }
                    None => self.linear(&mut g, tok, a_local * dqk, h, 1.0),
                }
                self.linear(
                    &mut g,
                    tok,
                    (m.kv_lora_rank + m.qk_rope_head_dim) as f64,
                    h,
                    1.0,
                );
                self.linear(
                    &mut g,
                    tok,
                    a_local * (m.qk_nope_head_dim as f64 + dv),
                    m.kv_lora_rank as f64,
                    1.0,
                );
                self.linear(&mut g, tok, h, a_local * dv, 1.0);
            }
            None => {
                let g_local = (model.kv_heads as f64 / t).max(1.0);
                self.linear(&mut g, tok, (a_local + 2.0 * g_local) * dqk, h, 1.0);
                self.linear(&mut g, tok, h, a_local * dqk, 1.0);
            }
        }
        let gate_up = match model.activation {
            Activation::Swiglu => 2.0,
            Activation::Gelu => 1.0,
        };
        let moe_cfg = model.moe.as_ref().filter(|_| moe);
        match moe_cfg {
            Some(m) => {
                let e = plan.ep as f64;
                let local_experts = m.num_experts as f64 / e;
                let copies = tok * m.top_k as f64 * cal.moe_imbalance;
                let per_expert = copies / local_experts;
                let fe = m.expert_ffn_hidden as f64;
                self.linear(&mut g, tok / self.sp_div(), m.num_experts as f64, h, 1.0);
                self.linear(&mut g, per_expert, gate_up * fe / t, h, local_experts);
                self.linear(&mut g, per_expert, h, fe / t, local_experts);
                let fsh = model.shared_ffn_hidden() as f64;
                if fsh > 0.0 {
                    self.linear(&mut g, tok, gate_up * fsh / t, h, 1.0);
                    self.linear(&mut g, tok, h, fsh / t, 1.0);
                }
            }
            None => {
                let f = model.ffn_hidden as f64;
                self.linear(&mut g, tok, gate_up * f / t, h, 1.0);
                self.linear(&mut g, tok, h, f / t, 1.0);
            }
        }

        // Core attention: each query sees s/2 keys on average under the causal mask.
        let seq = self.problem.workload.seq_len as f64;
        let (attn_fwd, attn_bwd) = if self.problem.workload.flash_attention {
            // Each query sees s/2 keys on average under the causal mask.
            let fwd = tok * 2.0 * a_local * (dqk + dv) * (seq / 2.0) / self.attention_flops_per_s;
            (fwd, ATTENTION_BACKWARD_RATIO * fwd)
        } else {
            // Unfused: QKᵀ and P·V as batched 16-bit GEMMs over the full s × s square, plus the
            // memory-bound softmax and dropout over the score tensor (backward ≈ 2× both).
            let batches = plan.micro_batch as f64 * a_local;
            let q = seq / plan.cp as f64;
            let gemms = batches
                * (crate::gemm::gemm_s(&self.gemm16, q, seq, dqk)
                    + crate::gemm::gemm_s(&self.gemm16, q, dv, seq));
            let scores = UNFUSED_SCORE_BYTES * batches * q * seq / self.memory_bytes_per_s;
            (gemms + scores, 2.0 * (gemms + scores))
        };
        // Element-wise work (norms, activation, RoPE, residuals), sequence-sharded with SP (§5.3).
        let mut elem_fwd =
            cal.elementwise_bytes_per_hidden * h * tok / self.sp_div() / self.memory_bytes_per_s;
        if let Some(m) = moe_cfg {
            // Routed copies: permute and unpermute move each copy's hidden vector twice
            // (4 + 4 bytes per element) and the expert activation reads two f_e/t-wide
            // intermediates and writes one (6 bytes per element) [derived, §5.3].
            let copies = tok * m.top_k as f64 * cal.moe_imbalance;
            let per_copy = 8.0 * h + 6.0 * m.expert_ffn_hidden as f64 / t;
            elem_fwd += copies * per_copy / self.memory_bytes_per_s;
        }

        // Host and launch overhead: an MoE layer runs about twice the kernels of a dense one.
        let overhead = cal.layer_overhead_us * 1e-6 * if moe_cfg.is_some() { 2.0 } else { 1.0 };
        let fwd_compute = g.0 + attn_fwd + elem_fwd + overhead;
        // LoRA freezes the base weights: no weight-gradient GEMMs.
        let wgrad = if self.problem.workload.lora { 0.0 } else { g.2 };
        let bwd_compute = g.1 + wgrad + attn_bwd + 2.0 * elem_fwd + 2.0 * overhead;

        // Tensor parallel (§3.4).
        let tp_fwd = if plan.tp > 1 {
            let tp_points = traffic::tp_points_per_layer(moe_cfg) as f64;
            (1.0 - cal.tp_overlap) * tp_points * self.tp_point(tok * h * WIRE_BYTES)
        } else {
            0.0
        };

        // Context parallel ring (§3.8): c−1 K/V blocks, each hidden behind one attention block.
        let (cp_fwd, cp_bwd) = if plan.cp > 1 {
            let c = plan.cp as f64;
            let kv_bytes = tok * traffic::cp_kv_bytes_per_token(model, plan.tp);
            let xfer = self.fabric.p2p_s(kv_bytes, self.groups.cp.within_domain());
            let fwd = (c - 1.0) * (xfer - attn_fwd / c).max(0.0);
            let bwd = (c - 1.0) * (2.0 * xfer - attn_bwd / c).max(0.0);
            (fwd, bwd)
        } else {
            (0.0, 0.0)
        };

        // Expert parallel all-to-all (§3.7): dispatch + combine each way.
        let ep_fwd = match moe_cfg {
            Some(m) if plan.ep > 1 => {
                let tokens = tok / self.sp_div();
                let one_way =
                    self.fabric
                        .dispatch_s(tokens, h * WIRE_BYTES, m.top_k, self.groups.ep);
                (1.0 - cal.ep_overlap) * 2.0 * one_way * cal.moe_imbalance
            }
            _ => 0.0,
        };

        let fwd = Pass {
            compute: fwd_compute,
            tp: tp_fwd,
            cp: cp_fwd,
            ep: ep_fwd,
        };
        let bwd = Pass {
            compute: bwd_compute,
            tp: tp_fwd,
            cp: cp_bwd,
            ep: ep_fwd,
        };
        LayerParts {
            time: LayerTime { fwd, bwd, wgrad },
            attention_fwd: attn_fwd,
        }
    }

    /// Extra seconds of the first (embedding) and last (LM head, loss) ranks per micro-batch.
    fn ends(&self, stage: &Stage) -> LayerTime {
        let mut out = LayerTime::default();
        let model = self.model();
        let t = self.plan.tp as f64;
        let h = model.hidden as f64;
        let tok = self.tokens;
        let act_bytes = tok * h * WIRE_BYTES;
        let tp = if self.plan.tp > 1 {
            self.tp_point(act_bytes)
        } else {
            0.0
        };
        if stage.first {
            // Vocab-parallel embedding: one all-reduce (reduce-scatter with SP) forward.
            out.fwd.tp += tp;
            out.fwd.compute += 2.0 * act_bytes / self.memory_bytes_per_s;
        }
        if stage.last {
            let v_local = model.vocab as f64 / t;
            let (f, d, w) = linear_s(&self.gemm, tok, v_local, h);
            // Softmax cross-entropy over fp32 logits: a few passes over tok × V/t.
            let ce = 3.0 * 4.0 * tok * v_local / self.memory_bytes_per_s;
            out.fwd.compute += f + ce;
            let w = if self.problem.workload.lora { 0.0 } else { w };
            out.bwd.compute += d + w + ce;
            out.wgrad += w;
            out.fwd.tp += tp;
            out.bwd.tp += tp;
        }
        out
    }

    /// Seconds of one micro-batch through every layer of `stage` (forward and backward).
    pub fn stage(&self, stage: &Stage, dense: &LayerTime, moe: &LayerTime) -> LayerTime {
        let mut out = self.ends(stage);
        out.add_scaled(dense, stage.dense_layers as f64);
        out.add_scaled(moe, stage.moe_layers as f64);
        out
    }

    /// The DP/ZeRO collectives of a stage holding `params` (`layers` layers) at ZeRO stage
    /// `zero`, per step and before any overlap (§3.6).
    pub fn dp_comm(&self, zero: u8, params: &StageParams, layers: u32) -> DpComm {
        if self.problem.workload.lora {
            return DpComm::None; // only the (negligible) adapters are reduced
        }
        let gb = self.problem.workload.grad_bytes as f64;
        let wb = WIRE_BYTES;
        let f = &self.fabric;
        let groups = [
            (params.dense, self.groups.dense_dp),
            (params.expert, self.groups.expert_dp),
        ];
        // Gradient buckets of at most BUCKET_PARAMS parameters, each its own collective (so
        // each pays the latency); the bandwidth term is that of the whole buffer.
        let coll = |kind, per_param: f64| -> f64 {
            groups
                .iter()
                .map(|(p, g)| {
                    let buckets = (p / DP_BUCKET_PARAMS).ceil().max(1.0);
                    buckets * f.collective_s(kind, p / buckets * per_param, *g)
                })
                .sum()
        };
        match zero {
            0 => DpComm::AllReduce(coll(Collective::AllReduce, gb)),
            1 | 2 => DpComm::Sharded {
                per_micro_batch: zero == 2,
                reduce_scatter: coll(Collective::ReduceScatter, gb),
                all_gather: coll(Collective::AllGather, wb),
            },
            _ => {
                // One FSDP unit per layer, each unit's gather and reduce-scatter a collective of
                // its own (so the latency is paid per unit).
                let units = layers.max(1) as f64;
                let unit = |kind, per_param: f64| -> f64 {
                    groups
                        .iter()
                        .map(|(p, g)| f.collective_s(kind, p / units * per_param, *g))
                        .sum()
                };
                DpComm::PerUnit {
                    all_gather: unit(Collective::AllGather, wb),
                    reduce_scatter: unit(Collective::ReduceScatter, gb),
                    units,
                }
            }
        }
    }

    /// Exposed seconds per step of `comm` on a stage whose per-micro-batch time is `st` (§3.6).
    pub fn dp_hidden(&self, comm: &DpComm, st: &LayerTime, micro_batches: u32) -> f64 {
        let cal = &self.problem.cluster.gpu.calibration;
        let m = micro_batches as f64;
        let (t_f, t_b) = (st.fwd.total(), st.bwd.total());
        let hide = |comm: f64, window: f64| (comm - cal.dp_overlap * window).max(0.0);
        match *comm {
            DpComm::None => 0.0,
            DpComm::AllReduce(ar) => hide(ar, t_b),
            DpComm::Sharded {
                per_micro_batch: false,
                reduce_scatter,
                all_gather,
            } => hide(reduce_scatter, t_b) + hide(all_gather, t_f),
            DpComm::Sharded {
                per_micro_batch: true,
                reduce_scatter,
                all_gather,
            } => m * hide(reduce_scatter, t_b) + hide(all_gather, t_f),
            DpComm::PerUnit {
                all_gather: ag,
                reduce_scatter: rs,
                units,
            } => {
                // Every unit is gathered in forward and again in backward and its gradient
                // reduce-scattered. The gather of unit i+1 is prefetched behind unit i's
                // compute: per unit and pass, what the compute does not cover is exposed; the
                // first gather and the last reduce-scatter always are (§3.6).
                let per_micro_batch = units * (hide(ag, t_f / units) + hide(ag + rs, t_b / units));
                m * per_micro_batch + ag + rs
            }
        }
    }

    /// Exposed DP/ZeRO communication of `stage` per step (§3.6), given its per-micro-batch time.
    fn dp_exposed(&self, stage: &Stage, st: &LayerTime, micro_batches: u32) -> f64 {
        let params = stage_params(self.model(), self.plan, stage);
        let comm = self.dp_comm(self.plan.zero, &params, stage.layers());
        self.dp_hidden(&comm, st, micro_batches)
    }

    /// Optimizer-step seconds of a stage holding `params` at ZeRO stage `zero` (§3.9):
    /// memory-bound over the local optimizer shard.
    pub fn optimizer_with(&self, zero: u8, params: &StageParams) -> f64 {
        if self.problem.workload.lora {
            return 0.0; // only the (negligible) adapters are updated
        }
        let shard = |p: f64, group: u32| {
            if zero >= 1 {
                p / group.max(1) as f64
            } else {
                p
            }
        };
        let local = shard(params.dense, self.groups.dense_dp.size)
            + shard(params.expert, self.groups.expert_dp.size);
        let w = &self.problem.workload;
        local * optimizer_bytes_per_param(w.grad_bytes as f64, w.optimizer.state_bytes_per_param())
            / self.memory_bytes_per_s
    }

    /// Optimizer-step seconds of `stage` (§3.9).
    fn optimizer_s(&self, stage: &Stage) -> f64 {
        self.optimizer_with(
            self.plan.zero,
            &stage_params(self.model(), self.plan, stage),
        )
    }

    /// Seconds of one pipeline hop: a micro-batch's activations to the next stage (§3.5).
    pub fn pp_hop_s(&self) -> f64 {
        let bytes = self.tokens * self.model().hidden as f64 * WIRE_BYTES / self.sp_div();
        self.fabric.p2p_s(bytes, self.groups.pp.within_domain())
    }

    /// Exposed fill and drain p2p of the pipeline with `vpp` chunks per rank, from one `hop`.
    pub fn pp_p2p_s(&self, vpp: u32, hop: f64) -> f64 {
        if self.plan.pp > 1 {
            2.0 * (self.plan.pp - 1) as f64 * vpp as f64 * hop
        } else {
            0.0
        }
    }

    /// The step time of the plan over its pipeline ranks (`runs`), by component.
    pub fn step(&self, runs: &[StageRun], micro_batches: u32) -> TimeBreakdown {
        let (dense, moe) = self.layers();
        self.step_with(runs, micro_batches, &dense, &moe)
    }

    /// Per-micro-batch times of a dense and an MoE layer (equal for dense models). They depend
    /// on the degrees, micro-batch, sequence parallelism and recompute, not on ZeRO or schedule.
    pub fn layers(&self) -> (LayerTime, LayerTime) {
        let dense = self.layer(false);
        let moe = if self.model().is_moe() {
            self.layer(true)
        } else {
            dense
        };
        (dense, moe)
    }

    /// [`Self::step`] with the layer times already computed by [`Self::layers`]. Every term is
    /// what a loop over the ranks one by one gives, bit for bit, from one stage time per run.
    pub fn step_with(
        &self,
        runs: &[StageRun],
        micro_batches: u32,
        dense: &LayerTime,
        moe: &LayerTime,
    ) -> TimeBreakdown {
        let plan = self.plan;
        let per_run: Vec<(LayerTime, u32)> = runs
            .iter()
            .map(|r| (self.stage(&r.stage, dense, moe), r.count))
            .collect();
        let pipeline = PipelineTimes::of_runs(&per_run);
        let bubble = pipeline.bubble(plan.schedule(), plan.vpp);
        let pp_p2p = self.pp_p2p_s(plan.vpp, self.pp_hop_s());
        // Stage j finishes its last backward about j backward passes before stage 0; within a
        // run the first rank is the one that exposes the most.
        let dp = runs
            .iter()
            .zip(&per_run)
            .map(|(r, (st, _))| {
                let first = &r.stage;
                (self.dp_exposed(first, st, micro_batches) - first.index as f64 * st.bwd.total())
                    .max(0.0)
            })
            .fold(0.0, f64::max);
        let optimizer = runs
            .iter()
            .map(|r| self.optimizer_s(&r.stage))
            .fold(0.0, f64::max);
        breakdown(
            micro_batches,
            &pipeline.worst,
            pp_p2p,
            bubble,
            dp,
            optimizer,
        )
    }
}

/// The DP/ZeRO collectives of one stage per step, seconds before overlap
/// ([`TimeContext::dp_comm`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DpComm {
    /// Nothing reduced (LoRA).
    None,
    /// ZeRO-0: one all-reduce of the gradients.
    AllReduce(f64),
    /// ZeRO-1 and 2: reduce-scatter of the gradients (every micro-batch under ZeRO-2) and
    /// all-gather of the updated weights.
    Sharded {
        per_micro_batch: bool,
        reduce_scatter: f64,
        all_gather: f64,
    },
    /// ZeRO-3: one all-gather and one reduce-scatter per FSDP unit, `units` units.
    PerUnit {
        all_gather: f64,
        reduce_scatter: f64,
        units: f64,
    },
}

/// What the schedules need from the per-micro-batch times of the stages (§4).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PipelineTimes {
    /// The slowest stage (the last of equal maxima).
    pub worst: LayerTime,
    /// Sum of the stages' totals.
    pub sum: f64,
    /// Sum of the stages' totals less their weight-gradient parts.
    pub deferred: f64,
}

impl PipelineTimes {
    /// From the per-micro-batch times of the stages, in order.
    pub fn of(per_stage: &[LayerTime]) -> Self {
        PipelineTimes {
            worst: per_stage
                .iter()
                .copied()
                .max_by(|a, b| a.total().total_cmp(&b.total()))
                .unwrap_or_default(),
            sum: per_stage.iter().map(LayerTime::total).sum(),
            deferred: per_stage.iter().map(|s| s.total() - s.wgrad).sum(),
        }
    }

    /// [`Self::of`] the ranks of `runs` — `(per-micro-batch time, ranks)` in rank order —
    /// without a loop over the ranks of a run (the sums are the rank-by-rank sums, bit for bit:
    /// [`add_repeated`]).
    pub fn of_runs(runs: &[(LayerTime, u32)]) -> Self {
        let mut out = PipelineTimes {
            sum: std::iter::empty::<f64>().sum(),
            deferred: std::iter::empty::<f64>().sum(),
            ..PipelineTimes::default()
        };
        let mut worst: Option<&LayerTime> = None;
        for (t, count) in runs.iter().filter(|(_, count)| *count > 0) {
            if worst.is_none_or(|w| t.total().total_cmp(&w.total()).is_ge()) {
                worst = Some(t);
            }
            out.sum = add_repeated(out.sum, t.total(), *count);
            out.deferred = add_repeated(out.deferred, t.total() - t.wgrad, *count);
        }
        out.worst = worst.copied().unwrap_or_default();
        out
    }

    /// The bubble of `schedule` with `vpp` chunks per rank (§4), before clamping at zero.
    pub fn bubble(&self, schedule: Schedule, vpp: u32) -> f64 {
        let worst = &self.worst;
        match schedule {
            Schedule::OneFOneB => self.sum - worst.total(),
            Schedule::Interleaved => (self.sum - worst.total()) / vpp as f64,
            Schedule::ZeroBubbleH1 => (self.deferred - (worst.total() - worst.wgrad)).max(0.0),
        }
    }
}

/// The step's breakdown from its parts: `micro_batches` micro-batches through the `worst`
/// stage, then the pipeline, DP/ZeRO and optimizer terms.
pub fn breakdown(
    micro_batches: u32,
    worst: &LayerTime,
    pp_p2p: f64,
    bubble: f64,
    dp: f64,
    optimizer: f64,
) -> TimeBreakdown {
    let m = micro_batches as f64;
    TimeBreakdown {
        compute: m * (worst.fwd.compute + worst.bwd.compute),
        tp: m * (worst.fwd.tp + worst.bwd.tp),
        cp: m * (worst.fwd.cp + worst.bwd.cp),
        ep: m * (worst.fwd.ep + worst.bwd.ep),
        pp_p2p,
        bubble: bubble.max(0.0),
        dp,
        optimizer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(total: f64, wgrad: f64) -> LayerTime {
        LayerTime {
            fwd: Pass {
                compute: total / 3.0,
                ..Pass::default()
            },
            bwd: Pass {
                compute: total - total / 3.0,
                ..Pass::default()
            },
            wgrad,
        }
    }

    #[test]
    fn pipeline_times_of_runs_are_those_of_the_ranks_bit_for_bit() {
        let a = time(0.123_456_7, 0.01);
        let b = time(0.234_567_8, 0.02);
        let zero = LayerTime::default();
        let cases: Vec<Vec<(LayerTime, u32)>> = vec![
            vec![(a, 1), (b, 14), (a, 1)],
            vec![(b, 1), (a, 125), (b, 1)],
            vec![(a, 1), (b, 3), (zero, 40), (b, 1)],
            vec![(b, 2), (b, 0), (a, 1)],
            vec![(a, 1)],
        ];
        for runs in cases {
            let ranks: Vec<LayerTime> = runs
                .iter()
                .flat_map(|(t, n)| std::iter::repeat_n(*t, *n as usize))
                .collect();
            let want = PipelineTimes::of(&ranks);
            let got = PipelineTimes::of_runs(&runs);
            assert_eq!(got.sum.to_bits(), want.sum.to_bits());
            assert_eq!(got.deferred.to_bits(), want.deferred.to_bits());
            assert_eq!(got.worst, want.worst);
        }
        // A run of empty ranks as long as a pipeline can be costs one addition.
        let huge = PipelineTimes::of_runs(&[(a, 1), (zero, u32::MAX - 2), (b, 1)]);
        assert_eq!(huge.sum, a.total() + b.total());
    }
}

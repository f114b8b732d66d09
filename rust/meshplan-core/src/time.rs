//! Step time of a plan (docs/costmodel.md §3–§5): per-layer compute from GEMM shapes (§5.2), flash
//! attention and element-wise work (§5.3); exposed TP/SP collectives (§3.4), CP ring exchange
//! (§3.8) and EP all-to-all (§3.7) on the fabric each group lands on (§3.2–3.3); the pipeline
//! schedule's steady state and bubble (§4) with fill/drain p2p (§3.5); exposed DP/ZeRO
//! communication (§3.6) and the optimizer step (§3.9).
//!
//! A layer's time is the sum of its operations ([`crate::layer::layer_ops`]) on the
//! [`Device`] (built from the GPU and precision alone) and the [`Fabric`]; the framework's
//! behaviour (buckets, FSDP units, kernel facts) is the [`Stack`]. A stage sums its layer kinds
//! by count. `levels` composes these into a plan's step.

use crate::comm::{Collective, CollectiveCost, CollectiveModel, Fabric};
use crate::device::Device;
use crate::gemm::{grouped_linear_s, linear_s, GemmDevice, LinearTimes};
use crate::hardware::Precision;
use crate::layer::{
    layer_ops, Gemm, GemmRole, LayerCounts, LayerOps, OpsContext, Shard, FP32_BYTES,
    MAX_LAYER_KINDS,
};
use crate::layout::Group;
use crate::layout::Groups;
use crate::memory::StageParams;
use crate::model::Model;
use crate::plan::CpExchange;
use crate::plan::{Plan, Recompute, RecomputeModule, RecomputeModules, Schedule};
use crate::precision::{GemmPrecision, PrecisionRecipe};
use crate::report::TimeBreakdown;
use crate::stack::Stack;
use crate::stages::{add_repeated, Stage};
use crate::traffic::WIRE_BYTES;
use crate::workload::CudaGraphs;
use crate::Problem;

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
    /// Part of `fwd.compute + bwd.compute` the GPU waits for the host to issue kernels
    /// (host-bound MoE layers, §5.5).
    pub host_wait: f64,
}

impl LayerTime {
    fn add_scaled(&mut self, other: &LayerTime, k: f64) {
        self.fwd.add_scaled(&other.fwd, k);
        self.bwd.add_scaled(&other.bwd, k);
        self.wgrad += other.wgrad * k;
        self.host_wait += other.host_wait * k;
    }

    /// Forward plus backward.
    pub fn total(&self) -> f64 {
        self.fwd.total() + self.bwd.total()
    }
}

/// What recomputing each of Megatron-Core's selective-recompute modules replays in the backward
/// of one layer (§5.4), indexed by [`RecomputeModule::index`]: the forward seconds of the
/// module's GEMMs and element-wise work (core attention's forward for `core_attn`), its TP
/// collectives (the FFN's points for `mlp` and `moe`), and for `moe` the dispatch and combine
/// again.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModuleReplay {
    pub compute: [f64; RecomputeModule::ALL.len()],
    pub tp: [f64; RecomputeModule::ALL.len()],
    /// The MoE block's exposed forward EP exchange (`moe` only).
    pub moe_ep: f64,
}

/// A layer's time without recompute, its core-attention forward (what selective recompute
/// repeats) and what each recompute module replays.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerParts {
    pub time: LayerTime,
    pub attention_fwd: f64,
    pub modules: ModuleReplay,
    /// Host issue seconds of the layer's forward and backward where the host cannot run ahead
    /// of the GPU (a dropless MoE layer's host-device sync, §5.5); 0 where it can.
    pub host_issue: (f64, f64),
}

impl LayerParts {
    /// The layer's time under `recompute`: full recompute repeats the forward in the backward,
    /// selective the core attention (with `modules`, each module's replay: nested checkpoints
    /// replay again, so the modules add), op-level selective half of the rest of the forward.
    pub fn with(&self, recompute: Recompute, modules: Option<RecomputeModules>) -> LayerTime {
        let LayerTime {
            mut fwd,
            mut bwd,
            wgrad,
            ..
        } = self.time;
        match (recompute, modules) {
            (Recompute::Full, _) => bwd.add_scaled(&fwd, 1.0),
            (Recompute::Selective, Some(modules)) => {
                for m in modules.iter() {
                    bwd.compute += self.modules.compute[m.index()];
                    bwd.tp += self.modules.tp[m.index()];
                }
                if modules.contains(RecomputeModule::Moe) {
                    bwd.ep += self.modules.moe_ep;
                }
            }
            (Recompute::Selective, None) => bwd.compute += self.attention_fwd,
            // Every other matmul and the element-wise work between them are rebuilt; the
            // attention output is kept (its collectives are not repeated: the saved
            // reduce-scatter outputs are on the save list).
            (Recompute::SelectiveOp, _) => bwd.compute += 0.5 * (fwd.compute - self.attention_fwd),
            (Recompute::None, _) => {}
        }
        // Host-bound MoE layer (§5.5): a pass lasts at least as long as the host takes to
        // issue its kernels; full recompute issues the forward's again in the backward.
        let (host_fwd, mut host_bwd) = self.host_issue;
        if recompute == Recompute::Full {
            host_bwd += host_fwd;
        }
        let wait_fwd = (host_fwd - fwd.total()).max(0.0);
        let wait_bwd = (host_bwd - bwd.total()).max(0.0);
        fwd.compute += wait_fwd;
        bwd.compute += wait_bwd;
        LayerTime {
            fwd,
            bwd,
            wgrad,
            host_wait: wait_fwd + wait_bwd,
        }
    }
}

/// Layer times per kind of the model's [`crate::layer::LayerKinds`] (unused entries default).
pub type LayerTimes = [LayerTime; MAX_LAYER_KINDS];

/// Adds one micro-batch through each of `stage`'s layers (`layers`: their times per kind) to
/// `out`, kind by kind in the stage's order.
fn add_stage_layers(out: &mut LayerTime, stage: &Stage, layers: &LayerTimes) {
    for (kind, count) in stage.kinds.iter() {
        if count > 0 {
            out.add_scaled(&layers[kind], count as f64);
        }
    }
}

/// Everything the step time of one plan needs, resolved once: the device model (built from the
/// GPU and precision alone, [`Device`]), the fabric, the stack's behaviour and the plan's groups.
pub struct TimeContext<'a> {
    problem: &'a Problem,
    plan: &'a Plan,
    groups: Groups,
    fabric: Fabric,
    device: Device,
    stack: &'static Stack,
    /// Tokens of one micro-batch on one GPU before TP sharding: `b·s/c`.
    tokens: f64,
    /// The workload's low-precision recipe, where the linears run in FP8/FP4 (§1.4).
    recipe: Option<&'static PrecisionRecipe>,
    /// MXFP8 GEMMs of the GPU, for the linears a recipe runs in MXFP8 (`None`: no MXFP8 peak).
    gemm_mxfp8: Option<GemmDevice>,
}

impl<'a> TimeContext<'a> {
    pub fn new(problem: &'a Problem, plan: &'a Plan, groups: Groups) -> Self {
        let stack = problem.workload.stack_profile();
        let gpu = &problem.cluster.gpu;
        let device = Device::of(gpu, problem.workload.precision)
            .with_kernel_efficiency(stack.kernel_efficiency);
        let recipe = match &problem.workload.precision_recipe {
            Some(name) if device.quantized => PrecisionRecipe::named(name).ok(),
            _ => None,
        };
        let gemm_mxfp8 = recipe
            .filter(|_| gpu.peak_tflops.get(Precision::Mxfp8).is_some())
            .map(|_| {
                Device::of(gpu, Precision::Mxfp8)
                    .with_kernel_efficiency(stack.kernel_efficiency)
                    .gemm
            });
        TimeContext {
            problem,
            plan,
            groups,
            fabric: Fabric::of(&problem.cluster),
            device,
            stack,
            tokens: plan.micro_batch as f64 * problem.workload.seq_len as f64 / plan.cp as f64,
            recipe,
            gemm_mxfp8,
        }
    }

    /// ω_TP: the share of the layers' TP collectives hidden behind GEMMs (the GPU's override,
    /// else the stack's value; §3.4).
    pub fn tp_overlap(&self) -> f64 {
        self.problem
            .cluster
            .gpu
            .calibration
            .tp_overlap_under(self.stack)
    }

    /// ω_DP: the share of a micro-batch's compute that hides DP/ZeRO communication (the GPU's
    /// override, else the stack's value; §3.6).
    pub fn dp_overlap(&self) -> f64 {
        self.problem
            .cluster
            .gpu
            .calibration
            .dp_overlap_under(self.stack)
    }

    /// The stack the plan is timed under.
    pub fn stack(&self) -> &'static Stack {
        self.stack
    }

    /// The fabric the plan's collectives run on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The operations of one layer of `kind` for one micro-batch of the plan.
    pub fn layer_ops(&self, kind: usize) -> LayerOps {
        let model = self.model();
        let cal = &self.problem.cluster.gpu.calibration;
        let ctx = OpsContext {
            tokens: self.tokens,
            moe_imbalance: self.problem.workload.moe_imbalance,
            elementwise_bytes_per_hidden: cal.elementwise_bytes_per_hidden,
            replicated_elementwise_bytes_per_hidden: self
                .stack
                .replicated_elementwise_bytes_per_hidden,
            routed_copy_bytes_per_hidden: self.stack.routed_copy_bytes_per_hidden,
            // A recipe's fused expert MLP computes the activation in the GEMM epilogues.
            expert_activation_bytes_per_width: if self.recipe.is_some_and(|r| r.fused_expert_mlp) {
                0.0
            } else {
                self.stack.expert_activation_bytes_per_width
            },
            adapters: self.problem.workload.adapters(),
            dequant_bytes_per_param: if self.problem.workload.lora
                && crate::memory::dequantises(self.problem)
            {
                // Read the stored format, write 16 bits (§2.7).
                self.problem.workload.base_weight_bytes() + 2.0
            } else {
                0.0
            },
        };
        layer_ops(
            model,
            &model.layer_kinds().specs()[kind],
            &Shard::of(self.plan),
            &ctx,
        )
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

    /// Bytes per weight element a weight-gradient GEMM on `dev` moves for its output: the
    /// stack's `wgrad_output_bytes` (Megatron's fused accumulation into fp32 main gradients, 8,
    /// §5.2.2), or the GEMM's element size where the stack names none.
    fn wgrad_output_bytes(&self, dev: &GemmDevice) -> f64 {
        self.stack.wgrad_output_bytes.unwrap_or(dev.element_bytes)
    }

    /// Adds a linear layer's forward, input-gradient and weight-gradient seconds to `acc`.
    ///
    /// FP8/FP4 linears first cast their 16-bit inputs (the stack's `quantized_cast_bytes` per
    /// element of the activation in forward, of the output gradient in backward) and keep a
    /// transposed copy of the input for the weight-gradient GEMM (`quantized_transpose_bytes`)
    /// [derived: Transformer Engine's cast/transpose kernels; memory-bound, §5.3].
    ///
    /// The routed experts' linears are grouped GEMMs (§5.2.1): one launch whose time covers
    /// every local expert; other linears run `repeat` separate GEMMs.
    ///
    /// Under a precision recipe (§1.4) the GEMM runs at the precision the recipe gives its role
    /// ([`LinearMode::Ends`]: in one of the recipe's BF16 layers at the stack's ends;
    /// [`LinearMode::Bf16`]: all BF16): BF16 GEMMs at the 16-bit roofline without casts, MXFP8
    /// ones at the MXFP8 roofline.
    fn linear(&self, acc: &mut LinearTimes, gemm: &Gemm, mode: LinearMode) {
        let Gemm { m, n, k, .. } = *gemm;
        let precision = match (self.recipe, mode) {
            (_, LinearMode::Bf16) if self.device.quantized => GemmPrecision::Bf16,
            (Some(r), LinearMode::Ends) => r.at_ends(gemm.role),
            (Some(r), _) => r.of(gemm.role),
            (None, _) => GemmPrecision::Workload,
        };
        let dev = match precision {
            GemmPrecision::Workload => &self.device.gemm,
            GemmPrecision::Bf16 => &self.device.gemm16,
            GemmPrecision::Mxfp8 => self.gemm_mxfp8.as_ref().unwrap_or(&self.device.gemm),
        };
        let wgrad_out = self.wgrad_output_bytes(dev);
        let (times, instances, casts) = if gemm.grouped {
            (
                grouped_linear_s(dev, gemm.repeat, m, n, k, wgrad_out),
                1.0,
                gemm.repeat,
            )
        } else {
            (linear_s(dev, m, n, k, wgrad_out), gemm.repeat, 1.0)
        };
        let LinearTimes {
            fwd: mut f,
            dgrad: mut d,
            wgrad: w,
        } = times;
        if self.device.quantized && precision != GemmPrecision::Bf16 {
            let (cast, transpose) = (
                self.stack.quantized_cast_bytes,
                self.stack.quantized_transpose_bytes,
            );
            f += casts * (cast * m * k / self.device.memory_bytes_per_s);
            d += casts * ((cast * m * n + transpose * m * k) / self.device.memory_bytes_per_s);
        }
        acc.fwd += f * instances;
        acc.dgrad += d * instances;
        acc.wgrad += w * instances;
    }

    /// Adds a LoRA adapter GEMM's forward, input-gradient and weight-gradient seconds to `acc`:
    /// in 16 bits whatever the plan's precision, without FP8 casts — Megatron-Bridge's
    /// `ParallelLinearAdapter` builds `linear_in`/`linear_out` from Megatron's own
    /// `ColumnParallelLinear`/`RowParallelLinear`, not Transformer Engine's FP8 linears, and
    /// torchtune's and PEFT's adapters are `nn.Linear` in the model's 16-bit dtype (§2.7).
    fn adapter_linear(&self, acc: &mut LinearTimes, gemm: &Gemm) {
        let Gemm { m, n, k, .. } = *gemm;
        let dev = &self.device.gemm16;
        let wgrad_out = self.wgrad_output_bytes(dev);
        let (times, instances) = if gemm.grouped {
            (grouped_linear_s(dev, gemm.repeat, m, n, k, wgrad_out), 1.0)
        } else {
            (linear_s(dev, m, n, k, wgrad_out), gemm.repeat)
        };
        acc.fwd += times.fwd * instances;
        acc.dgrad += times.dgrad * instances;
        acc.wgrad += times.wgrad * instances;
    }

    /// One tensor-parallel "all-reduce point" on `bytes`: an all-reduce, or with sequence
    /// parallelism the reduce-scatter + all-gather pair that replaces it (§3.4).
    fn tp_point(&self, bytes: f64) -> f64 {
        self.tp_point_on(bytes, self.groups.tp)
    }

    /// A TP point on group `g` (the TP group, or a folded plan's expert-TP group).
    fn tp_point_on(&self, bytes: f64, g: Group) -> f64 {
        if self.plan.sequence_parallel {
            self.fabric.collective_s(Collective::AllGather, bytes, g)
                + self
                    .fabric
                    .collective_s(Collective::ReduceScatter, bytes, g)
        } else {
            self.fabric.collective_s(Collective::AllReduce, bytes, g)
        }
    }

    /// Seconds of one layer of `kind` for one micro-batch.
    pub fn layer(&self, kind: usize) -> LayerTime {
        self.layer_parts(kind)
            .with(self.plan.recompute, self.plan.recompute_modules)
    }

    /// [`Self::layer`] before recompute, which only adds to the backward pass: the same for
    /// every recompute mode of the plan. Sums the layer's operations ([`crate::layer::layer_ops`]).
    pub fn layer_parts(&self, kind: usize) -> LayerParts {
        self.layer_parts_at(kind, LinearMode::Recipe)
    }

    /// [`Self::layer_parts`] of a layer of `kind` whose linears run as `mode` says (§1.4).
    /// Sequence length of one flash-attention kernel call of a layer with core `att`
    /// (docs/costmodel.md §5.2): the sequence over the ring's ranks, `s·a/cp` (ring attention
    /// and the all-gather call the kernel per rank's `s/cp` queries; Ulysses' all-to-all over
    /// `a` ranks gives each the whole sequence of its heads), as the causal length with the same
    /// mean keys per query, `2·keys_per_query` (a window `w` shorter than it: `2w − w²/L`).
    fn attention_call_seq(&self, att: &crate::layer::CoreAttention) -> f64 {
        let plan = self.plan;
        let a = self
            .stack
            .cp_a2a_ranks(&self.problem.model, plan, self.groups.cp);
        let ring = (plan.cp.max(1) / a.max(1)).max(1) as f64;
        let seq = self.problem.workload.seq_len as f64 / ring;
        2.0 * att.keys_per_query(seq)
    }

    fn layer_parts_at(&self, kind: usize, mode: LinearMode) -> LayerParts {
        let plan = self.plan;
        let cal = &self.problem.cluster.gpu.calibration;
        let ops = self.layer_ops(kind);
        let mem_bw = self.device.memory_bytes_per_s;
        let mut g = LinearTimes::default();
        // The experts' linears (routed and shared): the `mlp` node of Megatron's combined 1F1B
        // schedule, which the EP exchanges overlap with (§3.7).
        let mut experts = LinearTimes::default();
        // Each linear's forward also goes to the recompute modules it belongs to (§5.4).
        let mut replay = ModuleReplay::default();
        // The grouped (routed-expert) GEMMs' forward and how many expert GEMMs the host issues.
        let (mut grouped_fwd, mut grouped_issued) = (0.0, 0.0);
        for gemm in ops.gemms() {
            let mut one = LinearTimes::default();
            self.linear(&mut one, gemm, mode);
            g.fwd += one.fwd;
            g.dgrad += one.dgrad;
            g.wgrad += one.wgrad;
            if gemm.grouped {
                grouped_fwd += one.fwd;
                grouped_issued += gemm.repeat;
            }
            if matches!(gemm.role, GemmRole::RoutedExpert | GemmRole::SharedExpert) {
                experts.fwd += one.fwd;
                experts.dgrad += one.dgrad;
                experts.wgrad += one.wgrad;
            }
            for m in RecomputeModule::ALL {
                if gemm.role.in_module(m) {
                    replay.compute[m.index()] += one.fwd;
                }
            }
        }

        // The routed experts' forward is issued by the host right after it synchronises on the
        // tokens per expert (Megatron's TEGroupedMLP: `tokens_per_expert.tolist()`), one GEMM per
        // local expert (Transformer Engine's GroupedLinear): it takes at least the issue time of
        // its grouped GEMMs' experts (stack `grouped_gemm_expert_issue_us`, §5.2.1). The backward
        // has no such synchronisation: the host issues it ahead of the device.
        let issue = self.expert_issue_excess(grouped_issued, grouped_fwd);
        g.fwd += issue;
        experts.fwd += issue;
        for m in RecomputeModule::ALL {
            if GemmRole::RoutedExpert.in_module(m) {
                replay.compute[m.index()] += issue;
            }
        }

        let seq = self.problem.workload.seq_len as f64;
        let att = ops.attention;
        // A scan mixer's chunked kernels (Mamba-2 SSD, gated DeltaNet): their batched matmuls at
        // the device's attention throughput, the backward the stack's attention ratio of the
        // forward [assumed: same kernel family, Triton], or the HBM bytes they move where that
        // is longer (Mamba-2's chunk states and `C·Bᵀ` blocks: `layer::mamba_scan_bytes_per_token`).
        // Mamba-2's SSD kernels take at least the time of flash attention of the same heads over
        // the crossover keys at which the Mamba-2 paper measures them as fast as
        // FlashAttention-2 (`device::ssd_flash_crossover_keys`, §1.4): far more than their own
        // FLOPs at the attention rate.
        let ssd_floor = self.tokens
            * att.ssd_floor_fwd_flops_per_token(crate::device::ssd_flash_crossover_keys());
        let scan_fwd = (self.tokens * att.scan_fwd_flops_per_token).max(ssd_floor);
        let scan_bytes = (
            self.tokens * att.scan_fwd_bytes_per_token / mem_bw,
            self.tokens * att.scan_bwd_bytes_per_token / mem_bw,
        );
        let (attn_fwd, attn_bwd) = if self.problem.workload.flash_attention {
            // Each query sees s/2 keys on average under the causal mask (fewer under a window),
            // at the flash-attention rate of one kernel call's length (§5.2).
            let rate = self.device.attention_rate(self.attention_call_seq(&att));
            let fwd = self.tokens
                * 2.0
                * att.heads
                * (att.qk_head_dim + att.v_head_dim)
                * att.keys_per_query(seq)
                / rate;
            let scan = scan_fwd / self.device.attention_flops_per_s;
            let ratio = self.stack.attention_backward_ratio;
            (
                fwd + scan.max(scan_bytes.0),
                ratio * fwd + (ratio * scan).max(scan_bytes.1),
            )
        } else {
            // Unfused: QKᵀ and P·V as batched 16-bit GEMMs over the full s × s square, plus the
            // memory-bound softmax and dropout over the score tensor (backward ≈ 2× both).
            let batches = plan.micro_batch as f64 * att.heads;
            let q = seq / plan.cp as f64;
            let gemms = batches
                * (crate::gemm::gemm_s(&self.device.gemm16, q, seq, att.qk_head_dim)
                    + crate::gemm::gemm_s(&self.device.gemm16, q, att.v_head_dim, seq));
            let scores = self.stack.unfused_score_bytes * batches * q * seq / mem_bw;
            let scan = scan_fwd / self.device.attention_flops_per_s;
            (
                gemms + scores + scan.max(scan_bytes.0),
                2.0 * (gemms + scores)
                    + (self.stack.attention_backward_ratio * scan).max(scan_bytes.1),
            )
        };
        // Element-wise work (norms, activation, RoPE, residuals; routed copies), §5.3.
        let mut elem_fwd = ops.elementwise_bytes / mem_bw;
        if ops.routed_elementwise_bytes > 0.0 {
            elem_fwd += ops.routed_elementwise_bytes / mem_bw;
        }

        // Host and launch overhead (the GPU's, scaled by the stack's factor): an MoE layer runs
        // about the stack's factor more kernels.
        let is_moe = ops.comm.dispatch.is_some();
        let overhead = cal.layer_overhead_us
            * 1e-6
            * self.stack.layer_overhead_factor
            * if is_moe {
                self.stack.moe_layer_kernel_factor
            } else {
                1.0
            };
        let mut fwd_compute = g.fwd + attn_fwd + elem_fwd + overhead;
        // LoRA freezes the base weights: no weight-gradient GEMMs.
        let mut wgrad = if self.problem.workload.lora {
            0.0
        } else {
            g.wgrad
        };
        let mut bwd_compute = g.dgrad + wgrad + attn_bwd + 2.0 * elem_fwd + 2.0 * overhead;
        if self.problem.workload.lora {
            // The adapters are trained: forward, input and weight gradients; a dequantised
            // base is rebuilt once per pass (§2.7).
            let mut a = LinearTimes::default();
            for gemm in ops.adapter_gemms() {
                self.adapter_linear(&mut a, gemm);
            }
            let dequant = ops.dequant_bytes / mem_bw;
            fwd_compute += a.fwd + dequant;
            bwd_compute += a.dgrad + a.wgrad + dequant;
            wgrad += a.wgrad;
        }

        // Tensor parallel (§3.4).
        let mut tp_fwd = if plan.tp > 1 {
            let tp_points = ops.comm.tp_points as f64;
            (1.0 - self.tp_overlap()) * tp_points * self.tp_point(ops.comm.tp_bytes)
        } else {
            0.0
        };
        // The FFN's points, which recomputing the dense MLP or the MoE block replays.
        let mut ffn_tp = if plan.tp > 1 && ops.comm.ffn_tp_points > 0 {
            let points = ops.comm.ffn_tp_points as f64;
            (1.0 - self.tp_overlap()) * points * self.tp_point(ops.comm.tp_bytes)
        } else {
            0.0
        };
        // A folded plan's routed copies gather over the expert-TP group (§3.7).
        if ops.comm.etp_points > 0 {
            let points = ops.comm.etp_points as f64;
            let etp = (1.0 - self.tp_overlap())
                * points
                * self.tp_point_on(ops.comm.etp_bytes, self.groups.etp);
            tp_fwd += etp;
            ffn_tp += etp;
        }
        for m in RecomputeModule::ALL {
            replay.compute[m.index()] += ops.module_elementwise_bytes[m.index()] / mem_bw;
        }
        replay.compute[RecomputeModule::CoreAttn.index()] = attn_fwd;
        let ffn_module = if ops.comm.dispatch.is_some() {
            RecomputeModule::Moe
        } else {
            RecomputeModule::Mlp
        };
        replay.tp[ffn_module.index()] = ffn_tp;

        // Context parallel K/V exchange (§3.8), as the stack runs it.
        let (cp_fwd, cp_bwd) = if plan.cp > 1 && ops.comm.cp_kv_bytes_per_token > 0.0 {
            let c = plan.cp as f64;
            let kv_bytes = self.tokens * ops.comm.cp_kv_bytes_per_token;
            match self.stack.cp_exchange(plan) {
                // Ring: c−1 K/V blocks, each hidden behind one attention block.
                CpExchange::Ring => {
                    let xfer = self.fabric.p2p_s(kv_bytes, self.groups.cp.within_domain());
                    let fwd = (c - 1.0) * (xfer - attn_fwd / c).max(0.0);
                    let bwd = (c - 1.0) * (2.0 * xfer - attn_bwd / c).max(0.0);
                    (fwd, bwd)
                }
                // All-gather: every rank's K/V gathered at once, behind the first (local)
                // block of attention only; the backward gathers them again and
                // reduce-scatters their gradients behind its first block.
                CpExchange::AllGather => {
                    let gathered = kv_bytes * c;
                    let g = self.groups.cp;
                    let ag = self.fabric.collective_s(Collective::AllGather, gathered, g);
                    let rs = self
                        .fabric
                        .collective_s(Collective::ReduceScatter, gathered, g);
                    (
                        (ag - attn_fwd / c).max(0.0),
                        (ag + rs - attn_bwd / c).max(0.0),
                    )
                }
                // Ulysses (a2a), or a2a inside the domain and the ring across (a2a+p2p):
                // all-to-alls of Q, K, V before attention and of its output after, exposed
                // (attention needs them whole); the backward the mirror image (dO before,
                // dQ, dK, dV after). Over `a` ranks the K/V blocks of the outer ring are
                // `a` times the tokens with `1/a` of the heads: the same bytes.
                CpExchange::AllToAll | CpExchange::AllToAllRing => {
                    let a = self
                        .stack
                        .cp_a2a_ranks(&self.problem.model, plan, self.groups.cp);
                    let inner = cp_a2a_group(self.groups.cp, a);
                    let a2a = cp_a2a_s(&self.fabric, self.tokens, &ops, inner);
                    let r = (plan.cp / a) as f64;
                    let (mut fwd, mut bwd) = (a2a, a2a);
                    if r > 1.0 {
                        let xfer = self.fabric.p2p_s(kv_bytes, self.groups.cp.within_domain());
                        fwd += (r - 1.0) * (xfer - attn_fwd / r).max(0.0);
                        bwd += (r - 1.0) * (2.0 * xfer - attn_bwd / r).max(0.0);
                    }
                    (fwd, bwd)
                }
            }
        } else if plan.cp > 1 && ops.comm.cp_all_to_all_bytes_per_token > 0.0 {
            // Mamba-2 under CP: all-to-alls around the convolution and scan, not overlapped
            // (Megatron-Core's MambaContextParallel), the same again in the backward.
            let bytes = self.tokens * ops.comm.cp_all_to_all_bytes_per_token;
            let a2a = self
                .fabric
                .collective_s(Collective::AllToAll, bytes, self.groups.cp);
            (a2a, a2a)
        } else {
            (0.0, 0.0)
        };

        // Expert parallel token exchange (§3.7): dispatch + combine each way, by the plan's
        // dispatcher. With EP overlap one micro-batch's exchange hides behind another's
        // computation in the other direction (Megatron's combined 1F1B schedule): what the
        // backward pass's compute cannot cover of a forward exchange is exposed, and the other
        // way round.
        let (ep_fwd, ep_bwd) = match ops.comm.dispatch {
            Some(d) if plan.ep > 1 => {
                let one_way = self
                    .fabric
                    .token_exchange(
                        self.stack.dispatcher(plan),
                        d.tokens,
                        d.bytes_per_copy,
                        d.top_k,
                        self.groups.ep,
                    )
                    .total_s;
                if plan.ep_overlap {
                    // Megatron's combined 1F1B runs one micro-batch's layer forward beside
                    // another's layer backward in three phases, each exchange beside one
                    // compute node of the other (`TransformerLayerSchedulePlan.run`):
                    //   comm: combine_bwd | dispatch_fwd → dispatch_bwd | combine_fwd
                    //   comp: attn_fwd    | mlp_bwd → mlp_bwd_dw → mlp_fwd | attn_bwd
                    let one = one_way * self.problem.workload.moe_imbalance;
                    let routed_elem = ops.routed_elementwise_bytes / mem_bw;
                    let mlp_fwd = experts.fwd + routed_elem;
                    let mlp_bwd = experts.dgrad
                        + if self.problem.workload.lora {
                            0.0
                        } else {
                            experts.wgrad
                        }
                        + 2.0 * routed_elem;
                    let attn_fwd_node = (fwd_compute - mlp_fwd).max(0.0);
                    let attn_bwd_node = (bwd_compute - mlp_bwd).max(0.0);
                    let first = self.overlapped_ep_s(one, attn_fwd_node);
                    let middle = self.overlapped_ep_s(2.0 * one, mlp_fwd + mlp_bwd);
                    let last = self.overlapped_ep_s(one, attn_bwd_node);
                    // The forward's dispatch (middle) and combine (last); the backward's
                    // combine (first) and dispatch (middle).
                    (last + 0.5 * middle, first + 0.5 * middle)
                } else {
                    let exposed = (1.0 - cal.ep_overlap)
                        * 2.0
                        * one_way
                        * self.problem.workload.moe_imbalance;
                    (exposed, exposed)
                }
            }
            _ => (0.0, 0.0),
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
            ep: ep_bwd,
        };
        replay.moe_ep = ep_fwd;
        LayerParts {
            time: LayerTime {
                fwd,
                bwd,
                wgrad,
                host_wait: 0.0,
            },
            attention_fwd: attn_fwd,
            modules: replay,
            host_issue: self.moe_host_issue(is_moe),
        }
    }

    /// Host issue seconds (forward, backward) of one MoE layer per micro-batch where the host
    /// cannot queue ahead of the GPU (§5.5): a dropless layer's dispatch needs the split sizes
    /// on the CPU (Megatron-Core `MoEAlltoAllTokenDispatcher.preprocess`, cuda_sync_point
    /// `before_ep_alltoall`; Transformer Engine's GroupedLinear takes `m_splits` as a host
    /// list), so the host waits for the GPU to drain before every MoE layer's exchange and the
    /// GPU then waits for the host to issue the layer's kernels. The stack's
    /// `moe_host_issue_us`, split as the kernels are (the backward issues twice the
    /// forward's, as `layer_overhead_us` counts them); none under CUDA graphs that cover the
    /// MoE block (`workload.cuda_graphs = full`) or for a dense layer.
    fn moe_host_issue(&self, is_moe: bool) -> (f64, f64) {
        let host = self.stack.moe_host_issue_us * 1e-6;
        if !is_moe || host <= 0.0 || self.problem.workload.cuda_graphs == CudaGraphs::Full {
            return (0.0, 0.0);
        }
        (host / 3.0, 2.0 * host / 3.0)
    }

    /// Seconds by which the host's issue of a layer's `issued` routed-expert GEMMs (the stack's
    /// `grouped_gemm_expert_issue_us` per local expert and grouped GEMM) exceeds their forward
    /// on the device, `grouped_fwd` seconds: what the forward of the expert block adds for being
    /// host-bound (§5.2.1). 0 without routed experts, where the stack names no issue time, or
    /// under CUDA graphs that cover the MoE block (`workload.cuda_graphs = full`: the graph
    /// replays the launches). `layer_parts_at` accumulates both inputs in its pass over the GEMMs.
    fn expert_issue_excess(&self, issued: f64, grouped_fwd: f64) -> f64 {
        let per_expert = self.stack.grouped_gemm_expert_issue_us * 1e-6;
        if per_expert <= 0.0 || self.problem.workload.cuda_graphs == CudaGraphs::Full {
            return 0.0;
        }
        (issued * per_expert - grouped_fwd).max(0.0)
    }

    /// [`Self::expert_issue_excess`] of layer `ops`, its grouped GEMMs timed on their own.
    #[cfg(test)]
    fn expert_issue_excess_s(&self, ops: &LayerOps, mode: LinearMode) -> f64 {
        let mut routed = LinearTimes::default();
        let mut issued = 0.0;
        for gemm in ops.gemms().iter().filter(|g| g.grouped) {
            self.linear(&mut routed, gemm, mode);
            issued += gemm.repeat;
        }
        self.expert_issue_excess(issued, routed.fwd)
    }

    /// Exposed seconds of an EP exchange of `raw` seconds overlapped with `compute` seconds of
    /// another micro-batch's work (§3.7): what the compute cannot cover, plus what the exchange
    /// kernels take from the compute they hide behind — while they run they hold the stack's
    /// `ep_comm_sms` of the GPU's SMs, so the overlapped compute runs on the rest and lasts
    /// `hidden · sms/SM` longer.
    fn overlapped_ep_s(&self, raw: f64, compute: f64) -> f64 {
        let hidden = raw.min(compute);
        let sms = self.device.gemm.sm_count.max(1) as f64;
        let share = (self.stack.ep_comm_sms / sms).min(1.0);
        (raw - compute).max(0.0) + hidden * share
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
        let mem_bw = self.device.memory_bytes_per_s;
        if stage.first {
            // Vocab-parallel embedding: one all-reduce (reduce-scatter with SP) forward.
            out.fwd.tp += tp;
            out.fwd.compute += self.stack.embedding_bytes_per_element * act_bytes / mem_bw;
        }
        if stage.last {
            let v_local = model.vocab as f64 / t;
            // At the training precision, or in BF16 where the precision recipe says so (§1.4).
            let head_dev = match self.recipe {
                Some(r) if r.of(GemmRole::LmHead) == GemmPrecision::Bf16 => &self.device.gemm16,
                _ => &self.device.gemm,
            };
            let head = linear_s(head_dev, tok, v_local, h, self.wgrad_output_bytes(head_dev));
            // Softmax cross-entropy over fp32 logits: a few passes over tok × V/t.
            let ce = self.stack.cross_entropy_passes * FP32_BYTES * tok * v_local / mem_bw;
            out.fwd.compute += head.fwd + ce;
            let w = if self.problem.workload.lora {
                0.0
            } else {
                head.wgrad
            };
            let d = head.dgrad;
            out.bwd.compute += d + w + ce;
            out.wgrad += w;
            out.fwd.tp += tp;
            out.bwd.tp += tp;
            if let Some(depths) = model.mtp_layers {
                out.add_scaled(&self.mtp_depth(head, ce, tp), depths as f64);
            }
        }
        out
    }

    /// One multi-token-prediction depth on the last rank (§1.4, Megatron-Core
    /// `MultiTokenPredictionLayer`): the two norms' inputs concatenated and projected by
    /// `eh_proj` (`2h → h/t`), the MTP block's layers ([`Model::mtp_kinds`]), then the shared LM
    /// head and the loss again (`head`, `ce`: their seconds as the main head runs them) with
    /// their TP point. In BF16 where the precision recipe keeps the MTP block there
    /// (`mtp_bf16`), else at the recipe's precisions.
    fn mtp_depth(&self, head: LinearTimes, ce: f64, tp: f64) -> LayerTime {
        let model = self.model();
        let mode = if self.recipe.is_some_and(|r| r.mtp_bf16) {
            LinearMode::Bf16
        } else {
            LinearMode::Recipe
        };
        let mut out = LayerTime::default();
        for kind in model.mtp_kinds() {
            out.add_scaled(
                &self
                    .layer_parts_at(kind, mode)
                    .with(self.plan.recompute, self.plan.recompute_modules),
                1.0,
            );
        }
        let h = model.hidden as f64;
        let mut g = LinearTimes::default();
        let eh_proj = Gemm {
            m: self.tokens,
            n: h / self.plan.tp as f64,
            k: 2.0 * h,
            repeat: 1.0,
            grouped: false,
            role: GemmRole::Other,
        };
        self.linear(&mut g, &eh_proj, mode);
        let lora = self.problem.workload.lora;
        let wgrad = if lora { 0.0 } else { g.wgrad + head.wgrad };
        out.fwd.compute += g.fwd + head.fwd + ce;
        out.bwd.compute += g.dgrad + head.dgrad + wgrad + ce;
        out.wgrad += wgrad;
        out.fwd.tp += tp;
        out.bwd.tp += tp;
        out
    }

    /// Seconds of one micro-batch through every layer of `stage` (forward and backward), from
    /// the per-kind layer times `layers` ([`Self::layers`]).
    pub fn stage(&self, stage: &Stage, layers: &LayerTimes) -> LayerTime {
        let mut out = self.ends(stage);
        add_stage_layers(&mut out, stage, layers);
        let (offload_fwd, offload_bwd) = self.offload_exposed(stage, layers);
        out.fwd.compute += offload_fwd;
        out.bwd.compute += offload_bwd;
        // A precision recipe's BF16 layers at the start (first rank) and end (last rank) of the
        // stack: the difference of their time from that of the same kind at the recipe's
        // precisions (§1.4). The first and last ranks hold the stack's first and last layers;
        // BF16 layers beyond a rank's own are not counted (a pipeline whose edge ranks hold
        // fewer layers than the recipe keeps in BF16).
        if let Some(r) = self.recipe {
            let edges = [
                (stage.first, r.bf16_layers_at_start, false),
                (stage.last, r.bf16_layers_at_end, true),
            ];
            for (holds, n, from_end) in edges {
                if !holds || n == 0 {
                    continue;
                }
                let n = n.min(stage.layers());
                for (kind, count) in edge_kinds(self.model(), n, from_end).iter() {
                    if count > 0 {
                        let bf16 = self
                            .layer_parts_at(kind, LinearMode::Ends)
                            .with(self.plan.recompute, self.plan.recompute_modules);
                        out.add_scaled(&bf16, count as f64);
                        out.add_scaled(&layers[kind], -(count as f64));
                    }
                }
            }
        }
        out
    }

    /// Seconds one micro-batch's copy of one offloaded layer's stored activations takes over
    /// the GPU's host link, one direction (§5.6): the stage's mean stored bytes per layer
    /// ([`crate::memory::layer_activations`] × the micro-batch's tokens) over
    /// `host_bandwidth_gbps`. 0 without offloading or without a host-link rate.
    pub fn offload_copy_s(&self, stage: &Stage) -> f64 {
        let host = self.problem.cluster.gpu.host_bandwidth_gbps.unwrap_or(0.0);
        if self.plan.offloaded_layers() == 0 || stage.layers() == 0 || host <= 0.0 {
            return 0.0;
        }
        self.offload_layer_bytes(stage) / (host * 1e9)
    }

    /// Bytes of one micro-batch's stored activations of `stage`'s mean layer: what one
    /// offloaded layer copies to the host (0 for a stage without layers).
    pub fn offload_layer_bytes(&self, stage: &Stage) -> f64 {
        if stage.layers() == 0 {
            return 0.0;
        }
        let per_token = crate::memory::layer_activations(self.problem, self.plan);
        stage.kinds.weighted_sum(&per_token) / stage.layers() as f64 * self.tokens
    }

    /// `(N, w)`: the layers offloaded per model chunk of `stage` (at most the chunk's) and the
    /// window of `w = ⌊L/N⌋` layers each copy overlaps; `None` without offloading or layers.
    pub fn offload_window(&self, stage: &Stage) -> Option<(u32, u32)> {
        let n = self.plan.offloaded_layers();
        let count = stage.layers();
        if n == 0 || count == 0 {
            return None;
        }
        let per_chunk = (count / self.plan.vpp.max(1)).max(1);
        let n = n.min(per_chunk);
        Some((n, per_chunk / n))
    }

    /// Forward and backward seconds per micro-batch that `stage`'s activation offloading adds
    /// (§5.6): TransformerEngine copies each of a chunk's `N` offloaded layers on its own CUDA
    /// stream (d2h in the forward, h2d in the backward) and the compute stream waits for the
    /// copy only at the end of the layer's window of `w = ⌊L/N⌋` layers
    /// [transformer_engine/pytorch/cpu_offload.py @v2.8 `layer_window_map`,
    /// `synchronize_on_group_commit_forward`, `on_group_commit_backward`]: per offloaded layer,
    /// what the copy takes beyond `w` mean layers of the pass is exposed. The copies' HBM
    /// traffic (each byte read or written once against several TB/s) is not modelled.
    pub fn offload_exposed(&self, stage: &Stage, layers: &LayerTimes) -> (f64, f64) {
        let Some((n, window)) = self.offload_window(stage) else {
            return (0.0, 0.0);
        };
        let count = stage.layers();
        let copy = self.offload_copy_s(stage);
        let mut sum = LayerTime::default();
        add_stage_layers(&mut sum, stage, layers);
        let vpp = self.plan.vpp.max(1);
        let window = window as f64;
        let (fwd, bwd) = (
            sum.fwd.total() / count as f64,
            sum.bwd.total() / count as f64,
        );
        let offloaded = n as f64 * vpp as f64;
        (
            offloaded * (copy - window * fwd).max(0.0),
            offloaded * (copy - window * bwd).max(0.0),
        )
    }

    /// Parameters per DDP gradient bucket over a data-parallel `group`: the workload's
    /// `bucket_params`, else the stack's `max(ddp_bucket_params, ddp_bucket_params_per_rank ·
    /// ranks)` (§3.6).
    pub fn bucket_params(&self, group: Group) -> f64 {
        match self.problem.workload.bucket_params {
            Some(params) => params as f64,
            None => self.stack.bucket_params(group.size),
        }
    }

    /// The DP/ZeRO collectives of a stage holding `params` (`layers` layers) at ZeRO stage
    /// `zero`: one entry per phase and parameter group, each with its calls, bytes per call and
    /// the [`CollectiveModel`]'s cost of one call (§3.6). This is the one inventory of a plan's
    /// DP/ZeRO communication: [`Self::dp_comm`] sums it for the step time and `explain` lists it.
    /// Parameter groups with nothing to move (no parameters, or a group of one rank) are left
    /// out: their cost is zero.
    pub fn dp_collectives(&self, zero: u8, params: &StageParams, layers: u32) -> Vec<DpCollective> {
        if self.problem.workload.lora {
            return self.lora_dp_collectives(zero, params, layers);
        }
        let gb = self.problem.workload.grad_bytes as f64;
        let wb = WIRE_BYTES;
        let groups = [
            (ParamGroup::Dense, params.dense, self.groups.dense_dp),
            (ParamGroup::Expert, params.expert, self.groups.expert_dp),
        ];
        // ZeRO 0-2: gradient buckets of the stack's bucket size, each its own collective (so
        // each pays the latency). ZeRO-3: the stack's FSDP units per layer (one in
        // Megatron-FSDP), each unit's gather and reduce-scatter a collective of its own.
        let units = layers.max(1) as f64 * self.stack.fsdp_units_per_layer;
        let phases: &[(DpPhase, Collective, f64)] = match zero {
            0 => &[(DpPhase::AllReduce, Collective::AllReduce, gb)],
            1 | 2 => &[
                (DpPhase::ReduceScatter, Collective::ReduceScatter, gb),
                (DpPhase::AllGather, Collective::AllGather, wb),
            ],
            _ => &[
                (DpPhase::UnitAllGather, Collective::AllGather, wb),
                (DpPhase::UnitReduceScatter, Collective::ReduceScatter, gb),
            ],
        };
        let mut out = Vec::with_capacity(phases.len() * groups.len());
        for &(phase, kind, per_param) in phases {
            for &(params, p, group) in &groups {
                let calls = if zero >= 3 {
                    units
                } else {
                    (p / self.bucket_params(group)).ceil().max(1.0)
                };
                out.extend(self.dp_collective(
                    phase,
                    params,
                    kind,
                    group,
                    calls,
                    p / calls * per_param,
                ));
            }
        }
        out
    }

    /// One DP/ZeRO collective of [`Self::dp_collectives`], with the [`CollectiveModel`]'s cost of
    /// one call; `None` where there is nothing to move (a group of one rank, or no bytes).
    fn dp_collective(
        &self,
        phase: DpPhase,
        params: ParamGroup,
        kind: Collective,
        group: Group,
        calls: f64,
        bytes_per_call: f64,
    ) -> Option<DpCollective> {
        // A stack whose ZeRO-3 collectives move each rank's bytes over its own NIC (DeepSpeed's
        // 2021 ZeRO-3, §3.6) prices its unit collectives so; every other one as NCCL runs it.
        let per_rank_nic = self.stack.zero3_per_rank_nic
            && matches!(phase, DpPhase::UnitAllGather | DpPhase::UnitReduceScatter);
        (group.size > 1 && bytes_per_call > 0.0).then(|| DpCollective {
            phase,
            params,
            kind,
            group,
            calls,
            bytes_per_call,
            cost: if per_rank_nic {
                self.fabric.per_rank_nic(kind, bytes_per_call, group)
            } else {
                self.fabric.collective(kind, bytes_per_call, group)
            },
        })
    }

    /// [`Self::dp_collectives`] under LoRA (§2.7): only the adapters' gradients are reduced
    /// (all-reduced, or reduce-scattered with the updated adapters all-gathered under ZeRO-1/2),
    /// in buckets as the full model's; under ZeRO-3 each unit still gathers its frozen base
    /// weights (in their stored format) with its adapters, forward and backward, and
    /// reduce-scatters the adapters' gradients.
    fn lora_dp_collectives(
        &self,
        zero: u8,
        params: &StageParams,
        layers: u32,
    ) -> Vec<DpCollective> {
        let gb = self.problem.workload.grad_bytes as f64;
        let wb = WIRE_BYTES;
        let base = self.problem.workload.base_weight_bytes();
        // (group, adapters, bytes of one full gather: base + adapters)
        let groups = [
            (
                ParamGroup::Dense,
                params.adapter_dense,
                base * (params.dense - params.ends) + wb * (params.ends + params.adapter_dense),
                self.groups.dense_dp,
            ),
            (
                ParamGroup::Expert,
                params.adapter_expert,
                base * params.expert + wb * params.adapter_expert,
                self.groups.expert_dp,
            ),
        ];
        let units = layers.max(1) as f64 * self.stack.fsdp_units_per_layer;
        // (phase, collective, bytes per step of the group: adapters' or gathered)
        let phases: &[(DpPhase, Collective, bool, f64)] = match zero {
            0 => &[(DpPhase::AllReduce, Collective::AllReduce, false, gb)],
            1 | 2 => &[
                (DpPhase::ReduceScatter, Collective::ReduceScatter, false, gb),
                (DpPhase::AllGather, Collective::AllGather, false, wb),
            ],
            _ => &[
                (DpPhase::UnitAllGather, Collective::AllGather, true, 1.0),
                (
                    DpPhase::UnitReduceScatter,
                    Collective::ReduceScatter,
                    false,
                    gb,
                ),
            ],
        };
        let mut out = Vec::with_capacity(phases.len() * groups.len());
        for &(phase, kind, gathers_base, per_param) in phases {
            for &(pg, adapters, gathered, group) in &groups {
                let bytes = if gathers_base {
                    gathered
                } else {
                    adapters * per_param
                };
                let calls = if zero >= 3 {
                    units
                } else {
                    (adapters / self.bucket_params(group)).ceil().max(1.0)
                };
                out.extend(self.dp_collective(phase, pg, kind, group, calls, bytes / calls));
            }
        }
        out
    }

    /// The DP/ZeRO collectives of a stage holding `params` (`layers` layers) at ZeRO stage
    /// `zero`, per step and before any overlap (§3.6): [`Self::dp_collectives`] summed by phase.
    pub fn dp_comm(&self, zero: u8, params: &StageParams, layers: u32) -> DpComm {
        let inventory = self.dp_collectives(zero, params, layers);
        // ZeRO 0-2 phases: every call of a round; ZeRO-3: one unit's calls (the time model
        // multiplies by the units itself).
        let round = |phase: DpPhase| -> Buckets {
            inventory
                .iter()
                .filter(|c| c.phase == phase)
                .fold(Buckets::default(), |acc, c| Buckets {
                    seconds: acc.seconds + c.round_s(),
                    calls: acc.calls + c.calls,
                })
        };
        let per_unit = |phase: DpPhase| -> f64 {
            inventory
                .iter()
                .filter(|c| c.phase == phase)
                .fold(0.0, |acc, c| acc + c.cost.total_s)
        };
        match zero {
            0 => DpComm::AllReduce(round(DpPhase::AllReduce)),
            1 | 2 => DpComm::Sharded {
                per_micro_batch: zero == 2,
                reduce_scatter: round(DpPhase::ReduceScatter),
                all_gather: round(DpPhase::AllGather),
            },
            _ => DpComm::PerUnit {
                all_gather: per_unit(DpPhase::UnitAllGather),
                reduce_scatter: per_unit(DpPhase::UnitReduceScatter),
                units: layers.max(1) as f64 * self.stack.fsdp_units_per_layer,
            },
        }
    }

    /// Exposed seconds per step of `comm` on a stage whose per-micro-batch time is `st` (§3.6):
    /// gradient buckets reduced as the last micro-batch's backward produces them (Megatron
    /// `overlap_grad_reduce`; every micro-batch's under ZeRO-2), the ZeRO-1/2 weight all-gather
    /// bucket by bucket under the next step's first forward (`overlap_param_gather`), ZeRO-3
    /// units prefetched one ahead.
    pub fn dp_hidden(&self, comm: &DpComm, st: &LayerTime, micro_batches: u32) -> f64 {
        let omega = self.dp_overlap();
        let m = micro_batches as f64;
        let (t_f, t_b) = (st.fwd.total(), st.bwd.total());
        let grads = self.stack.overlap_grad_reduce;
        let weights = self.stack.overlap_param_gather;
        match *comm {
            DpComm::None => 0.0,
            DpComm::AllReduce(ar) => bucketed_exposed(ar, t_b, omega, grads),
            DpComm::Sharded {
                per_micro_batch,
                reduce_scatter,
                all_gather,
            } => {
                let rounds = if per_micro_batch { m } else { 1.0 };
                rounds * bucketed_exposed(reduce_scatter, t_b, omega, grads)
                    + bucketed_exposed(all_gather, t_f, omega, weights)
            }
            DpComm::PerUnit {
                all_gather: ag,
                reduce_scatter: rs,
                units,
            } => {
                // Every unit is gathered in forward and again in backward and its gradient
                // reduce-scattered. The gather of unit i+1 is prefetched behind unit i's
                // compute: per unit and pass, what the compute does not cover is exposed; the
                // first gather and the last reduce-scatter always are (§3.6).
                let hide = |comm: f64, window: f64| (comm - omega * window).max(0.0);
                let per_micro_batch = units * (hide(ag, t_f / units) + hide(ag + rs, t_b / units));
                m * per_micro_batch + ag + rs
            }
        }
    }

    /// Optimizer-step seconds of a stage holding `params` at ZeRO stage `zero` (§3.9):
    /// memory-bound over the local optimizer shard.
    pub fn optimizer_with(&self, zero: u8, params: &StageParams) -> f64 {
        let shard = |p: f64, group: u32| {
            if zero >= 1 {
                p / group.max(1) as f64
            } else {
                p
            }
        };
        // LoRA updates only the adapters (§2.7).
        let (dense, expert) = if self.problem.workload.lora {
            (params.adapter_dense, params.adapter_expert)
        } else {
            (params.dense, params.expert)
        };
        let local =
            shard(dense, self.groups.dense_dp.size) + shard(expert, self.groups.expert_dp.size);
        let w = &self.problem.workload;
        local * optimizer_bytes_per_param(w.grad_bytes as f64, w.optimizer.state_bytes_per_param())
            / self.device.memory_bytes_per_s
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

    /// Per-micro-batch times of one layer of each kind. They depend on the degrees,
    /// micro-batch, sequence parallelism and recompute, not on ZeRO or schedule.
    pub fn layers(&self) -> LayerTimes {
        let mut out = LayerTimes::default();
        for (kind, time) in out
            .iter_mut()
            .enumerate()
            .take(self.model().layer_kinds().len())
        {
            *time = self.layer(kind);
        }
        out
    }
}

/// The precision the linears of a layer run at (docs/costmodel.md §1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinearMode {
    /// The workload's precision recipe as it applies to a layer inside the stack (each role
    /// its precision; without a recipe the workload's precision).
    Recipe,
    /// One of the recipe's BF16 layers at the stack's start or end.
    Ends,
    /// Every linear in BF16 (a recipe's MTP block).
    Bf16,
}

/// Layers per kind among the first (`from_end == false`) or last `n` layers of `model`'s stack.
pub fn edge_kinds(model: &Model, n: u32, from_end: bool) -> LayerCounts {
    let mut runs = model.layer_stack();
    if from_end {
        runs.reverse();
    }
    let mut counts = [0u32; MAX_LAYER_KINDS];
    let mut left = n;
    for (kind, count) in runs {
        let take = count.min(left);
        counts[kind] += take;
        left -= take;
        if left == 0 {
            break;
        }
    }
    LayerCounts(counts)
}

/// Exposed seconds of `buckets` reduced one after another as a pass of `window` seconds
/// produces (or consumes) them in equal shares (§3.6): bucket `k` of `B` is ready at `k/B` of
/// the window, so what the pass does not cover is exposed — `max(c, B·c − ω·(B − 1)/B·window)`
/// for buckets of `c` seconds, where `omega` (ω) is the share of the window that hides
/// communication. A single bucket is always exposed (it is ready only when the pass ends);
/// without overlap (`overlapped == false`) all of it is.
pub fn bucketed_exposed(buckets: Buckets, window: f64, omega: f64, overlapped: bool) -> f64 {
    if !overlapped || buckets.calls <= 0.0 {
        return buckets.seconds;
    }
    let last = buckets.seconds / buckets.calls;
    let covered = omega * window * (buckets.calls - 1.0) / buckets.calls;
    last.max(buckets.seconds - covered)
}

/// Which parameters a DP/ZeRO collective moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamGroup {
    /// Dense (non-expert) parameters, over the dense DP group dp·ep·cp.
    Dense,
    /// Routed-expert parameters, over the expert DP group dp·cp.
    Expert,
}

/// When a DP/ZeRO collective runs in a step: the slots of [`DpComm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpPhase {
    /// ZeRO-0: gradient all-reduce once per step, after the last micro-batch's backward.
    AllReduce,
    /// ZeRO-1/2: gradient reduce-scatter (once per step; every micro-batch under ZeRO-2).
    ReduceScatter,
    /// ZeRO-1/2: all-gather of the updated weights once per step, after the optimizer step.
    AllGather,
    /// ZeRO-3: a unit's weights gathered, in forward and again in backward, every micro-batch.
    UnitAllGather,
    /// ZeRO-3: a unit's gradients reduce-scattered in backward, every micro-batch.
    UnitReduceScatter,
}

/// One DP/ZeRO collective of a stage as the time model charges it
/// ([`TimeContext::dp_collectives`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpCollective {
    pub phase: DpPhase,
    pub params: ParamGroup,
    pub kind: Collective,
    /// The ranks it runs over and where they sit.
    pub group: Group,
    /// Calls per round: DDP buckets (ZeRO 0-2, a round is once per step or per micro-batch)
    /// or FSDP units (ZeRO-3, a round is one pass over the stage's layers).
    pub calls: f64,
    /// Buffer of one call, bytes.
    pub bytes_per_call: f64,
    /// One call's latency, bandwidth time and algorithm.
    pub cost: CollectiveCost,
}

impl DpCollective {
    /// Seconds of one round's calls before overlap.
    pub fn round_s(&self) -> f64 {
        self.calls * self.cost.total_s
    }
}

/// One round of bucketed DP collectives: seconds of all its calls before overlap, and how many
/// calls (buckets) they are.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Buckets {
    pub seconds: f64,
    pub calls: f64,
}

/// The DP/ZeRO collectives of one stage per step, before overlap ([`TimeContext::dp_comm`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DpComm {
    /// Nothing reduced (LoRA).
    None,
    /// ZeRO-0: one all-reduce of the gradients, bucket by bucket.
    AllReduce(Buckets),
    /// ZeRO-1 and 2: reduce-scatter of the gradients (every micro-batch under ZeRO-2) and
    /// all-gather of the updated weights, bucket by bucket.
    Sharded {
        per_micro_batch: bool,
        reduce_scatter: Buckets,
        all_gather: Buckets,
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

/// The group a CP exchange all-to-alls over: `a` of the CP group's ranks, inside one NVLink
/// domain when the group's domain share allows it (a2a+p2p puts its a2a there), else the
/// whole CP group (`a = c`, Ulysses).
pub fn cp_a2a_group(cp: Group, a: u32) -> Group {
    if a >= cp.size {
        cp
    } else {
        Group {
            size: a,
            per_domain: a.min(cp.per_domain.max(1)),
        }
    }
}

/// Seconds of one pass's CP all-to-alls over `group` for `tokens` local tokens (§3.8): one
/// all-to-all each of Q, K and V before attention and one of its output after (the backward:
/// dO before, dQ, dK, dV after), each of the rank's whole buffer
/// [TransformerEngine AttnFuncWithCPAndQKVOA2A; DeepSpeed-Ulysses arXiv:2309.14509 §3.1].
pub fn cp_a2a_s(fabric: &Fabric, tokens: f64, ops: &LayerOps, group: Group) -> f64 {
    cp_a2a_bytes(tokens, ops)
        .iter()
        .map(|&b| fabric.collective_s(Collective::AllToAll, b, group))
        .sum()
}

/// Bytes of each of a pass's four CP all-to-alls (Q, K, V, output) for `tokens` local tokens.
pub fn cp_a2a_bytes(tokens: f64, ops: &LayerOps) -> [f64; 4] {
    let att = ops.attention;
    let q = tokens * att.heads * att.qk_head_dim * WIRE_BYTES;
    let kv = tokens * ops.comm.cp_kv_bytes_per_token / 2.0;
    let o = tokens * att.heads * att.v_head_dim * WIRE_BYTES;
    [q, kv, kv, o]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first of `kinds` whose spec satisfies `pred`.
    fn kind_where(
        kinds: &crate::layer::LayerKinds,
        pred: impl Fn(&crate::layer::LayerSpec) -> bool,
    ) -> usize {
        kinds.specs().iter().position(pred).unwrap()
    }

    /// Nemotron 3 Nano on 8 GB200 in NVFP4 (tp 1, ep 8), with `recipe` and `mtp` MTP depths.
    fn nano(recipe: Option<&str>, mtp: Option<u32>) -> (Problem, Plan) {
        let mut model = crate::presets::model("nemotron-3-nano-30b-a3b").unwrap();
        model.mtp_layers = mtp;
        model.mtp_pattern = mtp.map(|_| "*E".to_string());
        let cluster = crate::presets::cluster("gb200-nvl72", 8);
        let mut w = crate::Workload::new(64, 8192);
        w.precision = Precision::Nvfp4;
        w.precision_recipe = recipe.map(str::to_string);
        let p = Problem::new(model, cluster, w).unwrap();
        let plan: Plan =
            serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1,"ep":8,"micro_batch":1}"#).unwrap();
        (p, plan)
    }

    fn tc<'a>(p: &'a Problem, plan: &'a Plan) -> TimeContext<'a> {
        TimeContext::new(p, plan, Groups::of(plan, p.cluster.nvlink_domain()))
    }

    /// GPT-3 175B under ZeRO-3 over `gpus` A100s (one sequence of 2,048 per GPU) on `stack`.
    fn zero3_gpt3(stack: &str, gpus: u32) -> (Problem, Plan) {
        let cluster = crate::presets::cluster("a100-sxm-80g", gpus);
        let mut w = crate::Workload::new(gpus, 2048);
        w.precision = Precision::Fp16;
        w.grad_bytes = 2;
        w.stack = stack.to_string();
        let p = Problem::new(crate::presets::model("gpt3-175b").unwrap(), cluster, w).unwrap();
        let plan: Plan = serde_json::from_str(&format!(
            r#"{{"dp":{gpus},"tp":1,"pp":1,"micro_batch":1,"zero":3,"recompute":"full"}}"#
        ))
        .unwrap();
        (p, plan)
    }

    #[test]
    fn offload_copies_are_exposed_only_where_the_host_link_outlasts_the_window() {
        // Llama 3 70B, 80 layers on one rank, 2 × 8192 tokens per micro-batch in BF16.
        let problem = |gpu: &str, host: f64| {
            let mut cluster = crate::presets::cluster(gpu, 64);
            cluster.gpu.host_bandwidth_gbps = Some(host);
            Problem::new(
                crate::presets::model("llama3-70b").unwrap(),
                cluster,
                crate::Workload::new(128, 8192),
            )
            .unwrap()
        };
        let plan = |n: Option<u32>| -> Plan {
            let mut plan: Plan = serde_json::from_str(
                r#"{"dp":64,"tp":1,"pp":1,"micro_batch":2,"zero":3,"recompute":"none"}"#,
            )
            .unwrap();
            plan.offload_layers = n;
            plan
        };
        let fast = problem("gb200-nvl72", 225.0);
        let stage = crate::stages::stage_runs(&fast.model, 1, 8192)[0].stage;
        let (off, on) = (plan(None), plan(Some(40)));
        let t_off = tc(&fast, &off);
        let t_on = tc(&fast, &on);
        let layers = t_on.layers();
        assert_eq!(t_off.offload_exposed(&stage, &layers), (0.0, 0.0));
        // One layer's copy: its stored bytes over the link.
        let bytes = stage
            .kinds
            .weighted_sum(&crate::memory::layer_activations(&fast, &on))
            / 80.0
            * 16384.0;
        assert!((t_on.offload_copy_s(&stage) - bytes / 225e9).abs() < 1e-12);
        // At 225 GB/s the copy of a layer fits in the two layers of compute of its window.
        assert_eq!(t_on.offload_exposed(&stage, &layers), (0.0, 0.0));
        assert_eq!(t_on.stage(&stage, &layers), t_off.stage(&stage, &layers));
        // At 1 GB/s it does not: each of the 40 layers exposes copy − 2 layers' pass.
        let slow = problem("gb200-nvl72", 1.0);
        let t_slow = tc(&slow, &on);
        let copy = t_slow.offload_copy_s(&stage);
        let (fwd, bwd) = t_slow.offload_exposed(&stage, &layers);
        let mean = |p: f64| p / 80.0;
        let full = t_off.stage(&stage, &layers);
        let ends = t_off.ends(&stage);
        let want_fwd = 40.0 * (copy - 2.0 * mean(full.fwd.total() - ends.fwd.total()));
        let want_bwd = 40.0 * (copy - 2.0 * mean(full.bwd.total() - ends.bwd.total()));
        assert!(fwd > 0.0 && bwd > 0.0 && bwd < fwd);
        assert!(
            (fwd - want_fwd).abs() < 1e-9 * want_fwd,
            "{fwd} vs {want_fwd}"
        );
        assert!(
            (bwd - want_bwd).abs() < 1e-9 * want_bwd,
            "{bwd} vs {want_bwd}"
        );
        let slowed = t_slow.stage(&stage, &layers);
        assert!((slowed.total() - full.total() - fwd - bwd).abs() < 1e-9);
    }

    #[test]
    fn deepspeed_zero3_units_move_each_ranks_bytes_over_its_own_nic() {
        let nic = {
            let gpu = crate::presets::gpu("a100-sxm-80g").unwrap();
            gpu.network_bandwidth_gbps * 1e9 * gpu.calibration.network_bus_efficiency
        };
        let unit_gather = |stack: &str, gpus: u32| {
            let (p, plan) = zero3_gpt3(stack, gpus);
            let tc = tc(&p, &plan);
            let stage = crate::stages::stage_runs(&p.model, 1, p.workload.seq_len)[0].stage;
            let sp = crate::memory::stage_params(&p.model, &plan, &stage);
            let inv = tc.dp_collectives(3, &sp, stage.layers());
            *inv.iter()
                .find(|c| c.phase == DpPhase::UnitAllGather)
                .unwrap()
        };
        // DeepSpeed's four partitioned weights per layer, each over one NIC per rank.
        let ds = unit_gather("deepspeed", 1536);
        assert_eq!(ds.calls, 96.0 * 4.0);
        let expect = ds.bytes_per_call * 1535.0 / 1536.0 / nic;
        assert!(
            (ds.cost.bandwidth_s - expect).abs() < 1e-9 * expect,
            "{ds:?}"
        );
        // Megatron-FSDP's per-layer units on NCCL's rings pool the node's 8 NICs.
        let mc = unit_gather("megatron-core", 1536);
        let per_byte = |c: &DpCollective| c.cost.bandwidth_s / c.bytes_per_call;
        assert!(per_byte(&ds) > 6.0 * per_byte(&mc), "{ds:?} vs {mc:?}");
        // The per-step transfer of a GPU does not shrink with the group (SC21 Table 2: 66.7 s
        // per step at both 768 and 1,536 GPUs).
        let step = |c: &DpCollective| c.calls * c.cost.bandwidth_s;
        let half = unit_gather("deepspeed", 768);
        assert!((step(&ds) / step(&half) - 1.0).abs() < 1e-3);
    }

    #[test]
    fn the_fused_expert_mlp_recipe_drops_only_the_expert_activation_pass() {
        // Qwen3-30B-A3B on 8 GB200 in MXFP8 (ep 8), as Megatron-Bridge's 26.06 recipe runs it.
        let run = |recipe: Option<&str>| {
            let cluster = crate::presets::cluster("gb200-nvl72", 8);
            let mut w = crate::Workload::new(512, 4096);
            w.precision = Precision::Mxfp8;
            w.precision_recipe = recipe.map(str::to_string);
            let model = crate::presets::model("qwen3-30b-a3b").unwrap();
            let p = Problem::new(model, cluster, w).unwrap();
            let plan: Plan =
                serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1,"ep":8,"micro_batch":4}"#).unwrap();
            let tc = tc(&p, &plan);
            let kind = tc.model().layer_kinds().specs().len() - 1;
            let ops = tc.layer_ops(kind);
            (ops, tc.stack.expert_activation_bytes_per_width)
        };
        let (plain, act) = run(None);
        let (fused, _) = run(Some("mxfp8-fused-expert-mlp"));
        // What goes is the expert activation's pass (the moe_act module's bytes: each routed
        // copy's act · f_e), no more.
        assert_eq!(act, 6.0);
        let removed = plain.module_elementwise_bytes[RecomputeModule::MoeAct.index()];
        assert!(removed > 0.0);
        let got = plain.routed_elementwise_bytes - fused.routed_elementwise_bytes;
        assert!((got - removed).abs() < 1e-6 * removed, "{got} vs {removed}");
        // The permute/unpermute bytes and every other term stay.
        assert!(fused.routed_elementwise_bytes > 0.0);
        assert_eq!(plain.elementwise_bytes, fused.elementwise_bytes);
    }

    #[test]
    fn the_fused_expert_mlp_recipe_needs_an_mxfp8_workload() {
        let mut w = crate::Workload::new(512, 4096);
        w.precision = Precision::Fp8;
        w.precision_recipe = Some("mxfp8-fused-expert-mlp".to_string());
        let e = w.validate().unwrap_err().to_string();
        assert!(
            e.contains("workload.precision_recipe") && e.contains("mxfp8"),
            "{e}"
        );
        w.precision = Precision::Mxfp8;
        w.validate().unwrap();
    }

    #[test]
    fn a_precision_recipe_runs_each_linear_at_its_roles_precision() {
        let (p, plan) = nano(Some("nemotron3-super-nvfp4"), None);
        let tc = tc(&p, &plan);
        let gemm = |role| Gemm {
            m: 8192.0,
            n: 4096.0,
            k: 2688.0,
            repeat: 1.0,
            grouped: false,
            role,
        };
        let run = |role, mode| {
            let mut acc = LinearTimes::default();
            tc.linear(&mut acc, &gemm(role), mode);
            acc
        };
        let (m, n, k) = (8192.0, 4096.0, 2688.0);
        let bw = tc.device.memory_bytes_per_s;
        // NVFP4 GEMMs with Transformer Engine's casts: the input (3 B per element) forward, the
        // output gradient (3 B) and the input's transposed copy (2 B) backward.
        let with_casts = |dev: &GemmDevice| {
            let t = linear_s(dev, m, n, k, 2.0);
            LinearTimes {
                fwd: t.fwd + 3.0 * m * k / bw,
                dgrad: t.dgrad + (3.0 * m * n + 2.0 * m * k) / bw,
                wgrad: t.wgrad,
            }
        };
        assert_eq!(
            run(GemmRole::Other, LinearMode::Recipe),
            with_casts(&tc.device.gemm)
        );
        // Attention projections: the 16-bit roofline, no casts.
        let bf16 = linear_s(&tc.device.gemm16, m, n, k, 2.0);
        assert_eq!(run(GemmRole::AttentionProjection, LinearMode::Recipe), bf16);
        assert_eq!(run(GemmRole::LatentProjection, LinearMode::Recipe), bf16);
        // Mamba out_proj: MXFP8 (GB200 has it), with the casts.
        let mx = tc.gemm_mxfp8.unwrap();
        assert_eq!(mx.element_bytes, 1.0);
        assert_eq!(
            run(GemmRole::MambaOutProj, LinearMode::Recipe),
            with_casts(&mx)
        );
        // In the BF16 tail everything is BF16 but the MXFP8 override; an MTP block all BF16.
        assert_eq!(run(GemmRole::Other, LinearMode::Ends), bf16);
        assert_eq!(
            run(GemmRole::MambaOutProj, LinearMode::Ends),
            with_casts(&mx)
        );
        assert_eq!(run(GemmRole::MambaOutProj, LinearMode::Bf16), bf16);
        // BF16 GEMMs of this shape take longer than NVFP4 ones.
        assert!(bf16.fwd > linear_s(&tc.device.gemm, m, n, k, 2.0).fwd);
        // Without a recipe every role is the workload's.
        let (p0, plan0) = nano(None, None);
        let tc0 = TimeContext::new(&p0, &plan0, Groups::of(&plan0, p0.cluster.nvlink_domain()));
        let mut acc = LinearTimes::default();
        tc0.linear(
            &mut acc,
            &gemm(GemmRole::AttentionProjection),
            LinearMode::Recipe,
        );
        assert_eq!(acc, with_casts(&tc0.device.gemm));
    }

    #[test]
    fn the_recipes_bf16_tail_layers_are_counted_at_bf16_on_the_last_rank() {
        let (p, plan) = nano(Some("nemotron3-super-nvfp4"), None);
        // Nano's pattern ends "…*EMEMEMEM*EMEMEMEME": its last 14 layers are "EMEM*EMEMEMEME",
        // 6 Mamba-2 (kind 0), 7 MoE (kind 1) and 1 attention (kind 2).
        assert_eq!(
            edge_kinds(&p.model, 14, true),
            LayerCounts::from_counts(&[6, 7, 1])
        );
        // The first 3: "MEM".
        assert_eq!(
            edge_kinds(&p.model, 3, false),
            LayerCounts::from_counts(&[2, 1, 0])
        );
        let tc = tc(&p, &plan);
        let layers = tc.layers();
        let stage = crate::stages::stage_runs(&p.model, 1, 8192)[0].stage;
        let total = tc.stage(&stage, &layers);
        let mut want = tc.ends(&stage);
        for (kind, count) in stage.kinds.iter() {
            want.add_scaled(&layers[kind], count as f64);
        }
        for (kind, count) in [(0, 6.0), (1, 7.0), (2, 1.0)] {
            let bf16 = tc
                .layer_parts_at(kind, LinearMode::Ends)
                .with(plan.recompute, plan.recompute_modules);
            want.add_scaled(&bf16, count);
            want.add_scaled(&layers[kind], -count);
        }
        assert_eq!(total, want);
        // The tail makes the step slower than the layers alone.
        let mut plain = tc.ends(&stage);
        for (kind, count) in stage.kinds.iter() {
            plain.add_scaled(&layers[kind], count as f64);
        }
        assert!(total.total() > plain.total());
    }

    #[test]
    fn each_mtp_depth_runs_its_block_eh_proj_and_the_lm_head_again() {
        let (p0, plan) = nano(None, None);
        let (p2, _) = nano(None, Some(2));
        let (t0, t2) = (tc(&p0, &plan), tc(&p2, &plan));
        let stage = crate::stages::stage_runs(&p0.model, 1, 8192)[0].stage;
        // The MTP block "*E" is the attention layer (kind 2) and the MoE layer (kind 1).
        assert_eq!(p2.model.mtp_kinds(), vec![2, 1]);
        let (s0, s2) = (
            t0.stage(&stage, &t0.layers()),
            t2.stage(&stage, &t2.layers()),
        );
        // Per depth, forward: the two layers, eh_proj (8192 × 2688 × 5376 at NVFP4 with its
        // input cast, no recipe) and the head (8192 × 131072 × 2688) with the loss's passes.
        let (tok, h, v) = (8192.0, 2688.0, 131072.0);
        let bw = t0.device.memory_bytes_per_s;
        let eh = linear_s(&t0.device.gemm, tok, h, 2.0 * h, 2.0).fwd + 3.0 * tok * 2.0 * h / bw;
        let head = linear_s(&t0.device.gemm, tok, v, h, 2.0).fwd;
        let ce = t0.stack.cross_entropy_passes * FP32_BYTES * tok * v / bw;
        let per_depth = t0.layer(2).fwd.compute + t0.layer(1).fwd.compute + eh + head + ce;
        let got = s2.fwd.compute - s0.fwd.compute;
        assert!(
            (got / (2.0 * per_depth) - 1.0).abs() < 1e-12,
            "{got} vs {per_depth}"
        );
        // Its expert exchange comes along with the MoE layer.
        assert!((s2.fwd.ep - s0.fwd.ep - 2.0 * t0.layer(1).fwd.ep).abs() < 1e-12);
    }

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
            host_wait: 0.0,
        }
    }

    #[test]
    fn buckets_hide_behind_the_pass_that_produces_them() {
        let b = |seconds: f64, calls: f64| Buckets { seconds, calls };
        // Ten 1 ms buckets under a 20 ms backward: each is done before the next is ready, so
        // only the last one shows.
        assert!((bucketed_exposed(b(0.010, 10.0), 0.020, 1.0, true) - 0.001).abs() < 1e-15);
        // Ten 5 ms buckets under a 20 ms backward: the reduction is the bottleneck; the
        // backward covers 9/10 of its 20 ms (the last bucket is ready only at its end).
        let want = 0.050 - 0.020 * 0.9;
        assert!((bucketed_exposed(b(0.050, 10.0), 0.020, 1.0, true) - want).abs() < 1e-15);
        // One bucket is ready only when the backward ends: all of it is exposed.
        assert_eq!(bucketed_exposed(b(0.010, 1.0), 1.0, 1.0, true), 0.010);
        // No overlap flag, or ω = 0: all of it.
        assert_eq!(bucketed_exposed(b(0.050, 10.0), 0.020, 1.0, false), 0.050);
        assert_eq!(bucketed_exposed(b(0.050, 10.0), 0.020, 0.0, true), 0.050);
        // Half the window hides communication: half the cover.
        let half = 0.050 - 0.5 * 0.020 * 0.9;
        assert!((bucketed_exposed(b(0.050, 10.0), 0.020, 0.5, true) - half).abs() < 1e-15);
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

    #[test]
    fn the_mamba_2_scan_takes_at_least_flash_attention_over_the_crossover_keys() {
        // Nemotron 3 Nano on 8 GB200 (tp 1): 64 Mamba-2 heads of 64 channels, 8192 tokens per
        // micro-batch. The SSD kernels are charged flash attention of 64 heads of dim 64 over
        // the crossover keys of data/device.toml (2048, the Mamba-2 paper's SSD/FlashAttention-2
        // crossover), 4·64·64·2048 FLOPs per token at the attention rate; the backward the
        // stack's attention ratio of it.
        let (p, plan) = nano(None, None);
        let t = tc(&p, &plan);
        let kinds = p.model.layer_kinds();
        let mamba = kind_where(&kinds, |s| matches!(s.mixer, crate::layer::Mixer::Mamba(_)));
        let keys = crate::device::ssd_flash_crossover_keys();
        assert_eq!(keys, 2048.0);
        let core = t.layer_ops(mamba).attention;
        assert_eq!((core.ssd_heads, core.ssd_head_dim), (64.0, 64.0));
        let rate = t.device.attention_flops_per_s;
        let floor = 8192.0 * 4.0 * 64.0 * 64.0 * keys / rate;
        // The floor is what binds at Nemotron's shapes: over 9x the scan's own FLOPs at the
        // same rate and over 2.5x the HBM time of its kernels' bytes.
        let own = 8192.0 * core.scan_fwd_flops_per_token / rate;
        let bytes = 8192.0 * core.scan_fwd_bytes_per_token / t.device.memory_bytes_per_s;
        assert!(
            floor > 9.0 * own && floor > 2.5 * bytes,
            "{floor} {own} {bytes}"
        );
        let parts = t.layer_parts(mamba);
        assert!((parts.attention_fwd / floor - 1.0).abs() < 1e-12);
        // The whole layer: its GEMMs, element-wise work and overhead beside the scan.
        let ratio = t.stack.attention_backward_ratio;
        let ops = t.layer_ops(mamba);
        let mut g = LinearTimes::default();
        for gemm in ops.gemms() {
            t.linear(&mut g, gemm, LinearMode::Recipe);
        }
        let elem = ops.elementwise_bytes / t.device.memory_bytes_per_s;
        let overhead = p.cluster.gpu.calibration.layer_overhead_us * 1e-6;
        let want_fwd = g.fwd + floor + elem + overhead;
        let want_bwd = g.dgrad + g.wgrad + ratio * floor + 2.0 * elem + 2.0 * overhead;
        assert!((parts.time.fwd.compute / want_fwd - 1.0).abs() < 1e-12);
        assert!((parts.time.bwd.compute / want_bwd - 1.0).abs() < 1e-12);
        // Split over TP 2, each GPU runs half the heads: half the floor.
        let tp2: Plan =
            serde_json::from_str(r#"{"dp":1,"tp":2,"pp":1,"ep":4,"micro_batch":1}"#).unwrap();
        let t2 = tc(&p, &tp2);
        assert!((t2.layer_parts(mamba).attention_fwd / (floor / 2.0) - 1.0).abs() < 1e-12);
        // Attention layers keep their own keys: no floor.
        let attn = kind_where(&kinds, |s| {
            matches!(s.mixer, crate::layer::Mixer::Attention { .. })
        });
        assert_eq!(t.layer_ops(attn).attention.ssd_heads, 0.0);
    }

    #[test]
    fn overlapped_ep_exchanges_hide_behind_one_node_each_and_tax_its_sms() {
        // DeepSeek-V3 on 32 B200 at EP 32 (four NVLink domains). Under EP
        // overlap each exchange runs beside one compute node of the other micro-batch
        // (Megatron's combined 1F1B: combine_bwd ∥ attn_fwd, dispatch_fwd + dispatch_bwd ∥
        // mlp_bwd + mlp_fwd, combine_fwd ∥ attn_bwd), and while it runs its kernels hold the
        // stack's ep_comm_sms (Megatron's moe_deepep_num_sms, 20) of the SMs (§3.7).
        let model = crate::presets::model("deepseek-v3").unwrap();
        let cluster = crate::presets::cluster("b200", 32);
        let mut w = crate::Workload::new(128, 4096);
        w.precision = Precision::Fp8;
        let p = Problem::new(model, cluster, w).unwrap();
        let plain: Plan =
            serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1,"ep":32,"micro_batch":1}"#).unwrap();
        let overlap: Plan = serde_json::from_str(
            r#"{"dp":1,"tp":1,"pp":1,"ep":32,"micro_batch":1,"ep_overlap":true}"#,
        )
        .unwrap();
        let kinds = p.model.layer_kinds();
        let moe_kind = kind_where(&kinds, |s| matches!(s.mlp, crate::layer::Mlp::Moe(_)));
        let (t0, t1) = (tc(&p, &plain), tc(&p, &overlap));
        assert_eq!(t1.stack().ep_comm_sms, 20.0);
        let (a, b) = (t0.layer_parts(moe_kind).time, t1.layer_parts(moe_kind).time);
        // Without overlap each pass exposes its dispatch and combine (calibration ep_overlap 0).
        let raw = a.fwd.ep;
        assert!(raw > 0.0 && a.bwd.ep == raw);
        let share = 20.0 / t1.device.gemm.sm_count as f64;
        let exposed = b.fwd.ep + b.bwd.ep;
        // Overlap hides some of it, never the SMs' share of any of it.
        assert!(exposed < 2.0 * raw, "{exposed} vs {}", 2.0 * raw);
        assert!(exposed >= 2.0 * raw * share * (1.0 - 1e-12), "{exposed}");
        // Hiding each exchange behind the whole other pass (instead of one node of it) would
        // expose less: this exchange is longer than the node it runs beside.
        let whole = |c: f64, w: f64| (c - w).max(0.0) + c.min(w) * share;
        let whole_pass = whole(raw, b.bwd.compute) + whole(raw, b.fwd.compute);
        assert!(exposed > 1.05 * whole_pass, "{exposed} vs {whole_pass}");
    }

    #[test]
    fn a_routed_expert_forward_takes_at_least_its_grouped_gemms_host_issue() {
        // Nemotron 3 Nano on 8 GB200 without EP: 128 local experts, 8192 x 6 / 128 = 384 routed
        // tokens each per micro-batch. Transformer Engine's GroupedLinear issues one cuBLASLt
        // GEMM per expert (33 µs each, stack grouped_gemm_expert_issue_us) right after Megatron
        // synchronises on the tokens per expert, so the two grouped GEMMs of the forward take
        // 2 x 128 x 33 µs = 8.4 ms on the host, far more than their math on the GPU (§5.2.1).
        let (p, _) = nano(None, None);
        let plan: Plan =
            serde_json::from_str(r#"{"dp":8,"tp":1,"pp":1,"ep":1,"micro_batch":1}"#).unwrap();
        let t = tc(&p, &plan);
        assert_eq!(t.stack().grouped_gemm_expert_issue_us, 33.0);
        let kinds = p.model.layer_kinds();
        let moe = kind_where(&kinds, |s| matches!(s.mlp, crate::layer::Mlp::Moe(_)));
        let ops = t.layer_ops(moe);
        let (mut all, mut routed) = (LinearTimes::default(), LinearTimes::default());
        for gemm in ops.gemms() {
            t.linear(&mut all, gemm, LinearMode::Recipe);
            if gemm.grouped {
                t.linear(&mut routed, gemm, LinearMode::Recipe);
            }
        }
        let host = 2.0 * 128.0 * 33e-6;
        assert!(routed.fwd < 0.25 * host, "{} vs {host}", routed.fwd);
        let excess = host - routed.fwd;
        assert!((t.expert_issue_excess_s(&ops, LinearMode::Recipe) / excess - 1.0).abs() < 1e-12);
        // The layer's forward carries it; its backward (no synchronisation) does not.
        let cal = &p.cluster.gpu.calibration;
        let overhead = cal.layer_overhead_us
            * 1e-6
            * t.stack().layer_overhead_factor
            * t.stack().moe_layer_kernel_factor;
        let elem =
            (ops.elementwise_bytes + ops.routed_elementwise_bytes) / t.device.memory_bytes_per_s;
        let parts = t.layer_parts(moe);
        let want_fwd = all.fwd + excess + elem + overhead;
        let want_bwd = all.dgrad + all.wgrad + 2.0 * elem + 2.0 * overhead;
        assert!((parts.time.fwd.compute / want_fwd - 1.0).abs() < 1e-12);
        assert!((parts.time.bwd.compute / want_bwd - 1.0).abs() < 1e-12);
        // Recomputing the MoE block replays the host-bound forward too.
        let replay = parts.modules.compute[RecomputeModule::Moe.index()];
        assert!(replay > excess, "{replay} <= {excess}");
        // A stack that names no issue time (torchtitan's torch._grouped_mm: one launch) adds none.
        let titan = crate::stack::Stack::named("torchtitan").unwrap();
        assert_eq!(titan.grouped_gemm_expert_issue_us, 0.0);
    }

    #[test]
    fn expert_weight_gradients_read_and_write_fp32_main_grads() {
        // DeepSeek-V3 on 8 B200 in FP8, EP 8: 32 local experts of 3·7168·2048 weights, 1,024
        // routed tokens each per 4,096-token micro-batch. Megatron accumulates each weight
        // gradient into its fp32 main gradient (read and written, 8 bytes a weight, §5.2.2), so
        // the MoE layer's weight-gradient time is at least those bytes at HBM speed — more than
        // FP8 outputs (1 byte) would cost.
        let model = crate::presets::model("deepseek-v3").unwrap();
        let cluster = crate::presets::cluster("b200", 8);
        let mut w = crate::Workload::new(64, 4096);
        w.precision = Precision::Fp8;
        let p = Problem::new(model, cluster, w).unwrap();
        let plan: Plan =
            serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1,"ep":8,"micro_batch":1}"#).unwrap();
        let tc = tc(&p, &plan);
        assert_eq!(tc.stack().wgrad_output_bytes, Some(8.0));
        let kinds = p.model.layer_kinds();
        let moe_kind = kind_where(&kinds, |s| matches!(s.mlp, crate::layer::Mlp::Moe(_)));
        let wgrad = tc.layer_parts(moe_kind).time.wgrad;
        let moe = p.model.moe.as_ref().unwrap();
        let local = moe.num_experts as f64 / 8.0;
        let weights = local * 3.0 * p.model.hidden as f64 * moe.expert_ffn_hidden as f64;
        let main_grads_s = 8.0 * weights / tc.device.memory_bytes_per_s;
        assert!(wgrad > main_grads_s, "{wgrad} <= {main_grads_s}");
        // The same layer with the gradient written once at the GEMM's precision is faster.
        let dev = &tc.device.gemm;
        let tokens = 4096.0 * moe.top_k as f64 / local;
        let (h, f) = (p.model.hidden as f64, moe.expert_ffn_hidden as f64);
        let experts = |out: f64| {
            crate::gemm::grouped_linear_s(dev, local, tokens, 2.0 * f, h, out).wgrad
                + crate::gemm::grouped_linear_s(dev, local, tokens, h, f, out).wgrad
        };
        assert!(experts(8.0) > 1.2 * experts(dev.element_bytes));
    }

    #[test]
    fn each_recompute_module_replays_its_own_forward_in_the_backward() {
        // Nemotron 3 Nano (Mamba-2, attention, MoE with a shared expert) on 8 GB200, EP 8,
        // with the MoE block graphed: the host-issue floor (§5.5) would hide the replays.
        let (mut p, plan) = nano(None, None);
        p.workload.cuda_graphs = CudaGraphs::Full;
        let tc = tc(&p, &plan);
        let kinds = p.model.layer_kinds();
        let moe_kind = kind_where(&kinds, |s| {
            matches!(s.mlp, crate::layer::Mlp::Moe(_)) && !s.mixer.present()
        });
        let parts = tc.layer_parts(moe_kind);
        let sel = |m: Option<&str>| {
            parts.with(
                Recompute::Selective,
                m.map(|t| RecomputeModules::parse(t).unwrap()),
            )
        };
        let none = parts.with(Recompute::None, None);
        // core_attn alone is what selective always meant, bit for bit.
        assert_eq!(sel(Some("core_attn")), sel(None));
        // moe replays the block's GEMMs and element-wise work, its TP points and its exposed
        // forward EP exchange; the forward is untouched.
        let moe = sel(Some("moe"));
        let i = RecomputeModule::Moe.index();
        assert_eq!(moe.fwd, none.fwd);
        assert_eq!(moe.bwd.compute, none.bwd.compute + parts.modules.compute[i]);
        assert_eq!(moe.bwd.ep, none.bwd.ep + none.fwd.ep);
        assert!(none.fwd.ep > 0.0);
        // moe_act: the experts' activation only, its element-wise bytes at HBM speed.
        let ops = tc.layer_ops(moe_kind);
        let a = RecomputeModule::MoeAct.index();
        assert_eq!(
            parts.modules.compute[a],
            ops.module_elementwise_bytes[a] / tc.device.memory_bytes_per_s
        );
        // Nested checkpoints replay again: shared_experts and moe_act inside moe add.
        let all = sel(Some("moe+moe_act+shared_experts"));
        let s = RecomputeModule::SharedExperts.index();
        let extra = parts.modules.compute[a] + parts.modules.compute[s];
        assert!((all.bwd.compute - moe.bwd.compute - extra).abs() <= 1e-12 * all.bwd.compute);
        // The block holds both: its replay is more than the two together.
        assert!(parts.modules.compute[i] > extra);
        // A Mamba layer has nothing the MoE modules replay.
        let mamba = kind_where(&kinds, |s| matches!(s.mixer, crate::layer::Mixer::Mamba(_)));
        let mp = tc.layer_parts(mamba);
        assert_eq!(
            mp.with(
                Recompute::Selective,
                Some(RecomputeModules::parse("moe+moe_act+layernorm").unwrap())
            ),
            mp.with(Recompute::None, None)
        );
    }

    /// Qwen3-30B-A3B on 8 B200 at EP 8 with the alltoall dispatcher, micro-batch `mbs`, under
    /// `graphs` (`model`: another preset on the same plan).
    fn qwen3_30b(model: &str, mbs: u32, graphs: CudaGraphs) -> (Problem, Plan) {
        let cluster = crate::presets::cluster("b200", 8);
        let mut w = crate::Workload::new(512, 4096);
        w.precision = Precision::Mxfp8;
        w.cuda_graphs = graphs;
        let p = Problem::new(crate::presets::model(model).unwrap(), cluster, w).unwrap();
        let ep = if p.model.is_moe() { 8 } else { 1 };
        let dp = 8 / ep;
        let plan: Plan = serde_json::from_str(&format!(
            r#"{{"dp":{dp},"tp":1,"pp":1,"ep":{ep},"micro_batch":{mbs},"dispatcher":"alltoall"}}"#
        ))
        .unwrap();
        (p, plan)
    }

    #[test]
    fn an_eager_dropless_moe_layer_lasts_at_least_its_host_issue_time() {
        let host = Stack::default_stack().moe_host_issue_us * 1e-6;
        assert!(host > 0.0);
        // Micro-batch 1: the GPU work of a Qwen3-30B-A3B layer on B200 is shorter than the
        // host's issue of it; each pass waits for the host (a third forward, two backward).
        let (pe, plan) = qwen3_30b("qwen3-30b-a3b", 1, CudaGraphs::None);
        let (pg, _) = qwen3_30b("qwen3-30b-a3b", 1, CudaGraphs::Full);
        let kinds = pe.model.layer_kinds();
        let k = kind_where(&kinds, |s| matches!(s.mlp, crate::layer::Mlp::Moe(_)));
        let (eager, graphed) = (tc(&pe, &plan).layer(k), tc(&pg, &plan).layer(k));
        assert_eq!(graphed.host_wait, 0.0);
        assert!(graphed.total() < host, "{} vs {host}", graphed.total());
        let want_fwd = graphed.fwd.total().max(host / 3.0);
        let want_bwd = graphed.bwd.total().max(2.0 * host / 3.0);
        assert!((eager.fwd.total() - want_fwd).abs() < 1e-12);
        assert!((eager.bwd.total() - want_bwd).abs() < 1e-12);
        // Full graphs also replay the experts' grouped-GEMM launches (§5.2.1), so the eager
        // layer is longer than the graphed one by its host wait and at most that issue excess.
        assert!(eager.host_wait > 0.0);
        assert!(eager.host_wait <= eager.total() - graphed.total() + 1e-12);
        // The wait is GPU idle time on the compute stream: the exchange is unchanged.
        assert_eq!(eager.fwd.ep, graphed.fwd.ep);
        // Partial graphs (attention, router, preprocess) leave the experts eager: the same.
        let (pp_, _) = qwen3_30b("qwen3-30b-a3b", 1, CudaGraphs::Partial);
        assert_eq!(tc(&pp_, &plan).layer(k), eager);
        // Full recompute issues the forward again in the backward.
        let mut full = plan;
        full.recompute = Recompute::Full;
        let r = tc(&pe, &full).layer(k);
        assert!(r.bwd.total() >= host - 1e-12);
        // Micro-batch 8: the GPU is the slower side; nothing waits.
        let (pe8, plan8) = qwen3_30b("qwen3-30b-a3b", 8, CudaGraphs::None);
        let (pg8, _) = qwen3_30b("qwen3-30b-a3b", 8, CudaGraphs::Full);
        let (e8, g8) = (tc(&pe8, &plan8).layer(k), tc(&pg8, &plan8).layer(k));
        assert!(g8.fwd.total() > host / 3.0 && g8.bwd.total() > 2.0 * host / 3.0);
        assert_eq!(e8, g8);
        // A dense layer has no host-device sync to wait on.
        let (de, dplan) = qwen3_30b("llama3-8b", 1, CudaGraphs::None);
        let (dg, _) = qwen3_30b("llama3-8b", 1, CudaGraphs::Full);
        for kind in 0..de.model.layer_kinds().len() {
            assert_eq!(tc(&de, &dplan).layer(kind), tc(&dg, &dplan).layer(kind));
        }
    }

    /// Flash attention's rate follows the kernel call's sequence length (docs/costmodel.md
    /// §5.2): the fitted rate at 4,096, about 8 % faster at 32,768 per call (L½ = 400 of the
    /// FlashAttention-3 paper's cuDNN curves), and a ring over 4 CP ranks of 131,072 tokens calls
    /// the kernel at 32,768 (Ulysses' all-to-all at the whole 131,072).
    #[test]
    fn flash_attention_rate_follows_the_kernel_call_length() {
        let run = |seq: u32, cp: u32, exchange: &str| {
            let cluster = crate::presets::cluster("h100-sxm", 8);
            let w = crate::Workload::new(8, seq);
            let p = Problem::new(crate::presets::model("llama3-8b").unwrap(), cluster, w).unwrap();
            let plan: Plan = serde_json::from_str(&format!(
                r#"{{"dp":{},"tp":1,"pp":1,"cp":{cp},"cp_exchange":"{exchange}","micro_batch":1}}"#,
                8 / cp
            ))
            .unwrap();
            let t = tc(&p, &plan);
            let att = t.layer_ops(0).attention;
            let flops = t.tokens
                * 2.0
                * att.heads
                * (att.qk_head_dim + att.v_head_dim)
                * att.keys_per_query(seq as f64);
            // The layer's attention time against its FLOPs at the fitted (reference) rate.
            t.layer_parts(0).attention_fwd * t.device.attention_flops_per_s / flops
        };
        let at_ref = run(4096, 1, "ring");
        assert!((at_ref - 1.0).abs() < 1e-12, "{at_ref}");
        let long = run(32768, 1, "ring");
        let expected = (4096.0 + 400.0) / 4096.0 * 32768.0 / (32768.0 + 400.0);
        assert!((1.0 / long - expected).abs() < 1e-9, "{long} {expected}");
        assert!(1.0 / long > 1.08, "{long}");
        let ring = run(131072, 4, "ring");
        assert!((ring / long - 1.0).abs() < 1e-9, "{ring} {long}");
        let ulysses = run(131072, 4, "a2a");
        assert!(ulysses < ring, "{ulysses} {ring}");
        // Short calls run slower than the reference; no call beats (L_ref + L½)/L_ref.
        assert!((crate::device::attention_length_factor(2048.0) - 0.918).abs() < 1e-3);
        assert!(crate::device::attention_length_factor(1e9) < 4496.0 / 4096.0);
    }
}

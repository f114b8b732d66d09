//! Explains one plan axis by axis (DESIGN "people learning the field"; COSTMODEL §3, §7): for
//! DP, TP, PP, EP, CP and ZeRO, what state is sharded, which collectives run (how often, how
//! big, bytes per token and per step per GPU), which fabric carries them (the rank layout of
//! §3.3) and how much of their time the step exposes.
//!
//! Nothing here is a second cost model. Bytes are the time model's messages (`traffic`),
//! seconds are `comm::Fabric` on the groups of `layout`, per-micro-batch stage times come from
//! `time::TimeContext`, and exposed seconds are the evaluation's own time breakdown, so the axes'
//! `exposed_s` plus compute and the optimizer step add up to the step time.
//!
//! Conventions: counts and bytes are per GPU per optimizer step on the critical pipeline stage
//! (the one the step time is built from; stage 0 for the data-parallel reduction, which finishes
//! last). "Per token" divides by the tokens whose activations this GPU handles in a step,
//! `m·b·s/c`. A collective's wire bytes are what each rank sends (`2(P−1)/P` of the buffer for
//! an all-reduce, `(P−1)/P` for the others, the whole message for a send).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::comm::{Collective, Fabric};
use crate::error::{Error, Result};
use crate::evaluate::evaluate_with;
use crate::hardware::Cluster;
use crate::layout::{domain_block, group, group_ranks, strides, Group, Groups};
use crate::limits::{MAX_LISTED_RANKS, MAX_LISTED_STAGES};
use crate::memory::stage_params;
use crate::model::Model;
use crate::plan::{Axis, Plan, RankOrder, Recompute, Schedule};
use crate::report::Evaluation;
use crate::space::SearchSpace;
use crate::stages::{stage_runs, Stage, StageRun};
use crate::time::{LayerTime, Pass, TimeContext};
use crate::traffic::{
    collective_terms, cp_kv_bytes_per_token, dispatch_terms, ep_bytes_per_token_per_layer,
    p2p_terms, tp_decode_allreduce_bytes_per_token, tp_points_per_layer, wire_bytes, WIRE_BYTES,
};
use crate::{Control, Problem};

/// One collective (or point-to-point send) of an axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveInfo {
    /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all` or `send-recv`.
    pub op: String,
    /// When it runs, e.g. "per layer per micro-batch, forward".
    pub when: String,
    /// How many times per optimizer step.
    pub count_per_step: u64,
    /// Buffer of one call, bytes (gathered size for all-gather, input for reduce-scatter, send
    /// buffer for all-to-all, the message for a send).
    pub message_bytes: f64,
    /// Wire bytes this GPU sends per token it handles.
    pub bytes_per_token_per_gpu: f64,
    /// Wire bytes this GPU sends per step.
    pub bytes_per_step_per_gpu: f64,
    /// Seconds of all calls in a step on the fabric, before any overlap.
    pub seconds_per_step: f64,
    /// The latency term of one call is at least its bandwidth term.
    pub latency_bound: bool,
}

/// One parallel axis of a plan (or ZeRO), the four facts and their time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AxisExplanation {
    /// `dp`, `tp`, `pp`, `ep`, `cp` or `zero`.
    pub axis: String,
    /// The plan's degree (the ZeRO stage for `zero`).
    pub degree: u32,
    /// One sentence: what is split and what is replicated.
    pub state_sharded: String,
    pub collectives: Vec<CollectiveInfo>,
    /// `nvlink` (every member in one scale-up domain), `network` (one member per domain) or
    /// `nvlink+network` (hierarchical).
    pub fabric: String,
    /// Ranks in the communication group (2 for the neighbouring pipeline stages).
    pub group_size: u32,
    /// Members of the group inside one scale-up domain.
    pub members_per_domain: u32,
    /// Domains the group spans.
    pub domains: u32,
    /// Seconds per step of the evaluation's time breakdown attributed to this axis.
    pub exposed_s: f64,
    /// Seconds per step of this axis's communication hidden behind other work.
    pub overlapped_s: f64,
    pub notes: Vec<String>,
}

/// One axis of the device mesh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeshAxis {
    pub axis: String,
    pub size: u32,
    /// Rank distance between neighbours along the axis.
    pub stride: u64,
}

/// The communication group of an axis (or of several: `dense_dp` is dp·ep·cp, `expert_dp`
/// dp·cp).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeshGroup {
    pub axis: String,
    pub size: u32,
    pub members_per_domain: u32,
    pub domains: u32,
    pub crosses_domain: bool,
    /// The group that contains rank 0, ascending: its first
    /// [`MAX_LISTED_RANKS`](crate::limits::MAX_LISTED_RANKS) ranks (all of them when `size` is
    /// no larger; `size` says how many there are).
    pub example_ranks: Vec<u32>,
}

/// The device mesh of a plan: its rank order, the axes' strides and where each group lands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mesh {
    pub order: RankOrder,
    /// GPUs of this job per scale-up domain (the domain size, or the largest divisor of the job
    /// that fits in one: see `layout::domain_block`).
    pub domain_size: u32,
    /// Innermost first.
    pub axes: Vec<MeshAxis>,
    pub groups: Vec<MeshGroup>,
}

/// Per-micro-batch times of one pipeline rank (all of its chunks), seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    pub index: u32,
    pub layers: u32,
    /// Forward of one micro-batch, exposed TP/CP/EP communication included.
    pub fwd_s: f64,
    /// Backward (recompute included).
    pub bwd_s: f64,
    /// The weight-gradient part of `bwd_s` (what zero-bubble schedules defer).
    pub wgrad_s: f64,
}

/// What a pipeline-schedule picture needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineTimes {
    pub schedule: Schedule,
    pub vpp: u32,
    pub micro_batches: u32,
    /// One entry per pipeline rank, in order: the first
    /// [`MAX_LISTED_STAGES`](crate::limits::MAX_LISTED_STAGES) ranks (every rank when the plan's
    /// `pp` is no larger).
    pub stages: Vec<StageTime>,
}

/// A plan explained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The plan with its schedule resolved.
    pub plan: Plan,
    pub evaluation: Evaluation,
    pub mesh: Mesh,
    /// One entry per axis present, in the order dp, tp, pp, ep, cp, zero.
    pub axes: Vec<AxisExplanation>,
    pub pipeline: PipelineTimes,
}

/// Explains `plan` on `problem` (an infeasible plan is explained too; its evaluation says why
/// it does not fit). Errors as [`evaluate`].
pub fn explain(problem: &Problem, plan: &Plan) -> Result<Explanation> {
    explain_with(problem, plan, &Control::default())
}

/// [`explain`] under `control`: the cancel flag and the deadline are checked before it starts,
/// through the evaluation, and between the axes. The work is bounded by the plan's structure
/// (stage runs, capped rank lists), not by its degrees.
pub fn explain_with(problem: &Problem, plan: &Plan, control: &Control) -> Result<Explanation> {
    let started = Instant::now();
    let evaluation = evaluate_with(problem, plan, &SearchSpace::default(), control)?;
    let plan = evaluation.plan.clone();
    let ctx = Ctx::new(problem, &plan, &evaluation);
    let mut axes = Vec::new();
    type AxisFn<'c> = fn(&Ctx<'c>) -> AxisExplanation;
    let present: [(bool, AxisFn); 6] = [
        (ctx.groups.dense_dp.size > 1, Ctx::dp),
        (plan.tp > 1, Ctx::tp),
        (plan.pp > 1, Ctx::pp),
        (plan.ep > 1, Ctx::ep),
        (plan.cp > 1, Ctx::cp),
        (plan.zero > 0 && ctx.groups.dense_dp.size > 1, Ctx::zero),
    ];
    for (on, axis) in present {
        control.check(started)?;
        if on {
            axes.push(axis(&ctx));
        }
    }
    control.check(started)?;
    Ok(Explanation {
        mesh: mesh(problem, &plan),
        pipeline: ctx.pipeline(),
        axes,
        plan,
        evaluation,
    })
}

/// The device mesh of `plan` on `problem`'s cluster.
pub fn mesh(problem: &Problem, plan: &Plan) -> Mesh {
    let block = domain_block(plan.num_gpus(), problem.cluster.nvlink_domain());
    let mut sets: Vec<(String, Vec<Axis>)> = plan
        .order
        .axes()
        .into_iter()
        .filter(|a| a.size(plan) > 1)
        .map(|a| (a.name().to_string(), vec![a]))
        .collect();
    if plan.ep * plan.cp > 1 && plan.dense_dp() * plan.cp > 1 {
        sets.push(("dense_dp".into(), vec![Axis::Cp, Axis::Ep, Axis::Dp]));
    }
    if plan.ep > 1 && plan.dp * plan.cp > 1 {
        sets.push(("expert_dp".into(), vec![Axis::Cp, Axis::Dp]));
    }
    Mesh {
        order: plan.order,
        domain_size: block,
        axes: strides(plan)
            .into_iter()
            .map(|(axis, size, stride)| MeshAxis {
                axis: axis.name().into(),
                size,
                stride,
            })
            .collect(),
        groups: sets
            .into_iter()
            .map(|(name, axes)| {
                let g = group(plan, &axes, block);
                MeshGroup {
                    axis: name,
                    size: g.size,
                    members_per_domain: g.per_domain,
                    domains: g.domains(),
                    crosses_domain: !g.within_domain(),
                    example_ranks: group_ranks(plan, &axes, 0, MAX_LISTED_RANKS)
                        .into_iter()
                        .map(|r| r as u32)
                        .collect(),
                }
            })
            .collect(),
    }
}

/// `nvlink`, `network` or `nvlink+network` for a group.
pub fn fabric_name(g: Group) -> &'static str {
    if g.within_domain() {
        "nvlink"
    } else if g.per_domain <= 1 {
        "network"
    } else {
        "nvlink+network"
    }
}

fn pass_total(p: &Pass) -> f64 {
    p.compute + p.tp + p.cp + p.ep
}

/// Everything the axes share.
struct Ctx<'a> {
    problem: &'a Problem,
    plan: &'a Plan,
    evaluation: &'a Evaluation,
    groups: Groups,
    fabric: Fabric,
    /// The pipeline ranks, as runs of one shape (a handful whatever `pp` is).
    runs: Vec<StageRun>,
    /// Per-micro-batch time of each run's ranks.
    per_run: Vec<LayerTime>,
    /// The stage the step time is built from (largest per-micro-batch time).
    worst: Stage,
    m: u64,
    /// Tokens of one micro-batch on one GPU before TP sharding, `b·s/c`.
    tokens: f64,
    /// Tokens this GPU handles per step, `m·b·s/c`.
    tokens_per_step: f64,
}

impl<'a> Ctx<'a> {
    fn new(problem: &'a Problem, plan: &'a Plan, evaluation: &'a Evaluation) -> Self {
        let groups = Groups::of(plan, problem.cluster.nvlink_domain());
        let runs = stage_runs(&problem.model, plan.pp);
        let tc = TimeContext::new(problem, plan, groups);
        let (dense, moe) = tc.layers();
        let per_run: Vec<LayerTime> = runs
            .iter()
            .map(|r| tc.stage(&r.stage, &dense, &moe))
            .collect();
        // The same pick as the time model's `max_by` over the ranks (the last of equal maxima:
        // the last rank of the last run with the largest time).
        let worst = (0..runs.len())
            .max_by(|&a, &b| per_run[a].total().total_cmp(&per_run[b].total()))
            .map_or(runs[0].stage, |i| runs[i].at(runs[i].last_index()));
        let m = evaluation.micro_batches as u64;
        let tokens = plan.micro_batch as f64 * problem.workload.seq_len as f64 / plan.cp as f64;
        Ctx {
            problem,
            plan,
            evaluation,
            groups,
            fabric: Fabric::of(&problem.cluster),
            runs,
            per_run,
            worst,
            m,
            tokens,
            tokens_per_step: m as f64 * tokens,
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

    /// A collective of `count` calls on `message` bytes, each `wire` bytes sent and `(latency,
    /// bandwidth)` seconds; `scale` multiplies the seconds (routing imbalance).
    #[allow(clippy::too_many_arguments)]
    fn info(
        &self,
        op: &str,
        when: String,
        count: u64,
        message: f64,
        wire: f64,
        (latency, bandwidth): (f64, f64),
        scale: f64,
    ) -> CollectiveInfo {
        let per_step = count as f64 * wire;
        CollectiveInfo {
            op: op.into(),
            when,
            count_per_step: count,
            message_bytes: message,
            bytes_per_token_per_gpu: per_step / self.tokens_per_step,
            bytes_per_step_per_gpu: per_step,
            seconds_per_step: count as f64 * (latency + bandwidth) * scale,
            latency_bound: latency >= bandwidth,
        }
    }

    fn collective(
        &self,
        kind: Collective,
        when: String,
        count: u64,
        bytes: f64,
        g: Group,
    ) -> CollectiveInfo {
        let terms = collective_terms(&self.fabric, kind, bytes, g);
        self.info(
            op_name(kind),
            when,
            count,
            bytes,
            wire_bytes(kind, bytes, g.size),
            terms,
            1.0,
        )
    }

    fn axis(&self, axis: &str, degree: u32, state: String, g: Group) -> AxisExplanation {
        AxisExplanation {
            axis: axis.into(),
            degree,
            state_sharded: state,
            collectives: Vec::new(),
            fabric: fabric_name(g).into(),
            group_size: g.size,
            members_per_domain: g.per_domain,
            domains: g.domains(),
            exposed_s: 0.0,
            overlapped_s: 0.0,
            notes: Vec::new(),
        }
    }

    /// The forward, backward and (with full recompute) replayed-forward passes.
    fn passes(&self) -> Vec<&'static str> {
        let mut out = vec!["forward", "backward"];
        if self.plan.recompute == Recompute::Full {
            out.push("recompute (forward replayed in backward)");
        }
        out
    }

    /// Exposed and hidden seconds from the raw collective time of an axis.
    fn finish(&self, mut a: AxisExplanation, exposed: f64, hidden_base: f64) -> AxisExplanation {
        let raw: f64 = a.collectives.iter().map(|c| c.seconds_per_step).sum();
        a.exposed_s = exposed;
        a.overlapped_s = (raw - hidden_base).max(0.0);
        let bound: Vec<&str> = a
            .collectives
            .iter()
            .filter(|c| c.latency_bound)
            .map(|c| c.op.as_str())
            .collect();
        if !bound.is_empty() {
            let mut ops = bound.clone();
            ops.dedup();
            a.notes.push(format!(
                "latency-bound: each {} is too small for bandwidth to matter (latency term ≥ bandwidth term)",
                ops.join(" / ")
            ));
        }
        a
    }

    fn stage_note(&self) -> Option<String> {
        (self.plan.pp > 1).then(|| {
            format!(
                "counts are for pipeline stage {} ({} layers{}{}), the one the step time is built from",
                self.worst.index,
                self.worst.layers(),
                if self.worst.first { ", input embedding" } else { "" },
                if self.worst.last { ", LM head and loss" } else { "" },
            )
        })
    }

    fn dp(&self) -> AxisExplanation {
        let plan = self.plan;
        let w = &self.problem.workload;
        let g = self.groups.dense_dp;
        let replicas = plan.dense_dp();
        let replicated = match plan.zero {
            0 => "weights, gradients and optimizer states are replicated",
            1 => "weights and gradients are replicated (optimizer states are sharded: see zero)",
            2 => "weights are replicated (gradients and optimizer states are sharded: see zero)",
            _ => "nothing is replicated for long: ZeRO-3 shards weights, gradients and optimizer states (see zero)",
        };
        let state = format!(
            "The batch: each of the {replicas} data-parallel replicas (dp·ep = {}·{}) takes {} of the {} sequences per step ({} micro-batches of {}); {replicated} over the {} ranks of the data-parallel group (dp·ep·cp).",
            plan.dp,
            plan.ep,
            w.global_batch / replicas.max(1),
            w.global_batch,
            self.m,
            plan.micro_batch,
            g.size,
        );
        let mut a = self.axis("dp", plan.dp, state, g);
        if plan.dp == 1 {
            a.notes.push(format!(
                "dp = 1, but the {} ranks of ep·cp hold replicas of the dense weights, so their gradients are still reduced",
                g.size
            ));
        }
        if w.lora {
            a.notes.push("LoRA: the base weights are frozen, so there is no gradient reduction (the adapters are negligible)".into());
            return self.finish(a, 0.0, 0.0);
        }
        if plan.zero > 0 {
            a.notes.push(format!(
                "with ZeRO-{} the gradient reduction is a reduce-scatter: listed and timed under zero",
                plan.zero
            ));
            return self.finish(a, 0.0, 0.0);
        }
        a.collectives = self.reduction(
            Collective::AllReduce,
            "once per step, after the last micro-batch's backward",
            1,
            w.grad_bytes as f64,
            1,
        );
        self.reduction_notes(&mut a);
        let exposed = self.evaluation.time_s.dp;
        self.finish(a, exposed, exposed)
    }

    /// One collective per parameter group (dense over dp·ep·cp, experts over dp·cp) of stage 0,
    /// `bytes_per_param` each, the parameters split into `units` calls.
    fn reduction(
        &self,
        kind: Collective,
        when: &str,
        count: u64,
        bytes_per_param: f64,
        units: u32,
    ) -> Vec<CollectiveInfo> {
        let params = stage_params(self.model(), self.plan, &self.runs[0].stage);
        [
            ("dense parameters", params.dense, self.groups.dense_dp),
            ("expert parameters", params.expert, self.groups.expert_dp),
        ]
        .into_iter()
        .filter(|(_, p, g)| *p > 0.0 && g.size > 1)
        .map(|(label, p, g)| {
            let when = format!("{when}, {label} over {} ranks", g.size);
            self.collective(kind, when, count, p / units as f64 * bytes_per_param, g)
        })
        .collect()
    }

    fn reduction_notes(&self, a: &mut AxisExplanation) {
        let cal = &self.problem.cluster.gpu.calibration;
        a.notes.push(format!(
            "bytes are for pipeline stage 0 (the last to finish its backward); {:.0}% of a reduction can hide behind the last micro-batch's backward (calibration dp_overlap)",
            100.0 * cal.dp_overlap
        ));
        if self.model().is_moe() && self.plan.ep > 1 {
            let e = self.groups.expert_dp;
            a.notes.push(format!(
                "expert parameters are reduced over dp·cp = {} ranks ({}, {} per domain)",
                e.size,
                fabric_name(e),
                e.per_domain
            ));
        }
    }

    fn zero(&self) -> AxisExplanation {
        let plan = self.plan;
        let w = &self.problem.workload;
        let g = self.groups.dense_dp;
        let d = g.size;
        let state = match plan.zero {
            1 => format!("Optimizer states (fp32 master weights and Adam moments) sharded over the {d} data-parallel ranks (Megatron's distributed optimizer); weights and gradients replicated."),
            2 => format!("Optimizer states and gradients sharded over the {d} data-parallel ranks; weights replicated."),
            _ => format!("Weights, gradients and optimizer states all sharded over the {d} data-parallel ranks (FSDP full shard); each layer's weights are gathered just before use and freed after."),
        };
        let mut a = self.axis("zero", plan.zero as u32, state, g);
        if w.lora {
            a.notes.push("LoRA: the base weights are frozen, so nothing is reduced or gathered (the adapters are negligible)".into());
            return self.finish(a, 0.0, 0.0);
        }
        let (gb, wb, m) = (w.grad_bytes as f64, WIRE_BYTES, self.m);
        a.collectives = match plan.zero {
            1 => [
                self.reduction(
                    Collective::ReduceScatter,
                    "once per step, after the last micro-batch's backward (gradients)",
                    1,
                    gb,
                    1,
                ),
                self.reduction(
                    Collective::AllGather,
                    "once per step, after the optimizer step (updated weights)",
                    1,
                    wb,
                    1,
                ),
            ]
            .concat(),
            2 => [
                self.reduction(
                    Collective::ReduceScatter,
                    "every micro-batch, during its backward (gradients)",
                    m,
                    gb,
                    1,
                ),
                self.reduction(
                    Collective::AllGather,
                    "once per step, after the optimizer step (updated weights)",
                    1,
                    wb,
                    1,
                ),
            ]
            .concat(),
            _ => {
                let units = self.runs[0].stage.layers().max(1);
                let layers = units as u64;
                [
                    self.reduction(
                        Collective::AllGather,
                        "per layer per micro-batch, forward (the layer's weights)",
                        m * layers,
                        wb,
                        units,
                    ),
                    self.reduction(
                        Collective::AllGather,
                        "per layer per micro-batch, backward (the weights again)",
                        m * layers,
                        wb,
                        units,
                    ),
                    self.reduction(
                        Collective::ReduceScatter,
                        "per layer per micro-batch, backward (the layer's gradients)",
                        m * layers,
                        gb,
                        units,
                    ),
                ]
                .concat()
            }
        };
        self.reduction_notes(&mut a);
        if plan.zero >= 3 {
            a.notes.push("prefetching hides each layer's gathers behind the previous layer's compute; the first gather and the last reduce-scatter stay exposed".into());
        }
        let exposed = self.evaluation.time_s.dp;
        self.finish(a, exposed, exposed)
    }

    fn tp(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.tp;
        let t = plan.tp;
        let mlp = if model.dense_layers() > 0 {
            format!(
                " and {} of the {} MLP columns",
                model.ffn_hidden / t,
                model.ffn_hidden
            )
        } else {
            String::new()
        };
        let state = format!(
            "Every weight matrix split {t} ways: {} of the {} attention heads{mlp} per GPU{}; activations inside attention and the MLP split too; {}.",
            model.heads / t,
            model.heads,
            model.moe.as_ref().map_or(String::new(), |m| format!(", each routed expert's {} columns split the same way", m.expert_ffn_hidden)),
            if plan.sequence_parallel {
                "with sequence parallelism the rest (norms, residuals) is split along the sequence"
            } else {
                "the rest (norms, residuals, layer inputs) is replicated (no sequence parallelism)"
            },
        );
        let mut a = self.axis("tp", t, state, g);
        let kinds: &[Collective] = if plan.sequence_parallel {
            &[Collective::AllGather, Collective::ReduceScatter]
        } else {
            &[Collective::AllReduce]
        };
        let bytes = self.tokens * model.hidden as f64 * WIRE_BYTES;
        let dense_points = tp_points_per_layer(None) as u64;
        let moe_points = tp_points_per_layer(model.moe.as_ref()) as u64;
        let per_pass = self.worst.dense_layers as u64 * dense_points
            + self.worst.moe_layers as u64 * moe_points;
        for pass in self.passes() {
            for &kind in kinds {
                a.collectives.push(self.collective(
                    kind,
                    format!("per layer per micro-batch, {pass}"),
                    self.m * per_pass,
                    bytes,
                    g,
                ));
            }
        }
        for (when, calls, on) in [
            (
                "per micro-batch, input embedding (forward)",
                1,
                self.worst.first,
            ),
            (
                "per micro-batch, LM head (forward and backward)",
                2,
                self.worst.last,
            ),
        ] {
            if on {
                for &kind in kinds {
                    a.collectives.push(self.collective(
                        kind,
                        when.into(),
                        self.m * calls,
                        bytes,
                        g,
                    ));
                }
            }
        }
        let point = if plan.sequence_parallel {
            "reduce-scatter + all-gather pair"
        } else {
            "all-reduce"
        };
        a.notes.push(match &model.moe {
            Some(m) if self.worst.moe_layers > 0 => format!(
                "one {point} after attention and {} around the experts (top-{} copies of each token gathered over TP) per MoE layer, {} per dense layer, of the micro-batch's hidden states ({} B)",
                m.top_k,
                m.top_k,
                dense_points,
                commas(bytes)
            ),
            _ => format!(
                "one {point} after attention and one after the MLP, each on the micro-batch's hidden states ({} B)",
                commas(bytes)
            ),
        });
        let omega = self.problem.cluster.gpu.calibration.tp_overlap;
        a.notes.push(format!(
            "{:.0}% of the layers' TP time hides behind the neighbouring GEMMs (calibration tp_overlap); the embedding and LM-head ones are exposed",
            100.0 * omega
        ));
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.tp;
        self.finish(a, exposed, exposed)
    }

    fn cp(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.cp;
        let c = plan.cp;
        let seq = self.problem.workload.seq_len;
        let state = format!(
            "The sequence: each GPU holds {} of the {seq} tokens of every sequence (2·{c} chunks, paired for the causal mask), so all activations are split {c} ways; weights are replicated (the CP ranks join the gradient reduction).",
            seq / c
        );
        let mut a = self.axis("cp", c, state, g);
        let kv = self.tokens * cp_kv_bytes_per_token(model, plan.tp);
        let terms = p2p_terms(&self.fabric, kv, g.within_domain());
        let layers = self.worst.layers() as u64;
        let steps = (c - 1) as u64;
        for pass in self.passes() {
            // Backward sends the K/V blocks again and their gradients.
            let per_layer = if pass == "backward" { 2 * steps } else { steps };
            let what = if pass == "backward" {
                "K/V blocks and their gradients"
            } else {
                "K/V blocks"
            };
            a.collectives.push(self.info(
                "send-recv",
                format!("per layer per micro-batch, {pass} ({what} around the ring)"),
                self.m * layers * per_layer,
                kv,
                kv,
                terms,
                1.0,
            ));
        }
        a.notes.push(format!(
            "ring attention: {} ring step{} per layer, each passing this GPU's K/V block ({} B) to the next rank while attending to the one received; only the part of a transfer longer than its attention block is exposed",
            c - 1,
            if c == 2 { "" } else { "s" },
            commas(kv)
        ));
        if !g.within_domain() {
            a.notes.push(
                "the ring leaves the scale-up domain, so each step is costed at network speed"
                    .into(),
            );
        }
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.cp;
        self.finish(a, exposed, exposed)
    }

    fn ep(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.ep;
        let e = plan.ep;
        let Some(moe) = model.moe.as_ref() else {
            // Structurally invalid (ep > 1 on a dense model): nothing is exchanged.
            let state =
                format!("Nothing: ep = {e} on a dense model (expert parallelism needs experts).");
            return self.axis("ep", e, state, g);
        };
        let state = format!(
            "Routed experts: {} of the {} experts per GPU (each also split {} ways by TP); every token is sent to its top-{} experts' GPUs and back. Attention and dense layers are not split by EP: for them the EP ranks are extra data parallelism.",
            moe.num_experts / e,
            moe.num_experts,
            plan.tp,
            moe.top_k
        );
        let mut a = self.axis("ep", e, state, g);
        let h_bytes = model.hidden as f64 * WIRE_BYTES;
        let routed = self.tokens / self.sp_div();
        let message = routed * moe.top_k as f64 * h_bytes;
        let wire = wire_bytes(Collective::AllToAll, message, e);
        let terms = dispatch_terms(&self.fabric, routed, h_bytes, moe.top_k, g);
        let imbalance = self.problem.cluster.gpu.calibration.moe_imbalance;
        let layers = self.worst.moe_layers as u64;
        if layers > 0 {
            for pass in self.passes() {
                let what = if pass == "backward" {
                    "gradients"
                } else {
                    "tokens"
                };
                a.collectives.push(self.info(
                    "all-to-all",
                    format!("per MoE layer per micro-batch, {pass} (dispatch + combine of {what})"),
                    2 * self.m * layers,
                    message,
                    wire,
                    terms,
                    imbalance,
                ));
            }
        }
        let (total, off_rank) = ep_bytes_per_token_per_layer(model.hidden, moe.top_k, e);
        a.notes.push(format!(
            "per routed token per MoE layer, forward: {} B dispatched and combined ({} copies of its {} B hidden state each way), {} B of it leaving the GPU under uniform routing ((e−1)/e = {}/{e}); backward sends as much again",
            commas(total),
            moe.top_k,
            commas(h_bytes),
            commas(off_rank),
            e - 1
        ));
        if plan.sequence_parallel {
            a.notes.push(format!(
                "with sequence parallelism each TP rank routes 1/{} of the micro-batch's tokens",
                plan.tp
            ));
        }
        if g.domains() > 1 {
            a.notes.push("across domains each token crosses the network once per remote domain it is routed to and fans out over NVLink there (node-deduplicated dispatch)".into());
        }
        a.notes.push(format!(
            "seconds include the routing imbalance λ = {imbalance} of the busiest rank (calibration moe_imbalance)"
        ));
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.ep;
        self.finish(a, exposed, exposed)
    }

    fn pp(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.pp;
        let state = format!(
            "The {} layers split into {} stages ({} layers{}); each GPU holds only its stage's weights, gradients and optimizer states, and the activations of the micro-batches in flight.",
            model.layers,
            plan.pp,
            layer_counts_text(&self.runs, plan.pp),
            if plan.vpp > 1 {
                format!(", as {} interleaved chunks per GPU", plan.vpp)
            } else {
                String::new()
            }
        );
        let mut a = self.axis("pp", plan.pp, state, g);
        let bytes = self.tokens * model.hidden as f64 * WIRE_BYTES / self.sp_div();
        let terms = p2p_terms(&self.fabric, bytes, g.within_domain());
        let count = self.m * plan.vpp as u64;
        for what in [
            "forward (activations to the next stage)",
            "backward (gradients to the previous stage)",
        ] {
            a.collectives.push(self.info(
                "send-recv",
                format!("per micro-batch, {what}"),
                count,
                bytes,
                bytes,
                terms,
                1.0,
            ));
        }
        let t = &self.evaluation.time_s;
        let step = self.evaluation.step_time_s;
        a.notes.push(format!(
            "{} schedule: pipeline bubble {:.4} s ({:.1}% of the step) with {} micro-batches; the fill and drain transfers add {:.4} s, the rest overlap with compute",
            plan.schedule().name(),
            t.bubble,
            if step > 0.0 { 100.0 * t.bubble / step } else { 0.0 },
            self.m,
            t.pp_p2p
        ));
        if plan.sequence_parallel {
            a.notes.push(format!(
                "with sequence parallelism each TP rank sends 1/{} of the activations",
                plan.tp
            ));
        }
        self.finish(a, t.pp_p2p + t.bubble, t.pp_p2p)
    }

    fn pipeline(&self) -> PipelineTimes {
        PipelineTimes {
            schedule: self.plan.schedule(),
            vpp: self.plan.vpp,
            micro_batches: self.m as u32,
            stages: self
                .runs
                .iter()
                .zip(&self.per_run)
                .flat_map(|(r, t)| {
                    r.ranks().map(move |s| StageTime {
                        index: s.index,
                        layers: s.layers(),
                        fwd_s: pass_total(&t.fwd),
                        bwd_s: pass_total(&t.bwd),
                        wgrad_s: t.wgrad,
                    })
                })
                .take(MAX_LISTED_STAGES)
                .collect(),
        }
    }
}

/// The layers of each pipeline rank, `7 / 8 / 8 / 7`; past [`MAX_LISTED_RANKS`] ranks a run of
/// equal ranks is written once with its count, `7 / 8 (×126) / 7`.
fn layer_counts_text(runs: &[StageRun], pp: u32) -> String {
    let parts: Vec<String> = if pp as usize <= MAX_LISTED_RANKS {
        runs.iter()
            .flat_map(|r| r.ranks())
            .map(|s| s.layers().to_string())
            .collect()
    } else {
        runs.iter()
            .map(|r| match r.count {
                1 => r.stage.layers().to_string(),
                n => format!("{} (×{n})", r.stage.layers()),
            })
            .collect()
    };
    parts.join(" / ")
}

/// `x` rounded to an integer with thousands separators (`57,344`).
fn commas(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 && digits != "0" {
        out.insert(0, '-');
    }
    out
}

fn op_name(kind: Collective) -> &'static str {
    match kind {
        Collective::AllReduce => "all-reduce",
        Collective::AllGather => "all-gather",
        Collective::ReduceScatter => "reduce-scatter",
        Collective::AllToAll => "all-to-all",
    }
}

/// Tensor-parallel all-reduce traffic of batch-1 decoding (COSTMODEL §7(a)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeTraffic {
    pub model: String,
    pub gpu: String,
    pub tp: u32,
    /// Two per layer: after the attention output and after the MLP.
    pub all_reduces_per_token: u64,
    /// One token's hidden state, bytes.
    pub message_bytes: f64,
    /// Ring all-reduce bytes each GPU sends per generated token.
    pub bytes_per_token_per_gpu: f64,
    pub tokens_per_s: f64,
    /// `bytes_per_token_per_gpu × tokens_per_s`, GB/s (decimal), per direction.
    pub gb_per_s_per_gpu: f64,
    /// The GPU's scale-up link rate per direction, GB/s.
    pub link_gb_per_s: f64,
    /// `gb_per_s_per_gpu / link_gb_per_s`.
    pub fraction_of_link: f64,
    /// Latency terms of a token's all-reduces, seconds.
    pub latency_s_per_token: f64,
    /// Bandwidth terms of a token's all-reduces, seconds.
    pub bandwidth_s_per_token: f64,
    /// Latency term ≥ bandwidth term.
    pub latency_bound: bool,
    pub fabric: String,
}

/// The TP all-reduce traffic of decoding one token at a time with `tp` GPUs on `cluster`'s
/// GPUs at `tokens_per_s` (§7(a)): bytes per token from `traffic`, the latency and bandwidth
/// terms from the fabric model.
pub fn decode_traffic(
    model: &Model,
    cluster: &Cluster,
    tp: u32,
    tokens_per_s: f64,
) -> Result<DecodeTraffic> {
    model.validate()?;
    cluster.validate()?;
    crate::limits::check("tp", tp)?;
    if !(tokens_per_s.is_finite() && tokens_per_s > 0.0) {
        return Err(Error::invalid(
            "tokens_per_s",
            tokens_per_s,
            "a finite number > 0",
        ));
    }
    let plan = Plan {
        dp: 1,
        tp,
        pp: 1,
        ep: 1,
        cp: 1,
        vpp: 1,
        micro_batch: 1,
        zero: 0,
        recompute: Recompute::None,
        sequence_parallel: false,
        schedule: None,
        order: RankOrder::DEFAULT,
    };
    let g = Groups::of(&plan, cluster.nvlink_domain()).tp;
    let fabric = Fabric::of(cluster);
    let message = model.hidden as f64 * WIRE_BYTES;
    let calls = 2 * model.layers as u64;
    let (lat, bw) = collective_terms(&fabric, Collective::AllReduce, message, g);
    let bytes = tp_decode_allreduce_bytes_per_token(model, tp);
    let gb_per_s = bytes * tokens_per_s / 1e9;
    let link = cluster.gpu.scaleup_bandwidth_gbps;
    Ok(DecodeTraffic {
        model: model.name.clone(),
        gpu: cluster.gpu.name.clone(),
        tp,
        all_reduces_per_token: calls,
        message_bytes: message,
        bytes_per_token_per_gpu: bytes,
        tokens_per_s,
        gb_per_s_per_gpu: gb_per_s,
        link_gb_per_s: link,
        fraction_of_link: gb_per_s / link,
        latency_s_per_token: calls as f64 * lat,
        bandwidth_s_per_token: calls as f64 * bw,
        latency_bound: lat >= bw,
        fabric: fabric_name(g).into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Activation, Moe, Norm};
    use crate::presets;
    use crate::workload::Workload;

    fn cluster(gpu: &str, n: u32) -> Cluster {
        Cluster {
            gpu: presets::gpu(gpu).unwrap(),
            num_gpus: n,
            gpus_per_node: None,
            nvlink_domain: None,
        }
    }

    fn problem(model: Model, gpu: &str, n: u32, global_batch: u32, seq_len: u32) -> Problem {
        Problem::new(model, cluster(gpu, n), Workload::new(global_batch, seq_len)).unwrap()
    }

    fn plan(text: &str) -> Plan {
        // "dp=2,tp=4,..." → a plan through serde, the way every front end builds one.
        let mut map = serde_json::Map::new();
        for kv in text.split(',') {
            let (k, v) = kv.split_once('=').unwrap();
            let value = v
                .parse::<u64>()
                .map(serde_json::Value::from)
                .or_else(|_| v.parse::<bool>().map(serde_json::Value::from))
                .unwrap_or_else(|_| serde_json::Value::from(v));
            map.insert(k.to_string(), value);
        }
        serde_json::from_value(serde_json::Value::Object(map)).unwrap()
    }

    /// A 400B-class MoE with the §7(b) shape: h = 8192, 64 routed experts, top-2.
    fn moe_400b() -> Model {
        Model {
            name: "moe-400b".into(),
            layers: 40,
            hidden: 8192,
            heads: 64,
            kv_heads: 8,
            head_dim: None,
            ffn_hidden: 28672,
            vocab: 128256,
            activation: Activation::Swiglu,
            norm: Norm::Rmsnorm,
            tied_embeddings: false,
            moe: Some(Moe {
                num_experts: 64,
                top_k: 2,
                expert_ffn_hidden: 6144,
                shared_experts: 0,
                shared_expert_ffn_hidden: None,
                first_dense_layers: 0,
            }),
            mla: None,
        }
    }

    fn axis<'e>(x: &'e Explanation, name: &str) -> &'e AxisExplanation {
        x.axes
            .iter()
            .find(|a| a.axis == name)
            .unwrap_or_else(|| panic!("no {name} axis"))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
    }

    #[test]
    fn commas_group_thousands() {
        assert_eq!(commas(57_344.0), "57,344");
        assert_eq!(commas(3_932_160.0), "3,932,160");
        assert_eq!(commas(999.4), "999");
        assert_eq!(commas(-1234.0), "-1,234");
    }

    #[test]
    fn costmodel_7a_decode_all_reduce_traffic() {
        let m = presets::model("llama3-70b").unwrap();
        let d = decode_traffic(&m, &cluster("h100-sxm", 4), 4, 50.0).unwrap();
        assert_eq!(d.all_reduces_per_token, 160);
        assert_eq!(d.message_bytes, 16_384.0);
        assert_eq!(d.bytes_per_token_per_gpu, 3_932_160.0);
        assert!(close(d.gb_per_s_per_gpu, 0.196_608));
        assert_eq!(d.link_gb_per_s, 450.0);
        assert!(close(d.fraction_of_link, 0.196_608 / 450.0));
        assert!(d.latency_bound && d.latency_s_per_token > d.bandwidth_s_per_token);
        assert_eq!(d.fabric, "nvlink");
        assert!(decode_traffic(&m, &cluster("h100-sxm", 4), 0, 50.0).is_err());
        assert!(decode_traffic(&m, &cluster("h100-sxm", 4), 4, f64::NAN).is_err());
    }

    #[test]
    fn costmodel_7b_all_to_all_bytes_per_token_per_moe_layer() {
        let p = problem(moe_400b(), "h100-sxm", 64, 64, 4096);
        let x = explain(&p, &plan("dp=8,tp=1,pp=1,ep=8,zero=1")).unwrap();
        let ep = axis(&x, "ep");
        let fwd = &ep.collectives[0];
        assert!(fwd.when.contains("forward"), "{}", fwd.when);
        assert_eq!(fwd.op, "all-to-all");
        // Dispatch + combine per token per MoE layer, the share leaving the rank: 57,344 B.
        assert_eq!(fwd.bytes_per_token_per_gpu / 40.0, 57_344.0);
        let bwd = &ep.collectives[1];
        assert_eq!(bwd.bytes_per_token_per_gpu / 40.0, 57_344.0);
        assert!(
            ep.notes[0].contains("65,536 B") && ep.notes[0].contains("57,344 B"),
            "{}",
            ep.notes[0]
        );
        assert_eq!(
            (ep.group_size, ep.members_per_domain, ep.fabric.as_str()),
            (8, 8, "nvlink")
        );
    }

    /// Plans covering every axis, ZeRO stage, SP, recompute and schedule.
    fn cases() -> Vec<(Problem, Plan)> {
        let llama70 = || presets::model("llama3-70b").unwrap();
        let mixtral = || presets::model("mixtral-8x7b").unwrap();
        vec![
            (
                problem(llama70(), "h100-sxm", 64, 128, 8192),
                plan("dp=2,tp=4,pp=4,cp=2,vpp=5,zero=1,sequence_parallel=true"),
            ),
            (
                problem(llama70(), "h100-sxm", 64, 128, 8192),
                plan("dp=4,tp=8,pp=2,zero=0,recompute=full"),
            ),
            (
                problem(llama70(), "h100-sxm", 64, 128, 8192),
                plan("dp=8,tp=8,pp=1,zero=3,micro_batch=2"),
            ),
            (
                problem(llama70(), "h100-sxm", 64, 128, 8192),
                plan("dp=4,tp=4,pp=4,zero=2,schedule=zb-h1,recompute=selective"),
            ),
            (
                problem(mixtral(), "h100-sxm", 64, 128, 4096),
                plan("dp=2,tp=2,pp=2,ep=8,zero=1,sequence_parallel=true"),
            ),
            (
                problem(mixtral(), "h100-sxm", 64, 128, 4096),
                plan("dp=1,tp=1,pp=4,ep=8,cp=2,zero=0,recompute=full"),
            ),
            (
                problem(moe_400b(), "gb200-nvl72", 128, 256, 4096),
                plan("dp=2,tp=4,pp=2,ep=8,zero=3"),
            ),
        ]
    }

    #[test]
    fn exposed_times_add_up_to_the_step() {
        for (p, pl) in cases() {
            let x = explain(&p, &pl).unwrap();
            let t = &x.evaluation.time_s;
            let sum: f64 =
                x.axes.iter().map(|a| a.exposed_s).sum::<f64>() + t.compute + t.optimizer;
            assert!(
                close(sum, x.evaluation.step_time_s),
                "{pl}: {sum} vs {}",
                x.evaluation.step_time_s
            );
            for a in &x.axes {
                assert!(
                    a.exposed_s >= 0.0 && a.overlapped_s >= 0.0,
                    "{pl} {}",
                    a.axis
                );
                assert!(!a.state_sharded.is_empty());
            }
        }
    }

    #[test]
    fn tp_and_ep_seconds_are_the_time_models_before_overlap() {
        for (p, pl) in cases() {
            let x = explain(&p, &pl).unwrap();
            let cal = &p.cluster.gpu.calibration;
            if x.plan.tp > 1 {
                let tp = axis(&x, "tp");
                let (layers, ends): (Vec<_>, Vec<_>) = tp
                    .collectives
                    .iter()
                    .partition(|c| c.when.starts_with("per layer"));
                let layer_s: f64 = layers.iter().map(|c| c.seconds_per_step).sum();
                let end_s: f64 = ends.iter().map(|c| c.seconds_per_step).sum();
                let want = (1.0 - cal.tp_overlap) * layer_s + end_s;
                assert!(
                    close(want, x.evaluation.time_s.tp),
                    "{pl}: {want} vs {}",
                    x.evaluation.time_s.tp
                );
            }
            if x.plan.ep > 1 {
                let ep = axis(&x, "ep");
                let raw: f64 = ep.collectives.iter().map(|c| c.seconds_per_step).sum();
                assert!(
                    close((1.0 - cal.ep_overlap) * raw, x.evaluation.time_s.ep),
                    "{pl}"
                );
            }
            if x.plan.pp > 1 {
                let pp = axis(&x, "pp");
                let hop =
                    pp.collectives[0].seconds_per_step / pp.collectives[0].count_per_step as f64;
                let want = 2.0 * (x.plan.pp - 1) as f64 * x.plan.vpp as f64 * hop;
                assert!(close(want, x.evaluation.time_s.pp_p2p), "{pl}");
                let t = &x.evaluation.time_s;
                assert!(close(pp.exposed_s, t.bubble + t.pp_p2p));
            }
            if x.plan.cp > 1 {
                let cp = axis(&x, "cp");
                let raw: f64 = cp.collectives.iter().map(|c| c.seconds_per_step).sum();
                assert!(x.evaluation.time_s.cp <= raw * (1.0 + 1e-12), "{pl}");
            }
        }
    }

    #[test]
    fn dp_reduction_uses_the_stage_parameters_and_zero_takes_it_over() {
        let p = problem(
            presets::model("llama3-70b").unwrap(),
            "h100-sxm",
            64,
            128,
            8192,
        );
        let x = explain(&p, &plan("dp=4,tp=8,pp=2,zero=0")).unwrap();
        let dp = axis(&x, "dp");
        assert!(x.axes.iter().all(|a| a.axis != "zero"));
        let stage0 = stage_runs(&p.model, 2)[0].stage;
        let params = stage_params(&p.model, &x.plan, &stage0);
        let ar = &dp.collectives[0];
        assert_eq!(ar.op, "all-reduce");
        assert_eq!(ar.count_per_step, 1);
        assert_eq!(ar.message_bytes, params.dense * 4.0);
        assert!(close(
            ar.bytes_per_step_per_gpu,
            2.0 * 3.0 / 4.0 * params.dense * 4.0
        ));
        // dp = 4 over the 8-GPU nodes with TP = 8 inside: one member per node.
        assert_eq!(
            (dp.group_size, dp.members_per_domain, dp.fabric.as_str()),
            (4, 1, "network")
        );
        assert!(close(dp.exposed_s, x.evaluation.time_s.dp));

        for zero in 1..=3u8 {
            let pl = Plan {
                zero,
                ..x.plan.clone()
            };
            let z = explain(&p, &pl).unwrap();
            assert!(axis(&z, "dp").collectives.is_empty());
            let za = axis(&z, "zero");
            assert_eq!(za.degree, zero as u32);
            assert!(close(za.exposed_s, z.evaluation.time_s.dp));
            let ops: Vec<&str> = za.collectives.iter().map(|c| c.op.as_str()).collect();
            assert!(
                ops.contains(&"reduce-scatter") && ops.contains(&"all-gather"),
                "{ops:?}"
            );
        }
        // ZeRO-3 gathers every layer twice per micro-batch.
        let z3 = explain(
            &p,
            &Plan {
                zero: 3,
                ..x.plan.clone()
            },
        )
        .unwrap();
        let m = z3.evaluation.micro_batches as u64;
        assert_eq!(axis(&z3, "zero").collectives[0].count_per_step, m * 40);
    }

    #[test]
    fn tp_decode_style_messages_are_latency_bound_and_big_ones_are_not() {
        let p = problem(
            presets::model("llama2-7b").unwrap(),
            "a100-sxm-40g",
            8,
            8,
            4096,
        );
        let x = explain(&p, &plan("dp=1,tp=8,pp=1")).unwrap();
        let tp = axis(&x, "tp");
        assert_eq!(tp.fabric, "nvlink");
        // 4096 tokens × 4096 × 2 B = 33.5 MB per all-reduce: bandwidth-bound (§7(c)).
        assert_eq!(tp.collectives[0].message_bytes, 4096.0 * 4096.0 * 2.0);
        assert!(!tp.collectives[0].latency_bound);
        // 4 all-reduces per layer per sequence (2 forward, 2 backward), 32 layers, 8 sequences.
        let count: u64 = tp
            .collectives
            .iter()
            .filter(|c| c.when.starts_with("per layer"))
            .map(|c| c.count_per_step)
            .sum();
        assert_eq!(count, 4 * 32 * 8);
    }

    #[test]
    fn the_mesh_follows_the_order() {
        let p = problem(
            presets::model("llama3-8b").unwrap(),
            "h100-sxm",
            16,
            64,
            4096,
        );
        let x = explain(&p, &plan("dp=8,tp=2,pp=1")).unwrap();
        assert_eq!(x.mesh.order, RankOrder::DEFAULT);
        assert_eq!(x.mesh.domain_size, 8);
        let names: Vec<(&str, u32, u64)> = x
            .mesh
            .axes
            .iter()
            .map(|a| (a.axis.as_str(), a.size, a.stride))
            .collect();
        assert_eq!(
            names,
            vec![
                ("tp", 2, 1),
                ("cp", 1, 2),
                ("ep", 1, 2),
                ("dp", 8, 2),
                ("pp", 1, 16)
            ]
        );
        let tp = &x.mesh.groups[0];
        assert_eq!(
            (
                tp.axis.as_str(),
                tp.crosses_domain,
                tp.example_ranks.clone()
            ),
            ("tp", false, vec![0, 1])
        );
        let dp = &x.mesh.groups[1];
        assert_eq!(dp.example_ranks, vec![0, 2, 4, 6, 8, 10, 12, 14]);
        assert!(dp.crosses_domain && dp.members_per_domain == 4 && dp.domains == 2);
        assert_eq!(axis(&x, "dp").fabric, "nvlink+network");

        let y = explain(&p, &plan("dp=8,tp=2,pp=1,order=dp-tp-cp-ep-pp")).unwrap();
        assert_eq!(y.plan.order.to_string(), "dp-tp-cp-ep-pp");
        assert_eq!(axis(&y, "tp").fabric, "network");
        assert_eq!(axis(&y, "dp").fabric, "nvlink");
        assert_eq!(y.mesh.groups[0].axis, "dp");
        assert_eq!(y.mesh.groups[0].example_ranks, (0..8).collect::<Vec<u32>>());
    }

    #[test]
    fn pipeline_times_are_the_stage_times() {
        let p = problem(
            presets::model("llama3-70b").unwrap(),
            "h100-sxm",
            64,
            128,
            8192,
        );
        let x = explain(&p, &plan("dp=2,tp=8,pp=4")).unwrap();
        let pt = &x.pipeline;
        assert_eq!(
            (pt.stages.len(), pt.vpp, pt.micro_batches),
            (4, 1, x.evaluation.micro_batches)
        );
        assert_eq!(pt.schedule, Schedule::OneFOneB);
        // 1F1B: bubble = (sum over stages − the slowest) of fwd + bwd (§4).
        let totals: Vec<f64> = pt.stages.iter().map(|s| s.fwd_s + s.bwd_s).collect();
        let worst = totals.iter().cloned().fold(0.0, f64::max);
        let bubble = totals.iter().sum::<f64>() - worst;
        assert!(close(bubble, x.evaluation.time_s.bubble));
        assert!(pt
            .stages
            .iter()
            .all(|s| s.wgrad_s > 0.0 && s.wgrad_s < s.bwd_s));
    }

    #[test]
    fn only_present_axes_are_explained_and_infeasible_plans_still_are() {
        let p = problem(
            presets::model("llama2-7b").unwrap(),
            "a100-sxm-40g",
            8,
            8,
            4096,
        );
        let x = explain(&p, &plan("dp=8,tp=1,pp=1,zero=0,micro_batch=1")).unwrap();
        let names: Vec<&str> = x.axes.iter().map(|a| a.axis.as_str()).collect();
        assert_eq!(names, vec!["dp"]);
        let y = explain(&p, &plan("dp=1,tp=1,pp=8,micro_batch=8")).unwrap();
        let names: Vec<&str> = y.axes.iter().map(|a| a.axis.as_str()).collect();
        assert_eq!(names, vec!["pp"]);
        assert!(explain(&p, &plan("dp=4,tp=1,pp=1")).is_err());
    }
}

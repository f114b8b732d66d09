//! Explains one plan axis by axis (DESIGN "people learning the field"; docs/costmodel.md §3, §7): for
//! DP, TP, PP, EP, CP and ZeRO, what state is sharded, which collectives run (how often, how
//! big, bytes per token and per step per GPU), which fabric carries them (the rank layout of
//! §3.3) and how much of their time the step exposes.
//!
//! Nothing here is a second cost model. Bytes are the time model's messages (`traffic`),
//! seconds are `comm::Fabric` on the groups of `layout`, per-micro-batch stage times come from
//! `time::TimeContext`, and exposed seconds are the evaluation's own time breakdown, so the axes'
//! `exposed_s` plus compute and the optimizer step add up to the step time.
//!
//! One module per axis (`dp` with ZeRO, `tp`, `cp`, `ep`, `pp`), each an `impl` of the shared
//! context here.
//!
//! Conventions: counts and bytes are per GPU per optimizer step on the critical pipeline stage
//! (the one the step time is built from; stage 0 for the data-parallel reduction, which finishes
//! last). "Per token" divides by the tokens whose activations this GPU handles in a step,
//! `m·b·s/c`. A collective's wire bytes are what each rank sends (`2(P−1)/P` of the buffer for
//! an all-reduce, `(P−1)/P` for the others, the whole message for a send).

mod cp;
mod dp;
mod ep;
mod offload;
mod pp;
mod recompute;
pub use offload::OffloadCost;
pub use recompute::ModuleCost;
mod tp;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::comm::{Collective, CollectiveCost, CollectiveModel, Fabric};
use crate::error::{Error, Result};
use crate::evaluate::evaluate_with;
use crate::hardware::Cluster;
use crate::layer::LayerOps;
use crate::layout::{domain_block, group, group_ranks, strides, Group, Groups};
use crate::limits::{MAX_LISTED_RANKS, MAX_LISTED_STAGES};
use crate::memory::stage_params_of;
use crate::mesh::{group_axes, ExpertDim, ExpertMesh, GroupRole};
use crate::model::Model;
use crate::plan::{Axis, Dispatcher, Plan, RankOrder, Recompute, Schedule};
use crate::report::Evaluation;
use crate::space::SearchSpace;
use crate::stack::Stack;
use crate::stages::{plan_stage_runs, Stage, StageRun};
use crate::time::{DpCollective, DpPhase, LayerTime, ParamGroup, Pass, TimeContext};
use crate::traffic::{
    ep_bytes_per_token_per_layer, tp_decode_allreduce_bytes_per_token, wire_bytes, WIRE_BYTES,
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
    /// The latency share of `seconds_per_step`: what the calls pay before the first byte
    /// arrives (NCCL's base and per-step latencies of the algorithm chosen).
    pub latency_seconds_per_step: f64,
    /// The algorithm (and NCCL protocol) the collective model chose for one call, e.g.
    /// `ring/Simple`, `tree/LL128`, `nvls`, `nvls-tree`, `pat`, `pairwise`, `point-to-point`.
    pub algorithm: String,
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
    /// A folded plan's expert mesh over the same ranks, innermost first: the TP axis is the
    /// expert TP, the DP axis the expert DP (empty unless folded).
    #[serde(default)]
    pub expert_axes: Vec<MeshAxis>,
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
    /// Megatron-Core's recompute modules of the plan, each with what it saves and replays on the
    /// worst rank (absent without modules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recompute_modules: Vec<recompute::ModuleCost>,
    /// The plan's activation offloading on the worst rank: what it saves and what its copies
    /// cost (absent without offloading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<offload::OffloadCost>,
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
        (plan.tp > 1 || ctx.groups.etp.size > 1, Ctx::tp),
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
        recompute_modules: ctx.recompute_modules(),
        offload: ctx.offload(),
        axes,
        plan,
        evaluation,
    })
}

/// The device mesh of `plan` on `problem`'s cluster; a folded plan's expert mesh beside it,
/// with the expert groups placed on it.
pub fn mesh(problem: &Problem, plan: &Plan) -> Mesh {
    let block = domain_block(plan.num_gpus(), problem.cluster.nvlink_domain());
    let device_mesh = plan.mesh();
    let expert = plan.expert_mesh();
    let mut sets: Vec<(String, &crate::mesh::Mesh, Vec<Axis>)> = plan
        .order
        .axes()
        .into_iter()
        .filter(|&a| device_mesh.size(a) > 1)
        .map(|a| (a.name().to_string(), &device_mesh, vec![a]))
        .collect();
    if plan.ep * plan.cp > 1 && plan.dense_dp() * plan.cp > 1 && !plan.folded() {
        sets.push((
            "dense_dp".into(),
            &device_mesh,
            group_axes(GroupRole::DenseDp).to_vec(),
        ));
    }
    if plan.folded() {
        for (name, dim) in [
            ("ep", ExpertDim::Ep),
            ("etp", ExpertDim::Etp),
            ("expert_dp", ExpertDim::Edp),
        ] {
            if expert.size(dim) > 1 {
                sets.push((name.into(), expert.mesh(), ExpertMesh::spans(dim).to_vec()));
            }
        }
    } else if expert.size(ExpertDim::Ep) > 1 && expert.size(ExpertDim::Edp) > 1 {
        sets.push((
            "expert_dp".into(),
            expert.mesh(),
            ExpertMesh::spans(ExpertDim::Edp).to_vec(),
        ));
    }
    let axes_of = |m: &crate::mesh::Mesh| -> Vec<MeshAxis> {
        strides(m)
            .into_iter()
            .map(|s| MeshAxis {
                axis: s.axis.name().into(),
                size: s.size,
                stride: s.stride,
            })
            .collect()
    };
    Mesh {
        order: plan.order,
        domain_size: block,
        axes: axes_of(&device_mesh),
        expert_axes: if plan.folded() {
            axes_of(expert.mesh())
        } else {
            Vec::new()
        },
        groups: sets
            .into_iter()
            .map(|(name, on, axes)| {
                let g = group(on, &axes, block);
                MeshGroup {
                    axis: name,
                    size: g.size,
                    members_per_domain: g.per_domain,
                    domains: g.domains(),
                    crosses_domain: !g.within_domain(),
                    example_ranks: group_ranks(on, &axes, 0, MAX_LISTED_RANKS)
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
    /// The operations of one layer of each kind, as the time model sums them.
    ops: Vec<LayerOps>,
    /// The stage the step time is built from (largest per-micro-batch time).
    worst: Stage,
    m: u64,
    /// Stage 0's DP/ZeRO collectives at the plan's ZeRO stage, the time model's inventory.
    dp_inventory: Vec<DpCollective>,
    /// ω_TP and ω_DP as the time model applies them (GPU override, else the stack's).
    tp_overlap: f64,
    dp_overlap: f64,
    /// The stack the plan is timed under (overlap flags, bucket sizes).
    stack: &'static Stack,
    /// Parameters per gradient bucket of the dense DP group (workload's, else the stack's).
    bucket_params: f64,
    /// Tokens of one micro-batch on one GPU before TP sharding, `b·s/c`.
    tokens: f64,
    /// Tokens this GPU handles per step, `m·b·s/c`.
    tokens_per_step: f64,
}

impl<'a> Ctx<'a> {
    fn new(problem: &'a Problem, plan: &'a Plan, evaluation: &'a Evaluation) -> Self {
        let groups = Groups::of(plan, problem.cluster.nvlink_domain());
        let runs = plan_stage_runs(&problem.model, plan, problem.workload.seq_len);
        let tc = TimeContext::new(problem, plan, groups);
        let layers = tc.layers();
        let per_run: Vec<LayerTime> = runs.iter().map(|r| tc.stage(&r.stage, &layers)).collect();
        let ops = (0..problem.model.layer_kinds().len())
            .map(|k| tc.layer_ops(k))
            .collect();
        // The same pick as the time model's `max_by` over the ranks (the last of equal maxima:
        // the last rank of the last run with the largest time).
        let worst = (0..runs.len())
            .max_by(|&a, &b| per_run[a].total().total_cmp(&per_run[b].total()))
            .map_or(runs[0].stage, |i| runs[i].at(runs[i].last_index()));
        let m = evaluation.micro_batches as u64;
        let stage0 = &runs[0].stage;
        let dp_inventory = tc.dp_collectives(
            plan.zero,
            &stage_params_of(problem, plan, stage0),
            stage0.layers(),
        );
        let tokens = plan.micro_batch as f64 * problem.workload.seq_len as f64 / plan.cp as f64;
        Ctx {
            problem,
            plan,
            evaluation,
            groups,
            fabric: Fabric::of(&problem.cluster),
            runs,
            per_run,
            ops,
            worst,
            m,
            dp_inventory,
            tp_overlap: tc.tp_overlap(),
            dp_overlap: tc.dp_overlap(),
            stack: tc.stack(),
            bucket_params: tc.bucket_params(groups.dense_dp),
            tokens,
            tokens_per_step: m as f64 * tokens,
        }
    }

    fn model(&self) -> &Model {
        &self.problem.model
    }

    /// Layers of the worst stage whose operations include an MoE dispatch.
    fn worst_moe_layers(&self) -> u64 {
        self.worst
            .kinds
            .iter()
            .filter(|&(k, _)| self.ops.get(k).is_some_and(|o| o.comm.dispatch.is_some()))
            .map(|(_, n)| n as u64)
            .sum()
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
        cost: CollectiveCost,
        scale: f64,
    ) -> CollectiveInfo {
        let per_step = count as f64 * wire;
        let (latency, bandwidth) = (cost.latency_s, cost.bandwidth_s);
        CollectiveInfo {
            op: op.into(),
            when,
            count_per_step: count,
            message_bytes: message,
            bytes_per_token_per_gpu: per_step / self.tokens_per_step,
            bytes_per_step_per_gpu: per_step,
            seconds_per_step: count as f64 * (latency + bandwidth) * scale,
            latency_seconds_per_step: count as f64 * latency * scale,
            algorithm: cost.label(),
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
        let terms = self.fabric.collective(kind, bytes, g);
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
/// Seconds as a note writes them: `12.3 ms` below a second, `1.234 s` above.
fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

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

/// Tensor-parallel all-reduce traffic of batch-1 decoding (docs/costmodel.md §7(a)).
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
        tp,
        ..Plan::default()
    };
    let g = Groups::of(&plan, cluster.nvlink_domain()).tp;
    let fabric = Fabric::of(cluster);
    let message = model.hidden as f64 * WIRE_BYTES;
    let calls = 2 * model.layers as u64;
    let cost = fabric.collective(Collective::AllReduce, message, g);
    let (lat, bw) = (cost.latency_s, cost.bandwidth_s);
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
mod tests;

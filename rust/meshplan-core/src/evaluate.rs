//! Scores one plan: the feasibility rules (divisibility, schedule, NVLink domain, memory —
//! docs/costmodel.md §8.2), per-rank memory (§2) and step time (§3–§5), and the headline metrics.
//! The rules are [`Rule`]s checked in order; memory and time come from the three evaluation
//! levels of `levels`, each run once (the search memoises the same levels).

use std::fmt;
use std::time::Instant;

use crate::error::Result;
use crate::flops::{train_flops_per_token, AttentionCounting};
use crate::layout::Groups;
use crate::levels::evaluate_levels;
use crate::plan::{Plan, Schedule};
use crate::report::{Evaluation, Violation};
use crate::rules::Rule;
use crate::space::SearchSpace;
use crate::{Control, Problem};

/// Micro-batches per pipeline per step, `m = B / (b·dp·ep)`, rounded up when not exact.
pub fn micro_batches(problem: &Problem, plan: &Plan) -> u32 {
    // In u64: `micro_batch·dp·ep` can pass u32 (an absurd micro-batch), which must not wrap to 0.
    let per_step = plan.micro_batch as u64 * plan.dense_dp() as u64;
    (problem.workload.global_batch as u64)
        .div_ceil(per_step.max(1))
        .max(1) as u32
}

/// Checks the structural rules (everything but memory) in the order of [`Rule::ALL`], reporting
/// each broken one to `sink` as (rule, message). The sink returns `false` to stop early.
pub fn structural_rules(
    problem: &Problem,
    plan: &Plan,
    space: &SearchSpace,
    groups: &Groups,
    sink: &mut dyn FnMut(Rule, fmt::Arguments) -> bool,
) {
    let model = &problem.model;
    let w = &problem.workload;
    let domain = problem.cluster.nvlink_domain();
    let mut go_on = true;
    w.stack_profile()
        .rules(model, w.precision, plan, &mut |rule, msg| {
            go_on = sink(rule, msg);
            go_on
        });
    if !go_on {
        return;
    }
    macro_rules! rule {
        ($cond:expr, $key:expr, $($msg:tt)+) => {
            if $cond && !sink($key, format_args!($($msg)+)) {
                return;
            }
        };
    }
    rule!(
        model.heads % plan.tp != 0,
        Rule::TpHeads,
        "tp = {} does not divide the {} attention heads",
        plan.tp,
        model.heads
    );
    rule!(
        model.mla.is_none() && model.kv_heads % plan.tp != 0 && plan.tp % model.kv_heads != 0,
        Rule::TpKvHeads,
        "tp = {} neither divides nor is a multiple of the {} KV heads",
        plan.tp,
        model.kv_heads
    );
    rule!(
        model.dense_layers() > 0 && model.ffn_hidden % plan.tp != 0,
        Rule::TpFfn,
        "tp = {} does not divide ffn_hidden = {}",
        plan.tp,
        model.ffn_hidden
    );
    if let Some(moe) = &model.moe {
        rule!(
            moe.expert_ffn_hidden % plan.expert_tp() != 0,
            Rule::TpFfn,
            "{} = {} does not divide expert_ffn_hidden = {}",
            if plan.folded() { "etp" } else { "tp" },
            plan.expert_tp(),
            moe.expert_ffn_hidden
        );
        rule!(
            moe.num_experts % plan.ep != 0,
            Rule::EpExperts,
            "ep = {} does not divide the {} experts",
            plan.ep,
            moe.num_experts
        );
    } else {
        rule!(
            plan.ep > 1,
            Rule::EpExperts,
            "ep = {} on a dense model (expert parallelism needs experts)",
            plan.ep
        );
    }
    if let (Some(m), true) = (&model.mamba, model.layer_pattern.is_some()) {
        // Megatron-Core's MambaMixer splits heads and groups over TP (`ngroups % tp == 0`).
        rule!(
            m.heads % plan.tp != 0 || m.groups % plan.tp != 0,
            Rule::TpHeads,
            "tp = {} does not divide the {} Mamba-2 heads and {} groups",
            plan.tp,
            m.heads,
            m.groups
        );
        // MambaContextParallel: every CP rank gets whole heads, and whole groups or a whole
        // share of one (`tp·cp` divides the heads; groups/tp a multiple or a divisor of cp).
        let (heads_tp, groups_tp) = (m.heads / plan.tp.max(1), m.groups / plan.tp.max(1));
        rule!(
            plan.cp > 1
                && (heads_tp % plan.cp != 0
                    || (groups_tp % plan.cp != 0 && plan.cp % groups_tp.max(1) != 0)),
            Rule::CpMixer,
            "cp = {} cannot split the Mamba-2 layers: tp·cp must divide the {} heads, and cp must divide or be a multiple of the {} groups per TP rank (Megatron-Core MambaContextParallel)",
            plan.cp,
            m.heads,
            groups_tp
        );
    }
    if let (Some(la), true) = (&model.linear_attention, model.layer_pattern.is_some()) {
        rule!(
            la.key_heads % plan.tp != 0 || la.value_heads % plan.tp != 0,
            Rule::TpHeads,
            "tp = {} does not divide the {} key and {} value heads of the gated DeltaNet layers",
            plan.tp,
            la.key_heads,
            la.value_heads
        );
        rule!(
            plan.cp > 1,
            Rule::CpMixer,
            "cp = {}: gated DeltaNet layers have no context parallelism (the chunked delta rule carries its state along the whole sequence; neither Megatron-Core nor the FLA kernels split it)",
            plan.cp
        );
    }
    // In u64: `2·cp` wraps to 0 in u32 for cp = 2^31 (issue 9: a division by zero).
    let two_cp = 2 * plan.cp as u64;
    rule!(
        plan.cp > 1 && w.seq_len as u64 % two_cp != 0,
        Rule::CpSeqLen,
        "seq_len = {} is not a multiple of 2·cp = {} (causal load-balanced chunks)",
        w.seq_len,
        two_cp
    );
    let per_step = plan.micro_batch as u64 * plan.dense_dp() as u64;
    rule!(
        w.global_batch as u64 % per_step != 0,
        Rule::Batch,
        "global_batch = {} is not a multiple of micro_batch·{} = {}",
        w.global_batch,
        if plan.folded() { "dp" } else { "dp·ep" },
        per_step
    );
    // The embedding and the loss may each fill a pipeline chunk of their own (Megatron's
    // account_for_embedding/loss_in_pipeline_split), so L + 2 chunks is the most.
    // In u64: pp·vpp passes u32 within the limits (2^20 · 2^16).
    let chunks = plan.pp as u64 * plan.vpp as u64;
    rule!(
        chunks > model.layers as u64 + 2,
        Rule::PpLayers,
        "pp·vpp = {} model chunks exceed the {} layers plus the embedding and loss chunks",
        chunks,
        model.layers
    );
    rule!(
        plan.pp == 1 && plan.schedule() != Schedule::OneFOneB,
        Rule::Schedule,
        "schedule {} needs pp > 1",
        plan.schedule().name()
    );
    let m = micro_batches(problem, plan);
    rule!(
        plan.schedule() == Schedule::Interleaved && m % plan.pp != 0,
        Rule::InterleaveMicrobatches,
        "interleaved 1F1B needs the {} micro-batches to be a multiple of pp = {}",
        m,
        plan.pp
    );
    rule!(
        space.tp_within_domain && !groups.tp.within_domain(),
        Rule::TpDomain,
        "the tp = {} group leaves the {}-GPU NVLink domain",
        plan.tp,
        domain
    );
    rule!(
        space.cp_within_domain && !groups.cp.within_domain(),
        Rule::CpDomain,
        "the cp = {} group leaves the {}-GPU NVLink domain",
        plan.cp,
        domain
    );
    rule!(
        space.ep_within_domain && !groups.ep.within_domain(),
        Rule::EpDomain,
        "the ep = {} group leaves the {}-GPU NVLink domain",
        plan.ep,
        domain
    );
}

/// Usable memory per GPU under `space`'s headroom, GiB.
pub fn memory_capacity_gib(problem: &Problem, space: &SearchSpace) -> f64 {
    problem.cluster.gpu.memory_gib - space.memory_headroom_gib
}

/// Headline metrics from a step time: (tokens/s per GPU, MFU, model and hardware TFLOP/s per
/// GPU).
/// The rates of one plan per GPU derived from its step time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rates {
    pub tokens_per_s_per_gpu: f64,
    pub mfu: f64,
    pub model_tflops_per_gpu: f64,
    pub hardware_tflops_per_gpu: f64,
}

pub(crate) fn metrics(problem: &Problem, plan: &Plan, step_time_s: f64) -> Rates {
    let n = problem.cluster.num_gpus as f64;
    let w = &problem.workload;
    let tokens = w.tokens_per_step();
    let model_flops = tokens * train_flops_per_token(&problem.model, w, AttentionCounting::Causal);
    let recompute_flops = tokens
        * crate::flops::recompute_flops_per_token(
            &problem.model,
            plan.recompute,
            plan.recompute_modules,
            w.seq_len as f64,
            AttentionCounting::Causal,
        );
    let peak = problem
        .cluster
        .gpu
        .peak_tflops
        .get(w.precision)
        .unwrap_or(f64::NAN)
        * 1e12;
    let per_gpu_s = n * step_time_s;
    Rates {
        tokens_per_s_per_gpu: tokens / per_gpu_s,
        mfu: model_flops / (per_gpu_s * peak),
        model_tflops_per_gpu: model_flops / per_gpu_s / 1e12,
        hardware_tflops_per_gpu: (model_flops + recompute_flops) / per_gpu_s / 1e12,
    }
}

/// Scores `plan` on `problem` with the default search space's rules (headroom, domains).
/// An infeasible plan is still scored, with `feasible = false` and its reasons; an error means
/// the plan is malformed (zero degrees, product ≠ GPU count, vpp without interleaving).
pub fn evaluate(problem: &Problem, plan: &Plan) -> Result<Evaluation> {
    evaluate_in(problem, plan, &SearchSpace::default())
}

/// Scores `plan` under the rules of `space` (memory headroom, which groups must stay in a domain).
pub fn evaluate_in(problem: &Problem, plan: &Plan, space: &SearchSpace) -> Result<Evaluation> {
    evaluate_with(problem, plan, space, &Control::default())
}

/// [`evaluate_in`] under `control`: the cancel flag and the deadline are checked before the
/// evaluation starts and between its phases (rules, memory, time). Its work is bounded by the
/// plan's structure (a handful of stage runs), so a call stops well within 100 ms of either.
pub fn evaluate_with(
    problem: &Problem,
    plan: &Plan,
    space: &SearchSpace,
    control: &Control,
) -> Result<Evaluation> {
    let started = Instant::now();
    control.check(started)?;
    plan.validate(problem.cluster.num_gpus)?;
    plan.validate_split(problem.model.layers)?;
    if plan.offloaded_layers() > 0 && problem.cluster.gpu.host_bandwidth_gbps.is_none() {
        return Err(crate::error::Error::invalid(
            "gpu.host_bandwidth_gbps",
            "null",
            "the GPU's host-link rate in GB/s per direction (plan.offload_layers copies over it)",
        ));
    }
    space.validate()?;
    let mut plan = plan.clone();
    plan.schedule = Some(plan.schedule());
    if plan.tp == 1 {
        plan.sequence_parallel = false;
    }
    let groups = Groups::of(&plan, problem.cluster.nvlink_domain());
    let mut reasons = Vec::new();
    structural_rules(problem, &plan, space, &groups, &mut |rule, msg| {
        reasons.push(Violation {
            rule: rule.key().to_string(),
            message: msg.to_string(),
        });
        true
    });
    control.check(started)?;
    assess(problem, plan, groups, reasons, Some(space), &|| {
        control.check(started)
    })
}

/// Memory and time of a plan through the three evaluation levels (`levels`), each run once,
/// and its [`Evaluation`]; with `space`, a peak above its usable memory adds the `memory`
/// reason.
fn assess(
    problem: &Problem,
    plan: Plan,
    groups: Groups,
    mut reasons: Vec<Violation>,
    space: Option<&SearchSpace>,
    check: &dyn Fn() -> Result<()>,
) -> Result<Evaluation> {
    let m = micro_batches(problem, &plan);
    let ((memory, worst_stage), time) = evaluate_levels(problem, &plan, groups, m, check)?;
    if let Some(space) = space {
        let capacity = memory_capacity_gib(problem, space);
        if memory.total() > capacity {
            reasons.push(Violation {
                rule: Rule::Memory.key().into(),
                message: format!(
                    "peak memory {:.1} GiB on pipeline rank {} exceeds {:.1} GiB usable ({:.1} GiB HBM − {:.1} GiB headroom)",
                    memory.total(),
                    worst_stage,
                    capacity,
                    problem.cluster.gpu.memory_gib,
                    space.memory_headroom_gib
                ),
            });
        }
    }
    let step_time_s = time.total();
    let Rates {
        tokens_per_s_per_gpu,
        mfu,
        model_tflops_per_gpu,
        hardware_tflops_per_gpu,
    } = metrics(problem, &plan, step_time_s);
    let evaluation = Evaluation {
        rank: None,
        feasible: reasons.is_empty(),
        reasons,
        step_time_s,
        tokens_per_s_per_gpu,
        mfu,
        model_tflops_per_gpu,
        hardware_tflops_per_gpu,
        peak_memory_gib: memory.total(),
        memory_gib: memory,
        time_s: time,
        micro_batches: m,
        worst_stage,
        plan,
        group_size: None,
    };
    check()?;
    Ok(evaluation)
}

/// The [`Evaluation`] of a plan the search kept (feasible: no reasons, no memory check), the
/// same levels as [`evaluate_in`].
pub fn score(
    problem: &Problem,
    plan: Plan,
    groups: Groups,
    reasons: Vec<Violation>,
) -> Result<Evaluation> {
    assess(problem, plan, groups, reasons, None, &|| Ok(()))
}

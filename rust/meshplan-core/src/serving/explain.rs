//! A deployment explained axis by axis (docs/serving.md §7): for TP, attention-DP, EP,
//! expert-TP, PP, the replicas and the prefill→decode hand-over, the four facts — what is
//! sharded, which collective runs, the bytes per generated token each GPU sends, which fabric
//! carries them — and the seconds of one decode step they take. Nothing here is a second cost
//! model: the messages are those of `time`, the seconds [`CollectiveModel`]'s on the groups of
//! `time::worker_groups`.

use serde::{Deserialize, Serialize};

use crate::comm::{Collective, CollectiveCost, CollectiveModel};
use crate::error::Result;
use crate::explain::fabric_name;
use crate::layout::Group;
use crate::traffic::{wire_bytes, WIRE_BYTES};
use crate::Control;

use super::evaluate::{evaluate_serving_with, kv_transfer_bytes, ServingEvaluation};
use super::memory::stage_counts;
use super::plan::ServingPlan;
use super::problem::ServingProblem;
use super::time::{worker_groups, TimeModel};

/// One axis of a deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingAxis {
    /// `tp`, `attention_dp`, `ep`, `expert_tp`, `pp`, `replicas` or `kv_transfer`.
    pub axis: String,
    pub degree: u32,
    /// What is split and what is replicated.
    pub state_sharded: String,
    /// `all-reduce`, `dispatch+combine`, `send-recv`, `none`.
    pub collective: String,
    /// Calls per decode step on the busiest stage (per request for `kv_transfer`).
    pub calls_per_step: f64,
    /// Buffer of one call, bytes.
    pub message_bytes: f64,
    /// Wire bytes each GPU sends per token it decodes (per prompt token for `kv_transfer`).
    pub bytes_per_token_per_gpu: f64,
    /// Seconds of these calls per decode step (per request for `kv_transfer`).
    pub seconds_per_step: f64,
    /// One call's latency term is at least its bandwidth term.
    pub latency_bound: bool,
    /// `nvlink`, `network`, `nvlink+network` or `none`.
    pub fabric: String,
    pub group_size: u32,
    pub members_per_domain: u32,
}

/// A deployment's evaluation and its axes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingExplanation {
    pub evaluation: ServingEvaluation,
    pub axes: Vec<ServingAxis>,
    /// FLOPs per byte at which the GPU's GEMMs turn compute-bound (peak over the dense GEMMs'
    /// weight stream): the decode step's arithmetic intensity sits below it when memory-bound.
    pub ridge_flops_per_byte: f64,
}

struct Call {
    kind: &'static str,
    calls: f64,
    message: f64,
    wire: f64,
    cost: CollectiveCost,
    group: Group,
}

fn axis(name: &str, degree: u32, sharded: String, tokens: f64, call: Option<Call>) -> ServingAxis {
    match call {
        Some(c) if c.group.size > 1 || c.kind == "send-recv" => ServingAxis {
            axis: name.into(),
            degree,
            state_sharded: sharded,
            collective: c.kind.into(),
            calls_per_step: c.calls,
            message_bytes: c.message,
            bytes_per_token_per_gpu: c.calls * c.wire / tokens.max(1e-30),
            seconds_per_step: c.calls * c.cost.total_s,
            latency_bound: c.cost.latency_s >= c.cost.bandwidth_s,
            fabric: fabric_name(c.group).into(),
            group_size: c.group.size,
            members_per_domain: c.group.per_domain,
        },
        _ => ServingAxis {
            axis: name.into(),
            degree,
            state_sharded: sharded,
            collective: "none".into(),
            calls_per_step: 0.0,
            message_bytes: 0.0,
            bytes_per_token_per_gpu: 0.0,
            seconds_per_step: 0.0,
            latency_bound: false,
            fabric: "none".into(),
            group_size: degree,
            members_per_domain: degree,
        },
    }
}

/// Explains `plan` on `problem` axis by axis.
pub fn explain_serving(
    problem: &ServingProblem,
    plan: &ServingPlan,
    control: &Control,
) -> Result<ServingExplanation> {
    let evaluation = evaluate_serving_with(problem, plan, control)?;
    let tm = TimeModel::new(problem);
    let model = &problem.model;
    let w = &plan.worker;
    let g = worker_groups(w, tm.domain);
    let h = model.hidden as f64;
    // The sequences the evaluation runs (an open loop: what its rate keeps in flight).
    let tok = evaluation.sequences_per_worker / w.attention_dp as f64 / w.pp as f64;
    let stages = stage_counts(model, w.pp);
    let layers = stages.iter().map(|c| c.total()).max().unwrap_or(0) as f64;
    let moe_layers = stages.iter().map(|c| c.0[1]).max().unwrap_or(0) as f64;
    let mut axes = Vec::new();

    let ar = |bytes: f64, group: Group, calls: f64| Call {
        kind: "all-reduce",
        calls,
        message: bytes,
        wire: wire_bytes(Collective::AllReduce, bytes, group.size),
        cost: tm.fabric.collective(Collective::AllReduce, bytes, group),
        group,
    };
    // After attention and after the FFN (dense or MoE output), every layer (time.rs).
    let tp_calls = 2.0 * layers;
    axes.push(axis(
        "tp",
        w.tp,
        format!(
            "attention heads, dense FFN columns/rows and the vocabulary split {} ways; the KV cache {}",
            w.tp,
            if model.mla.is_some() {
                "(MLA latent) replicated on every TP rank"
            } else {
                "split by KV head (replicated past the KV-head count)"
            }
        ),
        tok,
        Some(ar(tok * h * WIRE_BYTES, g.tp, tp_calls)),
    ));
    if model.moe.is_some() {
        axes.push(axis(
            "attention_dp",
            w.attention_dp,
            format!(
                "each of {} ranks attends its own sequences with its own KV cache; attention weights replicated",
                w.attention_dp
            ),
            tok,
            None,
        ));
        let top_k = model.moe.as_ref().map_or(1, |m| m.top_k);
        let ep_call = if w.attention_dp > 1 {
            let tokens = tok / w.tp as f64;
            let cost = tm.fabric.dispatch(tokens, h * WIRE_BYTES, top_k, g.ep);
            let pf = g.ep.size as f64;
            let wire = tokens * top_k as f64 * (pf - 1.0) / pf * h * WIRE_BYTES;
            Some(Call {
                kind: "dispatch+combine",
                calls: 2.0 * moe_layers,
                message: tokens * top_k as f64 * h * WIRE_BYTES,
                wire,
                cost,
                group: g.ep,
            })
        } else {
            None
        };
        axes.push(axis(
            "ep",
            w.ep,
            format!(
                "routed experts split {} ways ({} per GPU group)",
                w.ep,
                model.moe.as_ref().map_or(0, |m| m.num_experts / w.ep)
            ),
            tok,
            ep_call,
        ));
        let etp_call = if w.attention_dp > 1 && w.ep == 1 && w.expert_tp > 1 {
            // Tensor-parallel experts behind DP attention (time.rs): every rank's tokens
            // gathered to the stage, one all-reduce of h per token after the top-k sum.
            let bytes = tok * w.attention_dp as f64 * h * WIRE_BYTES;
            let gather = tm
                .fabric
                .collective(Collective::AllGather, bytes, g.expert_tp);
            let reduce = tm
                .fabric
                .collective(Collective::AllReduce, bytes, g.expert_tp);
            Some(Call {
                kind: "all-gather+all-reduce",
                calls: moe_layers,
                message: bytes,
                wire: wire_bytes(Collective::AllGather, bytes, g.expert_tp.size)
                    + wire_bytes(Collective::AllReduce, bytes, g.expert_tp.size),
                cost: CollectiveCost {
                    latency_s: gather.latency_s + reduce.latency_s,
                    bandwidth_s: gather.bandwidth_s + reduce.bandwidth_s,
                    total_s: gather.total_s + reduce.total_s,
                    ..reduce
                },
                group: g.expert_tp,
            })
        } else if w.attention_dp > 1 && w.expert_tp > 1 {
            let received = tok * w.attention_dp as f64 * top_k as f64 / w.ep as f64;
            Some(ar(received * h * WIRE_BYTES, g.expert_tp, moe_layers))
        } else {
            None
        };
        axes.push(axis(
            "expert_tp",
            w.expert_tp,
            format!("each routed expert's FFN split {} ways", w.expert_tp),
            tok,
            etp_call,
        ));
    }
    let pp_call = (w.pp > 1).then(|| {
        let bytes = tok * h * WIRE_BYTES;
        Call {
            kind: "send-recv",
            calls: (w.pp - 1) as f64,
            message: bytes,
            wire: bytes,
            cost: tm.fabric.p2p(bytes, g.pp_same_domain),
            group: Group {
                size: 2,
                per_domain: if g.pp_same_domain { 2 } else { 1 },
            },
        }
    });
    axes.push(axis(
        "pp",
        w.pp,
        format!("layers split into {} stages of up to {layers} layers", w.pp),
        tok,
        pp_call,
    ));
    axes.push(axis(
        "replicas",
        plan.replicas,
        format!(
            "{} independent {} workers of {} GPUs; nothing shared",
            plan.replicas,
            if plan.disaggregated() {
                "decode"
            } else {
                "aggregated"
            },
            w.gpus()
        ),
        tok,
        None,
    ));
    if let Some(pw) = &plan.prefill {
        let same = plan.gpus() <= tm.domain as u64;
        let isl = tm.mix.mean_input;
        let bytes = kv_transfer_bytes(problem, pw, isl);
        let cost = tm.fabric.p2p(bytes, same);
        axes.push(axis(
            "kv_transfer",
            plan.prefill_replicas,
            format!(
                "{} prefill workers of {} GPUs hand each prompt's KV cache ({:.1} MB per GPU) to the decode pool",
                plan.prefill_replicas,
                pw.gpus(),
                bytes / 1e6
            ),
            isl,
            Some(Call {
                kind: "send-recv",
                calls: 1.0,
                message: bytes,
                wire: bytes,
                cost,
                group: Group {
                    size: 2,
                    per_domain: if same { 2 } else { 1 },
                },
            }),
        ));
    }
    let ridge = tm.device.gemm.peak_flops / tm.dense_gemm_bytes_per_s;
    Ok(ServingExplanation {
        evaluation,
        axes,
        ridge_flops_per_byte: ridge,
    })
}

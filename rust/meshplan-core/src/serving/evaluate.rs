//! One deployment scored (docs/serving.md §5.3–5.4): the steady state of its workers.
//!
//! Aggregated workers batch `b` running sequences with the prefill of the requests that replace
//! the finishing ones (chunked prefill): every step decodes `b` tokens and prefills `b/OSL`
//! prompts' worth of new tokens, so TPOT is one such mixed step and a new prompt's TTFT is the
//! steps its chunks ride on. Disaggregated deployments prefill batches on their own workers
//! (TTFT: one prefill forward and the KV hand-over on the fabric between the pools) and decode
//! pure decode steps; their throughput is the slower pool's request rate.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::comm::CollectiveModel;
use crate::error::Result;
use crate::Control;

use super::constants;
use super::memory::{kv_bytes_per_token_per_layer, stage_counts, worker_memory, ServingMemory};
use super::plan::{ServingPlan, Worker};
use super::problem::ServingProblem;
use super::time::{worker_groups, Batch, ServingTime, TimeModel};

/// Why a deployment does not serve the problem as asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingViolation {
    /// `memory`, `prefill_memory`, `tp_cross_domain`, `concurrency`, `ttft`, `tpot`, `e2e` or
    /// `request_rate`.
    pub rule: String,
    pub message: String,
}

/// A deployment's memory, times and throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingEvaluation {
    pub plan: ServingPlan,
    /// [`ServingPlan::label`].
    pub label: String,
    /// Fits in memory and meets every SLO and the request rate.
    pub feasible: bool,
    pub violations: Vec<ServingViolation>,
    /// GPUs the deployment uses.
    pub gpus: u64,
    /// Sequences each (decode or aggregated) worker runs in steady state.
    pub sequences_per_worker: f64,
    /// Memory per GPU of the (decode or aggregated) worker.
    pub memory: ServingMemory,
    /// Memory per GPU of the prefill worker (disaggregated).
    pub prefill_memory: Option<ServingMemory>,
    pub time: ServingTime,
    /// Output tokens per second of the deployment.
    pub output_tokens_per_s: f64,
    /// Output tokens per second per GPU used.
    pub tokens_per_s_per_gpu: f64,
    /// Output tokens per second one request sees after its first, `1/TPOT`.
    pub tokens_per_s_per_user: f64,
    /// Requests completed per second.
    pub requests_per_s: f64,
}

/// Scores `plan` on `problem` (validated first; an infeasible plan comes back with its
/// violations).
pub fn evaluate_serving(problem: &ServingProblem, plan: &ServingPlan) -> Result<ServingEvaluation> {
    evaluate_serving_with(problem, plan, &Control::default())
}

/// [`evaluate_serving`] under a cancel flag and deadline.
pub fn evaluate_serving_with(
    problem: &ServingProblem,
    plan: &ServingPlan,
    control: &Control,
) -> Result<ServingEvaluation> {
    let started = Instant::now();
    problem.validate()?;
    plan.validate(&problem.model, problem.cluster.num_gpus)?;
    control.check(started)?;
    Ok(score(&TimeModel::new(problem), plan, false))
}

/// Tokens per attention-DP rank of one prefill forward of an aggregated or prefill worker.
fn forward_tokens() -> f64 {
    constants().max_batched_tokens
}

/// Sequences a (decode or aggregated) worker runs: its `max_sequences`, or its share of the
/// traffic's concurrency when that is smaller.
pub(crate) fn sequences(p: &ServingProblem, plan: &ServingPlan) -> f64 {
    let b = plan.worker.max_sequences as f64;
    match p.traffic.concurrency {
        Some(c) => b.min((c as f64 / plan.replicas as f64).ceil()),
        None => b,
    }
}

/// KV-cache seconds of handing one request's prompt from prefill worker `pw` to a decode
/// worker: each prefill GPU sends its own shard (its stage's layers, its KV heads).
fn kv_transfer_s(tm: &TimeModel, pw: &Worker, same_domain: bool) -> f64 {
    let p = tm.problem;
    let layers = stage_counts(&p.model, pw.pp)
        .iter()
        .map(|c| c.total())
        .max()
        .unwrap_or(0) as f64;
    let per_token = kv_bytes_per_token_per_layer(
        &p.model,
        pw.tp,
        super::problem::bytes_per_element(p.kv_precision),
    );
    let bytes = per_token * layers * p.traffic.input_len as f64;
    tm.fabric.p2p(bytes, same_domain).total_s + constants().kv_transfer_setup_us * 1e-6
}

/// The evaluation of `plan` (already validated); `allow_tp_cross_domain` drops that rule.
pub(crate) fn score(
    tm: &TimeModel,
    plan: &ServingPlan,
    allow_tp_cross_domain: bool,
) -> ServingEvaluation {
    let p = tm.problem;
    let w = &plan.worker;
    let isl = p.traffic.input_len as f64;
    let osl = p.traffic.output_len as f64;
    let new = p.new_prompt_tokens();
    let cached = isl - new;
    let b = sequences(p, plan);
    let b_rank = b / w.attention_dp as f64;
    let context = isl + osl / 2.0;
    let chunk = forward_tokens();
    let mut violations = Vec::new();
    let (decode, tpot, prefill, ttft, kv_transfer, requests_per_s, prefill_memory);
    match &plan.prefill {
        None => {
            // Every step decodes b_rank tokens and prefills the prompts of the b_rank/OSL
            // requests that replace the finishing ones.
            let step = Batch {
                decode_seqs: b_rank,
                decode_context: context,
                prefill_seqs: b_rank / osl,
                prefill_new: new,
                prefill_cached: cached,
            };
            let (d, period) = tm.forward(w, &step, true);
            // A new prompt rides on steps in chunks of what the running decodes leave free.
            let room = (chunk - b_rank).max(chunk / 2.0);
            let chunks = (new / room).ceil().max(1.0);
            let piece = new / chunks;
            let first = Batch {
                decode_seqs: (b_rank - 1.0).max(0.0),
                decode_context: context,
                prefill_seqs: 1.0,
                prefill_new: piece,
                prefill_cached: cached + (new - piece) / 2.0,
            };
            let (f, _) = tm.forward(w, &first, false);
            decode = d;
            tpot = period;
            prefill = f;
            ttft = chunks * f.total_s;
            kv_transfer = 0.0;
            requests_per_s = plan.replicas as f64 * b / (osl * tpot);
            prefill_memory = None;
        }
        Some(pw) => {
            let bp = pw.max_sequences as f64;
            let pbatch = Batch {
                decode_seqs: 0.0,
                decode_context: 0.0,
                prefill_seqs: bp / pw.attention_dp as f64,
                prefill_new: new,
                prefill_cached: cached,
            };
            let (f, prefill_period) = tm.forward(pw, &pbatch, false);
            let step = Batch {
                decode_seqs: b_rank,
                decode_context: context,
                prefill_seqs: 0.0,
                prefill_new: 0.0,
                prefill_cached: 0.0,
            };
            let (d, period) = tm.forward(w, &step, true);
            let same_domain = plan.gpus() <= tm.domain as u64;
            kv_transfer = kv_transfer_s(tm, pw, same_domain);
            decode = d;
            tpot = period;
            prefill = f;
            ttft = f.total_s + kv_transfer;
            let prefill_rate = plan.prefill_replicas as f64 * bp / prefill_period;
            let decode_rate = plan.replicas as f64 * b / (osl * tpot);
            requests_per_s = prefill_rate.min(decode_rate);
            let pm = worker_memory(p, pw, bp, bp / pw.attention_dp as f64 * new);
            if (pm.max_sequences_fit as f64) < bp {
                violations.push(ServingViolation {
                    rule: "prefill_memory".into(),
                    message: format!(
                        "the prefill worker's batch of {bp} prompts needs more than its KV budget ({} sequences fit, {:.1} GiB of weights per GPU in {:.1} GiB)",
                        pm.max_sequences_fit, pm.weights_gib, pm.budget_gib
                    ),
                });
            }
            prefill_memory = Some(pm);
        }
    }
    let forward = if plan.prefill.is_some() {
        b_rank
    } else {
        chunk
    };
    let memory = worker_memory(p, w, b, forward);
    if (memory.max_sequences_fit as f64) < b {
        violations.push(ServingViolation {
            rule: "memory".into(),
            message: format!(
                "{b} sequences of {} tokens do not fit: {} fit ({:.1} GiB of weights per GPU in a {:.1} GiB budget)",
                p.context_tokens(),
                memory.max_sequences_fit,
                memory.weights_gib,
                memory.budget_gib
            ),
        });
    }
    for worker in std::iter::once(w).chain(plan.prefill.as_ref()) {
        let g = worker_groups(worker, tm.domain);
        if !allow_tp_cross_domain && !g.tp.within_domain() {
            violations.push(ServingViolation {
                rule: "tp_cross_domain".into(),
                message: format!(
                    "the TP group of {} GPUs spans {} NVLink domains of {}",
                    worker.tp,
                    g.tp.domains(),
                    tm.domain
                ),
            });
        }
    }
    if let Some(c) = p.traffic.concurrency {
        let held = plan.worker.max_sequences as u64 * plan.replicas as u64;
        if held < c as u64 {
            violations.push(ServingViolation {
                rule: "concurrency".into(),
                message: format!("{held} sequences run at once, fewer than the {c} in flight"),
            });
        }
    }
    let e2e = ttft + (osl - 1.0) * tpot;
    let slo = &p.slo;
    for (rule, value, limit) in [
        ("ttft", ttft, slo.ttft_s),
        ("tpot", tpot, slo.tpot_s),
        ("e2e", e2e, slo.e2e_s),
    ] {
        if let Some(limit) = limit {
            if value > limit {
                violations.push(ServingViolation {
                    rule: rule.into(),
                    message: format!("{rule} {value:.4} s exceeds the SLO of {limit} s"),
                });
            }
        }
    }
    if let Some(rate) = p.traffic.request_rate {
        if requests_per_s < rate {
            violations.push(ServingViolation {
                rule: "request_rate".into(),
                message: format!(
                    "{requests_per_s:.3} requests/s, below the target of {rate} requests/s"
                ),
            });
        }
    }
    let gpus = plan.gpus();
    let output_tokens_per_s = requests_per_s * osl;
    ServingEvaluation {
        plan: *plan,
        label: plan.label(),
        feasible: violations.is_empty(),
        violations,
        gpus,
        sequences_per_worker: b,
        memory,
        prefill_memory,
        time: ServingTime {
            ttft_s: ttft,
            tpot_s: tpot,
            e2e_s: e2e,
            decode,
            prefill,
            kv_transfer_s: kv_transfer,
        },
        output_tokens_per_s,
        tokens_per_s_per_gpu: output_tokens_per_s / gpus.max(1) as f64,
        tokens_per_s_per_user: 1.0 / tpot,
        requests_per_s,
    }
}

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
use super::memory::{
    cached_layers, kv_bytes_per_token_per_layer, stage_counts, worker_memory, ServingMemory,
};
use super::plan::{ServingPlan, Worker};
use super::problem::{weighted_quantile, Arrival, LengthMix, ServingProblem};
use super::queue;
use super::time::{worker_groups, Batch, PhaseTime, ServingTime, TimeModel};

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
    /// Seconds of the TTFT spent queueing (docs/serving.md §5.1): for a slot in a closed loop,
    /// for prefill (M/D/1) or behind an overload in an open one.
    pub queue_s: f64,
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

/// Sequences a (decode or aggregated) worker runs: its `max_sequences`, or its share of the
/// traffic's concurrency when that is smaller.
pub(crate) fn sequences(p: &ServingProblem, plan: &ServingPlan) -> f64 {
    let b = plan.worker.max_sequences as f64;
    match p.traffic.concurrency {
        Some(c) => b.min((c as f64 / plan.replicas as f64).ceil()),
        None => b,
    }
}

/// How a wave of `b` requests lands on `adp` attention-DP ranks dealt out in turn: the busiest
/// rank's share, `ceil(b / adp)`, and, when that leaves ranks idle or part-full, how many
/// ranks' worth of tokens reach the experts (`b` over that share; `None` when every rank holds
/// the same).
pub(crate) fn wave_share(b: f64, adp: u32) -> (f64, Option<f64>) {
    let adp = adp as f64;
    let busiest = (b / adp).ceil().max(1.0);
    let ranks = b / busiest;
    if ranks < adp {
        (busiest, Some(ranks))
    } else {
        (busiest, None)
    }
}

/// Sequences a worker of batch `cap` holds when Little's law gives `occupancy(n)` for a batch
/// of `n` (the requests reaching it per second times the seconds each decodes at that batch's
/// step): the fixed point, at least one per attention-DP rank, at most `cap`. A step is never
/// slower for fewer sequences, so the iteration from `cap` only descends.
pub(crate) fn decode_occupancy(cap: f64, ranks: f64, occupancy: impl Fn(f64) -> f64) -> f64 {
    let floor = ranks.min(cap);
    let mut n = cap;
    for _ in 0..32 {
        let next = occupancy(n).clamp(floor, cap);
        if (next - n).abs() <= 1e-6 * n {
            return next;
        }
        n = next;
    }
    n
}

/// KV-cache bytes one GPU of prefill worker `pw` hands to a decode worker for a prompt of
/// `isl` tokens: its own shard (its stage's layers, its KV heads; a sliding-window layer what
/// `pw.sliding_kv` keeps of it, its last `window` tokens or all of them).
pub(crate) fn kv_transfer_bytes(p: &ServingProblem, pw: &Worker, isl: f64) -> f64 {
    let layers = stage_counts(&p.model, pw.pp)
        .iter()
        .map(|c| cached_layers(&p.model, c, isl, pw.sliding_kv))
        .fold(0.0, f64::max);
    let per_token = kv_bytes_per_token_per_layer(
        &p.model,
        pw.tp,
        super::problem::bytes_per_element(p.kv_precision),
    );
    per_token * layers * isl
}

/// KV-cache seconds of handing a prompt of `isl` tokens from prefill worker `pw` to a decode
/// worker ([`kv_transfer_bytes`] over the fabric, plus the transfer's fixed cost).
fn kv_transfer_s(tm: &TimeModel, pw: &Worker, same_domain: bool, isl: f64) -> f64 {
    let bytes = kv_transfer_bytes(tm.problem, pw, isl);
    tm.fabric.p2p(bytes, same_domain).total_s + constants().kv_transfer_setup_us * 1e-6
}

/// A forward of `prompts` prompts of the traffic (per attention-DP rank): their mean new
/// tokens in all, priced as prompts of the token-weighted mean length so that the attention's
/// query-key pairs (which grow with each prompt's square) are those of the mix; with equal
/// lengths, `prompts` prompts of that length.
pub(crate) fn prompt_batch(tm: &TimeModel, prompts: f64) -> Batch {
    let (p, isl) = (tm.problem, tm.mix.prefill_input);
    let new = p.new_tokens_of(isl);
    Batch::prefill(
        prompts * (tm.mix.mean_new / new),
        new,
        p.cached_tokens_of(isl),
    )
}

/// The mean and second moment over the requests of a value given per length class.
fn moments(mix: &LengthMix, values: impl Iterator<Item = f64>) -> (f64, f64) {
    mix.classes
        .iter()
        .zip(values)
        .fold((0.0, 0.0), |(m, m2), (c, v)| {
            (m + c.0 * v, m2 + c.0 * v * v)
        })
}

/// The evaluation of `plan` (already validated); `allow_tp_cross_domain` drops that rule.
pub(crate) fn score(
    tm: &TimeModel,
    plan: &ServingPlan,
    allow_tp_cross_domain: bool,
) -> ServingEvaluation {
    let p = tm.problem;
    let w = &plan.worker;
    let mix = &tm.mix;
    let osl = mix.mean_output;
    let mut b = sequences(p, plan);
    let context = mix.decode_context;
    let chunk = w.forward_tokens();
    let mut violations = Vec::new();
    let (decode, tpot, prefill, kv_transfer, requests_per_s, prefill_memory);
    // Each length class's own time to its first token (its prefill, hand-over and the output
    // lag), beside the queue every request waits; TTFT and end-to-end latency are the medians
    // over the requests.
    let own_ttft: Vec<f64>;
    // The class of the median prompt, whose prefill forward the evaluation reports.
    let median = mix.median_class;
    let arrival = p.traffic.arrival();
    let replicas = plan.replicas as f64;
    // Requests in flight per worker in a closed loop, arrivals per second per worker in an
    // open one, requests per worker over the run.
    let in_flight = p.traffic.concurrency.map(|c| c as f64 / replicas);
    let lambda = p.traffic.request_rate.map(|r| r / replicas);
    let run = p.traffic.num_requests.map(|n| n as f64 / replicas);
    let queue_s;
    // Completions per second of the whole deployment over the run, where a finite run of
    // waves differs from the steady state.
    let mut run_rate = None;
    // Steps after which the (decode or aggregated) worker returns a step's tokens.
    let lag_steps = w.output_lag_steps.unwrap_or(0) as f64;
    match &plan.prefill {
        None => {
            // The steady state's step: every running sequence decodes, and the prompts arriving
            // meanwhile (b/OSL per step) take their share of a forward. Attention-DP ranks run
            // every forward together (a rank with nothing to run joins with an empty batch, the
            // experts gather every rank's tokens), so the step is the busiest rank's: the
            // expected largest of the ranks' prompt counts, while the experts see every rank's
            // mean load (docs/serving.md §5.1).
            let steady = |b: f64| {
                let adp = w.attention_dp as f64;
                let b_rank = b / adp;
                let with_prompts = |prompts: f64| Batch {
                    decode_seqs: b_rank,
                    decode_context: context,
                    ..prompt_batch(tm, prompts)
                };
                let share = with_prompts(b_rank / osl);
                let busiest = with_prompts(queue::expected_max_poisson(b_rank / osl, adp));
                let step = Batch {
                    busy_ranks: (adp > 1.0).then(|| adp * share.tokens() / busiest.tokens()),
                    ..busiest
                };
                tm.forward(w, &step, true)
            };
            // A new prompt rides on steps in chunks of what the running decodes leave free:
            // `(first forward, chunks, prompt_s)` of each length class's prompt, prompt_s what
            // one prompt holds the prefill budget for, its share (new/room) of a forward whose
            // budget is full of prompts beside the decodes (a prompt of the whole budget takes
            // that forward; smaller ones share one): the traffic's prompts, the token-weighted
            // one (`LengthMix::prefill_input`) in chunks of at most the room, one forward for
            // every class. With pipeline stages the running decodes go in `pp` micro-batches,
            // each forward with its own budget: a chunk rides in one of them beside its share of
            // the decodes, crosses every stage (the prompt's own time), and holds the budget for
            // one pipeline period, the next micro-batch entering the first stage meanwhile.
            let prompts = |b: f64| -> Vec<(PhaseTime, f64, f64)> {
                let b_micro = b / w.attention_dp as f64 / w.pp as f64;
                let room = (chunk - b_micro).max(chunk / 2.0);
                // A prompt of `isl` tokens riding in its first chunk: (forward, new, chunks).
                let riding = |isl: f64| {
                    let new = p.new_tokens_of(isl);
                    let chunks = (new / room).ceil().max(1.0);
                    let piece = new / chunks;
                    let batch = Batch {
                        decode_seqs: (b_micro - 1.0).max(0.0),
                        decode_context: context,
                        prefill_seqs: 1.0,
                        prefill_new: piece,
                        prefill_cached: p.cached_tokens_of(isl) + (new - piece) / 2.0,
                        busy_ranks: None,
                    };
                    (batch, new, chunks)
                };
                let (typical, _, _) = riding(mix.prefill_input);
                let full = Batch {
                    prefill_seqs: room / typical.prefill_new,
                    ..typical
                };
                let period = tm.forward(w, &full, false).1;
                mix.classes
                    .iter()
                    .map(|c| {
                        let (first, new, chunks) = riding(c.1);
                        (tm.forward(w, &first, false).0, chunks, new / room * period)
                    })
                    .collect()
            };
            match arrival {
                Arrival::Waves => {
                    // The wave's prompts are prefilled together in forwards of `chunk` tokens
                    // per rank, then the wave decodes alone: TPOT is a pure decode step. The
                    // scheduler deals a wave's requests out to the attention-DP ranks in turn, so
                    // the busiest rank holds ceil(b / adp) of them and sets every forward; with
                    // fewer requests than ranks, the idle ranks add no tokens to the experts.
                    let (b_rank, busy_ranks) = wave_share(b, w.attention_dp);
                    // One length class (validated): the wave's prompts are all alike.
                    let new = p.new_tokens_of(mix.classes[0].1);
                    let cached = p.cached_tokens_of(mix.classes[0].1);
                    let step = Batch {
                        busy_ranks,
                        ..Batch::decode(b_rank, context)
                    };
                    let (d, period) = tm.forward(w, &step, true);
                    // The scheduler fills every forward to the token budget (the last one
                    // takes what is left): the median prompt's first token comes with the
                    // forward that holds its last token.
                    let (all, median) = queue::wave_forwards(b_rank, new, chunk);
                    let (full, last) = queue::wave_forward_tokens(b_rank, new, chunk);
                    let wave_batch = |tokens: f64| Batch {
                        busy_ranks,
                        ..Batch::prefill(tokens / new, new, cached)
                    };
                    let (f, fperiod) = tm.forward(w, &wave_batch(full), false);
                    let last_s = if all > 1.0 {
                        tm.forward(w, &wave_batch(last), false).0.total_s
                    } else {
                        f.total_s
                    };
                    let wave_s = (all - 1.0) * fperiod + last_s;
                    let first_s = if median < all {
                        (median - 1.0) * fperiod + f.total_s
                    } else {
                        wave_s
                    };
                    let round = wave_s + (osl - 1.0) * period;
                    let x = b / round;
                    decode = d;
                    // An engine that returns a step's tokens only after `lag` further steps
                    // delays the first token by the steps that follow the median's forward:
                    // the wave's later forwards, then decode steps. The last token of a round
                    // is returned at once (no step follows it before the next wave arrives).
                    let later = all - median;
                    let k = lag_steps.min(later);
                    let later_forwards_s = if k <= 0.0 {
                        0.0
                    } else if k < later {
                        k * fperiod
                    } else {
                        (later - 1.0) * fperiod + last_s
                    };
                    let lag_s = later_forwards_s + (lag_steps - k) * period;
                    // The engines run a waiting prompt's prefill before the next decode step,
                    // so the median request, decoding from its first token on, stalls for the
                    // wave's forwards that follow it: their time (less what the lag moved into
                    // its TTFT) spreads over its OSL − 1 tokens.
                    tpot = period + (wave_s - first_s - lag_s) / (osl - 1.0).max(1.0);
                    prefill = f;
                    queue_s = queue::slot_wait(in_flight.unwrap_or(b), b, x);
                    own_ttft = vec![first_s + lag_s];
                    requests_per_s = replicas * x;
                    if let Some(n) = run {
                        // Whole waves: the last one may be partly empty.
                        let rounds = (n / b).ceil().max(1.0);
                        run_rate = Some(replicas * n / (rounds * round));
                    }
                }
                Arrival::Spread => {
                    let (d, period) = steady(b);
                    let prompts = prompts(b);
                    decode = d;
                    tpot = period;
                    prefill = prompts[median].0;
                    let x = b / (osl * tpot);
                    // The loop's requests arrive spread out, at its completion rate, at each
                    // rank's prefill, where a prompt that finds others holding the budget waits
                    // for them (M/D/1, as for Poisson arrivals below; M/G/1 for prompts of
                    // several lengths), at most for the rank's other requests in flight; those
                    // beyond the batch wait for a slot first.
                    let (mean_s, second) = moments(mix, prompts.iter().map(|q| q.2));
                    let running = in_flight.unwrap_or(b).min(b) / w.attention_dp as f64;
                    let others = (running - 1.0).max(0.0) * mean_s;
                    // A closed loop's arrivals are its completions, not Poisson: the mean wait
                    // (its median is not M/G/1's, whose 1 − ρ arrivals find the server idle).
                    let contention = queue::mg1_wait(x / w.attention_dp as f64, mean_s, second)
                        .map_or(others, |wq| wq.min(others));
                    queue_s = queue::slot_wait(in_flight.unwrap_or(b), b, x) + contention;
                    // Tokens returned `lag` steps late: the first one too.
                    own_ttft = prompts
                        .iter()
                        .map(|(f, chunks, _)| chunks * f.total_s + lag_steps * period)
                        .collect();
                    requests_per_s = replicas * x;
                }
                Arrival::Poisson => {
                    // The running batch is what the rate keeps in flight (Little's law on the
                    // decode slots, n = λ·OSL·TPOT(n)), at most the worker's batch.
                    let lambda = lambda.unwrap_or(0.0);
                    let cap = b;
                    let n = decode_occupancy(cap, w.attention_dp as f64, |n| {
                        lambda * osl * steady(n).1
                    });
                    b = n;
                    let (d, period) = steady(n);
                    let prompts = prompts(n);
                    decode = d;
                    tpot = period;
                    prefill = prompts[median].0;
                    let mu = n / (osl * period);
                    // Each rank's prefill serves its share of the arrivals; a prompt holds its
                    // share of a full forward's prefill budget (M/D/1; M/G/1 for prompts of
                    // several lengths). TTFT is the median request's: Poisson arrivals see the
                    // queue as it is (PASTA), 1 − ρ of them empty (`queue::median_wait`).
                    let rank_lambda = lambda / w.attention_dp as f64;
                    let (service, second) = moments(mix, prompts.iter().map(|q| q.2));
                    queue_s = match queue::mg1_wait(rank_lambda, service, second) {
                        Some(wq) if n < cap || mu >= lambda => {
                            queue::median_wait(rank_lambda * service, wq)
                        }
                        _ => {
                            let served = mu.min(1.0 / service * w.attention_dp as f64);
                            run.map_or(0.0, |requests| {
                                queue::overload_wait(requests, served, lambda)
                            })
                        }
                    };
                    own_ttft = prompts
                        .iter()
                        .map(|(f, chunks, _)| chunks * f.total_s + lag_steps * period)
                        .collect();
                    // The deployment's rate is its capacity, what its full batch completes (as
                    // for a closed loop); TTFT and TPOT are those at the offered load.
                    let capacity = if n < cap {
                        let (_, full) = steady(cap);
                        cap / (osl * full)
                    } else {
                        mu
                    };
                    requests_per_s = replicas * capacity;
                }
            }
            kv_transfer = 0.0;
            prefill_memory = None;
        }
        Some(pw) => {
            let bp = pw.max_sequences as f64;
            let pbatch = prompt_batch(tm, bp / pw.attention_dp as f64);
            let (f, prefill_period) = tm.forward(pw, &pbatch, false);
            let decode_step = |n: f64| {
                let step = Batch::decode(n / w.attention_dp as f64, context);
                tm.forward(w, &step, true)
            };
            let same_domain = plan.gpus() <= tm.domain as u64;
            // Each prompt's hand-over moves its own KV; the mean is reported.
            let transfers: Vec<f64> = mix
                .classes
                .iter()
                .map(|c| kv_transfer_s(tm, pw, same_domain, c.1))
                .collect();
            kv_transfer = moments(mix, transfers.iter().copied()).0;
            let prefill_rate = plan.prefill_replicas as f64 * bp / prefill_period;
            let full = decode_step(b);
            let decode_rate = plan.replicas as f64 * b / (osl * full.1);
            requests_per_s = prefill_rate.min(decode_rate);
            // The decode pool decodes what reaches it: the deployment's rate, or the offered
            // one when lower. By Little's law each decode worker then holds
            // n = X/replicas · OSL · TPOT(n) sequences, at most its batch (`decode_occupancy`);
            // a prefill-bound loop's other requests wait for the prefill pool, holding no
            // decode slot.
            let reaching = match (arrival, lambda) {
                (Arrival::Poisson, Some(l)) => requests_per_s.min(l * replicas),
                _ => requests_per_s,
            };
            let (d, period) = if reaching < decode_rate {
                b = decode_occupancy(b, w.attention_dp as f64, |n| {
                    reaching / replicas * osl * decode_step(n).1
                });
                decode_step(b)
            } else {
                full
            };
            decode = d;
            tpot = period;
            prefill = f;
            own_ttft = transfers.iter().map(|t| f.total_s + t).collect();
            let own_mean = moments(mix, own_ttft.iter().copied()).0;
            // Open loop: prompts queue for the prefill pool, a server of one prompt per
            // 1/prefill_rate (M/D/1; the median request's wait). Closed loop (Little's law with
            // no think time, as for `queue::slot_wait`): the requests in flight complete at the
            // deployment's rate, the slower pool's, so each spends `c/X` from arrival to its last
            // token; what its decode does not take it waited before its first token: for the
            // prefill pool when that binds, for a decode slot when decode does.
            queue_s = match arrival {
                Arrival::Poisson => {
                    let lambda = lambda.unwrap_or(0.0) * replicas;
                    let service = 1.0 / prefill_rate;
                    queue::md1_wait(lambda, service)
                        .map(|wq| queue::median_wait(lambda * service, wq))
                        .unwrap_or_else(|| {
                            let served = requests_per_s;
                            p.traffic
                                .num_requests
                                .map_or(0.0, |n| queue::overload_wait(n as f64, served, lambda))
                        })
                }
                _ => in_flight.map_or(0.0, |c| {
                    let service = (osl - 1.0) * tpot + own_mean;
                    queue::closed_loop_wait(c * replicas, requests_per_s, service)
                }),
            };
            let pm = worker_memory(p, mix, pw, bp, bp / pw.attention_dp as f64 * mix.mean_new);
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
        b / w.attention_dp as f64
    } else {
        chunk
    };
    let memory = worker_memory(p, mix, w, b, forward);
    if p.traffic.lengths.len() > 1 && memory.kv_capacity_tokens < mix.longest {
        violations.push(ServingViolation {
            rule: "memory".into(),
            message: format!(
                "the longest requests ({} tokens) do not fit the KV cache ({:.0} tokens per GPU)",
                mix.longest, memory.kv_capacity_tokens
            ),
        });
    }
    if (memory.max_sequences_fit as f64) < b {
        violations.push(ServingViolation {
            rule: "memory".into(),
            message: format!(
                "{b} sequences of {} tokens do not fit: {} fit ({:.1} GiB of weights per GPU in a {:.1} GiB budget)",
                mix.full_context,
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
    let ttft = weighted_quantile(
        mix.classes
            .iter()
            .zip(&own_ttft)
            .map(|(c, own)| (c.0, own + queue_s))
            .collect(),
        0.5,
    );
    let e2e = weighted_quantile(
        mix.classes
            .iter()
            .zip(&own_ttft)
            .map(|(c, own)| (c.0, own + queue_s + (c.2 - 1.0) * tpot))
            .collect(),
        0.5,
    );
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
    let requests_per_s = run_rate.unwrap_or(requests_per_s);
    let output_tokens_per_s = requests_per_s * osl;
    ServingEvaluation {
        plan: *plan,
        label: plan.label(),
        feasible: violations.is_empty(),
        violations,
        gpus,
        sequences_per_worker: b,
        queue_s,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GIB;
    use crate::serving::problem::tests::problem;

    fn worker(tp: u32, batch: u32) -> ServingPlan {
        ServingPlan {
            worker: Worker {
                tp,
                pp: 1,
                attention_dp: 1,
                ep: 1,
                expert_tp: tp,
                max_sequences: batch,
                max_batched_tokens: None,
                kv_tokens: None,
                output_lag_steps: None,
                attention_kernel: Default::default(),
                sliding_kv: Default::default(),
            },
            replicas: 1,
            prefill: None,
            prefill_replicas: 0,
        }
    }

    #[test]
    fn a_closed_loop_beyond_the_batch_waits_its_turn() {
        // 64 running of 96 in flight: the 32 others wait 32 / X, X = 64 / (OSL · TPOT), beyond
        // what every prompt waits for the others' prefills.
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.concurrency = Some(64);
        let alone = evaluate_serving(&p, &worker(1, 64)).unwrap();
        p.traffic.concurrency = Some(96);
        let queued = evaluate_serving(&p, &worker(1, 64)).unwrap();
        let x = 64.0 / (256.0 * queued.time.tpot_s);
        assert!((queued.queue_s - alone.queue_s - 32.0 / x).abs() < 1e-9 * queued.queue_s);
        assert!((queued.time.ttft_s - alone.time.ttft_s - 32.0 / x).abs() < 1e-9);
        // The same 64 run: TPOT and throughput do not change, only the wait.
        assert_eq!(queued.time.tpot_s, alone.time.tpot_s);
        assert_eq!(queued.requests_per_s, alone.requests_per_s);
    }

    #[test]
    fn a_spread_closed_loop_queues_its_prompts_for_the_prefill_budget() {
        // A budget of 1088 tokens beside 64 decodes leaves room for exactly one 1024-token
        // prompt, so a prompt holds a whole forward, the one its TTFT reports: its arrivals, at
        // the loop's rate X, wait the M/D/1 time for that server.
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.concurrency = Some(64);
        let mut plan = worker(1, 64);
        plan.worker.max_batched_tokens = Some(1088);
        let ev = evaluate_serving(&p, &plan).unwrap();
        let x = 64.0 / (256.0 * ev.time.tpot_s);
        let service = ev.time.prefill.total_s;
        let expected = queue::md1_wait(x, service).unwrap().min(63.0 * service);
        assert!(expected > 0.0);
        assert!(
            (ev.queue_s - expected).abs() < 1e-12,
            "{} vs {expected}",
            ev.queue_s
        );
        assert!((ev.time.ttft_s - service - expected).abs() < 1e-12);
        // Fewer in flight, fewer arrivals to wait for; one alone waits for none.
        p.traffic.concurrency = Some(8);
        let fewer = evaluate_serving(&p, &plan).unwrap();
        assert!(0.0 < fewer.queue_s && fewer.queue_s < ev.queue_s);
        p.traffic.concurrency = Some(1);
        assert_eq!(evaluate_serving(&p, &plan).unwrap().queue_s, 0.0);
    }

    #[test]
    fn a_prompt_longer_than_the_budget_holds_whole_forwards_of_it() {
        // 32,768-token prompts beside 7 decodes in a budget of 8192: each rides in 5 chunks of
        // 6,553.6 tokens and holds the budget for 32768/8184 forwards full of such chunks (8,184
        // tokens each, the room 8192 - 8 leaves), not of one chunk's share (until Dec 2026 the
        // full forward held room/new of a chunk, 1,637 tokens, and the wait was a fraction of
        // this).
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.input_len = 32768;
        p.traffic.concurrency = Some(8);
        let plan = worker(1, 8);
        let ev = evaluate_serving(&p, &plan).unwrap();
        let tm = TimeModel::new(&p);
        let room = 8192.0 - 8.0;
        let piece = 32768.0 / 5.0;
        let first = Batch {
            decode_seqs: 7.0,
            decode_context: 32768.0 + 128.0,
            prefill_seqs: 1.0,
            prefill_new: piece,
            prefill_cached: (32768.0 - piece) / 2.0,
            busy_ranks: None,
        };
        let full = Batch {
            prefill_seqs: room / piece,
            ..first
        };
        let (f, _) = tm.forward(&plan.worker, &first, false);
        let (whole, period) = tm.forward(&plan.worker, &full, false);
        assert!(whole.total_s > 1.2 * f.total_s);
        let service = 32768.0 / room * period;
        let x = 8.0 / (256.0 * ev.time.tpot_s);
        let expected = queue::md1_wait(x, service).map_or(7.0 * service, |w| w.min(7.0 * service));
        assert!(
            (ev.queue_s - expected).abs() < 1e-12,
            "{} vs {expected}",
            ev.queue_s
        );
        assert!((ev.time.ttft_s - 5.0 * f.total_s - expected).abs() < 1e-9);
    }

    #[test]
    fn a_pipelined_worker_holds_the_prefill_budget_for_one_stage_period() {
        // Llama 3 70B on 8 H100 as 4 stages of TP 2 with 256 running: the decodes go in 4
        // micro-batches of 64, each forward with its own 8192-token budget. A 1024-token prompt
        // rides in one of them beside its 64 decodes: its own time crosses the 4 stages (its
        // TTFT), but it holds that budget for one stage period, the next micro-batch entering
        // the first stage meanwhile; its arrivals queue for that period, not for the crossing.
        let mut p = problem("llama3-70b", "h100-sxm", 8);
        p.traffic.concurrency = Some(256);
        let mut plan = worker(2, 256);
        plan.worker.pp = 4;
        let ev = evaluate_serving(&p, &plan).unwrap();
        let tm = TimeModel::new(&p);
        let room = 8192.0 - 64.0;
        let riding = Batch {
            decode_seqs: 63.0,
            decode_context: 1024.0 + 128.0,
            prefill_seqs: 1.0,
            prefill_new: 1024.0,
            prefill_cached: 0.0,
            busy_ranks: None,
        };
        let (own, _) = tm.forward(&plan.worker, &riding, false);
        let full = Batch {
            prefill_seqs: room / 1024.0,
            ..riding
        };
        let (crossing, period) = tm.forward(&plan.worker, &full, false);
        assert!(
            period < 0.5 * crossing.total_s,
            "{period} vs {}",
            crossing.total_s
        );
        let service = 1024.0 / room * period;
        let x = 256.0 / (256.0 * ev.time.tpot_s);
        let expected = queue::md1_wait(x, service).unwrap().min(255.0 * service);
        assert!(
            (ev.queue_s - expected).abs() < 1e-12,
            "{} vs {expected}",
            ev.queue_s
        );
        assert!((ev.time.ttft_s - own.total_s - expected).abs() < 1e-12);
        // Priced at the crossing, as before, the prefill would be saturated: 255 prompts' wait.
        assert!(queue::md1_wait(x, 1024.0 / room * crossing.total_s)
            .is_none_or(|w| w > 10.0 * ev.queue_s));
    }

    #[test]
    fn a_wave_smaller_than_the_attention_dp_ranks_waits_for_its_busiest_rank() {
        // DeepSeek-V3 on 8 H200 with DP attention over all 8: 4 prompts of 3200 tokens arrive
        // together and land one per rank on 4 ranks. Each busy rank prefills a whole prompt, as
        // at 8 in flight, so the attention of a forward is the same; the experts see 4 prompts'
        // tokens instead of 8, so the forward is shorter than at 8, longer than half a prompt
        // per rank (the mean) would make it.
        assert_eq!(wave_share(4.0, 8), (1.0, Some(4.0)));
        assert_eq!(wave_share(12.0, 8), (2.0, Some(6.0)));
        assert_eq!(wave_share(16.0, 8), (2.0, None));
        let mut p = problem("deepseek-v3", "h200-sxm", 8);
        p.weight_precision = crate::hardware::Precision::Fp8;
        p.traffic.input_len = 3200;
        p.traffic.output_len = 800;
        p.traffic.arrival = Some(Arrival::Waves);
        let mut plan = worker(1, 8);
        plan.worker.attention_dp = 8;
        plan.worker.expert_tp = 8;
        plan.worker.max_batched_tokens = Some(4096);
        let at = |c: u32| {
            let mut q = p.clone();
            q.traffic.concurrency = Some(c);
            evaluate_serving(&q, &plan).unwrap()
        };
        let (four, eight) = (at(4), at(8));
        let (f4, f8) = (four.time.prefill, eight.time.prefill);
        assert!((f4.attention_s - f8.attention_s).abs() < 1e-12 * f8.attention_s);
        assert!(f4.routed_expert_s < f8.routed_expert_s && f4.total_s < f8.total_s);
        // Half the requests a round, in a round not half as long: fewer completions a second.
        assert!(four.requests_per_s < eight.requests_per_s);
        assert_eq!(four.sequences_per_worker, 4.0);
    }

    #[test]
    fn attention_dp_ranks_decode_at_the_pace_of_the_busiest_ranks_prompts() {
        // DeepSeek-V3 on 8 H200, attention-DP over all 8, 1024-token prompts arriving at 1/s:
        // a prompt on any rank holds every rank's step (they run each forward together), so
        // the step carries the busiest rank's prompts, the expected largest of the 8 ranks'
        // Poisson counts (about 8 times one rank's share while prompts are sparse), and the
        // experts the whole stage's mean tokens.
        let mut p = problem("deepseek-v3", "h200-sxm", 8);
        p.weight_precision = crate::hardware::Precision::Fp8;
        p.traffic.input_len = 1024;
        p.traffic.output_len = 1024;
        p.traffic.concurrency = None;
        p.traffic.request_rate = Some(1.0);
        p.traffic.arrival = Some(Arrival::Poisson);
        let mut plan = worker(1, 256);
        plan.worker.attention_dp = 8;
        plan.worker.expert_tp = 8;
        let ev = evaluate_serving(&p, &plan).unwrap();
        let tm = TimeModel::new(&p);
        let b_rank = ev.sequences_per_worker / 8.0;
        let share = b_rank / 1024.0;
        let busiest = queue::expected_max_poisson(share, 8.0);
        assert!(
            busiest > 7.0 * share && busiest < 8.0 * share,
            "{busiest} vs {share}"
        );
        let step = |prompts: f64, busy: Option<f64>| {
            let batch = Batch {
                decode_seqs: b_rank,
                decode_context: tm.mix.decode_context,
                busy_ranks: busy,
                ..prompt_batch(&tm, prompts)
            };
            tm.forward(&plan.worker, &batch, true).1
        };
        let stage = 8.0 * (b_rank + share * 1024.0) / (b_rank + busiest * 1024.0);
        assert!((ev.time.tpot_s - step(busiest, Some(stage))).abs() < 1e-12 * ev.time.tpot_s);
        // Charged one rank's share alone, the step was shorter.
        assert!(
            ev.time.tpot_s > 1.2 * step(share, None),
            "{}",
            ev.time.tpot_s
        );
        // Without attention-DP the rank is the stage: its own share, as before.
        let mut tp8 = worker(8, 256);
        tp8.worker.expert_tp = 8;
        let single = evaluate_serving(&p, &tp8).unwrap();
        let tp8_tm = TimeModel::new(&p);
        let n = single.sequences_per_worker;
        let own = Batch {
            decode_seqs: n,
            decode_context: tp8_tm.mix.decode_context,
            ..prompt_batch(&tp8_tm, n / 1024.0)
        };
        let by_hand = tp8_tm.forward(&tp8.worker, &own, true).1;
        assert!((single.time.tpot_s - by_hand).abs() < 1e-12 * by_hand);
    }

    #[test]
    fn a_hand_over_moves_what_the_prefill_pool_keeps() {
        // gpt-oss-120b, a 2048-token prompt from a TP 2 prefill worker: each GPU holds 4 of the
        // 8 KV heads, 2 x 4 x 64 x 2 = 1024 bytes per token per layer. A windowed pool hands
        // over the 18 full layers' 2048 tokens and the sliding layers' last 128; a pool that
        // keeps every token (SGLang's for gpt-oss) all 36 layers' 2048.
        let mut p = problem("gpt-oss-120b", "h200-sxm", 4);
        p.traffic.input_len = 2048;
        let pw = worker(2, 4).worker;
        let window = kv_transfer_bytes(&p, &pw, 2048.0);
        assert_eq!(window, 1024.0 * (18.0 * 2048.0 + 18.0 * 128.0));
        let full = Worker {
            sliding_kv: crate::serving::SlidingKv::Full,
            ..pw
        };
        assert_eq!(kv_transfer_bytes(&p, &full, 2048.0), 1024.0 * 36.0 * 2048.0);
    }

    #[test]
    fn a_closed_loop_on_pools_obeys_littles_law() {
        // 1P1D of Llama 3 8B, 4096-token prompts and 16 output tokens: one prefill GPU serves
        // fewer prompts per second than the decode GPU finishes, so the 64 in flight queue for
        // it, and each spends c/X from arrival to its last token.
        let mut p = problem("llama3-8b", "h100-sxm", 2);
        p.traffic.input_len = 4096;
        p.traffic.output_len = 16;
        p.traffic.concurrency = Some(64);
        let mut plan = worker(1, 64);
        plan.prefill = Some(worker(1, 1).worker);
        plan.prefill_replicas = 1;
        let ev = evaluate_serving(&p, &plan).unwrap();
        let own = ev.time.prefill.total_s + ev.time.kv_transfer_s;
        assert!(ev.queue_s > 0.0 && ev.time.ttft_s > own);
        assert!(
            (ev.requests_per_s - 1.0 / ev.time.prefill.total_s).abs() < 1e-9 * ev.requests_per_s
        );
        let little = ev.requests_per_s * (ev.time.ttft_s + 15.0 * ev.time.tpot_s);
        assert!((little - 64.0).abs() < 1e-9 * 64.0, "{little}");
        // The decode GPU holds only what the prefill pool sends it (Little's law on its slots,
        // n = X · OSL · TPOT(n)): a handful of the 64, at a shorter step than a batch of 64.
        let n = ev.sequences_per_worker;
        assert!(
            (n - ev.requests_per_s * 16.0 * ev.time.tpot_s).abs() < 1e-5 * n,
            "{n}"
        );
        assert!(n < 8.0, "{n}");
        let mut full = plan;
        full.prefill_replicas = 0;
        full.prefill = None;
        p.traffic.arrival = Some(Arrival::Waves);
        let batch_of_64 = evaluate_serving(&p, &full).unwrap().time.decode.total_s;
        assert!(ev.time.tpot_s < batch_of_64);
        p.traffic.arrival = None;
        // An open loop below the pools' rate: the decode GPU holds λ · OSL · TPOT(n).
        p.traffic.concurrency = None;
        p.traffic.request_rate = Some(0.5 * ev.requests_per_s);
        let open = evaluate_serving(&p, &plan).unwrap();
        let n = open.sequences_per_worker;
        let want = 0.5 * ev.requests_per_s * 16.0 * open.time.tpot_s;
        assert!((n - want.max(1.0)).abs() < 1e-5 * n, "{n} vs {want}");
        p.traffic.request_rate = None;
        // Fewer in flight than the pools serve at once: no wait.
        p.traffic.concurrency = Some(1);
        let one = evaluate_serving(&p, &plan).unwrap();
        assert_eq!(one.queue_s, 0.0);
        assert_eq!(one.time.ttft_s, own);
    }

    #[test]
    fn a_wave_is_prefilled_then_decoded_alone() {
        // 4 prompts of 1024 tokens fit one forward of 8192: every first token comes after it,
        // and the wave then decodes 255 pure decode steps.
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.concurrency = Some(4);
        p.traffic.arrival = Some(Arrival::Waves);
        let ev = evaluate_serving(&p, &worker(1, 4)).unwrap();
        assert_eq!(ev.time.ttft_s, ev.time.prefill.total_s);
        let round = ev.time.ttft_s + 255.0 * ev.time.tpot_s;
        assert!((ev.requests_per_s - 4.0 / round).abs() < 1e-9 * ev.requests_per_s);
        // A pure decode step is shorter than the steady state's mixed one.
        p.traffic.arrival = Some(Arrival::Spread);
        let spread = evaluate_serving(&p, &worker(1, 4)).unwrap();
        assert!(ev.time.tpot_s < spread.time.tpot_s);
        // A token budget of 2048 prefills the wave in two forwards of two prompts; the median
        // (second) request's first token comes with the first of them.
        p.traffic.arrival = Some(Arrival::Waves);
        let mut small = worker(1, 4);
        small.worker.max_batched_tokens = Some(2048);
        let chunked = evaluate_serving(&p, &small).unwrap();
        assert_eq!(chunked.time.ttft_s, chunked.time.prefill.total_s);
        assert!(chunked.time.ttft_s < ev.time.ttft_s);
        // It then decodes while the second forward runs (prefill first): one forward of two
        // prompts spread over its 255 tokens, on top of the pure decode step.
        let stall = chunked.time.tpot_s - chunked.time.decode.total_s;
        assert!(
            (stall - chunked.time.prefill.total_s / 255.0).abs() < 1e-9,
            "{stall}"
        );
        assert_eq!(chunked.time.decode.total_s, ev.time.tpot_s);
        // A run of 10 requests is three waves of 4, the last one half empty.
        p.traffic.num_requests = Some(10);
        let run = evaluate_serving(&p, &worker(1, 4)).unwrap();
        assert!((run.requests_per_s - 10.0 / (3.0 * round)).abs() < 1e-9 * run.requests_per_s);
    }

    #[test]
    fn a_wave_fills_its_forwards_to_the_token_budget() {
        // 8 prompts of 1024 tokens in forwards of 3072: 3072, 3072 and the last 2048. The
        // median (4th) prompt ends at token 4096, in the second full forward; the requests
        // decode through the third.
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.arrival = Some(Arrival::Waves);
        let one_forward = |prompts: u32| {
            let mut q = p.clone();
            q.traffic.concurrency = Some(prompts);
            evaluate_serving(&q, &worker(1, prompts))
                .unwrap()
                .time
                .ttft_s
        };
        let (three, two) = (one_forward(3), one_forward(2));
        p.traffic.concurrency = Some(8);
        let mut plan = worker(1, 8);
        plan.worker.max_batched_tokens = Some(3072);
        let ev = evaluate_serving(&p, &plan).unwrap();
        assert!(
            (ev.time.ttft_s - 2.0 * three).abs() < 1e-9 * three,
            "{:?}",
            ev.time
        );
        assert!((ev.time.prefill.total_s - three).abs() < 1e-12);
        let stall = ev.time.tpot_s - ev.time.decode.total_s;
        assert!(
            (stall - two / 255.0).abs() < 1e-9,
            "{stall} vs {}",
            two / 255.0
        );
        // The round is the three forwards and 255 decode steps: e2e is the whole of it.
        let round = 2.0 * three + two + 255.0 * ev.time.decode.total_s;
        assert!((ev.time.e2e_s - round).abs() < 1e-9 * round);
        assert!((ev.requests_per_s - 8.0 / round).abs() < 1e-9 * ev.requests_per_s);
    }

    #[test]
    fn tokens_returned_a_step_late_move_the_wave_into_the_first_token() {
        // vLLM V0's asynchronous output processing returns step N's tokens when step N+1 ends.
        // 8 prompts of 1024 in forwards of 4096: the median (4th) prompt completes in the
        // first forward and is returned after the second, which no longer stalls its decode.
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.arrival = Some(Arrival::Waves);
        p.traffic.concurrency = Some(8);
        let mut plan = worker(1, 8);
        plan.worker.max_batched_tokens = Some(4096);
        let now = evaluate_serving(&p, &plan).unwrap();
        plan.worker.output_lag_steps = Some(1);
        let late = evaluate_serving(&p, &plan).unwrap();
        let forward = now.time.prefill.total_s;
        assert!((late.time.ttft_s - 2.0 * forward).abs() < 1e-9 * forward);
        assert!((now.time.ttft_s - forward).abs() < 1e-9 * forward);
        assert!((late.time.tpot_s - late.time.decode.total_s).abs() < 1e-12);
        assert!((late.time.e2e_s - now.time.e2e_s).abs() < 1e-9 * now.time.e2e_s);
        assert_eq!(late.requests_per_s, now.requests_per_s);
        // A wave of one forward: the next step is a decode step.
        p.traffic.concurrency = Some(4);
        let mut one = worker(1, 4);
        let now = evaluate_serving(&p, &one).unwrap();
        one.worker.output_lag_steps = Some(1);
        let late = evaluate_serving(&p, &one).unwrap();
        let step = now.time.decode.total_s;
        assert!((late.time.ttft_s - now.time.ttft_s - step).abs() < 1e-9);
        // In a steady state of mixed steps the first token waits one more step.
        p.traffic.arrival = Some(Arrival::Spread);
        let now = evaluate_serving(&p, &worker(1, 4)).unwrap();
        let late = evaluate_serving(&p, &one).unwrap();
        assert!((late.time.ttft_s - now.time.ttft_s - now.time.tpot_s).abs() < 1e-9);
        assert_eq!(late.time.tpot_s, now.time.tpot_s);
        // Bounded, naming the field.
        one.worker.output_lag_steps = Some(9);
        let e = evaluate_serving(&p, &one).unwrap_err().to_string();
        assert!(e.contains("serving_plan.worker.output_lag_steps"), "{e}");
    }

    #[test]
    fn an_open_loop_runs_what_its_rate_keeps_in_flight() {
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.request_rate = Some(2.0);
        assert_eq!(p.traffic.arrival(), Arrival::Poisson);
        let ev = evaluate_serving(&p, &worker(1, 256)).unwrap();
        // Little's law on the decode slots: n = λ · OSL · TPOT(n), fewer than the 256 slots,
        // which could complete more than λ (the deployment's rate is that capacity).
        let n = ev.sequences_per_worker;
        assert!((n - 2.0 * 256.0 * ev.time.tpot_s).abs() < 1e-3 * n, "{n}");
        assert!(n < 256.0 && ev.requests_per_s > 2.0 && ev.feasible);
        // The prefill is busy a small share of the time: the median request finds it idle.
        assert_eq!(ev.queue_s, 0.0);
        // At 22/s it is busy more than half the time: the median request waits, less than the
        // mean M/D/1 wait (the arrivals that find it idle wait nothing).
        p.traffic.request_rate = Some(22.0);
        let busy = evaluate_serving(&p, &worker(1, 256)).unwrap();
        assert!(
            busy.queue_s > 0.0 && busy.queue_s < busy.time.ttft_s,
            "{}",
            busy.queue_s
        );
        let tm = TimeModel::new(&p);
        let room = 8192.0 - busy.sequences_per_worker;
        let full = Batch {
            decode_seqs: busy.sequences_per_worker - 1.0,
            decode_context: 1024.0 + 128.0,
            prefill_seqs: room / 1024.0,
            prefill_new: 1024.0,
            prefill_cached: 0.0,
            busy_ranks: None,
        };
        let service = 1024.0 / room * tm.forward(&worker(1, 256).worker, &full, false).1;
        let mean = queue::md1_wait(22.0, service).unwrap();
        assert!((busy.queue_s - queue::median_wait(22.0 * service, mean)).abs() < 1e-12);
        assert!(busy.queue_s < mean);
        // Overloaded (more arrivals than the 4 slots complete): the median of 1000 requests
        // waits N/2 · (1/μ − 1/λ).
        p.traffic.request_rate = Some(50.0);
        p.traffic.num_requests = Some(1000);
        let over = evaluate_serving(&p, &worker(1, 4)).unwrap();
        let mu = over.requests_per_s;
        assert!(mu < 50.0 && !over.feasible);
        assert!((over.queue_s - 500.0 * (1.0 / mu - 1.0 / 50.0)).abs() < 1e-6 * over.queue_s);
        // Poisson without a rate is named.
        p.traffic.request_rate = None;
        p.traffic.arrival = Some(Arrival::Poisson);
        assert!(evaluate_serving(&p, &worker(1, 4))
            .unwrap_err()
            .to_string()
            .contains("traffic.arrival"));
    }

    /// `p` with its lengths given as a distribution of `classes` (input, output, weight).
    fn with_lengths(p: &ServingProblem, classes: &[(u32, u32, f64)]) -> ServingProblem {
        let mut q = p.clone();
        q.traffic.input_len = 0;
        q.traffic.output_len = 0;
        q.traffic.lengths = classes
            .iter()
            .map(
                |&(input_len, output_len, weight)| crate::serving::LengthClass {
                    input_len,
                    output_len,
                    weight,
                },
            )
            .collect();
        q
    }

    #[test]
    fn one_length_class_is_the_fixed_lengths() {
        // Every arrival and both kinds of deployment: a distribution of one class (any weight)
        // gives the very numbers of input_len/output_len.
        let mut p = problem("llama3-70b", "h100-sxm", 16);
        p.traffic.concurrency = Some(64);
        let mut pd = worker(8, 64);
        pd.prefill = Some(worker(8, 4).worker);
        pd.prefill_replicas = 1;
        for arrival in [Arrival::Spread, Arrival::Waves, Arrival::Poisson] {
            p.traffic.arrival = Some(arrival);
            p.traffic.request_rate = (arrival == Arrival::Poisson).then_some(3.0);
            let one = with_lengths(&p, &[(1024, 256, 7.0)]);
            for plan in [worker(8, 64), pd] {
                let a = evaluate_serving(&p, &plan).unwrap();
                let b = evaluate_serving(&one, &plan).unwrap();
                assert_eq!(a.time, b.time, "{arrival:?} {}", a.label);
                assert_eq!(a.queue_s, b.queue_s);
                assert_eq!(a.output_tokens_per_s, b.output_tokens_per_s);
                assert_eq!(a.memory, b.memory);
            }
        }
    }

    #[test]
    fn a_running_batch_holds_each_class_for_its_output_length() {
        // Half the requests 512 → 128, half 1536 → 384: the mean request is 1024 → 256, but a
        // request stays in the batch for its output, so three quarters of the running
        // sequences are long ones; they attend to (128·(512 + 64) + 384·(1536 + 192)) / 512 =
        // 1440 tokens on average, not the mean request's 1152, and end at 1600, not 1280.
        let p = with_lengths(
            &problem("llama3-70b", "h100-sxm", 8),
            &[(512, 128, 1.0), (1536, 384, 1.0)],
        );
        let mix = p.lengths();
        assert_eq!((mix.mean_input, mix.mean_output), (1024.0, 256.0));
        assert_eq!(mix.decode_context, 1440.0);
        assert_eq!(mix.full_context, 1600.0);
        assert_eq!(mix.longest, 1920.0);
        // The decode step is that of 1440-token contexts; the rate is the mean output's.
        let mut flat = problem("llama3-70b", "h100-sxm", 8);
        flat.traffic.input_len = 1248;
        flat.traffic.output_len = 384;
        let plan = worker(8, 64);
        let ev = evaluate_serving(&p, &plan).unwrap();
        let tm = TimeModel::new(&p);
        let (_, step) = tm.forward(&plan.worker, &Batch::decode(64.0, 1440.0), true);
        let (_, flat_step) =
            TimeModel::new(&flat).forward(&plan.worker, &Batch::decode(64.0, 1440.0), true);
        assert_eq!(step, flat_step);
        assert!(ev.time.tpot_s > step, "plus the arriving prompts' share");
        let x = 64.0 / (256.0 * ev.time.tpot_s);
        assert!((ev.requests_per_s - x).abs() < 1e-12 * x);
        assert!((ev.output_tokens_per_s - x * 256.0).abs() < 1e-9 * x);
        // Memory holds the running sequences at their mean full length.
        assert!(
            (ev.memory.kv_cache_gib - 64.0 * 1600.0 * ev.memory.kv_bytes_per_token / GIB).abs()
                < 1e-9
        );
    }

    #[test]
    fn ttft_and_e2e_are_medians_over_the_requests() {
        // Two classes of equal weight: the median is the mean of the two (an even count); with
        // three quarters of the requests short, the short class's.
        let base = problem("llama3-70b", "h100-sxm", 8);
        let plan = worker(8, 32);
        let even = with_lengths(&base, &[(256, 64, 1.0), (4096, 512, 1.0)]);
        let ev = evaluate_serving(&even, &plan).unwrap();
        let skew = with_lengths(&base, &[(256, 64, 3.0), (4096, 512, 1.0)]);
        let sk = evaluate_serving(&skew, &plan).unwrap();
        // Each class's own TTFT, from a one-class problem at the same step and queue.
        let own = |isl: u32, osl: u32| {
            let one = with_lengths(&base, &[(isl, osl, 1.0)]);
            let e = evaluate_serving(&one, &plan).unwrap();
            e.time.ttft_s - e.queue_s
        };
        let (short, long) = (own(256, 64), own(4096, 512));
        assert!(short < long);
        // The prompts' pricing depends on the step's decodes only through the batch, the same
        // in every problem here; the queue is the mixed problem's.
        let want = (short + long) / 2.0 + ev.queue_s;
        assert!(
            (ev.time.ttft_s - want).abs() < 0.02 * want,
            "{} vs {want}",
            ev.time.ttft_s
        );
        assert!(sk.time.ttft_s < ev.time.ttft_s);
        let e2e_short = short + ev.queue_s + 63.0 * ev.time.tpot_s;
        let e2e_long = long + ev.queue_s + 511.0 * ev.time.tpot_s;
        let want = (e2e_short + e2e_long) / 2.0;
        assert!((ev.time.e2e_s - want).abs() < 0.02 * want);
        assert!(
            (sk.time.e2e_s - (short + sk.queue_s + 63.0 * sk.time.tpot_s)).abs()
                < 0.02 * sk.time.e2e_s
        );
    }

    #[test]
    fn prompts_of_unequal_lengths_wait_longer_for_the_prefill() {
        // Poisson arrivals at the same rate and the same mean prompt (2048 tokens): half of
        // them 256 and half 3840 tokens hold the prefill budget for unequal times, and M/G/1
        // waits longer than M/D/1 (the median request, with the prefill busy more than half
        // the time at 13/s).
        let mut p = problem("llama3-8b", "h100-sxm", 1);
        p.traffic.input_len = 2048;
        p.traffic.output_len = 128;
        p.traffic.request_rate = Some(13.0);
        let plan = worker(1, 64);
        let equal = evaluate_serving(&p, &plan).unwrap();
        let unequal = evaluate_serving(
            &with_lengths(&p, &[(256, 128, 1.0), (3840, 128, 1.0)]),
            &plan,
        )
        .unwrap();
        assert!(equal.queue_s > 0.0);
        assert!(
            unequal.queue_s > 1.2 * equal.queue_s,
            "{} vs {}",
            unequal.queue_s,
            equal.queue_s
        );
    }

    #[test]
    fn a_prefill_forward_of_a_mix_keeps_its_tokens_and_attention() {
        // 3 prompts of 512 and 1 of 2560 (mean 1024): a forward of 4 holds 4096 tokens and
        // 3·512²/2 + 2560²/2 query-key pairs, as 4·1024/1792 = 16/7 prompts of the
        // token-weighted (3·512² + 2560²)/4096 = 1792 tokens do.
        let p = with_lengths(
            &problem("llama3-8b", "h100-sxm", 1),
            &[(512, 64, 3.0), (2560, 64, 1.0)],
        );
        let tm = TimeModel::new(&p);
        let b = prompt_batch(&tm, 4.0);
        assert_eq!(b.prefill_new, 1792.0);
        assert!((b.prefill_seqs - 16.0 / 7.0).abs() < 1e-12);
        assert!((b.prefill_seqs * b.prefill_new - 4096.0).abs() < 1e-9);
        let pairs = b.prefill_seqs * b.prefill_new * b.prefill_new / 2.0;
        let want = (3.0 * 512.0 * 512.0 + 2560.0 * 2560.0) / 2.0;
        assert!((pairs - want).abs() < 1e-9 * want);
    }

    #[test]
    fn the_longest_request_must_fit_the_kv_cache() {
        // Llama 3 70B at TP 8 on H100 holds ~1.5 M tokens per GPU: a mix whose mean fits but
        // one class of 4 M tokens does not.
        let p = with_lengths(
            &problem("llama3-70b", "h100-sxm", 8),
            &[(1024, 256, 1000.0), (4_000_000, 16, 1.0)],
        );
        let ev = evaluate_serving(&p, &worker(8, 1)).unwrap();
        assert!(!ev.feasible);
        let v = ev
            .violations
            .iter()
            .find(|v| v.message.contains("longest"))
            .unwrap();
        assert_eq!(v.rule, "memory");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 48,
            ..proptest::prelude::ProptestConfig::default()
        })]

        #[test]
        fn a_length_distribution_does_not_depend_on_the_order_or_scale_of_its_classes(
            classes in proptest::collection::vec((1u32..40_000, 1u32..4_000, 0.01f64..100.0), 1..8),
            scale in 0.001f64..1000.0,
            poisson in proptest::bool::ANY,
            pd in proptest::bool::ANY,
        ) {
            let mut p = problem("llama3-8b", "h100-sxm", 8);
            if poisson {
                p.traffic.request_rate = Some(2.0);
            } else {
                p.traffic.concurrency = Some(32);
            }
            let mut plan = worker(4, 32);
            if pd {
                plan.prefill = Some(worker(4, 2).worker);
                plan.prefill_replicas = 1;
            }
            let given = with_lengths(&p, &classes);
            let mut reordered = classes.clone();
            reordered.reverse();
            let reversed = with_lengths(&p, &reordered);
            let scaled: Vec<_> = classes.iter().map(|&(i, o, w)| (i, o, w * scale)).collect();
            let rescaled = with_lengths(&p, &scaled);
            let a = evaluate_serving(&given, &plan).unwrap();
            for t in [a.time.ttft_s, a.time.tpot_s, a.time.e2e_s, a.output_tokens_per_s] {
                proptest::prop_assert!(t.is_finite() && t > 0.0, "{:?}", a.time);
            }
            proptest::prop_assert!(a.time.e2e_s >= a.time.tpot_s);
            for other in [&reversed, &rescaled] {
                let b = evaluate_serving(other, &plan).unwrap();
                for (x, y) in [
                    (a.time.ttft_s, b.time.ttft_s),
                    (a.time.tpot_s, b.time.tpot_s),
                    (a.time.e2e_s, b.time.e2e_s),
                    (a.output_tokens_per_s, b.output_tokens_per_s),
                ] {
                    proptest::prop_assert!((x - y).abs() <= 1e-9 * x.abs().max(1e-12), "{x} vs {y}");
                }
                proptest::prop_assert_eq!(a.feasible, b.feasible);
            }
        }
    }
}

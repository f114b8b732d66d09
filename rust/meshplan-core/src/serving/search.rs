//! The serving search (docs/serving.md §6): every worker shape (TP, attention-DP, PP, and for
//! MoE models every EP × expert-TP split of the stage) whose degrees divide the GPU count, pruned
//! by the heads, the NVLink domain (TP stays inside one) and memory (the weights and at least
//! one sequence's KV cache); for each, the batches (powers of two up to what fits, or the
//! traffic's concurrency shared over the replicas) as aggregated deployments filling the
//! cluster, and as decode pools paired with the best prefill pools (xPyD, the pool sizes
//! matched by request rate). Deployments meeting the SLOs are ranked by the objective; the
//! Pareto front of tokens/s per GPU against tokens/s per user is kept beside them.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;
use crate::Control;

use super::constants;
use super::evaluate::{prompt_batch, score, ServingEvaluation};
use super::memory::worker_memory;
use super::plan::{AttentionKernel, ServingPlan, SlidingKv, Worker};
use super::problem::{Objective, ServingProblem};
use super::time::{Batch, TimeModel};
use crate::search::divisors;

fn default_top_k() -> u32 {
    10
}

/// Deepest pipeline the search tries unless `max_pp` says otherwise: serving engines run a
/// handful of stages (PP spans nodes, not layers), and deeper pipelines only lengthen TPOT.
pub const DEFAULT_MAX_PP: u32 = 64;

/// Deployments one search scores unless `max_candidates` says otherwise (a 64-GPU search of a
/// 671 B MoE scores about 6,000); a larger space is refused with `SpaceTooLarge`.
pub const DEFAULT_MAX_CANDIDATES: u64 = 200_000;

/// Scores left before the space counts as too large.
struct Budget {
    used: u64,
    limit: u64,
}

impl Budget {
    /// One more deployment scored, or the error once past the limit.
    fn take(&mut self) -> Result<()> {
        self.used += 1;
        if self.used > self.limit {
            return Err(Error::SpaceTooLarge {
                candidates: self.used,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

fn yes() -> bool {
    true
}

/// What the serving search may choose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingSpace {
    /// Deployments returned.
    #[serde(default = "default_top_k")]
    pub top_k: u32,
    /// Also consider disaggregated prefill/decode pools.
    #[serde(default = "yes")]
    pub disaggregation: bool,
    /// Largest TP degree.
    #[serde(default)]
    pub max_tp: Option<u32>,
    /// Largest PP degree (default [`DEFAULT_MAX_PP`]).
    #[serde(default)]
    pub max_pp: Option<u32>,
    /// Largest attention-DP degree.
    #[serde(default)]
    pub max_attention_dp: Option<u32>,
    /// Most sequences per worker.
    #[serde(default)]
    pub max_sequences: Option<u32>,
    /// Let a TP group span NVLink domains.
    #[serde(default)]
    pub allow_tp_cross_domain: bool,
    /// Most deployments to score (default [`DEFAULT_MAX_CANDIDATES`]).
    #[serde(default)]
    pub max_candidates: Option<u64>,
    /// The engine's attention kernels, for every deployment scored (`triton-mla`: SGLang 0.4's
    /// Triton MLA backend, MLA models only).
    #[serde(default)]
    pub attention_kernel: AttentionKernel,
    /// What every deployment's KV pools keep of a sliding-window layer (`full`: SGLang's pool
    /// for gpt-oss, which keeps every token).
    #[serde(default)]
    pub sliding_kv: SlidingKv,
}

impl Default for ServingSpace {
    fn default() -> Self {
        ServingSpace {
            top_k: default_top_k(),
            disaggregation: true,
            max_tp: None,
            max_pp: None,
            max_attention_dp: None,
            max_sequences: None,
            allow_tp_cross_domain: false,
            max_candidates: None,
            attention_kernel: AttentionKernel::Flash,
            sliding_kv: SlidingKv::Window,
        }
    }
}

impl ServingSpace {
    /// Range checks of every field.
    pub fn validate(&self) -> Result<()> {
        limits::check("serving_space.top_k", self.top_k)?;
        limits::check_opt("serving_space.max_tp", self.max_tp)?;
        limits::check_opt("serving_space.max_pp", self.max_pp)?;
        limits::check_opt("serving_space.max_attention_dp", self.max_attention_dp)?;
        limits::check_opt("serving_space.max_sequences", self.max_sequences)?;
        limits::check_opt("serving_space.max_candidates", self.max_candidates)?;
        Ok(())
    }
}

/// What the search looked at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ServingSearchStats {
    /// Deployments scored or pruned.
    pub candidates: u64,
    /// Deployments that fit and meet the SLOs.
    pub feasible: u64,
    /// Pruned or rejected deployments by rule.
    pub pruned: BTreeMap<String, u64>,
    pub elapsed_s: f64,
}

/// The ranked deployments, the Pareto front and the statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingSearchResult {
    /// Best first by the objective.
    pub plans: Vec<ServingEvaluation>,
    /// Feasible deployments no other beats on both tokens/s per GPU and tokens/s per user,
    /// fastest per user first.
    pub pareto: Vec<ServingEvaluation>,
    pub stats: ServingSearchStats,
}

/// Worker batches to try: `adp·2^i` up to `cap`, and `cap` itself (multiples of `adp`).
fn batches(adp: u32, cap: u64) -> Vec<u32> {
    let mut out = Vec::new();
    let mut b = adp as u64;
    while b <= cap {
        out.push(b as u32);
        b *= 2;
    }
    let top = cap / adp as u64 * adp as u64;
    if top >= adp as u64 && out.last() != Some(&(top as u32)) {
        out.push(top as u32);
    }
    out
}

/// `value` rounded up to a multiple of `m`.
fn round_up(value: u64, m: u32) -> u64 {
    value.div_ceil(m as u64) * m as u64
}

/// A prefill pool candidate: the worker, its latency and its request rate.
struct PrefillOption {
    worker: Worker,
    latency_s: f64,
    requests_per_s: f64,
}

/// The best deployments of `problem` in `space`.
pub fn search_serving(
    problem: &ServingProblem,
    space: &ServingSpace,
    control: &Control,
) -> Result<ServingSearchResult> {
    let started = Instant::now();
    problem.validate()?;
    space.validate()?;
    space
        .attention_kernel
        .check("serving_space.attention_kernel", &problem.model)?;
    let tm = TimeModel::new(problem);
    let model = &problem.model;
    let n = problem.cluster.num_gpus;
    let domain = problem.cluster.nvlink_domain();
    let degrees = divisors(n);
    let mut stats = ServingSearchStats::default();
    let prune = |stats: &mut ServingSearchStats, rule: &str| {
        stats.candidates += 1;
        *stats.pruned.entry(rule.to_string()).or_insert(0) += 1;
    };
    let experts = model.moe.as_ref().map_or(1, |m| m.num_experts);
    let chunk = constants().max_batched_tokens;
    let new = tm.mix.mean_new;
    let mut scored: Vec<ServingEvaluation> = Vec::new();
    let mut budget = Budget {
        used: 0,
        limit: space.max_candidates.unwrap_or(DEFAULT_MAX_CANDIDATES),
    };
    let max_pp = space.max_pp.unwrap_or(DEFAULT_MAX_PP);
    let mut decode_shapes: Vec<(Worker, u64)> = Vec::new();
    let mut prefill: Vec<PrefillOption> = Vec::new();
    for &tp in &degrees {
        if space.max_tp.is_some_and(|m| tp > m) {
            continue;
        }
        if model.heads % tp != 0 {
            prune(&mut stats, "heads");
            continue;
        }
        if tp > domain && !space.allow_tp_cross_domain {
            prune(&mut stats, "tp_cross_domain");
            continue;
        }
        let adps: Vec<u32> = if model.moe.is_some() {
            degrees.clone()
        } else {
            vec![1]
        };
        for &adp in &adps {
            let stage = tp as u64 * adp as u64;
            if stage > n as u64 || space.max_attention_dp.is_some_and(|m| adp > m) {
                continue;
            }
            for &pp in &degrees {
                if stage * pp as u64 > n as u64 || pp > model.layers || pp > max_pp {
                    continue;
                }
                control.check(started)?;
                for etp in divisors(stage as u32) {
                    let ep = stage as u32 / etp;
                    if experts % ep != 0 || (model.moe.is_none() && ep != 1) {
                        continue;
                    }
                    let shape = Worker {
                        tp,
                        pp,
                        attention_dp: adp,
                        ep,
                        expert_tp: etp,
                        max_sequences: adp,
                        max_batched_tokens: None,
                        kv_tokens: None,
                        output_lag_steps: None,
                        attention_kernel: space.attention_kernel,
                        sliding_kv: space.sliding_kv,
                    };
                    let mut cap = worker_memory(problem, &tm.mix, &shape, adp as f64, chunk)
                        .max_sequences_fit;
                    cap = cap.min(limits::MAX_SEQUENCES as u64);
                    if let Some(m) = space.max_sequences {
                        cap = cap.min(m as u64);
                    }
                    if cap < adp as u64 {
                        prune(&mut stats, "memory");
                        continue;
                    }
                    let most = n as u64 / shape.gpus();
                    scored.extend(aggregated(
                        &tm,
                        space,
                        &shape,
                        cap,
                        most,
                        &mut stats,
                        &mut budget,
                    )?);
                    if space.disaggregation {
                        decode_shapes.push((shape, cap));
                        let bp = round_up(((chunk / new).floor() as u64).max(1), adp).min(cap);
                        let pw = Worker {
                            max_sequences: bp as u32,
                            max_batched_tokens: None,
                            kv_tokens: None,
                            output_lag_steps: None,
                            ..shape
                        };
                        let batch = prompt_batch(&tm, bp as f64 / adp as f64);
                        budget.take()?;
                        let (f, period) = tm.forward(&pw, &batch, false);
                        prefill.push(PrefillOption {
                            worker: pw,
                            latency_s: f.total_s,
                            requests_per_s: bp as f64 / period,
                        });
                    }
                }
            }
        }
    }
    if space.disaggregation && !prefill.is_empty() {
        control.check(started)?;
        scored.extend(disaggregated(
            &tm,
            space,
            &prefill,
            &decode_shapes,
            &mut stats,
            &mut budget,
            (control, started),
        )?);
    }
    for e in &scored {
        stats.candidates += 1;
        if e.feasible {
            stats.feasible += 1;
        } else if let Some(v) = e.violations.first() {
            *stats.pruned.entry(v.rule.clone()).or_insert(0) += 1;
        }
    }
    let mut feasible: Vec<ServingEvaluation> = scored.into_iter().filter(|e| e.feasible).collect();
    let objective = problem.objective;
    feasible.sort_by(|a, b| rank(objective, a, b));
    let pareto = pareto_front(&feasible);
    feasible.truncate(space.top_k as usize);
    stats.elapsed_s = started.elapsed().as_secs_f64();
    Ok(ServingSearchResult {
        plans: feasible,
        pareto,
        stats,
    })
}

/// Best first: the objective, then the other metric, then fewer GPUs, then the label (a total
/// order, so the ranking does not depend on the enumeration).
fn rank(objective: Objective, a: &ServingEvaluation, b: &ServingEvaluation) -> std::cmp::Ordering {
    let by_gpu = b.tokens_per_s_per_gpu.total_cmp(&a.tokens_per_s_per_gpu);
    let by_latency = a.time.e2e_s.total_cmp(&b.time.e2e_s);
    let first = match objective {
        Objective::Throughput => by_gpu.then(by_latency),
        Objective::Latency => by_latency.then(by_gpu),
    };
    first
        .then(a.gpus.cmp(&b.gpus))
        .then_with(|| a.label.cmp(&b.label))
}

/// The feasible deployments no other beats on both tokens/s per GPU and per user.
fn pareto_front(sorted: &[ServingEvaluation]) -> Vec<ServingEvaluation> {
    let mut by_user: Vec<&ServingEvaluation> = sorted.iter().collect();
    by_user.sort_by(|a, b| {
        b.tokens_per_s_per_user
            .total_cmp(&a.tokens_per_s_per_user)
            .then(b.tokens_per_s_per_gpu.total_cmp(&a.tokens_per_s_per_gpu))
    });
    let mut front: Vec<ServingEvaluation> = Vec::new();
    let mut best_gpu = f64::NEG_INFINITY;
    for e in by_user {
        if e.tokens_per_s_per_gpu > best_gpu {
            best_gpu = e.tokens_per_s_per_gpu;
            front.push(e.clone());
        }
    }
    front
}

/// Aggregated deployments of `shape`: every batch up to `cap` on as many replicas as fit, or,
/// with a concurrency target, the target shared over 1, 2, 4, … replicas.
fn aggregated(
    tm: &TimeModel,
    space: &ServingSpace,
    shape: &Worker,
    cap: u64,
    most: u64,
    stats: &mut ServingSearchStats,
    budget: &mut Budget,
) -> Result<Vec<ServingEvaluation>> {
    let mut out = Vec::new();
    let adp = shape.attention_dp;
    match tm.problem.traffic.concurrency {
        None => {
            for b in batches(adp, cap) {
                let plan = ServingPlan {
                    worker: Worker {
                        max_sequences: b,
                        max_batched_tokens: None,
                        kv_tokens: None,
                        output_lag_steps: None,
                        ..*shape
                    },
                    replicas: most as u32,
                    prefill: None,
                    prefill_replicas: 0,
                };
                budget.take()?;
                out.push(score(tm, &plan, space.allow_tp_cross_domain));
            }
        }
        Some(c) => {
            let mut r = 1u64;
            loop {
                let b = round_up((c as u64).div_ceil(r), adp);
                if b > cap {
                    stats.candidates += 1;
                    *stats.pruned.entry("memory".into()).or_insert(0) += 1;
                } else {
                    let plan = ServingPlan {
                        worker: Worker {
                            max_sequences: b as u32,
                            max_batched_tokens: None,
                            kv_tokens: None,
                            output_lag_steps: None,
                            ..*shape
                        },
                        replicas: r as u32,
                        prefill: None,
                        prefill_replicas: 0,
                    };
                    budget.take()?;
                    out.push(score(tm, &plan, space.allow_tp_cross_domain));
                }
                if r == most || b <= adp as u64 {
                    break;
                }
                r = (r * 2).min(most);
            }
        }
    }
    Ok(out)
}

/// Disaggregated deployments: each decode shape and batch (or, with a concurrency target, each
/// decode pool size) paired with the prefill pools of the highest request rate per GPU and of
/// the shortest latency, the prefill pool sized to the decode pool's request rate.
fn disaggregated(
    tm: &TimeModel,
    space: &ServingSpace,
    prefill: &[PrefillOption],
    decode_shapes: &[(Worker, u64)],
    stats: &mut ServingSearchStats,
    budget: &mut Budget,
    (control, started): (&Control, Instant),
) -> Result<Vec<ServingEvaluation>> {
    let p = tm.problem;
    let n = p.cluster.num_gpus as u64;
    let mix = &tm.mix;
    let osl = mix.mean_output;
    let ttft_ok = |o: &&PrefillOption| p.slo.ttft_s.is_none_or(|t| o.latency_s <= t);
    let per_gpu = |o: &PrefillOption| o.requests_per_s / o.worker.gpus() as f64;
    // A prefill worker that leaves no GPUs for the smallest decode worker pairs with none.
    let smallest_decode = decode_shapes
        .iter()
        .map(|(w, _)| w.gpus())
        .min()
        .unwrap_or(n);
    let fits = |o: &&PrefillOption| o.worker.gpus() + smallest_decode <= n;
    let mut picks: Vec<&PrefillOption> = Vec::new();
    if let Some(best) = prefill
        .iter()
        .filter(fits)
        .filter(ttft_ok)
        .max_by(|a, b| per_gpu(a).total_cmp(&per_gpu(b)))
    {
        picks.push(best);
    }
    if let Some(fast) = prefill
        .iter()
        .filter(fits)
        .min_by(|a, b| a.latency_s.total_cmp(&b.latency_s))
    {
        if picks.first().is_none_or(|b| b.worker != fast.worker) {
            picks.push(fast);
        }
    }
    let mut out = Vec::new();
    for (shape, cap) in decode_shapes {
        control.check(started)?;
        let gd = shape.gpus();
        let adp = shape.attention_dp;
        // (decode workers, batch) pairs to try.
        let mut pools: Vec<(u64, u64)> = Vec::new();
        match p.traffic.concurrency {
            None => {
                for b in batches(adp, *cap) {
                    pools.push((0, b as u64));
                }
            }
            Some(c) => {
                let mut y = 1u64;
                while y * gd < n {
                    let b = round_up((c as u64).div_ceil(y), adp);
                    if b <= *cap {
                        pools.push((y, b));
                    } else {
                        stats.candidates += 1;
                        *stats.pruned.entry("memory".into()).or_insert(0) += 1;
                    }
                    y *= 2;
                }
            }
        }
        for (y_fixed, b) in pools {
            let decode = Worker {
                max_sequences: b as u32,
                max_batched_tokens: None,
                kv_tokens: None,
                output_lag_steps: None,
                ..*shape
            };
            let step = Batch::decode(b as f64 / adp as f64, mix.decode_context);
            budget.take()?;
            let (_, tpot) = tm.forward(&decode, &step, true);
            let decode_rate = b as f64 / (osl * tpot);
            for pf in &picks {
                let gp = pf.worker.gpus();
                let Some((x, y)) = pool_sizes(n, gp, gd, pf.requests_per_s, decode_rate, y_fixed)
                else {
                    continue;
                };
                let plan = ServingPlan {
                    worker: decode,
                    replicas: y as u32,
                    prefill: Some(pf.worker),
                    prefill_replicas: x as u32,
                };
                budget.take()?;
                out.push(score(tm, &plan, space.allow_tp_cross_domain));
            }
        }
    }
    Ok(out)
}

/// Prefill and decode worker counts `(x, y)` on at most `n` GPUs (`gp`, `gd` each) that
/// maximise the request rate `min(x·rp, y·rd)`, fewest GPUs among equals; `y` fixed when
/// `y_fixed > 0`.
fn pool_sizes(n: u64, gp: u64, gd: u64, rp: f64, rd: f64, y_fixed: u64) -> Option<(u64, u64)> {
    if y_fixed > 0 {
        let room = n.checked_sub(y_fixed * gd)?;
        let most = room / gp;
        if most == 0 {
            return None;
        }
        let want = ((y_fixed as f64 * rd / rp).ceil() as u64).clamp(1, most);
        return Some((want, y_fixed));
    }
    let mut best: Option<(f64, u64, u64, u64)> = None;
    let mut x = 1u64;
    while x * gp + gd <= n {
        let y = (n - x * gp) / gd;
        // Fewest decode workers reaching this prefill rate.
        let y = y.min(((x as f64 * rp / rd).ceil() as u64).max(1));
        let rate = (x as f64 * rp).min(y as f64 * rd);
        let used = x * gp + y * gd;
        if best.is_none_or(|(r, u, _, _)| rate > r * (1.0 + 1e-12) || (rate >= r && used < u)) {
            best = Some((rate, used, x, y));
        }
        x += 1;
    }
    best.map(|(_, _, x, y)| (x, y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Precision;

    fn problem(model: &str, gpu: &str, n: u32) -> ServingProblem {
        let mut p = crate::serving::problem::tests::problem(model, gpu, n);
        p.traffic.input_len = 2048;
        p.traffic.output_len = 512;
        p
    }

    #[test]
    fn divisors_and_batches() {
        assert_eq!(divisors(12), [1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), [1]);
        assert_eq!(batches(1, 5), [1, 2, 4, 5]);
        assert_eq!(batches(4, 20), [4, 8, 16, 20]);
        assert_eq!(batches(4, 3), Vec::<u32>::new());
    }

    #[test]
    fn a_space_past_max_candidates_is_refused() {
        let p = problem("deepseek-v3", "h200-sxm", 64);
        let space = ServingSpace {
            max_candidates: Some(100),
            ..ServingSpace::default()
        };
        let e = search_serving(&p, &space, &Control::default()).unwrap_err();
        assert!(matches!(e, Error::SpaceTooLarge { limit: 100, .. }), "{e}");
    }

    #[test]
    fn pool_sizes_match_the_rates() {
        // Prefill 10 req/s per 8-GPU worker, decode 5 req/s per 8-GPU worker, 64 GPUs: 3P5D
        // gives min(30, 25) = 25; 2P6D min(20, 30) = 20; 3P5D is best.
        assert_eq!(pool_sizes(64, 8, 8, 10.0, 5.0, 0), Some((3, 5)));
        assert_eq!(pool_sizes(64, 8, 8, 10.0, 5.0, 4), Some((2, 4)));
        assert_eq!(pool_sizes(8, 8, 8, 10.0, 5.0, 0), None);
    }

    #[test]
    fn llama70b_batch_one_latency_picks_tp_within_the_node() {
        let mut p = problem("llama3-70b", "h100-sxm", 8);
        p.traffic.concurrency = Some(1);
        p.objective = Objective::Latency;
        let r = search_serving(&p, &ServingSpace::default(), &Control::default()).unwrap();
        let best = &r.plans[0];
        assert_eq!(best.plan.worker.tp, 8, "{}", best.label);
        assert_eq!(best.plan.worker.pp, 1);
        assert!(best.plan.prefill.is_none(), "{}", best.label);
        // TP8 is faster per token than any TP4 deployment.
        let tp4 = r
            .plans
            .iter()
            .find(|e| e.plan.worker.tp == 4 && e.plan.prefill.is_none())
            .unwrap();
        assert!(best.time.tpot_s < tp4.time.tpot_s);
    }

    #[test]
    fn a_throughput_target_picks_replicas_of_a_smaller_tp() {
        let mut p = problem("llama3-70b", "h100-sxm", 8);
        p.traffic.concurrency = Some(256);
        p.traffic.request_rate = Some(1.0);
        let space = ServingSpace {
            disaggregation: false,
            ..ServingSpace::default()
        };
        let r = search_serving(&p, &space, &Control::default()).unwrap();
        let best = &r.plans[0];
        assert!(best.plan.worker.tp < 8, "{}", best.label);
        assert!(best.plan.replicas > 1, "{}", best.label);
        // Every deployment serves the target rate, and the single TP8 worker is among them.
        assert!(r.plans.iter().all(|e| e.requests_per_s >= 1.0));
        let tp8 = r.plans.iter().find(|e| e.plan.worker.tp == 8).unwrap();
        assert!(tp8.tokens_per_s_per_gpu < best.tokens_per_s_per_gpu);
    }

    #[test]
    fn the_pareto_front_trades_per_gpu_throughput_for_per_user_speed() {
        let p = problem("llama3-8b", "h100-sxm", 8);
        let r = search_serving(&p, &ServingSpace::default(), &Control::default()).unwrap();
        assert!(r.pareto.len() >= 3, "{}", r.pareto.len());
        for pair in r.pareto.windows(2) {
            assert!(pair[0].tokens_per_s_per_user >= pair[1].tokens_per_s_per_user);
            assert!(pair[0].tokens_per_s_per_gpu < pair[1].tokens_per_s_per_gpu);
        }
        // No feasible deployment lies beyond the front.
        for e in &r.plans {
            assert!(r
                .pareto
                .iter()
                .any(|f| f.tokens_per_s_per_gpu >= e.tokens_per_s_per_gpu
                    && f.tokens_per_s_per_user >= e.tokens_per_s_per_user));
        }
    }

    #[test]
    fn deepseek_v3_on_16_gpus_considers_attention_dp_with_ep() {
        let mut p = problem("deepseek-v3", "h200-sxm", 16);
        p.weight_precision = Precision::Fp8;
        p.slo.tpot_s = Some(0.1);
        let space = ServingSpace {
            top_k: 1000,
            ..ServingSpace::default()
        };
        let r = search_serving(&p, &space, &Control::default()).unwrap();
        assert!(!r.plans.is_empty());
        assert!(r
            .plans
            .iter()
            .any(|e| e.plan.worker.attention_dp > 1 && e.plan.worker.ep > 1));
        assert!(r.plans.iter().any(|e| e.plan.prefill.is_some()));
        let best = &r.plans[0];
        assert!(best.plan.worker.ep > 1, "{}", best.label);
    }

    #[test]
    fn a_space_prices_every_deployment_with_its_attention_kernel() {
        // SGLang 0.4's Triton MLA backend: every deployment scored carries the kernel, and the
        // absorbed prefill over all 128 heads of one attention-DP rank costs more than over a
        // TP group's 16 heads each.
        let mut p = problem("deepseek-v3", "h200-sxm", 8);
        p.weight_precision = Precision::Fp8;
        p.traffic.input_len = 8192;
        p.traffic.output_len = 256;
        let flash = ServingSpace {
            top_k: 1000,
            ..ServingSpace::default()
        };
        let triton = ServingSpace {
            attention_kernel: AttentionKernel::TritonMla,
            ..flash.clone()
        };
        let f = search_serving(&p, &flash, &Control::default()).unwrap();
        let t = search_serving(&p, &triton, &Control::default()).unwrap();
        assert_eq!(f.stats.candidates, t.stats.candidates);
        assert!(t.plans.iter().all(|e| {
            e.plan.worker.attention_kernel == AttentionKernel::TritonMla
                && e.plan
                    .prefill
                    .is_none_or(|w| w.attention_kernel == AttentionKernel::TritonMla)
        }));
        let ttft = |r: &ServingSearchResult, tp: u32, adp: u32| {
            r.plans
                .iter()
                .find(|e| {
                    e.plan.prefill.is_none()
                        && e.plan.worker.tp == tp
                        && e.plan.worker.attention_dp == adp
                        && e.plan.worker.max_sequences == 8
                })
                .map(|e| e.time.ttft_s)
                .unwrap()
        };
        let tp8 = ttft(&t, 8, 1) / ttft(&f, 8, 1);
        let adp8 = ttft(&t, 1, 8) / ttft(&f, 1, 8);
        assert!(tp8 > 1.0 && adp8 > tp8, "tp8 x{tp8}, adp8 x{adp8}");
        // A model without latent attention has no Triton MLA backend to run.
        let gqa = problem("llama3-70b", "h100-sxm", 8);
        let e = search_serving(&gqa, &triton, &Control::default()).unwrap_err();
        assert!(
            e.to_string().contains("serving_space.attention_kernel"),
            "{e}"
        );
    }

    #[test]
    fn a_space_sizes_every_kv_pool_as_the_engine_keeps_it() {
        // gpt-oss-120b (MXFP4 experts) on 8 x H200 at 32k-token prompts: a pool that keeps every
        // token of the 18 sliding-window layers (SGLang's) holds fewer sequences per worker,
        // and every deployment scored, prefill pools included, carries it.
        let mut p = problem("gpt-oss-120b", "h200-sxm", 8);
        p.expert_weights = Some(crate::serving::ExpertWeights::Mxfp4);
        p.traffic.input_len = 32768;
        p.traffic.output_len = 1024;
        let window = ServingSpace {
            top_k: 1000,
            ..ServingSpace::default()
        };
        let full = ServingSpace {
            sliding_kv: SlidingKv::Full,
            ..window.clone()
        };
        let w = search_serving(&p, &window, &Control::default()).unwrap();
        let f = search_serving(&p, &full, &Control::default()).unwrap();
        assert!(f.plans.iter().all(|e| {
            e.plan.worker.sliding_kv == SlidingKv::Full
                && e.plan
                    .prefill
                    .is_none_or(|w| w.sliding_kv == SlidingKv::Full)
        }));
        assert!(w
            .plans
            .iter()
            .all(|e| e.plan.worker.sliding_kv == SlidingKv::Window));
        let most = |r: &ServingSearchResult| {
            r.plans
                .iter()
                .filter(|e| e.plan.worker.tp == 1 && e.plan.prefill.is_none())
                .map(|e| e.memory.max_sequences_fit)
                .max()
                .unwrap()
        };
        assert!(most(&f) < most(&w), "{} vs {}", most(&f), most(&w));
    }
}

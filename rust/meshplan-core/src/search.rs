//! Enumerates every plan of a search space, prunes what cannot run with counted reasons, scores
//! the rest and keeps the best `top_k` (DESIGN "Flow of one query").
//!
//! Outer tuples `(dp, tp, pp, ep, cp)` with product `N` are scored in parallel (rayon) and merged
//! deterministically: the ranking is by tokens/s per GPU, ties broken by the plan's fields, so the
//! result does not depend on the thread count. Work is skipped, never changed: a tuple whose
//! memory lower bound (smallest micro-batch, highest allowed ZeRO stage, least-storing recompute,
//! sequence parallel, 1F1B) already exceeds the capacity is not scored, and its plans are still
//! counted under the rule that removes them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::evaluate::{memory_capacity_gib, micro_batches, peak_memory, score, structural_rules};
use crate::layout::Groups;
use crate::plan::{Plan, RankOrder, Recompute, Schedule};
use crate::report::{Evaluation, SearchResult, SearchStats};
use crate::space::{Degree, SearchSpace};
use crate::stages::{stages, Stage};
use crate::time::TimeContext;
use crate::Problem;

/// How a caller steers a long search: a cancel flag polled by the workers, a deadline, and the
/// number of worker threads (`None`: `MESHPLAN_THREADS`, else all cores).
#[derive(Debug, Clone, Default)]
pub struct Control {
    pub cancel: Option<Arc<AtomicBool>>,
    pub deadline: Option<Instant>,
    pub threads: Option<usize>,
}

impl Control {
    fn check(&self, started: Instant) -> Result<()> {
        if self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(AtomicOrdering::Relaxed))
        {
            return Err(Error::Cancelled);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::DeadlineExceeded {
                elapsed_s: started.elapsed().as_secs_f64(),
            });
        }
        Ok(())
    }

    fn thread_count(&self) -> Result<usize> {
        if let Some(n) = self.threads {
            if n == 0 {
                return Err(Error::invalid("threads", 0, "an integer >= 1"));
            }
            return Ok(n);
        }
        if let Ok(v) = std::env::var("MESHPLAN_THREADS") {
            return match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(Error::invalid("MESHPLAN_THREADS", v, "an integer >= 1")),
            };
        }
        Ok(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// Divisors of `n` in increasing order.
fn divisors(n: u32) -> Vec<u32> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1u32;
    while (i as u64) * (i as u64) <= n as u64 {
        if n % i == 0 {
            small.push(i);
            if i != n / i {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// The knob values a space allows for one outer tuple.
struct Knobs {
    micro_batches: Vec<u32>,
    /// (schedule, vpp) pairs.
    schedules: Vec<(Schedule, u32)>,
    zero: Vec<u8>,
    recompute: Vec<Recompute>,
    sequence_parallel: Vec<bool>,
}

impl Knobs {
    fn count(&self) -> u64 {
        (self.micro_batches.len()
            * self.schedules.len()
            * self.zero.len()
            * self.recompute.len()
            * self.sequence_parallel.len()) as u64
    }
}

fn degree_values(d: &Degree, upper: u32) -> Vec<u32> {
    (1..=upper).filter(|v| d.allows(*v)).collect()
}

fn knobs(problem: &Problem, space: &SearchSpace, [dp, tp, pp, ep, cp]: [u32; 5]) -> Knobs {
    let mb_upper = space
        .micro_batch
        .fixed
        .or(space.micro_batch.max)
        .unwrap_or(crate::space::DEFAULT_MAX_MICRO_BATCH)
        .min(problem.workload.global_batch);
    let vpp_upper = space
        .vpp
        .fixed
        .or(space.vpp.max)
        .unwrap_or(crate::space::DEFAULT_MAX_VPP);
    let mut schedules = Vec::new();
    for &s in &space.schedules {
        match s {
            Schedule::OneFOneB if space.vpp.allows(1) => schedules.push((s, 1)),
            Schedule::ZeroBubbleH1 if pp > 1 && space.vpp.allows(1) => schedules.push((s, 1)),
            Schedule::Interleaved if pp > 1 => schedules.extend(
                degree_values(&space.vpp, vpp_upper)
                    .into_iter()
                    .filter(|v| *v >= 2)
                    .map(|v| (s, v)),
            ),
            _ => {}
        }
    }
    schedules.sort();
    schedules.dedup();
    let mut zero = space.zero.clone();
    zero.sort();
    zero.dedup();
    if dp * ep * cp == 1 {
        // Nothing to shard over: every ZeRO stage is the same plan; keep the lowest allowed.
        zero.truncate(1);
    }
    let mut recompute = space.recompute.clone();
    recompute.sort();
    recompute.dedup();
    let mut sequence_parallel: Vec<bool> = if tp > 1 {
        space.sequence_parallel.clone()
    } else {
        vec![false]
    };
    sequence_parallel.sort();
    sequence_parallel.dedup();
    Knobs {
        micro_batches: degree_values(&space.micro_batch, mb_upper),
        schedules,
        zero,
        recompute,
        sequence_parallel,
    }
}

/// Outer tuples `(dp, tp, pp, ep, cp)` with product `N` allowed by the space, in a fixed order.
fn outer_tuples(problem: &Problem, space: &SearchSpace) -> Vec<[u32; 5]> {
    let n = problem.cluster.num_gpus;
    let divs = divisors(n);
    let is_moe = problem.model.is_moe();
    let mut out = Vec::new();
    for &tp in divs.iter().filter(|v| space.tp.allows(**v)) {
        for &pp in divs
            .iter()
            .filter(|v| space.pp.allows(**v) && (n / tp) % **v == 0)
        {
            let rest = n / tp / pp;
            for &cp in divs
                .iter()
                .filter(|v| space.cp.allows(**v) && rest % **v == 0)
            {
                let rest = rest / cp;
                for &ep in divs
                    .iter()
                    .filter(|v| space.ep.allows(**v) && rest % **v == 0)
                {
                    if !is_moe && ep > 1 {
                        continue; // ep = 1 for dense models: not part of their space
                    }
                    let dp = rest / ep;
                    if space.dp.allows(dp) {
                        out.push([dp, tp, pp, ep, cp]);
                    }
                }
            }
        }
    }
    out
}

/// Total order of plans: best tokens/s first, then by fields.
fn rank_order(a: &Evaluation, b: &Evaluation) -> Ordering {
    b.tokens_per_s_per_gpu
        .total_cmp(&a.tokens_per_s_per_gpu)
        .then_with(|| plan_key(&a.plan).cmp(&plan_key(&b.plan)))
}

type PlanKey = (
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u8,
    Recompute,
    bool,
    Schedule,
    RankOrder,
);

fn plan_key(p: &Plan) -> PlanKey {
    (
        p.tp,
        p.pp,
        p.cp,
        p.ep,
        p.dp,
        p.vpp,
        p.micro_batch,
        p.zero,
        p.recompute,
        p.sequence_parallel,
        p.schedule(),
        p.order,
    )
}

/// The orders of `space` worth trying for the degree tuple of `base`, with their groups: an
/// order whose groups equal those of an order listed before it would cost every plan the same,
/// so it is skipped (with the default `orders`, exactly one).
fn distinct_orders(
    problem: &Problem,
    space: &SearchSpace,
    base: &Plan,
) -> Vec<(RankOrder, Groups)> {
    let domain = problem.cluster.nvlink_domain();
    let mut out: Vec<(RankOrder, Groups)> = Vec::with_capacity(1);
    for &order in &space.orders {
        let groups = Groups::of(
            &Plan {
                order,
                ..base.clone()
            },
            domain,
        );
        if !out.iter().any(|(_, g)| *g == groups) {
            out.push((order, groups));
        }
    }
    out
}

/// The plan with degrees `[dp, tp, pp, ep, cp]` and every knob at its first value.
fn base_plan([dp, tp, pp, ep, cp]: [u32; 5]) -> Plan {
    Plan {
        dp,
        tp,
        pp,
        ep,
        cp,
        vpp: 1,
        micro_batch: 1,
        zero: 0,
        recompute: Recompute::None,
        sequence_parallel: false,
        schedule: Some(Schedule::OneFOneB),
        order: RankOrder::DEFAULT,
    }
}

/// Best-`k` list kept sorted; O(k) memory.
struct TopK {
    k: usize,
    plans: Vec<Evaluation>,
}

impl TopK {
    fn new(k: usize) -> Self {
        TopK {
            k,
            plans: Vec::with_capacity(k + 1),
        }
    }

    fn would_accept(&self, tokens_per_s: f64) -> bool {
        self.plans.len() < self.k
            || self
                .plans
                .last()
                .is_some_and(|w| tokens_per_s >= w.tokens_per_s_per_gpu)
    }

    fn push(&mut self, e: Evaluation) {
        let pos = self
            .plans
            .partition_point(|x| rank_order(x, &e) == Ordering::Less);
        if pos < self.k {
            self.plans.insert(pos, e);
            self.plans.truncate(self.k);
        }
    }

    fn merge(mut self, other: TopK) -> TopK {
        for e in other.plans {
            self.push(e);
        }
        self
    }
}

/// What one outer tuple contributes.
struct Partial {
    top: TopK,
    /// Feasible plans strictly faster than [`Searcher::faster_than`].
    faster: u64,
    candidates: u64,
    feasible: u64,
    pruned: BTreeMap<&'static str, u64>,
}

impl Partial {
    fn merge(mut self, other: Partial) -> Partial {
        self.top = self.top.merge(other.top);
        self.faster += other.faster;
        self.candidates += other.candidates;
        self.feasible += other.feasible;
        for (k, v) in other.pruned {
            *self.pruned.entry(k).or_default() += v;
        }
        self
    }
}

struct Searcher<'a> {
    problem: &'a Problem,
    space: &'a SearchSpace,
    capacity_gib: f64,
    control: &'a Control,
    started: Instant,
    faster_than: Option<f64>,
}

impl Searcher<'_> {
    fn first_structural(&self, plan: &Plan, groups: &Groups) -> Option<&'static str> {
        let mut first = None;
        structural_rules(self.problem, plan, self.space, groups, &mut |rule, _| {
            first = Some(rule);
            false
        });
        first
    }

    /// The least memory any plan of this tuple can need (see the module docs).
    fn memory_lower_bound(
        &self,
        base: &Plan,
        knobs: &Knobs,
        groups: &Groups,
        stages: &[Stage],
    ) -> f64 {
        let plan = Plan {
            micro_batch: knobs.micro_batches[0],
            zero: *knobs.zero.iter().max().unwrap_or(&0),
            recompute: if knobs.recompute.contains(&Recompute::Full) {
                Recompute::Full
            } else {
                knobs.recompute[0]
            },
            sequence_parallel: knobs.sequence_parallel.contains(&true),
            vpp: 1,
            schedule: Some(Schedule::OneFOneB),
            ..base.clone()
        };
        let m = micro_batches(self.problem, &plan);
        peak_memory(self.problem, &plan, groups, stages, m)
            .0
            .total()
    }

    fn tuple(&self, degrees: [u32; 5]) -> Result<Partial> {
        self.control.check(self.started)?;
        let k = self.space.top_k as usize;
        let mut part = Partial {
            top: TopK::new(k),
            faster: 0,
            candidates: 0,
            feasible: 0,
            pruned: BTreeMap::new(),
        };
        let knobs = knobs(self.problem, self.space, degrees);
        if knobs.count() == 0 {
            return Ok(part);
        }
        let pp = degrees[2];
        let stage_list = stages(&self.problem.model, pp);
        for (order, groups) in distinct_orders(self.problem, self.space, &base_plan(degrees)) {
            part.candidates += knobs.count();
            let base = Plan {
                order,
                ..base_plan(degrees)
            };
            self.score_knobs(&mut part, &base, &knobs, &groups, &stage_list)?;
        }
        Ok(part)
    }

    /// Scores every knob combination of `base` (one degree tuple, one rank order) into `part`.
    fn score_knobs(
        &self,
        part: &mut Partial,
        base: &Plan,
        knobs: &Knobs,
        groups: &Groups,
        stage_list: &[Stage],
    ) -> Result<()> {
        let groups = *groups;
        let hopeless = base.pp <= self.problem.model.layers + 2
            && self.memory_lower_bound(base, knobs, &groups, stage_list) > self.capacity_gib;

        for &b in &knobs.micro_batches {
            self.control.check(self.started)?;
            for &sp in &knobs.sequence_parallel {
                for &rec in &knobs.recompute {
                    let mut layer_times = None;
                    for &(schedule, vpp) in &knobs.schedules {
                        for &zero in &knobs.zero {
                            let plan = Plan {
                                micro_batch: b,
                                sequence_parallel: sp,
                                recompute: rec,
                                schedule: Some(schedule),
                                vpp,
                                zero,
                                ..base.clone()
                            };
                            if let Some(rule) = self.first_structural(&plan, &groups) {
                                *part.pruned.entry(rule).or_default() += 1;
                                continue;
                            }
                            if hopeless {
                                *part.pruned.entry("memory").or_default() += 1;
                                continue;
                            }
                            let m = micro_batches(self.problem, &plan);
                            let (memory, worst) =
                                peak_memory(self.problem, &plan, &groups, stage_list, m);
                            if memory.total() > self.capacity_gib {
                                *part.pruned.entry("memory").or_default() += 1;
                                continue;
                            }
                            part.feasible += 1;
                            let ctx = TimeContext::new(self.problem, &plan, groups);
                            let (dense, moe) = *layer_times.get_or_insert_with(|| ctx.layers());
                            let time = ctx.step_with(stage_list, m, &dense, &moe);
                            let tokens_per_s = self.problem.workload.tokens_per_step()
                                / (time.total() * self.problem.cluster.num_gpus as f64);
                            if self.faster_than.is_some_and(|t| tokens_per_s > t) {
                                part.faster += 1;
                            }
                            if part.top.would_accept(tokens_per_s) {
                                part.top.push(score(
                                    self.problem,
                                    plan,
                                    groups,
                                    stage_list,
                                    m,
                                    memory,
                                    worst,
                                    Vec::new(),
                                ));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Searches `space` for the best plans of `problem`.
pub fn search(problem: &Problem, space: &SearchSpace, control: &Control) -> Result<SearchResult> {
    run(problem, space, control, None).map(|(r, _)| r)
}

/// [`search`], also counting the feasible plans predicted strictly faster than
/// `tokens_per_s_per_gpu` (how a given plan ranks among all feasible plans).
pub fn search_counting_faster(
    problem: &Problem,
    space: &SearchSpace,
    control: &Control,
    tokens_per_s_per_gpu: f64,
) -> Result<(SearchResult, u64)> {
    run(problem, space, control, Some(tokens_per_s_per_gpu))
}

fn run(
    problem: &Problem,
    space: &SearchSpace,
    control: &Control,
    faster_than: Option<f64>,
) -> Result<(SearchResult, u64)> {
    let started = Instant::now();
    space.validate()?;
    let threads = control.thread_count()?;
    let tuples = outer_tuples(problem, space);
    if let Some(limit) = space.max_candidates {
        let candidates: u64 = tuples
            .iter()
            .map(|t| {
                let orders = if space.orders.len() > 1 {
                    distinct_orders(problem, space, &base_plan(*t)).len() as u64
                } else {
                    1
                };
                knobs(problem, space, *t).count() * orders
            })
            .sum();
        if candidates > limit {
            return Err(Error::SpaceTooLarge { candidates, limit });
        }
    }
    let searcher = Searcher {
        problem,
        space,
        capacity_gib: memory_capacity_gib(problem, space),
        control,
        started,
        faster_than,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| {
            Error::invalid(
                "threads",
                threads,
                format!("a thread count the OS accepts ({e})"),
            )
        })?;
    let empty = || Partial {
        top: TopK::new(space.top_k as usize),
        faster: 0,
        candidates: 0,
        feasible: 0,
        pruned: BTreeMap::new(),
    };
    let total = pool.install(|| {
        tuples
            .par_iter()
            .map(|t| searcher.tuple(*t))
            .try_reduce(empty, |a, b| Ok(a.merge(b)))
    })?;
    let mut plans = total.top.plans;
    for (i, p) in plans.iter_mut().enumerate() {
        p.rank = Some(i as u32 + 1);
    }
    let result = SearchResult {
        plans,
        stats: SearchStats {
            candidates: total.candidates,
            feasible: total.feasible,
            pruned: total
                .pruned
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            elapsed_s: started.elapsed().as_secs_f64(),
            threads: threads as u32,
        },
    };
    Ok((result, total.faster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_are_sorted_and_complete() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(16384).len(), 15);
    }
}

//! Enumerates every plan of a search space, prunes what cannot run with counted reasons, scores
//! the rest and keeps the best `top_k` (DESIGN "Flow of one query"), or every feasible plan as
//! columns ([`feasible_space`]); [`search_many`] runs a batch of searches on one pool.
//!
//! Outer tuples `(dp, tp, pp, ep, cp)` with product `N` are scored in parallel (rayon) and merged
//! deterministically: the ranking is by tokens/s per GPU, ties broken by the plan's fields, so the
//! result does not depend on the thread count.
//!
//! Work is skipped or shared, never changed: every number is computed by the same evaluation
//! levels (`levels`: degrees → micro-batch/SP/recompute → schedule) that `evaluate` runs once,
//! here built once per key and reused, so a plan's memory and step time are bit for bit those of
//! `evaluate` (`tests/snapshot.rs`, `tests/feasible.rs`). Pruning counts each rule's verdict at
//! its [`crate::rules::Scope`].
//! - The structural rules depend on the degrees, rank order, micro-batch and schedule only, so
//!   they run once per (micro-batch, schedule) cell and count the cell's ZeRO × recompute ×
//!   sequence-parallel plans together.
//! - A tuple whose memory lower bound (smallest micro-batch, highest allowed ZeRO stage,
//!   least-storing recompute, sequence parallel, 1F1B) already exceeds the capacity is not scored;
//!   within a tuple, a (micro-batch, sequence parallel, recompute, ZeRO) whose 1F1B memory exceeds
//!   it is not either (no schedule holds fewer micro-batches on any rank). Their plans are still
//!   counted under the rule that removes them.
//! - Per tuple: pipeline ranks grouped by shape (the first rank of a shape has its peak memory),
//!   parameters and model states per shape; per rank order the DP/ZeRO collectives and the
//!   optimizer step per ZeRO stage; per (micro-batch, sequence parallel, recompute) the layer and
//!   stage times, the pipeline sums and the exposed DP time. A plan then costs a few dozen
//!   floating-point operations and no allocation.
//! - Only the kept plans are evaluated in full (breakdowns, worst stage) at the end.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::evaluate::{memory_capacity_gib, metrics, micro_batches, score, structural_rules};
use crate::feasible::{Codes, FeasibleSpace, Row, Rows};
use crate::layout::Groups;
use crate::levels::{DegreeLevel, KnobLevel, KnobTimes, Pipeline};
use crate::memory::layer_activations;
use crate::plan::{CpExchange, Dispatcher, Plan, RankOrder, Recompute, RecomputeModules, Schedule};
use crate::report::{Evaluation, SearchResult, SearchStats};
use crate::rules::{PruneCounts, Rule, Scope};
use crate::space::{Degree, SearchSpace};
use crate::stages::in_flight_of;
use crate::time::{LayerParts, TimeContext};
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
    /// `Err(Cancelled)` once the cancel flag is raised, `Err(DeadlineExceeded)` once the
    /// deadline has passed (`started`: when the call began, for the elapsed time it reports).
    pub fn check(&self, started: Instant) -> Result<()> {
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
        let limit = crate::limits::get("threads");
        if let Some(n) = self.threads {
            limit.check("threads", n as u64)?;
            return Ok(n);
        }
        if let Ok(v) = std::env::var("MESHPLAN_THREADS") {
            return match v.trim().parse::<usize>() {
                Ok(n) if limit.contains(n as u64) => Ok(n),
                _ => Err(Error::invalid("MESHPLAN_THREADS", v, limit.allowed())),
            };
        }
        Ok(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// Divisors of `n` in increasing order (the training and serving searches both enumerate them).
pub(crate) fn divisors(n: u32) -> Vec<u32> {
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
    /// Recompute modes, `selective` once per module set of `space.recompute_modules`.
    recompute: Vec<RecomputeKnob>,
    sequence_parallel: Vec<bool>,
}

/// A recompute mode and, for `selective`, its modules ([`Plan::recompute_modules`]).
type RecomputeKnob = (Recompute, Option<RecomputeModules>);

impl Knobs {
    /// Plans of one (micro-batch, schedule) cell: ZeRO × recompute × sequence parallel.
    fn per_cell(&self) -> u64 {
        (self.zero.len() * self.recompute.len() * self.sequence_parallel.len()) as u64
    }

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

/// The degrees of an outer tuple, `dp·tp·pp·ep·cp = N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Degrees {
    dp: u32,
    tp: u32,
    pp: u32,
    ep: u32,
    cp: u32,
    /// A folded plan's expert TP (`dp` is then the dense data parallelism, [`Plan::etp`]).
    etp: Option<u32>,
    /// The MoE dispatcher of a plan with `ep > 1` ([`Plan::dispatcher`]).
    dispatcher: Option<Dispatcher>,
    /// EP communication overlap ([`Plan::ep_overlap`]).
    ep_overlap: bool,
    /// The CP exchange of a plan with `cp > 1` ([`Plan::cp_exchange`]; `None`: the stack's
    /// default, what a space without `cp_exchanges` tries).
    cp_exchange: Option<CpExchange>,
}

impl Degrees {
    /// The tuple with its MoE token exchange still to choose ([`with_ep_comm`]).
    fn new([dp, tp, pp, ep, cp]: [u32; 5], etp: Option<u32>) -> Self {
        Degrees {
            dp,
            tp,
            pp,
            ep,
            cp,
            etp,
            dispatcher: None,
            ep_overlap: false,
            cp_exchange: None,
        }
    }
}

fn knobs(problem: &Problem, space: &SearchSpace, degrees: Degrees) -> Knobs {
    let Degrees { tp, pp, .. } = degrees;
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
    let base = base_plan(degrees);
    if base.dense_dp() as u64 * base.cp as u64 == 1 && base.expert_dp() == 1 {
        // Nothing to shard over: every ZeRO stage is the same plan; keep the lowest allowed.
        zero.truncate(1);
    }
    let mut modes = space.recompute.clone();
    modes.sort();
    modes.dedup();
    // Selective recompute once per module set asked for (Megatron's default core_attn alone is
    // the plan without modules); without sets, as it always was.
    let mut sets: Vec<Option<RecomputeModules>> = space
        .recompute_modules
        .iter()
        .map(|&m| (m != RecomputeModules::CORE_ATTN).then_some(m))
        .collect();
    sets.sort();
    sets.dedup();
    let mut recompute: Vec<RecomputeKnob> = Vec::with_capacity(modes.len() + sets.len());
    for r in modes {
        if r == Recompute::Selective && !sets.is_empty() {
            recompute.extend(sets.iter().map(|&m| (r, m)));
        } else {
            recompute.push((r, None));
        }
    }
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

/// Outer tuples `(dp, tp, pp, ep, cp)` with product `N` allowed by the space, in a fixed order;
/// for an MoE model with `space.fold`, after each `(tp, pp, cp)` its folded tuples
/// ([`folded_tuples`]).
fn outer_tuples(problem: &Problem, space: &SearchSpace) -> Vec<Degrees> {
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
                    if space.dp.allows(dp) && (!is_moe || space.etp.allows(tp)) {
                        out.push(Degrees::new([dp, tp, pp, ep, cp], None));
                    }
                }
                if let (Some(moe), true) = (&problem.model.moe, space.fold) {
                    folded_tuples(space, moe.num_experts, &divs, [tp, pp, cp, rest], &mut out);
                }
            }
        }
    }
    out
}

/// The values of a space's knob list, each once, in their first order: a list that repeats a
/// value (a client may send any number of entries) must not multiply the plans tried.
fn distinct<T: Copy + PartialEq>(values: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for &v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// `tuples` with every MoE token-exchange variant the space allows for a plan with `ep > 1`:
/// each of `space.dispatchers` (empty: the stack's default) with each of `space.ep_overlap`
/// (empty: the stack's default), those the stack offers; `ep = 1` tuples exchange nothing.
fn with_ep_comm(problem: &Problem, space: &SearchSpace, tuples: Vec<Degrees>) -> Vec<Degrees> {
    let stack = problem.workload.stack_profile();
    let dispatchers = if space.dispatchers.is_empty() {
        vec![stack.default_dispatcher]
    } else {
        distinct(&space.dispatchers)
    };
    let overlaps = if space.ep_overlap.is_empty() {
        vec![stack.default_ep_overlap]
    } else {
        distinct(&space.ep_overlap)
    };
    let mut out = Vec::with_capacity(tuples.len());
    for t in tuples {
        if t.ep <= 1 {
            out.push(t);
            continue;
        }
        for &dispatcher in &dispatchers {
            for &ep_overlap in &overlaps {
                out.push(Degrees {
                    dispatcher: Some(dispatcher),
                    ep_overlap,
                    ..t
                });
            }
        }
    }
    out
}

/// `tuples` with each CP exchange of `space.cp_exchanges` for a plan with `cp > 1` (empty: the
/// plan leaves it to the stack's default, [`Plan::cp_exchange`] `None`); `cp = 1` tuples
/// exchange nothing. Exchanges the stack lacks are pruned by its rules.
fn with_cp_exchange(space: &SearchSpace, tuples: Vec<Degrees>) -> Vec<Degrees> {
    if space.cp_exchanges.is_empty() {
        return tuples;
    }
    let exchanges = distinct(&space.cp_exchanges);
    let mut out = Vec::with_capacity(tuples.len() * exchanges.len());
    for t in tuples {
        if t.cp <= 1 {
            out.push(t);
            continue;
        }
        for &x in &exchanges {
            out.push(Degrees {
                cp_exchange: Some(x),
                ..t
            });
        }
    }
    out
}

/// The folded tuples of dense degrees `tp`, `pp`, `cp` and dense data parallelism `dp`: expert
/// TP `etp` and EP degree `ep > 1` dividing the model's `experts`, with `etp·ep` dividing the
/// stage's `dp·tp·cp` ranks, except those an unfolded tuple already is (`etp = tp` and `ep`
/// dividing `dp`: EP carved out of data parallelism). By default `etp = 1` (the folding
/// Megatron-Bridge and torchtitan recipes run: whole experts, EP over the TP and DP ranks) and
/// EP spans CP ranks only where TP and DP cannot hold it (`ep ∤ dp·tp`); a space that bounds
/// `etp` gets every divisor of `tp` it allows and every EP placement.
fn folded_tuples(
    space: &SearchSpace,
    experts: u32,
    divs: &[u32],
    [tp, pp, cp, dp]: [u32; 4],
    out: &mut Vec<Degrees>,
) {
    if !space.dp.allows(dp) {
        return;
    }
    let stage = dp as u64 * tp as u64 * cp as u64;
    let bounded = space.etp != crate::space::Degree::default();
    let without_cp = dp as u64 * tp as u64;
    for &etp in divs
        .iter()
        .filter(|&&v| tp % v == 0 && (bounded || v == 1) && space.etp.allows(v))
    {
        for &ep in divs
            .iter()
            .filter(|&&v| v > 1 && experts % v == 0 && space.ep.allows(v))
        {
            let expert = etp as u64 * ep as u64;
            let over_cp_by_choice = cp > 1 && without_cp % expert == 0;
            if stage % expert != 0 || (etp == tp && dp % ep == 0) || (!bounded && over_cp_by_choice)
            {
                continue;
            }
            out.push(Degrees::new([dp, tp, pp, ep, cp], Some(etp)));
        }
    }
}

/// A feasible plan before its full evaluation: what the ranking needs.
#[derive(Debug, Clone)]
struct Ranked {
    tokens_per_s: f64,
    plan: Plan,
}

/// Total order of plans: best tokens/s first, then by fields.
fn rank_order(a: &Ranked, b: &Ranked) -> Ordering {
    b.tokens_per_s
        .total_cmp(&a.tokens_per_s)
        .then_with(|| plan_key(&a.plan).cmp(&plan_key(&b.plan)))
}

type PlanKey = (
    (
        u32,
        Option<u32>,
        Option<Dispatcher>,
        bool,
        Option<CpExchange>,
        Option<RecomputeModules>,
    ),
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
        (
            p.tp,
            p.etp,
            p.dispatcher,
            p.ep_overlap,
            p.cp_exchange,
            p.recompute_modules,
        ),
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

/// The plan with `degrees` and every knob at its first value.
fn base_plan(
    Degrees {
        dp,
        tp,
        pp,
        ep,
        cp,
        etp,
        dispatcher,
        ep_overlap,
        cp_exchange,
    }: Degrees,
) -> Plan {
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
        etp,
        dispatcher,
        ep_overlap,
        cp_exchange,
        // No recompute modules, end-rank layer counts or offloading: the search never sets them.
        ..Plan::default()
    }
}

/// Best-`k` list kept sorted; O(k) memory.
struct TopK {
    k: usize,
    plans: Vec<Ranked>,
}

impl TopK {
    fn new(k: usize) -> Self {
        TopK {
            k,
            plans: Vec::new(),
        }
    }

    fn would_accept(&self, tokens_per_s: f64) -> bool {
        self.plans.len() < self.k
            || self
                .plans
                .last()
                .is_some_and(|w| tokens_per_s >= w.tokens_per_s)
    }

    fn push(&mut self, e: Ranked) {
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
            if self.would_accept(e.tokens_per_s) {
                self.push(e);
            }
        }
        self
    }
}

/// What the search keeps of the feasible plans.
#[derive(Clone, Copy)]
enum Keep<'a> {
    /// The best `top_k`.
    Top,
    /// Every one, as rows; more than `max_plans` is an error (`kept` counts over all workers).
    All {
        max_plans: u64,
        kept: &'a AtomicU64,
        codes: &'a Codes,
    },
}

/// What some outer tuples contribute.
struct Partial {
    top: TopK,
    /// Feasible plans strictly faster than [`Searcher::faster_than`].
    faster: u64,
    candidates: u64,
    feasible: u64,
    pruned: PruneCounts,
    /// The rows of the tuple being scored ([`Keep::All`]).
    rows: Rows,
    /// The rows of finished tuples, in tuple order.
    chunks: Vec<Rows>,
}

impl Partial {
    fn new(k: usize) -> Self {
        Partial {
            top: TopK::new(k),
            faster: 0,
            candidates: 0,
            feasible: 0,
            pruned: PruneCounts::default(),
            rows: Rows::default(),
            chunks: Vec::new(),
        }
    }

    /// Counts `n` plans removed by `rule`.
    fn prune(&mut self, rule: Rule, n: u64) {
        self.pruned.add(rule, n);
    }

    fn merge(mut self, other: Partial) -> Partial {
        self.top = self.top.merge(other.top);
        self.faster += other.faster;
        self.candidates += other.candidates;
        self.feasible += other.feasible;
        self.pruned.merge(&other.pruned);
        self.chunks.extend(other.chunks);
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
    keep: Keep<'a>,
}

impl<'a> Searcher<'a> {
    fn first_structural(&self, plan: &Plan, groups: &Groups) -> Option<Rule> {
        let mut first = None;
        structural_rules(self.problem, plan, self.space, groups, &mut |rule, _| {
            // The stack's rules were applied to the knobs already ([`Self::stack_knobs`]); the
            // probe plans checked here carry a tuple's first knob values, which the stack may
            // not have (torchtitan: no ZeRO-0 under pipelining, no TP without sequence
            // parallelism), and would otherwise remove every plan of the cell.
            if rule.scope() == Scope::Stack {
                return true;
            }
            first = Some(rule);
            false
        });
        first
    }

    /// GPU-seconds per step above which a plan's tokens/s per GPU surely falls below the worst
    /// of a full `top` (so it needs no division); infinite when every plan must be looked at
    /// (a top not yet full, all plans kept, or plans counted against `faster_than`). The margin
    /// (1e-9, far above the rounding of the two divisions) keeps the test exact.
    fn slower_than(&self, top: &TopK) -> f64 {
        match top.plans.last() {
            Some(worst)
                if top.plans.len() >= top.k
                    && self.faster_than.is_none()
                    && matches!(self.keep, Keep::Top) =>
            {
                self.problem.workload.tokens_per_step() / worst.tokens_per_s * (1.0 + 1e-9)
            }
            _ => f64::INFINITY,
        }
    }

    /// The least memory any plan of this tuple can need (see the module docs): the smallest
    /// micro-batch, sequence parallel when allowed, 1F1B, and the least over the allowed ZeRO
    /// stages and recompute modes — neither is monotone on its own (with about one layer per
    /// stage, ZeRO-3's gathered layers or full recompute's rebuilt layer can cost more than they
    /// save). Levels 2 and 3 of memory for those plans, exactly their peak.
    fn memory_lower_bound(&self, base: &Plan, knobs: &Knobs, degree: &DegreeLevel) -> f64 {
        let problem = self.problem;
        let probe = Plan {
            micro_batch: knobs.micro_batches[0],
            sequence_parallel: knobs.sequence_parallel.contains(&true),
            vpp: 1,
            schedule: Some(Schedule::OneFOneB),
            ..base.clone()
        };
        let m = micro_batches(problem, &probe);
        let layer_bytes = layer_activations(problem, &probe);
        let least_flights: Vec<f64> = degree
            .pipeline
            .shapes
            .iter()
            .map(|s| in_flight_of(Schedule::OneFOneB, base.pp, 1, m, s.index))
            .collect();
        let mut least = f64::INFINITY;
        let mut knob = KnobLevel::new(degree, &probe, &layer_bytes);
        for &(recompute, recompute_modules) in &knobs.recompute {
            let plan = Plan {
                recompute,
                recompute_modules,
                ..probe.clone()
            };
            knob.fill(degree, &plan, &layer_bytes);
            for zi in 0..knobs.zero.len() {
                least = least.min(knob.peak(degree, zi, &least_flights));
            }
        }
        least
    }

    fn tuple(&self, degrees: Degrees) -> Result<Partial> {
        self.control.check(self.started)?;
        let mut part = Partial::new(self.space.top_k as usize);
        let knobs = knobs(self.problem, self.space, degrees);
        if knobs.count() == 0 {
            return Ok(part);
        }
        let base = base_plan(degrees);
        let pipeline = Pipeline::new(self.problem, &base);
        for (order, groups) in distinct_orders(self.problem, self.space, &base) {
            part.candidates += knobs.count();
            let base = Plan {
                order,
                ..base.clone()
            };
            let Some(knobs) = self.stack_knobs(&mut part, &base, &knobs) else {
                continue;
            };
            let mut degree = DegreeLevel::new(self.problem, groups, &pipeline, &knobs.zero);
            self.score_knobs(&mut part, &base, &knobs, &mut degree)?;
        }
        if part.rows.len() > 0 {
            let rows = std::mem::take(&mut part.rows);
            part.chunks.push(rows);
        }
        Ok(part)
    }

    /// The knob values of `knobs` the workload's stack can run for the degrees and order of
    /// `base`, counting the plans its rules remove in `part` ([`Scope::Stack`]): each plan goes
    /// to the first stack rule it breaks, in the order of [`Rule::ALL`] (degrees and order, then
    /// schedule and layer split, ZeRO, recompute, sequence parallel), as `evaluate` reports
    /// them. `None` when nothing is left.
    fn stack_knobs(&self, part: &mut Partial, base: &Plan, knobs: &Knobs) -> Option<Knobs> {
        let problem = self.problem;
        let stack = problem.workload.stack_profile();
        let first_rule = |plan: &Plan| {
            let mut first = None;
            stack.rules(
                &problem.model,
                problem.workload.precision,
                plan,
                &mut |rule, _| {
                    first = Some(rule);
                    false
                },
            );
            first
        };
        if let Some(rule @ (Rule::StackPrecision | Rule::StackParallelism | Rule::StackOrder)) =
            first_rule(base)
        {
            part.prune(rule, knobs.count());
            return None;
        }
        let mbs = knobs.micro_batches.len() as u64;
        let (zero, recompute, sp) = (
            knobs.zero.len() as u64,
            knobs.recompute.len() as u64,
            knobs.sequence_parallel.len() as u64,
        );
        let mut schedules = Vec::with_capacity(knobs.schedules.len());
        for &(schedule, vpp) in &knobs.schedules {
            let plan = Plan {
                schedule: Some(schedule),
                vpp,
                ..base.clone()
            };
            match first_rule(&plan) {
                Some(rule @ (Rule::StackSchedule | Rule::StackLayerSplit)) => {
                    part.prune(rule, mbs * zero * recompute * sp);
                }
                _ => schedules.push((schedule, vpp)),
            }
        }
        let cells = mbs * schedules.len() as u64;
        let allowed = stack.zero_stages(base);
        let zeros: Vec<u8> = knobs
            .zero
            .iter()
            .copied()
            .filter(|z| allowed.contains(z))
            .collect();
        part.prune(
            Rule::StackZero,
            cells * (zero - zeros.len() as u64) * recompute * sp,
        );
        let cells = cells * zeros.len() as u64;
        let recomputes: Vec<RecomputeKnob> = knobs
            .recompute
            .iter()
            .copied()
            .filter(|&(r, m)| {
                stack.recompute.contains(&r)
                    && stack.recompute_allowed(base, r)
                    && m.is_none_or(|m| {
                        stack.recompute_modules_problem(&problem.model, m).is_none()
                    })
            })
            .collect();
        part.prune(
            Rule::StackRecompute,
            cells * (recompute - recomputes.len() as u64) * sp,
        );
        let cells = cells * recomputes.len() as u64;
        let sps: Vec<bool> = knobs
            .sequence_parallel
            .iter()
            .copied()
            .filter(|&s| {
                // Folded MoE layers with TP need sequence parallelism (the stack rule).
                base.tp == 1 || (stack.sequence_parallel.contains(&s) && (s || !base.folded()))
            })
            .collect();
        part.prune(Rule::StackSequenceParallel, cells * (sp - sps.len() as u64));
        let left = Knobs {
            micro_batches: knobs.micro_batches.clone(),
            schedules,
            zero: zeros,
            recompute: recomputes,
            sequence_parallel: sps,
        };
        (left.count() > 0).then_some(left)
    }

    /// The (schedule, vpp) cells of micro-batch `probe` (index `i`) that no structural rule
    /// removes; the removed plans are counted in `part` at their rule's [`Scope`].
    fn check_cells(
        &self,
        part: &mut Partial,
        probe: &Plan,
        knobs: &Knobs,
        i: usize,
        groups: &Groups,
    ) -> Cells {
        let per_cell = knobs.per_cell();
        let mut cells = Vec::with_capacity(knobs.schedules.len());
        for (j, &(schedule, vpp)) in knobs.schedules.iter().enumerate() {
            let plan = Plan {
                schedule: Some(schedule),
                vpp,
                ..probe.clone()
            };
            match self.first_structural(&plan, groups) {
                // A rule's scope says what one verdict removes: a degree rule on the first
                // cell removes the order's every plan, a micro-batch rule the micro-batch's.
                Some(rule) if i == 0 && j == 0 && rule.scope() == Scope::Degrees => {
                    part.prune(rule, knobs.count());
                    return Cells::NoneForTheOrder;
                }
                Some(rule) if j == 0 && rule.scope() == Scope::MicroBatch => {
                    part.prune(rule, knobs.schedules.len() as u64 * per_cell);
                    return Cells::Open(Vec::new());
                }
                Some(rule) => part.prune(rule, per_cell),
                None => cells.push((schedule, vpp)),
            }
        }
        Cells::Open(cells)
    }

    /// Accounts for every knob combination of `base` (one degree tuple, one rank order: level 1
    /// in `degree`) in `part`. The structural rules depend on the micro-batch and the schedule,
    /// not on ZeRO, recompute or sequence parallelism, so each (micro-batch, schedule) cell is
    /// checked once and its plans counted together; so are the plans that no memory can hold.
    fn score_knobs(
        &self,
        part: &mut Partial,
        base: &Plan,
        knobs: &Knobs,
        degree: &mut DegreeLevel,
    ) -> Result<()> {
        let problem = self.problem;
        let hopeless = base.pp <= problem.model.layers + 2
            && self.memory_lower_bound(base, knobs, degree) > self.capacity_gib;
        let per_cell = knobs.per_cell();
        let mut knob = KnobLevel {
            stored: Vec::new(),
            transient: Vec::new(),
        };
        // Plans no memory can hold, counted once at the end.
        let mut too_big = 0u64;
        let mut slower_than = self.slower_than(&part.top);
        for (i, &b) in knobs.micro_batches.iter().enumerate() {
            self.control.check(self.started)?;
            let probe = Plan {
                micro_batch: b,
                ..base.clone()
            };
            let cells = match self.check_cells(part, &probe, knobs, i, &degree.groups) {
                Cells::NoneForTheOrder => return Ok(()),
                Cells::Open(cells) => cells,
            };
            if cells.is_empty() {
                continue;
            }
            if hopeless {
                too_big += cells.len() as u64 * per_cell;
                continue;
            }
            let m = micro_batches(problem, &probe);
            let flights = Flights::of(degree.pipeline, &cells, base.pp, m);
            for &sp in &knobs.sequence_parallel {
                let sp_plan = Plan {
                    sequence_parallel: sp,
                    ..probe.clone()
                };
                let layer_bytes = layer_activations(problem, &sp_plan);
                // Layer times before recompute, per layer kind, shared by the recompute modes.
                let mut layer_parts: Option<Vec<LayerParts>> = None;
                for &(rec, modules) in &knobs.recompute {
                    let plan = Plan {
                        recompute: rec,
                        recompute_modules: modules,
                        ..sp_plan.clone()
                    };
                    knob.fill(degree, &plan, &layer_bytes);
                    let mut cell = CellScore {
                        plan: &plan,
                        m,
                        cells: &cells,
                        flights: &flights,
                        layer_parts: &mut layer_parts,
                        too_big: &mut too_big,
                        slower_than: &mut slower_than,
                    };
                    self.score_cells(part, degree, &knob, &mut cell)?;
                }
            }
        }
        part.prune(Rule::Memory, too_big);
        Ok(())
    }

    /// Scores the cells × ZeRO stages of one (micro-batch, sequence parallel, recompute): the
    /// memory decision from level 2's parts and the in-flight counts, then (for the plans that
    /// fit) level 2 of time on first use and level 3 per plan.
    fn score_cells(
        &self,
        part: &mut Partial,
        degree: &mut DegreeLevel,
        knob: &KnobLevel,
        cell: &mut CellScore,
    ) -> Result<()> {
        let problem = self.problem;
        let z = degree.zero.len();
        let shapes = degree.pipeline.shapes.len();
        let flights = cell.flights;
        // 1F1B's in-flight counts are the least of any schedule on every rank, so its memory
        // bounds every schedule's from below (and is ZB-H1's exactly).
        let floor: Vec<f64> = (0..z)
            .map(|zi| knob.peak(degree, zi, &flights.least))
            .collect();
        if !floor
            .iter()
            .any(|f| f.partial_cmp(&self.capacity_gib) != Some(Ordering::Greater))
        {
            *cell.too_big += (cell.cells.len() * z) as u64;
            return Ok(());
        }
        // Where the most any interleaved cell holds fits, every one does.
        let roomy: Vec<bool> = (0..z)
            .map(|zi| {
                flights.interleaved && knob.peak(degree, zi, &flights.most) <= self.capacity_gib
            })
            .collect();
        let mut time: Option<(TimeContext, KnobTimes)> = None;
        for (c, &(schedule, vpp)) in cell.cells.iter().enumerate() {
            for (zi, &zero) in degree.zero.iter().enumerate() {
                // The plan's peak memory, or a bound that decides as well.
                let peak = match schedule {
                    _ if floor[zi] > self.capacity_gib => floor[zi],
                    Schedule::Interleaved if roomy[zi] => floor[zi],
                    Schedule::Interleaved => {
                        knob.peak(degree, zi, &flights.per_cell[c * shapes..(c + 1) * shapes])
                    }
                    Schedule::OneFOneB | Schedule::ZeroBubbleH1 => floor[zi],
                };
                if peak > self.capacity_gib {
                    *cell.too_big += 1;
                    continue;
                }
                part.feasible += 1;
                let (tc, times) = time.get_or_insert_with(|| {
                    let tc = TimeContext::new(problem, cell.plan, degree.groups);
                    let parts = cell
                        .layer_parts
                        .get_or_insert_with(|| KnobTimes::layer_parts(&tc, problem));
                    let recompute = (cell.plan.recompute, cell.plan.recompute_modules);
                    let times = KnobTimes::new(degree, &tc, recompute, cell.m, parts);
                    (tc, times)
                });
                let optimizer = degree.dp_parts(tc).optimizer[zi];
                let step = times.step(tc, schedule, vpp, zi, optimizer, cell.m);
                let gpu_s = step.total() * problem.cluster.num_gpus as f64;
                if gpu_s > *cell.slower_than {
                    continue; // surely below the worst kept plan
                }
                let tokens_per_s = problem.workload.tokens_per_step() / gpu_s;
                if self.faster_than.is_some_and(|t| tokens_per_s > t) {
                    part.faster += 1;
                }
                if !(matches!(self.keep, Keep::All { .. }) || part.top.would_accept(tokens_per_s)) {
                    continue;
                }
                let plan = Plan {
                    schedule: Some(schedule),
                    vpp,
                    zero,
                    ..cell.plan.clone()
                };
                match self.keep {
                    Keep::Top => {
                        part.top.push(Ranked { tokens_per_s, plan });
                        *cell.slower_than = self.slower_than(&part.top);
                    }
                    Keep::All {
                        max_plans,
                        kept,
                        codes,
                    } => {
                        if kept.fetch_add(1, AtomicOrdering::Relaxed) >= max_plans {
                            return Err(Error::TooManyPlans { limit: max_plans });
                        }
                        let (mem, worst_stage) = knob.breakdown(degree, zi, &plan, cell.m);
                        let rate = metrics(problem, &plan, step.total());
                        part.rows.push(
                            &Row {
                                plan,
                                tokens_per_s_per_gpu: rate.tokens_per_s_per_gpu,
                                mfu: rate.mfu,
                                model_tflops_per_gpu: rate.model_tflops_per_gpu,
                                hardware_tflops_per_gpu: rate.hardware_tflops_per_gpu,
                                micro_batches: cell.m,
                                worst_stage,
                                memory: mem,
                                time: step,
                            },
                            codes,
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// What [`Searcher::check_cells`] leaves of a micro-batch.
enum Cells {
    /// A degree rule removed every plan of the order.
    NoneForTheOrder,
    /// The open (schedule, vpp) cells (none when the micro-batch is removed).
    Open(Vec<(Schedule, u32)>),
}

/// In-flight micro-batches of each shape's first rank for one micro-batch's open cells: per
/// cell, under 1F1B (the least of any schedule on every rank), and the most of any interleaved
/// cell.
struct Flights {
    /// Per (cell, shape).
    per_cell: Vec<f64>,
    /// Per shape, under 1F1B.
    least: Vec<f64>,
    /// Per shape, the most of the interleaved cells (−∞ when there is none).
    most: Vec<f64>,
    /// Some cell is interleaved.
    interleaved: bool,
}

impl Flights {
    fn of(pipeline: &Pipeline, cells: &[(Schedule, u32)], pp: u32, m: u32) -> Self {
        let shapes = pipeline.shapes.len();
        let flight =
            |schedule, vpp, k: usize| in_flight_of(schedule, pp, vpp, m, pipeline.shapes[k].index);
        let mut per_cell = Vec::with_capacity(cells.len() * shapes);
        for &(schedule, vpp) in cells {
            per_cell.extend((0..shapes).map(|k| flight(schedule, vpp, k)));
        }
        let least = (0..shapes)
            .map(|k| flight(Schedule::OneFOneB, 1, k))
            .collect();
        let most = (0..shapes)
            .map(|k| {
                cells
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.0 == Schedule::Interleaved)
                    .map(|(c, _)| per_cell[c * shapes + k])
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect();
        Flights {
            per_cell,
            least,
            most,
            interleaved: cells.iter().any(|c| c.0 == Schedule::Interleaved),
        }
    }
}

/// One (micro-batch, sequence parallel, recompute) being scored, with the search state it
/// updates.
struct CellScore<'c> {
    plan: &'c Plan,
    m: u32,
    cells: &'c [(Schedule, u32)],
    flights: &'c Flights,
    /// Level-2 layer parts of the (micro-batch, sequence parallel), per layer kind.
    layer_parts: &'c mut Option<Vec<LayerParts>>,
    too_big: &'c mut u64,
    slower_than: &'c mut f64,
}

/// The full evaluation of a plan the search kept, exactly as `evaluate` scores it.
fn full_evaluation(problem: &Problem, plan: Plan) -> Result<Evaluation> {
    let groups = Groups::of(&plan, problem.cluster.nvlink_domain());
    score(problem, plan, groups, Vec::new())
}

/// Searches `space` for the best plans of `problem`.
pub fn search(problem: &Problem, space: &SearchSpace, control: &Control) -> Result<SearchResult> {
    let plain = |space: &SearchSpace| run(problem, space, control, None).map(|(r, _)| r);
    if space.distinct {
        return search_distinct(space, plain);
    }
    plain(space)
}

/// Two plans whose predicted step times differ by less than this fraction are one plan at the
/// cost model's resolution: smaller than the terms it rounds or leaves out (kernel launch
/// jitter, the split of a rank's layers over its chunks, allocator effects) and far below its
/// ~5 % median error on published runs (benchmarks/fidelity/REPORT.md).
pub const DISTINCT_TIME_REL: f64 = 1e-3;

/// Two plans whose predicted peak memory differs by less than this (GiB) are one plan at the
/// cost model's resolution: below the allocator fragmentation and fixed reserve it models as a
/// constant per GPU.
pub const DISTINCT_MEMORY_GIB: f64 = 0.5;

/// Most plans a search for distinct plans keeps to fill `top_k` groups (beyond it the group
/// sizes are lower bounds, `stats.groups_complete = false`).
pub const DISTINCT_MAX_KEPT: u32 = 1 << 16;

/// Groups ranked plans (best first): each plan joins the first group whose best plan (its
/// anchor) is at most [`DISTINCT_TIME_REL`] faster and within [`DISTINCT_MEMORY_GIB`] of its
/// peak memory, else it starts a group. Returns (anchor index, plans in the group), in rank
/// order of the anchors.
pub fn group_plans(plans: &[Evaluation]) -> Vec<(usize, u64)> {
    let mut groups: Vec<(usize, u64)> = Vec::new();
    // Groups before `open` are too fast to take any later plan (step times only grow).
    let mut open = 0;
    for (i, p) in plans.iter().enumerate() {
        while open < groups.len()
            && plans[groups[open].0].step_time_s * (1.0 + DISTINCT_TIME_REL) < p.step_time_s
        {
            open += 1;
        }
        let home = groups[open..].iter_mut().find(|(a, _)| {
            let a = &plans[*a];
            p.step_time_s <= a.step_time_s * (1.0 + DISTINCT_TIME_REL)
                && (p.peak_memory_gib - a.peak_memory_gib).abs() <= DISTINCT_MEMORY_GIB
        });
        match home {
            Some(g) => g.1 += 1,
            None => groups.push((i, 1)),
        }
    }
    groups
}

/// [`search`] for distinct plans: keeps more plans than `top_k` (8×, then 4× more per round,
/// up to [`DISTINCT_MAX_KEPT`]) until the first `top_k` groups are complete — every plan left
/// out is slower than the last group's anchor by more than the resolution, so it could join
/// none of them — and returns their anchors with their group sizes. `plain` is the search of
/// one space, plan by plan.
fn search_distinct(
    space: &SearchSpace,
    plain: impl Fn(&SearchSpace) -> Result<SearchResult>,
) -> Result<SearchResult> {
    let started = Instant::now();
    let k = space.top_k as usize;
    let cap = DISTINCT_MAX_KEPT.max(space.top_k);
    let mut kept = space.top_k.saturating_mul(8).clamp(64, cap);
    loop {
        let wide = SearchSpace {
            top_k: kept,
            distinct: false,
            ..space.clone()
        };
        let mut result = plain(&wide)?;
        let groups = group_plans(&result.plans);
        let every_plan = result.plans.len() < kept as usize;
        let complete = every_plan
            || (k > 0 && groups.len() >= k && {
                let last_anchor = &result.plans[groups[k - 1].0];
                let worst = result.plans.last().map_or(0.0, |p| p.step_time_s);
                worst > last_anchor.step_time_s * (1.0 + DISTINCT_TIME_REL)
            });
        if complete || kept >= cap {
            result.plans = groups
                .iter()
                .take(k)
                .enumerate()
                .map(|(rank, &(anchor, size))| Evaluation {
                    rank: Some(rank as u32 + 1),
                    group_size: Some(size),
                    ..result.plans[anchor].clone()
                })
                .collect();
            result.stats.groups_complete = Some(complete);
            result.stats.elapsed_s = started.elapsed().as_secs_f64();
            return Ok(result);
        }
        kept = kept.saturating_mul(4).min(cap);
    }
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

/// Every feasible plan of `space` as columns, ranked best first (see [`FeasibleSpace`]); more
/// than `max_plans` feasible plans is [`Error::TooManyPlans`], raised as soon as the count
/// passes the cap (nothing larger is held).
pub fn feasible_space(
    problem: &Problem,
    space: &SearchSpace,
    control: &Control,
    max_plans: u64,
) -> Result<FeasibleSpace> {
    let started = Instant::now();
    space.validate()?;
    crate::limits::check("max_plans", max_plans)?;
    let threads = control.thread_count()?;
    let kept = AtomicU64::new(0);
    let codes = Codes::new(&space.orders);
    let keep = Keep::All {
        max_plans,
        kept: &kept,
        codes: &codes,
    };
    let total =
        thread_pool(threads)?.install(|| collect(problem, space, control, None, keep, started))?;
    let stats = stats(&total, started, threads);
    Ok(Rows::concat(total.chunks).finish(&codes, stats))
}

/// One query of [`search_many`]: a problem and its search space.
pub type Query = (Problem, SearchSpace);

/// Searches every query on one pool of `control.threads` workers, queries and their outer
/// tuples in parallel, and returns one result per query in order: a query's own failure (bad
/// space, too large, cancelled, deadline) is its entry, the others still run. `done` (when
/// given) counts finished queries as they finish, for a progress display. The error is for the
/// batch as a whole (a thread count the OS refuses).
pub fn search_many(
    queries: &[Query],
    control: &Control,
    done: Option<&AtomicUsize>,
) -> Result<Vec<Result<SearchResult>>> {
    let threads = control.thread_count()?;
    let pool = thread_pool(threads)?;
    Ok(pool.install(|| {
        queries
            .par_iter()
            .map(|(problem, space)| {
                let plain = |space: &SearchSpace| {
                    let started = Instant::now();
                    collect(problem, space, control, None, Keep::Top, started)
                        .and_then(|total| result_of(problem, total, started, threads).map(|r| r.0))
                };
                let result = space.validate().and_then(|()| {
                    if space.distinct {
                        search_distinct(space, plain)
                    } else {
                        plain(space)
                    }
                });
                if let Some(done) = done {
                    done.fetch_add(1, AtomicOrdering::Relaxed);
                }
                result
            })
            .collect()
    }))
}

fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| {
            Error::invalid(
                "threads",
                threads,
                format!("a thread count the OS accepts ({e})"),
            )
        })
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
    thread_pool(threads)?.install(|| {
        let total = collect(problem, space, control, faster_than, Keep::Top, started)?;
        result_of(problem, total, started, threads)
    })
}

/// Every outer tuple of `space` scored on the current pool and merged in tuple order.
fn collect(
    problem: &Problem,
    space: &SearchSpace,
    control: &Control,
    faster_than: Option<f64>,
    keep: Keep,
    started: Instant,
) -> Result<Partial> {
    let tuples = with_cp_exchange(
        space,
        with_ep_comm(problem, space, outer_tuples(problem, space)),
    );
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
        keep,
    };
    let k = space.top_k as usize;
    tuples
        .par_iter()
        .map(|t| searcher.tuple(*t))
        .try_reduce(|| Partial::new(k), |a, b| Ok(a.merge(b)))
}

fn stats(total: &Partial, started: Instant, threads: usize) -> SearchStats {
    SearchStats {
        candidates: total.candidates,
        feasible: total.feasible,
        pruned: total
            .pruned
            .nonzero()
            .map(|(rule, n)| (rule.key().to_string(), n))
            .collect(),
        elapsed_s: started.elapsed().as_secs_f64(),
        threads: threads as u32,
        groups_complete: None,
    }
}

/// The ranked result: the kept plans evaluated in full (in parallel on the current pool).
fn result_of(
    problem: &Problem,
    total: Partial,
    started: Instant,
    threads: usize,
) -> Result<(SearchResult, u64)> {
    let mut plans: Vec<Evaluation> = total
        .top
        .plans
        .par_iter()
        .map(|r| {
            let e = full_evaluation(problem, r.plan.clone())?;
            debug_assert_eq!(
                e.tokens_per_s_per_gpu.to_bits(),
                r.tokens_per_s.to_bits(),
                "the search's fast path and evaluate disagree on {:?}",
                r.plan
            );
            Ok(e)
        })
        .collect::<Result<_>>()?;
    for (i, p) in plans.iter_mut().enumerate() {
        p.rank = Some(i as u32 + 1);
    }
    let stats = stats(&total, started, threads);
    Ok((SearchResult { plans, stats }, total.faster))
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

//! Enumerates every plan of a search space, prunes what cannot run with counted reasons, scores
//! the rest and keeps the best `top_k` (DESIGN "Flow of one query"), or every feasible plan as
//! columns ([`feasible_space`]); [`search_many`] runs a batch of searches on one pool.
//!
//! Outer tuples `(dp, tp, pp, ep, cp)` with product `N` are scored in parallel (rayon) and merged
//! deterministically: the ranking is by tokens/s per GPU, ties broken by the plan's fields, so the
//! result does not depend on the thread count.
//!
//! Work is skipped or shared, never changed: every number is computed by the same functions of
//! `memory` and `time` as `evaluate` uses, on the same inputs, so a plan's memory and step time
//! are bit for bit those of `evaluate` (`tests/snapshot.rs`, `tests/feasible.rs`).
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
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::evaluate::{
    memory_capacity_gib, metrics, micro_batches, peak_memory, score, structural_rules, DEGREE_RULES,
};
use crate::feasible::{Codes, FeasibleSpace, Row, Rows};
use crate::layout::Groups;
use crate::memory::{
    assemble, layer_activations, stage_params, state_gib, stored_bytes_per_micro_batch,
    transient_bytes, StageParams,
};
use crate::plan::{Plan, RankOrder, Recompute, Schedule};
use crate::report::{Evaluation, MemoryBreakdown, SearchResult, SearchStats};
use crate::space::{Degree, SearchSpace};
use crate::stages::{
    add_repeated, in_flight, in_flight_of, last_of_equal_max, stage_runs, Stage, StageRun,
};
use crate::time::{breakdown, DpComm, LayerParts, LayerTime, PipelineTimes, TimeContext};
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
    pruned: BTreeMap<&'static str, u64>,
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
            pruned: BTreeMap::new(),
            rows: Rows::default(),
            chunks: Vec::new(),
        }
    }

    /// Counts `n` plans removed by `rule`.
    fn prune(&mut self, rule: &'static str, n: u64) {
        if n > 0 {
            *self.pruned.entry(rule).or_default() += n;
        }
    }

    fn merge(mut self, other: Partial) -> Partial {
        self.top = self.top.merge(other.top);
        self.faster += other.faster;
        self.candidates += other.candidates;
        self.feasible += other.feasible;
        for (k, v) in other.pruned {
            *self.pruned.entry(k).or_default() += v;
        }
        self.chunks.extend(other.chunks);
        self
    }
}

/// The pipeline ranks of one degree tuple, grouped by shape. Ranks of one shape (layers, first,
/// last) differ only in their index, which only sets how many micro-batches they hold in flight;
/// that count never grows with the index (`stages::in_flight_of`), and every memory term grows
/// with it, so the first rank of each shape has the shape's peak memory. The ranks themselves
/// are runs of one shape (`stages::stage_runs`): a handful, whatever `pp` is.
struct Pipeline {
    runs: Vec<StageRun>,
    /// Shape of each run (an index into `shapes`).
    shape_of: Vec<usize>,
    /// The first rank of each shape.
    shapes: Vec<Stage>,
    /// Parameters per GPU of each shape.
    params: Vec<StageParams>,
}

impl Pipeline {
    fn new(problem: &Problem, base: &Plan) -> Self {
        let runs = stage_runs(&problem.model, base.pp);
        let mut shapes: Vec<Stage> = Vec::new();
        let shape_of = runs
            .iter()
            .map(|r| {
                shapes
                    .iter()
                    .position(|k| k.same_shape(&r.stage))
                    .unwrap_or_else(|| {
                        shapes.push(r.stage);
                        shapes.len() - 1
                    })
            })
            .collect();
        let params = shapes
            .iter()
            .map(|s| stage_params(&problem.model, base, s))
            .collect();
        Pipeline {
            runs,
            shape_of,
            shapes,
            params,
        }
    }
}

/// Memory parts of one (degrees, order, micro-batch, sequence parallel, recompute), per shape
/// and ZeRO stage (`z` of them): everything but the in-flight count.
struct MemoryParts {
    z: usize,
    /// Model states, GiB, per (shape, ZeRO): fixed for the order.
    states: Vec<[f64; 3]>,
    /// Stored bytes per in-flight micro-batch, per shape.
    stored: Vec<f64>,
    /// Transient bytes per (shape, ZeRO).
    transient: Vec<f64>,
}

impl MemoryParts {
    /// Peak memory total over the ranks at ZeRO index `zi` when the first rank of shape `k`
    /// holds `flights[k]` micro-batches in flight (with the schedule's counts, the exact value of
    /// `peak_memory(..).0.total()`; every term grows with the counts, so larger counts bound it
    /// from above).
    fn peak(&self, problem: &Problem, zi: usize, flights: &[f64]) -> f64 {
        let mut peak = f64::NEG_INFINITY;
        for (k, &flight) in flights.iter().enumerate() {
            let i = k * self.z + zi;
            let total = assemble(
                problem,
                self.states[i],
                flight,
                self.stored[k],
                self.transient[i],
            )
            .total();
            if total.total_cmp(&peak) != Ordering::Less {
                peak = total;
            }
        }
        peak
    }

    /// The worst rank's breakdown and index, over every rank (as `evaluate::peak_memory`).
    fn breakdown(
        &self,
        problem: &Problem,
        pipeline: &Pipeline,
        zi: usize,
        plan: &Plan,
        m: u32,
    ) -> (MemoryBreakdown, u32) {
        let mut worst: Option<(MemoryBreakdown, u32)> = None;
        for (run, &k) in pipeline.runs.iter().zip(&pipeline.shape_of) {
            let i = k * self.z + zi;
            let memory = |j: u32| {
                assemble(
                    problem,
                    self.states[i],
                    in_flight(plan, m, j),
                    self.stored[k],
                    self.transient[i],
                )
            };
            let (index, memory) = last_of_equal_max(run, memory, MemoryBreakdown::total);
            if worst
                .as_ref()
                .is_none_or(|(w, _)| memory.total().total_cmp(&w.total()).is_ge())
            {
                worst = Some((memory, index));
            }
        }
        worst.unwrap_or_default()
    }
}

/// Time parts of one (degrees, order, micro-batch, sequence parallel, recompute): everything
/// but the schedule's terms.
struct TimeParts {
    pipeline: PipelineTimes,
    hop: f64,
    /// Exposed DP/ZeRO seconds per ZeRO index.
    dp: [f64; 4],
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
    fn first_structural(&self, plan: &Plan, groups: &Groups) -> Option<&'static str> {
        let mut first = None;
        structural_rules(self.problem, plan, self.space, groups, &mut |rule, _| {
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
    /// save).
    fn memory_lower_bound(
        &self,
        base: &Plan,
        knobs: &Knobs,
        groups: &Groups,
        runs: &[StageRun],
    ) -> f64 {
        let mut least = f64::INFINITY;
        for &zero in &knobs.zero {
            for &recompute in &knobs.recompute {
                let plan = Plan {
                    micro_batch: knobs.micro_batches[0],
                    zero,
                    recompute,
                    sequence_parallel: knobs.sequence_parallel.contains(&true),
                    vpp: 1,
                    schedule: Some(Schedule::OneFOneB),
                    ..base.clone()
                };
                let m = micro_batches(self.problem, &plan);
                least = least.min(peak_memory(self.problem, &plan, groups, runs, m).0.total());
            }
        }
        least
    }

    fn tuple(&self, degrees: [u32; 5]) -> Result<Partial> {
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
            self.score_knobs(&mut part, &base, &knobs, &groups, &pipeline)?;
        }
        if part.rows.len() > 0 {
            let rows = std::mem::take(&mut part.rows);
            part.chunks.push(rows);
        }
        Ok(part)
    }

    /// Accounts for every knob combination of `base` (one degree tuple, one rank order) in
    /// `part`. The structural rules depend on the micro-batch and the schedule, not on ZeRO,
    /// recompute or sequence parallelism, so each (micro-batch, schedule) cell is checked once
    /// and its plans counted together; so are the plans that no memory can hold.
    fn score_knobs(
        &self,
        part: &mut Partial,
        base: &Plan,
        knobs: &Knobs,
        groups: &Groups,
        pipeline: &Pipeline,
    ) -> Result<()> {
        let problem = self.problem;
        let groups = *groups;
        let hopeless = base.pp <= problem.model.layers + 2
            && self.memory_lower_bound(base, knobs, &groups, &pipeline.runs) > self.capacity_gib;
        let z = knobs.zero.len();
        let per_cell = (z * knobs.recompute.len() * knobs.sequence_parallel.len()) as u64;
        let shapes = pipeline.shapes.len();
        let mut memory = MemoryParts {
            z,
            states: Vec::with_capacity(shapes * z),
            stored: vec![0.0; shapes],
            transient: vec![0.0; shapes * z],
        };
        for params in &pipeline.params {
            for &zero in &knobs.zero {
                memory
                    .states
                    .push(state_gib(problem, zero, &groups, params));
            }
        }
        // Per (shape, ZeRO), filled on the first plan that fits: DP/ZeRO collectives, optimizer.
        let mut dp_comm: Vec<DpComm> = Vec::new();
        let mut optimizer = [0.0f64; 4];
        let mut stage_times: Vec<[f64; 3]> = Vec::with_capacity(pipeline.shapes.len());
        let mut cells: Vec<(Schedule, u32)> = Vec::with_capacity(knobs.schedules.len());
        let mut floor = [0.0f64; 4];
        let mut flights: Vec<f64> = Vec::new();

        // Plans no memory can hold, counted once at the end.
        let mut too_big = 0u64;
        let mut slower_than = self.slower_than(&part.top);
        for (i, &b) in knobs.micro_batches.iter().enumerate() {
            self.control.check(self.started)?;
            let probe = Plan {
                micro_batch: b,
                ..base.clone()
            };
            cells.clear();
            for (j, &(schedule, vpp)) in knobs.schedules.iter().enumerate() {
                let plan = Plan {
                    schedule: Some(schedule),
                    vpp,
                    ..probe.clone()
                };
                match self.first_structural(&plan, &groups) {
                    // The rules before `batch` depend on the degrees only, and `batch` on the
                    // micro-batch only: what removes the first cell removes the order's every
                    // plan, or the micro-batch's.
                    Some(rule) if i == 0 && j == 0 && DEGREE_RULES.contains(&rule) => {
                        part.prune(rule, knobs.count());
                        return Ok(());
                    }
                    Some("batch") if j == 0 => {
                        part.prune("batch", knobs.schedules.len() as u64 * per_cell);
                        break;
                    }
                    Some(rule) => part.prune(rule, per_cell),
                    None => cells.push((schedule, vpp)),
                }
            }
            if cells.is_empty() {
                continue;
            }
            if hopeless {
                too_big += cells.len() as u64 * per_cell;
                continue;
            }
            let m = micro_batches(problem, &probe);
            // In-flight micro-batches of each shape's first rank: per cell, under 1F1B (the
            // least of any schedule on every rank), and the most of any interleaved cell.
            let shapes = pipeline.shapes.len();
            let flight = |schedule, vpp, k: usize| {
                in_flight_of(schedule, base.pp, vpp, m, pipeline.shapes[k].index)
            };
            flights.clear();
            for &(schedule, vpp) in &cells {
                flights.extend((0..shapes).map(|k| flight(schedule, vpp, k)));
            }
            let least: Vec<f64> = (0..shapes)
                .map(|k| flight(Schedule::OneFOneB, 1, k))
                .collect();
            let interleaved = cells.iter().any(|c| c.0 == Schedule::Interleaved);
            let most: Vec<f64> = (0..shapes)
                .map(|k| {
                    cells
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| c.0 == Schedule::Interleaved)
                        .map(|(c, _)| flights[c * shapes + k])
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            let tokens = b as f64 * problem.workload.seq_len as f64 / base.cp as f64;
            for &sp in &knobs.sequence_parallel {
                let sp_plan = Plan {
                    sequence_parallel: sp,
                    ..probe.clone()
                };
                let layer_bytes = layer_activations(problem, &sp_plan);
                // Layer times before recompute (dense, MoE), shared by the recompute modes.
                let mut layer_parts: Option<(LayerParts, Option<LayerParts>)> = None;
                for &rec in &knobs.recompute {
                    let plan = Plan {
                        recompute: rec,
                        ..sp_plan.clone()
                    };
                    for (k, first) in pipeline.shapes.iter().enumerate() {
                        memory.stored[k] = stored_bytes_per_micro_batch(
                            problem,
                            &plan,
                            first,
                            tokens,
                            layer_bytes,
                        );
                        for (zi, &zero) in knobs.zero.iter().enumerate() {
                            memory.transient[k * z + zi] = transient_bytes(
                                problem,
                                &Plan {
                                    zero,
                                    ..plan.clone()
                                },
                                first,
                                tokens,
                                &pipeline.params[k],
                                layer_bytes,
                            );
                        }
                    }
                    // 1F1B's in-flight counts are the least of any schedule on every rank, so
                    // its memory bounds every schedule's from below (and is ZB-H1's exactly).
                    let mut any = false;
                    for (zi, f) in floor.iter_mut().enumerate().take(z) {
                        *f = memory.peak(problem, zi, &least);
                        any |= (*f).partial_cmp(&self.capacity_gib) != Some(Ordering::Greater);
                    }
                    if !any {
                        too_big += (cells.len() * z) as u64;
                        continue;
                    }
                    // Where the most any interleaved cell holds fits, every one does.
                    let mut roomy = [false; 4];
                    if interleaved {
                        for (zi, r) in roomy.iter_mut().enumerate().take(z) {
                            *r = memory.peak(problem, zi, &most) <= self.capacity_gib;
                        }
                    }
                    let mut time: Option<(TimeContext, TimeParts)> = None;
                    for (c, &(schedule, vpp)) in cells.iter().enumerate() {
                        for (zi, &zero) in knobs.zero.iter().enumerate() {
                            // The plan's peak memory, or a bound that decides as well.
                            let peak = match schedule {
                                _ if floor[zi] > self.capacity_gib => floor[zi],
                                Schedule::Interleaved if roomy[zi] => floor[zi],
                                Schedule::Interleaved => {
                                    memory.peak(problem, zi, &flights[c * shapes..(c + 1) * shapes])
                                }
                                Schedule::OneFOneB | Schedule::ZeroBubbleH1 => floor[zi],
                            };
                            if peak > self.capacity_gib {
                                too_big += 1;
                                continue;
                            }
                            part.feasible += 1;
                            let (tc, parts) = time.get_or_insert_with(|| {
                                self.time_parts(
                                    &plan,
                                    groups,
                                    pipeline,
                                    knobs,
                                    m,
                                    &mut dp_comm,
                                    &mut optimizer,
                                    &mut stage_times,
                                    &mut layer_parts,
                                )
                            });
                            let bubble = parts.pipeline.bubble(schedule, vpp);
                            let pp_p2p = tc.pp_p2p_s(vpp, parts.hop);
                            let step = breakdown(
                                m,
                                &parts.pipeline.worst,
                                pp_p2p,
                                bubble,
                                parts.dp[zi],
                                optimizer[zi],
                            );
                            let gpu_s = step.total() * problem.cluster.num_gpus as f64;
                            if gpu_s > slower_than {
                                continue; // surely below the worst kept plan
                            }
                            let tokens_per_s = problem.workload.tokens_per_step() / gpu_s;
                            if self.faster_than.is_some_and(|t| tokens_per_s > t) {
                                part.faster += 1;
                            }
                            let full = |part: &Partial| {
                                matches!(self.keep, Keep::All { .. })
                                    || part.top.would_accept(tokens_per_s)
                            };
                            if !full(part) {
                                continue;
                            }
                            let plan = Plan {
                                schedule: Some(schedule),
                                vpp,
                                zero,
                                ..plan.clone()
                            };
                            match self.keep {
                                Keep::Top => {
                                    part.top.push(Ranked { tokens_per_s, plan });
                                    slower_than = self.slower_than(&part.top);
                                }
                                Keep::All {
                                    max_plans,
                                    kept,
                                    codes,
                                } => {
                                    if kept.fetch_add(1, AtomicOrdering::Relaxed) >= max_plans {
                                        return Err(Error::TooManyPlans { limit: max_plans });
                                    }
                                    let (mem, worst_stage) =
                                        memory.breakdown(problem, pipeline, zi, &plan, m);
                                    let (tps, mfu, model_tflops, hardware_tflops) =
                                        metrics(problem, &plan, step.total());
                                    part.rows.push(
                                        &Row {
                                            plan,
                                            tokens_per_s_per_gpu: tps,
                                            mfu,
                                            model_tflops_per_gpu: model_tflops,
                                            hardware_tflops_per_gpu: hardware_tflops,
                                            micro_batches: m,
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
                }
            }
        }
        part.prune("memory", too_big);
        Ok(())
    }

    /// The schedule-independent time parts of `plan` (one micro-batch, sequence-parallel and
    /// recompute setting), filling the order's DP/ZeRO collectives and optimizer times on first
    /// use.
    #[allow(clippy::too_many_arguments)]
    fn time_parts<'p>(
        &self,
        plan: &'p Plan,
        groups: Groups,
        pipeline: &Pipeline,
        knobs: &Knobs,
        m: u32,
        dp_comm: &mut Vec<DpComm>,
        optimizer: &mut [f64; 4],
        stage_times: &mut Vec<[f64; 3]>,
        layer_parts: &mut Option<(LayerParts, Option<LayerParts>)>,
    ) -> (TimeContext<'p>, TimeParts)
    where
        'a: 'p,
    {
        let tc = TimeContext::new(self.problem, plan, groups);
        let z = knobs.zero.len();
        if dp_comm.is_empty() {
            for (params, first) in pipeline.params.iter().zip(&pipeline.shapes) {
                for &zero in &knobs.zero {
                    dp_comm.push(tc.dp_comm(zero, params, first.layers()));
                }
            }
            for (zi, &zero) in knobs.zero.iter().enumerate() {
                let per_shape: Vec<f64> = pipeline
                    .params
                    .iter()
                    .map(|p| tc.optimizer_with(zero, p))
                    .collect();
                optimizer[zi] = pipeline
                    .shape_of
                    .iter()
                    .map(|&k| per_shape[k])
                    .fold(0.0, f64::max);
            }
        }
        // As `TimeContext::layers`, with the recompute-independent part computed once.
        let (dense, moe) = layer_parts.get_or_insert_with(|| {
            let moe = self.problem.model.is_moe().then(|| tc.layer_parts(true));
            (tc.layer_parts(false), moe)
        });
        let dense = dense.with(plan.recompute);
        let moe = moe.map_or(dense, |m| m.with(plan.recompute));
        let shape_times: Vec<LayerTime> = pipeline
            .shapes
            .iter()
            .map(|s| tc.stage(s, &dense, &moe))
            .collect();
        // Per shape: total, backward total, and total less the weight gradient.
        stage_times.clear();
        stage_times.extend(shape_times.iter().map(|t| {
            let total = t.total();
            [total, t.bwd.total(), total - t.wgrad]
        }));
        let totals = &stage_times[..];
        let mut dp = [0.0f64; 4];
        for (zi, d) in dp.iter_mut().enumerate().take(z) {
            let exposed: Vec<f64> = shape_times
                .iter()
                .enumerate()
                .map(|(k, st)| tc.dp_hidden(&dp_comm[k * z + zi], st, m))
                .collect();
            // Stage j finishes its last backward about j backward passes before stage 0: within
            // a run the first rank exposes the most.
            *d = pipeline
                .runs
                .iter()
                .zip(&pipeline.shape_of)
                .map(|(r, &k)| (exposed[k] - r.stage.index as f64 * totals[k][1]).max(0.0))
                .fold(0.0, f64::max);
        }
        // `PipelineTimes::of_runs` over the runs, from the shapes' sums (same values, same order).
        let worst = pipeline
            .shape_of
            .iter()
            .copied()
            .max_by(|&a, &b| totals[a][0].total_cmp(&totals[b][0]))
            .map_or_else(LayerTime::default, |k| shape_times[k]);
        let (mut sum, mut deferred): (f64, f64) = (
            std::iter::empty::<f64>().sum(),
            std::iter::empty::<f64>().sum(),
        );
        for (r, &k) in pipeline.runs.iter().zip(&pipeline.shape_of) {
            sum = add_repeated(sum, totals[k][0], r.count);
            deferred = add_repeated(deferred, totals[k][2], r.count);
        }
        let pipeline_times = PipelineTimes {
            worst,
            sum,
            deferred,
        };
        debug_assert_eq!(
            pipeline_times,
            PipelineTimes::of_runs(
                &pipeline
                    .runs
                    .iter()
                    .zip(&pipeline.shape_of)
                    .map(|(r, &k)| (shape_times[k], r.count))
                    .collect::<Vec<_>>()
            )
        );
        let parts = TimeParts {
            pipeline: pipeline_times,
            hop: tc.pp_hop_s(),
            dp,
        };
        (tc, parts)
    }
}

/// The full evaluation of a plan the search kept, exactly as `evaluate` scores it.
fn full_evaluation(problem: &Problem, plan: Plan) -> Evaluation {
    let groups = Groups::of(&plan, problem.cluster.nvlink_domain());
    let runs = stage_runs(&problem.model, plan.pp);
    let m = micro_batches(problem, &plan);
    let (memory, worst) = peak_memory(problem, &plan, &groups, &runs, m);
    score(problem, plan, groups, &runs, m, memory, worst, Vec::new())
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
                let started = Instant::now();
                let result = space
                    .validate()
                    .and_then(|()| collect(problem, space, control, None, Keep::Top, started))
                    .map(|total| result_of(problem, total, started, threads).0);
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
        Ok(result_of(problem, total, started, threads))
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
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        elapsed_s: started.elapsed().as_secs_f64(),
        threads: threads as u32,
    }
}

/// The ranked result: the kept plans evaluated in full (in parallel on the current pool).
fn result_of(
    problem: &Problem,
    total: Partial,
    started: Instant,
    threads: usize,
) -> (SearchResult, u64) {
    let mut plans: Vec<Evaluation> = total
        .top
        .plans
        .par_iter()
        .map(|r| {
            let e = full_evaluation(problem, r.plan.clone());
            debug_assert_eq!(
                e.tokens_per_s_per_gpu.to_bits(),
                r.tokens_per_s.to_bits(),
                "the search's fast path and evaluate disagree on {:?}",
                r.plan
            );
            e
        })
        .collect();
    for (i, p) in plans.iter_mut().enumerate() {
        p.rank = Some(i as u32 + 1);
    }
    let stats = stats(&total, started, threads);
    (SearchResult { plans, stats }, total.faster)
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

//! Evaluation as three typed levels, each keyed by the knobs it depends on (DESIGN "Flow of one
//! query"; docs/costmodel.md §2–§5):
//!
//! 1. [`DegreeLevel`] — the degrees and rank order (and the ZeRO stages scored): groups,
//!    pipeline ranks grouped by shape ([`Pipeline`]), parameters and model states per shape,
//!    DP/ZeRO collectives and the optimizer step.
//! 2. [`KnobLevel`] — the micro-batch, sequence parallelism and recompute: stored and transient
//!    bytes per shape, and (on first use) the layer and stage times, pipeline sums, exposed DP
//!    time and pipeline hop ([`KnobTimes`]).
//! 3. The schedule (`schedule`, `vpp`): in-flight counts, the peak memory and the step
//!    breakdown ([`KnobLevel::peak`], [`KnobLevel::breakdown`], [`KnobTimes::step`]).
//!
//! `evaluate` runs each level once for its plan; the search builds each once per key and reuses
//! it for every plan below it. Both compose the same functions of `memory` and `time`, so their
//! numbers are bit for bit the same.

use std::cmp::Ordering;

use crate::layout::Groups;
use crate::memory::{
    assemble, stage_params_of, state_gib, stored_bytes_per_micro_batch, transient_bytes,
    ModelStates, PerKind, StageParams,
};
use crate::plan::{Plan, Schedule};
use crate::report::{MemoryBreakdown, TimeBreakdown};
use crate::stages::{in_flight, last_of_equal_max, plan_stage_runs, Stage, StageRun};
use crate::time::{
    breakdown, DpComm, LayerParts, LayerTime, LayerTimes, PipelineTimes, TimeContext,
};
use crate::Problem;

/// The pipeline ranks of one degree tuple, grouped by shape. Ranks of one shape (layers per
/// kind, first, last) differ only in their index, which only sets how many micro-batches they
/// hold in flight; that count never grows with the index (`stages::in_flight_of`), and every
/// memory term grows with it, so the first rank of each shape has the shape's peak memory. The
/// ranks themselves are runs of one shape (`stages::stage_runs`): a handful, whatever `pp` is.
pub(crate) struct Pipeline {
    pub runs: Vec<StageRun>,
    /// Shape of each run (an index into `shapes`).
    pub shape_of: Vec<usize>,
    /// The first rank of each shape.
    pub shapes: Vec<Stage>,
    /// Parameters per GPU of each shape.
    pub params: Vec<StageParams>,
}

impl Pipeline {
    /// The ranks of `base`'s degrees (its TP, PP and EP).
    pub fn new(problem: &Problem, base: &Plan) -> Self {
        let runs = plan_stage_runs(&problem.model, base, problem.workload.seq_len);
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
            .map(|s| stage_params_of(problem, base, s))
            .collect();
        Pipeline {
            runs,
            shape_of,
            shapes,
            params,
        }
    }
}

/// The DP/ZeRO collectives per (shape, ZeRO) and the optimizer step per ZeRO stage (the worst
/// rank's) of one degree level.
pub(crate) struct DpParts {
    comm: Vec<DpComm>,
    pub optimizer: Vec<f64>,
}

/// Level 1: everything that depends on the degrees and the rank order, for the ZeRO stages
/// `zero` (indexed `zi` below).
pub(crate) struct DegreeLevel<'p> {
    pub problem: &'p Problem,
    pub groups: Groups,
    pub pipeline: &'p Pipeline,
    pub zero: &'p [u8],
    /// Model states, GiB, per (shape, ZeRO).
    pub states: Vec<ModelStates>,
    /// Filled on first use ([`DegreeLevel::dp_parts`]): only plans that fit need them.
    dp: Option<DpParts>,
}

impl<'p> DegreeLevel<'p> {
    /// Level 1 of the ranks `pipeline` on `groups` for the ZeRO stages `zero`: the model states
    /// now, the DP/ZeRO parts on first use.
    pub fn new(
        problem: &'p Problem,
        groups: Groups,
        pipeline: &'p Pipeline,
        zero: &'p [u8],
    ) -> Self {
        let mut states = Vec::with_capacity(pipeline.params.len() * zero.len());
        for params in &pipeline.params {
            for &z in zero {
                states.push(state_gib(problem, z, &groups, params));
            }
        }
        DegreeLevel {
            problem,
            groups,
            pipeline,
            zero,
            states,
            dp: None,
        }
    }

    /// The DP/ZeRO collectives and optimizer steps, computed with `tc` (any plan of these
    /// degrees and order: they depend on nothing else) on first use.
    pub fn dp_parts(&mut self, tc: &TimeContext) -> &DpParts {
        let (pipeline, zero) = (self.pipeline, self.zero);
        self.dp.get_or_insert_with(|| {
            let mut comm = Vec::with_capacity(pipeline.params.len() * zero.len());
            for (params, first) in pipeline.params.iter().zip(&pipeline.shapes) {
                for &z in zero {
                    comm.push(tc.dp_comm(z, params, first.layers()));
                }
            }
            let optimizer = zero
                .iter()
                // Every shape is some run's, so the most of the shapes is the most of the ranks.
                .map(|&z| {
                    pipeline
                        .params
                        .iter()
                        .map(|p| tc.optimizer_with(z, p))
                        .fold(0.0, f64::max)
                })
                .collect();
            DpParts { comm, optimizer }
        })
    }
}

/// Level 2: the memory of one (micro-batch, sequence parallel, recompute) under a degree level,
/// per shape and ZeRO stage: everything but the in-flight count.
pub(crate) struct KnobLevel {
    /// Stored bytes per in-flight micro-batch, per shape.
    pub stored: Vec<f64>,
    /// Transient bytes per (shape, ZeRO).
    pub transient: Vec<f64>,
}

impl KnobLevel {
    /// The memory parts of `plan` (its micro-batch, sequence parallelism and recompute) whose
    /// layers store `layer_bytes` per token ([`crate::memory::layer_activations`]).
    pub fn new(degree: &DegreeLevel, plan: &Plan, layer_bytes: &PerKind) -> Self {
        let mut level = KnobLevel {
            stored: Vec::with_capacity(degree.pipeline.shapes.len()),
            transient: Vec::with_capacity(degree.states.len()),
        };
        level.fill(degree, plan, layer_bytes);
        level
    }

    /// Recomputes the parts for `plan` in place (the search reuses the buffers).
    pub fn fill(&mut self, degree: &DegreeLevel, plan: &Plan, layer_bytes: &PerKind) {
        let problem = degree.problem;
        let tokens = plan.micro_batch as f64 * problem.workload.seq_len as f64 / plan.cp as f64;
        self.stored.clear();
        self.transient.clear();
        for (k, first) in degree.pipeline.shapes.iter().enumerate() {
            self.stored.push(stored_bytes_per_micro_batch(
                problem,
                plan,
                first,
                tokens,
                layer_bytes,
            ));
            for &zero in degree.zero {
                self.transient.push(transient_bytes(
                    problem,
                    &Plan {
                        zero,
                        ..plan.clone()
                    },
                    first,
                    tokens,
                    &degree.pipeline.params[k],
                    layer_bytes,
                ));
            }
        }
    }

    /// Peak memory total over the ranks at ZeRO index `zi` when the first rank of shape `k`
    /// holds `flights[k]` micro-batches in flight (with the schedule's counts, the exact value of
    /// `evaluate::peak_memory(..).0.total()`; every term grows with the counts, so larger counts
    /// bound it from above).
    pub fn peak(&self, degree: &DegreeLevel, zi: usize, flights: &[f64]) -> f64 {
        let z = degree.zero.len();
        let mut peak = f64::NEG_INFINITY;
        for (k, &flight) in flights.iter().enumerate() {
            let i = k * z + zi;
            let total = assemble(
                degree.problem,
                degree.states[i],
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

    /// The worst rank's breakdown and index, over every rank, at ZeRO index `zi` for `plan`'s
    /// schedule with `m` micro-batches (level 3 of memory).
    pub fn breakdown(
        &self,
        degree: &DegreeLevel,
        zi: usize,
        plan: &Plan,
        m: u32,
    ) -> (MemoryBreakdown, u32) {
        let z = degree.zero.len();
        let pipeline = degree.pipeline;
        // The last of equal maxima, as `max_by` over the ranks one by one would pick: within a
        // run the memory never grows with the index, so each run costs a bisection.
        let mut worst: Option<(MemoryBreakdown, u32)> = None;
        for (run, &k) in pipeline.runs.iter().zip(&pipeline.shape_of) {
            let i = k * z + zi;
            let memory = |j: u32| {
                assemble(
                    degree.problem,
                    degree.states[i],
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

/// Level 2 of time: one (micro-batch, sequence parallel, recompute) under a degree level,
/// everything but the schedule's terms.
pub(crate) struct KnobTimes {
    pub pipeline: PipelineTimes,
    pub hop: f64,
    /// Exposed DP/ZeRO seconds per ZeRO index.
    pub dp: Vec<f64>,
}

impl KnobTimes {
    /// The layer times before recompute of every layer kind (what the recompute modes of one
    /// micro-batch and sequence-parallel setting share).
    pub fn layer_parts(tc: &TimeContext, problem: &Problem) -> Vec<LayerParts> {
        (0..problem.model.layer_kinds().len())
            .map(|k| tc.layer_parts(k))
            .collect()
    }

    /// The schedule-independent time of `tc`'s plan with `m` micro-batches, from the layer
    /// parts of its micro-batch and sequence-parallel setting.
    pub fn new(
        degree: &mut DegreeLevel,
        tc: &TimeContext,
        recompute: (
            crate::plan::Recompute,
            Option<crate::plan::RecomputeModules>,
        ),
        m: u32,
        parts: &[LayerParts],
    ) -> Self {
        let z = degree.zero.len();
        let pipeline = degree.pipeline;
        let dp_comm = &degree.dp_parts(tc).comm;
        let mut layers = LayerTimes::default();
        for (time, part) in layers.iter_mut().zip(parts) {
            *time = part.with(recompute.0, recompute.1);
        }
        let shape_times: Vec<LayerTime> = pipeline
            .shapes
            .iter()
            .map(|s| tc.stage(s, &layers))
            .collect();
        let backward: Vec<f64> = shape_times.iter().map(|t| t.bwd.total()).collect();
        let dp = (0..z)
            .map(|zi| {
                let exposed: Vec<f64> = shape_times
                    .iter()
                    .enumerate()
                    .map(|(k, st)| tc.dp_hidden(&dp_comm[k * z + zi], st, m))
                    .collect();
                // Stage j finishes its last backward about j backward passes before stage 0:
                // within a run the first rank exposes the most.
                pipeline
                    .runs
                    .iter()
                    .zip(&pipeline.shape_of)
                    .map(|(r, &k)| (exposed[k] - r.stage.index as f64 * backward[k]).max(0.0))
                    .fold(0.0, f64::max)
            })
            .collect();
        let pipeline_times = PipelineTimes::of_runs(
            &pipeline
                .runs
                .iter()
                .zip(&pipeline.shape_of)
                .map(|(r, &k)| (shape_times[k], r.count))
                .collect::<Vec<_>>(),
        );
        KnobTimes {
            pipeline: pipeline_times,
            hop: tc.pp_hop_s(),
            dp,
        }
    }

    /// Level 3: the step breakdown of schedule `schedule` with `vpp` chunks at ZeRO index `zi`,
    /// whose optimizer step takes `optimizer` seconds.
    pub fn step(
        &self,
        tc: &TimeContext,
        schedule: Schedule,
        vpp: u32,
        zi: usize,
        optimizer: f64,
        m: u32,
    ) -> TimeBreakdown {
        let bubble = self.pipeline.bubble(schedule, vpp);
        let pp_p2p = tc.pp_p2p_s(vpp, self.hop);
        breakdown(
            m,
            &self.pipeline.worst,
            pp_p2p,
            bubble,
            self.dp[zi],
            optimizer,
        )
    }
}

/// Memory and time of one plan through the three levels, each run once (what `evaluate` does);
/// `check` runs between memory and time (a cancel flag, a deadline).
pub(crate) fn evaluate_levels(
    problem: &Problem,
    plan: &Plan,
    groups: Groups,
    m: u32,
    check: &dyn Fn() -> crate::error::Result<()>,
) -> crate::error::Result<((MemoryBreakdown, u32), TimeBreakdown)> {
    let pipeline = Pipeline::new(problem, plan);
    let zero = [plan.zero];
    let mut degree = DegreeLevel::new(problem, groups, &pipeline, &zero);
    let layer_bytes = crate::memory::layer_activations(problem, plan);
    let knob = KnobLevel::new(&degree, plan, &layer_bytes);
    let memory = knob.breakdown(&degree, 0, plan, m);
    check()?;
    let tc = TimeContext::new(problem, plan, groups);
    let parts = KnobTimes::layer_parts(&tc, problem);
    let times = KnobTimes::new(
        &mut degree,
        &tc,
        (plan.recompute, plan.recompute_modules),
        m,
        &parts,
    );
    let optimizer = degree.dp_parts(&tc).optimizer[0];
    let step = times.step(&tc, plan.schedule(), plan.vpp, 0, optimizer, m);
    Ok((memory, step))
}

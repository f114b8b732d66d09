//! meshplan-core: a parallelism planner for large-model training.
//!
//! Given a [`Model`], a [`Cluster`] and a [`Workload`], [`search`] enumerates every factorisation
//! of the GPU count into `dp·tp·pp·ep·cp` with the knobs that go with them, prunes what cannot
//! run, scores the rest with the cost model of `docs/costmodel.md` and returns ranked plans;
//! [`evaluate`] scores one given plan. Pure Rust: no Python, no I/O beyond the embedded presets.
//!
//! The modules and the flow of one query are drawn in `docs/architecture.md`: shared building
//! blocks (`layer`, `mesh`, `layout`, `device`, `comm`, `stack`, `traffic`, `flops`) under the
//! training planner (`stages`, `memory`, `time`, `rules`, `levels`, `evaluate`, `search`,
//! `explain`).

pub mod calibration;
pub mod comm;
pub mod device;
pub mod error;
pub mod feasible;
pub mod flops;
pub mod gemm;
pub mod hardware;
pub mod layer;
pub mod layout;
mod levels;
pub mod limits;
pub mod memory;
pub mod mesh;
pub mod model;
pub mod plan;
pub mod precision;
pub mod provenance;
pub mod report;
pub mod rules;
pub mod space;
pub mod stack;
pub mod stages;
pub mod time;
pub mod traffic;
pub mod validation;
pub mod workload;

pub use error::{Error, Result};
pub use hardware::{Calibration, Cluster, Gpu, PerPrecision, Precision, ScaleupTopology};
pub use model::{Activation, LinearAttention, Mamba, Mla, Model, Moe, Norm};
pub use plan::{Axis, CpExchange, Dispatcher, Plan, RankOrder, Recompute, Schedule};
pub use report::{
    Evaluation, MemoryBreakdown, SearchResult, SearchStats, TimeBreakdown, Violation,
};
pub use space::{Degree, SearchSpace};
pub use workload::{Optimizer, Workload};

/// A validated planning problem: what to train, on what.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub model: Model,
    pub cluster: Cluster,
    pub workload: Workload,
}

impl Problem {
    /// Validates all three parts (the error names the first bad field).
    pub fn new(model: Model, cluster: Cluster, workload: Workload) -> Result<Self> {
        model.validate()?;
        cluster.validate()?;
        workload.validate()?;
        cluster.gpu.peak_flops(workload.precision)?;
        Ok(Problem {
            model,
            cluster,
            workload,
        })
    }
}

pub mod hf;
pub mod presets;

pub mod evaluate;
pub mod explain;
mod search;
pub mod serving;

pub use evaluate::{evaluate, evaluate_in, evaluate_with};
pub use explain::{decode_traffic, explain, explain_with, Explanation};
pub use feasible::{Column, FeasibleSpace, DEFAULT_MAX_PLANS};
pub use search::{feasible_space, search, search_counting_faster, search_many, Control, Query};

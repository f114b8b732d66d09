//! What the core returns: per-plan memory and time breakdowns, infeasibility reasons, and search
//! statistics. Plain serialisable data; every front end renders these.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::Plan;

/// Peak memory per GPU on the most loaded pipeline stage, GiB (binary), by component.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    /// Working (compute-precision) weights resident between uses.
    pub weights: f64,
    /// Gradient buffers (main grads or their ZeRO shard).
    pub gradients: f64,
    /// Optimizer state including fp32 master weights (or its ZeRO shard).
    pub optimizer: f64,
    /// Stored activations of all in-flight micro-batches.
    pub activations: f64,
    /// Short-lived buffers: gathered ZeRO-3 parameters, logits and their gradient, one layer's
    /// recompute working set, allocator fragmentation.
    pub transient: f64,
    /// CUDA context, libraries and communicator buffers.
    pub fixed: f64,
}

impl MemoryBreakdown {
    /// Sum of the components.
    pub fn total(&self) -> f64 {
        self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.transient
            + self.fixed
    }
}

/// Step time, seconds, by component. The components add up to the step time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    /// GEMMs, attention and element-wise work of the critical path (recompute included).
    pub compute: f64,
    /// Exposed tensor-parallel (and sequence-parallel) collectives.
    pub tp: f64,
    /// Exposed context-parallel K/V exchange.
    pub cp: f64,
    /// Exposed expert-parallel all-to-all.
    pub ep: f64,
    /// Exposed pipeline point-to-point transfers (fill and drain).
    pub pp_p2p: f64,
    /// Pipeline bubble.
    pub bubble: f64,
    /// Exposed data-parallel / ZeRO communication.
    pub dp: f64,
    /// Optimizer step.
    pub optimizer: f64,
}

impl TimeBreakdown {
    /// Sum of the components.
    pub fn total(&self) -> f64 {
        self.compute
            + self.tp
            + self.cp
            + self.ep
            + self.pp_p2p
            + self.bubble
            + self.dp
            + self.optimizer
    }
}

/// Why a plan cannot run as given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Stable key of the rule (also the key of the search's pruning counters).
    pub rule: String,
    /// One human sentence with the numbers.
    pub message: String,
}

/// A scored plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// 1-based rank in a search result; absent for a single evaluation.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rank: Option<u32>,
    /// The plan, with its schedule resolved.
    pub plan: Plan,
    pub feasible: bool,
    pub reasons: Vec<Violation>,
    pub step_time_s: f64,
    pub tokens_per_s_per_gpu: f64,
    /// Model FLOPs utilisation: model FLOPs (no recompute; causal attention counted half, as
    /// Megatron does) over the dense peak at the workload's precision.
    pub mfu: f64,
    /// Model FLOP/s per GPU, TFLOP/s (same basis as `mfu`).
    pub model_tflops_per_gpu: f64,
    /// Hardware FLOP/s per GPU including recompute, TFLOP/s.
    pub hardware_tflops_per_gpu: f64,
    pub peak_memory_gib: f64,
    pub memory_gib: MemoryBreakdown,
    pub time_s: TimeBreakdown,
    /// Micro-batches per pipeline per step `m`.
    pub micro_batches: u32,
    /// Index of the pipeline stage with the highest memory.
    pub worst_stage: u32,
    /// In a search for distinct plans ([`crate::space::SearchSpace::distinct`]): how many
    /// feasible plans this one stands for (itself and those indistinguishable from it at the
    /// cost model's resolution, [`crate::search::DISTINCT_TIME_REL`] and
    /// [`crate::search::DISTINCT_MEMORY_GIB`]); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub group_size: Option<u64>,
}

/// Counters of a search.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchStats {
    /// Every plan of the space, pruned or not.
    pub candidates: u64,
    /// Plans that passed every rule.
    pub feasible: u64,
    /// Plans removed, by rule.
    pub pruned: BTreeMap<String, u64>,
    pub elapsed_s: f64,
    /// Worker threads used.
    pub threads: u32,
    /// In a search for distinct plans: whether every group's `group_size` counts all of its
    /// feasible plans (false when the search stopped at its cap on plans kept; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub groups_complete: Option<bool>,
}

/// A ranked search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    pub plans: Vec<Evaluation>,
    pub stats: SearchStats,
}

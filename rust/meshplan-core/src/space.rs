//! The search space: which degrees and knobs the search may choose, and its limits.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;
use crate::plan::{CpExchange, Dispatcher, RankOrder, Recompute, RecomputeModules, Schedule};

/// Constraint on one parallel degree: fixed, or bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Degree {
    /// Exactly this value (overrides min/max).
    #[serde(default)]
    pub fixed: Option<u32>,
    /// At least this value.
    #[serde(default)]
    pub min: Option<u32>,
    /// At most this value.
    #[serde(default)]
    pub max: Option<u32>,
}

impl Degree {
    /// Whether `v` satisfies the constraint.
    pub fn allows(&self, v: u32) -> bool {
        if let Some(f) = self.fixed {
            return v == f;
        }
        self.min.is_none_or(|m| v >= m) && self.max.is_none_or(|m| v <= m)
    }

    fn validate(&self, field: &str) -> Result<()> {
        for (name, v) in [("fixed", self.fixed), ("min", self.min), ("max", self.max)] {
            if let Some(v) = v {
                limits::check(&format!("space.{field}.{name}"), v)?;
            }
        }
        if let (Some(lo), Some(hi)) = (self.min, self.max) {
            if lo > hi {
                return Err(Error::invalid(
                    format!("space.{field}.min"),
                    lo,
                    format!("at most space.{field}.max ({hi})"),
                ));
            }
        }
        Ok(())
    }
}

/// Default memory headroom kept free on every GPU, GiB. Fixed memory and fragmentation are
/// modelled separately (calibration), so this is only a safety margin for the user.
pub const DEFAULT_MEMORY_HEADROOM_GIB: f64 = 1.0;
/// Largest bound accepted for `vpp` and `micro_batch` (the search lists every allowed value):
/// [`limits::MAX_KNOB`].
pub const MAX_KNOB_VALUE: u32 = limits::MAX_KNOB;
/// Largest `top_k` accepted (use `feasible_space` for every feasible plan):
/// [`limits::MAX_TOP_K`].
pub const MAX_TOP_K: u32 = limits::MAX_TOP_K;
/// Default number of plans returned.
pub const DEFAULT_TOP_K: u32 = 10;
/// Default largest micro-batch tried.
pub const DEFAULT_MAX_MICRO_BATCH: u32 = 16;
/// Default largest interleaving degree tried.
pub const DEFAULT_MAX_VPP: u32 = 16;

/// What the search may choose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchSpace {
    pub dp: Degree,
    pub tp: Degree,
    pub pp: Degree,
    pub ep: Degree,
    pub cp: Degree,
    /// Expert tensor parallelism of an MoE plan, folded or not (an unfolded plan's is its `tp`).
    pub etp: Degree,
    pub vpp: Degree,
    pub micro_batch: Degree,
    /// Also try folded MoE plans (MoE parallel folding, `Plan::etp`): expert meshes whose EP
    /// (dividing the experts) spans ranks the dense layers spend on TP and DP — and CP where
    /// those cannot hold it — with whole experts (`etp = 1`); when `etp` is bounded, every
    /// divisor of `tp` it allows and every EP placement. A folded plan that equals an unfolded
    /// one (`etp = tp`, `ep` dividing the dense DP) is not tried twice.
    pub fold: bool,
    /// MoE token dispatchers to try for plans with `ep > 1` (empty: the stack's default).
    pub dispatchers: Vec<Dispatcher>,
    /// EP communication overlap settings to try for plans with `ep > 1` (empty: the stack's
    /// default).
    pub ep_overlap: Vec<bool>,
    /// Context-parallel exchanges to try for plans with `cp > 1` (empty: the stack's default,
    /// left unnamed in the plan).
    pub cp_exchanges: Vec<CpExchange>,
    /// Allowed ZeRO stages.
    pub zero: Vec<u8>,
    /// Megatron-Core selective-recompute module sets to try for `selective` (empty: Megatron's
    /// default, core attention alone, left unnamed in the plan; `core_attn` alone names that
    /// default among other sets).
    pub recompute_modules: Vec<RecomputeModules>,
    /// Allowed recompute modes.
    pub recompute: Vec<Recompute>,
    /// Allowed sequence-parallel settings (only meaningful when tp > 1).
    pub sequence_parallel: Vec<bool>,
    /// Allowed pipeline schedules.
    pub schedules: Vec<Schedule>,
    /// Rank orders to consider. An order is only tried for a degree tuple when it puts some
    /// group on a different fabric than an order listed before it (the first listed wins ties).
    pub orders: Vec<RankOrder>,
    /// GiB kept free on every GPU.
    pub memory_headroom_gib: f64,
    /// TP groups must sit inside one NVLink domain.
    pub tp_within_domain: bool,
    /// CP groups must sit inside one NVLink domain.
    pub cp_within_domain: bool,
    /// EP groups must sit inside one NVLink domain.
    pub ep_within_domain: bool,
    /// Plans returned.
    pub top_k: u32,
    /// Refuse spaces with more candidates than this (`None`: no cap).
    pub max_candidates: Option<u64>,
    /// Return distinct plans: `top_k` groups of plans indistinguishable at the cost model's
    /// resolution, the best of each with its group size ([`crate::search::search`]); `false`
    /// (the default here) returns the `top_k` best plans one by one.
    #[serde(default)]
    pub distinct: bool,
}

impl Default for SearchSpace {
    fn default() -> Self {
        SearchSpace {
            dp: Degree::default(),
            tp: Degree::default(),
            pp: Degree::default(),
            ep: Degree::default(),
            cp: Degree::default(),
            etp: Degree::default(),
            vpp: Degree {
                fixed: None,
                min: None,
                max: Some(DEFAULT_MAX_VPP),
            },
            micro_batch: Degree {
                fixed: None,
                min: None,
                max: Some(DEFAULT_MAX_MICRO_BATCH),
            },
            fold: true,
            dispatchers: Vec::new(),
            ep_overlap: Vec::new(),
            cp_exchanges: Vec::new(),
            zero: vec![0, 1, 2, 3],
            recompute: Recompute::DEFAULT.to_vec(),
            recompute_modules: Vec::new(),
            sequence_parallel: vec![false, true],
            schedules: Schedule::ALL.to_vec(),
            orders: vec![RankOrder::DEFAULT],
            memory_headroom_gib: DEFAULT_MEMORY_HEADROOM_GIB,
            tp_within_domain: true,
            cp_within_domain: false,
            ep_within_domain: false,
            top_k: DEFAULT_TOP_K,
            max_candidates: None,
            distinct: false,
        }
    }
}

impl SearchSpace {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        for (name, d) in [
            ("dp", &self.dp),
            ("tp", &self.tp),
            ("pp", &self.pp),
            ("ep", &self.ep),
            ("cp", &self.cp),
            ("etp", &self.etp),
            ("vpp", &self.vpp),
            ("micro_batch", &self.micro_batch),
        ] {
            d.validate(name)?;
        }
        // The search lists every allowed value of vpp and micro_batch: their limits bound it.
        limits::check("space.top_k", self.top_k)?;
        if self.zero.is_empty() {
            return Err(Error::invalid(
                "space.zero",
                "[]",
                "a non-empty subset of {0, 1, 2, 3}",
            ));
        }
        for &z in &self.zero {
            limits::check("space.zero", z)?;
        }
        if self.recompute.is_empty() {
            return Err(Error::invalid(
                "space.recompute",
                "[]",
                "a non-empty subset of {none, selective, full}",
            ));
        }
        if self.sequence_parallel.is_empty() {
            return Err(Error::invalid(
                "space.sequence_parallel",
                "[]",
                "a non-empty subset of {false, true}",
            ));
        }
        if self.schedules.is_empty() {
            return Err(Error::invalid(
                "space.schedules",
                "[]",
                "a non-empty subset of {1f1b, interleaved-1f1b, zb-h1}",
            ));
        }
        if self.orders.is_empty() {
            return Err(Error::invalid(
                "space.orders",
                "[]",
                "a non-empty list of rank orders such as tp-cp-ep-dp-pp",
            ));
        }
        if !(self.memory_headroom_gib.is_finite() && self.memory_headroom_gib >= 0.0) {
            return Err(Error::invalid(
                "space.memory_headroom_gib",
                self.memory_headroom_gib,
                "a finite number >= 0",
            ));
        }
        limits::check_opt("space.max_candidates", self.max_candidates)?;
        Ok(())
    }
}

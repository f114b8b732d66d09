//! The whole feasible space of a search as columns: one vector per degree, knob and metric, every
//! feasible plan a row, ranked best first (what [`crate::feasible_space`] returns). Categorical
//! knobs (recompute, schedule, rank order, MoE dispatcher) are small integer codes with their labels alongside,
//! so a front end can hand the columns to NumPy without a per-plan object.

use serde::{Deserialize, Serialize};

use crate::plan::{
    CpExchange, Dispatcher, Plan, RankOrder, Recompute, RecomputeModule, RecomputeModules, Schedule,
};
use crate::report::{MemoryBreakdown, SearchStats, TimeBreakdown};

/// Default cap on the rows of a feasible space (about 200 bytes each).
pub const DEFAULT_MAX_PLANS: u64 = 5_000_000;

/// The values of one column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Column {
    U8(Vec<u8>),
    U32(Vec<u32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
}

impl Column {
    /// Rows in the column.
    pub fn len(&self) -> usize {
        match self {
            Column::U8(v) => v.len(),
            Column::U32(v) => v.len(),
            Column::F64(v) => v.len(),
            Column::Bool(v) => v.len(),
        }
    }

    /// Whether the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every feasible plan of a search space, as columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeasibleSpace {
    /// (name, values), in a fixed order: `rank`, the plan's fields, then the metrics and the
    /// `memory_gib.*` / `time_s.*` breakdowns (the columns of `meshplan search --csv` less
    /// `feasible`). Row `i` is the plan ranked `i + 1`.
    pub columns: Vec<(String, Column)>,
    /// Labels of the coded columns: code `k` of `recompute`, `schedule` and `order` means
    /// `categories[column][k]`.
    pub categories: Vec<(String, Vec<String>)>,
    pub stats: SearchStats,
}

impl FeasibleSpace {
    /// The column called `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// Rows (feasible plans).
    pub fn len(&self) -> usize {
        self.columns.first().map_or(0, |(_, c)| c.len())
    }

    /// Whether no plan is feasible.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One feasible plan with everything its row holds.
pub(crate) struct Row {
    pub plan: Plan,
    pub tokens_per_s_per_gpu: f64,
    pub mfu: f64,
    pub model_tflops_per_gpu: f64,
    pub hardware_tflops_per_gpu: f64,
    pub micro_batches: u32,
    pub worst_stage: u32,
    pub memory: MemoryBreakdown,
    pub time: TimeBreakdown,
}

macro_rules! columns {
    (|$r:ident, $codes:ident| $( $field:ident : $ty:ty = $name:literal, $kind:ident, $value:expr; )*) => {
        /// Rows collected column by column.
        #[derive(Default)]
        pub(crate) struct Rows {
            $( $field: Vec<$ty>, )*
        }

        impl Rows {
            pub fn len(&self) -> usize {
                self.tokens_per_s_per_gpu.len()
            }

            pub fn push(&mut self, $r: &Row, $codes: &Codes) {
                $( self.$field.push($value); )*
            }

            /// The chunks one after the other, each row copied once.
            pub fn concat(chunks: Vec<Rows>) -> Rows {
                let n = chunks.iter().map(Rows::len).sum();
                let mut out = Rows {
                    $( $field: Vec::with_capacity(n), )*
                };
                for mut c in chunks {
                    $( out.$field.append(&mut c.$field); )*
                }
                out
            }

            /// Reorders every column by `perm` (row `i` becomes old row `perm[i]`).
            fn permute(&mut self, perm: &[u32]) {
                $( self.$field = perm.iter().map(|&i| self.$field[i as usize]).collect(); )*
            }

            fn into_columns(self) -> Vec<(String, Column)> {
                vec![ $( ($name.to_string(), Column::$kind(self.$field)), )* ]
            }
        }
    };
}

/// Codes of the categorical columns.
pub(crate) struct Codes {
    orders: Vec<RankOrder>,
}

impl Codes {
    pub fn new(orders: &[RankOrder]) -> Self {
        let mut unique: Vec<RankOrder> = Vec::with_capacity(orders.len());
        for o in orders {
            if !unique.contains(o) {
                unique.push(*o);
            }
        }
        Codes { orders: unique }
    }

    fn order(&self, order: RankOrder) -> u8 {
        self.orders.iter().position(|o| *o == order).unwrap_or(0) as u8
    }

    fn categories(&self) -> Vec<(String, Vec<String>)> {
        vec![
            (
                "recompute".into(),
                Recompute::ALL
                    .iter()
                    .map(|r| r.name().to_string())
                    .collect(),
            ),
            (
                "schedule".into(),
                Schedule::ALL.iter().map(|s| s.name().to_string()).collect(),
            ),
            (
                "order".into(),
                self.orders.iter().map(|o| o.to_string()).collect(),
            ),
            (
                "dispatcher".into(),
                std::iter::once("none".to_string())
                    .chain(Dispatcher::ALL.iter().map(|d| d.name().to_string()))
                    .collect(),
            ),
            (
                "cp_exchange".into(),
                std::iter::once("default".to_string())
                    .chain(CpExchange::ALL.iter().map(|x| x.name().to_string()))
                    .collect(),
            ),
            // The code is the set's bits (bit i: RecomputeModule::ALL[i]); 0 "default": the plan
            // names no modules.
            (
                "recompute_modules".into(),
                (0u8..1 << RecomputeModule::ALL.len())
                    .map(|bits| match bits {
                        0 => "default".to_string(),
                        _ => RecomputeModules::from_bits(bits).to_string(),
                    })
                    .collect(),
            ),
        ]
    }
}

fn recompute_code(r: Recompute) -> u8 {
    Recompute::ALL.iter().position(|x| *x == r).unwrap_or(0) as u8
}

/// 0 for a plan without a dispatcher (`ep = 1`), else 1 + its index in [`Dispatcher::ALL`].
fn dispatcher_code(d: Option<Dispatcher>) -> u8 {
    d.map_or(0, |d| {
        1 + Dispatcher::ALL.iter().position(|x| *x == d).unwrap_or(0) as u8
    })
}

/// 0 for a plan that leaves its CP exchange to the stack (`None`), else 1 + its index in
/// [`CpExchange::ALL`].
fn cp_exchange_code(x: Option<CpExchange>) -> u8 {
    x.map_or(0, |x| {
        1 + CpExchange::ALL.iter().position(|y| *y == x).unwrap_or(0) as u8
    })
}

fn schedule_code(s: Schedule) -> u8 {
    Schedule::ALL.iter().position(|x| *x == s).unwrap_or(0) as u8
}

columns! {
    |r, c|
    rank: u32 = "rank", U32, 0;
    dp: u32 = "dp", U32, r.plan.dp;
    tp: u32 = "tp", U32, r.plan.tp;
    pp: u32 = "pp", U32, r.plan.pp;
    ep: u32 = "ep", U32, r.plan.ep;
    cp: u32 = "cp", U32, r.plan.cp;
    vpp: u32 = "vpp", U32, r.plan.vpp;
    micro_batch: u32 = "micro_batch", U32, r.plan.micro_batch;
    zero: u8 = "zero", U8, r.plan.zero;
    recompute: u8 = "recompute", U8, recompute_code(r.plan.recompute);
    sequence_parallel: bool = "sequence_parallel", Bool, r.plan.sequence_parallel;
    schedule: u8 = "schedule", U8, schedule_code(r.plan.schedule());
    order: u8 = "order", U8, c.order(r.plan.order);
    etp: u32 = "etp", U32, r.plan.etp.unwrap_or(0);
    dispatcher: u8 = "dispatcher", U8, dispatcher_code(r.plan.dispatcher);
    ep_overlap: bool = "ep_overlap", Bool, r.plan.ep_overlap;
    cp_exchange: u8 = "cp_exchange", U8, cp_exchange_code(r.plan.cp_exchange);
    recompute_modules: u8 = "recompute_modules", U8, r.plan.recompute_modules.map_or(0, |m| m.bits());
    step_time_s: f64 = "step_time_s", F64, r.time.total();
    tokens_per_s_per_gpu: f64 = "tokens_per_s_per_gpu", F64, r.tokens_per_s_per_gpu;
    mfu: f64 = "mfu", F64, r.mfu;
    model_tflops_per_gpu: f64 = "model_tflops_per_gpu", F64, r.model_tflops_per_gpu;
    hardware_tflops_per_gpu: f64 = "hardware_tflops_per_gpu", F64, r.hardware_tflops_per_gpu;
    peak_memory_gib: f64 = "peak_memory_gib", F64, r.memory.total();
    micro_batches: u32 = "micro_batches", U32, r.micro_batches;
    worst_stage: u32 = "worst_stage", U32, r.worst_stage;
    mem_weights: f64 = "memory_gib.weights", F64, r.memory.weights;
    mem_gradients: f64 = "memory_gib.gradients", F64, r.memory.gradients;
    mem_optimizer: f64 = "memory_gib.optimizer", F64, r.memory.optimizer;
    mem_activations: f64 = "memory_gib.activations", F64, r.memory.activations;
    mem_transient: f64 = "memory_gib.transient", F64, r.memory.transient;
    mem_fixed: f64 = "memory_gib.fixed", F64, r.memory.fixed;
    t_compute: f64 = "time_s.compute", F64, r.time.compute;
    t_tp: f64 = "time_s.tp", F64, r.time.tp;
    t_cp: f64 = "time_s.cp", F64, r.time.cp;
    t_ep: f64 = "time_s.ep", F64, r.time.ep;
    t_pp_p2p: f64 = "time_s.pp_p2p", F64, r.time.pp_p2p;
    t_bubble: f64 = "time_s.bubble", F64, r.time.bubble;
    t_dp: f64 = "time_s.dp", F64, r.time.dp;
    t_optimizer: f64 = "time_s.optimizer", F64, r.time.optimizer;
}

impl Rows {
    /// The ranked columns: best tokens/s per GPU first, ties by the plan's fields (the order of
    /// a search's ranking), `rank` filled in.
    pub fn finish(mut self, codes: &Codes, stats: SearchStats) -> FeasibleSpace {
        let key = |i: usize| {
            (
                // etp 0: unfolded, ordered before every folded etp as `None` in a search;
                // dispatcher 0: none, then in `Dispatcher::ALL` order, as the enum orders.
                (
                    self.tp[i],
                    self.etp[i],
                    self.dispatcher[i],
                    self.ep_overlap[i],
                    self.cp_exchange[i],
                    self.recompute_modules[i],
                ),
                self.pp[i],
                self.cp[i],
                self.ep[i],
                self.dp[i],
                self.vpp[i],
                self.micro_batch[i],
                self.zero[i],
                self.recompute[i],
                self.sequence_parallel[i],
                self.schedule[i],
                codes.orders[self.order[i] as usize],
            )
        };
        // Sorted on (tokens/s, row) pairs: the plan's fields are only read to break ties.
        let mut order: Vec<(f64, u32)> = self
            .tokens_per_s_per_gpu
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, i as u32))
            .collect();
        order.sort_unstable_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then_with(|| key(a.1 as usize).cmp(&key(b.1 as usize)))
        });
        let perm: Vec<u32> = order.into_iter().map(|(_, i)| i).collect();
        if perm.iter().enumerate().any(|(i, &j)| i as u32 != j) {
            self.permute(&perm);
        }
        drop(perm);
        self.rank = (1..=self.len() as u32).collect();
        FeasibleSpace {
            columns: self.into_columns(),
            categories: codes.categories(),
            stats,
        }
    }
}

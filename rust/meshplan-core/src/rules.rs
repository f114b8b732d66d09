//! The feasibility rules (docs/costmodel.md §8.2; a training stack's own rules first, from
//! `data/stacks.toml`) as data: each [`Rule`] has the key reports count it
//! under and the [`Scope`] of plans it removes at once, which is what lets the search count a
//! whole degree tuple, micro-batch or (micro-batch, schedule) cell with one check. The checks
//! themselves are `evaluate::structural_rules` (in this order) and the memory test.

/// How many plans one verdict of a rule covers in the search's enumeration (degrees → rank
/// order → micro-batch → schedule → ZeRO × recompute × sequence parallel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// A training stack's rule ([`crate::stack::Stack::rules`]): depends on the degrees, rank
    /// order, schedule and knobs but never on the micro-batch, so the search applies it when it
    /// enumerates a tuple's knob values and counts what it removes there.
    Stack,
    /// Depends on the degrees only: every plan of the degree tuple (and rank order).
    Degrees,
    /// Depends on the degrees and the micro-batch: every plan of the micro-batch.
    MicroBatch,
    /// Depends on the degrees, rank order, micro-batch and schedule: every plan of the cell.
    Cell,
    /// Depends on every knob: one plan.
    Plan,
}

/// A reason a plan cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// The stack has no training at the workload's precision.
    StackPrecision,
    /// The stack cannot run a degree > 1 on one of the axes.
    StackParallelism,
    /// The stack cannot build the rank order.
    StackOrder,
    /// The stack has no such pipeline schedule.
    StackSchedule,
    /// The stack cannot split the layers into the plan's (virtual) pipeline stages.
    StackLayerSplit,
    /// The stack has no such ZeRO stage (for these degrees).
    StackZero,
    /// The stack has no such recompute mode.
    StackRecompute,
    /// The stack does not allow this sequence-parallel setting with TP.
    StackSequenceParallel,
    /// `tp` does not divide the attention heads.
    TpHeads,
    /// `tp` neither divides nor is a multiple of the KV heads.
    TpKvHeads,
    /// `tp` does not divide an FFN width.
    TpFfn,
    /// `ep` does not divide the experts, or `ep > 1` on a dense model.
    EpExperts,
    /// The sequence is not a multiple of `2·cp`.
    CpSeqLen,
    /// A layer's mixer cannot be split `cp` ways (gated DeltaNet has no CP; Mamba-2 needs its
    /// heads and groups on `tp·cp` ranks).
    CpMixer,
    /// The global batch is not a multiple of `micro_batch·dp·ep`.
    Batch,
    /// More model chunks than layers plus the embedding and loss chunks.
    PpLayers,
    /// A pipeline schedule without a pipeline.
    Schedule,
    /// Interleaved 1F1B with micro-batches not a multiple of `pp`.
    InterleaveMicrobatches,
    /// The TP group leaves the NVLink domain (when the space requires it inside).
    TpDomain,
    /// The CP group leaves the NVLink domain (when the space requires it inside).
    CpDomain,
    /// The EP group leaves the NVLink domain (when the space requires it inside).
    EpDomain,
    /// The peak memory exceeds the usable memory.
    Memory,
}

impl Rule {
    /// Every rule, in the order they are checked.
    pub const ALL: [Rule; 22] = [
        Rule::StackPrecision,
        Rule::StackParallelism,
        Rule::StackOrder,
        Rule::StackSchedule,
        Rule::StackLayerSplit,
        Rule::StackZero,
        Rule::StackRecompute,
        Rule::StackSequenceParallel,
        Rule::TpHeads,
        Rule::TpKvHeads,
        Rule::TpFfn,
        Rule::EpExperts,
        Rule::CpSeqLen,
        Rule::CpMixer,
        Rule::Batch,
        Rule::PpLayers,
        Rule::Schedule,
        Rule::InterleaveMicrobatches,
        Rule::TpDomain,
        Rule::CpDomain,
        Rule::EpDomain,
        Rule::Memory,
    ];

    /// The key reports use (`SearchStats::pruned`, `Violation::rule`).
    pub fn key(self) -> &'static str {
        match self {
            Rule::StackPrecision => "stack_precision",
            Rule::StackParallelism => "stack_parallelism",
            Rule::StackOrder => "stack_order",
            Rule::StackSchedule => "stack_schedule",
            Rule::StackLayerSplit => "stack_layer_split",
            Rule::StackZero => "stack_zero",
            Rule::StackRecompute => "stack_recompute",
            Rule::StackSequenceParallel => "stack_sequence_parallel",
            Rule::TpHeads => "tp_heads",
            Rule::TpKvHeads => "tp_kv_heads",
            Rule::TpFfn => "tp_ffn",
            Rule::EpExperts => "ep_experts",
            Rule::CpSeqLen => "cp_seq_len",
            Rule::CpMixer => "cp_mixer",
            Rule::Batch => "batch",
            Rule::PpLayers => "pp_layers",
            Rule::Schedule => "schedule",
            Rule::InterleaveMicrobatches => "interleave_microbatches",
            Rule::TpDomain => "tp_domain",
            Rule::CpDomain => "cp_domain",
            Rule::EpDomain => "ep_domain",
            Rule::Memory => "memory",
        }
    }

    /// The plans one verdict covers, given that the rules before it passed. The domain rules
    /// depend on the rank order only, but are counted per cell: a cell's plans go to the first
    /// rule they break, and `batch` or a schedule rule may come first.
    pub fn scope(self) -> Scope {
        match self {
            Rule::StackPrecision
            | Rule::StackParallelism
            | Rule::StackOrder
            | Rule::StackSchedule
            | Rule::StackLayerSplit
            | Rule::StackZero
            | Rule::StackRecompute
            | Rule::StackSequenceParallel => Scope::Stack,
            Rule::TpHeads
            | Rule::TpKvHeads
            | Rule::TpFfn
            | Rule::EpExperts
            | Rule::CpSeqLen
            | Rule::CpMixer => Scope::Degrees,
            Rule::Batch => Scope::MicroBatch,
            Rule::PpLayers
            | Rule::Schedule
            | Rule::InterleaveMicrobatches
            | Rule::TpDomain
            | Rule::CpDomain
            | Rule::EpDomain => Scope::Cell,
            Rule::Memory => Scope::Plan,
        }
    }

    /// Position in [`Rule::ALL`] (an index into per-rule counters).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Plans removed per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneCounts([u64; Rule::ALL.len()]);

impl PruneCounts {
    /// Counts `n` plans removed by `rule`.
    pub fn add(&mut self, rule: Rule, n: u64) {
        self.0[rule.index()] += n;
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &PruneCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// `(rule, count)` for every rule that removed a plan.
    pub fn nonzero(&self) -> impl Iterator<Item = (Rule, u64)> + '_ {
        Rule::ALL
            .iter()
            .map(|&r| (r, self.0[r.index()]))
            .filter(|&(_, n)| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_listed_in_index_order_with_distinct_keys() {
        for (i, r) in Rule::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let mut keys: Vec<_> = Rule::ALL.iter().map(|r| r.key()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), Rule::ALL.len());
    }

    #[test]
    fn scopes_narrow_along_the_check_order() {
        let scopes: Vec<Scope> = Rule::ALL.iter().map(|r| r.scope()).collect();
        assert!(scopes.windows(2).all(|w| w[0] <= w[1]), "{scopes:?}");
        assert_eq!(Rule::Batch.scope(), Scope::MicroBatch);
    }

    #[test]
    fn counts_merge_and_skip_zeros() {
        let mut a = PruneCounts::default();
        a.add(Rule::Batch, 3);
        let mut b = PruneCounts::default();
        b.add(Rule::Batch, 2);
        b.add(Rule::Memory, 1);
        a.merge(&b);
        let got: Vec<_> = a.nonzero().collect();
        assert_eq!(got, vec![(Rule::Batch, 5), (Rule::Memory, 1)]);
    }
}

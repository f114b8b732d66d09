//! How layers are split over pipeline ranks and how many micro-batches each rank holds in flight
//! (docs/costmodel.md §2.5, §4).
//!
//! Uneven splits follow Megatron's `account_for_embedding/loss_in_pipeline_split`: when `L` is not
//! a multiple of the rank count, the first and last ranks (which also carry the embedding and the
//! LM head) are the ones given one layer fewer. The layers are dealt out in model order
//! ([`Model::layer_stack`]), so the dense leading layers of an MoE model (`first_dense_layers`)
//! sit on the first rank(s). A rank holds counts per layer kind ([`LayerCounts`]).
//!
//! A pipeline is described by its [`StageRun`]s — maximal runs of consecutive ranks with the same
//! shape (layers, first, last) — never by one entry per rank: a pipeline of any `pp` has at most
//! [`MAX_RUNS`] of them, so the work and memory of everything built on it depend on the plan's
//! structure, not on the value of `pp` (issue 9: `pp = 2^31` asked for a 34 GB vector).
//!
//! A hybrid model (a `layer_pattern`: Mamba-2, attention, FFN-only layers of very different
//! cost) is split by cost instead ([`balanced_ranks`]): each layer weighs its forward FLOPs per
//! token ([`layer_costs`], from the same [`crate::layer::layer_ops`] shapes; a Mamba-2 scan at
//! the flash-attention-equivalent floor its time is charged at), the last rank also
//! the LM head, and the contiguous split into `pp` non-empty ranks minimises the heaviest rank
//! (a custom layout: GPT models take one with Megatron's `--pipeline-model-parallel-layout`;
//! Megatron-Core's MambaStack itself deals the pattern out by count). Its ranks are at
//! most `min(pp, L)` runs; `pp > L` falls back to the count split.

use crate::layer::{core_of, LayerCounts, MAX_LAYER_KINDS};
use crate::model::Model;
use crate::plan::{Plan, Schedule};

/// The layers one pipeline rank holds (all of its virtual chunks together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// Index of the pipeline rank, 0-based.
    pub index: u32,
    /// Layers per kind of the model's [`crate::layer::LayerKinds`].
    pub kinds: LayerCounts,
    /// Holds the input embedding.
    pub first: bool,
    /// Holds the final norm, LM head and loss.
    pub last: bool,
}

impl Stage {
    /// Transformer layers on this rank.
    pub fn layers(&self) -> u32 {
        self.kinds.total()
    }

    /// Whether `other` has the same shape (everything but the index).
    pub fn same_shape(&self, other: &Stage) -> bool {
        (self.kinds, self.first, self.last) == (other.kinds, other.first, other.last)
    }
}

/// `count` consecutive pipeline ranks of one shape, the first of them `stage` (its `index` is the
/// run's first rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageRun {
    pub stage: Stage,
    pub count: u32,
}

impl StageRun {
    /// The rank `index` of this run (same shape).
    pub fn at(&self, index: u32) -> Stage {
        debug_assert!(index >= self.stage.index && index - self.stage.index < self.count);
        Stage {
            index,
            ..self.stage
        }
    }

    /// Index of the run's last rank.
    pub fn last_index(&self) -> u32 {
        self.stage.index + (self.count - 1)
    }

    /// The run's ranks in order (use only where the count is known to be small).
    pub fn ranks(&self) -> impl Iterator<Item = Stage> + '_ {
        (0..self.count).map(move |i| self.at(self.stage.index + i))
    }
}

/// The most runs a pipeline has: first rank, middle ranks with one layer more, middle ranks with
/// the base count, last rank — each middle block cut in up to three by the dense/MoE boundary.
pub const MAX_RUNS: usize = 8;

/// Layers per pipeline rank as runs `(first rank, ranks, layers each)`: `L / p` each, the
/// remainder given to the middle ranks first, then the last, then the first.
fn layer_runs(layers: u32, pp: u32) -> [(u32, u32, u32); 4] {
    let base = layers / pp;
    let rem = layers % pp;
    if pp == 1 {
        return [(0, 1, layers), (1, 0, 0), (1, 0, 0), (1, 0, 0)];
    }
    let middle = pp - 2;
    // Preference for the extra layers: middle ranks, then the last, then the first (`rem < pp`,
    // so the first gets one only when every other rank has).
    let extra_middle = rem.min(middle);
    let extra_last = u32::from(rem > middle);
    let extra_first = u32::from(rem > middle + 1);
    [
        (0, 1, base + extra_first),
        (1, extra_middle, base + 1),
        (1 + extra_middle, middle - extra_middle, base),
        (pp - 1, 1, base + extra_last),
    ]
}

/// Layers per pipeline rank (all kinds together) as runs `(first rank, ranks, layers each)`, in
/// rank order; runs of zero ranks are empty. What a stack's layer-split rule and exporters read.
pub fn rank_layer_runs(layers: u32, pp: u32) -> [(u32, u32, u32); 4] {
    layer_runs(layers, pp.max(1))
}

/// [`rank_layer_runs`] for `plan`: with the first and/or last rank's layers fixed
/// ([`Plan::first_stage_layers`], [`Plan::last_stage_layers`]) the other ranks share the rest
/// equally ([`Plan::validate_split`] has checked that they can); else the default split.
pub fn plan_layer_runs(layers: u32, plan: &Plan) -> [(u32, u32, u32); 4] {
    let pp = plan.pp.max(1);
    let (first, last) = (plan.first_stage_layers, plan.last_stage_layers);
    if pp == 1 || (first.is_none() && last.is_none()) {
        return layer_runs(layers, pp);
    }
    let fixed = first.unwrap_or(0) as u64 + last.unwrap_or(0) as u64;
    let free = pp as u64 - u64::from(first.is_some()) - u64::from(last.is_some());
    let share = (layers as u64)
        .saturating_sub(fixed)
        .checked_div(free)
        .unwrap_or(0) as u32;
    [
        (0, 1, first.unwrap_or(share)),
        (1, pp - 2, share),
        (pp - 1, 0, 0),
        (pp - 1, 1, last.unwrap_or(share)),
    ]
}

/// Layers per pipeline rank of `plan` on a model of `layers` layers, in rank order as runs
/// `(ranks, layers each)` (the non-empty runs of [`plan_layer_runs`]), after checking the counts
/// (one-line errors). What the exporters write rank by rank, so that a layout says the split the
/// cost model times.
pub fn rank_layer_counts(layers: u32, plan: &Plan) -> crate::error::Result<Vec<(u32, u32)>> {
    crate::limits::check("model.layers", layers)?;
    crate::limits::check("plan.pp", plan.pp)?;
    plan.validate_split(layers)?;
    Ok(plan_layer_runs(layers, plan)
        .into_iter()
        .filter(|&(_, ranks, _)| ranks > 0)
        .map(|(_, ranks, each)| (ranks, each))
        .collect())
}

/// Forward FLOPs per token of one layer of each kind of `model` (unsharded) on sequences of
/// `seq_len` tokens: `2·N_active` of its matmuls plus its core (attention over its causal keys,
/// a scan; Mamba-2's SSD at its flash-attention-equivalent floor, docs/costmodel.md §1.4, the
/// FLOPs its time is worth): what [`balanced_ranks`] weighs layers by.
pub fn layer_costs(model: &Model, seq_len: u32) -> [f64; MAX_LAYER_KINDS] {
    let mut out = [0.0; MAX_LAYER_KINDS];
    let crossover = crate::device::ssd_flash_crossover_keys();
    for (k, spec) in model.layer_kinds().specs().iter().enumerate() {
        let core = core_of(model, &spec.mixer, 1);
        out[k] = 2.0 * spec.active_matmul_params(model) as f64
            + core.fwd_time_flops_with_keys(core.keys_per_query(seq_len as f64), crossover);
    }
    out
}

/// Forward FLOPs per token the last rank spends on the LM head, `2·V·h`.
pub fn head_cost(model: &Model) -> f64 {
    2.0 * model.vocab as f64 * model.hidden as f64
}

/// A cost-balanced split of `model`'s layers over `pp` ranks (`2 ≤ pp ≤ L`): layers per rank
/// per kind, in rank order, each rank non-empty, minimising the largest rank cost (layers by
/// [`layer_costs`], the last rank's LM head by [`head_cost`]). The bottleneck is found by
/// bisection on a greedy fill from the last rank; the fill leaves one layer for every rank
/// still to fill.
pub fn balanced_ranks(model: &Model, pp: u32, seq_len: u32) -> Vec<LayerCounts> {
    let costs = layer_costs(model, seq_len);
    let head = head_cost(model);
    let layers: Vec<usize> = model
        .layer_stack()
        .iter()
        .flat_map(|&(k, n)| std::iter::repeat_n(k, n as usize))
        .collect();
    let pp = (pp as usize).clamp(1, layers.len().max(1));
    // Ranks the greedy fill from the end needs under bottleneck `limit` (usize::MAX when one
    // layer alone exceeds it).
    let ranks_needed = |limit: f64| -> usize {
        let (mut ranks, mut load, mut empty) = (1usize, head, true);
        for &k in layers.iter().rev() {
            let c = costs[k];
            if load + c > limit {
                if empty || c > limit {
                    return usize::MAX;
                }
                ranks += 1;
                load = 0.0;
            }
            load += c;
            empty = false;
        }
        ranks
    };
    let total: f64 = head + layers.iter().map(|&k| costs[k]).sum::<f64>();
    let (mut lo, mut hi) = (0.0f64, total);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if ranks_needed(mid) <= pp {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // Fill from the last rank under `hi`, leaving at least one layer per rank still to fill.
    let mut out = vec![LayerCounts::default(); pp];
    let mut next = layers.len(); // layers[..next] are still unassigned
    for rank in (0..pp).rev() {
        let mut load = if rank == pp - 1 { head } else { 0.0 };
        let mut counts = [0u32; MAX_LAYER_KINDS];
        while next > rank {
            let k = layers[next - 1];
            let took_one = counts.iter().any(|&n| n > 0);
            if rank > 0 && took_one && load + costs[k] > hi {
                break;
            }
            load += costs[k];
            counts[k] += 1;
            next -= 1;
        }
        out[rank] = LayerCounts(counts);
    }
    out
}

/// The pipeline ranks of `model` on `pp` ranks as runs of one shape, in rank order, covering
/// ranks `0..pp` exactly; at most [`MAX_RUNS`] of them, whatever `pp` is — except for a model
/// with a layer pattern and `2 ≤ pp ≤ L`, split by cost ([`balanced_ranks`], on sequences of
/// `seq_len` tokens) into at most `pp` runs.
pub fn stage_runs(model: &Model, pp: u32, seq_len: u32) -> Vec<StageRun> {
    let pp = pp.max(1);
    split_runs(model, pp, seq_len, layer_runs(model.layers, pp), true)
}

/// [`stage_runs`] for `plan`: its fixed end-rank layer counts where it gives them
/// ([`plan_layer_runs`], a count split whatever the model), else [`stage_runs`].
pub fn plan_stage_runs(model: &Model, plan: &Plan, seq_len: u32) -> Vec<StageRun> {
    let pp = plan.pp.max(1);
    let fixed = plan.first_stage_layers.is_some() || plan.last_stage_layers.is_some();
    split_runs(
        model,
        pp,
        seq_len,
        plan_layer_runs(model.layers, plan),
        !fixed,
    )
}

/// The stage runs of `model` on `pp` ranks holding `blocks` layers (runs of
/// [`layer_runs`]); a hybrid model is balanced by cost instead when `balance` is set.
fn split_runs(
    model: &Model,
    pp: u32,
    seq_len: u32,
    blocks: [(u32, u32, u32); 4],
    balance: bool,
) -> Vec<StageRun> {
    if balance && model.layer_pattern.is_some() && pp > 1 && pp <= model.layers {
        let mut runs: Vec<StageRun> = Vec::new();
        for (index, kinds) in balanced_ranks(model, pp, seq_len).into_iter().enumerate() {
            let stage = Stage {
                index: index as u32,
                kinds,
                first: index == 0,
                last: index as u32 == pp - 1,
            };
            match runs.last_mut() {
                Some(prev) if prev.stage.same_shape(&stage) => prev.count += 1,
                _ => runs.push(StageRun { stage, count: 1 }),
            }
        }
        return runs;
    }
    // The model's layers as (kind, first layer, end) in order.
    let mut layer_runs_by_kind: Vec<(usize, u64, u64)> = Vec::with_capacity(MAX_LAYER_KINDS);
    let mut end = 0u64;
    for (kind, count) in model.layer_stack() {
        layer_runs_by_kind.push((kind, end, end + count as u64));
        end += count as u64;
    }
    // Layers per kind in the layer range `[from, to)`.
    let counts_in = |from: u64, to: u64| {
        let mut counts = [0u32; MAX_LAYER_KINDS];
        for &(kind, a, b) in &layer_runs_by_kind {
            let (lo, hi) = (a.max(from), b.min(to));
            if hi > lo {
                counts[kind] += (hi - lo) as u32;
            }
        }
        LayerCounts(counts)
    };
    let mut runs: Vec<StageRun> = Vec::with_capacity(MAX_RUNS);
    let mut push = |index: u32, count: u32, kinds: LayerCounts| {
        if count == 0 {
            return;
        }
        let stage = Stage {
            index,
            kinds,
            first: index == 0,
            last: index + (count - 1) == pp - 1,
        };
        match runs.last_mut() {
            Some(prev) if prev.stage.same_shape(&stage) => prev.count += count,
            _ => runs.push(StageRun { stage, count }),
        }
    };
    // Layers before the block's first rank (in u64: `pp` ranks of up to `L` layers).
    let mut start = 0u64;
    for (index, count, n) in blocks {
        if count == 0 {
            continue;
        }
        if n == 0 {
            push(index, count, LayerCounts::default());
            continue;
        }
        // The block's ranks take `n` layers each: the ranks wholly inside one run of the model's
        // layers form one run of ranks, a rank across a boundary between two is a run of its
        // own — a handful of pieces, whatever `count` is.
        let (mut rank, mut left, mut at) = (index, count, start);
        while left > 0 {
            let run_end = layer_runs_by_kind
                .iter()
                .find(|&&(_, a, b)| a <= at && at < b)
                .map_or(at + n as u64, |&(_, _, b)| b);
            let whole = ((run_end - at) / n as u64).min(left as u64) as u32;
            if whole > 0 {
                push(rank, whole, counts_in(at, at + n as u64));
                rank += whole;
                left -= whole;
                at += whole as u64 * n as u64;
            }
            if left > 0 {
                push(rank, 1, counts_in(at, at + n as u64));
                rank += 1;
                left -= 1;
                at += n as u64;
            }
        }
        start += count as u64 * n as u64;
    }
    debug_assert!(model.layer_pattern.is_some() || runs.len() <= MAX_RUNS);
    runs
}

/// Micro-batches' worth of activations rank `stage` holds at its peak (docs/costmodel.md §2.5):
/// 1F1B and ZB-H1 `min(p − j, m)`; interleaved 1F1B counts warm-up chunks,
/// `2(p − j − 1) + (v − 1)·p + 1` chunks of `1/v` of the rank's layers, capped at `m·v`.
pub fn in_flight(plan: &Plan, micro_batches: u32, stage: u32) -> f64 {
    in_flight_of(plan.schedule(), plan.pp, plan.vpp, micro_batches, stage)
}

/// [`in_flight`] for `schedule` on `pp` ranks of `vpp` chunks. Never increases with the stage
/// index, and interleaving (`vpp ≥ 2`) never holds less than 1F1B on any rank (the search's
/// memory bounds rely on both).
pub fn in_flight_of(schedule: Schedule, pp: u32, vpp: u32, micro_batches: u32, stage: u32) -> f64 {
    // In u64, so that absurd degrees of an evaluated plan cannot overflow.
    let (p, j, m, v) = (pp as u64, stage as u64, micro_batches as u64, vpp as u64);
    match schedule {
        Schedule::OneFOneB | Schedule::ZeroBubbleH1 => (p - j).min(m) as f64,
        Schedule::Interleaved => {
            let chunks = 2 * (p - j - 1) + (v - 1) * p + 1;
            chunks.min(m * v) as f64 / v as f64
        }
    }
}

/// Adds `x` to `acc` `count` times, one addition after the other — the value a loop over the
/// ranks of a run gives, bit for bit — without a loop over a large run: adding `0.0` changes
/// nothing after the first time, and a run of non-empty ranks holds at most `layers` ranks (every
/// one at least a layer), which the limits bound. Any other long run (only a non-finite `x` makes
/// one) is summed as `count · x`.
pub fn add_repeated(acc: f64, x: f64, count: u32) -> f64 {
    if count == 0 {
        return acc;
    }
    if x == 0.0 {
        return acc + x;
    }
    if count <= crate::limits::MAX_LAYERS {
        let mut acc = acc;
        for _ in 0..count {
            acc += x;
        }
        return acc;
    }
    acc + x * count as f64
}

/// The last rank of `run` whose `value` has the same `key` as the run's first rank, with that
/// value — the rank `max_by(key)` picks from the run (the last of equal maxima) when the key
/// never increases over the run's ranks, as a stage's memory does with its index
/// ([`in_flight_of`]). A bisection: `O(log count)` evaluations.
pub fn last_of_equal_max<T>(
    run: &StageRun,
    mut value: impl FnMut(u32) -> T,
    key: impl Fn(&T) -> f64,
) -> (u32, T) {
    let first = run.stage.index;
    let mut best = value(first);
    let top = key(&best);
    // Invariant: key(value(lo)) == top, and every rank after `hi` is below it.
    let (mut lo, mut hi) = (first, run.last_index());
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        let v = value(mid);
        if key(&v).total_cmp(&top).is_eq() {
            lo = mid;
            best = v;
        } else {
            hi = mid - 1;
        }
    }
    (lo, best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Moe;

    #[test]
    fn rank_layer_counts_are_the_timed_split_and_refuse_what_has_none() {
        let plan = |pp: u32, first: Option<u32>, last: Option<u32>| Plan {
            pp,
            first_stage_layers: first,
            last_stage_layers: last,
            ..Plan::default()
        };
        // DeepSeek-V3's pp 16 layout, and the default split of 61 layers over 16 ranks.
        assert_eq!(
            rank_layer_counts(61, &plan(16, Some(4), Some(1))).unwrap(),
            [(1, 4), (14, 4), (1, 1)]
        );
        assert_eq!(
            rank_layer_counts(61, &plan(16, None, None)).unwrap(),
            [(1, 3), (13, 4), (1, 3), (1, 3)]
        );
        assert_eq!(
            rank_layer_counts(61, &plan(1, None, None)).unwrap(),
            [(1, 61)]
        );
        // Fixed ends with a single rank: a one-line error, not an underflow of the free ranks.
        let e = rank_layer_counts(61, &plan(1, Some(4), Some(1))).unwrap_err();
        assert!(e.to_string().contains("pp = 1"), "{e}");
        let e = rank_layer_counts(61, &plan(u32::MAX, None, None)).unwrap_err();
        assert!(e.to_string().contains("plan.pp"), "{e}");
    }

    #[test]
    fn fixed_end_ranks_take_their_counts_and_the_others_share_the_rest() {
        // DeepSeek-V3 (61 layers, 3 dense first) as Megatron-Bridge's pp 16 layout deals it:
        // `[E + 4] + [4] * 14 + [1 + mtp + loss]`.
        let model = crate::presets::model("deepseek-v3").unwrap();
        let plan = Plan {
            pp: 16,
            ep: 8,
            zero: 1,
            first_stage_layers: Some(4),
            last_stage_layers: Some(1),
            ..Plan::default()
        };
        plan.validate_split(model.layers).unwrap();
        let runs = plan_stage_runs(&model, &plan, 4096);
        let per_rank: Vec<u32> = runs
            .iter()
            .flat_map(|r| r.ranks().map(|s| s.layers()).collect::<Vec<_>>())
            .collect();
        assert_eq!(per_rank, [vec![4], vec![4; 14], vec![1]].concat());
        assert!(runs[0].stage.first && runs.last().unwrap().stage.last);
        // The default split instead: 3, then 4 on ranks 1-13, 3, 3.
        let default: Vec<u32> = stage_runs(&model, 16, 4096)
            .iter()
            .flat_map(|r| r.ranks().map(|s| s.layers()).collect::<Vec<_>>())
            .collect();
        assert_eq!(default, [vec![3], vec![4; 13], vec![3, 3]].concat());
        // Only the first fixed: 61 − 4 = 57 layers do not share equally over the 15 other
        // ranks, a one-line error naming the field.
        let e = Plan {
            last_stage_layers: None,
            ..plan
        }
        .validate_split(model.layers)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("plan.first_stage_layers") && e.contains("15"),
            "{e}"
        );
    }

    /// Layers per pipeline rank, one entry per rank: the reference the runs must reproduce.
    fn layer_counts(layers: u32, pp: u32) -> Vec<u32> {
        let base = layers / pp;
        let rem = layers % pp;
        let mut counts = vec![base; pp as usize];
        let order = (1..pp.saturating_sub(1)).chain(if pp > 1 { vec![pp - 1, 0] } else { vec![0] });
        for j in order.take(rem as usize) {
            counts[j as usize] += 1;
        }
        counts
    }

    /// The ranks one by one (the former `stages`): the reference for `stage_runs`.
    fn stages_reference(model: &Model, pp: u32) -> Vec<Stage> {
        let dense_total = model.dense_layers();
        let moe_kind = model.layer_kinds().len() - 1;
        let mut start = 0u32;
        layer_counts(model.layers, pp)
            .into_iter()
            .enumerate()
            .map(|(j, n)| {
                let dense = dense_total.saturating_sub(start).min(n);
                start += n;
                let mut counts = [0u32; MAX_LAYER_KINDS];
                counts[0] += dense;
                counts[moe_kind] += n - dense;
                Stage {
                    index: j as u32,
                    kinds: LayerCounts(counts),
                    first: j == 0,
                    last: j as u32 == pp - 1,
                }
            })
            .collect()
    }

    fn model(layers: u32, first_dense: Option<u32>) -> Model {
        let mut m = crate::presets::model("llama3-8b").unwrap();
        m.layers = layers;
        m.moe = first_dense.map(|first_dense_layers| Moe {
            num_experts: 8,
            top_k: 2,
            expert_ffn_hidden: 1024,
            shared_experts: 0,
            shared_expert_ffn_hidden: None,
            first_dense_layers,
            latent_size: None,
        });
        m
    }

    #[test]
    fn runs_expand_to_the_ranks_one_by_one() {
        for layers in [1u32, 2, 3, 5, 7, 32, 61, 126] {
            for first_dense in [None, Some(0), Some(1), Some(3), Some(layers - 1)] {
                let m = model(layers, first_dense.map(|f| f.min(layers - 1)));
                for pp in (1..=layers + 5).chain([200, 1000]) {
                    let runs = stage_runs(&m, pp, 4096);
                    assert!(runs.len() <= MAX_RUNS, "{layers} {first_dense:?} {pp}");
                    let expanded: Vec<Stage> = runs.iter().flat_map(|r| r.ranks()).collect();
                    assert_eq!(
                        expanded,
                        stages_reference(&m, pp),
                        "layers {layers}, first_dense {first_dense:?}, pp {pp}"
                    );
                    for pair in runs.windows(2) {
                        assert!(!pair[0].stage.same_shape(&pair[1].stage));
                    }
                }
            }
        }
    }

    #[test]
    fn a_huge_pipeline_is_a_handful_of_runs() {
        let runs = stage_runs(&model(32, Some(3)), u32::MAX, 4096);
        assert!(runs.len() <= MAX_RUNS);
        let total: u64 = runs.iter().map(|r| r.count as u64).sum();
        assert_eq!(total, u32::MAX as u64);
        let layers: u64 = runs
            .iter()
            .map(|r| r.count as u64 * r.stage.layers() as u64)
            .sum();
        assert_eq!(layers, 32);
        assert!(runs.last().unwrap().stage.last);
    }

    #[test]
    fn llama405b_on_16_ranks_gives_first_and_last_one_layer_fewer() {
        let c = layer_counts(126, 16);
        assert_eq!(c.iter().sum::<u32>(), 126);
        assert_eq!((c[0], c[15]), (7, 7));
        assert!(c[1..15].iter().all(|&n| n == 8));
        let runs = stage_runs(&model(126, None), 16, 4096);
        let shape: Vec<(u32, u32)> = runs.iter().map(|r| (r.count, r.stage.layers())).collect();
        assert_eq!(shape, vec![(1, 7), (14, 8), (1, 7)]);
    }

    #[test]
    fn even_split_is_uniform() {
        assert_eq!(layer_counts(80, 4), vec![20; 4]);
        assert_eq!(layer_counts(7, 1), vec![7]);
    }

    #[test]
    fn repeated_addition_is_the_loop_bit_for_bit() {
        for (acc, x, n) in [(0.1, 0.7, 13u32), (1e-3, 3.3e-5, 126), (5.0, 0.0, u32::MAX)] {
            let mut want = acc;
            for _ in 0..n.min(1000) {
                want += x;
            }
            assert_eq!(add_repeated(acc, x, n).to_bits(), want.to_bits());
        }
        assert_eq!(add_repeated(1.0, 2.0, 0), 1.0);
    }

    #[test]
    fn the_last_of_equal_maxima_is_found_by_bisection() {
        let run = StageRun {
            stage: Stage {
                index: 3,
                kinds: LayerCounts::from_counts(&[1, 0]),
                first: false,
                last: false,
            },
            count: 1000,
        };
        // Flat up to rank 700, then falling.
        let f = |j: u32| {
            if j <= 700 {
                5.0
            } else {
                5.0 - (j - 700) as f64
            }
        };
        let id = |x: &f64| *x;
        assert_eq!(last_of_equal_max(&run, f, id), (700, 5.0));
        assert_eq!(last_of_equal_max(&run, |_| 1.0, id), (1002, 1.0));
        assert_eq!(last_of_equal_max(&run, |j| -(j as f64), id), (3, -3.0));
    }

    #[test]
    fn interleaved_stage0_matches_korthikanti_factor() {
        // Stage 0 holds L·A·(1 + (p−1)/(p·v)) = p·(1 + (p−1)/(pv)) micro-batches of L/p layers.
        let plan = Plan {
            pp: 8,
            vpp: 4,
            ..Plan::default()
        };
        let got = in_flight(&plan, 64, 0);
        let want = 8.0 * (1.0 + 7.0 / 32.0);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        assert_eq!(in_flight(&Plan { vpp: 1, ..plan }, 64, 0), 8.0);
        assert_eq!(in_flight(&Plan { vpp: 1, ..plan }, 3, 0), 3.0);
    }
}

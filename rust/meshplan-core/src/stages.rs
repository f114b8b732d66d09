//! How layers are split over pipeline ranks and how many micro-batches each rank holds in flight
//! (COSTMODEL §2.5, §4).
//!
//! Uneven splits follow Megatron's `account_for_embedding/loss_in_pipeline_split`: when `L` is not
//! a multiple of the rank count, the first and last ranks (which also carry the embedding and the
//! LM head) are the ones given one layer fewer. The layers are dealt out in model order
//! ([`Model::layer_stack`]), so the dense leading layers of an MoE model (`first_dense_layers`)
//! sit on the first rank(s). A rank holds counts per layer kind ([`LayerCounts`]).

use crate::layer::{LayerCounts, MAX_LAYER_KINDS};
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
}

/// Layers per pipeline rank: `L / p`, with the remainder given to the middle ranks first.
pub fn layer_counts(layers: u32, pp: u32) -> Vec<u32> {
    let base = layers / pp;
    let rem = layers % pp;
    let mut counts = vec![base; pp as usize];
    // Preference for the extra layers: middle ranks, then the last, then the first.
    let order = (1..pp.saturating_sub(1)).chain(if pp > 1 { vec![pp - 1, 0] } else { vec![0] });
    for j in order.take(rem as usize) {
        counts[j as usize] += 1;
    }
    counts
}

/// The pipeline ranks of `plan` for `model`, in order: [`layer_counts`] layers each, taken in
/// model order from the runs of [`Model::layer_stack`].
pub fn stages(model: &Model, pp: u32) -> Vec<Stage> {
    let mut runs = model.layer_stack().into_iter();
    let mut run = runs.next();
    layer_counts(model.layers, pp)
        .into_iter()
        .enumerate()
        .map(|(j, n)| {
            let mut counts = [0u32; MAX_LAYER_KINDS];
            let mut need = n;
            while need > 0 {
                let Some((kind, left)) = run.as_mut() else {
                    break;
                };
                let take = need.min(*left);
                counts[*kind] += take;
                need -= take;
                *left -= take;
                if *left == 0 {
                    run = runs.next();
                }
            }
            Stage {
                index: j as u32,
                kinds: LayerCounts(counts),
                first: j == 0,
                last: j as u32 == pp - 1,
            }
        })
        .collect()
}

/// Micro-batches' worth of activations rank `stage` holds at its peak (COSTMODEL §2.5):
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama405b_on_16_ranks_gives_first_and_last_one_layer_fewer() {
        let c = layer_counts(126, 16);
        assert_eq!(c.iter().sum::<u32>(), 126);
        assert_eq!((c[0], c[15]), (7, 7));
        assert!(c[1..15].iter().all(|&n| n == 8));
    }

    #[test]
    fn even_split_is_uniform() {
        assert_eq!(layer_counts(80, 4), vec![20; 4]);
        assert_eq!(layer_counts(7, 1), vec![7]);
    }

    #[test]
    fn interleaved_stage0_matches_korthikanti_factor() {
        // Stage 0 holds L·A·(1 + (p−1)/(p·v)) = p·(1 + (p−1)/(pv)) micro-batches of L/p layers.
        let plan = Plan {
            dp: 1,
            tp: 1,
            pp: 8,
            ep: 1,
            cp: 1,
            vpp: 4,
            micro_batch: 1,
            zero: 0,
            recompute: Default::default(),
            sequence_parallel: false,
            schedule: None,
            order: Default::default(),
        };
        let got = in_flight(&plan, 64, 0);
        let want = 8.0 * (1.0 + 7.0 / 32.0);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        assert_eq!(in_flight(&Plan { vpp: 1, ..plan }, 64, 0), 8.0);
        assert_eq!(in_flight(&Plan { vpp: 1, ..plan }, 3, 0), 3.0);
    }
}

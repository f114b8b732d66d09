//! The pipeline axis of `explain` (docs/costmodel.md §3.5, §4): the p2p hops and the per-stage times
//! the schedule is built from.

use super::*;

impl Ctx<'_> {
    pub(super) fn pp(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.pp;
        let state = format!(
            "The {} layers split into {} stages ({} layers{}); each GPU holds only its stage's weights, gradients and optimizer states, and the activations of the micro-batches in flight.",
            model.layers,
            plan.pp,
            layer_counts_text(&self.runs, plan.pp),
            if plan.vpp > 1 {
                format!(", as {} interleaved chunks per GPU", plan.vpp)
            } else {
                String::new()
            }
        );
        let mut a = self.axis("pp", plan.pp, state, g);
        let bytes = self.tokens * model.hidden as f64 * WIRE_BYTES / self.sp_div();
        let terms = self.fabric.p2p(bytes, g.within_domain());
        let count = self.m * plan.vpp as u64;
        for what in [
            "forward (activations to the next stage)",
            "backward (gradients to the previous stage)",
        ] {
            a.collectives.push(self.info(
                "send-recv",
                format!("per micro-batch, {what}"),
                count,
                bytes,
                bytes,
                terms,
                1.0,
            ));
        }
        let t = &self.evaluation.time_s;
        let step = self.evaluation.step_time_s;
        a.notes.push(format!(
            "{} schedule: pipeline bubble {:.4} s ({:.1}% of the step) with {} micro-batches; the fill and drain transfers add {:.4} s, the rest overlap with compute",
            plan.schedule().name(),
            t.bubble,
            if step > 0.0 { 100.0 * t.bubble / step } else { 0.0 },
            self.m,
            t.pp_p2p
        ));
        if plan.sequence_parallel {
            a.notes.push(format!(
                "with sequence parallelism each TP rank sends 1/{} of the activations",
                plan.tp
            ));
        }
        a.notes.extend(self.hybrid_split_note());
        self.finish(a, t.pp_p2p + t.bubble, t.pp_p2p)
    }

    /// How a hybrid model's layers were split (by cost, [`crate::stages::balanced_ranks`]): each
    /// listed rank's layers per kind and its share of the forward FLOPs per token.
    fn hybrid_split_note(&self) -> Option<String> {
        let model = self.model();
        if model.layer_pattern.is_none() || self.plan.pp <= 1 || self.plan.pp > model.layers {
            return None;
        }
        let seq = self.problem.workload.seq_len;
        let kinds = model.layer_kinds();
        let costs = crate::stages::layer_costs(model, seq);
        let head = crate::stages::head_cost(model);
        let loads: Vec<(Stage, f64)> = self
            .runs
            .iter()
            .flat_map(|r| r.ranks().take(MAX_LISTED_RANKS))
            .take(MAX_LISTED_RANKS)
            .map(|s| {
                let load =
                    s.kinds.weighted_sum(&costs[..kinds.len()]) + if s.last { head } else { 0.0 };
                (s, load)
            })
            .collect();
        let mean = loads.iter().map(|(_, l)| l).sum::<f64>() / loads.len().max(1) as f64;
        let ranks: Vec<String> = loads
            .iter()
            .map(|(s, load)| {
                let parts: Vec<String> = s
                    .kinds
                    .iter()
                    .filter(|&(_, n)| n > 0)
                    .map(|(k, n)| format!("{n} {}", kinds.specs()[k].describe()))
                    .collect();
                format!(
                    "stage {}: {}{} ({:.0}% of the mean)",
                    s.index,
                    parts.join(", "),
                    if s.last { ", LM head" } else { "" },
                    if mean > 0.0 { 100.0 * load / mean } else { 0.0 }
                )
            })
            .collect();
        Some(format!(
            "layers split by cost, not count (a custom pipeline layout; Megatron-Core's MambaStack deals a hybrid pattern out by count): each layer weighs its forward FLOPs per token at s = {seq} ({}{}), the last stage also the LM head ({:.2} GFLOP); {}",
            kinds
                .specs()
                .iter()
                .zip(costs)
                .map(|(spec, c)| format!("{} {:.2} GFLOP", spec.describe(), c / 1e9))
                .collect::<Vec<_>>()
                .join(", "),
            if model.mamba.is_some() {
                "; a Mamba-2 scan weighs its flash-attention-equivalent floor, docs/costmodel.md §1.4"
            } else {
                ""
            },
            head / 1e9,
            ranks.join("; ")
        ))
    }

    pub(super) fn pipeline(&self) -> PipelineTimes {
        PipelineTimes {
            schedule: self.plan.schedule(),
            vpp: self.plan.vpp,
            micro_batches: self.m as u32,
            stages: self
                .runs
                .iter()
                .zip(&self.per_run)
                .flat_map(|(r, t)| {
                    r.ranks().map(move |s| StageTime {
                        index: s.index,
                        layers: s.layers(),
                        fwd_s: pass_total(&t.fwd),
                        bwd_s: pass_total(&t.bwd),
                        wgrad_s: t.wgrad,
                    })
                })
                .take(MAX_LISTED_STAGES)
                .collect(),
        }
    }
}

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
        self.finish(a, t.pp_p2p + t.bubble, t.pp_p2p)
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

//! The expert-parallel axis of `explain` (docs/costmodel.md §3.7): token dispatch and combine of the
//! MoE layers.

use super::*;

impl Ctx<'_> {
    pub(super) fn ep(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.ep;
        let e = plan.ep;
        let Some(moe) = model.moe.as_ref() else {
            // Structurally invalid (ep > 1 on a dense model): nothing is exchanged.
            let state =
                format!("Nothing: ep = {e} on a dense model (expert parallelism needs experts).");
            return self.axis("ep", e, state, g);
        };
        let expert = plan.expert_mesh();
        let state = format!(
            "Routed experts: {} of the {} experts per GPU (each also split {} ways by expert TP = TP); every token is sent to its top-{} experts' GPUs and back. Attention and dense layers are not split by EP: for them the EP ranks are extra data parallelism.",
            moe.num_experts / e,
            moe.num_experts,
            expert.size(ExpertDim::Etp),
            moe.top_k
        );
        let mut a = self.axis("ep", e, state, g);
        let h_bytes = model.hidden as f64 * WIRE_BYTES;
        let routed = self.tokens / self.sp_div();
        let message = routed * moe.top_k as f64 * h_bytes;
        let wire = wire_bytes(Collective::AllToAll, message, e);
        let terms = self.fabric.dispatch(routed, h_bytes, moe.top_k, g);
        let imbalance = self.problem.workload.moe_imbalance;
        let layers = self.worst_moe_layers();
        if layers > 0 {
            for pass in self.passes() {
                let what = if pass == "backward" {
                    "gradients"
                } else {
                    "tokens"
                };
                a.collectives.push(self.info(
                    "all-to-all",
                    format!("per MoE layer per micro-batch, {pass} (dispatch + combine of {what})"),
                    2 * self.m * layers,
                    message,
                    wire,
                    terms,
                    imbalance,
                ));
            }
        }
        let (total, off_rank) = ep_bytes_per_token_per_layer(model.hidden, moe.top_k, e);
        a.notes.push(format!(
            "per routed token per MoE layer, forward: {} B dispatched and combined ({} copies of its {} B hidden state each way), {} B of it leaving the GPU under uniform routing ((e−1)/e = {}/{e}); backward sends as much again",
            commas(total),
            moe.top_k,
            commas(h_bytes),
            commas(off_rank),
            e - 1
        ));
        if plan.sequence_parallel {
            a.notes.push(format!(
                "with sequence parallelism each TP rank routes 1/{} of the micro-batch's tokens",
                plan.tp
            ));
        }
        if g.domains() > 1 {
            a.notes.push("across domains each token crosses the network once per remote domain it is routed to and fans out over NVLink there (node-deduplicated dispatch)".into());
        }
        a.notes.push(format!(
            "seconds include the routing imbalance λ = {imbalance} of the busiest rank (workload moe_imbalance)"
        ));
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.ep;
        self.finish(a, exposed, exposed)
    }
}

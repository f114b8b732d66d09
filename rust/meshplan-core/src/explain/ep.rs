//! The expert-parallel axis of `explain` (docs/costmodel.md §3.7): token dispatch and combine of the
//! MoE layers.

use super::*;
use crate::workload::CudaGraphs;

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
        let state = if plan.folded() {
            format!(
                "Routed experts: {} of the {} experts per GPU, each split {} ways by expert TP; every token is sent to its top-{} experts' GPUs and back. Folded (MoE parallel folding): the expert layers run their own etp × ep × edp × pp = {} × {e} × {} × {} mesh over the ranks the dense layers run as tp × cp × dp × pp = {} × {} × {} × {}, so EP spans ranks the dense layers spend on TP, CP and DP.",
                moe.num_experts / e,
                moe.num_experts,
                expert.size(ExpertDim::Etp),
                moe.top_k,
                expert.size(ExpertDim::Etp),
                expert.size(ExpertDim::Edp),
                plan.pp,
                plan.tp,
                plan.cp,
                plan.dp,
                plan.pp,
            )
        } else {
            format!(
                "Routed experts: {} of the {} experts per GPU (each also split {} ways by expert TP = TP); every token is sent to its top-{} experts' GPUs and back. Attention and dense layers are not split by EP: for them the EP ranks are extra data parallelism.",
                moe.num_experts / e,
                moe.num_experts,
                expert.size(ExpertDim::Etp),
                moe.top_k
            )
        };
        let mut a = self.axis("ep", e, state, g);
        let h_bytes = model.hidden as f64 * WIRE_BYTES;
        let routed = self.tokens / self.sp_div();
        let dispatcher = self.stack.dispatcher(plan);
        let (op, message, wire) = match dispatcher {
            Dispatcher::AllGather => {
                let gathered = routed * h_bytes * e as f64;
                (
                    "all-gather + reduce-scatter",
                    gathered,
                    wire_bytes(Collective::AllGather, gathered, e),
                )
            }
            Dispatcher::AllToAll | Dispatcher::Flex => {
                let message = routed * moe.top_k as f64 * h_bytes;
                (
                    "all-to-all",
                    message,
                    wire_bytes(Collective::AllToAll, message, e),
                )
            }
        };
        let terms = self
            .fabric
            .token_exchange(dispatcher, routed, h_bytes, moe.top_k, g);
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
                    op,
                    format!(
                        "per MoE layer per micro-batch, {pass} (dispatch + combine of {what}, {} dispatcher)",
                        dispatcher.name()
                    ),
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
        if plan.folded() {
            let (etp, edp) = (self.groups.etp, self.groups.expert_dp);
            a.notes.push(format!(
                "expert mesh: EP group of {} ranks on {}, expert-TP group of {} on {}, expert-DP group of {} on {} (the expert gradient reduction); the dense layers' TP group of {} is on {}",
                g.size,
                fabric_name(g),
                etp.size,
                fabric_name(etp),
                edp.size,
                fabric_name(edp),
                self.groups.tp.size,
                fabric_name(self.groups.tp)
            ));
        }
        let per_fabric = match dispatcher {
            Dispatcher::Flex => Some(crate::comm::deduplicated_copies(moe.top_k, g)),
            Dispatcher::AllToAll => Some(crate::comm::all_to_all_copies(moe.top_k, g)),
            Dispatcher::AllGather => None,
        };
        match per_fabric {
            Some((nvlink, network)) => a.notes.push(format!(
                "per routed token per MoE layer, each way: {} B over NVLink ({nvlink:.2} copies) and {} B over the network ({network:.2} copies) on this group of {} ranks, {} per domain",
                commas(nvlink * h_bytes),
                commas(network * h_bytes),
                g.size,
                g.per_domain
            )),
            None => a.notes.push(format!(
                "per token per MoE layer, each way: every rank receives the hidden states of the other {} ranks' tokens ({} B per own token) and keeps its experts' copies",
                e - 1,
                commas((e - 1) as f64 * h_bytes)
            )),
        }
        if g.domains() > 1 {
            a.notes.push("across domains each token crosses the network once per remote domain it is routed to and fans out over NVLink there (node-deduplicated dispatch)".into());
        }
        a.notes.push(match dispatcher {
            Dispatcher::Flex => "flex dispatcher (DeepEP / HybridEP): node-deduplicated routing".to_string(),
            Dispatcher::AllToAll => "alltoall dispatcher: NCCL all-to-all, every routed copy sent on its own (no node deduplication)".to_string(),
            Dispatcher::AllGather => format!("allgather dispatcher: every rank gathers the {e} ranks' tokens and keeps its experts' copies; the combine is a reduce-scatter"),
        });
        let raw: f64 = a.collectives.iter().map(|c| c.seconds_per_step).sum();
        if plan.ep_overlap {
            a.notes.push(format!(
                "EP communication overlap (combined 1F1B): each micro-batch's dispatch and combine run behind another micro-batch's computation in the other direction; {} of the {} hidden, what the layers' compute cannot cover exposed",
                seconds(raw - self.evaluation.time_s.ep),
                seconds(raw)
            ));
        } else if self.stack.ep_overlap.contains(&true) {
            a.notes.push(format!(
                "no EP communication overlap: all of it exposed ({} can hide it behind the other direction's compute: ep_overlap)",
                self.stack.name
            ));
        }
        a.notes.push(format!(
            "seconds include the routing imbalance λ = {imbalance} of the busiest rank (workload moe_imbalance)"
        ));
        a.notes.extend(self.host_bound_note());
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.ep;
        self.finish(a, exposed, exposed)
    }

    /// The host-issue floor of the MoE layers (docs/costmodel.md §5.5), where it binds: what the
    /// GPU waits per step for the host to issue the layers' kernels.
    fn host_bound_note(&self) -> Option<String> {
        let wait = self.per_run.iter().map(|t| t.host_wait).fold(0.0, f64::max);
        (wait > 0.0).then(|| {
            format!(
                "host-bound MoE layers: a dropless MoE layer synchronises host and device before its token exchange (the split sizes must reach the CPU), so with CUDA graphs {} each layer lasts at least the host's issue of its kernels, {} forward + backward per micro-batch ({}: moe_host_issue_us); the GPU waits {} per step for the host on the slowest stage ({} per micro-batch); graphs that cover the MoE block (workload cuda_graphs = full) remove it",
                match self.problem.workload.cuda_graphs {
                    CudaGraphs::None => "off",
                    CudaGraphs::Partial => "partial (attention, router, preprocess)",
                    CudaGraphs::Full => "full",
                },
                seconds(self.stack.moe_host_issue_us * 1e-6),
                self.stack.name,
                seconds(wait * self.m as f64),
                seconds(wait),
            )
        })
    }
}

//! The context-parallel axis of `explain` (docs/costmodel.md §3.8): the ring exchange of K/V blocks.

use super::*;
use crate::plan::CpExchange;

impl Ctx<'_> {
    pub(super) fn cp(&self) -> AxisExplanation {
        let plan = self.plan;
        let g = self.groups.cp;
        let c = plan.cp;
        let seq = self.problem.workload.seq_len;
        let state = format!(
            "The sequence: each GPU holds {} of the {seq} tokens of every sequence (2·{c} chunks, paired for the causal mask), so all activations are split {c} ways; weights are replicated (the CP ranks join the gradient reduction).",
            seq / c
        );
        let mut a = self.axis("cp", c, state, g);
        // The ring runs in the attention layers (every layer without a layer pattern), all of
        // one K/V width; a hybrid stack's Mamba-2 layers trade all-to-alls instead.
        let layers_where = |f: &dyn Fn(&LayerOps) -> bool| -> u64 {
            self.worst
                .kinds
                .iter()
                .zip(&self.ops)
                .filter(|(_, ops)| f(ops))
                .map(|((_, n), _)| n as u64)
                .sum()
        };
        let ring_kind = self
            .ops
            .iter()
            .position(|o| o.comm.cp_kv_bytes_per_token > 0.0)
            .unwrap_or(0);
        let kv = self.tokens * self.ops[ring_kind].comm.cp_kv_bytes_per_token;
        let terms = self.fabric.p2p(kv, g.within_domain());
        let layers = layers_where(&|o: &LayerOps| o.comm.cp_kv_bytes_per_token > 0.0);
        let a2a_kind = self
            .ops
            .iter()
            .position(|o| o.comm.cp_all_to_all_bytes_per_token > 0.0);
        if let Some(k) = a2a_kind {
            let bytes = self.tokens * self.ops[k].comm.cp_all_to_all_bytes_per_token;
            let a2a_layers =
                layers_where(&|o: &LayerOps| o.comm.cp_all_to_all_bytes_per_token > 0.0);
            for pass in ["forward", "backward"] {
                a.collectives.push(self.collective(
                    Collective::AllToAll,
                    format!("per Mamba-2 layer per micro-batch, {pass} (in_proj output to head-sharded and the scan output back, MambaContextParallel)"),
                    self.m * a2a_layers,
                    bytes,
                    g,
                ));
            }
        }
        let exchange = self.stack.cp_exchange(plan);
        if exchange == CpExchange::AllGather && layers > 0 {
            return self.cp_allgather(a, kv, layers);
        }
        // Ulysses (a2a) over all CP ranks, or over those inside a domain (a2a+p2p) with the
        // ring over the rest.
        let a2a_ranks = if layers > 0 {
            self.stack.cp_a2a_ranks(&self.problem.model, plan, g)
        } else {
            1
        };
        if a2a_ranks > 1 {
            self.cp_all_to_all(&mut a, ring_kind, layers, a2a_ranks, exchange);
        }
        let ring = c / a2a_ranks.max(1);
        if ring <= 1 {
            a.notes.extend(self.stage_note());
            let exposed = self.evaluation.time_s.cp;
            return self.finish(a, exposed, exposed);
        }
        let steps = (ring - 1) as u64;
        for pass in self.passes() {
            // Backward sends the K/V blocks again and their gradients.
            let per_layer = if pass == "backward" { 2 * steps } else { steps };
            let what = if pass == "backward" {
                "K/V blocks and their gradients"
            } else {
                "K/V blocks"
            };
            a.collectives.push(self.info(
                "send-recv",
                format!("per layer per micro-batch, {pass} ({what} around the ring)"),
                self.m * layers * per_layer,
                kv,
                kv,
                terms,
                1.0,
            ));
        }
        a.notes.push(format!(
            "ring attention: {} ring step{} per layer, each passing this GPU's K/V block ({} B) to the next rank while attending to the one received; only the part of a transfer longer than its attention block is exposed",
            ring - 1,
            if ring == 2 { "" } else { "s" },
            commas(kv)
        ));
        if !g.within_domain() {
            a.notes.push(
                "the ring leaves the scale-up domain, so each step is costed at network speed"
                    .into(),
            );
        }
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.cp;
        self.finish(a, exposed, exposed)
    }

    /// The all-to-alls of Ulysses (a2a) or of a2a+p2p's inner level over `ranks` CP ranks: per
    /// attention layer and pass, Q, K and V (forward; dQ, dK, dV in the backward) and the
    /// output (dO), each of the rank's whole buffer, exposed (§3.8).
    fn cp_all_to_all(
        &self,
        a: &mut AxisExplanation,
        kind: usize,
        layers: u64,
        ranks: u32,
        exchange: CpExchange,
    ) {
        let group = crate::time::cp_a2a_group(self.groups.cp, ranks);
        let [q, k, v, o] = crate::time::cp_a2a_bytes(self.tokens, &self.ops[kind]);
        for pass in self.passes() {
            let parts: [(&str, f64); 4] = if pass == "backward" {
                [
                    ("dO, before attention", o),
                    ("dQ, after attention", q),
                    ("dK, after attention", k),
                    ("dV, after attention", v),
                ]
            } else {
                [
                    ("Q, before attention", q),
                    ("K, before attention", k),
                    ("V, before attention", v),
                    ("output, after attention", o),
                ]
            };
            for (what, bytes) in parts {
                a.collectives.push(self.collective(
                    Collective::AllToAll,
                    format!("per layer per micro-batch, {pass} ({what})"),
                    self.m * layers,
                    bytes,
                    group,
                ));
            }
        }
        let heads = self.problem.model.heads / self.plan.tp.max(1);
        let local = self.problem.workload.seq_len / self.plan.cp.max(1);
        a.notes.push(format!(
            "{} context parallelism ({}): before attention, all-to-alls over {ranks} CP ranks trade each GPU's {local} tokens × {heads} heads for {} tokens × {} heads, and the output comes back the same way after; attention waits for them, so none of it hides",
            self.stack.name,
            exchange.name(),
            local as u64 * ranks as u64,
            heads / ranks.max(1),
        ));
        if ranks < self.plan.cp {
            a.notes.push(format!(
                "a2a+p2p: the all-to-all spans the {ranks} CP ranks inside an NVLink domain (Megatron --hierarchical-context-parallel-sizes {ranks} {}), the ring the other {} levels",
                self.plan.cp / ranks,
                self.plan.cp / ranks
            ));
        }
    }

    /// The all-gather exchange (PyTorch's `context_parallel`, rotate method `allgather`): per
    /// attention layer the `c` ranks' K/V blocks of `kv` bytes gathered once in the forward,
    /// again in the backward with their gradients reduce-scattered (§3.8).
    fn cp_allgather(&self, mut a: AxisExplanation, kv: f64, layers: u64) -> AxisExplanation {
        let (g, c) = (self.groups.cp, self.plan.cp);
        let gathered = kv * c as f64;
        for pass in self.passes() {
            a.collectives.push(self.collective(
                Collective::AllGather,
                format!("per layer per micro-batch, {pass} (every rank's K/V blocks)"),
                self.m * layers,
                gathered,
                g,
            ));
            if pass == "backward" {
                a.collectives.push(self.collective(
                    Collective::ReduceScatter,
                    "per layer per micro-batch, backward (the K/V gradients)".into(),
                    self.m * layers,
                    gathered,
                    g,
                ));
            }
        }
        a.notes.push(format!(
            "{} exchanges K/V by all-gather: each rank gathers the other {} blocks ({} B each) at once, hidden only behind its first (local) block of attention, and the backward gathers them again and reduce-scatters their gradients",
            self.stack.name,
            c - 1,
            commas(kv)
        ));
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.cp;
        self.finish(a, exposed, exposed)
    }
}

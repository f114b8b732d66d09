//! The tensor-parallel axis of `explain` (docs/costmodel.md §3.4): the all-reduce points (or SP's
//! reduce-scatter + all-gather pairs) of each layer kind, the embedding and the LM head.

use super::*;

impl Ctx<'_> {
    pub(super) fn tp(&self) -> AxisExplanation {
        let plan = self.plan;
        let model = self.model();
        let g = self.groups.tp;
        let t = plan.tp;
        let mlp = if model.dense_layers() > 0 {
            format!(
                " and {} of the {} MLP columns",
                model.ffn_hidden / t,
                model.ffn_hidden
            )
        } else {
            String::new()
        };
        let state = format!(
            "Every weight matrix split {t} ways: {} of the {} attention heads{mlp} per GPU{}; activations inside attention and the MLP split too; {}.",
            model.heads / t,
            model.heads,
            model.moe.as_ref().map_or(String::new(), |m| if plan.folded() {
                match plan.expert_tp() {
                    1 => format!(", the routed experts whole (etp = 1 on the folded expert mesh: their {} columns not split)", m.expert_ffn_hidden),
                    etp => format!(", each routed expert's {} columns split {etp} ways by the expert TP of the folded expert mesh", m.expert_ffn_hidden),
                }
            } else {
                format!(", each routed expert's {} columns split the same way", m.expert_ffn_hidden)
            }),
            if plan.sequence_parallel {
                "with sequence parallelism the rest (norms, residuals) is split along the sequence"
            } else {
                "the rest (norms, residuals, layer inputs) is replicated (no sequence parallelism)"
            },
        );
        let mut state = state;
        if let Some(m) = &model.mamba {
            state.push_str(&format!(
                " Each Mamba-2 layer splits its {} SSM heads ({} per GPU) and {} B/C groups ({} per GPU): in_proj by columns, the convolution and the scan by head, out_proj by rows (Megatron-Core MambaMixer).",
                m.heads, m.heads / t, m.groups, m.groups / t
            ));
        }
        if let Some(la) = &model.linear_attention {
            state.push_str(&format!(
                " Each gated DeltaNet layer splits its {} key and {} value heads ({} and {} per GPU).",
                la.key_heads, la.value_heads, la.key_heads / t, la.value_heads / t
            ));
        }
        let mut a = self.axis("tp", t, state, g);
        let kinds: &[Collective] = if plan.sequence_parallel {
            &[Collective::AllGather, Collective::ReduceScatter]
        } else {
            &[Collective::AllReduce]
        };
        let bytes = self.tokens * model.hidden as f64 * WIRE_BYTES;
        let dense_points = self.ops[0].comm.tp_points as u64;
        let per_pass: u64 = self
            .worst
            .kinds
            .iter()
            .zip(&self.ops)
            .map(|((_, n), ops)| n as u64 * ops.comm.tp_points as u64)
            .sum();
        for pass in self.passes() {
            for &kind in kinds {
                a.collectives.push(self.collective(
                    kind,
                    format!("per layer per micro-batch, {pass}"),
                    self.m * per_pass,
                    bytes,
                    g,
                ));
            }
        }
        for (when, calls, on) in [
            (
                "per micro-batch, input embedding (forward)",
                1,
                self.worst.first,
            ),
            (
                "per micro-batch, LM head (forward and backward)",
                2,
                self.worst.last,
            ),
        ] {
            if on {
                for &kind in kinds {
                    a.collectives.push(self.collective(
                        kind,
                        when.into(),
                        self.m * calls,
                        bytes,
                        g,
                    ));
                }
            }
        }
        // A folded plan's routed copies gather over the expert-TP group (§3.7).
        let etp_per_pass: u64 = self
            .worst
            .kinds
            .iter()
            .zip(&self.ops)
            .map(|((_, n), ops)| n as u64 * ops.comm.etp_points as u64)
            .sum();
        if etp_per_pass > 0 {
            let etp_bytes = self
                .ops
                .iter()
                .map(|o| o.comm.etp_bytes)
                .fold(0.0, f64::max);
            for pass in self.passes() {
                for &kind in kinds {
                    a.collectives.push(self.collective(
                        kind,
                        format!(
                            "per layer per micro-batch, {pass}, expert TP group (etp = {})",
                            plan.expert_tp()
                        ),
                        self.m * etp_per_pass,
                        etp_bytes,
                        self.groups.etp,
                    ));
                }
            }
        }
        let point = if plan.sequence_parallel {
            "reduce-scatter + all-gather pair"
        } else {
            "all-reduce"
        };
        a.notes.push(match &model.moe {
            Some(m) if self.worst_moe_layers() > 0 && plan.folded() => format!(
                "one {point} after attention per MoE layer, {} per dense layer, of the micro-batch's hidden states ({} B); the routed experts are folded (etp = {}): {}",
                dense_points,
                commas(bytes),
                plan.expert_tp(),
                if plan.expert_tp() > 1 {
                    format!("their top-{} copies gather over the expert-TP group of {} ranks ({}), not the TP group", m.top_k, self.groups.etp.size, fabric_name(self.groups.etp))
                } else {
                    "each rank runs whole experts, no TP collective around them".to_string()
                }
            ),
            Some(m) if self.worst_moe_layers() > 0 => format!(
                "one {point} after attention and {} around the experts (top-{} copies of each token gathered over TP) per MoE layer, {} per dense layer, of the micro-batch's hidden states ({} B)",
                m.top_k,
                m.top_k,
                dense_points,
                commas(bytes)
            ),
            _ => format!(
                "one {point} after attention and one after the MLP, each on the micro-batch's hidden states ({} B)",
                commas(bytes)
            ),
        });
        if model.layer_pattern.is_some() {
            a.notes.push(format!(
                "hybrid layers: one {point} after each mixer (attention, Mamba-2, DeltaNet: out_proj is row-parallel) and after each FFN; a Nemotron-H layer is one of them, so it has one"
            ));
        }
        let omega = self.tp_overlap;
        a.notes.push(format!(
            "{:.0}% of the layers' TP time hides behind the neighbouring GEMMs (tp_overlap); the embedding and LM-head ones are exposed",
            100.0 * omega
        ));
        a.notes.extend(self.stage_note());
        let exposed = self.evaluation.time_s.tp;
        self.finish(a, exposed, exposed)
    }
}

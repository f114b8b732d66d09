//! The data-parallel axis and ZeRO of `explain` (docs/costmodel.md §2.2–2.3, §3.6): the gradient
//! reduction (all-reduce, or reduce-scatter + all-gather), its buckets, FSDP units, and how much
//! of it the backward pass hides.

use super::*;

impl Ctx<'_> {
    pub(super) fn dp(&self) -> AxisExplanation {
        let plan = self.plan;
        let w = &self.problem.workload;
        let g = self.groups.dense_dp;
        let replicas = plan.dense_dp();
        let replicated = match plan.zero {
            0 => "weights, gradients and optimizer states are replicated",
            1 => "weights and gradients are replicated (optimizer states are sharded: see zero)",
            2 => "weights are replicated (gradients and optimizer states are sharded: see zero)",
            _ => "nothing is replicated for long: ZeRO-3 shards weights, gradients and optimizer states (see zero)",
        };
        let (replicas_of, group_of) = if plan.folded() {
            (format!("dp = {}, folded", plan.dp), "dp·cp")
        } else {
            (format!("dp·ep = {}·{}", plan.dp, plan.ep), "dp·ep·cp")
        };
        let state = format!(
            "The batch: each of the {replicas} data-parallel replicas ({replicas_of}) takes {} of the {} sequences per step ({} micro-batches of {}); {replicated} over the {} ranks of the data-parallel group ({group_of}).",
            w.global_batch / replicas.max(1),
            w.global_batch,
            self.m,
            plan.micro_batch,
            g.size,
        );
        let mut a = self.axis("dp", plan.dp, state, g);
        if plan.dp == 1 && g.size > 1 {
            a.notes.push(format!(
                "dp = 1, but the {} ranks of ep·cp hold replicas of the dense weights, so their gradients are still reduced",
                g.size
            ));
        }
        if w.lora {
            a.notes.push(
                "LoRA: the base weights are frozen; only the adapters' gradients are reduced"
                    .into(),
            );
        }
        if plan.zero > 0 {
            a.notes.push(format!(
                "with ZeRO-{} the gradient reduction is a reduce-scatter: listed and timed under zero",
                plan.zero
            ));
            return self.finish(a, 0.0, 0.0);
        }
        let when = if self.stack.overlap_grad_reduce {
            "once per step, bucket by bucket during the last micro-batch's backward"
        } else {
            "once per step, after the last micro-batch's backward"
        };
        a.collectives = self.reduction(DpPhase::AllReduce, when, 1);
        self.reduction_notes(&mut a);
        let exposed = self.evaluation.time_s.dp;
        self.finish(a, exposed, exposed)
    }

    /// The rows of `phase` in the time model's DP/ZeRO inventory of stage 0
    /// ([`TimeContext::dp_collectives`]): one per parameter group (dense over dp·ep·cp, experts
    /// over dp·cp), its calls per round times `rounds` per step, so that the rows' seconds are
    /// what the step time charges before overlap.
    fn reduction(&self, phase: DpPhase, when: &str, rounds: u64) -> Vec<CollectiveInfo> {
        self.dp_inventory
            .iter()
            .filter(|c| c.phase == phase)
            .map(|c| {
                let label = match c.params {
                    ParamGroup::Dense => "dense parameters",
                    ParamGroup::Expert => "expert parameters",
                };
                let calls = c.calls.round() as u64;
                let split = match phase {
                    DpPhase::UnitAllGather | DpPhase::UnitReduceScatter => {
                        format!("{calls} FSDP units")
                    }
                    _ => format!("{calls} bucket{}", if calls == 1 { "" } else { "s" }),
                };
                let when = format!("{when}, {label} over {} ranks in {split}", c.group.size);
                self.info(
                    op_name(c.kind),
                    when,
                    rounds.saturating_mul(calls),
                    c.bytes_per_call,
                    wire_bytes(c.kind, c.bytes_per_call, c.group.size),
                    c.cost,
                    1.0,
                )
            })
            .collect()
    }

    fn reduction_notes(&self, a: &mut AxisExplanation) {
        let stack = self.stack;
        let omega = 100.0 * self.dp_overlap;
        if self.plan.zero >= 3 {
            a.notes.push(format!(
                "bytes are for pipeline stage 0; each FSDP unit's gather is prefetched one unit ahead, so it hides behind the previous unit's compute ({omega:.0}% of it, dp_overlap); the first gather and the last reduce-scatter stay exposed"
            ));
            if stack.zero3_per_rank_nic && !self.groups.dense_dp.within_domain() {
                a.notes.push(format!(
                    "the {} stack's unit collectives move each rank's bytes over its own NIC (zero3_per_rank_nic): across domains at one NIC's rate per GPU, not the domain's NICs pooled by NCCL's rings",
                    stack.name
                ));
            }
        } else {
            let g = self.groups.dense_dp;
            let reduce = if stack.overlap_grad_reduce {
                format!("reduced as the last micro-batch's backward produces them (overlap_grad_reduce): only the last bucket and what the backward cannot cover ({omega:.0}% of it hides communication, dp_overlap) is exposed")
            } else {
                "reduced after the backward (no overlap_grad_reduce): all of it is exposed"
                    .to_string()
            };
            let size = match self.problem.workload.bucket_params {
                Some(_) => "the workload's bucket_params".to_string(),
                // A fixed bucket (PyTorch DDP, DeepSpeed, XLA's combine threshold).
                None if stack.ddp_bucket_params_per_rank == 0.0 => {
                    format!("the {} stack's fixed bucket", stack.name)
                }
                None => format!(
                    "the {} stack's max({:.0} M, {:.0} M per rank) over {} ranks",
                    stack.name,
                    stack.ddp_bucket_params / 1e6,
                    stack.ddp_bucket_params_per_rank / 1e6,
                    g.size
                ),
            };
            a.notes.push(format!(
                "bytes are for pipeline stage 0 (the last to finish its backward); gradient buckets of {:.0} M parameters ({size}) are {reduce}",
                self.bucket_params / 1e6,
            ));
            if self.plan.zero > 0 {
                a.notes.push(if stack.overlap_param_gather {
                    "the updated weights are gathered bucket by bucket under the next step's first forward (overlap_param_gather): only the first bucket and what that forward cannot cover is exposed".to_string()
                } else {
                    "the updated weights are gathered after the optimizer step (no overlap_param_gather): all of it is exposed".to_string()
                });
            }
        }
        if self.model().is_moe() && self.plan.ep > 1 {
            let e = self.groups.expert_dp;
            a.notes.push(format!(
                "expert parameters are reduced over {} = {} ranks ({}, {} per domain)",
                if self.plan.folded() {
                    "the expert mesh's edp"
                } else {
                    "dp·cp"
                },
                e.size,
                fabric_name(e),
                e.per_domain
            ));
        }
    }

    pub(super) fn zero(&self) -> AxisExplanation {
        let plan = self.plan;
        let w = &self.problem.workload;
        let g = self.groups.dense_dp;
        let d = g.size;
        let state = match plan.zero {
            1 => format!("Optimizer states (fp32 master weights and Adam moments) sharded over the {d} data-parallel ranks (Megatron's distributed optimizer); weights and gradients replicated."),
            2 => format!("Optimizer states and gradients sharded over the {d} data-parallel ranks; weights replicated."),
            _ => format!("Weights, gradients and optimizer states all sharded over the {d} data-parallel ranks (FSDP full shard); each layer's weights are gathered just before use and freed after."),
        };
        let mut a = self.axis("zero", plan.zero as u32, state, g);
        if w.lora {
            a.notes.push(if plan.zero >= 3 {
                "LoRA: each unit gathers its frozen base weights (in their stored format) with its adapters; only the adapters' gradients are reduce-scattered".into()
            } else {
                "LoRA: the base weights are frozen; only the adapters' gradients and states are reduced and gathered".into()
            });
        }
        let m = self.m;
        let (grads_once, grads_each) = if self.stack.overlap_grad_reduce {
            (
                "once per step, bucket by bucket during the last micro-batch's backward (gradients)",
                "every micro-batch, bucket by bucket during its backward (gradients)",
            )
        } else {
            (
                "once per step, after the last micro-batch's backward (gradients)",
                "every micro-batch, after its backward (gradients)",
            )
        };
        let weights = if self.stack.overlap_param_gather {
            "once per step, bucket by bucket during the next step's first forward (updated weights)"
        } else {
            "once per step, after the optimizer step (updated weights)"
        };
        a.collectives = match plan.zero {
            1 => [
                self.reduction(DpPhase::ReduceScatter, grads_once, 1),
                self.reduction(DpPhase::AllGather, weights, 1),
            ]
            .concat(),
            2 => [
                self.reduction(DpPhase::ReduceScatter, grads_each, m),
                self.reduction(DpPhase::AllGather, weights, 1),
            ]
            .concat(),
            _ => [
                self.reduction(
                    DpPhase::UnitAllGather,
                    "per unit per micro-batch, forward (the unit's weights)",
                    m,
                ),
                self.reduction(
                    DpPhase::UnitAllGather,
                    "per unit per micro-batch, backward (the weights again)",
                    m,
                ),
                self.reduction(
                    DpPhase::UnitReduceScatter,
                    "per unit per micro-batch, backward (the unit's gradients)",
                    m,
                ),
            ]
            .concat(),
        };
        self.reduction_notes(&mut a);
        let exposed = self.evaluation.time_s.dp;
        self.finish(a, exposed, exposed)
    }
}

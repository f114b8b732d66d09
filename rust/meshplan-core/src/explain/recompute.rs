//! Megatron-Core's fine-grained selective recompute in `explain` (docs/costmodel.md §2.4.5,
//! §5.4): each module of the plan, what it stops storing and what it replays.

use super::*;
use crate::memory::module_discards;
use crate::plan::{RecomputeModule, RecomputeModules};

/// One recompute module of a plan on the worst (slowest) pipeline rank, per micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleCost {
    /// Megatron's name of the module (`layernorm`, `moe_act`, …).
    pub module: String,
    /// What it recomputes, in words.
    pub what: String,
    /// Layers of the rank it acts on.
    pub layers: u32,
    /// GiB one in-flight micro-batch no longer stores for it alone (modules overlap: `moe`
    /// holds `moe_act`'s and `shared_experts`' tensors).
    pub saved_gib_per_micro_batch: f64,
    /// Seconds its replay adds to one micro-batch's backward (compute, and for `mlp`/`moe`
    /// their TP points, for `moe` the dispatch and combine again).
    pub backward_s_per_micro_batch: f64,
}

fn what(m: RecomputeModule) -> &'static str {
    match m {
        RecomputeModule::CoreAttn => "core attention (its score tensors; nothing stored under flash attention)",
        RecomputeModule::MoeAct => "the routed experts' activation: its output (fc2's input) discarded and rebuilt from fc1's output",
        RecomputeModule::Layernorm => "the norms that are modules of their own (MLA's input norm, an MoE block's pre-MLP norm): outputs discarded and rebuilt",
        RecomputeModule::MlaUpProj => "MLA's Q and K/V up-projections and RoPE: per-head Q, K, V discarded and rebuilt from the latents",
        RecomputeModule::Mlp => "the dense MLP: only its input kept, its GEMMs and activation replayed",
        RecomputeModule::Moe => "the whole MoE block: only its input kept; router, dispatch, experts, combine and shared experts replayed",
        RecomputeModule::SharedExperts => "the shared experts: their intermediates rebuilt from the block's input",
    }
}

impl Ctx<'_> {
    /// The plan's recompute modules, each alone on the worst rank (empty without modules).
    pub(super) fn recompute_modules(&self) -> Vec<ModuleCost> {
        let Some(modules) = self.plan.recompute_modules else {
            return Vec::new();
        };
        let problem = self.problem;
        let model = &problem.model;
        let kinds = model.layer_kinds();
        let tc = TimeContext::new(problem, self.plan, self.groups);
        let parts: Vec<_> = (0..kinds.len()).map(|k| tc.layer_parts(k)).collect();
        modules
            .iter()
            .map(|m| {
                // What memory (module_discards) frees per token for this module alone.
                let mut alone = self.plan.clone();
                alone.recompute_modules = Some(RecomputeModules::of(&[m]));
                let (discarded, _) = module_discards(problem, &alone);
                let (mut bytes, mut seconds, mut layers) = (0.0, 0.0, 0);
                for (kind, n) in self.worst.kinds.iter().take(kinds.len()) {
                    if n == 0 {
                        continue;
                    }
                    let saved = discarded[kind];
                    let p = &parts[kind];
                    let mut replay = p.modules.compute[m.index()] + p.modules.tp[m.index()];
                    if m == RecomputeModule::Moe {
                        replay += p.modules.moe_ep;
                    }
                    if saved > 0.0 || replay > 0.0 {
                        layers += n;
                    }
                    bytes += n as f64 * saved;
                    seconds += n as f64 * replay;
                }
                ModuleCost {
                    module: m.name().to_string(),
                    what: what(m).to_string(),
                    layers,
                    saved_gib_per_micro_batch: bytes * self.tokens / crate::memory::GIB,
                    backward_s_per_micro_batch: seconds,
                }
            })
            .collect()
    }
}

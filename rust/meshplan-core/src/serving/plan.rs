//! A serving deployment (docs/serving.md §3): one or two pools of identical workers. A worker
//! ([`Worker`]) is one engine instance: `pp` pipeline stages of `tp × attention_dp` GPUs each.
//! Attention and the dense layers are tensor-parallel over `tp` and replicated over the
//! `attention_dp` ranks (each rank attends its own sequences, SGLang/vLLM "DP attention"); the
//! routed experts of an MoE layer are split over all `tp × attention_dp` GPUs of the stage,
//! `ep` expert-parallel × `expert_tp` tensor-parallel. An aggregated deployment runs `replicas`
//! such workers doing prefill and decode; a disaggregated one (xPyD) adds `prefill` workers that
//! hand the KV cache over to the `replicas` decode workers.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;
use crate::model::Model;

fn one() -> u32 {
    1
}

/// The attention kernels a worker runs (docs/serving.md §5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// Flash-attention-class kernels at the device's attention rate; MLA prefill in its
    /// normal (up-projected) form.
    #[default]
    Flash,
    /// SGLang 0.4's Triton MLA backend (its default for DeepSeek models before FlashInfer MLA):
    /// prefill in the absorbed form over the latent whenever a batch holds a cached prefix, at
    /// `triton_mla_attention_efficiency` of the 16-bit peak (`data/serving.toml`).
    TritonMla,
}

impl AttentionKernel {
    /// The spelling of `attention_kernel` in dicts, plan strings and the wire.
    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Flash => "flash",
            AttentionKernel::TritonMla => "triton-mla",
        }
    }

    fn is_flash(&self) -> bool {
        *self == AttentionKernel::Flash
    }

    /// `field`'s error when `model` cannot run this kernel (`triton-mla` needs latent
    /// attention).
    pub fn check(self, field: &str, model: &Model) -> Result<()> {
        if self == AttentionKernel::TritonMla && model.mla.is_none() {
            return Err(Error::invalid(
                field,
                self.name(),
                format!(
                    "flash for {} (triton-mla is a multi-head latent attention backend)",
                    model.name
                ),
            ));
        }
        Ok(())
    }
}

/// What a worker's KV pool keeps of a sliding-window layer (docs/serving.md §4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlidingKv {
    /// The last `window` tokens of each sequence (vLLM's hybrid KV cache manager, SGLang's
    /// hybrid SWA memory pool).
    #[default]
    Window,
    /// Every token, as in a full-attention layer; attention still reads the window only.
    /// SGLang turns its hybrid SWA pool off for gpt-oss (`disable_hybrid_swa_memory = True` in
    /// `ServerArgs` in its releases of Aug-Oct 2025); `--disable-hybrid-swa-memory` (SGLang) and
    /// `--disable-hybrid-kv-cache-manager` (vLLM) ask for it.
    Full,
}

impl SlidingKv {
    /// The spelling of `sliding_kv` in dicts, plan strings and the wire.
    pub fn name(self) -> &'static str {
        match self {
            SlidingKv::Window => "window",
            SlidingKv::Full => "full",
        }
    }

    fn is_window(&self) -> bool {
        *self == SlidingKv::Window
    }
}

/// One engine instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Worker {
    /// Tensor-parallel degree of attention and the dense layers.
    pub tp: u32,
    /// Pipeline stages.
    #[serde(default = "one")]
    pub pp: u32,
    /// Attention data-parallel ranks per stage (1: no DP attention).
    #[serde(default = "one")]
    pub attention_dp: u32,
    /// Expert-parallel degree of the routed experts.
    #[serde(default = "one")]
    pub ep: u32,
    /// Tensor-parallel degree inside each routed expert.
    #[serde(default = "one")]
    pub expert_tp: u32,
    /// Most sequences the worker runs at once (decode batch; for a prefill worker, the
    /// requests of one prefill batch).
    pub max_sequences: u32,
    /// Most tokens of one forward per attention-DP rank (vLLM `--max-num-batched-tokens`,
    /// SGLang `--chunked-prefill-size`, TensorRT-LLM `--max_num_tokens`): the prefill chunk and
    /// the activation workspace; `None`: `max_batched_tokens` of `data/serving.toml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batched_tokens: Option<u32>,
    /// Tokens the KV cache of each attention-DP rank holds, as the engine reports it at start
    /// (vLLM "GPU KV cache size: N tokens", SGLang "max_total_num_tokens"); `None`: what the
    /// memory model leaves for it (docs/serving.md §4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_tokens: Option<u32>,
    /// Engine steps after which a step's tokens reach the client: vLLM V0's asynchronous output
    /// processor handles step N's outputs while step N+1 runs and returns them when it ends (1);
    /// `None`: 0, published when the step ends (docs/serving.md §5.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_lag_steps: Option<u32>,
    /// The engine's attention kernels: `flash` (default) or `triton-mla` (SGLang 0.4's Triton
    /// MLA backend, MLA models only).
    #[serde(default, skip_serializing_if = "AttentionKernel::is_flash")]
    pub attention_kernel: AttentionKernel,
    /// What the KV pool keeps of a sliding-window layer: `window` (default) or `full`.
    #[serde(default, skip_serializing_if = "SlidingKv::is_window")]
    pub sliding_kv: SlidingKv,
}

impl Worker {
    /// How the worker shards its dense weights (attention, dense MLP): `tp` ways, no sequence
    /// parallelism in serving.
    pub fn dense_shard(&self) -> crate::layer::Shard {
        crate::layer::Shard {
            tp: self.tp,
            ep: self.ep,
            etp: None,
            sequence_parallel: false,
        }
    }

    /// How the worker shards its routed experts: `expert_tp` ways within `ep`.
    pub fn expert_shard(&self) -> crate::layer::Shard {
        crate::layer::Shard {
            tp: self.expert_tp,
            ep: self.ep,
            etp: None,
            sequence_parallel: false,
        }
    }

    /// Tokens of one forward per attention-DP rank: [`Worker::max_batched_tokens`] or the
    /// serving default.
    pub fn forward_tokens(&self) -> f64 {
        self.max_batched_tokens
            .map_or(super::constants().max_batched_tokens, |t| t as f64)
    }

    /// GPUs of one pipeline stage, `tp × attention_dp`.
    pub fn stage_gpus(&self) -> u64 {
        self.tp as u64 * self.attention_dp as u64
    }

    /// GPUs of the worker, `tp × attention_dp × pp`.
    pub fn gpus(&self) -> u64 {
        self.stage_gpus() * self.pp as u64
    }

    /// A short label, e.g. `tp4·adp2·ep8·pp1 ×64`.
    pub fn label(&self) -> String {
        let mut s = format!("tp{}", self.tp);
        if self.attention_dp > 1 {
            s += &format!("·adp{}", self.attention_dp);
        }
        if self.ep > 1 {
            s += &format!("·ep{}", self.ep);
        }
        if self.expert_tp > 1 && self.expert_tp != self.stage_gpus() as u32 {
            s += &format!("·etp{}", self.expert_tp);
        }
        if self.pp > 1 {
            s += &format!("·pp{}", self.pp);
        }
        if let Some(t) = self.max_batched_tokens {
            s += &format!("·tok{t}");
        }
        if !self.attention_kernel.is_flash() {
            s += &format!("·{}", self.attention_kernel.name());
        }
        if !self.sliding_kv.is_window() {
            s += &format!("·swa-{}", self.sliding_kv.name());
        }
        s + &format!(" b{}", self.max_sequences)
    }

    /// Range and structure checks; `path` prefixes the field names (`serving_plan.worker` or
    /// `serving_plan.prefill`, both in [`limits::TABLE`]).
    pub fn validate(&self, path: &str, model: &Model) -> Result<()> {
        let field = |f: &str| format!("{path}.{f}");
        for (name, v) in [
            ("tp", self.tp),
            ("pp", self.pp),
            ("attention_dp", self.attention_dp),
            ("ep", self.ep),
            ("expert_tp", self.expert_tp),
        ] {
            limits::check(&field(name), v)?;
        }
        limits::check(&field("max_sequences"), self.max_sequences)?;
        limits::check_opt(&field("max_batched_tokens"), self.max_batched_tokens)?;
        limits::check_opt(&field("kv_tokens"), self.kv_tokens)?;
        limits::check_opt(&field("output_lag_steps"), self.output_lag_steps)?;
        let stage = self.stage_gpus();
        if self.ep as u64 * self.expert_tp as u64 != stage {
            return Err(Error::invalid(
                field("ep"),
                self.ep,
                format!(
                    "ep × expert_tp = tp × attention_dp = {stage} (expert_tp {})",
                    self.expert_tp
                ),
            ));
        }
        if self.gpus() > limits::MAX_GPUS as u64 {
            return Err(Error::invalid(
                field("tp"),
                self.tp,
                format!("tp × attention_dp × pp ≤ {}", limits::MAX_GPUS),
            ));
        }
        self.attention_kernel
            .check(&field("attention_kernel"), model)?;
        if self.pp > model.layers {
            return Err(Error::invalid(
                field("pp"),
                self.pp,
                format!("1..={} (the model's layers)", model.layers),
            ));
        }
        match &model.moe {
            None => {
                if self.attention_dp != 1 {
                    return Err(Error::invalid(
                        field("attention_dp"),
                        self.attention_dp,
                        "1 for a dense model (DP attention pairs with expert parallelism)",
                    ));
                }
            }
            Some(m) => {
                if m.num_experts % self.ep != 0 {
                    return Err(Error::invalid(
                        field("ep"),
                        self.ep,
                        format!("a divisor of the {} experts", m.num_experts),
                    ));
                }
            }
        }
        if self.max_sequences % self.attention_dp != 0 {
            return Err(Error::invalid(
                field("max_sequences"),
                self.max_sequences,
                format!("a multiple of attention_dp = {}", self.attention_dp),
            ));
        }
        Ok(())
    }
}

/// A deployment: `replicas` aggregated workers, or `prefill_replicas` prefill workers feeding
/// `replicas` decode workers (xPyD, x = `prefill_replicas`, y = `replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingPlan {
    /// The aggregated worker, or the decode worker when `prefill` is set.
    pub worker: Worker,
    /// Workers of `worker`'s shape.
    #[serde(default = "one")]
    pub replicas: u32,
    /// The prefill worker of a disaggregated deployment.
    #[serde(default)]
    pub prefill: Option<Worker>,
    /// Prefill workers of a disaggregated deployment.
    #[serde(default)]
    pub prefill_replicas: u32,
}

impl ServingPlan {
    /// Whether prefill runs on workers of its own.
    pub fn disaggregated(&self) -> bool {
        self.prefill.is_some()
    }

    /// GPUs the deployment uses.
    pub fn gpus(&self) -> u64 {
        self.worker.gpus() * self.replicas as u64
            + self
                .prefill
                .map_or(0, |p| p.gpus() * self.prefill_replicas as u64)
    }

    /// A short label: `2× tp4 b64` or `1P tp8 b4 + 3D tp2·adp4·ep8 b256`.
    pub fn label(&self) -> String {
        match &self.prefill {
            None => format!("{}× {}", self.replicas, self.worker.label()),
            Some(p) => format!(
                "{}P {} + {}D {}",
                self.prefill_replicas,
                p.label(),
                self.replicas,
                self.worker.label()
            ),
        }
    }

    /// Checks every field against the model and the cluster's GPU count.
    pub fn validate(&self, model: &Model, num_gpus: u32) -> Result<()> {
        self.worker.validate("serving_plan.worker", model)?;
        limits::check("serving_plan.replicas", self.replicas)?;
        match &self.prefill {
            Some(p) => {
                p.validate("serving_plan.prefill", model)?;
                limits::check("serving_plan.prefill_replicas", self.prefill_replicas)?;
            }
            None => {
                if self.prefill_replicas != 0 {
                    return Err(Error::invalid(
                        "serving_plan.prefill_replicas",
                        self.prefill_replicas,
                        "0 without a prefill worker",
                    ));
                }
            }
        }
        if self.gpus() > num_gpus as u64 {
            return Err(Error::invalid(
                "serving_plan.replicas",
                self.replicas,
                format!(
                    "a deployment of at most the cluster's {num_gpus} GPUs (this one uses {})",
                    self.gpus()
                ),
            ));
        }
        Ok(())
    }
}

//! The model descriptor: a decoder-only transformer (dense or MoE, GQA, optional MLA), its
//! validation, and parameter counts (docs/costmodel.md §2.1). Its layers are described once, as runs of
//! layer kinds ([`crate::layer`]: `Model::layer_kinds`, `Model::layer_stack`); the totals sum over
//! them.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;

/// Feed-forward activation, which also fixes the FFN's shape: the gated ones (SwiGLU, GeGLU,
/// ReGLU: `act(x·W_gate) ⊙ x·W_up`) have three `h×f` matrices, the plain ones (GeLU, squared
/// ReLU, SiLU: `act(x·W_up)`) two (docs/costmodel.md §1.1). Independent of the norm and of
/// embedding tying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// Gated SiLU (Llama, Qwen, DeepSeek, Mixtral).
    Swiglu,
    /// Gated GeLU (Gemma, T5 v1.1).
    Geglu,
    /// Gated ReLU.
    Reglu,
    /// Plain GeLU (GPT-2/3, BLOOM, Falcon).
    Gelu,
    /// Plain squared ReLU (Nemotron-4, Primer).
    Relu2,
    /// Plain SiLU.
    Silu,
}

impl Activation {
    /// Every activation, in a fixed order.
    pub const ALL: [Activation; 6] = [
        Activation::Swiglu,
        Activation::Geglu,
        Activation::Reglu,
        Activation::Gelu,
        Activation::Relu2,
        Activation::Silu,
    ];

    /// The lower-case name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Swiglu => "swiglu",
            Activation::Geglu => "geglu",
            Activation::Reglu => "reglu",
            Activation::Gelu => "gelu",
            Activation::Relu2 => "relu2",
            Activation::Silu => "silu",
        }
    }

    /// A gated FFN: a gate and an up projection, multiplied element-wise.
    pub fn gated(self) -> bool {
        matches!(
            self,
            Activation::Swiglu | Activation::Geglu | Activation::Reglu
        )
    }

    /// Number of `h×f` weight matrices of one FFN.
    pub fn ffn_matrices(self) -> u64 {
        if self.gated() {
            3
        } else {
            2
        }
    }
}

/// Normalisation layer: RMSNorm has one vector of `h`, LayerNorm two (weight and bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    #[default]
    Rmsnorm,
    Layernorm,
}

/// Mixture-of-experts block shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    /// Routed experts `E`.
    pub num_experts: u32,
    /// Experts each token is routed to `k`.
    pub top_k: u32,
    /// Intermediate size of one routed expert `f_e`.
    pub expert_ffn_hidden: u32,
    /// Number of shared (always-on) experts.
    #[serde(default)]
    pub shared_experts: u32,
    /// Intermediate size of one shared expert (defaults to `expert_ffn_hidden`).
    #[serde(default)]
    pub shared_expert_ffn_hidden: Option<u32>,
    /// Leading layers that keep a dense FFN (DeepSeek's `first_k_dense_replace`).
    #[serde(default)]
    pub first_dense_layers: u32,
}

impl Moe {
    /// Summed intermediate size of all shared experts `f_sh`.
    pub fn shared_ffn_hidden(&self) -> u64 {
        self.shared_experts as u64
            * self
                .shared_expert_ffn_hidden
                .unwrap_or(self.expert_ffn_hidden) as u64
    }
}

/// Multi-head latent attention dimensions (DeepSeek-V2/V3, Kimi-K2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mla {
    /// Query low-rank projection; `None` means a full-rank query projection.
    #[serde(default)]
    pub q_lora_rank: Option<u32>,
    pub kv_lora_rank: u32,
    pub qk_rope_head_dim: u32,
    pub qk_nope_head_dim: u32,
    pub v_head_dim: u32,
}

/// A decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub name: String,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    /// Per-head dimension; `None` means `hidden / heads`.
    #[serde(default)]
    pub head_dim: Option<u32>,
    /// Dense FFN intermediate size `f` (used by dense layers of MoE models too).
    pub ffn_hidden: u32,
    pub vocab: u32,
    pub activation: Activation,
    #[serde(default)]
    pub norm: Norm,
    #[serde(default)]
    pub tied_embeddings: bool,
    /// Dropout on the attention probabilities and on the two residual branches (GPT-3 and the
    /// Megatron recipes of its time: 0.1; current LLMs: none). Each dropout keeps a 1-byte mask
    /// per element for the backward (docs/costmodel.md §2.4.3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropout: bool,
    #[serde(default)]
    pub moe: Option<Moe>,
    #[serde(default)]
    pub mla: Option<Mla>,
}

impl Model {
    /// Checks every field; the error names the first bad one. Ranges first ([`limits`]), then
    /// the relations between fields, then the parameter count ([`limits::MAX_PARAMS`]).
    pub fn validate(&self) -> Result<()> {
        limits::check("model.layers", self.layers)?;
        limits::check("model.hidden", self.hidden)?;
        limits::check("model.heads", self.heads)?;
        limits::check("model.kv_heads", self.kv_heads)?;
        limits::check_opt("model.head_dim", self.head_dim)?;
        limits::check("model.ffn_hidden", self.ffn_hidden)?;
        limits::check("model.vocab", self.vocab)?;
        if let Some(moe) = &self.moe {
            limits::check("model.moe.num_experts", moe.num_experts)?;
            limits::check("model.moe.top_k", moe.top_k)?;
            limits::check("model.moe.expert_ffn_hidden", moe.expert_ffn_hidden)?;
            limits::check("model.moe.shared_experts", moe.shared_experts)?;
            limits::check_opt(
                "model.moe.shared_expert_ffn_hidden",
                moe.shared_expert_ffn_hidden,
            )?;
            limits::check("model.moe.first_dense_layers", moe.first_dense_layers)?;
        }
        if let Some(mla) = &self.mla {
            limits::check_opt("model.mla.q_lora_rank", mla.q_lora_rank)?;
            limits::check("model.mla.kv_lora_rank", mla.kv_lora_rank)?;
            limits::check("model.mla.qk_rope_head_dim", mla.qk_rope_head_dim)?;
            limits::check("model.mla.qk_nope_head_dim", mla.qk_nope_head_dim)?;
            limits::check("model.mla.v_head_dim", mla.v_head_dim)?;
        }
        if self.head_dim.is_none() && self.mla.is_none() && self.hidden % self.heads != 0 {
            return Err(Error::invalid(
                "model.head_dim",
                "null",
                format!(
                    "an explicit head_dim, since hidden {} is not a multiple of heads {}",
                    self.hidden, self.heads
                ),
            ));
        }
        if self.kv_heads > self.heads || self.heads % self.kv_heads != 0 {
            return Err(Error::invalid(
                "model.kv_heads",
                self.kv_heads,
                format!("a divisor of heads ({})", self.heads),
            ));
        }
        if let Some(moe) = &self.moe {
            if moe.top_k > moe.num_experts {
                return Err(Error::invalid(
                    "model.moe.top_k",
                    moe.top_k,
                    format!("1..={} (num_experts)", moe.num_experts),
                ));
            }
            if moe.first_dense_layers >= self.layers {
                return Err(Error::invalid(
                    "model.moe.first_dense_layers",
                    moe.first_dense_layers,
                    format!("0..{} (fewer than layers)", self.layers),
                ));
            }
        }
        // Within the field limits one layer's parameters fit u64 (limits' tests); the whole
        // model may not, so it is counted in u128 before anything counts it in u64.
        let params = self.total_params_wide();
        if params > limits::MAX_PARAMS as u128 {
            return Err(Error::invalid(
                "model",
                format!("{params} parameters"),
                format!("at most {} parameters", limits::MAX_PARAMS),
            ));
        }
        Ok(())
    }

    /// Per-head dimension of queries and keys (MLA: nope + rope parts).
    pub fn qk_head_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => (m.qk_nope_head_dim + m.qk_rope_head_dim) as u64,
            None => self.head_dim.unwrap_or(self.hidden / self.heads) as u64,
        }
    }

    /// Per-head dimension of values (MLA: `v_head_dim`).
    pub fn v_head_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => m.v_head_dim as u64,
            None => self.qk_head_dim(),
        }
    }

    /// Number of MoE layers `L_moe` (0 for dense models).
    pub fn moe_layers(&self) -> u32 {
        self.moe
            .as_ref()
            .map_or(0, |m| self.layers - m.first_dense_layers)
    }

    /// Number of layers with a dense FFN.
    pub fn dense_layers(&self) -> u32 {
        self.layers - self.moe_layers()
    }

    /// Whether the model has routed experts.
    pub fn is_moe(&self) -> bool {
        self.moe.is_some()
    }

    /// Summed intermediate size of all shared experts `f_sh`.
    pub fn shared_ffn_hidden(&self) -> u64 {
        self.moe.as_ref().map_or(0, Moe::shared_ffn_hidden)
    }

    /// Attention projection parameters of one layer (Q, K, V, O; MLA down/up projections).
    pub fn attention_params(&self) -> u64 {
        let h = self.hidden as u64;
        let a = self.heads as u64;
        match &self.mla {
            Some(m) => {
                let qk = self.qk_head_dim();
                let q = match m.q_lora_rank {
                    Some(r) => h * r as u64 + r as u64 * a * qk + r as u64,
                    None => h * a * qk,
                };
                let kv_down =
                    h * (m.kv_lora_rank + m.qk_rope_head_dim) as u64 + m.kv_lora_rank as u64;
                let kv_up = m.kv_lora_rank as u64 * a * (m.qk_nope_head_dim + m.v_head_dim) as u64;
                let o = a * m.v_head_dim as u64 * h;
                q + kv_down + kv_up + o
            }
            None => {
                let d = self.qk_head_dim();
                let g = self.kv_heads as u64;
                h * a * d + 2 * h * g * d + a * d * h
            }
        }
    }

    /// Norm parameters of one layer (two norms).
    pub fn norm_params(&self) -> u64 {
        let per_norm = match self.norm {
            Norm::Rmsnorm => 1,
            Norm::Layernorm => 2,
        };
        2 * per_norm * self.hidden as u64
    }

    /// Dense FFN parameters of one layer.
    pub fn dense_ffn_params(&self) -> u64 {
        self.activation.ffn_matrices() * self.hidden as u64 * self.ffn_hidden as u64
    }

    /// Parameters of one routed expert.
    pub fn expert_params(&self) -> u64 {
        self.moe
            .as_ref()
            .map_or(0, |m| crate::layer::expert_params(self, m))
    }

    /// Parameters of the non-routed part of one MoE FFN (shared experts + router).
    pub fn moe_dense_part_params(&self) -> u64 {
        self.moe
            .as_ref()
            .map_or(0, |m| crate::layer::moe_dense_part_params(self, m))
    }

    /// Input-embedding parameters `V·h`.
    pub fn embedding_params(&self) -> u64 {
        self.vocab as u64 * self.hidden as u64
    }

    /// Output-head parameters (0 when tied to the input embedding).
    pub fn lm_head_params(&self) -> u64 {
        if self.tied_embeddings {
            0
        } else {
            self.embedding_params()
        }
    }

    /// Every parameter of the model (saturating at `u64::MAX`; a validated model has at most
    /// [`limits::MAX_PARAMS`]).
    pub fn total_params(&self) -> u64 {
        u64::try_from(self.total_params_wide()).unwrap_or(u64::MAX)
    }

    /// [`Self::total_params`] in u128 (the layer count times a layer's parameters can pass u64
    /// for dimensions at their limits): its layers ([`crate::layer::LayerSpec::params`] over
    /// [`Model::layer_stack`]), embedding, LM head and final norm.
    fn total_params_wide(&self) -> u128 {
        let kinds = self.layer_kinds();
        let layers: u128 = self
            .layer_stack()
            .iter()
            .map(|&(k, n)| n as u128 * kinds.specs()[k].params(self))
            .sum();
        layers
            + self.embedding_params() as u128
            + self.lm_head_params() as u128
            + self.hidden as u128
    }

    /// Matmul parameters touched per token `N_active` (docs/costmodel.md §1.2): attention, dense FFN,
    /// top-k routed experts, shared experts, LM head; not the input embedding.
    pub fn active_matmul_params(&self) -> u64 {
        let kinds = self.layer_kinds();
        let layers: u64 = self
            .layer_stack()
            .iter()
            .map(|&(k, n)| n as u64 * kinds.specs()[k].active_matmul_params(self))
            .sum();
        let head = self.embedding_params(); // the LM head multiplies whether or not it is tied
        layers + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn llama3_70b() -> Model {
        Model {
            name: "llama3-70b".into(),
            layers: 80,
            hidden: 8192,
            heads: 64,
            kv_heads: 8,
            head_dim: None,
            ffn_hidden: 28672,
            vocab: 128256,
            activation: Activation::Swiglu,
            norm: Norm::Rmsnorm,
            tied_embeddings: false,
            dropout: false,
            moe: None,
            mla: None,
        }
    }

    #[test]
    fn llama3_70b_has_70_55b_params() {
        // docs/costmodel.md §7(a): 70.55 B parameters.
        let p = llama3_70b().total_params() as f64 / 1e9;
        assert!((p - 70.55).abs() < 0.01, "{p}");
    }

    #[test]
    fn llama2_7b_has_6_738b_params() {
        // docs/costmodel.md §7(c): 6.738 B parameters.
        let m = Model {
            name: "llama2-7b".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: None,
            ffn_hidden: 11008,
            vocab: 32000,
            activation: Activation::Swiglu,
            norm: Norm::Rmsnorm,
            tied_embeddings: false,
            dropout: false,
            moe: None,
            mla: None,
        };
        let p = m.total_params() as f64 / 1e9;
        assert!((p - 6.738).abs() < 0.001, "{p}");
    }

    #[test]
    fn bad_kv_heads_names_the_field() {
        let mut m = llama3_70b();
        m.kv_heads = 7;
        let e = m.validate().unwrap_err();
        assert!(e.to_string().contains("model.kv_heads"), "{e}");
    }

    #[test]
    fn top_k_above_experts_is_rejected() {
        let mut m = llama3_70b();
        m.moe = Some(Moe {
            num_experts: 8,
            top_k: 9,
            expert_ffn_hidden: 1024,
            shared_experts: 0,
            shared_expert_ffn_hidden: None,
            first_dense_layers: 0,
        });
        assert!(m
            .validate()
            .unwrap_err()
            .to_string()
            .contains("model.moe.top_k"));
    }
}

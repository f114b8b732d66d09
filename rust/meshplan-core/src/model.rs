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
    /// Latent width `ℓ` of a latent MoE (Nemotron 3 Super/Ultra, HF `moe_latent_size`): each
    /// token is projected `h → ℓ` before routing, the experts work at width `ℓ` and their
    /// combined output is projected back `ℓ → h`; `None`: the experts see `h`.
    #[serde(default)]
    pub latent_size: Option<u32>,
}

impl Moe {
    /// Width of the hidden vectors the routed experts see and the dispatch moves: `ℓ` of a
    /// latent MoE, else the model's `hidden`.
    pub fn expert_width(&self, hidden: u32) -> u32 {
        self.latent_size.unwrap_or(hidden)
    }

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

/// Mamba-2 (SSD) mixer dimensions (Nemotron-H; docs/costmodel.md §1.4). `d_inner = heads ·
/// head_dim` (HF `mamba_num_heads · mamba_head_dim`, `expand · hidden` in Mamba-2's own
/// config); B and C have `groups · state` channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mamba {
    /// SSM heads `H` (HF `mamba_num_heads`).
    pub heads: u32,
    /// Channels per head `P` (HF `mamba_head_dim`).
    pub head_dim: u32,
    /// State size `N` (HF `ssm_state_size`).
    pub state: u32,
    /// Groups `G` sharing one B and C (HF `n_groups`).
    pub groups: u32,
    /// Width of the causal depthwise convolution (HF `conv_kernel`).
    pub conv_kernel: u32,
    /// Chunk length `Q` of the chunked scan (HF `chunk_size`; Nemotron-H: 128).
    pub chunk: u32,
}

impl Mamba {
    /// `d_inner = H·P`.
    pub fn inner(&self) -> u64 {
        self.heads as u64 * self.head_dim as u64
    }

    /// Channels of the convolution: `x`, `B` and `C`, `d_inner + 2·G·N`.
    pub fn conv_channels(&self) -> u64 {
        self.inner() + 2 * self.groups as u64 * self.state as u64
    }
}

/// Gated DeltaNet linear-attention dimensions (Qwen3-Next's `linear_attention` layers,
/// arXiv 2412.06464).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearAttention {
    /// Query/key heads (HF `linear_num_key_heads`).
    pub key_heads: u32,
    /// Query/key head dimension (HF `linear_key_head_dim`).
    pub key_head_dim: u32,
    /// Value heads (HF `linear_num_value_heads`); the state is per value head.
    pub value_heads: u32,
    /// Value head dimension (HF `linear_value_head_dim`).
    pub value_head_dim: u32,
    /// Width of the causal depthwise convolution on q, k, v (HF `linear_conv_kernel_dim`).
    pub conv_kernel: u32,
    /// Chunk length of the chunked delta rule (flash-linear-attention's kernels: 64).
    pub chunk: u32,
}

impl LinearAttention {
    /// Query/key width `H_k·d_k`.
    pub fn key_dim(&self) -> u64 {
        self.key_heads as u64 * self.key_head_dim as u64
    }

    /// Value width `H_v·d_v`.
    pub fn value_dim(&self) -> u64 {
        self.value_heads as u64 * self.value_head_dim as u64
    }
}

/// The characters of [`Model::layer_pattern`], one per layer. The first four are Nemotron-H's
/// `hybrid_override_pattern` (a layer with one block); the letters are layers with a mixer and
/// an FFN, upper case with the MoE FFN, lower case with the dense one.
pub const LAYER_PATTERN_CHARS: &str = "M*-EAaSsGg";

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
    /// The layers in order, one character each ([`LAYER_PATTERN_CHARS`]): `M` Mamba-2, `*`
    /// attention (MLA when `mla` is set), `-` dense FFN, `E` MoE FFN (each alone in its layer,
    /// Nemotron-H's notation); `A`/`a` attention, `S`/`s` sliding-window attention, `G`/`g`
    /// gated DeltaNet, each with the MoE (upper case) or dense (lower case) FFN. `None`: every
    /// layer attention + FFN, the first `moe.first_dense_layers` dense, the rest MoE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_pattern: Option<String>,
    /// The Mamba-2 mixer of the `M` layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mamba: Option<Mamba>,
    /// The gated DeltaNet mixer of the `G`/`g` layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<LinearAttention>,
    /// Tokens each query of an `S`/`s` layer attends (itself included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u32>,
    /// Multi-token-prediction depths the model trains with (Megatron-Core `mtp_num_layers`;
    /// DeepSeek-V3's MTP, Nemotron 3's repeated MTP block): each runs the MTP block on the last
    /// pipeline rank, with its `eh_proj` (`2h → h`) and another pass through the shared LM head
    /// and loss (docs/costmodel.md §1.4). `None`: no MTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp_layers: Option<u32>,
    /// The MTP block's layers in [`Model::layer_pattern`] notation (Nemotron 3's
    /// `mtp_hybrid_override_pattern`, `"*E"`), each character one the main pattern has; `None`:
    /// one layer like the stack's last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp_pattern: Option<String>,
    /// Softmax attention's output is gated per channel by `sigmoid(x·W_g)` (Qwen3-Next, HF
    /// `Qwen3NextAttention`: `q_proj` projects `2·a·d`, query and gate): one more query-sized
    /// projection and an element-wise product per attention layer (docs/costmodel.md §1.4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_output_gate: bool,
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
            limits::check_opt("model.moe.latent_size", moe.latent_size)?;
        }
        if let Some(mla) = &self.mla {
            limits::check_opt("model.mla.q_lora_rank", mla.q_lora_rank)?;
            limits::check("model.mla.kv_lora_rank", mla.kv_lora_rank)?;
            limits::check("model.mla.qk_rope_head_dim", mla.qk_rope_head_dim)?;
            limits::check("model.mla.qk_nope_head_dim", mla.qk_nope_head_dim)?;
            limits::check("model.mla.v_head_dim", mla.v_head_dim)?;
        }
        if let Some(m) = &self.mamba {
            limits::check("model.mamba.heads", m.heads)?;
            limits::check("model.mamba.head_dim", m.head_dim)?;
            limits::check("model.mamba.state", m.state)?;
            limits::check("model.mamba.groups", m.groups)?;
            limits::check("model.mamba.conv_kernel", m.conv_kernel)?;
            limits::check("model.mamba.chunk", m.chunk)?;
        }
        if let Some(la) = &self.linear_attention {
            limits::check("model.linear_attention.key_heads", la.key_heads)?;
            limits::check("model.linear_attention.key_head_dim", la.key_head_dim)?;
            limits::check("model.linear_attention.value_heads", la.value_heads)?;
            limits::check("model.linear_attention.value_head_dim", la.value_head_dim)?;
            limits::check("model.linear_attention.conv_kernel", la.conv_kernel)?;
            limits::check("model.linear_attention.chunk", la.chunk)?;
        }
        limits::check_opt("model.sliding_window", self.sliding_window)?;
        limits::check_opt("model.mtp_layers", self.mtp_layers)?;
        self.validate_pattern()?;
        self.validate_mtp()?;
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

    /// Checks [`Model::mtp_pattern`]: only with MTP depths, and only characters of the main
    /// layer pattern (so that the MTP block's layers are layer kinds of the model).
    fn validate_mtp(&self) -> Result<()> {
        let Some(mtp) = &self.mtp_pattern else {
            return Ok(());
        };
        if self.mtp_layers.is_none() {
            return Err(Error::invalid(
                "model.mtp_pattern",
                format!("{mtp:?}"),
                "null without mtp_layers",
            ));
        }
        let main = self.layer_pattern.as_deref().unwrap_or("");
        if mtp.is_empty() || mtp.chars().any(|c| !main.contains(c)) {
            return Err(Error::invalid(
                "model.mtp_pattern",
                format!("{mtp:?}"),
                format!("one or more characters of layer_pattern {main:?}"),
            ));
        }
        Ok(())
    }

    /// The layer kinds of one MTP depth's block ([`Model::mtp_pattern`], else the stack's last
    /// layer), in order; empty without MTP.
    pub fn mtp_kinds(&self) -> Vec<crate::layer::LayerKind> {
        if self.mtp_layers.is_none() {
            return Vec::new();
        }
        let kinds = self.layer_kinds();
        match &self.mtp_pattern {
            Some(p) => p
                .chars()
                .filter_map(|c| {
                    let spec = self.pattern_spec(c)?;
                    kinds.specs().iter().position(|s| *s == spec)
                })
                .collect(),
            None => self
                .layer_stack()
                .last()
                .map(|&(k, _)| k)
                .into_iter()
                .collect(),
        }
    }

    /// Checks [`Model::layer_pattern`]: one known character per layer, and the parts its
    /// characters need (`M`: `mamba`, `G`/`g`: `linear_attention`, `S`/`s`: `sliding_window`,
    /// `E` and upper-case letters: `moe`). Without a pattern, the parts no layer uses are
    /// rejected too, so that a descriptor never carries a part that is silently ignored.
    fn validate_pattern(&self) -> Result<()> {
        let Some(pattern) = &self.layer_pattern else {
            for (field, set) in [
                ("model.mamba", self.mamba.is_some()),
                ("model.linear_attention", self.linear_attention.is_some()),
                ("model.sliding_window", self.sliding_window.is_some()),
            ] {
                if set {
                    return Err(Error::invalid(
                        field,
                        "set",
                        "null without a layer_pattern (no layer uses it)",
                    ));
                }
            }
            return Ok(());
        };
        let shown = || {
            if pattern.chars().count() > 40 {
                format!("{:?}…", pattern.chars().take(40).collect::<String>())
            } else {
                format!("{pattern:?}")
            }
        };
        if let Some((i, c)) = pattern
            .chars()
            .enumerate()
            .find(|&(_, c)| !LAYER_PATTERN_CHARS.contains(c))
        {
            return Err(Error::invalid(
                "model.layer_pattern",
                shown(),
                format!(
                    "one of {LAYER_PATTERN_CHARS:?} per layer (character {i} is {:?})",
                    c
                ),
            ));
        }
        if pattern.len() != self.layers as usize {
            return Err(Error::invalid(
                "model.layer_pattern",
                shown(),
                format!(
                    "one character per layer: {} characters (it has {})",
                    self.layers,
                    pattern.len()
                ),
            ));
        }
        let needs = |chars: &str| pattern.chars().any(|c| chars.contains(c));
        for (chars, field, present) in [
            ("M", "model.mamba", self.mamba.is_some()),
            (
                "Gg",
                "model.linear_attention",
                self.linear_attention.is_some(),
            ),
            ("Ss", "model.sliding_window", self.sliding_window.is_some()),
            ("EASG", "model.moe", self.moe.is_some()),
        ] {
            if needs(chars) != present {
                let what = if present {
                    format!("null: no layer of layer_pattern {} uses it", shown())
                } else {
                    format!("set: layer_pattern {} has layers of it", shown())
                };
                return Err(Error::invalid(
                    field,
                    if present { "set" } else { "null" },
                    what,
                ));
            }
        }
        if let Some(moe) = &self.moe {
            if moe.first_dense_layers != 0 {
                return Err(Error::invalid(
                    "model.moe.first_dense_layers",
                    moe.first_dense_layers,
                    "0 with a layer_pattern (the pattern says which layers are dense)",
                ));
            }
        }
        if self.mla.is_some() && needs("Ss") {
            return Err(Error::invalid(
                "model.sliding_window",
                self.sliding_window.unwrap_or(0),
                "no sliding window with MLA (sliding-window layers are grouped-query attention)",
            ));
        }
        if let Some(m) = &self.mamba {
            if m.heads % m.groups != 0 {
                return Err(Error::invalid(
                    "model.mamba.groups",
                    m.groups,
                    format!("a divisor of mamba.heads ({})", m.heads),
                ));
            }
        }
        if let Some(la) = &self.linear_attention {
            if la.value_heads % la.key_heads != 0 {
                return Err(Error::invalid(
                    "model.linear_attention.key_heads",
                    la.key_heads,
                    format!("a divisor of value_heads ({})", la.value_heads),
                ));
            }
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

    /// Number of layers whose pattern character is one of `chars`.
    fn pattern_count(pattern: &str, chars: &str) -> u32 {
        pattern.chars().filter(|&c| chars.contains(c)).count() as u32
    }

    /// Number of MoE layers `L_moe` (0 for dense models).
    pub fn moe_layers(&self) -> u32 {
        match &self.layer_pattern {
            Some(p) => Self::pattern_count(p, "EASG"),
            None => self
                .moe
                .as_ref()
                .map_or(0, |m| self.layers - m.first_dense_layers),
        }
    }

    /// Number of layers with a dense FFN.
    pub fn dense_layers(&self) -> u32 {
        match &self.layer_pattern {
            Some(p) => Self::pattern_count(p, "-asg"),
            None => self.layers - self.moe_layers(),
        }
    }

    /// Number of layers with a token mixer (all of them without a pattern).
    pub fn mixer_layers(&self) -> u32 {
        match &self.layer_pattern {
            Some(p) => Self::pattern_count(p, "M*AaSsGg"),
            None => self.layers,
        }
    }

    /// Number of layers with softmax attention (full, GQA, MLA or sliding-window).
    pub fn attention_layers(&self) -> u32 {
        match &self.layer_pattern {
            Some(p) => Self::pattern_count(p, "*AaSs"),
            None => self.layers,
        }
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
    /// Parameters of an attention layer's output gate (`h × a·d`, Qwen3-Next), 0 without one.
    pub fn output_gate_params(&self) -> u64 {
        if self.attention_output_gate && self.mla.is_none() {
            self.hidden as u64 * self.heads as u64 * self.qk_head_dim()
        } else {
            0
        }
    }

    /// 1 with an attention output gate, else 0 (the gate's share of a query-sized width).
    pub fn output_gates(&self) -> f64 {
        (self.attention_output_gate && self.mla.is_none()) as u8 as f64
    }

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
                h * a * d + 2 * h * g * d + a * d * h + self.output_gate_params()
            }
        }
    }

    /// Norm parameters of one layer (two norms).
    pub fn norm_params(&self) -> u64 {
        self.block_norm_params(2)
    }

    /// Norm parameters of a layer of `blocks` blocks (mixer, FFN), one pre-norm each.
    pub fn block_norm_params(&self, blocks: u64) -> u64 {
        let per_norm = match self.norm {
            Norm::Rmsnorm => 1,
            Norm::Layernorm => 2,
        };
        blocks * per_norm * self.hidden as u64
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

    #[test]
    fn an_mtp_block_is_made_of_the_main_patterns_layer_kinds() {
        let mut m = crate::presets::model("nemotron-3-nano-30b-a3b").unwrap();
        assert!(m.mtp_kinds().is_empty());
        m.mtp_layers = Some(2);
        // Without a pattern: one layer like the stack's last (Nano ends with an MoE layer, kind 1).
        assert_eq!(m.mtp_kinds(), vec![1]);
        // "*E": the attention layer (kind 2 in order of first appearance) and the MoE layer.
        m.mtp_pattern = Some("*E".into());
        m.validate().unwrap();
        assert_eq!(m.mtp_kinds(), vec![2, 1]);
        // A character the main pattern lacks has no layer kind: refused, naming the field.
        m.mtp_pattern = Some("*-".into());
        let e = m.validate().unwrap_err().to_string();
        assert!(
            e.contains("model.mtp_pattern") && e.contains("layer_pattern"),
            "{e}"
        );
        // A pattern without depths is refused; depths are bounded.
        m.mtp_pattern = Some("*E".into());
        m.mtp_layers = None;
        assert!(m.validate().unwrap_err().to_string().contains("mtp_layers"));
        m.mtp_layers = Some(0);
        assert!(m
            .validate()
            .unwrap_err()
            .to_string()
            .contains("model.mtp_layers"));
    }

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
            layer_pattern: None,
            mamba: None,
            linear_attention: None,
            sliding_window: None,
            mtp_layers: None,
            mtp_pattern: None,
            attention_output_gate: false,
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
            layer_pattern: None,
            mamba: None,
            linear_attention: None,
            sliding_window: None,
            mtp_layers: None,
            mtp_pattern: None,
            attention_output_gate: false,
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
            latent_size: None,
        });
        assert!(m
            .validate()
            .unwrap_err()
            .to_string()
            .contains("model.moe.top_k"));
    }
}

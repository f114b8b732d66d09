//! Import of Hugging Face `config.json` files (Llama, Mixtral, Qwen2/Qwen3 incl. MoE,
//! DeepSeek-V3/Kimi-K2, ...) into a [`Model`].
//!
//! Supported `model_type`s and the fields read:
//!
//! * every family: `num_hidden_layers`, `hidden_size`, `num_attention_heads`,
//!   `num_key_value_heads` (default: the head count), `head_dim` (default `hidden/heads`),
//!   `intermediate_size`, `vocab_size`, `hidden_act` (default `silu`), `tie_word_embeddings`
//!   (default false);
//! * `llama`, `mistral`, `qwen2`, `qwen3`, `phi3`: dense;
//! * `nemotron` (Nemotron-4, Minitron): dense with a plain (non-gated) MLP, LayerNorm, and
//!   `kv_channels` as the head dimension when `head_dim` is absent;
//! * `mixtral`: `num_local_experts`, `num_experts_per_tok`; experts of `intermediate_size`;
//! * `qwen2_moe`, `qwen3_moe`: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
//!   `decoder_sparse_step`, `mlp_only_layers`; Qwen2-MoE's `shared_expert_intermediate_size`
//!   is one shared expert of that size;
//! * `deepseek_v3`, `kimi_k2`: `n_routed_experts`, `num_experts_per_tok`, `n_shared_experts`,
//!   `moe_intermediate_size`, `first_k_dense_replace`, `moe_layer_freq`, and the MLA ranks
//!   `q_lora_rank` (null = full-rank queries), `kv_lora_rank`, `qk_rope_head_dim`,
//!   `qk_nope_head_dim`, `v_head_dim`;
//! * `glm4_moe`: `n_routed_experts`, `num_experts_per_tok`, `n_shared_experts`,
//!   `moe_intermediate_size`, `first_k_dense_replace`;
//! * `gpt_oss`: `num_local_experts`, `experts_per_token` or `num_experts_per_tok`; experts of
//!   `intermediate_size`; `layer_types` (`sliding_attention` / `full_attention`) with
//!   `sliding_window` become a layer pattern (`S`/`A`);
//! * `nemotron_h` (Nemotron-H, Nemotron 3): the layer pattern `hybrid_override_pattern` (or the
//!   newer `layers_block_type` list, whose length is then the layer count when
//!   `num_hidden_layers` is absent), Nemotron-H's own notation (`M` Mamba-2, `*` attention, `-`
//!   MLP, `E` MoE); the Mamba-2 mixer from `mamba_num_heads`, `mamba_head_dim`,
//!   `ssm_state_size`, `n_groups` (`mamba_n_groups`), `conv_kernel` (`mamba_d_conv`),
//!   `chunk_size` (`mamba_chunk_size`, default 128) — `d_inner` is heads × head_dim, as HF's
//!   `NemotronHMamba2Mixer` builds it, so `expand` is not read; `head_dim` or
//!   `attention_head_dim`; `mlp_hidden_act` (plain MLP, `relu2`); MoE layers from
//!   `n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `n_shared_experts`,
//!   `moe_shared_expert_intermediate_size`, and a latent MoE's `moe_latent_size` (Nemotron 3
//!   Super/Ultra: experts in a projected latent space); multi-token prediction from
//!   `num_nextn_predict_layers` (the model's MTP depths; a training recipe may run more, as
//!   Megatron-Bridge's Nemotron 3 recipes run 2) with its block `mtp_hybrid_override_pattern`
//!   or `mtp_layers_block_type`;
//! * `qwen3_next`: `layer_types` or, without it, `full_attention_interval` (every n-th layer
//!   full attention, the rest gated DeltaNet: `linear_num_key_heads`, `linear_key_head_dim`,
//!   `linear_num_value_heads`, `linear_value_head_dim`, `linear_conv_kernel_dim`); MoE layers
//!   as Qwen3-MoE's (`decoder_sparse_step`, `mlp_only_layers`, one shared expert of
//!   `shared_expert_intermediate_size`); its attention layers' output gate
//!   (`attention_output_gate`: `Qwen3NextAttention`'s `q_proj` projects query and gate).
//!
//! The bare tokens `Infinity`, `-Infinity` and `NaN` that Python's `json` writes (Nemotron-H's
//! `time_step_limit`) are read as `null`.
//!
//! Leading dense layers become `first_dense_layers`; a Qwen-MoE or DeepSeek-style file whose
//! dense (MLP-only) layers are anywhere else (`decoder_sparse_step`, `mlp_only_layers`,
//! `moe_layer_freq`) becomes a layer pattern of `A` (MoE) and `a` (dense) layers.
//!
//! `hidden_act` maps onto the activation, and the family fixes the gating: every family but
//! `nemotron` uses a gated MLP (gate, up and down projections), so `silu`/`swish` import as
//! SwiGLU, the GeLU variants as GeGLU and `relu` as ReGLU; `nemotron`'s plain MLP (up and down)
//! imports `relu2` as squared ReLU, the GeLU variants as GeLU and `silu` as SiLU. An activation
//! the family cannot have is an error naming `hidden_act`, never a silent SwiGLU.
//!
//! Not modelled, so absent from the parameter and FLOP counts: biases (Qwen2 QKV, GLM-4.5,
//! gpt-oss), QK-norm weights, routers' biases, attention sinks, multi-token-prediction layers
//! (`num_nextn_predict_layers`: DeepSeek-V3's 685 B checkpoint is 671 B without them), and
//! Mistral/Phi-3's model-wide `sliding_window` (costed as full causal attention).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::model::{Activation, LinearAttention, Mamba, Mla, Model, Moe, Norm};

/// The `model_type`s this importer understands.
pub const SUPPORTED_MODEL_TYPES: [&str; 15] = [
    "deepseek_v3",
    "glm4_moe",
    "gpt_oss",
    "kimi_k2",
    "llama",
    "mistral",
    "mixtral",
    "nemotron",
    "nemotron_h",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
];

/// Chunk length of flash-linear-attention's chunked gated delta rule (`chunk_size = 64` in
/// `fla.ops.gated_delta_rule.chunk`), which Qwen3-Next's gated DeltaNet layers run.
const DELTANET_CHUNK: u32 = 64;

/// Chunk length of Nemotron-H's Mamba-2 scan when the file names none (HF `NemotronHConfig`).
const NEMOTRON_H_DEFAULT_CHUNK: u32 = 128;

/// The pseudo-field named when the document itself is wrong (not JSON, not an object).
const DOCUMENT: &str = "config.json";

fn hf_error(field: &str, reason: impl Into<String>) -> Error {
    Error::HfConfig {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// A short description of a JSON value for error messages.
fn describe(v: &Value) -> String {
    let text = v.to_string();
    if text.len() > 40 {
        format!(
            "{}...",
            &text[..text.char_indices().nth(37).map_or(text.len(), |(i, _)| i)]
        )
    } else {
        text
    }
}

/// Typed access to the fields of one `config.json`; every error names the JSON key.
struct Config<'a> {
    obj: &'a Map<String, Value>,
    model_type: &'a str,
}

impl Config<'_> {
    /// The value of `key`, treating JSON `null` as absent.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> Error {
        hf_error(
            key,
            format!("missing (required for model_type '{}')", self.model_type),
        )
    }

    /// A non-negative integer that fits in `u32`, if present.
    fn opt_count(&self, key: &str) -> Result<Option<u32>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = v.as_u64().ok_or_else(|| {
            hf_error(
                key,
                format!("expected a non-negative integer, got {}", describe(v)),
            )
        })?;
        u32::try_from(n)
            .map(Some)
            .map_err(|_| hf_error(key, format!("{n} is too large (at most {})", u32::MAX)))
    }

    /// A positive integer, if present.
    fn opt_positive(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_count(key)? {
            Some(0) => Err(hf_error(key, "must be >= 1, got 0")),
            other => Ok(other),
        }
    }

    /// A required positive integer.
    fn positive(&self, key: &str) -> Result<u32> {
        self.opt_positive(key)?.ok_or_else(|| self.missing(key))
    }

    /// A required non-negative integer.
    fn count(&self, key: &str) -> Result<u32> {
        self.opt_count(key)?.ok_or_else(|| self.missing(key))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                hf_error(key, format!("expected true or false, got {}", describe(v)))
            }),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| hf_error(key, format!("expected a string, got {}", describe(v)))),
        }
    }

    /// A list of layer indices below `layers` (absent = empty).
    fn layer_list(&self, key: &str, layers: u32) -> Result<Vec<u32>> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let bad = || {
            hf_error(
                key,
                format!("expected a list of layer indices, got {}", describe(v)),
            )
        };
        let items = v.as_array().ok_or_else(bad)?;
        items
            .iter()
            .map(|item| {
                let i = item.as_u64().ok_or_else(bad)?;
                if i >= layers as u64 {
                    return Err(hf_error(
                        key,
                        format!("layer {i} is out of range (num_hidden_layers = {layers})"),
                    ));
                }
                Ok(i as u32)
            })
            .collect()
    }
}

/// Whether the config trains with dropout: any of `attention_dropout`, `hidden_dropout`,
/// `resid_pdrop`, `attn_pdrop` or `ffn_dropout` above 0 (absent or null: none).
fn dropout(cfg: &Config) -> Result<bool> {
    for key in [
        "attention_dropout",
        "hidden_dropout",
        "resid_pdrop",
        "attn_pdrop",
        "ffn_dropout",
    ] {
        match cfg.get(key) {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_f64() {
                Some(p) if (0.0..1.0).contains(&p) => {
                    if p > 0.0 {
                        return Ok(true);
                    }
                }
                _ => {
                    return Err(hf_error(
                        key,
                        format!(
                            "must be a probability in [0, 1), got {}",
                            crate::error::echo(&v.to_string())
                        ),
                    ))
                }
            },
        }
    }
    Ok(false)
}

/// Families whose MLP is plain (up and down projections), not gated.
const PLAIN_MLP_MODEL_TYPES: [&str; 2] = ["nemotron", "nemotron_h"];

/// Maps `hidden_act` onto the activation, gated or plain as the family's MLP is (see the
/// module documentation); an activation the family cannot have is an error.
fn activation(cfg: &Config) -> Result<Activation> {
    // Nemotron-H names the MLP's activation `mlp_hidden_act` (its Mamba layers have their own).
    let key = if cfg.model_type == "nemotron_h" {
        "mlp_hidden_act"
    } else {
        "hidden_act"
    };
    let act = cfg.opt_str(key)?.unwrap_or(if key == "mlp_hidden_act" {
        "relu2"
    } else {
        "silu"
    });
    let gated = !PLAIN_MLP_MODEL_TYPES.contains(&cfg.model_type);
    let name = act.to_ascii_lowercase();
    let gelu = matches!(
        name.as_str(),
        "gelu"
            | "gelu_new"
            | "gelu_fast"
            | "gelu_pytorch_tanh"
            | "gelu_python"
            | "gelu_accurate"
            | "quick_gelu"
    );
    let found = match (name.as_str(), gated) {
        ("silu" | "swish" | "swiglu", true) => Some(Activation::Swiglu),
        ("silu" | "swish", false) => Some(Activation::Silu),
        (_, true) if gelu => Some(Activation::Geglu),
        (_, false) if gelu => Some(Activation::Gelu),
        ("relu", true) => Some(Activation::Reglu),
        ("relu2", false) => Some(Activation::Relu2),
        _ => None,
    };
    found.ok_or_else(|| {
        let supported = if gated {
            "a gated MLP: silu/swish, the gelu variants, relu"
        } else {
            "a plain MLP: relu2, the gelu variants, silu"
        };
        hf_error(
            key,
            format!(
                "unsupported activation '{}' for model_type '{}' ({supported})",
                crate::error::echo(act),
                cfg.model_type
            ),
        )
    })
}

/// Where a MoE stack's dense (MLP-only) layers are.
enum FfnLayout {
    /// No layer is MoE.
    AllDense,
    /// Layers `0..k` dense, the rest MoE (`first_dense_layers`).
    Leading(u32),
    /// Dense layers elsewhere: a layer pattern of attention layers, `A` with the MoE FFN and
    /// `a` with the dense one (Qwen's `decoder_sparse_step`/`mlp_only_layers`, DeepSeek's
    /// `moe_layer_freq`).
    Interleaved(String),
}

/// The FFN layout of `layers` layers whose MoE layers are those where `is_moe` holds.
fn ffn_layout(layers: u32, is_moe: impl Fn(u32) -> bool) -> FfnLayout {
    let dense: Vec<u32> = (0..layers).filter(|&i| !is_moe(i)).collect();
    if dense.len() == layers as usize {
        return FfnLayout::AllDense;
    }
    if dense.iter().enumerate().all(|(pos, &i)| i == pos as u32) {
        return FfnLayout::Leading(dense.len() as u32);
    }
    FfnLayout::Interleaved(
        (0..layers)
            .map(|i| if is_moe(i) { 'A' } else { 'a' })
            .collect(),
    )
}

/// Builds the MoE block, or returns `None` when the layer pattern leaves no MoE layer.
fn moe_block(
    layers: u32,
    first_dense: Option<u32>,
    num_experts: u32,
    top_k: u32,
    expert_ffn_hidden: u32,
    shared: Option<(u32, Option<u32>)>,
) -> Option<Moe> {
    let first_dense_layers = first_dense?;
    debug_assert!(first_dense_layers < layers);
    let (shared_experts, shared_expert_ffn_hidden) = shared.unwrap_or((0, None));
    Some(Moe {
        num_experts,
        top_k,
        expert_ffn_hidden,
        shared_experts,
        shared_expert_ffn_hidden,
        first_dense_layers,
        latent_size: None,
    })
}

/// Qwen2-MoE / Qwen3-MoE: a layer is sparse unless listed in `mlp_only_layers` or skipped by
/// `decoder_sparse_step` (transformers' `Qwen3MoeDecoderLayer`).
fn qwen_moe(cfg: &Config, layers: u32, shared_expert: bool) -> Result<(Option<Moe>, Hybrid)> {
    let num_experts = cfg.count("num_experts")?;
    if num_experts == 0 {
        return Ok((None, Hybrid::default()));
    }
    let step = cfg.opt_positive("decoder_sparse_step")?.unwrap_or(1);
    // Sorted, so that each layer's lookup is a bisection (the list can be as long as the file).
    let mut mlp_only = cfg.layer_list("mlp_only_layers", layers)?;
    mlp_only.sort_unstable();
    mlp_only.dedup();
    let layout = ffn_layout(layers, |i| {
        mlp_only.binary_search(&i).is_err() && (i + 1) % step == 0
    });
    let (first_dense, hybrid) = split_layout(layout);
    if first_dense.is_none() {
        return Ok((None, Hybrid::default()));
    }
    let shared = if shared_expert {
        match cfg.opt_count("shared_expert_intermediate_size")? {
            Some(f) if f > 0 => Some((1, Some(f))),
            _ => None,
        }
    } else {
        None
    };
    Ok((
        moe_block(
            layers,
            first_dense,
            num_experts,
            cfg.positive("num_experts_per_tok")?,
            cfg.positive("moe_intermediate_size")?,
            shared,
        ),
        hybrid,
    ))
}

/// The descriptor's view of an FFN layout: `first_dense_layers` (`None`: no MoE layer) and,
/// for interleaved dense layers, the layer pattern (with `first_dense_layers` 0).
fn split_layout(layout: FfnLayout) -> (Option<u32>, Hybrid) {
    match layout {
        FfnLayout::AllDense => (None, Hybrid::default()),
        FfnLayout::Leading(k) => (Some(k), Hybrid::default()),
        FfnLayout::Interleaved(pattern) => (
            Some(0),
            Hybrid {
                layer_pattern: Some(pattern),
                ..Hybrid::default()
            },
        ),
    }
}

/// DeepSeek-V3 / Kimi-K2 / GLM-4.5: routed experts from `first_k_dense_replace` on (every
/// `moe_layer_freq`-th layer for DeepSeek), shared experts of the routed experts' size.
fn deepseek_style_moe(
    cfg: &Config,
    layers: u32,
    layer_freq: bool,
) -> Result<(Option<Moe>, Hybrid)> {
    let Some(num_experts) = cfg.opt_count("n_routed_experts")? else {
        return Ok((None, Hybrid::default()));
    };
    if num_experts == 0 {
        return Ok((None, Hybrid::default()));
    }
    let first_k = cfg.count("first_k_dense_replace")?;
    let freq = if layer_freq {
        cfg.opt_positive("moe_layer_freq")?.unwrap_or(1)
    } else {
        1
    };
    let (first_dense, hybrid) = split_layout(ffn_layout(layers, |i| i >= first_k && i % freq == 0));
    if first_dense.is_none() {
        return Ok((None, Hybrid::default()));
    }
    let shared_experts = cfg.count("n_shared_experts")?;
    Ok((
        moe_block(
            layers,
            first_dense,
            num_experts,
            cfg.positive("num_experts_per_tok")?,
            cfg.positive("moe_intermediate_size")?,
            Some((shared_experts, None)),
        ),
        hybrid,
    ))
}

fn mla(cfg: &Config) -> Result<Mla> {
    Ok(Mla {
        q_lora_rank: cfg.opt_positive("q_lora_rank")?,
        kv_lora_rank: cfg.positive("kv_lora_rank")?,
        qk_rope_head_dim: cfg.count("qk_rope_head_dim")?,
        qk_nope_head_dim: cfg.positive("qk_nope_head_dim")?,
        v_head_dim: cfg.positive("v_head_dim")?,
    })
}

/// gpt-oss names top-k `experts_per_token`; newer transformers also write `num_experts_per_tok`.
fn gpt_oss_top_k(cfg: &Config) -> Result<u32> {
    match (
        cfg.opt_positive("experts_per_token")?,
        cfg.opt_positive("num_experts_per_tok")?,
    ) {
        (Some(a), Some(b)) if a != b => Err(hf_error(
            "experts_per_token",
            format!("{a} disagrees with num_experts_per_tok = {b}"),
        )),
        (Some(k), _) | (None, Some(k)) => Ok(k),
        (None, None) => Err(cfg.missing("num_experts_per_tok")),
    }
}

/// Python's `json` writes non-finite floats as the bare tokens `Infinity`, `-Infinity` and
/// `NaN`, which are not JSON; outside strings they become `null` here (no field this importer
/// reads is a float that may be non-finite).
fn non_finite_as_null(text: &str) -> std::borrow::Cow<'_, str> {
    if !(text.contains("Infinity") || text.contains("NaN")) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        } else if let Some(token) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t))
        {
            out.push_str("null");
            rest = &rest[token.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

/// A list of strings under `key`, if present.
fn string_list<'a>(cfg: &'a Config, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(v) = cfg.get(key) else {
        return Ok(None);
    };
    let bad = || {
        hf_error(
            key,
            format!("expected a list of strings, got {}", describe(v)),
        )
    };
    let items = v.as_array().ok_or_else(bad)?;
    items
        .iter()
        .map(|item| item.as_str().ok_or_else(bad))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Nemotron-H's layer pattern: `hybrid_override_pattern`, or the newer `layers_block_type`
/// list mapped onto the same characters. Every character must be one of `M*-E`.
fn nemotron_h_pattern(cfg: &Config) -> Result<String> {
    nemotron_h_layers(cfg, "hybrid_override_pattern", "layers_block_type")?
        .ok_or_else(|| cfg.missing("hybrid_override_pattern"))
}

/// Nemotron-H's MTP: `num_nextn_predict_layers` depths of the block `mtp_hybrid_override_pattern`
/// (or `mtp_layers_block_type`); `(None, None)` without MTP.
fn nemotron_h_mtp(cfg: &Config) -> Result<(Option<u32>, Option<String>)> {
    match cfg.opt_count("num_nextn_predict_layers")? {
        Some(depths) if depths > 0 => Ok((
            Some(depths),
            nemotron_h_layers(cfg, "mtp_hybrid_override_pattern", "mtp_layers_block_type")?,
        )),
        _ => Ok((None, None)),
    }
}

/// A Nemotron-H pattern string under `pattern_key`, or the list of layer types under `list_key`
/// mapped onto its characters; `None` when the file has neither.
fn nemotron_h_layers(cfg: &Config, pattern_key: &str, list_key: &str) -> Result<Option<String>> {
    let (key, pattern) = if let Some(p) = cfg.opt_str(pattern_key)? {
        (pattern_key, p.to_string())
    } else if let Some(list) = string_list(cfg, list_key)? {
        let mut p = String::with_capacity(list.len());
        for t in list {
            p.push(match t {
                "mamba" | "linear_attention" => 'M',
                "attention" | "full_attention" => '*',
                "mlp" => '-',
                "moe" => 'E',
                other => {
                    return Err(hf_error(
                        list_key,
                        format!(
                            "unknown layer type '{}' (known: mamba, attention, mlp, moe)",
                            crate::error::echo(other)
                        ),
                    ))
                }
            });
        }
        (list_key, p)
    } else {
        return Ok(None);
    };
    if let Some(c) = pattern.chars().find(|c| !"M*-E".contains(*c)) {
        return Err(hf_error(
            key,
            format!(
                "unknown layer character {:?} (Nemotron-H's are M, *, - and E)",
                c
            ),
        ));
    }
    Ok(Some(pattern))
}

/// The Mamba-2 mixer of a Nemotron-H file.
fn nemotron_h_mamba(cfg: &Config) -> Result<Mamba> {
    let either = |a: &str, b: &str| -> Result<Option<u32>> {
        Ok(match cfg.opt_positive(a)? {
            Some(v) => Some(v),
            None => cfg.opt_positive(b)?,
        })
    };
    Ok(Mamba {
        heads: cfg.positive("mamba_num_heads")?,
        head_dim: cfg.positive("mamba_head_dim")?,
        state: cfg.positive("ssm_state_size")?,
        groups: either("n_groups", "mamba_n_groups")?.ok_or_else(|| cfg.missing("n_groups"))?,
        conv_kernel: either("conv_kernel", "mamba_d_conv")?
            .ok_or_else(|| cfg.missing("conv_kernel"))?,
        chunk: either("chunk_size", "mamba_chunk_size")?.unwrap_or(NEMOTRON_H_DEFAULT_CHUNK),
    })
}

/// The MoE block of a Nemotron-H file with `E` layers (`None` without).
fn nemotron_h_moe(cfg: &Config, pattern: &str) -> Result<Option<Moe>> {
    if !pattern.contains('E') {
        return Ok(None);
    }
    let shared_experts = cfg.opt_count("n_shared_experts")?.unwrap_or(0);
    Ok(Some(Moe {
        num_experts: cfg.positive("n_routed_experts")?,
        top_k: cfg.positive("num_experts_per_tok")?,
        expert_ffn_hidden: cfg.positive("moe_intermediate_size")?,
        shared_experts,
        shared_expert_ffn_hidden: if shared_experts > 0 {
            cfg.opt_positive("moe_shared_expert_intermediate_size")?
        } else {
            None
        },
        first_dense_layers: 0,
        // Nemotron 3 Super/Ultra's LatentMoE: experts in a projected latent space.
        latent_size: cfg.opt_positive("moe_latent_size")?,
    }))
}

/// Per-layer attention kinds from `layer_types` (`full_attention`, `sliding_attention`,
/// `linear_attention`), as pattern letters `A`, `S`, `G` (upper case; lowered later for a dense
/// FFN). `None` when the file has no `layer_types`.
fn layer_type_letters(cfg: &Config, layers: u32) -> Result<Option<Vec<char>>> {
    let Some(list) = string_list(cfg, "layer_types")? else {
        return Ok(None);
    };
    if list.len() != layers as usize {
        return Err(hf_error(
            "layer_types",
            format!(
                "{} entries for num_hidden_layers = {layers} (one per layer)",
                list.len()
            ),
        ));
    }
    list.into_iter()
        .map(|t| match t {
            "full_attention" => Ok('A'),
            "sliding_attention" => Ok('S'),
            "linear_attention" => Ok('G'),
            other => Err(hf_error(
                "layer_types",
                format!(
                    "unknown layer type '{}' (known: full_attention, sliding_attention, \
                     linear_attention)",
                    crate::error::echo(other)
                ),
            )),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// A pattern of `letters` (upper case) with the layers where `is_moe` is false in lower case
/// (their dense FFN).
fn pattern_of(letters: &[char], is_moe: impl Fn(u32) -> bool) -> String {
    letters
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            if is_moe(i as u32) {
                c
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// The JSON key behind a descriptor field, for errors raised by [`Model::validate`].
fn json_key(model_field: &str) -> &str {
    match model_field {
        "model.layers" => "num_hidden_layers",
        "model.hidden" => "hidden_size",
        "model.heads" => "num_attention_heads",
        "model.kv_heads" => "num_key_value_heads",
        "model.head_dim" => "head_dim",
        "model.ffn_hidden" => "intermediate_size",
        "model.vocab" => "vocab_size",
        "model.moe.top_k" => "num_experts_per_tok",
        "model.moe.first_dense_layers" => "first_k_dense_replace",
        "model.layer_pattern" => "hybrid_override_pattern",
        "model.sliding_window" => "sliding_window",
        "model.mtp_layers" => "num_nextn_predict_layers",
        "model.mtp_pattern" => "mtp_hybrid_override_pattern",
        "model.mamba.heads" => "mamba_num_heads",
        "model.mamba.head_dim" => "mamba_head_dim",
        "model.mamba.state" => "ssm_state_size",
        "model.mamba.groups" => "n_groups",
        "model.mamba.conv_kernel" => "conv_kernel",
        "model.mamba.chunk" => "chunk_size",
        "model.linear_attention.key_heads" => "linear_num_key_heads",
        "model.linear_attention.key_head_dim" => "linear_key_head_dim",
        "model.linear_attention.value_heads" => "linear_num_value_heads",
        "model.linear_attention.value_head_dim" => "linear_value_head_dim",
        "model.linear_attention.conv_kernel" => "linear_conv_kernel_dim",
        other => other.strip_prefix("model.mla.").unwrap_or(other),
    }
}

/// The hybrid-stack parts of a model read from a file (all `None` for a uniform stack).
#[derive(Default)]
struct Hybrid {
    layer_pattern: Option<String>,
    mamba: Option<Mamba>,
    linear_attention: Option<LinearAttention>,
    sliding_window: Option<u32>,
    mtp_layers: Option<u32>,
    mtp_pattern: Option<String>,
    attention_output_gate: bool,
}

/// Parses the text of a `config.json`; `name` overrides the name taken from the file
/// (`_name_or_path`, else the `model_type`). See the module documentation for what is mapped.
pub fn model_from_hf_config(json_text: &str, name: Option<&str>) -> Result<Model> {
    let value: Value = serde_json::from_str(&non_finite_as_null(json_text))
        .map_err(|e| hf_error(DOCUMENT, format!("not valid JSON: {e}")))?;
    let obj = value.as_object().ok_or_else(|| {
        hf_error(
            DOCUMENT,
            format!("expected a JSON object, got {}", describe(&value)),
        )
    })?;
    let supported = SUPPORTED_MODEL_TYPES.join(", ");
    let model_type = match obj.get("model_type") {
        None | Some(Value::Null) => {
            return Err(hf_error(
                "model_type",
                format!("missing (supported: {supported})"),
            ));
        }
        Some(Value::String(t)) => t.as_str(),
        Some(other) => {
            return Err(hf_error(
                "model_type",
                format!("expected a string, got {}", describe(other)),
            ));
        }
    };
    if !SUPPORTED_MODEL_TYPES.contains(&model_type) {
        return Err(hf_error(
            "model_type",
            format!(
                "unsupported '{}' (supported: {supported})",
                crate::error::echo(model_type)
            ),
        ));
    }
    let cfg = Config { obj, model_type };

    // Nemotron 3 Ultra's file has no `num_hidden_layers`: the block-type list is the count.
    let layers = match (
        cfg.opt_positive("num_hidden_layers")?,
        model_type == "nemotron_h",
    ) {
        (Some(n), _) => n,
        (None, true) => {
            let n = nemotron_h_pattern(&cfg)?.chars().count();
            u32::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| cfg.missing("num_hidden_layers"))?
        }
        (None, false) => return Err(cfg.missing("num_hidden_layers")),
    };
    // Before anything looks at every layer (`ffn_layout`).
    crate::limits::check("model.layers", layers).map_err(as_hf_error)?;
    let hidden = cfg.positive("hidden_size")?;
    let heads = cfg.positive("num_attention_heads")?;
    let kv_heads = cfg.opt_positive("num_key_value_heads")?.unwrap_or(heads);
    // Qwen3-Next and Nemotron 3 have no dense FFN layer but keep the key; a file without it
    // has no dense layer either (checked against the pattern below).
    let ffn_hidden = cfg.positive("intermediate_size")?;
    let vocab = cfg.positive("vocab_size")?;
    let activation = activation(&cfg)?;
    let tied_embeddings = cfg.bool_or("tie_word_embeddings", false)?;
    let dropout = dropout(&cfg)?;
    let is_mla = matches!(model_type, "deepseek_v3" | "kimi_k2");
    // MLA models have no single head dimension (qk = nope + rope, v separate); newer
    // transformers write `head_dim = qk_rope_head_dim` there, which is not one either.
    let head_dim = if is_mla {
        None
    } else {
        match cfg.opt_positive("head_dim")? {
            Some(d) => Some(d),
            None if model_type == "nemotron" => cfg.opt_positive("kv_channels")?,
            None if model_type == "nemotron_h" => cfg.opt_positive("attention_head_dim")?,
            None => None,
        }
    };

    let mut hybrid = Hybrid::default();
    let (moe, mla) = match model_type {
        "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "nemotron" => (None, None),
        "mixtral" => {
            let moe = moe_block(
                layers,
                Some(0),
                cfg.positive("num_local_experts")?,
                cfg.positive("num_experts_per_tok")?,
                ffn_hidden,
                None,
            );
            (moe, None)
        }
        "gpt_oss" => {
            let moe = moe_block(
                layers,
                Some(0),
                cfg.positive("num_local_experts")?,
                gpt_oss_top_k(&cfg)?,
                ffn_hidden,
                None,
            );
            if let Some(letters) = layer_type_letters(&cfg, layers)? {
                if letters.contains(&'G') {
                    return Err(hf_error(
                        "layer_types",
                        "gpt-oss has no linear_attention layers",
                    ));
                }
                if letters.contains(&'S') {
                    hybrid.layer_pattern = Some(pattern_of(&letters, |_| true));
                    hybrid.sliding_window = Some(cfg.positive("sliding_window")?);
                }
            }
            (moe, None)
        }
        "nemotron_h" => {
            let pattern = nemotron_h_pattern(&cfg)?;
            if pattern.contains('M') {
                hybrid.mamba = Some(nemotron_h_mamba(&cfg)?);
            }
            let moe = nemotron_h_moe(&cfg, &pattern)?;
            hybrid.layer_pattern = Some(pattern);
            (hybrid.mtp_layers, hybrid.mtp_pattern) = nemotron_h_mtp(&cfg)?;
            (moe, None)
        }
        "qwen3_next" => {
            let letters = match layer_type_letters(&cfg, layers)? {
                Some(l) => l,
                None => {
                    let every = cfg.positive("full_attention_interval")?;
                    (0..layers)
                        .map(|i| if (i + 1) % every == 0 { 'A' } else { 'G' })
                        .collect()
                }
            };
            if letters.contains(&'S') {
                return Err(hf_error(
                    "layer_types",
                    "Qwen3-Next has no sliding_attention layers",
                ));
            }
            let num_experts = cfg.opt_count("num_experts")?.unwrap_or(0);
            let step = cfg.opt_positive("decoder_sparse_step")?.unwrap_or(1);
            let mut mlp_only = cfg.layer_list("mlp_only_layers", layers)?;
            mlp_only.sort_unstable();
            let is_moe = |i: u32| {
                num_experts > 0 && mlp_only.binary_search(&i).is_err() && (i + 1) % step == 0
            };
            let pattern = pattern_of(&letters, is_moe);
            let moe = if pattern.chars().any(|c| c.is_ascii_uppercase()) {
                Some(Moe {
                    num_experts,
                    top_k: cfg.positive("num_experts_per_tok")?,
                    expert_ffn_hidden: cfg.positive("moe_intermediate_size")?,
                    shared_experts: u32::from(
                        cfg.opt_count("shared_expert_intermediate_size")?
                            .unwrap_or(0)
                            > 0,
                    ),
                    shared_expert_ffn_hidden: cfg
                        .opt_count("shared_expert_intermediate_size")?
                        .filter(|&f| f > 0),
                    first_dense_layers: 0,
                    latent_size: None,
                })
            } else {
                None
            };
            if letters.contains(&'G') {
                hybrid.linear_attention = Some(LinearAttention {
                    key_heads: cfg.positive("linear_num_key_heads")?,
                    key_head_dim: cfg.positive("linear_key_head_dim")?,
                    value_heads: cfg.positive("linear_num_value_heads")?,
                    value_head_dim: cfg.positive("linear_value_head_dim")?,
                    conv_kernel: cfg.positive("linear_conv_kernel_dim")?,
                    chunk: DELTANET_CHUNK,
                });
            }
            hybrid.layer_pattern = Some(pattern);
            // HF `Qwen3NextAttention` always gates its output (`q_proj` of `2·a·d`).
            hybrid.attention_output_gate = true;
            (moe, None)
        }
        "qwen2_moe" | "qwen3_moe" => {
            let (moe, h) = qwen_moe(&cfg, layers, model_type == "qwen2_moe")?;
            hybrid = h;
            (moe, None)
        }
        "glm4_moe" => {
            let (moe, h) = deepseek_style_moe(&cfg, layers, false)?;
            hybrid = h;
            (moe, None)
        }
        "deepseek_v3" | "kimi_k2" => {
            let (moe, h) = deepseek_style_moe(&cfg, layers, true)?;
            hybrid = h;
            (moe, Some(mla(&cfg)?))
        }
        other => unreachable!("model_type '{other}' is in SUPPORTED_MODEL_TYPES but not mapped"),
    };

    let name = name
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| {
            cfg.get("_name_or_path")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| model_type.to_string());

    let model = Model {
        name,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        ffn_hidden,
        vocab,
        activation,
        // Nemotron's `layernorm1p` is a LayerNorm (weight and bias); the rest (Nemotron-H too)
        // use RMSNorm.
        norm: if model_type == "nemotron" {
            Norm::Layernorm
        } else {
            Norm::Rmsnorm
        },
        tied_embeddings,
        dropout,
        moe,
        mla,
        layer_pattern: hybrid.layer_pattern,
        mamba: hybrid.mamba,
        linear_attention: hybrid.linear_attention,
        sliding_window: hybrid.sliding_window,
        mtp_layers: hybrid.mtp_layers,
        mtp_pattern: hybrid.mtp_pattern,
        attention_output_gate: hybrid.attention_output_gate,
    };
    model.validate().map_err(as_hf_error)?;
    Ok(model)
}

/// A descriptor's validation error as the import's: naming the JSON key behind the field.
fn as_hf_error(e: Error) -> Error {
    match e {
        Error::InvalidField {
            field,
            value,
            allowed,
        } => hf_error(
            json_key(&field),
            format!("gives {field} = {value}, which is not allowed (allowed: {allowed})"),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama_json(extra: &str) -> String {
        format!(
            r#"{{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                "vocab_size": 1000{extra}}}"#
        )
    }

    fn field_of(e: &Error) -> &str {
        match e {
            Error::HfConfig { field, .. } => field,
            other => panic!("expected an HfConfig error, got {other:?}"),
        }
    }

    #[test]
    fn minimal_llama_uses_the_defaults() {
        let m = model_from_hf_config(&llama_json(""), None).unwrap();
        assert_eq!(m.name, "llama");
        assert_eq!(
            (
                m.layers,
                m.hidden,
                m.heads,
                m.kv_heads,
                m.ffn_hidden,
                m.vocab
            ),
            (2, 64, 4, 2, 128, 1000)
        );
        assert_eq!(
            (m.head_dim, m.activation, m.norm, m.tied_embeddings),
            (None, Activation::Swiglu, Norm::Rmsnorm, false)
        );
        assert!(m.moe.is_none() && m.mla.is_none());
    }

    #[test]
    fn name_argument_then_name_or_path_then_model_type() {
        let j = llama_json(r#", "_name_or_path": "org/tiny""#);
        assert_eq!(model_from_hf_config(&j, Some("mine")).unwrap().name, "mine");
        assert_eq!(model_from_hf_config(&j, None).unwrap().name, "org/tiny");
        assert_eq!(
            model_from_hf_config(&j, Some("  ")).unwrap().name,
            "org/tiny"
        );
        let j = llama_json(r#", "_name_or_path": """#);
        assert_eq!(model_from_hf_config(&j, None).unwrap().name, "llama");
    }

    #[test]
    fn kv_heads_default_to_heads_and_null_is_absent() {
        let j = llama_json("").replace(
            r#""num_key_value_heads": 2"#,
            r#""num_key_value_heads": null"#,
        );
        assert_eq!(model_from_hf_config(&j, None).unwrap().kv_heads, 4);
    }

    #[test]
    fn gated_families_map_the_activation_onto_its_gated_form() {
        for (act, want) in [
            ("gelu", Activation::Geglu),
            ("gelu_pytorch_tanh", Activation::Geglu),
            ("SiLU", Activation::Swiglu),
            ("swish", Activation::Swiglu),
            ("relu", Activation::Reglu),
        ] {
            let m = model_from_hf_config(&llama_json(&format!(r#", "hidden_act": "{act}""#)), None)
                .unwrap();
            assert_eq!(m.activation, want, "{act}");
            assert_eq!(m.activation.ffn_matrices(), 3);
        }
        for act in ["tanhshrink", "relu2"] {
            let e = model_from_hf_config(&llama_json(&format!(r#", "hidden_act": "{act}""#)), None)
                .unwrap_err();
            assert_eq!(field_of(&e), "hidden_act", "{act}");
        }
    }

    #[test]
    fn nemotron_has_a_plain_squared_relu_mlp_and_layernorm() {
        // Nemotron-4 4B (Minitron), the config NVIDIA/TensorRT-LLM's
        // tests/unittest/_torch/modeling/test_modeling_nemotron.py tests with
        // (`Nemotron_4_4B_CONFIG`, transformers 4.48).
        let text = r#"{"architectures": ["NemotronForCausalLM"], "bos_token_id": 2,
            "eos_token_id": 3, "hidden_act": "relu2", "hidden_size": 3072,
            "initializer_range": 0.0134, "intermediate_size": 9216,
            "max_position_embeddings": 4096, "model_type": "nemotron",
            "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "norm_eps": 1e-05, "rope_theta": 10000, "partial_rotary_factor": 0.5,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "transformers_version": "4.48.0", "use_cache": true, "vocab_size": 256000,
            "kv_channels": 128}"#;
        let m = model_from_hf_config(text, None).unwrap();
        assert_eq!(m.activation, Activation::Relu2);
        assert_eq!(m.activation.ffn_matrices(), 2);
        assert_eq!(m.norm, Norm::Layernorm);
        assert_eq!(m.head_dim, Some(128));
        assert_eq!(
            (m.layers, m.hidden, m.ffn_hidden, m.kv_heads),
            (32, 3072, 9216, 8)
        );
        let gated = text.replace(r#""relu2""#, r#""silu""#);
        assert_eq!(
            model_from_hf_config(&gated, None).unwrap().activation,
            Activation::Silu
        );
    }

    #[test]
    fn zero_and_wrong_types_name_the_key() {
        let e = model_from_hf_config(&llama_json("").replace(": 64", ": 0"), None).unwrap_err();
        assert_eq!(field_of(&e), "hidden_size");
        assert!(e.to_string().contains(">= 1"), "{e}");
        let e = model_from_hf_config(&llama_json("").replace(": 64", ": -64"), None).unwrap_err();
        assert_eq!(field_of(&e), "hidden_size");
        let e = model_from_hf_config(&llama_json("").replace(": 64", ": 64.5"), None).unwrap_err();
        assert!(
            e.to_string().contains("non-negative integer, got 64.5"),
            "{e}"
        );
        let e = model_from_hf_config(&llama_json("").replace(": 64", ": 99999999999"), None)
            .unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let e = model_from_hf_config(&llama_json(r#", "tie_word_embeddings": "yes""#), None)
            .unwrap_err();
        assert_eq!(field_of(&e), "tie_word_embeddings");
    }

    #[test]
    fn validation_failures_name_the_json_key() {
        let j =
            llama_json("").replace(r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#);
        let e = model_from_hf_config(&j, None).unwrap_err();
        assert_eq!(field_of(&e), "num_key_value_heads");
        assert!(e.to_string().contains("divisor of heads"), "{e}");
        let j = llama_json("").replace(r#""hidden_size": 64"#, r#""hidden_size": 66"#);
        assert_eq!(
            field_of(&model_from_hf_config(&j, None).unwrap_err()),
            "head_dim"
        );
    }

    fn qwen3_moe_json(extra: &str) -> String {
        format!(
            r#"{{"model_type": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 8,
                "num_experts_per_tok": 2, "vocab_size": 1000{extra}}}"#
        )
    }

    #[test]
    fn qwen_leading_mlp_only_layers_become_first_dense_layers() {
        let m =
            model_from_hf_config(&qwen3_moe_json(r#", "mlp_only_layers": [1, 0]"#), None).unwrap();
        let moe = m.moe.unwrap();
        assert_eq!(
            (moe.first_dense_layers, moe.expert_ffn_hidden, m.ffn_hidden),
            (2, 32, 256)
        );
        assert_eq!(m.head_dim, Some(32));
    }

    #[test]
    fn qwen_interleaved_dense_layers_become_a_layer_pattern() {
        // decoder_sparse_step 2: layers 1, 3, 5 MoE (transformers' `(i + 1) % step == 0`).
        let m =
            model_from_hf_config(&qwen3_moe_json(r#", "decoder_sparse_step": 2"#), None).unwrap();
        assert_eq!(m.layer_pattern.as_deref(), Some("aAaAaA"));
        assert_eq!((m.moe_layers(), m.dense_layers()), (3, 3));
        assert_eq!(m.moe.unwrap().first_dense_layers, 0);
        let m = model_from_hf_config(&qwen3_moe_json(r#", "mlp_only_layers": [3]"#), None).unwrap();
        assert_eq!(m.layer_pattern.as_deref(), Some("AAAaAA"));
        let e =
            model_from_hf_config(&qwen3_moe_json(r#", "mlp_only_layers": [6]"#), None).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e =
            model_from_hf_config(&qwen3_moe_json(r#", "mlp_only_layers": 3"#), None).unwrap_err();
        assert!(e.to_string().contains("list of layer indices"), "{e}");
    }

    #[test]
    fn qwen_with_every_layer_dense_or_no_experts_is_a_dense_model() {
        let m = model_from_hf_config(
            &qwen3_moe_json(r#", "mlp_only_layers": [0, 1, 2, 3, 4, 5]"#),
            None,
        )
        .unwrap();
        assert!(m.moe.is_none());
        let m = model_from_hf_config(
            &qwen3_moe_json("").replace(r#""num_experts": 8"#, r#""num_experts": 0"#),
            None,
        )
        .unwrap();
        assert!(m.moe.is_none());
    }

    #[test]
    fn qwen2_moe_shared_expert_has_its_own_size() {
        let j = qwen3_moe_json(r#", "shared_expert_intermediate_size": 96"#)
            .replace("qwen3_moe", "qwen2_moe");
        let moe = model_from_hf_config(&j, None).unwrap().moe.unwrap();
        assert_eq!(
            (moe.shared_experts, moe.shared_expert_ffn_hidden),
            (1, Some(96))
        );
        // Qwen3-MoE has no shared expert; the key is ignored there.
        let moe = model_from_hf_config(
            &qwen3_moe_json(r#", "shared_expert_intermediate_size": 96"#),
            None,
        )
        .unwrap()
        .moe
        .unwrap();
        assert_eq!(moe.shared_experts, 0);
    }

    #[test]
    fn deepseek_moe_layer_freq_other_than_one_is_a_layer_pattern() {
        let j = r#"{"model_type": "deepseek_v3", "num_hidden_layers": 6, "hidden_size": 64,
            "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 1000,
            "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "first_k_dense_replace": 1, "moe_layer_freq": 2,
            "q_lora_rank": null, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16, "v_head_dim": 16}"#;
        // Layers ≥ 1 with i % 2 == 0 are MoE (DeepSeek's `moe_layer_freq`), the rest dense.
        let m = model_from_hf_config(j, None).unwrap();
        assert_eq!(m.layer_pattern.as_deref(), Some("aaAaAa"));
        assert!(matches!(
            m.layer_kinds().specs()[0].mixer,
            crate::layer::Mixer::Latent(_)
        ));
        let m = model_from_hf_config(
            &j.replace(r#""moe_layer_freq": 2"#, r#""moe_layer_freq": 1"#),
            None,
        )
        .unwrap();
        assert_eq!(m.moe.as_ref().unwrap().first_dense_layers, 1);
        assert_eq!(m.mla.as_ref().unwrap().q_lora_rank, None);
        assert_eq!(
            (m.head_dim, m.qk_head_dim(), m.v_head_dim()),
            (None, 24, 16)
        );
    }

    #[test]
    fn gpt_oss_top_k_keys_must_agree() {
        let j = r#"{"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 64, "vocab_size": 1000,
            "num_local_experts": 8, "experts_per_token": 4, "num_experts_per_tok": 2}"#;
        let e = model_from_hf_config(j, None).unwrap_err();
        assert_eq!(field_of(&e), "experts_per_token");
        let only_old = j.replace(r#", "num_experts_per_tok": 2"#, "");
        assert_eq!(
            model_from_hf_config(&only_old, None)
                .unwrap()
                .moe
                .unwrap()
                .top_k,
            4
        );
        let neither = only_old.replace(r#", "experts_per_token": 4"#, "");
        assert_eq!(
            field_of(&model_from_hf_config(&neither, None).unwrap_err()),
            "num_experts_per_tok"
        );
    }

    #[test]
    fn top_k_above_experts_names_num_experts_per_tok() {
        let j = qwen3_moe_json("")
            .replace(r#""num_experts_per_tok": 2"#, r#""num_experts_per_tok": 9"#);
        assert_eq!(
            field_of(&model_from_hf_config(&j, None).unwrap_err()),
            "num_experts_per_tok"
        );
    }

    #[test]
    fn document_errors() {
        assert_eq!(
            field_of(&model_from_hf_config("[1, 2]", None).unwrap_err()),
            DOCUMENT
        );
        assert_eq!(
            field_of(&model_from_hf_config("{", None).unwrap_err()),
            DOCUMENT
        );
        let e = model_from_hf_config(r#"{"model_type": 3}"#, None).unwrap_err();
        assert_eq!(field_of(&e), "model_type");
        let e = model_from_hf_config(r#"{"hidden_size": 3}"#, None).unwrap_err();
        assert!(
            e.to_string().contains("missing") && e.to_string().contains("qwen3_moe"),
            "{e}"
        );
    }

    #[test]
    fn describe_truncates_long_values() {
        let long = Value::String("x".repeat(100));
        assert!(describe(&long).len() < 50);
        assert_eq!(describe(&Value::Bool(true)), "true");
    }
}

//! One description of a transformer layer and everything it does under a shard (docs/costmodel.md §1.1,
//! §2.3–2.4, §3.4–3.8, §5.2–5.3): its GEMMs, its core attention, its element-wise traffic, its
//! parameters, its saved activations and its communication.
//!
//! A model is a sequence of runs `(LayerSpec, count)` ([`Model::layer_stack`]); its distinct
//! specs form a small kind table ([`LayerKinds`], kind 0 always the model's dense-MLP layer) and
//! a pipeline stage holds counts per kind ([`LayerCounts`]). Flops (`model`, `flops`), memory,
//! time and explain all read a layer through [`layer_ops`] (or the part of it they need:
//! [`params_per_rank`], [`activation_bytes_per_token`], [`selective_op_bytes_per_token`]); a new
//! layer kind (a new [`Mixer`] or [`Mlp`]) is a new match arm here and nowhere else.
//!
//! Every expression keeps the operand order of the formulas it replaced, so the numbers are bit
//! for bit those of before (`tests/snapshot.rs`).

use crate::model::{LinearAttention, Mamba, Mla, Model, Moe};
use crate::plan::{RecomputeModule, RecomputeModules};
use crate::traffic::WIRE_BYTES;

/// Bytes per element of stored 16-bit activations.
pub(crate) const ACT_BYTES: f64 = 2.0;
/// Bytes per fp32 element (router logits, the loss's logits).
pub(crate) const FP32_BYTES: f64 = 4.0;
/// Bytes per element of a stored dropout mask (PyTorch keeps a bool/uint8 mask).
pub(crate) const MASK_BYTES: f64 = 1.0;

/// The token mixer of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mixer {
    /// Multi-head or grouped-query attention with `kv_heads` key/value heads.
    Attention { kv_heads: u32 },
    /// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).
    Latent(Mla),
    /// Grouped-query attention over the last `window` tokens (gpt-oss, Gemma, Mistral).
    SlidingWindow { kv_heads: u32, window: u32 },
    /// Mamba-2 (SSD) state-space mixer (Nemotron-H, Megatron-Core's `MambaMixer`).
    Mamba(Mamba),
    /// Gated DeltaNet linear attention (Qwen3-Next).
    DeltaNet(LinearAttention),
    /// No mixer: a layer that is an FFN alone (Nemotron-H's `-` and `E`).
    None,
}

impl Mixer {
    /// Whether the layer has a token mixer.
    pub fn present(&self) -> bool {
        !matches!(self, Mixer::None)
    }

    /// A short name for tables (explain's stage split).
    pub fn name(&self) -> &'static str {
        match self {
            Mixer::Attention { .. } => "attention",
            Mixer::Latent(_) => "MLA",
            Mixer::SlidingWindow { .. } => "sliding-window attention",
            Mixer::Mamba(_) => "Mamba-2",
            Mixer::DeltaNet(_) => "gated DeltaNet",
            Mixer::None => "no mixer",
        }
    }
}

/// The feed-forward block of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mlp {
    /// A dense FFN of intermediate size `ffn_hidden`.
    Dense { ffn_hidden: u32 },
    /// Routed experts (with shared experts and a router).
    Moe(Moe),
    /// No FFN: a layer that is a mixer alone (Nemotron-H's `M` and `*`).
    None,
}

impl Mlp {
    /// Whether the layer has an FFN.
    pub fn present(&self) -> bool {
        !matches!(self, Mlp::None)
    }

    /// A short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            Mlp::Dense { .. } => "dense FFN",
            Mlp::Moe(_) => "MoE FFN",
            Mlp::None => "no FFN",
        }
    }
}

/// One layer's structure; the model-wide dimensions (hidden, heads, head dims, activation, norm)
/// come from the [`Model`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerSpec {
    pub mixer: Mixer,
    pub mlp: Mlp,
}

impl LayerSpec {
    /// The routed-expert block, if the layer has one.
    pub fn moe(&self) -> Option<&Moe> {
        match &self.mlp {
            Mlp::Moe(m) => Some(m),
            Mlp::Dense { .. } | Mlp::None => None,
        }
    }

    /// Blocks of the layer (mixer, FFN), each with its pre-norm and residual add: 2 for a
    /// transformer layer, 1 for a Nemotron-H layer.
    pub fn blocks(&self) -> u64 {
        self.mixer.present() as u64 + self.mlp.present() as u64
    }

    /// `"Mamba-2"`, `"attention + MoE FFN"`, …: the layer's blocks in words.
    pub fn describe(&self) -> String {
        match (self.mixer.present(), self.mlp.present()) {
            (true, true) => format!("{} + {}", self.mixer.name(), self.mlp.name()),
            (true, false) => self.mixer.name().to_string(),
            _ => self.mlp.name().to_string(),
        }
    }

    /// Parameters of one such layer (attention, norms, FFN with every routed expert), in u128:
    /// the routed experts of a layer at the field limits pass u64.
    pub fn params(&self, model: &Model) -> u128 {
        let h = model.hidden as u128;
        let mlp = match &self.mlp {
            Mlp::Dense { ffn_hidden } => {
                model.activation.ffn_matrices() as u128 * h * *ffn_hidden as u128
            }
            Mlp::Moe(m) => {
                m.num_experts as u128 * expert_params(model, m) as u128
                    + moe_dense_part_params(model, m) as u128
            }
            Mlp::None => 0,
        };
        mixer_params(model, &self.mixer) as u128
            + model.block_norm_params(self.blocks()) as u128
            + mlp
    }

    /// Matmul parameters of one such layer touched per token (top-k routed experts, shared
    /// experts; not the router), docs/costmodel.md §1.2.
    pub fn active_matmul_params(&self, model: &Model) -> u64 {
        let h = model.hidden as u64;
        let mlp = match &self.mlp {
            Mlp::Dense { ffn_hidden } => model.activation.ffn_matrices() * h * *ffn_hidden as u64,
            Mlp::Moe(m) => {
                m.top_k as u64 * expert_params(model, m)
                    + model.activation.ffn_matrices() * h * m.shared_ffn_hidden()
                    + latent_projection_params(model, m)
            }
            Mlp::None => 0,
        };
        mixer_matmul_params(model, &self.mixer) + mlp
    }
}

/// Width of a Mamba-2 layer's input projection: `z`, `x` (`d_inner` each), `B`, `C`
/// (`G·N` each) and `dt` (`H`), Megatron-Core's `in_proj`.
pub fn mamba_in_proj_width(m: &Mamba) -> u64 {
    2 * m.inner() + 2 * m.groups as u64 * m.state as u64 + m.heads as u64
}

/// Width of a gated DeltaNet layer's input projections: q, k (`H_k·d_k` each), v, the output
/// gate z (`H_v·d_v` each) and β, the decay gate (`H_v` each): Qwen3-Next's `in_proj_qkvz` and
/// `in_proj_ba` together.
pub fn deltanet_in_proj_width(la: &LinearAttention) -> u64 {
    2 * la.key_dim() + 2 * la.value_dim() + 2 * la.value_heads as u64
}

/// Matmul parameters of a mixer (what `6·N` counts): attention's projections (as
/// [`Model::attention_params`]), a Mamba-2 or DeltaNet layer's input and output projections.
pub fn mixer_matmul_params(model: &Model, mixer: &Mixer) -> u64 {
    let h = model.hidden as u64;
    match mixer {
        Mixer::Attention { .. } | Mixer::Latent(_) => model.attention_params(),
        Mixer::SlidingWindow { kv_heads, .. } => {
            let (a, d, g) = (model.heads as u64, model.qk_head_dim(), *kv_heads as u64);
            h * a * d + 2 * h * g * d + a * d * h + model.output_gate_params()
        }
        Mixer::Mamba(m) => h * mamba_in_proj_width(m) + m.inner() * h,
        Mixer::DeltaNet(la) => h * deltanet_in_proj_width(la) + la.value_dim() * h,
        Mixer::None => 0,
    }
}

/// Every parameter of a mixer: its matmuls plus, for Mamba-2, the depthwise convolution
/// (weights and bias), `dt_bias`, `A_log`, `D` per head and the gated norm over `d_inner`
/// (Megatron-Core `MambaMixer`); for gated DeltaNet the convolution (no bias), `dt_bias` and
/// `A_log` per value head and the gated norm over `d_v` (HF `Qwen3NextGatedDeltaNet`).
pub fn mixer_params(model: &Model, mixer: &Mixer) -> u64 {
    let matmul = mixer_matmul_params(model, mixer);
    match mixer {
        Mixer::Mamba(m) => {
            matmul + (m.conv_kernel as u64 + 1) * m.conv_channels() + 3 * m.heads as u64 + m.inner()
        }
        Mixer::DeltaNet(la) => {
            let conv = la.conv_kernel as u64 * (2 * la.key_dim() + la.value_dim());
            matmul + conv + 2 * la.value_heads as u64 + la.value_head_dim as u64
        }
        _ => matmul,
    }
}

/// Parameters of one routed expert of `moe`.
pub fn expert_params(model: &Model, moe: &Moe) -> u64 {
    model.activation.ffn_matrices()
        * moe.expert_width(model.hidden) as u64
        * moe.expert_ffn_hidden as u64
}

/// Parameters of a latent MoE's two projections, `h → ℓ` before the dispatch and `ℓ → h` after
/// the combine (0 without a latent).
pub fn latent_projection_params(model: &Model, moe: &Moe) -> u64 {
    moe.latent_size
        .map_or(0, |l| 2 * model.hidden as u64 * l as u64)
}

/// Parameters of the non-routed part of one MoE FFN (shared experts, router and a latent MoE's
/// projections).
pub fn moe_dense_part_params(model: &Model, moe: &Moe) -> u64 {
    model.activation.ffn_matrices() * model.hidden as u64 * moe.shared_ffn_hidden()
        + model.hidden as u64 * moe.num_experts as u64
        + latent_projection_params(model, moe)
}

/// Most distinct layer kinds a model has: one per character of
/// [`crate::model::LAYER_PATTERN_CHARS`]. A kind table and a stage's counts are fixed-size
/// arrays of this length, so stages stay `Copy`.
pub const MAX_LAYER_KINDS: usize = 10;

/// Index of a layer kind in its model's [`LayerKinds`].
pub type LayerKind = usize;

/// The distinct layer specs of a model. Without a layer pattern kind 0 is always the model's
/// dense-MLP layer, also when no layer has one (an MoE model without leading dense layers): the
/// memory model's rebuilt layer under full recompute and an empty stage's ZeRO-3 unit are
/// counted from it. With a pattern the kinds are the pattern's characters in order of first
/// appearance (kind 0 the first layer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKinds {
    specs: [LayerSpec; MAX_LAYER_KINDS],
    len: usize,
}

impl LayerKinds {
    /// The specs, kind 0 first.
    pub fn specs(&self) -> &[LayerSpec] {
        &self.specs[..self.len]
    }

    /// Number of kinds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (kind 0 exists); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Model {
    /// The model's token mixer.
    pub fn mixer(&self) -> Mixer {
        match &self.mla {
            Some(m) => Mixer::Latent(*m),
            None => Mixer::Attention {
                kv_heads: self.kv_heads,
            },
        }
    }

    /// The layer one character of [`Model::layer_pattern`] stands for (`None` for a character
    /// outside [`crate::model::LAYER_PATTERN_CHARS`] or whose part is missing; a validated
    /// model has neither).
    pub fn pattern_spec(&self, c: char) -> Option<LayerSpec> {
        let dense = Mlp::Dense {
            ffn_hidden: self.ffn_hidden,
        };
        let moe = || self.moe.map(Mlp::Moe);
        let sliding = || {
            self.sliding_window.map(|window| Mixer::SlidingWindow {
                kv_heads: self.kv_heads,
                window,
            })
        };
        let deltanet = || self.linear_attention.map(Mixer::DeltaNet);
        let (mixer, mlp) = match c {
            'M' => (self.mamba.map(Mixer::Mamba)?, Mlp::None),
            '*' => (self.mixer(), Mlp::None),
            '-' => (Mixer::None, dense),
            'E' => (Mixer::None, moe()?),
            'A' => (self.mixer(), moe()?),
            'a' => (self.mixer(), dense),
            'S' => (sliding()?, moe()?),
            's' => (sliding()?, dense),
            'G' => (deltanet()?, moe()?),
            'g' => (deltanet()?, dense),
            _ => return None,
        };
        Some(LayerSpec { mixer, mlp })
    }

    /// The pattern's kinds in order of first appearance and each layer's kind, or `None`
    /// without a pattern. Characters that name no layer (an unvalidated model) are skipped.
    fn pattern_kinds(&self) -> Option<(LayerKinds, Vec<(LayerKind, u32)>)> {
        let pattern = self.layer_pattern.as_deref()?;
        let first = pattern.chars().find_map(|c| self.pattern_spec(c))?;
        let mut chars = ['\0'; MAX_LAYER_KINDS];
        let mut kinds = LayerKinds {
            specs: [first; MAX_LAYER_KINDS],
            len: 0,
        };
        let mut runs: Vec<(LayerKind, u32)> = Vec::new();
        for c in pattern.chars() {
            let Some(spec) = self.pattern_spec(c) else {
                continue;
            };
            let kind = match chars[..kinds.len].iter().position(|&k| k == c) {
                Some(k) => k,
                None => {
                    chars[kinds.len] = c;
                    kinds.specs[kinds.len] = spec;
                    kinds.len += 1;
                    kinds.len - 1
                }
            };
            match runs.last_mut() {
                Some((k, n)) if *k == kind => *n += 1,
                _ => runs.push((kind, 1)),
            }
        }
        Some((kinds, runs))
    }

    /// The model's layer kinds: the dense-MLP layer, then the MoE layer of an MoE model; with a
    /// layer pattern, its characters' layers in order of first appearance.
    pub fn layer_kinds(&self) -> LayerKinds {
        if let Some((kinds, _)) = self.pattern_kinds() {
            return kinds;
        }
        let mixer = self.mixer();
        let dense = LayerSpec {
            mixer,
            mlp: Mlp::Dense {
                ffn_hidden: self.ffn_hidden,
            },
        };
        let mut specs = [dense; MAX_LAYER_KINDS];
        let mut len = 1;
        if let Some(m) = &self.moe {
            specs[1] = LayerSpec {
                mixer,
                mlp: Mlp::Moe(*m),
            };
            len = 2;
        }
        LayerKinds { specs, len }
    }

    /// The model as runs of layers in order, `(kind, count)`, counts ≥ 1: the leading dense
    /// layers (`first_dense_layers` of an MoE model, all of a dense one), then the MoE layers;
    /// with a layer pattern, its runs of equal characters.
    pub fn layer_stack(&self) -> Vec<(LayerKind, u32)> {
        if let Some((_, runs)) = self.pattern_kinds() {
            return runs;
        }
        let moe_layers = self
            .moe
            .as_ref()
            .map_or(0, |m| self.layers - m.first_dense_layers);
        [(0, self.layers - moe_layers), (1, moe_layers)]
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .collect()
    }
}

/// Layers per kind on one pipeline rank (all of its virtual chunks together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LayerCounts(pub [u32; MAX_LAYER_KINDS]);

impl LayerCounts {
    /// Counts of the first kinds, in kind order (the rest 0; at most [`MAX_LAYER_KINDS`]).
    pub fn from_counts(counts: &[u32]) -> Self {
        let mut out = [0u32; MAX_LAYER_KINDS];
        for (o, &n) in out.iter_mut().zip(counts) {
            *o = n;
        }
        LayerCounts(out)
    }

    /// Layers of every kind.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }

    /// Layers of `kind`.
    pub fn of(&self, kind: LayerKind) -> u32 {
        self.0[kind]
    }

    /// `(kind, count)` for every kind of the table, in kind order (counts may be 0).
    pub fn iter(&self) -> impl Iterator<Item = (LayerKind, u32)> + '_ {
        self.0.iter().copied().enumerate()
    }

    /// The last kind this rank holds a layer of (kind 0 when it holds none).
    pub fn last_present(&self) -> LayerKind {
        (0..MAX_LAYER_KINDS)
            .rev()
            .find(|&k| self.0[k] > 0)
            .unwrap_or(0)
    }

    /// `Σ count·value[kind]` in kind order (the sums of memory and time over a stage).
    pub fn weighted_sum(&self, values: &[f64]) -> f64 {
        self.iter()
            .zip(values)
            .map(|((_, n), v)| n as f64 * v)
            .fold(None, |acc: Option<f64>, x| Some(acc.map_or(x, |a| a + x)))
            .unwrap_or(0.0)
    }
}

/// How a layer is split: tensor parallel (with or without sequence parallelism), expert
/// parallel and, in a folded plan, expert tensor parallel degrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub tp: u32,
    pub ep: u32,
    /// A folded plan's expert TP ([`crate::plan::Plan::etp`]); `None`: the experts split `tp`
    /// ways and their TP collectives ride the TP group.
    pub etp: Option<u32>,
    pub sequence_parallel: bool,
}

impl Shard {
    /// The shard of `plan`'s layers.
    pub fn of(plan: &crate::plan::Plan) -> Self {
        Shard {
            tp: plan.tp,
            ep: plan.ep,
            etp: plan.etp,
            sequence_parallel: plan.sequence_parallel,
        }
    }

    /// The divisor of sequence-sharded tensors: `tp` under sequence parallelism, else 1.
    pub fn sp_div(&self) -> f64 {
        if self.sequence_parallel {
            self.tp as f64
        } else {
            1.0
        }
    }

    /// Ways each routed expert's weights split: `etp`, else `tp`.
    pub fn expert_tp(&self) -> u32 {
        self.etp.unwrap_or(self.tp)
    }

    /// Routed copies one rank computes over those of an unfolded plan, `etp/tp`: a TP rank
    /// dispatches its `1/tp` of the tokens and its expert-TP group gathers `etp` such shares
    /// (1 unfolded, where the TP group gathers them all).
    pub fn routed_share(&self) -> f64 {
        self.expert_tp() as f64 / self.tp as f64
    }
}

/// Per-GPU parameters of one layer: the part sharded over the dense data-parallel group and the
/// routed experts (sharded over the expert data-parallel group), docs/costmodel.md §2.3.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LayerParams {
    pub dense: f64,
    pub expert: f64,
}

/// LoRA adapters on a layer's linears (docs/costmodel.md §2.7): rank `r` and which linears
/// carry one. An adapter on a frozen linear `k → n` adds `A (k×r)` and `B (r×n)` beside it,
/// `y = x·W + (x·A)·B` (Hu et al. 2021, arXiv:2106.09685 §4.1; torchtune `LoRALinear`, PEFT
/// `lora.Linear`, Megatron-Bridge `ParallelLinearAdapter`): `r·(k + n)` trained parameters, split
/// over TP with the base linear (Megatron-Bridge shards `A` on `r` for a column-parallel base and
/// on `k` for a row-parallel one, `B` on `n`), `2·r·(k + n)` forward FLOPs per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adapters {
    pub rank: f64,
    /// Separate adapters on the query, key and value projections (HF PEFT, torchtune).
    pub q: bool,
    pub k: bool,
    pub v: bool,
    /// One adapter on the fused QKV projection (Megatron's `linear_qkv`).
    pub qkv: bool,
    pub o: bool,
    /// Separate adapters on the FFN's gate, up and down projections.
    pub mlp: bool,
    /// One adapter on the fused gate/up projection (Megatron's `linear_fc1`) ...
    pub fc1: bool,
    /// ... and one on the down projection (`linear_fc2`).
    pub fc2: bool,
}

impl Adapters {
    /// Whether the mixer's input projection(s) carry an adapter.
    pub fn mixer_input(&self) -> bool {
        self.q || self.k || self.v || self.qkv
    }

    /// Whether the FFN's input projection(s) carry an adapter.
    pub fn ffn_input(&self) -> bool {
        self.mlp || self.fc1
    }

    /// Whether the FFN's down projection carries an adapter.
    pub fn ffn_output(&self) -> bool {
        self.mlp || self.fc2
    }
}

/// One adapted linear of a layer: the base's full (unsharded) shape `k → n`, and whether it is a
/// routed expert's (one per expert, run on the routed copies, split over expert TP).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptedLinear {
    pub k: f64,
    pub n: f64,
    pub routed: bool,
}

/// Most adapted linears one layer has (MLA with a query LoRA: 6 in the mixer; an MoE FFN with
/// shared experts: 6).
pub const MAX_ADAPTED: usize = 12;

/// The adapted linears of a `spec` layer under `ad`, in the order they run. Targets map to a
/// mixer's projections as: q, k, v → separate adapters on the query, key and value projections,
/// qkv → one on the fused projection (MLA: q to the query down/up projections, k or v to the
/// KV down/up projections, qkv to both; Mamba-2 and gated DeltaNet: any of them to the input
/// projections), o → the output projection; mlp → separate gate, up and down, fc1 → one on the
/// fused gate/up, fc2 → one on the down projection, of the dense FFN, the shared experts and
/// every routed expert (Megatron-Bridge adapts expert linears; the router and a latent MoE's
/// projections stay without).
pub fn adapted_linears(
    model: &Model,
    spec: &LayerSpec,
    ad: &Adapters,
) -> ([AdaptedLinear; MAX_ADAPTED], usize) {
    let mut out = [AdaptedLinear {
        k: 0.0,
        n: 0.0,
        routed: false,
    }; MAX_ADAPTED];
    let mut len = 0;
    let mut push = |k: f64, n: f64, routed: bool| {
        out[len] = AdaptedLinear { k, n, routed };
        len += 1;
    };
    let h = model.hidden as f64;
    let a = model.heads as f64;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    match &spec.mixer {
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            let g = *kv_heads as f64;
            if ad.qkv {
                push(h, (a + 2.0 * g) * dqk, false);
            }
            if ad.q {
                push(h, a * dqk, false);
            }
            if ad.k {
                push(h, g * dqk, false);
            }
            if ad.v {
                push(h, g * dqk, false);
            }
            if ad.o {
                push(a * dqk, h, false);
            }
        }
        Mixer::Latent(m) => {
            if ad.q || ad.qkv {
                match m.q_lora_rank {
                    Some(r) => {
                        push(h, r as f64, false);
                        push(r as f64, a * dqk, false);
                    }
                    None => push(h, a * dqk, false),
                }
            }
            if ad.k || ad.v || ad.qkv {
                push(h, (m.kv_lora_rank + m.qk_rope_head_dim) as f64, false);
                push(
                    m.kv_lora_rank as f64,
                    a * (m.qk_nope_head_dim as f64 + dv),
                    false,
                );
            }
            if ad.o {
                push(a * dv, h, false);
            }
        }
        Mixer::Mamba(m) => {
            if ad.mixer_input() {
                push(h, mamba_in_proj_width(m) as f64, false);
            }
            if ad.o {
                push(m.inner() as f64, h, false);
            }
        }
        Mixer::DeltaNet(la) => {
            if ad.mixer_input() {
                push(h, (2 * la.key_dim() + 2 * la.value_dim()) as f64, false);
                push(h, 2.0 * la.value_heads as f64, false);
            }
            if ad.o {
                push(la.value_dim() as f64, h, false);
            }
        }
        Mixer::None => {}
    }
    if ad.ffn_input() || ad.ffn_output() {
        let ins = gate_up_matrices(model);
        let mut ffn = |width: f64, f: f64, routed: bool| {
            if ad.mlp {
                for _ in 0..ins as usize {
                    push(width, f, routed);
                }
            } else if ad.fc1 {
                push(width, ins * f, routed);
            }
            if ad.ffn_output() {
                push(f, width, routed);
            }
        };
        match &spec.mlp {
            Mlp::Dense { ffn_hidden } => ffn(h, *ffn_hidden as f64, false),
            Mlp::Moe(m) => {
                ffn(
                    m.expert_width(model.hidden) as f64,
                    m.expert_ffn_hidden as f64,
                    true,
                );
                if m.shared_ffn_hidden() > 0 {
                    ffn(h, m.shared_ffn_hidden() as f64, false);
                }
            }
            Mlp::None => {}
        }
    }
    (out, len)
}

/// Adapter parameters of one `spec` layer held by one GPU under `shard`: the part beside the
/// dense weights (split over TP) and the routed experts' (the rank's experts, split over expert
/// TP), sharded over the same data-parallel groups as their base weights.
pub fn adapter_params_per_rank(
    model: &Model,
    spec: &LayerSpec,
    shard: &Shard,
    ad: &Adapters,
) -> LayerParams {
    let (linears, len) = adapted_linears(model, spec, ad);
    let mut out = LayerParams::default();
    for l in &linears[..len] {
        let p = ad.rank * (l.k + l.n);
        if l.routed {
            let experts = spec
                .moe()
                .map_or(0.0, |m| m.num_experts as f64 / shard.ep as f64);
            out.expert += experts * p / shard.expert_tp() as f64;
        } else {
            out.dense += p / shard.tp as f64;
        }
    }
    out
}

/// Adapter parameters of one `spec` layer a token passes through (its top-k routed experts'):
/// the `N_adapter` of the `6·N_adapter` training FLOPs per token (§2.7).
pub fn adapter_active_params(model: &Model, spec: &LayerSpec, ad: &Adapters) -> f64 {
    let (linears, len) = adapted_linears(model, spec, ad);
    let top_k = spec.moe().map_or(0.0, |m| m.top_k as f64);
    linears[..len]
        .iter()
        .map(|l| ad.rank * (l.k + l.n) * if l.routed { top_k } else { 1.0 })
        .sum()
}

/// Parameters of one layer's attention held by one TP rank: Q and O split over `t`; K and V
/// split over `t` but replicated when `t > kv_heads` (§2.4.3 GQA note); MLA's down-projections
/// are replicated (they are not tensor-parallel in Megatron's MLA).
pub fn attention_params_per_rank(model: &Model, mixer: &Mixer, tp: u32) -> f64 {
    let t = tp as f64;
    let h = model.hidden as f64;
    let a = model.heads as f64;
    match mixer {
        Mixer::Latent(m) => {
            let (qk, v) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
            let (q_down, q_up) = match m.q_lora_rank {
                Some(r) => (h * r as f64, r as f64 * a * qk),
                None => (0.0, h * a * qk),
            };
            let kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) as f64;
            let kv_up = m.kv_lora_rank as f64 * a * (m.qk_nope_head_dim as f64 + v);
            q_down + kv_down + (q_up + kv_up + a * v * h) / t
        }
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            let d = model.qk_head_dim() as f64;
            let g_local = (*kv_heads as f64 / t).max(1.0);
            // Q, O (and an output gate, split like Q) over `t`.
            (2.0 + model.output_gates()) * h * a * d / t + 2.0 * h * g_local * d
        }
        // Megatron-Core's MambaMixer splits in_proj by columns (z, x, B, C, dt each over `t`:
        // heads and groups), the convolution, dt/A/D and the gated norm with them, and
        // out_proj by rows; gated DeltaNet splits its heads the same way.
        Mixer::Mamba(_) | Mixer::DeltaNet(_) => mixer_params(model, mixer) as f64 / t,
        Mixer::None => 0.0,
    }
}

/// Per-GPU parameters of one layer of `spec` under `shard` (§2.3).
pub fn params_per_rank(model: &Model, spec: &LayerSpec, shard: &Shard) -> LayerParams {
    let t = shard.tp as f64;
    let attn = attention_params_per_rank(model, &spec.mixer, shard.tp)
        + model.block_norm_params(spec.blocks()) as f64 / t;
    match &spec.mlp {
        Mlp::Dense { ffn_hidden } => LayerParams {
            dense: attn
                + (model.activation.ffn_matrices() * model.hidden as u64 * *ffn_hidden as u64)
                    as f64
                    / t,
            expert: 0.0,
        },
        Mlp::Moe(m) => {
            let experts_per_rank = m.num_experts as f64 / shard.ep as f64;
            LayerParams {
                // A latent MoE's projections are duplicated on every TP rank (Megatron-Core
                // `MoELayer`: `TELinear(parallel_mode="duplicated")`); the rest splits over TP.
                dense: attn
                    + (moe_dense_part_params(model, m) - latent_projection_params(model, m)) as f64
                        / t
                    + latent_projection_params(model, m) as f64,
                expert: experts_per_rank * expert_params(model, m) as f64
                    / shard.expert_tp() as f64,
            }
        }
        Mlp::None => LayerParams {
            dense: attn,
            expert: 0.0,
        },
    }
}

/// Saved bytes per element of each of the FFN's width: the gate/up (SwiGLU) or pre-activation
/// (GeLU) outputs in 16 bits and the activation output, the down projection's input (`li`
/// bytes).
fn per_ffn_width_bytes(model: &Model, li: f64) -> f64 {
    if model.activation.gated() {
        2.0 * ACT_BYTES + li
    } else {
        ACT_BYTES + li
    }
}

/// Stored activation bytes per token of one layer with no recompute (§2.4.3), per GPU.
/// `imbalance`: the busiest expert rank's routed load over the mean. `linear_input_bytes`:
/// bytes per element of the tensors kept only as inputs of linear layers — 2 in 16-bit training;
/// FP8/FP4 linears keep their quantised input for the weight gradient (Transformer Engine), 1.
///
/// `adapters`: LoRA (§2.7). A frozen linear needs only its weight for the input gradient, so
/// its input is stored only where something else needs it: an adapter on it (whose `A` needs
/// `x` for its weight gradient), or another op's backward (flash attention keeps its output, the
/// output projection's input). Each adapter also keeps its rank-`r` intermediate `x·A` (16-bit)
/// for `B`'s weight gradient.
pub fn activation_bytes_per_token(
    model: &Model,
    spec: &LayerSpec,
    shard: &Shard,
    imbalance: f64,
    linear_input_bytes: f64,
    adapters: Option<&Adapters>,
) -> f64 {
    let t = shard.tp as f64;
    let sp_div = shard.sp_div();
    let h = model.hidden as f64;
    let a_local = model.heads as f64 / t;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    let li = linear_input_bytes;
    // 1 where a linear's input is kept for the backward, 0 where LoRA freezes the linear and no
    // adapter reads its input: the mixer's input and output projections, the FFN's linears.
    let keep = |adapted: fn(&Adapters) -> bool| adapters.map_or(1.0, |ad| adapted(ad) as u8 as f64);
    let (keep_in, keep_out, keep_ffn, keep_down) = (
        keep(Adapters::mixer_input),
        keep(|ad| ad.o),
        keep(Adapters::ffn_input),
        keep(Adapters::ffn_output),
    );
    // Two norm inputs (16-bit) and the inputs of the QKV and FFN-in projections, and with
    // dropout the masks of the two residual-branch dropouts (1 byte each, KOR22 §4.1).
    // A one-block layer (Nemotron-H) keeps one norm input and one projection input.
    let blocks = spec.blocks() as f64;
    let masks = if model.dropout {
        blocks * MASK_BYTES
    } else {
        0.0
    };
    let inputs = match adapters {
        None => blocks,
        Some(_) => {
            spec.mixer.present() as u8 as f64 * keep_in + spec.mlp.present() as u8 as f64 * keep_ffn
        }
    };
    let replicated = (blocks * ACT_BYTES + inputs * li + masks) * h / sp_div;
    let attention = match &spec.mixer {
        Mixer::Latent(m) => {
            // Latents (replicated) + per-head Q, K, V (16-bit, attention inputs) and the
            // output (input of the output projection).
            let latents =
                li * (m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank + m.qk_rope_head_dim) as f64;
            latents + a_local * (ACT_BYTES * (2.0 * dqk + dv) + li * dv)
        }
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            let g_local = (*kv_heads as f64 / t).max(1.0);
            // An output gate keeps its pre-sigmoid values and the ungated output (16-bit).
            ACT_BYTES * (a_local * dqk + 2.0 * g_local * dqk)
                + li * a_local * dqk
                + ACT_BYTES * 2.0 * model.output_gates() * a_local * dqk
        }
        // Megatron-Core MambaMixer: the in_proj output (z, x, B, C, dt; the gate and the
        // convolution's input), the convolution output (the scan's input), the scan output (the
        // gated norm's input) and the norm output (out_proj's input); dt and its cumulative
        // decay in fp32 per head. The chunk states are rebuilt in the backward by mamba_ssm's
        // combined kernel, not stored; the convolution state is its input, counted above.
        Mixer::Mamba(m) => {
            let inner = m.inner() as f64 / t;
            ACT_BYTES * (mamba_in_proj_width(m) as f64 / t + m.conv_channels() as f64 / t + inner)
                + li * inner * keep_out
                + FP32_BYTES * 2.0 * m.heads as f64 / t
        }
        // Gated DeltaNet, likewise: projections, convolution output (q, k, v), core output,
        // norm output, fp32 decay and β per value head.
        Mixer::DeltaNet(la) => {
            let value = la.value_dim() as f64 / t;
            let conv = (2 * la.key_dim() + la.value_dim()) as f64 / t;
            ACT_BYTES * (deltanet_in_proj_width(la) as f64 / t + conv + value)
                + li * value * keep_out
                + FP32_BYTES * 2.0 * la.value_heads as f64 / t
        }
        Mixer::None => 0.0,
    };
    // The FFN's linear inputs: kept at `li` bytes when trained or adapted (the input
    // projections' input `li_ffn`, the down projection's `li_down`).
    let li_ffn = li * keep_ffn;
    let per_f = per_ffn_width_bytes(model, li * keep_down);
    let ffn = match &spec.mlp {
        Mlp::Moe(m) => {
            let router = FP32_BYTES * m.num_experts as f64 / sp_div;
            // Each routed copy keeps its expert input (at the experts' width) and intermediates
            // on the expert rank; a latent MoE also keeps the combined latent, the up
            // projection's input.
            let et = shard.expert_tp() as f64;
            let w = m.expert_width(model.hidden) as f64;
            let routed = m.top_k as f64
                * imbalance
                * shard.routed_share()
                * (li_ffn * w + per_f * m.expert_ffn_hidden as f64 / et);
            let shared = per_f * m.shared_ffn_hidden() as f64 / t;
            // The latent up projection carries no adapter: its input is kept only when trained.
            // Duplicated on the TP ranks, each over its own (sequence-parallel) tokens.
            let li_latent = if adapters.is_some() { 0.0 } else { li };
            let latent = m.latent_size.map_or(0.0, |l| li_latent * l as f64 / sp_div);
            router + routed + shared + latent
        }
        Mlp::Dense { ffn_hidden } => per_f * *ffn_hidden as f64 / t,
        Mlp::None => 0.0,
    };
    match adapters {
        None => replicated + attention + ffn,
        Some(ad) => {
            replicated
                + attention
                + ffn
                + adapter_intermediate_bytes(model, spec, shard, imbalance, ad)
        }
    }
}

/// Norms of a `spec` layer that are modules of their own in Megatron-Core's Transformer Engine
/// layer specs, so that the `layernorm` recompute module can discard their outputs: MLA's input
/// norm (`input_layernorm=TENorm`) and an MoE block's pre-MLP norm (`pre_mlp_layernorm=TENorm`).
/// Every other norm is fused into the linear after it (`TELayerNormColumnParallelLinear`, the
/// layer's norm an `IdentityOp`), which `layernorm` leaves alone
/// [NVIDIA/Megatron-LM megatron/core/models/gpt/gpt_layer_specs.py,
/// megatron/core/models/hybrid/hybrid_layer_specs.py, megatron/core/transformer/
/// transformer_layer.py `recompute_input_layernorm` / `recompute_pre_mlp_layernorm`].
pub fn separate_norms(spec: &LayerSpec) -> u32 {
    matches!(spec.mixer, Mixer::Latent(_)) as u32 + matches!(spec.mlp, Mlp::Moe(_)) as u32
}

/// Bytes per token one `spec` layer no longer stores when Megatron-Core recomputes `modules`
/// (§2.4.5), and of them the most one block rebuilds at once in the backward (the mixer's or the
/// FFN's: the transient of the replay). Each module's own tensors, the checkpoint inputs kept:
///
/// * `layernorm`: the outputs of the [`separate_norms`], kept only as linear inputs (`li` bytes
///   per element of `h`, sequence-sharded);
/// * `mla_up_proj`: MLA's per-head Q, K, V (16-bit), the up-projections' latents kept;
/// * `mlp` (dense layers): the FFN's input and intermediates, its input (the residual, the
///   fused norm's input) kept;
/// * `moe` (MoE layers): the whole block's stored tensors — router logits, routed copies and
///   their intermediates, shared experts, a latent MoE's combined latent — with its input (the
///   pre-MLP norm's output) kept in 16 bits unless `layernorm` discards it;
/// * `moe_act`: each routed copy's activation output, the fc2 input (`li` bytes per element of
///   `f_e/t_e`), the fc1 output kept;
/// * `shared_experts`: the shared experts' intermediates (their input is the router's too);
/// * `core_attn`: nothing under flash attention (the unfused score tensors are handled with the
///   plan's recompute in `memory`).
///
/// Every expression repeats [`activation_bytes_per_token`]'s terms for the same tensors.
pub fn recompute_discarded_bytes_per_token(
    model: &Model,
    spec: &LayerSpec,
    shard: &Shard,
    imbalance: f64,
    linear_input_bytes: f64,
    adapters: Option<&Adapters>,
    modules: RecomputeModules,
) -> (f64, f64) {
    let t = shard.tp as f64;
    let sp_div = shard.sp_div();
    let h = model.hidden as f64;
    let li = linear_input_bytes;
    let keep = |adapted: fn(&Adapters) -> bool| adapters.map_or(1.0, |ad| adapted(ad) as u8 as f64);
    let (keep_in, keep_ffn, keep_down) = (
        keep(Adapters::mixer_input),
        keep(Adapters::ffn_input),
        keep(Adapters::ffn_output),
    );
    let has = |m: RecomputeModule| modules.contains(m);
    let norm = has(RecomputeModule::Layernorm);
    let mut mixer = 0.0;
    if let Mixer::Latent(_) = spec.mixer {
        if norm {
            mixer += li * keep_in * h / sp_div;
        }
        if has(RecomputeModule::MlaUpProj) {
            let a_local = model.heads as f64 / t;
            let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
            mixer += a_local * ACT_BYTES * (2.0 * dqk + dv);
        }
    }
    let li_ffn = li * keep_ffn;
    let per_f = per_ffn_width_bytes(model, li * keep_down);
    let ffn = match &spec.mlp {
        Mlp::Dense { ffn_hidden } if has(RecomputeModule::Mlp) => {
            li_ffn * h / sp_div + per_f * *ffn_hidden as f64 / t
        }
        Mlp::Moe(m) => {
            let et = shard.expert_tp() as f64;
            let copies = m.top_k as f64 * imbalance * shard.routed_share();
            let shared = per_f * m.shared_ffn_hidden() as f64 / t;
            // The block's input: the pre-MLP norm's output, kept at `li` as the router's and the
            // experts' linear input; the checkpoint's own 16-bit input under `moe`; gone under
            // `layernorm`.
            let input = li_ffn * h / sp_div;
            let kept_input = if norm {
                0.0
            } else if has(RecomputeModule::Moe) {
                ACT_BYTES * h / sp_div
            } else {
                input
            };
            let block = if has(RecomputeModule::Moe) {
                let router = FP32_BYTES * m.num_experts as f64 / sp_div;
                let w = m.expert_width(model.hidden) as f64;
                let routed = copies * (li_ffn * w + per_f * m.expert_ffn_hidden as f64 / et);
                let li_latent = if adapters.is_some() { 0.0 } else { li };
                let latent = m.latent_size.map_or(0.0, |l| li_latent * l as f64 / sp_div);
                router + routed + shared + latent
            } else {
                let act = if has(RecomputeModule::MoeAct) {
                    copies * li * keep_down * m.expert_ffn_hidden as f64 / et
                } else {
                    0.0
                };
                let shared = if has(RecomputeModule::SharedExperts) {
                    shared
                } else {
                    0.0
                };
                act + shared
            };
            input - kept_input + block
        }
        Mlp::Dense { .. } | Mlp::None => 0.0,
    };
    (mixer + ffn, mixer.max(ffn))
}

/// Bytes per token the adapters of a `spec` layer keep for the backward besides their inputs:
/// the rank-`r` intermediate `x·A` of each (16-bit; per routed copy for the experts'), which
/// `B`'s weight gradient reads (§2.7). Megatron-Bridge gathers a column-parallel adapter's
/// intermediate over TP, so it is counted whole on every rank.
pub fn adapter_intermediate_bytes(
    model: &Model,
    spec: &LayerSpec,
    shard: &Shard,
    imbalance: f64,
    ad: &Adapters,
) -> f64 {
    let (linears, len) = adapted_linears(model, spec, ad);
    let copies = spec
        .moe()
        .map_or(0.0, |m| m.top_k as f64 * imbalance * shard.routed_share());
    linears[..len]
        .iter()
        .map(|l| ACT_BYTES * ad.rank * if l.routed { copies } else { 1.0 })
        .sum()
}

/// Stored bytes per token of one layer under op-level selective checkpointing
/// (`Recompute::SelectiveOp`, torchtitan's `_save_list` policy): the layer input, the attention
/// output (flash attention's saved result) and every other matmul output — half of the layer's
/// 16-bit linear outputs on average — plus the fp32 router logits of an MoE layer.
/// Column-parallel outputs are TP-sharded, row-parallel ones sequence-sharded under SP.
pub fn selective_op_bytes_per_token(
    model: &Model,
    spec: &LayerSpec,
    shard: &Shard,
    imbalance: f64,
) -> f64 {
    let t = shard.tp as f64;
    let sp_div = shard.sp_div();
    let h = model.hidden as f64;
    let a_local = model.heads as f64 / t;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    // The mixer's core output (flash attention's saved result; the scan's output).
    let attention_out = match &spec.mixer {
        Mixer::Mamba(m) => m.inner() as f64 / t,
        Mixer::DeltaNet(la) => la.value_dim() as f64 / t,
        Mixer::None => 0.0,
        _ => a_local * dv,
    };
    // Outputs of the attention projections: Q, K, V (MLA: the latents and the per-head
    // up-projections) and the output projection.
    let attention_linears = match &spec.mixer {
        Mixer::Latent(m) => {
            (m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank + m.qk_rope_head_dim) as f64
                + a_local * (2.0 * dqk + dv)
                + h / sp_div
        }
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            a_local * (1.0 + model.output_gates()) * dqk
                + 2.0 * (*kv_heads as f64 / t).max(1.0) * dqk
                + h / sp_div
        }
        Mixer::Mamba(m) => mamba_in_proj_width(m) as f64 / t + h / sp_div,
        Mixer::DeltaNet(la) => deltanet_in_proj_width(la) as f64 / t + h / sp_div,
        Mixer::None => 0.0,
    };
    // Outputs of the FFN projections per unit of width (gate and up for SwiGLU), plus the
    // down projection's output.
    let in_proj = gate_up_matrices(model);
    let (ffn_linears, router) = match &spec.mlp {
        Mlp::Moe(m) => (
            m.top_k as f64
                * imbalance
                * shard.routed_share()
                * (in_proj * m.expert_ffn_hidden as f64 / shard.expert_tp() as f64
                    + m.expert_width(model.hidden) as f64)
                + in_proj * m.shared_ffn_hidden() as f64 / t
                + m.latent_size.map_or(0.0, |l| 2.0 * l as f64 / sp_div)
                + h / sp_div,
            FP32_BYTES * m.num_experts as f64 / sp_div,
        ),
        Mlp::Dense { ffn_hidden } => (in_proj * *ffn_hidden as f64 / t + h / sp_div, 0.0),
        Mlp::None => (0.0, 0.0),
    };
    ACT_BYTES * (h / sp_div + attention_out + 0.5 * (attention_linears + ffn_linears)) + router
}

/// Input projections of one FFN (gate and up for a gated activation, one for a plain one).
fn gate_up_matrices(model: &Model) -> f64 {
    if model.activation.gated() {
        2.0
    } else {
        1.0
    }
}

/// What a linear layer is, where a low-precision recipe treats it differently from the rest
/// (docs/costmodel.md §1.4, `data/precision.toml`): a recipe names the roles it keeps in BF16 or
/// runs in MXFP8 instead of the workload's FP8/FP4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GemmRole {
    /// Every other linear layer (FFN, experts, router, Mamba-2 `in_proj`, DeltaNet projections).
    #[default]
    Other,
    /// Softmax attention's projections (Megatron `linear_qkv`, `linear_proj`; MLA's down and
    /// output projections).
    AttentionProjection,
    /// MLA's query and key/value up-projections (Megatron `linear_q_up_proj` or
    /// `linear_q_proj`, `linear_kv_up_proj`): attention projections to a precision recipe, the
    /// `mla_up_proj` recompute module's GEMMs.
    MlaUpProjection,
    /// A dense FFN's linears (the `mlp` recompute module).
    DenseFfn,
    /// An MoE block's router (`h → E`).
    Router,
    /// The routed experts' grouped linears.
    RoutedExpert,
    /// The shared experts' linears (the `shared_experts` recompute module).
    SharedExpert,
    /// A latent MoE's `h → ℓ` and `ℓ → h` projections (Megatron `fc1_latent_proj`,
    /// `fc2_latent_proj`).
    LatentProjection,
    /// A Mamba-2 mixer's output projection (Megatron `mixer.out_proj`).
    MambaOutProj,
    /// The LM head (Megatron `output_layer`; not part of a layer, timed with the last rank).
    LmHead,
}

impl GemmRole {
    /// Whether recomputing `module` replays this linear's forward: MLA's up-projections for
    /// `mla_up_proj`, the dense FFN's for `mlp`, the shared experts' for `shared_experts`, and
    /// every linear of the MoE block (router, latent projections, routed and shared experts)
    /// for `moe` (§5.4).
    pub fn in_module(self, module: RecomputeModule) -> bool {
        match module {
            RecomputeModule::MlaUpProj => self == GemmRole::MlaUpProjection,
            RecomputeModule::Mlp => self == GemmRole::DenseFfn,
            RecomputeModule::SharedExperts => self == GemmRole::SharedExpert,
            RecomputeModule::Moe => matches!(
                self,
                GemmRole::Router
                    | GemmRole::LatentProjection
                    | GemmRole::RoutedExpert
                    | GemmRole::SharedExpert
            ),
            RecomputeModule::CoreAttn | RecomputeModule::MoeAct | RecomputeModule::Layernorm => {
                false
            }
        }
    }
}

/// One linear layer: `m` tokens (rows), `n` outputs, `k` inputs, run `repeat` times (once per
/// local expert for the routed experts).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Gemm {
    pub m: f64,
    pub n: f64,
    pub k: f64,
    pub repeat: f64,
    /// The `repeat` instances run as one grouped GEMM (the routed experts:
    /// [`crate::gemm::grouped_linear_s`]), not as separate launches.
    pub grouped: bool,
    /// What the linear is, for a precision recipe's per-GEMM precision.
    pub role: GemmRole,
}

/// Most linear layers one layer has: MLA with a query LoRA (5) and a latent MoE FFN with shared
/// experts (router, the latent `h → ℓ` and `ℓ → h` projections, 2 routed, 2 shared: 7).
pub const MAX_GEMMS: usize = 12;

/// The core of one layer's mixer on one GPU: softmax attention over `heads` local heads of the
/// given head dims (0 heads for a layer without attention), each query seeing at most `window`
/// keys; and a linear-time scan (Mamba-2's SSD, gated DeltaNet's chunked delta rule) of
/// `scan_fwd_flops_per_token` forward FLOPs per local token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoreAttention {
    pub heads: f64,
    pub qk_head_dim: f64,
    pub v_head_dim: f64,
    /// Keys a query sees at most (sliding-window attention); `None`: the whole causal prefix.
    pub window: Option<f64>,
    /// Forward FLOPs of the chunked scan per local token (0 for attention).
    pub scan_fwd_flops_per_token: f64,
    /// HBM bytes the chunked scan's kernels move per local token, forward and backward (0 where
    /// the scan is timed by its FLOPs alone: attention, gated DeltaNet).
    pub scan_fwd_bytes_per_token: f64,
    pub scan_bwd_bytes_per_token: f64,
    /// Local Mamba-2 heads (0 for every other mixer) and their head dim `P`: Mamba-2's SSD
    /// kernels take per head and token at least as long as flash attention of head dim `P` over
    /// the crossover keys of `data/device.toml` ([`CoreAttention::ssd_floor_fwd_flops_per_token`]).
    pub ssd_heads: f64,
    pub ssd_head_dim: f64,
}

impl CoreAttention {
    /// Keys each query attends on average in a causal sequence of `seq` tokens: `s/2`
    /// (Megatron's causal count, docs/costmodel.md §1.1); under a window `w < s`, `w − w²/(2s)`
    /// (the first `w` queries see their prefix, the rest `w` keys).
    pub fn keys_per_query(&self, seq: f64) -> f64 {
        match self.window {
            Some(w) if w < seq => w - w * w / (2.0 * seq),
            _ => seq / 2.0,
        }
    }

    /// Attention-equivalent forward FLOPs per local token that Mamba-2's SSD kernels take at
    /// least: flash attention of `ssd_heads` heads of dim `P` over `crossover_keys` keys,
    /// `4·H·P·K` (0 without Mamba-2). A time floor, not FLOPs the model counts (docs/costmodel.md
    /// §1.4).
    pub fn ssd_floor_fwd_flops_per_token(&self, crossover_keys: f64) -> f64 {
        4.0 * self.ssd_heads * self.ssd_head_dim * crossover_keys
    }

    /// [`CoreAttention::fwd_flops_with_keys`] with Mamba-2's scan at no less than its
    /// attention-equivalent floor ([`CoreAttention::ssd_floor_fwd_flops_per_token`]): the core's
    /// forward in FLOPs at the attention rate, what its time is (stage balancing weighs it).
    pub fn fwd_time_flops_with_keys(&self, keys: f64, crossover_keys: f64) -> f64 {
        self.fwd_flops_with_keys(keys)
            + (self.ssd_floor_fwd_flops_per_token(crossover_keys) - self.scan_fwd_flops_per_token)
                .max(0.0)
    }

    /// Forward FLOPs of the core per local token when each query sees `keys` keys: `QKᵀ` and
    /// `P·V`, plus the scan.
    pub fn fwd_flops_with_keys(&self, keys: f64) -> f64 {
        2.0 * self.heads * (self.qk_head_dim + self.v_head_dim) * keys
            + self.scan_fwd_flops_per_token
    }
}

/// The core of `mixer` on one of `tp` tensor-parallel ranks.
pub fn core_of(model: &Model, mixer: &Mixer, tp: u32) -> CoreAttention {
    let a_local = model.heads as f64 / tp as f64;
    let (heads, window, scan) = match mixer {
        Mixer::Attention { .. } | Mixer::Latent(_) => (a_local, None, 0.0),
        Mixer::SlidingWindow { window, .. } => (a_local, Some(*window as f64), 0.0),
        Mixer::Mamba(m) => (0.0, None, mamba_scan_fwd_flops_per_token(m, tp)),
        Mixer::DeltaNet(la) => (0.0, None, deltanet_scan_fwd_flops_per_token(la, tp)),
        Mixer::None => (0.0, None, 0.0),
    };
    let (scan_fwd_bytes, scan_bwd_bytes) = match mixer {
        Mixer::Mamba(m) => mamba_scan_bytes_per_token(m, tp),
        _ => (0.0, 0.0),
    };
    let (ssd_heads, ssd_head_dim) = match mixer {
        Mixer::Mamba(m) => (m.heads as f64 / tp as f64, m.head_dim as f64),
        _ => (0.0, 0.0),
    };
    CoreAttention {
        heads,
        qk_head_dim: model.qk_head_dim() as f64,
        v_head_dim: model.v_head_dim() as f64,
        window,
        scan_fwd_flops_per_token: scan,
        scan_fwd_bytes_per_token: scan_fwd_bytes,
        scan_bwd_bytes_per_token: scan_bwd_bytes,
        ssd_heads,
        ssd_head_dim,
    }
}

/// HBM bytes per token of Mamba-2's chunked SSD scan on `1/t` of the heads and groups, forward
/// and backward, from the Triton kernels `mamba_chunk_scan_combined` runs (state-spaces/mamba
/// `mamba_ssm/ops/triton/ssd_combined.py`, the kernels Megatron-Core's `MambaMixer` calls through
/// `mamba_split_conv1d_scan_combined`, z-gating inside the scan). Per token, with `HP = d_inner/t`
/// channels, `GN` the width of `B` (and of `C`), `S = HP·N/Q` chunk-state elements and `GQ` the
/// `C·Bᵀ` block row:
///
/// * forward: `_chunk_state_fwd` reads x and B and writes the chunk states in fp32;
///   `_state_passing_fwd` reads them and writes 16-bit states; `_bmm_chunk_fwd` reads C and B and
///   writes `CB` in fp32; `_chunk_scan_fwd` reads `CB`, x, z, C and the states and writes the
///   output and its ungated copy: 16-bit passes `5·HP + 4·GN`, states `4 + 4 + 2 + 2 = 12` bytes
///   per element, `CB` `4 + 4`;
/// * backward (`_mamba_chunk_scan_combined_bwd`): the states and `CB` are recomputed (the
///   forward's first three kernels), then `_chunk_scan_bwd_dz`, `_chunk_scan_bwd_dstates`,
///   `_state_passing_bwd`, `_chunk_scan_chunk_state_bwd_dx`, `_chunk_state_bwd_db`,
///   `_chunk_scan_bwd_dC`, `_chunk_scan_bwd_dcb`, two `_bmm_chunk_bwd` and
///   `_chunk_scan_bwd_ddAcs_stable`: 16-bit passes `17·HP + 15·GN`, states 26 bytes per element,
///   `CB`/`dCB` 24.
///
/// The per-head `dt` and decay vectors (fp32, `H/t` per token) are left out: under 3 % of the
/// total at Nemotron's shapes.
pub fn mamba_scan_bytes_per_token(m: &Mamba, tp: u32) -> (f64, f64) {
    let t = tp as f64;
    let hp = m.inner() as f64 / t;
    let gn = (m.groups as f64 / t) * m.state as f64;
    let states = hp * m.state as f64 / m.chunk as f64;
    let cb = (m.groups as f64 / t) * m.chunk as f64;
    let fwd = ACT_BYTES * (5.0 * hp + 4.0 * gn) + 12.0 * states + 8.0 * cb;
    let bwd = ACT_BYTES * (17.0 * hp + 15.0 * gn) + 26.0 * states + 24.0 * cb;
    (fwd, bwd)
}

/// Forward FLOPs per token of Mamba-2's chunked SSD scan on `1/t` of the heads and groups
/// (Mamba-2 paper, arXiv 2405.21060 §6, the `ssd_minimal` chunked algorithm with chunk `Q`):
/// within each chunk `C·Bᵀ` (`2·Q·N` per group) and its masked product with `x` (`2·Q·P` per
/// head); the chunk states `Bᵀ·x` and their output `C·h` (`2·N·P` each per head); plus the
/// depthwise convolution over `x, B, C` (`2·K` per channel). The `Q×Q` blocks are computed whole
/// (the kernels do not skip their upper triangle).
pub fn mamba_scan_fwd_flops_per_token(m: &Mamba, tp: u32) -> f64 {
    let t = tp as f64;
    let (q, n, p) = (m.chunk as f64, m.state as f64, m.head_dim as f64);
    let (heads, groups) = (m.heads as f64 / t, m.groups as f64 / t);
    2.0 * q * (groups * n + heads * p)
        + 4.0 * heads * n * p
        + 2.0 * m.conv_kernel as f64 * m.conv_channels() as f64 / t
}

/// Forward FLOPs per token of gated DeltaNet's chunked delta rule on `1/t` of the value heads
/// (arXiv 2412.06464 §3; flash-linear-attention's `chunk_gated_delta_rule`, chunk `C`): within a
/// chunk `K·Kᵀ`, `Q·Kᵀ`, the WY factors `A·K` (`2·C·d_k` each) and `A·V`, the intra-chunk output
/// (`2·C·d_v` each); across chunks `W·S`, `Q·S` and the state update `Kᵀ·V` (`2·d_k·d_v` each); per
/// value head (q and k are shared by `H_v/H_k` value heads), plus the convolution over q, k, v.
pub fn deltanet_scan_fwd_flops_per_token(la: &LinearAttention, tp: u32) -> f64 {
    let t = tp as f64;
    let (c, dk, dv) = (
        la.chunk as f64,
        la.key_head_dim as f64,
        la.value_head_dim as f64,
    );
    let heads = la.value_heads as f64 / t;
    let conv = 2.0 * la.conv_kernel as f64 * (2 * la.key_dim() + la.value_dim()) as f64 / t;
    heads * (2.0 * c * (3.0 * dk + 2.0 * dv) + 6.0 * dk * dv) + conv
}

/// MoE token dispatch of one layer (each way, forward): `tokens` tokens, each copied to `top_k`
/// experts, `bytes_per_copy` each (docs/costmodel.md §3.7).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dispatch {
    pub tokens: f64,
    pub bytes_per_copy: f64,
    pub top_k: u32,
}

/// What the layer-level collectives move per micro-batch: the TP "all-reduce points", the MoE
/// dispatch, and the CP ring's K/V per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerComm {
    /// Tensor-parallel all-reduce points per pass (each an all-reduce, or a reduce-scatter +
    /// all-gather pair under SP), each on [`LayerComm::tp_bytes`].
    pub tp_points: u32,
    /// Bytes of one TP point: the micro-batch's hidden states.
    pub tp_bytes: f64,
    /// A folded plan's expert-TP points per pass (one per routed copy gathered over the
    /// expert-TP group; 0 unfolded, where they are among `tp_points`, or with `etp = 1`), each
    /// on [`LayerComm::etp_bytes`].
    pub etp_points: u32,
    /// Bytes of one expert-TP point: the routed tokens the expert-TP group gathers.
    pub etp_bytes: f64,
    /// The routed tokens' dispatch (and, the same again, combine), MoE layers only.
    pub dispatch: Option<Dispatch>,
    /// Bytes of K and V one rank passes around the CP ring per local token.
    pub cp_kv_bytes_per_token: f64,
    /// Of `tp_points`, the FFN's (after the mixer's one): what recomputing the dense MLP or the
    /// MoE block replays with it.
    pub ffn_tp_points: u32,
    /// Bytes one rank sends per local token in the all-to-alls of a Mamba-2 layer under CP
    /// (Megatron-Core's `MambaContextParallel`: the in_proj output from sequence- to
    /// head-sharded before the convolution and scan, the scan output back after), per pass.
    pub cp_all_to_all_bytes_per_token: f64,
}

/// One layer's operations on one GPU for one micro-batch of `tokens` tokens (`b·s/c`, before
/// TP): what time and explain sum over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerOps {
    gemms: [Gemm; MAX_GEMMS],
    gemm_count: usize,
    pub attention: CoreAttention,
    /// Element-wise bytes of the forward pass (norms, activation, RoPE, residuals), §5.3.
    pub elementwise_bytes: f64,
    /// Element-wise bytes of the forward pass spent on routed copies (permute, unpermute,
    /// expert activation); 0 for a dense MLP.
    pub routed_elementwise_bytes: f64,
    pub comm: LayerComm,
    pub params: LayerParams,
    adapter_gemms: [Gemm; 2 * MAX_ADAPTED],
    adapter_gemm_count: usize,
    /// Bytes moved per pass to dequantise the frozen base weights before their GEMMs (LoRA with
    /// NF4 base weights, or FP8 ones under 16-bit compute): read the stored format, write the
    /// 16-bit weight, once in the forward and once for the backward's input gradient (§2.7).
    pub dequant_bytes: f64,
    /// Forward element-wise bytes each recompute module replays, indexed by
    /// [`RecomputeModule::index`] (§5.4): part of [`LayerOps::elementwise_bytes`] and
    /// [`LayerOps::routed_elementwise_bytes`]; the module's GEMMs are those whose
    /// [`GemmRole::in_module`].
    pub module_elementwise_bytes: [f64; RecomputeModule::ALL.len()],
}

impl LayerOps {
    /// The linear layers in the order they run.
    pub fn gemms(&self) -> &[Gemm] {
        &self.gemms[..self.gemm_count]
    }

    /// The LoRA adapters' GEMMs (each adapter's `x·A` then `(x·A)·B`); empty without LoRA. They
    /// are trained: forward, input and weight gradients (§2.7).
    pub fn adapter_gemms(&self) -> &[Gemm] {
        &self.adapter_gemms[..self.adapter_gemm_count]
    }

    fn push(&mut self, m: f64, n: f64, k: f64, repeat: f64) {
        self.push_as(GemmRole::Other, m, n, k, repeat);
    }

    /// A linear of `role` (what a precision recipe may run at another precision).
    fn push_as(&mut self, role: GemmRole, m: f64, n: f64, k: f64, repeat: f64) {
        self.push_gemm(Gemm {
            m,
            n,
            k,
            repeat,
            grouped: false,
            role,
        });
    }

    /// The routed experts' linear: `experts` GEMMs of `m` rows in one grouped GEMM.
    fn push_grouped(&mut self, m: f64, n: f64, k: f64, experts: f64) {
        self.push_gemm(Gemm {
            m,
            n,
            k,
            repeat: experts,
            grouped: true,
            role: GemmRole::RoutedExpert,
        });
    }

    fn push_gemm(&mut self, gemm: Gemm) {
        self.gemms[self.gemm_count] = gemm;
        self.gemm_count += 1;
    }
}

/// Device-independent constants a layer's operations depend on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpsContext {
    /// Tokens of one micro-batch on one GPU before TP sharding: `b·s/c`.
    pub tokens: f64,
    /// Busiest expert rank's routed load over the mean (λ, §1.2).
    pub moe_imbalance: f64,
    /// Element-wise bytes per token and per `h` of one layer's forward pass (§5.3).
    pub elementwise_bytes_per_hidden: f64,
    /// The part of them outside the tensor-parallel regions (norms, residual adds, dropout):
    /// replicated on every TP rank unless sequence parallelism splits it (the stack's
    /// [`crate::stack::Stack::replicated_elementwise_bytes_per_hidden`], at most the total).
    pub replicated_elementwise_bytes_per_hidden: f64,
    /// Bytes the permute and unpermute move per element of a routed copy's hidden vector
    /// (the stack's [`crate::stack::Stack::routed_copy_bytes_per_hidden`]).
    pub routed_copy_bytes_per_hidden: f64,
    /// Bytes the expert activation moves per element of a routed copy's `f_e/t` width
    /// ([`crate::stack::Stack::expert_activation_bytes_per_width`]).
    pub expert_activation_bytes_per_width: f64,
    /// LoRA adapters of the layers (`None`: full training).
    pub adapters: Option<Adapters>,
    /// Bytes per base parameter one dequantisation moves (stored format read, 16-bit written);
    /// 0 when the GEMMs read the stored weights directly.
    pub dequant_bytes_per_param: f64,
}

impl OpsContext {
    /// Shapes only: `tokens` tokens, balanced routing, no element-wise work, no adapters or
    /// dequantisation (what FLOP and parameter counts read from [`layer_ops`]).
    pub fn shapes(tokens: f64) -> Self {
        OpsContext {
            tokens,
            moe_imbalance: 1.0,
            elementwise_bytes_per_hidden: 0.0,
            replicated_elementwise_bytes_per_hidden: 0.0,
            routed_copy_bytes_per_hidden: 0.0,
            expert_activation_bytes_per_width: 0.0,
            adapters: None,
            dequant_bytes_per_param: 0.0,
        }
    }
}

/// The operations of one `spec` layer under `shard` (the one function flops, memory, time and
/// explain read a layer through).
pub fn layer_ops(model: &Model, spec: &LayerSpec, shard: &Shard, ctx: &OpsContext) -> LayerOps {
    let t = shard.tp as f64;
    let tok = ctx.tokens;
    let h = model.hidden as f64;
    let a_local = model.heads as f64 / t;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    let cp_all_to_all = match &spec.mixer {
        Mixer::Mamba(m) => (mamba_in_proj_width(m) + m.inner()) as f64 / t * WIRE_BYTES,
        _ => 0.0,
    };
    let mut ops = LayerOps {
        gemms: [Gemm::default(); MAX_GEMMS],
        gemm_count: 0,
        attention: core_of(model, &spec.mixer, shard.tp),
        elementwise_bytes: 0.0,
        routed_elementwise_bytes: 0.0,
        comm: LayerComm {
            tp_points: 0,
            tp_bytes: tok * h * WIRE_BYTES,
            etp_points: 0,
            etp_bytes: 0.0,
            dispatch: None,
            cp_kv_bytes_per_token: cp_kv_bytes_per_token(model, &spec.mixer, shard.tp),
            cp_all_to_all_bytes_per_token: cp_all_to_all,
            ffn_tp_points: 0,
        },
        params: params_per_rank(model, spec, shard),
        adapter_gemms: [Gemm::default(); 2 * MAX_ADAPTED],
        adapter_gemm_count: 0,
        dequant_bytes: 0.0,
        module_elementwise_bytes: [0.0; RecomputeModule::ALL.len()],
    };
    if ctx.dequant_bytes_per_param > 0.0 {
        ops.dequant_bytes = ctx.dequant_bytes_per_param * (ops.params.dense + ops.params.expert);
    }
    if let Some(ad) = &ctx.adapters {
        // Each adapter as two GEMMs with the base's split: `x·A` over `k/s` inputs and
        // `(x·A)·B` to `n/s` outputs (`s` the TP degree, expert TP for the routed experts'),
        // `2·tok·r·(k + n)/s` FLOPs as Megatron-Bridge's sharded adapters.
        let (linears, len) = adapted_linears(model, spec, ad);
        for l in &linears[..len] {
            let (rows, split, repeat, grouped) = match (l.routed, spec.moe()) {
                (true, Some(m)) => {
                    let local = m.num_experts as f64 / shard.ep as f64;
                    let copies = tok * m.top_k as f64 * ctx.moe_imbalance * shard.routed_share();
                    (copies / local, shard.expert_tp() as f64, local, true)
                }
                _ => (tok, t, 1.0, false),
            };
            for (n, k) in [(ad.rank, l.k / split), (l.n / split, ad.rank)] {
                ops.adapter_gemms[ops.adapter_gemm_count] = Gemm {
                    m: rows,
                    n,
                    k,
                    repeat,
                    grouped,
                    role: GemmRole::Other,
                };
                ops.adapter_gemm_count += 1;
            }
        }
    }

    // Attention projections (§5.2 table).
    match &spec.mixer {
        Mixer::Latent(m) => {
            let attn = GemmRole::AttentionProjection;
            let up = GemmRole::MlaUpProjection;
            match m.q_lora_rank {
                Some(r) => {
                    ops.push_as(attn, tok, r as f64, h, 1.0);
                    ops.push_as(up, tok, a_local * dqk, r as f64, 1.0);
                }
                // Without a query LoRA `linear_q_proj` runs inside Megatron's up-projection
                // function (`qkv_up_proj_and_rope_apply`), so `mla_up_proj` replays it.
                None => ops.push_as(up, tok, a_local * dqk, h, 1.0),
            }
            ops.push_as(
                attn,
                tok,
                (m.kv_lora_rank + m.qk_rope_head_dim) as f64,
                h,
                1.0,
            );
            ops.push_as(
                up,
                tok,
                a_local * (m.qk_nope_head_dim as f64 + dv),
                m.kv_lora_rank as f64,
                1.0,
            );
            ops.push_as(attn, tok, h, a_local * dv, 1.0);
        }
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            let g_local = (*kv_heads as f64 / t).max(1.0);
            let attn = GemmRole::AttentionProjection;
            // Qwen3-Next's output gate doubles the query projection (HF `Qwen3NextAttention`:
            // `q_proj` of `2·a·d`, query and gate).
            let q = a_local * (1.0 + model.output_gates());
            ops.push_as(attn, tok, (q + 2.0 * g_local) * dqk, h, 1.0);
            ops.push_as(attn, tok, h, a_local * dqk, 1.0);
        }
        Mixer::Mamba(m) => {
            ops.push(tok, mamba_in_proj_width(m) as f64 / t, h, 1.0);
            ops.push_as(GemmRole::MambaOutProj, tok, h, m.inner() as f64 / t, 1.0);
        }
        Mixer::DeltaNet(la) => {
            ops.push(
                tok,
                (2 * la.key_dim() + 2 * la.value_dim()) as f64 / t,
                h,
                1.0,
            );
            ops.push(tok, 2.0 * la.value_heads as f64 / t, h, 1.0);
            ops.push(tok, h, la.value_dim() as f64 / t, 1.0);
        }
        Mixer::None => {}
    }
    let gate_up = gate_up_matrices(model);
    // Element-wise work (§5.3): norms, residual adds and dropout run on the whole sequence on
    // every TP rank unless SP splits it; the activation, RoPE and the rest inside the
    // tensor-parallel regions are split `tp` ways either way.
    let replicated = ctx
        .replicated_elementwise_bytes_per_hidden
        .min(ctx.elementwise_bytes_per_hidden);
    let inside_tp = ctx.elementwise_bytes_per_hidden - replicated;
    // The per-`h` figures are a two-block layer's; a one-block layer does half of them.
    let block_share = if spec.blocks() == 2 { 1.0 } else { 0.5 };
    ops.elementwise_bytes = (replicated / shard.sp_div() + inside_tp / t) * h * tok * block_share;
    // A scan mixer's own element-wise work inside its TP region, 16-bit (the scan itself is
    // timed by its FLOPs and bytes, [`CoreAttention`]). Mamba-2 as Megatron-Core's
    // `MambaMixer._ssm_training` runs it: the `in_proj` output copied from sequence-major to
    // batch-major (`rearrange(..).contiguous()`), the convolution reading and writing its
    // channels, the scan output copied back and the norm reading it and writing its output (the
    // z gate is applied inside the scan). Gated DeltaNet: the convolution, and the gated norm
    // reading the core output and the gate and writing its output.
    let mixer_elementwise = match &spec.mixer {
        Mixer::Mamba(m) => {
            2.0 * mamba_in_proj_width(m) as f64
                + 2.0 * m.conv_channels() as f64
                + 4.0 * m.inner() as f64
        }
        Mixer::DeltaNet(la) => {
            2.0 * (2 * la.key_dim() + la.value_dim()) as f64 + 3.0 * la.value_dim() as f64
        }
        // An output gate: the sigmoid of the gate times the attention output, read both and
        // write the product.
        Mixer::Attention { .. } | Mixer::SlidingWindow { .. } if model.attention_output_gate => {
            3.0 * model.heads as f64 * model.qk_head_dim() as f64
        }
        _ => 0.0,
    };
    if mixer_elementwise > 0.0 {
        ops.elementwise_bytes += ACT_BYTES * mixer_elementwise / t * tok;
    }
    // What the recompute modules replay of that work (§5.4). `layernorm`: the norms that are
    // modules of their own in Megatron-Core's TE layer specs — MLA's input norm and an MoE
    // block's pre-MLP norm (`TENorm`); elsewhere the norm is fused into the next linear
    // (`TELayerNormColumnParallelLinear`, the layer's norm an `IdentityOp`, which
    // transformer_layer.py leaves alone) — each reading and writing h 16-bit values per token
    // over its sequence shard. `mla_up_proj`: RoPE and the concatenations writing the per-head
    // Q and K from their halves (read and write `2·(a/t)·d_qk`).
    let norms = separate_norms(spec) as f64;
    ops.module_elementwise_bytes[RecomputeModule::Layernorm.index()] =
        norms * 2.0 * ACT_BYTES * h / shard.sp_div() * tok;
    if let Mixer::Latent(_) = spec.mixer {
        ops.module_elementwise_bytes[RecomputeModule::MlaUpProj.index()] =
            2.0 * ACT_BYTES * 2.0 * a_local * dqk * tok;
    }
    // A dense activation reads its gate/up outputs and writes its output (16-bit).
    let activation_bytes = ACT_BYTES * (gate_up + 1.0);
    match &spec.mlp {
        Mlp::Moe(m) => {
            let e = shard.ep as f64;
            let et = shard.expert_tp() as f64;
            let local_experts = m.num_experts as f64 / e;
            let copies = tok * m.top_k as f64 * ctx.moe_imbalance * shard.routed_share();
            let per_expert = copies / local_experts;
            let fe = m.expert_ffn_hidden as f64;
            // The width the experts and the dispatch see: a latent MoE's `ℓ`, else `h`.
            let w = m.expert_width(model.hidden) as f64;
            ops.push_as(
                GemmRole::Router,
                tok / shard.sp_div(),
                m.num_experts as f64,
                h,
                1.0,
            );
            // A latent MoE's projections are duplicated on the TP ranks (Megatron-Core `MoELayer`
            // builds `fc1_latent_proj`/`fc2_latent_proj` as `TELinear(parallel_mode=
            // "duplicated")`): each rank projects its own tokens (its sequence shard under SP,
            // all of them without) at the full latent width.
            let own = tok / shard.sp_div();
            if let Some(l) = m.latent_size {
                // The down projection `h → ℓ` before the dispatch.
                ops.push_as(GemmRole::LatentProjection, own, l as f64, h, 1.0);
            }
            ops.push_grouped(per_expert, gate_up * fe / et, w, local_experts);
            ops.push_grouped(per_expert, w, fe / et, local_experts);
            if let Some(l) = m.latent_size {
                // ... and the up projection `ℓ → h` of the combined output.
                ops.push_as(GemmRole::LatentProjection, own, h, l as f64, 1.0);
            }
            let fsh = m.shared_ffn_hidden() as f64;
            if fsh > 0.0 {
                ops.push_as(GemmRole::SharedExpert, tok, gate_up * fsh / t, h, 1.0);
                ops.push_as(GemmRole::SharedExpert, tok, h, fsh / t, 1.0);
            }
            // Routed copies: permute and unpermute move each copy's hidden vector, the expert
            // activation its intermediates (§5.3, values in data/stacks.toml).
            let per_copy = ctx.routed_copy_bytes_per_hidden * w
                + ctx.expert_activation_bytes_per_width * m.expert_ffn_hidden as f64 / et;
            ops.routed_elementwise_bytes = copies * per_copy;
            let moe_act = copies * ctx.expert_activation_bytes_per_width * fe / et;
            let shared_act = activation_bytes * fsh / t * tok;
            ops.module_elementwise_bytes[RecomputeModule::MoeAct.index()] = moe_act;
            ops.module_elementwise_bytes[RecomputeModule::SharedExperts.index()] = shared_act;
            ops.module_elementwise_bytes[RecomputeModule::Moe.index()] =
                ops.routed_elementwise_bytes + shared_act;
            // The mixer's point (none in a Nemotron-H MoE-only layer) comes first.
            let mixer_points = spec.mixer.present() as u32;
            match (shard.etp, m.latent_size) {
                // One point after attention and one per routed copy gathered over TP (§3.4).
                (None, None) => {
                    ops.comm.tp_points = mixer_points + m.top_k;
                    ops.comm.ffn_tp_points = m.top_k;
                }
                // Folded, or latent copies narrower than `h`: the copies gather over the
                // expert-TP group (the TP group when unfolded) at the experts' width (§3.7).
                (etp, _) => {
                    ops.comm.tp_points = mixer_points;
                    // The shared experts stay on the dense TP group: column- then row-parallel
                    // (Megatron-Core `SharedExpertMLP`, an MLP of TP linears), one point of their
                    // own, which the routed copies' points no longer stand in for.
                    if fsh > 0.0 && shard.tp > 1 {
                        ops.comm.tp_points += 1;
                        ops.comm.ffn_tp_points = 1;
                    }
                    if etp.unwrap_or(shard.tp) > 1 {
                        ops.comm.etp_points = m.top_k;
                        ops.comm.etp_bytes = tok * shard.routed_share() * w * WIRE_BYTES;
                    }
                }
            }
            ops.comm.dispatch = Some(Dispatch {
                tokens: tok / shard.sp_div(),
                bytes_per_copy: w * WIRE_BYTES,
                top_k: m.top_k,
            });
        }
        Mlp::Dense { ffn_hidden } => {
            let f = *ffn_hidden as f64;
            ops.push_as(GemmRole::DenseFfn, tok, gate_up * f / t, h, 1.0);
            ops.push_as(GemmRole::DenseFfn, tok, h, f / t, 1.0);
            // One point after attention and one after the MLP (§3.4).
            ops.comm.tp_points = spec.mixer.present() as u32 + 1;
            ops.comm.ffn_tp_points = 1;
            ops.module_elementwise_bytes[RecomputeModule::Mlp.index()] =
                activation_bytes * f / t * tok;
        }
        // One point after the mixer (Mamba-2 and DeltaNet too: out_proj is row-parallel, and
        // under SP in_proj's input is gathered as attention's QKV input is).
        Mlp::None => ops.comm.tp_points = spec.mixer.present() as u32,
    }
    ops
}

/// Parameters of the widest linear of any layer kind on one GPU under `shard` (a grouped expert
/// linear counts all its local experts): what one dequantised 16-bit weight copy holds (§2.7).
pub fn largest_linear_params(model: &Model, shard: &Shard) -> f64 {
    let ctx = OpsContext::shapes(1.0);
    model
        .layer_kinds()
        .specs()
        .iter()
        .flat_map(|spec| {
            let ops = layer_ops(model, spec, shard, &ctx);
            let sizes: Vec<f64> = ops
                .gemms()
                .iter()
                .map(|g| g.n * g.k * if g.grouped { g.repeat } else { 1.0 })
                .collect();
            sizes
        })
        .fold(0.0, f64::max)
}

/// Bytes of K and V one rank passes around the CP ring per local token (§3.8): GQA sends its
/// `2·g/t` K/V heads; MLA's ring exchanges the per-head K (nope + rope) and V after
/// up-projection (Megatron's MLA CP), `a/t·(d_qk + d_v)` values.
pub fn cp_kv_bytes_per_token(model: &Model, mixer: &Mixer, tp: u32) -> f64 {
    let t = tp as f64;
    let (dqk, dv) = (model.qk_head_dim() as f64, model.v_head_dim() as f64);
    let width = match mixer {
        Mixer::Latent(_) => model.heads as f64 / t * (dqk + dv),
        Mixer::Attention { kv_heads } | Mixer::SlidingWindow { kv_heads, .. } => {
            2.0 * (*kv_heads as f64 / t).max(1.0) * dqk
        }
        // No ring: Mamba-2 trades its all-to-alls ([`LayerComm::cp_all_to_all_bytes_per_token`]),
        // gated DeltaNet has no CP (a rule), a layer without a mixer nothing.
        Mixer::Mamba(_) | Mixer::DeltaNet(_) | Mixer::None => 0.0,
    };
    width * WIRE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dense_model_has_one_kind_and_one_run() {
        let m = crate::presets::model("llama3-70b").unwrap();
        assert_eq!(m.layer_kinds().len(), 1);
        assert_eq!(m.layer_stack(), vec![(0, 80)]);
    }

    #[test]
    fn deepseek_v3_runs_three_dense_layers_then_58_moe() {
        let m = crate::presets::model("deepseek-v3").unwrap();
        let kinds = m.layer_kinds();
        assert_eq!(kinds.len(), 2);
        assert!(kinds.specs()[0].moe().is_none() && kinds.specs()[1].moe().is_some());
        assert!(matches!(kinds.specs()[1].mixer, Mixer::Latent(_)));
        assert_eq!(m.layer_stack(), vec![(0, 3), (1, 58)]);
    }

    #[test]
    fn weighted_sums_add_in_kind_order() {
        let c = LayerCounts::from_counts(&[3, 0]);
        assert_eq!(c.weighted_sum(&[1.5, 7.0]), 4.5);
        assert_eq!(
            LayerCounts::from_counts(&[0, 0]).weighted_sum(&[1.0, 2.0]),
            0.0
        );
        assert_eq!(c.last_present(), 0);
        assert_eq!(LayerCounts::from_counts(&[3, 2]).last_present(), 1);
        assert_eq!(LayerCounts::from_counts(&[0, 0]).last_present(), 0);
    }

    #[test]
    fn a_latent_moe_runs_its_experts_and_dispatch_at_the_latent_width() {
        let mut m = crate::presets::model("mixtral-8x7b").unwrap();
        let plain = m.layer_kinds().specs()[1];
        m.moe.as_mut().unwrap().latent_size = Some(1024);
        let latent = m.layer_kinds().specs()[1];
        let ctx = ctx(4096.0);
        let shard = Shard {
            tp: 1,
            ep: 8,
            etp: None,
            sequence_parallel: false,
        };
        let a = layer_ops(&m, &plain, &shard, &ctx);
        let b = layer_ops(&m, &latent, &shard, &ctx);
        // Two projections more (h → ℓ and ℓ → h), the experts' K and N at ℓ = h/4.
        assert_eq!(b.gemms().len(), a.gemms().len() + 2);
        let last = |o: &LayerOps, n: usize| o.gemms()[o.gemms().len() - n..].to_vec();
        // Router on h, the experts' gate/up and down (Mixtral has no shared expert) ...
        let ga = last(&a, 3);
        // ... and with a latent: router, h → ℓ, the experts reading and writing ℓ, ℓ → h.
        let gb = last(&b, 5);
        assert_eq!((gb[0].n, gb[0].k), (ga[0].n, 4096.0));
        assert_eq!((gb[1].n, gb[1].k), (1024.0, 4096.0));
        assert_eq!((gb[2].n, gb[2].k), (ga[1].n, 1024.0));
        assert_eq!((gb[3].n, gb[3].k), (1024.0, ga[2].k));
        assert_eq!((gb[4].n, gb[4].k), (4096.0, 1024.0));
        let (da, db) = (a.comm.dispatch.unwrap(), b.comm.dispatch.unwrap());
        assert_eq!(db.bytes_per_copy * 4.0, da.bytes_per_copy);
        // Expert weights shrink by h/ℓ; the projections are dense-side parameters.
        assert_eq!(b.params.expert * 4.0, a.params.expert);
        assert_eq!(b.params.dense - a.params.dense, 2.0 * 4096.0 * 1024.0);
        assert!(b.routed_elementwise_bytes < a.routed_elementwise_bytes);
    }

    #[test]
    fn a_latent_moes_projections_are_duplicated_on_the_tp_ranks() {
        let mut m = crate::presets::model("nemotron-3-nano-30b-a3b").unwrap();
        m.moe.as_mut().unwrap().latent_size = Some(1024);
        // Kind 1 is Nano's "E" layer: MoE alone, shared expert 3712 wide.
        let spec = m.layer_kinds().specs()[1];
        let shard = |tp, sequence_parallel| Shard {
            tp,
            ep: 8,
            etp: Some(1),
            sequence_parallel,
        };
        let one = layer_ops(&m, &spec, &shard(1, false), &ctx(8192.0));
        let two = layer_ops(&m, &spec, &shard(2, true), &ctx(8192.0));
        let latent = |o: &LayerOps| {
            o.gemms()
                .iter()
                .filter(|g| g.role == GemmRole::LatentProjection)
                .map(|g| (g.m, g.n, g.k))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            latent(&one),
            vec![(8192.0, 1024.0, 2688.0), (8192.0, 2688.0, 1024.0)]
        );
        // TP 2 with SP: each rank projects its 4096 tokens at the full latent width.
        assert_eq!(
            latent(&two),
            vec![(4096.0, 1024.0, 2688.0), (4096.0, 2688.0, 1024.0)]
        );
        // The projections' 2·2688·1024 parameters whole on each rank; the rest split.
        let proj = 2.0 * 2688.0 * 1024.0;
        assert_eq!(two.params.dense - proj, (one.params.dense - proj) / 2.0);
        // The combined latent the up projection keeps: 1024 per own token, 1 B (FP8 linears).
        let act = |sh: &Shard| activation_bytes_per_token(&m, &spec, sh, 1.0, 1.0, None);
        let no_latent = {
            let mut plain = m.clone();
            plain.moe.as_mut().unwrap().latent_size = None;
            let s = plain.layer_kinds().specs()[1];
            move |sh: &Shard| activation_bytes_per_token(&plain, &s, sh, 1.0, 1.0, None)
        };
        // Each of the 6 copies keeps its input at the experts' width (1 B) and 3 B per unit of
        // the 1856-wide squared-ReLU intermediate.
        let routed = |sh: &Shard, w: f64| 6.0 * sh.routed_share() * (w + 3.0 * 1856.0);
        assert_eq!(
            act(&shard(2, true)) - routed(&shard(2, true), 1024.0),
            no_latent(&shard(2, true)) - routed(&shard(2, true), 2688.0) + 1024.0 / 2.0
        );
        // No mixer point and no copies gathered (etp = 1); the shared expert's own all-gather
        // and reduce-scatter over TP 2 are one point (§3.4).
        assert_eq!((two.comm.tp_points, two.comm.etp_points), (1, 0));
        assert_eq!(two.comm.ffn_tp_points, 1);
    }

    #[test]
    fn a_folded_moe_layer_gathers_copies_over_the_expert_tp_group() {
        let m = crate::presets::model("mixtral-8x7b").unwrap();
        let spec = m.layer_kinds().specs()[1];
        let ctx = ctx(4096.0);
        let shard = |etp| Shard {
            tp: 4,
            ep: 8,
            etp,
            sequence_parallel: true,
        };
        let unfolded = layer_ops(&m, &spec, &shard(None), &ctx);
        let whole = layer_ops(&m, &spec, &shard(Some(1)), &ctx);
        let two = layer_ops(&m, &spec, &shard(Some(2)), &ctx);
        // Unfolded: the copies gather over TP; etp = 1: no TP collective around the experts.
        assert_eq!((unfolded.comm.tp_points, unfolded.comm.etp_points), (3, 0));
        assert_eq!((whole.comm.tp_points, whole.comm.etp_points), (1, 0));
        assert_eq!((two.comm.tp_points, two.comm.etp_points), (1, 2));
        assert_eq!(two.comm.etp_bytes, unfolded.comm.tp_bytes * 2.0 / 4.0);
        // A shared expert stays on the dense TP group: folded, its column- and row-parallel
        // pair is a point of its own (DeepSeek-V3, TP 2, etp 1: attention's and the shared
        // expert's); unfolded the routed copies' points stand in for it.
        let ds = crate::presets::model("deepseek-v3").unwrap();
        let moe = ds.layer_kinds().specs()[1];
        assert!(matches!(moe.mlp, Mlp::Moe(_)));
        let ds_shard = |tp, etp| Shard {
            tp,
            ep: 8,
            etp,
            sequence_parallel: true,
        };
        let folded = layer_ops(&ds, &moe, &ds_shard(2, Some(1)), &ctx);
        assert_eq!((folded.comm.tp_points, folded.comm.ffn_tp_points), (2, 1));
        let ds_unfolded = layer_ops(&ds, &moe, &ds_shard(2, None), &ctx);
        assert_eq!(ds_unfolded.comm.tp_points, 1 + 8);
        let one = layer_ops(&ds, &moe, &ds_shard(1, Some(1)), &ctx);
        assert_eq!(one.comm.tp_points, 1);
        // The same routed FLOPs per GPU whatever the expert TP: rows × width is constant.
        let routed = |ops: &LayerOps| {
            ops.gemms()[1..3]
                .iter()
                .map(|g| g.m * g.n * g.k * g.repeat)
                .sum::<f64>()
        };
        assert_eq!(routed(&whole), routed(&unfolded));
        assert_eq!(routed(&two), routed(&unfolded));
        // Each expert whole on one rank (etp = 1) holds tp times the unfolded expert weights.
        assert_eq!(whole.params.expert, 4.0 * unfolded.params.expert);
        // The dispatch is each TP rank's own share of the tokens either way.
        assert_eq!(whole.comm.dispatch, unfolded.comm.dispatch);
    }

    #[test]
    fn an_moe_layer_has_a_point_per_routed_copy_and_a_dispatch() {
        let m = crate::presets::model("mixtral-8x7b").unwrap();
        let kinds = m.layer_kinds();
        let shard = Shard {
            tp: 2,
            ep: 4,
            etp: None,
            sequence_parallel: true,
        };
        let ctx = ctx(4096.0);
        let dense = layer_ops(&m, &kinds.specs()[0], &shard, &ctx);
        let moe = layer_ops(&m, &kinds.specs()[1], &shard, &ctx);
        assert_eq!(dense.comm.tp_points, 2);
        assert_eq!(moe.comm.tp_points, 3);
        assert!(dense.comm.dispatch.is_none());
        let d = moe.comm.dispatch.unwrap();
        assert_eq!((d.tokens, d.top_k), (2048.0, 2));
        // Router, gate/up, down: three linears; GQA: two.
        assert_eq!(moe.gemms().len(), 5);
        assert_eq!(dense.gemms().len(), 4);
        assert_eq!(
            moe.params.expert,
            2.0 * expert_params(&m, kinds.specs()[1].moe().unwrap()) as f64 / 2.0
        );
    }

    #[test]
    fn mla_with_a_latent_moe_and_shared_experts_fits_the_gemm_list() {
        // DeepSeek-V3's MLA (query LoRA: 5 linears) with a latent MoE FFN: router, h → ℓ, two
        // routed, ℓ → h and two shared, MAX_GEMMS in all (this used to overrun the list).
        let mut m = crate::presets::model("deepseek-v3").unwrap();
        m.moe.as_mut().unwrap().latent_size = Some(1024);
        let spec = m.layer_kinds().specs()[1];
        let ops = layer_ops(
            &m,
            &spec,
            &Shard {
                tp: 1,
                ep: 8,
                etp: None,
                sequence_parallel: false,
            },
            &ctx(4096.0),
        );
        assert_eq!(ops.gemms().len(), MAX_GEMMS);
        let routed = ops
            .gemms()
            .iter()
            .filter(|g| g.role == GemmRole::RoutedExpert)
            .count();
        assert_eq!(routed, 2);
    }

    fn ctx(tokens: f64) -> OpsContext {
        OpsContext {
            tokens,
            moe_imbalance: 1.0,
            elementwise_bytes_per_hidden: 40.0,
            replicated_elementwise_bytes_per_hidden: 20.0,
            routed_copy_bytes_per_hidden: 8.0,
            expert_activation_bytes_per_width: 6.0,
            adapters: None,
            dequant_bytes_per_param: 0.0,
        }
    }

    #[test]
    fn a_nemotron_h_8b_mamba_layer_matches_a_hand_count() {
        let m = crate::presets::model("nemotron-h-8b").unwrap();
        let kinds = m.layer_kinds();
        // The pattern starts "M-M-M-M*": kinds in order of first appearance.
        let mamba = kinds.specs()[0];
        assert!(matches!(mamba.mixer, Mixer::Mamba(_)) && mamba.mlp == Mlp::None);
        assert!(matches!(kinds.specs()[1].mixer, Mixer::None));
        assert!(matches!(kinds.specs()[2].mixer, Mixer::Attention { .. }));
        let Mixer::Mamba(mm) = mamba.mixer else {
            unreachable!()
        };
        // H = 128, P = 64, N = 128, G = 8, K = 4, Q = 128, h = 4096; d_inner = 8192.
        // in_proj 4096 × (2·8192 + 2·8·128 + 128 = 18560), out_proj 8192 × 4096.
        assert_eq!(mamba_in_proj_width(&mm), 18560);
        let matmul = 4096 * 18560 + 8192 * 4096;
        assert_eq!(mixer_matmul_params(&m, &mamba.mixer), matmul);
        // + conv (4 + 1)·10240, dt_bias/A_log/D 3·128, gated norm 8192; + one RMSNorm of 4096.
        assert_eq!(
            mixer_params(&m, &mamba.mixer),
            matmul + 5 * 10240 + 384 + 8192
        );
        assert_eq!(
            mamba.params(&m),
            (matmul + 5 * 10240 + 384 + 8192 + 4096) as u128
        );
        // Scan: 2·128·(8·128 + 128·64) + 4·128·128·64 + 2·4·10240 per token.
        let scan = 2.0 * 128.0 * (1024.0 + 8192.0) + 4.0 * 128.0 * 128.0 * 64.0 + 8.0 * 10240.0;
        assert_eq!(mamba_scan_fwd_flops_per_token(&mm, 1), scan);
        assert_eq!(scan, 6_635_520.0);
        // Under tp = 2 every part halves: GEMM widths, scan, parameters; one TP point.
        let shard = Shard {
            tp: 2,
            ep: 1,
            etp: None,
            sequence_parallel: true,
        };
        let ops = layer_ops(&m, &mamba, &shard, &ctx(8192.0));
        assert_eq!(ops.gemms().len(), 2);
        assert_eq!((ops.gemms()[0].n, ops.gemms()[0].k), (9280.0, 4096.0));
        assert_eq!((ops.gemms()[1].n, ops.gemms()[1].k), (4096.0, 4096.0));
        assert_eq!(ops.attention.heads, 0.0);
        assert_eq!(ops.attention.scan_fwd_flops_per_token, scan / 2.0);
        assert_eq!(ops.comm.tp_points, 1);
        assert_eq!(ops.comm.cp_kv_bytes_per_token, 0.0);
        assert_eq!(
            ops.comm.cp_all_to_all_bytes_per_token,
            (18560.0 + 8192.0) / 2.0 * WIRE_BYTES
        );
        assert_eq!(
            ops.params.dense,
            (matmul + 5 * 10240 + 384 + 8192) as f64 / 2.0 + 4096.0 / 2.0
        );
        assert!(ops.comm.dispatch.is_none());
    }

    #[test]
    fn the_mamba_2_scan_moves_its_chunk_states_and_cb_blocks_through_hbm() {
        let m = crate::presets::model("nemotron-h-8b").unwrap();
        let Mixer::Mamba(mm) = m.layer_kinds().specs()[0].mixer else {
            unreachable!()
        };
        // H·P = 8192, G·N = 8·128 = 1024, chunk states 8192·128/128 = 8192 per token, CB row
        // G·Q = 1024. Forward: 2·(5·8192 + 4·1024) + 12·8192 + 8·1024 = 196,608 B;
        // backward: 2·(17·8192 + 15·1024) + 26·8192 + 24·1024 = 546,816 B.
        assert_eq!(mamba_scan_bytes_per_token(&mm, 1), (196_608.0, 546_816.0));
        // Split two ways by TP: heads, groups, states and CB rows all halve.
        assert_eq!(mamba_scan_bytes_per_token(&mm, 2), (98_304.0, 273_408.0));
        let core = core_of(&m, &Mixer::Mamba(mm), 2);
        assert_eq!(
            (core.scan_fwd_bytes_per_token, core.scan_bwd_bytes_per_token),
            (98_304.0, 273_408.0)
        );
        // Attention and gated DeltaNet have no byte term (timed by FLOPs).
        assert_eq!(core_of(&m, &m.mixer(), 1).scan_bwd_bytes_per_token, 0.0);
        // The mixer's element-wise traffic (tp = 1, no SP, 8192 tokens): half the per-h
        // figures of a two-block layer (40 B per h, 20 of it replicated) plus 16-bit passes
        // over the in_proj output copy (2·18560), the convolution (2·10240) and the scan
        // output copy and norm (4·8192).
        let shard = Shard {
            tp: 1,
            ep: 1,
            etp: None,
            sequence_parallel: false,
        };
        let ops = layer_ops(&m, &m.layer_kinds().specs()[0], &shard, &ctx(8192.0));
        let per_h = 40.0 * 4096.0 * 8192.0 * 0.5;
        let mixer = 2.0 * (2.0 * 18560.0 + 2.0 * 10240.0 + 4.0 * 8192.0) * 8192.0;
        assert_eq!(ops.elementwise_bytes, per_h + mixer);
        // The output projection is tagged for a precision recipe; in_proj is not.
        assert_eq!(ops.gemms()[0].role, GemmRole::Other);
        assert_eq!(ops.gemms()[1].role, GemmRole::MambaOutProj);
        let attn = layer_ops(&m, &m.layer_kinds().specs()[2], &shard, &ctx(8192.0));
        assert!(attn
            .gemms()
            .iter()
            .all(|g| g.role == GemmRole::AttentionProjection));
    }

    #[test]
    fn one_block_layers_keep_one_norm_input_and_no_kv() {
        let m = crate::presets::model("nemotron-h-8b").unwrap();
        let kinds = m.layer_kinds();
        let shard = Shard {
            tp: 1,
            ep: 1,
            etp: None,
            sequence_parallel: false,
        };
        let h = 4096.0;
        // An FFN-only layer: one norm input (2 B) and one projection input (2 B) of h, then the
        // squared-ReLU FFN (pre-activation 2 B and activation output 2 B per unit of width).
        let ffn = kinds.specs()[1];
        let bytes = activation_bytes_per_token(&m, &ffn, &shard, 1.0, 2.0, None);
        assert_eq!(bytes, 4.0 * h + 4.0 * 21504.0);
        let ops = layer_ops(&m, &ffn, &shard, &ctx(8192.0));
        assert_eq!(ops.gemms().len(), 2);
        assert_eq!(ops.comm.tp_points, 1);
        assert_eq!(ops.attention.fwd_flops_with_keys(4096.0), 0.0);
        // An attention-only layer: no FFN GEMMs.
        let attn = kinds.specs()[2];
        assert_eq!(layer_ops(&m, &attn, &shard, &ctx(8192.0)).gemms().len(), 2);
        assert_eq!(attn.blocks(), 1);
    }

    #[test]
    fn a_sliding_window_caps_the_keys_per_query() {
        let core = CoreAttention {
            heads: 1.0,
            qk_head_dim: 64.0,
            v_head_dim: 64.0,
            window: Some(128.0),
            scan_fwd_flops_per_token: 0.0,
            scan_fwd_bytes_per_token: 0.0,
            scan_bwd_bytes_per_token: 0.0,
            ssd_heads: 0.0,
            ssd_head_dim: 0.0,
        };
        // w − w²/(2s): 128 − 128²/8192 = 126.
        assert_eq!(core.keys_per_query(4096.0), 126.0);
        // A window no shorter than the sequence is the causal s/2.
        assert_eq!(core.keys_per_query(100.0), 50.0);
        let full = CoreAttention {
            window: None,
            ..core
        };
        assert_eq!(full.keys_per_query(4096.0), 2048.0);
        // gpt-oss: the S layers cost ~1/16 of the A layers' core at s = 4096.
        let m = crate::presets::model("gpt-oss-120b").unwrap();
        let kinds = m.layer_kinds();
        let s = core_of(&m, &kinds.specs()[0].mixer, 1);
        let a = core_of(&m, &kinds.specs()[1].mixer, 1);
        assert_eq!(s.window, Some(128.0));
        assert_eq!(a.window, None);
        let ratio = s.fwd_flops_with_keys(s.keys_per_query(4096.0))
            / a.fwd_flops_with_keys(a.keys_per_query(4096.0));
        assert!((ratio - 126.0 / 2048.0).abs() < 1e-12, "{ratio}");
    }

    #[test]
    fn qwen3_next_runs_deltanet_and_attention_with_moe() {
        let m = crate::presets::model("qwen3-next-80b-a3b").unwrap();
        let kinds = m.layer_kinds();
        assert_eq!(kinds.len(), 2);
        assert_eq!(m.layer_stack()[..2], [(0, 3), (1, 1)]);
        let g = kinds.specs()[0];
        let Mixer::DeltaNet(la) = g.mixer else {
            panic!("{g:?}")
        };
        // in: 2048 × (2·2048 + 2·4096 + 64), out: 4096 × 2048.
        assert_eq!(deltanet_in_proj_width(&la), 12352);
        assert_eq!(
            mixer_matmul_params(&m, &g.mixer),
            2048 * 12352 + 4096 * 2048
        );
        // 32 value heads of 128, chunk 64: 32·(2·64·(3·128 + 2·128) + 6·128·128) + conv.
        let core = 32.0 * (128.0 * 640.0 + 6.0 * 16384.0) + 8.0 * (2.0 * 2048.0 + 4096.0);
        assert_eq!(deltanet_scan_fwd_flops_per_token(&la, 1), core);
        let ops = layer_ops(
            &m,
            &g,
            &Shard {
                tp: 2,
                ep: 8,
                etp: None,
                sequence_parallel: true,
            },
            &ctx(4096.0),
        );
        // qkvz, ba, out; router, routed gate/up and down, shared gate/up and down.
        assert_eq!(ops.gemms().len(), 8);
        assert_eq!(ops.comm.tp_points, 1 + 10);
        // The attention layers' output gate: q_proj projects query and gate (2·16·256), K and V
        // 2·2·256, O 16·256 → h: 2048·(2·4096 + 1024) + 4096·2048 = 27,262,976 parameters.
        let attn = kinds.specs()[1];
        assert!(m.attention_output_gate);
        assert_eq!(mixer_matmul_params(&m, &attn.mixer), 27_262_976);
        let shard2 = Shard {
            tp: 2,
            ep: 8,
            etp: None,
            sequence_parallel: true,
        };
        let a = layer_ops(&m, &attn, &shard2, &ctx(4096.0));
        // tp = 2: 8 query heads with their gates and one K/V head pair: (16 + 2)·256 = 4608.
        assert_eq!((a.gemms()[0].n, a.gemms()[0].k), (4608.0, 2048.0));
        assert_eq!((a.gemms()[1].n, a.gemms()[1].k), (2048.0, 2048.0));
        let mut plain = m.clone();
        plain.attention_output_gate = false;
        let p = layer_ops(
            &plain,
            &plain.layer_kinds().specs()[1],
            &shard2,
            &ctx(4096.0),
        );
        assert_eq!(p.gemms()[0].n, 2560.0);
        // The gate product reads the output and the gate and writes the result: 3·16·256 16-bit
        // values per token, split over TP.
        assert_eq!(
            a.elementwise_bytes - p.elementwise_bytes,
            2.0 * 3.0 * 4096.0 / 2.0 * 4096.0
        );
        assert_eq!(a.params.dense - p.params.dense, 2048.0 * 4096.0 / 2.0);
    }

    fn modules(text: &str) -> RecomputeModules {
        RecomputeModules::parse(text).unwrap()
    }

    #[test]
    fn recompute_modules_drop_their_own_tensors_per_token() {
        // Qwen3-30B-A3B's MoE layer, one GPU, bf16 (li = 2): h 2048, 128 experts top-8 of 768,
        // no shared expert.
        let m = crate::presets::model("qwen3-30b-a3b").unwrap();
        let moe = m.layer_kinds().specs()[1];
        let of = |text: &str, li: f64| {
            recompute_discarded_bytes_per_token(&m, &moe, &one_gpu(), 1.0, li, None, modules(text))
        };
        // layernorm: the pre-MLP norm's output (a TENorm of its own before an MoE block), 2·h.
        assert_eq!(of("layernorm", 2.0), (4096.0, 4096.0));
        // moe_act: each of the 8 copies' activation output, 2 B × 768.
        assert_eq!(of("moe_act", 2.0).0, 8.0 * 2.0 * 768.0);
        assert_eq!(of("moe_act+layernorm", 2.0).0, 4096.0 + 12288.0);
        // moe: router logits 4·128, per copy its input 2·2048 and intermediates (2 + 2 + 2)·768;
        // the block's input stays (the checkpoint's, 16-bit as the norm output was).
        let block = 4.0 * 128.0 + 8.0 * (2.0 * 2048.0 + 6.0 * 768.0);
        assert_eq!(block, 70144.0);
        assert_eq!(of("moe", 2.0).0, block);
        // moe_act inside moe discards nothing more; layernorm takes the block's input too.
        assert_eq!(of("moe_act+moe", 2.0).0, block);
        assert_eq!(of("layernorm+moe", 2.0), (4096.0 + block, 4096.0 + block));
        // FP8 linears keep 1-byte inputs: the checkpoint keeps its 16-bit input (h more than
        // the quantised copy), the copies' inputs and activation outputs are 1 byte.
        let fp8 = 4.0 * 128.0 + 8.0 * (2048.0 + 5.0 * 768.0) - 2048.0;
        assert_eq!(of("moe", 1.0).0, fp8);
        // core_attn and the modules of other blocks drop nothing here.
        assert_eq!(of("core_attn+mlp+mla_up_proj+shared_experts", 2.0).0, 0.0);
        // Nothing is discarded past what the layer stores.
        let stored = activation_bytes_per_token(&m, &moe, &one_gpu(), 1.0, 2.0, None);
        assert!(of("layernorm+moe", 2.0).0 < stored);

        // A dense GQA layer (Llama-3-8B): its norms are fused into the linears after them
        // (TELayerNormColumnParallelLinear), so layernorm drops nothing; mlp drops the FFN's
        // input 2·h and its SwiGLU intermediates 6·f.
        let l = crate::presets::model("llama3-8b").unwrap();
        let dense = l.layer_kinds().specs()[0];
        let of = |text: &str| {
            recompute_discarded_bytes_per_token(
                &l,
                &dense,
                &one_gpu(),
                1.0,
                2.0,
                None,
                modules(text),
            )
        };
        assert_eq!(of("layernorm").0, 0.0);
        assert_eq!(
            of("mlp"),
            (2.0 * 4096.0 + 6.0 * 14336.0, 2.0 * 4096.0 + 6.0 * 14336.0)
        );
        assert_eq!(of("moe+moe_act").0, 0.0);
        // Split over TP 2 with SP: the input is sequence-sharded, the intermediates TP-split.
        let tp2 = Shard {
            tp: 2,
            sequence_parallel: true,
            ..one_gpu()
        };
        let split =
            recompute_discarded_bytes_per_token(&l, &dense, &tp2, 1.0, 2.0, None, modules("mlp"));
        assert_eq!(split.0, of("mlp").0 / 2.0);

        // DeepSeek-V3's MLA: mla_up_proj drops the per-head Q, K, V (128 heads × (2·192 + 128),
        // 16-bit); layernorm its input norm's output (a TENorm of its own, 2·7168).
        let d = crate::presets::model("deepseek-v3").unwrap();
        let mla = d.layer_kinds().specs()[0];
        let of = |text: &str| {
            recompute_discarded_bytes_per_token(&d, &mla, &one_gpu(), 1.0, 2.0, None, modules(text))
        };
        assert_eq!(of("mla_up_proj").0, 128.0 * 2.0 * (2.0 * 192.0 + 128.0));
        assert_eq!(of("layernorm").0, 2.0 * 7168.0);
        assert_eq!(separate_norms(&mla), 1);
        assert_eq!(separate_norms(&d.layer_kinds().specs()[1]), 2);
        assert_eq!(separate_norms(&dense), 0);
    }

    #[test]
    fn each_recompute_module_owns_its_gemms_and_element_wise_work() {
        // DeepSeek-V3's MoE layer, one GPU, 4096 tokens: q_up and kv_up are the mla_up_proj
        // GEMMs; router, routed and shared experts the moe module's, the shared ones also
        // shared_experts'.
        let d = crate::presets::model("deepseek-v3").unwrap();
        let spec = d.layer_kinds().specs()[1];
        let tok = 4096.0;
        let ops = layer_ops(&d, &spec, &one_gpu(), &ctx(tok));
        let roles: Vec<GemmRole> = ops.gemms().iter().map(|g| g.role).collect();
        assert_eq!(
            roles,
            [
                GemmRole::AttentionProjection,
                GemmRole::MlaUpProjection,
                GemmRole::AttentionProjection,
                GemmRole::MlaUpProjection,
                GemmRole::AttentionProjection,
                GemmRole::Router,
                GemmRole::RoutedExpert,
                GemmRole::RoutedExpert,
                GemmRole::SharedExpert,
                GemmRole::SharedExpert,
            ]
        );
        let flops = |module: RecomputeModule| -> f64 {
            ops.gemms()
                .iter()
                .filter(|g| g.role.in_module(module))
                .map(|g| 2.0 * g.m * g.n * g.k * g.repeat)
                .sum()
        };
        // q_up 1536 → 128·192 and kv_up 512 → 128·(128 + 128), per token.
        let up = 2.0 * (1536.0 * 128.0 * 192.0 + 512.0 * 128.0 * 256.0);
        assert_eq!(flops(RecomputeModule::MlaUpProj), tok * up);
        // Shared expert: gate/up 7168 → 2·2048, down 2048 → 7168.
        let shared = 2.0 * 3.0 * 7168.0 * 2048.0;
        assert_eq!(flops(RecomputeModule::SharedExperts), tok * shared);
        // The whole block: router 7168 → 256 and 8 routed copies of the same expert shape.
        let routed = 8.0 * 2.0 * 3.0 * 7168.0 * 2048.0;
        let router = 2.0 * 7168.0 * 256.0;
        assert_eq!(
            flops(RecomputeModule::Moe),
            tok * (router + routed + shared)
        );
        assert_eq!(flops(RecomputeModule::Mlp), 0.0);
        // Element-wise: two separate norms read and write h (4 B each); the activation of each
        // copy 6 B per width; the shared expert's 6 B per width; RoPE/concat 2·2·(a·d_qk)·2 B.
        let b = &ops.module_elementwise_bytes;
        assert_eq!(
            b[RecomputeModule::Layernorm.index()],
            2.0 * 4.0 * 7168.0 * tok
        );
        assert_eq!(b[RecomputeModule::MoeAct.index()], 8.0 * tok * 6.0 * 2048.0);
        assert_eq!(
            b[RecomputeModule::SharedExperts.index()],
            6.0 * 2048.0 * tok
        );
        assert_eq!(
            b[RecomputeModule::Moe.index()],
            ops.routed_elementwise_bytes + 6.0 * 2048.0 * tok
        );
        assert_eq!(
            b[RecomputeModule::MlaUpProj.index()],
            2.0 * 2.0 * 2.0 * 128.0 * 192.0 * tok
        );
        // The FFN's TP points: one per routed copy unfolded, one for a dense MLP.
        assert_eq!(ops.comm.ffn_tp_points, 8);
        let dense = layer_ops(&d, &d.layer_kinds().specs()[0], &one_gpu(), &ctx(tok));
        assert_eq!(dense.comm.ffn_tp_points, 1);
        assert_eq!(
            dense.module_elementwise_bytes[RecomputeModule::Mlp.index()],
            6.0 * 18432.0 * tok
        );
    }

    fn adapters(rank: f64, qkv: bool, o: bool, mlp: bool) -> Adapters {
        Adapters {
            rank,
            q: qkv,
            k: qkv,
            v: qkv,
            qkv: false,
            o,
            mlp,
            fc1: false,
            fc2: false,
        }
    }

    #[test]
    fn megatrons_fused_adapters_share_one_a_per_fused_linear() {
        // Llama-3.1-70B, rank 16: linear_qkv h → (64 + 2·8)·128 = 10240, linear_fc1
        // h → 2·28672; fused q/k/v save 2·r·h against separate ones, fused gate/up r·h.
        let m = crate::presets::model("llama3-70b").unwrap();
        let spec = m.layer_kinds().specs()[0];
        let fused = Adapters {
            qkv: true,
            o: true,
            fc1: true,
            fc2: true,
            ..adapters(16.0, false, false, false)
        };
        let (h, f) = (8192.0, 28672.0);
        let expected =
            16.0 * (h + 10240.0) + 16.0 * 2.0 * h + 16.0 * (h + 2.0 * f) + 16.0 * (f + h);
        assert_eq!(adapter_active_params(&m, &spec, &fused), expected);
        let separate = adapters(16.0, true, true, true);
        assert_eq!(
            adapter_active_params(&m, &spec, &separate) - expected,
            16.0 * (2.0 * h + h)
        );
        // linear_qkv alone (the Megatron-Bridge LoRA performance recipes): no FFN input kept.
        let qkv_only = Adapters {
            o: false,
            fc1: false,
            fc2: false,
            ..fused
        };
        let shard = one_gpu();
        let full = activation_bytes_per_token(&m, &spec, &shard, 1.0, 2.0, None);
        let lora = activation_bytes_per_token(&m, &spec, &shard, 1.0, 2.0, Some(&qkv_only));
        assert_eq!(full - lora, 2.0 * h + 2.0 * f - 2.0 * 16.0);
    }

    fn one_gpu() -> Shard {
        Shard {
            tp: 1,
            ep: 1,
            etp: None,
            sequence_parallel: false,
        }
    }

    #[test]
    fn lora_adapter_parameters_of_a_llama_3_1_70b_layer_match_a_hand_count() {
        // h 8192, 64 heads of 128, 8 KV heads, f 28672; rank 16 on q, k, v (torchtune's
        // 70B_lora.yaml): q 16·(8192 + 8192), k and v 16·(8192 + 1024) each.
        let m = crate::presets::model("llama3-70b").unwrap();
        let spec = m.layer_kinds().specs()[0];
        let ad = adapters(16.0, true, false, false);
        let qkv = 16.0 * (8192.0 + 8192.0) + 2.0 * 16.0 * (8192.0 + 1024.0);
        assert_eq!(qkv, 557_056.0);
        assert_eq!(
            adapter_params_per_rank(&m, &spec, &one_gpu(), &ad).dense,
            qkv
        );
        assert_eq!(adapter_active_params(&m, &spec, &ad), qkv);
        let tp2 = Shard { tp: 2, ..one_gpu() };
        assert_eq!(
            adapter_params_per_rank(&m, &spec, &tp2, &ad).dense,
            qkv / 2.0
        );
        // + o 16·(8192 + 8192) and the MLP's gate, up 16·(8192 + 28672) each and down the same.
        let all = adapters(16.0, true, true, true);
        let expected = qkv + 16.0 * 16384.0 + 3.0 * 16.0 * (8192.0 + 28672.0);
        assert_eq!(adapter_active_params(&m, &spec, &all), expected);
        // Each adapter is two GEMMs, 2·tok·r·(k + n) FLOPs in all.
        let mut c = ctx(4096.0);
        c.adapters = Some(all);
        let ops = layer_ops(&m, &spec, &one_gpu(), &c);
        assert_eq!(ops.adapter_gemms().len(), 14);
        let flops: f64 = ops
            .adapter_gemms()
            .iter()
            .map(|g| 2.0 * g.m * g.n * g.k)
            .sum();
        assert_eq!(flops, 2.0 * 4096.0 * expected);
        assert!(layer_ops(&m, &spec, &one_gpu(), &ctx(4096.0))
            .adapter_gemms()
            .is_empty());
    }

    #[test]
    fn a_routed_experts_adapters_split_over_expert_parallel_and_run_per_routed_copy() {
        let m = crate::presets::model("mixtral-8x7b").unwrap();
        let spec = m.layer_kinds().specs()[1];
        let moe = spec.moe().copied().unwrap();
        let (h, fe) = (m.hidden as f64, moe.expert_ffn_hidden as f64);
        let ad = adapters(8.0, false, false, true);
        // One expert: gate and up 8·(h + f_e), down the same; 8 experts, 4 per EP rank.
        let per_expert = 3.0 * 8.0 * (h + fe);
        let ep4 = Shard { ep: 4, ..one_gpu() };
        let p = adapter_params_per_rank(&m, &spec, &ep4, &ad);
        assert_eq!((p.dense, p.expert), (0.0, 2.0 * per_expert));
        assert_eq!(adapter_active_params(&m, &spec, &ad), 2.0 * per_expert);
        // Their rank-r intermediates: three per routed copy, top-2 copies per token.
        let bytes = adapter_intermediate_bytes(&m, &spec, &one_gpu(), 1.0, &ad);
        assert_eq!(bytes, 2.0 * 3.0 * 2.0 * 8.0);
    }

    #[test]
    fn a_frozen_linear_keeps_its_input_only_for_an_adapter() {
        // Llama-2-7B (MHA, SwiGLU), t = 1, 16-bit: full training keeps 8h + 8h + 6f per token
        // (32.125·h, memory.rs). Rank 16 on q, k, v: the FFN input (2h) and the down
        // projection's input (2f) go, three rank-16 intermediates (2·16 each) come.
        let mut m = crate::presets::model("llama3-8b").unwrap();
        m.kv_heads = 32;
        m.ffn_hidden = 11008;
        let spec = m.layer_kinds().specs()[0];
        let (h, f) = (4096.0, 11008.0);
        let full = activation_bytes_per_token(&m, &spec, &one_gpu(), 1.0, 2.0, None);
        assert_eq!(full, 16.0 * h + 6.0 * f);
        let qkv = adapters(16.0, true, false, false);
        let lora = activation_bytes_per_token(&m, &spec, &one_gpu(), 1.0, 2.0, Some(&qkv));
        assert_eq!(lora, 14.0 * h + 4.0 * f + 3.0 * 2.0 * 16.0);
        // Every linear adapted: every input kept, plus seven rank-8 intermediates.
        let all = adapters(8.0, true, true, true);
        let lora = activation_bytes_per_token(&m, &spec, &one_gpu(), 1.0, 2.0, Some(&all));
        assert_eq!(lora, full + 7.0 * 2.0 * 8.0);
        // Only o adapted: neither projection input is kept; the attention output (flash
        // attention's own) stays.
        let o = adapters(8.0, false, true, false);
        let lora = activation_bytes_per_token(&m, &spec, &one_gpu(), 1.0, 2.0, Some(&o));
        assert_eq!(lora, 12.0 * h + 4.0 * f + 2.0 * 8.0);
    }
}

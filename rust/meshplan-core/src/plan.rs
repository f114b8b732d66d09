//! A parallel plan: the five degrees (`N = dp·tp·pp·ep·cp`) and the knobs that go with them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;

/// Activation recomputation mode (docs/costmodel.md §1.3, §2.4).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    #[default]
    None,
    /// Recompute core attention only (Korthikanti et al. 2022 §5).
    Selective,
    /// Recompute every layer from its stored input.
    Full,
    /// Op-level selective activation checkpointing (torchtitan's `selective_ac_option = "op"`):
    /// every other matmul output and the attention output are kept, everything else is
    /// recomputed in the backward. Not searched unless asked for (Megatron has no such mode).
    #[serde(rename = "selective-op")]
    SelectiveOp,
}

impl Recompute {
    /// Every mode, in the order of their codes (`feasible_space` columns).
    pub const ALL: [Recompute; 4] = [
        Recompute::None,
        Recompute::Selective,
        Recompute::Full,
        Recompute::SelectiveOp,
    ];
    /// The modes a search space allows by default: those of Megatron-LM.
    pub const DEFAULT: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
            Recompute::SelectiveOp => "selective-op",
        }
    }
}

/// One module of Megatron-Core's fine-grained selective recompute (`--recompute-granularity
/// selective --recompute-modules ...`, docs/costmodel.md §2.4, §5.4): what it stops storing in
/// the forward and replays in the backward
/// [NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py `recompute_modules`].
/// `moe_act`, `layernorm` and `mla_up_proj` run output-discarding checkpointing
/// (`CheckpointWithoutOutput`: the output is freed after its consumer ran and rebuilt before that
/// consumer's backward), the others normal checkpointing (`tensor_parallel.checkpoint`: only the
/// module's input is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    /// Core attention: the unfused score tensors (what `selective` alone means).
    CoreAttn,
    /// The routed experts' activation (its output, the fc2 input, discarded).
    MoeAct,
    /// The input and pre-MLP norms where they are modules of their own (their outputs
    /// discarded).
    Layernorm,
    /// MLA's query and key/value up-projections and RoPE (the per-head Q, K, V discarded).
    MlaUpProj,
    /// The dense MLP (dense layers only).
    Mlp,
    /// The whole MoE block: router, dispatch, experts, combine, shared experts.
    Moe,
    /// The shared experts of an MoE block.
    SharedExperts,
}

impl RecomputeModule {
    /// Every module, in Megatron's order (`transformer_config.py` docstring); bit `i` of a
    /// [`RecomputeModules`] set is module `ALL[i]`.
    pub const ALL: [RecomputeModule; 7] = [
        RecomputeModule::CoreAttn,
        RecomputeModule::MoeAct,
        RecomputeModule::Layernorm,
        RecomputeModule::MlaUpProj,
        RecomputeModule::Mlp,
        RecomputeModule::Moe,
        RecomputeModule::SharedExperts,
    ];

    /// Megatron's name of the module.
    pub fn name(self) -> &'static str {
        match self {
            RecomputeModule::CoreAttn => "core_attn",
            RecomputeModule::MoeAct => "moe_act",
            RecomputeModule::Layernorm => "layernorm",
            RecomputeModule::MlaUpProj => "mla_up_proj",
            RecomputeModule::Mlp => "mlp",
            RecomputeModule::Moe => "moe",
            RecomputeModule::SharedExperts => "shared_experts",
        }
    }

    /// Position in [`RecomputeModule::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether Megatron discards the module's output rather than checkpointing its input
    /// (`CheckpointWithoutOutput`).
    pub fn discards_output(self) -> bool {
        matches!(
            self,
            RecomputeModule::MoeAct | RecomputeModule::Layernorm | RecomputeModule::MlaUpProj
        )
    }
}

/// What a set of recompute modules must look like (the `allowed` part of its errors).
const MODULES_ALLOWED: &str = "one or more of core_attn, moe_act, layernorm, mla_up_proj, mlp, \
     moe, shared_experts, joined by '+' (e.g. layernorm+moe_act)";

/// A set of [`RecomputeModule`]s (a plan's `recompute_modules`): written `layernorm+moe_act` in a
/// plan string (Megatron's order) and as a list of names in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RecomputeModules(u8);

impl RecomputeModules {
    /// No module.
    pub const EMPTY: RecomputeModules = RecomputeModules(0);
    /// Megatron's default, `["core_attn"]`: what `recompute = selective` without modules means.
    pub const CORE_ATTN: RecomputeModules = RecomputeModules(1);

    /// The set of `modules`.
    pub fn of(modules: &[RecomputeModule]) -> Self {
        modules.iter().fold(Self::EMPTY, |s, &m| s.with(m))
    }

    /// This set and `m`.
    pub fn with(self, m: RecomputeModule) -> Self {
        RecomputeModules(self.0 | 1 << m.index())
    }

    pub fn contains(self, m: RecomputeModule) -> bool {
        self.0 & (1 << m.index()) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every module of `self` is in `other`.
    pub fn is_subset(self, other: RecomputeModules) -> bool {
        self.0 & !other.0 == 0
    }

    /// The modules, in Megatron's order.
    pub fn iter(self) -> impl Iterator<Item = RecomputeModule> {
        RecomputeModule::ALL
            .into_iter()
            .filter(move |m| self.contains(*m))
    }

    /// The bits (bit `i`: [`RecomputeModule::ALL`]`[i]`; the feasible-space column).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// The set of `bits` (those beyond the modules dropped).
    pub fn from_bits(bits: u8) -> Self {
        RecomputeModules(bits & ((1 << RecomputeModule::ALL.len()) - 1))
    }

    /// Parses `layernorm+moe_act` (`+`, `,` or spaces between names, any order, case-insensitive;
    /// at least one). Errors name `field`.
    pub fn parse_field(field: &str, text: &str) -> Result<Self> {
        let bad = || Error::invalid(field, format!("{text:?}"), MODULES_ALLOWED);
        let mut set = Self::EMPTY;
        for piece in text
            .split(['+', ',', ' '])
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let m = RecomputeModule::ALL
                .into_iter()
                .find(|m| m.name().eq_ignore_ascii_case(piece))
                .ok_or_else(bad)?;
            set = set.with(m);
        }
        if set.is_empty() {
            return Err(bad());
        }
        Ok(set)
    }

    /// [`Self::parse_field`] naming `plan.recompute_modules`.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_field("plan.recompute_modules", text)
    }
}

impl fmt::Display for RecomputeModules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(|m| m.name()).collect();
        f.write_str(&names.join("+"))
    }
}

impl Serialize for RecomputeModules {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for RecomputeModules {
    /// A list of module names, or one string `layernorm+moe_act`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            List(Vec<RecomputeModule>),
        }
        match Form::deserialize(d).map_err(|_| {
            serde::de::Error::custom(format!("recompute_modules (allowed: {MODULES_ALLOWED})"))
        })? {
            Form::Text(t) => RecomputeModules::parse(&t).map_err(serde::de::Error::custom),
            Form::List(l) if !l.is_empty() => Ok(RecomputeModules::of(&l)),
            Form::List(_) => Err(serde::de::Error::custom(format!(
                "empty recompute_modules (allowed: {MODULES_ALLOWED})"
            ))),
        }
    }
}

/// Pipeline schedule (docs/costmodel.md §4).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub enum Schedule {
    /// PipeDream-Flush one-forward-one-backward; also the label of plans without pipelining.
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Megatron's interleaved 1F1B with `vpp` model chunks per rank.
    #[serde(rename = "interleaved-1f1b")]
    Interleaved,
    /// Zero-bubble ZB-H1 (Qi et al. 2024): 1F1B memory, bubble `(p-1)(t_F + t_B - t_W)`.
    #[serde(rename = "zb-h1")]
    ZeroBubbleH1,
}

impl Schedule {
    pub const ALL: [Schedule; 3] = [
        Schedule::OneFOneB,
        Schedule::Interleaved,
        Schedule::ZeroBubbleH1,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved-1f1b",
            Schedule::ZeroBubbleH1 => "zb-h1",
        }
    }
}

/// How an MoE layer's tokens reach their experts and come back (docs/costmodel.md §3.7):
/// Megatron-Core's `--moe-token-dispatcher-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dispatcher {
    /// NCCL all-to-all of every routed copy (Megatron `alltoall`, torchtitan's EP).
    #[serde(rename = "alltoall")]
    AllToAll,
    /// All-gather of the EP group's tokens, each rank keeping its experts' (Megatron
    /// `allgather`); the combine is a reduce-scatter.
    #[serde(rename = "allgather")]
    AllGather,
    /// DeepEP / HybridEP kernels with node-deduplicated routing: a token crosses the network
    /// once per remote domain and fans out over NVLink there (Megatron `flex`).
    #[serde(rename = "flex")]
    Flex,
}

impl Dispatcher {
    /// Every dispatcher, in the order of their codes (`feasible_space` columns).
    pub const ALL: [Dispatcher; 3] = [
        Dispatcher::AllToAll,
        Dispatcher::AllGather,
        Dispatcher::Flex,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dispatcher::AllToAll => "alltoall",
            Dispatcher::AllGather => "allgather",
            Dispatcher::Flex => "flex",
        }
    }
}

/// How context parallelism exchanges attention's inputs between the CP ranks
/// (docs/costmodel.md §3.8): Megatron-Core's `--cp-comm-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CpExchange {
    /// Ring attention: `c − 1` point-to-point K/V steps, each behind one block of attention
    /// (Megatron `p2p`, the default).
    #[serde(rename = "ring")]
    Ring,
    /// The K/V shards all-gathered once, behind the first (local) block of attention only
    /// (Megatron `all_gather`; PyTorch `context_parallel` with `rotate_method = "allgather"`).
    #[serde(rename = "allgather")]
    AllGather,
    /// Ulysses: all-to-alls turn the sequence-sharded Q, K, V into head-sharded ones over the
    /// whole sequence before attention and the output back after, exposed (Megatron `a2a`,
    /// DeepSpeed-Ulysses arXiv:2309.14509). Heads and K/V groups per TP rank must divide by
    /// `cp`.
    #[serde(rename = "a2a")]
    AllToAll,
    /// Hierarchical: all-to-all over the CP ranks inside an NVLink domain, a ring over the
    /// domains (Megatron `a2a+p2p` with `hierarchical_context_parallel_sizes`; USP
    /// arXiv:2405.07719).
    #[serde(rename = "a2a+p2p")]
    AllToAllRing,
}

impl CpExchange {
    /// Every exchange, in the order of their codes (`feasible_space` columns).
    pub const ALL: [CpExchange; 4] = [
        CpExchange::Ring,
        CpExchange::AllGather,
        CpExchange::AllToAll,
        CpExchange::AllToAllRing,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CpExchange::Ring => "ring",
            CpExchange::AllGather => "allgather",
            CpExchange::AllToAll => "a2a",
            CpExchange::AllToAllRing => "a2a+p2p",
        }
    }

    /// Whether the exchange all-to-alls heads across (some of) the CP ranks.
    pub fn shards_heads(self) -> bool {
        matches!(self, CpExchange::AllToAll | CpExchange::AllToAllRing)
    }
}

/// An axis of the device mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Axis {
    Tp,
    Cp,
    Ep,
    Dp,
    Pp,
}

impl Axis {
    /// The five axes in Megatron's default order.
    pub const ALL: [Axis; 5] = [Axis::Tp, Axis::Cp, Axis::Ep, Axis::Dp, Axis::Pp];

    pub fn name(self) -> &'static str {
        match self {
            Axis::Tp => "tp",
            Axis::Cp => "cp",
            Axis::Ep => "ep",
            Axis::Dp => "dp",
            Axis::Pp => "pp",
        }
    }

    /// The axis's degree in `plan`.
    pub fn size(self, plan: &Plan) -> u32 {
        match self {
            Axis::Tp => plan.tp,
            Axis::Cp => plan.cp,
            Axis::Ep => plan.ep,
            Axis::Dp => plan.dp,
            Axis::Pp => plan.pp,
        }
    }
}

/// What a rank order must look like (the `allowed` part of its errors).
const ORDER_ALLOWED: &str =
    "each of tp, cp, ep, dp, pp exactly once, joined by '-', innermost first, e.g. tp-cp-ep-dp-pp";

/// The rank order of the device mesh: the five axes from innermost (consecutive ranks, the
/// fastest fabric) to outermost, as Megatron's `order` string (docs/costmodel.md §3.3). Written as
/// `"tp-cp-ep-dp-pp"` (the default) in every serialised form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RankOrder([Axis; 5]);

impl Default for RankOrder {
    fn default() -> Self {
        RankOrder::DEFAULT
    }
}

impl RankOrder {
    /// Megatron's default `tp-cp-ep-dp-pp`: TP innermost, PP outermost.
    pub const DEFAULT: RankOrder = RankOrder(Axis::ALL);

    /// The order of `axes` (innermost first); an error unless each axis appears exactly once.
    pub fn new(axes: [Axis; 5]) -> Result<Self> {
        if Axis::ALL.iter().all(|a| axes.contains(a)) {
            Ok(RankOrder(axes))
        } else {
            let text: Vec<&str> = axes.iter().map(|a| a.name()).collect();
            Err(Error::invalid("plan.order", text.join("-"), ORDER_ALLOWED))
        }
    }

    /// Parses `"tp-cp-ep-dp-pp"` (case-insensitive; `,` or `-` between the axes). Errors name
    /// `plan.order`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || Error::invalid("plan.order", format!("{text:?}"), ORDER_ALLOWED);
        let mut axes = Vec::with_capacity(5);
        for piece in text.split(['-', ',']).map(str::trim) {
            let axis = Axis::ALL
                .into_iter()
                .find(|a| a.name().eq_ignore_ascii_case(piece))
                .ok_or_else(bad)?;
            if axes.contains(&axis) {
                return Err(bad());
            }
            axes.push(axis);
        }
        let axes: [Axis; 5] = axes.try_into().map_err(|_| bad())?;
        RankOrder::new(axes)
    }

    /// The axes, innermost first.
    pub fn axes(&self) -> [Axis; 5] {
        self.0
    }

    /// Every order: the 120 permutations, the default first, then in lexicographic order.
    pub fn all() -> Vec<RankOrder> {
        let mut out = vec![RankOrder::DEFAULT];
        let mut perm = Axis::ALL;
        // Heap-free lexicographic enumeration (next permutation).
        loop {
            if perm != Axis::ALL {
                out.push(RankOrder(perm));
            }
            let Some(i) = (0..4).rev().find(|&i| perm[i] < perm[i + 1]) else {
                break;
            };
            let j = (i + 1..5)
                .rev()
                .find(|&j| perm[j] > perm[i])
                .unwrap_or(i + 1);
            perm.swap(i, j);
            perm[i + 1..].reverse();
        }
        out
    }
}

impl fmt::Display for RankOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|a| a.name()).collect();
        f.write_str(&names.join("-"))
    }
}

impl Serialize for RankOrder {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RankOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        RankOrder::parse(&text)
            .map_err(|_| serde::de::Error::custom(format!("{text:?} (allowed: {ORDER_ALLOWED})")))
    }
}

/// One way to run the workload on the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Data-parallel degree: dense layers see `dp·ep`, or, in a folded plan (`etp` given), `dp`
    /// itself (Megatron's DP).
    pub dp: u32,
    /// Tensor-parallel degree (also the expert tensor-parallel degree unless `etp` is given).
    pub tp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Expert-parallel degree (1 for dense models).
    #[serde(default = "one")]
    pub ep: u32,
    /// Context-parallel degree.
    #[serde(default = "one")]
    pub cp: u32,
    /// Model chunks per pipeline rank (1 = no interleaving).
    #[serde(default = "one")]
    pub vpp: u32,
    /// Sequences per micro-batch.
    #[serde(default = "one")]
    pub micro_batch: u32,
    /// ZeRO stage: 0 none (DDP), 1 optimizer states (Megatron distributed optimizer),
    /// 2 + gradients, 3 + parameters (FSDP full shard).
    #[serde(default)]
    pub zero: u8,
    #[serde(default)]
    pub recompute: Recompute,
    #[serde(default)]
    pub sequence_parallel: bool,
    /// `None` picks the natural schedule: interleaved when `vpp > 1`, else 1F1B.
    #[serde(default)]
    pub schedule: Option<Schedule>,
    /// Rank order of the device mesh (which groups share an NVLink domain).
    #[serde(default)]
    pub order: RankOrder,
    /// Expert tensor-parallel degree of a folded plan (MoE parallel folding, docs/costmodel.md
    /// §0.1): given, the expert layers run their own `etp × ep × edp × pp` mesh over the ranks
    /// the dense layers run as `tp × cp × dp × pp`, so `N = dp·tp·pp·cp` and
    /// `etp·ep·edp = dp·tp·cp`; absent, EP is carved out of data parallelism and the experts
    /// split `tp` ways (`N = dp·tp·pp·ep·cp`).
    #[serde(default)]
    pub etp: Option<u32>,
    /// MoE token dispatcher (`None`: the workload's stack's default; the search names it).
    #[serde(default)]
    pub dispatcher: Option<Dispatcher>,
    /// EP communication overlap: one micro-batch's dispatch and combine hidden behind another's
    /// computation (Megatron `--overlap-moe-expert-parallel-comm`, DualPipe-style).
    #[serde(default)]
    pub ep_overlap: bool,
    /// Context parallelism's exchange (`None`: the workload's stack's default; the search
    /// names it for plans with `cp > 1`).
    #[serde(default)]
    pub cp_exchange: Option<CpExchange>,
    /// Megatron-Core's selective-recompute modules, with `recompute = selective` only (`None`:
    /// Megatron's default, core attention alone: what `selective` has always meant here).
    #[serde(default)]
    pub recompute_modules: Option<RecomputeModules>,
    /// Transformer layers on the first pipeline rank (all its model chunks together), where the
    /// run fixed the split: Megatron's `--decoder-first-pipeline-num-layers`, or what its
    /// `--pipeline-model-parallel-layout` gives that rank (DeepSeek-V3's `Et|(tt|)*30mL` on
    /// pp 8 × vpp 4: 7). The ranks whose count is not fixed share the other layers equally
    /// (docs/costmodel.md §2.5). `None`: the stack's split ([`crate::stages`]); the search
    /// leaves it `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage_layers: Option<u32>,
    /// Transformer layers on the last pipeline rank (all its chunks), which also holds the LM
    /// head, the loss and any MTP depths: Megatron's `--decoder-last-pipeline-num-layers`, or
    /// its layout's last rank (`Et|(tt|)*30mL` on pp 8 × vpp 4: 6). `None`: see
    /// [`Self::first_stage_layers`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stage_layers: Option<u32>,
    /// Activation offloading to host memory: transformer layers per model chunk whose
    /// activations saved for backward go to the host during the forward and come back during
    /// the backward (Megatron-Core `cpu_offloading=True`, `cpu_offloading_num_layers=N`,
    /// `cpu_offloading_weights=False`, which hands them to TransformerEngine's
    /// `get_cpu_offload_context`: the chunk's first `N` layers, each copied on its own stream
    /// within a window of `⌊L/N⌋` layers' compute; docs/costmodel.md §2.4.6, §5.6). Fewer than
    /// the chunk's layers. `None` or 0: off; the search leaves it `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_layers: Option<u32>,
}

fn one() -> u32 {
    1
}

/// The plan of one GPU: every degree and the micro-batch 1, every knob off or the stack's
/// default (what a plan's omitted fields mean, as the serde defaults above read them).
impl Default for Plan {
    fn default() -> Self {
        Plan {
            dp: 1,
            tp: 1,
            pp: 1,
            ep: 1,
            cp: 1,
            vpp: 1,
            micro_batch: 1,
            zero: 0,
            recompute: Recompute::default(),
            sequence_parallel: false,
            schedule: None,
            order: RankOrder::default(),
            etp: None,
            dispatcher: None,
            ep_overlap: false,
            cp_exchange: None,
            recompute_modules: None,
            first_stage_layers: None,
            last_stage_layers: None,
            offload_layers: None,
        }
    }
}

impl Plan {
    /// Total GPUs the plan uses: `dp·tp·pp·ep·cp`, or `dp·tp·pp·cp` for a folded plan.
    /// (Saturates at `u64::MAX`, so absurd degrees never wrap around to a valid GPU count.)
    pub fn num_gpus(&self) -> u64 {
        let ep = if self.folded() { 1 } else { self.ep };
        [self.dp, self.tp, self.pp, ep, self.cp]
            .into_iter()
            .fold(1u64, |acc, d| acc.saturating_mul(d as u64))
    }

    /// Whether the experts fold over the dense ranks on a mesh of their own (`etp` given).
    pub fn folded(&self) -> bool {
        self.etp.is_some()
    }

    /// Expert tensor-parallel degree: `etp`, else `tp`.
    pub fn expert_tp(&self) -> u32 {
        self.etp.unwrap_or(self.tp)
    }

    /// Expert data-parallel degree `edp`: replicas of each expert shard, the ranks of a
    /// pipeline stage over `etp·ep` (`dp·cp` when EP is carved out of data parallelism).
    /// Saturating; 0 when a folded plan's `etp·ep` exceeds a stage (rejected by `validate`).
    pub fn expert_dp(&self) -> u32 {
        match self.etp {
            None => self.dp.saturating_mul(self.cp),
            Some(etp) => {
                let stage = self.dp as u64 * self.tp as u64 * self.cp as u64;
                let expert = (etp as u64 * self.ep as u64).max(1);
                (stage / expert).min(u32::MAX as u64) as u32
            }
        }
    }

    /// The schedule in effect.
    pub fn schedule(&self) -> Schedule {
        self.schedule.unwrap_or(if self.vpp > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        })
    }

    /// Dense-layer data-parallel degree `d_p = dp·ep` (docs/costmodel.md §0); `dp` in a folded
    /// plan.
    pub fn dense_dp(&self) -> u32 {
        if self.folded() {
            return self.dp;
        }
        // Saturating: at most the GPU count once validated, but never a wrap before that.
        self.dp.saturating_mul(self.ep)
    }

    /// The end ranks' fixed layer counts ([`Self::first_stage_layers`],
    /// [`Self::last_stage_layers`]) that are given, with their field names.
    fn fixed_stage_layers(&self) -> impl Iterator<Item = (&'static str, u32)> {
        [
            ("plan.first_stage_layers", self.first_stage_layers),
            ("plan.last_stage_layers", self.last_stage_layers),
        ]
        .into_iter()
        .filter_map(|(field, v)| v.map(|v| (field, v)))
    }

    /// Checks the fixed end-rank layer counts against a model of `layers` layers: together at
    /// most `layers`, and the ranks left free (the middle ones, and an end rank whose count is
    /// not given) an equal share of at least one layer each, as Megatron requires of
    /// `--decoder-first/last-pipeline-num-layers`; no count with a single rank. Call after
    /// [`Self::validate`] (it checks the degrees).
    pub fn validate_split(&self, layers: u32) -> Result<()> {
        self.validate_offload(layers)?;
        self.check_fixed_stage_layers()?;
        let Some((field, value)) = self.fixed_stage_layers().next() else {
            return Ok(());
        };
        let fixed: u64 = self.fixed_stage_layers().map(|(_, v)| v as u64).sum();
        let free = self.pp as u64 - self.fixed_stage_layers().count() as u64;
        let layers = layers as u64;
        let allowed = if fixed > layers {
            Some(format!(
                "end-rank layer counts summing to at most the model's {layers} layers"
            ))
        } else if free == 0 && fixed != layers {
            Some(format!(
                "first_stage_layers + last_stage_layers = the model's {layers} layers (pp = 2)"
            ))
        } else if free > 0 && ((layers - fixed) % free != 0 || layers - fixed < free) {
            Some(format!(
                "a count leaving the other {free} pipeline ranks an equal share of at least one \
                 of the remaining {} layers",
                layers - fixed
            ))
        } else {
            None
        };
        match allowed {
            Some(allowed) => Err(Error::invalid(field, value, allowed)),
            None => Ok(()),
        }
    }

    /// Layers per model chunk whose activations go to the host ([`Self::offload_layers`]); 0
    /// when off.
    pub fn offloaded_layers(&self) -> u32 {
        self.offload_layers.unwrap_or(0)
    }

    /// The fixed end-rank layer counts within their limits, and none with a single pipeline
    /// rank (which holds every layer).
    fn check_fixed_stage_layers(&self) -> Result<()> {
        for (field, v) in self.fixed_stage_layers() {
            limits::check(field, v)?;
            if self.pp <= 1 {
                return Err(Error::invalid(
                    field,
                    v,
                    "null with pp = 1 (a single pipeline rank holds every layer)",
                ));
            }
        }
        Ok(())
    }

    /// Checks [`Self::offload_layers`] against a model of `layers` layers: fewer than the
    /// layers of the smallest model chunk (`⌊L / (pp·vpp)⌋`; with pp = vpp = 1 Megatron-Core's
    /// own bound, "CPU offloading can be done only for layers less than num_layers"
    /// [megatron/core/transformer/transformer_config.py `__post_init__`]).
    fn validate_offload(&self, layers: u32) -> Result<()> {
        let n = self.offloaded_layers();
        if n == 0 {
            return Ok(());
        }
        let chunks = (self.pp.max(1) as u64) * (self.vpp.max(1) as u64);
        let per_chunk = (layers as u64).checked_div(chunks).unwrap_or(0);
        if n as u64 >= per_chunk {
            let allowed = if per_chunk <= 1 {
                format!(
                    "null or 0: a model chunk of {per_chunk} layer(s) (L = {layers}, pp·vpp = \
                     {chunks}) has none to offload besides the one in flight"
                )
            } else {
                format!(
                    "0..{} (fewer than the {per_chunk} layers of a model chunk: L = {layers}, \
                     pp·vpp = {chunks})",
                    per_chunk - 1
                )
            };
            return Err(Error::invalid("plan.offload_layers", n, allowed));
        }
        Ok(())
    }

    /// Checks the fields that make a plan meaningless (not merely infeasible) for `num_gpus`.
    pub fn validate(&self, num_gpus: u32) -> Result<()> {
        for (field, v) in [
            ("plan.dp", self.dp),
            ("plan.tp", self.tp),
            ("plan.pp", self.pp),
            ("plan.ep", self.ep),
            ("plan.cp", self.cp),
            ("plan.vpp", self.vpp),
            ("plan.micro_batch", self.micro_batch),
        ] {
            limits::check(field, v)?;
        }
        limits::check("plan.zero", self.zero)?;
        if let Some(etp) = self.etp {
            limits::check("plan.etp", etp)?;
        }
        if let Some(n) = self.offload_layers {
            limits::check("plan.offload_layers", n)?;
        }
        self.check_fixed_stage_layers()?;
        if self.num_gpus() != num_gpus as u64 {
            let product = if self.folded() {
                "dp·tp·pp·cp (a folded plan: dp is the dense layers' data parallelism)"
            } else {
                "dp·tp·pp·ep·cp"
            };
            return Err(Error::invalid(
                "plan",
                format!("{product} = {}", self.num_gpus()),
                format!("a product equal to the cluster's {num_gpus} GPUs"),
            ));
        }
        if let Some(etp) = self.etp {
            let stage = self.dp as u64 * self.tp as u64 * self.cp as u64;
            let expert = etp as u64 * self.ep as u64;
            if stage % expert != 0 {
                return Err(Error::invalid(
                    "plan.etp",
                    etp,
                    format!(
                        "a degree with etp·ep dividing the {stage} ranks of a pipeline stage \
                         (dp·tp·cp; ep = {})",
                        self.ep
                    ),
                ));
            }
        }
        if let Some(m) = self.recompute_modules {
            if m.is_empty() {
                return Err(Error::invalid(
                    "plan.recompute_modules",
                    "[]",
                    MODULES_ALLOWED,
                ));
            }
            if self.recompute != Recompute::Selective {
                return Err(Error::invalid(
                    "plan.recompute_modules",
                    m,
                    format!(
                        "none with recompute = {} (modules need recompute = selective, Megatron's \
                         --recompute-granularity selective)",
                        self.recompute.name()
                    ),
                ));
            }
        }
        match (self.schedule(), self.vpp) {
            (Schedule::Interleaved, 1) => {
                return Err(Error::invalid(
                    "plan.vpp",
                    1,
                    "an integer >= 2 with the interleaved-1f1b schedule",
                ))
            }
            (s, v) if s != Schedule::Interleaved && v > 1 => {
                return Err(Error::invalid(
                    "plan.schedule",
                    s.name(),
                    format!("interleaved-1f1b (vpp = {v} needs it)"),
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dp={},tp={},pp={},ep={},cp={},vpp={},micro_batch={},zero={},recompute={},sequence_parallel={},schedule={}",
            self.dp,
            self.tp,
            self.pp,
            self.ep,
            self.cp,
            self.vpp,
            self.micro_batch,
            self.zero,
            self.recompute.name(),
            self.sequence_parallel,
            self.schedule().name()
        )?;
        // The default order is left out, so the usual plans read as they always have.
        if self.order != RankOrder::DEFAULT {
            write!(f, ",order={}", self.order)?;
        }
        if let Some(etp) = self.etp {
            write!(f, ",etp={etp}")?;
        }
        if let Some(d) = self.dispatcher {
            write!(f, ",dispatcher={}", d.name())?;
        }
        if self.ep_overlap {
            f.write_str(",ep_overlap=true")?;
        }
        if let Some(x) = self.cp_exchange {
            write!(f, ",cp_exchange={}", x.name())?;
        }
        if let Some(m) = self.recompute_modules {
            write!(f, ",recompute_modules={m}")?;
        }
        if let Some(n) = self.first_stage_layers {
            write!(f, ",first_stage_layers={n}")?;
        }
        if let Some(n) = self.last_stage_layers {
            write!(f, ",last_stage_layers={n}")?;
        }
        if let Some(n) = self.offload_layers {
            write!(f, ",offload_layers={n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_layers_must_leave_a_layer_of_each_chunk_on_the_gpu() {
        let plan: Plan =
            serde_json::from_str(r#"{"dp":8,"tp":1,"pp":1,"offload_layers":40}"#).unwrap();
        plan.validate(8).unwrap();
        plan.validate_split(80).unwrap();
        assert!(plan.to_string().ends_with(",offload_layers=40"));
        let e = plan.validate_split(40).unwrap_err().to_string();
        assert!(
            e.contains("plan.offload_layers") && e.contains("40") && e.contains("0..39"),
            "{e}"
        );
        // Per model chunk: 80 layers on pp 4 × vpp 5 are chunks of 4.
        let chunked = Plan {
            dp: 2,
            pp: 4,
            vpp: 5,
            offload_layers: Some(4),
            ..plan.clone()
        };
        let e = chunked.validate_split(80).unwrap_err().to_string();
        assert!(e.contains("0..3") && e.contains("pp·vpp = 20"), "{e}");
        Plan {
            offload_layers: Some(3),
            ..chunked
        }
        .validate_split(80)
        .unwrap();
        // 0 is off; a count beyond the limits is refused before the model is known.
        Plan {
            offload_layers: Some(0),
            ..plan.clone()
        }
        .validate_split(1)
        .unwrap();
        let e = Plan {
            offload_layers: Some(1 << 20),
            ..plan
        }
        .validate(8)
        .unwrap_err()
        .to_string();
        assert!(e.contains("plan.offload_layers"), "{e}");
    }

    #[test]
    fn the_default_plan_is_what_omitted_fields_mean() {
        let read: Plan = serde_json::from_str(r#"{"dp":1,"tp":1,"pp":1}"#).unwrap();
        assert_eq!(read, Plan::default());
        assert_eq!(Plan::default().num_gpus(), 1);
        Plan::default().validate(1).unwrap();
    }

    #[test]
    fn fixed_end_rank_layers_need_pp_and_an_equal_share_for_the_other_ranks() {
        let plan: Plan = serde_json::from_str(
            r#"{"dp":1,"tp":1,"pp":8,"vpp":4,"first_stage_layers":7,"last_stage_layers":6}"#,
        )
        .unwrap();
        plan.validate(8).unwrap();
        // DeepSeek-V3's `Et|(tt|)*30mL` on pp 8 × vpp 4: 7 + 6 · 8 + 6 = 61.
        plan.validate_split(61).unwrap();
        assert!(plan
            .to_string()
            .ends_with(",first_stage_layers=7,last_stage_layers=6"));
        let e = plan.validate_split(62).unwrap_err().to_string();
        assert!(
            e.contains("plan.first_stage_layers") && e.contains("49"),
            "{e}"
        );
        let e = plan.validate_split(12).unwrap_err().to_string();
        assert!(e.contains("at most the model's 12 layers"), "{e}");
        let single = Plan {
            dp: 8,
            pp: 1,
            vpp: 1,
            first_stage_layers: None,
            ..plan.clone()
        };
        let e = single.validate(8).unwrap_err().to_string();
        assert!(
            e.contains("plan.last_stage_layers") && e.contains("pp = 1"),
            "{e}"
        );
        let two = Plan {
            dp: 4,
            pp: 2,
            vpp: 1,
            ..plan
        };
        two.validate_split(13).unwrap();
        let e = two.validate_split(14).unwrap_err().to_string();
        assert!(e.contains("pp = 2"), "{e}");
    }

    #[test]
    fn degrees_whose_product_overflows_are_rejected() {
        // 24 · (2^32 − 1)^2 · 2863311531 is exactly 8 modulo 2^64: it must not pass as 8 GPUs.
        let plan = Plan {
            dp: 24,
            tp: u32::MAX,
            pp: u32::MAX,
            ep: 2_863_311_531,
            ..Plan::default()
        };
        let e = plan.validate(8).unwrap_err();
        assert!(e.to_string().contains("plan"), "{e}");
    }

    #[test]
    fn a_folded_plan_multiplies_without_ep_and_needs_etp_ep_to_divide_a_stage() {
        let mut plan: Plan =
            serde_json::from_str(r#"{"dp": 16, "tp": 2, "pp": 8, "ep": 32, "etp": 1}"#).unwrap();
        assert!(plan.folded());
        plan.validate(256).unwrap();
        assert!(plan.to_string().ends_with(",etp=1"));
        // ep·etp = 64 does not divide the 32 ranks of a stage.
        plan.etp = Some(2);
        let e = plan.validate(256).unwrap_err().to_string();
        assert!(e.contains("plan.etp") && e.contains("32 ranks"), "{e}");
        // The unfolded reading of the same numbers needs 8192 GPUs.
        plan.etp = None;
        let e = plan.validate(256).unwrap_err().to_string();
        assert!(e.contains("dp·tp·pp·ep·cp = 8192"), "{e}");
        for bad in [0u64, 1 << 31, 1 << 32, u64::MAX] {
            let text = format!(r#"{{"dp": 16, "tp": 2, "pp": 8, "ep": 32, "etp": {bad}}}"#);
            match serde_json::from_str::<Plan>(&text) {
                Ok(p) => {
                    let e = p.validate(256).unwrap_err().to_string();
                    assert!(e.contains("plan.etp"), "{bad}: {e}");
                }
                Err(e) => assert!(bad > u32::MAX as u64, "{bad}: {e}"),
            }
        }
    }

    #[test]
    fn rank_orders_parse_print_and_reject_non_permutations() {
        assert_eq!(
            RankOrder::parse("tp-cp-ep-dp-pp").unwrap(),
            RankOrder::DEFAULT
        );
        assert_eq!(RankOrder::DEFAULT.to_string(), "tp-cp-ep-dp-pp");
        let o = RankOrder::parse("TP,dp,cp,ep,pp").unwrap();
        assert_eq!(o.to_string(), "tp-dp-cp-ep-pp");
        for bad in [
            "",
            "tp-cp-ep-dp",
            "tp-cp-ep-dp-pp-tp",
            "tp-tp-ep-dp-pp",
            "tp-cp-ep-dp-xx",
        ] {
            let e = RankOrder::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("plan.order") && e.contains("exactly once"),
                "{bad}: {e}"
            );
        }
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(json, "\"tp-dp-cp-ep-pp\"");
        assert_eq!(serde_json::from_str::<RankOrder>(&json).unwrap(), o);
        assert!(serde_json::from_str::<RankOrder>("\"pp\"").is_err());
    }

    #[test]
    fn all_orders_are_the_120_distinct_permutations_default_first() {
        let all = RankOrder::all();
        assert_eq!(all.len(), 120);
        assert_eq!(all[0], RankOrder::DEFAULT);
        let mut set: Vec<RankOrder> = all.clone();
        set.sort();
        set.dedup();
        assert_eq!(set.len(), 120);
        assert!(all.iter().all(|o| RankOrder::new(o.axes()).is_ok()));
    }

    #[test]
    fn a_plan_without_an_order_gets_the_default_and_prints_it() {
        let plan: Plan = serde_json::from_str(r#"{"dp": 2, "tp": 4, "pp": 1}"#).unwrap();
        assert_eq!(plan.order, RankOrder::DEFAULT);
        assert!(!plan.to_string().contains("order"));
        let other = Plan {
            order: RankOrder::parse("tp-dp-cp-ep-pp").unwrap(),
            ..plan
        };
        assert!(other.to_string().ends_with(",order=tp-dp-cp-ep-pp"));
        let bad = serde_json::from_str::<Plan>(r#"{"dp": 2, "tp": 4, "pp": 1, "order": "tp"}"#);
        assert!(bad.unwrap_err().to_string().contains("exactly once"));
    }

    #[test]
    fn recompute_modules_parse_print_in_megatrons_order_and_need_selective() {
        let m = RecomputeModules::parse("layernorm+moe_act").unwrap();
        assert_eq!(m, RecomputeModules::parse("moe_act, LAYERNORM").unwrap());
        assert_eq!(m.to_string(), "moe_act+layernorm");
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"["moe_act","layernorm"]"#
        );
        let back: RecomputeModules = serde_json::from_str(r#"["layernorm","moe_act"]"#).unwrap();
        assert_eq!(back, m);
        let text: RecomputeModules = serde_json::from_str(r#""moe_act+layernorm""#).unwrap();
        assert_eq!(text, m);
        assert!(serde_json::from_str::<RecomputeModules>("[]").is_err());
        let e = RecomputeModules::parse("layernorm+attn")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("plan.recompute_modules") && e.contains("mla_up_proj"),
            "{e}"
        );
        assert_eq!(RecomputeModules::from_bits(m.bits()), m);
        let mut plan: Plan = serde_json::from_str(
            r#"{"dp":8,"tp":1,"pp":1,"recompute":"selective","recompute_modules":["moe"]}"#,
        )
        .unwrap();
        plan.validate(8).unwrap();
        assert!(
            plan.to_string().ends_with(",recompute_modules=moe"),
            "{plan}"
        );
        plan.recompute = Recompute::Full;
        let e = plan.validate(8).unwrap_err().to_string();
        assert!(
            e.contains("plan.recompute_modules") && e.contains("selective"),
            "{e}"
        );
    }
}

//! Training-stack behaviour: how a framework runs a plan, apart from the GPU it runs on (issue 16;
//! docs/costmodel.md §2.5, §3.6, §5.3). Device calibration (per GPU and precision) is in
//! [`crate::hardware::Calibration`] and [`crate::device`]; what a framework does — its DDP
//! buckets, FSDP units, kernel counts, casts, loss kernel, layer split — is a [`Stack`], read from
//! `data/stacks.toml` (each value with its source there). [`Stack::default_stack`] is
//! `megatron-core`, whose values reproduce the cost model's numbers exactly; a new stack is a new
//! table in that file.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::{check_fraction, check_positive, Precision};
use crate::model::Model;
use crate::plan::{
    CpExchange, Dispatcher, Plan, RankOrder, Recompute, RecomputeModule, RecomputeModules, Schedule,
};
use crate::rules::Rule;

/// The default stack's name.
pub const DEFAULT_STACK: &str = "megatron-core";

const STACKS_TOML: &str = include_str!("../data/stacks.toml");

/// How pipeline ranks split the layers (§2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerSplit {
    /// Megatron's `account_for_embedding/loss_in_pipeline_split`: when `L` is not a multiple
    /// of the rank count, the first and last ranks take one layer fewer
    /// ([`crate::stages::layer_counts`]).
    MegatronEmbeddingLoss,
}

/// How a stack can split a pipeline rank's layers into its `vpp` chunks (its exporter's
/// constraint, [`Rule::StackLayerSplit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PipelineSplit {
    /// Any split of the modelled per-rank layer counts, exported as a custom layout
    /// (Megatron's `--pipeline-model-parallel-layout`, torchtitan's
    /// `module_fqns_per_model_part`): every chunk holds a layer, except that the first rank's
    /// first chunk may hold only the embedding and the last rank's last chunk only the loss.
    Layout,
    /// Equal chunks only: with `pp > 1`, `L` a multiple of `pp·vpp` (DeepSpeed's uniform
    /// partition, which otherwise gives the extra layers to the first stages, not the split the
    /// cost model times).
    EvenChunks,
}

/// A parallel axis beside data parallelism.
/// Which folded MoE plans ([`Plan::etp`]) a stack can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExpertFolding {
    /// None: EP is carved out of data parallelism and the experts split `tp` ways.
    None,
    /// Expert TP 1 or `tp` (torchtitan).
    EtpOneOrTp,
    /// Any expert TP with `etp·ep` dividing a stage's ranks (Megatron-Core).
    Any,
}

impl ExpertFolding {
    /// Whether a folded plan of expert TP `etp` and TP `tp` is one the stack builds.
    pub fn allows(self, etp: u32, tp: u32) -> bool {
        match self {
            ExpertFolding::None => false,
            ExpertFolding::EtpOneOrTp => etp == 1 || etp == tp,
            ExpertFolding::Any => true,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExpertFolding::None => "none",
            ExpertFolding::EtpOneOrTp => "etp 1 or tp",
            ExpertFolding::Any => "any etp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StackAxis {
    Tp,
    Pp,
    Cp,
    Ep,
}

/// A training stack's behaviour; the field docs say where each value enters the cost model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stack {
    pub name: String,
    /// Parameters per data-parallel gradient bucket at least, each bucket a collective of its
    /// own (§3.6); a workload's `bucket_params` overrides the bucket size.
    pub ddp_bucket_params: f64,
    /// Parameters per bucket per rank of the data-parallel group: the bucket is
    /// `max(ddp_bucket_params, this · group size)` (Megatron's default, §3.6).
    pub ddp_bucket_params_per_rank: f64,
    /// Buckets are reduced as the backward produces them (Megatron `overlap_grad_reduce`),
    /// rather than after it (§3.6).
    pub overlap_grad_reduce: bool,
    /// The ZeRO-1/2 weight all-gather runs bucket by bucket under the next step's forward
    /// (Megatron `overlap_param_gather`), rather than after the optimizer step (§3.6).
    pub overlap_param_gather: bool,
    /// FSDP units per transformer layer under ZeRO-3, each gathered and reduce-scattered as a
    /// collective of its own (§3.6).
    pub fsdp_units_per_layer: f64,
    /// ZeRO-3 unit collectives across NVLink domains move each rank's bytes over its own NIC
    /// (`comm::Fabric::per_rank_nic`): the domain's NICs are not pooled the way NCCL's rings
    /// pool them (§3.6; DeepSpeed's 2021 ZeRO-3). False: the collective model's rings (§3.1).
    #[serde(default)]
    pub zero3_per_rank_nic: bool,
    /// Host and launch time of an MoE layer over that of a dense one (§5.3).
    pub moe_layer_kernel_factor: f64,
    /// Host issue time of one dropless MoE layer's forward and backward per micro-batch, µs,
    /// where the stack synchronises host and device inside the layer (the split sizes of the
    /// token exchange must reach the CPU) and no CUDA graph covers the MoE block: the layer
    /// takes at least this long (§5.5). 0: not modelled for the stack.
    #[serde(default)]
    pub moe_host_issue_us: f64,
    /// Bytes moved per element cast from 16 bits to 8 by FP8/FP4 linears (§5.3).
    pub quantized_cast_bytes: f64,
    /// Bytes moved per element of the transposed FP8 copy of a linear's input (§5.3).
    pub quantized_transpose_bytes: f64,
    /// Bytes moved per attention-score element by unfused softmax and dropout, forward (§5.3).
    pub unfused_score_bytes: f64,
    /// Flash-attention backward over forward matmul work (§5.2).
    pub attention_backward_ratio: f64,
    /// Passes over the fp32 logits by the softmax cross-entropy, 4 bytes per logit each (§5.3).
    pub cross_entropy_passes: f64,
    /// Bytes per hidden element the embedding lookup moves per token (§5.3).
    pub embedding_bytes_per_element: f64,
    /// Element-wise bytes per token and per `h` of a layer's forward outside the tensor-parallel
    /// regions — the two norms, residual adds and dropout — which every TP rank repeats on the
    /// whole sequence unless sequence parallelism splits it (§5.3); the rest of the GPU's
    /// `elementwise_bytes_per_hidden` is split `tp` ways either way.
    pub replicated_elementwise_bytes_per_hidden: f64,
    /// Bytes per element of a routed copy's hidden vector moved by permute and unpermute (§5.3).
    pub routed_copy_bytes_per_hidden: f64,
    /// Bytes per element of a routed copy's `f_e/t` width moved by the expert activation (§5.3).
    pub expert_activation_bytes_per_width: f64,
    /// Bytes per weight element a weight-gradient GEMM moves for its output (§5.2.2): 8 where
    /// it accumulates into an fp32 main gradient (read and written each micro-batch); absent,
    /// the GEMM's element size (the gradient written once in the training precision).
    #[serde(default)]
    pub wgrad_output_bytes: Option<f64>,
    /// Fraction of tensor-parallel communication hidden behind GEMMs (§3.4 ω_TP); a GPU's
    /// `calibration.tp_overlap`, when set, takes precedence.
    pub tp_overlap: f64,
    /// Share of the compute a DP/ZeRO collective runs under that hides it (§3.6 ω_DP): 1 when
    /// communication and compute share the GPU without slowing each other; a GPU's
    /// `calibration.dp_overlap`, when set, takes precedence.
    pub dp_overlap: f64,
    /// How pipeline ranks split the layers (§2.5).
    pub layer_split: LayerSplit,
    /// Multiplier on the GPU's achieved GEMM and attention efficiency (§5.2; 1 for the stack the
    /// GPU calibration was fitted on).
    pub kernel_efficiency: f64,
    /// Multiplier on the GPU's per-layer host and launch overhead (§5.3).
    pub layer_overhead_factor: f64,
    /// Training precisions the stack has.
    pub precisions: Vec<Precision>,
    /// Parallel axes beside data parallelism the stack can run (degree > 1).
    pub parallelism: Vec<StackAxis>,
    /// Which folded MoE plans ([`Plan::etp`]) the stack builds.
    pub expert_folding: ExpertFolding,
    /// MoE token dispatchers the stack has, and the one it uses unless told otherwise.
    pub dispatchers: Vec<Dispatcher>,
    pub default_dispatcher: Dispatcher,
    /// EP communication overlap settings the stack offers, and its default.
    pub ep_overlap: Vec<bool>,
    pub default_ep_overlap: bool,
    /// SMs the EP exchange kernels hold while they run beside compute under EP overlap (§3.7).
    #[serde(default)]
    pub ep_comm_sms: f64,
    /// Host time to issue one local expert's GEMM of a grouped GEMM, µs (Transformer Engine's
    /// `GroupedLinear`: one cuBLASLt call per expert over several streams). A routed-expert
    /// block's forward takes at least its grouped GEMMs' experts times this: the host
    /// synchronises on the tokens per expert just before it (§5.2.1). 0: not modelled.
    #[serde(default)]
    pub grouped_gemm_expert_issue_us: f64,
    /// How context parallelism exchanges K/V: the exchanges the stack has, and the one it uses
    /// unless told otherwise ([`Plan::cp_exchange`]).
    pub cp_exchanges: Vec<CpExchange>,
    pub default_cp_exchange: CpExchange,
    /// Rank orders the stack can build.
    pub orders: Vec<RankOrder>,
    /// Pipeline schedules the stack has.
    pub schedules: Vec<Schedule>,
    /// How a rank's layers may be split into its virtual chunks.
    pub pipeline_split: PipelineSplit,
    /// ZeRO stages the stack has without pipelining (`pp = 1`).
    pub zero: Vec<u8>,
    /// ZeRO stages the stack has with `pp > 1` (in place of `zero`: a stack may run a stage only
    /// under pipelining, as torchtitan's FSDP2 is ZeRO-1 only there).
    pub zero_with_pp: Vec<u8>,
    /// ZeRO stages allowed with `ep > 1`.
    pub zero_with_ep: Vec<u8>,
    /// ZeRO stages allowed with `tp > 1` or `cp > 1`.
    pub zero_with_tp_cp: Vec<u8>,
    /// Recompute modes the stack has.
    pub recompute: Vec<Recompute>,
    /// Modules of fine-grained selective recompute the stack can recompute
    /// ([`Plan::recompute_modules`]; empty: none, `selective` is core attention only).
    pub recompute_modules: Vec<RecomputeModule>,
    /// Sequence-parallel settings allowed with `tp > 1`.
    pub sequence_parallel: Vec<bool>,
    /// Whether the stack offloads the activations of whole layers to host memory
    /// ([`Plan::offload_layers`]).
    pub activation_offload: bool,
    /// Whether it does so with pipeline parallelism (`pp > 1`).
    pub activation_offload_with_pp: bool,
    /// Whether it does so together with a recompute mode other than none.
    pub activation_offload_with_recompute: bool,
}

/// Why a stack cannot run a plan: the rule and its one-line message.
pub type StackViolation = (Rule, String);

impl Stack {
    /// Checks every value is finite and positive; the error names the stack and the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("ddp_bucket_params", self.ddp_bucket_params),
            ("fsdp_units_per_layer", self.fsdp_units_per_layer),
            ("moe_layer_kernel_factor", self.moe_layer_kernel_factor),
            ("quantized_cast_bytes", self.quantized_cast_bytes),
            ("quantized_transpose_bytes", self.quantized_transpose_bytes),
            ("unfused_score_bytes", self.unfused_score_bytes),
            ("attention_backward_ratio", self.attention_backward_ratio),
            ("cross_entropy_passes", self.cross_entropy_passes),
            (
                "embedding_bytes_per_element",
                self.embedding_bytes_per_element,
            ),
            (
                "replicated_elementwise_bytes_per_hidden",
                self.replicated_elementwise_bytes_per_hidden,
            ),
            (
                "routed_copy_bytes_per_hidden",
                self.routed_copy_bytes_per_hidden,
            ),
            (
                "expert_activation_bytes_per_width",
                self.expert_activation_bytes_per_width,
            ),
            ("kernel_efficiency", self.kernel_efficiency),
            ("layer_overhead_factor", self.layer_overhead_factor),
        ] {
            check_positive(&format!("stack.{}.{field}", self.name), v)?;
        }
        if !(self.moe_host_issue_us.is_finite() && self.moe_host_issue_us >= 0.0) {
            return Err(Error::invalid(
                format!("stack.{}.moe_host_issue_us", self.name),
                self.moe_host_issue_us,
                "a finite number >= 0",
            ));
        }
        if !(self.ep_comm_sms.is_finite() && self.ep_comm_sms >= 0.0) {
            return Err(Error::invalid(
                format!("stack.{}.ep_comm_sms", self.name),
                self.ep_comm_sms,
                "a finite number >= 0",
            ));
        }
        if !(self.grouped_gemm_expert_issue_us.is_finite()
            && self.grouped_gemm_expert_issue_us >= 0.0)
        {
            return Err(Error::invalid(
                format!("stack.{}.grouped_gemm_expert_issue_us", self.name),
                self.grouped_gemm_expert_issue_us,
                "a finite number >= 0",
            ));
        }
        if let Some(v) = self.wgrad_output_bytes {
            check_positive(&format!("stack.{}.wgrad_output_bytes", self.name), v)?;
        }
        // 0 per rank: a fixed bucket size (PyTorch DDP, DeepSpeed, XLA's combine threshold).
        let per_rank = self.ddp_bucket_params_per_rank;
        if !(per_rank.is_finite() && per_rank >= 0.0) {
            return Err(Error::invalid(
                format!("stack.{}.ddp_bucket_params_per_rank", self.name),
                per_rank,
                "a finite number >= 0",
            ));
        }
        for (field, v) in [
            ("tp_overlap", self.tp_overlap),
            ("dp_overlap", self.dp_overlap),
        ] {
            check_fraction(&format!("stack.{}.{field}", self.name), v, 0.0, 1.0)?;
        }
        check_fraction(
            &format!("stack.{}.kernel_efficiency", self.name),
            self.kernel_efficiency,
            0.0,
            2.0,
        )?;
        for (field, empty) in [
            ("precisions", self.precisions.is_empty()),
            ("orders", self.orders.is_empty()),
            ("schedules", self.schedules.is_empty()),
            ("zero", self.zero.is_empty()),
            ("recompute", self.recompute.is_empty()),
            ("sequence_parallel", self.sequence_parallel.is_empty()),
        ] {
            if empty {
                return Err(Error::invalid(
                    format!("stack.{}.{field}", self.name),
                    "[]",
                    "at least one value",
                ));
            }
        }
        for (field, stages) in [
            ("zero", &self.zero),
            ("zero_with_pp", &self.zero_with_pp),
            ("zero_with_ep", &self.zero_with_ep),
            ("zero_with_tp_cp", &self.zero_with_tp_cp),
        ] {
            if let Some(z) = stages.iter().find(|z| **z > 3) {
                return Err(Error::invalid(
                    format!("stack.{}.{field}", self.name),
                    z,
                    "0, 1, 2 or 3",
                ));
            }
        }
        // A default the stack does not offer would refuse every plan that takes it.
        if !self.dispatchers.contains(&self.default_dispatcher) {
            return Err(Error::invalid(
                format!("stack.{}.default_dispatcher", self.name),
                self.default_dispatcher.name(),
                format!(
                    "one of the stack's dispatchers ({})",
                    list(self.dispatchers.iter().map(|d| d.name()))
                ),
            ));
        }
        if !self.cp_exchanges.contains(&self.default_cp_exchange) {
            return Err(Error::invalid(
                format!("stack.{}.default_cp_exchange", self.name),
                self.default_cp_exchange.name(),
                format!(
                    "one of the stack's cp_exchanges ({})",
                    list(self.cp_exchanges.iter().map(|x| x.name()))
                ),
            ));
        }
        if !self.ep_overlap.contains(&self.default_ep_overlap) {
            return Err(Error::invalid(
                format!("stack.{}.default_ep_overlap", self.name),
                self.default_ep_overlap,
                format!(
                    "one of the stack's ep_overlap settings ({})",
                    list(self.ep_overlap.iter())
                ),
            ));
        }
        Ok(())
    }

    /// Checks that this stack can run `plan` of `model` at `precision`, in the order of
    /// [`Rule::ALL`]; each broken rule goes to `sink` with its message (the sink returns
    /// `false` to stop early). These rules depend on the degrees, rank order, schedule and
    /// knobs only, never on the micro-batch, so the search applies them when it enumerates a
    /// tuple's knobs ([`crate::rules::Scope::Stack`]).
    pub fn rules(
        &self,
        model: &Model,
        precision: Precision,
        plan: &Plan,
        sink: &mut dyn FnMut(Rule, std::fmt::Arguments) -> bool,
    ) {
        let name = &self.name;
        macro_rules! rule {
            ($cond:expr, $key:expr, $($msg:tt)+) => {
                if $cond && !sink($key, format_args!($($msg)+)) {
                    return;
                }
            };
        }
        rule!(
            !self.precisions.contains(&precision),
            Rule::StackPrecision,
            "{name} has no {} training (it has {})",
            precision_name(precision),
            list(self.precisions.iter().map(|p| precision_name(*p)))
        );
        for (axis, degree, label) in [
            (StackAxis::Tp, plan.tp, "tp"),
            (StackAxis::Pp, plan.pp, "pp"),
            (StackAxis::Cp, plan.cp, "cp"),
            (StackAxis::Ep, plan.ep, "ep"),
        ] {
            rule!(
                degree > 1 && !self.parallelism.contains(&axis),
                Rule::StackParallelism,
                "{name} cannot run {label} = {degree} (it runs {label} = 1 only)"
            );
        }
        if let Some(etp) = plan.etp {
            rule!(
                !self.expert_folding.allows(etp, plan.tp),
                Rule::StackParallelism,
                "{name} cannot fold the experts as etp = {etp} with tp = {} (it folds: {})",
                plan.tp,
                self.expert_folding.name()
            );
        }
        if plan.ep > 1 {
            let dispatcher = self.dispatcher(plan);
            rule!(
                !self.dispatchers.contains(&dispatcher),
                Rule::StackParallelism,
                "{name} has no {} token dispatcher (it has {})",
                dispatcher.name(),
                list(self.dispatchers.iter().map(|d| d.name()))
            );
        }
        if plan.cp > 1 {
            let exchange = self.cp_exchange(plan);
            rule!(
                !self.cp_exchanges.contains(&exchange),
                Rule::StackParallelism,
                "{name} has no {} context-parallel exchange (it has {})",
                exchange.name(),
                list(self.cp_exchanges.iter().map(|x| x.name()))
            );
            // Ulysses splits each TP rank's heads and K/V groups over the CP ranks:
            // TransformerEngine's a2a asserts both divide by the CP size
            // [transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
            // AttnFuncWithCPAndQKVOA2A; DeepSpeed-Ulysses arXiv:2309.14509 §3.1].
            if exchange == CpExchange::AllToAll {
                let (heads, kv) = (model.heads, model.kv_heads.max(1));
                let split = plan.tp.saturating_mul(plan.cp);
                rule!(
                    heads % split != 0 || (model.mla.is_none() && kv % split != 0),
                    Rule::StackParallelism,
                    "{name}'s a2a context parallelism splits the heads over tp·cp = {split} ranks, but the model has {heads} heads and {kv} K/V groups (both must divide by tp·cp)"
                );
            }
        }
        if plan.ep_overlap {
            rule!(
                !self.ep_overlap.contains(&true),
                Rule::StackParallelism,
                "{name} has no EP communication overlap"
            );
            rule!(
                plan.ep <= 1,
                Rule::StackParallelism,
                "{name} overlaps EP communication only with expert parallelism (ep = 1)"
            );
            rule!(
                self.dispatcher(plan) == Dispatcher::AllGather,
                Rule::StackParallelism,
                "{name} overlaps EP communication with the alltoall or flex dispatcher only"
            );
        }
        rule!(
            !self.orders.contains(&plan.order),
            Rule::StackOrder,
            "{name} cannot build rank order {} (it builds {})",
            plan.order,
            list(self.orders.iter())
        );
        rule!(
            !self.schedules.contains(&plan.schedule()),
            Rule::StackSchedule,
            "{name} has no {} schedule (it has {})",
            plan.schedule().name(),
            list(self.schedules.iter().map(|s| s.name()))
        );
        rule!(
            plan.ep_overlap && plan.pp > 1 && plan.schedule() != Schedule::Interleaved,
            Rule::StackSchedule,
            "{name} overlaps EP communication under pipelining with interleaved-1f1b only"
        );
        if let Some(why) = self.split_problem(model, plan) {
            rule!(
                true,
                Rule::StackLayerSplit,
                "{name} cannot split the layers: {why}"
            );
        }
        let allowed = self.zero_stages(plan);
        rule!(
            !allowed.contains(&plan.zero),
            Rule::StackZero,
            "{name} has no ZeRO-{} for this plan (it allows {})",
            plan.zero,
            list(allowed.iter())
        );
        rule!(
            !self.recompute.contains(&plan.recompute),
            Rule::StackRecompute,
            "{name} has no {} recompute (it has {})",
            plan.recompute.name(),
            list(self.recompute.iter().map(|r| r.name()))
        );
        rule!(
            !self.recompute_allowed(plan, plan.recompute),
            Rule::StackRecompute,
            "{name} cannot overlap EP communication under full recompute"
        );
        if let Some(modules) = plan.recompute_modules {
            if let Some(why) = self.recompute_modules_problem(model, modules) {
                rule!(true, Rule::StackRecompute, "{name} {why}");
            }
        }
        if plan.offloaded_layers() > 0 {
            rule!(
                !self.activation_offload,
                Rule::StackRecompute,
                "{name} has no activation offloading (offload_layers = {})",
                plan.offloaded_layers()
            );
            rule!(
                self.activation_offload && plan.pp > 1 && !self.activation_offload_with_pp,
                Rule::StackRecompute,
                "{name} offloads activations only without pipeline parallelism (pp = 1)"
            );
            rule!(
                self.activation_offload
                    && plan.recompute != Recompute::None
                    && !self.activation_offload_with_recompute,
                Rule::StackRecompute,
                "{name} offloads activations only without recompute (recompute = none)"
            );
        }
        rule!(
            plan.tp > 1 && !self.sequence_parallel.contains(&plan.sequence_parallel),
            Rule::StackSequenceParallel,
            "{name} runs tp > 1 with sequence parallelism {} only",
            if plan.sequence_parallel { "off" } else { "on" }
        );
        rule!(
            plan.folded() && plan.tp > 1 && !plan.sequence_parallel,
            Rule::StackSequenceParallel,
            "{name} runs folded MoE layers with tp > 1 under sequence parallelism only \
             (each TP rank dispatches its own share of the tokens)"
        );
    }

    /// The context-parallel exchange of `plan` under this stack: its own, else the stack's
    /// default.
    pub fn cp_exchange(&self, plan: &Plan) -> CpExchange {
        plan.cp_exchange.unwrap_or(self.default_cp_exchange)
    }

    /// How many CP ranks `plan`'s exchange all-to-alls heads over (docs/costmodel.md §3.8):
    /// all `cp` for a2a; for a2a+p2p the largest divisor of `cp` that fits the CP ranks of
    /// `group` sharing an NVLink domain and divides the heads and K/V groups per TP rank (the
    /// ring runs over the rest, Megatron's `hierarchical_context_parallel_sizes`); 1 (none)
    /// for the ring and the all-gather.
    pub fn cp_a2a_ranks(&self, model: &Model, plan: &Plan, group: crate::layout::Group) -> u32 {
        match self.cp_exchange(plan) {
            CpExchange::Ring | CpExchange::AllGather => 1,
            CpExchange::AllToAll => plan.cp.max(1),
            CpExchange::AllToAllRing => {
                let tp = plan.tp.max(1);
                let heads = (model.heads / tp).max(1);
                let kv = if model.mla.is_some() {
                    heads
                } else {
                    (model.kv_heads / tp).max(1)
                };
                (1..=plan.cp.max(1).min(group.per_domain.max(1)))
                    .rev()
                    .find(|a| plan.cp % a == 0 && heads % a == 0 && kv % a == 0)
                    .unwrap_or(1)
            }
        }
    }

    /// The token dispatcher of `plan` under this stack: its own, else the stack's default.
    pub fn dispatcher(&self, plan: &Plan) -> Dispatcher {
        plan.dispatcher.unwrap_or(self.default_dispatcher)
    }

    /// Whether recompute mode `r` goes with the EP overlap setting of `plan` (Megatron's A2A
    /// overlap drives the layers' backward itself: no whole-layer recompute).
    pub fn recompute_allowed(&self, plan: &Plan, r: Recompute) -> bool {
        !(plan.ep_overlap && r == Recompute::Full)
    }

    /// Why this stack cannot recompute `modules` of `model` (`None`: it can): a module it does
    /// not offer, or `mla_up_proj` on a model without MLA (Megatron-Core raises "mla_up_proj in
    /// recompute_modules is only supported with multi_latent_attention"
    /// [megatron/core/transformer/transformer_config.py `__post_init__`]).
    pub fn recompute_modules_problem(
        &self,
        model: &Model,
        modules: RecomputeModules,
    ) -> Option<String> {
        let offered = RecomputeModules::of(&self.recompute_modules);
        if let Some(m) = modules.iter().find(|m| !offered.contains(*m)) {
            return Some(if self.recompute_modules.is_empty() {
                format!(
                    "has no fine-grained recompute modules ({} asked for)",
                    m.name()
                )
            } else {
                format!(
                    "cannot recompute the {} module (it has {})",
                    m.name(),
                    list(self.recompute_modules.iter().map(|m| m.name()))
                )
            });
        }
        if modules.contains(RecomputeModule::MlaUpProj) && model.mla.is_none() {
            return Some(
                "recomputes mla_up_proj only with multi-head latent attention (the model has none)"
                    .into(),
            );
        }
        None
    }

    /// The ZeRO stages this stack allows for the degrees of `plan`.
    pub fn zero_stages(&self, plan: &Plan) -> Vec<u8> {
        let stages = if plan.pp > 1 {
            &self.zero_with_pp
        } else {
            &self.zero
        };
        stages
            .iter()
            .copied()
            .filter(|z| plan.ep == 1 || self.zero_with_ep.contains(z))
            .filter(|z| (plan.tp == 1 && plan.cp == 1) || self.zero_with_tp_cp.contains(z))
            .collect()
    }

    /// Why this stack cannot split `model`'s layers as `plan` does ([`PipelineSplit`]), if it
    /// cannot.
    pub fn split_problem(&self, model: &Model, plan: &Plan) -> Option<String> {
        if plan.pp <= 1 {
            return None;
        }
        let layers = model.layers as u64;
        let chunks = plan.pp as u64 * plan.vpp as u64;
        match self.pipeline_split {
            PipelineSplit::EvenChunks
                if plan.first_stage_layers.is_some() || plan.last_stage_layers.is_some() =>
            {
                Some(
                    "splits the layers into equal chunks (no first/last stage layer counts)".into(),
                )
            }
            PipelineSplit::EvenChunks => (layers % chunks != 0).then(|| {
                format!("{layers} layers do not split into pp·vpp = {chunks} equal chunks")
            }),
            PipelineSplit::Layout => {
                // Every chunk holds a layer, except the first rank's first chunk (which may hold
                // only the embedding) and the last rank's last chunk (only the loss).
                let (pp, vpp) = (plan.pp as u64, plan.vpp as u64);
                let end_chunks = |r: u64| u64::from(r == 0) + u64::from(r == pp - 1);
                crate::stages::plan_layer_runs(model.layers, plan)
                    .into_iter()
                    .filter(|&(_, count, _)| count > 0)
                    .find_map(|(first, count, per_rank)| {
                        let (first, last) = (first as u64, first as u64 + count as u64 - 1);
                        let ends_in_run = if first == last {
                            u64::from(end_chunks(first) > 0)
                        } else {
                            u64::from(first == 0) + u64::from(last == pp - 1)
                        };
                        let has_inner = count as u64 > ends_in_run;
                        let needed = if has_inner {
                            vpp
                        } else {
                            vpp.saturating_sub(end_chunks(first).min(end_chunks(last)))
                        };
                        ((per_rank as u64) < needed).then(|| {
                            format!(
                                "a pipeline rank holds {per_rank} layers, fewer than the {needed} \
                                 of its vpp = {vpp} chunks that need one"
                            )
                        })
                    })
            }
        }
    }

    /// Parameters per DP gradient bucket over a data-parallel group of `ranks`:
    /// `max(ddp_bucket_params, ddp_bucket_params_per_rank · ranks)` (§3.6).
    pub fn bucket_params(&self, ranks: u32) -> f64 {
        self.ddp_bucket_params
            .max(self.ddp_bucket_params_per_rank * ranks as f64)
    }

    /// The stack called `name` in `data/stacks.toml` (case-insensitive, `_` for `-`).
    pub fn named(name: &str) -> Result<&'static Stack> {
        let table = stacks().as_ref().map_err(Clone::clone)?;
        // Timing contexts look the workload's (already canonical) name up per knob cell: no
        // allocation then, the normalised spelling only for other spellings.
        if let Some(stack) = table.get(name) {
            return Ok(stack);
        }
        let key = name.trim().to_lowercase().replace('_', "-");
        table.get(&key).ok_or_else(|| {
            Error::invalid(
                "workload.stack",
                name,
                format!(
                    "one of {}",
                    table.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// Every stack of `data/stacks.toml`, sorted by name.
    pub fn all() -> Result<Vec<Stack>> {
        let table = stacks().as_ref().map_err(Clone::clone)?;
        Ok(table.values().cloned().collect())
    }

    /// The default stack, `megatron-core` (its values reproduce the cost model of docs/costmodel.md).
    pub fn default_stack() -> &'static Stack {
        Stack::named(DEFAULT_STACK).expect("data/stacks.toml has a valid megatron-core table")
    }
}

/// Names of `items`, comma-separated.
fn list<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

fn precision_name(p: Precision) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{p:?}"))
}

type Table = std::result::Result<std::collections::BTreeMap<String, Stack>, Error>;

fn stacks() -> &'static Table {
    static STACKS: OnceLock<Table> = OnceLock::new();
    STACKS.get_or_init(|| {
        crate::presets::parse_table(STACKS_TOML, "data/stacks.toml", Stack::validate)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_core_is_the_default_and_holds_the_cost_model_values() {
        let s = Stack::default_stack();
        assert_eq!(s.name, "megatron-core");
        assert_eq!(s.ddp_bucket_params, 40e6);
        assert_eq!(s.fsdp_units_per_layer, 1.0);
        assert_eq!(s.moe_layer_kernel_factor, 2.0);
        assert_eq!(s.attention_backward_ratio, 2.5);
        assert_eq!(s.layer_split, LayerSplit::MegatronEmbeddingLoss);
        assert_eq!(s.tp_overlap, 0.7);
        assert_eq!(s.dp_overlap, 1.0);
        assert!(s.overlap_grad_reduce && s.overlap_param_gather);
        // Megatron's max(40 M, 1 M · data-parallel size).
        assert_eq!(s.bucket_params(8), 40e6);
        assert_eq!(s.bucket_params(256), 256e6);
    }

    #[test]
    fn stacks_off_the_calibration_reference_say_how_they_differ() {
        // torchtitan's PyTorch/torchao kernels below TE's (fitted on its H200 runs, whose GPU
        // constants come from Megatron runs alone); DeepSpeed's 2021 ZeRO-3 over one NIC per
        // rank, four partitioned weights per layer, half-overlapped (docs/costmodel.md §3.6).
        let tt = Stack::named("torchtitan").unwrap();
        assert!(
            (0.7..0.9).contains(&tt.kernel_efficiency),
            "{}",
            tt.kernel_efficiency
        );
        assert!(!tt.zero3_per_rank_nic);
        let ds = Stack::named("deepspeed").unwrap();
        assert!(ds.zero3_per_rank_nic);
        assert_eq!(ds.fsdp_units_per_layer, 4.0);
        assert_eq!(ds.dp_overlap, 0.5);
        assert!(!Stack::default_stack().zero3_per_rank_nic);
        assert!(!Stack::named("maxtext").unwrap().zero3_per_rank_nic);
    }

    #[test]
    fn only_megatron_core_offers_recompute_modules_and_mla_up_proj_needs_mla() {
        let megatron = Stack::default_stack();
        assert_eq!(megatron.recompute_modules.len(), RecomputeModule::ALL.len());
        let qwen = crate::presets::model("qwen3-30b-a3b").unwrap();
        let deepseek = crate::presets::model("deepseek-v3").unwrap();
        let parse = |t: &str| RecomputeModules::parse(t).unwrap();
        assert_eq!(
            megatron.recompute_modules_problem(&qwen, parse("layernorm+moe")),
            None
        );
        let why = megatron
            .recompute_modules_problem(&qwen, parse("mla_up_proj"))
            .unwrap();
        assert!(why.contains("multi-head latent attention"), "{why}");
        assert_eq!(
            megatron.recompute_modules_problem(&deepseek, parse("mla_up_proj+mlp")),
            None
        );
        for name in ["torchtitan", "deepspeed", "maxtext"] {
            let s = Stack::named(name).unwrap();
            assert!(s.recompute_modules.is_empty(), "{name}");
            let why = s
                .recompute_modules_problem(&qwen, parse("moe_act"))
                .unwrap();
            assert!(
                why.contains("no fine-grained recompute modules"),
                "{name}: {why}"
            );
        }
    }

    #[test]
    fn an_overlap_outside_zero_to_one_is_rejected_with_its_field() {
        let mut s = Stack::default_stack().clone();
        s.dp_overlap = 1.5;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("dp_overlap"), "{e}");
        s.dp_overlap = f64::NAN;
        assert!(s.validate().is_err());
    }

    #[test]
    fn a_gpu_override_takes_precedence_over_the_stack() {
        let stack = Stack::default_stack();
        let mut cal = crate::presets::gpu("h100-sxm").unwrap().calibration.clone();
        assert_eq!(cal.tp_overlap, None);
        assert_eq!(cal.tp_overlap_under(stack), stack.tp_overlap);
        cal.tp_overlap = Some(0.25);
        cal.dp_overlap = Some(0.0);
        assert_eq!(cal.tp_overlap_under(stack), 0.25);
        assert_eq!(cal.dp_overlap_under(stack), 0.0);
    }

    #[test]
    fn a_default_exchange_the_stack_does_not_offer_is_rejected() {
        let mut s = Stack::default_stack().clone();
        s.dispatchers = vec![Dispatcher::AllToAll];
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("default_dispatcher") && e.contains("alltoall"),
            "{e}"
        );
        let mut s = Stack::default_stack().clone();
        s.ep_overlap = vec![true];
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("default_ep_overlap"), "{e}");
    }

    #[test]
    fn an_unknown_stack_names_the_known_ones() {
        let e = Stack::named("deepspeed-0.1").unwrap_err().to_string();
        assert!(e.contains("megatron-core"), "{e}");
    }

    /// A plan of degrees `[dp, tp, pp, ep]` and `vpp` chunks per rank, every knob at its default.
    fn plan([dp, tp, pp, ep]: [u32; 4], vpp: u32) -> Plan {
        Plan {
            dp,
            tp,
            pp,
            ep,
            vpp,
            zero: 1,
            sequence_parallel: tp > 1,
            ..Plan::default()
        }
    }

    /// Why `stack` cannot split a `layers`-layer model as `plan` does.
    fn split(stack: &str, layers: u32, plan: Plan) -> Option<String> {
        let mut model = crate::presets::model("llama3-70b").unwrap();
        model.layers = layers;
        Stack::named(stack).unwrap().split_problem(&model, &plan)
    }

    #[test]
    fn the_layer_split_rule_follows_each_stack_exporter() {
        // The quick start's pp = 4, vpp = 15 on 80 layers: 20 layers a rank in 15 chunks is a
        // custom layout (Megatron's and torchtitan's exporters write it out).
        let quick_start = plan([32, 4, 4, 1], 15);
        assert_eq!(split("megatron-core", 80, quick_start.clone()), None);
        assert_eq!(split("torchtitan", 80, quick_start), None);
        // DeepSpeed's uniform partition needs equal stages: 80 layers on 3 do not split.
        let e = split("deepspeed", 80, plan([8, 1, 3, 1], 1)).unwrap();
        assert!(e.contains("pp·vpp = 3"), "{e}");
        assert_eq!(split("deepspeed", 80, plan([8, 1, 4, 1], 1)), None);
        assert_eq!(split("megatron-core", 80, plan([32, 4, 4, 1], 5)), None);
        // A layout needs a layer in every chunk: 20 layers a rank cannot fill 21 chunks.
        let e = split("megatron-core", 80, plan([32, 4, 4, 1], 21)).unwrap();
        assert!(
            e.contains("holds 20 layers") && e.contains("vpp = 21"),
            "{e}"
        );
        // 30 layers on 4 ranks split 7, 8, 8, 7 (the first and last rank one fewer): with
        // vpp = 8 the end ranks' embedding-only and loss-only chunks take the missing layer, so
        // the layout holds; vpp = 9 leaves a chunk of every rank empty (the first rank's 7
        // layers fill 7 of the 8 chunks beside its embedding chunk).
        assert_eq!(split("megatron-core", 30, plan([1, 1, 4, 1], 8)), None);
        let e = split("megatron-core", 30, plan([1, 1, 4, 1], 9)).unwrap();
        assert!(
            e.contains("holds 7 layers") && e.contains("the 8 of its vpp = 9"),
            "{e}"
        );
        // Without pipelining there is nothing to split, whatever the stack.
        for stack in ["megatron-core", "torchtitan", "deepspeed", "maxtext"] {
            assert_eq!(split(stack, 79, plan([8, 1, 1, 1], 1)), None);
        }
    }

    /// The rules `stack` breaks for `plan` of Qwen3-30B-A3B in bf16.
    fn broken(stack: &str, plan: &Plan) -> Vec<(Rule, String)> {
        let model = crate::presets::model("qwen3-30b-a3b").unwrap();
        let mut out = Vec::new();
        Stack::named(stack)
            .unwrap()
            .rules(&model, Precision::Bf16, plan, &mut |rule, msg| {
                out.push((rule, msg.to_string()));
                true
            });
        out
    }

    #[test]
    fn only_megatron_core_offloads_activations_and_only_unpipelined_without_recompute() {
        let plan = |pp: u32, recompute: &str| -> Plan {
            serde_json::from_str(&format!(
                r#"{{"dp":{},"tp":1,"pp":{pp},"recompute":"{recompute}","offload_layers":4}}"#,
                8 / pp
            ))
            .unwrap()
        };
        let offload = |stack: &str, p: &Plan| -> Vec<String> {
            broken(stack, p)
                .into_iter()
                .filter(|(_, m)| m.contains("offload"))
                .map(|(r, m)| {
                    assert_eq!(r, Rule::StackRecompute);
                    m
                })
                .collect()
        };
        assert!(offload("megatron-core", &plan(1, "none")).is_empty());
        let pp = offload("megatron-core", &plan(2, "none"));
        assert!(pp.len() == 1 && pp[0].contains("pp = 1"), "{pp:?}");
        let rec = offload("megatron-core", &plan(1, "full"));
        assert!(
            rec.len() == 1 && rec[0].contains("recompute = none"),
            "{rec:?}"
        );
        for stack in ["torchtitan", "deepspeed", "maxtext"] {
            let m = offload(stack, &plan(1, "none"));
            assert!(
                m.len() == 1 && m[0].contains("no activation offloading"),
                "{stack}: {m:?}"
            );
        }
        // Off, no stack objects.
        let mut off = plan(1, "full");
        off.offload_layers = Some(0);
        assert!(offload("deepspeed", &off).is_empty());
    }

    #[test]
    fn each_stack_folds_the_experts_as_its_data_says() {
        let folded = |etp, sp| Plan {
            etp: Some(etp),
            sequence_parallel: sp,
            ..plan([8, 4, 1, 16], 1)
        };
        assert!(broken("megatron-core", &folded(2, true)).is_empty());
        assert!(broken("megatron-core", &folded(1, true)).is_empty());
        // Megatron needs sequence parallelism for MoE layers with TP.
        let r = broken("megatron-core", &folded(1, false));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, Rule::StackSequenceParallel);
        assert!(r[0].1.contains("folded"), "{}", r[0].1);
        // torchtitan: expert TP 1 or tp only.
        assert!(broken("torchtitan", &folded(1, true))
            .iter()
            .all(|(rule, _)| *rule != Rule::StackParallelism));
        let r = broken("torchtitan", &folded(2, true));
        assert!(
            r.iter().any(|(rule, m)| *rule == Rule::StackParallelism
                && m.contains("etp = 2")
                && m.contains("etp 1 or tp")),
            "{r:?}"
        );
        // MaxText does not fold.
        let r = broken("maxtext", &folded(1, true));
        assert!(
            r.iter()
                .any(|(rule, m)| *rule == Rule::StackParallelism && m.contains("none")),
            "{r:?}"
        );
    }

    #[test]
    fn torchtitan_runs_zero_1_only_under_pipelining() {
        let titan = Stack::named("torchtitan").unwrap();
        assert_eq!(titan.zero_stages(&plan([8, 1, 1, 1], 1)), vec![0, 2, 3]);
        assert_eq!(titan.zero_stages(&plan([8, 1, 4, 1], 1)), vec![1]);
        assert_eq!(titan.zero_stages(&plan([8, 1, 1, 8], 1)), vec![2, 3]);
        // DDP only without other parallelism: FSDP2 with TP.
        assert_eq!(titan.zero_stages(&plan([8, 4, 1, 1], 1)), vec![2, 3]);
        assert_eq!(titan.zero_stages(&plan([8, 4, 4, 1], 1)), vec![1]);
        let deepspeed = Stack::named("deepspeed").unwrap();
        assert_eq!(deepspeed.zero_stages(&plan([8, 1, 4, 1], 1)), vec![0, 1]);
    }

    #[test]
    fn a_fixed_bucket_size_does_not_grow_with_the_group() {
        let titan = Stack::named("torchtitan").unwrap();
        assert_eq!(titan.bucket_params(8), 25e6);
        assert_eq!(titan.bucket_params(4096), 25e6);
        let mut s = titan.clone();
        s.ddp_bucket_params_per_rank = -1.0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("ddp_bucket_params_per_rank"), "{e}");
    }

    #[test]
    fn a_non_positive_value_is_rejected_with_its_field() {
        let mut s = Stack::default_stack().clone();
        s.cross_entropy_passes = 0.0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("cross_entropy_passes"), "{e}");
    }
}

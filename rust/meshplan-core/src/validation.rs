//! Holds the cost model against published training runs (the schema of
//! `validation/cases.json`): every representable case's published plan is evaluated and
//! compared with what was measured; optionally the search runs on the same problem to see where
//! the published plan ranks and how much better the planner thinks it could do.
//!
//! Unknown (null) fields get documented defaults, and every row lists the defaults it needed:
//!
//! | field | default |
//! |---|---|
//! | `model.head_dim` | `hidden / heads` |
//! | `model.kv_heads` | `heads` |
//! | `model.ffn_hidden` | the expert FFN size for MoE models without dense layers (unused) |
//! | `model.vocab` | 51,200 for GeLU (GPT-2 tokenizer padded, Megatron GPT), else 32,000 |
//! | `model.activation` | SwiGLU |
//! | `training.precision` | bf16 |
//! | `training.global_batch` | `4·pp` micro-batches per pipeline |
//! | `plan.micro_batch` | 1; torchtitan with PP: the data rank's batch over the stage count |
//! | `plan.zero` | 1 (Megatron's distributed optimizer) |
//! | `plan.sequence_parallel` | on when `tp > 1` |
//! | `plan.vpp` | 1 without pipelining, else the interleaving (1..=16) the model predicts fastest |
//! | `plan.recompute` | the least recompute (none, selective, full) that fits in memory |
//!
//! torchtitan's FSDP under pipeline parallelism keeps parameters unsharded through the step
//! (`fsdp_reshard_after_forward` defaults to False with PP), so those runs are ZeRO-1 plans.
//! torchtitan's "selective" activation checkpointing is its op-level policy
//! (`selective_ac_option = "op"`), and its loss is eager `F.cross_entropy` on fp32 logits.
//!
//! Llama 3's FSDP variant accumulates fp32 gradients over the micro-batches and reduce-scatters
//! them once per step (arXiv:2407.21783 §3.3.4), so its "ZeRO-2-like" runs are ZeRO-1 plans.
//!
//! Gradients are reduced in bf16 (2 bytes) for NVIDIA's NeMo, Megatron-Bridge and DGX Cloud
//! recipes, in fp32 for every other source (Megatron-LM's and torchtitan's defaults).
//!
//! Runs from Narayanan et al. 2021 and Korthikanti et al. 2022 predate fused attention in
//! Megatron; they are evaluated with `flash_attention = false` (what those papers describe).
//!
//! Every case is timed under the training stack that ran it (`stack`, a table of
//! `data/stacks.toml`): torchtitan's runs under `torchtitan`, SC21's ZeRO-3 comparison runs
//! (Table 2, DeepSpeed) under `deepspeed`, the DGX Cloud MaxText recipe under `maxtext`, every
//! other source under `megatron-core`; rows name it and the summary groups by it (`by_stack`).
//!
//! These framework facts of the sources are data, `data/sources.toml` (matched by the start of
//! the `source` string, a substring, or the start of the case id), not code. They include what a
//! source states about its cluster and overlap: vTrain's 800 Gb/s per 8-GPU node, gradients
//! reduced after the backward (vTrain, SimuMax) and TP communication overlap off (SimuMax).
//!
//! Keeping TP inside the NVLink domain is the search's policy, not a hardware limit: a published
//! plan whose TP spans domains is checked and searched with that policy lifted.
//!
//! Norm and embeddings follow the family: GeLU models are GPT-style (LayerNorm, tied
//! embeddings), SwiGLU models Llama-style (RMSNorm, untied).
//!
//! Throughput is compared as tokens/s per GPU. A source that reports only step time, model
//! TFLOP/s, hardware TFLOP/s (which counts recompute) or MFU is converted with the source's own
//! FLOP basis: Megatron-Bridge counts causal attention at half (`s/2`), every other source in
//! the file (NeMo 24.x, Narayanan 2021, Korthikanti 2022, Llama 3, torchtitan) at full `s`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::calibration::{apply_overrides, CalibrationOverrides};
use crate::error::{Error, Result};
use crate::evaluate::evaluate_in;
use crate::flops::{recompute_flops_per_token, train_flops_per_token, AttentionCounting};
use crate::hardware::{Cluster, Gpu, PerPrecision, Precision};
use crate::model::{Activation, LinearAttention, Mamba, Mla, Model, Moe, Norm};
use crate::plan::{CpExchange, Dispatcher, Plan, Recompute, RecomputeModules, Schedule};
use crate::report::Evaluation;
use crate::search::{search_counting_faster, Control};
use crate::space::{Degree, SearchSpace, DEFAULT_MAX_MICRO_BATCH, DEFAULT_MAX_VPP};
use crate::workload::Workload;
use crate::{presets, Problem};

/// One published run, as in the case file.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    pub id: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub task: Option<String>,
    pub model: CaseModel,
    pub cluster: CaseCluster,
    pub training: CaseTraining,
    pub plan: CasePlan,
    #[serde(default)]
    pub measured: Measured,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CaseModel {
    pub name: String,
    #[serde(default)]
    pub arch: Option<String>,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    #[serde(default)]
    pub kv_heads: Option<u32>,
    #[serde(default)]
    pub head_dim: Option<u32>,
    #[serde(default)]
    pub ffn_hidden: Option<u32>,
    #[serde(default)]
    pub vocab: Option<u32>,
    #[serde(default)]
    pub activation: Option<Activation>,
    #[serde(default)]
    pub moe: Option<CaseMoe>,
    #[serde(default)]
    pub mla: Option<Mla>,
    /// A hybrid stack's layers ([`Model::layer_pattern`]) and the parts its characters need.
    #[serde(default)]
    pub layer_pattern: Option<String>,
    #[serde(default)]
    pub mamba: Option<Mamba>,
    #[serde(default)]
    pub linear_attention: Option<LinearAttention>,
    #[serde(default)]
    pub sliding_window: Option<u32>,
    /// Multi-token-prediction depths the run trains with, and the MTP block's pattern.
    #[serde(default)]
    pub mtp_layers: Option<u32>,
    #[serde(default)]
    pub mtp_pattern: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CaseMoe {
    pub num_experts: u32,
    pub top_k: u32,
    pub expert_ffn_hidden: u32,
    #[serde(default)]
    pub shared_experts: Option<u32>,
    #[serde(default)]
    pub first_dense_layers: Option<u32>,
    /// Width of one shared expert (unset: `expert_ffn_hidden`).
    #[serde(default)]
    pub shared_expert_ffn_hidden: Option<u32>,
    /// Latent width of a latent MoE ([`Moe::latent_size`]).
    #[serde(default)]
    pub latent_size: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CaseCluster {
    pub gpu: String,
    pub num_gpus: u32,
    #[serde(default)]
    pub gpus_per_node: Option<u32>,
    #[serde(default)]
    pub nvlink_domain: Option<u32>,
    /// The maximum-achievable-matmul fraction of the dense peak measured on the run's own
    /// machine, per precision, where the run's source publishes a GEMM microbenchmark of it
    /// (validation/README.md): the GPU's GEMM efficiency at the run's precision is scaled by this
    /// over the preset's `matmul_efficiency` there ([`scale_to_machine`]).
    #[serde(default)]
    pub matmul_efficiency: Option<PerPrecision>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CaseTraining {
    #[serde(default)]
    pub global_batch: Option<u32>,
    pub seq_len: u32,
    #[serde(default)]
    pub precision: Option<Precision>,
    /// The adapters of a `task: "lora"` case, where the source states them; absent: the
    /// workload's defaults (Megatron-Bridge's rank 32 on every linear, 16-bit base).
    #[serde(default)]
    pub lora: Option<CaseLora>,
    /// The run's low-precision recipe (`data/precision.toml`), where its source names one.
    #[serde(default)]
    pub precision_recipe: Option<String>,
    /// The run's CUDA graphs (`none`, `partial`, `full`: [`crate::workload::CudaGraphs`]),
    /// where its recipe states them; absent: `none`.
    #[serde(default)]
    pub cuda_graphs: Option<crate::workload::CudaGraphs>,
}

/// A LoRA case's adapters (validation/README.md): `rank`, `targets` (`q`, `k`, `v`, `o`,
/// `mlp`) and `base` (`bf16`, `fp8`, `nf4`), each optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseLora {
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub targets: Option<Vec<crate::workload::LoraTarget>>,
    #[serde(default)]
    pub base: Option<crate::workload::BaseWeights>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CasePlan {
    pub dp: u32,
    pub tp: u32,
    pub pp: u32,
    #[serde(default)]
    pub ep: Option<u32>,
    #[serde(default)]
    pub cp: Option<u32>,
    #[serde(default)]
    pub vpp: Option<u32>,
    #[serde(default)]
    pub micro_batch: Option<u32>,
    #[serde(default)]
    pub zero: Option<u8>,
    #[serde(default)]
    pub recompute: Option<Recompute>,
    #[serde(default)]
    pub sequence_parallel: Option<bool>,
    /// Expert TP of a folded run (MoE parallel folding): `dp` is then the dense layers' data
    /// parallelism, GPUs/(tp·pp·cp) ([`Plan::etp`]).
    #[serde(default)]
    pub etp: Option<u32>,
    /// The MoE token dispatcher the run used, where its recipe states it (`None`: the stack's
    /// default, [`Plan::dispatcher`]).
    #[serde(default)]
    pub dispatcher: Option<Dispatcher>,
    /// EP communication overlap (Megatron `--overlap-moe-expert-parallel-comm`), where the
    /// recipe states it (`None`: the stack's default, [`Plan::ep_overlap`]).
    #[serde(default)]
    pub ep_overlap: Option<bool>,
    /// Context parallelism's exchange the run used (Megatron `--cp-comm-type`), when it is not
    /// its stack's default ([`Plan::cp_exchange`]).
    #[serde(default)]
    pub cp_exchange: Option<CpExchange>,
    /// Megatron-Core's selective-recompute modules the run used (`--recompute-modules`), where
    /// its recipe names them; with `recompute = selective` ([`Plan::recompute_modules`]).
    #[serde(default)]
    pub recompute_modules: Option<RecomputeModules>,
    /// The first / last pipeline rank's transformer layers where the run's recipe fixes them
    /// (a `--pipeline-model-parallel-layout` or `--decoder-first/last-pipeline-num-layers`,
    /// [`Plan::first_stage_layers`]).
    #[serde(default)]
    pub first_stage_layers: Option<u32>,
    #[serde(default)]
    pub last_stage_layers: Option<u32>,
    /// Transformer layers per model chunk whose activations the run offloaded to host memory
    /// (Megatron-Core `cpu_offloading_num_layers`, [`Plan::offload_layers`]).
    #[serde(default)]
    pub offload_layers: Option<u32>,
}

impl CasePlan {
    /// The dense layers' data parallelism: `dp·ep`, or `dp` of a folded run (saturating: a
    /// case file's degrees are unchecked until its plan is validated).
    fn dense_dp(&self) -> u32 {
        if self.etp.is_some() {
            self.dp
        } else {
            self.dp.saturating_mul(self.ep.unwrap_or(1))
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Measured {
    #[serde(default)]
    pub tokens_per_s_per_gpu: Option<f64>,
    #[serde(default)]
    pub step_time_s: Option<f64>,
    #[serde(default)]
    pub model_tflops_per_gpu: Option<f64>,
    #[serde(default)]
    pub hardware_tflops_per_gpu: Option<f64>,
    #[serde(default)]
    pub mfu: Option<f64>,
    #[serde(default)]
    pub peak_memory_gib: Option<f64>,
}

/// Options of a validation run.
#[derive(Debug, Clone, Default)]
pub struct ValidateOptions {
    /// Also search each case's problem (rank and regret of the published plan).
    pub search: bool,
    /// Calibration overrides applied to every case's GPU.
    pub calibration: Option<CalibrationOverrides>,
    /// Worker threads of the searches.
    pub threads: Option<usize>,
}

/// Memory comparison of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryCheck {
    pub measured_gib: f64,
    pub predicted_gib: f64,
    pub ape: f64,
}

/// One case of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseRow {
    pub id: String,
    pub gpu: String,
    pub arch: String,
    pub precision: String,
    pub task: String,
    /// The training stack that ran the case (`data/sources.toml`), which times it.
    #[serde(default = "default_stack_name")]
    pub stack: String,
    /// `ok`, `unrepresentable` or `error`.
    pub status: String,
    /// Why a case was not evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The plan evaluated, with defaults filled in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Fields that were null and got a default.
    pub defaults: Vec<String>,
    /// Which measurement the throughput comparison uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_tokens_per_s_per_gpu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_tokens_per_s_per_gpu: Option<f64>,
    /// |predicted / measured − 1|.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ape: Option<f64>,
    /// predicted / measured − 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_error: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feasible: Option<bool>,
    pub reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryCheck>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_s: Option<crate::report::TimeBreakdown>,
    /// With search: 1 + feasible plans the model predicts faster than the published one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// With search: best predicted / published predicted − 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regret: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_plan: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_tokens_per_s_per_gpu: Option<f64>,
}

fn default_stack_name() -> String {
    crate::stack::DEFAULT_STACK.to_string()
}

/// Throughput error statistics of a group of cases.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThroughputSummary {
    pub n: usize,
    pub median_ape: Option<f64>,
    pub p90_ape: Option<f64>,
    pub within_10pct: Option<f64>,
    pub within_20pct: Option<f64>,
    pub median_signed_error: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySummary {
    pub n: usize,
    pub median_ape: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegretSummary {
    pub n: usize,
    pub median: Option<f64>,
    pub p90: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub throughput: ThroughputSummary,
    pub memory: MemorySummary,
    /// Fraction of evaluated published plans judged feasible (with search only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feasible_recall: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regret: Option<RegretSummary>,
    pub by_gpu: BTreeMap<String, ThroughputSummary>,
    pub by_arch: BTreeMap<String, ThroughputSummary>,
    /// Per training stack (`data/sources.toml` maps each case's source to its stack).
    #[serde(default)]
    pub by_stack: BTreeMap<String, ThroughputSummary>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    pub cases: Vec<CaseRow>,
    pub summary: Summary,
}

/// A case of the file: fully parsed when representable; otherwise only what the report shows
/// (an unrepresentable case may leave required fields null).
#[derive(Debug, Clone)]
pub enum Entry {
    Case(Box<Case>),
    Unrepresentable(Box<CaseRow>),
}

fn text_at<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_str()
}

/// Parses the case file (a JSON list), naming the case and field of any schema error.
pub fn parse_cases(json_text: &str) -> Result<Vec<Entry>> {
    let values: Vec<serde_json::Value> = serde_json::from_str(json_text)
        .map_err(|e| Error::invalid("cases", e, "a JSON list of validation cases"))?;
    values
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let id = text_at(&v, &["id"]).unwrap_or("?").to_string();
            if v.get("representable").and_then(|r| r.as_bool()) == Some(false) {
                let text =
                    |path: &[&str], default: &str| text_at(&v, path).unwrap_or(default).to_string();
                let stack = SourceFacts::of_run(&text(&["source"], ""), &id).stack;
                let mut row = empty_row(
                    id,
                    text(&["cluster", "gpu"], "?"),
                    text(&["model", "arch"], "?"),
                    text(&["training", "precision"], "?"),
                    text(&["task"], "pretrain"),
                    stack.to_string(),
                );
                row.status = "unrepresentable".into();
                row.reason = Some(text(&["unrepresentable_reason"], "not representable"));
                return Ok(Entry::Unrepresentable(Box::new(row)));
            }
            serde_path_to_error::deserialize::<_, Case>(v)
                .map(|c| Entry::Case(Box::new(c)))
                .map_err(|e| Error::InvalidCase {
                    index,
                    id,
                    reason: format!("{}: {}", e.path(), e.inner()),
                })
        })
        .collect()
}

/// The run's own machine against the GPU's preset (`cluster.matmul_efficiency`): the GEMM
/// efficiency at `precision` ([`crate::device::gemm_efficiency`]) times the machine's measured
/// matmul fraction over the preset's `matmul_efficiency` there, both the best of a GEMM shape
/// sweep, so that a slower (power-capped, throttled) machine of the same GPU type is timed at its
/// own rate and fitting the GPU's efficiency on its runs yields the GPU's, not the machine's
/// (docs/calibration.md). Every fraction must lie in (0, 1]; a fraction at the run's precision
/// needs the preset's at that precision.
fn scale_to_machine(gpu: &mut Gpu, machine: &PerPrecision, precision: Precision) -> Result<()> {
    for p in machine.available() {
        let v = machine.get(p).unwrap_or_default();
        if !(v > 0.0 && v <= 1.0) {
            return Err(Error::invalid(
                format!("cluster.matmul_efficiency.{}", p.name()),
                v,
                "a fraction of the dense peak in (0, 1]",
            ));
        }
    }
    let Some(measured) = machine.get(precision) else {
        return Ok(());
    };
    let Some(reference) = gpu.calibration.matmul_efficiency.get(precision) else {
        return Err(Error::invalid(
            format!("cluster.matmul_efficiency.{}", precision.name()),
            measured,
            format!(
                "a precision whose matmul_efficiency the {} preset records (none at {})",
                gpu.name,
                precision.name()
            ),
        ));
    };
    let efficiency = crate::device::gemm_efficiency(gpu, precision);
    gpu.calibration
        .gemm_efficiency
        .set(precision, efficiency * measured / reference);
    Ok(())
}

const SOURCES_TOML: &str = include_str!("../data/sources.toml");

/// One `[[source]]` of `data/sources.toml`: the framework facts of the published runs whose
/// source string starts with `prefix` (or contains `contains`, or whose case id starts with
/// `id_prefix`); unset fields keep the defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceEntry {
    prefix: Option<String>,
    contains: Option<String>,
    id_prefix: Option<String>,
    /// The training stack that ran the cases (a table of `data/stacks.toml`).
    stack: Option<String>,
    /// Bytes per gradient element in the reduction and main-grad buffers.
    grad_bytes: Option<u32>,
    /// Fused (flash) attention; `false` materialises the `a·s²` scores.
    flash_attention: Option<bool>,
    /// A fused (bf16) loss; `false` is an eager fp32 cross-entropy.
    fused_cross_entropy: Option<bool>,
    /// The fused loss writes its gradient into the 16-bit logits (TransformerEngine's).
    cross_entropy_in_place: Option<bool>,
    /// The source's "selective" recompute is op-level selective checkpointing.
    selective_is_op_level: Option<bool>,
    /// Without a stated micro-batch, each data rank's batch is split into one micro-batch per
    /// pipeline stage (else micro-batch 1).
    micro_batches_per_stage: Option<bool>,
    /// FSDP (ZeRO-3) under pipeline parallelism keeps parameters unsharded: ZeRO-1.
    fsdp_under_pp_is_zero1: Option<bool>,
    /// ZeRO-2 as stated accumulates gradients and reduce-scatters once per step: ZeRO-1.
    zero2_reduces_once: Option<bool>,
    /// Reported FLOPs count causal attention at `s/2` (else the full square).
    causal_flops: Option<bool>,
    /// Routing imbalance λ of the runs (the workload's `moe_imbalance`): 1 where the source
    /// force-balances routing.
    moe_imbalance: Option<f64>,
    /// Scale-out bandwidth per GPU of the source's cluster, GB/s per direction, where it differs
    /// from the GPU preset's (the cluster stated by the source, not a fit).
    network_bandwidth_gbps: Option<f64>,
    /// Gradients are reduced after the backward (no bucketed overlap): nothing hides the
    /// data-parallel reduction (the GPU's `dp_overlap` is 0 for these runs, as in the deepspeed
    /// profile of `data/stacks.toml`).
    grads_reduced_after_backward: Option<bool>,
    /// Tensor-parallel communication overlap (Transformer Engine userbuffers); `false` leaves
    /// every TP/SP collective exposed (the GPU's `tp_overlap` is 0 for these runs).
    tp_comm_overlap: Option<bool>,
    /// LoRA rank of the source's `task: "lora"` runs where a case does not state it.
    lora_rank: Option<u32>,
    /// LoRA targets of the source's `task: "lora"` runs where a case does not state them.
    lora_targets: Option<Vec<crate::workload::LoraTarget>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourcesFile {
    source: Vec<SourceEntry>,
}

/// The framework facts of one source, after every matching entry of `data/sources.toml`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SourceFacts {
    stack: &'static str,
    grad_bytes: u32,
    flash_attention: bool,
    fused_cross_entropy: bool,
    cross_entropy_in_place: bool,
    selective_is_op_level: bool,
    micro_batches_per_stage: bool,
    fsdp_under_pp_is_zero1: bool,
    zero2_reduces_once: bool,
    counting: AttentionCounting,
    moe_imbalance: f64,
    network_bandwidth_gbps: Option<f64>,
    grads_reduced_after_backward: bool,
    tp_comm_overlap: bool,
    lora_rank: Option<u32>,
    lora_targets: Option<&'static [crate::workload::LoraTarget]>,
}

impl SourceFacts {
    /// Megatron-LM's defaults: fp32 gradients, flash attention, a fused loss, Megatron's
    /// recompute and ZeRO, micro-batch 1, FLOPs over the full square.
    const DEFAULT: SourceFacts = SourceFacts {
        stack: crate::stack::DEFAULT_STACK,
        grad_bytes: 4,
        flash_attention: true,
        fused_cross_entropy: true,
        cross_entropy_in_place: false,
        selective_is_op_level: false,
        micro_batches_per_stage: false,
        fsdp_under_pp_is_zero1: false,
        zero2_reduces_once: false,
        counting: AttentionCounting::Full,
        moe_imbalance: crate::workload::DEFAULT_MOE_IMBALANCE,
        network_bandwidth_gbps: None,
        grads_reduced_after_backward: false,
        tp_comm_overlap: true,
        lora_rank: None,
        lora_targets: None,
    };

    /// The facts of the runs of `source`, whatever their ids.
    #[cfg(test)]
    fn of(source: &str) -> SourceFacts {
        SourceFacts::of_run(source, "")
    }

    /// The facts of `case`.
    fn of_case(case: &Case) -> SourceFacts {
        SourceFacts::of_run(&case.source, &case.id)
    }

    /// The facts of the run `id` of `source`.
    fn of_run(source: &str, id: &str) -> SourceFacts {
        let mut f = SourceFacts::DEFAULT;
        for e in source_entries() {
            let matches = e.prefix.as_deref().is_some_and(|p| source.starts_with(p))
                || e.contains.as_deref().is_some_and(|c| source.contains(c))
                || e.id_prefix.as_deref().is_some_and(|p| id.starts_with(p));
            if !matches {
                continue;
            }
            f.stack = e.stack.as_deref().unwrap_or(f.stack);
            f.grad_bytes = e.grad_bytes.unwrap_or(f.grad_bytes);
            f.flash_attention = e.flash_attention.unwrap_or(f.flash_attention);
            f.fused_cross_entropy = e.fused_cross_entropy.unwrap_or(f.fused_cross_entropy);
            f.cross_entropy_in_place = e.cross_entropy_in_place.unwrap_or(f.cross_entropy_in_place);
            f.selective_is_op_level = e.selective_is_op_level.unwrap_or(f.selective_is_op_level);
            f.micro_batches_per_stage = e
                .micro_batches_per_stage
                .unwrap_or(f.micro_batches_per_stage);
            f.fsdp_under_pp_is_zero1 = e.fsdp_under_pp_is_zero1.unwrap_or(f.fsdp_under_pp_is_zero1);
            f.zero2_reduces_once = e.zero2_reduces_once.unwrap_or(f.zero2_reduces_once);
            f.moe_imbalance = e.moe_imbalance.unwrap_or(f.moe_imbalance);
            f.network_bandwidth_gbps = e.network_bandwidth_gbps.or(f.network_bandwidth_gbps);
            f.grads_reduced_after_backward = e
                .grads_reduced_after_backward
                .unwrap_or(f.grads_reduced_after_backward);
            f.tp_comm_overlap = e.tp_comm_overlap.unwrap_or(f.tp_comm_overlap);
            f.lora_rank = e.lora_rank.or(f.lora_rank);
            f.lora_targets = e.lora_targets.as_deref().or(f.lora_targets);
            if let Some(causal) = e.causal_flops {
                f.counting = if causal {
                    AttentionCounting::Causal
                } else {
                    AttentionCounting::Full
                };
            }
        }
        f
    }

    /// The source's recompute mode in meshplan's terms (torchtitan's "selective" is op-level).
    fn recompute(&self, recompute: Recompute) -> Recompute {
        if recompute == Recompute::Selective && self.selective_is_op_level {
            Recompute::SelectiveOp
        } else {
            recompute
        }
    }
}

/// The entries of `data/sources.toml` (embedded; checked by this module's tests).
fn source_entries() -> &'static [SourceEntry] {
    static ENTRIES: std::sync::OnceLock<Vec<SourceEntry>> = std::sync::OnceLock::new();
    ENTRIES.get_or_init(|| {
        toml::from_str::<SourcesFile>(SOURCES_TOML)
            .map(|f| f.source)
            .expect("data/sources.toml is a list of [[source]] tables")
    })
}

/// The case's model, cluster and workload, with the defaults it needed.
fn problem_of(
    case: &Case,
    overrides: Option<&CalibrationOverrides>,
    defaults: &mut Vec<String>,
) -> Result<Problem> {
    let m = &case.model;
    let activation = m.activation.unwrap_or_else(|| {
        defaults.push("model.activation".into());
        Activation::Swiglu
    });
    let gpt_style = activation == Activation::Gelu;
    let moe = m.moe.as_ref().map(|x| Moe {
        num_experts: x.num_experts,
        top_k: x.top_k,
        expert_ffn_hidden: x.expert_ffn_hidden,
        shared_experts: x.shared_experts.unwrap_or(0),
        shared_expert_ffn_hidden: x.shared_expert_ffn_hidden,
        first_dense_layers: x.first_dense_layers.unwrap_or(0),
        latent_size: x.latent_size,
    });
    let ffn_hidden = match (m.ffn_hidden, &moe) {
        (Some(f), _) => f,
        (None, Some(x)) if x.first_dense_layers == 0 => x.expert_ffn_hidden,
        (None, _) => {
            return Err(Error::invalid(
                "model.ffn_hidden",
                "null",
                "a number (the model has dense FFN layers)",
            ))
        }
    };
    if m.ffn_hidden.is_none() {
        defaults.push("model.ffn_hidden".into());
    }
    let vocab = m.vocab.unwrap_or_else(|| {
        defaults.push("model.vocab".into());
        if gpt_style {
            51200
        } else {
            32000
        }
    });
    let kv_heads = m.kv_heads.unwrap_or_else(|| {
        defaults.push("model.kv_heads".into());
        m.heads
    });
    let model = Model {
        name: m.name.clone(),
        layers: m.layers,
        hidden: m.hidden,
        heads: m.heads,
        kv_heads,
        head_dim: if m.mla.is_some() { None } else { m.head_dim },
        ffn_hidden,
        vocab,
        activation,
        norm: if gpt_style {
            Norm::Layernorm
        } else {
            Norm::Rmsnorm
        },
        tied_embeddings: gpt_style,
        dropout: gpt_style,
        moe,
        mla: m.mla,
        layer_pattern: m.layer_pattern.clone(),
        mamba: m.mamba,
        linear_attention: m.linear_attention,
        sliding_window: m.sliding_window,
        mtp_layers: m.mtp_layers,
        mtp_pattern: m.mtp_pattern.clone(),
        attention_output_gate: false,
    };
    let mut gpu = presets::gpu(&case.cluster.gpu)?;
    if let Some(o) = overrides {
        apply_overrides(o, &mut gpu)?;
    }
    let facts = SourceFacts::of_case(case);
    if let Some(net) = facts.network_bandwidth_gbps {
        gpu.network_bandwidth_gbps = net;
    }
    if facts.grads_reduced_after_backward {
        gpu.calibration.dp_overlap = Some(0.0);
    }
    if !facts.tp_comm_overlap {
        gpu.calibration.tp_overlap = Some(0.0);
    }
    let precision = case.training.precision.unwrap_or_else(|| {
        defaults.push("training.precision".into());
        Precision::Bf16
    });
    if let Some(machine) = &case.cluster.matmul_efficiency {
        scale_to_machine(&mut gpu, machine, precision)?;
    }
    let cluster = Cluster {
        gpu,
        num_gpus: case.cluster.num_gpus,
        gpus_per_node: case.cluster.gpus_per_node,
        nvlink_domain: case.cluster.nvlink_domain,
    };
    let p = &case.plan;
    let per_step = p.dense_dp().saturating_mul(p.micro_batch.unwrap_or(1));
    let global_batch = case.training.global_batch.unwrap_or_else(|| {
        defaults.push("training.global_batch".into());
        per_step.saturating_mul(4).saturating_mul(p.pp)
    });
    let mut workload = Workload::new(global_batch, case.training.seq_len);
    workload.precision = precision;
    workload.lora = case.task.as_deref() == Some("lora");
    if let Some(rank) = facts.lora_rank {
        workload.lora_rank = rank;
    }
    if let Some(targets) = facts.lora_targets {
        workload.lora_targets = targets.to_vec();
    }
    if let Some(l) = &case.training.lora {
        if let Some(rank) = l.rank {
            workload.lora_rank = rank;
        }
        if let Some(targets) = &l.targets {
            workload.lora_targets = targets.clone();
        }
        if let Some(base) = l.base {
            workload.lora_base = base;
        }
    }
    workload.grad_bytes = facts.grad_bytes;
    workload.flash_attention = facts.flash_attention;
    workload.fused_cross_entropy = facts.fused_cross_entropy;
    workload.cross_entropy_in_place = facts.cross_entropy_in_place;
    workload.stack = facts.stack.to_string();
    workload.moe_imbalance = facts.moe_imbalance;
    workload.precision_recipe = case.training.precision_recipe.clone();
    workload.cuda_graphs = case.training.cuda_graphs.unwrap_or_default();
    Problem::new(model, cluster, workload)
}

/// The micro-batch of a case that does not state it: sources with `micro_batches_per_stage`
/// (torchtitan, Dec 2024: `pipeline_parallel_microbatches` defaults to the stage count) split
/// each data rank's batch into as many pipeline micro-batches as there are stages; everything
/// else uses 1.
fn default_micro_batch(problem: &Problem, case: &Case) -> u32 {
    let p = &case.plan;
    let replicas = p.dense_dp();
    if SourceFacts::of_case(case).micro_batches_per_stage && p.pp > 1 {
        (problem.workload.global_batch / replicas.max(1) / p.pp).max(1)
    } else {
        1
    }
}

/// Picks the published plan, filling unknown knobs (see the module docs).
fn published_plan(
    problem: &Problem,
    case: &Case,
    space: &SearchSpace,
    defaults: &mut Vec<String>,
) -> Result<Evaluation> {
    let p = &case.plan;
    let mut base = Plan {
        dp: p.dp,
        tp: p.tp,
        pp: p.pp,
        ep: p.ep.unwrap_or(1),
        cp: p.cp.unwrap_or(1),
        vpp: 1,
        micro_batch: p
            .micro_batch
            .unwrap_or_else(|| default_micro_batch(problem, case)),
        zero: match p.zero {
            // torchtitan does not reshard FSDP parameters after forward when pipelining
            // (`fsdp_reshard_after_forward = "default"`): parameters and gradients stay
            // unsharded through the step and only the optimizer state is sharded — ZeRO-1.
            Some(3) if p.pp > 1 && SourceFacts::of_case(case).fsdp_under_pp_is_zero1 => {
                defaults.push(
                    "plan.zero=1 (torchtitan FSDP under PP keeps parameters unsharded)".into(),
                );
                1
            }
            // Llama 3 accumulates fp32 gradients over the micro-batches of a step and
            // reduce-scatters them once ("we use FP32 gradient accumulation during backward
            // computation over multiple micro-batches and also reduce-scatter gradients in FP32
            // across data parallel workers in FSDP", arXiv:2407.21783 §3.3.4): the gradient
            // buffer is whole through the step and reduced once — ZeRO-1, not a per-micro-batch
            // ZeRO-2 reduction.
            Some(2) if SourceFacts::of_case(case).zero2_reduces_once => {
                defaults.push(
                    "plan.zero=1 (Llama 3 accumulates fp32 gradients, reduce-scatters once per step)"
                        .into(),
                );
                1
            }
            z => z.unwrap_or(1),
        },
        recompute: p.recompute.unwrap_or(Recompute::None),
        sequence_parallel: p.sequence_parallel.unwrap_or(p.tp > 1),
        schedule: None,
        order: Default::default(),
        etp: p.etp,
        dispatcher: p.dispatcher,
        ep_overlap: p.ep_overlap.unwrap_or(false),
        cp_exchange: p.cp_exchange,
        recompute_modules: p.recompute_modules,
        first_stage_layers: p.first_stage_layers,
        last_stage_layers: p.last_stage_layers,
        offload_layers: p.offload_layers,
    };
    for (field, missing) in [
        ("plan.micro_batch", p.micro_batch.is_none()),
        ("plan.zero", p.zero.is_none()),
        ("plan.sequence_parallel", p.sequence_parallel.is_none()),
    ] {
        if missing {
            defaults.push(field.into());
        }
    }
    let vpps: Vec<u32> = match p.vpp {
        Some(v) => vec![v],
        None if p.pp == 1 => vec![1],
        None => {
            defaults.push("plan.vpp".into());
            (1..=DEFAULT_MAX_VPP)
                .filter(|v| p.pp * v <= problem.model.layers)
                .collect()
        }
    };
    let recomputes: Vec<Recompute> = match p.recompute {
        Some(r) => vec![SourceFacts::of_case(case).recompute(r)],
        None => {
            defaults.push("plan.recompute".into());
            Recompute::DEFAULT.to_vec()
        }
    };
    let mut fallback: Option<Evaluation> = None;
    for rec in recomputes {
        let mut best: Option<Evaluation> = None;
        for &v in &vpps {
            base.recompute = rec;
            base.recompute_modules = p.recompute_modules.filter(|_| rec == Recompute::Selective);
            base.vpp = v;
            base.schedule = Some(if v > 1 {
                Schedule::Interleaved
            } else {
                Schedule::OneFOneB
            });
            let e = evaluate_in(problem, &base, space)?;
            let better = |b: &Evaluation| e.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu;
            if e.feasible && best.as_ref().is_none_or(better) {
                best = Some(e.clone());
            }
            if fallback.as_ref().is_none_or(better) {
                fallback = Some(e);
            }
        }
        if let Some(b) = best {
            return Ok(b);
        }
    }
    Ok(fallback.expect("at least one vpp candidate"))
}

/// The measured throughput as tokens/s per GPU, and which measurement it came from.
fn measured_tokens(case: &Case, problem: &Problem, plan: &Plan) -> Option<(String, f64)> {
    let m = &case.measured;
    let w = &problem.workload;
    let n = problem.cluster.num_gpus as f64;
    let counting = SourceFacts::of_case(case).counting;
    let flops_per_token = train_flops_per_token(&problem.model, w, counting);
    if let Some(t) = m.tokens_per_s_per_gpu {
        return Some(("tokens_per_s_per_gpu".into(), t));
    }
    if let Some(s) = m.step_time_s {
        return Some(("step_time_s".into(), w.tokens_per_step() / (s * n)));
    }
    if let Some(tf) = m.model_tflops_per_gpu {
        return Some(("model_tflops_per_gpu".into(), tf * 1e12 / flops_per_token));
    }
    if let Some(tf) = m.hardware_tflops_per_gpu {
        let recompute = recompute_flops_per_token(
            &problem.model,
            plan.recompute,
            plan.recompute_modules,
            w.seq_len as f64,
            counting,
        );
        return Some((
            "hardware_tflops_per_gpu".into(),
            tf * 1e12 / (flops_per_token + recompute),
        ));
    }
    if let Some(mfu) = m.mfu {
        let peak = problem.cluster.gpu.peak_tflops.get(w.precision)? * 1e12;
        return Some(("mfu".into(), mfu * peak / flops_per_token));
    }
    None
}

fn base_row(case: &Case) -> CaseRow {
    let arch = case.model.arch.clone().unwrap_or_else(|| {
        if case.model.moe.is_some() {
            "moe".into()
        } else {
            "dense".into()
        }
    });
    empty_row(
        case.id.clone(),
        case.cluster.gpu.clone(),
        arch,
        case.training
            .precision
            .map_or("bf16", |p| p.name())
            .to_string(),
        case.task.clone().unwrap_or_else(|| "pretrain".into()),
        SourceFacts::of_case(case).stack.to_string(),
    )
}

fn empty_row(
    id: String,
    gpu: String,
    arch: String,
    precision: String,
    task: String,
    stack: String,
) -> CaseRow {
    CaseRow {
        id,
        gpu,
        arch,
        precision,
        task,
        stack,
        status: "ok".into(),
        reason: None,
        plan: None,
        defaults: Vec::new(),
        metric: None,
        measured_tokens_per_s_per_gpu: None,
        predicted_tokens_per_s_per_gpu: None,
        ape: None,
        signed_error: None,
        feasible: None,
        reasons: Vec::new(),
        memory: None,
        time_s: None,
        rank: None,
        regret: None,
        best_plan: None,
        best_tokens_per_s_per_gpu: None,
    }
}

/// Evaluates one case; the row carries the failure instead of an error.
fn validate_case(case: &Case, options: &ValidateOptions) -> CaseRow {
    let mut row = base_row(case);
    match fill_row(case, options, &mut row) {
        Ok(()) => row,
        Err(e) => {
            row.status = "error".into();
            row.reason = Some(e.to_string());
            row
        }
    }
}

fn fill_row(case: &Case, options: &ValidateOptions, row: &mut CaseRow) -> Result<()> {
    let problem = problem_of(case, options.calibration.as_ref(), &mut row.defaults)?;
    let mb = case.plan.micro_batch.unwrap_or(1);
    let space = SearchSpace {
        micro_batch: Degree {
            fixed: None,
            min: None,
            max: Some(DEFAULT_MAX_MICRO_BATCH.max(mb)),
        },
        vpp: Degree {
            fixed: None,
            min: None,
            max: Some(DEFAULT_MAX_VPP.max(case.plan.vpp.unwrap_or(1))),
        },
        // Megatron's modes, plus the published one (torchtitan's op-level checkpointing).
        recompute: {
            let mut modes = Recompute::DEFAULT.to_vec();
            if let Some(r) = case
                .plan
                .recompute
                .map(|r| SourceFacts::of_case(case).recompute(r))
            {
                if !modes.contains(&r) {
                    modes.push(r);
                }
            }
            modes
        },
        // The published module set beside Megatron's default, where the row names one.
        recompute_modules: match case.plan.recompute_modules {
            Some(m) => vec![RecomputeModules::CORE_ATTN, m],
            None => Vec::new(),
        },
        // Keeping TP inside the NVLink domain is the search's policy, not a limit of the
        // hardware: a published run whose TP spans domains (vTrain's TP 16 over two 8-GPU nodes)
        // ran, so its source's policy is allowed when it is checked and searched.
        tp_within_domain: case.plan.tp <= problem.cluster.nvlink_domain(),
        top_k: 1,
        ..SearchSpace::default()
    };
    let e = published_plan(&problem, case, &space, &mut row.defaults)?;
    row.plan = Some(e.plan.to_string());
    row.feasible = Some(e.feasible);
    row.reasons = e.reasons.iter().map(|v| v.message.clone()).collect();
    row.predicted_tokens_per_s_per_gpu = Some(e.tokens_per_s_per_gpu);
    row.time_s = Some(e.time_s.clone());
    if let Some((metric, measured)) = measured_tokens(case, &problem, &e.plan) {
        let ratio = e.tokens_per_s_per_gpu / measured;
        row.metric = Some(metric);
        row.measured_tokens_per_s_per_gpu = Some(measured);
        row.ape = Some((ratio - 1.0).abs());
        row.signed_error = Some(ratio - 1.0);
    }
    if let Some(mem) = case.measured.peak_memory_gib {
        row.memory = Some(MemoryCheck {
            measured_gib: mem,
            predicted_gib: e.peak_memory_gib,
            ape: (e.peak_memory_gib / mem - 1.0).abs(),
        });
    }
    if options.search {
        let control = Control {
            threads: options.threads,
            ..Control::default()
        };
        let (result, faster) =
            search_counting_faster(&problem, &space, &control, e.tokens_per_s_per_gpu)?;
        if let Some(best) = result.plans.first() {
            row.best_plan = Some(best.plan.to_string());
            row.best_tokens_per_s_per_gpu = Some(best.tokens_per_s_per_gpu);
            row.regret = Some((best.tokens_per_s_per_gpu / e.tokens_per_s_per_gpu - 1.0).max(0.0));
        }
        if e.feasible {
            row.rank = Some(faster + 1);
        }
    }
    Ok(())
}

/// Linear-interpolation percentile (NumPy's default) of `values`, `q` in [0, 1].
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

fn throughput_summary<'a>(rows: impl Iterator<Item = &'a CaseRow>) -> ThroughputSummary {
    let (apes, signed): (Vec<f64>, Vec<f64>) =
        rows.filter_map(|r| Some((r.ape?, r.signed_error?))).unzip();
    let n = apes.len();
    let share = |limit: f64| {
        (n > 0).then(|| apes.iter().filter(|a| **a <= limit).count() as f64 / n as f64)
    };
    ThroughputSummary {
        n,
        median_ape: percentile(&apes, 0.5),
        p90_ape: percentile(&apes, 0.9),
        within_10pct: share(0.10),
        within_20pct: share(0.20),
        median_signed_error: percentile(&signed, 0.5),
    }
}

/// Summarises rows (see [`Summary`]).
pub fn summarise(rows: &[CaseRow], searched: bool) -> Summary {
    let ok: Vec<&CaseRow> = rows.iter().filter(|r| r.status == "ok").collect();
    let mem: Vec<f64> = ok
        .iter()
        .filter_map(|r| r.memory.as_ref().map(|m| m.ape))
        .collect();
    let group = |key: fn(&CaseRow) -> &str| {
        let mut keys: Vec<&str> = ok.iter().map(|r| key(r)).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .map(|k| {
                (
                    k.to_string(),
                    throughput_summary(ok.iter().copied().filter(|r| key(r) == k)),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    let (feasible_recall, regret) = if searched {
        let feasible = ok.iter().filter(|r| r.feasible == Some(true)).count();
        let regrets: Vec<f64> = ok.iter().filter_map(|r| r.regret).collect();
        (
            (!ok.is_empty()).then(|| feasible as f64 / ok.len() as f64),
            Some(RegretSummary {
                n: regrets.len(),
                median: percentile(&regrets, 0.5),
                p90: percentile(&regrets, 0.9),
            }),
        )
    } else {
        (None, None)
    };
    Summary {
        throughput: throughput_summary(ok.iter().copied()),
        memory: MemorySummary {
            n: mem.len(),
            median_ape: percentile(&mem, 0.5),
        },
        feasible_recall,
        regret,
        by_gpu: group(|r| r.gpu.as_str()),
        by_arch: group(|r| r.arch.as_str()),
        by_stack: group(|r| r.stack.as_str()),
    }
}

/// Validates every case of a case file (JSON text).
pub fn validate(json_text: &str, options: &ValidateOptions) -> Result<ValidationReport> {
    let cases = parse_cases(json_text)?;
    if let Some(o) = &options.calibration {
        crate::calibration::check_overrides(o)?;
    }
    let rows: Vec<CaseRow> = cases
        .iter()
        .map(|entry| match entry {
            Entry::Case(c) => validate_case(c, options),
            Entry::Unrepresentable(row) => (**row).clone(),
        })
        .collect();
    let summary = summarise(&rows, options.search);
    Ok(ValidationReport {
        cases: rows,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_entries_match_one_way() {
        for e in source_entries() {
            let keys = [
                e.prefix.is_some(),
                e.contains.is_some(),
                e.id_prefix.is_some(),
            ];
            assert_eq!(
                keys.iter().filter(|k| **k).count(),
                1,
                "a [[source]] needs exactly one of prefix, contains and id_prefix"
            );
            if let Some(stack) = &e.stack {
                assert!(
                    crate::stack::Stack::named(stack).is_ok(),
                    "unknown stack {stack}"
                );
            }
        }
    }

    #[test]
    fn source_facts_merge_every_matching_entry() {
        let bridge = SourceFacts::of("NVIDIA Megatron-Bridge (NeMo Framework) 25.09");
        assert_eq!(bridge.grad_bytes, 2);
        assert_eq!(bridge.counting, AttentionCounting::Causal);
        // Megatron-Bridge's MoE benchmarks force-balance routing; others keep the default λ.
        assert_eq!(bridge.moe_imbalance, 1.0);
        let titan = SourceFacts::of("torchtitan team (PyTorch), Dec-2024");
        assert!(titan.selective_is_op_level && !titan.fused_cross_entropy);
        assert_eq!(
            titan.recompute(Recompute::Selective),
            Recompute::SelectiveOp
        );
        assert!(!SourceFacts::of("Narayanan et al. 2021").flash_attention);
        assert!(SourceFacts::of("Llama Team, AI @ Meta 2024").zero2_reduces_once);
        assert_eq!(SourceFacts::of("someone else"), SourceFacts::DEFAULT);
        assert_eq!(titan.stack, "torchtitan");
        let sc21 = "Narayanan et al. 2021 (SC21, arXiv:2104.04473)";
        assert_eq!(SourceFacts::of(sc21).stack, "megatron-core");
        assert_eq!(
            SourceFacts::of_run(sc21, "narayanan21-t2-ZeRO-3-174.6B-384gpu").stack,
            "deepspeed"
        );
        let maxtext = "NVIDIA DGX Cloud Benchmarking recipe, MaxText (JAX) Llama3 70B (BF16)";
        assert_eq!(SourceFacts::of(maxtext).stack, "maxtext");
        // vTrain's cluster and Megatron-DeepSpeed model code; SimuMax's launchers.
        let vtrain = SourceFacts::of("VIA-Research/vTrain released validation measurements");
        assert_eq!(vtrain.network_bandwidth_gbps, Some(12.5));
        assert!(vtrain.grads_reduced_after_backward && !vtrain.flash_attention);
        assert!(vtrain.tp_comm_overlap);
        let simumax = SourceFacts::of("MooreThreads/SimuMax v1.2 B200 formal results");
        assert!(simumax.grads_reduced_after_backward && !simumax.tp_comm_overlap);
        assert_eq!(simumax.network_bandwidth_gbps, None);
    }

    #[test]
    fn source_cluster_and_overlap_facts_reach_the_problem() {
        let case: Case = serde_json::from_value(serde_json::json!({
            "id": "vtrain-x", "source": "VIA-Research/vTrain", "task": "pretrain",
            "model": {"name": "m", "layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096,
                      "vocab": 32000, "activation": "gelu"},
            "cluster": {"gpu": "a100-sxm-80g", "num_gpus": 16},
            "training": {"global_batch": 32, "seq_len": 1024, "precision": "fp16"},
            "plan": {"dp": 16, "tp": 1, "pp": 1, "ep": 1, "cp": 1},
            "measured": {"step_time_s": 1.0}
        }))
        .unwrap();
        let mut defaults = Vec::new();
        let p = problem_of(&case, None, &mut defaults).unwrap();
        assert_eq!(p.cluster.gpu.network_bandwidth_gbps, 12.5);
        assert_eq!(p.cluster.gpu.calibration.dp_overlap, Some(0.0));
        assert_eq!(p.cluster.gpu.calibration.tp_overlap, None);
        assert!(!p.workload.flash_attention);
        let mut other = case.clone();
        other.source = "someone else".into();
        let q = problem_of(&other, None, &mut defaults).unwrap();
        assert_eq!(q.cluster.gpu.network_bandwidth_gbps, 25.0);
        assert_eq!(q.cluster.gpu.calibration.dp_overlap, None);
    }

    #[test]
    fn a_cases_own_machine_scales_its_gemm_efficiency() {
        let case = |machine: serde_json::Value, precision: &str| -> Case {
            serde_json::from_value(serde_json::json!({
                "id": "simumax-x", "source": "MooreThreads/SimuMax", "task": "pretrain",
                "model": {"name": "m", "layers": 2, "hidden": 1024, "heads": 8,
                          "ffn_hidden": 4096, "vocab": 32000, "activation": "swiglu"},
                "cluster": {"gpu": "b200", "num_gpus": 8, "matmul_efficiency": machine},
                "training": {"global_batch": 8, "seq_len": 1024, "precision": precision},
                "plan": {"dp": 8, "tp": 1, "pp": 1, "ep": 1, "cp": 1},
                "measured": {"step_time_s": 1.0}
            }))
            .unwrap()
        };
        let preset = presets::gpu("b200").unwrap().calibration;
        let (fitted, fact) = (
            preset.gemm_efficiency.bf16.unwrap(),
            preset.matmul_efficiency.bf16.unwrap(),
        );
        let mut defaults = Vec::new();
        let p = problem_of(
            &case(serde_json::json!({"bf16": 0.655}), "bf16"),
            None,
            &mut defaults,
        )
        .unwrap();
        let scaled = p.cluster.gpu.calibration.gemm_efficiency.bf16.unwrap();
        assert!((scaled - fitted * 0.655 / fact).abs() < 1e-12);
        assert!(scaled < fitted);
        // A machine fact at another precision leaves the run's own precision alone.
        let p = problem_of(
            &case(serde_json::json!({"bf16": 0.655}), "fp8"),
            None,
            &mut defaults,
        )
        .unwrap();
        assert_eq!(
            p.cluster.gpu.calibration.gemm_efficiency,
            preset.gemm_efficiency
        );
        // Out-of-range fractions and a precision the preset has no fact for are named errors.
        for bad in [0.0, 1.5, -0.2] {
            let e = problem_of(
                &case(serde_json::json!({"bf16": bad}), "bf16"),
                None,
                &mut defaults,
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("cluster.matmul_efficiency.bf16") && e.contains("(0, 1]"),
                "{e}"
            );
        }
        let mut gpu = presets::gpu("h100-sxm-96g").unwrap();
        let machine = PerPrecision {
            bf16: Some(0.7),
            ..PerPrecision::default()
        };
        let e = scale_to_machine(&mut gpu, &machine, Precision::Bf16)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cluster.matmul_efficiency.bf16") && e.contains("h100-sxm-96g"),
            "{e}"
        );
    }

    #[test]
    fn percentile_interpolates_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), Some(2.5));
        assert!((percentile(&v, 0.9).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&[], 0.5), None);
    }
}

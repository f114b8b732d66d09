//! The serving problem (docs/serving.md §1): what to serve (a [`Model`] at a weight and a
//! KV-cache precision), on what (a [`Cluster`]), for which traffic ([`Traffic`]: prompt and output
//! lengths, shared-prefix fraction, target concurrency or request rate) and under which
//! service-level objectives ([`Slo`]), ranked by an [`Objective`].

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::{check_fraction, Cluster, Precision};
use crate::limits;
use crate::model::Model;

use super::constants;

/// The requests a deployment serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Traffic {
    /// Prompt tokens per request (ISL); 0 (unset) when `lengths` gives them.
    #[serde(default)]
    pub input_len: u32,
    /// Generated tokens per request (OSL), the first one included; 0 (unset) when `lengths`
    /// gives them.
    #[serde(default)]
    pub output_len: u32,
    /// A length distribution instead of one `input_len`/`output_len`: classes of requests, each
    /// with its lengths and its share of the requests (a histogram of a trace,
    /// docs/serving.md §1). Empty: every request has `input_len` and `output_len`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lengths: Vec<LengthClass>,
    /// Fraction of each prompt that is a prefix shared with earlier requests and found in the
    /// prefix cache: its prefill compute is skipped, its KV blocks are shared.
    #[serde(default)]
    pub prefix_fraction: f64,
    /// Fraction of each prompt's own tokens (those beyond the shared prefix) already in the
    /// prefix cache from earlier requests: a conversation's history re-sent with its next turn,
    /// or a benchmark that re-sends the prompts of its previous run to a warm server. Their
    /// prefill compute is skipped (the engine still computes at least the last token, for its
    /// logits); unlike the shared prefix, every sequence holds their KV in full, and a
    /// disaggregated hand-over moves it.
    #[serde(default)]
    pub cached_fraction: f64,
    /// Requests in flight across the whole deployment (a closed-loop benchmark's concurrency);
    /// `None`: as many as the memory and the SLOs allow.
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Requests per second the deployment must sustain; `None`: no throughput floor. Without a
    /// `concurrency` (or with `arrival: poisson`) it is also the offered load of an open loop:
    /// Poisson arrivals at this rate, queueing for prefill (docs/serving.md §5.1).
    #[serde(default)]
    pub request_rate: Option<f64>,
    /// How requests arrive ([`Arrival`]); `None`: `poisson` when a `request_rate` is given
    /// without a `concurrency`, else `spread`.
    #[serde(default)]
    pub arrival: Option<Arrival>,
    /// Requests in the whole run (a benchmark's `--num-prompts`): a closed loop's waves round
    /// up to whole waves of it, an overloaded open loop's queue grows over it; `None`: the
    /// steady state of an endless run.
    #[serde(default)]
    pub num_requests: Option<u32>,
}

/// Most classes of a length distribution (`Traffic::lengths`): the evaluation prices every
/// class's prompt, so a trace is binned into a histogram first (Python's
/// `meshplan.serving.length_histogram`, the CLI's `--lengths`).
pub const MAX_LENGTH_CLASSES: usize = 64;

/// One class of a length distribution: `weight` (any positive scale, e.g. a histogram's
/// count) is its share of the requests, each of `input_len` prompt and `output_len` output
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthClass {
    pub input_len: u32,
    pub output_len: u32,
    #[serde(default = "unit_weight")]
    pub weight: f64,
}

fn unit_weight() -> f64 {
    1.0
}

/// The traffic's lengths as the evaluation reads them (docs/serving.md §1): every class with
/// its share of the requests (shares summing to 1) and the averages the steady state needs. A
/// running batch holds each class in proportion to its share times its output length (a
/// request decodes for `output_len` steps), so what the batch holds and reads is weighted that
/// way; a prefill forward of `k` prompts holds `k` times the mean prompt in tokens and, for
/// attention, the token-weighted mean prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LengthMix {
    /// `(share, input_len, output_len)` of each class, shares summing to 1.
    pub classes: Vec<(f64, f64, f64)>,
    /// Mean prompt tokens per request.
    pub mean_input: f64,
    /// Mean output tokens per request.
    pub mean_output: f64,
    /// Mean KV tokens a running sequence attends to: its prompt and half its output, over the
    /// running batch (`input + output/2` for equal lengths).
    pub decode_context: f64,
    /// Mean full length (prompt + output) of a running sequence (`input + output` for equal
    /// lengths).
    pub full_context: f64,
    /// The longest request, prompt + output.
    pub longest: f64,
    /// Token-weighted mean prompt, `E[in²]/E[in]`: a forward of `k` prompts does the attention
    /// of `k·E[in]/that` prompts of this length (and the same tokens).
    pub prefill_input: f64,
    /// Prompt tokens per request that prefill computes, the mean over the requests
    /// ([`ServingProblem::new_tokens_of`]).
    pub mean_new: f64,
    /// The index of the class of the median prompt (by input length, over the requests; at an
    /// exact half, the shorter): the prefill an evaluation reports.
    pub median_class: usize,
}

/// The value below which `share` of the weight lies, of `(weight, value)` pairs whose weights
/// sum to 1 (the weighted median at 0.5); where the weight below a value is exactly `share`,
/// the mean of that value and the next (as the median of an even count).
pub(crate) fn weighted_quantile(mut pairs: Vec<(f64, f64)>, share: f64) -> f64 {
    pairs.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut seen = 0.0;
    for (i, &(w, v)) in pairs.iter().enumerate() {
        seen += w;
        if (seen - share).abs() <= 1e-12 {
            return pairs.get(i + 1).map_or(v, |next| (v + next.1) / 2.0);
        }
        if seen > share {
            return v;
        }
    }
    pairs.last().map_or(0.0, |p| p.1)
}

/// The arrival process of the requests (docs/serving.md §5.1), an input of the queue model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Closed loop of requests whose lengths differ: completions, and so the next arrivals,
    /// spread over the run; each new prompt's prefill rides in chunks on the running decode
    /// steps, and requests beyond the running batch wait for a slot.
    #[default]
    Spread,
    /// Closed loop of equal-length requests (a benchmark's fixed lengths, e.g. bench_serving's
    /// `--random-range-ratio 1`, or an offline batch submitted at once): the requests in flight
    /// arrive together, are prefilled together in forwards of `max_batched_tokens` and finish
    /// together, in waves of the running batch.
    Waves,
    /// Open loop: Poisson arrivals at `request_rate`; the running batch is what the rate keeps
    /// in flight (Little's law) and prompts queue for prefill (M/D/1). The deployment's
    /// requests/s remain its capacity at its full batch.
    Poisson,
}

impl Arrival {
    pub fn name(self) -> &'static str {
        match self {
            Arrival::Spread => "spread",
            Arrival::Waves => "waves",
            Arrival::Poisson => "poisson",
        }
    }
}

impl Traffic {
    /// The arrival process: the explicit one, else `poisson` for a rate without a
    /// concurrency, else `spread`.
    pub fn arrival(&self) -> Arrival {
        match (self.arrival, self.concurrency, self.request_rate) {
            (Some(a), _, _) => a,
            (None, None, Some(_)) => Arrival::Poisson,
            _ => Arrival::Spread,
        }
    }
}

/// Service-level objectives, each optional (docs/serving.md §2 defines the metrics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// Most seconds to the first token.
    #[serde(default)]
    pub ttft_s: Option<f64>,
    /// Most seconds per output token after the first.
    #[serde(default)]
    pub tpot_s: Option<f64>,
    /// Most seconds from arrival to the last token.
    #[serde(default)]
    pub e2e_s: Option<f64>,
}

/// What the search ranks by, among deployments that meet the SLOs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Output tokens/s per GPU, best first (ties: tokens/s per user).
    #[default]
    Throughput,
    /// End-to-end latency of one request, shortest first (ties: tokens/s per GPU).
    Latency,
}

/// How the FP8 weights of a serving problem are scaled (`ServingProblem::weight_scaling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightScaling {
    /// One scale per tensor (or per output channel): the GEMM runs at the FP8 peak's rate.
    Tensor,
    /// 128x128 weight blocks and 1x128 activation groups, each with its own scale: the
    /// engines' block-scaled kernels (`block_fp8_gemm_efficiency`).
    Block,
}

/// A weight-only storage format of the routed experts (`ServingProblem::expert_weights`): the
/// experts are stored in it and dequantized in the fused-MoE kernel to `weight_precision`, whose
/// GEMMs they then run; the other layers keep `weight_precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertWeights {
    /// OCP microscaling FP4: E2M1 elements, one E8M0 scale per 32 (gpt-oss's published experts;
    /// its attention, router, embedding and head stay 16-bit).
    Mxfp4,
}

impl ExpertWeights {
    /// The spelling in dicts, on the command line and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            ExpertWeights::Mxfp4 => "mxfp4",
        }
    }

    /// Bytes of one stored weight, scales included.
    pub fn bytes_per_element(self) -> f64 {
        match self {
            ExpertWeights::Mxfp4 => 0.5 + constants().mxfp4_scale_bytes_per_element,
        }
    }
}

/// A validated serving problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingProblem {
    pub model: Model,
    pub cluster: Cluster,
    /// Precision of the weights and of the linear layers' GEMMs (bf16, fp16, fp8, mxfp8, nvfp4).
    #[serde(default)]
    pub weight_precision: Precision,
    /// Precision of the KV cache (vLLM/SGLang `--kv-cache-dtype`).
    #[serde(default)]
    pub kv_precision: Precision,
    /// How FP8 weights are scaled: `tensor` (one scale per tensor or channel) or `block`
    /// (DeepSeek-V3's 128x128 weight blocks and 1x128 activation groups, an HF config's
    /// `quantization_config.weight_block_size`). `None`: `block` for FP8 models whose published
    /// checkpoint is block-scaled (`block_fp8_models` in data/serving.toml), else `tensor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_scaling: Option<WeightScaling>,
    /// The routed experts' weight-only storage format where it differs from `weight_precision`
    /// (`mxfp4`: gpt-oss's published checkpoint, an HF config's `quant_method` "mxfp4"). `None`:
    /// the experts are stored like every other layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_weights: Option<ExpertWeights>,
    pub traffic: Traffic,
    #[serde(default)]
    pub slo: Slo,
    #[serde(default)]
    pub objective: Objective,
}

/// An error naming `field` unless `v` is a finite number > 0 (an optional SLO or rate).
fn check_positive_opt(field: &str, v: Option<f64>) -> Result<()> {
    match v {
        Some(v) if !(v.is_finite() && v > 0.0) => {
            Err(Error::invalid(field, v, "a finite number > 0"))
        }
        _ => Ok(()),
    }
}

impl ServingProblem {
    /// Checks every part; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        // Serving models every layer as attention + FFN: a pattern of such layers (gpt-oss's
        // sliding/full alternation, a sliding layer caching and reading its window only) is
        // served, Mamba-2, DeltaNet and one-block layers are not.
        if let Some(pattern) = &self.model.layer_pattern {
            if pattern.chars().any(|c| !"AaSs".contains(c)) {
                return Err(Error::invalid(
                    "model.layer_pattern",
                    format!("{:?}", pattern.chars().take(40).collect::<String>()),
                    "attention + FFN layers only (A, a, S, s): serving does not model Mamba-2, \
                     gated DeltaNet or one-block layers yet",
                ));
            }
        }
        self.cluster.validate()?;
        let t = &self.traffic;
        if t.lengths.is_empty() {
            limits::check("traffic.input_len", t.input_len)?;
            limits::check("traffic.output_len", t.output_len)?;
        } else {
            self.validate_lengths()?;
        }
        limits::check_opt("traffic.concurrency", t.concurrency)?;
        limits::check_opt("traffic.num_requests", t.num_requests)?;
        check_fraction("traffic.prefix_fraction", t.prefix_fraction, 0.0, 0.99)?;
        check_fraction("traffic.cached_fraction", t.cached_fraction, 0.0, 1.0)?;
        check_positive_opt("traffic.request_rate", t.request_rate)?;
        if t.arrival() == Arrival::Poisson && t.request_rate.is_none() {
            return Err(Error::invalid(
                "traffic.arrival",
                "poisson",
                "poisson needs a traffic.request_rate (the arrival rate)",
            ));
        }
        check_positive_opt("slo.ttft_s", self.slo.ttft_s)?;
        check_positive_opt("slo.tpot_s", self.slo.tpot_s)?;
        check_positive_opt("slo.e2e_s", self.slo.e2e_s)?;
        let gpu = &self.cluster.gpu;
        if gpu.peak_tflops.get(self.weight_precision).is_none() {
            let allowed: Vec<&str> = gpu
                .peak_tflops
                .available()
                .iter()
                .map(|p| p.name())
                .collect();
            return Err(Error::invalid(
                "weight_precision",
                self.weight_precision.name(),
                format!("{} on {}", allowed.join(", "), gpu.name),
            ));
        }
        if self.weight_scaling == Some(WeightScaling::Block)
            && self.weight_precision != Precision::Fp8
        {
            return Err(Error::invalid(
                "weight_scaling",
                "block",
                format!(
                    "tensor with weight_precision {}; block needs fp8",
                    self.weight_precision.name()
                ),
            ));
        }
        if let Some(e) = self.expert_weights {
            if self.model.moe.is_none() {
                return Err(Error::invalid(
                    "expert_weights",
                    e.name(),
                    format!("unset for {} (it has no routed experts)", self.model.name),
                ));
            }
        }
        // A KV cache is stored, not computed in: any format the serving engines store it in.
        if self.kv_precision == Precision::Mxfp8 {
            return Err(Error::invalid(
                "kv_precision",
                self.kv_precision.name(),
                "bf16, fp16, fp8, nvfp4",
            ));
        }
        Ok(())
    }

    /// The checks of a length distribution (`traffic.lengths` given).
    fn validate_lengths(&self) -> Result<()> {
        let t = &self.traffic;
        for (field, v) in [
            ("traffic.input_len", t.input_len),
            ("traffic.output_len", t.output_len),
        ] {
            if v != 0 {
                return Err(Error::invalid(
                    field,
                    v,
                    "unset (0) with traffic.lengths, whose classes give the lengths",
                ));
            }
        }
        if t.lengths.len() > MAX_LENGTH_CLASSES {
            return Err(Error::invalid(
                "traffic.lengths",
                format!("{} classes", t.lengths.len()),
                format!(
                    "1..={MAX_LENGTH_CLASSES} classes: bin a trace into a histogram \
                     (meshplan.serving.length_histogram, the CLI's --lengths)"
                ),
            ));
        }
        // A list's elements are named by the list's path, as `limits::TABLE` names them.
        for c in &t.lengths {
            limits::check("traffic.lengths.input_len", c.input_len)?;
            limits::check("traffic.lengths.output_len", c.output_len)?;
            if !(c.weight.is_finite() && c.weight > 0.0 && c.weight <= 1e15) {
                return Err(Error::invalid(
                    "traffic.lengths.weight",
                    c.weight,
                    "a finite number in (0, 1e15]",
                ));
            }
        }
        if t.lengths.len() > 1 && t.arrival() == Arrival::Waves {
            return Err(Error::invalid(
                "traffic.arrival",
                "waves",
                "spread or poisson with traffic.lengths: waves are requests of equal lengths",
            ));
        }
        Ok(())
    }

    /// The traffic's lengths: its classes, or the one class of `input_len` and `output_len`.
    pub fn lengths(&self) -> LengthMix {
        let t = &self.traffic;
        let classes: Vec<(f64, f64, f64)> = if t.lengths.is_empty() {
            vec![(1.0, t.input_len as f64, t.output_len as f64)]
        } else {
            let total: f64 = t.lengths.iter().map(|c| c.weight).sum();
            t.lengths
                .iter()
                .map(|c| (c.weight / total, c.input_len as f64, c.output_len as f64))
                .collect()
        };
        let mean = |f: &dyn Fn(f64, f64) -> f64| -> f64 {
            classes.iter().map(|&(s, i, o)| s * f(i, o)).sum()
        };
        let mean_input = mean(&|i, _| i);
        let mean_output = mean(&|_, o| o);
        let mean_new = mean(&|i, _| self.new_tokens_of(i));
        // Over the running batch a class weighs its share times the steps it decodes.
        let running = |f: &dyn Fn(f64, f64) -> f64| mean(&|i, o| o * f(i, o)) / mean_output;
        // The median prompt, and the longest class at or below it (the shorter at a tie).
        let median_input = weighted_quantile(classes.iter().map(|c| (c.0, c.1)).collect(), 0.5);
        let median_class = (0..classes.len())
            .filter(|&i| classes[i].1 <= median_input)
            .max_by(|&a, &b| classes[a].1.total_cmp(&classes[b].1))
            .unwrap_or(0);
        LengthMix {
            mean_input,
            mean_output,
            decode_context: running(&|i, o| i + o / 2.0),
            full_context: running(&|i, o| i + o),
            longest: classes.iter().map(|&(_, i, o)| i + o).fold(0.0, f64::max),
            prefill_input: mean(&|i, _| i * i) / mean_input,
            mean_new,
            median_class,
            classes,
        }
    }

    /// Bytes of one stored weight of the routed experts.
    pub fn expert_bytes_per_element(&self) -> f64 {
        self.expert_weights.map_or_else(
            || bytes_per_element(self.weight_precision),
            ExpertWeights::bytes_per_element,
        )
    }

    /// The linear layers run block-scaled FP8 GEMMs: `weight_scaling`, or when it is unset an
    /// FP8 model whose published checkpoint is block-scaled (data/serving.toml).
    pub fn block_scaled_fp8(&self) -> bool {
        self.weight_precision == Precision::Fp8
            && match self.weight_scaling {
                Some(s) => s == WeightScaling::Block,
                None => constants().block_fp8_models.contains(&self.model.name),
            }
    }

    /// Tokens of a prompt of `input_len` that prefill computes: neither the shared prefix nor
    /// the cached share of the rest, and at least one (the token whose logits give the first
    /// output).
    pub fn new_tokens_of(&self, input_len: f64) -> f64 {
        let t = &self.traffic;
        (input_len * (1.0 - t.prefix_fraction) * (1.0 - t.cached_fraction)).max(1.0)
    }

    /// Tokens of a prompt of `input_len` found in the prefix cache (shared or the request's
    /// own), which a prefilling token attends to: the rest after [`Self::new_tokens_of`].
    pub fn cached_tokens_of(&self, input_len: f64) -> f64 {
        input_len - self.new_tokens_of(input_len)
    }
}

/// Bytes per stored element of `p`, block scales included (`data/serving.toml`).
pub fn bytes_per_element(p: Precision) -> f64 {
    let c = constants();
    match p {
        Precision::Bf16 | Precision::Fp16 => 2.0,
        Precision::Fp8 => 1.0,
        Precision::Mxfp8 => 1.0 + c.mxfp8_scale_bytes_per_element,
        Precision::Nvfp4 => 0.5 + c.nvfp4_scale_bytes_per_element,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The serving problem the tests start from: `model` on `n` `gpu`s, BF16 weights and KV,
    /// 1024 prompt and 256 output tokens, no SLO.
    pub(crate) fn problem(model: &str, gpu: &str, n: u32) -> ServingProblem {
        ServingProblem {
            model: crate::presets::model(model).unwrap(),
            cluster: Cluster {
                gpu: crate::presets::gpu(gpu).unwrap(),
                num_gpus: n,
                gpus_per_node: None,
                nvlink_domain: None,
            },
            weight_precision: Precision::Bf16,
            kv_precision: Precision::Bf16,
            weight_scaling: None,
            expert_weights: None,
            traffic: Traffic {
                input_len: 1024,
                output_len: 256,
                lengths: Vec::new(),
                prefix_fraction: 0.0,
                cached_fraction: 0.0,
                concurrency: None,
                request_rate: None,
                arrival: None,
                num_requests: None,
            },
            slo: Slo::default(),
            objective: Objective::Throughput,
        }
    }

    #[test]
    fn prefill_computes_what_no_cache_holds() {
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        assert_eq!(p.lengths().mean_new, 1024.0);
        p.traffic.prefix_fraction = 0.5;
        p.traffic.cached_fraction = 0.5;
        // Half the prompt is the shared prefix, half of the rest is cached: 256 to compute.
        assert_eq!(p.lengths().mean_new, 256.0);
        // A prompt the cache holds whole still computes its last token.
        p.traffic.cached_fraction = 1.0;
        assert_eq!(p.lengths().mean_new, 1.0);
        assert!(p.validate().is_ok());
    }

    #[test]
    fn bad_fields_are_named() {
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.traffic.input_len = 0;
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "invalid traffic.input_len: 0 (allowed: 1..=16777216)"
        );
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.weight_precision = Precision::Nvfp4;
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "invalid weight_precision: nvfp4 (allowed: bf16, fp16, fp8 on h100-sxm)"
        );
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.slo.tpot_s = Some(-1.0);
        assert!(p.validate().unwrap_err().to_string().contains("slo.tpot_s"));
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.traffic.prefix_fraction = 1.0;
        assert!(p.validate().is_err());
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.traffic.cached_fraction = 1.5;
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "invalid traffic.cached_fraction: 1.5 (allowed: a number in [0, 1])"
        );
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.weight_scaling = Some(WeightScaling::Block);
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "invalid weight_scaling: block (allowed: tensor with weight_precision bf16; block needs fp8)"
        );
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.expert_weights = Some(ExpertWeights::Mxfp4);
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "invalid expert_weights: mxfp4 (allowed: unset for llama3-8b (it has no routed experts))"
        );
    }

    #[test]
    fn a_length_distribution_is_checked_field_by_field() {
        let class = |input_len, output_len, weight| LengthClass {
            input_len,
            output_len,
            weight,
        };
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.traffic.lengths = vec![class(512, 64, 1.0), class(2048, 256, 3.0)];
        // The classes give the lengths: fixed ones beside them are named.
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "invalid traffic.input_len: 1024 (allowed: unset (0) with traffic.lengths, whose classes give the lengths)"
        );
        p.traffic.input_len = 0;
        p.traffic.output_len = 0;
        assert!(p.validate().is_ok());
        let mix = p.lengths();
        assert_eq!(
            mix.classes,
            vec![(0.25, 512.0, 64.0), (0.75, 2048.0, 256.0)]
        );
        assert_eq!((mix.mean_input, mix.mean_output), (1664.0, 208.0));
        assert_eq!(p.lengths().mean_new, 1664.0);
        for (i, (c, want)) in [
            (
                class(0, 64, 1.0),
                "invalid traffic.lengths.input_len: 0 (allowed: 1..=16777216)",
            ),
            (
                class(64, u32::MAX, 1.0),
                "invalid traffic.lengths.output_len: 4294967295 (allowed: 1..=16777216)",
            ),
            (
                class(64, 64, 0.0),
                "invalid traffic.lengths.weight: 0 (allowed: a finite number in (0, 1e15])",
            ),
            (
                class(64, 64, f64::INFINITY),
                "invalid traffic.lengths.weight: inf (allowed: a finite number in (0, 1e15])",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let mut q = p.clone();
            q.traffic.lengths[i % 2] = c;
            assert_eq!(q.validate().unwrap_err().to_string(), want);
        }
        let mut q = p.clone();
        q.traffic.lengths = vec![class(64, 64, 1.0); MAX_LENGTH_CLASSES + 1];
        assert!(q
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("invalid traffic.lengths: 65 classes (allowed: 1..=64 classes"));
        // Waves are requests of equal lengths.
        let mut q = p.clone();
        q.traffic.arrival = Some(Arrival::Waves);
        assert!(q
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("invalid traffic.arrival: waves"));
        q.traffic.lengths.truncate(1);
        assert!(q.validate().is_ok());
        // Without classes the fixed lengths are required.
        let mut q = p.clone();
        q.traffic.lengths.clear();
        assert_eq!(
            q.validate().unwrap_err().to_string(),
            "invalid traffic.input_len: 0 (allowed: 1..=16777216)"
        );
    }

    #[test]
    fn block_scaling_defaults_from_the_published_checkpoint() {
        let mut p = problem("llama3-8b", "h100-sxm", 8);
        p.weight_precision = Precision::Fp8;
        assert!(!p.block_scaled_fp8());
        p.weight_scaling = Some(WeightScaling::Block);
        assert!(p.block_scaled_fp8());
        let mut d = problem("deepseek-v3", "h100-sxm", 8);
        assert!(!d.block_scaled_fp8(), "bf16 weights");
        d.weight_precision = Precision::Fp8;
        assert!(d.block_scaled_fp8());
        d.weight_scaling = Some(WeightScaling::Tensor);
        assert!(!d.block_scaled_fp8());
    }

    #[test]
    fn nvfp4_carries_its_block_scales() {
        assert_eq!(bytes_per_element(Precision::Nvfp4), 0.5625);
        assert_eq!(ExpertWeights::Mxfp4.bytes_per_element(), 0.53125);
        assert_eq!(bytes_per_element(Precision::Fp8), 1.0);
        assert_eq!(bytes_per_element(Precision::Bf16), 2.0);
    }
}

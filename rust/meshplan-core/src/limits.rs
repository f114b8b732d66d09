//! The documented maximums of every integer input: part of meshplan's contract (issue 9).
//!
//! Every integer field of the public inputs (`Model`, `Cluster` and its `Gpu`, `Workload`,
//! `Plan`, `SearchSpace`, and the plain arguments `threads`, `max_plans` and decode's `tp`) has
//! inclusive bounds here. The `validate()` functions check them first, at the boundary, with
//! [`Limit::check`], so Python, the CLI and the gRPC server reject the same values with the same
//! one-line error, `invalid {field}: {value} (allowed: {lo}..={hi})`. [`TABLE`] lists them all
//! by field path; the binding exposes it as `meshplan._core.limits()` (so the Python
//! constructors check ranges with identical messages) and `docs/limits.md` is checked against it
//! by `tests/limits_doc.rs`.
//!
//! The values are generous — several times the largest model, cluster and batch in use
//! today — and safe: within them every product the cost model forms fits its integer type, and
//! the work of `evaluate` and `explain` depends on the plan's structure (a handful of stage
//! shapes, a capped list of ranks), never on a degree's value.
//!
//! A limit's `lo` is what makes the field meaningful (1 for counts, 0 where none is allowed);
//! checks that depend on other fields (`top_k ≤ num_experts`, `kv_heads` divides `heads`, the
//! degrees multiply to the GPU count) stay with the validation that knows both.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// GPUs of one job, and so every parallel degree, NVLink domain and node size: 2^20 = 1,048,576.
/// The largest training clusters announced hold 100–200 k GPUs; 2^20 is five times that, and
/// keeps every rank id and every product of degrees far inside `u32`/`u64`.
pub const MAX_GPUS: u32 = 1 << 20;
/// Transformer layers: 2^16 = 65,536. Production models have at most ~130 (Llama 3.1 405B: 126)
/// and the deepest published transformer 1,000 (DeepNet); pipeline stages hold at most
/// `layers + 2` chunks, so this also bounds every feasible pipeline.
pub const MAX_LAYERS: u32 = 1 << 16;
/// Hidden size, and the MLA low ranks: 2^20. The widest models use 16–25 k.
pub const MAX_HIDDEN: u32 = 1 << 20;
/// Attention heads and KV heads: 2^16. The most in use is 128 (DeepSeek-V3, Llama 3.1 405B).
pub const MAX_HEADS: u32 = 1 << 16;
/// Per-head dimensions (head_dim, MLA rope/nope/v dims): 2^16. In use: 64–256.
pub const MAX_HEAD_DIM: u32 = 1 << 16;
/// Width of a Mamba-2 or gated DeltaNet causal convolution: 2^10 (in use: 4).
pub const MAX_CONV_KERNEL: u32 = 1 << 10;
/// Most multi-token-prediction depths a model trains with (DeepSeek-V3 and Nemotron 3 use 1-2).
pub const MAX_MTP_LAYERS: u32 = 64;
/// FFN intermediate sizes (dense, routed and shared experts): 2^22 = 4,194,304. The widest
/// dense FFN in use is 73,728 (PaLM 540B's 4·18,432); 2^22 keeps `3·hidden·ffn` inside 2^44.
pub const MAX_FFN_HIDDEN: u32 = 1 << 22;
/// Vocabulary: 2^24 = 16,777,216 entries (the largest in use: ~260 k).
pub const MAX_VOCAB: u32 = 1 << 24;
/// Routed experts, top-k and shared experts: 2^16. The most in use is 384 (Kimi K2).
pub const MAX_EXPERTS: u32 = 1 << 16;
/// Streaming multiprocessors (compute units) of a GPU: 2^16 (a B200 has 148, an MI300X 304).
pub const MAX_SM_COUNT: u32 = 1 << 16;
/// Sequences per optimizer step: 2^24 = 16,777,216 (Llama 3 trains with 2,048 of 8,192 tokens;
/// 16 M sequences of 1 token is still a 16 M-token step).
pub const MAX_GLOBAL_BATCH: u32 = 1 << 24;
/// Tokens per sequence: 2^24 = 16,777,216 (the longest contexts trained are ~1–10 M tokens).
pub const MAX_SEQ_LEN: u32 = 1 << 24;
/// Parameters per data-parallel gradient bucket: 2^31 (Megatron's default is 40 M, or 1 M per
/// data-parallel rank; a bucket of 2 G parameters is already one bucket for most models).
pub const MAX_BUCKET_PARAMS: u32 = 1 << 31;
/// Routing imbalance λ (`workload.moe_imbalance`, a number, not in [`TABLE`]): 100. λ is the
/// busiest expert-parallel rank's routed load over the mean, so at most the EP degree; published
/// runs stay below 1.5, and 100 already prices one rank at 100× its share.
pub const MAX_MOE_IMBALANCE: f64 = 100.0;
/// Sequences per micro-batch, and the bound on `vpp` (model chunks per pipeline rank): 2^16. The
/// search lists every allowed value of both knobs, so this also bounds its enumeration.
pub const MAX_KNOB: u32 = 1 << 16;
/// Plans a search returns (`top_k`): 2^20. Use `feasible_space` for every feasible plan.
pub const MAX_TOP_K: u32 = 1 << 20;
/// Feasible plans `feasible_space` may hold: 2^25 = 33,554,432 rows of ~150 bytes, about 5 GB
/// of columns (the default cap is 5,000,000).
pub const MAX_PLANS: u64 = 1 << 25;
/// Worker threads of one call: 1,024 (each is an OS thread; more than any host has cores).
pub const MAX_THREADS: u64 = 1 << 10;
/// Parameters of a model (derived from its dimensions, not a field): 2^50 ≈ 1.1·10^15, some 600
/// times the largest models trained (1–2 T). Within it every parameter count fits `u64` with
/// room for the products the cost model forms.
pub const MAX_PARAMS: u64 = 1 << 50;
/// Characters of a user-supplied value echoed in an error message; longer values are cut to
/// this many and `…` (a 20,000-character preset name must not make a 20 KB message: gRPC
/// status messages travel in a 16 KiB header).
pub const MAX_ECHO_CHARS: usize = 64;
/// Characters of a GPU's `architecture` name (one lowercase word such as `blackwell`: the key of
/// its `data/device.toml` `matmul_realisation` class); twice the longest architecture name in use.
pub const MAX_ARCHITECTURE_CHARS: usize = 32;
/// Ranks listed for a group (`explain`'s mesh `example_ranks`); the group's `size` says how many
/// there are in all.
pub const MAX_LISTED_RANKS: usize = 64;
/// Pipeline ranks listed in `explain`'s per-stage times (the first ones; the plan's `pp` says how
/// many there are): every rank of any pipeline a model of up to 1,022 layers can fill.
pub const MAX_LISTED_STAGES: usize = 1 << 10;

/// Sequences one serving worker runs at once, and requests in flight across a deployment:
/// 2^24 = 16,777,216 (the largest engines batch a few thousand sequences per GPU).
pub const MAX_SEQUENCES: u32 = 1 << 24;
/// Most KV-cache tokens of one rank a serving plan may state (2^31 − 1: far beyond any GPU's HBM).
pub const MAX_KV_TOKENS: u32 = (1 << 31) - 1;
/// Most engine steps a serving plan may say a step's tokens wait before they are returned
/// (vLLM V0's asynchronous output processing: 1).
pub const MAX_OUTPUT_LAG_STEPS: u32 = 8;

/// Inclusive bounds of one integer field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub lo: u64,
    pub hi: u64,
}

impl Limit {
    /// `lo..=hi`.
    pub const fn new(lo: u64, hi: u64) -> Self {
        Limit { lo, hi }
    }

    /// The `allowed` part of the error: `lo..=hi`.
    pub fn allowed(&self) -> String {
        format!("{}..={}", self.lo, self.hi)
    }

    /// Whether `value` is inside the bounds.
    pub fn contains(&self, value: u64) -> bool {
        (self.lo..=self.hi).contains(&value)
    }

    /// `Ok` inside the bounds, else `invalid {field}: {value} (allowed: lo..=hi)`.
    pub fn check(&self, field: &str, value: impl Into<u64>) -> Result<()> {
        let value = value.into();
        if self.contains(value) {
            Ok(())
        } else {
            Err(Error::invalid(field, value, self.allowed()))
        }
    }

    /// [`Self::check`] of an optional field (absent is fine).
    pub fn check_opt(&self, field: &str, value: Option<impl Into<u64>>) -> Result<()> {
        value.map_or(Ok(()), |v| self.check(field, v))
    }
}

const fn up_to(hi: u32) -> Limit {
    Limit::new(1, hi as u64)
}

const fn from_zero(hi: u32) -> Limit {
    Limit::new(0, hi as u64)
}

/// A parallel degree: 1 up to the GPU count.
pub const DEGREE: Limit = up_to(MAX_GPUS);
/// A ZeRO stage: 0 to 3.
pub const ZERO: Limit = Limit::new(0, 3);
/// Bytes per gradient element: 2 or 4 (the range; `Workload::validate` also rejects 3).
pub const GRAD_BYTES: Limit = Limit::new(2, 4);

/// Every integer field of the public inputs, by field path, with its bounds. Paths are those of
/// the errors (`space.zero` for each element of that list, `gpu.*` for a GPU however it is
/// nested). `docs/limits.md` lists this table.
pub const TABLE: &[(&str, Limit)] = &[
    ("model.layers", up_to(MAX_LAYERS)),
    ("model.hidden", up_to(MAX_HIDDEN)),
    ("model.heads", up_to(MAX_HEADS)),
    ("model.kv_heads", up_to(MAX_HEADS)),
    ("model.head_dim", up_to(MAX_HEAD_DIM)),
    ("model.ffn_hidden", up_to(MAX_FFN_HIDDEN)),
    ("model.vocab", up_to(MAX_VOCAB)),
    ("model.moe.num_experts", up_to(MAX_EXPERTS)),
    ("model.moe.top_k", up_to(MAX_EXPERTS)),
    ("model.moe.expert_ffn_hidden", up_to(MAX_FFN_HIDDEN)),
    ("model.moe.shared_experts", from_zero(MAX_EXPERTS)),
    ("model.moe.shared_expert_ffn_hidden", up_to(MAX_FFN_HIDDEN)),
    ("model.moe.latent_size", up_to(MAX_HIDDEN)),
    ("model.moe.first_dense_layers", from_zero(MAX_LAYERS - 1)),
    ("model.mla.q_lora_rank", up_to(MAX_HIDDEN)),
    ("model.mla.kv_lora_rank", up_to(MAX_HIDDEN)),
    ("model.mla.qk_rope_head_dim", from_zero(MAX_HEAD_DIM)),
    ("model.mla.qk_nope_head_dim", up_to(MAX_HEAD_DIM)),
    ("model.mla.v_head_dim", up_to(MAX_HEAD_DIM)),
    ("model.mamba.heads", up_to(MAX_HEADS)),
    ("model.mamba.head_dim", up_to(MAX_HEAD_DIM)),
    ("model.mamba.state", up_to(MAX_HEAD_DIM)),
    ("model.mamba.groups", up_to(MAX_HEADS)),
    ("model.mamba.conv_kernel", up_to(MAX_CONV_KERNEL)),
    ("model.mamba.chunk", up_to(MAX_HEAD_DIM)),
    ("model.linear_attention.key_heads", up_to(MAX_HEADS)),
    ("model.linear_attention.key_head_dim", up_to(MAX_HEAD_DIM)),
    ("model.linear_attention.value_heads", up_to(MAX_HEADS)),
    ("model.linear_attention.value_head_dim", up_to(MAX_HEAD_DIM)),
    ("model.linear_attention.conv_kernel", up_to(MAX_CONV_KERNEL)),
    ("model.linear_attention.chunk", up_to(MAX_HEAD_DIM)),
    ("model.sliding_window", up_to(MAX_SEQ_LEN)),
    ("model.mtp_layers", up_to(MAX_MTP_LAYERS)),
    ("cluster.num_gpus", up_to(MAX_GPUS)),
    ("cluster.gpus_per_node", up_to(MAX_GPUS)),
    ("cluster.nvlink_domain", up_to(MAX_GPUS)),
    ("gpu.sm_count", up_to(MAX_SM_COUNT)),
    ("gpu.scaleup_domain", up_to(MAX_GPUS)),
    ("gpu.gpus_per_node", up_to(MAX_GPUS)),
    ("workload.global_batch", up_to(MAX_GLOBAL_BATCH)),
    ("workload.seq_len", up_to(MAX_SEQ_LEN)),
    ("workload.grad_bytes", GRAD_BYTES),
    ("workload.bucket_params", up_to(MAX_BUCKET_PARAMS)),
    ("workload.lora_rank", up_to(MAX_HIDDEN)),
    ("plan.dp", DEGREE),
    ("plan.tp", DEGREE),
    ("plan.pp", DEGREE),
    ("plan.ep", DEGREE),
    ("plan.cp", DEGREE),
    ("plan.vpp", up_to(MAX_KNOB)),
    ("plan.micro_batch", up_to(MAX_KNOB)),
    ("plan.zero", ZERO),
    ("plan.etp", DEGREE),
    ("plan.first_stage_layers", from_zero(MAX_LAYERS)),
    ("plan.last_stage_layers", from_zero(MAX_LAYERS)),
    ("plan.offload_layers", from_zero(MAX_LAYERS)),
    ("space.dp.fixed", DEGREE),
    ("space.dp.min", DEGREE),
    ("space.dp.max", DEGREE),
    ("space.tp.fixed", DEGREE),
    ("space.tp.min", DEGREE),
    ("space.tp.max", DEGREE),
    ("space.pp.fixed", DEGREE),
    ("space.pp.min", DEGREE),
    ("space.pp.max", DEGREE),
    ("space.ep.fixed", DEGREE),
    ("space.ep.min", DEGREE),
    ("space.ep.max", DEGREE),
    ("space.cp.fixed", DEGREE),
    ("space.cp.min", DEGREE),
    ("space.cp.max", DEGREE),
    ("space.etp.fixed", DEGREE),
    ("space.etp.min", DEGREE),
    ("space.etp.max", DEGREE),
    ("space.vpp.fixed", up_to(MAX_KNOB)),
    ("space.vpp.min", up_to(MAX_KNOB)),
    ("space.vpp.max", up_to(MAX_KNOB)),
    ("space.micro_batch.fixed", up_to(MAX_KNOB)),
    ("space.micro_batch.min", up_to(MAX_KNOB)),
    ("space.micro_batch.max", up_to(MAX_KNOB)),
    ("space.zero", ZERO),
    ("space.top_k", up_to(MAX_TOP_K)),
    ("space.max_candidates", Limit::new(1, u64::MAX)),
    ("traffic.input_len", up_to(MAX_SEQ_LEN)),
    ("traffic.output_len", up_to(MAX_SEQ_LEN)),
    ("traffic.lengths.input_len", up_to(MAX_SEQ_LEN)),
    ("traffic.lengths.output_len", up_to(MAX_SEQ_LEN)),
    ("traffic.concurrency", up_to(MAX_SEQUENCES)),
    ("traffic.num_requests", up_to(MAX_SEQUENCES)),
    ("serving_plan.worker.tp", DEGREE),
    ("serving_plan.worker.pp", DEGREE),
    ("serving_plan.worker.attention_dp", DEGREE),
    ("serving_plan.worker.ep", DEGREE),
    ("serving_plan.worker.expert_tp", DEGREE),
    ("serving_plan.worker.max_sequences", up_to(MAX_SEQUENCES)),
    ("serving_plan.worker.max_batched_tokens", up_to(MAX_SEQ_LEN)),
    ("serving_plan.worker.kv_tokens", up_to(MAX_KV_TOKENS)),
    (
        "serving_plan.worker.output_lag_steps",
        from_zero(MAX_OUTPUT_LAG_STEPS),
    ),
    ("serving_plan.replicas", DEGREE),
    ("serving_plan.prefill.tp", DEGREE),
    ("serving_plan.prefill.pp", DEGREE),
    ("serving_plan.prefill.attention_dp", DEGREE),
    ("serving_plan.prefill.ep", DEGREE),
    ("serving_plan.prefill.expert_tp", DEGREE),
    ("serving_plan.prefill.max_sequences", up_to(MAX_SEQUENCES)),
    (
        "serving_plan.prefill.max_batched_tokens",
        up_to(MAX_SEQ_LEN),
    ),
    ("serving_plan.prefill.kv_tokens", up_to(MAX_KV_TOKENS)),
    (
        "serving_plan.prefill.output_lag_steps",
        from_zero(MAX_OUTPUT_LAG_STEPS),
    ),
    ("serving_plan.prefill_replicas", DEGREE),
    ("serving_space.top_k", up_to(MAX_TOP_K)),
    ("serving_space.max_tp", DEGREE),
    ("serving_space.max_pp", DEGREE),
    ("serving_space.max_attention_dp", DEGREE),
    ("serving_space.max_sequences", up_to(MAX_SEQUENCES)),
    ("serving_space.max_candidates", Limit::new(1, u64::MAX)),
    ("max_plans", Limit::new(1, MAX_PLANS)),
    ("threads", Limit::new(1, MAX_THREADS)),
    ("tp", DEGREE),
    // One collective priced on its own (`comm::price_collectives`, `meshplan calibrate`).
    ("collective.group_size", DEGREE),
    ("collective.per_domain", DEGREE),
];

/// The bounds of the field at `path` (a path of [`TABLE`]), if it is an integer input.
pub fn of(path: &str) -> Option<Limit> {
    // Looked up on every validation (a few dozen fields per call): hashed once.
    static BY_PATH: OnceLock<HashMap<&'static str, Limit>> = OnceLock::new();
    BY_PATH
        .get_or_init(|| TABLE.iter().copied().collect())
        .get(path)
        .copied()
}

/// The bounds of the field at `path`. Panics on a path missing from [`TABLE`] (a bug, caught by
/// every test that validates a problem).
pub fn get(path: &str) -> Limit {
    of(path).unwrap_or_else(|| panic!("no limit for {path} in limits::TABLE"))
}

/// Checks `value` against the bounds of `path` in [`TABLE`].
pub fn check(path: &str, value: impl Into<u64>) -> Result<()> {
    get(path).check(path, value)
}

/// [`check`] of an optional field (absent is fine).
pub fn check_opt(path: &str, value: Option<impl Into<u64>>) -> Result<()> {
    get(path).check_opt(path, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_unique_and_bounds_ordered() {
        for (i, (path, limit)) in TABLE.iter().enumerate() {
            assert!(limit.lo <= limit.hi, "{path}");
            assert!(
                TABLE[..i].iter().all(|(p, _)| p != path),
                "{path} listed twice"
            );
        }
    }

    #[test]
    fn a_value_outside_names_field_value_and_range() {
        assert!(check("cluster.num_gpus", 8u32).is_ok());
        let e = check("cluster.num_gpus", 4_294_967_295u32).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid cluster.num_gpus: 4294967295 (allowed: 1..=1048576)"
        );
        assert!(check("cluster.num_gpus", 0u32).is_err());
        assert!(check_opt("model.head_dim", None::<u32>).is_ok());
        assert!(check("space.max_candidates", u64::MAX).is_ok());
    }

    #[test]
    fn within_the_limits_the_cost_model_products_fit() {
        // pp·vpp can pass u32 within the limits: evaluate's pp_layers rule forms it in u64.
        assert!(MAX_GPUS as u64 * MAX_KNOB as u64 > u32::MAX as u64);
        // micro_batch·dp·ep (u64 in evaluate::micro_batches) stays far inside u64.
        assert!((MAX_KNOB as u64) * (MAX_GPUS as u64) < 1 << 40);
        // One MoE layer's parameters (u64 in model.rs) at the dimension limits: routed experts
        // plus shared experts, E·3·h·f_e + 3·h·(n_sh·f_sh), fit u64; the whole model is
        // counted in u128 and bounded by MAX_PARAMS.
        let (e, h, f) = (
            MAX_EXPERTS as u128,
            MAX_HIDDEN as u128,
            MAX_FFN_HIDDEN as u128,
        );
        let layer = e * 3 * h * f + 3 * h * (e * f) + h * e;
        assert!(layer < u64::MAX as u128);
        assert!((MAX_LAYERS as u128) * layer > u64::MAX as u128);
    }
}

//! Time of one GEMM from its shape (docs/costmodel.md §5.2): a roofline of the compute time at a
//! shape-dependent efficiency and the HBM time of its operands.
//!
//! Efficiency = calibrated large-GEMM efficiency × tile quantisation (padding of M and N to
//! 128×128 output tiles) × wave quantisation (tiles over SMs) × a short-K penalty `K/(K + 64)`
//! (prologue/epilogue cost of short reductions) [derived; NVIDIA "Matrix Multiplication
//! Background" guide for tile and wave quantisation].
//!
//! A grouped GEMM (the routed experts of an MoE layer: CUTLASS grouped GEMM, Transformer
//! Engine's `GroupedLinear`, DeepGEMM's contiguous layout, vLLM/SGLang `fused_moe`) runs the
//! GEMMs of every local expert in one launch: each expert's rows are padded to the kernel's
//! row alignment ([`GemmDevice::grouped_tile_rows`]), the tiles of all experts share the
//! waves, and every expert's weights stream from HBM (docs/costmodel.md §5.2.1).

/// Output tile edge used for tile and wave quantisation.
const TILE: f64 = 128.0;
/// K at which the short-reduction penalty halves the efficiency.
const K_HALF: f64 = 64.0;

/// What a GEMM runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmDevice {
    /// Dense peak FLOP/s at the GEMM precision.
    pub peak_flops: f64,
    /// Calibrated fraction of the peak for large, well-shaped GEMMs.
    pub efficiency: f64,
    pub sm_count: u32,
    /// Achieved HBM bytes/s.
    pub memory_bytes_per_s: f64,
    /// Bytes per operand element.
    pub element_bytes: f64,
    /// Rows each group's (expert's) segment of a grouped GEMM is padded to: the kernel's M tile
    /// (`data/device.toml`, `grouped_gemm_tile_rows`).
    pub grouped_tile_rows: f64,
}

/// Shape-dependent efficiency of an `M×K · K×N` GEMM (fraction of the dense peak).
pub fn efficiency(dev: &GemmDevice, m: f64, n: f64, k: f64) -> f64 {
    quantised_efficiency(dev, 1.0, m, TILE, n, k)
}

/// Efficiency of `groups` GEMMs of `M×K · K×N` run as one grouped GEMM: each group's M padded
/// to [`GemmDevice::grouped_tile_rows`], N to the 128-column tile, and the tiles of every group
/// sharing the waves over the SMs. One group with a 128-row tile is [`efficiency`].
pub fn grouped_efficiency(dev: &GemmDevice, groups: f64, m: f64, n: f64, k: f64) -> f64 {
    quantised_efficiency(dev, groups, m, dev.grouped_tile_rows, n, k)
}

/// The calibrated efficiency × tile, wave and short-K utilisation of `groups` GEMMs whose M is
/// tiled by `tile_rows` and N by [`TILE`].
fn quantised_efficiency(
    dev: &GemmDevice,
    groups: f64,
    m: f64,
    tile_rows: f64,
    n: f64,
    k: f64,
) -> f64 {
    let tiles_m = (m / tile_rows).ceil().max(1.0);
    let tiles_n = (n / TILE).ceil().max(1.0);
    let tile_util = (m * n) / (tiles_m * tiles_n * tile_rows * TILE);
    let tiles = groups.ceil().max(1.0) * tiles_m * tiles_n;
    let sms = dev.sm_count as f64;
    let waves = (tiles / sms).ceil();
    let wave_util = tiles / (waves * sms);
    let k_util = k / (k + K_HALF);
    dev.efficiency * tile_util * wave_util * k_util
}

/// Seconds for one `M×K · K×N` GEMM (`2·M·N·K` FLOPs).
pub fn gemm_s(dev: &GemmDevice, m: f64, n: f64, k: f64) -> f64 {
    gemm_out_s(dev, m, n, k, dev.element_bytes)
}

/// [`gemm_s`] whose `M×N` output moves `out_bytes` per element (a weight gradient accumulated
/// into an fp32 main gradient reads and writes it: 8) instead of the operands' element size.
fn gemm_out_s(dev: &GemmDevice, m: f64, n: f64, k: f64, out_bytes: f64) -> f64 {
    if m <= 0.0 || n <= 0.0 || k <= 0.0 {
        return 0.0;
    }
    let compute = 2.0 * m * n * k / (dev.peak_flops * efficiency(dev, m, n, k));
    let memory = (dev.element_bytes * (m * k + k * n) + out_bytes * m * n) / dev.memory_bytes_per_s;
    compute.max(memory)
}

/// Seconds of `groups` GEMMs of `M×K · K×N` (`2·groups·M·N·K` FLOPs) run as one grouped GEMM
/// ([`grouped_efficiency`]): the compute at the grouped efficiency against the HBM time of every
/// group's operands — each group's weights (`K×N`) are read once, so at few rows per group the
/// time is the weights of all groups over the HBM bandwidth.
pub fn grouped_gemm_s(dev: &GemmDevice, groups: f64, m: f64, n: f64, k: f64) -> f64 {
    grouped_gemm_out_s(dev, groups, m, n, k, dev.element_bytes)
}

/// [`grouped_gemm_s`] whose outputs move `out_bytes` per element (see [`gemm_out_s`]).
fn grouped_gemm_out_s(
    dev: &GemmDevice,
    groups: f64,
    m: f64,
    n: f64,
    k: f64,
    out_bytes: f64,
) -> f64 {
    if groups <= 0.0 || m <= 0.0 || n <= 0.0 || k <= 0.0 {
        return 0.0;
    }
    let compute =
        2.0 * groups * m * n * k / (dev.peak_flops * grouped_efficiency(dev, groups, m, n, k));
    let memory =
        groups * (dev.element_bytes * (m * k + k * n) + out_bytes * m * n) / dev.memory_bytes_per_s;
    compute.max(memory)
}

/// Seconds of a linear layer's three GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinearTimes {
    /// Forward: `m×k · k×n`.
    pub fwd: f64,
    /// Input gradient: `m×n · n×k`.
    pub dgrad: f64,
    /// Weight gradient: `k×m · m×n`.
    pub wgrad: f64,
}

/// Forward, input-gradient and weight-gradient seconds of a linear layer with `m` tokens,
/// `k` inputs and `n` outputs (the backward GEMMs are the forward's with permuted shapes).
/// The weight gradient's `k×n` output moves `wgrad_out_bytes` per element: the stack's
/// [`crate::stack::Stack::wgrad_output_bytes`] (8 where it accumulates into an fp32 main
/// gradient, docs/costmodel.md §5.2.2), or the GEMM's element size.
pub fn linear_s(dev: &GemmDevice, m: f64, n: f64, k: f64, wgrad_out_bytes: f64) -> LinearTimes {
    LinearTimes {
        fwd: gemm_s(dev, m, n, k),
        dgrad: gemm_s(dev, m, k, n),
        wgrad: gemm_out_s(dev, k, n, m, wgrad_out_bytes),
    }
}

/// [`linear_s`] of `groups` experts with `m` tokens each, as grouped GEMMs: the forward and
/// input gradient group by expert over the tokens; the weight gradient produces each expert's
/// `k×n` weight, reducing over its `m` tokens, and moves `wgrad_out_bytes` per weight element
/// of every expert (its main gradient, §5.2.2).
pub fn grouped_linear_s(
    dev: &GemmDevice,
    groups: f64,
    m: f64,
    n: f64,
    k: f64,
    wgrad_out_bytes: f64,
) -> LinearTimes {
    LinearTimes {
        fwd: grouped_gemm_s(dev, groups, m, n, k),
        dgrad: grouped_gemm_s(dev, groups, m, k, n),
        wgrad: grouped_gemm_out_s(dev, groups, k, n, m, wgrad_out_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> GemmDevice {
        GemmDevice {
            peak_flops: 989e12,
            efficiency: 0.8,
            sm_count: 132,
            memory_bytes_per_s: 2.68e12,
            element_bytes: 2.0,
            grouped_tile_rows: 128.0,
        }
    }

    #[test]
    fn large_gemm_reaches_near_calibrated_efficiency() {
        let e = efficiency(&h100(), 16384.0, 16384.0, 16384.0);
        assert!(e > 0.75 && e <= 0.8, "{e}");
    }

    #[test]
    fn small_gemms_are_less_efficient() {
        let dev = h100();
        let big = efficiency(&dev, 8192.0, 8192.0, 8192.0);
        let narrow = efficiency(&dev, 8192.0, 200.0, 8192.0);
        let short_k = efficiency(&dev, 8192.0, 8192.0, 128.0);
        assert!(narrow < big && short_k < big);
    }

    #[test]
    fn skinny_gemm_is_memory_bound() {
        let dev = h100();
        // One token against an 8192×8192 weight: bytes dominate.
        let t = gemm_s(&dev, 1.0, 8192.0, 8192.0);
        let bytes_t = 2.0 * (8192.0 + 8192.0 * 8192.0 + 8192.0) / dev.memory_bytes_per_s;
        assert!((t / bytes_t - 1.0).abs() < 1e-12, "{t} vs {bytes_t}");
    }

    #[test]
    fn one_group_is_the_dense_gemm() {
        let dev = h100();
        for &(m, n, k) in &[
            (1.0, 8192.0, 8192.0),
            (300.0, 1000.0, 64.0),
            (8192.0, 8192.0, 8192.0),
        ] {
            assert_eq!(grouped_gemm_s(&dev, 1.0, m, n, k), gemm_s(&dev, m, n, k));
        }
    }

    #[test]
    fn few_tokens_per_expert_are_slower_per_flop_than_one_big_gemm() {
        let dev = h100();
        // 64 experts × 32 tokens against one GEMM of the same 2048 rows and FLOPs: each expert
        // pads to a 128-row tile and streams its own weights.
        let (n, k) = (4096.0, 7168.0);
        let grouped = grouped_gemm_s(&dev, 64.0, 32.0, n, k);
        let dense = gemm_s(&dev, 64.0 * 32.0, n, k);
        assert!(grouped > 2.0 * dense, "{grouped} vs {dense}");
        // Many tokens per expert approach the dense GEMM's rate.
        let grouped = grouped_gemm_s(&dev, 8.0, 4096.0, n, k);
        let dense = gemm_s(&dev, 8.0 * 4096.0, n, k);
        assert!(
            grouped < 1.05 * dense && grouped >= 0.95 * dense,
            "{grouped} vs {dense}"
        );
    }

    #[test]
    fn memory_bound_grouped_gemm_reads_every_experts_weights() {
        let dev = h100();
        // One token on each of 32 experts: the weights of all 32 over HBM.
        let (groups, n, k) = (32.0, 4096.0, 7168.0);
        let t = grouped_gemm_s(&dev, groups, 1.0, n, k);
        let weights_s = dev.element_bytes * groups * k * n / dev.memory_bytes_per_s;
        let activations_s = dev.element_bytes * groups * (k + n) / dev.memory_bytes_per_s;
        assert!((t / (weights_s + activations_s) - 1.0).abs() < 1e-12, "{t}");
        assert!(activations_s < 1e-3 * weights_s);
    }

    #[test]
    fn grouped_time_is_monotonic_in_tokens() {
        let dev = h100();
        let mut last = 0.0;
        for tokens in 1..=3000 {
            let t = grouped_linear_s(&dev, 16.0, tokens as f64, 1536.0, 2048.0, 8.0);
            let total = t.fwd + t.dgrad + t.wgrad;
            assert!(total >= last, "{tokens}: {total} < {last}");
            last = total;
        }
    }

    #[test]
    fn grouped_waves_are_shared_across_experts() {
        let dev = h100();
        // 8 experts of 1×9 tiles: 72 tiles fill one wave of 132 SMs together, where eight
        // separate launches would each run a wave of 9 tiles.
        let (m, n, k) = (128.0, 9.0 * 128.0, 4096.0);
        let grouped =
            2.0 * 8.0 * m * n * k / (dev.peak_flops * grouped_efficiency(&dev, 8.0, m, n, k));
        let separate = 8.0 * 2.0 * m * n * k / (dev.peak_flops * efficiency(&dev, m, n, k));
        assert!(grouped < separate / 7.0, "{grouped} vs {separate}");
    }

    #[test]
    fn weight_gradient_accumulates_into_fp32_main_grads_of_every_expert() {
        // DeepSeek-V3's experts at EP 8 (32 local experts, h = 7168, f_e = 2048) with 1,024
        // tokens each, FP8 operands (1 byte): accumulating each expert's weight gradient into
        // its fp32 main gradient reads and writes 8 bytes per weight (§5.2.2), which makes the
        // weight-gradient GEMM memory-bound where 1-byte outputs would leave it compute-bound.
        let dev = GemmDevice {
            element_bytes: 1.0,
            peak_flops: 1979e12,
            ..h100()
        };
        let (groups, tokens, n, k) = (32.0, 1024.0, 2048.0, 7168.0);
        let fp8_out = grouped_linear_s(&dev, groups, tokens, n, k, 1.0).wgrad;
        let main_grad = grouped_linear_s(&dev, groups, tokens, n, k, 8.0).wgrad;
        let weights_s = 8.0 * groups * k * n / dev.memory_bytes_per_s;
        assert!(main_grad >= weights_s, "{main_grad} < {weights_s}");
        assert!(main_grad > 1.2 * fp8_out, "{main_grad} vs {fp8_out}");
        // The forward and input gradient do not move: only the weight gradient has main grads.
        let a = grouped_linear_s(&dev, groups, tokens, n, k, 1.0);
        let b = grouped_linear_s(&dev, groups, tokens, n, k, 8.0);
        assert_eq!((a.fwd, a.dgrad), (b.fwd, b.dgrad));
        // A dense layer's weight gradient over many tokens stays compute-bound.
        let dense = linear_s(&dev, 16384.0, 4096.0, 4096.0, 8.0);
        assert_eq!(
            dense.wgrad,
            linear_s(&dev, 16384.0, 4096.0, 4096.0, 1.0).wgrad
        );
    }
}

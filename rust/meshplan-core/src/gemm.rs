//! Time of one GEMM from its shape (docs/costmodel.md §5.2): a roofline of the compute time at a
//! shape-dependent efficiency and the HBM time of its operands.
//!
//! Efficiency = calibrated large-GEMM efficiency × tile quantisation (padding of M and N to
//! 128×128 output tiles) × wave quantisation (tiles over SMs) × a short-K penalty `K/(K + 64)`
//! (prologue/epilogue cost of short reductions) [derived; NVIDIA "Matrix Multiplication
//! Background" guide for tile and wave quantisation].

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
}

/// Shape-dependent efficiency of an `M×K · K×N` GEMM (fraction of the dense peak).
pub fn efficiency(dev: &GemmDevice, m: f64, n: f64, k: f64) -> f64 {
    let tiles_m = (m / TILE).ceil().max(1.0);
    let tiles_n = (n / TILE).ceil().max(1.0);
    let tile_util = (m * n) / (tiles_m * tiles_n * TILE * TILE);
    let tiles = tiles_m * tiles_n;
    let sms = dev.sm_count as f64;
    let waves = (tiles / sms).ceil();
    let wave_util = tiles / (waves * sms);
    let k_util = k / (k + K_HALF);
    dev.efficiency * tile_util * wave_util * k_util
}

/// Seconds for one `M×K · K×N` GEMM (`2·M·N·K` FLOPs).
pub fn gemm_s(dev: &GemmDevice, m: f64, n: f64, k: f64) -> f64 {
    if m <= 0.0 || n <= 0.0 || k <= 0.0 {
        return 0.0;
    }
    let compute = 2.0 * m * n * k / (dev.peak_flops * efficiency(dev, m, n, k));
    let memory = dev.element_bytes * (m * k + k * n + m * n) / dev.memory_bytes_per_s;
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
pub fn linear_s(dev: &GemmDevice, m: f64, n: f64, k: f64) -> LinearTimes {
    LinearTimes {
        fwd: gemm_s(dev, m, n, k),
        dgrad: gemm_s(dev, m, k, n),
        wgrad: gemm_s(dev, k, n, m),
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
        assert_eq!(t, bytes_t);
    }
}

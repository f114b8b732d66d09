//! The device model of one GPU at one training precision (docs/costmodel.md §5.2–5.3), built from the
//! GPU's datasheet and calibration alone, independently of any workload or plan: the GEMM
//! roofline of the linear layers ([`GemmDevice`]) and of 16-bit attention GEMMs, the flash
//! attention rate and the achieved HBM bandwidth. Training's time model (`time`) and a serving
//! model are both built over it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::gemm::GemmDevice;
use crate::hardware::{Gpu, Precision};

const DEVICE_TOML: &str = include_str!("../data/device.toml");

/// Device-model defaults from `data/device.toml`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceDefaults {
    /// GEMM efficiency of a GPU with none for the precision and none for bf16.
    fallback_gemm_efficiency: f64,
    /// Fraction of a GPU's measured maximum achievable matmul rate (its `matmul_efficiency`)
    /// that a training run's GEMMs realise, for a precision without a `gemm_efficiency`: per GPU
    /// architecture, `default` for an architecture without its own.
    matmul_realisation: BTreeMap<String, f64>,
    /// Rows each expert's segment of a grouped GEMM is padded to.
    grouped_gemm_tile_rows: f64,
    /// Sequence length at which Mamba-2's SSD kernels match FlashAttention-2 per token.
    ssd_flash_crossover_seq: f64,
    /// Call sequence length at which flash attention runs at half its saturated rate.
    attention_half_rate_seq: f64,
    /// Call sequence length at which a GPU's `attention_efficiency` holds.
    attention_reference_seq: f64,
}

fn defaults() -> &'static DeviceDefaults {
    static DEFAULTS: OnceLock<DeviceDefaults> = OnceLock::new();
    DEFAULTS.get_or_init(|| {
        toml::from_str(DEVICE_TOML).expect("data/device.toml holds the device defaults")
    })
}

/// What a training run's GEMMs realise of the matmul microbenchmark on a GPU of `architecture`
/// (`data/device.toml` `matmul_realisation`: the architecture's own class, else `default`).
pub fn matmul_realisation(architecture: Option<&str>) -> f64 {
    defaults().matmul_realisation[realisation_class(architecture)]
}

/// The class of `data/device.toml` `matmul_realisation` a GPU of `architecture` belongs to: the
/// architecture itself where the table has it, else [`DEFAULT_REALISATION`].
pub fn realisation_class(architecture: Option<&str>) -> &'static str {
    let table = &defaults().matmul_realisation;
    architecture
        .and_then(|a| table.get_key_value(a))
        .map_or(DEFAULT_REALISATION, |(k, _)| k.as_str())
}

/// The class of [`matmul_realisation`] that serves every architecture without its own.
pub const DEFAULT_REALISATION: &str = "default";

/// The GEMM efficiency of `gpu` at `precision`: the fitted `gemm_efficiency` at that precision;
/// else the measured `matmul_efficiency` there times its architecture's [`matmul_realisation`]
/// (data/device.toml); else the same two at BF16; else `fallback_gemm_efficiency`
/// (docs/costmodel.md §5.2).
pub fn gemm_efficiency(gpu: &Gpu, precision: Precision) -> f64 {
    let d = defaults();
    let cal = &gpu.calibration;
    let realised = |m: f64| m * matmul_realisation(gpu.architecture.as_deref());
    let at = |p: Precision| {
        cal.gemm_efficiency
            .get(p)
            .or_else(|| cal.matmul_efficiency.get(p).map(realised))
    };
    at(precision)
        .or(at(Precision::Bf16))
        .unwrap_or(d.fallback_gemm_efficiency)
}

/// Keys per query of the flash attention whose time per head and token Mamba-2's SSD kernels take
/// at least (`data/device.toml` `ssd_flash_crossover_seq`: the sequence length at which the Mamba-2
/// paper measures SSD as fast as FlashAttention-2; docs/costmodel.md §1.4).
pub fn ssd_flash_crossover_keys() -> f64 {
    defaults().ssd_flash_crossover_seq
}

/// Flash attention's rate at a kernel call of sequence length `call_seq`, relative to its rate
/// at the reference length where `attention_efficiency` is fitted (`data/device.toml`):
/// `(L / (L + L½)) / (L_ref / (L_ref + L½))`, the saturating curve of the cuDNN and
/// FlashAttention kernels' TFLOPS against sequence length (FlashAttention-3 paper, Figs. 5-6;
/// docs/costmodel.md §5.2). 1 at the reference length; about 0.92 at 2k, 1.07 at 16k and at
/// most 1.098 at any length.
pub fn attention_length_factor(call_seq: f64) -> f64 {
    let d = defaults();
    let half = d.attention_half_rate_seq;
    let l = call_seq.max(1.0);
    (l / (l + half)) * (d.attention_reference_seq + half) / d.attention_reference_seq
}

/// One GPU at one training precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Device {
    /// The linear layers' GEMMs at the training precision.
    pub gemm: GemmDevice,
    /// 16-bit GEMMs (unfused attention).
    pub gemm16: GemmDevice,
    /// The linear layers run in FP8/FP4 and cast their inputs.
    pub quantized: bool,
    /// Achieved flash-attention FLOP/s (16-bit) at the reference call length
    /// ([`attention_length_factor`] scales it to a call's length: [`Device::attention_rate`]).
    pub attention_flops_per_s: f64,
    /// Achieved HBM bytes/s of element-wise kernels and the optimizer.
    pub memory_bytes_per_s: f64,
}

impl Device {
    /// This device with its achieved GEMM and attention efficiency scaled by a training stack's
    /// `kernel_efficiency` (1 keeps every number as it is).
    pub fn with_kernel_efficiency(mut self, factor: f64) -> Self {
        self.gemm.efficiency *= factor;
        self.gemm16.efficiency *= factor;
        self.attention_flops_per_s *= factor;
        self
    }

    /// Achieved flash-attention FLOP/s of a kernel call of sequence length `call_seq`.
    pub fn attention_rate(&self, call_seq: f64) -> f64 {
        self.attention_flops_per_s * attention_length_factor(call_seq)
    }

    /// The device model of `gpu` training at `precision`.
    pub fn of(gpu: &Gpu, precision: Precision) -> Self {
        let cal = &gpu.calibration;
        let memory_bytes_per_s = gpu.memory_bandwidth_gbps * 1e9 * cal.memory_efficiency;
        let quantized = matches!(
            precision,
            Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4
        );
        // Attention runs in 16-bit even when the linear layers run in FP8/FP4 (Transformer
        // Engine default).
        let attention_precision = if quantized {
            Precision::Bf16
        } else {
            precision
        };
        let attention_peak = gpu
            .peak_tflops
            .get(attention_precision)
            .or(gpu.peak_tflops.get(Precision::Fp16))
            .unwrap_or(0.0)
            * 1e12;
        let gemm = GemmDevice {
            peak_flops: gpu.peak_tflops.get(precision).unwrap_or(0.0) * 1e12,
            efficiency: gemm_efficiency(gpu, precision),
            sm_count: gpu.sm_count,
            memory_bytes_per_s,
            element_bytes: match precision {
                Precision::Fp8 | Precision::Mxfp8 => 1.0,
                Precision::Nvfp4 => 0.5,
                Precision::Bf16 | Precision::Fp16 => 2.0,
            },
            grouped_tile_rows: defaults().grouped_gemm_tile_rows,
        };
        let gemm16 = GemmDevice {
            peak_flops: attention_peak,
            efficiency: gemm_efficiency(gpu, attention_precision),
            element_bytes: 2.0,
            ..gemm
        };
        Device {
            gemm,
            gemm16,
            quantized,
            attention_flops_per_s: attention_peak * cal.attention_efficiency,
            memory_bytes_per_s,
        }
    }
}

/// Largest GEMM dimension [`gemm_times_s`] accepts (2^24: far beyond any layer's M, N or K).
pub const MAX_GEMM_DIM: f64 = 16_777_216.0;

/// Seconds of each `M×K · K×N` GEMM of `shapes` (`[m, n, k]`) on `gpu` at `precision`, as the
/// time model charges a linear layer's forward GEMM: what `meshplan calibrate` fits measured
/// GEMM times against (the GPU and the shapes are validated first).
pub fn gemm_times_s(
    gpu: &Gpu,
    precision: Precision,
    shapes: &[[f64; 3]],
) -> crate::error::Result<Vec<f64>> {
    gpu.validate()?;
    gpu.peak_flops(precision)?;
    for shape in shapes {
        for (name, v) in ["m", "n", "k"].iter().zip(shape) {
            if !(v.is_finite() && (1.0..=MAX_GEMM_DIM).contains(v)) {
                return Err(crate::error::Error::invalid(
                    format!("gemm.{name}"),
                    v,
                    format!("a number in [1, {MAX_GEMM_DIM}]"),
                ));
            }
        }
    }
    let dev = Device::of(gpu, precision).gemm;
    Ok(shapes
        .iter()
        .map(|&[m, n, k]| crate::gemm::gemm_s(&dev, m, n, k))
        .collect())
}

/// [`attention_length_factor`] of each flash-attention call length in `seqs`: what `meshplan
/// calibrate` divides a measured attention rate by to read `attention_efficiency` at the
/// reference length (each length validated first).
pub fn attention_length_factors(seqs: &[f64]) -> crate::error::Result<Vec<f64>> {
    for v in seqs {
        if !(v.is_finite() && (1.0..=MAX_GEMM_DIM).contains(v)) {
            return Err(crate::error::Error::invalid(
                "attention.seq",
                v,
                format!("a number in [1, {MAX_GEMM_DIM}]"),
            ));
        }
    }
    Ok(seqs.iter().map(|&l| attention_length_factor(l)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_linears_keep_16_bit_attention() {
        let gpu = crate::presets::gpu("h100-sxm").unwrap();
        let d = Device::of(&gpu, Precision::Fp8);
        assert!(d.quantized);
        assert_eq!(d.gemm.element_bytes, 1.0);
        assert_eq!(d.gemm16.element_bytes, 2.0);
        assert!(d.gemm.peak_flops > d.gemm16.peak_flops);
        assert_eq!(Device::of(&gpu, Precision::Bf16).gemm, d.gemm16);
    }

    #[test]
    fn every_preset_names_an_architecture_and_a_bad_one_is_refused() {
        for name in crate::presets::gpu_names() {
            let gpu = crate::presets::gpu(&name).unwrap();
            assert!(gpu.architecture.is_some(), "{name}");
        }
        let blackwell = crate::presets::gpu("b200").unwrap();
        assert_eq!(blackwell.architecture.as_deref(), Some("blackwell"));
        for bad in ["", "Hopper", "a b", &"x".repeat(33)] {
            let mut gpu = blackwell.clone();
            gpu.architecture = Some(bad.to_string());
            let e = gpu.validate().unwrap_err().to_string();
            assert!(e.contains("gpu.architecture"), "{e}");
        }
    }

    #[test]
    fn a_measured_matmul_efficiency_stands_in_for_a_missing_fitted_one() {
        let mut gpu = crate::presets::gpu("h100-sxm").unwrap();
        let r = matmul_realisation(gpu.architecture.as_deref());
        assert!(r > 0.5 && r <= 1.0, "{r}");
        // Hopper has no class of its own; Blackwell's runs realise less of their microbenchmark.
        assert_eq!(r, matmul_realisation(None));
        assert_eq!(r, matmul_realisation(Some("no-such-architecture")));
        assert!(matmul_realisation(Some("blackwell")) < r);
        assert_eq!(realisation_class(Some("blackwell")), "blackwell");
        assert_eq!(realisation_class(Some("hopper")), DEFAULT_REALISATION);
        // The fitted value wins where both are known.
        assert_eq!(
            Device::of(&gpu, Precision::Fp8).gemm.efficiency,
            gpu.calibration.gemm_efficiency.fp8.unwrap()
        );
        // A GPU whose only GEMM figure is its microbenchmark (a user GPU, a what-if).
        gpu.calibration.gemm_efficiency = Default::default();
        let m = gpu.calibration.matmul_efficiency.clone();
        assert_eq!(
            Device::of(&gpu, Precision::Fp8).gemm.efficiency,
            m.fp8.unwrap() * r
        );
        assert_eq!(
            Device::of(&gpu, Precision::Bf16).gemm.efficiency,
            m.bf16.unwrap() * r
        );
        // FP8 without its own figure takes the BF16 one; nothing at all takes the fallback.
        gpu.calibration.matmul_efficiency.fp8 = None;
        assert_eq!(
            Device::of(&gpu, Precision::Fp8).gemm.efficiency,
            m.bf16.unwrap() * r
        );
        gpu.calibration.matmul_efficiency = Default::default();
        assert_eq!(
            Device::of(&gpu, Precision::Fp8).gemm.efficiency,
            defaults().fallback_gemm_efficiency
        );
    }

    #[test]
    fn the_fallback_efficiency_is_data() {
        assert_eq!(defaults().fallback_gemm_efficiency, 0.5);
    }

    #[test]
    fn gemm_times_are_the_roofline_and_bad_shapes_name_the_dimension() {
        let gpu = crate::presets::gpu("h100-sxm").unwrap();
        let t = gemm_times_s(&gpu, Precision::Bf16, &[[8192.0, 8192.0, 8192.0]]).unwrap();
        let dev = Device::of(&gpu, Precision::Bf16).gemm;
        assert_eq!(t[0], crate::gemm::gemm_s(&dev, 8192.0, 8192.0, 8192.0));
        let e = gemm_times_s(&gpu, Precision::Bf16, &[[8.0, 0.0, 8.0]]).unwrap_err();
        assert!(e.to_string().contains("gemm.n"), "{e}");
        let e = gemm_times_s(&gpu, Precision::Nvfp4, &[[8.0, 8.0, 8.0]]).unwrap_err();
        assert!(e.to_string().contains("precision"), "{e}");
    }
}

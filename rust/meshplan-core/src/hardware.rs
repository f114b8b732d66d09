//! Hardware descriptors: a GPU type (peak FLOP/s per precision, HBM, fabrics, calibration
//! constants) and a cluster of them (docs/costmodel.md §6). Values live in `data/gpus.toml`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;

/// Numeric precision of the GEMMs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Bf16,
    Fp16,
    Fp8,
    Mxfp8,
    Nvfp4,
}

impl Precision {
    /// Every precision, in a fixed order.
    pub const ALL: [Precision; 5] = [
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
        Precision::Mxfp8,
        Precision::Nvfp4,
    ];

    /// The lower-case name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
            Precision::Mxfp8 => "mxfp8",
            Precision::Nvfp4 => "nvfp4",
        }
    }
}

/// One value per precision; `None` where the chip has no such mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PerPrecision {
    #[serde(default)]
    pub bf16: Option<f64>,
    #[serde(default)]
    pub fp16: Option<f64>,
    #[serde(default)]
    pub fp8: Option<f64>,
    #[serde(default)]
    pub mxfp8: Option<f64>,
    #[serde(default)]
    pub nvfp4: Option<f64>,
}

impl PerPrecision {
    /// The value for `p`, if the chip has it.
    pub fn get(&self, p: Precision) -> Option<f64> {
        match p {
            Precision::Bf16 => self.bf16,
            Precision::Fp16 => self.fp16,
            Precision::Fp8 => self.fp8,
            Precision::Mxfp8 => self.mxfp8,
            Precision::Nvfp4 => self.nvfp4,
        }
    }

    /// Sets the value for `p`.
    pub fn set(&mut self, p: Precision, value: f64) {
        let slot = match p {
            Precision::Bf16 => &mut self.bf16,
            Precision::Fp16 => &mut self.fp16,
            Precision::Fp8 => &mut self.fp8,
            Precision::Mxfp8 => &mut self.mxfp8,
            Precision::Nvfp4 => &mut self.nvfp4,
        };
        *slot = Some(value);
    }

    /// No precision has a value.
    pub fn is_empty(&self) -> bool {
        self.available().is_empty()
    }

    /// The precisions with a value, in [`Precision::ALL`] order.
    pub fn available(&self) -> Vec<Precision> {
        Precision::ALL
            .into_iter()
            .filter(|p| self.get(*p).is_some())
            .collect()
    }
}

/// How the GPUs of one scale-up domain are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ScaleupTopology {
    /// NVSwitch-style: every GPU reaches any peer at its full per-direction link rate.
    #[default]
    Switch,
    /// Full mesh (AMD xGMI): each peer pair has its own link of `scaleup_bandwidth_gbps / (domain-1)`,
    /// so a group of P GPUs gets `(P-1)` links (docs/costmodel.md §6 gotcha 3).
    Mesh,
}

/// Calibration constants of a GPU type: everything the cost model cannot derive from a datasheet.
/// Each value's source is cited next to it in `data/gpus.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Fraction of the dense peak a large, well-shaped GEMM reaches, per precision (§5.2).
    pub gemm_efficiency: PerPrecision,
    /// Maximum achievable matmul FLOP/s (MAMF) of a published single-GPU GEMM microbenchmark,
    /// as a fraction of the dense peak, per precision: a hardware fact, not fitted to training
    /// runs. A precision without a `gemm_efficiency` takes this times the device model's
    /// `matmul_realisation` (§5.2), and leave-one-GPU-out validation predicts a held-out GPU
    /// from it.
    #[serde(default, skip_serializing_if = "PerPrecision::is_empty")]
    pub matmul_efficiency: PerPrecision,
    /// Fraction of the BF16 peak reached by flash-attention forward kernels (§5.2, FA2/FA3).
    pub attention_efficiency: f64,
    /// Fraction of the HBM bandwidth reached by element-wise kernels and the optimizer (§5.3).
    pub memory_efficiency: f64,
    /// Bytes moved by element-wise work per token and per `h` of one layer's forward pass (§5.3).
    pub elementwise_bytes_per_hidden: f64,
    /// Achieved all-reduce bus bandwidth as a fraction of the per-direction scale-up rate (§3.1).
    pub scaleup_bus_efficiency: f64,
    /// Same for the scale-out network (§3.1).
    pub network_bus_efficiency: f64,
    /// A measured ring step inside the scale-up domain, microseconds (§3.1): rescales NCCL's
    /// NVLink latency table (`data/collectives.toml`, 3.4 µs for a Simple ring step); `None`
    /// takes NCCL's table as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaleup_latency_us: Option<f64>,
    /// A measured ring step over the network, microseconds (§3.1): rescales NCCL's network
    /// latency table (14 µs for a Simple ring step); `None` takes NCCL's table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_latency_us: Option<f64>,
    /// NVLink SHARP (NVLS) all-reduce algorithm bandwidth over the per-direction link rate,
    /// measured with nccl-tests inside one NVSwitch domain (Hopper 0.611: 275 GB/s on 8 × H100;
    /// Blackwell 0.537: 483 GB/s on 8 × B300; §3.1); `None` where the scale-up switch has no
    /// in-network reduction (no NVLS algorithm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvls_efficiency: Option<f64>,
    /// CUDA context, libraries and NCCL buffers per GPU, GiB (§2.6).
    pub fixed_memory_gib: f64,
    /// Allocator fragmentation as a fraction of activations and transients (§2.6).
    pub fragmentation: f64,
    /// Override of the stack's fraction of tensor-parallel communication hidden behind GEMMs
    /// (§3.4 ω_TP, [`crate::stack::Stack::tp_overlap`]); `None` takes the stack's value. Framework
    /// behaviour, so presets leave it unset unless the GPU's software cannot overlap at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_overlap: Option<f64>,
    /// Override of the stack's fraction of a micro-batch's backward that can hide DP gradient
    /// reduction (§3.6 ω_DP, [`crate::stack::Stack::dp_overlap`]); `None` takes the stack's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_overlap: Option<f64>,
    /// Fraction of EP all-to-all hidden behind computation (§3.7).
    pub ep_overlap: f64,
    /// Fixed host and kernel-launch time of one dense layer's forward pass per micro-batch,
    /// microseconds (backward counts twice, an MoE layer, with about twice the kernels, twice
    /// again). Negligible for large layers; it is what slows small micro-batches and
    /// fine-grained MoE layers down.
    pub layer_overhead_us: f64,
}

impl Calibration {
    /// ω_TP (§3.4): this GPU's override if it has one, else the stack's value.
    pub fn tp_overlap_under(&self, stack: &crate::stack::Stack) -> f64 {
        self.tp_overlap.unwrap_or(stack.tp_overlap)
    }

    /// ω_DP (§3.6): this GPU's override if it has one, else the stack's value.
    pub fn dp_overlap_under(&self, stack: &crate::stack::Stack) -> f64 {
        self.dp_overlap.unwrap_or(stack.dp_overlap)
    }
}

/// A GPU type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Preset key, e.g. `h100-sxm`.
    pub name: String,
    /// Human description.
    #[serde(default)]
    pub description: String,
    /// The die's GPU architecture (`ampere`, `hopper`, `blackwell`, `cdna3`, `cdna4`, ...): which
    /// class of `data/device.toml` `matmul_realisation` turns a measured `matmul_efficiency` into
    /// a GEMM efficiency (§5.2). `None` or an architecture without a class of its own: `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Dense (no 2:4 sparsity) tensor-core peak, TFLOP/s, per precision.
    pub peak_tflops: PerPrecision,
    /// Usable HBM per GPU, GiB (binary).
    pub memory_gib: f64,
    /// HBM bandwidth, GB/s (decimal).
    pub memory_bandwidth_gbps: f64,
    /// Streaming multiprocessors (compute units): wave quantisation of GEMM tiles (§5.2).
    pub sm_count: u32,
    /// Scale-up (NVLink/xGMI) bandwidth per GPU, per direction, GB/s.
    pub scaleup_bandwidth_gbps: f64,
    /// GPUs in one scale-up domain by default.
    pub scaleup_domain: u32,
    #[serde(default)]
    pub scaleup_topology: ScaleupTopology,
    /// GPUs per node (host) by default.
    pub gpus_per_node: u32,
    /// Scale-out NIC bandwidth per GPU, per direction, GB/s.
    pub network_bandwidth_gbps: f64,
    /// Link to host memory per GPU, per direction, GB/s (PCIe x16 or NVLink-C2C): what
    /// activation offloading copies over ([`crate::plan::Plan::offload_layers`]). `None`: not
    /// known (a plan that offloads is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bandwidth_gbps: Option<f64>,
    pub calibration: Calibration,
}

/// An error naming `field` unless `v` is a number in `[lo, hi]`.
pub(crate) fn check_fraction(field: &str, v: f64, lo: f64, hi: f64) -> Result<()> {
    if !(v.is_finite() && v >= lo && v <= hi) {
        return Err(Error::invalid(
            field,
            v,
            format!("a number in [{lo}, {hi}]"),
        ));
    }
    Ok(())
}

/// An error naming `field` unless `v` is a finite number > 0.
pub(crate) fn check_positive(field: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::invalid(field, v, "a finite number > 0"));
    }
    Ok(())
}

impl Gpu {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        if let Some(a) = &self.architecture {
            let word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
            let max = crate::limits::MAX_ARCHITECTURE_CHARS;
            if a.is_empty() || a.len() > max || !a.chars().all(word) {
                return Err(Error::invalid(
                    "gpu.architecture",
                    a,
                    format!(
                        "a lowercase architecture name of 1-{max} letters, digits or '-' \
                         (e.g. hopper)"
                    ),
                ));
            }
        }
        if self.peak_tflops.available().is_empty() {
            return Err(Error::invalid(
                "gpu.peak_tflops",
                "{}",
                "at least one precision",
            ));
        }
        for p in Precision::ALL {
            if let Some(v) = self.peak_tflops.get(p) {
                check_positive(&format!("gpu.peak_tflops.{}", p.name()), v)?;
            }
            let fractions = [
                ("gemm_efficiency", &self.calibration.gemm_efficiency),
                ("matmul_efficiency", &self.calibration.matmul_efficiency),
            ];
            for (table, values) in fractions {
                if let Some(v) = values.get(p) {
                    let field = format!("gpu.calibration.{table}.{}", p.name());
                    check_fraction(&field, v, 0.01, 1.0)?;
                }
            }
        }
        check_positive("gpu.memory_gib", self.memory_gib)?;
        check_positive("gpu.memory_bandwidth_gbps", self.memory_bandwidth_gbps)?;
        check_positive("gpu.scaleup_bandwidth_gbps", self.scaleup_bandwidth_gbps)?;
        check_positive("gpu.network_bandwidth_gbps", self.network_bandwidth_gbps)?;
        if let Some(v) = self.host_bandwidth_gbps {
            check_positive("gpu.host_bandwidth_gbps", v)?;
        }
        limits::check("gpu.sm_count", self.sm_count)?;
        limits::check("gpu.scaleup_domain", self.scaleup_domain)?;
        limits::check("gpu.gpus_per_node", self.gpus_per_node)?;
        let c = &self.calibration;
        check_fraction(
            "gpu.calibration.attention_efficiency",
            c.attention_efficiency,
            0.01,
            1.0,
        )?;
        check_fraction(
            "gpu.calibration.memory_efficiency",
            c.memory_efficiency,
            0.01,
            1.0,
        )?;
        check_fraction(
            "gpu.calibration.scaleup_bus_efficiency",
            c.scaleup_bus_efficiency,
            0.01,
            1.5,
        )?;
        check_fraction(
            "gpu.calibration.network_bus_efficiency",
            c.network_bus_efficiency,
            0.01,
            1.5,
        )?;
        check_fraction(
            "gpu.calibration.elementwise_bytes_per_hidden",
            c.elementwise_bytes_per_hidden,
            0.0,
            1e4,
        )?;
        for (field, value, lo, hi) in [
            ("scaleup_latency_us", c.scaleup_latency_us, 0.01, 1e4),
            ("network_latency_us", c.network_latency_us, 0.01, 1e4),
            ("nvls_efficiency", c.nvls_efficiency, 0.01, 1.5),
        ] {
            if let Some(v) = value {
                check_fraction(&format!("gpu.calibration.{field}"), v, lo, hi)?;
            }
        }
        check_fraction(
            "gpu.calibration.fixed_memory_gib",
            c.fixed_memory_gib,
            0.0,
            1e3,
        )?;
        check_fraction("gpu.calibration.fragmentation", c.fragmentation, 0.0, 1.0)?;
        if let Some(v) = c.tp_overlap {
            check_fraction("gpu.calibration.tp_overlap", v, 0.0, 1.0)?;
        }
        if let Some(v) = c.dp_overlap {
            check_fraction("gpu.calibration.dp_overlap", v, 0.0, 1.0)?;
        }
        check_fraction("gpu.calibration.ep_overlap", c.ep_overlap, 0.0, 1.0)?;
        check_fraction(
            "gpu.calibration.layer_overhead_us",
            c.layer_overhead_us,
            0.0,
            1e5,
        )?;
        Ok(())
    }

    /// Dense peak FLOP/s (not TFLOP/s) at precision `p`, or an error naming the allowed ones.
    pub fn peak_flops(&self, p: Precision) -> Result<f64> {
        self.peak_tflops.get(p).map(|t| t * 1e12).ok_or_else(|| {
            let allowed: Vec<&str> = self
                .peak_tflops
                .available()
                .iter()
                .map(|p| p.name())
                .collect();
            Error::invalid(
                "workload.precision",
                p.name(),
                format!("{} on {}", allowed.join(", "), self.name),
            )
        })
    }
}

/// A cluster: a GPU type, how many, and how they are grouped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub gpu: Gpu,
    pub num_gpus: u32,
    /// GPUs per node; `None` takes the GPU preset's value.
    #[serde(default)]
    pub gpus_per_node: Option<u32>,
    /// GPUs per NVLink (scale-up) domain; `None` takes the GPU preset's value.
    #[serde(default)]
    pub nvlink_domain: Option<u32>,
}

impl Cluster {
    /// GPUs per node in effect.
    pub fn gpus_per_node(&self) -> u32 {
        self.gpus_per_node.unwrap_or(self.gpu.gpus_per_node)
    }

    /// GPUs per NVLink domain in effect.
    pub fn nvlink_domain(&self) -> u32 {
        self.nvlink_domain.unwrap_or(self.gpu.scaleup_domain)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.gpu.validate()?;
        limits::check("cluster.num_gpus", self.num_gpus)?;
        limits::check_opt("cluster.gpus_per_node", self.gpus_per_node)?;
        limits::check_opt("cluster.nvlink_domain", self.nvlink_domain)?;
        Ok(())
    }
}

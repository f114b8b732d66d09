//! Where each calibration constant of a GPU preset comes from (issue 13, docs/calibration.md
//! "How the shipped values were set"): fitted on the GPU's own published runs, measured on it by a
//! published microbenchmark, derived by a stated rule (from datasheet facts, or from another
//! GPU's fitted value through a stated relation), shared by every GPU (a software constant or a
//! literature starting value), or assumed (a starting value nobody has checked on this GPU). `data/gpus.toml` states it per preset in a `[<gpu>.provenance]`
//! table keyed by the constant's name (`"gemm_efficiency.bf16"`, `scaleup_bus_efficiency`, ...);
//! [`required`] lists the hardware constants every preset must account for.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::{Gpu, Precision};

/// How a constant was obtained, from the strongest evidence to the weakest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Fitted to this GPU's own published training runs (`validation/cases.json`).
    Fitted,
    /// Measured on this GPU by a published microbenchmark (nccl-tests, a GEMM sweep).
    Measured,
    /// Derived by a stated rule: from datasheet facts, or from another GPU's fitted value
    /// through a stated relation between the two (same silicon and clocks, a measured ratio).
    Derived,
    /// One value for every GPU: a software constant fitted on the pooled runs of all GPUs, a
    /// vendor library's constant, or a literature starting value.
    Shared,
    /// A starting value with no fit, measurement or rule of this GPU behind it: to calibrate.
    Assumed,
}

impl Source {
    /// The lower-case name used in files and output.
    pub fn name(self) -> &'static str {
        match self {
            Source::Fitted => "fitted",
            Source::Measured => "measured",
            Source::Derived => "derived",
            Source::Shared => "shared",
            Source::Assumed => "assumed",
        }
    }
}

/// Where one constant comes from: the kind of evidence and, in words, the source or the rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Origin {
    pub kind: Source,
    /// The runs, the benchmark or the rule (with the GPU a relation starts from).
    pub note: String,
}

/// The origin of each calibration constant of one GPU, by constant name.
pub type Provenance = BTreeMap<String, Origin>;

/// Calibration constants that are properties of the software, not of the GPU: when a preset
/// states no origin for them they are [`Source::Shared`] with this note.
pub const SHARED: &[(&str, &str)] = &[
    ("elementwise_bytes_per_hidden", "software constant fitted on the pooled runs of every GPU (benchmarks/fidelity/fit_calibration.py)"),
    ("layer_overhead_us", "software constant fitted on the pooled runs of every GPU (benchmarks/fidelity/fit_calibration.py)"),
    ("fixed_memory_gib", "literature starting value for every GPU (docs/costmodel.md §2.6)"),
    ("fragmentation", "Megatron's x1.05 activation margin, every GPU (docs/costmodel.md §2.6)"),
    ("ep_overlap", "framework behaviour, every GPU (docs/costmodel.md §3.7)"),
    ("tp_overlap", "framework behaviour (the stack's value unless overridden)"),
    ("dp_overlap", "framework behaviour (the stack's value unless overridden)"),
];

/// The hardware constants `gpu`'s preset must state an origin for: its GEMM efficiency and its
/// measured matmul efficiency at every precision it has them, the attention and memory efficiencies, both bus efficiencies, and NVLS and
/// the measured latencies where it sets them.
pub fn required(gpu: &Gpu) -> Vec<String> {
    let cal = &gpu.calibration;
    let mut out: Vec<String> = Precision::ALL
        .into_iter()
        .filter(|p| cal.gemm_efficiency.get(*p).is_some())
        .map(|p| format!("gemm_efficiency.{}", p.name()))
        .collect();
    out.extend(
        Precision::ALL
            .into_iter()
            .filter(|p| cal.matmul_efficiency.get(*p).is_some())
            .map(|p| format!("matmul_efficiency.{}", p.name())),
    );
    for name in [
        "attention_efficiency",
        "memory_efficiency",
        "scaleup_bus_efficiency",
        "network_bus_efficiency",
    ] {
        out.push(name.to_string());
    }
    for (name, set) in [
        ("nvls_efficiency", cal.nvls_efficiency.is_some()),
        ("scaleup_latency_us", cal.scaleup_latency_us.is_some()),
        ("network_latency_us", cal.network_latency_us.is_some()),
    ] {
        if set {
            out.push(name.to_string());
        }
    }
    out
}

/// Checks `provenance` against `gpu` and completes it: every [`required`] constant has an
/// origin with a note, every key names a constant the GPU sets, and the [`SHARED`] software
/// constants get their default origin when not stated. The error names the GPU and the key.
pub fn complete(gpu: &Gpu, mut provenance: Provenance) -> Result<Provenance> {
    let required = required(gpu);
    let field = |key: &str| format!("gpu.provenance.{key}");
    for key in &required {
        match provenance.get(key) {
            None => {
                return Err(Error::invalid(
                    field(key),
                    "missing",
                    format!("an origin for every hardware constant of {}", gpu.name),
                ))
            }
            Some(o) if o.note.trim().is_empty() => {
                return Err(Error::invalid(
                    field(key),
                    "\"\"",
                    "a note naming the source or rule",
                ))
            }
            Some(_) => {}
        }
    }
    for key in provenance.keys() {
        if !required.contains(key) && !SHARED.iter().any(|(name, _)| name == key) {
            return Err(Error::invalid(
                field(key),
                key,
                format!("one of {}", required.join(", ")),
            ));
        }
    }
    for (name, note) in SHARED {
        provenance
            .entry((*name).to_string())
            .or_insert_with(|| Origin {
                kind: Source::Shared,
                note: (*note).to_string(),
            });
    }
    Ok(provenance)
}

/// A preset's provenance with its one-word [`summary`], as front ends show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProvenance {
    /// The strongest evidence behind the preset's GEMM efficiencies.
    pub summary: Source,
    /// The origin of each calibration constant.
    pub constants: Provenance,
}

impl GpuProvenance {
    /// `constants` with their summary.
    pub fn of(constants: Provenance) -> Self {
        GpuProvenance {
            summary: summary(&constants),
            constants,
        }
    }
}

/// How a preset's GEMM efficiencies were obtained, in one word: the strongest [`Source`] among
/// its `gemm_efficiency.*` entries (`fitted` when any precision was fitted on its own runs).
pub fn summary(provenance: &Provenance) -> Source {
    provenance
        .iter()
        .filter(|(k, _)| k.starts_with("gemm_efficiency."))
        .map(|(_, o)| o.kind)
        .min()
        .unwrap_or(Source::Derived)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(kind: Source) -> Origin {
        Origin {
            kind,
            note: "a source".into(),
        }
    }

    #[test]
    fn every_required_constant_needs_an_origin_and_shared_ones_are_filled_in() {
        let gpu = crate::presets::gpu("a100-sxm-80g").unwrap();
        let mut p: Provenance = required(&gpu)
            .into_iter()
            .map(|k| (k, origin(Source::Derived)))
            .collect();
        let done = complete(&gpu, p.clone()).unwrap();
        assert_eq!(done["fragmentation"].kind, Source::Shared);
        // A measured matmul efficiency is a hardware constant like the others: it needs its source.
        assert!(gpu.calibration.matmul_efficiency.bf16.is_some());
        let mut without = p.clone();
        without.remove("matmul_efficiency.bf16");
        let e = complete(&gpu, without).unwrap_err().to_string();
        assert!(e.contains("gpu.provenance.matmul_efficiency.bf16"), "{e}");
        p.remove("scaleup_bus_efficiency");
        let e = complete(&gpu, p.clone()).unwrap_err().to_string();
        assert!(e.contains("gpu.provenance.scaleup_bus_efficiency"), "{e}");
        p.insert("scaleup_bus_efficiency".into(), origin(Source::Measured));
        p.insert("nvls_efficiency".into(), origin(Source::Shared));
        let e = complete(&gpu, p).unwrap_err().to_string();
        assert!(e.contains("nvls_efficiency"), "{e}");
    }

    #[test]
    fn the_summary_is_the_strongest_gemm_evidence() {
        let mut p = Provenance::new();
        p.insert("gemm_efficiency.bf16".into(), origin(Source::Derived));
        assert_eq!(summary(&p), Source::Derived);
        p.insert("gemm_efficiency.fp8".into(), origin(Source::Fitted));
        p.insert("memory_efficiency".into(), origin(Source::Shared));
        assert_eq!(summary(&p), Source::Fitted);
    }
}

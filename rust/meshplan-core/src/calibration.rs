//! User overrides of the calibration constants of `data/gpus.toml`, for fitting meshplan to one's
//! own cluster: a TOML (or JSON) table per GPU preset name (or `"*"` for every GPU) holding any
//! subset of the [`Calibration`] fields, e.g.
//!
//! ```toml
//! [h100-sxm]
//! gemm_efficiency = { bf16 = 0.72, fp8 = 0.55 }
//! network_bus_efficiency = 0.7
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::{Calibration, Gpu, PerPrecision, Precision};

/// A partial [`Calibration`]: every field optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationOverride {
    #[serde(default)]
    pub gemm_efficiency: Option<PerPrecision>,
    #[serde(default)]
    pub matmul_efficiency: Option<PerPrecision>,
    #[serde(default)]
    pub attention_efficiency: Option<f64>,
    #[serde(default)]
    pub memory_efficiency: Option<f64>,
    #[serde(default)]
    pub elementwise_bytes_per_hidden: Option<f64>,
    #[serde(default)]
    pub scaleup_bus_efficiency: Option<f64>,
    #[serde(default)]
    pub network_bus_efficiency: Option<f64>,
    #[serde(default)]
    pub scaleup_latency_us: Option<f64>,
    #[serde(default)]
    pub network_latency_us: Option<f64>,
    #[serde(default)]
    pub nvls_efficiency: Option<f64>,
    #[serde(default)]
    pub fixed_memory_gib: Option<f64>,
    #[serde(default)]
    pub fragmentation: Option<f64>,
    #[serde(default)]
    pub tp_overlap: Option<f64>,
    #[serde(default)]
    pub dp_overlap: Option<f64>,
    #[serde(default)]
    pub ep_overlap: Option<f64>,
    /// Accepted by the parser only to be refused with a pointer to its new home: routing
    /// imbalance is the workload's `moe_imbalance`, not a GPU constant.
    #[serde(default, skip_serializing)]
    pub moe_imbalance: Option<f64>,
    #[serde(default)]
    pub layer_overhead_us: Option<f64>,
}

/// Overrides by GPU preset name; the key `"*"` applies to every GPU before its own entry.
pub type CalibrationOverrides = BTreeMap<String, CalibrationOverride>;

/// Parses an overrides file: JSON when it starts with `{`, TOML otherwise.
pub fn parse_overrides(text: &str) -> Result<CalibrationOverrides> {
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str::<CalibrationOverrides>(text).map_err(|e| e.to_string())
    } else {
        toml::from_str::<CalibrationOverrides>(text).map_err(|e| e.to_string())
    };
    parsed.map_err(|reason| {
        Error::invalid(
            "calibration",
            parse_complaint(&reason),
            "a TOML or JSON table per GPU preset (or \"*\") of calibration fields",
        )
    })
}

/// The parser's complaint in one short line, `where: what`: TOML errors span several lines
/// (position, source excerpt, message) — keep the first and the last; the list of expected
/// fields after `, expected` is dropped (the `allowed` part of the error says what is), so that
/// the offending key survives the bound on echoed values (`error::echo`).
fn parse_complaint(reason: &str) -> String {
    let lines: Vec<&str> = reason
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let (first, last) = match (lines.first(), lines.last()) {
        (Some(first), Some(last)) if first != last => (Some(*first), *last),
        (_, Some(last)) => (None, *last),
        _ => (None, reason),
    };
    // serde_json ends its message with ` at line L column C`.
    let (what, at) = match last.rfind(" at line ") {
        Some(i) if first.is_none() => (&last[..i], Some(&last[i + 4..])),
        _ => (last, None),
    };
    let what = what.split(", expected").next().unwrap_or(what);
    let place = first
        .map(|f| f.trim_start_matches("TOML parse error at "))
        .or(at);
    match place {
        Some(place) => format!("{place}: {what}"),
        None => what.to_string(),
    }
}

impl CalibrationOverride {
    /// Sets the fields this override names.
    pub fn apply(&self, cal: &mut Calibration) {
        for (over, table) in [
            (&self.gemm_efficiency, &mut cal.gemm_efficiency),
            (&self.matmul_efficiency, &mut cal.matmul_efficiency),
        ] {
            if let Some(g) = over {
                for p in Precision::ALL {
                    if let Some(v) = g.get(p) {
                        table.set(p, v);
                    }
                }
            }
        }
        let scalars = [
            (self.attention_efficiency, &mut cal.attention_efficiency),
            (self.memory_efficiency, &mut cal.memory_efficiency),
            (
                self.elementwise_bytes_per_hidden,
                &mut cal.elementwise_bytes_per_hidden,
            ),
            (self.scaleup_bus_efficiency, &mut cal.scaleup_bus_efficiency),
            (self.network_bus_efficiency, &mut cal.network_bus_efficiency),
            (self.fixed_memory_gib, &mut cal.fixed_memory_gib),
            (self.fragmentation, &mut cal.fragmentation),
            (self.ep_overlap, &mut cal.ep_overlap),
            (self.layer_overhead_us, &mut cal.layer_overhead_us),
        ];
        for (value, slot) in scalars {
            if let Some(v) = value {
                *slot = v;
            }
        }
        // Optional constants: measured latencies rescale NCCL's tables, NVLS where the switch
        // has it, and overrides of the stack's overlap shares (`None` takes the default).
        for (value, slot) in [
            (self.scaleup_latency_us, &mut cal.scaleup_latency_us),
            (self.network_latency_us, &mut cal.network_latency_us),
            (self.nvls_efficiency, &mut cal.nvls_efficiency),
            (self.tp_overlap, &mut cal.tp_overlap),
            (self.dp_overlap, &mut cal.dp_overlap),
        ] {
            if value.is_some() {
                *slot = value;
            }
        }
    }
}

/// Applies the `"*"` entry and then `gpu.name`'s entry to `gpu`, and re-validates it (so an
/// out-of-range override is reported with its field name).
pub fn apply_overrides(overrides: &CalibrationOverrides, gpu: &mut Gpu) -> Result<()> {
    for key in ["*", gpu.name.as_str()] {
        if let Some(o) = overrides.get(key) {
            if let Some(v) = o.moe_imbalance {
                return Err(Error::invalid(
                    "calibration.moe_imbalance",
                    v,
                    "no GPU value; set the workload's moe_imbalance (--moe-imbalance)",
                ));
            }
            o.apply(&mut gpu.calibration);
        }
    }
    gpu.validate()
}

/// Checks every entry of `overrides` up front: each key is `"*"` or a GPU preset, and every
/// value stays in range once applied to the preset(s) it names (the error names the field).
pub fn check_overrides(overrides: &CalibrationOverrides) -> Result<()> {
    let known = crate::presets::gpu_names();
    if let Some(name) = unknown_gpus(overrides, &known).first() {
        return Err(Error::invalid(
            "calibration",
            name,
            format!("\"*\" or a GPU preset ({})", known.join(", ")),
        ));
    }
    for name in &known {
        if overrides.contains_key("*") || overrides.contains_key(name) {
            apply_overrides(overrides, &mut crate::presets::gpu(name)?)?;
        }
    }
    Ok(())
}

/// GPU names in `overrides` that are neither `"*"` nor in `known` (likely typos).
pub fn unknown_gpus(overrides: &CalibrationOverrides, known: &[String]) -> Vec<String> {
    overrides
        .keys()
        .filter(|k| k.as_str() != "*" && !known.iter().any(|n| n == *k))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_set_only_the_named_fields() {
        let o =
            parse_overrides("[h100-sxm]\ngemm_efficiency = { bf16 = 0.5 }\ntp_overlap = 0.25\n")
                .unwrap();
        let mut gpu = crate::presets::gpu("h100-sxm").unwrap();
        let before = gpu.calibration.clone();
        apply_overrides(&o, &mut gpu).unwrap();
        assert_eq!(gpu.calibration.gemm_efficiency.bf16, Some(0.5));
        assert_eq!(
            gpu.calibration.gemm_efficiency.fp8,
            before.gemm_efficiency.fp8
        );
        assert_eq!(gpu.calibration.tp_overlap, Some(0.25));
        assert_eq!(gpu.calibration.dp_overlap, before.dp_overlap);
    }

    #[test]
    fn wildcard_applies_to_every_gpu_then_the_named_entry_wins() {
        let o = parse_overrides(
            r#"{"*": {"fragmentation": 0.2}, "a100-sxm-80g": {"fragmentation": 0.1}}"#,
        )
        .unwrap();
        let mut h100 = crate::presets::gpu("h100-sxm").unwrap();
        let mut a100 = crate::presets::gpu("a100-sxm-80g").unwrap();
        apply_overrides(&o, &mut h100).unwrap();
        apply_overrides(&o, &mut a100).unwrap();
        assert_eq!(h100.calibration.fragmentation, 0.2);
        assert_eq!(a100.calibration.fragmentation, 0.1);
    }

    #[test]
    fn bad_overrides_name_the_problem() {
        let e = parse_overrides("[h100-sxm]\ngemm_eficiency = 0.5\n").unwrap_err();
        assert!(e.to_string().contains("gemm_eficiency"), "{e}");
        let o = parse_overrides("[h100-sxm]\ntp_overlap = 1.5\n").unwrap();
        let mut gpu = crate::presets::gpu("h100-sxm").unwrap();
        let e = apply_overrides(&o, &mut gpu).unwrap_err();
        assert!(e.to_string().contains("tp_overlap"), "{e}");
    }

    #[test]
    fn moe_imbalance_is_refused_with_a_pointer_to_the_workload() {
        let o = parse_overrides("[\"*\"]\nmoe_imbalance = 1.2\n").unwrap();
        let e = check_overrides(&o).unwrap_err().to_string();
        assert!(
            e.contains("calibration.moe_imbalance") && e.contains("--moe-imbalance"),
            "{e}"
        );
    }
}

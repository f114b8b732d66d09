//! Built-in presets (models, GPUs), parsed from the TOML files under `data/` that are embedded in
//! the binary: one source of truth for every front end.
//!
//! Each file holds one table per preset, keyed by the preset name; the key is inserted as `name`
//! before the table is deserialised into a [`Model`] or [`Gpu`] (unknown keys are an error). Both
//! files are parsed and every preset validated once, on first use. Lookup is case-insensitive and
//! accepts `_` for `-` (`Llama3_70B` finds `llama3-70b`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::hardware::Gpu;
use crate::model::Model;
use crate::provenance::Provenance;

const MODELS_TOML: &str = include_str!("../data/models.toml");
const MODEL_ALIASES_TOML: &str = include_str!("../data/model_aliases.toml");
const GPUS_TOML: &str = include_str!("../data/gpus.toml");

type Table<T> = std::result::Result<BTreeMap<String, T>, Error>;

fn models() -> &'static Table<Model> {
    static MODELS: OnceLock<Table<Model>> = OnceLock::new();
    MODELS.get_or_init(|| parse_table(MODELS_TOML, "data/models.toml", Model::validate))
}

/// Another name for a model preset (`data/model_aliases.toml`): the names people type
/// (`llama3.1-8b`), each with why it is the same model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelAlias {
    /// The alias (the table key).
    pub name: String,
    /// The preset it resolves to.
    pub preset: String,
    /// Why the two are the same model (dimensions and source).
    pub why: String,
}

fn model_aliases_table() -> &'static Table<ModelAlias> {
    static ALIASES: OnceLock<Table<ModelAlias>> = OnceLock::new();
    ALIASES.get_or_init(|| {
        parse_table(
            MODEL_ALIASES_TOML,
            "data/model_aliases.toml",
            |a: &ModelAlias| {
                if a.preset.trim().is_empty() || a.why.trim().is_empty() {
                    return Err(Error::invalid(
                        "model_alias",
                        &a.name,
                        "a preset and a reason",
                    ));
                }
                Ok(())
            },
        )
    })
}

/// The model aliases, sorted by alias.
pub fn model_aliases() -> Vec<ModelAlias> {
    model_aliases_table()
        .as_ref()
        .map(|t| t.values().cloned().collect())
        .unwrap_or_default()
}

fn gpus() -> &'static Table<Gpu> {
    static GPUS: OnceLock<Table<Gpu>> = OnceLock::new();
    GPUS.get_or_init(|| {
        let (gpus, _) = parse_gpus()?;
        Ok(gpus)
    })
}

fn provenances() -> &'static Table<Provenance> {
    static PROVENANCE: OnceLock<Table<Provenance>> = OnceLock::new();
    PROVENANCE.get_or_init(|| {
        let (_, provenance) = parse_gpus()?;
        Ok(provenance)
    })
}

/// The GPU presets and their provenance, by preset name.
/// The error of a bad data file `what`, saying why.
fn data_file_error(what: &str, reason: String) -> Error {
    Error::DataFile {
        what: what.to_string(),
        reason,
    }
}

type GpuTables = (BTreeMap<String, Gpu>, BTreeMap<String, Provenance>);

/// `data/gpus.toml`: each preset's `provenance` table is taken out before the rest is read as a
/// [`Gpu`], then checked against it and completed ([`crate::provenance::complete`]).
fn parse_gpus() -> std::result::Result<GpuTables, Error> {
    let what = "data/gpus.toml";
    let data_error = |reason: String| data_file_error(what, reason);
    let mut root: toml::Table = toml::from_str(GPUS_TOML).map_err(|e| data_error(e.to_string()))?;
    let mut raw = BTreeMap::new();
    for (key, value) in root.iter_mut() {
        let stated = match value {
            toml::Value::Table(t) => t.remove("provenance"),
            _ => None,
        };
        raw.insert(key.clone(), stated);
    }
    let gpus = parse_root(root, what, Gpu::validate)?;
    let mut provenance = BTreeMap::new();
    for (key, gpu) in &gpus {
        let stated: Provenance = match raw.remove(key).flatten() {
            Some(v) => v.try_into().map_err(|e: toml::de::Error| {
                data_error(format!("preset '{key}': provenance: {e}"))
            })?,
            None => Provenance::new(),
        };
        let done = crate::provenance::complete(gpu, stated)
            .map_err(|e| data_error(format!("preset '{key}': {e}")))?;
        provenance.insert(key.clone(), done);
    }
    Ok((gpus, provenance))
}

/// The canonical spelling of a preset name: lower case, `-` as separator.
fn normalize(name: &str) -> String {
    name.trim().to_lowercase().replace('_', "-")
}

/// Parses one preset file; any error (TOML syntax, a bad field, a failed validation) names the
/// file and the preset.
pub(crate) fn parse_table<T: DeserializeOwned>(
    text: &str,
    what: &str,
    validate: impl Fn(&T) -> Result<()>,
) -> Table<T> {
    let data_error = |reason: String| data_file_error(what, reason);
    let root: toml::Table = toml::from_str(text).map_err(|e| data_error(e.to_string()))?;
    parse_root(root, what, validate)
}

/// [`parse_table`] on an already parsed file.
fn parse_root<T: DeserializeOwned>(
    root: toml::Table,
    what: &str,
    validate: impl Fn(&T) -> Result<()>,
) -> Table<T> {
    let data_error = |reason: String| data_file_error(what, reason);
    let mut out = BTreeMap::new();
    for (key, value) in root {
        if normalize(&key) != key {
            return Err(data_error(format!(
                "preset key '{key}' must be lower case with '-' as separator"
            )));
        }
        let toml::Value::Table(mut table) = value else {
            return Err(data_error(format!("preset '{key}' is not a table")));
        };
        if table.contains_key("name") {
            return Err(data_error(format!(
                "preset '{key}' sets 'name'; the table key is the name"
            )));
        }
        table.insert("name".into(), toml::Value::String(key.clone()));
        let preset: T = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| data_error(format!("preset '{key}': {e}")))?;
        validate(&preset).map_err(|e| data_error(format!("preset '{key}': {e}")))?;
        out.insert(key, preset);
    }
    Ok(out)
}

fn names<T>(table: &Table<T>) -> Vec<String> {
    // A broken embedded file is caught by the unit tests; `lookup` reports it as an error.
    table
        .as_ref()
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default()
}

fn lookup<T: Clone>(table: &Table<T>, kind: &'static str, name: &str) -> Result<T> {
    let table = table.as_ref().map_err(Clone::clone)?;
    table
        .get(&normalize(name))
        .cloned()
        .ok_or_else(|| Error::UnknownPreset {
            kind,
            name: name.to_string(),
            available: table.keys().cloned().collect::<Vec<_>>().join(", "),
        })
}

/// Names of the model presets, sorted.
pub fn model_names() -> Vec<String> {
    names(models())
}

/// The model preset `name` (or the preset an alias of [`model_aliases`] names, under the
/// alias's name), or [`crate::Error::UnknownPreset`] listing the available presets and aliases.
pub fn model(name: &str) -> Result<Model> {
    let aliases = model_aliases_table().as_ref().map_err(Clone::clone)?;
    if let Some(alias) = aliases.get(&normalize(name)) {
        let mut m = lookup(models(), "model", &alias.preset)?;
        m.name = alias.name.clone();
        return Ok(m);
    }
    lookup(models(), "model", name).map_err(|e| match e {
        Error::UnknownPreset {
            kind,
            name,
            available,
        } => Error::UnknownPreset {
            kind,
            name,
            available: format!(
                "{available}; aliases: {}",
                aliases.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        },
        other => other,
    })
}

/// Names of the GPU presets, sorted.
pub fn gpu_names() -> Vec<String> {
    names(gpus())
}

/// The GPU preset `name`, or [`crate::Error::UnknownPreset`] listing the available ones.
pub fn gpu(name: &str) -> Result<Gpu> {
    lookup(gpus(), "gpu", name)
}

/// Tests' cluster: `n` GPUs of the preset `gpu`, nodes and NVLink domains as the preset has them.
#[cfg(test)]
pub(crate) fn cluster(gpu: &str, n: u32) -> crate::hardware::Cluster {
    crate::hardware::Cluster {
        gpu: self::gpu(gpu).unwrap(),
        num_gpus: n,
        gpus_per_node: None,
        nvlink_domain: None,
    }
}

/// Where each calibration constant of the GPU preset `name` comes from ([`crate::provenance`]).
pub fn gpu_provenance(name: &str) -> Result<Provenance> {
    lookup(provenances(), "gpu", name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{Precision, ScaleupTopology};

    #[test]
    fn every_alias_names_a_preset_and_none_shadows_one() {
        let names = model_names();
        let aliases = model_aliases();
        assert!(aliases.len() >= 5);
        for a in &aliases {
            assert!(names.contains(&a.preset), "{} -> {}", a.name, a.preset);
            assert!(!names.contains(&a.name), "{} shadows a preset", a.name);
            let m = model(&a.name).unwrap();
            let mut p = model(&a.preset).unwrap();
            assert_eq!(m.name, a.name);
            p.name = a.name.clone();
            assert_eq!(m, p);
        }
        // Case and `_` as for presets; an unknown name lists the aliases too.
        assert_eq!(model("Llama3.1_8B").unwrap().name, "llama3.1-8b");
        let e = model("llama9").unwrap_err().to_string();
        assert!(e.contains("aliases: ") && e.contains("llama3.1-8b"), "{e}");
    }
    use crate::model::{Activation, Norm};

    fn billions(n: u64) -> f64 {
        n as f64 / 1e9
    }

    fn assert_close(name: &str, got: f64, want: f64, rel: f64) {
        assert!(
            ((got - want) / want).abs() <= rel,
            "{name}: got {got:.4}, want {want} within {:.2} %",
            rel * 100.0
        );
    }

    #[test]
    fn both_files_parse_and_every_preset_validates() {
        let models = models().as_ref().expect("data/models.toml");
        let gpus = gpus().as_ref().expect("data/gpus.toml");
        for (key, m) in models {
            assert_eq!(&m.name, key);
            m.validate().unwrap();
        }
        for (key, g) in gpus {
            assert_eq!(&g.name, key);
            g.validate().unwrap();
        }
    }

    #[test]
    fn the_required_presets_exist() {
        let models = model_names();
        for name in [
            "llama2-7b",
            "llama3-8b",
            "llama3-70b",
            "llama3.1-405b",
            "mixtral-8x7b",
            "mixtral-8x22b",
            "deepseek-v3",
            "qwen3-30b-a3b",
            "qwen3-235b-a22b",
            "gpt3-175b",
            "gpt-1.7b",
            "gpt-3.6b",
            "gpt-7.5b",
            "gpt-18.4b",
            "gpt-39.1b",
            "gpt-76.1b",
            "gpt-145.6b",
            "gpt-310.1b",
            "gpt-529.6b",
            "gpt-1t",
            "qwen2.5-72b",
            "glm-4.5",
            "kimi-k2",
            "gpt-oss-120b",
            "nemotron-h-8b",
            "nemotron-h-47b",
            "nemotron-h-56b",
            "nemotron-3-nano-30b-a3b",
            "qwen3-next-80b-a3b",
        ] {
            assert!(
                models.iter().any(|n| n == name),
                "missing model preset {name}"
            );
        }
        assert_eq!(models.len(), 29, "{models:?}");
        let gpus = gpu_names();
        let want = [
            "a100-sxm-40g",
            "a100-sxm-80g",
            "b200",
            "b300",
            "gb200-nvl72",
            "gb300-nvl72",
            "h100-sxm",
            "h100-sxm-96g",
            "h20",
            "h200-sxm",
            "h800-sxm",
            "mi300x",
            "mi325x",
            "mi355x",
            "rtx-pro-6000",
        ];
        assert_eq!(gpus, want);
    }

    #[test]
    fn every_gpu_preset_states_where_its_constants_come_from() {
        use crate::provenance::Source;
        for name in gpu_names() {
            let p = gpu_provenance(&name).unwrap();
            for key in crate::provenance::required(&gpu(&name).unwrap()) {
                assert!(p.contains_key(&key), "{name}: {key}");
            }
            // No preset copies another's constants without saying by which rule.
            for (key, origin) in &p {
                assert!(
                    !origin.note.trim_start().starts_with("as ") || origin.note.contains(':'),
                    "{name}.{key}: {}",
                    origin.note
                );
            }
        }
        let h100 = gpu_provenance("h100-sxm").unwrap();
        assert_eq!(h100["gemm_efficiency.bf16"].kind, Source::Fitted);
        assert_eq!(crate::provenance::summary(&h100), Source::Fitted);
        let gb300 = gpu_provenance("gb300-nvl72").unwrap();
        assert_eq!(crate::provenance::summary(&gb300), Source::Derived);
        assert_eq!(gb300["fragmentation"].kind, Source::Shared);
        assert!(gpu_provenance("h999").is_err());
    }

    #[test]
    fn names_are_sorted() {
        let m = model_names();
        let mut sorted = m.clone();
        sorted.sort();
        assert_eq!(m, sorted);
    }

    #[test]
    fn llama3_70b_has_70_55b_params() {
        // docs/costmodel.md §7(a).
        let p = billions(model("llama3-70b").unwrap().total_params());
        assert!((p - 70.55).abs() < 0.01, "{p}");
    }

    #[test]
    fn llama2_7b_has_6_738b_params() {
        // docs/costmodel.md §7(c).
        let p = billions(model("llama2-7b").unwrap().total_params());
        assert!((p - 6.738).abs() < 0.001, "{p}");
    }

    #[test]
    fn llama3_8b_and_405b_params() {
        assert_close(
            "llama3-8b",
            billions(model("llama3-8b").unwrap().total_params()),
            8.03,
            0.002,
        );
        let m = model("llama3.1-405b").unwrap();
        assert_eq!(
            (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden),
            (126, 16384, 128, 8, 53248)
        );
        assert_close("llama3.1-405b", billions(m.total_params()), 405.8, 0.001);
    }

    #[test]
    fn mixtral_params() {
        let m = model("mixtral-8x7b").unwrap();
        assert_close("mixtral-8x7b", billions(m.total_params()), 46.7, 0.002);
        // 12.9 B active including the input embedding (Mistral's figure).
        let active = billions(m.active_matmul_params() + m.embedding_params());
        assert_close("mixtral-8x7b active", active, 12.9, 0.01);
        assert_close(
            "mixtral-8x22b",
            billions(model("mixtral-8x22b").unwrap().total_params()),
            141.0,
            0.005,
        );
    }

    #[test]
    fn deepseek_v3_has_671b_total_and_37b_active() {
        let m = model("deepseek-v3").unwrap();
        let moe = m.moe.as_ref().unwrap();
        assert_eq!(
            (
                moe.num_experts,
                moe.top_k,
                moe.shared_experts,
                moe.first_dense_layers
            ),
            (256, 8, 1, 3)
        );
        assert_eq!(
            (moe.expert_ffn_hidden, m.ffn_hidden, m.vocab),
            (2048, 18432, 129280)
        );
        assert_eq!(m.qk_head_dim(), 192);
        assert_eq!(m.v_head_dim(), 128);
        assert_close(
            "deepseek-v3 total",
            billions(m.total_params()),
            671.0,
            0.002,
        );
        // Matmul-only (no input embedding), so a little under the published 37 B.
        assert_close(
            "deepseek-v3 active",
            billions(m.active_matmul_params()),
            37.0,
            0.03,
        );
    }

    #[test]
    fn qwen3_moe_params() {
        let m = model("qwen3-30b-a3b").unwrap();
        assert_eq!(m.qk_head_dim(), 128);
        assert_close("qwen3-30b-a3b", billions(m.total_params()), 30.5, 0.005);
        assert_close(
            "qwen3-30b-a3b active",
            billions(m.active_matmul_params() + m.embedding_params()),
            3.3,
            0.02,
        );
        let m = model("qwen3-235b-a22b").unwrap();
        assert_close("qwen3-235b-a22b", billions(m.total_params()), 235.0, 0.002);
        assert_close(
            "qwen3-235b-a22b active",
            billions(m.active_matmul_params() + m.embedding_params()),
            22.0,
            0.02,
        );
    }

    #[test]
    fn gpt3_175b_params() {
        let m = model("gpt3-175b").unwrap();
        assert_eq!(
            (m.activation, m.norm, m.tied_embeddings, m.vocab),
            (Activation::Gelu, Norm::Layernorm, true, 51200)
        );
        let p = billions(m.total_params());
        assert!((174.5..=175.0).contains(&p), "{p}");
    }

    /// Narayanan et al. 2021's own count: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), which
    /// includes biases and learned position embeddings (s = 2048) that the descriptor omits.
    fn narayanan_formula(l: f64, h: f64) -> f64 {
        12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (51200.0 + 2048.0) / (12.0 * l * h)) / 1e9
    }

    #[test]
    fn narayanan_family_matches_table_1() {
        for (name, billions_named) in [
            ("gpt-1.7b", 1.7),
            ("gpt-3.6b", 3.6),
            ("gpt-7.5b", 7.5),
            ("gpt-18.4b", 18.4),
            ("gpt-39.1b", 39.1),
            ("gpt-76.1b", 76.1),
            ("gpt-145.6b", 145.6),
            ("gpt-310.1b", 310.1),
            ("gpt-529.6b", 529.6),
            ("gpt-1t", 1008.0),
        ] {
            let m = model(name).unwrap();
            assert_eq!(m.ffn_hidden, 4 * m.hidden, "{name}");
            assert_eq!(
                (m.kv_heads, m.vocab, m.tied_embeddings),
                (m.heads, 51200, true),
                "{name}"
            );
            let p = billions(m.total_params());
            assert_close(
                name,
                p,
                narayanan_formula(m.layers as f64, m.hidden as f64),
                0.005,
            );
            // The paper's names round its formula loosely for the two smallest models
            // (1.652 B → "1.7B", 3.562 B → "3.6B").
            let tolerance = if billions_named < 5.0 { 0.035 } else { 0.01 };
            assert_close(name, p, billions_named, tolerance);
        }
    }

    #[test]
    fn lookup_is_case_insensitive_and_accepts_underscores() {
        assert_eq!(model("Llama3_70B").unwrap().name, "llama3-70b");
        assert_eq!(model(" LLAMA3.1_405B ").unwrap().name, "llama3.1-405b");
        assert_eq!(gpu("H100_SXM").unwrap().name, "h100-sxm");
        assert_eq!(gpu("gb200_NVL72").unwrap().name, "gb200-nvl72");
    }

    #[test]
    fn unknown_names_list_the_available_presets() {
        let e = model("llama5-1t").unwrap_err();
        let Error::UnknownPreset {
            kind,
            name,
            available,
        } = &e
        else {
            panic!("{e:?}");
        };
        assert_eq!((*kind, name.as_str()), ("model", "llama5-1t"));
        assert!(available.starts_with(&(model_names().join(", ") + "; aliases: ")));
        assert!(e.to_string().contains("llama3-70b, llama3-8b"), "{e}");
        assert_eq!(e.kind(), "unknown_preset");

        let e = gpu("h300").unwrap_err();
        assert!(
            matches!(&e, Error::UnknownPreset { kind: "gpu", .. }),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("a100-sxm-40g, a100-sxm-80g, b200"),
            "{e}"
        );
    }

    #[test]
    fn the_500w_h100_runs_its_tensor_cores_at_one_clock_factor_of_the_h100_sxm() {
        // One fitted constant for the power cap (gpus.toml): GEMMs at both precisions and flash
        // attention all at the same fraction of h100-sxm's, not a GEMM efficiency per precision
        // that also absorbs what the stack and the attention-bound runs leave (docs/calibration.md).
        use Precision::*;
        let (capped, full) = (gpu("h100-sxm-96g").unwrap(), gpu("h100-sxm").unwrap());
        let ratio = |c: &crate::hardware::Gpu, f: &crate::hardware::Gpu, p| {
            c.calibration.gemm_efficiency.get(p).unwrap()
                / f.calibration.gemm_efficiency.get(p).unwrap()
        };
        let k = capped.calibration.attention_efficiency / full.calibration.attention_efficiency;
        assert!((0.7..0.95).contains(&k), "clock factor {k}");
        for p in [Bf16, Fp16, Fp8] {
            assert!(
                (ratio(&capped, &full, p) - k).abs() < 0.005,
                "{p:?}: {} vs {k}",
                ratio(&capped, &full, p)
            );
        }
    }

    #[test]
    fn gpu_precisions_follow_the_architecture() {
        use Precision::*;
        let avail = |n: &str| gpu(n).unwrap().peak_tflops.available();
        for n in ["a100-sxm-40g", "a100-sxm-80g"] {
            assert_eq!(avail(n), vec![Bf16, Fp16], "{n}");
        }
        for n in ["h100-sxm", "h100-sxm-96g", "h200-sxm", "h800-sxm", "mi300x"] {
            assert_eq!(avail(n), vec![Bf16, Fp16, Fp8], "{n}");
        }
        for n in ["b200", "b300", "gb200-nvl72", "gb300-nvl72"] {
            assert_eq!(avail(n), Precision::ALL.to_vec(), "{n}");
            let g = gpu(n).unwrap();
            assert_eq!(
                g.peak_tflops.mxfp8, g.peak_tflops.fp8,
                "{n}: MXFP8 runs at the FP8 rate"
            );
        }
        for n in gpu_names() {
            let g = gpu(&n).unwrap();
            // Every available precision has a GEMM efficiency, and no other.
            assert_eq!(
                g.calibration.gemm_efficiency.available(),
                g.peak_tflops.available(),
                "{n}"
            );
            // Dense rates: FP8 doubles BF16, FP16 equals it.
            assert_eq!(g.peak_tflops.fp16, g.peak_tflops.bf16, "{n}");
            if let (Some(f8), Some(b)) = (g.peak_tflops.fp8, g.peak_tflops.bf16) {
                assert!((f8 / b - 2.0).abs() < 1e-3, "{n}");
            }
        }
    }

    #[test]
    fn gpu_datasheet_values() {
        let h100 = gpu("h100-sxm").unwrap();
        // Dense, not the 1,979 sparse figure (docs/costmodel.md §6 gotcha 1).
        assert_eq!(h100.peak_tflops.bf16, Some(989.4));
        // Per direction, not the 900 GB/s bidirectional sum (gotcha 2).
        assert_eq!(h100.scaleup_bandwidth_gbps, 450.0);
        // Usable GiB: 80 GiB of HBM3 less the driver's reserve (gotcha 5).
        assert!(
            (79.0..80.0).contains(&h100.memory_gib),
            "{}",
            h100.memory_gib
        );
        assert_eq!(
            (h100.sm_count, h100.scaleup_domain, h100.gpus_per_node),
            (132, 8, 8)
        );

        assert_eq!(gpu("h800-sxm").unwrap().scaleup_bandwidth_gbps, 200.0);
        assert!((139.0..141.0).contains(&gpu("h200-sxm").unwrap().memory_gib));
        assert_eq!(gpu("a100-sxm-40g").unwrap().network_bandwidth_gbps, 25.0);

        for n in ["gb200-nvl72", "gb300-nvl72"] {
            let g = gpu(n).unwrap();
            assert_eq!(
                (g.scaleup_domain, g.gpus_per_node, g.scaleup_bandwidth_gbps),
                (72, 4, 900.0),
                "{n}"
            );
        }
        assert_eq!(gpu("gb300-nvl72").unwrap().network_bandwidth_gbps, 100.0);
        assert_eq!(gpu("gb300-nvl72").unwrap().peak_tflops.nvfp4, Some(15000.0));
        // HGX B300 runs at lower power than GB300: 2.25 vs 2.5 PF BF16 dense.
        assert_eq!(gpu("b300").unwrap().peak_tflops.bf16, Some(2250.0));
        assert_eq!(gpu("gb300-nvl72").unwrap().peak_tflops.bf16, Some(2500.0));

        let mi = gpu("mi300x").unwrap();
        assert_eq!(mi.scaleup_topology, ScaleupTopology::Mesh);
        assert_eq!(
            (mi.scaleup_bandwidth_gbps, mi.sm_count, mi.scaleup_domain),
            (448.0, 304, 8)
        );
        assert_eq!(mi.peak_tflops.mxfp8, None);
        let amd = ["mi300x", "mi325x", "mi355x"];
        for n in amd {
            assert_eq!(
                gpu(n).unwrap().scaleup_topology,
                ScaleupTopology::Mesh,
                "{n}"
            );
        }
        // MI355X: 256 CUs x 8,192 dense FP8 FLOP/clock x 2.4 GHz; MI325X: MI300X's compute.
        let mi355 = gpu("mi355x").unwrap();
        assert_eq!((mi355.sm_count, mi355.peak_tflops.fp8), (256, Some(5033.2)));
        assert_eq!(gpu("mi325x").unwrap().peak_tflops, mi.peak_tflops);
        assert_eq!(gpu("h20").unwrap().peak_tflops.bf16, Some(148.0));
        let rtx = gpu("rtx-pro-6000").unwrap();
        assert_eq!(
            (
                rtx.sm_count,
                rtx.peak_tflops.nvfp4,
                rtx.scaleup_bandwidth_gbps
            ),
            (188, Some(2000.0), 64.0)
        );
        for n in gpu_names().iter().filter(|n| !amd.contains(&n.as_str())) {
            assert_eq!(
                gpu(n).unwrap().scaleup_topology,
                ScaleupTopology::Switch,
                "{n}"
            );
        }
    }

    #[test]
    fn usable_memory_is_below_the_nominal_capacity() {
        // The marketed capacity, which the usable figure must stay under (gotcha 5).
        for (n, nominal) in [
            ("a100-sxm-40g", 40.0),
            ("a100-sxm-80g", 80.0),
            ("h100-sxm", 80.0),
            ("h100-sxm-96g", 96.0),
            ("h200-sxm", 141.0),
            ("h800-sxm", 80.0),
            ("b200", 180.0),
            ("b300", 288.0),
            ("gb200-nvl72", 192.0),
            ("gb300-nvl72", 288.0),
            ("mi300x", 192.0),
        ] {
            let m = gpu(n).unwrap().memory_gib;
            assert!(
                m < nominal && m > 0.9 * nominal,
                "{n}: {m} GiB vs nominal {nominal}"
            );
        }
    }

    #[test]
    fn a_broken_table_is_reported_with_the_preset_name() {
        let bad = "[x]\nlayers = 1\nhidden = 8\nheads = 2\nkv_heads = 2\nffn_hidden = 8\n\
                   vocab = 10\nactivation = \"swiglu\"\nwidth = 3\n";
        let e = parse_table::<Model>(bad, "test", Model::validate).unwrap_err();
        assert!(matches!(&e, Error::DataFile { .. }), "{e:?}");
        assert!(
            e.to_string().contains("preset 'x'") && e.to_string().contains("width"),
            "{e}"
        );

        let invalid = bad
            .replace("width = 3\n", "")
            .replace("kv_heads = 2", "kv_heads = 3");
        let e = parse_table::<Model>(&invalid, "test", Model::validate).unwrap_err();
        assert!(e.to_string().contains("model.kv_heads"), "{e}");

        let named = bad.replace("width = 3\n", "name = \"y\"\n");
        let e = parse_table::<Model>(&named, "test", Model::validate).unwrap_err();
        assert!(e.to_string().contains("sets 'name'"), "{e}");

        let upper = bad.replace("[x]", "[Big_Model]").replace("width = 3\n", "");
        let e = parse_table::<Model>(&upper, "test", Model::validate).unwrap_err();
        assert!(e.to_string().contains("lower case"), "{e}");
    }
}

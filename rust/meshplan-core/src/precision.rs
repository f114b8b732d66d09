//! Low-precision training recipes (`data/precision.toml`, docs/costmodel.md §1.4 "Per-GEMM
//! precision"): which linear layers a recipe keeps in BF16 or runs in MXFP8 when the workload
//! trains in FP8/FP4. The layer description tags each linear with its role
//! ([`crate::layer::GemmRole`]); the time model asks the workload's recipe which precision that
//! role, and a layer at the stack's ends, runs at.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::layer::GemmRole;

const PRECISION_TOML: &str = include_str!("../data/precision.toml");

/// A linear role as `data/precision.toml` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum RoleName {
    Attention,
    LatentProjection,
    MambaOutProj,
    LmHead,
}

impl RoleName {
    /// Whether a linear of `role` is one the name covers ("attention": every projection of
    /// softmax attention, MLA's up-projections included).
    fn matches(self, role: GemmRole) -> bool {
        match self {
            RoleName::Attention => matches!(
                role,
                GemmRole::AttentionProjection | GemmRole::MlaUpProjection
            ),
            RoleName::LatentProjection => role == GemmRole::LatentProjection,
            RoleName::MambaOutProj => role == GemmRole::MambaOutProj,
            RoleName::LmHead => role == GemmRole::LmHead,
        }
    }
}

/// The precision one linear layer runs at under a recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmPrecision {
    /// The workload's precision.
    Workload,
    /// BF16 (no quantisation, no casts).
    Bf16,
    /// MXFP8 (where the GPU has it; else the workload's precision).
    Mxfp8,
}

/// One recipe of `data/precision.toml`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrecisionRecipe {
    /// Layers at the start of the stack that run entirely in BF16.
    #[serde(default)]
    pub bf16_layers_at_start: u32,
    /// Layers at the end of the stack that run entirely in BF16.
    #[serde(default)]
    pub bf16_layers_at_end: u32,
    /// The multi-token-prediction layers run in BF16 (Megatron-Bridge `keep_mtp_spec_in_bf16`).
    #[serde(default)]
    pub mtp_bf16: bool,
    /// The routed experts' MLP runs as Transformer Engine's fused MXFP8 grouped MLP (the
    /// CuTeDSL kernels behind `NVTE_CUTEDSL_FUSED_GROUPED_MLP`): the expert activation is
    /// computed in the GEMM epilogues, forward and backward, so its element-wise pass
    /// (the stack's `expert_activation_bytes_per_width`) is not charged. MXFP8 workloads only.
    #[serde(default)]
    pub fused_expert_mlp: bool,
    #[serde(default)]
    bf16: Vec<RoleName>,
    #[serde(default)]
    mxfp8: Vec<RoleName>,
}

fn recipes() -> &'static std::result::Result<BTreeMap<String, PrecisionRecipe>, Error> {
    static RECIPES: OnceLock<std::result::Result<BTreeMap<String, PrecisionRecipe>, Error>> =
        OnceLock::new();
    RECIPES.get_or_init(|| {
        toml::from_str(PRECISION_TOML)
            .map_err(|e| Error::invalid("data/precision.toml", e, "a table of precision recipes"))
    })
}

impl PrecisionRecipe {
    /// The recipe called `name` in `data/precision.toml`.
    pub fn named(name: &str) -> Result<&'static PrecisionRecipe> {
        let table = recipes().as_ref().map_err(Clone::clone)?;
        table.get(name).ok_or_else(|| {
            Error::invalid(
                "workload.precision_recipe",
                name,
                format!(
                    "one of {}",
                    table.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// Every recipe's name, sorted.
    pub fn names() -> Vec<String> {
        recipes()
            .as_ref()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The precision a linear of `role` runs at in a layer outside the BF16 ends: the
    /// recipe's per-module override, else the workload's.
    pub fn of(&self, role: GemmRole) -> GemmPrecision {
        if self.bf16.iter().any(|r| r.matches(role)) {
            GemmPrecision::Bf16
        } else if self.mxfp8.iter().any(|r| r.matches(role)) {
            GemmPrecision::Mxfp8
        } else {
            GemmPrecision::Workload
        }
    }

    /// The precision a linear of `role` runs at in one of the BF16 layers at the stack's ends:
    /// BF16, unless the recipe's per-module override names another precision (a module's own
    /// autocast wins over the layer's, Megatron-Core `TELinear.forward`).
    pub fn at_ends(&self, role: GemmRole) -> GemmPrecision {
        match self.of(role) {
            GemmPrecision::Mxfp8 => GemmPrecision::Mxfp8,
            _ => GemmPrecision::Bf16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nemotron_3_super_nvfp4_recipe_reads_as_megatron_bridge_writes_it() {
        let r = PrecisionRecipe::named("nemotron3-super-nvfp4").unwrap();
        assert_eq!((r.bf16_layers_at_start, r.bf16_layers_at_end), (0, 14));
        assert_eq!(r.of(GemmRole::AttentionProjection), GemmPrecision::Bf16);
        assert_eq!(r.of(GemmRole::LatentProjection), GemmPrecision::Bf16);
        assert_eq!(r.of(GemmRole::MambaOutProj), GemmPrecision::Mxfp8);
        assert_eq!(r.of(GemmRole::Other), GemmPrecision::Workload);
        // In the BF16 tail everything is BF16 but the MXFP8 module override.
        assert_eq!(r.at_ends(GemmRole::Other), GemmPrecision::Bf16);
        assert_eq!(r.at_ends(GemmRole::MambaOutProj), GemmPrecision::Mxfp8);
        assert!(r.mtp_bf16);
        assert_eq!(r.of(GemmRole::LmHead), GemmPrecision::Bf16);
        // The FP8/MXFP8 recipes keep only the LM head and the MTP block in BF16.
        let mx = PrecisionRecipe::named("nemotron3-fp8").unwrap();
        assert_eq!((mx.bf16_layers_at_start, mx.bf16_layers_at_end), (0, 0));
        assert!(mx.mtp_bf16);
        for role in [
            GemmRole::Other,
            GemmRole::AttentionProjection,
            GemmRole::LatentProjection,
            GemmRole::MambaOutProj,
        ] {
            assert_eq!(mx.of(role), GemmPrecision::Workload);
        }
        assert_eq!(mx.of(GemmRole::LmHead), GemmPrecision::Bf16);
    }

    #[test]
    fn an_unknown_recipe_names_the_field_and_the_choices() {
        let e = PrecisionRecipe::named("fp3").unwrap_err().to_string();
        assert!(
            e.contains("workload.precision_recipe") && e.contains("nemotron3-super-nvfp4"),
            "{e}"
        );
    }
}

//! Built-in presets (models, GPUs), parsed from the TOML files under `data/` that are embedded in
//! the binary: one source of truth for every front end.

use crate::error::Result;
use crate::hardware::Gpu;
use crate::model::Model;

/// Names of the model presets, sorted.
pub fn model_names() -> Vec<String> {
    todo!("presets: being written")
}

/// The model preset `name`, or [`crate::Error::UnknownPreset`] listing the available ones.
pub fn model(name: &str) -> Result<Model> {
    let _ = name;
    todo!("presets: being written")
}

/// Names of the GPU presets, sorted.
pub fn gpu_names() -> Vec<String> {
    todo!("presets: being written")
}

/// The GPU preset `name`, or [`crate::Error::UnknownPreset`] listing the available ones.
pub fn gpu(name: &str) -> Result<Gpu> {
    let _ = name;
    todo!("presets: being written")
}

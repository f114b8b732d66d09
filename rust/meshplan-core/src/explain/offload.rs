//! Activation offloading in `explain` (docs/costmodel.md §2.4.6, §5.6): what the plan's
//! offloaded layers take off the GPU and what their copies over the host link cost.

use super::*;
use crate::memory::offload_resident_share;

/// The plan's activation offloading on the worst (slowest) pipeline rank, per micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffloadCost {
    /// Transformer layers per model chunk whose activations go to the host.
    pub layers: u32,
    /// The GPU's host link, GB/s per direction.
    pub host_gbps: f64,
    /// GiB of one offloaded layer's stored activations (one micro-batch).
    pub layer_gib: f64,
    /// Seconds one layer's copy takes over the host link, one direction.
    pub copy_s_per_layer: f64,
    /// Layers of compute each copy overlaps (`⌊L/N⌋` of the chunk).
    pub window_layers: u32,
    /// GiB one in-flight micro-batch no longer keeps on the GPU at the peak (`N − 1` layers per
    /// chunk: the last group reloaded stays).
    pub saved_gib_per_micro_batch: f64,
    /// Seconds the copies add to one micro-batch's forward and backward (what outlasts the
    /// windows' compute).
    pub exposed_fwd_s_per_micro_batch: f64,
    pub exposed_bwd_s_per_micro_batch: f64,
}

impl Ctx<'_> {
    /// The plan's offloading on the worst rank (`None` without it).
    pub(super) fn offload(&self) -> Option<OffloadCost> {
        let host = self.problem.cluster.gpu.host_bandwidth_gbps?;
        let tc = TimeContext::new(self.problem, self.plan, self.groups);
        let (_, window) = tc.offload_window(&self.worst)?;
        let layers = tc.layers();
        let (fwd, bwd) = tc.offload_exposed(&self.worst, &layers);
        let layer_bytes = tc.offload_layer_bytes(&self.worst);
        let stored = layer_bytes * self.worst.layers() as f64;
        Some(OffloadCost {
            layers: self.plan.offloaded_layers(),
            host_gbps: host,
            layer_gib: layer_bytes / crate::memory::GIB,
            copy_s_per_layer: tc.offload_copy_s(&self.worst),
            window_layers: window,
            saved_gib_per_micro_batch: stored
                * (1.0 - offload_resident_share(self.plan, &self.worst))
                / crate::memory::GIB,
            exposed_fwd_s_per_micro_batch: fwd,
            exposed_bwd_s_per_micro_batch: bwd,
        })
    }
}

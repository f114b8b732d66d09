//! The device mesh as a value (docs/costmodel.md §3.3): axes with their sizes, innermost first, so that
//! rank `r` has coordinate `(r / stride_i) mod size_i` on axis `i`. A plan's degrees and rank
//! order (`dp=..,tp=..`, `order = "tp-cp-ep-dp-pp"`) are one spelling of a mesh ([`Plan::mesh`]);
//! what each communication group spans is data over it ([`GROUP_AXES`]), so a second mesh over
//! the same ranks (an expert mesh with its own TP and DP) is one more table, not new fields in
//! every module. `layout` places the groups of a mesh on the NVLink domains.

use crate::plan::{Axis, Plan, RankOrder};

/// One axis of a mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MeshAxis {
    pub axis: Axis,
    pub size: u32,
}

/// Axes a mesh has (the five of [`Axis`]).
pub const MESH_AXES: usize = 5;

/// A device mesh: every axis once, with its size, innermost (fastest-varying rank) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: [MeshAxis; MESH_AXES],
}

impl Mesh {
    /// The mesh of axes `order` (innermost first) with `size(axis)` ranks along each.
    pub fn new(order: RankOrder, size: impl Fn(Axis) -> u32) -> Self {
        Mesh {
            axes: order.axes().map(|axis| MeshAxis {
                axis,
                size: size(axis),
            }),
        }
    }

    /// The axes, innermost first.
    pub fn axes(&self) -> &[MeshAxis] {
        &self.axes
    }

    /// The size of `axis`.
    pub fn size(&self, axis: Axis) -> u32 {
        self.axes
            .iter()
            .find(|a| a.axis == axis)
            .map_or(1, |a| a.size)
    }

    /// The order of the axes.
    pub fn order(&self) -> RankOrder {
        RankOrder::new(self.axes.map(|a| a.axis)).expect("a mesh holds every axis once")
    }

    /// Ranks of the mesh (saturating).
    pub fn num_ranks(&self) -> u64 {
        self.axes
            .iter()
            .fold(1u64, |n, a| n.saturating_mul(a.size as u64))
    }
}

impl Plan {
    /// The plan's device mesh: its degrees along its rank order.
    pub fn mesh(&self) -> Mesh {
        Mesh::new(self.order, |axis| axis.size(self))
    }
}

/// A communication group of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupRole {
    /// Tensor parallel (also the experts' TP: expert TP = TP today).
    Tp,
    /// Context parallel ring.
    Cp,
    /// Expert parallel all-to-all.
    Ep,
    /// Gradient reduction of dense parameters (§2.3).
    DenseDp,
    /// Gradient reduction of expert parameters (§2.3).
    ExpertDp,
    /// The pipeline.
    Pp,
}

/// The mesh axes each group spans. The expert groups are today's expert mesh over the same
/// ranks: EP carved out of DP (the dense DP group spans cp·ep·dp, the expert DP group cp·dp)
/// and expert TP equal to TP.
pub const GROUP_AXES: [(GroupRole, &[Axis]); 6] = [
    (GroupRole::Tp, &[Axis::Tp]),
    (GroupRole::Cp, &[Axis::Cp]),
    (GroupRole::Ep, &[Axis::Ep]),
    (GroupRole::DenseDp, &[Axis::Cp, Axis::Ep, Axis::Dp]),
    (GroupRole::ExpertDp, &[Axis::Cp, Axis::Dp]),
    (GroupRole::Pp, &[Axis::Pp]),
];

/// The axes `role` spans.
pub fn group_axes(role: GroupRole) -> &'static [Axis] {
    GROUP_AXES
        .iter()
        .find(|(r, _)| *r == role)
        .map_or(&[], |(_, axes)| axes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_spells_a_mesh_along_its_order() {
        let plan = Plan {
            dp: 4,
            tp: 8,
            pp: 2,
            ep: 2,
            cp: 1,
            vpp: 1,
            micro_batch: 1,
            zero: 0,
            recompute: Default::default(),
            sequence_parallel: false,
            schedule: None,
            order: RankOrder::parse("tp-dp-ep-cp-pp").unwrap(),
        };
        let mesh = plan.mesh();
        let sizes: Vec<(Axis, u32)> = mesh.axes().iter().map(|a| (a.axis, a.size)).collect();
        assert_eq!(
            sizes,
            vec![
                (Axis::Tp, 8),
                (Axis::Dp, 4),
                (Axis::Ep, 2),
                (Axis::Cp, 1),
                (Axis::Pp, 2)
            ]
        );
        assert_eq!(mesh.num_ranks(), 128);
        assert_eq!(mesh.order(), plan.order);
        assert_eq!(mesh.size(Axis::Ep), 2);
    }

    #[test]
    fn every_group_role_spans_some_axis() {
        for (role, axes) in GROUP_AXES {
            assert!(!axes.is_empty(), "{role:?}");
            assert_eq!(group_axes(role), axes);
        }
    }
}

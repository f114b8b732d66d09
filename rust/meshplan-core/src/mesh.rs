//! The device mesh as a value (docs/costmodel.md §3.3): axes with their sizes, innermost first, so that
//! rank `r` has coordinate `(r / stride_i) mod size_i` on axis `i`. A plan's degrees and rank
//! order (`dp=..,tp=..`, `order = "tp-cp-ep-dp-pp"`) are one spelling of a mesh ([`Plan::mesh`]);
//! what each communication group spans is data over it ([`GROUP_AXES`]). The MoE layers' experts
//! see the same ranks as a second mesh, [`ExpertMesh`] (`etp × ep × edp × pp`, [`Plan::expert_mesh`]),
//! whose expert-DP group is the expert gradient reduction. `layout` places the groups of both on
//! the NVLink domains.

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
    /// The plan's device mesh: its degrees along its rank order. A folded plan's has no EP
    /// axis (size 1): its dense layers see `tp × cp × dp × pp`.
    pub fn mesh(&self) -> Mesh {
        if self.folded() {
            Mesh::new(self.order, |axis| match axis {
                Axis::Ep => 1,
                _ => axis.size(self),
            })
        } else {
            Mesh::new(self.order, |axis| axis.size(self))
        }
    }

    /// The plan's expert mesh over the same ranks: the dense mesh itself (`etp = tp`,
    /// `edp = dp·cp`), or a folded plan's own `etp × ep × edp × pp` laid out along the same rank
    /// order (Megatron builds the expert rank groups with the dense order, expert TP in TP's
    /// place, EP in EP's, expert DP in DP's and no CP: `RankGenerator` in
    /// megatron/core/parallel_state.py).
    pub fn expert_mesh(&self) -> ExpertMesh {
        match self.etp {
            None => ExpertMesh::over(self.mesh()),
            Some(etp) => ExpertMesh::over(Mesh::new(self.order, |axis| match axis {
                Axis::Tp => etp,
                Axis::Cp => 1,
                Axis::Ep => self.ep,
                Axis::Dp => self.expert_dp(),
                Axis::Pp => self.pp,
            })),
        }
    }
}

/// A dimension of the expert mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpertDim {
    /// Expert tensor parallelism: each expert's weights split this many ways.
    Etp,
    /// Expert parallelism: the routed experts split this many ways (token all-to-all).
    Ep,
    /// Expert data parallelism: replicas of each expert shard (expert gradient reduction).
    Edp,
    /// The pipeline (shared with the dense layers).
    Pp,
}

/// The expert mesh: the ranks of a plan as the MoE layers' experts see them,
/// `etp × ep × edp × pp`, a [`Mesh`] whose dimensions span its axes ([`ExpertMesh::spans`]:
/// `etp` the TP axis, `ep` the EP axis, `edp` the CP and DP axes). Without parallel folding it
/// is the dense mesh itself (`etp = tp`, `edp = dp·cp`, EP carved out of the dense data
/// parallelism), so its groups land where the dense mesh's do; a folded plan's is a mesh of its
/// own over the same ranks (CP size 1), and the callers do not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpertMesh {
    mesh: Mesh,
}

impl ExpertMesh {
    /// The dimensions, innermost (in the default rank order) first.
    pub const DIMS: [ExpertDim; 4] = [ExpertDim::Etp, ExpertDim::Ep, ExpertDim::Edp, ExpertDim::Pp];

    /// The expert mesh whose dimensions span the axes of `mesh`.
    pub fn over(mesh: Mesh) -> Self {
        ExpertMesh { mesh }
    }

    /// The mesh whose axes the dimensions span (its rank order and strides): the dense mesh,
    /// or a folded plan's expert mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The dense axes `dim` spans over the same ranks.
    pub fn spans(dim: ExpertDim) -> &'static [Axis] {
        match dim {
            ExpertDim::Etp => &[Axis::Tp],
            ExpertDim::Ep => &[Axis::Ep],
            ExpertDim::Edp => &[Axis::Cp, Axis::Dp],
            ExpertDim::Pp => &[Axis::Pp],
        }
    }

    /// The size of `dim` (saturating).
    pub fn size(&self, dim: ExpertDim) -> u32 {
        ExpertMesh::spans(dim)
            .iter()
            .fold(1u32, |n, &a| n.saturating_mul(self.mesh.size(a)))
    }

    /// Ranks of the mesh (saturating): the dense mesh's.
    pub fn num_ranks(&self) -> u64 {
        ExpertMesh::DIMS
            .iter()
            .fold(1u64, |n, &d| n.saturating_mul(self.size(d) as u64))
    }
}

/// A communication group of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupRole {
    /// Tensor parallel (also the experts' TP unless the plan is folded).
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

/// The dense mesh axes each dense group spans (the dense DP group spans cp·ep·dp: EP ranks are
/// extra data parallelism for the dense layers). The expert groups are the expert mesh's
/// ([`ExpertMesh`]): EP is its `ep`, the expert DP group its `edp`.
pub const GROUP_AXES: [(GroupRole, &[Axis]); 5] = [
    (GroupRole::Tp, &[Axis::Tp]),
    (GroupRole::Cp, &[Axis::Cp]),
    (GroupRole::Ep, &[Axis::Ep]),
    (GroupRole::DenseDp, &[Axis::Cp, Axis::Ep, Axis::Dp]),
    (GroupRole::Pp, &[Axis::Pp]),
];

/// The axes of the dense mesh `role` spans (the expert DP group: the expert mesh's `edp`).
pub fn group_axes(role: GroupRole) -> &'static [Axis] {
    match role {
        GroupRole::ExpertDp => ExpertMesh::spans(ExpertDim::Edp),
        _ => GROUP_AXES
            .iter()
            .find(|(r, _)| *r == role)
            .map_or(&[], |(_, axes)| axes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan of degrees `[dp, tp, pp, ep, cp]` laid out along `order`.
    fn plan([dp, tp, pp, ep, cp]: [u32; 5], order: &str) -> Plan {
        Plan {
            dp,
            tp,
            pp,
            ep,
            cp,
            order: RankOrder::parse(order).unwrap(),
            ..Plan::default()
        }
    }

    #[test]
    fn a_plan_spells_a_mesh_along_its_order() {
        let plan = plan([4, 8, 2, 2, 1], "tp-dp-ep-cp-pp");
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
    fn the_expert_mesh_factors_the_same_ranks() {
        let plan = plan([4, 8, 2, 2, 3], "tp-cp-ep-dp-pp");
        let e = plan.expert_mesh();
        let sizes: Vec<u32> = ExpertMesh::DIMS.iter().map(|&d| e.size(d)).collect();
        assert_eq!(sizes, vec![8, 2, 12, 2]);
        assert_eq!(e.num_ranks(), plan.mesh().num_ranks());
        assert_eq!(e.num_ranks(), 384);
        assert_eq!(group_axes(GroupRole::ExpertDp), &[Axis::Cp, Axis::Dp]);
        // Every dense axis belongs to exactly one expert dimension.
        for a in plan.order.axes() {
            let n = ExpertMesh::DIMS
                .iter()
                .filter(|&&d| ExpertMesh::spans(d).contains(&a))
                .count();
            assert_eq!(n, 1, "{a:?}");
        }
    }

    #[test]
    fn a_folded_plan_has_its_own_expert_mesh_over_the_same_ranks() {
        // Qwen3-235B as Megatron-Bridge runs it on 256 H100: TP 2, PP 8, DP 16, EP 32, ETP 1.
        let qwen = Plan {
            etp: Some(1),
            ..plan([16, 2, 8, 32, 1], "tp-cp-ep-dp-pp")
        };
        assert_eq!(qwen.num_gpus(), 256);
        assert_eq!(qwen.dense_dp(), 16);
        assert_eq!(qwen.expert_dp(), 1);
        let dense = qwen.mesh();
        assert_eq!(dense.size(Axis::Ep), 1);
        assert_eq!(dense.num_ranks(), 256);
        let e = qwen.expert_mesh();
        let sizes: Vec<u32> = ExpertMesh::DIMS.iter().map(|&d| e.size(d)).collect();
        assert_eq!(sizes, vec![1, 32, 1, 8]);
        assert_eq!(e.num_ranks(), 256);
        // EP spans the 32 consecutive ranks of a stage: the dense TP pairs and 16 DP ranks.
        let ep = crate::layout::group_ranks(e.mesh(), ExpertMesh::spans(ExpertDim::Ep), 0, 64);
        assert_eq!(ep, (0..32).collect::<Vec<u64>>());
        let g = crate::layout::Groups::of(&qwen, 8);
        assert_eq!((g.ep.size, g.ep.per_domain), (32, 8));
        assert_eq!((g.etp.size, g.expert_dp.size, g.tp.size), (1, 1, 2));
        assert_eq!(g.dense_dp.size, 16);
        // Folding over CP too: tp 2, cp 2, dp 2 (8 ranks a stage), etp 2, ep 4.
        let cp = Plan {
            etp: Some(2),
            ..plan([2, 2, 1, 4, 2], "tp-cp-ep-dp-pp")
        };
        assert_eq!(cp.num_gpus(), 8);
        assert_eq!(cp.expert_dp(), 1);
        let g = crate::layout::Groups::of(&cp, 8);
        assert_eq!(
            (g.ep.size, g.etp.size, g.cp.size, g.dense_dp.size),
            (4, 2, 2, 4)
        );
    }

    #[test]
    fn an_unfolded_plans_expert_groups_are_the_dense_meshs() {
        let plan = plan([4, 2, 1, 2, 1], "tp-cp-ep-dp-pp");
        let g = crate::layout::Groups::of(&plan, 8);
        assert_eq!(g.etp, g.tp);
        assert_eq!(plan.expert_mesh().mesh(), &plan.mesh());
        assert_eq!(plan.expert_dp(), 4);
        assert_eq!(plan.expert_tp(), 2);
    }

    #[test]
    fn every_group_role_spans_some_axis() {
        for (role, axes) in GROUP_AXES {
            assert!(!axes.is_empty(), "{role:?}");
            assert_eq!(group_axes(role), axes);
        }
    }
}

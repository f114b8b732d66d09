//! Rank layout: where the groups of each parallel axis land, given the plan's rank order
//! (docs/costmodel.md §3.3; Megatron's default `tp-cp-ep-dp-pp`, TP innermost). For a group we need how
//! many of its members share one NVLink domain (`P1`) and how many domains it spans
//! (`P2 = P / P1`): that decides which fabric each collective is costed on (§3.2). The dense
//! data-parallel group is the dp, ep and cp axes together, the expert data-parallel group dp and
//! cp (§2.3). The dense groups are rows of [`crate::mesh::GROUP_AXES`] placed on a
//! [`crate::mesh::Mesh`] value, the expert DP group is the `edp` of its
//! [`crate::mesh::ExpertMesh`].

use crate::mesh::{group_axes, ExpertDim, ExpertMesh, GroupRole, Mesh};
use crate::plan::Plan;
pub use crate::plan::{Axis, RankOrder};

/// The default rank order, innermost first (Megatron `tp-cp-ep-dp-pp`).
pub const DEFAULT_ORDER: [Axis; 5] = [Axis::Tp, Axis::Cp, Axis::Ep, Axis::Dp, Axis::Pp];

/// Placement of one communication group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Members of the group.
    pub size: u32,
    /// Members inside one NVLink domain (`P1`).
    pub per_domain: u32,
}

impl Group {
    /// A group of one (no communication).
    pub const SINGLE: Group = Group {
        size: 1,
        per_domain: 1,
    };

    /// Domains spanned (`P2`).
    pub fn domains(&self) -> u32 {
        self.size / self.per_domain.max(1)
    }

    /// Whether every member sits in one NVLink domain.
    pub fn within_domain(&self) -> bool {
        self.per_domain >= self.size
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One axis of a mesh with its stride: the product of the sizes of the axes inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stride {
    pub axis: Axis,
    pub size: u32,
    pub stride: u64,
}

/// Stride of each axis of `mesh`, innermost first.
pub fn strides(mesh: &Mesh) -> Vec<Stride> {
    let mut stride: u64 = 1;
    mesh.axes()
        .iter()
        .map(|a| {
            let out = Stride {
                axis: a.axis,
                size: a.size,
                stride,
            };
            stride = stride.saturating_mul(a.size as u64);
            out
        })
        .collect()
}

/// The first `max` ranks of the group spanning `axes` that contains `rank`, ascending (all of
/// them when the group has no more). Only the ranks returned are built: the group's members are
/// `base + Σ cᵢ·strideᵢ` over its axes, and counting the coordinates `cᵢ` with the innermost
/// axis fastest lists them in increasing order (each axis's stride is at least the span of the
/// axes inside it).
pub fn group_ranks(mesh: &Mesh, axes: &[Axis], rank: u64, max: usize) -> Vec<u64> {
    let mut base = rank;
    // (size, stride) of the group's axes, innermost first.
    let mut dims: Vec<(u64, u64)> = Vec::with_capacity(5);
    for Stride {
        axis,
        size: n,
        stride,
    } in strides(mesh)
    {
        if axes.contains(&axis) {
            // Drop this rank's own coordinate on the axis.
            base -= (rank / stride) % n.max(1) as u64 * stride;
            dims.push((n.max(1) as u64, stride));
        }
    }
    let size = dims.iter().fold(1u64, |acc, (n, _)| acc.saturating_mul(*n));
    let mut out = Vec::with_capacity(size.min(max as u64) as usize);
    let mut coords = vec![0u64; dims.len()];
    for _ in 0..size.min(max as u64) {
        out.push(
            base + coords
                .iter()
                .zip(&dims)
                .map(|(c, (_, s))| c * s)
                .sum::<u64>(),
        );
        // Next coordinates, innermost fastest.
        for (c, (n, _)) in coords.iter_mut().zip(&dims) {
            *c += 1;
            if *c < *n {
                break;
            }
            *c = 0;
        }
    }
    out
}

/// Members of a group spanning `axes` that share one domain of `domain` GPUs, in the mesh's order.
///
/// For each axis with stride `σ` (product of the sizes before it) and size `n`, the members of the
/// group that fall into one domain are `gcd(n, domain/σ)` when `σ < domain` (1 otherwise); the
/// product over the group's axes is `P1`. The gcd makes a group that does not tile the domain
/// evenly count as spanning two domains, which is what its slowest member pair sees.
pub fn group(mesh: &Mesh, axes: &[Axis], domain: u32) -> Group {
    let mut stride: u64 = 1;
    let mut size: u32 = 1;
    let mut per_domain: u32 = 1;
    for a in mesh.axes() {
        let (axis, n) = (a.axis, a.size);
        if axes.contains(&axis) {
            // Saturating: a validated plan's groups hold at most its GPU count.
            size = size.saturating_mul(n);
            if stride < domain as u64 {
                let room = (domain as u64 / stride) as u32;
                per_domain = per_domain.saturating_mul(gcd(n, room.max(1)));
            }
        }
        stride = stride.saturating_mul(n as u64);
    }
    Group {
        size,
        per_domain: per_domain.min(size).max(1),
    }
}

/// The groups a plan communicates over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    pub tp: Group,
    pub cp: Group,
    /// Expert parallel all-to-all: the expert mesh's `ep`.
    pub ep: Group,
    /// Expert tensor parallelism: the expert mesh's `etp` (the TP group unless folded).
    pub etp: Group,
    /// Gradient reduction of dense parameters: dp·ep·cp ranks (dp·cp folded), §2.3.
    pub dense_dp: Group,
    /// Gradient reduction of expert parameters: the expert mesh's `edp` (dp·cp unfolded), §2.3.
    pub expert_dp: Group,
    /// Neighbouring pipeline stages (a pair: `per_domain == 2` means NVLink).
    pub pp: Group,
}

/// GPUs of the job inside one NVLink domain: the largest divisor of the job size that fits in a
/// domain. A job is spread over domains in equal blocks (a 256-GPU job on 72-GPU NVL72 racks
/// runs 64 GPUs per rack; a 512-GPU job on 8-GPU HGX nodes fills each node), so no rank group
/// straddles a domain boundary that the block size does not force.
pub fn domain_block(num_gpus: u64, domain: u32) -> u32 {
    let n = num_gpus.max(1);
    let domain = domain.max(1) as u64;
    // Divisors come in pairs (i, n / i) with i ≤ √n: O(√n) steps, not O(domain).
    let mut best = 1;
    let mut i = 1u64;
    while i.saturating_mul(i) <= n {
        if n % i == 0 {
            for d in [i, n / i] {
                if d <= domain && d > best {
                    best = d;
                }
            }
        }
        i += 1;
    }
    best as u32
}

impl Groups {
    /// Places every group of `plan` on a cluster with NVLink domains of `domain` GPUs: the
    /// dense groups on its [`Plan::mesh`], the expert groups on its [`Plan::expert_mesh`].
    pub fn of(plan: &Plan, domain: u32) -> Self {
        let domain = domain_block(plan.num_gpus(), domain);
        Groups::on(&plan.mesh(), &plan.expert_mesh(), domain)
    }

    /// Places every group of [`crate::mesh::GROUP_AXES`] on `mesh` and the expert groups on
    /// `expert`, `domain` of their ranks per NVLink domain (already the job's [`domain_block`]).
    pub fn on(mesh: &Mesh, expert: &ExpertMesh, domain: u32) -> Self {
        let of = |role| group(mesh, group_axes(role), domain);
        let on_expert = |dim| group(expert.mesh(), ExpertMesh::spans(dim), domain);
        let pp_all = of(GroupRole::Pp);
        // Two consecutive stages share a domain iff the pipeline axis has more than one member per domain.
        let pp = if mesh.size(Axis::Pp) > 1 {
            Group {
                size: 2,
                per_domain: if pp_all.per_domain > 1 { 2 } else { 1 },
            }
        } else {
            Group::SINGLE
        };
        Groups {
            tp: of(GroupRole::Tp),
            cp: of(GroupRole::Cp),
            ep: on_expert(ExpertDim::Ep),
            etp: on_expert(ExpertDim::Etp),
            dense_dp: of(GroupRole::DenseDp),
            expert_dp: on_expert(ExpertDim::Edp),
            pp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(dp: u32, tp: u32, pp: u32, ep: u32, cp: u32) -> Plan {
        Plan {
            dp,
            tp,
            pp,
            ep,
            cp,
            ..Plan::default()
        }
    }

    fn ordered(p: Plan, order: &str) -> Plan {
        Plan {
            order: RankOrder::parse(order).unwrap(),
            ..p
        }
    }

    #[test]
    fn costmodel_examples_g8() {
        // §3.3: t = 8 → TP on NVLink, the rest on the NIC.
        let g = Groups::of(&plan(16, 8, 4, 1, 1), 8);
        assert!(g.tp.within_domain());
        assert_eq!(g.dense_dp.per_domain, 1);
        assert_eq!(g.pp.per_domain, 1);
        // t = 4, c = 2 → TP and CP on NVLink.
        let g = Groups::of(&plan(8, 4, 1, 1, 2), 8);
        assert!(g.tp.within_domain() && g.cp.within_domain());
        assert_eq!(
            g.dense_dp,
            Group {
                size: 16,
                per_domain: 2
            }
        );
        // t = 2, e = 4 → TP and EP inside the node.
        let g = Groups::of(&plan(4, 2, 1, 4, 1), 8);
        assert!(g.ep.within_domain());
        assert_eq!(
            g.expert_dp,
            Group {
                size: 4,
                per_domain: 1
            }
        );
    }

    #[test]
    fn a_group_that_does_not_tile_the_domain_spans_two() {
        // 16 DP ranks with stride 1 in a 72-GPU domain: gcd(16, 72) = 8 per domain.
        let g = group(&plan(16, 1, 1, 1, 1).mesh(), &[Axis::Dp], 72);
        assert_eq!(
            g,
            Group {
                size: 16,
                per_domain: 8
            }
        );
        assert_eq!(g.domains(), 2);
    }

    #[test]
    fn jobs_fill_nvl72_racks_in_power_of_two_blocks() {
        assert_eq!(domain_block(256, 72), 64);
        assert_eq!(domain_block(576, 72), 72);
        assert_eq!(domain_block(8, 72), 8);
        assert_eq!(domain_block(96, 8), 8);
        // EP = 64 of a 256-GPU job stays inside one rack.
        let g = Groups::of(&plan(1, 1, 4, 64, 1), 72);
        assert!(g.ep.within_domain());
    }

    #[test]
    fn whole_pipeline_inside_a_domain_uses_nvlink() {
        let g = Groups::of(&plan(1, 4, 4, 1, 1), 72);
        assert_eq!(g.pp.per_domain, 2);
    }

    #[test]
    fn the_default_order_is_megatrons() {
        assert_eq!(RankOrder::DEFAULT.axes(), DEFAULT_ORDER);
        let s = strides(&plan(2, 4, 2, 1, 2).mesh());
        let got: Vec<(Axis, u32, u64)> = s.iter().map(|s| (s.axis, s.size, s.stride)).collect();
        assert_eq!(
            got,
            vec![
                (Axis::Tp, 4, 1),
                (Axis::Cp, 2, 4),
                (Axis::Ep, 1, 8),
                (Axis::Dp, 2, 8),
                (Axis::Pp, 2, 16)
            ]
        );
    }

    #[test]
    fn the_order_decides_which_group_is_inside_the_node() {
        // dp = 8, tp = 2 on 16 GPUs of 8-GPU nodes. Default: TP inside, DP straddles two nodes
        // with 4 members in each. DP innermost: the 8 DP ranks fill one node, TP crosses.
        let p = plan(8, 2, 1, 1, 1);
        let g = Groups::of(&p, 8);
        assert!(g.tp.within_domain());
        assert_eq!(
            g.dense_dp,
            Group {
                size: 8,
                per_domain: 4
            }
        );
        let g = Groups::of(&ordered(p, "dp-tp-cp-ep-pp"), 8);
        assert_eq!(
            g.tp,
            Group {
                size: 2,
                per_domain: 1
            }
        );
        assert!(g.dense_dp.within_domain());
    }

    #[test]
    fn group_ranks_follow_the_strides() {
        let p = plan(2, 4, 2, 1, 2); // tp stride 1, cp 4, dp 8, pp 16
        assert_eq!(group_ranks(&p.mesh(), &[Axis::Tp], 0, 64), vec![0, 1, 2, 3]);
        assert_eq!(group_ranks(&p.mesh(), &[Axis::Tp], 6, 64), vec![4, 5, 6, 7]);
        assert_eq!(group_ranks(&p.mesh(), &[Axis::Cp], 1, 64), vec![1, 5]);
        assert_eq!(group_ranks(&p.mesh(), &[Axis::Pp], 3, 64), vec![3, 19]);
        assert_eq!(
            group_ranks(&p.mesh(), &[Axis::Cp, Axis::Ep, Axis::Dp], 0, 64),
            vec![0, 4, 8, 12]
        );
        let q = ordered(p, "pp-dp-cp-ep-tp"); // pp stride 1, dp 2, cp 4, tp 8
        assert_eq!(
            group_ranks(&q.mesh(), &[Axis::Tp], 0, 64),
            vec![0, 8, 16, 24]
        );
        assert_eq!(group_ranks(&q.mesh(), &[Axis::Pp], 5, 64), vec![4, 5]);
    }

    #[test]
    fn group_ranks_are_the_groups_members_in_order_and_stop_at_max() {
        // Reference: every rank whose coordinates off the group's axes are those of `rank`.
        let coord = |p: &Plan, q: u64, axis: Axis| {
            let s = strides(&p.mesh())
                .into_iter()
                .find(|s| s.axis == axis)
                .unwrap();
            (q / s.stride) % s.size as u64
        };
        let subsets: [&[Axis]; 5] = [
            &[Axis::Tp],
            &[Axis::Pp],
            &[Axis::Cp, Axis::Dp],
            &[Axis::Cp, Axis::Ep, Axis::Dp],
            &Axis::ALL,
        ];
        for order in ["tp-cp-ep-dp-pp", "pp-dp-cp-ep-tp", "dp-tp-pp-cp-ep"] {
            let p = ordered(plan(3, 2, 2, 2, 2), order);
            let n = p.num_gpus();
            for axes in subsets {
                for rank in [0, 5, n - 1] {
                    let want: Vec<u64> = (0..n)
                        .filter(|&q| {
                            Axis::ALL
                                .iter()
                                .filter(|a| !axes.contains(a))
                                .all(|&a| coord(&p, q, a) == coord(&p, rank, a))
                        })
                        .collect();
                    assert_eq!(group_ranks(&p.mesh(), axes, rank, usize::MAX), want);
                    assert_eq!(
                        group_ranks(&p.mesh(), axes, rank, 3),
                        want[..want.len().min(3)]
                    );
                }
            }
        }
        // A group of 2^20 ranks: only the ranks asked for are built.
        let huge = plan(1 << 20, 1, 1, 1, 1);
        assert_eq!(
            group_ranks(&huge.mesh(), &[Axis::Dp], 0, 64),
            (0..64).collect::<Vec<u64>>()
        );
    }

    #[test]
    fn domain_block_is_the_largest_divisor_that_fits() {
        for n in 1..=400u64 {
            for domain in [1u32, 2, 7, 8, 9, 64, 72, 100, 500, u32::MAX] {
                let want = (1..=(domain as u64).min(n))
                    .rev()
                    .find(|d| n % d == 0)
                    .unwrap();
                assert_eq!(domain_block(n, domain) as u64, want, "{n} {domain}");
            }
        }
        assert_eq!(domain_block(1 << 20, u32::MAX), 1 << 20);
        // A prime job size on a huge domain: √n steps, not `domain`.
        assert_eq!(domain_block(1_048_573, 1_048_572), 1);
    }
}

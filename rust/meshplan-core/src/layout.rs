//! Rank layout: where the groups of each parallel axis land, given the rank order (COSTMODEL
//! §3.3, Megatron's default `tp-cp-ep-dp-pp`, TP innermost). For a group we need how many of its
//! members share one NVLink domain (`P1`) and how many domains it spans (`P2 = P / P1`): that
//! decides which fabric each collective is costed on (§3.2).

use crate::plan::Plan;

/// An axis of the device mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Tp,
    Cp,
    Ep,
    Dp,
    Pp,
}

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

fn size_of(plan: &Plan, axis: Axis) -> u32 {
    match axis {
        Axis::Tp => plan.tp,
        Axis::Cp => plan.cp,
        Axis::Ep => plan.ep,
        Axis::Dp => plan.dp,
        Axis::Pp => plan.pp,
    }
}

/// Members of a group spanning `axes` that share one domain of `domain` GPUs, in the default order.
///
/// For each axis with stride `σ` (product of the sizes before it) and size `n`, the members of the
/// group that fall into one domain are `gcd(n, domain/σ)` when `σ < domain` (1 otherwise); the
/// product over the group's axes is `P1`. The gcd makes a group that does not tile the domain
/// evenly count as spanning two domains, which is what its slowest member pair sees.
pub fn group(plan: &Plan, axes: &[Axis], domain: u32) -> Group {
    let mut stride: u64 = 1;
    let mut size: u32 = 1;
    let mut per_domain: u32 = 1;
    for axis in DEFAULT_ORDER {
        let n = size_of(plan, axis);
        if axes.contains(&axis) {
            size *= n;
            if stride < domain as u64 {
                let room = (domain as u64 / stride) as u32;
                per_domain *= gcd(n, room.max(1));
            }
        }
        stride *= n as u64;
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
    pub ep: Group,
    /// Gradient reduction of dense parameters: dp·ep·cp ranks (§2.3).
    pub dense_dp: Group,
    /// Gradient reduction of expert parameters: dp·cp ranks (§2.3).
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
    (1..=domain.max(1) as u64)
        .rev()
        .find(|d| n % d == 0)
        .unwrap_or(1) as u32
}

impl Groups {
    /// Places every group of `plan` on a cluster with NVLink domains of `domain` GPUs.
    pub fn of(plan: &Plan, domain: u32) -> Self {
        let domain = domain_block(plan.num_gpus(), domain);
        let pp_all = group(plan, &[Axis::Pp], domain);
        // Two consecutive stages share a domain iff the pipeline axis has more than one member per domain.
        let pp = if plan.pp > 1 {
            Group {
                size: 2,
                per_domain: if pp_all.per_domain > 1 { 2 } else { 1 },
            }
        } else {
            Group::SINGLE
        };
        Groups {
            tp: group(plan, &[Axis::Tp], domain),
            cp: group(plan, &[Axis::Cp], domain),
            ep: group(plan, &[Axis::Ep], domain),
            dense_dp: group(plan, &[Axis::Cp, Axis::Ep, Axis::Dp], domain),
            expert_dp: group(plan, &[Axis::Cp, Axis::Dp], domain),
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
            vpp: 1,
            micro_batch: 1,
            zero: 0,
            recompute: Default::default(),
            sequence_parallel: false,
            schedule: None,
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
        let g = group(&plan(16, 1, 1, 1, 1), &[Axis::Dp], 72);
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
}

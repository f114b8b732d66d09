//! α–β costs of collectives on the fabric a group lands on (docs/costmodel.md §3.1–3.2): ring-style
//! bandwidth terms (`2(P−1)/P` all-reduce, `(P−1)/P` all-gather, reduce-scatter, all-to-all),
//! hierarchical NVLink-then-network decomposition, and log-depth latency terms.
//!
//! Every cost goes through one interface, [`CollectiveModel`]: a collective, an MoE dispatch or a
//! point-to-point transfer gives a [`CollectiveCost`] — its latency, its bandwidth time and the
//! algorithm chosen. Time uses the total, explain the two terms; a new algorithm (NCCL's tree,
//! PAT, NVLS) is a new [`Algorithm`] chosen inside an implementation of the trait, with no change
//! to its callers. [`Fabric`] is today's model; `Fabric::collective_s` and friends are the totals.

use crate::hardware::{Cluster, ScaleupTopology};
use crate::layout::Group;

/// Collective kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

/// How a collective is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Nothing to move (a group of one, or no bytes).
    Nothing,
    /// A ring inside one scale-up domain.
    Ring,
    /// A ring inside each domain, then a ring over the domains on the network (§3.2).
    HierarchicalRing,
    /// Every rank sends each peer its share directly (all-to-all, §3.2).
    Pairwise,
    /// MoE dispatch deduplicated per remote domain, fanned out over NVLink there (§3.7).
    DomainDeduplicatedDispatch,
    /// One send to one peer (§3.5).
    PointToPoint,
}

impl Algorithm {
    /// A short human name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Nothing => "none",
            Algorithm::Ring => "ring",
            Algorithm::HierarchicalRing => "hierarchical ring",
            Algorithm::Pairwise => "pairwise",
            Algorithm::DomainDeduplicatedDispatch => "domain-deduplicated dispatch",
            Algorithm::PointToPoint => "point-to-point",
        }
    }
}

/// The cost of one collective: `total_s` is the time charged (the latency and bandwidth terms of
/// the algorithm, summed as the algorithm's formula sums them); `bandwidth_s` is what is left of
/// it beyond the latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CollectiveCost {
    pub latency_s: f64,
    pub bandwidth_s: f64,
    pub total_s: f64,
    pub algorithm: Algorithm,
}

impl CollectiveCost {
    const NOTHING: CollectiveCost = CollectiveCost {
        latency_s: 0.0,
        bandwidth_s: 0.0,
        total_s: 0.0,
        algorithm: Algorithm::Nothing,
    };

    fn of(latency_s: f64, total_s: f64, algorithm: Algorithm) -> Self {
        CollectiveCost {
            latency_s,
            bandwidth_s: total_s - latency_s,
            total_s,
            algorithm,
        }
    }
}

/// The one interface of collective costing.
pub trait CollectiveModel {
    /// A collective of `kind` on `bytes` per rank over `group`.
    fn collective(&self, kind: Collective, bytes: f64, group: Group) -> CollectiveCost;
    /// One MoE token dispatch (or combine) over the expert-parallel `group`.
    fn dispatch(
        &self,
        tokens: f64,
        bytes_per_copy: f64,
        top_k: u32,
        group: Group,
    ) -> CollectiveCost;
    /// One point-to-point transfer of `bytes`, inside the scale-up domain when `same_domain`.
    fn p2p(&self, bytes: f64, same_domain: bool) -> CollectiveCost;
}

/// Achieved bandwidths (bytes/s) and latencies (s) of a cluster's two fabrics, with the
/// calibration efficiencies applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fabric {
    /// Per-direction scale-up bandwidth a GPU reaches to its domain peers (switch topology).
    scaleup_bytes_per_s: f64,
    /// Per-peer link of a full-mesh domain (0 for switch topologies).
    mesh_peer_bytes_per_s: f64,
    /// Per-direction network bandwidth per GPU.
    network_bytes_per_s: f64,
    scaleup_latency_s: f64,
    network_latency_s: f64,
}

fn log2_ceil(n: u32) -> f64 {
    if n <= 1 {
        0.0
    } else {
        (32 - (n - 1).leading_zeros()) as f64
    }
}

impl Fabric {
    /// The fabrics of `cluster`, calibrated.
    pub fn of(cluster: &Cluster) -> Self {
        let gpu = &cluster.gpu;
        let cal = &gpu.calibration;
        let up = gpu.scaleup_bandwidth_gbps * 1e9 * cal.scaleup_bus_efficiency;
        let mesh_peer = match gpu.scaleup_topology {
            ScaleupTopology::Switch => 0.0,
            ScaleupTopology::Mesh => up / (gpu.scaleup_domain.max(2) - 1) as f64,
        };
        Fabric {
            scaleup_bytes_per_s: up,
            mesh_peer_bytes_per_s: mesh_peer,
            network_bytes_per_s: gpu.network_bandwidth_gbps * 1e9 * cal.network_bus_efficiency,
            scaleup_latency_s: cal.scaleup_latency_us * 1e-6,
            network_latency_s: cal.network_latency_us * 1e-6,
        }
    }

    /// Bandwidth a member sees towards the `p1 - 1` other members of its domain.
    fn domain_bytes_per_s(&self, p1: u32) -> f64 {
        if self.mesh_peer_bytes_per_s > 0.0 {
            self.mesh_peer_bytes_per_s * (p1.max(2) - 1) as f64
        } else {
            self.scaleup_bytes_per_s
        }
    }

    /// Time of one collective over `group` on a buffer of `bytes` (full buffer: the gathered size
    /// for all-gather, the input for reduce-scatter, each rank's send buffer for all-to-all).
    pub fn collective_s(&self, kind: Collective, bytes: f64, group: Group) -> f64 {
        self.collective(kind, bytes, group).total_s
    }

    /// Time of one MoE token dispatch (or combine), [`CollectiveModel::dispatch`]'s total.
    pub fn dispatch_s(&self, tokens: f64, bytes_per_copy: f64, top_k: u32, group: Group) -> f64 {
        self.dispatch(tokens, bytes_per_copy, top_k, group).total_s
    }

    /// Time of one point-to-point transfer of `bytes`, on NVLink when `same_domain`.
    pub fn p2p_s(&self, bytes: f64, same_domain: bool) -> f64 {
        self.p2p(bytes, same_domain).total_s
    }
}

impl CollectiveModel for Fabric {
    fn collective(&self, kind: Collective, bytes: f64, group: Group) -> CollectiveCost {
        let p = group.size;
        if p <= 1 || bytes <= 0.0 {
            return CollectiveCost::NOTHING;
        }
        let p1 = group.per_domain.clamp(1, p);
        let p2 = (p / p1).max(1);
        let (pf, p1f, p2f) = (p as f64, p1 as f64, p2 as f64);
        let b_up = self.domain_bytes_per_s(p1);
        let b_net = self.network_bytes_per_s;
        let lat = log2_ceil(p1) * self.scaleup_latency_s + log2_ceil(p2) * self.network_latency_s;
        let ring = if p2 > 1 {
            Algorithm::HierarchicalRing
        } else {
            Algorithm::Ring
        };
        match kind {
            Collective::AllReduce => {
                // Reduce-scatter + all-gather inside the domain, all-reduce of 1/P1 across domains (§3.2).
                let intra = 2.0 * (p1f - 1.0) / p1f * bytes / b_up;
                let inter = 2.0 * (p2f - 1.0) / p2f * (bytes / p1f) / b_net;
                CollectiveCost::of(2.0 * lat, 2.0 * lat + intra + inter, ring)
            }
            Collective::AllGather | Collective::ReduceScatter => {
                let intra = (p1f - 1.0) / p1f * bytes / b_up;
                let inter = (p2f - 1.0) / p2f * (bytes / p1f) / b_net;
                // NCCL runs all-gather and reduce-scatter as rings: P − 1 steps, each as slow as
                // the network once the ring leaves the domain ([THAKUR05] ring latency term).
                let step = if p2 > 1 {
                    self.network_latency_s
                } else {
                    self.scaleup_latency_s
                };
                CollectiveCost::of((pf - 1.0) * step, (pf - 1.0) * step + intra + inter, ring)
            }
            Collective::AllToAll => {
                // (P1−1)/P of the buffer stays in the domain, (P−P1)/P crosses the network (§3.2).
                let intra = (p1f - 1.0) / pf * bytes / b_up;
                let inter = (pf - p1f) / pf * bytes / b_net;
                let lat = if p2 > 1 {
                    self.network_latency_s
                } else {
                    self.scaleup_latency_s
                };
                CollectiveCost::of(lat, lat + intra.max(inter), Algorithm::Pairwise)
            }
        }
    }

    /// Time of one MoE token dispatch (or combine) over the expert-parallel `group`: `tokens`
    /// tokens each sent to `top_k` experts spread uniformly over the group's ranks, `bytes_per_copy`
    /// each. Inside one domain this is the all-to-all of §3.7. When the group spans domains, a
    /// token crosses the network once per distinct remote domain it is routed to and is fanned
    /// out over NVLink there (node-deduplicated dispatch: DeepSeek-V3 §3.2.2, DeepEP, Megatron's
    /// flex dispatcher): with `D` domains, `(D − 1)·(1 − (1 − 1/D)^k)` network copies per token
    /// instead of `k·(P − P1)/P` [derived].
    fn dispatch(
        &self,
        tokens: f64,
        bytes_per_copy: f64,
        top_k: u32,
        group: Group,
    ) -> CollectiveCost {
        let p = group.size;
        if p <= 1 || tokens <= 0.0 {
            return CollectiveCost::NOTHING;
        }
        let p1 = group.per_domain.clamp(1, p);
        let d = (p / p1).max(1) as f64;
        let k = top_k as f64;
        let pf = p as f64;
        let nvlink_copies = k * (pf - 1.0) / pf;
        let network_copies = (d - 1.0) * (1.0 - (1.0 - 1.0 / d).powf(k));
        let intra = tokens * nvlink_copies * bytes_per_copy / self.domain_bytes_per_s(p1.max(2));
        let inter = tokens * network_copies * bytes_per_copy / self.network_bytes_per_s;
        let lat = if d > 1.0 {
            self.network_latency_s
        } else {
            self.scaleup_latency_s
        };
        let algorithm = if d > 1.0 {
            Algorithm::DomainDeduplicatedDispatch
        } else {
            Algorithm::Pairwise
        };
        CollectiveCost::of(lat, lat + intra.max(inter), algorithm)
    }

    fn p2p(&self, bytes: f64, same_domain: bool) -> CollectiveCost {
        if bytes <= 0.0 {
            return CollectiveCost::NOTHING;
        }
        let p2p = Algorithm::PointToPoint;
        if same_domain {
            let b = if self.mesh_peer_bytes_per_s > 0.0 {
                self.mesh_peer_bytes_per_s
            } else {
                self.scaleup_bytes_per_s
            };
            let lat = self.scaleup_latency_s;
            CollectiveCost::of(lat, lat + bytes / b, p2p)
        } else {
            let lat = self.network_latency_s;
            CollectiveCost::of(lat, lat + bytes / self.network_bytes_per_s, p2p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric() -> Fabric {
        Fabric {
            scaleup_bytes_per_s: 450e9,
            mesh_peer_bytes_per_s: 0.0,
            network_bytes_per_s: 50e9,
            scaleup_latency_s: 0.0,
            network_latency_s: 0.0,
        }
    }

    #[test]
    fn all_reduce_inside_domain_is_ring_bound() {
        let g = Group {
            size: 8,
            per_domain: 8,
        };
        let t = fabric().collective_s(Collective::AllReduce, 450e9, g);
        assert!((t - 2.0 * 7.0 / 8.0).abs() < 1e-12);
    }

    #[test]
    fn all_reduce_across_nodes_with_one_member_per_domain_runs_at_nic_speed() {
        // §3.2 special case P1 = 1.
        let g = Group {
            size: 16,
            per_domain: 1,
        };
        let t = fabric().collective_s(Collective::AllReduce, 50e9, g);
        assert!((t - 2.0 * 15.0 / 16.0).abs() < 1e-12);
    }

    #[test]
    fn all_gather_is_half_an_all_reduce() {
        let g = Group {
            size: 64,
            per_domain: 8,
        };
        let f = fabric();
        let ar = f.collective_s(Collective::AllReduce, 1e9, g);
        let ag = f.collective_s(Collective::AllGather, 1e9, g);
        assert!((ar - 2.0 * ag).abs() < 1e-12);
    }

    #[test]
    fn dispatch_inside_a_domain_is_the_all_to_all() {
        let f = fabric();
        let g = Group {
            size: 8,
            per_domain: 8,
        };
        let a2a = f.collective_s(Collective::AllToAll, 8192.0 * 2.0 * 8192.0 * 2.0, g);
        let dispatch = f.dispatch_s(8192.0, 8192.0 * 2.0, 2, g);
        assert!((a2a - dispatch).abs() < 1e-12, "{a2a} vs {dispatch}");
    }

    #[test]
    fn dispatch_across_domains_sends_each_token_once_per_remote_domain() {
        let f = fabric();
        // 64 ranks over 8 domains, top-8: (8 − 1)·(1 − (7/8)^8) = 4.59 network copies, not 7.
        let g = Group {
            size: 64,
            per_domain: 8,
        };
        let t = f.dispatch_s(1.0, 50e9, 8, g);
        let want = 7.0 * (1.0 - (7.0f64 / 8.0).powi(8));
        assert!((t - want).abs() < 1e-9, "{t} vs {want}");
    }

    #[test]
    fn all_to_all_across_domains_is_network_bound() {
        // §7(b): 470 MB over EP = 8 across nodes at 50 GB/s ≈ 9.4 ms.
        let g = Group {
            size: 8,
            per_domain: 1,
        };
        let t = fabric().collective_s(Collective::AllToAll, 8192.0 * 65536.0, g);
        assert!((t - 8192.0 * 57344.0 / 50e9).abs() < 1e-9, "{t}");
    }
}

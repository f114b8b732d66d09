//! Collectives as NCCL runs them (docs/costmodel.md §3.1–3.3): for every call, the time of each
//! algorithm and protocol NCCL would consider — ring, double-binary tree, NVLink SHARP (NVLS),
//! NVLS-tree and PAT, each with LL, LL128 or Simple where NCCL offers it — priced with NCCL's own
//! tuning constants (`data/collectives.toml`, from `src/graph/tuning.cc`) on meshplan's calibrated
//! link rates, and the cheapest one charged, as NCCL's tuner picks it.
//!
//! Every cost goes through one interface, [`CollectiveModel`]: a collective, an MoE dispatch or a
//! point-to-point transfer gives a [`CollectiveCost`] — its latency, its bandwidth time, the
//! algorithm and the protocol chosen. Time uses the total, explain all four. [`Fabric`] is the
//! implementation; `Fabric::collective_s` and friends are the totals.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::{Cluster, Gpu, ScaleupTopology};
use crate::layout::Group;

const COLLECTIVES_TOML: &str = include_str!("../data/collectives.toml");

/// Collective kinds (`all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all` in files, with
/// nccl-tests' `alltoall` accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    #[serde(alias = "alltoall")]
    AllToAll,
}

/// How a collective is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Nothing to move (a group of one, or no bytes).
    Nothing,
    /// NCCL's ring over every member, crossing each domain once per channel (§3.2).
    Ring,
    /// NCCL's double binary tree across domains, a chain inside each (all-reduce only).
    Tree,
    /// NVLink SHARP: reductions and multicast in the NVSwitch, inside one domain.
    Nvls,
    /// NVLS inside each domain, trees across the domains (all-reduce).
    NvlsTree,
    /// Parallel aggregated trees: log-depth all-gather/reduce-scatter, one rank per domain.
    Pat,
    /// Every rank sends each peer its share directly (all-to-all, §3.2).
    Pairwise,
    /// MoE dispatch deduplicated per remote domain, fanned out over NVLink there (§3.7).
    DomainDeduplicatedDispatch,
    /// One send to one peer (§3.5).
    PointToPoint,
}

impl Algorithm {
    /// A short human name (NCCL's, lower case, where it is one of NCCL's).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Nothing => "none",
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Nvls => "nvls",
            Algorithm::NvlsTree => "nvls-tree",
            Algorithm::Pat => "pat",
            Algorithm::Pairwise => "pairwise",
            Algorithm::DomainDeduplicatedDispatch => "domain-deduplicated dispatch",
            Algorithm::PointToPoint => "point-to-point",
        }
    }
}

/// NCCL's wire protocols: LL (8-byte stores with a flag, lowest latency, half the bandwidth),
/// LL128 (128-byte lines, 120 bytes of data) and Simple (full bandwidth, highest latency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Ll,
    Ll128,
    Simple,
}

impl Protocol {
    /// Every protocol, in the order of the data file's `[LL, LL128, Simple]` arrays.
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

    /// NCCL's name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The cost of one collective: `total_s` is the time charged (the algorithm's latency plus its
/// bandwidth term); `bandwidth_s` is what is left of it beyond the latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CollectiveCost {
    pub latency_s: f64,
    pub bandwidth_s: f64,
    pub total_s: f64,
    pub algorithm: Algorithm,
    pub protocol: Protocol,
}

impl CollectiveCost {
    const NOTHING: CollectiveCost = CollectiveCost {
        latency_s: 0.0,
        bandwidth_s: 0.0,
        total_s: 0.0,
        algorithm: Algorithm::Nothing,
        protocol: Protocol::Simple,
    };

    fn of(latency_s: f64, bandwidth_s: f64, algorithm: Algorithm, protocol: Protocol) -> Self {
        CollectiveCost {
            latency_s,
            bandwidth_s,
            total_s: latency_s + bandwidth_s,
            algorithm,
            protocol,
        }
    }

    /// `algorithm/protocol`, e.g. `ring/Simple` (just the algorithm where there is no choice).
    pub fn label(&self) -> String {
        match self.algorithm {
            Algorithm::Ring | Algorithm::Tree => {
                format!("{}/{}", self.algorithm.name(), self.protocol.name())
            }
            a => a.name().to_string(),
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

/// Latency constants of one NCCL algorithm per protocol, microseconds.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepLatencies {
    base_latency_us: [f64; 3],
    nvlink_step_us: [f64; 3],
    network_step_us: [f64; 3],
    #[serde(default = "one")]
    bandwidth_factor: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvlsConstants {
    nvlink_latency_us: f64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvlsTreeConstants {
    nvlink_latency_us: f64,
    network_step_us: f64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatConstants {
    base_latency_us: f64,
    per_rank_us: f64,
    log_step_divisor: f64,
    bandwidth_factor: f64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProtocolConstants {
    ll_bandwidth_factor: f64,
    ll_max_gbps_one_domain: f64,
    ll_max_gbps_two_domains: f64,
    ll_max_gbps_more_domains: f64,
    ll128_bandwidth_factor: f64,
    tree_ll_bandwidth_factor: f64,
    tree_ll128_bandwidth_factor: f64,
    ll_multi_domain_latency_factor: f64,
    net_overhead_us: f64,
    net_overhead_simple_factor: f64,
    ring_allreduce_plateau_factor: f64,
    ring_allreduce_plateau_bytes_per_rank: f64,
}

/// NCCL's tuning constants (`data/collectives.toml`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tuning {
    ring: StepLatencies,
    tree: StepLatencies,
    nvls: NvlsConstants,
    nvls_tree: NvlsTreeConstants,
    pat: PatConstants,
    protocols: ProtocolConstants,
}

fn tuning() -> &'static Tuning {
    static TUNING: OnceLock<Tuning> = OnceLock::new();
    TUNING.get_or_init(|| {
        toml::from_str(COLLECTIVES_TOML)
            .expect("data/collectives.toml holds NCCL's tuning constants")
    })
}

/// Achieved bandwidths (bytes/s) of a cluster's fabrics with the calibration efficiencies
/// applied, and the scale of NCCL's latency tables (1 unless the GPU's calibration measured its
/// own step latencies).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fabric {
    /// Per-direction scale-up bandwidth a GPU reaches to its domain peers (switch topology).
    scaleup_bytes_per_s: f64,
    /// Per-peer link of a full-mesh domain (0 for switch topologies).
    mesh_peer_bytes_per_s: f64,
    /// Per-direction network bandwidth per GPU.
    network_bytes_per_s: f64,
    /// NVLS bus bandwidth: the link rate times NCCL's NVLS efficiency (0: no NVLink SHARP).
    nvls_bytes_per_s: f64,
    /// Multiplier on NCCL's NVLink latencies (a measured ring step over NCCL's 3.4 µs).
    scaleup_latency_scale: f64,
    /// Multiplier on NCCL's network latencies (a measured ring step over NCCL's 14 µs).
    network_latency_scale: f64,
}

fn log2_ceil(n: u32) -> f64 {
    if n <= 1 {
        0.0
    } else {
        (32 - (n - 1).leading_zeros()) as f64
    }
}

const US: f64 = 1e-6;

impl Fabric {
    /// The fabrics of `cluster`, calibrated.
    pub fn of(cluster: &Cluster) -> Self {
        let gpu = &cluster.gpu;
        let cal = &gpu.calibration;
        let link = gpu.scaleup_bandwidth_gbps * 1e9;
        let up = link * cal.scaleup_bus_efficiency;
        let mesh_peer = match gpu.scaleup_topology {
            ScaleupTopology::Switch => 0.0,
            ScaleupTopology::Mesh => up / (gpu.scaleup_domain.max(2) - 1) as f64,
        };
        let nvls = match gpu.scaleup_topology {
            ScaleupTopology::Switch => cal.nvls_efficiency.unwrap_or(0.0) * link,
            ScaleupTopology::Mesh => 0.0,
        };
        let ring = &tuning().ring;
        let simple = Protocol::Simple.index();
        Fabric {
            scaleup_bytes_per_s: up,
            mesh_peer_bytes_per_s: mesh_peer,
            network_bytes_per_s: gpu.network_bandwidth_gbps * 1e9 * cal.network_bus_efficiency,
            nvls_bytes_per_s: nvls,
            scaleup_latency_scale: cal
                .scaleup_latency_us
                .map_or(1.0, |us| us / ring.nvlink_step_us[simple]),
            network_latency_scale: cal
                .network_latency_us
                .map_or(1.0, |us| us / ring.network_step_us[simple]),
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

    /// `kind` on `bytes` over `group` with the latency NCCL's choice pays (§3.1) but each rank's
    /// share crossing the scale-out network at its own NIC's rate: across domains the bandwidth
    /// term is `bytes · steps / P / NIC` (`steps` = `P − 1`, twice that for an all-reduce), as
    /// a ring with one member per domain, instead of the `P1` NICs a domain's members pool in
    /// NCCL's rings. Inside one domain it is [`CollectiveModel::collective`] itself. The stack's
    /// `zero3_per_rank_nic` (DeepSpeed's 2021 ZeRO-3, §3.6) prices its unit collectives so.
    pub fn per_rank_nic(&self, kind: Collective, bytes: f64, group: Group) -> CollectiveCost {
        let cost = self.collective(kind, bytes, group);
        if group.within_domain() || cost.algorithm == Algorithm::Nothing {
            return cost;
        }
        let p = group.size as f64;
        let steps = (p - 1.0)
            * if kind == Collective::AllReduce {
                2.0
            } else {
                1.0
            };
        let bandwidth = (bytes * steps / p / self.network_bytes_per_s).max(cost.bandwidth_s);
        CollectiveCost::of(cost.latency_s, bandwidth, cost.algorithm, cost.protocol)
    }

    /// One way (dispatch or combine) of an MoE layer's token exchange by `dispatcher` over the
    /// expert-parallel `group`: `tokens` tokens each routed to `top_k` experts, `bytes_per_copy`
    /// each (docs/costmodel.md §3.7).
    ///
    /// - `flex`: the node-deduplicated dispatch ([`CollectiveModel::dispatch`]);
    /// - `alltoall`: NCCL's all-to-all of every routed copy — inside a domain the same as
    ///   `flex`, across domains `k·(P − P1)/P` network copies per token instead of one per
    ///   remote domain;
    /// - `allgather`: the group's tokens all-gathered (each rank receives all `P·tokens`
    ///   hidden vectors and keeps its experts'); the combine is the matching reduce-scatter,
    ///   priced the same.
    pub fn token_exchange(
        &self,
        dispatcher: crate::plan::Dispatcher,
        tokens: f64,
        bytes_per_copy: f64,
        top_k: u32,
        group: Group,
    ) -> CollectiveCost {
        use crate::plan::Dispatcher;
        match dispatcher {
            Dispatcher::Flex => self.dispatch(tokens, bytes_per_copy, top_k, group),
            Dispatcher::AllToAll => self.collective(
                Collective::AllToAll,
                tokens * top_k as f64 * bytes_per_copy,
                group,
            ),
            Dispatcher::AllGather => self.collective(
                Collective::AllGather,
                tokens * bytes_per_copy * group.size as f64,
                group,
            ),
        }
    }

    /// Time of one point-to-point transfer of `bytes`, on NVLink when `same_domain`.
    pub fn p2p_s(&self, bytes: f64, same_domain: bool) -> f64 {
        self.p2p(bytes, same_domain).total_s
    }

    /// Seconds of one posted transfer: the base latency and one step of NCCL's Simple ring on
    /// the fabric (send/receive and all-to-all run on the same Simple machinery).
    fn transfer_latency_s(&self, network: bool) -> f64 {
        let ring = &tuning().ring;
        let simple = Protocol::Simple.index();
        let step = if network {
            ring.network_step_us[simple] * self.network_latency_scale
        } else {
            ring.nvlink_step_us[simple] * self.scaleup_latency_scale
        };
        (ring.base_latency_us[simple] + step) * US
    }

    /// A ring's bus bandwidth over `p1` members per domain in `domains` domains: the scale-up
    /// rate inside one domain; across domains, capped by the NICs of the domain's members, as
    /// NCCL's rings enter and leave each domain once per channel.
    fn ring_bus_bytes_per_s(&self, p1: u32, domains: u32) -> f64 {
        let net = p1 as f64 * self.network_bytes_per_s;
        match (domains, p1) {
            (1, _) => self.domain_bytes_per_s(p1),
            (_, 1) => net,
            _ => self.domain_bytes_per_s(p1).min(net),
        }
    }

    /// LL's bandwidth cap (llMaxBws) for a communicator over `domains` domains.
    fn ll_max_bytes_per_s(domains: u32) -> f64 {
        let p = &tuning().protocols;
        1e9 * match domains {
            1 => p.ll_max_gbps_one_domain,
            2 => p.ll_max_gbps_two_domains,
            _ => p.ll_max_gbps_more_domains,
        }
    }

    /// NCCL's ring on protocol `proto` (tuning.cc: `nsteps` steps, `nInterSteps` of them over the
    /// network, algorithm bandwidth `busBw · P / nsteps`).
    fn ring(
        &self,
        kind: Collective,
        bytes: f64,
        p: u32,
        p1: u32,
        domains: u32,
        proto: Protocol,
    ) -> CollectiveCost {
        let t = tuning();
        let c = &t.protocols;
        let i = proto.index();
        let all_reduce = kind == Collective::AllReduce;
        let steps = (p - 1) as f64 * if all_reduce { 2.0 } else { 1.0 };
        let inter_steps = match (domains, all_reduce) {
            (1, _) => 0.0,
            (_, true) => 2.0 * (domains - 1) as f64,
            (_, false) => (domains - 1) as f64,
        };
        let mut bus = self.ring_bus_bytes_per_s(p1, domains);
        match proto {
            Protocol::Ll => {
                bus = (bus * c.ll_bandwidth_factor).min(Self::ll_max_bytes_per_s(domains))
            }
            Protocol::Ll128 => bus *= c.ll128_bandwidth_factor,
            Protocol::Simple => {}
        }
        let mut intra = t.ring.nvlink_step_us[i] * self.scaleup_latency_scale;
        if domains > 1 {
            if proto == Protocol::Ll {
                intra *= c.ll_multi_domain_latency_factor;
            }
            let overhead = c.net_overhead_us
                * if proto == Protocol::Simple {
                    c.net_overhead_simple_factor
                } else {
                    1.0
                };
            intra = intra.max(overhead);
        }
        // With one rank per domain every step is exposed: NCCL takes the tree's network latency.
        let inter_table = if p1 == 1 { &t.tree } else { &t.ring };
        let inter = inter_table.network_step_us[i] * self.network_latency_scale;
        let mut latency =
            t.ring.base_latency_us[i] + (steps - inter_steps) * intra + inter_steps * inter;
        if all_reduce
            && proto == Protocol::Simple
            && domains > 1
            && bytes >= c.ring_allreduce_plateau_bytes_per_rank * p as f64
        {
            latency *= c.ring_allreduce_plateau_factor;
        }
        let bandwidth = bytes * steps / p as f64 / bus;
        CollectiveCost::of(latency * US, bandwidth, Algorithm::Ring, proto)
    }

    /// NCCL's double binary tree all-reduce across `domains` domains (a chain of `p1` inside
    /// each): algorithm bandwidth half the bus bandwidth, latency
    /// `2·((p1 − 1)·intra + log2(domains)·inter)`.
    fn tree(&self, bytes: f64, p1: u32, domains: u32, proto: Protocol) -> CollectiveCost {
        let t = tuning();
        let c = &t.protocols;
        let i = proto.index();
        let mut bus = self.ring_bus_bytes_per_s(p1, domains) * t.tree.bandwidth_factor;
        match proto {
            Protocol::Ll => {
                bus = (bus * c.tree_ll_bandwidth_factor).min(Self::ll_max_bytes_per_s(domains))
            }
            Protocol::Ll128 => bus *= c.tree_ll128_bandwidth_factor,
            Protocol::Simple => {}
        }
        let mut intra = t.tree.nvlink_step_us[i] * self.scaleup_latency_scale;
        if proto == Protocol::Ll {
            intra *= c.ll_multi_domain_latency_factor;
        }
        let inter = t.tree.network_step_us[i] * self.network_latency_scale;
        let latency = t.tree.base_latency_us[i]
            + 2.0 * ((p1 - 1) as f64 * intra + log2_ceil(domains) * inter);
        CollectiveCost::of(latency * US, 2.0 * bytes / bus, Algorithm::Tree, proto)
    }

    /// NVLink SHARP inside one domain of `p` members (Simple only): an all-reduce moves the
    /// buffer at the NVLS rate, the measured algorithm bandwidth of NCCL's NVLS all-reduce
    /// (`calibration.nvls_efficiency` of the link: 275 GB/s on 8 × H100/H200, flat in `P` from
    /// 5 to 8 ranks, docs/costmodel.md §3.1); an all-gather or reduce-scatter the whole buffer
    /// at `(P−1)/P` of it (tuning.cc's busBw conversion).
    fn nvls(&self, kind: Collective, bytes: f64, p: u32) -> CollectiveCost {
        let frac = (p - 1) as f64 / p as f64;
        let bandwidth = match kind {
            Collective::AllReduce => bytes / self.nvls_bytes_per_s,
            _ => bytes / (frac * self.nvls_bytes_per_s),
        };
        let latency = tuning().nvls.nvlink_latency_us * self.scaleup_latency_scale;
        CollectiveCost::of(latency * US, bandwidth, Algorithm::Nvls, Protocol::Simple)
    }

    /// NVLS inside each of `domains` domains, trees across them (all-reduce, Simple): bus
    /// bandwidth the lesser of twice the NVLS rate and the domain's NICs (doubled on two
    /// domains), latency `NVLink + 2·log2(domains)·network`.
    fn nvls_tree(&self, bytes: f64, p: u32, p1: u32, domains: u32) -> CollectiveCost {
        let t = &tuning().nvls_tree;
        let nics = p1 as f64 * self.network_bytes_per_s * if domains <= 2 { 2.0 } else { 1.0 };
        let bus = (2.0 * self.nvls_bytes_per_s).min(nics);
        let bandwidth = 2.0 * (p - 1) as f64 / p as f64 * bytes / bus;
        let latency = t.nvlink_latency_us * self.scaleup_latency_scale
            + 2.0 * log2_ceil(domains) * t.network_step_us * self.network_latency_scale;
        CollectiveCost::of(
            latency * US,
            bandwidth,
            Algorithm::NvlsTree,
            Protocol::Simple,
        )
    }

    /// PAT all-gather or reduce-scatter over `p` ranks, one per domain (Simple): the whole
    /// buffer at 0.75 of the NIC rate, latency `8 + log2(P)·tree network latency / 3.5 + 2.8·P`.
    fn pat(&self, bytes: f64, p: u32) -> CollectiveCost {
        let t = tuning();
        let c = &t.pat;
        let simple = Protocol::Simple.index();
        let inter = t.tree.network_step_us[simple] * self.network_latency_scale;
        let latency = c.base_latency_us
            + log2_ceil(p) * inter / c.log_step_divisor
            + c.per_rank_us * p as f64;
        let bandwidth = bytes / (c.bandwidth_factor * self.network_bytes_per_s);
        CollectiveCost::of(latency * US, bandwidth, Algorithm::Pat, Protocol::Simple)
    }
}

impl CollectiveModel for Fabric {
    /// The cheapest of the algorithms and protocols NCCL would consider for the call
    /// (ncclTopoGetAlgoTime: latency + bytes / algorithm bandwidth); all-to-all is pairwise.
    fn collective(&self, kind: Collective, bytes: f64, group: Group) -> CollectiveCost {
        let p = group.size;
        if p <= 1 || bytes <= 0.0 {
            return CollectiveCost::NOTHING;
        }
        let p1 = group.per_domain.clamp(1, p);
        let domains = (p / p1).max(1);
        if kind == Collective::AllToAll {
            // (P1−1)/P of the buffer stays in the domain, (P−P1)/P crosses the network (§3.2).
            let (pf, p1f) = (p as f64, p1 as f64);
            let intra = (p1f - 1.0) / pf * bytes / self.domain_bytes_per_s(p1);
            let inter = (pf - p1f) / pf * bytes / self.network_bytes_per_s;
            let latency = self.transfer_latency_s(domains > 1);
            return CollectiveCost::of(
                latency,
                intra.max(inter),
                Algorithm::Pairwise,
                Protocol::Simple,
            );
        }
        let mut best = self.ring(kind, bytes, p, p1, domains, Protocol::Simple);
        let mut consider = |c: CollectiveCost| {
            if c.total_s < best.total_s {
                best = c;
            }
        };
        for proto in [Protocol::Ll, Protocol::Ll128] {
            consider(self.ring(kind, bytes, p, p1, domains, proto));
        }
        let nvls = self.nvls_bytes_per_s > 0.0 && p1 >= 2;
        match kind {
            Collective::AllReduce if domains > 1 => {
                for proto in Protocol::ALL {
                    consider(self.tree(bytes, p1, domains, proto));
                }
                if nvls {
                    consider(self.nvls_tree(bytes, p, p1, domains));
                }
            }
            _ if domains == 1 && nvls => consider(self.nvls(kind, bytes, p)),
            Collective::AllGather | Collective::ReduceScatter if p1 == 1 => {
                consider(self.pat(bytes, p))
            }
            _ => {}
        }
        best
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
        let (nvlink_copies, network_copies) = deduplicated_copies(top_k, group);
        let intra = tokens * nvlink_copies * bytes_per_copy / self.domain_bytes_per_s(p1.max(2));
        let inter = tokens * network_copies * bytes_per_copy / self.network_bytes_per_s;
        let algorithm = if d > 1.0 {
            Algorithm::DomainDeduplicatedDispatch
        } else {
            Algorithm::Pairwise
        };
        let latency = self.transfer_latency_s(d > 1.0);
        CollectiveCost::of(latency, intra.max(inter), algorithm, Protocol::Simple)
    }

    fn p2p(&self, bytes: f64, same_domain: bool) -> CollectiveCost {
        if bytes <= 0.0 {
            return CollectiveCost::NOTHING;
        }
        let b = match (same_domain, self.mesh_peer_bytes_per_s > 0.0) {
            (true, true) => self.mesh_peer_bytes_per_s,
            (true, false) => self.scaleup_bytes_per_s,
            (false, _) => self.network_bytes_per_s,
        };
        let latency = self.transfer_latency_s(!same_domain);
        CollectiveCost::of(
            latency,
            bytes / b,
            Algorithm::PointToPoint,
            Protocol::Simple,
        )
    }
}

/// Copies of one token a node-deduplicated dispatch over `group` moves, `(NVLink, network)`:
/// `k·(P − 1)/P` over NVLink (local experts' and the fan-out of arriving ones) and
/// `(D − 1)·(1 − (1 − 1/D)^k)` over the network, one per distinct remote domain (§3.7).
pub fn deduplicated_copies(top_k: u32, group: Group) -> (f64, f64) {
    let p = group.size.max(1);
    let p1 = group.per_domain.clamp(1, p);
    let d = (p / p1).max(1) as f64;
    let (k, pf) = (top_k as f64, p as f64);
    (
        k * (pf - 1.0) / pf,
        (d - 1.0) * (1.0 - (1.0 - 1.0 / d).powf(k)),
    )
}

/// Copies of one token an all-to-all over `group` moves, `(NVLink, network)`: every copy to
/// another rank of the domain over NVLink, `k·(P1 − 1)/P`, every other one over the network,
/// `k·(P − P1)/P` (§3.2).
pub fn all_to_all_copies(top_k: u32, group: Group) -> (f64, f64) {
    let p = group.size.max(1);
    let p1 = group.per_domain.clamp(1, p);
    let (k, pf) = (top_k as f64, p as f64);
    (k * (p1 as f64 - 1.0) / pf, k * (pf - p1 as f64) / pf)
}

/// One collective call priced on its own, outside any plan: what `meshplan calibrate` fits
/// measured nccl-tests times against, so that the fit inverts the very model the planner uses.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveQuery {
    /// The collective.
    pub kind: Collective,
    /// Buffer bytes as [`Fabric::collective_s`] takes them (nccl-tests' `size` column).
    pub bytes: f64,
    /// Ranks in the communicator.
    pub group_size: u32,
    /// Ranks of the communicator that share one scale-up (NVLink/xGMI) domain.
    pub per_domain: u32,
}

/// The price of a [`CollectiveQuery`]: [`CollectiveCost`] with its algorithm and protocol named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectivePrice {
    pub total_s: f64,
    pub latency_s: f64,
    pub bandwidth_s: f64,
    /// NCCL's algorithm name (`ring`, `tree`, `nvls`, `nvls-tree`, `pat`, `pairwise`, ...).
    pub algorithm: &'static str,
    /// NCCL's protocol name (`LL`, `LL128`, `Simple`).
    pub protocol: &'static str,
}

/// Largest buffer a [`CollectiveQuery`] may name, bytes (1 PB; nccl-tests sweeps stop at tens
/// of GB).
pub const MAX_QUERY_BYTES: f64 = 1e15;

impl CollectiveQuery {
    /// Checks the sizes; the error names the field, the value and the allowed range.
    pub fn validate(&self) -> Result<()> {
        if !(self.bytes.is_finite() && (0.0..=MAX_QUERY_BYTES).contains(&self.bytes)) {
            return Err(Error::invalid(
                "collective.bytes",
                self.bytes,
                format!("a number in [0, {MAX_QUERY_BYTES:e}]"),
            ));
        }
        crate::limits::check("collective.group_size", self.group_size)?;
        crate::limits::check("collective.per_domain", self.per_domain)?;
        if self.per_domain > self.group_size {
            return Err(Error::invalid(
                "collective.per_domain",
                self.per_domain,
                format!("1..={} (the group size)", self.group_size),
            ));
        }
        Ok(())
    }
}

/// Prices each of `queries` on `gpu`'s calibrated fabrics, as [`Fabric::collective`] does inside
/// a plan (the GPU and every query are validated first).
pub fn price_collectives(gpu: &Gpu, queries: &[CollectiveQuery]) -> Result<Vec<CollectivePrice>> {
    gpu.validate()?;
    for q in queries {
        q.validate()?;
    }
    let fabric = Fabric::of(&Cluster {
        gpu: gpu.clone(),
        num_gpus: 1,
        gpus_per_node: None,
        nvlink_domain: None,
    });
    Ok(queries
        .iter()
        .map(|q| {
            let group = Group {
                size: q.group_size,
                per_domain: q.per_domain,
            };
            let c = fabric.collective(q.kind, q.bytes, group);
            CollectivePrice {
                total_s: c.total_s,
                latency_s: c.latency_s,
                bandwidth_s: c.bandwidth_s,
                algorithm: c.algorithm.name(),
                protocol: c.protocol.name(),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 450 GB/s NVLink, 50 GB/s NIC, no NVLS, NCCL's latency tables as they are.
    fn fabric() -> Fabric {
        Fabric {
            scaleup_bytes_per_s: 450e9,
            mesh_peer_bytes_per_s: 0.0,
            network_bytes_per_s: 50e9,
            nvls_bytes_per_s: 0.0,
            scaleup_latency_scale: 1.0,
            network_latency_scale: 1.0,
        }
    }

    fn group(size: u32, per_domain: u32) -> Group {
        Group { size, per_domain }
    }

    #[test]
    fn per_rank_nic_moves_each_ranks_share_over_its_own_nic_across_domains() {
        let f = fabric();
        let bytes = 1e9;
        // Across 8 domains of 8: the pooled ring moves 63/64 of the buffer at 8 NICs' rate, the
        // per-rank pricing at one NIC's, with the same latency (NCCL's choice of the call).
        let g = group(64, 8);
        let pooled = f.collective(Collective::AllGather, bytes, g);
        let own = f.per_rank_nic(Collective::AllGather, bytes, g);
        assert_eq!(own.latency_s, pooled.latency_s);
        assert_eq!(own.algorithm, pooled.algorithm);
        assert!((own.bandwidth_s - bytes * 63.0 / 64.0 / 50e9).abs() < 1e-12);
        assert!(
            own.bandwidth_s > 7.0 * pooled.bandwidth_s,
            "{own:?} vs {pooled:?}"
        );
        // Twice the steps for an all-reduce.
        let ar = f.per_rank_nic(Collective::AllReduce, bytes, g);
        assert!((ar.bandwidth_s - 2.0 * bytes * 63.0 / 64.0 / 50e9).abs() < 1e-12);
        // The per-GPU time does not shrink with the group: 1,536 ranks take as long as 768.
        let t = |p| {
            f.per_rank_nic(Collective::ReduceScatter, bytes, group(p, 8))
                .bandwidth_s
        };
        assert!((t(1536) / t(768) - 1.0).abs() < 1e-3);
        // Inside one domain nothing changes.
        let inside = group(8, 8);
        assert_eq!(
            f.per_rank_nic(Collective::AllGather, bytes, inside),
            f.collective(Collective::AllGather, bytes, inside)
        );
        assert_eq!(
            f.per_rank_nic(Collective::AllGather, bytes, group(1, 1))
                .total_s,
            0.0
        );
    }

    fn h100() -> Fabric {
        Fabric::of(&Cluster {
            gpu: crate::presets::gpu("h100-sxm").unwrap(),
            num_gpus: 64,
            gpus_per_node: None,
            nvlink_domain: None,
        })
    }

    #[test]
    fn a_large_all_reduce_inside_a_domain_is_a_bandwidth_bound_simple_ring() {
        let c = fabric().collective(Collective::AllReduce, 450e9, group(8, 8));
        assert_eq!(
            (c.algorithm, c.protocol),
            (Algorithm::Ring, Protocol::Simple)
        );
        assert!((c.bandwidth_s - 2.0 * 7.0 / 8.0).abs() < 1e-12);
        // NCCL: baseLat 8.4 + 2·7 steps · 3.4 µs NVLink.
        assert!((c.latency_s - (8.4 + 14.0 * 3.4) * 1e-6).abs() < 1e-12);
        assert_eq!(c.total_s, c.latency_s + c.bandwidth_s);
    }

    #[test]
    fn a_tiny_all_reduce_inside_a_domain_takes_ll() {
        let c = fabric().collective(Collective::AllReduce, 16_384.0, group(8, 8));
        assert_eq!((c.algorithm, c.protocol), (Algorithm::Ring, Protocol::Ll));
        assert!(
            (c.latency_s - (6.6 + 14.0 * 0.6) * 1e-6).abs() < 1e-12,
            "{c:?}"
        );
        assert!(c.latency_s > c.bandwidth_s);
    }

    #[test]
    fn nvls_wins_large_all_reduces_inside_an_nvswitch_domain() {
        let f = h100();
        let g = group(8, 8);
        let c = f.collective(Collective::AllReduce, 1e9, g);
        assert_eq!(c.algorithm, Algorithm::Nvls);
        // The switch reduces: the buffer at the measured NVLS all-reduce algorithm bandwidth,
        // 0.611 of the 450 GB/s link (275 GB/s: nccl-tests busBw 480 GB/s on 8 × H100).
        assert!((c.bandwidth_s - 1e9 / (0.611 * 450e9)).abs() < 1e-12);
        let algbw = 1e9 / c.total_s;
        let busbw = algbw * 2.0 * 7.0 / 8.0;
        assert!((busbw / 480e9 - 1.0).abs() < 0.02, "{busbw}");
        // NCCL's ring all-reduce at 0.8 of the link: algbw 0.8 · 450 · 8/14 = 206 GB/s.
        let ring = f.ring(Collective::AllReduce, 1e9, 8, 8, 1, Protocol::Simple);
        assert!(c.total_s < 0.8 * ring.total_s, "{c:?} vs {ring:?}");
        // On two GPUs NVLS does not beat the ring (its busBw stays at the ring's 370 GB/s up to
        // four ranks, NVIDIA/nccl issue 1455): the ring's algbw 360 GB/s wins.
        let two = f.collective(Collective::AllReduce, 1e9, group(2, 8));
        assert_eq!(two.algorithm, Algorithm::Ring);
        // No NVLS across domains for all-gather (it needs CollNet), nor on a mesh or an A100.
        let across = f.collective(Collective::AllGather, 1e9, group(16, 8));
        assert_eq!(across.algorithm, Algorithm::Ring);
    }

    #[test]
    fn ring_latency_across_domains_is_nccls_step_count() {
        // 256 ranks, 32 per domain, 8 domains, Simple: 8.4 + (255 − 7)·max(3.4, 3·1) + 7·14 µs.
        let c = fabric().ring(Collective::AllGather, 1e9, 256, 32, 8, Protocol::Simple);
        let want = (8.4 + 248.0 * 3.4 + 7.0 * 14.0) * 1e-6;
        assert!(
            (c.latency_s - want).abs() < 1e-12,
            "{} vs {want}",
            c.latency_s
        );
        // The ring crosses each domain once per channel: its bus bandwidth is the lesser of
        // NVLink and the 32 members' NICs (32 · 50 GB/s > 450 GB/s here).
        assert!((c.bandwidth_s - 255.0 / 256.0 * 1e9 / 450e9).abs() < 1e-12);
    }

    #[test]
    fn small_all_reduces_over_many_domains_take_the_tree() {
        let f = fabric();
        let g = group(512, 8);
        let c = f.collective(Collective::AllReduce, 1e6, g);
        assert_eq!(c.algorithm, Algorithm::Tree, "{c:?}");
        let ring = f.ring(Collective::AllReduce, 1e6, 512, 8, 64, c.protocol);
        assert!(c.latency_s < ring.latency_s / 10.0);
        // Large ones over fewer domains go back to the ring (the tree moves 2·S at 0.92 of the
        // bus bandwidth, the ring 2·(P−1)/P·S at all of it).
        let big = f.collective(Collective::AllReduce, 8e9, group(64, 8));
        assert_eq!(big.algorithm, Algorithm::Ring);
    }

    #[test]
    fn one_rank_per_domain_all_gathers_take_pat_when_small() {
        let f = fabric();
        let g = group(64, 1);
        let c = f.collective(Collective::AllGather, 1e6, g);
        assert_eq!(c.algorithm, Algorithm::Pat, "{c:?}");
        // 8 + log2(64)·14/3.5 + 2.8·64 µs.
        let want = (8.0 + 6.0 * 14.0 / 3.5 + 2.8 * 64.0) * 1e-6;
        assert!((c.latency_s - want).abs() < 1e-12);
        // Not with two ranks per domain.
        let two = f.collective(Collective::AllGather, 1e6, group(64, 2));
        assert_ne!(two.algorithm, Algorithm::Pat);
    }

    #[test]
    fn the_charged_algorithm_is_never_worse_than_a_simple_ring() {
        let f = h100();
        for (p, p1) in [(2, 2), (8, 8), (16, 8), (64, 8), (64, 1), (1024, 8)] {
            for kind in [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ] {
                for bytes in [1e3, 1e5, 1e7, 1e9] {
                    let c = f.collective(kind, bytes, group(p, p1));
                    let ring = f.ring(kind, bytes, p, p1, p / p1, Protocol::Simple);
                    assert!(c.total_s <= ring.total_s, "{kind:?} {p}/{p1} {bytes}");
                    assert!(c.latency_s > 0.0 && c.bandwidth_s > 0.0);
                }
            }
        }
    }

    #[test]
    fn a_measured_step_latency_rescales_nccls_table() {
        let mut f = fabric();
        let base = f.ring(Collective::AllGather, 1e6, 8, 8, 1, Protocol::Simple);
        f.scaleup_latency_scale = 2.0;
        let slow = f.ring(Collective::AllGather, 1e6, 8, 8, 1, Protocol::Simple);
        assert!((slow.latency_s - base.latency_s - 7.0 * 3.4e-6).abs() < 1e-12);
    }

    #[test]
    fn all_gather_bandwidth_is_half_an_all_reduce() {
        let f = fabric();
        let g = group(64, 8);
        let ar = f.ring(Collective::AllReduce, 1e9, 64, 8, 8, Protocol::Simple);
        let ag = f.ring(Collective::AllGather, 1e9, 64, 8, 8, Protocol::Simple);
        assert!((ar.bandwidth_s - 2.0 * ag.bandwidth_s).abs() < 1e-12);
        assert_eq!(
            f.collective(Collective::AllReduce, 0.0, g),
            CollectiveCost::NOTHING
        );
    }

    #[test]
    fn dispatch_inside_a_domain_is_the_all_to_all() {
        let f = fabric();
        let g = group(8, 8);
        let a2a = f.collective(Collective::AllToAll, 8192.0 * 2.0 * 8192.0 * 2.0, g);
        let dispatch = f.dispatch(8192.0, 8192.0 * 2.0, 2, g);
        assert_eq!(a2a, dispatch);
    }

    #[test]
    fn each_dispatcher_prices_its_own_exchange() {
        use crate::plan::Dispatcher;
        let f = fabric();
        let (tokens, bytes, k) = (4096.0, 8192.0 * 2.0, 8);
        // Inside one domain the all-to-all and the node-deduplicated dispatch are one exchange.
        let one = group(8, 8);
        assert_eq!(
            f.token_exchange(Dispatcher::AllToAll, tokens, bytes, k, one),
            f.token_exchange(Dispatcher::Flex, tokens, bytes, k, one)
        );
        // Across domains every copy of the all-to-all crosses the network on its own: 7 of the 8
        // copies of a token for 64 ranks in 8 domains, against 4.59 deduplicated.
        let wide = group(64, 8);
        let a2a = f.token_exchange(Dispatcher::AllToAll, tokens, bytes, k, wide);
        let flex = f.token_exchange(Dispatcher::Flex, tokens, bytes, k, wide);
        let ratio = a2a.bandwidth_s / flex.bandwidth_s;
        let want = 7.0 / (7.0 * (1.0 - (7.0f64 / 8.0).powi(8)));
        assert!((ratio - want).abs() < 1e-9, "{ratio} vs {want}");
        // The all-gather moves every rank's tokens whatever top-k is: the group's 64 × tokens.
        let ag = f.token_exchange(Dispatcher::AllGather, tokens, bytes, k, wide);
        assert_eq!(
            ag,
            f.collective(Collective::AllGather, tokens * bytes * 64.0, wide)
        );
        assert_eq!(
            f.token_exchange(Dispatcher::AllGather, tokens, bytes, 1, wide),
            ag
        );
    }

    #[test]
    fn dispatch_across_domains_sends_each_token_once_per_remote_domain() {
        // 64 ranks over 8 domains, top-8: (8 − 1)·(1 − (7/8)^8) = 4.59 network copies, not 7.
        let c = fabric().dispatch(1.0, 50e9, 8, group(64, 8));
        let want = 7.0 * (1.0 - (7.0f64 / 8.0).powi(8));
        assert!((c.bandwidth_s - want).abs() < 1e-9, "{c:?} vs {want}");
        assert_eq!(c.algorithm, Algorithm::DomainDeduplicatedDispatch);
        assert!((c.latency_s - (8.4 + 14.0) * 1e-6).abs() < 1e-12);
    }

    #[test]
    fn all_to_all_across_domains_is_network_bound() {
        // §7(b): 470 MB over EP = 8 across nodes at 50 GB/s ≈ 9.4 ms.
        let c = fabric().collective(Collective::AllToAll, 8192.0 * 65536.0, group(8, 1));
        assert!(
            (c.bandwidth_s - 8192.0 * 57344.0 / 50e9).abs() < 1e-9,
            "{c:?}"
        );
    }

    #[test]
    fn priced_queries_are_the_fabrics_own_costs() {
        let gpu = crate::presets::gpu("h100-sxm").unwrap();
        let q = CollectiveQuery {
            kind: Collective::AllGather,
            bytes: 1e8,
            group_size: 16,
            per_domain: 8,
        };
        let priced = price_collectives(&gpu, &[q]).unwrap();
        let want = h100().collective(Collective::AllGather, 1e8, group(16, 8));
        assert_eq!(priced[0].total_s, want.total_s);
        assert_eq!(priced[0].algorithm, want.algorithm.name());
    }

    #[test]
    fn bad_queries_name_the_field() {
        let gpu = crate::presets::gpu("h100-sxm").unwrap();
        let mut q = CollectiveQuery {
            kind: Collective::AllReduce,
            bytes: f64::NAN,
            group_size: 8,
            per_domain: 8,
        };
        let e = price_collectives(&gpu, &[q]).unwrap_err().to_string();
        assert!(e.contains("collective.bytes"), "{e}");
        q.bytes = 1.0;
        q.per_domain = 9;
        let e = price_collectives(&gpu, &[q]).unwrap_err().to_string();
        assert!(e.contains("collective.per_domain"), "{e}");
        q.group_size = 0;
        let e = price_collectives(&gpu, &[q]).unwrap_err().to_string();
        assert!(e.contains("collective.group_size"), "{e}");
    }
}

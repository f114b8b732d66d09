//! Bytes that cross the wire per token for the collectives of one axis (docs/costmodel.md §3, §7): the
//! closed forms behind the worked checks and the `explain` output.

use crate::comm::{Collective, CollectiveModel, Fabric};
use crate::layout::Group;
use crate::model::Model;

/// Bytes per activation element on the wire (bf16), as in the time model.
pub const WIRE_BYTES: f64 = 2.0;

/// Bytes each rank sends for one collective of `kind` over `ranks` ranks on a buffer of
/// `bytes` (docs/costmodel.md §3.1: `2(P−1)/P` all-reduce, `(P−1)/P` all-gather, reduce-scatter and
/// uniform all-to-all).
pub fn wire_bytes(kind: Collective, bytes: f64, ranks: u32) -> f64 {
    if ranks <= 1 {
        return 0.0;
    }
    let p = ranks as f64;
    match kind {
        Collective::AllReduce => 2.0 * (p - 1.0) / p * bytes,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            (p - 1.0) / p * bytes
        }
    }
}

/// Latency and bandwidth seconds of one collective ([`CollectiveModel::collective`]).
pub fn collective_terms(fabric: &Fabric, kind: Collective, bytes: f64, group: Group) -> (f64, f64) {
    let cost = fabric.collective(kind, bytes, group);
    (cost.latency_s, cost.bandwidth_s)
}

/// Latency and bandwidth seconds of one MoE dispatch ([`CollectiveModel::dispatch`]).
pub fn dispatch_terms(
    fabric: &Fabric,
    tokens: f64,
    bytes_per_copy: f64,
    top_k: u32,
    group: Group,
) -> (f64, f64) {
    let cost = fabric.dispatch(tokens, bytes_per_copy, top_k, group);
    (cost.latency_s, cost.bandwidth_s)
}

/// Latency and bandwidth seconds of one point-to-point transfer ([`CollectiveModel::p2p`]).
pub fn p2p_terms(fabric: &Fabric, bytes: f64, same_domain: bool) -> (f64, f64) {
    let cost = fabric.p2p(bytes, same_domain);
    (cost.latency_s, cost.bandwidth_s)
}

/// Ring all-reduce bytes each GPU sends per generated token in TP decode: two all-reduces per
/// layer (after the attention output and the FFN down projection) of one hidden state,
/// `2·(t−1)/t` of it each (docs/costmodel.md §7(a), [NAR21 §3.2]).
pub fn tp_decode_allreduce_bytes_per_token(model: &Model, tp: u32) -> f64 {
    let t = tp as f64;
    let per_all_reduce = 2.0 * (t - 1.0) / t * model.hidden as f64 * WIRE_BYTES;
    2.0 * model.layers as f64 * per_all_reduce
}

/// Expert-parallel all-to-all bytes per token per MoE layer for one forward pass: dispatch of
/// `top_k` hidden vectors plus their combine (total), and the share that leaves the rank under
/// uniform routing over `ep` ranks, `(e−1)/e` (docs/costmodel.md §3.7, §7(b)).
pub fn ep_bytes_per_token_per_layer(hidden: u32, top_k: u32, ep: u32) -> (f64, f64) {
    let total = 2.0 * top_k as f64 * hidden as f64 * WIRE_BYTES;
    let e = ep as f64;
    (total, total * (e - 1.0) / e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Activation, Norm};

    #[test]
    fn wire_factors_are_the_ring_factors() {
        assert_eq!(wire_bytes(Collective::AllReduce, 16_384.0, 4), 24_576.0);
        assert_eq!(wire_bytes(Collective::AllGather, 800.0, 8), 700.0);
        assert_eq!(wire_bytes(Collective::AllToAll, 800.0, 8), 700.0);
        assert_eq!(wire_bytes(Collective::AllReduce, 800.0, 1), 0.0);
    }

    #[test]
    fn latency_and_bandwidth_terms_add_up_to_the_fabric_time() {
        let cluster = crate::Cluster {
            gpu: crate::presets::gpu("h100-sxm").unwrap(),
            num_gpus: 64,
            gpus_per_node: None,
            nvlink_domain: None,
        };
        let f = Fabric::of(&cluster);
        let g = Group {
            size: 16,
            per_domain: 8,
        };
        for bytes in [1.0, 16_384.0, 1e9] {
            let (lat, bw) = collective_terms(&f, Collective::AllReduce, bytes, g);
            let total = f.collective_s(Collective::AllReduce, bytes, g);
            assert!((lat + bw - total).abs() <= 1e-15 * total.max(1.0));
            assert!(lat > 0.0 && bw > 0.0);
        }
        // Doubling the buffer doubles only the bandwidth term.
        let (l1, b1) = collective_terms(&f, Collective::AllGather, 1e6, g);
        let (l2, b2) = collective_terms(&f, Collective::AllGather, 2e6, g);
        assert!((l1 - l2).abs() < 1e-15 && (b2 / b1 - 2.0).abs() < 1e-9);
        let (l, b) = p2p_terms(&f, 1e6, true);
        assert!((l + b - f.p2p_s(1e6, true)).abs() < 1e-15);
        let (l, b) = dispatch_terms(&f, 4096.0, 16_384.0, 2, g);
        assert!((l + b - f.dispatch_s(4096.0, 16_384.0, 2, g)).abs() < 1e-15);
    }

    #[test]
    fn costmodel_7a_llama3_70b_tp4_decode() {
        let m = Model {
            name: "llama3-70b".into(),
            layers: 80,
            hidden: 8192,
            heads: 64,
            kv_heads: 8,
            head_dim: None,
            ffn_hidden: 28672,
            vocab: 128256,
            activation: Activation::Swiglu,
            norm: Norm::Rmsnorm,
            tied_embeddings: false,
            moe: None,
            mla: None,
        };
        assert_eq!(tp_decode_allreduce_bytes_per_token(&m, 4), 3_932_160.0);
    }

    #[test]
    fn costmodel_7b_400b_moe_ep8() {
        assert_eq!(
            ep_bytes_per_token_per_layer(8192, 2, 8),
            (65_536.0, 57_344.0)
        );
    }
}

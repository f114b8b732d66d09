//! Bytes that cross the wire per token for the collectives of one axis (docs/costmodel.md §3, §7): the
//! closed forms behind the worked checks and the `explain` output.

use crate::comm::Collective;
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
            dropout: false,
            moe: None,
            mla: None,
            layer_pattern: None,
            mamba: None,
            linear_attention: None,
            sliding_window: None,
            mtp_layers: None,
            mtp_pattern: None,
            attention_output_gate: false,
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

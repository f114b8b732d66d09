//! Bytes that cross the wire per token for the collectives of one axis (COSTMODEL §3, §7): the
//! closed forms behind the worked checks and the `explain` output.

use crate::model::Model;

/// Bytes per activation element on the wire (bf16).
const WIRE_BYTES: f64 = 2.0;

/// Ring all-reduce bytes each GPU sends per generated token in TP decode: two all-reduces per
/// layer (after the attention output and the FFN down projection) of one hidden state,
/// `2·(t−1)/t` of it each (COSTMODEL §7(a), [NAR21 §3.2]).
pub fn tp_decode_allreduce_bytes_per_token(model: &Model, tp: u32) -> f64 {
    let t = tp as f64;
    let per_all_reduce = 2.0 * (t - 1.0) / t * model.hidden as f64 * WIRE_BYTES;
    2.0 * model.layers as f64 * per_all_reduce
}

/// Expert-parallel all-to-all bytes per token per MoE layer for one forward pass: dispatch of
/// `top_k` hidden vectors plus their combine (total), and the share that leaves the rank under
/// uniform routing over `ep` ranks, `(e−1)/e` (COSTMODEL §3.7, §7(b)).
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

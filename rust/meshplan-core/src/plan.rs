//! A parallel plan: the five degrees (`N = dp·tp·pp·ep·cp`) and the knobs that go with them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Activation recomputation mode (COSTMODEL §1.3, §2.4).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    #[default]
    None,
    /// Recompute core attention only (Korthikanti et al. 2022 §5).
    Selective,
    /// Recompute every layer from its stored input.
    Full,
}

impl Recompute {
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// Pipeline schedule (COSTMODEL §4).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub enum Schedule {
    /// PipeDream-Flush one-forward-one-backward; also the label of plans without pipelining.
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Megatron's interleaved 1F1B with `vpp` model chunks per rank.
    #[serde(rename = "interleaved-1f1b")]
    Interleaved,
    /// Zero-bubble ZB-H1 (Qi et al. 2024): 1F1B memory, bubble `(p-1)(t_F + t_B - t_W)`.
    #[serde(rename = "zb-h1")]
    ZeroBubbleH1,
}

impl Schedule {
    pub const ALL: [Schedule; 3] = [
        Schedule::OneFOneB,
        Schedule::Interleaved,
        Schedule::ZeroBubbleH1,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved-1f1b",
            Schedule::ZeroBubbleH1 => "zb-h1",
        }
    }
}

/// One way to run the workload on the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Data-parallel degree (dense layers see `dp·ep`).
    pub dp: u32,
    /// Tensor-parallel degree (also the expert tensor-parallel degree).
    pub tp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Expert-parallel degree (1 for dense models).
    #[serde(default = "one")]
    pub ep: u32,
    /// Context-parallel degree.
    #[serde(default = "one")]
    pub cp: u32,
    /// Model chunks per pipeline rank (1 = no interleaving).
    #[serde(default = "one")]
    pub vpp: u32,
    /// Sequences per micro-batch.
    #[serde(default = "one")]
    pub micro_batch: u32,
    /// ZeRO stage: 0 none (DDP), 1 optimizer states (Megatron distributed optimizer),
    /// 2 + gradients, 3 + parameters (FSDP full shard).
    #[serde(default)]
    pub zero: u8,
    #[serde(default)]
    pub recompute: Recompute,
    #[serde(default)]
    pub sequence_parallel: bool,
    /// `None` picks the natural schedule: interleaved when `vpp > 1`, else 1F1B.
    #[serde(default)]
    pub schedule: Option<Schedule>,
}

fn one() -> u32 {
    1
}

impl Plan {
    /// Total GPUs the plan uses.
    /// (Saturates at `u64::MAX`, so absurd degrees never wrap around to a valid GPU count.)
    pub fn num_gpus(&self) -> u64 {
        [self.dp, self.tp, self.pp, self.ep, self.cp]
            .into_iter()
            .fold(1u64, |acc, d| acc.saturating_mul(d as u64))
    }

    /// The schedule in effect.
    pub fn schedule(&self) -> Schedule {
        self.schedule.unwrap_or(if self.vpp > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        })
    }

    /// Dense-layer data-parallel degree `d_p = dp·ep` (COSTMODEL mapping box).
    pub fn dense_dp(&self) -> u32 {
        self.dp * self.ep
    }

    /// Checks the fields that make a plan meaningless (not merely infeasible) for `num_gpus`.
    pub fn validate(&self, num_gpus: u32) -> Result<()> {
        for (field, v) in [
            ("plan.dp", self.dp),
            ("plan.tp", self.tp),
            ("plan.pp", self.pp),
            ("plan.ep", self.ep),
            ("plan.cp", self.cp),
            ("plan.vpp", self.vpp),
            ("plan.micro_batch", self.micro_batch),
        ] {
            if v == 0 {
                return Err(Error::invalid(field, v, "an integer >= 1"));
            }
        }
        if self.zero > 3 {
            return Err(Error::invalid("plan.zero", self.zero, "0, 1, 2 or 3"));
        }
        if self.num_gpus() != num_gpus as u64 {
            return Err(Error::invalid(
                "plan",
                format!("dp·tp·pp·ep·cp = {}", self.num_gpus()),
                format!("a product equal to the cluster's {num_gpus} GPUs"),
            ));
        }
        match (self.schedule(), self.vpp) {
            (Schedule::Interleaved, 1) => {
                return Err(Error::invalid(
                    "plan.vpp",
                    1,
                    "an integer >= 2 with the interleaved-1f1b schedule",
                ))
            }
            (s, v) if s != Schedule::Interleaved && v > 1 => {
                return Err(Error::invalid(
                    "plan.schedule",
                    s.name(),
                    format!("interleaved-1f1b (vpp = {v} needs it)"),
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dp={},tp={},pp={},ep={},cp={},vpp={},micro_batch={},zero={},recompute={},sequence_parallel={},schedule={}",
            self.dp,
            self.tp,
            self.pp,
            self.ep,
            self.cp,
            self.vpp,
            self.micro_batch,
            self.zero,
            self.recompute.name(),
            self.sequence_parallel,
            self.schedule().name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_whose_product_overflows_are_rejected() {
        // 24 · (2^32 − 1)^2 · 2863311531 is exactly 8 modulo 2^64: it must not pass as 8 GPUs.
        let plan = Plan {
            dp: 24,
            tp: u32::MAX,
            pp: u32::MAX,
            ep: 2_863_311_531,
            cp: 1,
            vpp: 1,
            micro_batch: 1,
            zero: 0,
            recompute: Recompute::None,
            sequence_parallel: false,
            schedule: None,
        };
        let e = plan.validate(8).unwrap_err();
        assert!(e.to_string().contains("plan"), "{e}");
    }
}

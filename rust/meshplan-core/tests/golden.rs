//! Worked checks of docs/costmodel.md §7 through the public API: (a) and (b) traffic, (c) FSDP vs TP = 8
//! for a 7B Llama-2-shaped model on 8× A100 40GB.

use meshplan_core::traffic::{ep_bytes_per_token_per_layer, tp_decode_allreduce_bytes_per_token};
use meshplan_core::*;

const GB_PER_GIB: f64 = (1u64 << 30) as f64 / 1e9;

#[test]
fn a_llama3_70b_tp4_decode_all_reduce_bytes() {
    let m = presets::model("llama3-70b").unwrap();
    assert_eq!(tp_decode_allreduce_bytes_per_token(&m, 4), 3_932_160.0);
}

#[test]
fn b_400b_moe_all_to_all_bytes() {
    assert_eq!(
        ep_bytes_per_token_per_layer(8192, 2, 8),
        (65_536.0, 57_344.0)
    );
}

fn seven_b_on_8_a100_40g() -> Problem {
    let cluster = Cluster {
        gpu: presets::gpu("a100-sxm-40g").unwrap(),
        num_gpus: 8,
        gpus_per_node: None,
        nvlink_domain: None,
    };
    Problem::new(
        presets::model("llama2-7b").unwrap(),
        cluster,
        Workload::new(8, 4096),
    )
    .unwrap()
}

fn plan(dp: u32, tp: u32, zero: u8, sp: bool) -> Plan {
    Plan {
        dp,
        tp,
        zero,
        sequence_parallel: sp,
        ..Plan::default()
    }
}

fn within(got: f64, want: f64, tol: f64) -> bool {
    (got / want - 1.0).abs() <= tol
}

#[test]
fn c_fsdp_and_tp8_are_feasible_with_the_documented_memory() {
    let p = seven_b_on_8_a100_40g();
    let fsdp = evaluate(&p, &plan(8, 1, 3, false)).unwrap();
    let tp8 = evaluate(&p, &plan(1, 8, 1, true)).unwrap();
    assert!(fsdp.feasible, "{:?}", fsdp.reasons);
    assert!(tp8.feasible, "{:?}", tp8.reasons);
    // §7(c): FSDP ≈ 13.5 (states) + 1.2 (unit) + 17.2 (activations) + 1.0 (logits) + 1.5 fixed ≈ 34.4 GB.
    let fsdp_gb = fsdp.peak_memory_gib * GB_PER_GIB;
    assert!(within(fsdp_gb, 34.4, 0.10), "FSDP peak {fsdp_gb:.2} GB");
    // Model states alone: 16·Ψ/8 = 13.48 GB.
    let states = (fsdp.memory_gib.weights + fsdp.memory_gib.gradients + fsdp.memory_gib.optimizer)
        * GB_PER_GIB;
    assert!(within(states, 13.48, 0.01), "FSDP states {states:.2} GB");
    let act = fsdp.memory_gib.activations * GB_PER_GIB;
    assert!(
        within(act, 17.2 + 0.52, 0.05),
        "FSDP activations {act:.2} GB"
    );
    // TP = 8 + SP with the distributed optimizer over DP = 1: 6 + 12 = 18 B/param / 8 = 15.16 GB,
    // activations 17.2 / 8 = 2.16 GB per micro-batch.
    let states =
        (tp8.memory_gib.weights + tp8.memory_gib.gradients + tp8.memory_gib.optimizer) * GB_PER_GIB;
    assert!(within(states, 15.16, 0.01), "TP8 states {states:.2} GB");
    let act = tp8.memory_gib.activations * GB_PER_GIB;
    assert!(
        within(act, 2.16 + 0.52 / 8.0 * 1.0, 0.10),
        "TP8 activations {act:.2} GB"
    );
}

#[test]
fn c_fsdp_ranks_faster_than_tp8() {
    let p = seven_b_on_8_a100_40g();
    let fsdp = evaluate(&p, &plan(8, 1, 3, false)).unwrap();
    let tp8 = evaluate(&p, &plan(1, 8, 1, true)).unwrap();
    assert!(
        fsdp.step_time_s < tp8.step_time_s,
        "FSDP {:.3} s vs TP8 {:.3} s",
        fsdp.step_time_s,
        tp8.step_time_s
    );
    // And the search agrees: among the feasible plans, FSDP (dp = 8, ZeRO-3) beats TP = 8.
    let space = SearchSpace {
        top_k: 100_000,
        ..SearchSpace::default()
    };
    let r = search(&p, &space, &Control::default()).unwrap();
    let rank_of = |pred: &dyn Fn(&Plan) -> bool| r.plans.iter().position(|e| pred(&e.plan));
    let fsdp_rank = rank_of(&|pl| {
        pl.dp == 8 && pl.zero == 3 && pl.micro_batch == 1 && pl.recompute == Recompute::None
    })
    .unwrap();
    let tp8_rank =
        rank_of(&|pl| pl.tp == 8 && pl.micro_batch == 1 && pl.recompute == Recompute::None)
            .unwrap();
    assert!(
        fsdp_rank < tp8_rank,
        "FSDP rank {fsdp_rank}, TP8 rank {tp8_rank}"
    );
}

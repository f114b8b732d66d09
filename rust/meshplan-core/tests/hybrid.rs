//! Hybrid layer stacks end to end (docs/costmodel.md §1.4): the Nemotron-H, Nemotron 3 and
//! Qwen3-Next presets evaluate, search and explain; the Mamba-2 and gated DeltaNet rules; the
//! cost-balanced pipeline split.

mod common;

use common::problem;
use meshplan_core::stages::{balanced_ranks, head_cost, layer_costs, stage_runs};
use meshplan_core::*;

/// The best plan of a small search of `p` (with every knob open).
fn best(p: &Problem) -> Evaluation {
    let r = search(p, &SearchSpace::default(), &Control::default()).unwrap();
    assert!(!r.plans.is_empty(), "no feasible plan");
    r.plans[0].clone()
}

#[test]
fn nemotron_h_56b_on_64_h100_searches_and_explains() {
    let p = problem("nemotron-h-56b", "h100-sxm", 64, 768, 8192);
    let e = best(&p);
    assert!(e.feasible && e.mfu > 0.1 && e.mfu < 0.8, "{e:?}");
    let x = explain(&p, &e.plan).unwrap();
    assert_eq!(x.evaluation.step_time_s, e.step_time_s);
    let text = serde_json::to_string(&x).unwrap();
    // The explanation names the layer kinds and, pipelined, how the layers were split.
    assert!(
        text.contains("Mamba-2 layer splits its 256 SSM heads"),
        "{text}"
    );
    if e.plan.pp > 1 {
        let pp = x.axes.iter().find(|a| a.axis == "pp").unwrap();
        let note = pp
            .notes
            .iter()
            .find(|n| n.contains("split by cost"))
            .unwrap();
        println!("{note}");
        assert!(
            note.contains("stage 0: ") && note.contains("Mamba-2"),
            "{note}"
        );
    }
    println!(
        "nemotron-h-56b 64×H100 s=8192 gbs=768: {:?} step {:.2} s, MFU {:.1}%",
        e.plan,
        e.step_time_s,
        100.0 * e.mfu
    );
}

#[test]
fn mamba_layers_need_heads_and_groups_on_tp_and_cp() {
    let p = problem("nemotron-h-8b", "h100-sxm", 64, 256, 8192);
    let base = best(&p).plan;
    // 8 Mamba groups: tp = 16 splits the heads (128) but not the groups.
    let bad_tp = Plan {
        tp: 16,
        dp: 4,
        pp: 1,
        cp: 1,
        ep: 1,
        vpp: 1,
        schedule: None,
        ..base
    };
    let e = evaluate(&p, &bad_tp).unwrap();
    let reason = e.reasons.iter().find(|r| r.rule == "tp_heads").unwrap();
    assert!(reason.message.contains("Mamba-2"), "{}", reason.message);
    // cp = 3 cannot split the 32 heads per TP rank of tp = 4 (MambaContextParallel needs whole
    // heads per rank).
    let p96 = problem("nemotron-h-8b", "h100-sxm", 96, 192, 8192);
    let bad_cp = Plan {
        tp: 4,
        cp: 3,
        dp: 8,
        pp: 1,
        ep: 1,
        vpp: 1,
        schedule: None,
        ..base
    };
    let e = evaluate(&p96, &bad_cp).unwrap();
    assert!(
        e.reasons.iter().any(|r| r.rule == "cp_mixer"),
        "{:?}",
        e.reasons
    );
    // cp = 2 over tp = 4 is Megatron's MambaContextParallel (32 heads and 2 groups per TP rank).
    let ok_cp = Plan {
        tp: 4,
        cp: 2,
        dp: 8,
        pp: 1,
        ep: 1,
        vpp: 1,
        schedule: None,
        ..base
    };
    let e = evaluate(&p, &ok_cp).unwrap();
    assert!(
        !e.reasons.iter().any(|r| r.rule == "cp_mixer"),
        "{:?}",
        e.reasons
    );
    assert!(e.time_s.cp > 0.0, "the all-to-alls cost time");
}

#[test]
fn gated_deltanet_has_no_context_parallelism() {
    let p = problem("qwen3-next-80b-a3b", "h100-sxm", 64, 512, 4096);
    let base = best(&p).plan;
    let cp = Plan {
        cp: 2,
        dp: base.dp / 2,
        ..base
    };
    if cp.dp == 0 {
        return;
    }
    let e = evaluate(&p, &cp).unwrap();
    let r = e.reasons.iter().find(|r| r.rule == "cp_mixer").unwrap();
    assert!(r.message.contains("DeltaNet"), "{}", r.message);
}

#[test]
fn the_pipeline_split_balances_cost_not_layer_count() {
    let m = presets::model("nemotron-h-56b").unwrap();
    let costs = layer_costs(&m, 8192);
    let kinds = m.layer_kinds();
    let ranks = balanced_ranks(&m, 8, 8192);
    assert_eq!(ranks.len(), 8);
    assert_eq!(ranks.iter().map(|c| c.total()).sum::<u32>(), 118);
    assert!(ranks.iter().all(|c| c.total() > 0));
    let load = |i: usize| {
        ranks[i].weighted_sum(&costs[..kinds.len()]) + if i == 7 { head_cost(&m) } else { 0.0 }
    };
    let loads: Vec<f64> = (0..8).map(load).collect();
    let max = loads.iter().cloned().fold(0.0, f64::max);
    let mean = loads.iter().sum::<f64>() / 8.0;
    // The heaviest rank is within one heaviest layer of the mean.
    let heaviest_layer = costs.iter().cloned().fold(0.0, f64::max);
    assert!(max - mean <= heaviest_layer, "{loads:?}");
    // An even count split (15 / 15 / ... / 13) would put the LM head on a rank of as many layers
    // as the others: the balanced split gives the last rank fewer.
    assert!(ranks[7].total() < ranks[3].total(), "{ranks:?}");
    // The stage runs cover the ranks in order, with the same counts.
    let runs = stage_runs(&m, 8, 8192);
    let flat: Vec<_> = runs
        .iter()
        .flat_map(|r| r.ranks())
        .map(|s| s.kinds)
        .collect();
    assert_eq!(flat, ranks);
}

#[test]
fn a_mamba_layer_weighs_its_scan_at_the_flash_attention_floor() {
    // Nemotron-H 8B: Mamba-2 layers of 128 heads x 64 channels. Their weight in the pipeline
    // split is the matmuls plus the scan at the time it is charged: flash attention of 128 heads
    // of dim 64 over the crossover keys (data/device.toml), not the scan's own FLOPs.
    let m = presets::model("nemotron-h-8b").unwrap();
    let kinds = m.layer_kinds();
    let k = (0..kinds.len())
        .find(|&k| {
            matches!(
                kinds.specs()[k].mixer,
                meshplan_core::layer::Mixer::Mamba(_)
            )
        })
        .unwrap();
    let spec = kinds.specs()[k];
    let keys = meshplan_core::device::ssd_flash_crossover_keys();
    let matmuls = 2.0 * spec.active_matmul_params(&m) as f64;
    let floor = 4.0 * 128.0 * 64.0 * keys;
    let costs = layer_costs(&m, 8192);
    assert!(
        (costs[k] / (matmuls + floor) - 1.0).abs() < 1e-12,
        "{}",
        costs[k]
    );
    // The floor is a time, not FLOPs the model counts: the scan's own FLOPs are far fewer.
    let core = meshplan_core::layer::core_of(&m, &spec.mixer, 1);
    assert!(core.scan_fwd_flops_per_token < floor / 5.0);
}

#[test]
fn a_homogeneous_model_keeps_the_count_split() {
    // No layer pattern: Megatron's even split, whatever the costs.
    let m = presets::model("llama3-70b").unwrap();
    let runs = stage_runs(&m, 8, 8192);
    assert!(runs.iter().all(|r| r.stage.layers() == 10));
}

#[test]
fn pattern_validation_names_the_field() {
    let mut m = presets::model("nemotron-h-8b").unwrap();
    m.layer_pattern = Some("M-M*X".into());
    let e = m.validate().unwrap_err().to_string();
    assert!(
        e.contains("model.layer_pattern") && e.contains("'X'"),
        "{e}"
    );
    m.layer_pattern = Some("M-M*".into());
    let e = m.validate().unwrap_err().to_string();
    assert!(
        e.contains("model.layer_pattern") && e.contains("52 characters"),
        "{e}"
    );
    let mut m = presets::model("nemotron-h-8b").unwrap();
    m.mamba = None;
    let e = m.validate().unwrap_err().to_string();
    assert!(e.contains("model.mamba"), "{e}");
    let mut m = presets::model("nemotron-h-8b").unwrap();
    m.layer_pattern = None;
    let e = m.validate().unwrap_err().to_string();
    assert!(
        e.contains("model.mamba") && e.contains("without a layer_pattern"),
        "{e}"
    );
    // In range of u32 the validation names the field; past it serde refuses the number (the
    // Python and gRPC layers name the field for those, docs/limits.md).
    for v in [0u64, 1 << 31, 1 << 32, u64::MAX] {
        let text = serde_json::to_string(&presets::model("nemotron-h-8b").unwrap())
            .unwrap()
            .replace("\"state\":128", &format!("\"state\":{v}"));
        match serde_json::from_str::<Model>(&text) {
            Ok(m) => {
                let e = m.validate().unwrap_err().to_string();
                assert!(
                    e.contains("model.mamba.state") && e.contains(&v.to_string()),
                    "{e}"
                );
            }
            Err(e) => assert!(v > u32::MAX as u64, "{v}: {e}"),
        }
    }
}

#[test]
fn presets_match_their_published_sizes() {
    let b = |name: &str| presets::model(name).unwrap().total_params() as f64 / 1e9;
    // Nemotron-H paper (arXiv 2504.03624) Table 1: 8 B, 47 B, 56 B.
    assert!(
        (b("nemotron-h-8b") - 8.1).abs() < 0.2,
        "{}",
        b("nemotron-h-8b")
    );
    assert!(
        (b("nemotron-h-47b") - 47.0).abs() < 1.0,
        "{}",
        b("nemotron-h-47b")
    );
    assert!(
        (b("nemotron-h-56b") - 56.3).abs() < 0.5,
        "{}",
        b("nemotron-h-56b")
    );
    assert!((b("nemotron-3-nano-30b-a3b") - 31.6).abs() < 0.2);
    assert!((b("qwen3-next-80b-a3b") - 80.0).abs() < 1.0);
}

#[test]
fn the_zero3_unit_of_a_hybrid_stage_is_its_largest_layer() {
    // Nemotron 3 Nano's kinds in order of first appearance: Mamba-2, MoE, attention. The last
    // kind (attention) is the smallest; the ZeRO-3 gather unit is the MoE layer.
    let p = problem("nemotron-3-nano-30b-a3b", "h100-sxm", 8, 64, 4096);
    let plan = best(&p).plan;
    let m = &p.model;
    let stage = stage_runs(m, 1, 4096)[0].stage;
    let per_kind = memory::kind_params(m, &plan);
    let sizes: Vec<f64> = (0..m.layer_kinds().len())
        .map(|k| per_kind[k].dense + per_kind[k].expert)
        .collect();
    assert!(m.layer_kinds().specs()[1].moe().is_some());
    assert!(sizes[2] < sizes[1], "{sizes:?}");
    let params = memory::stage_params(m, &plan, &stage);
    assert_eq!(params.largest_layer, sizes[1]);
}

//! Tests of `explain`: the axes add up to the step, bytes match the worked examples of
//! docs/costmodel.md §7, the mesh follows the rank order.

use super::*;
use crate::model::{Activation, Moe, Norm};
use crate::presets;
use crate::stages::stage_runs;
use crate::workload::Workload;

fn cluster(gpu: &str, n: u32) -> Cluster {
    presets::cluster(gpu, n)
}

fn problem(model: Model, gpu: &str, n: u32, global_batch: u32, seq_len: u32) -> Problem {
    Problem::new(model, cluster(gpu, n), Workload::new(global_batch, seq_len)).unwrap()
}

fn plan(text: &str) -> Plan {
    // "dp=2,tp=4,..." → a plan through serde, the way every front end builds one.
    let mut map = serde_json::Map::new();
    for kv in text.split(',') {
        let (k, v) = kv.split_once('=').unwrap();
        let value = v
            .parse::<u64>()
            .map(serde_json::Value::from)
            .or_else(|_| v.parse::<bool>().map(serde_json::Value::from))
            .unwrap_or_else(|_| serde_json::Value::from(v));
        map.insert(k.to_string(), value);
    }
    serde_json::from_value(serde_json::Value::Object(map)).unwrap()
}

/// A 400B-class MoE with the §7(b) shape: h = 8192, 64 routed experts, top-2.
fn moe_400b() -> Model {
    Model {
        name: "moe-400b".into(),
        layers: 40,
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
        moe: Some(Moe {
            num_experts: 64,
            top_k: 2,
            expert_ffn_hidden: 6144,
            shared_experts: 0,
            shared_expert_ffn_hidden: None,
            first_dense_layers: 0,
            latent_size: None,
        }),
        mla: None,
        layer_pattern: None,
        mamba: None,
        linear_attention: None,
        sliding_window: None,
        mtp_layers: None,
        mtp_pattern: None,
        attention_output_gate: false,
    }
}

fn axis<'e>(x: &'e Explanation, name: &str) -> &'e AxisExplanation {
    x.axes
        .iter()
        .find(|a| a.axis == name)
        .unwrap_or_else(|| panic!("no {name} axis"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn commas_group_thousands() {
    assert_eq!(commas(57_344.0), "57,344");
    assert_eq!(commas(3_932_160.0), "3,932,160");
    assert_eq!(commas(999.4), "999");
    assert_eq!(commas(-1234.0), "-1,234");
}

#[test]
fn costmodel_7a_decode_all_reduce_traffic() {
    let m = presets::model("llama3-70b").unwrap();
    let d = decode_traffic(&m, &cluster("h100-sxm", 4), 4, 50.0).unwrap();
    assert_eq!(d.all_reduces_per_token, 160);
    assert_eq!(d.message_bytes, 16_384.0);
    assert_eq!(d.bytes_per_token_per_gpu, 3_932_160.0);
    assert!(close(d.gb_per_s_per_gpu, 0.196_608));
    assert_eq!(d.link_gb_per_s, 450.0);
    assert!(close(d.fraction_of_link, 0.196_608 / 450.0));
    assert!(d.latency_bound && d.latency_s_per_token > d.bandwidth_s_per_token);
    assert_eq!(d.fabric, "nvlink");
    assert!(decode_traffic(&m, &cluster("h100-sxm", 4), 0, 50.0).is_err());
    assert!(decode_traffic(&m, &cluster("h100-sxm", 4), 4, f64::NAN).is_err());
}

#[test]
fn costmodel_7b_all_to_all_bytes_per_token_per_moe_layer() {
    let p = problem(moe_400b(), "h100-sxm", 64, 64, 4096);
    let x = explain(&p, &plan("dp=8,tp=1,pp=1,ep=8,zero=1")).unwrap();
    let ep = axis(&x, "ep");
    let fwd = &ep.collectives[0];
    assert!(fwd.when.contains("forward"), "{}", fwd.when);
    assert_eq!(fwd.op, "all-to-all");
    // Dispatch + combine per token per MoE layer, the share leaving the rank: 57,344 B.
    assert_eq!(fwd.bytes_per_token_per_gpu / 40.0, 57_344.0);
    let bwd = &ep.collectives[1];
    assert_eq!(bwd.bytes_per_token_per_gpu / 40.0, 57_344.0);
    assert!(
        ep.notes[0].contains("65,536 B") && ep.notes[0].contains("57,344 B"),
        "{}",
        ep.notes[0]
    );
    assert_eq!(
        (ep.group_size, ep.members_per_domain, ep.fabric.as_str()),
        (8, 8, "nvlink")
    );
}

/// Plans covering every axis, ZeRO stage, SP, recompute and schedule.
fn cases() -> Vec<(Problem, Plan)> {
    let llama70 = || presets::model("llama3-70b").unwrap();
    let mixtral = || presets::model("mixtral-8x7b").unwrap();
    vec![
        (
            problem(llama70(), "h100-sxm", 64, 128, 8192),
            plan("dp=2,tp=4,pp=4,cp=2,vpp=5,zero=1,sequence_parallel=true"),
        ),
        (
            problem(llama70(), "h100-sxm", 64, 128, 8192),
            plan("dp=4,tp=8,pp=2,zero=0,recompute=full"),
        ),
        (
            problem(llama70(), "h100-sxm", 64, 128, 8192),
            plan("dp=8,tp=8,pp=1,zero=3,micro_batch=2"),
        ),
        (
            problem(llama70(), "h100-sxm", 64, 128, 8192),
            plan("dp=4,tp=4,pp=4,zero=2,schedule=zb-h1,recompute=selective"),
        ),
        (
            problem(mixtral(), "h100-sxm", 64, 128, 4096),
            plan("dp=2,tp=2,pp=2,ep=8,zero=1,sequence_parallel=true"),
        ),
        (
            problem(mixtral(), "h100-sxm", 64, 128, 4096),
            plan("dp=1,tp=1,pp=4,ep=8,cp=2,zero=0,recompute=full"),
        ),
        (
            problem(moe_400b(), "gb200-nvl72", 128, 256, 4096),
            plan("dp=2,tp=4,pp=2,ep=8,zero=3"),
        ),
    ]
}

#[test]
fn exposed_times_add_up_to_the_step() {
    for (p, pl) in cases() {
        let x = explain(&p, &pl).unwrap();
        let t = &x.evaluation.time_s;
        let sum: f64 = x.axes.iter().map(|a| a.exposed_s).sum::<f64>() + t.compute + t.optimizer;
        assert!(
            close(sum, x.evaluation.step_time_s),
            "{pl}: {sum} vs {}",
            x.evaluation.step_time_s
        );
        for a in &x.axes {
            assert!(
                a.exposed_s >= 0.0 && a.overlapped_s >= 0.0,
                "{pl} {}",
                a.axis
            );
            assert!(!a.state_sharded.is_empty());
        }
    }
}

#[test]
fn tp_and_ep_seconds_are_the_time_models_before_overlap() {
    for (p, pl) in cases() {
        let x = explain(&p, &pl).unwrap();
        let cal = &p.cluster.gpu.calibration;
        if x.plan.tp > 1 {
            let tp = axis(&x, "tp");
            let (layers, ends): (Vec<_>, Vec<_>) = tp
                .collectives
                .iter()
                .partition(|c| c.when.starts_with("per layer"));
            let layer_s: f64 = layers.iter().map(|c| c.seconds_per_step).sum();
            let end_s: f64 = ends.iter().map(|c| c.seconds_per_step).sum();
            let want = (1.0 - cal.tp_overlap_under(crate::stack::Stack::default_stack())) * layer_s
                + end_s;
            assert!(
                close(want, x.evaluation.time_s.tp),
                "{pl}: {want} vs {}",
                x.evaluation.time_s.tp
            );
        }
        if x.plan.ep > 1 {
            let ep = axis(&x, "ep");
            let raw: f64 = ep.collectives.iter().map(|c| c.seconds_per_step).sum();
            assert!(
                close((1.0 - cal.ep_overlap) * raw, x.evaluation.time_s.ep),
                "{pl}"
            );
        }
        if x.plan.pp > 1 {
            let pp = axis(&x, "pp");
            let hop = pp.collectives[0].seconds_per_step / pp.collectives[0].count_per_step as f64;
            let want = 2.0 * (x.plan.pp - 1) as f64 * x.plan.vpp as f64 * hop;
            assert!(close(want, x.evaluation.time_s.pp_p2p), "{pl}");
            let t = &x.evaluation.time_s;
            assert!(close(pp.exposed_s, t.bubble + t.pp_p2p));
        }
        if x.plan.cp > 1 {
            let cp = axis(&x, "cp");
            let raw: f64 = cp.collectives.iter().map(|c| c.seconds_per_step).sum();
            assert!(x.evaluation.time_s.cp <= raw * (1.0 + 1e-12), "{pl}");
        }
    }
}

#[test]
fn dp_reduction_uses_the_stage_parameters_and_zero_takes_it_over() {
    let p = problem(
        presets::model("llama3-70b").unwrap(),
        "h100-sxm",
        64,
        128,
        8192,
    );
    let x = explain(&p, &plan("dp=4,tp=8,pp=2,zero=0")).unwrap();
    let dp = axis(&x, "dp");
    assert!(x.axes.iter().all(|a| a.axis != "zero"));
    let stage0 = stage_runs(&p.model, 2, p.workload.seq_len)[0].stage;
    let params = crate::memory::stage_params(&p.model, &x.plan, &stage0);
    let ar = &dp.collectives[0];
    assert_eq!(ar.op, "all-reduce");
    // One all-reduce per DDP bucket of at most 40M parameters (the stack's), as time charges.
    let buckets = (params.dense / 40e6).ceil();
    assert!(buckets > 1.0);
    assert_eq!(ar.count_per_step, buckets as u64);
    assert_eq!(ar.message_bytes, params.dense / buckets * 4.0);
    assert!(close(
        ar.bytes_per_step_per_gpu,
        2.0 * 3.0 / 4.0 * params.dense * 4.0
    ));
    // dp = 4 over the 8-GPU nodes with TP = 8 inside: one member per node.
    assert_eq!(
        (dp.group_size, dp.members_per_domain, dp.fabric.as_str()),
        (4, 1, "network")
    );
    assert!(close(dp.exposed_s, x.evaluation.time_s.dp));

    for zero in 1..=3u8 {
        let pl = Plan {
            zero,
            ..x.plan.clone()
        };
        let z = explain(&p, &pl).unwrap();
        assert!(axis(&z, "dp").collectives.is_empty());
        let za = axis(&z, "zero");
        assert_eq!(za.degree, zero as u32);
        assert!(close(za.exposed_s, z.evaluation.time_s.dp));
        let ops: Vec<&str> = za.collectives.iter().map(|c| c.op.as_str()).collect();
        assert!(
            ops.contains(&"reduce-scatter") && ops.contains(&"all-gather"),
            "{ops:?}"
        );
    }
    // ZeRO-3 gathers every layer twice per micro-batch.
    let z3 = explain(
        &p,
        &Plan {
            zero: 3,
            ..x.plan.clone()
        },
    )
    .unwrap();
    let m = z3.evaluation.micro_batches as u64;
    assert_eq!(axis(&z3, "zero").collectives[0].count_per_step, m * 40);
}

/// Σ of the rows whose `when` starts with `prefix`, seconds per step, and per call.
fn rows_s(a: &AxisExplanation, prefix: &str) -> (f64, f64) {
    a.collectives
        .iter()
        .filter(|c| c.when.starts_with(prefix))
        .fold((0.0, 0.0), |(all, one), c| {
            (
                all + c.seconds_per_step,
                one + c.seconds_per_step / c.count_per_step as f64,
            )
        })
}

#[test]
fn llama3_8b_on_512_gb200_steps_under_150_ms_with_rows_that_add_up() {
    // Issue 10's scaling example (the MLPerf regime): 256-rank ZeRO-1 reduce-scatter and
    // all-gather in Megatron-sized buckets, overlapped with the backward and the next forward.
    let mut w = Workload::new(64, 8192);
    w.precision = crate::Precision::Fp8;
    let p = Problem::new(
        presets::model("llama3-8b").unwrap(),
        cluster("gb200-nvl72", 512),
        w,
    )
    .unwrap();
    let pl =
        plan("dp=64,tp=2,pp=1,cp=4,micro_batch=1,zero=1,recompute=none,sequence_parallel=true");
    let x = explain(&p, &pl).unwrap();
    let e = &x.evaluation;
    assert!(e.step_time_s < 0.15, "{}", e.step_time_s);
    let t = &e.time_s;
    let parts = t.compute + t.tp + t.cp + t.ep + t.pp_p2p + t.bubble + t.dp + t.optimizer;
    assert!(close(parts, e.step_time_s), "{parts} vs {}", e.step_time_s);
    for a in &x.axes {
        // Every axis's rows are its exposed plus its overlapped seconds, and each row names
        // the algorithm charged and the latency it pays.
        let (rows, _) = rows_s(a, "");
        assert!(
            close(rows, a.exposed_s + a.overlapped_s) || rows == 0.0,
            "{}",
            a.axis
        );
        for c in &a.collectives {
            assert!(!c.algorithm.is_empty() && c.algorithm != "none", "{c:?}");
            assert!(c.latency_seconds_per_step > 0.0);
            assert!(c.latency_seconds_per_step <= c.seconds_per_step);
        }
    }
    let zero = axis(&x, "zero");
    assert!(close(zero.exposed_s, t.dp));
    // 8 B parameters over 256 ranks: Megatron's bucket is max(40 M, 256 · 1 M) = 256 M.
    assert_eq!(zero.collectives[0].count_per_step, 16);
    assert!(zero.overlapped_s > 5.0 * zero.exposed_s);
}

#[test]
fn dp_and_zero_rows_add_up_to_the_charged_dp_time() {
    // With nothing hidden (dp_overlap overridden to 0) and one pipeline stage, the DP time the
    // step charges is the rows' seconds (ZeRO-3 also exposes the first gather and the last
    // reduce-scatter once more): explain lists what time charges, call for call.
    for (model, gpu, n, degrees) in [
        (
            presets::model("llama3-70b").unwrap(),
            "h100-sxm",
            64,
            "dp=8,tp=8,pp=1",
        ),
        (moe_400b(), "h100-sxm", 128, "dp=2,tp=8,pp=1,ep=8"),
        (
            presets::model("llama3-8b").unwrap(),
            "gb200-nvl72",
            512,
            "dp=64,tp=2,pp=1,cp=4",
        ),
    ] {
        let mut p = problem(model, gpu, n, 256, 8192);
        p.cluster.gpu.calibration.dp_overlap = Some(0.0);
        for zero in 0..=3u8 {
            let pl = plan(&format!("{degrees},zero={zero}"));
            let x = explain(&p, &pl).unwrap();
            let a = axis(&x, if zero == 0 { "dp" } else { "zero" });
            assert!(!a.collectives.is_empty(), "{pl}");
            let (all, _) = rows_s(a, "");
            let charged = x.evaluation.time_s.dp;
            let want = if zero >= 3 {
                let (_, ag) = rows_s(a, "per unit per micro-batch, forward");
                let (_, rs) = rows_s(
                    a,
                    "per unit per micro-batch, backward (the unit's gradients)",
                );
                all + ag + rs
            } else {
                all
            };
            assert!(charged > 0.0, "{pl}");
            assert!(
                close(want, charged),
                "{pl}: rows {want} vs charged {charged}"
            );
            assert!(close(a.exposed_s, charged));
            if degrees.contains("ep=") {
                assert!(a
                    .collectives
                    .iter()
                    .any(|c| c.when.contains("expert parameters")));
            }
            // Each row is the CollectiveModel's cost of its calls on its group.
            let groups = Groups::of(&x.plan, p.cluster.nvlink_domain());
            let fabric = Fabric::of(&p.cluster);
            for c in &a.collectives {
                let g = if c.when.contains("expert parameters") {
                    groups.expert_dp
                } else {
                    groups.dense_dp
                };
                let kind = match c.op.as_str() {
                    "all-reduce" => Collective::AllReduce,
                    "all-gather" => Collective::AllGather,
                    _ => Collective::ReduceScatter,
                };
                let one = fabric.collective_s(kind, c.message_bytes, g);
                assert!(
                    close(c.seconds_per_step, c.count_per_step as f64 * one),
                    "{pl}: {c:?}"
                );
            }
        }
    }
}

#[test]
fn tp_decode_style_messages_are_latency_bound_and_big_ones_are_not() {
    let p = problem(
        presets::model("llama2-7b").unwrap(),
        "a100-sxm-40g",
        8,
        8,
        4096,
    );
    let x = explain(&p, &plan("dp=1,tp=8,pp=1")).unwrap();
    let tp = axis(&x, "tp");
    assert_eq!(tp.fabric, "nvlink");
    // 4096 tokens × 4096 × 2 B = 33.5 MB per all-reduce: bandwidth-bound (§7(c)).
    assert_eq!(tp.collectives[0].message_bytes, 4096.0 * 4096.0 * 2.0);
    assert!(!tp.collectives[0].latency_bound);
    // 4 all-reduces per layer per sequence (2 forward, 2 backward), 32 layers, 8 sequences.
    let count: u64 = tp
        .collectives
        .iter()
        .filter(|c| c.when.starts_with("per layer"))
        .map(|c| c.count_per_step)
        .sum();
    assert_eq!(count, 4 * 32 * 8);
}

#[test]
fn the_mesh_follows_the_order() {
    let p = problem(
        presets::model("llama3-8b").unwrap(),
        "h100-sxm",
        16,
        64,
        4096,
    );
    let x = explain(&p, &plan("dp=8,tp=2,pp=1")).unwrap();
    assert_eq!(x.mesh.order, RankOrder::DEFAULT);
    assert_eq!(x.mesh.domain_size, 8);
    let names: Vec<(&str, u32, u64)> = x
        .mesh
        .axes
        .iter()
        .map(|a| (a.axis.as_str(), a.size, a.stride))
        .collect();
    assert_eq!(
        names,
        vec![
            ("tp", 2, 1),
            ("cp", 1, 2),
            ("ep", 1, 2),
            ("dp", 8, 2),
            ("pp", 1, 16)
        ]
    );
    let tp = &x.mesh.groups[0];
    assert_eq!(
        (
            tp.axis.as_str(),
            tp.crosses_domain,
            tp.example_ranks.clone()
        ),
        ("tp", false, vec![0, 1])
    );
    let dp = &x.mesh.groups[1];
    assert_eq!(dp.example_ranks, vec![0, 2, 4, 6, 8, 10, 12, 14]);
    assert!(dp.crosses_domain && dp.members_per_domain == 4 && dp.domains == 2);
    assert_eq!(axis(&x, "dp").fabric, "nvlink+network");

    let y = explain(&p, &plan("dp=8,tp=2,pp=1,order=dp-tp-cp-ep-pp")).unwrap();
    assert_eq!(y.plan.order.to_string(), "dp-tp-cp-ep-pp");
    assert_eq!(axis(&y, "tp").fabric, "network");
    assert_eq!(axis(&y, "dp").fabric, "nvlink");
    assert_eq!(y.mesh.groups[0].axis, "dp");
    assert_eq!(y.mesh.groups[0].example_ranks, (0..8).collect::<Vec<u32>>());
}

#[test]
fn pipeline_times_are_the_stage_times() {
    let p = problem(
        presets::model("llama3-70b").unwrap(),
        "h100-sxm",
        64,
        128,
        8192,
    );
    let x = explain(&p, &plan("dp=2,tp=8,pp=4")).unwrap();
    let pt = &x.pipeline;
    assert_eq!(
        (pt.stages.len(), pt.vpp, pt.micro_batches),
        (4, 1, x.evaluation.micro_batches)
    );
    assert_eq!(pt.schedule, Schedule::OneFOneB);
    // 1F1B: bubble = (sum over stages − the slowest) of fwd + bwd (§4).
    let totals: Vec<f64> = pt.stages.iter().map(|s| s.fwd_s + s.bwd_s).collect();
    let worst = totals.iter().cloned().fold(0.0, f64::max);
    let bubble = totals.iter().sum::<f64>() - worst;
    assert!(close(bubble, x.evaluation.time_s.bubble));
    assert!(pt
        .stages
        .iter()
        .all(|s| s.wgrad_s > 0.0 && s.wgrad_s < s.bwd_s));
}

#[test]
fn only_present_axes_are_explained_and_infeasible_plans_still_are() {
    let p = problem(
        presets::model("llama2-7b").unwrap(),
        "a100-sxm-40g",
        8,
        8,
        4096,
    );
    let x = explain(&p, &plan("dp=8,tp=1,pp=1,zero=0,micro_batch=1")).unwrap();
    let names: Vec<&str> = x.axes.iter().map(|a| a.axis.as_str()).collect();
    assert_eq!(names, vec!["dp"]);
    let y = explain(&p, &plan("dp=1,tp=1,pp=8,micro_batch=8")).unwrap();
    let names: Vec<&str> = y.axes.iter().map(|a| a.axis.as_str()).collect();
    assert_eq!(names, vec!["pp"]);
    assert!(explain(&p, &plan("dp=4,tp=1,pp=1")).is_err());
}

#[test]
fn ep_overlap_hides_the_exchange_behind_the_other_directions_compute() {
    let p = problem(
        presets::model("deepseek-v3").unwrap(),
        "h100-sxm",
        256,
        1024,
        4096,
    );
    let base = plan("dp=1,tp=1,pp=8,ep=32,vpp=2,zero=1");
    let off = explain(&p, &base).unwrap();
    let on = explain(
        &p,
        &Plan {
            ep_overlap: true,
            ..base.clone()
        },
    )
    .unwrap();
    let (a_off, a_on) = (axis(&off, "ep"), axis(&on, "ep"));
    // Without the overlap all of the exchange is exposed (calibration ep_overlap 0); with it,
    // less, and what is hidden is the difference.
    let raw = |a: &AxisExplanation| {
        a.collectives
            .iter()
            .map(|c| c.seconds_per_step)
            .sum::<f64>()
    };
    assert!(close(raw(a_off), off.evaluation.time_s.ep));
    assert!(on.evaluation.time_s.ep < raw(a_on));
    assert!(on.evaluation.time_s.ep < off.evaluation.time_s.ep);
    assert!(close(
        a_on.overlapped_s,
        raw(a_on) - on.evaluation.time_s.ep
    ));
    assert!(a_on
        .notes
        .iter()
        .any(|n| n.contains("EP communication overlap")));
    assert!(a_off
        .notes
        .iter()
        .any(|n| n.contains("no EP communication overlap")));
    assert!(on.evaluation.step_time_s < off.evaluation.step_time_s);
    // Each dispatcher names itself in the collectives.
    for (d, op) in [
        (Dispatcher::AllToAll, "all-to-all"),
        (Dispatcher::AllGather, "all-gather + reduce-scatter"),
        (Dispatcher::Flex, "all-to-all"),
    ] {
        let x = explain(
            &p,
            &Plan {
                dispatcher: Some(d),
                ..base.clone()
            },
        )
        .unwrap();
        let a = axis(&x, "ep");
        assert!(a
            .collectives
            .iter()
            .all(|c| c.op == op && c.when.contains(&format!("{} dispatcher", d.name()))));
    }
    // Megatron's overlap refuses full recompute.
    let full = explain(
        &p,
        &Plan {
            ep_overlap: true,
            recompute: Recompute::Full,
            ..base
        },
    )
    .unwrap();
    assert!(full
        .evaluation
        .reasons
        .iter()
        .any(|r| r.rule == "stack_recompute"));
}

#[test]
fn torchtitan_gathers_kv_at_once_instead_of_the_ring() {
    let model = presets::model("llama3-8b").unwrap();
    let ring = problem(model.clone(), "h100-sxm", 16, 16, 16384);
    let mut workload = Workload::new(16, 16384);
    workload.stack = "torchtitan".into();
    let gathered = Problem::new(model, cluster("h100-sxm", 16), workload).unwrap();
    let plan = plan("dp=1,tp=1,pp=1,cp=16,zero=2");
    let (r, g) = (
        explain(&ring, &plan).unwrap(),
        explain(&gathered, &plan).unwrap(),
    );
    let cp = axis(&g, "cp");
    let ops: Vec<&str> = cp.collectives.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(ops, vec!["all-gather", "all-gather", "reduce-scatter"]);
    assert!(cp.notes.iter().any(|n| n.contains("all-gather")));
    assert!(axis(&r, "cp")
        .collectives
        .iter()
        .all(|c| c.op == "send-recv"));
    // Only the first block of attention hides the gather: what is exposed is the collectives
    // less at most one attention block per pass, never more than they cost.
    let raw: f64 = cp.collectives.iter().map(|c| c.seconds_per_step).sum();
    assert!(g.evaluation.time_s.cp > 0.0 && g.evaluation.time_s.cp <= raw * (1.0 + 1e-12));
    assert!(g.evaluation.time_s.cp != r.evaluation.time_s.cp);
}

#[test]
fn ulysses_all_to_alls_q_k_v_and_the_output_each_pass_all_exposed() {
    // Llama-3-8B (32 heads, 8 K/V groups, d = 128) at s = 16384 with cp = 8 in one HGX node:
    // each rank holds 2048 tokens, so Q and the output are 2048·32·128·2 = 16,777,216 B and K
    // and V 2048·8·128·2 = 4,194,304 B per layer and micro-batch.
    let model = presets::model("llama3-8b").unwrap();
    let p = problem(model, "h100-sxm", 8, 8, 16384);
    let e = explain(&p, &plan("dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=a2a")).unwrap();
    assert!(e.evaluation.feasible, "{:?}", e.evaluation.reasons);
    let cp = axis(&e, "cp");
    let ops: Vec<&str> = cp.collectives.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(ops, vec!["all-to-all"; 8]);
    let bytes: Vec<f64> = cp.collectives.iter().map(|c| c.message_bytes).collect();
    let (q, kv) = (16_777_216.0, 4_194_304.0);
    assert_eq!(bytes, vec![q, kv, kv, q, q, q, kv, kv]);
    // 8 micro-batches × 32 layers of each.
    assert!(cp.collectives.iter().all(|c| c.count_per_step == 8 * 32));
    // Attention waits for them: the whole exchange is exposed.
    let raw: f64 = cp.collectives.iter().map(|c| c.seconds_per_step).sum();
    let t = e.evaluation.time_s.cp;
    assert!((t - raw).abs() <= 1e-9 * raw, "{t} vs {raw}");
    assert!(cp.notes.iter().any(|n| n.contains("a2a")));
}

#[test]
fn ulysses_needs_heads_and_kv_groups_divisible_by_tp_times_cp() {
    // 8 K/V groups: tp·cp = 16 cannot split them.
    let model = presets::model("llama3-8b").unwrap();
    let p = problem(model, "h100-sxm", 16, 16, 32768);
    let e =
        crate::evaluate::evaluate(&p, &plan("dp=1,tp=2,pp=1,cp=8,zero=1,cp_exchange=a2a")).unwrap();
    assert!(!e.feasible);
    assert!(e
        .reasons
        .iter()
        .any(|r| r.rule == "stack_parallelism" && r.message.contains("tp·cp = 16")));
    // The ring has no such constraint, and a stack without a2a refuses it.
    let ring = crate::evaluate::evaluate(&p, &plan("dp=1,tp=2,pp=1,cp=8,zero=1,cp_exchange=ring"))
        .unwrap();
    assert!(!ring.reasons.iter().any(|r| r.rule == "stack_parallelism"));
    let mut w = Workload::new(16, 32768);
    w.stack = "torchtitan".into();
    let tt = Problem::new(
        presets::model("llama3-8b").unwrap(),
        cluster("h100-sxm", 16),
        w,
    )
    .unwrap();
    let e = crate::evaluate::evaluate(&tt, &plan("dp=2,tp=1,pp=1,cp=8,zero=1,cp_exchange=a2a"))
        .unwrap();
    assert!(e
        .reasons
        .iter()
        .any(|r| r.message.contains("has no a2a context-parallel exchange")));
}

#[test]
fn hierarchical_cp_all_to_alls_inside_the_node_and_rings_across() {
    // cp = 16 over two 8-GPU nodes: a2a over the 8 ranks of a node (32 heads and 8 K/V groups
    // divide by 8), then a ring of 2 over the nodes passing the 8× longer, 8× narrower K/V
    // block: 16384 tokens × 1 K/V head × 128 × 2 (K and V) × 2 B = 8,388,608 B, the bytes of the
    // plain ring's 2048 tokens × 8 heads.
    let model = presets::model("llama3-8b").unwrap();
    let p = problem(model, "h100-sxm", 16, 16, 32768);
    let e = explain(&p, &plan("dp=1,tp=1,pp=1,cp=16,zero=1,cp_exchange=a2a+p2p")).unwrap();
    assert!(e.evaluation.feasible, "{:?}", e.evaluation.reasons);
    let cp = axis(&e, "cp");
    let a2a: Vec<_> = cp
        .collectives
        .iter()
        .filter(|c| c.op == "all-to-all")
        .collect();
    assert_eq!(a2a.len(), 8);
    assert_eq!(a2a[0].message_bytes, 2048.0 * 32.0 * 128.0 * 2.0);
    let ring: Vec<_> = cp
        .collectives
        .iter()
        .filter(|c| c.op == "send-recv")
        .collect();
    assert_eq!(ring.len(), 2);
    assert_eq!(ring[0].message_bytes, 2048.0 * 2.0 * 8.0 * 128.0 * 2.0);
    // One ring step per layer and micro-batch forward, two backward.
    assert_eq!(ring[0].count_per_step, 16 * 32);
    assert_eq!(ring[1].count_per_step, 2 * 16 * 32);
    assert!(cp
        .notes
        .iter()
        .any(|n| n.contains("--hierarchical-context-parallel-sizes 8 2")));
}

#[test]
fn naming_the_default_cp_exchange_changes_no_number() {
    let model = presets::model("llama3-8b").unwrap();
    let p = problem(model, "h100-sxm", 16, 16, 65536);
    let a = crate::evaluate::evaluate(&p, &plan("dp=1,tp=1,pp=1,cp=16,zero=1")).unwrap();
    let b = crate::evaluate::evaluate(&p, &plan("dp=1,tp=1,pp=1,cp=16,zero=1,cp_exchange=ring"))
        .unwrap();
    assert_eq!(a.time_s.cp.to_bits(), b.time_s.cp.to_bits());
    assert_eq!(a.step_time_s.to_bits(), b.step_time_s.to_bits());
    assert_eq!(a.peak_memory_gib.to_bits(), b.peak_memory_gib.to_bits());
}

#[test]
fn ulysses_keeps_attention_output_twice_unless_recomputed() {
    // TransformerEngine's a2a saves the head-sharded attention output for its backward and the
    // output projection the sequence-sharded one: per attention layer 2048 tokens × 32 heads ×
    // 128 × 2 B more, × 32 layers = 536,870,912 B = 0.5 GiB for the one micro-batch in flight.
    let model = presets::model("llama3-8b").unwrap();
    let p = problem(model, "h100-sxm", 8, 8, 16384);
    let eval = |text: &str| crate::evaluate::evaluate(&p, &plan(text)).unwrap();
    let ring = eval("dp=1,tp=1,pp=1,cp=8,zero=1,recompute=none");
    let a2a = eval("dp=1,tp=1,pp=1,cp=8,zero=1,recompute=none,cp_exchange=a2a");
    let extra = a2a.memory_gib.activations - ring.memory_gib.activations;
    assert!((extra - 0.5).abs() < 1e-9, "{extra}");
    // Core attention recomputed: neither output is kept by attention.
    let ring = eval("dp=1,tp=1,pp=1,cp=8,zero=1,recompute=selective");
    let a2a = eval("dp=1,tp=1,pp=1,cp=8,zero=1,recompute=selective,cp_exchange=a2a");
    assert_eq!(ring.memory_gib.activations, a2a.memory_gib.activations);
}

#[test]
fn explain_names_each_recompute_module_with_what_it_saves_and_replays() {
    let mut p = problem(
        presets::model("qwen3-30b-a3b").unwrap(),
        "h100-sxm",
        8,
        64,
        4096,
    );
    // The MoE block graphed: the host-issue floor (§5.5) would hide the replays' seconds.
    p.workload.cuda_graphs = crate::workload::CudaGraphs::Full;
    let none = explain(&p, &plan("dp=1,tp=1,pp=1,ep=8,recompute=selective")).unwrap();
    assert!(none.recompute_modules.is_empty());
    assert!(!serde_json::to_string(&none)
        .unwrap()
        .contains("recompute_modules\":["));
    let x = explain(
        &p,
        &plan("dp=1,tp=1,pp=1,ep=8,recompute=selective,recompute_modules=layernorm+moe"),
    )
    .unwrap();
    let names: Vec<&str> = x
        .recompute_modules
        .iter()
        .map(|m| m.module.as_str())
        .collect();
    assert_eq!(names, ["layernorm", "moe"]);
    for m in &x.recompute_modules {
        // Every one of the 48 MoE layers, something saved and something replayed.
        assert_eq!(m.layers, 48, "{m:?}");
        assert!(
            m.saved_gib_per_micro_batch > 0.0 && m.backward_s_per_micro_batch > 0.0,
            "{m:?}"
        );
    }
    // The MoE block dwarfs its norm, and its replay holds the EP exchange again.
    assert!(
        x.recompute_modules[1].saved_gib_per_micro_batch
            > 10.0 * x.recompute_modules[0].saved_gib_per_micro_batch
    );
    // What the modules save is what the memory model stores less of (per micro-batch, rank 0).
    let sel = &none.evaluation;
    assert!(x.evaluation.memory_gib.activations < sel.memory_gib.activations);
    // What they replay is the backward's growth over no recompute (core attention is not
    // among them): the worst rank's backward per micro-batch.
    let plain = explain(&p, &plan("dp=1,tp=1,pp=1,ep=8,recompute=none")).unwrap();
    let grew = x.pipeline.stages[0].bwd_s - plain.pipeline.stages[0].bwd_s;
    let sum: f64 = x
        .recompute_modules
        .iter()
        .map(|m| m.backward_s_per_micro_batch)
        .sum();
    assert!((grew / sum - 1.0).abs() < 1e-9, "{grew} vs {sum}");
}

#[test]
fn explain_shows_the_host_wait_of_host_bound_moe_layers() {
    // Qwen3-30B-A3B on 8 H100 at EP 8, micro-batch 1, eager: each MoE layer's GPU work is
    // shorter than the host's issue of it (§5.5); the EP axis says what the GPU waits.
    let mut p = problem(
        presets::model("qwen3-30b-a3b").unwrap(),
        "h100-sxm",
        8,
        64,
        4096,
    );
    let pl = plan("dp=1,tp=1,pp=1,ep=8");
    let x = explain(&p, &pl).unwrap();
    let note = axis(&x, "ep")
        .notes
        .iter()
        .find(|n| n.starts_with("host-bound MoE layers"))
        .expect("a host-bound note");
    assert!(note.contains("9.0 ms forward + backward"), "{note}");
    // Graphs over the MoE block: no wait, no note, and a shorter step.
    p.workload.cuda_graphs = crate::workload::CudaGraphs::Full;
    let g = explain(&p, &pl).unwrap();
    assert!(!axis(&g, "ep")
        .notes
        .iter()
        .any(|n| n.starts_with("host-bound")));
    let (tg, tx) = (g.evaluation.step_time_s, x.evaluation.step_time_s);
    assert!(tg < tx, "{tg} vs {tx}");
}

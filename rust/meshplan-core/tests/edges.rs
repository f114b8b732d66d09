//! Every integer field of every entry point at the edge values of its type (issue 9): 0, 1,
//! 2^16, 2^31, 2^32 − 1 (and 2^64 − 1 where the type is `u64`). Each call must return — a value
//! or an error, never a panic or an abort — within a second (a debug build; searches run under
//! a 0.3 s deadline), and what it returns must be bounded by the plan's structure: explain's
//! rank lists are capped whatever the degrees.

use std::time::{Duration, Instant};

use meshplan_core::hf::model_from_hf_config;
use meshplan_core::limits::{MAX_GPUS, MAX_LISTED_RANKS, MAX_LISTED_STAGES};
use meshplan_core::*;

/// The edge values of a `u32` field.
const U32_EDGES: [u32; 5] = [0, 1, 1 << 16, 1 << 31, u32::MAX];
/// The edge values of a `u64` field.
const U64_EDGES: [u64; 7] = [0, 1, 1 << 16, 1 << 31, u32::MAX as u64, 1 << 32, u64::MAX];

/// Each call's time budget (a debug build on a shared 2-core machine).
const BUDGET: Duration = Duration::from_secs(1);

fn timed<T>(what: &str, call: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = call();
    let took = started.elapsed();
    assert!(took < BUDGET, "{what}: {took:?}");
    out
}

/// Searches stop at this deadline (the default space of a large cluster is minutes of work).
fn control() -> Control {
    Control {
        deadline: Some(Instant::now() + Duration::from_millis(300)),
        threads: Some(2),
        ..Control::default()
    }
}

fn base_problem(n: u32) -> (Model, Cluster, Workload) {
    (
        presets::model("deepseek-v3").unwrap(),
        Cluster {
            gpu: presets::gpu("h100-sxm").unwrap(),
            num_gpus: n,
            gpus_per_node: None,
            nvlink_domain: None,
        },
        Workload::new(64, 4096),
    )
}

fn base_plan(n: u32) -> Plan {
    Plan {
        dp: n,
        zero: 1,
        recompute: Recompute::Selective,
        ..Plan::default()
    }
}

/// Evaluates, explains and searches `problem` with `plan`, each bounded in time and output.
fn drive(what: &str, problem: &Problem, plan: &Plan) {
    let e = timed(&format!("{what}: evaluate"), || evaluate(problem, plan));
    let x = timed(&format!("{what}: explain"), || explain(problem, plan));
    assert_eq!(e.is_ok(), x.is_ok(), "{what}");
    if let Ok(x) = x {
        for g in &x.mesh.groups {
            assert!(g.example_ranks.len() <= MAX_LISTED_RANKS.min(g.size as usize));
        }
        assert!(x.pipeline.stages.len() <= MAX_LISTED_STAGES.min(plan.pp as usize));
        for a in &x.axes {
            assert!(
                a.state_sharded.len() < 4096,
                "{what}: {}",
                a.state_sharded.len()
            );
        }
    }
    let space = SearchSpace {
        dp: Degree {
            fixed: Some(plan.dp),
            ..Degree::default()
        },
        pp: Degree {
            fixed: Some(plan.pp),
            ..Degree::default()
        },
        ..SearchSpace::default()
    };
    let _ = timed(&format!("{what}: search"), || {
        search(problem, &space, &control())
    });
}

#[test]
fn problem_fields_at_the_edges() {
    type Set = fn(&mut Model, &mut Cluster, &mut Workload, u32);
    let fields: Vec<(&str, Set)> = vec![
        ("model.layers", |m, _, _, v| m.layers = v),
        ("model.hidden", |m, _, _, v| m.hidden = v),
        ("model.heads", |m, _, _, v| m.heads = v),
        ("model.kv_heads", |m, _, _, v| m.kv_heads = v),
        ("model.head_dim", |m, _, _, v| m.head_dim = Some(v)),
        ("model.ffn_hidden", |m, _, _, v| m.ffn_hidden = v),
        ("model.vocab", |m, _, _, v| m.vocab = v),
        ("model.moe.num_experts", |m, _, _, v| {
            m.moe.as_mut().unwrap().num_experts = v
        }),
        ("model.moe.top_k", |m, _, _, v| {
            m.moe.as_mut().unwrap().top_k = v
        }),
        ("model.moe.expert_ffn_hidden", |m, _, _, v| {
            m.moe.as_mut().unwrap().expert_ffn_hidden = v
        }),
        ("model.moe.shared_experts", |m, _, _, v| {
            m.moe.as_mut().unwrap().shared_experts = v
        }),
        ("model.moe.shared_expert_ffn_hidden", |m, _, _, v| {
            m.moe.as_mut().unwrap().shared_expert_ffn_hidden = Some(v)
        }),
        ("model.moe.first_dense_layers", |m, _, _, v| {
            m.moe.as_mut().unwrap().first_dense_layers = v
        }),
        ("model.mla.q_lora_rank", |m, _, _, v| {
            m.mla.as_mut().unwrap().q_lora_rank = Some(v)
        }),
        ("model.mla.kv_lora_rank", |m, _, _, v| {
            m.mla.as_mut().unwrap().kv_lora_rank = v
        }),
        ("model.mla.qk_rope_head_dim", |m, _, _, v| {
            m.mla.as_mut().unwrap().qk_rope_head_dim = v
        }),
        ("model.mla.qk_nope_head_dim", |m, _, _, v| {
            m.mla.as_mut().unwrap().qk_nope_head_dim = v
        }),
        ("model.mla.v_head_dim", |m, _, _, v| {
            m.mla.as_mut().unwrap().v_head_dim = v
        }),
        ("cluster.num_gpus", |_, c, _, v| c.num_gpus = v),
        ("cluster.gpus_per_node", |_, c, _, v| {
            c.gpus_per_node = Some(v)
        }),
        ("cluster.nvlink_domain", |_, c, _, v| {
            c.nvlink_domain = Some(v)
        }),
        ("gpu.sm_count", |_, c, _, v| c.gpu.sm_count = v),
        ("gpu.scaleup_domain", |_, c, _, v| c.gpu.scaleup_domain = v),
        ("gpu.gpus_per_node", |_, c, _, v| c.gpu.gpus_per_node = v),
        ("workload.global_batch", |_, _, w, v| w.global_batch = v),
        ("workload.seq_len", |_, _, w, v| w.seq_len = v),
        ("workload.grad_bytes", |_, _, w, v| w.grad_bytes = v),
        ("workload.lora_rank", |_, _, w, v| {
            w.lora = true;
            w.lora_rank = v
        }),
    ];
    for (field, set) in fields {
        for v in U32_EDGES {
            let (mut m, mut c, mut w) = base_problem(8);
            set(&mut m, &mut c, &mut w, v);
            let what = format!("{field} = {v}");
            let problem = timed(&what, || Problem::new(m.clone(), c.clone(), w.clone()));
            match problem {
                Ok(problem) => {
                    // The plan that fits whatever the GPU count became.
                    drive(&what, &problem, &base_plan(problem.cluster.num_gpus));
                    let d = timed(&what, || decode_traffic(&problem.model, &c, 8, 50.0));
                    assert!(d.is_ok(), "{what}");
                }
                Err(e) => {
                    let text = e.to_string();
                    assert!(!text.contains('\n') && text.len() < 400, "{what}: {text}");
                    // A value outside its limits is named with its range.
                    if let Some(limit) = limits::of(field) {
                        if !limit.contains(v as u64) {
                            assert_eq!(
                                text,
                                format!("invalid {field}: {v} (allowed: {})", limit.allowed()),
                            );
                        }
                    }
                    let _ = timed(&what, || decode_traffic(&m, &c, 8, 50.0));
                }
            }
        }
    }
}

#[test]
fn plan_fields_at_the_edges() {
    let (m, c, w) = base_problem(MAX_GPUS);
    let largest = Problem::new(m, c, w).unwrap();
    let (m, c, w) = base_problem(8);
    let small = Problem::new(m, c, w).unwrap();
    type Set = fn(&mut Plan, u32);
    let degrees: [(&str, Set); 5] = [
        ("plan.dp", |p, v| p.dp = v),
        ("plan.tp", |p, v| p.tp = v),
        ("plan.pp", |p, v| p.pp = v),
        ("plan.ep", |p, v| p.ep = v),
        ("plan.cp", |p, v| p.cp = v),
    ];
    for (field, set) in degrees {
        for v in U32_EDGES {
            // The degree alone (dp = 1), and with dp filling the largest cluster.
            let mut alone = base_plan(1);
            set(&mut alone, v);
            drive(&format!("{field} = {v} alone"), &largest, &alone);
            let mut filled = base_plan(if v > 0 && MAX_GPUS % v == 0 {
                MAX_GPUS / v
            } else {
                1
            });
            set(&mut filled, v);
            if field == "plan.dp" {
                filled.dp = v;
            }
            drive(&format!("{field} = {v} on {MAX_GPUS}"), &largest, &filled);
        }
    }
    let knobs: [(&str, Set); 3] = [
        ("plan.vpp", |p, v| {
            p.vpp = v;
            p.pp = 8;
            p.dp = 1;
        }),
        ("plan.micro_batch", |p, v| p.micro_batch = v),
        ("plan.zero", |p, v| p.zero = v.min(255) as u8),
    ];
    for (field, set) in knobs {
        for v in U32_EDGES.into_iter().chain([3, 4, 255]) {
            let mut plan = base_plan(8);
            set(&mut plan, v);
            drive(&format!("{field} = {v}"), &small, &plan);
        }
    }
}

#[test]
fn reproducers_of_issue_9_answer_at_once() {
    // 1: pp = 2^31 asked for a 34 GB vector; 3: pp = 2^26 took 35 s and 5.7 GB.
    for pp in [1u32 << 31, 1 << 26, MAX_GPUS] {
        let (m, c, w) = base_problem(pp);
        let plan = Plan {
            dp: 1,
            pp,
            ..base_plan(1)
        };
        match Problem::new(m, c, w) {
            Ok(p) => {
                let e = timed("pp at the limit", || evaluate(&p, &plan)).unwrap();
                assert!(!e.feasible);
                drive("pp at the limit", &p, &plan);
            }
            Err(e) => assert!(e.to_string().contains("cluster.num_gpus"), "{e}"),
        }
    }
    // 4: dp = global_batch = 2^20 listed every rank of the data-parallel group.
    let (m, c, mut w) = base_problem(MAX_GPUS);
    w.global_batch = MAX_GPUS;
    let p = Problem::new(m, c, w).unwrap();
    let x = timed("explain dp = 2^20", || explain(&p, &base_plan(MAX_GPUS))).unwrap();
    let dp = x.mesh.groups.iter().find(|g| g.axis == "dp").unwrap();
    assert_eq!(dp.size, MAX_GPUS);
    assert_eq!(
        dp.example_ranks,
        (0..MAX_LISTED_RANKS as u32).collect::<Vec<_>>()
    );
    // 5: 2·cp wrapped to 0 in u32 (a division by zero) for cp = 2^31; within the limits the
    // largest cp is evaluated as the rule says.
    let (m, c, w) = base_problem(MAX_GPUS);
    let p = Problem::new(m, c, w).unwrap();
    let plan = Plan {
        dp: 1,
        cp: MAX_GPUS,
        ..base_plan(1)
    };
    let e = evaluate(&p, &plan).unwrap();
    assert!(e.reasons.iter().any(|r| r.rule == "cp_seq_len"));
    let bad = Plan {
        cp: 1 << 31,
        ..plan
    };
    assert_eq!(
        evaluate(&p, &bad).unwrap_err().to_string(),
        "invalid plan.cp: 2147483648 (allowed: 1..=1048576)"
    );
}

#[test]
fn space_and_control_fields_at_the_edges() {
    let (m, c, w) = base_problem(64);
    let p = Problem::new(m, c, w).unwrap();
    type Set = fn(&mut SearchSpace, u32);
    let mut fields: Vec<(String, Set)> = Vec::new();
    macro_rules! degree {
        ($axis:ident) => {
            fields.push((format!("space.{}.fixed", stringify!($axis)), |s, v| {
                s.$axis.fixed = Some(v)
            }));
            fields.push((format!("space.{}.min", stringify!($axis)), |s, v| {
                s.$axis.min = Some(v)
            }));
            fields.push((format!("space.{}.max", stringify!($axis)), |s, v| {
                s.$axis.max = Some(v)
            }));
        };
    }
    degree!(dp);
    degree!(tp);
    degree!(pp);
    degree!(ep);
    degree!(cp);
    degree!(vpp);
    degree!(micro_batch);
    fields.push(("space.top_k".into(), |s, v| s.top_k = v));
    fields.push(("space.zero".into(), |s, v| s.zero = vec![v.min(255) as u8]));
    for (field, set) in &fields {
        for v in U32_EDGES {
            let mut space = SearchSpace::default();
            set(&mut space, v);
            let what = format!("{field} = {v}");
            let r = timed(&what, || search(&p, &space, &control()));
            if let Err(Error::InvalidField { field: f, .. }) = &r {
                assert_eq!(f, field, "{what}");
            }
            let _ = timed(&what, || feasible_space(&p, &space, &control(), 1000));
            let queries: [Query; 1] = [(p.clone(), space.clone())];
            let _ = timed(&what, || search_many(&queries, &control(), None));
        }
    }
    for v in U64_EDGES {
        let what = format!("max_candidates = {v}");
        let space = SearchSpace {
            max_candidates: Some(v),
            ..SearchSpace::default()
        };
        let _ = timed(&what, || search(&p, &space, &control()));
        let what = format!("max_plans = {v}");
        let r = timed(&what, || {
            feasible_space(&p, &SearchSpace::default(), &control(), v)
        });
        if v == 0 || v > limits::MAX_PLANS {
            assert!(matches!(r, Err(Error::InvalidField { .. })), "{what}");
        }
        let what = format!("threads = {v}");
        let threads = Control {
            threads: Some(v as usize),
            ..control()
        };
        let r = timed(&what, || search(&p, &SearchSpace::default(), &threads));
        if v == 0 || v > limits::MAX_THREADS {
            assert!(matches!(r, Err(Error::InvalidField { .. })), "{what}");
        }
    }
}

#[test]
fn decode_traffic_tp_at_the_edges() {
    let (m, c, _) = base_problem(8);
    for v in U32_EDGES {
        let r = timed("decode", || decode_traffic(&m, &c, v, 50.0));
        assert_eq!(r.is_ok(), limits::DEGREE.contains(v as u64), "tp = {v}");
    }
}

#[test]
fn hf_config_integers_at_the_edges() {
    let llama = r#"{"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256}"#;
    let deepseek = r#"{"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
        "num_attention_heads": 128, "intermediate_size": 18432, "vocab_size": 129280,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128}"#;
    let qwen = r#"{"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "vocab_size": 151936, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1}"#;
    for text in [llama, deepseek, qwen] {
        let base: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(model_from_hf_config(text, None).is_ok());
        let keys: Vec<String> = base
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.is_u64())
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys.iter().chain(&["head_dim".to_string()]) {
            for v in U64_EDGES {
                let mut doc = base.clone();
                doc[key.as_str()] = v.into();
                let json = doc.to_string();
                let what = format!("{key} = {v}");
                if let Ok(model) = timed(&what, || model_from_hf_config(&json, None)) {
                    // An imported model is a valid one: it plans like any other.
                    let c = base_problem(8).1;
                    let p = Problem::new(model, c, Workload::new(64, 4096)).unwrap();
                    drive(&what, &p, &base_plan(8));
                }
            }
        }
    }
}

#[test]
fn evaluate_and_explain_honour_the_cancel_flag_and_the_deadline() {
    let (m, c, w) = base_problem(8);
    let p = Problem::new(m, c, w).unwrap();
    let plan = base_plan(8);
    let space = SearchSpace::default();
    let cancelled = Control {
        cancel: Some(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
            true,
        ))),
        ..Control::default()
    };
    assert_eq!(
        evaluate_with(&p, &plan, &space, &cancelled),
        Err(Error::Cancelled)
    );
    assert!(matches!(
        explain_with(&p, &plan, &cancelled),
        Err(Error::Cancelled)
    ));
    let past = Control {
        deadline: Some(Instant::now()),
        ..Control::default()
    };
    assert!(matches!(
        evaluate_with(&p, &plan, &space, &past),
        Err(Error::DeadlineExceeded { .. })
    ));
    assert!(matches!(
        explain_with(&p, &plan, &past),
        Err(Error::DeadlineExceeded { .. })
    ));
    // Without a flag or a deadline, the same numbers as the plain calls.
    let open = Control::default();
    assert_eq!(
        evaluate_with(&p, &plan, &space, &open).unwrap(),
        evaluate(&p, &plan).unwrap()
    );
    assert_eq!(
        explain_with(&p, &plan, &open).unwrap(),
        explain(&p, &plan).unwrap()
    );
}

#[test]
fn a_long_layer_list_in_a_config_is_read_in_bounded_time() {
    // 65,536 layers, every one in mlp_only_layers: a linear lookup per layer was 4·10^9
    // comparisons.
    let list: Vec<u32> = (0..65_536u32).map(|i| (i * 7) % 65_536).collect();
    let doc = serde_json::json!({
        "model_type": "qwen3_moe", "num_hidden_layers": 65_536, "hidden_size": 2048,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "vocab_size": 151_936, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "mlp_only_layers": list,
    });
    let text = doc.to_string();
    let r = timed("mlp_only_layers", || model_from_hf_config(&text, None));
    // Every layer is listed: a dense model.
    assert!(r.unwrap().moe.is_none());
}

#[test]
fn knob_lists_that_repeat_a_value_try_it_once() {
    // A client may send any number of entries in a space's knob lists; repeats must neither
    // multiply the plans tried nor the memory of the tuple lists.
    let (m, c, w) = base_problem(64);
    let p = Problem::new(m, c, w).unwrap();
    let once = SearchSpace {
        dispatchers: vec![Dispatcher::Flex],
        ep_overlap: vec![false],
        cp_exchanges: vec![CpExchange::Ring],
        ..SearchSpace::default()
    };
    let many = SearchSpace {
        dispatchers: vec![Dispatcher::Flex; 100_000],
        ep_overlap: vec![false; 100_000],
        cp_exchanges: vec![CpExchange::Ring; 100_000],
        ..SearchSpace::default()
    };
    let a = timed("one entry each", || search(&p, &once, &control())).unwrap();
    let b = timed("100,000 entries each", || search(&p, &many, &control())).unwrap();
    assert_eq!(a.stats.candidates, b.stats.candidates);
}

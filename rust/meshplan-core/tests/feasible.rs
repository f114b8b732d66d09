//! The whole feasible space and the batch search against the one-plan path: every row of
//! `feasible_space` equals `evaluate_in` of its plan in every number (bit for bit), the rows are
//! exactly the feasible plans of a brute-force enumeration, ranked as the search ranks, the cap
//! is enforced, and `search_many` returns what one `search` per query returns, in order, with
//! a failing query's error in its place.

use meshplan_core::*;

mod common;
use common::*;

fn upto(max: u32) -> Degree {
    Degree {
        fixed: None,
        min: None,
        max: Some(max),
    }
}

fn small_space() -> SearchSpace {
    SearchSpace {
        micro_batch: upto(4),
        vpp: upto(3),
        top_k: 25,
        ..SearchSpace::default()
    }
}

fn u32s(fs: &FeasibleSpace, name: &str) -> Vec<u32> {
    match fs.column(name) {
        Some(Column::U32(v)) => v.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

fn u8s(fs: &FeasibleSpace, name: &str) -> Vec<u8> {
    match fs.column(name) {
        Some(Column::U8(v)) => v.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

fn f64s(fs: &FeasibleSpace, name: &str) -> Vec<f64> {
    match fs.column(name) {
        Some(Column::F64(v)) => v.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

fn bools(fs: &FeasibleSpace, name: &str) -> Vec<bool> {
    match fs.column(name) {
        Some(Column::Bool(v)) => v.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

fn labels(fs: &FeasibleSpace, name: &str) -> Vec<String> {
    fs.categories
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, l)| l.clone())
        .unwrap()
}

/// Row `i` as a plan (decoding the categorical columns through their labels).
fn plan_of(fs: &FeasibleSpace, i: usize) -> Plan {
    let rec = &labels(fs, "recompute")[u8s(fs, "recompute")[i] as usize];
    let sched = &labels(fs, "schedule")[u8s(fs, "schedule")[i] as usize];
    let order = &labels(fs, "order")[u8s(fs, "order")[i] as usize];
    Plan {
        dp: u32s(fs, "dp")[i],
        tp: u32s(fs, "tp")[i],
        pp: u32s(fs, "pp")[i],
        ep: u32s(fs, "ep")[i],
        cp: u32s(fs, "cp")[i],
        vpp: u32s(fs, "vpp")[i],
        micro_batch: u32s(fs, "micro_batch")[i],
        zero: u8s(fs, "zero")[i],
        recompute: serde_json::from_value(serde_json::json!(rec)).unwrap(),
        sequence_parallel: bools(fs, "sequence_parallel")[i],
        schedule: Some(serde_json::from_value(serde_json::json!(sched)).unwrap()),
        order: RankOrder::parse(order).unwrap(),
        // 0: unfolded.
        etp: Some(u32s(fs, "etp")[i]).filter(|&e| e > 0),
        dispatcher: match labels(fs, "dispatcher")[u8s(fs, "dispatcher")[i] as usize].as_str() {
            "none" => None,
            d => Some(serde_json::from_value(serde_json::json!(d)).unwrap()),
        },
        ep_overlap: bools(fs, "ep_overlap")[i],
        cp_exchange: match labels(fs, "cp_exchange")[u8s(fs, "cp_exchange")[i] as usize].as_str() {
            "default" => None,
            x => Some(serde_json::from_value(serde_json::json!(x)).unwrap()),
        },
        recompute_modules: match labels(fs, "recompute_modules")
            [u8s(fs, "recompute_modules")[i] as usize]
            .as_str()
        {
            "default" => None,
            m => Some(serde_json::from_value(serde_json::json!(m)).unwrap()),
        },
        // The search never fixes the end ranks' layers nor offloads.
        ..Plan::default()
    }
}

/// Every number of row `i` equals the evaluation `e`, bit for bit.
fn assert_row_is(fs: &FeasibleSpace, i: usize, e: &Evaluation) {
    let same = |name: &str, want: f64| {
        let got = f64s(fs, name)[i];
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "row {i} {name}: {got} vs {want}"
        );
    };
    same("step_time_s", e.step_time_s);
    same("tokens_per_s_per_gpu", e.tokens_per_s_per_gpu);
    same("mfu", e.mfu);
    same("model_tflops_per_gpu", e.model_tflops_per_gpu);
    same("hardware_tflops_per_gpu", e.hardware_tflops_per_gpu);
    same("peak_memory_gib", e.peak_memory_gib);
    let m = &e.memory_gib;
    same("memory_gib.weights", m.weights);
    same("memory_gib.gradients", m.gradients);
    same("memory_gib.optimizer", m.optimizer);
    same("memory_gib.activations", m.activations);
    same("memory_gib.transient", m.transient);
    same("memory_gib.fixed", m.fixed);
    let t = &e.time_s;
    same("time_s.compute", t.compute);
    same("time_s.tp", t.tp);
    same("time_s.cp", t.cp);
    same("time_s.ep", t.ep);
    same("time_s.pp_p2p", t.pp_p2p);
    same("time_s.bubble", t.bubble);
    same("time_s.dp", t.dp);
    same("time_s.optimizer", t.optimizer);
    assert_eq!(u32s(fs, "micro_batches")[i], e.micro_batches, "row {i}");
    assert_eq!(u32s(fs, "worst_stage")[i], e.worst_stage, "row {i}");
    assert_eq!(u32s(fs, "rank")[i], i as u32 + 1);
}

const CASES: [(&str, &str, u32, u32, u32); 5] = [
    ("llama3-8b", "h100-sxm", 16, 64, 4096),
    ("mixtral-8x7b", "h100-sxm", 32, 64, 4096),
    ("gpt-1.7b", "a100-sxm-40g", 16, 128, 2048),
    ("qwen3-30b-a3b", "gb200-nvl72", 16, 32, 4096),
    ("deepseek-v3", "h800-sxm", 64, 128, 4096),
];

#[test]
fn every_row_is_the_evaluation_of_a_feasible_plan_of_the_brute_force() {
    let space = small_space();
    for (model, gpu, n, gb, s) in CASES {
        let p = problem(model, gpu, n, gb, s);
        let mut feasible: Vec<Evaluation> = all_plans(&p, &space)
            .iter()
            .map(|plan| evaluate_in(&p, plan, &space).unwrap())
            .filter(|e| e.feasible)
            .collect();
        // The search's ranking: tokens/s, then the plan's fields (what the rows follow).
        feasible.sort_by(|a, b| {
            b.tokens_per_s_per_gpu
                .total_cmp(&a.tokens_per_s_per_gpu)
                .then_with(|| {
                    let key = |e: &Evaluation| {
                        let q = &e.plan;
                        (
                            (q.tp, q.etp, q.dispatcher, q.ep_overlap),
                            q.pp,
                            q.cp,
                            q.ep,
                            q.dp,
                            q.vpp,
                            q.micro_batch,
                            q.zero,
                            q.recompute,
                            q.sequence_parallel,
                            q.schedule(),
                        )
                    };
                    key(a).cmp(&key(b))
                })
        });
        let fs = feasible_space(&p, &space, &Control::default(), DEFAULT_MAX_PLANS).unwrap();
        assert_eq!(fs.len(), feasible.len(), "{model}");
        assert_eq!(fs.stats.feasible, feasible.len() as u64, "{model}");
        assert!(fs.columns.iter().all(|(_, c)| c.len() == fs.len()));
        for (i, e) in feasible.iter().enumerate() {
            assert_eq!(plan_of(&fs, i), e.plan, "{model} row {i}");
            assert_row_is(&fs, i, e);
        }
        // The search's counters and its best plans are the feasible space's.
        let r = search(&p, &space, &Control::default()).unwrap();
        assert_eq!(
            (r.stats.candidates, r.stats.feasible, &r.stats.pruned),
            (fs.stats.candidates, fs.stats.feasible, &fs.stats.pruned)
        );
        for (i, e) in r.plans.iter().enumerate() {
            assert_row_is(&fs, i, e);
        }
    }
}

#[test]
fn rows_of_every_rank_order_are_their_evaluations() {
    // All 120 orders over two 8-GPU domains, a space where the orders give distinct plans.
    let p = problem("mixtral-8x7b", "h100-sxm", 16, 32, 4096);
    let space = SearchSpace {
        orders: RankOrder::all(),
        micro_batch: upto(2),
        vpp: upto(2),
        ..SearchSpace::default()
    };
    let fs = feasible_space(&p, &space, &Control::default(), DEFAULT_MAX_PLANS).unwrap();
    assert!(
        u8s(&fs, "order").iter().any(|&o| o > 0),
        "some order beyond the default"
    );
    for i in 0..fs.len() {
        let e = evaluate_in(&p, &plan_of(&fs, i), &space).unwrap();
        assert!(e.feasible, "row {i}: {:?}", e.reasons);
        assert_row_is(&fs, i, &e);
    }
    let r = search(&p, &space, &Control::default()).unwrap();
    assert_eq!(fs.stats.feasible, r.stats.feasible);
    assert_eq!(plan_of(&fs, 0), r.plans[0].plan);
}

#[test]
fn the_cap_is_enforced() {
    let p = problem("llama3-8b", "h100-sxm", 16, 64, 4096);
    let space = small_space();
    let all = feasible_space(&p, &space, &Control::default(), DEFAULT_MAX_PLANS).unwrap();
    let n = all.len() as u64;
    assert!(n > 100);
    let exact = feasible_space(&p, &space, &Control::default(), n).unwrap();
    assert_eq!(
        exact,
        FeasibleSpace {
            stats: exact.stats.clone(),
            ..all
        }
    );
    match feasible_space(&p, &space, &Control::default(), n - 1) {
        Err(e @ Error::TooManyPlans { .. }) => {
            assert_eq!(e.kind(), "too_many_plans");
            assert!(
                e.to_string().contains(&format!("more than {}", n - 1)),
                "{e}"
            );
        }
        other => panic!("expected TooManyPlans, got {other:?}"),
    }
}

#[test]
fn search_many_is_one_search_per_query_in_order() {
    let queries: Vec<Query> = CASES
        .iter()
        .map(|&(model, gpu, n, gb, s)| (problem(model, gpu, n, gb, s), small_space()))
        .chain([(
            problem("llama3-8b", "h100-sxm", 8, 16, 2048),
            SearchSpace {
                zero: vec![],
                ..SearchSpace::default()
            },
        )])
        .collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let one = Control {
        threads: Some(1),
        ..Control::default()
    };
    let two = Control {
        threads: Some(2),
        ..Control::default()
    };
    let batch = search_many(&queries, &two, Some(&done)).unwrap();
    let serial = search_many(&queries, &one, None).unwrap();
    assert_eq!(
        done.load(std::sync::atomic::Ordering::SeqCst),
        queries.len()
    );
    assert_eq!(batch.len(), queries.len());
    for (i, ((p, space), got)) in queries.iter().zip(&batch).enumerate() {
        match (search(p, space, &one), got, &serial[i]) {
            (Ok(want), Ok(got), Ok(serial)) => {
                assert_eq!(got.plans, want.plans, "query {i}");
                assert_eq!(serial.plans, want.plans, "query {i}");
                assert_eq!(got.stats.pruned, want.stats.pruned, "query {i}");
                assert_eq!(got.stats.feasible, want.stats.feasible, "query {i}");
                assert_eq!(got.stats.threads, 2);
            }
            (Err(want), Err(got), Err(serial)) => {
                assert_eq!((got, serial), (&want, &want), "query {i}");
                assert_eq!(i, queries.len() - 1, "only the bad query fails");
                assert!(want.to_string().contains("space.zero"), "{want}");
            }
            (want, got, serial) => panic!("query {i}: {want:?} vs {got:?} / {serial:?}"),
        }
    }
}

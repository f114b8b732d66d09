//! Invariants of the search and the cost model (proptest), and an exhaustive cross-check: the
//! pruned, parallel search returns exactly what brute-force evaluation of every plan returns.

use std::collections::BTreeMap;

use meshplan_core::*;

mod common;
use common::*;
use proptest::prelude::*;

const MODELS: [&str; 4] = ["llama3-8b", "mixtral-8x7b", "gpt-1.7b", "qwen3-30b-a3b"];
const GPUS: [&str; 4] = ["h100-sxm", "a100-sxm-40g", "gb200-nvl72", "mi300x"];

fn arb_problem() -> impl Strategy<Value = Problem> {
    (
        0..MODELS.len(),
        0..GPUS.len(),
        2u32..=5,
        3u32..=7,
        prop::sample::select(vec![1024u32, 2048, 4096]),
    )
        .prop_map(|(m, g, log_n, log_b, s)| problem(MODELS[m], GPUS[g], 1 << log_n, 1 << log_b, s))
}

fn small_space() -> SearchSpace {
    SearchSpace {
        micro_batch: Degree {
            fixed: None,
            min: None,
            max: Some(4),
        },
        vpp: Degree {
            fixed: None,
            min: None,
            max: Some(3),
        },
        top_k: 25,
        // Every recompute mode, op-level selective (not searched by default) included.
        recompute: Recompute::ALL.to_vec(),
        ..SearchSpace::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn searched_plans_multiply_to_the_gpu_count(p in arb_problem()) {
        let r = search(&p, &small_space(), &Control::default()).unwrap();
        for e in &r.plans {
            prop_assert_eq!(e.plan.num_gpus(), p.cluster.num_gpus as u64);
            prop_assert!(e.feasible);
            if !p.model.is_moe() {
                prop_assert_eq!(e.plan.ep, 1);
            }
        }
        let pruned: u64 = r.stats.pruned.values().sum();
        prop_assert_eq!(r.stats.feasible + pruned, r.stats.candidates);
    }

    #[test]
    fn memory_never_decreases_as_the_micro_batch_grows(
        p in arb_problem(),
        pick in any::<prop::sample::Index>(),
        zero in 0u8..=3,
        recompute in prop::sample::select(Recompute::ALL.to_vec()),
        sp in any::<bool>(),
    ) {
        let tuples = factorisations(p.cluster.num_gpus, p.model.is_moe());
        let [dp, tp, pp, ep, cp] = tuples[pick.index(tuples.len())];
        let per_replica = p.workload.global_batch / (dp * ep).min(p.workload.global_batch);
        let mut prev = 0.0;
        for b in divisors(per_replica.max(1)) {
            let plan = Plan { dp, tp, pp, ep, cp, micro_batch: b, zero, recompute, sequence_parallel: sp, ..Plan::default() };
            let e = evaluate(&p, &plan).unwrap();
            prop_assert!(e.peak_memory_gib >= prev - 1e-9, "b = {}: {} < {}", b, e.peak_memory_gib, prev);
            prev = e.peak_memory_gib;
        }
    }

    #[test]
    fn a_higher_zero_stage_never_needs_more_state_memory(p in arb_problem(), pick in any::<prop::sample::Index>()) {
        let tuples = factorisations(p.cluster.num_gpus, p.model.is_moe());
        let [dp, tp, pp, ep, cp] = tuples[pick.index(tuples.len())];
        let mut prev = f64::INFINITY;
        for zero in 0..=3 {
            let plan = Plan { dp, tp, pp, ep, cp, zero, ..Plan::default() };
            let m = evaluate(&p, &plan).unwrap().memory_gib;
            let states = m.weights + m.gradients + m.optimizer;
            prop_assert!(states <= prev + 1e-9, "zero {}: {} > {}", zero, states, prev);
            prev = states;
        }
    }

    #[test]
    fn the_ranking_does_not_depend_on_the_thread_count(p in arb_problem()) {
        let one = search(&p, &small_space(), &Control { threads: Some(1), ..Control::default() }).unwrap();
        let two = search(&p, &small_space(), &Control { threads: Some(2), ..Control::default() }).unwrap();
        prop_assert_eq!(one.plans, two.plans);
        prop_assert_eq!(one.stats.pruned, two.stats.pruned);
        prop_assert_eq!(one.stats.feasible, two.stats.feasible);
    }
}

#[test]
fn pruned_search_equals_brute_force() {
    let space = small_space();
    // Under every training stack: its rules prune the knobs once, per tuple, and must remove
    // exactly the plans `evaluate` rejects, counted under the same first rule.
    let stacks = ["megatron-core", "torchtitan", "deepspeed", "maxtext"];
    for ((model, gpu, n, gb, s), stack) in [
        ("llama3-8b", "h100-sxm", 16, 64, 4096),
        ("mixtral-8x7b", "h100-sxm", 32, 64, 4096),
        ("gpt-1.7b", "a100-sxm-40g", 16, 128, 2048),
        ("qwen3-30b-a3b", "gb200-nvl72", 16, 32, 4096),
    ]
    .into_iter()
    .flat_map(|problem| stacks.map(|stack| (problem, stack)))
    {
        let mut p = problem(model, gpu, n, gb, s);
        p.workload.stack = stack.to_string();
        let model = format!("{model} under {stack}");
        let plans = all_plans(&p, &space);
        let mut pruned: BTreeMap<String, u64> = BTreeMap::new();
        let mut feasible = Vec::new();
        for plan in &plans {
            let e = evaluate_in(&p, plan, &space).unwrap();
            match e.reasons.first() {
                Some(v) => *pruned.entry(v.rule.clone()).or_default() += 1,
                None => feasible.push(e),
            }
        }
        feasible.sort_by(|a, b| b.tokens_per_s_per_gpu.total_cmp(&a.tokens_per_s_per_gpu));
        let r = search(&p, &space, &Control::default()).unwrap();
        assert_eq!(r.stats.candidates, plans.len() as u64, "{model}");
        assert_eq!(r.stats.feasible, feasible.len() as u64, "{model}");
        assert_eq!(r.stats.pruned, pruned, "{model}");
        let want: Vec<f64> = feasible
            .iter()
            .take(space.top_k as usize)
            .map(|e| e.tokens_per_s_per_gpu)
            .collect();
        let got: Vec<f64> = r.plans.iter().map(|e| e.tokens_per_s_per_gpu).collect();
        assert_eq!(got, want, "{model}");
        for e in &r.plans {
            let again = evaluate_in(&p, &e.plan, &space).unwrap();
            assert!(again.feasible);
            assert_eq!(again.step_time_s, e.step_time_s);
            assert_eq!(again.memory_gib, e.memory_gib);
        }
    }
}

/// The tuple-level memory bound must be a true lower bound: with about one layer per pipeline
/// rank, ZeRO-3's gathered layers (and full recompute's rebuilt layer) cost more than they save,
/// so the bound takes the least over the allowed ZeRO stages and recompute modes. Here every
/// feasible plan is a ZeRO-1/2 one that a "highest ZeRO stage" bound used to prune.
#[test]
fn memory_bound_does_not_prune_feasible_low_zero_plans() {
    let p = problem("gpt3-175b", "a100-sxm-40g", 192, 192, 2048);
    let space = SearchSpace {
        tp: Degree {
            fixed: Some(1),
            ..Degree::default()
        },
        pp: Degree {
            fixed: Some(96),
            ..Degree::default()
        },
        ..small_space()
    };
    let brute: Vec<Plan> = all_plans(&p, &space)
        .into_iter()
        .filter(|pl| pl.tp == 1 && pl.pp == 96)
        .collect();
    let feasible = brute
        .iter()
        .filter(|pl| evaluate_in(&p, pl, &space).unwrap().feasible)
        .count() as u64;
    assert!(feasible > 0);
    let r = search(&p, &space, &Control::default()).unwrap();
    assert_eq!(r.stats.feasible, feasible);
}

//! Rank orders in the search: the default `orders` (Megatron's order only) give exactly the
//! ranking and counts of a brute-force evaluation of every plan, an alternative order is only
//! enumerated where it moves some group onto another fabric, and inside one NVLink domain every
//! order is the same plan.

use std::collections::BTreeMap;

use meshplan_core::layout::Groups;
use meshplan_core::*;

mod common;
use common::*;
use proptest::prelude::*;

const MODELS: [&str; 3] = ["llama3-8b", "mixtral-8x7b", "gpt-1.7b"];
const GPUS: [&str; 3] = ["h100-sxm", "a100-sxm-40g", "gb200-nvl72"];

fn space() -> SearchSpace {
    SearchSpace {
        micro_batch: Degree {
            fixed: None,
            min: None,
            max: Some(2),
        },
        vpp: Degree {
            fixed: None,
            min: None,
            max: Some(2),
        },
        top_k: 15,
        ..SearchSpace::default()
    }
}

fn arb_problem() -> impl Strategy<Value = Problem> {
    (
        0..MODELS.len(),
        0..GPUS.len(),
        1u32..=5,
        3u32..=6,
        prop::sample::select(vec![1024u32, 4096]),
    )
        .prop_map(|(m, g, log_n, log_b, s)| problem(MODELS[m], GPUS[g], 1 << log_n, 1 << log_b, s))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// The default `orders` rank exactly as brute-force evaluation of every default-order plan.
    #[test]
    fn default_orders_rank_as_brute_force(p in arb_problem()) {
        let space = space();
        prop_assert_eq!(&space.orders, &vec![RankOrder::DEFAULT]);
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
        prop_assert_eq!(r.stats.candidates, plans.len() as u64);
        prop_assert_eq!(r.stats.feasible, feasible.len() as u64);
        prop_assert_eq!(&r.stats.pruned, &pruned);
        let want: Vec<f64> = feasible.iter().take(space.top_k as usize).map(|e| e.tokens_per_s_per_gpu).collect();
        let got: Vec<f64> = r.plans.iter().map(|e| e.tokens_per_s_per_gpu).collect();
        prop_assert_eq!(got, want);
        prop_assert!(r.plans.iter().all(|e| e.plan.order == RankOrder::DEFAULT));
    }

    /// Listing more orders never loses a plan: the best of all orders is at least the default's,
    /// every plan re-evaluates to its own numbers, and no two returned plans that differ only in
    /// their order land their groups on the same fabrics.
    #[test]
    fn all_orders_only_add_plans_that_move_a_group(p in arb_problem()) {
        let base = space();
        let all = SearchSpace { orders: RankOrder::all(), ..space() };
        let d = search(&p, &base, &Control::default()).unwrap();
        let a = search(&p, &all, &Control::default()).unwrap();
        prop_assert!(a.stats.candidates >= d.stats.candidates);
        prop_assert!(a.stats.feasible >= d.stats.feasible);
        if let (Some(x), Some(y)) = (a.plans.first(), d.plans.first()) {
            prop_assert!(x.tokens_per_s_per_gpu >= y.tokens_per_s_per_gpu);
        }
        let domain = p.cluster.nvlink_domain();
        for (i, e) in a.plans.iter().enumerate() {
            let again = evaluate_in(&p, &e.plan, &all).unwrap();
            prop_assert!(again.feasible);
            prop_assert_eq!(again.step_time_s, e.step_time_s);
            for f in &a.plans[..i] {
                let same_but_order = Plan { order: e.plan.order, ..f.plan.clone() } == e.plan;
                if same_but_order {
                    prop_assert_ne!(Groups::of(&e.plan, domain), Groups::of(&f.plan, domain));
                }
            }
        }
    }
}

#[test]
fn inside_one_nvlink_domain_every_order_is_the_same_plan() {
    // 16 GPUs of one NVL72 rack, and 8 of one HGX node: every group stays on NVLink whatever the
    // order, so the 119 alternatives are all skipped and the result is the default's.
    for p in [
        problem("mixtral-8x7b", "gb200-nvl72", 16, 64, 4096),
        problem("llama3-8b", "h100-sxm", 8, 32, 4096),
    ] {
        let all = SearchSpace {
            orders: RankOrder::all(),
            ..space()
        };
        let d = search(&p, &space(), &Control::default()).unwrap();
        let a = search(&p, &all, &Control::default()).unwrap();
        assert_eq!(a.plans, d.plans);
        assert_eq!(a.stats.candidates, d.stats.candidates);
        assert_eq!(a.stats.pruned, d.stats.pruned);
    }
}

#[test]
fn across_nodes_alternative_orders_are_enumerated_and_counted() {
    let p = problem("llama3-8b", "h100-sxm", 32, 64, 4096);
    let d = search(&p, &space(), &Control::default()).unwrap();
    let two = SearchSpace {
        orders: vec![
            RankOrder::DEFAULT,
            RankOrder::parse("dp-tp-cp-ep-pp").unwrap(),
        ],
        ..space()
    };
    let a = search(&p, &two, &Control::default()).unwrap();
    assert!(a.stats.candidates > d.stats.candidates);
    // The same order listed twice is tried once.
    let twice = SearchSpace {
        orders: vec![RankOrder::DEFAULT, RankOrder::DEFAULT],
        ..space()
    };
    let t = search(&p, &twice, &Control::default()).unwrap();
    assert_eq!(t.plans, d.plans);
    assert_eq!(t.stats.candidates, d.stats.candidates);
    // max_candidates counts the alternative orders too.
    let capped = SearchSpace {
        max_candidates: Some(d.stats.candidates),
        ..two
    };
    match search(&p, &capped, &Control::default()) {
        Err(Error::SpaceTooLarge { candidates, .. }) => assert_eq!(candidates, a.stats.candidates),
        other => panic!("expected SpaceTooLarge, got {other:?}"),
    }
}

#[test]
fn an_empty_order_list_is_rejected() {
    let p = problem("llama3-8b", "h100-sxm", 8, 32, 4096);
    let s = SearchSpace {
        orders: vec![],
        ..space()
    };
    let e = search(&p, &s, &Control::default()).unwrap_err().to_string();
    assert!(e.contains("space.orders"), "{e}");
}

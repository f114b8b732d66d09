//! Helpers shared by the integration tests: problems from presets, and every plan of a small
//! search space by brute force (what the pruned search must reproduce exactly).
#![allow(dead_code)] // each test crate uses a subset

use meshplan_core::*;

pub fn problem(model: &str, gpu: &str, n: u32, global_batch: u32, seq_len: u32) -> Problem {
    let cluster = Cluster {
        gpu: presets::gpu(gpu).unwrap(),
        num_gpus: n,
        gpus_per_node: None,
        nvlink_domain: None,
    };
    Problem::new(
        presets::model(model).unwrap(),
        cluster,
        Workload::new(global_batch, seq_len),
    )
    .unwrap()
}

pub fn divisors(n: u32) -> Vec<u32> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// Every (dp, tp, pp, ep, cp) with product n.
pub fn factorisations(n: u32, moe: bool) -> Vec<[u32; 5]> {
    let mut out = Vec::new();
    for tp in divisors(n) {
        for pp in divisors(n / tp) {
            for cp in divisors(n / tp / pp) {
                for ep in divisors(n / tp / pp / cp) {
                    if !moe && ep > 1 {
                        continue;
                    }
                    out.push([n / tp / pp / cp / ep, tp, pp, ep, cp]);
                }
            }
        }
    }
    out
}

/// Every folded MoE degree tuple of `n` GPUs for a model of `experts` experts as the default
/// space defines them: `([dp, tp, pp, ep, cp], etp)` with `dp·tp·pp·cp = n`, `etp = 1`,
/// `ep > 1` dividing `experts`, `etp·ep` dividing `dp·tp·cp` (and not `dp·tp` when `cp > 1`: EP
/// over CP ranks only where it must), and not an unfolded plan in disguise (`tp = 1` with `ep`
/// dividing `dp`).
pub fn folded_factorisations(n: u32, experts: u32) -> Vec<([u32; 5], u32)> {
    let mut out = Vec::new();
    for tp in divisors(n) {
        for pp in divisors(n / tp) {
            for cp in divisors(n / tp / pp) {
                let dp = n / tp / pp / cp;
                let stage = dp * tp * cp;
                let etp = 1;
                {
                    for ep in divisors(stage / etp) {
                        // EP over CP ranks only where TP and DP cannot hold it.
                        let by_choice = cp > 1 && (dp * tp) % (etp * ep) == 0;
                        if ep == 1 || experts % ep != 0 || (etp == tp && dp % ep == 0) || by_choice
                        {
                            continue;
                        }
                        out.push(([dp, tp, pp, ep, cp], etp));
                    }
                }
            }
        }
    }
    out
}

/// Every plan of `space` as the search defines it, by brute force.
pub fn all_plans(p: &Problem, space: &SearchSpace) -> Vec<Plan> {
    let mut out = Vec::new();
    let mut tuples: Vec<([u32; 5], Option<u32>)> =
        factorisations(p.cluster.num_gpus, p.model.is_moe())
            .into_iter()
            .map(|d| (d, None))
            .collect();
    if let (Some(moe), true) = (&p.model.moe, space.fold) {
        tuples.extend(
            folded_factorisations(p.cluster.num_gpus, moe.num_experts)
                .into_iter()
                .map(|(d, etp)| (d, Some(etp))),
        );
    }
    for ([dp, tp, pp, ep, cp], etp) in tuples {
        let mut schedules = vec![(Schedule::OneFOneB, 1)];
        if pp > 1 {
            schedules.push((Schedule::ZeroBubbleH1, 1));
            for v in 2..=space.vpp.max.unwrap() {
                schedules.push((Schedule::Interleaved, v));
            }
        }
        let replicas = match etp {
            None => dp * ep * cp,
            Some(e) => dp * cp * (dp * tp * cp / (e * ep)),
        };
        let zeros: Vec<u8> = if replicas == 1 {
            vec![0]
        } else {
            vec![0, 1, 2, 3]
        };
        let sps: Vec<bool> = if tp > 1 {
            vec![false, true]
        } else {
            vec![false]
        };
        for b in 1..=space.micro_batch.max.unwrap().min(p.workload.global_batch) {
            for &(schedule, vpp) in &schedules {
                for &zero in &zeros {
                    for &recompute in &space.recompute {
                        for &sequence_parallel in &sps {
                            out.push(Plan {
                                dp,
                                tp,
                                pp,
                                ep,
                                cp,
                                vpp,
                                micro_batch: b,
                                zero,
                                recompute,
                                sequence_parallel,
                                schedule: Some(schedule),
                                order: RankOrder::DEFAULT,
                                etp,
                                // The stack's default exchange for plans with experts spread.
                                dispatcher: (ep > 1)
                                    .then_some(p.workload.stack_profile().default_dispatcher),
                                ep_overlap: false,
                                ..Plan::default()
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

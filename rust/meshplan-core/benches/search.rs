//! Speed of the core (issue 6): criterion benches, run with `cargo bench -p meshplan-core`
//! (release, never part of the test run).
//!
//! - `evaluate`: scoring a fixed set of 1,000 plans one by one through [`evaluate_in`] (every
//!   breakdown, every reason), in evaluations per second on one core.
//! - `search/*`: full searches with every knob open (the default space) on the four reference
//!   problems, in candidates (plans of the space accounted for) per second; the thread count is
//!   `MESHPLAN_THREADS`, else every core. The problems (the sizes of `docs/performance.md`):
//!   llama3.1-405b on 16,384 h100-sxm (global batch 2,048, seq 8,192), deepseek-v3 on 2,048
//!   h800-sxm (4,096 × 4,096), llama3-70b on 1,024 h100-sxm (1,024 × 8,192), gpt3-175b on 4,096
//!   a100-sxm-80g (1,536 × 2,048).
//! - `feasible_space`: every feasible plan of the 70B problem evaluated in full, in evaluated
//!   plans per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use meshplan_core::*;

/// The reference problems: (label, model, gpu, GPUs, global batch, sequence length).
pub const PROBLEMS: [(&str, &str, &str, u32, u32, u32); 4] = [
    (
        "llama3.1-405b_16384xh100",
        "llama3.1-405b",
        "h100-sxm",
        16384,
        2048,
        8192,
    ),
    (
        "deepseek-v3_2048xh800",
        "deepseek-v3",
        "h800-sxm",
        2048,
        4096,
        4096,
    ),
    (
        "llama3-70b_1024xh100",
        "llama3-70b",
        "h100-sxm",
        1024,
        1024,
        8192,
    ),
    (
        "gpt3-175b_4096xa100-80g",
        "gpt3-175b",
        "a100-sxm-80g",
        4096,
        1536,
        2048,
    ),
];

fn problem(model: &str, gpu: &str, n: u32, global_batch: u32, seq_len: u32) -> Problem {
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

/// 1,000 plans of llama3-70b on 1,024 H100s: the best 1,000 of the default space (feasible,
/// spread over every degree and knob the ranking reaches).
fn plan_set() -> (Problem, Vec<Plan>) {
    let p = problem("llama3-70b", "h100-sxm", 1024, 1024, 8192);
    let space = SearchSpace {
        top_k: 1000,
        ..SearchSpace::default()
    };
    let plans = search(&p, &space, &Control::default())
        .unwrap()
        .plans
        .into_iter()
        .map(|e| e.plan)
        .collect();
    (p, plans)
}

fn evaluate_bench(c: &mut Criterion) {
    let (p, plans) = plan_set();
    let space = SearchSpace::default();
    let mut g = c.benchmark_group("evaluate");
    g.throughput(Throughput::Elements(plans.len() as u64));
    g.bench_function("llama3-70b_1024xh100_1000_plans", |b| {
        b.iter(|| {
            plans
                .iter()
                .map(|plan| evaluate_in(&p, plan, &space).unwrap().step_time_s)
                .sum::<f64>()
        })
    });
    g.finish();
}

fn search_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("search");
    g.sample_size(10);
    for (label, model, gpu, n, gb, s) in PROBLEMS {
        let p = problem(model, gpu, n, gb, s);
        let space = SearchSpace::default();
        let candidates = search(&p, &space, &Control::default())
            .unwrap()
            .stats
            .candidates;
        g.throughput(Throughput::Elements(candidates));
        g.bench_function(label, |b| {
            b.iter(|| search(&p, &space, &Control::default()).unwrap())
        });
    }
    g.finish();
}

/// Every feasible plan of the 70B problem, each evaluated in full (breakdowns, worst stage,
/// metrics: the numbers `evaluate` gives), in evaluated plans per second.
fn feasible_bench(c: &mut Criterion) {
    let (_, model, gpu, n, gb, s) = PROBLEMS[2];
    let p = problem(model, gpu, n, gb, s);
    let space = SearchSpace::default();
    let control = Control::default();
    let plans = feasible_space(&p, &space, &control, DEFAULT_MAX_PLANS)
        .unwrap()
        .len();
    let mut g = c.benchmark_group("feasible_space");
    g.sample_size(10);
    g.throughput(Throughput::Elements(plans as u64));
    g.bench_function("llama3-70b_1024xh100", |b| {
        b.iter(|| feasible_space(&p, &space, &control, DEFAULT_MAX_PLANS).unwrap())
    });
    g.finish();
}

criterion_group!(benches, evaluate_bench, search_bench, feasible_bench);
criterion_main!(benches);

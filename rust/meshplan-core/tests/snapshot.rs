//! Bit-for-bit snapshot of the search: the top 50 plans (every field of every evaluation) and the
//! counters (candidates, feasible, pruned by rule, plans faster than a reference) of a dozen
//! diverse problems and spaces, against `fixtures/snapshot.json`, written by the search as it
//! was before the performance work. Any change to a number, a reason, a counter or the ranking
//! fails here; a performance change must never touch this file.
//!
//! The comparison is on the serialised text: serde_json writes the shortest decimal that reads
//! back to the same `f64`, so equal text means equal bits.
//!
//! `MESHPLAN_UPDATE_SNAPSHOT=1 cargo test --release --test snapshot` rewrites the file (only
//! when the cost model itself changes on purpose).

use std::path::PathBuf;

use meshplan_core::*;
use serde::Serialize;

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

fn top50() -> SearchSpace {
    SearchSpace {
        top_k: 50,
        ..SearchSpace::default()
    }
}

fn upto(max: u32) -> Degree {
    Degree {
        fixed: None,
        min: None,
        max: Some(max),
    }
}

fn fixed(v: u32) -> Degree {
    Degree {
        fixed: Some(v),
        min: None,
        max: None,
    }
}

/// (name, problem, space, reference tokens/s per GPU for `search_counting_faster`).
fn cases() -> Vec<(&'static str, Problem, SearchSpace, Option<f64>)> {
    let mut out = Vec::new();
    out.push((
        "llama3-70b/1024 h100-sxm, every knob open",
        problem("llama3-70b", "h100-sxm", 1024, 1024, 8192),
        top50(),
        Some(400.0),
    ));
    out.push((
        "deepseek-v3/2048 h800-sxm, every knob open",
        problem("deepseek-v3", "h800-sxm", 2048, 4096, 4096),
        top50(),
        None,
    ));
    let mut fp8 = problem("mixtral-8x7b", "b200", 64, 256, 4096);
    fp8.workload.precision = Precision::Fp8;
    out.push((
        "mixtral-8x7b/64 b200 fp8, all 120 rank orders, pp <= 4",
        fp8,
        SearchSpace {
            orders: RankOrder::all(),
            pp: upto(4),
            ..top50()
        },
        None,
    ));
    out.push((
        "gpt3-175b/4096 a100-sxm-80g, every knob open",
        problem("gpt3-175b", "a100-sxm-80g", 4096, 1536, 2048),
        top50(),
        Some(100.0),
    ));
    out.push((
        "llama3.1-405b/16384 h100-sxm, every knob open",
        problem("llama3.1-405b", "h100-sxm", 16384, 2048, 8192),
        top50(),
        None,
    ));
    out.push((
        "qwen3-30b-a3b/16 gb200-nvl72, zero 1|3, recompute none|full, cp/ep in domain, 1f1b|zb-h1",
        problem("qwen3-30b-a3b", "gb200-nvl72", 16, 64, 4096),
        SearchSpace {
            zero: vec![3, 1],
            recompute: vec![Recompute::Full, Recompute::None],
            cp_within_domain: true,
            ep_within_domain: true,
            schedules: vec![Schedule::ZeroBubbleH1, Schedule::OneFOneB],
            ..top50()
        },
        Some(0.0),
    ));
    let mut unfused = problem("llama3-8b", "a100-sxm-40g", 8, 32, 4096);
    unfused.workload.flash_attention = false;
    out.push((
        "llama3-8b/8 a100-sxm-40g, unfused attention, recompute none|selective",
        unfused,
        SearchSpace {
            recompute: vec![Recompute::None, Recompute::Selective],
            ..top50()
        },
        None,
    ));
    let mut lora = problem("llama3-8b", "a100-sxm-40g", 8, 32, 4096);
    lora.workload.lora = true;
    lora.workload.grad_bytes = 2;
    lora.workload.optimizer = Optimizer::SgdMomentum;
    out.push((
        "llama3-8b/8 a100-sxm-40g, LoRA, sgd, 2-byte grads, micro-batch <= 8, 4 GiB headroom",
        lora,
        SearchSpace {
            micro_batch: upto(8),
            memory_headroom_gib: 4.0,
            ..top50()
        },
        None,
    ));
    out.push((
        "llama3-8b/8 a100-sxm-40g, sequence parallel on, tp 4 fixed, tp may leave the domain",
        problem("llama3-8b", "a100-sxm-40g", 8, 32, 4096),
        SearchSpace {
            tp: fixed(4),
            sequence_parallel: vec![true],
            tp_within_domain: false,
            ..top50()
        },
        None,
    ));
    out.push((
        "gpt-1.7b/24 mi300x (mesh), seq 2048, interleaved only, vpp 2..6",
        problem("gpt-1.7b", "mi300x", 24, 96, 2048),
        SearchSpace {
            schedules: vec![Schedule::Interleaved],
            vpp: Degree {
                fixed: None,
                min: Some(2),
                max: Some(6),
            },
            ..top50()
        },
        None,
    ));
    let mut nvl = problem("qwen3-235b-a22b", "gb200-nvl72", 576, 1152, 4096);
    nvl.workload.precision = Precision::Nvfp4;
    out.push((
        "qwen3-235b-a22b/576 gb200-nvl72 nvfp4, pp <= 8, orders tp-cp-ep-dp-pp|tp-ep-cp-dp-pp",
        nvl,
        SearchSpace {
            pp: upto(8),
            orders: vec![
                RankOrder::DEFAULT,
                RankOrder::parse("tp-ep-cp-dp-pp").unwrap(),
            ],
            ..top50()
        },
        Some(1000.0),
    ));
    out.push((
        "mixtral-8x22b/96 h100-sxm (not a power of two), seq 16384",
        problem("mixtral-8x22b", "h100-sxm", 96, 192, 16384),
        top50(),
        None,
    ));
    out
}

#[derive(Serialize)]
struct Case {
    name: &'static str,
    candidates: u64,
    feasible: u64,
    pruned: std::collections::BTreeMap<String, u64>,
    /// Feasible plans strictly faster than the reference (`search_counting_faster`).
    #[serde(skip_serializing_if = "Option::is_none")]
    faster: Option<(f64, u64)>,
    plans: Vec<Evaluation>,
}

fn current() -> Vec<Case> {
    cases()
        .into_iter()
        .map(|(name, problem, space, reference)| {
            let control = Control::default();
            let (result, faster) = match reference {
                Some(t) => {
                    let (r, n) = search_counting_faster(&problem, &space, &control, t).unwrap();
                    (r, Some((t, n)))
                }
                None => (search(&problem, &space, &control).unwrap(), None),
            };
            Case {
                name,
                candidates: result.stats.candidates,
                feasible: result.stats.feasible,
                pruned: result.stats.pruned,
                faster,
                plans: result.plans,
            }
        })
        .collect()
}

#[test]
fn search_results_are_unchanged_bit_for_bit() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshot.json");
    let got = serde_json::to_string_pretty(&current()).unwrap() + "\n";
    if std::env::var_os("MESHPLAN_UPDATE_SNAPSHOT").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap();
    if got != want {
        let (i, (g, w)) = got
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (g, w))| g != w)
            .unwrap_or((0, ("(length differs)", "")));
        panic!(
            "the search's results changed; first difference at line {}:\n  got:  {g}\n  want: {w}",
            i + 1
        );
    }
}

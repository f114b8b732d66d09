//! The queue model of serving under load (docs/serving.md §5.1): how long a request waits
//! before its prompt is prefilled, given the arrival process ([`super::Arrival`]).
//!
//! - **Closed loop** (a benchmark's `--max-concurrency c`, no think time): a worker runs at most
//!   `b` sequences at once; the `c − b` others wait for a slot. By Little's law on the closed
//!   system (Lazowska, Zahorjan, Graham, Sevcik, *Quantitative System Performance*, 1984,
//!   §3.2 and the asymptotic bounds of §5.2: `R = N/X − Z`, here `Z = 0`), a request's response
//!   time is `c/X` for throughput `X`; the part of it spent waiting for a slot is
//!   `(c − b)/X` ([`slot_wait`]); with separate prefill and decode pools, whatever of `c/X`
//!   a request's own prefill, transfer and decode do not take ([`closed_loop_wait`]), `X` the
//!   slower pool's rate.
//! - **Open loop** (Poisson arrivals at rate λ): the prefill of each prompt is a server of
//!   deterministic service time `S`; the mean wait in queue is the Pollaczek–Khinchine formula
//!   for M/D/1, `W = ρS / (2(1 − ρ))`, `ρ = λS` (Kleinrock, *Queueing Systems* vol. 1, 1975,
//!   §5.7, eq. 5.73 with `E[S²] = S²`) ([`md1_wait`]); prompts of a length distribution take
//!   service times of their own, and the same formula with their second moment,
//!   `W = λE[S²] / (2(1 − λE[S]))`, is M/G/1's ([`mg1_wait`]). The median request, whose TTFT
//!   benchmarks report, waits less: `1 − ρ` of Poisson arrivals find the server idle
//!   ([`median_wait`]).
//! - **Overload** (λ above what the worker completes, μ): the queue grows at `λ − μ`; over a
//!   run of `N` requests the `k`-th arrives at `k/λ` and starts at `k/μ`, so the median request
//!   (`k = N/2`) waits `N/2 · (1/μ − 1/λ)` ([`overload_wait`], the fluid approximation of a
//!   transient queue, Kleinrock vol. 2, 1976, §2.8).
//! - **Waves** (a closed loop of equal-length requests, or an offline batch): the requests of a
//!   wave arrive together and are prefilled in forwards of a token budget, in order; a request's
//!   first token comes with the forward that finishes its prompt ([`wave_forwards`]).

/// The expected largest of `n` independent Poisson counts of mean `mean`:
/// `Σ_k (1 − F(k)^n)` over the counts `k ≥ 0`, `F` the Poisson distribution function. Attention-DP
/// ranks run each forward together, so a step waits for the rank with the most prompts
/// (docs/serving.md §5.1): `n·mean` when prompts are sparse, `mean` plus a fluctuation when
/// every rank has some. Above a mean of 100 the counts are normal: `mean` plus `σ = √mean` times
/// the standardized excess the sum gives at 100.
pub fn expected_max_poisson(mean: f64, n: f64) -> f64 {
    const NORMAL_FROM: f64 = 100.0;
    if n <= 1.0 || mean <= 0.0 {
        return mean.max(0.0);
    }
    if mean > NORMAL_FROM {
        let excess = (expected_max_poisson(NORMAL_FROM, n) - NORMAL_FROM) / NORMAL_FROM.sqrt();
        return mean + mean.sqrt() * excess;
    }
    let (mut pmf, mut cdf, mut sum) = ((-mean).exp(), 0.0, 0.0);
    let last = (mean + 20.0 * mean.sqrt() + 20.0).ceil() as u32;
    for k in 0..=last {
        cdf += pmf;
        let tail = 1.0 - cdf.min(1.0).powf(n);
        if tail < 1e-15 {
            break;
        }
        sum += tail;
        pmf *= mean / (k as f64 + 1.0);
    }
    sum
}

/// Seconds a request waits for a running slot in a closed loop: `(in_flight − running)/X`,
/// with `X` the completions per second of the `running` sequences (0 when all run).
pub fn slot_wait(in_flight: f64, running: f64, completions_per_s: f64) -> f64 {
    if in_flight <= running || completions_per_s <= 0.0 {
        0.0
    } else {
        (in_flight - running) / completions_per_s
    }
}

/// Seconds a request of a closed loop waits beyond its own service: `in_flight` requests
/// complete at `completions_per_s`, so each spends `in_flight/X` in the system (Little's law,
/// `R = N/X − Z` with `Z = 0`), of which `service_s` is its own work (0 when the loop leaves no
/// wait, or nothing completes).
pub fn closed_loop_wait(in_flight: f64, completions_per_s: f64, service_s: f64) -> f64 {
    if completions_per_s <= 0.0 {
        0.0
    } else {
        (in_flight / completions_per_s - service_s).max(0.0)
    }
}

/// Mean seconds in queue of M/D/1 at arrival rate `lambda` and service time `service`
/// (Pollaczek–Khinchine); `None` when the server is saturated (`ρ ≥ 1`).
pub fn md1_wait(lambda: f64, service: f64) -> Option<f64> {
    mg1_wait(lambda, service, service * service)
}

/// Mean seconds in queue of M/G/1 at arrival rate `lambda` with service times of mean
/// `mean_s` and second moment `second_moment` (Pollaczek–Khinchine, Kleinrock vol. 1 eq. 5.73);
/// `None` when the server is saturated (`ρ = λ·mean_s ≥ 1`). With `second_moment = mean_s²`
/// it is [`md1_wait`].
pub fn mg1_wait(lambda: f64, mean_s: f64, second_moment: f64) -> Option<f64> {
    let rho = lambda * mean_s;
    if rho >= 1.0 {
        None
    } else {
        Some(lambda * second_moment / (2.0 * (1.0 - rho)))
    }
}

/// The median of a FCFS M/G/1 queue's wait, from its mean `mean_wait` at utilisation `rho`: a
/// share `1 − ρ` of the arrivals find the server idle and wait nothing (Kleinrock vol. 1 §5.7:
/// `P(W = 0) = 1 − ρ`), so the median is 0 up to `ρ = 1/2`; above it the waits of the others are
/// taken as exponential with mean `E[W]/ρ` (the heavy-traffic form of the M/G/1 wait, Kingman
/// 1962), whose median over all arrivals is `(E[W]/ρ)·ln(2ρ)`.
pub fn median_wait(rho: f64, mean_wait: f64) -> f64 {
    if rho <= 0.5 || mean_wait <= 0.0 {
        0.0
    } else {
        mean_wait / rho * (2.0 * rho).ln()
    }
}

/// Seconds the median of `num_requests` arrivals at `lambda`/s waits when the worker completes
/// only `mu`/s: `N/2 · (1/μ − 1/λ)` (0 when `mu ≥ lambda`).
pub fn overload_wait(num_requests: f64, mu: f64, lambda: f64) -> f64 {
    if mu >= lambda || mu <= 0.0 {
        0.0
    } else {
        num_requests / 2.0 * (1.0 / mu - 1.0 / lambda)
    }
}

/// Forwards of a wave of `seqs` prompts of `tokens` each, in forwards of at most `budget`
/// tokens: `(all, median)` — the forwards of the whole wave, and those until the median
/// request's prompt (the `⌈seqs/2⌉`-th) is done.
pub fn wave_forwards(seqs: f64, tokens: f64, budget: f64) -> (f64, f64) {
    let per_forward = budget.min(seqs * tokens).max(1.0);
    let all = (seqs * tokens / per_forward).ceil().max(1.0);
    let median = ((seqs / 2.0).ceil().max(1.0) * tokens / per_forward)
        .ceil()
        .clamp(1.0, all);
    (all, median)
}

/// Tokens of the forwards of a wave of `seqs` prompts of `tokens` each under a `budget`:
/// `(full, last)` — every forward but the last holds `budget` tokens (chunked prefill fills
/// each forward to the budget), the last what is left (`full` when the wave fits one forward).
pub fn wave_forward_tokens(seqs: f64, tokens: f64, budget: f64) -> (f64, f64) {
    let total = (seqs * tokens).max(1.0);
    let full = budget.min(total).max(1.0);
    let (all, _) = wave_forwards(seqs, tokens, budget);
    let last = (total - (all - 1.0) * full).clamp(1.0, full);
    (full, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_loop_beyond_the_batch_waits_for_slots() {
        // 128 in flight, 50 running, 1 completion/s: 78 s waiting (Little's law).
        assert_eq!(slot_wait(128.0, 50.0, 1.0), 78.0);
        assert_eq!(slot_wait(32.0, 50.0, 1.0), 0.0);
    }

    #[test]
    fn varied_service_times_wait_longer_than_equal_ones() {
        // Equal service times: M/G/1 is M/D/1.
        let d = md1_wait(2.0, 0.25).unwrap();
        assert!((mg1_wait(2.0, 0.25, 0.0625).unwrap() - d).abs() < 1e-15);
        // Half the prompts take 0.05 s, half 0.45 s: the same mean, E[S²] = 0.1025 = 1.64·S²,
        // so the wait is 1.64 times M/D/1's 0.125 s at ρ = 0.5: 0.205 s.
        let g = mg1_wait(2.0, 0.25, 0.5 * 0.05 * 0.05 + 0.5 * 0.45 * 0.45).unwrap();
        assert!((g - 1.64 * d).abs() < 1e-12, "{g} vs {d}");
        assert!((d - 0.125).abs() < 1e-15);
        assert!((g - 0.205).abs() < 1e-12);
        assert_eq!(mg1_wait(4.0, 0.25, 0.1), None);
    }

    #[test]
    fn the_median_arrival_waits_only_when_the_server_is_busy_more_than_half_the_time() {
        // 1 − ρ of Poisson arrivals find the server idle.
        assert_eq!(median_wait(0.5, 0.125), 0.0);
        assert_eq!(median_wait(0.3, 0.2), 0.0);
        // At ρ = 0.8 the others wait E[W]/ρ on average, exponentially: the median arrival
        // (the 0.3 quantile of the waiting 80 %) waits (E[W]/0.8)·ln 1.6.
        let m = median_wait(0.8, 1.0);
        assert!((m - 1.25 * 1.6_f64.ln()).abs() < 1e-15);
        assert!(m < 1.0);
        // Heavy traffic: the median approaches ln 2 of the mean.
        assert!((median_wait(0.999, 1.0) - 2.0_f64.ln()).abs() < 2e-3);
    }

    #[test]
    fn a_closed_loop_waits_what_littles_law_leaves() {
        // 128 in flight at 4 completions/s: 32 s in the system, 20 of them its own work.
        assert_eq!(closed_loop_wait(128.0, 4.0, 20.0), 12.0);
        assert_eq!(closed_loop_wait(16.0, 4.0, 20.0), 0.0);
        assert_eq!(closed_loop_wait(16.0, 0.0, 20.0), 0.0);
    }

    #[test]
    fn md1_is_pollaczek_khinchine() {
        // λ = 2/s, S = 0.25 s: ρ = 0.5, W = 0.5·0.25/(2·0.5) = 0.125 s.
        assert_eq!(md1_wait(2.0, 0.25), Some(0.125));
        // ρ = 0.9: W = 0.9·0.1/(2·0.1) = 0.45 s.
        assert!((md1_wait(9.0, 0.1).unwrap() - 0.45).abs() < 1e-12);
        assert_eq!(md1_wait(4.0, 0.25), None);
    }

    #[test]
    fn an_overloaded_queue_grows_over_the_run() {
        // 600 requests at 2/s against 1/s served: the 300th arrives at 150 s, starts at 300 s.
        assert_eq!(overload_wait(600.0, 1.0, 2.0), 150.0);
        assert_eq!(overload_wait(600.0, 3.0, 2.0), 0.0);
    }

    #[test]
    fn a_wave_is_prefilled_in_token_budget_forwards() {
        // 64 prompts of 3200 tokens in forwards of 8192: 25 forwards; the 32nd prompt ends at
        // token 102400, in the 13th.
        assert_eq!(wave_forwards(64.0, 3200.0, 8192.0), (25.0, 13.0));
        // A wave that fits one forward: everyone's first token after it.
        assert_eq!(wave_forwards(4.0, 3200.0, 16384.0), (1.0, 1.0));
        // A prompt longer than the budget takes several forwards of its own.
        assert_eq!(wave_forwards(1.0, 20000.0, 8192.0), (3.0, 3.0));
    }

    #[test]
    fn a_wave_fills_every_forward_but_the_last() {
        // 64 prompts of 3200 tokens (204800) in forwards of 8192: 24 full, then 0.
        assert_eq!(wave_forward_tokens(64.0, 3200.0, 8192.0), (8192.0, 8192.0));
        // 8 prompts (25600) in forwards of 16384: one full forward and 9216 tokens.
        assert_eq!(wave_forward_tokens(8.0, 3200.0, 16384.0), (16384.0, 9216.0));
        // One forward holds the whole wave.
        assert_eq!(
            wave_forward_tokens(4.0, 3200.0, 16384.0),
            (12800.0, 12800.0)
        );
    }

    #[test]
    fn the_busiest_of_n_ranks_holds_the_largest_poisson_count() {
        // One rank: its own mean.
        assert_eq!(expected_max_poisson(0.3, 1.0), 0.3);
        assert_eq!(expected_max_poisson(0.0, 8.0), 0.0);
        // Two ranks of mean 1, by hand: Σ_k 1 − F(k)², F(0) = e⁻¹, F(1) = 2e⁻¹, F(2) = 2.5e⁻¹, …
        let e = (-1.0f64).exp();
        let f = [
            e,
            2.0 * e,
            2.5 * e,
            (2.5 + 1.0 / 6.0) * e,
            (2.5 + 1.0 / 6.0 + 1.0 / 24.0) * e,
        ];
        let by_hand: f64 = f.iter().map(|f| 1.0 - f * f).sum();
        let got = expected_max_poisson(1.0, 2.0);
        // (the counts above 4 add 1.4e-3)
        assert!(got > by_hand && got - by_hand < 2e-3, "{got} vs {by_hand}");
        // Sparse prompts: nearly n times the mean (the ranks rarely prefill in the same step).
        let sparse = expected_max_poisson(0.001, 8.0);
        assert!(sparse < 0.008 && sparse > 0.0079, "{sparse}");
        // Dense: the mean and a fluctuation, below n times it; monotone in n and in the mean.
        let dense = expected_max_poisson(50.0, 8.0);
        assert!(dense > 55.0 && dense < 70.0, "{dense}");
        assert!(expected_max_poisson(50.0, 16.0) > dense);
        assert!(expected_max_poisson(51.0, 8.0) > dense);
        // The normal approximation above a mean of 100 joins the sum.
        let (below, above) = (
            expected_max_poisson(99.99, 8.0),
            expected_max_poisson(100.01, 8.0),
        );
        assert!((above / below - 1.0).abs() < 0.01, "{below} vs {above}");
    }
}

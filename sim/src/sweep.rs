//! `--sweep`: a grid over the kvgate knobs on one scenario, ranked, to find
//! the tuned configurations the scenario files compare (and to learn what
//! each knob does). Runs on every core; results do not depend on how many.

use std::fmt::Write as _;
use std::time::Duration;

use crate::bound;
use crate::metrics::Summary;
use crate::policy::{Policy, PolicyKind, ProbeTarget};
use crate::scenario::Scenario;
use crate::simulation;
use crate::workload::Workload;

/// High watermarks tried.
pub const WATERMARKS: [f64; 7] = [0.85, 0.6, 0.4, 0.2, 0.1, 0.05, 0.02];
/// Hit thresholds tried.
pub const HIT_THRESHOLDS: [f64; 4] = [0.5, 0.8, 0.9, 0.95];
/// Idle grace windows tried, seconds.
pub const GRACES_S: [f64; 5] = [60.0, 10.0, 3.0, 1.0, 0.0];
/// Wait polls tried, seconds.
pub const POLLS_S: [f64; 3] = [5.0, 1.0, 0.25];

/// Every grid point as a kvgate policy named by its knobs.
pub fn grid() -> Vec<Policy> {
    let mut out = Vec::new();
    for wm in WATERMARKS {
        for hit in HIT_THRESHOLDS {
            for grace in GRACES_S {
                for poll in POLLS_S {
                    let config = kvgate::Config {
                        high_watermark: wm,
                        hit_threshold: hit,
                        idle_grace: Duration::from_secs_f64(grace),
                        wait_poll: Duration::from_secs_f64(poll),
                        ..kvgate::Config::default()
                    };
                    out.push(Policy {
                        name: format!("kvgate:wm={wm},hit={hit},grace={grace},poll={poll}"),
                        kind: PolicyKind::Kvgate {
                            config,
                            probe: ProbeTarget::SessionReplica,
                        },
                    });
                }
            }
        }
    }
    out
}

/// Runs `policies` on `threads` threads (each with its own copy of the
/// workload) and returns their summaries in input order.
pub fn run_all(
    scenario: &Scenario,
    seed: u64,
    policies: &[Policy],
    threads: usize,
) -> Vec<Summary> {
    let threads = threads.clamp(1, policies.len().max(1));
    let mut rows: Vec<Option<Summary>> = vec![None; policies.len()];
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let w = Workload::generate(
                        &scenario.workload,
                        scenario.deployment.engine.block_size,
                        seed,
                    );
                    (t..policies.len())
                        .step_by(threads)
                        .map(|i| {
                            (
                                i,
                                simulation::run(&scenario.deployment, &w, &policies[i]).summary(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for (i, s) in h.join().expect("a sweep thread panicked") {
                rows[i] = Some(s);
            }
        }
    });
    rows.into_iter()
        .map(|r| r.expect("every point ran"))
        .collect()
}

/// Caps tried exhaustively up to this K; above it, coarse then finer.
pub const EXHAUSTIVE_CAPS: usize = 12;

/// The hindsight-best fixed cap on one workload and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct CapBest {
    /// Its K (sessions in flight per replica).
    pub k: usize,
    /// Its run, named `cap-best (K=k)`.
    pub summary: Summary,
    /// How many caps were simulated to find it.
    pub tried: usize,
}

/// Finds the fixed cap with the shortest makespan (ties: the smaller K) by
/// sweeping K = 1 … ⌈sessions / replicas⌉ on the same workload and seed.
///
/// Up to [`EXHAUSTIVE_CAPS`] every K is considered. Above, every
/// ⌈max/10⌉-th K (and the largest), then around the best so far at half
/// that stride, and so on down to its two neighbours. That is a local
/// search: it finds the true best unless the makespan has a second,
/// narrower valley away from the coarse best. Makespan against K is a
/// broad valley with a few percent of chaotic noise, so the K it misses
/// wins by at most about that much. Against the exhaustive sweep
/// (`tests/cap_search.rs`, ignored by default: thrash, h200, staggered and
/// waves, seeds 1-5) it found the same K in all 20 cases with 10-15 runs
/// instead of 32-72.
///
/// Caps are run from the largest K down, a batch per round, and a K is
/// skipped once it provably cannot win: under cap-K each of the `K × R`
/// slots runs its sessions one after another, each for at least its
/// critical path, so makespan ≥ Σ critical paths / (K × R). Skipping is
/// exact: it never drops a K that could beat the best found. A cap that is
/// run is stopped once its simulated time passes the best makespan found
/// in earlier rounds, for the same reason.
pub fn cap_best(scenario: &Scenario, seed: u64, threads: usize) -> CapBest {
    let replicas = scenario.deployment.replicas;
    let max_k = scenario.workload.total_sessions().div_ceil(replicas).max(1);
    let w = Workload::generate(
        &scenario.workload,
        scenario.deployment.engine.block_size,
        seed,
    );
    let slot_work: u64 = bound::critical_paths(&scenario.deployment.engine, &w)
        .iter()
        .sum();
    let mut results: Vec<(usize, Summary)> = Vec::new();
    let run = |ks: Vec<usize>, results: &mut Vec<(usize, Summary)>| {
        let mut ks = ks;
        ks.sort_unstable_by(|a, b| b.cmp(a));
        let batch = threads.max(1) * 2;
        let mut i = 0;
        while i < ks.len() {
            let best_s = results
                .iter()
                .filter(|(_, s)| s.finished)
                .map(|(_, s)| s.makespan_s)
                .fold(f64::INFINITY, f64::min);
            let can_win = |k: usize| {
                let floor_s = slot_work as f64 / (k * replicas) as f64 / 1e9;
                floor_s < best_s
            };
            let next: Vec<usize> = ks[i..]
                .iter()
                .copied()
                .filter(|&k| can_win(k))
                .take(batch)
                .collect();
            if next.is_empty() {
                break;
            }
            let last = *next.last().expect("non-empty");
            i = ks.iter().position(|&k| k == last).expect("from ks") + 1;
            let policies: Vec<Policy> = next
                .iter()
                .map(|&k| Policy {
                    name: format!("cap-{k}"),
                    kind: PolicyKind::Cap(k),
                })
                .collect();
            // A cap still running past the best makespan so far cannot win:
            // stop it there (it ends unfinished, which ranks it last). A run
            // that ties the best still finishes, so ties break by K as before.
            let mut bounded = scenario.clone();
            if best_s.is_finite() {
                let limit_ns = (best_s * 1e9).ceil() as u64 + 1;
                let d = &mut bounded.deployment;
                d.time_limit_ns = d.time_limit_ns.min(limit_ns);
            }
            // On one thread the workload generated above serves every cap
            // (generating it is a tenth of a run); threads need their own.
            let summaries = if threads <= 1 {
                policies
                    .iter()
                    .map(|p| simulation::run(&bounded.deployment, &w, p).summary())
                    .collect()
            } else {
                run_all(&bounded, seed, &policies, threads)
            };
            results.extend(next.iter().copied().zip(summaries));
        }
    };
    if max_k <= EXHAUSTIVE_CAPS {
        run((1..=max_k).collect(), &mut results);
    } else {
        let mut stride = max_k.div_ceil(10);
        let mut coarse: Vec<usize> = (1..=max_k).step_by(stride).collect();
        if coarse.last() != Some(&max_k) {
            coarse.push(max_k);
        }
        run(coarse, &mut results);
        while stride > 1 {
            stride = stride.div_ceil(2);
            let best = best_of(&results).0;
            let around: Vec<usize> = [best.saturating_sub(stride), best + stride]
                .into_iter()
                .filter(|&k| (1..=max_k).contains(&k))
                .filter(|k| !results.iter().any(|(done, _)| done == k))
                .collect();
            run(around, &mut results);
        }
    }
    let tried = results.len();
    let (k, mut summary) = best_of(&results);
    summary.policy = format!("cap-best (K={k})");
    CapBest { k, summary, tried }
}

fn best_of(results: &[(usize, Summary)]) -> (usize, Summary) {
    results
        .iter()
        .min_by(|(ka, a), (kb, b)| {
            b.finished
                .cmp(&a.finished)
                .then(a.makespan_s.total_cmp(&b.makespan_s))
                .then(ka.cmp(kb))
        })
        .map(|(k, s)| (*k, s.clone()))
        .expect("at least one cap")
}

/// The ranking: unfinished runs last, then by makespan.
pub fn ranked(mut rows: Vec<Summary>) -> Vec<Summary> {
    rows.sort_by(|a, b| {
        b.finished
            .cmp(&a.finished)
            .then(a.makespan_s.total_cmp(&b.makespan_s))
            .then(a.policy.cmp(&b.policy))
    });
    rows
}

/// CSV of every grid point.
pub fn csv(rows: &[Summary]) -> String {
    let mut out = String::from("policy,finished,makespan_s,hit_rate,hit_rate_last_third,re_prefilled_tokens,waits,wait_s,probes_per_admission,late_turn_slowdown\n");
    for r in rows {
        let _ = writeln!(
            out,
            "\"{}\",{},{:.3},{:.5},{:.5},{},{},{:.2},{:.3},{:.3}",
            r.policy,
            r.finished,
            r.makespan_s,
            r.hit_rate,
            r.hit_rate_last_third,
            r.re_prefilled_tokens,
            r.waits,
            r.wait_s,
            r.probes_per_admission,
            r.late_turn_slowdown
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_covers_every_combination_with_valid_configs() {
        let g = grid();
        assert_eq!(
            g.len(),
            WATERMARKS.len() * HIT_THRESHOLDS.len() * GRACES_S.len() * POLLS_S.len()
        );
        for p in &g {
            let PolicyKind::Kvgate { config: c, .. } = &p.kind else {
                panic!()
            };
            c.validate().unwrap();
        }
    }
}

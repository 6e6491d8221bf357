//! `--judge`: every scenario × every seed × a list of policies, each judged
//! against the hindsight-best fixed cap re-picked per seed and against the
//! workload's lower bound. This is how a new admission mode is accepted:
//! one command, one table per scenario, one CSV/JSON for the record.
//!
//! The policies' runs on one scenario and seed (one workload serves them
//! all) and each cap-best search are one task each on a small pool of
//! threads; results do not depend on how many.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::metrics::Summary;
use crate::policy::Policy;
use crate::scenario::Scenario;
use crate::simulation;
use crate::sweep;
use crate::workload::Workload;

/// One policy on one seed, beside that seed's best cap.
#[derive(Debug, Clone, Serialize)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// The policy's figures.
    pub summary: Summary,
    /// The best cap's K on this seed.
    pub cap_best_k: usize,
    /// The best cap's makespan, s.
    pub cap_best_makespan_s: f64,
    /// The best cap's hit rate.
    pub cap_best_hit_rate: f64,
}

impl SeedResult {
    /// Makespan over the best cap's (below 1: the policy beats it).
    pub fn ratio(&self) -> f64 {
        self.summary.makespan_s / self.cap_best_makespan_s
    }
}

/// One policy's verdict on one scenario over all seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Scenario name.
    pub scenario: String,
    /// Policy name (`cap-best` for the reference itself).
    pub policy: String,
    /// Geometric mean over seeds of makespan / cap-best makespan.
    pub geomean_ratio_to_cap_best: f64,
    /// The worst seed's ratio.
    pub worst_ratio_to_cap_best: f64,
    /// The seed of the worst ratio.
    pub worst_seed: u64,
    /// Mean hit rate.
    pub hit_rate: f64,
    /// Mean hit rate minus cap-best's, percentage points.
    pub hit_points_vs_cap_best: f64,
    /// Mean over seeds of the p99 turn latency, s.
    pub p99_turn_latency_s: f64,
    /// Longest single wait at the policy over every seed, s.
    pub max_wait_s: f64,
    /// Geometric mean over seeds of makespan / the lower bound.
    pub geomean_gap_to_bound: f64,
    /// Seeds on which some session did not finish in time.
    pub unfinished_seeds: usize,
    /// Every seed's figures.
    pub seeds: Vec<SeedResult>,
}

enum Task {
    /// Every policy on one scenario and seed: one workload serves them all.
    Runs(usize, u64),
    CapBest(usize, u64),
}

enum Done {
    Runs(usize, u64, Vec<Summary>),
    CapBest(usize, u64, Box<sweep::CapBest>),
}

/// Runs `policies` and cap-best on every scenario and seed, on `threads` threads.
pub fn judge(
    scenarios: &[Scenario],
    seeds: &[u64],
    policies: &[Policy],
    threads: usize,
) -> Vec<Verdict> {
    let mut tasks = Vec::new();
    for (i, _) in scenarios.iter().enumerate() {
        for &seed in seeds {
            // Searches first: they are the longest tasks.
            tasks.push(Task::CapBest(i, seed));
        }
    }
    for (i, _) in scenarios.iter().enumerate() {
        for &seed in seeds {
            tasks.push(Task::Runs(i, seed));
        }
    }
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(tasks.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, tasks.len().max(1)) {
            scope.spawn(|| loop {
                let t = next.fetch_add(1, Ordering::Relaxed);
                let Some(task) = tasks.get(t) else {
                    return;
                };
                let out = match *task {
                    Task::CapBest(i, seed) => {
                        Done::CapBest(i, seed, Box::new(sweep::cap_best(&scenarios[i], seed, 1)))
                    }
                    Task::Runs(i, seed) => {
                        let s = &scenarios[i];
                        let w =
                            Workload::generate(&s.workload, s.deployment.engine.block_size, seed);
                        let runs = policies
                            .iter()
                            .map(|p| simulation::run(&s.deployment, &w, p).summary())
                            .collect();
                        Done::Runs(i, seed, runs)
                    }
                };
                done.lock().expect("not poisoned").push(out);
            });
        }
    });
    let done = done.into_inner().expect("not poisoned");
    let best = |i: usize, seed: u64| {
        done.iter()
            .find_map(|d| match d {
                Done::CapBest(j, s, b) if *j == i && *s == seed => Some(b),
                _ => None,
            })
            .expect("every search ran")
    };
    let mut verdicts = Vec::new();
    for (i, scenario) in scenarios.iter().enumerate() {
        let mut rows: Vec<(String, Vec<SeedResult>)> = Vec::new();
        let with = |summary: Summary, seed: u64| {
            let b = best(i, seed);
            SeedResult {
                seed,
                summary,
                cap_best_k: b.k,
                cap_best_makespan_s: b.summary.makespan_s,
                cap_best_hit_rate: b.summary.hit_rate,
            }
        };
        for (index, p) in policies.iter().enumerate() {
            let seeds_of: Vec<SeedResult> = seeds
                .iter()
                .map(|&seed| {
                    let summary = done
                        .iter()
                        .find_map(|d| match d {
                            Done::Runs(j, s, runs) if *j == i && *s == seed => {
                                Some(runs[index].clone())
                            }
                            _ => None,
                        })
                        .expect("every run ran");
                    with(summary, seed)
                })
                .collect();
            rows.push((p.name.clone(), seeds_of));
        }
        let reference: Vec<SeedResult> = seeds
            .iter()
            .map(|&seed| with(best(i, seed).summary.clone(), seed))
            .collect();
        rows.push(("cap-best".to_string(), reference));
        for (policy, seeds) in rows {
            verdicts.push(verdict(&scenario.name, policy, seeds));
        }
    }
    verdicts
}

fn geomean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v.ln(), n + 1));
    if n == 0 {
        0.0
    } else {
        (sum / n as f64).exp()
    }
}

fn verdict(scenario: &str, policy: String, seeds: Vec<SeedResult>) -> Verdict {
    let n = seeds.len().max(1) as f64;
    let (worst_seed, worst) =
        seeds
            .iter()
            .map(|s| (s.seed, s.ratio()))
            .fold(
                (0, f64::NEG_INFINITY),
                |acc, x| if x.1 > acc.1 { x } else { acc },
            );
    Verdict {
        scenario: scenario.to_string(),
        policy,
        geomean_ratio_to_cap_best: geomean(seeds.iter().map(SeedResult::ratio)),
        worst_ratio_to_cap_best: worst,
        worst_seed,
        hit_rate: seeds.iter().map(|s| s.summary.hit_rate).sum::<f64>() / n,
        hit_points_vs_cap_best: seeds
            .iter()
            .map(|s| (s.summary.hit_rate - s.cap_best_hit_rate) * 100.0)
            .sum::<f64>()
            / n,
        p99_turn_latency_s: seeds
            .iter()
            .map(|s| s.summary.p99_turn_latency_s)
            .sum::<f64>()
            / n,
        max_wait_s: seeds
            .iter()
            .map(|s| s.summary.max_wait_s)
            .fold(0.0, f64::max),
        geomean_gap_to_bound: geomean(seeds.iter().map(|s| s.summary.makespan_over_bound)),
        unfinished_seeds: seeds.iter().filter(|s| !s.summary.finished).count(),
        seeds,
    }
}

/// `policy`'s makespan over the best of `rivals` (policy names) and the
/// best cap on each seed: the geometric mean over the seeds and the worst
/// seed's. `None` if the policy or a rival did not run.
pub fn over_best_rival(verdicts: &[Verdict], policy: &str, rivals: &[&str]) -> Option<(f64, f64)> {
    let mine = verdicts.iter().find(|v| v.policy == policy)?;
    let rows: Vec<&Verdict> = rivals
        .iter()
        .map(|r| verdicts.iter().find(|v| v.policy == *r))
        .collect::<Option<_>>()?;
    let ratios: Vec<f64> = mine
        .seeds
        .iter()
        .map(|m| {
            let best = rows
                .iter()
                .filter_map(|v| v.seeds.iter().find(|s| s.seed == m.seed))
                .map(|s| s.summary.makespan_s)
                .fold(m.cap_best_makespan_s, f64::min);
            m.summary.makespan_s / best
        })
        .collect();
    let worst = ratios.iter().copied().fold(0.0, f64::max);
    Some((geomean(ratios.into_iter()), worst))
}

/// The printed table of one scenario's verdicts.
pub fn table(verdicts: &[Verdict]) -> String {
    let header = [
        "policy",
        "x cap-best (geo)",
        "worst (seed)",
        "hit%",
        "hit pts vs cap-best",
        "p99 turn",
        "max wait",
        "x bound (geo)",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for v in verdicts {
        let dnf = if v.unfinished_seeds > 0 {
            format!(" ({} unfinished)", v.unfinished_seeds)
        } else {
            String::new()
        };
        cells.push(vec![
            format!("{}{dnf}", v.policy),
            format!("{:.3}", v.geomean_ratio_to_cap_best),
            format!("{:.3} ({})", v.worst_ratio_to_cap_best, v.worst_seed),
            format!("{:.1}", v.hit_rate * 100.0),
            format!("{:+.1}", v.hit_points_vs_cap_best),
            format!("{:.1} s", v.p99_turn_latency_s),
            format!("{:.0} s", v.max_wait_s),
            format!("{:.2}", v.geomean_gap_to_bound),
        ]);
    }
    crate::report::align(&cells)
}

/// The same as Markdown, all scenarios in one table (for docs/simulator.md).
pub fn markdown(verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "| scenario | policy | × cap-best (geo mean) | worst seed | hit % | hit pts vs cap-best | p99 turn | max wait | × bound (geo mean) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for v in verdicts {
        let policy = if v.policy == "cap-best" {
            let ks: Vec<String> = v.seeds.iter().map(|s| s.cap_best_k.to_string()).collect();
            format!("cap-best (K = {})", ks.join("/"))
        } else {
            v.policy.clone()
        };
        let _ =
            writeln!(
            out,
            "| {} | {}{} | {:.3} | {:.3} (seed {}) | {:.1} | {:+.1} | {:.1} s | {:.0} s | {:.2} |",
            v.scenario,
            policy,
            if v.unfinished_seeds > 0 { " (unfinished)" } else { "" },
            v.geomean_ratio_to_cap_best,
            v.worst_ratio_to_cap_best,
            v.worst_seed,
            v.hit_rate * 100.0,
            v.hit_points_vs_cap_best,
            v.p99_turn_latency_s,
            v.max_wait_s,
            v.geomean_gap_to_bound
        );
    }
    out
}

/// One CSV row per scenario × policy × seed.
pub fn csv(verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "scenario,policy,seed,finished,makespan_s,cap_best_k,cap_best_makespan_s,ratio_to_cap_best,hit_rate,cap_best_hit_rate,p50_turn_latency_s,p99_turn_latency_s,max_wait_s,bound_s,makespan_over_bound,prefilled_tokens,min_prefill_tokens,idle_with_waiters,last_session_wait_s\n",
    );
    for v in verdicts {
        for s in &v.seeds {
            let m = &s.summary;
            let _ = writeln!(
                out,
                "{},\"{}\",{},{},{:.3},{},{:.3},{:.4},{:.5},{:.5},{:.4},{:.4},{:.3},{:.3},{:.4},{},{},{:.4},{:.3}",
                v.scenario,
                v.policy,
                s.seed,
                m.finished,
                m.makespan_s,
                s.cap_best_k,
                s.cap_best_makespan_s,
                s.ratio(),
                m.hit_rate,
                s.cap_best_hit_rate,
                m.p50_turn_latency_s,
                m.p99_turn_latency_s,
                m.max_wait_s,
                m.bound_s,
                m.makespan_over_bound,
                m.prefilled_tokens,
                m.min_prefill_tokens,
                m.idle_with_waiters,
                m.last_session_wait_s
            );
        }
    }
    out
}

/// Parses a seed list: `1-5`, `1,2,7` or a mix (`1-3,9`).
pub fn parse_seeds(spec: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--seeds: `{part}` is not N or N-M");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() {
        return Err("--seeds: no seed given".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_lists() {
        assert_eq!(parse_seeds("1-5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(parse_seeds("7, 1-2,9").unwrap(), vec![7, 1, 2, 9]);
        assert!(parse_seeds("5-1").is_err());
        assert!(parse_seeds("x").is_err());
        assert!(parse_seeds("").is_err());
    }

    #[test]
    fn a_verdict_is_judged_against_each_seeds_own_best_cap() {
        let s = Scenario::load("no-pressure").unwrap();
        let policies = vec![
            Policy::parse("none").unwrap(),
            Policy::parse("cap-2").unwrap(),
        ];
        let v = judge(std::slice::from_ref(&s), &[1, 2], &policies, 2);
        assert_eq!(v.len(), 3, "two policies and the reference");
        let reference = v.iter().find(|v| v.policy == "cap-best").unwrap();
        assert!((reference.geomean_ratio_to_cap_best - 1.0).abs() < 1e-12);
        let none = v.iter().find(|v| v.policy == "none").unwrap();
        // Without pressure no gate is as good as the best cap; cap-2 is far worse.
        assert!(none.geomean_ratio_to_cap_best < 1.01, "{none:?}");
        let cap2 = v.iter().find(|v| v.policy == "cap-2").unwrap();
        assert!(cap2.worst_ratio_to_cap_best > 1.5, "{cap2:?}");
        assert!(cap2.geomean_gap_to_bound >= 1.0);
    }
}

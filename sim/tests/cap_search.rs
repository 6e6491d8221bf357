//! The cap-best search against the exhaustive sweep it stands in for.
//! Slow (every K on several scenarios and seeds): run it with
//! `cargo test --release -p kvgate-sim --test cap_search -- --ignored --nocapture`.

use kvgate_sim::policy::{Policy, PolicyKind};
use kvgate_sim::scenario::Scenario;
use kvgate_sim::sweep;

#[test]
#[ignore = "slow: every K on several scenarios and seeds"]
fn the_cap_search_matches_the_exhaustive_sweep() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut worst: f64 = 1.0;
    for name in ["thrash", "h200", "staggered", "waves"] {
        let s = Scenario::load(name).unwrap();
        let max_k = s.workload.total_sessions().div_ceil(s.deployment.replicas);
        for seed in 1..=5 {
            let caps: Vec<Policy> = (1..=max_k)
                .map(|k| Policy {
                    name: format!("cap-{k}"),
                    kind: PolicyKind::Cap(k),
                })
                .collect();
            let all = sweep::run_all(&s, seed, &caps, threads);
            let (best_k, best) = all
                .iter()
                .enumerate()
                .filter(|(_, r)| r.finished)
                .min_by(|a, b| a.1.makespan_s.total_cmp(&b.1.makespan_s))
                .map(|(i, r)| (i + 1, r.makespan_s))
                .unwrap();
            let found = sweep::cap_best(&s, seed, threads);
            let ratio = found.summary.makespan_s / best;
            println!(
                "{name} seed {seed}: exhaustive K={best_k} {best:.1} s; search K={} {:.1} s ({} caps) ratio {ratio:.4}",
                found.k, found.summary.makespan_s, found.tried
            );
            worst = worst.max(ratio);
        }
    }
    println!("worst ratio {worst:.4}");
    assert!(
        worst < 1.03,
        "the search lost {:.1}% somewhere",
        (worst - 1.0) * 100.0
    );
}

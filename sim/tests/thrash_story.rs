//! The simulator's story (README, docs/simulator.md), asserted on the
//! built-in `thrash` scenario (the default comparison): without a gate the
//! prefix cache collapses late in the rollout and late turns get
//! disproportionately slower; the reference-default gate does about
//! nothing (as measured on a real vLLM engine); a session cap and the
//! tuned gate restore the hit rate and shorten the rollout.

use kvgate_sim::compare;
use kvgate_sim::metrics::{RunResult, Summary};
use kvgate_sim::scenario::Scenario;

fn hit_rate(r: &RunResult, keep: impl Fn(usize) -> bool) -> f64 {
    let (q, h) = r
        .turns
        .iter()
        .filter(|t| keep(t.turn))
        .fold((0u64, 0u64), |(q, h), t| {
            (q + t.prompt_len as u64, h + t.hit_tokens as u64)
        });
    h as f64 / q as f64
}

#[test]
fn thrash_tells_the_seed_story() {
    let scenario = Scenario::load("thrash").unwrap();
    let wanted = [
        "none",
        "kvgate",
        "kvgate-reference",
        "kvgate-tuned",
        "cap-16",
    ];
    let policies: Vec<_> = scenario
        .policies
        .iter()
        .filter(|p| wanted.contains(&p.name.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        policies.len(),
        wanted.len(),
        "the scenario still has these policies"
    );
    let runs = compare(&scenario, scenario.seed, &policies);
    let s: Vec<Summary> = runs.iter().map(RunResult::summary).collect();
    let by = |name: &str| s.iter().position(|r| r.policy == name).unwrap();
    let (none, working_set, reference, tuned, cap) = (
        by("none"),
        by("kvgate"),
        by("kvgate-reference"),
        by("kvgate-tuned"),
        by("cap-16"),
    );

    // Without a gate: hot early, thrashing late, late turns much slower.
    let early = hit_rate(&runs[none], |k| k < 8);
    let late = hit_rate(&runs[none], |k| (24..=32).contains(&k));
    assert!(early > 0.85, "none, turns 0-7: {early}");
    assert!(late < 0.2, "none, turns 24-32: {late}");
    assert!(s[none].hit_rate_last_third < 0.5, "{:?}", s[none]);
    assert!(s[none].late_turn_slowdown > 3.0, "{:?}", s[none]);

    // The reference defaults change little: they stay far from what a cap
    // does. (With the context term in the step time, longer decode steps
    // keep more requests running, so usage crosses the 0.85 watermark more
    // often than without it and the gate recovers some hits.)
    assert!(
        s[reference].hit_rate < s[none].hit_rate + 0.15,
        "{:?}",
        s[reference]
    );
    assert!(
        s[reference].makespan_s > 0.8 * s[none].makespan_s,
        "{:?}",
        s[reference]
    );
    assert!(
        s[reference].makespan_s > 1.4 * s[cap].makespan_s,
        "{:?}",
        s[reference]
    );

    // A cap, the tuned reference gate and the default (working-set) gate
    // keep the cache hot and finish much sooner; the default beats the cap.
    assert!(
        s[working_set].makespan_s < s[cap].makespan_s,
        "{:?} vs {:?}",
        s[working_set],
        s[cap]
    );
    for i in [cap, tuned, working_set] {
        assert!(s[i].hit_rate > 0.9, "{:?}", s[i]);
        assert!(s[i].makespan_s < 0.6 * s[none].makespan_s, "{:?}", s[i]);
    }
    // Parked sessions re-prefill when they come back, so the working set's
    // late turns are slower than the cap's, yet far from the thrash.
    for i in [cap, tuned] {
        assert!(s[i].late_turn_slowdown < 1.5, "{:?}", s[i]);
    }
    assert!(
        s[working_set].late_turn_slowdown < 0.5 * s[none].late_turn_slowdown,
        "{:?}",
        s[working_set]
    );
}

//! Golden tests of the makespan lower bound on a workload small enough to
//! check by hand, and the property that no policy ever beats it.
//!
//! The hand-checked workload: 1-token blocks (so the cache holds exactly
//! what was computed), β0 = 1 ms, β1 = 10 µs per prefill token, β2 = 100 µs
//! per decode sequence, β3 = 1 µs per context token (what attention reads,
//! the step's own tokens included), β4 = 0.1 µs per query-key pair (`n`
//! tokens after `c` attend `n·c + n(n+1)/2`), a budget of 8 tokens per step.
//! Each session: a 4-token shared system prompt, a 6-token task, 2 turns of
//! 3 output tokens, a tool returning 5 tokens.
//!
//! One session alone, warm cache (the system prompt cached):
//! - turn 0, prompt 10, new 6 after 4: one prefill step reading 10 tokens
//!   and attending 6·4 + 21 = 45 pairs, 1 + 0.060 + 0.010 + 0.0045 =
//!   1.0745 ms; decodes after 10 and 11 tokens (reading and attending 11,
//!   then 12): 1.1121 + 1.1132 ms;
//! - the tool;
//! - turn 1, prompt 10 + 3 + 5 = 18, cached 10 + 3 - 1 = 12 (the last
//!   sampled token was never computed), new 6: reading 18, attending
//!   6·12 + 21 = 93 pairs, 1 + 0.060 + 0.018 + 0.0093 = 1.0873 ms; decodes
//!   after 18 and 19: 1.1209 + 1.1220 ms.
//!
//! That is 6.630 ms of engine time plus the tool.

use kvgate_sim::bound::{lower_bound, Bound};
use kvgate_sim::compare;
use kvgate_sim::scenario::{Scenario, BUILT_IN};
use kvgate_sim::workload::Workload;

mod support;

fn scenario(sessions: usize, system: usize, tool_s: f64, arrival: &str) -> Scenario {
    let text = format!(
        r#"
name = "tiny"
description = "hand-checkable"
seed = 1
probe_rtt_ms = 0.0

[engine]
num_gpu_blocks = 1000
block_size = 1
max_num_batched_tokens = 8
max_num_seqs = 4
beta0_ms = 1.0
beta1_us = 10.0
beta2_us = 100.0
beta3_us = 1.0
beta4_us = 0.1

[workload]
sessions = {sessions}
turns = {{ min = 2, max = 2 }}
system_prompt_tokens = {system}
task_tokens = {{ min = {task}, max = {task} }}
output_tokens = {{ median = 3.0, sigma = 0.0, min = 3.0, max = 3.0 }}
tool_result_tokens = {{ median = 5.0, sigma = 0.0, min = 5.0, max = 5.0 }}
tool_latency_s = {{ median = {tool_s}, sigma = 0.0, min = {tool_s}, max = {tool_s} }}
vocab = 50000
{arrival}

[[policies]]
kind = "none"
"#,
        task = 10 - system
    );
    Scenario::parse(&text).expect("valid")
}

fn bound_of(s: &Scenario) -> Bound {
    let w = Workload::generate(&s.workload, s.deployment.engine.block_size, s.seed);
    lower_bound(&s.deployment.engine, s.deployment.replicas, &w)
}

const MS: u64 = 1_000_000;

#[test]
fn one_session_critical_path_by_hand() {
    let s = scenario(1, 4, 0.5, "");
    let b = bound_of(&s);
    assert_eq!(b.critical_path_ns, 6_630_000 + 500 * MS);
    assert_eq!(b.makespan_ns, b.critical_path_ns);
    // New tokens: 6 + 6, plus the shared prompt once.
    assert_eq!(b.min_prefill_tokens, 16);
}

#[test]
fn one_cold_session_meets_its_bound_exactly() {
    // Without a shared prompt nothing is warm to begin with, so the run of
    // a lone session is its critical path: turn 0 prefills 10 tokens in two
    // steps (8 after 0: reading 8, attending 36 pairs, 1.0916 ms; then 2
    // after 8: reading 10, attending 2·8 + 3 = 19, 1.0319 ms).
    let s = scenario(1, 0, 0.5, "");
    let b = bound_of(&s);
    assert_eq!(
        b.critical_path_ns,
        (10_916 + 10_319 + 11_121 + 11_132 + 10_873 + 11_209 + 11_220) * 100 + 500 * MS
    );
    let run = &compare(&s, s.seed, &s.policies)[0];
    assert_eq!(run.makespan_ns, b.makespan_ns);
    assert_eq!(run.engine.prefill_tokens, b.min_prefill_tokens);
}

#[test]
fn total_work_by_hand() {
    // 4 sessions, 1 ms tools: the engine's work dominates.
    // Prefill 4 x 12 + 4 = 52, decode 4 x 4 = 16; per session the context
    // read (10 + 11 + 12) + (18 + 19 + 20) = 90 and the pairs attended
    // (45 + 11 + 12) + (93 + 19 + 20) = 200; steps >= ceil(68 / 8) = 9.
    // 9 ms + 0.52 + 1.6 + 0.36 + 0.08 ms.
    let s = scenario(4, 4, 0.001, "");
    let b = bound_of(&s);
    assert_eq!(b.critical_path_ns, 7_630_000);
    assert_eq!(b.total_work_ns, 11_560_000);
    assert_eq!(b.makespan_ns, 11_560_000);
    assert_eq!(b.min_prefill_tokens, 52);
}

#[test]
fn staggered_and_wave_starts_by_hand() {
    // Starts at 0, 100, 200, 300 ms: the last session's critical path.
    let s = scenario(
        4,
        4,
        0.001,
        "arrival = { kind = \"staggered\", interval_s = 0.1 }",
    );
    assert_eq!(bound_of(&s).makespan_ns, 300 * MS + 7_630_000);
    // Two waves of two: the second starts when the first has finished
    // (7.630 ms at best), so 15.260 ms; its own work after 7.630 ms:
    // steps ceil(36 / 8) = 5, prefill 28, decode 8, read 180, pairs 400 =
    // 6.300 ms.
    let s = scenario(
        4,
        4,
        0.001,
        "arrival = { kind = \"waves\", wave_sessions = 2 }",
    );
    let b = bound_of(&s);
    assert_eq!(b.critical_path_ns, 2 * 7_630_000);
    assert_eq!(b.total_work_ns, 7_630_000 + 6_300_000);
    assert_eq!(b.makespan_ns, 15_260_000);
}

#[test]
fn no_policy_beats_the_bound() {
    // Every kind of policy on a small thrashing workload (the golden test's
    // shape), and no gate on every built-in scenario.
    let small = support::small_thrash();
    let specs = [
        "none",
        "kvgate",
        "kvgate:wm=0.2,grace=1,poll=1",
        "cap-3",
        "ttl-pin",
        "thunderagent",
        "progress-ttl",
        "prime-rl",
        "prime-rl-cg",
        "seed-defaults",
    ];
    let mut cases: Vec<(Scenario, Vec<&str>)> = vec![(small, specs.to_vec())];
    for (name, _) in BUILT_IN {
        cases.push((Scenario::load(name).unwrap(), vec!["none"]));
    }
    for (s, specs) in cases {
        let policies: Vec<_> = specs
            .iter()
            .map(|p| kvgate_sim::policy::Policy::parse(p).unwrap())
            .collect();
        for r in compare(&s, 3, &policies) {
            let name = &s.name;
            assert!(r.finished, "{name} {}", r.policy.name);
            assert!(
                r.makespan_ns >= r.bound.makespan_ns,
                "{name} {}: {} < bound {}",
                r.policy.name,
                r.makespan_ns,
                r.bound.makespan_ns
            );
            assert!(
                r.engine.prefill_tokens >= r.bound.min_prefill_tokens,
                "{name} {}",
                r.policy.name
            );
        }
    }
}

//! Golden tests of the makespan lower bound on a workload small enough to
//! check by hand, and the property that no policy ever beats it.
//!
//! The hand-checked workload: 1-token blocks (so the cache holds exactly
//! what was computed), β0 = 1 ms, β1 = 10 µs per prefill token, β2 = 100 µs
//! per decode token, β3 = 1 µs per context token read, a budget of 8 tokens
//! per step. Each session: a 4-token shared system prompt, a 6-token task,
//! 2 turns of 3 output tokens, a tool returning 5 tokens.
//!
//! One session alone, warm cache (the system prompt cached):
//! - turn 0, prompt 10, new 6: one prefill step reading 4 cached tokens
//!   1 + 0.060 + 0.004 = 1.064 ms; decodes reading 10 and 11 tokens
//!   1.110 + 1.111 ms;
//! - the tool;
//! - turn 1, prompt 10 + 3 + 5 = 18, cached 10 + 3 - 1 = 12 (the last
//!   sampled token was never computed), new 6: 1 + 0.060 + 0.012 = 1.072 ms;
//!   decodes reading 18 and 19: 1.118 + 1.119 ms.
//!
//! That is 6.594 ms of engine time plus the tool.

use kvgate_sim::bound::{lower_bound, Bound};
use kvgate_sim::compare;
use kvgate_sim::scenario::{Scenario, BUILT_IN};
use kvgate_sim::workload::Workload;

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
    assert_eq!(b.critical_path_ns, 6_594_000 + 500 * MS);
    assert_eq!(b.makespan_ns, b.critical_path_ns);
    // New tokens: 6 + 6, plus the shared prompt once.
    assert_eq!(b.min_prefill_tokens, 16);
}

#[test]
fn one_cold_session_meets_its_bound_exactly() {
    // Without a shared prompt nothing is warm to begin with, so the run of
    // a lone session is its critical path: turn 0 prefills 10 tokens in two
    // steps (8 reading 0, then 2 reading 8: 1.080 + 1.028 ms).
    let s = scenario(1, 0, 0.5, "");
    let b = bound_of(&s);
    assert_eq!(
        b.critical_path_ns,
        (1_080 + 1_028 + 2_221 + 1_072 + 2_237) * 1_000 + 500 * MS
    );
    let run = &compare(&s, s.seed, &s.policies)[0];
    assert_eq!(run.makespan_ns, b.makespan_ns);
    assert_eq!(run.engine.prefill_tokens, b.min_prefill_tokens);
}

#[test]
fn total_work_by_hand() {
    // 4 sessions, 1 ms tools: the engine's work dominates.
    // Prefill 4 x 12 + 4 = 52, decode 4 x 4 = 16, context read per session
    // (4 + 2 x 10 + 1) + (12 + 2 x 18 + 1) = 74; steps >= ceil(68 / 8) = 9.
    // 9 ms + 0.52 + 1.6 + 0.296 ms.
    let s = scenario(4, 4, 0.001, "");
    let b = bound_of(&s);
    assert_eq!(b.critical_path_ns, 7_594_000);
    assert_eq!(b.total_work_ns, 11_416_000);
    assert_eq!(b.makespan_ns, 11_416_000);
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
    assert_eq!(bound_of(&s).makespan_ns, 300 * MS + 7_594_000);
    // Two waves of two: the second starts when the first has finished
    // (7.594 ms at best), so 15.188 ms; its own work after 7.594 ms:
    // steps ceil(36 / 8) = 5, prefill 28, decode 8, read 148 = 6.228 ms.
    let s = scenario(
        4,
        4,
        0.001,
        "arrival = { kind = \"waves\", wave_sessions = 2 }",
    );
    let b = bound_of(&s);
    assert_eq!(b.critical_path_ns, 2 * 7_594_000);
    assert_eq!(b.total_work_ns, 7_594_000 + 6_228_000);
    assert_eq!(b.makespan_ns, 15_188_000);
}

#[test]
fn no_policy_beats_the_bound() {
    // Every kind of policy on a small thrashing workload (the golden test's
    // shape), and no gate on every built-in scenario.
    let small = Scenario::parse(
        &BUILT_IN[0]
            .1
            .replace("sessions = 32\n", "sessions = 8\n")
            .replace("num_gpu_blocks = 29205", "num_gpu_blocks = 4096")
            .replace(
                "turns = { min = 32, max = 40 }",
                "turns = { min = 8, max = 12 }",
            ),
    )
    .unwrap();
    let specs = [
        "none",
        "kvgate",
        "kvgate:wm=0.2,grace=1,poll=1",
        "cap-3",
        "ttl-pin",
        "thunderagent",
        "progress-ttl",
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

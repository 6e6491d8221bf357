//! The router in front of the replicas (`Routing`): `hash` keeps every turn
//! of a session on the replica its id hashes to, `sticky` where it first
//! landed, and `least-loaded` places every turn anew (sessions migrate),
//! with no gate and with kvgate (one gate per replica). Runs in well under
//! a second in debug.

use std::collections::BTreeSet;

use kvgate_sim::compare;
use kvgate_sim::policy::router::hash_replica;
use kvgate_sim::scenario::Scenario;
use kvgate_sim::simulation::Routing;

const SCENARIO: &str = r#"
name = "routing"
description = "24 sessions on 3 small replicas"
seed = 11
replicas = 3
probe_rtt_ms = 1.0

[engine]
profile = "h100-llama8b"
num_gpu_blocks = 256
block_size = 16
max_num_batched_tokens = 2048
max_num_seqs = 256

[workload]
sessions = 24
turns = { min = 3, max = 9 }
system_prompt_tokens = 128
task_tokens = { min = 64, max = 128 }
output_tokens = { median = 24.0, sigma = 0.5, min = 4.0, max = 64.0 }
tool_result_tokens = { median = 120.0, sigma = 0.6, min = 16.0, max = 400.0 }
tool_latency_s = { median = 0.2, sigma = 0.8, min = 0.02, max = 2.0 }

[[policies]]
kind = "none"

[[policies]]
kind = "kvgate"
"#;

fn replicas_per_session(routing: Routing) -> Vec<Vec<BTreeSet<usize>>> {
    let mut scenario = Scenario::parse(SCENARIO).expect("valid scenario");
    scenario.deployment.routing = routing;
    compare(&scenario, scenario.seed, &scenario.policies)
        .iter()
        .map(|r| {
            assert!(r.finished, "{}: every session finished", r.policy.name);
            let mut per = vec![BTreeSet::new(); 24];
            for t in &r.turns {
                per[t.session].insert(t.replica);
            }
            per
        })
        .collect()
}

#[test]
fn hash_routing_keeps_each_session_on_its_hashed_replica() {
    for per in replicas_per_session(Routing::Hash) {
        for (s, replicas) in per.iter().enumerate() {
            assert_eq!(
                replicas,
                &BTreeSet::from([hash_replica(s, 3)]),
                "session {s}"
            );
        }
    }
}

#[test]
fn least_loaded_routing_moves_sessions_between_turns() {
    for per in replicas_per_session(Routing::LeastLoaded) {
        let moved = per.iter().filter(|r| r.len() > 1).count();
        assert!(moved > 0, "no session changed replica: {per:?}");
        assert!(per.iter().all(|r| !r.is_empty()));
    }
}

#[test]
fn sticky_routing_keeps_a_session_where_it_first_landed() {
    for per in replicas_per_session(Routing::Sticky) {
        assert!(per.iter().all(|r| r.len() == 1), "{per:?}");
    }
}

#[test]
fn routing_parses_from_scenario_files_and_the_command_line() {
    assert_eq!(
        Scenario::parse(SCENARIO).unwrap().deployment.routing,
        Routing::Sticky
    );
    let hashed = SCENARIO.replace("replicas = 3\n", "replicas = 3\nrouting = \"hash\"\n");
    assert_eq!(
        Scenario::parse(&hashed).unwrap().deployment.routing,
        Routing::Hash
    );
    assert_eq!(Routing::parse("least-loaded"), Ok(Routing::LeastLoaded));
    assert!(Routing::parse("round-robin").is_err());
}

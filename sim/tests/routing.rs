//! The router in front of the replicas (`Routing`): `hash` keeps every turn
//! of a session on the replica its id hashes to, `sticky` and `room` where
//! it first landed, and `least-loaded` places every turn anew (sessions
//! migrate), with no gate and with kvgate (one gate per replica);
//! `room-replace` and `sticky-replace` move a session whose gate would make
//! a later turn wait, `sticky-resume` and `sticky-refuse` one whose cache
//! its gate counts gone, and every turn still runs once; a replica lost
//! partway (`Cluster::ReplicaLost`) serves nothing after, and every session
//! still finishes. Runs in well under a second in debug.

use std::collections::BTreeSet;

use kvgate_sim::cluster::Cluster;
use kvgate_sim::compare;
use kvgate_sim::policy::router::hash_replica;
use kvgate_sim::policy::Policy;
use kvgate_sim::scenario::Scenario;
use kvgate_sim::simulation::Routing;
use kvgate_sim::workload::Workload;

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
fn room_routing_keeps_a_session_where_it_first_landed() {
    for per in replicas_per_session(Routing::Room) {
        assert!(per.iter().all(|r| r.len() == 1), "{per:?}");
        let used: BTreeSet<usize> = per.iter().flatten().copied().collect();
        assert_eq!(used.len(), 3, "every replica got sessions: {per:?}");
    }
}

/// Per session, how many times each turn was recorded.
fn turns_recorded(r: &kvgate_sim::metrics::RunResult, sessions: usize) -> Vec<Vec<usize>> {
    let mut seen = vec![Vec::new(); sessions];
    for t in &r.turns {
        let per: &mut Vec<usize> = &mut seen[t.session];
        if per.len() <= t.turn {
            per.resize(t.turn + 1, 0);
        }
        per[t.turn] += 1;
    }
    seen
}

#[test]
fn refused_turns_move_where_a_gate_has_room_and_every_turn_runs_once() {
    for routing in [
        Routing::RoomReplace,
        Routing::StickyReplace,
        Routing::StickyResume,
        Routing::StickyRefuse,
    ] {
        for cluster in [Cluster::ReplicaKvHalf, Cluster::ReplicaLost] {
            let mut scenario = Scenario::parse(SCENARIO).expect("valid scenario");
            scenario.deployment.routing = routing;
            scenario.deployment.cluster = cluster;
            let runs = compare(&scenario, scenario.seed, &scenario.policies);
            let workload = Workload::generate(
                &scenario.workload,
                scenario.deployment.engine.block_size,
                scenario.seed,
            );
            for r in runs {
                let name = &r.policy.name;
                assert!(
                    r.finished,
                    "{routing:?} {cluster:?} {name}: every session finished"
                );
                for (s, per) in turns_recorded(&r, 24).iter().enumerate() {
                    let turns = workload.sessions[s].turns.len();
                    assert_eq!(per, &vec![1; turns], "{routing:?} {name}: session {s}");
                }
                // A session that changed replica between turns without a loss moved.
                let mut replicas = vec![BTreeSet::new(); 24];
                for t in r
                    .turns
                    .iter()
                    .filter(|t| t.replica != 0 || cluster != Cluster::ReplicaLost)
                {
                    replicas[t.session].insert(t.replica);
                }
                let moved = replicas.iter().filter(|r| r.len() > 1).count();
                if r.gate.is_some() {
                    assert!(moved > 0, "{routing:?} {cluster:?}: no session moved");
                } else {
                    assert_eq!(moved, 0, "{routing:?} {cluster:?} {name}: no gate refuses");
                }
            }
        }
    }
}

#[test]
fn a_lost_replica_serves_nothing_after_and_every_session_finishes() {
    for routing in [Routing::Room, Routing::Sticky, Routing::Hash] {
        let mut scenario = Scenario::parse(SCENARIO).expect("valid scenario");
        scenario.deployment.routing = routing;
        scenario.deployment.cluster = Cluster::ReplicaLost;
        let mut policies = scenario.policies.clone();
        policies.push(Policy::parse("cap-4").unwrap());
        policies.push(Policy::parse("thunderagent").unwrap());
        for r in compare(&scenario, scenario.seed, &policies) {
            let name = &r.policy.name;
            assert!(r.finished, "{routing:?} {name}: every session finished");
            let total = r.turns.len();
            let mut by_end: Vec<_> = r.turns.iter().collect();
            by_end.sort_by_key(|t| t.completed_ns);
            // Replica 0 is lost once a third of the turns ended.
            let after = &by_end[total / 3..];
            assert!(
                after.iter().all(|t| t.replica != 0),
                "{routing:?} {name}: a turn ended on the lost replica"
            );
            assert!(by_end[..total / 3].iter().any(|t| t.replica == 0));
            let mut per = vec![0usize; 24];
            for t in &r.turns {
                per[t.session] += 1;
            }
            let mut expected: Vec<usize> = vec![0; 24];
            for t in r.turns.iter().filter(|t| t.last) {
                expected[t.session] = t.turn + 1;
            }
            assert_eq!(per, expected, "{routing:?} {name}: each turn once");
        }
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
    assert_eq!(Routing::parse("room"), Ok(Routing::Room));
    assert_eq!(Routing::parse("room-replace"), Ok(Routing::RoomReplace));
    assert_eq!(Routing::parse("sticky-replace"), Ok(Routing::StickyReplace));
    assert_eq!(Routing::parse("sticky-resume"), Ok(Routing::StickyResume));
    assert_eq!(Routing::parse("sticky-refuse"), Ok(Routing::StickyRefuse));
    let odd = SCENARIO.replace(
        "replicas = 3\n",
        "replicas = 3\ncluster = \"replica-slow\"\n",
    );
    assert_eq!(
        Scenario::parse(&odd).unwrap().deployment.cluster,
        Cluster::ReplicaSlow
    );
    let alone = odd.replace("replicas = 3\n", "replicas = 1\n");
    assert!(
        Scenario::parse(&alone).is_err(),
        "one replica has no odd one"
    );
    assert!(Routing::parse("round-robin").is_err());
}

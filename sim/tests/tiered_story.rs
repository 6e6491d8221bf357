//! An engine that offloads KV to host memory: the gate told the tier
//! parks members there instead of holding their places through tool calls
//! that a copy brings back from, and finishes sooner than the same gate
//! not told it, than no gate, and than ThunderAgent budgeting GPU plus
//! host memory (`mid-tools-tier`, its own seed).

use kvgate_sim::compare;
use kvgate_sim::metrics::{RunResult, Summary};
use kvgate_sim::policy::Policy;
use kvgate_sim::scenario::Scenario;
use kvgate_sim::simulation::CapacityProbe;

fn run(probe: CapacityProbe, policies: &[&str]) -> Vec<Summary> {
    let mut scenario = Scenario::load("mid-tools-tier").unwrap();
    scenario.deployment.capacity_probe = probe;
    let policies: Vec<Policy> = policies.iter().map(|p| Policy::parse(p).unwrap()).collect();
    compare(&scenario, scenario.seed, &policies)
        .iter()
        .map(RunResult::summary)
        .collect()
}

#[test]
fn a_gate_told_the_tier_parks_members_there() {
    let told = run(CapacityProbe::Full, &["none", "kvgate", "thunderagent"]);
    let (none, kvgate, thunder) = (&told[0], &told[1], &told[2]);
    let untold = &run(CapacityProbe::NoTier, &["kvgate"])[0];
    // Everyone finishes, and the tier serves hits to every policy.
    for s in [none, kvgate, thunder, untold] {
        assert!(s.finished && s.tier_hit_rate > 0.0, "{s:?}");
    }
    for (what, other) in [
        ("no gate", none),
        ("thunderagent", thunder),
        ("not told", untold),
    ] {
        assert!(
            kvgate.makespan_s < 0.95 * other.makespan_s,
            "{what}: {} s vs {} s",
            kvgate.makespan_s,
            other.makespan_s
        );
    }
    // It holds more of the histories than offloading alone.
    assert!(kvgate.hit_rate > none.hit_rate, "{kvgate:?} {none:?}");
    // Told, it brings parked members back by copies: more reloads, less
    // waiting than the gate that holds their places.
    assert!(kvgate.reloaded_tokens > untold.reloaded_tokens);
    assert!(
        kvgate.wait_s < untold.wait_s,
        "{} vs {}",
        kvgate.wait_s,
        untold.wait_s
    );
}

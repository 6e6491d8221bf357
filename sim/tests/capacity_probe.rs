//! A host that cannot tell the gate its engine's capacity still gets a
//! working gate (issue: "a host that cannot tell it must still get a
//! working gate"): on the `real-engine` scenario, with the capacity probe
//! answered with nothing, the default gate estimates the capacity from the
//! usage gauge and keeps the cache about as hot as when it is told.

use kvgate_sim::compare;
use kvgate_sim::metrics::{RunResult, Summary};
use kvgate_sim::policy::Policy;
use kvgate_sim::scenario::Scenario;
use kvgate_sim::simulation::CapacityProbe;

fn run(probe: CapacityProbe) -> (Summary, Summary) {
    let mut scenario = Scenario::load("real-engine").unwrap();
    scenario.deployment.capacity_probe = probe;
    let policies = [
        Policy::parse("none").unwrap(),
        Policy::parse("kvgate").unwrap(),
    ];
    let runs = compare(&scenario, scenario.seed, &policies);
    let s: Vec<Summary> = runs.iter().map(RunResult::summary).collect();
    (s[0].clone(), s[1].clone())
}

#[test]
fn a_host_that_tells_less_still_gets_a_working_gate() {
    let (none, told) = run(CapacityProbe::Full);
    let (_, no_rate) = run(CapacityProbe::NoRate);
    let (_, usage_only) = run(CapacityProbe::UsageOnly);
    assert!(told.hit_rate > 0.6, "told everything: {told:?}");
    for (what, s) in [("no rate", &no_rate), ("usage only", &usage_only)] {
        assert!(
            s.hit_rate > 0.9 * told.hit_rate,
            "{what}: hits {} vs {} when told",
            s.hit_rate,
            told.hit_rate
        );
        assert!(
            s.makespan_s < 0.75 * none.makespan_s,
            "{what}: {} s vs {} s without a gate",
            s.makespan_s,
            none.makespan_s
        );
    }
}

//! A noisy engine (`[engine] jitter`, `cotenant`, or `--noise`): the same
//! seed gives the same noise, another seed other noise, and noise slows
//! the engine. The quiet engine is untouched (the golden tests pin it).

use kvgate_sim::compare;
use kvgate_sim::engine::Noise;
use kvgate_sim::policy::Policy;
use kvgate_sim::scenario::{Scenario, BUILT_IN};

mod support;
use support::small_thrash as small;

#[test]
fn noise_is_fixed_per_seed_and_slows_the_engine() {
    let policies: Vec<Policy> = ["none", "kvgate", "cap-3"]
        .iter()
        .map(|p| Policy::parse(p).unwrap())
        .collect();
    let quiet = small();
    let noisy = small().with_noise(Noise::parse("jitter=0.5-2,cotenant=10-60").unwrap());
    let q = compare(&quiet, 3, &policies);
    let a = compare(&noisy, 3, &policies);
    let b = compare(&noisy, 3, &policies);
    let other = compare(&noisy, 4, &policies);
    let other_quiet = compare(&quiet, 4, &policies);
    for i in 0..policies.len() {
        let name = &policies[i].name;
        assert!(a[i].finished && q[i].finished, "{name}");
        // Deterministic per seed: the very same run.
        assert_eq!(a[i].makespan_ns, b[i].makespan_ns, "{name}");
        assert_eq!(a[i].engine, b[i].engine, "{name}");
        // The same steps' work, slower: jitter's mean is 1.08 and the
        // co-tenant doubles every step for 50 s.
        assert!(
            a[i].engine.busy_ns as f64 > 1.05 * q[i].engine.busy_ns as f64,
            "{name}: busy {} quiet {}",
            a[i].engine.busy_ns,
            q[i].engine.busy_ns
        );
        assert!(a[i].makespan_ns > q[i].makespan_ns, "{name}");
        // Another seed draws other noise (over another workload).
        assert_ne!(
            other[i].engine.busy_ns as f64 / other_quiet[i].engine.busy_ns as f64,
            a[i].engine.busy_ns as f64 / q[i].engine.busy_ns as f64,
            "{name}"
        );
    }
    // The same noise from a scenario file's [engine] table.
    let text = BUILT_IN[0].1.replace(
        "[engine]\n",
        "[engine]\njitter = [0.5, 2.0]\ncotenant = { start_s = 10.0, end_s = 60.0 }\n",
    );
    let s = Scenario::parse(&text).unwrap();
    assert_eq!(s.deployment.engine.noise, noisy.deployment.engine.noise);
    let bad = BUILT_IN[0]
        .1
        .replace("[engine]\n", "[engine]\njitter = [2.0, 0.5]\n");
    assert!(Scenario::parse(&bad).unwrap_err().contains("jitter"));
}

#[test]
fn a_cotenant_alone_doubles_the_steps_in_its_window() {
    // A window past the end of the run changes nothing; one covering it
    // doubles every step's cost.
    let none = [Policy::parse("none").unwrap()];
    let quiet = compare(&small(), 5, &none);
    let late = compare(
        &small().with_noise(Noise::parse("cotenant=100000-200000").unwrap()),
        5,
        &none,
    );
    assert_eq!(quiet[0].makespan_ns, late[0].makespan_ns);
    assert_eq!(quiet[0].engine, late[0].engine);
    let all = compare(
        &small().with_noise(Noise::parse("cotenant=0-100000").unwrap()),
        5,
        &none,
    );
    // Steps batch differently once slower, so the ratio is not exactly 2.
    let ratio = all[0].makespan_ns as f64 / quiet[0].makespan_ns as f64;
    eprintln!("a co-tenant throughout: makespan x{ratio:.3}");
    assert!(ratio > 1.3, "{ratio}");
}

//! kvgate-sim: a deterministic discrete-event simulation of vLLM replicas
//! serving an agentic RL rollout, with admission policies side by side.
//!
//! The `kvgate` policy is the library's real sans-IO core
//! (`kvgate::core::{Core, Attempt, Step}`) driven in simulated time; the
//! engine model follows vLLM v1's block pool, prefix cache and scheduler
//! ([`engine`]). Everything is a pure function of the scenario and the seed.

pub mod bound;
pub mod cli;
pub mod cluster;
pub mod engine;
pub mod events;
pub mod fit;
pub mod judge;
pub mod metrics;
pub mod plots;
pub mod policy;
pub mod prefill_rate;
pub mod report;
pub mod scenario;
pub mod simulation;
pub mod sweep;
pub mod variation;
pub mod workload;

use metrics::RunResult;
use policy::Policy;
use scenario::Scenario;
use workload::Workload;

/// Runs `policies` over the scenario's workload for `seed`, one after the
/// other, each on fresh replicas.
pub fn compare(scenario: &Scenario, seed: u64, policies: &[Policy]) -> Vec<RunResult> {
    let workload = Workload::generate(
        &scenario.workload,
        scenario.deployment.engine.block_size,
        seed,
    );
    policies
        .iter()
        .map(|p| simulation::run(&scenario.deployment, &workload, p))
        .collect()
}

//! What several of the simulator's test files build alike.

use kvgate_sim::scenario::{Scenario, BUILT_IN};

/// The golden tests' small thrashing workload: `thrash` with 8 sessions of
/// 8-12 turns on 4,096 blocks.
pub fn small_thrash() -> Scenario {
    Scenario::parse(
        &BUILT_IN[0]
            .1
            .replace("sessions = 32\n", "sessions = 8\n")
            .replace("num_gpu_blocks = 29205", "num_gpu_blocks = 4096")
            .replace(
                "turns = { min = 32, max = 40 }",
                "turns = { min = 8, max = 12 }",
            ),
    )
    .unwrap()
}

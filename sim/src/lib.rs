//! kvgate-sim: a deterministic discrete-event simulation of vLLM replicas
//! serving an agentic RL rollout, with admission policies side by side.
//! The `kvgate` policy is the real sans-IO core (`kvgate::core`), driven in
//! simulated time; the engine model follows vLLM v1's block pool, prefix
//! cache and scheduler.

pub mod engine;

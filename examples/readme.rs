//! The Rust quick start of README.md, kept compiling and running by
//! `./scripts/test.sh`; `scripts/check-docs.sh` fails when the two differ.

use std::time::Duration;

use kvgate::{Config, EngineCapacity, Gate, Probe, Reason, TurnReport};

/// Answers the gate's questions; in production, RPCs to the engine.
struct Engine;

impl Probe for Engine {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        Some(0.40) // the fraction of KV blocks in use
    }
    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        None // asked in reference mode only
    }
    fn kv_cache_capacity(&self, _session: &[u8]) -> Option<EngineCapacity> {
        // 29,205 blocks of 16 tokens; the engine prefills 20k tokens a second
        Some(EngineCapacity::new(29_205 * 16, 16, 20_000.0))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gate = Gate::new(Config::default(), Engine)?; // working-set admission
    let mut prompt: Vec<u32> = vec![7; 4096];

    let lease = gate.acquire_timeout(b"agent-7", &prompt, Duration::from_secs(60))?;
    // The first session in: nobody else is in the working set.
    assert_eq!(lease.reason(), Reason::EmptyWorkingSet);
    // Send the turn to the engine; when it returns, report what it measured:
    // the prompt tokens it served from its prefix cache, the tokens generated.
    lease.release_with(TurnReport::new(Some(0), Some(512)));

    prompt.extend([8; 1024]); // its output and the tool result
    let lease = gate.acquire(b"agent-7", &prompt)?;
    assert_eq!(lease.reason(), Reason::ReservedSession); // a member: straight in
    lease.release_with(TurnReport::new(Some(4096), Some(256)));

    // Ends the session's stay and hands back its last figures.
    let last = gate.finish_session(b"agent-7").expect("a known session");
    println!("{} admissions, {} waits", last.admissions, last.waits);
    Ok(())
}

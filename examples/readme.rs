//! The usage example from README.md, kept compiling and running by
//! `./scripts/test.sh`. Keep the two in sync by hand.

use std::time::Duration;

use kvgate::{Config, Gate, Probe, Reason};

/// Answers the gate's questions; in production, UTILITY calls to the engine.
struct Engine;

impl Probe for Engine {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        Some(0.92) // under pressure: at or above the 0.85 watermark
    }
    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        Some(0.97) // longest resident prefix / prompt length
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config {
        idle_grace: Duration::from_secs(30),
        ..Config::reference()
    };
    let gate = Gate::new(config, Engine)?; // validated, never clamped
    let mut prompt: Vec<u32> = vec![7; 4096];

    let lease = gate.acquire_timeout(b"agent-7", &prompt, Duration::from_secs(60))?;
    assert_eq!(lease.reason(), Reason::ResidentPrefix); // hot, so admitted under pressure
                                                        // ... send the turn to the engine ...
    lease.release(); // as soon as the engine returns: a 30 s grace window starts

    prompt.extend([8; 512]); // the tool result comes back
    let lease = gate.acquire(b"agent-7", &prompt)?;
    assert_eq!(lease.reason(), Reason::ReservedSession); // no prefix probe needed
    drop(lease); // dropping releases too

    // Ends the window, wakes a waiter, and hands back the session's last figures.
    let last = gate.finish_session(b"agent-7").expect("a known session");
    assert_eq!(last.num_preempted, 0);
    println!(
        "{} admissions, {} waits",
        last.admissions,
        gate.stats().waits
    );
    Ok(())
}

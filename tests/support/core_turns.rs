//! What the tests that drive the sans-IO core's working set by hand share
//! (`tests/working_set_core.rs`, `tests/release_elsewhere.rs`): an engine
//! of 1000 tokens, a turn begun and its usage probe answered, and the
//! lease of a step that must be an admission.

#![allow(dead_code)] // each test file uses a different subset

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kvgate::core::{Attempt, Core, LeaseToken, Notify, Step};
use kvgate::EngineCapacity;

/// 1000 tokens of KV in blocks of 1, refilled in 1 s (1000 tokens/s).
pub fn engine() -> EngineCapacity {
    EngineCapacity::new(1000, 1, 1000.0)
}

/// A notifier that counts its wake-ups.
pub struct Counting(pub Arc<AtomicUsize>);

impl Notify for Counting {
    fn notify(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Begins `session`'s turn of `prompt` tokens and answers its usage probe
/// (usage 10%, [`engine`]'s capacity): the attempt, its wake-up count and
/// the step the answer led to.
pub fn ask<'c>(
    core: &'c Core,
    session: &str,
    prompt: usize,
    now: u64,
) -> (Attempt<&'c Core>, Arc<AtomicUsize>, Step) {
    let wakes = Arc::new(AtomicUsize::new(0));
    let mut attempt = core
        .begin(
            session.as_bytes(),
            prompt,
            now,
            None,
            Box::new(Counting(wakes.clone())),
        )
        .unwrap();
    assert!(matches!(attempt.start(now).unwrap(), Step::ProbeUsage));
    let step = attempt
        .on_cache_state(Some(0.1), Some(engine()), now)
        .unwrap();
    (attempt, wakes, step)
}

/// The lease of `step`, which must be an admission.
pub fn admitted(step: Step) -> LeaseToken {
    match step {
        Step::Admitted(token) => token,
        other => panic!("expected admission, got {other:?}"),
    }
}

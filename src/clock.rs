//! Time as the gate sees it: monotonic nanoseconds from an injected clock.
//!
//! The decision core never reads a clock; the blocking [`Gate`](crate::Gate)
//! reads the one it was given. Tests, simulations and loom models inject a
//! [`ManualClock`] and move time themselves.

use std::time::{Duration, Instant};

// Through the facade: under loom, moving a manual clock is a modelled step,
// so a deadline passing is one more interleaving the models explore.
use crate::sync::{AtomicU64, Ordering};

/// A monotonic clock in nanoseconds since an arbitrary origin.
pub trait Clock: Send + Sync {
    /// Current time. Must never go backwards.
    fn now_ns(&self) -> u64;

    /// Whether time passes by itself. When it does (real clocks), a waiting
    /// attempt sleeps with a timeout; when it does not ([`ManualClock`]),
    /// it sleeps until woken and the clock's owner calls
    /// [`Gate::clock_advanced`](crate::Gate::clock_advanced) after moving time.
    fn advances_on_its_own(&self) -> bool {
        true
    }
}

/// The real monotonic clock (`std::time::Instant`).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to: for tests, simulations and models.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicU64,
}

impl ManualClock {
    /// A manual clock reading `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self {
            now_ns: AtomicU64::new(start_ns),
        }
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.now_ns.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the time; refuses to go backwards (keeps the later time).
    pub fn set_ns(&self, ns: u64) {
        self.now_ns.fetch_max(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    fn advances_on_its_own(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn advances_on_its_own(&self) -> bool {
        (**self).advances_on_its_own()
    }
}

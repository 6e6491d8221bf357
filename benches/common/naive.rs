//! The baseline: the reference scheduler's structure, written in Rust.
//!
//! One global mutex around a map of reservations, one condvar, and
//! `notify_all` on every release, every finish and every purge that drops
//! something, as in the reference (the Python scheduler in Lego-RL's
//! chat-completion proxy). Purging scans the whole
//! map on every call, as the reference does. Preemption is the proxy's: an
//! attempt registry behind a second global lock, an abort flag per attempt
//! that the waiter checks only at its checkpoints (around each probe and
//! after each wait); setting it wakes nobody.
//!
//! It is bench-only code, written to be as fast as that structure allows
//! (parking_lot primitives, the same ones kvgate uses, whose `notify_all`
//! costs nothing when nobody waits; an `open` lease borrows the gate and
//! allocates nothing), so the ratios are against a strong naive design, not
//! a strawman. It uses the same [`Probe`] trait and the same decision table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate::{Config, Probe, Reason};
use parking_lot::{Condvar, Mutex};

/// Expiry of a reservation held by an in-flight request (`+inf`).
const IN_FLIGHT: u64 = u64::MAX;

/// Why a naive `acquire` ended without a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NaiveError {
    /// A newer attempt of the session set this one's abort flag.
    Preempted,
    /// The bench-only deadline passed (the reference has none; the
    /// preemption bench needs a newer attempt that does not block).
    TimedOut,
    /// [`NaiveGate::close`] was called (bench teardown).
    Closed,
}

struct State {
    /// session -> expiry in ns on `origin` ([`IN_FLIGHT`] while a request runs).
    reserved: HashMap<Vec<u8>, u64>,
    closed: bool,
    /// Bench instrumentation: threads that entered the condvar wait since the
    /// last `notify_all` (the bench waits for all waiters to be back asleep).
    sleepers: usize,
    generation: u64,
}

/// The reference's single-lock scheduler.
pub struct NaiveGate<P> {
    state: Mutex<State>,
    changed: Condvar,
    /// The proxy's attempt registry: session -> abort flag of its current attempt.
    attempts: Mutex<HashMap<Vec<u8>, Arc<AtomicBool>>>,
    probe: P,
    high_watermark: f64,
    hit_threshold: f64,
    poll: Duration,
    grace_ns: u64,
    origin: Instant,
    /// Bench-only time shift (memory bench: make windows expire).
    skew_ns: AtomicU64,
}

/// A naive admission: releasing it notifies every waiter.
#[must_use]
pub struct NaiveLease<'g, P> {
    gate: &'g NaiveGate<P>,
    /// The session's key, kept only by retaining leases (the only ones whose
    /// release touches the map).
    retained: Option<Vec<u8>>,
    /// Why the attempt was admitted.
    pub reason: Reason,
}

impl<P: Probe> NaiveLease<'_, P> {
    /// `Lease.release()`: idempotent by construction (consumes the lease).
    pub fn release(self) {
        self.gate.release(self.retained.as_deref());
    }
}

impl<P: Probe> NaiveGate<P> {
    /// A naive gate with the same knobs as kvgate's `Config`.
    pub fn new(config: &Config, probe: P) -> Self {
        Self {
            state: Mutex::new(State {
                reserved: HashMap::new(),
                closed: false,
                sleepers: 0,
                generation: 0,
            }),
            changed: Condvar::new(),
            attempts: Mutex::new(HashMap::new()),
            probe,
            high_watermark: config.high_watermark,
            hit_threshold: config.hit_threshold,
            poll: config.wait_poll,
            grace_ns: config.idle_grace.as_nanos() as u64,
            origin: Instant::now(),
            skew_ns: AtomicU64::new(0),
        }
    }

    /// The engine probes, for the bench's bookkeeping.
    pub fn probe(&self) -> &P {
        &self.probe
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64 + self.skew_ns.load(Ordering::Relaxed)
    }

    /// `acquire` without an abort event (the reference's scheduler alone).
    pub fn acquire(&self, key: &[u8], prompt: &[u32]) -> Result<NaiveLease<'_, P>, NaiveError> {
        self.acquire_inner(key, prompt, None, None)
    }

    /// `acquire` as the proxy calls it: registers the attempt (aborting the
    /// session's previous one if it is still waiting), runs the scheduler
    /// with the abort flag, then unregisters. `timeout` (bench-only) makes
    /// the attempt give up instead of waiting past it.
    pub fn acquire_preemptible(
        &self,
        key: &[u8],
        prompt: &[u32],
        timeout: Option<Duration>,
    ) -> Result<NaiveLease<'_, P>, NaiveError> {
        let abort = Arc::new(AtomicBool::new(false));
        {
            let mut attempts = self.attempts.lock();
            if let Some(previous) = attempts.insert(key.to_vec(), abort.clone()) {
                previous.store(true, Ordering::SeqCst);
            }
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let result = self.acquire_inner(key, prompt, Some(&abort), deadline);
        let mut attempts = self.attempts.lock();
        if attempts.get(key).is_some_and(|a| Arc::ptr_eq(a, &abort)) {
            attempts.remove(key);
        }
        result
    }

    fn acquire_inner(
        &self,
        key: &[u8],
        prompt: &[u32],
        abort: Option<&AtomicBool>,
        deadline: Option<Instant>,
    ) -> Result<NaiveLease<'_, P>, NaiveError> {
        let chk = || -> Result<(), NaiveError> {
            match abort {
                Some(a) if a.load(Ordering::SeqCst) => Err(NaiveError::Preempted),
                _ => Ok(()),
            }
        };
        let start = self.now();
        loop {
            chk()?;
            let usage = self.probe.kv_cache_usage(key);
            chk()?;
            let usage = usage.filter(|u| u.is_finite() && (0.0..=1.0).contains(u));
            if !matches!(usage, Some(u) if u >= self.high_watermark) {
                let mut state = self.state.lock();
                let now = self.purge(&mut state);
                return self.admit(&mut state, key, start, now, Reason::Open);
            }
            {
                let mut state = self.state.lock();
                let now = self.purge(&mut state);
                chk()?;
                if state.closed {
                    return Err(NaiveError::Closed);
                }
                if state.reserved.contains_key(key) {
                    return self.admit(&mut state, key, start, now, Reason::ReservedSession);
                }
            }
            let hit = self.probe.prefix_hit_ratio(key, prompt);
            chk()?;
            let hit = hit.filter(|h| h.is_finite() && (0.0..=1.0).contains(h));
            let mut state = self.state.lock();
            let now = self.purge(&mut state);
            chk()?;
            match hit {
                None => {
                    let reason = Reason::PrefixProbeUnavailable;
                    return self.admit(&mut state, key, start, now, reason);
                }
                Some(h) if h >= self.hit_threshold => {
                    return self.admit(&mut state, key, start, now, Reason::ResidentPrefix)
                }
                Some(_) => {}
            }
            if state.closed {
                return Err(NaiveError::Closed);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(NaiveError::TimedOut);
            }
            // Wait up to the poll (the reference ignores the timeout's result).
            let generation = state.generation;
            state.sleepers += 1;
            let _ = self.changed.wait_for(&mut state, self.poll);
            if state.generation == generation {
                state.sleepers -= 1; // timed out: nobody reset the count
            }
            if state.closed {
                return Err(NaiveError::Closed);
            }
            drop(state);
            chk()?;
        }
    }

    fn admit(
        &self,
        state: &mut State,
        key: &[u8],
        start: u64,
        now: u64,
        reason: Reason,
    ) -> Result<NaiveLease<'_, P>, NaiveError> {
        let retain = reason.retains_session();
        if retain {
            state.reserved.insert(key.to_vec(), IN_FLIGHT);
        }
        // The reference computes `wait_sec` here (and logs it at DEBUG).
        std::hint::black_box(now.saturating_sub(start));
        Ok(NaiveLease {
            gate: self,
            retained: retain.then(|| key.to_vec()),
            reason,
        })
    }

    /// `scheduler.release(key, retain)`.
    fn release(&self, retained: Option<&[u8]>) {
        let mut state = self.state.lock();
        let now = self.now();
        if let Some(key) = retained {
            if let Some(expiry) = state.reserved.get_mut(key) {
                *expiry = now.saturating_add(self.grace_ns);
            }
        }
        self.purge_at(&mut state, now);
        self.notify_all(&mut state);
    }

    /// `finish_session(key)`.
    pub fn finish_session(&self, key: &[u8]) {
        let mut state = self.state.lock();
        state.reserved.remove(key);
        self.notify_all(&mut state);
    }

    /// The reference's only gate-wide figure: how many reservations exist.
    pub fn reserved_count(&self) -> usize {
        let mut state = self.state.lock();
        self.purge(&mut state);
        state.reserved.len()
    }

    /// Threads asleep in the condvar since the last `notify_all`.
    pub fn sleepers(&self) -> usize {
        self.state.lock().sleepers
    }

    /// Bench teardown: every waiter returns `Closed` at its next checkpoint.
    pub fn close(&self) {
        let mut state = self.state.lock();
        state.closed = true;
        self.notify_all(&mut state);
    }

    /// Moves the gate's clock forward (the memory bench lets windows expire).
    pub fn advance(&self, by: Duration) {
        self.skew_ns
            .fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Purges at the current time, which it returns (the reference reads the
    /// clock once per locked section).
    fn purge(&self, state: &mut State) -> u64 {
        let now = self.now();
        self.purge_at(state, now);
        now
    }

    /// Drops every entry with `expiry <= now`; notifies all if any went.
    fn purge_at(&self, state: &mut State, now: u64) {
        let before = state.reserved.len();
        state.reserved.retain(|_, expiry| *expiry > now);
        if state.reserved.len() != before {
            self.notify_all(state);
        }
    }

    fn notify_all(&self, state: &mut State) {
        state.generation += 1;
        state.sleepers = 0;
        self.changed.notify_all();
    }
}

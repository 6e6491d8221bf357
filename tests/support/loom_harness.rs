//! Shared pieces of the loom models (`tests/loom_*.rs`): the model runner,
//! a scripted probe on loom atomics, a manual clock, and a driver for the
//! sans-IO core with its own loom parker.
//!
//! Everything a model thread touches is a loom twin (kvgate's `sync`
//! facade, this file's atomics and locks), so loom sees every step the real
//! code takes. loom has no time: deadlines move only when a model thread
//! advances the [`ManualClock`] and calls `clock_advanced`.

#![allow(dead_code)] // each model file uses a different subset

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;
use std::time::Duration;

use kvgate::core::{Attempt, Core, LeaseToken, Notify, Step};
use kvgate::{AcquireError, Config, Gate, ManualClock, Probe};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};

pub const SEC: u64 = 1_000_000_000;
pub const PROMPT: &[u32] = &[1, 2, 3];

/// Usage at or above the 0.85 watermark, and below it.
pub const HIGH: f64 = 0.95;
pub const LOW: f64 = 0.10;
/// Prefix hit ratios either side of the 0.80 threshold.
pub const HOT: f64 = 0.95;
pub const COLD: f64 = 0.10;

/// Runs `f` under loom with the bounds from the environment
/// (`LOOM_MAX_PREEMPTIONS`, `LOOM_MAX_BRANCHES`, ...; see scripts/loom.sh)
/// and prints how many interleavings were explored. No time or permutation
/// cap is ever set here: a model either explores its whole bounded space or
/// fails.
pub fn model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    static ITERATIONS: StdAtomicUsize = StdAtomicUsize::new(0);
    let counter = StdArc::new(StdAtomicUsize::new(0));
    let seen = counter.clone();
    let builder = loom::model::Builder::new();
    let started = std::time::Instant::now();
    builder.check(move || {
        seen.fetch_add(1, StdOrdering::Relaxed);
        f();
    });
    ITERATIONS.fetch_add(counter.load(StdOrdering::Relaxed), StdOrdering::Relaxed);
    eprintln!(
        "loom model {name}: {} interleavings in {:.1?}",
        counter.load(StdOrdering::Relaxed),
        started.elapsed()
    );
}

/// The gate's configuration in the models: the reference's thresholds, a
/// poll and a grace long enough that only an explicit clock move reaches them.
pub fn config() -> Config {
    Config {
        high_watermark: 0.85,
        hit_threshold: 0.80,
        wait_poll: Duration::from_secs(100),
        idle_grace: Duration::from_secs(10),
        session_retention: Duration::from_secs(1000),
    }
}

/// A probe whose usage a model thread can change at any point (a loom
/// atomic, so the change is itself an interleaving point); the prefix hit
/// ratio is fixed per session: sessions named `hot*` are resident.
/// Optionally, usage drops to [`LOW`] once a clock reaches a time (the
/// engine freeing blocks when a window's session is gone).
#[derive(Debug)]
pub struct ScriptedProbe {
    usage_bits: AtomicU64,
    low_from: Option<(StdArc<ManualClock>, u64)>,
}

impl ScriptedProbe {
    pub fn new(usage: f64) -> StdArc<Self> {
        StdArc::new(Self {
            usage_bits: AtomicU64::new(usage.to_bits()),
            low_from: None,
        })
    }

    /// Answers `usage` until `clock` reads `at`, then [`LOW`].
    pub fn low_from(usage: f64, clock: StdArc<ManualClock>, at: u64) -> StdArc<Self> {
        StdArc::new(Self {
            usage_bits: AtomicU64::new(usage.to_bits()),
            low_from: Some((clock, at)),
        })
    }

    pub fn set_usage(&self, usage: f64) {
        self.usage_bits.store(usage.to_bits(), Ordering::SeqCst);
    }

    pub fn usage(&self) -> f64 {
        if let Some((clock, at)) = &self.low_from {
            if kvgate::Clock::now_ns(&**clock) >= *at {
                return LOW;
            }
        }
        f64::from_bits(self.usage_bits.load(Ordering::SeqCst))
    }

    pub fn hit(session: &[u8]) -> f64 {
        if session.starts_with(b"hot") {
            HOT
        } else {
            COLD
        }
    }
}

impl Probe for ScriptedProbe {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        Some(self.usage())
    }

    fn prefix_hit_ratio(&self, session: &[u8], _prompt: &[u32]) -> Option<f64> {
        Some(Self::hit(session))
    }
}

/// A blocking gate on a manual clock (starting at 1 s) and a scripted probe.
pub fn gate(usage: f64) -> (Gate, StdArc<ManualClock>, StdArc<ScriptedProbe>) {
    let clock = StdArc::new(ManualClock::new(SEC));
    let probe = ScriptedProbe::new(usage);
    (gate_on(&clock, &probe), clock, probe)
}

/// A blocking gate on `clock` asking `probe`.
pub fn gate_on(clock: &StdArc<ManualClock>, probe: &StdArc<ScriptedProbe>) -> Gate {
    Gate::with_clock(config(), probe.clone(), clock.clone()).expect("valid config")
}

/// A sans-IO core on a manual clock (starting at 1 s) and a scripted probe.
pub fn core(usage: f64) -> (StdArc<Core>, StdArc<ManualClock>, StdArc<ScriptedProbe>) {
    let core = StdArc::new(Core::new(config()).expect("valid config"));
    (core, StdArc::new(ManualClock::new(SEC)), ScriptedProbe::new(usage))
}

/// The clock's reading.
pub fn now(clock: &ManualClock) -> u64 {
    kvgate::Clock::now_ns(clock)
}

/// A one-token parker on loom's mutex and condvar, for models that drive the
/// sans-IO core themselves (the same protocol as the gate's own parker).
#[derive(Debug, Default)]
pub struct TestParker {
    token: Mutex<bool>,
    condvar: Condvar,
}

impl TestParker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sleeps until notified (loom has no timeouts: a deadline reaches a
    /// sleeper only as a notification, from a clock move or an event).
    pub fn park(&self) {
        let mut token = self.token.lock().unwrap();
        while !*token {
            token = self.condvar.wait(token).unwrap();
        }
        *token = false;
    }
}

#[derive(Debug)]
pub struct Wake(pub Arc<TestParker>);

impl Notify for Wake {
    fn notify(&self) {
        *self.0.token.lock().unwrap() = true;
        self.0.condvar.notify_one();
    }
}

/// An attempt begun on a core, with the parker its notifier wakes.
pub struct Driven {
    pub attempt: Attempt,
    pub parker: Arc<TestParker>,
    /// Clock reading the attempt began at: with `Admission::wait`, tells
    /// the time of the admitting decision.
    pub started: u64,
}

/// Begins an attempt of `session` at the clock's time.
pub fn begin(core: &Core, clock: &ManualClock, session: &[u8]) -> Result<Driven, AcquireError> {
    let parker = TestParker::new();
    let now = kvgate::Clock::now_ns(clock);
    let attempt = core.begin(session, PROMPT.len(), now, None, Box::new(Wake(parker.clone())))?;
    Ok(Driven {
        attempt,
        parker,
        started: now,
    })
}

/// Drives a begun attempt to its end the way the blocking gate does: probes
/// answered by `probe`, time read from `clock`, sleeps on the parker.
/// A `Sleep` whose deadline the clock has reached returns at once.
pub fn drive(
    core: &Core,
    clock: &ManualClock,
    probe: &ScriptedProbe,
    mut d: Driven,
) -> Result<LeaseToken, AcquireError> {
    let session = d.attempt.session_id().to_vec();
    let now = || kvgate::Clock::now_ns(clock);
    let mut step = d.attempt.start(core, now());
    loop {
        step = match step {
            Step::ProbeUsage => d.attempt.on_usage(core, probe.kv_cache_usage(&session), now()),
            Step::ProbePrefix => {
                let hit = probe.prefix_hit_ratio(&session, PROMPT);
                d.attempt.on_prefix(core, hit, now())
            }
            Step::Sleep { until_ns } => {
                if now() < until_ns {
                    d.parker.park();
                }
                d.attempt.on_wake(core, now())
            }
            Step::Admitted(token) => return Ok(token),
            Step::Failed(err) => return Err(err),
        };
    }
}

/// `begin` then `drive`.
pub fn acquire(
    core: &Core,
    clock: &ManualClock,
    probe: &ScriptedProbe,
    session: &[u8],
) -> Result<LeaseToken, AcquireError> {
    drive(core, clock, probe, begin(core, clock, session)?)
}

//! Shared pieces of the loom models (`tests/loom_*.rs`): the model runner,
//! a scripted probe on loom atomics, a manual clock, and a driver for the
//! sans-IO core with its own loom sleeper.
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
use kvgate::{AcquireError, AdmissionMode, Config, EngineCapacity, Gate, ManualClock, Probe};
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
        admission: AdmissionMode::Reference,
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
    /// The capacity probe's answer in tokens (working-set models), if any.
    capacity_tokens: Option<u64>,
}

impl ScriptedProbe {
    pub fn new(usage: f64) -> StdArc<Self> {
        StdArc::new(Self {
            usage_bits: AtomicU64::new(usage.to_bits()),
            low_from: None,
            capacity_tokens: None,
        })
    }

    /// Answers `usage`, and a KV capacity of `tokens` in blocks of one.
    pub fn with_capacity(usage: f64, tokens: u64) -> StdArc<Self> {
        StdArc::new(Self {
            usage_bits: AtomicU64::new(usage.to_bits()),
            low_from: None,
            capacity_tokens: Some(tokens),
        })
    }

    /// Answers `usage` until `clock` reads `at`, then [`LOW`].
    pub fn low_from(usage: f64, clock: StdArc<ManualClock>, at: u64) -> StdArc<Self> {
        StdArc::new(Self {
            usage_bits: AtomicU64::new(usage.to_bits()),
            low_from: Some((clock, at)),
            capacity_tokens: None,
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

    fn kv_cache_capacity(&self, _session: &[u8]) -> Option<EngineCapacity> {
        self.capacity_tokens
            .map(|tokens| EngineCapacity::new(tokens, 1, 1000.0))
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

/// A sans-IO core on virtual time (starting at 1 s) and a scripted probe.
pub fn core(usage: f64) -> (StdArc<Core>, StdArc<VirtualTime>, StdArc<ScriptedProbe>) {
    let core = StdArc::new(Core::new(config()).expect("valid config"));
    let time = VirtualTime::new(StdArc::new(ManualClock::new(SEC)));
    (core, time, ScriptedProbe::new(usage))
}

/// The clock's reading.
pub fn now(clock: &ManualClock) -> u64 {
    kvgate::Clock::now_ns(clock)
}

/// A one-token sleeper on loom's mutex and condvar, for models that drive the
/// sans-IO core themselves (the same protocol as the gate's own sleeper).
#[derive(Debug, Default)]
pub struct TestSleeper {
    token: Mutex<bool>,
    condvar: Condvar,
}

impl TestSleeper {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sleeps until notified (loom has no timeouts: a deadline reaches a
    /// sleeper only as a notification, from [`VirtualTime`] or an event).
    pub fn wait(&self) {
        let mut token = self.token.lock().unwrap();
        while !*token {
            token = self.condvar.wait(token).unwrap();
        }
        *token = false;
    }

    fn wake(&self) {
        *self.token.lock().unwrap() = true;
        self.condvar.notify_one();
    }
}

#[derive(Debug)]
pub struct Wake(pub Arc<TestSleeper>);

impl Notify for Wake {
    fn notify(&self) {
        self.0.wake();
    }
}

/// Virtual time for models that drive the core: a manual clock plus the
/// sleepers' deadlines, so that moving the clock wakes exactly the sleepers
/// whose deadline passed, as a real timed wait would (the tokio time-driver
/// tests' `process_at_time`). Unlike `clock_advanced`, which wakes everyone,
/// this leaves a sleeper with a deadline too late asleep, which is what makes
/// a wrong deadline (e.g. a driver sleeping past the next deadline) a deadlock.
#[derive(Debug)]
pub struct VirtualTime {
    pub clock: StdArc<ManualClock>,
    sleepers: Mutex<Vec<(u64, Arc<TestSleeper>)>>,
}

impl VirtualTime {
    pub fn new(clock: StdArc<ManualClock>) -> StdArc<Self> {
        StdArc::new(Self {
            clock,
            sleepers: Mutex::new(Vec::new()),
        })
    }

    pub fn now(&self) -> u64 {
        now(&self.clock)
    }

    /// Moves the clock to `t`, then wakes every sleeper whose deadline is at or before `t`.
    pub fn advance_to(&self, t: u64) {
        self.clock.set_ns(t);
        let sleepers = self.sleepers.lock().unwrap();
        for (until, sleeper) in sleepers.iter() {
            if *until <= t {
                sleeper.wake();
            }
        }
    }

    /// Sleeps until notified or until the clock reaches `until`. The clock is
    /// read after registering, under the registry lock, so a move that
    /// registered sleepers missed is seen here.
    fn sleep(&self, sleeper: &Arc<TestSleeper>, until: u64) {
        {
            let mut sleepers = self.sleepers.lock().unwrap();
            if self.now() >= until {
                return;
            }
            sleepers.push((until, sleeper.clone()));
        }
        sleeper.wait();
        self.sleepers
            .lock()
            .unwrap()
            .retain(|(_, p)| !Arc::ptr_eq(p, sleeper));
    }
}

/// An attempt begun on a core, with the sleeper its notifier wakes.
pub struct Driven {
    pub attempt: Attempt<StdArc<Core>>,
    pub sleeper: Arc<TestSleeper>,
    /// Clock reading the attempt began at: with `Admission::wait`, tells
    /// the time of the admitting decision.
    pub started: u64,
}

/// Begins an attempt of `session` at the clock's time.
pub fn begin(
    core: &StdArc<Core>,
    time: &VirtualTime,
    session: &[u8],
) -> Result<Driven, AcquireError> {
    let sleeper = TestSleeper::new();
    let now = time.now();
    let attempt = Attempt::begin(
        core.clone(),
        session,
        PROMPT.len(),
        now,
        None,
        Box::new(Wake(sleeper.clone())),
    )?;
    Ok(Driven {
        attempt,
        sleeper,
        started: now,
    })
}

/// Drives a begun attempt to its end the way the blocking gate does: probes
/// answered by `probe`, time read from `time`, sleeps on the sleeper until
/// notified or the deadline the core asked for.
pub fn drive(
    core: &Core,
    time: &VirtualTime,
    probe: &ScriptedProbe,
    mut d: Driven,
) -> Result<LeaseToken, AcquireError> {
    let step = d.attempt.start(time.now()).unwrap();
    drive_from(core, time, probe, d, step)
}

/// Drives an attempt on from `step` (see [`drive`]).
pub fn drive_from(
    core: &Core,
    time: &VirtualTime,
    probe: &ScriptedProbe,
    mut d: Driven,
    mut step: Step,
) -> Result<LeaseToken, AcquireError> {
    let session = d.attempt.session_id().to_vec();
    loop {
        step = match step {
            Step::ProbeUsage => {
                let usage = probe.kv_cache_usage(&session);
                let capacity = probe.kv_cache_capacity(&session);
                d.attempt
                    .on_cache_state(usage, capacity, time.now())
                    .unwrap()
            }
            Step::ProbePrefix => {
                let hit = probe.prefix_hit_ratio(&session, PROMPT);
                d.attempt.on_prefix(hit, time.now()).unwrap()
            }
            Step::Sleep { until_ns } => {
                // Every sleeper folds the core's deadline in (the blocking
                // gate lets one do it; either way someone wakes for it).
                let until = core.next_deadline().map_or(until_ns, |t| t.min(until_ns));
                time.sleep(&d.sleeper, until);
                d.attempt.on_wake(time.now()).unwrap()
            }
            Step::Admitted(token) => return Ok(token),
            Step::Failed(err) => return Err(err),
        };
    }
}

/// `begin` then `drive`.
pub fn acquire(
    core: &StdArc<Core>,
    time: &VirtualTime,
    probe: &ScriptedProbe,
    session: &[u8],
) -> Result<LeaseToken, AcquireError> {
    drive(core, time, probe, begin(core, time, session)?)
}

/// Begins a cold attempt and drives it, on this thread, to its first sleep
/// (pressure: usage at or above the watermark, prefix below the threshold).
pub fn asleep(core: &StdArc<Core>, time: &VirtualTime, session: &[u8]) -> (Driven, Step) {
    let mut d = begin(core, time, session).expect("not closed");
    assert!(matches!(
        d.attempt.start(time.now()).unwrap(),
        Step::ProbeUsage
    ));
    let step = d.attempt.on_usage(Some(HIGH), time.now()).unwrap();
    assert!(matches!(step, Step::ProbePrefix), "{step:?}");
    let step = d.attempt.on_prefix(Some(COLD), time.now()).unwrap();
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    (d, step)
}

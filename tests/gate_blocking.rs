//! Integration tests of the blocking [`kvgate::Gate`] driven by real threads.
//!
//! No test asserts a tight timing target. Waits are bounded by generous
//! patience limits only so that a bug hangs a test for seconds, not forever.
//! "Promptly" means "well under the configured poll interval": with a
//! `wait_poll` of 10 s, a waiter that was really woken returns in
//! milliseconds, and one that was not returns only after the poll. The tests
//! tell the two apart with a bound of half the poll. Exact time is tested
//! with a [`ManualClock`].

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvgate::{
    AcquireError, AdmissionMode, Config, Gate, Lease, ManualClock, Probe, Reason, ReservationState,
};

// ---------------------------------------------------------------------------
// Knobs
// ---------------------------------------------------------------------------

/// Poll interval of most gates: a waiter nobody wakes sleeps this long.
const POLL: Duration = Duration::from_secs(10);
/// "Promptly": a woken waiter returns well within this. It is half the poll,
/// so a waiter that only came back at its poll fails the test.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a helper waits for a state the test expects before failing.
/// Never reached when the gate is right.
const PATIENCE: Duration = Duration::from_secs(30);

const PROMPT_IDS: &[u32] = &[11, 12, 13, 14];

const HIGH: f64 = 0.90;
const LOW: f64 = 0.40;
const HOT: f64 = 0.95;
const COLD: f64 = 0.10;

fn config() -> Config {
    Config {
        admission: AdmissionMode::Reference,
        high_watermark: 0.85,
        hit_threshold: 0.80,
        wait_poll: POLL,
        idle_grace: Duration::from_secs(60),
        session_retention: Duration::from_secs(600),
    }
}

// ---------------------------------------------------------------------------
// Scripted probe
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Usage,
    Prefix,
}

type Callback = Arc<dyn Fn(Kind, &[u8]) + Send + Sync>;

/// A probe call the test holds until it answers.
struct HeldCall {
    entered: Sender<()>,
    answer: Receiver<Option<f64>>,
}

/// The test's end of a held probe call.
struct Hold {
    entered: Receiver<()>,
    answer: Sender<Option<f64>>,
}

impl Hold {
    /// Waits until the held call is inside the probe.
    fn wait_entered(&self) {
        self.entered
            .recv_timeout(PATIENCE)
            .expect("the held probe call was never made");
    }

    /// Lets the held call return `answer`.
    fn answer(self, answer: Option<f64>) {
        self.answer
            .send(answer)
            .expect("the held probe call is waiting");
    }
}

#[derive(Default)]
struct ProbeState {
    /// Engine-wide KV usage the usage probe answers.
    usage: Option<f64>,
    /// Prefix hit ratio per session; `default_hit` for the others.
    hit: HashMap<Vec<u8>, Option<f64>>,
    default_hit: Option<f64>,
    calls: HashMap<(Kind, Vec<u8>), usize>,
    holds: HashMap<(Kind, Vec<u8>), VecDeque<HeldCall>>,
    /// Number of upcoming calls that panic, per (kind, session).
    panics: HashMap<(Kind, Vec<u8>), usize>,
    callback: Option<Callback>,
}

/// A probe the test scripts: usage and hit ratios it can change at any time,
/// per-session call counts, calls it can hold mid-probe, calls that panic and
/// a callback run inside every call (without any probe lock held).
#[derive(Default)]
struct ScriptedProbe {
    state: Mutex<ProbeState>,
}

impl ScriptedProbe {
    fn new(usage: Option<f64>, default_hit: Option<f64>) -> Arc<Self> {
        let probe = Arc::new(Self::default());
        {
            let mut st = probe.lock();
            st.usage = usage;
            st.default_hit = default_hit;
        }
        probe
    }

    fn lock(&self) -> MutexGuard<'_, ProbeState> {
        // Scripted panics never happen with the lock held, but a failing
        // assertion elsewhere must not hide behind a poisoned lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_usage(&self, usage: Option<f64>) {
        self.lock().usage = usage;
    }

    fn set_hit(&self, session: &str, hit: Option<f64>) {
        self.lock().hit.insert(session.as_bytes().to_vec(), hit);
    }

    fn calls(&self, kind: Kind, session: &str) -> usize {
        self.lock()
            .calls
            .get(&(kind, session.as_bytes().to_vec()))
            .copied()
            .unwrap_or(0)
    }

    /// Holds the next not-yet-held call of `kind` for `session`.
    fn hold_next(&self, kind: Kind, session: &str) -> Hold {
        let (entered_tx, entered_rx) = mpsc::channel();
        let (answer_tx, answer_rx) = mpsc::channel();
        self.lock()
            .holds
            .entry((kind, session.as_bytes().to_vec()))
            .or_default()
            .push_back(HeldCall {
                entered: entered_tx,
                answer: answer_rx,
            });
        Hold {
            entered: entered_rx,
            answer: answer_tx,
        }
    }

    /// Makes the next call of `kind` for `session` panic.
    fn panic_next(&self, kind: Kind, session: &str) {
        *self
            .lock()
            .panics
            .entry((kind, session.as_bytes().to_vec()))
            .or_default() += 1;
    }

    fn set_callback(&self, callback: Option<Callback>) {
        self.lock().callback = callback;
    }

    fn call(&self, kind: Kind, session: &[u8]) -> Option<f64> {
        let key = (kind, session.to_vec());
        let (value, held, panic, callback) = {
            let mut st = self.lock();
            *st.calls.entry(key.clone()).or_default() += 1;
            let value = match kind {
                Kind::Usage => st.usage,
                Kind::Prefix => st.hit.get(session).copied().unwrap_or(st.default_hit),
            };
            let held = st.holds.get_mut(&key).and_then(VecDeque::pop_front);
            let panic = match st.panics.get_mut(&key) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            (value, held, panic, st.callback.clone())
        };
        if let Some(callback) = callback {
            callback(kind, session);
        }
        if panic {
            panic!(
                "scripted {kind:?} probe panic for {}",
                String::from_utf8_lossy(session)
            );
        }
        match held {
            Some(held) => {
                let _ = held.entered.send(());
                held.answer.recv().unwrap_or(value)
            }
            None => value,
        }
    }
}

impl Probe for ScriptedProbe {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        self.call(Kind::Usage, session)
    }

    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64> {
        assert_eq!(prompt, PROMPT_IDS, "the probe gets the acquired prompt");
        self.call(Kind::Prefix, session)
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn gate_with(config: Config, probe: &Arc<ScriptedProbe>) -> Gate {
    Gate::new(config, probe.clone()).expect("valid config")
}

fn manual_gate(config: Config, probe: &Arc<ScriptedProbe>) -> (Gate, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let gate = Gate::with_clock(config, probe.clone(), clock.clone()).expect("valid config");
    (gate, clock)
}

fn acquire(gate: &Gate, session: &str) -> Result<Lease, AcquireError> {
    gate.acquire(session.as_bytes(), PROMPT_IDS)
}

fn admit(gate: &Gate, session: &str) -> Lease {
    acquire(gate, session).unwrap_or_else(|e| panic!("{session} not admitted: {e:?}"))
}

type Outcome = (Result<Lease, AcquireError>, Instant);

/// Runs `acquire` on its own thread; the thread returns the result and when.
fn spawn_acquire(gate: &Gate, session: &str) -> JoinHandle<Outcome> {
    let gate = gate.clone();
    let session = session.to_owned();
    thread::spawn(move || {
        let result = acquire(&gate, &session);
        (result, Instant::now())
    })
}

/// Joins `handle`, failing the test if the thread does not end in time.
fn join<T>(handle: JoinHandle<T>, what: &str) -> T {
    let start = Instant::now();
    while !handle.is_finished() {
        assert!(start.elapsed() < PATIENCE, "{what}: still running");
        thread::sleep(Duration::from_millis(2));
    }
    handle.join().expect("thread panicked")
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting until {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

fn wait_sleeping(gate: &Gate, n: u64) {
    wait_until(&format!("{n} attempts sleep"), || {
        gate.stats().waiting_attempts == n
    });
}

fn reservation(gate: &Gate, session: &str) -> ReservationState {
    gate.session_stats(session.as_bytes())
        .unwrap_or_else(|| panic!("{session} is tracked"))
        .reservation
}

/// The session's reservation is an idle grace window.
fn assert_in_grace(gate: &Gate, session: &str) {
    let state = reservation(gate, session);
    assert!(
        matches!(state, ReservationState::Grace { .. }),
        "{session} should be in its grace window, is {state:?}"
    );
}

fn assert_prompt(returned: Instant, since: Instant, what: &str) {
    let took = returned.saturating_duration_since(since);
    assert!(
        took < PROMPT,
        "{what} took {took:?}: not woken (poll is {POLL:?})"
    );
}

fn expect_err(outcome: Result<Lease, AcquireError>, expected: AcquireError) {
    match outcome {
        Err(e) => assert_eq!(e, expected),
        Ok(lease) => panic!("expected {expected:?}, got a lease {:?}", lease.admission()),
    }
}

// ---------------------------------------------------------------------------
// 1. The decision table through the gate
// ---------------------------------------------------------------------------

#[test]
fn unavailable_or_invalid_usage_admits_open_without_prefix_probe() {
    let probe = ScriptedProbe::new(None, Some(COLD));
    let gate = gate_with(config(), &probe);
    let answers = [
        None,
        Some(f64::NAN),
        Some(1.5),
        Some(-0.1),
        Some(f64::INFINITY),
    ];
    for (i, usage) in answers.into_iter().enumerate() {
        probe.set_usage(usage);
        let session = format!("s{i}");
        let lease = admit(&gate, &session);
        let a = lease.admission();
        assert_eq!(a.reason, Reason::Open, "usage {usage:?}");
        assert_eq!(a.usage, None, "usage {usage:?} is not a value");
        assert_eq!(a.hit_ratio, None);
        assert!(!a.retain_session);
        assert!(!a.waited);
        assert_eq!(probe.calls(Kind::Usage, &session), 1);
        assert_eq!(probe.calls(Kind::Prefix, &session), 0, "usage {usage:?}");
        assert_eq!(reservation(&gate, &session), ReservationState::None);
        lease.release();
    }
    let s = gate.stats();
    assert_eq!(s.admissions(Reason::Open), 5);
    assert_eq!(s.total_admissions(), 5);
    assert_eq!(s.usage_probe_calls, 5);
    assert_eq!(s.usage_probe_unavailable, 5);
    assert_eq!(s.usage_probe_invalid, 4);
    assert_eq!(s.prefix_probe_calls, 0);
    assert_eq!(s.reserved_in_flight + s.reserved_in_grace, 0);
}

#[test]
fn usage_below_watermark_admits_open_without_prefix_probe() {
    let probe = ScriptedProbe::new(Some(0.8499), Some(COLD));
    let gate = gate_with(config(), &probe);
    let lease = admit(&gate, "a");
    assert_eq!(lease.reason(), Reason::Open);
    assert_eq!(lease.admission().usage, Some(0.8499));
    assert!(!lease.admission().retain_session);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 0);
    assert_eq!(reservation(&gate, "a"), ReservationState::None);
    assert_eq!(gate.stats().reserved_in_flight, 0);
}

#[test]
fn usage_equal_to_watermark_is_pressure() {
    let probe = ScriptedProbe::new(Some(0.85), None);
    probe.set_hit("hot", Some(HOT));
    let gate = gate_with(config(), &probe);

    // Prefix probe unavailable: only reachable under pressure.
    let lease = admit(&gate, "unknown");
    assert_eq!(lease.reason(), Reason::PrefixProbeUnavailable);
    assert_eq!(lease.admission().usage, Some(0.85));
    assert_eq!(probe.calls(Kind::Prefix, "unknown"), 1);

    let hot = admit(&gate, "hot");
    assert_eq!(hot.reason(), Reason::ResidentPrefix);
    assert_eq!(probe.calls(Kind::Prefix, "hot"), 1);
    assert_eq!(gate.stats().admissions(Reason::Open), 0);
}

#[test]
fn pressure_with_reservation_admits_reserved_session_without_prefix_probe() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    admit(&gate, "a").release();
    assert_in_grace(&gate, "a");
    assert_eq!(probe.calls(Kind::Prefix, "a"), 1);

    // Now cold: only the reservation can admit it.
    probe.set_hit("a", Some(COLD));
    let lease = admit(&gate, "a");
    let a = lease.admission();
    assert_eq!(a.reason, Reason::ReservedSession);
    assert!(a.retain_session);
    assert_eq!(a.usage, Some(HIGH));
    assert_eq!(a.hit_ratio, None, "the prefix was not asked");
    assert_eq!(probe.calls(Kind::Prefix, "a"), 1, "no prefix probe");
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    let s = gate.stats();
    assert_eq!(s.admissions(Reason::ReservedSession), 1);
    assert_eq!(s.reserved_in_flight, 1);
    assert_eq!(s.reserved_in_grace, 0);
}

#[test]
fn pressure_with_unavailable_prefix_admits_without_creating_a_reservation() {
    let probe = ScriptedProbe::new(Some(HIGH), None);
    probe.set_hit("nan", Some(f64::NAN));
    probe.set_hit("big", Some(1.5));
    let gate = gate_with(config(), &probe);
    for session in ["none", "nan", "big"] {
        let lease = admit(&gate, session);
        let a = lease.admission();
        assert_eq!(a.reason, Reason::PrefixProbeUnavailable, "{session}");
        assert!(!a.retain_session);
        assert_eq!(a.hit_ratio, None);
        assert_eq!(probe.calls(Kind::Prefix, session), 1);
        assert_eq!(reservation(&gate, session), ReservationState::None);
        lease.release();
        assert_eq!(reservation(&gate, session), ReservationState::None);
    }
    let s = gate.stats();
    assert_eq!(s.admissions(Reason::PrefixProbeUnavailable), 3);
    assert_eq!(s.prefix_probe_unavailable, 3);
    assert_eq!(s.prefix_probe_invalid, 2);
    assert_eq!(s.reserved_in_flight + s.reserved_in_grace, 0);
}

#[test]
fn hit_ratio_equal_to_threshold_is_resident_and_reserves_in_flight() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(0.80));
    let gate = gate_with(config(), &probe);
    let lease = admit(&gate, "a");
    let a = lease.admission();
    assert_eq!(a.reason, Reason::ResidentPrefix);
    assert_eq!(a.hit_ratio, Some(0.80));
    assert!(a.retain_session);
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    assert_eq!(gate.stats().reserved_in_flight, 1);
    lease.release();
    assert_in_grace(&gate, "a");
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 1));
}

#[test]
fn hit_ratio_below_threshold_blocks() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(0.7999));
    let gate = gate_with(config(), &probe);
    let waiter = spawn_acquire(&gate, "a");
    wait_sleeping(&gate, 1);
    assert!(!waiter.is_finished());
    let ss = gate.session_stats(b"a").unwrap();
    assert!(ss.attempt_pending);
    assert_eq!(ss.active_leases, 0);
    assert_eq!(ss.reservation, ReservationState::None);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 1);
    let s = gate.stats();
    assert_eq!((s.pending_attempts, s.total_admissions()), (1, 0));

    assert!(gate.cancel_session(b"a"));
    let (outcome, _) = join(waiter, "cancelled waiter");
    expect_err(outcome, AcquireError::Cancelled);
}

// ---------------------------------------------------------------------------
// 2. Wake-ups
// ---------------------------------------------------------------------------

#[test]
fn lease_release_wakes_a_waiter_long_before_the_poll() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease_a = admit(&gate, "a");
    assert_eq!(lease_a.reason(), Reason::ResidentPrefix);

    let waiter = spawn_acquire(&gate, "b");
    wait_sleeping(&gate, 1);
    assert_eq!(probe.calls(Kind::Usage, "b"), 1);
    // Capacity frees up on the engine; only the release tells the gate.
    probe.set_usage(Some(LOW));
    let released = Instant::now();
    lease_a.release();

    let (outcome, returned) = join(waiter, "waiter");
    let lease_b = outcome.expect("admitted after the release");
    assert_prompt(returned, released, "waiter after a release");
    let a = lease_b.admission();
    assert_eq!(a.reason, Reason::Open);
    assert!(a.waited);
    assert_eq!(a.usage, Some(LOW));
    assert_eq!(probe.calls(Kind::Usage, "b"), 2, "probed usage again");
    assert_eq!(probe.calls(Kind::Prefix, "b"), 1);
    let ss = gate.session_stats(b"b").unwrap();
    assert_eq!((ss.waits, ss.admissions), (1, 1));
    assert!(ss.wait_time > Duration::ZERO);
    let s = gate.stats();
    assert_eq!((s.waits, s.waiting_attempts, s.pending_attempts), (1, 0, 0));
    assert_eq!(s.longest_wait, a.wait, "the only wait is the longest");
    assert!(gate.stats().to_prometheus().contains(&format!(
        "kvgate_longest_wait_seconds {}",
        a.wait.as_secs_f64()
    )));
}

#[test]
fn release_under_persisting_pressure_reprobes_and_waits_again() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease_a = admit(&gate, "a");
    let waiter = spawn_acquire(&gate, "b");
    wait_sleeping(&gate, 1);

    lease_a.release();
    // Woken, it probes both again from scratch and goes back to sleep.
    wait_until("the waiter probed again", || {
        probe.calls(Kind::Prefix, "b") == 2
    });
    wait_sleeping(&gate, 1);
    assert_eq!(probe.calls(Kind::Usage, "b"), 2);
    assert!(!waiter.is_finished());

    probe.set_usage(Some(LOW));
    let finished = Instant::now();
    assert!(gate.finish_session(b"a").is_some());
    let (outcome, returned) = join(waiter, "waiter");
    assert_eq!(outcome.unwrap().reason(), Reason::Open);
    assert_prompt(returned, finished, "waiter after finish_session");
}

#[test]
fn one_release_admits_every_waiter_once_usage_dropped() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease_a = admit(&gate, "a");
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let h = spawn_acquire(&gate, &format!("w{i}"));
            wait_sleeping(&gate, i + 1);
            h
        })
        .collect();
    probe.set_usage(Some(LOW));
    let released = Instant::now();
    lease_a.release();
    // Leases are kept until every waiter returned: their releases must not
    // be what wakes the next waiter.
    let mut leases = Vec::new();
    for (i, h) in waiters.into_iter().enumerate() {
        let (outcome, returned) = join(h, "waiter");
        let lease = outcome.expect("admitted");
        assert_eq!(lease.reason(), Reason::Open);
        // The one woken passes the wake-up on when admitted: nobody polls.
        assert_prompt(returned, released, &format!("waiter w{i}"));
        leases.push(lease);
    }
    let s = gate.stats();
    assert_eq!(s.admissions(Reason::Open), 3);
    assert_eq!((s.releases, s.active_leases), (1, 3));
    assert_eq!((s.waiting_attempts, s.pending_attempts), (0, 0));
    drop(leases);
}

#[test]
fn finish_session_wakes_a_waiter() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(config(), &probe); // grace 60 s: no expiry here
    admit(&gate, "a").release();
    assert_in_grace(&gate, "a");

    let waiter = spawn_acquire(&gate, "b");
    wait_sleeping(&gate, 1);
    probe.set_usage(Some(LOW));
    let finished = Instant::now();
    assert!(gate.finish_session(b"a").is_some());
    let (outcome, returned) = join(waiter, "waiter");
    let lease = outcome.expect("admitted after finish_session");
    assert_eq!(lease.reason(), Reason::Open);
    assert!(lease.admission().waited);
    assert_prompt(returned, finished, "waiter after finish_session");
    assert!(
        gate.session_stats(b"a").is_none(),
        "a finished idle session is forgotten"
    );
    let s = gate.stats();
    assert_eq!((s.sessions_finished, s.reserved_in_grace), (1, 0));
}

#[test]
fn grace_expiry_wakes_a_waiter_with_nobody_else_calling() {
    const GRACE: Duration = Duration::from_secs(2);
    const LONG_POLL: Duration = Duration::from_secs(30);
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(
        Config {
            idle_grace: GRACE,
            wait_poll: LONG_POLL,
            ..config()
        },
        &probe,
    );
    let lease_a = admit(&gate, "a");
    assert_eq!(lease_a.reason(), Reason::ResidentPrefix);
    let before_release = Instant::now();
    lease_a.release(); // a's window ends at least GRACE after `before_release`

    let waiter = spawn_acquire(&gate, "b");
    // Observe through the probe only: no call into the gate from here on.
    wait_until("b probed its prefix", || {
        probe.calls(Kind::Prefix, "b") == 1
    });
    assert!(
        before_release.elapsed() < GRACE,
        "precondition: b must reach its wait before a's window ends"
    );
    // b's pass already saw pressure and will sleep; capacity frees up, but
    // only the expiry of a's window is there to tell it.
    probe.set_usage(Some(LOW));

    let (outcome, returned) = join(waiter, "waiter");
    let lease_b = outcome.expect("admitted after the expiry");
    assert_eq!(lease_b.reason(), Reason::Open);
    assert!(lease_b.admission().waited);
    let after = returned.saturating_duration_since(before_release);
    assert!(after >= GRACE, "woken before the expiry ({after:?})");
    assert!(
        after < GRACE + LONG_POLL / 2,
        "woken {after:?} after the release: at its poll, not at the expiry"
    );
    assert_eq!(probe.calls(Kind::Usage, "b"), 2);
    let s = gate.stats();
    assert_eq!(s.grace_expired, 1);
    assert_eq!(s.reserved_in_grace, 0);
    assert_eq!(reservation(&gate, "a"), ReservationState::None);
}

// ---------------------------------------------------------------------------
// 3-5. Ownership windows
// ---------------------------------------------------------------------------

#[test]
fn released_retaining_lease_opens_grace_window_that_readmits_without_probe() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease = admit(&gate, "a");
    assert_eq!(lease.reason(), Reason::ResidentPrefix);
    lease.release();
    match reservation(&gate, "a") {
        ReservationState::Grace { remaining } => {
            assert!(remaining > Duration::ZERO && remaining <= Duration::from_secs(60));
        }
        other => panic!("expected a grace window, got {other:?}"),
    }
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 1));

    // The tool-result turn: cold now, but it owns the window.
    probe.set_hit("a", Some(COLD));
    let lease = admit(&gate, "a");
    assert_eq!(lease.reason(), Reason::ReservedSession);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 1);
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (1, 0));
}

#[test]
fn grace_window_holds_until_release_plus_grace_exactly() {
    const GRACE: Duration = Duration::from_secs(10);
    const NS: Duration = Duration::from_nanos(1);
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let (gate, clock) = manual_gate(
        Config {
            idle_grace: GRACE,
            ..config()
        },
        &probe,
    );
    let lease = admit(&gate, "a");
    clock.advance(Duration::from_secs(3));
    lease.release(); // at T
    clock.advance(GRACE - NS);
    gate.clock_advanced();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::Grace { remaining: NS }
    );

    probe.set_hit("a", Some(COLD));
    let lease = admit(&gate, "a"); // at T + grace - 1ns: still owned
    assert_eq!(lease.reason(), Reason::ReservedSession);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 1);
    lease.release(); // at T2: a new window up to T2 + grace

    clock.advance(GRACE - NS);
    gate.clock_advanced();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::Grace { remaining: NS }
    );
    clock.advance(NS);
    gate.clock_advanced();
    // At T2 + grace exactly, without any earlier purge: the window is over,
    // so a cold turn has to probe and (zero timeout) cannot wait.
    expect_err(
        gate.acquire_timeout(b"a", PROMPT_IDS, Duration::ZERO),
        AcquireError::TimedOut,
    );
    assert_eq!(probe.calls(Kind::Prefix, "a"), 2);
    assert_eq!(reservation(&gate, "a"), ReservationState::None);
    assert_eq!(gate.stats().grace_expired, 1);

    probe.set_hit("a", Some(HOT));
    let lease = admit(&gate, "a");
    assert_eq!(lease.reason(), Reason::ResidentPrefix);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 3);
}

#[test]
fn grace_window_is_gone_at_release_plus_grace_in_session_stats() {
    const GRACE: Duration = Duration::from_millis(200);
    const NS: Duration = Duration::from_nanos(1);
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let (gate, clock) = manual_gate(
        Config {
            idle_grace: GRACE,
            ..config()
        },
        &probe,
    );
    admit(&gate, "a").release();
    clock.advance(GRACE - NS);
    assert_in_grace(&gate, "a");
    clock.advance(NS);
    assert_eq!(reservation(&gate, "a"), ReservationState::None);
    let s = gate.stats();
    assert_eq!((s.grace_expired, s.reserved_in_grace), (1, 0));
    // The next turn under pressure has to probe its prefix.
    let lease = admit(&gate, "a");
    assert_eq!(lease.reason(), Reason::ResidentPrefix);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 2);
}

#[test]
fn manual_clock_moves_deadlines_expiries_and_polls_of_sleeping_waiters() {
    const GRACE: Duration = Duration::from_secs(5);
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let (gate, clock) = manual_gate(
        Config {
            idle_grace: GRACE,
            wait_poll: POLL,
            ..config()
        },
        &probe,
    );
    admit(&gate, "a").release(); // window until S + 5 s
    let b = spawn_acquire(&gate, "b");
    wait_sleeping(&gate, 1);
    let c = {
        let gate = gate.clone();
        thread::spawn(move || gate.acquire_timeout(b"c", PROMPT_IDS, Duration::from_secs(3)))
    };
    wait_sleeping(&gate, 2);

    // S + 3 s: c's deadline. Only the clock's owner can tell the sleepers.
    clock.advance(Duration::from_secs(3));
    gate.clock_advanced();
    expect_err(join(c, "c"), AcquireError::TimedOut);
    wait_sleeping(&gate, 1);
    assert_eq!(probe.calls(Kind::Usage, "b"), 1);

    // S + 5 s: a's window expires; b is told, probes again and gets in.
    probe.set_usage(Some(LOW));
    clock.advance(Duration::from_secs(2));
    gate.clock_advanced();
    let (outcome, _) = join(b, "b");
    let lease_b = outcome.expect("admitted at the expiry");
    assert_eq!(lease_b.reason(), Reason::Open);
    assert_eq!(lease_b.admission().wait, GRACE);
    assert_eq!(probe.calls(Kind::Usage, "b"), 2);
    assert_eq!(gate.stats().grace_expired, 1);

    // A waiter nobody wakes probes again at its poll, in virtual time.
    probe.set_usage(Some(HIGH));
    let d = spawn_acquire(&gate, "d");
    wait_sleeping(&gate, 1);
    clock.advance(POLL);
    gate.clock_advanced();
    wait_until("d probed again at its poll", || {
        probe.calls(Kind::Prefix, "d") == 2
    });
    wait_sleeping(&gate, 1);
    assert!(gate.cancel_session(b"d"));
    expect_err(join(d, "d").0, AcquireError::Cancelled);
}

#[test]
fn overlapping_retaining_leases_keep_the_window_in_flight_until_both_are_released() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let first = admit(&gate, "a");
    assert_eq!(first.reason(), Reason::ResidentPrefix);
    probe.set_hit("a", Some(COLD));
    let second = admit(&gate, "a");
    assert_eq!(second.reason(), Reason::ReservedSession);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 1);
    let ss = gate.session_stats(b"a").unwrap();
    assert_eq!(ss.reservation, ReservationState::InFlight { leases: 2 });
    assert_eq!((ss.active_leases, ss.num_preempted), (2, 0));
    assert_eq!(
        gate.stats().reserved_in_flight,
        1,
        "one session, one window"
    );

    first.release();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    assert_eq!(gate.stats().reserved_in_grace, 0);
    second.release();
    assert_in_grace(&gate, "a");
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 1));
}

#[test]
fn release_after_finish_session_does_not_bring_the_reservation_back() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let first = admit(&gate, "a");
    assert_eq!(first.reason(), Reason::ResidentPrefix);
    probe.set_hit("a", Some(COLD));
    let second = admit(&gate, "a");
    assert_eq!(second.reason(), Reason::ReservedSession);
    probe.set_usage(Some(LOW));
    let open = admit(&gate, "a"); // keeps the record alive throughout
    assert_eq!(open.reason(), Reason::Open);

    assert!(gate.finish_session(b"a").is_some());
    let ss = gate.session_stats(b"a").expect("leases keep the record");
    assert_eq!(ss.reservation, ReservationState::None);
    assert_eq!(ss.active_leases, 3);
    first.release();
    assert_eq!(reservation(&gate, "a"), ReservationState::None);
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 0));

    // No window: the next turn under pressure must probe its prefix, and
    // opens a new window.
    probe.set_usage(Some(HIGH));
    probe.set_hit("a", Some(HOT));
    let again = admit(&gate, "a");
    assert_eq!(again.reason(), Reason::ResidentPrefix);
    assert_eq!(probe.calls(Kind::Prefix, "a"), 2);
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    // A lease of the finished window touches the new one neither.
    second.release();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    open.release();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    again.release();
    assert_in_grace(&gate, "a");
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 1));
}

#[test]
fn finished_session_with_only_a_retaining_lease_is_forgotten_on_release() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease = admit(&gate, "a");
    assert!(gate.finish_session(b"a").is_some());
    lease.release();
    assert!(gate.session_stats(b"a").is_none());
    let s = gate.stats();
    assert_eq!(
        (
            s.reserved_in_flight,
            s.reserved_in_grace,
            s.tracked_sessions
        ),
        (0, 0, 0)
    );
}

#[test]
fn open_leases_never_touch_the_reservation() {
    const GRACE: Duration = Duration::from_secs(10);
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let (gate, clock) = manual_gate(
        Config {
            idle_grace: GRACE,
            ..config()
        },
        &probe,
    );
    // In flight: an open lease neither adds nor removes a holder.
    let retaining = admit(&gate, "a");
    probe.set_usage(Some(LOW));
    let open = admit(&gate, "a");
    assert_eq!(open.reason(), Reason::Open);
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    open.release();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    retaining.release();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::Grace { remaining: GRACE }
    );

    // In grace: an open admission and its release neither renew nor end it.
    clock.advance(Duration::from_secs(1));
    let open = admit(&gate, "a");
    assert_eq!(open.reason(), Reason::Open);
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::Grace {
            remaining: Duration::from_secs(9)
        }
    );
    clock.advance(Duration::from_secs(1));
    open.release();
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::Grace {
            remaining: Duration::from_secs(8)
        }
    );

    // No reservation: an open lease does not create one.
    let open = admit(&gate, "b");
    assert_eq!(reservation(&gate, "b"), ReservationState::None);
    open.release();
    assert_eq!(reservation(&gate, "b"), ReservationState::None);
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 1));
}

#[test]
fn zero_idle_grace_leaves_no_window_after_release() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(
        Config {
            idle_grace: Duration::ZERO,
            ..config()
        },
        &probe,
    );
    let lease = admit(&gate, "a");
    assert_eq!(lease.reason(), Reason::ResidentPrefix);
    assert_eq!(
        reservation(&gate, "a"),
        ReservationState::InFlight { leases: 1 }
    );
    lease.release();
    assert_eq!(reservation(&gate, "a"), ReservationState::None);
    let s = gate.stats();
    assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 0));

    probe.set_hit("a", Some(COLD));
    expect_err(
        gate.acquire_timeout(b"a", PROMPT_IDS, Duration::ZERO),
        AcquireError::TimedOut,
    );
    assert_eq!(probe.calls(Kind::Prefix, "a"), 2, "had to probe again");
}

// ---------------------------------------------------------------------------
// 6. Preemption
// ---------------------------------------------------------------------------

#[test]
fn newer_attempt_preempts_the_waiting_one_promptly() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    let gate = gate_with(config(), &probe);
    let old = spawn_acquire(&gate, "s");
    wait_sleeping(&gate, 1);
    // The engine has room again; nobody tells the old waiter.
    probe.set_usage(Some(LOW));
    let began = Instant::now();
    let newer = admit(&gate, "s");
    assert_eq!(newer.reason(), Reason::Open);

    let (outcome, returned) = join(old, "preempted attempt");
    expect_err(outcome, AcquireError::Preempted);
    assert_prompt(returned, began, "preempted attempt");
    assert_eq!(
        probe.calls(Kind::Usage, "s"),
        2,
        "the old one did not probe again"
    );

    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!(ss.num_preempted, 1);
    assert_eq!((ss.attempts, ss.admissions, ss.active_leases), (2, 1, 1));
    assert!(!ss.attempt_pending);
    assert_eq!(ss.reservation, ReservationState::None);
    let s = gate.stats();
    assert_eq!(s.preempted, 1);
    assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
    newer.release();
    assert_eq!(gate.session_stats(b"s").unwrap().num_preempted, 1);
}

#[test]
fn preempted_waiter_returns_even_while_the_newer_attempt_waits() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    let gate = gate_with(config(), &probe);
    let old = spawn_acquire(&gate, "s");
    wait_sleeping(&gate, 1);
    let began = Instant::now();
    let newer = spawn_acquire(&gate, "s");
    let (outcome, returned) = join(old, "preempted attempt");
    expect_err(outcome, AcquireError::Preempted);
    assert_prompt(returned, began, "preempted attempt");

    // Only the newest competes: one pending attempt, asleep.
    wait_until("the newer attempt sleeps", || {
        probe.calls(Kind::Prefix, "s") == 2
    });
    wait_sleeping(&gate, 1);
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!(ss.num_preempted, 1);
    assert!(ss.attempt_pending);
    assert_eq!(gate.stats().pending_attempts, 1);

    assert!(gate.cancel_session(b"s"));
    let (outcome, _) = join(newer, "newer attempt");
    expect_err(outcome, AcquireError::Cancelled);
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!((ss.num_preempted, ss.cancelled, ss.attempts), (1, 1, 2));
    assert_eq!(ss.reservation, ReservationState::None);
    let s = gate.stats();
    assert_eq!((s.preempted, s.cancelled, s.pending_attempts), (1, 1, 0));
}

#[test]
fn an_already_admitted_older_attempt_keeps_its_lease() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let old = admit(&gate, "s");
    assert_eq!(old.reason(), Reason::ResidentPrefix);
    probe.set_hit("s", Some(COLD));
    let newer = admit(&gate, "s");
    assert_eq!(newer.reason(), Reason::ReservedSession);
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!(ss.num_preempted, 0);
    assert_eq!(ss.active_leases, 2);
    assert_eq!(gate.stats().preempted, 0);

    // A newer attempt that has to wait does not touch the old lease either.
    probe.set_hit("t", Some(COLD));
    probe.set_usage(Some(LOW));
    let open_old = admit(&gate, "t");
    assert_eq!(open_old.reason(), Reason::Open);
    probe.set_usage(Some(HIGH));
    let waiting = spawn_acquire(&gate, "t");
    wait_sleeping(&gate, 1);
    let ss = gate.session_stats(b"t").unwrap();
    assert_eq!((ss.num_preempted, ss.active_leases), (0, 1));
    assert!(ss.attempt_pending);
    open_old.release();
    assert_eq!(gate.session_stats(b"t").unwrap().active_leases, 0);
    assert!(gate.cancel_session(b"t"));
    expect_err(join(waiting, "waiter").0, AcquireError::Cancelled);

    old.release();
    newer.release();
    let s = gate.stats();
    assert_eq!((s.releases, s.active_leases, s.preempted), (3, 0, 0));
}

#[test]
fn attempt_held_in_prefix_probe_is_never_admitted_after_a_newer_one_began() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let hold = probe.hold_next(Kind::Prefix, "s");
    let old = spawn_acquire(&gate, "s");
    hold.wait_entered();

    let newer = admit(&gate, "s");
    assert_eq!(newer.reason(), Reason::ResidentPrefix);
    // The old probe now answers "resident"; the old attempt must not get in.
    hold.answer(Some(0.99));
    let (outcome, _) = join(old, "old attempt");
    expect_err(outcome, AcquireError::Preempted);

    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!(ss.num_preempted, 1);
    assert_eq!((ss.admissions, ss.active_leases), (1, 1));
    assert_eq!(ss.reservation, ReservationState::InFlight { leases: 1 });
    assert!(!ss.attempt_pending);
    let s = gate.stats();
    assert_eq!(
        (s.total_admissions(), s.preempted, s.pending_attempts),
        (1, 1, 0)
    );
    newer.release();
    assert_in_grace(&gate, "s");
}

#[test]
fn attempt_held_in_usage_probe_is_not_admitted_open_once_a_newer_one_began() {
    let probe = ScriptedProbe::new(Some(LOW), Some(COLD));
    let gate = gate_with(config(), &probe);
    let old_hold = probe.hold_next(Kind::Usage, "s");
    let newer_hold = probe.hold_next(Kind::Usage, "s");
    let old = spawn_acquire(&gate, "s");
    old_hold.wait_entered();
    let newer = spawn_acquire(&gate, "s");
    newer_hold.wait_entered();

    // The newer one has only begun (it is itself mid-probe): that suffices.
    old_hold.answer(Some(LOW));
    let (outcome, _) = join(old, "old attempt");
    expect_err(outcome, AcquireError::Preempted);
    assert!(!newer.is_finished());

    newer_hold.answer(Some(LOW));
    let (outcome, _) = join(newer, "newer attempt");
    assert_eq!(outcome.unwrap().reason(), Reason::Open);
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!((ss.num_preempted, ss.admissions, ss.attempts), (1, 1, 2));
    assert_eq!(gate.stats().admissions(Reason::Open), 1);
}

// ---------------------------------------------------------------------------
// 7. Cancellation and timeouts
// ---------------------------------------------------------------------------

#[test]
fn cancel_session_ends_the_waiting_attempt_promptly() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    let gate = gate_with(config(), &probe);
    let waiter = spawn_acquire(&gate, "s");
    wait_sleeping(&gate, 1);
    let cancelled = Instant::now();
    assert!(gate.cancel_session(b"s"));
    let (outcome, returned) = join(waiter, "cancelled attempt");
    expect_err(outcome, AcquireError::Cancelled);
    assert_prompt(returned, cancelled, "cancelled attempt");
    assert!(!gate.cancel_session(b"s"), "nothing waits any more");

    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!((ss.cancelled, ss.waits, ss.admissions), (1, 1, 0));
    assert!(!ss.attempt_pending);
    assert_eq!(ss.reservation, ReservationState::None);
    let s = gate.stats();
    assert_eq!(s.cancelled, 1);
    assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
}

#[test]
fn cancel_session_returns_false_when_nothing_waits() {
    let probe = ScriptedProbe::new(Some(LOW), Some(COLD));
    let gate = gate_with(config(), &probe);
    assert!(!gate.cancel_session(b"unknown"));
    let lease = admit(&gate, "s");
    assert!(
        !gate.cancel_session(b"s"),
        "a lease is not a waiting attempt"
    );
    assert_eq!(gate.session_stats(b"s").unwrap().active_leases, 1);
    lease.release();
    let s = gate.stats();
    assert_eq!((s.cancelled, s.releases), (0, 1));
}

#[test]
fn acquire_timeout_times_out_under_pressure() {
    const LONG_POLL: Duration = Duration::from_secs(60);
    const TIMEOUT: Duration = Duration::from_millis(100);
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    let gate = gate_with(
        Config {
            wait_poll: LONG_POLL,
            ..config()
        },
        &probe,
    );
    let start = Instant::now();
    let outcome = gate.acquire_timeout(b"s", PROMPT_IDS, TIMEOUT);
    let took = start.elapsed();
    expect_err(outcome, AcquireError::TimedOut);
    assert!(took >= TIMEOUT, "gave up early: {took:?}");
    assert!(took < LONG_POLL / 2, "timed out only at the poll: {took:?}");

    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!((ss.timed_out, ss.waits, ss.admissions), (1, 1, 0));
    assert!(!ss.attempt_pending);
    let s = gate.stats();
    assert_eq!(s.timed_out, 1);
    assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
}

#[test]
fn zero_timeout_fails_at_once_under_pressure_but_admits_when_it_can() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("hot", Some(HOT));
    let gate = gate_with(config(), &probe);
    let start = Instant::now();
    expect_err(
        gate.acquire_timeout(b"s", PROMPT_IDS, Duration::ZERO),
        AcquireError::TimedOut,
    );
    assert!(start.elapsed() < PROMPT);
    assert_eq!(
        probe.calls(Kind::Prefix, "s"),
        1,
        "one pass through the table"
    );
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!((ss.timed_out, ss.waits), (1, 0), "it never slept");

    let hot = gate
        .acquire_timeout(b"hot", PROMPT_IDS, Duration::ZERO)
        .expect("resident prefix admits");
    assert_eq!(hot.reason(), Reason::ResidentPrefix);

    probe.set_usage(Some(LOW));
    let open = gate
        .acquire_timeout(b"s", PROMPT_IDS, Duration::ZERO)
        .expect("open admits");
    assert_eq!(open.reason(), Reason::Open);
    let s = gate.stats();
    assert_eq!((s.timed_out, s.total_admissions(), s.waits), (1, 2, 0));
}

// ---------------------------------------------------------------------------
// 8. Close
// ---------------------------------------------------------------------------

#[test]
fn close_fails_waiters_refuses_new_attempts_and_keeps_leases_releasable() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease_a = admit(&gate, "a");
    let b = spawn_acquire(&gate, "b");
    wait_sleeping(&gate, 1);
    let c = spawn_acquire(&gate, "c");
    wait_sleeping(&gate, 2);

    let closed = Instant::now();
    gate.close();
    assert!(gate.is_closed());
    for (h, name) in [(b, "b"), (c, "c")] {
        let (outcome, returned) = join(h, name);
        expect_err(outcome, AcquireError::Closed);
        assert_prompt(returned, closed, name);
    }
    expect_err(acquire(&gate, "d"), AcquireError::Closed);
    expect_err(
        gate.acquire_timeout(b"d", PROMPT_IDS, Duration::from_secs(1)),
        AcquireError::Closed,
    );
    assert_eq!(probe.calls(Kind::Usage, "d"), 0);
    gate.close(); // idempotent
    assert!(gate.is_closed());

    assert_eq!(gate.session_stats(b"a").unwrap().active_leases, 1);
    lease_a.release();
    let ss = gate.session_stats(b"a").unwrap();
    assert_eq!(ss.active_leases, 0);
    assert!(matches!(ss.reservation, ReservationState::Grace { .. }));
    let s = gate.stats();
    assert_eq!((s.attempts, s.total_admissions(), s.releases), (3, 1, 1));
    assert_eq!(s.closed, 4, "two waiters and two refusals");
    assert_eq!(
        (s.active_leases, s.pending_attempts, s.waiting_attempts),
        (0, 0, 0)
    );
    assert!(!gate.session_stats(b"b").unwrap().attempt_pending);
    assert!(gate.finish_session(b"a").is_some());
}

#[test]
fn close_ends_an_attempt_that_is_inside_a_probe() {
    let probe = ScriptedProbe::new(Some(LOW), Some(HOT));
    let gate = gate_with(config(), &probe);
    let hold = probe.hold_next(Kind::Usage, "s");
    let attempt = spawn_acquire(&gate, "s");
    hold.wait_entered();
    gate.close();
    hold.answer(Some(LOW)); // would be admitted open on an open gate
    expect_err(join(attempt, "attempt").0, AcquireError::Closed);
    let s = gate.stats();
    assert_eq!(
        (s.total_admissions(), s.closed, s.pending_attempts),
        (0, 1, 0)
    );
    assert!(!gate.session_stats(b"s").unwrap().attempt_pending);
}

#[test]
fn lease_outlives_a_closed_and_dropped_gate() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease = admit(&gate, "a");
    let observer = gate.clone();
    gate.close();
    drop(gate);
    assert_eq!(observer.stats().active_leases, 1);
    lease.release();
    let s = observer.stats();
    assert_eq!(
        (s.active_leases, s.releases, s.reserved_in_grace),
        (0, 1, 1)
    );
}

// ---------------------------------------------------------------------------
// 9. Probes calling back into the gate
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Seen {
    calls: Vec<Kind>,
    own_attempt_pending: Vec<bool>,
    pending_attempts: Vec<u64>,
    inner_reasons: Vec<Reason>,
}

#[test]
fn probe_calling_back_into_the_gate_does_not_deadlock() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    probe.set_hit("outer", Some(HOT));
    let gate = gate_with(config(), &probe);
    admit(&gate, "other").release(); // a window for the callback to finish
    let seen = Arc::new(Mutex::new(Seen::default()));
    {
        let gate = gate.clone();
        let seen = seen.clone();
        probe.set_callback(Some(Arc::new(move |kind, session| {
            if session != b"outer" {
                return;
            }
            let stats = gate.stats();
            let own = gate.session_stats(b"outer").map(|s| s.attempt_pending);
            gate.finish_session(b"other");
            gate.cancel_session(b"nobody");
            let _ = gate.metrics_text();
            // A whole other admission from inside the probe.
            let inner = gate.acquire(b"inner", PROMPT_IDS).map(|l| {
                let r = l.reason();
                l.release();
                r
            });
            let mut seen = seen.lock().unwrap();
            seen.calls.push(kind);
            seen.own_attempt_pending.push(own == Some(true));
            seen.pending_attempts.push(stats.pending_attempts);
            if let Ok(r) = inner {
                seen.inner_reasons.push(r);
            }
        })));
    }

    let (tx, rx) = mpsc::channel();
    {
        let gate = gate.clone();
        thread::spawn(move || {
            let outcome = gate.acquire(b"outer", PROMPT_IDS).map(|l| {
                let r = l.reason();
                l.release();
                r
            });
            let _ = tx.send(outcome);
        });
    }
    let outcome = rx
        .recv_timeout(PATIENCE)
        .expect("deadlock: acquire with a re-entrant probe never returned");
    probe.set_callback(None); // break the gate <-> probe cycle
    assert_eq!(outcome, Ok(Reason::ResidentPrefix));

    let seen = seen.lock().unwrap();
    assert_eq!(seen.calls, vec![Kind::Usage, Kind::Prefix]);
    assert_eq!(seen.own_attempt_pending, vec![true, true]);
    assert!(seen.pending_attempts.iter().all(|&n| n >= 1), "{seen:?}");
    assert_eq!(
        seen.inner_reasons,
        vec![Reason::ResidentPrefix, Reason::ReservedSession]
    );
    assert!(
        gate.session_stats(b"other").is_none(),
        "finished inside the probe"
    );
    let s = gate.stats();
    assert_eq!(
        (s.active_leases, s.pending_attempts, s.waiting_attempts),
        (0, 0, 0)
    );
}

#[test]
fn probe_cancelling_its_own_attempt_ends_it_cancelled() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);
    let cancelled = Arc::new(AtomicBool::new(false));
    {
        let gate = gate.clone();
        let cancelled = cancelled.clone();
        probe.set_callback(Some(Arc::new(move |kind, session| {
            if kind == Kind::Prefix && session == b"s" {
                cancelled.store(gate.cancel_session(b"s"), Ordering::SeqCst);
            }
        })));
    }
    let outcome = acquire(&gate, "s");
    probe.set_callback(None);
    expect_err(outcome, AcquireError::Cancelled);
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the probing attempt was pending"
    );
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!(ss.reservation, ReservationState::None);
    assert!(!ss.attempt_pending);
    assert_eq!((ss.cancelled, ss.admissions), (1, 0));
    assert_eq!(gate.stats().pending_attempts, 0);
}

// ---------------------------------------------------------------------------
// 10. Session record retention
// ---------------------------------------------------------------------------

#[test]
fn session_record_disappears_after_finish_session() {
    let probe = ScriptedProbe::new(Some(LOW), Some(COLD));
    let gate = gate_with(config(), &probe);
    admit(&gate, "a").release();
    assert!(
        gate.session_stats(b"a").is_some(),
        "kept for the retention period"
    );
    assert!(gate.finish_session(b"a").is_some());
    assert!(gate.session_stats(b"a").is_none());
    assert!(gate.finish_session(b"a").is_none(), "no longer known");

    // A lease keeps a finished record until it is released.
    let lease = admit(&gate, "b");
    assert!(gate.finish_session(b"b").is_some());
    assert_eq!(gate.session_stats(b"b").unwrap().active_leases, 1);
    lease.release();
    assert!(gate.session_stats(b"b").is_none());

    // A waiting attempt is not cancelled by finish_session and keeps the record.
    probe.set_usage(Some(HIGH));
    let waiter = spawn_acquire(&gate, "c");
    wait_sleeping(&gate, 1);
    assert!(gate.finish_session(b"c").is_some());
    wait_until("c re-probed after the finish woke it", || {
        probe.calls(Kind::Prefix, "c") == 2
    });
    wait_sleeping(&gate, 1);
    assert!(gate.session_stats(b"c").unwrap().attempt_pending);
    probe.set_usage(Some(LOW));
    // Finishing an unknown session frees nothing and wakes nobody (the
    // proptest model checks that no notification is sent); finishing a
    // known one again is a capacity event.
    assert!(gate.finish_session(b"unknown").is_none());
    assert!(gate.finish_session(b"c").is_some());
    let (outcome, _) = join(waiter, "waiter");
    outcome.expect("admitted").release();
    assert!(gate.session_stats(b"c").is_none());

    let s = gate.stats();
    assert_eq!(s.tracked_sessions, 0);
    assert_eq!(s.sessions_finished, 4);
    assert_eq!(s.sessions_retired, 0);
}

#[test]
fn idle_session_record_is_retired_after_the_retention_period() {
    const RETENTION: Duration = Duration::from_secs(10);
    const NS: Duration = Duration::from_nanos(1);
    let probe = ScriptedProbe::new(Some(LOW), Some(COLD));
    let (gate, clock) = manual_gate(
        Config {
            session_retention: RETENTION,
            ..config()
        },
        &probe,
    );
    let lease = admit(&gate, "a");
    clock.advance(Duration::from_secs(5));
    lease.release(); // idle from here
    clock.advance(RETENTION - NS);
    let ss = gate.session_stats(b"a").expect("still retained");
    assert_eq!(ss.idle_for, RETENTION - NS);
    assert_eq!(ss.admissions, 1);
    clock.advance(NS);
    assert!(gate.session_stats(b"a").is_none());
    let s = gate.stats();
    assert_eq!((s.sessions_retired, s.tracked_sessions), (1, 0));
}

#[test]
fn session_record_is_kept_while_a_lease_an_attempt_or_a_reservation_is_held() {
    const RETENTION: Duration = Duration::from_secs(10);
    const GRACE: Duration = Duration::from_secs(60);
    let probe = ScriptedProbe::new(Some(LOW), Some(COLD));
    probe.set_hit("r", Some(HOT));
    let (gate, clock) = manual_gate(
        Config {
            session_retention: RETENTION,
            idle_grace: GRACE,
            wait_poll: Duration::from_secs(100_000),
            ..config()
        },
        &probe,
    );
    // A lease.
    let lease = admit(&gate, "l");
    clock.advance(RETENTION * 10);
    assert_eq!(gate.session_stats(b"l").unwrap().active_leases, 1);
    lease.release();
    clock.advance(RETENTION - Duration::from_nanos(1));
    assert!(gate.session_stats(b"l").is_some());
    clock.advance(Duration::from_nanos(1));
    assert!(gate.session_stats(b"l").is_none());

    // A reservation (in flight, then in grace).
    probe.set_usage(Some(HIGH));
    let lease = admit(&gate, "r");
    assert_eq!(lease.reason(), Reason::ResidentPrefix);
    clock.advance(RETENTION * 2);
    assert!(gate.session_stats(b"r").is_some());
    lease.release();
    clock.advance(GRACE - Duration::from_secs(1));
    assert_in_grace(&gate, "r");

    // A waiting attempt, across clock ticks.
    let waiter = spawn_acquire(&gate, "w");
    wait_sleeping(&gate, 1);
    clock.advance(RETENTION * 3);
    gate.clock_advanced();
    wait_sleeping(&gate, 1);
    assert!(gate.session_stats(b"w").unwrap().attempt_pending);
    assert!(gate.cancel_session(b"w"));
    expect_err(join(waiter, "waiter").0, AcquireError::Cancelled);
    clock.advance(RETENTION);
    assert!(gate.session_stats(b"w").is_none(), "idle since the cancel");
    // r's window ended 30 s ago, more than the retention period.
    assert!(gate.session_stats(b"r").is_none());
    assert_eq!(gate.stats().sessions_retired, 3);
}

/// `Config::session_retention` is documented as how long a record is kept
/// "after the session became idle: no lease, no waiting attempt, no
/// reservation". A session whose grace window expires becomes idle at the
/// expiry, so its record (and its statistics, e.g. `num_preempted`) must
/// still be readable for the retention period after that.
#[test]
fn session_record_is_retained_for_the_retention_period_after_its_window_expires() {
    const RETENTION: Duration = Duration::from_secs(10);
    const GRACE: Duration = Duration::from_secs(60);
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let (gate, clock) = manual_gate(
        Config {
            session_retention: RETENTION,
            idle_grace: GRACE,
            ..config()
        },
        &probe,
    );
    admit(&gate, "r").release(); // grace until T + 60 s
    clock.advance(GRACE);
    let ss = gate
        .session_stats(b"r")
        .expect("the record must outlive the window by the retention period");
    assert_eq!(ss.reservation, ReservationState::None);
    assert_eq!(ss.admissions, 1);
    clock.advance(RETENTION - Duration::from_nanos(1));
    assert!(gate.session_stats(b"r").is_some());
    clock.advance(Duration::from_nanos(1));
    assert!(gate.session_stats(b"r").is_none());
}

// ---------------------------------------------------------------------------
// 11. Stats consistency under concurrency
// ---------------------------------------------------------------------------

#[test]
fn stats_are_consistent_after_a_multithreaded_run() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 200;
    const SESSIONS: usize = 32;
    // Hit ratios by session: a quarter each cold, lukewarm, warm, resident.
    let probe = ScriptedProbe::new(Some(HIGH), None);
    for i in 0..SESSIONS {
        let hit = [0.0, 0.3, 0.6, 0.9][i % 4];
        probe.set_hit(&format!("s{i}"), Some(hit));
    }
    // Short poll and grace: this test is about accounting, not latency.
    let gate = gate_with(
        Config {
            wait_poll: Duration::from_millis(20),
            idle_grace: Duration::from_millis(5),
            ..config()
        },
        &probe,
    );
    let done = Arc::new(AtomicBool::new(false));
    let flipper = {
        let probe = probe.clone();
        let done = done.clone();
        thread::spawn(move || {
            let mut high = true;
            while !done.load(Ordering::SeqCst) {
                high = !high;
                probe.set_usage(Some(if high { HIGH } else { LOW }));
                thread::sleep(Duration::from_micros(500));
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let gate = gate.clone();
            thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64 + 1);
                let (mut leases, mut preempted) = (0u64, 0u64);
                for _ in 0..ROUNDS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let session = format!("s{}", rng % SESSIONS as u64);
                    match gate.acquire(session.as_bytes(), PROMPT_IDS) {
                        Ok(lease) => {
                            leases += 1;
                            for _ in 0..(rng % 4) {
                                thread::yield_now();
                            }
                            lease.release();
                        }
                        Err(AcquireError::Preempted) => preempted += 1,
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                (leases, preempted)
            })
        })
        .collect();
    let (mut leases, mut preempted) = (0u64, 0u64);
    for w in workers {
        let (l, p) = join(w, "worker");
        leases += l;
        preempted += p;
    }
    done.store(true, Ordering::SeqCst);
    join(flipper, "flipper");

    let s = gate.stats();
    assert_eq!(leases + preempted, (THREADS * ROUNDS) as u64);
    assert_eq!(s.attempts, (THREADS * ROUNDS) as u64);
    assert_eq!(s.total_admissions(), leases);
    assert_eq!(s.admissions_by_reason.iter().sum::<u64>(), leases);
    assert_eq!(s.releases, leases);
    assert_eq!(s.preempted, preempted);
    assert_eq!((s.timed_out, s.cancelled, s.closed), (0, 0, 0));
    assert_eq!(s.active_leases, 0);
    assert_eq!(s.pending_attempts, 0);
    assert_eq!(s.waiting_attempts, 0);
    assert_eq!(s.reserved_in_flight, 0);
    assert!(s.usage_probe_calls >= s.attempts);
    assert_eq!(s.tracked_sessions, SESSIONS as u64);
    assert_eq!(
        s.admissions(Reason::PrefixProbeUnavailable),
        0,
        "every session has a hit ratio"
    );

    let (mut admissions, mut num_preempted, mut attempts) = (0, 0, 0);
    for i in 0..SESSIONS {
        let ss = gate.session_stats(format!("s{i}").as_bytes()).unwrap();
        assert_eq!(ss.active_leases, 0);
        assert!(!ss.attempt_pending);
        assert!(!matches!(ss.reservation, ReservationState::InFlight { .. }));
        admissions += ss.admissions;
        num_preempted += ss.num_preempted;
        attempts += ss.attempts;
    }
    assert_eq!(admissions, leases);
    assert_eq!(num_preempted, preempted);
    assert_eq!(attempts, s.attempts);

    let text = gate.metrics_text();
    let s = gate.stats();
    let mut expected = vec![
        format!("kvgate_attempts_total {}", s.attempts),
        format!("kvgate_releases_total {leases}"),
        format!("kvgate_admissions_all_total {leases}"),
        format!("kvgate_attempts_failed_total{{outcome=\"preempted\"}} {preempted}"),
        "kvgate_attempts_failed_total{outcome=\"timed_out\"} 0".to_owned(),
        "kvgate_active_leases 0".to_owned(),
        "kvgate_pending_attempts 0".to_owned(),
        "kvgate_waiting_attempts 0".to_owned(),
        "kvgate_reserved_in_flight 0".to_owned(),
        format!("kvgate_tracked_sessions {SESSIONS}"),
        format!(
            "kvgate_probe_calls_total{{probe=\"usage\"}} {}",
            s.usage_probe_calls
        ),
    ];
    for r in Reason::ALL {
        expected.push(format!(
            "kvgate_admissions_total{{reason=\"{}\"}} {}",
            r.as_str(),
            s.admissions(r)
        ));
    }
    for line in expected {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }

    for i in 0..SESSIONS {
        assert!(gate.finish_session(format!("s{i}").as_bytes()).is_some());
    }
    let s = gate.stats();
    assert_eq!((s.tracked_sessions, s.reserved_in_grace), (0, 0));
}

/// Every attempt ends one way, and the counters say which: an attempt whose
/// caller was told `TimedOut` must not also be counted as preempted (and in
/// the session's `num_preempted`), which only counts attempts that returned
/// `Preempted`. Many threads retry one session with a zero timeout under
/// pressure, so each attempt either times out or is preempted by a retry.
#[test]
fn preemption_and_timeout_counts_match_what_callers_were_told_under_contention() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 20_000;
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    let gate = gate_with(config(), &probe);
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let gate = gate.clone();
            thread::spawn(move || {
                let (mut timed_out, mut preempted) = (0u64, 0u64);
                for _ in 0..ROUNDS {
                    match gate.acquire_timeout(b"s", PROMPT_IDS, Duration::ZERO) {
                        Err(AcquireError::TimedOut) => timed_out += 1,
                        Err(AcquireError::Preempted) => preempted += 1,
                        other => panic!("unexpected {:?}", other.map(|l| l.reason())),
                    }
                }
                (timed_out, preempted)
            })
        })
        .collect();
    let (mut timed_out, mut preempted) = (0u64, 0u64);
    for w in workers {
        let (t, p) = join(w, "worker");
        timed_out += t;
        preempted += p;
    }
    let s = gate.stats();
    let ss = gate.session_stats(b"s").unwrap();
    assert_eq!(s.attempts, (THREADS * ROUNDS) as u64);
    assert_eq!(s.timed_out, timed_out);
    assert_eq!(ss.timed_out, timed_out);
    assert_eq!(
        (s.preempted, ss.num_preempted),
        (preempted, preempted),
        "attempts counted as preempted although their callers got TimedOut \
         ({timed_out} TimedOut and {preempted} Preempted returned)"
    );
    assert_eq!(
        s.attempts,
        s.total_admissions() + s.preempted + s.timed_out + s.cancelled + s.closed,
        "each attempt ends exactly one way"
    );
    assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
}

// ---------------------------------------------------------------------------
// 12. Panicking probes
// ---------------------------------------------------------------------------

#[test]
fn panicking_probe_unwinds_and_leaves_no_pending_attempt() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(HOT));
    let gate = gate_with(config(), &probe);

    probe.panic_next(Kind::Usage, "s");
    let unwound = catch_unwind(AssertUnwindSafe(|| acquire(&gate, "s")));
    assert!(unwound.is_err(), "the probe's panic reaches the caller");
    let ss = gate.session_stats(b"s").unwrap();
    assert!(!ss.attempt_pending);
    assert_eq!((ss.active_leases, ss.admissions), (0, 0));

    probe.panic_next(Kind::Prefix, "s");
    let unwound = catch_unwind(AssertUnwindSafe(|| acquire(&gate, "s")));
    assert!(unwound.is_err());
    let ss = gate.session_stats(b"s").unwrap();
    assert!(!ss.attempt_pending);
    assert_eq!(ss.reservation, ReservationState::None);
    let s = gate.stats();
    assert_eq!(
        (s.pending_attempts, s.waiting_attempts, s.active_leases),
        (0, 0, 0)
    );

    // The gate keeps working, for this session and others.
    let lease = admit(&gate, "s");
    assert_eq!(lease.reason(), Reason::ResidentPrefix);
    assert_eq!(gate.session_stats(b"s").unwrap().num_preempted, 0);
    lease.release();
    probe.set_usage(Some(LOW));
    admit(&gate, "t").release();
    let s = gate.stats();
    assert_eq!((s.total_admissions(), s.pending_attempts), (2, 0));
}

#[test]
fn waiter_whose_probe_panics_after_a_wake_up_passes_the_wake_up_on() {
    let probe = ScriptedProbe::new(Some(HIGH), Some(COLD));
    probe.set_hit("a", Some(HOT));
    let gate = gate_with(config(), &probe);
    let lease_a = admit(&gate, "a");
    let b = {
        let gate = gate.clone();
        thread::spawn(move || catch_unwind(AssertUnwindSafe(|| acquire(&gate, "b"))).is_err())
    };
    wait_sleeping(&gate, 1); // b sleeps first: it is woken first
    let c = spawn_acquire(&gate, "c");
    wait_sleeping(&gate, 2);

    probe.set_usage(Some(LOW));
    probe.panic_next(Kind::Usage, "b");
    let released = Instant::now();
    lease_a.release();
    assert!(join(b, "b"), "b's probe panicked");
    let (outcome, returned) = join(c, "c");
    assert_eq!(outcome.unwrap().reason(), Reason::Open);
    assert_prompt(returned, released, "c after b dropped its wake-up");
    assert!(!gate.session_stats(b"b").unwrap().attempt_pending);
    let s = gate.stats();
    assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
}

//! Which probes the blocking gate asks, and when it stops asking.
//!
//! The C header promises that no probe is called once `kvgate_free` has
//! returned, even when a probe itself freed the gate, and that reference
//! mode never calls the capacity probe. Both are kept (or broken) by the
//! blocking driver in `src/gate.rs`, tested here on the Rust [`Gate`]: a
//! gate closed from inside the usage probe is asked nothing more, and the
//! capacity probe is asked with every usage probe in working-set mode and
//! never in reference mode. The C hosts test the same through the ABI
//! (`ffi-examples/c/promises.c`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use kvgate::{AcquireError, AdmissionMode, Config, EngineCapacity, Gate, Probe, Reason};

/// Counts every call, answers a fixed usage and capacity, and closes its
/// gate from inside the usage probe when told to.
#[derive(Default)]
struct CountingProbe {
    usage: f64,
    /// Overrides `usage` once set (f64 bits; 0 = not set).
    usage_now: AtomicU64,
    close_in_usage: bool,
    gate: OnceLock<Gate>,
    usage_calls: AtomicUsize,
    prefix_calls: AtomicUsize,
    capacity_calls: AtomicUsize,
    /// Calls of any probe that began after a probe closed the gate.
    calls_after_close: AtomicUsize,
}

impl CountingProbe {
    fn note_call(&self) {
        if self.gate.get().is_some_and(Gate::is_closed) {
            self.calls_after_close.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Probe for CountingProbe {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        self.note_call();
        self.usage_calls.fetch_add(1, Ordering::SeqCst);
        if self.close_in_usage {
            self.gate.get().expect("gate set before acquiring").close();
        }
        match self.usage_now.load(Ordering::SeqCst) {
            0 => Some(self.usage),
            bits => Some(f64::from_bits(bits)),
        }
    }

    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        self.note_call();
        self.prefix_calls.fetch_add(1, Ordering::SeqCst);
        Some(0.0)
    }

    fn kv_cache_capacity(&self, _session: &[u8]) -> Option<EngineCapacity> {
        self.note_call();
        self.capacity_calls.fetch_add(1, Ordering::SeqCst);
        Some(EngineCapacity::new(100_000, 16, 10_000.0))
    }
}

fn gate(mode: AdmissionMode, probe: CountingProbe) -> (Gate, Arc<CountingProbe>) {
    let probe = Arc::new(probe);
    let config = Config {
        admission: mode,
        ..Config::default()
    };
    let gate = Gate::new(config, probe.clone()).expect("valid config");
    probe.gate.set(gate.clone()).expect("set once");
    (gate, probe)
}

const MODES: [AdmissionMode; 2] = [AdmissionMode::WorkingSet, AdmissionMode::Reference];

#[test]
fn a_gate_closed_inside_the_usage_probe_asks_no_probe_again() {
    for mode in MODES {
        // Under pressure, so reference mode would go on to the prefix probe.
        let (gate, probe) = gate(
            mode,
            CountingProbe {
                usage: 0.95,
                close_in_usage: true,
                ..CountingProbe::default()
            },
        );
        let outcome = gate.acquire(b"s", &[1, 2, 3]);
        assert_eq!(outcome.err(), Some(AcquireError::Closed), "{mode:?}");
        assert_eq!(probe.usage_calls.load(Ordering::SeqCst), 1, "{mode:?}");
        assert_eq!(
            probe.calls_after_close.load(Ordering::SeqCst),
            0,
            "{mode:?}: a probe was called after the usage probe closed the gate \
             (capacity calls {}, prefix calls {})",
            probe.capacity_calls.load(Ordering::SeqCst),
            probe.prefix_calls.load(Ordering::SeqCst),
        );
    }
}

#[test]
fn reference_mode_never_asks_the_capacity_probe() {
    // Below the watermark (open) and above it (prefix probe, then a wait
    // that times out): the capacity probe is never asked.
    for usage in [0.10, 0.95] {
        let (gate, probe) = gate(
            AdmissionMode::Reference,
            CountingProbe {
                usage,
                ..CountingProbe::default()
            },
        );
        for turn in 0..3 {
            let _ = gate.acquire_timeout(b"s", &[1, 2, 3], std::time::Duration::ZERO);
            assert_eq!(probe.usage_calls.load(Ordering::SeqCst), turn + 1);
        }
        assert_eq!(
            probe.capacity_calls.load(Ordering::SeqCst),
            0,
            "usage {usage}: reference mode asked the capacity probe"
        );
    }
}

#[test]
fn working_set_mode_asks_the_capacity_probe_with_every_usage_probe() {
    let (gate, probe) = gate(
        AdmissionMode::WorkingSet,
        CountingProbe {
            usage: 0.10,
            ..CountingProbe::default()
        },
    );
    for session in [&b"a"[..], b"b", b"c"] {
        let lease = gate.acquire(session, &[1, 2, 3]).expect("admitted");
        assert!(matches!(
            lease.admission().reason,
            Reason::EmptyWorkingSet | Reason::FitsWorkingSet
        ));
    }
    let usage_calls = probe.usage_calls.load(Ordering::SeqCst);
    assert!(usage_calls >= 3);
    assert_eq!(probe.capacity_calls.load(Ordering::SeqCst), usage_calls);
    assert_eq!(probe.prefix_calls.load(Ordering::SeqCst), 0);
}

/// The admission's `retain_session` and the session's
/// reservation figures, read at the same moment, tell one story per mode
/// (docs/decisions/retained-session-figures.md).
#[test]
fn retain_session_and_the_session_reservation_agree_per_mode() {
    use kvgate::ReservationState;
    for mode in MODES {
        let (gate, _probe) = gate(
            mode,
            CountingProbe {
                usage: 0.95,
                ..CountingProbe::default()
            },
        );
        // Under pressure with a cold prefix, reference mode would hold the
        // turn out; a zero timeout keeps the test from waiting then.
        let lease = gate.acquire_timeout(b"s", &[1, 2, 3], std::time::Duration::ZERO);
        let stats = gate.session_stats(b"s").expect("tracked");
        if mode == AdmissionMode::WorkingSet {
            let lease = lease.expect("the first session is admitted");
            assert!(lease.admission().retain_session);
            assert_eq!(stats.active_leases, 1);
            assert_eq!(stats.reservation, ReservationState::None);
        } else {
            assert_eq!(lease.err(), Some(AcquireError::TimedOut));
            assert_eq!(stats.reservation, ReservationState::None);
        }
        // Below the watermark: open in reference mode, no reservation.
        let (gate, _probe) = self::gate(
            mode,
            CountingProbe {
                usage: 0.10,
                ..CountingProbe::default()
            },
        );
        let lease = gate.acquire(b"t", &[1]).expect("admitted");
        let stats = gate.session_stats(b"t").expect("tracked");
        assert_eq!(stats.reservation, ReservationState::None, "{mode:?}");
        assert_eq!(
            lease.admission().retain_session,
            mode == AdmissionMode::WorkingSet,
            "{mode:?}: retain_session is the working-set place, or a reservation"
        );
    }
}

/// kvgate.h, `kvgate_admission.hit_ratio`: "NaN when it was not asked ...
/// Never carried over from an earlier pass." A turn held out on a cold
/// prefix, then admitted open on a later pass, reports no hit ratio.
#[test]
fn the_hit_ratio_is_never_carried_over_from_an_earlier_pass() {
    let (gate, probe) = gate(
        AdmissionMode::Reference,
        CountingProbe {
            usage: 0.10,
            ..CountingProbe::default()
        },
    );
    let holder = gate.acquire(b"x", &[1]).expect("open");
    probe.usage_now.store(0.95f64.to_bits(), Ordering::SeqCst);
    let waiter = {
        let gate = gate.clone();
        std::thread::spawn(move || gate.acquire(b"w", &[1, 2]))
    };
    let start = std::time::Instant::now();
    while gate.stats().waiting_attempts == 0 {
        assert!(start.elapsed().as_secs() < 30, "the waiter never slept");
        std::thread::yield_now();
    }
    assert_eq!(probe.prefix_calls.load(Ordering::SeqCst), 1);
    probe.usage_now.store(0.10f64.to_bits(), Ordering::SeqCst);
    drop(holder); // the release wakes the waiter, which probes again
    let lease = waiter.join().expect("no panic").expect("admitted");
    let admission = lease.admission();
    assert_eq!(admission.reason, Reason::Open);
    assert!(admission.waited);
    assert_eq!(admission.usage, Some(0.10));
    assert_eq!(
        admission.hit_ratio, None,
        "the first pass's prefix answer was carried over"
    );
}

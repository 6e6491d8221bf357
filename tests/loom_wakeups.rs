//! loom models of the blocking gate's wake-ups (invariant 4: no waiter that
//! could proceed is left asleep), driving the real `Gate`, its sleeper and a
//! manual clock through loom's twins of every lock and atomic.
//!
//! A lost wake-up shows up as a deadlock: waiters sleep on a manual clock
//! that moves only when a model thread moves it, and the poll (100 s) is
//! never reached, so only a notification ends a sleep; loom fails the model
//! when every thread is blocked. Each model also asserts the outcome and the
//! gauges once every thread is done.
//!
//! Bounds: at most three model threads besides main; `LOOM_MAX_PREEMPTIONS=2`
//! (scripts/loom.sh). Each race here needs one preemption to open (a waker
//! acting between a sleeper's decision and its sleep) and a second to close it
//! from the other side, so two preemptions reach every ordering of the two
//! racing halves; the rest of each thread runs to its next block.

#![cfg(loom)]

#[path = "support/loom_harness.rs"]
mod harness;

use std::sync::Arc as StdArc;

use harness::*;
use kvgate::{AcquireError, Reason};
use loom::thread;

/// Release vs a waiter going to sleep: the waiter's probes see pressure, the
/// releaser frees capacity (usage drops, then the lease is released) while
/// the waiter is anywhere between its usage probe and its sleep.
#[test]
fn release_reaches_a_waiter_going_to_sleep() {
    model("release_reaches_a_waiter_going_to_sleep", || {
        let (gate, _clock, probe) = gate(LOW);
        let held = gate.acquire(b"h", PROMPT).expect("open");
        probe.set_usage(HIGH);
        let g = gate.clone();
        let waiter = thread::spawn(move || g.acquire(b"cold", PROMPT));
        let p = probe.clone();
        let releaser = thread::spawn(move || {
            p.set_usage(LOW);
            held.release();
        });
        releaser.join().unwrap();
        let lease = waiter
            .join()
            .unwrap()
            .expect("admitted once capacity freed");
        assert_eq!(lease.reason(), Reason::Open);
        drop(lease);
        let s = gate.stats();
        assert_eq!(
            (s.active_leases, s.releases, s.total_admissions()),
            (0, 2, 2)
        );
        assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
    });
}

/// Targeted wake-ups chain: one release wakes one waiter, and a waiter
/// admitted on that event passes it on, so two waiters (anywhere on their
/// way to sleep) are both admitted once usage dropped, without a herd.
#[test]
fn one_release_reaches_two_waiters_through_the_chain() {
    model("one_release_reaches_two_waiters_through_the_chain", || {
        let (gate, _clock, probe) = gate(LOW);
        let held = gate.acquire(b"h", PROMPT).expect("open");
        probe.set_usage(HIGH);
        let waiters: Vec<_> = [&b"cold-1"[..], b"cold-2"]
            .into_iter()
            .map(|s| {
                let g = gate.clone();
                thread::spawn(move || g.acquire(s, PROMPT))
            })
            .collect();
        let p = probe.clone();
        let releaser = thread::spawn(move || {
            p.set_usage(LOW);
            held.release();
        });
        releaser.join().unwrap();
        for w in waiters {
            let lease = w.join().unwrap().expect("admitted once capacity freed");
            assert_eq!(lease.reason(), Reason::Open);
        }
        let s = gate.stats();
        assert_eq!(
            (s.active_leases, s.total_admissions(), s.releases),
            (0, 3, 3)
        );
        assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
    });
}

/// Finish vs a waiter going to sleep: `finish_session` is a capacity event
/// too (the reference always notifies), even for a session other than the
/// waiter's.
#[test]
fn finish_reaches_a_waiter_going_to_sleep() {
    model("finish_reaches_a_waiter_going_to_sleep", || {
        let (gate, _clock, probe) = gate(HIGH);
        drop(gate.acquire(b"hot-f", PROMPT).expect("resident")); // a grace window
        let g = gate.clone();
        let waiter = thread::spawn(move || g.acquire(b"cold", PROMPT));
        let (g, p) = (gate.clone(), probe.clone());
        let finisher = thread::spawn(move || {
            p.set_usage(LOW);
            let last = g.finish_session(b"hot-f").expect("tracked");
            assert_eq!(last.admissions, 1);
        });
        finisher.join().unwrap();
        let lease = waiter
            .join()
            .unwrap()
            .expect("admitted once capacity freed");
        assert_eq!(lease.reason(), Reason::Open);
        drop(lease);
        let s = gate.stats();
        assert_eq!((s.reserved_in_grace, s.reserved_in_flight), (0, 0));
        assert_eq!(
            (s.sessions_finished, s.active_leases, s.pending_attempts),
            (1, 0, 0)
        );
        assert!(
            gate.session_stats(b"hot-f").is_none(),
            "finished and idle: forgotten"
        );
    });
}

/// An expiry noticed with nobody else calling: a grace window ends while a
/// waiter sleeps; the engine frees its blocks at that moment (usage drops).
/// The clock thread only moves time and says so (`clock_advanced`); it never
/// purges. The waiter must notice the expiry itself: woken by the tick if it
/// was asleep, and, if it goes to sleep after the tick, because the thread on
/// deadline duty (`src/watch.rs`) never sleeps past the core's next deadline.
#[test]
fn a_grace_expiry_reaches_a_waiter_with_nobody_else_calling() {
    model(
        "a_grace_expiry_reaches_a_waiter_with_nobody_else_calling",
        || {
            let clock = StdArc::new(kvgate::ManualClock::new(SEC));
            let expiry = SEC + config().idle_grace.as_nanos() as u64;
            let probe = ScriptedProbe::low_from(HIGH, clock.clone(), expiry);
            let gate = gate_on(&clock, &probe);
            drop(gate.acquire(b"hot-g", PROMPT).expect("resident")); // grace until `expiry`
            let g = gate.clone();
            let waiter = thread::spawn(move || g.acquire(b"cold", PROMPT));
            let (g, c) = (gate.clone(), clock.clone());
            let ticker = thread::spawn(move || {
                c.set_ns(expiry);
                g.clock_advanced();
            });
            ticker.join().unwrap();
            let lease = waiter.join().unwrap().expect("admitted after the expiry");
            assert_eq!(lease.reason(), Reason::Open);
            drop(lease);
            let s = gate.stats();
            assert_eq!((s.grace_expired, s.reserved_in_grace), (1, 0));
            assert_eq!(
                (s.active_leases, s.pending_attempts, s.waiting_attempts),
                (0, 0, 0)
            );
        },
    );
}

/// Close vs waiting attempts: two waiters, anywhere on their way to sleep,
/// and a close. Both end `Closed` (nothing else could admit them), a later
/// attempt is refused, and nothing is left pending.
#[test]
fn close_ends_every_waiting_attempt() {
    model("close_ends_every_waiting_attempt", || {
        let (gate, _clock, _probe) = gate(HIGH);
        let waiters: Vec<_> = [&b"cold-1"[..], b"cold-2"]
            .into_iter()
            .map(|s| {
                let g = gate.clone();
                thread::spawn(move || g.acquire(s, PROMPT))
            })
            .collect();
        let g = gate.clone();
        let closer = thread::spawn(move || g.close());
        closer.join().unwrap();
        for w in waiters {
            assert_eq!(w.join().unwrap().unwrap_err(), AcquireError::Closed);
        }
        assert_eq!(
            gate.acquire(b"late", PROMPT).unwrap_err(),
            AcquireError::Closed
        );
        let s = gate.stats();
        assert_eq!(
            (s.closed, s.pending_attempts, s.waiting_attempts),
            (3, 0, 0)
        );
        assert_eq!(s.total_admissions(), 0);
    });
}

/// A preemption reaches its attempt wherever it is: the older attempt of a
/// session waits (pressure, cold), a newer one begins. The older one must
/// return `Preempted` promptly (nothing else could wake it), be counted once
/// and leave nothing behind; the newer one is then the session's only
/// pending attempt, and a cancel ends it.
#[test]
fn a_newer_attempt_preempts_a_waiter_going_to_sleep() {
    model("a_newer_attempt_preempts_a_waiter_going_to_sleep", || {
        let (gate, _clock, _probe) = gate(HIGH);
        let g = gate.clone();
        let older = thread::spawn(move || g.acquire(b"cold", PROMPT));
        // Let the older attempt begin first: the roles are fixed, the race is
        // the newer `begin` against everything the older one does after its own.
        while gate.session_stats(b"cold").is_none() {
            thread::yield_now();
        }
        let g = gate.clone();
        let newer = thread::spawn(move || g.acquire(b"cold", PROMPT));
        assert_eq!(older.join().unwrap().unwrap_err(), AcquireError::Preempted);
        let s = gate
            .session_stats(b"cold")
            .expect("the newer attempt is pending");
        assert_eq!((s.num_preempted, s.attempts, s.active_leases), (1, 2, 0));
        assert!(s.attempt_pending);
        assert!(
            gate.cancel_session(b"cold"),
            "the newer attempt is the one pending"
        );
        assert_eq!(newer.join().unwrap().unwrap_err(), AcquireError::Cancelled);
        let s = gate.stats();
        assert_eq!((s.preempted, s.cancelled, s.total_admissions()), (1, 1, 0));
        assert_eq!((s.pending_attempts, s.waiting_attempts), (0, 0));
        assert_eq!((s.reserved_in_flight, s.reserved_in_grace), (0, 0));
    });
}

/// Cancel vs a waiter going to sleep: the cancel lands anywhere after the
/// attempt began; the attempt ends `Cancelled`, never sleeps through it.
#[test]
fn cancel_reaches_a_waiter_going_to_sleep() {
    model("cancel_reaches_a_waiter_going_to_sleep", || {
        let (gate, _clock, _probe) = gate(HIGH);
        let g = gate.clone();
        let waiter = thread::spawn(move || g.acquire(b"cold", PROMPT));
        let g = gate.clone();
        let canceller = thread::spawn(move || {
            while !g.cancel_session(b"cold") {
                thread::yield_now(); // not begun yet
            }
        });
        canceller.join().unwrap();
        assert_eq!(waiter.join().unwrap().unwrap_err(), AcquireError::Cancelled);
        let s = gate.stats();
        assert_eq!(
            (s.cancelled, s.pending_attempts, s.waiting_attempts),
            (1, 0, 0)
        );
    });
}

/// Lease drop vs stats: a retaining lease is dropped while another thread
/// takes snapshots. Each gate-wide figure is exact on its own (never torn,
/// never below zero, never double-counted) though the set is not one
/// instant; a session's snapshot is taken under its lock, so it is one
/// instant: a reservation in flight exactly while the lease is held.
#[test]
fn lease_drop_vs_stats() {
    model("lease_drop_vs_stats", || {
        let (gate, _clock, _probe) = gate(HIGH);
        let lease = gate.acquire(b"hot-s", PROMPT).expect("resident");
        assert!(lease.admission().retain_session);
        let dropper = thread::spawn(move || drop(lease));
        let g = gate.clone();
        let reader = thread::spawn(move || {
            let s = g.stats();
            assert!(s.active_leases <= 1 && s.releases <= 1, "{s:?}");
            assert!(
                s.reserved_in_flight <= 1 && s.reserved_in_grace <= 1,
                "{s:?}"
            );
            assert_eq!((s.total_admissions(), s.pending_attempts), (1, 0));
            let one = g.session_stats(b"hot-s").expect("in flight or in grace");
            match one.reservation {
                kvgate::ReservationState::InFlight { leases } => {
                    assert_eq!((leases, one.active_leases), (1, 1))
                }
                kvgate::ReservationState::Grace { remaining } => {
                    assert_eq!(one.active_leases, 0);
                    assert_eq!(remaining, config().idle_grace);
                }
                other => panic!("a held or just released window, not {other:?}"),
            }
        });
        dropper.join().unwrap();
        reader.join().unwrap();
        let s = gate.stats();
        assert_eq!(
            (
                s.active_leases,
                s.releases,
                s.reserved_in_flight,
                s.reserved_in_grace
            ),
            (0, 1, 0, 1)
        );
    });
}

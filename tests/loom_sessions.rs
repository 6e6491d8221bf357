//! loom models of one session's races (invariants 1-3 and 6), driving the
//! sans-IO core directly so the models can see attempt and lease ids and
//! the exact time of each decision.
//!
//! Bounds: two model threads besides main; `LOOM_MAX_PREEMPTIONS=2`
//! (scripts/loom.sh). Each race is between two operations that each take
//! the session's shard lock once to decide (admission, begin, finish,
//! release, expiry); two preemptions let either side act at every point of
//! the other, before, inside and after that critical section.

#![cfg(loom)]

#[path = "support/loom_harness.rs"]
mod harness;

use harness::*;
use kvgate::core::Core;
use kvgate::{AcquireError, Reason, ReservationState};
use loom::thread;

/// Releases `token` at the clock's time.
fn release(core: &Core, time: &VirtualTime, token: kvgate::core::LeaseToken) {
    core.release(token, time.now());
}

/// A newer attempt vs an older attempt's admission. Two attempts of one hot
/// session under pressure (each would be admitted `resident_prefix` alone).
/// Whatever the interleaving: the newer is admitted; the older is either
/// preempted (counted once, leaving no lease and no hold on the window) or
/// was admitted before the newer began (its lease id is older than the
/// newer attempt's id: ids of a session are minted in order under its lock).
#[test]
fn a_newer_attempt_vs_an_older_attempts_admission() {
    model("a_newer_attempt_vs_an_older_attempts_admission", || {
        let (core, clock, probe) = core(HIGH);
        let run = || {
            let (core, clock, probe) = (core.clone(), clock.clone(), probe.clone());
            thread::spawn(move || {
                let d = begin(&core, &clock, b"hot-s").expect("not closed");
                let id = d.attempt.id();
                (id, drive(&core, &clock, &probe, d))
            })
        };
        let (a, b) = (run(), run());
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let ((_, older), (newer_id, newer)) = if a.0 < b.0 { (a, b) } else { (b, a) };
        let newer = newer.expect("nothing preempts the newest attempt");
        let newer_reason = newer.admission().reason;
        let mut leases = vec![newer];
        let preempted = match older {
            Ok(token) => {
                assert!(
                    token.admission().lease_id < newer_id,
                    "an older attempt was admitted after a newer one began"
                );
                leases.push(token);
                0
            }
            Err(err) => {
                assert_eq!(err, AcquireError::Preempted);
                1
            }
        };
        // The newer one found a reservation only if the older one made it.
        let expected = if preempted == 0 {
            [Reason::ResidentPrefix, Reason::ReservedSession].as_slice()
        } else {
            [Reason::ResidentPrefix].as_slice()
        };
        assert!(expected.contains(&newer_reason), "{newer_reason:?}");
        let s = core.session_stats(b"hot-s", clock.now()).unwrap();
        assert_eq!(s.num_preempted, preempted);
        assert_eq!(s.active_leases as usize, leases.len());
        assert_eq!(
            s.reservation,
            ReservationState::InFlight {
                leases: leases.len() as u32
            },
            "exactly the admitted attempts hold the window"
        );
        assert!(!s.attempt_pending);
        let g = core.stats(clock.now());
        assert_eq!(
            (g.preempted, g.pending_attempts, g.waiting_attempts),
            (preempted, 0, 0)
        );
        assert_eq!(g.total_admissions() as usize, leases.len());
        for token in leases {
            release(&core, &clock, token);
        }
        let g = core.stats(clock.now());
        assert_eq!(
            (g.active_leases, g.reserved_in_flight, g.reserved_in_grace),
            (0, 0, 1)
        );
    });
}

/// Finish vs release of the same session's retaining lease. In either order
/// the window is gone, the release does not bring it back, and the record is
/// forgotten once both are done (finished and idle); every gauge returns to 0.
#[test]
fn finish_vs_release_of_the_same_session() {
    model("finish_vs_release_of_the_same_session", || {
        let (core, clock, probe) = core(HIGH);
        let token = acquire(&core, &clock, &probe, b"hot-s").expect("resident");
        assert!(token.admission().retain_session);
        let (c, k) = (core.clone(), clock.clone());
        let releaser = thread::spawn(move || release(&c, &k, token));
        let (c, k) = (core.clone(), clock.clone());
        let finisher = thread::spawn(move || c.finish_session(b"hot-s", k.now()).expect("tracked"));
        releaser.join().unwrap();
        let last = finisher.join().unwrap();
        assert_eq!(
            last.reservation,
            ReservationState::None,
            "finish ends the window"
        );
        assert!(last.active_leases <= 1);
        assert!(
            core.session_stats(b"hot-s", clock.now()).is_none(),
            "forgotten"
        );
        let g = core.stats(clock.now());
        assert_eq!(
            (
                g.reserved_in_flight,
                g.reserved_in_grace,
                g.tracked_sessions
            ),
            (0, 0, 0)
        );
        assert_eq!(
            (g.active_leases, g.releases, g.sessions_finished),
            (0, 1, 1)
        );
    });
}

/// Lazy purge of an expired window vs a `reserved_session` admission. The
/// session's grace window ends at `expiry`; one thread moves the clock to
/// `expiry` and purges (as any caller would), the session's next attempt
/// runs meanwhile. The reason must follow the time of the decision (held
/// before `expiry`, over at `expiry`), and the admission's hold must survive
/// the purge: the stale timer entry of the renewed window must not end it.
#[test]
fn lazy_purge_vs_a_reserved_session_admission() {
    model("lazy_purge_vs_a_reserved_session_admission", || {
        let (core, clock, probe) = core(HIGH);
        let grace = config().idle_grace.as_nanos() as u64;
        release(
            &core,
            &clock,
            acquire(&core, &clock, &probe, b"hot-s").expect("resident"),
        );
        let expiry = clock.now() + grace;
        let (c, k) = (core.clone(), clock.clone());
        let purger = thread::spawn(move || {
            k.advance_to(expiry);
            c.purge(expiry);
        });
        let (c, k, p) = (core.clone(), clock.clone(), probe.clone());
        let admitted = thread::spawn(move || {
            let d = begin(&c, &k, b"hot-s").expect("not closed");
            let started = d.started;
            (
                started,
                drive(&c, &k, &p, d).expect("hot: admitted either way"),
            )
        });
        purger.join().unwrap();
        let (started, token) = admitted.join().unwrap();
        let decided_at = started + token.admission().wait.as_nanos() as u64;
        let expected = if decided_at < expiry {
            Reason::ReservedSession
        } else {
            Reason::ResidentPrefix
        };
        assert_eq!(
            token.admission().reason,
            expected,
            "decided at {decided_at}, window ends {expiry}"
        );
        let s = core.session_stats(b"hot-s", expiry).unwrap();
        assert_eq!(s.reservation, ReservationState::InFlight { leases: 1 });
        let g = core.stats(expiry);
        assert_eq!((g.reserved_in_flight, g.reserved_in_grace), (1, 0));
        // A renewed window did not expire; a window over at the decision did.
        assert_eq!(
            g.grace_expired,
            u64::from(expected == Reason::ResidentPrefix)
        );
        core.release(token, expiry);
        assert_eq!(
            core.session_stats(b"hot-s", expiry).unwrap().reservation,
            ReservationState::Grace {
                remaining: config().idle_grace
            },
            "the grace window ends at last release + idle_grace"
        );
    });
}

/// The next deadline reaching sleepers, with time that wakes only the
/// sleepers whose deadline passed (no `clock_advanced`, which would wake
/// everyone). Two cold waiters are asleep under pressure (no window yet, so
/// both sleep to their 100 s poll). A resident session's lease is released:
/// that opens a grace window, which becomes the core's next deadline and
/// nudges the newest sleeper, and hands a capacity event to the first
/// waiter, which re-probes, still sees pressure and sleeps again. The
/// drivers fold `Core::next_deadline` into their sleeps. Then time moves to
/// the window's end, where the engine frees its blocks. Whatever the
/// interleaving, someone must be asleep with a deadline no later than the
/// expiry, and the expiry's event must chain to both waiters: each is
/// admitted `open`.
///
/// The waiters are put to sleep before the threads start (how a waiter goes
/// to sleep is what the other models race); this keeps the model to the
/// handover and the expiry, at about 10^4 interleavings instead of 10^6.
#[test]
fn the_next_deadline_reaches_a_sleeper_after_a_window_opens() {
    model(
        "the_next_deadline_reaches_a_sleeper_after_a_window_opens",
        || {
            let (core, time, _) = core(HIGH);
            let expiry = time.now() + config().idle_grace.as_nanos() as u64; // released at the start time
            let probe = ScriptedProbe::low_from(HIGH, time.clock.clone(), expiry);
            let lease = acquire(&core, &time, &probe, b"hot-g").expect("resident");
            let waiters: Vec<_> = [&b"cold-1"[..], b"cold-2"]
                .into_iter()
                .map(|s| {
                    let (d, step) = asleep(&core, &time, s);
                    let (c, t, p) = (core.clone(), time.clone(), probe.clone());
                    thread::spawn(move || drive_from(&c, &t, &p, d, step))
                })
                .collect();
            assert_eq!(core.stats(time.now()).waiting_attempts, 2);
            let (c, t) = (core.clone(), time.clone());
            let ticker = thread::spawn(move || {
                c.release(lease, t.now()); // grace until `expiry`
                t.advance_to(expiry);
            });
            ticker.join().unwrap();
            for w in waiters {
                let token = w.join().unwrap().expect("admitted after the expiry");
                assert_eq!(token.admission().reason, Reason::Open);
                core.release(token, expiry);
            }
            let g = core.stats(expiry);
            assert_eq!(
                (g.grace_expired, g.reserved_in_grace, g.active_leases),
                (1, 0, 0)
            );
            assert_eq!((g.pending_attempts, g.waiting_attempts), (0, 0));
        },
    );
}

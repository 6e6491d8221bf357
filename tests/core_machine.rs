//! The sans-IO core driven by hand, in virtual time: every wake-up the core
//! sends is counted, so targeting (one waiter per event, chaining on
//! admission, absorption on re-wait), the next deadline and its nudge, and
//! the epoch check are asserted exactly, with no thread and no real clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvgate::core::{Attempt, Core, LeaseToken, Notify, Step, StepError};
use kvgate::{AcquireError, Config, Reason, ReservationState};

const SEC: u64 = 1_000_000_000;

struct Counting(Arc<AtomicUsize>);

impl Notify for Counting {
    fn notify(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// One attempt and the number of times the core woke it.
struct Driven<'c> {
    attempt: Attempt<&'c Core>,
    wakes: Arc<AtomicUsize>,
}

impl Driven<'_> {
    fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

fn core(poll_s: u64, grace_s: u64) -> Core {
    Core::new(Config {
        wait_poll: Duration::from_secs(poll_s),
        idle_grace: Duration::from_secs(grace_s),
        session_retention: Duration::from_secs(1000),
        ..Config::reference()
    })
    .unwrap()
}

fn begin<'c>(core: &'c Core, session: &str, now: u64, deadline: Option<u64>) -> (Driven<'c>, Step) {
    let wakes = Arc::new(AtomicUsize::new(0));
    let mut attempt = core
        .begin(
            session.as_bytes(),
            100,
            now,
            deadline,
            Box::new(Counting(wakes.clone())),
        )
        .unwrap();
    let step = attempt.start(now).unwrap();
    (Driven { attempt, wakes }, step)
}

fn admitted(step: Step) -> LeaseToken {
    match step {
        Step::Admitted(token) => token,
        other => panic!("expected admission, got {other:?}"),
    }
}

fn sleep_until(step: Step) -> u64 {
    match step {
        Step::Sleep { until_ns } => until_ns,
        other => panic!("expected sleep, got {other:?}"),
    }
}

/// A session admitted `open` at low usage.
fn open_lease(core: &Core, session: &str, now: u64) -> LeaseToken {
    let (mut d, step) = begin(core, session, now, None);
    assert!(matches!(step, Step::ProbeUsage));
    admitted(d.attempt.on_usage(Some(0.1), now).unwrap())
}

/// A cold session put to sleep under pressure; returns it and its deadline.
fn cold_waiter<'c>(core: &'c Core, session: &str, now: u64) -> (Driven<'c>, u64) {
    let (mut d, step) = begin(core, session, now, None);
    assert!(matches!(step, Step::ProbeUsage));
    let step = d.attempt.on_usage(Some(0.95), now).unwrap();
    assert!(matches!(step, Step::ProbePrefix), "{step:?}");
    let until = sleep_until(d.attempt.on_prefix(Some(0.1), now).unwrap());
    (d, until)
}

#[test]
fn open_admission_needs_one_probe_and_no_prefix() {
    let core = core(5, 60);
    let (mut d, step) = begin(&core, "a", 0, None);
    assert!(matches!(step, Step::ProbeUsage));
    let token = admitted(d.attempt.on_usage(Some(0.5), 10).unwrap());
    let a = token.admission();
    assert_eq!(a.reason, Reason::Open);
    assert!(!a.retain_session);
    assert_eq!(a.usage, Some(0.5));
    assert_eq!(a.hit_ratio, None);
    assert_eq!(a.wait, Duration::from_nanos(10));
    let s = core.stats(10);
    assert_eq!((s.usage_probe_calls, s.prefix_probe_calls), (1, 0));
    assert_eq!(s.active_leases, 1);
    core.release(token, 20);
    let s = core.stats(20);
    assert_eq!((s.active_leases, s.releases), (0, 1));
}

#[test]
fn a_release_wakes_exactly_the_longest_sleeper() {
    let core = core(100, 60);
    let lease = open_lease(&core, "running", 0);
    let (w1, _) = cold_waiter(&core, "w1", 1);
    let (w2, _) = cold_waiter(&core, "w2", 2);
    let (w3, _) = cold_waiter(&core, "w3", 3);
    let rewatch = (w1.wakes(), w2.wakes(), w3.wakes());
    core.release(lease, 4);
    assert_eq!(
        w1.wakes(),
        rewatch.0 + 1,
        "the longest sleeper gets the event"
    );
    assert_eq!(
        (w2.wakes(), w3.wakes()),
        (rewatch.1, rewatch.2),
        "nobody else"
    );
    assert_eq!(core.stats(4).waiting_attempts, 2);
}

#[test]
fn an_admitted_waiter_passes_the_event_on_and_a_rejected_one_absorbs_it() {
    let core = core(100, 60);
    let lease = open_lease(&core, "running", 0);
    let (mut w1, _) = cold_waiter(&core, "w1", 1);
    let (mut w2, _) = cold_waiter(&core, "w2", 2);
    let (w3, _) = cold_waiter(&core, "w3", 3);
    core.release(lease, 4);
    // w1 was handed the event: it looks again and is admitted open.
    let step = w1.attempt.on_wake(5).unwrap();
    assert!(matches!(step, Step::ProbeUsage), "{step:?}");
    let before = (w2.wakes(), w3.wakes());
    let t1 = admitted(w1.attempt.on_usage(Some(0.5), 5).unwrap());
    assert_eq!(t1.admission().reason, Reason::Open);
    assert!(t1.admission().waited);
    assert_eq!(
        w2.wakes(),
        before.0 + 1,
        "the admission chains to the next sleeper"
    );
    assert_eq!(w3.wakes(), before.1);
    // w2 finds the cache full again: it goes back to sleep and absorbs the event.
    assert!(matches!(w2.attempt.on_wake(6).unwrap(), Step::ProbeUsage));
    assert!(matches!(
        w2.attempt.on_usage(Some(0.95), 6).unwrap(),
        Step::ProbePrefix
    ));
    let w3_before = w3.wakes();
    sleep_until(w2.attempt.on_prefix(Some(0.1), 6).unwrap());
    assert_eq!(
        w3.wakes(),
        w3_before,
        "a rejected waiter does not wake the next"
    );
    let s = core.stats(6);
    assert_eq!(s.waiting_attempts, 2);
    assert_eq!(
        s.waits, 1,
        "only the admitted waiter has ended after sleeping"
    );
    core.release(t1, 7);
}

#[test]
fn an_event_while_probing_makes_the_attempt_look_again_instead_of_sleeping() {
    let core = core(100, 60);
    let lease = open_lease(&core, "running", 0);
    let (mut w, step) = begin(&core, "w", 1, None);
    assert!(matches!(step, Step::ProbeUsage));
    assert!(matches!(
        w.attempt.on_usage(Some(0.95), 1).unwrap(),
        Step::ProbePrefix
    ));
    // The running session finishes while w's prefix probe is in flight.
    core.release(lease, 2);
    let step = w.attempt.on_prefix(Some(0.1), 3).unwrap();
    assert!(
        matches!(step, Step::ProbeUsage),
        "must not sleep through a release it could not see: {step:?}"
    );
    assert_eq!(core.stats(3).waiting_attempts, 0);
}

/// Session `id` admitted under pressure at `t` because its prefix is resident.
fn resident_lease(core: &Core, id: &str, t: u64) -> LeaseToken {
    let (mut a, _) = begin(core, id, t, None);
    assert!(matches!(
        a.attempt.on_usage(Some(0.95), t).unwrap(),
        Step::ProbePrefix
    ));
    let token = admitted(a.attempt.on_prefix(Some(0.9), t).unwrap());
    assert_eq!(token.admission().reason, Reason::ResidentPrefix);
    token
}

/// Session `id` admitted as resident at `t0`, released at `released`: its
/// grace window ends at `released + grace`.
fn window(core: &Core, id: &str, t0: u64, released: u64) {
    core.release(resident_lease(core, id, t0), released);
}

#[test]
fn the_core_answers_its_next_deadline_and_a_sleeper_woken_then_fires_it() {
    let (poll, grace) = (100, 5);
    let core = core(poll, grace);
    assert_eq!(core.next_deadline(), None, "no window, no deadline");
    window(&core, "g1", 0, 10 * SEC);
    window(&core, "g2", 0, 11 * SEC);
    let (first, second) = ((10 + grace) * SEC, (11 + grace) * SEC);
    assert_eq!(
        core.next_deadline(),
        Some(first),
        "the earliest window's end"
    );
    // The queue holds no deadline: a sleep ends at the attempt's own poll,
    // and the driver folds the core's deadline in.
    let (mut w1, until1) = cold_waiter(&core, "w1", 12 * SEC);
    let (w2, until2) = cold_waiter(&core, "w2", 13 * SEC);
    assert_eq!((until1, until2), ((12 + poll) * SEC, (13 + poll) * SEC));
    // Nobody calls into the gate; w1's driver wakes at the deadline, and
    // its on_wake fires the expiry, an event for w1, first in line.
    let w2_before = w2.wakes();
    let step = w1.attempt.on_wake(first).unwrap();
    assert!(matches!(step, Step::ProbeUsage), "{step:?}");
    assert_eq!(
        core.session_stats(b"g1", first).unwrap().reservation,
        ReservationState::None
    );
    assert_eq!(core.stats(first).grace_expired, 1);
    assert_eq!(w2.wakes(), w2_before, "one event, one waiter woken");
    assert_eq!(core.next_deadline(), Some(second), "the next window's end");
    core.purge(second);
    assert_eq!(core.next_deadline(), None, "every window is gone");
    assert_eq!(core.stats(second).grace_expired, 2);
}

#[test]
fn a_window_that_becomes_the_earliest_deadline_nudges_the_newest_sleeper() {
    let core = core(100, 5);
    let (w1, _) = cold_waiter(&core, "w1", 0);
    let (mut w2, until) = cold_waiter(&core, "w2", 0);
    assert_eq!((until, core.next_deadline()), (100 * SEC, None));
    let token = resident_lease(&core, "g", SEC);
    let (b1, b2) = (w1.wakes(), w2.wakes());
    core.release(token, 2 * SEC); // a window until 7 s: the earliest deadline
    assert_eq!(core.next_deadline(), Some(7 * SEC));
    assert_eq!(
        w1.wakes(),
        b1 + 1,
        "the release's event, to the longest asleep"
    );
    assert_eq!(w2.wakes(), b2 + 1, "the newest sleeper is nudged");
    // Nudged, w2 has nothing to take: it sleeps on in its place, and its
    // driver asks for the deadline again.
    let until = sleep_until(w2.attempt.on_wake(2 * SEC).unwrap());
    assert_eq!(until, 100 * SEC);
    assert_eq!(
        core.stats(2 * SEC).waiting_attempts,
        1,
        "w1 left with the event"
    );
    // A later window does not move the earliest deadline: nobody is nudged.
    let b2 = w2.wakes();
    core.release(resident_lease(&core, "h", 3 * SEC), 3 * SEC);
    assert_eq!(core.next_deadline(), Some(7 * SEC));
    assert_eq!(
        w2.wakes(),
        b2 + 1,
        "only the release's event (w2 is the only sleeper)"
    );
}

#[test]
fn a_newer_attempt_seals_the_older_one_even_mid_probe() {
    let core = core(100, 60);
    let (mut old, _) = begin(&core, "s", 0, None);
    assert!(matches!(
        old.attempt.on_usage(Some(0.95), 0).unwrap(),
        Step::ProbePrefix
    ));
    let (mut new, step) = begin(&core, "s", 1, None);
    assert!(matches!(step, Step::ProbeUsage));
    assert!(old.wakes() >= 1, "the older attempt is woken at once");
    assert!(new.attempt.id() > old.attempt.id());
    // The older prefix probe now says "resident": too late, it was superseded.
    let step = old.attempt.on_prefix(Some(0.99), 2).unwrap();
    assert!(
        matches!(step, Step::Failed(AcquireError::Preempted)),
        "{step:?}"
    );
    let stats = core.session_stats(b"s", 2).unwrap();
    assert_eq!(stats.num_preempted, 1);
    assert_eq!(stats.reservation, ReservationState::None);
    assert!(stats.attempt_pending, "the newer attempt is pending");
    assert!(matches!(
        new.attempt.on_usage(Some(0.95), 3).unwrap(),
        Step::ProbePrefix
    ));
    let token = admitted(new.attempt.on_prefix(Some(0.99), 3).unwrap());
    assert_eq!(token.admission().reason, Reason::ResidentPrefix);
    let s = core.stats(3);
    assert_eq!(
        (s.preempted, s.pending_attempts, s.active_leases),
        (1, 0, 1)
    );
    core.release(token, 4);
}

#[test]
fn a_preempted_sleeper_passes_on_an_event_it_was_handed() {
    let core = core(100, 60);
    let lease = open_lease(&core, "running", 0);
    let (mut w1, _) = cold_waiter(&core, "w1", 1);
    let (w2, _) = cold_waiter(&core, "w2", 2);
    core.release(lease, 3); // w1 holds the event
    let (_newer, _) = begin(&core, "w1", 4, None); // ... and is preempted before it looks
    let before = w2.wakes();
    let step = w1.attempt.on_wake(5).unwrap();
    assert!(matches!(step, Step::Failed(AcquireError::Preempted)));
    assert_eq!(
        w2.wakes(),
        before + 1,
        "the unused event goes to the next sleeper"
    );
}

#[test]
fn grace_window_ends_exactly_at_release_plus_grace() {
    let grace = 5;
    let core = core(100, grace);
    let token = resident_lease(&core, "s", 0);
    let released = 3 * SEC;
    core.release(token, released);
    let end = released + grace * SEC;
    assert_eq!(
        core.session_stats(b"s", end - 1).unwrap().reservation,
        ReservationState::Grace {
            remaining: Duration::from_nanos(1)
        }
    );
    // One nanosecond before the end: reserved, no prefix probe.
    let (mut b, _) = begin(&core, "s", end - 1, None);
    let token = admitted(b.attempt.on_usage(Some(0.9), end - 1).unwrap());
    assert_eq!(token.admission().reason, Reason::ReservedSession);
    let released = end;
    core.release(token, released);
    let end = released + grace * SEC;
    // At the end: the window is over, the session must probe its prefix.
    let (mut c, _) = begin(&core, "s", end, None);
    let step = c.attempt.on_usage(Some(0.9), end).unwrap();
    assert!(matches!(step, Step::ProbePrefix), "{step:?}");
    assert_eq!(core.stats(end).grace_expired, 1);
    sleep_until(c.attempt.on_prefix(Some(0.0), end).unwrap());
    c.attempt.abandon(end);
}

#[test]
fn overlapping_retaining_leases_keep_the_window_in_flight() {
    let core = core(100, 5);
    let first = resident_lease(&core, "s", 0);
    // A retry of the same session while the first request still runs.
    let (mut b, _) = begin(&core, "s", 1, None);
    let second = admitted(b.attempt.on_usage(Some(0.9), 1).unwrap());
    assert_eq!(second.admission().reason, Reason::ReservedSession);
    let state = |t| core.session_stats(b"s", t).unwrap().reservation;
    assert_eq!(state(1), ReservationState::InFlight { leases: 2 });
    core.release(first, 2);
    assert_eq!(state(2), ReservationState::InFlight { leases: 1 });
    core.release(second, 3);
    assert_eq!(
        state(3),
        ReservationState::Grace {
            remaining: Duration::from_secs(5)
        }
    );
}

#[test]
fn a_lease_released_after_finish_does_not_bring_the_window_back() {
    let core = core(100, 5);
    let token = resident_lease(&core, "s", 0);
    assert!(core.finish_session(b"s", 1).is_some());
    assert_eq!(
        core.session_stats(b"s", 1).unwrap().reservation,
        ReservationState::None,
        "finish ends the window; the record stays while its lease is out"
    );
    core.release(token, 2);
    assert!(
        core.session_stats(b"s", 2).is_none(),
        "finished and idle: forgotten"
    );
    let s = core.stats(2);
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
fn a_timeout_ends_the_sleep_at_the_deadline() {
    let core = core(100, 60);
    let (mut w, step) = begin(&core, "w", 0, Some(3 * SEC));
    assert!(matches!(step, Step::ProbeUsage));
    assert!(matches!(
        w.attempt.on_usage(Some(0.95), 0).unwrap(),
        Step::ProbePrefix
    ));
    let until = sleep_until(w.attempt.on_prefix(Some(0.1), 0).unwrap());
    assert_eq!(until, 3 * SEC);
    let step = w.attempt.on_wake(3 * SEC).unwrap();
    assert!(matches!(step, Step::Failed(AcquireError::TimedOut)));
    let s = core.session_stats(b"w", 3 * SEC).unwrap();
    assert_eq!((s.timed_out, s.waits, s.attempt_pending), (1, 1, false));
    assert_eq!(core.stats(3 * SEC).waiting_attempts, 0);
}

#[test]
fn cancel_and_close_end_sleepers_and_refuse_newcomers() {
    let core = core(100, 60);
    let (mut w, _) = cold_waiter(&core, "w", 0);
    assert!(core.cancel_session(b"w"));
    assert!(!core.cancel_session(b"w"), "already cancelled");
    assert!(matches!(
        w.attempt.on_wake(1).unwrap(),
        Step::Failed(AcquireError::Cancelled)
    ));
    assert!(!core.cancel_session(b"nobody"));
    let lease = open_lease(&core, "holder", 2);
    let (mut v, _) = cold_waiter(&core, "v", 2);
    core.close();
    assert!(matches!(
        v.attempt.on_wake(3).unwrap(),
        Step::Failed(AcquireError::Closed)
    ));
    let refused = core.begin(b"late", 1, 4, None, Box::new(Counting(Arc::default())));
    assert!(matches!(refused, Err(AcquireError::Closed)));
    core.release(lease, 5); // leases outlive close
    let s = core.stats(5);
    assert_eq!(
        (s.cancelled, s.closed, s.active_leases, s.pending_attempts),
        (1, 2, 0, 0)
    );
}

#[test]
fn idle_records_are_retired_after_the_retention_period() {
    let core = Core::new(Config {
        session_retention: Duration::from_secs(10),
        idle_grace: Duration::from_secs(2),
        ..Config::reference()
    })
    .unwrap();
    core.release(open_lease(&core, "open", 0), SEC);
    core.release(resident_lease(&core, "reserved", 0), SEC);
    assert_eq!(core.stats(SEC).tracked_sessions, 2);
    // "open" is idle since 1 s: kept until 11 s. "reserved" is in grace until 3 s.
    assert!(core.session_stats(b"open", 11 * SEC - 1).is_some());
    assert_eq!(core.stats(11 * SEC).tracked_sessions, 1);
    assert!(core.session_stats(b"open", 11 * SEC).is_none());
    // Its window ended at 3 s: idle from then on, retired at 13 s.
    assert!(core.session_stats(b"reserved", 13 * SEC - 1).is_some());
    let s = core.stats(13 * SEC);
    assert_eq!((s.tracked_sessions, s.sessions_retired), (0, 2));
    assert_eq!(core.timer_entries(), 0);
}

#[test]
fn a_hundred_thousand_windows_expire_and_leave_nothing_behind() {
    let core = Core::new(Config {
        idle_grace: Duration::from_secs(60),
        session_retention: Duration::from_secs(60),
        ..Config::reference()
    })
    .unwrap();
    for i in 0..100_000u64 {
        let id = format!("session-{i}");
        let (mut a, _) = begin(&core, &id, i, None);
        assert!(matches!(
            a.attempt.on_usage(Some(0.9), i).unwrap(),
            Step::ProbePrefix
        ));
        let token = admitted(a.attempt.on_prefix(Some(0.9), i).unwrap());
        core.release(token, i);
    }
    let s = core.stats(100_000);
    assert_eq!(
        (s.tracked_sessions, s.reserved_in_grace),
        (100_000, 100_000)
    );
    assert!(core.timer_entries() <= 100_000, "one live timer per window");
    let s = core.stats(200 * SEC);
    assert_eq!(
        (s.tracked_sessions, s.reserved_in_grace, s.grace_expired),
        (0, 0, 100_000)
    );
    assert_eq!(core.timer_entries(), 0);
}

#[test]
fn finish_session_hands_back_the_final_figures_of_a_forgotten_session() {
    let core = core(100, 5);
    let (mut old, _) = begin(&core, "s", 0, None);
    let (mut new, _) = begin(&core, "s", 1, None);
    assert!(matches!(
        old.attempt.on_usage(Some(0.1), 2).unwrap(),
        Step::Failed(AcquireError::Preempted)
    ));
    core.release(admitted(new.attempt.on_usage(Some(0.1), 2).unwrap()), 3);
    let last = core.finish_session(b"s", 4).expect("the session was known");
    assert_eq!(
        (last.num_preempted, last.attempts, last.admissions),
        (1, 2, 1)
    );
    assert!(
        core.session_stats(b"s", 4).is_none(),
        "and now it is forgotten"
    );
    assert!(core.finish_session(b"s", 5).is_none());
}

#[test]
fn an_attempt_abandoned_while_holding_an_undelivered_event_passes_it_on() {
    // Regression (found by the proptest model): a sleeper handed a capacity
    // event and abandoned by its driver before it called `on_wake` (a
    // sans-IO host dropping the request) must not take the event with it,
    // or the next sleeper sleeps until its poll.
    let core = core(100, 60);
    let lease = open_lease(&core, "running", 0);
    let (mut w1, _) = cold_waiter(&core, "w1", 1);
    let (w2, _) = cold_waiter(&core, "w2", 2);
    core.release(lease, 3); // the event goes to w1, the longest asleep
    let before = w2.wakes();
    w1.attempt.abandon(4);
    assert_eq!(
        w2.wakes(),
        before + 1,
        "the unused event goes to the next sleeper"
    );
}

#[test]
fn a_window_over_before_a_retaining_decision_counts_as_expired() {
    // Regression (found by the loom model of a lazy purge vs a
    // reserved_session admission): a pass purges when it begins; a window
    // ending while its probes run is over at the decision, and a retaining
    // admission that replaces it must count it as expired like a purge would.
    let grace = 5;
    let core = core(100, grace);
    core.release(resident_lease(&core, "s", 0), 0); // window over at 5 s
    let end = grace * SEC;
    let (mut d, step) = begin(&core, "s", end - 1, None); // the pass begins inside the window
    assert!(matches!(step, Step::ProbeUsage));
    let step = d.attempt.on_usage(Some(0.9), end).unwrap(); // ... and decides at its end
    assert!(
        matches!(step, Step::ProbePrefix),
        "over at `until`: {step:?}"
    );
    let token = admitted(d.attempt.on_prefix(Some(0.9), end).unwrap());
    assert_eq!(token.admission().reason, Reason::ResidentPrefix);
    let s = core.stats(end);
    assert_eq!(
        (s.grace_expired, s.reserved_in_flight, s.reserved_in_grace),
        (1, 1, 0)
    );
    core.release(token, end);
}

/// A core that forgets an idle session at once (retention 0).
fn forgetful_core() -> Core {
    Core::new(Config {
        session_retention: Duration::ZERO,
        ..Config::reference()
    })
    .unwrap()
}

/// Issue 10, bug 1 (found through the C ABI): an attempt cancelled while it
/// is inside its usage probe, whose record is retired before the probe
/// returns (a newer attempt of the session was admitted and released),
/// must still be counted as cancelled gate-wide.
#[test]
fn a_cancelled_attempt_whose_record_was_retired_is_still_counted() {
    let core = forgetful_core();
    let (mut a, step) = begin(&core, "s", 0, None);
    assert!(matches!(step, Step::ProbeUsage)); // A is held inside its probe
    assert!(core.cancel_session(b"s"));
    let lease = open_lease(&core, "s", 1);
    core.release(lease, 2); // idle with retention 0: the record is retired
    assert!(core.session_stats(b"s", 2).is_none());
    let step = a.attempt.on_usage(Some(0.1), 3).unwrap();
    assert!(
        matches!(step, Step::Failed(AcquireError::Cancelled)),
        "{step:?}"
    );
    let g = core.stats(3);
    assert_eq!((g.attempts, g.total_admissions(), g.cancelled), (2, 1, 1));
    assert_eq!((g.pending_attempts, g.tracked_sessions), (0, 0));
}

/// The same, with a finish instead of the retirement, and a fresh record of
/// the same id made before the cancelled attempt returns: the gate counts
/// it, and the fresh record (a new session) is not charged with it.
#[test]
fn a_cancelled_attempt_is_not_charged_to_a_newer_record_of_its_id() {
    let core = core(5, 60);
    let (mut a, _) = begin(&core, "s", 0, None);
    assert!(core.cancel_session(b"s"));
    let lease = open_lease(&core, "s", 1);
    core.release(lease, 2);
    assert!(core.finish_session(b"s", 2).is_some()); // forgotten
    let fresh = open_lease(&core, "s", 3); // a new record for the same id
    let step = a.attempt.on_usage(Some(0.1), 4).unwrap();
    assert!(
        matches!(step, Step::Failed(AcquireError::Cancelled)),
        "{step:?}"
    );
    let s = core.session_stats(b"s", 4).expect("the fresh record");
    assert_eq!((s.attempts, s.admissions, s.cancelled), (1, 1, 0));
    let g = core.stats(4);
    assert_eq!((g.attempts, g.total_admissions(), g.cancelled), (3, 2, 1));
    core.release(fresh, 5);
}

/// Host misuse is refused with an error value and changes nothing (the
/// event-loop API hands attempts to C hosts step by step).
#[test]
fn a_step_out_of_order_or_after_the_end_is_refused_and_changes_nothing() {
    let core = core(5, 60);
    let (mut d, step) = begin(&core, "s", 0, None);
    assert!(matches!(step, Step::ProbeUsage));
    assert_eq!(
        d.attempt.start(0).unwrap_err(),
        StepError::OutOfOrder {
            called: "start",
            expected: "on_usage"
        }
    );
    assert_eq!(
        d.attempt.on_prefix(Some(0.9), 0).unwrap_err(),
        StepError::OutOfOrder {
            called: "on_prefix",
            expected: "on_usage"
        }
    );
    assert!(d.attempt.on_wake(0).is_err());
    assert_eq!(core.stats(0).usage_probe_calls, 0, "nothing was counted");
    let token = admitted(d.attempt.on_usage(Some(0.1), 1).unwrap());
    assert_eq!(
        d.attempt.on_usage(Some(0.1), 1).unwrap_err(),
        StepError::Ended { called: "on_usage" },
        "an answer fed twice"
    );
    assert!(d.attempt.is_done());
    core.release(token, 2);
    let g = core.stats(2);
    assert_eq!(
        (g.attempts, g.total_admissions(), g.usage_probe_calls),
        (1, 1, 1)
    );
}

/// Dropping an attempt between steps abandons it: its pending waiter goes,
/// it is counted as cancelled, and an event it was handed is passed on.
#[test]
fn an_attempt_dropped_mid_wait_abandons_itself_and_passes_its_event_on() {
    let core = core(100, 60);
    let lease = open_lease(&core, "running", 0);
    let (w1, _) = cold_waiter(&core, "w1", 1);
    let (w2, _) = cold_waiter(&core, "w2", 2);
    core.release(lease, 3); // the event goes to w1, the longest asleep
    let before = w2.wakes();
    drop(w1);
    assert_eq!(w2.wakes(), before + 1, "the event went on to w2");
    let s = core.session_stats(b"w1", 3).expect("kept for retention");
    assert!(!s.attempt_pending, "no pending waiter left behind");
    assert_eq!((s.attempts, s.cancelled, s.waits), (1, 1, 1));
    let g = core.stats(3);
    // w2 is pending, out of the queue with its event (not yet taken).
    assert_eq!(
        (g.cancelled, g.pending_attempts, g.waiting_attempts),
        (1, 1, 0)
    );
    // A dropped attempt on its first probe, too: the session can begin again.
    let (d, _) = begin(&core, "s", 4, None);
    drop(d);
    assert!(!core.session_stats(b"s", 4).unwrap().attempt_pending);
    let lease = open_lease(&core, "s", 5);
    core.release(lease, 6);
}

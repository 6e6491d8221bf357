//! Working-set admission when a session is finished while one of its turns
//! is in flight or one of its attempts is deciding or waiting: a release
//! from before the finish, a grant withdrawn by it, a waiter of a finished
//! session. Each is a case the state machine in
//! tests/proptest_core_working_set.rs found.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kvgate::core::{Core, LeaseToken, Notify, Step};
use kvgate::{Config, EngineCapacity, TurnReport};

const SEC: u64 = 1_000_000_000;

struct Counting(Arc<AtomicUsize>);

impl Notify for Counting {
    fn notify(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Begins and decides one turn of `session` (1000 tokens of KV in blocks
/// of 1, refilled in 1 s), expecting an admission.
fn turn(core: &Core, session: &[u8], prompt: usize, now: u64) -> LeaseToken {
    match ask(core, session, prompt, now).1 {
        Step::Admitted(lease) => lease,
        other => panic!("expected an admission, got {other:?}"),
    }
}

/// A session finished while a turn of it is in flight, then begun again:
/// the old turn's release must not end the new turn's stay in the working
/// set (members in flight are never cut short).
#[test]
fn a_release_from_before_a_finish_leaves_the_new_turn_in_flight() {
    let core = Core::new(Config::default()).unwrap();
    let old = turn(&core, b"a", 300, 0);
    core.finish_session(b"a", SEC);
    let new = turn(&core, b"a", 300, SEC);
    assert_eq!(core.working_set_stats().unwrap().members, 1);
    core.release_with(old, TurnReport::new(None, Some(0)), 2 * SEC);
    // Long after any window: the new turn is still in flight.
    core.purge(10 * SEC);
    assert_eq!(
        core.working_set_stats().unwrap().members,
        1,
        "the session with a turn in flight left the working set"
    );
    core.release(new, 11 * SEC);
}

/// Begins an attempt of `session` and feeds its first usage answer.
fn ask<'c>(
    core: &'c Core,
    session: &[u8],
    prompt: usize,
    now: u64,
) -> (kvgate::core::Attempt<&'c Core>, Step) {
    let mut attempt = core
        .begin(
            session,
            prompt,
            now,
            None,
            Box::new(Counting(Arc::new(AtomicUsize::new(0)))),
        )
        .unwrap();
    assert!(matches!(attempt.start(now).unwrap(), Step::ProbeUsage));
    let step = attempt
        .on_cache_state(Some(0.1), Some(EngineCapacity::new(1000, 1, 1000.0)), now)
        .unwrap();
    (attempt, step)
}

/// A grant handed to an attempt between its usage probe and its answer
/// sets its wake-event flag; if the grant is then withdrawn (its session
/// finished), the attempt's next decision to wait must put it to sleep,
/// not send it back to probe again and again at the same instant (a
/// driver with a real clock would spin on the engine's probe).
#[test]
fn an_attempt_whose_grant_was_withdrawn_sleeps_instead_of_spinning() {
    let core = Core::new(Config::default()).unwrap();
    let engine = Some(EngineCapacity::new(1000, 1, 1000.0));
    let a = turn(&core, b"a", 300, 0);
    let c = turn(&core, b"c", 300, 0);
    let (b1, step) = ask(&core, b"b", 500, 0);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    let (d, step) = ask(&core, b"d", 800, 0);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    // b's client retries: the new attempt keeps b's place, and is between
    // its usage probe and the answer when b is handed the room.
    let mut b2 = core
        .begin(
            b"b",
            500,
            1,
            None,
            Box::new(Counting(Arc::new(AtomicUsize::new(0)))),
        )
        .unwrap();
    assert!(matches!(b2.start(1).unwrap(), Step::ProbeUsage));
    core.release(a, 2);
    core.finish_session(b"a", 2);
    // b's session ends before its attempt collects the grant; d is first now.
    core.finish_session(b"b", 3);
    let mut step = b2.on_cache_state(Some(0.1), engine, 4).unwrap();
    let mut passes = 1;
    while matches!(step, Step::ProbeUsage) && passes < 100 {
        step = b2.on_cache_state(Some(0.1), engine, 4).unwrap();
        passes += 1;
    }
    assert!(
        matches!(step, Step::Sleep { .. }),
        "after {passes} passes at the same instant: {step:?}"
    );
    drop((b1, d, b2));
    core.release(c, 5);
}

/// A session finished while its attempt waits in line: finishing cancels
/// no attempt, so the attempt keeps its place, and when room is made (here
/// the working set empties) it is handed the room and woken, not left to
/// its poll (an hour here).
#[test]
fn a_waiter_of_a_finished_session_is_woken_when_room_is_made() {
    let core = Core::new(Config {
        wait_poll: std::time::Duration::from_secs(3600),
        ..Config::default()
    })
    .unwrap();
    let engine = Some(EngineCapacity::new(1000, 1, 1000.0));
    let a = turn(&core, b"a", 600, 0);
    let wakes = Arc::new(AtomicUsize::new(0));
    let mut b = core
        .begin(b"b", 500, 0, None, Box::new(Counting(wakes.clone())))
        .unwrap();
    assert!(matches!(b.start(0).unwrap(), Step::ProbeUsage));
    let step = b.on_cache_state(Some(0.1), engine, 0).unwrap();
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    core.finish_session(b"b", SEC);
    assert_eq!(
        core.working_set_stats().unwrap().waiting,
        1,
        "b keeps its place"
    );
    core.release(a, 2 * SEC);
    core.finish_session(b"a", 2 * SEC);
    assert!(wakes.load(Ordering::SeqCst) > 0, "b was woken for the room");
    assert_eq!(
        core.working_set_stats().unwrap().members,
        1,
        "b was handed it"
    );
    let now = 2 * SEC + 1;
    // Handed the room while it slept: admitted on waking, no probe asked.
    match b.on_wake(now).unwrap() {
        Step::Admitted(lease) => core.release(lease, now),
        other => panic!("{other:?}"),
    }
}

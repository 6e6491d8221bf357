//! Issue 54: a host may release a waiting turn to another replica where
//! the gate counts its cache gone (a new, parked or ghost session); a turn
//! of a session whose cache the gate holds hot is refused and keeps its
//! place.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kvgate::core::{Core, Step};
use kvgate::{AcquireError, AdmissionMode, Config, ReleaseError, TurnReport};

#[path = "support/core_turns.rs"]
mod core_turns;
use core_turns::{admitted, ask};

const SEC: u64 = 1_000_000_000;

fn core(admission: AdmissionMode) -> Core {
    Core::new(Config {
        admission,
        wait_poll: Duration::from_secs(100),
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn a_waiting_new_session_is_released_and_the_queue_moves_up() {
    let core = core(AdmissionMode::WorkingSet);
    let a = admitted(ask(&core, "a", 600, 0).2);
    let b = admitted(ask(&core, "b", 300, 0).2);
    let (mut c, c_wakes, step) = ask(&core, "c", 500, 0);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    let (_d, _, step) = ask(&core, "d", 400, 0);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    assert_eq!(core.working_set_stats().unwrap().waiting, 2);
    assert_eq!(core.waiting_cache_gone(b"c"), Some(true));
    assert_eq!(core.waiting_cache_gone(b"a"), Some(false));

    core.release_elsewhere(b"c", SEC / 10).unwrap();
    // Out of the queue at once, woken, and its attempt ends released: not
    // a cancel, not a timeout.
    assert_eq!(core.working_set_stats().unwrap().waiting, 1);
    assert!(c_wakes.load(Ordering::SeqCst) > 0);
    let step = c.on_wake(SEC / 10).unwrap();
    assert!(
        matches!(step, Step::Failed(AcquireError::Released)),
        "{step:?}"
    );
    let stats = core.stats(SEC / 10);
    assert_eq!((stats.cancelled, stats.timed_out), (0, 0));
    assert_eq!(core.waiting_cache_gone(b"c"), None);
    // Asked again: nothing waits for it any more.
    assert_eq!(
        core.release_elsewhere(b"c", SEC / 10),
        Err(ReleaseError::NotWaiting)
    );
    core.release_with(a, TurnReport::new(Some(0), Some(0)), SEC);
    core.release_with(b, TurnReport::new(Some(0), Some(0)), SEC);
}

#[test]
fn a_member_is_refused_and_keeps_its_place() {
    let core = core(AdmissionMode::WorkingSet);
    let a = admitted(ask(&core, "a", 600, 0).2);
    let (_c, _, step) = ask(&core, "c", 500, 0);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    // a is a member: its cache is hot here.
    assert_eq!(core.release_elsewhere(b"a", 0), Err(ReleaseError::CacheHot));
    assert_eq!(
        ReleaseError::CacheHot.to_string(),
        "the gate holds the session's cache hot here: its turn keeps its place"
    );
    core.release_with(a, TurnReport::new(Some(0), Some(0)), SEC / 10);
    // Between turns, within its window, it comes back as a member.
    let again = admitted(ask(&core, "a", 650, SEC / 5).2);
    assert_eq!(core.working_set_stats().unwrap().members, 1);
    assert_eq!(
        core.release_elsewhere(b"nobody", SEC / 5),
        Err(ReleaseError::NotWaiting)
    );
    core.release(again, SEC);
}

#[test]
fn a_gate_without_a_working_set_cannot_tell() {
    let core = core(AdmissionMode::Reference);
    assert_eq!(core.waiting_cache_gone(b"a"), None);
    assert_eq!(
        core.release_elsewhere(b"a", 0),
        Err(ReleaseError::NoWorkingSet)
    );
}

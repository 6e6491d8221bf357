//! loom models of working-set admission's shared state: the hand-over of
//! room to a waiting session's own attempt racing the release that frees
//! it, and a cancel racing that hand-over (the grant is passed on, never
//! lost or leaked).
//!
//! Virtual time never moves in these models: a waiter can only get in by
//! being handed the room, so a lost hand-over is a deadlock loom reports.

#![cfg(loom)]

#[path = "support/loom_harness.rs"]
mod harness;

use std::sync::Arc as StdArc;

use harness::*;
use kvgate::core::{Core, Step};
use kvgate::{AcquireError, AdmissionMode, Config, Reason};
use loom::thread;

/// A working-set core whose engine holds exactly one session (`PROMPT`).
fn working_set() -> (StdArc<Core>, StdArc<VirtualTime>, StdArc<ScriptedProbe>) {
    let (_, time, _) = core(LOW);
    let core = Core::new(Config {
        admission: AdmissionMode::WorkingSet,
        ..config()
    })
    .expect("valid config");
    (
        StdArc::new(core),
        time,
        ScriptedProbe::with_capacity(LOW, PROMPT.len() as u64),
    )
}

#[test]
fn a_hand_over_races_the_release_that_frees_the_room() {
    model("a_hand_over_races_the_release_that_frees_the_room", || {
        let (core, time, probe) = working_set();
        let a = acquire(&core, &time, &probe, b"a").expect("admitted");
        assert_eq!(a.admission().reason, Reason::EmptyWorkingSet);
        let frees = {
            let (core, time) = (core.clone(), time.clone());
            thread::spawn(move || {
                core.release(a, time.now());
                core.finish_session(b"a", time.now());
            })
        };
        let waits = {
            let (core, time, probe) = (core.clone(), time.clone(), probe.clone());
            thread::spawn(move || acquire(&core, &time, &probe, b"b"))
        };
        frees.join().unwrap();
        let b = waits.join().unwrap().expect("b is let in");
        // Admitted alone, whether it looked before or after a left.
        assert_eq!(b.admission().reason, Reason::EmptyWorkingSet);
        let stats = core.stats(time.now());
        assert_eq!(stats.pending_attempts, 0);
        assert_eq!(stats.working_set.members, 1);
        assert_eq!(stats.working_set.waiting, 0);
        core.release(b, time.now());
    });
}

#[test]
fn a_cancel_races_the_hand_over_and_the_grant_is_never_lost() {
    model(
        "a_cancel_races_the_hand_over_and_the_grant_is_never_lost",
        || {
            let (core, time, probe) = working_set();
            let a = acquire(&core, &time, &probe, b"a").expect("admitted");
            // b waits for the room, on this thread.
            let mut b = begin(&core, &time, b"b").expect("not closed");
            assert!(matches!(
                b.attempt.start(time.now()).unwrap(),
                Step::ProbeUsage
            ));
            let step = b
                .attempt
                .on_cache_state(Some(LOW), probe_capacity(&probe), time.now())
                .unwrap();
            assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
            let frees = {
                let (core, time) = (core.clone(), time.clone());
                thread::spawn(move || {
                    core.release(a, time.now());
                    core.finish_session(b"a", time.now());
                })
            };
            let cancels = {
                let core = core.clone();
                thread::spawn(move || core.cancel_session(b"b"))
            };
            frees.join().unwrap();
            let cancelled = cancels.join().unwrap();
            let outcome = drive_from(&core, &time, &probe, b, step);
            match outcome {
                Ok(lease) => {
                    assert!(!cancelled, "a cancelled attempt is never admitted");
                    core.release(lease, time.now());
                }
                Err(err) => {
                    assert!(cancelled);
                    assert_eq!(err, AcquireError::Cancelled);
                }
            }
            // Whatever happened to b, the room is free for the next session.
            let c = acquire(&core, &time, &probe, b"c").expect("admitted");
            assert_eq!(c.admission().reason, Reason::EmptyWorkingSet);
            assert_eq!(core.stats(time.now()).pending_attempts, 0);
            core.release(c, time.now());
        },
    );
}

fn probe_capacity(probe: &ScriptedProbe) -> Option<kvgate::EngineCapacity> {
    kvgate::Probe::kv_cache_capacity(probe, b"")
}

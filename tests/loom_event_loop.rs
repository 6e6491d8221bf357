//! loom models of the event-loop wake path, through the real `extern "C"`
//! functions: a sleeping attempt's tag must reach its host whatever the
//! interleaving of the gate's wake-ups (a release, a preemption) with the
//! host draining the waker.
//!
//! The property is the one an event loop relies on: after the threads are
//! done, every tag the gate delivered was either taken by the concurrent
//! drain, or is still queued **and the bell is rung** (the descriptor would
//! be readable, so the loop drains it next). A lost ring would leave a
//! sleeping attempt asleep until its poll deadline: a stall no test with a
//! real clock would notice.
//!
//! Bounds: preemption bound 2 (`LOOM_MAX_PREEMPTIONS`), as the other
//! models; the races are between at most three threads at two locks and
//! one flag, which two preemptions cover.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_event_loop`.
#![cfg(loom)]

use std::mem::MaybeUninit;
use std::ptr;

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::kvgate_step_kind::*;
use kvgate::ffi::*;
use loom::thread;

struct Ptr<T>(*mut T);
impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}
// SAFETY: gates and wakers are documented thread-safe; attempts may be
// stepped from any thread, one call at a time (each model uses one per thread).
unsafe impl<T> Send for Ptr<T> {}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

fn reference_gate() -> Ptr<kvgate_gate> {
    let mut gate = ptr::null_mut();
    // SAFETY: a fresh builder, used and freed here; a writable out.
    unsafe {
        let config = kvgate_config_new();
        let mode = kvgate_admission_mode::KVGATE_ADMISSION_MODE_REFERENCE as u32;
        assert_eq!(kvgate_config_set_admission_mode(config, mode), KVGATE_OK);
        assert_eq!(kvgate_new(config, &mut gate), KVGATE_OK);
        kvgate_config_free(config);
    }
    Ptr(gate)
}

fn begin(
    gate: Ptr<kvgate_gate>,
    session: &[u8],
    waker: Ptr<kvgate_waker>,
    tag: u64,
) -> (Ptr<kvgate_attempt>, kvgate_step) {
    let mut attempt = ptr::null_mut();
    let mut step = MaybeUninit::uninit();
    // SAFETY: live handles, a session slice, writable outs.
    unsafe {
        let status = kvgate_attempt_begin(
            gate.0,
            session.as_ptr(),
            session.len(),
            1,
            -1,
            waker.0,
            tag,
            &mut attempt,
            step.as_mut_ptr(),
        );
        assert_eq!(status, KVGATE_OK);
        (Ptr(attempt), step.assume_init())
    }
}

fn answer_usage(a: Ptr<kvgate_attempt>, usage: f64) -> kvgate_step {
    let mut step = MaybeUninit::uninit();
    // SAFETY: a live attempt, a writable out.
    unsafe {
        assert_eq!(
            kvgate_attempt_answer_usage(a.0, usage, 0, 0, 0.0, step.as_mut_ptr()),
            KVGATE_OK
        );
        step.assume_init()
    }
}

/// Reference mode, usage 0.95 and a cold prefix: asleep.
fn asleep(
    gate: Ptr<kvgate_gate>,
    session: &[u8],
    waker: Ptr<kvgate_waker>,
    tag: u64,
) -> Ptr<kvgate_attempt> {
    let (a, _) = begin(gate, session, waker, tag);
    assert_eq!(answer_usage(a, 0.95).kind, KVGATE_STEP_PROBE_PREFIX);
    let mut step = MaybeUninit::uninit();
    // SAFETY: a live attempt, a writable out.
    let step = unsafe {
        assert_eq!(
            kvgate_attempt_answer_prefix(a.0, 0.0, step.as_mut_ptr()),
            KVGATE_OK
        );
        step.assume_init()
    };
    assert_eq!(step.kind, KVGATE_STEP_SLEEP);
    a
}

fn drain(waker: Ptr<kvgate_waker>) -> Vec<u64> {
    let mut tags = [0u64; 4];
    let mut n = 0;
    // SAFETY: a live waker, four writable tags, a writable count.
    assert_eq!(
        unsafe { kvgate_waker_drain(waker.0, tags.as_mut_ptr(), 4, &mut n) },
        KVGATE_OK
    );
    tags[..n].to_vec()
}

/// After the race: every tag in `delivered` that `drained` missed is queued
/// with the bell rung.
fn check_nothing_lost(waker: Ptr<kvgate_waker>, drained: Vec<u64>, delivered: &[u64]) {
    // SAFETY: a live waker.
    let rung = unsafe { waker_is_rung_for_models(waker.0) };
    let later = drain(waker);
    for tag in delivered {
        if !drained.contains(tag) {
            assert!(
                rung,
                "tag {tag} not drained ({drained:?}) and the descriptor not readable (later {later:?})"
            );
            assert!(later.contains(tag), "tag {tag} was lost");
        }
    }
}

#[test]
fn a_release_racing_the_loops_drain_never_loses_the_ring() {
    model(|| {
        let gate = reference_gate();
        let mut w = ptr::null_mut();
        // SAFETY: a writable out.
        assert_eq!(unsafe { kvgate_waker_new(&mut w) }, KVGATE_OK);
        let waker = Ptr(w);
        let (held, step) = begin(gate, b"a", waker, 1);
        assert_eq!(step.kind, KVGATE_STEP_PROBE_USAGE);
        let lease = answer_usage(held, 0.1).admission.lease;
        let sleeper = asleep(gate, b"b", waker, 2);
        let releaser = thread::spawn(move || {
            // SAFETY: a live gate.
            assert_eq!(unsafe { kvgate_release(gate.0, lease) }, KVGATE_OK);
        });
        let drained = drain(waker);
        releaser.join().unwrap();
        check_nothing_lost(waker, drained, &[2]);
        // The woken attempt goes on to a new pass.
        let mut step = MaybeUninit::uninit();
        // SAFETY: live handles, each freed once after every other call returned.
        unsafe {
            assert_eq!(kvgate_attempt_wake(sleeper.0, step.as_mut_ptr()), KVGATE_OK);
            assert_eq!(step.assume_init().kind, KVGATE_STEP_PROBE_USAGE);
            kvgate_attempt_free(sleeper.0);
            kvgate_attempt_free(held.0);
            kvgate_free(gate.0);
            kvgate_waker_free(waker.0);
        }
    });
}

#[test]
fn two_wake_ups_racing_one_drain_coalesce_without_loss() {
    model(|| {
        let gate = reference_gate();
        let mut w = ptr::null_mut();
        // SAFETY: a writable out.
        assert_eq!(unsafe { kvgate_waker_new(&mut w) }, KVGATE_OK);
        let waker = Ptr(w);
        let (held, _) = begin(gate, b"a", waker, 1);
        let lease = answer_usage(held, 0.1).admission.lease;
        let first = asleep(gate, b"b", waker, 2);
        let second = asleep(gate, b"c", waker, 3);
        // A release wakes the longest sleeper (2); a newer attempt of `c`
        // preempts 3. Both ring concurrently with the loop's drain.
        let releaser = thread::spawn(move || {
            // SAFETY: a live gate.
            assert_eq!(unsafe { kvgate_release(gate.0, lease) }, KVGATE_OK);
        });
        let retry = thread::spawn(move || begin(gate, b"c", waker, 4).0);
        let drained = drain(waker);
        releaser.join().unwrap();
        let newer = retry.join().unwrap();
        check_nothing_lost(waker, drained, &[2, 3]);
        // SAFETY: live handles, each freed once after every other call returned.
        unsafe {
            for a in [first, second, newer, held] {
                kvgate_attempt_free(a.0);
            }
            kvgate_free(gate.0);
            kvgate_waker_free(waker.0);
        }
    });
}

//! The event-loop C API (`kvgate_attempt_*`, `kvgate_waker_*`, `kvgate_tick`)
//! driven through its `extern "C"` functions as a loop host would: steps
//! answered by hand, wake-ups read off the descriptor with `poll(2)`, and
//! misuse answered with statuses and messages.
//!
//! No test sleeps or asserts a timing target: the descriptor is polled with
//! a zero timeout right after the call that must (or must not) ring it.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::Mutex;

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::kvgate_step_kind::*;
use kvgate::ffi::*;

#[path = "support/ffi_support.rs"]
mod ffi_support;
use ffi_support::{gate_with, last_error, stats, waker};

const POLL_SEC: f64 = 60.0;

/// A gate in working-set (`reference == false`) or reference mode, with no
/// probe callbacks (event-loop attempts answer their probes themselves).
fn gate(reference: bool, idle_grace_sec: f64) -> *mut kvgate_gate {
    gate_with(reference, |config| {
        // SAFETY: the builder `gate_with` made, alive for this call.
        unsafe {
            assert_eq!(kvgate_config_set_wait_poll_sec(config, POLL_SEC), KVGATE_OK);
            assert_eq!(
                kvgate_config_set_idle_grace_sec(config, idle_grace_sec),
                KVGATE_OK
            );
        }
    })
}

fn fd_of(w: *mut kvgate_waker) -> i32 {
    let mut fd = -1;
    // SAFETY: a live waker and a writable out.
    assert_eq!(unsafe { kvgate_waker_fd(w, &mut fd) }, KVGATE_OK);
    fd
}

/// Whether the waker's descriptor is readable right now.
fn readable(w: *mut kvgate_waker) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd_of(w),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n == 1 && pfd.revents & libc::POLLIN != 0
}

fn drain(w: *mut kvgate_waker, capacity: usize) -> Vec<u64> {
    let mut tags = vec![0u64; capacity];
    let mut n = usize::MAX;
    // SAFETY: a live waker, `capacity` writable tags, a writable count.
    assert_eq!(
        unsafe { kvgate_waker_drain(w, tags.as_mut_ptr(), capacity, &mut n) },
        KVGATE_OK
    );
    tags.truncate(n);
    tags
}

/// An attempt and its latest step.
struct Driven {
    attempt: *mut kvgate_attempt,
    step: kvgate_step,
}

fn begin(
    gate: *mut kvgate_gate,
    session: &str,
    timeout_ms: i64,
    w: *mut kvgate_waker,
    tag: u64,
) -> Driven {
    begin_turn(gate, session, Prompt::Length(100), timeout_ms, w, tag)
}

/// What a test tells `kvgate_attempt_begin*` of the prompt.
enum Prompt<'a> {
    Length(usize),
    Ids(&'a [u32]),
}

fn begin_turn(
    gate: *mut kvgate_gate,
    session: &str,
    prompt: Prompt<'_>,
    timeout_ms: i64,
    w: *mut kvgate_waker,
    tag: u64,
) -> Driven {
    let mut attempt = ptr::null_mut();
    let mut step = MaybeUninit::uninit();
    let (s, n) = (session.as_ptr(), session.len());
    let (a, out) = (&mut attempt, step.as_mut_ptr());
    // SAFETY: live gate and waker, session and prompt slices, writable outs.
    let status = unsafe {
        match prompt {
            Prompt::Length(len) => {
                kvgate_attempt_begin(gate, s, n, len, timeout_ms, w, tag, a, out)
            }
            Prompt::Ids(ids) => kvgate_attempt_begin_with_prompt(
                gate,
                s,
                n,
                ids.as_ptr(),
                ids.len(),
                timeout_ms,
                w,
                tag,
                a,
                out,
            ),
        }
    };
    assert_eq!(status, KVGATE_OK, "{}", last_error());
    Driven {
        attempt,
        // SAFETY: written on KVGATE_OK.
        step: unsafe { step.assume_init() },
    }
}

impl Driven {
    fn kind(&self) -> kvgate_step_kind {
        self.step.kind
    }

    /// Answers a usage step (capacity unknown unless given).
    fn usage(&mut self, usage: f64, capacity_tokens: u64) -> kvgate_status {
        let mut step = MaybeUninit::uninit();
        // SAFETY: a live attempt and a writable out.
        let status = unsafe {
            kvgate_attempt_answer_usage(
                self.attempt,
                usage,
                capacity_tokens,
                16,
                0.0,
                step.as_mut_ptr(),
            )
        };
        if status == KVGATE_OK {
            // SAFETY: written on KVGATE_OK.
            self.step = unsafe { step.assume_init() };
        }
        status
    }

    fn prefix(&mut self, hit: f64) -> kvgate_status {
        let mut step = MaybeUninit::uninit();
        // SAFETY: a live attempt and a writable out.
        let status = unsafe { kvgate_attempt_answer_prefix(self.attempt, hit, step.as_mut_ptr()) };
        if status == KVGATE_OK {
            // SAFETY: written on KVGATE_OK.
            self.step = unsafe { step.assume_init() };
        }
        status
    }

    fn wake(&mut self) -> kvgate_status {
        let mut step = MaybeUninit::uninit();
        // SAFETY: a live attempt and a writable out.
        let status = unsafe { kvgate_attempt_wake(self.attempt, step.as_mut_ptr()) };
        if status == KVGATE_OK {
            // SAFETY: written on KVGATE_OK.
            self.step = unsafe { step.assume_init() };
        }
        status
    }

    fn lease(&self) -> u64 {
        assert_eq!(self.kind(), KVGATE_STEP_ADMITTED, "{:?}", self.step);
        self.step.admission.lease
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // SAFETY: the attempt is live and freed once, here.
        unsafe { kvgate_attempt_free(self.attempt) };
    }
}

/// Reference mode: admitted open at low usage.
fn admitted_open(gate: *mut kvgate_gate, session: &str, w: *mut kvgate_waker) -> u64 {
    let mut a = begin(gate, session, -1, w, 0);
    assert_eq!(a.kind(), KVGATE_STEP_PROBE_USAGE);
    assert_eq!(a.usage(0.1, 0), KVGATE_OK);
    a.lease()
}

/// Reference mode: asleep at high usage with a cold prefix.
fn asleep(gate: *mut kvgate_gate, session: &str, w: *mut kvgate_waker, tag: u64) -> Driven {
    let mut a = begin(gate, session, -1, w, tag);
    assert_eq!(a.usage(0.95, 0), KVGATE_OK);
    assert_eq!(a.kind(), KVGATE_STEP_PROBE_PREFIX);
    assert_eq!(a.prefix(0.0), KVGATE_OK);
    assert_eq!(a.kind(), KVGATE_STEP_SLEEP);
    assert!(a.step.sleep_ns > 0 && a.step.sleep_ns <= (POLL_SEC * 1e9) as u64);
    a
}

fn free(gate: *mut kvgate_gate, w: *mut kvgate_waker) {
    // SAFETY: live handles, freed once, nothing else in progress.
    unsafe {
        kvgate_free(gate);
        kvgate_waker_free(w);
    }
}

#[test]
fn a_working_set_attempt_is_admitted_from_its_usage_answer() {
    let (g, w) = (gate(false, 5.0), waker());
    let mut a = begin(g, "s", -1, w, 1);
    assert_eq!(a.kind(), KVGATE_STEP_PROBE_USAGE);
    assert_eq!(a.usage(0.0, 100_000), KVGATE_OK);
    let lease = a.lease();
    assert_ne!(lease, KVGATE_NO_LEASE);
    assert_eq!(
        a.step.admission.reason,
        kvgate_reason::KVGATE_REASON_EMPTY_WORKING_SET
    );
    assert_eq!(a.step.status, KVGATE_OK);
    // SAFETY: a live gate.
    assert_eq!(
        unsafe { kvgate_release_with_report(g, lease, 0, 10) },
        KVGATE_OK
    );
    let s = stats(g);
    assert_eq!((s.admissions, s.releases, s.active_leases), (1, 1, 0));
    assert_eq!(
        s.usage_probe_calls, 1,
        "the host's answer is counted as a probe"
    );
    drop(a);
    free(g, w);
}

#[test]
fn a_sleeping_attempt_is_woken_through_the_descriptor_by_a_release() {
    let (g, w) = (gate(true, 0.0), waker());
    let held = admitted_open(g, "a", w);
    let mut b = asleep(g, "b", w, 7);
    assert!(!readable(w), "nothing to look at yet");
    assert_eq!(stats(g).waiting_attempts, 1);
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, held) }, KVGATE_OK);
    assert!(readable(w), "the release rang the bell");
    assert_eq!(drain(w, 8), vec![7]);
    assert!(!readable(w), "drained");
    assert_eq!(b.wake(), KVGATE_OK);
    assert_eq!(b.kind(), KVGATE_STEP_PROBE_USAGE, "a new pass");
    assert_eq!(b.usage(0.1, 0), KVGATE_OK);
    let lease = b.lease();
    assert!(b.step.admission.waited);
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, lease) }, KVGATE_OK);
    drop(b);
    free(g, w);
}

#[test]
fn a_newer_attempt_preempts_the_sleeping_one_through_its_tag() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let mut old = asleep(g, "b", w, 1);
    let newer = begin(g, "b", -1, w, 2);
    assert_eq!(newer.kind(), KVGATE_STEP_PROBE_USAGE);
    assert_eq!(drain(w, 8), vec![1], "only the preempted attempt is woken");
    assert_eq!(old.wake(), KVGATE_OK);
    assert_eq!(old.kind(), KVGATE_STEP_FAILED);
    assert_eq!(old.step.status, KVGATE_PREEMPTED);
    assert_eq!(stats(g).preempted, 1);
    drop((old, newer));
    free(g, w);
}

#[test]
fn a_cancelled_attempt_leaves_the_queue_and_takes_no_more_steps() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let mut b = asleep(g, "b", w, 3);
    // SAFETY: a live attempt.
    assert_eq!(unsafe { kvgate_attempt_cancel(b.attempt) }, KVGATE_OK);
    let s = stats(g);
    assert_eq!(
        (s.cancelled, s.waiting_attempts, s.pending_attempts),
        (1, 0, 0)
    );
    assert_eq!(b.wake(), KVGATE_OUT_OF_ORDER);
    assert!(last_error().contains("has ended"), "{}", last_error());
    // SAFETY: cancelling again is a no-op.
    assert_eq!(unsafe { kvgate_attempt_cancel(b.attempt) }, KVGATE_OK);
    assert_eq!(stats(g).cancelled, 1);
    drop(b);
    free(g, w);
}

#[test]
fn freeing_an_attempt_that_has_not_ended_cancels_it() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let b = asleep(g, "b", w, 3);
    drop(b);
    let s = stats(g);
    assert_eq!(
        (s.cancelled, s.waiting_attempts, s.pending_attempts),
        (1, 0, 0)
    );
    free(g, w);
}

#[test]
fn an_answer_the_attempt_did_not_ask_for_is_refused_and_changes_nothing() {
    let (g, w) = (gate(true, 0.0), waker());
    let mut a = begin(g, "s", -1, w, 0);
    assert_eq!(a.kind(), KVGATE_STEP_PROBE_USAGE);
    assert_eq!(a.prefix(0.5), KVGATE_OUT_OF_ORDER);
    let msg = last_error();
    assert!(
        msg.contains("kvgate_attempt_answer_prefix") && msg.contains("kvgate_attempt_answer_usage"),
        "{msg}"
    );
    assert_eq!(a.wake(), KVGATE_OUT_OF_ORDER);
    assert_eq!(a.kind(), KVGATE_STEP_PROBE_USAGE, "unchanged");
    assert_eq!(a.usage(0.1, 0), KVGATE_OK);
    let lease = a.lease();
    assert_eq!(a.usage(0.1, 0), KVGATE_OUT_OF_ORDER, "a step after the end");
    assert!(last_error().contains("has ended"));
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, lease) }, KVGATE_OK);
    drop(a);
    free(g, w);
}

#[test]
fn null_pointers_are_refused_with_the_argument_named() {
    let (g, w) = (gate(true, 0.0), waker());
    let mut step = MaybeUninit::uninit();
    let mut attempt = ptr::null_mut();
    // SAFETY: every call passes NULL where it is refused before any access.
    unsafe {
        let s = b"s";
        let null_gate = kvgate_attempt_begin(
            ptr::null_mut(),
            s.as_ptr(),
            1,
            1,
            -1,
            w,
            0,
            &mut attempt,
            step.as_mut_ptr(),
        );
        assert_eq!(null_gate, KVGATE_INVALID_ARGUMENT);
        assert!(last_error().contains("gate"));
        let null_waker = kvgate_attempt_begin(
            g,
            s.as_ptr(),
            1,
            1,
            -1,
            ptr::null(),
            0,
            &mut attempt,
            step.as_mut_ptr(),
        );
        assert_eq!(null_waker, KVGATE_INVALID_ARGUMENT);
        assert!(last_error().contains("waker"));
        let null_out = kvgate_attempt_begin(
            g,
            s.as_ptr(),
            1,
            1,
            -1,
            w,
            0,
            ptr::null_mut(),
            step.as_mut_ptr(),
        );
        assert_eq!(null_out, KVGATE_INVALID_ARGUMENT);
        assert!(last_error().contains("out_attempt"));
        assert_eq!(
            kvgate_attempt_wake(ptr::null_mut(), step.as_mut_ptr()),
            KVGATE_INVALID_ARGUMENT
        );
        assert_eq!(
            kvgate_attempt_cancel(ptr::null_mut()),
            KVGATE_INVALID_ARGUMENT
        );
        kvgate_attempt_free(ptr::null_mut());
        kvgate_waker_free(ptr::null_mut());
        let mut n = 0;
        assert_eq!(
            kvgate_waker_drain(w, ptr::null_mut(), 4, &mut n),
            KVGATE_INVALID_ARGUMENT
        );
        assert!(last_error().contains("tags is NULL"));
        assert_eq!(kvgate_waker_drain(w, ptr::null_mut(), 0, &mut n), KVGATE_OK);
        assert_eq!(n, 0);
        let (mut until, mut sleep) = (0, 0);
        assert_eq!(
            kvgate_tick(ptr::null_mut(), &mut until, &mut sleep),
            KVGATE_INVALID_ARGUMENT
        );
    }
    assert_eq!(stats(g).attempts, 0, "nothing began");
    free(g, w);
}

#[test]
fn a_zero_timeout_fails_after_one_pass_instead_of_sleeping() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let mut b = begin(g, "b", 0, w, 0);
    assert_eq!(b.usage(0.95, 0), KVGATE_OK);
    assert_eq!(b.prefix(0.0), KVGATE_OK);
    assert_eq!(b.kind(), KVGATE_STEP_FAILED);
    assert_eq!(b.step.status, KVGATE_TIMED_OUT);
    assert_eq!(stats(g).timed_out, 1);
    drop(b);
    free(g, w);
}

#[test]
fn a_probe_answer_may_come_from_another_thread() {
    struct Send(*mut kvgate_attempt);
    // SAFETY: attempts may be stepped from any thread, one call at a time.
    unsafe impl std::marker::Send for Send {}
    let (g, w) = (gate(false, 5.0), waker());
    let a = begin(g, "s", -1, w, 0);
    let handle = Send(a.attempt);
    let step = std::thread::spawn(move || {
        let handle = handle;
        let mut step = MaybeUninit::uninit();
        // SAFETY: a live attempt (the main thread waits for this one) and a writable out.
        let status = unsafe {
            kvgate_attempt_answer_usage(handle.0, 0.0, 50_000, 16, 1e5, step.as_mut_ptr())
        };
        assert_eq!(status, KVGATE_OK);
        // SAFETY: written on KVGATE_OK.
        unsafe { step.assume_init() }
    })
    .join()
    .unwrap();
    assert_eq!(step.kind, KVGATE_STEP_ADMITTED);
    // SAFETY: a live gate.
    assert_eq!(
        unsafe { kvgate_release(g, step.admission.lease) },
        KVGATE_OK
    );
    drop(a);
    free(g, w);
}

#[test]
fn a_drain_smaller_than_the_queue_leaves_the_descriptor_readable() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let sleepers: Vec<Driven> = (1..=3).map(|t| asleep(g, &format!("s{t}"), w, t)).collect();
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_close(g) }, KVGATE_OK);
    let mut seen = drain(w, 2);
    assert_eq!(seen.len(), 2);
    assert!(readable(w), "one tag left");
    seen.extend(drain(w, 2));
    assert!(!readable(w));
    seen.sort_unstable();
    assert_eq!(seen, vec![1, 2, 3], "close wakes every sleeper");
    for mut s in sleepers {
        assert_eq!(s.wake(), KVGATE_OK);
        assert_eq!(s.step.status, KVGATE_CLOSED);
    }
    free(g, w);
}

#[test]
fn freeing_the_gate_ends_its_sleeping_attempts_with_closed() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let mut b = asleep(g, "b", w, 9);
    // SAFETY: a live gate; the attempt keeps the gate's memory alive.
    unsafe { kvgate_free(g) };
    // Woken by the close, then again by the release of the lease `kvgate_free`
    // releases: a tag may come more than once.
    let mut tags = drain(w, 4);
    tags.dedup();
    assert_eq!(tags, vec![9]);
    assert_eq!(b.wake(), KVGATE_OK);
    assert_eq!(
        (b.kind(), b.step.status),
        (KVGATE_STEP_FAILED, KVGATE_CLOSED)
    );
    drop(b);
    // SAFETY: the host's waker, freed once.
    unsafe { kvgate_waker_free(w) };
}

#[test]
fn a_closed_gate_refuses_new_attempts() {
    let (g, w) = (gate(false, 5.0), waker());
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_close(g) }, KVGATE_OK);
    let mut attempt = ptr::null_mut();
    let mut step = MaybeUninit::uninit();
    // SAFETY: live handles and writable outs.
    let status = unsafe {
        kvgate_attempt_begin(
            g,
            b"s".as_ptr(),
            1,
            1,
            -1,
            w,
            0,
            &mut attempt,
            step.as_mut_ptr(),
        )
    };
    assert_eq!(status, KVGATE_CLOSED);
    assert!(attempt.is_null(), "nothing written");
    free(g, w);
}

#[test]
fn the_gate_timer_reports_a_grace_window_and_fires_it() {
    let (g, w) = (gate(true, 5.0), waker());
    let (mut until, mut sleep) = (0, 0);
    // SAFETY: a live gate and writable outs.
    assert_eq!(unsafe { kvgate_tick(g, &mut until, &mut sleep) }, KVGATE_OK);
    assert_eq!((until, sleep), (u64::MAX, u64::MAX), "nothing pending");
    // Resident prefix under pressure: the lease retains the session.
    let mut a = begin(g, "a", -1, w, 0);
    assert_eq!(a.usage(0.95, 0), KVGATE_OK);
    assert_eq!(a.prefix(0.9), KVGATE_OK);
    assert!(a.step.admission.retain_session);
    let mut before = 0;
    // SAFETY: live gate, writable outs.
    unsafe {
        assert_eq!(kvgate_now_ns(g, &mut before), KVGATE_OK);
        assert_eq!(kvgate_release(g, a.lease()), KVGATE_OK);
        assert_eq!(kvgate_tick(g, &mut until, &mut sleep), KVGATE_OK);
    }
    let window = 5_000_000_000;
    assert!(
        until >= before + window && until < before + 2 * window,
        "{until} vs {before}"
    );
    assert!(sleep <= window && sleep > window / 2, "{sleep}");
    assert_eq!(stats(g).reserved_in_grace, 1);
    drop(a);
    free(g, w);
}

/// Records the tags a callback waker is given (`user_data`).
unsafe extern "C" fn record_tag(user_data: *mut c_void, tag: u64) {
    // SAFETY: the test passes a live `Mutex<Vec<u64>>`.
    let tags = unsafe { &*user_data.cast::<Mutex<Vec<u64>>>() };
    tags.lock().unwrap().push(tag);
}

#[test]
fn a_callback_waker_is_called_with_the_tag_and_has_no_descriptor() {
    let tags = Mutex::new(Vec::<u64>::new());
    let mut w = ptr::null_mut();
    // SAFETY: a callback that obeys kvgate_wake_fn; `tags` outlives the waker's attempts.
    unsafe {
        assert_eq!(
            kvgate_waker_new_callback(None, ptr::null_mut(), &mut w),
            KVGATE_INVALID_ARGUMENT
        );
        let user_data = (&tags as *const Mutex<Vec<u64>>).cast_mut().cast();
        assert_eq!(
            kvgate_waker_new_callback(Some(record_tag), user_data, &mut w),
            KVGATE_OK
        );
        let mut fd = 0;
        assert_eq!(kvgate_waker_fd(w, &mut fd), KVGATE_INVALID_ARGUMENT);
        let mut n = 0;
        assert_eq!(
            kvgate_waker_drain(w, ptr::null_mut(), 0, &mut n),
            KVGATE_INVALID_ARGUMENT
        );
    }
    let g = gate(true, 0.0);
    let held = admitted_open(g, "a", w);
    let mut b = asleep(g, "b", w, 42);
    assert!(tags.lock().unwrap().is_empty());
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, held) }, KVGATE_OK);
    assert_eq!(*tags.lock().unwrap(), vec![42]);
    assert_eq!(b.wake(), KVGATE_OK);
    assert_eq!(b.kind(), KVGATE_STEP_PROBE_USAGE);
    drop(b);
    free(g, w);
}

#[test]
fn a_timeout_ends_a_sleeping_attempt_at_its_deadline_as_the_blocking_call_does() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let mut b = begin(g, "b", 30, w, 5);
    assert_eq!(b.usage(0.95, 0), KVGATE_OK);
    assert_eq!(b.prefix(0.0), KVGATE_OK);
    assert_eq!(b.kind(), KVGATE_STEP_SLEEP);
    assert!(
        b.step.sleep_ns <= 30_000_000,
        "the sleep ends at the timeout, not at the 60 s poll: {}",
        b.step.sleep_ns
    );
    // Sleep as a loop would: on the descriptor, until the step's deadline.
    let mut pfd = libc::pollfd {
        fd: fd_of(w),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = b.step.sleep_ns.div_ceil(1_000_000) as i32 + 1;
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, ms) }, 0, "nothing rang");
    assert_eq!(b.wake(), KVGATE_OK);
    assert_eq!(
        (b.kind(), b.step.status),
        (KVGATE_STEP_FAILED, KVGATE_TIMED_OUT)
    );
    let s = stats(g);
    assert_eq!(
        (s.timed_out, s.waiting_attempts, s.pending_attempts),
        (1, 0, 0)
    );
    drop(b);
    free(g, w);
}

#[test]
fn an_attempt_preempted_while_its_probe_is_out_fails_when_the_answer_comes() {
    let (g, w) = (gate(false, 5.0), waker());
    let mut old = begin(g, "s", -1, w, 1);
    assert_eq!(old.kind(), KVGATE_STEP_PROBE_USAGE);
    // The engine's answer is still on its way when the session retries.
    let mut newer = begin(g, "s", -1, w, 2);
    assert_eq!(old.usage(0.0, 100_000), KVGATE_OK);
    assert_eq!(
        (old.kind(), old.step.status),
        (KVGATE_STEP_FAILED, KVGATE_PREEMPTED)
    );
    assert_eq!(newer.usage(0.0, 100_000), KVGATE_OK);
    let lease = newer.lease();
    let s = stats(g);
    assert_eq!((s.preempted, s.admissions), (1, 1));
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, lease) }, KVGATE_OK);
    drop((old, newer));
    free(g, w);
}

/// Three sessions whose first prompts share their first 2,000 tokens,
/// behind an engine that reports no cached tokens (-1). Returns the shared
/// prefix the working set learned, from the stats.
fn shared_prefix_learned(with_ids: bool) -> u64 {
    let (g, w) = (gate(false, 5.0), waker());
    for session in 0..3u32 {
        let prompt: Vec<u32> = (0..2_000)
            .chain((0..3_000).map(|i| 100_000 * (session + 1) + i))
            .collect();
        let told = if with_ids {
            Prompt::Ids(&prompt)
        } else {
            Prompt::Length(prompt.len())
        };
        let name = format!("agent-{session}");
        let mut a = begin_turn(g, &name, told, -1, w, 0);
        assert_eq!(a.usage(0.1, 100_000), KVGATE_OK);
        let lease = a.lease();
        // SAFETY: a live gate.
        assert_eq!(
            unsafe { kvgate_release_with_report(g, lease, -1, 0) },
            KVGATE_OK
        );
    }
    let shared = stats(g).working_set_shared_prefix_tokens;
    free(g, w);
    shared
}

#[test]
fn with_the_prompt_ids_the_shared_prefix_is_learned_without_cached_reports() {
    let shared = shared_prefix_learned(true);
    assert!((1..=2_000).contains(&shared), "{shared}");
    // Given only lengths, one turn at a time (the usage gauge shows no
    // sharing then), nothing is learned.
    assert_eq!(shared_prefix_learned(false), 0);
}

#[test]
fn a_null_prompt_with_a_length_is_refused_and_an_empty_one_is_not() {
    let (g, w) = (gate(false, 5.0), waker());
    let mut step = MaybeUninit::uninit();
    let mut attempt = ptr::null_mut();
    // SAFETY: NULL where it is refused before any access; a NULL prompt of
    // length 0 is allowed.
    unsafe {
        let s = b"s";
        let status = kvgate_attempt_begin_with_prompt(
            g,
            s.as_ptr(),
            1,
            ptr::null(),
            3,
            -1,
            w,
            0,
            &mut attempt,
            step.as_mut_ptr(),
        );
        assert_eq!(status, KVGATE_INVALID_ARGUMENT);
        assert!(
            last_error().contains("prompt_ids is NULL"),
            "{}",
            last_error()
        );
        assert_eq!(stats(g).attempts, 0, "nothing began");
        let status = kvgate_attempt_begin_with_prompt(
            g,
            s.as_ptr(),
            1,
            ptr::null(),
            0,
            -1,
            w,
            0,
            &mut attempt,
            step.as_mut_ptr(),
        );
        assert_eq!(status, KVGATE_OK, "{}", last_error());
        kvgate_attempt_free(attempt);
    }
    free(g, w);
}

fn end(a: &Driven, why: u32) -> kvgate_status {
    // SAFETY: a live attempt.
    unsafe { kvgate_attempt_end(a.attempt, why) }
}

fn session_stats(gate: *mut kvgate_gate, session: &str) -> kvgate_session_stats {
    let mut out = MaybeUninit::uninit();
    // SAFETY: a live gate, a live id, a writable out of the size given.
    let status = unsafe {
        kvgate_get_session_stats(
            gate,
            session.as_ptr(),
            session.len(),
            out.as_mut_ptr(),
            std::mem::size_of::<kvgate_session_stats>(),
        )
    };
    assert_eq!(status, KVGATE_OK, "{}", last_error());
    // SAFETY: written on KVGATE_OK.
    unsafe { out.assume_init() }
}

#[test]
fn an_attempt_its_host_preempts_is_counted_preempted_and_leaves_the_queue() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let mut b = asleep(g, "b", w, 3);
    assert_eq!(
        end(&b, KVGATE_PREEMPTED as u32),
        KVGATE_OK,
        "{}",
        last_error()
    );
    let s = stats(g);
    assert_eq!(
        (s.preempted, s.cancelled, s.timed_out),
        (1, 0, 0),
        "counted as preempted, not cancelled"
    );
    assert_eq!((s.waiting_attempts, s.pending_attempts), (0, 0));
    let bs = session_stats(g, "b");
    assert_eq!((bs.num_preempted, bs.cancelled), (1, 0));
    assert!(!bs.attempt_pending);
    assert_eq!(b.wake(), KVGATE_OUT_OF_ORDER, "it takes no more steps");
    assert_eq!(
        end(&b, KVGATE_TIMED_OUT as u32),
        KVGATE_OUT_OF_ORDER,
        "an ended attempt is not ended again"
    );
    assert!(last_error().contains("has ended"), "{}", last_error());
    drop(b);
    let s = stats(g);
    assert_eq!(
        (s.preempted, s.timed_out, s.cancelled),
        (1, 0, 0),
        "the free counts nothing"
    );
    free(g, w);
}

#[test]
fn an_attempt_whose_probe_hangs_past_its_timeout_is_counted_timed_out() {
    let (g, w) = (gate(false, 5.0), waker());
    let mut a = begin(g, "s", 60_000, w, 1);
    assert_eq!(
        a.kind(),
        KVGATE_STEP_PROBE_USAGE,
        "its host asks the engine"
    );
    assert_eq!(
        end(&a, KVGATE_TIMED_OUT as u32),
        KVGATE_OK,
        "{}",
        last_error()
    );
    let s = stats(g);
    assert_eq!((s.timed_out, s.cancelled, s.preempted), (1, 0, 0));
    assert_eq!((s.pending_attempts, s.working_set_waiting_sessions), (0, 0));
    assert_eq!(
        a.usage(0.0, 100_000),
        KVGATE_OUT_OF_ORDER,
        "the late answer is refused"
    );
    assert_eq!(stats(g).admissions, 0);
    drop(a);
    // The session is free to try again, and is admitted.
    let mut again = begin(g, "s", -1, w, 2);
    assert_eq!(again.usage(0.0, 100_000), KVGATE_OK);
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, again.lease()) }, KVGATE_OK);
    drop(again);
    free(g, w);
}

#[test]
fn ending_an_attempt_with_any_other_status_is_refused_and_changes_nothing() {
    let (g, w) = (gate(true, 0.0), waker());
    let mut a = begin(g, "s", -1, w, 0);
    for why in [
        KVGATE_OK as u32,
        KVGATE_CANCELLED as u32,
        KVGATE_CLOSED as u32,
        KVGATE_OUT_OF_ORDER as u32,
        99,
        u32::MAX,
    ] {
        assert_eq!(end(&a, why), KVGATE_INVALID_ARGUMENT, "why = {why}");
        assert!(
            last_error().contains("KVGATE_PREEMPTED"),
            "{}",
            last_error()
        );
    }
    // SAFETY: NULL is refused with the argument named.
    assert_eq!(
        unsafe { kvgate_attempt_end(ptr::null_mut(), KVGATE_PREEMPTED as u32) },
        KVGATE_INVALID_ARGUMENT
    );
    assert!(last_error().contains("attempt"), "{}", last_error());
    let s = stats(g);
    assert_eq!(
        (s.preempted, s.timed_out, s.cancelled, s.pending_attempts),
        (0, 0, 0, 1)
    );
    assert_eq!(a.kind(), KVGATE_STEP_PROBE_USAGE, "unchanged");
    assert_eq!(a.usage(0.1, 0), KVGATE_OK);
    let lease = a.lease();
    assert_eq!(
        end(&a, KVGATE_PREEMPTED as u32),
        KVGATE_OUT_OF_ORDER,
        "an admitted attempt has ended"
    );
    assert_eq!(stats(g).preempted, 0);
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, lease) }, KVGATE_OK);
    drop(a);
    free(g, w);
}

#[test]
fn an_attempt_a_newer_one_preempted_first_keeps_that_outcome_when_ended() {
    let (g, w) = (gate(true, 0.0), waker());
    let _held = admitted_open(g, "a", w);
    let old = asleep(g, "b", w, 1);
    let newer = begin(g, "b", -1, w, 2);
    assert_eq!(end(&old, KVGATE_TIMED_OUT as u32), KVGATE_OK);
    let s = stats(g);
    assert_eq!(
        (s.preempted, s.timed_out, s.cancelled),
        (1, 0, 0),
        "counted once, as sealed"
    );
    assert_eq!(s.pending_attempts, 1, "the newer attempt keeps its place");
    assert_eq!(end(&old, KVGATE_PREEMPTED as u32), KVGATE_OUT_OF_ORDER);
    assert_eq!(session_stats(g, "b").num_preempted, 1);
    drop((old, newer));
    free(g, w);
}

#[test]
fn a_working_set_attempt_its_host_preempts_gives_up_its_place_in_the_queue() {
    let (g, w) = (gate(false, 5.0), waker());
    let mut a = begin(g, "a", -1, w, 1);
    assert_eq!(a.usage(0.0, 150), KVGATE_OK);
    let held = a.lease();
    let mut b = begin(g, "b", -1, w, 2);
    assert_eq!(b.usage(0.9, 150), KVGATE_OK);
    assert_eq!(b.kind(), KVGATE_STEP_SLEEP, "{:?}", b.step);
    assert_eq!(stats(g).working_set_waiting_sessions, 1);
    assert_eq!(end(&b, KVGATE_PREEMPTED as u32), KVGATE_OK);
    let s = stats(g);
    assert_eq!((s.preempted, s.cancelled), (1, 0));
    assert_eq!(
        (
            s.working_set_waiting_sessions,
            s.waiting_attempts,
            s.pending_attempts
        ),
        (0, 0, 0),
        "its place went with it"
    );
    assert_eq!(s.active_leases, 1, "a's lease is all that is left");
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(g, held) }, KVGATE_OK);
    let s = stats(g);
    assert_eq!(
        (s.preempted, s.cancelled, s.working_set_waiting_sessions),
        (1, 0, 0),
        "the release hands nothing to the ended attempt"
    );
    drop((a, b));
    free(g, w);
}

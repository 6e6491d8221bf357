//! The C ABI exercised through its `extern "C"` functions, as a C host would
//! call them: statuses, out-parameters, last-error messages, misuse, and the
//! lifetime rules of `kvgate_free`.
//!
//! As in `gate_blocking.rs`, no test asserts a timing target: waits are
//! bounded by generous patience limits so a bug hangs a test for seconds,
//! and "promptly" means well under the configured poll interval.

use std::ffi::{c_void, CStr};
use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use kvgate::ffi::*;

#[path = "support/ffi_support.rs"]
mod ffi_support;
use ffi_support::last_error;

const PATIENCE: Duration = Duration::from_secs(30);
const POLL_SEC: f64 = 20.0;
const PROMPT: &[u32] = &[1, 2, 3, 4];

use kvgate::ffi::kvgate_status::*;

// ---------------------------------------------------------------------------
// A toy engine behind the C callbacks
// ---------------------------------------------------------------------------

/// What the probes answer; `user_data` points to one of these.
struct Engine {
    usage: AtomicU64, // f64 bits; NaN means "unavailable" (the probe returns false)
    hit: AtomicU64,   // f64 bits; NaN means "unavailable"
    usage_calls: AtomicUsize,
    /// When set, the next usage call reports entering and blocks until told to go.
    hold: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    /// Set by the test once `kvgate_free` returned: no probe may run after.
    freed: AtomicBool,
    probe_after_free: AtomicBool,
    /// A gate for the probe to free from inside its own callback.
    free_from_callback: Mutex<Option<usize>>,
    /// A gate the probe reads stats from after being let go (0: none), and
    /// the status it got (u32::MAX: not called).
    nested_stats_gate: AtomicUsize,
    nested_stats_status: AtomicU32,
}

impl Engine {
    fn new(usage: f64, hit: f64) -> Box<Self> {
        Box::new(Self {
            usage: AtomicU64::new(usage.to_bits()),
            hit: AtomicU64::new(hit.to_bits()),
            usage_calls: AtomicUsize::new(0),
            hold: Mutex::new(None),
            freed: AtomicBool::new(false),
            probe_after_free: AtomicBool::new(false),
            free_from_callback: Mutex::new(None),
            nested_stats_gate: AtomicUsize::new(0),
            nested_stats_status: AtomicU32::new(u32::MAX),
        })
    }

    fn set_usage(&self, v: f64) {
        self.usage.store(v.to_bits(), Ordering::SeqCst);
    }

    fn set_hit(&self, v: f64) {
        self.hit.store(v.to_bits(), Ordering::SeqCst);
    }

    /// Sets this engine's probes on `config`.
    ///
    /// # Safety
    /// `config` is a live builder.
    unsafe fn set_probes(&self, config: *mut kvgate_config) {
        let user_data = (self as *const Engine).cast_mut().cast();
        // SAFETY: a live builder (caller); the probes obey the header.
        let status = unsafe {
            kvgate_config_set_probes(config, Some(usage_probe), Some(prefix_probe), user_data)
        };
        assert_eq!(status, KVGATE_OK);
    }
}

unsafe fn engine<'a>(user_data: *mut c_void) -> &'a Engine {
    // SAFETY: every gate in these tests gets a live `Engine` as user_data,
    // kept alive until after `kvgate_free` returned.
    unsafe { &*user_data.cast::<Engine>() }
}

unsafe extern "C" fn usage_probe(
    user_data: *mut c_void,
    _session: *const u8,
    _len: usize,
    out: *mut f64,
) -> bool {
    // SAFETY: see `engine`.
    let e = unsafe { engine(user_data) };
    if e.freed.load(Ordering::SeqCst) {
        e.probe_after_free.store(true, Ordering::SeqCst);
    }
    e.usage_calls.fetch_add(1, Ordering::SeqCst);
    if let Some((entered, go)) = e.hold.lock().unwrap().take() {
        entered.send(()).unwrap();
        go.recv_timeout(PATIENCE)
            .expect("the test never let the probe go");
        let gate = e.nested_stats_gate.load(Ordering::SeqCst);
        if gate != 0 {
            let mut stats = std::mem::MaybeUninit::uninit();
            // SAFETY: a call made from a probe callback of an acquire in
            // progress: the header allows it even while kvgate_free runs.
            let status = unsafe {
                kvgate_get_stats(
                    gate as *mut kvgate_gate,
                    stats.as_mut_ptr(),
                    size_of::<kvgate_stats>(),
                )
            };
            e.nested_stats_status.store(status as u32, Ordering::SeqCst);
        }
    }
    if let Some(gate) = e.free_from_callback.lock().unwrap().take() {
        // SAFETY: the test handed this gate over to be freed here, once.
        unsafe { kvgate_free(gate as *mut kvgate_gate) };
    }
    let v = f64::from_bits(e.usage.load(Ordering::SeqCst));
    if v.is_nan() {
        return false;
    }
    // SAFETY: the gate passes a writable f64.
    unsafe { *out = v };
    true
}

unsafe extern "C" fn prefix_probe(
    user_data: *mut c_void,
    _session: *const u8,
    _len: usize,
    _prompt: *const u32,
    _prompt_len: usize,
    out: *mut f64,
) -> bool {
    // SAFETY: see `engine`.
    let e = unsafe { engine(user_data) };
    let v = f64::from_bits(e.hit.load(Ordering::SeqCst));
    if v.is_nan() {
        return false;
    }
    // SAFETY: the gate passes a writable f64.
    unsafe { *out = v };
    true
}

// ---------------------------------------------------------------------------
// Thin, checked wrappers (what a host's own binding layer would be)
// ---------------------------------------------------------------------------

/// A gate pointer that may cross threads (the gate is thread-safe).
#[derive(Clone, Copy)]
struct GatePtr(*mut kvgate_gate);
// SAFETY: kvgate_gate is documented thread-safe for every call but free.
unsafe impl Send for GatePtr {}

fn new_gate(engine: &Engine, idle_grace_sec: f64) -> GatePtr {
    let config = kvgate_config_new();
    assert!(!config.is_null());
    let mut gate = ptr::null_mut();
    // SAFETY: a live builder, a writable out-pointer, probes over a live engine.
    unsafe {
        // These tests exercise the seed's decision table through the ABI.
        assert_eq!(
            kvgate_config_set_admission_mode(
                config,
                kvgate_admission_mode::KVGATE_ADMISSION_MODE_REFERENCE as u32
            ),
            KVGATE_OK
        );
        assert_eq!(kvgate_config_set_wait_poll_sec(config, POLL_SEC), KVGATE_OK);
        assert_eq!(
            kvgate_config_set_idle_grace_sec(config, idle_grace_sec),
            KVGATE_OK
        );
        engine.set_probes(config);
        assert_eq!(kvgate_new(config, &mut gate), KVGATE_OK);
        kvgate_config_free(config);
    }
    assert!(!gate.is_null());
    GatePtr(gate)
}

fn acquire(
    gate: GatePtr,
    session: &str,
    timeout_ms: i64,
) -> Result<kvgate_admission, kvgate_status> {
    let mut out = std::mem::MaybeUninit::<kvgate_admission>::uninit();
    // SAFETY: a live gate, live arrays with their lengths, a writable out.
    let status = unsafe {
        kvgate_acquire(
            gate.0,
            session.as_ptr(),
            session.len(),
            PROMPT.as_ptr(),
            PROMPT.len(),
            timeout_ms,
            out.as_mut_ptr(),
        )
    };
    if status == KVGATE_OK {
        // SAFETY: written on KVGATE_OK.
        Ok(unsafe { out.assume_init() })
    } else {
        Err(status)
    }
}

fn release(gate: GatePtr, lease: u64) -> kvgate_status {
    // SAFETY: a live gate.
    unsafe { kvgate_release(gate.0, lease) }
}

fn stats(gate: GatePtr) -> kvgate_stats {
    ffi_support::stats(gate.0)
}

fn session_stats(gate: GatePtr, session: &str) -> Result<kvgate_session_stats, kvgate_status> {
    let mut out = std::mem::MaybeUninit::uninit();
    // SAFETY: a live gate, a live id, a writable out.
    let status = unsafe {
        kvgate_get_session_stats(
            gate.0,
            session.as_ptr(),
            session.len(),
            out.as_mut_ptr(),
            size_of::<kvgate_session_stats>(),
        )
    };
    // SAFETY: written on KVGATE_OK.
    (status == KVGATE_OK)
        .then(|| unsafe { out.assume_init() })
        .ok_or(status)
}

fn free(gate: GatePtr) {
    // SAFETY: freed once, nothing else running on it but acquires.
    unsafe { kvgate_free(gate.0) };
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

fn spawn_acquire(
    gate: GatePtr,
    session: &'static str,
) -> thread::JoinHandle<(Result<kvgate_admission, kvgate_status>, Duration)> {
    thread::spawn(move || {
        let start = Instant::now();
        let result = acquire(gate, session, -1);
        (result, start.elapsed())
    })
}

/// Must be well under POLL_SEC: a woken waiter returns within it.
const PROMPTLY: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn open_admission_release_and_double_release() {
    let e = Engine::new(0.30, f64::NAN);
    let gate = new_gate(&e, 60.0);
    let a = acquire(gate, "agent-1", -1).unwrap();
    assert_eq!(a.reason, kvgate_reason::KVGATE_REASON_OPEN);
    assert_ne!(a.lease, KVGATE_NO_LEASE);
    assert_eq!(a.usage, 0.30);
    assert!(a.hit_ratio.is_nan(), "not asked below the watermark");
    assert!(!a.retain_session && !a.waited);
    assert_eq!(stats(gate).active_leases, 1);

    assert_eq!(release(gate, a.lease), KVGATE_OK);
    assert_eq!(release(gate, a.lease), KVGATE_UNKNOWN_LEASE);
    assert!(last_error().contains(&format!("lease {} is not outstanding", a.lease)));
    assert_eq!(release(gate, KVGATE_NO_LEASE), KVGATE_UNKNOWN_LEASE);
    assert_eq!(release(gate, 0xdead_beef), KVGATE_UNKNOWN_LEASE);
    let s = stats(gate);
    assert_eq!((s.active_leases, s.releases, s.admissions), (0, 1, 1));
    assert_eq!(s.admissions_open, 1);
    assert_eq!(s.size, size_of::<kvgate_stats>());
    free(gate);
}

#[test]
fn every_reason_under_pressure_and_garbage_answers() {
    let e = Engine::new(0.95, 0.99);
    let gate = new_gate(&e, 60.0);
    let a = acquire(gate, "hot", 0).unwrap();
    assert_eq!(a.reason, kvgate_reason::KVGATE_REASON_RESIDENT_PREFIX);
    assert!(a.retain_session);
    assert_eq!(a.hit_ratio, 0.99);
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    let s = session_stats(gate, "hot").unwrap();
    assert!(s.reserved && s.in_grace && s.grace_remaining_sec > 0.0);

    e.set_hit(0.0); // cold now, but the window lets the next turn in
    let a = acquire(gate, "hot", 0).unwrap();
    assert_eq!(a.reason, kvgate_reason::KVGATE_REASON_RESERVED_SESSION);
    assert!(
        a.hit_ratio.is_nan(),
        "a reserved session skips the prefix probe"
    );
    let s = session_stats(gate, "hot").unwrap();
    assert_eq!(
        (s.active_leases, s.retaining_leases, s.in_grace),
        (1, 1, false)
    );
    assert_eq!(release(gate, a.lease), KVGATE_OK);

    e.set_hit(f64::NAN);
    let a = acquire(gate, "unknown-prefix", 0).unwrap();
    assert_eq!(
        a.reason,
        kvgate_reason::KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE
    );
    assert_eq!(release(gate, a.lease), KVGATE_OK);

    e.set_hit(7.5); // garbage: out of [0, 1] counts as unavailable
    let a = acquire(gate, "garbage", 0).unwrap();
    assert_eq!(
        a.reason,
        kvgate_reason::KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE
    );
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    e.set_usage(-3.0); // garbage usage: unavailable, so open
    let a = acquire(gate, "garbage", 0).unwrap();
    assert_eq!(a.reason, kvgate_reason::KVGATE_REASON_OPEN);
    assert!(a.usage.is_nan());
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    let s = stats(gate);
    assert_eq!((s.prefix_probe_invalid, s.usage_probe_invalid), (1, 1));

    e.set_usage(0.95);
    e.set_hit(0.10);
    assert_eq!(acquire(gate, "cold", 0).unwrap_err(), KVGATE_TIMED_OUT);
    assert!(
        last_error().contains("not admitted within timeout_ms = 0"),
        "{}",
        last_error()
    );
    assert_eq!(session_stats(gate, "cold").unwrap().timed_out, 1);
    free(gate);
}

#[test]
fn a_release_wakes_a_waiter_and_a_newer_attempt_preempts_an_older_one() {
    let e = Engine::new(0.95, 0.99);
    let gate = new_gate(&e, 0.0);
    let holder = acquire(gate, "holder", 0).unwrap();
    e.set_hit(0.10); // everyone else is cold

    let first = spawn_acquire(gate, "retrying");
    wait_until("the first attempt waits", || {
        stats(gate).waiting_attempts == 1
    });
    let second = spawn_acquire(gate, "retrying");
    let (result, took) = first.join().unwrap();
    assert_eq!(result.unwrap_err(), KVGATE_PREEMPTED);
    assert!(took < PROMPTLY, "preempted attempt returned after {took:?}");
    wait_until("the newer attempt waits", || {
        stats(gate).waiting_attempts == 1
    });

    e.set_usage(0.30); // capacity frees up
    assert_eq!(release(gate, holder.lease), KVGATE_OK);
    let (result, took) = second.join().unwrap();
    let a = result.unwrap();
    assert!(took < PROMPTLY, "woken waiter returned after {took:?}");
    assert!(a.waited && a.wait_sec > 0.0);
    assert_eq!(a.reason, kvgate_reason::KVGATE_REASON_OPEN);
    let s = session_stats(gate, "retrying").unwrap();
    assert_eq!((s.num_preempted, s.attempts, s.admissions), (1, 2, 1));
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    free(gate);
}

#[test]
fn cancel_finish_and_not_found() {
    let e = Engine::new(0.95, 0.10);
    let gate = new_gate(&e, 60.0);
    let s = "to-cancel";
    // SAFETY: a live gate and id.
    let cancel = || unsafe { kvgate_cancel_session(gate.0, s.as_ptr(), s.len()) };
    assert_eq!(cancel(), KVGATE_NOT_FOUND, "nothing waits yet");
    let waiter = spawn_acquire(gate, s);
    wait_until("the attempt waits", || stats(gate).waiting_attempts == 1);
    assert_eq!(cancel(), KVGATE_OK);
    let (result, took) = waiter.join().unwrap();
    assert_eq!(result.unwrap_err(), KVGATE_CANCELLED);
    assert!(took < PROMPTLY);

    let mut last = std::mem::MaybeUninit::<kvgate_session_stats>::uninit();
    // SAFETY: a live gate, id and out.
    let status = unsafe {
        kvgate_finish_session(
            gate.0,
            s.as_ptr(),
            s.len(),
            last.as_mut_ptr(),
            size_of::<kvgate_session_stats>(),
        )
    };
    assert_eq!(status, KVGATE_OK);
    // SAFETY: written on KVGATE_OK.
    let last = unsafe { last.assume_init() };
    assert_eq!((last.cancelled, last.attempts, last.waits), (1, 1, 1));
    assert_eq!(session_stats(gate, s).unwrap_err(), KVGATE_NOT_FOUND);
    assert!(last_error().contains("is not tracked"), "{}", last_error());
    // SAFETY: as above; a NULL out_final is allowed.
    let again = unsafe { kvgate_finish_session(gate.0, s.as_ptr(), s.len(), ptr::null_mut(), 0) };
    assert_eq!(again, KVGATE_NOT_FOUND);
    free(gate);
}

#[test]
fn misuse_is_refused_with_a_message() {
    let e = Engine::new(0.30, 0.5);
    let gate = new_gate(&e, 60.0);
    let mut out = std::mem::MaybeUninit::<kvgate_admission>::uninit();
    let null_gate = ptr::null_mut();
    // SAFETY: every call is refused before touching the bad pointer.
    unsafe {
        let s = kvgate_acquire(
            null_gate,
            ptr::null(),
            0,
            ptr::null(),
            0,
            -1,
            out.as_mut_ptr(),
        );
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
        assert_eq!(last_error(), "kvgate_acquire: gate is NULL");
        let s = kvgate_acquire(gate.0, ptr::null(), 5, ptr::null(), 0, -1, out.as_mut_ptr());
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
        assert_eq!(
            last_error(),
            "kvgate_acquire: session_id is NULL but session_id_len is 5"
        );
        let s = kvgate_acquire(
            gate.0,
            b"x".as_ptr(),
            1,
            ptr::null(),
            3,
            -1,
            out.as_mut_ptr(),
        );
        assert_eq!(
            last_error(),
            "kvgate_acquire: prompt_ids is NULL but prompt_len is 3"
        );
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
        let s = kvgate_acquire(
            gate.0,
            b"x".as_ptr(),
            1,
            ptr::null(),
            0,
            -1,
            ptr::null_mut(),
        );
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
        assert_eq!(last_error(), "kvgate_acquire: out is NULL");
        let words = [0u32; 4];
        let odd = words.as_ptr().cast::<u8>().add(2).cast::<u32>();
        let s = kvgate_acquire(gate.0, b"x".as_ptr(), 1, odd, 2, -1, out.as_mut_ptr());
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
        assert!(last_error().contains("prompt_ids"), "{}", last_error());
        assert_eq!(stats(gate).attempts, 0, "refused before any attempt began");

        assert_eq!(kvgate_release(null_gate, 1), KVGATE_INVALID_ARGUMENT);
        assert_eq!(kvgate_close(null_gate), KVGATE_INVALID_ARGUMENT);
        assert_eq!(
            kvgate_get_stats(gate.0, ptr::null_mut(), size_of::<kvgate_stats>()),
            KVGATE_INVALID_ARGUMENT
        );
        assert_eq!(
            kvgate_get_stats(
                null_gate,
                &mut std::mem::zeroed(),
                size_of::<kvgate_stats>()
            ),
            KVGATE_INVALID_ARGUMENT
        );
        let mut ss = std::mem::zeroed();
        assert_eq!(
            kvgate_get_session_stats(
                gate.0,
                ptr::null(),
                2,
                &mut ss,
                size_of::<kvgate_session_stats>()
            ),
            KVGATE_INVALID_ARGUMENT
        );
        assert_eq!(
            kvgate_cancel_session(null_gate, ptr::null(), 0),
            KVGATE_INVALID_ARGUMENT
        );
        assert_eq!(
            kvgate_finish_session(gate.0, ptr::null(), 1, ptr::null_mut(), 0),
            KVGATE_INVALID_ARGUMENT
        );

        let mut g = ptr::null_mut();
        assert_eq!(kvgate_new(ptr::null(), &mut g), KVGATE_INVALID_ARGUMENT);
        assert_eq!(last_error(), "kvgate_new: config is NULL");
        let config = kvgate_config_new();
        assert_eq!(kvgate_new(config, ptr::null_mut()), KVGATE_INVALID_ARGUMENT);
        assert_eq!(last_error(), "kvgate_new: out is NULL");
        kvgate_config_free(config);
        kvgate_free(ptr::null_mut()); // a no-op, like free(NULL)
        kvgate_config_free(ptr::null_mut());
    }
    // A success leaves the last error alone.
    let a = acquire(gate, "fine", -1).unwrap();
    assert_eq!(last_error(), "kvgate_new: out is NULL");
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    free(gate);
}

#[test]
fn metrics_text_reports_its_size_and_never_overruns() {
    let e = Engine::new(0.30, 0.5);
    let gate = new_gate(&e, 60.0);
    let a = acquire(gate, "m", -1).unwrap();
    let mut needed = 0usize;
    // SAFETY: NULL buf with cap 0 asks for the size.
    let s = unsafe { kvgate_metrics_text(gate.0, ptr::null_mut(), 0, &mut needed) };
    assert_eq!(s, KVGATE_BUFFER_TOO_SMALL);
    assert!(needed > 100);
    let mut small = vec![b'#' as std::ffi::c_char; needed - 1];
    let mut needed_again = 0usize;
    // SAFETY: `small` has cap writable bytes.
    let s =
        unsafe { kvgate_metrics_text(gate.0, small.as_mut_ptr(), small.len(), &mut needed_again) };
    assert_eq!(s, KVGATE_BUFFER_TOO_SMALL);
    assert_eq!(needed_again, needed, "one byte short: the NUL counts");
    assert!(
        small.iter().all(|c| *c == b'#' as std::ffi::c_char),
        "buffer untouched"
    );
    let mut buf = vec![b'#' as std::ffi::c_char; needed + 16];
    // SAFETY: `buf` has cap writable bytes.
    let s = unsafe { kvgate_metrics_text(gate.0, buf.as_mut_ptr(), buf.len(), &mut needed) };
    assert_eq!(s, KVGATE_OK);
    // SAFETY: NUL-terminated on KVGATE_OK.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(text.len() + 1, needed);
    assert!(
        text.contains("kvgate_admissions_total{reason=\"open\"} 1\n"),
        "{text}"
    );
    // SAFETY: refused before use.
    unsafe {
        let s = kvgate_metrics_text(gate.0, ptr::null_mut(), 8, &mut needed);
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
        assert_eq!(
            last_error(),
            "kvgate_metrics_text: buf is NULL but cap is 8"
        );
        let s = kvgate_metrics_text(gate.0, buf.as_mut_ptr(), buf.len(), ptr::null_mut());
        assert_eq!(s, KVGATE_INVALID_ARGUMENT);
    }
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    free(gate);
}

#[test]
fn close_refuses_new_attempts_but_keeps_leases_valid() {
    let e = Engine::new(0.30, 0.5);
    let gate = new_gate(&e, 60.0);
    let a = acquire(gate, "s", -1).unwrap();
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_close(gate.0) }, KVGATE_OK);
    assert_eq!(acquire(gate, "s", -1).unwrap_err(), KVGATE_CLOSED);
    assert!(last_error().contains("the gate is closed"));
    assert_eq!(release(gate, a.lease), KVGATE_OK);
    assert_eq!(stats(gate).active_leases, 0);
    free(gate);
}

#[test]
fn free_wakes_waiters_with_closed_and_releases_outstanding_leases() {
    let e = Engine::new(0.95, 0.99);
    let gate = new_gate(&e, 60.0);
    let outstanding = acquire(gate, "holder", 0).unwrap();
    assert!(outstanding.retain_session);
    e.set_hit(0.10);
    let waiters: Vec<_> = ["w1", "w2", "w3"]
        .into_iter()
        .map(|s| spawn_acquire(gate, s))
        .collect();
    wait_until("three attempts wait", || stats(gate).waiting_attempts == 3);
    free(gate);
    e.freed.store(true, Ordering::SeqCst);
    for w in waiters {
        let (result, took) = w.join().unwrap();
        assert_eq!(result.unwrap_err(), KVGATE_CLOSED);
        assert!(took < PROMPTLY, "a waiter woke only after {took:?}");
    }
    assert!(
        !e.probe_after_free.load(Ordering::SeqCst),
        "a probe ran after kvgate_free returned"
    );
}

#[test]
fn free_waits_for_a_probe_in_progress() {
    let e = Engine::new(0.30, 0.5);
    let gate = new_gate(&e, 60.0);
    let (entered_tx, entered_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    *e.hold.lock().unwrap() = Some((entered_tx, go_rx));
    e.nested_stats_gate.store(gate.0 as usize, Ordering::SeqCst);
    let acquirer = spawn_acquire(gate, "in-probe");
    entered_rx
        .recv_timeout(PATIENCE)
        .expect("the probe was called");

    let freed = std::sync::Arc::new(AtomicBool::new(false));
    let freer = {
        let freed = freed.clone();
        thread::spawn(move || {
            free(gate);
            freed.store(true, Ordering::SeqCst);
        })
    };
    // kvgate_free must not return while the probe runs. (If it wrongly did,
    // this catches it unless the freeing thread is descheduled throughout.)
    thread::sleep(Duration::from_millis(100));
    assert!(
        !freed.load(Ordering::SeqCst),
        "kvgate_free returned while a probe was running"
    );
    go_tx.send(()).unwrap();
    freer.join().unwrap();
    let (result, _) = acquirer.join().unwrap();
    // Admitted "open" before the close was seen is impossible: the answer
    // arrives after the close, and admission checks the gate's fate first.
    assert_eq!(result.unwrap_err(), KVGATE_CLOSED);
    assert_eq!(e.usage_calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        e.nested_stats_status.load(Ordering::SeqCst),
        KVGATE_OK as u32,
        "a probe's own call into the gate works while kvgate_free waits for it"
    );
}

#[test]
fn free_from_inside_a_probe_callback_does_not_deadlock() {
    let e = Engine::new(0.30, 0.5);
    let gate = new_gate(&e, 60.0);
    *e.free_from_callback.lock().unwrap() = Some(gate.0 as usize);
    // The probe frees the gate; this acquire then sees it closed.
    assert_eq!(
        acquire(gate, "self-freeing", -1).unwrap_err(),
        KVGATE_CLOSED
    );
}

#[test]
fn leases_cross_threads_and_racing_releases_release_once() {
    let e = Engine::new(0.30, 0.5);
    let gate = new_gate(&e, 60.0);
    for round in 0..50 {
        let a = acquire(gate, "shared", -1).unwrap();
        let oks: usize = (0..4)
            .map(|_| thread::spawn(move || release(gate, a.lease)))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| usize::from(t.join().unwrap() == KVGATE_OK))
            .sum();
        assert_eq!(oks, 1, "round {round}");
    }
    let s = stats(gate);
    assert_eq!((s.releases, s.active_leases), (50, 0));
    free(gate);
}

#[test]
fn strings_and_version() {
    // SAFETY: static NUL-terminated strings.
    let text = |p| unsafe { CStr::from_ptr(p) }.to_str().unwrap();
    assert_eq!(
        text(kvgate_status_str(KVGATE_PREEMPTED as u32)),
        "preempted"
    );
    assert_eq!(text(kvgate_status_str(1234)), "unknown");
    assert_eq!(
        text(kvgate_reason_str(
            kvgate_reason::KVGATE_REASON_RESIDENT_PREFIX as u32
        )),
        "resident_prefix"
    );
    assert_eq!(
        text(kvgate_reason_str(
            kvgate_reason::KVGATE_REASON_RUNNING_COLD_PAYS as u32
        )),
        "running_cold_pays"
    );
    // 8 is reserved (a removed rule's): never answered, so unknown.
    assert_eq!(text(kvgate_reason_str(8)), "unknown");
    assert_eq!(text(kvgate_reason_str(9)), "unknown");
    assert_eq!(text(kvgate_version()), env!("CARGO_PKG_VERSION"));
}

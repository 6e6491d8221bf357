//! loom models of the C ABI's lifetime rules, driven through the real
//! `extern "C"` functions (the gate, the lease registry and the call
//! tracking of `kvgate_free` all run on loom's primitives under `--cfg loom`):
//!
//! - two threads releasing the same lease handle: exactly one succeeds, the
//!   other gets `KVGATE_UNKNOWN_LEASE`, and the lease is counted released once;
//! - `kvgate_free` racing an acquire that is probing or waiting: the acquire
//!   returns `KVGATE_CLOSED`, and when `kvgate_free` returns no probe is
//!   running or ever runs again (no lost wake-up in either direction).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_ffi_leases`.
#![cfg(loom)]

use std::ffi::c_void;
use std::ptr;

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::*;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

#[derive(Clone, Copy)]
struct GatePtr(*mut kvgate_gate);
// SAFETY: kvgate_gate is documented thread-safe for every call but free.
unsafe impl Send for GatePtr {}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

fn new_gate(usage: kvgate_usage_fn, prefix: kvgate_prefix_fn, user_data: *mut c_void) -> GatePtr {
    let config = kvgate_config_new();
    let mut gate = ptr::null_mut();
    // SAFETY: a live builder and a writable out-pointer; probes obey the contract.
    unsafe {
        assert_eq!(
            kvgate_config_set_probes(config, usage, prefix, user_data),
            KVGATE_OK
        );
        // The models are about lease handles: the seed's table keeps them small.
        assert_eq!(
            kvgate_config_set_admission_mode(
                config,
                kvgate_admission_mode::KVGATE_ADMISSION_MODE_REFERENCE as u32
            ),
            KVGATE_OK
        );
        assert_eq!(kvgate_new(config, &mut gate), KVGATE_OK);
        kvgate_config_free(config);
    }
    GatePtr(gate)
}

fn acquire(gate: GatePtr, session: &[u8]) -> Result<kvgate_admission, kvgate_status> {
    let mut out = std::mem::MaybeUninit::uninit();
    // SAFETY: a live gate, a live id, an empty prompt, a writable out.
    let status = unsafe {
        kvgate_acquire(
            gate.0,
            session.as_ptr(),
            session.len(),
            ptr::null(),
            0,
            -1,
            out.as_mut_ptr(),
        )
    };
    // SAFETY: written on KVGATE_OK.
    (status == KVGATE_OK)
        .then(|| unsafe { out.assume_init() })
        .ok_or(status)
}

#[test]
fn two_threads_releasing_one_handle_release_it_once() {
    model(|| {
        let gate = new_gate(None, None, ptr::null_mut());
        let lease = acquire(gate, b"s").expect("admitted open").lease;
        let releasers: Vec<_> = (0..2)
            .map(|_| {
                thread::spawn(move || {
                    // SAFETY: a live gate (freed only after both joined).
                    unsafe { kvgate_release(gate.0, lease) }
                })
            })
            .collect();
        let mut results: Vec<_> = releasers.into_iter().map(|t| t.join().unwrap()).collect();
        results.sort_by_key(|s| *s as u32);
        assert_eq!(results, [KVGATE_OK, KVGATE_UNKNOWN_LEASE]);
        let mut stats = std::mem::MaybeUninit::<kvgate_stats>::uninit();
        // SAFETY: a live gate and a writable out; read only on KVGATE_OK.
        let stats = unsafe {
            assert_eq!(
                kvgate_get_stats(
                    gate.0,
                    stats.as_mut_ptr(),
                    std::mem::size_of::<kvgate_stats>()
                ),
                KVGATE_OK
            );
            stats.assume_init()
        };
        assert_eq!((stats.releases, stats.active_leases), (1, 0));
        // SAFETY: freed once, after every other call returned.
        unsafe { kvgate_free(gate.0) };
    });
}

/// What the probes see: the acquirer reports it has started, the test checks
/// that no probe runs once `kvgate_free` returned.
struct Engine {
    started: AtomicBool,
    in_probe: AtomicUsize,
    calls: AtomicUsize,
}

unsafe fn engine<'a>(user_data: *mut c_void) -> &'a Engine {
    // SAFETY: the model passes a live `Engine` that outlives the gate.
    unsafe { &*user_data.cast::<Engine>() }
}

/// Under pressure, so the attempt goes on to the prefix probe.
unsafe extern "C" fn busy(user_data: *mut c_void, _: *const u8, _: usize, out: *mut f64) -> bool {
    // SAFETY: see `engine`; `out` is writable.
    unsafe {
        let e = engine(user_data);
        e.in_probe.fetch_add(1, Ordering::SeqCst);
        e.calls.fetch_add(1, Ordering::SeqCst);
        e.started.store(true, Ordering::SeqCst);
        *out = 0.95;
        e.in_probe.fetch_sub(1, Ordering::SeqCst);
    }
    true
}

/// Cold, so the attempt waits.
unsafe extern "C" fn cold(
    user_data: *mut c_void,
    _: *const u8,
    _: usize,
    _: *const u32,
    _: usize,
    out: *mut f64,
) -> bool {
    // SAFETY: see `engine`; `out` is writable.
    unsafe {
        let e = engine(user_data);
        e.in_probe.fetch_add(1, Ordering::SeqCst);
        e.calls.fetch_add(1, Ordering::SeqCst);
        *out = 0.10;
        e.in_probe.fetch_sub(1, Ordering::SeqCst);
    }
    true
}

#[test]
fn free_racing_a_probing_or_waiting_acquire() {
    model(|| {
        let engine = Box::leak(Box::new(Engine {
            started: AtomicBool::new(false),
            in_probe: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        }));
        let gate = new_gate(Some(busy), Some(cold), (engine as *mut Engine).cast());
        let acquirer = thread::spawn(move || acquire(gate, b"cold"));
        // The header's rule: free must not race with the *start* of a call.
        while !engine.started.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        // SAFETY: freed once; the only other call in progress is the acquire.
        unsafe { kvgate_free(gate.0) };
        assert_eq!(
            engine.in_probe.load(Ordering::SeqCst),
            0,
            "a probe runs after free"
        );
        let calls = engine.calls.load(Ordering::SeqCst);
        assert_eq!(acquirer.join().unwrap().unwrap_err(), KVGATE_CLOSED);
        assert_eq!(
            engine.calls.load(Ordering::SeqCst),
            calls,
            "a probe ran after free"
        );
        // SAFETY: leaked above, no gate refers to it any more.
        drop(unsafe { Box::from_raw(engine as *mut Engine) });
    });
}

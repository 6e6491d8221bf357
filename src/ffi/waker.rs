//! How a sleeping event-loop attempt reaches its host without a thread:
//! a `kvgate_waker`, shared by every attempt one loop drives.
//!
//! Each attempt is begun with a waker and a 64-bit tag the host chose (an
//! index into its table of attempts, say). When the attempt has something
//! to look at (a capacity event, a preemption, a cancel, close, a deadline
//! that moved earlier), the gate hands its tag to the waker, under gate
//! locks. A waker delivers tags one of two ways:
//!
//! - **a descriptor** (`kvgate_waker_new`): the tag joins the waker's queue
//!   and the descriptor becomes readable; the loop watches the one
//!   descriptor (epoll, `poll`, asyncio's `loop.add_reader`, libuv's
//!   `uv_poll_start`) and calls `kvgate_waker_drain` when it is readable.
//!   This is what those loops expect: one fd per loop, edge or level
//!   triggered, nothing to run on a foreign thread. An eventfd on Linux, a
//!   pipe elsewhere.
//! - **a callback** (`kvgate_waker_new_callback`): called with the tag on
//!   whichever thread caused the wake-up, while that thread holds gate
//!   locks, so it may only enqueue (`uv_async_send`, a lock-free queue, a
//!   write to the host's own pipe) and never call into kvgate. For hosts
//!   that already have a cross-thread wake primitive.
//!
//! The descriptor's protocol, and why no tag is lost: the queue and a
//! `rung` flag share one lock. A wake pushes its tag and sets `rung` under
//! the lock, and rings the bell after it if `rung` was clear. A drain clears
//! the bell first, then takes tags under the lock and clears `rung` if it
//! took them all (else rings again). Either the wake's critical section
//! comes first, and this drain takes its tag; or the drain's does, and the
//! wake finds `rung` clear and rings, after the drain's clear (which came
//! before the drain's critical section). So whenever a tag waits, the bell
//! is rung (`tests/loom_event_loop.rs`). With `rung` in an atomic beside
//! the lock instead, a drain's clear and a wake's ring can cross and leave
//! a tag waiting unrung (the loom model finds that interleaving).

use std::collections::VecDeque;
use std::ffi::c_void;

use super::error::Failure;
use super::handles::{self, kvgate_waker, Castable};
use super::panic::{ffi_boundary, ffi_status};
use super::status::kvgate_status;
use crate::core::Notify;
use crate::sync::{Arc, Doorbell, Mutex};

/// The wake callback (`kvgate_waker_new_callback`): the attempt begun with
/// `tag` has something to look at; call `kvgate_attempt_wake` on it soon
/// (from the host's loop, not from here).
///
/// Runs on whichever thread caused the wake-up (a `kvgate_release`, a
/// newer attempt of the session, `kvgate_close`...), **while that thread
/// holds gate locks**: it must only enqueue or signal and return, never call
/// a kvgate function, never block, never unwind. It may be called more than
/// once for one wake-up, and after the attempt moved on (a spurious wake is
/// harmless: the attempt simply sleeps again).
pub type kvgate_wake_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, tag: u64)>;

/// Where a waker's tags go.
#[derive(Debug)]
enum Target {
    Descriptor {
        bell: Doorbell,
        pending: Mutex<Pending>,
    },
    Callback {
        wake: unsafe extern "C" fn(*mut c_void, u64),
        user_data: *mut c_void,
    },
}

/// A descriptor waker's tags, and whether its bell is (about to be) rung,
/// so rings are coalesced: one write per drain, not one per wake-up.
#[derive(Debug, Default)]
struct Pending {
    tags: VecDeque<u64>,
    rung: bool,
}

/// The payload of a `kvgate_waker *`.
#[derive(Debug)]
pub(crate) struct Waker {
    target: Target,
}

impl Castable for kvgate_waker {
    type Rust = Waker;
}

// SAFETY: the descriptor variant holds only thread-safe state. The callback
// variant's `user_data` is only passed back to the host's function, which
// the header requires to be callable from any thread with it for as long as
// an attempt begun with the waker lives. Rust never dereferences it.
unsafe impl Send for Waker {}
// SAFETY: as for `Send`.
unsafe impl Sync for Waker {}

impl Waker {
    pub(crate) fn with_descriptor() -> std::io::Result<Self> {
        Ok(Self {
            target: Target::Descriptor {
                bell: Doorbell::new()?,
                pending: Mutex::new(Pending::default()),
            },
        })
    }

    pub(crate) fn with_callback(
        wake: unsafe extern "C" fn(*mut c_void, u64),
        user_data: *mut c_void,
    ) -> Self {
        Self {
            target: Target::Callback { wake, user_data },
        }
    }

    /// The descriptor to poll, if this waker has one.
    pub(crate) fn fd(&self) -> Option<i32> {
        match &self.target {
            Target::Descriptor { bell, .. } => Some(bell.fd()),
            Target::Callback { .. } => None,
        }
    }

    /// Delivers `tag` (under gate locks: a push and at most one write).
    fn wake(&self, tag: u64) {
        match &self.target {
            Target::Descriptor { bell, pending } => {
                let mut p = pending.lock();
                p.tags.push_back(tag);
                let ring = !std::mem::replace(&mut p.rung, true);
                drop(p);
                if ring {
                    bell.ring();
                }
            }
            // SAFETY: the host's function with its own `user_data` (see `Send`).
            Target::Callback { wake, user_data } => unsafe { wake(*user_data, tag) },
        }
    }

    /// Moves up to `out.len()` waiting tags, oldest first, into `out` and
    /// returns how many. Tags left over keep the descriptor readable.
    /// `None` for a callback waker, which keeps no tags.
    pub(crate) fn drain(&self, out: &mut [u64]) -> Option<usize> {
        let Target::Descriptor { bell, pending } = &self.target else {
            return None;
        };
        bell.clear();
        let mut p = pending.lock();
        let n = p.tags.len().min(out.len());
        for (slot, tag) in out.iter_mut().zip(p.tags.drain(..n)) {
            *slot = tag;
        }
        // Left-overs keep `rung` set and ring again (the clear above undid it).
        p.rung = !p.tags.is_empty();
        let ring = p.rung;
        drop(p);
        if ring {
            bell.ring();
        }
        Some(n)
    }

    /// Under loom: whether the bell is rung (what a poll would report).
    #[cfg(loom)]
    pub(crate) fn is_rung(&self) -> bool {
        match &self.target {
            Target::Descriptor { bell, .. } => bell.is_rung(),
            Target::Callback { .. } => false,
        }
    }
}

/// One attempt's notifier: its waker and the host's tag.
#[derive(Debug)]
pub(crate) struct TagNotifier {
    pub(crate) waker: Arc<Waker>,
    pub(crate) tag: u64,
}

impl Notify for TagNotifier {
    fn notify(&self) {
        self.waker.wake(self.tag);
    }
}

/// Makes a waker whose tags arrive through a descriptor the host polls
/// (`kvgate_waker_fd`, then `kvgate_waker_drain` when it is readable). On
/// Linux an eventfd, elsewhere a pipe; non-blocking and close-on-exec.
///
/// One waker serves any number of attempts, on any number of gates: one per
/// event loop is the intended use. On `KVGATE_OK`, `*out` is the caller's
/// to free once with `kvgate_waker_free`.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `out`, `KVGATE_OS_ERROR`
/// when the descriptor cannot be made (the message has the OS's reason).
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_waker_new(out: *mut *mut kvgate_waker) -> kvgate_status {
    ffi_status("kvgate_waker_new", || {
        // SAFETY: forwarded (caller).
        let out = unsafe { handles::out_arg(out, "out") }?;
        let waker = Waker::with_descriptor().map_err(|err| {
            Failure::new(
                kvgate_status::KVGATE_OS_ERROR,
                format!("cannot make the wake descriptor: {err}"),
            )
        })?;
        out.write(handles::waker_into_raw(Arc::new(waker)));
        Ok(())
    })
}

/// Makes a waker that calls `wake(user_data, tag)` instead of keeping a
/// descriptor: see `kvgate_wake_fn` for what it may do (only enqueue: it
/// runs under gate locks, on the thread that caused the wake-up).
/// `user_data` must stay valid, and `wake` callable with it from any
/// thread, until every attempt begun with this waker is freed.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `wake` or `out`.
///
/// # Safety
/// `out` is NULL or writable; `wake` honours `kvgate_wake_fn`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_waker_new_callback(
    wake: kvgate_wake_fn,
    user_data: *mut c_void,
    out: *mut *mut kvgate_waker,
) -> kvgate_status {
    ffi_status("kvgate_waker_new_callback", || {
        // SAFETY: forwarded (caller).
        let out = unsafe { handles::out_arg(out, "out") }?;
        let wake = wake.ok_or_else(|| Failure::invalid("wake is NULL"))?;
        out.write(handles::waker_into_raw(Arc::new(Waker::with_callback(
            wake, user_data,
        ))));
        Ok(())
    })
}

/// Writes the waker's descriptor to `*out_fd`: poll it for readability and
/// call `kvgate_waker_drain` when it is readable. The descriptor belongs to
/// the waker: do not read, write or close it.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL argument or a callback
/// waker (which has no descriptor).
///
/// # Safety
/// `waker` is NULL or a live waker; `out_fd` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_waker_fd(
    waker: *const kvgate_waker,
    out_fd: *mut i32,
) -> kvgate_status {
    ffi_status("kvgate_waker_fd", || {
        // SAFETY: forwarded (caller).
        let (waker, out) = unsafe {
            (
                handles::waker_ref(waker)?,
                handles::out_arg(out_fd, "out_fd")?,
            )
        };
        let fd = waker.fd().ok_or_else(|| {
            Failure::invalid(
                "this waker calls a callback (kvgate_waker_new_callback): it has no descriptor",
            )
        })?;
        out.write(fd);
        Ok(())
    })
}

/// Moves up to `capacity` tags of attempts that have something to look at
/// into `tags`, oldest first, writes how many to `*out_count`, and makes
/// the descriptor unreadable unless tags are left over (then it stays
/// readable: drain again). Call `kvgate_attempt_wake` on each tag's attempt
/// whose last step was `KVGATE_STEP_SLEEP`; a tag may come more than once,
/// or for an attempt that has moved on or ended: ignore those.
///
/// `tags` may be NULL when `capacity` is 0. Thread-safe.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `waker` or `out_count`, a
/// NULL `tags` with a non-zero `capacity`, or a callback waker.
///
/// # Safety
/// `waker` is NULL or a live waker; `tags` is NULL or has `capacity`
/// writable elements; `out_count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_waker_drain(
    waker: *const kvgate_waker,
    tags: *mut u64,
    capacity: usize,
    out_count: *mut usize,
) -> kvgate_status {
    ffi_status("kvgate_waker_drain", || {
        // SAFETY: forwarded (caller).
        let (waker, tags, out) = unsafe {
            (
                handles::waker_ref(waker)?,
                handles::slice_out_arg(tags, capacity, "tags", "capacity")?,
                handles::out_arg(out_count, "out_count")?,
            )
        };
        let n = waker.drain(tags).ok_or_else(|| {
            Failure::invalid(
                "this waker calls a callback (kvgate_waker_new_callback): it keeps no tags",
            )
        })?;
        out.write(n);
        Ok(())
    })
}

/// Frees the host's reference to a waker. NULL is a no-op. Attempts begun
/// with it keep it alive (and its descriptor open) until they are freed:
/// free the waker after its attempts, and stop polling its descriptor first.
///
/// # Safety
/// `waker` is NULL or a live waker, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_waker_free(waker: *mut kvgate_waker) {
    ffi_boundary("kvgate_waker_free", || {
        // SAFETY: NULL or the host's reference, handed back once (caller).
        drop(unsafe { handles::waker_take(waker) });
    })
}

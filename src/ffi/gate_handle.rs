//! What a `kvgate_gate *` owns, and how `kvgate_free` ends it safely while
//! other threads are still inside `kvgate_acquire`.
//!
//! The handle is an `Arc<GateHandle>`; the host holds one reference (from
//! `kvgate_new` until `kvgate_free`) and every `kvgate_acquire` in progress
//! holds another, taken at entry. `kvgate_free`:
//! 1. closes the gate, so every waiting attempt wakes and returns
//!    `KVGATE_CLOSED` and no new probe pass begins;
//! 2. waits until no `kvgate_acquire` is in progress on another thread (an
//!    attempt inside a probe callback finishes that call first), so after
//!    `kvgate_free` returns no probe is called and `user_data` may be freed;
//! 3. closes the lease registry and releases every outstanding lease;
//! 4. drops the host's reference. A woken acquire may still be on its way out
//!    (dropping its own reference): its reference keeps the memory alive.
//!
//! What this cannot cover, and the header therefore forbids: a call that
//! has been made but has not yet taken its reference (the few instructions
//! between entering `kvgate_acquire` and `gate_clone`). No count can see it,
//! so the handle may already be freed under it (seen as a SIGSEGV with a
//! breakpoint at `kvgate_acquire`). Making that safe would take a handle
//! that outlives `kvgate_free` (a leaked header, or a global table of
//! handles) and a counted entry on every call; the header instead promises
//! only what a C object normally does, plus the acquires a host can know
//! have entered (inside a probe, or counted in `pending_attempts`).
//!
//! `kvgate_free` called from inside a probe callback (its own thread is in
//! `kvgate_acquire` on this gate) does not wait for itself: a thread-local
//! list of the gates this thread is acquiring on tells it how many calls
//! are its own.

use std::cell::RefCell;

use super::handles::{kvgate_gate, Castable};
use super::leases::LeaseRegistry;
use crate::core::LeaseToken;
use crate::sync::{AtomicUsize, Condvar, Mutex, Ordering};
use crate::Gate;

/// The payload of a `kvgate_gate *`.
#[derive(Debug)]
pub(crate) struct GateHandle {
    pub(crate) gate: Gate,
    /// Outstanding leases as bare tokens: this handle owns the gate, so a
    /// lease needs no reference of its own to it.
    pub(crate) leases: LeaseRegistry<LeaseToken>,
    calls: CallTracker,
}

impl Castable for kvgate_gate {
    type Rust = GateHandle;
}

impl GateHandle {
    pub(crate) fn new(gate: Gate) -> Self {
        Self {
            gate,
            leases: LeaseRegistry::new(),
            calls: CallTracker::new(),
        }
    }

    /// Marks an acquire in progress on this thread until the guard drops.
    /// `key` identifies the handle (its address).
    pub(crate) fn enter_acquire(&self, key: usize) -> AcquireCall<'_> {
        // `try_with` fails only in a thread-local destructor; then this call
        // merely is not recognised as the thread's own by a nested free.
        let _ = ACQUIRING.try_with(|keys| keys.borrow_mut().push(key));
        self.calls.state.fetch_add(ONE_CALL, Ordering::SeqCst);
        AcquireCall {
            calls: &self.calls,
            key,
        }
    }

    /// Steps 1 to 3 of `kvgate_free` (see the module docs).
    pub(crate) fn shut_down(&self, key: usize) {
        self.gate.close();
        self.calls.wait_for_others(key);
        // Released outside the registry's locks.
        for token in self.leases.close() {
            self.gate.release_token(token, crate::TurnReport::default());
        }
    }
}

/// Acquires in progress and the wait `kvgate_free` does for them.
///
/// State word (`state`):
///
/// | bits   | meaning                                               |
/// |--------|-------------------------------------------------------|
/// | 0      | `FREEING`: `kvgate_free` began; exiting calls notify   |
/// | 1..    | number of `kvgate_acquire` calls in progress          |
///
/// One word, changed only by read-modify-writes, so an exiting call's
/// decrement and the freeing thread's `FREEING` are ordered against each
/// other: either the decrement comes first and the freeing thread's later
/// reads see it, or the exiting call sees `FREEING` and notifies. (Two
/// separate atomics would be a store-buffering pattern that needs SeqCst
/// fences.) Notifying takes `lock` first, so it cannot fall between the
/// waiter's check and its wait.
#[derive(Debug)]
struct CallTracker {
    state: AtomicUsize,
    lock: Mutex<()>,
    drained: Condvar,
}

const FREEING: usize = 1;
const ONE_CALL: usize = 2;

impl CallTracker {
    fn new() -> Self {
        Self {
            state: AtomicUsize::new(0),
            lock: Mutex::new(()),
            drained: Condvar::new(),
        }
    }

    fn wait_for_others(&self, key: usize) {
        self.state.fetch_or(FREEING, Ordering::SeqCst);
        let own = ACQUIRING
            .try_with(|keys| keys.borrow().iter().filter(|k| **k == key).count())
            .unwrap_or(0);
        let mut guard = self.lock.lock();
        while self.state.load(Ordering::SeqCst) / ONE_CALL > own {
            guard = self.drained.wait(guard);
        }
    }
}

/// An acquire in progress; dropping it ends the call's count.
#[derive(Debug)]
pub(crate) struct AcquireCall<'a> {
    calls: &'a CallTracker,
    key: usize,
}

impl Drop for AcquireCall<'_> {
    fn drop(&mut self) {
        let _ = ACQUIRING.try_with(|keys| {
            let mut keys = keys.borrow_mut();
            if let Some(at) = keys.iter().rposition(|k| *k == self.key) {
                keys.swap_remove(at);
            }
        });
        let before = self.calls.state.fetch_sub(ONE_CALL, Ordering::SeqCst);
        if before & FREEING != 0 {
            drop(self.calls.lock.lock());
            self.calls.drained.notify_one();
        }
    }
}

// The gates this thread is inside `kvgate_acquire` on (nested when a probe
// calls back into a gate).
crate::sync::thread_local_cell! {
    static ACQUIRING: RefCell<Vec<usize>> = RefCell::new(Vec::new());
}

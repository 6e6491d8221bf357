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
//! `kvgate_free` called from inside a probe callback (its own thread is in
//! `kvgate_acquire` on this gate) does not wait for itself: a thread-local
//! list of the gates this thread is acquiring on tells it how many calls
//! are its own.

use std::cell::RefCell;

use super::leases::LeaseRegistry;
use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};
use crate::{Gate, Lease};

/// The payload of a `kvgate_gate *`.
#[derive(Debug)]
pub(crate) struct GateHandle {
    pub(crate) gate: Gate,
    pub(crate) leases: LeaseRegistry<Lease>,
    calls: CallTracker,
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
        self.calls.in_flight.fetch_add(1, Ordering::SeqCst);
        AcquireCall {
            calls: &self.calls,
            key,
        }
    }

    /// Steps 1 to 3 of `kvgate_free` (see the module docs).
    pub(crate) fn shut_down(&self, key: usize) {
        self.gate.close();
        self.calls.wait_for_others(key);
        // Dropped outside the registry's locks: each drop releases to the gate.
        drop(self.leases.close());
    }
}

/// Acquires in progress and the wait `kvgate_free` does for them.
///
/// `in_flight` counts calls; `freeing` tells exiting calls to notify. Both
/// SeqCst: an exiting call decrements then reads `freeing`, the freeing
/// thread sets `freeing` then reads `in_flight`, so either the exiting call
/// notifies or the freeing thread sees its decrement. Notifying takes
/// `lock` first, so it cannot fall between the waiter's check and its wait.
#[derive(Debug)]
struct CallTracker {
    in_flight: AtomicUsize,
    freeing: AtomicBool,
    lock: Mutex<()>,
    drained: Condvar,
}

impl CallTracker {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            freeing: AtomicBool::new(false),
            lock: Mutex::new(()),
            drained: Condvar::new(),
        }
    }

    fn wait_for_others(&self, key: usize) {
        self.freeing.store(true, Ordering::SeqCst);
        let own = ACQUIRING
            .try_with(|keys| keys.borrow().iter().filter(|k| **k == key).count())
            .unwrap_or(0);
        let mut guard = self.lock.lock();
        while self.in_flight.load(Ordering::SeqCst) > own {
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
        self.calls.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.calls.freeing.load(Ordering::SeqCst) {
            drop(self.calls.lock.lock());
            self.calls.drained.notify_one();
        }
    }
}

// The gates this thread is inside `kvgate_acquire` on (nested when a probe
// calls back into a gate). loom's own thread-local keeps model threads apart.
#[cfg(not(loom))]
std::thread_local! {
    static ACQUIRING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}
#[cfg(loom)]
loom::thread_local! {
    static ACQUIRING: RefCell<Vec<usize>> = RefCell::new(Vec::new());
}

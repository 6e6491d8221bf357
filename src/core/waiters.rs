//! Who is asleep waiting for admission, and how each is woken.
//!
//! Wake-ups are targeted, never a herd:
//! - a capacity event (a release, a finish, an expiry) wakes **one** waiter,
//!   the one that has slept longest ([`Waiters::wake_one`]); if that waiter is
//!   admitted it passes the wake on, if it must wait again it absorbs it
//!   (pressure persists) and goes to the back of the queue;
//! - a preemption or a cancellation wakes exactly its attempt;
//! - close, and a manual clock's tick, wake everyone.
//!
//! One sleeping waiter, the *watcher*, also sleeps no later than the earliest
//! grace expiry, so an expiry during a quiet period is noticed on time
//! without a timer thread and without waking everyone at each expiry.
//!
//! No lost wake-up: an attempt registers here and then re-checks the event
//! epoch, the gate's closed flag and its own fate, all under the queue lock;
//! whoever changes one of those changes it first and then looks here
//! (SeqCst on both sides), so either the sleeper sees the change or the
//! waker sees the sleeper. The notification itself is a token the sleeper's
//! parker keeps, so it is not lost if it arrives before the sleeper parks.

use std::collections::BTreeMap;
use std::fmt;

use crate::core::timers::{TimerQueue, NEVER};
use crate::sync::{dekker_fence, Arc, AtomicU64, AtomicU8, AtomicUsize, Mutex, Ordering};

/// Wakes the thread or task driving one attempt. Called with gate locks
/// held: it must only set a flag, unpark, or enqueue, never call into the gate.
pub trait Notify: Send + Sync {
    /// The attempt has something to look at: call its `on_wake` soon.
    fn notify(&self);
}

// Fate of an attempt (`Slot::fate`): set once, from ACTIVE, by whoever ends it.
pub(crate) const ACTIVE: u8 = 0;
pub(crate) const PREEMPTED: u8 = 1;
pub(crate) const CANCELLED: u8 = 2;
/// The attempt ended by itself (timed out, abandoned, closed): whoever
/// comes later (a newer attempt, a cancel) finds its fate already sealed.
pub(crate) const ENDED: u8 = 3;

// Wake flags (`Slot::wake`), a bit set the woken attempt swaps to zero.
/// A capacity event was handed to this waiter (it was popped from the queue).
pub(crate) const WAKE_EVENT: u8 = 1;
/// Recompute the sleep deadline (watcher role changed, new earlier expiry).
pub(crate) const WAKE_REWATCH: u8 = 2;
/// The clock moved (manual clocks) or the gate closed: re-check everything.
pub(crate) const WAKE_LOOK: u8 = 4;

/// The shared half of one attempt: how to end it and how to wake it.
pub(crate) struct Slot {
    pub(crate) attempt_id: u64,
    pub(crate) fate: AtomicU8,
    pub(crate) wake: AtomicU8,
    /// Queue ticket while asleep in the queue, 0 otherwise. Written under the queue lock.
    ticket: AtomicU64,
    notifier: Box<dyn Notify>,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("attempt_id", &self.attempt_id)
            .field("fate", &self.fate.load(Ordering::Relaxed))
            .field("wake", &self.wake.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Slot {
    /// A slot for attempts driven through `notifier`; [`Slot::ready`] names
    /// the attempt.
    pub(crate) fn new(notifier: Box<dyn Notify>) -> Self {
        Self {
            attempt_id: 0,
            fate: AtomicU8::new(ACTIVE),
            wake: AtomicU8::new(0),
            ticket: AtomicU64::new(0),
            notifier,
        }
    }

    /// Readies a slot that nobody else holds (new, or left over from an
    /// ended attempt of the same driver) for attempt `attempt_id`. Nobody
    /// can signal an unshared slot, so plain stores suffice; the driver's
    /// notifier may still hold a token from the old attempt, which at worst
    /// ends one sleep early (a spurious wake-up, which `on_wake` tolerates).
    pub(crate) fn ready(&mut self, attempt_id: u64) {
        self.attempt_id = attempt_id;
        self.fate.store(ACTIVE, Ordering::Relaxed);
        self.wake.store(0, Ordering::Relaxed);
        debug_assert_eq!(
            self.ticket.load(Ordering::Relaxed),
            0,
            "an ended attempt is not queued"
        );
    }

    /// Ends the attempt with `fate` unless something ended it first.
    pub(crate) fn set_fate(&self, fate: u8) -> bool {
        self.fate
            .compare_exchange(ACTIVE, fate, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    pub(crate) fn fate(&self) -> u8 {
        self.fate.load(Ordering::SeqCst)
    }

    fn signal(&self, flag: u8) {
        self.wake.fetch_or(flag, Ordering::SeqCst);
        self.notifier.notify();
    }
}

#[derive(Debug, Default)]
struct Queue {
    /// Sleepers by ticket: the lowest ticket has slept longest.
    fifo: BTreeMap<u64, Arc<Slot>>,
    next_ticket: u64,
    /// Ticket of the sleeper that also watches the earliest grace expiry.
    /// Invariant: `Some` whenever `fifo` is not empty.
    watcher: Option<u64>,
}

/// The registry of sleeping attempts.
#[derive(Debug)]
pub(crate) struct Waiters {
    queue: Mutex<Queue>,
    /// Mirror of `queue.fifo.len()`, read by wakers before they lock.
    sleeping: AtomicUsize,
    /// Grace expiry the watcher is known to sleep until ([`NEVER`] if none).
    watch_deadline: AtomicU64,
}

/// Result of asking to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// Asleep in the queue; `watch_until` is the grace expiry this waiter
    /// must also wake at if it is the watcher.
    Asleep { watch_until: Option<u64> },
    /// Something changed since the pass began: look again instead of sleeping.
    LookAgain,
}

impl Waiters {
    pub(crate) fn new() -> Self {
        Self {
            queue: Mutex::new(Queue {
                next_ticket: 1,
                ..Queue::default()
            }),
            sleeping: AtomicUsize::new(0),
            watch_deadline: AtomicU64::new(NEVER),
        }
    }

    /// Number of attempts asleep.
    pub(crate) fn sleeping(&self) -> usize {
        self.sleeping.load(Ordering::SeqCst)
    }

    /// Puts `slot` to sleep at the back of the queue, unless `changed()`
    /// (evaluated after registering, under the queue lock) says otherwise.
    pub(crate) fn enqueue(
        &self,
        slot: &Arc<Slot>,
        grace: &TimerQueue,
        changed: impl FnOnce() -> bool,
    ) -> Enqueued {
        let mut q = self.queue.lock();
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.fifo.insert(ticket, slot.clone());
        slot.ticket.store(ticket, Ordering::SeqCst);
        self.sleeping.store(q.fifo.len(), Ordering::SeqCst);
        // The sleeper's half of the handshake (the waker's is in
        // `Core::capacity_event` and `expiry_added`): publish "asleep", then
        // read what the waker writes. See `sync::dekker_fence`.
        dekker_fence();
        if changed() {
            q.fifo.remove(&ticket);
            slot.ticket.store(0, Ordering::SeqCst);
            self.sleeping.store(q.fifo.len(), Ordering::SeqCst);
            return Enqueued::LookAgain;
        }
        Enqueued::Asleep {
            watch_until: self.claim_watch(&mut q, ticket, grace),
        }
    }

    /// For a sleeper woken without an event (deadline, rewatch, tick): stays
    /// in its place; `Some(watch_until)` as for [`Enqueued::Asleep`], or
    /// `None` if it is no longer queued (an event or a fate reached it).
    pub(crate) fn stay_asleep(&self, slot: &Slot, grace: &TimerQueue) -> Option<Option<u64>> {
        let mut q = self.queue.lock();
        let ticket = slot.ticket.load(Ordering::SeqCst);
        if ticket == 0 {
            return None;
        }
        Some(self.claim_watch(&mut q, ticket, grace))
    }

    /// Makes `ticket` the watcher if there is none. The earliest expiry is
    /// read under the queue lock: a window armed before this read is seen
    /// here, one armed after it finds the watcher in `expiry_added`.
    fn claim_watch(&self, q: &mut Queue, ticket: u64, grace: &TimerQueue) -> Option<u64> {
        match q.watcher {
            None => q.watcher = Some(ticket),
            Some(w) if w == ticket => {}
            Some(_) => return None,
        }
        let earliest = grace.earliest();
        self.watch_deadline.store(earliest, Ordering::SeqCst);
        Some(earliest)
    }

    /// Takes `slot` out of the queue if it is there (it woke up and will not
    /// sleep in its place again).
    pub(crate) fn dequeue(&self, slot: &Slot, grace: &TimerQueue) {
        if slot.ticket.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut q = self.queue.lock();
        let ticket = slot.ticket.load(Ordering::SeqCst);
        if ticket != 0 {
            self.remove(&mut q, ticket, grace);
        }
    }

    /// Hands a capacity event to the longest sleeper, if any.
    pub(crate) fn wake_one(&self, grace: &TimerQueue) -> bool {
        let mut q = self.queue.lock();
        let Some((&ticket, _)) = q.fifo.first_key_value() else {
            return false;
        };
        let slot = self.remove(&mut q, ticket, grace);
        slot.signal(WAKE_EVENT);
        true
    }

    /// Wakes one specific attempt (its fate was just set), wherever it is.
    pub(crate) fn wake_slot(&self, slot: &Slot, grace: &TimerQueue) {
        let mut q = self.queue.lock();
        let ticket = slot.ticket.load(Ordering::SeqCst);
        if ticket != 0 {
            self.remove(&mut q, ticket, grace);
        }
        slot.signal(WAKE_LOOK);
    }

    /// Wakes every sleeper to re-check everything (close, clock moved).
    pub(crate) fn wake_all(&self) {
        let q = self.queue.lock();
        for slot in q.fifo.values() {
            slot.signal(WAKE_LOOK);
        }
    }

    /// A grace window ending at `expiry` was opened: if the watcher sleeps
    /// past it, tell it to recompute its deadline.
    pub(crate) fn expiry_added(&self, expiry: u64) {
        // Nobody asleep: whoever sleeps next reads the earliest expiry itself
        // (the window was armed before this check, SeqCst on both sides).
        dekker_fence(); // the window was armed (written) above; now read "asleep"
        if self.sleeping() == 0 || expiry >= self.watch_deadline.load(Ordering::SeqCst) {
            return;
        }
        let q = self.queue.lock();
        if let Some(w) = q.watcher {
            self.watch_deadline.store(expiry, Ordering::SeqCst);
            q.fifo[&w].signal(WAKE_REWATCH);
        }
    }

    fn remove(&self, q: &mut Queue, ticket: u64, grace: &TimerQueue) -> Arc<Slot> {
        let slot = q.fifo.remove(&ticket).expect("ticket is queued");
        slot.ticket.store(0, Ordering::SeqCst);
        self.sleeping.store(q.fifo.len(), Ordering::SeqCst);
        if q.watcher == Some(ticket) {
            // Hand the watch to the newest sleeper: the one an event reaches
            // last. It sleeps to its poll for now (watch_deadline NEVER), so
            // it is told to recompute only if a window is pending; a window
            // opened later reaches it through `expiry_added`.
            q.watcher = None;
            self.watch_deadline.store(NEVER, Ordering::SeqCst);
            if let Some((&next, next_slot)) = q.fifo.last_key_value() {
                q.watcher = Some(next);
                if grace.earliest() != NEVER {
                    next_slot.signal(WAKE_REWATCH);
                }
            }
        }
        slot
    }
}

//! Who is asleep waiting for admission, and how each is woken.
//!
//! Wake-ups are targeted, never a herd:
//! - a capacity event (a release, a finish, an expiry) wakes **one** waiter,
//!   the one that has slept longest ([`Waiters::wake_one`]); if that waiter is
//!   admitted it passes the wake on, if it must wait again it absorbs it
//!   (pressure persists) and goes to the back of the queue;
//! - a preemption or a cancellation wakes exactly its attempt;
//! - close, and a manual clock's tick, wake everyone;
//! - a deadline that became the earliest ([`Waiters::nudge_newest`]) wakes
//!   the newest sleeper, with nothing to take, so that its driver asks
//!   `Core::next_deadline` again.
//!
//! The queue is only a queue: it holds no deadline. Deadlines are asked
//! (`Core::next_deadline`) and every driver folds them into its sleep.
//!
//! No lost wake-up: an attempt registers here and then re-checks the event
//! epoch, the gate's closed flag and its own fate, all under the queue lock;
//! whoever changes one of those changes it first and then looks here
//! (SeqCst on both sides), so either the sleeper sees the change or the
//! waker sees the sleeper. The notification itself is a token the sleeper's
//! `Sleeper` keeps, so it is not lost if it arrives before the thread sleeps.

use std::collections::BTreeMap;
use std::fmt;

use crate::sync::{dekker_fence, Arc, AtomicU64, AtomicU8, AtomicUsize, Mutex, Ordering};

/// Wakes the thread or task driving one attempt. Called with gate locks
/// held: it must only set a flag, wake a thread, or enqueue, never call into the gate.
pub trait Notify: Send + Sync {
    /// The attempt has something to look at: call its `on_wake` soon.
    fn notify(&self);
}

// Fate of an attempt (`Waiter::fate`): set once, from ACTIVE, by whoever ends it.
pub(crate) const ACTIVE: u8 = 0;
pub(crate) const PREEMPTED: u8 = 1;
pub(crate) const CANCELLED: u8 = 2;
/// The attempt ended by itself (timed out, abandoned, closed): whoever
/// comes later (a newer attempt, a cancel) finds its fate already sealed.
pub(crate) const ENDED: u8 = 3;
/// The host released the waiting attempt to another replica: the gate
/// counted its cache gone (`Core::release_elsewhere`).
pub(crate) const RELEASED: u8 = 4;

/// The one wake flag (`Waiter::wake`), swapped to zero by the woken attempt:
/// a capacity event was handed to this waiter (it was popped from the
/// queue). Every other wake-up (a fate, close, a tick, a nudge) carries
/// nothing: the attempt re-checks its fate, the clock and the queue.
pub(crate) const WAKE_EVENT: u8 = 1;

/// The shared half of one attempt: how to end it and how to wake it.
pub(crate) struct Waiter {
    pub(crate) attempt_id: u64,
    pub(crate) fate: AtomicU8,
    pub(crate) wake: AtomicU8,
    /// Queue ticket while asleep in the queue, 0 otherwise. Written under the queue lock.
    ticket: AtomicU64,
    notifier: Box<dyn Notify>,
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("attempt_id", &self.attempt_id)
            .field("fate", &self.fate.load(Ordering::Relaxed))
            .field("wake", &self.wake.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Waiter {
    /// A waiter for attempts driven through `notifier`; [`Waiter::ready`] names
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

    /// Readies a waiter that nobody else holds (new, or left over from an
    /// ended attempt of the same driver) for attempt `attempt_id`. Nobody
    /// can signal an unshared waiter, so plain stores suffice; the driver's
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

    /// Hands the attempt a capacity event and wakes it.
    fn signal_event(&self) {
        self.wake.fetch_or(WAKE_EVENT, Ordering::SeqCst);
        self.notifier.notify();
    }

    /// Wakes the attempt with nothing to take: it re-checks everything.
    fn nudge(&self) {
        self.notifier.notify();
    }
}

#[derive(Debug, Default)]
struct Queue {
    /// Sleepers by ticket: the lowest ticket has slept longest.
    fifo: BTreeMap<u64, Arc<Waiter>>,
    next_ticket: u64,
}

/// The registry of sleeping attempts.
#[derive(Debug)]
pub(crate) struct Waiters {
    queue: Mutex<Queue>,
    /// Mirror of `queue.fifo.len()`, read by wakers before they lock.
    sleeping: AtomicUsize,
}

/// Result of asking to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// Asleep in the queue.
    Asleep,
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
        }
    }

    /// Number of attempts asleep.
    pub(crate) fn sleeping(&self) -> usize {
        self.sleeping.load(Ordering::SeqCst)
    }

    /// Puts `waiter` to sleep at the back of the queue, unless `changed()`
    /// (evaluated after registering, under the queue lock) says otherwise.
    pub(crate) fn enqueue(&self, waiter: &Arc<Waiter>, changed: impl FnOnce() -> bool) -> Enqueued {
        let mut q = self.queue.lock();
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.fifo.insert(ticket, waiter.clone());
        waiter.ticket.store(ticket, Ordering::SeqCst);
        self.sleeping.store(q.fifo.len(), Ordering::SeqCst);
        // The sleeper's half of the handshake (the waker's is in
        // `Core::capacity_event` and `Core::deadline_moved_earlier`): publish
        // "asleep", then read what the waker writes (the driver reads
        // `next_deadline` after this). See `sync::dekker_fence`.
        dekker_fence();
        if changed() {
            q.fifo.remove(&ticket);
            waiter.ticket.store(0, Ordering::SeqCst);
            self.sleeping.store(q.fifo.len(), Ordering::SeqCst);
            return Enqueued::LookAgain;
        }
        Enqueued::Asleep
    }

    /// Whether `waiter` still sleeps in its place (woken without an event:
    /// a deadline, a tick, a nudge). `false` once an event or a fate took
    /// it out of the queue.
    pub(crate) fn still_queued(&self, waiter: &Waiter) -> bool {
        let _q = self.queue.lock(); // ordered with the waker that dequeues
        waiter.ticket.load(Ordering::SeqCst) != 0
    }

    /// Takes `waiter` out of the queue if it is there (it woke up and will not
    /// sleep in its place again).
    pub(crate) fn dequeue(&self, waiter: &Waiter) {
        if waiter.ticket.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut q = self.queue.lock();
        let ticket = waiter.ticket.load(Ordering::SeqCst);
        if ticket != 0 {
            self.remove(&mut q, ticket);
        }
    }

    /// Hands a capacity event to the longest sleeper, if any.
    pub(crate) fn wake_one(&self) -> bool {
        let mut q = self.queue.lock();
        let Some((&ticket, _)) = q.fifo.first_key_value() else {
            return false;
        };
        let waiter = self.remove(&mut q, ticket);
        waiter.signal_event();
        true
    }

    /// Wakes one specific attempt (its fate was just set), wherever it is.
    pub(crate) fn wake_waiter(&self, waiter: &Waiter) {
        let mut q = self.queue.lock();
        let ticket = waiter.ticket.load(Ordering::SeqCst);
        if ticket != 0 {
            self.remove(&mut q, ticket);
        }
        waiter.nudge();
    }

    /// Wakes every sleeper to re-check everything (close, clock moved).
    /// Hands an event to `waiter` itself (a working-set grant): taken out of
    /// the queue if it sleeps there; if it is not asleep yet, the event bit
    /// makes its `enqueue` look again (both under the queue's lock).
    pub(crate) fn hand_event(&self, waiter: &Waiter) {
        let mut q = self.queue.lock();
        let ticket = waiter.ticket.load(Ordering::SeqCst);
        if ticket != 0 {
            self.remove(&mut q, ticket);
        }
        waiter.signal_event();
    }

    pub(crate) fn wake_all(&self) {
        let q = self.queue.lock();
        for waiter in q.fifo.values() {
            waiter.nudge();
        }
    }

    /// Wakes the newest sleeper, which stays in its place, to ask for the
    /// next deadline again (one that became the earliest was armed). The
    /// newest: an event reaches it last, so it is the likeliest to still be
    /// asleep when the deadline comes.
    pub(crate) fn nudge_newest(&self) {
        let q = self.queue.lock();
        if let Some((_, waiter)) = q.fifo.last_key_value() {
            waiter.nudge();
        }
    }

    fn remove(&self, q: &mut Queue, ticket: u64) -> Arc<Waiter> {
        let waiter = q.fifo.remove(&ticket).expect("ticket is queued");
        waiter.ticket.store(0, Ordering::SeqCst);
        self.sleeping.store(q.fifo.len(), Ordering::SeqCst);
        waiter
    }
}

//! The one place where kvgate picks its synchronisation primitives.
//!
//! Normally these are `std` atomics and `parking_lot` locks; under
//! `RUSTFLAGS="--cfg loom"` they are loom's model-checked twins, so the loom
//! suites in `tests/loom_*.rs` explore every interleaving of the real code.
//! The API is std-shaped (guards by value), like tokio's loom facade, because
//! that is the shape loom offers: parking_lot is wrapped to match it.
//!
//! Every primitive the library synchronises with is chosen here, the event
//! loop's doorbell included (module `doorbell`: an eventfd or a pipe, under
//! loom a flag). The only `cfg(loom)` switches elsewhere serve one test
//! hook of the C ABI: `src/ffi/mod.rs` exports `waker_is_rung_for_models`
//! (defined in `src/ffi/event_loop.rs` over `src/ffi/waker.rs`), with which
//! `tests/loom_event_loop.rs` asks whether a poll would see the waker
//! readable.

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use std::sync::Arc;
    use std::time::Duration;

    /// A mutex whose `lock` cannot fail (parking_lot has no poisoning).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable with std's by-value guard API.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }

        /// Waits at most `timeout`; spurious wake-ups are possible, callers loop.
        pub(crate) fn wait_timeout<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            timeout: Duration,
        ) -> MutexGuard<'a, T> {
            let _ = self.0.wait_for(&mut guard, timeout);
            guard
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::Arc;
    use std::time::Duration;

    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // loom only poisons when a model thread panicked, which already fails the model.
            self.0.lock().expect("loom mutex poisoned")
        }
    }

    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).expect("loom mutex poisoned")
        }

        /// loom has no time: this is a plain wait (it never times out), so
        /// models drive deadlines with a manual clock and `Gate::clock_advanced`.
        pub(crate) fn wait_timeout<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            timeout: Duration,
        ) -> MutexGuard<'a, T> {
            self.0
                .wait_timeout(guard, timeout)
                .expect("loom mutex poisoned")
                .0
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}

pub(crate) use imp::*;

/// The event-loop waker's descriptor; under loom its twin, a flag.
#[cfg_attr(loom, path = "loom_doorbell.rs")]
mod doorbell;

pub(crate) use doorbell::Doorbell;

/// Declares a thread-local: std's normally, loom's under loom (loom runs its
/// model threads as coroutines on one OS thread, so a std thread-local would
/// be shared by every model thread). loom's macro takes no `const` block.
#[cfg(not(loom))]
macro_rules! thread_local_cell {
    ($(#[$attr:meta])* static $name:ident: $ty:ty = $init:expr;) => {
        std::thread_local! { $(#[$attr])* static $name: $ty = const { $init }; }
    };
}
#[cfg(loom)]
macro_rules! thread_local_cell {
    ($(#[$attr:meta])* static $name:ident: $ty:ty = $init:expr;) => {
        loom::thread_local! { $(#[$attr])* static $name: $ty = $init; }
    };
}
pub(crate) use thread_local_cell;

/// Whether a thread may keep objects for its next call (the blocking gate's
/// spare sleeper and waiter). Not under loom: an object must not outlive the
/// model execution that made it.
pub(crate) const KEEP_PER_THREAD_SPARES: bool = !cfg!(loom);

/// How many shards (as a power of two's exponent) a lock-sharded table gets
/// by default: about `per_cpu` per CPU, within `[min, max]`, so threads
/// rarely meet on one lock. Under loom always 1 bit: models stay small and
/// two shards still exercise cross-shard paths.
pub(crate) fn default_shard_bits(per_cpu: usize, min: usize, max: usize) -> u32 {
    if cfg!(loom) {
        return 1;
    }
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cpus * per_cpu)
        .next_power_of_two()
        .clamp(min, max)
        .trailing_zeros()
}

/// Seeds the session table's hash. Randomly keyed normally; fixed under
/// loom, where a model must take the same path every time it replays an
/// interleaving (a random key would move sessions between shards from one
/// replay to the next).
#[cfg(not(loom))]
pub(crate) type TableHasher = std::hash::RandomState;
#[cfg(loom)]
pub(crate) type TableHasher = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;

/// Orders a preceding write before a following read, for the two-sided
/// "write mine, then read yours" handshakes that keep wake-ups from being
/// lost (a sleeper writes "asleep" then reads the event epoch; a waker
/// writes the epoch then reads "asleep": at least one sees the other).
///
/// The atomics on both sides are already `SeqCst`, which in the real memory
/// model forbids both reads missing both writes. loom, though, models
/// `SeqCst` accesses as acquire/release only (its README, "Unsupported
/// features"; loom#180), which allows exactly that outcome, so without a
/// fence the models report a deadlock that cannot happen. loom does model
/// `fence(SeqCst)`, and a fence is what makes the handshake correct under
/// any orderings, so the real build carries it too: the checked program is
/// the shipped one. Its cost (one `mfence` on x86) sits next to a lock on
/// both paths.
#[inline]
pub(crate) fn dekker_fence() {
    fence(Ordering::SeqCst);
}

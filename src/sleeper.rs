//! How a thread blocked in `Gate::acquire` sleeps and is woken.

use crate::clock::Clock;
use crate::core::Notify;
use crate::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A one-token sleeper: `notify` leaves a token that the next (or current)
/// `wait_until` consumes, so a wake-up that arrives before the thread
/// sleeps is not lost.
#[derive(Debug)]
pub(crate) struct Sleeper {
    token: Mutex<bool>,
    condvar: Condvar,
}

impl Sleeper {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            token: Mutex::new(false),
            condvar: Condvar::new(),
        })
    }

    /// Sleeps until notified or until `clock` reaches `until_ns`. With a clock
    /// that does not advance on its own, only a notification ends the sleep
    /// (the clock's owner wakes sleepers through `Gate::clock_advanced`).
    pub(crate) fn wait_until(&self, clock: &dyn Clock, until_ns: u64) {
        let mut token = self.token.lock();
        while !*token {
            let now = clock.now_ns();
            if now >= until_ns {
                break;
            }
            token = if clock.advances_on_its_own() {
                self.condvar
                    .wait_timeout(token, Duration::from_nanos(until_ns - now))
            } else {
                self.condvar.wait(token)
            };
        }
        *token = false;
    }
}

/// The core holds this to wake the sleeping thread.
#[derive(Debug)]
pub(crate) struct SleeperHandle(pub(crate) Arc<Sleeper>);

impl Notify for SleeperHandle {
    fn notify(&self) {
        let mut token = self.0.token.lock();
        *token = true;
        drop(token);
        self.0.condvar.notify_one();
    }
}

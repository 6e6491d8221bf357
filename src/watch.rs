//! Which thread blocked in `Gate::acquire` wakes at the core's next deadline.
//!
//! The core spawns nothing and hides no timer in its waiter queue: it
//! answers [`Core::next_deadline`] (the earliest grace window's end) and
//! fires what is due whenever it is touched. An event loop folds that
//! deadline into its one timer. The blocking gate has many sleeping
//! threads instead, and one of them waking at the deadline is enough (more
//! would be a herd of wake-ups at every expiry), so it keeps a *duty*: the
//! first sleeper that finds a deadline nobody watches takes it and sleeps no
//! later than it; the others sleep to their own poll or timeout.
//!
//! The duty is never left unheld while a deadline is pending and a thread
//! sleeps:
//! - a sleeper reads the deadline after it is registered in the waiter
//!   queue; a window that becomes the earliest after that read nudges the
//!   newest sleeper (`reference::Table`, a Dekker handshake), which wakes,
//!   sleeps again and takes the duty for the earlier deadline;
//! - a thread that stops sleeping (its attempt probes again, is admitted or
//!   fails) gives the duty up and nudges a sleeper to take it
//!   ([`DeadlineWatch::leave`]). A nudged thread that stops sleeping
//!   instead hands it on the same way.

use crate::core::Core;
use crate::sleeper::Sleeper;
use crate::sync::{Arc, Mutex};

/// The duty: who watches which deadline.
#[derive(Debug)]
pub(crate) struct DeadlineWatch {
    duty: Mutex<Option<Duty>>,
}

#[derive(Debug)]
struct Duty {
    holder: Arc<Sleeper>,
    deadline: u64,
}

impl DeadlineWatch {
    pub(crate) fn new() -> Self {
        Self {
            duty: Mutex::new(None),
        }
    }

    /// Before `sleeper`'s thread sleeps to `until`: the time it must wake
    /// at, which is earlier if it holds (or now takes) the duty for the
    /// core's next deadline.
    pub(crate) fn sleep_until(&self, sleeper: &Arc<Sleeper>, core: &Core, until: u64) -> u64 {
        let Some(deadline) = core.next_deadline() else {
            return until;
        };
        let mut duty = self.duty.lock();
        match &mut *duty {
            // Held by this thread: keep it, for the deadline as it is now.
            Some(d) if Arc::ptr_eq(&d.holder, sleeper) => d.deadline = deadline,
            // Someone else wakes no later than it: nothing to do here.
            Some(d) if d.deadline <= deadline => return until,
            // Vacant, or watched too late (a nudge for an earlier one): take it.
            _ => {
                *duty = Some(Duty {
                    holder: sleeper.clone(),
                    deadline,
                })
            }
        }
        until.min(deadline)
    }

    /// `sleeper`'s thread stops sleeping: it gives the duty up if it held
    /// it, and if the duty is vacant while a deadline is pending, nudges a
    /// sleeper to take it.
    pub(crate) fn leave(&self, sleeper: &Arc<Sleeper>, core: &Core) {
        let mut duty = self.duty.lock();
        if duty
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(&d.holder, sleeper))
        {
            *duty = None;
        }
        let vacant = duty.is_none();
        drop(duty);
        if vacant && core.next_deadline().is_some() {
            core.nudge_a_sleeper();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::core::{LeaseToken, Notify, Step};
    use crate::Config;

    struct NoWake;
    impl Notify for NoWake {
        fn notify(&self) {}
    }

    const SEC: u64 = 1_000_000_000;

    /// A resident admission of `session` at `t` (usage 0.95, hit 0.9).
    fn resident(core: &Core, session: &[u8], t: u64) -> LeaseToken {
        let mut a = core.begin(session, 1, t, None, Box::new(NoWake)).unwrap();
        assert!(matches!(a.start(t), Ok(Step::ProbeUsage)));
        assert!(matches!(a.on_usage(Some(0.95), t), Ok(Step::ProbePrefix)));
        match a.on_prefix(Some(0.9), t) {
            Ok(Step::Admitted(token)) => token,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_sleeper_takes_the_duty_and_gives_it_up_when_it_stops_sleeping() {
        let core = Core::new(Config {
            idle_grace: std::time::Duration::from_secs(5),
            ..Config::reference()
        })
        .unwrap();
        let watch = DeadlineWatch::new();
        let (a, b) = (Sleeper::new(), Sleeper::new());
        assert_eq!(watch.sleep_until(&a, &core, 100), 100, "no deadline");
        core.release(resident(&core, b"g", 0), 0); // a window until 5 s
        let poll = 100 * SEC;
        assert_eq!(watch.sleep_until(&a, &core, poll), 5 * SEC, "a takes it");
        assert_eq!(watch.sleep_until(&b, &core, poll), poll, "b need not");
        assert_eq!(watch.sleep_until(&a, &core, poll), 5 * SEC, "a keeps it");
        watch.leave(&b, &core); // not the holder: nothing changes
        assert_eq!(watch.sleep_until(&b, &core, poll), poll);
        watch.leave(&a, &core); // the holder stops sleeping
        assert_eq!(watch.sleep_until(&b, &core, poll), 5 * SEC, "b takes it");
        core.purge(5 * SEC);
        assert_eq!(watch.sleep_until(&b, &core, poll), poll, "nothing pending");
    }
}

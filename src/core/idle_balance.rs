//! Whether holding sessions out idles the engine more than letting them in
//! would make it re-prefill: two measured costs, in engine time, weighed
//! against each other.
//!
//! Holding a session out while its footprint does not fit is worth it when
//! the members it protects would otherwise re-prefill. But while every
//! member is between turns (in its tool call) the engine has nothing to run,
//! and a session waiting then is engine time thrown away. Which cost is
//! larger depends on the workload and the machine (tool times against turn
//! times, the cache against the sessions), so it is measured, not guessed:
//!
//! - **idle**: time during which no turn was in flight and a session waited;
//! - **re-prefill**: the tokens turns had to compute again that their
//!   session's previous prompt and output had already put in the cache
//!   (what they could have hit minus what they hit, from the cached-token
//!   report), at the engine's prefill rate.
//!
//! Both decay with the same time constant (the working set gives it: the
//! wait bound's horizon), so the comparison follows the workload's phase.
//! A queue head finding the engine empty goes in
//! ([`super::working_set::Verdict::EngineIdle`]) once idle is ahead of
//! re-prefill by what this admission will cost (the displaced member's
//! re-prefill), and the engine has been empty at least that long; what it
//! displaces then shows up in re-prefill and holds the next ones back. The
//! balance settles where the two wastes are about equal, without a knob.
//!
//! Requiring the admission's own cost on top matters on the real engine:
//! with idle merely ahead, the rule fired 1-4 times in most runs of the
//! real-engine benchmark (24 sessions x 10 turns), early, before much
//! re-prefill was measured, and the 5 runs where it fired averaged 0.956x
//! the best cap, against 0.918x for 9 runs of the library without the rule
//! (noisy: 0.861-1.017). With the cost on top it fired in one run of three
//! (0.958x; the others 0.905x, 0.890x). In the simulator both versions did
//! the same within 1%.

/// Engine time lost to each cost, decayed, and when they were last brought
/// up to date.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct IdleBalance {
    /// Time the engine was empty while a session waited, ns.
    idle_ns: f64,
    /// Time the engine spent recomputing what had been cached, ns.
    reprefill_ns: f64,
    /// Whether any turn has reported its cached tokens: without those the
    /// re-prefill cost is unknown and idle is never taken to be ahead.
    measured: bool,
    /// When the sums were last brought up to date, ns.
    at: u64,
    /// Since when the engine has been empty with a session waiting, as of
    /// the last update, if it was over the interval before it.
    empty_from: Option<u64>,
}

/// How far behind idle may be and still count as ahead, ns: the rounding of
/// [`IdleBalance::ahead_at`]'s time, never a real difference. Without it the
/// working set could wake at that time, find idle a hair short, and wake at
/// once again.
const ROUNDING_NS: f64 = 1.0;

impl IdleBalance {
    /// Brings both sums up to `now`, decayed with time constant `tau_ns`
    /// (none if it is not positive; asked only when there is something to
    /// decay), adding the time since the last update to idle if the engine
    /// was `empty_with_waiters` all along (the state only changes at the
    /// updates).
    pub(crate) fn advance(
        &mut self,
        now: u64,
        empty_with_waiters: bool,
        tau_ns: impl FnOnce() -> f64,
    ) {
        if !empty_with_waiters && self.idle_ns == 0.0 && self.reprefill_ns == 0.0 {
            // Nothing to decay or add: the common case of a gate nobody
            // waits at, and which is not told cached tokens, in a few
            // instructions (it runs at every request and release).
            self.empty_from = None;
            self.at = self.at.max(now);
            return;
        }
        let elapsed = now.saturating_sub(self.at) as f64;
        if empty_with_waiters {
            self.empty_from.get_or_insert(self.at);
        } else {
            self.empty_from = None;
        }
        self.at = self.at.max(now);
        if elapsed <= 0.0 {
            return;
        }
        let tau_ns = tau_ns();
        if tau_ns > 0.0 && tau_ns.is_finite() {
            let keep = (-elapsed / tau_ns).exp();
            self.idle_ns *= keep;
            self.reprefill_ns *= keep;
            if empty_with_waiters {
                // The integral of the decayed idle time over the interval.
                self.idle_ns += tau_ns * (1.0 - keep);
            }
        } else if empty_with_waiters {
            self.idle_ns += elapsed;
        }
    }

    /// Engine time lost idle with sessions waiting, ns, as of the last update.
    pub(crate) fn idle_ns(&self) -> f64 {
        self.idle_ns
    }

    /// Engine time spent re-prefilling, ns, as of the last update.
    pub(crate) fn reprefill_ns(&self) -> f64 {
        self.reprefill_ns
    }

    /// When the engine's current empty stretch began, if it is empty with a
    /// session waiting now: at the last update if it was not before it.
    pub(crate) fn empty_since(&self) -> u64 {
        self.empty_from.unwrap_or(self.at)
    }

    /// A turn re-prefilled `ns` of engine time's worth of what had been
    /// cached for it (0 when it hit all it could).
    pub(crate) fn reprefilled(&mut self, ns: f64) {
        self.measured = true;
        self.reprefill_ns += ns.max(0.0);
    }

    /// Whether the engine has idled at least as much as it re-prefilled
    /// plus `extra_ns` (and re-prefill is measured at all).
    pub(crate) fn idle_ahead(&self, extra_ns: f64) -> bool {
        self.measured
            && self.idle_ns > 0.0
            && self.idle_ns + ROUNDING_NS >= self.reprefill_ns + extra_ns
    }

    /// When idle catches up with re-prefill plus `extra_ns` if the engine
    /// stays empty with a session waiting from the last update on, decayed
    /// with `tau_ns` as [`IdleBalance::advance`] does (`extra_ns` is not: it
    /// is the cost of the admission at hand); `None` if it is ahead already,
    /// if re-prefill is not measured, or if it never catches up (decayed,
    /// idle tends to `tau_ns`).
    pub(crate) fn ahead_at(&self, tau_ns: f64, extra_ns: f64) -> Option<u64> {
        if !self.measured || self.idle_ahead(extra_ns) {
            return None;
        }
        let wait = if tau_ns > 0.0 && tau_ns.is_finite() {
            // idle(t) = I k + tau (1 - k), re-prefill(t) = R k, k = e^(-t/tau):
            // idle(t) >= R(t) + x once k <= (tau - x) / (tau + R - I).
            let room = tau_ns - extra_ns;
            if room <= 0.0 {
                return None;
            }
            tau_ns * ((tau_ns + self.reprefill_ns - self.idle_ns) / room).ln()
        } else {
            self.reprefill_ns + extra_ns - self.idle_ns
        };
        // At least 1 ns: the first update after `at` must see time pass.
        let wait = wait.ceil().clamp(1.0, u64::MAX as f64) as u64;
        Some(self.at.saturating_add(wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: f64 = 1e9;

    #[test]
    fn idle_is_not_ahead_until_re_prefill_is_measured() {
        let mut b = IdleBalance::default();
        b.advance(10 * S as u64, true, || 0.0);
        assert!(
            !b.idle_ahead(0.0),
            "nothing says what letting in would cost"
        );
        assert_eq!(b.ahead_at(0.0, 0.0), None);
        b.reprefilled(0.0);
        assert!(b.idle_ahead(0.0));
    }

    #[test]
    fn idle_counts_only_time_spent_empty_with_waiters() {
        let mut b = IdleBalance::default();
        b.reprefilled(3.0 * S);
        b.advance(2 * S as u64, true, || 0.0);
        b.advance(10 * S as u64, false, || 0.0);
        assert!(!b.idle_ahead(0.0), "2 s idle against 3 s re-prefilled");
        // Idle again from 10 s: it catches up one second later.
        assert_eq!(b.ahead_at(0.0, 0.0), Some(11 * S as u64));
        b.advance(11 * S as u64, true, || 0.0);
        assert!(b.idle_ahead(0.0));
    }

    #[test]
    fn the_catch_up_time_follows_the_decay() {
        let tau = 10.0 * S;
        let mut b = IdleBalance::default();
        b.reprefilled(4.0 * S);
        let at = b.ahead_at(tau, 0.0).unwrap();
        // Decay shrinks the gap: sooner than the 4 s without it.
        assert!(at < 4 * S as u64 && at > 3 * S as u64, "{at}");
        let mut early = b;
        early.advance(at - 1_000, true, || tau);
        assert!(!early.idle_ahead(0.0), "a microsecond early");
        b.advance(at, true, || tau);
        assert!(b.idle_ahead(0.0), "at the time it gave");
        assert_eq!(b.ahead_at(tau, 0.0), None);
    }

    #[test]
    fn the_cost_of_the_admission_at_hand_is_added_undecayed() {
        let tau = 10.0 * S;
        let mut b = IdleBalance::default();
        b.reprefilled(1.0 * S);
        let extra = 0.5 * S;
        let at = b.ahead_at(tau, extra).unwrap();
        let mut early = b;
        early.advance(at - 1_000, true, || tau);
        assert!(!early.idle_ahead(extra), "a microsecond early");
        b.advance(at, true, || tau);
        assert!(b.idle_ahead(extra), "at the time it gave");
        let never = IdleBalance {
            measured: true,
            ..IdleBalance::default()
        };
        assert_eq!(never.ahead_at(tau, tau), None, "idle never reaches tau");
    }

    #[test]
    fn decay_forgets_old_costs_alike() {
        let tau = 1.0 * S;
        let mut b = IdleBalance::default();
        b.reprefilled(1.0 * S);
        b.advance(1, true, || tau);
        b.advance(100 * S as u64, false, || tau);
        assert!(b.idle_ns < 1.0 && b.reprefill_ns < 1.0);
    }
}

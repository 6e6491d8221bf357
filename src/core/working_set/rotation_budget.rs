//! What the wait bound may spend on rotations: members parked to make room
//! for a queue head that waited past the bound.
//!
//! The bound (`B` refill windows, [`super::Tuning::wait_bound_windows`]) is
//! a promise to the session waiting; the members it parks pay for it, each
//! re-prefilling its own tokens when it returns. Its cost is meant to be at
//! most one refill of the cache per `B` windows, about `1 / B` of a
//! prefill-bound engine's time. That holds while heads reach the bound one
//! at a time, but not when many sessions queued together (the bound counts
//! from queueing): once the first reaches it, every head behind it is past
//! it too, and every release would park the next member for the next head,
//! a rotation per turn.
//!
//! So the parks a past-bound head forces spend from a budget of engine
//! time, each the seconds its member's rebuild will take (module
//! `rebuild`), refilled at `1 / B` of a second a second and holding at
//! most a refill of the cache: the first head past its bound always finds it full (it
//! waited `B` windows, each a cache's refill); a head behind it, also past
//! its bound, waits until the parks before it are paid off. Waits stay
//! bounded: each head ahead delays it by at most `B` windows beyond its
//! own (the largest rotation one can force is a cache).

/// How far below zero the budget may be and still allow parks, seconds:
/// the rounding of refills made in many small steps, never a token's worth. A
/// budget that had to reach exactly zero could, after such steps, find
/// itself a hair short at the very time [`RotationBudget::allows_at`] gave,
/// and the working set would wake at that time again and again.
const ROUNDING: f64 = 1e-12;

/// Engine seconds the wait bound may still spend on members' rebuilds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RotationBudget {
    /// Seconds left; negative while parks already forced are being paid off.
    secs: f64,
    /// When `tokens` was last brought up to date, ns.
    at: u64,
}

impl RotationBudget {
    /// Brings the budget up to `now`, refilled at `per_sec` seconds a
    /// second and holding at most `cap` seconds.
    pub(crate) fn refill(&mut self, now: u64, per_sec: f64, cap: f64) {
        let elapsed = now.saturating_sub(self.at) as f64 / 1e9;
        self.secs = (self.secs + elapsed * per_sec).min(cap.max(0.0));
        self.at = self.at.max(now);
    }

    /// Whether parks may be forced now (as last brought up to date).
    pub(crate) fn allows(&self) -> bool {
        self.secs >= -ROUNDING
    }

    /// Parks forced `secs` of members' rebuilds.
    pub(crate) fn spend(&mut self, secs: f64) {
        self.secs -= secs;
    }

    /// When parks may be forced again at `per_sec` seconds a second, if
    /// they may not now; the first nanosecond at which they may.
    pub(crate) fn allows_at(&self, per_sec: f64) -> Option<u64> {
        if self.allows() || per_sec <= 0.0 {
            return None;
        }
        let ns = (-self.secs / per_sec * 1e9).ceil();
        Some(self.at.saturating_add(ns.min(u64::MAX as f64) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn refills_at_its_rate_up_to_its_cap() {
        let mut b = RotationBudget::default();
        b.refill(S, 100.0, 1000.0);
        assert_eq!(b.secs, 100.0);
        b.refill(20 * S, 100.0, 1000.0);
        assert_eq!(b.secs, 1000.0, "capped");
        // A time before the last one refills nothing and keeps the clock.
        b.spend(400.0);
        b.refill(10 * S, 100.0, 1000.0);
        assert_eq!(b.secs, 600.0);
        assert_eq!(b.at, 20 * S);
    }

    #[test]
    fn a_debt_is_paid_off_before_parks_are_forced_again() {
        let mut b = RotationBudget::default();
        b.refill(10 * S, 100.0, 1000.0);
        assert!(b.allows());
        assert_eq!(b.allows_at(100.0), None);
        // One rotation may take more than is left: the next waits for it.
        b.spend(1500.0);
        assert!(!b.allows());
        let at = b.allows_at(100.0).expect("in debt");
        assert_eq!(at, 15 * S);
        b.refill(at - 1_000_000, 100.0, 1000.0);
        assert!(!b.allows(), "a ms early: a tenth of a token short");
        b.refill(at, 100.0, 1000.0);
        assert!(b.allows());
    }

    #[test]
    fn without_a_rate_a_debt_gives_no_time() {
        let mut b = RotationBudget::default();
        b.spend(10.0);
        assert_eq!(b.allows_at(0.0), None);
    }
}

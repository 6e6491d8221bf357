//! The share of the engine's time that goes to prefill, measured from the
//! turns' reports: each reported turn prefilled `prompt - cached` tokens,
//! which take `1 / rate` each at the engine's prefill rate, and the sum of
//! that over the turns that ended in a stretch of time, over its length, is
//! the share of the engine that prefill took then.
//!
//! Why the working set wants it: prefill does not batch (a token costs the
//! same compute alone or beside others), while decoding more sequences at
//! once costs little more than one. Letting one more session in is worth
//! what it adds to the batched part of the engine's work, so the larger the
//! share of prefill, the less concurrency buys, and the longer the stretch
//! over which a park's re-prefill costs more than the room it held was worth
//! ([`super::working_set`]'s horizon).

/// The share is measured over the recent past: the sums are halved whenever
/// they cover this many refill windows, so turns older than about twice that
/// stop counting, without an exponential per report on the release path.
const WINDOWS_REMEMBERED: f64 = 16.0;

/// Highest share taken as measured: a share near 1 (all prefill) would
/// stretch the horizon without bound, and the rate in force is the engine's
/// best, so shares come out high, not low, when batches are small.
const SHARE_CEILING: f64 = 0.9;

/// Engine time prefilling, and wall time, over the recent past, ns.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PrefillShare {
    prefill_ns: f64,
    span_ns: f64,
    /// When the last reported turn ended (0: none yet).
    last_at: u64,
}

impl PrefillShare {
    /// A turn admitted at `admitted_at` ended at `now` having prefilled
    /// `prefilled` tokens, at a prefill rate of `rate` tokens/s (0: unknown,
    /// nothing learned); `window_ns` is the refill window in force.
    pub(crate) fn record(
        &mut self,
        prefilled: u64,
        rate: f64,
        admitted_at: u64,
        now: u64,
        window_ns: u64,
    ) {
        if rate <= 0.0 {
            return;
        }
        // The first turn's own duration starts the stretch; after that, the
        // time since the previous report (turns overlap: the sum of their
        // durations would count wall time more than once).
        let since = if self.last_at == 0 {
            admitted_at
        } else {
            self.last_at
        };
        self.span_ns += now.saturating_sub(since) as f64;
        self.last_at = self.last_at.max(now);
        self.prefill_ns += prefilled as f64 / rate * 1e9;
        if self.span_ns > WINDOWS_REMEMBERED * window_ns as f64 {
            self.span_ns /= 2.0;
            self.prefill_ns /= 2.0;
        }
    }

    /// The share measured, in `[0, SHARE_CEILING]` (0 before any report).
    pub(crate) fn share(&self) -> f64 {
        if self.span_ns <= 0.0 {
            return 0.0;
        }
        (self.prefill_ns / self.span_ns).clamp(0.0, SHARE_CEILING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn nothing_is_measured_without_a_rate_or_a_report() {
        let mut p = PrefillShare::default();
        assert_eq!(p.share(), 0.0);
        p.record(1000, 0.0, 0, 100 * MS, 1000 * MS);
        assert_eq!(p.share(), 0.0);
    }

    #[test]
    fn the_share_is_prefill_time_over_wall_time_whatever_the_overlap() {
        let mut p = PrefillShare::default();
        // 1000 tokens/s. Turn one: 100 ms, 50 tokens (50 ms of prefill).
        p.record(50, 1000.0, 0, 100 * MS, 10_000 * MS);
        assert!((p.share() - 0.5).abs() < 1e-9, "{}", p.share());
        // Two overlapping turns end 100 ms later, 25 tokens each: 100 ms
        // of prefill in 200 ms of wall time, however long each one ran.
        p.record(25, 1000.0, 0, 150 * MS, 10_000 * MS);
        p.record(25, 1000.0, 50 * MS, 200 * MS, 10_000 * MS);
        assert!((p.share() - 0.5).abs() < 1e-9, "{}", p.share());
    }

    #[test]
    fn the_share_follows_the_recent_past_and_stays_below_the_ceiling() {
        let mut p = PrefillShare::default();
        let window = 100 * MS;
        let mut now = 0;
        // A long all-prefill stretch: the share is capped.
        for _ in 0..100 {
            p.record(100, 1000.0, now, now + 100 * MS, window);
            now += 100 * MS;
        }
        assert_eq!(p.share(), SHARE_CEILING);
        // Then no prefill at all: within a few times the memory, the old
        // stretch no longer counts.
        for _ in 0..200 {
            p.record(0, 1000.0, now, now + 100 * MS, window);
            now += 100 * MS;
        }
        assert!(p.share() < 0.01, "{}", p.share());
    }
}

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
/// stretch the horizon without bound, and the rate in force is that of the
/// engine's steps mostly of prefill, so shares come out high, not low, when
/// batches are small.
const SHARE_CEILING: f64 = 0.9;

/// Tokens prefilled, and wall time, over the recent past.
///
/// Tokens, not engine time: they are turned into time at the rate in force
/// when the share is asked ([`PrefillShare::share`]), not the rate in force
/// when each turn ended. An engine that has not yet run a step mostly of
/// prefill answers no rate, and where every session starts at once the
/// first turns end before anyone else is admitted to ask again; their time
/// taken at the rate measured from the turns themselves (prefilled tokens
/// over a duration that is mostly decode: hundreds of tokens a second where
/// the engine does tens of thousands) made them look all prefill. Measured
/// in the simulator, whose engines start cold: the share sat at its 0.9
/// ceiling from the first report for the sums' memory, 16 windows, on
/// `thrash` (a GPU engine) and on the fitted real-engine workload, whose
/// horizon it stretched to 9-22 turns (5-7 since; the engine's gauges read
/// 2-6). Judge, seeds 1-5, every scenario: 0.9237 to 0.9235 of the best
/// cap; the fitted workload, seeds 1-10: 0.976 to 0.972.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PrefillShare {
    prefilled: f64,
    span_ns: f64,
    /// When the last reported turn ended (0: none yet).
    last_at: u64,
}

impl PrefillShare {
    /// A turn admitted at `admitted_at` ended at `now` having prefilled
    /// `prefilled` tokens; `window_ns` is the refill window in force.
    pub(crate) fn record(&mut self, prefilled: u64, admitted_at: u64, now: u64, window_ns: u64) {
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
        self.prefilled += prefilled as f64;
        if self.span_ns > WINDOWS_REMEMBERED * window_ns as f64 {
            self.span_ns /= 2.0;
            self.prefilled /= 2.0;
        }
    }

    /// The share measured at a prefill rate of `rate` tokens/s, in `[0,
    /// SHARE_CEILING]` (0 before any report, or while the rate is unknown).
    pub(crate) fn share(&self, rate: f64) -> f64 {
        if self.span_ns <= 0.0 || rate <= 0.0 {
            return 0.0;
        }
        (self.prefilled / rate * 1e9 / self.span_ns).clamp(0.0, SHARE_CEILING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn nothing_is_measured_without_a_rate_or_a_report() {
        let mut p = PrefillShare::default();
        assert_eq!(p.share(1000.0), 0.0);
        p.record(1000, 0, 100 * MS, 1000 * MS);
        assert_eq!(p.share(0.0), 0.0);
        assert!(p.share(1e6) > 0.0);
    }

    #[test]
    fn turns_reported_before_the_rate_is_known_count_at_the_rate_known_later() {
        let mut p = PrefillShare::default();
        // 50 tokens in 100 ms, before the engine told any rate: at the
        // 1000 tokens/s it tells afterwards, half the time was prefill.
        p.record(50, 0, 100 * MS, 10_000 * MS);
        assert!((p.share(1000.0) - 0.5).abs() < 1e-9, "{}", p.share(1000.0));
        assert!((p.share(10_000.0) - 0.05).abs() < 1e-9);
    }

    #[test]
    fn the_share_is_prefill_time_over_wall_time_whatever_the_overlap() {
        let mut p = PrefillShare::default();
        // 1000 tokens/s. Turn one: 100 ms, 50 tokens (50 ms of prefill).
        p.record(50, 0, 100 * MS, 10_000 * MS);
        assert!((p.share(1000.0) - 0.5).abs() < 1e-9, "{}", p.share(1000.0));
        // Two overlapping turns end 100 ms later, 25 tokens each: 100 ms
        // of prefill in 200 ms of wall time, however long each one ran.
        p.record(25, 0, 150 * MS, 10_000 * MS);
        p.record(25, 50 * MS, 200 * MS, 10_000 * MS);
        assert!((p.share(1000.0) - 0.5).abs() < 1e-9, "{}", p.share(1000.0));
    }

    #[test]
    fn the_share_follows_the_recent_past_and_stays_below_the_ceiling() {
        let mut p = PrefillShare::default();
        let window = 100 * MS;
        let mut now = 0;
        // A long all-prefill stretch: the share is capped.
        for _ in 0..100 {
            p.record(100, now, now + 100 * MS, window);
            now += 100 * MS;
        }
        assert_eq!(p.share(1000.0), SHARE_CEILING);
        // Then no prefill at all: within a few times the memory, the old
        // stretch no longer counts.
        for _ in 0..200 {
            p.record(0, now, now + 100 * MS, window);
            now += 100 * MS;
        }
        assert!(p.share(1000.0) < 0.01, "{}", p.share(1000.0));
    }
}

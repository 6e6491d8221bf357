//! What the cache holds and how fast the engine refills it: the capacity
//! in tokens, the prefill rate, the refill window `C / r` they give, and
//! what rebuilding a history of a given length costs (module `rebuild`).

use std::collections::VecDeque;

use super::rebuild::{pairs, LearnedPairCost};
use super::tuning::{USAGE_SAMPLES, USAGE_SAMPLE_FLOOR};
use super::types::{EngineCapacity, KvTier};

/// The capacity in force and the refill window derived from it.
#[derive(Debug)]
pub(super) struct Capacity {
    engine: EngineCapacity,
    /// Tokens; `None` while neither the engine nor the gauge has said.
    estimate: Option<f64>,
    /// Capacity estimates from usage answers, while the engine gives none.
    usage_samples: VecDeque<f64>,
    /// The prefill rate measured from turn reports, tokens/s: uncached
    /// prompt tokens over the turn's time, a lower bound (the turn also
    /// waited and decoded); the best seen.
    reported_rate: f64,
    /// The per-pair rebuild cost learned from turn reports, for an engine
    /// that tells no rebuild cost.
    learned_pairs: LearnedPairCost,
    /// The refill window in force, ns.
    window: u64,
    initial_window: u64,
}

impl Capacity {
    pub(super) fn new(initial_window: u64) -> Self {
        Self {
            engine: EngineCapacity::default(),
            estimate: None,
            usage_samples: VecDeque::new(),
            reported_rate: 0.0,
            learned_pairs: LearnedPairCost::default(),
            window: initial_window,
            initial_window,
        }
    }

    /// The engine's answer to the capacity probe: figures reported as 0
    /// keep what was known.
    pub(super) fn set_engine(&mut self, engine: EngineCapacity) {
        if engine == self.engine {
            return;
        }
        if engine.tokens > 0 && engine.tokens != self.engine.tokens {
            self.engine.tokens = engine.tokens;
            self.estimate = Some(engine.tokens as f64);
        }
        if engine.block_tokens > 0 {
            self.engine.block_tokens = engine.block_tokens;
        }
        if engine.prefill_tokens_per_sec > 0.0 {
            self.engine.prefill_tokens_per_sec = engine.prefill_tokens_per_sec;
        }
        if engine.tier.is_some() {
            self.engine.tier = engine.tier;
        }
        if engine.rebuild_cost.is_some() {
            self.engine.rebuild_cost = engine.rebuild_cost;
        }
        // 0 is refused by `EngineCapacity::with_max_model_len`; one set by
        // hand keeps what was known, as every figure reported as 0 does.
        if let Some(n) = engine.max_model_len.filter(|&n| n > 0) {
            self.engine.max_model_len = Some(n);
        }
        self.update_window();
    }

    /// The engine's longest sequence, tokens, if it told it: no session's
    /// history outgrows it.
    pub(super) fn max_model_len(&self) -> Option<u64> {
        self.engine.max_model_len
    }

    /// The figures measured here, for a saved summary: the prefill rate
    /// seen in turn reports, tokens/s, and the per-pair cost's envelope.
    pub(super) fn measured(&self) -> (f64, Vec<(u8, f64, f64)>) {
        (self.reported_rate, self.learned_pairs.envelope())
    }

    /// Takes back figures [`Capacity::measured`] gave (checked by the
    /// summary's parser): they replace what was measured here.
    pub(super) fn adopt_measured(&mut self, rate: f64, envelope: &[(u8, f64, f64)]) {
        self.reported_rate = rate;
        self.learned_pairs = LearnedPairCost::from_envelope(envelope);
        self.update_window();
    }

    /// Whether the engine has said its capacity.
    pub(super) fn engine_told(&self) -> bool {
        self.engine.tokens > 0
    }

    /// Whether `usage` is an answer worth reading.
    pub(super) fn usable(usage: f64) -> bool {
        (USAGE_SAMPLE_FLOOR..=1.0).contains(&usage)
    }

    /// A usage answer while the engine has not said its capacity: the
    /// members in flight hold `in_flight` tokens, so the cache holds about
    /// `in_flight / usage`. The least of the recent samples is used,
    /// because a sample errs upward: a turn admitted but still queued in
    /// the engine, or still generating, holds fewer blocks than it is
    /// counted for (only traffic that bypasses the gate errs downward, to
    /// the safe side).
    pub(super) fn sample_usage(&mut self, usage: f64, in_flight: u64) {
        if in_flight == 0 {
            return;
        }
        let sample = in_flight as f64 / usage;
        if self.usage_samples.len() == USAGE_SAMPLES {
            self.usage_samples.pop_front();
        }
        self.usage_samples.push_back(sample);
        let least = self.usage_samples.iter().copied().fold(sample, f64::min);
        self.estimate = Some(least);
        self.update_window();
    }

    /// A turn reported that it prefilled `uncached` tokens after `cached`
    /// ones in `secs`.
    pub(super) fn report_turn(&mut self, cached: u64, uncached: u64, secs: f64) {
        self.reported_rate = self.reported_rate.max(uncached as f64 / secs);
        self.update_window();
        if self.engine.rebuild_cost.is_none() {
            self.learned_pairs.turn(cached, uncached, secs);
        }
    }

    /// Seconds per prefilled token: the inverse of the prefill rate in
    /// force (0 while unknown). A rebuild runs in the engine's batches like
    /// any prefill, so the rate the engine measures over its own steps
    /// prices it; the per-token term of a told rebuild cost stands in while
    /// no rate is measured ([`Capacity::prefill_rate`]).
    pub(super) fn secs_per_token(&self) -> f64 {
        match self.engine.rebuild_cost {
            Some(c) if self.engine.prefill_tokens_per_sec <= 0.0 => c.secs_per_token(),
            _ => {
                let rate = self.prefill_rate();
                if rate > 0.0 {
                    1.0 / rate
                } else {
                    0.0
                }
            }
        }
    }

    /// Seconds per attended pair: the engine's rebuild cost, else the one
    /// learned from turns (0: priced linearly).
    pub(super) fn secs_per_pair(&self) -> f64 {
        match self.engine.rebuild_cost {
            Some(c) => c.secs_per_pair(),
            None => self.learned_pairs.secs_per_pair(),
        }
    }

    /// Seconds the engine takes to re-prefill `own` tokens after a cached
    /// `prefix`: the linear part at [`Capacity::secs_per_token`], the
    /// attention at [`Capacity::secs_per_pair`]; `None` while no rate is
    /// known.
    pub(super) fn rebuild_secs(&self, prefix: u64, own: u64) -> Option<f64> {
        let per_token = self.secs_per_token();
        if per_token <= 0.0 {
            return None;
        }
        Some(per_token * own as f64 + self.secs_per_pair() * pairs(prefix, own))
    }

    /// Capacity in force, tokens (infinite while unknown: everyone fits).
    pub(super) fn tokens(&self) -> f64 {
        self.estimate.unwrap_or(f64::INFINITY)
    }

    /// The capacity in force, if known.
    pub(super) fn known(&self) -> Option<f64> {
        self.estimate
    }

    /// The engine's capacity figure, tokens (0 while unknown).
    pub(super) fn engine_tokens(&self) -> u64 {
        self.engine.tokens
    }

    /// The engine's block size, tokens (0 while unknown).
    pub(super) fn engine_block_tokens(&self) -> u32 {
        self.engine.block_tokens
    }

    /// The engine's host tier, if it told one.
    pub(super) fn tier(&self) -> Option<KvTier> {
        self.engine.tier
    }

    /// Tokens per KV block (1 while unknown).
    pub(super) fn block_tokens(&self) -> u64 {
        u64::from(self.engine.block_tokens.max(1))
    }

    /// `tokens` rounded up to whole blocks.
    pub(super) fn blocks(&self, tokens: u64) -> u64 {
        let block = self.block_tokens();
        tokens.div_ceil(block) * block
    }

    /// The prefill rate in force, tokens/s: the engine's, else that of its
    /// rebuild cost's per-token term, else the one measured from turn
    /// reports (0 while none is known).
    pub(super) fn prefill_rate(&self) -> f64 {
        if self.engine.prefill_tokens_per_sec > 0.0 {
            self.engine.prefill_tokens_per_sec
        } else if let Some(c) = self.engine.rebuild_cost {
            1.0 / c.secs_per_token()
        } else {
            self.reported_rate
        }
    }

    /// How long the engine takes to prefill its whole cache, ns.
    pub(super) fn window_ns(&self) -> u64 {
        self.window
    }

    /// How long the engine takes to copy its whole cache back from the
    /// host tier, ns, if it has one and its capacity is known.
    pub(super) fn reload_window_ns(&self) -> Option<u64> {
        let tier = self.engine.tier?;
        let c = self.estimate?;
        Some(((c / tier.reload_tokens_per_sec) * 1e9).min(u64::MAX as f64 / 2.0) as u64)
    }

    fn update_window(&mut self) {
        let rate = self.prefill_rate();
        self.window = match self.estimate {
            Some(c) if rate > 0.0 => ((c / rate) * 1e9).min(u64::MAX as f64 / 2.0) as u64,
            _ => self.initial_window,
        };
    }
}

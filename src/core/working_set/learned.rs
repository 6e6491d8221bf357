//! What a working set learned, taken out whole and given back whole, so
//! that a restarted host does not start blind (`core::summary` writes it
//! as bytes). It carries what the gate measured, never what the sessions
//! now running hold: their records belong to the engine that served them.
//!
//! A summary names the engine it was learned on (its capacity, block size
//! and `max_model_len`, as far as they were known). Given back to a working
//! set whose engine has not answered yet, it waits for the first capacity
//! answer and is adopted only if that engine matches; otherwise it is
//! dropped and counted (`WorkingSetStats::summaries_dropped`), never
//! logged (the core has no logger).

use super::capacity::Capacity;
use super::estimates::Means;
use super::lifetimes::Lifetimes;
#[cfg(test)]
use super::WorkingSet;
use crate::core::summary::SummaryError;

/// A working set's learned figures, and the engine they were learned on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Learned {
    /// The engine's capacity, tokens (0: not known when saved).
    pub(crate) engine_tokens: u64,
    /// Tokens per KV block (0: not known when saved).
    pub(crate) block_tokens: u32,
    /// The engine's `max_model_len`, if told.
    pub(crate) max_model_len: Option<u64>,
    /// The means (module `estimates`): output, growth, turn ns, log gap.
    pub(crate) means: [f64; 4],
    /// Finished sessions' turn counts, oldest first (module `lifetimes`).
    pub(crate) lifetimes: Vec<u32>,
    /// The prefill rate measured from turn reports, tokens/s.
    pub(crate) reported_rate: f64,
    /// The learned per-pair cost's envelope: (scale, s/token, keys).
    pub(crate) pair_envelope: Vec<(u8, f64, f64)>,
}

impl Learned {
    /// A summary of nothing learned, on an unknown engine.
    pub(crate) fn nothing() -> Self {
        Self {
            engine_tokens: 0,
            block_tokens: 0,
            max_model_len: None,
            means: [0.0; 4],
            lifetimes: Vec::new(),
            reported_rate: 0.0,
            pair_envelope: Vec::new(),
        }
    }

    /// Whether these figures were learned on an engine like the one
    /// told: each identity figure is compared where both sides know it.
    fn same_engine(&self, tokens: u64, block: u32, max_model_len: Option<u64>) -> bool {
        let same = |a: u64, b: u64| a == 0 || b == 0 || a == b;
        same(self.engine_tokens, tokens)
            && same(u64::from(self.block_tokens), u64::from(block))
            && same(self.max_model_len.unwrap_or(0), max_model_len.unwrap_or(0))
    }
}

/// What a summary replaces: the capacity's measures, the means, the lifetimes.
pub(super) type Figures<'a> = (&'a mut Capacity, &'a mut Means, &'a mut Lifetimes);

impl Learned {
    /// What was learned, with the engine's identity.
    pub(super) fn of(capacity: &Capacity, means: &Means, lifetimes: &Lifetimes) -> Self {
        let (reported_rate, pair_envelope) = capacity.measured();
        Learned {
            engine_tokens: capacity.engine_tokens(),
            block_tokens: capacity.engine_block_tokens(),
            max_model_len: capacity.max_model_len(),
            means: means.figures(),
            lifetimes: lifetimes.remembered().collect(),
            reported_rate,
            pair_envelope,
        }
    }

    /// Whether these figures come from the engine `capacity` describes.
    fn check_engine(&self, capacity: &Capacity) -> Result<(), SummaryError> {
        let (tokens, block) = (capacity.engine_tokens(), capacity.engine_block_tokens());
        let same = self.same_engine(tokens, block, capacity.max_model_len());
        same.then_some(()).ok_or(SummaryError::OtherEngine {
            saved_tokens: self.engine_tokens,
            saved_block_tokens: self.block_tokens,
            tokens,
            block_tokens: block,
        })
    }

    fn apply(self, (capacity, means, lifetimes): Figures) {
        *means = Means::from_figures(self.means);
        let mut learned = Lifetimes::default();
        for turns in self.lifetimes {
            learned.record(turns);
        }
        *lifetimes = learned;
        capacity.adopt_measured(self.reported_rate, &self.pair_envelope);
    }
}

/// A summary given back before the engine answered; those dropped at it.
#[derive(Debug, Default)]
pub(super) struct Summaries {
    pub(super) pending: Option<Learned>,
    pub(super) dropped: u64,
}

impl Summaries {
    /// Adopts `learned`, replacing `figures`: at once if the engine has
    /// answered and matches (another engine: refused, nothing changed),
    /// else at its first capacity answer ([`Summaries::adopt_pending`]).
    /// A later summary replaces one pending.
    pub(super) fn adopt(&mut self, learned: Learned, figures: Figures) -> Result<(), SummaryError> {
        if !figures.0.engine_told() {
            self.pending = Some(learned);
            return Ok(());
        }
        learned.check_engine(figures.0)?;
        learned.apply(figures);
        Ok(())
    }

    /// The engine answered: a summary pending since before is adopted if
    /// the engine matches, else dropped and counted.
    pub(super) fn adopt_pending(&mut self, figures: Figures) {
        if !figures.0.engine_told() {
            return;
        }
        let Some(learned) = self.pending.take() else {
            return;
        };
        match learned.check_engine(figures.0) {
            Ok(()) => learned.apply(figures),
            Err(_) => self.dropped += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::summary::{decode, encode};
    use crate::core::working_set::{EngineCapacity, Tuning, TurnReport};

    const S: u64 = 1_000_000_000;

    fn engine() -> EngineCapacity {
        EngineCapacity::new(1000, 1, 0.0)
            .with_max_model_len(4096)
            .unwrap()
    }

    fn set() -> WorkingSet<u32> {
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(engine()).unwrap();
        ws
    }

    /// A working set that ran sessions of 2 to 5 turns, with reports.
    fn taught() -> WorkingSet<u32> {
        let mut ws = set();
        let mut now = 0;
        for id in 0..4u32 {
            let mut prompt = 50;
            for turn in 0..(2 + id) {
                ws.request(&id, prompt, now);
                let report = TurnReport::new(Some(u64::from(turn) * 40), Some(30));
                ws.release(&id, prompt, report, now, now + S / 20);
                now += S / 5;
                prompt += 80;
            }
            ws.finish(&id, now);
        }
        ws
    }

    #[test]
    fn a_summary_saved_and_loaded_gives_the_same_figures() {
        let ws = taught();
        let learned = ws.learned();
        assert!(learned.means.iter().any(|&m| m > 0.0));
        assert_eq!(learned.lifetimes, vec![2, 3, 4, 5]);
        assert!(learned.reported_rate > 0.0);
        let bytes = encode(&learned);
        let mut fresh = set();
        fresh.adopt(decode(&bytes).unwrap()).unwrap();
        assert_eq!(fresh.learned(), learned);
        assert_eq!(fresh.stats().horizon_turns, ws.stats().horizon_turns);
        assert_eq!(fresh.capacity.prefill_rate(), ws.capacity.prefill_rate());
        assert_eq!(fresh.window_ns(), ws.window_ns());
    }

    #[test]
    fn another_engines_summary_is_refused_and_changes_nothing() {
        let learned = taught().learned();
        let mut other = WorkingSet::<u32>::new(Tuning::default());
        other.set_engine(EngineCapacity::new(2000, 1, 0.0)).unwrap();
        let before = other.learned();
        let err = other.adopt(learned).unwrap_err();
        assert!(matches!(
            err,
            SummaryError::OtherEngine { tokens: 2000, .. }
        ));
        assert_eq!(other.learned(), before);
    }

    #[test]
    fn a_summary_given_before_the_engine_waits_for_a_matching_one() {
        let learned = taught().learned();
        let mut ws = WorkingSet::<u32>::new(Tuning::default());
        ws.adopt(learned.clone()).unwrap();
        assert!(ws.summary_pending());
        ws.set_engine(engine()).unwrap();
        assert!(!ws.summary_pending());
        assert_eq!(ws.learned(), learned);
        assert_eq!(ws.stats().summaries_dropped, 0);

        let mut ws = WorkingSet::<u32>::new(Tuning::default());
        ws.adopt(learned).unwrap();
        ws.set_engine(EngineCapacity::new(1000, 16, 0.0)).unwrap();
        assert!(!ws.summary_pending());
        assert_eq!(ws.stats().summaries_dropped, 1, "another engine: dropped");
        assert!(ws.learned().lifetimes.is_empty());
    }
}

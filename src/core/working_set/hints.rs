//! What the host knows and may tell the gate (issue 51, part 2): the
//! engine's longest sequence (`max_model_len`, with the capacity answer)
//! and a session's budget (an RL rollout's most turns or tokens). Every
//! figure is optional: one never told means the gate learns it. Figures
//! that would mislead the policy are refused here, before they are
//! stored, and the gate keeps what it had.
//!
//! This module stores them; the admission rule's window-ahead test reads
//! them ([`WorkingSet::max_model_len`](super::WorkingSet::max_model_len), [`History::budget`]) to bound how
//! far it projects a session.

use std::fmt;

use super::lifecycle::History;
use super::types::EngineCapacity;
#[cfg(test)]
use super::WorkingSet;

/// What the host knows of how far one session may run: an RL rollout's
/// most turns and/or most tokens (prompt and output, its whole history).
/// `None` for a figure the host does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    /// The most turns the session runs.
    pub turns: Option<u32>,
    /// The most tokens its history reaches.
    pub tokens: Option<u64>,
}

impl Budget {
    /// A budget of at most `turns` turns and `tokens` tokens (`None`: not known).
    pub fn new(turns: Option<u32>, tokens: Option<u64>) -> Self {
        Self { turns, tokens }
    }
}

/// Why a figure the host told was refused. The gate keeps what it knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HintError {
    /// A `max_model_len` of 0: an engine that does not know its own tells none.
    MaxModelLen,
    /// A budget of 0 turns: a host that does not know them tells none.
    BudgetTurns,
    /// A budget of 0 tokens: a host that does not know them tells none.
    BudgetTokens,
    /// A budget of more tokens than the engine's `max_model_len`: no
    /// session can outgrow the engine's longest sequence.
    BudgetPastMaxModelLen {
        /// The budget's tokens.
        tokens: u64,
        /// The engine's `max_model_len`.
        max_model_len: u64,
    },
}

impl fmt::Display for HintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MaxModelLen => write!(
                f,
                "max_model_len must be > 0 tokens (an engine that does not know it tells none)"
            ),
            Self::BudgetTurns => write!(
                f,
                "the budget's turns must be > 0 (a host that does not know them tells none)"
            ),
            Self::BudgetTokens => write!(
                f,
                "the budget's tokens must be > 0 (a host that does not know them tells none)"
            ),
            Self::BudgetPastMaxModelLen {
                tokens,
                max_model_len,
            } => write!(
                f,
                "the budget's tokens ({tokens}) exceed the engine's max_model_len ({max_model_len})"
            ),
        }
    }
}

impl std::error::Error for HintError {}

impl Budget {
    /// Refuses a figure of 0, and tokens past `max_model_len` if known.
    pub(crate) fn check(&self, max_model_len: Option<u64>) -> Result<(), HintError> {
        if self.turns == Some(0) {
            return Err(HintError::BudgetTurns);
        }
        match (self.tokens, max_model_len) {
            (Some(0), _) => Err(HintError::BudgetTokens),
            (Some(tokens), Some(max_model_len)) if tokens > max_model_len => {
                Err(HintError::BudgetPastMaxModelLen {
                    tokens,
                    max_model_len,
                })
            }
            _ => Ok(()),
        }
    }
}

impl EngineCapacity {
    /// This answer with the engine's longest sequence, tokens (vLLM's
    /// `model_config.max_model_len`): no session outgrows it. Refuses 0.
    pub fn with_max_model_len(mut self, max_model_len: u64) -> Result<Self, HintError> {
        if max_model_len == 0 {
            return Err(HintError::MaxModelLen);
        }
        self.max_model_len = Some(max_model_len);
        Ok(self)
    }
}

impl History {
    /// The budget the host told for this session (`Budget::default()`:
    /// none; every figure learned).
    pub(super) fn budget(&self) -> Budget {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::working_set::Tuning;

    fn set() -> WorkingSet<&'static str> {
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(1000, 1, 1000.0)).unwrap();
        ws
    }

    #[test]
    fn max_model_len_is_stored_with_the_capacity_and_kept_by_answers_without_it() {
        let mut ws = set();
        assert_eq!(ws.max_model_len(), None, "absent: learned");
        let told = EngineCapacity::new(1000, 1, 1000.0).with_max_model_len(4096);
        ws.set_engine(told.unwrap()).unwrap();
        assert_eq!(ws.max_model_len(), Some(4096));
        ws.set_engine(EngineCapacity::new(1000, 1, 2000.0)).unwrap();
        assert_eq!(
            ws.max_model_len(),
            Some(4096),
            "an answer without it keeps it"
        );
    }

    #[test]
    fn a_max_model_len_of_zero_is_refused_and_the_previous_kept() {
        let mut ws = set();
        let e = EngineCapacity::new(1000, 1, 0.0).with_max_model_len(0);
        assert_eq!(e, Err(HintError::MaxModelLen));
        assert!(HintError::MaxModelLen.to_string().contains("max_model_len"));
        let told = EngineCapacity::default().with_max_model_len(2048).unwrap();
        ws.set_engine(told).unwrap();
        // Set by hand past the constructor: kept as every 0 figure is.
        let zero = EngineCapacity {
            max_model_len: Some(0),
            ..EngineCapacity::default()
        };
        ws.set_engine(zero).unwrap();
        assert_eq!(ws.max_model_len(), Some(2048));
    }

    #[test]
    fn a_budget_told_before_the_first_turn_is_kept_and_forgotten_with_the_session() {
        let mut ws = set();
        assert_eq!(ws.budget(&"a"), None);
        let budget = Budget::new(Some(20), Some(900));
        ws.set_budget(&"a", budget).unwrap();
        assert_eq!(ws.budget(&"a"), Some(budget));
        let s = ws.slots[&"a"];
        assert_eq!(ws.sessions[s].history.budget(), budget);
        ws.request(&"a", 100, 0);
        assert_eq!(ws.budget(&"a"), Some(budget), "kept at its first turn");
        ws.finish(&"a", 1);
        assert_eq!(ws.budget(&"a"), None);
        // A budget told for a session that never asks is forgotten by a finish.
        ws.set_budget(&"b", Budget::new(None, Some(10))).unwrap();
        ws.finish(&"b", 2);
        assert_eq!(ws.budget(&"b"), None);
        assert_eq!(ws.stats().members, 0);
    }

    #[test]
    fn a_budget_of_nothing_or_past_max_model_len_is_refused_and_the_previous_kept() {
        let mut ws = set();
        let kept = Budget::new(Some(5), Some(500));
        ws.set_budget(&"a", kept).unwrap();
        for (bad, err) in [
            (Budget::new(Some(0), None), HintError::BudgetTurns),
            (Budget::new(None, Some(0)), HintError::BudgetTokens),
        ] {
            assert_eq!(ws.set_budget(&"a", bad), Err(err));
            assert_eq!(ws.budget(&"a"), Some(kept));
        }
        let told = EngineCapacity::default().with_max_model_len(800).unwrap();
        ws.set_engine(told).unwrap();
        let past = Budget::new(None, Some(801));
        let err = ws.set_budget(&"a", past).unwrap_err();
        assert_eq!(
            err,
            HintError::BudgetPastMaxModelLen {
                tokens: 801,
                max_model_len: 800
            }
        );
        assert!(err.to_string().contains("max_model_len"));
        assert_eq!(ws.budget(&"a"), Some(kept));
        assert_eq!(ws.set_budget(&"z", past), Err(err));
        assert_eq!(ws.budget(&"z"), None, "a refused budget makes no record");
        ws.set_budget(&"a", Budget::new(None, Some(800))).unwrap();
        assert_eq!(ws.budget(&"a"), Some(Budget::new(None, Some(800))));
    }
}

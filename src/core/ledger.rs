//! The working set as the core shares it: one lock around the
//! [`WorkingSet`] bookkeeping, its next deadline readable without the lock,
//! and the grants each change hands over.
//!
//! Lock order: a shard lock may be held when the ledger's is taken (an
//! attempt decides under its session's shard lock), never the other way
//! round; grants are handed over after the ledger's lock is dropped.

use super::prompt::PromptSketch;
use super::sessions::SessionKey;
use super::summary::SummaryError;
use super::timers::NEVER;
use super::working_set::{
    Budget, EngineCapacity, HintError, Learned, RebuildCost, TierError, TurnReport, Verdict,
    WorkingSet, WorkingSetStats,
};
use crate::sync::{AtomicU64, Mutex, Ordering};

/// What a change to the policy asks of the core: the sessions the working
/// set let in (to be woken through their records), whether its next
/// deadline moved earlier (a sleeper that folded the old one in must ask
/// again), and whether room is to be announced as a capacity event (the
/// seed's table).
#[derive(Debug, Default)]
pub(crate) struct Grants {
    pub(crate) sessions: Vec<(SessionKey, Verdict)>,
    pub(crate) deadline_earlier: bool,
    pub(crate) capacity_event: bool,
}

impl Grants {
    pub(crate) fn capacity_event() -> Self {
        Self {
            capacity_event: true,
            ..Self::default()
        }
    }

    pub(crate) fn extend(&mut self, other: Grants) {
        self.sessions.extend(other.sessions);
        self.deadline_earlier |= other.deadline_earlier;
        self.capacity_event |= other.capacity_event;
    }
}

/// What a release tells the working set about the turn (carried in the
/// lease token from its admission).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn {
    pub(crate) prompt_len: usize,
    pub(crate) admitted_at: u64,
}

/// The engine's answers of an attempt's pass, as far as they were asked:
/// its usage and its capacity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineAnswers {
    pub(crate) usage: Option<f64>,
    pub(crate) capacity: Option<EngineCapacity>,
    /// The capacity answer speaks of a tier even when it tells none
    /// (`WorkingSet::check_engine`).
    pub(crate) says_tier: bool,
}

#[derive(Debug)]
pub(crate) struct Ledger {
    set: Mutex<WorkingSet<SessionKey>>,
    /// `WorkingSet::next_deadline` as of the last change, or [`NEVER`].
    deadline: AtomicU64,
    /// Engine answers and turn reports refused before they reached the set
    /// ([`Ledger::count_refused`], [`Ledger::take_answer`]); added to the
    /// set's own `refused_answers` in [`Ledger::stats`].
    refused_outside: AtomicU64,
}

impl Ledger {
    pub(crate) fn new(set: WorkingSet<SessionKey>) -> Self {
        Self {
            set: Mutex::new(set),
            deadline: AtomicU64::new(NEVER),
            refused_outside: AtomicU64::new(0),
        }
    }

    /// Runs `change`, then lets in whoever may now enter and publishes the
    /// next deadline. Returns `change`'s result and the grants. Every
    /// `change` ends the windows over at `now` (`WorkingSet::expire`; a
    /// request and a release do it themselves).
    fn change<R>(
        &self,
        now: u64,
        change: impl FnOnce(&mut WorkingSet<SessionKey>) -> R,
    ) -> (R, Grants) {
        let mut set = self.set.lock();
        let result = change(&mut set);
        let mut grants = Grants::default();
        set.admit_waiting(now, &mut grants.sessions);
        let next = set.next_deadline().unwrap_or(NEVER);
        let before = self.deadline.swap(next, Ordering::SeqCst);
        grants.deadline_earlier = next < before;
        (result, grants)
    }

    /// An attempt's turn asks to be admitted; the engine's answers of this
    /// pass come with it. Returns the verdict and the stay in the working
    /// set the turn belongs to (`WorkingSet::membership`; 0 if it waits).
    pub(crate) fn request(
        &self,
        key: &SessionKey,
        prompt_len: usize,
        sketch: Option<&PromptSketch>,
        engine: EngineAnswers,
        now: u64,
    ) -> (Verdict, u64, Grants) {
        let ((verdict, stay), grants) = self.change(now, |set| {
            if let Some(capacity) = engine.capacity {
                // A refused answer is counted and changes nothing.
                let _ = set.set_engine_answer(capacity, engine.says_tier);
            }
            if let Some(usage) = engine.usage {
                set.observe_usage(usage);
            }
            let verdict = set.request_sketched(key, prompt_len as u64, sketch, now);
            (verdict, set.membership(key))
        });
        (verdict, stay, grants)
    }

    /// A turn ended, admitted during the session's `stay` as `request`
    /// answered it.
    pub(crate) fn release(
        &self,
        key: &SessionKey,
        stay: u64,
        turn: Turn,
        report: TurnReport,
        now: u64,
    ) -> Grants {
        self.change(now, |set| {
            set.release_of(
                key,
                turn.prompt_len as u64,
                report,
                turn.admitted_at,
                stay,
                now,
            )
        })
        .1
    }

    /// The session's waiting attempt is gone.
    pub(crate) fn withdraw(&self, key: &SessionKey, now: u64) -> Grants {
        self.change(now, |set| {
            set.withdraw(key);
            set.expire(now);
        })
        .1
    }

    /// The session ended.
    pub(crate) fn finish(&self, key: &SessionKey, now: u64) -> Grants {
        self.change(now, |set| {
            set.finish(key, now);
            set.expire(now);
        })
        .1
    }

    /// Whether the session's waiting turn finds its cache gone
    /// (`WorkingSet::waiting_cache_gone`).
    pub(crate) fn waiting_cache_gone(&self, key: &SessionKey) -> Option<bool> {
        self.set.lock().waiting_cache_gone(key)
    }

    /// The core no longer tracks the session: forget what was learned of it.
    pub(crate) fn forget(&self, key: &SessionKey, now: u64) -> Grants {
        self.change(now, |set| {
            if !set.is_member(key) && !set.is_waiting(key) {
                set.forget(key, now);
            }
            set.expire(now);
        })
        .1
    }

    /// Fires what is due at `now` (window ends, the wait bound).
    pub(crate) fn purge(&self, now: u64) -> Grants {
        if now < self.deadline.load(Ordering::SeqCst) {
            return Grants::default();
        }
        self.change(now, |set| set.expire(now)).1
    }

    /// The earliest time the working set changes by itself, or [`NEVER`].
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::SeqCst)
    }

    pub(crate) fn stats(&self) -> WorkingSetStats {
        let mut stats = self.set.lock().stats();
        stats.refused_answers += self.refused_outside.load(Ordering::Relaxed);
        stats
    }

    /// The engine's rebuild cost is `cost` from `now` on.
    pub(crate) fn set_rebuild_cost(&self, cost: RebuildCost, now: u64) -> Grants {
        let ((), grants) = self.change(now, |set| {
            let answer = EngineCapacity::default().with_rebuild_cost(cost);
            // An answer of a cost alone speaks of no tier: never refused.
            let _ = set.set_engine(answer);
        });
        grants
    }

    /// The engine's `max_model_len` is `answer`'s (checked > 0 by the caller).
    pub(crate) fn set_max_model_len(&self, answer: EngineCapacity, now: u64) -> Grants {
        // Told again with every capacity answer by some hosts (Python's):
        // the same figure changes nothing and lets nobody in.
        if self.set.lock().max_model_len() == answer.max_model_len {
            return Grants::default();
        }
        let ((), grants) = self.change(now, |set| {
            // An answer of a length alone speaks of no tier: never refused.
            let _ = set.set_engine(answer);
        });
        grants
    }

    /// `key`'s budget, as the host told it.
    pub(crate) fn set_budget(
        &self,
        key: &SessionKey,
        budget: Budget,
        now: u64,
    ) -> (Result<(), HintError>, Grants) {
        self.change(now, |set| set.set_budget(key, budget))
    }

    /// What the working set learned.
    pub(crate) fn learned(&self) -> Learned {
        self.set.lock().learned()
    }

    /// Adopts a parsed summary (or keeps it until the engine answers).
    pub(crate) fn adopt(&self, learned: Learned, now: u64) -> (Result<(), SummaryError>, Grants) {
        self.change(now, |set| set.adopt(learned))
    }

    /// Counts a report refused before it reached the set.
    pub(crate) fn count_refused(&self) {
        self.refused_outside.fetch_add(1, Ordering::Relaxed);
    }

    /// An engine answer its host must hear refused, checked where it is
    /// recorded (`WorkingSet::set_engine_answer`; only checked unless
    /// `record`), under one lock. `answer` is what the host's figures made
    /// of it: `Err`, refused in itself; `Ok(None)`, nothing to record. A
    /// refusal is counted and changes nothing.
    pub(crate) fn take_answer(
        &self,
        answer: Result<Option<EngineCapacity>, TierError>,
        record: bool,
    ) -> Result<(), TierError> {
        let refused = match answer {
            Ok(None) => return Ok(()),
            Ok(Some(capacity)) if record => {
                return self.set.lock().set_engine_answer(capacity, true);
            }
            Ok(Some(capacity)) => self.set.lock().check_engine(&capacity, true),
            Err(err) => Err(err),
        };
        if refused.is_err() {
            self.count_refused();
        }
        refused
    }
}

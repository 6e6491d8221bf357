//! The admission policy a core runs (the config's `admission`), behind the
//! one interface the core calls: it reports the lifecycle's events (a pass
//! to decide, a lease granted or released, an attempt withdrawn, a session
//! finished or forgotten, time passing, the engine's answers, the host's
//! hints) and gets back what it must do next as data ([`Grants`]). Only
//! this module looks at which policy is in force.

use super::ledger::{EngineAnswers, Grants, Ledger, Turn};
use super::probe_answer::ProbeAnswer;
use super::prompt::PromptSketch;
use super::reason::Reason;
use super::reference::{Decision, Facts, Table};
use super::sessions::{SessionKey, SessionRecord, SessionTable};
use super::stats::ShardCounters;
use super::summary::SummaryError;
use super::timers::NEVER;
use super::waiters::Waiters;
use super::working_set::{Budget, EngineCapacity, HintError, Learned, RebuildCost, TierError};
use super::working_set::{TurnReport, Verdict, WorkingSetStats};
use crate::error::ReleaseError;

/// The admission policy in force.
// One per core, so the variants' sizes do not matter; boxing the ledger
// would only add a pointer chase to every turn.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Policy {
    /// The seed's decision table over the engine's usage and the prompt's
    /// resident prefix, with the sessions' reservations and grace windows.
    Reference(Table),
    /// The working set of sessions whose histories fit the cache (module
    /// `working_set`), behind its lock; it keeps each member's place.
    WorkingSet(Ledger),
}

/// What a lease holds of its session, as the policy granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holds {
    /// Nothing: a reference-mode lease that does not retain the session.
    Nothing,
    /// Reference mode: the session's ownership window, by id.
    Window(u64),
    /// Working-set mode: the session's stay in the working set that the
    /// turn was admitted in ([`WorkingSet::membership`](super::working_set::WorkingSet::membership)).
    Stay(u64),
}

/// One pass of an attempt, as the policy decides it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass<'a> {
    pub(crate) key: &'a SessionKey,
    pub(crate) prompt_len: usize,
    pub(crate) sketch: Option<&'a PromptSketch>,
    pub(crate) facts: Facts,
    pub(crate) capacity: Option<EngineCapacity>,
    pub(crate) says_tier: bool,
}

impl Policy {
    /// Whether a waiter woken asks the policy again without asking the
    /// engine first: the working set's place in line and any grant handed
    /// over while it slept are the ledger's, and the members' own passes
    /// keep the engine's figures fresh.
    #[inline]
    pub(crate) fn waiter_asks_again_unprobed(&self) -> bool {
        matches!(self, Policy::WorkingSet(_))
    }

    /// Whether room is announced as a capacity event that one woken waiter
    /// takes and passes on if it does not use it (the seed's table), rather
    /// than handed over as grants by the ledger.
    #[inline]
    pub(crate) fn passes_capacity_events(&self) -> bool {
        matches!(self, Policy::Reference(_))
    }

    /// Whether admission reads the engine's capacity and the prompts'
    /// sketches (the working set does, the seed's table reads neither).
    #[inline]
    pub(crate) fn reads_capacity(&self) -> bool {
        matches!(self, Policy::WorkingSet(_))
    }

    /// Decides `pass` under the session's lock: the decision, what an
    /// admission holds (the seed's window is taken by [`Policy::admit`]),
    /// and the grants the request handed to others.
    #[inline]
    pub(crate) fn decide(
        &self,
        record: &SessionRecord,
        pass: Pass,
        now: u64,
    ) -> (Decision, Holds, Grants) {
        let ledger = match self {
            Policy::Reference(table) => {
                let decision = table.decide(record, pass.facts, now);
                return (decision, Holds::Nothing, Grants::default());
            }
            Policy::WorkingSet(ledger) => ledger,
        };
        let engine = EngineAnswers {
            usage: pass.facts.usage.and_then(ProbeAnswer::value),
            capacity: pass.capacity,
            says_tier: pass.says_tier,
        };
        let (verdict, stay, grants) =
            ledger.request(pass.key, pass.prompt_len, pass.sketch, engine, now);
        (working_set_decision(verdict), Holds::Stay(stay), grants)
    }

    /// An admission for `reason`, decided holding `holds`, is granted to
    /// `record` (under its lock): what its lease holds. A retaining one of
    /// the seed's table opens or renews the session's window (`mint` names
    /// a new one).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit(
        &self,
        record: &mut SessionRecord,
        reason: Reason,
        holds: Holds,
        c: &ShardCounters,
        waiters: &Waiters,
        now: u64,
        mint: impl FnOnce() -> u64,
    ) -> Holds {
        match self {
            Policy::Reference(table) => (table.admit(record, reason, c, waiters, now, mint))
                .map_or(Holds::Nothing, Holds::Window),
            Policy::WorkingSet(_) => holds,
        }
    }

    /// A lease holding `holds` is released, under its record's lock.
    #[inline]
    pub(crate) fn release_record(
        &self,
        record: &mut SessionRecord,
        holds: Holds,
        c: &ShardCounters,
        waiters: &Waiters,
        now: u64,
    ) {
        if let (Policy::Reference(table), Holds::Window(window)) = (self, holds) {
            table.release(record, window, c, waiters, now);
        }
    }

    /// A lease holding `holds` was released (its record's lock dropped):
    /// the seed's table announces room, the working set learns the turn.
    #[inline]
    pub(crate) fn release(
        &self,
        key: &SessionKey,
        holds: Holds,
        turn: Turn,
        report: TurnReport,
        now: u64,
    ) -> Grants {
        let Policy::WorkingSet(ledger) = self else {
            return Grants::capacity_event();
        };
        // A lease the ledger did not grant holds no stay that can match.
        let stay = if let Holds::Stay(stay) = holds {
            stay
        } else {
            0
        };
        ledger.release(key, stay, turn, report, now)
    }

    /// `finish_session` ends the record's window, under its lock.
    #[inline]
    pub(crate) fn finish_record(
        &self,
        record: &mut SessionRecord,
        c: &ShardCounters,
        waiters: &Waiters,
    ) {
        if let Policy::Reference(table) = self {
            table.finish(record, c, waiters);
        }
    }

    /// `finish_session` finished the session `bytes`; `tracked`: it had a
    /// record (the seed's table announces room only then).
    #[inline]
    pub(crate) fn finish(&self, hash: u64, bytes: &[u8], tracked: bool, now: u64) -> Grants {
        let Policy::WorkingSet(ledger) = self else {
            return Grants {
                capacity_event: tracked,
                ..Grants::default()
            };
        };
        ledger.finish(
            &SessionKey {
                hash,
                bytes: bytes.into(),
            },
            now,
        )
    }

    /// The session's waiting attempt is gone.
    #[inline]
    pub(crate) fn withdraw(&self, key: &SessionKey, now: u64) -> Grants {
        self.ledger()
            .map_or_else(Grants::default, |l| l.withdraw(key, now))
    }

    /// The core no longer tracks the session.
    #[inline]
    pub(crate) fn forget(&self, key: &SessionKey, now: u64) -> Grants {
        self.ledger()
            .map_or_else(Grants::default, |l| l.forget(key, now))
    }

    /// Whether the session's waiting turn may run elsewhere (its cache is
    /// gone); the seed's table keeps no line to release it from.
    pub(crate) fn may_release_elsewhere(&self, key: &SessionKey) -> Result<(), ReleaseError> {
        match self
            .ledger()
            .ok_or(ReleaseError::NoWorkingSet)?
            .waiting_cache_gone(key)
        {
            Some(true) => Ok(()),
            Some(false) => Err(ReleaseError::CacheHot),
            None => Err(ReleaseError::NotWaiting),
        }
    }

    pub(crate) fn waiting_cache_gone(&self, key: &SessionKey) -> Option<bool> {
        self.ledger()?.waiting_cache_gone(key)
    }

    /// The earliest time something changes by itself, or [`NEVER`].
    #[inline]
    pub(crate) fn deadline(&self) -> u64 {
        match self {
            Policy::Reference(table) => table.earliest(),
            Policy::WorkingSet(ledger) => ledger.deadline(),
        }
    }

    /// Fires what is due at `now` in the policy's own state, if anything.
    #[inline]
    pub(crate) fn purge(&self, now: u64) -> Option<Grants> {
        let ledger = self.ledger()?;
        (now >= ledger.deadline()).then(|| ledger.purge(now))
    }

    /// The earliest end of a window kept in the session records, or
    /// [`NEVER`]: [`Policy::expire_windows`] is due then.
    #[inline]
    pub(crate) fn windows_earliest(&self) -> u64 {
        self.table().map_or(NEVER, Table::earliest)
    }

    /// Ends up to `batch` windows kept in the records that are over at
    /// `now`, `settle` saying whether each record is to be forgotten;
    /// returns whether any ended.
    #[inline]
    pub(crate) fn expire_windows(
        &self,
        now: u64,
        batch: usize,
        table: &SessionTable,
        waiters: &Waiters,
        settle: impl Fn(&mut SessionRecord, &ShardCounters) -> bool,
    ) -> bool {
        self.table()
            .is_some_and(|t| t.expire(now, batch, table, waiters, settle))
    }

    /// Timer entries held, for memory accounting.
    pub(crate) fn timer_entries(&self) -> usize {
        self.table().map_or(0, Table::timer_entries)
    }

    pub(crate) fn stats(&self) -> Option<WorkingSetStats> {
        self.ledger().map(Ledger::stats)
    }

    /// The seed's table reads no capacity: it refuses only an answer
    /// refused in itself, and counts nothing.
    pub(crate) fn take_answer(
        &self,
        answer: Result<Option<EngineCapacity>, TierError>,
        record: bool,
    ) -> Result<(), TierError> {
        match self.ledger() {
            Some(ledger) => ledger.take_answer(answer, record),
            None => answer.map(drop),
        }
    }

    pub(crate) fn count_refused(&self) {
        if let Some(ledger) = self.ledger() {
            ledger.count_refused();
        }
    }

    pub(crate) fn set_rebuild_cost(&self, cost: RebuildCost, now: u64) -> Grants {
        self.ledger()
            .map_or_else(Grants::default, |l| l.set_rebuild_cost(cost, now))
    }

    pub(crate) fn set_max_model_len(&self, answer: EngineCapacity, now: u64) -> Grants {
        self.ledger()
            .map_or_else(Grants::default, |l| l.set_max_model_len(answer, now))
    }

    /// The seed's table stores no budget, but refuses what the working set
    /// would.
    pub(crate) fn set_budget(
        &self,
        key: &SessionKey,
        budget: Budget,
        now: u64,
    ) -> (Result<(), HintError>, Grants) {
        match self.ledger() {
            Some(ledger) => ledger.set_budget(key, budget, now),
            None => (budget.check(None), Grants::default()),
        }
    }

    pub(crate) fn learned(&self) -> Learned {
        self.ledger().map_or_else(Learned::nothing, Ledger::learned)
    }

    /// The seed's table keeps nothing of a summary.
    pub(crate) fn adopt(&self, learned: Learned, now: u64) -> (Result<(), SummaryError>, Grants) {
        match self.ledger() {
            Some(ledger) => ledger.adopt(learned, now),
            None => (Ok(()), Grants::default()),
        }
    }

    #[inline]
    fn ledger(&self) -> Option<&Ledger> {
        match self {
            Policy::WorkingSet(ledger) => Some(ledger),
            Policy::Reference(_) => None,
        }
    }

    #[inline]
    fn table(&self) -> Option<&Table> {
        match self {
            Policy::Reference(table) => Some(table),
            Policy::WorkingSet(_) => None,
        }
    }
}

/// The working set's verdict as a step of the decision.
fn working_set_decision(verdict: Verdict) -> Decision {
    match verdict {
        Verdict::Member => Decision::Admit(Reason::ReservedSession),
        Verdict::Fits => Decision::Admit(Reason::FitsWorkingSet),
        Verdict::Empty => Decision::Admit(Reason::EmptyWorkingSet),
        Verdict::WaitBound => Decision::Admit(Reason::WaitBound),
        Verdict::RunningColdPays => Decision::Admit(Reason::RunningColdPays),
        Verdict::Wait => Decision::Wait,
    }
}

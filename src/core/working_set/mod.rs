//! Working-set admission: which sessions may have turns on the engine, so
//! that what they keep in the prefix cache fits in it.
//!
//! An agent session re-sends its whole history every turn. Between turns
//! (a tool call) it runs nothing, and vLLM frees its blocks to the free
//! queue, where they stay cached until the engine needs them. Once the
//! histories of the sessions taking turns outgrow the cache, each turn
//! evicts another session's history and every return re-prefills it:
//! thrashing. This is Denning's working-set load control (1968) mapped
//! onto a prefix cache: a session is a process, its history is its working
//! set, a turn whose prefix was evicted is a page fault and its re-prefill
//! the fault's service time. Thrashing is cured by limiting *which
//! sessions are active* to what fits, not by a better eviction order. The
//! engine's usage gauge cannot do it: it counts only the blocks of running
//! requests, and a session in a tool call is invisible to it.
//!
//! So the working set counts, in tokens of KV (module `capacity` for the
//! capacity `C` and the engine's prefill rate `r`; module `rebuild` for
//! `T(o)`, what re-prefilling `o` tokens of a history costs the engine, its
//! attention over the history included):
//! - each member's **footprint**: its newest prompt plus its output,
//!   whole blocks; every **shared prefix** (a system prompt, the task a
//!   GRPO group's samples share, a sub-agent's parent history) is counted
//!   once while a member uses it (module `prefix_tree`; module
//!   `shared_prefix` for hosts that pass prompts' lengths only);
//! - **ghosts**: a session that left leaves its blocks in the free queue,
//!   and the engine evicts the least recently freed first, so blocks freed
//!   after a member's still stand between it and eviction (module
//!   `roster`);
//! - a **reserve** per member: what its next turn adds (module
//!   `estimates`).
//!
//! How long to keep a member's place between turns follows from the two
//! costs (ski rental). Holding a footprint `f` for a time `t` idles `f·t`
//! of cache; dropping it costs a re-prefill of `f`, during which the cache
//! waits: `f·C/r`. They break even at `t = C/r` whatever `f`: the
//! **refill window**. A member keeps its place for one window after each
//! turn, unless its own tool calls usually outlast the window (module
//! `window`), or the host tells no ends and the session has run the turns
//! sessions usually end after. The window stays linear in the history:
//! `r` is measured over the engine's own steps, whose chunks already
//! attend over the histories they extend, and pricing a long member's
//! window by `T(o)` lengthened it past what its tool calls pay for
//! (`docs/decisions/rebuild-cost.md`).
//!
//! The rule that lets others in (module `admission`): a member's turn
//! always goes in; everyone else queues, first come first served. The
//! head joins when nobody is in, or when it fits beside the members and
//! their reserves and the members would still fit as they grow over a
//! window's turns (each weighted by the chance that it is still running
//! then, measured on the sessions that finished and on how far those
//! still running have got). When prompts grow until the members no longer
//! fit, the member between turns released longest ago is **parked**: the
//! engine would evict its blocks first anyway; and since an overflow says
//! the members outgrew the cache, those that would not fit a window ahead
//! are parked with it, while their histories are short. A
//! head that has waited `B` windows (the **wait bound**) has members
//! between turns parked for it, paid from a budget of `1/B` of the
//! engine's time in rebuilds, each priced at `T(o)` (module
//! `rotation_budget`).
//!
//! With a host tier behind the cache (module `tier`), a parked member
//! comes back by a copy at the tier's reload rate `R` instead: the same
//! break-even gives a window of `C/R`, while the sessions in rotation (the
//! members and those parked in the tier) fit the tier. The gate keeps the
//! tier's LRU order and drops the oldest parked sessions it outgrows (they
//! come back as newcomers); sessions parked there go before newcomers.
//!
//! Each rule kept here was measured against the hindsight-best fixed cap
//! with it switched off; rules that did not earn their keep were removed
//! (`docs/decisions/working-set-distilled.md`).
//!
//! This module is bookkeeping only: no lock, no clock, no probe. The core
//! keeps one per gate behind one lock (`core::ledger`) and feeds it time
//! and the engine's answers. A grant made while the session's attempt
//! sleeps is kept until that attempt collects it, or withdrawn with it.

mod admission;
mod audit;
mod capacity;
mod estimates;
mod hints;
mod holding;
mod learned;
mod lifecycle;
mod lifetimes;
mod prefix_tree;
mod queue;
mod rebuild;
mod resume;
mod roster;
mod rotation_budget;
mod shared_prefix;
mod sharing;
mod silences;
mod tier;
mod tuning;
mod turns;
mod types;
mod window;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::Hash;

use slab::Slab;

#[cfg(test)]
use super::prompt::PromptSketch;

use super::summary::SummaryError;
use admission::Admission;
use capacity::Capacity;
use estimates::Means;
pub use hints::{Budget, HintError};
pub(crate) use learned::Learned;
use learned::Summaries;
use lifecycle::{Member, Session, Stage};
use lifetimes::Lifetimes;
use prefix_tree::PrefixTree;
use queue::Queue;
pub use rebuild::{CostError, RebuildCost};
use roster::{Evicted, IdleList};
use shared_prefix::{InFlight, SharedPrefix};
use silences::Silences;
use tier::TierTold;
/// Most lifetimes a saved summary carries: what the working set remembers.
pub(crate) const LIFETIMES_IN_SUMMARY: usize = tuning::LIFETIMES_REMEMBERED;
/// Most points of the per-pair cost's envelope a saved summary carries.
pub(crate) const PAIR_SCALES_IN_SUMMARY: usize = rebuild::PAIR_SCALES;
pub use tuning::Tuning;
use types::Slot;
pub use types::{EngineCapacity, KvTier, TierError, TurnReport, Verdict, WorkingSetStats};

/// The working set of one engine.
#[derive(Debug)]
pub struct WorkingSet<K: Eq + Hash + Clone> {
    tuning: Tuning,
    capacity: Capacity,
    /// Every session known (members, sessions waiting, sessions between
    /// stays whose history is kept), each at its [`Slot`].
    sessions: Slab<Session<K>>,
    /// Hashed with FxHash: the keys come hashed already (the core's
    /// `SessionKey` writes the session table's keyed hash).
    slots: HashMap<K, Slot, rustc_hash::FxBuildHasher>,
    member_count: usize,
    /// The members between turns, by release.
    idle: IdleList,
    /// Members' own tokens (the shared prefix excluded), summed.
    own_sum: u64,
    /// Members' reserves, summed.
    reserve_sum: u64,
    queue: Queue,
    /// Stays begun so far: names each stay ([`Member::joined`]).
    stays: u64,
    /// The sessions that left whose blocks the engine or its host tier
    /// still holds, in the order they left.
    evicted: Evicted<K>,
    shared: SharedPrefix,
    /// The prefixes sessions that pass their prompts' tokens share, at
    /// every depth (module `prefix_tree`).
    prefixes: PrefixTree,
    means: Means,
    lifetimes: Lifetimes,
    /// Sessions that left between turns, for ends presumed while the host
    /// tells none.
    silences: Silences,
    /// Who was parked, whether holding pays, the rotation budget.
    admission: Admission,
    /// Answers refused, and the tier's hits reported.
    told: TierTold,
    /// A saved summary given before the engine answered, and those dropped.
    summaries: Summaries,
}

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// An empty working set; until the engine's capacity is known, everyone fits.
    pub fn new(tuning: Tuning) -> Self {
        Self {
            tuning,
            capacity: Capacity::new(tuning.initial_window_ns),
            sessions: Slab::new(),
            slots: HashMap::default(),
            member_count: 0,
            idle: IdleList::default(),
            own_sum: 0,
            reserve_sum: 0,
            queue: Queue::default(),
            stays: 0,
            evicted: Evicted::default(),
            shared: SharedPrefix::default(),
            prefixes: PrefixTree::default(),
            means: Means::default(),
            lifetimes: Lifetimes::default(),
            silences: Silences::default(),
            admission: Admission::default(),
            told: TierTold::default(),
            summaries: Summaries::default(),
        }
    }

    /// Records the engine's answer to the capacity probe. A new capacity
    /// replaces the estimate; figures reported as 0 keep what was known,
    /// and so does an answer that says nothing of a tier. An answer
    /// [`WorkingSet::check_engine`] refuses changes nothing.
    pub fn set_engine(&mut self, engine: EngineCapacity) -> Result<(), TierError> {
        self.set_engine_answer(engine, false)
    }

    /// As [`WorkingSet::set_engine`], from a host that `says_tier`: one
    /// that speaks of a tier even when it tells none, so that none after
    /// one was told is refused ([`WorkingSet::check_engine`]).
    pub fn set_engine_answer(
        &mut self,
        engine: EngineCapacity,
        says_tier: bool,
    ) -> Result<(), TierError> {
        self.check_engine(&engine, says_tier)
            .inspect_err(|_| self.told.refused += 1)?;
        self.capacity.set_engine(engine);
        self.summaries
            .adopt_pending((&mut self.capacity, &mut self.means, &mut self.lifetimes));
        Ok(())
    }

    /// Whether an engine answer is consistent with what was known: its
    /// tier no smaller than the GPU cache, and, when it `says_tier`
    /// (a host that speaks of tiers, telling none), no tier lost.
    pub fn check_engine(&self, engine: &EngineCapacity, says_tier: bool) -> Result<(), TierError> {
        tier::check_answer(engine, says_tier, &self.capacity)
    }

    /// The engine's host tier, if it told one.
    pub fn tier(&self) -> Option<KvTier> {
        self.capacity.tier()
    }

    /// Records a usage answer (the fraction of KV blocks held by running
    /// requests): it estimates the capacity while the engine has not said
    /// it, and the shared prefix while nothing else shows it.
    pub fn observe_usage(&mut self, usage: f64) {
        if !Capacity::usable(usage) {
            return;
        }
        if !self.capacity.engine_told() {
            let in_flight: u64 = self
                .members()
                .filter(|(_, m)| m.in_flight > 0)
                .map(|(s, m)| self.own(s, m.footprint))
                .sum();
            if in_flight > 0 {
                let held = self.shared.tokens + in_flight;
                self.capacity.sample_usage(usage, held);
            }
        } else if self.shared.blind() {
            let mut f = InFlight {
                turns: 0,
                prompts: 0,
                shortest: u64::MAX,
                longest: 0,
            };
            for (s, m) in self.members() {
                if m.in_flight > 0 {
                    let prompt = self.sessions[s].history.last_prompt;
                    f.turns += 1;
                    f.prompts += prompt;
                    f.shortest = f.shortest.min(prompt);
                    f.longest = f.longest.max(prompt);
                }
            }
            let used = usage * self.capacity.engine_tokens() as f64;
            let block = self.capacity.block_tokens();
            if let Some(shared) = self.shared.sample_usage(used, f, block) {
                self.raise_shared_prefix(shared);
            }
        }
    }

    /// The prefix sessions share is now `shared` tokens: the members, which
    /// counted it as their own, are counted without it.
    fn raise_shared_prefix(&mut self, shared: u64) {
        let mut own_sum = 0;
        for (_, r) in self.sessions.iter_mut() {
            if let Stage::Member(m) = &r.stage {
                r.history.shared_credit = shared;
                own_sum += r.history.own(m.footprint, shared);
            }
        }
        self.own_sum = own_sum;
    }

    /// Capacity in force, tokens (infinite while unknown).
    pub fn capacity(&self) -> f64 {
        self.capacity.tokens()
    }

    /// A member's window, ns: how long the engine takes to refill its
    /// whole cache the way a parked member comes back. By a copy from the
    /// host tier while the rotation fits the tier (module `tier`), by a
    /// prefill otherwise.
    pub fn window_ns(&self) -> u64 {
        match self.capacity.reload_window_ns() {
            Some(reload) if self.rotation_fits_tier() => reload,
            _ => self.capacity.window_ns(),
        }
    }

    /// Whether every session in the rotation (the members, and the
    /// sessions parked between turns that have not ended) fits the host
    /// tier, so that a parked member is still there when it returns.
    fn rotation_fits_tier(&self) -> bool {
        self.capacity
            .tier()
            .is_some_and(|t| self.rotation_tokens() <= t.tokens)
    }

    /// The tokens of the rotation: the shared prefix, the members' own
    /// tokens and those of the sessions parked in the host tier.
    fn rotation_tokens(&self) -> u64 {
        self.shared_tokens() + self.own_sum + self.evicted.parked
    }

    /// `B` refill windows at the prefill rate, whatever the tier: past
    /// it a head may push the rotation out of the tier.
    fn wait_bound_ns(&self) -> u64 {
        (self.capacity.window_ns() as f64 * self.tuning.wait_bound_windows) as u64
    }

    /// Tokens counted now (nothing while the working set is empty).
    pub fn load(&self) -> u64 {
        if self.member_count == 0 {
            return 0;
        }
        self.counted()
    }

    /// The shared prefixes once, the members' own tokens, the ghosts'.
    fn counted(&self) -> u64 {
        self.shared_tokens() + self.own_sum + self.ghost_tokens()
    }

    /// The prefixes counted once for the members: the one learned from
    /// hosts that pass no tokens, and the tree's segments in use.
    fn shared_tokens(&self) -> u64 {
        self.shared.tokens + self.prefixes.counted()
    }

    fn oldest_idle_release(&self) -> Option<u64> {
        let first = self.idle.first?;
        Some(self.sessions[first].member()?.released_at)
    }

    /// The ghosts freed after the oldest member between turns.
    fn ghost_tokens(&self) -> u64 {
        self.oldest_idle_release()
            .map_or(0, |oldest| self.evicted.own_freed_after(oldest))
    }

    /// The own tokens out of `footprint` of the session at `s`.
    fn own(&self, s: Slot, footprint: u64) -> u64 {
        self.sessions[s].history.own(footprint, self.shared.tokens)
    }

    /// What a turn of the session at `s` with a `prompt`-token prompt keeps
    /// cached: the prompt and its expected output, whole blocks.
    fn footprint(&self, s: Slot, prompt: u64) -> u64 {
        let output = self.means.output_of(&self.sessions[s].history);
        self.capacity.blocks(prompt.saturating_add(output))
    }

    /// Every member, with its slot (in no particular order).
    fn members(&self) -> impl Iterator<Item = (Slot, &Member)> {
        self.sessions
            .iter()
            .filter_map(|(s, r)| Some((s, r.member()?)))
    }

    /// The slot of `key`'s record, made empty if the session is new.
    fn slot_or_insert(&mut self, key: &K) -> Slot {
        if let Some(&s) = self.slots.get(key) {
            return s;
        }
        let s = self.sessions.insert(Session::new(key.clone()));
        self.slots.insert(key.clone(), s);
        s
    }

    /// Lets in the queue heads that may enter at `now`, in order: each joins
    /// the working set and keeps its grant until its attempt collects it
    /// with [`WorkingSet::request`]. Returns them, with why.
    pub fn admit_waiting(&mut self, now: u64, out: &mut Vec<(K, Verdict)>) {
        self.expire(now);
        self.admit_queue_heads(now, out);
    }

    /// Where `key` waits: its sequence number in the queue (first come,
    /// first served).
    pub fn queue_position(&self, key: &K) -> Option<u64> {
        Some(self.sessions[*self.slots.get(key)?].waiting()?.at)
    }

    /// Whether `key` is waiting in the queue.
    pub fn is_waiting(&self, key: &K) -> bool {
        self.queue_position(key).is_some()
    }

    /// Whether `key` is in the working set (its stays are numbered from 1).
    pub fn is_member(&self, key: &K) -> bool {
        self.membership(key) > 0
    }

    /// Whether `key`'s turn waiting in the queue finds its prefix gone from
    /// this engine as the working set counts it (module `resume`): not for
    /// a member or a session parked in the host tier; `None` for a session
    /// neither waiting nor a member.
    pub fn waiting_cache_gone(&self, key: &K) -> Option<bool> {
        resume::cache_gone(&self.sessions[*self.slots.get(key)?])
    }

    /// Whether holding sessions out pays, as last decided for a queue head.
    pub fn holding_pays(&self) -> bool {
        !self.admission.running_cold
    }

    /// The engine's longest sequence, tokens, if the host told it.
    pub fn max_model_len(&self) -> Option<u64> {
        self.capacity.max_model_len()
    }

    /// Tells `key`'s budget, before or at its first turn (a record is made
    /// for a session not yet seen, forgotten with it). A later budget
    /// replaces it. A refused one changes nothing.
    pub fn set_budget(&mut self, key: &K, budget: Budget) -> Result<(), HintError> {
        self.check_budget(&budget)?;
        let s = self.slot_or_insert(key);
        self.sessions[s].history.budget = budget;
        Ok(())
    }

    /// Whether `budget` may be stored: no figure 0, its tokens within the
    /// engine's `max_model_len` where that is known.
    pub fn check_budget(&self, budget: &Budget) -> Result<(), HintError> {
        budget.check(self.max_model_len())
    }

    /// `key`'s budget as told (`None`: the session is not known).
    pub fn budget(&self, key: &K) -> Option<Budget> {
        let &s = self.slots.get(key)?;
        Some(self.sessions[s].history.budget())
    }

    /// What this working set learned, with its engine's identity.
    pub(crate) fn learned(&self) -> Learned {
        Learned::of(&self.capacity, &self.means, &self.lifetimes)
    }

    /// Adopts a summary's figures, replacing what was learned ([`Summaries::adopt`]).
    pub(crate) fn adopt(&mut self, learned: Learned) -> Result<(), SummaryError> {
        self.summaries.adopt(
            learned,
            (&mut self.capacity, &mut self.means, &mut self.lifetimes),
        )
    }

    /// Whether a summary waits for the engine's first answer.
    pub fn summary_pending(&self) -> bool {
        self.summaries.pending.is_some()
    }

    /// Figures for monitoring.
    pub fn stats(&self) -> WorkingSetStats {
        WorkingSetStats {
            members: self.member_count,
            waiting: self.queue.len(),
            load_tokens: self.load(),
            capacity_tokens: self.capacity.known().map_or(0, |c| c as u64),
            shared_prefix_tokens: self.shared_tokens(),
            window_ns: self.window_ns(),
            rebuild_secs_per_token: self.capacity.secs_per_token(),
            rebuild_secs_per_pair: self.capacity.secs_per_pair(),
            parked: self.admission.parked,
            holding: !self.admission.running_cold,
            horizon_turns: self.means.turns_in(self.window_ns()),
            tier_tokens: self.capacity.tier().map_or(0, |t| t.tokens),
            refused_answers: self.told.refused,
            tier_cached_tokens: self.told.tier_cached,
            tier_parked_tokens: self.evicted.parked,
            summaries_dropped: self.summaries.dropped,
        }
    }
}

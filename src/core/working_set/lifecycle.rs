//! A session's record in the working set: where it stands ([`Stage`]),
//! whether it is in a tool call ([`ToolGap`]), and what was learned of it
//! ([`History`]).
//!
//! Stage table (every transition is made by the function named, and
//! nowhere else):
//!
//! | from       | event                                          | to                         | function |
//! |------------|------------------------------------------------|----------------------------|----------|
//! | `Away`, `Parked` | its turn asks                            | `Waiting{parked}` (whether from `Parked`) | `WorkingSet::enqueue` |
//! | `Waiting`  | admitted (at its request, or handed over while it sleeps) | `Member{in_flight: 1}` | `WorkingSet::join` |
//! | `Waiting{parked}` | its attempt is withdrawn                | `Parked` if `parked`, else `Away` | `WorkingSet::withdraw` |
//! | `Member`   | its turn asks (a grant handed over is collected) | `Member{in_flight + 1}` | `WorkingSet::member_request` |
//! | `Member`   | its turn ends                                  | `Member{in_flight - 1}`    | `WorkingSet::member_release` |
//! | `Member`   | parked, window over, or its tool calls outlast the window | `Parked` with a host tier told, else `Away` | `WorkingSet::leave` |
//! | `Member` with an uncollected grant | its attempt is withdrawn | `Away` (it never ran)  | `WorkingSet::withdraw` |
//! | `Member`, `Away`, `Parked` | finished or forgotten          | record dropped             | `WorkingSet::end` |
//! | `Waiting`  | finished or forgotten                          | `Waiting`, history cleared (its attempt keeps its place, as a new session's) | `WorkingSet::end` |
//! | `Waiting{parked: true}` | admitted                          | `Member`, out of the tier's list | `WorkingSet::out_of_tier` |
//! | `Parked`, `Waiting{parked: true}` | the tier outgrows it, least recently used first | `Away`, `Waiting{parked: false}`: a newcomer | `WorkingSet::trim_tier` |
//! | `Parked`, `Waiting{parked: true}` | finished, forgotten or presumed ended | `Away`, `Waiting{parked: false}`; its blocks an ended session's until evicted | `WorkingSet::out_of_tier` |
//!
//! Tool gap: `Closed` until a turn ends, `Open` from then until the
//! session asks again, `Quiet` once it has been silent long enough to be
//! presumed ended (module `silences`); asking again closes it (taking a
//! presumed end back).

use std::hash::Hash;

use super::prefix_tree::NodeId;
use super::roster::InTier;
use super::types::{Slot, Verdict};
use super::WorkingSet;
use crate::core::prompt::PromptSketch;

/// Why a member leaves the working set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leaving {
    /// Parked, or its window ended: it may come back.
    BetweenTurns,
    /// Finished, or forgotten by the core.
    Ended,
}

/// A session known to the working set.
#[derive(Debug)]
pub(super) struct Session<K> {
    pub(super) key: K,
    pub(super) stage: Stage,
    pub(super) gap: ToolGap,
    pub(super) history: History,
}

/// Where a session stands.
#[derive(Debug, Clone)]
pub(super) enum Stage {
    /// Neither waiting nor a member: new, or out of the working set since
    /// it was parked or its window ended.
    Away,
    /// As `Away`, its blocks parked in the host tier (listed in its eviction
    /// order, module `roster`): it comes back by a copy.
    Parked,
    /// In the queue.
    Waiting(Waiting),
    /// In the working set.
    Member(Member),
}

/// A session's place in the queue.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    /// Its place in the queue.
    pub(super) at: u64,
    /// When it queued: the wait bound counts from then.
    pub(super) since: u64,
    /// The prompt of the turn that waits, tokens.
    pub(super) prompt: u64,
    /// It reached the wait bound at the head and could not be given room
    /// (members in flight are never cut short): only a release can let it
    /// in now, so the bound is no longer a deadline.
    pub(super) past_bound: bool,
    /// It waits with its blocks parked in the host tier.
    pub(super) parked: bool,
}

/// A member of the working set.
#[derive(Debug, Clone)]
pub(super) struct Member {
    /// KV tokens it keeps cached, own and shared.
    pub(super) footprint: u64,
    /// Its turns in flight (more than one only for overlapping retries).
    pub(super) in_flight: u32,
    /// When its last turn ended: its blocks entered the engine's free
    /// queue then, and its window began.
    pub(super) released_at: u64,
    /// Which stay this is (unique per join): orders equal release times,
    /// and names the stay a lease belongs to.
    pub(super) joined: u64,
    /// What its next turn will add, kept free for it before anyone joins.
    pub(super) reserve: u64,
    /// A grant made while its attempt slept, not yet collected.
    pub(super) grant: Option<Verdict>,
    /// Its turn in flight was let in while the working set was not holding
    /// anyone out: it may run cold by choice, so its time says nothing of
    /// a hot turn's.
    pub(super) cold: bool,
    /// Its neighbours among the members between turns.
    pub(super) idle: Links,
}

impl Member {
    /// Its place among the members between turns: by release, then by
    /// joining (unique per stay, so no two members tie).
    pub(super) fn idle_order(&self) -> (u64, u64) {
        (self.released_at, self.joined)
    }
}

/// A member's neighbours among the members between turns (the roster's
/// `IdleList`), by slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Links {
    pub(super) prev: Option<Slot>,
    pub(super) next: Option<Slot>,
}

/// Whether the session is in a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ToolGap {
    /// No turn has ended since it last asked (or it never asked).
    Closed,
    /// Its last turn ended at `since` and it has not asked since.
    Open { since: u64 },
    /// As `Open`, and silent for so long that it is presumed ended: its
    /// turn count is among the lifetimes until it asks again.
    Quiet { since: u64 },
}

impl ToolGap {
    /// When the open gap began, if one is open.
    pub(super) fn since(self) -> Option<u64> {
        match self {
            ToolGap::Closed => None,
            ToolGap::Open { since } | ToolGap::Quiet { since } => Some(since),
        }
    }
}

/// What the working set learned of one session.
#[derive(Debug, Clone, Default)]
pub(super) struct History {
    pub(super) turns: u32,
    pub(super) last_prompt: u64,
    pub(super) last_output: u64,
    /// What its turns add to the prompt beyond its own output (the tool
    /// results), tokens: its own running mean, 0 until its second turn.
    pub(super) growth: f64,
    /// The part of its footprint shared with other sessions (counted once
    /// for all of them): what its first turn hit, or until that is
    /// reported, what first turns have hit so far.
    pub(super) shared_credit: u64,
    /// It hangs in the prefix tree (module `prefix_tree`): its first
    /// prompt came with a sketch, and `shared_credit` is its node's depth.
    pub(super) in_tree: bool,
    /// The node it hangs from (`None`: it shares nothing known).
    pub(super) prefix: Option<NodeId>,
    /// The sketch of its last prompt, for newcomers to be matched with.
    pub(super) sketch: Option<PromptSketch>,
    /// Its recent tool gaps.
    pub(super) gaps: Gaps,
    /// What the host told of how far it runs (module `hints`).
    pub(super) budget: super::hints::Budget,
}

impl History {
    /// A session's own tokens out of `footprint`: the shared prefix it
    /// showed (at most the `shared_prefix` counted once for all) is not
    /// its own.
    pub(super) fn own(&self, footprint: u64, shared_prefix: u64) -> u64 {
        let cap = if self.in_tree {
            u64::MAX
        } else {
            shared_prefix
        };
        footprint.saturating_sub(self.shared_credit.min(cap))
    }
}

/// A session's last [`GAP_SAMPLES`] tool gaps, ns: a ring in an inline
/// array (no allocation per session).
#[derive(Debug, Clone, Default)]
pub(super) struct Gaps {
    recent: [u64; GAP_SAMPLES],
    len: usize,
    next: usize,
}

use super::tuning::GAP_SAMPLES;

impl Gaps {
    /// Remembers `gap`, forgetting the oldest once [`GAP_SAMPLES`] are kept.
    pub(super) fn push(&mut self, gap: u64) {
        self.recent[self.next] = gap;
        self.next = (self.next + 1) % GAP_SAMPLES;
        self.len = (self.len + 1).min(GAP_SAMPLES);
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// How many of the gaps are at most `limit`.
    pub(super) fn at_most(&self, limit: u64) -> usize {
        self.recent[..self.len]
            .iter()
            .filter(|gap| **gap <= limit)
            .count()
    }
}

impl<K> Session<K> {
    pub(super) fn new(key: K) -> Self {
        Self {
            key,
            stage: Stage::Away,
            gap: ToolGap::Closed,
            history: History::default(),
        }
    }

    /// Whether its blocks are parked in the host tier.
    pub(super) fn parked_in_tier(&self) -> bool {
        matches!(
            self.stage,
            Stage::Parked | Stage::Waiting(Waiting { parked: true, .. })
        )
    }

    /// Its blocks are no longer parked in the host tier; returns whether
    /// they were.
    pub(super) fn leave_tier(&mut self) -> bool {
        match &mut self.stage {
            Stage::Parked => self.stage = Stage::Away,
            Stage::Waiting(w) if w.parked => w.parked = false,
            _ => return false,
        }
        true
    }

    pub(super) fn member(&self) -> Option<&Member> {
        match &self.stage {
            Stage::Member(m) => Some(m),
            _ => None,
        }
    }

    pub(super) fn member_mut(&mut self) -> Option<&mut Member> {
        match &mut self.stage {
            Stage::Member(m) => Some(m),
            _ => None,
        }
    }

    pub(super) fn waiting(&self) -> Option<&Waiting> {
        match &self.stage {
            Stage::Waiting(w) => Some(w),
            _ => None,
        }
    }
}

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// The session at `s`, waiting, joins the working set with its turn in
    /// flight (`Waiting` → `Member`).
    pub(super) fn join(&mut self, s: Slot, now: u64) {
        let Stage::Waiting(w) = self.sessions[s].stage else {
            unreachable!("only a waiting session joins");
        };
        self.queue.remove(w.at);
        // Its own ghost no longer counts: those blocks are its own again.
        self.evicted.forget(&self.sessions[s].key);
        self.out_of_tier(s, InTier::No);
        let footprint = self.footprint(s, w.prompt);
        let reserve = self.means.next_turn_growth(&self.sessions[s].history);
        self.own_sum += self.own(s, footprint);
        self.prefixes.member_joined(self.sessions[s].history.prefix);
        self.reserve_sum += reserve;
        self.trim_tier();
        self.stays += 1;
        self.sessions[s].stage = Stage::Member(Member {
            footprint,
            in_flight: 1,
            released_at: now,
            joined: self.stays,
            reserve,
            grant: None,
            cold: self.admission.running_cold,
            idle: Links::default(),
        });
        self.member_count += 1;
        self.sessions[s].history.last_prompt = w.prompt;
    }

    /// The session at `s` leaves the working set, if it is a member
    /// (`Member` → `Away`): its blocks stay counted as a ghost while they
    /// outlive members' blocks. One that leaves between turns (not ended)
    /// is listed for a presumed end.
    pub(super) fn leave(&mut self, s: Slot, now: u64, why: Leaving) {
        if let Some((m, own)) = self.take_member(s) {
            let released = if m.in_flight > 0 { now } else { m.released_at };
            let key = self.sessions[s].key.clone();
            // With a tier it is parked there; an ended session's blocks
            // stay there until they are the least recently used.
            let (tier, stage) = match (self.capacity.tier(), why) {
                (None, _) => (InTier::No, Stage::Away),
                (Some(_), Leaving::BetweenTurns) => (InTier::Parked(s), Stage::Parked),
                (Some(_), Leaving::Ended) => (InTier::Ended, Stage::Away),
            };
            self.evicted.leave(key, released, own, tier);
            self.sessions[s].stage = stage;
            if tier != InTier::No {
                self.trim_tier();
            }
        }
        if let (Leaving::BetweenTurns, Some(since)) = (why, self.sessions[s].gap.since()) {
            self.silences.left(s, since);
        }
        self.evicted.drop_freed_by(self.oldest_idle_release());
    }

    /// Takes the session at `s` out of the working set, if it is a member
    /// (`Member` → `Away`): unlisted, uncounted. Returns the member and its
    /// own tokens.
    fn take_member(&mut self, s: Slot) -> Option<(Member, u64)> {
        let m = self.sessions[s].member()?.clone();
        self.idle.remove(&mut self.sessions, s);
        self.member_count -= 1;
        let own = self.own(s, m.footprint);
        self.own_sum -= own;
        self.prefixes.member_left(self.sessions[s].history.prefix);
        self.reserve_sum -= m.reserve;
        self.sessions[s].stage = Stage::Away;
        Some((m, own))
    }

    /// The attempt of `key` is gone (timed out, cancelled, its gate closed):
    /// it leaves the queue, and a grant it never collected is undone.
    pub fn withdraw(&mut self, key: &K) {
        let Some(&s) = self.slots.get(key) else {
            return;
        };
        match &mut self.sessions[s].stage {
            Stage::Waiting(w) => {
                let (at, parked) = (w.at, w.parked);
                self.queue.remove(at);
                self.sessions[s].stage = if parked { Stage::Parked } else { Stage::Away };
            }
            Stage::Member(m) if m.grant.is_some() => {
                // It never ran: nothing of it is cached beyond what was
                // before, so it leaves no ghost.
                self.take_member(s);
                self.evicted.drop_freed_by(self.oldest_idle_release());
            }
            _ => {}
        }
    }

    /// Forgets what was learned of an idle session the host no longer
    /// tracks (the core retires its record): bounds memory.
    pub fn forget(&mut self, key: &K, now: u64) {
        self.end(key, now);
    }

    /// The session ended: it leaves the working set and the queue; its
    /// blocks stay counted as a ghost while they outlive members' blocks.
    /// An attempt of it still waiting keeps its place, as a new session's.
    pub fn finish(&mut self, key: &K, now: u64) {
        self.silences.told();
        self.end(key, now);
    }

    /// The session at `key` ended, told or forgotten.
    pub(super) fn end(&mut self, key: &K, now: u64) {
        let Some(&s) = self.slots.get(key) else {
            self.evicted.drop_freed_by(self.oldest_idle_release());
            return;
        };
        if !matches!(self.sessions[s].gap, ToolGap::Quiet { .. }) {
            self.lifetimes.record(self.sessions[s].history.turns);
        }
        self.leave(s, now, Leaving::Ended);
        self.out_of_tier(s, InTier::Ended);
        self.unhang(s);
        let r = &mut self.sessions[s];
        if let Stage::Waiting(_) = r.stage {
            r.history = Default::default();
            r.gap = ToolGap::Closed;
        } else {
            self.sessions.remove(s);
            self.slots.remove(key);
        }
    }

    /// The session at `s`, not a member, no longer hangs in the prefix
    /// tree: its record is dropped or begins again.
    pub(super) fn unhang(&mut self, s: Slot) {
        let h = &mut self.sessions[s].history;
        if h.in_tree {
            self.prefixes.unhang(h.prefix.take());
            h.in_tree = false;
            h.shared_credit = 0;
        }
    }

    /// The session at `s` is no longer parked in the host tier, if it was:
    /// it rejoined (`to`: `No`), or ended, its blocks staying there, where
    /// they were, as an ended session's (`to`: `Ended`).
    pub(super) fn out_of_tier(&mut self, s: Slot, to: InTier) {
        if self.sessions[s].leave_tier() {
            self.evicted.unpark(s, to);
        }
    }

    /// Drops the oldest of what the host tier holds beyond the members
    /// while it all outgrows the tier, as the tier evicts it: the blocks of
    /// sessions that ended, and sessions parked, which then come back by a
    /// recomputation, as a newcomer does.
    pub(super) fn trim_tier(&mut self) {
        let Some(tier) = self.capacity.tier() else {
            return;
        };
        while self.rotation_tokens() + self.evicted.ended > tier.tokens {
            match self.evicted.evict_oldest() {
                Some(Some(s)) => _ = self.sessions[s].leave_tier(),
                Some(None) => {}
                None => return,
            }
        }
    }
}

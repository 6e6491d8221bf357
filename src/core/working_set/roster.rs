//! The members between turns in the order the engine will evict their
//! blocks ([`IdleList`]), and the sessions that left whose blocks the
//! engine or its host tier still holds, in one list in the order they left,
//! each saying where ([`Evicted`]).
//!
//! vLLM frees a finished request's blocks to the tail of its free queue
//! and allocates from the head: the least recently freed blocks are
//! evicted first. So the member released longest ago is the one the cache
//! loses next, the one to park next, and (every window being the same
//! length from its release) the one whose window ends next.

use std::collections::VecDeque;

use slab::Slab;

use super::lifecycle::{Links, Session};
use super::types::Slot;

/// The members between turns, by release, as a list threaded through
/// their records: a member leaves it from wherever it is at once, and
/// enters at the back (releases come in time order; the walk back that
/// places it moves only past an equal time or a release whose clock was
/// read before another's took the lock).
#[derive(Debug, Default)]
pub(super) struct IdleList {
    pub(super) first: Option<Slot>,
    pub(super) last: Option<Slot>,
    pub(super) len: usize,
}

fn links<K>(sessions: &mut Slab<Session<K>>, s: Slot) -> &mut Links {
    &mut sessions[s].member_mut().expect("a listed member").idle
}

impl IdleList {
    /// Links in the member at `s` by its release, if it is between turns.
    pub(super) fn insert<K>(&mut self, sessions: &mut Slab<Session<K>>, s: Slot) {
        let m = sessions[s].member().expect("a member");
        if m.in_flight > 0 {
            return;
        }
        let order = m.idle_order();
        let mut prev = self.last;
        while let Some(p) = prev {
            let before = sessions[p].member().expect("a listed member");
            if before.idle_order() < order {
                break;
            }
            prev = before.idle.prev;
        }
        let next = match prev {
            Some(p) => links(sessions, p).next,
            None => self.first,
        };
        *links(sessions, s) = Links { prev, next };
        match prev {
            Some(p) => links(sessions, p).next = Some(s),
            None => self.first = Some(s),
        }
        match next {
            Some(n) => links(sessions, n).prev = Some(s),
            None => self.last = Some(s),
        }
        self.len += 1;
    }

    /// Unlinks the member at `s`, if it is between turns (one in flight is
    /// not listed).
    pub(super) fn remove<K>(&mut self, sessions: &mut Slab<Session<K>>, s: Slot) {
        let m = sessions[s].member_mut().expect("a member");
        if m.in_flight > 0 {
            return;
        }
        let Links { prev, next } = std::mem::take(&mut m.idle);
        match prev {
            Some(p) => links(sessions, p).next = next,
            None => self.first = next,
        }
        match next {
            Some(n) => links(sessions, n).prev = prev,
            None => self.last = prev,
        }
        self.len -= 1;
    }

    /// The members between turns, least recently released first.
    pub(super) fn iter<'a, K>(
        &self,
        sessions: &'a Slab<Session<K>>,
    ) -> impl Iterator<Item = Slot> + 'a {
        std::iter::successors(self.first, move |&s| {
            sessions[s].member().expect("a listed member").idle.next
        })
    }
}

/// Where a host tier holds what a session that left kept cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InTier {
    /// Nowhere (no tier told, the session rejoined, or the tier evicted it).
    No,
    /// Parked there, the session at this slot: it may return by a copy.
    Parked(Slot),
    /// The blocks of a session that ended, until the tier evicts them.
    Ended,
}

/// One session that left: its own tokens, when they were freed while they
/// count as a ghost, and where the tier holds them.
#[derive(Debug)]
struct Left<K> {
    key: K,
    own: u64,
    ghost: Option<u64>,
    tier: InTier,
}

/// The sessions that left the working set (parked, window over, finished)
/// whose blocks are still held, in the order they left, each saying where:
/// as a **ghost** in the engine's free queue, and in the host tier.
///
/// A ghost freed after the oldest member between turns still holds cache
/// that the engine would otherwise take from that member, so it counts
/// against the capacity until then; older ones are dropped as they stop
/// counting. The tier evicts least recently used first, in this order: the
/// sessions parked there, which may return, and the blocks of sessions
/// that ended. An entry goes once neither holds it.
#[derive(Debug)]
pub(super) struct Evicted<K> {
    left: VecDeque<Left<K>>,
    /// The ghosts' own tokens, summed.
    ghost_sum: u64,
    /// Own tokens of the sessions parked in the tier (that may return).
    pub(super) parked: u64,
    /// How many sessions are parked there (one may have no own tokens:
    /// its history all shared).
    pub(super) parked_sessions: usize,
    /// Own tokens in the tier of the sessions that ended.
    pub(super) ended: u64,
}

impl<K> Default for Evicted<K> {
    fn default() -> Self {
        let (ghost_sum, parked, parked_sessions, ended) = (0, 0, 0, 0);
        let left = VecDeque::new();
        Self {
            left,
            ghost_sum,
            parked,
            parked_sessions,
            ended,
        }
    }
}

impl<K: PartialEq> Evicted<K> {
    /// `key` left with `own` tokens of its own, freed at `released`, held
    /// by the tier as `tier`: listed as the newest.
    pub(super) fn leave(&mut self, key: K, released: u64, own: u64, tier: InTier) {
        self.ghost_sum += own;
        self.count(own, tier, true);
        let ghost = Some(released);
        self.left.push_back(Left {
            key,
            own,
            ghost,
            tier,
        });
    }

    /// Counts (`add`) or uncounts `own` tokens the tier holds as `tier`.
    fn count(&mut self, own: u64, tier: InTier, add: bool) {
        let (parked, n) = (&mut self.parked, &mut self.parked_sessions);
        match (tier, add) {
            (InTier::Parked(_), true) => (*parked, *n) = (*parked + own, *n + 1),
            (InTier::Parked(_), false) => (*parked, *n) = (*parked - own, *n - 1),
            (InTier::Ended, true) => self.ended += own,
            (InTier::Ended, false) => self.ended -= own,
            (InTier::No, _) => {}
        }
    }

    /// The own tokens of the ghosts freed after `oldest`.
    pub(super) fn own_freed_after(&self, oldest: u64) -> u64 {
        let after = self
            .left
            .iter()
            .filter(|l| l.ghost.is_some_and(|r| r > oldest));
        after.map(|l| l.own).sum()
    }

    /// Drops the ghosts freed at or before `oldest` (all of them when no
    /// member is between turns: none protects anything any more).
    pub(super) fn drop_freed_by(&mut self, oldest: Option<u64>) {
        self.drop_ghosts(|l| l.ghost.is_some_and(|r| oldest.is_none_or(|o| r <= o)));
    }

    /// Drops `key`'s ghosts: its blocks are its own again.
    pub(super) fn forget(&mut self, key: &K) {
        self.drop_ghosts(|l| l.ghost.is_some() && l.key == *key);
    }

    fn drop_ghosts(&mut self, dropped: impl Fn(&Left<K>) -> bool) {
        let sum = &mut self.ghost_sum;
        self.left.retain_mut(|l| {
            if dropped(l) {
                (l.ghost, *sum) = (None, *sum - l.own);
            }
            l.ghost.is_some() || l.tier != InTier::No
        });
    }

    /// The session at `s`, parked in the tier, rejoined (`to`: `No`) or
    /// ended, its blocks staying there (`to`: `Ended`).
    pub(super) fn unpark(&mut self, s: Slot, to: InTier) {
        let at = self.left.iter().position(|l| l.tier == InTier::Parked(s));
        self.move_in_tier(at.expect("a session parked in the tier is listed"), to);
    }

    /// The tier evicts the oldest of what it holds: returns the slot of the
    /// session parked there, if it was one (`None`: the tier holds nothing).
    pub(super) fn evict_oldest(&mut self) -> Option<Option<Slot>> {
        let at = self.left.iter().position(|l| l.tier != InTier::No)?;
        Some(match self.move_in_tier(at, InTier::No) {
            InTier::Parked(s) => Some(s),
            _ => None,
        })
    }

    /// The entry at `at` is held by the tier as `to` now; returns how it was.
    fn move_in_tier(&mut self, at: usize, to: InTier) -> InTier {
        let (own, from) = (self.left[at].own, self.left[at].tier);
        self.count(own, from, false);
        self.count(own, to, true);
        self.left[at].tier = to;
        if to == InTier::No && self.left[at].ghost.is_none() {
            self.left.remove(at);
        }
        from
    }

    /// Every entry held somewhere, and in the tier only if one was `told`;
    /// no ghost a member's; every session listed in the tier `parked`
    /// there; the sums and the count right.
    pub(super) fn audit(
        &self,
        told: bool,
        is_member: impl Fn(&K) -> bool,
        parked: impl Fn(Slot) -> bool,
    ) -> Result<(), String> {
        let mut sums = (0, 0, 0, 0);
        for l in &self.left {
            let wrong = match l.tier {
                InTier::No if l.ghost.is_none() => Some("held nowhere"),
                InTier::Parked(_) | InTier::Ended if !told => Some("in a tier never told"),
                InTier::Parked(s) if !parked(s) => Some("listed in the tier, not parked"),
                _ if l.ghost.is_some() && is_member(&l.key) => Some("a member's ghost"),
                _ => None,
            };
            if let Some(wrong) = wrong {
                return Err(format!("a session that left is {wrong}"));
            }
            sums.0 += l.ghost.map_or(0, |_| l.own);
            match l.tier {
                InTier::Parked(_) => (sums.1, sums.2) = (sums.1 + l.own, sums.2 + 1),
                InTier::Ended => sums.3 += l.own,
                InTier::No => {}
            }
        }
        let counted = (self.ghost_sum, self.parked, self.parked_sessions);
        if sums != (counted.0, counted.1, counted.2, self.ended) {
            return Err(format!(
                "those that left add up to {sums:?}, not {counted:?}"
            ));
        }
        Ok(())
    }
}

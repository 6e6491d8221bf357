//! The members between turns in the order the engine will evict their
//! blocks ([`IdleList`]), the sessions that left whose blocks it still
//! holds ([`Ghosts`]), and what a host tier holds beyond the members in
//! the order it evicts it ([`TierParked`]).
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

/// Sessions that left the working set (parked, window over, finished),
/// whose blocks the engine may still hold: each with when its blocks were
/// freed and its own tokens, in order of release. A ghost freed after the
/// oldest member between turns still holds cache that the engine would
/// otherwise take from that member, so it counts against the capacity
/// until then; older ones are dropped as they stop counting.
#[derive(Debug)]
pub(super) struct Ghosts<K> {
    /// (released at, own tokens, session), oldest first.
    by_release: VecDeque<(u64, u64, K)>,
    /// Their own tokens, summed.
    own_sum: u64,
}

impl<K> Default for Ghosts<K> {
    fn default() -> Self {
        Self {
            by_release: VecDeque::new(),
            own_sum: 0,
        }
    }
}

impl<K: PartialEq> Ghosts<K> {
    /// A ghost of `key` whose blocks were freed at `released`, after any
    /// freed at the same time.
    pub(super) fn insert(&mut self, released: u64, own: u64, key: K) {
        let at = self.by_release.partition_point(|(r, _, _)| *r <= released);
        self.by_release.insert(at, (released, own, key));
        self.own_sum += own;
    }

    /// The own tokens of the ghosts freed after `oldest`.
    pub(super) fn own_freed_after(&self, oldest: u64) -> u64 {
        match self.by_release.front() {
            None => 0,
            Some((first, _, _)) if *first > oldest => self.own_sum,
            Some(_) => {
                let at = self.by_release.partition_point(|(r, _, _)| *r <= oldest);
                self.by_release.range(at..).map(|(_, own, _)| *own).sum()
            }
        }
    }

    /// Drops the ghosts freed at or before `oldest` (all of them when no
    /// member is between turns: none protects anything any more).
    pub(super) fn drop_freed_by(&mut self, oldest: Option<u64>) {
        let Some(oldest) = oldest else {
            self.by_release.clear();
            self.own_sum = 0;
            return;
        };
        while let Some(&(released, own, _)) = self.by_release.front() {
            if released > oldest {
                break;
            }
            self.by_release.pop_front();
            self.own_sum -= own;
        }
    }

    /// Drops `key`'s ghost: its blocks are its own again.
    pub(super) fn forget(&mut self, key: &K) {
        let own_sum = &mut self.own_sum;
        self.by_release.retain(|(_, own, k)| {
            let keep = k != key;
            if !keep {
                *own_sum -= own;
            }
            keep
        });
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_release.iter().map(|(_, _, k)| k)
    }

    /// In order of release, and the sum right.
    pub(super) fn audit(&self) -> Result<(), String> {
        let in_order = self
            .by_release
            .iter()
            .zip(self.by_release.iter().skip(1))
            .all(|(a, b)| a.0 <= b.0);
        if !in_order {
            return Err("ghosts out of release order".into());
        }
        let sum: u64 = self.by_release.iter().map(|(_, own, _)| *own).sum();
        if sum != self.own_sum {
            return Err(format!(
                "ghosts' own_sum {} but they add up to {sum}",
                self.own_sum
            ));
        }
        Ok(())
    }
}

/// A session's place among those parked in the host tier: its number in
/// the order of parks, which orders the tier's list.
pub(super) type TierPlace = u64;

/// What the host tier holds beyond the members, in the order it evicts
/// it (least recently used first; a session's blocks were last used at
/// its last turn): the sessions that left the working set between turns,
/// and the blocks of the sessions that ended.
#[derive(Debug, Default)]
pub(super) struct TierParked {
    /// Oldest first, in order of place: the session (`None` for one that
    /// ended), its place's number, its own tokens.
    pub(super) order: VecDeque<(Option<Slot>, u64, u64)>,
    /// Own tokens of the sessions parked (that may return).
    pub(super) parked: u64,
    /// How many sessions are parked (one may have no own tokens: its
    /// history all shared).
    pub(super) parked_sessions: usize,
    /// Own tokens of the sessions that ended, until evicted.
    pub(super) ended: u64,
    next_seq: u64,
}

impl TierParked {
    /// Lists what the session at `s` (`None`: one that ended) left in the
    /// tier, `own` tokens, as the newest.
    pub(super) fn park(&mut self, s: Option<Slot>, own: u64) -> TierPlace {
        let place = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((s, place, own));
        match s {
            Some(_) => {
                (self.parked, self.parked_sessions) = (self.parked + own, self.parked_sessions + 1)
            }
            None => self.ended += own,
        }
        place
    }

    /// The session parked at `place` is no longer (it rejoined), or its
    /// blocks stay as an ended session's (`ended`).
    pub(super) fn unpark(&mut self, place: TierPlace, ended: bool) {
        let at = self.order.binary_search_by_key(&place, |e| e.1);
        let at = at.expect("a session parked in the tier is listed");
        let own = self.order[at].2;
        self.parked -= own;
        self.parked_sessions -= 1;
        if ended {
            self.order[at].0 = None;
            self.ended += own;
        } else {
            self.order.remove(at);
        }
    }

    /// Drops the oldest entry, as the tier evicts it: returns it, its
    /// session's slot if one was parked there.
    pub(super) fn evict_oldest(&mut self) -> Option<Option<Slot>> {
        let (s, _, own) = self.order.pop_front()?;
        match s {
            Some(_) => {
                (self.parked, self.parked_sessions) = (self.parked - own, self.parked_sessions - 1)
            }
            None => self.ended -= own,
        }
        Some(s)
    }
}

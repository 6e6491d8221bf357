//! The members between turns in the order the engine will evict their
//! blocks ([`IdleList`]), and the sessions that left whose blocks it still
//! holds ([`Ghosts`]).
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

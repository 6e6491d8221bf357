//! Continuum-style TTL pins: after a turn, the engine keeps the session's
//! blocks referenced (out of the free queue) for a TTL, so the tool-result
//! turn finds them resident. A pin ends at its expiry, when the session's
//! next turn is scheduled (its hits then hold the blocks), or under memory
//! pressure, oldest pin first. This is the `ttl-pin` policy's engine half;
//! stock vLLM has no pins.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::block_pool::BlockId;

/// Identifies one pin, so a stale expiry event finds nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PinTicket {
    /// When the pin was taken.
    pub pinned_at: u64,
    /// Tie-breaker and identity.
    pub seq: u64,
}

#[derive(Debug)]
struct Pin {
    blocks: Vec<BlockId>,
    ticket: PinTicket,
}

/// The pins of one replica, by session.
#[derive(Debug, Default)]
pub struct Pins {
    by_session: FxHashMap<usize, Pin>,
    oldest_first: BTreeMap<PinTicket, usize>,
    next_seq: u64,
}

impl Pins {
    /// Pins `blocks` (references already held) for `session` at `now`.
    /// A session holds at most one pin: an older one is returned to be freed.
    pub fn pin(
        &mut self,
        session: usize,
        blocks: Vec<BlockId>,
        now: u64,
    ) -> (PinTicket, Option<Vec<BlockId>>) {
        self.next_seq += 1;
        let ticket = PinTicket {
            pinned_at: now,
            seq: self.next_seq,
        };
        let older = self.unpin(session);
        self.by_session.insert(session, Pin { blocks, ticket });
        self.oldest_first.insert(ticket, session);
        (ticket, older)
    }

    /// Whether `session` holds a pin.
    pub fn holds(&self, session: usize) -> bool {
        self.by_session.contains_key(&session)
    }

    /// Ends `session`'s pin, returning its blocks to be freed.
    pub fn unpin(&mut self, session: usize) -> Option<Vec<BlockId>> {
        let pin = self.by_session.remove(&session)?;
        self.oldest_first.remove(&pin.ticket);
        Some(pin.blocks)
    }

    /// Ends `session`'s pin if it is still the one `ticket` names.
    pub fn expire(&mut self, session: usize, ticket: PinTicket) -> Option<Vec<BlockId>> {
        match self.by_session.get(&session) {
            Some(pin) if pin.ticket == ticket => self.unpin(session),
            _ => None,
        }
    }

    /// Ends the oldest pin, preferring any session other than `spare`.
    pub fn unpin_oldest(&mut self, spare: Option<usize>) -> Option<Vec<BlockId>> {
        let victim = self
            .oldest_first
            .values()
            .copied()
            .find(|&s| Some(s) != spare)
            .or_else(|| self.oldest_first.values().next().copied())?;
        self.unpin(victim)
    }

    /// Number of live pins.
    pub fn len(&self) -> usize {
        self.by_session.len()
    }

    /// Whether no pin is live.
    pub fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_only_ends_the_pin_it_was_armed_for() {
        let mut pins = Pins::default();
        let (first, _) = pins.pin(1, vec![10, 11], 0);
        assert_eq!(pins.unpin(1), Some(vec![10, 11]));
        let (second, older) = pins.pin(1, vec![12], 5);
        assert_eq!(older, None);
        assert_eq!(pins.expire(1, first), None, "stale expiry");
        assert!(pins.holds(1));
        assert_eq!(pins.expire(1, second), Some(vec![12]));
        assert!(pins.is_empty());
    }

    #[test]
    fn pressure_unpins_the_oldest_other_session_first() {
        let mut pins = Pins::default();
        pins.pin(7, vec![1], 0);
        pins.pin(8, vec![2], 1);
        pins.pin(9, vec![3], 2);
        assert_eq!(pins.unpin_oldest(Some(7)), Some(vec![2]));
        assert_eq!(pins.unpin_oldest(None), Some(vec![1]));
        assert_eq!(
            pins.unpin_oldest(Some(9)),
            Some(vec![3]),
            "only the spared one is left"
        );
        assert_eq!(pins.unpin_oldest(None), None);
    }

    #[test]
    fn re_pinning_returns_the_older_pin() {
        let mut pins = Pins::default();
        pins.pin(1, vec![4], 0);
        let (_, older) = pins.pin(1, vec![5], 1);
        assert_eq!(older, Some(vec![4]));
        assert_eq!(pins.len(), 1);
    }
}

//! The working set's invariants, checked by the property tests after every
//! step.

use std::hash::Hash;

use super::lifecycle::{Links, Session, Stage, ToolGap};
use super::types::Slot;
use super::WorkingSet;

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// Checks the working set's internal consistency: the key index and
    /// the records agree, the member count and the running sums match the
    /// members, the list of members between turns holds exactly them in
    /// order of release, the queue and the waiting sessions agree, no
    /// member is a ghost, and no session presumed ended is asking.
    #[doc(hidden)]
    pub fn audit(&self) -> Result<(), String> {
        self.audit_slots()?;
        self.audit_idle()?;
        let members = self.members().count();
        if members != self.member_count {
            return Err(format!(
                "{} members counted but {members} records have one",
                self.member_count
            ));
        }
        let sum: u64 = self.members().map(|(s, m)| self.own(s, m.footprint)).sum();
        if sum != self.own_sum {
            return Err(format!(
                "own_sum {} but members add up to {sum}",
                self.own_sum
            ));
        }
        let hanging: Vec<_> = self
            .sessions
            .iter()
            .filter(|(_, r)| r.history.in_tree)
            .map(|(_, r)| (r.history.prefix, r.member().is_some()))
            .collect();
        self.prefixes.audit(&hanging)?;
        let reserves: u64 = self.members().map(|(_, m)| m.reserve).sum();
        if reserves != self.reserve_sum {
            return Err(format!(
                "reserve_sum {} but members' reserves add up to {reserves}",
                self.reserve_sum
            ));
        }
        for (at, &s) in self.queue.iter() {
            match self.sessions.get(s).map(Session::waiting) {
                None => return Err("a queued session has no record".into()),
                Some(None) => return Err("a queued session is not waiting".into()),
                Some(Some(w)) if w.at != *at => return Err("queue and session disagree".into()),
                Some(Some(_)) => {}
            }
        }
        let waiting = self
            .sessions
            .iter()
            .filter(|(_, r)| r.waiting().is_some())
            .count();
        if waiting != self.queue.len() {
            return Err("a session thinks it is queued".into());
        }
        let asking = |r: &Session<K>| match &r.stage {
            Stage::Waiting(_) => true,
            Stage::Member(m) => m.in_flight > 0,
            Stage::Away | Stage::Parked => false,
        };
        if self
            .sessions
            .iter()
            .any(|(_, r)| matches!(r.gap, ToolGap::Quiet { .. }) && asking(r))
        {
            return Err("a session presumed ended is waiting or in flight".into());
        }
        let listed = self
            .sessions
            .iter()
            .filter(|(_, r)| r.parked_in_tier())
            .count();
        if listed != self.evicted.parked_sessions {
            return Err("the sessions parked in the tier are not those listed".into());
        }
        let parked = |s| self.sessions.get(s).is_some_and(Session::parked_in_tier);
        let told = self.capacity.tier().is_some();
        self.evicted.audit(told, |k| self.is_member(k), parked)
    }

    /// The key index names every record, each at its own slot, and nothing else.
    fn audit_slots(&self) -> Result<(), String> {
        if self.slots.len() != self.sessions.len() {
            return Err(format!(
                "{} keys indexed but {} records",
                self.slots.len(),
                self.sessions.len()
            ));
        }
        for (k, &s) in &self.slots {
            if self.sessions.get(s).map(|r| &r.key) != Some(k) {
                return Err("a key is indexed at another session's slot".into());
            }
        }
        Ok(())
    }

    /// The list of members between turns holds each of them once, in
    /// order of release, linked both ways, and nothing else.
    fn audit_idle(&self) -> Result<(), String> {
        let idle = self.members().filter(|(_, m)| m.in_flight == 0).count();
        if idle != self.idle.len {
            return Err(format!(
                "{idle} members between turns but {} listed",
                self.idle.len
            ));
        }
        let mut prev: Option<(Slot, (u64, u64))> = None;
        let mut at = self.idle.first;
        let mut listed = 0;
        while let Some(s) = at {
            listed += 1;
            if listed > self.idle.len {
                return Err("the list of members between turns is longer than counted".into());
            }
            let Some(m) = self.sessions.get(s).and_then(Session::member) else {
                return Err("a slot listed between turns holds no member".into());
            };
            if m.in_flight > 0 {
                return Err("a member in flight is listed between turns".into());
            }
            if m.idle.prev != prev.map(|(p, _)| p) {
                return Err("a member between turns names the wrong predecessor".into());
            }
            if prev.is_some_and(|(_, order)| order >= m.idle_order()) {
                return Err("the members between turns are out of release order".into());
            }
            prev = Some((s, m.idle_order()));
            at = m.idle.next;
        }
        if listed != self.idle.len || self.idle.last != prev.map(|(p, _)| p) {
            return Err("the list of members between turns ends wrongly".into());
        }
        if self
            .members()
            .any(|(_, m)| m.in_flight > 0 && m.idle != Links::default())
        {
            return Err("a member in flight keeps links between turns".into());
        }
        Ok(())
    }
}

//! A turn asks and a turn ends: what each does to the working set, and
//! what it teaches (the output, the growth, the shared prefix, the prefill
//! rate).

use std::hash::Hash;

use super::lifecycle::{Leaving, Session, Stage, ToolGap, Waiting};
use super::types::{Slot, TurnReport, Verdict};
use super::window::keeps_window;
use super::WorkingSet;
use crate::core::prompt::PromptSketch;

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// A turn of `key` with a `prompt`-token prompt asks to be admitted at
    /// `now`. A session already queued keeps its place (a retry does not
    /// lose it); a grant handed over while it slept is collected here.
    pub fn request(&mut self, key: &K, prompt: u64, now: u64) -> Verdict {
        self.request_sketched(key, prompt, None, now)
    }

    /// [`WorkingSet::request`] with the prompt's sketch, when the driver
    /// has the prompt's tokens: a first prompt is compared with the last
    /// first prompt seen, which shows the shared prefix to a host that
    /// reports no cached tokens.
    pub fn request_sketched(
        &mut self,
        key: &K,
        prompt: u64,
        sketch: Option<&PromptSketch>,
        now: u64,
    ) -> Verdict {
        self.expire(now);
        let s = self.slot_or_insert(key);
        if let Some(m) = self.sessions[s].member_mut() {
            if let Some(grant) = m.grant.take() {
                return grant;
            }
        }
        self.close_gap(s, now);
        self.means
            .learn_growth(&mut self.sessions[s].history, prompt);
        if let Some(sketch) = sketch {
            self.place_in_tree(s, sketch);
        }
        if self.sessions[s].member().is_some() {
            return self.member_request(s, prompt, now);
        }
        let h = &self.sessions[s].history;
        if h.turns == 0 && !h.in_tree {
            let block = self.capacity.block_tokens();
            self.sessions[s].history.shared_credit = self.shared.expected_first_hit(block);
        }
        self.enqueue(s, prompt, now);
        if self.candidate() != Some(s) {
            return Verdict::Wait;
        }
        self.update_holding();
        let verdict = self.head_verdict(s, now);
        if verdict != Verdict::Wait {
            self.join(s, now);
        }
        verdict
    }

    /// Queues the session at `s` (`Away` → `Waiting`), or notes the prompt
    /// of its retry if it waits already.
    pub(super) fn enqueue(&mut self, s: Slot, prompt: u64, now: u64) {
        match &mut self.sessions[s].stage {
            Stage::Waiting(w) => w.prompt = prompt,
            Stage::Away | Stage::Parked => {
                let parked = matches!(self.sessions[s].stage, Stage::Parked);
                let at = self.queue.push(s);
                self.sessions[s].stage = Stage::Waiting(Waiting {
                    at,
                    since: now,
                    prompt,
                    past_bound: false,
                    parked,
                });
            }
            Stage::Member(_) => unreachable!("a member does not queue"),
        }
    }

    /// The session's tool gap ends at `now`, if one is open: the gap is
    /// learned, and a presumed end is taken back.
    pub(super) fn close_gap(&mut self, s: Slot, now: u64) {
        let Session { gap, history, .. } = &mut self.sessions[s];
        if let ToolGap::Quiet { .. } = gap {
            self.lifetimes.take_back(history.turns);
        }
        if let (Some(since), true) = (gap.since(), history.turns > 0) {
            let length = now.saturating_sub(since);
            history.gaps.push(length);
            self.silences.gap(length);
            self.means.gap_took(length);
        }
        *gap = ToolGap::Closed;
    }

    /// A member's turn asks: it goes in, its footprint grows to the
    /// prompt's, and members between turns are parked if that no longer fits.
    pub(super) fn member_request(&mut self, s: Slot, prompt: u64, now: u64) -> Verdict {
        self.idle.remove(&mut self.sessions, s);
        let footprint = self.footprint(s, prompt);
        let shared = self.shared.tokens;
        let reserve = self.means.next_turn_growth(&self.sessions[s].history);
        let Session { stage, history, .. } = &mut self.sessions[s];
        let Stage::Member(m) = stage else {
            unreachable!("a member asks");
        };
        m.in_flight += 1;
        m.cold = self.admission.running_cold;
        if footprint > m.footprint {
            self.own_sum =
                self.own_sum - history.own(m.footprint, shared) + history.own(footprint, shared);
            m.footprint = footprint;
        }
        history.last_prompt = prompt;
        self.reserve_sum = self.reserve_sum - m.reserve + reserve;
        m.reserve = reserve;
        self.shrink_to_fit(now, Some(s));
        Verdict::Member
    }

    /// Which stay of `key` in the working set a turn admitted now belongs
    /// to (0: none): a release names it, so a lease granted before the
    /// session was finished and began again cannot end the new stay's turn.
    pub fn membership(&self, key: &K) -> u64 {
        self.membership_at(self.slots.get(key).copied())
    }

    /// [`WorkingSet::membership`] of the session at `slot`, if it is known.
    fn membership_at(&self, slot: Option<Slot>) -> u64 {
        slot.and_then(|s| self.sessions[s].member())
            .map_or(0, |m| m.joined)
    }

    /// A turn of `key` admitted at `admitted_at`, during its current stay
    /// in the working set, ended at `now`.
    pub fn release(
        &mut self,
        key: &K,
        prompt: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        let membership = self.membership(key);
        self.release_of(key, prompt, report, admitted_at, membership, now);
    }

    /// A turn of `key` admitted at `admitted_at` during its stay
    /// `membership` ([`WorkingSet::membership`]) ended at `now`. A turn of
    /// an earlier stay (the session was finished meanwhile, and maybe began
    /// again) changes nothing: what it would teach belongs to a session
    /// that is gone.
    pub fn release_of(
        &mut self,
        key: &K,
        prompt: u64,
        report: TurnReport,
        admitted_at: u64,
        membership: u64,
        now: u64,
    ) {
        let slot = self.slots.get(key).copied();
        if self.membership_at(slot) != membership {
            self.expire(now);
            return;
        }
        // A turn let in cold says nothing of a hot turn's time (counting it
        // made the holding rule its own judge).
        let cold = slot.is_some_and(|s| self.sessions[s].member().is_some_and(|m| m.cold));
        if !cold {
            self.means.turn_took(now.saturating_sub(admitted_at));
        }
        // What the report teaches of what it shares is counted first
        // (`set_credit`), so its own tokens are taken after.
        self.learn(slot, prompt, report, admitted_at, now);
        let own_before = slot.and_then(|s| Some(self.own(s, self.sessions[s].member()?.footprint)));
        if let Some(s) = slot {
            let output = report
                .output_tokens
                .unwrap_or(self.sessions[s].history.last_output);
            let r = &mut self.sessions[s];
            r.history.turns += 1;
            r.history.last_prompt = prompt;
            r.history.last_output = output;
            r.gap = ToolGap::Open { since: now };
            match own_before {
                Some(own_before) => self.member_release(s, own_before, prompt + output, now),
                None => self.silences.left(s, now),
            }
        }
        self.expire(now);
        if slot.is_some() {
            self.shrink_to_fit(now, None);
        }
    }

    /// A member's turn ended at `now` with `tokens` of prompt and output
    /// cached (`own_before` of them its own before the turn): its footprint
    /// is that now, and between turns it keeps its place for a window
    /// ([`keeps_window`]), listed by release.
    pub(super) fn member_release(&mut self, s: Slot, own_before: u64, tokens: u64, now: u64) {
        let footprint = self.capacity.blocks(tokens);
        let h = &self.sessions[s].history;
        let keeps_window = keeps_window(&h.gaps, self.window_ns())
            && (self.silences.is_told() || !self.lifetimes.ends_after(h.turns));
        let reserve = self.means.next_turn_growth(h);
        let shared = self.shared.tokens;
        self.idle.remove(&mut self.sessions, s);
        let Session { stage, history, .. } = &mut self.sessions[s];
        let Stage::Member(m) = stage else {
            unreachable!("a member's turn ends");
        };
        self.own_sum = self.own_sum - own_before + history.own(footprint, shared);
        m.footprint = footprint;
        m.in_flight = m.in_flight.saturating_sub(1);
        let between_turns = m.in_flight == 0;
        if between_turns {
            m.released_at = now;
        }
        self.reserve_sum = self.reserve_sum - m.reserve + reserve;
        m.reserve = reserve;
        self.idle.insert(&mut self.sessions, s);
        self.trim_tier();
        if between_turns && !keeps_window {
            self.leave(s, now, Leaving::BetweenTurns);
        }
    }

    /// Learns the output length, the shared prefix and the prefill rate
    /// from one turn's report (of the session at `s`, if it is known).
    pub(super) fn learn(
        &mut self,
        s: Option<Slot>,
        prompt: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        if let Some(out) = report.output_tokens {
            self.means.output_was(out);
        }
        self.told.report(&report);
        let Some(cached) = report.cached_tokens else {
            return;
        };
        self.shared.saw_cached_report();
        let Some(s) = s else {
            return;
        };
        let h = &mut self.sessions[s].history;
        if h.turns == 0 && h.in_tree {
            let node = h.prefix;
            let block = self.capacity.block_tokens();
            if self.prefixes.measured(node, cached, block) > 0 {
                self.deepened(node);
            }
        } else if h.turns == 0 {
            self.shared.first_turn_shared(cached);
            self.set_credit(s, cached);
        }
        let secs = now.saturating_sub(admitted_at).max(1) as f64 / 1e9;
        self.capacity
            .report_turn(cached, prompt.saturating_sub(cached), secs);
    }
}

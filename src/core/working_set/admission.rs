//! The admission rule: who joins the working set, and who is parked to
//! make room. Everything else in the working set keeps the figures these
//! functions read.

use std::cell::OnceCell;

use super::holding;
use super::lifecycle::{Session, Stage};
use super::lifetimes::Survival;
use super::rotation_budget::RotationBudget;
use super::types::{Slot, Verdict};
use super::WorkingSet;

/// What the admission rule keeps between calls.
#[derive(Debug, Default)]
pub(super) struct Admission {
    /// Holding sessions out does not pay ([`WorkingSet::holding_pays`]).
    pub(super) running_cold: bool,
    /// Members parked so far.
    pub(super) parked: u64,
    /// What parks forced by the wait bound may still cost.
    budget: RotationBudget,
}

impl<K: Eq + std::hash::Hash + Clone> WorkingSet<K> {
    /// Decides again whether holding pays (module `holding`).
    pub(super) fn update_holding(&mut self) {
        let active = (self.member_count, self.queue.len());
        let sum = || self.own_sum + self.members().map(|(s, _)| self.prefix_of(s)).sum::<u64>();
        let pays = holding::pays(&self.tuning, &self.capacity, &self.means, active, sum);
        self.admission.running_cold = !pays;
    }

    /// The verdict on the session at the head of the queue, at `now`: the
    /// one rule that lets a session that is not a member in.
    ///
    /// ```text
    /// nobody in the working set ─────────────────────────────▶ Empty (liveness)
    /// holding sessions out does not pay (module `holding`) ──▶ RunningColdPays
    /// it fits beside the members and their next turns, and
    ///   the members still fit a refill window ahead ─────────▶ Fits
    /// it has waited the wait bound, and the rotation budget
    ///   allows: members between turns are parked for it,
    ///   least recently released first ──────────────────────▶ WaitBound
    /// otherwise ─────────────────────────────────────────────▶ Wait
    /// ```
    ///
    /// Past the bound, the room it takes is what its turn and the members'
    /// next turns need, not a window ahead (the bound is a promise), and
    /// members in flight are never cut short: if parking everyone between
    /// turns is not enough it waits for a release, which lets it in. The
    /// parks it forces are paid from the rotation budget (module
    /// `rotation_budget`): while those forced for the heads before it are
    /// paid off, it waits as before its bound.
    pub(super) fn head_verdict(&mut self, s: Slot, now: u64) -> Verdict {
        if self.member_count == 0 {
            return Verdict::Empty;
        }
        if self.admission.running_cold {
            return Verdict::RunningColdPays;
        }
        let Some(waiting) = self.sessions[s].waiting().copied() else {
            unreachable!("the head of the queue is waiting");
        };
        let need = self.need(s, waiting.prompt);
        if self.fits_beside_members(need) && self.fits_ahead(s, need) {
            return Verdict::Fits;
        }
        let bound = waiting.since.saturating_add(self.wait_bound_ns());
        if now >= bound && self.rotation_allowed(now) {
            let parked = self.park_until_fits(need, now);
            self.admission.budget.spend(parked);
            if self.fits_beside_members(need) || self.member_count == 0 {
                return Verdict::WaitBound;
            }
            if let Stage::Waiting(w) = &mut self.sessions[s].stage {
                w.past_bound = true;
            }
        }
        Verdict::Wait
    }

    /// The tokens a session outside the working set would add by joining
    /// with a `prompt`-token prompt: its footprint, less the shared
    /// prefixes already counted.
    pub(super) fn need(&self, s: Slot, prompt: u64) -> u64 {
        let prefix = self.sessions[s].history.prefix;
        self.own(s, self.footprint(s, prompt)) + self.prefixes.uncounted_on_path(prefix)
    }

    /// Whether `need` more tokens fit beside what is counted now (the
    /// shared prefix, the members' own tokens, the ghosts) and the room
    /// the members' next turns will take.
    pub(super) fn fits_beside_members(&self, need: u64) -> bool {
        (self.counted() + self.reserve_sum + need) as f64 <= self.capacity.tokens()
    }

    /// Whether the members, with the session at `joining` (needing `need`
    /// more tokens) among them, still fit as they grow over the turns they
    /// run in one refill window: a window is what holding a footprint is
    /// worth against re-prefilling it, so an overflow within it would park
    /// a member whose re-prefill costs more than the room the newcomer
    /// used until then. Each session `k` turns ahead holds its own tokens
    /// plus `k` turns of growth, weighted by the chance that it is still
    /// running (module `lifetimes`: from the sessions that finished and
    /// how far those still running have got); one past what was measured
    /// is taken as after its next turn.
    pub(super) fn fits_ahead(&self, joining: Slot, need: u64) -> bool {
        self.members_fit_ahead(&OnceCell::new(), Some((joining, need)))
    }

    /// Whether the members (with a session joining them, needing some more
    /// tokens) fit as they grow over the turns they run in one refill
    /// window ([`WorkingSet::fits_ahead`]). `survival` is the curve of
    /// [`WorkingSet::survival`], made here the first time it is needed:
    /// parking members leaves it as it is, so a caller that parks between
    /// two questions passes the same cell.
    fn members_fit_ahead(
        &self,
        survival: &OnceCell<Survival>,
        joining: Option<(Slot, u64)>,
    ) -> bool {
        let horizon = self.means.turns_in(self.window_ns());
        if horizon < 2 {
            return true;
        }
        let survival = survival.get_or_init(|| self.survival());
        // Further ahead than anyone is known to have run, only the
        // sessions past what was measured remain, as they are.
        let last = horizon.min(survival.reach());
        let members = self.members().map(|(s, m)| {
            let h = &self.sessions[s].history;
            (
                h.own(m.footprint, self.shared.tokens),
                h,
                self.turns_begun(s),
            )
        });
        let joining = joining.map(|(s, need)| {
            let h = &self.sessions[s].history;
            (need, h, h.turns + 1)
        });
        // What the host told bounds the projection: no history outgrows
        // the engine's longest sequence or the session's token budget, and
        // none runs past its turn budget.
        let max_model_len = self.capacity.max_model_len();
        let outlook: Vec<Outlook> = members
            .chain(joining)
            .map(|(own, h, started)| {
                let longest = h.budget().tokens.into_iter().chain(max_model_len).min();
                Outlook {
                    own: own as f64,
                    growth: self.means.next_turn_growth(h) as f64,
                    started,
                    most: longest.map_or(f64::INFINITY, |t| {
                        t.saturating_sub(h.shared_credit).max(own) as f64
                    }),
                    last_turn: h.budget().turns,
                }
            })
            .collect();
        let base = (self.shared_tokens() + self.ghost_tokens()) as f64;
        let capacity = self.capacity.tokens();
        // One turn ahead is `fits_beside_members`' own test.
        (2..=last).all(|k| {
            let load: f64 = outlook
                .iter()
                .map(|o| {
                    if o.last_turn.is_some_and(|t| o.started.saturating_add(k) > t) {
                        return 0.0; // past its turn budget: ended
                    }
                    match survival.continuing(o.started, k) {
                        Some(p) => p * (o.own + o.growth * f64::from(k)).min(o.most),
                        None => (o.own + o.growth).min(o.most),
                    }
                })
                .sum();
            base + load <= capacity
        })
    }

    /// How long sessions run, from those that finished and how far those
    /// still here have got (module `lifetimes`).
    fn survival(&self) -> Survival {
        self.lifetimes
            .survival(self.sessions.iter().map(|(s, _)| self.turns_begun(s)))
    }

    /// The turns the session at `s` has begun: those it ran, and the one
    /// in flight or waiting.
    fn turns_begun(&self, s: Slot) -> u32 {
        let session = &self.sessions[s];
        let now = match &session.stage {
            Stage::Member(m) => u32::from(m.in_flight > 0),
            Stage::Waiting(_) => 1,
            Stage::Away | Stage::Parked => 0,
        };
        session.history.turns + now
    }

    /// The session the admission rule is asked about: the first in the
    /// queue, except that with a host tier the sessions parked there go
    /// first. They are in the rotation already, their blocks are aging in
    /// the tier while they wait, and a newcomer let in before them would
    /// take the room they need back.
    pub(super) fn candidate(&self) -> Option<Slot> {
        let head = self.queue.head()?;
        if self.evicted.parked_sessions == 0 {
            return Some(head);
        }
        let parked = self
            .queue
            .iter()
            .map(|(_, &s)| s)
            .find(|&s| self.sessions[s].parked_in_tier());
        Some(parked.unwrap_or(head))
    }

    /// Parks members between turns while what is counted exceeds the
    /// capacity, from the first token over (never `keep`, the member whose
    /// turn is asking). The engine absorbs no overflow for free: it evicts
    /// some member's blocks, which that member re-prefills. After an
    /// overflow it parks on until the rest fit a window ahead
    /// ([`WorkingSet::fits_ahead`]).
    pub(super) fn shrink_to_fit(&mut self, now: u64, keep: Option<Slot>) {
        // Nobody is parked while running cold pays: a member could be
        // parked for the room a head was just let in beyond.
        if self.admission.running_cold {
            return;
        }
        let mut parked = false;
        while self.load() as f64 > self.capacity.tokens() && self.park_lru(now, keep).is_some() {
            parked = true;
        }
        // An overflow says the members outgrew the cache; those that will
        // not fit as they go on growing are parked now, while their
        // histories are short, not one at each overflow to come.
        if parked {
            let survival = OnceCell::new();
            while !self.members_fit_ahead(&survival, None) && self.park_lru(now, keep).is_some() {}
        }
    }

    /// Parks members between turns, least recently released first, until
    /// `need` more tokens fit beside the rest (or nobody is left to park).
    /// Returns what their returns will cost the engine: the seconds to
    /// rebuild each one's own tokens.
    fn park_until_fits(&mut self, need: u64, now: u64) -> f64 {
        let mut rebuild = 0.0;
        while !self.fits_beside_members(need) {
            let Some((prefix, own)) = self.park_lru(now, None) else {
                break;
            };
            rebuild += self.capacity.rebuild_secs(prefix, own).unwrap_or(0.0);
        }
        rebuild
    }

    /// What the rotation budget refills by, engine seconds a second: `1 / B`
    /// (`B` the wait bound in windows), so that forced parks cost at most
    /// `1 / B` of the engine's time in rebuilds; 0 while the engine's cost
    /// is unknown (the budget is not consulted then).
    fn rotation_refill_rate(&self) -> f64 {
        let windows = self.tuning.wait_bound_windows;
        let priced = self.capacity.secs_per_token() > 0.0;
        if priced && windows > 0.0 && windows.is_finite() {
            1.0 / windows
        } else {
            0.0
        }
    }

    /// Whether the wait bound may park members at `now`.
    fn rotation_allowed(&mut self, now: u64) -> bool {
        let per_sec = self.rotation_refill_rate();
        if per_sec <= 0.0 {
            return true;
        }
        // At most a refill of the cache: what the first head past its bound
        // finds after waiting `B` windows.
        let cap = self.capacity.window_ns() as f64 / 1e9;
        self.admission.budget.refill(now, per_sec, cap);
        self.admission.budget.allows()
    }

    /// Parks the member between turns released longest ago (never `keep`):
    /// the one whose blocks the engine evicts first whichever member the
    /// gate parks, so parking any other would lose both.
    /// Returns the prefix the parked member's return will find cached
    /// and its own tokens, or `None` if nobody could be parked.
    fn park_lru(&mut self, now: u64, keep: Option<Slot>) -> Option<(u64, u64)> {
        let victim = self.idle.iter(&self.sessions).find(|&s| Some(s) != keep)?;
        let own = self.own(victim, self.sessions[victim].member()?.footprint);
        let prefix = self.prefix_of(victim);
        self.leave(victim, now, super::lifecycle::Leaving::BetweenTurns);
        self.admission.parked += 1;
        Some((prefix, own))
    }

    /// When the queue head reaches the wait bound, if it has not yet (a
    /// head already past it waits for a release, not a time).
    pub(super) fn wait_bound_end(&self) -> Option<u64> {
        let head = self.candidate()?;
        let w = self.sessions[head].waiting()?;
        let paid_off = self
            .admission
            .budget
            .allows_at(self.rotation_refill_rate())
            .unwrap_or(0);
        (!w.past_bound).then(|| w.since.saturating_add(self.wait_bound_ns()).max(paid_off))
    }

    /// Lets in the queue heads that may enter at `now`, in order: each
    /// joins and keeps its grant until its attempt collects it. Returns
    /// them, with why, in `out`.
    pub(super) fn admit_queue_heads(&mut self, now: u64, out: &mut Vec<(K, Verdict)>) {
        if self.queue.len() == 0 {
            return;
        }
        // Decided once for the pass: the heads it lets in for running cold
        // change the figures, not the answer they were let in by.
        self.update_holding();
        while let Some(s) = self.candidate() {
            let verdict = self.head_verdict(s, now);
            if verdict == Verdict::Wait {
                break;
            }
            self.join(s, now);
            let Session { key, stage, .. } = &mut self.sessions[s];
            if let Stage::Member(m) = stage {
                m.grant = Some(verdict);
            }
            out.push((key.clone(), verdict));
        }
    }
}

/// One session as the window-ahead test projects it.
struct Outlook {
    /// Its own tokens now.
    own: f64,
    /// What each turn adds.
    growth: f64,
    /// The turns it has begun.
    started: u32,
    /// The most own tokens it can reach (the host's figures; infinite
    /// when none was told).
    most: f64,
    /// The last turn of its budget, if told.
    last_turn: Option<u32>,
}

//! Working-set admission: which sessions may have turns on the engine, so
//! that what they keep in the prefix cache fits in it.
//!
//! This is Denning's working-set load control (1968) mapped onto a prefix
//! cache: a session is a process, its whole history is its working set (it
//! is re-sent every turn), a turn whose own prefix was evicted is a page
//! fault, and its re-prefill is the fault's service time. Thrashing is cured
//! by limiting *which sessions are active* to what fits, not by a better
//! eviction order. vLLM's usage gauge cannot drive this: it counts only the
//! blocks of running requests, so a session in a tool call is invisible to
//! it while its cached prefix waits in the free queue to be evicted.
//!
//! ```text
//! turn of a member (in flight, or between turns within its window) ─▶ admit "reserved_session"
//! turn of a session outside the working set: it joins the queue
//!   (returning sessions ahead of new ones, FIFO within each, kept across retries)
//!   queue head, nobody in the working set ───────────────────────────▶ admit "empty_working_set"
//!   queue head, its footprint fits beside the members' ──────────────▶ admit "fits_working_set"
//!   first new session, the head (returning) does not fit but it does ▶ admit "fits_working_set"
//!   queue head, no turn in flight for as long as the member it displaces
//!     takes to re-prefill, the engine idle with sessions waiting at least
//!     as long as it re-prefilled (`idle_balance`): park members for it ▶ "engine_idle"
//!   queue head, waited past the wait bound, the rotation budget paid off:
//!     park members for it ───────────────────────────────────────────▶ admit "wait_bound"
//!   otherwise ────────────────────────────────────────────────────────▶ wait
//! ```
//!
//! What is counted, in tokens of KV:
//! - a member's **footprint**: its newest prompt plus what it generated (or,
//!   in flight, is expected to generate), rounded up to whole blocks. The
//!   prefix sessions share (learned from the cached tokens of each
//!   session's first turn) is counted once, not once per session;
//! - **ghosts**: a session that left the working set (parked, window over,
//!   finished) leaves its blocks in the engine's free queue, and vLLM evicts
//!   the least recently freed blocks first, so they outlive the older blocks
//!   of members between turns. A ghost counts while some member between
//!   turns was released before it;
//! - against the **capacity**: the engine's KV tokens (never a per-workload
//!   knob), lowered while members' turns miss what they should have hit and
//!   grown back while they do not.
//!
//! How the set changes:
//! - a member between turns keeps its place for a **window**: the time the
//!   engine needs to prefill its whole cache, `C / r`. Holding a footprint
//!   `f` for a time `t` idles `f·t` of cache; evicting it costs a re-prefill
//!   of `f` during which the whole cache waits, `f·C/r`: they break even at
//!   `t = C/r` whatever `f` (ski rental). A session whose own tool calls
//!   usually outlast the window gets none, nor does one too new to judge
//!   while windows mostly run out instead of ending in a return;
//! - when prompts grow until the members no longer fit, the member between
//!   turns that the cache would evict next anyway (the least recently
//!   released) is **parked**: it leaves, and re-enters ahead of new sessions;
//! - a session joins only if the members still fit **a refill window
//!   ahead**: each grows by a turn's growth per turn, weighted by the chance
//!   (measured on the sessions that finished) that it is still running then.
//!   An overflow within a window parks a member whose re-prefill costs more
//!   than the room it held was worth, the window's own break-even.
//!
//! This file is bookkeeping only: no lock, no clock, no probe. The core keeps
//! one per gate behind one lock and feeds it time and the engine's answers.
//! A grant made while the session's attempt sleeps (a hand-over) is kept
//! until that attempt collects it, or withdrawn with the attempt.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;

use slab::Slab;

use super::idle_balance::IdleBalance;
use super::lifetimes::Lifetimes;
use super::prefill_share::PrefillShare;
use super::prompt::PromptSketch;
use super::rotation_budget::RotationBudget;
use super::silences::Silences;

/// The working set's map of sessions hashes with FxHash (rustc-hash): its
/// keys come hashed already (the ledger's `SessionId` writes the session
/// table's keyed hash, one `write_u64`), and SipHash over that again cost
/// ~130 instructions per lookup, a third of a turn's cost in this mode
/// (about 20 lookups per acquire + release then; `benches/instructions.rs`,
/// `open_1t/working_set/hot`). Fx's multiply spreads the word over the bits
/// hashbrown uses.
type KeyMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// A session's index in [`WorkingSet::sessions`]: stable for as long as the
/// working set knows the session, so a call looks its session up once and
/// the queue and the list of members between turns name sessions by it.
type Slot = usize;

/// Where a session's record was in [`WorkingSet::sessions`], as a caller
/// keeps it between calls: a session's request and its turn's release
/// hand back the slot they were last given, and the record there is taken
/// once it is checked to be the session's, without hashing the key (an
/// FxHash lookup, ~60 instructions, on each of a member's request and
/// release; `benches/instructions.rs`, `open_1t/working_set/hot`). A hint
/// that no longer holds (the record was dropped, its slot reused) costs
/// the lookup it saves, nothing else. Four bytes, so that the lease token
/// carrying it does not grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotHint(u32);

impl SlotHint {
    /// No hint: the key is looked up.
    pub(crate) const NONE: Self = Self(u32::MAX);

    /// The hint of slot `s` (none for a slot past what four bytes hold).
    fn of(s: Slot) -> Self {
        u32::try_from(s).map_or(Self::NONE, Self)
    }

    fn get(self) -> Option<Slot> {
        (self != Self::NONE).then_some(self.0 as Slot)
    }
}

/// The stay in the working set a turn was admitted in, as the request
/// answered it: which stay ([`WorkingSet::membership`]; 0 for none), and
/// where the session's record was, for the release to find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stay {
    pub(crate) membership: u64,
    pub(crate) slot: SlotHint,
}

/// What the engine says about its KV cache (the capacity probe).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct EngineCapacity {
    /// KV capacity in tokens (vLLM: `num_gpu_blocks × block_size`); 0 when unknown.
    pub tokens: u64,
    /// Tokens per KV block (vLLM's `block_size`); 0 when unknown.
    pub block_tokens: u32,
    /// The engine's typical prefill throughput (`kvgate_vllm`: the median
    /// of its recent steps that were mostly prefill), tokens per second; 0
    /// when unknown.
    pub prefill_tokens_per_sec: f64,
}

impl EngineCapacity {
    /// An answer with all three figures (0 for any that is unknown).
    pub fn new(tokens: u64, block_tokens: u32, prefill_tokens_per_sec: f64) -> Self {
        let rate = if prefill_tokens_per_sec.is_finite() && prefill_tokens_per_sec > 0.0 {
            prefill_tokens_per_sec
        } else {
            0.0
        };
        Self {
            tokens,
            block_tokens,
            prefill_tokens_per_sec: rate,
        }
    }
}

/// What the host learned from the engine about one finished turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TurnReport {
    /// Prompt tokens the engine served from its prefix cache (vLLM's
    /// `num_cached_tokens`), if known.
    pub cached_tokens: Option<u64>,
    /// Tokens the turn generated, if known.
    pub output_tokens: Option<u64>,
}

impl TurnReport {
    /// A report of what the engine measured (`None` for what is unknown).
    pub fn new(cached_tokens: Option<u64>, output_tokens: Option<u64>) -> Self {
        Self {
            cached_tokens,
            output_tokens,
        }
    }
}

/// The working set's answer to a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The session is a member: its window carries it in.
    Member,
    /// Its footprint fits beside the members'.
    Fits,
    /// Nobody else is in the working set (liveness).
    Empty,
    /// It waited past the wait bound, and a member was parked for it.
    WaitBound,
    /// Holding sessions out does not pay now ([`WorkingSet::holding_pays`]):
    /// it goes in whether or not it fits.
    RunningColdPays,
    /// No turn was in flight and the engine had idled with sessions waiting
    /// at least as long as it had re-prefilled (module `idle_balance`):
    /// members between turns were parked for it.
    EngineIdle,
    /// It waits in the queue.
    Wait,
}

/// The policy's few constants; none is a capacity or a duration fitted to a
/// workload (the window and the bound are in units of the measured refill time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// Members' turns missing more than this fraction of what they should
    /// have hit (recent average) lower the capacity estimate. Block rounding
    /// and the engine's own `prompt - 1` cap stay well below 5%.
    pub miss_tolerance: f64,
    /// How long a session waits, from queueing, before members between
    /// turns are parked for it once it heads the line, in refill windows.
    /// A window is what one eviction is worth: with every waiter let in
    /// after at most `B` windows, the members it rotates out cost at most
    /// one refill of the cache per `B` windows, about `1/B` of the engine's
    /// time on a prefill-bound engine. So every wait is bounded by `B`
    /// windows plus the turns in flight ahead of it and, for each head
    /// before it, at most `B` windows more (the rotation budget below).
    /// Measured in the simulator (judge, seeds 1-5, every scenario): the
    /// bound fires only where 48 sessions outgrow the cache three times
    /// over. There, counting from the queueing instead of from reaching the
    /// head (as was done) halves the p99 turn latency (`decode-heavy` 306 s
    /// to 154 s, `elide` 257 s to 136 s, `reasoning` 225 s to 154 s) for
    /// 3% of makespan on `decode-heavy` (0.909 to 0.939 of the best cap)
    /// and nothing elsewhere. At 8 windows `decode-heavy` reaches no gate's
    /// p99 (100 s) but costs 12% of its makespan, and `real-engine`, whose
    /// refill is fast next to its turns, 7%; at 4 windows, 29% and 45%.
    /// On the real engine (24 sessions x 10 turns, quiet machine) the bound
    /// (about 36 s) never fired either way. Under one busy core it once
    /// fired 12 times per run, counted from the queueing, with a window of
    /// 1.2 s (kvgate 1.10x cap-4 against 1.03x counted from the head).
    /// The parks it forces are paid from a budget refilled at `1 / B` of
    /// the prefill rate (module `rotation_budget`), which keeps that cost
    /// when many heads pass the bound together.
    pub wait_bound_windows: f64,
    /// The window before the engine's prefill rate is known, ns.
    pub initial_window_ns: u64,
    /// How much more turn throughput running every session cold must
    /// promise than holding the cache for the sessions that fit, before
    /// the working set stops holding anyone out
    /// ([`WorkingSet::holding_pays`]); infinite: always hold. The promise
    /// is a first-order estimate that flatters running cold (its turns are
    /// taken to last as long as hot ones), so it must be clearly ahead.
    /// Measured (judge, seeds 1-5, every scenario): margins from 1.2 to 1.5
    /// give the same results everywhere but `mid-tools`, which they fix
    /// (1.17x no gate without the rule, 1.00-1.01x with it); at 2.0
    /// `mid-tools` is 1.09x; at 1.0 (measured before the geometric mean of
    /// the gaps and the band), `mixed` and `real-engine` (and the real
    /// engine) stop holding and lose 1.5-2x. `decode-heavy` bounds it from
    /// below: the estimate puts running cold 1.1-1.2x ahead there while it
    /// is 1.4x behind (the re-prefill stalls every decode); at 1.2 the gate
    /// follows it (1.18x the best cap), at 1.25 and above it holds (0.91x).
    pub cold_margin: f64,
}

/// How much lower the cold bound's lead must fall before holding resumes
/// (`WorkingSet::update_holding`): with the margin at 1.5, holding stops
/// at 1.5 and resumes below 1.25, both inside the range of margins measured
/// to change nothing but `mid-tools` (1.2 to 1.5). On `mid-tools`: 1.00x no
/// gate with the band, 1.03x without; bands of 1.1 and 1.3 within 0.3% of
/// 1.2 (measured with an arithmetic mean of the gaps).
const HOLDING_HYSTERESIS: f64 = 1.2;

impl Default for Tuning {
    fn default() -> Self {
        Self {
            miss_tolerance: 0.05,
            wait_bound_windows: 16.0,
            initial_window_ns: 2_000_000_000,
            cold_margin: 1.5,
        }
    }
}

/// Step by which the capacity estimate moves per member turn, as a fraction.
const ESTIMATE_STEP: f64 = 0.02;
/// Lowest the estimate goes, as a fraction of the engine's capacity.
const ESTIMATE_FLOOR: f64 = 0.5;
/// Usage answers below this say too little about capacity to use.
const USAGE_SAMPLE_FLOOR: f64 = 0.05;
/// Usage samples kept for the capacity estimate when the engine gives none.
const USAGE_SAMPLES: usize = 16;
/// Tool gaps remembered per session.
const GAP_SAMPLES: usize = 8;
/// Gaps needed before a session's own median decides its window.
const GAPS_TO_JUDGE: usize = 3;

#[derive(Debug, Clone)]
struct Member {
    /// KV tokens this member keeps cached, own and shared.
    footprint: u64,
    /// Its turns in flight (more than one only for overlapping retries).
    in_flight: u32,
    /// When its last turn ended: its blocks entered the free queue then,
    /// and its window began.
    released_at: u64,
    /// Order of joining: breaks ties between equal release times, so that
    /// the choice never depends on the order the releases came in.
    joined: u64,
    /// What its next turn will add (`WorkingSet::next_turn_growth`), times
    /// the measured chance that it has one ([`reserve_for`]), as last
    /// estimated: kept free for it before anyone joins.
    reserve: u64,
    /// Its neighbours in [`IdleList`] while it is between turns (none in
    /// flight).
    idle: Links,
}

impl Member {
    /// Its place among the members between turns: by release, then by
    /// joining (unique per membership, so no two members tie).
    fn idle_order(&self) -> (u64, u64) {
        (self.released_at, self.joined)
    }
}

/// A member's neighbours in [`IdleList`], by slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Links {
    prev: Option<Slot>,
    next: Option<Slot>,
}

/// The members between turns, by release: the next the cache evicts, the
/// next to park, the oldest behind the ghost count, and (every window being
/// the same length from its release) the next whose window ends. Ordered by
/// [`Member::idle_order`]. Kept in step with the members by
/// [`IdleList::remove`] before a member changes and [`IdleList::insert`]
/// after: the first is then at hand, not found by a scan of every member
/// on every turn.
///
/// A list threaded through the members' records (each names its
/// neighbours), not an ordered map: a member leaves it from wherever it is
/// at once, and enters at the back, releases coming in time order; the
/// walk back from the end that places it moves only past a release that
/// came out of order (an equal time of a member that joined later, or a
/// release whose clock was read by another thread before this one's took
/// the lock). Each turn takes its member out and puts it back: with a
/// `BTreeMap` keyed by that order a turn cost 4,317 instructions against
/// 4,087 with the list (`benches/instructions.rs`,
/// `open_1t/working_set/hot`), and the more members the more: 5,228
/// against 4,115 with 4,096 members (`/distinct`).
#[derive(Debug, Default)]
struct IdleList {
    first: Option<Slot>,
    last: Option<Slot>,
    len: usize,
}

impl IdleList {
    /// Links in the member at `s` by its release, if it is between turns.
    fn insert<K>(&mut self, sessions: &mut Slab<Session<K>>, s: Slot) {
        let m = sessions[s].member();
        if m.in_flight > 0 {
            return;
        }
        let order = m.idle_order();
        let mut prev = self.last;
        while let Some(p) = prev {
            let before = sessions[p].member();
            if before.idle_order() < order {
                break;
            }
            prev = before.idle.prev;
        }
        let next = match prev {
            Some(p) => sessions[p].member().idle.next,
            None => self.first,
        };
        sessions[s].member_mut().idle = Links { prev, next };
        match prev {
            Some(p) => sessions[p].member_mut().idle.next = Some(s),
            None => self.first = Some(s),
        }
        match next {
            Some(n) => sessions[n].member_mut().idle.prev = Some(s),
            None => self.last = Some(s),
        }
        self.len += 1;
    }

    /// Unlinks the member at `s`, if it is between turns (one in flight is
    /// not listed).
    fn remove<K>(&mut self, sessions: &mut Slab<Session<K>>, s: Slot) {
        let m = sessions[s].member_mut();
        if m.in_flight > 0 {
            return;
        }
        let Links { prev, next } = std::mem::take(&mut m.idle);
        match prev {
            Some(p) => sessions[p].member_mut().idle.next = next,
            None => self.first = next,
        }
        match next {
            Some(n) => sessions[n].member_mut().idle.prev = prev,
            None => self.last = prev,
        }
        self.len -= 1;
    }

    /// The member between turns released longest ago.
    fn first(&self) -> Option<Slot> {
        self.first
    }

    /// The members between turns, least recently released first.
    fn iter<'a, K>(&self, sessions: &'a Slab<Session<K>>) -> impl Iterator<Item = Slot> + 'a {
        std::iter::successors(self.first, move |&s| sessions[s].member().idle.next)
    }
}

/// A queued session's class: the queue is ordered by class, then by
/// queueing, first come first served within each.
///
/// First come first served among returning sessions too, although the one
/// parked last has its blocks freed last and is the likeliest to find them
/// still cached. Last in, first out among them was measured (judge, seeds
/// 1-5, every scenario): it lowers the p99 turn latency where sessions
/// queue behind the cache (`thrash` 34 to 21 s, `multi-replica` 38 to 20
/// s, `staggered` 52 to 31 s, all below no gate's) only by putting the
/// waiting on fewer turns: the longest wait grows (`thrash` 53 to 79 s,
/// `staggered` 85 to 136 s, `decode-heavy` 219 to 619 s, `elide` 150 to
/// 505 s), and makespan against the best cap goes from 0.9237 to 0.9314,
/// with hits within a point where the p99 fell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// Parked or out of window: re-enters ahead of new sessions.
    Returning = 0,
    New = 1,
}

#[derive(Debug, Clone, Default)]
struct History {
    turns: u32,
    last_prompt: u64,
    last_output: u64,
    /// What its turns add to the prompt beyond its own output (the tool
    /// results): a running mean, 0 until its second turn shows one.
    growth: f64,
    /// What this session shares with others: its first turn's cached
    /// tokens, and until that is reported, what first turns have hit so far
    /// ([`WorkingSet::expected_first_hit`]).
    shared_credit: u64,
    /// When its last turn ended, and whether its next request is yet to come.
    released_at: u64,
    gap_open: bool,
    /// Recent tool gaps (release to next request), ns.
    gaps: Gaps,
    /// Its place in the queue, when it was queued, and its prompt.
    queued: Option<(Class, u64)>,
    queued_at: u64,
    queued_prompt: u64,
    returning: bool,
    /// A grant made while its attempt slept, not yet collected.
    grant: Option<Verdict>,
    /// It reached the wait bound at the head and could not be given room
    /// (members in flight are never cut short): only a release can let it
    /// in now, so the bound is no longer a deadline.
    past_bound: bool,
    /// Tokens the turn in flight should hit (it stayed a member since its
    /// last turn); 0 when there is no such expectation.
    expect_hit: u64,
    /// What its first prompt shares with the first prompt seen before it
    /// (whole blocks, from the sketches): its shared prefix when no cached
    /// tokens are reported.
    sketched_shared: u64,
    /// That expectation was read from the two prompts' sketches, not
    /// presumed from their lengths.
    expect_seen: bool,
    /// What the turn in progress could hit of what its previous prompt
    /// and output put in the cache, tokens (whole blocks, never the
    /// prompt's last token); 0 on a first turn.
    could_hit: u64,
    /// The sketch of its last prompt, if its driver gave one.
    last_sketch: Option<PromptSketch>,
    /// Its turn in flight was admitted while the working set was not
    /// holding anyone out ([`WorkingSet::holding_pays`]): it may run cold by
    /// choice, so its duration and its misses say nothing of a hot turn or
    /// of the capacity.
    turn_cold: bool,
    /// It was presumed ended after a long quiet ([`Silences`]): its turn
    /// count is among the lifetimes until it asks again.
    presumed_ended: bool,
}

/// Sessions that left the working set (parked, window over, finished),
/// whose blocks the engine may still hold: each with when its blocks were
/// freed and its own tokens, in order of release, and the sum of those
/// tokens. The ghosts that count are those freed after some member between
/// turns ([`WorkingSet::ghost_tokens`]); the older ones are dropped as they
/// stop counting, so the answer is nearly always all of them: the sum,
/// not a walk over every ghost at every fit test.
#[derive(Debug)]
struct Ghosts<K> {
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
    fn is_empty(&self) -> bool {
        self.by_release.is_empty()
    }

    /// A ghost of `key` whose blocks were freed at `released`, after any
    /// freed at the same time.
    fn insert(&mut self, released: u64, own: u64, key: K) {
        let at = self.by_release.partition_point(|(r, _, _)| *r <= released);
        self.by_release.insert(at, (released, own, key));
        self.own_sum += own;
    }

    /// The own tokens of the ghosts freed after `oldest`.
    fn own_freed_after(&self, oldest: u64) -> u64 {
        match self.by_release.front() {
            None => 0,
            Some((first, _, _)) if *first > oldest => self.own_sum,
            Some(_) => {
                let at = self.by_release.partition_point(|(r, _, _)| *r <= oldest);
                self.by_release.range(at..).map(|(_, own, _)| *own).sum()
            }
        }
    }

    /// Drops the ghosts freed at or before `oldest`.
    fn drop_freed_by(&mut self, oldest: u64) {
        while self
            .by_release
            .front()
            .is_some_and(|(released, _, _)| *released <= oldest)
        {
            if let Some((_, own, _)) = self.by_release.pop_front() {
                self.own_sum -= own;
            }
        }
    }

    fn clear(&mut self) {
        self.by_release.clear();
        self.own_sum = 0;
    }

    /// Drops `key`'s ghost: its blocks are its own again.
    fn forget(&mut self, key: &K) {
        let own_sum = &mut self.own_sum;
        self.by_release.retain(|(_, own, k)| {
            let keep = k != key;
            if !keep {
                *own_sum -= own;
            }
            keep
        });
    }

    fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_release.iter().map(|(_, _, k)| k)
    }

    /// In order of release, and the sum right.
    fn audit(&self) -> Result<(), String> {
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

/// All the working set keeps of one session: what it learned of it and,
/// while the session is in the working set, its membership. One record
/// (not a map of histories beside a map of members) so that a call finds
/// both with one lookup of its key.
#[derive(Debug)]
struct Session<K> {
    key: K,
    history: History,
    member: Option<Member>,
}

impl<K> Session<K> {
    fn member(&self) -> &Member {
        self.member.as_ref().expect("a member")
    }

    fn member_mut(&mut self) -> &mut Member {
        self.member.as_mut().expect("a member")
    }
}

/// Figures for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct WorkingSetStats {
    /// Sessions in the working set.
    pub members: usize,
    /// Sessions waiting to join.
    pub waiting: usize,
    /// Tokens counted now (members, the shared prefix, ghosts).
    pub load_tokens: u64,
    /// Capacity in force, tokens (0 while unknown).
    pub capacity_tokens: u64,
    /// Shared prefix counted once, tokens.
    pub shared_prefix_tokens: u64,
    /// The refill window, ns.
    pub window_ns: u64,
    /// Members parked so far.
    pub parked: u64,
    /// Whether holding sessions out pays ([`WorkingSet::holding_pays`]), as
    /// last decided for a queue head; when not, nobody waits for room and
    /// nobody is parked.
    pub holding: bool,
    /// How many turns ahead a joining session must still fit beside the
    /// members: the turns a hot session runs in one refill window,
    /// stretched by `1 / (1 - prefill_share)`; 1 while that is unknown.
    pub horizon_turns: u32,
    /// The measured share of the engine's time spent prefilling, which
    /// stretches the horizon (0 before any turn reports its cached tokens).
    pub prefill_share: f64,
    /// Engine time, ns, spent with no turn in flight while a session waited,
    /// decayed over the wait bound's horizon (module `idle_balance`).
    pub idle_with_waiters_ns: f64,
    /// Engine time, ns, spent re-prefilling what turns' sessions had cached
    /// before, decayed alike; `engine_idle` admissions are made while the
    /// first is ahead.
    pub reprefill_ns: f64,
}

/// The working set of one engine.
#[derive(Debug)]
pub struct WorkingSet<K: Eq + Hash + Clone> {
    tuning: Tuning,
    engine: EngineCapacity,
    /// Capacity estimate, tokens; `None` while the engine's is unknown.
    estimate: Option<f64>,
    /// Every session known (members, sessions waiting, sessions between
    /// stays whose history is kept), each at its [`Slot`].
    sessions: Slab<Session<K>>,
    /// Where each known session's record is in `sessions`.
    slots: KeyMap<K, Slot>,
    /// Sessions in the working set (records with a member).
    member_count: usize,
    /// The members between turns, by release and by window end.
    idle: IdleList,
    /// Members' own tokens (the shared prefix excluded), summed.
    own_sum: u64,
    /// Members' reserves (what their next turns will add), summed.
    reserve_sum: u64,
    queue: BTreeMap<(Class, u64), Slot>,
    next_seq: u64,
    /// Departed sessions whose blocks may still be cached.
    ghosts: Ghosts<K>,
    shared_prefix: u64,
    /// Running mean of what sessions' first turns hit (their
    /// `shared_credit` once reported).
    mean_first_hit: f64,
    /// The sketch of the last first-turn prompt seen: a host that passes
    /// token ids but reports no cached tokens still shows what sessions'
    /// first prompts share.
    last_first_prompt: Option<PromptSketch>,
    /// Prefill rate measured from turn reports, tokens/s (a lower bound).
    reported_rate: f64,
    /// The refill window in force, ns ([`WorkingSet::window_ns`]).
    window: u64,
    /// Whether holding sessions out pays ([`WorkingSet::holding_pays`]).
    holding: bool,
    /// Running mean of a hot turn's time (admission to release, turns
    /// admitted while holding), ns, and of the log of a tool gap's (release
    /// to the next request): a session's cycle when its cache is kept.
    /// Turns let in while running cold do not count: they last longer (the
    /// re-prefill, the engine's own queue), and counting them made the
    /// holding rule its own judge. On a small cache beside a fast engine
    /// (16 sessions, 96k tokens), running cold was measured 1.2x ahead, the
    /// working set stopped holding, the cold turns' durations then made
    /// holding look better again, and it went back to holding 3 to 5
    /// sessions: 1.22x the best cap's makespan (no gate: 1.01x); with hot
    /// turns only, 1.03x (`small-kv`).
    /// The gaps' mean is geometric because tool times are heavy-tailed: an
    /// arithmetic mean is led by the few sessions in long calls, which are
    /// not among those competing for room (measured on a workload of 1 s
    /// median tools, log-sigma 2: it made running cold look 1.5x ahead
    /// there, and following it cost 4% of makespan).
    mean_turn_ns: f64,
    mean_ln_gap: f64,
    mean_output: f64,
    /// Mean growth per turn over all sessions, for those not measured yet.
    mean_growth: f64,
    miss_rate: f64,
    parked: u64,
    /// What parks forced by the wait bound may still cost
    /// ([`super::rotation_budget`]).
    rotation_budget: RotationBudget,
    /// Engine time lost idle with sessions waiting against engine time
    /// spent re-prefilling ([`super::idle_balance`]).
    idle_balance: IdleBalance,
    /// How members' windows have ended lately: by a return within them, or
    /// by running out.
    window_outcomes: WindowOutcomes,
    /// Capacity estimates from usage answers (only when the engine gives none).
    usage_samples: VecDeque<f64>,
    /// What each of the last usage answers says a turn in flight shares
    /// with the others, tokens ([`WorkingSet::sample_sharing`]).
    sharing_samples: VecDeque<f64>,
    /// Whether any turn has reported its cached tokens.
    cached_reported: bool,
    /// How many turns the sessions that finished ran.
    lifetimes: Lifetimes,
    /// Sessions that left between turns, for ends presumed while the host
    /// tells none.
    silences: Silences,
    /// The share of the engine's time spent prefilling, from turn reports.
    prefill_share: PrefillShare,
    /// The members' (and a joining session's) figures for
    /// [`WorkingSet::fits_ahead`], kept to reuse the allocation.
    ahead: Vec<Outlook>,
}

/// What [`WorkingSet::fits_ahead`] projects of one session: its own tokens
/// now, what each of its turns adds, and the turns it has begun.
#[derive(Debug, Clone, Copy)]
struct Outlook {
    own: f64,
    growth: f64,
    started: u32,
}

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// An empty working set; until the engine's capacity is known, everyone fits.
    pub fn new(tuning: Tuning) -> Self {
        Self {
            tuning,
            engine: EngineCapacity::default(),
            estimate: None,
            sessions: Slab::new(),
            slots: KeyMap::default(),
            member_count: 0,
            idle: IdleList::default(),
            own_sum: 0,
            reserve_sum: 0,
            queue: BTreeMap::new(),
            next_seq: 0,
            ghosts: Ghosts::default(),
            shared_prefix: 0,
            mean_first_hit: 0.0,
            last_first_prompt: None,
            reported_rate: 0.0,
            window: tuning.initial_window_ns,
            holding: true,
            mean_turn_ns: 0.0,
            mean_ln_gap: 0.0,
            mean_output: 0.0,
            mean_growth: 0.0,
            miss_rate: 0.0,
            parked: 0,
            rotation_budget: RotationBudget::default(),
            idle_balance: IdleBalance::default(),
            window_outcomes: WindowOutcomes::default(),
            usage_samples: VecDeque::new(),
            sharing_samples: VecDeque::new(),
            cached_reported: false,
            lifetimes: Lifetimes::default(),
            silences: Silences::default(),
            prefill_share: PrefillShare::default(),
            ahead: Vec::new(),
        }
    }

    /// Records the engine's answer to the capacity probe. A new capacity
    /// resets the estimate to it; figures reported as 0 keep what was known.
    pub fn set_engine(&mut self, engine: EngineCapacity) {
        // A host answers on every pass, nearly always the figures it gave
        // before: nothing to do then (the window is kept in step with every
        // figure it derives from). 44 of a turn's 3,773 instructions
        // (`benches/instructions.rs`, `open_1t/working_set/hot`).
        if engine == self.engine {
            return;
        }
        if engine.tokens > 0 && engine.tokens != self.engine.tokens {
            self.engine.tokens = engine.tokens;
            self.estimate = Some(engine.tokens as f64);
        }
        if engine.block_tokens > 0 {
            self.engine.block_tokens = engine.block_tokens;
        }
        if engine.prefill_tokens_per_sec > 0.0 {
            self.engine.prefill_tokens_per_sec = engine.prefill_tokens_per_sec;
        }
        self.update_window();
    }

    /// Records a usage answer (the fraction of KV blocks held by running
    /// requests). Used only while the engine has not said its capacity:
    /// the tokens of the members in flight over that fraction estimate it.
    /// The estimate is the least of the recent samples, because a sample's
    /// errors are upward: a turn admitted but still queued in the engine,
    /// or not done generating, holds fewer blocks than it is counted for.
    /// (Only traffic that bypasses the gate errs downward, and that errs on
    /// the safe side.) Measured in the simulator with the engine's capacity
    /// hidden (seeds 1-5): with the median of the samples, `h200` ran 1.30x
    /// the best cap and `real-engine` 1.19x, queued turns having pushed the
    /// estimate up to 1.4x the true capacity; with the least, 0.99x and
    /// 0.92x, near the 0.95x and 0.92x of a gate told the capacity.
    ///
    /// A host that says the engine's capacity answers usage on every pass
    /// too, and it is not used then for the capacity (only, while the gate
    /// is blind to sharing, for the shared prefix:
    /// `sample_sharing`): that answer is inlined at the call,
    /// and the sampling is not entered: 20 of a turn's 3,206 instructions
    /// (`benches/instructions.rs`, `open_1t/working_set/hot`). (The same
    /// split of `ghost_tokens`, asked as often, cost 31 more instead: its
    /// callers' frames grew.)
    #[inline]
    pub fn observe_usage(&mut self, usage: f64) {
        if !(USAGE_SAMPLE_FLOOR..=1.0).contains(&usage) {
            return;
        }
        if self.engine.tokens > 0 {
            if self.blind_to_sharing() {
                self.sample_sharing(usage);
            }
            return;
        }
        self.sample_usage(usage);
    }

    /// Whether nothing but the usage gauge can show what sessions share:
    /// no turn has reported cached tokens and no prompt came with its ids.
    fn blind_to_sharing(&self) -> bool {
        !self.cached_reported && self.last_first_prompt.is_none()
    }

    /// A usage answer, the capacity known, seen by a gate blind to sharing:
    /// what the turns in flight share, learned from what they hold.
    ///
    /// vLLM's usage counts the blocks of the running requests, a block
    /// shared by several once. With `n` turns in flight whose prompts add up
    /// to `P` tokens, and `U` tokens in use, each turn beyond the first
    /// shares at least `(P - U) / (n - 1)`: what the turns have generated
    /// so far only adds to `U`. It says too much only while some of those
    /// turns hold less than their prompt (waiting in vLLM's queue, or part
    /// way through a chunked prefill, or a gauge read late), and admitting
    /// on too much sharing breeds more of that (longer re-prefills), so an
    /// answer below the longest prompt in flight is not taken, the least of
    /// the last [`USAGE_SAMPLES`] answers is, at most the shortest prompt
    /// in flight, and the prefix only ever grows (as from cached reports).
    ///
    /// Why: a host that passes prompt lengths and gets no cached tokens
    /// back (a proxy in front of `vllm serve` without prompt token
    /// details) has neither the reports nor the sketches the shared prefix
    /// is otherwise learned from, and counted the prefix once per session.
    /// Measured (judge, seeds 1-5, `--host-prompt length --host-report
    /// output-only --host-finish untold`): every scenario 0.9571x the best
    /// cap -> 0.9334x, `single-turn` (1,500 requests sharing a 2k-token
    /// system prompt) 1.124 -> 1.024, `mixed` 0.699 -> 0.628, no scenario
    /// worse by more than 0.016 (`h200`, 0.962 -> 0.978); held-out seeds
    /// 6-10 0.9604 -> 0.9441; a host of the same kind that tells ends
    /// 0.9455 -> 0.9222. The median of the answers instead of the least:
    /// 0.9389, `h200` 1.051 (a seed at 1.27: thrashing turns re-prefilling
    /// in chunks held less than their prompts, the estimate rose, more
    /// joined, more thrashed). Every other host is untouched: one that
    /// reports cached tokens or passes ids never samples. A usage answer
    /// that is not the engine's (a stand-in) reads as sharing: see
    /// [`crate::Probe::kv_cache_usage`].
    fn sample_sharing(&mut self, usage: f64) {
        let (mut turns, mut prompts) = (0u64, 0u64);
        let (mut shortest, mut longest) = (u64::MAX, 0);
        for (s, m) in self.members() {
            if m.in_flight > 0 {
                turns += 1;
                let prompt = self.sessions[s].history.last_prompt;
                prompts += prompt;
                shortest = shortest.min(prompt);
                longest = longest.max(prompt);
            }
        }
        let used = usage * self.engine.tokens as f64;
        // The longest prompt alone holds more than that: some turn is not
        // in the engine's blocks yet (queued there, or the gauge is late).
        if turns < 2 || used < longest as f64 {
            return;
        }
        let saved = ((prompts as f64 - used) / (turns - 1) as f64)
            .clamp(0.0, shortest.saturating_sub(1) as f64);
        if self.sharing_samples.len() == USAGE_SAMPLES {
            self.sharing_samples.pop_front();
        }
        self.sharing_samples.push_back(saved);
        let least = self.sharing_samples.iter().copied().fold(saved, f64::min);
        let block = self.block_tokens();
        let shared = least as u64 / block * block;
        if shared > self.shared_prefix {
            self.raise_shared_prefix(shared);
        }
    }

    /// The prefix sessions share is now `shared` tokens: new sessions are
    /// counted without it, and so are the members, which counted it as their own.
    fn raise_shared_prefix(&mut self, shared: u64) {
        self.shared_prefix = shared;
        self.mean_first_hit = shared as f64;
        let mut own_sum = 0;
        for (_, r) in self.sessions.iter_mut() {
            if let Some(m) = &r.member {
                r.history.shared_credit = shared;
                own_sum += own_tokens(&r.history, m.footprint, shared);
            }
        }
        self.own_sum = own_sum;
    }

    /// [`WorkingSet::observe_usage`] of an answer that estimates the capacity.
    fn sample_usage(&mut self, usage: f64) {
        let in_flight: u64 = self
            .members()
            .filter(|(_, m)| m.in_flight > 0)
            .map(|(s, m)| self.own(s, m.footprint))
            .sum();
        if in_flight == 0 {
            return;
        }
        let sample = (self.shared_prefix + in_flight) as f64 / usage;
        if self.usage_samples.len() == USAGE_SAMPLES {
            self.usage_samples.pop_front();
        }
        self.usage_samples.push_back(sample);
        let least = self.usage_samples.iter().copied().fold(sample, f64::min);
        self.estimate = Some(least);
        self.update_window();
    }

    /// Capacity in force, tokens (infinite while unknown).
    pub fn capacity(&self) -> f64 {
        self.estimate.unwrap_or(f64::INFINITY)
    }

    /// How long the engine takes to prefill its whole cache, ns: a
    /// member's window.
    pub fn window_ns(&self) -> u64 {
        self.window
    }

    /// The prefill rate in force, tokens/s: the engine's, else the one
    /// measured from turn reports (0 while neither is known).
    fn prefill_rate(&self) -> f64 {
        if self.engine.prefill_tokens_per_sec > 0.0 {
            self.engine.prefill_tokens_per_sec
        } else {
            self.reported_rate
        }
    }

    /// Recomputes the refill window after the capacity estimate or the
    /// prefill rate changed (kept rather than derived on each use: the
    /// open path asks for it several times per turn).
    fn update_window(&mut self) {
        let rate = self.prefill_rate();
        self.window = match self.estimate {
            Some(c) if rate > 0.0 => ((c / rate) * 1e9).min(u64::MAX as f64 / 2.0) as u64,
            _ => self.tuning.initial_window_ns,
        };
    }

    fn wait_bound_ns(&self) -> u64 {
        bound_ns(self.window_ns(), self.tuning.wait_bound_windows)
    }

    /// Tokens per KV block (1 while unknown).
    fn block_tokens(&self) -> u64 {
        u64::from(self.engine.block_tokens.max(1))
    }

    fn blocks(&self, tokens: u64) -> u64 {
        round_up(tokens, self.block_tokens())
    }

    /// Tokens counted now (nothing while the working set is empty).
    pub fn load(&self) -> u64 {
        if self.member_count == 0 {
            return 0;
        }
        self.counted()
    }

    /// The shared prefix once, the members' own tokens, the ghosts'.
    fn counted(&self) -> u64 {
        self.shared_prefix + self.own_sum + self.ghost_tokens()
    }

    fn oldest_idle_release(&self) -> Option<u64> {
        let first = self.idle.first()?;
        Some(self.sessions[first].member().released_at)
    }

    /// Ghosts freed after the oldest member between turns still hold the
    /// cache that the next allocations would otherwise take from it.
    fn ghost_tokens(&self) -> u64 {
        if self.ghosts.is_empty() {
            return 0;
        }
        let Some(oldest) = self.oldest_idle_release() else {
            return 0;
        };
        self.ghosts.own_freed_after(oldest)
    }

    fn prune_ghosts(&mut self) {
        match self.oldest_idle_release() {
            // Nobody between turns: every ghost is older than anything a
            // member will free, so none protects anything any more.
            None => self.ghosts.clear(),
            Some(oldest) => self.ghosts.drop_freed_by(oldest),
        }
    }

    /// What a session's first turn is expected to hit before it reports
    /// it: what first turns have hit so far, in whole blocks, at most the
    /// shared prefix. Counting a new session's shared prefix as its own
    /// until its first turn reports (as was done) counted the prefix once
    /// per session in flight: on single-turn requests sharing a 2k-token
    /// system prompt, overloaded at 20/s, that halved the turns in flight
    /// and cost 8% of makespan against no gate (smaller batches: 4,262
    /// engine steps against 2,513).
    fn expected_first_hit(&self) -> u64 {
        let block = u64::from(self.engine.block_tokens.max(1));
        let mean = (self.mean_first_hit as u64).min(self.shared_prefix);
        mean / block * block
    }

    /// Keeps how far the first prompt of the session at `s` begins like the
    /// last first prompt seen, and keeps its sketch for the next.
    fn compare_first_prompt(&mut self, s: Slot, sketch: &PromptSketch) {
        let block = self.block_tokens();
        if let Some(last) = &self.last_first_prompt {
            let common = last
                .sampled_common_prefix(sketch)
                .min(sketch.len().saturating_sub(1));
            self.sessions[s].history.sketched_shared = common / block * block;
        }
        match &mut self.last_first_prompt {
            Some(last) => last.clone_from(sketch),
            None => self.last_first_prompt = Some(sketch.clone()),
        }
    }

    /// The own tokens ([`own_tokens`]) out of `footprint` of the session at `s`.
    fn own(&self, s: Slot, footprint: u64) -> u64 {
        own_tokens(&self.sessions[s].history, footprint, self.shared_prefix)
    }

    fn footprint(&self, s: Slot, prompt_len: u64) -> u64 {
        self.blocks(prompt_len.saturating_add(self.expected_output(s)))
    }

    fn expected_output(&self, s: Slot) -> u64 {
        expected_output(&self.sessions[s].history, self.mean_output)
    }

    /// Refreshes a member's reserve from what is known of it now.
    fn refresh_reserve(&mut self, s: Slot) {
        let h = &self.sessions[s].history;
        let reserve = reserve_for(
            &self.lifetimes,
            h,
            self.mean_output,
            self.mean_growth,
            h.turns + 1,
        );
        if let Some(m) = self.sessions[s].member.as_mut() {
            self.reserve_sum = self.reserve_sum - m.reserve + reserve;
            m.reserve = reserve;
        }
    }

    /// Learns how much a turn's prompt grew beyond the last turn's prompt
    /// and output (the tool result), on the first request of the turn.
    fn learn_growth(&mut self, s: Slot, prompt_len: u64) {
        let h = &mut self.sessions[s].history;
        // A retry of the same turn asks with the prompt already seen.
        if h.turns == 0 || prompt_len <= h.last_prompt {
            return;
        }
        let grown = prompt_len.saturating_sub(h.last_prompt + h.last_output) as f64;
        h.growth = if h.growth == 0.0 {
            grown
        } else {
            0.7 * h.growth + 0.3 * grown
        };
        self.mean_growth = running_mean(self.mean_growth, grown);
    }

    /// A turn of `key` with a `prompt_len`-token prompt asks to be admitted
    /// at `now`. A session already queued keeps its place (a retry does not
    /// lose it); a grant handed over while it slept is collected here.
    pub fn request(&mut self, key: &K, prompt_len: u64, now: u64) -> Verdict {
        self.account_idle(now);
        self.request_in_stay(key, SlotHint::NONE, prompt_len, None, now)
            .0
    }

    /// [`WorkingSet::request`] with the prompt's sketch, when the driver
    /// has the prompt's tokens: a member's turn is then expected to hit
    /// only what the session's previous prompt began with
    /// ([`PromptSketch`]).
    pub fn request_sketched(
        &mut self,
        key: &K,
        prompt_len: u64,
        sketch: Option<&PromptSketch>,
        now: u64,
    ) -> Verdict {
        self.account_idle(now);
        self.request_in_stay(key, SlotHint::NONE, prompt_len, sketch, now)
            .0
    }

    /// [`WorkingSet::request_sketched`], and then the stay the turn belongs
    /// to ([`WorkingSet::membership`], if it was admitted, and the record's
    /// slot) from the same record: the core asks both on every pass. The
    /// record is taken at `hint` if it is `key`'s there. The caller has
    /// brought the idle balance up to `now` ([`WorkingSet::account_idle`]).
    pub(crate) fn request_in_stay(
        &mut self,
        key: &K,
        hint: SlotHint,
        prompt_len: u64,
        sketch: Option<&PromptSketch>,
        now: u64,
    ) -> (Verdict, Stay) {
        self.end_windows(now);
        let s = self.slot_of(key, hint);
        let verdict = self.request_at(s, prompt_len, sketch, now);
        let stay = Stay {
            membership: self.membership_at(Some(s)),
            slot: SlotHint::of(s),
        };
        (verdict, stay)
    }

    /// The slot of `key`'s record: at `hint` if it is there, else looked up
    /// (and made empty if the session is new).
    fn slot_of(&mut self, key: &K, hint: SlotHint) -> Slot {
        match hint.get() {
            Some(s) if self.sessions.get(s).is_some_and(|r| r.key == *key) => s,
            _ => self.slot_or_insert(key),
        }
    }

    /// [`WorkingSet::request`] of the session at `s`.
    fn request_at(
        &mut self,
        s: Slot,
        prompt_len: u64,
        sketch: Option<&PromptSketch>,
        now: u64,
    ) -> Verdict {
        if let Some(grant) = self.sessions[s].history.grant.take() {
            return grant;
        }
        let block = self.block_tokens();
        let h = &mut self.sessions[s].history;
        if h.turns > 0 && h.gap_open {
            let cached_before = (h.last_prompt + h.last_output).min(prompt_len.saturating_sub(1));
            h.could_hit = cached_before / block * block;
        }
        self.take_back_presumed_end(s);
        self.learn_growth(s, prompt_len);
        if self.sessions[s].member.is_some() {
            return self.member_request(s, prompt_len, sketch, now);
        }
        // A first turn not yet in the working set is counted without the
        // prefix first turns have shared, until its own report says.
        let first_turn_credit =
            (self.sessions[s].history.turns == 0).then(|| self.expected_first_hit());
        // Once per session: a retry or a woken waiter asks again with the
        // same prompt, whose sketch is then the last one seen.
        let first_ask = self.sessions[s].history.last_sketch.is_none();
        if let (Some(_), Some(new), true) = (first_turn_credit, sketch, first_ask) {
            self.compare_first_prompt(s, new);
        }
        let h = &mut self.sessions[s].history;
        end_gap(h, now, &mut self.mean_ln_gap, &mut self.silences);
        h.queued_prompt = prompt_len;
        if let Some(credit) = first_turn_credit {
            h.shared_credit = credit;
        }
        keep_sketch(h, sketch);
        let h = &mut self.sessions[s].history;
        if h.queued.is_none() {
            let class = if h.returning {
                Class::Returning
            } else {
                Class::New
            };
            h.queued = Some((class, self.next_seq));
            h.queued_at = now;
            self.queue.insert((class, self.next_seq), s);
            self.next_seq += 1;
        }
        if self.queue.values().next() != Some(&s) {
            if self.cold_head_that_fits() == Some(s) {
                self.join(s, prompt_len, now);
                return Verdict::Fits;
            }
            return Verdict::Wait;
        }
        self.update_holding();
        let verdict = self.head_verdict(s, prompt_len, now);
        if verdict != Verdict::Wait {
            self.join(s, prompt_len, now);
        }
        verdict
    }

    /// A member's turn asks, with a `prompt_len`-token prompt: it is let in
    /// as a member, its footprint grows to the prompt's, its reserve is
    /// estimated again, and members between turns are parked if the
    /// growth no longer fits.
    ///
    /// The record is borrowed once for all of it, the working set's figures
    /// it needs read first: each `sessions[s]` is a bounds and an occupancy
    /// check, and the turn made fourteen of them when each step looked the
    /// record up for itself (`grow_member`, `refresh_reserve`, ...).
    fn member_request(
        &mut self,
        s: Slot,
        prompt_len: u64,
        sketch: Option<&PromptSketch>,
        now: u64,
    ) -> Verdict {
        // Unlinked first: that needs its neighbours' records (and it is
        // listed only while no turn of it is in flight).
        self.idle.remove(&mut self.sessions, s);
        let block = self.block_tokens();
        let shared_prefix = self.shared_prefix;
        let (mean_output, mean_growth) = (self.mean_output, self.mean_growth);
        let Session {
            history, member, ..
        } = &mut self.sessions[s];
        let (h, m) = (history, member.as_mut().expect("a member asks"));
        // Back within its window (a retry of a turn in flight is not).
        if h.gap_open {
            self.window_outcomes.record(true);
        }
        end_gap(h, now, &mut self.mean_ln_gap, &mut self.silences);
        h.queued_prompt = prompt_len;
        // Only a member's turn has an expectation (and only it is compared
        // with the last sketch): read before the sketch is replaced.
        h.expect_hit = expected_hit(h, prompt_len, sketch);
        h.expect_seen = sketch.is_some() && h.last_sketch.is_some();
        keep_sketch(h, sketch);
        h.turn_cold = !self.holding;
        let output = expected_output(h, mean_output);
        let footprint = round_up(prompt_len.saturating_add(output), block);
        m.in_flight += 1;
        if footprint > m.footprint {
            let own_old = own_tokens(h, m.footprint, shared_prefix);
            self.own_sum = self.own_sum - own_old + own_tokens(h, footprint, shared_prefix);
            m.footprint = footprint;
        }
        h.last_prompt = prompt_len;
        let reserve = reserve_for(&self.lifetimes, h, mean_output, mean_growth, h.turns + 1);
        self.reserve_sum = self.reserve_sum - m.reserve + reserve;
        m.reserve = reserve;
        self.shrink_to_fit(now, Some(s));
        Verdict::Member
    }

    /// Every member, with its slot (in no particular order).
    fn members(&self) -> impl Iterator<Item = (Slot, &Member)> {
        self.sessions
            .iter()
            .filter_map(|(s, r)| Some((s, r.member.as_ref()?)))
    }

    /// The slot of `key`'s record, made empty if the session is new.
    fn slot_or_insert(&mut self, key: &K) -> Slot {
        if let Some(&s) = self.slots.get(key) {
            return s;
        }
        let s = self.sessions.insert(Session {
            key: key.clone(),
            history: History::default(),
            member: None,
        });
        self.slots.insert(key.clone(), s);
        s
    }

    /// Whether holding sessions out pays at all. Holding keeps the cache hot
    /// for the `K` sessions that fit, which then serve about `K / T` turns a
    /// second (`T`: the measured cycle, a turn and a tool gap). Running
    /// everyone cold serves at most `N / T` (all `N` active sessions), at
    /// most `r / f` (each turn re-prefills its history `f`, at the prefill
    /// rate `r`), and at most `K / turn` (a turn in flight needs its history
    /// in the cache). When the cold bound is clearly ahead
    /// ([`Tuning::cold_margin`]), as when tool calls are long next to turns
    /// and the engine has room for the re-prefill, holding sessions out only
    /// idles them: measured on `mid-tools` (8 s tools, 1 s turns), holding
    /// cost 17% of makespan against no gate while keeping 34% of prompts
    /// cached. Unknown figures (no rate, no capacity, no cycle yet) keep
    /// holding. The answer is the one last decided for a queue head, with a
    /// band against flipping on every session.
    pub fn holding_pays(&self) -> bool {
        self.holding
    }

    /// The cold bound over the hot figure ([`WorkingSet::holding_pays`]),
    /// or `None` while a figure is unknown.
    fn cold_over_hot(&self) -> Option<f64> {
        let rate = self.prefill_rate();
        let cycle = self.cycle_ns() / 1e9;
        let turn = self.mean_turn_ns / 1e9;
        let capacity = self.capacity();
        if rate <= 0.0 || turn <= 0.0 || self.member_count == 0 || !capacity.is_finite() {
            return None;
        }
        let footprint =
            (self.own_sum as f64 / self.member_count as f64 + self.shared_prefix as f64).max(1.0);
        let active = (self.member_count + self.queue.len()) as f64;
        let fit = (capacity / footprint).max(1.0).min(active);
        let hot = fit / cycle;
        let cold = (active / cycle).min(rate / footprint).min(fit / turn);
        Some(cold / hot)
    }

    /// A hot session's measured cycle, ns: its turn and its tool gap (0
    /// while no turn has ended).
    fn cycle_ns(&self) -> f64 {
        let gap = if self.mean_ln_gap == 0.0 {
            0.0
        } else {
            self.mean_ln_gap.exp()
        };
        self.mean_turn_ns + gap
    }

    /// How many turns ahead [`WorkingSet::fits_ahead`] looks: the turns a
    /// hot session runs in one refill window, stretched by `1 / (1 - p)`
    /// where `p` is the measured share of the engine's time spent
    /// prefilling ([`PrefillShare`]); at least 1, and 1 while the cycle is
    /// unknown.
    ///
    /// A window is what holding a footprint out is worth against
    /// re-prefilling it (the module's notes): an overflow within it parks a
    /// member whose re-prefill costs more than the concurrency the joining
    /// session brought until then. That concurrency is worth only the
    /// batched part of the engine's work, `1 - p` of it (prefill costs the
    /// same alone or batched), so the break-even lies `1 / (1 - p)` windows
    /// ahead. Measured (judge, seeds 1-5): on the real-engine benchmark with
    /// fitted step costs (p about 0.6, 3 turns a window) 1.059x the best
    /// cap without the stretch, 1.037x with it; on the GPU scenarios (p
    /// 0.05-0.15) nothing moves but `poisson` (0.981 to 0.990) and
    /// `staggered` (0.975 to 0.981; on held-out seeds 6-10, 0.972 to 0.990);
    /// the built-in `real-engine`, whose placeholder costs make a turn
    /// mostly decoding yet measure p about 0.5, loses (0.920 to 0.981; on
    /// seeds 6-10, 0.951 to 0.977). On the real engine
    /// (24 sessions x 10 turns, quiet machine): without the stretch the
    /// horizon was 1-2 turns there (a 2.2 s window against 1.5 s cycles)
    /// and kvgate ran 1.06x and 1.09x cap-3 in two runs; with it, 3-5 turns
    /// and 0.985x, 1.07x and 1.02x the best cap in three, 76-77% hits, a
    /// tenth fewer tokens prefilled.
    fn horizon_turns(&self) -> u32 {
        let cycle = self.cycle_ns();
        if cycle <= 0.0 {
            return 1;
        }
        let batched = 1.0 - self.prefill_share.share(self.prefill_rate());
        (self.window_ns() as f64 / (cycle * batched)).clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// Whether the members, with the session at `joining` (needing `need`
    /// more tokens) among them, still fit as they grow over the next
    /// [`WorkingSet::horizon_turns`] turns. Each session's tokens `k` turns
    /// ahead are its own now plus `k` turns of its growth (its reserve),
    /// weighted by the chance that it is still running then, from the turn
    /// counts of the sessions that finished ([`Lifetimes::continuing`]); a
    /// session that has outlived every one seen is taken as it will be
    /// after its next turn. Before any session has finished, nothing is
    /// known of how long they run, and this adds nothing to
    /// [`WorkingSet::fits_beside_members`].
    ///
    /// Measured in the simulator (judge, seeds 1-5) on the real-engine
    /// benchmark with step costs fitted to the CPU engine
    /// (`integrations/vllm/bench/real-engine-fitted.toml`), where a turn's
    /// re-prefill takes about as long as the turn: 1.112x the best cap's
    /// makespan with one turn's growth reserved; 1.059x with this over the
    /// window's turns alone (3 there), 1.037x over the stretched horizon
    /// ([`WorkingSet::horizon_turns`]); the tokens re-prefilled fall by
    /// about a sixth. Over the window's turns alone every other scenario
    /// stayed within 1%, on seeds 1-5 and 6-10 (`staggered`'s worst seed
    /// 1.000 to 1.064: one chaotic seed, its hits unchanged); the stretch's
    /// own costs are under `horizon_turns`. Counting the joining session's
    /// own next turn as well gave 1.046x instead of 1.059x, within the
    /// seeds' spread, so the one-turn test is left as it was. Measured and
    /// not kept:
    /// - each member's whole expected life instead of a horizon (the peak
    ///   of the expected load however far ahead): fitted 1.028, but `waves`
    ///   0.812 to 0.865, `waves-async` 0.914 to 0.949, the built-in
    ///   `real-engine` 0.918 to 0.999: the concurrency is worth more there;
    /// - every member at its expected final size, unweighted: fitted 1.033,
    ///   but `poisson` 1.13 and `waves-async` 1.09 (members that will have
    ///   finished counted as growing);
    /// - assuming, before any session finishes, that every member runs the
    ///   whole horizon: fitted 1.054.
    fn fits_ahead(&mut self, joining: Slot, need: u64) -> bool {
        // Asked first: it needs no `exp` (the horizon's gap mean does).
        if self.lifetimes.is_empty() {
            return true;
        }
        let horizon = self.horizon_turns();
        if horizon < 2 {
            return true;
        }
        // Nobody has run past the longest life seen: further ahead only the
        // sessions that outlived it remain, as they are.
        let last = horizon.min(self.lifetimes.longest());
        let mut ahead = std::mem::take(&mut self.ahead);
        ahead.clear();
        ahead.extend(self.members().map(|(s, m)| Outlook {
            own: self.own(s, m.footprint) as f64,
            growth: next_turn_growth(
                &self.sessions[s].history,
                self.mean_output,
                self.mean_growth,
            ) as f64,
            started: self.sessions[s].history.turns + u32::from(m.in_flight > 0),
        }));
        let h = &self.sessions[joining].history;
        ahead.push(Outlook {
            own: need as f64,
            growth: next_turn_growth(h, self.mean_output, self.mean_growth) as f64,
            started: h.turns + 1,
        });
        let base = (self.shared_prefix + self.ghost_tokens()) as f64;
        let capacity = self.capacity();
        // One turn ahead is `fits_beside_members`' own test.
        let fits = (2..=last).all(|k| {
            let load: f64 = ahead
                .iter()
                .map(|o| match self.lifetimes.continuing(o.started, k) {
                    Some(p) => p * (o.own + o.growth * f64::from(k)),
                    None => o.own + o.growth,
                })
                .sum();
            base + load <= capacity
        });
        self.ahead = ahead;
        fits
    }

    /// Decides again whether holding pays. Holding stops once running cold
    /// is [`Tuning::cold_margin`] ahead and resumes only once it is no
    /// longer [`Tuning::cold_margin`]` / `[`HOLDING_HYSTERESIS`] ahead: the
    /// figures move by a session at a time, and without the band the answer
    /// flipped about 100 times per `mid-tools` run, each return to holding
    /// parking every member beyond the cache at once.
    /// An infinite margin always holds: no finite lead reaches it.
    fn update_holding(&mut self) {
        let margin = self.tuning.cold_margin;
        self.holding = match self.cold_over_hot() {
            None => true,
            Some(ratio) if self.holding => ratio < margin,
            Some(ratio) => ratio < margin / HOLDING_HYSTERESIS,
        };
    }

    fn head_verdict(&mut self, s: Slot, prompt_len: u64, now: u64) -> Verdict {
        if self.member_count == 0 {
            return Verdict::Empty;
        }
        if !self.holding {
            return Verdict::RunningColdPays;
        }
        let need = self.need(s, prompt_len);
        let fits = |ws: &Self| ws.fits_beside_members(need);
        if fits(self) && self.fits_ahead(s, need) {
            return Verdict::Fits;
        }
        // The engine has nothing to run while this head waits, and idling
        // has cost more than re-prefilling ([`super::idle_balance`]): it
        // goes in once the engine has been empty for as long as the member
        // it displaces will take to re-prefill (ski rental: a short lull,
        // as members' tool calls end, is not worth a displacement).
        if self.idle_pays(need, now) {
            self.park_lru_until_fits(need, now);
            return Verdict::EngineIdle;
        }
        // Past the bound, members between turns make room for it, least
        // recently released first, for its turn and their next ones (not a
        // window ahead: the bound is a promise, and the room it takes is
        // what the turns about to run need); members in flight are never
        // cut short, so it may still have to wait for one of them to end.
        // The parks it forces are paid from the rotation budget: while the
        // parks forced for the heads before it are being paid off, it waits
        // as before its bound (a new session may still go in beside it).
        if now >= self.bound_start(s).saturating_add(self.wait_bound_ns())
            && self.rotation_allowed(now)
        {
            let parked = self.park_lru_until_fits(need, now);
            self.rotation_budget.spend(parked);
            if fits(self) || self.member_count == 0 {
                return Verdict::WaitBound;
            }
            self.sessions[s].history.past_bound = true;
        }
        Verdict::Wait
    }

    /// Parks members between turns, least recently released first, until
    /// `need` more tokens fit beside the rest (or nobody is left to park).
    /// Returns the parked members' own tokens: what their returns will
    /// re-prefill.
    fn park_lru_until_fits(&mut self, need: u64, now: u64) -> u64 {
        let own_before = self.own_sum;
        while !self.fits_beside_members(need) && self.park_lru(now, None) {}
        own_before.saturating_sub(self.own_sum)
    }

    /// What the rotation budget refills by, tokens a second: `1 / B` of
    /// the engine's prefill rate (`B` the wait bound in windows), so that
    /// forced parks re-prefill at most one cache per `B` windows; 0 while
    /// the rate is unknown (nothing to measure the cost against: the
    /// budget is not consulted).
    fn rotation_refill_rate(&self) -> f64 {
        let windows = self.tuning.wait_bound_windows;
        if windows > 0.0 && windows.is_finite() {
            self.prefill_rate() / windows
        } else {
            0.0
        }
    }

    /// Whether the wait bound may park members at `now`
    /// ([`super::rotation_budget`]).
    fn rotation_allowed(&mut self, now: u64) -> bool {
        let per_sec = self.rotation_refill_rate();
        if per_sec <= 0.0 {
            return true;
        }
        let cap = self.capacity();
        self.rotation_budget.refill(now, per_sec, cap);
        self.rotation_budget.allows()
    }

    /// When the wait bound's clock started for the session at `s`: when it
    /// queued (a retry keeps its place and its clock; a parked member
    /// queues anew when it asks again).
    fn bound_start(&self, s: Slot) -> u64 {
        self.sessions[s].history.queued_at
    }

    /// The first new session in line, when the head of the line is a
    /// returning session that does not fit and it does: room the head
    /// cannot use goes to it rather than stay idle. New sessions still go
    /// in the order they came; returning ones still go first whenever they
    /// fit. Measured in the simulator (seeds 1-5, and 6-10 held out): on
    /// `staggered` and `poisson`, where sessions keep arriving while the
    /// admitted ones outgrow the cache, strict precedence kept the last
    /// arrivals out for up to 135 s behind returning sessions too large for
    /// the room that freed (makespan 1.04 and 0.99 of the best cap; with
    /// this, 0.97 and 0.98); elsewhere nothing changes. A head past its wait
    /// bound takes precedence again: members are parked for it.
    fn cold_head_that_fits(&mut self) -> Option<Slot> {
        let (&(class, _), &head) = self.queue.first_key_value()?;
        let h = &self.sessions[head].history;
        if class != Class::Returning || h.past_bound || self.member_count == 0 {
            return None;
        }
        let (_, &cold) = self.queue.range((Class::New, 0)..).next()?;
        let need = |ws: &Self, s: Slot| ws.need(s, ws.sessions[s].history.queued_prompt);
        let (head_need, cold_need) = (need(self, head), need(self, cold));
        let fits = |ws: &mut Self, s: Slot, need: u64| {
            ws.fits_beside_members(need) && ws.fits_ahead(s, need)
        };
        (!fits(self, head, head_need) && fits(self, cold, cold_need)).then_some(cold)
    }

    /// The tokens a session outside the working set would add by joining
    /// with a `prompt_len`-token prompt: its footprint, less the shared
    /// prefix already counted.
    fn need(&self, s: Slot, prompt_len: u64) -> u64 {
        self.own(s, self.footprint(s, prompt_len))
    }

    /// Whether `need` more tokens fit: beside what is counted now (the
    /// shared prefix included, even if the members are parked to make
    /// room) and the room the members' next turns will take.
    fn fits_beside_members(&self, need: u64) -> bool {
        (self.counted() + self.reserve_sum + need) as f64 <= self.capacity()
    }

    fn dequeue(&mut self, s: Slot) {
        let h = &mut self.sessions[s].history;
        h.past_bound = false;
        if let Some(pos) = h.queued.take() {
            self.queue.remove(&pos);
        }
    }

    fn join(&mut self, s: Slot, prompt_len: u64, now: u64) {
        self.dequeue(s);
        // Its own ghost no longer counts: those blocks are its own again.
        let key = &self.sessions[s].key;
        self.ghosts.forget(key);
        let footprint = self.footprint(s, prompt_len);
        self.own_sum += self.own(s, footprint);
        self.next_seq += 1;
        let before = self.sessions[s].member.replace(Member {
            footprint,
            in_flight: 1,
            released_at: now,
            joined: self.next_seq,
            reserve: 0,
            idle: Links::default(),
        });
        debug_assert!(before.is_none(), "only a non-member joins");
        self.member_count += 1;
        self.refresh_reserve(s);
        let h = &mut self.sessions[s].history;
        h.returning = false;
        h.last_prompt = prompt_len;
        h.turn_cold = !self.holding;
    }

    /// Takes the member out of the record at `s` (and out of the index of
    /// members between turns), if the session is one.
    fn take_member(&mut self, s: Slot) -> Option<Member> {
        self.sessions[s].member.as_ref()?;
        self.idle.remove(&mut self.sessions, s);
        self.member_count -= 1;
        self.sessions[s].member.take()
    }

    /// The attempt of `key` is gone (timed out, cancelled, its gate closed):
    /// it leaves the queue, and a grant it never collected is undone.
    pub fn withdraw(&mut self, key: &K) {
        let Some(&s) = self.slots.get(key) else {
            return;
        };
        self.dequeue(s);
        if self.sessions[s].history.grant.take().is_some() {
            // It never ran: nothing of it is cached beyond what was before.
            if let Some(m) = self.take_member(s) {
                self.own_sum -= self.own(s, m.footprint);
                self.reserve_sum -= m.reserve;
            }
            self.prune_ghosts();
        }
    }

    /// Forgets what was learned of an idle session the host no longer
    /// tracks (the core retires its record): bounds memory.
    pub fn forget(&mut self, key: &K, now: u64) {
        self.account_idle(now);
        self.end(key, now);
    }

    /// Which stay of `key` in the working set a turn admitted now belongs
    /// to (0: none): a release names it, so a lease granted before the
    /// session was finished and began again cannot end the new stay's turn.
    pub fn membership(&self, key: &K) -> u64 {
        self.membership_at(self.slots.get(key).copied())
    }

    /// [`WorkingSet::membership`] of the session at `s`, if it is known.
    fn membership_at(&self, s: Option<Slot>) -> u64 {
        s.and_then(|s| self.sessions[s].member.as_ref())
            .map_or(0, |m| m.joined)
    }

    /// A turn of `key` admitted at `admitted_at`, during its current stay
    /// in the working set, ended at `now`.
    pub fn release(
        &mut self,
        key: &K,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        let membership = self.membership(key);
        self.release_of(key, prompt_len, report, admitted_at, membership, now);
    }

    /// A turn of `key` admitted at `admitted_at` during its stay
    /// `membership` ([`WorkingSet::membership`]) ended at `now`. A turn of an
    /// earlier stay (the session was finished meanwhile, and maybe began
    /// again) changes nothing: what it would teach belongs to a session
    /// that is gone.
    pub fn release_of(
        &mut self,
        key: &K,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        membership: u64,
        now: u64,
    ) {
        self.account_idle(now);
        let slot = self.slots.get(key).copied();
        self.release_at(slot, prompt_len, report, admitted_at, membership, now);
    }

    /// [`WorkingSet::release_of`] of a turn admitted in `stay` (as
    /// [`WorkingSet::request_in_stay`] answered it): the record is taken at
    /// the stay's slot while that stay goes on, and `key` is looked up only
    /// when it does not.
    pub(crate) fn release_in_stay(
        &mut self,
        key: &K,
        stay: Stay,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        let slot = match self.slot_of_stay(stay) {
            Some(s) => Some(s),
            None => self.slots.get(key).copied(),
        };
        debug_assert!(
            slot.is_none_or(|s| self.sessions[s].key == *key),
            "a stay's slot holds its own session"
        );
        self.release_at(slot, prompt_len, report, admitted_at, stay.membership, now);
    }

    /// The slot of the record that is in `stay` now, if that stay goes on.
    /// A member's `joined` is unique to its stay (no two joins share it),
    /// so the member found there with it is the stay's own session: the
    /// slot the key's lookup would give.
    fn slot_of_stay(&self, stay: Stay) -> Option<Slot> {
        let s = stay.slot.get()?;
        let member = self.sessions.get(s)?.member.as_ref()?;
        (stay.membership != 0 && member.joined == stay.membership).then_some(s)
    }

    /// [`WorkingSet::release_of`] of the session whose record is at `slot`
    /// (`None`: not known).
    fn release_at(
        &mut self,
        slot: Option<Slot>,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        membership: u64,
        now: u64,
    ) {
        if self.membership_at(slot) != membership {
            self.end_windows(now);
            return;
        }
        match slot {
            Some(s) if self.sessions[s].member.is_some() => {
                self.member_release(s, prompt_len, report, admitted_at, now);
            }
            _ => self.outsider_release(slot, prompt_len, report, admitted_at, now),
        }
    }

    /// A member's turn ended at `now`: what it taught is learned, its
    /// footprint is its prompt and output now, and between turns it keeps
    /// its place for a window (if its tool calls usually end within one),
    /// listed by its release.
    ///
    /// As for its request ([`WorkingSet::member_request`]), the record is
    /// borrowed once, after learning (which may change the shared prefix
    /// and the means its figures take).
    fn member_release(
        &mut self,
        s: Slot,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        // Own tokens before this turn's report changes the session's credit.
        let own_old = self.own(s, self.sessions[s].member().footprint);
        if !self.sessions[s].history.turn_cold {
            let turn = now.saturating_sub(admitted_at) as f64;
            self.mean_turn_ns = running_mean(self.mean_turn_ns, turn);
        }
        self.learn(Some(s), prompt_len, report, admitted_at, now);
        let refill = self.window_ns();
        let block = self.block_tokens();
        let shared_prefix = self.shared_prefix;
        let (mean_output, mean_growth) = (self.mean_output, self.mean_growth);
        let Session {
            history, member, ..
        } = &mut self.sessions[s];
        let (h, m) = (history, member.as_mut().expect("a member's turn ends"));
        let output = report.output_tokens.unwrap_or(h.last_output);
        h.turns += 1;
        h.last_prompt = prompt_len;
        h.last_output = output;
        h.released_at = now;
        h.gap_open = true;
        // While ends are only presumed: sessions end after this many turns
        // (most ran exactly as many), so its room is not held for a turn
        // that is likely not coming. A host that tells ends says so right
        // after the last turn.
        let keeps_window = keeps_window(&h.gaps, refill, &self.window_outcomes)
            && (self.silences.is_told() || !self.lifetimes.ends_after(h.turns));
        let footprint = round_up(prompt_len + output, block);
        let own_new = own_tokens(h, footprint, shared_prefix);
        self.own_sum = self.own_sum - own_old + own_new;
        // A member whose turn ends has it in flight, so is not listed
        // between turns: asked here, the call to unlink it is skipped, 12 of
        // a turn's 3,186 instructions (`benches/instructions.rs`,
        // `open_1t/working_set/hot`). Were it listed (a release with no turn
        // counted in flight), it is unlinked below, which reads only its
        // links, and linked in again by this release.
        let was_listed = m.in_flight == 0;
        m.footprint = footprint;
        m.in_flight = m.in_flight.saturating_sub(1);
        let between_turns = m.in_flight == 0;
        if between_turns {
            m.released_at = now;
        }
        let reserve = reserve_for(&self.lifetimes, h, mean_output, mean_growth, h.turns);
        self.reserve_sum = self.reserve_sum - m.reserve + reserve;
        m.reserve = reserve;
        if was_listed {
            self.idle.remove(&mut self.sessions, s);
        }
        self.idle.insert(&mut self.sessions, s);
        if between_turns && !keeps_window {
            self.leave(s, now, true);
        }
        self.end_windows(now);
        self.shrink_to_fit(now, None);
    }

    /// A turn of a session not in the working set ended at `now` (a turn
    /// [`WorkingSet::release`]d with no stay, as the public calls allow):
    /// what it taught is learned, and the session's history moves on.
    fn outsider_release(
        &mut self,
        slot: Option<Slot>,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        let cold = slot.is_some_and(|s| self.sessions[s].history.turn_cold);
        if !cold {
            let turn = now.saturating_sub(admitted_at) as f64;
            self.mean_turn_ns = running_mean(self.mean_turn_ns, turn);
        }
        self.learn(slot, prompt_len, report, admitted_at, now);
        if let Some(s) = slot {
            let h = &mut self.sessions[s].history;
            h.turns += 1;
            h.last_prompt = prompt_len;
            h.last_output = report.output_tokens.unwrap_or(h.last_output);
            h.released_at = now;
            h.gap_open = true;
            self.silences.left(s, now);
        }
        // As every release, it ends the windows over at `now` (learning may
        // have shortened them).
        self.end_windows(now);
        if slot.is_some() {
            self.shrink_to_fit(now, None);
        }
    }

    /// Learns output length, the shared prefix, the prefill rate and the
    /// members' misses from one turn's report (of the session at `s`, if
    /// it is known). A cold turn's misses (`History::turn_cold`) are not
    /// the capacity's: it was let in beyond what fits.
    fn learn(
        &mut self,
        s: Option<Slot>,
        prompt_len: u64,
        report: TurnReport,
        admitted_at: u64,
        now: u64,
    ) {
        if let Some(out) = report.output_tokens {
            self.mean_output = running_mean(self.mean_output, out as f64);
        }
        let Some(cached) = report.cached_tokens else {
            self.learn_shared_from_sketches(s);
            return;
        };
        self.cached_reported = true;
        self.prefill_share.record(
            prompt_len.saturating_sub(cached),
            admitted_at,
            now,
            self.window,
        );
        let block = u64::from(self.engine.block_tokens.max(1));
        let Some(s) = s else {
            return;
        };
        let rate = self.prefill_rate();
        let h = &mut self.sessions[s].history;
        if h.turns > 0 {
            if rate > 0.0 {
                let missed = h.could_hit.saturating_sub(cached);
                self.idle_balance.reprefilled(missed as f64 / rate * 1e9);
            }
            h.could_hit = 0;
        }
        if h.turns == 0 {
            h.shared_credit = cached;
            self.shared_prefix = self.shared_prefix.max(cached);
            self.mean_first_hit = running_mean(self.mean_first_hit, cached as f64);
        }
        // A hit is whole blocks and never the prompt's last token.
        let expect = (h.expect_hit.min(prompt_len.saturating_sub(1)) / block) * block;
        h.expect_hit = 0;
        let cold = h.turn_cold;
        let secs = now.saturating_sub(admitted_at).max(1) as f64 / 1e9;
        self.reported_rate = self
            .reported_rate
            .max(prompt_len.saturating_sub(cached) as f64 / secs);
        // Without the prompts' sketches (a host that passes lengths only),
        // a turn that kept more than the shared prefix but less than its
        // last prompt is taken as a clean turn that expected what it kept.
        // An agent that rewrites its history (stubs old tool results,
        // keeps the last N observations) looks like that on every turn,
        // while vLLM's free queue evicts least recently freed blocks first
        // and a session's tail first, so an eviction mostly takes all of a
        // member's own blocks or none (a whole miss still teaches, as with
        // sketches). Taking rewrites for evictions drove the estimate to
        // its floor. Measured (judge, seeds 1-5, `--host-prompt length`):
        // `elide` 1.136x the best cap -> 1.002x (with token ids 1.000x),
        // the other scenarios unchanged, and with token ids every one
        // identical; every scenario varied (seeds 1-3, lengths only)
        // 0.9486 -> 0.9428, the six `elide` variations 1.01-1.26x ->
        // 0.97-1.02x.
        let partial = cached > h.shared_credit.saturating_add(block) && cached < expect;
        let expect = if h.expect_seen || !partial {
            expect
        } else {
            cached
        };
        if expect > 0 && !cold {
            self.learn_misses(expect, cached.min(expect));
        }
        self.update_window();
    }

    /// A first turn ended with no cached tokens reported: what its prompt
    /// shares with the first prompt before it (from the sketches) stands
    /// for them as the prefix sessions share. Without it, a host whose
    /// engine returns no cached tokens (a proxy in front of `vllm serve`
    /// started without `--enable-prompt-tokens-details`) had every new
    /// session count the shared prefix as its own, and as many fewer ran
    /// at once. Measured (judge, seeds 1-5, `--host-report output-only`):
    /// `single-turn` 1.077x the best cap -> 1.024x (no gate 1.003x), every
    /// scenario together 0.9449 -> 0.9266 (a host that reports cached
    /// tokens: 0.9248, unchanged), `mixed` 0.695x -> 0.625x.
    fn learn_shared_from_sketches(&mut self, s: Option<Slot>) {
        let Some(s) = s else {
            return;
        };
        let h = &mut self.sessions[s].history;
        if h.turns != 0 || h.sketched_shared == 0 {
            return;
        }
        let shared = h.sketched_shared;
        h.shared_credit = shared;
        self.shared_prefix = self.shared_prefix.max(shared);
        self.mean_first_hit = running_mean(self.mean_first_hit, shared as f64);
    }

    /// Lowers the capacity estimate while members miss what they should
    /// have hit, and grows it back towards the engine's while they do not.
    fn learn_misses(&mut self, expect: u64, hit: u64) {
        let (Some(estimate), true) = (self.estimate, self.engine.tokens > 0) else {
            return;
        };
        let capacity = self.engine.tokens as f64;
        let miss = (expect - hit) as f64 / expect as f64;
        self.miss_rate = 0.9 * self.miss_rate + 0.1 * miss;
        let next = if self.miss_rate > self.tuning.miss_tolerance {
            estimate * (1.0 - ESTIMATE_STEP)
        } else {
            estimate + (capacity - estimate) * ESTIMATE_STEP
        };
        self.estimate = Some(next.clamp(capacity * ESTIMATE_FLOOR, capacity));
    }

    /// The session ended: it leaves the working set and the queue; its
    /// blocks stay counted as a ghost while they outlive members' blocks.
    /// An attempt of it still waiting (finishing cancels no attempt) keeps
    /// its place in line, as a new session's.
    pub fn finish(&mut self, key: &K, now: u64) {
        self.account_idle(now);
        self.silences.told();
        self.end(key, now);
    }

    /// The session at `key` ended, told or forgotten.
    fn end(&mut self, key: &K, now: u64) {
        let Some(&s) = self.slots.get(key) else {
            // As leaving does, whoever leaves.
            self.prune_ghosts();
            return;
        };
        let h = &self.sessions[s].history;
        if !h.presumed_ended {
            self.lifetimes.record(h.turns);
        }
        self.leave(s, now, false);
        let h = &mut self.sessions[s].history;
        if h.queued.is_some() {
            *h = History {
                queued: h.queued,
                queued_at: h.queued_at,
                queued_prompt: h.queued_prompt,
                ..History::default()
            };
        } else {
            self.sessions.remove(s);
            self.slots.remove(key);
        }
    }

    fn leave(&mut self, s: Slot, now: u64, returning: bool) {
        if let Some(m) = self.take_member(s) {
            let own = self.own(s, m.footprint);
            self.own_sum -= own;
            self.reserve_sum -= m.reserve;
            let released = if m.in_flight > 0 { now } else { m.released_at };
            let key = self.sessions[s].key.clone();
            self.ghosts.insert(released, own, key);
        }
        let h = &mut self.sessions[s].history;
        h.returning = returning;
        if returning && h.gap_open {
            self.silences.left(s, h.released_at);
        }
        self.prune_ghosts();
    }

    /// Parks the member between turns released longest ago (never `keep`).
    ///
    /// Released longest ago, not cheapest to re-prefill: parking the member
    /// with the fewest own tokens first was measured (judge, seeds 1-5,
    /// every scenario, kvgate against each seed's best cap) at 0.9323
    /// against 0.9237 (`h200` 0.941 to 0.991, `staggered` 0.970 to 0.991,
    /// `poisson` 0.980 to 0.999, the fitted real-engine workload 0.953 to
    /// 0.972), for a lower p99 turn latency where sessions queue behind
    /// the cache (`thrash` 34 to 29 s, `mixed` 67 to 46 s, `staggered` 52
    /// to 38 s, `h200` 53 to 44 s): more parks of short prompts, each
    /// making room sooner, and more re-prefill in all. Any order but this
    /// one also parts from the engine's: vLLM evicts the least recently
    /// freed blocks first whichever session the gate parked, so a parked
    /// short prompt keeps its blocks while the member released longest ago
    /// loses them and misses on its next turn.
    fn park_lru(&mut self, now: u64, keep: Option<Slot>) -> bool {
        let victim = self.idle.iter(&self.sessions).find(|&s| Some(s) != keep);
        let Some(victim) = victim else {
            return false;
        };
        self.leave(victim, now, true);
        self.parked += 1;
        true
    }

    /// Parks members between turns (never `keep`) while what is counted
    /// exceeds the capacity, from the first token over. Letting a small
    /// overflow stand, for the engine to absorb by evicting a session's
    /// tail, was measured with a tenth of the capacity
    /// (judge, seeds 1-5, every scenario): 0.9237 to 0.9531 of the best
    /// cap's makespan (`h200` 0.941 to 1.008, `real-engine` 0.943 to
    /// 0.993, `waves-async` 0.911 to 0.969; a quarter: 0.9574).
    ///
    /// Parking ahead was measured too and not kept: at an overflow, parking
    /// on until the members fit [`WorkingSet::horizon_turns`] ahead (as
    /// [`WorkingSet::fits_ahead`] projects; before any session finished,
    /// every member taken to run the whole horizon), so that the members
    /// their growth will push out go while their prompts are short. On the
    /// real engine most parks come in a cascade before any session has
    /// finished (all 24 first turns fit; with 800 blocks, 17 parks in the
    /// first 4 s, members 24 to 8), and returns re-prefill most of kvgate's
    /// extra tokens. Judge, seeds 1-5: 0.9237 to 0.9313 (`h200` 0.941 to
    /// 0.987, `real-engine` 0.943 to 0.978; `thrash` p99 34 to 31 s); the
    /// fitted real-engine workload, seed 7: 20.4 s to 23.6 s (measured
    /// before the prefill share stopped saturating on a fresh engine, see
    /// `PrefillShare`, when its horizon there was 9-22 turns; 5-7 since,
    /// 2-6 on the warm engine). On the real engine, rounds alternated with
    /// the base (`--policies cap-4,kvgate`): 0.962, 0.999, 0.933 of cap-4
    /// against 1.005, 0.925, 0.949, 30-40 parks against 30-34; with 800
    /// blocks, 0.865 and 0.909 of cap-6 against 0.919 and 1.001: within the
    /// rounds' spread.
    fn shrink_to_fit(&mut self, now: u64, keep: Option<Slot>) {
        // Nobody is parked while running cold pays, as last decided for a
        // queue head: deciding again here, right after letting a head in for
        // running cold, could park a member for the room it was let in
        // beyond. Without waiters the question does not arise.
        if !self.holding {
            return;
        }
        while self.load() as f64 > self.capacity() && self.park_lru(now, keep) {}
    }

    /// The member between turns whose window ends first, and when. A
    /// window lasts the refill window as it is known *now*, from the
    /// member's release, not as it was known then: the refill window
    /// shrinks as the prefill rate becomes known, and a window fixed from
    /// the first turns' low reported rate (minutes, when a whole batch
    /// arrives at once) held one member in, and with it every ghost freed
    /// after it, while the queue waited for the wait bound (`long-tools`:
    /// 124 turns waited up to 75 s behind one such member, gone to a
    /// five-minute tool call).
    fn first_window_end(&self) -> Option<(u64, Slot)> {
        let first = self.idle.first()?;
        let released = self.sessions[first].member().released_at;
        Some((released.saturating_add(self.window_ns()), first))
    }

    /// Ends the windows that are over at `now` (and brings the idle
    /// balance up to it first, as every entry point does).
    pub fn expire(&mut self, now: u64) {
        self.account_idle(now);
        self.end_windows(now);
    }

    /// [`WorkingSet::expire`] inside a change whose entry point has already
    /// brought the idle balance up to `now` (asking it again costs nothing
    /// but instructions: a turn asks it at every request and release).
    pub(crate) fn end_windows(&mut self, now: u64) {
        // Leaving drops the member from the index: each pass makes progress.
        while let Some((until, s)) = self.first_window_end().filter(|(until, _)| *until <= now) {
            // It left when its window ended, however late this is asked.
            self.window_outcomes.record(false);
            self.leave(s, until, true);
        }
        self.presume_ends(now);
    }

    /// Presumes ended the sessions quiet for long enough at `now`
    /// ([`Silences`]), while the host has told no end: each one's turn
    /// count joins the lifetimes (taken back if it asks again). Only
    /// sessions that left the working set between turns are listed; one
    /// that came back in since (by asking) is not quiet, and is skipped.
    fn presume_ends(&mut self, now: u64) {
        while let Some(gone) = self.silences.pop_due(now, self.window_ns()) {
            let s = gone.slot;
            let Some(session) = self.sessions.get(s) else {
                continue;
            };
            let h = &session.history;
            // Asked since (or a newer turn ended), or the slot is another
            // session's now. A member came back in since it was listed:
            // the release time alone cannot tell, since a session that
            // left and asked again at the same instant may end its next
            // turn at that instant too (found by the proptest of the core,
            // `tests/proptest_core_working_set.rs`, in virtual time).
            let quiet = session.member.is_none()
                && h.gap_open
                && h.released_at == gone.released_at
                && h.queued.is_none();
            if !quiet || h.presumed_ended {
                continue;
            }
            self.lifetimes.record(h.turns);
            self.sessions[s].history.presumed_ended = true;
        }
    }

    /// A session presumed ended asked again: its turn count leaves the lifetimes.
    #[inline]
    fn take_back_presumed_end(&mut self, s: Slot) {
        let h = &mut self.sessions[s].history;
        if h.presumed_ended {
            h.presumed_ended = false;
            self.lifetimes.take_back(h.turns);
        }
    }

    /// When this working set next changes by itself: the earliest window
    /// end, or the queue head reaching the wait bound.
    #[inline]
    pub fn next_deadline(&self) -> Option<u64> {
        let window = self.first_window_end().map(|(until, _)| until);
        // Asked after every change, nearly always with nobody waiting: as
        // in `admit_waiting`, only that answer is inlined.
        if self.queue.is_empty() {
            return window;
        }
        self.next_deadline_with_waiters(window)
    }

    /// [`WorkingSet::next_deadline`] while sessions wait, given the first
    /// window's end: out of line, as the answer above.
    #[inline(never)]
    fn next_deadline_with_waiters(&self, window: Option<u64>) -> Option<u64> {
        [window, self.wait_bound_end(), self.idle_pays_at()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether the engine is empty (every member between turns, or none)
    /// while a session waits.
    fn empty_with_waiters(&self) -> bool {
        !self.queue.is_empty() && self.idle.len == self.member_count
    }

    /// The time constant of [`IdleBalance`]'s decay, ns: the wait bound's
    /// horizon, the span over which the working set answers for its
    /// choices.
    fn idle_balance_tau(&self) -> f64 {
        self.wait_bound_ns() as f64
    }

    /// Brings the idle balance up to `now`; called before every change.
    pub(crate) fn account_idle(&mut self, now: u64) {
        let empty = self.empty_with_waiters();
        // The bound's horizon (`idle_balance_tau`), worked out only when
        // there is something to decay.
        let (window, windows) = (self.window_ns(), self.tuning.wait_bound_windows);
        self.idle_balance
            .advance(now, empty, || bound_ns(window, windows) as f64);
    }

    /// Whether a queue head should go in because the engine is empty and
    /// has idled more than it re-prefilled ([`super::idle_balance`]).
    fn idle_pays(&self, need: u64, now: u64) -> bool {
        if self.idle.len != self.member_count {
            return false;
        }
        let displaced = self.displacement_ns(need);
        self.idle_balance.idle_ahead(displaced as f64)
            && now >= self.idle_balance.empty_since().saturating_add(displaced)
    }

    /// What letting in a head that needs `need` tokens makes members
    /// re-prefill, in engine time: the own tokens of the member it parks
    /// first (0 if it fits).
    fn displacement_ns(&self, need: u64) -> u64 {
        if self.fits_beside_members(need) {
            return 0;
        }
        let rate = self.prefill_rate();
        let Some(first) = self.idle.first() else {
            return 0;
        };
        if rate <= 0.0 {
            return u64::MAX;
        }
        let own = self.own(first, self.sessions[first].member().footprint);
        (own as f64 / rate * 1e9).min(u64::MAX as f64) as u64
    }

    /// When [`WorkingSet::idle_pays`] becomes true if nothing changes.
    fn idle_pays_at(&self) -> Option<u64> {
        if !self.empty_with_waiters() {
            return None;
        }
        let &head = self.queue.values().next()?;
        let need = self.need(head, self.sessions[head].history.queued_prompt);
        let displaced = self.displacement_ns(need);
        let stretch = self.idle_balance.empty_since().saturating_add(displaced);
        let ahead = if self.idle_balance.idle_ahead(displaced as f64) {
            Some(0)
        } else {
            self.idle_balance
                .ahead_at(self.idle_balance_tau(), displaced as f64)
        };
        ahead.map(|at| at.max(stretch))
    }

    /// When the queue head reaches the wait bound, if it has not yet.
    fn wait_bound_end(&self) -> Option<u64> {
        // A head already past its bound waits for a release, not a time.
        self.queue
            .values()
            .next()
            .filter(|&&s| !self.sessions[s].history.past_bound)
            .map(|&s| {
                let bound = self.bound_start(s).saturating_add(self.wait_bound_ns());
                let paid_off = self
                    .rotation_budget
                    .allows_at(self.rotation_refill_rate())
                    .unwrap_or(0);
                bound.max(paid_off)
            })
    }

    /// Lets in the queue heads that may enter at `now`, in order: each joins
    /// the working set and keeps its grant until its attempt collects it
    /// with [`WorkingSet::request`]. Returns them, with why.
    pub fn admit_waiting(&mut self, now: u64, out: &mut Vec<(K, Verdict)>) {
        self.expire(now);
        self.admit_waiting_expired(now, out);
    }

    /// [`WorkingSet::admit_waiting`] right after the windows over at `now`
    /// were ended: the ledger's changes each end them (a request first, a
    /// release last, nothing after either can bring a window's end
    /// forward), and asking again after both a request and a release cost
    /// 25 of a turn's 3,132 instructions (`benches/instructions.rs`,
    /// `open_1t/working_set/hot`; 45 of 3,183 on `/distinct`).
    #[inline]
    pub(crate) fn admit_waiting_expired(&mut self, now: u64, out: &mut Vec<(K, Verdict)>) {
        debug_assert!(
            self.first_window_end().is_none_or(|(until, _)| until > now),
            "the windows over at now were ended"
        );
        // The ledger asks after every change, and nearly always nobody
        // waits: that answer is inlined at the call, and the pass over the
        // queue (with its larger frame) is not entered. 57 of a turn's
        // 3,729 instructions (`benches/instructions.rs`,
        // `open_1t/working_set/hot`); the same split of `next_deadline`,
        // 54 more.
        if !self.queue.is_empty() {
            self.admit_queue_heads(now, out);
        }
    }

    /// [`WorkingSet::admit_waiting`]'s pass over a queue that is not empty.
    fn admit_queue_heads(&mut self, now: u64, out: &mut Vec<(K, Verdict)>) {
        // Decided once for the pass: the heads it lets in for running cold
        // change the figures, not the answer they were let in by.
        self.update_holding();
        while let Some(&s) = self.queue.values().next() {
            let prompt = self.sessions[s].history.queued_prompt;
            let verdict = self.head_verdict(s, prompt, now);
            if verdict == Verdict::Wait {
                let Some(cold) = self.cold_head_that_fits() else {
                    break;
                };
                let prompt = self.sessions[cold].history.queued_prompt;
                self.join(cold, prompt, now);
                self.hand_over(cold, Verdict::Fits, out);
                continue;
            }
            self.join(s, prompt, now);
            self.hand_over(s, verdict, out);
        }
    }

    /// Keeps the grant of the session at `s`, just let in, for its attempt
    /// to collect, and names it in `out`.
    fn hand_over(&mut self, s: Slot, verdict: Verdict, out: &mut Vec<(K, Verdict)>) {
        let Session { key, history, .. } = &mut self.sessions[s];
        history.grant = Some(verdict);
        out.push((key.clone(), verdict));
    }

    /// Checks the ledger's internal consistency (used by the property
    /// tests): the key index and the records agree, the member count and
    /// the running sums match the members, the index of members between
    /// turns holds exactly them, nobody is both queued and a member, the
    /// queue and the sessions agree.
    #[doc(hidden)]
    pub fn audit(&self) -> Result<(), String> {
        self.audit_slots()?;
        self.audit_idle()?;
        if self.members().count() != self.member_count {
            return Err(format!(
                "{} members counted but {} records have one",
                self.member_count,
                self.members().count()
            ));
        }
        let sum: u64 = self.members().map(|(s, m)| self.own(s, m.footprint)).sum();
        if sum != self.own_sum {
            return Err(format!(
                "own_sum {} but members add up to {sum}",
                self.own_sum
            ));
        }
        let reserves: u64 = self.members().map(|(_, m)| m.reserve).sum();
        if reserves != self.reserve_sum {
            return Err(format!(
                "reserve_sum {} but members' reserves add up to {reserves}",
                self.reserve_sum
            ));
        }
        for (pos, &s) in &self.queue {
            let Some(r) = self.sessions.get(s) else {
                return Err("a queued session has no record".into());
            };
            if r.member.is_some() {
                return Err("a member is queued".into());
            }
            if r.history.queued != Some(*pos) {
                return Err("queue and session disagree".into());
            }
        }
        let queued = self
            .sessions
            .iter()
            .filter(|(_, r)| r.history.queued.is_some())
            .count();
        if queued != self.queue.len() {
            return Err("a session thinks it is queued".into());
        }
        if self.member_count > 0 && self.ghosts.keys().any(|k| self.is_member(k)) {
            return Err("a member is also a ghost".into());
        }
        // A session presumed ended has asked nothing since its last turn:
        // its next request takes the presumption back before anything else.
        let asked = |r: &Session<K>| {
            r.history.queued.is_some() || r.member.as_ref().is_some_and(|m| m.in_flight > 0)
        };
        if self
            .sessions
            .iter()
            .any(|(_, r)| r.history.presumed_ended && asked(r))
        {
            return Err("a session presumed ended is waiting or in flight".into());
        }
        self.ghosts.audit()
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
            let Some(m) = self.sessions.get(s).and_then(|r| r.member.as_ref()) else {
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

    /// Where `key` waits: whether it is a returning session (ahead of all
    /// new ones), and its sequence number (FIFO within its class).
    pub fn queue_position(&self, key: &K) -> Option<(bool, u64)> {
        let (class, seq) = self.history(key)?.queued?;
        Some((class == Class::Returning, seq))
    }

    /// Whether `key` is waiting in the queue.
    pub fn is_waiting(&self, key: &K) -> bool {
        self.history(key).is_some_and(|h| h.queued.is_some())
    }

    /// Whether `key` is in the working set.
    pub fn is_member(&self, key: &K) -> bool {
        self.slots
            .get(key)
            .is_some_and(|&s| self.sessions[s].member.is_some())
    }

    fn history(&self, key: &K) -> Option<&History> {
        self.slots.get(key).map(|&s| &self.sessions[s].history)
    }

    /// Figures for monitoring.
    pub fn stats(&self) -> WorkingSetStats {
        WorkingSetStats {
            members: self.member_count,
            waiting: self.queue.len(),
            load_tokens: self.load(),
            capacity_tokens: self.estimate.map_or(0, |c| c as u64),
            shared_prefix_tokens: self.shared_prefix,
            window_ns: self.window_ns(),
            parked: self.parked,
            holding: self.holding,
            horizon_turns: self.horizon_turns(),
            prefill_share: self.prefill_share.share(self.prefill_rate()),
            idle_with_waiters_ns: self.idle_balance.idle_ns(),
            reprefill_ns: self.idle_balance.reprefill_ns(),
        }
    }
}

/// What a member's next turn will add to what it keeps cached: the tool
/// result its prompt grows by (its own mean, else everyone's) and the
/// output it generates. Counted before a newcomer joins: one that fits
/// only until the members' next turns would park one of them at once
/// (and be parked itself soon after: churn that re-prefills both).
///
/// A session's own last output is added as the integer it is: taken
/// through `f64` and back (as was done), it came out the same for any
/// count below 2^53 tokens, for two conversions (each several
/// instructions on x86-64: no unsigned convert, and `as` saturates) at
/// every request and release: 38 of a turn's 3,244 instructions
/// (`benches/instructions.rs`, `open_1t/working_set/hot`).
///
/// `mean_output` and `mean_growth` are the working set's, for a session
/// that has not shown its own yet. Before any growth is measured that is
/// none: when a batch of sessions arrives at once, every first turn that
/// fits goes in and the growth parks most of them a turn or two later.
/// Assuming a next turn as large as the prompt until then was measured and
/// not kept: on the real engine it halved that burst (14 of 24 first
/// turns in, a quarter fewer parks) and moved neither the tokens prefilled
/// nor the makespan (those parks are of short prompts); in the simulator
/// (judge, seeds 1-5) 0.9237 to 0.9242 over every scenario, the fitted
/// real-engine workload 0.953 to 0.939, with half its cache 1.044 to
/// 1.061.
fn next_turn_growth(h: &History, mean_output: f64, mean_growth: f64) -> u64 {
    let output = expected_output(h, mean_output);
    let growth = if h.growth > 0.0 {
        h.growth
    } else {
        mean_growth
    };
    growth as u64 + output
}

/// The room kept free for a member's next turn: its growth
/// ([`next_turn_growth`]) weighted by the chance (measured on the sessions
/// that finished, [`Lifetimes`]) that a session which has begun `started`
/// turns begins another; the whole of it
/// while nothing measured says. Room held for a turn that does not come is
/// concurrency lost: where sessions make one request each (a proxy in
/// front of single-turn traffic), every member kept a next turn's growth
/// free, and the gate ran 125-130 requests where the engine alone ran
/// about 190 (`single-turn` with 4x the output: 1.046x no gate's makespan,
/// 1.008x weighted). Judge over every scenario, makespan over the best cap:
/// seeds 1-5 0.9248 to 0.9237 (`single-turn` 1.007 to 1.001), held-out
/// seeds 6-10 0.9350 to 0.9344, varied (`--vary all`, seeds 1-3) 0.9425 to
/// 0.9417; hosts that pass lengths 0.9250 to 0.9232, that do not tell ends
/// 0.9370 to 0.9345, that report no cached tokens 0.9266 to 0.9294, the
/// rest within 0.001. A session near the end of the lives measured keeps
/// little free: a newcomer may join a turn before the room is given back.
fn reserve_for(
    lifetimes: &Lifetimes,
    h: &History,
    mean_output: f64,
    mean_growth: f64,
    started: u32,
) -> u64 {
    let growth = next_turn_growth(h, mean_output, mean_growth);
    match lifetimes.continuing(started, 1) {
        Some(p) => (growth as f64 * p) as u64,
        None => growth,
    }
}

/// What a session's turn is expected to generate: its last turn's output,
/// else the working set's mean (`mean_output`).
fn expected_output(h: &History, mean_output: f64) -> u64 {
    if h.turns > 0 {
        h.last_output
    } else {
        mean_output as u64
    }
}

/// A session's own tokens out of `footprint`: the shared prefix it showed
/// on its first turn (its credit, at most the `shared_prefix` counted once
/// for every session) is not its own.
fn own_tokens(h: &History, footprint: u64, shared_prefix: u64) -> u64 {
    footprint.saturating_sub(h.shared_credit.min(shared_prefix))
}

/// `tokens` rounded up to whole blocks of `block` tokens.
fn round_up(tokens: u64, block: u64) -> u64 {
    tokens.div_ceil(block) * block
}

/// Ends the session's tool gap, if one is open, at `now`: it is
/// remembered with the session's gaps and its log folded into
/// `mean_ln_gap`, the mean over every session.
/// The wait bound's length, ns: `windows` refill windows of `window_ns`
/// ([`WorkingSet::wait_bound_ns`], also the idle balance's horizon).
fn bound_ns(window_ns: u64, windows: f64) -> u64 {
    (window_ns as f64 * windows) as u64
}

fn end_gap(h: &mut History, now: u64, mean_ln_gap: &mut f64, silences: &mut Silences) {
    if h.turns > 0 && h.gap_open {
        h.gap_open = false;
        let gap = now.saturating_sub(h.released_at);
        h.gaps.push(gap);
        silences.gap(gap);
        // A floor of 1 ms keeps the log finite (a host that asks again
        // at once).
        *mean_ln_gap = running_mean(*mean_ln_gap, (gap.max(1_000_000) as f64).ln());
    }
}

/// Keeps the sketch of the session's newest prompt, if its driver gave one.
fn keep_sketch(h: &mut History, sketch: Option<&PromptSketch>) {
    if let Some(sketch) = sketch {
        // In place: no allocation once the session's prompts stop
        // outgrowing the memory kept.
        match &mut h.last_sketch {
            Some(kept) => kept.clone_from(sketch),
            None => h.last_sketch = Some(sketch.clone()),
        }
    }
}

/// What a member's turn with a `prompt_len`-token prompt should hit: the
/// part of its previous prompt the new one begins with. The previous
/// output is not counted, because agents built on reasoning models drop
/// their thinking from the history: only the prompt is surely re-sent. Told
/// by the sketches when both prompts have one; otherwise the previous prompt
/// whole, when the new one is long enough to extend it, and nothing (no
/// lesson) when it is not, as after a compaction.
fn expected_hit(h: &History, prompt_len: u64, sketch: Option<&PromptSketch>) -> u64 {
    match (sketch, h.last_sketch.as_ref()) {
        (Some(new), Some(old)) => old.common_prefix(new).min(h.last_prompt),
        _ if prompt_len >= h.last_prompt + h.last_output => h.last_prompt,
        _ => 0,
    }
}

/// A running mean over every session, seeded by its first sample: a slow
/// drift, not one turn's noise.
fn running_mean(mean: f64, sample: f64) -> f64 {
    if mean == 0.0 {
        sample
    } else {
        0.95 * mean + 0.05 * sample
    }
}

/// Whether a session keeps a window between turns: not once its own tool
/// calls usually (median of its recent gaps) outlast the refill window:
/// holding its place would then cost more than refilling what it loses.
/// The median of `n` gaps (the upper one of an even count, the `n / 2`-th
/// in ascending order) is at most `refill` exactly when more than `n / 2`
/// of them are: counted, not sorted. Sorting a copy of the gaps at every
/// release cost 135 of the 5,471 instructions of a turn
/// (`benches/instructions.rs`, `open_1t/working_set/hot`).
///
/// A session with too few gaps of its own to judge by gets one unless
/// windows clearly run out more often than they end in a return (two in
/// three lately): as where every session makes one request, or ends
/// without the host saying so after its first turns. Measured (judge,
/// seeds 1-5): `single-turn` behind a host that tells no ends 1.044x the
/// best cap -> 1.030x (told: 1.007x), every other scenario, told or
/// untold, identical; every scenario varied (untold, seeds 1-3) only the
/// `single-turn` variations moved, all down (`~kv-double` 1.085x ->
/// 1.050x).
fn keeps_window(gaps: &Gaps, refill: u64, outcomes: &WindowOutcomes) -> bool {
    if gaps.len() < GAPS_TO_JUDGE {
        return !outcomes.mostly_lapse();
    }
    gaps.at_most(refill) > gaps.len() / 2
}

/// How members' windows ended lately: a return within the window, or the
/// window running out (a long tool call, or a session that ended without
/// the host saying so), each outcome weighing less as later ones come.
#[derive(Debug, Clone, Copy, Default)]
struct WindowOutcomes {
    returned: f32,
    lapsed: f32,
}

impl WindowOutcomes {
    /// Each outcome weighs this much less per later one.
    const DECAY: f32 = 1.0 / 64.0;

    /// A window ended: in a return within it (`returned`), or by running
    /// out.
    fn record(&mut self, returned: bool) {
        self.returned *= 1.0 - Self::DECAY;
        self.lapsed *= 1.0 - Self::DECAY;
        if returned {
            self.returned += 1.0;
        } else {
            self.lapsed += 1.0;
        }
    }

    /// Windows ran out at least twice as often as they ended in a return
    /// (a clear majority, so that a near tie keeps windows as before
    /// anything was measured).
    fn mostly_lapse(&self) -> bool {
        self.lapsed > 2.0 * self.returned
    }
}

/// A session's last [`GAP_SAMPLES`] tool gaps, ns: a ring in an inline
/// array (no allocation per session), whose oldest gap, once it is full,
/// is at `next`, the place the next gap takes.
#[derive(Debug, Clone, Default)]
struct Gaps {
    recent: [u64; GAP_SAMPLES],
    len: usize,
    next: usize,
}

impl Gaps {
    /// Remembers `gap`, forgetting the oldest once [`GAP_SAMPLES`] are kept.
    fn push(&mut self, gap: u64) {
        self.recent[self.next] = gap;
        self.next = (self.next + 1) % GAP_SAMPLES;
        self.len = (self.len + 1).min(GAP_SAMPLES);
    }

    fn len(&self) -> usize {
        self.len
    }

    /// How many of the gaps are at most `limit`.
    fn at_most(&self, limit: u64) -> usize {
        self.recent[..self.len]
            .iter()
            .filter(|gap| **gap <= limit)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// 1000 tokens of KV in blocks of 1; refill window 1 s (1000 tokens/s).
    fn set() -> WorkingSet<&'static str> {
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(1000, 1, 1000.0));
        ws
    }

    fn report(cached: u64, output: u64) -> TurnReport {
        TurnReport::new(Some(cached), Some(output))
    }

    #[test]
    fn a_window_is_kept_while_the_median_of_the_last_eight_gaps_is_within_it() {
        let mut gaps = Gaps::default();
        let mut all = Vec::new();
        let mut x = 12345u64;
        let mut next = || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // A small range, so that equal gaps (and refills) come often.
            (x >> 33) % 50
        };
        for _ in 0..300 {
            let gap = next();
            gaps.push(gap);
            all.push(gap);
            let mut last: Vec<u64> = all.iter().rev().take(GAP_SAMPLES).copied().collect();
            last.sort_unstable();
            assert_eq!(gaps.len(), last.len());
            let refill = next();
            let by_median = last.len() < GAPS_TO_JUDGE || last[last.len() / 2] <= refill;
            assert_eq!(
                keeps_window(&gaps, refill, &WindowOutcomes::default()),
                by_median,
                "{last:?} {refill}"
            );
        }
    }

    #[test]
    fn sessions_join_while_they_fit_and_wait_in_order_after() {
        let mut ws = set();
        assert_eq!(ws.request(&"a", 400, 0), Verdict::Empty);
        assert_eq!(ws.request(&"b", 400, 0), Verdict::Fits);
        assert_eq!(ws.request(&"c", 400, 0), Verdict::Wait);
        assert_eq!(
            ws.request(&"d", 100, 0),
            Verdict::Wait,
            "FIFO: d fits but c is ahead"
        );
        assert_eq!(ws.load(), 800);
        // a's turn ends: it keeps its place for the window, so c still waits.
        ws.release(&"a", 400, report(0, 0), 0, S / 10);
        let mut out = Vec::new();
        ws.admit_waiting(S / 10, &mut out);
        assert!(out.is_empty());
        assert_eq!(ws.next_deadline(), Some(S / 10 + S));
        // Its window ends: c (then d) enter, handed over until they collect.
        ws.admit_waiting(S / 10 + S, &mut out);
        assert_eq!(out, vec![("c", Verdict::Fits), ("d", Verdict::Fits)]);
        assert_eq!(ws.request(&"c", 400, S / 10 + S), Verdict::Fits);
        assert_eq!(ws.request(&"d", 100, S / 10 + S), Verdict::Fits);
        assert_eq!(ws.stats().members, 3);
    }

    #[test]
    fn a_member_comes_back_in_without_waiting() {
        let mut ws = set();
        ws.request(&"a", 400, 0);
        ws.request(&"b", 500, 0);
        ws.release(&"a", 400, report(0, 50), 0, S / 10);
        assert_eq!(ws.request(&"c", 100, S / 10), Verdict::Wait);
        assert_eq!(ws.request(&"a", 450, S / 5), Verdict::Member);
    }

    #[test]
    fn a_retry_keeps_its_place_and_a_withdrawn_waiter_loses_it() {
        let mut ws = set();
        ws.request(&"a", 900, 0);
        assert_eq!(ws.request(&"b", 500, 0), Verdict::Wait);
        assert_eq!(ws.request(&"c", 600, 0), Verdict::Wait);
        assert_eq!(ws.request(&"b", 500, 1), Verdict::Wait, "retry");
        ws.finish(&"a", 2);
        let mut out = Vec::new();
        ws.admit_waiting(2, &mut out);
        assert_eq!(
            out,
            vec![("b", Verdict::Empty)],
            "b was first, its retry kept that"
        );
        ws.withdraw(&"b");
        assert_eq!(ws.stats().members, 0, "an uncollected grant is undone");
        ws.admit_waiting(3, &mut out);
        assert_eq!(out.last(), Some(&("c", Verdict::Empty)));
    }

    #[test]
    fn a_session_larger_than_the_cache_still_runs_alone() {
        let mut ws = set();
        assert_eq!(ws.request(&"huge", 5000, 0), Verdict::Empty);
    }

    #[test]
    fn the_shared_prefix_counts_once() {
        let mut ws = set();
        ws.request(&"a", 400, 0);
        ws.release(&"a", 400, report(0, 0), 0, 1);
        ws.request(&"b", 400, 2);
        // b's first turn hit the 300 tokens it shares with a.
        ws.release(&"b", 400, report(300, 0), 2, 3);
        assert_eq!(ws.stats().shared_prefix_tokens, 300);
        // a shared nothing on its first turn (it was first): 300 + 400 + 100.
        assert_eq!(ws.load(), 800);
        // c is expected to share the 300 as first turns have: it adds 300
        // of its own 600, and 1100 would not fit.
        assert_eq!(ws.request(&"c", 600, 4), Verdict::Wait);
        ws.finish(&"a", 5);
        let mut out = Vec::new();
        ws.admit_waiting(5, &mut out);
        assert_eq!(out, vec![("c", Verdict::Fits)]);
        assert_eq!(ws.load(), 300 + 100 + 300);
    }

    #[test]
    fn a_new_session_is_counted_without_the_prefix_first_turns_shared() {
        // Single-turn sessions sharing a 300-token prompt: each is counted
        // for what it adds, not for the shared prompt again.
        let mut ws = set();
        ws.request(&"first", 400, 0);
        ws.release(&"first", 400, report(0, 0), 0, 1);
        ws.finish(&"first", 1);
        ws.request(&"second", 400, 2);
        ws.release(&"second", 400, report(300, 0), 2, 3);
        ws.finish(&"second", 3);
        for (i, key) in ["c", "d", "e", "f", "g", "h", "i"].iter().enumerate() {
            let verdict = ws.request(key, 400, 4);
            assert_ne!(verdict, Verdict::Wait, "{key}");
            assert_eq!(ws.load(), 300 + 100 * (i as u64 + 1));
        }
        // 1000 counted: the eighth waits.
        assert_eq!(ws.request(&"j", 400, 4), Verdict::Wait);
        // The first-turn report replaces the expectation: i shared nothing,
        // so 400 are its own, and the member released longest ago (i
        // itself, the only one between turns) is parked to make room.
        ws.release(&"i", 400, report(0, 0), 4, 5);
        assert_eq!(ws.stats().parked, 1);
        assert_eq!(ws.load(), 300 + 100 * 6);
    }

    #[test]
    fn without_cached_reports_first_prompts_sketches_give_the_shared_prefix() {
        // As above, from a host whose engine reports no cached tokens but
        // which passes token ids: single-turn sessions whose 400-token
        // prompts share their first 300 (the sketches see 257 of them:
        // the sample at 255 is the last before 300; blocks of one token).
        let mut ws = set();
        let prompt = |seed: u32| -> Vec<u32> {
            (0..300)
                .chain((0..100).map(|i| 1_000_000 * (seed + 1) + i))
                .collect()
        };
        let no_cached = TurnReport::new(None, Some(0));
        for (seed, key) in [(0, "first"), (1, "second")] {
            let sketch = PromptSketch::of(&prompt(seed));
            assert_ne!(
                ws.request_sketched(&key, 400, Some(&sketch), 0),
                Verdict::Wait
            );
            ws.release(&key, 400, no_cached, 0, 1);
            ws.finish(&key, 1);
        }
        assert_eq!(ws.stats().shared_prefix_tokens, 257);
        // A new session is counted for the 143 tokens it adds.
        let sketch = PromptSketch::of(&prompt(2));
        assert_ne!(
            ws.request_sketched(&"c", 400, Some(&sketch), 2),
            Verdict::Wait
        );
        assert_eq!(ws.load(), 257 + 143);
        // Told lengths only, nothing is learned: the prefix counts as c's own.
        let mut lengths = set();
        for key in ["first", "second"] {
            lengths.request(&key, 400, 0);
            lengths.release(&key, 400, no_cached, 0, 1);
            lengths.finish(&key, 1);
        }
        assert_eq!(lengths.stats().shared_prefix_tokens, 0);
        lengths.request(&"c", 400, 2);
        assert_eq!(lengths.load(), 400);
        ws.audit().unwrap();
    }

    #[test]
    fn a_waiter_asking_again_is_not_compared_with_itself() {
        // 10,000 tokens of KV; 2,000-token first prompts sharing their
        // first 300 (the sketches see 257), no cached tokens reported.
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(10_000, 1, 1000.0));
        let prompt = |seed: u32| -> Vec<u32> {
            (0..300)
                .chain((0..1700).map(|i| 1_000_000 * (seed + 1) + i))
                .collect()
        };
        let no_cached = TurnReport::new(None, Some(0));
        let ask = |ws: &mut WorkingSet<&'static str>, key, seed, t| {
            let sketch = PromptSketch::of(&prompt(seed));
            ws.request_sketched(&key, 2000, Some(&sketch), t)
        };
        assert_eq!(ask(&mut ws, "a", 0, 0), Verdict::Empty);
        // b, c, d, e fill the cache beside a (each counted whole until a
        // first turn teaches the shared prefix); f waits, and asks again.
        for (seed, key) in [(1, "b"), (2, "c"), (3, "d"), (4, "e")] {
            assert_ne!(ask(&mut ws, key, seed, 0), Verdict::Wait, "{key}");
        }
        assert_eq!(ask(&mut ws, "f", 5, 0), Verdict::Wait);
        assert_eq!(ask(&mut ws, "f", 5, 1), Verdict::Wait);
        for key in ["a", "b", "c", "d", "e"] {
            ws.release(&key, 2000, no_cached, 0, 2);
            ws.finish(&key, 2);
        }
        assert_eq!(ws.stats().shared_prefix_tokens, 257);
        let mut out = Vec::new();
        ws.admit_waiting(2, &mut out);
        assert_eq!(ask(&mut ws, "f", 5, 2), Verdict::Empty);
        ws.release(&"f", 2000, no_cached, 2, 3);
        // Compared with itself on asking again, f would have taught 1,537.
        assert_eq!(ws.stats().shared_prefix_tokens, 257);
        ws.audit().unwrap();
    }

    #[test]
    fn members_that_outgrow_the_cache_park_the_least_recently_released() {
        let mut ws = set();
        ws.request(&"a", 300, 0);
        ws.request(&"b", 300, 0);
        ws.request(&"c", 300, 0);
        ws.release(&"a", 300, report(0, 0), 0, 10);
        ws.release(&"b", 300, report(0, 0), 0, 20);
        ws.release(&"c", 300, report(0, 0), 0, 30);
        // b grows to 500: 300 + 500 + 300 > 1000, so a (released first) leaves.
        assert_eq!(ws.request(&"b", 500, 40), Verdict::Member);
        assert_eq!(ws.stats().members, 2);
        assert_eq!(ws.stats().parked, 1);
        // a comes back ahead of a new session (once c is gone, a fits
        // beside b and the 200 tokens b's next turn adds: 500 + 200 + 300).
        assert_eq!(ws.request(&"n", 300, 50), Verdict::Wait);
        assert_eq!(ws.request(&"a", 300, 60), Verdict::Wait);
        ws.finish(&"c", 70);
        let mut out = Vec::new();
        ws.admit_waiting(70, &mut out);
        assert_eq!(out[0], ("a", Verdict::Fits));
    }

    /// Runs `turns` turns of `key` from `start`: prompts of 100, 200, ...
    /// tokens (100 of tool result a turn, no output), each turn lasting
    /// `turn` and followed by a tool gap as long, each prefilling
    /// `prefilled` tokens (at most its prompt). Returns when its last turn
    /// ended.
    fn run_turns(
        ws: &mut WorkingSet<&'static str>,
        key: &'static str,
        turns: u64,
        start: u64,
        turn: u64,
        prefilled: u64,
    ) -> u64 {
        let mut t = start;
        for i in 1..=turns {
            let prompt = 100 * i;
            assert_ne!(ws.request(&key, prompt, t), Verdict::Wait, "{key} turn {i}");
            let cached = prompt.saturating_sub(prefilled);
            ws.release(&key, prompt, report(cached, 0), t, t + turn);
            t += 2 * turn;
        }
        t - turn
    }

    /// Two sessions of `lifetime` turns finish (turns of `turn`, tool gaps
    /// as long, each prefilling its 100 new tokens); then `a` runs `a_turns` turns, and a newcomer with a
    /// `prompt`-token prompt asks while `a` is between turns.
    fn newcomer_beside_a_growing_member(
        lifetime: u64,
        a_turns: u64,
        prompt: u64,
        turn: u64,
    ) -> Verdict {
        let mut ws = set();
        let mut t = 0;
        for key in ["x", "y"] {
            t = run_turns(&mut ws, key, lifetime, t, turn, 100);
            ws.finish(&key, t);
        }
        t = run_turns(&mut ws, "a", a_turns, t, turn, 100);
        assert_eq!(ws.stats().members, 1);
        let v = ws.request(&"n", prompt, t + turn / 2);
        ws.audit().unwrap();
        v
    }

    #[test]
    fn a_newcomer_waits_when_the_members_would_outgrow_the_cache_within_a_window() {
        // Turns and gaps of 100 ms against a 1 s refill window, half of
        // the engine's time prefilling: 10 turns ahead. Sessions ran 6
        // turns: `a` (200 tokens, 100 more a turn) has 4 more to run, the 300-token newcomer 5. It fits beside a's
        // next turn (200 + 100 + 300), but 3 turns ahead they would hold
        // 500 + 600 > 1000.
        assert_eq!(
            newcomer_beside_a_growing_member(6, 2, 300, S / 10),
            Verdict::Wait
        );
    }

    #[test]
    fn a_newcomer_joins_beside_members_that_are_about_to_finish() {
        // Sessions ran 3 turns: `a` has one more to run, the newcomer 2.
        // Counted as growing regardless, they would hold 500 + 600 three
        // turns ahead; a will have finished by then.
        assert_eq!(
            newcomer_beside_a_growing_member(3, 2, 300, S / 10),
            Verdict::Fits
        );
    }

    #[test]
    fn a_member_that_outlived_every_finished_session_still_counts() {
        // Sessions ran 3 turns, `a` has run 4 (400 tokens): nothing says
        // when it ends, so it counts as after its next turn (500), and the
        // 350-token newcomer, expected to run 3 turns, would hold 550 two
        // turns ahead: 1050 > 1000.
        assert_eq!(
            newcomer_beside_a_growing_member(3, 4, 350, S / 10),
            Verdict::Wait
        );
    }

    /// As [`newcomer_beside_a_growing_member`] (a 300-token newcomer, `a`
    /// at 2 turns), with a returning session `r` at the head of the line,
    /// too large for the room: the newcomer asks behind it.
    fn newcomer_behind_a_returning_head(lifetime: u64) -> Verdict {
        let mut ws = set();
        let turn = S / 10;
        let mut t = 0;
        for key in ["x", "y"] {
            t = run_turns(&mut ws, key, lifetime, t, turn, 100);
            ws.finish(&key, t);
        }
        // r runs a turn, then its window (1 s) ends while a runs 2 turns.
        t = run_turns(&mut ws, "r", 1, t, turn, 100);
        t = run_turns(&mut ws, "a", 2, t + 2 * S, turn, 100);
        assert_eq!(ws.stats().members, 1);
        // r returns with 900 tokens: no room beside a (200 + 100).
        assert_eq!(ws.request(&"r", 900, t + turn / 2), Verdict::Wait);
        let v = ws.request(&"n", 300, t + turn / 2);
        assert!(ws.is_waiting(&"r"));
        ws.audit().unwrap();
        v
    }

    #[test]
    fn room_the_returning_head_cannot_use_goes_to_a_new_session_only_if_it_fits_ahead() {
        // The newcomer fits the room now, and a window ahead only where a
        // is about to finish (sessions of 3 turns), not where it grows on
        // (sessions of 6).
        assert_eq!(newcomer_behind_a_returning_head(3), Verdict::Fits);
        assert_eq!(newcomer_behind_a_returning_head(6), Verdict::Wait);
    }

    #[test]
    fn a_newcomer_that_fits_one_turn_ahead_joins_when_a_window_is_a_turn() {
        // Turns and gaps of 600 ms against a 1 s window (a twelfth of the
        // engine's time prefilling): the horizon is a single turn, so only
        // the members' next turns are counted.
        assert_eq!(
            newcomer_beside_a_growing_member(6, 2, 300, 6 * S / 10),
            Verdict::Fits
        );
    }

    #[test]
    fn sessions_that_finish_teach_how_long_sessions_run() {
        let mut ws = set();
        let t = run_turns(&mut ws, "x", 3, 0, S / 10, 0);
        assert!(ws.lifetimes.is_empty());
        ws.finish(&"x", t);
        assert_eq!(ws.lifetimes.longest(), 3);
        assert_eq!(ws.lifetimes.continuing(2, 1), Some(1.0));
    }

    #[test]
    fn while_no_end_is_told_a_long_quiet_is_presumed_an_end_and_taken_back_on_return() {
        let mut ws = set();
        let t = run_turns(&mut ws, "x", 3, 0, S / 10, 0);
        // It leaves when its window (1 s here) ends, and must be quiet for
        // two windows from its release (no longer gap seen).
        ws.expire(t + 2 * S - 1);
        assert_eq!(ws.stats().members, 0);
        assert!(ws.lifetimes.is_empty());
        ws.expire(t + 2 * S);
        assert_eq!(ws.lifetimes.longest(), 3, "presumed ended after 3 turns");
        // It asks again: it had not ended.
        ws.request(&"x", 400, t + 3 * S);
        assert!(ws.lifetimes.is_empty(), "taken back");
        ws.release(&"x", 400, report(300, 0), t + 3 * S, t + 4 * S);
        // The gap it took (3 s) now sets the quiet needed: 6 s.
        ws.expire(t + 4 * S + 6 * S - 1);
        assert!(ws.lifetimes.is_empty());
        ws.expire(t + 4 * S + 6 * S);
        assert_eq!(ws.lifetimes.longest(), 4);
        // Told ends count once, presumed or not.
        ws.finish(&"x", t + 40 * S);
        assert_eq!(ws.lifetimes.by_finish_len(), 1);
        ws.audit().unwrap();
    }

    #[test]
    fn once_the_host_tells_an_end_nothing_is_presumed() {
        let mut ws = set();
        let t = run_turns(&mut ws, "x", 2, 0, S / 10, 0);
        ws.finish(&"x", t);
        let t = run_turns(&mut ws, "y", 2, t, S / 10, 0);
        ws.expire(t + 100 * S);
        assert_eq!(ws.lifetimes.by_finish_len(), 1, "only x's told end");
    }

    #[test]
    fn a_session_too_new_to_judge_keeps_a_window_while_most_windows_end_in_a_return() {
        // Window 1 s; turns of 0.1 s.
        let mut ws = set();
        let new_session_keeps_its_window = |ws: &mut WorkingSet<&'static str>, key, t| {
            let t = run_turns(ws, key, 1, t, S / 10, 0);
            ws.expire(t + 1);
            let kept = ws.stats().members == 1;
            // It never comes back (a host that does not say sessions end):
            // its window, if any, runs out.
            ws.expire(t + 2 * S);
            assert_eq!(ws.stats().members, 0);
            (kept, t + 2 * S)
        };
        let (kept, mut t) = new_session_keeps_its_window(&mut ws, "a", 0);
        assert!(kept, "nothing has ended yet");
        for key in ["b", "c", "d", "e"] {
            (_, t) = new_session_keeps_its_window(&mut ws, key, t);
        }
        let (kept, t) = new_session_keeps_its_window(&mut ws, "f", t);
        assert!(!kept, "five windows ran out, none ended in a return");
        // A session that keeps coming back within its window: windows end
        // in returns again, and a new session keeps one.
        let t = run_turns(&mut ws, "r", 20, t, S / 10, 0);
        ws.finish(&"r", t);
        let (kept, _) = new_session_keeps_its_window(&mut ws, "g", t + S);
        assert!(
            kept,
            "r came back within its window from its fourth turn on"
        );
        ws.audit().unwrap();
    }

    #[test]
    fn while_ends_are_presumed_a_session_at_the_usual_last_turn_keeps_no_window() {
        // Turns of 0.1 s, tools of 0.1 s: windows are kept.
        let mut ws = set();
        let mut t = 0;
        for key in ["x", "y"] {
            t = run_turns(&mut ws, key, 2, t, S / 10, 0);
            ws.expire(t + 4 * S);
            t += 4 * S;
        }
        assert!(ws.lifetimes.ends_after(2));
        t = run_turns(&mut ws, "a", 1, t, S / 10, 0);
        assert_eq!(
            ws.stats().members,
            1,
            "a keeps its window after its first turn"
        );
        t = run_turns(&mut ws, "a", 1, t + S / 10, S / 10, 0) + 1;
        ws.expire(t);
        assert_eq!(
            ws.stats().members,
            0,
            "after its second, sessions end: no window"
        );
        // A host that tells ends gets the window kept until it says so.
        let mut told = set();
        let mut t = run_turns(&mut told, "x", 2, 0, S / 10, 0);
        told.finish(&"x", t);
        t = run_turns(&mut told, "a", 2, t, S / 10, 0) + 1;
        told.expire(t);
        assert_eq!(told.stats().members, 1);
        told.audit().unwrap();
        ws.audit().unwrap();
    }

    #[test]
    fn the_horizon_is_a_windows_turns_stretched_by_the_prefill_share() {
        let mut ws = set();
        assert_eq!(ws.stats().horizon_turns, 1, "no turn measured yet");
        let t = run_turns(&mut ws, "x", 3, 0, S * 9 / 100, 0);
        // A cycle of 180 ms against a 1 s window: 5 whole turns.
        assert_eq!(ws.stats().prefill_share, 0.0);
        assert_eq!(ws.stats().horizon_turns, 5);
        // Turns as long, that prefill 60 of their tokens (60 ms at 1000
        // tokens/s): prefill takes part of the engine, and the horizon
        // stretches by 1 / (1 - share).
        run_turns(&mut ws, "y", 3, t + S, S * 9 / 100, 60);
        let stats = ws.stats();
        assert!(
            (0.05..0.5).contains(&stats.prefill_share),
            "{}",
            stats.prefill_share
        );
        let stretched = (1.0 / (0.18 * (1.0 - stats.prefill_share))) as u32;
        assert!(stretched > 5);
        assert_eq!(stats.horizon_turns, stretched);
    }

    #[test]
    fn turns_that_end_before_the_engine_tells_its_rate_are_not_all_prefill() {
        // A fresh engine: capacity known, no rate yet (it has run no step
        // mostly of prefill when the first turns are admitted).
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(1000, 1, 0.0));
        // Three turns of 90 ms, each prefilling 60 tokens: the rate
        // measured from them is 60 / 0.09 s, about 667 tokens/s, at which
        // they would look all prefill.
        run_turns(&mut ws, "x", 3, 0, S * 9 / 100, 60);
        // The engine then tells its rate: 1000 tokens/s. What those turns
        // prefilled took 60 ms of each 180 ms cycle (a 90 ms turn, a 90 ms
        // gap): 180 of the 450 ms from the first admission to the last
        // release, not all of it (it read 0.9, the ceiling, when each turn
        // was converted at the rate in force as it ended).
        ws.set_engine(EngineCapacity::new(1000, 1, 1000.0));
        let share = ws.stats().prefill_share;
        assert!((0.2..0.5).contains(&share), "{share}");
    }

    #[test]
    fn a_newcomer_waits_for_the_room_the_members_next_turns_need() {
        let mut ws = set();
        assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
        ws.release(&"a", 300, report(0, 50), 0, 10);
        // a's next turn shows its tool result: 300 + 50 + 150 = 500.
        assert_eq!(ws.request(&"a", 500, 20), Verdict::Member);
        // It hit all it should (350): no miss, the estimate stays 1000.
        ws.release(&"a", 500, report(350, 50), 20, 30);
        // a keeps 550 and its next turn adds ~200 (150 tool result, 50 output):
        // a 300-token newcomer (+50 output) would fit now (900) but not
        // after a's next turn (1100), so it waits rather than be parked or
        // park a at once.
        assert_eq!(ws.stats().members, 1);
        assert_eq!(ws.request(&"n", 300, 40), Verdict::Wait);
        // A smaller one fits beside both: 550 + 200 + 200 + 50 = 1000.
        ws.withdraw(&"n");
        assert_eq!(ws.request(&"m", 200, 50), Verdict::Fits);
        ws.audit().unwrap();
    }

    #[test]
    fn a_next_turn_is_reserved_as_likely_as_the_finished_sessions_say() {
        // Nothing finished yet: a member's next turn is reserved in full.
        let mut ws = set();
        assert_eq!(ws.request(&"a", 100, 0), Verdict::Empty);
        ws.release(&"a", 100, report(0, 40), 0, 10);
        assert_eq!(ws.reserve_sum, 40);
        ws.finish(&"a", 20);
        // Of the four sessions finished, two ran a second turn: a member
        // that has begun one turn keeps half its next turn's growth free;
        // one that has begun two, none (nobody ran a third).
        for (key, turns) in [("b", 1), ("c", 2), ("d", 2)] {
            let t = run_turns(&mut ws, key, turns, 100, 10, 0);
            ws.finish(&key, t);
        }
        assert_eq!(ws.lifetimes.continuing(1, 1), Some(0.5));
        assert_eq!(ws.request(&"e", 100, 500), Verdict::Empty);
        // e's next turn would add the 100 of tool result the others' turns
        // grew by, and its 40 of output: half of 140 is kept.
        ws.release(&"e", 100, report(0, 40), 500, 510);
        assert_eq!(ws.reserve_sum, 70);
        assert_eq!(ws.request(&"e", 140, 520), Verdict::Member);
        assert_eq!(ws.reserve_sum, 0);
        ws.audit().unwrap();
    }

    #[test]
    fn equal_release_times_park_in_joining_order_whatever_the_release_order() {
        let mut ws = set();
        for k in ["a", "b", "c", "d"] {
            ws.request(&k, 200, 0);
        }
        // Released at the same instant in the reverse of their joining order,
        // and a after them though its clock said earlier (two threads).
        for k in ["d", "c", "b"] {
            ws.release(&k, 200, report(0, 0), 0, 10);
        }
        ws.release(&"a", 200, report(0, 0), 0, 5);
        ws.audit().unwrap();
        // d grows to 600: 1200 tokens, so the least recently released
        // other than d leaves: a (5 ns), then nobody (1000 fit).
        assert_eq!(ws.request(&"d", 600, 20), Verdict::Member);
        assert!(!ws.is_member(&"a"));
        // A retry of d's turn asks for 800: 1200 again. b and c were
        // released at the same time, c first; b joined first and leaves.
        assert_eq!(ws.request(&"d", 800, 30), Verdict::Member);
        assert!(!ws.is_member(&"b"));
        assert!(ws.is_member(&"c"));
        assert_eq!(ws.stats().parked, 2);
        ws.audit().unwrap();
    }

    #[test]
    fn a_ghost_counts_while_a_member_between_turns_is_older() {
        let mut ws = set();
        ws.request(&"old", 300, 0);
        ws.request(&"gone", 300, 0);
        ws.release(&"old", 300, report(0, 0), 0, 10);
        ws.release(&"gone", 300, report(0, 0), 0, 20);
        ws.finish(&"gone", 20);
        // gone's blocks were freed after old's: they are evicted after them.
        assert_eq!(ws.load(), 600);
        // Once old runs again its blocks are the newest: the ghost stops counting.
        ws.request(&"old", 300, 30);
        ws.release(&"old", 300, report(300, 0), 30, 40);
        assert_eq!(ws.load(), 300);
    }

    #[test]
    fn sessions_whose_tools_outlast_the_window_get_none() {
        let mut ws = set();
        let mut t = 0;
        for _ in 0..3 {
            ws.request(&"slow", 100, t);
            ws.release(&"slow", 100, report(0, 0), t, t + 1);
            t += 1 + 5 * S; // 5 s tools against a 1 s window
        }
        ws.request(&"slow", 100, t);
        ws.release(&"slow", 100, report(0, 0), t, t + 1);
        ws.expire(t + 1);
        assert_eq!(ws.stats().members, 0, "no window at all");
    }

    #[test]
    fn a_window_never_outlasts_the_refill_window_known_now() {
        // The engine says its capacity but not its prefill rate: the window
        // comes from what turns report.
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(1000, 1, 0.0));
        ws.request(&"a", 500, 0);
        // a's first turn queued in the engine behind a whole batch: 500
        // tokens in 100 s, a 200 s window when it was released.
        ws.release(&"a", 500, report(0, 0), 0, 100 * S);
        assert_eq!(ws.window_ns(), 200 * S);
        assert_eq!(ws.request(&"b", 400, 100 * S), Verdict::Fits);
        // b shows the real rate: 400 tokens in 0.4 s, a 1 s window.
        ws.release(&"b", 400, report(0, 0), 100 * S, 100 * S + 4 * S / 10);
        assert_eq!(ws.window_ns(), S);
        assert_eq!(
            ws.next_deadline(),
            Some(101 * S),
            "a's window ends a refill window after its release"
        );
        ws.expire(101 * S);
        assert!(!ws.is_member(&"a"), "a kept its 200 s window");
        assert!(ws.is_member(&"b"));
    }

    #[test]
    fn room_a_returning_head_cannot_use_goes_to_the_first_new_session() {
        let mut ws = set();
        // Turns of 10 s and a 2 s tool: holding sessions out pays here.
        ws.request(&"r", 500, 0);
        ws.release(&"r", 500, report(0, 0), 0, 10 * S);
        ws.expire(12 * S);
        assert!(!ws.is_member(&"r"), "r's window is over: it returns");
        assert_eq!(ws.request(&"a", 600, 12 * S), Verdict::Empty);
        assert_eq!(ws.request(&"r", 500, 12 * S), Verdict::Wait);
        assert_eq!(ws.queue_position(&"r").map(|p| p.0), Some(true));
        // r does not fit beside a; a new session that does goes in.
        assert_eq!(ws.request(&"n", 100, 12 * S), Verdict::Fits);
        // New sessions keep their order: x does not fit, so y waits behind it.
        assert_eq!(ws.request(&"x", 350, 12 * S), Verdict::Wait);
        assert_eq!(ws.request(&"y", 60, 12 * S), Verdict::Wait);
        // n ends: x fits now (600 + 350), r still does not, nor y beside x.
        ws.finish(&"n", 13 * S);
        let mut out = Vec::new();
        ws.admit_waiting(13 * S, &mut out);
        assert_eq!(out, vec![("x", Verdict::Fits)]);
        // a ends: r, at the head, fits again and goes first.
        ws.finish(&"a", 14 * S);
        assert_eq!(
            ws.request(&"y", 60, 14 * S),
            Verdict::Wait,
            "a retry of y, first of the new ones: the room is r's now"
        );
        out.clear();
        ws.admit_waiting(14 * S, &mut out);
        assert_eq!(out, vec![("r", Verdict::Fits), ("y", Verdict::Fits)]);
    }

    /// Sessions a and b, of `prompt` tokens each, in a 1000-token cache
    /// whose engine prefills 1000 tokens/s: each round both take a turn of
    /// 0.1 s, then their tools run for the round's gap. Returns the set with
    /// both in flight again, and the time.
    fn two_sessions_after(prompt: u64, gaps: &[u64]) -> (WorkingSet<&'static str>, u64) {
        let mut ws = set();
        let mut t = 0;
        for gap in gaps {
            for k in ["a", "b"] {
                ws.request(&k, prompt, t);
                ws.release(&k, prompt, report(0, 0), t, t + S / 10);
            }
            t += S / 10 + gap;
        }
        for k in ["a", "b"] {
            ws.request(&k, prompt, t);
        }
        (ws, t)
    }

    /// Two sessions of 400 tokens fill the cache, after four rounds with
    /// tools of `gap`. Returns the verdict for a third session.
    fn third_session_after_cycles(gap: u64) -> (Verdict, WorkingSet<&'static str>) {
        let (mut ws, t) = two_sessions_after(400, &[gap; 4]);
        (ws.request(&"c", 400, t), ws)
    }

    #[test]
    fn with_tools_long_next_to_turns_nobody_is_held_out() {
        // Tools of 0.5 s: holding 2 hot sessions serves 2 / 0.6 s = 3.3
        // turns/s; cold, the engine refills 400 tokens in 0.4 s (2.5/s):
        // holding pays, c waits.
        let (v, ws) = third_session_after_cycles(S / 2);
        assert!(ws.holding_pays());
        assert_eq!(v, Verdict::Wait);
        // Tools of 20 s: hot, the 2.5 sessions that fit serve 2.5 / 20.1 s
        // = 0.12 turns/s. With c waiting, cold could serve 3 / 20.1 s =
        // 0.15 (not clearly more: c waits); with d and e waiting too,
        // 5 / 20.1 s = 0.25, twice as many (the engine could do 2.5/s):
        // holding no longer pays, and the waiters go in beyond the cache.
        let (v, mut ws) = third_session_after_cycles(20 * S);
        assert_eq!(v, Verdict::Wait);
        let t = 4 * (S / 10 + 20 * S);
        assert_eq!(ws.request(&"d", 400, t), Verdict::Wait);
        assert_eq!(ws.request(&"e", 400, t), Verdict::Wait);
        assert!(
            ws.holding_pays(),
            "decided again when the head is looked at"
        );
        let mut out = Vec::new();
        ws.admit_waiting(t, &mut out);
        assert!(!ws.holding_pays());
        assert!(!ws.stats().holding);
        assert_eq!(
            out,
            vec![
                ("c", Verdict::RunningColdPays),
                ("d", Verdict::RunningColdPays),
                ("e", Verdict::RunningColdPays)
            ]
        );
        assert!(ws.load() as f64 > ws.capacity());
    }

    #[test]
    fn turns_let_in_cold_teach_neither_the_turn_time_nor_the_capacity() {
        // As above: with tools of 20 s next to turns of 0.1 s, c, d and e
        // go in beyond the cache for running cold.
        let (_, mut ws) = third_session_after_cycles(20 * S);
        let mut t = 4 * (S / 10 + 20 * S);
        for k in ["d", "e"] {
            ws.request(&k, 400, t);
        }
        let mut out = Vec::new();
        ws.admit_waiting(t, &mut out);
        assert_eq!(out.len(), 3);
        for k in ["c", "d", "e"] {
            assert_eq!(ws.request(&k, 400, t), Verdict::RunningColdPays);
        }
        let hot_turn = ws.mean_turn_ns;
        // a's and b's windows ran out (20 s tools), so new sessions would
        // get none: taken back here, as this test is about what cold turns
        // teach (`a_session_too_new_to_judge_keeps_a_window_while_...`).
        ws.window_outcomes = WindowOutcomes::default();
        // Their turns run cold and long (50 s: the re-prefill, the engine's
        // queue), come back within the window and miss all they would have
        // hit as hot members.
        for _ in 0..4 {
            for k in ["c", "d", "e"] {
                ws.release(&k, 400, report(0, 0), t, t + 50 * S);
            }
            t += 50 * S + S / 2;
            for k in ["c", "d", "e"] {
                assert_eq!(ws.request(&k, 400, t), Verdict::Member);
            }
        }
        assert_eq!(ws.mean_turn_ns, hot_turn, "a cold turn is not a hot one");
        assert_eq!(ws.capacity(), 1000.0, "cold misses are not the capacity's");
        // So running cold still looks as far ahead to the next head.
        ws.release(&"c", 400, report(0, 0), t, t + 50 * S);
        ws.finish(&"c", t + 50 * S);
        assert_eq!(ws.request(&"f", 400, t + 50 * S), Verdict::RunningColdPays);
    }

    #[test]
    fn one_long_tool_call_does_not_make_running_cold_look_ahead() {
        // As above, with tools of 0.5 s but for one round of 200 s: the
        // arithmetic mean of the gaps would be over 10 s, and running five
        // sessions cold would look twice as good as holding; the usual
        // cycle is 0.6 s, where the engine cannot refill them in time.
        let (mut ws, t) = two_sessions_after(400, &[S / 2, S / 2, S / 2, 200 * S, S / 2]);
        for k in ["c", "d", "e"] {
            assert_eq!(ws.request(&k, 400, t), Verdict::Wait);
        }
        let mut out = Vec::new();
        ws.admit_waiting(t, &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert!(ws.holding_pays());
    }

    #[test]
    fn holding_resumes_only_once_running_cold_is_well_short_of_its_margin() {
        // Sessions of 440 tokens: 2.27 fit the 1000-token cache. Turns of
        // 0.1 s, tools of 20 s (no window: the tools outlast it).
        let (mut ws, mut t) = two_sessions_after(440, &[20 * S; 4]);
        // Four active: running cold serves 4 / 2.27 = 1.76 times as many
        // turns, past the margin (1.5): c and d go in.
        assert_eq!(ws.request(&"c", 440, t), Verdict::Wait);
        assert_eq!(ws.request(&"d", 440, t), Verdict::Wait);
        let mut out = Vec::new();
        ws.admit_waiting(t, &mut out);
        assert_eq!(
            out,
            vec![
                ("c", Verdict::RunningColdPays),
                ("d", Verdict::RunningColdPays)
            ]
        );
        // d ends; a's turn ends and its tool runs. Back with b and c in the
        // working set, three active: 3 / 2.27 = 1.32, short of the margin
        // but not of margin / 1.2 = 1.25: a still goes in, beyond the cache.
        ws.finish(&"d", t);
        ws.release(&"a", 440, report(0, 0), t, t + S / 10);
        t += S / 10 + 20 * S;
        assert!(!ws.is_member(&"a"));
        assert_eq!(ws.request(&"a", 440, t), Verdict::RunningColdPays);
        assert!(!ws.holding_pays());
        // c ends too, and b's tool runs: two active, no lead at all.
        // Holding resumes; b waits for room beside a and c's ghost.
        ws.finish(&"c", t);
        ws.release(&"b", 440, report(0, 0), t - 20 * S, t);
        t += 20 * S;
        ws.request(&"b", 440, t);
        assert!(ws.holding_pays());
    }

    #[test]
    fn a_head_waiting_past_the_bound_parks_a_member_for_itself() {
        let mut ws = set();
        ws.request(&"a", 600, 0);
        ws.request(&"b", 300, 0);
        assert_eq!(ws.request(&"c", 500, 0), Verdict::Wait);
        // a and b keep coming back within their windows; c is not let in
        // before the bound (16 windows of 1 s).
        let (t, let_in) = cycle_members(&mut ws, &[("a", 600), ("b", 300)], 0, 16 * S);
        assert!(let_in.is_empty(), "{let_in:?}");
        let mut out = Vec::new();
        ws.admit_waiting(t, &mut out);
        assert!(
            out.is_empty(),
            "a and b are in flight: nobody can be parked"
        );
        ws.release(&"b", 300, TurnReport::new(None, Some(0)), t, t + 1);
        ws.admit_waiting(t + 2, &mut out);
        assert!(
            out.is_empty(),
            "parking b alone leaves no room beside a in flight"
        );
        ws.release(&"a", 600, TurnReport::new(None, Some(0)), t, t + 3);
        ws.admit_waiting(t + 3, &mut out);
        assert_eq!(out, vec![("c", Verdict::WaitBound)]);
        // b (released first) went, then a: c is alone with 500 tokens.
        assert_eq!(ws.stats().parked, 2);
        assert_eq!(ws.load(), 500);
    }

    /// Two members of 400 then 450 tokens (1000 tokens, refilled at
    /// 1000/s): their first turns at 0 (a, then b beside it), their second
    /// turns released at 0.3 s (a) and 0.35 s (b) with `cached` tokens of
    /// the 400 their first turns left (a's, b's), and c asking for 400 at
    /// 0.4 s. c does not fit; both windows run to 1.3 s and beyond.
    fn both_members_in_tool_calls(cached: [Option<u64>; 2]) -> WorkingSet<&'static str> {
        let mut ws = set();
        assert_eq!(ws.request(&"a", 400, 0), Verdict::Empty);
        assert_eq!(ws.request(&"b", 400, 0), Verdict::Fits);
        ws.release(&"a", 400, report(0, 0), 0, S / 10);
        ws.release(&"b", 400, report(0, 0), 0, S / 10);
        assert_eq!(ws.request(&"a", 450, S / 5), Verdict::Member);
        assert_eq!(ws.request(&"b", 450, S / 5), Verdict::Member);
        ws.release(
            &"a",
            450,
            TurnReport::new(cached[0], Some(0)),
            S / 5,
            3 * S / 10,
        );
        ws.release(
            &"b",
            450,
            TurnReport::new(cached[1], Some(0)),
            S / 5,
            35 * S / 100,
        );
        assert_eq!(ws.request(&"c", 400, 4 * S / 10), Verdict::Wait);
        ws
    }

    /// How long an engine empty from now must idle until its idle time
    /// reaches the re-prefill measured so far plus `cost_ns` (both decayed
    /// over the wait bound, 16 windows; the cost not), ns.
    fn idle_catch_up(ws: &WorkingSet<&'static str>, cost_ns: f64) -> u64 {
        let stats = ws.stats();
        let tau = ((stats.window_ns as f64 * 16.0) as u64) as f64;
        let behind = tau + stats.reprefill_ns - stats.idle_with_waiters_ns;
        (tau * (behind / (tau - cost_ns)).ln()).ceil() as u64
    }

    /// c's admission for the idle engine is the working set's next
    /// deadline, `at`: not a microsecond before, and at it.
    fn c_goes_in_at_its_deadline(ws: &mut WorkingSet<&'static str>, at: u64) {
        assert_eq!(ws.next_deadline(), Some(at));
        let mut out = Vec::new();
        ws.admit_waiting(at - 1_000, &mut out);
        assert!(out.is_empty(), "a microsecond early: {out:?}");
        ws.admit_waiting(at, &mut out);
        assert_eq!(out, vec![("c", Verdict::EngineIdle)]);
    }

    #[test]
    fn an_empty_engine_lets_the_head_in_once_idle_outweighs_re_prefill() {
        // Nothing was re-prefilled (both second turns hit their 400): c goes
        // in once the engine's idle time (decayed over the 16 s bound) has
        // reached what letting it in costs: a's re-prefill (the member it
        // parks, released first; 450 tokens at 1000/s), a little after
        // 0.45 s of idling.
        let mut ws = both_members_in_tool_calls([Some(400); 2]);
        let at = 4 * S / 10 + idle_catch_up(&ws, 0.45e9);
        assert!(at > 85 * S / 100 && at < 86 * S / 100, "{at}");
        c_goes_in_at_its_deadline(&mut ws, at);
        assert_eq!(ws.stats().parked, 1, "a made room; b kept its window");
        assert_eq!(ws.request(&"b", 500, at + 1), Verdict::Member);
        assert_eq!(ws.request(&"a", 500, at + 1), Verdict::Wait, "a was parked");
    }

    #[test]
    fn re_prefill_measured_holds_an_idle_head_back_until_idle_catches_up() {
        // b's second turn missed 200 of its 400 tokens: 0.2 s re-prefilled
        // (a little less by 0.4 s: it decays, as idle time does, over the
        // 16 s bound). Idle must catch up with that and with a's re-prefill
        // (0.45 s): c goes in about 0.65 s after it began waiting, not 0.45.
        let mut ws = both_members_in_tool_calls([Some(400), Some(200)]);
        let stats = ws.stats();
        assert!(
            stats.reprefill_ns > 0.19e9 && stats.reprefill_ns < 0.2e9,
            "{stats:?}"
        );
        assert_eq!(stats.idle_with_waiters_ns, 0.0);
        let at = 4 * S / 10 + idle_catch_up(&ws, 0.45e9);
        assert!(at > 105 * S / 100 && at < 106 * S / 100, "{at}");
        c_goes_in_at_its_deadline(&mut ws, at);
        let stats = ws.stats();
        assert!(
            stats.idle_with_waiters_ns >= stats.reprefill_ns,
            "{stats:?}"
        );
    }

    #[test]
    fn without_cached_tokens_an_idle_engine_changes_nothing() {
        // Nothing says what letting c in would cost: it waits for a's
        // window to end (1 s from its release at 0.3 s), as before.
        let mut ws = both_members_in_tool_calls([None; 2]);
        assert_eq!(ws.next_deadline(), Some(13 * S / 10));
        let mut out = Vec::new();
        ws.admit_waiting(13 * S / 10 - 1, &mut out);
        assert!(out.is_empty(), "{out:?}");
        ws.admit_waiting(13 * S / 10, &mut out);
        assert_eq!(out, vec![("c", Verdict::Fits)]);
    }

    #[test]
    fn a_member_back_from_its_tool_call_ends_the_idle_stretch() {
        // b asks again at 0.6 s, before c's 0.85 s: the engine is busy.
        // When b's turn ends at 1.1 s the stretch starts over: c would go
        // in at 1.55 s (a's re-prefill time from then), after a's window
        // ends at 1.3 s and lets it in as fitting.
        let mut ws = both_members_in_tool_calls([Some(400); 2]);
        assert_eq!(ws.request(&"b", 500, 6 * S / 10), Verdict::Member);
        assert_eq!(ws.next_deadline(), Some(13 * S / 10), "a's window only");
        let mut out = Vec::new();
        ws.admit_waiting(S, &mut out);
        assert!(out.is_empty(), "{out:?}");
        ws.release(&"b", 500, report(450, 0), 6 * S / 10, 11 * S / 10);
        ws.admit_waiting(11 * S / 10 + 1, &mut out);
        assert!(out.is_empty(), "the stretch began at 1.1 s: {out:?}");
        assert_eq!(ws.next_deadline(), Some(13 * S / 10));
        ws.admit_waiting(13 * S / 10, &mut out);
        assert_eq!(out, vec![("c", Verdict::Fits)]);
    }

    /// The members' turns end at `t + 1` ns; at `t + 2` whoever may enter
    /// is let in (nobody is in flight then); their next turns ask at
    /// `t + 0.5 s`. Repeated from `from` while before `to`; returns the
    /// time reached and what was let in.
    fn cycle_members(
        ws: &mut WorkingSet<&'static str>,
        members: &[(&'static str, u64)],
        from: u64,
        to: u64,
    ) -> (u64, Vec<(&'static str, Verdict, u64)>) {
        let mut t = from;
        let mut let_in = Vec::new();
        while t < to {
            for (k, prompt) in members {
                ws.release(k, *prompt, TurnReport::new(None, Some(0)), t, t + 1);
            }
            let mut out = Vec::new();
            ws.admit_waiting(t + 2, &mut out);
            let_in.extend(out.into_iter().map(|(k, v)| (k, v, t + 2)));
            t += S / 2;
            for (k, prompt) in members {
                ws.request(k, *prompt, t);
            }
        }
        (t, let_in)
    }

    #[test]
    fn parks_forced_by_the_wait_bound_are_paid_off_before_the_next() {
        // 1000 tokens refilled at 1000/s: 1 s windows, a 16 s bound, and a
        // rotation budget refilled at 1000 / 16 = 62.5 tokens a second up
        // to 1000. Three sessions as large as a's queue behind it.
        let mut ws = set();
        ws.request(&"a", 900, 0);
        for k in ["c", "d", "e"] {
            assert_eq!(ws.request(&k, 900, 0), Verdict::Wait);
        }
        let (t, let_in) = cycle_members(&mut ws, &[("a", 900)], 0, 16 * S);
        assert!(let_in.is_empty(), "{let_in:?}");
        let ended = TurnReport::new(None, Some(0));
        let mut out = Vec::new();
        // c, past its bound, has a parked: 900 of the 1000 spent.
        ws.release(&"a", 900, ended, t, t + 1);
        ws.admit_waiting(t + 2, &mut out);
        assert_eq!(out, vec![("c", Verdict::WaitBound)]);
        ws.request(&"c", 900, t + 3);
        ws.release(&"c", 900, ended, t + 3, t + 4);
        // d, past its bound too, finds 100 left: c is parked, 800 owed.
        out.clear();
        ws.admit_waiting(t + 5, &mut out);
        assert_eq!(out, vec![("d", Verdict::WaitBound)]);
        assert_eq!(ws.stats().parked, 2);
        ws.request(&"d", 900, t + 6);
        // e waits past its bound until the 800 are paid off, 12.8 s later,
        // though d is between turns (and could be parked) every 0.5 s.
        let paid_off = t + 5 + 12_800_000_000;
        let next = ws.next_deadline().expect("e's wait ends");
        assert!((paid_off - 10..=paid_off).contains(&next), "{next}");
        let (_, let_in) = cycle_members(&mut ws, &[("d", 900)], t + 6, paid_off + S);
        assert_eq!(let_in.len(), 1, "{let_in:?}");
        let (who, why, when) = let_in[0];
        assert_eq!((who, why), ("e", Verdict::WaitBound));
        assert!((paid_off..paid_off + S / 2 + 3).contains(&when), "{when}");
    }

    #[test]
    fn the_wait_bound_counts_from_queueing() {
        let mut ws = set();
        ws.request(&"a", 600, 0);
        ws.request(&"b", 300, 0);
        assert_eq!(ws.request(&"c", 500, 0), Verdict::Wait);
        assert_eq!(ws.request(&"d", 500, S), Verdict::Wait);
        // a and b keep coming back within their windows (1 s; the bound is
        // 16 of them); at 8 s a ends and c, the head, goes in.
        let (t, let_in) = cycle_members(&mut ws, &[("a", 600), ("b", 300)], 0, 8 * S);
        assert!(let_in.is_empty(), "{let_in:?}");
        ws.release(&"a", 600, TurnReport::new(None, Some(0)), t, t + 1);
        ws.finish(&"a", t + 1);
        let mut out = Vec::new();
        ws.admit_waiting(t + 2, &mut out);
        assert_eq!(out, vec![("c", Verdict::Fits)]);
        ws.request(&"c", 500, t + 2);
        // d queued at 1 s and heads the line since 8 s: room is made for it
        // 16 windows after it queued, not after it reached the head.
        let (_, let_in) = cycle_members(&mut ws, &[("b", 300), ("c", 500)], t + S / 2, 30 * S);
        assert_eq!(let_in.len(), 1, "{let_in:?}");
        let (who, why, when) = let_in[0];
        assert_eq!((who, why), ("d", Verdict::WaitBound));
        assert!((17 * S..18 * S).contains(&when), "{when}");
    }

    #[test]
    fn misses_lower_the_estimate_and_clean_turns_restore_it() {
        let mut ws = set();
        ws.request(&"a", 500, 0);
        ws.release(&"a", 500, report(0, 0), 0, 1);
        for i in 0..20 {
            ws.request(&"a", 500, 2 + i * 2);
            ws.release(&"a", 500, report(0, 0), 2 + i * 2, 3 + i * 2);
        }
        let low = ws.capacity();
        assert!((500.0..1000.0).contains(&low), "{low}");
        for i in 0..200 {
            ws.request(&"a", 500, 100 + i * 2);
            ws.release(&"a", 500, report(499, 0), 100 + i * 2, 101 + i * 2);
        }
        assert!(ws.capacity() > 950.0, "{}", ws.capacity());
    }

    /// 20 turns of a member whose agent keeps its first 200 tokens and
    /// rewrites the 300 after each turn (as one that stubs old tool
    /// results); the engine hits the 200 kept, of which its first turn hit
    /// `shared` (the prefix it shares with others). The sketch goes to the
    /// working set only if `sketched`. Returns the capacity after.
    fn rewriting_member(sketched: bool, shared: u64) -> f64 {
        let mut ws = set();
        for turn in 0..20u32 {
            let prompt: Vec<u32> = (0..200)
                .chain((0..300).map(|i| 10_000 * (turn + 1) + i))
                .collect();
            let sketch = PromptSketch::of(&prompt);
            let t = u64::from(turn) * 2;
            let verdict = ws.request_sketched(&"a", 500, sketched.then_some(&sketch), t);
            assert_ne!(verdict, Verdict::Wait);
            let cached = if turn == 0 { shared } else { 200 };
            ws.release(&"a", 500, report(cached, 0), t, t + 1);
        }
        ws.capacity()
    }

    #[test]
    fn a_member_that_rewrites_its_history_does_not_lower_the_estimate() {
        assert_eq!(rewriting_member(true, 100), 1000.0);
        assert_eq!(rewriting_member(true, 200), 1000.0);
        // Told only lengths, a turn that kept more than the shared prefix
        // and less than the last prompt is not taken for an eviction (which
        // takes a member's own blocks whole, least recently freed first).
        assert_eq!(rewriting_member(false, 100), 1000.0);
        // What it kept is no more than the shared prefix: from lengths
        // alone that is an eviction.
        assert!(rewriting_member(false, 200) < 1000.0);
    }

    #[test]
    fn a_member_that_appends_still_teaches_its_misses_with_sketches() {
        let mut ws = set();
        let history: Vec<u32> = (0..900).collect();
        for turn in 0..20u64 {
            let prompt = &history[..(400 + 20 * turn) as usize];
            let sketch = PromptSketch::of(prompt);
            ws.request_sketched(&"a", prompt.len() as u64, Some(&sketch), turn * 2);
            // Evicted: nothing hits.
            ws.release(
                &"a",
                prompt.len() as u64,
                report(0, 0),
                turn * 2,
                turn * 2 + 1,
            );
        }
        assert!(ws.capacity() < 1000.0, "{}", ws.capacity());
    }

    #[test]
    fn a_prompt_shorter_than_the_last_teaches_nothing_without_sketches() {
        // As after a compaction: a turn that cannot extend the last one is
        // expected to hit nothing in particular, so its misses teach nothing
        // (`misses_lower_the_estimate_and_clean_turns_restore_it` is the
        // same with prompts that could).
        let mut ws = set();
        for turn in 0..20u64 {
            let prompt = 600 - 10 * turn;
            ws.request(&"a", prompt, turn * 2);
            ws.release(&"a", prompt, report(0, 0), turn * 2, turn * 2 + 1);
        }
        assert_eq!(ws.capacity(), 1000.0);
    }

    #[test]
    fn a_gate_blind_to_sharing_learns_it_from_the_usage_gauge() {
        // Lengths only, no cached tokens: three 300-token turns count 900.
        let mut ws = set();
        assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
        assert_eq!(ws.request(&"b", 300, 0), Verdict::Fits);
        assert_eq!(ws.request(&"c", 300, 0), Verdict::Fits);
        assert_eq!(ws.load(), 900);
        // The engine holds 500: each turn beyond the first shares 200.
        ws.observe_usage(0.5);
        assert_eq!(ws.shared_prefix, 200);
        assert_eq!(ws.load(), 500);
        ws.audit().unwrap();
        // A newcomer is counted without it: 500 + 100 fits.
        assert_eq!(ws.request(&"d", 300, 0), Verdict::Fits);
        assert_eq!(ws.load(), 600);
        // An answer that says more sharing (1200 in prompts, 350 held: 283
        // each) moves nothing: the least of the recent answers stands.
        ws.observe_usage(0.35);
        assert_eq!(ws.shared_prefix, 200);
        ws.audit().unwrap();
    }

    #[test]
    fn a_usage_answer_below_the_longest_prompt_in_flight_teaches_no_sharing() {
        let mut ws = set();
        assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
        assert_eq!(ws.request(&"b", 200, 0), Verdict::Fits);
        // 250 held while a alone holds 300: a turn is not in the engine yet.
        ws.observe_usage(0.25);
        assert_eq!(ws.shared_prefix, 0);
        // 400 held: b shares 100 with a.
        ws.observe_usage(0.4);
        assert_eq!(ws.shared_prefix, 100);
    }

    #[test]
    fn a_gate_that_sees_cached_tokens_or_prompt_ids_does_not_ask_the_gauge() {
        let mut ws = set();
        assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
        ws.release(&"a", 300, report(0, 0), 0, 10);
        assert_eq!(ws.request(&"b", 300, 20), Verdict::Fits);
        assert_eq!(ws.request(&"a", 300, 20), Verdict::Member);
        ws.observe_usage(0.3);
        assert_eq!(ws.shared_prefix, 0);
        let mut ws = set();
        let ids: Vec<u32> = (0..300).collect();
        let sketch = PromptSketch::of(&ids);
        ws.request_sketched(&"a", 300, Some(&sketch), 0);
        ws.request_sketched(&"b", 300, Some(&sketch), 0);
        ws.observe_usage(0.3);
        assert_eq!(ws.shared_prefix, 0);
    }

    #[test]
    fn without_the_engine_capacity_usage_answers_estimate_it() {
        let mut ws: WorkingSet<u32> = WorkingSet::new(Tuning::default());
        ws.request(&1, 300, 0);
        ws.request(&2, 300, 0);
        // 600 tokens in flight hold 60% of the blocks: about 1000 in all.
        ws.observe_usage(0.6);
        assert_eq!(ws.capacity(), 1000.0);
        // One of them still queued in the engine: 600 tokens counted, 30%
        // held. That says 2000, which is wrong; the estimate keeps 1000.
        ws.observe_usage(0.3);
        assert_eq!(ws.capacity(), 1000.0);
        assert_eq!(ws.request(&3, 500, 1), Verdict::Wait);
        // The engine's own figure wins over the estimate.
        ws.set_engine(EngineCapacity::new(5000, 1, 0.0));
        ws.observe_usage(0.01);
        assert_eq!(ws.capacity(), 5000.0);
    }

    #[test]
    fn with_no_capacity_known_everyone_fits() {
        let mut ws: WorkingSet<u32> = WorkingSet::new(Tuning::default());
        for k in 0..100 {
            assert_ne!(ws.request(&k, 1_000_000, 0), Verdict::Wait);
        }
    }
}

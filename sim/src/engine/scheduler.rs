//! One replica's continuous-batching loop, as vLLM v1's `Scheduler`
//! (`vllm/v1/core/sched/scheduler.py`, FCFS policy):
//!
//! 1. RUNNING requests first, in order, each taking
//!    `min(remaining, long_prefill_token_threshold, token budget)` tokens
//!    (chunked prefill; a decode takes one). If its slots cannot be
//!    allocated, the *last* running request is preempted by recompute (its
//!    blocks freed but still hashed, `num_computed_tokens = 0`, put at the
//!    front of the waiting queue), until it fits or it preempted itself.
//! 2. If nothing was preempted in this step, WAITING requests in FCFS order
//!    while there is budget and fewer than `max_num_seqs` run: each looks up
//!    its longest cached prefix (capped at `num_tokens - 1`), and the queue
//!    stops at the first request whose slots cannot be allocated
//!    (head-of-line blocking).
//! 3. The step takes `β0 + β1·prefill + β2·decode + β3·context + β4·attention
//!    pairs` (see [`super::step_time`]); at its
//!    end each request that computed all its known tokens samples one token,
//!    and a request with all its output tokens finishes and frees its blocks
//!    (or pins them, under the `ttl-pin` policy).
//!
//! Requests and probes that arrive during a step are taken in at its end,
//! as vLLM's engine core drains its input queue between steps.

use std::collections::VecDeque;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::block_pool::BlockId;
use super::hashing::BlockHash;
use super::host_tier::HostTier;
use super::kv_manager::{BlockTable, KvCacheManager};
use super::pins::{PinTicket, Pins};
use super::step_time::StepLoad;
use super::EngineConfig;

/// Engine-wide request id.
pub type ReqId = u64;

/// A request as the client sends it: one turn of one session.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// Unique id.
    pub id: ReqId,
    /// Index of the session.
    pub session: usize,
    /// Turn index within the session.
    pub turn: usize,
    /// Chained hashes of the session's whole token stream; the request only
    /// ever reads those of tokens it knows (prompt and outputs so far).
    pub hashes: Rc<[BlockHash]>,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Tokens to generate (`max_tokens`; the workload fixes the output).
    pub max_output: usize,
    /// Under `ttl-pin`: pin the blocks when it finishes (false on the last turn).
    pub pin_after: bool,
    /// Tokens at the start of the prompt that the session's earlier
    /// requests also began with: computing tokens past this point is new
    /// work, not re-prefill, even if the session once computed that far (its
    /// agent rewrote the history there).
    pub reused: usize,
}

/// A request scheduled from WAITING for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstScheduled {
    /// The request.
    pub id: ReqId,
    /// Its session.
    pub session: usize,
    /// Its turn.
    pub turn: usize,
    /// Prompt tokens (the hit-rate query).
    pub prompt_len: usize,
    /// Tokens found in the prefix cache (GPU and host tier).
    pub hit_tokens: usize,
    /// Of those, tokens copied back from the host tier.
    pub tier_hit_tokens: usize,
}

/// A request that generated all its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The request.
    pub id: ReqId,
    /// Its session.
    pub session: usize,
    /// Its turn.
    pub turn: usize,
    /// Tokens it prefilled, recomputation after preemption included.
    pub prefilled: usize,
    /// Of those, tokens its session had computed before (evicted or preempted work).
    pub re_prefilled: usize,
    /// Times the engine preempted it.
    pub preemptions: u32,
    /// Set when its blocks were pinned: arm the expiry for this ticket.
    pub pinned: Option<PinTicket>,
}

/// Counters of one replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Steps run.
    pub steps: u64,
    /// Time spent in steps, ns.
    pub busy_ns: u64,
    /// Prefill tokens computed (recompute included).
    pub prefill_tokens: u64,
    /// Decode tokens computed.
    pub decode_tokens: u64,
    /// Prefill tokens a session had computed before.
    pub re_prefilled_tokens: u64,
    /// Preemptions by recompute.
    pub preemptions: u64,
    /// Prompt tokens of requests scheduled for the first time (hit-rate queries).
    pub query_tokens: u64,
    /// Of those, prefix-cache hits (GPU and host tier).
    pub hit_tokens: u64,
    /// Of the hits, tokens copied back from the host tier.
    pub tier_hit_tokens: u64,
    /// Tokens looked up again by requests resumed after preemption.
    pub resumed_query_tokens: u64,
    /// Of those, hits (GPU and host tier).
    pub resumed_hit_tokens: u64,
    /// Tokens copied back from the host tier (first and resumed lookups).
    pub reloaded_tokens: u64,
    /// Step time spent copying them, ns.
    pub reload_ns: u64,
    /// Blocks the host tier evicted.
    pub tier_evictions: u64,
    /// Pins taken.
    pub pins: u64,
    /// Pins released because the session's next turn was scheduled.
    pub pins_used: u64,
    /// Pins released at their TTL.
    pub pins_expired: u64,
    /// Pins released to make room.
    pub pins_dropped_for_memory: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Waiting,
    Running,
}

#[derive(Debug)]
struct Request {
    spec: NewRequest,
    num_output: usize,
    num_computed: usize,
    table: BlockTable,
    status: Status,
    scheduled_once: bool,
    preemptions: u32,
    prefilled: usize,
    re_prefilled: usize,
}

impl Request {
    fn num_tokens(&self) -> usize {
        self.spec.prompt_len + self.num_output
    }
}

/// What a step begun computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Step duration, ns.
    pub duration_ns: u64,
    /// Prefill tokens in the step.
    pub prefill_tokens: usize,
    /// Decode tokens in the step.
    pub decode_tokens: usize,
    /// Requests scheduled for the first time in this step.
    pub first_scheduled: Vec<FirstScheduled>,
}

/// One vLLM replica: KV cache, queues, and the step in flight.
#[derive(Debug)]
pub struct Replica {
    cfg: EngineConfig,
    kv: KvCacheManager,
    requests: FxHashMap<ReqId, Request>,
    waiting: VecDeque<ReqId>,
    running: Vec<ReqId>,
    in_flight: Option<Vec<(ReqId, usize)>>,
    pins: Pins,
    pinning: bool,
    tier: Option<HostTier>,
    /// Per session: tokens of its stream whose KV it has ever computed.
    high_water: FxHashMap<usize, usize>,
    stats: EngineStats,
    hits_scratch: Vec<BlockId>,
    /// Key of its step-time noise (`noise::key`).
    noise_key: u64,
}

impl Replica {
    /// An idle replica. `pinning` turns on TTL pins (the `ttl-pin` policy).
    pub fn new(cfg: EngineConfig, pinning: bool) -> Self {
        Self {
            kv: KvCacheManager::new(cfg.num_gpu_blocks, cfg.block_size),
            cfg,
            requests: FxHashMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            pins: Pins::default(),
            pinning,
            tier: cfg.tier.map(HostTier::new),
            high_water: FxHashMap::default(),
            stats: EngineStats::default(),
            hits_scratch: Vec::new(),
            noise_key: 0,
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            tier_evictions: self.tier.as_ref().map_or(0, HostTier::evictions),
            ..self.stats
        }
    }

    /// The KV cache (read-only).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// vLLM's `kv_cache_usage`.
    pub fn usage(&self) -> f64 {
        self.kv.usage()
    }

    /// The read-only prefix probe: longest resident prefix of a
    /// `prompt_len`-token prompt over its length (the `num_tokens - 1` cap
    /// applies, as in `find_longest_cache_hit`). No LRU touch, no statistics.
    pub fn prefix_hit_ratio(&self, hashes: &[BlockHash], prompt_len: usize) -> f64 {
        if prompt_len == 0 {
            return 0.0;
        }
        let known = &hashes[..(prompt_len / self.cfg.block_size).min(hashes.len())];
        self.kv.hit_tokens(known, prompt_len) as f64 / prompt_len as f64
    }

    /// Whether a step is in flight.
    pub fn is_busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Requests in the waiting queue (what vLLM's `num_requests_waiting` says).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests running (what vLLM's `num_requests_running` says).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting plus running: the router's load figure.
    pub fn num_requests(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Live pins.
    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }

    /// Queues a request: at the back, as vLLM's FCFS `add_request`; under
    /// `ttl-pin`, a session holding a pin goes to the front.
    pub fn add(&mut self, spec: NewRequest) {
        let id = spec.id;
        assert!(
            spec.max_output >= 1,
            "a request generates at least one token"
        );
        let max_tokens = spec.prompt_len + spec.max_output;
        if let Some(hw) = self.high_water.get_mut(&spec.session) {
            *hw = (*hw).min(spec.reused);
        }
        assert!(
            max_tokens.div_ceil(self.cfg.block_size) < self.cfg.num_gpu_blocks,
            "request {id} ({max_tokens} tokens) can never fit the KV cache"
        );
        let prev = self.requests.insert(
            id,
            Request {
                spec,
                num_output: 0,
                num_computed: 0,
                table: BlockTable::default(),
                status: Status::Waiting,
                scheduled_once: false,
                preemptions: 0,
                prefilled: 0,
                re_prefilled: 0,
            },
        );
        assert!(prev.is_none(), "request id {id} reused");
        // Continuum schedules a pinned session's next turn first.
        if self.pinning && self.pins.holds(self.requests[&id].spec.session) {
            self.waiting.push_front(id);
        } else {
            self.waiting.push_back(id);
        }
    }

    /// Aborts a request that is waiting and was never scheduled (a client
    /// retry of a turn still queued). Returns whether it was.
    pub fn abort_unscheduled(&mut self, id: ReqId) -> bool {
        match self.requests.get(&id) {
            Some(r) if r.status == Status::Waiting && !r.scheduled_once => {}
            _ => return false,
        }
        self.requests.remove(&id);
        let pos = self.waiting.iter().position(|&w| w == id).expect("waiting");
        self.waiting.remove(pos);
        true
    }

    /// Whether request `id` is still queued and was never scheduled.
    pub fn is_unscheduled(&self, id: ReqId) -> bool {
        self.requests
            .get(&id)
            .is_some_and(|r| r.status == Status::Waiting && !r.scheduled_once)
    }

    /// Ends a pin at its TTL, if `ticket` still names it.
    pub fn expire_pin(&mut self, session: usize, ticket: PinTicket) -> bool {
        match self.pins.expire(session, ticket) {
            Some(blocks) => {
                self.kv.free_blocks(blocks);
                self.stats.pins_expired += 1;
                true
            }
            None => false,
        }
    }

    /// Sets the key of this replica's step-time noise (`noise::key`).
    pub fn set_noise_key(&mut self, key: u64) {
        self.noise_key = key;
    }

    /// [`begin_step`](Self::begin_step) at `now`, its duration times the
    /// engine's noise (`EngineConfig::noise`) for this step.
    pub fn begin_step_at(&mut self, now: u64) -> Option<StepPlan> {
        let index = self.stats.steps;
        let mut plan = self.begin_step()?;
        if !self.cfg.noise.is_quiet() {
            let f = self.cfg.noise.factor(self.noise_key, index, now);
            let noisy = (plan.duration_ns as f64 * f).round().max(1.0) as u64;
            self.stats.busy_ns = self.stats.busy_ns - plan.duration_ns + noisy;
            plan.duration_ns = noisy;
        }
        Some(plan)
    }

    /// Schedules the next step, or returns `None` (and stays idle) if
    /// nothing can run.
    pub fn begin_step(&mut self) -> Option<StepPlan> {
        assert!(self.in_flight.is_none(), "a step is already in flight");
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut scheduled: Vec<(ReqId, usize)> = Vec::new();
        let mut preempted_any = false;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let n = {
                let r = &self.requests[&id];
                self.chunk(r.num_tokens() - r.num_computed, budget)
            };
            let mut fits = false;
            loop {
                if self.allocate(id, &[], n) {
                    fits = true;
                    break;
                }
                if self.drop_a_pin(None) {
                    continue;
                }
                let victim = self.running.pop().expect("the request itself runs");
                self.preempt(victim);
                preempted_any = true;
                if victim == id {
                    break;
                }
            }
            if !fits {
                break;
            }
            scheduled.push((id, n));
            budget -= n;
            i += 1;
        }

        let mut first_scheduled = Vec::new();
        let mut reload = 0;
        // vLLM admits no WAITING request in a step that preempted.
        while !preempted_any && budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let mut hits = std::mem::take(&mut self.hits_scratch);
            let (session, num_tokens, tier_hit) = {
                let r = &self.requests[&id];
                debug_assert_eq!(r.num_computed, 0);
                let num_tokens = r.num_tokens();
                let known = &r.spec.hashes[..num_tokens / self.cfg.block_size];
                self.kv
                    .find_longest_cache_hit(known, num_tokens - 1, &mut hits);
                // The tier continues the GPU hit, under the same cap.
                let limit = ((num_tokens - 1) / self.cfg.block_size).min(known.len());
                let tier_hit = self.tier.as_ref().map_or(0, |t| {
                    t.run_length(&known[hits.len().min(limit)..limit]) * self.cfg.block_size
                });
                (r.spec.session, num_tokens, tier_hit)
            };
            let hit = hits.len() * self.cfg.block_size;
            let n = self.chunk(num_tokens - hit - tier_hit, budget);
            let mut fits = false;
            loop {
                // Reloaded tokens take GPU blocks like computed ones.
                if self.allocate(id, &hits, tier_hit + n) {
                    fits = true;
                    break;
                }
                if !self.drop_a_pin(Some(session)) {
                    break;
                }
            }
            self.hits_scratch = hits;
            if !fits {
                break; // head-of-line blocking
            }
            self.waiting.pop_front();
            self.running.push(id);
            let r = self.requests.get_mut(&id).expect("queued");
            r.status = Status::Running;
            r.num_computed = hit + tier_hit;
            reload += tier_hit;
            self.stats.reloaded_tokens += tier_hit as u64;
            if r.scheduled_once {
                self.stats.resumed_query_tokens += num_tokens as u64;
                self.stats.resumed_hit_tokens += (hit + tier_hit) as u64;
            } else {
                r.scheduled_once = true;
                self.stats.query_tokens += r.spec.prompt_len as u64;
                self.stats.hit_tokens += (hit + tier_hit) as u64;
                self.stats.tier_hit_tokens += tier_hit as u64;
                first_scheduled.push(FirstScheduled {
                    id,
                    session,
                    turn: r.spec.turn,
                    prompt_len: r.spec.prompt_len,
                    hit_tokens: hit + tier_hit,
                    tier_hit_tokens: tier_hit,
                });
            }
            // The new turn's hits now hold what the pin protected.
            if let Some(blocks) = self.pins.unpin(session) {
                self.kv.free_blocks(blocks);
                self.stats.pins_used += 1;
            }
            scheduled.push((id, n));
            budget -= n;
        }

        if scheduled.is_empty() {
            return None;
        }
        let mut load = StepLoad::default();
        for &(id, n) in &scheduled {
            let r = self.requests.get_mut(&id).expect("scheduled");
            let is_decode = n == 1 && r.num_output > 0 && r.num_computed + 1 == r.num_tokens();
            let start = r.num_computed;
            load.add(start as u64, n as u64, is_decode);
            let hw = self.high_water.entry(r.spec.session).or_insert(0);
            if !is_decode {
                r.prefilled += n;
                let again = (*hw).min(start + n).saturating_sub(start);
                r.re_prefilled += again;
                self.stats.re_prefilled_tokens += again as u64;
            }
            *hw = (*hw).max(start + n);
        }
        // Copies take step time and no compute.
        let reload_ns = self
            .tier
            .as_ref()
            .map_or(0, |t| t.config().reload_ns(reload));
        self.stats.reload_ns += reload_ns;
        let duration_ns = self.cfg.cost.step_ns(load) + reload_ns;
        self.stats.steps += 1;
        self.stats.busy_ns += duration_ns;
        self.stats.prefill_tokens += load.prefill;
        self.stats.decode_tokens += load.decode;
        self.in_flight = Some(scheduled);
        Some(StepPlan {
            duration_ns,
            prefill_tokens: load.prefill as usize,
            decode_tokens: load.decode as usize,
            first_scheduled,
        })
    }

    /// Ends the step in flight at `now`: advances the scheduled requests,
    /// samples tokens, and returns the requests that finished.
    pub fn end_step(&mut self, now: u64) -> Vec<Finished> {
        let scheduled = self.in_flight.take().expect("a step is in flight");
        let mut finished = Vec::new();
        for (id, n) in scheduled {
            let r = self.requests.get_mut(&id).expect("scheduled");
            r.num_computed += n;
            if r.num_computed == r.num_tokens() {
                r.num_output += 1;
                if r.num_output == r.spec.max_output {
                    finished.push(id);
                }
            }
        }
        let mut out = Vec::with_capacity(finished.len());
        if !finished.is_empty() {
            self.running.retain(|id| !finished.contains(id));
        }
        for id in finished {
            let mut r = self.requests.remove(&id).expect("finished");
            if let Some(tier) = &mut self.tier {
                // The connector applies a request's accesses at its end.
                tier.touch(&r.spec.hashes[..r.num_tokens() / self.cfg.block_size]);
            }
            let pinned = if self.pinning && r.spec.pin_after {
                let (ticket, older) = self.pins.pin(r.spec.session, r.table.take(), now);
                if let Some(blocks) = older {
                    self.kv.free_blocks(blocks);
                }
                self.stats.pins += 1;
                Some(ticket)
            } else {
                self.kv.free(&mut r.table);
                None
            };
            out.push(Finished {
                id,
                session: r.spec.session,
                turn: r.spec.turn,
                prefilled: r.prefilled,
                re_prefilled: r.re_prefilled,
                preemptions: r.preemptions,
                pinned,
            });
        }
        out
    }

    fn chunk(&self, remaining: usize, budget: usize) -> usize {
        let mut n = remaining.min(budget);
        if self.cfg.long_prefill_token_threshold > 0 {
            n = n.min(self.cfg.long_prefill_token_threshold);
        }
        debug_assert!(n > 0);
        n
    }

    /// Allocates `n` more tokens of `id` (after the GPU `hits`), storing
    /// the blocks it makes full in the host tier (write-through).
    fn allocate(&mut self, id: ReqId, hits: &[BlockId], n: usize) -> bool {
        let r = self.requests.get_mut(&id).expect("known request");
        let num_tokens = r.num_tokens();
        let hashes = &r.spec.hashes[..num_tokens / self.cfg.block_size];
        let Some(full) =
            self.kv
                .allocate_slots(&mut r.table, r.num_computed, hits, n, hashes, num_tokens)
        else {
            return false;
        };
        if let Some(tier) = &mut self.tier {
            tier.store(&hashes[full]);
        }
        true
    }

    /// Under memory pressure, ends the oldest pin (sparing `spare` if it can).
    fn drop_a_pin(&mut self, spare: Option<usize>) -> bool {
        match self.pins.unpin_oldest(spare) {
            Some(blocks) => {
                self.kv.free_blocks(blocks);
                self.stats.pins_dropped_for_memory += 1;
                true
            }
            None => false,
        }
    }

    fn preempt(&mut self, id: ReqId) {
        let r = self.requests.get_mut(&id).expect("running");
        self.kv.free(&mut r.table);
        r.num_computed = 0;
        r.status = Status::Waiting;
        r.preemptions += 1;
        self.stats.preemptions += 1;
        self.waiting.push_front(id);
    }
}

#[cfg(test)]
mod tests {
    use super::super::hashing::chain;
    use super::super::TierConfig;
    use super::*;

    fn cfg(blocks: usize, budget: usize, max_seqs: usize) -> EngineConfig {
        EngineConfig {
            num_gpu_blocks: blocks,
            block_size: 4,
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            long_prefill_token_threshold: 0,
            ..EngineConfig::default()
        }
    }

    /// A session stream of `len` distinct tokens.
    fn stream(session: usize, len: usize) -> Rc<[BlockHash]> {
        let tokens: Vec<u32> = (0..len as u32).map(|i| i + 1000 * session as u32).collect();
        chain(&tokens, 4).into()
    }

    fn req(
        id: ReqId,
        session: usize,
        hashes: &Rc<[BlockHash]>,
        prompt: usize,
        out: usize,
    ) -> NewRequest {
        NewRequest {
            id,
            session,
            turn: 0,
            hashes: hashes.clone(),
            prompt_len: prompt,
            max_output: out,
            pin_after: true,
            reused: usize::MAX,
        }
    }

    /// Runs steps until nothing can run; returns the finished ids in order.
    fn drain(r: &mut Replica) -> Vec<ReqId> {
        let mut done = Vec::new();
        let mut now = 0;
        while let Some(plan) = r.begin_step() {
            now += plan.duration_ns;
            done.extend(r.end_step(now).into_iter().map(|f| f.id));
        }
        done
    }

    #[test]
    fn chunked_prefill_takes_the_budget_and_the_last_chunk_samples() {
        let mut r = Replica::new(cfg(64, 8, 16), false);
        let h = stream(0, 40);
        r.add(req(1, 0, &h, 20, 3));
        let p = r.begin_step().unwrap();
        assert_eq!((p.prefill_tokens, p.decode_tokens), (8, 0));
        let cost = EngineConfig::default().cost;
        let chunk = |cached: u64, n: u64| {
            let mut l = StepLoad::default();
            l.add(cached, n, false);
            cost.step_ns(l)
        };
        assert_eq!(p.duration_ns, chunk(0, 8));
        assert!(r.end_step(1).is_empty());
        // The second chunk attends over the first: it costs more.
        let p2 = r.begin_step().unwrap();
        assert_eq!((p2.prefill_tokens, p2.duration_ns), (8, chunk(8, 8)));
        assert!(p2.duration_ns > p.duration_ns);
        assert!(r.end_step(2).is_empty());
        // The last chunk (4 tokens) completes the prompt and samples token 1.
        assert_eq!(r.begin_step().unwrap().prefill_tokens, 4);
        assert!(r.end_step(3).is_empty());
        // Two decode steps for tokens 2 and 3.
        let p = r.begin_step().unwrap();
        assert_eq!((p.prefill_tokens, p.decode_tokens), (0, 1));
        assert!(r.end_step(4).is_empty());
        r.begin_step().unwrap();
        let done = r.end_step(5);
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].prefilled, done[0].re_prefilled), (20, 0));
        assert!(r.begin_step().is_none());
        assert_eq!(r.usage(), 0.0);
    }

    #[test]
    fn running_requests_go_first_and_max_num_seqs_caps_admission() {
        let mut r = Replica::new(cfg(64, 100, 2), false);
        for s in 0..3 {
            r.add(req(s as u64, s, &stream(s, 40), 8, 2));
        }
        let p = r.begin_step().unwrap();
        assert_eq!(
            p.first_scheduled.iter().map(|f| f.id).collect::<Vec<_>>(),
            vec![0, 1]
        );
        r.end_step(1);
        // Both decode; the third waits for a free seat.
        let p = r.begin_step().unwrap();
        assert_eq!((p.prefill_tokens, p.decode_tokens), (0, 2));
        assert!(p.first_scheduled.is_empty());
        assert_eq!(r.end_step(2).len(), 2);
        let p = r.begin_step().unwrap();
        assert_eq!(p.first_scheduled[0].id, 2);
    }

    #[test]
    fn the_waiting_queue_blocks_at_its_head() {
        // 10 usable blocks (40 tokens). A runs with 24 tokens (6 blocks).
        let mut r = Replica::new(cfg(11, 100, 16), false);
        r.add(req(1, 0, &stream(0, 80), 24, 10));
        r.begin_step().unwrap();
        r.end_step(1);
        // B needs 6 blocks (only 4 free); C needs 1 and would fit, but waits behind B.
        r.add(req(2, 1, &stream(1, 80), 24, 1));
        r.add(req(3, 2, &stream(2, 80), 3, 1));
        let p = r.begin_step().unwrap();
        assert!(p.first_scheduled.is_empty());
        assert_eq!(p.decode_tokens, 1);
    }

    #[test]
    fn out_of_blocks_preempts_the_last_running_request_by_recompute() {
        // 8 usable blocks of 4 tokens. A (15 tokens) and B (16) take 4 each.
        let mut r = Replica::new(cfg(9, 100, 16), false);
        let hb = stream(1, 64);
        r.add(req(1, 0, &stream(0, 64), 15, 3));
        r.add(req(2, 1, &hb, 16, 3));
        let p = r.begin_step().unwrap();
        assert_eq!(p.first_scheduled.len(), 2);
        assert_eq!(r.kv().pool().num_free(), 0);
        r.end_step(1); // A knows 16 tokens, B 17
        r.add(req(3, 2, &stream(2, 64), 4, 1));
        // A's next token fits its 4th block; B's needs a 5th and none is
        // free, so B, the last running request, preempts itself.
        let p = r.begin_step().unwrap();
        assert_eq!(p.decode_tokens, 1);
        assert!(
            p.first_scheduled.is_empty(),
            "no admission in a step that preempted"
        );
        assert_eq!(r.stats().preemptions, 1);
        r.end_step(2);
        // B's blocks were freed but stay hashed; it waits at the front.
        assert_eq!(r.waiting.iter().copied().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(r.requests[&2].num_computed, 0);
        assert_eq!(r.kv().pool().num_free(), 4);
        assert_eq!(r.kv().hit_tokens(&hb[..4], 17), 16);
    }

    #[test]
    fn a_preempted_request_recomputes_and_counts_re_prefill() {
        let mut r = Replica::new(cfg(9, 100, 16), false);
        r.add(req(1, 0, &stream(0, 64), 15, 3));
        r.add(req(2, 1, &stream(1, 64), 16, 3));
        assert_eq!(drain(&mut r), vec![1, 2]);
        let s = r.stats();
        assert_eq!(s.preemptions, 1);
        // A's growth evicted B's last block (freed first, so evicted first);
        // B re-hits its first 3 blocks and recomputes tokens 12..17, of which
        // 12..16 it had computed before.
        assert_eq!((s.resumed_query_tokens, s.resumed_hit_tokens), (17, 12));
        assert_eq!(s.prefill_tokens, 15 + 16 + 5);
        assert_eq!(s.re_prefilled_tokens, 4);
        assert_eq!((s.query_tokens, s.hit_tokens), (31, 0));
    }

    #[test]
    fn the_next_turn_hits_the_previous_prompt_and_output() {
        let mut r = Replica::new(cfg(64, 100, 16), false);
        let h = stream(0, 200);
        r.add(req(1, 0, &h, 30, 6)); // blocks of tokens 0..35 get cached
        drain(&mut r);
        // Next turn: prompt = 30 + 6 outputs + 10 tool-result tokens.
        let mut next = req(2, 0, &h, 46, 2);
        next.turn = 1;
        r.add(next);
        let p = r.begin_step().unwrap();
        // Full blocks within the 35 computed tokens: 8 blocks = 32 tokens.
        assert_eq!(p.first_scheduled[0].hit_tokens, 32);
        assert_eq!(p.prefill_tokens, 14);
    }

    #[test]
    fn the_prefix_probe_reads_without_touching() {
        let mut r = Replica::new(cfg(64, 100, 16), false);
        let h = stream(0, 200);
        r.add(req(1, 0, &h, 30, 6));
        drain(&mut r);
        let queue = r.kv().pool().free_queue();
        let before = r.stats();
        assert_eq!(r.prefix_hit_ratio(&h, 46), 32.0 / 46.0);
        // Capped at prompt_len - 1: a 32-token prompt hits 28 tokens.
        assert_eq!(r.prefix_hit_ratio(&h, 32), 28.0 / 32.0);
        assert_eq!(r.kv().pool().free_queue(), queue);
        assert_eq!(r.stats(), before);
    }

    #[test]
    fn pins_keep_a_session_resident_until_its_next_turn() {
        let mut r = Replica::new(cfg(64, 100, 16), true);
        let h = stream(0, 200);
        r.add(req(1, 0, &h, 30, 6));
        r.begin_step().unwrap();
        r.end_step(1);
        for _ in 0..5 {
            r.begin_step().unwrap();
            let f = r.end_step(2);
            if let Some(f) = f.first() {
                assert!(f.pinned.is_some());
            }
        }
        assert_eq!(r.num_pins(), 1);
        // Pinned blocks are referenced: usage sees them.
        assert!((r.usage() - 9.0 / 63.0).abs() < 1e-12);
        let mut next = req(2, 0, &h, 46, 1);
        next.pin_after = false;
        r.add(next);
        let p = r.begin_step().unwrap();
        assert_eq!(p.first_scheduled[0].hit_tokens, 32);
        assert_eq!(
            r.num_pins(),
            0,
            "released once the next turn holds the blocks"
        );
        assert_eq!(r.stats().pins_used, 1);
    }

    #[test]
    fn memory_pressure_drops_pins_before_preempting() {
        // 12 usable blocks; a pinned 32-token session holds 8.
        let mut r = Replica::new(cfg(13, 100, 16), true);
        r.add(req(1, 0, &stream(0, 100), 31, 1));
        drain(&mut r);
        assert_eq!(r.num_pins(), 1);
        // Another session needs 10 blocks: the pin goes, nobody is preempted.
        let mut other = req(2, 1, &stream(1, 100), 40, 1);
        other.pin_after = false;
        r.add(other);
        assert_eq!(drain(&mut r), vec![2]);
        assert_eq!(r.num_pins(), 0);
        assert_eq!(r.stats().pins_dropped_for_memory, 1);
        assert_eq!(r.stats().preemptions, 0);
    }

    #[test]
    fn only_never_scheduled_waiting_requests_can_be_aborted() {
        let mut r = Replica::new(cfg(64, 100, 16), false);
        r.add(req(1, 0, &stream(0, 64), 8, 4));
        r.add(req(2, 1, &stream(1, 64), 8, 4));
        assert!(r.abort_unscheduled(2));
        r.begin_step().unwrap();
        assert!(!r.abort_unscheduled(1), "running");
        assert!(!r.abort_unscheduled(9), "unknown");
    }

    /// Runs one request of `prompt` tokens (one output) to the end;
    /// returns what its first scheduling found and the steps' time.
    fn run_one(
        r: &mut Replica,
        id: ReqId,
        session: usize,
        h: &Rc<[BlockHash]>,
        prompt: usize,
    ) -> (FirstScheduled, u64) {
        r.add(req(id, session, h, prompt, 1));
        let mut first = None;
        let mut ns = 0;
        while let Some(plan) = r.begin_step() {
            first = first.or(plan.first_scheduled.first().copied());
            ns += plan.duration_ns;
            r.end_step(ns);
        }
        (first.expect("scheduled"), ns)
    }

    /// 16 usable blocks of 4 tokens, a tier of `tier_blocks` at 1M
    /// tokens/s, and session 0's first turn (40 tokens) run on it.
    fn tiered_after_one_turn(tier_blocks: usize) -> (Replica, TierConfig, Rc<[BlockHash]>) {
        let tier = TierConfig {
            blocks: tier_blocks,
            reload_tokens_per_sec: 1e6,
        };
        let mut r = Replica::new(
            EngineConfig {
                tier: Some(tier),
                ..cfg(17, 64, 8)
            },
            false,
        );
        let a = stream(0, 80);
        run_one(&mut r, 1, 0, &a, 40);
        (r, tier, a)
    }

    #[test]
    fn a_prefix_evicted_from_gpu_memory_is_copied_back_from_the_tier() {
        let (mut r, tier, a) = tiered_after_one_turn(64);
        // Another session's 60 tokens evict all but a's first block (freed
        // last, so evicted last) from GPU memory.
        run_one(&mut r, 2, 1, &stream(1, 64), 60);
        assert_eq!(r.prefix_hit_ratio(&a, 41), 4.0 / 41.0);
        // a's next turn: the other 36 of its 40 tokens come back by a copy.
        let (first, ns) = run_one(&mut r, 3, 0, &a, 44);
        assert_eq!((first.hit_tokens, first.tier_hit_tokens), (40, 36));
        let s = r.stats();
        assert_eq!((s.reloaded_tokens, s.re_prefilled_tokens), (36, 0));
        assert_eq!(s.reload_ns, tier.reload_ns(36));
        // The step that copies pays for it, and computes only the rest.
        let mut load = StepLoad::default();
        load.add(40, 4, false);
        assert_eq!(ns, r.cfg.cost.step_ns(load) + tier.reload_ns(36));
    }

    #[test]
    fn a_prefix_the_tier_evicted_too_is_recomputed() {
        // A tier no bigger than the GPU cache.
        let (mut r, _, a) = tiered_after_one_turn(16);
        run_one(&mut r, 2, 1, &stream(1, 64), 60);
        // Storing b's 15 blocks evicted 9 of a's from the tier, head first:
        // only the block still in GPU memory hits.
        assert_eq!(r.stats().tier_evictions, 10 + 15 - 16);
        let (first, _) = run_one(&mut r, 3, 0, &a, 44);
        assert_eq!((first.hit_tokens, first.tier_hit_tokens), (4, 0));
        let s = r.stats();
        assert_eq!((s.reloaded_tokens, s.re_prefilled_tokens), (0, 36));
    }
}

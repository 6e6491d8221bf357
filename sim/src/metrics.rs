//! What one policy's run produced, and the figures derived from it.

use kvgate::{GateStats, Reason};
use serde::Serialize;

use crate::bound::Bound;
use crate::engine::EngineStats;
use crate::policy::program::ProgramStats;
use crate::policy::Policy;

/// One completed turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TurnRecord {
    /// Session index.
    pub session: usize,
    /// Turn index within the session.
    pub turn: usize,
    /// The replica it ran on.
    pub replica: usize,
    /// Whether it was the session's last turn.
    pub last: bool,
    /// When the client issued it (the tool returned), ns. For `cap-K`, a
    /// session's first turn counts from the moment it got its slot.
    pub issued_ns: u64,
    /// When the client sent it, before any wait at the policy, ns.
    pub arrived_ns: u64,
    /// When it (last) went to the engine after the policy let it, ns.
    pub submitted_ns: u64,
    /// When the engine first scheduled it, ns.
    pub first_scheduled_ns: u64,
    /// When its last token was generated, ns.
    pub completed_ns: u64,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Prompt tokens found in the prefix cache at first scheduling (GPU
    /// and host tier).
    pub hit_tokens: usize,
    /// Of those, tokens copied back from the host tier.
    pub tier_hit_tokens: usize,
    /// Tokens prefilled, recomputation included.
    pub prefilled: usize,
    /// Of those, tokens the session had computed before.
    pub re_prefilled: usize,
    /// Tokens generated.
    pub output_len: usize,
    /// Times the client re-issued it.
    pub reissues: u32,
    /// Times the engine preempted it.
    pub engine_preemptions: u32,
}

impl TurnRecord {
    /// Issue to completion, ns.
    pub fn latency_ns(&self) -> u64 {
        self.completed_ns - self.issued_ns
    }

    /// What the client saw: sent to completion, the wait at the policy included, ns.
    pub fn client_latency_ns(&self) -> u64 {
        self.completed_ns - self.arrived_ns
    }

    /// Time held at the policy before going to the engine, ns.
    pub fn policy_wait_ns(&self) -> u64 {
        self.submitted_ns - self.arrived_ns
    }
}

/// Everything one policy's run produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The policy.
    pub policy: Policy,
    /// Completed turns, in completion order.
    pub turns: Vec<TurnRecord>,
    /// Time the last session finished (or the time limit), ns.
    pub makespan_ns: u64,
    /// Whether every session finished within the time limit.
    pub finished: bool,
    /// Engine counters summed over replicas.
    pub engine: EngineStats,
    /// The gate's own figures (kvgate policies only).
    pub gate: Option<GateStats>,
    /// A program scheduler's figures (the peer policies only).
    pub program: Option<ProgramStats>,
    /// `cap-K`: sessions that waited for a slot, and the total wait, ns.
    pub slot_waits: u64,
    /// See `slot_waits`.
    pub slot_wait_ns: u64,
    /// Turns re-issued by impatient clients.
    pub reissues: u64,
    /// The workload's limit (same for every policy).
    pub bound: Bound,
    /// Host time the run took, ms (not deterministic; not in golden tests).
    pub wall_ms: f64,
}

/// The per-policy row of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Policy label.
    pub policy: String,
    /// Whether every session finished.
    pub finished: bool,
    /// Prefix-cache hit rate over all turns (hit / prompt tokens at first scheduling).
    pub hit_rate: f64,
    /// The same over turns first scheduled in the last third of the run.
    pub hit_rate_last_third: f64,
    /// Time for the whole rollout step, s.
    pub makespan_s: f64,
    /// Generated tokens per second of makespan.
    pub gen_tok_per_s: f64,
    /// Prompt tokens prefilled (recompute included).
    pub prefilled_tokens: u64,
    /// Prefilled tokens the session had computed before: with a host tier,
    /// its misses.
    pub re_prefilled_tokens: u64,
    /// Of the hit rate, the share of prompt tokens copied back from the
    /// host tier (0 without one).
    pub tier_hit_rate: f64,
    /// Tokens copied back from the host tier, resumed requests included.
    pub reloaded_tokens: u64,
    /// Engine preemptions by recompute.
    pub engine_preemptions: u64,
    /// Turns that waited at the policy (gate sleeps, or sessions waiting for a cap slot).
    pub waits: u64,
    /// Total of those waits, s.
    pub wait_s: f64,
    /// Gate attempts preempted by a newer attempt of their session.
    pub attempts_preempted: u64,
    /// Turns re-issued by impatient clients.
    pub reissues: u64,
    /// Probe calls per admission (gate only).
    pub probes_per_admission: f64,
    /// Gate admissions by reason (`open`, `reserved_session`, `prefix_probe_unavailable`, `resident_prefix`).
    pub admissions_by_reason: [u64; kvgate::Reason::ALL.len()],
    /// Mean turn latency, s.
    pub mean_turn_latency_s: f64,
    /// Mean latency of each session's last 3 turns over its first 3.
    pub late_turn_slowdown: f64,
    /// Mean latency of the first 3 turns, s.
    pub early_turn_latency_s: f64,
    /// Mean latency of the last 3 turns, s.
    pub late_turn_latency_s: f64,
    /// Median turn latency as the client saw it (policy wait included), s.
    pub p50_turn_latency_s: f64,
    /// 99th percentile of the same, s.
    pub p99_turn_latency_s: f64,
    /// Longest single wait at the policy of any turn of any session, s.
    pub max_wait_s: f64,
    /// Makespan over the workload's lower bound (1 = the limit).
    pub makespan_over_bound: f64,
    /// The workload's makespan lower bound, s.
    pub bound_s: f64,
    /// Share of the makespan in which no turn was on any engine while some
    /// turn waited at the policy: time a gate lost by holding turns out of
    /// an empty engine (under a fixed cap, or a program scheduler, the
    /// same). Across replicas, only when all of them were empty.
    pub idle_with_waiters: f64,
    /// Total wait at the policy of the session that finished last, s: the
    /// part of the makespan's own session that the policy added to it
    /// (its turns and tool calls are the rest).
    pub last_session_wait_s: f64,
    /// The least prefill any policy must do, tokens.
    pub min_prefill_tokens: u64,
}

/// Turns at each end of a session compared by the late-turn slowdown.
pub const SLOWDOWN_TURNS: usize = 3;

impl RunResult {
    /// The row for the comparison table.
    pub fn summary(&self) -> Summary {
        let (q, h) = sums(self.turns.iter());
        let cut = self.makespan_ns / 3 * 2;
        let (ql, hl) = sums(self.turns.iter().filter(|t| t.first_scheduled_ns >= cut));
        let secs = self.makespan_ns as f64 / 1e9;
        let generated: u64 = self.turns.iter().map(|t| t.output_len as u64).sum();
        let mean = |it: &mut dyn Iterator<Item = &TurnRecord>| {
            let (n, s) = it.fold((0u64, 0u64), |(n, s), t| (n + 1, s + t.latency_ns()));
            if n == 0 {
                0.0
            } else {
                s as f64 / n as f64 / 1e9
            }
        };
        let early = mean(&mut self.turns.iter().filter(|t| t.turn < SLOWDOWN_TURNS));
        let num_turns = self.session_lengths();
        let late = mean(
            &mut self
                .turns
                .iter()
                .filter(|t| t.turn + SLOWDOWN_TURNS >= num_turns[t.session]),
        );
        let all = mean(&mut self.turns.iter());
        let (waits, wait_s, preempted, probes, reasons) = match &self.gate {
            Some(g) => {
                let admissions: u64 = g.admissions_by_reason.iter().sum();
                let probes = (g.usage_probe_calls + g.prefix_probe_calls) as f64;
                (
                    g.waits,
                    g.wait_time.as_secs_f64(),
                    g.preempted,
                    if admissions == 0 {
                        0.0
                    } else {
                        probes / admissions as f64
                    },
                    g.admissions_by_reason,
                )
            }
            // Cap slots and program schedulers: every turn the policy held.
            None => {
                let held = self.turns.iter().filter(|t| t.policy_wait_ns() > 0);
                let (n, ns) =
                    held.fold((0u64, 0u64), |(n, ns), t| (n + 1, ns + t.policy_wait_ns()));
                (n, ns as f64 / 1e9, 0, 0.0, [0; kvgate::Reason::ALL.len()])
            }
        };
        let mut client: Vec<u64> = self
            .turns
            .iter()
            .map(TurnRecord::client_latency_ns)
            .collect();
        client.sort_unstable();
        let max_wait = self
            .turns
            .iter()
            .map(TurnRecord::policy_wait_ns)
            .max()
            .unwrap_or(0);
        Summary {
            p50_turn_latency_s: percentile(&client, 0.50) as f64 / 1e9,
            p99_turn_latency_s: percentile(&client, 0.99) as f64 / 1e9,
            max_wait_s: max_wait as f64 / 1e9,
            makespan_over_bound: self.makespan_ns as f64 / self.bound.makespan_ns.max(1) as f64,
            bound_s: self.bound.makespan_ns as f64 / 1e9,
            idle_with_waiters: if self.makespan_ns > 0 {
                idle_with_waiters_ns(&self.turns) as f64 / self.makespan_ns as f64
            } else {
                0.0
            },
            last_session_wait_s: last_session_wait_ns(&self.turns) as f64 / 1e9,
            min_prefill_tokens: self.bound.min_prefill_tokens,
            policy: self.policy.name.clone(),
            finished: self.finished,
            hit_rate: ratio(h, q),
            hit_rate_last_third: ratio(hl, ql),
            makespan_s: secs,
            gen_tok_per_s: if secs > 0.0 {
                generated as f64 / secs
            } else {
                0.0
            },
            prefilled_tokens: self.engine.prefill_tokens,
            re_prefilled_tokens: self.engine.re_prefilled_tokens,
            tier_hit_rate: ratio(self.engine.tier_hit_tokens, self.engine.query_tokens),
            reloaded_tokens: self.engine.reloaded_tokens,
            engine_preemptions: self.engine.preemptions,
            waits,
            wait_s,
            attempts_preempted: preempted,
            reissues: self.reissues,
            probes_per_admission: probes,
            admissions_by_reason: reasons,
            mean_turn_latency_s: all,
            late_turn_slowdown: if early > 0.0 { late / early } else { 0.0 },
            early_turn_latency_s: early,
            late_turn_latency_s: late,
        }
    }

    /// Turns per session, as completed.
    fn session_lengths(&self) -> Vec<usize> {
        let sessions = self.turns.iter().map(|t| t.session + 1).max().unwrap_or(0);
        let mut n = vec![0; sessions];
        for t in &self.turns {
            if t.last {
                n[t.session] = t.turn + 1;
            } else {
                n[t.session] = n[t.session].max(t.turn + 1);
            }
        }
        n
    }

    /// Hit rate per time bucket of `bucket_ns`: `(bucket start s, hit rate)`
    /// for every bucket in which some turn was first scheduled.
    pub fn hit_rate_over_time(&self, bucket_ns: u64) -> Vec<(f64, f64)> {
        let buckets = (self.makespan_ns / bucket_ns + 1) as usize;
        let mut q = vec![0u64; buckets];
        let mut h = vec![0u64; buckets];
        for t in &self.turns {
            let b = (t.first_scheduled_ns / bucket_ns) as usize;
            q[b] += t.prompt_len as u64;
            h[b] += t.hit_tokens as u64;
        }
        (0..buckets)
            .filter(|&b| q[b] > 0)
            .map(|b| {
                (
                    (b as u64 * bucket_ns) as f64 / 1e9,
                    h[b] as f64 / q[b] as f64,
                )
            })
            .collect()
    }

    /// Mean turn latency (s) by turn index: `(turn index, mean, turns)`.
    pub fn latency_by_turn(&self) -> Vec<(usize, f64, usize)> {
        let max = self.turns.iter().map(|t| t.turn + 1).max().unwrap_or(0);
        let mut sum = vec![0u64; max];
        let mut n = vec![0usize; max];
        for t in &self.turns {
            sum[t.turn] += t.latency_ns();
            n[t.turn] += 1;
        }
        (0..max)
            .filter(|&k| n[k] > 0)
            .map(|k| (k, sum[k] as f64 / n[k] as f64 / 1e9, n[k]))
            .collect()
    }
}

/// Time in which no turn was in flight (sent to an engine, not yet
/// complete) while some turn waited at the policy, ns.
pub fn idle_with_waiters_ns(turns: &[TurnRecord]) -> u64 {
    // (time, change in waiting turns, change in turns in flight); at
    // equal times the order does not matter: an instant has no length.
    let mut events: Vec<(u64, i64, i64)> = Vec::with_capacity(turns.len() * 4);
    for t in turns {
        if t.submitted_ns > t.arrived_ns {
            events.push((t.arrived_ns, 1, 0));
            events.push((t.submitted_ns, -1, 0));
        }
        events.push((t.submitted_ns, 0, 1));
        events.push((t.completed_ns, 0, -1));
    }
    events.sort_unstable();
    let (mut waiting, mut in_flight, mut last, mut idle) = (0i64, 0i64, 0u64, 0u64);
    for (at, dw, df) in events {
        if waiting > 0 && in_flight == 0 {
            idle += at - last;
        }
        last = at;
        waiting += dw;
        in_flight += df;
    }
    idle
}

/// Total wait at the policy of the session whose last turn completed
/// last, ns (0 with no turns).
pub fn last_session_wait_ns(turns: &[TurnRecord]) -> u64 {
    let Some(last) = turns.iter().max_by_key(|t| t.completed_ns) else {
        return 0;
    };
    turns
        .iter()
        .filter(|t| t.session == last.session)
        .map(TurnRecord::policy_wait_ns)
        .sum()
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sums<'a>(turns: impl Iterator<Item = &'a TurnRecord>) -> (u64, u64) {
    turns.fold((0, 0), |(q, h), t| {
        (q + t.prompt_len as u64, h + t.hit_tokens as u64)
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The gate's admission reasons in table order.
pub fn reason_names() -> [&'static str; Reason::ALL.len()] {
    Reason::ALL.map(Reason::as_str)
}

impl EngineStats {
    /// Adds another replica's counters.
    pub fn add(&mut self, o: &EngineStats) {
        self.steps += o.steps;
        self.busy_ns += o.busy_ns;
        self.prefill_tokens += o.prefill_tokens;
        self.decode_tokens += o.decode_tokens;
        self.re_prefilled_tokens += o.re_prefilled_tokens;
        self.preemptions += o.preemptions;
        self.query_tokens += o.query_tokens;
        self.hit_tokens += o.hit_tokens;
        self.resumed_query_tokens += o.resumed_query_tokens;
        self.resumed_hit_tokens += o.resumed_hit_tokens;
        self.tier_hit_tokens += o.tier_hit_tokens;
        self.reloaded_tokens += o.reloaded_tokens;
        self.reload_ns += o.reload_ns;
        self.tier_evictions += o.tier_evictions;
        self.pins += o.pins;
        self.pins_used += o.pins_used;
        self.pins_expired += o.pins_expired;
        self.pins_dropped_for_memory += o.pins_dropped_for_memory;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// A turn of `session` sent at `arrived`, let go at `submitted`, done at
    /// `completed` (seconds).
    fn turn(session: usize, arrived: u64, submitted: u64, completed: u64) -> TurnRecord {
        TurnRecord {
            session,
            turn: 0,
            replica: 0,
            last: false,
            issued_ns: arrived * S,
            arrived_ns: arrived * S,
            submitted_ns: submitted * S,
            first_scheduled_ns: submitted * S,
            completed_ns: completed * S,
            prompt_len: 1,
            hit_tokens: 0,
            tier_hit_tokens: 0,
            prefilled: 1,
            re_prefilled: 0,
            output_len: 1,
            reissues: 0,
            engine_preemptions: 0,
        }
    }

    #[test]
    fn idle_with_waiters_counts_only_an_empty_engine_while_someone_waits() {
        let turns = [
            // In flight 0-4 s.
            turn(0, 0, 0, 4),
            // Waits 2-10 s: the engine is empty from 4 s to 7 s and from 9 s.
            turn(1, 2, 10, 12),
            // In flight 7-9 s, after waiting 5-7 s (overlapping the other wait).
            turn(2, 5, 7, 9),
            // The engine empty at 13-14 s with nobody waiting: not counted.
            turn(0, 14, 14, 15),
        ];
        assert_eq!(idle_with_waiters_ns(&turns), 4 * S);
        assert_eq!(idle_with_waiters_ns(&[]), 0);
        // Nobody ever waits: nothing counted.
        assert_eq!(
            idle_with_waiters_ns(&[turn(0, 0, 0, 1), turn(1, 3, 3, 4)]),
            0
        );
    }

    #[test]
    fn the_last_sessions_wait_is_the_total_wait_of_the_session_that_ended_last() {
        let turns = [
            turn(0, 0, 3, 4),
            turn(1, 0, 0, 5),
            turn(0, 6, 8, 20),
            turn(1, 6, 16, 17),
        ];
        // Session 0 ends last (20 s) and waited 3 s + 2 s; session 1's 10 s
        // wait does not count.
        assert_eq!(last_session_wait_ns(&turns), 5 * S);
        assert_eq!(last_session_wait_ns(&[]), 0);
    }
}

//! A lower bound on a workload's makespan that no admission policy can
//! beat, and the least prefill any policy must do ("the limit").
//!
//! Two bounds, the larger wins:
//! - **Critical path.** A session can finish no sooner than its own turns
//!   run back to back, each alone on an idle engine with a warm cache:
//!   prefill of its new tokens only (in the engine's chunks), one decode
//!   step per further output token, then its tool call. Sessions that start
//!   after others finish (RL waves) start no sooner than the bound on those
//!   finishes allows.
//! - **Total work.** All unavoidable work at the engine's best batch
//!   throughput, spread evenly over the replicas: every new token prefilled
//!   once (the shared system prompt once per replica), every decode token,
//!   the context every step must read, the attention every new token must
//!   compute over its prefix (`n·c + n(n+1)/2` pairs for `n` new tokens
//!   after `c`, however they are chunked), and a step's fixed cost for
//!   at least `⌈tokens / budget⌉` steps. Work that arrives at `t` cannot be
//!   done before `t`, so the bound is the largest `t + work(arriving ≥ t) / R`.
//!
//! "New tokens" of a turn are those its session never had in the cache:
//! for turn 0 its prompt without the shared system prompt; for a later turn
//! the previous turn's last output token (sampled, never computed) and the
//! tool result. Block alignment is ignored (the engine caches whole blocks
//! only, so it can only do more), which keeps the bound a bound. With
//! 1-token blocks and one session the bound is exact (see the golden test).

use crate::engine::step_time::{attention_pairs, StepLoad};
use crate::engine::EngineConfig;
use crate::workload::{Session, Start, Workload};

/// The limit for one workload on one deployment.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Bound {
    /// The makespan lower bound, ns: the larger of the two below.
    pub makespan_ns: u64,
    /// The longest session's critical path (from its earliest start), ns.
    pub critical_path_ns: u64,
    /// Total unavoidable work at best batch throughput, ns.
    pub total_work_ns: u64,
    /// The least prefill any policy must do, tokens.
    pub min_prefill_tokens: u64,
}

/// Unavoidable work of one session, in the units the step cost charges.
#[derive(Debug, Clone, Copy, Default)]
struct Work {
    prefill: u64,
    decode: u64,
    context_read: u64,
    attn_pairs: u64,
}

/// Computes the bound of `workload` on `replicas` replicas shaped `engine`.
pub fn lower_bound(engine: &EngineConfig, replicas: usize, workload: &Workload) -> Bound {
    let shared = workload.shared_prefix_tokens;
    let critical: Vec<u64> = workload
        .sessions
        .iter()
        .map(|s| critical_path_ns(engine, s, shared))
        .collect();
    let starts = earliest_starts(&workload.sessions, &critical);
    let critical_path_ns = starts
        .iter()
        .zip(&critical)
        .map(|(a, c)| a + c)
        .max()
        .unwrap_or(0);

    // Work of the sessions arriving at or after each start, latest first.
    let mut order: Vec<usize> = (0..workload.sessions.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(starts[i]));
    let mut sum = Work::default();
    let mut count = 0usize;
    let mut total_work_ns = 0u64;
    for (pos, &i) in order.iter().enumerate() {
        let w = work(&workload.sessions[i], shared);
        sum.prefill += w.prefill;
        sum.decode += w.decode;
        sum.context_read += w.context_read;
        sum.attn_pairs += w.attn_pairs;
        count += 1;
        let next_is_same_start = order.get(pos + 1).is_some_and(|&j| starts[j] == starts[i]);
        if next_is_same_start {
            continue;
        }
        let system_copies = replicas.min(count) as u64 * shared as u64;
        let ns = work_ns(engine, sum, system_copies) / replicas as u64;
        total_work_ns = total_work_ns.max(starts[i] + ns);
    }
    let system_copies = replicas.min(workload.sessions.len()) as u64 * shared as u64;
    let all = workload.sessions.iter().fold(Work::default(), |acc, s| {
        let w = work(s, shared);
        Work {
            prefill: acc.prefill + w.prefill,
            decode: acc.decode + w.decode,
            context_read: acc.context_read + w.context_read,
            attn_pairs: acc.attn_pairs + w.attn_pairs,
        }
    });
    Bound {
        makespan_ns: critical_path_ns.max(total_work_ns),
        critical_path_ns,
        total_work_ns,
        min_prefill_tokens: all.prefill + system_copies,
    }
}

/// Each session's critical path, ns (alone on a warm idle engine).
pub fn critical_paths(engine: &EngineConfig, workload: &Workload) -> Vec<u64> {
    workload
        .sessions
        .iter()
        .map(|s| critical_path_ns(engine, s, workload.shared_prefix_tokens))
        .collect()
}

/// Tokens turn `k` of `s` must prefill with a warm cache.
fn new_tokens(s: &Session, k: usize, shared: usize) -> usize {
    let t = &s.turns[k];
    let known = match k {
        // The system prompt; a GRPO group's later samples also the task.
        0 => shared.max(t.reused).min(t.prompt_len),
        _ => {
            let p = &s.turns[k - 1];
            // The previous turn's last sampled token was never computed.
            t.reused.min(p.prompt_len + p.output_len - 1)
        }
    };
    // The engine computes at least one token (a hit is capped at len - 1).
    (t.prompt_len - known.min(t.prompt_len)).max(1)
}

/// One session's turns back to back, each alone on an idle engine with a warm cache.
fn critical_path_ns(engine: &EngineConfig, s: &Session, shared: usize) -> u64 {
    let cost = &engine.cost;
    let chunk = match engine.long_prefill_token_threshold {
        0 => engine.max_num_batched_tokens,
        t => t.min(engine.max_num_batched_tokens),
    };
    let step = |cached: usize, n: usize, decoding: bool| {
        let mut load = StepLoad::default();
        load.add(cached as u64, n as u64, decoding);
        cost.step_ns(load)
    };
    let mut ns = 0u64;
    for (k, t) in s.turns.iter().enumerate() {
        let mut computed = t.prompt_len - new_tokens(s, k, shared);
        while computed < t.prompt_len {
            let n = chunk.min(t.prompt_len - computed);
            ns += step(computed, n, false);
            computed += n;
        }
        // The prefill's last step samples the first output token; each
        // further token takes one decode step over the whole context.
        for j in 1..t.output_len {
            ns += step(t.prompt_len + j - 1, 1, true);
        }
        ns += t.tool_ns;
    }
    ns
}

/// Work of one session that every execution does (shared prompt excluded).
fn work(s: &Session, shared: usize) -> Work {
    let mut w = Work::default();
    for (k, t) in s.turns.iter().enumerate() {
        let new = new_tokens(s, k, shared) as u64;
        let prompt = t.prompt_len as u64;
        let decodes = t.output_len as u64 - 1;
        w.prefill += new;
        w.decode += decodes;
        // Decode step `j` reads, and attends to, `prompt + j` tokens.
        let decode_reads = decodes * prompt + decodes * (decodes + 1) / 2;
        // The prefill's last chunk reads the whole prompt; chunking or
        // recomputing only reads more.
        w.context_read += prompt + decode_reads;
        // Each new token attends to its position's prefix however it is
        // chunked; recomputing only attends more.
        w.attn_pairs += attention_pairs(prompt - new, new) + decode_reads;
    }
    w
}

/// Time of `w` (plus `system` tokens of shared prompt) at the best batch throughput.
fn work_ns(engine: &EngineConfig, w: Work, system: u64) -> u64 {
    let c = &engine.cost;
    let prefill = w.prefill + system;
    let tokens = prefill + w.decode;
    let steps = tokens
        .div_ceil(engine.max_num_batched_tokens as u64)
        .max(w.decode.div_ceil(engine.max_num_seqs as u64));
    // The shared prompt's own attention is left out (the bound may only
    // undercount); the turns that read it count it in their pairs.
    let ns = c.beta0_ms * 1e6 * steps as f64
        + c.beta1_us * 1e3 * prefill as f64
        + c.beta2_us * 1e3 * w.decode as f64
        + c.beta3_us * 1e3 * w.context_read as f64
        + c.beta4_us * 1e3 * w.attn_pairs as f64;
    ns.floor() as u64
}

/// Lower bounds on when each session can start: its arrival time, or for a
/// wave, the `count`-th smallest bound on the previous wave's finishes.
fn earliest_starts(sessions: &[Session], critical: &[u64]) -> Vec<u64> {
    let mut starts = vec![0u64; sessions.len()];
    let mut finishes_by_wave: Vec<Vec<u64>> = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        starts[i] = match s.start {
            Start::At(t) => t,
            Start::AfterFinishes { wave, count } => {
                let f = finishes_by_wave.get_mut(wave).expect("waves in order");
                f.sort_unstable();
                f[count - 1]
            }
        };
        if finishes_by_wave.len() <= s.wave {
            finishes_by_wave.resize(s.wave + 1, Vec::new());
        }
        finishes_by_wave[s.wave].push(starts[i] + critical[i]);
    }
    starts
}

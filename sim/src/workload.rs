//! The rollout being simulated: agent sessions, each a chain of turns. Turn
//! k sends the whole history (a system prompt shared by every session, the
//! session's task, every earlier output and tool result), generates O
//! tokens, then calls a tool that takes L seconds and returns R tokens.
//!
//! Sessions come in classes (the `[workload]` table is the first class;
//! `[[workload.classes]]` add more, e.g. short chats beside long coding
//! agents), each with its own turns and distributions, all sharing the
//! system prompt. They start together (the default), staggered, by a
//! Poisson process, or in RL waves (see [`ArrivalConfig`]).
//!
//! Prompts are real token sequences, hashed into vLLM-style block chains, so
//! prefix hits and misses are genuine: two sessions share exactly the
//! system prompt's blocks. The whole stream of a session is drawn up front
//! (outputs included, as if sampling were deterministic), so every policy
//! sees the very same workload for a seed. Draws use ChaCha8 (value-stable
//! by contract) and an exactly pinned `rand_distr`; lognormals go through
//! the platform's `exp`, so figures are bit-identical for a seed on one
//! platform (in practice across x86-64/aarch64 Linux too, not guaranteed).

use std::rc::Rc;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};
use serde::{Deserialize, Serialize};

use crate::engine::hashing::{self, BlockHash};
use kvgate::core::PromptSketch;

/// Inclusive integer range, drawn uniformly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Uniform {
    /// Smallest value.
    pub min: usize,
    /// Largest value.
    pub max: usize,
}

impl Uniform {
    fn sample(&self, rng: &mut ChaCha8Rng) -> usize {
        rng.random_range(self.min..=self.max)
    }
}

/// A lognormal given by its median and the sigma of its log, clamped.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogNormalSpec {
    /// Median (the lognormal's `exp(mu)`).
    pub median: f64,
    /// Standard deviation of the log.
    pub sigma: f64,
    /// Lower clamp.
    pub min: f64,
    /// Upper clamp.
    pub max: f64,
}

impl LogNormalSpec {
    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        let d = LogNormal::new(self.median.ln(), self.sigma).expect("validated");
        d.sample(rng).clamp(self.min, self.max)
    }

    fn validate(&self, what: &str) -> Result<(), String> {
        let ok = self.median > 0.0
            && self.median.is_finite()
            && self.sigma >= 0.0
            && self.sigma.is_finite()
            && self.min <= self.max
            && self.min >= 0.0;
        if ok {
            Ok(())
        } else {
            Err(format!("{what}: invalid lognormal {self:?}"))
        }
    }
}

/// A token count: lognormal (`{ median, sigma, min, max }`) or uniform over
/// an inclusive integer range (`{ min, max }`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenDist {
    /// A clamped lognormal.
    LogNormal(LogNormalSpec),
    /// Uniform over `min..=max`.
    Uniform(Uniform),
}

impl TokenDist {
    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match self {
            Self::LogNormal(d) => d.sample(rng),
            Self::Uniform(u) => u.sample(rng) as f64,
        }
    }

    /// The largest value it can take.
    pub fn max(&self) -> f64 {
        match self {
            Self::LogNormal(d) => d.max,
            Self::Uniform(u) => u.max as f64,
        }
    }

    fn validate(&self, what: &str) -> Result<(), String> {
        match self {
            Self::LogNormal(d) => d.validate(what),
            Self::Uniform(u) if u.min <= u.max => Ok(()),
            Self::Uniform(u) => Err(format!("{what}: invalid range {u:?}")),
        }
    }
}

/// A scenario's `[workload]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Sessions in the rollout step, all starting at time zero.
    pub sessions: usize,
    /// Turns per session.
    pub turns: Uniform,
    /// Tokens of the system prompt every session shares.
    pub system_prompt_tokens: usize,
    /// Tokens of each session's own task statement.
    pub task_tokens: Uniform,
    /// Tokens generated per turn.
    pub output_tokens: TokenDist,
    /// Tokens a tool call returns.
    pub tool_result_tokens: TokenDist,
    /// Seconds a tool call takes.
    pub tool_latency_s: LogNormalSpec,
    /// Probability that a turn's client is impatient and retries it.
    #[serde(default)]
    pub retry_probability: f64,
    /// How long an impatient client waits for its turn to start running
    /// before it re-issues it, seconds.
    #[serde(default = "default_retry_after")]
    pub retry_after_s: f64,
    /// Most re-issues of one turn.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Token ids are drawn below this.
    #[serde(default = "default_vocab")]
    pub vocab: u32,
    /// When sessions start (all at once unless given).
    #[serde(default)]
    pub arrival: ArrivalConfig,
    /// More session classes after the one this table describes.
    #[serde(default)]
    pub classes: Vec<ClassConfig>,
    /// How the agent keeps its history (append-only unless given).
    #[serde(default)]
    pub history: HistoryConfig,
    /// GRPO groups: each class's sessions, in order, come in groups of
    /// this many samples of one task. A group's sessions share the task
    /// (its length and tokens) after the system prompt, so their first
    /// prompts are identical; each draws its own turns, outputs and tool
    /// results, so they diverge from the first output on. 1 (the
    /// default): every session has its own task.
    #[serde(default = "one_usize")]
    pub group_size: usize,
}

fn one_usize() -> usize {
    1
}

/// How a session's agent turns its history into the next prompt
/// (`[workload.history]`), for every class. Real agent frameworks do not
/// all append: some compact the history when it grows long (Claude Code's
/// auto-compact, OpenHands' summarising condenser), some replace old tool
/// results by a stub (SWE-agent's last-N-observations processor). Either
/// way a turn's prompt shares with the previous one only the part before
/// the first rewritten token, and the rest misses the cache by design, not
/// by eviction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum HistoryConfig {
    /// Every prompt is the previous one plus its output and the tool result.
    #[default]
    Append,
    /// Once the history would pass `at_tokens`, the next prompt is the
    /// system prompt, the task and a fresh `summary_tokens`-token summary;
    /// it then grows again.
    Compact {
        /// History length that triggers a compaction, tokens.
        at_tokens: usize,
        /// Tokens of the summary that replaces the history.
        summary_tokens: usize,
    },
    /// Tool results older than the last `keep_last` are replaced by the same
    /// `stub_tokens`-token stub: each turn rewrites the prompt from the
    /// result that just fell out of the window.
    Elide {
        /// Tool results kept whole, newest first.
        keep_last: usize,
        /// Tokens of the stub that replaces an older result.
        stub_tokens: usize,
    },
    /// Each output begins with `thinking_fraction` of thinking that the
    /// next prompts leave out (as reasoning models' chat templates do):
    /// every prompt shares with the last request only the last prompt.
    DropThinking {
        /// Fraction of each output that is thinking, in [0, 1).
        thinking_fraction: f64,
    },
}

impl HistoryConfig {
    fn validate(&self) -> Result<(), String> {
        match *self {
            Self::Append => Ok(()),
            Self::Compact { at_tokens: 0, .. } => {
                Err("workload.history.at_tokens must be > 0".into())
            }
            Self::DropThinking { thinking_fraction }
                if !(0.0..1.0).contains(&thinking_fraction) =>
            {
                Err("workload.history.thinking_fraction must be in [0, 1)".into())
            }
            Self::Compact { .. } | Self::Elide { .. } | Self::DropThinking { .. } => Ok(()),
        }
    }
}

/// A further class of sessions (`[[workload.classes]]`): its own count,
/// turns and distributions; the system prompt, vocabulary and retry timing
/// are the workload's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Label (reports only).
    #[serde(default)]
    pub name: String,
    /// Sessions of this class.
    pub sessions: usize,
    /// Turns per session.
    pub turns: Uniform,
    /// Tokens of each session's own task statement.
    pub task_tokens: Uniform,
    /// Tokens generated per turn.
    pub output_tokens: TokenDist,
    /// Tokens a tool call returns.
    pub tool_result_tokens: TokenDist,
    /// Seconds a tool call takes.
    pub tool_latency_s: LogNormalSpec,
    /// Probability that a turn's client is impatient and retries it.
    #[serde(default)]
    pub retry_probability: f64,
}

/// When sessions start (`[workload.arrival]`), in session order (the
/// classes' sessions follow the first class's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ArrivalConfig {
    /// Every session at time zero (one RL rollout step).
    #[default]
    Together,
    /// Session i at i × `interval_s`.
    Staggered {
        /// Seconds between two sessions' starts.
        interval_s: f64,
    },
    /// A Poisson process of `rate_per_s` sessions per second, from time zero.
    Poisson {
        /// Mean arrivals per second.
        rate_per_s: f64,
    },
    /// Successive RL steps: waves of `wave_sessions`; wave w+1 starts once
    /// `next_wave_after` of wave w's sessions have finished (1 = strictly
    /// successive steps; below 1 = overlapping waves, as asynchronous RL
    /// frameworks run them).
    Waves {
        /// Sessions per wave (the last may be smaller).
        wave_sessions: usize,
        /// Fraction of a wave that must finish before the next starts, in (0, 1].
        #[serde(default = "one_f64")]
        next_wave_after: f64,
    },
}

fn one_f64() -> f64 {
    1.0
}

impl ArrivalConfig {
    fn validate(&self) -> Result<(), String> {
        let ok = match *self {
            Self::Together => true,
            Self::Staggered { interval_s } => interval_s >= 0.0 && interval_s.is_finite(),
            Self::Poisson { rate_per_s } => rate_per_s > 0.0 && rate_per_s.is_finite(),
            Self::Waves {
                wave_sessions,
                next_wave_after,
            } => wave_sessions > 0 && next_wave_after > 0.0 && next_wave_after <= 1.0,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("workload.arrival: invalid {self:?}"))
        }
    }
}

/// When one session starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At this time, ns.
    At(u64),
    /// When `count` sessions of wave `wave` have finished.
    AfterFinishes {
        /// The wave waited for.
        wave: usize,
        /// How many of its sessions must finish.
        count: usize,
    },
}

/// The distributions of one class, as [`Workload::generate`] draws them.
#[derive(Debug, Clone, Copy)]
struct Shape<'a> {
    turns: &'a Uniform,
    task_tokens: &'a Uniform,
    output_tokens: &'a TokenDist,
    tool_result_tokens: &'a TokenDist,
    tool_latency_s: &'a LogNormalSpec,
    retry_probability: f64,
}

impl<'a> Shape<'a> {
    fn validate(&self, what: &str) -> Result<(), String> {
        if self.turns.min == 0 || self.turns.min > self.turns.max {
            return Err(format!("{what}.turns must be 1 <= min <= max"));
        }
        if self.task_tokens.min > self.task_tokens.max {
            return Err(format!("{what}.task_tokens must have min <= max"));
        }
        self.output_tokens
            .validate(&format!("{what}.output_tokens"))?;
        if self.output_tokens.max() < 1.0 {
            return Err(format!("{what}.output_tokens.max must be >= 1"));
        }
        self.tool_result_tokens
            .validate(&format!("{what}.tool_result_tokens"))?;
        self.tool_latency_s
            .validate(&format!("{what}.tool_latency_s"))?;
        if !(0.0..=1.0).contains(&self.retry_probability) {
            return Err(format!("{what}.retry_probability must be in [0, 1]"));
        }
        Ok(())
    }
}

impl ClassConfig {
    fn shape(&self) -> Shape<'_> {
        Shape {
            turns: &self.turns,
            task_tokens: &self.task_tokens,
            output_tokens: &self.output_tokens,
            tool_result_tokens: &self.tool_result_tokens,
            tool_latency_s: &self.tool_latency_s,
            retry_probability: self.retry_probability,
        }
    }
}

fn default_retry_after() -> f64 {
    5.0
}
fn default_max_retries() -> u32 {
    3
}
fn default_vocab() -> u32 {
    128_256 // Llama 3
}

impl WorkloadConfig {
    /// Refuses parameters that cannot describe a rollout.
    pub fn validate(&self) -> Result<(), String> {
        if self.sessions == 0 {
            return Err("workload.sessions must be > 0".into());
        }
        self.shape().validate("workload")?;
        for (i, c) in self.classes.iter().enumerate() {
            let what = format!("workload.classes[{i}]");
            if c.sessions == 0 {
                return Err(format!("{what}.sessions must be > 0"));
            }
            c.shape().validate(&what)?;
        }
        let min_task = self
            .classes
            .iter()
            .map(|c| c.task_tokens.min)
            .fold(self.task_tokens.min, usize::min);
        if self.system_prompt_tokens + min_task == 0 {
            return Err("the first prompt would be empty".into());
        }
        if !(self.retry_after_s > 0.0 && self.retry_after_s.is_finite()) {
            return Err("workload.retry_after_s must be > 0".into());
        }
        if self.vocab < 2 {
            return Err("workload.vocab must be >= 2".into());
        }
        if self.group_size == 0 {
            return Err("workload.group_size must be >= 1".into());
        }
        self.history.validate()?;
        self.arrival.validate()
    }

    /// Sessions over every class.
    pub fn total_sessions(&self) -> usize {
        self.sessions + self.classes.iter().map(|c| c.sessions).sum::<usize>()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            turns: &self.turns,
            task_tokens: &self.task_tokens,
            output_tokens: &self.output_tokens,
            tool_result_tokens: &self.tool_result_tokens,
            tool_latency_s: &self.tool_latency_s,
            retry_probability: self.retry_probability,
        }
    }

    /// Every session's class shape and class index, in session order.
    fn shapes(&self) -> Vec<(usize, Shape<'_>)> {
        let mut out = vec![(0, self.shape()); self.sessions];
        for (i, c) in self.classes.iter().enumerate() {
            out.extend(std::iter::repeat_n((i + 1, c.shape()), c.sessions));
        }
        out
    }

    /// Each session's GRPO group, in session order: consecutive sessions
    /// of one class, `group_size` at a time (a class's last group may be
    /// smaller); groups never span two classes.
    fn groups(&self) -> Vec<usize> {
        let sizes = std::iter::once(self.sessions).chain(self.classes.iter().map(|c| c.sessions));
        let mut out = Vec::with_capacity(self.total_sessions());
        let mut first = 0;
        for n in sizes {
            out.extend((0..n).map(|j| first + j / self.group_size));
            first += n.div_ceil(self.group_size);
        }
        out
    }

    /// When each session starts, drawn from the ChaCha8 stream `u64::MAX`
    /// (never a session's) so arrivals do not move the sessions' draws.
    fn starts(&self, seed: u64) -> Vec<(Start, usize)> {
        let n = self.total_sessions();
        match self.arrival {
            ArrivalConfig::Together => vec![(Start::At(0), 0); n],
            ArrivalConfig::Staggered { interval_s } => (0..n)
                .map(|i| (Start::At(secs_to_ns(i as f64 * interval_s)), 0))
                .collect(),
            ArrivalConfig::Poisson { rate_per_s } => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(u64::MAX);
                let gap = Exp::new(rate_per_s).expect("validated");
                let mut t = 0.0;
                (0..n)
                    .map(|i| {
                        if i > 0 {
                            t += gap.sample(&mut rng);
                        }
                        (Start::At(secs_to_ns(t)), 0)
                    })
                    .collect()
            }
            ArrivalConfig::Waves {
                wave_sessions,
                next_wave_after,
            } => (0..n)
                .map(|i| {
                    let wave = i / wave_sessions;
                    if wave == 0 {
                        return (Start::At(0), 0);
                    }
                    let previous = wave_sessions.min(n - (wave - 1) * wave_sessions);
                    let count =
                        ((previous as f64 * next_wave_after).ceil() as usize).clamp(1, previous);
                    (
                        Start::AfterFinishes {
                            wave: wave - 1,
                            count,
                        },
                        wave,
                    )
                })
                .collect(),
        }
    }
}

/// One turn of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Tokens sent (the whole history so far).
    pub prompt_len: usize,
    /// Tokens generated.
    pub output_len: usize,
    /// Tokens the tool returns after this turn (0 after the last).
    pub tool_result_len: usize,
    /// Tool latency after this turn, ns (0 after the last).
    pub tool_ns: u64,
    /// Whether this turn's client retries it if it has not started running in time.
    pub impatient: bool,
    /// Which of the session's token streams ([`Session::streams`]) this
    /// turn's prompt and output are a prefix of.
    pub stream: usize,
    /// Tokens at the start of this prompt that the session's previous
    /// request (prompt and output) also began with; for a first turn, the
    /// shared system prompt (and the task, for a GRPO group's samples after
    /// its first). The most a warm cache can give it.
    pub reused: usize,
}

/// One agent session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Chained block hashes of the session's token streams: one for an
    /// append-only history, a new one each time the agent rewrites it
    /// ([`HistoryConfig`]); each turn names its own ([`Turn::stream`]).
    pub streams: Vec<Rc<[BlockHash]>>,
    /// Each turn's prompt as a gate sketches it from the token ids a host
    /// passes ([`PromptSketch`]).
    pub sketches: Vec<PromptSketch>,
    /// Its turns, in order.
    pub turns: Vec<Turn>,
    /// Index of its class (0: the `[workload]` table itself).
    pub class: usize,
    /// When it starts.
    pub start: Start,
    /// Its RL wave (0 unless arrivals come in waves).
    pub wave: usize,
    /// Its GRPO group (its own, numbered in session order, without groups).
    pub group: usize,
}

impl Session {
    /// The block hashes turn `k`'s prompt and output are a prefix of.
    pub fn hashes(&self, k: usize) -> &Rc<[BlockHash]> {
        &self.streams[self.turns[k].stream]
    }

    /// Tokens of the longest request (last prompt plus last output).
    pub fn max_request_tokens(&self) -> usize {
        self.turns
            .iter()
            .map(|t| t.prompt_len + t.output_len)
            .max()
            .expect("at least one turn")
    }
}

/// The sessions of one rollout step.
#[derive(Debug, Clone)]
pub struct Workload {
    /// All sessions.
    pub sessions: Vec<Session>,
    /// Seconds an impatient client waits before re-issuing.
    pub retry_after_ns: u64,
    /// Most re-issues of one turn.
    pub max_retries: u32,
    /// Tokens of the system prompt every session shares.
    pub shared_prefix_tokens: usize,
    /// The seed it was drawn with (it also keys a noisy engine's noise).
    pub seed: u64,
}

impl Workload {
    /// Draws the workload for `seed` (independent of any policy): session `i`
    /// uses ChaCha8 stream `i + 1` and the shared system prompt stream 0, so
    /// adding sessions does not change the existing ones.
    pub fn generate(cfg: &WorkloadConfig, block_size: usize, seed: u64) -> Self {
        let mut sys_rng = ChaCha8Rng::seed_from_u64(seed);
        sys_rng.set_stream(0);
        let system: Vec<u32> = (0..cfg.system_prompt_tokens)
            .map(|_| sys_rng.random_range(0..cfg.vocab))
            .collect();
        // Drawn after the system prompt, from its stream: the same for
        // every session, and no other draw moves.
        let stub: Vec<u32> = match cfg.history {
            HistoryConfig::Elide { stub_tokens, .. } => (0..stub_tokens)
                .map(|_| sys_rng.random_range(0..cfg.vocab))
                .collect(),
            _ => Vec::new(),
        };
        let shapes = cfg.shapes();
        // A GRPO group's task, drawn from the group's own ChaCha8 stream
        // (counting down from `u64::MAX - 1`, never a session's or the
        // arrivals'); none when every session has its own task, so those
        // workloads draw exactly as before.
        let tasks: Vec<Option<Rc<[u32]>>> = if cfg.group_size > 1 {
            let mut tasks: Vec<Rc<[u32]>> = Vec::new();
            cfg.groups()
                .into_iter()
                .zip(&shapes)
                .map(|(g, (_, shape))| {
                    if g == tasks.len() {
                        let mut rng = ChaCha8Rng::seed_from_u64(seed);
                        rng.set_stream(u64::MAX - 1 - g as u64);
                        let n = shape.task_tokens.sample(&mut rng);
                        tasks.push((0..n).map(|_| rng.random_range(0..cfg.vocab)).collect());
                    }
                    Some(Rc::clone(&tasks[g]))
                })
                .collect()
        } else {
            vec![None; shapes.len()]
        };
        let groups = cfg.groups();
        let sessions = shapes
            .into_iter()
            .zip(cfg.starts(seed))
            .zip(tasks)
            .enumerate()
            .map(|(i, (((class, shape), (start, wave)), task))| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(i as u64 + 1);
                let (streams, mut turns, sketches) = session(
                    cfg,
                    &shape,
                    &system,
                    task.as_deref(),
                    &stub,
                    block_size,
                    &mut rng,
                );
                // A group's later samples send the first prompt an earlier
                // one sent: a warm cache holds its task too.
                if let Some(task) = task.as_deref() {
                    if i > 0 && groups[i] == groups[i - 1] {
                        let first = &mut turns[0];
                        first.reused = (system.len() + task.len()).min(first.prompt_len);
                    }
                }
                Session {
                    streams,
                    sketches,
                    turns,
                    class,
                    start,
                    wave,
                    group: groups[i],
                }
            })
            .collect();
        Self {
            sessions,
            retry_after_ns: secs_to_ns(cfg.retry_after_s),
            max_retries: cfg.max_retries,
            shared_prefix_tokens: cfg.system_prompt_tokens,
            seed,
        }
    }

    /// Total turns.
    pub fn num_turns(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Total prompt tokens over all turns (the demand without any cache).
    pub fn prompt_tokens(&self) -> u64 {
        self.sessions
            .iter()
            .flat_map(|s| &s.turns)
            .map(|t| t.prompt_len as u64)
            .sum()
    }

    /// Sessions in the first RL wave, where arrivals come in several
    /// waves (one RL step's rollouts); `None` otherwise.
    pub fn wave_sessions(&self) -> Option<usize> {
        let waves = self.sessions.iter().map(|s| s.wave).max()?;
        (waves > 0).then(|| self.sessions.iter().filter(|s| s.wave == 0).count())
    }

    /// Largest request of any session.
    pub fn max_request_tokens(&self) -> usize {
        self.sessions
            .iter()
            .map(Session::max_request_tokens)
            .max()
            .unwrap_or(0)
    }
}

/// Seconds to nanoseconds, rounded.
pub fn secs_to_ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

fn session(
    cfg: &WorkloadConfig,
    shape: &Shape<'_>,
    system: &[u32],
    group_task: Option<&[u32]>,
    stub: &[u32],
    block_size: usize,
    rng: &mut ChaCha8Rng,
) -> (Vec<Rc<[BlockHash]>>, Vec<Turn>, Vec<PromptSketch>) {
    let num_turns = shape.turns.sample(rng);
    let mut base: Vec<u32> = system.to_vec();
    match group_task {
        Some(task) => base.extend_from_slice(task),
        None => {
            let task = shape.task_tokens.sample(rng);
            base.extend((0..task).map(|_| rng.random_range(0..cfg.vocab)));
        }
    }
    // `tokens` is the current stream: the prompts and outputs of the turns
    // that extend one another; a rewritten prompt starts the next stream.
    let mut tokens = base.clone();
    let mut streams: Vec<Rc<[BlockHash]>> = Vec::new();
    // Each turn's output and tool result, for prompts rebuilt from parts.
    let mut parts: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
    // Length of the previous request (prompt and output) in `tokens`.
    let mut previous_request = 0;
    let mut turns = Vec::with_capacity(num_turns);
    let mut sketches = Vec::with_capacity(num_turns);
    for k in 0..num_turns {
        let rewritten = match cfg.history {
            HistoryConfig::Append => None,
            HistoryConfig::Compact {
                at_tokens,
                summary_tokens,
            } => (k > 0 && tokens.len() > at_tokens).then(|| {
                let mut p = base.clone();
                p.extend((0..summary_tokens).map(|_| rng.random_range(0..cfg.vocab)));
                p
            }),
            HistoryConfig::Elide { keep_last, .. } => {
                rebuilt(&base, &parts, &tokens, |j, output, result| {
                    (output, if j + keep_last >= k { result } else { stub })
                })
            }
            HistoryConfig::DropThinking { thinking_fraction } => {
                rebuilt(&base, &parts, &tokens, |_, output, result| {
                    let thinking = (output.len() as f64 * thinking_fraction) as usize;
                    (&output[thinking..], result)
                })
            }
        };
        let reused = match rewritten {
            _ if k == 0 => system.len().min(tokens.len()),
            None => previous_request,
            Some(p) => {
                let shared = common_prefix(&tokens[..previous_request], &p);
                streams.push(hashing::chain(&tokens, block_size).into());
                tokens = p;
                shared
            }
        };
        let prompt_len = tokens.len();
        sketches.push(PromptSketch::of(&tokens));
        let output_len = shape.output_tokens.sample(rng).round().max(1.0) as usize;
        let output: Vec<u32> = (0..output_len)
            .map(|_| rng.random_range(0..cfg.vocab))
            .collect();
        tokens.extend_from_slice(&output);
        previous_request = tokens.len();
        let last = k + 1 == num_turns;
        let (result, tool_ns) = if last {
            (Vec::new(), 0)
        } else {
            let r = shape.tool_result_tokens.sample(rng).round() as usize;
            let l = shape.tool_latency_s.sample(rng);
            let result: Vec<u32> = (0..r).map(|_| rng.random_range(0..cfg.vocab)).collect();
            tokens.extend_from_slice(&result);
            (result, secs_to_ns(l))
        };
        let impatient = rng.random_bool(shape.retry_probability);
        turns.push(Turn {
            prompt_len,
            output_len,
            tool_result_len: result.len(),
            tool_ns,
            impatient,
            stream: streams.len(),
            reused,
        });
        if matches!(
            cfg.history,
            HistoryConfig::Elide { .. } | HistoryConfig::DropThinking { .. }
        ) {
            parts.push((output, result));
        }
    }
    streams.push(hashing::chain(&tokens, block_size).into());
    (streams, turns, sketches)
}

/// The prompt rebuilt from the base and each earlier turn's output and
/// tool result as `keep(turn, output, result)` keeps them, or `None` when it
/// only extends the current stream `tokens`.
fn rebuilt<'a>(
    base: &[u32],
    parts: &'a [(Vec<u32>, Vec<u32>)],
    tokens: &[u32],
    keep: impl Fn(usize, &'a [u32], &'a [u32]) -> (&'a [u32], &'a [u32]),
) -> Option<Vec<u32>> {
    let mut p = base.to_vec();
    for (j, (output, result)) in parts.iter().enumerate() {
        let (output, result) = keep(j, output, result);
        p.extend_from_slice(output);
        p.extend_from_slice(result);
    }
    (!p.starts_with(tokens)).then_some(p)
}

/// Tokens `a` and `b` begin with alike.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> WorkloadConfig {
        WorkloadConfig {
            sessions: 4,
            turns: Uniform { min: 3, max: 6 },
            system_prompt_tokens: 64,
            task_tokens: Uniform { min: 10, max: 40 },
            output_tokens: TokenDist::LogNormal(LogNormalSpec {
                median: 20.0,
                sigma: 0.5,
                min: 1.0,
                max: 100.0,
            }),
            tool_result_tokens: TokenDist::LogNormal(LogNormalSpec {
                median: 50.0,
                sigma: 0.5,
                min: 1.0,
                max: 200.0,
            }),
            tool_latency_s: LogNormalSpec {
                median: 1.0,
                sigma: 1.0,
                min: 0.01,
                max: 10.0,
            },
            retry_probability: 0.5,
            retry_after_s: 2.0,
            max_retries: 1,
            vocab: 1000,
            arrival: ArrivalConfig::Together,
            classes: Vec::new(),
            history: HistoryConfig::Append,
            group_size: 1,
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_workload() {
        let a = Workload::generate(&cfg(), 16, 7);
        let b = Workload::generate(&cfg(), 16, 7);
        let c = Workload::generate(&cfg(), 16, 8);
        for (x, y) in a.sessions.iter().zip(&b.sessions) {
            assert_eq!(x.turns, y.turns);
            assert_eq!(x.streams, y.streams);
        }
        assert_ne!(a.sessions[0].turns, c.sessions[0].turns);
    }

    #[test]
    fn each_prompt_is_the_previous_history_plus_output_and_tool_result() {
        let w = Workload::generate(&cfg(), 16, 3);
        for s in &w.sessions {
            for pair in s.turns.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                assert_eq!(
                    b.prompt_len,
                    a.prompt_len + a.output_len + a.tool_result_len
                );
                assert!(a.tool_ns > 0);
            }
            let last = s.turns.last().unwrap();
            assert_eq!((last.tool_result_len, last.tool_ns), (0, 0));
            assert_eq!(s.streams.len(), 1);
            assert_eq!(s.streams[0].len(), s.max_request_tokens() / 16);
        }
    }

    #[test]
    fn sessions_share_exactly_the_system_prompt_blocks() {
        let w = Workload::generate(&cfg(), 16, 5);
        let (a, b) = (&w.sessions[0].streams[0], &w.sessions[1].streams[0]);
        assert_eq!(a[..4], b[..4], "64 shared tokens = 4 blocks");
        assert_ne!(a[4], b[4]);
    }

    #[test]
    fn a_grpo_group_shares_its_task_and_diverges_after_the_first_output() {
        let mut c = cfg();
        c.sessions = 7;
        c.group_size = 3;
        c.classes.push(ClassConfig {
            name: "other".into(),
            sessions: 2,
            turns: c.turns,
            task_tokens: c.task_tokens,
            output_tokens: c.output_tokens,
            tool_result_tokens: c.tool_result_tokens,
            tool_latency_s: c.tool_latency_s,
            retry_probability: 0.0,
        });
        assert_eq!(c.groups(), [0, 0, 0, 1, 1, 1, 2, 3, 3]);
        let w = Workload::generate(&c, 16, 5);
        let groups: Vec<usize> = w.sessions.iter().map(|s| s.group).collect();
        assert_eq!(groups, c.groups(), "each session carries its group");
        // Full blocks of the first prompt (system and task), and the block
        // where the first output begins.
        let first = |i: usize| w.sessions[i].turns[0].prompt_len;
        let same = |a: usize, b: usize| {
            let (x, y) = (&w.sessions[a].streams[0], &w.sessions[b].streams[0]);
            x.iter().zip(y.iter()).take_while(|(p, q)| p == q).count()
        };
        for (a, b) in [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (7, 8)] {
            assert_eq!(first(a), first(b), "{a} {b}: one task");
            // Identical through the task, different from the first output:
            // they share every full block of the first prompt and no block
            // that holds an output token.
            assert_eq!(same(a, b), first(a) / 16, "{a} {b}");
            assert_ne!(
                w.sessions[a].turns[0].output_len + w.sessions[a].turns[1].prompt_len,
                w.sessions[b].turns[0].output_len + w.sessions[b].turns[1].prompt_len,
                "{a} {b}: their own outputs and results"
            );
            assert_eq!(w.sessions[b].turns[0].reused, first(b), "{a} {b}");
        }
        // Across groups (and classes), only the system prompt's 4 blocks.
        for (a, b) in [(0, 3), (2, 3), (5, 6), (6, 7), (0, 8)] {
            assert_eq!(same(a, b), 4, "{a} {b}");
        }
        // Each group's first sample is warm only for the system prompt.
        for i in [0, 3, 6, 7] {
            assert_eq!(w.sessions[i].turns[0].reused, 64);
        }
        // Group size 1 is the default (the golden tests pin its draws).
        let toml_default: WorkloadConfig = toml::from_str(
            "sessions = 1\nturns = { min = 1, max = 1 }\nsystem_prompt_tokens = 1\n\
             task_tokens = { min = 1, max = 1 }\noutput_tokens = { min = 1, max = 1 }\n\
             tool_result_tokens = { min = 1, max = 1 }\n\
             tool_latency_s = { median = 1.0, sigma = 0.0, min = 1.0, max = 1.0 }\n",
        )
        .unwrap();
        assert_eq!(toml_default.group_size, 1);
        let mut zero = cfg();
        zero.group_size = 0;
        assert!(zero.validate().unwrap_err().contains("group_size"));
    }

    #[test]
    fn adding_sessions_leaves_existing_ones_unchanged() {
        let mut more = cfg();
        more.sessions = 9;
        let a = Workload::generate(&cfg(), 16, 11);
        let b = Workload::generate(&more, 16, 11);
        assert_eq!(a.sessions[3].turns, b.sessions[3].turns);
        assert_eq!(a.sessions[3].streams, b.sessions[3].streams);
    }

    #[test]
    fn arrivals_start_sessions_as_configured_without_moving_their_draws() {
        let together = Workload::generate(&cfg(), 16, 4);
        let mut c = cfg();
        c.arrival = ArrivalConfig::Staggered { interval_s: 2.0 };
        let staggered = Workload::generate(&c, 16, 4);
        let starts: Vec<_> = staggered.sessions.iter().map(|s| s.start).collect();
        assert_eq!(
            starts,
            (0..4)
                .map(|i| Start::At(i * 2_000_000_000))
                .collect::<Vec<_>>()
        );
        assert_eq!(together.sessions[2].turns, staggered.sessions[2].turns);
        c.arrival = ArrivalConfig::Poisson { rate_per_s: 1.0 };
        let a = Workload::generate(&c, 16, 4);
        let b = Workload::generate(&c, 16, 4);
        let times: Vec<u64> = a
            .sessions
            .iter()
            .map(|s| match s.start {
                Start::At(t) => t,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(times[0], 0);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(
            times,
            b.sessions
                .iter()
                .map(|s| match s.start {
                    Start::At(t) => t,
                    _ => 0,
                })
                .collect::<Vec<_>>()
        );
        c.arrival = ArrivalConfig::Waves {
            wave_sessions: 3,
            next_wave_after: 0.5,
        };
        let w = Workload::generate(&c, 16, 4);
        assert_eq!(w.sessions[0].start, Start::At(0));
        assert_eq!(
            w.sessions[3].start,
            Start::AfterFinishes { wave: 0, count: 2 }
        );
        assert_eq!((w.sessions[2].wave, w.sessions[3].wave), (0, 1));
        assert_eq!(w.wave_sessions(), Some(3), "one RL step's rollouts");
        assert_eq!(b.wave_sessions(), None, "no waves");
    }

    #[test]
    fn classes_follow_the_first_and_draw_from_their_own_shape() {
        let mut c = cfg();
        c.classes.push(ClassConfig {
            name: "chat".into(),
            sessions: 2,
            turns: Uniform { min: 1, max: 1 },
            task_tokens: Uniform { min: 5, max: 5 },
            output_tokens: c.output_tokens,
            tool_result_tokens: c.tool_result_tokens,
            tool_latency_s: c.tool_latency_s,
            retry_probability: 0.0,
        });
        assert_eq!(c.total_sessions(), 6);
        let w = Workload::generate(&c, 16, 9);
        let plain = Workload::generate(&cfg(), 16, 9);
        assert_eq!(w.sessions.len(), 6);
        assert_eq!(w.sessions[3].turns, plain.sessions[3].turns);
        for s in &w.sessions[4..] {
            assert_eq!(s.class, 1);
            assert_eq!(s.turns.len(), 1);
            assert_eq!(s.turns[0].prompt_len, 64 + 5);
        }
    }

    #[test]
    fn an_appended_history_is_one_stream_and_reuses_the_last_request() {
        let w = Workload::generate(&cfg(), 16, 3);
        for s in &w.sessions {
            assert_eq!(s.streams.len(), 1);
            assert_eq!(s.turns[0].reused, 64, "the system prompt");
            for pair in s.turns.windows(2) {
                assert_eq!(pair[1].reused, pair[0].prompt_len + pair[0].output_len);
                assert_eq!(pair[1].stream, 0);
            }
        }
    }

    #[test]
    fn a_compacted_history_starts_a_stream_from_the_task_and_a_summary() {
        let mut c = cfg();
        c.turns = Uniform { min: 12, max: 12 };
        c.history = HistoryConfig::Compact {
            at_tokens: 300,
            summary_tokens: 40,
        };
        let w = Workload::generate(&c, 16, 3);
        let mut compactions = 0;
        for s in &w.sessions {
            let base = s.turns[0].prompt_len;
            for pair in s.turns.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                assert!(a.prompt_len <= 300 + 1024 + 200, "{a:?}");
                if b.stream != a.stream {
                    compactions += 1;
                    assert_eq!(b.stream, a.stream + 1);
                    assert_eq!(b.prompt_len, base + 40, "system, task, summary");
                    assert_eq!(b.reused, base, "it begins like the last up to the task");
                    assert!(a.prompt_len + a.output_len + a.tool_result_len > 300);
                } else {
                    assert_eq!(b.reused, a.prompt_len + a.output_len);
                }
            }
            assert_eq!(
                s.streams.len(),
                1 + s
                    .turns
                    .iter()
                    .filter(|t| t.stream > 0)
                    .map(|t| t.stream)
                    .max()
                    .unwrap_or(0)
            );
            assert_eq!(s.sketches.len(), s.turns.len());
        }
        assert!(compactions > 0);
    }

    #[test]
    fn an_elided_history_stubs_all_but_the_last_results() {
        let mut c = cfg();
        c.turns = Uniform { min: 8, max: 8 };
        c.history = HistoryConfig::Elide {
            keep_last: 2,
            stub_tokens: 4,
        };
        let w = Workload::generate(&c, 16, 3);
        let append = Workload::generate(&cfg_with_turns(8), 16, 3);
        for (s, plain) in w.sessions.iter().zip(&append.sessions) {
            let t = &s.turns;
            // Up to turn 2 nothing is stubbed yet: the prompts append.
            assert_eq!(t[2].stream, 0);
            assert_eq!(t[2].prompt_len, plain.turns[2].prompt_len);
            // Turn 3 stubs turn 0's result: it rewrites from there.
            assert_eq!(t[3].stream, 1);
            assert_eq!(t[3].reused, t[0].prompt_len + t[0].output_len);
            assert_eq!(
                t[3].prompt_len,
                plain.turns[3].prompt_len - plain.turns[0].tool_result_len + 4
            );
            // Each later turn stubs one more.
            for (k, turn) in t.iter().enumerate().skip(4) {
                assert_eq!(turn.stream, k - 2);
            }
        }
    }

    #[test]
    fn dropped_thinking_leaves_only_the_last_prompt_to_reuse() {
        let mut c = cfg();
        c.history = HistoryConfig::DropThinking {
            thinking_fraction: 0.5,
        };
        let w = Workload::generate(&c, 16, 3);
        for s in &w.sessions {
            for pair in s.turns.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                let thinking = a.output_len / 2;
                assert_eq!(
                    b.prompt_len,
                    a.prompt_len + a.output_len - thinking + a.tool_result_len
                );
                if thinking > 0 {
                    assert_eq!(b.reused, a.prompt_len, "{a:?} {b:?}");
                }
            }
        }
        let mut bad = cfg();
        bad.history = HistoryConfig::DropThinking {
            thinking_fraction: 1.0,
        };
        assert!(bad.validate().is_err());
    }

    fn cfg_with_turns(n: usize) -> WorkloadConfig {
        let mut c = cfg();
        c.turns = Uniform { min: n, max: n };
        c
    }

    #[test]
    fn validation_refuses_nonsense() {
        assert!(cfg().validate().is_ok());
        let mut bad = cfg();
        bad.turns.min = 0;
        assert!(bad.validate().is_err());
        let mut bad = cfg();
        bad.retry_probability = 1.5;
        assert!(bad.validate().is_err());
        let mut bad = cfg();
        bad.tool_latency_s.median = 0.0;
        assert!(bad.validate().is_err());
        let mut bad = cfg();
        bad.arrival = ArrivalConfig::Waves {
            wave_sessions: 2,
            next_wave_after: 0.0,
        };
        assert!(bad.validate().is_err());
    }
}

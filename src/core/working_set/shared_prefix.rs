//! The prefix sessions share (a system prompt, tool definitions), for
//! hosts that pass only their prompts' lengths: cached once for all of
//! them, so counted once, not once per member. (A host that passes token
//! ids is served by the prefix tree, module `prefix_tree`, which sees each
//! shared prefix at every depth.)
//!
//! Learned from whichever the host gives, each serving a host the other
//! cannot:
//! - the cached tokens of each session's first turn (a host that reports
//!   them): what a first turn hits is what it shares;
//! - the usage gauge (a host that reports no cached tokens): the turns in
//!   flight hold fewer blocks than their prompts add up to by what they
//!   share.
//!
//! A new session is counted without what first turns have hit so far
//! until its own first turn reports: counting the prefix as its own
//! counted it once per session waiting to report.

use std::collections::VecDeque;

use super::estimates::running_mean;
use super::tuning::USAGE_SAMPLES;

#[derive(Debug, Default)]
pub(super) struct SharedPrefix {
    /// The prefix counted once, tokens.
    pub(super) tokens: u64,
    /// Running mean of what sessions' first turns hit.
    mean_first_hit: f64,
    /// What each of the last usage answers says a turn in flight shares
    /// with the others, tokens.
    sharing_samples: VecDeque<f64>,
    /// Whether any turn has reported its cached tokens.
    cached_reported: bool,
    /// Whether any prompt came with its token ids (its sketch).
    prompts_seen: bool,
}

/// The prompts of the members' turns in flight, as one usage answer sees
/// them.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) turns: u64,
    pub(super) prompts: u64,
    pub(super) shortest: u64,
    pub(super) longest: u64,
}

impl SharedPrefix {
    /// What a session's first turn is expected to hit before it reports
    /// it: what first turns have hit so far, whole blocks, at most the
    /// prefix counted.
    pub(super) fn expected_first_hit(&self, block: u64) -> u64 {
        let mean = (self.mean_first_hit as u64).min(self.tokens);
        mean / block * block
    }

    /// Whether nothing but the usage gauge can show what sessions share:
    /// no turn has reported cached tokens and no prompt came with its ids.
    pub(super) fn blind(&self) -> bool {
        !self.cached_reported && !self.prompts_seen
    }

    /// A prompt came with its token ids: the prefix tree sees what
    /// sessions share, and the usage gauge is not asked.
    pub(super) fn saw_prompt_tokens(&mut self) {
        self.prompts_seen = true;
    }

    /// A turn reported its cached tokens.
    pub(super) fn saw_cached_report(&mut self) {
        self.cached_reported = true;
    }

    /// A session's first turn shares `shared` tokens (its cached tokens,
    /// or what its sketch shared).
    pub(super) fn first_turn_shared(&mut self, shared: u64) {
        self.tokens = self.tokens.max(shared);
        self.mean_first_hit = running_mean(self.mean_first_hit, shared as f64);
    }

    /// A usage answer (`used` tokens in use) seen while blind: returns the
    /// prefix it shows, if that is more than is counted.
    ///
    /// vLLM's usage counts the blocks of the running requests, a block
    /// shared by several once. With `n` turns in flight whose prompts add
    /// up to `P` tokens and `U` in use, each turn beyond the first shares
    /// at least `(P - U) / (n - 1)`. It says too much while some turn holds
    /// less than its prompt (queued in the engine, part way through a
    /// chunked prefill, a gauge read late), so an answer below the longest
    /// prompt in flight is not taken, the least of the recent answers is,
    /// at most the shortest prompt in flight, and the prefix only grows.
    pub(super) fn sample_usage(&mut self, used: f64, f: InFlight, block: u64) -> Option<u64> {
        if f.turns < 2 || used < f.longest as f64 {
            return None;
        }
        let saved = ((f.prompts as f64 - used) / (f.turns - 1) as f64)
            .clamp(0.0, f.shortest.saturating_sub(1) as f64);
        if self.sharing_samples.len() == USAGE_SAMPLES {
            self.sharing_samples.pop_front();
        }
        self.sharing_samples.push_back(saved);
        let least = self.sharing_samples.iter().copied().fold(saved, f64::min);
        let shared = least as u64 / block * block;
        if shared <= self.tokens {
            return None;
        }
        self.tokens = shared;
        self.mean_first_hit = shared as f64;
        Some(shared)
    }
}

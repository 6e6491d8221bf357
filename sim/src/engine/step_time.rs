//! How long one engine step takes:
//!
//! ```text
//! β0 + β1 · prefill tokens + β2 · decode sequences + β3 · context tokens + β4 · attention pairs
//! ```
//!
//! summed over the requests the step schedules, each computing `n` tokens
//! after the `c` it already holds:
//! - **prefill** counts the `n` of every request that is not decoding (a
//!   prompt chunk, or a recomputation after an eviction); **decode** counts
//!   the requests that decode one token;
//! - **context** is the KV each request's attention reads, its own new
//!   tokens included: `c + n`;
//! - **attention pairs** are the query-key pairs its attention computes:
//!   token `c + i` (1-based `i`) attends to `c + i` keys, so a chunk of `n`
//!   new tokens over `c` cached ones attends `n·c + n(n+1)/2` pairs, and a
//!   decode step `c + 1`.
//!
//! β0 is the step's fixed cost (on a GPU, mostly reading the weights); β1
//! the linear layers' work per token; β2 what a decode sequence adds beyond
//! its context; β3 streaming KV from memory; β4 the attention arithmetic,
//! the term that makes re-prefilling a long history cost more than its
//! length: a chunk over a 32k-token prefix is 2.5–4.6× dearer than the same
//! chunk alone on an H200. A model without β4 (β4 = 0) is the four-term
//! model that scenario files written before it used.
//!
//! Where the coefficients come from is a [`super::profile::Profile`]: a
//! fit to a measured engine, or a derivation from one, kept as data.

/// What one step schedules, in the units the step cost charges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepLoad {
    /// Tokens computed by requests that are not decoding.
    pub prefill: u64,
    /// Requests decoding one token.
    pub decode: u64,
    /// KV tokens read by attention, new tokens included.
    pub context: u64,
    /// Query-key pairs attended.
    pub attn_pairs: u64,
}

impl StepLoad {
    /// Adds a request that computes `n` tokens after the `cached` it holds,
    /// decoding (one sampled token after its prompt) or not.
    pub fn add(&mut self, cached: u64, n: u64, decoding: bool) {
        if decoding {
            self.decode += 1;
        } else {
            self.prefill += n;
        }
        self.context += cached + n;
        self.attn_pairs += attention_pairs(cached, n);
    }
}

/// Query-key pairs attended by `n` new tokens after `cached` ones under a
/// causal mask: `n·cached + n(n+1)/2`.
pub fn attention_pairs(cached: u64, n: u64) -> u64 {
    n * cached + n * (n + 1) / 2
}

/// Step-time coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Fixed cost of a step, milliseconds.
    pub beta0_ms: f64,
    /// Cost per prefill token computed (prompt or recompute), microseconds.
    pub beta1_us: f64,
    /// Cost per decoding sequence, microseconds.
    pub beta2_us: f64,
    /// Cost per context token read by attention, microseconds.
    pub beta3_us: f64,
    /// Cost per query-key pair attended, microseconds (0: the four-term model).
    pub beta4_us: f64,
}

impl StepCost {
    /// Duration in nanoseconds of a step that schedules `load`.
    pub fn step_ns(&self, load: StepLoad) -> u64 {
        let ns = self.beta0_ms * 1e6
            + self.beta1_us * 1e3 * load.prefill as f64
            + self.beta2_us * 1e3 * load.decode as f64
            + self.beta3_us * 1e3 * load.context as f64
            + self.beta4_us * 1e3 * load.attn_pairs as f64;
        ns.round().max(1.0) as u64
    }

    /// Prefill throughput of one chunk of `n` tokens over `cached` ones
    /// alone in a step, tokens per second.
    pub fn chunk_rate(&self, cached: u64, n: u64) -> f64 {
        let mut load = StepLoad::default();
        load.add(cached, n, false);
        n as f64 / (self.step_ns(load) as f64 / 1e9)
    }

    /// Rejects coefficients that would make time stand still or run
    /// backwards, naming the coefficient.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("beta0_ms", self.beta0_ms),
            ("beta1_us", self.beta1_us),
            ("beta2_us", self.beta2_us),
            ("beta3_us", self.beta3_us),
            ("beta4_us", self.beta4_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("`{name}` must be a finite number >= 0, not {v}"));
            }
        }
        if self.beta0_ms == 0.0 && self.beta1_us == 0.0 && self.beta2_us == 0.0 {
            return Err(
                "beta0_ms, beta1_us and beta2_us are all zero: a step would take no time".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(cached: u64, n: u64) -> StepLoad {
        let mut l = StepLoad::default();
        l.add(cached, n, false);
        l
    }

    #[test]
    fn a_chunk_attends_its_cached_prefix_and_itself_causally() {
        assert_eq!(attention_pairs(0, 1), 1);
        assert_eq!(attention_pairs(0, 4), 10); // 1 + 2 + 3 + 4
        assert_eq!(attention_pairs(8, 4), 42); // 9 + 10 + 11 + 12
                                               // A decode step over 1,023 resident tokens reads 1,024 and attends 1,024.
        let mut d = StepLoad::default();
        d.add(1023, 1, true);
        assert_eq!(
            d,
            StepLoad {
                prefill: 0,
                decode: 1,
                context: 1024,
                attn_pairs: 1024
            }
        );
        // The measurement's regressors (a 1,024-token chunk over 32,768).
        assert_eq!(
            chunk(32_768, 1024),
            StepLoad {
                prefill: 1024,
                decode: 0,
                context: 33_792,
                attn_pairs: 34_079_232
            }
        );
    }

    #[test]
    fn each_term_charges_its_own_unit() {
        let c = StepCost {
            beta0_ms: 1.0,
            beta1_us: 10.0,
            beta2_us: 100.0,
            beta3_us: 0.5,
            beta4_us: 0.001,
        };
        let load = StepLoad {
            prefill: 3,
            decode: 2,
            context: 1000,
            attn_pairs: 1_000_000,
        };
        assert_eq!(
            c.step_ns(load),
            1_000_000 + 30_000 + 200_000 + 500_000 + 1_000_000
        );
        // Without the attention term a chunk over a long prefix pays only its read.
        let four = StepCost { beta4_us: 0.0, ..c };
        let long = chunk(32_768, 256);
        assert_eq!(
            c.step_ns(long) - four.step_ns(long),
            (0.001 * 1e3 * long.attn_pairs as f64).round() as u64
        );
    }

    #[test]
    fn degenerate_coefficients_are_refused_by_name() {
        let ok = StepCost {
            beta0_ms: 1.0,
            beta1_us: 1.0,
            beta2_us: 1.0,
            beta3_us: 0.0,
            beta4_us: 0.0,
        };
        assert!(ok.validate().is_ok());
        let zero = StepCost {
            beta0_ms: 0.0,
            beta1_us: 0.0,
            beta2_us: 0.0,
            ..ok
        };
        assert!(zero.validate().unwrap_err().contains("all zero"));
        let neg = StepCost {
            beta1_us: -1.0,
            ..ok
        };
        assert!(neg.validate().unwrap_err().contains("beta1_us"));
        let nan = StepCost {
            beta4_us: f64::NAN,
            ..ok
        };
        assert!(nan.validate().unwrap_err().contains("beta4_us"));
        let inf = StepCost {
            beta3_us: f64::INFINITY,
            ..ok
        };
        assert!(inf.validate().unwrap_err().contains("beta3_us"));
    }
}

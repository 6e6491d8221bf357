//! How long one engine step takes:
//! `β0 + β1 · prefill tokens + β2 · decode tokens + β3 · context tokens read`.
//!
//! β0–β2 and their defaults are BLIS's fit for Llama-3.1-8B on one H100 under
//! vLLM 0.8.4 (β = 5752.7 µs, 17.25 µs/token, 6.00 µs/token): an 8192-token
//! prefill chunk costs about 147 ms, a decode step of 64 sequences about
//! 6.1 ms. That fit has no term for context length, but on a GPU every step
//! also streams each scheduled request's KV from HBM, so the step grows with
//! the tokens resident in running requests. β3 charges that read: per token of
//! KV a scheduled request already holds at the start of the step. Its default
//! is a roofline estimate, not a fit: Llama-3.1-8B keeps 2 · 32 layers · 8 KV
//! heads · 128 dims · 2 bytes = 128 KiB (131,072 B) of KV per token, and an
//! H100 SXM reads HBM at 3.35 TB/s, so one token's KV takes
//! 131,072 / 3.35e12 s ≈ 0.0391 µs (384k resident tokens add ≈ 15 ms a step).

/// Step-time coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Fixed cost of a step, milliseconds.
    pub beta0_ms: f64,
    /// Cost per prefill token computed (prompt or recompute), microseconds.
    pub beta1_us: f64,
    /// Cost per decode token, microseconds.
    pub beta2_us: f64,
    /// Cost per context token read: the KV a scheduled request already
    /// holds at the start of the step, microseconds.
    pub beta3_us: f64,
}

/// β3's roofline default: 128 KiB of KV per token over 3.35 TB/s, in µs.
pub const ROOFLINE_BETA3_US: f64 = 131_072.0 / 3.35e12 * 1e6;

impl Default for StepCost {
    fn default() -> Self {
        Self {
            beta0_ms: 5.75,
            beta1_us: 17.25,
            beta2_us: 6.0,
            beta3_us: ROOFLINE_BETA3_US,
        }
    }
}

impl StepCost {
    /// Duration in nanoseconds of a step computing `prefill` prompt tokens
    /// and `decode` decode tokens while its requests read `context` tokens
    /// of KV they already held.
    pub fn step_ns(&self, prefill: usize, decode: usize, context: usize) -> u64 {
        let ns = self.beta0_ms * 1e6
            + self.beta1_us * 1e3 * prefill as f64
            + self.beta2_us * 1e3 * decode as f64
            + self.beta3_us * 1e3 * context as f64;
        ns.round().max(1.0) as u64
    }

    /// Rejects coefficients that would make time stand still or run backwards.
    pub fn validate(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(self.beta0_ms) && ok(self.beta1_us) && ok(self.beta2_us) && ok(self.beta3_us)) {
            return Err(format!(
                "step-time coefficients must be finite and >= 0: {self:?}"
            ));
        }
        if self.beta0_ms == 0.0 && self.beta1_us == 0.0 && self.beta2_us == 0.0 {
            return Err("step-time coefficients are all zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_coefficients_match_the_llama_8b_h100_fit() {
        let c = StepCost::default();
        assert_eq!(c.step_ns(0, 0, 0), 5_750_000);
        assert_eq!(c.step_ns(8192, 0, 0), 5_750_000 + 8192 * 17_250);
        assert_eq!(c.step_ns(0, 64, 0), 5_750_000 + 64 * 6_000);
        assert_eq!(c.step_ns(100, 10, 0), 5_750_000 + 1_725_000 + 60_000);
        // ~147 ms for a full chunk, as in the notes.
        assert_eq!(c.step_ns(8192, 0, 0) / 1_000_000, 147);
    }

    #[test]
    fn the_context_term_is_the_hbm_roofline_of_an_8b_model_on_h100() {
        let c = StepCost::default();
        // 128 KiB per token at 3.35 TB/s: 39.1 ns per resident token.
        assert!((c.beta3_us - 0.039126).abs() < 1e-6, "{}", c.beta3_us);
        // 384k resident tokens add about 15 ms to a step.
        let extra = c.step_ns(0, 64, 384_000) - c.step_ns(0, 64, 0);
        assert_eq!(extra / 1_000_000, 15);
    }

    #[test]
    fn degenerate_coefficients_are_refused() {
        assert!(StepCost::default().validate().is_ok());
        let zero = StepCost {
            beta0_ms: 0.0,
            beta1_us: 0.0,
            beta2_us: 0.0,
            beta3_us: 0.0,
        };
        assert!(zero.validate().is_err());
        let neg = StepCost {
            beta1_us: -1.0,
            ..StepCost::default()
        };
        assert!(neg.validate().is_err());
        let nan = StepCost {
            beta2_us: f64::NAN,
            ..StepCost::default()
        };
        assert!(nan.validate().is_err());
    }
}

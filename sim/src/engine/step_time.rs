//! How long one engine step takes: `β0 + β1 · prefill tokens + β2 · decode tokens`.
//!
//! The linear model and its default coefficients are BLIS's fit for
//! Llama-3.1-8B on one H100 under vLLM 0.8.4 (β = 5752.7 µs, 17.25 µs/token,
//! 6.00 µs/token): an 8192-token prefill chunk costs about 147 ms, a decode
//! step of 64 sequences about 6.1 ms. Attention cost growing with context
//! length is not modelled (see the README's simplifications).

/// Step-time coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Fixed cost of a step, milliseconds.
    pub beta0_ms: f64,
    /// Cost per prefill token computed (prompt or recompute), microseconds.
    pub beta1_us: f64,
    /// Cost per decode token, microseconds.
    pub beta2_us: f64,
}

impl Default for StepCost {
    fn default() -> Self {
        Self {
            beta0_ms: 5.75,
            beta1_us: 17.25,
            beta2_us: 6.0,
        }
    }
}

impl StepCost {
    /// Duration in nanoseconds of a step computing `prefill` prompt tokens
    /// and `decode` decode tokens.
    pub fn step_ns(&self, prefill: usize, decode: usize) -> u64 {
        let ns = self.beta0_ms * 1e6
            + self.beta1_us * 1e3 * prefill as f64
            + self.beta2_us * 1e3 * decode as f64;
        ns.round().max(1.0) as u64
    }

    /// Rejects coefficients that would make time stand still or run backwards.
    pub fn validate(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(self.beta0_ms) && ok(self.beta1_us) && ok(self.beta2_us)) {
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
        assert_eq!(c.step_ns(0, 0), 5_750_000);
        assert_eq!(c.step_ns(8192, 0), 5_750_000 + 8192 * 17_250);
        assert_eq!(c.step_ns(0, 64), 5_750_000 + 64 * 6_000);
        assert_eq!(c.step_ns(100, 10), 5_750_000 + 1_725_000 + 60_000);
        // ~147 ms for a full chunk, as in the notes.
        assert_eq!(c.step_ns(8192, 0) / 1_000_000, 147);
    }

    #[test]
    fn degenerate_coefficients_are_refused() {
        assert!(StepCost::default().validate().is_ok());
        let zero = StepCost {
            beta0_ms: 0.0,
            beta1_us: 0.0,
            beta2_us: 0.0,
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

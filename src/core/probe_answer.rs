//! What a probe answered, once sanitised: the one form in which the
//! engine's fractions (usage, resident prefix) reach the decisions.

/// What a probe answered, once sanitised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ProbeAnswer {
    /// A usable fraction in `[0, 1]`.
    Value(f64),
    /// The probe said it had no answer (`None`).
    Unavailable,
    /// The probe answered NaN, an infinity or a value outside `[0, 1]`;
    /// treated exactly like `Unavailable`, counted apart so misconfigured
    /// probes show up in the stats.
    Invalid,
}

impl ProbeAnswer {
    /// Sanitises a raw probe answer.
    pub fn from_raw(raw: Option<f64>) -> Self {
        match raw {
            None => Self::Unavailable,
            Some(v) if v.is_finite() && (0.0..=1.0).contains(&v) => Self::Value(v),
            Some(_) => Self::Invalid,
        }
    }

    /// The usable value, if any.
    pub fn value(self) -> Option<f64> {
        match self {
            Self::Value(v) => Some(v),
            Self::Unavailable | Self::Invalid => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeAnswer;

    #[test]
    fn only_finite_fractions_are_values() {
        assert_eq!(ProbeAnswer::from_raw(Some(0.0)), ProbeAnswer::Value(0.0));
        assert_eq!(ProbeAnswer::from_raw(Some(1.0)), ProbeAnswer::Value(1.0));
        assert_eq!(ProbeAnswer::from_raw(None), ProbeAnswer::Unavailable);
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.1, 1.1] {
            assert_eq!(ProbeAnswer::from_raw(Some(bad)), ProbeAnswer::Invalid);
            assert_eq!(ProbeAnswer::from_raw(Some(bad)).value(), None);
        }
    }
}

//! The gate's knobs, with the reference implementation's defaults and
//! validation that refuses bad values instead of silently clamping them.

use std::fmt;
use std::time::Duration;

/// How the gate decides under pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AdmissionMode {
    /// Working-set admission (`core::working_set`): sessions are admitted
    /// while their prefix-cache footprints fit the engine's KV capacity,
    /// in FIFO order, and keep their place between turns for a window
    /// measured from the engine. The default.
    #[default]
    WorkingSet,
    /// The seed's decision table, exactly: usage watermark, reservation,
    /// prefix probe (`core::reference`).
    Reference,
}

impl AdmissionMode {
    /// The mode's name, as the C ABI and the configuration files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionMode::WorkingSet => "working_set",
            AdmissionMode::Reference => "reference",
        }
    }

    /// Parses [`AdmissionMode::as_str`]'s names.
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        match name {
            "working_set" | "working-set" => Ok(AdmissionMode::WorkingSet),
            "reference" => Ok(AdmissionMode::Reference),
            other => Err(ConfigError {
                field: "admission",
                value: other.to_string(),
                expected: "working_set or reference",
            }),
        }
    }
}

/// The gate's tuning knobs.
///
/// Defaults: working-set admission; the other figures are the reference
/// implementation's (watermark 0.85, hit threshold 0.80, poll 5 s, idle
/// grace 60 s), used by [`AdmissionMode::Reference`] (watermark, hit threshold,
/// idle grace) and by both modes (poll, retention). Unlike the reference, values
/// are validated by [`Config::validate`] (called by every constructor) and
/// never clamped: a poll interval below 5 s is allowed, a NaN watermark is
/// an error.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// How the gate decides under pressure.
    pub admission: AdmissionMode,
    /// KV-cache usage (0..=1) at or above which the gate is under pressure.
    /// `usage == high_watermark` counts as pressure.
    pub high_watermark: f64,
    /// Prefix hit ratio (0..=1) at or above which a session's prompt counts as
    /// resident under pressure. `hit_ratio == hit_threshold` is resident.
    pub hit_threshold: f64,
    /// Longest a waiting attempt sleeps before probing again when nobody
    /// wakes it. Must be greater than zero.
    pub wait_poll: Duration,
    /// How long a session keeps its reservation after its last retaining
    /// lease is released (the ownership window). Zero means no window.
    pub idle_grace: Duration,
    /// How long a session's record (its per-session statistics) is kept after
    /// the session became idle: no lease, no waiting attempt, no reservation.
    /// Bounds memory when hosts never call `finish_session`.
    pub session_retention: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            admission: AdmissionMode::WorkingSet,
            high_watermark: 0.85,
            hit_threshold: 0.80,
            wait_poll: Duration::from_secs(5),
            idle_grace: Duration::from_secs(60),
            session_retention: Duration::from_secs(600),
        }
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The offending field, as named in [`Config`].
    pub field: &'static str,
    /// The value that was given, rendered for humans.
    pub value: String,
    /// What the field accepts.
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}: {} (expected {})",
            self.field, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// Longest duration the gate accepts for any knob: time is kept in u64
/// nanoseconds, and a century is far beyond any meaningful window.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Config {
    /// The reference implementation's configuration: its decision table
    /// and its defaults.
    pub fn reference() -> Self {
        Self {
            admission: AdmissionMode::Reference,
            ..Self::default()
        }
    }

    /// Checks every field; the first offending one is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_fraction("high_watermark", self.high_watermark)?;
        check_fraction("hit_threshold", self.hit_threshold)?;
        if self.wait_poll.is_zero() || self.wait_poll > MAX_DURATION {
            return Err(ConfigError {
                field: "wait_poll",
                value: format!("{:?}", self.wait_poll),
                expected: "a duration greater than zero and at most 100 years",
            });
        }
        check_duration("idle_grace", self.idle_grace)?;
        check_duration("session_retention", self.session_retention)?;
        Ok(())
    }

    /// Sets a duration field from seconds given as a float (the unit hosts
    /// and the reference's environment variables use), refusing NaN,
    /// infinities and negatives instead of clamping them.
    pub fn duration_from_secs(field: &'static str, secs: f64) -> Result<Duration, ConfigError> {
        if !secs.is_finite() || secs < 0.0 || secs > MAX_DURATION.as_secs_f64() {
            return Err(ConfigError {
                field,
                value: format!("{secs}"),
                expected: "a finite number of seconds, at least 0 and at most 100 years",
            });
        }
        Ok(Duration::from_secs_f64(secs))
    }

    pub(crate) fn wait_poll_ns(&self) -> u64 {
        duration_ns(self.wait_poll)
    }

    pub(crate) fn idle_grace_ns(&self) -> u64 {
        duration_ns(self.idle_grace)
    }

    pub(crate) fn session_retention_ns(&self) -> u64 {
        duration_ns(self.session_retention)
    }
}

fn check_fraction(field: &'static str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError {
            field,
            value: format!("{value}"),
            expected: "a finite number between 0 and 1 inclusive",
        })
    }
}

fn check_duration(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value > MAX_DURATION {
        Err(ConfigError {
            field,
            value: format!("{value:?}"),
            expected: "a duration of at most 100 years",
        })
    } else {
        Ok(())
    }
}

/// Nanoseconds of a validated duration (at most a century, so it fits).
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_reference_ones_and_valid() {
        assert_eq!(Config::default().admission, AdmissionMode::WorkingSet);
        let c = Config::reference();
        assert_eq!(c.admission, AdmissionMode::Reference);
        assert_eq!(c.high_watermark, 0.85);
        assert_eq!(c.hit_threshold, 0.80);
        assert_eq!(c.wait_poll, Duration::from_secs(5));
        assert_eq!(c.idle_grace, Duration::from_secs(60));
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn fractions_outside_unit_interval_or_non_finite_are_refused() {
        for bad in [f64::NAN, f64::INFINITY, -0.01, 1.01] {
            let c = Config {
                high_watermark: bad,
                ..Config::default()
            };
            assert_eq!(c.validate().unwrap_err().field, "high_watermark");
            let c = Config {
                hit_threshold: bad,
                ..Config::default()
            };
            assert_eq!(c.validate().unwrap_err().field, "hit_threshold");
        }
        for edge in [0.0, 1.0] {
            let c = Config {
                high_watermark: edge,
                hit_threshold: edge,
                ..Config::default()
            };
            assert_eq!(c.validate(), Ok(()));
        }
    }

    #[test]
    fn poll_must_be_positive_but_is_not_clamped() {
        let c = Config {
            wait_poll: Duration::ZERO,
            ..Config::default()
        };
        let err = c.validate().unwrap_err();
        assert_eq!(err.field, "wait_poll");
        assert!(err.to_string().contains("wait_poll"), "{err}");
        let c = Config {
            wait_poll: Duration::from_millis(1),
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.wait_poll, Duration::from_millis(1));
    }

    #[test]
    fn zero_grace_and_retention_are_allowed() {
        let c = Config {
            idle_grace: Duration::ZERO,
            session_retention: Duration::ZERO,
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn admission_names_round_trip_and_others_are_refused() {
        for a in [AdmissionMode::WorkingSet, AdmissionMode::Reference] {
            assert_eq!(AdmissionMode::parse(a.as_str()), Ok(a));
        }
        assert_eq!(AdmissionMode::parse("fifo").unwrap_err().field, "admission");
    }

    #[test]
    fn seconds_conversion_refuses_what_the_reference_clamped() {
        assert_eq!(
            Config::duration_from_secs("idle_grace", 1.5),
            Ok(Duration::from_millis(1500))
        );
        for bad in [f64::NAN, -1.0, f64::INFINITY, 1e12] {
            let err = Config::duration_from_secs("idle_grace", bad).unwrap_err();
            assert_eq!(err.field, "idle_grace");
        }
    }
}

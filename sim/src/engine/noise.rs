//! A noisy engine: what other load on the machine does to step times.
//!
//! - **Jitter**: every step's cost is multiplied by its own factor, drawn
//!   log-uniformly in `[lo, hi]` (`×0.5–2`: as likely halved as doubled,
//!   median 1, mean `(hi − lo) / ln(hi / lo)`, 1.08 for 0.5–2). The draw is
//!   a hash of the run's seed, the replica and the step's index, so a seed
//!   gives the same noise every time, and no other draw moves.
//! - **Co-tenant**: from `start_s` to `end_s` of simulated time another job
//!   takes part of the engine: a step that begins in the window costs
//!   `slowdown` times as much (2: half the engine).
//!
//! The engine's own counters (busy time) and the step durations the gate's
//! measured prefill rate is fed by (`crate::prefill_rate`) are the noisy
//! ones: the gate sees the noise only through what it measures. The lower
//! bound stays the quiet engine's.

use serde::Deserialize;

/// A window of simulated time in which a co-tenant slows every step.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cotenant {
    /// When it starts, seconds of simulated time.
    pub start_s: f64,
    /// When it leaves, seconds.
    pub end_s: f64,
    /// How much dearer a step is meanwhile (2: it takes half the engine).
    #[serde(default = "two")]
    pub slowdown: f64,
}

fn two() -> f64 {
    2.0
}

/// Step-time noise of an engine (none by default).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Noise {
    /// Each step's cost times a log-uniform factor in `[lo, hi]`.
    pub jitter: Option<(f64, f64)>,
    /// A co-tenant's window.
    pub cotenant: Option<Cotenant>,
}

impl Noise {
    /// Whether it changes anything.
    pub fn is_quiet(&self) -> bool {
        self.jitter.is_none() && self.cotenant.is_none()
    }

    /// Refuses factors that are not positive and finite, or a window that
    /// ends before it starts.
    pub fn validate(&self) -> Result<(), String> {
        if let Some((lo, hi)) = self.jitter {
            if !(lo > 0.0 && lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(format!(
                    "noise: jitter {lo}-{hi} must be 0 < lo <= hi, finite"
                ));
            }
        }
        if let Some(c) = self.cotenant {
            let ok = c.start_s >= 0.0
                && c.start_s.is_finite()
                && c.end_s.is_finite()
                && c.start_s <= c.end_s
                && c.slowdown > 0.0
                && c.slowdown.is_finite();
            if !ok {
                return Err(format!(
                    "noise: co-tenant {c:?} needs 0 <= start_s <= end_s and slowdown > 0, finite"
                ));
            }
        }
        Ok(())
    }

    /// Parses the command line's form: comma-separated `jitter=LO-HI`,
    /// `cotenant=START-END` (seconds) and `slowdown=F` (default 2), e.g.
    /// `jitter=0.5-2,cotenant=300-900`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let range = |v: &str, what: &str| -> Result<(f64, f64), String> {
            let (a, b) = v
                .split_once('-')
                .ok_or(format!("--noise {what}={v}: expected {what}=A-B"))?;
            let num = |x: &str| {
                x.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("--noise {what}={v}: `{x}` is not a number"))
            };
            Ok((num(a)?, num(b)?))
        };
        let mut noise = Noise::default();
        let mut slowdown = None;
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or(format!("--noise: `{part}` is not key=value"))?;
            match key {
                "jitter" => noise.jitter = Some(range(value, key)?),
                "cotenant" => {
                    let (start_s, end_s) = range(value, key)?;
                    noise.cotenant = Some(Cotenant {
                        start_s,
                        end_s,
                        slowdown: 2.0,
                    });
                }
                "slowdown" => {
                    slowdown = Some(
                        value
                            .parse::<f64>()
                            .map_err(|_| format!("--noise slowdown={value}: not a number"))?,
                    )
                }
                other => {
                    return Err(format!(
                        "--noise: unknown `{other}` (jitter=LO-HI, cotenant=START-END, slowdown=F)"
                    ))
                }
            }
        }
        if let Some(s) = slowdown {
            match noise.cotenant.as_mut() {
                Some(c) => c.slowdown = s,
                None => return Err("--noise: slowdown needs a cotenant=START-END".into()),
            }
        }
        if noise.is_quiet() {
            return Err("--noise: name jitter=LO-HI and/or cotenant=START-END".into());
        }
        noise.validate()?;
        Ok(noise)
    }

    /// The factor on the cost of step `step` of the replica keyed `key`,
    /// begun at `now_ns`.
    pub fn factor(&self, key: u64, step: u64, now_ns: u64) -> f64 {
        let mut f = 1.0;
        if let Some((lo, hi)) = self.jitter {
            let u = unit(mix(key ^ mix(step)));
            f *= lo * (hi / lo).powf(u);
        }
        if let Some(c) = self.cotenant {
            let t = now_ns as f64 / 1e9;
            if t >= c.start_s && t < c.end_s {
                f *= c.slowdown;
            }
        }
        f
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some((lo, hi)) = self.jitter {
            parts.push(format!("step costs x{lo}-{hi} (log-uniform, per step)"));
        }
        if let Some(c) = self.cotenant {
            parts.push(format!(
                "a co-tenant slows steps x{} from {} s to {} s",
                c.slowdown, c.start_s, c.end_s
            ));
        }
        parts.join("; ")
    }
}

/// The key of replica `replica`'s noise in a run of `seed`.
pub fn key(seed: u64, replica: usize) -> u64 {
    mix(seed.wrapping_add(0x6e6f_6973_6500_0000) ^ mix(replica as u64 + 1))
}

/// SplitMix64's finaliser: a fixed, well-mixed hash of one word.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce5_e4b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The top 53 bits as a float in [0, 1).
fn unit(z: u64) -> f64 {
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_its_range_is_fixed_per_key_and_centred() {
        let n = Noise::parse("jitter=0.5-2").unwrap();
        let k = key(3, 0);
        let fs: Vec<f64> = (0..10_000).map(|s| n.factor(k, s, 0)).collect();
        assert!(fs.iter().all(|&f| (0.5..=2.0).contains(&f)));
        assert_eq!(
            fs,
            (0..10_000).map(|s| n.factor(k, s, 0)).collect::<Vec<_>>()
        );
        assert_ne!(
            n.factor(key(4, 0), 0, 0),
            fs[0],
            "another seed, other noise"
        );
        assert_ne!(
            n.factor(key(3, 1), 0, 0),
            fs[0],
            "another replica, other noise"
        );
        let below = fs.iter().filter(|&&f| f < 1.0).count();
        assert!((4_800..5_200).contains(&below), "{below}");
        let mean = fs.iter().sum::<f64>() / fs.len() as f64;
        assert!((mean - 1.5 / 4f64.ln()).abs() < 0.01, "{mean}");
    }

    #[test]
    fn a_cotenant_slows_only_its_window() {
        let n = Noise::parse("cotenant=10-20,slowdown=3").unwrap();
        assert_eq!(n.factor(1, 0, 9_999_999_999), 1.0);
        assert_eq!(n.factor(1, 0, 10_000_000_000), 3.0);
        assert_eq!(n.factor(1, 0, 20_000_000_000), 1.0);
        let both = Noise::parse("jitter=1-1,cotenant=0-5").unwrap();
        assert_eq!(both.factor(7, 7, 0), 2.0);
    }

    #[test]
    fn bad_specs_are_refused() {
        for bad in [
            "",
            "jitter=2",
            "jitter=0-2",
            "jitter=2-1",
            "cotenant=20-10",
            "slowdown=2",
            "cotenant=1-2,slowdown=0",
            "wobble=1-2",
        ] {
            assert!(Noise::parse(bad).is_err(), "{bad}");
        }
    }
}

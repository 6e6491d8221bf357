//! Engine profiles: the step-time coefficients of one model on one device,
//! kept as data (`sim/profiles/*.toml`, built into the binary) and named by
//! scenarios (`[engine] profile = "h200-llama8b"`) or by `--profile`.
//!
//! Each file says where its figures come from: a fit to a measured engine
//! (`kvgate-sim --fit-steps`), or a derivation from such a fit written
//! beside it. A profile must set all five coefficients; `beta4_us = 0` is
//! the four-term model (no attention term).

use std::path::Path;

use serde::Deserialize;

use super::step_time::StepCost;

/// The built-in profiles.
pub const BUILT_IN: [(&str, &str); 5] = [
    (
        "h200-llama8b",
        include_str!("../../profiles/h200-llama8b.toml"),
    ),
    (
        "h200-llama8b-fa3",
        include_str!("../../profiles/h200-llama8b-fa3.toml"),
    ),
    (
        "h100-llama8b",
        include_str!("../../profiles/h100-llama8b.toml"),
    ),
    (
        "h100-llama8b-blis",
        include_str!("../../profiles/h100-llama8b-blis.toml"),
    ),
    ("cpu-small", include_str!("../../profiles/cpu-small.toml")),
];

/// The profile of an engine that no scenario names (`EngineConfig::default`).
pub const DEFAULT: &str = "h100-llama8b";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    description: String,
    beta0_ms: Option<f64>,
    beta1_us: Option<f64>,
    beta2_us: Option<f64>,
    beta3_us: Option<f64>,
    beta4_us: Option<f64>,
}

/// A validated profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Its name (`h200-llama8b`).
    pub name: String,
    /// Model, device and where the figures come from, in one line.
    pub description: String,
    /// The step-time coefficients.
    pub cost: StepCost,
}

impl Profile {
    /// Parses and validates profile TOML.
    pub fn parse(text: &str) -> Result<Self, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let need = |v: Option<f64>, name: &str| {
            v.ok_or(format!(
                "no `{name}`: a profile sets beta0_ms, beta1_us, beta2_us, beta3_us and beta4_us (0 for a term it lacks)"
            ))
        };
        let cost = StepCost {
            beta0_ms: need(f.beta0_ms, "beta0_ms")?,
            beta1_us: need(f.beta1_us, "beta1_us")?,
            beta2_us: need(f.beta2_us, "beta2_us")?,
            beta3_us: need(f.beta3_us, "beta3_us")?,
            beta4_us: need(f.beta4_us, "beta4_us")?,
        };
        cost.validate()?;
        Ok(Self {
            name: f.name,
            description: f.description,
            cost,
        })
    }

    /// A built-in profile by name, or a profile file by path.
    pub fn load(name_or_path: &str) -> Result<Self, String> {
        if let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::parse(text).map_err(|e| format!("built-in profile {name_or_path}: {e}"));
        }
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e == "toml") && path.exists() {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            return Self::parse(&text).map_err(|e| format!("profile {}: {e}", path.display()));
        }
        Err(format!(
            "no profile `{name_or_path}`: give a .toml file path or one of {}",
            names().join(", ")
        ))
    }
}

/// The built-in profiles' names.
pub fn names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::step_time::StepLoad;

    #[test]
    fn every_built_in_profile_parses_under_its_own_name() {
        for (name, text) in BUILT_IN {
            let p = Profile::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.name, name);
        }
        assert!(Profile::load(DEFAULT).is_ok());
    }

    #[test]
    fn the_h100_profile_is_the_h200_fit_with_memory_terms_scaled_by_bandwidth() {
        let h200 = Profile::load("h200-llama8b").unwrap().cost;
        let h100 = Profile::load("h100-llama8b").unwrap().cost;
        let ratio = 4.8 / 3.35;
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs();
        assert!(near(h100.beta0_ms, h200.beta0_ms * ratio), "{h100:?}");
        assert!(near(h100.beta3_us, h200.beta3_us * ratio), "{h100:?}");
        assert_eq!(
            (h100.beta1_us, h100.beta2_us, h100.beta4_us),
            (h200.beta1_us, h200.beta2_us, h200.beta4_us)
        );
        let fa3 = Profile::load("h200-llama8b-fa3").unwrap().cost;
        assert!(near(fa3.beta4_us, h200.beta4_us * 0.6), "{fa3:?}");
    }

    #[test]
    fn the_h200_profile_charges_a_long_prefix_as_measured() {
        // Measured: a 1,024-token chunk alone 28.5 ms, over 32,768 cached 80.5 ms.
        let c = Profile::load("h200-llama8b").unwrap().cost;
        let ms = |cached: u64| {
            let mut l = StepLoad::default();
            l.add(cached, 1024, false);
            c.step_ns(l) as f64 / 1e6
        };
        assert!((ms(0) / 28.5 - 1.0).abs() < 0.1, "{}", ms(0));
        assert!((ms(32_768) / 80.5 - 1.0).abs() < 0.1, "{}", ms(32_768));
        assert!(ms(32_768) > 2.5 * ms(0));
    }

    #[test]
    fn bad_profiles_are_refused_with_the_field_named() {
        let good = BUILT_IN[0].1;
        let missing = good
            .lines()
            .filter(|l| !l.starts_with("beta4_us"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(Profile::parse(&missing).unwrap_err().contains("beta4_us"));
        let negative = good.replace("beta1_us = ", "beta1_us = -");
        assert!(Profile::parse(&negative).unwrap_err().contains("beta1_us"));
        let nan = good.replace("beta3_us = ", "beta3_us = nan #");
        assert!(Profile::parse(&nan).unwrap_err().contains("beta3_us"));
        let unknown = format!("{good}\nbeta5_us = 1\n");
        assert!(Profile::parse(&unknown).unwrap_err().contains("beta5_us"));
        let e = Profile::load("a100-llama70b").unwrap_err();
        assert!(
            e.contains("h200-llama8b") && e.contains("a100-llama70b"),
            "{e}"
        );
    }
}

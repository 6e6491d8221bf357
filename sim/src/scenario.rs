//! Scenario files: one TOML file per story (`sim/scenarios/*.toml`, built
//! into the binary), or any file given by path.

use std::path::Path;

use serde::Deserialize;

use crate::engine::{EngineConfig, StepCost};
use crate::policy::{Policy, PolicyEntry};
use crate::simulation::{CapacityProbe, Deployment, HostFinish, HostPrompt, HostReport};
use crate::workload::{secs_to_ns, WorkloadConfig};

/// The built-in scenarios, in the order `--scenario all` runs them.
pub const BUILT_IN: [(&str, &str); 20] = [
    ("thrash", include_str!("../scenarios/thrash.toml")),
    ("no-pressure", include_str!("../scenarios/no-pressure.toml")),
    ("retry-storm", include_str!("../scenarios/retry-storm.toml")),
    ("long-tools", include_str!("../scenarios/long-tools.toml")),
    (
        "multi-replica",
        include_str!("../scenarios/multi-replica.toml"),
    ),
    ("waves", include_str!("../scenarios/waves.toml")),
    ("waves-async", include_str!("../scenarios/waves-async.toml")),
    ("mixed", include_str!("../scenarios/mixed.toml")),
    ("staggered", include_str!("../scenarios/staggered.toml")),
    ("poisson", include_str!("../scenarios/poisson.toml")),
    ("h200", include_str!("../scenarios/h200.toml")),
    ("real-engine", include_str!("../scenarios/real-engine.toml")),
    ("mid-tools", include_str!("../scenarios/mid-tools.toml")),
    (
        "heavy-tail-tools",
        include_str!("../scenarios/heavy-tail-tools.toml"),
    ),
    ("small-kv", include_str!("../scenarios/small-kv.toml")),
    (
        "decode-heavy",
        include_str!("../scenarios/decode-heavy.toml"),
    ),
    ("compacting", include_str!("../scenarios/compacting.toml")),
    ("elide", include_str!("../scenarios/elide.toml")),
    ("reasoning", include_str!("../scenarios/reasoning.toml")),
    ("single-turn", include_str!("../scenarios/single-turn.toml")),
];

/// The scenario run when none is named.
pub const DEFAULT: &str = "thrash";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    description: String,
    seed: u64,
    #[serde(default = "one")]
    replicas: usize,
    #[serde(default = "default_rtt")]
    probe_rtt_ms: f64,
    #[serde(default = "default_limit")]
    time_limit_s: f64,
    /// What the engine tells the capacity probe: `full`, `no-rate`, `usage-only`.
    #[serde(default)]
    capacity_probe: CapacityProbe,
    /// What the host tells the gate of each prompt: `tokens` or `length`.
    #[serde(default)]
    host_prompt: HostPrompt,
    /// Whether the host tells the gate when a session ends: `told` or `untold`.
    #[serde(default)]
    host_finish: HostFinish,
    /// What the host tells the gate of each turn: `cached` or `output-only`.
    #[serde(default)]
    host_report: HostReport,
    #[serde(default)]
    engine: EngineFile,
    workload: WorkloadConfig,
    policies: Vec<PolicyEntry>,
}

/// The `[engine]` table; every field defaults to [`EngineConfig::default`].
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct EngineFile {
    num_gpu_blocks: usize,
    block_size: usize,
    max_num_batched_tokens: usize,
    max_num_seqs: usize,
    long_prefill_token_threshold: usize,
    beta0_ms: f64,
    beta1_us: f64,
    beta2_us: f64,
    beta3_us: f64,
}

impl Default for EngineFile {
    fn default() -> Self {
        let d = EngineConfig::default();
        Self {
            num_gpu_blocks: d.num_gpu_blocks,
            block_size: d.block_size,
            max_num_batched_tokens: d.max_num_batched_tokens,
            max_num_seqs: d.max_num_seqs,
            long_prefill_token_threshold: d.long_prefill_token_threshold,
            beta0_ms: d.cost.beta0_ms,
            beta1_us: d.cost.beta1_us,
            beta2_us: d.cost.beta2_us,
            beta3_us: d.cost.beta3_us,
        }
    }
}

impl From<EngineFile> for EngineConfig {
    fn from(f: EngineFile) -> Self {
        Self {
            num_gpu_blocks: f.num_gpu_blocks,
            block_size: f.block_size,
            max_num_batched_tokens: f.max_num_batched_tokens,
            max_num_seqs: f.max_num_seqs,
            long_prefill_token_threshold: f.long_prefill_token_threshold,
            cost: StepCost {
                beta0_ms: f.beta0_ms,
                beta1_us: f.beta1_us,
                beta2_us: f.beta2_us,
                beta3_us: f.beta3_us,
            },
        }
    }
}

fn one() -> usize {
    1
}
fn default_rtt() -> f64 {
    1.0
}
fn default_limit() -> f64 {
    6.0 * 3600.0
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name (output directory).
    pub name: String,
    /// What story it tells.
    pub description: String,
    /// Workload seed.
    pub seed: u64,
    /// Engines and probe latency.
    pub deployment: Deployment,
    /// The rollout.
    pub workload: WorkloadConfig,
    /// Policies compared.
    pub policies: Vec<Policy>,
}

impl Scenario {
    /// Parses and validates scenario TOML.
    pub fn parse(text: &str) -> Result<Self, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let engine = EngineConfig::from(f.engine);
        engine.validate()?;
        f.workload.validate()?;
        if f.replicas == 0 {
            return Err("replicas must be > 0".into());
        }
        if !(f.probe_rtt_ms >= 0.0 && f.probe_rtt_ms.is_finite()) {
            return Err("probe_rtt_ms must be >= 0".into());
        }
        if !(f.time_limit_s > 0.0 && f.time_limit_s.is_finite()) {
            return Err("time_limit_s must be > 0".into());
        }
        let policies = f
            .policies
            .into_iter()
            .map(PolicyEntry::into_policy)
            .collect::<Result<Vec<_>, _>>()?;
        if policies.is_empty() {
            return Err("a scenario compares at least one policy".into());
        }
        for (i, p) in policies.iter().enumerate() {
            if policies[..i].iter().any(|q| q.name == p.name) {
                return Err(format!("policy name `{}` used twice", p.name));
            }
        }
        Ok(Self {
            name: f.name,
            description: f.description,
            seed: f.seed,
            deployment: Deployment {
                engine,
                replicas: f.replicas,
                probe_rtt_ns: secs_to_ns(f.probe_rtt_ms / 1e3),
                time_limit_ns: secs_to_ns(f.time_limit_s),
                capacity_probe: f.capacity_probe,
                host_prompt: f.host_prompt,
                host_finish: f.host_finish,
                host_report: f.host_report,
            },
            workload: f.workload,
            policies,
        })
    }

    /// A built-in scenario by name, or a scenario file by path.
    pub fn load(name_or_path: &str) -> Result<Self, String> {
        if let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::parse(text).map_err(|e| format!("built-in scenario {name_or_path}: {e}"));
        }
        let path = Path::new(name_or_path);
        if path.exists() {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            return Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()));
        }
        let names: Vec<_> = BUILT_IN.iter().map(|(n, _)| *n).collect();
        Err(format!(
            "no scenario `{name_or_path}`: give a file path or one of {}",
            names.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_scenario_parses_and_fits_its_cache() {
        for (name, text) in BUILT_IN {
            let s = Scenario::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.name, name);
            assert!(
                s.policies.iter().any(|p| p.name == "none"),
                "{name} compares against none"
            );
            let w = crate::workload::Workload::generate(
                &s.workload,
                s.deployment.engine.block_size,
                s.seed,
            );
            assert!(
                w.max_request_tokens() < s.deployment.engine.capacity_tokens(),
                "{name}"
            );
        }
    }

    #[test]
    fn the_real_engine_fitted_files_parse_with_their_fitted_costs() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../integrations/vllm/bench");
        for (file, beta1_us) in [
            ("real-engine-fitted.toml", 322.0),
            ("real-engine-fitted-fast.toml", 71.2),
        ] {
            let path = dir.join(file);
            let s = Scenario::load(path.to_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.name, file.trim_end_matches(".toml"));
            assert_eq!(s.deployment.engine.capacity_tokens(), 399 * 32);
            assert_eq!(s.deployment.engine.cost.beta1_us, beta1_us, "{file}");
        }
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused() {
        let base = BUILT_IN[0].1;
        assert!(Scenario::parse(&format!("{base}\nbogus = 1\n")).is_err());
        let typo = base.replace("beta0_ms", "beta_0_ms");
        assert!(Scenario::parse(&typo).unwrap_err().contains("beta_0_ms"));
        // Omitted engine fields take the H100 defaults.
        let minimal = base.replace("beta0_ms = 5.75\n", "");
        assert_eq!(
            Scenario::parse(&minimal).unwrap().deployment.engine,
            EngineConfig::default()
        );
        let dup = format!("{base}\n[[policies]]\nkind = \"none\"\n");
        assert!(Scenario::parse(&dup).unwrap_err().contains("twice"));
        assert!(Scenario::load("no-such-scenario").is_err());
    }
}

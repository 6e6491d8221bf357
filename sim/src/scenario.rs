//! Scenario files: one TOML file per story (`sim/scenarios/*.toml`, built
//! into the binary), or any file given by path.

use std::path::Path;

use serde::Deserialize;

use crate::cluster::Cluster;
use crate::engine::{profile, Cotenant, EngineConfig, Noise, Profile, StepCost, TierConfig};
use crate::policy::{Policy, PolicyEntry};
use crate::simulation::{CapacityProbe, Deployment, HostFinish, HostPrompt, HostReport, Routing};
use crate::workload::{secs_to_ns, WorkloadConfig};

/// The built-in scenarios, in the order `--scenario all` runs them.
pub const BUILT_IN: [(&str, &str); 26] = [
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
    // Long coding-agent histories (100-200k tokens), after the others so
    // that their rows add to the judge's record and move none of it.
    ("swe-agent", include_str!("../scenarios/swe-agent.toml")),
    ("claude-code", include_str!("../scenarios/claude-code.toml")),
    ("swe-long", include_str!("../scenarios/swe-long.toml")),
    ("grpo", include_str!("../scenarios/grpo.toml")),
    // Several RL steps of long histories, and large GRPO groups with long
    // tasks: last, so that the rows before them stay as they were.
    ("swe-steps", include_str!("../scenarios/swe-steps.toml")),
    ("grpo-16", include_str!("../scenarios/grpo-16.toml")),
];

/// The long-history scenarios among [`BUILT_IN`]: coding agents whose
/// histories reach 100-200k tokens (`swe-steps`: three RL steps of them).
pub const LONG_HISTORY: [&str; 4] = ["swe-agent", "claude-code", "swe-long", "swe-steps"];

/// Scenarios whose engines offload KV to a host tier (`--scenario
/// tiered`): kept apart from [`BUILT_IN`], whose figures are the judge's
/// record for engines without one.
pub const TIERED: [(&str, &str); 3] = [
    ("h200-tier", include_str!("../scenarios/h200-tier.toml")),
    (
        "h200-tier-outgrown",
        include_str!("../scenarios/h200-tier-outgrown.toml"),
    ),
    (
        "mid-tools-tier",
        include_str!("../scenarios/mid-tools-tier.toml"),
    ),
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
    /// How the router places sessions: `sticky`, `hash`, `least-loaded`,
    /// `room`, `room-replace` or `sticky-replace`.
    #[serde(default)]
    routing: Routing,
    /// Whether replica 0 differs: `uniform`, `replica-kv-half`, `replica-slow`.
    #[serde(default)]
    cluster: Cluster,
    #[serde(default)]
    engine: EngineFile,
    workload: WorkloadConfig,
    policies: Vec<PolicyEntry>,
}

/// The `[engine]` table: the replica's shape (each field defaults to
/// [`EngineConfig::default`]'s) and its step costs, either a named
/// `profile` or every coefficient set by hand (`beta4_us` may be left out:
/// the four-term model of files written before it).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct EngineFile {
    num_gpu_blocks: usize,
    block_size: usize,
    max_num_batched_tokens: usize,
    max_num_seqs: usize,
    long_prefill_token_threshold: usize,
    profile: Option<String>,
    beta0_ms: Option<f64>,
    beta1_us: Option<f64>,
    beta2_us: Option<f64>,
    beta3_us: Option<f64>,
    beta4_us: Option<f64>,
    /// Tokens of KV the host tier holds (0: no tier).
    host_tier_tokens: usize,
    /// Host-to-GPU copy bandwidth, GB/s (pinned memory on an H200: 55.5).
    reload_gb_per_s: f64,
    /// KV bytes per token of the model (Llama-3.1-8B, bf16: 131,072).
    kv_bytes_per_token: f64,
    /// A noisy engine: each step's cost times a log-uniform factor in
    /// `[lo, hi]` (e.g. `[0.5, 2.0]`).
    jitter: Option<(f64, f64)>,
    /// A noisy engine: a co-tenant slowing steps for a window
    /// (`{ start_s, end_s, slowdown = 2.0 }`).
    cotenant: Option<Cotenant>,
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
            profile: None,
            beta0_ms: None,
            beta1_us: None,
            beta2_us: None,
            beta3_us: None,
            beta4_us: None,
            host_tier_tokens: 0,
            reload_gb_per_s: DEFAULT_RELOAD_GB_PER_S,
            kv_bytes_per_token: DEFAULT_KV_BYTES_PER_TOKEN,
            jitter: None,
            cotenant: None,
        }
    }
}

impl EngineFile {
    /// The engine, with its step costs from the profile or the coefficients.
    fn into_config(self) -> Result<(EngineConfig, String), String> {
        let hand = [
            ("beta0_ms", self.beta0_ms),
            ("beta1_us", self.beta1_us),
            ("beta2_us", self.beta2_us),
            ("beta3_us", self.beta3_us),
            ("beta4_us", self.beta4_us),
        ];
        let (cost, source) = match &self.profile {
            Some(name) => {
                if let Some((field, _)) = hand.iter().find(|(_, v)| v.is_some()) {
                    return Err(format!(
                        "[engine] names profile `{name}` and sets `{field}`: name a profile or set the coefficients, not both"
                    ));
                }
                (Profile::load(name)?.cost, format!("profile {name}"))
            }
            None => {
                let need = |i: usize| {
                    hand[i].1.ok_or(format!(
                        "[engine] has no `{}`: name a profile (one of {}) or set beta0_ms, beta1_us, beta2_us and beta3_us (beta4_us defaults to 0)",
                        hand[i].0,
                        profile::names().join(", ")
                    ))
                };
                let cost = StepCost {
                    beta0_ms: need(0)?,
                    beta1_us: need(1)?,
                    beta2_us: need(2)?,
                    beta3_us: need(3)?,
                    beta4_us: self.beta4_us.unwrap_or(0.0),
                };
                (cost, "coefficients set by hand".to_string())
            }
        };
        Ok((
            EngineConfig {
                num_gpu_blocks: self.num_gpu_blocks,
                block_size: self.block_size,
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
                long_prefill_token_threshold: self.long_prefill_token_threshold,
                cost,
                tier: (self.host_tier_tokens > 0).then(|| {
                    TierConfig::from_bandwidth(
                        self.host_tier_tokens,
                        self.block_size,
                        self.reload_gb_per_s,
                        self.kv_bytes_per_token,
                    )
                }),
                noise: Noise {
                    jitter: self.jitter,
                    cotenant: self.cotenant,
                },
            },
            source,
        ))
    }
}

/// Host-to-device copy rate of pinned memory measured on an H200, GB/s.
pub const DEFAULT_RELOAD_GB_PER_S: f64 = 55.5;
/// KV bytes per token of Llama-3.1-8B in bf16 (2 · 32 layers · 8 KV heads · 128 · 2 B).
pub const DEFAULT_KV_BYTES_PER_TOKEN: f64 = 131_072.0;

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
    /// Where the step costs come from: `profile NAME` or coefficients set by hand.
    pub cost_source: String,
}

impl Scenario {
    /// Parses and validates scenario TOML.
    pub fn parse(text: &str) -> Result<Self, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let (engine, cost_source) = f.engine.into_config()?;
        engine.validate()?;
        f.workload.validate()?;
        if f.replicas == 0 {
            return Err("replicas must be > 0".into());
        }
        if f.cluster != Cluster::Uniform && f.replicas < 2 {
            return Err(format!(
                "cluster {:?} makes one replica of several odd: replicas must be >= 2",
                f.cluster
            ));
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
                routing: f.routing,
                cluster: f.cluster,
            },
            workload: f.workload,
            policies,
            cost_source,
        })
    }

    /// Runs the scenario on a noisy engine (`--noise`) instead of its own.
    pub fn with_noise(mut self, noise: Noise) -> Self {
        self.deployment.engine.noise = noise;
        self
    }

    /// Runs the scenario on `profile`'s step costs instead of its own.
    pub fn with_profile(mut self, profile: &Profile) -> Self {
        self.deployment.engine.cost = profile.cost;
        self.cost_source = format!("profile {} (--profile)", profile.name);
        self
    }

    /// A built-in scenario by name, or a scenario file by path.
    pub fn load(name_or_path: &str) -> Result<Self, String> {
        if let Some((_, text)) = BUILT_IN
            .iter()
            .chain(TIERED.iter())
            .find(|(n, _)| *n == name_or_path)
        {
            return Self::parse(text).map_err(|e| format!("built-in scenario {name_or_path}: {e}"));
        }
        let path = Path::new(name_or_path);
        if path.exists() {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            return Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()));
        }
        let names: Vec<_> = BUILT_IN
            .iter()
            .chain(TIERED.iter())
            .map(|(n, _)| *n)
            .collect();
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
    fn long_history_scenarios_have_the_published_shape() {
        // Coding agents (SWE-bench, Claude Code): 8-16k-token system
        // prompts, 20-120 turns, histories of 100-200k tokens by the end,
        // and together several times the KV cache.
        for name in LONG_HISTORY {
            let s = Scenario::load(name).unwrap();
            let w = &s.workload;
            assert!((8192..=16384).contains(&w.system_prompt_tokens), "{name}");
            assert!(w.turns.min >= 20 && w.turns.max <= 120, "{name}");
            let kv = s.deployment.engine.capacity_tokens();
            for seed in 1..=5 {
                let g =
                    crate::workload::Workload::generate(w, s.deployment.engine.block_size, seed);
                let mut last: Vec<usize> =
                    g.sessions.iter().map(|x| x.max_request_tokens()).collect();
                last.sort_unstable();
                let median = last[last.len() / 2];
                let total: usize = last.iter().sum();
                eprintln!(
                    "{name} seed {seed}: final histories {}..{} (median {median}), {:.2}x the KV cache",
                    last[0],
                    last[last.len() - 1],
                    total as f64 / kv as f64
                );
                assert!(
                    (100_000..=200_000).contains(&median),
                    "{name} {seed}: {median}"
                );
                assert!(total >= 3 * kv, "{name} {seed}");
                assert!(last[last.len() - 1] < kv, "{name} {seed}");
            }
        }
    }

    #[test]
    fn multi_step_and_large_group_scenarios_have_their_shape() {
        // swe-steps: three successive RL steps of 12, each starting as the
        // last ends.
        let s = Scenario::load("swe-steps").unwrap();
        let w = crate::workload::Workload::generate(&s.workload, 16, 1);
        assert_eq!(w.sessions.len(), 36);
        assert_eq!(w.wave_sessions(), Some(12));
        assert_eq!(
            w.sessions[12].start,
            crate::workload::Start::AfterFinishes { wave: 0, count: 12 }
        );
        // grpo-16: 8 tasks x 16 samples on the H200 profile, 4-10k-token
        // tasks, 20-50 turns, final histories ~8x the cache.
        let g = Scenario::load("grpo-16").unwrap();
        assert!(
            g.cost_source.starts_with("profile h200-llama8b"),
            "{}",
            g.cost_source
        );
        assert_eq!((g.workload.sessions, g.workload.group_size), (128, 16));
        assert_eq!((g.workload.turns.min, g.workload.turns.max), (20, 50));
        let kv = g.deployment.engine.capacity_tokens();
        for seed in 1..=5 {
            let w = crate::workload::Workload::generate(&g.workload, 16, seed);
            assert_eq!(w.sessions.iter().map(|x| x.group).max(), Some(7));
            // A group's first prompts: the 2k system prompt and its task.
            let task = w.sessions[0].turns[0].prompt_len - g.workload.system_prompt_tokens;
            assert!((4000..=10000).contains(&task), "{seed}: {task}");
            let total: usize = w.sessions.iter().map(|x| x.max_request_tokens()).sum();
            let ratio = total as f64 / kv as f64;
            assert!((7.5..8.5).contains(&ratio), "{seed}: {ratio:.2}x");
        }
    }

    #[test]
    fn every_built_in_scenario_names_its_profile() {
        for (name, text) in BUILT_IN {
            let s = Scenario::parse(text).unwrap();
            assert!(
                s.cost_source.starts_with("profile "),
                "{name}: {}",
                s.cost_source
            );
        }
        let h200 = Scenario::load("h200").unwrap();
        assert_eq!(
            h200.deployment.engine.cost,
            Profile::load("h200-llama8b").unwrap().cost
        );
    }

    #[test]
    fn files_that_set_four_coefficients_by_hand_keep_working() {
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
            assert_eq!(s.deployment.engine.cost.beta4_us, 0.0, "{file}");
            assert_eq!(s.cost_source, "coefficients set by hand");
        }
    }

    fn by_hand(base: &str) -> String {
        base.replace(
            "profile = \"h100-llama8b\"\n",
            "beta0_ms = 5.75\nbeta1_us = 17.25\nbeta2_us = 6.0\nbeta3_us = 0.04\n",
        )
    }

    #[test]
    fn tiered_scenarios_have_a_tier_and_the_others_none() {
        for (name, text) in TIERED {
            let s = Scenario::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.name, name);
            let e = s.deployment.engine;
            let tier = e.tier.unwrap_or_else(|| panic!("{name} has no tier"));
            assert!(e.tier_tokens() >= 2 * e.capacity_tokens(), "{name}");
            // 55.5 GB/s at 128 KiB a token.
            assert!(
                (tier.reload_tokens_per_sec - 423_431.0).abs() < 1.0,
                "{name}"
            );
        }
        for (name, text) in BUILT_IN {
            assert!(
                Scenario::parse(text)
                    .unwrap()
                    .deployment
                    .engine
                    .tier
                    .is_none(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_tier_smaller_than_the_cache_or_without_bandwidth_is_refused() {
        let base = TIERED[0].1;
        let small = base.replace("host_tier_tokens = 2550000", "host_tier_tokens = 800000");
        assert!(Scenario::parse(&small)
            .unwrap_err()
            .contains("smaller than the GPU cache"));
        let stalled = base.replace("reload_gb_per_s = 55.5", "reload_gb_per_s = 0");
        assert!(Scenario::parse(&stalled)
            .unwrap_err()
            .contains("reload rate"));
        let free = base.replace("kv_bytes_per_token = 131072", "kv_bytes_per_token = 0");
        assert!(Scenario::parse(&free).unwrap_err().contains("reload rate"));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused() {
        let base = BUILT_IN[0].1;
        assert!(base.contains("profile = \"h100-llama8b\""));
        assert!(Scenario::parse(&format!("{base}\nbogus = 1\n")).is_err());
        let hand = by_hand(base);
        assert_eq!(
            Scenario::parse(&hand)
                .unwrap()
                .deployment
                .engine
                .cost
                .beta4_us,
            0.0
        );
        let typo = hand.replace("beta0_ms", "beta_0_ms");
        assert!(Scenario::parse(&typo).unwrap_err().contains("beta_0_ms"));
        let missing = hand.replace("beta3_us = 0.04\n", "");
        let e = Scenario::parse(&missing).unwrap_err();
        assert!(e.contains("beta3_us") && e.contains("h200-llama8b"), "{e}");
        let negative = hand.replace("beta1_us = 17.25", "beta1_us = -17.25");
        assert!(Scenario::parse(&negative).unwrap_err().contains("beta1_us"));
        let infinite = hand.replace("beta2_us = 6.0", "beta2_us = inf");
        assert!(Scenario::parse(&infinite).unwrap_err().contains("beta2_us"));
        let both = base.replace(
            "profile = \"h100-llama8b\"\n",
            "profile = \"h100-llama8b\"\nbeta4_us = 0.001\n",
        );
        let e = Scenario::parse(&both).unwrap_err();
        assert!(e.contains("not both") && e.contains("beta4_us"), "{e}");
        let unknown = base.replace("h100-llama8b", "b200-llama8b");
        let e = Scenario::parse(&unknown).unwrap_err();
        assert!(
            e.contains("b200-llama8b") && e.contains("h100-llama8b"),
            "{e}"
        );
        let dup = format!("{base}\n[[policies]]\nkind = \"none\"\n");
        assert!(Scenario::parse(&dup).unwrap_err().contains("twice"));
        assert!(Scenario::load("no-such-scenario").is_err());
    }

    #[test]
    fn a_bad_file_is_named_in_its_error() {
        let dir = std::env::temp_dir().join(format!("kvgate-sim-scenario-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broken.toml");
        let text = BUILT_IN[0].1.replace("h100-llama8b", "nope");
        std::fs::write(&path, text).unwrap();
        let e = Scenario::load(path.to_str().unwrap()).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("broken.toml") && e.contains("nope"), "{e}");
    }
}

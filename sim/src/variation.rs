//! Variations of a scenario, to judge the policies on workloads none of
//! them was written on (`--vary`).
//!
//! The gate's rules were each measured on the scenarios in this repository,
//! so those scenarios flatter them. A variation changes one thing of a
//! scenario, by a factor large enough to move the balance the rules strike
//! (cache against concurrency, holding against re-prefilling, waiting
//! against rotating): the engine's cache, the tool calls' duration, the
//! tokens each turn generates, the number of sessions. Everything else
//! (the engine's costs, the arrivals' shape, every other distribution)
//! stays the scenario's. They found the rotation budget
//! (`src/core/working_set/rotation_budget.rs`): with half the cache, the fitted
//! real-engine workload ran 1.07x the best cap, one seed 1.14x, where the
//! scenario itself ran 0.95x.
//!
//! Two more change one replica of a multi-replica deployment, not the
//! workload ([`crate::cluster`]): `replica-kv-half`, `replica-slow` and
//! `replica-lost`.
//! They are not in `all`: a one-replica scenario has no odd one.

use crate::cluster::Cluster;
use crate::scenario::Scenario;
use crate::simulation::longest_request_fits;
use crate::workload::{LogNormalSpec, TokenDist, Uniform, Workload};

/// One change to a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variation {
    /// Half the KV blocks of every replica.
    HalfCache,
    /// Twice the KV blocks.
    DoubleCache,
    /// Tool calls five times as long (median and clamps).
    SlowTools,
    /// Tool calls a fifth as long.
    FastTools,
    /// Four times the tokens generated per turn.
    LongOutputs,
    /// Twice the sessions of every class, arriving as the scenario says
    /// (so staggered and Poisson arrivals last twice as long, and waves
    /// are twice as many).
    TwiceTheSessions,
    /// Replica 0 with half the KV blocks (several replicas only).
    ReplicaKvHalf,
    /// Replica 0's steps twice as costly (several replicas only).
    ReplicaSlow,
    /// Replica 0 lost a third of the way through (several replicas only).
    ReplicaLost,
}

impl Variation {
    /// The variations of one replica, by name only (not in `all`).
    pub const CLUSTER: [Variation; 3] = [
        Variation::ReplicaKvHalf,
        Variation::ReplicaSlow,
        Variation::ReplicaLost,
    ];

    /// Every variation, in the order `--vary all` runs them.
    pub const ALL: [Variation; 6] = [
        Variation::HalfCache,
        Variation::DoubleCache,
        Variation::SlowTools,
        Variation::FastTools,
        Variation::LongOutputs,
        Variation::TwiceTheSessions,
    ];

    /// Its name on the command line and in a varied scenario's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::HalfCache => "kv-half",
            Self::DoubleCache => "kv-double",
            Self::SlowTools => "tools-x5",
            Self::FastTools => "tools-x0.2",
            Self::LongOutputs => "out-x4",
            Self::TwiceTheSessions => "sessions-x2",
            Self::ReplicaKvHalf => "replica-kv-half",
            Self::ReplicaSlow => "replica-slow",
            Self::ReplicaLost => "replica-lost",
        }
    }

    /// Parses a comma-separated list of names, or `all`.
    pub fn parse_list(list: &str) -> Result<Vec<Self>, String> {
        if list.trim() == "all" {
            return Ok(Self::ALL.to_vec());
        }
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|name| {
                Self::ALL
                    .into_iter()
                    .chain(Self::CLUSTER)
                    .find(|v| v.name() == name)
                    .ok_or_else(|| {
                        let names: Vec<_> = Self::ALL
                            .iter()
                            .chain(&Self::CLUSTER)
                            .map(|v| v.name())
                            .collect();
                        format!("--vary: unknown `{name}` (all, {})", names.join(", "))
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(|v| {
                if v.is_empty() {
                    Err("--vary needs at least one variation".into())
                } else {
                    Ok(v)
                }
            })
    }

    /// The scenario with this change, named `<name>~<variation>`, checked
    /// as a scenario file is.
    pub fn apply(self, scenario: &Scenario) -> Result<Scenario, String> {
        let mut s = scenario.clone();
        s.name = format!("{}~{}", scenario.name, self.name());
        s.description = format!("{} ({})", scenario.description, self.describe());
        let w = &mut s.workload;
        match self {
            Self::HalfCache | Self::DoubleCache => {
                let blocks = &mut s.deployment.engine.num_gpu_blocks;
                *blocks = if self == Self::HalfCache {
                    (*blocks / 2).max(2)
                } else {
                    *blocks * 2
                };
            }
            Self::SlowTools | Self::FastTools => {
                let f = if self == Self::SlowTools { 5.0 } else { 0.2 };
                scale_lognormal(&mut w.tool_latency_s, f);
                for c in &mut w.classes {
                    scale_lognormal(&mut c.tool_latency_s, f);
                }
            }
            Self::LongOutputs => {
                scale_tokens(&mut w.output_tokens, 4);
                for c in &mut w.classes {
                    scale_tokens(&mut c.output_tokens, 4);
                }
            }
            Self::TwiceTheSessions => {
                w.sessions *= 2;
                for c in &mut w.classes {
                    c.sessions *= 2;
                }
            }
            Self::ReplicaKvHalf | Self::ReplicaSlow | Self::ReplicaLost => {
                if s.deployment.replicas < 2 {
                    return Err(format!("{}: one replica, none to make the odd one", s.name));
                }
                s.deployment.cluster = match self {
                    Self::ReplicaKvHalf => Cluster::ReplicaKvHalf,
                    Self::ReplicaSlow => Cluster::ReplicaSlow,
                    _ => Cluster::ReplicaLost,
                };
            }
        }
        s.deployment.engine.validate()?;
        s.workload.validate()?;
        Ok(s)
    }

    fn describe(self) -> &'static str {
        match self {
            Self::HalfCache => "half the KV cache",
            Self::DoubleCache => "twice the KV cache",
            Self::SlowTools => "tool calls 5x as long",
            Self::FastTools => "tool calls 0.2x as long",
            Self::LongOutputs => "4x the output tokens",
            Self::TwiceTheSessions => "twice the sessions",
            Self::ReplicaKvHalf => "replica 0 with half the KV cache",
            Self::ReplicaSlow => "replica 0 with twice the step cost",
            Self::ReplicaLost => "replica 0 lost after a third of the turns",
        }
    }
}

/// `scenario` under each of `variations`, less those whose longest request
/// would not fit one replica's cache for one of `seeds` (half the cache,
/// longer outputs: vLLM would reject that workload), which are named with
/// why in the second list.
pub fn vary(
    scenario: &Scenario,
    variations: &[Variation],
    seeds: &[u64],
) -> Result<(Vec<Scenario>, Vec<String>), String> {
    let mut varied = Vec::new();
    let mut skipped = Vec::new();
    'next: for v in variations {
        if Variation::CLUSTER.contains(v) && scenario.deployment.replicas < 2 {
            skipped.push(format!(
                "{}~{}: one replica, none to make the odd one",
                scenario.name,
                v.name()
            ));
            continue;
        }
        let s = v.apply(scenario)?;
        for &seed in seeds {
            let workload = Workload::generate(&s.workload, s.deployment.engine.block_size, seed);
            if let Err(e) = longest_request_fits(&s.deployment, &workload) {
                skipped.push(format!("{}: seed {seed}: {e}", s.name));
                continue 'next;
            }
        }
        varied.push(s);
    }
    Ok((varied, skipped))
}

fn scale_lognormal(d: &mut LogNormalSpec, f: f64) {
    d.median *= f;
    d.min *= f;
    d.max *= f;
}

fn scale_tokens(d: &mut TokenDist, f: usize) {
    match d {
        TokenDist::LogNormal(l) => scale_lognormal(l, f as f64),
        TokenDist::Uniform(Uniform { min, max }) => {
            *min *= f;
            *max *= f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thrash() -> Scenario {
        Scenario::load("thrash").unwrap()
    }

    #[test]
    fn each_variation_changes_its_one_figure() {
        let base = thrash();
        let blocks = base.deployment.engine.num_gpu_blocks;
        let half = Variation::HalfCache.apply(&base).unwrap();
        assert_eq!(half.name, "thrash~kv-half");
        assert_eq!(half.deployment.engine.num_gpu_blocks, blocks / 2);
        assert_eq!(half.workload, base.workload);
        let double = Variation::DoubleCache.apply(&base).unwrap();
        assert_eq!(double.deployment.engine.num_gpu_blocks, blocks * 2);

        let slow = Variation::SlowTools.apply(&base).unwrap();
        let (a, b) = (base.workload.tool_latency_s, slow.workload.tool_latency_s);
        assert_eq!(
            (b.median, b.sigma, b.min, b.max),
            (a.median * 5.0, a.sigma, a.min * 5.0, a.max * 5.0)
        );
        assert_eq!(slow.deployment.engine, base.deployment.engine);
        let fast = Variation::FastTools.apply(&base).unwrap();
        assert_eq!(
            fast.workload.tool_latency_s.median,
            a.median * 0.2,
            "a fifth"
        );

        let long = Variation::LongOutputs.apply(&base).unwrap();
        let (TokenDist::LogNormal(a), TokenDist::LogNormal(b)) =
            (base.workload.output_tokens, long.workload.output_tokens)
        else {
            panic!("thrash's outputs are lognormal");
        };
        assert_eq!((b.median, b.max), (a.median * 4.0, a.max * 4.0));
        assert_eq!(
            long.workload.tool_result_tokens,
            base.workload.tool_result_tokens
        );

        let twice = Variation::TwiceTheSessions.apply(&base).unwrap();
        assert_eq!(twice.workload.sessions, base.workload.sessions * 2);
        assert_eq!(twice.workload.turns, base.workload.turns);
    }

    #[test]
    fn classes_vary_with_the_first() {
        let base = Scenario::load("mixed").unwrap();
        assert!(!base.workload.classes.is_empty(), "mixed has classes");
        let twice = Variation::TwiceTheSessions.apply(&base).unwrap();
        assert_eq!(
            twice.workload.total_sessions(),
            2 * base.workload.total_sessions()
        );
        let slow = Variation::SlowTools.apply(&base).unwrap();
        for (a, b) in base.workload.classes.iter().zip(&slow.workload.classes) {
            assert_eq!(b.tool_latency_s.median, a.tool_latency_s.median * 5.0);
        }
    }

    #[test]
    fn lists_parse_by_name_or_all() {
        assert_eq!(
            Variation::parse_list("all").unwrap(),
            Variation::ALL.to_vec()
        );
        assert_eq!(
            Variation::parse_list("kv-half, out-x4").unwrap(),
            vec![Variation::HalfCache, Variation::LongOutputs]
        );
        assert!(Variation::parse_list("kv-triple").is_err());
        assert!(Variation::parse_list(" , ").is_err());
        for v in Variation::ALL {
            assert_eq!(Variation::parse_list(v.name()).unwrap(), vec![v]);
        }
    }

    #[test]
    fn a_variation_whose_requests_outgrow_the_cache_is_skipped() {
        // small-kv's longest requests take more than half its cache.
        let base = Scenario::load("small-kv").unwrap();
        let (varied, skipped) = vary(
            &base,
            &[Variation::HalfCache, Variation::DoubleCache],
            &[1, 2],
        )
        .unwrap();
        let names: Vec<_> = varied.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["small-kv~kv-double"]);
        assert_eq!(skipped.len(), 1);
        assert!(
            skipped[0].starts_with("small-kv~kv-half: seed 1: the longest request"),
            "{skipped:?}"
        );
        let (varied, skipped) = vary(&thrash(), &Variation::ALL, &[1]).unwrap();
        assert_eq!(varied.len(), Variation::ALL.len());
        assert!(skipped.is_empty());
    }

    #[test]
    fn cluster_variations_change_one_replica_of_several() {
        let base = Scenario::load("multi-replica").unwrap();
        let half = Variation::ReplicaKvHalf.apply(&base).unwrap();
        assert_eq!(half.name, "multi-replica~replica-kv-half");
        assert_eq!(half.deployment.cluster, Cluster::ReplicaKvHalf);
        assert_eq!(half.deployment.engine, base.deployment.engine);
        assert_eq!(half.workload, base.workload);
        let slow = Variation::ReplicaSlow.apply(&base).unwrap();
        assert_eq!(slow.deployment.cluster, Cluster::ReplicaSlow);
        assert_eq!(
            Variation::parse_list("replica-slow,kv-half").unwrap(),
            vec![Variation::ReplicaSlow, Variation::HalfCache]
        );
        assert!(!Variation::ALL.contains(&Variation::ReplicaSlow));
        // One replica: skipped, with why.
        let (varied, skipped) = vary(&thrash(), &[Variation::ReplicaKvHalf], &[1]).unwrap();
        assert!(varied.is_empty());
        assert!(skipped[0].contains("one replica"), "{skipped:?}");
    }

    #[test]
    fn a_cache_too_small_to_halve_stays_valid() {
        let mut base = thrash();
        base.deployment.engine.num_gpu_blocks = 3;
        let half = Variation::HalfCache.apply(&base).unwrap();
        assert_eq!(half.deployment.engine.num_gpu_blocks, 2);
    }
}

//! Admission policies compared side by side. Every policy but `kvgate` is
//! implemented here; `kvgate` is the library's real sans-IO core, driven by
//! [`gate::GateDriver`].
//!
//! - `none`: every turn goes straight to the engine.
//! - `kvgate`: the seed's admission table (`kvgate::core`), probing the
//!   session's replica.
//! - `cap-K`: at most K sessions in flight per replica, from a session's
//!   first turn to its last (what a user would try first).
//! - `ttl-pin`: Continuum-style: the engine pins a session's blocks for a
//!   TTL after each turn (see `engine::pins`); no admission control.
//! - `thunderagent`: ThunderAgent's program scheduler ([`thunderagent`]).
//! - `progress-ttl`: vllm-router's Progress-TTL scheduler ([`progress_ttl`]).
//! - `prime-rl`: prime-rl's adaptive concurrency as merged on its main
//!   ([`prime_rl`]): a cap on episodes in flight, moved by the engines'
//!   metrics (AIMD).
//! - `prime-rl-cg`: prime-rl's cost-model controller ([`prime_rl_cg`],
//!   commit 014aa9d): the cap is `κ · C / G`, the engines' KV over the
//!   learned final size of an episode.
//! - `seed-defaults`: the seed's design (`kvgate` in reference mode) at
//!   the defaults its origin project ships: watermark 0.85, hit threshold
//!   0.80, idle grace 60 s, poll 5 s, pinned here whatever the library's
//!   defaults become.
//!
//! The peers are what a user would deploy instead of kvgate; they are
//! implemented from their published rules with their published defaults.

pub mod gate;
pub mod prime_rl;
pub mod prime_rl_cg;
pub mod program;
pub mod progress_ttl;
pub mod router;
pub mod thunderagent;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::workload::secs_to_ns;

/// What a policy does.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyKind {
    /// No gate.
    None,
    /// The kvgate core with this configuration, probing `probe`.
    Kvgate {
        /// The gate's knobs.
        config: kvgate::Config,
        /// Which replica answers a session's probes.
        probe: ProbeTarget,
    },
    /// At most this many sessions in flight per replica.
    Cap(usize),
    /// Engine-side pins for this long after each turn, ns.
    TtlPin {
        /// Pin lifetime, ns.
        ttl_ns: u64,
    },
    /// ThunderAgent's program scheduler.
    ThunderAgent(thunderagent::ThunderAgentConfig),
    /// vllm-router's Progress-TTL program scheduler.
    ProgressTtl(progress_ttl::ProgressTtlConfig),
    /// prime-rl's adaptive cap on episodes in flight (main's AIMD).
    PrimeRl(prime_rl::PrimeRlConfig),
    /// prime-rl's cost-model cap, `κ · C / G`.
    PrimeRlCg(prime_rl_cg::PrimeRlCgConfig),
}

/// Which replica the gate's probes ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeTarget {
    /// The replica the session is routed to (what the gate needs).
    SessionReplica,
    /// Always the first replica: what a stock vLLM DP client does with a
    /// broadcast UTILITY call (it returns engine 0's answer).
    FirstReplica,
}

/// A named policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Label in tables, files and plots.
    pub name: String,
    /// Its behaviour.
    pub kind: PolicyKind,
}

impl Policy {
    /// One line describing the policy's parameters.
    pub fn describe(&self) -> String {
        match &self.kind {
            PolicyKind::None => "no admission control".into(),
            PolicyKind::Kvgate { config: c, probe } => {
                let target = match probe {
                    ProbeTarget::SessionReplica => "",
                    ProbeTarget::FirstReplica => "; probes always answered by replica 0",
                };
                match c.admission {
                    kvgate::AdmissionMode::Reference => format!(
                        "kvgate core, the seed's table: watermark {}, hit threshold {}, idle grace {} s, poll {} s{target}",
                        c.high_watermark,
                        c.hit_threshold,
                        c.idle_grace.as_secs_f64(),
                        c.wait_poll.as_secs_f64(),
                    ),
                    _ => format!(
                        "kvgate core, working-set admission (one gate per replica), poll {} s{target}",
                        c.wait_poll.as_secs_f64(),
                    ),
                }
            }
            PolicyKind::Cap(k) => format!("at most {k} sessions in flight per replica"),
            PolicyKind::TtlPin { ttl_ns } => format!(
                "engine pins a session's blocks for {} s after each turn",
                *ttl_ns as f64 / 1e9
            ),
            PolicyKind::ThunderAgent(c) => format!(
                "ThunderAgent: token ledger vs KV capacity, checked every {} s; pause acting programs smallest first; +{} tokens per program; forced resume after {} s",
                c.interval_ns as f64 / 1e9,
                c.buffer_tokens,
                c.force_resume_ns as f64 / 1e9
            ),
            PolicyKind::ProgressTtl(c) => format!(
                "vllm-router Progress-TTL: hold while the rank lacks logical room or vLLM has a waiting queue; reservation kept for a fitted TTL <= {} s ({} gap samples first); timeout {} s",
                c.max_acting_ttl_ns as f64 / 1e9,
                c.stats_window,
                c.queue_timeout_ns as f64 / 1e9
            ),
            PolicyKind::PrimeRl(c) => format!(
                "prime-rl adaptive concurrency: episodes in flight capped, starting at KV capacity / max_model_len ({} tokens, at most one engine's KV); x1.25 per turnover while clear, cut to 0.8 on preemptions, trimmed above 0.8 KV usage; metrics every {} s",
                c.max_model_len,
                c.poll_ns as f64 / 1e9
            ),
            PolicyKind::PrimeRlCg(c) => format!(
                "prime-rl cost-model concurrency (014aa9d): episodes in flight capped at kappa x KV capacity / EWMA of final episode tokens (bootstrap seq_len {}), floor the group size; kappa 1 after the warm-up step, x1.02 per clear binding step, x0.75 cut on preemptions (x0.5 until a clear step); step = {} rollouts; metrics every {} s",
                c.seq_len,
                c.batch
                    .map_or("the scenario's wave, else 128".to_string(), |b| b.to_string()),
                c.poll_ns as f64 / 1e9
            ),
        }
    }

    /// Parses the compact form used on the command line:
    /// `none`, `kvgate`, `kvgate:wm=0.3,hit=0.6,grace=5,poll=0.5`, `cap-8`,
    /// `ttl-pin`, `ttl-pin:ttl=3`, `prime-rl`, `prime-rl:max_len=32768`,
    /// `prime-rl-cg`, `prime-rl-cg:seq_len=65536,batch=64`, `seed-defaults`. The name is the text itself.
    pub fn parse(spec: &str) -> Result<Self, String> {
        if spec == SEED_DEFAULTS {
            return PolicyEntry {
                name: Some(spec.to_string()),
                kind: "kvgate".into(),
                high_watermark: Some(0.85),
                hit_threshold: Some(0.80),
                idle_grace_s: Some(60.0),
                wait_poll_s: Some(5.0),
                knobs: BTreeMap::from([("mode".to_string(), "reference".to_string())]),
                ..PolicyEntry::default()
            }
            .into_policy();
        }
        let (head, args) = match spec.split_once(':') {
            Some((h, a)) => (h, a),
            None => (spec, ""),
        };
        let mut entry = PolicyEntry {
            name: Some(spec.to_string()),
            ..PolicyEntry::default()
        };
        let kv: Vec<(&str, &str)> = args
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.split_once('=')
                    .ok_or(format!("`{s}` in `{spec}`: expected key=value"))
            })
            .collect::<Result<_, _>>()?;
        let num = |v: &str| -> Result<f64, String> {
            v.parse::<f64>()
                .map_err(|_| format!("`{v}` in `{spec}` is not a number"))
        };
        if let Some(k) = head.strip_prefix("cap-") {
            entry.kind = "cap".into();
            entry.sessions = Some(
                k.parse()
                    .map_err(|_| format!("`{spec}`: cap-K needs an integer K"))?,
            );
        } else {
            entry.kind = head.to_string();
        }
        for (k, v) in kv {
            match k {
                "wm" | "high_watermark" => entry.high_watermark = Some(num(v)?),
                "hit" | "hit_threshold" => entry.hit_threshold = Some(num(v)?),
                "grace" | "idle_grace_s" => entry.idle_grace_s = Some(num(v)?),
                "poll" | "wait_poll_s" => entry.wait_poll_s = Some(num(v)?),
                "ttl" | "ttl_s" => entry.ttl_s = Some(num(v)?),
                "sessions" => entry.sessions = Some(num(v)? as usize),
                "max_len" | "max_model_len" => entry.max_model_len = Some(num(v)? as usize),
                "seq_len" => entry.seq_len = Some(num(v)? as usize),
                "batch" => entry.batch = Some(num(v)? as usize),
                "probe" => entry.probe = Some(v.to_string()),
                // Any other kvgate key passes through to `kvgate_knob`.
                other if entry.kind == "kvgate" => {
                    entry.knobs.insert(other.to_string(), v.to_string());
                }
                other => return Err(format!("unknown parameter `{other}` in `{spec}`")),
            }
        }
        entry.into_policy()
    }
}

/// The seed's design at its origin's defaults, as a policy spec.
pub const SEED_DEFAULTS: &str = "seed-defaults";

/// A `[[policies]]` table of a scenario file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyEntry {
    /// Label; defaults to the kind (and K for caps).
    pub name: Option<String>,
    /// `none`, `kvgate`, `cap`, `ttl-pin`, `thunderagent`, `progress-ttl`,
    /// `prime-rl` or `prime-rl-cg`.
    pub kind: String,
    /// kvgate: high watermark.
    pub high_watermark: Option<f64>,
    /// kvgate: hit threshold.
    pub hit_threshold: Option<f64>,
    /// kvgate: idle grace, seconds.
    pub idle_grace_s: Option<f64>,
    /// kvgate: wait poll, seconds.
    pub wait_poll_s: Option<f64>,
    /// cap: sessions in flight per replica.
    pub sessions: Option<usize>,
    /// ttl-pin: pin lifetime, seconds.
    pub ttl_s: Option<f64>,
    /// kvgate: `session-replica` (default) or `first-replica`.
    pub probe: Option<String>,
    /// prime-rl: the engines' `max_model_len`, tokens.
    pub max_model_len: Option<usize>,
    /// prime-rl-cg: the bootstrap cost (`seq_len`), tokens.
    pub seq_len: Option<usize>,
    /// prime-rl-cg: rollouts per step.
    pub batch: Option<usize>,
    /// kvgate: further knobs by name (`knobs = { mode = "..." }` in a
    /// scenario file; any other `key=value` in a `kvgate:` spec), applied
    /// by [`kvgate_knob`].
    #[serde(default)]
    pub knobs: BTreeMap<String, String>,
}

/// Sets one more kvgate knob, given by name, on `config`. The place to add
/// a knob the library grows (e.g. the admission `mode`): one arm here and it
/// works in `--policies kvgate:mode=...` and in scenario files.
pub fn kvgate_knob(config: &mut kvgate::Config, key: &str, value: &str) -> Result<(), String> {
    match key {
        "mode" | "admission" => {
            config.admission = kvgate::AdmissionMode::parse(value).map_err(|e| e.to_string())?;
            Ok(())
        }
        _ => Err(format!(
            "unknown kvgate knob `{key}={value}` (known: wm, hit, grace, poll, probe, mode; add others in policy::kvgate_knob)"
        )),
    }
}

impl PolicyEntry {
    /// Checks the parameters against the kind and builds the policy.
    pub fn into_policy(self) -> Result<Policy, String> {
        let gate_knobs = self.high_watermark.is_some()
            || self.hit_threshold.is_some()
            || self.idle_grace_s.is_some()
            || self.wait_poll_s.is_some()
            || self.probe.is_some()
            || !self.knobs.is_empty();
        let stray = |what: &str| {
            Err(format!(
                "policy `{}`: {what} does not apply to kind `{}`",
                self.label(),
                self.kind
            ))
        };
        if self.max_model_len.is_some() && self.kind != "prime-rl" {
            return stray("max_model_len");
        }
        if (self.seq_len.is_some() || self.batch.is_some()) && self.kind != "prime-rl-cg" {
            return stray("seq_len/batch");
        }
        let kind = match self.kind.as_str() {
            "none" => {
                if gate_knobs || self.sessions.is_some() || self.ttl_s.is_some() {
                    return stray("a parameter");
                }
                PolicyKind::None
            }
            "kvgate" => {
                if self.sessions.is_some() || self.ttl_s.is_some() {
                    return stray("sessions/ttl_s");
                }
                let d = kvgate::Config::default();
                let dur = |field: &'static str,
                           s: Option<f64>,
                           def: Duration|
                 -> Result<Duration, String> {
                    match s {
                        None => Ok(def),
                        Some(v) => kvgate::Config::duration_from_secs(field, v)
                            .map_err(|e| format!("policy `{}`: {e}", self.label())),
                    }
                };
                let mut config = kvgate::Config {
                    high_watermark: self.high_watermark.unwrap_or(d.high_watermark),
                    hit_threshold: self.hit_threshold.unwrap_or(d.hit_threshold),
                    idle_grace: dur("idle_grace", self.idle_grace_s, d.idle_grace)?,
                    wait_poll: dur("wait_poll", self.wait_poll_s, d.wait_poll)?,
                    ..d
                };
                for (key, value) in &self.knobs {
                    kvgate_knob(&mut config, key, value)
                        .map_err(|e| format!("policy `{}`: {e}", self.label()))?;
                }
                config
                    .validate()
                    .map_err(|e| format!("policy `{}`: {e}", self.label()))?;
                let probe = match self.probe.as_deref() {
                    None | Some("session-replica") | Some("session") => ProbeTarget::SessionReplica,
                    Some("first-replica") | Some("first") => ProbeTarget::FirstReplica,
                    Some(other) => {
                        return Err(format!(
                            "policy `{}`: probe `{other}` is not session-replica or first-replica",
                            self.label()
                        ))
                    }
                };
                PolicyKind::Kvgate { config, probe }
            }
            "cap" => {
                if gate_knobs || self.ttl_s.is_some() {
                    return stray("a gate knob/ttl_s");
                }
                match self.sessions {
                    Some(k) if k > 0 => PolicyKind::Cap(k),
                    _ => return Err(format!("policy `{}`: cap needs sessions > 0", self.label())),
                }
            }
            "ttl-pin" => {
                if gate_knobs || self.sessions.is_some() {
                    return stray("a gate knob/sessions");
                }
                let ttl = self.ttl_s.unwrap_or(2.0);
                if !(ttl > 0.0 && ttl.is_finite()) {
                    return Err(format!("policy `{}`: ttl_s must be > 0", self.label()));
                }
                PolicyKind::TtlPin {
                    ttl_ns: secs_to_ns(ttl),
                }
            }
            "prime-rl" => {
                if gate_knobs || self.sessions.is_some() || self.ttl_s.is_some() {
                    return stray("a gate knob/sessions/ttl_s");
                }
                let d = prime_rl::PrimeRlConfig::default();
                let max_model_len = self.max_model_len.unwrap_or(d.max_model_len);
                if max_model_len == 0 {
                    return Err(format!("policy `{}`: max_model_len must be > 0", self.label()));
                }
                PolicyKind::PrimeRl(prime_rl::PrimeRlConfig { max_model_len, ..d })
            }
            "prime-rl-cg" => {
                if gate_knobs || self.sessions.is_some() || self.ttl_s.is_some() {
                    return stray("a gate knob/sessions/ttl_s");
                }
                let d = prime_rl_cg::PrimeRlCgConfig::default();
                let seq_len = self.seq_len.unwrap_or(d.seq_len);
                if seq_len == 0 || self.batch == Some(0) {
                    return Err(format!(
                        "policy `{}`: seq_len and batch must be > 0",
                        self.label()
                    ));
                }
                PolicyKind::PrimeRlCg(prime_rl_cg::PrimeRlCgConfig {
                    seq_len,
                    batch: self.batch,
                    ..d
                })
            }
            "thunderagent" | "progress-ttl" => {
                if gate_knobs || self.sessions.is_some() || self.ttl_s.is_some() {
                    return stray("a parameter");
                }
                if self.kind == "thunderagent" {
                    PolicyKind::ThunderAgent(thunderagent::ThunderAgentConfig::default())
                } else {
                    PolicyKind::ProgressTtl(progress_ttl::ProgressTtlConfig::default())
                }
            }
            other => {
                return Err(format!(
                    "unknown policy kind `{other}` (none, kvgate, cap, ttl-pin, thunderagent, progress-ttl, prime-rl, prime-rl-cg)"
                ))
            }
        };
        Ok(Policy {
            name: self.label(),
            kind,
        })
    }

    fn label(&self) -> String {
        match (&self.name, self.kind.as_str(), self.sessions) {
            (Some(n), _, _) => n.clone(),
            (None, "cap", Some(k)) => format!("cap-{k}"),
            (None, kind, _) => kind.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_specs_parse() {
        assert_eq!(Policy::parse("none").unwrap().kind, PolicyKind::None);
        assert_eq!(Policy::parse("cap-8").unwrap().kind, PolicyKind::Cap(8));
        assert!(matches!(
            Policy::parse("thunderagent").unwrap().kind,
            PolicyKind::ThunderAgent(_)
        ));
        assert!(matches!(
            Policy::parse("progress-ttl").unwrap().kind,
            PolicyKind::ProgressTtl(_)
        ));
        assert_eq!(
            Policy::parse("ttl-pin:ttl=3").unwrap().kind,
            PolicyKind::TtlPin {
                ttl_ns: 3_000_000_000
            }
        );
        let PolicyKind::Kvgate { config: c, .. } =
            Policy::parse("kvgate:wm=0.3,hit=0.6,grace=5,poll=0.5")
                .unwrap()
                .kind
        else {
            panic!()
        };
        assert_eq!((c.high_watermark, c.hit_threshold), (0.3, 0.6));
        assert_eq!(
            (c.idle_grace, c.wait_poll),
            (Duration::from_secs(5), Duration::from_millis(500))
        );
        let PolicyKind::Kvgate { config: d, probe } = Policy::parse("kvgate").unwrap().kind else {
            panic!()
        };
        assert_eq!(d, kvgate::Config::default());
        assert_eq!(probe, ProbeTarget::SessionReplica);
        let PolicyKind::Kvgate { probe, .. } = Policy::parse("kvgate:probe=first").unwrap().kind
        else {
            panic!()
        };
        assert_eq!(probe, ProbeTarget::FirstReplica);
        let PolicyKind::PrimeRl(p) = Policy::parse("prime-rl").unwrap().kind else {
            panic!()
        };
        assert_eq!(p, prime_rl::PrimeRlConfig::default());
        assert_eq!(p.max_model_len, 131_072);
        let PolicyKind::PrimeRl(p) = Policy::parse("prime-rl:max_len=8192").unwrap().kind else {
            panic!()
        };
        assert_eq!(p.max_model_len, 8192);
        let PolicyKind::PrimeRlCg(p) = Policy::parse("prime-rl-cg").unwrap().kind else {
            panic!()
        };
        assert_eq!(p, prime_rl_cg::PrimeRlCgConfig::default());
        assert_eq!((p.seq_len, p.batch, p.max_inflight), (131_072, None, None));
        let PolicyKind::PrimeRlCg(p) = Policy::parse("prime-rl-cg:seq_len=65536,batch=64")
            .unwrap()
            .kind
        else {
            panic!()
        };
        assert_eq!((p.seq_len, p.batch), (65_536, Some(64)));
        // The seed's design at its origin's defaults, pinned by name.
        let seed = Policy::parse("seed-defaults").unwrap();
        assert_eq!(seed.name, "seed-defaults");
        let PolicyKind::Kvgate { config: c, .. } = seed.kind else {
            panic!()
        };
        assert_eq!(c.admission, kvgate::AdmissionMode::Reference);
        assert_eq!((c.high_watermark, c.hit_threshold), (0.85, 0.80));
        assert_eq!(
            (c.idle_grace, c.wait_poll),
            (Duration::from_secs(60), Duration::from_secs(5))
        );
    }

    #[test]
    fn bad_specs_are_refused() {
        for bad in [
            "cap-x",
            "cap-0",
            "kvgate:wm=2",
            "kvgate:poll=0",
            "none:ttl=1",
            "cap-3:wm=0.5",
            "fifo",
            "kvgate:wm",
            "kvgate:no_such_knob=1",
            "thunderagent:ttl=1",
            "prime-rl:max_len=0",
            "prime-rl:wm=0.5",
            "prime-rl:seq_len=4096",
            "prime-rl-cg:seq_len=0",
            "prime-rl-cg:batch=0",
            "prime-rl-cg:max_len=4096",
            "kvgate:max_len=100",
        ] {
            assert!(Policy::parse(bad).is_err(), "{bad}");
        }
    }
}

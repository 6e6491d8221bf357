//! Command-line options (a small hand parser: four flags do not need clap).

use std::path::PathBuf;

use crate::engine::Noise;
use crate::policy::Policy;
use crate::scenario::Scenario;
use crate::simulation::{CapacityProbe, HostFinish, HostPrompt, HostReport, Routing};
use crate::variation::Variation;

/// Parsed options.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Built-in scenario name, file path, or `all`.
    pub scenario: String,
    /// Overrides the scenario's seed.
    pub seed: Option<u64>,
    /// Output root; results go to `<out>/<scenario>/`.
    pub out: Option<PathBuf>,
    /// Policies to run: names from the scenario or compact specs.
    pub policies: Option<Vec<String>>,
    /// Sweep kvgate knobs instead of comparing the scenario's policies.
    pub sweep: bool,
    /// Judge policies over scenarios × seeds against cap-best and the bound.
    pub judge: bool,
    /// Seeds for `--judge`.
    pub seeds: Option<Vec<u64>>,
    /// Fit step-time coefficients from measured steps (CSV or JSON).
    pub fit_steps: Option<PathBuf>,
    /// Runs every scenario on this engine profile's step costs.
    pub profile: Option<String>,
    /// The comparison runs every policy the scenario names and prints every column.
    pub full: bool,
    /// Overrides what every scenario's engine tells the capacity probe.
    pub capacity_probe: Option<CapacityProbe>,
    /// Overrides what every scenario's host tells the gate of a prompt.
    pub host_prompt: Option<HostPrompt>,
    pub host_finish: Option<HostFinish>,
    /// Overrides what every scenario's host tells the gate of a turn's outcome.
    pub host_report: Option<HostReport>,
    /// Overrides how every scenario's router places sessions.
    pub routing: Option<Routing>,
    /// Runs each scenario under these variations instead of as written.
    pub vary: Option<Vec<Variation>>,
    /// Runs every scenario on a noisy engine.
    pub noise: Option<Noise>,
}

/// What `--judge` runs when `--policies` is not given (cap-best is always added).
pub const JUDGE_POLICIES: &str =
    "none,kvgate,kvgate:mode=reference,thunderagent,progress-ttl,prime-rl,prime-rl-cg,seed-defaults";

/// What `--judge` judges when `--scenario` is not given: every built-in
/// scenario without a host tier.
pub const JUDGE_SCENARIOS: &str = "all";

/// Usage text.
pub const USAGE: &str = "\
kvgate-sim: a vLLM replica's prefix cache under an agentic RL rollout, with and without kvgate

USAGE:
    kvgate-sim [--scenario NAME|PATH|all|tiered] [--seed N] [--out DIR] [--policies LIST] [--full] [--sweep]
    kvgate-sim --judge [--scenario NAME|PATH|all|tiered] [--seeds 1-5] [--policies LIST] [--out DIR]
    (either form also takes --profile NAME|PATH,
     --capacity-probe full|no-cost|no-rate|usage-only|no-tier,
     --host-prompt tokens|length, --host-finish told|untold,
     --host-report cached|output-only, --routing sticky|hash|least-loaded|room|room-replace|sticky-replace|sticky-resume|sticky-refuse,
     --noise SPEC and --vary LIST)
    kvgate-sim --fit-steps STEPS.csv|STEPS.json

OPTIONS:
    --scenario S   built-in scenario (thrash, no-pressure, retry-storm, long-tools,
                   multi-replica, ...: see sim/scenarios/), a scenario TOML file,
                   `all` (every engine without a host tier), or `tiered` (the
                   engines that offload KV to host memory: h200-tier,
                   h200-tier-outgrown, mid-tools-tier) [default: thrash; with
                   --judge, all]
    --seed N       workload seed [default: the scenario's]
    --out DIR      output root; files go to DIR/<scenario>/ [default: target/kvgate-sim]
    --policies L   comma-separated policies: names from the scenario, or specs such as
                   none, kvgate, kvgate:wm=0.3,hit=0.5,grace=10,poll=0.5, cap-8, ttl-pin:ttl=2,
                   thunderagent, progress-ttl, prime-rl (prime-rl's adaptive concurrency as
                   merged, AIMD; prime-rl:max_len=N sets the engines' max_model_len,
                   default 131072), prime-rl-cg (prime-rl's cost-model controller at
                   014aa9d, kappa x KV capacity / learned final episode tokens;
                   prime-rl-cg:seq_len=N sets its bootstrap cost, default 131072,
                   batch=N the rollouts per step, default the scenario's RL wave, else 128),
                   seed-defaults (kvgate:mode=reference at the seed's origin defaults: wm
                   0.85, hit 0.80, grace 60 s, poll 5 s), and cap-best (the hindsight-best
                   fixed cap, found by sweeping K)
                   [default: none, kvgate, the peers (thunderagent, progress-ttl) and
                   cap-best; with --full, the scenario's own policies too]
    --full         every policy the scenario names and every column of the comparison
    --sweep        run a grid of kvgate knobs (watermark, hit threshold, idle grace,
                   poll) on the scenario and rank them, instead of the comparison
    --judge        run every policy (compact specs) on every scenario and seed and judge it
                   against that seed's hindsight-best cap and the makespan lower bound;
                   writes DIR/judge.{csv,json,md} [default scenarios: all; default
                   policies: none, kvgate, kvgate:mode=reference, thunderagent,
                   progress-ttl, prime-rl, prime-rl-cg, seed-defaults]
    --seeds L      seeds for --judge: 1-5, 1,2,7 or a mix [default: 1-5]
    --capacity-probe P
                   what the engines tell the gate's capacity probe: full (KV tokens, block
                   size, the median prefill rate of recent steps, the rebuild cost of
                   the step-cost model), no-cost (full without the rebuild cost: the
                   gate learns it from turns), no-rate (KV tokens and block size only),
                   usage-only (nothing: the gate has the usage gauge),
                   no-tier (full, but nothing of a host tier the engine offloads to)
                   [default: the scenario's, full]
    --host-prompt H
                   what the hosts tell the gate of each prompt: tokens (its ids, which the
                   gate sketches to see how far it begins like the session's last) or
                   length (an event-loop host that passes only its length)
                   [default: the scenario's, tokens]
    --host-finish F
                   whether the hosts tell the gate when a session ends: told (after its
                   last turn) or untold (a proxy that sees only requests: the gate forgets
                   a session after its idle retention) [default: the scenario's, told]
    --host-report R
                   what the hosts tell the gate when a turn ends: cached (its cached
                   prompt tokens and its output tokens) or output-only (a proxy whose
                   engine does not return cached tokens) [default: the scenario's, cached]
    --routing R    how the router in front of the replicas places sessions: sticky (a
                   session's first turn to the replica with the fewest sessions, and it
                   stays), hash (a hash of the session id: session affinity), or
                   least-loaded (every turn anew: sessions migrate), or room (a
                   session's first turn to the replica whose gate reports the most free
                   working-set tokens, kvgate_working_set_free_tokens, and it stays; a
                   replica whose gate cannot tell counts as full; policies without a
                   working set tell none: least-loaded, as sticky), or room-replace
                   (room, an empty replica whose gate cannot tell yet counting as the
                   roomiest; a later turn its gate would make wait, as a host in refusal
                   mode answers 429, moves to the replica whose gate tells the most room
                   for its whole prompt, prefilled anew there), or sticky-replace (a
                   session's first turn to the fewest sessions among the replicas whose
                   gate tells room for it, later turns as room-replace), or
                   sticky-resume (first turns as sticky-replace; a waiting turn whose
                   gate counts its cache gone, a new, parked or ghost session, moves to
                   the fewest sessions among the replicas with room for it, and stays;
                   members never move), or sticky-refuse (the host in front of replicas
                   in refusal mode: as sticky-resume, asked once per attempt after its
                   first pass; a released turn no other replica takes comes back to its
                   replica after the gate's Retry-After); each replica has its own gate
                   [default: the scenario's, sticky]
    --noise N      run every scenario on a noisy engine: jitter=LO-HI (each step's cost
                   times a log-uniform factor in [LO, HI], drawn per step from the seed),
                   cotenant=START-END (steps begun from START to END s of simulated time
                   cost slowdown=F times as much, default 2: another job takes half the
                   engine), comma-separated, e.g. jitter=0.5-2,cotenant=300-900; the gate
                   sees it only in the step times it measures [default: the scenario's
                   [engine] jitter and cotenant, quiet]
    --vary L       run each scenario varied instead of as written: kv-half, kv-double
                   (its KV blocks), tools-x5, tools-x0.2 (its tool calls' durations),
                   out-x4 (its output tokens), sessions-x2, comma-separated, or all;
                   and, by name only, replica-kv-half, replica-slow, replica-lost
                   (replica 0 of several with half the KV blocks, every step-cost term
                   doubled, or lost once a third of the turns ended: its sessions start
                   over elsewhere as new ones, the turns in flight re-sent; a
                   scenario's `cluster` says the same; progress-ttl, prime-rl and
                   prime-rl-cg do not model a loss); the varied scenario is named
                   <scenario>~<variation>
    --profile P    run every scenario on this engine profile's step costs instead of its
                   own: h200-llama8b, h200-llama8b-fa3, h100-llama8b, h100-llama8b-blis,
                   cpu-small (sim/profiles/), or a profile TOML file
    --fit-steps F  fit the step-time model to measured steps and print it as profile lines:
                   the CSV of real_engine.py --steps-csv (dur_ms, prefill_tokens,
                   decode_tokens; context_tokens fits beta3, attn_pairs beta4) or a JSON
                   with a `rows` array (sim/profiles/data/)
    -h, --help     this text";

/// Parses `args` (without the program name). `Err` carries the message to
/// print; `Ok(None)` means help was asked for.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        scenario: crate::scenario::DEFAULT.to_string(),
        seed: None,
        out: None,
        policies: None,
        sweep: false,
        judge: false,
        seeds: None,
        fit_steps: None,
        profile: None,
        full: false,
        capacity_probe: None,
        host_prompt: None,
        host_finish: None,
        host_report: None,
        routing: None,
        vary: None,
        noise: None,
    };
    let mut scenario = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--scenario" => scenario = Some(value("--scenario")?),
            "--seed" => {
                let v = value("--seed")?;
                o.seed = Some(
                    v.parse()
                        .map_err(|_| format!("--seed: `{v}` is not an integer"))?,
                );
            }
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            "--policies" => o.policies = Some(split_policies(&value("--policies")?)),
            "--sweep" => o.sweep = true,
            "--full" => o.full = true,
            "--judge" => o.judge = true,
            "--fit-steps" => o.fit_steps = Some(PathBuf::from(value("--fit-steps")?)),
            "--profile" => o.profile = Some(value("--profile")?),
            "--seeds" => o.seeds = Some(crate::judge::parse_seeds(&value("--seeds")?)?),
            "--capacity-probe" => {
                o.capacity_probe = Some(CapacityProbe::parse(&value("--capacity-probe")?)?)
            }
            "--host-prompt" => o.host_prompt = Some(HostPrompt::parse(&value("--host-prompt")?)?),
            "--host-finish" => o.host_finish = Some(HostFinish::parse(&value("--host-finish")?)?),
            "--host-report" => o.host_report = Some(HostReport::parse(&value("--host-report")?)?),
            "--routing" => o.routing = Some(Routing::parse(&value("--routing")?)?),
            "--vary" => o.vary = Some(Variation::parse_list(&value("--vary")?)?),
            "--noise" => o.noise = Some(Noise::parse(&value("--noise")?)?),
            other => return Err(format!("unknown argument `{other}`\n\n{USAGE}")),
        }
    }
    // A comparison tells one story; a judgement is over every scenario.
    o.scenario = scenario.unwrap_or_else(|| {
        if o.judge {
            JUDGE_SCENARIOS.to_string()
        } else {
            crate::scenario::DEFAULT.to_string()
        }
    });
    Ok(Some(o))
}

/// The pseudo-policy that adds the hindsight-best fixed cap to a table.
pub const CAP_BEST: &str = "cap-best";

/// Peer policies every comparison shows beside the scenario's own.
pub const PEERS: [&str; 2] = ["thunderagent", "progress-ttl"];

/// What a comparison runs unless told: the story's policies (cap-best is added).
pub const STORY_POLICIES: [&str; 4] = ["none", "kvgate", "thunderagent", "progress-ttl"];

/// A scenario's own policies, then the peers it does not name itself.
pub fn default_policies(scenario: &Scenario) -> Vec<Policy> {
    let mut out = scenario.policies.clone();
    for peer in PEERS {
        if !out.iter().any(|p| p.name == peer) {
            out.push(Policy::parse(peer).expect("built-in peer spec"));
        }
    }
    out
}

/// A policy by its name in the scenario, else by its compact spec.
pub fn resolve(scenario: &Scenario, name: &str) -> Result<Policy, String> {
    match scenario.policies.iter().find(|p| p.name == name) {
        Some(p) => Ok(p.clone()),
        None => Policy::parse(name),
    }
}

/// Splits a policy list on commas; a segment with `=` and no `:` continues
/// the previous spec's parameters (`kvgate:wm=0.3,hit=0.5,cap-8` is two policies).
pub fn split_policies(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match out.last_mut() {
            Some(prev) if part.contains('=') && !part.contains(':') => {
                prev.push(',');
                prev.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_and_flags() {
        let o = parse(args("")).unwrap().unwrap();
        assert_eq!(
            (o.scenario.as_str(), o.seed, o.sweep),
            ("thrash", None, false)
        );
        let o = parse(args("--scenario all --seed 9 --out /tmp/x --sweep"))
            .unwrap()
            .unwrap();
        assert_eq!((o.scenario.as_str(), o.seed), ("all", Some(9)));
        assert_eq!(o.out, Some(PathBuf::from("/tmp/x")));
        assert!(o.sweep);
        let o = parse(args("--judge --seeds 1-3")).unwrap().unwrap();
        assert!(o.judge);
        assert_eq!(o.seeds, Some(vec![1, 2, 3]));
        // --judge alone judges every built-in scenario; one named, that one.
        assert_eq!(o.scenario, "all");
        let o = parse(args("--judge --scenario thrash")).unwrap().unwrap();
        assert_eq!(o.scenario, "thrash");
        let o = parse(args("--scenario=grpo --judge")).unwrap().unwrap();
        assert_eq!(o.scenario, "grpo");
        let o = parse(args("--seed=3")).unwrap().unwrap();
        assert_eq!(o.seed, Some(3));
        let o = parse(args("--noise jitter=0.5-2,cotenant=300-900"))
            .unwrap()
            .unwrap();
        let n = o.noise.unwrap();
        assert_eq!(n.jitter, Some((0.5, 2.0)));
        assert_eq!(
            n.cotenant.map(|c| (c.start_s, c.end_s, c.slowdown)),
            Some((300.0, 900.0, 2.0))
        );
        assert!(parse(args("--noise jitter=2-1")).is_err());
        assert!(parse(args("--help")).unwrap().is_none());
        assert!(parse(args("--seed x")).is_err());
        assert!(parse(args("--bogus")).is_err());
        assert!(parse(args("--out")).is_err());
        let o = parse(args("--capacity-probe usage-only")).unwrap().unwrap();
        assert_eq!(o.capacity_probe, Some(CapacityProbe::UsageOnly));
        assert_eq!(
            o.capacity_probe,
            parse(args("--capacity-probe=usage-only"))
                .unwrap()
                .unwrap()
                .capacity_probe
        );
        assert!(parse(args("--capacity-probe some")).is_err());
        let o = parse(args("--routing least-loaded")).unwrap().unwrap();
        assert_eq!(o.routing, Some(Routing::LeastLoaded));
        assert!(parse(args("--routing round-robin")).is_err());
        let o = parse(args("--routing room")).unwrap().unwrap();
        assert_eq!(o.routing, Some(Routing::Room));
        let o = parse(args("--routing room-replace")).unwrap().unwrap();
        assert_eq!(o.routing, Some(Routing::RoomReplace));
        let o = parse(args("--routing sticky-replace")).unwrap().unwrap();
        assert_eq!(o.routing, Some(Routing::StickyReplace));
        let o = parse(args("--routing sticky-resume")).unwrap().unwrap();
        assert_eq!(o.routing, Some(Routing::StickyResume));
        let o = parse(args("--routing sticky-refuse")).unwrap().unwrap();
        assert_eq!(o.routing, Some(Routing::StickyRefuse));
        let o = parse(args("--host-prompt length")).unwrap().unwrap();
        assert_eq!(o.host_prompt, Some(HostPrompt::Length));
        assert!(parse(args("--host-prompt ids")).is_err());
        let o = parse(args("--host-finish untold")).unwrap().unwrap();
        assert_eq!(o.host_finish, Some(HostFinish::Untold));
        assert!(parse(args("--host-finish never")).is_err());
        let o = parse(args("--host-report output-only")).unwrap().unwrap();
        assert_eq!(o.host_report, Some(HostReport::OutputOnly));
        assert!(parse(args("--host-report none")).is_err());
        let o = parse(args("--vary kv-half,sessions-x2")).unwrap().unwrap();
        assert_eq!(
            o.vary,
            Some(vec![Variation::HalfCache, Variation::TwiceTheSessions])
        );
        assert!(parse(args("--vary kv")).is_err());
    }

    #[test]
    fn policy_lists_keep_spec_parameters_together() {
        assert_eq!(
            split_policies("none, kvgate:wm=0.3,hit=0.5,grace=10 ,cap-8,ttl-pin:ttl=2"),
            vec![
                "none",
                "kvgate:wm=0.3,hit=0.5,grace=10",
                "cap-8",
                "ttl-pin:ttl=2"
            ]
        );
    }
}

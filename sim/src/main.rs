//! `cargo run --release -p kvgate-sim`: the default comparison (scenario
//! `thrash`, every policy), a table on stdout, files and plots under
//! `target/kvgate-sim/<scenario>/`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use kvgate_sim::cli::{self, Options, USAGE};
use kvgate_sim::engine::Profile;
use kvgate_sim::policy::Policy;
use kvgate_sim::scenario::{Scenario, BUILT_IN, TIERED};
use kvgate_sim::workload::Workload;
use kvgate_sim::{bound, compare, fit, judge, plots, report, sweep, variation};

fn main() -> ExitCode {
    let options = match cli::parse(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options) -> Result<(), String> {
    if let Some(path) = &o.fit_steps {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let fit = fit::fit_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        print!("{}", fit::report(&fit));
        return Ok(());
    }
    let names: Vec<String> = if o.scenario == "all" {
        BUILT_IN.iter().map(|(n, _)| n.to_string()).collect()
    } else if o.scenario == "tiered" {
        TIERED.iter().map(|(n, _)| n.to_string()).collect()
    } else {
        vec![o.scenario.clone()]
    };
    let scenarios = load_all(o, &names)?;
    let out_root = o.out.clone().unwrap_or_else(default_out);
    if o.judge {
        return run_judge(o, scenarios, &out_root);
    }
    for scenario in scenarios {
        let (policies, with_cap_best) = select(&scenario, o.policies.as_deref(), o.full)?;
        let seed = o.seed.unwrap_or(scenario.seed);
        if o.sweep {
            run_sweep(&scenario, seed, &policies, &out_root)?;
        } else {
            run_scenario(&scenario, seed, &policies, with_cap_best, o.full, &out_root)?;
        }
    }
    Ok(())
}

/// The scenarios named, each under every variation the command line names
/// (instead of as written), or as written.
fn load_all(o: &Options, names: &[String]) -> Result<Vec<Scenario>, String> {
    let mut scenarios = Vec::new();
    for name in names {
        let scenario = load(o, name)?;
        match &o.vary {
            Some(variations) => {
                let seeds = if o.judge {
                    judge_seeds(o)
                } else {
                    vec![o.seed.unwrap_or(scenario.seed)]
                };
                let (varied, skipped) = variation::vary(&scenario, variations, &seeds)?;
                for why in skipped {
                    println!("skipped {why}");
                }
                scenarios.extend(varied);
            }
            None => scenarios.push(scenario),
        }
    }
    Ok(scenarios)
}

/// The seeds `--judge` runs: the command line's, else 1-5.
fn judge_seeds(o: &Options) -> Vec<u64> {
    o.seeds.clone().unwrap_or_else(|| (1..=5).collect())
}

/// A scenario, with the command line's capacity probe if it names one.
fn load(o: &Options, name: &str) -> Result<Scenario, String> {
    let mut scenario = Scenario::load(name)?;
    if let Some(profile) = &o.profile {
        scenario = scenario.with_profile(&Profile::load(profile)?);
    }
    if let Some(probe) = o.capacity_probe {
        scenario.deployment.capacity_probe = probe;
    }
    if let Some(prompt) = o.host_prompt {
        scenario.deployment.host_prompt = prompt;
    }
    if let Some(finish) = o.host_finish {
        scenario.deployment.host_finish = finish;
    }
    if let Some(report) = o.host_report {
        scenario.deployment.host_report = report;
    }
    if let Some(routing) = o.routing {
        scenario.deployment.routing = routing;
    }
    if let Some(noise) = o.noise {
        scenario = scenario.with_noise(noise);
    }
    Ok(scenario)
}

fn run_judge(
    o: &Options,
    scenarios: Vec<Scenario>,
    out_root: &std::path::Path,
) -> Result<(), String> {
    let specs = match &o.policies {
        Some(list) => list.clone(),
        None => cli::split_policies(cli::JUDGE_POLICIES),
    };
    let policies = specs
        .iter()
        .filter(|s| *s != cli::CAP_BEST)
        .map(|s| Policy::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let seeds = judge_seeds(o);
    let threads = threads();
    println!(
        "== judge: {} scenario(s) x seeds {:?} x {} policies + cap-best, against each seed's best cap and the lower bound ({threads} threads)",
        scenarios.len(),
        seeds,
        policies.len()
    );
    if let Some(probe) = o.capacity_probe {
        println!("  every engine answers the capacity probe as {probe:?}");
    }
    if let Some(prompt) = o.host_prompt {
        println!("  every host tells the gate a prompt's {prompt:?}");
    }
    if let Some(finish) = o.host_finish {
        println!("  every host's session end: {finish:?} to the gate");
    }
    if let Some(report) = o.host_report {
        println!("  every host's turn report: {report:?}");
    }
    if let Some(routing) = o.routing {
        println!("  every router places sessions: {routing:?}");
    }
    if let Some(noise) = o.noise {
        println!("  every engine is noisy: {}", noise.describe());
    }
    for p in &policies {
        println!("  {:<32} {}", p.name, p.describe());
    }
    let started = Instant::now();
    let verdicts = judge::judge(&scenarios, &seeds, &policies, threads);
    for s in &scenarios {
        let rows: Vec<_> = verdicts
            .iter()
            .filter(|v| v.scenario == s.name)
            .cloned()
            .collect();
        let ks: Vec<String> = rows
            .iter()
            .find(|v| v.policy == "cap-best")
            .map(|v| {
                v.seeds
                    .iter()
                    .map(|r| format!("{}:K={}", r.seed, r.cap_best_k))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "\n-- {}: {} (cap-best per seed {})",
            s.name,
            s.description,
            ks.join(" ")
        );
        print!("{}", judge::table(&rows));
        let rivals = ["none", "thunderagent"];
        if let Some((geo, worst)) = judge::over_best_rival(&rows, "kvgate", &rivals) {
            println!(
                "kvgate over the best of no gate, ThunderAgent and the best cap, per seed: {geo:.3} (geo), worst {worst:.3}"
            );
        }
    }
    println!("\nx cap-best: makespan over the seed's hindsight-best fixed cap (geometric mean over seeds; below 1 beats it); worst: the worst seed's ratio");
    println!("hit pts: mean hit rate minus cap-best's; p99 turn: mean over seeds, client view (policy wait included); max wait: longest single wait at the policy, any seed; x bound: makespan over the lower bound");
    std::fs::create_dir_all(out_root).map_err(|e| format!("{}: {e}", out_root.display()))?;
    let write = |name: &str, text: String| {
        let path = out_root.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("judge.csv", judge::csv(&verdicts))?;
    write("judge.md", judge::markdown(&verdicts))?;
    write(
        "judge.json",
        serde_json::to_string_pretty(&verdicts).map_err(|e| e.to_string())? + "\n",
    )?;
    let shown = out_root.canonicalize().unwrap_or(out_root.to_path_buf());
    println!(
        "judged in {:.1} s; every seed's figures in {}/judge.{{csv,json,md}}",
        started.elapsed().as_secs_f64(),
        shown.display()
    );
    Ok(())
}

/// Worker threads for sweeps: every core.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `target/kvgate-sim` of the workspace this binary was built in.
fn default_out() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("kvgate-sim")
}

/// The policies to run and whether to add the hindsight-best cap: by
/// default the scenario's own policies, the peers, and `cap-best`.
fn select(
    scenario: &Scenario,
    wanted: Option<&[String]>,
    full: bool,
) -> Result<(Vec<Policy>, bool), String> {
    let Some(wanted) = wanted else {
        if full {
            return Ok((cli::default_policies(scenario), true));
        }
        let story = cli::STORY_POLICIES
            .iter()
            .map(|name| cli::resolve(scenario, name))
            .collect::<Result<_, _>>()?;
        return Ok((story, true));
    };
    let with_cap_best = wanted.iter().any(|w| w == cli::CAP_BEST);
    let policies = wanted
        .iter()
        .filter(|w| *w != cli::CAP_BEST)
        .map(|w| cli::resolve(scenario, w))
        .collect::<Result<_, _>>()?;
    Ok((policies, with_cap_best))
}

fn run_scenario(
    scenario: &Scenario,
    seed: u64,
    policies: &[Policy],
    with_cap_best: bool,
    full: bool,
    out_root: &std::path::Path,
) -> Result<(), String> {
    let d = &scenario.deployment;
    let w = Workload::generate(&scenario.workload, d.engine.block_size, seed);
    let capacity = d.engine.capacity_tokens() * d.replicas;
    let final_history: usize = w.sessions.iter().map(|s| s.max_request_tokens()).sum();
    println!("== scenario {}: {}", scenario.name, scenario.description);
    println!(
        "seed {seed} | {} replica(s) x {} KV tokens ({} blocks of {}) | budget {} tokens/step | probe rtt {} ms | capacity probe {:?}",
        d.replicas,
        d.engine.capacity_tokens(),
        d.engine.num_gpu_blocks,
        d.engine.block_size,
        d.engine.max_num_batched_tokens,
        d.probe_rtt_ns as f64 / 1e6,
        d.capacity_probe
    );
    let c = &d.engine.cost;
    println!(
        "step costs ({}): {} ms + {} us/prefill token + {} us/decode seq + {} us/context token + {} us/attention pair",
        scenario.cost_source, c.beta0_ms, c.beta1_us, c.beta2_us, c.beta3_us, c.beta4_us
    );
    if !d.engine.noise.is_quiet() {
        println!(
            "a noisy engine: {} (the limit below is the quiet engine's)",
            d.engine.noise.describe()
        );
    }
    let limit = bound::lower_bound(&d.engine, d.replicas, &w);
    println!(
        "the limit: makespan >= {:.1} s (longest critical path {:.1} s, total work at best batch throughput {:.1} s); least possible prefill {:.2} M tokens",
        limit.makespan_ns as f64 / 1e9,
        limit.critical_path_ns as f64 / 1e9,
        limit.total_work_ns as f64 / 1e9,
        limit.min_prefill_tokens as f64 / 1e6
    );
    println!(
        "{} sessions, {} turns, {:.1} M prompt tokens in all; final histories add up to {:.2} M tokens = {:.1}x the KV cache",
        w.sessions.len(),
        w.num_turns(),
        w.prompt_tokens() as f64 / 1e6,
        final_history as f64 / 1e6,
        final_history as f64 / capacity as f64
    );
    if full {
        for p in policies {
            println!("  {:<16} {}", p.name, p.describe());
        }
    }
    let started = Instant::now();
    let runs = compare(scenario, seed, policies);
    let mut rows: Vec<_> = runs.iter().map(|r| r.summary()).collect();
    let mut simulated = runs.len();
    if with_cap_best {
        let best = sweep::cap_best(scenario, seed, threads());
        if full {
            println!(
                "  {:<16} the hindsight-best fixed cap: K = {} of {} caps tried on this seed",
                "cap-best", best.k, best.tried
            );
        }
        simulated += best.tried;
        rows.push(best.summary);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!();
    if full {
        print!("{}", report::table(&rows));
        println!("{}", report::LEGEND);
    } else {
        let best_s = rows
            .iter()
            .find(|r| r.policy.starts_with("cap-best"))
            .map(|r| r.makespan_s);
        print!("{}", report::story_table(&rows, best_s));
        println!("x best cap: makespan over the hindsight-best fixed cap's; x bound: over the workload's lower bound; max wait: longest wait at the policy");
        if let Some(sentence) = report::story_sentence(&rows) {
            println!("\n{sentence}");
        }
    }
    let dir = out_root.join(&scenario.name);
    let longest = runs.iter().map(|r| r.makespan_ns).max().unwrap_or(1).max(1);
    let bucket_ns = (longest / 40).max(1_000_000);
    report::write_files(&dir, scenario, seed, &runs, &rows, bucket_ns)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    plots::write(&dir, &scenario.name, &runs, bucket_ns)?;
    let shown = dir.canonicalize().unwrap_or(dir.clone());
    println!("simulated {simulated} runs in {elapsed:.2} s");
    println!(
        "plots: {0}/hit_rate_over_time.svg, {0}/latency_by_turn.svg",
        shown.display()
    );
    println!(
        "data:  {}/summary.{{csv,md,json}}, turns.csv, hit_rate_over_time.csv, latency_by_turn.csv",
        shown.display()
    );
    if !full {
        println!("every policy the scenario names and every column: --full");
    }
    println!();
    Ok(())
}

fn run_sweep(
    scenario: &Scenario,
    seed: u64,
    baselines: &[Policy],
    out_root: &std::path::Path,
) -> Result<(), String> {
    let threads = threads();
    let grid = sweep::grid();
    println!(
        "== sweep of {} kvgate configurations on scenario {} (seed {seed}, {threads} threads)",
        grid.len(),
        scenario.name
    );
    let started = Instant::now();
    let base = sweep::run_all(scenario, seed, baselines, threads);
    let rows = sweep::run_all(scenario, seed, &grid, threads);
    println!("baselines (the scenario's policies):");
    print!("{}", report::table(&base));
    let ranked = sweep::ranked(rows);
    println!("\nbest 25 of the grid by makespan:");
    print!("{}", report::table(&ranked[..ranked.len().min(25)]));
    let dir = out_root.join(&scenario.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("sweep.csv");
    std::fs::write(&path, sweep::csv(&ranked)).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "swept in {:.1} s; every point in {}",
        started.elapsed().as_secs_f64(),
        path.canonicalize().unwrap_or(path.clone()).display()
    );
    Ok(())
}

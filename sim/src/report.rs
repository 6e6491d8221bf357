//! The printed comparison table and the CSV/JSON files.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::Serialize;

use crate::metrics::{reason_names, RunResult, Summary};
use crate::scenario::Scenario;

/// Column headers of the printed table, with what each means.
pub const LEGEND: &str = "\
hit%: prefix-cache hit rate (hit / prompt tokens at first scheduling); last1/3: same over the last third of the run
makespan: rollout step wall time; xbound: makespan over the workload's lower bound (1.00 = the limit, see the header)
tok/s: generated tokens per second; prefill: Mtokens computed; xmin: over the least prefill any policy must do; re-prefill: of those, recomputed
p50/p99: turn latency as the client saw it (wait at the policy included); max wait: longest single wait at the policy
preempt: engine preemptions; waits/wait s: turns that waited at the policy (gate sleeps or cap slots) and their total wait
retries: turns re-issued by impatient clients; att.pre: gate attempts preempted by a newer attempt of their session
probes/adm: gate probe calls per admission; late/early: mean latency of each session's last 3 turns over its first 3
idle+w: share of the makespan with no turn on any engine while some turn waited at the policy
last's wait: total wait at the policy of the session that finished last (what the policy added to the makespan's own session)
with a host tier: tier%: of hit%, the share copied back from the tier; reload: Mtokens copied back (re-prefill is then the tier's misses)";

/// The comparison table, one row per policy.
pub fn table(rows: &[Summary]) -> String {
    let header = [
        "policy",
        "hit%",
        "last1/3",
        "makespan",
        "xbound",
        "tok/s",
        "prefill",
        "xmin",
        "re-prefill",
        "preempt",
        "waits",
        "wait s",
        "max wait",
        "p50",
        "p99",
        "retries",
        "att.pre",
        "probes/adm",
        "late/early",
        "idle+w",
        "last's wait",
    ];
    let tiered = rows.iter().any(|r| r.reloaded_tokens > 0);
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    if tiered {
        cells[0].insert(3, "tier%".into());
        cells[0].insert(10, "reload".into());
    }
    for r in rows {
        let dnf = if r.finished { "" } else { " (unfinished)" };
        let mut row = vec![
            format!("{}{dnf}", r.policy),
            format!("{:.1}", r.hit_rate * 100.0),
            format!("{:.1}", r.hit_rate_last_third * 100.0),
            format!("{:.1} s", r.makespan_s),
            format!("{:.2}", r.makespan_over_bound),
            format!("{:.0}", r.gen_tok_per_s),
            format!("{:.2}", r.prefilled_tokens as f64 / 1e6),
            format!("{:.2}", prefill_over_min(r)),
            format!("{:.2}", r.re_prefilled_tokens as f64 / 1e6),
            r.engine_preemptions.to_string(),
            r.waits.to_string(),
            format!("{:.0}", r.wait_s),
            format!("{:.1} s", r.max_wait_s),
            format!("{:.2} s", r.p50_turn_latency_s),
            format!("{:.2} s", r.p99_turn_latency_s),
            r.reissues.to_string(),
            r.attempts_preempted.to_string(),
            if r.probes_per_admission > 0.0 {
                format!("{:.2}", r.probes_per_admission)
            } else {
                "-".into()
            },
            format!("{:.2}", r.late_turn_slowdown),
            format!("{:.1}%", r.idle_with_waiters * 100.0),
            format!("{:.1} s", r.last_session_wait_s),
        ];
        if tiered {
            row.insert(3, format!("{:.1}", r.tier_hit_rate * 100.0));
            row.insert(10, format!("{:.2}", r.reloaded_tokens as f64 / 1e6));
        }
        cells.push(row);
    }
    align(&cells)
}

/// The few columns that tell the story, one row per policy: makespan, over
/// the best cap's and over the lower bound, hit rate, p99 turn latency and
/// the longest wait (what `kvgate-sim` prints unless `--full`).
pub fn story_table(rows: &[Summary], cap_best_makespan_s: Option<f64>) -> String {
    let header = [
        "policy",
        "makespan",
        "x best cap",
        "x bound",
        "hit %",
        "p99 turn",
        "max wait",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let dnf = if r.finished { "" } else { " (unfinished)" };
        cells.push(vec![
            format!("{}{dnf}", r.policy),
            format!("{:.1} s", r.makespan_s),
            cap_best_makespan_s.map_or("-".into(), |b| format!("{:.2}", r.makespan_s / b)),
            format!("{:.2}", r.makespan_over_bound),
            format!("{:.1}", r.hit_rate * 100.0),
            format!("{:.1} s", r.p99_turn_latency_s),
            format!("{:.1} s", r.max_wait_s),
        ]);
    }
    align(&cells)
}

/// One sentence on what a default run shows: kvgate against no gate and
/// the best cap; `None` unless all three ran.
pub fn story_sentence(rows: &[Summary]) -> Option<String> {
    let find = |name: &str| rows.iter().find(|r| r.policy == name);
    let (none, gate) = (find("none")?, find("kvgate")?);
    let best = rows.iter().find(|r| r.policy.starts_with("cap-best"))?;
    Some(format!(
        "kvgate finished in {:.0} s: {:.2}x no gate ({:.0} s) and {:.2}x the hindsight-best fixed cap ({}, {:.0} s), keeping {:.0}% of prompt tokens cached against no gate's {:.0}%.",
        gate.makespan_s,
        gate.makespan_s / none.makespan_s,
        none.makespan_s,
        gate.makespan_s / best.makespan_s,
        best.policy.trim_start_matches("cap-best (").trim_end_matches(')'),
        best.makespan_s,
        gate.hit_rate * 100.0,
        none.hit_rate * 100.0
    ))
}

/// Pads a table of cells to aligned columns with a rule under the header.
pub(crate) fn align(cells: &[Vec<String>]) -> String {
    let columns = cells.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 {
                let _ = write!(out, "{cell}{}", " ".repeat(pad));
            } else {
                let _ = write!(out, "  {}{cell}", " ".repeat(pad));
            }
        }
        out.push('\n');
        if i == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

/// Prefill over the least any policy must do.
fn prefill_over_min(r: &Summary) -> f64 {
    r.prefilled_tokens as f64 / r.min_prefill_tokens.max(1) as f64
}

/// The same table as Markdown (for docs and reports).
pub fn markdown(rows: &[Summary]) -> String {
    let mut out = String::from(
        "| policy | hit % | hit % last ⅓ | makespan | × bound | gen tok/s | prefilled Mtok | × min prefill | re-prefilled Mtok | engine preemptions | waits | wait s | max wait | p50 turn | p99 turn | retries | attempts preempted | probes/adm | late/early | idle with waiters | last session's wait |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {}{} | {:.1} | {:.1} | {:.1} s | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {:.0} | {:.1} s | {:.2} s | {:.2} s | {} | {} | {} | {:.2} | {:.1}% | {:.1} s |",
            r.policy,
            if r.finished { "" } else { " (unfinished)" },
            r.hit_rate * 100.0,
            r.hit_rate_last_third * 100.0,
            r.makespan_s,
            r.makespan_over_bound,
            r.gen_tok_per_s,
            r.prefilled_tokens as f64 / 1e6,
            prefill_over_min(r),
            r.re_prefilled_tokens as f64 / 1e6,
            r.engine_preemptions,
            r.waits,
            r.wait_s,
            r.max_wait_s,
            r.p50_turn_latency_s,
            r.p99_turn_latency_s,
            r.reissues,
            r.attempts_preempted,
            if r.probes_per_admission > 0.0 {
                format!("{:.2}", r.probes_per_admission)
            } else {
                "-".into()
            },
            r.late_turn_slowdown,
            r.idle_with_waiters * 100.0,
            r.last_session_wait_s
        );
    }
    out
}

#[derive(Serialize)]
struct JsonRun<'a> {
    summary: &'a Summary,
    description: String,
    engine: &'a crate::engine::EngineStats,
    gate: Option<JsonGate>,
}

#[derive(Serialize)]
struct JsonGate {
    admissions_by_reason: Vec<(&'static str, u64)>,
    attempts: u64,
    waits: u64,
    wait_s: f64,
    preempted: u64,
    usage_probe_calls: u64,
    prefix_probe_calls: u64,
    grace_expired: u64,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    scenario: &'a str,
    description: &'a str,
    seed: u64,
    runs: Vec<JsonRun<'a>>,
}

/// Writes `summary.csv`, `summary.md`, `summary.json`, `turns.csv`, `hit_rate_over_time.csv`
/// and `latency_by_turn.csv` into `dir`.
pub fn write_files(
    dir: &Path,
    scenario: &Scenario,
    seed: u64,
    runs: &[RunResult],
    rows: &[Summary],
    bucket_ns: u64,
) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut csv = String::from(
        "policy,finished,hit_rate,hit_rate_last_third,makespan_s,gen_tok_per_s,prefilled_tokens,re_prefilled_tokens,engine_preemptions,waits,wait_s,attempts_preempted,reissues,probes_per_admission,mean_turn_latency_s,early_turn_latency_s,late_turn_latency_s,late_turn_slowdown,p50_turn_latency_s,p99_turn_latency_s,max_wait_s,makespan_over_bound,bound_s,min_prefill_tokens,idle_with_waiters,last_session_wait_s,tier_hit_rate,reloaded_tokens",
    );
    for name in reason_names() {
        let _ = write!(csv, ",admitted_{name}");
    }
    csv.push('\n');
    for r in rows {
        let _ = write!(
            csv,
            "{},{},{:.6},{:.6},{:.3},{:.1},{},{},{},{},{:.3},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.3},{:.4},{:.3},{},{:.4},{:.3},{:.6},{}",
            r.policy,
            r.finished,
            r.hit_rate,
            r.hit_rate_last_third,
            r.makespan_s,
            r.gen_tok_per_s,
            r.prefilled_tokens,
            r.re_prefilled_tokens,
            r.engine_preemptions,
            r.waits,
            r.wait_s,
            r.attempts_preempted,
            r.reissues,
            r.probes_per_admission,
            r.mean_turn_latency_s,
            r.early_turn_latency_s,
            r.late_turn_latency_s,
            r.late_turn_slowdown,
            r.p50_turn_latency_s,
            r.p99_turn_latency_s,
            r.max_wait_s,
            r.makespan_over_bound,
            r.bound_s,
            r.min_prefill_tokens,
            r.idle_with_waiters,
            r.last_session_wait_s,
            r.tier_hit_rate,
            r.reloaded_tokens
        );
        for n in r.admissions_by_reason {
            let _ = write!(csv, ",{n}");
        }
        csv.push('\n');
    }
    std::fs::write(dir.join("summary.csv"), csv)?;
    std::fs::write(dir.join("summary.md"), markdown(rows))?;

    let report = JsonReport {
        scenario: &scenario.name,
        description: &scenario.description,
        seed,
        runs: runs
            .iter()
            .zip(rows)
            .map(|(run, summary)| JsonRun {
                summary,
                description: run.policy.describe(),
                engine: &run.engine,
                gate: run.gate.as_ref().map(|g| JsonGate {
                    admissions_by_reason: reason_names()
                        .into_iter()
                        .zip(g.admissions_by_reason)
                        .collect(),
                    attempts: g.attempts,
                    waits: g.waits,
                    wait_s: g.wait_time.as_secs_f64(),
                    preempted: g.preempted,
                    usage_probe_calls: g.usage_probe_calls,
                    prefix_probe_calls: g.prefix_probe_calls,
                    grace_expired: g.grace_expired,
                }),
            })
            .collect(),
    };
    let json = serde_json::to_string_pretty(&report).map_err(io::Error::other)?;
    std::fs::write(dir.join("summary.json"), json + "\n")?;

    let mut turns = String::from(
        "policy,session,turn,last,arrived_s,issued_s,submitted_s,first_scheduled_s,completed_s,latency_s,prompt_len,hit_tokens,prefilled,re_prefilled,output_len,reissues,engine_preemptions\n",
    );
    for run in runs {
        for t in &run.turns {
            let _ = writeln!(
                turns,
                "{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{},{},{},{},{},{},{}",
                run.policy.name,
                t.session,
                t.turn,
                t.last,
                t.arrived_ns as f64 / 1e9,
                t.issued_ns as f64 / 1e9,
                t.submitted_ns as f64 / 1e9,
                t.first_scheduled_ns as f64 / 1e9,
                t.completed_ns as f64 / 1e9,
                t.latency_ns() as f64 / 1e9,
                t.prompt_len,
                t.hit_tokens,
                t.prefilled,
                t.re_prefilled,
                t.output_len,
                t.reissues,
                t.engine_preemptions
            );
        }
    }
    std::fs::write(dir.join("turns.csv"), turns)?;

    let mut hits = String::from("policy,time_s,hit_rate\n");
    let mut lat = String::from("policy,turn,mean_latency_s,turns\n");
    for run in runs {
        for (t, h) in run.hit_rate_over_time(bucket_ns) {
            let _ = writeln!(hits, "{},{t:.3},{h:.6}", run.policy.name);
        }
        for (k, l, n) in run.latency_by_turn() {
            let _ = writeln!(lat, "{},{k},{l:.6},{n}", run.policy.name);
        }
    }
    std::fs::write(dir.join("hit_rate_over_time.csv"), hits)?;
    std::fs::write(dir.join("latency_by_turn.csv"), lat)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use crate::scenario::Scenario;

    #[test]
    fn the_story_names_kvgate_against_no_gate_and_the_best_cap() {
        let s = Scenario::load("no-pressure").unwrap();
        let policies: Vec<Policy> = ["none", "kvgate", "cap-4"]
            .iter()
            .map(|p| Policy::parse(p).unwrap())
            .collect();
        let mut rows: Vec<Summary> = crate::compare(&s, 1, &policies)
            .iter()
            .map(|r| r.summary())
            .collect();
        assert_eq!(story_sentence(&rows), None, "no cap-best: no sentence");
        rows[2].policy = "cap-best (K=4)".into();
        let sentence = story_sentence(&rows).unwrap();
        let (none, gate, best) = (&rows[0], &rows[1], &rows[2]);
        assert!(sentence.starts_with(&format!("kvgate finished in {:.0} s", gate.makespan_s)));
        assert!(sentence.contains(&format!(
            "{:.2}x no gate",
            gate.makespan_s / none.makespan_s
        )));
        assert!(
            sentence.contains(&format!("(K=4, {:.0} s)", best.makespan_s)),
            "{sentence}"
        );
        let table = story_table(&rows, Some(best.makespan_s));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + rows.len());
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "{table}");
        assert!(
            lines[2 + 2].contains("1.00"),
            "the best cap against itself: {table}"
        );
    }
}

//! The agentic workload kvgate exists for, on one machine, in a few seconds.
//!
//! Many agent sessions (one OS thread each) run multi-turn rollouts against a
//! toy engine that shares one KV pool. Every turn re-sends the whole, growing
//! history; between turns the agent "calls a tool" (sleeps a few ms). Early
//! turns are short and everything is admitted `open`; later the live prompts
//! fill the pool, KV usage crosses the high watermark, and the gate starts to
//! prefer sessions that own a reservation or whose prefix is still resident,
//! holding cold sessions back until capacity frees up. Now and then a client
//! gives up on a queued turn and retries it from a second thread: the newer
//! attempt preempts the older one, which returns at once and just moves on.
//!
//! The toy engine implements `kvgate::Probe`: usage is live (running) prompt
//! tokens over the pool's capacity; the prefix hit ratio comes from an
//! LRU-ish residency model (one cached token count per session, evicted
//! oldest-first when the resident total exceeds the capacity). A turn runs
//! for a time proportional to its prompt, plus a penalty for every token it
//! must re-prefill because its prefix was evicted.
//!
//! ```text
//! cargo run --release --example agentic_demo -- --sessions 24 --turns 12 --seed 7
//! ```
//!
//! The RNG is seeded, so the workload (prompt sizes, tool times, which turns
//! retry) is the same for a seed; thread scheduling still varies run to run.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvgate::{AcquireError, Config, Gate, Lease, Probe, Reason};

/// How long a client waits for admission before it retries a turn (on retry turns).
const CLIENT_PATIENCE: Duration = Duration::from_millis(15);
/// The acquire timeout every turn uses; a timed-out turn is simply asked again.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Share of turns whose client is impatient and may retry.
const RETRY_PERCENT: u64 = 10;

/// splitmix64: tiny, seedable, good enough for a workload generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// What the engine remembers of one session's KV blocks.
#[derive(Default)]
struct Cached {
    tokens: usize,
    running: u32,
    last_use: u64,
}

/// The toy engine's KV pool, in tokens.
#[derive(Default)]
struct Pool {
    capacity: usize,
    /// Prompt tokens of running turns: what vLLM's usage probe reports.
    live: usize,
    /// Tokens cached for all sessions, running or idle.
    resident: usize,
    tick: u64,
    sessions: HashMap<Vec<u8>, Cached>,
    prompt_tokens: u64,
    hit_tokens: u64,
    evicted_tokens: u64,
}

impl Pool {
    /// `session` uses the pool now and its resident prefix grows to `tokens`;
    /// then the least recently used idle sessions lose their tails until the
    /// pool fits. Blocks of running turns are pinned and never evicted.
    fn touch(&mut self, session: &[u8], tokens: usize) {
        self.tick += 1;
        let c = self.sessions.entry(session.to_vec()).or_default();
        c.last_use = self.tick;
        if tokens > c.tokens {
            self.resident += tokens - c.tokens;
            c.tokens = tokens;
        }
        while self.resident > self.capacity {
            let victim = self
                .sessions
                .values_mut()
                .filter(|c| c.running == 0 && c.tokens > 0)
                .min_by_key(|c| c.last_use);
            let Some(c) = victim else { break };
            let n = (self.resident - self.capacity).min(c.tokens);
            c.tokens -= n;
            self.resident -= n;
            self.evicted_tokens += n as u64;
        }
    }
}

/// The toy engine: one shared KV pool.
struct Engine(Mutex<Pool>);

impl Engine {
    /// A turn enters the engine: returns how many prompt tokens were cache hits.
    fn start(&self, session: &[u8], prompt_len: usize) -> usize {
        let mut p = self.0.lock().unwrap();
        let c = p.sessions.entry(session.to_vec()).or_default();
        c.running += 1;
        let hit = c.tokens.min(prompt_len);
        p.live += prompt_len;
        p.prompt_tokens += prompt_len as u64;
        p.hit_tokens += hit as u64;
        p.touch(session, prompt_len);
        hit
    }

    /// A turn leaves the engine; its prompt and output stay cached until evicted.
    fn finish(&self, session: &[u8], prompt_len: usize, output_len: usize) {
        let mut p = self.0.lock().unwrap();
        p.live -= prompt_len;
        p.sessions.get_mut(session).expect("started").running -= 1;
        p.touch(session, prompt_len + output_len);
    }
}

impl Probe for Engine {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        let p = self.0.lock().unwrap();
        // The toy engine never refuses work, so live tokens may exceed the pool.
        Some((p.live as f64 / p.capacity as f64).min(1.0))
    }

    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64> {
        let p = self.0.lock().unwrap();
        let cached = p.sessions.get(session).map_or(0, |c| c.tokens);
        Some(cached.min(prompt.len()) as f64 / prompt.len().max(1) as f64)
    }
}

/// One turn as the session saw it.
struct TurnRecord {
    turn: usize,
    prompt_len: usize,
    hit_tokens: usize,
    reason: Reason,
    wait: Duration,
    latency: Duration,
}

/// What a session thread reports back.
#[derive(Default)]
struct SessionReport {
    turns: Vec<TurnRecord>,
    retries: u64,
    preempted_seen: u64,
    raced_admissions: u64,
    timeouts_retried: u64,
}

/// Acquires for a turn, asking again after a timeout (as a client would).
fn acquire_turn(gate: &Gate, id: &[u8], prompt: &[u32], report: &mut SessionReport) -> Lease {
    loop {
        match gate.acquire_timeout(id, prompt, ACQUIRE_TIMEOUT) {
            Ok(lease) => return lease,
            Err(AcquireError::TimedOut) => report.timeouts_retried += 1,
            // Nothing newer than this attempt is ever begun for the session,
            // and the demo never cancels or closes while sessions run.
            Err(e) => panic!("unexpected acquire error: {e}"),
        }
    }
}

/// The impatient client: sends the turn from a helper thread and, if it is
/// not admitted within `CLIENT_PATIENCE`, retries from this thread. The retry
/// preempts the queued attempt, whose thread returns `Preempted` and moves on.
fn acquire_with_retry(gate: &Gate, id: &[u8], prompt: &[u32], report: &mut SessionReport) -> Lease {
    thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(gate.acquire_timeout(id, prompt, ACQUIRE_TIMEOUT));
        });
        if let Ok(first) = rx.recv_timeout(CLIENT_PATIENCE) {
            return first.expect("nothing can end the only attempt this early");
        }
        // Still queued: the client loses patience and sends the turn again.
        report.retries += 1;
        let lease = acquire_turn(gate, id, prompt, report);
        match rx.recv().expect("the first attempt always answers") {
            Err(AcquireError::Preempted) => report.preempted_seen += 1,
            Err(e) => panic!("unexpected acquire error: {e}"),
            // Admitted just before the retry began: the client has given up
            // on it, so its lease goes straight back.
            Ok(stale) => {
                report.raced_admissions += 1;
                stale.release();
            }
        }
        lease
    })
}

/// One agent session: `turns` turns, each growing the prompt.
fn run_session(
    gate: &Gate,
    engine: &Engine,
    index: usize,
    turns: usize,
    seed: u64,
) -> SessionReport {
    let mut rng = Rng(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F));
    let id = format!("agent-{index:02}").into_bytes();
    let mut report = SessionReport::default();
    // System prompt plus task statement.
    let first = rng.range(1_500, 2_000) + rng.range(300, 1_200);
    let mut prompt: Vec<u32> = (0..first).map(|_| rng.next() as u32).collect();
    for turn in 0..turns {
        let began = Instant::now();
        let lease = if rng.range(1, 100) <= RETRY_PERCENT {
            acquire_with_retry(gate, &id, &prompt, &mut report)
        } else {
            acquire_turn(gate, &id, &prompt, &mut report)
        };
        let (reason, wait) = (lease.reason(), lease.admission().wait);
        // Run the turn: prefill what is not cached, decode the output.
        let hit = engine.start(&id, prompt.len());
        let output = rng.range(100, 500) as usize;
        let micros = 2_000 + prompt.len() + (prompt.len() - hit) * 4 + output * 40;
        thread::sleep(Duration::from_micros(micros as u64));
        engine.finish(&id, prompt.len(), output);
        lease.release(); // as soon as the engine returns
        report.turns.push(TurnRecord {
            turn,
            prompt_len: prompt.len(),
            hit_tokens: hit,
            reason,
            wait,
            latency: began.elapsed(),
        });
        // The model's output and the tool's result join the history.
        let tool_result = rng.range(300, 2_500) as usize;
        prompt.extend((0..output + tool_result).map(|_| rng.next() as u32));
        if turn + 1 < turns {
            // Most tools answer in a few ms; a slow one outlasts the idle grace.
            let tool_ms = if rng.range(1, 100) <= 10 {
                rng.range(250, 600)
            } else {
                rng.range(5, 30)
            };
            thread::sleep(Duration::from_millis(tool_ms));
        }
    }
    gate.finish_session(&id);
    report
}

struct Args {
    sessions: usize,
    turns: usize,
    seed: u64,
    capacity: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        sessions: 24,
        turns: 12,
        seed: 7,
        // Sized so the gate engages in the second half of a default run.
        capacity: 120_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> u64 {
            let v = it
                .next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")));
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{name}: not a number: {v}")))
        };
        match flag.as_str() {
            "--sessions" => args.sessions = value("--sessions").max(1) as usize,
            "--turns" => args.turns = value("--turns").max(1) as usize,
            "--seed" => args.seed = value("--seed"),
            "--capacity" => args.capacity = value("--capacity").max(1) as usize,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    args
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("agentic_demo: {problem}");
    }
    eprintln!("usage: agentic_demo [--sessions N] [--turns N] [--seed N] [--capacity TOKENS]");
    eprintln!("  each session runs between turns-2 and turns turns (at least 1)");
    std::process::exit(if problem.is_empty() { 0 } else { 2 })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args = parse_args();
    let config = Config {
        wait_poll: Duration::from_millis(50),
        idle_grace: Duration::from_millis(200),
        ..Config::reference()
    };
    let engine = Arc::new(Engine(Mutex::new(Pool {
        capacity: args.capacity,
        ..Pool::default()
    })));
    let gate = Gate::new(config, engine.clone()).expect("valid config");
    println!(
        "kvgate agentic demo: {} sessions, up to {} turns, seed {}",
        args.sessions, args.turns, args.seed
    );
    println!("config: {:?}", gate.config());
    println!(
        "engine: KV pool of {} tokens; {RETRY_PERCENT}% of turns retry after {CLIENT_PATIENCE:?} queued\n",
        args.capacity
    );

    let mut plan = Rng(args.seed);
    let started = Instant::now();
    let reports: Vec<SessionReport> = thread::scope(|s| {
        let handles: Vec<_> = (0..args.sessions)
            .map(|i| {
                let turns = args.turns.saturating_sub(plan.range(0, 2) as usize).max(1);
                let (gate, engine) = (&gate, &*engine);
                s.spawn(move || run_session(gate, engine, i, turns, args.seed))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("session thread"))
            .collect()
    });
    let elapsed = started.elapsed();

    print_report(&gate, &engine.0.lock().unwrap(), &reports);
    let stats = gate.stats();
    let sum = |f: fn(&SessionReport) -> u64| reports.iter().map(f).sum::<u64>();
    let turns_run = reports.iter().map(|r| r.turns.len() as u64).sum::<u64>();
    // What the clients saw agrees with what the gate counted.
    assert_eq!(
        stats.total_admissions(),
        turns_run + sum(|r| r.raced_admissions)
    );
    assert_eq!(stats.preempted, sum(|r| r.preempted_seen));
    assert_eq!(stats.timed_out, sum(|r| r.timeouts_retried));
    assert_eq!((stats.active_leases, stats.pending_attempts), (0, 0));
    println!(
        "demo ok: {} admissions, {} preempted, {} sessions in {:.1} s",
        stats.total_admissions(),
        stats.preempted,
        args.sessions,
        elapsed.as_secs_f64()
    );
}

fn print_report(gate: &Gate, pool: &Pool, reports: &[SessionReport]) {
    let stats = gate.stats();
    let admissions = stats.total_admissions();
    let row = |name: &str, value: String| println!("{name:<34}{value:>12}");
    println!("admissions by reason");
    for reason in Reason::ALL {
        row(&format!("  {reason}"), stats.admissions(reason).to_string());
    }
    row("  total", admissions.to_string());
    row("attempts", stats.attempts.to_string());
    row("waits (attempts that slept)", stats.waits.to_string());
    let mean_wait = ms(stats.wait_time) / stats.waits.max(1) as f64;
    row("mean wait of those (ms)", format!("{mean_wait:.1}"));
    row("preempted attempts", stats.preempted.to_string());
    row("timed out attempts", stats.timed_out.to_string());
    let retries: u64 = reports.iter().map(|r| r.retries).sum();
    let raced: u64 = reports.iter().map(|r| r.raced_admissions).sum();
    row(
        "client retries (raced admission)",
        format!("{retries} ({raced})"),
    );
    let probes = stats.usage_probe_calls + stats.prefix_probe_calls;
    let per_admission = probes as f64 / admissions.max(1) as f64;
    row("probe calls per admission", format!("{per_admission:.2}"));
    row("grace windows expired", stats.grace_expired.to_string());
    let hit_rate = 100.0 * pool.hit_tokens as f64 / pool.prompt_tokens.max(1) as f64;
    row("engine prefix-cache hit rate", format!("{hit_rate:.1}%"));
    row("engine tokens evicted", pool.evicted_tokens.to_string());

    // The seed's monitoring signals, split by turn index.
    println!(
        "\nturn  turns  mean prompt  hit %  mean wait ms  max wait ms  mean turn ms  not open"
    );
    let all: Vec<&TurnRecord> = reports.iter().flat_map(|r| &r.turns).collect();
    let last = all.iter().map(|t| t.turn).max().unwrap_or(0);
    for turn in 0..=last {
        let rows: Vec<&&TurnRecord> = all.iter().filter(|t| t.turn == turn).collect();
        let n = rows.len().max(1) as f64;
        let prompt: usize = rows.iter().map(|t| t.prompt_len).sum();
        let hit: usize = rows.iter().map(|t| t.hit_tokens).sum();
        let waits = rows.iter().map(|t| ms(t.wait));
        println!(
            "{turn:>4} {:>6} {:>12.0} {:>6.1} {:>13.2} {:>12.2} {:>13.2} {:>9}",
            rows.len(),
            prompt as f64 / n,
            100.0 * hit as f64 / prompt.max(1) as f64,
            waits.clone().sum::<f64>() / n,
            waits.fold(0.0, f64::max),
            rows.iter().map(|t| ms(t.latency)).sum::<f64>() / n,
            rows.iter().filter(|t| t.reason != Reason::Open).count(),
        );
    }
    println!("\n# gate.metrics_text()\n{}", gate.metrics_text());
}

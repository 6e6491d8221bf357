//! Wake-up and preemption latency, kvgate next to the naive baseline in the
//! same run (a custom harness: criterion times one thread's loop, these are
//! latencies between threads with hundreds of threads asleep).
//!
//! - Wake-up: N waiter threads (1, 16, 256), each with its own cold session,
//!   wait under pressure. The controller frees one unit of capacity (the
//!   engine's next prefix probe answers "resident"), releases its own lease
//!   (a capacity event) and the latency runs until one waiter is admitted.
//!   Probe calls per admission come from the same runs: a design that wakes
//!   a herd makes every waiter probe again.
//! - Preemption: 256 waiters; for each in turn, a newer attempt of its
//!   session begins (with a zero timeout, so it does not wait) and the
//!   latency runs until the older attempt returns `Preempted`.
//!
//! `cargo bench --bench latency`. Under `cargo test` a small version runs
//! (few waiters and samples, short poll) and checks that every release
//! admitted exactly one waiter and every preempted attempt came back.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvgate::{AcquireError, Config, Gate, Lease};

use common::naive::{NaiveError, NaiveGate, NaiveLease};
use common::{human_ns, session_ids, Percentiles, TokenEngine, CONTROLLER, PROMPT};

/// How a waiter's attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Admitted,
    Preempted,
    TimedOut,
    Closed,
}

/// What the benches need from a design.
trait Design: Send + Sync {
    fn name(&self) -> &'static str;
    fn engine(&self) -> &TokenEngine;
    /// One attempt of `session`; on admission calls `on_admit` and then
    /// releases the lease at once.
    fn attempt(&self, session: &[u8], timeout: Option<Duration>, on_admit: &mut dyn FnMut())
        -> End;
    /// Takes the controller's (open) lease; the closure releases it.
    fn hold(&self) -> Box<dyn FnOnce() + '_>;
    /// Attempts asleep waiting for capacity.
    fn sleepers(&self) -> usize;
    fn close(&self);
}

/// An admitted attempt calls `on_admit`, then releases its lease at once.
fn admit_then_release<L>(
    result: Result<L, End>,
    on_admit: &mut dyn FnMut(),
    release: impl FnOnce(L),
) -> End {
    match result {
        Ok(lease) => {
            on_admit();
            release(lease);
            End::Admitted
        }
        Err(end) => end,
    }
}

struct Kvgate {
    gate: Gate,
    engine: Arc<TokenEngine>,
}

impl Design for Kvgate {
    fn name(&self) -> &'static str {
        "kvgate"
    }
    fn engine(&self) -> &TokenEngine {
        &self.engine
    }
    fn attempt(
        &self,
        session: &[u8],
        timeout: Option<Duration>,
        on_admit: &mut dyn FnMut(),
    ) -> End {
        let result = match timeout {
            None => self.gate.acquire(session, PROMPT),
            Some(t) => self.gate.acquire_timeout(session, PROMPT, t),
        };
        let result = result.map_err(|e| match e {
            AcquireError::Preempted => End::Preempted,
            AcquireError::TimedOut => End::TimedOut,
            AcquireError::Closed => End::Closed,
            AcquireError::Cancelled | AcquireError::Released => panic!("nobody cancels"),
        });
        admit_then_release(result, on_admit, Lease::release)
    }
    fn hold(&self) -> Box<dyn FnOnce() + '_> {
        let lease = self
            .gate
            .acquire(CONTROLLER, PROMPT)
            .expect("controller admitted");
        Box::new(move || lease.release())
    }
    fn sleepers(&self) -> usize {
        self.gate.stats().waiting_attempts as usize
    }
    fn close(&self) {
        self.gate.close();
    }
}

struct Naive {
    gate: NaiveGate<Arc<TokenEngine>>,
    engine: Arc<TokenEngine>,
}

impl Design for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }
    fn engine(&self) -> &TokenEngine {
        &self.engine
    }
    fn attempt(
        &self,
        session: &[u8],
        timeout: Option<Duration>,
        on_admit: &mut dyn FnMut(),
    ) -> End {
        // As the reference proxy calls it: registered, so a newer attempt preempts it.
        let result = self.gate.acquire_preemptible(session, PROMPT, timeout);
        let result = result.map_err(|e| match e {
            NaiveError::Preempted => End::Preempted,
            NaiveError::TimedOut => End::TimedOut,
            NaiveError::Closed => End::Closed,
        });
        admit_then_release(result, on_admit, NaiveLease::release)
    }
    fn hold(&self) -> Box<dyn FnOnce() + '_> {
        let lease = self
            .gate
            .acquire(CONTROLLER, PROMPT)
            .expect("controller admitted");
        Box::new(move || lease.release())
    }
    fn sleepers(&self) -> usize {
        self.gate.sleepers()
    }
    fn close(&self) {
        self.gate.close();
    }
}

fn designs(config: &Config) -> Vec<Arc<dyn Design>> {
    let kv_engine = Arc::new(TokenEngine::default());
    let naive_engine = Arc::new(TokenEngine::default());
    vec![
        Arc::new(Kvgate {
            gate: Gate::new(config.clone(), kv_engine.clone()).expect("valid config"),
            engine: kv_engine,
        }),
        Arc::new(Naive {
            gate: NaiveGate::new(config, naive_engine.clone()),
            engine: naive_engine,
        }),
    ]
}

/// Nanoseconds since the bench's common origin, comparable across threads.
fn now(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// Waits (politely: the waiters need the CPUs) until `done()`.
fn wait_until(what: &str, patience: Duration, done: impl Fn() -> bool) {
    let give_up = Instant::now() + patience;
    while !done() {
        assert!(Instant::now() < give_up, "gave up waiting until {what}");
        thread::sleep(Duration::from_micros(20));
    }
}

#[derive(Debug)]
struct Figures {
    design: &'static str,
    waiters: usize,
    latency: Percentiles,
    probes_per_admission: f64,
}

/// The wake-up bench for one design and one number of waiters.
fn wake_up(design: &Arc<dyn Design>, waiters: usize, samples: usize) -> Figures {
    let origin = Instant::now();
    let released_at = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(samples)));
    let admitted = Arc::new(AtomicUsize::new(0));
    let ids = session_ids("waiter", waiters);
    let threads: Vec<_> = ids
        .into_iter()
        .map(|id| {
            let (design, released_at) = (design.clone(), released_at.clone());
            let (latencies, admitted) = (latencies.clone(), admitted.clone());
            thread::spawn(move || loop {
                let mut on_admit = || {
                    let waited = now(origin).saturating_sub(released_at.load(Ordering::SeqCst));
                    latencies.lock().unwrap().push(waited);
                    admitted.fetch_add(1, Ordering::SeqCst);
                };
                match design.attempt(&id, None, &mut on_admit) {
                    End::Admitted => {} // and back in line with the next turn
                    End::Closed => break,
                    other => panic!("waiter ended {other:?}"),
                }
            })
        })
        .collect();
    let patience = Duration::from_secs(60);
    wait_until("all waiters sleep", patience, || {
        design.sleepers() == waiters
    });
    let probes_before = design.engine().probe_calls();
    for sample in 0..samples {
        let release = design.hold();
        released_at.store(now(origin), Ordering::SeqCst);
        design.engine().free_one();
        release();
        wait_until("one waiter is admitted", patience, || {
            admitted.load(Ordering::SeqCst) > sample
        });
        wait_until("the waiters sleep again", patience, || {
            design.sleepers() == waiters
        });
    }
    let probes = design.engine().probe_calls() - probes_before;
    design.close();
    for t in threads {
        t.join().expect("waiter thread");
    }
    // Every release freed exactly one unit, and each unit admitted exactly one waiter.
    assert_eq!(
        admitted.load(Ordering::SeqCst),
        samples,
        "{}",
        design.name()
    );
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    Figures {
        design: design.name(),
        waiters,
        latency: Percentiles::of(&mut latencies),
        probes_per_admission: probes as f64 / samples as f64,
    }
}

/// The preemption bench: each waiter's attempt is preempted once by a
/// newer attempt of its session, `spacing` apart.
fn preemption(
    design: &Arc<dyn Design>,
    waiters: usize,
    spacing: Duration,
    patience: Duration,
) -> Figures {
    let origin = Instant::now();
    let preempted_at: Arc<Vec<AtomicU64>> =
        Arc::new((0..waiters).map(|_| AtomicU64::new(0)).collect());
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(waiters)));
    let ids = Arc::new(session_ids("waiter", waiters));
    let threads: Vec<_> = (0..waiters)
        .map(|i| {
            let (design, preempted_at) = (design.clone(), preempted_at.clone());
            let (latencies, ids) = (latencies.clone(), ids.clone());
            thread::spawn(move || loop {
                match design.attempt(&ids[i], None, &mut || panic!("no capacity was freed")) {
                    End::Preempted => {
                        let ended = now(origin);
                        let began = preempted_at[i].swap(0, Ordering::SeqCst);
                        assert_ne!(began, 0, "preempted before the newer attempt began");
                        latencies.lock().unwrap().push(ended.saturating_sub(began));
                        // Waits again with a fresh attempt, so the number of
                        // waiters stays the same for the next preemption.
                    }
                    End::Closed => break,
                    other => panic!("waiter ended {other:?}"),
                }
            })
        })
        .collect();
    wait_until("all waiters sleep", patience, || {
        design.sleepers() == waiters
    });
    for (i, id) in ids.iter().enumerate() {
        preempted_at[i].store(now(origin), Ordering::SeqCst);
        // The newer attempt does not wait (zero timeout); it may itself be
        // preempted by the older attempt's thread starting over.
        let end = design.attempt(id, Some(Duration::ZERO), &mut || panic!("no capacity"));
        assert!(
            matches!(end, End::TimedOut | End::Preempted),
            "newer attempt ended {end:?}"
        );
        thread::sleep(spacing);
    }
    wait_until("every preempted attempt returned", patience, || {
        latencies.lock().unwrap().len() == waiters
    });
    design.close();
    for t in threads {
        t.join().expect("waiter thread");
    }
    let probes = design.engine().probe_calls();
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    Figures {
        design: design.name(),
        waiters,
        latency: Percentiles::of(&mut latencies),
        probes_per_admission: probes as f64,
    }
}

fn print(title: &str, rows: &[Figures], probes_label: &str) {
    println!("{title}");
    println!(
        "  {:<7} {:>7} {:>8} {:>10} {:>10} {:>10}  {:>9} {:>11}",
        "design", "waiters", "samples", "p50", "p99", "max", "p99/naive", probes_label
    );
    for r in rows {
        let naive = rows
            .iter()
            .find(|n| n.design == "naive" && n.waiters == r.waiters)
            .expect("naive row");
        println!(
            "  {:<7} {:>7} {:>8} {:>10} {:>10} {:>10}  {:>9.4} {:>11.1}",
            r.design,
            r.waiters,
            r.latency.samples,
            human_ns(r.latency.p50 as f64),
            human_ns(r.latency.p99 as f64),
            human_ns(r.latency.max as f64),
            r.latency.p99 as f64 / naive.latency.p99 as f64,
            r.probes_per_admission,
        );
    }
}

fn json(rows: &[Figures], probes_key: &str) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "    {{\"design\": \"{}\", \"waiters\": {}, \"samples\": {}, \"p50_ns\": {}, \
                 \"p99_ns\": {}, \"max_ns\": {}, \"{probes_key}\": {:.2}}}",
                r.design,
                r.waiters,
                r.latency.samples,
                r.latency.p50,
                r.latency.p99,
                r.latency.max,
                r.probes_per_admission
            )
        })
        .collect();
    format!("[\n{}\n  ]", rows.join(",\n"))
}

fn main() {
    let bench = common::bench_mode();
    // The reference's knobs (poll 5 s), except no grace window: a waiter
    // admitted and released has no window left to make its next turn
    // `reserved_session`, so every sample is a cold waiter let in.
    let config = Config {
        idle_grace: Duration::ZERO,
        wait_poll: if bench {
            Duration::from_secs(5)
        } else {
            Duration::from_millis(50)
        },
        ..Config::reference()
    };
    let (waiter_counts, samples): (&[usize], usize) = if bench {
        (&[1, 16, 256], 400)
    } else {
        (&[1, 16], 8)
    };

    let mut wake_rows = Vec::new();
    for &waiters in waiter_counts {
        for design in designs(&config) {
            wake_rows.push(wake_up(&design, waiters, samples));
        }
    }
    print(
        "wake-up: release -> admission of a waiter that can now proceed",
        &wake_rows,
        "probes/adm",
    );

    let preempt_waiters = if bench { 256 } else { 16 };
    let patience = config.wait_poll * 2 + Duration::from_secs(30);
    let mut preempt_rows = Vec::new();
    for design in designs(&config) {
        preempt_rows.push(preemption(
            &design,
            preempt_waiters,
            Duration::from_millis(2),
            patience,
        ));
    }
    print(
        "preemption: newer attempt begins -> older waiter returns Preempted",
        &preempt_rows,
        "probe calls",
    );

    if bench {
        let body = format!(
            "{{\n  \"wakeup\": {},\n  \"preemption\": {}\n}}\n",
            json(&wake_rows, "probes_per_admission"),
            json(&preempt_rows, "probe_calls")
        );
        common::write_results("latency", &body);
    } else {
        println!("latency: smoke run passed (no timing asserted)");
    }
}

//! Micro benchmarks (criterion): the open path, the pressure paths and the
//! stats snapshot, each next to the naive baseline measured in the same run,
//! and the machine's floor (an atomic increment, a mutex lock, a clock read).
//!
//! `cargo bench --bench micro`; `benches/report.py` turns criterion's
//! estimates into the table with ratios (see benches/README.md).

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvgate::core::Core;
use kvgate::{AcquireError, Config, Gate, Reason};

use common::naive::NaiveGate;
use common::{core_cycle, gate_cycle, naive_cycle, session_ids, Fixed, PROMPT};

/// Distinct sessions cycled through by the "distinct" cases: more than the
/// caches hold comfortably, as many sessions of a large rollout.
const POOL: usize = 4096;
const THREADS: [usize; 3] = [2, 4, 8];

fn gate(probe: Fixed, config: Config) -> Gate {
    Gate::new(config, probe).expect("valid config")
}

fn floor(c: &mut Criterion) {
    let mut g = c.benchmark_group("floor");
    let counter = AtomicU64::new(0);
    g.bench_function("atomic_increment", |b| {
        b.iter(|| black_box(&counter).fetch_add(1, Ordering::SeqCst))
    });
    let pl = parking_lot::Mutex::new(0u64);
    g.bench_function("mutex_lock_parking_lot", |b| {
        b.iter(|| *black_box(&pl).lock() += 1)
    });
    let std_mutex = std::sync::Mutex::new(0u64);
    g.bench_function("mutex_lock_std", |b| {
        b.iter(|| *black_box(&std_mutex).lock().unwrap() += 1)
    });
    g.bench_function("clock_read", |b| b.iter(Instant::now));
    // What kvgate's gate reads (nanoseconds since its origin), and what it
    // hashes once per attempt (a 14-byte session id, seeded SipHash).
    let clock = kvgate::MonotonicClock::new();
    g.bench_function("clock_read_gate", |b| {
        b.iter(|| kvgate::Clock::now_ns(black_box(&clock)))
    });
    let hasher = std::hash::RandomState::new();
    let id = b"session-000042";
    g.bench_function("siphash_session_id", |b| {
        b.iter(|| std::hash::BuildHasher::hash_one(&hasher, black_box(&id[..])))
    });
    g.finish();
}

fn open_path_single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("open_1t");
    let ids = session_ids("session", POOL);
    let hot = &ids[0];

    let kv = gate(Fixed::OPEN, Config::reference());
    g.bench_function("kvgate/hot", |b| {
        b.iter(|| gate_cycle(&kv, hot, Reason::Open))
    });
    let mut i = 0;
    g.bench_function("kvgate/distinct", |b| {
        b.iter(|| {
            i = (i + 1) % POOL;
            gate_cycle(&kv, &ids[i], Reason::Open)
        })
    });

    let naive = NaiveGate::new(&Config::reference(), Fixed::OPEN);
    g.bench_function("naive/hot", |b| {
        b.iter(|| naive_cycle(&naive, hot, Reason::Open))
    });
    g.bench_function("naive/distinct", |b| {
        b.iter(|| {
            i = (i + 1) % POOL;
            naive_cycle(&naive, &ids[i], Reason::Open)
        })
    });
    // The reference proxy also registers every attempt (for preemption)
    // under a second global lock: the naive design's full per-turn cost.
    g.bench_function("naive_with_registry/hot", |b| {
        b.iter(|| {
            let lease = naive.acquire_preemptible(hot, PROMPT, None).unwrap();
            lease.release()
        })
    });

    // The sans-IO core alone: no clock read, no sleeper (the time is given).
    let core = Core::new(Config::reference()).expect("valid config");
    let mut now = 0u64;
    g.bench_function("core/hot", |b| {
        b.iter(|| {
            now += 1;
            core_cycle(&core, hot, now)
        })
    });
    g.finish();
}

/// Runs `op(thread, k)` `iters` times in total spread over `threads`
/// threads started together; returns the wall time for `iters` operations.
fn parallel(threads: usize, iters: u64, op: impl Fn(usize, u64) + Sync) -> Duration {
    let per_thread = iters.div_ceil(threads as u64).max(1);
    let start_line = Barrier::new(threads + 1);
    let elapsed = thread::scope(|s| {
        for t in 0..threads {
            let (op, start_line) = (&op, &start_line);
            s.spawn(move || {
                start_line.wait();
                for k in 0..per_thread {
                    op(t, k);
                }
            });
        }
        start_line.wait();
        let start = Instant::now();
        // The scope joins every thread before returning.
        start
    })
    .elapsed();
    elapsed.mul_f64(iters as f64 / (per_thread * threads as u64) as f64)
}

fn open_path_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("open_mt");
    let ids = session_ids("session", POOL);
    let kv = gate(Fixed::OPEN, Config::reference());
    let naive = NaiveGate::new(&Config::reference(), Fixed::OPEN);
    // Each thread cycles through its own slice of the pool, so attempts of
    // one session never overlap (which would preempt one another).
    let mine = |t: usize, threads: usize, k: u64| {
        let slice = POOL / threads;
        &ids[t * slice + (k as usize % slice)]
    };
    // kvgate: overlapping attempts of one session preempt each other, as
    // the seed says; an attempt that ended preempted counts as done.
    let preempted = AtomicU64::new(0);
    for threads in THREADS {
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(
            BenchmarkId::new("kvgate/distinct", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    parallel(n, iters, |t, k| {
                        gate_cycle(&kv, mine(t, n, k), Reason::Open)
                    })
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("naive/distinct", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    parallel(n, iters, |t, k| {
                        naive_cycle(&naive, mine(t, n, k), Reason::Open)
                    })
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("kvgate/hot", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    parallel(n, iters, |_, _| match kv.acquire(&ids[0], PROMPT) {
                        Ok(lease) => lease.release(),
                        Err(AcquireError::Preempted) => {
                            preempted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("unexpected {e}"),
                    })
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("naive/hot", threads), &threads, |b, &n| {
            b.iter_custom(|iters| {
                parallel(n, iters, |_, _| naive_cycle(&naive, &ids[0], Reason::Open))
            })
        });
    }

    // The same 8-thread open path while 10,000 other sessions hold grace
    // windows (as late in a rollout): the naive design scans them all, under
    // its one lock, on every call.
    let long_grace = Config {
        idle_grace: Duration::from_secs(3600),
        ..Config::reference()
    };
    let kv_w = Gate::new(long_grace.clone(), Split).expect("valid config");
    let naive_w = NaiveGate::new(&long_grace, Split);
    for id in session_ids("others", 10_000) {
        kv_w.acquire(&id, PROMPT).expect("admitted").release();
        naive_w.acquire(&id, PROMPT).expect("admitted").release();
    }
    let n = 8;
    g.bench_function(BenchmarkId::new("kvgate/distinct_10k_windows", n), |b| {
        b.iter_custom(|iters| {
            parallel(n, iters, |t, k| {
                gate_cycle(&kv_w, mine(t, n, k), Reason::Open)
            })
        })
    });
    g.bench_function(BenchmarkId::new("naive/distinct_10k_windows", n), |b| {
        b.iter_custom(|iters| {
            parallel(n, iters, |t, k| {
                let lease = naive_w.acquire(mine(t, n, k), PROMPT).expect("admitted");
                debug_assert_eq!(lease.reason, Reason::Open);
                lease.release()
            })
        })
    });
    g.finish();
    let s = kv.stats();
    eprintln!(
        "open_mt kvgate/hot: {} of {} attempts ended preempted by a newer attempt of the hot session",
        preempted.load(Ordering::Relaxed),
        s.attempts
    );
}

/// Under pressure for the `others-*` sessions (each admitted as resident,
/// so it keeps a window), open for every other session.
struct Split;

impl kvgate::Probe for Split {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        Some(if session.starts_with(b"others") {
            common::HIGH_USAGE
        } else {
            common::LOW_USAGE
        })
    }
    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        Some(1.0)
    }
}

fn pressure_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("pressure");
    let session: &[u8] = b"session-hot000";

    // reserved_session: the session holds a grace window; every turn goes
    // straight in without a prefix probe and renews the window on release.
    let kv = gate(Fixed::HOT, Config::reference());
    gate_cycle(&kv, session, Reason::ResidentPrefix);
    g.bench_function("reserved_session/kvgate", |b| {
        b.iter(|| gate_cycle(&kv, session, Reason::ReservedSession))
    });
    let naive = NaiveGate::new(&Config::reference(), Fixed::HOT);
    naive_cycle(&naive, session, Reason::ResidentPrefix);
    g.bench_function("reserved_session/naive", |b| {
        b.iter(|| naive_cycle(&naive, session, Reason::ReservedSession))
    });

    // The same with 10,000 other sessions holding grace windows: the naive
    // design scans every reservation on every call.
    let others = session_ids("others", 10_000);
    for id in &others {
        gate_cycle(&kv, id, Reason::ResidentPrefix);
        naive_cycle(&naive, id, Reason::ResidentPrefix);
    }
    g.bench_function("reserved_session_10k_windows/kvgate", |b| {
        b.iter(|| gate_cycle(&kv, session, Reason::ReservedSession))
    });
    g.bench_function("reserved_session_10k_windows/naive", |b| {
        b.iter(|| naive_cycle(&naive, session, Reason::ReservedSession))
    });

    // resident_prefix: no window (grace 0), so every turn probes the prefix
    // and is admitted because it is resident.
    let no_grace = Config {
        idle_grace: Duration::ZERO,
        ..Config::reference()
    };
    let kv = gate(Fixed::HOT, no_grace.clone());
    g.bench_function("resident_prefix/kvgate", |b| {
        b.iter(|| gate_cycle(&kv, session, Reason::ResidentPrefix))
    });
    let naive = NaiveGate::new(&no_grace, Fixed::HOT);
    g.bench_function("resident_prefix/naive", |b| {
        b.iter(|| naive_cycle(&naive, session, Reason::ResidentPrefix))
    });
    g.finish();
}

/// Keeps `threads` threads doing open-path turns until dropped.
struct Load {
    stop: std::sync::Arc<AtomicBool>,
    handles: Vec<thread::JoinHandle<u64>>,
}

impl Load {
    fn start(threads: usize, turn: impl Fn(usize, u64) + Send + Sync + Clone + 'static) -> Self {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let handles = (0..threads)
            .map(|t| {
                let (stop, turn) = (stop.clone(), turn.clone());
                thread::spawn(move || {
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        turn(t, k);
                        k += 1;
                    }
                    k
                })
            })
            .collect();
        Self { stop, handles }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handles.into_iter().map(|h| h.join().unwrap()).sum()
    }
}

fn stats_under_load(c: &mut Criterion) {
    let mut g = c.benchmark_group("stats_8t");
    let ids = std::sync::Arc::new(session_ids("session", POOL));
    let slice = POOL / 8;

    let kv = gate(Fixed::OPEN, Config::reference());
    let load = {
        let (kv, ids) = (kv.clone(), ids.clone());
        Load::start(8, move |t, k| {
            gate_cycle(&kv, &ids[t * slice + k as usize % slice], Reason::Open)
        })
    };
    g.bench_function("kvgate", |b| b.iter(|| black_box(kv.stats())));
    load.stop();

    let naive = std::sync::Arc::new(NaiveGate::new(&Config::reference(), Fixed::OPEN));
    let load = {
        let (naive, ids) = (naive.clone(), ids.clone());
        Load::start(8, move |t, k| {
            naive_cycle(&naive, &ids[t * slice + k as usize % slice], Reason::Open)
        })
    };
    // The reference's only gate-wide figure is the number of reservations.
    g.bench_function("naive", |b| b.iter(|| black_box(naive.reserved_count())));
    load.stop();
    g.finish();
}

fn config() -> Criterion {
    // Shorter than criterion's defaults: ~30 benchmarks on a shared 2-core box.
    Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = floor, open_path_single_thread, open_path_threads, pressure_paths, stats_under_load
}
criterion_main!(benches);

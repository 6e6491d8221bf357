//! Instructions per operation, counted by callgrind: deterministic figures
//! that a busy machine cannot blur, for the same scenarios as the micro
//! benchmarks (kvgate next to the naive baseline and the floor).
//!
//! Under `cargo bench` this binary re-runs itself under
//! `valgrind --tool=callgrind` once per scenario, counting only the
//! instructions executed inside [`measured`] (after a warm-up outside it),
//! and prints instructions per operation with ratios; without valgrind it
//! says so and skips. Under `cargo test` it runs every scenario natively a
//! few times, checking each admission's reason.

mod common;

use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvgate::core::Core;
use kvgate::{Config, Gate, Reason};

use common::naive::NaiveGate;
use common::{core_cycle, gate_cycle, naive_cycle, session_ids, Fixed, WithCapacity};

/// Operations counted per scenario (callgrind runs ~50x slower than native).
const ITERS: u64 = 20_000;
const WARM_UP: u64 = 5_000;
const POOL: usize = 4096;

/// The scenarios, in report order: (name, what the ratio is taken against).
const SCENARIOS: [(&str, Option<&str>); 17] = [
    ("floor/atomic_increment", None),
    ("floor/mutex_lock_parking_lot", None),
    ("floor/clock_read", None),
    ("open_1t/naive/hot", None),
    ("open_1t/naive/distinct", None),
    ("open_1t/kvgate/hot", Some("open_1t/naive/hot")),
    ("open_1t/kvgate/distinct", Some("open_1t/naive/distinct")),
    ("open_1t/core/hot", Some("open_1t/naive/hot")),
    ("open_1t/c_abi/hot", Some("open_1t/naive/hot")),
    // The open path in working-set mode (the default), against the same
    // path in reference mode (`open_1t/kvgate/*`) in the same run.
    ("open_1t/working_set/hot", Some("open_1t/kvgate/hot")),
    (
        "open_1t/working_set/distinct",
        Some("open_1t/kvgate/distinct"),
    ),
    ("pressure/reserved_session/naive", None),
    (
        "pressure/reserved_session/kvgate",
        Some("pressure/reserved_session/naive"),
    ),
    ("pressure/resident_prefix/naive", None),
    (
        "pressure/resident_prefix/kvgate",
        Some("pressure/resident_prefix/naive"),
    ),
    ("turn_then_finish/naive", None),
    ("turn_then_finish/kvgate", Some("turn_then_finish/naive")),
];

/// The only code callgrind counts (`--toggle-collect`): `iters` calls of `op`.
#[inline(never)]
fn measured(iters: u64, op: &mut dyn FnMut(u64)) {
    for k in 0..iters {
        op(black_box(k));
    }
}

/// Builds scenario `name`, warms it up, then runs `iters` counted operations.
fn run(name: &str, iters: u64) {
    let ids = session_ids("session", POOL);
    let no_grace = Config {
        idle_grace: Duration::ZERO,
        ..Config::reference()
    };
    let mut op: Box<dyn FnMut(u64)> = match name {
        "floor/atomic_increment" => {
            let counter = Box::leak(Box::new(AtomicU64::new(0)));
            Box::new(move |_| {
                black_box(&*counter).fetch_add(1, Ordering::SeqCst);
            })
        }
        "floor/mutex_lock_parking_lot" => {
            let mutex = Box::leak(Box::new(parking_lot::Mutex::new(0u64)));
            Box::new(move |_| *black_box(&*mutex).lock() += 1)
        }
        "floor/clock_read" => Box::new(|_| {
            black_box(Instant::now());
        }),
        "open_1t/kvgate/hot" => {
            let gate = Gate::new(Config::reference(), Fixed::OPEN).unwrap();
            Box::new(move |_| gate_cycle(&gate, &ids[0], Reason::Open))
        }
        "open_1t/kvgate/distinct" => {
            let gate = Gate::new(Config::reference(), Fixed::OPEN).unwrap();
            Box::new(move |k| gate_cycle(&gate, &ids[k as usize % POOL], Reason::Open))
        }
        "open_1t/working_set/hot" => {
            // The library default over an engine that says its capacity: one
            // session's turns, each admitted as a member of the working set
            // (its first turn, outside the count, joins the empty set).
            let gate = Gate::new(Config::default(), WithCapacity::open()).unwrap();
            gate_cycle(&gate, &ids[0], Reason::EmptyWorkingSet);
            Box::new(move |_| gate_cycle(&gate, &ids[0], Reason::ReservedSession))
        }
        "open_1t/working_set/distinct" => {
            // The sessions this run cycles through (4,096 under the bench),
            // all members: the working set's bookkeeping at that size.
            let used = (iters as usize).min(POOL);
            let gate = Gate::new(Config::default(), WithCapacity::open()).unwrap();
            gate_cycle(&gate, &ids[0], Reason::EmptyWorkingSet);
            for id in &ids[1..used] {
                gate_cycle(&gate, id, Reason::FitsWorkingSet);
            }
            Box::new(move |k| gate_cycle(&gate, &ids[k as usize % POOL], Reason::ReservedSession))
        }
        "open_1t/core/hot" => {
            let core = Core::new(Config::reference()).unwrap();
            Box::new(move |k| core_cycle(&core, &ids[0], k + 1))
        }
        "open_1t/c_abi/hot" => {
            let gate = common::c_abi::CGate::open();
            Box::new(move |_| gate.cycle(&ids[0]))
        }
        "open_1t/naive/hot" => {
            let naive = NaiveGate::new(&Config::reference(), Fixed::OPEN);
            Box::new(move |_| naive_cycle(&naive, &ids[0], Reason::Open))
        }
        "open_1t/naive/distinct" => {
            let naive = NaiveGate::new(&Config::reference(), Fixed::OPEN);
            Box::new(move |k| naive_cycle(&naive, &ids[k as usize % POOL], Reason::Open))
        }
        "pressure/reserved_session/kvgate" => {
            let gate = Gate::new(Config::reference(), Fixed::HOT).unwrap();
            gate_cycle(&gate, &ids[0], Reason::ResidentPrefix);
            Box::new(move |_| gate_cycle(&gate, &ids[0], Reason::ReservedSession))
        }
        "pressure/reserved_session/naive" => {
            let naive = NaiveGate::new(&Config::reference(), Fixed::HOT);
            naive_cycle(&naive, &ids[0], Reason::ResidentPrefix);
            Box::new(move |_| naive_cycle(&naive, &ids[0], Reason::ReservedSession))
        }
        "pressure/resident_prefix/kvgate" => {
            let gate = Gate::new(no_grace, Fixed::HOT).unwrap();
            Box::new(move |_| gate_cycle(&gate, &ids[0], Reason::ResidentPrefix))
        }
        "pressure/resident_prefix/naive" => {
            let naive = NaiveGate::new(&no_grace, Fixed::HOT);
            Box::new(move |_| naive_cycle(&naive, &ids[0], Reason::ResidentPrefix))
        }
        "turn_then_finish/naive" => {
            let naive = NaiveGate::new(&Config::reference(), Fixed::OPEN);
            Box::new(move |k| {
                let id = &ids[k as usize % POOL];
                naive_cycle(&naive, id, Reason::Open);
                naive.finish_session(id);
            })
        }
        "turn_then_finish/kvgate" => {
            // A turn then the end of its session: begin creates the record,
            // finish drops it (the record's whole life, allocation included).
            let gate = Gate::new(Config::reference(), Fixed::OPEN).unwrap();
            Box::new(move |k| {
                let id = &ids[k as usize % POOL];
                gate_cycle(&gate, id, Reason::Open);
                assert!(gate.finish_session(id).is_some());
            })
        }
        other => panic!("unknown scenario {other}"),
    };
    warm_up(WARM_UP.min(iters), &mut op);
    measured(iters, &mut op);
}

/// The same calls as [`measured`], outside callgrind's count: caches, the
/// allocator and the gate's tables reach their steady state first. (Until
/// this was a function of its own, the warm-up ran inside `measured` too
/// and every figure was 1.25x the true cost per operation; ratios were
/// unaffected.)
#[inline(never)]
fn warm_up(iters: u64, op: &mut dyn FnMut(u64)) {
    for k in 0..iters {
        op(black_box(k));
    }
}

/// Instructions callgrind counted inside `measured` for one scenario.
fn callgrind(name: &str) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--collect-atstart=no",
            "--toggle-collect=*instructions::measured*",
        ])
        .arg(exe)
        .args(["--scenario", name, &ITERS.to_string()])
        .output()
        .map_err(|e| format!("valgrind: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("valgrind failed: {stderr}"));
    }
    stderr
        .lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no 'Collected' line in: {stderr}"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--scenario") {
        // Child mode, under callgrind.
        let iters = args[at + 2].parse().expect("iteration count");
        run(&args[at + 1], iters);
        return;
    }
    if !common::bench_mode() {
        // Test mode: every scenario runs natively; the reasons are checked
        // by the helpers (debug build) and nothing is timed.
        for (name, _) in SCENARIOS {
            run(name, 50);
        }
        println!("instructions: {} scenarios ran (smoke)", SCENARIOS.len());
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("instructions: valgrind not found, skipped (apt-get install valgrind)");
        return;
    }
    // The warm-up runs ITERS.min(WARM_UP) ops outside `measured` first; the
    // count covers `ITERS` operations plus the loop's own few instructions.
    let mut counts: Vec<(&str, f64)> = Vec::new();
    println!("instructions per operation (callgrind, {ITERS} operations each)");
    for (name, base) in SCENARIOS {
        let per_op = match callgrind(name) {
            Ok(n) => n as f64 / ITERS as f64,
            Err(e) => {
                eprintln!("{name}: {e}");
                std::process::exit(1);
            }
        };
        counts.push((name, per_op));
        let ratio = base
            .and_then(|b| counts.iter().find(|(n, _)| *n == b))
            .map(|(b, v)| format!("  {:.2}x {b}", per_op / v))
            .unwrap_or_default();
        println!("  {name:<36} {per_op:>8.0}{ratio}");
    }
    let json: Vec<String> = counts
        .iter()
        .map(|(n, v)| format!("  \"{n}\": {v:.1}"))
        .collect();
    common::write_results("instructions", &format!("{{\n{}\n}}\n", json.join(",\n")));
}
